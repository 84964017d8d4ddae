#!/bin/sh
# make demo: tokenizes the demo corpus (the fortune cookie texts of Debian's
# `fortunes` package, free to redistribute) with the byte-level tokenizer and
# trains the `small` preset on it on this machine's CPU cores.
set -eu
out=${DEMO_OUT:-demo-out}
steps=${DEMO_STEPS:-600}
mkdir -p "$out"
dir=/usr/share/games/fortunes
files=""
for f in "$dir"/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && [ ! -L "$f" ] && files="$files $f"
done
[ -n "$files" ] || { echo "demo: no corpus in $dir: install the Debian package fortunes" >&2; exit 1; }
# shellcheck disable=SC2086
bin/fsdp-tokenize -o "$out/fortunes.bin" $files
cat > "$out/demo.conf" <<CONF
[model]
model = small

[data]
data = $out/fortunes.bin
eval_fraction = 0.05

[train]
steps = $steps
batch = 8
seq_len = 128
eval_every = 200
eval_batches = 16

[optim]
lr = 2e-3
warmup_steps = 20

[output]
save = $out/small.weights
sample_tokens = 400
sample_prompt = The computer
CONF
echo "demo: training with $out/demo.conf (FSDP_PROGRESS_EVERY=${FSDP_PROGRESS_EVERY:-10})"
FSDP_PROGRESS_EVERY=${FSDP_PROGRESS_EVERY:-10} bin/fsdp-train --config "$out/demo.conf"

#!/bin/sh
# make demo: the service on this machine. It tokenizes the demo corpus (the
# fortune cookie texts of Debian's `fortunes` package, free to redistribute)
# with the byte-level tokenizer, starts a coordinator and one fsdpd with two
# CPU devices on 127.0.0.1 in a temporary directory, submits a 2-rank
# FULL_SHARD job training the `small` preset with fsdpctl, watches it to the
# end, prints its memory per rank and the text the trained model writes, and
# stops everything, leaving no process behind. As root, the ranks run as
# `nobody` (fsdpd refuses to run them as root).
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

tmp=$(mktemp -d /tmp/fsdpd-demo.XXXXXX)
chmod 755 "$tmp" # the ranks' user reads the corpus here
coord_pid=""
node_pid=""
cleanup() {
  for p in $node_pid $coord_pid; do kill -TERM "$p" 2>/dev/null || true; done
  for p in $node_pid $coord_pid; do wait "$p" 2>/dev/null || true; done
  if pgrep -f "$tmp" >/dev/null 2>&1; then
    echo "demo: processes of the demo were left running:" >&2
    pgrep -af "$tmp" >&2 || true
    pkill -KILL -f "$tmp" || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# shellcheck disable=SC2086
bin/fsdp-tokenize -o "$tmp/fortunes.bin" $files
cat > "$out/demo.conf" <<CONF
[model]
model = small

[data]
data = fortunes.bin
eval_fraction = 0.05

[train]
steps = $steps
batch = 4
seq_len = 128
eval_every = 200
eval_batches = 16

[shard]
strategy = FULL_SHARD

[optim]
lr = 2e-3
warmup_steps = 20

[output]
sample_tokens = 400
sample_prompt = The computer
CONF

# the coordinator: its state in the temporary directory, job paths inside it
bin/fsdp-coordinator --db "$tmp/state.db" --root "$tmp" --listen 127.0.0.1:0 \
  >"$tmp/coordinator.out" 2>"$tmp/coordinator.log" &
coord_pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$tmp/coordinator.out")
  [ -n "$port" ] && break
  kill -0 "$coord_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { echo "demo: the coordinator did not start:" >&2; cat "$tmp/coordinator.log" >&2; exit 1; }
FSDP_COORDINATOR=127.0.0.1:$port
export FSDP_COORDINATOR
echo "demo: coordinator on $FSDP_COORDINATOR"

# one node daemon with two CPU devices
runas=""
[ "$(id -u)" = 0 ] && runas="--run-as nobody"
# shellcheck disable=SC2086
FSDP_PROGRESS_EVERY=${FSDP_PROGRESS_EVERY:-50} bin/fsdpd --coordinator "$FSDP_COORDINATOR" \
  --devices cpu:2 --name demo-node --work-dir "$tmp/fsdpd" $runas >"$tmp/fsdpd.log" 2>&1 &
node_pid=$!
for _ in $(seq 100); do
  bin/fsdpctl nodes 2>/dev/null | grep -q ALIVE && break
  kill -0 "$node_pid" 2>/dev/null || { echo "demo: fsdpd exited:" >&2; cat "$tmp/fsdpd.log" >&2; exit 1; }
  sleep 0.1
done
bin/fsdpctl nodes

cp "$out/demo.conf" "$tmp/demo.conf"
job=$(bin/fsdpctl submit "$tmp/demo.conf" --ranks 2 --name demo)
echo "demo: submitted $job (2 ranks, FULL_SHARD); watching it"
rc=0
bin/fsdpctl watch "$job" || rc=$?
bin/fsdpctl status "$job"
echo
bin/fsdpctl memory "$job"
echo
echo "demo: what rank 0 wrote at the end:"
bin/fsdpctl logs "$job" --rank 0 | sed -n '/^eval /,$p'
[ "$rc" = 0 ] || { echo "demo: the job did not succeed (fsdpctl watch exit $rc); fsdpd's log:" >&2; tail -n 40 "$tmp/fsdpd.log" >&2; }
exit "$rc"

#!/bin/sh
# Runs each Criterion test binary (one process per test, as Criterion does) and
# prints one closing line with the totals. Exit status 1 if any test failed.
# Each binary's line gives its seconds of wall time and of CPU (user + system,
# its processes and theirs): the CPU figure compares across runs on a busy
# machine, the wall one does not.
set -u
passed=0; failed=0; bad=""
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fsdp-run.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# CPU seconds used by this shell's finished children, from what `times` wrote
# to file $1 (its second line); `times` itself must run in this shell, not in a
# $(...) subshell, whose children are not these.
cpu_s() { awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/);
  printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$1"; }
now_s() { date +%s.%N; }
span() { awk -v w0="$1" -v w1="$2" -v c0="$3" -v c1="$4" \
  'BEGIN { printf "%.1f s wall, %.1f s CPU", w1 - w0, c1 - c0 }'; }
times >"$tmp/t"; all_w0=$(now_s); all_c0=$(cpu_s "$tmp/t")
for t in "$@"; do
  name=$(basename "$t")
  times >"$tmp/t0"; w0=$(now_s)
  "$t" --jobs 2 >"$tmp/out" 2>&1; rc=$?
  times >"$tmp/t1"; w1=$(now_s)
  c0=$(cpu_s "$tmp/t0"); c1=$(cpu_s "$tmp/t1")
  out=$(cat "$tmp/out")
  syn=$(printf '%s\n' "$out" | grep 'Synthesis:' | tail -n 1)
  p=$(printf '%s\n' "$syn" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
  f=$(printf '%s\n' "$syn" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
  c=$(printf '%s\n' "$syn" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
  p=${p:-0}; f=${f:-0}; c=${c:-0}
  if [ "$rc" -ne 0 ] || [ -z "$syn" ]; then
    printf '%s\n' "$out"
    [ "$f" -eq 0 ] && [ "$c" -eq 0 ] && f=1
    bad="$bad $name"
  else
    printf '%s\n' "$out" | grep -E '^\[(----|WARN)\]|Synthesis' | sed "s/^/$name: /"
  fi
  echo "$name: $(span "$w0" "$w1" "$c0" "$c1")"
  passed=$((passed + p)); failed=$((failed + f + c))
done
times >"$tmp/t"; echo "all test binaries: $(span "$all_w0" "$(now_s)" "$all_c0" "$(cpu_s "$tmp/t")")"
[ -n "$bad" ] && echo "failed binaries:$bad"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

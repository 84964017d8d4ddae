#!/bin/sh
# Runs each Criterion test binary (one process per test, as Criterion does) and
# prints one closing line with the totals. Exit status 1 if any test failed.
set -u
passed=0; failed=0; bad=""
for t in "$@"; do
  name=$(basename "$t")
  out=$("$t" --jobs 2 2>&1); rc=$?
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
  passed=$((passed + p)); failed=$((failed + f + c))
done
[ -n "$bad" ] && echo "failed binaries:$bad"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

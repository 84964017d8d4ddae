#!/bin/sh
# run.sh TEST: runs an emulated GPU test (cuda_emu.h) as `make test` does,
# twice side by side: its threads first to last with the warps in step, and
# in a random order with the warps drifting apart (CUDA_EMU_ORDER=random,
# cuda_emu.cc), which shows a barrier the fixed order happens not to need.
# Each run's lines go to TEST.ORDER.log; printed are the skips and each run's
# last line, or, for a run that failed, its failed checks, the emulator's own
# messages and the log's end. Exit status 1 if either failed. The random
# order's seed is the clock's (CUDA_EMU_SEED, printed), as the test's data is.
set -u
t=$1
seed=${CUDA_EMU_SEED:-$(date +%s)}
for order in forward random; do
  { CUDA_EMU_ORDER=$order CUDA_EMU_SEED=$seed "$t" >"$t.$order.log" 2>&1
    echo $? >"$t.$order.rc"; } &
done
wait
rc=0
for order in forward random; do
  log=$t.$order.log
  if [ "$(cat "$t.$order.rc")" = 0 ]; then
    [ $order = forward ] && grep 'skipped on the emulator' "$log"
    echo "$(basename "$t") ($order): $(tail -n 1 "$log")"
  else
    grep -E 'FAIL|cuda_emu:' "$log" | head -n 40
    tail -n 20 "$log"
    echo "$(basename "$t") ($order, CUDA_EMU_SEED=$seed) failed (exit $(cat "$t.$order.rc")): $log"
    rc=1
  fi
done
exit $rc

#!/bin/sh
# run.sh ORDER:TEST...: runs GPU tests on the CPU emulator (cuda_emu.h) as
# `make test` does, all side by side, each in its order: forward (threads
# first to last, each warp on to its next __syncthreads before the next) or
# random (CUDA_EMU_ORDER=random, cuda_emu.cc: the warps drift apart, which
# shows a barrier the fixed order happens not to need), each with
# synchronous streams, or with queued ones (cuda_emu.cc) after a "+":
# +deferred (CUDA_EMU_STREAMS=deferred: work runs only when waited for,
# latest first, which shows a missing cudaStreamWaitEvent) or +ahead (the
# kernels run ahead of NCCL's collectives, which shows a buffer written or
# freed before the collective that reads it was waited for), as in
# random+deferred. FSDP_CUDA_PLUGIN, from the caller, is the emulated
# plugin the tests that train load. Each run's lines go to TEST.ORDER.log;
# printed are the skips and each run's last line, or, for a run that failed,
# its failed checks, the emulator's own messages and the log's end. Exit
# status 1 if any failed (a run past 15 minutes is stopped: exit 124). The
# random order's seed is the clock's
# (CUDA_EMU_SEED, printed on a failure), as the tests' data seeds are.
set -u
seed=${CUDA_EMU_SEED:-$(date +%s)}
# glibc's malloc maps a large block afresh and unmaps it when freed, and
# gives the heap's top back past 128 KiB: the tests allocate and free
# their host buffers and the emulator its device memory over and over, and
# every page was faulted in again (test_cuda_kernels: 15 million page
# faults, 45 of its 160 CPU seconds in the kernel). Kept, they are 0.7
# million and 5 s (2 cores, 2026-11-29), for ~130 MB more at the peak (the
# heap is never trimmed). A read after a free still finds NaN or stops the
# run: the emulator fills what it frees and keeps it a while, its whole
# pages inaccessible (cuda_emu.cc's quarantine, CUDA_EMU_QUARANTINE).
# (Appended to the caller's tunables.)
export GLIBC_TUNABLES=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295
for run in "$@"; do
  order=${run%%:*} t=${run#*:}
  streams=sync
  case $order in *+*) streams=${order#*+} ;; esac
  { CUDA_EMU_ORDER=${order%%+*} CUDA_EMU_STREAMS=$streams CUDA_EMU_SEED=$seed \
      timeout 900 "$t" >"$t.$order.log" 2>&1
    echo $? >"$t.$order.rc"; } &
done
wait
rc=0
for run in "$@"; do
  order=${run%%:*} t=${run#*:} log=${run#*:}.${run%%:*}.log
  if [ "$(cat "$t.$order.rc")" = 0 ]; then
    case $order in forward*) grep 'skipped on the emulator' "$log" ;; esac
    echo "$(basename "$t") on the emulator ($order): $(tail -n 1 "$log")"
  else
    grep -E 'FAIL|cuda_emu:' "$log" | head -n 40
    tail -n 20 "$log"
    echo "$(basename "$t") on the emulator ($order, CUDA_EMU_SEED=$seed) failed (exit $(cat "$t.$order.rc")): $log"
    rc=1
  fi
done
exit $rc

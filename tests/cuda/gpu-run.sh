#!/bin/sh
# Runs the GPU checks packed by tests/cuda/gpu-pack.sh, on the GPU machine,
# from the project's root: each one's output goes to stdout and, when OUT is
# set (the device tool), to $OUT/<check>.log. Exit status: the first failure's.
# GPU_CHECKS names the checks (default: all), GPU_TIMEOUT bounds each
# (seconds, default 300) and GPU_BENCH_TIMEOUT each bench run; GPU_BENCH=1 then runs
# bench_cuda (make bench-cuda's runs; BENCH_CUDA_B124, BENCH_CUDA_B774,
# BENCH_CUDA_STEPS as there, and gpt2-124m again with attention by products,
# FSDP_CUDA_ATTN_GEMM=1, and with the fp32 fused attention, FSDP_CUDA_ATTN_FP32=1,
# to compare with the tensor-core one, "acts32": with every activation in
# fp32, FSDP_CUDA_ACTS_FP32=1, against the bf16 activations, "cudnn": the
# attention by cuDNN's fused flash attention, FSDP_CUDA_ATTN_CUDNN=1 (not in
# the default list: name it), and bench_cuda --ops: each op of a
# step alone, and "trace": gpt2-124m with one step traced by CUPTI,
# FSDP_BENCH_TRACE=1: where the step's time goes, idle gaps and their
# causes). GPU_BENCH_MODELS picks the models (default "gpt2-124m
# gpt2-774m") and GPU_BENCH_VARIANTS the runs after them (default "gemm
# fp32 acts32 ops trace"), so that a short lease can take the part it has time for.
# GPU_OPS_PLUGINS="a.so b.so ..." then times bench_cuda --ops gpt2-124m with
# each of those builds of the plugin in turn (FSDP_BENCH_OPS=$GPU_OPS_FILTER:
# only the ops so named), to compare builds of a kernel on one machine.
# GPU_PLUGIN: the plugin the checks and the bench runs load (default: the
# packed one), to time a whole step of another build (gpu-pack.sh's refs).
# GPU_AB=1 (after the checks) times whole steps of each model of
# GPU_BENCH_MODELS, no peer, with this tree's plugin and each of
# gpu-pack.sh's GPU_PACK_BASES (.gpu/r/*.so) in turn, twice round, then
# bench_cuda --ops with each (FSDP_BENCH_OPS=$GPU_OPS_FILTER), and prints an
# "ab:" line a run: one machine's A/B of builds in one call. GPU_AB_KNOBS
# ("FSDP_CUDA_GELU_EXACT=1 FSDP_CUDA_RES_APART=1", say) times each build's
# steps again with each of those settings in turn: an A/B of a change that
# has a switch, on one plugin.
#
# CUDA's libraries are found where that machine has them: its toolkit
# (/usr/local/cuda*/lib64) or the Python wheels PyTorch brings (nvidia/*/lib).
set -u
cd "$(dirname "$0")/.."
# the libraries gpu-pack.sh compressed (xz, or Python's lzma where the
# machine has no xz)
for f in .gpu/libs/*.xz; do
  [ -e "$f" ] && [ ! -s "${f%.xz}" ] || continue
  xz -dc "$f" >"${f%.xz}" 2>/dev/null || python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "${f%.xz}"
done
libdirs=$(find /usr/local /opt /usr/lib \( -name 'libnccl.so.2' -o -name 'libcublasLt.so.13' -o -name 'libcudart.so.13' \
  -o -name 'libcudnn.so.9' \) 2>/dev/null \
  | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$PWD/.gpu/libs:${libdirs}${LD_LIBRARY_PATH:-}"
export FSDP_CUDA_PLUGIN="${GPU_PLUGIN:-$PWD/.gpu/lib/fsdpd/libfsdp-cuda.so}"
echo "gpu-run: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
ldd "$FSDP_CUDA_PLUGIN" | grep -E 'not found|nccl|cublas' || true
status=0
for t in ${GPU_CHECKS-kern_math_gpu kern_math_gpu_nofmad test_cudnn_graphs test_cuda_kernels test_nccl test_cuda_train}; do
  echo "== $t"
  # test_cudnn_graphs on the GPU: cuDNN's plans built there, its JSON printed
  case $t in test_cudnn_graphs) a=--device ;; *) a= ;; esac
  if [ -n "${OUT:-}" ]; then
    timeout ${GPU_TIMEOUT:-300} .gpu/tests/$t $a >"$OUT/$t.log" 2>&1; rc=$?; tail -n 60 "$OUT/$t.log"
  else
    timeout ${GPU_TIMEOUT:-300} .gpu/tests/$t $a; rc=$?
  fi
  echo "== $t: exit $rc"
  [ $rc -eq 0 ] || [ $status -ne 0 ] || status=$rc
done
if [ "${GPU_AB:-0}" = 1 ]; then
  for m in ${GPU_BENCH_MODELS-gpt2-124m gpt2-774m}; do
    case $m in gpt2-124m) b=${BENCH_CUDA_B124:-16} ;; *) b=${BENCH_CUDA_B774:-8} ;; esac
    for round in 1 2; do
      for p in "$FSDP_CUDA_PLUGIN" .gpu/r/*.so; do
        [ -e "$p" ] || continue
        for k in - ${GPU_AB_KNOBS:-}; do
          if [ "$k" = - ]; then set --; else set -- "$k"; fi
          echo "== A/B $m B=$b round $round: $p $*"
          env "$@" FSDP_CUDA_PLUGIN=$p FSDP_BENCH_NO_PEER=1 timeout "${GPU_BENCH_TIMEOUT:-300}" \
            .gpu/tests/bench_cuda "$m" "$b" 1024 "${BENCH_CUDA_STEPS:-20}" >/tmp/gpu-ab.log 2>&1
          cat /tmp/gpu-ab.log >>"${OUT:-/tmp}/bench_cuda.log"
          ms=$(sed -n 's/^bench: cuda_train .* step_ms=\([0-9.]*\) .*/\1/p' /tmp/gpu-ab.log)
          echo "ab: model=$m B=$b round=$round plugin=$p knob=$k step_ms=${ms:-failed}"
        done
      done
    done
  done
  for p in "$FSDP_CUDA_PLUGIN" .gpu/r/*.so; do
    [ -e "$p" ] || continue
    echo "== A/B bench_cuda --ops gpt2-124m: $p (FSDP_BENCH_OPS=${GPU_OPS_FILTER:-})"
    FSDP_CUDA_PLUGIN=$p FSDP_BENCH_NO_PEER=1 FSDP_BENCH_OPS=${GPU_OPS_FILTER:-} \
      timeout "${GPU_BENCH_TIMEOUT:-300}" .gpu/tests/bench_cuda --ops gpt2-124m "${BENCH_CUDA_B124:-16}" 1024 2>&1 \
      | tee -a "${OUT:-/tmp}/bench_cuda.log" | grep -E '^bench: cuda_op(s)? '
  done
fi
if [ "${GPU_BENCH:-0}" = 1 ]; then
  for m in ${GPU_BENCH_MODELS-gpt2-124m gpt2-774m}; do
    case $m in gpt2-124m) b=${BENCH_CUDA_B124:-16} ;; *) b=${BENCH_CUDA_B774:-8} ;; esac
    set -- "$m" "$b"
    echo "== bench_cuda $1 B=$2"
    timeout ${GPU_BENCH_TIMEOUT:-500} .gpu/tests/bench_cuda "$1" "$2" 1024 "${BENCH_CUDA_STEPS:-20}" 2>&1 \
      | tee -a "${OUT:-/tmp}/bench_cuda.log"
  done
  variants=" ${GPU_BENCH_VARIANTS-gemm fp32 acts32 ops trace} "
  # run_variant NAME DESCRIPTION STEPS VAR=VALUE...: gpt2-124m alone (no
  # peer) with those settings, when GPU_BENCH_VARIANTS names it
  run_variant() {
    name=$1 desc=$2 steps=$3
    shift 3
    [ "${variants#* "$name" }" != "$variants" ] || return 0
    echo "== bench_cuda gpt2-124m, $desc, no peer"
    env "$@" FSDP_BENCH_NO_PEER=1 timeout "${GPU_BENCH_TIMEOUT:-300}" .gpu/tests/bench_cuda gpt2-124m \
      "${BENCH_CUDA_B124:-16}" 1024 "$steps" 2>&1 | tee -a "${OUT:-/tmp}/bench_cuda.log"
  }
  run_variant gemm "attention by products (FSDP_CUDA_ATTN_GEMM=1)" "${BENCH_CUDA_STEPS:-20}" \
    FSDP_CUDA_ATTN_GEMM=1
  run_variant fp32 "fp32 fused attention (FSDP_CUDA_ATTN_FP32=1)" "${BENCH_CUDA_STEPS:-20}" \
    FSDP_CUDA_ATTN_FP32=1
  run_variant acts32 "every activation in fp32 (FSDP_CUDA_ACTS_FP32=1)" "${BENCH_CUDA_STEPS:-20}" \
    FSDP_CUDA_ACTS_FP32=1
  run_variant cudnn "the attention by cuDNN (FSDP_CUDA_ATTN_CUDNN=1)" "${BENCH_CUDA_STEPS:-20}" \
    FSDP_CUDA_ATTN_CUDNN=1
  run_variant trace "one step traced (FSDP_BENCH_TRACE=1)" 5 FSDP_BENCH_TRACE=1
  if [ "${variants#* ops }" != "$variants" ]; then
  echo "== bench_cuda --ops gpt2-124m: each op of a step alone, and the products in every mode"
  timeout ${GPU_BENCH_TIMEOUT:-300} .gpu/tests/bench_cuda --ops gpt2-124m "${BENCH_CUDA_B124:-16}" 1024 2>&1 \
    | tee -a "${OUT:-/tmp}/bench_cuda.log"
  fi
fi
for p in ${GPU_OPS_PLUGINS:-}; do
  echo "== bench_cuda --ops gpt2-124m with $p (FSDP_BENCH_OPS=${GPU_OPS_FILTER:-})"
  # gpu-pack.sh's refs (.gpu/v) are of kern.h tables before the bf16
  # activations: their table ends before those members, so none is read
  case $p in */v/*) a16=0 ;; *) a16=1 ;; esac
  FSDP_BENCH_ACTS16=$a16 FSDP_CUDA_PLUGIN=$p FSDP_BENCH_OPS=${GPU_OPS_FILTER:-} timeout ${GPU_BENCH_TIMEOUT:-300} .gpu/tests/bench_cuda \
    --ops gpt2-124m "${BENCH_CUDA_B124:-16}" 1024 2>&1 | tee -a "${OUT:-/tmp}/bench_cuda.log"
done
exit $status

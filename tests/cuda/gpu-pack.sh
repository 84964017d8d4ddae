#!/bin/sh
# Packs the GPU checks for a machine that has a GPU but not this project's
# build dependencies (the device machines lent to some sessions): the programs,
# the CUDA plugin, the GPU tests and every shared library they need that is
# neither the C runtime nor CUDA's (oneDNN, inih, xxhash, jansson,
# protobuf-c, libunistring), stripped (the large ones xz-compressed), into
# .gpu/ (git-ignored). The GPU
# side finds CUDA's own libraries (cuBLASLt, NCCL) where it has them:
# tests/cuda/gpu-run.sh.
#
#   sh tests/cuda/gpu-pack.sh      then carry .gpu and run `sh .gpu/gpu-run.sh` there
#
# GPU_PACK_REFS="REF ..." also builds, for each git ref, the plugin with
# that ref's kernels/cuda (and this tree's NCCL backend and plugin table:
# refs whose kern.h table is this tree's; before 2026-11-27's acc argument
# of matmul_bwd, attention_bwd and gelu_bwd a ref's ops ignore it and
# accumulate, which times the same work plus the read of dinp, fine for
# bench_cuda --ops but not for training; before kern.h's bf16 activations
# a ref's table ends before them, and gpu-run.sh tells bench_cuda not to
# look: FSDP_BENCH_ACTS16=0) for sm_90 alone, into
# .gpu/v/REF.so, for gpu-run.sh's GPU_OPS_PLUGINS to time against each
# other on one machine. GPU_PACK_BASES="REF ..." builds refs whose kern.h
# table is this tree's (the bf16 activations in; an op appended since, as
# gelu_bwd_bf16, is compiled NULL into REF's table: each ref is built
# against this tree's kern.h) the same way into
# .gpu/r/REF.so: the builds gpu-run.sh's GPU_AB=1 times whole steps and ops
# of against this tree's, on one machine.
set -eu
cd "$(dirname "$0")/../.."
mkvar() { make -s --eval='print-%: ; @echo $($*)' "print-$1"; }
make -j2 all build/tests/cuda/kern_math_gpu build/tests/cuda/kern_math_gpu_nofmad \
  build/tests/cuda/test_cuda_kernels build/tests/cuda/test_nccl build/tests/cuda/test_cuda_train \
  build/tests/cuda/test_cudnn_graphs build/bench/bench_cuda
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib/fsdpd .gpu/tests .gpu/libs
cp bin/fsdp-train bin/fsdp-tokenize bin/fsdp-launch .gpu/bin/
cp lib/fsdpd/libfsdp-cuda.so .gpu/lib/fsdpd/
for t in kern_math_gpu kern_math_gpu_nofmad test_cuda_kernels test_nccl test_cuda_train \
         test_cudnn_graphs; do
  cp build/tests/cuda/$t .gpu/tests/
done
cp build/bench/bench_cuda .gpu/tests/
# every library a packed file needs but glibc's, libgcc's, libstdc++'s and CUDA's (libgomp
# travels: an image may have no OpenMP runtime of its own)
for f in .gpu/bin/* .gpu/tests/* .gpu/lib/fsdpd/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' \
  | grep -Ev 'cuda|cublas|nccl|cudnn' | while read -r l; do cp -L "$l" .gpu/libs/; done
# CUPTI for bench_cuda's FSDP_BENCH_TRACE: this toolkit's, whose records
# have the layouts trace_cupti.c was built with
cupti=$(find -L "$(dirname "$(mkvar NVCC)")/.." /usr/local/cuda -name 'libcupti.so.13' 2>/dev/null \
  | head -n 1)
if [ -n "$cupti" ]; then cp -L "$cupti" .gpu/libs/; else echo "gpu-pack: no libcupti.so.13: no trace there"; fi
strip --strip-unneeded .gpu/bin/* .gpu/tests/* .gpu/libs/* 2>/dev/null || true
# the large libraries travel xz-compressed (oneDNN: 40 MiB -> 7), which
# leaves room in the device tool's 64 MiB for plugins to compare;
# gpu-run.sh unpacks them
find .gpu/libs -type f -size +1M -exec xz -T2 -6 {} +
cp tests/cuda/gpu-run.sh .gpu/
# pack_ref REF DIR: the plugin with REF's kernels/cuda into DIR/REF.so
pack_ref() {
  t=$(mktemp -d)
  git archive "$1" kernels | tar -x -C "$t"
  # this tree's table: ops appended since REF are NULL in REF's (gelu_bwd_bf16)
  cp kernels/kern.h "$t/kernels/kern.h"
  mkdir -p "$t/o" "$2"
  for f in "$t"/kernels/cuda/*.cu; do
    "$(mkvar NVCC)" -std=c++17 -I"$t" -gencode arch=compute_90,code=sm_90 -O3 -fmad=false \
      -Xcompiler -fPIC -c "$f" -o "$t/o/$(basename "$f" .cu).o"
  done
  name=$(printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_')
  # shellcheck disable=SC2046 # the libraries are words
  ${CC:-gcc} -shared -Wl,-soname,libfsdp-cuda.so "$t"/o/*.o build/daemon/comm/nccl.pic.o \
    build/daemon/train/device_cuda.pic.o -o "$2/$name.so" $(mkvar CUDA_LDLIBS)
  strip --strip-unneeded "$2/$name.so"
  rm -rf "$t"
  echo "gpu-pack: $2/$name.so: kernels/cuda of $1"
}
for ref in ${GPU_PACK_REFS:-}; do pack_ref "$ref" .gpu/v; done
for ref in ${GPU_PACK_BASES:-}; do pack_ref "$ref" .gpu/r; done
du -sh .gpu

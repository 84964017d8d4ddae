#!/bin/sh
# Packs the GPU checks for a machine that has a GPU but not this project's
# build dependencies (the device machines lent to some sessions): the programs,
# the CUDA plugin, the GPU tests and every shared library they need that is
# neither the C runtime nor CUDA's (oneDNN, inih, xxhash, jansson,
# protobuf-c, libunistring), stripped, into .gpu/ (git-ignored). The GPU
# side finds CUDA's own libraries (cuBLASLt, NCCL) where it has them:
# tests/cuda/gpu-run.sh.
#
#   sh tests/cuda/gpu-pack.sh      then carry .gpu and run `sh .gpu/gpu-run.sh` there
set -eu
cd "$(dirname "$0")/../.."
make -j2 all build/tests/cuda/kern_math_gpu build/tests/cuda/kern_math_gpu_nofmad \
  build/tests/cuda/test_cuda_kernels build/tests/cuda/test_nccl build/tests/cuda/test_cuda_train \
  build/bench/bench_cuda
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib/fsdpd .gpu/tests .gpu/libs
cp bin/fsdp-train bin/fsdp-tokenize bin/fsdp-launch .gpu/bin/
cp lib/fsdpd/libfsdp-cuda.so .gpu/lib/fsdpd/
for t in kern_math_gpu kern_math_gpu_nofmad test_cuda_kernels test_nccl test_cuda_train; do
  cp build/tests/cuda/$t .gpu/tests/
done
cp build/bench/bench_cuda .gpu/tests/
# every library a packed file needs but glibc's, libgcc's, libstdc++'s and CUDA's (libgomp
# travels: an image may have no OpenMP runtime of its own)
for f in .gpu/bin/* .gpu/tests/* .gpu/lib/fsdpd/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' \
  | grep -Ev 'cuda|cublas|nccl|cudnn' | while read -r l; do cp -L "$l" .gpu/libs/; done
strip --strip-unneeded .gpu/bin/* .gpu/tests/* .gpu/libs/* 2>/dev/null || true
cp tests/cuda/gpu-run.sh .gpu/
du -sh .gpu

/* nccl_spin: a kernel that holds a stream until the host says so, for the
 * ops of tests/cuda/test_nccl.c that must not be able to start. It polls a
 * flag in mapped pinned host memory (the host writes 1 to let it end) and
 * ends by itself after cap_ms, so a test that dies or hangs never leaves the
 * GPU held for longer than that. */
#include <cuda_runtime.h>

static __device__ unsigned long long nccl_spin_now_ns(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static __global__ void nccl_spin_kernel(const volatile int *flag, unsigned long long cap_ns) {
  const unsigned long long t0 = nccl_spin_now_ns();
  while (*flag == 0 && nccl_spin_now_ns() - t0 < cap_ns) __nanosleep(10000);
}

/* Queues the kernel on stream (a cudaStream_t); dev_flag is the device
 * pointer of the mapped flag. Returns the cudaError_t of the launch. */
extern "C" int nccl_spin_start(const volatile int *dev_flag, void *stream, long long cap_ms) {
  nccl_spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(dev_flag,
                                                       (unsigned long long)cap_ms * 1000000ull);
  return (int)cudaGetLastError();
}

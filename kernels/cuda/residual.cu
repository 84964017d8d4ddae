/* residual: out = a + b element-wise; backward adds dout to both inputs. */
#include "kernels/cuda/cuda_impl.h"

__global__ static void residual_fwd_kernel(float *out, const float *a, const float *b, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = a[i] + b[i];
}

__global__ static void residual_bwd_kernel(float *da, float *db, const float *dout, size_t n) {
  KERN_CUDA_FOR(i, n) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

extern "C" void kern_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n) {
  if (!n) return;
  residual_fwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                        kern_cuda_st.stream>>>(out, a, b, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_residual_bwd(float *da, float *db, const float *dout, size_t n) {
  if (!n) return;
  residual_bwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                        kern_cuda_st.stream>>>(da, db, dout, n);
  KERN_CUDA_LAUNCHED();
}

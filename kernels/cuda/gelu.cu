/* gelu: GELU (tanh form, kern_gelu) element-wise, and its backward
 * (dinp += kern_gelu_grad(inp) * dout): kern_math.h's formulas, compiled
 * without contraction, so the CPU kernels' bits. */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

__global__ static void gelu_fwd_kernel(float *out, const float *inp, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = kern_gelu(inp[i]);
}

__global__ static void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n) {
  KERN_CUDA_FOR(i, n) dinp[i] += kern_gelu_grad(inp[i]) * dout[i];
}

extern "C" void kern_cuda_gelu_fwd(float *out, const float *inp, size_t n) {
  if (!n) return;
  gelu_fwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                    kern_cuda_st.stream>>>(out, inp, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
  if (!n) return;
  gelu_bwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                    kern_cuda_st.stream>>>(dinp, inp, dout, n);
  KERN_CUDA_LAUNCHED();
}

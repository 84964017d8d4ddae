/* adamw: one AdamW step over a flat range of parameters (kern_adamw_elem),
 * with the bias corrections formed on the host in double exactly as
 * kernels/cpu/adamw.c forms them: the CPU kernel's bits. */
#include <math.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

__global__ static void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n,
                                    float lr, float beta1, float beta2, float eps, float wd,
                                    float bc1, float bc2_sqrt) {
  KERN_CUDA_FOR(i, n)
  kern_adamw_elem(p + i, g[i], m + i, v + i, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt);
}

extern "C" void kern_cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                                float beta1, float beta2, float eps, float wd, int t) {
  if (!n) return;
  const float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
  const float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
  adamw_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                 kern_cuda_st.stream>>>(p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt);
  KERN_CUDA_LAUNCHED();
}

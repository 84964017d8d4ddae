/* adamw: one AdamW step over a flat range of parameters (kern_adamw_elem). */
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

void kern_cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, int t) {
  /* Bias corrections once per call, in double: beta2^t is close to 1 for small
   * t and 1 - beta2^t would lose digits in float. */
  const float bc1 = (float)(1.0 - pow(beta1, t));
  const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++)
    kern_adamw_elem(p + i, g[i], m + i, v + i, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt);
}

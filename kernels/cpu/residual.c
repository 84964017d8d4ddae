/* residual: out = a + b element-wise; backward adds dout to both inputs. */
#include <omp.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_residual_fwd(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void kern_cpu_residual_bwd(float *da, float *db, const float *dout, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

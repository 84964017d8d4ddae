/* layernorm: LayerNorm over the last dimension (biased variance, eps =
 * KERN_LN_EPS, as PyTorch), forward saving mean and rstd, and backward. */
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

/* One row per iteration; two passes (mean, then the variance of x - mean) so the
 * variance does not lose digits to cancellation. KERN_CPU_SUM splits the float
 * sums into vector lanes without -ffast-math, in an order fixed for every ISA. */
void kern_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (int64_t)n * C;
    float *o = out + (int64_t)n * C;
    float s, v;
    KERN_CPU_SUM(float, s, C, c, x[c]);
    float m = s / (float)C;
    KERN_CPU_SUM(float, v, C, c, (x[c] - m) * (x[c] - m));
    float r = 1.0f / sqrtf(v / (float)C + KERN_LN_EPS);
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

/* dinp is per row (parallel over rows); dw and db sum over rows, so a second
 * pass gives each thread a range of channels (race-free), summed in
 * kern_math.h's order (kern_cpu_colsum). */
void kern_cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C) {
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int n = 0; n < N; n++) {
      const float *x = inp + (int64_t)n * C;
      const float *d = dout + (int64_t)n * C;
      float *di = dinp + (int64_t)n * C;
      float m = mean[n], r = rstd[n];
      /* dx = r * (g - mean(g) - xhat * mean(g * xhat)) with g = w * dout. */
      float gs, gxs;
      KERN_CPU_SUM(float, gs, C, c, w[c] * d[c]);
      KERN_CPU_SUM(float, gxs, C, c, w[c] * d[c] * (x[c] - m) * r);
      float gm = gs / (float)C, gxm = gxs / (float)C;
      for (int c = 0; c < C; c++) {
        float xhat = (x[c] - m) * r;
        di[c] += r * (w[c] * d[c] - gm - xhat * gxm);
      }
    }
    /* dw, db do not depend on dinp: no barrier between the passes. */
    int c0, c1;
    kern_cpu_channel_range(C, &c0, &c1);
    kern_cpu_colsum(db, dw, dout, inp, mean, rstd, N, C, c0, c1);
  }
}

/* encoder: token + position embedding, out[b,t] = wte[tok[b,t]] + wpe[t], and
 * its backward scatter into dwte and dwpe. */
#include <omp.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_encoder_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe, int B,
                          int T, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
    float *o = out + bt * C;
    const float *e = wte + (int64_t)tok[bt] * C;
    const float *p = wpe + (bt % T) * C;
    for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
  }
}

/* A token id may repeat within the batch, so rows of dwte cannot be split among
 * threads by (b,t). Each thread owns a range of channels instead and walks every
 * row: no races, no scratch, and the summation order does not depend on the
 * thread count. */
void kern_cpu_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B,
                          int T, int C) {
#pragma omp parallel
  {
    int c0, c1;
    kern_cpu_channel_range(C, &c0, &c1);
    for (int t = 0; t < T; t++) {
      float *dp = dwpe + (int64_t)t * C;
      for (int b = 0; b < B; b++) {
        int64_t bt = (int64_t)b * T + t;
        const float *d = dout + bt * C;
        float *de = dwte + (int64_t)tok[bt] * C;
        for (int c = c0; c < c1; c++) {
          de[c] += d[c];
          dp[c] += d[c];
        }
      }
    }
  }
}

/* adamw: one AdamW step over a flat range of parameters (kern_adamw_elem),
 * or over a shard's segments with its bf16 image (kern.h's adamw_segs). */
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

/* Bias corrections once per call, in double: beta2^t is close to 1 for small
 * t and 1 - beta2^t would lose digits in float. */
static void adamw_bias(float beta1, float beta2, int t, float *bc1, float *bc2_sqrt) {
  *bc1 = (float)(1.0 - pow(beta1, t));
  *bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
}

void kern_cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, int t) {
  float bc1, bc2_sqrt;
  adamw_bias(beta1, beta2, t, &bc1, &bc2_sqrt);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++)
    kern_adamw_elem(p + i, g[i], m + i, v + i, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt);
}

/* A segment at a time, each split over the threads; the image's element
 * rounded as soon as its parameter is stepped (still in cache). */
void kern_cpu_adamw_segs(float *p, uint16_t *p16, const float *g, float *m, float *v,
                         const kern_seg_t *seg, int nseg, float lr, float beta1, float beta2,
                         float eps, float wd, int t) {
  float bc1, bc2_sqrt;
  adamw_bias(beta1, beta2, t, &bc1, &bc2_sqrt);
  for (int k = 0; k < nseg; k++) {
    const size_t o = seg[k].offset, n = seg[k].numel;
    const float w = seg[k].decay ? wd : 0.0f;
#pragma omp parallel for schedule(static)
    for (size_t i = o; i < o + n; i++) {
      kern_adamw_elem(p + i, g[i], m + i, v + i, lr, beta1, beta2, eps, w, bc1, bc2_sqrt);
      if (p16) p16[i] = kern_f32_to_bf16(p[i]);
    }
  }
}

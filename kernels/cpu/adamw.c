/* adamw: one AdamW step over a flat range of parameters (kern_adamw_elem),
 * or over a shard's segments with its bf16 image (kern.h's adamw_segs). */
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

/* Bias corrections once per call, in double: beta2^t is close to 1 for small
 * t and 1 - beta2^t would lose digits in float. (Values, not outputs through
 * pointers: a local whose address is taken reaches OpenMP's outlined loop by
 * reference, and the loop is then not vectorized.) */
static float adamw_bc1(float beta1, int t) { return (float)(1.0 - pow(beta1, t)); }
static float adamw_bc2_sqrt(float beta2, int t) { return (float)sqrt(1.0 - pow(beta2, t)); }

void kern_cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, int t) {
  const float bc1 = adamw_bc1(beta1, t), bc2_sqrt = adamw_bc2_sqrt(beta2, t);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++)
    kern_adamw_elem(p + i, g[i], m + i, v + i, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt);
}

#define ADAMW_CPU_BLOCK 2048 /* elements stepped, then rounded while still in cache */

/* A segment at a time, its blocks over the threads; each block stepped as
 * kern_cpu_adamw steps it (on g[i] * gscale), then its image rounded as kern_cpu_f32_to_bf16
 * rounds (two simple loops, each vectorized). */
void kern_cpu_adamw_segs_scaled(float *p, uint16_t *p16, const float *g, float gscale, float *m,
                                float *v, const kern_seg_t *seg, int nseg, float lr, float beta1,
                                float beta2, float eps, float wd, int t) {
  const float bc1 = adamw_bc1(beta1, t), bc2_sqrt = adamw_bc2_sqrt(beta2, t);
  for (int k = 0; k < nseg; k++) {
    const size_t o = seg[k].offset, end = seg[k].offset + seg[k].numel;
    const float w = seg[k].decay ? wd : 0.0f;
#pragma omp parallel for schedule(static)
    for (size_t b = o; b < end; b += ADAMW_CPU_BLOCK) {
      const size_t e = end - b < ADAMW_CPU_BLOCK ? end : b + ADAMW_CPU_BLOCK;
      for (size_t i = b; i < e; i++)
        kern_adamw_elem(p + i, g[i] * gscale, m + i, v + i, lr, beta1, beta2, eps, w, bc1,
                        bc2_sqrt);
      if (p16)
        for (size_t i = b; i < e; i++) p16[i] = kern_f32_to_bf16(p[i]);
    }
  }
}

/* gscale 1: each g[i] * 1 is g[i] itself */
void kern_cpu_adamw_segs(float *p, uint16_t *p16, const float *g, float *m, float *v,
                         const kern_seg_t *seg, int nseg, float lr, float beta1, float beta2,
                         float eps, float wd, int t) {
  kern_cpu_adamw_segs_scaled(p, p16, g, 1.0f, m, v, seg, nseg, lr, beta1, beta2, eps, wd, t);
}

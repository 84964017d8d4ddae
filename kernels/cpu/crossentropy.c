/* crossentropy: softmax cross-entropy over rows of V logits (ld apart). Forward
 * leaves the probabilities in place of the logits; backward turns them into
 * dlogits; fwd_bwd does both in forward's passes (ce_row). */
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

/* One row: the loss, and x turned into the probabilities, or (bwd) straight
 * into the dlogits: p rounded, then times dloss, as crossentropy_bwd
 * multiplies them (the same bits). */
static float ce_row(float *x, int t, int V, int bwd, float dloss) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx; /* not fmaxf: a libm call */
  /* -log p[target] = log(sum) - (x[target] - max): taken before x is
   * overwritten, it stays finite even where p[target] underflows to 0. */
  float zt = x[t] - mx;
  float s; /* e^(x - max), stored, and their sum, in one pass */
  KERN_CPU_SUM(float, s, V, j, x[j] = kern_expf(x[j] - mx));
  float inv = 1.0f / s;
  if (!bwd) {
    for (int j = 0; j < V; j++) x[j] *= inv;
  } else {
    float pt = x[t] * inv;
    for (int j = 0; j < V; j++) x[j] = (x[j] * inv) * dloss;
    x[t] = (pt - 1.0f) * dloss;
  }
  return logf(s) - zt;
}

void kern_cpu_crossentropy_fwd(float *losses, float *logits, const int32_t *targets, int N, int V,
                               int ld) {
  KERN_CPU_ASSERT(ld >= V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) losses[n] = ce_row(logits + (int64_t)n * ld, targets[n], V, 0, 0.0f);
}

void kern_cpu_crossentropy_fwd_bwd(float *losses, float *logits, const int32_t *targets,
                                   float dloss, int N, int V, int ld) {
  KERN_CPU_ASSERT(ld >= V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) losses[n] = ce_row(logits + (int64_t)n * ld, targets[n], V, 1, dloss);
}

void kern_cpu_crossentropy_bwd(float *probs, const int32_t *targets, float dloss, int N, int V,
                               int ld) {
  KERN_CPU_ASSERT(ld >= V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float *p = probs + (int64_t)n * ld;
    int t = targets[n];
    float pt = p[t];
    for (int j = 0; j < V; j++) p[j] *= dloss;
    p[t] = (pt - 1.0f) * dloss;
  }
}

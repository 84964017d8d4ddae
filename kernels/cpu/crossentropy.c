/* crossentropy: softmax cross-entropy over rows of V logits (ld apart). Forward
 * leaves the probabilities in place of the logits; backward turns them into
 * dlogits. */
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

void kern_cpu_crossentropy_fwd(float *losses, float *logits, const int32_t *targets, int N, int V,
                               int ld) {
  KERN_CPU_ASSERT(ld >= V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float *x = logits + (int64_t)n * ld;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx; /* not fmaxf: a libm call */
    /* -log p[target] = log(sum) - (x[target] - max): taken before x is
     * overwritten, it stays finite even where p[target] underflows to 0. */
    float zt = x[targets[n]] - mx;
    float s; /* e^(x - max), stored, and their sum, in one pass */
    KERN_CPU_SUM(float, s, V, j, x[j] = kern_expf(x[j] - mx));
    float inv = 1.0f / s;
    for (int j = 0; j < V; j++) x[j] *= inv;
    losses[n] = logf(s) - zt;
  }
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

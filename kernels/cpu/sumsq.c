/* sumsq: sum of squares of a float array, accumulated in double (gradient
 * norms for clipping: 124M squares would lose digits in float). */
#include <omp.h>

#include "kernels/cpu/cpu.h"

/* The array is cut into SUMSQ_PARTS ranges whatever the thread count, each
 * summed in KERN_CPU_SUM's fixed order and the parts added in index order: the
 * same bits for any ISA level and any number of threads (the threads share
 * out the parts). */
#define SUMSQ_PARTS 64

double kern_cpu_sumsq(const float *x, size_t n) {
  double part[SUMSQ_PARTS];
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int k = 0; k < SUMSQ_PARTS; k++) {
    const size_t i0 = n * k / SUMSQ_PARTS, i1 = n * (k + 1) / SUMSQ_PARTS;
    const float *xk = x + i0;
    KERN_CPU_SUM(double, part[k], i1 - i0, i, (double)xk[i] * (double)xk[i]);
  }
  double s = 0.0;
  for (int k = 0; k < SUMSQ_PARTS; k++) s += part[k];
  return s;
}

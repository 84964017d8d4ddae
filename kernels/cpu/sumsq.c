/* sumsq: sum of squares of a float array, accumulated in double (gradient
 * norms for clipping: 124M squares would lose digits in float). */
#include <omp.h>

#include "kernels/cpu/cpu.h"

double kern_cpu_sumsq(const float *x, size_t n) {
  double s = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
  for (size_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
  return s;
}

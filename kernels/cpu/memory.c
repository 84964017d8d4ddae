/* memory: the CPU backend's memory section (kern.h): its device memory is host
 * memory, so set and copies are the C library's, and the vector ops are
 * OpenMP loops (element-wise: the same bytes for any thread count). */
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_dev_set(void *dst, int v, size_t bytes) { memset(dst, v, bytes); }

void kern_cpu_copy(void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
}

void kern_cpu_sync(void) {}

void kern_cpu_vec_add(float *y, const float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void kern_cpu_vec_scale(float *y, float s, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) y[i] *= s;
}

double kern_cpu_vec_sum(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i];
  return s;
}

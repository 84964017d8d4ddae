/* gelu: GELU (tanh form, kern_gelu) element-wise, and its backward. */
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

void kern_cpu_gelu_fwd(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = kern_gelu(inp[i]);
}

void kern_cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n, int acc) {
  if (!acc) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = kern_gelu_grad(inp[i]) * dout[i];
    return;
  }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) dinp[i] += kern_gelu_grad(inp[i]) * dout[i];
}

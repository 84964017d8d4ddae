// Compile check: the element-wise math of kernels/kern_math.h builds as device
// code with nvcc (KERN_HD = __host__ __device__), so the CUDA backend computes
// with the same functions the CPU tests prove. Built by `make test` when nvcc
// exists; nothing here runs (these machines have no GPU).
#include "kernels/kern_math.h"

__global__ void kern_math_check(float *x, uint16_t *h, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = kern_gelu(x[i]) + kern_gelu_grad(x[i]);
  float p = x[i], m = 0.f, v = 0.f;
  kern_adamw_elem(&p, g, &m, &v, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f);
  h[i] = kern_f32_to_bf16(p);
  x[i] = kern_bf16_to_f32(h[i]) + m + v;
}

/* cast: fp32 <-> bf16 (uint16 storage), round-to-nearest-even, element-wise
 * (kern_f32_to_bf16, kern_bf16_to_f32: integer code, the CPU's bits). */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

__global__ static void f32_to_bf16_kernel(uint16_t *out, const float *inp, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = kern_f32_to_bf16(inp[i]);
}

__global__ static void bf16_to_f32_kernel(float *out, const uint16_t *inp, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = kern_bf16_to_f32(inp[i]);
}

extern "C" void kern_cuda_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
  if (!n) return;
  f32_to_bf16_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                       kern_cuda_st.stream>>>(out, inp, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
  if (!n) return;
  bf16_to_f32_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                       kern_cuda_st.stream>>>(out, inp, n);
  KERN_CUDA_LAUNCHED();
}

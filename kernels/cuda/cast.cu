/* cast: fp32 <-> bf16 (uint16 storage), round-to-nearest-even, element-wise
 * (kern_f32_to_bf16, kern_bf16_to_f32: integer code, the CPU's bits).
 *
 * Memory-bound (the FSDP runtime casts around every parameter gather and
 * gradient shard), so a thread moves 8 elements in 16-byte accesses
 * (cuda_impl.h): one uint4 of 8 bf16, two float4 of 8 floats. That needs
 * the two pointers' 16-byte boundaries at the same element: then the first
 * head < 8 elements (up to the bf16 side's boundary) and the last
 * (n - head) % 8 go one a thread, in the same launch. Where they are not
 * (a shard or a segment at an offset that is not a multiple of 8 elements
 * from the other's), every element goes one a thread. */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

__global__ static void f32_to_bf16_kernel(uint16_t *out, const float *inp, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = kern_f32_to_bf16(inp[i]);
}

/* out + head and inp + head 16-byte aligned, n >= head + 8 */
__global__ static void f32_to_bf16_wide_kernel(uint16_t *out, const float *inp, size_t n,
                                               size_t head) {
  kern_cuda_for_wide<8>(
      n, head,
      [&](size_t j) {
        kern_cuda_store_u16x8(out + j, kern_cuda_bf16x8(kern_cuda_load_f32x4(inp + j),
                                                        kern_cuda_load_f32x4(inp + j + 4)));
      },
      [&](size_t i) { out[i] = kern_f32_to_bf16(inp[i]); });
}

__global__ static void bf16_to_f32_kernel(float *out, const uint16_t *inp, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = kern_bf16_to_f32(inp[i]);
}

/* out + head and inp + head 16-byte aligned, n >= head + 8 */
__global__ static void bf16_to_f32_wide_kernel(float *out, const uint16_t *inp, size_t n,
                                               size_t head) {
  kern_cuda_for_wide<8>(
      n, head,
      [&](size_t j) {
        const uint4 h = kern_cuda_load_u16x8(inp + j);
        kern_cuda_store_f32x4(out + j, make_float4(kern_bf16_to_f32((uint16_t)h.x),
                                                   kern_bf16_to_f32((uint16_t)(h.x >> 16)),
                                                   kern_bf16_to_f32((uint16_t)h.y),
                                                   kern_bf16_to_f32((uint16_t)(h.y >> 16))));
        kern_cuda_store_f32x4(out + j + 4, make_float4(kern_bf16_to_f32((uint16_t)h.z),
                                                       kern_bf16_to_f32((uint16_t)(h.z >> 16)),
                                                       kern_bf16_to_f32((uint16_t)h.w),
                                                       kern_bf16_to_f32((uint16_t)(h.w >> 16))));
      },
      [&](size_t i) { out[i] = kern_bf16_to_f32(inp[i]); });
}

extern "C" void kern_cuda_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
  if (!n) return;
  const size_t head = kern_cuda_head16(out, sizeof *out);
  if (n >= head + 8 && kern_cuda_aligned16(out + head) && kern_cuda_aligned16(inp + head))
    f32_to_bf16_wide_kernel<<<kern_cuda_blocks((n - head) / 8, KERN_CUDA_THREADS),
                              KERN_CUDA_THREADS, 0, kern_cuda_st.stream>>>(out, inp, n, head);
  else
    f32_to_bf16_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                         kern_cuda_st.stream>>>(out, inp, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
  if (!n) return;
  const size_t head = kern_cuda_head16(inp, sizeof *inp);
  if (n >= head + 8 && kern_cuda_aligned16(out + head) && kern_cuda_aligned16(inp + head))
    bf16_to_f32_wide_kernel<<<kern_cuda_blocks((n - head) / 8, KERN_CUDA_THREADS),
                              KERN_CUDA_THREADS, 0, kern_cuda_st.stream>>>(out, inp, n, head);
  else
    bf16_to_f32_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                         kern_cuda_st.stream>>>(out, inp, n);
  KERN_CUDA_LAUNCHED();
}

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
#include <string.h>

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

/* bf16_to_f32_segs (kern.h): a segment of at least CAST_SEGS_BIG elements
 * (a unit's embedding) goes alone through kern_cuda_bf16_to_f32's 16-byte
 * accesses; the small ones (a block's norms and biases: five segments, a few
 * thousand elements) go up to CAST_SEGS a launch, passed by value in the
 * launch's parameters: their elements numbered one after another (first[k],
 * segment k's first; unused ones UINT32_MAX), a thread an element, which
 * finds its segment by a binary search of log2 CAST_SEGS steps and widens
 * the element at off[k] + its place in it (offsets from the launch's first
 * segment, in 32 bits). A launch, not one a segment: each would take a few
 * microseconds and a gap for a few KB. */
#define CAST_SEGS 32
#define CAST_SEGS_BIG (1u << 16)
static_assert((CAST_SEGS & (CAST_SEGS - 1)) == 0, "the search's steps halve CAST_SEGS");
typedef struct {
  uint32_t first[CAST_SEGS + 1], off[CAST_SEGS];
} cast_segs_t;

__global__ static void bf16_to_f32_segs_kernel(float *out, const uint16_t *inp, cast_segs_t s,
                                               uint32_t total) {
  KERN_CUDA_FOR(j, total) {
    int lo = 0; /* the last segment whose first element is at or before j */
#pragma unroll
    for (int step = CAST_SEGS / 2; step > 0; step /= 2)
      if (s.first[lo + step] <= j) lo += step;
    const size_t i = s.off[lo] + (j - s.first[lo]);
    out[i] = kern_bf16_to_f32(inp[i]);
  }
}

extern "C" void kern_cuda_bf16_to_f32_segs(float *out, const uint16_t *inp, const kern_seg_t *seg,
                                           int nseg) {
  for (int k = 0; k < nseg;) {
    if (seg[k].numel >= CAST_SEGS_BIG) {
      kern_cuda_bf16_to_f32(out + seg[k].offset, inp + seg[k].offset, seg[k].numel);
      k++;
      continue;
    }
    cast_segs_t s;
    memset(&s, 0xff, sizeof s); /* UINT32_MAX: past every element, for the search */
    const size_t base = seg[k].offset;
    int n = 0;
    uint32_t total = 0;
    for (; k < nseg && n < CAST_SEGS && seg[k].numel < CAST_SEGS_BIG; k++) {
      KERN_CUDA_ASSERT(seg[k].offset >= base); /* kern.h: in order */
      if (seg[k].offset - base > UINT32_MAX - CAST_SEGS_BIG) break; /* the next launch's */
      if (!seg[k].numel) continue;
      s.first[n] = total, s.off[n] = (uint32_t)(seg[k].offset - base);
      total += (uint32_t)seg[k].numel; /* under CAST_SEGS CAST_SEGS_BIG */
      n++;
    }
    if (!n) continue;
    s.first[n] = total;
    bf16_to_f32_segs_kernel<<<kern_cuda_blocks(total, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                              kern_cuda_st.stream>>>(out + base, inp + base, s, total);
    KERN_CUDA_LAUNCHED();
  }
}

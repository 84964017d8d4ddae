/* residual: out = a + b element-wise; backward adds dout to both inputs.
 *
 * Memory-bound, so where every array's 16-byte boundaries fall at the same
 * element a thread moves 4 elements in float4 accesses (cuda_impl.h), after
 * a head of up to 3 and before a tail of (n - head) % 4, both one a thread
 * in the same launch; elsewhere every element goes one a thread. The same
 * sums element by element: the CPU's bits. out may be a (the model adds in
 * place): each element is read before it is written, by the same thread. */
#include "kernels/cuda/cuda_impl.h"

__global__ static void residual_fwd_kernel(float *out, const float *a, const float *b, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = a[i] + b[i];
}

/* out + head, a + head and b + head 16-byte aligned, n >= head + 4 */
__global__ static void residual_fwd_wide_kernel(float *out, const float *a, const float *b,
                                                size_t n, size_t head) {
  kern_cuda_for_wide<4>(
      n, head,
      [&](size_t j) {
        const float4 x = kern_cuda_load_f32x4(a + j), y = kern_cuda_load_f32x4(b + j);
        kern_cuda_store_f32x4(out + j, make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
      },
      [&](size_t i) { out[i] = a[i] + b[i]; });
}

__global__ static void residual_bwd_kernel(float *da, float *db, const float *dout, size_t n) {
  KERN_CUDA_FOR(i, n) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

/* da + head, db + head and dout + head 16-byte aligned, n >= head + 4 */
__global__ static void residual_bwd_wide_kernel(float *da, float *db, const float *dout, size_t n,
                                                size_t head) {
  kern_cuda_for_wide<4>(
      n, head,
      [&](size_t j) {
        const float4 d = kern_cuda_load_f32x4(dout + j), x = kern_cuda_load_f32x4(da + j),
                     y = kern_cuda_load_f32x4(db + j);
        kern_cuda_store_f32x4(da + j, make_float4(x.x + d.x, x.y + d.y, x.z + d.z, x.w + d.w));
        kern_cuda_store_f32x4(db + j, make_float4(y.x + d.x, y.y + d.y, y.z + d.z, y.w + d.w));
      },
      [&](size_t i) { da[i] += dout[i], db[i] += dout[i]; });
}

extern "C" void kern_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n) {
  if (!n) return;
  const size_t head = kern_cuda_head16(out, sizeof *out);
  if (n >= head + 4 && kern_cuda_aligned16(a + head) && kern_cuda_aligned16(b + head))
    residual_fwd_wide_kernel<<<kern_cuda_blocks((n - head) / 4, KERN_CUDA_THREADS),
                               KERN_CUDA_THREADS, 0, kern_cuda_st.stream>>>(out, a, b, n, head);
  else
    residual_fwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                          kern_cuda_st.stream>>>(out, a, b, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_residual_bwd(float *da, float *db, const float *dout, size_t n) {
  if (!n) return;
  const size_t head = kern_cuda_head16(da, sizeof *da);
  if (n >= head + 4 && kern_cuda_aligned16(db + head) && kern_cuda_aligned16(dout + head))
    residual_bwd_wide_kernel<<<kern_cuda_blocks((n - head) / 4, KERN_CUDA_THREADS),
                               KERN_CUDA_THREADS, 0, kern_cuda_st.stream>>>(da, db, dout, n, head);
  else
    residual_bwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                          kern_cuda_st.stream>>>(da, db, dout, n);
  KERN_CUDA_LAUNCHED();
}

/* attention: causal multi-head self-attention, forward (keeping the softmax
 * probabilities in att) and backward, as kernels/cpu/attention.c defines it:
 * scores = scale * q @ k^T (scale = 1/sqrt(hs) applied in the product),
 * att = causal softmax (kern_expf, zeros above the diagonal), out = att @ v;
 * backward dpre = att * (datt - sum(att * datt)) and dq += scale * dpre @ k,
 * dk += scale * dpre^T @ q, dv += att^T @ dout.
 *
 * Products: for each batch row b, one strided-batched cuBLASLt product over
 * the NH heads. Head h of q, k, v sits at column h*hs of qkv's rows (3C wide,
 * q, k, v at offsets 0, C, 2C), so consecutive heads are hs floats apart: the
 * batch stride, with leading dimension 3C (out and dout: C). The products
 * cover full T x T score matrices (the masked half included; the softmax
 * overwrites it with zeros, and zeros contribute nothing after).
 *
 * Softmaxes: one warp per row of scores, in fp32, the CPU's formula (the max
 * by compare, e^(x - max) by kern_expf, the sum, then times 1/sum); the sum
 * is a butterfly over the warp, so its order (not its formula) differs from
 * the CPU's. Backward's score gradients live in the scratch, (NH, T, T) for
 * one batch row at a time (kernels/cuda/size.h). */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

#define ATT_WARPS 8 /* rows per block of the softmax kernels */

size_t kern_cuda_attention_scratch(int B, int T, int C, int NH) {
  return kern_cuda_size_attention_scratch(B, T, C, NH);
}

/* Softmax in place over keys 0..i of each row (i = the row's query), zeros
 * after: rows of (rows / T) score matrices of T x T. */
__global__ static void softmax_causal_kernel(float *att, int64_t rows, int T) {
  const int64_t r = (int64_t)blockIdx.x * ATT_WARPS + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return; /* whole warps leave together: r is the same on a warp */
  const int i = (int)(r % T);
  float *p = att + r * T;
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += 32) mx = p[j] > mx ? p[j] : mx;
  mx = kern_cuda_warp_max(mx);
  float s = 0.0f;
  for (int j = lane; j <= i; j += 32) {
    float e = kern_expf(p[j] - mx);
    p[j] = e;
    s += e;
  }
  s = kern_cuda_warp_sum(s);
  const float inv = 1.0f / s;
  for (int j = lane; j < T; j += 32) p[j] = j <= i ? p[j] * inv : 0.0f;
}

/* Softmax backward in place on the score gradients dp (rows of T x T
 * matrices, as att): dp = att * (dp - sum_j att * dp) over keys 0..i, zeros
 * after (the product wrote every key). */
__global__ static void softmax_causal_bwd_kernel(float *dp, const float *att, int64_t rows, int T) {
  const int64_t r = (int64_t)blockIdx.x * ATT_WARPS + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int i = (int)(r % T);
  float *d = dp + r * T;
  const float *a = att + r * T;
  float s = 0.0f;
  for (int j = lane; j <= i; j += 32) s += a[j] * d[j];
  s = kern_cuda_warp_sum(s);
  for (int j = lane; j < T; j += 32) d[j] = j <= i ? a[j] * (d[j] - s) : 0.0f;
}

static unsigned att_blocks(int64_t rows) { return (unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS); }

extern "C" void kern_cuda_attention_fwd(float *out, float *att, const float *qkv, int B, int T,
                                        int C, int NH) {
  if (B <= 0 || T <= 0) return;
  KERN_CUDA_ASSERT(NH > 0 && C % NH == 0);
  const int hs = C / NH;
  const int64_t C3 = 3 * (int64_t)C, TT = (int64_t)T * T;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (int64_t)b * T * C3, *k = q + C;
    float *a = att + (int64_t)b * NH * TT;
    /* per head: scores (T, T) = scale * q (T, hs) @ k (T, hs)^T */
    kern_cuda_gemm(__func__, 'N', 'T', T, T, hs, scale, q, C3, hs, k, C3, hs, 0.0f, a, T, TT, NH);
  }
  const int64_t rows = (int64_t)B * NH * T;
  softmax_causal_kernel<<<att_blocks(rows), ATT_WARPS * 32, 0, kern_cuda_st.stream>>>(att, rows, T);
  KERN_CUDA_LAUNCHED();
  for (int b = 0; b < B; b++) {
    const float *v = qkv + (int64_t)b * T * C3 + 2 * C;
    const float *a = att + (int64_t)b * NH * TT;
    float *o = out + (int64_t)b * T * C;
    /* per head: out (T, hs; ld C) = att (T, T) @ v (T, hs) */
    kern_cuda_gemm(__func__, 'N', 'N', T, hs, T, 1.0f, a, T, TT, v, C3, hs, 0.0f, o, C, hs, NH);
  }
}

extern "C" void kern_cuda_attention_bwd(float *dqkv, float *scratch, const float *dout,
                                        const float *qkv, const float *att, int B, int T, int C,
                                        int NH) {
  if (B <= 0 || T <= 0) return;
  KERN_CUDA_ASSERT(NH > 0 && C % NH == 0);
  const int hs = C / NH;
  const int64_t C3 = 3 * (int64_t)C, TT = (int64_t)T * T;
  const float scale = 1.0f / sqrtf((float)hs);
  float *dp = scratch; /* (NH, T, T): this batch row's score gradients */
  for (int b = 0; b < B; b++) {
    const int64_t off = (int64_t)b * T * C3;
    const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
    const float *a = att + (int64_t)b * NH * TT;
    const float *d = dout + (int64_t)b * T * C;
    /* datt (T, T) = dout (T, hs; ld C) @ v (T, hs)^T */
    kern_cuda_gemm(__func__, 'N', 'T', T, T, hs, 1.0f, d, C, hs, v, C3, hs, 0.0f, dp, T, TT, NH);
    /* dv (T, hs) += att^T (T, T) @ dout (T, hs) */
    kern_cuda_gemm(__func__, 'T', 'N', T, hs, T, 1.0f, a, T, TT, d, C, hs, 1.0f, dv, C3, hs, NH);
    const int64_t rows = (int64_t)NH * T;
    softmax_causal_bwd_kernel<<<att_blocks(rows), ATT_WARPS * 32, 0, kern_cuda_st.stream>>>(
        dp, a, rows, T);
    KERN_CUDA_LAUNCHED();
    /* dq (T, hs) += scale * dpre (T, T) @ k (T, hs) */
    kern_cuda_gemm(__func__, 'N', 'N', T, hs, T, scale, dp, T, TT, k, C3, hs, 1.0f, dq, C3, hs, NH);
    /* dk (T, hs) += scale * dpre^T (T, T) @ q (T, hs) */
    kern_cuda_gemm(__func__, 'T', 'N', T, hs, T, scale, dp, T, TT, q, C3, hs, 1.0f, dk, C3, hs, NH);
  }
}

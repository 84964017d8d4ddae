/* layernorm: LayerNorm over the last dimension (biased variance, eps =
 * KERN_LN_EPS, as PyTorch), forward saving mean and rstd, and backward; the
 * formulas of kernels/cpu/layernorm.c.
 *
 * Forward and backward's dinp: one warp per row, fp32 sums as butterflies
 * over the warp (the CPU's formulas in another, fixed order), two passes in
 * forward (mean, then the variance of x - mean). dw and db are column sums
 * in the CPU's order (kern_cuda_colsum: the CPU's bits). Forward's output in
 * bf16 (layernorm_fwd_bf16) is the fp32 one's values rounded once. */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

#define LN_WARPS 8 /* rows per block */

/* An output element: fp32, or rounded to bf16 as the casts round (a bf16
 * activation, the bits a bf16 product's packing of the fp32 one gives). */
__device__ __forceinline__ void ln_store(float *o, float v) { *o = v; }
__device__ __forceinline__ void ln_store(uint16_t *o, float v) { *o = kern_f32_to_bf16(v); }

template <typename O>
__global__ static void layernorm_fwd_kernel(O *out, float *mean, float *rstd, const float *inp,
                                            const float *w, const float *b, int N, int C) {
  const int n = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return; /* the same n on a whole warp */
  const float *x = inp + (int64_t)n * C;
  O *o = out + (int64_t)n * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  s = kern_cuda_warp_sum(s);
  const float m = s / (float)C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  v = kern_cuda_warp_sum(v);
  const float r = 1.0f / sqrtf(v / (float)C + KERN_LN_EPS);
  for (int c = lane; c < C; c += 32) ln_store(o + c, (x[c] - m) * r * w[c] + b[c]);
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

/* dinp += r * (g - mean(g) - xhat * mean(g * xhat)) with g = w * dout */
__global__ static void layernorm_bwd_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                                 const float *w, const float *mean,
                                                 const float *rstd, int N, int C) {
  const int n = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  const float *x = inp + (int64_t)n * C;
  const float *d = dout + (int64_t)n * C;
  float *di = dinp + (int64_t)n * C;
  const float m = mean[n], r = rstd[n];
  float gs = 0.0f, gxs = 0.0f;
  for (int c = lane; c < C; c += 32) {
    gs += w[c] * d[c];
    gxs += w[c] * d[c] * (x[c] - m) * r;
  }
  gs = kern_cuda_warp_sum(gs);
  gxs = kern_cuda_warp_sum(gxs);
  const float gm = gs / (float)C, gxm = gxs / (float)C;
  for (int c = lane; c < C; c += 32) {
    float xhat = (x[c] - m) * r;
    di[c] += r * (w[c] * d[c] - gm - xhat * gxm);
  }
}

template <typename O>
static void layernorm_fwd(O *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C) {
  if (N <= 0 || C <= 0) return;
  layernorm_fwd_kernel<O><<<(N + LN_WARPS - 1) / LN_WARPS, LN_WARPS * 32, 0, kern_cuda_st.stream>>>(
      out, mean, rstd, inp, w, b, N, C);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                                        const float *w, const float *b, int N, int C) {
  layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
}

extern "C" void kern_cuda_layernorm_fwd_bf16(uint16_t *out, float *mean, float *rstd,
                                             const float *inp, const float *w, const float *b,
                                             int N, int C) {
  layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
}

extern "C" void kern_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                                        const float *inp, const float *w, const float *mean,
                                        const float *rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  layernorm_bwd_dinp_kernel<<<(N + LN_WARPS - 1) / LN_WARPS, LN_WARPS * 32, 0,
                              kern_cuda_st.stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  KERN_CUDA_LAUNCHED();
  kern_cuda_colsum(db, dw, dout, inp, mean, rstd, N, C, C);
}

/* layernorm: LayerNorm over the last dimension (biased variance, eps =
 * KERN_LN_EPS, as PyTorch), forward saving mean and rstd, and backward; the
 * formulas of kernels/cpu/layernorm.c.
 *
 * Forward and backward's dinp: one warp per row, fp32 sums as butterflies
 * over the warp (the CPU's formulas in another, fixed order), two passes in
 * forward (mean, then the variance of x - mean). dw and db sum over rows:
 * one thread per column walks the rows in order, the CPU's own order, so
 * they come out with the CPU's bits (no atomics, no scratch). */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

#define LN_WARPS 8 /* rows per block */

__global__ static void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *inp,
                                            const float *w, const float *b, int N, int C) {
  const int n = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return; /* the same n on a whole warp */
  const float *x = inp + (int64_t)n * C;
  float *o = out + (int64_t)n * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  s = kern_cuda_warp_sum(s);
  const float m = s / (float)C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  v = kern_cuda_warp_sum(v);
  const float r = 1.0f / sqrtf(v / (float)C + KERN_LN_EPS);
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * w[c] + b[c];
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

/* dw[c] += dout * xhat and db[c] += dout over rows 0..N-1 in order */
__global__ static void layernorm_bwd_dwdb_kernel(float *dw, float *db, const float *dout,
                                                 const float *inp, const float *mean,
                                                 const float *rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float aw = dw[c], ab = db[c];
  for (int n = 0; n < N; n++) {
    const int64_t i = (int64_t)n * C + c;
    const float d = dout[i];
    aw += d * (inp[i] - mean[n]) * rstd[n];
    ab += d;
  }
  dw[c] = aw;
  db[c] = ab;
}

extern "C" void kern_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                                        const float *w, const float *b, int N, int C) {
  if (N <= 0 || C <= 0) return;
  layernorm_fwd_kernel<<<(N + LN_WARPS - 1) / LN_WARPS, LN_WARPS * 32, 0, kern_cuda_st.stream>>>(
      out, mean, rstd, inp, w, b, N, C);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                                        const float *inp, const float *w, const float *mean,
                                        const float *rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  layernorm_bwd_dinp_kernel<<<(N + LN_WARPS - 1) / LN_WARPS, LN_WARPS * 32, 0,
                              kern_cuda_st.stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  KERN_CUDA_LAUNCHED();
  layernorm_bwd_dwdb_kernel<<<(C + KERN_CUDA_THREADS - 1) / KERN_CUDA_THREADS, KERN_CUDA_THREADS, 0,
                              kern_cuda_st.stream>>>(dw, db, dout, inp, mean, rstd, N, C);
  KERN_CUDA_LAUNCHED();
}

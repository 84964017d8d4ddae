/* layernorm: LayerNorm over the last dimension (biased variance, eps =
 * KERN_LN_EPS, as PyTorch), forward saving mean and rstd, and backward; the
 * formulas of kernels/cpu/layernorm.c.
 *
 * Forward and backward's dinp: one warp per row, fp32 sums as butterflies
 * over the warp (the CPU's formulas in another, fixed order), two passes in
 * forward (mean, then the variance of x - mean). dw and db are column sums
 * in the CPU's order (kern_cuda_colsum: the CPU's bits). Forward's output in
 * bf16 (layernorm_fwd_bf16) is the fp32 one's values rounded once.
 *
 * Where C is a multiple of 8 up to 1536 and every array 16-byte aligned
 * (gpt2's widths), the wide kernels take the rows instead: a lane holds 8
 * consecutive elements a turn (16-byte loads and stores), the whole row's
 * share in registers, so x (and dout) are read from memory once, not once
 * a pass. The same formulas; a lane's sums run over its own elements in
 * order, so the rounding of the sums differs from the strided kernels' (as
 * both differ from the CPU's). Forward's fp32 and bf16 outputs take the
 * same kernel for the same C (the bf16 ones stay the fp32 ones rounded). */
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

/* ---- the wide kernels: K groups of 8 elements a lane, at most ---------- */

/* 6 groups of 8 a lane: the backward at 6 takes 123 registers (2 blocks of
 * 8 warps an SM); at 8 it took 160 (one), not timed against the strided
 * kernel, so C past 1536 (gpt2-xl's 1600) stays strided */
#define LN_WIDE_MAX_C 1536

/* 8 outputs from 16 bytes: fp32 as two float4, bf16 as one 16-byte store */
__device__ __forceinline__ void ln_store8(float *o, float4 a, float4 b) {
  kern_cuda_store_f32x4(o, a);
  kern_cuda_store_f32x4(o + 4, b);
}
__device__ __forceinline__ void ln_store8(uint16_t *o, float4 a, float4 b) {
  kern_cuda_store_u16x8(o, kern_cuda_bf16x8(a, b));
}

/* (x - m) * r * w + b for one float4, as the strided kernel forms each */
__device__ __forceinline__ float4 ln_norm4(float4 x, float m, float r, float4 w, float4 b) {
  return make_float4((x.x - m) * r * w.x + b.x, (x.y - m) * r * w.y + b.y,
                     (x.z - m) * r * w.z + b.z, (x.w - m) * r * w.w + b.w);
}

/* f(q, c) for each 4 elements of a lane's share of a row of G groups of 8
 * (groups lane, lane + 32, ... below K * 32): q its slot, 0 to 2K - 1 (for
 * registers), c its first column */
template <int K, typename F>
__device__ __forceinline__ void ln_for4(int lane, int G, F f) {
#pragma unroll
  for (int i = 0; i < K; i++)
    if (i * 32 + lane < G) {
#pragma unroll
      for (int h = 0; h < 2; h++) f(2 * i + h, 8 * (i * 32 + lane) + 4 * h);
    }
}

template <typename O, int K>
__global__ static void layernorm_fwd_wide_kernel(O *out, float *mean, float *rstd,
                                                 const float *inp, const float *w, const float *b,
                                                 int N, int C) {
  const int n = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return; /* the same n on a whole warp */
  const float *x = inp + (int64_t)n * C;
  const int G = C / 8; /* groups of 8 in the row; lane takes lane, lane + 32, ... */
  float4 v[2 * K];
  float s = 0.0f;
  ln_for4<K>(lane, G, [&](int q, int c) {
    v[q] = kern_cuda_load_f32x4(x + c);
    s += v[q].x, s += v[q].y, s += v[q].z, s += v[q].w;
  });
  s = kern_cuda_warp_sum(s);
  const float m = s / (float)C;
  float var = 0.0f;
  ln_for4<K>(lane, G, [&](int q, int) {
    var += (v[q].x - m) * (v[q].x - m), var += (v[q].y - m) * (v[q].y - m);
    var += (v[q].z - m) * (v[q].z - m), var += (v[q].w - m) * (v[q].w - m);
  });
  var = kern_cuda_warp_sum(var);
  const float r = 1.0f / sqrtf(var / (float)C + KERN_LN_EPS);
  O *o = out + (int64_t)n * C;
#pragma unroll
  for (int i = 0; i < K; i++) {
    const int g = i * 32 + lane;
    if (g < G) {
      const int c = 8 * g;
      ln_store8(o + c,
                ln_norm4(v[2 * i], m, r, kern_cuda_load_f32x4(w + c), kern_cuda_load_f32x4(b + c)),
                ln_norm4(v[2 * i + 1], m, r, kern_cuda_load_f32x4(w + c + 4),
                         kern_cuda_load_f32x4(b + c + 4)));
    }
  }
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

/* layernorm_bwd_dinp_kernel's formulas, x and dout held in registers */
template <int K>
__global__ static void layernorm_bwd_dinp_wide_kernel(float *dinp, const float *dout,
                                                      const float *inp, const float *w,
                                                      const float *mean, const float *rstd, int N,
                                                      int C) {
  const int n = blockIdx.x * LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) return;
  const float *x = inp + (int64_t)n * C, *d = dout + (int64_t)n * C;
  float *di = dinp + (int64_t)n * C;
  const int G = C / 8;
  const float m = mean[n], r = rstd[n];
  float4 xs[2 * K], ds[2 * K];
  float gs = 0.0f, gxs = 0.0f;
  ln_for4<K>(lane, G, [&](int q, int c) {
    xs[q] = kern_cuda_load_f32x4(x + c), ds[q] = kern_cuda_load_f32x4(d + c);
    const float4 wq = kern_cuda_load_f32x4(w + c);
    const float xa[4] = {xs[q].x, xs[q].y, xs[q].z, xs[q].w}, da[4] = {ds[q].x, ds[q].y, ds[q].z, ds[q].w},
                wa[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
      gs += wa[e] * da[e];
      gxs += wa[e] * da[e] * (xa[e] - m) * r;
    }
  });
  gs = kern_cuda_warp_sum(gs);
  gxs = kern_cuda_warp_sum(gxs);
  const float gm = gs / (float)C, gxm = gxs / (float)C;
  /* dinp's share of the row loaded whole before any of it is stored (up
   * to K 4: 118 registers, 2 blocks an SM as at 89; at 6 it would take 167,
   * one block): a store between the loads holds each behind it (it may
   * alias them), one load in flight a lane */
  float4 os[K <= 4 ? 2 * K : 1];
  if constexpr (K <= 4)
    ln_for4<K>(lane, G, [&](int q, int c) { os[q] = kern_cuda_load_f32x4(di + c); });
  ln_for4<K>(lane, G, [&](int q, int c) {
    const float4 wq = kern_cuda_load_f32x4(w + c);
    float4 o;
    if constexpr (K <= 4) o = os[q];
    else o = kern_cuda_load_f32x4(di + c);
    const float xa[4] = {xs[q].x, xs[q].y, xs[q].z, xs[q].w}, da[4] = {ds[q].x, ds[q].y, ds[q].z, ds[q].w},
                wa[4] = {wq.x, wq.y, wq.z, wq.w};
    float oa[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float xhat = (xa[e] - m) * r;
      oa[e] += r * (wa[e] * da[e] - gm - xhat * gxm);
    }
    kern_cuda_store_f32x4(di + c, make_float4(oa[0], oa[1], oa[2], oa[3]));
  });
}

/* The wide kernels' K for C (groups of 8 a lane, rounded up to one
 * instantiated), 0 where they do not apply */
static int ln_wide_k(int C, const void *a, const void *b, const void *c, const void *d,
                     const void *e) {
  if (C % 8 || C > LN_WIDE_MAX_C || !kern_cuda_aligned16(a) || !kern_cuda_aligned16(b) ||
      !kern_cuda_aligned16(c) || !kern_cuda_aligned16(d) || !kern_cuda_aligned16(e))
    return 0;
  const int k = (C / 8 + 31) / 32;
  return k <= 2 ? k : k <= 4 ? 4 : 6; /* gpt2: 768 -> 3 (4), 1024 -> 4, 1280 -> 5 (6) */
}

template <typename O>
static void layernorm_fwd(O *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const unsigned g = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
  cudaStream_t st = kern_cuda_st.stream;
  switch (ln_wide_k(C, out, inp, w, b, inp)) {
  case 1: layernorm_fwd_wide_kernel<O, 1><<<g, LN_WARPS * 32, 0, st>>>(out, mean, rstd, inp, w, b, N, C); break;
  case 2: layernorm_fwd_wide_kernel<O, 2><<<g, LN_WARPS * 32, 0, st>>>(out, mean, rstd, inp, w, b, N, C); break;
  case 4: layernorm_fwd_wide_kernel<O, 4><<<g, LN_WARPS * 32, 0, st>>>(out, mean, rstd, inp, w, b, N, C); break;
  case 6: layernorm_fwd_wide_kernel<O, 6><<<g, LN_WARPS * 32, 0, st>>>(out, mean, rstd, inp, w, b, N, C); break;
  default: layernorm_fwd_kernel<O><<<g, LN_WARPS * 32, 0, st>>>(out, mean, rstd, inp, w, b, N, C);
  }
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
  const unsigned g = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
  cudaStream_t st = kern_cuda_st.stream;
  switch (ln_wide_k(C, dinp, dout, inp, w, w)) {
  case 1: layernorm_bwd_dinp_wide_kernel<1><<<g, LN_WARPS * 32, 0, st>>>(dinp, dout, inp, w, mean, rstd, N, C); break;
  case 2: layernorm_bwd_dinp_wide_kernel<2><<<g, LN_WARPS * 32, 0, st>>>(dinp, dout, inp, w, mean, rstd, N, C); break;
  case 4: layernorm_bwd_dinp_wide_kernel<4><<<g, LN_WARPS * 32, 0, st>>>(dinp, dout, inp, w, mean, rstd, N, C); break;
  case 6: layernorm_bwd_dinp_wide_kernel<6><<<g, LN_WARPS * 32, 0, st>>>(dinp, dout, inp, w, mean, rstd, N, C); break;
  default: layernorm_bwd_dinp_kernel<<<g, LN_WARPS * 32, 0, st>>>(dinp, dout, inp, w, mean, rstd, N, C);
  }
  KERN_CUDA_LAUNCHED();
  kern_cuda_colsum(db, dw, dout, inp, mean, rstd, N, C, C);
}

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
 * share in registers (forward) or shared memory (backward), so x (and
 * dout) are read from memory once, not once a pass; the backward makes dw's
 * and db's run sums from them too (layernorm_bwd_wide_kernel), so that
 * only colsum's second stage runs after it. The same formulas; a lane's sums run over its own elements in
 * order, so the rounding of the sums differs from the strided kernels' (as
 * both differ from the CPU's). Forward's fp32 and bf16 outputs take the
 * same kernel for the same C (the bf16 ones stay the fp32 ones rounded). */
#include <limits.h>

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

/* 6 groups of 8 a lane: the backward at 6 takes 108 registers and up to
 * 96 KiB of shared memory (2 blocks of 8 warps an SM on 9.0; one on 8.x);
 * at 8 the backward of before (x and dout in registers) took 160 (one),
 * not timed against the strided kernel, so C past 1536 (gpt2-xl's 1600)
 * stays strided */
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

/* One row n of the wide backward (a warp): layernorm_bwd_dinp_kernel's
 * formulas, the row's x and dout kept in shared memory at tx and td for
 * the second pass (and for the block's column sums) rather than in
 * registers (a lane's 2K float4 of each took 64 registers at K 4) */
template <int K>
__device__ __forceinline__ void ln_bwd_row(float *dinp, uint16_t *dinp16, const float *dout,
                                           const float *inp, const float *w, float m, float r,
                                           int64_t n, int C, int lane, float *td, float *tx) {
  const float *x = inp + n * C, *d = dout + n * C;
  float *di = dinp + n * C;
  const int G = C / 8;
  float gs = 0.0f, gxs = 0.0f;
  ln_for4<K>(lane, G, [&](int, int c) {
    const float4 xq = kern_cuda_load_f32x4(x + c), dq = kern_cuda_load_f32x4(d + c),
                 wq = kern_cuda_load_f32x4(w + c);
    const float xa[4] = {xq.x, xq.y, xq.z, xq.w}, da[4] = {dq.x, dq.y, dq.z, dq.w},
                wa[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
      gs += wa[e] * da[e];
      gxs += wa[e] * da[e] * (xa[e] - m) * r;
    }
    *(float4 *)(tx + c) = xq;
    *(float4 *)(td + c) = dq;
  });
  /* a memory barrier: the second pass reads x and dout back from shared
   * memory, where the compiler might otherwise keep the stored values in
   * registers */
  __syncwarp();
  gs = kern_cuda_warp_sum(gs);
  gxs = kern_cuda_warp_sum(gxs);
  const float gm = gs / (float)C, gxm = gxs / (float)C;
  /* dinp's share of the row loaded whole before any of it is stored (up
   * to K 4): a store between the loads holds each behind it (it may alias
   * them), one load in flight a lane; w, which no thread writes, by the
   * read-only path, so its loads need not wait behind the stores either */
  float4 os[2 * K];
  ln_for4<K>(lane, G, [&](int q, int c) { os[q] = kern_cuda_load_f32x4(di + c); });
  ln_for4<K>(lane, G, [&](int q, int c) {
    const float4 wq = kern_cuda_load_f32x4_ro(w + c), xq = *(const float4 *)(tx + c),
                 dq = *(const float4 *)(td + c);
    const float4 o = os[q];
    const float xa[4] = {xq.x, xq.y, xq.z, xq.w}, da[4] = {dq.x, dq.y, dq.z, dq.w},
                wa[4] = {wq.x, wq.y, wq.z, wq.w};
    float oa[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float xhat = (xa[e] - m) * r;
      oa[e] += r * (wa[e] * da[e] - gm - xhat * gxm);
    }
    kern_cuda_store_f32x4(di + c, make_float4(oa[0], oa[1], oa[2], oa[3]));
    if (dinp16) /* the product's operand, as its packing rounds it */
      kern_cuda_store_u16x4(dinp16 + n * C + c,
                            make_uint2(kern_cuda_bf16x2(oa[0], oa[1]), kern_cuda_bf16x2(oa[2], oa[3])));
  });
}

/* Dynamic shared memory of the wide backward for C: the terms of a round's
 * rows */
static size_t ln_bwd_smem(int C) { return 2 * (size_t)LN_WARPS * (size_t)C * sizeof(float); }

/* The wide backward: dinp, and the first stage of dw's and db's column
 * sums on the way (colsum.cu's runs: each run of KERN_COLSUM_ROWS rows
 * summed from zero, row by row, of dout and dout (x - mean) rstd, as
 * colsum_runs_kernel forms them), so that colsum's own pass need not read
 * dout and x again (two of the five N x C fp32 matrices the op moved). A
 * block a run (grid-stride), its warps a row each a round: each warp puts
 * its row's x and dout in shared memory, then, after a barrier, the
 * block's threads, a column each (at most K of them: C <= 256 K), add the
 * round's rows to the run's sums in row order. partial[run C + c] holds
 * db's run sums, partial[(runs + run) C + c] dw's, as colsum_runs_kernel
 * lays them out for colsum_add. With dinp16 (layernorm_bwd16), each row's
 * dinp rounded to bf16 too, and dsums[run C + c] the run's sums of dinp
 * as written (read back after the round's barrier: the block's own rows,
 * just stored, so from the caches, not from memory). */
template <int K>
__global__ static void __launch_bounds__(LN_WARPS * 32)
    layernorm_bwd_wide_kernel(float *dinp, uint16_t *dinp16, float *dsums, float *partial,
                              const float *dout, const float *inp, const float *w,
                              const float *mean, const float *rstd, int N, int C) {
  extern __shared__ float4 ln_terms[];
  float *td = (float *)ln_terms, *tx = td + LN_WARPS * C;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int runs = (N + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
  for (int run = blockIdx.x; run < runs; run += gridDim.x) {
    const int n0 = run * KERN_COLSUM_ROWS,
              nr = N - n0 < KERN_COLSUM_ROWS ? N - n0 : KERN_COLSUM_ROWS;
    float pd[K], px[K], po[K];
#pragma unroll
    for (int i = 0; i < K; i++) pd[i] = 0.0f, px[i] = 0.0f, po[i] = 0.0f;
    for (int r0 = 0; r0 < nr; r0 += LN_WARPS) {
      const int n = n0 + r0 + warp;
      if (r0 + warp < nr) /* every warp to the barriers, rows or not */
        ln_bwd_row<K>(dinp, dinp16, dout, inp, w, mean[n], rstd[n], n, C, lane, td + warp * C,
                      tx + warp * C);
      __syncthreads();
      const int rows = nr - r0 < LN_WARPS ? nr - r0 : LN_WARPS;
      for (int k = 0; k < rows; k++) {
        const float m = mean[n0 + r0 + k], r = rstd[n0 + r0 + k];
        const float *drow = dinp + (int64_t)(n0 + r0 + k) * C;
#pragma unroll
        for (int i = 0; i < K; i++) {
          const int c = i * LN_WARPS * 32 + threadIdx.x;
          if (c < C) {
            const float dv = td[k * C + c];
            pd[i] += dv;
            px[i] += dv * (tx[k * C + c] - m) * r;
            if (dsums) po[i] += drow[c];
          }
        }
      }
      __syncthreads(); /* read before the next round's rows overwrite them */
    }
#pragma unroll
    for (int i = 0; i < K; i++) {
      const int c = i * LN_WARPS * 32 + threadIdx.x;
      if (c < C) {
        partial[(int64_t)run * C + c] = pd[i];
        partial[((int64_t)runs + run) * C + c] = px[i];
        if (dsums) dsums[(int64_t)run * C + c] = po[i];
      }
    }
  }
}

/* Rows of the wide backward a launch takes: as many runs as their sums
 * fit the packing buffers (colsum.cu's room, 2 C floats a run); on the
 * emulator 48, so a test's rows take several launches */
static int ln_bwd_rows(int C) {
#ifdef FSDP_CUDA_EMU_H
  (void)C;
  return 48 * KERN_COLSUM_ROWS;
#else
  const size_t room = 2 * KERN_CUDA_SIZE_PACK_ELEMS * sizeof(uint16_t) / sizeof(float);
  const size_t runs = room / (2 * (size_t)C);
  return runs * KERN_COLSUM_ROWS >= (size_t)INT_MAX ? INT_MAX & ~(KERN_COLSUM_ROWS - 1)
                                                     : (int)(runs * KERN_COLSUM_ROWS);
#endif
}

/* The wide backward over rows [0, N) (K groups of 8 a lane: ln_wide_k), a
 * block of rows a launch with its runs added to db and dw (colsum_add, in
 * row order: colsum's bits); 0 where a block may not have the shared
 * memory of K's widest C (asked for once: the strided kernels then) */
template <int K>
static int ln_bwd_wide(float *dinp, uint16_t *dinp16, float *dsums, float *dw, float *db,
                       const float *dout, const float *inp, const float *w, const float *mean,
                       const float *rstd, int N, int C) {
  const int cmax = 256 * K < LN_WIDE_MAX_C ? 256 * K : LN_WIDE_MAX_C;
  if (ln_bwd_smem(cmax) > kern_cuda_st.smem_optin) return 0;
  static int asked;
  kern_cuda_smem_allow(layernorm_bwd_wide_kernel<K>, ln_bwd_smem(cmax), &asked);
  float *partial = (float *)kern_cuda_st.pack;
  const int step = ln_bwd_rows(C);
  for (int64_t r0 = 0; r0 < N; r0 += step) {
    const int R = N - r0 < step ? (int)(N - r0) : step,
              runs = (R + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
    const int64_t at = r0 * C;
    layernorm_bwd_wide_kernel<K><<<runs < (int)KERN_CUDA_MAX_BLOCKS ? runs : KERN_CUDA_MAX_BLOCKS,
                                   LN_WARPS * 32, ln_bwd_smem(C), kern_cuda_st.stream>>>(
        dinp + at, dinp16 ? dinp16 + at : NULL,
        dsums ? dsums + r0 / KERN_COLSUM_ROWS * C : NULL, partial, dout + at, inp + at, w,
        mean + r0, rstd + r0, R, C);
    KERN_CUDA_LAUNCHED();
    kern_cuda_colsum_add(db, dw, partial, runs, C);
  }
  return 1;
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

/* The strided path's dinp16 and dsums: a pass over the finished dinp,
 * packed and summed as matmul.cu packs a product's dout
 * (kern_cuda_pack_colsum) */
__global__ static void __launch_bounds__(KERN_PACK_COLSUM_THREADS)
    layernorm_pack_colsum_kernel(uint16_t *dst, float *partial, const float *src, int rows,
                                 int cols) {
  kern_cuda_pack_colsum(
      dst, cols, partial, rows, cols, true, true,
      [&](int64_t n, int j) { return kern_cuda_load_f32x4(src + n * cols + j); },
      [&](int64_t n, int j) { return src[n * cols + j]; });
}

static void layernorm_bwd(float *dinp, uint16_t *dinp16, float *dsums, float *dw, float *db,
                          const float *dout, const float *inp, const float *w, const float *mean,
                          const float *rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  int done = 0;
  switch (ln_wide_k(C, dinp, dout, inp, w, dinp16 ? (const void *)dinp16 : w)) {
  case 1: done = ln_bwd_wide<1>(dinp, dinp16, dsums, dw, db, dout, inp, w, mean, rstd, N, C); break;
  case 2: done = ln_bwd_wide<2>(dinp, dinp16, dsums, dw, db, dout, inp, w, mean, rstd, N, C); break;
  case 4: done = ln_bwd_wide<4>(dinp, dinp16, dsums, dw, db, dout, inp, w, mean, rstd, N, C); break;
  case 6: done = ln_bwd_wide<6>(dinp, dinp16, dsums, dw, db, dout, inp, w, mean, rstd, N, C); break;
  }
  if (done) return;
  layernorm_bwd_dinp_kernel<<<(unsigned)((N + LN_WARPS - 1) / LN_WARPS), LN_WARPS * 32, 0,
                              kern_cuda_st.stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  KERN_CUDA_LAUNCHED();
  kern_cuda_colsum(db, dw, dout, inp, mean, rstd, N, C, C);
  if (!dinp16) return;
  layernorm_pack_colsum_kernel<<<kern_cuda_pack_colsum_grid(N, C), KERN_PACK_COLSUM_THREADS, 0,
                                 kern_cuda_st.stream>>>(dinp16, dsums, dinp, N, C);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                                        const float *inp, const float *w, const float *mean,
                                        const float *rstd, int N, int C) {
  layernorm_bwd(dinp, NULL, NULL, dw, db, dout, inp, w, mean, rstd, N, C);
}

extern "C" void kern_cuda_layernorm_bwd16(float *dinp, uint16_t *dinp16, float *dsums, float *dw,
                                          float *db, const float *dout, const float *inp,
                                          const float *w, const float *mean, const float *rstd,
                                          int N, int C) {
  /* kern.h: 16-byte rows of dinp16 and dinp */
  KERN_CUDA_ASSERT(dinp16 && dsums && C % 8 == 0 && kern_cuda_aligned16(dinp16) &&
                   kern_cuda_aligned16(dinp));
  layernorm_bwd(dinp, dinp16, dsums, dw, db, dout, inp, w, mean, rstd, N, C);
}

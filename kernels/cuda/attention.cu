/* attention: causal multi-head self-attention, forward and backward, as
 * kernels/cpu/attention.c defines it: scores = scale * q @ k^T (scale =
 * 1/sqrt(hs)), P = causal softmax, out = P @ v; backward dS = P * (dP -
 * rowsum(P * dP)) with dP = dout @ v^T, dq += scale * dS @ k, dk += scale *
 * dS^T @ q, dv += P^T @ dout. Two paths (kernels/cuda/size.h picks):
 *
 * Fused (head sizes 16, 32, 64, 128): the scores never leave the chip. A
 * warp owns a query row (forward, dq) or a key row (dk, dv); the block
 * stages 32-row tiles of the other side in shared memory, lane j takes row j
 * of a tile, and the warp shuffles its 32 probabilities to accumulate the
 * hs-wide output, each lane holding hs/32 of its columns. Forward runs the
 * online softmax (a running maximum and sum, the partial output rescaled
 * when the maximum grows) and keeps each row's log-sum-exp, B*NH*T floats
 * instead of B*NH*T*T. Backward recomputes P = exp(s - lse) twice: a query
 * pass writes D = dout . out per row (the scratch) and dq; a key pass reads
 * D and writes dk and dv. Every output has one writer and a fixed order: no
 * atomics, the same bytes from run to run. fp32 on CUDA cores; the order of
 * the sums (and the online rescaling) is not the CPU's, so results agree
 * within the products' tolerance, not bit for bit.
 *
 * In bf16 mode the fused op runs on tensor cores instead (attention_tc.cu:
 * the same saved rows and scratch), unless kern_cuda_opts_t.attn_fp32 or the
 * GPU gives a block too little shared memory for it (then here: a pass of
 * either kind reads what the other's forward kept).
 *
 * Strided products (other head sizes, or kern_cuda_opts_t.attn_gemm): for
 * each batch row b, one strided-batched cuBLASLt product over the NH heads.
 * Head h of q, k, v sits at column h*hs of qkv's rows (3C wide, q, k, v at
 * offsets 0, C, 2C), so consecutive heads are hs floats apart: the batch
 * stride, with leading dimension 3C (out and dout: C). The products cover
 * full T x T score matrices (the masked half included; the softmax
 * overwrites it with zeros, and zeros contribute nothing after). Softmaxes:
 * one warp per row of scores, the CPU's formula (the max by compare,
 * e^(x - max) by kern_expf, the sum, then times 1/sum); the sum is a
 * butterfly over the warp, so its order differs from the CPU's. att keeps
 * the probabilities; backward's score gradients live in the scratch,
 * (NH, T, T) for one batch row at a time. */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cudnn.h"
#include "kernels/kern_math.h"

#define ATT_WARPS 8 /* rows per block of the softmax kernels */

/* ---- sizes: size.h's formulas in the mode the job set --------------------- */

static int attn_fused(int C, int NH) { return kern_cuda_size_attn_fused(C, NH, kern_cuda_st.attn_gemm); }

/* The fused op on bf16 tensor cores (attention_tc.cu): bf16 jobs, unless asked not to. */
static int attn_tc(void) { return kern_cuda_st.bf16 && !kern_cuda_st.attn_fp32; }

size_t kern_cuda_attention_saved(int B, int T, int C, int NH) {
  return kern_cuda_size_attention_saved(B, T, C, NH, kern_cuda_st.attn_gemm);
}

size_t kern_cuda_attention_scratch(int B, int T, int C, int NH) {
  return kern_cuda_size_attention_scratch(B, T, C, NH, kern_cuda_st.attn_gemm, attn_tc(), 0, 0);
}

size_t kern_cuda_attention_scratch_bf16(int B, int T, int C, int NH) {
  KERN_CUDA_ASSERT(kern_cuda_attention_bf16_fits(C, NH));
  return kern_cuda_size_attention_scratch(B, T, C, NH, kern_cuda_st.attn_gemm, attn_tc(), 1,
                                          kern_cuda_st.attn_cudnn);
}

/* ---- fused ---------------------------------------------------------------------
 * FA_WARPS warps a block; each warp owns fa_rows<HS>() rows (queries in
 * forward and the dq pass, keys in the dk/dv pass), so a block owns
 * FA_WARPS * fa_rows rows and stages the other side in tiles of 32 rows.
 * Tiles read by lane (row lane of the tile, every column) are padded to
 * HS + 1 floats a row, so the 32 lanes hit 32 banks. Lane l holds the
 * output columns l, l + 32, ... (FA_COLS of them). Rows past T and keys
 * after the query are masked with exact zeros. The grid is (row blocks, NH,
 * B). */
#define FA_WARPS 4
#define FA_TILE 32

template <int HS> __host__ __device__ constexpr int fa_rows() { return HS >= 128 ? 2 : 4; }
template <int HS> __host__ __device__ constexpr int fa_cols() { return HS < 32 ? 1 : HS / 32; }

/* Loads rows [r0, r0 + n) of one head's hs columns of a (T, ld) matrix into
 * dst (rows of HS + pad floats); rows past T become zeros. The whole block
 * calls it. */
template <int HS, int PAD>
__device__ static void fa_load(float (*dst)[HS + PAD], const float *src, int64_t ld, int r0, int n,
                               int T) {
  for (int x = threadIdx.x; x < n * HS; x += blockDim.x) {
    const int r = x / HS, d = x % HS;
    dst[r][d] = r0 + r < T ? src[(int64_t)(r0 + r) * ld + d] : 0.0f;
  }
}

/* a . b over HS columns, in index order. The products here are written as
 * fused multiply-adds (__fmaf_rn: the file's -fmad=false forbids only the
 * compiler's own contraction), like cuBLAS's: this path matches the CPU
 * within a tolerance, not bit for bit, and an FMA is one instruction and one
 * rounding where a multiply and an add are two of each. */
template <int HS> __device__ static float fa_dot(const float *a, const float *b) {
  float acc = 0.0f;
#pragma unroll 16
  for (int d = 0; d < HS; d++) acc = __fmaf_rn(a[d], b[d], acc);
  return acc;
}

/* acc[t] += sum over the tile's rows jj of w (lane jj's) * tile[jj][lane + 32t]. */
template <int HS, int PAD>
__device__ static void fa_accum(float *acc, float w, const float (*tile)[HS + PAD], int n) {
  const int lane = threadIdx.x % 32;
  for (int jj = 0; jj < n; jj++) {
    const float wj = __shfl_sync(0xffffffffu, w, jj);
#pragma unroll
    for (int t = 0; t < fa_cols<HS>(); t++)
      if (lane + 32 * t < HS) acc[t] = __fmaf_rn(wj, tile[jj][lane + 32 * t], acc[t]);
  }
}

/* Forward: out, and lse (B, NH, T) = max + log(sum) of each query row's
 * scaled scores. */
template <int HS>
__global__ static void __launch_bounds__(FA_WARPS * 32)
    fa_fwd_kernel(float *out, float *lse, const float *qkv, int T, int C, float scale) {
  constexpr int R = fa_rows<HS>(), BQ = FA_WARPS * R, NC = fa_cols<HS>();
  __shared__ float Qs[BQ][HS];
  __shared__ float Ks[FA_TILE][HS + 1];
  __shared__ float Vs[FA_TILE][HS];
  const int b = blockIdx.z, h = blockIdx.y, NH = gridDim.y, q0 = blockIdx.x * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C;
  const float *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  fa_load<HS, 0>(Qs, base, C3, q0, BQ, T);
  float m[R], l[R], o[R][NC];
#pragma unroll
  for (int r = 0; r < R; r++) {
    m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int t = 0; t < NC; t++) o[r][t] = 0.0f;
  }
  const int kend = min(T, q0 + BQ); /* the block's last query sees keys < kend */
  for (int j0 = 0; j0 < kend; j0 += FA_TILE) {
    const int n = min(FA_TILE, kend - j0);
    __syncthreads(); /* the previous tile is read */
    fa_load<HS, 1>(Ks, base + C, C3, j0, n, T);
    fa_load<HS, 0>(Vs, base + 2 * C, C3, j0, n, T);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = warp * R + r, i = q0 + row;
      if (i >= T || j0 > i) continue; /* warp-uniform */
      const int j = j0 + lane;
      const float s = j <= i && lane < n ? scale * fa_dot<HS>(Qs[row], Ks[lane]) : -INFINITY;
      const float mn = fmaxf(m[r], kern_cuda_warp_max(s));
      const float corr = m[r] == -INFINITY ? 0.0f : kern_expf(m[r] - mn);
      const float p = j <= i && lane < n ? kern_expf(s - mn) : 0.0f;
      l[r] = l[r] * corr + kern_cuda_warp_sum(p);
#pragma unroll
      for (int t = 0; t < NC; t++) o[r][t] *= corr;
      fa_accum<HS, 0>(o[r], p, Vs, min(n, i - j0 + 1));
      m[r] = mn;
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = q0 + warp * R + r;
    if (i >= T) continue;
    const float inv = 1.0f / l[r];
    float *orow = out + ((int64_t)b * T + i) * C + (int64_t)h * HS;
#pragma unroll
    for (int t = 0; t < NC; t++)
      if (lane + 32 * t < HS) orow[lane + 32 * t] = o[r][t] * inv;
    if (lane == 0) lse[((int64_t)b * NH + h) * T + i] = m[r] + logf(l[r]);
  }
}

/* Backward, query pass: D = dout . out of each row into Dg (B, NH, T), and
 * dq += scale * sum_j dS_ij k_j. */
template <int HS>
__global__ static void __launch_bounds__(FA_WARPS * 32)
    fa_bwd_dq_kernel(float *dqkv, float *Dg, const float *dout, const float *qkv, const float *out,
                     const float *lse, int T, int C, float scale) {
  constexpr int R = fa_rows<HS>(), BQ = FA_WARPS * R, NC = fa_cols<HS>();
  __shared__ float Qs[BQ][HS];
  __shared__ float dOs[BQ][HS];
  __shared__ float Ks[FA_TILE][HS + 1];
  __shared__ float Vs[FA_TILE][HS + 1];
  const int b = blockIdx.z, h = blockIdx.y, NH = gridDim.y, q0 = blockIdx.x * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C;
  const float *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  const float *dbase = dout + (int64_t)b * T * C + (int64_t)h * HS;
  fa_load<HS, 0>(Qs, base, C3, q0, BQ, T);
  fa_load<HS, 0>(dOs, dbase, C, q0, BQ, T);
  float lr[R], Dr[R], acc[R][NC];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = q0 + warp * R + r;
    lr[r] = 0.0f, Dr[r] = 0.0f;
#pragma unroll
    for (int t = 0; t < NC; t++) acc[r][t] = 0.0f;
    if (i >= T) continue;
    const int64_t row = ((int64_t)b * NH + h) * T + i;
    const float *orow = out + ((int64_t)b * T + i) * C + (int64_t)h * HS;
    const float *drow = dbase + (int64_t)i * C;
    float d = 0.0f;
#pragma unroll
    for (int t = 0; t < NC; t++)
      if (lane + 32 * t < HS) d += drow[lane + 32 * t] * orow[lane + 32 * t];
    Dr[r] = kern_cuda_warp_sum(d);
    lr[r] = lse[row];
    if (lane == 0) Dg[row] = Dr[r];
  }
  __syncthreads(); /* dOs is read below, staged above */
  const int kend = min(T, q0 + BQ);
  for (int j0 = 0; j0 < kend; j0 += FA_TILE) {
    const int n = min(FA_TILE, kend - j0);
    __syncthreads();
    fa_load<HS, 1>(Ks, base + C, C3, j0, n, T);
    fa_load<HS, 1>(Vs, base + 2 * C, C3, j0, n, T);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = warp * R + r, i = q0 + row;
      if (i >= T || j0 > i) continue;
      const int j = j0 + lane;
      const int live = j <= i && lane < n;
      const float s = live ? scale * fa_dot<HS>(Qs[row], Ks[lane]) : 0.0f;
      const float p = live ? kern_expf(s - lr[r]) : 0.0f;
      const float dp = live ? fa_dot<HS>(dOs[row], Vs[lane]) : 0.0f;
      fa_accum<HS, 1>(acc[r], p * (dp - Dr[r]), Ks, min(n, i - j0 + 1));
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int i = q0 + warp * R + r;
    if (i >= T) continue;
    float *dq = dqkv + ((int64_t)b * T + i) * C3 + (int64_t)h * HS;
#pragma unroll
    for (int t = 0; t < NC; t++)
      if (lane + 32 * t < HS) dq[lane + 32 * t] += scale * acc[r][t];
  }
}

/* Backward, key pass: dv_j += sum_i P_ij dout_i and dk_j += scale * sum_i
 * dS_ij q_i over the queries i >= j, with the query pass's D. */
template <int HS>
__global__ static void __launch_bounds__(FA_WARPS * 32)
    fa_bwd_dkv_kernel(float *dqkv, const float *Dg, const float *dout, const float *qkv,
                      const float *lse, int T, int C, float scale) {
  constexpr int R = fa_rows<HS>(), BK = FA_WARPS * R, NC = fa_cols<HS>();
  __shared__ float Ks[BK][HS];
  __shared__ float Vs[BK][HS];
  __shared__ float Qs[FA_TILE][HS + 1];
  __shared__ float dOs[FA_TILE][HS + 1];
  __shared__ float Ls[FA_TILE], Dt[FA_TILE];
  const int b = blockIdx.z, h = blockIdx.y, NH = gridDim.y, k0 = blockIdx.x * BK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C;
  const float *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  const float *dbase = dout + (int64_t)b * T * C + (int64_t)h * HS;
  const int64_t rows = ((int64_t)b * NH + h) * T;
  fa_load<HS, 0>(Ks, base + C, C3, k0, BK, T);
  fa_load<HS, 0>(Vs, base + 2 * C, C3, k0, BK, T);
  float dk[R][NC], dv[R][NC];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int t = 0; t < NC; t++) dk[r][t] = dv[r][t] = 0.0f;
  for (int i0 = k0 / FA_TILE * FA_TILE; i0 < T; i0 += FA_TILE) {
    const int n = min(FA_TILE, T - i0);
    __syncthreads();
    fa_load<HS, 1>(Qs, base, C3, i0, n, T);
    fa_load<HS, 1>(dOs, dbase, C, i0, n, T);
    if (threadIdx.x < FA_TILE) {
      const int i = i0 + threadIdx.x;
      Ls[threadIdx.x] = i < T ? lse[rows + i] : 0.0f;
      Dt[threadIdx.x] = i < T ? Dg[rows + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int row = warp * R + r, j = k0 + row;
      if (j >= T || i0 + n - 1 < j) continue; /* every query of the tile is before this key */
      const int i = i0 + lane;
      const int live = lane < n && i >= j;
      const float s = live ? scale * fa_dot<HS>(Qs[lane], Ks[row]) : 0.0f;
      const float p = live ? kern_expf(s - Ls[lane]) : 0.0f;
      const float dp = live ? fa_dot<HS>(dOs[lane], Vs[row]) : 0.0f;
      fa_accum<HS, 1>(dv[r], p, dOs, n);
      fa_accum<HS, 1>(dk[r], p * (dp - Dt[lane]), Qs, n);
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int j = k0 + warp * R + r;
    if (j >= T) continue;
    float *dq = dqkv + ((int64_t)b * T + j) * C3 + (int64_t)h * HS;
#pragma unroll
    for (int t = 0; t < NC; t++)
      if (lane + 32 * t < HS) {
        dq[C + lane + 32 * t] += scale * dk[r][t];
        dq[2 * C + lane + 32 * t] += dv[r][t];
      }
  }
}

/* The fused kernels' grid: blocks of query rows, heads (y), batch rows (z). */
template <int HS> static dim3 fa_grid(int B, int T, int NH) {
  KERN_CUDA_ASSERT(NH <= 65535 && B <= 65535); /* grid y and z */
  const int rows = FA_WARPS * fa_rows<HS>();
  return dim3((unsigned)((T + rows - 1) / rows), (unsigned)NH, (unsigned)B);
}

template <int HS> static void fa_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
  const dim3 grid = fa_grid<HS>(B, T, NH);
  fa_fwd_kernel<HS><<<grid, FA_WARPS * 32, 0, kern_cuda_st.stream>>>(out, lse, qkv, T, C,
                                                                      1.0f / sqrtf((float)HS));
  KERN_CUDA_LAUNCHED();
}

template <int HS>
static void fa_bwd(float *dqkv, float *D, const float *dout, const float *qkv, const float *out,
                   const float *lse, int B, int T, int C, int NH) {
  const dim3 grid = fa_grid<HS>(B, T, NH);
  const float scale = 1.0f / sqrtf((float)HS);
  fa_bwd_dq_kernel<HS><<<grid, FA_WARPS * 32, 0, kern_cuda_st.stream>>>(dqkv, D, dout, qkv, out,
                                                                         lse, T, C, scale);
  KERN_CUDA_LAUNCHED();
  fa_bwd_dkv_kernel<HS><<<grid, FA_WARPS * 32, 0, kern_cuda_st.stream>>>(dqkv, D, dout, qkv, lse,
                                                                          T, C, scale);
  KERN_CUDA_LAUNCHED();
}

/* The fused path for hs (size.h's list), or 0 when none is built. */
static int fa_fwd_hs(int hs, float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
  switch (hs) {
  case 16: fa_fwd<16>(out, lse, qkv, B, T, C, NH); return 1;
  case 32: fa_fwd<32>(out, lse, qkv, B, T, C, NH); return 1;
  case 64: fa_fwd<64>(out, lse, qkv, B, T, C, NH); return 1;
  case 128: fa_fwd<128>(out, lse, qkv, B, T, C, NH); return 1;
  default: return 0;
  }
}

static int fa_bwd_hs(int hs, float *dqkv, float *D, const float *dout, const float *qkv,
                     const float *out, const float *lse, int B, int T, int C, int NH) {
  switch (hs) {
  case 16: fa_bwd<16>(dqkv, D, dout, qkv, out, lse, B, T, C, NH); return 1;
  case 32: fa_bwd<32>(dqkv, D, dout, qkv, out, lse, B, T, C, NH); return 1;
  case 64: fa_bwd<64>(dqkv, D, dout, qkv, out, lse, B, T, C, NH); return 1;
  case 128: fa_bwd<128>(dqkv, D, dout, qkv, out, lse, B, T, C, NH); return 1;
  default: return 0;
  }
}

/* ---- strided products ------------------------------------------------------- */

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

extern "C" void kern_cuda_attention_fwd(float *out, float *att, float *scratch, const float *qkv,
                                        int B, int T, int C, int NH) {
  /* scratch: the tensor-core kernels' bf16 copy of qkv; the others work in
   * shared memory, or in att */
  if (B <= 0 || T <= 0) return;
  KERN_CUDA_ASSERT(NH > 0 && C % NH == 0);
  const int hs = C / NH;
  if (attn_fused(C, NH)) { /* size.h's list is fa_fwd_hs's, and attention_tc.cu's */
    const int launched = (attn_tc() && kern_cuda_attention_tc_fwd(out, NULL, att, scratch, qkv, NULL, B, T, C, NH)) ||
                         fa_fwd_hs(hs, out, att, qkv, B, T, C, NH);
    KERN_CUDA_ASSERT(launched);
    return;
  }
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
                                        const float *qkv, const float *out, const float *att,
                                        int B, int T, int C, int NH, int acc) {
  if (B <= 0 || T <= 0) return;
  KERN_CUDA_ASSERT(NH > 0 && C % NH == 0);
  const int hs = C / NH;
  /* the tensor-core kernels write dqkv without acc (each element once); the
   * others accumulate, into zeros then */
  if (attn_fused(C, NH) && attn_tc() &&
      kern_cuda_attention_tc_bwd(dqkv, NULL, scratch, dout, NULL, qkv, NULL, out, NULL, att, B, T, C, NH,
                                 acc))
    return;
  if (!acc)
    KERN_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, (size_t)B * T * 3 * C * sizeof(float), kern_cuda_st.stream));
  if (attn_fused(C, NH)) {
    KERN_CUDA_ASSERT(fa_bwd_hs(hs, dqkv, scratch, dout, qkv, out, att, B, T, C, NH));
    return;
  }
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

/* ---- qkv kept in bf16 (kern.h's bf16 activations) ---------------------------
 * The tensor-core kernels stage their tiles from a bf16 copy of qkv; where
 * the caller keeps that copy (forward rounds qkv into it, backward reads
 * it), backward's second rounding pass goes, and the model keeps half the
 * bytes. Only for the shapes kern_cuda_attention_bf16_fits names: there the
 * tensor-core kernels always launch. */

extern "C" int kern_cuda_attention_bf16_fits(int C, int NH) {
  return kern_cuda_size_attn_tc_qkv16(C, NH, kern_cuda_st.attn_gemm, attn_tc());
}

/* cuDNN's attention (kern_cuda_st.attn_cudnn: cudnn.cu) takes its
 * workspace and dq's accumulator from the scratch, 256-byte aligned
 * (size.h leaves the room). */
static float *attn_cudnn_at(float *scratch, size_t at) {
  return (float *)(((uintptr_t)(scratch + at) + 255) & ~(uintptr_t)255);
}

/* cuDNN is told every tensor is 16-byte aligned (cudnn.cu); where one is
 * not, the kernels run the op. */
static int attn_cudnn_aligned(const void *a, const void *b, const void *c, const void *d,
                              const void *e) {
  return !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | (uintptr_t)e) & 15);
}

extern "C" void kern_cuda_attention_fwd_bf16(uint16_t *out16, float *att, float *scratch,
                                             const float *qkv, uint16_t *qkv16, int B, int T,
                                             int C, int NH) {
  if (B <= 0 || T <= 0) return;
  KERN_CUDA_ASSERT(kern_cuda_attention_bf16_fits(C, NH) && !((uintptr_t)out16 & 3) && qkv16);
  if (kern_cuda_st.attn_cudnn && attn_cudnn_aligned(out16, att, scratch, qkv16, NULL)) {
    /* qkv rounded as the kernels below round it (NULL: its product wrote qkv16) */
    if (qkv) kern_cuda_f32_to_bf16(qkv16, qkv, (size_t)B * (size_t)T * 3 * (size_t)C);
    if (kern_cudnn_sdpa_fwd(out16, att, qkv16,
                            attn_cudnn_at(scratch, kern_cuda_size_attn_cudnn_ws_at(B, T, C, NH)),
                            B, T, C, NH))
      return;
  }
  KERN_CUDA_ASSERT(kern_cuda_attention_tc_fwd(NULL, out16, att, scratch, qkv, qkv16, B, T, C, NH));
}

/* attention_bwd_bf16 into dqkv (fp32) or dqkv16 (bf16, acc 0): one of
 * the two */
static void attn_bwd_bf16(float *dqkv, uint16_t *dqkv16, float *scratch, const float *dout,
                          const uint16_t *dout16, const uint16_t *qkv16, const uint16_t *out16,
                          const float *att, int B, int T, int C, int NH, int acc) {
  if (B <= 0 || T <= 0) return;
  KERN_CUDA_ASSERT(!dout != !dout16 && (!dout16 || kern_cuda_aligned16(dout16)) &&
                   kern_cuda_attention_bf16_fits(C, NH) && !dqkv != !dqkv16 && (!dqkv16 || !acc));
  if (kern_cuda_st.attn_cudnn && !acc &&
      attn_cudnn_aligned(dqkv ? (const void *)dqkv : dqkv16, scratch, qkv16, out16, att)) {
    const uint16_t *d16 = dout16;
    if (!d16) { /* rounded into the scratch, where the kernels below round it */
      uint16_t *c16 = (uint16_t *)(scratch + kern_cuda_size_attn_tc_copies_at(B, T, NH));
      kern_cuda_f32_to_bf16(c16, dout, (size_t)B * (size_t)T * (size_t)C);
      d16 = c16;
    }
    uint16_t *g16 = dqkv16 ? dqkv16
                           : (uint16_t *)attn_cudnn_at(scratch,
                                                       kern_cuda_size_attn_cudnn_g16_at(B, T, C, NH));
    const int rc = kern_cudnn_sdpa_bwd(
        dqkv, g16, scratch, attn_cudnn_at(scratch, kern_cuda_size_attn_cudnn_acc_at(B, T, C, NH)),
        attn_cudnn_at(scratch, kern_cuda_size_attn_cudnn_ws_at(B, T, C, NH)), d16, qkv16, out16,
        att, B, T, C, NH);
    if (rc == 2 && dqkv) /* the gradients came in bf16 */
      kern_cuda_bf16_to_f32(dqkv, g16, (size_t)B * (size_t)T * 3 * (size_t)C);
    if (rc) return;
  }
  KERN_CUDA_ASSERT(kern_cuda_attention_tc_bwd(dqkv, dqkv16, scratch, dout, dout16, NULL, qkv16,
                                              NULL, out16, att, B, T, C, NH, acc));
}

extern "C" void kern_cuda_attention_bwd_bf16(float *dqkv, float *scratch, const float *dout,
                                             const uint16_t *dout16, const uint16_t *qkv16,
                                             const uint16_t *out16, const float *att, int B, int T,
                                             int C, int NH, int acc) {
  attn_bwd_bf16(dqkv, NULL, scratch, dout, dout16, qkv16, out16, att, B, T, C, NH, acc);
}

/* the gradients in bf16, for the qkv product's backward (kern.h): by the
 * kernels, their fp32 accumulators rounded as they are stored; by cuDNN, a
 * plan that writes bf16 (none: the kernels) */
extern "C" void kern_cuda_attention_bwd_dqkv16(uint16_t *dqkv16, float *scratch, const float *dout,
                                               const uint16_t *dout16, const uint16_t *qkv16,
                                               const uint16_t *out16, const float *att, int B,
                                               int T, int C, int NH) {
  attn_bwd_bf16(NULL, dqkv16, scratch, dout, dout16, qkv16, out16, att, B, T, C, NH, 0);
}

/* attention_tc: causal attention on bf16 tensor cores, for the jobs whose
 * products run in bf16 (kern_cuda_opts_t.bf16): the same op as attention.cu's
 * fused kernels (what forward keeps, each query row's log-sum-exp, and
 * backward's scratch, each row's dout . out, are theirs, so size.h's
 * formulas hold), with the four products of a tile on tensor cores through
 * WMMA (16 x 16 x 16, bf16 operands, fp32 accumulation), FlashAttention-2's
 * order:
 *
 *  - forward, a block per 64 query rows of one head: for each 64-key tile
 *    at or before its last row, S = q k^T (each warp its 16 rows), the
 *    online softmax on S in fp32 (running maximum m and sum l per row, the
 *    output rescaled when m grows), P rounded to bf16, O += P v; then out =
 *    O / l and lse = m + log l.
 *  - backward, two passes as attention.cu's (every output has one writer:
 *    no atomics, the same bytes from run to run): a query pass (a block per
 *    64 query rows) writes D = dout . out per row and dq += scale dS k over
 *    the key tiles, recomputing P = exp(scale S - lse) and dP = dout v^T;
 *    a key pass (a block per 64 keys) walks the query tiles at or after it
 *    and accumulates dv += P^T dout and dk += scale dS^T q, with dS = P (dP -
 *    D) rounded to bf16.
 *
 * q, k, v and dout are fp32 in memory (the activations) and rounded to bf16
 * (nearest even, as the CPU's casts) as a tile is staged in shared memory;
 * the softmax, its sums, D and every accumulator stay fp32. So this path
 * agrees with the CPU's fp32 attention within the bf16 products' bound
 * (TOL_GEMM_BF16 of tests/cuda/test_cuda_kernels.c), as bf16-mixed expects;
 * fp32 jobs and FSDP_CUDA_ATTN_FP32=1 keep the fp32 fused kernels.
 *
 * Layout: 4 warps a block, each owning 16 of its 64 rows; tiles staged as
 * bf16 rows of HS + 8 elements and fp32 score rows of 64 + 4, so WMMA's
 * leading dimensions are multiples of 8 (bf16) and 4 (fp32) and every
 * fragment starts 32-byte aligned. Rows past T are staged as zeros and
 * masked. Shared memory is dynamic (tc_*_smem: up to 120.5 KiB, for head
 * size 128's key pass; the passes' output staging reuses their score
 * tiles), asked for once (tc_smem_allow); a GPU that gives a block less
 * (99 KiB on compute capability 8.6 and 8.9: head size 128 there) runs the
 * fp32 kernels instead, which keep the same rows. */
#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

namespace wm = nvcuda::wmma;
typedef __nv_bfloat16 tc_bf16;
typedef wm::fragment<wm::accumulator, 16, 16, 16, float> tc_acc;

#define TC_ROWS 64           /* rows a block owns; the other side's tiles are as long */
#define TC_WARPS 4           /* each warp owns 16 of the rows */
#define TC_SP (TC_ROWS + 4)  /* fp32 score tile: floats a row */
#define TC_PP (TC_ROWS + 8)  /* bf16 probability tile: elements a row */

template <int HS> __host__ __device__ constexpr int tc_hp() { return HS + 8; } /* bf16 head tile */
template <int HS> __host__ __device__ constexpr int tc_op() { return HS + 4; } /* fp32 output tile */

/* Shared-memory bytes of each kernel (the layouts below, in this order). */
template <int HS> constexpr size_t tc_head_bytes() { return (size_t)TC_ROWS * tc_hp<HS>() * 2; }
constexpr size_t tc_score_bytes() { return (size_t)TC_ROWS * TC_SP * 4; }
constexpr size_t tc_prob_bytes() { return (size_t)TC_ROWS * TC_PP * 2; }
template <int HS> constexpr size_t tc_out_bytes() { return (size_t)TC_ROWS * tc_op<HS>() * 4; }
template <int HS> constexpr size_t tc_fwd_smem() {
  return 3 * tc_head_bytes<HS>() + tc_score_bytes() + tc_prob_bytes() + tc_out_bytes<HS>();
}
/* The backward passes stage their output (64 rows of HS + 4 floats) in their
 * two score tiles once the tile loop is over: they hold it for HS <= 128. */
template <int HS> constexpr size_t tc_dq_smem() {
  static_assert(tc_out_bytes<HS>() <= 2 * tc_score_bytes(), "the staging fits the score tiles");
  return 4 * tc_head_bytes<HS>() + 2 * tc_score_bytes() + tc_prob_bytes();
}
template <int HS> constexpr size_t tc_dkv_smem() {
  return 4 * tc_head_bytes<HS>() + 2 * tc_score_bytes() + 2 * tc_prob_bytes() +
         2 * TC_ROWS * sizeof(float);
}

/* Stages rows [r0, r0 + 64) of one head's HS columns of a (T, ld) fp32
 * matrix into dst as bf16 rows of tc_hp<HS>() elements; rows past T become
 * zeros. The whole block calls it. Scalar loads: activations need not be
 * 16-byte aligned, and consecutive threads read consecutive floats. */
template <int HS>
__device__ static void tc_stage(tc_bf16 *dst, const float *src, int64_t ld, int r0, int T) {
  for (int x = threadIdx.x; x < TC_ROWS * HS; x += blockDim.x) {
    const int r = x / HS, d = x % HS;
    dst[r * tc_hp<HS>() + d] = __float2bfloat16_rn(r0 + r < T ? src[(int64_t)(r0 + r) * ld + d] : 0.0f);
  }
}

/* acc += a (16 x K, row-major, lda) @ b^T, b being 16 rows of K (ldb):
 * the scores of 16 rows against 16 rows of the other side. */
template <int K>
__device__ static void tc_abt(tc_acc &acc, const tc_bf16 *a, int lda, const tc_bf16 *b, int ldb) {
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    wm::fragment<wm::matrix_a, 16, 16, 16, tc_bf16, wm::row_major> fa;
    wm::fragment<wm::matrix_b, 16, 16, 16, tc_bf16, wm::col_major> fb;
    wm::load_matrix_sync(fa, a + k, lda);
    wm::load_matrix_sync(fb, b + k, ldb);
    wm::mma_sync(acc, fa, fb, acc);
  }
}

/* acc += a (16 x K, row-major, lda) @ b (K x 16, row-major, ldb). */
template <int K>
__device__ static void tc_ab(tc_acc &acc, const tc_bf16 *a, int lda, const tc_bf16 *b, int ldb) {
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    wm::fragment<wm::matrix_a, 16, 16, 16, tc_bf16, wm::row_major> fa;
    wm::fragment<wm::matrix_b, 16, 16, 16, tc_bf16, wm::row_major> fb;
    wm::load_matrix_sync(fa, a + k, lda);
    wm::load_matrix_sync(fb, b + (int64_t)k * ldb, ldb);
    wm::mma_sync(acc, fa, fb, acc);
  }
}

/* dst (16 x 64 fp32, row stride TC_SP) = a (16 x HS) @ b^T for the 64 rows
 * of b: one warp's strip of a score tile. */
template <int HS>
__device__ static void tc_scores(float *dst, const tc_bf16 *a, const tc_bf16 *b) {
#pragma unroll
  for (int n0 = 0; n0 < TC_ROWS; n0 += 16) {
    tc_acc acc;
    wm::fill_fragment(acc, 0.0f);
    tc_abt<HS>(acc, a, tc_hp<HS>(), b + n0 * tc_hp<HS>(), tc_hp<HS>());
    wm::store_matrix_sync(dst + n0, acc, TC_SP, wm::mem_row_major);
  }
}

/* Forward: out, and lse (B, NH, T) = m + log(l) of each query row. */
template <int HS>
__global__ static void __launch_bounds__(TC_WARPS * 32)
    tc_fwd_kernel(float *out, float *lse, const float *qkv, int T, int C, float scale) {
  constexpr int HP = tc_hp<HS>(), OP = tc_op<HS>();
  extern __shared__ __align__(128) unsigned char tc_smem[];
  tc_bf16 *Qs = (tc_bf16 *)tc_smem, *Ks = Qs + TC_ROWS * HP, *Vs = Ks + TC_ROWS * HP;
  float *Ss = (float *)(Vs + TC_ROWS * HP);
  tc_bf16 *Ps = (tc_bf16 *)(Ss + TC_ROWS * TC_SP);
  float *Os = (float *)(Ps + TC_ROWS * TC_PP);
  const int b = blockIdx.z, h = blockIdx.y, NH = gridDim.y, q0 = blockIdx.x * TC_ROWS;
  const int w0 = threadIdx.x / 32 * 16, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C;
  const float *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  tc_stage<HS>(Qs, base, C3, q0, T);
  for (int x = threadIdx.x; x < TC_ROWS * OP; x += blockDim.x) Os[x] = 0.0f;
  float m[16], l[16]; /* per row of the warp's strip, the same in every lane */
#pragma unroll
  for (int r = 0; r < 16; r++) m[r] = -INFINITY, l[r] = 0.0f;
  const int kend = min(T, q0 + TC_ROWS); /* the block's last query sees keys < kend */
  for (int j0 = 0; j0 < kend; j0 += TC_ROWS) {
    __syncthreads(); /* the previous tile is read (and Qs, Os staged) */
    tc_stage<HS>(Ks, base + C, C3, j0, T);
    tc_stage<HS>(Vs, base + 2 * C, C3, j0, T);
    __syncthreads(); /* (j0 <= q0: every tile reaches each strip's first row) */
    tc_scores<HS>(Ss + w0 * TC_SP, Qs + w0 * HP, Ks);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; r++) {
      const int i = q0 + w0 + r;
      const float *srow = Ss + (w0 + r) * TC_SP;
      tc_bf16 *prow = Ps + (w0 + r) * TC_PP;
      float s[2], mx = -INFINITY;
#pragma unroll
      for (int t = 0; t < 2; t++) {
        const int c = lane + 32 * t, j = j0 + c;
        s[t] = i < T && j <= i ? scale * srow[c] : -INFINITY;
        mx = s[t] > mx ? s[t] : mx;
      }
      mx = kern_cuda_warp_max(mx);
      const float mn = mx > m[r] ? mx : m[r];
      if (mn == -INFINITY) { /* a row past T: nothing, ever */
        prow[lane] = prow[lane + 32] = __float2bfloat16_rn(0.0f);
        continue;
      }
      const float corr = m[r] == -INFINITY ? 0.0f : kern_expf(m[r] - mn);
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < 2; t++) {
        const float p = s[t] == -INFINITY ? 0.0f : kern_expf(s[t] - mn);
        prow[lane + 32 * t] = __float2bfloat16_rn(p);
        sum += p;
      }
      l[r] = l[r] * corr + kern_cuda_warp_sum(sum);
      m[r] = mn;
      if (corr != 1.0f)
        for (int d = lane; d < HS; d += 32) Os[(w0 + r) * OP + d] *= corr;
    }
    __syncwarp();
#pragma unroll
    for (int n0 = 0; n0 < HS; n0 += 16) {
      tc_acc acc;
      wm::load_matrix_sync(acc, Os + w0 * OP + n0, OP, wm::mem_row_major);
      tc_ab<TC_ROWS>(acc, Ps + w0 * TC_PP, TC_PP, Vs + n0, HP);
      wm::store_matrix_sync(Os + w0 * OP + n0, acc, OP, wm::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 16; r++) {
    const int i = q0 + w0 + r;
    if (i >= T) break;
    const float inv = 1.0f / l[r];
    float *orow = out + ((int64_t)b * T + i) * C + (int64_t)h * HS;
    for (int d = lane; d < HS; d += 32) orow[d] = Os[(w0 + r) * OP + d] * inv;
    if (lane == 0) lse[((int64_t)b * NH + h) * T + i] = m[r] + logf(l[r]);
  }
}

/* Backward, query pass: D = dout . out of each row into Dg (B, NH, T), and
 * dq += scale * dS k over the key tiles. */
template <int HS>
__global__ static void __launch_bounds__(TC_WARPS * 32)
    tc_bwd_dq_kernel(float *dqkv, float *Dg, const float *dout, const float *qkv, const float *out,
                     const float *lse, int T, int C, float scale) {
  constexpr int HP = tc_hp<HS>(), OP = tc_op<HS>();
  extern __shared__ __align__(128) unsigned char tc_smem[];
  tc_bf16 *Qs = (tc_bf16 *)tc_smem, *dOs = Qs + TC_ROWS * HP, *Ks = dOs + TC_ROWS * HP,
          *Vs = Ks + TC_ROWS * HP;
  float *Ss = (float *)(Vs + TC_ROWS * HP), *dPs = Ss + TC_ROWS * TC_SP;
  tc_bf16 *dSs = (tc_bf16 *)(dPs + TC_ROWS * TC_SP);
  float *stage = Ss; /* after the tile loop: the score tiles are free */
  const int b = blockIdx.z, h = blockIdx.y, NH = gridDim.y, q0 = blockIdx.x * TC_ROWS;
  const int w0 = threadIdx.x / 32 * 16, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C;
  const float *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  const float *dbase = dout + (int64_t)b * T * C + (int64_t)h * HS;
  tc_stage<HS>(Qs, base, C3, q0, T);
  tc_stage<HS>(dOs, dbase, C, q0, T);
  float Lr[16], Dr[16];
#pragma unroll
  for (int r = 0; r < 16; r++) {
    const int i = q0 + w0 + r;
    Lr[r] = Dr[r] = 0.0f;
    if (i >= T) continue;
    const int64_t row = ((int64_t)b * NH + h) * T + i;
    const float *orow = out + ((int64_t)b * T + i) * C + (int64_t)h * HS, *drow = dbase + (int64_t)i * C;
    float d = 0.0f;
    for (int c = lane; c < HS; c += 32) d += drow[c] * orow[c];
    Dr[r] = kern_cuda_warp_sum(d);
    Lr[r] = lse[row];
    if (lane == 0) Dg[row] = Dr[r];
  }
  tc_acc dq[HS / 16];
#pragma unroll
  for (int t = 0; t < HS / 16; t++) wm::fill_fragment(dq[t], 0.0f);
  const int kend = min(T, q0 + TC_ROWS);
  for (int j0 = 0; j0 < kend; j0 += TC_ROWS) {
    __syncthreads();
    tc_stage<HS>(Ks, base + C, C3, j0, T);
    tc_stage<HS>(Vs, base + 2 * C, C3, j0, T);
    __syncthreads();
    tc_scores<HS>(Ss + w0 * TC_SP, Qs + w0 * HP, Ks);
    tc_scores<HS>(dPs + w0 * TC_SP, dOs + w0 * HP, Vs);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; r++) {
      const int i = q0 + w0 + r, row = w0 + r;
#pragma unroll
      for (int t = 0; t < 2; t++) {
        const int c = lane + 32 * t, j = j0 + c;
        const float p = i < T && j <= i ? kern_expf(scale * Ss[row * TC_SP + c] - Lr[r]) : 0.0f;
        dSs[row * TC_PP + c] = __float2bfloat16_rn(p * (dPs[row * TC_SP + c] - Dr[r]));
      }
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < HS / 16; t++) tc_ab<TC_ROWS>(dq[t], dSs + w0 * TC_PP, TC_PP, Ks + 16 * t, HP);
  }
  __syncthreads(); /* every warp is done with the score tiles the staging reuses */
#pragma unroll
  for (int t = 0; t < HS / 16; t++)
    wm::store_matrix_sync(stage + w0 * OP + 16 * t, dq[t], OP, wm::mem_row_major);
  __syncwarp();
#pragma unroll 1
  for (int r = 0; r < 16; r++) {
    const int i = q0 + w0 + r;
    if (i >= T) break;
    float *dqrow = dqkv + ((int64_t)b * T + i) * C3 + (int64_t)h * HS;
    for (int d = lane; d < HS; d += 32) dqrow[d] += scale * stage[(w0 + r) * OP + d];
  }
}

/* Backward, key pass: dv += P^T dout and dk += scale dS^T q over the query
 * tiles at or after the block's keys, with the query pass's D. Each warp
 * works on its 16 keys' rows of the transposed tiles (S^T = k q^T). */
template <int HS>
__global__ static void __launch_bounds__(TC_WARPS * 32)
    tc_bwd_dkv_kernel(float *dqkv, const float *Dg, const float *dout, const float *qkv,
                      const float *lse, int T, int C, float scale) {
  constexpr int HP = tc_hp<HS>(), OP = tc_op<HS>();
  extern __shared__ __align__(128) unsigned char tc_smem[];
  tc_bf16 *Ks = (tc_bf16 *)tc_smem, *Vs = Ks + TC_ROWS * HP, *Qs = Vs + TC_ROWS * HP,
          *dOs = Qs + TC_ROWS * HP;
  float *St = (float *)(dOs + TC_ROWS * HP), *dPt = St + TC_ROWS * TC_SP;
  tc_bf16 *Pt = (tc_bf16 *)(dPt + TC_ROWS * TC_SP), *dSt = Pt + TC_ROWS * TC_PP;
  float *Lq = (float *)(dSt + TC_ROWS * TC_PP), *Dq = Lq + TC_ROWS;
  float *stage = St; /* after the tile loop: the score tiles are free */
  const int b = blockIdx.z, h = blockIdx.y, NH = gridDim.y, k0 = blockIdx.x * TC_ROWS;
  const int w0 = threadIdx.x / 32 * 16, lane = threadIdx.x % 32;
  const int64_t C3 = 3 * (int64_t)C, rows = ((int64_t)b * NH + h) * T;
  const float *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  const float *dbase = dout + (int64_t)b * T * C + (int64_t)h * HS;
  tc_stage<HS>(Ks, base + C, C3, k0, T);
  tc_stage<HS>(Vs, base + 2 * C, C3, k0, T);
  tc_acc dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int t = 0; t < HS / 16; t++) wm::fill_fragment(dk[t], 0.0f), wm::fill_fragment(dv[t], 0.0f);
  for (int i0 = k0; i0 < T; i0 += TC_ROWS) { /* k0 is a tile edge: the first tile holds key k0's query */
    __syncthreads();
    tc_stage<HS>(Qs, base, C3, i0, T);
    tc_stage<HS>(dOs, dbase, C, i0, T);
    for (int c = threadIdx.x; c < TC_ROWS; c += blockDim.x) {
      const int i = i0 + c;
      Lq[c] = i < T ? lse[rows + i] : 0.0f;
      Dq[c] = i < T ? Dg[rows + i] : 0.0f;
    }
    __syncthreads();
    if (k0 + w0 >= T) continue; /* warp-uniform: the strip's keys are all past T */
    tc_scores<HS>(St + w0 * TC_SP, Ks + w0 * HP, Qs);
    tc_scores<HS>(dPt + w0 * TC_SP, Vs + w0 * HP, dOs);
    __syncwarp();
#pragma unroll 1
    for (int r = 0; r < 16; r++) {
      const int j = k0 + w0 + r, row = w0 + r;
#pragma unroll
      for (int t = 0; t < 2; t++) {
        const int c = lane + 32 * t, i = i0 + c;
        const float p = j < T && i < T && i >= j ? kern_expf(scale * St[row * TC_SP + c] - Lq[c]) : 0.0f;
        Pt[row * TC_PP + c] = __float2bfloat16_rn(p);
        dSt[row * TC_PP + c] = __float2bfloat16_rn(p * (dPt[row * TC_SP + c] - Dq[c]));
      }
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < HS / 16; t++) {
      tc_ab<TC_ROWS>(dv[t], Pt + w0 * TC_PP, TC_PP, dOs + 16 * t, HP);
      tc_ab<TC_ROWS>(dk[t], dSt + w0 * TC_PP, TC_PP, Qs + 16 * t, HP);
    }
  }
  __syncthreads(); /* every warp is done with the score tiles the staging reuses */
  /* dk, then dv, through the warp's strip of the staging tile */
  for (int pass = 0; pass < 2; pass++) {
#pragma unroll
    for (int t = 0; t < HS / 16; t++)
      wm::store_matrix_sync(stage + w0 * OP + 16 * t, pass ? dv[t] : dk[t], OP, wm::mem_row_major);
    __syncwarp();
#pragma unroll 1
    for (int r = 0; r < 16; r++) {
      const int j = k0 + w0 + r;
      if (j >= T) break;
      float *g = dqkv + ((int64_t)b * T + j) * C3 + (pass ? 2 : 1) * (int64_t)C + (int64_t)h * HS;
      const float f = pass ? 1.0f : scale;
      for (int d = lane; d < HS; d += 32) g[d] += f * stage[(w0 + r) * OP + d];
    }
    __syncwarp();
  }
}

/* Lets a kernel take `bytes` of dynamic shared memory (over the 48 KiB a
 * launch gets unasked); once per kernel. */
template <typename K> static void tc_smem_allow(K kernel, size_t bytes, int *done) {
  if (*done) return;
  KERN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  *done = 1;
}

/* The grid: blocks of 64 rows, heads (y), batch rows (z). */
static dim3 tc_grid(int B, int T, int NH) {
  KERN_CUDA_ASSERT(NH <= 65535 && B <= 65535); /* grid y and z */
  return dim3((unsigned)((T + TC_ROWS - 1) / TC_ROWS), (unsigned)NH, (unsigned)B);
}

template <int HS> static int tc_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
  if (tc_fwd_smem<HS>() > kern_cuda_st.smem_optin) return 0;
  static int allowed;
  tc_smem_allow(tc_fwd_kernel<HS>, tc_fwd_smem<HS>(), &allowed);
  tc_fwd_kernel<HS><<<tc_grid(B, T, NH), TC_WARPS * 32, tc_fwd_smem<HS>(), kern_cuda_st.stream>>>(
      out, lse, qkv, T, C, 1.0f / sqrtf((float)HS));
  KERN_CUDA_LAUNCHED();
  return 1;
}

template <int HS>
static int tc_bwd(float *dqkv, float *D, const float *dout, const float *qkv, const float *out,
                  const float *lse, int B, int T, int C, int NH) {
  if (tc_dq_smem<HS>() > kern_cuda_st.smem_optin || tc_dkv_smem<HS>() > kern_cuda_st.smem_optin)
    return 0;
  static int allowed_dq, allowed_dkv;
  tc_smem_allow(tc_bwd_dq_kernel<HS>, tc_dq_smem<HS>(), &allowed_dq);
  tc_smem_allow(tc_bwd_dkv_kernel<HS>, tc_dkv_smem<HS>(), &allowed_dkv);
  const dim3 grid = tc_grid(B, T, NH);
  const float scale = 1.0f / sqrtf((float)HS);
  tc_bwd_dq_kernel<HS><<<grid, TC_WARPS * 32, tc_dq_smem<HS>(), kern_cuda_st.stream>>>(
      dqkv, D, dout, qkv, out, lse, T, C, scale);
  KERN_CUDA_LAUNCHED();
  tc_bwd_dkv_kernel<HS><<<grid, TC_WARPS * 32, tc_dkv_smem<HS>(), kern_cuda_st.stream>>>(
      dqkv, D, dout, qkv, lse, T, C, scale);
  KERN_CUDA_LAUNCHED();
  return 1;
}

int kern_cuda_attention_tc_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
  switch (C / NH) {
  case 16: return tc_fwd<16>(out, lse, qkv, B, T, C, NH);
  case 32: return tc_fwd<32>(out, lse, qkv, B, T, C, NH);
  case 64: return tc_fwd<64>(out, lse, qkv, B, T, C, NH);
  case 128: return tc_fwd<128>(out, lse, qkv, B, T, C, NH);
  default: return 0;
  }
}

int kern_cuda_attention_tc_bwd(float *dqkv, float *D, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int C, int NH) {
  switch (C / NH) {
  case 16: return tc_bwd<16>(dqkv, D, dout, qkv, out, lse, B, T, C, NH);
  case 32: return tc_bwd<32>(dqkv, D, dout, qkv, out, lse, B, T, C, NH);
  case 64: return tc_bwd<64>(dqkv, D, dout, qkv, out, lse, B, T, C, NH);
  case 128: return tc_bwd<128>(dqkv, D, dout, qkv, out, lse, B, T, C, NH);
  default: return 0;
  }
}

/* attention_tc: causal attention on bf16 tensor cores, for the jobs whose
 * products run in bf16 (kern_cuda_opts_t.bf16): the same op as attention.cu's
 * fused kernels (what forward keeps, each query row's log-sum-exp, and
 * backward's D rows, each row's dout . out, are theirs; the scratch holds
 * the bf16 copies below besides: size.h), FlashAttention-2's order, with every product on tensor
 * cores through mma.sync m16n8k16 (bf16 operands, fp32 accumulation) and
 * the softmax on the products' accumulators in registers:
 *
 *  - forward, a block per 128 query rows of one head, each of its 4 warps
 *    owning 32 rows (two m-tiles of 16; at head size 128, 8 warps of one):
 *    for each 64-key tile at or before its last row, S =
 *    q k^T, the online softmax on S in fp32 (running maximum m and sum l per
 *    row, the output rescaled when m grows), P rounded to bf16 straight from
 *    S's accumulators into the next product's operand, O += P v; then out =
 *    O / l and lse = m + log l.
 *  - backward, two passes as attention.cu's (every output has one writer:
 *    no atomics, the same bytes from run to run): a query pass (a block per
 *    128 query rows, 4 warps of 32; 64 rows at head size 128) writes D =
 *    dout . out per row and dq += scale
 *    dS k over the key tiles, recomputing P = exp(scale S - lse) and dP =
 *    dout v^T; a key pass (a block per 128 keys, 8 warps) walks the 64-query
 *    tiles at or after it
 *    and accumulates dv += P^T dout and dk += scale dS^T q, with dS = P (dP -
 *    D) rounded to bf16.
 *
 * q, k, v and dout are fp32 in memory (the activations). Each op first
 * rounds them to bf16 once (nearest even, the casts' kernel and the CPU's
 * bits) into copies in its scratch (size.h: 2C floats a token more than
 * the fp32 kernels' scratch), and the kernels stage their tiles from the
 * copies (where the caller keeps qkv in bf16, kern.h's attention_fwd_bf16,
 * forward rounds it into the caller's buffer and backward reads it there:
 * one pass over qkv less, half its bytes kept); a key tile is loaded by
 * every block of queries after it, and
 * rounding fp32 at each load cost instructions these kernels are bound by;
 * the copies also halve the bytes a tile's load moves;
 * the softmax, its sums, D and every accumulator stay fp32, the softmax in
 * base 2 on the special function unit's ex2 (kern_cuda_exp2_approx). So this path agrees
 * with the CPU's fp32 attention within the bf16 products' bound
 * (TOL_GEMM_BF16 of tests/cuda/test_cuda_kernels.c), as bf16-mixed expects;
 * fp32 jobs and FSDP_CUDA_ATTN_FP32=1 keep the fp32 fused kernels.
 *
 * The kernels are bound by the instructions they issue, not by memory or the
 * tensor cores (ncu on an H200, docs/PERF.md): the element-wise work of a
 * tile is kept short (one fmaf and ex2 an element, conversions of two
 * elements at once), and the causal mask is applied only to the tiles that
 * cross the diagonal or T (warp-uniform).
 *
 * The fragments' layouts are the PTX ISA's for m16n8k16 (kern_cuda_mma_bf16;
 * tests/cuda/emu/cuda_emu.h emulates them). Every tile is staged as it lies
 * in memory, a row tile (64 or 128 rows of HS bf16) in rows of HS / 2 + 4
 * 32-bit words, and the products' operands come from it by ldmatrix
 * (tc_ldsm), two fragments an instruction: as they are for a product along
 * the tile's rows (q k^T, dout v^T), transposed (.trans) for one down them
 * (P v, dS k, P^T dout, dS^T q). The padding puts the 8 rows of 16 bytes
 * each ldmatrix phase reads in 32 banks. Tiles of keys wholly after a
 * warp's last query (the causal diagonal) are skipped. Rows past T are
 * staged as zeros and masked. The other side's tiles are double buffered:
 * each is copied by cp.async (global to shared memory, no registers in
 * between) while the products of the one before run, and waited for
 * (kern_cuda_cp_wait, then a barrier) only when its turn comes. Shared memory is
 * dynamic (tc_*_smem: up to 137 KiB, for head size 128's key pass), asked
 * for once (kern_cuda_smem_allow); a GPU that gives a block less runs the fp32
 * kernels instead, which keep the same rows. */
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

#define TC_ROWS 64                 /* a tile of the other side (keys; the key pass: queries) */
/* Warps a block of each kernel; each owns 16 rows (queries; the key pass:
 * keys; the forward and the query pass: 16 for each m-tile, tc_fwd_mt and
 * tc_dq_mt), and every tile of the other side a block stages serves them
 * all. TC_FWD_WARPS counts the forward's 16-row groups: 8 (128 rows: the
 * staging, a third of its instructions, halves against 64-row blocks), 4
 * warps of two m-tiles at head sizes to 64; the key pass takes 8 warps
 * (the same reason); the query pass 4 (blocks of 8 would stage half the
 * tiles, but stop 35's 165 registers left an SM one of them). Both
 * backward passes take their own rows' fragments from shared memory at each
 * tile rather than holding them, and each tile in parts (tc_dkv_tile: two
 * halves; tc_dq_tile: parts of 32 / MT keys), which fits at
 * head size 64 the key pass's 2 blocks an SM at 128 registers (226 and one
 * block before) and the query pass's 3 at 168 (its 2 m-tiles in halves
 * took 217, or spilled at 168; one m-tile in halves: 4 blocks at 125). */
#define TC_FWD_WARPS 8
#define TC_DQ_WARPS 4
#define TC_DKV_WARPS 8
#define TC_NT (TC_ROWS / 8)        /* a tile's 8-column strips (the products' n) */

template <int HS> __host__ __device__ constexpr int tc_rw() { return HS / 2 + 4; } /* row tile: words a row */
/* The query pass's warps own 16 rows for each of their m-tiles: 2 at head
 * sizes to 64, so that every fragment of a key or value tile loaded from
 * shared memory feeds two products, not one, for two independent chains of
 * products a warp (the pass is latency-bound: ncu, docs/PERF.md); by count
 * at head size 64, 3.5 ldmatrix a row a tile against 4 (the own rows'
 * fragments are loaded again for each of the 4 parts of a tile that keep
 * the registers at 168), and a block 128 query rows (the staging of the
 * key and value tiles, per row, halves); 1 at 128 (registers). Untimed. */
template <int HS> __host__ __device__ constexpr int tc_dq_mt() { return HS <= 64 ? 2 : 1; }
template <int HS> __host__ __device__ constexpr int tc_dq_rows() { return 16 * tc_dq_mt<HS>() * TC_DQ_WARPS; }

/* Shared-memory bytes of each kernel (the layouts below, in this order):
 * its own rows' tiles (16 W rows), two buffers of the other side's (64
 * rows each: the tile the products read and the next one, being copied),
 * and the key pass's two buffers of those rows' log-sum-exps and D (the
 * query pass: its own rows'). */
template <int HS> constexpr size_t tc_row_bytes(int rows) { return (size_t)rows * tc_rw<HS>() * 4; }
template <int HS> constexpr size_t tc_fwd_smem() {
  return tc_row_bytes<HS>(16 * TC_FWD_WARPS) + 4 * tc_row_bytes<HS>(TC_ROWS);
}
template <int HS> constexpr size_t tc_dq_smem() {
  return 2 * tc_row_bytes<HS>(tc_dq_rows<HS>()) + 4 * tc_row_bytes<HS>(TC_ROWS) +
         2 * tc_dq_rows<HS>() * sizeof(float);
}
template <int HS> constexpr size_t tc_dkv_smem() {
  return 2 * tc_row_bytes<HS>(16 * TC_DKV_WARPS) + 4 * tc_row_bytes<HS>(TC_ROWS) +
         4 * TC_ROWS * sizeof(float);
}

/* d += a b on the tensor cores: a 16 x 16 and b 16 x 8, bf16, d fp32, in
 * the PTX ISA's fragment layouts (tests/cuda/emu/cuda_emu.h spells them
 * out). A warp collective. */
__device__ __forceinline__ void kern_cuda_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef FSDP_CUDA_EMU_H
  emu::mma_m16n8k16_bf16(d, a, b);
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* The softmax works in base 2 (kern_cuda_exp2_approx), its scores scaled by
 * scale * log2(e) (TC_LOG2E), as FlashAttention does: one fmaf (score
 * times that, less the row's maximum or log-sum-exp; explicit, as this file
 * is built with -fmad=false) and one ex2 an element. */
#define TC_LOG2E 1.44269504088896341f
#define TC_LN2 0.693147180559945309f

/* Stages rows [r0, r0 + ROWS) of one head's HS columns of a (T, ld) bf16
 * matrix (the op's bf16 copy in its scratch) into the row tile rows; rows
 * past T become zeros. The whole block (NTH threads) calls it; each thread
 * copies runs of 8 bf16 with cp.async, 16 bytes each (a copy's rows and
 * every head start at a multiple of 8 elements, and the tile's rows at
 * multiples of 16 bytes), which go on while the block computes: the caller
 * commits them and waits (kern_cuda_cp_wait) before a barrier and the reads. */
template <int HS, int ROWS, int NTH>
__device__ static void tc_stage(uint32_t *rows, const uint16_t *src, int64_t ld, int r0, int T) {
  static_assert(tc_rw<HS>() % 4 == 0, "rows of 16 bytes");
  constexpr int RUNS = ROWS * HS / 8;
#pragma unroll
  for (int x0 = 0; x0 < RUNS; x0 += NTH) {
    const int x = x0 + (int)threadIdx.x, r = x / (HS / 8), c = 8 * (x % (HS / 8));
    if (RUNS % NTH && x >= RUNS) break;
    const bool in = r0 + r < T;
    kern_cuda_cp_async(rows + r * tc_rw<HS>() + c / 2, in ? src + (int64_t)(r0 + r) * ld + c : src, in);
  }
}

/* ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16: N 8 x 8 matrices of
 * bf16 from shared memory, a warp collective. Lane l gives in row the
 * address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned; lanes
 * from 8N on are ignored); r[m] gets matrix m's row g, columns 2t and 2t +
 * 1 (g = lane / 4, t = lane % 4: the fragment layout of mma's a and b), or
 * with TR its column g, rows 2t and 2t + 1 (the lower row in the low half).
 * One instruction for what took 2N 32-bit loads; TR reads a row tile as the
 * b operand of a product down its rows (P v, dS k, P^T dout, dS^T q), where
 * a transposed copy was staged before. */
template <int N, bool TR> __device__ __forceinline__ static void tc_ldsm(uint32_t r[N], const uint32_t *row) {
#ifdef FSDP_CUDA_EMU_H
  emu::ldmatrix<N, TR>(r, row);
#else
  const unsigned a = (unsigned)__cvta_generic_to_shared(row);
  if constexpr (N == 4 && TR)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else if constexpr (N == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  static_assert(N == 4 || (N == 2 && !TR), "the forms used here");
#endif
}

/* s[n] = a (16 x HS, HS / 16 fragments) @ x^T for the 8 rows of strip n of
 * the row tile x (NS strips of 8 rows of HS), for the strips n in [lo,
 * hi); the others are zeros. b's fragments for two 16-column slices (one at
 * head size 16) come from one ldmatrix: lane l's row is the strip's row l %
 * 8, at slice word 4 (l / 8). With MT m-tiles, a holds each one's HS / 16
 * fragments in turn and s[mt NS + n] is m-tile mt's strip n: each b
 * fragment serves them all. */
template <int HS, int NS = TC_NT, int MT = 1>
__device__ __forceinline__ static void tc_scores(float (*s)[4], const uint32_t (*a)[4],
                                                 const uint32_t *x, int lo, int hi) {
  const int l = threadIdx.x % 32;
  const uint32_t *xl = x + (l % 8) * tc_rw<HS>() + 4 * (HS >= 32 ? l / 8 : l / 8 % 2);
#pragma unroll
  for (int n = 0; n < NS; n++) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
      s[mt * NS + n][0] = s[mt * NS + n][1] = s[mt * NS + n][2] = s[mt * NS + n][3] = 0.0f;
    if (n < lo || n >= hi) continue; /* warp-uniform */
    if constexpr (HS >= 32) {
#pragma unroll
      for (int k = 0; k < HS / 16; k += 2) {
        uint32_t b[4];
        tc_ldsm<4, false>(b, xl + 8 * n * tc_rw<HS>() + 8 * k);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          kern_cuda_mma_bf16(s[mt * NS + n], a[mt * (HS / 16) + k], b);
          kern_cuda_mma_bf16(s[mt * NS + n], a[mt * (HS / 16) + k + 1], b + 2);
        }
      }
    } else {
      uint32_t b[2];
      tc_ldsm<2, false>(b, xl + 8 * n * tc_rw<HS>());
#pragma unroll
      for (int mt = 0; mt < MT; mt++) kern_cuda_mma_bf16(s[mt * NS + n], a[mt * (HS / 16)], b);
    }
  }
}

/* tc_scores for NS strips of x (those in [lo, hi)), with a's fragments loaded from ar (the
 * warp's 16 rows of its own row tile) by ldmatrix, two 16-column slices at
 * a time, instead of held in registers through the kernel: the key pass's
 * registers. Each s[n] sums its slices in the same order (the same bits).
 * With MT m-tiles the warp owns 16 MT rows from ar, and s[mt NS + n] is
 * m-tile mt's strip n: each b fragment loaded serves every m-tile. */
template <int HS, int NS, int MT = 1>
__device__ __forceinline__ static void tc_scores_lda(float (*s)[4], const uint32_t *ar, const uint32_t *x,
                                                     int lo, int hi) {
  const int l = threadIdx.x % 32;
  const uint32_t *xl = x + (l % 8) * tc_rw<HS>() + 4 * (HS >= 32 ? l / 8 : l / 8 % 2);
  const uint32_t *al = ar + (l % 16) * tc_rw<HS>() + 4 * (l / 16);
#pragma unroll
  for (int n = 0; n < MT * NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  if constexpr (HS >= 32) {
#pragma unroll
    for (int k = 0; k < HS / 16; k += 2) {
      uint32_t a0[MT][4], a1[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        tc_ldsm<4, false>(a0[mt], al + 16 * mt * tc_rw<HS>() + 8 * k);
        tc_ldsm<4, false>(a1[mt], al + 16 * mt * tc_rw<HS>() + 8 * (k + 1));
      }
#pragma unroll
      for (int n = 0; n < NS; n++) {
        if (n < lo || n >= hi) continue; /* warp-uniform */
        uint32_t b[4];
        tc_ldsm<4, false>(b, xl + 8 * n * tc_rw<HS>() + 8 * k);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          kern_cuda_mma_bf16(s[mt * NS + n], a0[mt], b);
          kern_cuda_mma_bf16(s[mt * NS + n], a1[mt], b + 2);
        }
      }
    }
  } else {
    uint32_t a0[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) tc_ldsm<4, false>(a0[mt], al + 16 * mt * tc_rw<HS>());
#pragma unroll
    for (int n = 0; n < NS; n++) {
      if (n < lo || n >= hi) continue;
      uint32_t b[2];
      tc_ldsm<2, false>(b, xl + 8 * n * tc_rw<HS>());
#pragma unroll
      for (int mt = 0; mt < MT; mt++) kern_cuda_mma_bf16(s[mt * NS + n], a0[mt], b);
    }
  }
}

/* acc[d] += p (16 x 64, s's accumulators as bf16) @ y for the row tile y
 * (64 rows of HS), over the 16-row slices holding strips in [lo, hi). b's
 * fragments for two 8-column strips of y come from one ldmatrix.trans:
 * lane l's row is the slice's row l % 16, at word 4 (d + l / 16). With MT
 * m-tiles, acc[mt HS / 8 + d] += p[mt NS ..] @ y for each, every b
 * fragment serving them all. */
template <int HS, int NS = TC_NT, int MT = 1>
__device__ __forceinline__ static void tc_accumulate(float (*acc)[4], const float (*p)[4],
                                                     const uint32_t *y, int lo, int hi) {
  const int l = threadIdx.x % 32;
  const uint32_t *yl = y + (l % 16) * tc_rw<HS>() + 4 * (l / 16);
#pragma unroll
  for (int k = 0; k < NS / 2; k++) {
    if (2 * k + 1 < lo || 2 * k >= hi) continue; /* warp-uniform */
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      const float(*q)[4] = p + mt * NS + 2 * k;
      a[mt][0] = kern_cuda_bf16x2_rn(q[0][0], q[0][1]), a[mt][1] = kern_cuda_bf16x2_rn(q[0][2], q[0][3]);
      a[mt][2] = kern_cuda_bf16x2_rn(q[1][0], q[1][1]), a[mt][3] = kern_cuda_bf16x2_rn(q[1][2], q[1][3]);
    }
#pragma unroll
    for (int d = 0; d < HS / 8; d += 2) {
      uint32_t b[4];
      tc_ldsm<4, true>(b, yl + 16 * k * tc_rw<HS>() + 4 * d);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        kern_cuda_mma_bf16(acc[mt * (HS / 8) + d], a[mt], b);
        kern_cuda_mma_bf16(acc[mt * (HS / 8) + d + 1], a[mt], b + 2);
      }
    }
  }
}

/* A warp's 16 rows of a row tile as a operands: one ldmatrix a 16 x 16
 * slice, lane l's row l % 16 at word 4 (l / 16). */
template <int HS> __device__ __forceinline__ static void tc_load_rows(uint32_t a[HS / 16][4], const uint32_t *x) {
  const int l = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < HS / 16; k++) tc_ldsm<4, false>(a[k], x + (l % 16) * tc_rw<HS>() + 4 * (l / 16) + 8 * k);
}

/* Row r0 + g and r0 + g + 8 of an (n, ld) matrix at dst, columns 2t and
 * 2t + 1 of each 8-column strip, from f * acc: added (add) or stored; rows
 * >= n are left. These are this thread's elements of the warp's 16 rows. A
 * bf16 dst (O uint16_t, dst and ld even: 4-byte pairs) is stored only, each
 * pair rounded as kern_f32_to_bf16 rounds (the casts' bits). */
template <int HS, typename O>
__device__ __forceinline__ static void tc_put_rows(O *dst, int64_t ld, int r0, int n,
                                                   const float acc[HS / 8][4], float f, int add) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = r0 + g + 8 * h;
    if (r >= n) continue;
    O *row = dst + (int64_t)r * ld + 2 * t;
#pragma unroll
    for (int d = 0; d < HS / 8; d++) {
      const float x = f * acc[d][2 * h], y = f * acc[d][2 * h + 1];
      if constexpr (sizeof(O) == 2)
        *(uint32_t *)(row + 8 * d) = kern_cuda_bf16x2(x, y);
      else
        row[8 * d] = add ? row[8 * d] + x : x, row[8 * d + 1] = add ? row[8 * d + 1] + y : y;
    }
  }
}

/* an element of out as fp32: itself, or a bf16 widened */
__device__ __forceinline__ static float tc_f32(float x) { return x; }
__device__ __forceinline__ static float tc_f32(uint16_t x) { return kern_bf16_to_f32(x); }

/* The scores s of the warp's 16 query rows from i0 against the 64 keys
 * from j0, where mask (warp-uniform: the tile holds a key after a row, or a
 * row past T): a key after its row, or a row past T, becomes -inf. The
 * scale is left to the exponent's fmaf (one instruction an element for
 * what a multiply and a subtraction took). */
template <int NS = TC_NT>
__device__ __forceinline__ static void tc_mask(float (*s)[4], int i0, int j0, int T, int mask) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < NS; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int i = i0 + g + 8 * (e / 2), j = j0 + 8 * n + 2 * t + e % 2;
      if (mask && !(i < T && j <= i)) s[n][e] = -INFINITY;
    }
}

/* Maximum and sum over the 4 lanes that share a row of an accumulator. */
__device__ __forceinline__ static float tc_quad_max(float v) {
  for (int o = 1; o < 4; o <<= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
__device__ __forceinline__ static float tc_quad_sum(float v) {
  for (int o = 1; o < 4; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* One key tile of the forward for a warp's 16 MT query rows from i0: the
 * scores against the 64 keys from j0 (tile Ks), the online softmax's m and
 * l (this lane's rows and columns: m[2 mt + r]) and the output o rescaled
 * and accumulated with P v (tile Vs). Some key is at or before the warp's
 * last row. With two m-tiles the tile goes in parts (the scores'
 * registers), the softmax's maximum and rescaling per part. */
template <int HS, int MT>
__device__ __forceinline__ static void tc_fwd_tile(float (*o)[4], float *m, float *l,
                                                   const uint32_t (*qa)[4], const uint32_t *Ks,
                                                   const uint32_t *Vs, float sl2, int i0, int j0, int T) {
  /* one m-tile: the whole tile; two: 4 parts of 16 keys, which keep the
   * registers at 167 for 3 blocks an SM (2 parts took 216, or spilled at
   * 168), for 4 rescalings of o a tile instead of 1 */
  constexpr int PARTS = MT == 1 ? 1 : 4, NS = TC_NT / PARTS, HR = 8 * NS; /* strips and rows of a part */
  const int hi = min(TC_NT, (i0 + 16 * MT - 1 - j0) / 8 + 1);
#pragma unroll
  for (int hf = 0; hf < PARTS; hf++) {
    if (NS * hf >= hi) continue; /* warp-uniform: every key of the part after the rows */
    const int hh = min(NS, hi - NS * hf), jh = j0 + HR * hf;
    const uint32_t *kh = Ks + HR * hf * tc_rw<HS>(), *vh = Vs + HR * hf * tc_rw<HS>();
    float s[MT * NS][4];
    tc_scores<HS, NS, MT>(s, qa, kh, 0, hh);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      const int r0 = i0 + 16 * mt;
      float(*sm)[4] = s + mt * NS, *mm = m + 2 * mt, *lm = l + 2 * mt;
      /* the mask only where the part holds a key after a row, or a row past T */
      tc_mask<NS>(sm, r0, jh, T, jh + HR - 1 > r0 || r0 + 15 >= T);
      float mx[2] = {-INFINITY, -INFINITY}; /* of the unscaled scores: sl2 > 0 keeps the order */
#pragma unroll
      for (int n = 0; n < NS; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e / 2] = fmaxf(mx[e / 2], sm[n][e]);
      float corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const float mn = fmaxf(mm[r], tc_quad_max(mx[r]) * sl2); /* max of the scaled scores */
        corr[r] = mm[r] == -INFINITY ? 0.0f : kern_cuda_exp2_approx(mm[r] - mn); /* nothing seen yet: o and l are 0 */
        mm[r] = mn;
      }
      /* a row past T has m = -inf and NaN here: only its own outputs, never
       * written; a row's first part holds key 0, so every other row's m is
       * finite from then on (a part whose keys all follow it adds 0) */
#pragma unroll
      for (int n = 0; n < NS; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          sm[n][e] = kern_cuda_exp2_approx(fmaf(sm[n][e], sl2, -mm[e / 2]));
          sum[e / 2] += sm[n][e];
        }
#pragma unroll
      for (int r = 0; r < 2; r++) lm[r] = lm[r] * corr[r] + sum[r]; /* this lane's columns; the quad's at the end */
      float(*om)[4] = o + mt * (HS / 8);
#pragma unroll
      for (int d = 0; d < HS / 8; d++)
        om[d][0] *= corr[0], om[d][1] *= corr[0], om[d][2] *= corr[1], om[d][3] *= corr[1];
    }
    tc_accumulate<HS, NS, MT>(o, s, vh, 0, hh);
  }
}

/* The forward's warps own 16 rows for each of their m-tiles, a block 128
 * rows either way: 2 m-tiles (4 warps) at head sizes to 64, as
 * FlashAttention-2's forward, each K and V fragment loaded from shared
 * memory feeding two products; 1 (8 warps) at 128 (registers). */
template <int HS> __host__ __device__ constexpr int tc_fwd_mt() { return HS <= 64 ? 2 : 1; }
template <int HS> __host__ __device__ constexpr int tc_fwd_warps() { return TC_FWD_WARPS / tc_fwd_mt<HS>(); }

/* The (batch, head, block of rows) of this block of a tc_grid launch,
 * the longest work first: the grid's blocks start roughly in launch order
 * (x fastest), and a causal block's work grows with its row block (the
 * forward's and the query pass's queries see more keys the later they lie;
 * the key pass's keys, more queries the earlier), so the blocks take every
 * head's heaviest row block first, then every head's next (longest
 * processing time first: the light blocks fill the last wave, where blocks
 * of the same head in order left a heavy one running alone). Which block
 * computes which rows changes; what each writes does not. */
__device__ __forceinline__ void tc_block_at(bool late_heavy, int *b, int *h, int *rb) {
  const int nrb = (int)gridDim.x, nbh = (int)(gridDim.y * gridDim.z);
  const int lin = (int)blockIdx.x + nrb * ((int)blockIdx.y + (int)gridDim.y * (int)blockIdx.z);
  const int bh = lin % nbh, r = lin / nbh;
  *rb = late_heavy ? nrb - 1 - r : r;
  *h = bh % (int)gridDim.y, *b = bh / (int)gridDim.y;
}

/* Forward: out (fp32, or bf16: O), and lse (B, NH, T) = m + log(l) of each
 * query row. */
template <int HS, typename O>
__global__ static void __launch_bounds__(32 * tc_fwd_warps<HS>(), HS <= 64 ? 3 : 1) /* 3: 168 registers */
    tc_fwd_kernel(O *out, float *lse, const uint16_t *qkv, int T, int C, float scale) {
  constexpr int MT = tc_fwd_mt<HS>(), R = 16 * MT; /* a warp's rows */
  constexpr int OWN = 16 * TC_FWD_WARPS, NTH = 32 * tc_fwd_warps<HS>();
  const float sl2 = scale * TC_LOG2E; /* the scores in base 2 */
  extern __shared__ __align__(128) unsigned char tc_smem[];
  constexpr int TILE = TC_ROWS * tc_rw<HS>(); /* words of a 64-row tile */
  uint32_t *Qs = (uint32_t *)tc_smem, *KV = Qs + OWN * tc_rw<HS>(); /* KV: two buffers of K, V */
  int b, h, rb;
  tc_block_at(true, &b, &h, &rb);
  const int NH = gridDim.y, q0 = rb * OWN;
  const int w0 = threadIdx.x / 32 * R, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int64_t C3 = 3 * (int64_t)C;
  const uint16_t *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  tc_stage<HS, OWN, NTH>(Qs, base, C3, q0, T);
  tc_stage<HS, TC_ROWS, NTH>(KV, base + C, C3, 0, T);
  tc_stage<HS, TC_ROWS, NTH>(KV + TILE, base + 2 * C, C3, 0, T);
  kern_cuda_cp_commit();
  kern_cuda_cp_wait<0>();
  __syncthreads();
  uint32_t qa[MT * (HS / 16)][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) tc_load_rows<HS>(qa + mt * (HS / 16), Qs + (w0 + 16 * mt) * tc_rw<HS>());
  float o[MT * (HS / 8)][4], m[2 * MT], l[2 * MT];
#pragma unroll
  for (int k = 0; k < 2 * MT; k++) m[k] = -INFINITY, l[k] = 0.0f;
#pragma unroll
  for (int d = 0; d < MT * (HS / 8); d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  const int kend = min(T, q0 + OWN); /* the block's last query sees keys < kend */
  for (int j0 = 0, it = 0; j0 < kend; j0 += TC_ROWS, it++) {
    const uint32_t *Ks = KV + (it & 1) * 2 * TILE, *Vs = Ks + TILE;
    if (j0 + TC_ROWS < kend) { /* the next tile's copies, into the other buffer, while this one's products run */
      uint32_t *Kn = KV + (~it & 1) * 2 * TILE;
      tc_stage<HS, TC_ROWS, NTH>(Kn, base + C, C3, j0 + TC_ROWS, T);
      tc_stage<HS, TC_ROWS, NTH>(Kn + TILE, base + 2 * C, C3, j0 + TC_ROWS, T);
    }
    kern_cuda_cp_commit();
    kern_cuda_cp_wait<1>(); /* this tile's copies (the group before) have landed */
    __syncthreads(); /* every thread's */
    if (j0 <= q0 + w0 + R - 1) /* warp-uniform: a key at or before the warp's rows */
      tc_fwd_tile<HS, MT>(o, m, l, qa, Ks, Vs, sl2, q0 + w0, j0, T);
    __syncthreads(); /* this tile is read: the next iteration's copies may take its buffer */
  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int i = q0 + w0 + 16 * mt + g + 8 * r, k = 2 * mt + r;
      l[k] = tc_quad_sum(l[k]);
      inv[r] = i < T ? 1.0f / l[k] : 0.0f;
      if (i < T && t == 0) lse[((int64_t)b * NH + h) * T + i] = (m[k] + log2f(l[k])) * TC_LN2;
    }
    float(*om)[4] = o + mt * (HS / 8);
#pragma unroll
    for (int d = 0; d < HS / 8; d++)
      om[d][0] *= inv[0], om[d][1] *= inv[0], om[d][2] *= inv[1], om[d][3] *= inv[1];
    tc_put_rows<HS, O>(out + (int64_t)b * T * C + (int64_t)h * HS, C, q0 + w0 + 16 * mt, T, om, 1.0f, 0);
  }
}

/* One key tile of the query pass for a warp's 16 MT query rows from i0
 * (their rows qr, dr of the block's Q and dout tiles, and L, D of this
 * lane's two rows of each m-tile: L[2 mt + r]): dq += dS k over the 64
 * keys from j0 (tiles Ks, Vs), with P recomputed from the scores and L.
 * Some key is at or before the warp's last row; an m-tile's keys after
 * its own rows are masked (P 0, dS 0). As the key pass (tc_dkv_tile), q
 * and dout come from shared memory at each tile and the keys go in two
 * halves of 32, dq seeing its slices in the same order. */
template <int HS, int MT>
__device__ __forceinline__ static void tc_dq_tile(float (*dq)[4], const uint32_t *qr,
                                                  const uint32_t *dr, const float *L,
                                                  const float *D, const uint32_t *Ks,
                                                  const uint32_t *Vs, float sl2, int i0, int j0, int T) {
  constexpr int PARTS = 2 * MT, NS = TC_NT / PARTS, HR = 8 * NS; /* strips and rows of a part */
  const int hi = min(TC_NT, (i0 + 16 * MT - 1 - j0) / 8 + 1);
#pragma unroll
  for (int hf = 0; hf < PARTS; hf++) {
    if (NS * hf >= hi) continue; /* warp-uniform: every key of the half after the rows */
    const int hh = min(NS, hi - NS * hf);
    const uint32_t *kh = Ks + HR * hf * tc_rw<HS>(), *vh = Vs + HR * hf * tc_rw<HS>();
    float s[MT * NS][4], dp[MT * NS][4];
    tc_scores_lda<HS, NS, MT>(s, qr, kh, 0, hh);
    tc_scores_lda<HS, NS, MT>(dp, dr, vh, 0, hh);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      const int r0 = i0 + 16 * mt;
      tc_mask<NS>(s + mt * NS, r0, j0 + HR * hf, T, j0 + TC_ROWS - 1 > r0 || r0 + 15 >= T);
#pragma unroll
      for (int n = 0; n < NS; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float *x = &s[mt * NS + n][e];
          *x = kern_cuda_exp2_approx(fmaf(*x, sl2, -L[2 * mt + e / 2])) *
               (dp[mt * NS + n][e] - D[2 * mt + e / 2]); /* dS */
        }
    }
    tc_accumulate<HS, NS, MT>(dq, s, kh, 0, hh);
  }
}

/* Backward, query pass: D = dout . out of each row into Dg (B, NH, T), from
 * the bf16 dout the products take (so that D is the row sum of P dP their
 * dP makes, as FlashAttention's) and out as forward wrote it (fp32, or bf16:
 * O), and dq += scale * dS k over the key tiles (dqkv fp32, or bf16: G,
 * stored only, each element the fp32 one rounded). */
template <int HS, typename O, typename G>
__global__ static void __launch_bounds__(TC_DQ_WARPS * 32, HS <= 64 ? 3 : 1) /* 3: 168 registers */
    tc_bwd_dq_kernel(G *dqkv, float *Dg, const uint16_t *dout16, const uint16_t *qkv,
                     const O *out, const float *lse, int T, int C, float scale, int acc) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  constexpr int MT = tc_dq_mt<HS>(), R = 16 * MT; /* a warp's rows */
  constexpr int OWN = tc_dq_rows<HS>(), NTH = 32 * TC_DQ_WARPS;
  constexpr int TILE = TC_ROWS * tc_rw<HS>(); /* words of a 64-row tile */
  uint32_t *Qs = (uint32_t *)tc_smem, *dOs = Qs + OWN * tc_rw<HS>(), *KV = dOs + OWN * tc_rw<HS>();
  float *Lq = (float *)(KV + 4 * TILE), *Dq = Lq + OWN; /* KV: two buffers of K, V */
  int b, h, rb;
  tc_block_at(true, &b, &h, &rb);
  const int NH = gridDim.y, q0 = rb * OWN;
  const int w0 = threadIdx.x / 32 * R, lane = threadIdx.x % 32, g = lane / 4;
  const int64_t C3 = 3 * (int64_t)C;
  const uint16_t *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  const uint16_t *dbase = dout16 + (int64_t)b * T * C + (int64_t)h * HS;
  tc_stage<HS, OWN, NTH>(Qs, base, C3, q0, T);
  tc_stage<HS, OWN, NTH>(dOs, dbase, C, q0, T);
  tc_stage<HS, TC_ROWS, NTH>(KV, base + C, C3, 0, T);
  tc_stage<HS, TC_ROWS, NTH>(KV + TILE, base + 2 * C, C3, 0, T);
  kern_cuda_cp_commit(); /* copied while D is computed */
  /* the warp's rows' D (a warp sum each, 16 rows' loads issued first) and lse */
#pragma unroll
  for (int r16 = 0; r16 < R; r16 += 16) {
    float d[16];
#pragma unroll
    for (int r = 0; r < 16; r++) {
      const int i = q0 + w0 + r16 + r;
      d[r] = 0.0f;
      if (i >= T) continue;
      const O *orow = out + ((int64_t)b * T + i) * C + (int64_t)h * HS;
      const uint16_t *drow = dbase + (int64_t)i * C;
#pragma unroll
      for (int c = lane; c < HS; c += 32) d[r] += kern_bf16_to_f32(drow[c]) * tc_f32(orow[c]);
    }
#pragma unroll
    for (int r = 0; r < 16; r++) {
      const int i = q0 + w0 + r16 + r;
      const int64_t row = ((int64_t)b * NH + h) * T + i;
      d[r] = kern_cuda_warp_sum(d[r]);
      if (lane == 0) Lq[w0 + r16 + r] = i < T ? lse[row] : 0.0f, Dq[w0 + r16 + r] = d[r];
      if (lane == 0 && i < T) Dg[row] = d[r];
    }
  }
  kern_cuda_cp_wait<0>();
  __syncthreads();
  float L[2 * MT], D[2 * MT]; /* this lane's rows g and g + 8 of each m-tile */
#pragma unroll
  for (int k = 0; k < 2 * MT; k++) {
    const int r = w0 + 16 * (k / 2) + g + 8 * (k % 2);
    L[k] = Lq[r] * TC_LOG2E, D[k] = Dq[r];
  }
  const float sl2 = scale * TC_LOG2E;
  float dq[MT * HS / 8][4];
#pragma unroll
  for (int d = 0; d < MT * HS / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
  const int kend = min(T, q0 + OWN);
  for (int j0 = 0, it = 0; j0 < kend; j0 += TC_ROWS, it++) {
    const uint32_t *Ks = KV + (it & 1) * 2 * TILE, *Vs = Ks + TILE;
    if (j0 + TC_ROWS < kend) { /* the next tile's copies (as the forward's) */
      uint32_t *Kn = KV + (~it & 1) * 2 * TILE;
      tc_stage<HS, TC_ROWS, NTH>(Kn, base + C, C3, j0 + TC_ROWS, T);
      tc_stage<HS, TC_ROWS, NTH>(Kn + TILE, base + 2 * C, C3, j0 + TC_ROWS, T);
    }
    kern_cuda_cp_commit();
    kern_cuda_cp_wait<1>();
    __syncthreads();
    if (j0 <= q0 + w0 + R - 1) /* warp-uniform: a key at or before the warp's rows */
      tc_dq_tile<HS, MT>(dq, Qs + w0 * tc_rw<HS>(), dOs + w0 * tc_rw<HS>(), L, D, Ks, Vs, sl2,
                         q0 + w0, j0, T);
    __syncthreads();
  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
    tc_put_rows<HS, G>(dqkv + (int64_t)b * T * C3 + (int64_t)h * HS, C3, q0 + w0 + 16 * mt, T,
                       dq + mt * (HS / 8), scale, acc);
}

/* One query tile of the key pass for a warp's 16 keys from j0 (their rows
 * kr, vr of the block's K and V tiles): dv += P^T dout and dk += dS^T q
 * over the 64 queries from i0 (tiles Qs, dOs; their lse in base 2 and D in
 * Lq, Dq), with P^T recomputed from the scores S^T = k q^T. Some query is
 * at or after the warp's first key. The 64 queries go in two halves of 32
 * (4 strips: a 16-row slice pair each), which halves the scores' registers;
 * dv and dk see their slices in the same order as whole. */
template <int HS>
__device__ __forceinline__ static void tc_dkv_tile(float dk[HS / 8][4], float dv[HS / 8][4],
                                                   const uint32_t *kr, const uint32_t *vr,
                                                   const uint32_t *Qs, const uint32_t *dOs, const float *Lq,
                                                   const float *Dq, float sl2, int j0, int i0, int T) {
  constexpr int NS = TC_NT / 2, HR = 8 * NS; /* strips and rows of a half */
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  /* strips with a query at or after the warp's first key */
  const int lo = max(0, (j0 - i0) / 8);
  /* the mask only where the tile holds a query before a key, or either past T */
  const int edge = i0 < j0 + 15 || i0 + TC_ROWS - 1 >= T || j0 + 15 >= T;
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    if (NS * hf + NS - 1 < lo) continue; /* warp-uniform: every query of the half before the keys */
    const int lh = max(0, lo - NS * hf);
    const uint32_t *qh = Qs + HR * hf * tc_rw<HS>(), *dh = dOs + HR * hf * tc_rw<HS>();
    float s[NS][4], dp[NS][4];
    tc_scores_lda<HS, NS>(s, kr, qh, lh, NS);
    tc_scores_lda<HS, NS>(dp, vr, dh, lh, NS);
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int j = j0 + g + 8 * (e / 2), c = HR * hf + 8 * n + 2 * t + e % 2, i = i0 + c;
        const float p = !edge || (j < T && i < T && i >= j) ? kern_cuda_exp2_approx(fmaf(s[n][e], sl2, -Lq[c])) : 0.0f;
        s[n][e] = p, dp[n][e] = p * (dp[n][e] - Dq[c]); /* P^T, dS^T */
      }
    tc_accumulate<HS, NS>(dv, s, dh, lh, NS);
    tc_accumulate<HS, NS>(dk, dp, qh, lh, NS);
  }
}

/* Backward, key pass: dv += P^T dout and dk += scale dS^T q over the query
 * tiles at or after the block's keys, with the query pass's D. Each warp
 * works on its 16 keys' rows of the transposed products (S^T = k q^T).
 * dqkv fp32, or bf16 (G) as the query pass's. */
template <int HS, typename G>
__global__ static void __launch_bounds__(TC_DKV_WARPS * 32, HS <= 64 ? 2 : 1) /* 2: 128 registers */
    tc_bwd_dkv_kernel(G *dqkv, const float *Dg, const uint16_t *dout, const uint16_t *qkv,
                      const float *lse, int T, int C, float scale, int acc) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  constexpr int OWN = 16 * TC_DKV_WARPS, NTH = 32 * TC_DKV_WARPS;
  constexpr int TILE = TC_ROWS * tc_rw<HS>(); /* words of a 64-row tile */
  /* QD: two buffers of Q, dout; LD: two of their rows' lse (base 2) and D */
  uint32_t *Ks = (uint32_t *)tc_smem, *Vs = Ks + OWN * tc_rw<HS>(), *QD = Vs + OWN * tc_rw<HS>();
  float *LD = (float *)(QD + 4 * TILE);
  int b, h, rb;
  tc_block_at(false, &b, &h, &rb);
  const int NH = gridDim.y, k0 = rb * OWN;
  const int w0 = threadIdx.x / 32 * 16;
  const int64_t C3 = 3 * (int64_t)C, rows = ((int64_t)b * NH + h) * T;
  const uint16_t *base = qkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  const uint16_t *dbase = dout + (int64_t)b * T * C + (int64_t)h * HS;
  tc_stage<HS, OWN, NTH>(Ks, base + C, C3, k0, T);
  tc_stage<HS, OWN, NTH>(Vs, base + 2 * C, C3, k0, T);
  tc_stage<HS, TC_ROWS, NTH>(QD, base, C3, k0, T); /* k0 is a tile edge: the first tile holds key k0's query */
  tc_stage<HS, TC_ROWS, NTH>(QD + TILE, dbase, C, k0, T);
  kern_cuda_cp_commit();
  if (threadIdx.x < TC_ROWS) {
    const int c = threadIdx.x, i = k0 + c;
    LD[c] = i < T ? lse[rows + i] * TC_LOG2E : 0.0f, LD[TC_ROWS + c] = i < T ? Dg[rows + i] : 0.0f;
  }
  kern_cuda_cp_wait<0>();
  __syncthreads();
  float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
  for (int d = 0; d < HS / 8; d++)
    dk[d][0] = dk[d][1] = dk[d][2] = dk[d][3] = dv[d][0] = dv[d][1] = dv[d][2] = dv[d][3] = 0.0f;
  const int live = k0 + w0 < T; /* warp-uniform: the strip has a key before T */
  const float sl2 = scale * TC_LOG2E;
  for (int i0 = k0, it = 0; i0 < T; i0 += TC_ROWS, it++) {
    const uint32_t *Qs = QD + (it & 1) * 2 * TILE, *dOs = Qs + TILE;
    const float *Lq = LD + (it & 1) * 2 * TC_ROWS, *Dq = Lq + TC_ROWS;
    const int next = i0 + TC_ROWS; /* its tile's copies (as the forward's), and its lse and D */
    float nl = 0.0f, nd = 0.0f;
    if (next < T) {
      uint32_t *Qn = QD + (~it & 1) * 2 * TILE;
      tc_stage<HS, TC_ROWS, NTH>(Qn, base, C3, next, T);
      tc_stage<HS, TC_ROWS, NTH>(Qn + TILE, dbase, C, next, T);
      const int i = next + (int)threadIdx.x;
      if (threadIdx.x < TC_ROWS && i < T) nl = lse[rows + i] * TC_LOG2E, nd = Dg[rows + i]; /* stored below */
    }
    kern_cuda_cp_commit();
    kern_cuda_cp_wait<1>();
    __syncthreads();
    if (live && i0 + TC_ROWS - 1 >= k0 + w0) /* warp-uniform: a key, and a query at or after one */
      tc_dkv_tile<HS>(dk, dv, Ks + w0 * tc_rw<HS>(), Vs + w0 * tc_rw<HS>(), Qs, dOs, Lq, Dq, sl2,
                      k0 + w0, i0, T);
    if (next < T && threadIdx.x < TC_ROWS) { /* the other buffer: read before the last barrier */
      float *Ln = LD + (~it & 1) * 2 * TC_ROWS;
      Ln[threadIdx.x] = nl, Ln[TC_ROWS + threadIdx.x] = nd;
    }
    __syncthreads();
  }
  G *kbase = dqkv + (int64_t)b * T * C3 + (int64_t)h * HS;
  tc_put_rows<HS, G>(kbase + C, C3, k0 + w0, T, dk, scale, acc);
  tc_put_rows<HS, G>(kbase + 2 * C, C3, k0 + w0, T, dv, 1.0f, acc);
}

/* The grid of a kernel whose blocks own `rows` rows: blocks along T (x),
 * heads (y), batch rows (z). */
static dim3 tc_grid(int B, int T, int NH, int rows) {
  KERN_CUDA_ASSERT(NH <= 65535 && B <= 65535); /* grid y and z */
  return dim3((unsigned)((T + rows - 1) / rows), (unsigned)NH, (unsigned)B);
}

/* The op's bf16 copies in its scratch (size.h): qkv's (B, T, 3C), then
 * dout's (B, T, C); where the caller keeps qkv in bf16, dout's alone. */
static uint16_t *tc_copies(float *scratch, int B, int T, int NH) {
  return (uint16_t *)(scratch + kern_cuda_size_attn_tc_copies_at(B, T, NH));
}

/* The head sizes whose kernels fit the shared memory of every GPU this
 * build runs on (compute capability 8.0 on: 99 KiB a block at least), so
 * that the bf16 qkv ops (kern_cuda_size_attn_tc_qkv16) always launch. */
template <int HS> constexpr bool tc_fits_any() {
  return tc_fwd_smem<HS>() <= 99 * 1024 && tc_dq_smem<HS>() <= 99 * 1024 &&
         tc_dkv_smem<HS>() <= 99 * 1024;
}
static_assert(tc_fits_any<16>() && tc_fits_any<32>() && tc_fits_any<64>(),
              "size.h's kern_cuda_size_attn_tc_qkv16 promises these head sizes launch anywhere");

/* qkv16: where qkv is rounded (the caller's, kept for backward), or NULL:
 * the scratch's copy. out: fp32, or bf16 (O). */
template <int HS, typename O>
static int tc_fwd(O *out, float *lse, float *scratch, const float *qkv, uint16_t *qkv16, int B,
                  int T, int C, int NH) {
  if (tc_fwd_smem<HS>() > kern_cuda_st.smem_optin) return 0;
  static int asked; /* with the largest carveout (the query pass's 3 blocks take 224 KiB) */
  kern_cuda_smem_allow(tc_fwd_kernel<HS, O>, tc_fwd_smem<HS>(), &asked);
  if (!qkv16) qkv16 = tc_copies(scratch, B, T, NH);
  if (qkv) kern_cuda_f32_to_bf16(qkv16, qkv, (size_t)B * T * 3 * C); /* each element rounded once */
  tc_fwd_kernel<HS, O><<<tc_grid(B, T, NH, 16 * TC_FWD_WARPS), 32 * tc_fwd_warps<HS>(),
                         tc_fwd_smem<HS>(), kern_cuda_st.stream>>>(
      out, lse, qkv16, T, C, 1.0f / sqrtf((float)HS));
  KERN_CUDA_LAUNCHED();
  return 1;
}

/* qkv16: qkv in bf16 as forward rounded it (the caller's), or NULL: qkv
 * is rounded into the scratch's copy; dout in bf16 (the caller's dout16),
 * or NULL: dout rounded into the scratch's copy; out as forward wrote it
 * (fp32, or bf16: O); dqkv fp32, or bf16 (G: written, acc 0). */
template <int HS, typename O, typename G>
static int tc_bwd(G *dqkv, float *scratch, const float *dout, const uint16_t *dout16_in,
                  const float *qkv, const uint16_t *qkv16, const O *out, const float *lse,
                  int B, int T, int C, int NH, int acc) {
  if (tc_dq_smem<HS>() > kern_cuda_st.smem_optin || tc_dkv_smem<HS>() > kern_cuda_st.smem_optin)
    return 0;
  static int asked_dq, asked_dkv;
  KERN_CUDA_ASSERT(sizeof(G) == 4 || !acc); /* tc_put_rows stores bf16 */
  kern_cuda_smem_allow(tc_bwd_dq_kernel<HS, O, G>, tc_dq_smem<HS>(), &asked_dq);
  kern_cuda_smem_allow(tc_bwd_dkv_kernel<HS, G>, tc_dkv_smem<HS>(), &asked_dkv);
  const float scale = 1.0f / sqrtf((float)HS);
  float *D = scratch; /* (B, NH, T) */
  uint16_t *copy = tc_copies(scratch, B, T, NH);
  uint16_t *dout16 = copy + (qkv16 ? 0 : (size_t)B * T * 3 * C); /* qkv16: no qkv copy */
  if (!qkv16) {
    kern_cuda_f32_to_bf16(copy, qkv, (size_t)B * T * 3 * C);
    qkv16 = copy;
  }
  if (dout16_in) dout16 = (uint16_t *)dout16_in;
  else kern_cuda_f32_to_bf16(dout16, dout, (size_t)B * T * C);
  tc_bwd_dq_kernel<HS, O, G><<<tc_grid(B, T, NH, tc_dq_rows<HS>()), TC_DQ_WARPS * 32,
                               tc_dq_smem<HS>(), kern_cuda_st.stream>>>(
      dqkv, D, dout16, qkv16, out, lse, T, C, scale, acc);
  KERN_CUDA_LAUNCHED();
  tc_bwd_dkv_kernel<HS, G><<<tc_grid(B, T, NH, 16 * TC_DKV_WARPS), TC_DKV_WARPS * 32,
                             tc_dkv_smem<HS>(), kern_cuda_st.stream>>>(
      dqkv, D, dout16, qkv16, lse, T, C, scale, acc);
  KERN_CUDA_LAUNCHED();
  return 1;
}

template <typename O>
static int tc_fwd_hs(O *out, float *lse, float *scratch, const float *qkv, uint16_t *qkv16, int B,
                     int T, int C, int NH) {
  switch (C / NH) {
  case 16: return tc_fwd<16, O>(out, lse, scratch, qkv, qkv16, B, T, C, NH);
  case 32: return tc_fwd<32, O>(out, lse, scratch, qkv, qkv16, B, T, C, NH);
  case 64: return tc_fwd<64, O>(out, lse, scratch, qkv, qkv16, B, T, C, NH);
  case 128: return tc_fwd<128, O>(out, lse, scratch, qkv, qkv16, B, T, C, NH);
  default: return 0;
  }
}

int kern_cuda_attention_tc_fwd(float *out, uint16_t *out16, float *lse, float *scratch,
                               const float *qkv, uint16_t *qkv16, int B, int T, int C, int NH) {
  KERN_CUDA_ASSERT(!out != !out16);
  return out16 ? tc_fwd_hs(out16, lse, scratch, qkv, qkv16, B, T, C, NH)
               : tc_fwd_hs(out, lse, scratch, qkv, qkv16, B, T, C, NH);
}

template <typename O, typename G>
static int tc_bwd_hs(G *dqkv, float *scratch, const float *dout, const uint16_t *dout16,
                     const float *qkv, const uint16_t *qkv16, const O *out, const float *lse,
                     int B, int T, int C, int NH, int acc) {
  switch (C / NH) {
#define TC_BWD_HS(hs)                                                                              \
  case hs:                                                                                         \
    return tc_bwd<hs, O, G>(dqkv, scratch, dout, dout16, qkv, qkv16, out, lse, B, T, C, NH, acc);
    TC_BWD_HS(16) TC_BWD_HS(32) TC_BWD_HS(64) TC_BWD_HS(128)
#undef TC_BWD_HS
  default: return 0;
  }
}

/* dqkv (fp32) or dqkv16 (bf16, acc 0, with out16): one of the two, the
 * other NULL */
int kern_cuda_attention_tc_bwd(float *dqkv, uint16_t *dqkv16, float *scratch, const float *dout,
                               const uint16_t *dout16, const float *qkv, const uint16_t *qkv16,
                               const float *out, const uint16_t *out16, const float *lse, int B,
                               int T, int C, int NH, int acc) {
  KERN_CUDA_ASSERT(!out != !out16 && !dqkv != !dqkv16 && (!dqkv16 || out16));
  if (dqkv16)
    return tc_bwd_hs(dqkv16, scratch, dout, dout16, qkv, qkv16, out16, lse, B, T, C, NH, acc);
  return out16 ? tc_bwd_hs(dqkv, scratch, dout, dout16, qkv, qkv16, out16, lse, B, T, C, NH, acc)
               : tc_bwd_hs(dqkv, scratch, dout, dout16, qkv, qkv16, out, lse, B, T, C, NH, acc);
}

/* gelu: GELU (tanh form, kern_gelu) element-wise, and its backward
 * (dinp += kern_gelu_grad(inp) * dout, or = without acc): kern_math.h's
 * formulas, compiled
 * without contraction, so the CPU kernels' bits.
 *
 * Close to memory-bound (one exponential an element against 8 or 16 bytes
 * moved), so, as residual.cu, a thread takes 4 elements in float4 accesses
 * where every array's 16-byte boundaries fall at the same element, after a
 * head of up to 3 and before a tail of (n - head) % 4 done one a thread in
 * the same launch; elsewhere every element goes one a thread. The same
 * formula on each element either way. Forward's bf16 output (gelu_fwd_bf16)
 * is the fp32 one rounded, 8 elements a thread as cast.cu's. Backward's
 * bf16 form (gelu_bwd_bf16) writes dinp as the next product packs it, with
 * its column sums for that product's dbias on the way.
 *
 * The bf16 activations' forms (gelu_fwd_bf16in, gelu_bwd_bf16in: GELU of the
 * fc product's bf16 output, whose result is rounded to bf16) compute the
 * fast form below unless the job asks for the CPU's bits
 * (kern_cuda_opts_t.gelu_exact): kern_gelu's ~50 instructions an element
 * (its exponential and IEEE division without fused multiply-adds) bound
 * those kernels by their lanes, not their bytes (docs/PERF.md). */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

/* 2 log2(e) k: e^(-2u) = 2^(-GELU_2K_LOG2E x (1 + c x^2)), u = k (x + c x^3) */
#define GELU_2K_LOG2E 2.302208198144325f

/* kern_gelu's x / (1 + e^(-2u)) with fused multiply-adds, the exponential
 * on ex2 (kern_cuda_exp2_approx) and the division a product by rcp.approx:
 * 8 instructions. Its arguments' roundings and the two approximations'
 * (about 2 ulp and 1) put it within a few 1e-7 of kern_gelu relative to
 * the result, ~2e-5 of the bf16 step it is rounded to next; near x = -10,
 * where the result nears 2^-126, flushed to 0. The same specials: x for
 * +inf and large x, -0 for large negative x, NaN for -inf and NaN. */
__device__ __forceinline__ static float gelu_fast(float x) {
  const float inner = fmaf(KERN_GELU_C * x, x, 1.0f);
  const float e = kern_cuda_exp2_approx(-GELU_2K_LOG2E * x * inner);
  return x * kern_cuda_rcp_approx(1.0f + e);
}

/* kern_gelu_grad's s + x s (e s) (2k + 6kc x^2), s = 1 / (1 + e), the same
 * way (and its clamps past |x| = 10) */
__device__ __forceinline__ static float gelu_grad_fast(float x) {
  const float x2 = x * x, inner = fmaf(KERN_GELU_C, x2, 1.0f);
  const float e = kern_cuda_exp2_approx(-GELU_2K_LOG2E * x * inner),
              s = kern_cuda_rcp_approx(1.0f + e);
  const float g = fmaf(x * s * (e * s),
                       fmaf(6.0f * KERN_GELU_K * KERN_GELU_C, x2, 2.0f * KERN_GELU_K), s);
  return kern_select(x > 10.0f, 1.0f, kern_select(x < -10.0f, 0.0f, g));
}

/* GELU and its derivative as a kernel of FAST takes them */
template <bool FAST>
__device__ __forceinline__ static float gelu_of(float x) {
  return FAST ? gelu_fast(x) : kern_gelu(x);
}
template <bool FAST>
__device__ __forceinline__ static float gelu_grad_of(float x) {
  return FAST ? gelu_grad_fast(x) : kern_gelu_grad(x);
}

__global__ static void gelu_fwd_kernel(float *out, const float *inp, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = kern_gelu(inp[i]);
}

/* out + head and inp + head 16-byte aligned, n >= head + 4 */
__global__ static void gelu_fwd_wide_kernel(float *out, const float *inp, size_t n, size_t head) {
  kern_cuda_for_wide<4>(
      n, head,
      [&](size_t j) {
        const float4 x = kern_cuda_load_f32x4(inp + j);
        kern_cuda_store_f32x4(
            out + j, make_float4(kern_gelu(x.x), kern_gelu(x.y), kern_gelu(x.z), kern_gelu(x.w)));
      },
      [&](size_t i) { out[i] = kern_gelu(inp[i]); });
}

/* GELU's output rounded to bf16 (gelu_fwd_bf16: as the casts round it) */
__global__ static void gelu_fwd_bf16_kernel(uint16_t *out, const float *inp, size_t n) {
  KERN_CUDA_FOR(i, n) out[i] = kern_f32_to_bf16(kern_gelu(inp[i]));
}

/* out + head and inp + head 16-byte aligned, n >= head + 8: 8 elements a
 * thread, as cast.cu's f32_to_bf16 */
__global__ static void gelu_fwd_bf16_wide_kernel(uint16_t *out, const float *inp, size_t n,
                                                 size_t head) {
  kern_cuda_for_wide<8>(
      n, head,
      [&](size_t j) {
        const float4 a = kern_cuda_load_f32x4(inp + j), b = kern_cuda_load_f32x4(inp + j + 4);
        kern_cuda_store_u16x8(
            out + j,
            kern_cuda_bf16x8(make_float4(kern_gelu(a.x), kern_gelu(a.y), kern_gelu(a.z), kern_gelu(a.w)),
                             make_float4(kern_gelu(b.x), kern_gelu(b.y), kern_gelu(b.z), kern_gelu(b.w))));
      },
      [&](size_t i) { out[i] = kern_f32_to_bf16(kern_gelu(inp[i])); });
}

__global__ static void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n,
                                       int acc) {
  KERN_CUDA_FOR(i, n) {
    const float g = kern_gelu_grad(inp[i]) * dout[i];
    dinp[i] = acc ? dinp[i] + g : g;
  }
}

/* dinp + head, inp + head and dout + head 16-byte aligned, n >= head + 4 */
__global__ static void gelu_bwd_wide_kernel(float *dinp, const float *inp, const float *dout,
                                            size_t n, size_t head, int acc) {
  kern_cuda_for_wide<4>(
      n, head,
      [&](size_t j) {
        const float4 x = kern_cuda_load_f32x4(inp + j), d = kern_cuda_load_f32x4(dout + j);
        float4 g = make_float4(kern_gelu_grad(x.x) * d.x, kern_gelu_grad(x.y) * d.y,
                               kern_gelu_grad(x.z) * d.z, kern_gelu_grad(x.w) * d.w);
        if (acc) { /* without it dinp is not read: one pass over it less */
          const float4 o = kern_cuda_load_f32x4(dinp + j);
          g = make_float4(o.x + g.x, o.y + g.y, o.z + g.z, o.w + g.w);
        }
        kern_cuda_store_f32x4(dinp + j, g);
      },
      [&](size_t i) {
        const float g = kern_gelu_grad(inp[i]) * dout[i];
        dinp[i] = acc ? dinp[i] + g : g;
      });
}

/* gelu_fwd_bf16in: GELU of a bf16 product's output with its bias added
 * in fp32 (bias NULL: none, the product added it), rounded to bf16; a
 * thread 8 elements of the N x C matrix (rows ld apart) taken whole
 * (16-byte loads and stores; C and ld multiples of 8, the rows 16-byte
 * aligned: kern.h), so every lane of every warp works whatever C is (by
 * rows, C = 3072's 384 groups left a quarter of 2 blocks of 256 idle). I:
 * the group index's type, 32 bits when the groups allow (a 64-bit division
 * by C / 8 is a subroutine); FAST: gelu_fast, else kern_gelu. GRAD: GELU's
 * derivative at inp times out's bf16 instead, in place (a product's
 * output gradient: kern_cuda_gelu_rows16). */
template <typename I, bool FAST, bool GRAD = false>
__global__ static void gelu_fwd_bf16in_kernel(uint16_t *__restrict__ out,
                                              const uint16_t *__restrict__ inp,
                                              const float *__restrict__ bias, I groups, I cgroups,
                                              int64_t ld) {
  for (I g = (I)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (I)gridDim.x * blockDim.x) {
    const I r = g / cgroups, c = 8 * (g - r * cgroups);
    const size_t at = (size_t)r * (size_t)ld + c;
    const uint4 h = kern_cuda_load_u16x8(inp + at);
    const float2 a = kern_cuda_f32x2(h.x), b = kern_cuda_f32x2(h.y), d = kern_cuda_f32x2(h.z),
                 e = kern_cuda_f32x2(h.w);
    float x[8] = {a.x, a.y, b.x, b.y, d.x, d.y, e.x, e.y};
    if (bias) /* not x + 0 where there is none: -0 stays -0 */
      for (int k = 0; k < 8; k++) x[k] += bias[c + k];
    float y[8];
    if constexpr (GRAD) {
      const uint4 o = kern_cuda_load_u16x8(out + at);
      const float2 p = kern_cuda_f32x2(o.x), q = kern_cuda_f32x2(o.y), r2 = kern_cuda_f32x2(o.z),
                   t = kern_cuda_f32x2(o.w);
      const float dy[8] = {p.x, p.y, q.x, q.y, r2.x, r2.y, t.x, t.y};
      for (int k = 0; k < 8; k++) y[k] = gelu_grad_of<FAST>(x[k]) * dy[k];
    } else {
      for (int k = 0; k < 8; k++) y[k] = gelu_of<FAST>(x[k]);
    }
    const float4 lo = make_float4(y[0], y[1], y[2], y[3]), hi = make_float4(y[4], y[5], y[6], y[7]);
    /* the fast form rounds by cvt (a NaN's payload is no result) */
    kern_cuda_store_u16x8(out + at, FAST ? kern_cuda_bf16x8_rn(lo, hi) : kern_cuda_bf16x8(lo, hi));
  }
}

/* gelu_bwd_bf16 and gelu_bwd_bf16in: dinp (rows x cols of inp and dout,
 * rows ld apart) made and packed to bf16 into dinp16 (rows ld apart), with
 * its runs' column sums (kern_cuda_pack_colsum): the bytes
 * matmul_bwd_bf16's packing of the fp32 dinp, and its dbias's first stage,
 * would give; the fp32 dinp is never written (nor read back). GELU's input
 * is inp's fp32 (IN16 false) or inp's bf16 plus the bias's column (IN16);
 * dout is fp32 (D16 false) or bf16 (D16); the derivative gelu_grad_fast
 * (FAST, with IN16) or kern_gelu_grad. */
template <bool IN16, bool D16, bool FAST>
__global__ static void __launch_bounds__(KERN_PACK_COLSUM_THREADS)
    gelu_bwd_bf16_kernel(uint16_t *dinp16, float *partial, const void *inp, const float *bias,
                         const void *dout, int64_t ld, int rows, int cols, bool wide, bool st8) {
  const float *x32 = (const float *)inp, *d32 = (const float *)dout;
  const uint16_t *x16 = (const uint16_t *)inp, *d16 = (const uint16_t *)dout;
  kern_cuda_pack_colsum(
      dinp16, ld, partial, rows, cols, wide, st8,
      [&](int64_t n, int j) {
        float4 x;
        if constexpr (IN16) {
          const uint2 h = kern_cuda_load_u16x4(x16 + n * ld + j);
          const float2 a = kern_cuda_f32x2(h.x), b = kern_cuda_f32x2(h.y);
          x = make_float4(a.x, a.y, b.x, b.y);
          if (bias) /* none: the product added it (-0 stays -0) */
            x = make_float4(x.x + bias[j], x.y + bias[j + 1], x.z + bias[j + 2], x.w + bias[j + 3]);
        } else {
          x = kern_cuda_load_f32x4(x32 + n * ld + j);
        }
        float4 d;
        if constexpr (D16) {
          const uint2 h = kern_cuda_load_u16x4(d16 + n * ld + j);
          const float2 a = kern_cuda_f32x2(h.x), b = kern_cuda_f32x2(h.y);
          d = make_float4(a.x, a.y, b.x, b.y);
        } else {
          d = kern_cuda_load_f32x4(d32 + n * ld + j);
        }
        return make_float4(gelu_grad_of<FAST>(x.x) * d.x, gelu_grad_of<FAST>(x.y) * d.y,
                           gelu_grad_of<FAST>(x.z) * d.z, gelu_grad_of<FAST>(x.w) * d.w);
      },
      [&](int64_t n, int j) {
        const float x = !IN16 ? x32[n * ld + j]
                        : bias ? kern_bf16_to_f32(x16[n * ld + j]) + bias[j]
                               : kern_bf16_to_f32(x16[n * ld + j]);
        return gelu_grad_of<FAST>(x) *
               (D16 ? kern_bf16_to_f32(d16[n * ld + j]) : d32[n * ld + j]);
      });
}

extern "C" void kern_cuda_gelu_fwd(float *out, const float *inp, size_t n) {
  if (!n) return;
  const size_t head = kern_cuda_head16(out, sizeof *out);
  if (n >= head + 4 && kern_cuda_aligned16(inp + head))
    gelu_fwd_wide_kernel<<<kern_cuda_blocks((n - head) / 4, KERN_CUDA_THREADS), KERN_CUDA_THREADS,
                           0, kern_cuda_st.stream>>>(out, inp, n, head);
  else
    gelu_fwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                      kern_cuda_st.stream>>>(out, inp, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_gelu_fwd_bf16(uint16_t *out, const float *inp, size_t n) {
  if (!n) return;
  const size_t head = kern_cuda_head16(out, sizeof *out);
  if (n >= head + 8 && kern_cuda_aligned16(inp + head))
    gelu_fwd_bf16_wide_kernel<<<kern_cuda_blocks((n - head) / 8, KERN_CUDA_THREADS),
                                KERN_CUDA_THREADS, 0, kern_cuda_st.stream>>>(out, inp, n, head);
  else
    gelu_fwd_bf16_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                           kern_cuda_st.stream>>>(out, inp, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n,
                                   int acc) {
  if (!n) return;
  const size_t head = kern_cuda_head16(dinp, sizeof *dinp);
  if (n >= head + 4 && kern_cuda_aligned16(inp + head) && kern_cuda_aligned16(dout + head))
    gelu_bwd_wide_kernel<<<kern_cuda_blocks((n - head) / 4, KERN_CUDA_THREADS), KERN_CUDA_THREADS,
                           0, kern_cuda_st.stream>>>(dinp, inp, dout, n, head, acc);
  else
    gelu_bwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                      kern_cuda_st.stream>>>(dinp, inp, dout, n, acc);
  KERN_CUDA_LAUNCHED();
}

/* The runs' sums go through the packing buffers as kern_cuda_colsum's do, a
 * slice of columns at a time, each slice's added to dbias in row order
 * (kern_cuda_colsum_add): colsum's bits. inp: fp32, or bf16 (in16) with
 * the bias (NULL: none, inp holds it); dout: fp32 (dout) or bf16 (dout16,
 * with a bf16 inp). */
static void gelu_bwd_bf16_any(uint16_t *dinp16, float *dbias, const void *inp, int in16,
                              const float *bias, const float *dout, const uint16_t *dout16, int N,
                              int C) {
  KERN_CUDA_ASSERT(kern_cuda_st.bf16 && !kern_cuda_st.fast16bf && !dout != !dout16 &&
                   (!dout16 || in16) && (in16 || !bias));
  if (N <= 0 || C <= 0) return;
  const int runs = (N + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
  const int cs = kern_cuda_colsum_slice(runs, 1, C);
  const size_t es = in16 ? sizeof(uint16_t) : sizeof(float); /* inp's element */
  const size_t ds = dout16 ? sizeof(uint16_t) : sizeof(float); /* dout's */
  float *partial = (float *)kern_cuda_st.pack;
  for (int c0 = 0; c0 < C; c0 += cs) {
    const int n = C - c0 < cs ? C - c0 : cs;
    const void *x = (const char *)inp + (size_t)c0 * es;
    const void *dy = dout16 ? (const void *)(dout16 + c0) : (const void *)(dout + c0);
    /* 4 columns at once: 8 bytes of bf16, 16 of fp32 */
    const bool wide = C % 4 == 0 && !((uintptr_t)x & (4 * es - 1)) &&
                      !((uintptr_t)dy & (4 * ds - 1));
    const bool st8 = C % 4 == 0 && !((uintptr_t)(dinp16 + c0) & 7);
    const dim3 grid = kern_cuda_pack_colsum_grid(N, n);
    const int t = KERN_PACK_COLSUM_THREADS;
    cudaStream_t st = kern_cuda_st.stream;
    const float *b = bias ? bias + c0 : NULL;
    if (!in16)
      gelu_bwd_bf16_kernel<false, false, false><<<grid, t, 0, st>>>(dinp16 + c0, partial, x, b, dy,
                                                                    C, N, n, wide, st8);
    else if (kern_cuda_st.gelu_exact && dout16)
      gelu_bwd_bf16_kernel<true, true, false><<<grid, t, 0, st>>>(dinp16 + c0, partial, x, b, dy, C,
                                                                  N, n, wide, st8);
    else if (kern_cuda_st.gelu_exact)
      gelu_bwd_bf16_kernel<true, false, false><<<grid, t, 0, st>>>(dinp16 + c0, partial, x, b, dy,
                                                                   C, N, n, wide, st8);
    else if (dout16)
      gelu_bwd_bf16_kernel<true, true, true><<<grid, t, 0, st>>>(dinp16 + c0, partial, x, b, dy, C,
                                                                 N, n, wide, st8);
    else
      gelu_bwd_bf16_kernel<true, false, true><<<grid, t, 0, st>>>(dinp16 + c0, partial, x, b, dy, C,
                                                                  N, n, wide, st8);
    KERN_CUDA_LAUNCHED();
    kern_cuda_colsum_add(dbias + c0, NULL, partial, runs, n);
  }
}

extern "C" void kern_cuda_gelu_bwd_bf16(uint16_t *dinp16, float *dbias, const float *inp,
                                        const float *dout, int N, int C) {
  gelu_bwd_bf16_any(dinp16, dbias, inp, 0, NULL, dout, NULL, N, C);
}

extern "C" void kern_cuda_gelu_bwd_bf16in(uint16_t *dinp16, float *dbias, const uint16_t *inp,
                                          const float *bias, const float *dout,
                                          const uint16_t *dout16, int N, int C) {
  gelu_bwd_bf16_any(dinp16, dbias, inp, 1, bias, dout, dout16, N, C);
}

/* gelu_fwd_bf16in over rows ld apart (ld, C multiples of 8; bias NULL: inp
 * holds it), or (grad) GELU's derivative times out in place: the
 * products' GELU passes where cuBLASLt has no GELU epilogue (matmul.cu), a
 * block of their output at a time */
void kern_cuda_gelu_rows16(uint16_t *out, const uint16_t *inp, const float *bias, int N, int C,
                           int64_t ld, int grad) {
  KERN_CUDA_ASSERT(C % 8 == 0 && ld % 8 == 0 && ld >= C && kern_cuda_aligned16(inp) &&
                   kern_cuda_aligned16(out));
  if (N <= 0 || C <= 0) return;
  const size_t groups = (size_t)N * (size_t)(C / 8);
  const unsigned blocks = kern_cuda_blocks(groups, KERN_CUDA_THREADS);
  const bool i32 = groups <= UINT32_MAX - (size_t)blocks * KERN_CUDA_THREADS; /* g + the stride */
  cudaStream_t st = kern_cuda_st.stream;
  const uint32_t g32 = (uint32_t)groups, c32 = (uint32_t)(C / 8);
  const uint64_t g64 = groups, c64 = (uint64_t)(C / 8);
  if (grad && !kern_cuda_st.gelu_exact) /* a fallback's: 64-bit groups, whatever the size */
    gelu_fwd_bf16in_kernel<uint64_t, true, true><<<blocks, KERN_CUDA_THREADS, 0, st>>>(
        out, inp, bias, g64, c64, ld);
  else if (grad)
    gelu_fwd_bf16in_kernel<uint64_t, false, true><<<blocks, KERN_CUDA_THREADS, 0, st>>>(
        out, inp, bias, g64, c64, ld);
  else if (i32 && !kern_cuda_st.gelu_exact)
    gelu_fwd_bf16in_kernel<uint32_t, true><<<blocks, KERN_CUDA_THREADS, 0, st>>>(out, inp, bias,
                                                                                 g32, c32, ld);
  else if (i32)
    gelu_fwd_bf16in_kernel<uint32_t, false><<<blocks, KERN_CUDA_THREADS, 0, st>>>(out, inp, bias,
                                                                                  g32, c32, ld);
  else if (!kern_cuda_st.gelu_exact)
    gelu_fwd_bf16in_kernel<uint64_t, true><<<blocks, KERN_CUDA_THREADS, 0, st>>>(out, inp, bias,
                                                                                 g64, c64, ld);
  else
    gelu_fwd_bf16in_kernel<uint64_t, false><<<blocks, KERN_CUDA_THREADS, 0, st>>>(out, inp, bias,
                                                                                  g64, c64, ld);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_gelu_fwd_bf16in(uint16_t *out, const uint16_t *inp, const float *bias,
                                          int N, int C) {
  kern_cuda_gelu_rows16(out, inp, bias, N, C, C, 0);
}

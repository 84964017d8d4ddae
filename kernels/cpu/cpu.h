/* cpu: private header of the CPU backend (OpenMP loops + oneDNN sgemm).
 *
 * Declares the kern_cpu_* functions that table.c gathers into a
 * kern_backend_t table per ISA level (one op per .c file; semantics in
 * kernels/kern.h), and the few helpers they share. Nothing outside
 * kernels/cpu includes this. */
#ifndef FSDP_KERN_CPU_H
#define FSDP_KERN_CPU_H

#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kern.h"
#include "kernels/kern_math.h"

/* ---- one build per ISA level ---------------------------------------------
 * Every file here but backend.c is compiled three times (Makefile): for
 * baseline x86-64 (-march=x86-64, SSE2), x86-64-v3 (AVX2, FMA) and x86-64-v4
 * (AVX-512), with KERN_CPU_ISA set to generic, avx2 or avx512. The macros
 * below give each build its own symbols (kern_cpu_gelu_fwd becomes
 * kern_cpu_gelu_fwd_avx2, ...), so the three link side by side, each level
 * fills its own table (table.c) and backend.c picks one at run time. The code
 * is the same and so are its results, bit for bit: gcc in ISO C mode fuses no
 * multiply-adds (-ffp-contract=off, also set in the Makefile for clang), the
 * exponentials are kern_math.h's own, and every sum is in a fixed order
 * (KERN_CPU_SUM). backend.c, compiled once, sees the plain names of the
 * helpers it defines and the three tables. */
#define KERN_CPU_CAT_(a, b) a##_##b
#define KERN_CPU_CAT(a, b) KERN_CPU_CAT_(a, b)
#ifdef KERN_CPU_ISA
#define KERN_CPU_FN(f) KERN_CPU_CAT(f, KERN_CPU_ISA)
#define kern_cpu_table KERN_CPU_FN(kern_cpu_table)
#define kern_cpu_sgemm KERN_CPU_FN(kern_cpu_sgemm)
#define kern_cpu_sgemm_hold KERN_CPU_FN(kern_cpu_sgemm_hold)
#define kern_cpu_sgemm_release KERN_CPU_FN(kern_cpu_sgemm_release)
#define kern_cpu_encoder_fwd KERN_CPU_FN(kern_cpu_encoder_fwd)
#define kern_cpu_encoder_bwd KERN_CPU_FN(kern_cpu_encoder_bwd)
#define kern_cpu_layernorm_fwd KERN_CPU_FN(kern_cpu_layernorm_fwd)
#define kern_cpu_layernorm_bwd KERN_CPU_FN(kern_cpu_layernorm_bwd)
#define kern_cpu_matmul_fwd KERN_CPU_FN(kern_cpu_matmul_fwd)
#define kern_cpu_matmul_bwd KERN_CPU_FN(kern_cpu_matmul_bwd)
#define kern_cpu_attention_fwd KERN_CPU_FN(kern_cpu_attention_fwd)
#define kern_cpu_attention_bwd KERN_CPU_FN(kern_cpu_attention_bwd)
#define kern_cpu_attention_saved KERN_CPU_FN(kern_cpu_attention_saved)
#define kern_cpu_attention_scratch KERN_CPU_FN(kern_cpu_attention_scratch)
#define kern_cpu_gelu_fwd KERN_CPU_FN(kern_cpu_gelu_fwd)
#define kern_cpu_gelu_bwd KERN_CPU_FN(kern_cpu_gelu_bwd)
#define kern_cpu_residual_fwd KERN_CPU_FN(kern_cpu_residual_fwd)
#define kern_cpu_residual_bwd KERN_CPU_FN(kern_cpu_residual_bwd)
#define kern_cpu_crossentropy_fwd KERN_CPU_FN(kern_cpu_crossentropy_fwd)
#define kern_cpu_crossentropy_bwd KERN_CPU_FN(kern_cpu_crossentropy_bwd)
#define kern_cpu_crossentropy_fwd_bwd KERN_CPU_FN(kern_cpu_crossentropy_fwd_bwd)
#define kern_cpu_adamw KERN_CPU_FN(kern_cpu_adamw)
#define kern_cpu_adamw_segs KERN_CPU_FN(kern_cpu_adamw_segs)
#define kern_cpu_adamw_segs_scaled KERN_CPU_FN(kern_cpu_adamw_segs_scaled)
#define kern_cpu_f32_to_bf16 KERN_CPU_FN(kern_cpu_f32_to_bf16)
#define kern_cpu_bf16_to_f32 KERN_CPU_FN(kern_cpu_bf16_to_f32)
#define kern_cpu_bf16_to_f32_segs KERN_CPU_FN(kern_cpu_bf16_to_f32_segs)
#define kern_cpu_sumsq KERN_CPU_FN(kern_cpu_sumsq)
#define kern_cpu_dev_set KERN_CPU_FN(kern_cpu_dev_set)
#define kern_cpu_copy KERN_CPU_FN(kern_cpu_copy)
#define kern_cpu_sync KERN_CPU_FN(kern_cpu_sync)
#define kern_cpu_vec_add KERN_CPU_FN(kern_cpu_vec_add)
#define kern_cpu_vec_scale KERN_CPU_FN(kern_cpu_vec_scale)
#define kern_cpu_vec_sum KERN_CPU_FN(kern_cpu_vec_sum)
#define kern_cpu_reduce_f32 KERN_CPU_FN(kern_cpu_reduce_f32)
#define kern_cpu_reduce_bf16 KERN_CPU_FN(kern_cpu_reduce_bf16)
#define kern_cpu_copy_stream KERN_CPU_FN(kern_cpu_copy_stream)
#endif

/* Each level's table (table.c). */
extern const kern_backend_t kern_cpu_table_generic, kern_cpu_table_avx2, kern_cpu_table_avx512;

/* The table's entries every level shares (backend.c). */
int kern_cpu_supports_op(kern_op_t op);
#define KERN_CPU_THREADS_MAX 4096 /* more are cut to it (config.c's threads, param.h's FSDP_THREADS) */
void kern_cpu_set_threads(int n);
int kern_cpu_get_threads(void);

/* ---- sums in a fixed order ------------------------------------------------
 * s = the sum of TERM for IDX in [0, n), of type T: KERN_CPU_LANES partial
 * sums, partial l taking the terms IDX = l, l + 16, l + 32, ... in turn, then
 * added pairwise in a fixed tree (lane l + w into lane l, w = 8, 4, 2, 1).
 * `#pragma omp simd reduction(+:s)` leaves the split to the compiler, which
 * makes as many partial sums as a vector has lanes (4, 8 or 16 floats), so the
 * bits of every softmax and norm depended on the ISA level. Written as whole
 * blocks of 16 terms, this vectorises at any width (four SSE registers, two
 * AVX, one AVX-512) with the same result; a partial block at the end fills
 * the first lanes. TERM is an expression of IDX, evaluated once per index. */
#define KERN_CPU_LANES 16
#define KERN_CPU_SUM(T, s, n, IDX, TERM)                                           \
  do {                                                                             \
    T kcs_acc[KERN_CPU_LANES] = {0};                                               \
    int64_t kcs_n = (int64_t)(n), kcs_b = 0;                                       \
    for (; kcs_b + KERN_CPU_LANES <= kcs_n; kcs_b += KERN_CPU_LANES)               \
      for (int64_t kcs_l = 0; kcs_l < KERN_CPU_LANES; kcs_l++) {                   \
        const int64_t IDX = kcs_b + kcs_l;                                         \
        kcs_acc[kcs_l] += (TERM);                                                  \
      }                                                                            \
    for (int64_t kcs_l = 0; kcs_b + kcs_l < kcs_n; kcs_l++) {                      \
      const int64_t IDX = kcs_b + kcs_l;                                           \
      kcs_acc[kcs_l] += (TERM);                                                    \
    }                                                                              \
    for (int kcs_w = KERN_CPU_LANES / 2; kcs_w > 0; kcs_w /= 2)                    \
      for (int kcs_l = 0; kcs_l < kcs_w; kcs_l++) kcs_acc[kcs_l] += kcs_acc[kcs_l + kcs_w]; \
    (s) = kcs_acc[0];                                                              \
  } while (0)

/* A broken invariant (a programmer error) stops with file and line; kernels
 * are a leaf and have no logger of their own. */
#define KERN_CPU_ASSERT(cond)                                                          \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "fsdp: kernel assertion failed: %s (%s:%d)\n", #cond, __FILE__, \
              __LINE__);                                                              \
      abort();                                                                        \
    }                                                                                 \
  } while (0)

/* Query rows per attention work item, as kern_cpu_init set them. */
extern int kern_cpu_attn_rows;

/* Every call of dnnl_sgemm goes through here: row-major, C = alpha op(A) op(B) + beta C.
 * A failure is a programmer error (bad leading dimension), so it aborts.
 * Asynchronous signals are held off the calling thread for the call (matmul.c
 * says why); a thread that makes many small products holds them once around
 * all of them with kern_cpu_sgemm_hold / _release (nested: the outermost
 * pair acts), which costs two system calls instead of two per product. */
void kern_cpu_sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc);
void kern_cpu_sgemm_hold(sigset_t *was);
void kern_cpu_sgemm_release(const sigset_t *was);

/* Channels [*c0, *c1) this thread owns when a team splits C channels in blocks
 * of KERN_CPU_CBLOCK: lets reductions over rows (dw, db, dwte) run without races
 * and without scratch, in the same order whatever the thread count. Call inside
 * a parallel region. */
#define KERN_CPU_CBLOCK 16
void kern_cpu_channel_range(int C, int *c0, int *c1);

/* Columns [c0, c1) of the sums over the N rows of dout (N, C; rows ld apart,
 * inp's too), in
 * kern_math.h's order (KERN_COLSUM_ROWS): sd[c] += sum of dout[n][c], and,
 * where sdx is not NULL, sdx[c] += sum of dout[n][c] (inp[n][c] - mean[n])
 * rstd[n] (layernorm's dw). */
static inline void kern_cpu_colsum(float *sd, float *sdx, const float *dout, const float *inp,
                                   const float *mean, const float *rstd, int N, int64_t ld,
                                   int c0, int c1) {
  enum { W = 256 }; /* columns a pass keeps in its partial sums */
  float pd[W], px[W];
  for (int b0 = c0; b0 < c1; b0 += W) {
    const int bn = c1 - b0 < W ? c1 - b0 : W;
    for (int n0 = 0; n0 < N; n0 += KERN_COLSUM_ROWS) {
      const int n1 = N - n0 < KERN_COLSUM_ROWS ? N : n0 + KERN_COLSUM_ROWS;
      for (int i = 0; i < bn; i++) pd[i] = 0.0f, px[i] = 0.0f;
      for (int n = n0; n < n1; n++) {
        const float *d = dout + n * ld + b0;
        for (int i = 0; i < bn; i++) pd[i] += d[i];
        if (sdx) {
          const float *x = inp + n * ld + b0;
          const float m = mean[n], r = rstd[n];
          for (int i = 0; i < bn; i++) px[i] += d[i] * (x[i] - m) * r;
        }
      }
      for (int i = 0; i < bn; i++) sd[b0 + i] += pd[i];
      if (sdx)
        for (int i = 0; i < bn; i++) sdx[b0 + i] += px[i];
    }
  }
}

void kern_cpu_encoder_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe, int B,
                          int T, int C);
void kern_cpu_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B,
                          int T, int C);

void kern_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                            const float *b, int N, int C);
void kern_cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C);

void kern_cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N,
                         int IC, int OC, int ldo);
void kern_cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int N, int IC, int OC, int ldo, int acc);

void kern_cpu_attention_fwd(float *out, float *att, float *scratch, const float *qkv, int B,
                            int T, int C, int NH);
void kern_cpu_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                            const float *out, const float *att, int B, int T, int C, int NH, int acc);
size_t kern_cpu_attention_saved(int B, int T, int C, int NH);
size_t kern_cpu_attention_scratch(int B, int T, int C, int NH);

void kern_cpu_gelu_fwd(float *out, const float *inp, size_t n);
void kern_cpu_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n, int acc);

void kern_cpu_residual_fwd(float *out, const float *a, const float *b, size_t n);
void kern_cpu_residual_bwd(float *da, float *db, const float *dout, size_t n);

void kern_cpu_crossentropy_fwd(float *losses, float *logits, const int32_t *targets, int N, int V,
                               int ld);
void kern_cpu_crossentropy_bwd(float *probs, const int32_t *targets, float dloss, int N, int V,
                               int ld);
void kern_cpu_crossentropy_fwd_bwd(float *losses, float *logits, const int32_t *targets,
                                   float dloss, int N, int V, int ld);

void kern_cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, int t);
void kern_cpu_adamw_segs(float *p, uint16_t *p16, const float *g, float *m, float *v,
                         const kern_seg_t *seg, int nseg, float lr, float beta1, float beta2,
                         float eps, float wd, int t);
void kern_cpu_adamw_segs_scaled(float *p, uint16_t *p16, const float *g, float gscale, float *m,
                                float *v, const kern_seg_t *seg, int nseg, float lr, float beta1,
                                float beta2, float eps, float wd, int t);

void kern_cpu_f32_to_bf16(uint16_t *out, const float *inp, size_t n);
void kern_cpu_bf16_to_f32(float *out, const uint16_t *inp, size_t n);
void kern_cpu_bf16_to_f32_segs(float *out, const uint16_t *inp, const kern_seg_t *seg, int nseg);

double kern_cpu_sumsq(const float *x, size_t n);

/* memory.c: the table's memory section on host memory. */
void kern_cpu_dev_set(void *dst, int v, size_t bytes);
void kern_cpu_copy(void *dst, const void *src, size_t bytes);
void kern_cpu_sync(void);
void kern_cpu_vec_add(float *y, const float *x, size_t n);
void kern_cpu_vec_scale(float *y, float s, size_t n);
double kern_cpu_vec_sum(const float *x, size_t n);

/* reduce.c: the collectives' element-wise work. */
void kern_cpu_reduce_f32(float *dst, const void *a, const float *b, size_t n, float div,
                         int stream);
void kern_cpu_reduce_bf16(uint16_t *dst, const void *a, const uint16_t *b, size_t n, float div,
                          int stream);
void kern_cpu_copy_stream(void *dst, const void *src, size_t n);

#endif

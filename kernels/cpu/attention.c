/* attention: causal multi-head self-attention, forward (keeping each query
 * row's log-sum-exp of its scaled scores, B*NH*T floats, not the B*NH*T*T
 * probabilities) and backward (which computes a block's probabilities again
 * from its scores and those log-sum-exps, one product more: 2.4 GB less for
 * gpt2-124m at 4 x 1024, 201 MB a layer).
 *
 * Work is split over (batch, head) pairs with OpenMP; inside a pair, oneDNN's
 * sgemm does the products on strided views of qkv (leading dimension 3C) and
 * runs single-threaded, since it is called inside a parallel region. Each pair
 * walks its queries in blocks of kern_cpu_opts_t.attn_block rows: a block of rows [r0, r1)
 * only sees keys [0, r1), so the products skip most of the masked upper
 * triangle (about half the flops for long sequences). On one core, B=4 T=256
 * C=768 NH=12 forward+backward took 21 ms in blocks of 64 rows against 29 ms in
 * one block; at T=1024, 66 ms against 117 ms (blocks of 32 to 128 are alike). */
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/size.h"
#include "kernels/kern_math.h"

/* Query rows per block, in [1, T] (kern_cpu_init sets the rows). */
static int attn_block(int T) { return kern_cpu_size_block(kern_cpu_attn_rows, T); }

/* size.h's formula, which the memory plan uses too. */
size_t kern_cpu_attention_scratch(int B, int T, int C, int NH) {
  (void)C;
  return kern_cpu_size_attention_scratch(B, T, NH, kern_cpu_attn_rows);
}

size_t kern_cpu_attention_saved(int B, int T, int C, int NH) {
  (void)C;
  return kern_cpu_size_attention_saved(B, T, NH);
}

/* Softmax of row i of a block of scores (keys 0..i), in place, and exact zeros
 * for the masked keys i+1..T-1; the row's log-sum-exp of its scores. */
static float softmax_causal_row(float *p, int i, int T) {
  /* a compare rather than fmaxf: gcc calls libm's fmaxf in the loop tail */
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j <= i; j++) mx = p[j] > mx ? p[j] : mx;
  float s; /* e^(p - max), stored, and their sum, in one pass */
  KERN_CPU_SUM(float, s, i + 1, j, p[j] = kern_expf(p[j] - mx));
  float inv = 1.0f / s;
  for (int j = 0; j <= i; j++) p[j] *= inv;
  for (int j = i + 1; j < T; j++) p[j] = 0.0f;
  return mx + logf(s);
}

void kern_cpu_attention_fwd(float *out, float *lse, float *scratch, const float *qkv, int B,
                            int T, int C, int NH) {
  const int hs = C / NH, R = attn_block(T);
  const int64_t C3 = 3 * (int64_t)C;
  const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
  {
    sigset_t was; /* one hold of signals for the thread's many products */
    kern_cpu_sgemm_hold(&was);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const float *q = qkv + (int64_t)b * T * C3 + (int64_t)h * hs;
      const float *k = q + C, *v = q + 2 * C;
      float *ab = scratch + (int64_t)bh * 2 * R * T; /* the pair's slice: one block */
      float *l = lse + (int64_t)bh * T;
      float *o = out + (int64_t)b * T * C + (int64_t)h * hs;
      for (int r0 = 0; r0 < T; r0 += R) {
        const int r1 = r0 + R < T ? r0 + R : T, m = r1 - r0;
        /* scores of the block: (m, r1) = scale * q[r0:r1] @ k[0:r1]^T */
        kern_cpu_sgemm('N', 'T', m, r1, hs, scale, q + r0 * C3, C3, k, C3, 0.0f, ab, T);
        for (int i = 0; i < m; i++) l[r0 + i] = softmax_causal_row(ab + (int64_t)i * T, r0 + i, r1);
        /* out[r0:r1] = att[r0:r1, 0:r1] @ v[0:r1] */
        kern_cpu_sgemm('N', 'N', m, hs, r1, 1.0f, ab, T, v, C3, 0.0f, o + (int64_t)r0 * C, C);
      }
    }
    kern_cpu_sgemm_release(&was);
  }
}

void kern_cpu_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                            const float *out, const float *lse, int B, int T, int C, int NH,
                            int acc) {
  (void)out; /* the probabilities come again from the scores and their log-sum-exp */
  const int hs = C / NH, R = attn_block(T);
  const int64_t C3 = 3 * (int64_t)C;
  const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
  {
    sigset_t was;
    kern_cpu_sgemm_hold(&was);
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const int64_t off = (int64_t)b * T * C3 + (int64_t)h * hs;
      const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
      const float *l = lse + (int64_t)bh * T;
      const float *d = dout + (int64_t)b * T * C + (int64_t)h * hs;
      /* the pair's slice: a block's probabilities, then their gradient, (m, r1) each,
       * leading dim T */
      float *ab = scratch + (int64_t)bh * 2 * R * T, *dp = ab + (int64_t)R * T;
      if (!acc) /* the pair's columns of dqkv, which its blocks then accumulate into */
        for (int t = 0; t < T; t++)
          for (int x = 0; x < 3; x++) memset(dq + (int64_t)t * C3 + (int64_t)x * C, 0, hs * sizeof(float));
      for (int r0 = 0; r0 < T; r0 += R) {
        const int r1 = r0 + R < T ? r0 + R : T, m = r1 - r0;
        const float *db = d + (int64_t)r0 * C;
        /* the block's probabilities again: e^(scale * q k^T - lse), 0 past the diagonal */
        kern_cpu_sgemm('N', 'T', m, r1, hs, scale, q + r0 * C3, C3, k, C3, 0.0f, ab, T);
        for (int i = 0; i < m; i++) {
          float *ar = ab + (int64_t)i * T;
          const int n = r0 + i + 1;
          const float li = l[r0 + i];
#pragma omp simd
          for (int j = 0; j < n; j++) ar[j] = kern_expf(ar[j] - li);
          for (int j = n; j < r1; j++) ar[j] = 0.0f;
        }
        /* datt = dout[r0:r1] @ v[0:r1]^T */
        kern_cpu_sgemm('N', 'T', m, r1, hs, 1.0f, db, C, v, C3, 0.0f, dp, T);
        /* dv[0:r1] += att[r0:r1, 0:r1]^T @ dout[r0:r1] */
        kern_cpu_sgemm('T', 'N', r1, hs, m, 1.0f, ab, T, db, C, 1.0f, dv, C3);
        /* softmax backward, in place: dpre = att * (datt - sum(att * datt)) */
        for (int i = 0; i < m; i++) {
          const int n = r0 + i + 1; /* keys 0..r0+i are visible */
          const float *ar = ab + (int64_t)i * T;
          float *pr = dp + (int64_t)i * T;
          float s;
          KERN_CPU_SUM(float, s, n, j, ar[j] * pr[j]);
          for (int j = 0; j < n; j++) pr[j] = ar[j] * (pr[j] - s);
          for (int j = n; j < r1; j++) pr[j] = 0.0f;
        }
        /* dq[r0:r1] += scale * dpre @ k[0:r1]; dk[0:r1] += scale * dpre^T @ q[r0:r1] */
        kern_cpu_sgemm('N', 'N', m, hs, r1, scale, dp, T, k, C3, 1.0f, dq + r0 * C3, C3);
        kern_cpu_sgemm('T', 'N', r1, hs, m, scale, dp, T, q + r0 * C3, C3, 1.0f, dk, C3);
      }
    }
    kern_cpu_sgemm_release(&was);
  }
}

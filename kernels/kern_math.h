/* kern_math: the element-wise math of the op set, in one place.
 *
 * Every backend computes these formulas through these functions: the CPU
 * kernels call them in their loops, and the CUDA kernels (built with nvcc,
 * where KERN_HD expands to __host__ __device__) call the same ones, so what the
 * CPU tests prove about the arithmetic holds for both. Only scalar math lives
 * here; loops, reductions and memory layout belong to each backend. */
#ifndef FSDP_KERN_MATH_H
#define FSDP_KERN_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KERN_HD __host__ __device__ __forceinline__
#else
#define KERN_HD static inline
#endif

/* sqrt(2/pi), the constant of the tanh approximation of GELU (GPT-2's form). */
#define KERN_GELU_K 0.7978845608028654f
#define KERN_GELU_C 0.044715f
#define KERN_LN_EPS 1e-5f

/* Column sums over rows (matmul's dbias, layernorm's dw and db) go in one
 * order on every backend: each run of KERN_COLSUM_ROWS rows is summed on its
 * own from zero, row by row, and the runs' sums are added to the column in
 * row order. A GPU sums many runs at once and still gets the CPU's bits
 * (kern_cpu_colsum, kern_cuda_colsum). */
#define KERN_COLSUM_ROWS 32

/* Bit casts (memcpy: defined behaviour in C, and free once compiled). */
KERN_HD float kern_asfloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

KERN_HD uint32_t kern_asuint(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* c ? a : b without a branch: a bitwise blend of both values. A plain ?:
 * between two computed values lets gcc move each computation into its own
 * branch (and, honouring floating-point traps, not run it speculatively), and
 * a loop with branches does not vectorise below AVX-512's masks. */
KERN_HD float kern_select(int c, float a, float b) {
  uint32_t m = 0u - (uint32_t)(c != 0);
  return kern_asfloat((kern_asuint(a) & m) | (kern_asuint(b) & ~m));
}

/* e^x, the project's own rather than the math library's: plain arithmetic
 * with no tables and no branches, so gcc vectorises a loop that calls it at
 * any vector width, and every width (and the scalar tail, and a GPU built
 * without contraction) gives the same bits. libm's expf and libmvec's vector
 * variants do not agree with each other bit for bit, which made the CPU
 * kernels' results depend on the instruction set they were built for.
 *
 * x clamped to [-104, 89] (e^x is 0 or inf in fp32 past the ends), x = n ln2
 * + r with |r| <= ln2/2 (ln2 split in two so n * hi is exact), Cephes'
 * degree-7 polynomial for e^r (S. Moshier) evaluated without fused
 * multiply-adds, then the scale 2^n applied in two halves, each a normal
 * number, so results in the denormals round once. NaN in, NaN out. Over all
 * 2^32 inputs: within 0.99 ulp of e^x, 99.6% correctly rounded. */
KERN_HD float kern_expf(float x) {
  float xc = kern_select(x > -104.0f, x, -104.0f); /* a NaN becomes -104, put back at the end */
  xc = kern_select(xc < 89.0f, xc, 89.0f);
  const float shift = 0x1.8p23f; /* adding it rounds to an integer */
  float n = (xc * 1.44269504088896341f + shift) - shift;
  float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = ((((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * (r * r) + r) +
            1.0f;
  /* |n| <= 150: halves of at most 75 (>> of a negative int: arithmetic in
   * gcc, clang and nvcc, and one instruction where / 2 takes four) */
  int32_t ni = (int32_t)n, n2 = ni >> 1, n1 = ni - n2;
  float y = p * kern_asfloat((uint32_t)(n1 + 127) << 23) * kern_asfloat((uint32_t)(n2 + 127) << 23);
  return kern_select(x != x, x, y);
}

/* GELU, tanh form: 0.5 x (1 + tanh(k (x + c x^3))), computed as x / (1 +
 * e^(-2u)) with u = k (x + c x^3), the same function (1 + tanh(u) = 2 / (1 +
 * e^(-2u))): one exponential and no tanh, and no cancellation of 1 + tanh(u)
 * where tanh(u) nears -1. Over all 2^32 inputs, |y - ref| / max(1, |ref|)
 * against float64 stays below 1.5e-7 (kern_gelu_grad: 2.1e-7). */
KERN_HD float kern_gelu(float x) {
  float u = KERN_GELU_K * (x + KERN_GELU_C * (x * x) * x);
  return x / (1.0f + kern_expf(-2.0f * u));
}

/* d gelu / dx = s + 2 x s (1 - s) u'(x), s = 1 / (1 + e^(-2u)) (the form
 * above), u' = k (1 + 3 c x^2); 1 - s taken as e^(-2u) s, without
 * cancellation. Past |x| = 10 the derivative is 1 or 0 to fp32 precision; the
 * clamp also keeps e^(-2u) and x*x finite (chosen by kern_select, not
 * returned early, so a loop over it has no branch). */
KERN_HD float kern_gelu_grad(float x) {
  float x2 = x * x, u = KERN_GELU_K * (x + KERN_GELU_C * x2 * x);
  float e = kern_expf(-2.0f * u), s = 1.0f / (1.0f + e);
  /* 2 u' = 2k + 6kc x^2, its constants folded once */
  float g = s + x * s * (e * s) * (2.0f * KERN_GELU_K + (6.0f * KERN_GELU_K * KERN_GELU_C) * x2);
  return kern_select(x > 10.0f, 1.0f, kern_select(x < -10.0f, 0.0f, g));
}

/* One AdamW update of one element, in the order PyTorch's AdamW uses
 * (decoupled decay first, then the bias-corrected step), so both agree to
 * rounding. bc1 = 1 - beta1^t, bc2_sqrt = sqrt(1 - beta2^t). */
KERN_HD void kern_adamw_elem(float *p, float g, float *m, float *v, float lr, float beta1,
                             float beta2, float eps, float wd, float bc1, float bc2_sqrt) {
  float pv = *p * (1.0f - lr * wd);
  float mv = beta1 * *m + (1.0f - beta1) * g;
  float vv = beta2 * *v + (1.0f - beta2) * g * g;
  float denom = sqrtf(vv) / bc2_sqrt + eps;
  *p = pv - (lr / bc1) * (mv / denom);
  *m = mv;
  *v = vv;
}

/* fp32 -> bf16 with round-to-nearest-even; NaN stays a (quiet) NaN. */
KERN_HD uint16_t kern_f32_to_bf16(float f) {
  uint32_t u = kern_asuint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

KERN_HD float kern_bf16_to_f32(uint16_t h) { return kern_asfloat((uint32_t)h << 16); }

#endif

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

/* e^x and tanh(x), the project's own rather than the math library's: plain
 * arithmetic with no tables and no branches, so gcc vectorises a loop that
 * calls them at any vector width, and every width (and the scalar tail, and a
 * GPU built without contraction) gives the same bits. libm's expf and
 * libmvec's vector variants do not agree with each other bit for bit, which
 * made the CPU kernels' results depend on the instruction set they were built
 * for. Cephes' polynomials (S. Moshier), evaluated without fused multiply-adds.
 *
 * kern_expf: x clamped to [-104, 89] (e^x is 0 or inf in fp32 past the ends),
 * x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n * hi is exact), a
 * degree-7 polynomial for e^r, then the scale 2^n applied in two halves, each
 * a normal number, so results in the denormals round once. NaN in, NaN out. */
KERN_HD float kern_expf(float x) {
  float xc = kern_select(x > -104.0f, x, -104.0f); /* a NaN becomes -104, put back at the end */
  xc = kern_select(xc < 89.0f, xc, 89.0f);
  const float shift = 0x1.8p23f; /* adding it rounds to an integer */
  float n = (xc * 1.44269504088896341f + shift) - shift;
  float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = ((((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * (r * r) + r) +
            1.0f;
  int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1; /* |n| <= 150: halves of at most 75 */
  float y = p * kern_asfloat((uint32_t)(n1 + 127) << 23) * kern_asfloat((uint32_t)(n2 + 127) << 23);
  return kern_select(x != x, x, y);
}

/* tanh: an odd polynomial below |x| = 0.625 (where 1 - 2/(e^2x + 1) would
 * cancel), 1 - 2/(e^2|x| + 1) with the sign of x above. */
KERN_HD float kern_tanhf(float x) {
  float z = x * x;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                  1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  float a = fabsf(x);
  float large = copysignf(1.0f - 2.0f / (kern_expf(a + a) + 1.0f), x);
  return kern_select(a < 0.625f, small, large);
}

/* GELU, tanh form: 0.5 x (1 + tanh(k (x + c x^3))). */
KERN_HD float kern_gelu(float x) {
  float u = KERN_GELU_K * (x + KERN_GELU_C * x * x * x);
  return 0.5f * x * (1.0f + kern_tanhf(u));
}

/* d gelu / dx. Past |x| = 10 the derivative is 1 or 0 to fp32 precision; the
 * clamp keeps x*x from overflowing into 0*inf = NaN for huge inputs (chosen by
 * kern_select, not returned early, so a loop over it has no branch). */
KERN_HD float kern_gelu_grad(float x) {
  float u = KERN_GELU_K * (x + KERN_GELU_C * x * x * x);
  float t = kern_tanhf(u);
  float sech2 = 1.0f - t * t;
  float g = 0.5f * (1.0f + t) + 0.5f * x * sech2 * KERN_GELU_K * (1.0f + 3.0f * KERN_GELU_C * x * x);
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

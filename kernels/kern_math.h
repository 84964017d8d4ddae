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

/* GELU, tanh form: 0.5 x (1 + tanh(k (x + c x^3))). */
KERN_HD float kern_gelu(float x) {
  float u = KERN_GELU_K * (x + KERN_GELU_C * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

/* d gelu / dx. Past |x| = 10 the derivative is 1 or 0 to fp32 precision; the
 * clamp keeps x*x from overflowing into 0*inf = NaN for huge inputs. */
KERN_HD float kern_gelu_grad(float x) {
  if (x > 10.0f) return 1.0f;
  if (x < -10.0f) return 0.0f;
  float u = KERN_GELU_K * (x + KERN_GELU_C * x * x * x);
  float t = tanhf(u);
  float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * KERN_GELU_K * (1.0f + 3.0f * KERN_GELU_C * x * x);
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
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

KERN_HD float kern_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif

// The shared element-wise math (kernels/kern_math.h) run on a GPU against the
// CPU backend's kernels on the same inputs: what the CPU tests prove about
// GELU, AdamW and the bf16 casts carries over to CUDA code that calls the same
// functions only as far as the two agree, and this measures how far.
//
// Built by `make` when nvcc exists (a compile and link check here); run by
// `make test-cuda`, which on a machine without a GPU says so and passes.
// Two builds: nvcc's default (-fmad=true: a*b+c contracted into fused
// multiply-adds, which gcc in ISO C mode never does) and -fmad=false.
//
//  - fp32 -> bf16 is integer code: bit-identical on all 2^32 fp32 patterns.
//  - AdamW (10 steps on the same state): bit-identical without contraction;
//    with it, within 1e-6 relative (norm-wise) of the CPU, counts printed.
//  - GELU and its derivative: both sides run kern_math.h's own exponential
//    (kern_expf, plain arithmetic; no libdevice or libmvec since the CPU
//    kernels were built per ISA level), so without contraction the bits
//    agree too (H200, 2026-11-26), and with it differ by rounding. Each side is held against float64 by the criterion
//    test_kernels.c's gelu_tails uses, |y - ref| <= tol * max(1, |ref|)
//    (1e-6 forward, 1e-5 derivative), and the counts of differing elements
//    print.
// Exit status: 0 agreed (or no GPU), 1 a check failed, 2 a CUDA error.
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/rng.h"
#include "kernels/kern_math.h"

// The CPU backend's kernels (kernels/cpu/{gelu,adamw,cast}.c, built by gcc
// with the project's flags): the code under comparison, not a copy of it.
// Their generic level (kernels/cpu/cpu.h names each level's symbols apart);
// test_kernels proves every level gives the same bits.
extern "C" {
void kern_cpu_gelu_fwd_generic(float *out, const float *inp, size_t n);
void kern_cpu_gelu_bwd_generic(float *dinp, const float *inp, const float *dout, size_t n, int acc);
void kern_cpu_adamw_generic(float *p, const float *g, float *m, float *v, size_t n, float lr,
                            float beta1, float beta2, float eps, float wd, int t);
void kern_cpu_f32_to_bf16_generic(uint16_t *out, const float *inp, size_t n);
}

#define KMG_N ((size_t)1 << 22)

#define KMG_CHECK(x)                                                                            \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "kern_math_gpu: %s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_),     \
              __FILE__, __LINE__);                                                              \
      exit(2);                                                                                  \
    }                                                                                           \
  } while (0)

__global__ void kmg_gelu(float *y, float *dy, const float *x, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = kern_gelu(x[i]);
  dy[i] = kern_gelu_grad(x[i]);
}

__global__ void kmg_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                          float beta1, float beta2, float eps, float wd, float bc1,
                          float bc2_sqrt) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  kern_adamw_elem(p + i, g[i], m + i, v + i, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt);
}

// All 2^32 fp32 patterns, `count` of them from `first`.
__global__ void kmg_bf16(uint16_t *out, uint32_t first, size_t count) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  uint32_t u = first + (uint32_t)i;
  float f;
  memcpy(&f, &u, 4);
  out[i] = kern_f32_to_bf16(f);
}

static unsigned kmg_blocks(size_t n) { return (unsigned)((n + 255) / 256); }

// Uniform in [lo, hi), from the project's one generator: inputs any run reproduces.
static float kmg_uniform(uint64_t *s, float lo, float hi) {
  return lo + (hi - lo) * (float)rng_unit(rng_next(s));
}

// Distance in ulp between two floats (through the ordered integer line);
// equal bits 0, NaN against NaN 0, NaN against a number "infinitely" far.
static uint64_t kmg_ulp(float a, float b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0 : UINT64_MAX;
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  int64_t la = ia < 0 ? (int64_t)INT32_MIN - ia : ia, lb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
  return (uint64_t)(la > lb ? la - lb : lb - la);
}

typedef struct {
  size_t n, differ; /* elements compared; those whose bits differ */
  uint64_t worst;   /* the largest distance in ulp */
} kmg_stat_t;

static void kmg_compare(kmg_stat_t *s, const float *cpu, const float *gpu, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t d = kmg_ulp(cpu[i], gpu[i]);
    s->n++;
    if (d) s->differ++;
    if (d > s->worst) s->worst = d;
  }
}

// AdamW's bound: bit-identical where nvcc contracts nothing (as gcc), else
// the norm-wise relative difference ||gpu - cpu|| / ||cpu||.
#ifdef KMG_NO_FMAD
#define KMG_ADAMW_EXACT 1
#else
#define KMG_ADAMW_EXACT 0
#endif
#define KMG_ADAMW_REL 1e-6

static int kmg_check_exact(const char *name, const float *cpu, const float *gpu, size_t n) {
  kmg_stat_t s = {0, 0, 0};
  kmg_compare(&s, cpu, gpu, n);
  double d2 = 0, c2 = 0;
  for (size_t i = 0; i < n; i++)
    d2 += ((double)gpu[i] - cpu[i]) * ((double)gpu[i] - cpu[i]), c2 += (double)cpu[i] * cpu[i];
  double rel = c2 > 0 ? sqrt(d2 / c2) : sqrt(d2);
  int ok = KMG_ADAMW_EXACT ? s.differ == 0 : rel <= KMG_ADAMW_REL;
  printf("kern_math_gpu: %-11s n=%zu differ=%zu (%.3g%%) max_ulp=%llu rel=%.3g bound=%s %s\n", name,
         s.n, s.differ, 100.0 * (double)s.differ / (double)s.n, (unsigned long long)s.worst, rel,
         KMG_ADAMW_EXACT ? "bit-identical" : "rel<=1e-6", ok ? "ok" : "FAIL");
  return ok;
}

static double kmg_gelu_ref(double x) {
  return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double kmg_gelu_grad_ref(double x) {
  const double k = sqrt(2 / M_PI), c = 0.044715, t = tanh(k * (x + c * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
}

// The largest |y - ref| / max(1, |ref|) of y against fn over the finite refs.
static double kmg_worst_err(const float *x, const float *y, double (*fn)(double), size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double ref = fn((double)x[i]);
    if (!isfinite(ref)) continue;
    double e = fabs((double)y[i] - ref) / fmax(1.0, fabs(ref));
    if (isnan(e)) return INFINITY; /* a NaN where the answer is a number */
    if (e > worst) worst = e;
  }
  return worst;
}

static int kmg_check_ref(const char *name, const float *x, const float *cpu, const float *gpu,
                         double (*fn)(double), double tol, size_t n) {
  kmg_stat_t s = {0, 0, 0};
  kmg_compare(&s, cpu, gpu, n);
  double ec = kmg_worst_err(x, cpu, fn, n), eg = kmg_worst_err(x, gpu, fn, n);
  int ok = ec <= tol && eg <= tol;
  printf("kern_math_gpu: %-11s n=%zu differ=%zu (%.3g%%) err_vs_f64 cpu=%.3g gpu=%.3g tol=%.0e %s\n",
         name, s.n, s.differ, 100.0 * (double)s.differ / (double)s.n, ec, eg, tol,
         ok ? "ok" : "FAIL");
  return ok;
}

// GELU and its derivative on KMG_N inputs: uniform in [-12, 12] (both clamps
// of the derivative and the whole curved part), then special values.
static int kmg_run_gelu(void) {
  const size_t n = KMG_N;
  float *x = (float *)malloc(n * 4), *y = (float *)malloc(n * 4), *dy = (float *)calloc(n, 4);
  float *one = (float *)malloc(n * 4), *gy = (float *)malloc(n * 4), *gdy = (float *)malloc(n * 4);
  if (!x || !y || !dy || !one || !gy || !gdy) return fprintf(stderr, "out of memory\n"), 0;
  uint64_t seed = 1;
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f, -1.0f, 10.0f, -10.0f, 3e38f, -3e38f,
                           INFINITY, -INFINITY};
  const size_t ns = sizeof special / sizeof special[0];
  for (size_t i = 0; i < n; i++) x[i] = i < ns ? special[i] : kmg_uniform(&seed, -12.0f, 12.0f);
  for (size_t i = 0; i < n; i++) one[i] = 1.0f;
  kern_cpu_gelu_fwd_generic(y, x, n);
  kern_cpu_gelu_bwd_generic(dy, x, one, n, 0); /* grad * 1: the derivative itself */
  float *dx, *dyv, *ddy;
  KMG_CHECK(cudaMalloc(&dx, n * 4));
  KMG_CHECK(cudaMalloc(&dyv, n * 4));
  KMG_CHECK(cudaMalloc(&ddy, n * 4));
  KMG_CHECK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
  kmg_gelu<<<kmg_blocks(n), 256>>>(dyv, ddy, dx, n);
  KMG_CHECK(cudaGetLastError());
  KMG_CHECK(cudaMemcpy(gy, dyv, n * 4, cudaMemcpyDeviceToHost));
  KMG_CHECK(cudaMemcpy(gdy, ddy, n * 4, cudaMemcpyDeviceToHost));
  int ok = kmg_check_ref("gelu", x, y, gy, kmg_gelu_ref, 1e-6, n);
  ok &= kmg_check_ref("gelu_grad", x, dy, gdy, kmg_gelu_grad_ref, 1e-5, n);
  cudaFree(dx), cudaFree(dyv), cudaFree(ddy);
  free(x), free(y), free(dy), free(one), free(gy), free(gdy);
  return ok;
}

// AdamW: 10 steps on the same state from both sides, so differences that
// compound across steps show; GPT-2-like scales for weights and gradients.
static int kmg_run_adamw(void) {
  const size_t n = KMG_N;
  const float lr = 6e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  float *p = (float *)malloc(n * 4), *g = (float *)malloc(n * 4), *m = (float *)calloc(n, 4),
        *v = (float *)calloc(n, 4), *gp = (float *)malloc(n * 4);
  if (!p || !g || !m || !v || !gp) return fprintf(stderr, "out of memory\n"), 0;
  uint64_t seed = 2;
  for (size_t i = 0; i < n; i++) p[i] = kmg_uniform(&seed, -0.1f, 0.1f);
  float *dp, *dg, *dm, *dv;
  KMG_CHECK(cudaMalloc(&dp, n * 4));
  KMG_CHECK(cudaMalloc(&dg, n * 4));
  KMG_CHECK(cudaMalloc(&dm, n * 4));
  KMG_CHECK(cudaMalloc(&dv, n * 4));
  KMG_CHECK(cudaMemcpy(dp, p, n * 4, cudaMemcpyHostToDevice));
  KMG_CHECK(cudaMemset(dm, 0, n * 4));
  KMG_CHECK(cudaMemset(dv, 0, n * 4));
  for (int t = 1; t <= 10; t++) {
    for (size_t i = 0; i < n; i++) g[i] = kmg_uniform(&seed, -1e-2f, 1e-2f);
    KMG_CHECK(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice));
    kern_cpu_adamw_generic(p, g, m, v, n, lr, beta1, beta2, eps, wd, t);
    /* the bias corrections as kern_cpu_adamw forms them (double, then float) */
    const float bc1 = (float)(1.0 - pow(beta1, t)), bc2 = (float)sqrt(1.0 - pow(beta2, t));
    kmg_adamw<<<kmg_blocks(n), 256>>>(dp, dg, dm, dv, n, lr, beta1, beta2, eps, wd, bc1, bc2);
    KMG_CHECK(cudaGetLastError());
  }
  KMG_CHECK(cudaMemcpy(gp, dp, n * 4, cudaMemcpyDeviceToHost));
  int ok = kmg_check_exact("adamw_p", p, gp, n);
  KMG_CHECK(cudaMemcpy(gp, dm, n * 4, cudaMemcpyDeviceToHost));
  ok &= kmg_check_exact("adamw_m", m, gp, n);
  KMG_CHECK(cudaMemcpy(gp, dv, n * 4, cudaMemcpyDeviceToHost));
  ok &= kmg_check_exact("adamw_v", v, gp, n);
  cudaFree(dp), cudaFree(dg), cudaFree(dm), cudaFree(dv);
  free(p), free(g), free(m), free(v), free(gp);
  return ok;
}

// fp32 -> bf16 on every fp32 bit pattern, in chunks of 2^26.
static int kmg_run_bf16(void) {
  const size_t chunk = (size_t)1 << 26;
  float *in = (float *)malloc(chunk * 4);
  uint16_t *cpu = (uint16_t *)malloc(chunk * 2), *gpu = (uint16_t *)malloc(chunk * 2), *d;
  if (!in || !cpu || !gpu) return fprintf(stderr, "out of memory\n"), 0;
  KMG_CHECK(cudaMalloc(&d, chunk * 2));
  size_t differ = 0;
  uint32_t first_bad = 0;
  for (uint64_t first = 0; first < ((uint64_t)1 << 32); first += chunk) {
    kmg_bf16<<<kmg_blocks(chunk), 256>>>(d, (uint32_t)first, chunk);
    KMG_CHECK(cudaGetLastError());
    for (size_t i = 0; i < chunk; i++) {
      uint32_t u = (uint32_t)(first + i);
      memcpy(&in[i], &u, 4);
    }
    kern_cpu_f32_to_bf16_generic(cpu, in, chunk);
    KMG_CHECK(cudaMemcpy(gpu, d, chunk * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < chunk; i++)
      if (cpu[i] != gpu[i] && !differ++) first_bad = (uint32_t)(first + i);
  }
  printf("kern_math_gpu: %-10s n=4294967296 differ=%zu bound=0 %s", "f32_to_bf16", differ,
         differ ? "FAIL" : "ok");
  if (differ) printf(" (first at bits 0x%08x)", first_bad);
  printf("\n");
  cudaFree(d);
  free(in), free(cpu), free(gpu);
  return differ == 0;
}

int main(void) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) { /* any error here means no usable GPU (TOOLCHAIN.md) */
    printf("kern_math_gpu: skipped: no CUDA device here (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 0;
  }
  cudaDeviceProp prop;
  KMG_CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("kern_math_gpu: device %s (sm_%d%d), fmad %s\n", prop.name, prop.major, prop.minor,
#ifdef KMG_NO_FMAD
         "off"
#else
         "on"
#endif
  );
  int ok = kmg_run_gelu();
  ok &= kmg_run_adamw();
  ok &= kmg_run_bf16();
  printf("kern_math_gpu: %s\n", ok ? "agreed" : "DIFFERS beyond the bound");
  return ok ? 0 : 1;
}

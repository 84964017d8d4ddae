/* test_cuda_kernels: every op of the CUDA backend (kernels/cuda) against the
 * CPU backend (kernels/cpu, the reference implementation) on the same fresh
 * random inputs, forward and backward, on small odd shapes and on GPT-2's
 * (C=768, T=1024 for attention, V=50257 for cross-entropy); backward ops start
 * from non-zero gradients (kern.h: they accumulate). The forward of matmul,
 * layernorm, attention and cross-entropy is also held against a float64
 * reference written here (selected rows where the shape is large), both
 * backends' results, so a bound that passes is seen to be one both meet.
 *
 * One line per check: op, what, shape, max abs and max rel error, the bound,
 * the worst error as a fraction of its bound, PASS/FAIL. The bounds, per op
 * (run with the CPU backend's levels and attention blocks standing in for
 * the GPU, the worst fractions were 0.01 to 0.08: real rounding noise sits
 * well inside them, while a wrong index or a missed term lands far outside):
 *  - bits: element-wise ops on kern_math.h's formulas (gelu, adamw, casts,
 *    residual, encoder, crossentropy backward, vec_add/scale) and the sums
 *    the CUDA backend takes in the CPU's own order (encoder backward,
 *    layernorm's dw and db, matmul's dbias): the same bits, since
 *    kernels/cuda is built with -fmad=false and gcc contracts nothing.
 *  - |diff| <= TOL_GEMM * mag for matmul and attention (TOL_GEMM_BF16 and
 *    TOL_GEMM_TF32 in those modes, checked at the end): mag is the sum of
 *    |a*b| over each product (matmul: the CPU's product of |inputs|, plus
 *    |bias| or |initial gradient|; attention: upper bounds of it carried
 *    through the softmax, see attn_fwd_mags and attn_bwd_mags). cuBLAS sums in
 *    another order than oneDNN; each is within a few fp32 ulps of mag. The
 *    fused attention (head sizes 16, 32, 64, 128) is held to the same bound:
 *    its online softmax rescales by exp of max differences, exact to an ulp
 *    per rescale, and its log-sum-exp (what it keeps instead of att) is
 *    checked against float64 with mag = 1 + the bound on its scores + |lse|
 *    (attn_ref_lse). In bf16 mode the fused attention runs on tensor cores
 *    (attention_tc.cu: bf16 operands in all four products) and is held to
 *    TOL_GEMM_BF16 instead. In bf16 mode the products on packed operands are also
 *    held to TOL_GEMM against the CPU's products of the bf16-rounded
 *    operands (the *-bf16ops lines: bf16 x bf16 is exact in fp32), which a
 *    dropped term or block of the blocked products (matmul.cu) would miss
 *    by far.
 *  - |diff| <= TOL_RED * mag for fp32 sums over rows (layernorm, softmax,
 *    cross-entropy): the CPU sums in 16 lanes, the GPU in a tree, so each is
 *    off by ~sqrt(n) * 2^-24 relative (about 1e-6 at V = 50257); mag as
 *    written at each check.
 *  - |diff| <= TOL_F64 * sum|terms| for the double sums (vec_sum, sumsq).
 *
 * Seed: FSDP_TEST_SEED, else the clock; printed, so a failure can be re-run.
 * Exit status: 0 all passed (or no GPU: skipped), 1 a check failed, 2 a
 * CUDA error: the backend could not start or allocate, or an op hit an error
 * (the backend prints it on stderr and aborts; SIGABRT becomes exit 2).
 * Built by `make test` (compile and link only here), run by `make test-cuda`
 * on a GPU machine.
 *
 * The same file built against tests/cuda/emu (KERN_CUDA_EMU: the kernels run
 * on the CPU, one thread at a time; cuda_emu.h) runs in `make test` as
 * test_cuda_kernels_emu, where there is no GPU. There GPT-2's T = 1024 is
 * EMU_T (so the fp32 fused attention's emulated threads take seconds, not a
 * minute), except where T itself is what is tested (the products' head
 * batches), and the two shapes that exist only to outgrow the column-sum
 * scratch (gigabytes each) are left to the GPU, each skip printed. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "daemon/common/rng.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cudnn.h"
#include "kernels/cuda/size.h"
#include "kernels/kern.h"
#include "kernels/kern_math.h"

#define TOL_GEMM 1e-5
/* The products' modes (kern_cuda_opts_t): operands rounded to bf16 (8
 * significant bits) or TF32 (11) inside the product, each within 2^-9 or
 * 2^-12 relative, so a product within twice that of mag; doubled again
 * for the sums and the softmax after. */
#define TOL_GEMM_BF16 8e-3
#define TOL_GEMM_TF32 1e-3
static double tol_gemm = TOL_GEMM; /* the bound of the GPU's products in the mode under test */
static int attn_gemm; /* the mode under test: attention by products even where fused is built */
static int attn_tc;   /* the mode under test: the fused attention on bf16 tensor cores */
/* The mode under test packs the operands to bf16 (matmul.cu): its products
 * equal the CPU's products of the bf16-rounded operands to fp32 accuracy
 * (products of bf16 are exact in fp32; only the order of the sums differs),
 * which shows a dropped or doubled term that TOL_GEMM_BF16 would not. */
static int bf16_exact;
/* The mode under test computes the bf16 activations' GELU in gelu.cu's fast
 * form (kern_cuda_opts_t.gelu_exact 0, the default): within a bf16 step of
 * the CPU's bits, not on them */
static int gelu_fast;
#define TOL_RED 1e-5
#define TOL_F64 1e-12

#ifdef KERN_CUDA_EMU
#define GPT_T 192 /* GPT-2's T, emulated: three 64-row tiles */
#else
#define GPT_T 1024
#endif

#ifdef KERN_CUDA_EMU
unsigned long cuda_emu_launches(const char *name); /* tests/cuda/emu/cuda_emu.cc */
size_t cuda_emu_smem_optin(void);
int cuda_emu_lt_last_rank(void);
unsigned long cuda_emu_lt_ragged(void);
#endif

static const kern_backend_t *cpu, *gpu;
static uint64_t rng_state;
static int n_checks, n_fails;

/* ---- buffers -------------------------------------------------------------- */

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "test_cuda_kernels: out of host memory (%zu bytes)\n", bytes);
    exit(2);
  }
  return p;
}

static float unif(float lo, float hi) {
  return lo + (hi - lo) * (float)rng_unit(rng_next(&rng_state));
}

static uint32_t rand_below(uint32_t n) { return (uint32_t)(rng_next(&rng_state) % n); }

static float *frand(size_t n, float lo, float hi) {
  float *x = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = unif(lo, hi);
  return x;
}

static float *fdup(const float *x, size_t n) {
  float *y = xmalloc(n * sizeof(float));
  if (n) memcpy(y, x, n * sizeof(float));
  return y;
}

static float *fabs_dup(const float *x, size_t n) {
  float *y = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) y[i] = fabsf(x[i]);
  return y;
}

/* x rounded to bf16 (the casts' rounding), as fp32; or copied (round 0). */
static float *round_dup(const float *x, size_t n, int round) {
  float *y = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) y[i] = round ? kern_bf16_to_f32(kern_f32_to_bf16(x[i])) : x[i];
  return y;
}

/* A device buffer of bytes, filled with NaN (0xff bytes): an op that should
 * write every element and misses one shows. */
static void *dnew(size_t bytes) {
  void *d = gpu->dev_alloc(bytes);
  if (!d) {
    fprintf(stderr, "test_cuda_kernels: dev_alloc(%zu) failed: the GPU is full\n", bytes);
    exit(2);
  }
  gpu->dev_set(d, 0xff, bytes);
  return d;
}

/* The device's shared memory a block may opt in to (the kernels' choice of
 * form: crossentropy.cu) */
static size_t smem_optin(void) {
  struct cudaDeviceProp p;
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess ? p.sharedMemPerBlockOptin : 0;
}

static void *dput(const void *h, size_t bytes) {
  void *d = dnew(bytes);
  gpu->copy_h2d(d, h, bytes);
  return d;
}

static float *dget(const void *d, size_t n) {
  float *h = xmalloc(n * sizeof(float));
  gpu->copy_d2h(h, d, n * sizeof(float));
  return h;
}

/* The padding of rows ld apart: 0x71717171 (1.2e30), finite, so that an op
 * that reads it goes far off and one that writes it (even x * s, which
 * would keep a NaN's bits) changes it. */
#define PAD_BYTE 0x71
#define PAD_BITS 0x71717171u

/* A device copy of host rows (rows x cols; NULL: dnew's NaN) with rows
 * ld >= cols apart, the padding PAD_BITS. */
static float *dput_rows(const float *h, int rows, int cols, int ld) {
  const size_t n = (size_t)rows * ld;
  float *p = xmalloc(n * sizeof *p);
  memset(p, PAD_BYTE, n * sizeof *p);
  for (int r = 0; r < rows; r++) {
    if (h) memcpy(p + (size_t)r * ld, h + (size_t)r * cols, cols * sizeof *h);
    else memset(p + (size_t)r * ld, 0xff, cols * sizeof *p);
  }
  float *d = dput(p, n * sizeof *p);
  free(p);
  return d;
}

static void report(const char *op, const char *what, const char *shape, double max_abs,
                   double max_rel, const char *bound, double worst, int ok);

/* The rows of device buffer d (rows ld apart) as a dense host copy (rows x
 * cols); checks, as "<what>-padding", that the op left the padding as
 * dput_rows filled it. */
static float *dget_rows(const float *d, int rows, int cols, int ld, const char *op,
                        const char *what, const char *shape) {
  float *p = dget(d, (size_t)rows * ld), *h = xmalloc((size_t)rows * cols * sizeof *h);
  size_t written = 0;
  for (int r = 0; r < rows; r++) {
    memcpy(h + (size_t)r * cols, p + (size_t)r * ld, cols * sizeof *h);
    for (int c = cols; c < ld; c++) {
      uint32_t u;
      memcpy(&u, p + (size_t)r * ld + c, sizeof u);
      written += u != PAD_BITS;
    }
  }
  if (ld > cols) {
    char w[48];
    snprintf(w, sizeof w, "%s-padding", what);
    report(op, w, shape, 0, 0, "untouched", -1, written == 0);
    if (written) printf("test_cuda_kernels:   %zu padding elements written\n", written);
  }
  free(p);
  return h;
}

/* ---- checks --------------------------------------------------------------- */

/* worst: the largest error as a fraction of its bound (< 1 passes; -1: not
 * applicable, bits) */
static void report(const char *op, const char *what, const char *shape, double max_abs,
                   double max_rel, const char *bound, double worst, int ok) {
  n_checks++;
  if (!ok) n_fails++;
  char w[32] = "-";
  if (worst >= 0) snprintf(w, sizeof w, "%.2g", worst);
  printf(
      "test_cuda_kernels: %-16s %-13s %-28s max_abs=%-9.3g max_rel=%-9.3g bound=%-13s "
      "worst/bound=%-7s %s\n",
      op, what, shape, max_abs, max_rel, bound, w, ok ? "PASS" : "FAIL");
  fflush(stdout);
}

/* got and ref (n floats) have the same bits, or are both NaN (got not the
 * fill of dnew). */
static void check_bits(const char *op, const char *what, const char *shape, const float *got,
                       const float *ref, size_t n) {
  double max_abs = 0, max_rel = 0;
  size_t differ = 0;
  for (size_t i = 0; i < n; i++) {
    /* a NaN is a NaN: x86 makes the negative default NaN (0xffc00000) and
     * CUDA the positive canonical one (0x7fffffff); the payload is no result.
     * But dnew's fill (0xffffffff) is an element the op never wrote. */
    uint32_t gb;
    memcpy(&gb, &got[i], sizeof gb);
    if (!memcmp(&got[i], &ref[i], sizeof(float)) ||
        (isnan(got[i]) && isnan(ref[i]) && gb != 0xffffffffu))
      continue;
    differ++;
    double d = fabs((double)got[i] - ref[i]);
    if (isnan(d)) d = INFINITY;
    if (d > max_abs) max_abs = d;
    if (ref[i] != 0 && d / fabs(ref[i]) > max_rel) max_rel = d / fabs(ref[i]);
  }
  report(op, what, shape, max_abs, max_rel, "bits", -1, differ == 0);
  if (differ) printf("test_cuda_kernels:   %zu of %zu elements differ\n", differ, n);
}

/* check_bits of n floats of device buffer d against the CPU's ref. */
static void check_dev_bits(const char *op, const char *what, const char *shape, const float *d,
                           const float *ref, size_t n) {
  float *g = dget(d, n);
  check_bits(op, what, shape, g, ref, n);
  free(g);
}

static void check_bits_u16(const char *op, const char *what, const char *shape, const uint16_t *got,
                           const uint16_t *ref, size_t n) {
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (got[i] != ref[i] && !differ++) first = i;
  report(op, what, shape, differ ? INFINITY : 0, differ ? INFINITY : 0, "bits", -1, differ == 0);
  if (differ)
    printf("test_cuda_kernels:   %zu of %zu differ, first at %zu: 0x%04x vs 0x%04x\n", differ, n,
           first, got[first], ref[first]);
}

/* got within one bf16 step of ref: the same bf16 (bf16_same: bits, or both
 * NaN), its neighbour of the same sign, or within abs of it (both finite);
 * and at most one element in a thousand (and one) not the same. gelu.cu's
 * fast GELU against the CPU's: both within 2e-7 of float64 relative to
 * max(1, |y|), so they round apart only where the value lies that close to
 * a bf16 rounding boundary (3e-6 of fp32 inputs, counted on the host), or,
 * where the result is far below 1, by that absolute error: near 2^-126,
 * which the special function unit flushes to 0 (abs 2^-100), and where
 * the derivative's two terms cancel (x near -0.75: results of 1e-6 two
 * steps, 1.5e-8, apart on the emulator). Counted on the host over 2^32/61
 * inputs where |derivative| < 2^-8: the fp32 forms 6.4e-8 apart at most,
 * 1.2e-7 with ex2 off by 2 ulp and rcp by 1 as a GPU's may be; with the
 * two bf16 roundings and |dout| <= 1, abs 2^-21 (4.8e-7) for backward. */
static int bf16_same(uint16_t got, uint16_t want);
static void check_bf16_near(const char *op, const char *what, const char *shape,
                            const uint16_t *got, const uint16_t *ref, size_t n, float abs_tol) {
  size_t differ = 0, far = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    if (bf16_same(got[i], ref[i])) continue;
    differ++;
    const float g = kern_bf16_to_f32(got[i]), r = kern_bf16_to_f32(ref[i]);
    const int near = isfinite(g) && isfinite(r) && fabsf(g - r) <= abs_tol;
    const int step = (got[i] ^ ref[i]) < 0x8000 && (got[i] & 0x7f80) != 0x7f80 &&
                     (ref[i] & 0x7f80) != 0x7f80 && abs((int)got[i] - (int)ref[i]) == 1;
    if (!near && !step && !far++) first = i;
  }
  char bound[40];
  snprintf(bound, sizeof bound, "1 step|%.0e, %zu", abs_tol, n / 1000 + 1);
  report(op, what, shape, 0, 0, bound, (double)differ / (double)(n / 1000 + 1),
         !far && differ <= n / 1000 + 1);
  if (differ) printf("test_cuda_kernels:   %zu of %zu not the CPU's bits\n", differ, n);
  if (far)
    printf("test_cuda_kernels:   %zu of %zu more than a step apart, first at %zu: 0x%04x vs 0x%04x\n",
           far, n, first, got[first], ref[first]);
}

/* |got - ref| <= tol * mag for every element, ref and mag given as floats
 * (reff, magf) or doubles (refd, magd); mag NULL: |ref|. A NaN fails. */
static void check_tol(const char *op, const char *what, const char *shape, const float *got,
                      const float *reff, const double *refd, const float *magf, const double *magd,
                      size_t n, double tol) {
  double max_abs = 0, max_rel = 0, worst = 0;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    const double ref = reff ? (double)reff[i] : refd[i];
    const double mag = magf ? (double)magf[i] : magd ? magd[i] : fabs(ref);
    double d = fabs((double)got[i] - ref);
    if (isnan(d)) d = INFINITY;
    if (d > max_abs) max_abs = d;
    if (ref != 0 && d / fabs(ref) > max_rel) max_rel = d / fabs(ref);
    if (!(d <= tol * mag) && !bad++) first = i;
    if (d > 0) worst = fmax(worst, d / (tol * mag)); /* inf where mag is 0 */
  }
  char bound[32];
  snprintf(bound, sizeof bound, "%.0e*mag", tol);
  report(op, what, shape, max_abs, max_rel, bound, worst, bad == 0);
  if (bad) {
    const double ref = reff ? (double)reff[first] : refd[first];
    const double mag = magf ? (double)magf[first] : magd ? magd[first] : fabs(ref);
    printf(
        "test_cuda_kernels:   %zu of %zu out of bound, first at %zu: got %.9g ref %.9g mag %.3g\n",
        bad, n, first, got[first], ref, mag);
  }
}

/* Rows to hold against the float64 reference: all of n when few, else the
 * edges, the middle, a block boundary and a few at random (sorted, distinct
 * enough for a check; duplicates are harmless). */
static int pick_rows(int n, int *rows) {
  if (n <= 48) {
    for (int i = 0; i < n; i++) rows[i] = i;
    return n;
  }
  int k = 0;
  const int fixed[] = {0, 1, 2, 31, 32, 63, 64, n / 2 - 1, n / 2, n - 2, n - 1};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
    if (fixed[i] < n) rows[k++] = fixed[i];
  for (int i = 0; i < 5; i++) rows[k++] = (int)rand_below((uint32_t)n);
  return k;
}
#define MAX_PICK 48

/* ---- memory section and vector ops ---------------------------------------- */

static void test_memory(size_t n) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  float *x = frand(n, -2, 2), *y = frand(n, -2, 2);
  float *dx = dput(x, n * 4), *dy = dput(y, n * 4), *dz = dnew(n * 4);
  /* round trip through d2d */
  gpu->copy_d2d(dz, dx, n * 4);
  float *z = dget(dz, n);
  check_bits("copy", "h2d-d2d-d2h", shape, z, x, n);
  free(z);
  /* dev_set: every byte */
  gpu->dev_set(dz, 0x3c, n * 4);
  z = dget(dz, n);
  float *pat = xmalloc(n * 4);
  if (n) memset(pat, 0x3c, n * 4);
  check_bits("dev_set", "bytes", shape, z, pat, n);
  free(z);
  free(pat);
  /* vec_add, vec_scale: element-wise */
  float *yc = fdup(y, n);
  cpu->vec_add(yc, x, n);
  gpu->vec_add(dy, dx, n);
  check_dev_bits("vec_add", "y", shape, dy, yc, n);
  cpu->vec_scale(yc, 0.37f, n);
  gpu->vec_scale(dy, 0.37f, n);
  check_dev_bits("vec_scale", "y", shape, dy, yc, n);
  /* vec_sum: double, another fixed order */
  double sc = cpu->vec_sum(x, n), sg = gpu->vec_sum(dx, n), mag = 0;
  for (size_t i = 0; i < n; i++) mag += fabs(x[i]);
  double d = fabs(sg - sc);
  char bound[32];
  snprintf(bound, sizeof bound, "%.0e*sum|x|", TOL_F64);
  report("vec_sum", "sum", shape, d, sc != 0 ? d / fabs(sc) : d, bound,
         d > 0 ? d / (TOL_F64 * mag) : 0, d <= TOL_F64 * mag);
  gpu->dev_free(dx), gpu->dev_free(dy), gpu->dev_free(dz);
  free(x), free(y), free(yc);
}

/* The step buffers' pool (backend.cu: dev_alloc_step): a buffer freed is
 * kept for the next (the pool holds it while a long-lived buffer from
 * dev_alloc lives on), yet memory freed as one size still serves another
 * when the device has nothing else left: a block of 45% of the free memory
 * freed, then 70% asked for, which fits only once the pool gives the 45%
 * back. The new block's last bytes are then set and read. When the last
 * buffer goes the pool holds nothing. On the emulator the device is made 64
 * MiB larger than what is in use, for this check only. */
static void test_dev_pool(void) {
#ifdef KERN_CUDA_EMU
  const char *cap_env = getenv("CUDA_EMU_MEMORY");
  char cap_was[64] = "", cap[64];
  if (cap_env) snprintf(cap_was, sizeof cap_was, "%s", cap_env);
  size_t f0, t0;
  cudaMemGetInfo(&f0, &t0);
  snprintf(cap, sizeof cap, "%zu", t0 - f0 + ((size_t)64 << 20));
  setenv("CUDA_EMU_MEMORY", cap, 1);
#endif
  size_t free_b = 0, total = 0, held = 0, high, used;
  void *keep = gpu->dev_alloc(4096); /* a long-lived buffer: the job goes on */
  int ok = keep && cudaMemGetInfo(&free_b, &total) == cudaSuccess;
  const size_t x = free_b / 100 * 45 & ~(size_t)4095, y = free_b / 100 * 70 & ~(size_t)4095;
  void *a = ok ? gpu->dev_alloc_step(x) : NULL;
  ok = ok && a;
  if (a) gpu->dev_free_step(a);
  kern_cuda_pool_stats(&held, &high, &used);
  report("dev_alloc_step", "pool keeps a freed block", "-", 0, 0, "-", -1, ok && held >= x);
  unsigned char *b = ok ? gpu->dev_alloc_step(y) : NULL, tail[4096], want[4096];
  ok = ok && b;
  if (b) {
    gpu->dev_set(b + y - sizeof tail, 0x5a, sizeof tail);
    gpu->copy_d2h(tail, b + y - sizeof tail, sizeof tail);
    memset(want, 0x5a, sizeof want);
    ok = !memcmp(tail, want, sizeof tail);
    gpu->dev_free_step(b);
  }
  char shape[96];
  snprintf(shape, sizeof shape, "%.2f GiB freed, then %.2f GiB of %.2f GiB free",
           (double)x / (1 << 30), (double)y / (1 << 30), (double)free_b / (1 << 30));
  report("dev_alloc_step", "pool gives back", shape, 0, 0, "-", -1, ok);
  gpu->dev_free(keep);
  kern_cuda_pool_stats(&held, &high, &used);
  report("dev_alloc_step", "pool empty after the last buffer", "-", 0, 0, "-", -1, held == 0);
#ifdef KERN_CUDA_EMU
  if (*cap_was) setenv("CUDA_EMU_MEMORY", cap_was, 1);
  else unsetenv("CUDA_EMU_MEMORY");
#endif
}

/* ---- encoder -------------------------------------------------------------- */

static void test_encoder(int B, int T, int C, int V) {
  char shape[64];
  snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
  const size_t nbt = (size_t)B * T, n = nbt * C;
  int32_t *tok = xmalloc(nbt * sizeof(int32_t));
  /* half the positions from a few ids, so ids repeat (dwte's accumulation) */
  for (size_t i = 0; i < nbt; i++)
    tok[i] = (int32_t)rand_below(i % 2 ? (uint32_t)V : (uint32_t)(V < 7 ? V : 7));
  tok[nbt - 1] = V - 1;
  float *wte = frand((size_t)V * C, -1, 1), *wpe = frand((size_t)T * C, -1, 1);
  float *out = xmalloc(n * 4);
  cpu->encoder_fwd(out, tok, wte, wpe, B, T, C);
  int32_t *dtok = dput(tok, nbt * sizeof(int32_t));
  float *dwte_w = dput(wte, (size_t)V * C * 4), *dwpe_w = dput(wpe, (size_t)T * C * 4);
  float *dout_o = dnew(n * 4);
  gpu->encoder_fwd(dout_o, dtok, dwte_w, dwpe_w, B, T, C);
  float *g = dget(dout_o, n);
  check_bits("encoder_fwd", "out", shape, g, out, n);
  free(g);
  /* from bf16 images: the fp32 op on them widened (the CPU's) */
  uint16_t *wte16 = xmalloc((size_t)V * C * 2), *wpe16 = xmalloc((size_t)T * C * 2);
  cpu->f32_to_bf16(wte16, wte, (size_t)V * C), cpu->f32_to_bf16(wpe16, wpe, (size_t)T * C);
  float *wte_r = xmalloc((size_t)V * C * 4), *wpe_r = xmalloc((size_t)T * C * 4);
  cpu->bf16_to_f32(wte_r, wte16, (size_t)V * C), cpu->bf16_to_f32(wpe_r, wpe16, (size_t)T * C);
  cpu->encoder_fwd(out, tok, wte_r, wpe_r, B, T, C);
  uint16_t *dwte16 = dput(wte16, (size_t)V * C * 2), *dwpe16 = dput(wpe16, (size_t)T * C * 2);
  gpu->dev_set(dout_o, 0xff, n * 4);
  gpu->encoder_fwd16(dout_o, dtok, dwte16, dwpe16, B, T, C);
  g = dget(dout_o, n);
  check_bits("encoder_fwd16", "out", shape, g, out, n);
  gpu->dev_free(dwte16), gpu->dev_free(dwpe16);
  free(g), free(wte16), free(wpe16), free(wte_r), free(wpe_r);
  /* backward: from non-zero gradients */
  float *dout = frand(n, -1, 1), *dwte = frand((size_t)V * C, -1, 1),
        *dwpe = frand((size_t)T * C, -1, 1);
  float *ddout = dput(dout, n * 4), *ddwte = dput(dwte, (size_t)V * C * 4),
        *ddwpe = dput(dwpe, (size_t)T * C * 4);
  cpu->encoder_bwd(dwte, dwpe, dout, tok, B, T, C);
  gpu->encoder_bwd(ddwte, ddwpe, ddout, dtok, B, T, C);
  check_dev_bits("encoder_bwd", "dwte", shape, ddwte, dwte, (size_t)V * C);
  check_dev_bits("encoder_bwd", "dwpe", shape, ddwpe, dwpe, (size_t)T * C);
  gpu->dev_free(dtok), gpu->dev_free(dwte_w), gpu->dev_free(dwpe_w), gpu->dev_free(dout_o);
  gpu->dev_free(ddout), gpu->dev_free(ddwte), gpu->dev_free(ddwpe);
  free(tok), free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
}

/* ---- layernorm ------------------------------------------------------------ */

#ifdef KERN_CUDA_EMU
/* launches of layernorm.cu's wide kernels so far: forward's (every
 * instantiation), or backward's (bwd; its launch names K, not its value) */
static unsigned long ln_wide_launches(int bwd) {
  if (bwd) return cuda_emu_launches("layernorm_bwd_wide_kernel<K>");
  static const char *const names[] = {
      "layernorm_fwd_wide_kernel<O, 1>", "layernorm_fwd_wide_kernel<O, 2>",
      "layernorm_fwd_wide_kernel<O, 4>", "layernorm_fwd_wide_kernel<O, 6>"};
  unsigned long n = 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) n += cuda_emu_launches(names[i]);
  return n;
}
/* rows a launch of the wide backward takes on the emulator (layernorm.cu's
 * ln_bwd_rows: 48 runs of 32) */
#define LN_EMU_BWD_ROWS (48 * 32)
#endif

static void test_layernorm(int N, int C) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
  const size_t n = (size_t)N * C;
  float *x = frand(n, -2, 3), *w = frand(C, 0.5f, 1.5f), *b = frand(C, -0.5f, 0.5f);
  float *out = xmalloc(n * 4), *mean = xmalloc(N * 4), *rstd = xmalloc(N * 4);
  cpu->layernorm_fwd(out, mean, rstd, x, w, b, N, C);
  float *dx = dput(x, n * 4), *dw_ = dput(w, C * 4), *db_ = dput(b, C * 4);
  float *dout_o = dnew(n * 4), *dmean = dnew(N * 4), *drstd = dnew(N * 4);
#ifdef KERN_CUDA_EMU
  const unsigned long fwd0 = ln_wide_launches(0), bwd0 = ln_wide_launches(1);
#endif
  gpu->layernorm_fwd(dout_o, dmean, drstd, dx, dw_, db_, N, C);
  float *go = dget(dout_o, n), *gm = dget(dmean, N), *gr = dget(drstd, N);

  /* mags: mean ~ mean|x| (a sum of C terms); rstd relative; out from both
   * errors: (|xhat| + r mean|x|) |w| + |b| + |out| */
  double *magm = xmalloc(N * 8), *magr = xmalloc(N * 8), *mago = xmalloc(n * 8);
  double *refm = xmalloc(N * 8), *refr = xmalloc(N * 8), *refo = xmalloc(n * 8);
  for (int i = 0; i < N; i++) {
    const float *xi = x + (size_t)i * C;
    double s = 0, a = 0, v = 0;
    for (int c = 0; c < C; c++) s += xi[c], a += fabs(xi[c]);
    const double m = s / C;
    for (int c = 0; c < C; c++) v += (xi[c] - m) * (xi[c] - m);
    const double r = 1.0 / sqrt(v / C + (double)1e-5f);
    refm[i] = m, refr[i] = r;
    magm[i] = a / C;
    magr[i] = r;
    for (int c = 0; c < C; c++) {
      const size_t k = (size_t)i * C + c;
      const double xh = (xi[c] - m) * r;
      refo[k] = xh * w[c] + b[c];
      mago[k] = (fabs(xh) + r * a / C) * fabs(w[c]) + fabs(b[c]) + fabs(refo[k]);
    }
  }
  check_tol("layernorm_fwd", "out", shape, go, out, NULL, NULL, mago, n, TOL_RED);
  check_tol("layernorm_fwd", "mean", shape, gm, mean, NULL, NULL, magm, N, TOL_RED);
  check_tol("layernorm_fwd", "rstd", shape, gr, rstd, NULL, NULL, magr, N, TOL_RED);
  check_tol("layernorm_fwd", "out-f64", shape, go, NULL, refo, NULL, mago, n, TOL_RED);
  check_tol("layernorm_fwd", "mean-f64", shape, gm, NULL, refm, NULL, magm, N, TOL_RED);
  check_tol("layernorm_fwd", "rstd-f64", shape, gr, NULL, refr, NULL, magr, N, TOL_RED);
  check_tol("layernorm_fwd", "cpu-out-f64", shape, out, NULL, refo, NULL, mago, n, TOL_RED);

  /* backward on the CPU's mean and rstd, from non-zero gradients */
  float *dout = frand(n, -1, 1), *dinp = frand(n, -1, 1), *dw = frand(C, -1, 1),
        *db = frand(C, -1, 1);
  double *magd = xmalloc(n * 8);
  for (int i = 0; i < N; i++) {
    const float *xi = x + (size_t)i * C, *di = dout + (size_t)i * C;
    const double m = mean[i], r = rstd[i];
    double ag = 0, agx = 0;
    for (int c = 0; c < C; c++) {
      ag += fabs((double)w[c] * di[c]);
      agx += fabs((double)w[c] * di[c] * (xi[c] - m) * r);
    }
    for (int c = 0; c < C; c++) {
      const size_t k = (size_t)i * C + c;
      const double xh = fabs((xi[c] - m) * r);
      /* dinp += r (w d - mean(w d) - xhat mean(w d xhat)): each sum off by
       * TOL_RED of its |terms|, plus the initial value */
      magd[k] = fabs(dinp[k]) + r * (fabs((double)w[c] * di[c]) + ag / C + xh * agx / C);
    }
  }
  float *ddout = dput(dout, n * 4), *ddinp = dput(dinp, n * 4), *ddw = dput(dw, C * 4),
        *ddb = dput(db, C * 4), *dm = dput(mean, N * 4), *dr = dput(rstd, N * 4);
  cpu->layernorm_bwd(dinp, dw, db, dout, x, w, mean, rstd, N, C);
  gpu->layernorm_bwd(ddinp, ddw, ddb, ddout, dx, dw_, dm, dr, N, C);
  float *g = dget(ddinp, n);
  check_tol("layernorm_bwd", "dinp", shape, g, dinp, NULL, NULL, magd, n, TOL_RED);
  free(g);
  check_dev_bits("layernorm_bwd", "dw", shape, ddw, dw, C);
  check_dev_bits("layernorm_bwd", "db", shape, ddb, db, C);
#ifdef KERN_CUDA_EMU
  /* forward and backward wide exactly where C is a multiple of 8 up to 1536
   * (the buffers are aligned): forward in one launch, backward in one a
   * block of LN_EMU_BWD_ROWS rows where the block's shared memory for its
   * K's widest C is given (2 x 8 rows of C floats; layernorm.cu) */
  const int wide = C % 8 == 0 && C <= 1536;
  const int k = (C / 8 + 31) / 32, kk = k <= 2 ? k : k <= 4 ? 4 : 6;
  const size_t cmax = 256 * kk < 1536 ? 256 * kk : 1536;
  const int wide_bwd = wide && 64 * cmax <= cuda_emu_smem_optin();
  const unsigned long want_bwd =
      wide_bwd ? (unsigned long)(N + LN_EMU_BWD_ROWS - 1) / LN_EMU_BWD_ROWS : 0;
  report("layernorm", "wide-launches", shape, 0, 0, "-", -1,
         ln_wide_launches(0) - fwd0 == (unsigned long)wide && ln_wide_launches(1) - bwd0 == want_bwd);
#endif

  gpu->dev_free(dx), gpu->dev_free(dw_), gpu->dev_free(db_), gpu->dev_free(dout_o);
  gpu->dev_free(dmean), gpu->dev_free(drstd), gpu->dev_free(ddout), gpu->dev_free(ddinp);
  gpu->dev_free(ddw), gpu->dev_free(ddb), gpu->dev_free(dm), gpu->dev_free(dr);
  free(x), free(w), free(b), free(out), free(mean), free(rstd), free(go), free(gm), free(gr);
  free(magm), free(magr), free(mago), free(refm), free(refr), free(refo);
  free(dout), free(dinp), free(dw), free(db), free(magd);
}

/* ---- matmul --------------------------------------------------------------- */

/* ld: the rows of the GPU's out and dout are ld >= OC apart (the LM head's
 * padded logits; the CPU's stay dense). with_bias 1: a bias, 2: a bias 4
 * bytes past a 16-byte boundary (matmul.cu adds that one in a pass of its
 * own, not in the product's BIAS epilogue) */
/* ---- w16: a weight's bf16 image, read by the bf16 products (kern.h) ---- */

/* w's bf16 image on the device: at a 16-byte boundary (off 0), or one
 * element past one (off 1, which kern.h says the products do not read: they
 * pack w); *base is the buffer to free */
static uint16_t *dput_w16(const float *w, size_t nw, int off, uint16_t **base) {
  uint16_t *h = xmalloc((nw + 1) * 2);
  h[0] = 0;
  cpu->f32_to_bf16(h + off, w, nw);
  *base = dput(h, (nw + (size_t)off) * 2);
  free(h);
  return *base + off;
}

/* matmul.cu's packing launches so far (on the emulator; 0 on a GPU) */
static unsigned long w16_packs(void) {
#ifdef KERN_CUDA_EMU
  return cuda_emu_launches("gemm_pack_kernel");
#else
  return 0;
#endif
}

/* A product given w16 (got, n floats) against the same product given w
 * alone (ref): the same operands, so ref's bits where the image is not
 * read (unread: off a 16-byte boundary, or rows of IC not a multiple of 8,
 * kern.h) or w's packing took one block (nw elements within the
 * packing buffer: the same products, cut the same), else within tol of
 * the CPU's product of the rounded operands (bf16ops, magnitudes mag).
 * On the emulator, packs (the w16 call's packing launches) fewer than
 * packs_w (the w call's), or as many where unread. */
static void check_w16(const char *op, const char *shape, int unread, size_t nw, const float *got,
                      const float *ref, const float *bf16ops, const float *mag, size_t n,
                      double tol, unsigned long packs, unsigned long packs_w) {
  if (unread || nw <= KERN_CUDA_SIZE_PACK_ELEMS)
    check_bits(op, unread ? "w16 unread=w" : "w16=w", shape, got, ref, n);
  else
    check_tol(op, "w16-bf16ops", shape, got, bf16ops, NULL, mag, NULL, n, tol);
#ifdef KERN_CUDA_EMU
  report(op, "w16-packs", shape, (double)packs, (double)packs_w, unread ? "=" : "<", -1,
         unread ? packs == packs_w : packs < packs_w);
#else
  (void)packs, (void)packs_w;
#endif
}

static void test_matmul(int N, int IC, int OC, int with_bias, int ld) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d IC=%d OC=%d%s", N, IC, OC,
           with_bias == 2 ? " bias+4B" : with_bias ? " bias" : "");
  if (ld != OC) snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " ld=%d", ld);
  const size_t ni = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
  float *inp = frand(ni, -1, 1), *w = frand(nw, -0.5f, 0.5f);
  float *bias = with_bias ? frand(OC, -1, 1) : NULL;
  float *out = xmalloc(no * 4), *mag = xmalloc(no * 4);
  cpu->matmul_fwd(out, inp, w, bias, N, IC, OC, OC);
  /* mag: sum |inp| |w| + |bias|, by the CPU on the absolute values */
  float *ainp = fabs_dup(inp, ni), *aw = fabs_dup(w, nw), *abias = bias ? fabs_dup(bias, OC) : NULL;
  cpu->matmul_fwd(mag, ainp, aw, abias, N, IC, OC, OC);
  float *dinp_ = dput(inp, ni * 4), *dw_ = dput(w, nw * 4),
        *dbias_base = NULL, *dbias_ = NULL;
  if (bias) {
    const int off = with_bias == 2; /* floats before the bias */
    float *staged = xmalloc((size_t)(OC + off) * 4);
    staged[0] = 0;
    memcpy(staged + off, bias, (size_t)OC * 4);
    dbias_base = dput(staged, (size_t)(OC + off) * 4);
    dbias_ = dbias_base + off;
    free(staged);
  }
  float *dout_o = dput_rows(NULL, N, OC, ld);
  gpu->matmul_fwd(dout_o, dinp_, dw_, dbias_, N, IC, OC, ld);
  float *g = dget_rows(dout_o, N, OC, ld, "matmul_fwd", "out", shape);
  check_tol("matmul_fwd", "out", shape, g, out, NULL, mag, NULL, no, tol_gemm);
  if (bf16_exact) {
    float *ri = round_dup(inp, ni, 1), *rw = round_dup(w, nw, 1), *ro = xmalloc(no * 4);
    cpu->matmul_fwd(ro, ri, rw, bias, N, IC, OC, OC);
    check_tol("matmul_fwd", "out-bf16ops", shape, g, ro, NULL, mag, NULL, no, TOL_GEMM);
    free(ri), free(rw), free(ro);
  }
  /* bf16 activations (kern.h: offered in the mode that packs, rows of a
   * multiple of 8): inp given rounded, the same operands as the packing's,
   * so the CPU's product of the rounded operands and the fp32 path's */
  uint16_t *d_i16 = NULL;
  const int acts16 = gpu->matmul_fwd_bf16 && IC % 8 == 0;
  if (acts16) {
    uint16_t *i16 = xmalloc(ni * 2);
    cpu->f32_to_bf16(i16, inp, ni);
    d_i16 = dput(i16, ni * 2);
    free(i16);
    float *ri = round_dup(inp, ni, 1), *rw = round_dup(w, nw, 1), *ro = xmalloc(no * 4);
    cpu->matmul_fwd(ro, ri, rw, bias, N, IC, OC, OC);
    float *o16 = dput_rows(NULL, N, OC, ld);
    const unsigned long p0 = w16_packs();
    gpu->matmul_fwd_bf16(o16, d_i16, dw_, NULL, dbias_, N, IC, OC, ld);
    const unsigned long packs_w = w16_packs() - p0;
    float *g16 = dget_rows(o16, N, OC, ld, "matmul_fwd_bf16", "out", shape);
    check_tol("matmul_fwd_bf16", "out-bf16ops", shape, g16, ro, NULL, mag, NULL, no, TOL_GEMM);
    check_tol("matmul_fwd_bf16", "out=fp32 path", shape, g16, g, NULL, mag, NULL, no, TOL_GEMM);
    for (int off = 0; off < 2; off++) { /* w's bf16 image: read (off 0), or not (1) */
      uint16_t *wbase, *d_w16 = dput_w16(w, nw, off, &wbase);
      const unsigned long p1 = w16_packs();
      gpu->matmul_fwd_bf16(o16, d_i16, dw_, d_w16, dbias_, N, IC, OC, ld);
      const unsigned long packs = w16_packs() - p1;
      float *gw = dget_rows(o16, N, OC, ld, "matmul_fwd_bf16", "out", shape);
      check_w16("matmul_fwd_bf16", shape, off, nw, gw, g16, ro, mag, no, TOL_GEMM, packs, packs_w);
      gpu->dev_free(wbase), free(gw);
    }
    gpu->dev_free(o16), free(g16), free(ri), free(rw), free(ro);
  }

  /* float64 on selected rows, both backends */
  int rows[MAX_PICK];
  const int nr = pick_rows(N, rows);
  double *ref = xmalloc((size_t)nr * OC * 8);
  float *gsel = xmalloc((size_t)nr * OC * 4), *csel = xmalloc((size_t)nr * OC * 4),
        *msel = xmalloc((size_t)nr * OC * 4);
  for (int r = 0; r < nr; r++)
    for (int o = 0; o < OC; o++) {
      const float *a = inp + (size_t)rows[r] * IC, *bw = w + (size_t)o * IC;
      double s = bias ? bias[o] : 0.0;
      for (int k = 0; k < IC; k++) s += (double)a[k] * bw[k];
      const size_t src = (size_t)rows[r] * OC + o, dst = (size_t)r * OC + o;
      ref[dst] = s, gsel[dst] = g[src], csel[dst] = out[src], msel[dst] = mag[src];
    }
  check_tol("matmul_fwd", "out-f64", shape, gsel, NULL, ref, msel, NULL, (size_t)nr * OC, tol_gemm);
  check_tol("matmul_fwd", "cpu-out-f64", shape, csel, NULL, ref, msel, NULL, (size_t)nr * OC,
            TOL_GEMM);
  free(g), free(ref), free(gsel), free(csel), free(msel);

  /* backward from non-zero gradients; mags by the CPU's backward on the
   * absolute values, into the absolute initial gradients */
  float *dout = frand(no, -1, 1), *dinp = frand(ni, -1, 1), *dw = frand(nw, -1, 1);
  float *dbias = bias ? frand(OC, -1, 1) : NULL;
  float *mdinp = fabs_dup(dinp, ni), *mdw = fabs_dup(dw, nw), *adout = fabs_dup(dout, no);
  cpu->matmul_bwd(mdinp, mdw, NULL, adout, ainp, aw, N, IC, OC, OC, 1);
  float *ddout = dput_rows(dout, N, OC, ld), *dd_inp = dput(dinp, ni * 4),
        *dd_w = dput(dw, nw * 4);
  float *dd_bias = bias ? dput(dbias, OC * 4) : NULL;
  float *e_inp = acts16 ? dput(dinp, ni * 4) : NULL, *e_w = acts16 ? dput(dw, nw * 4) : NULL;
  float *e_bias = acts16 && bias ? dput(dbias, OC * 4) : NULL;
  /* the same given w's bf16 image (w16) */
  float *f_inp = acts16 ? dput(dinp, ni * 4) : NULL, *f_w = acts16 ? dput(dw, nw * 4) : NULL;
  float *f_bias = acts16 && bias ? dput(dbias, OC * 4) : NULL;
  /* the bf16 operands' products, from the same initial gradients */
  float *xdinp = NULL, *xdw = NULL;
  if (bf16_exact) {
    float *rd = round_dup(dout, no, 1), *ri = round_dup(inp, ni, 1), *rw = round_dup(w, nw, 1);
    xdinp = round_dup(dinp, ni, 0), xdw = round_dup(dw, nw, 0);
    cpu->matmul_bwd(xdinp, xdw, NULL, rd, ri, rw, N, IC, OC, OC, 1);
    free(rd), free(ri), free(rw);
  }
  cpu->matmul_bwd(dinp, dw, dbias, dout, inp, w, N, IC, OC, OC, 1);
  gpu->matmul_bwd(dd_inp, dd_w, dd_bias, ddout, dinp_, dw_, N, IC, OC, ld, 1);
  unsigned long bwd_packs[2] = {0, 0}; /* the w call's, the w16 call's */
  uint16_t *w16base = NULL, *d_w16 = acts16 ? dput_w16(w, nw, 0, &w16base) : NULL;
  if (acts16) {
    const unsigned long p0 = w16_packs();
    gpu->matmul_bwd_bf16(e_inp, e_w, e_bias, ddout, NULL, d_i16, dw_, NULL, N, IC, OC, ld, 1);
    const unsigned long p1 = w16_packs();
    gpu->matmul_bwd_bf16(f_inp, f_w, f_bias, ddout, NULL, d_i16, dw_, d_w16, N, IC, OC, ld, 1);
    bwd_packs[0] = p1 - p0, bwd_packs[1] = w16_packs() - p1;
  }
  g = dget(dd_inp, ni);
  check_tol("matmul_bwd", "dinp", shape, g, dinp, NULL, mdinp, NULL, ni, tol_gemm);
  if (xdinp) check_tol("matmul_bwd", "dinp-bf16ops", shape, g, xdinp, NULL, mdinp, NULL, ni, TOL_GEMM);
  if (acts16) { /* the same products of the same operands as the fp32 path's */
    float *g16 = dget(e_inp, ni);
    check_tol("matmul_bwd_bf16", "dinp-bf16ops", shape, g16, xdinp, NULL, mdinp, NULL, ni, TOL_GEMM);
    check_tol("matmul_bwd_bf16", "dinp=fp32 path", shape, g16, g, NULL, mdinp, NULL, ni, TOL_GEMM);
    float *gw16 = dget(f_inp, ni);
    check_w16("matmul_bwd_bf16", shape, 0, nw, gw16, g16, xdinp, mdinp, ni, TOL_GEMM, bwd_packs[1],
              bwd_packs[0]);
    free(g16), free(gw16);
  }
  free(g);
  g = dget(dd_w, nw);
  check_tol("matmul_bwd", "dw", shape, g, dw, NULL, mdw, NULL, nw, tol_gemm);
  if (xdw) check_tol("matmul_bwd", "dw-bf16ops", shape, g, xdw, NULL, mdw, NULL, nw, TOL_GEMM);
  if (acts16) {
    float *g16 = dget(e_w, nw);
    check_tol("matmul_bwd_bf16", "dw-bf16ops", shape, g16, xdw, NULL, mdw, NULL, nw, TOL_GEMM);
    check_tol("matmul_bwd_bf16", "dw=fp32 path", shape, g16, g, NULL, mdw, NULL, nw, TOL_GEMM);
    /* dw reads no weight: the same products either way */
    check_dev_bits("matmul_bwd_bf16", "dw (w16)=w", shape, f_w, g16, nw);
    free(g16);
  }
  free(g), free(xdinp), free(xdw);
  if (bias) {
    g = dget(dd_bias, OC);
    check_bits("matmul_bwd", "dbias", shape, g, dbias, OC);
    free(g);
    if (e_bias) check_dev_bits("matmul_bwd_bf16", "dbias", shape, e_bias, dbias, OC);
    if (f_bias) check_dev_bits("matmul_bwd_bf16", "dbias (w16)", shape, f_bias, dbias, OC);
  }
  { /* acc 0: dinp written over dnew's NaNs (the joint bf16 path: dw given) */
    /* dw still accumulates, from the gradient the check above left */
    float *wd = xmalloc(ni * 4), *wdw = fdup(dw, nw), *m0 = xmalloc(ni * 4), *m0w = fabs_dup(dw, nw);
    for (size_t i = 0; i < ni; i++) wd[i] = NAN;
    cpu->matmul_bwd(wd, wdw, NULL, dout, inp, w, N, IC, OC, OC, 0);
    cpu->matmul_bwd(m0, m0w, NULL, adout, ainp, aw, N, IC, OC, OC, 0);
    float *dd_w0 = dput(dw, nw * 4), *dd_x0 = dnew(ni * 4);
    gpu->matmul_bwd(dd_x0, dd_w0, NULL, ddout, dinp_, dw_, N, IC, OC, ld, 0);
    g = dget(dd_x0, ni);
    check_tol("matmul_bwd", "dinp=", shape, g, wd, NULL, m0, NULL, ni, tol_gemm);
    if (acts16) { /* over NaNs too, against the fp32 path's */
      float *e_x0 = dnew(ni * 4), *e_w0 = dput(dw, nw * 4);
      gpu->matmul_bwd_bf16(e_x0, e_w0, NULL, ddout, NULL, d_i16, dw_, NULL, N, IC, OC, ld, 0);
      float *g16 = dget(e_x0, ni);
      check_tol("matmul_bwd_bf16", "dinp==fp32 path", shape, g16, g, NULL, m0, NULL, ni, TOL_GEMM);
      free(g16);
      float *gw = dget(dd_w0, nw);
      g16 = dget(e_w0, nw);
      check_tol("matmul_bwd_bf16", "dw+=,dinp==fp32 path", shape, g16, gw, NULL, m0w, NULL, nw,
                TOL_GEMM);
      free(g16), free(gw);
      gpu->dev_free(e_x0), gpu->dev_free(e_w0);
    }
    /* dinp in bf16 (kern.h's matmul_bwd_dinp16), inp in fp32 and in bf16:
     * each element a rounding from the fp32 path's dinp (2^-8 of its
     * magnitude: the rounding, and the fp32 path's other order of the sum
     * where it cuts OC into blocks) and within the bf16 products' bound of
     * the CPU's; dw as the fp32 path's; dbias the CPU's column sums, bit
     * for bit */
    if (gpu->matmul_bwd_dinp16 && IC % 8 == 0 && OC % 8 == 0 && ld == OC)
      for (int form = 0; form < 1 + acts16; form++) {
        const char *fw = form ? "dinp16 (inp16)" : "dinp16 (inp)";
        uint16_t *e_h = dnew(ni * 2), *got = xmalloc(ni * 2);
        float *e_w1 = dput(dw, nw * 4), *e_b1 = bias ? dput(dbias, OC * 4) : NULL;
        const unsigned long p0 = w16_packs();
        gpu->matmul_bwd_dinp16(e_h, e_w1, e_b1, ddout, form ? NULL : dinp_, form ? d_i16 : NULL,
                               dw_, NULL, N, IC, OC);
        const unsigned long p1 = w16_packs();
        gpu->copy_d2h(got, e_h, ni * 2);
        gpu->sync();
        { /* given w16: dinp16 and dw the w call's (the same blocks: kern.h) */
          uint16_t *e_h2 = dnew(ni * 2), *got2 = xmalloc(ni * 2);
          float *e_w2 = dput(dw, nw * 4), *e_b2 = bias ? dput(dbias, OC * 4) : NULL;
          const unsigned long p2 = w16_packs();
          gpu->matmul_bwd_dinp16(e_h2, e_w2, e_b2, ddout, form ? NULL : dinp_,
                                 form ? d_i16 : NULL, dw_, d_w16, N, IC, OC);
          const unsigned long p3 = w16_packs();
          gpu->copy_d2h(got2, e_h2, ni * 2);
          gpu->sync();
          float *a = xmalloc(ni * 4), *b = xmalloc(ni * 4);
          cpu->bf16_to_f32(a, got2, ni), cpu->bf16_to_f32(b, got, ni);
          check_w16("matmul_bwd_dinp16", shape, 0, nw, a, b, wd, m0, ni, TOL_GEMM_BF16, p3 - p2,
                    p1 - p0);
          float *gw1 = dget(e_w1, nw);
          check_dev_bits("matmul_bwd_dinp16", "dw (w16)=w", shape, e_w2, gw1, nw);
          gpu->dev_free(e_h2), gpu->dev_free(e_w2), gpu->dev_free(e_b2);
          free(got2), free(a), free(b), free(gw1);
        }
        float *gw = xmalloc(ni * 4);
        cpu->bf16_to_f32(gw, got, ni);
        check_tol("matmul_bwd_dinp16", fw, shape, gw, g, NULL, m0, NULL, ni, 0x1p-8);
        check_tol("matmul_bwd_dinp16", "dinp16-f32", shape, gw, wd, NULL, m0, NULL, ni,
                  TOL_GEMM_BF16);
        float *gw0 = dget(dd_w0, nw), *gw1 = dget(e_w1, nw);
        check_tol("matmul_bwd_dinp16", "dw+==fp32 path", shape, gw1, gw0, NULL, m0w, NULL, nw,
                  TOL_GEMM);
        if (bias) {
          float *cb = fdup(dbias, OC), *cx = xmalloc(ni * 4), *cw = xmalloc(nw * 4);
          cpu->matmul_bwd(cx, cw, cb, dout, inp, w, N, IC, OC, OC, 0);
          check_dev_bits("matmul_bwd_dinp16", "dbias+=", shape, e_b1, cb, OC);
          free(cb), free(cx), free(cw);
        }
        gpu->dev_free(e_h), gpu->dev_free(e_w1), gpu->dev_free(e_b1);
        free(got), free(gw), free(gw0), free(gw1);
      }
    free(g);
    g = dget(dd_w0, nw);
    check_tol("matmul_bwd", "dw+=,dinp=", shape, g, wdw, NULL, m0w, NULL, nw, tol_gemm);
    free(g), free(wd), free(wdw), free(m0), free(m0w);
    gpu->dev_free(dd_w0), gpu->dev_free(dd_x0);
  }
  gpu->dev_free(dinp_), gpu->dev_free(dw_), gpu->dev_free(dbias_base), gpu->dev_free(dout_o);
  gpu->dev_free(ddout), gpu->dev_free(dd_inp), gpu->dev_free(dd_w), gpu->dev_free(dd_bias);
  gpu->dev_free(d_i16), gpu->dev_free(e_inp), gpu->dev_free(e_w), gpu->dev_free(e_bias);
  gpu->dev_free(f_inp), gpu->dev_free(f_w), gpu->dev_free(f_bias), gpu->dev_free(w16base);
  free(inp), free(w), free(bias), free(out), free(mag), free(ainp), free(aw), free(abias);
  free(dout), free(dinp), free(dw), free(dbias), free(mdinp), free(mdw), free(adout);
}

/* ---- attention ------------------------------------------------------------ */

static double norm2(const float *x, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
  return sqrt(s);
}

/* Bounds on sum |terms| for attention forward, per (b, h): the scores of
 * query i are off by at most tol * S_i, S_i = scale |q_i| max_l |k_l|
 * (Cauchy-Schwarz on scale * sum |q k|), which moves a probability by at
 * most att_ij * 2 tol S_i (itself and the normaliser), so att_ij's mag is
 * att_ij (1 + 2 S_i); out_i = sum_j att_ij v_j then has mag (1 + 2 S_i)
 * max_j |v_jd| (the probabilities sum to 1). Entries above the diagonal get
 * mag 0: they must be exact zeros. */
static void attn_fwd_mags(float *mag_att, float *mag_out, const float *qkv, const float *att, int B,
                          int T, int C, int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * (size_t)C;
  const double scale = 1.0 / sqrt((double)hs);
  double *vmax = xmalloc(hs * 8);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
      double kn = 0;
      for (int d = 0; d < hs; d++) vmax[d] = 0;
      for (int l = 0; l < T; l++) {
        const double n = norm2(base + l * C3 + C, hs);
        if (n > kn) kn = n;
        for (int d = 0; d < hs; d++)
          if (fabs(base[l * C3 + 2 * C + d]) > vmax[d]) vmax[d] = fabs(base[l * C3 + 2 * C + d]);
      }
      for (int i = 0; i < T; i++) {
        const double f = 1 + 2 * scale * norm2(base + i * C3, hs) * kn;
        const size_t row = (((size_t)b * NH + h) * T + i) * T;
        for (int j = 0; j < T; j++) mag_att[row + j] = (float)(att[row + j] * f);
        for (int d = 0; d < hs; d++)
          mag_out[((size_t)b * T + i) * C + (size_t)h * hs + d] = (float)(f * vmax[d]);
      }
    }
  free(vmax);
}

/* Backward's bounds, per (b, h), with D_i = |dout_i| max_j |v_j| bounding
 * every |datt_ij| and |sum_j att_ij datt_ij|: dpre_ij = att_ij (datt_ij - s_i)
 * has mag 2 att_ij D_i, so dq_i (scale sum_j dpre_ij k_j) has mag scale 2 D_i
 * max_j |k_jd|, dk_j has scale 2 max_i |q_id| sum_i att_ij D_i, and dv_j
 * (sum_i att_ij dout_i) has sum_i att_ij max_i |dout_id|; each plus the
 * initial gradient's magnitude. */
static void attn_bwd_mags(float *mag, const float *dqkv0, const float *qkv, const float *att,
                          const float *dout, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * (size_t)C;
  const double scale = 1.0 / sqrt((double)hs);
  double *qmax = xmalloc(hs * 8), *kmax = xmalloc(hs * 8), *omax = xmalloc(hs * 8);
  double *D = xmalloc(T * 8), *colsum = xmalloc(T * 8), *wsum = xmalloc(T * 8);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs;
      const float *db = dout + (size_t)b * T * C + (size_t)h * hs;
      const float *a = att + ((size_t)b * NH + h) * T * T;
      double vn = 0;
      for (int d = 0; d < hs; d++) qmax[d] = kmax[d] = omax[d] = 0;
      for (int l = 0; l < T; l++) {
        const double n = norm2(base + l * C3 + 2 * C, hs);
        if (n > vn) vn = n;
        for (int d = 0; d < hs; d++) {
          qmax[d] = fmax(qmax[d], fabs(base[l * C3 + d]));
          kmax[d] = fmax(kmax[d], fabs(base[l * C3 + C + d]));
          omax[d] = fmax(omax[d], fabs(db[l * (size_t)C + d]));
        }
      }
      for (int i = 0; i < T; i++) D[i] = norm2(db + i * (size_t)C, hs) * vn;
      for (int j = 0; j < T; j++) colsum[j] = wsum[j] = 0;
      for (int i = 0; i < T; i++)
        for (int j = 0; j <= i; j++) {
          colsum[j] += a[(size_t)i * T + j];
          wsum[j] += a[(size_t)i * T + j] * D[i];
        }
      for (int i = 0; i < T; i++)
        for (int d = 0; d < hs; d++) {
          const size_t k = ((size_t)b * T + i) * C3 + (size_t)h * hs + d;
          mag[k] = (float)(fabs(dqkv0[k]) + scale * 2 * D[i] * kmax[d]);
          mag[k + C] = (float)(fabs(dqkv0[k + C]) + scale * 2 * qmax[d] * wsum[i]);
          mag[k + 2 * C] = (float)(fabs(dqkv0[k + 2 * C]) + colsum[i] * omax[d]);
        }
    }
  free(qmax), free(kmax), free(omax), free(D), free(colsum), free(wsum);
}

/* float64 attention forward for query i of (b, h): att_row (T), out_row (hs) */
static void attn_ref_row(double *att_row, double *out_row, const float *qkv, int b, int h, int i,
                         int T, int C, int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * (size_t)C;
  const double scale = 1.0 / sqrt((double)hs);
  const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs, *q = base + i * C3;
  double mx = -INFINITY, s = 0;
  for (int j = 0; j < T; j++) {
    att_row[j] = 0;
    if (j > i) continue;
    double dot = 0;
    for (int d = 0; d < hs; d++) dot += (double)q[d] * base[j * C3 + C + d];
    att_row[j] = dot * scale;
    if (att_row[j] > mx) mx = att_row[j];
  }
  for (int j = 0; j <= i; j++) s += att_row[j] = exp(att_row[j] - mx);
  for (int j = 0; j <= i; j++) att_row[j] /= s;
  for (int d = 0; d < hs; d++) {
    double o = 0;
    for (int j = 0; j <= i; j++) o += att_row[j] * base[j * C3 + 2 * C + d];
    out_row[d] = o;
  }
}

/* Every query row's probabilities in float64, rounded (att: B,NH,T,T): what
 * the magnitudes are taken from and the products' path's backward reads (the
 * CPU keeps a log-sum-exp a row, not these). */
static void attn_probs(float *att, const float *qkv, int B, int T, int C, int NH) {
  double *row = xmalloc((size_t)T * 8), *o = xmalloc((size_t)(C / NH) * 8);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        attn_ref_row(row, o, qkv, b, h, i, T, C, NH);
        float *a = att + (((size_t)b * NH + h) * T + i) * T;
        for (int j = 0; j < T; j++) a[j] = (float)row[j];
      }
  free(row), free(o);
}

/* The fused kernel's log-sum-exp of query i of (b, h) (the scaled scores of
 * keys 0..i) in float64, and its mag: 1 + 2 S_i as attn_fwd_mags (a score
 * off by tol S_i moves the log-sum-exp by at most that) plus |lse|. */
static double attn_ref_lse(double *mag, const float *qkv, int b, int h, int i, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * (size_t)C;
  const double scale = 1.0 / sqrt((double)hs);
  const float *base = qkv + (size_t)b * T * C3 + (size_t)h * hs, *q = base + i * C3;
  double mx = -INFINITY, s = 0, kn = 0;
  for (int j = 0; j < T; j++) kn = fmax(kn, norm2(base + j * C3 + C, hs));
  double *sc = xmalloc((size_t)(i + 1) * 8);
  for (int j = 0; j <= i; j++) {
    double dot = 0;
    for (int d = 0; d < hs; d++) dot += (double)q[d] * base[j * C3 + C + d];
    sc[j] = dot * scale;
    mx = fmax(mx, sc[j]);
  }
  for (int j = 0; j <= i; j++) s += exp(sc[j] - mx);
  free(sc);
  const double lse = mx + log(s);
  *mag = 1 + 2 * scale * norm2(q, hs) * kn + fabs(lse);
  return lse;
}

static void test_attention(int B, int T, int C, int NH) {
  char shape[64];
  snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d", B, T, C, NH);
  const int hs = C / NH;
  const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
  const size_t nrows = (size_t)B * NH * T;
  /* what the GPU keeps: a log-sum-exp per row where a fused kernel is built
   * for the head size (unless the mode asks for the products), else the
   * probabilities */
  const int fused = !attn_gemm && (hs == 16 || hs == 32 || hs == 64 || hs == 128);
  const size_t nga = gpu->attention_saved(B, T, C, NH);
  /* the scratch: D rows fused, and on tensor cores then (at a 16-byte
   * boundary) bf16 copies of qkv and dout, 4C bf16 a token */
  const size_t nsc = !fused ? (size_t)NH * T * T
                     : attn_tc ? ((nrows + 3) & ~(size_t)3) + (size_t)B * T * 4 * C / 2 : nrows;
  report("attention", fused ? "fused sizes" : "gemm sizes", shape, 0, 0, "-", -1,
         nga == (fused ? nrows : na) && gpu->attention_scratch(B, T, C, NH) == nsc);
  float *qkv = frand(nq, -1, 1), *out = xmalloc(no * 4), *att = xmalloc(na * 4);
  const size_t ns = cpu->attention_scratch(B, T, C, NH), nsg = gpu->attention_scratch(B, T, C, NH);
  float *clse = xmalloc(nrows * 4), *scratch = xmalloc(ns * 4);
  report("attention", "cpu keeps a log-sum-exp a row", shape, 0, 0, "-", -1,
         cpu->attention_saved(B, T, C, NH) == nrows);
  cpu->attention_fwd(out, clse, scratch, qkv, B, T, C, NH);
  attn_probs(att, qkv, B, T, C, NH);
  float *d_qkv = dput(qkv, nq * 4), *dout_o = dnew(no * 4), *datt = dnew(nga * 4);
  float *d_scratch = dnew((nsg ? nsg : 1) * 4);
  gpu->attention_fwd(dout_o, datt, d_scratch, d_qkv, B, T, C, NH);
  float *go = dget(dout_o, no), *ga = dget(datt, nga);
  float *mag_att = xmalloc(na * 4), *mag_out = xmalloc(no * 4);
  attn_fwd_mags(mag_att, mag_out, qkv, att, B, T, C, NH);
  if (!fused) check_tol("attention_fwd", "att", shape, ga, att, NULL, mag_att, NULL, na, tol_gemm);
  check_tol("attention_fwd", "out", shape, go, out, NULL, mag_out, NULL, no, tol_gemm);

  /* float64 on selected query rows of every (b, h) */
  int rows[MAX_PICK];
  const int nr = pick_rows(T, rows);
  const size_t nsa = (size_t)B * NH * nr * T, nso = (size_t)B * NH * nr * hs;
  double *ra = xmalloc(nsa * 8), *ro = xmalloc(nso * 8);
  float *gsa = xmalloc(nsa * 4), *msa = xmalloc(nsa * 4);
  float *gso = xmalloc(nso * 4), *cso = xmalloc(nso * 4), *mso = xmalloc(nso * 4);
  size_t ka = 0, ko = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int r = 0; r < nr; r++) {
        const int i = rows[r];
        attn_ref_row(ra + ka, ro + ko, qkv, b, h, i, T, C, NH);
        const size_t arow = (((size_t)b * NH + h) * T + i) * T;
        for (int j = 0; j < T; j++, ka++)
          gsa[ka] = fused ? att[arow + j] : ga[arow + j], msa[ka] = mag_att[arow + j];
        const size_t orow = ((size_t)b * T + i) * C + (size_t)h * hs;
        for (int d = 0; d < hs; d++, ko++)
          gso[ko] = go[orow + d], cso[ko] = out[orow + d], mso[ko] = mag_out[orow + d];
      }
  if (!fused) check_tol("attention_fwd", "att-f64", shape, gsa, NULL, ra, msa, NULL, nsa, tol_gemm);
  check_tol("attention_fwd", "out-f64", shape, gso, NULL, ro, mso, NULL, nso, tol_gemm);
  check_tol("attention_fwd", "cpu-out-f64", shape, cso, NULL, ro, mso, NULL, nso, TOL_GEMM);
  free(ra), free(ro), free(gsa), free(msa), free(gso), free(cso), free(mso);
  { /* the log-sum-exp of the selected rows against float64: the CPU's, and
     * the fused kernel's */
    const size_t nl = (size_t)B * NH * nr;
    double *rl = xmalloc(nl * 8), *ml = xmalloc(nl * 8);
    float *gl = xmalloc(nl * 4), *cl = xmalloc(nl * 4);
    size_t kl = 0;
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++)
        for (int r = 0; r < nr; r++, kl++) {
          rl[kl] = attn_ref_lse(&ml[kl], qkv, b, h, rows[r], T, C, NH);
          gl[kl] = fused ? ga[((size_t)b * NH + h) * T + rows[r]] : 0;
          cl[kl] = clse[((size_t)b * NH + h) * T + rows[r]];
        }
    if (fused) check_tol("attention_fwd", "lse-f64", shape, gl, NULL, rl, NULL, ml, nl, tol_gemm);
    check_tol("attention_fwd", "cpu-lse-f64", shape, cl, NULL, rl, NULL, ml, nl, TOL_GEMM);
    free(rl), free(ml), free(gl), free(cl);
  }

  /* backward from a non-zero dqkv: the CPU on its own log-sum-exps, the GPU
   * on what its forward kept (the products' path reads the float64
   * probabilities, rounded, so its check is of backward alone) */
  float *dout = frand(no, -1, 1), *dqkv = frand(nq, -1, 1), *mag = xmalloc(nq * 4);
  attn_bwd_mags(mag, dqkv, qkv, att, dout, B, T, C, NH);
  float *d_att = fused ? datt : dput(att, na * 4), *d_dout = dput(dout, no * 4);
  float *d_dqkv = dput(dqkv, nq * 4);
  cpu->attention_bwd(dqkv, scratch, dout, qkv, out, clse, B, T, C, NH, 1);
  gpu->attention_bwd(d_dqkv, d_scratch, d_dout, d_qkv, dout_o, d_att, B, T, C, NH, 1);
  float *g = dget(d_dqkv, nq);
  check_tol("attention_bwd", "dqkv", shape, g, dqkv, NULL, mag, NULL, nq, tol_gemm);
  free(g);
  { /* acc 0: dqkv written over dnew's NaNs, each element (the tensor-core
     * kernels store each once; the others accumulate into zeros) */
    float *w0 = xmalloc(nq * 4), *z = xmalloc(nq * 4), *m0 = xmalloc(nq * 4);
    for (size_t i = 0; i < nq; i++) w0[i] = NAN, z[i] = 0.0f;
    cpu->attention_bwd(w0, scratch, dout, qkv, out, clse, B, T, C, NH, 0);
    attn_bwd_mags(m0, z, qkv, att, dout, B, T, C, NH);
    float *d_w0 = dnew(nq * 4);
    gpu->attention_bwd(d_w0, d_scratch, d_dout, d_qkv, dout_o, d_att, B, T, C, NH, 0);
    g = dget(d_w0, nq);
    check_tol("attention_bwd", "dqkv=", shape, g, w0, NULL, m0, NULL, nq, tol_gemm);
    free(g), free(w0), free(z), free(m0);
    gpu->dev_free(d_w0);
  }
  gpu->dev_free(d_qkv), gpu->dev_free(dout_o), gpu->dev_free(datt);
  if (!fused) gpu->dev_free(d_att);
  gpu->dev_free(d_dout), gpu->dev_free(d_dqkv), gpu->dev_free(d_scratch);
  free(qkv), free(out), free(att), free(go), free(ga), free(mag_att), free(mag_out);
  free(dout), free(dqkv), free(mag), free(scratch), free(clse);
}

/* kern.h's attention with qkv kept in bf16 (the tensor-core mode's table):
 * where attention_bf16_fits, forward's bf16 out attention_fwd's rounded
 * and its saved rows attention_fwd's, bit for bit, backward's dqkv
 * attention_bwd's given that out widened, and qkv16 qkv rounded
 * (f32_to_bf16's bits); backward reads qkv16 and out16 alone (the fp32
 * qkv and out are poisoned with NaNs first); their scratch attention_scratch_bf16's
 * (the D rows and dout's copy: C / 2 floats a token, not 2 C), the rest of
 * attention_scratch's room left as it was */
static void test_attention_bf16(int B, int T, int C, int NH) {
  char shape[64];
  snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d", B, T, C, NH);
  const int fits = gpu->attention_bf16_fits(C, NH), hs = C / NH;
  report("attention_bf16", "fits", shape, 0, 0, "-", -1, fits == (hs == 16 || hs == 32 || hs == 64));
  if (!fits) return;
  const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
  const size_t ns = gpu->attention_scratch(B, T, C, NH), na = gpu->attention_saved(B, T, C, NH);
  float *qkv = frand(nq, -2, 2), *dout = frand(no, -1, 1);
  float *d_qkv = dput(qkv, nq * 4), *d_dout = dput(dout, no * 4), *sc = dnew(ns * 4 + 4);
  float *o32 = dnew(no * 4), *a32 = dnew(na * 4), *a16 = dnew(na * 4);
  float *g32 = dnew(nq * 4), *g16 = dnew(nq * 4);
  uint16_t *q16 = dnew(nq * 2), *o16 = dnew(no * 2);
  const size_t ns16 = gpu->attention_scratch_bf16(B, T, C, NH);
  const size_t rows4 = ((size_t)B * NH * T + 3) & ~(size_t)3;
  report("attention_bf16", "scratch size", shape, 0, 0, "-", -1,
         ns16 == rows4 + (size_t)B * T * C / 2 && ns == rows4 + (size_t)B * T * 2 * C);
  float *pad = xmalloc(ns * 4), *sc16 = dnew(ns * 4);
  memset(pad, PAD_BYTE, ns * 4);
  gpu->copy_h2d(sc16 + ns16, pad, (ns - ns16) * 4);
  gpu->attention_fwd(o32, a32, sc, d_qkv, B, T, C, NH);
  gpu->attention_fwd_bf16(o16, a16, sc16, d_qkv, q16, B, T, C, NH);
  float *want_o = dget(o32, no), *want_a = dget(a32, na);
  /* out in bf16: attention_fwd's rounded (the casts' bits) */
  uint16_t *want_o16 = xmalloc(no * 2), *got_o16 = xmalloc(no * 2);
  cpu->f32_to_bf16(want_o16, want_o, no);
  gpu->copy_d2h(got_o16, o16, no * 2);
  gpu->sync();
  check_bits_u16("attention_fwd_bf16", "out16=bf16(attention_fwd's)", shape, got_o16, want_o16, no);
  check_dev_bits("attention_fwd_bf16", "lse=attention_fwd's", shape, a16, want_a, na);
  uint16_t *want_q = xmalloc(nq * 2), *got_q = xmalloc(nq * 2);
  cpu->f32_to_bf16(want_q, qkv, nq);
  gpu->copy_d2h(got_q, q16, nq * 2);
  gpu->sync();
  check_bits_u16("attention_fwd_bf16", "qkv16=bf16(qkv)", shape, got_q, want_q, nq);
  { /* qkv NULL: qkv16 as its product wrote it (here, as forward rounded it
     * above) is read, not written: the same out16 and lse bits */
    uint16_t *o16b = dnew(no * 2), *got_b = xmalloc(no * 2);
    float *a16b = dnew(na * 4);
    gpu->attention_fwd_bf16(o16b, a16b, sc16, NULL, q16, B, T, C, NH);
    gpu->copy_d2h(got_b, o16b, no * 2);
    gpu->sync();
    check_bits_u16("attention_fwd_bf16", "out16 (qkv16 given)", shape, got_b, got_o16, no);
    check_dev_bits("attention_fwd_bf16", "lse (qkv16 given)", shape, a16b, want_a, na);
    uint16_t *again = xmalloc(nq * 2);
    gpu->copy_d2h(again, q16, nq * 2);
    gpu->sync();
    check_bits_u16("attention_fwd_bf16", "qkv16 untouched", shape, again, want_q, nq);
    gpu->dev_free(o16b), gpu->dev_free(a16b), free(got_b), free(again);
  }
  /* backward against attention_bwd's given out16 widened as its out: D =
   * dout . out from the same values in the same order */
  float *o16w = xmalloc(no * 4);
  cpu->bf16_to_f32(o16w, want_o16, no);
  gpu->copy_h2d(o32, o16w, no * 4);
  gpu->attention_bwd(g32, sc, d_dout, d_qkv, o32, a32, B, T, C, NH, 0);
  float *want_g = dget(g32, nq);
  gpu->dev_set(d_qkv, 0xff, nq * 4); /* NaNs: backward must not read the fp32 qkv */
  gpu->dev_set(o32, 0xff, no * 4);   /* nor the fp32 out */
  gpu->attention_bwd_bf16(g16, sc16, d_dout, NULL, q16, o16, a32, B, T, C, NH, 0);
  check_dev_bits("attention_bwd_bf16", "dqkv=attention_bwd's", shape, g16, want_g, nq);
  { /* dout given in bf16 (as matmul_bwd_dinp16 writes it): the fp32 form's
     * bits, which round dout the same way first; the fp32 dout poisoned */
    uint16_t *h16 = xmalloc(no * 2), *d_h16;
    cpu->f32_to_bf16(h16, dout, no);
    d_h16 = dput(h16, no * 2);
    gpu->dev_set(d_dout, 0xff, no * 4);
    gpu->attention_bwd_bf16(g16, sc16, NULL, d_h16, q16, o16, a32, B, T, C, NH, 0);
    check_dev_bits("attention_bwd_bf16", "dqkv(dout16)=attention_bwd's", shape, g16, want_g, nq);
    /* the gradients in bf16: those rounded (the casts' bits), from dout16
     * and from the fp32 dout (here poisoned: given again) */
    uint16_t *want16 = xmalloc(nq * 2), *got16 = xmalloc(nq * 2), *d_g16 = dnew(nq * 2);
    cpu->f32_to_bf16(want16, want_g, nq);
    for (int form = 0; form < 2; form++) {
      if (form) gpu->copy_h2d(d_dout, dout, no * 4);
      gpu->dev_set(d_g16, 0xff, nq * 2);
      gpu->attention_bwd_dqkv16(d_g16, sc16, form ? d_dout : NULL, form ? NULL : d_h16, q16, o16,
                                a32, B, T, C, NH);
      gpu->copy_d2h(got16, d_g16, nq * 2);
      gpu->sync();
      check_bits_u16("attention_bwd_dqkv16", form ? "dqkv16=bf16(attention_bwd's)"
                                                  : "dqkv16(dout16)=bf16(attention_bwd's)",
                     shape, got16, want16, nq);
    }
    gpu->dev_free(d_h16), gpu->dev_free(d_g16), free(h16), free(want16), free(got16);
  }
  check_dev_bits("attention_bf16", "scratch past attention_scratch_bf16", shape, sc16 + ns16, pad,
                 ns - ns16);
  gpu->dev_free(sc16), free(pad);
  gpu->dev_free(d_qkv), gpu->dev_free(d_dout), gpu->dev_free(sc), gpu->dev_free(o32);
  gpu->dev_free(a32), gpu->dev_free(o16), gpu->dev_free(a16), gpu->dev_free(g32);
  gpu->dev_free(g16), gpu->dev_free(q16);
  free(qkv), free(dout), free(want_o), free(want_a), free(want_q), free(got_q), free(want_g);
  free(want_o16), free(got_o16), free(o16w);
}

/* FSDP_CUDA_ATTN_CUDNN (kern_cuda_opts_t.attn_cudnn): the bf16 attention
 * ops by cuDNN's fused flash attention (kernels/cuda/cudnn.cu), against
 * float64 on qkv (and dout) rounded to bf16, as both GPU paths compute from:
 * out16 within the bf16 products' bound of attn_fwd_mags' (plus out's own
 * bf16 rounding), each row's log-sum-exp within it of attn_ref_lse's, dqkv
 * (acc 0, written whole over NaNs, with dout in fp32 and in bf16) within it
 * of attn_bwd_mags' around the CPU's fp32 attention given out16 widened,
 * and qkv16 qkv rounded (f32_to_bf16's bits). */
static int cudnn_g16; /* kern_cudnn_bwd16: backward's gradients asked for in bf16 */

static void test_attention_cudnn(int B, int T, int C, int NH) {
  char shape[64];
  snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d", B, T, C, NH);
  const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nr = (size_t)B * NH * T;
  const size_t na = nr * T, ns = gpu->attention_scratch_bf16(B, T, C, NH);
  float *qkv = frand(nq, -2, 2), *dout = frand(no, -1, 1), *qr = xmalloc(nq * 4), *dr = xmalloc(no * 4);
  uint16_t *q16h = xmalloc(nq * 2), *d16h = xmalloc(no * 2);
  cpu->f32_to_bf16(q16h, qkv, nq), cpu->bf16_to_f32(qr, q16h, nq);
  cpu->f32_to_bf16(d16h, dout, no), cpu->bf16_to_f32(dr, d16h, no);
  float *d_qkv = dput(qkv, nq * 4), *d_dout = dput(dout, no * 4), *sc = dnew(ns * 4);
  float *lse = dnew(nr * 4), *g = dnew(nq * 4);
  uint16_t *q16 = dnew(nq * 2), *o16 = dnew(no * 2), *d_d16 = dput(d16h, no * 2);
  gpu->attention_fwd_bf16(o16, lse, sc, d_qkv, q16, B, T, C, NH);
  /* cuDNN ran both passes (a shape it has no plan for runs the kernels,
   * which the bounds below would pass too) */
  /* (bwd 2: the bf16 plan attention_bwd_dqkv16 asks for, training's) */
  for (int bwd = 0; bwd <= (cudnn_g16 ? 1 : 2); bwd++) {
    char why[512] = "";
    size_t ws = 0;
    long engine = -1;
    int g16 = 0;
    const int planned = kern_cudnn_sdpa_plan(
        !bwd ? KERN_CUDNN_FWD : cudnn_g16 || bwd == 2 ? KERN_CUDNN_BWD16 : KERN_CUDNN_BWD, B, T, C,
        NH, &ws, &engine, &g16, why, sizeof why);
    char what[64];
    snprintf(what, sizeof what, "%s planned: engine %ld%s",
             bwd == 2 ? "backward (dqkv16)" : bwd ? "backward" : "forward", engine,
             bwd && g16 ? ", bf16 gradients" : "");
    report("attention_bf16 (cuDNN)", what, shape, 0, 0, "-", -1, planned);
    if (!planned) printf("test_cuda_kernels:   cuDNN: %s\n", why);
  }
  uint16_t *got_q = xmalloc(nq * 2), *got_o16 = xmalloc(no * 2);
  gpu->copy_d2h(got_q, q16, nq * 2);
  gpu->copy_d2h(got_o16, o16, no * 2);
  gpu->sync();
  check_bits_u16("attention_fwd_bf16 (cuDNN)", "qkv16=bf16(qkv)", shape, got_q, q16h, nq);
  /* forward against float64 on the rounded qkv */
  float *att = xmalloc(na * 4), *mag_att = xmalloc(na * 4), *mag_out = xmalloc(no * 4);
  float *o = xmalloc(no * 4), *ref_o = xmalloc(no * 4), *rl = xmalloc(nr * 4), *ml = xmalloc(nr * 4);
  attn_probs(att, qr, B, T, C, NH);
  attn_fwd_mags(mag_att, mag_out, qr, att, B, T, C, NH);
  double *row = xmalloc((size_t)T * 8), *orow = xmalloc((size_t)(C / NH) * 8);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        attn_ref_row(row, orow, qr, b, h, i, T, C, NH);
        for (int d = 0; d < C / NH; d++) {
          const size_t k = ((size_t)b * T + i) * C + (size_t)h * (C / NH) + d;
          ref_o[k] = (float)orow[d];
          /* plus out's own rounding to bf16 (at most 2^-9 |out|), 2^-7 |out| */
          mag_out[k] += fabsf(ref_o[k]) / (float)TOL_GEMM_BF16 / 128;
        }
        double m;
        const size_t r = ((size_t)b * NH + h) * T + i;
        rl[r] = (float)attn_ref_lse(&m, qr, b, h, i, T, C, NH);
        ml[r] = (float)m;
      }
  cpu->bf16_to_f32(o, got_o16, no);
  check_tol("attention_fwd_bf16 (cuDNN)", "out16-f64", shape, o, ref_o, NULL, mag_out, NULL, no,
            TOL_GEMM_BF16);
  float *got_l = dget(lse, nr);
  check_tol("attention_fwd_bf16 (cuDNN)", "lse-f64", shape, got_l, rl, NULL, ml, NULL, nr,
            TOL_GEMM_BF16);
  /* backward against the CPU's fp32 attention given out16 widened (D =
   * dout . out from the same out) and its own log-sum-exps */
  float *want = xmalloc(nq * 4), *zero = xmalloc(nq * 4), *mag = xmalloc(nq * 4);
  float *cs = xmalloc(cpu->attention_scratch(B, T, C, NH) * 4 + 4), *clse = xmalloc(nr * 4);
  float *o_cpu = xmalloc(no * 4);
  cpu->attention_fwd(o_cpu, clse, cs, qr, B, T, C, NH);
  cpu->attention_bwd(want, cs, dr, qr, o, clse, B, T, C, NH, 0);
  memset(zero, 0, nq * 4);
  attn_bwd_mags(mag, zero, qr, att, dr, B, T, C, NH);
  for (int form = 0; form < 2; form++) { /* dout in fp32, then in bf16 */
    gpu->dev_set(g, 0xff, nq * 4);          /* NaNs: written whole */
    gpu->dev_set(d_qkv, 0xff, nq * 4);      /* backward reads qkv16 alone */
    gpu->attention_bwd_bf16(g, sc, form ? NULL : d_dout, form ? d_d16 : NULL, q16, o16, lse, B, T,
                            C, NH, 0);
    float *got = dget(g, nq);
    check_tol("attention_bwd_bf16 (cuDNN)", form ? "dqkv(dout16)" : "dqkv", shape, got, want,
              NULL, mag, NULL, nq, TOL_GEMM_BF16);
    if (form) { /* said, not checked: whether cuDNN's engine gives the same bits again (the
                 * kernels do; cuDNN's dq may be summed by atomics) */
      gpu->attention_bwd_bf16(g, sc, NULL, d_d16, q16, o16, lse, B, T, C, NH, 0);
      float *again = dget(g, nq);
      size_t differ = 0;
      for (size_t i = 0; i < nq; i++) differ += memcmp(&got[i], &again[i], sizeof(float)) != 0;
      printf("test_cuda_kernels: attention_bwd_bf16 (cuDNN) %s: run again, %zu of %zu elements "
             "of dqkv differ (%s)\n", shape, differ, nq, differ ? "not deterministic" : "the same bits");
      free(again);
    }
    free(got);
  }
  { /* the gradients in bf16 (attention_bwd_dqkv16: cuDNN's bf16 plan, where
     * it has one, else the kernels): within the bound plus their rounding */
    uint16_t *d_g16 = dnew(nq * 2), *h16 = xmalloc(nq * 2);
    float *got = xmalloc(nq * 4), *mag16 = xmalloc(nq * 4);
    for (size_t i = 0; i < nq; i++) mag16[i] = mag[i] + fabsf(want[i]) / (float)TOL_GEMM_BF16 / 128;
    gpu->attention_bwd_dqkv16(d_g16, sc, NULL, d_d16, q16, o16, lse, B, T, C, NH);
    gpu->copy_d2h(h16, d_g16, nq * 2);
    gpu->sync();
    cpu->bf16_to_f32(got, h16, nq);
    check_tol("attention_bwd_dqkv16 (cuDNN)", "dqkv16(dout16)", shape, got, want, NULL, mag16, NULL,
              nq, TOL_GEMM_BF16);
    gpu->dev_free(d_g16), free(h16), free(got), free(mag16);
  }
  gpu->dev_free(d_qkv), gpu->dev_free(d_dout), gpu->dev_free(sc), gpu->dev_free(lse);
  gpu->dev_free(g), gpu->dev_free(q16), gpu->dev_free(o16), gpu->dev_free(d_d16);
  free(qkv), free(dout), free(qr), free(dr), free(q16h), free(d16h), free(got_q), free(got_o16);
  free(att), free(mag_att), free(mag_out), free(o), free(ref_o), free(rl), free(ml), free(row);
  free(orow), free(got_l), free(want), free(zero), free(mag), free(cs), free(clse), free(o_cpu);
}

/* ---- gelu, residual ------------------------------------------------------- */

static void test_gelu(size_t n) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  float *x = frand(n, -6, 6);
  const float special[] = {0.0f, -0.0f, 1e-30f, -10.5f, 10.5f, 3e38f, -3e38f, INFINITY, -INFINITY};
  for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++) x[i] = special[i];
  float *y = xmalloc(n * 4);
  cpu->gelu_fwd(y, x, n);
  float *dx = dput(x, n * 4), *dy = dnew(n * 4);
  gpu->gelu_fwd(dy, dx, n);
  float *g = dget(dy, n);
  check_bits("gelu_fwd", "out", shape, g, y, n);
  free(g);
  float *dout = frand(n, -1, 1), *dinp = frand(n, -1, 1);
  float *ddout = dput(dout, n * 4), *ddinp = dput(dinp, n * 4);
  cpu->gelu_bwd(dinp, x, dout, n, 1);
  gpu->gelu_bwd(ddinp, dx, ddout, n, 1);
  check_dev_bits("gelu_bwd", "dinp", shape, ddinp, dinp, n);
  float *w0 = xmalloc(n * 4), *d_w0 = dnew(n * 4); /* acc 0: written over NaNs */
  for (size_t i = 0; i < n; i++) w0[i] = NAN;
  cpu->gelu_bwd(w0, x, dout, n, 0);
  gpu->gelu_bwd(d_w0, dx, ddout, n, 0);
  check_dev_bits("gelu_bwd", "dinp=", shape, d_w0, w0, n);
  gpu->dev_free(d_w0), free(w0);
  gpu->dev_free(dx), gpu->dev_free(dy), gpu->dev_free(ddout), gpu->dev_free(ddinp);
  free(x), free(y), free(dout), free(dinp);
}

static void test_residual(size_t n) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  float *a = frand(n, -2, 2), *b = frand(n, -2, 2), *out = xmalloc(n * 4);
  cpu->residual_fwd(out, a, b, n);
  float *da_ = dput(a, n * 4), *db_ = dput(b, n * 4), *dout_o = dnew(n * 4);
  gpu->residual_fwd(dout_o, da_, db_, n);
  float *g = dget(dout_o, n);
  check_bits("residual_fwd", "out", shape, g, out, n);
  free(g);
  /* in place, out = a, as the model adds its residual stream */
  gpu->residual_fwd(da_, da_, db_, n);
  check_dev_bits("residual_fwd", "out-in-place", shape, da_, out, n);
  float *dout = frand(n, -1, 1), *ga_ = frand(n, -1, 1), *gb_ = frand(n, -1, 1);
  float *ddout = dput(dout, n * 4), *dga = dput(ga_, n * 4), *dgb = dput(gb_, n * 4);
  cpu->residual_bwd(ga_, gb_, dout, n);
  gpu->residual_bwd(dga, dgb, ddout, n);
  check_dev_bits("residual_bwd", "da", shape, dga, ga_, n);
  check_dev_bits("residual_bwd", "db", shape, dgb, gb_, n);
  gpu->dev_free(da_), gpu->dev_free(db_), gpu->dev_free(dout_o), gpu->dev_free(ddout);
  gpu->dev_free(dga), gpu->dev_free(dgb);
  free(a), free(b), free(out), free(dout), free(ga_), free(gb_);
}

/* ---- element-wise ops at every alignment ------------------------------------ */

/* An element-wise op on backend be over k fp32 arrays x[0..k) of n */
typedef void (*elem_run_fn)(const kern_backend_t *be, float **x, size_t n);

static void run_vec_add(const kern_backend_t *be, float **x, size_t n) {
  be->vec_add(x[0], x[1], n);
}
static void run_vec_scale(const kern_backend_t *be, float **x, size_t n) {
  be->vec_scale(x[0], 0.37f, n);
}
static void run_gelu_fwd(const kern_backend_t *be, float **x, size_t n) {
  be->gelu_fwd(x[0], x[1], n);
}
static void run_gelu_bwd(const kern_backend_t *be, float **x, size_t n) {
  be->gelu_bwd(x[0], x[1], x[2], n, 1);
}
static void run_residual_fwd(const kern_backend_t *be, float **x, size_t n) {
  be->residual_fwd(x[0], x[1], x[2], n);
}
static void run_residual_bwd(const kern_backend_t *be, float **x, size_t n) {
  be->residual_bwd(x[0], x[1], x[2], n);
}

/* op (run) over k arrays, its first nout written (and read: the backward ops
 * accumulate), at every offset of each array from a 16-byte boundary (0..3
 * floats; dev_alloc's buffers are cudaMalloc's, 256-byte aligned). The
 * kernels move 4 elements a thread in float4 accesses where every array's
 * boundary falls at the same element (a head of up to 3 before it, a tail
 * of (n - head) % 4 after), else one a thread: each way the CPU's bits, and
 * nothing written outside the n elements. On the emulator, also that the
 * calls whose arrays allow it took the wide kernel (its name: wide) and the
 * others the one-a-thread one (narrow). */
static void test_elem_offsets(const char *op, elem_run_fn run, int k, int nout, size_t n,
                              const char *wide, const char *narrow) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu offsets 4^%d", n, k);
  float *init[3], *ref[3], *dev[3], *at[3], *got = xmalloc((n + 3) * 4);
  for (int a = 0; a < k; a++) {
    init[a] = frand(n, -6, 6);
    ref[a] = fdup(init[a], n);
    dev[a] = dnew((n + 3) * 4);
  }
  run(cpu, ref, n);
  size_t differ = 0, outside = 0;
  unsigned long calls_wide = 0;
#ifdef KERN_CUDA_EMU
  const unsigned long before_wide = cuda_emu_launches(wide), before = cuda_emu_launches(narrow);
#endif
  int calls = 1;
  for (int a = 0; a < k; a++) calls *= 4;
  for (int c = 0; c < calls; c++) {
    int off[3], same = 1;
    for (int a = 0, r = c; a < k; a++, r /= 4) off[a] = r % 4, same &= off[a] == off[0];
    calls_wide += same && n >= (size_t)(4 - off[0]) % 4 + 4;
    for (int a = 0; a < k; a++) {
      gpu->dev_set(dev[a], 0xff, (n + 3) * 4);
      gpu->copy_h2d(dev[a] + off[a], init[a], n * 4);
      at[a] = dev[a] + off[a];
    }
    run(gpu, at, n);
    for (int a = 0; a < nout; a++) {
      gpu->copy_d2h(got, dev[a], (n + 3) * 4);
      for (size_t i = 0; i < n + 3; i++) {
        uint32_t u;
        memcpy(&u, &got[i], 4);
        if (i < (size_t)off[a] || i >= off[a] + n) outside += u != 0xffffffffu;
        else differ += memcmp(&got[i], &ref[a][i - off[a]], 4) != 0;
      }
    }
  }
  report(op, "out", shape, differ ? INFINITY : 0, 0, "bits", -1, !differ);
  report(op, "out-outside", shape, 0, 0, "untouched", -1, !outside);
  if (differ || outside)
    printf("test_cuda_kernels:   %zu elements differ, %zu written outside, in %d calls\n", differ,
           outside, calls);
#ifdef KERN_CUDA_EMU
  const int paths_ok = cuda_emu_launches(wide) - before_wide == calls_wide &&
                       cuda_emu_launches(narrow) - before == calls - calls_wide;
  report(op, "wide-launches", shape, 0, 0, "-", -1, paths_ok);
  if (!paths_ok) printf("test_cuda_kernels:   of %d calls, %lu should go wide\n", calls, calls_wide);
#else
  (void)wide, (void)narrow, (void)calls_wide;
#endif
  for (int a = 0; a < k; a++) gpu->dev_free(dev[a]), free(init[a]), free(ref[a]);
  free(got);
}

/* ---- crossentropy --------------------------------------------------------- */

/* ld: the GPU's rows are ld >= V apart (the model's padded logits) */
static void test_crossentropy(int N, int V, int ld) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d V=%d", N, V);
  if (ld != V) snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " ld=%d", ld);
  const size_t n = (size_t)N * V;
  float *logits = frand(n, -5, 5);
  int32_t *tgt = xmalloc(N * sizeof(int32_t));
  for (int i = 0; i < N; i++) tgt[i] = (int32_t)rand_below((uint32_t)V);
  tgt[0] = V - 1;
  logits[(size_t)N * V - 1] = -60.0f; /* last row: a target far below the max (p ~ 1e-28) */
  tgt[N - 1] = V - 1;
  /* float64 reference before the CPU overwrites the logits */
  /* mp: e^(x - max) is off by |x - max| times the rounding of x - max in fp32
   * (the argument's own error), so a probability's mag is p (1 + |x - max|) */
  double *rp = xmalloc(n * 8), *mp = xmalloc(n * 8), *rl = xmalloc(N * 8), *ml = xmalloc(N * 8);
  for (int i = 0; i < N; i++) {
    const float *x = logits + (size_t)i * V;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < V; j++) s += rp[(size_t)i * V + j] = exp((double)x[j] - mx);
    for (int j = 0; j < V; j++) {
      rp[(size_t)i * V + j] /= s;
      mp[(size_t)i * V + j] = rp[(size_t)i * V + j] * (1 + fabs((double)x[j] - mx));
    }
    rl[i] = log(s) - ((double)x[tgt[i]] - mx);
    ml[i] = 1 + fabs(rl[i]); /* log(sum) is off by ~TOL_RED absolute */
  }
  float *dlog = dput_rows(logits, N, V, ld), *dloss = dnew(N * 4);
  float *dfused = dput_rows(logits, N, V, ld); /* for crossentropy_fwd_bwd, below */
  int32_t *dtgt = dput(tgt, N * sizeof(int32_t));
  float *loss = xmalloc(N * 4);
#ifdef KERN_CUDA_EMU
  const unsigned long row0 = cuda_emu_launches("ce_row_kernel"),
                      stream0 = cuda_emu_launches("crossentropy_fwd_kernel");
#endif
  cpu->crossentropy_fwd(loss, logits, tgt, N, V, V);
  gpu->crossentropy_fwd(dloss, dlog, dtgt, N, V, ld);
  float *gp = dget_rows(dlog, N, V, ld, "crossentropy_fwd", "probs", shape), *gl = dget(dloss, N);
  float *mlf = xmalloc(N * 4);
  for (int i = 0; i < N; i++) mlf[i] = (float)ml[i];
  check_tol("crossentropy_fwd", "probs", shape, gp, logits, NULL, NULL, NULL, n, TOL_RED);
  check_tol("crossentropy_fwd", "losses", shape, gl, loss, NULL, mlf, NULL, N, TOL_RED);
  check_tol("crossentropy_fwd", "probs-f64", shape, gp, NULL, rp, NULL, mp, n, TOL_RED);
  check_tol("crossentropy_fwd", "losses-f64", shape, gl, NULL, rl, NULL, ml, N, TOL_RED);
  check_tol("crossentropy_fwd", "cpu-probs-f64", shape, logits, NULL, rp, NULL, mp, n, TOL_RED);
  const float dl = 1.0f / (float)N;
  /* forward and backward at once: the bits of the GPU's forward and then
   * its backward (on the GPU's probabilities) */
  float *dfl = dnew(N * 4), *dsep = dput_rows(gp, N, V, ld);
  gpu->crossentropy_fwd_bwd(dfl, dfused, dtgt, dl, N, V, ld);
  gpu->crossentropy_bwd(dsep, dtgt, dl, N, V, ld);
  float *fl = dget(dfl, N), *fd = dget_rows(dfused, N, V, ld, "crossentropy_fwd_bwd", "dlogits",
                                            shape);
  float *sd = dget_rows(dsep, N, V, ld, "crossentropy_bwd", "dlogits", shape);
  check_bits("crossentropy_fwd_bwd", "losses", shape, fl, gl, N);
  check_bits("crossentropy_fwd_bwd", "dlogits", shape, fd, sd, n);
#ifdef KERN_CUDA_EMU
  /* both through shared memory where a row and the reductions' 32 floats
   * fit (crossentropy.cu), else both streaming */
  const unsigned long rows = (V + 32ul) * 4 <= cuda_emu_smem_optin() ? 2 : 0;
  report("crossentropy_fwd", "row-launches", shape, 0, 0, "-", -1,
         cuda_emu_launches("ce_row_kernel") - row0 == rows &&
             cuda_emu_launches("crossentropy_fwd_kernel") - stream0 == 2 - rows);
#endif
  gpu->dev_free(dfl), gpu->dev_free(dsep), gpu->dev_free(dfused);
  free(fl), free(fd), free(sd);
  /* backward on the CPU's probabilities */
  gpu->dev_free(dlog);
  dlog = dput_rows(logits, N, V, ld);
  cpu->crossentropy_bwd(logits, tgt, dl, N, V, V);
  gpu->crossentropy_bwd(dlog, dtgt, dl, N, V, ld);
  free(gp);
  gp = dget_rows(dlog, N, V, ld, "crossentropy_bwd", "dlogits", shape);
  check_bits("crossentropy_bwd", "dlogits", shape, gp, logits, n);
  gpu->dev_free(dlog), gpu->dev_free(dloss), gpu->dev_free(dtgt);
  free(logits), free(tgt), free(rp), free(mp), free(rl), free(ml), free(loss), free(gp), free(gl),
      free(mlf);
}

/* The LM head's backward from bf16 dlogits (kern.h: crossentropy_fwd_bwd_bf16
 * and matmul_bwd_bf16's dout16, the bf16 mode's table): the losses bit for
 * bit crossentropy_fwd_bwd's, each row's bf16 dlogits its fp32 ones rounded
 * (f32_to_bf16's bits), and the product from them (rows 2 ld bf16 apart)
 * equal to the product from the fp32 dlogits (which it packs to the same
 * operand) within the order of the sums, dinp written (acc 0) over NaNs and
 * dw accumulated. lnf's rows in bf16, as the model keeps them. */
static void test_lm_head_bf16(int N, int C, int V, int ld) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d V=%d ld=%d", N, C, V, ld);
  const size_t n = (size_t)N * V, nx = (size_t)N * C, nw = (size_t)V * C;
  float *x = frand(nx, -1, 1), *w = frand(nw, -0.5f, 0.5f), *dw0 = frand(nw, -1, 1);
  int32_t *tgt = xmalloc(N * sizeof(int32_t));
  for (int i = 0; i < N; i++) tgt[i] = (int32_t)rand_below((uint32_t)V);
  tgt[0] = V - 1;
  uint16_t *x16 = xmalloc(nx * 2);
  cpu->f32_to_bf16(x16, x, nx);
  uint16_t *d_x16 = dput(x16, nx * 2);
  float *d_w = dput(w, nw * 4), *d_dwa = dput(dw0, nw * 4), *d_dwb = dput(dw0, nw * 4);
  float *la = dput_rows(NULL, N, V, ld), *lb = dput_rows(NULL, N, V, ld);
  float *lossa = dnew(N * 4), *lossb = dnew(N * 4), *dxa = dnew(nx * 4), *dxb = dnew(nx * 4);
  int32_t *d_tgt = dput(tgt, N * sizeof(int32_t));
  const float dl = 1.0f / (float)N;
  gpu->matmul_fwd_bf16(la, d_x16, d_w, NULL, NULL, N, C, V, ld);
  gpu->matmul_fwd_bf16(lb, d_x16, d_w, NULL, NULL, N, C, V, ld);
  gpu->crossentropy_fwd_bwd(lossa, la, d_tgt, dl, N, V, ld);
  gpu->crossentropy_fwd_bwd_bf16(lossb, lb, d_tgt, dl, N, V, ld);
  float *ga = dget(lossa, N);
  check_dev_bits("crossentropy_fwd_bwd_bf16", "losses", shape, lossb, ga, N);
  /* the fp32 dlogits (dense) and the bf16 ones, from each row's second half */
  float *pa = dget(la, (size_t)N * ld), *dla = xmalloc(n * 4), *adla = xmalloc(n * 4);
  uint16_t *pb = (uint16_t *)dget(lb, (size_t)N * ld), *want = xmalloc(n * 2), *got = xmalloc(n * 2);
  for (int i = 0; i < N; i++) {
    memcpy(dla + (size_t)i * V, pa + (size_t)i * ld, (size_t)V * 4);
    memcpy(got + (size_t)i * V, pb + (size_t)i * 2 * ld + ld, (size_t)V * 2);
  }
  cpu->f32_to_bf16(want, dla, n);
  check_bits_u16("crossentropy_fwd_bwd_bf16", "dlogits=bf16(fp32's)", shape, got, want, n);
  gpu->matmul_bwd_bf16(dxa, d_dwa, NULL, la, NULL, d_x16, d_w, NULL, N, C, V, ld, 0);
  gpu->matmul_bwd_bf16(dxb, d_dwb, NULL, NULL, (const uint16_t *)lb + ld, d_x16, d_w, NULL, N, C, V,
                       2 * ld, 0);
  /* mags: the CPU's backward on the absolute values */
  for (size_t i = 0; i < n; i++) adla[i] = fabsf(dla[i]);
  float *ax = xmalloc(nx * 4), *aw = fabs_dup(w, nw), *mx = xmalloc(nx * 4), *mw = fabs_dup(dw0, nw);
  cpu->bf16_to_f32(ax, x16, nx);
  for (size_t i = 0; i < nx; i++) ax[i] = fabsf(ax[i]);
  cpu->matmul_bwd(mx, mw, NULL, adla, ax, aw, N, C, V, V, 0);
  float *gxa = dget(dxa, nx), *gwa = dget(d_dwa, nw);
  float *gxb = dget(dxb, nx), *gwb = dget(d_dwb, nw);
  check_tol("matmul_bwd_bf16", "dinp= from bf16 dlogits", shape, gxb, gxa, NULL, mx, NULL, nx, TOL_GEMM);
  check_tol("matmul_bwd_bf16", "dw+= from bf16 dlogits", shape, gwb, gwa, NULL, mw, NULL, nw, TOL_GEMM);
  gpu->dev_free(d_x16), gpu->dev_free(d_w), gpu->dev_free(d_dwa), gpu->dev_free(d_dwb);
  gpu->dev_free(la), gpu->dev_free(lb), gpu->dev_free(lossa), gpu->dev_free(lossb);
  gpu->dev_free(dxa), gpu->dev_free(dxb), gpu->dev_free(d_tgt);
  free(x), free(w), free(dw0), free(tgt), free(x16), free(ga), free(pa), free(dla), free(adla);
  free(pb), free(want), free(got), free(ax), free(aw), free(mx), free(mw), free(gxa), free(gwa);
  free(gxb), free(gwb);
}

/* crossentropy_bwd alone over more rows than a grid's y (65535): its row
 * loop, on the CPU's probabilities of random logits */
static void test_crossentropy_bwd_rows(int N, int V, int ld) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d V=%d ld=%d", N, V, ld);
  const size_t n = (size_t)N * V;
  float *p = frand(n, -5, 5), *loss = xmalloc(N * 4);
  int32_t *tgt = xmalloc(N * sizeof(int32_t));
  for (int i = 0; i < N; i++) tgt[i] = (int32_t)rand_below((uint32_t)V);
  cpu->crossentropy_fwd(loss, p, tgt, N, V, V);
  float *d = dput_rows(p, N, V, ld);
  int32_t *dt = dput(tgt, N * sizeof(int32_t));
  cpu->crossentropy_bwd(p, tgt, 0.25f, N, V, V);
  gpu->crossentropy_bwd(d, dt, 0.25f, N, V, ld);
  float *g = dget_rows(d, N, V, ld, "crossentropy_bwd", "dlogits", shape);
  check_bits("crossentropy_bwd", "dlogits", shape, g, p, n);
  gpu->dev_free(d), gpu->dev_free(dt);
  free(p), free(loss), free(tgt), free(g);
}

/* ---- adamw, casts, sumsq -------------------------------------------------- */

static void test_adamw(size_t n, int t) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu t=%d", n, t);
  float *p = frand(n, -0.1f, 0.1f), *g = frand(n, -1e-2f, 1e-2f), *m = frand(n, -1e-3f, 1e-3f),
        *v = frand(n, 0, 1e-5f);
  float *dp = dput(p, n * 4), *dg = dput(g, n * 4), *dm = dput(m, n * 4), *dv = dput(v, n * 4);
  cpu->adamw(p, g, m, v, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
  gpu->adamw(dp, dg, dm, dv, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
  float *r = dget(dp, n);
  check_bits("adamw", "p", shape, r, p, n);
  free(r);
  check_dev_bits("adamw", "m", shape, dm, m, n);
  check_dev_bits("adamw", "v", shape, dv, v, n);
  gpu->dev_free(dp), gpu->dev_free(dg), gpu->dev_free(dm), gpu->dev_free(dv);
  free(p), free(g), free(m), free(v);
}

/* adamw_segs (kern.h): nseg segments of random lengths (some empty, some
 * of one element), gaps of random lengths between them (0 included), random
 * decay, each segment's elements against the CPU's adamw on that segment
 * alone (wd or 0), bit for bit, and the gaps' elements untouched; with16,
 * the bf16 image: each stepped element the CPU's f32_to_bf16 of its new p,
 * the gaps' random bits untouched; on the emulator, one launch for every
 * 256 segments that hold elements. gscale other than 1: adamw_segs_scaled,
 * against the CPU's vec_scale of g first, g's own bits left as they were.
 * lead: the first segment empty and a gap of lead elements after it, so
 * the launch's first bounds start past its base (its search's start[0] >
 * 0: the elements before it in no segment). */
static void test_adamw_segs(int nseg, int t, int with16, float gscale, int lead) {
  char shape[80];
  snprintf(shape, sizeof shape, "segments=%d t=%d p16=%d gscale=%g lead=%d", nseg, t, with16,
           gscale, lead);
  kern_seg_t *seg = xmalloc((size_t)nseg * sizeof *seg);
  size_t n = 0;
  int full = 0;
  for (int k = 0; k < nseg; k++) {
    n += k == 1 ? (size_t)lead : rand_below(4) == 0 ? rand_below(9) : 0; /* a gap */
    size_t len = rand_below(8) == 0 ? rand_below(2) : 1 + rand_below(300);
    if (lead && k == 0) len = 0;
    seg[k] = (kern_seg_t){n, len, (int)rand_below(2)};
    n += len, full += len > 0;
  }
  n += 5; /* padding after the last */
  float *p = frand(n, -0.1f, 0.1f), *g = frand(n, -1e-2f, 1e-2f), *m = frand(n, -1e-3f, 1e-3f),
        *v = frand(n, 0, 1e-5f);
  float *dp = dput(p, n * 4), *dg = dput(g, n * 4), *dm = dput(m, n * 4), *dv = dput(v, n * 4);
  uint16_t *p16 = xmalloc(n * 2), *got16 = xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) p16[i] = (uint16_t)rand_below(65536);
  uint16_t *dp16 = with16 ? dput(p16, n * 2) : NULL;
  float *g0 = xmalloc(n * 4);
  memcpy(g0, g, n * 4);
  if (gscale != 1.0f) cpu->vec_scale(g, gscale, n);
  for (int k = 0; k < nseg; k++) {
    const size_t o = seg[k].offset;
    cpu->adamw(p + o, g + o, m + o, v + o, seg[k].numel, 6e-4f, 0.9f, 0.95f, 1e-8f,
               seg[k].decay ? 0.1f : 0.0f, t);
    cpu->f32_to_bf16(p16 + o, p + o, seg[k].numel);
  }
#ifdef KERN_CUDA_EMU
  const unsigned long l0 = cuda_emu_launches("adamw_segs_kernel");
#endif
  if (gscale != 1.0f)
    gpu->adamw_segs_scaled(dp, dp16, dg, gscale, dm, dv, seg, nseg, 6e-4f, 0.9f, 0.95f, 1e-8f,
                           0.1f, t);
  else
    gpu->adamw_segs(dp, dp16, dg, dm, dv, seg, nseg, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
#ifdef KERN_CUDA_EMU
  const unsigned long launches = cuda_emu_launches("adamw_segs_kernel") - l0;
  report("adamw_segs", "launches", shape, (double)launches, (double)((full + 255) / 256), "=", -1,
         launches == (unsigned long)((full + 255) / 256));
#endif
  check_dev_bits("adamw_segs", "p", shape, dp, p, n);
  check_dev_bits("adamw_segs", "m", shape, dm, m, n);
  check_dev_bits("adamw_segs", "v", shape, dv, v, n);
  check_dev_bits("adamw_segs", "g unchanged", shape, dg, g0, n);
  if (with16) {
    gpu->copy_d2h(got16, dp16, n * 2);
    check_bits_u16("adamw_segs", "p16=bf16(p), gaps kept", shape, got16, p16, n);
    gpu->dev_free(dp16);
  }
  gpu->dev_free(dp), gpu->dev_free(dg), gpu->dev_free(dm), gpu->dev_free(dv);
  free(p), free(g), free(m), free(v), free(seg), free(p16), free(got16), free(g0);
}

static void test_cast(size_t n) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  float *x = frand(n, -100, 100);
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                              0xffa00000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f808000u,
                              0x3f818000u, 0x3f80ffffu, 0x7f7f8000u};
  for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++)
    memcpy(&x[i], &special[i], 4);
  uint16_t *h = xmalloc(n * 2 + 2), *hg = xmalloc(n * 2 + 2);
  cpu->f32_to_bf16(h, x, n);
  float *dx = dput(x, n * 4);
  uint16_t *dh = dnew(n * 2 + 2);
  gpu->f32_to_bf16(dh, dx, n);
  gpu->copy_d2h(hg, dh, n * 2);
  check_bits_u16("f32_to_bf16", "out", shape, hg, h, n);
  /* bf16 -> fp32 on every bf16 pattern */
  const size_t nb = 65536;
  uint16_t *all = xmalloc(nb * 2);
  for (size_t i = 0; i < nb; i++) all[i] = (uint16_t)i;
  float *f = xmalloc(nb * 4);
  cpu->bf16_to_f32(f, all, nb);
  uint16_t *dall = dput(all, nb * 2);
  float *df = dnew(nb * 4);
  gpu->bf16_to_f32(df, dall, nb);
  float *fg = dget(df, nb);
  check_bits("bf16_to_f32", "out", "all 65536", fg, f, nb);
  gpu->dev_free(dx), gpu->dev_free(dh), gpu->dev_free(dall), gpu->dev_free(df);
  free(x), free(h), free(hg), free(all), free(f), free(fg);
}

/* The casts at every offset of each pointer from a 16-byte boundary (dev_alloc's
 * buffers are cudaMalloc's, 256-byte aligned): floats 0..3, bf16 0..7.
 * cast.cu moves 8 elements a thread where the two pointers' boundaries fall
 * at the same element, after a head of up to 7 and before a tail of (n -
 * head) % 8, and one a thread where they do not: each way the CPU's bits,
 * and nothing written outside the n elements (a 16-byte store past an end
 * would show). On the emulator, also which kernel each call took. */
/* op, an fp32 -> bf16 op of the GPU (f32_to_bf16, gelu_fwd_bf16), from x
 * (n) at every offset of its input from a 16-byte boundary (floats 0..3)
 * and of its output (bf16 0..7), into dx and dh (n + 3 floats, n + 7 bf16
 * of device memory): adds to *differ the elements that differ from want, to
 * *outside those written outside the n, and to *wide the calls whose
 * pointers let it move 8 elements a thread (cast.cu's test: the bf16 side's
 * head brings both pointers to a boundary). 32 calls. */
typedef void (*to_bf16_fn)(uint16_t *out, const float *inp, size_t n);
/* got the same bf16 as want: equal bits, or both NaN (check_bits' rule: a
 * NaN's sign and payload are the hardware's, x86 making -inf * 0 a negative
 * NaN and a GPU a positive one; but 0xffff, the fill, is never written) */
static int bf16_same(uint16_t got, uint16_t want) {
  const int g_nan = (got & 0x7f80) == 0x7f80 && (got & 0x7f),
            w_nan = (want & 0x7f80) == 0x7f80 && (want & 0x7f);
  return got == want || (g_nan && w_nan && got != 0xffff);
}
static void to_bf16_offsets(to_bf16_fn op, const float *x, const uint16_t *want, size_t n,
                            float *dx, uint16_t *dh, size_t *differ, size_t *outside,
                            size_t *wide) {
  uint16_t *gh = xmalloc((n + 7) * 2);
  for (int fo = 0; fo < 4; fo++)
    for (int ho = 0; ho < 8; ho++) {
      const size_t head = (size_t)(8 - ho) % 8;
      *wide += n >= head + 8 && (fo + head) % 4 == 0;
      gpu->copy_h2d(dx + fo, x, n * 4);
      gpu->dev_set(dh, 0xff, (n + 7) * 2);
      op(dh + ho, dx + fo, n);
      gpu->copy_d2h(gh, dh, (n + 7) * 2);
      gpu->sync();
      for (size_t i = 0; i < n + 7; i++) {
        if (i < (size_t)ho || i >= ho + n) *outside += gh[i] != 0xffff;
        else *differ += !bf16_same(gh[i], want[i - ho]);
      }
    }
  free(gh);
}

static void test_cast_offsets(size_t n) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu offsets 4x8", n);
  float *x = frand(n, -100, 100), *f = xmalloc(n * 4);
  uint16_t *b = xmalloc(n * 2), *h = xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) b[i] = (uint16_t)rand_below(65536);
  cpu->f32_to_bf16(h, x, n);
  cpu->bf16_to_f32(f, b, n);
  float *dx = dnew((n + 3) * 4);
  uint16_t *dh = dnew((n + 7) * 2);
  float *gf = xmalloc((n + 3) * 4);
  size_t differ[2] = {0, 0}, outside[2] = {0, 0}, wide = 0;
#ifdef KERN_CUDA_EMU
  const char *kern[4] = {"f32_to_bf16_wide_kernel", "f32_to_bf16_kernel",
                         "bf16_to_f32_wide_kernel", "bf16_to_f32_kernel"};
  unsigned long before[4]; /* each kernel's launches so far */
  for (int k = 0; k < 4; k++) before[k] = cuda_emu_launches(kern[k]);
#endif
  to_bf16_offsets(gpu->f32_to_bf16, x, h, n, dx, dh, &differ[0], &outside[0], &wide);
  for (int fo = 0; fo < 4; fo++)
    for (int ho = 0; ho < 8; ho++) {
      gpu->copy_h2d(dh + ho, b, n * 2);
      gpu->dev_set(dx, 0xff, (n + 3) * 4);
      gpu->bf16_to_f32(dx + fo, dh + ho, n);
      gpu->copy_d2h(gf, dx, (n + 3) * 4);
      for (size_t i = 0; i < n + 3; i++) {
        uint32_t u;
        memcpy(&u, &gf[i], 4);
        if (i < (size_t)fo || i >= fo + n) outside[1] += u != 0xffffffffu;
        else differ[1] += memcmp(&gf[i], &f[i - fo], 4) != 0;
      }
    }
  const char *op[2] = {"f32_to_bf16", "bf16_to_f32"};
  for (int d = 0; d < 2; d++) {
    report(op[d], "out", shape, differ[d] ? INFINITY : 0, 0, "bits", -1, !differ[d]);
    report(op[d], "out-outside", shape, 0, 0, "untouched", -1, !outside[d]);
    if (differ[d] || outside[d])
      printf("test_cuda_kernels:   %zu of 32 x %zu elements differ, %zu written outside\n",
             differ[d], n, outside[d]);
  }
#ifdef KERN_CUDA_EMU
  /* 8 a thread exactly where the pointers allow it (the two directions'
   * tests agree: the head is the bf16 side's) */
  const unsigned long want[4] = {wide, 32 - wide, wide, 32 - wide};
  int paths_ok = 1;
  for (int k = 0; k < 4; k++) paths_ok &= cuda_emu_launches(kern[k]) - before[k] == want[k];
  report("cast", "wide-launches", shape, 0, 0, "-", -1, paths_ok);
  if (!paths_ok) printf("test_cuda_kernels:   of 32 calls each way, %zu should go wide\n", wide);
#endif
  gpu->dev_free(dx), gpu->dev_free(dh);
  free(x), free(f), free(b), free(h), free(gf);
}

/* bf16_to_f32_segs: nsmall segments of 0 to 299 elements (a few empty, gaps
 * of 0 to 49 between), one of big elements among them after the first
 * third (cast.cu: alone, through bf16_to_f32), at odd offsets; each segment
 * bf16_to_f32's bits at its offset, every other element as it was (dnew's
 * NaN fill). On the emulator, also the launches: the small segments a
 * launch for each CAST_SEGS (32) non-empty ones in a row. */
static void test_cast_segs(int nsmall, size_t big) {
  char shape[64];
  snprintf(shape, sizeof shape, "%d segments, one of %zu", nsmall + 1, big);
  kern_seg_t *seg = xmalloc((size_t)(nsmall + 1) * sizeof *seg);
  size_t at = 1 + rand_below(7);
  int ns = 0, launches = 0, run = 0;
  for (int k = 0; k <= nsmall; k++) {
    const size_t numel = k == nsmall / 3 ? big : rand_below(6) ? rand_below(300) : 0;
    seg[ns++] = (kern_seg_t){at, numel, 0};
    at += numel + rand_below(50);
    if (numel >= 65536) launches += (run + 31) / 32, run = 0;
    else run += numel > 0;
  }
  launches += (run + 31) / 32;
  const size_t n = at;
  uint16_t *b = xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) b[i] = (uint16_t)rand_below(65536);
  float *want = xmalloc(n * 4), *w = xmalloc(n * 4);
  memset(want, 0xff, n * 4);
  cpu->bf16_to_f32(w, b, n);
  for (int k = 0; k < ns; k++)
    memcpy(want + seg[k].offset, w + seg[k].offset, seg[k].numel * 4);
  uint16_t *db = dput(b, n * 2);
  float *dx = dnew(n * 4);
#ifdef KERN_CUDA_EMU
  const unsigned long before = cuda_emu_launches("bf16_to_f32_segs_kernel");
#endif
  gpu->bf16_to_f32_segs(dx, db, seg, ns);
  float *got = dget(dx, n);
  size_t differ = 0; /* widening is integer code: every bit, NaNs' too, and the fill's */
  for (size_t i = 0; i < n; i++) differ += memcmp(&got[i], &want[i], 4) != 0;
  report("bf16_to_f32_segs", "out+untouched", shape, differ ? INFINITY : 0, 0, "bits", -1, !differ);
#ifdef KERN_CUDA_EMU
  report("bf16_to_f32_segs", "launches", shape, 0, 0, "-", -1,
         cuda_emu_launches("bf16_to_f32_segs_kernel") - before == (unsigned long)launches);
#endif
  gpu->dev_free(db), gpu->dev_free(dx);
  free(seg), free(b), free(want), free(w), free(got);
}

/* ---- bf16 activations (kern.h; the bf16 mode's table) ---------------------- */

/* layernorm_fwd_bf16: the fp32 op's output rounded (f32_to_bf16's bits), the
 * same mean and rstd */
static void test_layernorm_bf16(int N, int C) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
  const size_t n = (size_t)N * C;
  float *x = frand(n, -2, 3), *w = frand(C, 0.5f, 1.5f), *b = frand(C, -0.5f, 0.5f);
  float *dx = dput(x, n * 4), *dw_ = dput(w, C * 4), *db_ = dput(b, C * 4);
  float *o32 = dnew(n * 4), *m32 = dnew(N * 4), *r32 = dnew(N * 4), *m16 = dnew(N * 4),
        *r16 = dnew(N * 4);
  uint16_t *o16 = dnew(n * 2);
  gpu->layernorm_fwd(o32, m32, r32, dx, dw_, db_, N, C);
  gpu->layernorm_fwd_bf16(o16, m16, r16, dx, dw_, db_, N, C);
  float *go = dget(o32, n), *gm = dget(m32, N), *gr = dget(r32, N);
  uint16_t *want = xmalloc(n * 2), *got = xmalloc(n * 2);
  cpu->f32_to_bf16(want, go, n);
  gpu->copy_d2h(got, o16, n * 2);
  gpu->sync();
  check_bits_u16("layernorm_fwd_bf16", "out=bf16(fp32 out)", shape, got, want, n);
  check_dev_bits("layernorm_fwd_bf16", "mean", shape, m16, gm, N);
  check_dev_bits("layernorm_fwd_bf16", "rstd", shape, r16, gr, N);
  gpu->dev_free(dx), gpu->dev_free(dw_), gpu->dev_free(db_), gpu->dev_free(o32);
  gpu->dev_free(m32), gpu->dev_free(r32), gpu->dev_free(m16), gpu->dev_free(r16);
  gpu->dev_free(o16);
  free(x), free(w), free(b), free(go), free(gm), free(gr), free(want), free(got);
}

/* gelu_fwd_bf16 at every offset of its two pointers from a 16-byte boundary
 * (floats 0..3, bf16 0..7): the CPU's GELU rounded (its bits), nothing
 * written outside the n elements; 8 elements a thread exactly where the
 * boundaries fall at the same element, as test_cast_offsets. */
/* The LM head on bf16 logits (kern.h: matmul_fwd_bf16_out16 and
 * crossentropy_fwd_bwd_bf16in, the bf16 mode's): the logits the fp32
 * product's rounded once (bit for bit on the emulator, whose cuBLASLt sums
 * both alike; on a GPU within the bf16 products' bound, which holds the
 * rounding and the order of the sums), each row's padding untouched; the
 * losses and bf16 dlogits bit for bit crossentropy_fwd_bwd_bf16's on the
 * logits widened where both take the same form (rows in shared memory, or
 * streaming), else (a row of fp32 past the device's shared memory, a row of
 * bf16 within it: V = 50257 on 8.0) within TOL_RED and 2 bf16 steps, over
 * the logits in place, the padding still untouched; and the product from
 * them (rows ld apart) as from the second halves (2 ld apart). */
/* The N rows of V bf16 logits of l16 (rows ld apart) into rows (dense);
 * how many of their padding's elements are not the 0x7171 they were
 * filled with. */
static size_t l16_rows(uint16_t *rows, const uint16_t *l16, int N, int V, int ld) {
  size_t pad = 0;
  for (int i = 0; i < N; i++) {
    memcpy(rows + (size_t)i * V, l16 + (size_t)i * ld, (size_t)V * 2);
    for (int j = V; j < ld; j++) pad += l16[(size_t)i * ld + j] != 0x7171;
  }
  return pad;
}

static void test_lm_head_l16(int N, int C, int V, int ld) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d V=%d ld=%d", N, C, V, ld);
  const size_t n = (size_t)N * V, nx = (size_t)N * C, nw = (size_t)V * C, nl = (size_t)N * ld;
  float *x = frand(nx, -1, 1), *w = frand(nw, -0.5f, 0.5f);
  int32_t *tgt = xmalloc(N * sizeof(int32_t));
  for (int i = 0; i < N; i++) tgt[i] = (int32_t)rand_below((uint32_t)V);
  tgt[0] = V - 1;
  uint16_t *x16 = xmalloc(nx * 2), *fill = xmalloc(nl * 2);
  cpu->f32_to_bf16(x16, x, nx);
  for (size_t i = 0; i < nl; i++) fill[i] = 0x7171; /* the padding's (finite) bits */
  uint16_t *d_x16 = dput(x16, nx * 2), *d_l16 = dput(fill, nl * 2);
  float *d_w = dput(w, nw * 4), *la = dput_rows(NULL, N, V, ld);
  gpu->matmul_fwd_bf16(la, d_x16, d_w, NULL, NULL, N, C, V, ld);
  const unsigned long p0 = w16_packs();
  gpu->matmul_fwd_bf16_out16(d_l16, d_x16, d_w, NULL, NULL, N, C, V, ld);
  const unsigned long packs_w = w16_packs() - p0;
  float *pa = dget_rows(la, N, V, ld, "matmul_fwd_bf16", "logits", shape);
  uint16_t *l16 = (uint16_t *)dget(d_l16, nl / 2), *got = xmalloc(n * 2), *want = xmalloc(n * 2);
  report("matmul_fwd_bf16_out16", "padding", shape, 0, 0, "-", -1,
         l16_rows(got, l16, N, V, ld) == 0);
  cpu->f32_to_bf16(want, pa, n);
#ifdef KERN_CUDA_EMU
  check_bits_u16("matmul_fwd_bf16_out16", "logits=bf16(fp32's)", shape, got, want, n);
#endif
  /* against the CPU's product of the same operands, on magnitudes */
  float *gw = xmalloc(n * 4), *xw = xmalloc(nx * 4), *ref = xmalloc(n * 4), *mag = xmalloc(n * 4);
  float *ax = xmalloc(nx * 4), *wr = round_dup(w, nw, 1), *awr = fabs_dup(wr, nw);
  cpu->bf16_to_f32(gw, got, n);
  cpu->bf16_to_f32(xw, x16, nx);
  for (size_t i = 0; i < nx; i++) ax[i] = fabsf(xw[i]);
  cpu->matmul_fwd(ref, xw, wr, NULL, N, C, V, V);
  cpu->matmul_fwd(mag, ax, awr, NULL, N, C, V, V);
  check_tol("matmul_fwd_bf16_out16", "logits", shape, gw, ref, NULL, mag, NULL, n, TOL_GEMM_BF16);
  { /* given w's bf16 image (kern.h's w16) */
    uint16_t *wbase, *d_w16 = dput_w16(w, nw, 0, &wbase), *d_o = dput(fill, nl * 2);
    const unsigned long p1 = w16_packs();
    gpu->matmul_fwd_bf16_out16(d_o, d_x16, d_w, d_w16, NULL, N, C, V, ld);
    const unsigned long packs = w16_packs() - p1;
    uint16_t *o = (uint16_t *)dget(d_o, nl / 2), *rows = xmalloc(n * 2);
    for (int i = 0; i < N; i++) memcpy(rows + (size_t)i * V, o + (size_t)i * ld, (size_t)V * 2);
    float *gw16 = xmalloc(n * 4);
    cpu->bf16_to_f32(gw16, rows, n);
    check_w16("matmul_fwd_bf16_out16", shape, 0, nw, gw16, gw, ref, mag, n, TOL_GEMM_BF16, packs,
              packs_w);
    gpu->dev_free(wbase), gpu->dev_free(d_o), free(o), free(rows), free(gw16);
  }
  /* with a bf16 bias (bias16, as the qkv product takes its bias's image):
   * the fp32 product with that bias widened, rounded once (bit for bit on
   * the emulator), within the bf16 bound of the CPU's on a GPU; and where
   * cuBLASLt refuses the epilogue (the emulator's CUDA_EMU_LT_BIAS_REFUSE),
   * the pass after it, a rounding more: within two bf16 steps */
  for (int refuse = 0; refuse <= 1; refuse++) {
#ifndef KERN_CUDA_EMU
    if (refuse) break;
#endif
    float *b = frand((size_t)V, -2, 2), *bw = xmalloc((size_t)V * 4);
    uint16_t *b16 = xmalloc((size_t)V * 2);
    cpu->f32_to_bf16(b16, b, (size_t)V), cpu->bf16_to_f32(bw, b16, (size_t)V);
    uint16_t *d_b16 = dput(b16, (size_t)V * 2), *d_o = dput(fill, nl * 2);
    float *d_bw = dput(bw, (size_t)V * 4), *lb = dput_rows(NULL, N, V, ld);
    gpu->matmul_fwd_bf16(lb, d_x16, d_w, NULL, d_bw, N, C, V, ld);
    if (refuse) setenv("CUDA_EMU_LT_BIAS_REFUSE", "1", 1);
    gpu->matmul_fwd_bf16_out16(d_o, d_x16, d_w, NULL, d_b16, N, C, V, ld);
    if (refuse) unsetenv("CUDA_EMU_LT_BIAS_REFUSE");
    float *pb = dget_rows(lb, N, V, ld, "matmul_fwd_bf16", "logits+bias", shape);
    uint16_t *o = (uint16_t *)dget(d_o, nl / 2), *rows = xmalloc(n * 2), *wantb = xmalloc(n * 2);
    report("matmul_fwd_bf16_out16", refuse ? "bias16 refused: padding" : "bias16: padding", shape,
           0, 0, "-", -1, l16_rows(rows, o, N, V, ld) == 0);
    cpu->f32_to_bf16(wantb, pb, n);
    float *gb = xmalloc(n * 4), *refb = xmalloc(n * 4), *magb = xmalloc(n * 4);
    cpu->bf16_to_f32(gb, rows, n);
    for (int i = 0; i < N; i++)
      for (int j = 0; j < V; j++) {
        const size_t k = (size_t)i * V + j;
        refb[k] = ref[k] + bw[j];
        /* the product's bound, and one bf16 step (two where refused) of the result */
        magb[k] = mag[k] + fabsf(bw[j]) +
                  fabsf(refb[k]) / (float)TOL_GEMM_BF16 / (refuse ? 128.0f : 256.0f);
      }
#ifdef KERN_CUDA_EMU
    if (!refuse)
      check_bits_u16("matmul_fwd_bf16_out16", "logits+bias16=bf16(fp32's)", shape, rows, wantb, n);
#endif
    check_tol("matmul_fwd_bf16_out16", refuse ? "logits+bias16 (refused)" : "logits+bias16",
              shape, gb, refb, NULL, magb, NULL, n, TOL_GEMM_BF16);
    gpu->dev_free(d_b16), gpu->dev_free(d_o), gpu->dev_free(d_bw), gpu->dev_free(lb);
    free(b), free(bw), free(b16), free(pb), free(o), free(rows), free(wantb), free(gb), free(refb),
        free(magb);
  }
  /* the cross-entropy on them, against the fp32 form on them widened */
  float *wide = dput_rows(gw, N, V, ld), *lossa = dnew(N * 4), *lossb = dnew(N * 4);
  int32_t *d_tgt = dput(tgt, N * sizeof(int32_t));
  const float dl = 1.0f / (float)N;
  /* rows in shared memory where a row of bf16 (or fp32) and the
   * reductions' 32 floats fit (crossentropy.cu) */
  const size_t optin = smem_optin(), row16 = 128 + (((size_t)V + 7) & ~(size_t)7) * 2;
  const int same = (((size_t)V + 32) * 4 <= optin) == (row16 <= optin);
#ifdef KERN_CUDA_EMU
  const unsigned long row0 = cuda_emu_launches("ce_row16_kernel");
#endif
  gpu->crossentropy_fwd_bwd_bf16(lossa, wide, d_tgt, dl, N, V, ld);
  gpu->crossentropy_fwd_bwd_bf16in(lossb, d_l16, d_tgt, dl, N, V, ld);
#ifdef KERN_CUDA_EMU
  report("crossentropy_fwd_bwd_bf16in", "row-launches", shape, 0, 0, "-", -1,
         cuda_emu_launches("ce_row16_kernel") - row0 == (row16 <= optin ? 1u : 0u));
#endif
  float *ga = dget(lossa, N);
  uint16_t *sa = (uint16_t *)dget(wide, nl), *sb = (uint16_t *)dget(d_l16, nl / 2);
  for (int i = 0; i < N; i++)
    memcpy(want + (size_t)i * V, sa + (size_t)i * 2 * ld + ld, (size_t)V * 2);
  const size_t pad = l16_rows(got, sb, N, V, ld);
  if (same) {
    check_dev_bits("crossentropy_fwd_bwd_bf16in", "losses", shape, lossb, ga, N);
    check_bits_u16("crossentropy_fwd_bwd_bf16in", "dlogits=fp32 form's", shape, got, want, n);
  } else { /* the two forms' sums and exponentials */
    float *gb = dget(lossb, N), *wg = xmalloc(n * 4), *ww = xmalloc(n * 4);
    cpu->bf16_to_f32(wg, got, n);
    cpu->bf16_to_f32(ww, want, n);
    check_tol("crossentropy_fwd_bwd_bf16in", "losses", shape, gb, ga, NULL, NULL, NULL, N, TOL_RED);
    check_tol("crossentropy_fwd_bwd_bf16in", "dlogits", shape, wg, ww, NULL, NULL, NULL, n,
              TOL_GEMM_BF16);
    free(gb), free(wg), free(ww);
  }
  report("crossentropy_fwd_bwd_bf16in", "padding", shape, 0, 0, "-", -1, pad == 0);
  /* the LM head's backward from them (rows ld apart) and from the second
   * halves (2 ld apart): the same operand */
  float *dw0 = frand(nw, -1, 1), *d_dwa = dput(dw0, nw * 4), *d_dwb = dput(dw0, nw * 4);
  float *dxa = dnew(nx * 4), *dxb = dnew(nx * 4);
  gpu->matmul_bwd_bf16(dxa, d_dwa, NULL, NULL, (const uint16_t *)wide + ld, d_x16, d_w, NULL, N, C,
                       V, 2 * ld, 0);
  gpu->matmul_bwd_bf16(dxb, d_dwb, NULL, NULL, d_l16, d_x16, d_w, NULL, N, C, V, ld, 0);
  float *gxa = dget(dxa, nx), *gwa = dget(d_dwa, nw);
#ifdef KERN_CUDA_EMU
  const int bits = same; /* the two forms' dlogits are the same bits only where both rows fit */
#else /* the two layouts' alignments may take other algorithms: the order of the sums */
  const int bits = 0;
#endif
  if (bits) {
    check_dev_bits("matmul_bwd_bf16", "dinp= from dlogits over the logits", shape, dxb, gxa, nx);
    check_dev_bits("matmul_bwd_bf16", "dw+= from dlogits over the logits", shape, d_dwb, gwa, nw);
  } else {
    float *adl = xmalloc(n * 4), *mx = xmalloc(nx * 4), *mw = fabs_dup(dw0, nw);
    cpu->bf16_to_f32(adl, want, n);
    for (size_t i = 0; i < n; i++) adl[i] = fabsf(adl[i]);
    cpu->matmul_bwd(mx, mw, NULL, adl, ax, awr, N, C, V, V, 0);
    float *gxb = dget(dxb, nx), *gwb = dget(d_dwb, nw);
    check_tol("matmul_bwd_bf16", "dinp= from dlogits over the logits", shape, gxb, gxa, NULL, mx,
              NULL, nx, TOL_GEMM);
    check_tol("matmul_bwd_bf16", "dw+= from dlogits over the logits", shape, gwb, gwa, NULL, mw,
              NULL, nw, TOL_GEMM);
    free(adl), free(mx), free(mw), free(gxb), free(gwb);
  }
  gpu->dev_free(d_x16), gpu->dev_free(d_l16), gpu->dev_free(d_w), gpu->dev_free(la);
  gpu->dev_free(wide), gpu->dev_free(lossa), gpu->dev_free(lossb), gpu->dev_free(d_tgt);
  gpu->dev_free(d_dwa), gpu->dev_free(d_dwb), gpu->dev_free(dxa), gpu->dev_free(dxb);
  free(x), free(w), free(tgt), free(x16), free(fill), free(pa), free(l16), free(got), free(want);
  free(gw), free(xw), free(ref), free(mag), free(ax), free(wr), free(awr), free(ga);
  free(sa), free(sb), free(dw0), free(gxa), free(gwa);
}

/* matmul_fwd_res (kern.h, the bf16 mode's): out = inp w^T + bias + res,
 * inp in fp32 (packed by the product) or bf16 (in16), against the CPU's
 * product of the bf16-rounded operands plus the residual within TOL_GEMM of
 * the sums of magnitudes (|inp| |w| + |bias| + |res|): a residual dropped,
 * added twice (a product cut in blocks of its sum reads res with the first
 * only) or misplaced shows; into a buffer of its own and in place (out =
 * res). */
static void test_matmul_res(int N, int IC, int OC, int in16) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d IC=%d OC=%d %s", N, IC, OC, in16 ? "inp16" : "inp32");
  const size_t ni = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
  float *inp = frand(ni, -1, 1), *w = frand(nw, -0.5f, 0.5f), *bias = frand(OC, -1, 1);
  float *res = frand(no, -4, 4), *ref = xmalloc(no * 4), *mag = xmalloc(no * 4);
  float *ri = round_dup(inp, ni, 1), *rw = round_dup(w, nw, 1);
  cpu->matmul_fwd(ref, ri, rw, bias, N, IC, OC, OC);
  cpu->residual_fwd(ref, ref, res, no);
  float *ainp = fabs_dup(inp, ni), *aw = fabs_dup(w, nw), *abias = fabs_dup(bias, OC),
        *ares = fabs_dup(res, no);
  cpu->matmul_fwd(mag, ainp, aw, abias, N, IC, OC, OC);
  cpu->residual_fwd(mag, mag, ares, no);
  uint16_t *i16 = xmalloc(ni * 2);
  cpu->f32_to_bf16(i16, inp, ni);
  float *d_in = in16 ? NULL : dput(inp, ni * 4), *dw_ = dput(w, nw * 4), *db = dput(bias, OC * 4),
        *dres = dput(res, no * 4), *dout_ = dnew(no * 4);
  uint16_t *d_i16 = in16 ? dput(i16, ni * 2) : NULL;
  const unsigned long p0 = w16_packs();
  gpu->matmul_fwd_res(dout_, d_in, d_i16, dw_, NULL, db, dres, N, IC, OC);
  const unsigned long packs_w = w16_packs() - p0;
  float *got = dget(dout_, no);
  check_tol("matmul_fwd_res", "out-bf16ops", shape, got, ref, NULL, mag, NULL, no, TOL_GEMM);
  { /* given w's bf16 image (kern.h's w16): the same blocks of the sum */
    uint16_t *wbase, *d_w16 = dput_w16(w, nw, 0, &wbase);
    float *d_o = dnew(no * 4);
    const unsigned long p1 = w16_packs();
    gpu->matmul_fwd_res(d_o, d_in, d_i16, dw_, d_w16, db, dres, N, IC, OC);
    const unsigned long packs = w16_packs() - p1;
    float *gw = dget(d_o, no);
    check_w16("matmul_fwd_res", shape, IC % 8 != 0, nw, gw, got, ref, mag, no, TOL_GEMM, packs,
              packs_w);
    gpu->dev_free(wbase), gpu->dev_free(d_o), free(gw);
  }
  free(got);
  gpu->matmul_fwd_res(dres, d_in, d_i16, dw_, NULL, db, dres, N, IC, OC); /* in place */
  got = dget(dres, no);
  check_tol("matmul_fwd_res", "in place", shape, got, ref, NULL, mag, NULL, no, TOL_GEMM);
  free(got);
  if (d_in) gpu->dev_free(d_in);
  if (d_i16) gpu->dev_free(d_i16);
  gpu->dev_free(dw_), gpu->dev_free(db), gpu->dev_free(dres), gpu->dev_free(dout_);
  free(inp), free(w), free(bias), free(res), free(ref), free(mag), free(ri), free(rw), free(ainp),
      free(aw), free(abias), free(ares), free(i16);
}

/* gelu_bwd_bf16 (kern.h), the bf16 mode's: dinp16 is the CPU's gelu_bwd
 * rounded (f32_to_bf16; a NaN for a NaN), and dbias += the column sums of
 * the CPU's dinp in kern_math.h's order (each run of KERN_COLSUM_ROWS rows
 * summed from zero, row by row, the runs added in order: what
 * matmul_bwd_bf16's dbias gives from the fp32 dinp), summed here apart.
 * inp and dout start off floats past a 16-byte boundary (1: no 16-byte
 * load). */
static uint16_t bf16_nan_one(uint16_t v) { /* every NaN as one (dnew's fill stays) */
  return (v & 0x7f80) == 0x7f80 && (v & 0x7f) && v != 0xffff ? 0x7fc0 : v;
}
/* dbias += the column sums of x (N, C) in kern_math.h's order: each run of
 * KERN_COLSUM_ROWS rows summed from zero, row by row, the runs added in
 * order */
static void colsum_runs_add(float *dbias, const float *x, int N, int C) {
  for (int c = 0; c < C; c++)
    for (int r0 = 0; r0 < N; r0 += KERN_COLSUM_ROWS) {
      float run = 0.0f;
      for (int r = r0; r < N && r < r0 + KERN_COLSUM_ROWS; r++) run += x[(size_t)r * C + c];
      dbias[c] += run;
    }
}

static void test_gelu_bwd_bf16(int N, int C, int off) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d off=%d", N, C, off);
  const size_t n = (size_t)N * C;
  float *x = frand(n, -6, 6), *dout = frand(n, -1, 1), *bias = frand(C, -1, 1);
  const float special[] = {0.0f, -0.0f, 1e-30f, -10.5f, 10.5f, 3e38f, -3e38f, INFINITY, -INFINITY};
  for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++) x[i * 7 % n] = special[i];
  float *ref = xmalloc(n * 4), *dbias = fdup(bias, C);
  uint16_t *ref16 = xmalloc(n * 2);
  cpu->gelu_bwd(ref, x, dout, n, 0);
  cpu->f32_to_bf16(ref16, ref, n);
  colsum_runs_add(dbias, ref, N, C);
  float *dx = dnew((n + off) * 4), *dd = dnew((n + off) * 4), *db = dput(bias, C * 4);
  uint16_t *dh = dnew(n * 2);
  gpu->copy_h2d(dx + off, x, n * 4), gpu->copy_h2d(dd + off, dout, n * 4);
  gpu->gelu_bwd_bf16(dh, db, dx + off, dd + off, N, C);
  uint16_t *got = xmalloc(n * 2);
  gpu->copy_d2h(got, dh, n * 2);
  for (size_t i = 0; i < n; i++) got[i] = bf16_nan_one(got[i]), ref16[i] = bf16_nan_one(ref16[i]);
  check_bits_u16("gelu_bwd_bf16", "dinp16", shape, got, ref16, n);
  check_dev_bits("gelu_bwd_bf16", "dbias+=", shape, db, dbias, C);
  gpu->dev_free(dx), gpu->dev_free(dd), gpu->dev_free(db), gpu->dev_free(dh);
  free(x), free(dout), free(bias), free(ref), free(dbias), free(ref16), free(got);
}

/* gelu_fwd_bf16in and gelu_bwd_bf16in (kern.h): GELU of the fc product's
 * bf16 output with the bias added in fp32 as it is read, x = inp + bias[c]:
 * out is the CPU's gelu_fwd of x rounded (f32_to_bf16), dinp16 its
 * gelu_bwd rounded, and dbias += the column sums of the CPU's dinp in
 * kern_math.h's order: bit for bit under gelu_exact, else (gelu_fast) out
 * and dinp16 within a step (check_bf16_near) and dbias within 1e-5 of the
 * sums of magnitudes (check_gelu_dbias). inp holds bf16 specials (zeros,
 * +-inf, a NaN, past the clamps at +-10). On the emulator, also that the
 * mode's kernels ran. */
/* abs_tol: check_bf16_near's (forward 2^-100, backward 2^-21) */
static void check_gelu16(const char *op, const char *what, const char *shape, uint16_t *got,
                         uint16_t *ref, size_t n, float abs_tol) {
  for (size_t i = 0; i < n; i++) got[i] = bf16_nan_one(got[i]), ref[i] = bf16_nan_one(ref[i]);
  if (gelu_fast) check_bf16_near(op, what, shape, got, ref, n, abs_tol);
  else check_bits_u16(op, what, shape, got, ref, n);
}
/* device dbias (C) against want = dbias0 + the column sums of g (N x C) */
static void check_gelu_dbias(const char *op, const char *what, const char *shape, const float *d,
                             const float *want, const float *dbias0, const float *g, int N, int C) {
  if (!gelu_fast) {
    check_dev_bits(op, what, shape, d, want, C);
    return;
  }
  double *mag = xmalloc(C * sizeof *mag);
  for (int c = 0; c < C; c++) {
    mag[c] = fabs(dbias0[c]);
    for (int r = 0; r < N; r++) mag[c] += fabs(g[(size_t)r * C + c]);
  }
  /* a column the specials made infinite or NaN: the same there (0 after) */
  float *got = dget(d, C), *w = fdup(want, C);
  int odd = 0;
  for (int c = 0; c < C; c++)
    if (!isfinite(w[c])) {
      odd += !(got[c] == w[c] || (isnan(got[c]) && isnan(w[c])));
      got[c] = w[c] = 0.0f, mag[c] = 0.0;
    }
  report(op, "dbias+= non-finite", shape, 0, 0, "the same", -1, odd == 0);
  check_tol(op, what, shape, got, w, NULL, NULL, mag, C, 1e-5);
  free(got), free(w), free(mag);
}
static void test_gelu_bf16in(int N, int C, int offx, int offd, int offh) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d C=%d off=%d,%d,%d", N, C, offx, offd, offh);
  const size_t n = (size_t)N * C;
  float *xf = frand(n, -6, 6), *dout = frand(n, -1, 1), *bias = frand(C, -1, 1);
  const float special[] = {0.0f, -0.0f, -10.5f, 10.5f, 3e38f, -3e38f, INFINITY, -INFINITY, NAN};
  for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++) xf[i * 7 % n] = special[i];
  uint16_t *x16 = xmalloc(n * 2), *ref_out = xmalloc(n * 2), *ref_d = xmalloc(n * 2);
  cpu->f32_to_bf16(x16, xf, n);
  float *x = xmalloc(n * 4), *ref = xmalloc(n * 4), *dbias = frand(C, -1, 1);
  float *dbias0 = fdup(dbias, C);
  for (size_t i = 0; i < n; i++) x[i] = kern_bf16_to_f32(x16[i]) + bias[i % (size_t)C];
  cpu->gelu_fwd(ref, x, n);
  cpu->f32_to_bf16(ref_out, ref, n);
  cpu->gelu_bwd(ref, x, dout, n, 0);
  cpu->f32_to_bf16(ref_d, ref, n);
  colsum_runs_add(dbias, ref, N, C);
  /* backward's inp, dout and dinp16 start offx, offd and offh elements
   * past a 16-byte boundary (inp 4: 8-byte loads alone; 1: the
   * element-wise path; dinp16 1: no 8-byte store) */
  uint16_t *dx = dput(x16, n * 2), *dy = dnew(n * 2), *dh = dnew((n + offh) * 2),
           *dxo = dnew((n + offx) * 2);
  float *dd = dnew((n + offd) * 4), *db = dput(bias, C * 4), *dgb = dput(dbias0, C * 4);
  gpu->copy_h2d(dxo + offx, x16, n * 2), gpu->copy_h2d(dd + offd, dout, n * 4);
#ifdef KERN_CUDA_EMU
  const char *fwd_k[2][2] = {{"gelu_fwd_bf16in_kernel<uint32_t, false>",
                              "gelu_bwd_bf16_kernel<true, false, false>"},
                             {"gelu_fwd_bf16in_kernel<uint32_t, true>",
                              "gelu_bwd_bf16_kernel<true, false, true>"}};
  const unsigned long kf0 = cuda_emu_launches(fwd_k[gelu_fast][0]),
                      kb0 = cuda_emu_launches(fwd_k[gelu_fast][1]);
#endif
  gpu->gelu_fwd_bf16in(dy, dx, db, N, C);
  gpu->gelu_bwd_bf16in(dh + offh, dgb, dxo + offx, db, dd + offd, NULL, N, C);
#ifdef KERN_CUDA_EMU
  report("gelu_bf16in", gelu_fast ? "fast kernels" : "exact kernels", shape, 0, 0, "launches", -1,
         cuda_emu_launches(fwd_k[gelu_fast][0]) - kf0 == 1 &&
             cuda_emu_launches(fwd_k[gelu_fast][1]) - kb0 >= 1);
#endif
  uint16_t *got = xmalloc(n * 2);
  gpu->copy_d2h(got, dy, n * 2);
  check_gelu16("gelu_fwd_bf16in", "out", shape, got, ref_out, n, 0x1p-100f);
  gpu->copy_d2h(got, dh + offh, n * 2);
  check_gelu16("gelu_bwd_bf16in", "dinp16", shape, got, ref_d, n, 0x1p-21f);
  check_gelu_dbias("gelu_bwd_bf16in", "dbias+=", shape, dgb, dbias, dbias0, ref, N, C);
  { /* dout in bf16 (as matmul_bwd_dinp16 writes it), offd elements past
     * an 8-byte boundary (1, 3: the element-wise path): the CPU's on dout
     * widened */
    uint16_t *d16 = xmalloc(n * 2), *dd16 = dnew((n + offd) * 2);
    cpu->f32_to_bf16(d16, dout, n);
    cpu->bf16_to_f32(dout, d16, n);
    float *db2 = fdup(dbias0, C);
    cpu->gelu_bwd(ref, x, dout, n, 0);
    cpu->f32_to_bf16(ref_d, ref, n);
    colsum_runs_add(db2, ref, N, C);
    gpu->copy_h2d(dd16 + offd, d16, n * 2), gpu->copy_h2d(dgb, dbias0, C * 4);
    gpu->gelu_bwd_bf16in(dh + offh, dgb, dxo + offx, db, NULL, dd16 + offd, N, C);
    gpu->copy_d2h(got, dh + offh, n * 2);
    gpu->sync();
    check_gelu16("gelu_bwd_bf16in", "dinp16 (dout16)", shape, got, ref_d, n, 0x1p-21f);
    check_gelu_dbias("gelu_bwd_bf16in", "dbias+= (dout16)", shape, dgb, db2, dbias0, ref, N, C);
    gpu->dev_free(dd16), free(d16), free(db2);
  }
  { /* bias NULL: inp holds it (matmul_fwd_bf16_gelu's pre16), x = inp
     * widened; dout (fp32, dout as above: widened from bf16) */
    float *xw = xmalloc(n * 4), *db3 = fdup(dbias0, C);
    cpu->bf16_to_f32(xw, x16, n);
    cpu->gelu_fwd(ref, xw, n);
    cpu->f32_to_bf16(ref_out, ref, n);
    cpu->gelu_bwd(ref, xw, dout, n, 0);
    cpu->f32_to_bf16(ref_d, ref, n);
    colsum_runs_add(db3, ref, N, C);
    gpu->copy_h2d(dgb, dbias0, C * 4), gpu->copy_h2d(dd + offd, dout, n * 4);
    gpu->gelu_fwd_bf16in(dy, dx, NULL, N, C);
    gpu->gelu_bwd_bf16in(dh + offh, dgb, dxo + offx, NULL, dd + offd, NULL, N, C);
    gpu->copy_d2h(got, dy, n * 2);
    gpu->sync();
    check_gelu16("gelu_fwd_bf16in", "out (no bias)", shape, got, ref_out, n, 0x1p-100f);
    gpu->copy_d2h(got, dh + offh, n * 2);
    gpu->sync();
    check_gelu16("gelu_bwd_bf16in", "dinp16 (no bias)", shape, got, ref_d, n, 0x1p-21f);
    check_gelu_dbias("gelu_bwd_bf16in", "dbias+= (no bias)", shape, dgb, db3, dbias0, ref, N, C);
    free(xw), free(db3);
  }
  gpu->dev_free(dx), gpu->dev_free(dy), gpu->dev_free(dh), gpu->dev_free(dxo), gpu->dev_free(dd),
      gpu->dev_free(db), gpu->dev_free(dgb);
  free(xf), free(dout), free(bias), free(x16), free(ref_out), free(ref_d), free(x), free(ref),
      free(dbias), free(dbias0), free(got);
}

/* matmul_fwd_bf16_gelu (kern.h): the fc product with GELU in its write.
 * pre16: matmul_fwd_bf16_out16's with the same bias16, bit for bit on the
 * emulator (whose cuBLASLt sums both alike), and within the bf16 product's
 * bound of the CPU's product plus the bias, and a bf16 step, everywhere;
 * out16 within a bf16 step of float64's GELU (tanh form) of that, the
 * product's bound carried through GELU's slope (at most 1.13), and 5e-4
 * (GELU's tanh and erf forms are 4.7e-4 apart at most: cuBLASLt does not
 * say which it computes), so any GELU of the sum the device computes
 * passes, and a GELU of another input, or none, fails. refuse (emulator): cuBLASLt refuses the GELU epilogue
 * (1: CUDA_EMU_LT_GELU_REFUSE), or every epilogue with a bias (2:
 * CUDA_EMU_LT_BIAS_REFUSE): the product with its bias into pre16 (by the
 * bias's pass under 2, a rounding more) and GELU from it, out16 then
 * gelu_fwd_bf16in's bits on pre16. Nothing written past either matrix. */
static double gelu64(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static void test_matmul_gelu(int N, int IC, int OC, int with_w16, int refuse) {
  char shape[80];
  snprintf(shape, sizeof shape, "N=%d IC=%d OC=%d%s%s", N, IC, OC, with_w16 ? " w16" : "",
           refuse == 1 ? " GELU refused" : refuse == 2 ? " bias refused" : "");
  const char *env = refuse == 1 ? "CUDA_EMU_LT_GELU_REFUSE" : "CUDA_EMU_LT_BIAS_REFUSE";
  const size_t n = (size_t)N * OC, nx = (size_t)N * IC, nw = (size_t)OC * IC, guard = 8;
  float *x = frand(nx, -1, 1), *w = frand(nw, -0.5f, 0.5f), *b = frand(OC, -2, 2);
  uint16_t *x16 = xmalloc(nx * 2), *b16 = xmalloc(OC * 2), *fill = xmalloc((n + guard) * 2);
  float *bw = xmalloc(OC * 4);
  cpu->f32_to_bf16(x16, x, nx), cpu->f32_to_bf16(b16, b, OC), cpu->bf16_to_f32(bw, b16, OC);
  for (size_t i = 0; i < n + guard; i++) fill[i] = 0x7171;
  uint16_t *wbase = NULL, *d_w16 = with_w16 ? dput_w16(w, nw, 0, &wbase) : NULL;
  uint16_t *d_x16 = dput(x16, nx * 2), *d_b16 = dput(b16, OC * 2);
  uint16_t *d_out = dput(fill, (n + guard) * 2), *d_pre = dput(fill, (n + guard) * 2),
           *d_sum = dput(fill, n * 2), *d_g = dput(fill, n * 2);
  float *d_w = dput(w, nw * 4);
  if (refuse) setenv(env, "1", 1);
  const unsigned long passes0 = kern_cuda_gelu_passes();
  gpu->matmul_fwd_bf16_gelu(d_out, d_pre, d_x16, d_w, d_w16, d_b16, N, IC, OC);
  const unsigned long passes = kern_cuda_gelu_passes() - passes0;
  gpu->matmul_fwd_bf16_out16(d_sum, d_x16, d_w, d_w16, d_b16, N, IC, OC, OC);
  if (refuse) unsetenv(env);
  /* the epilogue taken where nothing refuses it (the bounds below pass the
   * pass after too: only this tells a GPU's cuBLASLt refused it); a ragged
   * N's sliver of rows (gemm_parts) a GPU may refuse: said, not checked */
  if (refuse || N % 8 == 0)
    report("matmul_fwd_bf16_gelu", "GELU passes", shape, (double)passes, 0, "0 unless refused",
           -1, refuse ? passes > 0 : passes == 0);
  else
    printf("test_cuda_kernels: matmul_fwd_bf16_gelu %s: %lu GELU passes\n", shape, passes);
  gpu->gelu_fwd_bf16in(d_g, d_pre, NULL, N, OC);
  uint16_t *out = (uint16_t *)dget(d_out, (n + guard) / 2), *pre = (uint16_t *)dget(d_pre, (n + guard) / 2);
  uint16_t *sum = (uint16_t *)dget(d_sum, n / 2), *g = (uint16_t *)dget(d_g, n / 2);
  size_t outside = 0;
  for (size_t i = n; i < n + guard; i++) outside += (out[i] != 0x7171) + (pre[i] != 0x7171);
  report("matmul_fwd_bf16_gelu", "outside", shape, (double)outside, 0, "untouched", -1, !outside);
#ifdef KERN_CUDA_EMU
  check_bits_u16("matmul_fwd_bf16_gelu", "pre16=out16+bias16", shape, pre, sum, n);
  if (refuse) check_bits_u16("matmul_fwd_bf16_gelu", "out16=gelu_bf16in", shape, out, g, n);
#endif
  /* the CPU's product of the bf16 operands, and of their magnitudes */
  float *xw = xmalloc(nx * 4), *ax = xmalloc(nx * 4), *wr = round_dup(w, nw, 1),
        *awr = fabs_dup(wr, nw), *ref = xmalloc(n * 4), *mag = xmalloc(n * 4);
  cpu->bf16_to_f32(xw, x16, nx);
  for (size_t i = 0; i < nx; i++) ax[i] = fabsf(xw[i]);
  cpu->matmul_fwd(ref, xw, wr, NULL, N, IC, OC, OC);
  cpu->matmul_fwd(mag, ax, awr, NULL, N, IC, OC, OC);
  float *gp = xmalloc(n * 4), *go = xmalloc(n * 4);
  double *rp = xmalloc(n * sizeof *rp), *ro = xmalloc(n * sizeof *ro),
         *mp = xmalloc(n * sizeof *mp), *mo = xmalloc(n * sizeof *mo);
  cpu->bf16_to_f32(gp, pre, n), cpu->bf16_to_f32(go, out, n);
  const double tol = TOL_GEMM_BF16;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < OC; j++) {
      const size_t k = (size_t)i * OC + j;
      const double s = (double)ref[k] + bw[j], e = tol * ((double)mag[k] + fabs(bw[j]));
      /* pre16: the sum's bound and its rounding (two under the bias's pass) */
      const double ep = e + fabs(s) / (refuse == 2 ? 128.0 : 256.0);
      rp[k] = s, mp[k] = ep / tol;
      /* out16: GELU's slope over the sum's bound (over pre16's where GELU
       * reads it), GELU's rounding, and float's GELU (fast or exact) */
      ro[k] = gelu64(s);
      mo[k] = (1.13 * (refuse ? ep : e) + fabs(ro[k]) / 256.0 + 5e-4) / tol;
    }
  check_tol("matmul_fwd_bf16_gelu", "pre16", shape, gp, NULL, rp, NULL, mp, n, tol);
  check_tol("matmul_fwd_bf16_gelu", "out16=gelu", shape, go, NULL, ro, NULL, mo, n, tol);
  gpu->dev_free(d_x16), gpu->dev_free(d_b16), gpu->dev_free(d_out), gpu->dev_free(d_pre),
      gpu->dev_free(d_sum), gpu->dev_free(d_g), gpu->dev_free(d_w);
  if (wbase) gpu->dev_free(wbase);
  free(x), free(w), free(b), free(x16), free(b16), free(fill), free(bw), free(out), free(pre),
      free(sum), free(g), free(xw), free(ax), free(wr), free(awr), free(ref), free(mag), free(gp),
      free(go), free(rp), free(ro), free(mp), free(mo);
}

/* matmul_bwd_dgelu16 (kern.h): the fc projection's backward with GELU's
 * backward in its dinp product. dw and dbias: matmul_bwd_dinp16's bits on
 * the same operands (the same products); dinp16 within the bf16 product's
 * bound of GELU's float64 derivative (tanh form) at pre16 times the CPU's
 * dout w, through the derivative's bound (1.13), plus its rounding, and
 * 4e-3 of the sum (the derivative's tanh and erf forms are 8.7e-4 apart at
 * most; a tanh.approx on a GPU a few 1e-3); refuse (emulator, CUDA_EMU_LT_GELU_REFUSE): the product rounded,
 * then the derivative times it, a rounding more. */
static double gelu64_grad(double x) {
  const double k = 0.7978845608028654, c = 0.044715, t = tanh(k * (x + c * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
}
static void test_matmul_bwd_dgelu(int N, int IC, int OC, int refuse) {
  char shape[80];
  snprintf(shape, sizeof shape, "N=%d IC=%d OC=%d%s", N, IC, OC, refuse ? " DGELU refused" : "");
  const size_t ni = (size_t)N * IC, nw = (size_t)OC * IC, nd = (size_t)N * OC;
  float *dout = frand(nd, -1, 1), *w = frand(nw, -0.5f, 0.5f), *x = frand(ni, -1, 2),
        *pre = frand(ni, -5, 5), *b0 = frand(OC, -1, 1);
  uint16_t *x16 = xmalloc(ni * 2), *p16 = xmalloc(ni * 2);
  cpu->f32_to_bf16(x16, x, ni), cpu->f32_to_bf16(p16, pre, ni);
  uint16_t *wbase, *d_w16 = dput_w16(w, nw, 0, &wbase), *d_x16 = dput(x16, ni * 2),
           *d_p16 = dput(p16, ni * 2), *d_g = dnew(ni * 2), *d_h = dnew(ni * 2);
  float *d_w = dput(w, nw * 4), *d_dout = dput(dout, nd * 4), *d_dw = dnew(nw * 4),
        *d_dw2 = dnew(nw * 4), *d_db = dput(b0, OC * 4), *d_db2 = dput(b0, OC * 4);
  gpu->copy_h2d(d_dw, w, nw * 4), gpu->copy_h2d(d_dw2, w, nw * 4); /* dw accumulates */
  if (refuse) setenv("CUDA_EMU_LT_GELU_REFUSE", "1", 1);
  const unsigned long passes0 = kern_cuda_gelu_passes();
  gpu->matmul_bwd_dgelu16(d_g, d_dw, d_db, d_dout, d_x16, d_w, d_w16, d_p16, N, IC, OC);
  const unsigned long passes = kern_cuda_gelu_passes() - passes0;
  if (refuse) unsetenv("CUDA_EMU_LT_GELU_REFUSE");
  if (refuse || N % 8 == 0)
    report("matmul_bwd_dgelu16", "DGELU passes", shape, (double)passes, 0, "0 unless refused", -1,
           refuse ? passes > 0 : passes == 0);
  else
    printf("test_cuda_kernels: matmul_bwd_dgelu16 %s: %lu DGELU passes\n", shape, passes);
  gpu->matmul_bwd_dinp16(d_h, d_dw2, d_db2, d_dout, NULL, d_x16, d_w, d_w16, N, IC, OC);
  float *dw2 = dget(d_dw2, nw), *db2 = dget(d_db2, OC);
  check_dev_bits("matmul_bwd_dgelu16", "dw=dinp16's", shape, d_dw, dw2, nw);
  check_dev_bits("matmul_bwd_dgelu16", "dbias=dinp16's", shape, d_db, db2, OC);
  free(dw2), free(db2);
  uint16_t *g = (uint16_t *)dget(d_g, ni / 2);
  float *gf = xmalloc(ni * 4), *dr = round_dup(dout, nd, 1), *wr = round_dup(w, nw, 1),
        *adr = fabs_dup(dr, nd), *awr = fabs_dup(wr, nw), *s0 = xmalloc(ni * 4),
        *mag = xmalloc(ni * 4), *pw = xmalloc(ni * 4);
  cpu->bf16_to_f32(gf, g, ni), cpu->bf16_to_f32(pw, p16, ni);
  /* dout (N, OC) w (OC, IC): the CPU's matmul_bwd's dinp, of the rounded
   * operands (its dw into a buffer of its own) */
  float *dwt = xmalloc(nw * 4);
  memset(dwt, 0, nw * 4);
  cpu->matmul_bwd(s0, dwt, NULL, dr, x, wr, N, IC, OC, OC, 0);
  cpu->matmul_bwd(mag, dwt, NULL, adr, x, awr, N, IC, OC, OC, 0);
  free(dwt);
  double *ref = xmalloc(ni * sizeof *ref), *bound = xmalloc(ni * sizeof *bound);
  const double tol = TOL_GEMM_BF16;
  for (size_t i = 0; i < ni; i++) {
    const double gd = gelu64_grad(pw[i]), sv = s0[i];
    ref[i] = gd * sv;
    const double e = tol * mag[i] + (refuse ? fabs(sv) / 256.0 : 0.0);
    bound[i] = (1.13 * e + fabs(ref[i]) / 256.0 + 4e-3 * fabs(sv) + 1e-6) / tol;
  }
  check_tol("matmul_bwd_dgelu16", "dinp16=gelu'*sum", shape, gf, NULL, ref, NULL, bound, ni, tol);
  /* against matmul_bwd_dinp16's dinp16 (the same sums, rounded) times the
   * derivative: bounded by the two roundings and the forms, not by the
   * sums' bound, which at large OC would pass the derivative taken at
   * another row's pre16 */
  uint16_t *h16 = (uint16_t *)dget(d_h, ni / 2);
  float *hw = xmalloc(ni * 4);
  cpu->bf16_to_f32(hw, h16, ni);
  for (size_t i = 0; i < ni; i++) {
    const double hv = hw[i];
    ref[i] = gelu64_grad(pw[i]) * hv;
    /* the sum's rounding through the derivative, the result's, the forms,
     * and another order of the fp32 sum (a GPU's other algorithm) */
    bound[i] = (1.13 * fabs(hv) / 256.0 + fabs(ref[i]) / 256.0 + 4e-3 * fabs(hv) + 1e-5 * mag[i] +
                1e-6) / tol;
  }
  check_tol("matmul_bwd_dgelu16", "dinp16=gelu'*dinp16", shape, gf, NULL, ref, NULL, bound, ni,
            tol);
  free(h16), free(hw);
  gpu->dev_free(wbase), gpu->dev_free(d_x16), gpu->dev_free(d_p16), gpu->dev_free(d_g),
      gpu->dev_free(d_h), gpu->dev_free(d_w), gpu->dev_free(d_dout), gpu->dev_free(d_dw),
      gpu->dev_free(d_dw2), gpu->dev_free(d_db), gpu->dev_free(d_db2);
  free(dout), free(w), free(x), free(pre), free(b0), free(x16), free(p16), free(g), free(gf),
      free(dr), free(wr), free(adr), free(awr), free(s0), free(mag), free(pw), free(ref),
      free(bound);
}

/* matmul_bwd_bf16's dbias from a bf16 dout (kern.h): the column sums of its
 * values widened, in the CPU's order (colsum_runs_add), bit for bit */
static void test_matmul_bwd_dbias16(int N, int IC, int OC) {
  char shape[64];
  snprintf(shape, sizeof shape, "N=%d IC=%d OC=%d", N, IC, OC);
  const size_t nd = (size_t)N * OC, ni = (size_t)N * IC, nw = (size_t)OC * IC;
  float *dout = frand(nd, -1, 1), *x = frand(ni, -1, 1), *w = frand(nw, -0.5f, 0.5f),
        *b0 = frand(OC, -1, 1), *want = fdup(b0, OC), *dw = xmalloc(nd * 4);
  uint16_t *d16 = xmalloc(nd * 2), *x16 = xmalloc(ni * 2);
  cpu->f32_to_bf16(d16, dout, nd), cpu->f32_to_bf16(x16, x, ni), cpu->bf16_to_f32(dw, d16, nd);
  colsum_runs_add(want, dw, N, OC);
  uint16_t *d_d16 = dput(d16, nd * 2), *d_x16 = dput(x16, ni * 2);
  float *d_w = dput(w, nw * 4), *d_db = dput(b0, OC * 4), *d_dw = dnew(nw * 4), *d_dinp = dnew(ni * 4);
  gpu->copy_h2d(d_dw, w, nw * 4);
  gpu->matmul_bwd_bf16(d_dinp, d_dw, d_db, NULL, d_d16, d_x16, d_w, NULL, N, IC, OC, OC, 0);
  check_dev_bits("matmul_bwd_bf16", "dbias+=colsum(dout16)", shape, d_db, want, OC);
  gpu->dev_free(d_d16), gpu->dev_free(d_x16), gpu->dev_free(d_w), gpu->dev_free(d_db),
      gpu->dev_free(d_dw), gpu->dev_free(d_dinp);
  free(dout), free(x), free(w), free(b0), free(want), free(dw), free(d16), free(x16);
}

/* layernorm_bwd16 and matmul_bwd16 (kern.h): the norm's backward with the
 * residual's gradient rounded to bf16 and its runs' column sums, then the
 * backward of the product that wrote the residual from those. Against the
 * ops they stand for, on the same inputs: layernorm_bwd (dinp, dw, db bit
 * for bit), dinp16 the CPU's rounding of that dinp, dsums the runs summed
 * on the host from it (from zero, in row order); then matmul_bwd_dinp16
 * and (pre16) matmul_bwd_dgelu16 from the fp32 dinp: dinp16 and dbias bit
 * for bit, dw too where the packed fp32 dout fits the packing buffer whole
 * (N OC elements; the same blocks of rows), else within an fp32 sum's
 * bound of it (the bf16 dout, never packed, takes its rows in fewer
 * blocks: dw's sum in another order, as kern.h allows; helper-83). */
static void test_ln_dres16(int N, int C, int IC) {
  char shape[80];
  snprintf(shape, sizeof shape, "N=%d C=%d IC=%d", N, C, IC);
  const size_t n = (size_t)N * C, ni = (size_t)N * IC, nw = (size_t)C * IC;
  const int runs = (N + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
  float *x = frand(n, -2, 3), *w = frand(C, 0.5f, 1.5f), *b = frand(C, -0.5f, 0.5f),
        *out = xmalloc(n * 4), *mean = xmalloc(N * 4), *rstd = xmalloc(N * 4);
  cpu->layernorm_fwd(out, mean, rstd, x, w, b, N, C);
  float *dout = frand(n, -1, 1), *dinp = frand(n, -1, 1), *dw = frand(C, -1, 1),
        *db = frand(C, -1, 1);
  float *dx = dput(x, n * 4), *dwn = dput(w, C * 4), *dm = dput(mean, N * 4),
        *dr = dput(rstd, N * 4), *ddout = dput(dout, n * 4);
  float *ref_dinp = dput(dinp, n * 4), *ref_dw = dput(dw, C * 4), *ref_db = dput(db, C * 4);
  float *got_dinp = dput(dinp, n * 4), *got_dw = dput(dw, C * 4), *got_db = dput(db, C * 4),
        *d_sums = dnew((size_t)runs * C * 4);
  uint16_t *d_r16 = dnew(n * 2);
  gpu->layernorm_bwd(ref_dinp, ref_dw, ref_db, ddout, dx, dwn, dm, dr, N, C);
#ifdef KERN_CUDA_EMU
  const unsigned long strided0 = cuda_emu_launches("layernorm_pack_colsum_kernel");
#endif
  gpu->layernorm_bwd16(got_dinp, d_r16, d_sums, got_dw, got_db, ddout, dx, dwn, dm, dr, N, C);
  float *rd = dget(ref_dinp, n), *rw = dget(ref_dw, C), *rb = dget(ref_db, C);
  check_dev_bits("layernorm_bwd16", "dinp=layernorm_bwd's", shape, got_dinp, rd, n);
  check_dev_bits("layernorm_bwd16", "dw=layernorm_bwd's", shape, got_dw, rw, C);
  check_dev_bits("layernorm_bwd16", "db=layernorm_bwd's", shape, got_db, rb, C);
  uint16_t *want16 = xmalloc(n * 2), *r16 = (uint16_t *)dget(d_r16, n / 2);
  cpu->f32_to_bf16(want16, rd, n);
  check_bits_u16("layernorm_bwd16", "dinp16=bf16(dinp)", shape, r16, want16, n);
  float *want_sums = xmalloc((size_t)runs * C * 4);
  for (int j = 0; j < runs; j++)
    for (int c = 0; c < C; c++) {
      float a = 0.0f;
      for (int r = j * KERN_COLSUM_ROWS; r < N && r < (j + 1) * KERN_COLSUM_ROWS; r++)
        a += rd[(size_t)r * C + c];
      want_sums[(size_t)j * C + c] = a;
    }
  check_dev_bits("layernorm_bwd16", "dsums=runs(dinp)", shape, d_sums, want_sums,
                 (size_t)runs * C);
#ifdef KERN_CUDA_EMU
  /* the wide kernel makes them as it goes where it runs (test_layernorm's
   * rule: C up to 1536 and its K's shared memory given), else a pass over
   * dinp after it */
  const int k = (C / 8 + 31) / 32, kk = k <= 2 ? k : k <= 4 ? 4 : 6;
  const size_t cmax = 256 * kk < 1536 ? 256 * kk : 1536;
  const unsigned long after = C <= 1536 && 64 * cmax <= cuda_emu_smem_optin() ? 0 : 1;
  const unsigned long strided = cuda_emu_launches("layernorm_pack_colsum_kernel") - strided0;
  report("layernorm_bwd16", "passes after the norm", shape, (double)strided, (double)after, "=",
         -1, strided == after);
#endif

  /* the product that wrote the residual (OC = C), from dinp16 and dsums */
  float *wm = frand(nw, -0.5f, 0.5f), *xi = frand(ni, -1, 2), *pre = frand(ni, -5, 5),
        *b0 = frand(C, -1, 1);
  uint16_t *x16 = xmalloc(ni * 2), *p16 = xmalloc(ni * 2);
  cpu->f32_to_bf16(x16, xi, ni), cpu->f32_to_bf16(p16, pre, ni);
  uint16_t *wbase, *d_w16 = dput_w16(wm, nw, 0, &wbase), *d_x16 = dput(x16, ni * 2),
           *d_p16 = dput(p16, ni * 2), *d_g = dnew(ni * 2), *d_h = dnew(ni * 2);
  float *d_w = dput(wm, nw * 4), *d_dw = dput(wm, nw * 4), *d_dw2 = dput(wm, nw * 4),
        *d_db = dput(b0, C * 4), *d_db2 = dput(b0, C * 4);
  for (int pre16 = 0; pre16 < 2; pre16++) {
    char sh[120];
    snprintf(sh, sizeof sh, "%s%s", shape, pre16 ? " pre16" : "");
    gpu->copy_h2d(d_dw, wm, nw * 4), gpu->copy_h2d(d_dw2, wm, nw * 4); /* dw accumulates */
    gpu->copy_h2d(d_db, b0, C * 4), gpu->copy_h2d(d_db2, b0, C * 4);
#ifdef KERN_CUDA_EMU
    const unsigned long packs0 = cuda_emu_launches("gemm_pack_colsum_kernel");
#endif
    gpu->matmul_bwd16(d_g, d_dw, d_db, d_r16, d_sums, d_x16, d_w, d_w16, pre16 ? d_p16 : NULL, N,
                      IC, C);
#ifdef KERN_CUDA_EMU
    const unsigned long packs = cuda_emu_launches("gemm_pack_colsum_kernel") - packs0;
    report("matmul_bwd16", "dout packings", sh, (double)packs, 0, "=", -1, packs == 0);
#endif
    if (pre16)
      gpu->matmul_bwd_dgelu16(d_h, d_dw2, d_db2, got_dinp, d_x16, d_w, d_w16, d_p16, N, IC, C);
    else
      gpu->matmul_bwd_dinp16(d_h, d_dw2, d_db2, got_dinp, NULL, d_x16, d_w, d_w16, N, IC, C);
    const char *ref_op = pre16 ? "matmul_bwd_dgelu16's" : "matmul_bwd_dinp16's";
    char what[96];
    uint16_t *g = (uint16_t *)dget(d_g, ni / 2), *h = (uint16_t *)dget(d_h, ni / 2);
    snprintf(what, sizeof what, "dinp16=%s", ref_op);
    check_bits_u16("matmul_bwd16", what, sh, g, h, ni);
    float *dw2 = dget(d_dw2, nw), *db2 = dget(d_db2, C);
    snprintf(what, sizeof what, "dbias=%s", ref_op);
    check_dev_bits("matmul_bwd16", what, sh, d_db, db2, C);
    if (n <= KERN_CUDA_SIZE_PACK_ELEMS) {
      snprintf(what, sizeof what, "dw=%s", ref_op);
      check_dev_bits("matmul_bwd16", what, sh, d_dw, dw2, nw);
    } else { /* |w| + |dout16|^T |x16|: the terms' magnitudes */
      float *ad = xmalloc(n * 4), *ax = xmalloc(ni * 4), *mw = xmalloc(nw * 4),
            *scr = xmalloc(ni * 4), *gw = dget(d_dw, nw);
      cpu->bf16_to_f32(ad, want16, n), cpu->bf16_to_f32(ax, x16, ni);
      for (size_t i = 0; i < n; i++) ad[i] = fabsf(ad[i]);
      for (size_t i = 0; i < ni; i++) ax[i] = fabsf(ax[i]);
      for (size_t i = 0; i < nw; i++) mw[i] = fabsf(wm[i]);
      cpu->matmul_bwd(scr, mw, NULL, ad, ax, wm, N, IC, C, C, 0);
      snprintf(what, sizeof what, "dw~%s (other row blocks)", ref_op);
      check_tol("matmul_bwd16", what, sh, gw, dw2, NULL, mw, NULL, nw, TOL_GEMM);
      free(ad), free(ax), free(mw), free(scr), free(gw);
    }
    free(g), free(h), free(dw2), free(db2);
  }
  gpu->dev_free(dx), gpu->dev_free(dwn), gpu->dev_free(dm), gpu->dev_free(dr),
      gpu->dev_free(ddout), gpu->dev_free(ref_dinp), gpu->dev_free(ref_dw),
      gpu->dev_free(ref_db), gpu->dev_free(got_dinp), gpu->dev_free(got_dw),
      gpu->dev_free(got_db), gpu->dev_free(d_sums), gpu->dev_free(d_r16), gpu->dev_free(wbase),
      gpu->dev_free(d_x16), gpu->dev_free(d_p16), gpu->dev_free(d_g), gpu->dev_free(d_h),
      gpu->dev_free(d_w), gpu->dev_free(d_dw), gpu->dev_free(d_dw2), gpu->dev_free(d_db),
      gpu->dev_free(d_db2);
  free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dinp), free(dw),
      free(db), free(rd), free(rw), free(rb), free(want16), free(r16), free(want_sums), free(wm),
      free(xi), free(pre), free(b0), free(x16), free(p16);
}

static void test_gelu_bf16_offsets(size_t n) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu offsets 4x8", n);
  float *x = frand(n, -6, 6), *y = xmalloc(n * 4);
  const float special[] = {0.0f, -0.0f, 1e-30f, -10.5f, 10.5f, 3e38f, -3e38f, INFINITY, -INFINITY};
  for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++) x[i] = special[i];
  uint16_t *h = xmalloc(n * 2);
  cpu->gelu_fwd(y, x, n);
  cpu->f32_to_bf16(h, y, n);
  float *dx = dnew((n + 3) * 4);
  uint16_t *dh = dnew((n + 7) * 2);
  size_t differ = 0, outside = 0, wide = 0;
#ifdef KERN_CUDA_EMU
  const unsigned long bw = cuda_emu_launches("gelu_fwd_bf16_wide_kernel"),
                      bn = cuda_emu_launches("gelu_fwd_bf16_kernel");
#endif
  to_bf16_offsets(gpu->gelu_fwd_bf16, x, h, n, dx, dh, &differ, &outside, &wide);
  report("gelu_fwd_bf16", "out=bf16(cpu gelu)", shape, differ ? INFINITY : 0, 0, "bits", -1, !differ);
  report("gelu_fwd_bf16", "out-outside", shape, 0, 0, "untouched", -1, !outside);
  if (differ || outside)
    printf("test_cuda_kernels:   %zu of 32 x %zu elements differ, %zu written outside\n", differ, n,
           outside);
#ifdef KERN_CUDA_EMU
  const int paths_ok = cuda_emu_launches("gelu_fwd_bf16_wide_kernel") - bw == wide &&
                       cuda_emu_launches("gelu_fwd_bf16_kernel") - bn == 32 - wide;
  report("gelu_fwd_bf16", "wide-launches", shape, 0, 0, "-", -1, paths_ok);
  if (!paths_ok) printf("test_cuda_kernels:   of 32 calls, %zu should go wide\n", wide);
#else
  (void)wide;
#endif
  gpu->dev_free(dx), gpu->dev_free(dh);
  free(x), free(y), free(h);
}

static void test_sumsq(size_t n) {
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  float *x = frand(n, -3, 3);
  float *dx = dput(x, n * 4);
  const double sc = cpu->sumsq(x, n), sg = gpu->sumsq(dx, n), d = fabs(sg - sc);
  char bound[32];
  snprintf(bound, sizeof bound, "%.0e*sum", TOL_F64);
  report("sumsq", "sum", shape, d, sc != 0 ? d / sc : d, bound, d > 0 ? d / (TOL_F64 * sc) : 0,
         d <= TOL_F64 * sc);
  gpu->dev_free(dx);
  free(x);
}

/* ---- main ------------------------------------------------------------------ */

/* The backend aborts on a CUDA error after printing it: report exit 2. */
static void on_abort(int sig) {
  (void)sig;
  static const char m[] = "test_cuda_kernels: aborted by a CUDA error (message above): exit 2\n";
  ssize_t w = write(2, m, sizeof m - 1);
  (void)w;
  _exit(2);
}

/* The emulator leaves a shape to the GPU (saying so); 0 where it runs. */
static int gpu_only(const char *what) {
#ifdef KERN_CUDA_EMU
  printf("test_cuda_kernels: %s skipped on the emulator (a GPU runs it)\n", what);
  return 1;
#else
  (void)what;
  return 0;
#endif
}

#ifdef KERN_CUDA_EMU
/* FSDP_CUDA_GEMM_ALGO (kern_cuda_opts_t.gemm_algo): a product takes the
 * algorithm the heuristic ranks that many places below its first, the last
 * it offers when it offers fewer (the emulator offers 4), 15 at most and 0
 * at least; o's modes back after. */
static void test_gemm_algo(const kern_cuda_opts_t *o) {
  const int asked[] = {0, 2, 3, 7, 99, -5}, want[] = {0, 2, 3, 3, 3, 0};
  char msg[512];
  float *x = dnew(16 * 4), *w = dnew(16 * 4), *out = dnew(16 * 4);
  gpu->dev_set(x, 0, 16 * 4), gpu->dev_set(w, 0, 16 * 4);
  int ok = 1;
  for (size_t i = 0; i < sizeof asked / sizeof asked[0]; i++) {
    kern_cuda_opts_t a = *o;
    a.gemm_algo = asked[i];
    ok &= kern_cuda_init(&a, msg, sizeof msg) == gpu;
    gpu->matmul_fwd(out, x, w, NULL, 4, 4, 4, 4);
    gpu->sync();
    if (cuda_emu_lt_last_rank() != want[i]) {
      printf("test_cuda_kernels:   gemm_algo %d: the product took rank %d, not %d\n", asked[i],
             cuda_emu_lt_last_rank(), want[i]);
      ok = 0;
    }
  }
  report("matmul_fwd", "gemm_algo", "ranks 0 2 3 7 99 -5", 0, 0, "-", -1, ok);
  kern_cuda_init(o, msg, sizeof msg);
  gpu->dev_free(x), gpu->dev_free(w), gpu->dev_free(out);
}
#endif

int main(void) {
  char msg[512];
  if (kern_cuda_device_count(msg, sizeof msg) == 0) {
    printf("test_cuda_kernels: no GPU (%s): skipped\n", msg);
    return 0;
  }
  const kern_cuda_opts_t o = {.device = 0, .tf32 = 0};
  gpu = kern_cuda_init(&o, msg, sizeof msg);
  if (!gpu) {
    fprintf(stderr, "test_cuda_kernels: kern_cuda_init: %s\n", msg);
    return 2;
  }
  signal(SIGABRT, on_abort);
  cpu = kern_cpu();
  const char *env = getenv("FSDP_TEST_SEED");
  const uint64_t seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
  rng_state = seed;
  printf(
      "test_cuda_kernels: device %s, %.1f GiB; cpu backend %s, %d threads; seed %llu "
      "(FSDP_TEST_SEED)\n",
      kern_cuda_device_name(), (double)kern_cuda_device_memory() / (1 << 30),
      kern_cpu_isa_name(kern_cpu_isa()), cpu->get_threads(), (unsigned long long)seed);

  /* the table itself */
  int table_ok = gpu == kern_cuda_init(&o, msg, sizeof msg) && !gpu->host_memory &&
                 !gpu->layernorm_fwd_bf16 && !gpu->gelu_fwd_bf16 && !gpu->matmul_fwd_bf16 &&
                 !gpu->matmul_bwd_bf16 && !gpu->gelu_bwd_bf16 && !gpu->matmul_fwd_bf16_out16 &&
                 !gpu->crossentropy_fwd_bwd_bf16in && !gpu->attention_scratch_bf16 &&
                 !gpu->gelu_fwd_bf16in && !gpu->gelu_bwd_bf16in && !gpu->matmul_fwd_res &&
                 /* fp32 products: no bf16 activations */
                 gpu->dev_alloc && gpu->dev_free && !gpu->reduce_f32 && !gpu->reduce_bf16 &&
                 !gpu->copy_stream && kern_cuda_reserved_bytes() > 0 && kern_cuda_stream();
  for (int op = 0; op < KERN_OP__COUNT; op++) table_ok &= gpu->supports_op((kern_op_t)op);
  report("table", "entries", "-", 0, 0, "-", -1, table_ok);

  test_dev_pool();
  test_memory(0);
  test_memory(1);
  test_memory(1000003);

  test_encoder(3, 5, 7, 11);
  /* dwte by warps (encoder.cu): positions past a multiple of 32 (111) and
   * a warp's columns past C (45), B not a power of two */
  test_encoder(3, 37, 45, 70);
  test_encoder(4, 1024, 768, 50257);

  test_layernorm(7, 33);
  test_layernorm(1, 1);
  /* the wide kernels: one group of 8 a lane, two, three of four (C =
   * 768, below), four (1024: every slot of the backward's preloaded dinp),
   * five of six (C = 1280), six (1536); and C past their 1536 (gpt2-xl's
   * 1600) or not a multiple of 8 (the strided kernels) */
  test_layernorm(5, 8);
  test_layernorm(9, 264);
  test_layernorm(6, 1024);
  test_layernorm(3, 1280);
  test_layernorm(2, 1536);
  test_layernorm(3, 1600);
  test_layernorm(4, 1004);
  test_layernorm(1024, 768);
  /* column sums over several runs of 32 rows, the last one partial; then
   * dw's and db's runs for more columns than the scratch holds at once (4097
   * runs: 2016 columns a slice) */
  test_layernorm(1000, 768);
  /* the wide backward in two launches (LN_EMU_BWD_ROWS), the first's 48
   * runs over the emulator's 37 blocks, the second's last run partial (13
   * rows: a round of 5, three warps idle); at K 2, a thread's second
   * column block partly past C (helper-80) */
  test_layernorm(1613, 768);
  test_layernorm(1581, 264);
  if (!gpu_only("test_layernorm(131100, 2048)")) test_layernorm(131100, 2048);

  test_matmul(5, 7, 3, 1, 3);
  test_matmul(33, 17, 65, 1, 65); /* dbias: two runs, the second of one row */
  test_matmul(1024, 768, 3072, 1, 3072);
  test_matmul(64, 768, 50257, 0, 50257);
  /* rows padded as the model pads its logits (gpt_config_logits_ld): the
   * LM head, and the bias and dbias passes over padded rows */
  test_matmul(64, 768, 50257, 0, 50304);
  test_matmul(33, 17, 65, 1, 71);
  test_matmul(33, 17, 65, 2, 71); /* a bias cuBLASLt's epilogue is not given */
#ifdef KERN_CUDA_EMU
  /* cuBLASLt refusing at the call the bias epilogue its heuristic offered:
   * the product is made again without it and the bias added after */
  setenv("CUDA_EMU_LT_BIAS_REFUSE", "1", 1);
  test_matmul(33, 17, 65, 1, 71);
  unsetenv("CUDA_EMU_LT_BIAS_REFUSE");
#endif
  test_matmul(70000, 8, 3, 1, 5); /* the bias add's rows past a grid's 65535 */
  /* dbias's 4224 runs of 32 rows for more columns than the scratch holds at
   * once (16M floats: 3968 columns): colsum.cu sums them a slice of columns
   * at a time, the last slice 160 columns wide */
  if (!gpu_only("test_matmul(135168, 8, 4128, 1)")) test_matmul(135168, 8, 4128, 1, 4128);

  /* head sizes 4 and 3: the products; 16, 32, 64, 128: the fused kernel,
   * with T across tile edges (16 and 32 rows) and one head */
  test_attention(1, 1, 8, 2);
  test_attention(3, 5, 12, 4);
  test_attention(2, 37, 48, 3);
  test_attention(1, 1, 32, 2);
  test_attention(3, 33, 64, 2);
  test_attention(2, 70, 128, 4);
  test_attention(1, 100, 256, 2);
  test_attention(2, 65, 64, 1);
  test_attention(1, GPT_T, 768, 12);
  /* the products where a fused kernel exists (FSDP_CUDA_ATTN_GEMM) */
  const kern_cuda_opts_t og = {.device = 0, .attn_gemm = 1};
  report("table", "attn_gemm mode", "-", 0, 0, "-", -1, kern_cuda_init(&og, msg, sizeof msg) == gpu);
  const kern_backend_t *fp32_table = gpu;
  attn_gemm = 1;
  test_attention(2, 37, 48, 3);
  test_attention(1, GPT_T, 768, 12);
  kern_cuda_init(&o, msg, sizeof msg);
  attn_gemm = 0;
#ifdef KERN_CUDA_EMU
  test_gemm_algo(&o);
#endif

  test_gelu(0);
  test_gelu(13);
  test_gelu((size_t)1024 * 3072 + 5);
  test_residual(1);
  test_residual((size_t)1024 * 768 + 3);
  /* n below a head plus 4 (one a thread), and past it, not a multiple of 4 */
  const size_t elem_ns[] = {1, 3, 5, 7, 1003};
  for (size_t i = 0; i < sizeof elem_ns / sizeof elem_ns[0]; i++) {
    test_elem_offsets("residual_fwd", run_residual_fwd, 3, 1, elem_ns[i],
                      "residual_fwd_wide_kernel", "residual_fwd_kernel");
    test_elem_offsets("residual_bwd", run_residual_bwd, 3, 2, elem_ns[i],
                      "residual_bwd_wide_kernel", "residual_bwd_kernel");
    test_elem_offsets("gelu_fwd", run_gelu_fwd, 2, 1, elem_ns[i], "gelu_fwd_wide_kernel",
                      "gelu_fwd_kernel");
    test_elem_offsets("gelu_bwd", run_gelu_bwd, 3, 1, elem_ns[i], "gelu_bwd_wide_kernel",
                      "gelu_bwd_kernel");
    test_elem_offsets("vec_add", run_vec_add, 2, 1, elem_ns[i], "vec_add_wide_kernel",
                      "vec_add_kernel");
    test_elem_offsets("vec_scale", run_vec_scale, 1, 1, elem_ns[i], "vec_scale_wide_kernel",
                      "vec_scale_kernel");
  }

  test_crossentropy(5, 97, 97);
  test_crossentropy(64, 50257, 50257);
  test_crossentropy(5, 97, 128);
  test_crossentropy(64, 50257, 50304);
  test_crossentropy(3, 60001, 60004); /* a row past 227 KiB: the streaming kernel */
  test_crossentropy_bwd_rows(70000, 5, 8);

  test_adamw(13, 1);
  test_adamw(((size_t)1 << 20) + 3, 7);
  test_adamw_segs(1, 1, 0, 1.0f, 0);
  test_adamw_segs(3, 1, 0, 1.0f, 0);
  test_adamw_segs(3, 2, 1, 1.0f, 0);
  test_adamw_segs(600, 5, 1, 1.0f, 0); /* three launches' worth */
  test_adamw_segs(4, 2, 1, 1.0f, 5);   /* an empty segment, then a gap */
  /* clipping in the step (adamw_segs_scaled) */
  test_adamw_segs(3, 2, 0, 0.3183f, 0);
  test_adamw_segs(600, 6, 1, 0.0771f, 0);

  test_cast(13);
  test_cast(1000003);
  /* n below a head plus 8 (one a thread), and past it, not a multiple of 8 */
  test_cast_offsets(1);
  test_cast_offsets(9);
  test_cast_offsets(15);
  test_cast_offsets(1003);
  test_cast_segs(5, 0);       /* one launch, an empty segment among them */
  test_cast_segs(80, 70001);  /* 26 small, the big one alone, 53 small: 1 + 2 launches or so */

  test_sumsq(0);
  test_sumsq(1);
  test_sumsq(1000);
  test_sumsq(((size_t)1 << 24) + 3);

  /* the products' other modes: a second init keeps the device and takes the
   * mode; printed lines carry the mode in their check names' bounds */
  const kern_cuda_opts_t modes[] = {{.device = 0, .bf16 = 1, .attn_gemm = 1},
                                    {.device = 0, .bf16 = 1, .attn_gemm = 1, .gemm_fast16bf = 1},
                                    {.device = 0, .tf32 = 1, .attn_gemm = 1}};
  const char *mode_names[] = {"bf16 mode", "bf16 mode (cuBLASLt rounds: fast16bf)", "tf32 mode"};
  const double tols[] = {TOL_GEMM_BF16, TOL_GEMM_BF16, TOL_GEMM_TF32};
  for (int m = 0; m < 3; m++) {
    bf16_exact = m == 0;
    printf("test_cuda_kernels: matrix products in %s\n", mode_names[m]);
    /* the mode that packs (m 0) has a table of its own, the fp32 ops and
     * the bf16 activations (kern.h); the others the first one */
    gpu = kern_cuda_init(&modes[m], msg, sizeof msg);
    const int offers = gpu && gpu->layernorm_fwd_bf16 && gpu->gelu_fwd_bf16 &&
                       gpu->matmul_fwd_bf16 && gpu->matmul_bwd_bf16 && gpu->gelu_bwd_bf16 &&
                       gpu->matmul_fwd_bf16_out16 && gpu->crossentropy_fwd_bwd_bf16in &&
                       gpu->attention_scratch_bf16 && gpu->gelu_fwd_bf16in &&
                       gpu->gelu_bwd_bf16in && gpu->matmul_fwd_res && gpu->matmul_fwd_bf16_gelu &&
                       gpu->matmul_bwd_dgelu16;
    report("table", mode_names[m], "-", 0, 0, "-", -1,
           gpu && (m == 0 ? offers && gpu != fp32_table && gpu->matmul_fwd == fp32_table->matmul_fwd
                          : gpu == fp32_table));
    if (!gpu) return 2;
    if (m == 0) /* attn_gemm: the products read fp32 qkv */
      report("table", "bf16 mode, attention by products: no bf16 qkv", "-", 0, 0, "-", -1,
             !gpu->attention_bf16_fits(768, 12));
    if (m == 0) {
      test_lm_head_bf16(5, 16, 97, 128);
      test_lm_head_bf16(3, 24, 1000, 1000); /* no padding: the second half ends the row */
      test_lm_head_bf16(64, 768, 50257, 50304);
      test_lm_head_bf16(2, 16, 60001, 60008); /* streaming */
      test_lm_head_l16(5, 16, 97, 128);
      test_lm_head_l16(64, 768, 50257, 50304);
      test_lm_head_l16(2, 16, 130001, 130008); /* streaming, in fp32 and in bf16 */
      /* the bf16 mode's cross-entropy: the special function unit's
       * exponential (crossentropy.cu), to the same bounds against the CPU
       * and float64. Only a GPU checks ex2.approx's own accuracy (the
       * emulator's is exp2f); the logits stay within 65 of the row's max,
       * so no probability is subnormal, which ex2 flushes to 0 */
      test_crossentropy(5, 97, 128);
      test_crossentropy(64, 50257, 50304);
      test_layernorm_bf16(7, 33);
      test_layernorm_bf16(1024, 768);
      test_gelu_bf16_offsets(1);
      test_gelu_bf16_offsets(9);
      test_gelu_bf16_offsets(1003);
      test_gelu_bf16_offsets((size_t)1024 * 3072 + 5);
      /* runs of 32 rows and a partial last (70); rows not 16-byte multiples
       * apart and a tail of 5 columns (45); no aligned load (off 1); gpt2's
       * 4C over 1000 rows */
      test_gelu_bwd_bf16(70, 3072, 0);
      test_gelu_bwd_bf16(37, 45, 0);
      test_gelu_bwd_bf16(33, 264, 1);
      /* the fc product's bf16 output: a tile's edge (264 = 256 + 8), a
       * run's tail (70 rows), a step's width (3072); GELU's fast form (the
       * default), and gpt2-124m's whole fch once (16 x 1024 rows at 4 x
       * 768 on a GPU) for the share of elements off the CPU's bits */
      gelu_fast = 1;
      if (!gpu_only("test_gelu_bf16in(16384, 3072, 0, 0, 0)")) test_gelu_bf16in(16384, 3072, 0, 0, 0);
      test_gelu_bf16in(70, 264, 0, 0, 0);
      test_gelu_bf16in(33, 3072, 0, 0, 0);
      test_gelu_bf16in(1, 8, 0, 0, 0);
      test_gelu_bf16in(37, 264, 1, 1, 0);
      test_gelu_bf16in(37, 264, 4, 0, 1);
      test_gelu_bf16in(37, 264, 0, 4, 0); /* dout16 8 bytes past 16: 8-byte loads */
      /* the fc product with GELU in its write: gpt2's 4C from C (w16 read
       * in place, or w packed), a ragged N, and (on the emulator) the
       * epilogue refused; gpt2-124m's whole fc product on a GPU */
      if (!gpu_only("test_matmul_gelu(16384, 768, 3072, 1, 0)"))
        test_matmul_gelu(16384, 768, 3072, 1, 0);
      test_matmul_gelu(70, 768, 3072, 1, 0);
      test_matmul_gelu(64, 768, 3072, 0, 0); /* N whole: the GELU passes counted */
      test_matmul_gelu(37, 64, 264, 0, 0);
#ifdef KERN_CUDA_EMU
      test_matmul_gelu(37, 64, 264, 1, 1);
      test_matmul_gelu(37, 64, 264, 0, 2);
#endif
      /* and its backward in the fc projection's: gpt2's shapes (4C from C),
       * a ragged N, refused (emulator); dbias from a bf16 dout */
      test_matmul_bwd_dgelu(70, 3072, 768, 0);
      test_matmul_bwd_dgelu(37, 264, 64, 0);
      test_matmul_bwd_dgelu(64, 3072, 768, 0); /* N whole: the DGELU passes counted */
      /* OC 8192: a whole sum of dout's fp32 rows fits the packing buffer
       * 1088 rows at a time, so gemm_bwd_joint's second row block (r0
       * 1088, its 1012 rows cut 1008 + 4) reads pre16 at its own rows */
      test_matmul_bwd_dgelu(2100, 16, 8192, 0);
#ifdef KERN_CUDA_EMU
      test_matmul_bwd_dgelu(37, 264, 64, 1);
#endif
      test_matmul_bwd_dbias16(70, 64, 264);
      test_matmul_bwd_dbias16(1000, 768, 3072);
      /* the norms' backward with the residual's gradient in bf16 for the
       * projections' (gpt2's attention and fc projections; a ragged last
       * run; rows past the emulator's 1536 a launch; C past the wide
       * kernels, 1536: the strided path and a pass after it) */
      test_ln_dres16(70, 768, 768);
      test_ln_dres16(100, 768, 3072);
      test_ln_dres16(1600, 64, 256);
      test_ln_dres16(45, 1600, 64);
      /* N C past the packing buffer: dout packed in 2 blocks of rows before,
       * read whole in bf16 now (helper-83's shape) */
      test_ln_dres16(2100, 8192, 16);
      /* fp32 rows 16-byte multiples apart, bf16 rows not (C % 8 == 4):
       * helper-69 found the 4-row path storing 16 bytes at an odd row */
      test_gelu_bwd_bf16(40, 36, 0);
      test_gelu_bwd_bf16(1000, 3072, 0);
      /* more runs than the scratch holds for every column at once (4097
       * runs: the columns in slices) */
      if (!gpu_only("test_gelu_bwd_bf16(131100, 4128, 0)")) test_gelu_bwd_bf16(131100, 4128, 0);
    }
    tol_gemm = tols[m];
    attn_gemm = 1; /* the products' path here; the fused attention's modes are below */
    test_matmul(1024, 768, 3072, 1, 3072);
    test_matmul(64, 768, 50257, 0, 50257);
    test_matmul(64, 768, 50257, 0, 50304);
    test_matmul(33, 17, 65, 2, 71);
    /* the bias in the BIAS epilogue of each of C's 4 blocks of columns
     * (bias + n0), and on the first block of the sum only (2304 below) */
    if (m == 0) test_matmul(64, 768, 50257, 1, 50304);
    /* bf16 products packed in blocks (matmul.cu): forward cut in rows and
     * in the sum (beta 0 on the first block of the sum only); backward's
     * joint blocks cut dout in 4 blocks of rows */
    if (m == 0) test_matmul(2304, 16384, 64, 1, 64);
    /* backward's joint blocks (matmul.cu, gemm_bwd_joint): dout (rows 1509
     * apart) cut in 2 blocks of rows and 2 of columns (1280 x 752 first),
     * each packed once for both dinp's and dw's products; IC not a
     * multiple of 8 (padded packed rows) */
    if (m == 0) test_matmul(2501, 8187, 1501, 1, 1509);
    /* the joint blocks with inp in bf16 (rows of a multiple of 8), dout
     * cut in 2 blocks of rows (3776 first) and 2 of columns (2256): inp's
     * second block is a view at row 3776, nothing packed */
    if (m == 0) test_matmul(7500, 256, 4500, 1, 4500);
    /* the joint blocks with inp in bf16 and one block of columns: dout
     * cut in 2 blocks of rows (35008 first), w packed once for both */
    if (m == 0) test_matmul(70000, 64, 256, 1, 256);
    /* the MLP's second product's shape (fc_proj: dinp16 for the bf16 GELU),
     * and one whose OC columns fit no joint block (IC OC above the packing
     * buffer's 16M: matmul_bwd_dinp16 by its separate products) */
    if (m == 0) test_matmul(256, 3072, 768, 1, 768);
    if (m == 0) test_matmul(64, 8192, 2064, 1, 2064);
    /* the projections with the residual: gpt2's two (attproj from fp32,
     * fcproj from bf16), the parts of a ragged one (N, IC and OC cut at
     * their multiples of 8: res read by the first part of the sum) and
     * one whose fp32 inp is packed in blocks of its sum (res with the
     * first block only) */
    if (m == 0) {
      test_matmul_res(256, 768, 768, 0);
      test_matmul_res(256, 3072, 768, 1);
      test_matmul_res(37, 29, 45, 0);
      test_matmul_res(2304, 16384, 64, 0);
    }
    /* the packing's paths (matmul.cu, gemm_pack_kernel: 8 elements a thread,
     * read in 16-byte loads where a source row is 16-byte aligned): IC = 20
     * and OC = 44, every row aligned and each a tail of 4; IC = 29 and
     * dout's rows 47 apart, most rows not aligned (8 scalar loads), tails
     * of 5 */
    if (m == 0) test_matmul(37, 20, 44, 1, 44);
    if (m == 0) test_matmul(37, 29, 45, 1, 47);
    test_attention(1, GPT_T, 768, 12);
    /* 25 heads: the products' batches (per batch row, over the heads) are
     * packed 13 and then 12 at a time */
    if (m == 0) test_attention(1, 1024, 1600, 25);
    /* heads of 3 columns: views of qkv at odd column offsets (3h, C + 3h),
     * packed one scalar load at a time, rows of 3 and of T = 5 all tail;
     * heads of 16 over T = 37: aligned views, rows of T ending in a tail */
    if (m == 0) test_attention(3, 5, 12, 4);
    if (m == 0) test_attention(2, 37, 48, 3);
    bf16_exact = 0;
  }
  /* bf16 mode's fused attention runs on tensor cores (attention_tc.cu):
   * the fused kernels' sizes (log-sum-exp rows, D rows), the bf16 products'
   * bound; every head size it is built for, T inside one 64-row tile,
   * across tile edges (65, 130: a last tile of 1 and 2 rows) and gpt2's */
  const kern_cuda_opts_t otc = {.device = 0, .bf16 = 1};
  printf("test_cuda_kernels: fused attention on bf16 tensor cores\n");
  const kern_backend_t *bf16_table = kern_cuda_init(&modes[0], msg, sizeof msg);
  gpu = kern_cuda_init(&otc, msg, sizeof msg);
  report("table", "bf16 mode, tensor-core attention", "-", 0, 0, "-", -1, gpu == bf16_table);
  const kern_cuda_opts_t oaf = {.device = 0, .bf16 = 1, .acts_fp32 = 1}; /* FSDP_CUDA_ACTS_FP32 */
  report("table", "bf16 mode, fp32 activations asked: none offered", "-", 0, 0, "-", -1,
         kern_cuda_init(&oaf, msg, sizeof msg) == fp32_table && !fp32_table->matmul_fwd_bf16);
  const kern_cuda_opts_t odf = {.device = 0, .bf16 = 1, .dinp_fp32 = 1}; /* FSDP_CUDA_DINP_FP32 */
  const kern_backend_t *dinp32_table = kern_cuda_init(&odf, msg, sizeof msg);
  report("table", "bf16 mode, fp32 activation gradients asked: the bf16 table but dinp16", "-",
         0, 0, "-", -1,
         dinp32_table && dinp32_table->matmul_fwd_bf16 && !dinp32_table->matmul_bwd_dinp16 &&
             !dinp32_table->attention_bwd_dqkv16 && !dinp32_table->layernorm_bwd16 &&
             !dinp32_table->matmul_bwd16 && bf16_table->matmul_bwd_dinp16 &&
             bf16_table->attention_bwd_dqkv16 && bf16_table->layernorm_bwd16 &&
             bf16_table->matmul_bwd16);
  /* FSDP_CUDA_GELU_EXACT: the same table, GELU of the bf16 activations on
   * the CPU's bits (kern_gelu) */
  const kern_cuda_opts_t oge = {.device = 0, .bf16 = 1, .gelu_exact = 1};
  gpu = kern_cuda_init(&oge, msg, sizeof msg);
  report("table", "bf16 mode, GELU's CPU bits asked: the bf16 table", "-", 0, 0, "-", -1,
         gpu == bf16_table);
  gelu_fast = 0;
  test_gelu_bf16in(70, 264, 0, 0, 0);
  test_gelu_bf16in(33, 3072, 0, 0, 0);
  test_gelu_bf16in(37, 264, 4, 0, 1);
  gpu = kern_cuda_init(&otc, msg, sizeof msg);
  tol_gemm = TOL_GEMM_BF16;
  attn_gemm = 0;
  attn_tc = 1;
  test_attention(3, 5, 64, 4);
  test_attention(3, 33, 64, 2);
  test_attention(2, 65, 64, 1);
  test_attention(2, 130, 256, 2);
  /* T ending inside a warp's 16 rows of a later 128-row block (forward and
   * key pass) and inside a 64-row tile, at head sizes 16, 32 and 64 */
  test_attention(1, 200, 32, 2);
  test_attention(1, 257, 64, 2);
  test_attention(2, 191, 128, 2);
  test_attention(1, GPT_T, 768, 12);
  /* qkv kept in bf16: head sizes 16, 32, 64 (not 128: it does not fit every
   * GPU's shared memory), T across tiles and blocks */
  test_attention_bf16(2, 70, 64, 2);
  test_attention_bf16(1, 200, 64, 4);
  test_attention_bf16(1, 130, 64, 1);
  test_attention_bf16(1, 65, 256, 2);
  test_attention_bf16(1, GPT_T, 768, 12);
#ifdef KERN_CUDA_EMU
  /* the attention op falls back to the fp32 kernels unasked where the
   * tensor-core ones do not fit: here they must have run */
  report("table", "tensor-core kernels ran", "-", 0, 0, "-", -1,
         cuda_emu_launches("tc_fwd_kernel<HS, O>") && cuda_emu_launches("tc_bwd_dq_kernel<HS, O, G>") &&
             cuda_emu_launches("tc_bwd_dkv_kernel<HS, G>"));
#endif
  /* FSDP_CUDA_ATTN_CUDNN: the bf16 ops by cuDNN; its init fails, saying
   * why, where cuDNN cannot open (not installed; on the emulator, no GPU of
   * its own), and the check says it skipped */
  const kern_cuda_opts_t odn = {.device = 0, .bf16 = 1, .attn_cudnn = 1};
  const kern_backend_t *dnn = kern_cuda_init(&odn, msg, sizeof msg);
  if (!dnn) {
    printf("test_cuda_kernels: cuDNN attention skipped: %s\n", msg);
    report("table", "cuDNN refused: the message says how to run without it", "-", 0, 0, "-", -1,
           strstr(msg, "FSDP_CUDA_ATTN_CUDNN=1: ") == msg &&
               strstr(msg, "leave FSDP_CUDA_ATTN_CUDNN unset") != NULL);
  } else {
    gpu = dnn;
    report("table", "bf16 mode, cuDNN attention: the bf16 table", "-", 0, 0, "-", -1,
           gpu == bf16_table);
    test_attention_cudnn(2, 70, 64, 2);
    test_attention_cudnn(1, 200, 64, 4);
    test_attention_cudnn(1, 130, 128, 4);
    test_attention_cudnn(1, GPT_T, 768, 12);
    /* the gradients in bf16, widened (where a cuDNN plans no fp32 ones) */
    kern_cudnn_bwd16(cudnn_g16 = 1);
    test_attention_cudnn(2, 70, 64, 2);
    test_attention_cudnn(1, GPT_T, 768, 12);
    kern_cudnn_bwd16(cudnn_g16 = 0);
    gpu = kern_cuda_init(&otc, msg, sizeof msg); /* the kernels again */
  }
  attn_tc = 0;
  /* FSDP_CUDA_ATTN_FP32: bf16 products, the fp32 fused attention, at fp32's bound */
  const kern_cuda_opts_t ofp = {.device = 0, .bf16 = 1, .attn_fp32 = 1};
  report("table", "bf16 mode, fp32 attention", "-", 0, 0, "-", -1,
         kern_cuda_init(&ofp, msg, sizeof msg) == bf16_table);
  /* the fp32 kernels read fp32 qkv: no bf16 qkv in this mode (nor with the
   * products, below) */
  report("table", "bf16 mode, fp32 attention: no bf16 qkv", "-", 0, 0, "-", -1,
         !gpu->attention_bf16_fits(768, 12));
  tol_gemm = TOL_GEMM;
  test_attention(2, 65, 64, 1);
  gpu = kern_cuda_init(&o, msg, sizeof msg);
  tol_gemm = TOL_GEMM;
  attn_gemm = 0;

  gpu->sync();
#ifdef KERN_CUDA_EMU
  /* every product above, fp32 and bf16, reached cuBLASLt with M, N and K
   * multiples of 8 or under 8 (matmul.cu's gemm_parts: the LM head's 50257,
   * the odd shapes of test_matmul and test_attention) */
  report("table", "products cut to multiples of 8", "-", 0, 0, "-", -1, cuda_emu_lt_ragged() == 0);
#endif
  printf("test_cuda_kernels: %d checks, %d failed (seed %llu)\n", n_checks, n_fails,
         (unsigned long long)seed);
  return n_fails ? 1 : 0;
}

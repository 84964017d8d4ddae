/* test_kernels: the CPU backend's ops against independent float64 references.
 *
 * For every op: the forward against a float64 implementation written here; the
 * backward against central finite differences (in float64) of that reference,
 * for the scalar loss L = sum(out * R) with R random; the accumulate contract
 * (a second backward into non-zero buffers adds to them). Outputs and scratch
 * are filled with NaN first, so a value an op forgets to write shows up.
 * Inputs are fresh each run: the seed comes from FSDP_TEST_SEED or the clock and
 * is logged, so `FSDP_TEST_SEED=<seed> test_kernels` replays a failure.
 * Shapes are small and odd (not multiples of the vector width). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "kernels/kern_math.h"
#include "tests/unit/testutil.h"

#define FWD_TOL 1e-5 /* fp32 forward vs float64 reference */
#define BWD_TOL 1e-4 /* fp32 backward vs float64 finite differences */
#define ACC_TOL 1e-6 /* second backward == first + initial contents */
#define FD_H 1e-6    /* finite-difference step, relative to max(1, |x|) */

static const kern_backend_t *K;
static uint64_t seed, rng;
/* Failure messages of randomised checks end with the seed: Criterion shows the
 * cr_log_info line of setup() only under --verbose. */
#define SEED ((unsigned long long)seed)

/* Picks and logs the seed; every test starts here (each runs in its own process). */
static void setup(void) {
  const char *s = getenv("FSDP_TEST_SEED");
  seed = s && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
  rng = seed;
  cr_log_info("seed %llu (replay with FSDP_TEST_SEED=%llu)", (unsigned long long)seed,
              (unsigned long long)seed);
  K = kern_cpu();
  cr_assert_not_null(K);
  K->set_threads(2); /* the ops' splits across threads are part of what is checked */
}

/* Every buffer a test takes goes through tnew() and is freed after the test
 * (test-san runs with LeakSanitizer). */
static void *allocs[512];
static int nallocs;

static void *tnew(size_t bytes) {
  cr_assert_lt(nallocs, (int)(sizeof allocs / sizeof allocs[0]), "raise allocs[]");
  void *p = calloc(1, bytes ? bytes : 1);
  cr_assert_not_null(p);
  return allocs[nallocs++] = p;
}

static void teardown(void) {
  while (nallocs > 0) free(allocs[--nallocs]);
}

TestSuite(kernels, .init = setup, .fini = teardown);

/* ---- buffers ---------------------------------------------------------------- */

static float *fnew(size_t n) {
  float *p = tnew(n * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = NAN;
  return p;
}

static double *dnew(size_t n) { return tnew(n * sizeof(double)); }

static float *frand(size_t n, double lo, double hi) {
  float *p = fnew(n);
  tu_fill_f32(p, n, &rng, lo, hi);
  return p;
}

static float *fcopy(const float *x, size_t n) {
  float *p = fnew(n);
  memcpy(p, x, n * sizeof *p);
  return p;
}

static double *to_f64(const float *x, size_t n) {
  double *p = dnew(n);
  for (size_t i = 0; i < n; i++) p[i] = x[i];
  return p;
}

static float *fzero(size_t n) {
  float *p = fnew(n);
  memset(p, 0, n * sizeof *p);
  return p;
}

#define EXPECT_REL(ours, ref, n, tol, what)                                          \
  do {                                                                               \
    double e_ = tu_rel_err_f32((ours), (ref), (n));                                  \
    cr_expect(e_ < (tol), "%s: relative error %.3g >= %.3g [seed %llu]", (what), e_, \
              (double)(tol), SEED);                                                  \
  } while (0)

/* ---- finite differences ---------------------------------------------------- */

typedef double (*loss_fn)(void *ctx);

/* grad[i] = dL/dx[i] by central differences; x is a float64 input that f reads. */
static void fd_grad(double *grad, double *x, size_t n, loss_fn f, void *ctx) {
  for (size_t i = 0; i < n; i++) {
    double xi = x[i], h = FD_H * fmax(1.0, fabs(xi));
    x[i] = xi + h;
    double lp = f(ctx);
    x[i] = xi - h;
    double lm = f(ctx);
    x[i] = xi;
    grad[i] = (lp - lm) / (2 * h);
  }
}

static double dot(const double *a, const double *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* Checks the accumulate contract: g0 holds random values, the backward call that
 * produced `after` started from g0, and `once` is what it gives from zeros. */
static void expect_accumulated(const float *after, const float *g0, const float *once, size_t n,
                               const char *what) {
  double *want = dnew(n);
  for (size_t i = 0; i < n; i++) want[i] = (double)g0[i] + (double)once[i];
  EXPECT_REL(after, want, n, ACC_TOL, what);
}

/* An op run with acc 0 on NaNs (fnew): every element written, each the value
 * acc 1 leaves on zeros (a zero's sign aside), the NaNs never read. */
static void expect_written(const float *got, const float *on_zeros, size_t n, const char *what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (!(got[i] == on_zeros[i]) && !bad++) first = i;
  cr_expect_eq(bad, 0, "%s: %zu of %zu elements differ from acc 1 on zeros (first %zu: %g, not %g)",
               what, bad, n, first, bad ? got[first] : 0.0, bad ? on_zeros[first] : 0.0);
}

/* ---- table ------------------------------------------------------------------ */

Test(kernels, table) {
  cr_expect_str_eq(K->name, "cpu");
  for (int op = 0; op < KERN_OP__COUNT; op++)
    cr_expect_eq(K->supports_op((kern_op_t)op), 1, "op %d", op);
  cr_expect_eq(K->supports_op(KERN_OP__COUNT), 0);
  K->set_threads(3);
  cr_expect_eq(K->get_threads(), 3);
  K->set_threads(0);
  cr_expect_eq(K->get_threads(), (int)sysconf(_SC_NPROCESSORS_ONLN), "0: all online cores");
  K->set_threads(1);
  cr_expect_eq(K->get_threads(), 1);
}

/* ---- encoder ---------------------------------------------------------------- */

enum { EB = 2, ET = 7, EC = 12, EV = 5 }; /* V < B*T: ids repeat */

static void encoder_ref(double *out, const int32_t *tok, const double *wte, const double *wpe) {
  for (int b = 0; b < EB; b++)
    for (int t = 0; t < ET; t++)
      for (int c = 0; c < EC; c++)
        out[(b * ET + t) * EC + c] = wte[tok[b * ET + t] * EC + c] + wpe[t * EC + c];
}

typedef struct {
  const int32_t *tok;
  double *wte, *wpe, *r, *out;
} enc_ctx_t;

static double enc_loss(void *p) {
  enc_ctx_t *c = p;
  encoder_ref(c->out, c->tok, c->wte, c->wpe);
  return dot(c->out, c->r, EB * ET * EC);
}

Test(kernels, encoder) {
  const size_t nout = EB * ET * EC, nte = EV * EC, npe = ET * EC;
  int32_t tok[EB * ET];
  for (int i = 0; i < EB * ET; i++) tok[i] = (int32_t)(tu_rand_u64(&rng) % (EV - 1));
  tok[0] = tok[1] = tok[ET] = 2; /* the same id twice in a row and across the batch */
  /* id EV-1 never occurs: its dwte row must stay as it was */
  float *wte = frand(nte, -1, 1), *wpe = frand(npe, -1, 1), *out = fnew(nout);
  K->encoder_fwd(out, tok, wte, wpe, EB, ET, EC);
  enc_ctx_t c = {tok, to_f64(wte, nte), to_f64(wpe, npe), dnew(nout), dnew(nout)};
  encoder_ref(c.out, tok, c.wte, c.wpe);
  EXPECT_REL(out, c.out, nout, FWD_TOL, "encoder out");

  float *r = frand(nout, -1, 1);
  for (size_t i = 0; i < nout; i++) c.r[i] = r[i];
  float *dwte = fzero(nte), *dwpe = fzero(npe);
  K->encoder_bwd(dwte, dwpe, r, tok, EB, ET, EC);
  double *gte = dnew(nte), *gpe = dnew(npe);
  fd_grad(gte, c.wte, nte, enc_loss, &c);
  fd_grad(gpe, c.wpe, npe, enc_loss, &c);
  EXPECT_REL(dwte, gte, nte, BWD_TOL, "encoder dwte");
  EXPECT_REL(dwpe, gpe, npe, BWD_TOL, "encoder dwpe");
  for (int ch = 0; ch < EC; ch++)
    cr_expect_eq(dwte[(EV - 1) * EC + ch], 0.0f, "dwte of an absent id [seed %llu]", SEED);

  float *g0te = frand(nte, -1, 1), *g0pe = frand(npe, -1, 1);
  float *ate = fcopy(g0te, nte), *ape = fcopy(g0pe, npe);
  K->encoder_bwd(ate, ape, r, tok, EB, ET, EC);
  expect_accumulated(ate, g0te, dwte, nte, "encoder dwte +=");
  expect_accumulated(ape, g0pe, dwpe, npe, "encoder dwpe +=");
}

/* ---- layernorm -------------------------------------------------------------- */

enum { LN = 14, LC = 13 };

static void layernorm_ref(double *out, double *mean, double *rstd, const double *x, const double *w,
                          const double *b) {
  for (int n = 0; n < LN; n++) {
    const double *xr = x + n * LC;
    double m = 0, v = 0;
    for (int c = 0; c < LC; c++) m += xr[c];
    m /= LC;
    for (int c = 0; c < LC; c++) v += (xr[c] - m) * (xr[c] - m);
    v /= LC; /* biased, as PyTorch */
    double r = 1.0 / sqrt(v + 1e-5);
    for (int c = 0; c < LC; c++) out[n * LC + c] = (xr[c] - m) * r * w[c] + b[c];
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = r;
  }
}

typedef struct {
  double *x, *w, *b, *r, *out;
} ln_ctx_t;

static double ln_loss(void *p) {
  ln_ctx_t *c = p;
  layernorm_ref(c->out, NULL, NULL, c->x, c->w, c->b);
  return dot(c->out, c->r, LN * LC);
}

Test(kernels, layernorm) {
  const size_t n = LN * LC;
  /* an offset well above the spread: the variance must not cancel */
  float *x = frand(n, 2, 4), *w = frand(LC, 0.5, 1.5), *b = frand(LC, -1, 1);
  float *out = fnew(n), *mean = fnew(LN), *rstd = fnew(LN);
  K->layernorm_fwd(out, mean, rstd, x, w, b, LN, LC);
  ln_ctx_t c = {to_f64(x, n), to_f64(w, LC), to_f64(b, LC), dnew(n), dnew(n)};
  double *rm = dnew(LN), *rr = dnew(LN);
  layernorm_ref(c.out, rm, rr, c.x, c.w, c.b);
  EXPECT_REL(out, c.out, n, FWD_TOL, "layernorm out");
  EXPECT_REL(mean, rm, LN, FWD_TOL, "layernorm mean");
  EXPECT_REL(rstd, rr, LN, FWD_TOL, "layernorm rstd");

  float *r = frand(n, -1, 1);
  for (size_t i = 0; i < n; i++) c.r[i] = r[i];
  float *dx = fzero(n), *dw = fzero(LC), *db = fzero(LC);
  K->layernorm_bwd(dx, dw, db, r, x, w, mean, rstd, LN, LC);
  double *gx = dnew(n), *gw = dnew(LC), *gb = dnew(LC);
  fd_grad(gx, c.x, n, ln_loss, &c);
  fd_grad(gw, c.w, LC, ln_loss, &c);
  fd_grad(gb, c.b, LC, ln_loss, &c);
  EXPECT_REL(dx, gx, n, BWD_TOL, "layernorm dinp");
  EXPECT_REL(dw, gw, LC, BWD_TOL, "layernorm dw");
  EXPECT_REL(db, gb, LC, BWD_TOL, "layernorm db");

  float *g0x = frand(n, -1, 1), *g0w = frand(LC, -1, 1), *g0b = frand(LC, -1, 1);
  float *ax = fcopy(g0x, n), *aw = fcopy(g0w, LC), *ab = fcopy(g0b, LC);
  K->layernorm_bwd(ax, aw, ab, r, x, w, mean, rstd, LN, LC);
  expect_accumulated(ax, g0x, dx, n, "layernorm dinp +=");
  expect_accumulated(aw, g0w, dw, LC, "layernorm dw +=");
  expect_accumulated(ab, g0b, db, LC, "layernorm db +=");
}

/* ---- matmul ----------------------------------------------------------------- */

enum { MN = 14, MI = 13, MO = 11 };

static void matmul_ref(double *out, const double *x, const double *w, const double *bias, int N,
                       int IC, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = bias ? bias[o] : 0;
      for (int i = 0; i < IC; i++) s += x[n * IC + i] * w[o * IC + i];
      out[n * OC + o] = s;
    }
}

typedef struct {
  double *x, *w, *bias, *r, *out;
} mm_ctx_t;

static double mm_loss(void *p) {
  mm_ctx_t *c = p;
  matmul_ref(c->out, c->x, c->w, c->bias, MN, MI, MO);
  return dot(c->out, c->r, MN * MO);
}

static void check_matmul(int with_bias) {
  const size_t nx = MN * MI, nw = MO * MI, no = MN * MO;
  float *x = frand(nx, -1, 1), *w = frand(nw, -1, 1), *bias = with_bias ? frand(MO, -1, 1) : NULL;
  float *out = fnew(no);
  K->matmul_fwd(out, x, w, bias, MN, MI, MO, MO);
  mm_ctx_t c = {to_f64(x, nx), to_f64(w, nw), with_bias ? to_f64(bias, MO) : NULL, dnew(no),
                dnew(no)};
  matmul_ref(c.out, c.x, c.w, c.bias, MN, MI, MO);
  EXPECT_REL(out, c.out, no, FWD_TOL, "matmul out");

  float *r = frand(no, -1, 1);
  for (size_t i = 0; i < no; i++) c.r[i] = r[i];
  float *dx = fzero(nx), *dw = fzero(nw), *db = with_bias ? fzero(MO) : NULL;
  K->matmul_bwd(dx, dw, db, r, x, w, MN, MI, MO, MO, 1);
  double *gx = dnew(nx), *gw = dnew(nw), *gb = dnew(MO);
  fd_grad(gx, c.x, nx, mm_loss, &c);
  fd_grad(gw, c.w, nw, mm_loss, &c);
  EXPECT_REL(dx, gx, nx, BWD_TOL, "matmul dinp");
  EXPECT_REL(dw, gw, nw, BWD_TOL, "matmul dw");

  float *g0x = frand(nx, -1, 1), *g0w = frand(nw, -1, 1);
  float *ax = fcopy(g0x, nx), *aw = fcopy(g0w, nw);
  float *g0b = with_bias ? frand(MO, -1, 1) : NULL, *ab = with_bias ? fcopy(g0b, MO) : NULL;
  K->matmul_bwd(ax, aw, ab, r, x, w, MN, MI, MO, MO, 1);
  expect_accumulated(ax, g0x, dx, nx, "matmul dinp +=");
  expect_accumulated(aw, g0w, dw, nw, "matmul dw +=");
  /* acc 0: dinp written over NaNs; dw and dbias still accumulate */
  float *wx = fnew(nx), *ww = fcopy(g0w, nw), *wb = with_bias ? fcopy(g0b, MO) : NULL;
  K->matmul_bwd(wx, ww, wb, r, x, w, MN, MI, MO, MO, 0);
  expect_written(wx, dx, nx, "matmul dinp =");
  expect_accumulated(ww, g0w, dw, nw, "matmul dw += with dinp written");
  if (with_bias) expect_accumulated(wb, g0b, db, MO, "matmul dbias += with dinp written");
  if (with_bias) {
    fd_grad(gb, c.bias, MO, mm_loss, &c);
    EXPECT_REL(db, gb, MO, BWD_TOL, "matmul dbias");
    expect_accumulated(ab, g0b, db, MO, "matmul dbias +=");
  }
}

Test(kernels, matmul_bias) { check_matmul(1); }
Test(kernels, matmul_no_bias) { check_matmul(0); }

/* An empty sum (OC 0): acc 0 still writes dinp, as zeros; acc 1 leaves it. */
Test(kernels, matmul_bwd_of_no_outputs_writes_zeros) {
  float *x = frand(MN * MI, -1, 1), *w = frand(MI, -1, 1), *dout = frand(MN, -1, 1);
  float *dx = fnew(MN * MI), *dw = fzero(MI), *z = fzero(MN * MI);
  K->matmul_bwd(dx, dw, NULL, dout, x, w, MN, MI, 0, 1, 0);
  expect_written(dx, z, MN * MI, "matmul dinp = (OC 0)");
  float *g0 = frand(MN * MI, -1, 1), *ax = fcopy(g0, MN * MI);
  K->matmul_bwd(ax, dw, NULL, dout, x, w, MN, MI, 0, 1, 1);
  expect_written(ax, g0, MN * MI, "matmul dinp += (OC 0)");
}

/* ---- attention -------------------------------------------------------------- */

/* Reference: per (b, h, query i), softmax over keys 0..i of q.k / sqrt(hs). */
static void attention_ref(double *out, double *att, const double *qkv, int B, int T, int C,
                          int NH) {
  int hs = C / NH;
  double scale = 1.0 / sqrt((double)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        double *row = att + (((size_t)b * NH + h) * T + i) * T;
        const double *q = qkv + ((size_t)b * T + i) * 3 * C + h * hs;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
          const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
          row[j] = scale * dot(q, k, hs);
          mx = fmax(mx, row[j]);
        }
        for (int j = 0; j <= i; j++) sum += row[j] = exp(row[j] - mx);
        for (int j = 0; j < T; j++) row[j] = j <= i ? row[j] / sum : 0;
        for (int d = 0; d < hs; d++) {
          double s = 0;
          for (int j = 0; j <= i; j++)
            s += row[j] * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + d];
          out[((size_t)b * T + i) * C + h * hs + d] = s;
        }
      }
}

typedef struct {
  int B, T, C, NH;
  double *qkv, *r, *out, *att;
} at_ctx_t;

static double at_loss(void *p) {
  at_ctx_t *c = p;
  attention_ref(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
  return dot(c->out, c->r, (size_t)c->B * c->T * c->C);
}

/* FSDP_ATTN_BLOCK is read once per process; each Criterion test is a process. */
static void check_attention(const char *block) {
  cr_assert_eq(setenv("FSDP_ATTN_BLOCK", block, 1), 0);
  const int B = 2, T = 7, C = 12, NH = 3;
  const size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
  const size_t nl = (size_t)B * NH * T;
  cr_assert_eq(K->attention_saved(B, T, C, NH), nl, "the CPU keeps a log-sum-exp a row");
  size_t ns = K->attention_scratch(B, T, C, NH);
  float *scratch = fnew(ns); /* NaN: the op must not read scratch it did not write */
  float *qkv = frand(nqkv, -2, 2), *out = fnew(no), *lse = fnew(nl);
  K->attention_fwd(out, lse, scratch, qkv, B, T, C, NH);
  at_ctx_t c = {B, T, C, NH, to_f64(qkv, nqkv), dnew(no), dnew(no), dnew(na)};
  attention_ref(c.out, c.att, c.qkv, B, T, C, NH);
  EXPECT_REL(out, c.out, no, FWD_TOL, "attention out");
  /* each row's log-sum-exp of its scaled scores, in float64 */
  double *rl = dnew(nl);
  const int hs = C / NH;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const double *q = c.qkv + ((size_t)b * T + i) * 3 * C + h * hs;
        double mx = -INFINITY, s = 0, sc[64];
        for (int j = 0; j <= i; j++) {
          sc[j] = dot(q, c.qkv + ((size_t)b * T + j) * 3 * C + C + h * hs, hs) / sqrt(hs);
          mx = fmax(mx, sc[j]);
        }
        for (int j = 0; j <= i; j++) s += exp(sc[j] - mx);
        rl[((size_t)b * NH + h) * T + i] = mx + log(s);
      }
  EXPECT_REL(lse, rl, nl, FWD_TOL, "attention log-sum-exp");

  float *r = frand(no, -1, 1);
  for (size_t i = 0; i < no; i++) c.r[i] = r[i];
  for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
  float *att = lse;
  float *dqkv = fzero(nqkv);
  K->attention_bwd(dqkv, scratch, r, qkv, out, att, B, T, C, NH, 1);
  double *g = dnew(nqkv);
  fd_grad(g, c.qkv, nqkv, at_loss, &c);
  EXPECT_REL(dqkv, g, nqkv, BWD_TOL, "attention dqkv");

  float *g0 = frand(nqkv, -1, 1), *acc = fcopy(g0, nqkv);
  for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
  K->attention_bwd(acc, scratch, r, qkv, out, att, B, T, C, NH, 1);
  expect_accumulated(acc, g0, dqkv, nqkv, "attention dqkv +=");
  float *wq = fnew(nqkv);
  for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
  K->attention_bwd(wq, scratch, r, qkv, out, att, B, T, C, NH, 0);
  expect_written(wq, dqkv, nqkv, "attention dqkv =");
}

Test(kernels, attention_blocks) { check_attention("3"); } /* blocks of 3, 3, 1 rows */
Test(kernels, attention_one_block) { check_attention("64"); }

/* ---- same results with 1 and 2 threads -------------------------------------- */

Test(kernels, threads_1_vs_2) {
  cr_assert_eq(setenv("FSDP_ATTN_BLOCK", "64", 1), 0);
  const int N = 200, IC = 96, OC = 130;
  float *x = frand((size_t)N * IC, -1, 1), *w = frand((size_t)OC * IC, -1, 1);
  float *bias = frand(OC, -1, 1), *dout = frand((size_t)N * OC, -1, 1);
  float *o[2], *dx[2], *dw[2], *db[2];
  const int B = 2, T = 70, C = 48, NH = 4; /* T > block: blocks of 64 and 6 rows */
  const size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = K->attention_saved(B, T, C, NH);
  float *qkv = frand(nqkv, -2, 2), *adout = frand(no, -1, 1);
  float *ao[2], *aa[2], *ag[2];
  float *scratch = fnew(K->attention_scratch(B, T, C, NH));
  for (int k = 0; k < 2; k++) {
    K->set_threads(k + 1);
    o[k] = fnew((size_t)N * OC);
    dx[k] = fzero((size_t)N * IC), dw[k] = fzero((size_t)OC * IC), db[k] = fzero(OC);
    K->matmul_fwd(o[k], x, w, bias, N, IC, OC, OC);
    K->matmul_bwd(dx[k], dw[k], db[k], dout, x, w, N, IC, OC, OC, 1);
    ao[k] = fnew(no), aa[k] = fnew(na), ag[k] = fzero(nqkv);
    K->attention_fwd(ao[k], aa[k], scratch, qkv, B, T, C, NH);
    K->attention_bwd(ag[k], scratch, adout, qkv, ao[k], aa[k], B, T, C, NH, 1);
  }
  struct {
    const char *what;
    float **v;
    size_t n;
  } cmp[] = {{"matmul out", o, (size_t)N * OC},  {"matmul dinp", dx, (size_t)N * IC},
             {"matmul dw", dw, (size_t)OC * IC}, {"matmul dbias", db, OC},
             {"attention out", ao, no},          {"attention att", aa, na},
             {"attention dqkv", ag, nqkv}};
  for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
    double e = tu_rel_err_f32f32(cmp[i].v[1], cmp[i].v[0], cmp[i].n);
    cr_expect(e < 1e-6, "%s: 1 vs 2 threads differ by %.3g [seed %llu]", cmp[i].what, e, SEED);
  }
}

/* ---- signals during the products ---------------------------------------------
 * oneDNN's JIT sgemm points rsp into its heap workspace while it runs (oneDNN
 * issue #4845): a signal handled there writes its frame into the heap. A
 * thread sends signals to the computing thread as fast as it can while it
 * runs the products of the tiny model's shapes (one thread computing: the
 * handler checks that its own frame lies on that thread's stack), then to
 * the process while two threads compute; the results must be those of a
 * run without signals, bit for bit. Without the fix (kern_cpu_sgemm holds
 * signals off) glibc aborted on a corrupted heap in each of 5 runs. */
static volatile sig_atomic_t sig_hits, sig_off_stack;
static uintptr_t sig_lo, sig_hi;
static atomic_int sig_stop;
static pthread_t sig_target;

static int sig_process; /* 1: signals to the process (any thread takes them) */

static void sig_count(int s) {
  (void)s;
  volatile char here;
  sig_hits++;
  if (pthread_equal(pthread_self(), sig_target) && /* the bounds known: this thread's */
      ((uintptr_t)&here < sig_lo || (uintptr_t)&here >= sig_hi))
    sig_off_stack++;
}

static void *sig_bomber(void *arg) {
  (void)arg;
  sigset_t mine; /* never this thread's to take */
  sigemptyset(&mine);
  sigaddset(&mine, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &mine, NULL);
  while (!atomic_load(&sig_stop)) {
    if (sig_process) kill(getpid(), SIGUSR1);
    else pthread_kill(sig_target, SIGUSR1);
    struct timespec ts = {0, 2000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

/* The products: the tiny model's matmuls forward and backward, and attention. */
static void sig_products(float *const out[5], const float *x, const float *w, const float *dout,
                         const float *qkv, float *scratch) {
  const int shapes[][2] = {{64, 192}, {64, 64}, {64, 256}, {256, 64}}; /* IC, OC */
  for (int s = 0; s < 4; s++) {
    const int IC = shapes[s][0], OC = shapes[s][1];
    K->matmul_fwd(out[0], x, w, NULL, 64, IC, OC, OC);
    memset(out[1], 0, 64 * 256 * sizeof(float));
    memset(out[2], 0, 256 * 256 * sizeof(float));
    K->matmul_bwd(out[1], out[2], NULL, dout, x, w, 64, IC, OC, OC, 1);
  }
  K->attention_fwd(out[3], out[3] + 2 * 32 * 64, scratch, qkv, 2, 32, 64, 4);
  memset(out[4], 0, 2 * 32 * 3 * 64 * sizeof(float));
  K->attention_bwd(out[4], scratch, dout, qkv, out[3], out[3] + 2 * 32 * 64, 2, 32, 64, 4, 1);
}

Test(kernels, products_take_no_signal_on_a_heap_stack, .timeout = 60) {
  float *x = frand(64 * 256, -1, 1), *w = frand(256 * 256, -1, 1), *dout = frand(64 * 256, -1, 1);
  float *qkv = frand(2 * 32 * 3 * 64, -1, 1), *scratch = fzero(K->attention_scratch(2, 32, 64, 4));
  const size_t nout[5] = {64 * 256, 64 * 256, 256 * 256, 2 * 32 * 64 + 2 * 4 * 32 * 32,
                          2 * 32 * 3 * 64};
  float *ref[5], *got[5];
  for (int i = 0; i < 5; i++) ref[i] = fzero(nout[i]), got[i] = fzero(nout[i]);

  pthread_attr_t at;
  void *base;
  size_t size;
  cr_assert_eq(pthread_getattr_np(pthread_self(), &at), 0);
  cr_assert_eq(pthread_attr_getstack(&at, &base, &size), 0);
  pthread_attr_destroy(&at);
  sig_lo = (uintptr_t)base, sig_hi = sig_lo + size;
  struct sigaction sa = {.sa_handler = sig_count};
  sigemptyset(&sa.sa_mask);
  cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
  sig_target = pthread_self();
  /* this thread signalled (its frames' place checked), then the process
   * with two threads computing (either may take them) */
  int same = 1;
  for (int phase = 0; phase < 2 && same; phase++) {
    sig_process = phase;
    K->set_threads(phase + 1);
    sig_products(ref, x, w, dout, qkv, scratch); /* without signals, at this thread count */
    atomic_store(&sig_stop, 0);
    pthread_t bomber;
    cr_assert_eq(pthread_create(&bomber, NULL, sig_bomber, NULL), 0);
    for (int it = 0; it < 400 && same; it++) {
      sig_products(got, x, w, dout, qkv, scratch);
      for (int i = 0; i < 5; i++) same &= !memcmp(got[i], ref[i], nout[i] * sizeof(float));
    }
    atomic_store(&sig_stop, 1);
    pthread_join(bomber, NULL);
    cr_expect(same, "phase %d: a product under signals differs from the same product without "
              "them", phase);
  }
  signal(SIGUSR1, SIG_IGN);
  cr_expect_gt(sig_hits, 100, "the signals came (%d)", (int)sig_hits);
  cr_expect_eq(sig_off_stack, 0, "%d of %d signal frames were off the thread's stack",
               (int)sig_off_stack, (int)sig_hits);
}

/* ---- gelu ------------------------------------------------------------------- */

enum { GN = 1003 };

static double gelu_ref(double x) {
  return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* dL/dx for L = sum(gelu(x) * r): the terms are independent, so a central
 * difference per element (a difference of the whole sum would drown small
 * terms in the rounding of large ones). */
static void gelu_fd(double *g, const double *x, const double *r, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double h = FD_H * fmax(1.0, fabs(x[i]));
    g[i] = r[i] * (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h);
  }
}

Test(kernels, gelu) {
  float *x = frand(GN, -5, 5), *out = fnew(GN);
  K->gelu_fwd(out, x, GN);
  double *xd = to_f64(x, GN), *want = dnew(GN);
  for (int i = 0; i < GN; i++) want[i] = gelu_ref(xd[i]);
  EXPECT_REL(out, want, GN, FWD_TOL, "gelu out");

  float *r = frand(GN, -1, 1), *dx = fzero(GN);
  K->gelu_bwd(dx, x, r, GN, 1);
  double *g = dnew(GN);
  gelu_fd(g, xd, to_f64(r, GN), GN);
  EXPECT_REL(dx, g, GN, BWD_TOL, "gelu dinp");

  float *g0 = frand(GN, -1, 1), *acc = fcopy(g0, GN);
  K->gelu_bwd(acc, x, r, GN, 1);
  expect_accumulated(acc, g0, dx, GN, "gelu dinp +=");
  float *wx = fnew(GN);
  K->gelu_bwd(wx, x, r, GN, 0);
  expect_written(wx, dx, GN, "gelu dinp =");
}

/* The tails, one element at a time: tanh saturates, and for +-1e13 x^3
 * overflows fp32 (x^2 must not: past 1.8e19 kern_gelu_grad computes
 * 0 * inf = NaN). */
Test(kernels, gelu_tails) {
  const float x[] = {0.0f, -0.0f, 10.0f, -10.0f, 40.0f, -40.0f, 1e13f, -1e13f};
  enum { NT = sizeof x / sizeof x[0] };
  float out[NT], dx[NT] = {0}, one[NT];
  for (int i = 0; i < NT; i++) one[i] = 1.0f;
  K->gelu_fwd(out, x, NT);
  K->gelu_bwd(dx, x, one, NT, 1);
  double xd[NT], rd[NT], g[NT];
  for (int i = 0; i < NT; i++) xd[i] = x[i], rd[i] = 1.0;
  gelu_fd(g, xd, rd, NT);
  for (int i = 0; i < NT; i++) {
    double want = gelu_ref(xd[i]);
    cr_expect(fabs(out[i] - want) <= 1e-6 * fmax(1.0, fabs(want)), "gelu(%g) = %g, want %g", xd[i],
              out[i], want);
    cr_expect(fabs(dx[i] - g[i]) <= 1e-5, "gelu'(%g) = %g, want %g", xd[i], dx[i], g[i]);
  }
  /* inputs whose cube overflows fp32: the derivative stays 1 or 0, never NaN */
  const float huge[] = {1e20f, -1e20f, INFINITY, -INFINITY};
  float dh[4] = {0}, ones[4] = {1, 1, 1, 1};
  K->gelu_bwd(dh, huge, ones, 4, 1);
  cr_expect(dh[0] == 1.0f && dh[1] == 0.0f && dh[2] == 1.0f && dh[3] == 0.0f,
            "gelu' at +-1e20, +-inf: %g %g %g %g", dh[0], dh[1], dh[2], dh[3]);
}

/* ---- residual --------------------------------------------------------------- */

Test(kernels, residual) {
  const size_t n = 1003;
  float *a = frand(n, -1, 1), *b = frand(n, -1, 1), *out = fnew(n), *r = frand(n, -1, 1);
  K->residual_fwd(out, a, b, n);
  double *want = dnew(n);
  for (size_t i = 0; i < n; i++) want[i] = (double)a[i] + b[i];
  EXPECT_REL(out, want, n, FWD_TOL, "residual out");
  /* L = sum((a + b) * r) is linear: dL/da = dL/db = r exactly */
  double *g = to_f64(r, n);
  float *da = fzero(n), *db = fzero(n);
  K->residual_bwd(da, db, r, n);
  EXPECT_REL(da, g, n, BWD_TOL, "residual da");
  EXPECT_REL(db, g, n, BWD_TOL, "residual db");
  float *g0a = frand(n, -1, 1), *g0b = frand(n, -1, 1);
  float *aa = fcopy(g0a, n), *ab = fcopy(g0b, n);
  K->residual_bwd(aa, ab, r, n);
  expect_accumulated(aa, g0a, da, n, "residual da +=");
  expect_accumulated(ab, g0b, db, n, "residual db +=");
}

/* ---- cross-entropy ---------------------------------------------------------- */

enum { XN = 14, XV = 37 };

static void xent_ref(double *losses, double *probs, const double *logits, const int32_t *tgt) {
  for (int n = 0; n < XN; n++) {
    const double *x = logits + n * XV;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < XV; j++) mx = fmax(mx, x[j]);
    for (int j = 0; j < XV; j++) s += exp(x[j] - mx);
    if (probs)
      for (int j = 0; j < XV; j++) probs[n * XV + j] = exp(x[j] - mx) / s;
    losses[n] = log(s) - (x[tgt[n]] - mx);
  }
}

typedef struct {
  const int32_t *tgt;
  double *logits, *losses, dloss;
} xent_ctx_t;

static double xent_loss(void *p) {
  xent_ctx_t *c = p;
  xent_ref(c->losses, NULL, c->logits, c->tgt);
  double s = 0;
  for (int n = 0; n < XN; n++) s += c->dloss * c->losses[n];
  return s;
}

Test(kernels, crossentropy) {
  const size_t n = XN * XV;
  int32_t tgt[XN];
  for (int i = 0; i < XN; i++) tgt[i] = (int32_t)(tu_rand_u64(&rng) % XV);
  float *logits = frand(n, -3, 3);
  for (int j = 0; j < XV; j++) logits[j] += 100; /* expf(100) overflows without the max */
  logits[XV + tgt[1]] = -120;                    /* p[target] underflows to 0 in fp32 */
  float *probs = fcopy(logits, n), *losses = fnew(XN);
  K->crossentropy_fwd(losses, probs, tgt, XN, XV, XV);
  xent_ctx_t c = {tgt, to_f64(logits, n), dnew(XN), 0.37};
  double *wp = dnew(n);
  xent_ref(c.losses, wp, c.logits, tgt);
  EXPECT_REL(losses, c.losses, XN, FWD_TOL, "crossentropy losses");
  EXPECT_REL(probs, wp, n, FWD_TOL, "crossentropy probs");
  for (int i = 0; i < XN; i++)
    cr_expect(isfinite(losses[i]), "loss %d = %g [seed %llu]", i, losses[i], SEED);

  K->crossentropy_bwd(probs, tgt, (float)c.dloss, XN, XV, XV);
  double *g = dnew(n);
  fd_grad(g, c.logits, n, xent_loss, &c);
  EXPECT_REL(probs, g, n, BWD_TOL, "crossentropy dlogits");
}

/* ---- padded rows (the LM head's logits) ------------------------------------------
 * Rows ld > OC (V) apart must give the dense results bit for bit, never read
 * the padding and never write it. It holds 0x71717171 (1.2e30): finite, so
 * a read goes far off, and a write changes it (x * s would keep a NaN's
 * bits). */

/* A copy of x (rows x cols) with rows ld apart, the padding 0x71 bytes. */
static float *pad_rows(const float *x, int rows, int cols, int ld) {
  float *p = fnew((size_t)rows * ld);
  memset(p, 0x71, (size_t)rows * ld * sizeof *p);
  for (int r = 0; r < rows; r++) memcpy(p + (size_t)r * ld, x + (size_t)r * cols, cols * sizeof *x);
  return p;
}

/* p (rows ld apart) holds x's bits in its first cols columns and 0x71 bytes in the rest. */
static void expect_padded(const float *p, const float *x, int rows, int cols, int ld,
                          const char *what) {
  for (int r = 0; r < rows; r++) {
    cr_expect(!memcmp(p + (size_t)r * ld, x + (size_t)r * cols, cols * sizeof *x),
              "%s: row %d differs from the dense result", what, r);
    for (int c = cols; c < ld; c++) {
      uint32_t u;
      memcpy(&u, p + (size_t)r * ld + c, sizeof u);
      cr_expect(u == 0x71717171u, "%s: padding at row %d column %d was written (0x%08x)", what, r,
                c, u);
    }
  }
}

Test(kernels, a_padded_leading_dimension_gives_the_dense_bits) {
  const int LD = MO + 5; /* and XV + 27 below: odd pads, unaligned rows */
  float *x = frand(MN * MI, -1, 1), *w = frand(MO * MI, -1, 1), *bias = frand(MO, -1, 1);
  float *out = fnew(MN * MO), *pout = pad_rows(out, MN, MO, LD);
  K->matmul_fwd(out, x, w, bias, MN, MI, MO, MO);
  K->matmul_fwd(pout, x, w, bias, MN, MI, MO, LD);
  expect_padded(pout, out, MN, MO, LD, "matmul_fwd");

  float *r = frand(MN * MO, -1, 1), *pr = pad_rows(r, MN, MO, LD);
  float *dx = fzero(MN * MI), *dw = fzero(MO * MI), *db = fzero(MO);
  float *pdx = fzero(MN * MI), *pdw = fzero(MO * MI), *pdb = fzero(MO);
  K->matmul_bwd(dx, dw, db, r, x, w, MN, MI, MO, MO, 1);
  K->matmul_bwd(pdx, pdw, pdb, pr, x, w, MN, MI, MO, LD, 1);
  cr_expect(!memcmp(dx, pdx, MN * MI * sizeof *dx), "matmul_bwd dinp from padded dout");
  cr_expect(!memcmp(dw, pdw, MO * MI * sizeof *dw), "matmul_bwd dw from padded dout");
  cr_expect(!memcmp(db, pdb, MO * sizeof *db), "matmul_bwd dbias from padded dout");
  expect_padded(pr, r, MN, MO, LD, "matmul_bwd's dout");

  const int XLD = XV + 27;
  int32_t tgt[XN];
  for (int i = 0; i < XN; i++) tgt[i] = (int32_t)(tu_rand_u64(&rng) % XV);
  float *lg = frand(XN * XV, -3, 3), *plg = pad_rows(lg, XN, XV, XLD);
  float *loss = fnew(XN), *ploss = fnew(XN);
  K->crossentropy_fwd(loss, lg, tgt, XN, XV, XV);
  K->crossentropy_fwd(ploss, plg, tgt, XN, XV, XLD);
  cr_expect(!memcmp(loss, ploss, XN * sizeof *loss), "crossentropy_fwd losses from padded rows");
  expect_padded(plg, lg, XN, XV, XLD, "crossentropy_fwd probs");
  K->crossentropy_bwd(lg, tgt, 0.37f, XN, XV, XV);
  K->crossentropy_bwd(plg, tgt, 0.37f, XN, XV, XLD);
  expect_padded(plg, lg, XN, XV, XLD, "crossentropy_bwd dlogits");
}

/* The fused op (a training step's forward) gives the bits of forward and then
 * backward, from padded rows too, and leaves the padding alone; with the
 * overflowing row and the underflowing target of Test(kernels, crossentropy). */
Test(kernels, crossentropy_fwd_bwd) {
  const int XLD = XV + 27;
  const size_t n = XN * XV;
  int32_t tgt[XN];
  for (int i = 0; i < XN; i++) tgt[i] = (int32_t)(tu_rand_u64(&rng) % XV);
  float *lg = frand(n, -3, 3);
  for (int j = 0; j < XV; j++) lg[j] += 100;
  lg[XV + tgt[1]] = -120;
  float *plg = pad_rows(lg, XN, XV, XLD), *loss = fnew(XN), *floss = fnew(XN);
  K->crossentropy_fwd(loss, lg, tgt, XN, XV, XV);
  K->crossentropy_bwd(lg, tgt, 0.37f, XN, XV, XV);
  K->crossentropy_fwd_bwd(floss, plg, tgt, 0.37f, XN, XV, XLD);
  cr_expect(!memcmp(loss, floss, XN * sizeof *loss), "crossentropy_fwd_bwd losses");
  expect_padded(plg, lg, XN, XV, XLD, "crossentropy_fwd_bwd dlogits");
}

/* ---- adamw ------------------------------------------------------------------ */

Test(kernels, adamw) {
  const size_t n = 1003;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  float *p = frand(n, -1, 1), *m = fzero(n), *v = fzero(n);
  double *rp = to_f64(p, n), *rm = dnew(n), *rv = dnew(n), *d = dnew(n);
  float *p0 = fnew(n);
  for (int t = 1; t <= 6; t++) {
    float *g = frand(n, -1, 1);
    memcpy(p0, p, n * sizeof *p);
    K->adamw(p, g, m, v, n, lr, b1, b2, eps, wd, t);
    /* PyTorch AdamW: decay, moments, bias-corrected step */
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
      rp[i] *= 1 - (double)lr * wd;
      rm[i] = b1 * rm[i] + (1 - (double)b1) * g[i];
      rv[i] = b2 * rv[i] + (1 - (double)b2) * g[i] * g[i];
      rp[i] -= lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
      d[i] = rp[i] - p0[i];
    }
    EXPECT_REL(p, rp, n, FWD_TOL, "adamw p");
    EXPECT_REL(m, rm, n, FWD_TOL, "adamw m");
    EXPECT_REL(v, rv, n, FWD_TOL, "adamw v");
    /* the step itself, which is small next to p */
    for (size_t i = 0; i < n; i++) p0[i] = p[i] - p0[i];
    EXPECT_REL(p0, d, n, BWD_TOL, "adamw step");
    /* carry on from our state so errors do not compound across steps */
    for (size_t i = 0; i < n; i++) rp[i] = p[i], rm[i] = m[i], rv[i] = v[i];
  }
}

/* adamw_segs: random segments (empty ones, gaps between them, random decay)
 * against adamw on each segment alone, bit for bit; the bf16 image each new
 * p's f32_to_bf16; every element in no segment (p, m, v and the image)
 * untouched; without an image, the same p, m and v. */
Test(kernels, adamw_segs) {
  enum { NSEG = 40 };
  kern_seg_t seg[NSEG];
  size_t n = 0;
  for (int k = 0; k < NSEG; k++) {
    n += tu_rand_u64(&rng) % 3 ? 0 : tu_rand_u64(&rng) % 7; /* a gap */
    /* short ones, empty ones, and (every eighth) past the CPU's 2048-element
     * blocks, some a multiple of them */
    size_t len = tu_rand_u64(&rng) % 6 ? 1 + tu_rand_u64(&rng) % 200 : tu_rand_u64(&rng) % 2;
    if (k % 8 == 3)
      len = 2048 * (1 + tu_rand_u64(&rng) % 2) + (k % 16 == 3 ? 0 : 1 + tu_rand_u64(&rng) % 2047);
    seg[k] = (kern_seg_t){n, len, (int)(tu_rand_u64(&rng) % 2)};
    n += len;
  }
  n += 3;
  float *p = frand(n, -1, 1), *g = frand(n, -1, 1), *m = frand(n, -0.1f, 0.1f), *v = frand(n, 0, 0.01f);
  float *rp = fnew(n), *rm = fnew(n), *rv = fnew(n), *p2 = fnew(n), *m2 = fnew(n), *v2 = fnew(n);
  memcpy(rp, p, n * 4), memcpy(rm, m, n * 4), memcpy(rv, v, n * 4);
  memcpy(p2, p, n * 4), memcpy(m2, m, n * 4), memcpy(v2, v, n * 4);
  uint16_t *p16 = tnew(n * 2), *r16 = tnew(n * 2);
  for (size_t i = 0; i < n; i++) p16[i] = r16[i] = (uint16_t)tu_rand_u64(&rng);
  for (int k = 0; k < NSEG; k++) {
    const size_t o = seg[k].offset;
    K->adamw(rp + o, g + o, rm + o, rv + o, seg[k].numel, 1e-2f, 0.9f, 0.95f, 1e-8f,
             seg[k].decay ? 0.1f : 0.0f, 3);
    K->f32_to_bf16(r16 + o, rp + o, seg[k].numel);
  }
  K->adamw_segs(p, p16, g, m, v, seg, NSEG, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  K->adamw_segs(p2, NULL, g, m2, v2, seg, NSEG, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
  cr_expect(!memcmp(p, rp, n * 4) && !memcmp(m, rm, n * 4) && !memcmp(v, rv, n * 4),
            "adamw_segs: p, m, v are adamw's a segment at a time (gaps untouched)");
  cr_expect(!memcmp(p16, r16, n * 2), "adamw_segs: the image is f32_to_bf16 of each new p, gaps kept");
  cr_expect(!memcmp(p2, rp, n * 4) && !memcmp(m2, rm, n * 4) && !memcmp(v2, rv, n * 4),
            "adamw_segs without an image: the same p, m, v");

  /* adamw_segs_scaled: the step vec_scale then adamw_segs take, g unchanged */
  const float gs = 0.3183f;
  float *g0 = fnew(n), *gsc = fnew(n);
  memcpy(g0, g, n * 4), memcpy(gsc, g, n * 4);
  memcpy(rp, p, n * 4), memcpy(rm, m, n * 4), memcpy(rv, v, n * 4);
  memcpy(p2, p, n * 4), memcpy(m2, m, n * 4), memcpy(v2, v, n * 4);
  memcpy(r16, p16, n * 2);
  K->vec_scale(gsc, gs, n);
  K->adamw_segs(rp, r16, gsc, rm, rv, seg, NSEG, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4);
  K->adamw_segs_scaled(p2, p16, g, gs, m2, v2, seg, NSEG, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4);
  cr_expect(!memcmp(p2, rp, n * 4) && !memcmp(m2, rm, n * 4) && !memcmp(v2, rv, n * 4) &&
                !memcmp(p16, r16, n * 2),
            "adamw_segs_scaled: adamw_segs on vec_scale's gradients, bit for bit");
  cr_expect(!memcmp(g, g0, n * 4), "adamw_segs_scaled: the gradients left as they were");
  cr_expect(memcmp(rp, p, n * 4), "adamw_segs_scaled: a step was taken");
}

/* ---- casts ------------------------------------------------------------------ */

static int bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

Test(kernels, bf16_cases) {
  static const struct {
    uint32_t in;
    uint16_t out;
    const char *what;
  } cases[] = {
      {0x3f800000, 0x3f80, "1.0 exact"},
      {0x3f808000, 0x3f80, "tie, even below: down"},
      {0x3f818000, 0x3f82, "tie, odd below: up"},
      {0x3f808001, 0x3f81, "just above a tie: up"},
      {0x3f807fff, 0x3f80, "just below a tie: down"},
      {0x3f81ffff, 0x3f82, "carry into the next"},
      {0x3fff8000, 0x4000, "tie with carry into the exponent"},
      {0xbf818000, 0xbf82, "negative tie, odd: away from zero"},
      {0xbf808000, 0xbf80, "negative tie, even: toward zero"},
      {0x7f7f7fff, 0x7f7f, "below max bf16 + half ulp: max finite"},
      {0x7f7f8000, 0x7f80, "max bf16 + half ulp (tie, odd): inf"},
      {0x7f7fffff, 0x7f80, "max finite fp32: inf"},
      {0xff7fffff, 0xff80, "-max finite fp32: -inf"},
      {0x7f800000, 0x7f80, "inf"},
      {0xff800000, 0xff80, "-inf"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0"},
      {0x00000001, 0x0000, "smallest denormal: to 0"},
      {0x00008000, 0x0000, "denormal tie, even: to 0"},
      {0x00018000, 0x0002, "denormal tie, odd: up"},
      {0x00010000, 0x0001, "denormal exact"},
      {0x80008001, 0x8001, "negative denormal above a tie"},
      {0x007fffff, 0x0080, "largest denormal: smallest normal"},
  };
  const size_t nc = sizeof cases / sizeof cases[0];
  float in[sizeof cases / sizeof cases[0]];
  uint16_t out[sizeof cases / sizeof cases[0]];
  for (size_t i = 0; i < nc; i++) in[i] = kern_asfloat(cases[i].in);
  K->f32_to_bf16(out, in, nc);
  for (size_t i = 0; i < nc; i++)
    cr_expect_eq(out[i], cases[i].out, "%s: 0x%08x -> 0x%04x, want 0x%04x", cases[i].what,
                 cases[i].in, out[i], cases[i].out);

  /* NaNs stay NaN, including those whose payload sits only in the low bits
   * (truncation would make them inf) or whose rounding would carry (0xffffffff). */
  static const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0x7f80ffff,
                                  0xffffffff, 0xff800001, 0x7fffffff};
  float nin[6];
  uint16_t nout[6];
  for (int i = 0; i < 6; i++) nin[i] = kern_asfloat(nans[i]);
  K->f32_to_bf16(nout, nin, 6);
  for (int i = 0; i < 6; i++) {
    cr_expect(bf16_is_nan(nout[i]), "NaN 0x%08x -> 0x%04x", nans[i], nout[i]);
    cr_expect_eq(nout[i] >> 15, nans[i] >> 31, "NaN 0x%08x keeps its sign", nans[i]);
  }

  uint16_t hin[4] = {0x3f80, 0x8000, 0x7f80, 0x0001};
  float hout[4];
  K->bf16_to_f32(hout, hin, 4);
  for (int i = 0; i < 4; i++) cr_expect_eq(kern_asuint(hout[i]), (uint32_t)hin[i] << 16);
}

/* bf16_to_f32_segs: bf16_to_f32 on each segment at its offset, every
 * other element of out as it was (a gap, an empty segment, one at the end) */
Test(kernels, bf16_to_f32_segs) {
  enum { N = 1000 };
  static const kern_seg_t seg[] = {{3, 17, 0}, {20, 5, 1}, {40, 0, 0}, {41, 300, 0}, {900, 100, 0}};
  const int ns = (int)(sizeof seg / sizeof seg[0]);
  uint16_t *in = tnew(N * 2);
  for (size_t i = 0; i < N; i++) in[i] = (uint16_t)tu_rand_u64(&rng);
  float *got = frand(N, -1, 1), *want = fnew(N);
  memcpy(want, got, N * 4);
  for (int k = 0; k < ns; k++)
    for (size_t i = seg[k].offset; i < seg[k].offset + seg[k].numel; i++)
      want[i] = kern_asfloat((uint32_t)in[i] << 16);
  K->bf16_to_f32_segs(got, in, seg, ns);
  cr_expect(!memcmp(got, want, N * 4), "bf16_to_f32_segs: each segment widened, the rest kept");
}

/* Every bf16 pattern goes to fp32 and back unchanged (NaNs stay NaN). */
Test(kernels, bf16_round_trip) {
  uint16_t *h = tnew(65536 * sizeof *h), *back = tnew(65536 * sizeof *back);
  float *f = fnew(65536);
  for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  K->bf16_to_f32(f, h, 65536);
  K->f32_to_bf16(back, f, 65536);
  for (uint32_t i = 0; i < 65536; i++) {
    cr_assert_eq(kern_asuint(f[i]), i << 16, "bf16 0x%04x widens exactly", i);
    if (bf16_is_nan(h[i]))
      cr_assert(bf16_is_nan(back[i]), "NaN 0x%04x -> 0x%04x", i, back[i]);
    else
      cr_assert_eq(back[i], h[i], "0x%04x -> 0x%04x", i, back[i]);
  }
}

/* bf16 value of a pattern as a double, with 0x7f80 standing for 2^128 (where an
 * unbounded exponent would put the next value): IEEE rounds to inf from there. */
static double bf16_val(uint16_t h) {
  if ((h & 0x7fff) == 0x7f80) return (h & 0x8000 ? -1 : 1) * ldexp(1, 128);
  uint32_t u = (uint32_t)h << 16;
  return kern_asfloat(u);
}

/* Random finite fp32: the result is one of the two bf16 values around x, the
 * nearer (so within half an ulp), the even one on a tie. */
Test(kernels, bf16_random) {
  enum { RN = 1 << 18 };
  float *x = fnew(RN);
  uint16_t *h = tnew(RN * sizeof *h);
  for (int i = 0; i < RN; i++) {
    uint32_t u;
    do u = (uint32_t)tu_rand_u64(&rng);
    while ((u & 0x7f800000) == 0x7f800000);
    /* half the cases on or next to a tie, where rounding is decided */
    if (i & 1) u = (u & 0xffff0000u) | (0x7fffu + (uint32_t)(tu_rand_u64(&rng) % 3));
    x[i] = kern_asfloat(u);
  }
  K->f32_to_bf16(h, x, RN);
  for (int i = 0; i < RN; i++) {
    uint32_t u = kern_asuint(x[i]);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* |lo| <= |x| < |hi| */
    double dl = fabs((double)x[i] - bf16_val(lo)), dh = fabs((double)x[i] - bf16_val(hi));
    uint16_t want = dl < dh ? lo : dh < dl ? hi : (lo & 1) ? hi : lo;
    cr_assert_eq(h[i], want, "0x%08x -> 0x%04x, want 0x%04x", u, h[i], want);
    double half_ulp = fabs(bf16_val(hi) - bf16_val(lo)) / 2;
    cr_assert(fmin(dl, dh) <= half_ulp, "0x%08x: more than half an ulp", u);
  }
}

/* ---- sumsq ------------------------------------------------------------------ */

Test(kernels, sumsq) {
  const size_t n = 100003;
  float *x = frand(n, -3, 3);
  double want = 0;
  for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
  double got = K->sumsq(x, n);
  cr_expect(fabs(got - want) <= 1e-12 * want, "sumsq %.17g, want %.17g [seed %llu]", got, want,
            SEED);
  /* values whose squares float would round away: 2^-12 next to 1 */
  float y[3] = {1.0f, 0x1p-12f, 0x1p-12f};
  cr_expect_eq(K->sumsq(y, 3), 1.0 + 0x1p-23, "sumsq must accumulate in double");
  cr_expect_eq(K->sumsq(x, 0), 0.0);
  /* the order is fixed: 1 and 2 threads give the same bits */
  K->set_threads(1);
  double one = K->sumsq(x, n);
  K->set_threads(2);
  cr_expect_eq(K->sumsq(x, n), one, "sumsq: 1 vs 2 threads [seed %llu]", SEED);
}

/* ---- ISA levels: each gives the generic level's bytes ----------------------
 * The CPU kernels are built for baseline x86-64, x86-64-v3 (AVX2) and
 * x86-64-v4 (AVX-512) and picked at run time (kern.h: kern_cpu_isa); the
 * levels must agree bit for bit, or a job's result would depend on the node
 * it ran on. Every op of every table this processor runs, forward and
 * backward, against the generic table on the same inputs: shapes whose
 * lengths leave vector tails at every width (4, 8, 16 lanes) and buffers
 * that start off any vector boundary. */

enum { ISA_MAX_OUT = 96 };

/* The outputs of one pass over every op, in call order, so that two passes
 * (two levels) line up entry by entry. */
typedef struct {
  int n;
  const char *what[ISA_MAX_OUT];
  const uint8_t *p[ISA_MAX_OUT];
  size_t bytes[ISA_MAX_OUT];
} isa_run_t;

/* bytes at 4 bytes past a 16-byte boundary (calloc's alignment): no vector
 * width divides the start. */
static void *isa_unaligned(size_t bytes) { return (uint8_t *)tnew(bytes + 4) + 4; }

/* An output buffer of run r: a copy of init (in-place and accumulating ops),
 * or 0xff bytes (NaN) where the op writes without reading. */
static void *isa_out(isa_run_t *r, const char *what, size_t bytes, const void *init) {
  cr_assert_lt(r->n, ISA_MAX_OUT, "raise ISA_MAX_OUT");
  void *p = isa_unaligned(bytes);
  if (init) memcpy(p, init, bytes);
  else memset(p, 0xff, bytes);
  r->what[r->n] = what, r->p[r->n] = p, r->bytes[r->n] = bytes, r->n++;
  return p;
}

static float *isa_in(size_t n, double lo, double hi) {
  float *p = isa_unaligned(n * sizeof *p);
  tu_fill_f32(p, n, &rng, lo, hi);
  return p;
}

/* Shapes: element-wise ops over IE elements (IE % 16 = 11, % 8 = 3); rows
 * of ISA_C[k] channels (below, at and past one block of 16 lanes). */
enum { IE = 1003, IN = 5, IB = 2, IT = 37, IAC = 24, INH = 3, IV = 1003 };
static const int ISA_C[] = {3, 16, 101};

typedef struct {
  float *a, *b, *c, *wide, *x16, *w16, *b16, *wte, *wpe, *qkv, *logits, *big;
  int32_t *tok, *tgt;
  uint16_t *h1; /* random bf16 patterns */
  size_t nwide, nbig;
} isa_inputs_t;

static void isa_inputs(isa_inputs_t *in) {
  in->a = isa_in(IE, -4, 4), in->b = isa_in(IE, -4, 4), in->c = isa_in(IE, -1, 1);
  /* every 4099th bit pattern: all exponents, denormals, +-inf and NaNs, for
   * the element-wise math (GELU's exponential, the casts) */
  in->nwide = (size_t)(((uint64_t)1 << 32) / 4099);
  in->wide = isa_unaligned(in->nwide * sizeof(float));
  for (size_t i = 0; i < in->nwide; i++) in->wide[i] = kern_asfloat((uint32_t)(i * 4099u));
  in->x16 = isa_in((size_t)IN * 101, 2, 4), in->w16 = isa_in(101, 0.5, 1.5);
  in->wte = isa_in(5 * 37, -1, 1), in->wpe = isa_in(IT * 37, -1, 1);
  in->b16 = isa_in(101, -1, 1);
  in->qkv = isa_in((size_t)IB * IT * 3 * IAC, -3, 3);
  /* cross-entropy rows: ordinary logits, then one spread so wide that most of
   * its exponentials underflow (denormals, zeros) */
  in->logits = isa_in((size_t)IN * IV, -8, 8);
  for (int j = 0; j < IV; j++) in->logits[(IN - 1) * IV + j] *= 15.0f;
  in->tok = isa_unaligned(IB * IT * sizeof(int32_t));
  in->tgt = isa_unaligned(IN * sizeof(int32_t));
  for (int i = 0; i < IB * IT; i++) in->tok[i] = (int32_t)(tu_rand_u64(&rng) % 5);
  for (int i = 0; i < IN; i++) in->tgt[i] = (int32_t)(tu_rand_u64(&rng) % IV);
  in->h1 = isa_unaligned(IE * sizeof(uint16_t));
  for (int i = 0; i < IE; i++) in->h1[i] = (uint16_t)tu_rand_u64(&rng);
  in->nbig = 100003;
  in->big = isa_in(in->nbig, -3, 3);
}

static void isa_run_ops(const kern_backend_t *k, isa_run_t *r, const isa_inputs_t *in) {
  const size_t fe = IE * sizeof(float);
  float *o;
  /* encoder: C = 37, ids repeat */
  {
    const int C = 37;
    o = isa_out(r, "encoder out", (size_t)IB * IT * C * sizeof(float), NULL);
    k->encoder_fwd(o, in->tok, in->wte, in->wpe, IB, IT, C);
    float *dwte = isa_out(r, "encoder dwte", 5 * C * sizeof(float), in->wte);
    float *dwpe = isa_out(r, "encoder dwpe", (size_t)IT * C * sizeof(float), in->wpe);
    k->encoder_bwd(dwte, dwpe, in->qkv, in->tok, IB, IT, C);
  }
  for (size_t i = 0; i < sizeof ISA_C / sizeof ISA_C[0]; i++) {
    const int C = ISA_C[i];
    const size_t nx = (size_t)IN * C;
    float *out = isa_out(r, "layernorm out", nx * sizeof(float), NULL);
    float *mean = isa_out(r, "layernorm mean", IN * sizeof(float), NULL);
    float *rstd = isa_out(r, "layernorm rstd", IN * sizeof(float), NULL);
    k->layernorm_fwd(out, mean, rstd, in->x16, in->w16, in->b16, IN, C);
    float *dx = isa_out(r, "layernorm dinp", nx * sizeof(float), in->a);
    float *dw = isa_out(r, "layernorm dw", C * sizeof(float), in->b);
    float *db = isa_out(r, "layernorm db", C * sizeof(float), in->c);
    k->layernorm_bwd(dx, dw, db, in->c, in->x16, in->w16, mean, rstd, IN, C);
  }
  {
    const int N = 14, IC = 13, OC = 37;
    o = isa_out(r, "matmul out", (size_t)N * OC * sizeof(float), NULL);
    k->matmul_fwd(o, in->a, in->b, in->c, N, IC, OC, OC);
    float *dx = isa_out(r, "matmul dinp", (size_t)N * IC * sizeof(float), in->c);
    float *dw = isa_out(r, "matmul dw", (size_t)OC * IC * sizeof(float), in->a);
    float *db = isa_out(r, "matmul dbias", OC * sizeof(float), in->b);
    k->matmul_bwd(dx, dw, db, in->b, in->a, in->b, N, IC, OC, OC, 1);
  }
  {
    /* T = 37: softmax rows of every length from 1 to 37 */
    const size_t no = (size_t)IB * IT * IAC, na = k->attention_saved(IB, IT, IAC, INH);
    const size_t nq = (size_t)IB * IT * 3 * IAC;
    o = isa_out(r, "attention out", no * sizeof(float), NULL);
    float *att = isa_out(r, "attention log-sum-exp", na * sizeof(float), NULL);
    float *scratch = isa_unaligned(k->attention_scratch(IB, IT, IAC, INH) * sizeof(float));
    k->attention_fwd(o, att, scratch, in->qkv, IB, IT, IAC, INH);
    float *dq = isa_out(r, "attention dqkv", nq * sizeof(float), in->qkv);
    k->attention_bwd(dq, scratch, in->qkv, in->qkv, o, att, IB, IT, IAC, INH, 1);
  }
  o = isa_out(r, "gelu out", in->nwide * sizeof(float), NULL);
  k->gelu_fwd(o, in->wide, in->nwide);
  o = isa_out(r, "gelu dinp", in->nwide * sizeof(float), in->wide);
  k->gelu_bwd(o, in->wide, in->wide, in->nwide, 1);
  o = isa_out(r, "gelu out (ordinary range)", fe, NULL);
  k->gelu_fwd(o, in->a, IE);
  o = isa_out(r, "gelu dinp (ordinary range)", fe, in->c);
  k->gelu_bwd(o, in->a, in->b, IE, 1);
  o = isa_out(r, "residual out", fe, NULL);
  k->residual_fwd(o, in->a, in->b, IE);
  float *da = isa_out(r, "residual da", fe, in->a), *db = isa_out(r, "residual db", fe, in->b);
  k->residual_bwd(da, db, in->c, IE);
  {
    float *losses = isa_out(r, "crossentropy losses", IN * sizeof(float), NULL);
    float *p = isa_out(r, "crossentropy probs", (size_t)IN * IV * sizeof(float), in->logits);
    k->crossentropy_fwd(losses, p, in->tgt, IN, IV, IV);
    float *d = isa_out(r, "crossentropy dlogits", (size_t)IN * IV * sizeof(float), p);
    k->crossentropy_bwd(d, in->tgt, 0.37f, IN, IV, IV);
  }
  {
    float *p = isa_out(r, "adamw p", fe, in->a), *m = isa_out(r, "adamw m", fe, in->c);
    float *v = isa_out(r, "adamw v", fe, in->c);
    for (size_t i = 0; i < IE; i++) v[i] = v[i] * v[i];
    for (int t = 1; t <= 3; t++) k->adamw(p, in->b, m, v, IE, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
  }
  uint16_t *h = isa_out(r, "f32_to_bf16", in->nwide * sizeof(uint16_t), NULL);
  k->f32_to_bf16(h, in->wide, in->nwide);
  o = isa_out(r, "bf16_to_f32", IE * sizeof(float), NULL);
  k->bf16_to_f32(o, in->h1, IE);
  {
    const size_t ns[] = {0, 1, 15, 17, IE, in->nbig}; /* the last one split among threads */
    /* doubles are copied in: the buffers are not 8-byte aligned */
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
      const double s = k->sumsq(in->big, ns[i]);
      isa_out(r, "sumsq", sizeof s, &s);
    }
    const double s = k->vec_sum(in->a, IE);
    isa_out(r, "vec_sum", sizeof s, &s);
  }
  o = isa_out(r, "dev_set", fe + 3, NULL);
  k->dev_set(o, 0x5a, fe + 3);
  o = isa_out(r, "copy_h2d", fe - 1, NULL);
  k->copy_h2d(o, in->a, fe - 1);
  o = isa_out(r, "copy_d2h", fe, NULL);
  k->copy_d2h(o, in->b, fe);
  o = isa_out(r, "copy_d2d", fe, NULL);
  k->copy_d2d(o, in->c, fe);
  o = isa_out(r, "vec_add", fe, in->a);
  k->vec_add(o, in->b, IE);
  o = isa_out(r, "vec_scale", fe, in->a);
  k->vec_scale(o, 0.3f, IE);
  /* the collectives' work: plain and streamed (the stream path reaches its
   * aligned middle only past a few thousand elements), plain sum and average;
   * the first operand at an odd byte offset, as in a shared-memory link */
  for (int stream = 0; stream <= 1; stream++)
    for (int avg = 0; avg <= 1; avg++) {
      const size_t n = stream ? 50001 : IE; /* b: in->big from element 7 */
      const float div = avg ? 3.0f : 1.0f;
      uint8_t *odd = isa_unaligned(n * sizeof(float) + 1);
      memcpy(odd + 1, in->big, n * sizeof(float));
      o = isa_out(r, "reduce_f32", n * sizeof(float), NULL);
      k->reduce_f32(o, odd + 1, in->big + 7, n, div, stream);
      const size_t nh = stream ? 5000 : IE; /* bf16 streams through blocks of 4096 */
      uint16_t *hs = isa_unaligned(nh * sizeof(uint16_t)), *hb = isa_unaligned(nh * sizeof(uint16_t));
      k->f32_to_bf16(hs, in->big, nh);
      k->f32_to_bf16(hb, in->big + 1000, nh);
      memcpy(odd + 1, hs, nh * sizeof(uint16_t));
      h = isa_out(r, "reduce_bf16", nh * sizeof(uint16_t), NULL);
      k->reduce_bf16(h, odd + 1, hb, nh, div, stream);
    }
  o = isa_out(r, "copy_stream (short)", 101 * sizeof(float), NULL);
  k->copy_stream(o, in->a, 101 * sizeof(float));
  o = isa_out(r, "copy_stream (long)", in->nbig * sizeof(float) - 1, NULL);
  k->copy_stream(o, in->big, in->nbig * sizeof(float) - 1);
}

Test(kernels, isa_levels_give_the_same_bytes, .timeout = 120) {
  const kern_cpu_isa_t levels[] = {KERN_CPU_ISA_AVX2, KERN_CPU_ISA_AVX512};
  const kern_backend_t *gen = kern_cpu_isa_table(KERN_CPU_ISA_GENERIC);
  cr_assert_not_null(gen, "the generic level runs anywhere");
  isa_inputs_t in;
  isa_inputs(&in);
  isa_run_t *ref = tnew(sizeof *ref);
  isa_run_ops(gen, ref, &in);
  int compared = 0;
  for (size_t l = 0; l < sizeof levels / sizeof levels[0]; l++) {
    const kern_backend_t *k = kern_cpu_isa_table(levels[l]);
    const char *name = kern_cpu_isa_name(levels[l]);
    if (!k) {
      cr_log_warn("this processor lacks %s: not compared", name);
      continue;
    }
    cr_assert_neq(k, gen);
    isa_run_t *r = tnew(sizeof *r);
    isa_run_ops(k, r, &in);
    cr_assert_eq(r->n, ref->n);
    for (int i = 0; i < r->n; i++) {
      cr_assert_eq(r->bytes[i], ref->bytes[i]);
      size_t j = 0;
      while (j < r->bytes[i] && r->p[i][j] == ref->p[i][j]) j++;
      cr_expect_eq(j, r->bytes[i], "%s: %s (output %d) differs from generic at byte %zu of %zu [seed %llu]",
                   name, r->what[i], i, j, r->bytes[i], SEED);
    }
    compared++;
  }
  cr_log_info("%d levels compared with generic (best here: %s)", compared,
              kern_cpu_isa_name(kern_cpu_isa_best()));
}

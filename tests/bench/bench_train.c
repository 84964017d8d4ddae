/* bench_train: times our one-device training step for one preset and (B, T,
 * threads), and measures the memory it took. The step is what fsdp-train runs
 * (train.c): the sharded runtime on one rank (fsdp_zero_grad, forward with
 * targets, backward, fsdp_step: global norm and AdamW).
 *
 *   bench_train PRESET B T THREADS STEPS [-p | --vs-flat]
 *
 * --vs-flat builds the flat model (gpt_create, adamw: the reference the tests
 * compare the runtime against) beside the runtime and times their steps
 * interleaved, one of each in turn, so both see the same machine: one
 * training path costs nothing when the ratio is 1 (the line is
 * bench: train_path ... runtime_vs_flat=). It prints no memory line (both
 * models are held at once).
 *
 * One untimed warm-up step (it allocates the activations and warms the caches
 * and oneDNN's kernel cache), then STEPS timed steps; the median is reported
 * (the machines are shared and noisy). Tokens are a fixed pseudo-random
 * sequence (ids < vocab), the same every run.
 *
 * -p wraps the backend table in a timing layer (the model calls every op
 * through the table it was created with) and prints where the step's time goes,
 * per op and per matmul shape; the layer costs two clock reads per op call.
 *
 * Lines (stdout):
 *   bench: train model=... B= T= threads= step_ms= tokens_per_s= model_gflops= params= ...
 *   bench: train_path model=... runtime_step_ms= flat_step_ms= runtime_vs_flat=  (--vs-flat)
 *   bench: memory model=... tensors_mib= alloc_peak_mib= anon_peak_mib= ratio= rss_peak_mib= ...
 *   bench: op model=... op=... ms_per_step= share= ...          (with -p)
 * Exit status 0, 1 when a step fails or the loss is not finite, 2 on bad usage. */
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/common/err.h"
#include "daemon/common/mem.h"
#include "daemon/train/adamw.h"
#include "daemon/train/fsdp.h"
#include "daemon/train/gpt.h"

#include "tests/bench/benchutil.h"

#define MIB (1024.0 * 1024.0)

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* ---- the timing layer (-p) ------------------------------------------------ */

enum {
  P_ENCODER_FWD, P_ENCODER_BWD, P_LAYERNORM_FWD, P_LAYERNORM_BWD, P_MATMUL_FWD, P_MATMUL_BWD,
  P_ATTENTION_FWD, P_ATTENTION_BWD, P_GELU_FWD, P_GELU_BWD, P_RESIDUAL_FWD, P_RESIDUAL_BWD,
  P_CROSSENTROPY_FWD, P_CROSSENTROPY_BWD, P_CROSSENTROPY_FWD_BWD, P_ADAMW, P_CAST, P_SUMSQ,
  P__COUNT
};
static const char *const prof_names[P__COUNT] = {
    "encoder_fwd", "encoder_bwd", "layernorm_fwd", "layernorm_bwd", "matmul_fwd",
    "matmul_bwd", "attention_fwd", "attention_bwd", "gelu_fwd", "gelu_bwd",
    "residual_fwd", "residual_bwd", "crossentropy_fwd", "crossentropy_bwd",
    "crossentropy_fwd_bwd", "adamw",
    "cast", "sumsq"};

typedef struct prof_slot {
  double s, flops;
  long calls;
} prof_slot_t;

typedef struct prof_shape {
  int bwd, N, IC, OC;
  prof_slot_t t;
} prof_shape_t;

static const kern_backend_t *prof_base;
static prof_slot_t prof_op[P__COUNT];
static prof_shape_t prof_shapes[64];
static int prof_nshapes;

static void prof_add(int op, double t0, double flops) {
  prof_op[op].s += bench_now_s() - t0;
  prof_op[op].flops += flops;
  prof_op[op].calls++;
}

static void prof_add_shape(int bwd, int N, int IC, int OC, double t0, double t1, double flops) {
  prof_shape_t *p = NULL;
  for (int i = 0; i < prof_nshapes && !p; i++)
    if (prof_shapes[i].bwd == bwd && prof_shapes[i].N == N && prof_shapes[i].IC == IC &&
        prof_shapes[i].OC == OC)
      p = &prof_shapes[i];
  if (!p && prof_nshapes < 64) {
    p = &prof_shapes[prof_nshapes++];
    *p = (prof_shape_t){.bwd = bwd, .N = N, .IC = IC, .OC = OC};
  }
  if (!p) return;
  p->t.s += t1 - t0;
  p->t.flops += flops;
  p->t.calls++;
}

static void prof_reset(void) {
  memset(prof_op, 0, sizeof prof_op);
  prof_nshapes = 0;
}

static void w_encoder_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe,
                          int B, int T, int C) {
  double t0 = bench_now_s();
  prof_base->encoder_fwd(out, tok, wte, wpe, B, T, C);
  prof_add(P_ENCODER_FWD, t0, 0);
}
static void w_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B,
                          int T, int C) {
  double t0 = bench_now_s();
  prof_base->encoder_bwd(dwte, dwpe, dout, tok, B, T, C);
  prof_add(P_ENCODER_BWD, t0, 0);
}
static void w_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C) {
  double t0 = bench_now_s();
  prof_base->layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
  prof_add(P_LAYERNORM_FWD, t0, 0);
}
static void w_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C) {
  double t0 = bench_now_s();
  prof_base->layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  prof_add(P_LAYERNORM_BWD, t0, 0);
}
static void w_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N,
                         int IC, int OC, int ldo) {
  double t0 = bench_now_s();
  prof_base->matmul_fwd(out, inp, w, bias, N, IC, OC, ldo);
  double f = 2.0 * N * IC * OC;
  prof_add_shape(0, N, IC, OC, t0, bench_now_s(), f);
  prof_add(P_MATMUL_FWD, t0, f);
}
static void w_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int IC, int OC, int ldo, int acc) {
  double t0 = bench_now_s();
  prof_base->matmul_bwd(dinp, dw, dbias, dout, inp, w, N, IC, OC, ldo, acc);
  double f = (dinp ? 2.0 : 0.0) * N * IC * OC + 2.0 * N * IC * OC;
  prof_add_shape(1, N, IC, OC, t0, bench_now_s(), f);
  prof_add(P_MATMUL_BWD, t0, f);
}
static void w_attention_fwd(float *out, float *att, float *scratch, const float *qkv, int B,
                            int T, int C, int NH) {
  double t0 = bench_now_s();
  prof_base->attention_fwd(out, att, scratch, qkv, B, T, C, NH);
  /* q k^T and att v over the causal half: 2 * (2 B T^2/2 C). */
  prof_add(P_ATTENTION_FWD, t0, 2.0 * B * (double)T * T * C);
}
static void w_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                            const float *out, const float *att, int B, int T, int C, int NH, int acc) {
  double t0 = bench_now_s();
  prof_base->attention_bwd(dqkv, scratch, dout, qkv, out, att, B, T, C, NH, acc);
  prof_add(P_ATTENTION_BWD, t0, 4.0 * B * (double)T * T * C);
}
static void w_gelu_fwd(float *out, const float *inp, size_t n) {
  double t0 = bench_now_s();
  prof_base->gelu_fwd(out, inp, n);
  prof_add(P_GELU_FWD, t0, 0);
}
static void w_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n, int acc) {
  double t0 = bench_now_s();
  prof_base->gelu_bwd(dinp, inp, dout, n, acc);
  prof_add(P_GELU_BWD, t0, 0);
}
static void w_residual_fwd(float *out, const float *a, const float *b, size_t n) {
  double t0 = bench_now_s();
  prof_base->residual_fwd(out, a, b, n);
  prof_add(P_RESIDUAL_FWD, t0, 0);
}
static void w_residual_bwd(float *da, float *db, const float *dout, size_t n) {
  double t0 = bench_now_s();
  prof_base->residual_bwd(da, db, dout, n);
  prof_add(P_RESIDUAL_BWD, t0, 0);
}
static void w_crossentropy_fwd(float *losses, float *logits, const int32_t *targets, int N,
                               int V, int ld) {
  double t0 = bench_now_s();
  prof_base->crossentropy_fwd(losses, logits, targets, N, V, ld);
  prof_add(P_CROSSENTROPY_FWD, t0, 0);
}
static void w_crossentropy_bwd(float *probs, const int32_t *targets, float dloss, int N, int V,
                               int ld) {
  double t0 = bench_now_s();
  prof_base->crossentropy_bwd(probs, targets, dloss, N, V, ld);
  prof_add(P_CROSSENTROPY_BWD, t0, 0);
}
static void w_crossentropy_fwd_bwd(float *losses, float *logits, const int32_t *targets,
                                   float dloss, int N, int V, int ld) {
  double t0 = bench_now_s();
  prof_base->crossentropy_fwd_bwd(losses, logits, targets, dloss, N, V, ld);
  prof_add(P_CROSSENTROPY_FWD_BWD, t0, 0);
}
static void w_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                    float beta2, float eps, float wd, int t) {
  double t0 = bench_now_s();
  prof_base->adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, t);
  prof_add(P_ADAMW, t0, 0);
}
static void w_adamw_segs(float *p, uint16_t *p16, const float *g, float *m, float *v,
                         const kern_seg_t *seg, int nseg, float lr, float beta1, float beta2,
                         float eps, float wd, int t) {
  double t0 = bench_now_s();
  prof_base->adamw_segs(p, p16, g, m, v, seg, nseg, lr, beta1, beta2, eps, wd, t);
  prof_add(P_ADAMW, t0, 0);
}
static void w_f32_to_bf16(uint16_t *out, const float *inp, size_t n) {
  double t0 = bench_now_s();
  prof_base->f32_to_bf16(out, inp, n);
  prof_add(P_CAST, t0, 0);
}
static void w_bf16_to_f32(float *out, const uint16_t *inp, size_t n) {
  double t0 = bench_now_s();
  prof_base->bf16_to_f32(out, inp, n);
  prof_add(P_CAST, t0, 0);
}
static double w_sumsq(const float *x, size_t n) {
  double t0 = bench_now_s();
  double r = prof_base->sumsq(x, n);
  prof_add(P_SUMSQ, t0, 0);
  return r;
}

static kern_backend_t prof_backend;

static const kern_backend_t *prof_wrap(const kern_backend_t *base) {
  prof_base = base;
  prof_backend = *base; /* name, supports_op, threads, attention_scratch pass through */
  prof_backend.encoder_fwd = w_encoder_fwd;
  prof_backend.encoder_bwd = w_encoder_bwd;
  prof_backend.layernorm_fwd = w_layernorm_fwd;
  prof_backend.layernorm_bwd = w_layernorm_bwd;
  prof_backend.matmul_fwd = w_matmul_fwd;
  prof_backend.matmul_bwd = w_matmul_bwd;
  prof_backend.attention_fwd = w_attention_fwd;
  prof_backend.attention_bwd = w_attention_bwd;
  prof_backend.gelu_fwd = w_gelu_fwd;
  prof_backend.gelu_bwd = w_gelu_bwd;
  prof_backend.residual_fwd = w_residual_fwd;
  prof_backend.residual_bwd = w_residual_bwd;
  prof_backend.crossentropy_fwd = w_crossentropy_fwd;
  prof_backend.crossentropy_bwd = w_crossentropy_bwd;
  prof_backend.crossentropy_fwd_bwd = w_crossentropy_fwd_bwd;
  prof_backend.adamw = w_adamw;
  prof_backend.adamw_segs = w_adamw_segs;
  prof_backend.f32_to_bf16 = w_f32_to_bf16;
  prof_backend.bf16_to_f32 = w_bf16_to_f32;
  prof_backend.sumsq = w_sumsq;
  /* kern.h's bf16 activations are not wrapped: without them the model takes
   * the fp32 ops above, so no op's time goes uncounted (the CPU offers none) */
  prof_backend.layernorm_fwd_bf16 = NULL;
  prof_backend.gelu_fwd_bf16 = NULL;
  prof_backend.matmul_fwd_bf16 = NULL;
  prof_backend.matmul_bwd_bf16 = NULL;
  prof_backend.crossentropy_fwd_bwd_bf16 = NULL;
  prof_backend.attention_bf16_fits = NULL;
  prof_backend.attention_fwd_bf16 = NULL;
  prof_backend.attention_bwd_bf16 = NULL;
  prof_backend.attention_scratch_bf16 = NULL;
  prof_backend.gelu_bwd_bf16 = NULL;
  prof_backend.matmul_fwd_bf16_out16 = NULL;
  prof_backend.crossentropy_fwd_bwd_bf16in = NULL;
  return &prof_backend;
}

static void prof_print(const char *tag, int steps, double step_s_total) {
  double in_ops = 0;
  for (int i = 0; i < P__COUNT; i++) in_ops += prof_op[i].s;
  for (int i = 0; i < P__COUNT; i++) {
    const prof_slot_t *p = &prof_op[i];
    if (!p->calls) continue;
    printf("bench: op %s op=%s ms_per_step=%.2f share=%.3f calls_per_step=%ld", tag,
           prof_names[i], p->s * 1e3 / steps, p->s / step_s_total, p->calls / steps);
    if (p->flops > 0) printf(" gflops=%.1f", p->flops / p->s * 1e-9);
    printf("\n");
  }
  /* Time in the step but in no op: gpt.c/adamw.c themselves (zeroing, copies). */
  printf("bench: op %s op=outside_ops ms_per_step=%.2f share=%.3f\n", tag,
         (step_s_total - in_ops) * 1e3 / steps, (step_s_total - in_ops) / step_s_total);
  for (int i = 0; i < prof_nshapes; i++) {
    const prof_shape_t *p = &prof_shapes[i];
    printf("bench: op %s op=%s shape=N%d_IC%d_OC%d ms_per_step=%.2f share=%.3f "
           "calls_per_step=%ld gflops=%.1f\n",
           tag, p->bwd ? "matmul_bwd" : "matmul_fwd", p->N, p->IC, p->OC, p->t.s * 1e3 / steps,
           p->t.s / step_s_total, p->t.calls / steps, p->t.flops / p->t.s * 1e-9);
  }
}

/* ---- the benchmark ---------------------------------------------------------- */

static const char *isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
  case dnnl_cpu_isa_avx2: return "avx2";
  case dnnl_cpu_isa_avx512_core: return "avx512_core";
  case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
  case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
  case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
  default: return "other";
  }
}

static int usage(void) {
  fprintf(stderr, "usage: bench_train PRESET B T THREADS STEPS [-p | --vs-flat]\n");
  return 2;
}

/* A model being trained: the runtime on one rank (f), or the flat model and
 * its optimizer (g, opt). */
typedef struct {
  fsdp_t *f;
  gpt_t *g;
  adamw_t *opt;
} model_t;

/* what no block keeps (gpt_set_recompute), as fsdp-train's default
 * on cpu devices (config_recompute: 2) */
#ifndef BENCH_RECOMPUTE
#define BENCH_RECOMPUTE 2
#endif

static const adamw_hparams_t HP = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.1f};

static int model_open(model_t *m, const gpt_config_t *cfg, const kern_backend_t *be, int flat) {
  memset(m, 0, sizeof *m);
  if (!flat) {
    fsdp_opts_t o = {.be = be, .mesh = {1, 1, SHARD_FULL_SHARD}, .seed = 1337, .hp = HP};
    int rc = fsdp_create(&m->f, cfg, &o);
    if (!rc) m->g = fsdp_model(m->f);
    if (!rc) gpt_set_recompute(m->g, BENCH_RECOMPUTE); /* as fsdp-train by default */
    return rc;
  }
  int rc = gpt_create(&m->g, cfg, be);
  if (!rc) rc = gpt_init_weights(m->g, 1337);
  if (!rc) gpt_set_recompute(m->g, BENCH_RECOMPUTE);
  return rc ? rc : adamw_create(&m->opt, m->g, HP);
}

static int model_step(model_t *m, const int32_t *in, const int32_t *tg, int B, int T,
                      float *loss) {
  if (m->f) fsdp_zero_grad(m->f);
  else gpt_zero_grad(m->g);
  int rc = gpt_forward_train(m->g, in, tg, B, T, 1.0f, loss);
  if (rc == 0) rc = gpt_backward(m->g, 1.0f);
  if (rc == 0 && m->f) rc = fsdp_step(m->f, 1e-4f, 0, NULL);
  else if (rc == 0) adamw_step(m->opt, m->g, 1e-4f);
  return rc;
}

static void model_close(model_t *m) {
  if (m->f) {
    fsdp_destroy(m->f); /* with its model */
  } else {
    adamw_destroy(m->opt);
    gpt_destroy(m->g);
  }
  memset(m, 0, sizeof *m);
}

static double median(double *t, int n) {
  qsort(t, n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* --vs-flat: the runtime's and the flat model's steps, interleaved. */
static int vs_flat(const char *preset, const gpt_config_t *cfg, const kern_backend_t *be,
                   const int32_t *in, const int32_t *tg, int B, int T, int threads, int steps) {
  model_t m[2];
  double *t[2] = {calloc((size_t)steps, sizeof(double)), calloc((size_t)steps, sizeof(double))};
  float loss[2];
  int rc = t[0] && t[1] ? FSDP_OK : err_set(FSDP_ENOMEM, "bench_train: timings");
  for (int k = 0; k < 2 && !rc; k++) rc = model_open(&m[k], cfg, be, k);
  for (int k = 0; k < 2 && !rc; k++) rc = model_step(&m[k], in, tg, B, T, &loss[k]); /* warm-up */
  for (int i = 0; i < steps && !rc; i++)
    for (int k = 0; k < 2 && !rc; k++) {
      double t0 = bench_now_s();
      rc = model_step(&m[k], in, tg, B, T, &loss[k]);
      t[k][i] = bench_now_s() - t0;
    }
  if (!rc) {
    double rt = median(t[0], steps), fl = median(t[1], steps);
    printf("bench: train_path model=%s B=%d T=%d threads=%d runtime_step_ms=%.1f "
           "flat_step_ms=%.1f runtime_vs_flat=%.3f steps=%d runtime_loss=%.4f flat_loss=%.4f\n",
           preset, B, T, threads, rt * 1e3, fl * 1e3, rt / fl, steps, loss[0], loss[1]);
  }
  for (int k = 0; k < 2; k++) model_close(&m[k]), free(t[k]);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 6 || argc > 7) return usage();
  const char *preset = argv[1];
  int B = atoi(argv[2]), T = atoi(argv[3]), threads = atoi(argv[4]), steps = atoi(argv[5]);
  int profile = argc == 7 && !strcmp(argv[6], "-p");
  int flat = argc == 7 && !strcmp(argv[6], "--vs-flat");
  if (B <= 0 || T <= 0 || threads <= 0 || steps <= 0 || (argc == 7 && !profile && !flat))
    return usage();

  /* the process before the model exists (code, libraries, thread stacks) */
  size_t rss_base = mem_process_anon_rss();
  gpt_config_t cfg;
  model_t m = {0};
  int32_t *tok = NULL, *in = NULL, *tg = NULL;
  double *times = NULL;
  int rc = gpt_config_preset(&cfg, preset);
  if (rc) goto out;
  const kern_backend_t *be = kern_cpu();
  be->set_threads(threads);

  /* B rows of T+1 tokens; targets are the inputs shifted by one. */
  tok = malloc(sizeof(int32_t) * B * (T + 1));
  in = malloc(sizeof(int32_t) * B * T);
  tg = malloc(sizeof(int32_t) * B * T);
  times = malloc(sizeof(double) * steps);
  if (!tok || !in || !tg || !times) {
    rc = err_set(FSDP_ENOMEM, "bench_train: token buffers");
    goto out;
  }
  uint64_t s = 42;
  for (int i = 0; i < B * (T + 1); i++) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    tok[i] = (int32_t)((s >> 33) % (uint64_t)cfg.vocab);
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      in[b * T + t] = tok[b * (T + 1) + t];
      tg[b * T + t] = tok[b * (T + 1) + t + 1];
    }

  if (flat) {
    rc = vs_flat(preset, &cfg, be, in, tg, B, T, threads, steps);
    goto out;
  }
  if ((rc = model_open(&m, &cfg, profile ? prof_wrap(be) : be, 0))) goto out;
  float loss = NAN, first_loss = NAN;
  if ((rc = model_step(&m, in, tg, B, T, &first_loss))) goto out; /* warm-up */
  prof_reset();
  double total = 0;
  size_t anon_peak = mem_process_anon_rss(); /* sampled after every step: allocations are made
                                                by the warm-up and never shrink, but say it */
  for (int i = 0; i < steps; i++) {
    double t0 = bench_now_s();
    if ((rc = model_step(&m, in, tg, B, T, &loss))) goto out;
    times[i] = bench_now_s() - t0;
    total += times[i];
    size_t anon = mem_process_anon_rss();
    if (anon > anon_peak) anon_peak = anon;
  }
  if (!isfinite(loss) || !isfinite(first_loss)) {
    fprintf(stderr, "bench_train: loss is not finite (first %g, last %g)\n", first_loss, loss);
    rc = 1;
    goto out;
  }
  double med = median(times, steps);

  /* Model FLOPs per token, PaLM (Chowdhery et al. 2022) appendix B: 6N for the
   * weight matmuls forward and backward, plus 12*L*C*T for attention's q k^T
   * and att v (forward and backward, counted without the causal half). N is
   * every parameter: with tied embeddings wte also serves as the output
   * projection, so its V*C weights do matmul work; wpe (context*C) does not,
   * which overstates by under 1% on gpt2-124m. */
  size_t P = gpt_num_params(m.g);
  double flops_tok = 6.0 * (double)P + 12.0 * cfg.layers * (double)cfg.channels * T;
  double tokens = (double)B * T;
  char tag[160];
  snprintf(tag, sizeof tag, "model=%s B=%d T=%d threads=%d", preset, B, T, threads);
  printf("bench: train %s step_ms=%.1f tokens_per_s=%.1f model_gflops=%.1f params=%zu "
         "step_ms_min=%.1f steps=%d loss=%.4f backend=%s lib=onednn kernel=%s\n",
         tag, med * 1e3, tokens / med, flops_tok * tokens / med * 1e-9, P, times[0] * 1e3,
         steps, loss, be->name, isa_name(dnnl_get_effective_cpu_isa()));

  /* The sum of the tensors the step needs: params and grads (4 bytes each), Adam
   * m and v (8), and the activations with their gradients and the attention
   * scratch. */
  const size_t acts = gpt_config_act_bytes(&cfg, B, T, gpt_act_recompute_flags(BENCH_RECOMPUTE),
                                           be->attention_saved(B, T, cfg.channels, cfg.heads),
                                           gpt_config_logits_rows(&cfg, 0));
  double tensors = 16.0 * (double)P + (double)acts +
                   (double)be->attention_scratch(B, T, cfg.channels, cfg.heads) * sizeof(float);
  /* Peak memory: the process's anonymous resident memory (its own data: every
   * buffer, oneDNN's packing buffers and JIT code, thread stacks, the heap),
   * sampled after each step. rss_peak (VmHWM) adds the file-backed pages of the
   * program's and libraries' code (about 9 MiB, shared and the same for any
   * model); it is printed too. */
  double rss = (double)mem_process_peak_rss(), anon = (double)anon_peak;
  printf("bench: memory model=%s B=%d T=%d threads=%d tensors_mib=%.1f alloc_peak_mib=%.1f "
         "anon_peak_mib=%.1f ratio=%.3f rss_peak_mib=%.1f rss_ratio=%.3f anon_base_mib=%.1f\n",
         preset, B, T, threads, tensors / MIB, mem_total_peak() / MIB, anon / MIB,
         anon / tensors, rss / MIB, rss / tensors, rss_base / MIB);
  if (profile) prof_print(tag, steps, total);
  fflush(stdout);

out:
  if (rc < 0) fprintf(stderr, "bench_train: %s (%s)\n", err_msg(), err_name(rc));
  free(tok);
  free(in);
  free(tg);
  free(times);
  model_close(&m);
  return rc ? 1 : 0;
}

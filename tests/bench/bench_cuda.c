/* bench_cuda: GPU training throughput, MFU and memory, against PyTorch on the
 * same GPU in the same run (issue 12, "what must be shown" 4).
 *
 *   bench_cuda MODEL B T STEPS [PRECISION]      (PRECISION: bf16-mixed, the default, or fp32)
 *
 * Our side is what fsdp-train runs on device = cuda (train.h: the sharded
 * runtime on one rank, AdamW, clipping), on a fixed pseudo-random token
 * stream: 2 untimed warm-up steps, then STEPS timed ones; the median step
 * is reported (each step reads its loss back, so a step's wall time is the
 * GPU's). The peer is tests/bench/torch_gpt2_cuda.py with the same model and
 * shapes, eager and torch.compile, bf16 autocast, fused AdamW; it also times
 * a bf16 GEMM of 8192^3, the ceiling MFU is read against besides the
 * datasheet's peak (FSDP_BENCH_PEAK_TFLOPS, default 989.4: H100 SXM dense
 * bf16). FSDP_BENCH_NO_PEER=1 skips the peer (ours alone: to compare our
 * own settings, e.g. FSDP_CUDA_ATTN_GEMM=1 against the fused attention).
 * FSDP_BENCH_RECOMPUTE=0|1|2 sets the job's recompute (default the job
 * option's, by device: 0 on cuda unless the GPU is too small,
 * config_recompute): what recomputing GELU and the layernorms costs a step
 * on this GPU, against the activations it saves (the memory lines).
 * FSDP_BENCH_LOGITS_MIB=N sets the job's logits_chunk_mib (default the
 * device's, 1024 MiB on cuda: config_logits_chunk_mib):
 * what fewer, larger chunks of the LM head save a step, against their
 * memory (the activations line).
 * FSDP_BENCH_TRACE=1 runs one more step after the timed ones, traced with
 * CUPTI (trace_cupti.c), and prints where its time went (trace.h): the
 * GPU's busy and idle time, its records by name, what each idle gap waited
 * for, the longest gaps and the host's time in CUDA calls. The traced step
 * is not among the timed ones (tracing slows it).
 *
 * Lines (stdout):
 *   bench: cuda_train model= B= T= precision= attention= recompute= logits_mib= step_ms= ...
 *   bench: cuda_flops formula="6*params + 12*L*C*T per token" flops_per_token=
 *   bench: cuda_memory cat= planned_mib= peak_mib= equal=
 *   bench: cuda_pool reserved_high_mib= used_high_mib= overhead=   (the stream-ordered pool)
 *   bench: cuda_torch mode= tokens_per_s= ...         (the peer's own lines, relabelled)
 *   bench: cuda_vs_torch ours= torch_eager= torch_compile= vs_compile= goal_vs_compile=1 met=
 *   bench: cuda_mfu model= mfu_peak= goal= met=
 *   bench: cuda_trace... (FSDP_BENCH_TRACE=1: trace.c's lines)
 * `bench_cuda --ops MODEL B T [PRECISION]` times each op of a step alone
 * instead (ops_main, below), with the products' inputs in bf16 where the
 * plugin offers it (kern.h's bf16 activations; FSDP_BENCH_ACTS16=0: never,
 * for a plugin whose table predates them).
 * Without a GPU it prints why and exits 0. Exit 1: a step failed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/param.h"
#include "daemon/job/plan.h"
#include "daemon/train/data.h"
#include "daemon/train/device.h"
#include "daemon/train/device_cuda.h"
#include "daemon/train/train.h"
#include "kernels/cuda/size.h"
#include "tests/bench/trace_cupti.h"

#define MIB (1024.0 * 1024.0)
#define MAX_STEPS 1000

static double step_s[MAX_STEPS + 3]; /* warm-up, timed, traced */
static int steps_seen;
static mem_snapshot_t last_mem;
static float last_loss;

static void on_metrics(void *ctx, const train_metrics_t *m) {
  (void)ctx;
  if (steps_seen < MAX_STEPS + 3) step_s[steps_seen++] = m->step_s;
  last_mem = m->mem;
  last_loss = m->loss;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The environment's integer name, when set, into *out: 0, or -1 (said on
 * stderr) when it is not an integer in [lo, hi]. */
static int bench_env_int(const char *name, long lo, long hi, int *out) {
  const char *v = getenv(name);
  if (!v || !*v) return 0;
  char *end;
  const long x = strtol(v, &end, 10);
  if (*end || x < lo || x > hi) {
    fprintf(stderr, "bench_cuda: %s=%s: give an integer from %ld to %ld\n", name, v, lo, hi);
    return -1;
  }
  *out = (int)x;
  return 0;
}

/* The peer's value of key in its line for mode (0 when absent). */
static double peer_value(const char *out, const char *mode, const char *key) {
  char tag[64], k[64];
  snprintf(tag, sizeof tag, "torch: mode=%s ", mode);
  const char *line = strstr(out, tag);
  if (!line) return 0;
  const char *end = strchr(line, '\n');
  snprintf(k, sizeof k, " %s=", key);
  const char *v = strstr(line, k);
  return v && (!end || v < end) ? atof(v + strlen(k)) : 0;
}


/* ---- --ops: each op of a training step alone, at the model's shapes ---------
 * `bench_cuda --ops MODEL B T [PRECISION]`: every table op a step of MODEL
 * makes, timed alone on device buffers of its shapes (2 untimed calls, then
 * the mean of OPS_REPS, the stream drained around them), times how often a
 * step calls it (GELU's and the layernorms' forwards as often as the job's
 * recompute level, by device or FSDP_BENCH_RECOMPUTE, runs them); their sum against the step's measured time shows what the
 * step spends outside the ops (waits, launches, the collectives). Then the
 * products of the LM head and the MLP in each mode (bf16 packed, bf16 by
 * cuBLASLt's FAST_16BF, TF32, fp32), in TFLOP/s. */
#define OPS_REPS 5
static const kern_backend_t *K;
static double ops_sum_ms;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* FSDP_BENCH_OPS=WORD: only the ops whose name holds WORD, and no products
 * by mode (a short lease's comparison of one kernel's builds). */
static int ops_want(const char *name) {
  const char *w = getenv("FSDP_BENCH_OPS");
  return !w || !*w || strstr(name, w);
}

#define OPS_TIME(name, shape, count, stmt)                                                         \
  do {                                                                                             \
    if (!ops_want(name)) break;                                                                    \
    for (int w_ = 0; w_ < 2; w_++) { stmt; }                                                       \
    K->sync();                                                                                     \
    const double t0_ = now_s();                                                                    \
    for (int r_ = 0; r_ < OPS_REPS; r_++) { stmt; }                                                \
    K->sync();                                                                                     \
    const double ms_ = (now_s() - t0_) * 1e3 / OPS_REPS;                                           \
    ops_sum_ms += ms_ * (count);                                                                   \
    printf("bench: cuda_op op=%s shape=%s ms=%.3f per_step=%d step_ms=%.2f\n", name, shape, ms_,  \
           (int)(count), ms_ * (count));                                                           \
    fflush(stdout);                                                                                \
  } while (0)

/* A device buffer of n floats, filled from a repeated pseudo-random block. */
static float *ops_buf(size_t n) {
  static float blk[1 << 20];
  static int made;
  if (!made++) {
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      blk[i] = (float)((x >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
    }
  }
  float *d = K->dev_alloc(n * sizeof(float));
  if (!d) {
    fprintf(stderr, "bench_cuda: --ops: no device memory for %zu floats\n", n);
    exit(1);
  }
  for (size_t o = 0; o < n; o += sizeof blk / sizeof blk[0]) {
    const size_t c = n - o < sizeof blk / sizeof blk[0] ? n - o : sizeof blk / sizeof blk[0];
    K->copy_h2d(d + o, blk, c * sizeof(float));
  }
  return d;
}

/* Which attention the job's settings run: "gemm" (strided products),
 * "fused-bf16-tc" (attention_tc.cu, bf16 jobs), "fused-bf16-cudnn"
 * (cudnn.cu, FSDP_CUDA_ATTN_CUDNN=1; the kernels where cuDNN has no engine,
 * said on stderr) or "fused-fp32". */
static const char *bench_attn_name(int C, int NH, int bf16) {
  if (!kern_cuda_size_attn_fused(C, NH, param_cuda_attn_gemm() != 0)) return "gemm";
  if (!bf16 || param_cuda_attn_fp32()) return "fused-fp32";
  return param_cuda_attn_cudnn() ? "fused-bf16-cudnn" : "fused-bf16-tc";
}

static int ops_main(const device_cuda_plugin_t *p, const char *model, int B, int T,
                    const char *prec) {
  config_t c;
  config_default(&c);
  snprintf(c.model, sizeof c.model, "%s", model);
  snprintf(c.device, sizeof c.device, "cuda");
  snprintf(c.precision, sizeof c.precision, "%s", prec);
  c.batch = B, c.seq_len = T, c.eval_every = 0, c.eval_fraction = 0;
  if (bench_env_int("FSDP_BENCH_LOGITS_MIB", 1, 4096, &c.logits_chunk_mib) ||
      bench_env_int("FSDP_BENCH_RECOMPUTE", 0, 2, &c.recompute))
    return 2;
  if (config_resolve(&c)) {
    fprintf(stderr, "bench_cuda: %s\n", err_msg());
    return 2;
  }
  const gpt_config_t *g = &c.gpt;
  const int C = g->channels, NH = g->heads, V = g->vocab, L = g->layers;
  /* a step's GELU and layernorm forwards: once a block, again in backward
   * where the job recomputes them (config_recompute) */
  const int rc_lvl = config_recompute(&c), n_gelu = L * (rc_lvl >= 1 ? 2 : 1),
            n_ln = 2 * L + 1 + (rc_lvl >= 2 ? 2 * L : 0);
  const int ldv = gpt_config_logits_ld(g); /* the logits' padded rows, as the model has them */
  const size_t N = (size_t)B * T, P = gpt_config_num_params(g);
  char msg[512];
  const int bf16 = strcmp(prec, "fp32") != 0;
  if (device_cuda_params_check()) {
    fprintf(stderr, "bench_cuda: %s\n", err_msg());
    return 2;
  }
  const kern_cuda_opts_t ko = device_cuda_opts(0, bf16, c.tf32);
  if (!(K = p->kern_init(&ko, msg, sizeof msg))) {
    fprintf(stderr, "bench_cuda: %s\n", msg);
    return 1;
  }
  printf("bench: cuda_ops model=%s B=%d T=%d precision=%s params=%zu reps=%d\n", model, B, T, prec,
         P, OPS_REPS);
  float *x = ops_buf(N * 4 * C), *y = ops_buf(N * 4 * C), *z = ops_buf(N * 4 * C);
  float *w = ops_buf((size_t)4 * C * C), *dw = ops_buf((size_t)4 * C * C);
  float *bias = ops_buf((size_t)4 * C), *dbias = ops_buf((size_t)4 * C);
  float *mean = ops_buf(N), *rstd = ops_buf(N), *losses = ops_buf(N);
  float *wte = ops_buf((size_t)V * C), *dwte = ops_buf((size_t)V * C);
  float *wpe = ops_buf((size_t)T * C), *dwpe = ops_buf((size_t)T * C);
  float *logits = ops_buf(N * ldv);
  float *att = ops_buf(K->attention_saved(B, T, C, NH) + 1);
  float *scratch = ops_buf(K->attention_scratch(B, T, C, NH) + 1);
  float *pp = ops_buf(P), *pg = ops_buf(P), *pm = ops_buf(P), *pv = ops_buf(P);
  int32_t *tok = K->dev_alloc(N * sizeof(int32_t));
  int32_t *htok = malloc(N * sizeof(int32_t));
  for (size_t i = 0; i < N && htok; i++) htok[i] = (int32_t)((i * 2654435761u) % (uint32_t)V);
  if (!tok || !htok) return 1;
  K->copy_h2d(tok, htok, N * sizeof(int32_t));
  /* the products' inputs in bf16 where the table offers it, as gpt.c
   * keeps them (kern.h's bf16 activations): those ops count in the step,
   * their fp32 forms 0 times (timed for comparison) */
  const char *e16 = getenv("FSDP_BENCH_ACTS16"); /* 0: a plugin of an older table (gpu-run.sh) */
  const int a16 = !(e16 && !strcmp(e16, "0")) && K->matmul_fwd_bf16 && gpt_config_acts_bf16_fits(g);
  uint16_t *x16 = a16 ? K->dev_alloc(N * 4 * C * sizeof(uint16_t)) : NULL,
           *y16 = a16 ? K->dev_alloc(N * 4 * C * sizeof(uint16_t)) : NULL;
  if (a16 && (!x16 || !y16)) return 1;
  if (a16) K->f32_to_bf16(x16, x, N * 4 * C);
  /* the weights' bf16 images where the products read them (kern.h's
   * weights16: the runtime keeps each unit's bf16 gather for them) */
  const int k16 = a16 && K->weights16;
  uint16_t *w16 = k16 ? K->dev_alloc((size_t)4 * C * C * sizeof(uint16_t)) : NULL,
           *wte16 = k16 ? K->dev_alloc((size_t)V * C * sizeof(uint16_t)) : NULL,
           *b16 = k16 ? K->dev_alloc((size_t)4 * C * sizeof(uint16_t)) : NULL;
  if (k16 && (!w16 || !wte16 || !b16)) return 1;
  if (k16)
    K->f32_to_bf16(w16, w, (size_t)4 * C * C), K->f32_to_bf16(wte16, wte, (size_t)V * C),
        K->f32_to_bf16(b16, bias, (size_t)4 * C);
  char sh[64];
  snprintf(sh, sizeof sh, "N=%zu,C=%d", N, C);
  /* from the embeddings' images where the runtime keeps them (gpt.c, fsdp.c:
   * then not widened); wte16's first rows stand in for wpe's (a timing) */
  const int enc16 = k16 && K->encoder_fwd16;
  OPS_TIME("encoder_fwd", sh, !enc16, K->encoder_fwd(x, tok, wte, wpe, B, T, C));
  if (enc16) OPS_TIME("encoder_fwd16", sh, 1, K->encoder_fwd16(x, tok, wte16, wte16, B, T, C));
  OPS_TIME("encoder_bwd", sh, 1, K->encoder_bwd(dwte, dwpe, x, tok, B, T, C));
  OPS_TIME("layernorm_fwd", sh, a16 ? 0 : n_ln,
           K->layernorm_fwd(y, mean, rstd, x, w, bias, (int)N, C));
  if (a16)
    OPS_TIME("layernorm_fwd_bf16", sh, n_ln,
             K->layernorm_fwd_bf16(y16, mean, rstd, x, w, bias, (int)N, C));
  /* fch kept in bf16 where GELU reads it so (gpt.c's fch16): the fc product
   * writes bf16 without its bias, GELU adds it */
  const int h16 = a16 && K->gelu_fwd_bf16in && K->gelu_bwd_bf16in && K->matmul_fwd_bf16_out16;
  const int q16 = a16 && K->attention_bf16_fits(C, NH); /* qkv in bf16 (gpt.c's qkv16) */
  /* the residual's gradient in bf16 from the norms' backward, read by the
   * projections' (gpt.c's gpt_dres16): every norm's but block 0's ln1 */
  const int dr16 = q16 && h16 && K->matmul_bwd_dinp16 && K->layernorm_bwd16 && K->matmul_bwd16;
  float *dsums = dr16 ? ops_buf((N / 32 + 1) * (size_t)C) : NULL;
  OPS_TIME("layernorm_bwd", sh, dr16 ? 1 : 2 * L + 1,
           K->layernorm_bwd(z, dw, dbias, x, y, w, mean, rstd, (int)N, C));
  if (dr16)
    OPS_TIME("layernorm_bwd16", sh, 2 * L,
             K->layernorm_bwd16(z, y16, dsums, dw, dbias, x, y, w, mean, rstd, (int)N, C));
  const struct { const char *name; int ic, oc; } mm[] = {
      {"qkv", C, 3 * C}, {"attproj", C, C}, {"fc", C, 4 * C}, {"fcproj", 4 * C, C}};
  /* qkv written in bf16 by its product, with the bias's bf16 image (gpt.c,
   * where the weights' images are there) */
  const int qo16 = q16 && k16 && K->qkv_out16 && K->matmul_fwd_bf16_out16;
  /* GELU in the fc product's write (gpt.c's fch_biased: FSDP_CUDA_GELU_FUSED=1,
   * with the weights' images, recompute 0); timed either way, for comparison */
  const int fg = h16 && k16 && K->matmul_fwd_bf16_gelu, fgs = fg && param_cuda_gelu_fused() &&
                                                              rc_lvl == 0;
  /* attproj's and fcproj's dinp in bf16 for the bf16 attention's and GELU's
   * backward (gpt.c's datt16, dgelu16) */
  const int datt16 = q16 && K->matmul_bwd_dinp16, dgelu16 = h16 && K->matmul_bwd_dinp16;
  /* dqkv in bf16 from the attention, qkv's dout16 (gpt.c's dqkv16) */
  const int dq16 = q16 && K->attention_bwd_dqkv16;
  /* the projections (attproj, fcproj) add the residual as they write
   * where the table offers it (gpt.c's gpt_proj_res): no residual pass */
  const int pres = K->matmul_fwd_res != NULL;
  for (int i = 0; i < 4; i++) {
    snprintf(sh, sizeof sh, "%s:N=%zu,IC=%d,OC=%d", mm[i].name, N, mm[i].ic, mm[i].oc);
    /* attproj's input is the attention's output: bf16 with qkv (q16), else fp32 */
    const int b = a16 && (i != 1 || q16);
    const int proj = pres && (i == 1 || i == 3);
    OPS_TIME("matmul_fwd", sh, b || proj ? 0 : L,
             K->matmul_fwd(y, x, w, bias, (int)N, mm[i].ic, mm[i].oc, mm[i].oc));
    if (proj)
      OPS_TIME("matmul_fwd_res", sh, L,
               K->matmul_fwd_res(y, b ? NULL : x, b ? x16 : NULL, w, w16, bias, z, (int)N,
                                 mm[i].ic, mm[i].oc));
    OPS_TIME("matmul_bwd", sh, b || (i == 1 && datt16) ? 0 : L,
             K->matmul_bwd(z, dw, dbias, y, x, w, (int)N, mm[i].ic, mm[i].oc, mm[i].oc, 0));
    if (i == 1 && datt16) /* datt16 needs q16: attproj's input in bf16 */
      OPS_TIME("matmul_bwd_dinp16", sh, dr16 ? 0 : L,
               K->matmul_bwd_dinp16(y16, dw, dbias, y, NULL, x16, w, w16, (int)N, mm[i].ic,
                                    mm[i].oc));
    if (!b) continue;
    OPS_TIME("matmul_fwd_bf16", sh, (h16 && i == 2) || (qo16 && i == 0) || proj ? 0 : L,
             K->matmul_fwd_bf16(y, x16, w, w16, bias, (int)N, mm[i].ic, mm[i].oc, mm[i].oc));
    if (h16 && i == 2)
      OPS_TIME("matmul_fwd_bf16_out16", sh, fgs ? 0 : L,
               K->matmul_fwd_bf16_out16(y16, x16, w, w16, NULL, (int)N, mm[i].ic, mm[i].oc,
                                        mm[i].oc));
    if (fg && i == 2) /* against the product above and gelu_fwd_bf16in below */
      OPS_TIME("matmul_fwd_bf16_gelu", sh, fgs ? L : 0,
               K->matmul_fwd_bf16_gelu(y16, (uint16_t *)z, x16, w, w16, b16, (int)N, mm[i].ic,
                                       mm[i].oc));
    if (qo16 && i == 0)
      OPS_TIME("matmul_fwd_bf16_out16(bias16)", sh, L,
               K->matmul_fwd_bf16_out16(y16, x16, w, w16, b16, (int)N, mm[i].ic, mm[i].oc,
                                        mm[i].oc));
    /* fc's dout comes in bf16 where GELU's backward makes it so (gpt.c,
     * kern.h's gelu_bwd_bf16, which sums its dbias) */
    const int f16 = i == 2 && K->gelu_bwd_bf16;
    OPS_TIME("matmul_bwd_bf16", sh,
             f16 || (i == 3 && dgelu16) || (i == 1 && datt16) || (i == 0 && dq16) ? 0 : L,
             K->matmul_bwd_bf16(z, dw, dbias, y, NULL, x16, w, w16, (int)N, mm[i].ic, mm[i].oc,
                                mm[i].oc, 0));
    if (i == 0 && dq16) { /* its dbias from the bf16 dqkv */
      snprintf(sh, sizeof sh, "%s:N=%zu,IC=%d,OC=%d,dout16", mm[i].name, N, mm[i].ic, mm[i].oc);
      OPS_TIME("matmul_bwd_bf16(dbias16)", sh, L,
               K->matmul_bwd_bf16(z, dw, dbias, NULL, y16, x16, w, w16, (int)N, mm[i].ic,
                                  mm[i].oc, mm[i].oc, 0));
    }
    const int fdg = fgs && K->matmul_bwd_dgelu16; /* GELU's backward in it (gpt.c's dgelu_in) */
    if (i == 3 && dgelu16)
      OPS_TIME("matmul_bwd_dinp16", sh, fdg || dr16 ? 0 : L,
               K->matmul_bwd_dinp16(y16, dw, dbias, y, NULL, x16, w, w16, (int)N, mm[i].ic,
                                    mm[i].oc));
    if (i == 3 && fg && K->matmul_bwd_dgelu16) /* pre16: x16 again (a timing) */
      OPS_TIME("matmul_bwd_dgelu16", sh, fdg && !dr16 ? L : 0,
               K->matmul_bwd_dgelu16(y16, dw, dbias, y, x16, w, w16, x16, (int)N, mm[i].ic,
                                     mm[i].oc));
    if (dr16 && (i == 1 || i == 3)) { /* from the norm's bf16 dres (x16's first N C: a timing) */
      snprintf(sh, sizeof sh, "%s:N=%zu,IC=%d,OC=%d,dres16", mm[i].name, N, mm[i].ic, mm[i].oc);
      OPS_TIME("matmul_bwd16", sh, L,
               K->matmul_bwd16(y16, dw, dbias, x16, dsums, x16, w, w16, i == 3 && fdg ? x16 : NULL,
                               (int)N, mm[i].ic, mm[i].oc));
    }
    if (!f16) continue;
    snprintf(sh, sizeof sh, "%s:N=%zu,IC=%d,OC=%d,dout16", mm[i].name, N, mm[i].ic, mm[i].oc);
    OPS_TIME("matmul_bwd_bf16", sh, fgs && K->matmul_bwd_dgelu16 ? 0 : L,
             K->matmul_bwd_bf16(z, dw, NULL, NULL, y16, x16, w, w16, (int)N, mm[i].ic, mm[i].oc,
                                mm[i].oc, 0));
    if (fg && K->matmul_bwd_dgelu16) /* its dbias from the bf16 dout (gpt.c's dgelu_in) */
      OPS_TIME("matmul_bwd_bf16(dbias16)", sh, fgs ? L : 0,
               K->matmul_bwd_bf16(z, dw, dbias, NULL, y16, x16, w, w16, (int)N, mm[i].ic,
                                  mm[i].oc, mm[i].oc, 0));
  }
  snprintf(sh, sizeof sh, "lm_head:N=%zu,IC=%d,OC=%d,ld=%d", N, C, V, ldv);
  OPS_TIME("matmul_fwd", sh, !a16, K->matmul_fwd(logits, x, wte, NULL, (int)N, C, V, ldv));
  OPS_TIME("matmul_bwd", sh, !a16,
           K->matmul_bwd(z, dwte, NULL, logits, x, wte, (int)N, C, V, ldv, 0));
  /* bf16 logits where the table offers them (gpt.c's chunks) */
  const int l16 = a16 && K->crossentropy_fwd_bwd_bf16in && K->matmul_fwd_bf16_out16;
  if (l16)
    OPS_TIME("matmul_fwd_bf16_out16", sh, 1,
             K->matmul_fwd_bf16_out16((uint16_t *)logits, x16, wte, wte16, NULL, (int)N, C, V, ldv));
  if (a16) { /* backward from the bf16 dlogits the chunks make */
    OPS_TIME("matmul_fwd_bf16", sh, !l16,
             K->matmul_fwd_bf16(logits, x16, wte, wte16, NULL, (int)N, C, V, ldv));
    OPS_TIME("matmul_bwd_bf16", sh, 1,
             K->matmul_bwd_bf16(z, dwte, NULL, NULL, (const uint16_t *)logits + ldv, x16, wte,
                                wte16, (int)N, C, V, 2 * ldv, 0));
  }
  snprintf(sh, sizeof sh, "B=%d,T=%d,C=%d,NH=%d,%s", B, T, C, NH, bench_attn_name(C, NH, bf16));
  OPS_TIME("attention_fwd", sh, q16 ? 0 : L, K->attention_fwd(y, att, scratch, x, B, T, C, NH));
  OPS_TIME("attention_bwd", sh, q16 ? 0 : L,
           K->attention_bwd(z, scratch, y, x, y, att, B, T, C, NH, 0));
  if (q16) {
    OPS_TIME("attention_fwd_bf16", sh, qo16 ? 0 : L,
             K->attention_fwd_bf16(y16, att, scratch, x, x16, B, T, C, NH));
    if (qo16) /* qkv16 written by its product: no rounding pass */
      OPS_TIME("attention_fwd_bf16(qkv16)", sh, L,
               K->attention_fwd_bf16(y16, att, scratch, NULL, x16, B, T, C, NH));
    OPS_TIME("attention_bwd_bf16", sh, datt16 ? 0 : L,
             K->attention_bwd_bf16(z, scratch, y, NULL, x16, y16, att, B, T, C, NH, 0));
    if (datt16)
      OPS_TIME("attention_bwd_bf16(dout16)", sh, dq16 ? 0 : L,
               K->attention_bwd_bf16(z, scratch, NULL, y16, x16, y16, att, B, T, C, NH, 0));
    if (dq16) /* into z's first half, as bf16 */
      OPS_TIME("attention_bwd_dqkv16", sh, L,
               K->attention_bwd_dqkv16((uint16_t *)z, scratch, datt16 ? NULL : y,
                                       datt16 ? y16 : NULL, x16, y16, att, B, T, C, NH));
  }
  snprintf(sh, sizeof sh, "n=%zu", N * 4 * C);
  OPS_TIME("gelu_fwd", sh, a16 ? 0 : n_gelu, K->gelu_fwd(y, x, N * 4 * C));
  if (a16) OPS_TIME("gelu_fwd_bf16", sh, h16 ? 0 : n_gelu, K->gelu_fwd_bf16(y16, x, N * 4 * C));
  if (h16)
    OPS_TIME("gelu_fwd_bf16in", sh, fgs ? 0 : n_gelu,
             K->gelu_fwd_bf16in(y16, x16, bias, (int)N, 4 * C));
  const int g16 = a16 && K->gelu_bwd_bf16;
  OPS_TIME("gelu_bwd", sh, g16 ? 0 : L, K->gelu_bwd(z, x, y, N * 4 * C, 0));
  if (g16)
    OPS_TIME("gelu_bwd_bf16", sh, h16 ? 0 : L, K->gelu_bwd_bf16(y16, dbias, x, y, (int)N, 4 * C));
  if (h16)
    OPS_TIME("gelu_bwd_bf16in", sh, dgelu16 ? 0 : L,
             K->gelu_bwd_bf16in(y16, dbias, x16, bias, y, NULL, (int)N, 4 * C));
  if (dgelu16) /* dout16: x16 again (a timing) */
    OPS_TIME("gelu_bwd_bf16in(dout16)", sh, fgs && K->matmul_bwd_dgelu16 ? 0 : L,
             K->gelu_bwd_bf16in(y16, dbias, x16, bias, NULL, x16, (int)N, 4 * C));
  /* the backward ops write their activation gradients (acc 0): a step
   * zeroes none of these since 2026-11-27, only dres once; timed for what
   * they cost before */
  OPS_TIME("dev_set", sh, 0, K->dev_set(z, 0, N * 4 * C * sizeof(float)));
  snprintf(sh, sizeof sh, "n=%zu", N * C);
  OPS_TIME("residual_fwd", sh, pres ? 0 : 2 * L, K->residual_fwd(y, y, x, N * C));
  OPS_TIME("dev_set", sh, 1, K->dev_set(z, 0, N * C * sizeof(float)));
  snprintf(sh, sizeof sh, "N=%zu,V=%d,ld=%d", N, V, ldv);
  /* the forward makes probabilities in place, the backward gradients: each
   * timed call starts from its own output, which costs the same */
  /* a training step takes both at once (gpt_forward_train); the two apart
   * are timed for comparison, counted 0 times a step */
  OPS_TIME("crossentropy_fwd_bwd", sh, !a16,
           K->crossentropy_fwd_bwd(losses, logits, tok, 1.0f / (float)N, (int)N, V, ldv));
  /* the chunks' form, the bf16 dlogits for the product (gpt.c): from bf16
   * logits where the table offers it */
  if (a16)
    OPS_TIME("crossentropy_fwd_bwd_bf16", sh, !l16,
             K->crossentropy_fwd_bwd_bf16(losses, logits, tok, 1.0f / (float)N, (int)N, V, ldv));
  if (l16)
    OPS_TIME("crossentropy_fwd_bwd_bf16in", sh, 1,
             K->crossentropy_fwd_bwd_bf16in(losses, (uint16_t *)logits, tok, 1.0f / (float)N,
                                            (int)N, V, ldv));
  OPS_TIME("crossentropy_fwd", sh, 0, K->crossentropy_fwd(losses, logits, tok, (int)N, V, ldv));
  OPS_TIME("crossentropy_bwd", sh, 0,
           K->crossentropy_bwd(logits, tok, 1.0f / (float)N, (int)N, V, ldv));
  OPS_TIME("vec_sum", sh, 1, (void)K->vec_sum(losses, N));
  /* the LM head as a training step runs it (gpt.c's gpt_lm_head): chunks of
   * gpt_config_logits_rows rows, each its logits, loss and gradient, dX and
   * its share of dwte; counted 0 times (the three ops above count it), to
   * show what the chunks cost against one product over every row; with
   * bf16 logits twice the rows a chunk (gpt.c's gpt_lm_rows) */
  int lrows = gpt_config_logits_rows(g, config_logits_chunk_mib(&c)) * (l16 ? 2 : 1);
  if ((size_t)lrows > N) lrows = (int)N;
  snprintf(sh, sizeof sh, "N=%zu,V=%d,ld=%d,rows=%d", N, V, ldv, lrows);
  OPS_TIME("lm_head_chunked", sh, 0, {
    for (size_t r0 = 0; r0 < N; r0 += (size_t)lrows) {
      const int n = N - r0 < (size_t)lrows ? (int)(N - r0) : lrows;
      if (l16) { /* bf16 logits, the dlogits over them, as gpt.c's chunks */
        K->matmul_fwd_bf16_out16((uint16_t *)logits, x16 + r0 * C, wte, wte16, NULL, n, C, V, ldv);
        K->crossentropy_fwd_bwd_bf16in(losses + r0, (uint16_t *)logits, tok + r0, 1.0f / (float)N,
                                       n, V, ldv);
        K->matmul_bwd_bf16(z + r0 * C, dwte, NULL, NULL, (const uint16_t *)logits, x16 + r0 * C,
                           wte, wte16, n, C, V, ldv, 0);
        continue;
      }
      if (a16) { /* the bf16 dlogits in each row's second half */
        K->matmul_fwd_bf16(logits, x16 + r0 * C, wte, wte16, NULL, n, C, V, ldv);
        K->crossentropy_fwd_bwd_bf16(losses + r0, logits, tok + r0, 1.0f / (float)N, n, V, ldv);
        K->matmul_bwd_bf16(z + r0 * C, dwte, NULL, NULL, (const uint16_t *)logits + ldv,
                           x16 + r0 * C, wte, wte16, n, C, V, 2 * ldv, 0);
        continue;
      }
      K->matmul_fwd(logits, x + r0 * C, wte, NULL, n, C, V, ldv);
      K->crossentropy_fwd_bwd(losses + r0, logits, tok + r0, 1.0f / (float)N, n, V, ldv);
      K->matmul_bwd(z + r0 * C, dwte, NULL, logits, x + r0 * C, wte, n, C, V, ldv, 0);
    }
  });
  snprintf(sh, sizeof sh, "n=%zu", P);
  OPS_TIME("adamw", sh, 0, K->adamw(pp, pg, pm, pv, P, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
  { /* AdamW as the runtime runs it (adamw.c): a segment a tensor, in one
     * launch (kern.h's adamw_segs), and a launch a tensor for comparison */
    gpt_t *sg = NULL;
    if (gpt_create_shell(&sg, g, K)) return 1;
    const int nt = gpt_num_tensors(sg);
    kern_seg_t *segs = malloc((size_t)nt * sizeof *segs);
    if (!segs) return 1;
    for (int k = 0; k < nt; k++) {
      const gpt_tensor_t *t = gpt_tensor(sg, k);
      segs[k] = (kern_seg_t){t->offset, t->numel, t->decay};
    }
    snprintf(sh, sizeof sh, "n=%zu,tensors=%d", P, nt);
    OPS_TIME("adamw(a launch a tensor)", sh, 0, {
      for (int k = 0; k < nt; k++)
        K->adamw(pp + segs[k].offset, pg + segs[k].offset, pm + segs[k].offset,
                 pv + segs[k].offset, segs[k].numel, 1e-4f, 0.9f, 0.95f, 1e-8f,
                 segs[k].decay ? 0.1f : 0.0f, 1);
    });
    /* bf16-mixed steps with the master's bf16 image (fsdp.c's image16),
     * which the gathers rounded the master for before (twice a step under
     * FULL_SHARD) */
    uint16_t *p16 = (uint16_t *)ops_buf(P / 2 + 1);
    OPS_TIME("adamw_segs", sh, 0,
             K->adamw_segs(pp, NULL, pg, pm, pv, segs, nt, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    OPS_TIME("adamw_segs(bf16 image)", sh, 1,
             K->adamw_segs(pp, p16, pg, pm, pv, segs, nt, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1));
    OPS_TIME("adamw image alone: f32_to_bf16 of the master", sh, 0, K->f32_to_bf16(p16, pp, P));
    K->dev_free(p16);
    free(segs);
    gpt_destroy(sg);
  }
  OPS_TIME("sumsq", sh, 1, (void)K->sumsq(pg, P));
  printf("bench: cuda_ops model=%s sum_step_ms=%.2f (the ops of one step, each alone)\n", model,
         ops_sum_ms);
  K->dev_free(x16), K->dev_free(y16), K->dev_free(w16), K->dev_free(wte16), K->dev_free(b16);
  /* the products in every mode */
  if (!ops_want("products by mode")) return 0;
  const kern_cuda_opts_t modes[] = {{.bf16 = 1}, {.bf16 = 1, .gemm_fast16bf = 1}, {.tf32 = 1}, {0}};
  const char *mname[] = {"bf16-packed", "bf16-fast16bf", "tf32", "fp32"};
  for (int m = 0; m < 4; m++) {
    if (!(K = p->kern_init(&modes[m], msg, sizeof msg))) {
      fprintf(stderr, "bench_cuda: %s: %s\n", mname[m], msg);
      return 1;
    }
    /* the LM head with the model's padded rows, and with rows V apart (the
     * layout before stop 28: V = 50257 left them 4-byte aligned) */
    const struct { const char *name; int ic, oc, ld; float *out, *wt; } pr[] = {
        {"lm_head", C, V, ldv, logits, wte}, {"lm_head-ld=V", C, V, V, logits, wte},
        {"fc", C, 4 * C, 4 * C, y, w}};
    for (int i = 0; i < 3; i++) {
      const double fl = 2.0 * (double)N * pr[i].ic * pr[i].oc;
      double t = 0;
      for (int r = 0; r < 3 + OPS_REPS; r++) {
        if (r == 3) K->sync(), t = now_s();
        K->matmul_fwd(pr[i].out, x, pr[i].wt, NULL, (int)N, pr[i].ic, pr[i].oc, pr[i].ld);
      }
      K->sync();
      t = (now_s() - t) / OPS_REPS;
      printf("bench: cuda_gemm mode=%s product=%s M=%zu N=%d K=%d ms=%.3f tflops=%.1f\n", mname[m],
             pr[i].name, N, pr[i].oc, pr[i].ic, t * 1e3, fl / t / 1e12);
    }
  }
  return 0;
}

/* One step of t traced (FSDP_BENCH_TRACE=1): its result in *rc, where
 * its time went on stdout; a trace that cannot be made says why and the
 * step runs untraced. */
static void bench_trace_step(train_t *t, const char *model, int B, int *rc) {
  char msg[512], label[160];
  if (trace_cupti_start(msg, sizeof msg)) {
    printf("bench: cuda_trace skipped=\"%s\"\n", msg);
    *rc = train_step(t);
    return;
  }
  *rc = train_step(t);
  /* the step returns with the optimizer's kernels still queued: the trace
   * ends when the GPU has run them (CUPTI's flush does not wait, and hands
   * over unfinished records as invalid) */
  train_state_t st;
  train_state(t, &st);
  gpt_backend(fsdp_model(st.runtime))->sync();
  trace_t tr;
  trace_summary_t s;
  if (trace_cupti_stop(&tr, msg, sizeof msg)) {
    printf("bench: cuda_trace skipped=\"%s\"\n", msg);
    return;
  }
  snprintf(label, sizeof label, "model=%s B=%d step_ms=%.2f", model, B,
           steps_seen ? step_s[steps_seen - 1] * 1e3 : 0.0);
  if (trace_summarize(&tr, &s)) printf("bench: cuda_trace skipped=\"out of memory\"\n");
  else trace_print(stdout, &tr, &s, label);
  fflush(stdout);
  trace_cupti_free(&tr);
}

int main(int argc, char **argv) {
  const int ops = argc >= 5 && !strcmp(argv[1], "--ops");
  if (argc < 5) {
    fprintf(stderr, "usage: bench_cuda MODEL B T STEPS [bf16-mixed|fp32]\n"
                    "       bench_cuda --ops MODEL B T [bf16-mixed|fp32]\n");
    return 2;
  }
  setenv("FSDP_CUDA_PLUGIN", "lib/fsdpd/libfsdp-cuda.so", 0);
  const device_cuda_plugin_t *p;
  char msg[512] = "";
  if (device_cuda_load(&p) || p->device_count(msg, sizeof msg) <= 0) {
    printf("bench: cuda skipped=\"%s\"\n", msg[0] ? msg : err_msg());
    return 0;
  }
  if (ops) {
    if (atoi(argv[3]) < 1 || atoi(argv[4]) < 1) {
      fprintf(stderr, "bench_cuda: --ops: B and T must be positive\n");
      return 2;
    }
    return ops_main(p, argv[2], atoi(argv[3]), atoi(argv[4]), argc > 5 ? argv[5] : "bf16-mixed");
  }
  const char *model = argv[1], *prec = argc > 5 ? argv[5] : "bf16-mixed";
  const int B = atoi(argv[2]), T = atoi(argv[3]), steps = atoi(argv[4]);
  if (B < 1 || T < 1 || steps < 1 || steps > MAX_STEPS) {
    fprintf(stderr, "bench_cuda: B, T and STEPS (at most %d) must be positive\n", MAX_STEPS);
    return 2;
  }
  config_t c;
  config_default(&c);
  snprintf(c.model, sizeof c.model, "%s", model);
  snprintf(c.device, sizeof c.device, "cuda");
  snprintf(c.precision, sizeof c.precision, "%s", prec);
  const char *tr = getenv("FSDP_BENCH_TRACE");
  const int trace = tr && !strcmp(tr, "1");
  c.batch = B, c.seq_len = T, c.steps = steps + 2 + trace, c.warmup_steps = 2;
  c.eval_every = 0, c.eval_fraction = 0, c.sample_tokens = 0; /* no evaluation */
  if (bench_env_int("FSDP_BENCH_RECOMPUTE", 0, 2, &c.recompute) ||
      bench_env_int("FSDP_BENCH_LOGITS_MIB", 1, 4096, &c.logits_chunk_mib))
    return 2;
  if (config_resolve(&c)) {
    fprintf(stderr, "bench_cuda: %s\n", err_msg());
    return 2;
  }
  /* a fixed pseudo-random token stream, enough for every step */
  const size_t ntok = (size_t)B * T * (size_t)(steps + 3) * 11 / 10 + (size_t)T + 1;
  uint16_t *tok = malloc(ntok * sizeof *tok);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; tok && i < ntok; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    tok[i] = (uint16_t)(x % (uint64_t)c.gpt.vocab);
  }
  char data[] = "/tmp/bench_cuda.XXXXXX";
  int fd = mkstemp(data);
  if (!tok || fd < 0 || data_write(data, tok, ntok)) {
    fprintf(stderr, "bench_cuda: cannot write the token file: %s\n", err_msg());
    return 1;
  }
  close(fd);
  free(tok);
  snprintf(c.data, sizeof c.data, "%s", data);
  plan_t plan;
  train_opts_t o = {.metrics = on_metrics};
  train_t *t = NULL;
  int rc = train_open(&t, &c, &o);
  if (!rc) c = *train_config(t); /* as the run took it: a recompute raised to fit the GPU */
  if (!rc) rc = plan_job(&c, 1, &plan);
  while (!rc && !train_done(t)) {
    if (trace && steps_seen == steps + 2) {
      bench_trace_step(t, model, B, &rc);
      continue;
    }
    rc = train_step(t);
  }
  size_t nparams = 0;
  if (!rc) {
    train_state_t st;
    train_state(t, &st);
    nparams = gpt_num_params(fsdp_model(st.runtime));
  }
  train_close(t);
  unlink(data);
  if (rc || steps_seen < 3 || !isfinite(last_loss)) {
    fprintf(stderr, "bench_cuda: the run failed: %s\n", rc ? err_msg() : "loss not finite");
    return 1;
  }
  const int timed = steps_seen - 2 < steps ? steps_seen - 2 : steps; /* not the traced one */
  qsort(step_s + 2, (size_t)timed, sizeof step_s[0], cmp_double);
  const double med = step_s[2 + timed / 2];
  const double tps = (double)B * T / med;
  const gpt_config_t *g = &c.gpt;
  const double fpt = 6.0 * (double)nparams + 12.0 * g->layers * g->channels * (double)T;
  const char *pk = getenv("FSDP_BENCH_PEAK_TFLOPS");
  const double peak = (pk && atof(pk) > 0 ? atof(pk) : 989.4) * 1e12;
  /* the peer, on the same GPU now that ours is done */
  char cmd[512], peer[16384] = "";
  const char *np = getenv("FSDP_BENCH_NO_PEER");
  const int no_peer = np && !strcmp(np, "1");
  snprintf(cmd, sizeof cmd, "python3 tests/bench/torch_gpt2_cuda.py --device cuda --model %s "
           "--batch %d --seq %d --steps %d --warmup 3 --modes eager,compile --gemm 8192 "
           "--peak-tflops %g 2>&1", model, B, T, steps, peak / 1e12);
  FILE *pp = no_peer ? NULL : popen(cmd, "r");
  size_t n = pp ? fread(peer, 1, sizeof peer - 1, pp) : 0;
  peer[n] = 0;
  if (pp) pclose(pp);
  const char *gl = strstr(peer, "torch: gemm ");
  const char *gt = gl ? strstr(gl, "tflops=") : NULL;
  const double gemm = gt ? atof(gt + 7) * 1e12 : 0;
  printf("bench: cuda_train model=%s B=%d T=%d precision=%s attention=%s recompute=%d "
         "logits_mib=%d device=\"%s\" step_ms=%.2f tokens_per_s=%.0f mfu_peak=%.3f mfu_gemm=%.3f "
         "loss=%.4f\n",
         model, B, T, prec, bench_attn_name(g->channels, g->heads, strcmp(prec, "fp32") != 0),
         config_recompute(&c), config_logits_chunk_mib(&c), p->device_name(), med * 1e3, tps, tps * fpt / peak,
         gemm > 0 ? tps * fpt / gemm : 0.0, last_loss);
  printf("bench: cuda_flops formula=\"6*params + 12*layers*channels*T per token\" params=%zu "
         "flops_per_token=%.4g peak_tflops=%.1f gemm8192_tflops=%.1f\n", nparams, fpt,
         peak / 1e12, gemm / 1e12);
  for (int k = 0; k < MEM__COUNT; k++) {
    const double pl = plan.bytes[k] / MIB, pm = last_mem.peak[k] / MIB;
    printf("bench: cuda_memory cat=%s planned_mib=%.1f peak_mib=%.1f equal=%s\n",
           mem_cat_name((mem_cat_t)k), pl, pm, plan.bytes[k] == last_mem.peak[k] ? "yes" : "no");
  }
  /* what the device gave the pool of the step buffers against what they
   * used at once: the allocator's overhead, outside the plan's categories */
  size_t pool_now, pool_res, pool_used;
  p->pool_stats(&pool_now, &pool_res, &pool_used);
  printf("bench: cuda_pool model=%s reserved_high_mib=%.1f used_high_mib=%.1f "
         "overhead=%.3f\n", model, pool_res / MIB, pool_used / MIB,
         pool_used ? (double)pool_res / (double)pool_used : 0.0);
  if (no_peer) return 0;
  for (const char *l = peer; (l = strstr(l, "torch: ")); l++) {
    const char *e = strchr(l, '\n');
    printf("bench: cuda_%.*s\n", e ? (int)(e - l) : (int)strlen(l), l);
  }
  const double eager = peer_value(peer, "eager", "tokens_per_s");
  const double comp = peer_value(peer, "compile", "tokens_per_s");
  printf("bench: cuda_vs_torch model=%s ours=%.0f torch_eager=%.0f torch_compile=%.0f "
         "vs_compile=%.2f goal_vs_compile=1 met=%s\n", model, tps, eager, comp,
         comp > 0 ? tps / comp : 0.0, comp > 0 && tps >= comp ? "yes" : "no");
  const double goal = strstr(model, "774m") ? 0.55 : 0.45;
  printf("bench: cuda_mfu model=%s mfu_peak=%.3f goal=%.2f met=%s\n", model, tps * fpt / peak,
         goal, tps * fpt / peak >= goal ? "yes" : "no");
  return 0;
}

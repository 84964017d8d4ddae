/* test_adamw: our AdamW (daemon/train/adamw.c and the kernel under it) against
 * torch.optim.AdamW run in float64 by tests/reference/gpt2_ref.py --adamw-only
 * on the same parameters and gradients, and the rule that only tensors marked
 * decay are decayed. A missing python3 or torch FAILS the test.
 *
 * The script's input and output are record files (little-endian): a sequence
 * of { int32 name_len, name bytes, int64 numel, float64 data[numel] } ending
 * with a record named "end" of numel 0. Input: "hparams" = {beta1, beta2, eps,
 * weight_decay}, "lr" = one rate per step, then per tensor "param.<name>",
 * "decay.<name>" (0 or 1), "grad<s>.<name>" for s = 1..S. Output, per step s:
 * "param<s>.<name>", "exp_avg<s>.<name>", "exp_avg_sq<s>.<name>". */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/train/adamw.h"
#include "daemon/train/gpt.h"
#include "kernels/kern_math.h"
#include "refrun.h"
#include "testutil.h"

#define STEPS 3

/* Our fp32 against torch's float64, relative over each tensor. Every quantity is
 * a few fp32 operations from exact inputs (torch gets our fp32 params, grads and
 * constants exactly), so the error is a few unit roundoffs (6e-8): we measure
 * p 7e-8, m 9e-8, v 1.5e-7 at worst (see the log line). 1e-6 leaves room for a different
 * but correct order of operations and still catches a wrong bias correction,
 * eps placement or decay (those are 1e-4 and up). */
#define ADAMW_TOL 1e-6

/* ---- helpers ------------------------------------------------------------ */

/* Small enough to be quick, with every kind of tensor and two blocks. */
static gpt_t *model_of_vocab(uint64_t seed, int vocab) {
  gpt_config_t cfg = {.layers = 2, .channels = 16, .heads = 2, .vocab = vocab, .context = 8};
  gpt_t *g = NULL;
  cr_assert_eq(gpt_create(&g, &cfg, kern_cpu()), 0, "gpt_create: %s", err_msg());
  gpt_init_weights(g, seed);
  /* biases and norm parameters away from 0 and 1, so decay would show on them */
  uint64_t rng = seed + 17;
  float *p = gpt_params(g);
  for (size_t i = 0; i < gpt_num_params(g); i++) p[i] += (float)tu_rand_uniform(&rng, -0.1, 0.1);
  return g;
}

static gpt_t *tiny_model(uint64_t seed) { return model_of_vocab(seed, 32); }

/* Gradients over many magnitudes, 1e-10 to 1: some below eps (1e-8), where
 * eps dominates the denominator, most well above it; random signs. */
static void fill_grads(float *gr, size_t n, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) {
    double mag = pow(10.0, tu_rand_uniform(rng, -10, 0));
    gr[i] = (float)(tu_rand_uniform(rng, -1, 1) * mag);
  }
}

/* torch's AdamW in float64 (the reference script) from g's parameters, for
 * steps steps (at most STEPS) at rates lrs with gradient grads[s] at step s:
 * its output records (free with ref_free). */
static ref_file_t torch_adamw(gpt_t *g, adamw_hparams_t hp, const float *lrs,
                              float *const *grads, int steps) {
  const int nt = gpt_num_tensors(g);
  /* the input file: hyper-parameters, then per tensor its values, decay flag
   * and one gradient per step */
  char *inpath = tu_path("adamw_in.bin"), *outpath = tu_path("adamw_out.bin");
  FILE *f = fopen(inpath, "wb");
  cr_assert_not_null(f);
  /* the float constants widened exactly: torch computes with our values */
  double h[4] = {hp.beta1, hp.beta2, hp.eps, hp.weight_decay}, lr64[STEPS];
  for (int s = 0; s < steps; s++) lr64[s] = lrs[s];
  rec_write(f, "hparams", h, 4);
  rec_write(f, "lr", lr64, (size_t)steps);
  for (int i = 0; i < nt; i++) {
    const gpt_tensor_t *t = gpt_tensor(g, i);
    char key[96];
    double decay = t->decay;
    snprintf(key, sizeof key, "param.%s", t->name);
    rec_write_f32(f, key, gpt_params(g) + t->offset, t->numel);
    snprintf(key, sizeof key, "decay.%s", t->name);
    rec_write(f, key, &decay, 1);
    for (int s = 0; s < steps; s++) {
      snprintf(key, sizeof key, "grad%d.%s", s + 1, t->name);
      rec_write_f32(f, key, grads[s] + t->offset, t->numel);
    }
  }
  rec_write(f, "end", NULL, 0);
  cr_assert_eq(fclose(f), 0);

  char args[2048];
  snprintf(args, sizeof args, "--adamw-only '%s' '%s'", inpath, outpath);
  ref_run(args);
  ref_file_t rf = ref_read(outpath);
  free(inpath);
  free(outpath);
  return rf;
}

/* ---- tests -------------------------------------------------------------- */

Test(adamw, matches_torch) {
  const adamw_hparams_t hp = {0.9f, 0.95f, 1e-8f, 0.1f};
  const float lrs[STEPS] = {1e-3f, 3e-3f, 5e-4f};
  gpt_t *g = tiny_model(3);
  const int nt = gpt_num_tensors(g);
  const size_t np = gpt_num_params(g);
  float *gr = gpt_grads(g);
  float *grads[STEPS];
  uint64_t rng = 99;
  for (int s = 0; s < STEPS; s++) {
    grads[s] = malloc(np * sizeof(float));
    cr_assert_not_null(grads[s]);
    fill_grads(grads[s], np, &rng);
  }
  ref_file_t rf = torch_adamw(g, hp, lrs, grads, STEPS);

  adamw_t *o = NULL;
  cr_assert_eq(adamw_create(&o, g, hp), 0, "adamw_create: %s", err_msg());
  double worst[3] = {0, 0, 0};
  const char *what[3] = {"param", "exp_avg", "exp_avg_sq"};
  char worst_name[3][96] = {"", "", ""};
  for (int s = 0; s < STEPS; s++) {
    memcpy(gr, grads[s], np * sizeof(float));
    adamw_step(o, g, lrs[s]);
    cr_assert_eq(adamw_step_count(o), s + 1);
    const float *ours[3] = {gpt_params(g), adamw_m(o), adamw_v(o)};
    for (int i = 0; i < nt; i++) {
      const gpt_tensor_t *t = gpt_tensor(g, i);
      for (int q = 0; q < 3; q++) {
        char key[96];
        snprintf(key, sizeof key, "%s%d.%s", what[q], s + 1, t->name);
        double e = tu_rel_err_f32(ours[q] + t->offset, ref_get(&rf, key, t->numel), t->numel);
        if (e >= worst[q]) {
          worst[q] = e;
          snprintf(worst_name[q], sizeof worst_name[q], "%s", key);
        }
        cr_expect(e <= ADAMW_TOL, "%s: relative error %.3e > %.0e", key, e, ADAMW_TOL);
      }
    }
  }
  cr_log_info("adamw vs torch, %d steps: worst param %s %.2e, m %s %.2e, v %s %.2e", STEPS,
              worst_name[0], worst[0], worst_name[1], worst[1], worst_name[2], worst[2]);

  adamw_destroy(o);
  ref_free(&rf);
  for (int s = 0; s < STEPS; s++) free(grads[s]);
  gpt_destroy(g);
}

/* Distance in bf16 ulps between two finite bf16 values (uint16 storage). */
static int bf16_ulps(uint16_t a, uint16_t b) {
  const int x = a & 0x8000 ? -(a & 0x7fff) : a, y = b & 0x8000 ? -(b & 0x7fff) : b;
  return abs(x - y);
}

/* AdamW on bf16 state (bf16-true): one step on bf16 parameters and gradients
 * from zero m and v, against torch in float64 from the same values (bf16
 * widens exactly). Our step widens to fp32, runs the fp32 kernel and rounds
 * to bf16, so each new p, m and v must be torch's value rounded to bf16, or
 * its neighbour when a few fp32 roundings tip a value lying near the middle
 * between two bf16 numbers: within 1 bf16 ulp. */
Test(adamw, bf16_state_matches_torch_rounded) {
  const adamw_hparams_t hp = {0.9f, 0.95f, 1e-8f, 0.1f};
  const float lr = 3e-3f;
  const kern_backend_t *be = kern_cpu();
  /* wte of 1100 x 16 elements: more than one ADAMW_CHUNK, ending mid-chunk */
  gpt_t *g = model_of_vocab(7, 1100);
  cr_assert_gt(gpt_tensor(g, 0)->numel, ADAMW_CHUNK);
  const int nt = gpt_num_tensors(g);
  const size_t np = gpt_num_params(g);
  uint16_t *p16 = malloc(np * sizeof *p16), *g16 = malloc(np * sizeof *g16);
  float *grad = malloc(np * sizeof *grad);
  adamw_segment_t *segs = malloc((size_t)nt * sizeof *segs);
  cr_assert(p16 && g16 && grad && segs);
  uint64_t rng = 5;
  fill_grads(grad, np, &rng);
  be->f32_to_bf16(p16, gpt_params(g), np);
  be->bf16_to_f32(gpt_params(g), p16, np); /* torch starts from the bf16 values */
  be->f32_to_bf16(g16, grad, np);
  be->bf16_to_f32(grad, g16, np);
  ref_file_t rf = torch_adamw(g, hp, &lr, &grad, 1);

  for (int i = 0; i < nt; i++) {
    const gpt_tensor_t *t = gpt_tensor(g, i);
    segs[i] = (adamw_segment_t){t->offset, t->numel, t->decay};
  }
  adamw_t *o = NULL;
  cr_assert_eq(adamw_create_segments_bf16(&o, be, np, segs, nt, hp, MEM_OPTIM), 0, "%s", err_msg());
  adamw_step_bf16(o, p16, g16, lr);
  const uint16_t *ours[3] = {p16, adamw_m_bf16(o), adamw_v_bf16(o)};
  const char *what[3] = {"param", "exp_avg", "exp_avg_sq"};
  size_t off_by_one[3] = {0, 0, 0}, changed = 0;
  for (int i = 0; i < nt; i++) {
    const gpt_tensor_t *t = gpt_tensor(g, i);
    for (int q = 0; q < 3; q++) {
      char key[96];
      snprintf(key, sizeof key, "%s1.%s", what[q], t->name);
      const double *want = ref_get(&rf, key, t->numel);
      for (size_t k = 0; k < t->numel; k++) {
        const uint16_t got = ours[q][t->offset + k], w = kern_f32_to_bf16((float)want[k]);
        const int d = bf16_ulps(got, w);
        off_by_one[q] += d == 1;
        if (q == 0) changed += kern_f32_to_bf16(gpt_params(g)[t->offset + k]) != got;
        cr_expect(d <= 1, "%s[%zu]: ours %a, torch %a rounded to bf16 %a: %d ulps", key, k,
                  (double)kern_bf16_to_f32(got), want[k], (double)kern_bf16_to_f32(w), d);
      }
    }
  }
  cr_log_info("adamw on bf16 state vs torch float64 rounded to bf16, %zu elements: 1 ulp off in "
              "p %zu, m %zu, v %zu, the rest exact; %zu parameters moved", np, off_by_one[0],
              off_by_one[1], off_by_one[2], changed);
  cr_expect_gt(changed, np / 2, "the step moved only %zu of %zu bf16 parameters", changed, np);
  adamw_destroy(o);
  ref_free(&rf);
  free(p16), free(g16), free(grad), free(segs);
  gpt_destroy(g);
}

/* With zero gradients Adam's update is 0/(0+eps) = 0, so what is left is the
 * decay alone: tensors with decay=0 (biases, norms) keep their exact bits,
 * decay=1 tensors shrink by (1 - lr*wd) per step. Also pins which tensors are
 * decayed: exactly the matrices and the two embeddings. */
Test(adamw, decay_only_where_marked) {
  const adamw_hparams_t hp = {0.9f, 0.95f, 1e-8f, 0.1f};
  const float lrs[STEPS] = {0.1f, 0.3f, 0.05f};
  gpt_t *g = tiny_model(5);
  const size_t np = gpt_num_params(g);
  float *p0 = malloc(np * sizeof *p0);
  cr_assert_not_null(p0);
  memcpy(p0, gpt_params(g), np * sizeof *p0);
  adamw_t *o = NULL;
  cr_assert_eq(adamw_create(&o, g, hp), 0, "adamw_create: %s", err_msg());
  double factor = 1;
  for (int s = 0; s < STEPS; s++) {
    gpt_zero_grad(g);
    adamw_step(o, g, lrs[s]);
    factor *= 1.0 - (double)lrs[s] * hp.weight_decay;
  }
  for (int i = 0; i < gpt_num_tensors(g); i++) {
    const gpt_tensor_t *t = gpt_tensor(g, i);
    const size_t nl = strlen(t->name);
    const int is_matrix = !strcmp(t->name, "wte") || !strcmp(t->name, "wpe") ||
                          (nl > 5 && (!strcmp(t->name + nl - 5, "qkv.w") ||
                                      !strcmp(t->name + nl - 6, "proj.w") ||
                                      !strcmp(t->name + nl - 4, "fc.w")));
    cr_expect_eq(t->decay, is_matrix, "%s: decay flag %d, expected %d", t->name, t->decay,
                 is_matrix);
    const float *p = gpt_params(g) + t->offset, *q = p0 + t->offset;
    if (!t->decay) {
      cr_expect(memcmp(p, q, t->numel * sizeof *p) == 0,
                "%s (decay=0) changed under zero gradients: it was decayed", t->name);
    } else {
      double *want = malloc(t->numel * sizeof *want);
      cr_assert_not_null(want);
      for (size_t k = 0; k < t->numel; k++) want[k] = q[k] * factor;
      /* three fp32 multiplies: a few unit roundoffs */
      double e = tu_rel_err_f32(p, want, t->numel);
      cr_expect(e <= 1e-6, "%s (decay=1): after zero-gradient steps relative error %.3e "
                "against p * prod(1 - lr*wd) = %.6f", t->name, e, factor);
      free(want);
    }
  }
  adamw_destroy(o);
  free(p0);
  gpt_destroy(g);
}

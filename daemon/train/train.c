/* train: the single-rank training loop (see train.h). It owns the order of a
 * step: zero grads, micro-batches (forward, backward scaled by 1/grad_accum),
 * global-norm clipping, the scheduled AdamW step, evaluation and the progress
 * line. The kernels and the model own all the arithmetic. */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"
#include "adamw.h"
#include "data.h"
#include "gpt.h"
#include "mem.h"
#include "plan.h"
#include "sample.h"

float train_lr(const config_t *c, int step) {
  if (step < c->warmup_steps) return c->lr * (float)(step + 1) / (float)c->warmup_steps;
  int decay_steps = c->steps - c->warmup_steps;
  if (decay_steps <= 1) return c->lr;
  double progress = (double)(step - c->warmup_steps) / (double)(decay_steps - 1);
  double min_lr = (double)c->lr * c->min_lr_frac;
  return (float)(min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * ((double)c->lr - min_lr));
}

static double train_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Mean loss over the evaluation batches (all of them when eval_batches is 0). */
static int train_eval(gpt_t *g, data_t *d, const config_t *c, int32_t *in, int32_t *tg,
                      float *out) {
  size_t nb = data_eval_num_batches(d, c->batch, c->seq_len);
  if (c->eval_batches && (size_t)c->eval_batches < nb) nb = (size_t)c->eval_batches;
  double sum = 0;
  for (size_t k = 0; k < nb; k++) {
    float loss;
    int rc = data_eval_batch(d, k, c->batch, c->seq_len, in, tg);
    if (!rc) rc = gpt_forward(g, in, tg, c->batch, c->seq_len, &loss);
    if (rc) return err_wrap(rc, "evaluation batch %zu", k);
    sum += loss;
  }
  *out = nb ? (float)(sum / (double)nb) : NAN;
  return FSDP_OK;
}

/* Scales the gradients so their global norm is at most clip; returns the norm before. */
static float train_clip(gpt_t *g, float clip) {
  const kern_backend_t *be = gpt_backend(g);
  float *gr = gpt_grads(g);
  size_t n = gpt_num_params(g);
  double norm = sqrt(be->sumsq(gr, n));
  if (clip > 0 && norm > clip) {
    float s = (float)(clip / (norm + 1e-6));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) gr[i] *= s;
  }
  return (float)norm;
}

static int train_open_model(const config_t *c, gpt_t **g) {
  const kern_backend_t *be = kern_cpu();
  if (!c->init_from[0]) {
    int rc = gpt_create(g, &c->gpt, be);
    if (!rc) gpt_init_weights(*g, c->seed);
    return rc;
  }
  int rc = gpt_load(g, c->init_from, be);
  if (rc) return rc;
  const gpt_config_t *f = gpt_get_config(*g);
  if (memcmp(f, &c->gpt, sizeof *f)) {
    rc = err_set(FSDP_EINVAL, "init_from: %s holds a model with layers %d, channels %d, heads %d, "
                 "vocab %d, context %d, but the job asks for %d, %d, %d, %d, %d; make the model "
                 "options match the file", c->init_from, f->layers, f->channels, f->heads,
                 f->vocab, f->context, c->gpt.layers, c->gpt.channels, c->gpt.heads,
                 c->gpt.vocab, c->gpt.context);
    gpt_destroy(*g);
    *g = NULL;
  }
  return rc;
}

/* A look at what the model learned: sample_tokens tokens after the prompt
 * (its bytes for a byte-level model, token 0 otherwise). */
static int train_sample(gpt_t *g, const config_t *c, FILE *out) {
  int32_t prompt[256];
  int np = 0;
  if (c->gpt.vocab == 256)
    for (const char *p = c->sample_prompt; *p && np < 256; p++) prompt[np++] = (unsigned char)*p;
  if (!np) prompt[np++] = 0;
  int32_t *toks = mem_alloc(MEM_WORKSPACE, (size_t)c->sample_tokens * sizeof *toks, "sample");
  if (!toks) return FSDP_ENOMEM;
  int rc = sample_tokens(g, prompt, np, c->sample_tokens, c->sample_temperature, c->seed, toks);
  if (!rc) {
    fprintf(out, "sample (temperature %g):\n%s", c->sample_temperature,
            c->gpt.vocab == 256 ? c->sample_prompt : "");
    sample_print(out, toks, c->sample_tokens, c->gpt.vocab);
  }
  mem_free(toks);
  return rc;
}

int train_run(const config_t *cin, FILE *progress, train_result_t *res) {
  config_t cfg = *cin;
  const config_t *c = &cfg;
  memset(res, 0, sizeof *res);
  res->eval_loss = NAN;
  int rc = config_finish(&cfg);
  if (rc) return rc;
  const kern_backend_t *be = kern_cpu();
  be->set_threads(c->threads ? c->threads : (int)param_threads());

  data_t *d = NULL;
  gpt_t *g = NULL;
  adamw_t *opt = NULL;
  int32_t *in = NULL, *tg = NULL;
  plan_t plan;
  plan_single(c, &plan);
  size_t limit = c->memory_limit_mib ? (size_t)c->memory_limit_mib << 20 : plan_host_available();
  if ((rc = plan_check(&plan, c, limit))) return rc;
  if (progress) plan_print(&plan, progress);
  if ((rc = data_open(&d, c->data, c->gpt.vocab, c->eval_fraction, c->seq_len))) goto out;
  if ((rc = train_open_model(c, &g))) goto out;
  gpt_set_checkpointing(g, c->activation_checkpointing);
  adamw_hparams_t hp = {c->beta1, c->beta2, c->eps, c->weight_decay};
  if ((rc = adamw_create(&opt, g, hp))) goto out;
  size_t N = (size_t)c->batch * (size_t)c->seq_len;
  in = mem_alloc(MEM_WORKSPACE, N * sizeof *in, "input batch");
  tg = mem_alloc(MEM_WORKSPACE, N * sizeof *tg, "target batch");
  if (!in || !tg) {
    rc = FSDP_ENOMEM;
    goto out;
  }
  if (progress)
    fprintf(progress, "train: model %s (layers %d, channels %d, heads %d, vocab %d, context %d): "
            "%.2fM params | precision fp32 (storage, compute, reduce, optimizer) | %d threads | "
            "activation checkpointing %s | %zu train + %zu eval tokens | %zu tokens/step\n",
            c->model[0] ? c->model : "custom", c->gpt.layers, c->gpt.channels, c->gpt.heads,
            c->gpt.vocab, c->gpt.context, gpt_num_params(g) / 1e6, be->get_threads(),
            c->activation_checkpointing ? "on" : "off", data_num_train_tokens(d), data_num_eval_tokens(d), N * (size_t)c->grad_accum);

  data_pos_t pos = {0, 0};
  double t_start = train_now(), t_after_first = 0;
  const int every = param_progress_every() > 0 ? (int)param_progress_every() : 1;
  for (int step = 0; step < c->steps; step++) {
    double t0 = train_now();
    gpt_zero_grad(g);
    double loss_sum = 0;
    for (int m = 0; m < c->grad_accum; m++) {
      float loss;
      if ((rc = data_next_batch(d, &pos, c->seed, c->batch, c->seq_len, in, tg))) goto out;
      if ((rc = gpt_forward(g, in, tg, c->batch, c->seq_len, &loss))) goto out;
      if ((rc = gpt_backward(g, 1.0f / (float)c->grad_accum))) goto out;
      loss_sum += loss;
    }
    float loss = (float)(loss_sum / c->grad_accum);
    if (!isfinite(loss)) {
      rc = err_set(FSDP_ERANGE, "step %d: the training loss is %f; training diverged: lower lr "
                   "(now %g) or set grad_clip", step + 1, loss, c->lr);
      goto out;
    }
    float norm = train_clip(g, c->grad_clip);
    float lr = train_lr(c, step);
    adamw_step(opt, g, lr);
    double t1 = train_now();
    if (step == 0) {
      res->first_loss = loss;
      t_after_first = t1;
    }
    res->last_loss = loss;
    res->steps_done = step + 1;
    if (progress && ((step + 1) % every == 0 || step + 1 == c->steps))
      fprintf(progress, "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms\n",
              step + 1, c->steps, loss, lr, norm,
              (double)N * c->grad_accum / (t1 - t0), 1e3 * (t1 - t0));
    int last = step + 1 == c->steps;
    if (data_num_eval_tokens(d) && (last || (c->eval_every && (step + 1) % c->eval_every == 0))) {
      if ((rc = train_eval(g, d, c, in, tg, &res->eval_loss))) goto out;
      if (progress) fprintf(progress, "eval  %5d/%d | loss %.4f\n", step + 1, c->steps,
                            res->eval_loss);
    }
    if (progress) fflush(progress);
  }
  double t_end = train_now();
  res->seconds = t_end - t_start;
  if (res->steps_done > 1)
    res->tokens_per_s = (double)N * c->grad_accum * (res->steps_done - 1) / (t_end - t_after_first);
  if (c->save[0] && (rc = gpt_save(g, c->save))) goto out;
  if (c->sample_tokens > 0 && progress && (rc = train_sample(g, c, progress))) goto out;
  res->mem_peak = mem_total_peak();
  res->mem_planned = plan.total;
  if (progress) {
    mem_report(progress, "mem (MiB):");
    if (c->save[0]) fprintf(progress, "train: saved weights to %s\n", c->save);
  }
out:
  mem_free(in);
  mem_free(tg);
  adamw_destroy(opt);
  gpt_destroy(g);
  data_close(d);
  return rc;
}

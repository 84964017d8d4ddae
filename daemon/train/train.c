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
#include "shard.h"
#include "fsdp.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

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

/* Mean loss over the evaluation batches (all of them when eval_batches is 0).
 * Batches have BG rows (the global batch); this rank evaluates rows
 * [row0, row0 + B) and the caller averages over ranks. */
static int train_eval(gpt_t *g, data_t *d, const config_t *c, int BG, int row0, int32_t *in,
                      int32_t *tg, float *out) {
  size_t nb = data_eval_num_batches(d, BG, c->seq_len);
  if (c->eval_batches && (size_t)c->eval_batches < nb) nb = (size_t)c->eval_batches;
  const size_t off = (size_t)row0 * (size_t)c->seq_len;
  double sum = 0;
  for (size_t k = 0; k < nb; k++) {
    float loss;
    int rc = data_eval_batch(d, k, BG, c->seq_len, in, tg);
    if (!rc) rc = gpt_forward(g, in + off, tg + off, c->batch, c->seq_len, &loss);
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
  if ((rc = gpt_weights_match(gpt_get_config(*g), &c->gpt, c->init_from))) {
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

/* ---- this process in the job ------------------------------------------- */

/* One device, or one rank of a sharded job started by fsdp-launch (later by
 * fsdpd), which passes FSDP_RANK, FSDP_WORLD_SIZE, FSDP_ADDRS (one host:port
 * per rank) and FSDP_LISTEN_FD (this rank's bound socket). */
typedef struct train_rank {
  int rank, world;
  shard_mesh_t mesh;
  comm_t *world_comm, *shard_comm, *replica_comm;
  fsdp_t *f;    /* sharded: the runtime; NULL on one device */
  gpt_t *g;     /* the model the loop runs: flat, or the runtime's shell */
  adamw_t *opt; /* one device */
} train_rank_t;

static int train_env_int(const char *name, int lo, int hi, int *out) {
  const char *v = getenv(name);
  char *end;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || !*v || *end || x < lo || x > hi)
    return err_set(FSDP_EINVAL, "%s: \"%s\" is not a number from %d to %d; it is set by "
                   "fsdp-launch (or the node daemon) for each rank of a sharded job", name,
                   v ? v : "(unset)", lo, hi);
  *out = (int)x;
  return FSDP_OK;
}

/* The world ring from the launcher's environment. */
static int train_world_comm(train_rank_t *tr, char ***addrs_out) {
  const char *env = getenv("FSDP_ADDRS");
  int lfd = -1, rc;
  if ((rc = train_env_int("FSDP_LISTEN_FD", 0, 1 << 20, &lfd))) return rc;
  if (!env) return err_set(FSDP_EINVAL, "FSDP_ADDRS: unset; it is set by fsdp-launch");
  char *copy = strdup(env), **addrs = calloc((size_t)tr->world, sizeof *addrs), *save = NULL;
  int n = 0;
  for (char *t = strtok_r(copy, ",", &save); t && n <= tr->world; t = strtok_r(NULL, ",", &save))
    if (n < tr->world) addrs[n++] = t; else n++;
  if (n != tr->world) {
    free(copy);
    free(addrs);
    return err_set(FSDP_EINVAL, "FSDP_ADDRS: %d addresses for a world of %d ranks", n, tr->world);
  }
  comm_ring_opts_t o = {.rank = tr->rank, .size = tr->world, .addrs = (const char *const *)addrs,
                        .name = "world", .listen_fd = lfd};
  rc = comm_ring_create(&o, &tr->world_comm);
  *addrs_out = addrs; /* addrs[0] points at the start of copy: both freed by the caller */
  return rc;
}

/* This process's place in the job: one device, or the rank the launcher set. */
static int train_rank_env(train_rank_t *tr) {
  memset(tr, 0, sizeof *tr);
  tr->world = 1;
  if (!getenv("FSDP_WORLD_SIZE")) return FSDP_OK;
  int rc = train_env_int("FSDP_WORLD_SIZE", 1, 4096, &tr->world);
  return rc ? rc : train_env_int("FSDP_RANK", 0, tr->world - 1, &tr->rank);
}

/* Connects the job's groups and builds the model (after train_rank_env). */
static int train_rank_open(const config_t *c, train_rank_t *tr, FILE *progress) {
  int rc;
  adamw_hparams_t hp = {c->beta1, c->beta2, c->eps, c->weight_decay};
  fsdp_precision_t prec;
  if ((rc = fsdp_precision_parse(c->precision, &prec))) return rc;
  if (!plan_uses_runtime(c, tr->world)) { /* the flat model */
    if ((rc = train_open_model(c, &tr->g))) return rc;
    return adamw_create(&tr->opt, tr->g, hp);
  }
  char desc[512];
  if ((rc = shard_mesh_resolve(c->strategy, c->mesh, tr->world, &tr->mesh, desc, sizeof desc)))
    return rc;
  if (progress && tr->rank == 0)
    fprintf(progress, "train: %s\ntrain: precision %s\n", desc, fsdp_precision_describe(prec));
  char **addrs = NULL;
  const int S = tr->mesh.shards, R = tr->mesh.replicas;
  if (tr->world > 1) {
    rc = train_world_comm(tr, &addrs);
    if (!rc && S > 1)
      rc = comm_ring_split(tr->world_comm, addrs[tr->rank], tr->rank / S, tr->rank % S, "shard", 0,
                           &tr->shard_comm);
    if (!rc && R > 1)
      rc = comm_ring_split(tr->world_comm, addrs[tr->rank], tr->rank % S, tr->rank / S, "replica",
                           0, &tr->replica_comm);
    if (addrs) free(addrs[0]);
    free(addrs);
    if (rc) return rc;
  }
  fsdp_opts_t o = {tr->mesh, tr->shard_comm, tr->replica_comm, c->seed, hp, prec, c->offload,
                   (size_t)c->min_params};
  if ((rc = fsdp_create(&tr->f, &c->gpt, &o))) return rc;
  tr->g = fsdp_model(tr->f);
  if (c->init_from[0])
    rc = fsdp_load_weights(tr->f, c->init_from);
  return rc;
}

static void train_rank_close(train_rank_t *tr) {
  if (tr->f) fsdp_destroy(tr->f); /* its model is the shell it owns */
  else gpt_destroy(tr->g);
  adamw_destroy(tr->opt);
  comm_destroy(tr->shard_comm);
  comm_destroy(tr->replica_comm);
  comm_destroy(tr->world_comm);
}

static void train_rank_zero_grad(train_rank_t *tr) {
  if (tr->f) fsdp_zero_grad(tr->f);
  else gpt_zero_grad(tr->g);
}

static int train_rank_step(train_rank_t *tr, const config_t *c, float lr, float *norm) {
  if (tr->f) return fsdp_step(tr->f, lr, c->grad_clip, norm);
  *norm = train_clip(tr->g, c->grad_clip);
  adamw_step(tr->opt, tr->g, lr);
  return FSDP_OK;
}

static int train_rank_mean(train_rank_t *tr, float *x) {
  return tr->f ? fsdp_mean(tr->f, x) : FSDP_OK;
}

/* How many ranks report a failure (bad != 0): every rank learns the same count. */
static int train_agree(train_rank_t *tr, int bad, int *total) {
  float x = (float)(bad != 0);
  int rc = tr->world_comm ? comm_all_reduce(tr->world_comm, &x, &x, 1, COMM_F32, COMM_SUM) : 0;
  *total = (int)x;
  return rc;
}

/* A weights file written by the shard ranks of the first replica, each into
 * its own byte ranges of one temporary file, renamed by rank 0 once all of
 * them succeeded: no rank holds the whole model, and a failure on any rank
 * leaves no file under the real name. */
static int train_save_sharded(train_rank_t *tr, const char *path) {
  char tmp[CONFIG_PATH_MAX + 32];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.sharded", path) >= (int)sizeof tmp)
    return err_set(FSDP_EINVAL, "save: path too long");
  const gpt_config_t *cfg = gpt_get_config(tr->g);
  int rc = FSDP_OK, bad = 0, total;
  char why[1024] = "";
  if (tr->rank == 0) {
    int32_t hdr[256];
    gpt_weights_header(cfg, hdr);
    off_t size = GPT_WEIGHTS_HEADER_BYTES + (off_t)(gpt_config_num_params(cfg) * sizeof(float));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr || ftruncate(fd, size))
      bad = 1, err_set_errno(err_from_errno(errno), errno, "saving weights to %s", tmp);
    if (fd >= 0) close(fd);
  }
  if (bad) snprintf(why, sizeof why, "%s", err_msg());
  if ((rc = train_agree(tr, bad, &total))) return rc;
  if (total) return err_set(FSDP_EIO, "save: rank 0 could not create %s%s%s", tmp, why[0] ? ": " : "", why);
  if (tr->rank < tr->mesh.shards) { /* the first replica's shard group writes */
    int fd = open(tmp, O_WRONLY);
    if (fd < 0) {
      bad = 1;
      err_set_errno(err_from_errno(errno), errno, "save: open %s", tmp);
    } else {
      bad = fsdp_write_weights(tr->f, fd, tmp) != FSDP_OK;
      if (!bad && fsync(fd)) bad = 1, err_set_errno(err_from_errno(errno), errno, "save: fsync %s", tmp);
      close(fd);
    }
    if (bad) snprintf(why, sizeof why, "%s", err_msg());
  }
  if ((rc = train_agree(tr, bad, &total))) return rc;
  if (!total && tr->rank == 0 && rename(tmp, path))
    bad = 1, snprintf(why, sizeof why, "rename: %s", strerror(errno));
  if (!total && (rc = train_agree(tr, bad, &total))) return rc;
  if (total) {
    if (tr->rank == 0) unlink(tmp);
    return err_set(FSDP_EIO, "save: %d rank(s) failed writing %s%s%s; no file was left under "
                   "that name", total, path, why[0] ? ": " : "", why);
  }
  return FSDP_OK;
}

static int train_rank_save(train_rank_t *tr, const char *path) {
  return tr->f ? train_save_sharded(tr, path) : gpt_save(tr->g, path);
}

/* ---- the loop ------------------------------------------------------------- */

int train_run(const config_t *cin, FILE *progress_in, train_result_t *res) {
  config_t cfg = *cin;
  const config_t *c = &cfg;
  memset(res, 0, sizeof *res);
  res->eval_loss = NAN;
  int rc = config_finish(&cfg);
  if (rc) return rc;
  train_rank_t tr;
  data_t *d = NULL;
  int32_t *in = NULL, *tg = NULL;
  FILE *progress = progress_in;
  const kern_backend_t *be = kern_cpu();
  int threads = c->threads ? c->threads : (int)param_threads();
  if ((rc = train_rank_env(&tr))) return rc;
  mem_run_begin(); /* the run's report counts this run, whatever the process held before */
  if (!threads && tr.world > 1) { /* the launcher's ranks share this machine's cores */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores / tr.world > 0 ? (int)(cores / tr.world) : 1;
  }
  be->set_threads(threads);

  /* every rank plans the same job and refuses it alike, before connecting */
  plan_t plan;
  if ((rc = plan_job(c, tr.world, &plan))) return rc;
  size_t limit = c->memory_limit_mib ? (size_t)c->memory_limit_mib << 20
                                     : plan_host_available() / (size_t)tr.world;
  if ((rc = plan_check(&plan, c, limit))) return rc;
  if (progress && tr.rank == 0) plan_print(&plan, c, progress);
  if ((rc = train_rank_open(c, &tr, progress))) goto out;
  if (tr.rank != 0) progress = NULL; /* one voice per job */
  if ((rc = data_open(&d, c->data, c->gpt.vocab, c->eval_fraction, c->seq_len))) goto out;
  gpt_t *g = tr.g;
  gpt_set_checkpointing(g, c->activation_checkpointing);
  /* every rank draws the same global batch and trains on its own rows of it */
  const int BG = c->batch * tr.world;
  size_t N = (size_t)c->batch * (size_t)c->seq_len, NG = (size_t)BG * (size_t)c->seq_len;
  in = mem_alloc(MEM_WORKSPACE, NG * sizeof *in, "input batch");
  tg = mem_alloc(MEM_WORKSPACE, NG * sizeof *tg, "target batch");
  if (!in || !tg) {
    rc = FSDP_ENOMEM;
    goto out;
  }
  if (progress)
    fprintf(progress, "train: model %s (layers %d, channels %d, heads %d, vocab %d, context %d): "
            "%.2fM params | precision %s | %d rank%s x "
            "%d threads | activation checkpointing %s | %zu train + %zu eval tokens | %zu "
            "tokens/step\n", c->model[0] ? c->model : "custom", c->gpt.layers, c->gpt.channels,
            c->gpt.heads, c->gpt.vocab, c->gpt.context, gpt_num_params(g) / 1e6, c->precision, tr.world,
            tr.world == 1 ? "" : "s", be->get_threads(), c->activation_checkpointing ? "on" : "off",
            data_num_train_tokens(d), data_num_eval_tokens(d), NG * (size_t)c->grad_accum);

  data_pos_t pos = {0, 0};
  double t_start = train_now(), t_after_first = 0;
  const int every = param_progress_every() > 0 ? (int)param_progress_every() : 1;
  const size_t mine = (size_t)tr.rank * N;
  for (int step = 0; step < c->steps; step++) {
    double t0 = train_now();
    mem_step_begin();
    train_rank_zero_grad(&tr);
    double loss_sum = 0;
    for (int m = 0; m < c->grad_accum; m++) {
      float loss;
      if (tr.f) fsdp_defer_reduce(tr.f, c->keep_unsharded_grads && m < c->grad_accum - 1);
      if ((rc = data_next_batch(d, &pos, c->seed, BG, c->seq_len, in, tg))) goto out;
      if ((rc = gpt_forward(g, in + mine, tg + mine, c->batch, c->seq_len, &loss))) goto out;
      if ((rc = gpt_backward(g, 1.0f / (float)c->grad_accum))) goto out;
      loss_sum += loss;
    }
    float loss = (float)(loss_sum / c->grad_accum), norm, lr = train_lr(c, step);
    if ((rc = train_rank_mean(&tr, &loss))) goto out;
    if (!isfinite(loss)) {
      rc = err_set(FSDP_ERANGE, "step %d: the training loss is %f; training diverged: lower lr "
                   "(now %g) or set grad_clip", step + 1, loss, c->lr);
      goto out;
    }
    if ((rc = train_rank_step(&tr, c, lr, &norm))) goto out;
    double t1 = train_now();
    if (step == 0) {
      res->first_loss = loss;
      t_after_first = t1;
    }
    res->last_loss = loss;
    res->steps_done = step + 1;
    if (progress && ((step + 1) % every == 0 || step + 1 == c->steps)) {
      fprintf(progress, "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms\n",
              step + 1, c->steps, loss, lr, norm,
              (double)NG * c->grad_accum / (t1 - t0), 1e3 * (t1 - t0));
      char what[48]; /* this step's memory by category: now and its peak */
      snprintf(what, sizeof what, "mem  %5d/%d (MiB):", step + 1, c->steps);
      mem_report_step(progress, what);
    }
    int last = step + 1 == c->steps;
    if (data_num_eval_tokens(d) && (last || (c->eval_every && (step + 1) % c->eval_every == 0))) {
      if ((rc = train_eval(g, d, c, BG, tr.rank * c->batch, in, tg, &res->eval_loss)) ||
          (rc = train_rank_mean(&tr, &res->eval_loss)))
        goto out;
      if (tr.f) fsdp_reshard(tr.f); /* strategies that keep units would hold them */
      if (progress) fprintf(progress, "eval  %5d/%d | loss %.4f\n", step + 1, c->steps,
                            res->eval_loss);
    }
    if (progress) fflush(progress);
  }
  double t_end = train_now();
  res->seconds = t_end - t_start;
  if (res->steps_done > 1)
    res->tokens_per_s = (double)NG * c->grad_accum * (res->steps_done - 1) / (t_end - t_after_first);
  if (c->save[0] && (rc = train_rank_save(&tr, c->save))) goto out;
  /* sampling runs on every rank in lockstep (the forward passes gather units) */
  if (c->sample_tokens > 0 && (progress || tr.f)) {
    FILE *sink = progress ? progress : fopen("/dev/null", "w");
    rc = sink ? train_sample(g, c, sink) : FSDP_OK;
    if (sink && sink != progress) fclose(sink);
    if (tr.f) fsdp_reshard(tr.f);
    if (rc) goto out;
  }
  res->mem_peak = mem_total_peak();
  res->mem_planned = plan.total;
  if (progress) {
    mem_report(progress, "mem (MiB):");
    if (c->save[0]) fprintf(progress, "train: saved weights to %s\n", c->save);
  }
out:
  mem_free(in);
  mem_free(tg);
  train_rank_close(&tr);
  data_close(d);
  return rc;
}

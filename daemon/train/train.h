/* train: the training loop of one rank (one device, or one rank of a sharded
 * job): data, the runtime, the schedule, clipping, evaluation, the end-of-run
 * outputs.
 *
 * It is driven a step at a time (train_open, train_step, train_finish,
 * train_close), so whoever runs it, the fsdp-train program or a node
 * daemon's rank worker, owns the step boundary: it can stop, checkpoint or
 * report between any two steps. Each step hands structured metrics to a
 * callback; the progress lines fsdp-train prints are one consumer of them
 * (train_run). Every rank, one device included, trains through the sharded
 * runtime (fsdp.h); the flat model (gpt_create) is the reference the tests
 * compare it against. */
#ifndef FSDP_TRAIN_H
#define FSDP_TRAIN_H

#include <signal.h>
#include <stdio.h>

#include "daemon/job/ckpt.h"
#include "daemon/job/config.h"
#include "daemon/common/mem.h"
#include "data.h"
#include "fsdp.h"

typedef struct train train_t;

/* What one step did, on this rank. The loss (and eval_loss) is the mean over
 * every rank's tokens, the same on all ranks; memory is this rank's. */
typedef struct train_metrics {
  int rank, world;
  int step, steps;     /* the step just done (1-based), of steps */
  float loss;          /* training loss, averaged over the step's micro-batches */
  float lr;            /* the learning rate the step used */
  float grad_norm;     /* global gradient norm before clipping */
  double step_s;       /* wall time of the step (evaluation excluded) */
  size_t tokens;       /* tokens of the step over every rank */
  double tokens_per_s; /* tokens / step_s */
  int evaluated;       /* an evaluation ran after the step ... */
  float eval_loss;     /* ... with this held-out loss */
  mem_snapshot_t mem;  /* this step's memory by category: now and the step's peak */
  mem_snapshot_t mem_run; /* the same, with the run's peaks (since train_open): what a report says */
  int no_step;         /* a final report of a run that trained no step: its loss and speed are none */
} train_metrics_t;

typedef void (*train_metrics_cb)(void *ctx, const train_metrics_t *m);

/* A shard of a checkpoint this rank wrote (step directory and report), or
 * could not write (failed: why; dir and shard NULL); or, damaged set, that
 * the committed checkpoint of step under checkpoint_dir was found damaged
 * at resume (failed: how; rank 0 alone says so). */
typedef struct train_ckpt {
  int rank, step;
  const char *dir;
  const ckpt_shard_report_t *shard;
  const char *failed;
  int damaged;
} train_ckpt_t;

/* Takes the report of a shard written or not; when set, the rank does not
 * commit (its owner does: fsdpd relays the report to the coordinator, which
 * aborts at once a checkpoint with a shard not written). */
typedef int (*train_ckpt_cb)(void *ctx, const train_ckpt_t *k);

typedef struct train_opts {
  /* the job's description lines (plan, mesh, model), the sample text and
   * the closing memory line: printed by rank 0 only; NULL: none */
  FILE *out;
  train_metrics_cb metrics; /* called on every rank after every step; NULL: none */
  void *ctx;
  train_ckpt_cb checkpoint; /* called with ctx after each shard written or not; NULL: commit here */
  /* set (by a signal handler) to stop: the ranks agree on it within the
   * step (it rides with the loss's all-reduce), so all stop after the same
   * step; NULL: never */
  volatile sig_atomic_t *stop;
} train_opts_t;

/* What train_run_with hands the loop besides the progress lines. */
typedef struct train_hooks {
  train_metrics_cb metrics;   /* every rank, every step, after the progress line */
  train_ckpt_cb checkpoint;   /* each shard this rank writes, or fails to (the owner commits) */
  void *ctx;
  volatile sig_atomic_t *stop;
  /* once, after the last step and train_finish (saving, sampling), or after
   * the step a run failed or stopped at: its last step, loss and memory,
   * with the run's peaks (mem and mem_run alike); never after a failed
   * train_open. A rank's final figures (fsdpd relays them in its exit report). */
  train_metrics_cb finished;
} train_hooks_t;

typedef struct train_result {
  int steps_done;
  int steps_run;         /* of them, taken by this run (0: a resumed checkpoint was at the last) */
  float first_loss;      /* training loss of the first step this run took (step 1, or the one after a resumed checkpoint) */
  float last_loss;       /* training loss of the last step */
  float eval_loss;       /* last evaluation (NAN if none) */
  double tokens_per_s;   /* over steps after the first (a run of one step: that step's) */
  double seconds;
  size_t mem_peak;       /* accounting allocator peak, bytes */
  size_t mem_planned;    /* what the plan predicted, bytes */
  double ckpt_lost_s;    /* training time the checkpoints cost this rank (the steps waited) */
} train_result_t;

/* The full training state a checkpoint needs: the steps done (the schedule
 * is a function of it: train_lr), where the data stream is, and the
 * runtime's shard and optimizer (fsdp_state). */
typedef struct train_state {
  int step;
  data_pos_t data;
  fsdp_t *runtime;
} train_state_t;

/* Learning rate at step (0-based): linear warmup, then cosine to min_lr_frac * lr. */
float train_lr(const config_t *c, int step);

/* Checks c (config_finish on a copy), plans the rank's memory and refuses a
 * job that cannot fit, checks that its outputs can be written, connects the
 * rank to its peers (boot.h: the launcher's environment), builds the runtime
 * and opens the data. Every failure is returned before the first step, with
 * a message naming the field and the fix. */
int train_open(train_t **out, const config_t *c, const train_opts_t *o);
/* One optimizer step (its micro-batches, clipping, AdamW), then an
 * evaluation when one is due; the metrics go to the callback. Every rank
 * calls it in lockstep. */
int train_step(train_t *t);
/* 1 once every step of the job is done, or the ranks agreed to stop. */
int train_done(const train_t *t);
/* 1 when the ranks agreed to stop (train_opts_t.stop) before the last step. */
int train_stopped(const train_t *t);
/* After the last step: saves the weights (save) and prints a sample
 * (sample_tokens); every rank calls it. */
int train_finish(train_t *t);
void train_state(train_t *t, train_state_t *st);
/* The job as the run takes it: finished, with what fitting it to the
 * rank's memory changed (a recompute raised, checkpoint_async off). */
const config_t *train_config(const train_t *t);
/* The run so far. */
void train_result(const train_t *t, train_result_t *res);
/* Frees everything; NULL is a no-op. */
void train_close(train_t *t);

/* The whole run: open, every step, finish, close, with a progress line per
 * step (every FSDP_PROGRESS_EVERY steps) and the memory of the step printed
 * to progress by rank 0 (NULL: silent). */
int train_run(const config_t *c, FILE *progress, train_result_t *res);
/* train_run with hooks (fsdp-train's report channel to its node daemon,
 * report.h, and its SIGTERM flag); NULL: none. A run stopped through
 * hooks->stop writes a checkpoint of the step it stopped after (when the job
 * has a checkpoint_dir and that step has none yet) and returns
 * FSDP_EPREEMPTED. */
int train_run_with(const config_t *c, FILE *progress, const train_hooks_t *hooks,
                   train_result_t *res);

#endif

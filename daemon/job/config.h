/* config: a training job's options, one table for flags and job files.
 *
 * Every option has one key (the long flag without dashes, and the key in a job
 * file), a default and a check. Job files are INI (parsed with inih): `key =
 * value` lines, optionally under sections ([model], [data], [optim]...), which
 * only group them for the reader; a value in double quotes keeps the spaces
 * at its ends, which inih would trim. A bad value gets an error naming the
 * key, the value, and what would be accepted.
 *
 * Defaults follow the model and the run: a default that does not fit (seq_len
 * longer than the model's context, warmup_steps longer than the run) is
 * adjusted by config_resolve, which says what it changed (config_adjusted).
 * Only a value the user gave explicitly is refused for not fitting. Explicit
 * means set through config_set (a flag, or a job file, which is read with
 * it), or, for code that writes fields directly, different from the
 * default. */
#ifndef FSDP_CONFIG_H
#define FSDP_CONFIG_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/job/gpt_config.h"

#define CONFIG_PATH_MAX 1024

typedef struct config {
  /* model */
  char model[64];             /* preset name, or "" for explicit dimensions */
  gpt_config_t dims;          /* explicit dimensions; 0 = take the preset's */
  gpt_config_t gpt;           /* final dimensions, set by config_resolve (0: not resolved) */
  char init_from[CONFIG_PATH_MAX]; /* weights file to start from ("" : random init) */
  char resume_from[CONFIG_PATH_MAX]; /* committed checkpoint, or a root: its latest ("" : none) */
  /* data */
  char data[CONFIG_PATH_MAX]; /* token file */
  double eval_fraction;       /* held-out share of the tokens */
  /* loop */
  int steps;                  /* optimizer steps */
  int batch;                  /* micro-batch size B */
  int seq_len;                /* T */
  int grad_accum;             /* micro-batches per step */
  uint64_t seed;
  int eval_every;             /* steps between evaluations (0: only at the end) */
  int eval_batches;           /* batches per evaluation (0: the whole held-out split) */
  int threads;                /* 0: FSDP_THREADS or all cores */
  char device[8];             /* "cpu" or "cuda": what every rank computes on */
  int tf32;                   /* cuda: 1 lets fp32 matrix products use TF32 tensor cores */
  int activation_checkpointing; /* 1: keep block inputs only, recompute in backward */
  int recompute;                /* 0, 1 GELU, 2 GELU and layernorms: recomputed in backward;
                                 * -1: by device (config_recompute; plan_fit_recompute) */
  int logits_chunk_mib;         /* MiB of logits the LM head computes at once (gpt_config_logits_rows);
                                 * 0: by device (config_logits_chunk_mib) */
  char strategy[32];          /* FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, ... */
  char mesh[32];              /* "RxS" ("" : 1xWORLD, or WORLDx1 for NO_SHARD) */
  char precision[16];         /* fp32, bf16-mixed or bf16-true */
  int keep_unsharded_grads;   /* 1: reduce once per step from unsharded gradients */
  int offload;                /* 1: master weights, gradient shard, AdamW state in host memory */
  double min_params;          /* wrap policy: merge units up to this many parameters (0: per block) */
  int memory_limit_mib;       /* refuse a job whose plan exceeds this (0: host's available) */
  /* optimizer and schedule */
  float lr, min_lr_frac;      /* peak lr; cosine decays to min_lr_frac * lr */
  int warmup_steps;
  float weight_decay, beta1, beta2, eps;
  float grad_clip;            /* max global grad norm (0: off) */
  /* output */
  char save[CONFIG_PATH_MAX]; /* weights file written at the end ("" : none) */
  char checkpoint_dir[CONFIG_PATH_MAX]; /* root of the job's checkpoints ("" : none) */
  int checkpoint_every;       /* steps between checkpoints (0: none) */
  int keep_checkpoints;       /* committed checkpoints kept (0: all) */
  int checkpoint_async;       /* 1: snapshot, then write on a thread */
  int auto_resume;            /* 1: no resume_from: checkpoint_dir's latest, when there is one */
  int sample_tokens;          /* tokens to generate after training (0: none) */
  char sample_prompt[256];    /* prompt text for byte-level models */
  float sample_temperature;
  /* bookkeeping */
  uint64_t given;             /* bit i: option i was set by config_set (a flag or a job file) */
  char adjusted[768];         /* what the last config_resolve changed of the defaults, and what
                                 config_check notes ("": nothing) */
} config_t;

void config_default(config_t *c);
/* The job's logits chunk in MiB: logits_chunk_mib, or where that is 0 the
 * device's default (GPT_LOGITS_CHUNK_MIB on cpu, GPT_LOGITS_CHUNK_MIB_GPU
 * on cuda). What the plan and the run both take. */
int config_logits_chunk_mib(const config_t *c);
/* The job's recompute level: recompute, or where that is -1 the device's
 * default (2 on cpu, whose memory the host shares; 0 on cuda). What the
 * plan and the run both take; plan_fit_recompute raises a -1 that does not
 * fit. */
int config_recompute(const config_t *c);
/* Sets one option from its text form. Error: names the key, the value and the fix. */
int config_set(config_t *c, const char *key, const char *value);
/* config_set of a key given under a section (a job file's [section], a
 * submitted option's): NULL or "" takes the key in any section; another
 * section than the key's own is an error naming the key and both sections. */
int config_set_in(config_t *c, const char *section, const char *key, const char *value);
/* Reads a job file (INI). Unknown keys are errors, with the file and line. */
int config_load_file(config_t *c, const char *path);
/* Resolves the model (preset, then explicit dimensions) into c->gpt and fits
 * the defaults the user did not set to it and to the run: seq_len becomes
 * the context when that is shorter, warmup_steps becomes steps when the run
 * is shorter; config_adjusted says so. An error only when the model cannot
 * be resolved (unknown preset, bad dimensions). Values it adjusts differ from
 * the defaults from then on, so a later call treats them as given. */
int config_resolve(config_t *c);
/* config_resolve, then the cross-field checks (a data file, seq_len <=
 * context, warmup_steps <= steps, strategy, mesh, precision). Call before
 * using c. */
int config_finish(config_t *c);
/* The same checks, every one (config_finish stops at the first): each
 * failure calls report(ctx, code) with its message in err_msg(), and the
 * first code is returned (FSDP_OK: none failed). With world > 0 the mesh is
 * checked against that many ranks too (shard_mesh_resolve); report NULL
 * stops at the first failure, as config_finish does. A model that does not
 * resolve is one failure, and the checks that need it are skipped. */
typedef void (*config_report_cb)(void *ctx, int code);
int config_check(config_t *c, int world, config_report_cb report, void *ctx);
/* One line on what the last config_resolve changed of the defaults, for the
 * user ("seq_len 64: ..."), or "" when it changed nothing. */
const char *config_adjusted(const config_t *c);
/* Appends one clause to what config_adjusted says ("; " between clauses):
 * for what fits a default after config_resolve (the coordinator's
 * admission). */
void config_note(config_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 when key was given explicitly (see above), 0 when it holds its default,
 * -1 when there is no such option. */
int config_is_given(const config_t *c, const char *key);
/* 1 when key was set through config_set (a flag, a job file line), 0 when it
 * holds a default (perhaps one config_resolve fitted), -1 when unknown. */
int config_is_set(const config_t *c, const char *key);
/* The option keys, for building a command line (i from 0 to config_num_opts()-1). */
int config_num_opts(void);
const char *config_opt_key(int i);
/* The section a key belongs in ("model", "train", ...), or NULL for no such key. */
const char *config_section_of(const char *key);
/* Prints every option with its help (for --help). */
void config_print_help(FILE *out);
/* Prints the effective options, one `key = value` line each (a job file).
 * After config_resolve the model's dimensions are the resolved ones. Those
 * and seq_len and warmup_steps, where not set through config_set, follow the
 * other options (the preset, the context, steps): they are written as
 * comments (`; key = value`), so the file read back with config_load_file
 * describes the same run, and read back with other flags (another model,
 * fewer steps) the run those flags would make. A value no
 * job file line can hold (ini_line_check: too long, a ';' that would start
 * a comment) is an error naming it, and nothing is written. */
int config_write(const config_t *c, FILE *out);

#endif

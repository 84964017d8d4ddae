/* config: a training job's options, one table for flags and job files.
 *
 * Every option has one key (the long flag without dashes, and the key in a job
 * file), a default and a check. Job files are INI (parsed with inih): `key =
 * value` lines, optionally under sections ([model], [data], [optim]...), which
 * only group them for the reader. A bad value gets an error naming the key,
 * the value, and what would be accepted. */
#ifndef FSDP_CONFIG_H
#define FSDP_CONFIG_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "gpt.h"

#define CONFIG_PATH_MAX 1024

typedef struct config {
  /* model */
  char model[64];             /* preset name, or "" for explicit dimensions */
  gpt_config_t dims;          /* explicit dimensions; 0 = take the preset's */
  gpt_config_t gpt;           /* final dimensions, set by config_finish */
  char init_from[CONFIG_PATH_MAX]; /* weights file to start from ("" : random init) */
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
  int activation_checkpointing; /* 1: keep block inputs only, recompute in backward */
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
  int sample_tokens;          /* tokens to generate after training (0: none) */
  char sample_prompt[256];    /* prompt text for byte-level models */
  float sample_temperature;
} config_t;

void config_default(config_t *c);
/* Sets one option from its text form. Error: names the key, the value and the fix. */
int config_set(config_t *c, const char *key, const char *value);
/* Reads a job file (INI). Unknown keys are errors, with the file and line. */
int config_load_file(config_t *c, const char *path);
/* Resolves the model (preset, then explicit dimensions) into c->gpt and runs
 * the cross-field checks (seq_len <= context, ...). Call before using c. */
int config_finish(config_t *c);
/* The option keys, for building a command line (i from 0 to config_num_opts()-1). */
int config_num_opts(void);
const char *config_opt_key(int i);
/* Prints every option with its help (for --help). */
void config_print_help(FILE *out);
/* Prints the effective options, one `key = value` line each (a job file). */
void config_write(const config_t *c, FILE *out);

#endif

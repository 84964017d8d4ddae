/* config: the option table of a training job, its parsing from flags and INI
 * job files (inih), its defaults fitted to the model and the run, and its
 * checks (see config.h). One table serves the flags, the job file, --help and
 * config_write, so an option is declared once. */
#include "daemon/job/config.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/ini_line.h"
#include "daemon/job/precision.h"
#include "daemon/job/shard.h"

typedef enum { CFG_INT, CFG_U64, CFG_FLOAT, CFG_DOUBLE, CFG_STR } config_type_t;

typedef struct config_opt {
  const char *key;
  const char *section; /* grouping in job files and --help */
  config_type_t type;
  size_t offset;
  size_t size;         /* CFG_STR: buffer size */
  double lo, hi;       /* accepted range for numbers */
  const char *help;
} config_opt_t;

#define OFF(f) offsetof(config_t, f)
#define STR(f) CFG_STR, OFF(f), sizeof(((config_t *)0)->f), 0, 0
static const config_opt_t config_opts[] = {
    {"model", "model", STR(model), "preset: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, tiny, small"},
    {"layers", "model", CFG_INT, OFF(dims.layers), 0, 0, 4096, "transformer blocks (0: the preset's)"},
    {"channels", "model", CFG_INT, OFF(dims.channels), 0, 0, 65536, "model width (0: the preset's)"},
    {"heads", "model", CFG_INT, OFF(dims.heads), 0, 0, 65536, "attention heads (0: the preset's)"},
    {"vocab", "model", CFG_INT, OFF(dims.vocab), 0, 0, 65536, "vocabulary size (0: the preset's)"},
    {"context", "model", CFG_INT, OFF(dims.context), 0, 0, 1 << 20, "maximum sequence length (0: the preset's)"},
    {"init_from", "model", STR(init_from), "weights to start from instead of a random init: an fsdpd weights file (save) or a safetensors file in Hugging Face's GPT-2 layout (fsdpctl export)"},
    {"resume_from", "model", STR(resume_from), "committed checkpoint to continue from (a step-N directory, or a checkpoint_dir: its latest): weights, AdamW state, step and data position, under any mesh and precision"},
    {"data", "data", STR(data), "token file (make one with fsdp-tokenize)"},
    {"eval_fraction", "data", CFG_DOUBLE, OFF(eval_fraction), 0, 0, 0.5, "share of tokens held out for evaluation, from the end of the file"},
    {"steps", "train", CFG_INT, OFF(steps), 0, 1, 1e9, "optimizer steps"},
    {"batch", "train", CFG_INT, OFF(batch), 0, 1, 1 << 20, "sequences per micro-batch"},
    {"seq_len", "train", CFG_INT, OFF(seq_len), 0, 1, 1 << 20, "tokens per sequence, at most the model's context (unless given, the default shrinks to the context)"},
    {"grad_accum", "train", CFG_INT, OFF(grad_accum), 0, 1, 1 << 20, "micro-batches per optimizer step"},
    {"seed", "train", CFG_U64, OFF(seed), 0, 0, 0, "seed of the initial weights and the data order"},
    {"eval_every", "train", CFG_INT, OFF(eval_every), 0, 0, 1e9, "steps between evaluations (0: only at the end)"},
    {"eval_batches", "train", CFG_INT, OFF(eval_batches), 0, 0, 1e9, "batches per evaluation (0: all held-out data)"},
    {"threads", "train", CFG_INT, OFF(threads), 0, 0, 4096, "CPU threads of device cpu's kernels (0: FSDP_THREADS, else all cores; ignored, with a note, on device cuda)"},
    {"device", "train", STR(device), "cpu (CPU devices: the ring and the CPU kernels) or cuda (one GPU per rank: the CUDA kernels and NCCL, from the CUDA plugin)"},
    {"tf32", "train", CFG_INT, OFF(tf32), 0, 0, 1, "device cuda: 1 lets fp32 matrix products use TF32 tensor cores (faster, 10-bit mantissa products); 0 keeps them fp32"},
    {"memory_limit_mib", "train", CFG_INT, OFF(memory_limit_mib), 0, 0, 1 << 30, "refuse a job planned above this many MiB per rank of what its device holds, a GPU's plan less the host memory it keeps (0: the rank's device memory: a GPU's own, as fsdpd's inventory or the GPU says; a CPU rank's share of the host's available memory); a GPU rank's never above what its GPU has free as it starts"},
    {"activation_checkpointing", "train", CFG_INT, OFF(activation_checkpointing), 0, 0, 1, "1: keep only block inputs, recompute each block in backward"},
    {"recompute", "train", CFG_INT, OFF(recompute), 0, -1, 2, "what no block keeps and backward computes again: 0 nothing, 1 GELU's output (a quarter of a block's activations), 2 GELU's and the layernorms' outputs (three eighths); -1: by device, 2 on cpu (host memory is shared), 0 on cuda (a GPU's memory is the job's: recomputing costs ~4% of a gpt2-124m step), raised to 1, then 2, with a note, where the job's plan would not fit the rank's memory"},
    {"logits_chunk_mib", "train", CFG_INT, OFF(logits_chunk_mib), 0, 0, 4096, "MiB of logits (rows x vocab floats) the LM head and its loss compute at once, in chunks of rows: the batch's logits never exist whole; larger chunks take more memory and fewer passes over the embedding (at least one row; at most 4096, so a chunk stays within 2^30 floats, as the kernels index it; 0: by device, 128 on cpu, 1024 on cuda, where each chunk reads the embedding twice at memory speed)"},
    {"strategy", "shard", STR(strategy), "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2 (ranks from fsdp-launch)"},
    {"mesh", "shard", STR(mesh), "replicas x shards, e.g. 2x4 (empty: every rank in one shard group)"},
    {"keep_unsharded_grads", "shard", CFG_INT, OFF(keep_unsharded_grads), 0, 0, 1, "1: with grad_accum, keep each unit's gradient unsharded and reduce once per step (more memory, fewer collectives); 0: reduce every micro-batch into the shard"},
    {"min_params", "shard", CFG_DOUBLE, OFF(min_params), 0, 0, 1e15, "wrap policy: merge neighbouring units until each holds this many parameters (0: one unit per block, plus the embeddings)"},
    {"offload", "shard", CFG_INT, OFF(offload), 0, 0, 1, "1: keep fp32 master weights, gradient shard and AdamW state in host memory, step on the CPU"},
    {"precision", "shard", STR(precision), "fp32; bf16-mixed (bf16 gather and compute, fp32 reduce and master weights); or bf16-true (bf16 storage, gather, reduce and AdamW state: half fp32's memory; updates below bf16 resolution are lost)"},
    {"lr", "optim", CFG_FLOAT, OFF(lr), 0, 0, 10, "peak learning rate, after a linear warmup and before a cosine decay (docs/MODEL.md)"},
    {"min_lr_frac", "optim", CFG_FLOAT, OFF(min_lr_frac), 0, 0, 1, "final lr as a fraction of lr (cosine decay)"},
    {"warmup_steps", "optim", CFG_INT, OFF(warmup_steps), 0, 0, 1e9, "linear warmup steps, at most steps (unless given, the default shrinks to steps)"},
    {"weight_decay", "optim", CFG_FLOAT, OFF(weight_decay), 0, 0, 10, "AdamW decoupled weight decay, on every 2-D tensor: the blocks' matrices and the wte and wpe embeddings; never on biases or LayerNorm parameters"},
    {"beta1", "optim", CFG_FLOAT, OFF(beta1), 0, 0, 0.999999, "AdamW beta1"},
    {"beta2", "optim", CFG_FLOAT, OFF(beta2), 0, 0, 0.999999, "AdamW beta2"},
    {"eps", "optim", CFG_FLOAT, OFF(eps), 0, 1e-30, 1, "AdamW epsilon"},
    {"grad_clip", "optim", CFG_FLOAT, OFF(grad_clip), 0, 0, 1e9, "clip the global gradient norm to this (0: off)"},
    {"save", "output", STR(save), "weights file written at the end"},
    {"checkpoint_dir", "output", STR(checkpoint_dir), "directory of the job's checkpoints: step-N/ holds a shard file per shard rank and, once committed, manifest.json (docs/FORMATS.md)"},
    {"checkpoint_every", "output", CFG_INT, OFF(checkpoint_every), 0, 0, 1e9, "steps between checkpoints (0: none); needs checkpoint_dir"},
    {"keep_checkpoints", "output", CFG_INT, OFF(keep_checkpoints), 0, 0, 1e6, "committed checkpoints kept, the newest (0: all); the latest is never removed"},
    {"checkpoint_async", "output", CFG_INT, OFF(checkpoint_async), 0, 0, 1, "1: copy the shard into a host snapshot (planned memory: ckpt_snapshot) and write it on a thread while training goes on; 0, or when the snapshot does not fit: write in place, the step waits"},
    {"auto_resume", "output", CFG_INT, OFF(auto_resume), 0, 0, 1, "1: start from the latest committed checkpoint in checkpoint_dir when there is one, and with resume_from when it is later than resume_from's (a restarted or requeued job goes on where it was)"},
    {"sample_tokens", "output", CFG_INT, OFF(sample_tokens), 0, 0, 1 << 20, "tokens to generate after training, to look at"},
    {"sample_prompt", "output", STR(sample_prompt), "prompt for the sample (byte-level models; in a job file, quote it to keep spaces at either end)"},
    {"sample_temperature", "output", CFG_FLOAT, OFF(sample_temperature), 0, 1e-3, 100, "sampling temperature"},
};
#undef STR
#undef OFF
#define CONFIG_NUM_OPTS (int)(sizeof config_opts / sizeof config_opts[0])
_Static_assert(sizeof config_opts / sizeof config_opts[0] <= 64,
               "config_t.given holds one bit per option");

void config_default(config_t *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->model, sizeof c->model, "small");
  c->eval_fraction = 0.1;
  c->steps = 100;
  c->batch = 4;
  c->seq_len = 256;
  c->grad_accum = 1;
  c->auto_resume = 1;
  c->keep_checkpoints = 3;
  c->checkpoint_async = 1;
  c->recompute = -1; /* by device: config_recompute */
  c->logits_chunk_mib = 0; /* by device: config_logits_chunk_mib */
  c->seed = 1337;
  c->eval_batches = 8;
  c->lr = 6e-4f;
  c->min_lr_frac = 0.1f;
  c->warmup_steps = 10;
  c->weight_decay = 0.1f;
  c->beta1 = 0.9f;
  c->beta2 = 0.95f;
  c->eps = 1e-8f;
  c->grad_clip = 1.0f;
  snprintf(c->sample_prompt, sizeof c->sample_prompt, "The ");
  snprintf(c->strategy, sizeof c->strategy, "FULL_SHARD");
  snprintf(c->precision, sizeof c->precision, "fp32");
  snprintf(c->device, sizeof c->device, "cpu");
  c->sample_temperature = 0.8f;
}

int config_num_opts(void) { return CONFIG_NUM_OPTS; }
const char *config_opt_key(int i) { return config_opts[i].key; }

static const config_opt_t *config_find(const char *key) {
  for (int i = 0; i < CONFIG_NUM_OPTS; i++)
    if (!strcmp(config_opts[i].key, key)) return &config_opts[i];
  return NULL;
}

const char *config_section_of(const char *key) {
  const config_opt_t *o = config_find(key);
  return o ? o->section : NULL;
}

static uint64_t config_bit(const config_opt_t *o) { return 1ull << (o - config_opts); }

/* The options that say which model it is: setting one makes c->gpt stale. */
static int config_opt_is_dim(const config_opt_t *o) {
  return o->offset >= offsetof(config_t, dims) &&
         o->offset < offsetof(config_t, dims) + sizeof(gpt_config_t);
}

/* The options whose default follows the others: the model's dimensions (the
 * preset's) and the defaults config_resolve fits (seq_len to the context,
 * warmup_steps to steps). config_write writes them as comments unless set, so
 * a printed job file read back with other flags fits them again. */
static int config_opt_derived(const config_opt_t *o) {
  return config_opt_is_dim(o) || o->offset == offsetof(config_t, seq_len) ||
         o->offset == offsetof(config_t, warmup_steps);
}

/* Explicit: set through config_set, or (code that writes fields directly)
 * holding something other than the default. */
static int config_given(const config_t *c, const config_opt_t *o) {
  if (c->given & config_bit(o)) return 1;
  config_t d;
  config_default(&d);
  const char *v = (const char *)c + o->offset, *dv = (const char *)&d + o->offset;
  switch (o->type) {
  case CFG_INT: return memcmp(v, dv, sizeof(int)) != 0;
  case CFG_U64: return memcmp(v, dv, sizeof(uint64_t)) != 0;
  case CFG_FLOAT: return memcmp(v, dv, sizeof(float)) != 0;
  case CFG_DOUBLE: return memcmp(v, dv, sizeof(double)) != 0;
  case CFG_STR: break;
  }
  return strcmp(v, dv) != 0;
}

int config_is_given(const config_t *c, const char *key) {
  const config_opt_t *o = config_find(key);
  return o ? config_given(c, o) : -1;
}

int config_is_set(const config_t *c, const char *key) {
  const config_opt_t *o = config_find(key);
  return o ? (c->given & config_bit(o)) != 0 : -1;
}

/* Stores value into o's field of c; on error c is unchanged. */
static int config_parse(config_t *c, const config_opt_t *o, const char *key, const char *value) {
  char *field = (char *)c + o->offset;
  if (o->type == CFG_STR) {
    if (strlen(value) >= o->size)
      return err_set(FSDP_EINVAL, "%s: value is %zu characters long; the limit is %zu", key,
                     strlen(value), o->size - 1);
    memcpy(field, value, strlen(value) + 1);
    return FSDP_OK;
  }
  char *end;
  errno = 0;
  if (isspace((unsigned char)value[0])) /* strtoull would skip it, and then a '-' */
    return err_set(FSDP_EINVAL, "%s: \"%s\" starts with a space; give the number alone", key,
                   value);
  /* One rule for every integer option: decimal digits, a '-' before them
   * where the range has negatives; leading zeros are decimal too (seed once
   * took 010 as octal 8 and 0x10 as 16, while steps took 1e3 as 1000). */
  const int integer = o->type == CFG_INT || o->type == CFG_U64;
  const size_t sign = value[0] == '-', digits = strspn(value + sign, "0123456789");
  if (integer && (!digits || value[sign + digits]))
    return err_set(FSDP_EINVAL, "%s: \"%s\" is not a whole number in decimal digits; write it "
                   "as one (1000, not 1e3, 0x3e8 or 1000.0)", key, value);
  if (!integer && (!strncasecmp(value + sign, "0x", 2) ||
                   (value[0] == '+' && !strncasecmp(value + 1, "0x", 2))))
    return err_set(FSDP_EINVAL, "%s: \"%s\" is hexadecimal; give a decimal number (such as "
                   "0.001 or 1e-3)", key, value);
  if (o->type == CFG_U64) {
    unsigned long long u = strtoull(value, &end, 10);
    if (errno || sign)
      return err_set(FSDP_EINVAL, "%s: %s is out of range; give a value from 0 to %llu (%s)", key,
                     value, ULLONG_MAX, o->help);
    *(uint64_t *)field = u;
    return FSDP_OK;
  }
  double v;
  if (integer) { /* digits only, so strtoll reads them all */
    const long long i = strtoll(value, &end, 10);
    v = errno ? (sign ? -HUGE_VAL : HUGE_VAL) : (double)i; /* past long long: out of range */
  } else {
    v = strtod(value, &end);
    if (errno || end == value || *end || !isfinite(v))
      return err_set(FSDP_EINVAL, "%s: \"%s\" is not a number", key, value);
  }
  if (v < o->lo || v > o->hi) /* whole numbers as such: 1048576, not 1.04858e+06 */
    return err_set(FSDP_EINVAL, "%s: %s is out of range; give a value from %.*g to %.*g (%s)", key,
                   value, o->type == CFG_INT ? 17 : 6, o->lo, o->type == CFG_INT ? 17 : 6, o->hi,
                   o->help);
  if (o->type == CFG_FLOAT && v != 0 && (float)v == 0)
    return err_set(FSDP_EINVAL, "%s: %s is below the smallest float (%g) and would be 0; give 0 "
                   "or a larger value", key, value, (double)FLT_TRUE_MIN);
  switch (o->type) {
  case CFG_INT: *(int *)field = (int)v; break;
  case CFG_FLOAT: *(float *)field = (float)v; break;
  case CFG_DOUBLE: *(double *)field = v; break;
  default: break;
  }
  return FSDP_OK;
}

int config_logits_chunk_mib(const config_t *c) {
  if (c->logits_chunk_mib > 0) return c->logits_chunk_mib;
  return strcmp(c->device, "cuda") ? GPT_LOGITS_CHUNK_MIB : GPT_LOGITS_CHUNK_MIB_GPU;
}

int config_recompute(const config_t *c) {
  if (c->recompute >= 0) return c->recompute;
  return strcmp(c->device, "cuda") ? 2 : 0;
}

int config_set(config_t *c, const char *key, const char *value) {
  const config_opt_t *o = config_find(key);
  if (!o) return err_set(FSDP_EINVAL, "unknown option \"%s\"; see --help for the list", key);
  int rc = config_parse(c, o, key, value);
  if (rc) return rc;
  c->given |= config_bit(o);
  if (config_opt_is_dim(o) || o->offset == offsetof(config_t, model))
    memset(&c->gpt, 0, sizeof c->gpt); /* resolved for another model */
  return FSDP_OK;
}

typedef struct config_ini_ctx {
  config_t *c;
  const char *path;
  int rc;
  uint64_t seen; /* config_bit of the keys the file set so far */
} config_ini_ctx_t;

int config_set_in(config_t *c, const char *section, const char *key, const char *value) {
  const config_opt_t *o = config_find(key);
  if (o && section && section[0] && strcmp(section, o->section))
    return err_set(FSDP_EINVAL, "%s belongs in section [%s], not [%s]", key, o->section, section);
  return config_set(c, key, value);
}

/* Debian's inih passes no line number to handlers: errors name the file and key. */
static int config_ini_cb(void *user, const char *section, const char *name, const char *value) {
  config_ini_ctx_t *x = user;
  if (x->rc) return 0;
  /* inih trims the spaces around a value: a quoted value keeps them (config_write
   * quotes a string that starts or ends with a space, like the default prompt) */
  char unq[CONFIG_PATH_MAX];
  const char *v = ini_line_unquote(value, unq, sizeof unq);
  const config_opt_t *o = config_find(name);
  if (o && (x->seen & config_bit(o))) { /* which one was meant? the last silently won */
    x->rc = err_set(FSDP_EINVAL, "job file %s: %s is set twice; keep one line for it", x->path,
                    name);
    return 0;
  }
  if (o) x->seen |= config_bit(o);
  int rc = config_set_in(x->c, section, name, v ? v : value);
  if (rc) {
    x->rc = err_wrap(rc, "job file %s", x->path);
    return 0;
  }
  return 1;
}

int config_load_file(config_t *c, const char *path) {
  /* the type checked before anything waits: fopen of a FIFO blocked until a
   * writer came, forever */
  int fd, rc = file_open_regular_named(path, O_RDONLY, 0, &fd);
  if (rc == FSDP_EFORMAT)
    return err_set(FSDP_EINVAL, "job file %s: not a regular file (a FIFO, a directory or a "
                   "device); give the path of a job file (fsdp-train --print-config writes one)",
                   path);
  if (rc) return err_wrap(rc, "job file");
  FILE *f = fdopen(fd, "r");
  if (!f) {
    const int e = errno;
    close(fd);
    return err_set_errno(FSDP_ENOMEM, e, "job file %s", path);
  }
  config_ini_ctx_t x = {c, path, FSDP_OK, 0};
  int too_long;
  int line = ini_line_parse(f, NULL, config_ini_cb, &x, &too_long);
  if (ferror(f) && !x.rc && line == 0) line = -1; /* a read error is not the end of the file */
  fclose(f);
  if (x.rc) return x.rc;
  if (too_long)
    return err_set(FSDP_EINVAL, "%s:%d: longer than %d characters, the most a job file line may "
                   "hold (Debian's libinih): shorten the value", path, line, ini_line_max());
  if (line > 0)
    return err_set(FSDP_EINVAL, "%s:%d: not a `key = value` line or a [section] header", path,
                   line);
  if (line < 0) return err_set(FSDP_EIO, "job file %s: could not be read", path);
  return FSDP_OK;
}

void config_note(config_t *c, const char *fmt, ...) {
  size_t n = strlen(c->adjusted);
  if (n && n + 2 < sizeof c->adjusted) n += (size_t)snprintf(c->adjusted + n, sizeof c->adjusted - n, "; ");
  va_list ap;
  va_start(ap, fmt);
  if (n < sizeof c->adjusted) vsnprintf(c->adjusted + n, sizeof c->adjusted - n, fmt, ap);
  va_end(ap);
}

int config_resolve(config_t *c) {
  gpt_config_t g = {0};
  int rc;
  c->adjusted[0] = 0;
  memset(&c->gpt, 0, sizeof c->gpt);
  if (c->model[0] && (rc = gpt_config_preset(&g, c->model))) return rc;
  if (c->dims.layers) g.layers = c->dims.layers;
  if (c->dims.channels) g.channels = c->dims.channels;
  if (c->dims.heads) g.heads = c->dims.heads;
  if (c->dims.vocab) g.vocab = c->dims.vocab;
  if (c->dims.context) g.context = c->dims.context;
  if (!c->model[0] && (!g.layers || !g.channels || !g.heads || !g.vocab || !g.context))
    return err_set(FSDP_EINVAL, "model: no preset given, so layers, channels, heads, vocab and "
                   "context must all be set (or set model to a preset)");
  if ((rc = gpt_config_validate(&g))) return rc;
  c->gpt = g;
  /* A default that does not fit is the default's fault, not the user's: fit
   * it and say so. A value the user gave is left for config_finish to refuse. */
  if (c->seq_len > g.context && !config_given(c, config_find("seq_len"))) {
    config_note(c, "seq_len = %d (the default %d is longer than the %s model's context)",
                g.context, c->seq_len, c->model[0] ? c->model : "custom");
    c->seq_len = g.context;
  }
  if (c->warmup_steps > c->steps && !config_given(c, config_find("warmup_steps"))) {
    config_note(c, "warmup_steps = %d (the default %d is longer than the run's %d steps)",
                c->steps, c->warmup_steps, c->steps);
    c->warmup_steps = c->steps;
  }
  return FSDP_OK;
}

const char *config_adjusted(const config_t *c) { return c->adjusted; }

/* One failed check: stop at it (no report), or report it and go on. */
#define CONFIG_CHECK(expr)                       \
  do {                                           \
    int rc_ = (expr);                            \
    if (rc_) {                                   \
      if (!first) first = rc_;                   \
      if (!report) return rc_;                   \
      report(ctx, rc_);                          \
    }                                            \
  } while (0)

int config_check(config_t *c, int world, config_report_cb report, void *ctx) {
  int first = FSDP_OK;
  /* the model first: seq_len and warmup_steps are checked against what
   * config_resolve fitted, so a model that does not resolve skips them */
  const int resolved = config_resolve(c);
  CONFIG_CHECK(resolved);
  CONFIG_CHECK(c->data[0] ? FSDP_OK
               : err_set(FSDP_EINVAL, "data: no token file given; set data = PATH (make one "
                         "from text with fsdp-tokenize)"));
  if (!resolved && c->seq_len > c->gpt.context)
    CONFIG_CHECK(err_set(FSDP_EINVAL, "seq_len: %d is longer than the model's context %d; "
                         "shorten seq_len or raise context", c->seq_len, c->gpt.context));
  shard_strategy_t st;
  const int strategy = shard_strategy_parse(c->strategy, &st);
  CONFIG_CHECK(strategy);
  shard_mesh_t m;
  if (!strategy && world > 0) CONFIG_CHECK(shard_mesh_resolve(c->strategy, c->mesh, world, &m, NULL, 0));
  else if (!strategy && c->mesh[0]) CONFIG_CHECK(shard_mesh_parse(c->mesh, st, &m));
  /* said, not refused: what runs is what was asked, only not what was meant */
  if (!strategy && (st == SHARD_HYBRID_SHARD || st == SHARD_HYBRID_SHARD_ZERO2) && !c->mesh[0] && world > 1)
    config_note(c, "strategy = %s without a mesh: one replica of all %d ranks, the same as %s; "
                "for shard groups within nodes and replicas across them set mesh = RxS (e.g. "
                "%dx%d)", c->strategy, world, st == SHARD_HYBRID_SHARD ? "FULL_SHARD" : "SHARD_GRAD_OP",
                world % 2 ? world : world / 2, world % 2 ? 1 : 2);
  if (c->min_params != floor(c->min_params))
    CONFIG_CHECK(err_set(FSDP_EINVAL, "min_params: %g is not a whole number of parameters; give "
                         "one (e.g. %.0f)", c->min_params, ceil(c->min_params)));
  else if (!resolved && c->min_params > (double)gpt_config_num_params(&c->gpt))
    config_note(c, "min_params = %.0f is more than the model's %zu parameters: one unit, the "
                "whole model gathered at once on every rank", c->min_params,
                gpt_config_num_params(&c->gpt));
  if (c->keep_unsharded_grads && c->grad_accum == 1)
    config_note(c, "keep_unsharded_grads = 1 does nothing with grad_accum 1: there is one "
                "micro-batch to reduce (drop it, or raise grad_accum)");
  precision_t prec;
  CONFIG_CHECK(precision_parse(c->precision, &prec));
  if (strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
    CONFIG_CHECK(err_set(FSDP_EINVAL, "device: \"%s\" is not a kind of device; use cpu or cuda",
                         c->device));
  if (c->offload && !strcmp(c->device, "cuda"))
    CONFIG_CHECK(err_set(FSDP_EINVAL, "offload: 1 is not supported on device cuda yet (the GPU "
                         "runtime keeps the shard in GPU memory and steps there); drop offload, "
                         "or use more GPUs (a larger mesh) to fit"));
  if (c->tf32 && strcmp(c->device, "cuda"))
    CONFIG_CHECK(err_set(FSDP_EINVAL, "tf32: 1 asks for GPU tensor cores, but device is %s; set "
                         "device = cuda or drop tf32", c->device));
  /* said, not refused: a job stored with it before must still resolve */
  if (c->threads && !strcmp(c->device, "cuda"))
    config_note(c, "threads = %d is ignored: it sets device cpu's kernel threads, and device cuda "
                "runs its kernels on the GPU (drop it)", c->threads);
  if (!resolved && c->warmup_steps > c->steps)
    CONFIG_CHECK(err_set(FSDP_EINVAL, "warmup_steps: %d is more than steps %d; warmup must end "
                         "before training does: lower warmup_steps or raise steps",
                         c->warmup_steps, c->steps));
  if (c->checkpoint_every && !c->checkpoint_dir[0])
    CONFIG_CHECK(err_set(FSDP_EINVAL, "checkpoint_every: %d, but no checkpoint_dir; set "
                         "checkpoint_dir = DIR (an existing directory)", c->checkpoint_every));
  if (c->resume_from[0] && c->init_from[0])
    CONFIG_CHECK(err_set(FSDP_EINVAL, "resume_from: given with init_from; a checkpoint holds the "
                         "weights already: drop init_from"));
  return first;
}
#undef CONFIG_CHECK

int config_finish(config_t *c) { return config_check(c, 0, NULL, NULL); }

/* The shortest %g text that reads back as v (as a float when single): a
 * printed job file runs the same job (%g's 6 digits turned lr 0.00123456789
 * into 0.00123457, and min_params 123456789 into 1.23457e+08). */
static void config_print_real(FILE *out, double v, int single) {
  char buf[64];
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, v);
    const double back = strtod(buf, NULL);
    if (single ? (float)back == (float)v : back == v) break;
  }
  fputs(buf, out);
}

/* An option's value as text; quote: a string quoted where spaces at its
 * ends would not show (--help), else as it is (config_write quotes for the
 * job file, through ini_line_write). */
static void config_print_value(const config_t *c, const config_opt_t *o, FILE *out, int quote) {
  const char *field = (const char *)c + o->offset;
  /* once resolved, the model's dimensions are the ones the run uses */
  if (config_opt_is_dim(o) && c->gpt.layers)
    field += offsetof(config_t, gpt) - offsetof(config_t, dims);
  switch (o->type) {
  case CFG_INT: fprintf(out, "%d", *(const int *)field); break;
  case CFG_U64: fprintf(out, "%llu", (unsigned long long)*(const uint64_t *)field); break;
  case CFG_FLOAT: config_print_real(out, *(const float *)field, 1); break;
  case CFG_DOUBLE: config_print_real(out, *(const double *)field, 0); break;
  case CFG_STR: {
    size_t n = strlen(field);
    quote = quote && n && (isspace((unsigned char)field[0]) || isspace((unsigned char)field[n - 1]));
    fprintf(out, quote ? "\"%s\"" : "%s", field);
    break;
  }
  }
}

void config_print_help(FILE *out) {
  config_t d;
  config_default(&d);
  const char *sec = "";
  for (int i = 0; i < CONFIG_NUM_OPTS; i++) {
    const config_opt_t *o = &config_opts[i];
    if (strcmp(sec, o->section)) fprintf(out, "  [%s]\n", sec = o->section);
    fprintf(out, "    --%-14s %s (default: ", o->key, o->help);
    config_print_value(&d, o, out, 1);
    fprintf(out, ")\n");
  }
}

int config_write(const config_t *c, FILE *out) {
  /* each line one that reads back as written (ini_line_write), checked all
   * before any is written: a job file is whole or not written */
  char val[CONFIG_NUM_OPTS][CONFIG_PATH_MAX + 64];
  for (int i = 0; i < CONFIG_NUM_OPTS; i++) {
    val[i][0] = 0; /* fmemopen leaves an empty buffer as it found it */
    FILE *f = fmemopen(val[i], sizeof val[i], "w");
    if (!f) return err_set(FSDP_ENOMEM, "out of memory");
    config_print_value(c, &config_opts[i], f, 0);
    fclose(f);
    int rc = ini_line_check(config_opts[i].section, config_opts[i].key, val[i]);
    if (rc) return rc;
  }
  fprintf(out, "; a line that starts with \"; \" holds a value that follows the other options "
          "(the model's dimensions, a default fitted to the model or the run): it is not set "
          "here; delete the \"; \" to set it\n");
  const char *sec = "";
  for (int i = 0; i < CONFIG_NUM_OPTS; i++) {
    const config_opt_t *o = &config_opts[i];
    if (strcmp(sec, o->section)) fprintf(out, "\n[%s]\n", sec = o->section);
    if (config_opt_derived(o) && !(c->given & config_bit(o))) fputs("; ", out);
    ini_line_write(out, o->section, o->key, val[i]);
  }
  return FSDP_OK;
}

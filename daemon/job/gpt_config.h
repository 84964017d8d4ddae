/* gpt_config: the shape of a GPT model as numbers, with no model behind it:
 * the dimensions, the presets, their checks, the parameter count, where each
 * unit lies in the flat buffer and how many bytes of activations a (B, T)
 * takes. The model (daemon/train/gpt.c) is built from these; the memory plan
 * and the coordinator's admission use them without linking the model, so the
 * numbers they predict are the model's own, not a copy. docs/MODEL.md has
 * the math.
 *
 * Named tensors: the table of every parameter tensor (name, place, shape,
 * decay, initialisation) is here too, so a checkpoint can be exported
 * tensor by tensor by the coordinator, which links no model. */
#ifndef FSDP_GPT_CONFIG_H
#define FSDP_GPT_CONFIG_H

#include <stddef.h>

typedef struct gpt_config {
  int layers;   /* L: transformer blocks */
  int channels; /* C: model width; a multiple of heads */
  int heads;    /* NH: attention heads */
  int vocab;    /* V: token ids are 0..V-1 */
  int context;  /* maximum sequence length (rows of wpe) */
} gpt_config_t;

/* Fills cfg from a preset name: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, and
 * the small test presets tiny (L2 C64 NH4 V256 T64) and small (L4 C256 NH4 V256 T256).
 * Unknown name: FSDP_EINVAL with the list of names. */
int gpt_config_preset(gpt_config_t *cfg, const char *name);
/* Prints the preset names, comma-separated, into buf. */
void gpt_config_preset_names(char *buf, size_t len);
/* Checks every dimension; the error names the field (model.heads, ...) and the fix. */
int gpt_config_validate(const gpt_config_t *cfg);
/* Parameter count of a config (no padding). */
size_t gpt_config_num_params(const gpt_config_t *cfg);

typedef struct gpt_unit {
  size_t offset, numel; /* range in the flat buffer */
} gpt_unit_t;

/* One named parameter tensor inside the flat buffer. */
typedef struct gpt_tensor {
  char name[32];    /* "wte", "h.3.attn.qkv.w", ... */
  size_t offset;    /* in elements, into the flat buffer */
  size_t numel;
  int rows, cols;   /* shape: (rows, cols) for matrices, (1, n) for vectors */
  int decay;        /* 1: weight decay applies (matrices and embeddings) */
  int unit;         /* which unit holds it */
  float init_std;   /* 0: constant init (init_value) */
  float init_value;
} gpt_tensor_t;

/* The tensor table of a config, in flat-buffer (unit) order: returns the
 * count and writes up to max entries into t (t NULL: only counts). The names
 * are the layout's own ("wte", "h.3.attn.qkv.w"); docs/MODEL.md lists them. */
int gpt_config_tensors(const gpt_config_t *cfg, gpt_tensor_t *t, int max);

/* Unit u (0: embeddings and final norm; 1+l: block l) of a config, without a model. */
gpt_unit_t gpt_config_unit(const gpt_config_t *cfg, int u);

/* Floats between two rows of the logits: vocab rounded up to a multiple of
 * GPT_LOGITS_ALIGN (256 bytes: 50257 -> 50304), so every row starts as
 * aligned as the first, as a GPU's tensor-core products and vector loads
 * want (kernels/kern.h, KERN_LD_ALIGN). The padding columns are never read
 * or written. */
#define GPT_LOGITS_ALIGN 64
int gpt_config_logits_ld(const gpt_config_t *cfg);

/* The logits never exist for all B*T rows at once: the LM head and its
 * cross-entropy run over the rows in chunks of this many (what chunk_mib
 * MiB of logits hold, 0: GPT_LOGITS_CHUNK_MIB, the job option
 * logits_chunk_mib's default; at least one row, and a multiple of 128 rows
 * when above: whole tiles of a GPU's products), each chunk's loss gradient
 * and backward taken before the next chunk's logits overwrite it.
 * gpt2-124m: 640 rows (123 MiB) instead of B*T (1.6 GiB at 8 x 1024). */
#define GPT_LOGITS_CHUNK_MIB 128
/* A GPU job's default (config_logits_chunk_mib): each chunk rounds the
 * embedding (V x C) to bf16 for its forward and again for its backward and
 * reads and writes its fp32 gradient, 0.8 GB a chunk at gpt2-124m, which
 * 128 MiB chunks (26 at B=16, T=1024) repeat about 20 GB a step; 1024 MiB
 * take 4 chunks, for 0.9 GB more memory. */
#define GPT_LOGITS_CHUNK_MIB_GPU 1024
int gpt_config_logits_rows(const gpt_config_t *cfg, int chunk_mib);

/* What a model keeps for backward, as gpt_config_act_bytes' flags: with
 * GPT_ACT_CHECKPOINT each block keeps only its output (activation
 * checkpointing); with GPT_ACT_RECOMPUTE_GELU no block keeps GELU's output
 * (4 x C floats a token), with GPT_ACT_RECOMPUTE_LN nor its two layernorms'
 * outputs (2 x C; their means and reciprocal deviations stay): forward
 * writes them into backward's scratch for the product that reads them, and
 * backward computes them again there, as llm.c's recompute = 1 and 2 do. */
#define GPT_ACT_CHECKPOINT 1
#define GPT_ACT_RECOMPUTE_GELU 2
#define GPT_ACT_RECOMPUTE_LN 4
/* GPT_ACT_BF16: the activations only matrix products read (the layernorms'
 * outputs, GELU's) are kept in bf16, half the bytes: where the kernel
 * backend offers it (kern.h's bf16 activations: a GPU's bf16 job) and
 * gpt_config_acts_bf16_fits. */
#define GPT_ACT_BF16 8
/* GPT_ACT_BF16_QKV (with GPT_ACT_BF16): qkv and the attention's output kept
 * in bf16 too, where the backend's attention reads and writes them so
 * (kern.h's attention_bf16_fits). */
#define GPT_ACT_BF16_QKV 16
/* GPT_ACT_BF16_FCH (with GPT_ACT_BF16): the fc product's output (fch, 4 x C
 * a token) kept in bf16 too, where the backend's GELU reads it so (kern.h's
 * gelu_fwd_bf16in). */
#define GPT_ACT_BF16_FCH 32
/* The model's rows suit bf16 activations: C a multiple of 8, so every row
 * of them is 16 bytes aligned (what the products' tensor-core kernels read
 * without packing) and each takes a whole number of floats' room. */
static inline int gpt_config_acts_bf16_fits(const gpt_config_t *cfg) {
  return cfg->channels % 8 == 0;
}
/* Floats one region of n floats takes in the activations' block under
 * flags: with GPT_ACT_BF16 each region starts 16 bytes aligned (the
 * products read bf16 rows in place, and the tensor-core attention copies
 * 16-byte runs of qkv), so the regions of N or of the attention's saved
 * floats, any number, are padded to 4 floats; else n. gpt.c lays the block
 * out and gpt_config_act_bytes counts it with this one rule. */
static inline size_t gpt_config_act_region(size_t n, int flags) {
  return flags & GPT_ACT_BF16 ? (n + 3) & ~(size_t)3 : n;
}
/* The flags of a job option recompute = level (0 none, 1 GELU, 2 GELU and
 * the layernorms). */
static inline int gpt_act_recompute_flags(int level) {
  return (level >= 1 ? GPT_ACT_RECOMPUTE_GELU : 0) | (level >= 2 ? GPT_ACT_RECOMPUTE_LN : 0);
}

/* Bytes of activations (and their gradients) the model holds for (B, T) under
 * flags (GPT_ACT_*): what gpt.c allocates for them. att is
 * the floats one layer's attention keeps for backward, the kernel backend's
 * to say (kern_backend_t's attention_saved: B*NH*T log-sum-exps on the CPU
 * and in the GPU's fused kernel, B*NH*T*T probabilities in its products'
 * path); lrows the logits' chunk
 * (gpt_config_logits_rows). The attention scratch is the backend's own
 * (attention_scratch) and not counted here. */
size_t gpt_config_act_bytes(const gpt_config_t *cfg, int B, int T, int flags, size_t att,
                            int lrows);

#endif

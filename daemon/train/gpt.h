/* gpt: a GPT-2 style decoder (pre-LN, learned positions, tied embeddings) on a
 * kern backend: its shapes, parameter layout, initialisation, forward and backward.
 * docs/MODEL.md states its math (GELU, LayerNorm, loss, initialisation).
 *
 * Parameters live in one flat fp32 buffer ordered by UNIT: unit 0 holds the
 * embeddings and the final norm (wte, wpe, lnf.w, lnf.b), unit 1+l holds every
 * parameter of transformer block l. A unit is one contiguous range: it is what
 * the sharded runtime gathers and frees as one. The gradients use the same layout.
 * Activations are allocated for a (B, T) on first use and reused after.
 * The shape as numbers (gpt_config_t, presets, unit ranges, activation
 * bytes) is daemon/job/gpt_config.h, which the memory plan uses without this.
 *
 * Parameters, gradients and activations live on the backend's device: the
 * pointers gpt_params, gpt_grads and gpt_logits return are device pointers
 * (host pointers on the CPU backend, which tests rely on). */
#ifndef FSDP_GPT_H
#define FSDP_GPT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/job/gpt_config.h"
#include "kernels/kern.h"

typedef struct gpt gpt_t;

int gpt_create(gpt_t **out, const gpt_config_t *cfg, const kern_backend_t *be);
/* A model without flat parameter and gradient buffers (gpt_params and
 * gpt_grads return NULL): its units come from hooks (gpt_set_hooks), as in
 * sharded training, where no rank ever holds the whole model. */
int gpt_create_shell(gpt_t **out, const gpt_config_t *cfg, const kern_backend_t *be);
void gpt_destroy(gpt_t *g);

const gpt_config_t *gpt_get_config(const gpt_t *g);
const kern_backend_t *gpt_backend(const gpt_t *g);
size_t gpt_num_params(const gpt_t *g);
int gpt_num_tensors(const gpt_t *g);
const gpt_tensor_t *gpt_tensor(const gpt_t *g, int i);
/* Index of the tensor named name, or -1. */
int gpt_find_tensor(const gpt_t *g, const char *name);
int gpt_num_units(const gpt_t *g);
gpt_unit_t gpt_unit(const gpt_t *g, int u);
float *gpt_params(gpt_t *g);
float *gpt_grads(gpt_t *g);

/* Fills elements [begin, end) of the flat parameter buffer of a model with this
 * config, writing them to dst[0 .. end-begin). Each value is a pure function of
 * (seed, global element index): any split of the range gives the same bytes. */
void gpt_init_range(const gpt_config_t *cfg, uint64_t seed, size_t begin, size_t end, float *dst);
/* The whole model: gpt_init_range over [0, num_params), staged through the
 * host in chunks. FSDP_ENOMEM when the staging buffer cannot be had. */
int gpt_init_weights(gpt_t *g, uint64_t seed);

/* Weights file (see docs/FORMATS.md): int32 header[256] = { magic GPT_WEIGHTS_MAGIC,
 * version 1, layers, channels, heads, vocab, context, 0... } then num_params
 * little-endian fp32 in the flat (unit) order. Saving writes a temporary file
 * and renames it, so a crash never leaves a half-written file under the name. */
#define GPT_WEIGHTS_MAGIC 20261122
int gpt_save(const gpt_t *g, const char *path);
/* Creates a model from a weights file (config read from its header). */
int gpt_load(gpt_t **out, const char *path, const kern_backend_t *be);
/* Opens a weights file and checks its header and size; *cfg gets its model.
 * The parameters start at byte GPT_WEIGHTS_HEADER_BYTES. */
#define GPT_WEIGHTS_HEADER_BYTES 1024
int gpt_weights_open(const char *path, gpt_config_t *cfg, FILE **out);
/* FSDP_OK when a file's model f is the wanted one; else an error naming both. */
int gpt_weights_match(const gpt_config_t *f, const gpt_config_t *want, const char *path);
/* The header of a weights file for a model of config c. */
void gpt_weights_header(const gpt_config_t *c, int32_t hdr[256]);

/* Forward pass on inputs (B,T) of token ids. With targets (B,T) non-NULL, the
 * mean cross-entropy goes to *loss (the LM head runs over the rows in chunks
 * of gpt_config_logits_rows: the B*T*V logits never exist at once); with
 * targets NULL the logits of the last rows (all B*T rows when they fit one
 * chunk) are kept instead (gpt_copy_logits) and *loss is untouched. Checks
 * B > 0, 0 < T <= context and every id < vocab; the error names the field or
 * the position of the bad token. */
int gpt_forward(gpt_t *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                float *loss);
/* gpt_forward with targets for a step that goes on to gpt_backward(g,
 * dloss_scale): the loss's gradient is taken with the loss, in the
 * cross-entropy's passes (crossentropy_fwd_bwd: one pass less over the
 * logits), the same bits as gpt_forward and then gpt_backward. When the rows
 * take more than one chunk of logits, each chunk's LM-head backward runs here
 * too: its share of wte's gradient is accumulated now (grads(0) is asked for
 * inside the forward), so gradients are zeroed before this call, never
 * between it and gpt_backward. */
int gpt_forward_train(gpt_t *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                      float dloss_scale, float *loss);
/* Backward of the last forward (which must have had targets). Accumulates into
 * the gradients: the loss gradient is scaled by dloss_scale (1 for one
 * micro-batch, 1/k to average over k micro-batches; after gpt_forward_train,
 * the scale it was given, else an error). */
int gpt_backward(gpt_t *g, float dloss_scale);
void gpt_zero_grad(gpt_t *g);
/* Logits (B,T,V) of the last forward without targets (a device pointer), rows
 * gpt_logits_ld floats apart (vocab padded to 256 bytes, gpt_config.h); NULL
 * when B*T rows are more than one chunk (gpt_copy_logits has the last rows). */
const float *gpt_logits(const gpt_t *g);
int gpt_logits_ld(const gpt_t *g);
/* Copies row row (of B*T) of those logits, V floats, into host memory out; an
 * error naming the rows kept for a row before the last chunk. */
int gpt_copy_logits(const gpt_t *g, int row, float *out);
/* Rows of logits per chunk (0: gpt_config_logits_rows' default): train.c
 * sets the job's (logits_chunk_mib, what the memory plan counts); tests and
 * benchmarks cut a small batch into chunks. */
void gpt_set_logits_rows(gpt_t *g, int rows);

/* Activation checkpointing per block: forward keeps only each block's output;
 * backward recomputes a block's forward from its input before its backward.
 * Same gradients, bit for bit; about one block's activations instead of L. */
void gpt_set_checkpointing(gpt_t *g, int on);
/* What no block keeps and backward computes again (gpt_config.h,
 * gpt_act_recompute_flags): level 1 GELU's output, 2 also the layernorms'.
 * Forward writes them into backward's scratch for the product that reads
 * them. Same gradients, bit for bit; 4 (level 1) or 6 (level 2) x C floats
 * a token a block less. 0 by default; train.c sets the job's (config_recompute). */
void gpt_set_recompute(gpt_t *g, int level);

/* How forward and backward reach each unit's parameters and gradients. The
 * default (gpt_set_hooks(g, NULL)) points into the flat buffers; the sharded
 * runtime installs hooks that gather a unit before use and reduce its
 * gradients after. Per step the model calls, in order:
 *   forward:  params(0) release(0), then params(u) release(u) for u = 1..L,
 *             then params(0) release(0) (final norm and logits; with
 *             gpt_forward_train over more than one chunk of logits,
 *             params(0) grads(0) release(0): the LM head's backward);
 *   backward: params(0) grads(0) release(0), then for u = L..1:
 *             params(u) grads(u) release(u) grads_done(u); last grads_done(0).
 * A unit's pointers are valid from params/grads until its release/grads_done.
 * Unit buffers hold the unit's tensors at unit-local offsets
 * (tensor.offset - unit.offset). params may also give the unit's bf16 image
 * (*out16: the same layout, each element the one *out holds, exactly: *out
 * is it widened), which the bf16 products then read instead of packing
 * their weights (gpt_weights16 says when the model would; NULL: none). A
 * hook's error stops the pass and is returned. */
enum { GPT_FWD = 0, GPT_BWD = 1 };
typedef struct gpt_unit_hooks {
  void *ctx;
  int (*params)(void *ctx, int unit, int phase, float **out, const uint16_t **out16);
  int (*release)(void *ctx, int unit, int phase);
  int (*grads)(void *ctx, int unit, float **out);
  int (*grads_done)(void *ctx, int unit);
} gpt_unit_hooks_t;
void gpt_set_hooks(gpt_t *g, const gpt_unit_hooks_t *h);
/* 1 when this model's products read a unit's bf16 image (the params hook's
 * out16) in place of packing the fp32 weights: its activations are bf16
 * (the backend's products round their operands) and the backend's
 * weights16 says so (kern.h). The plan's rule too (plan.c). */
int gpt_weights16(const gpt_t *g);
/* 0 when, under gpt_weights16, the model reads tensor i only as a bf16
 * product's weight from the unit's bf16 image (out16), wherever that image
 * is 16-byte aligned at it (kern.h: else the product reads the fp32 one);
 * 1 when it reads the fp32 tensor (the params hook's out) too: a runtime
 * that gathers in bf16 need widen only these (fsdp.c). */
int gpt_tensor_fp32(const gpt_t *g, int i);

#endif

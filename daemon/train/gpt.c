/* gpt: the GPT-2 model on a kern backend (see gpt.h).
 *
 * Owns the flat parameter and gradient buffers, the activations of one (B, T)
 * and the scratch of backward. The forward keeps exactly what backward reads;
 * backward reuses a handful of per-layer scratch buffers instead of a full
 * mirror of the activations. Every byte comes from the accounting allocator,
 * and every buffer lives on the backend's device: this file never reads or
 * writes one itself, it asks the backend's table (set, copies, sums). */
#include "gpt.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/rng.h"
#include "daemon/common/log.h"
#include "daemon/common/mem.h"

/* the logits' padding is at least what the kernels ask of a wide matrix */
_Static_assert(GPT_LOGITS_ALIGN % KERN_LD_ALIGN == 0, "GPT_LOGITS_ALIGN below KERN_LD_ALIGN");

#define GPT_WEIGHTS_VERSION 1
#define GPT_HEADER_INTS 256

/* A block's parameters (or gradients) inside its unit buffer, by name (after
 * llm.c's ParameterTensors); shapes as (rows, cols). gpt_create finds each
 * one's unit-local offset by the tensor's name in the layout, so nothing here
 * depends on the order gpt_config_tensors lists them in. */
typedef struct gpt_block {
  float *ln1w, *ln1b;         /* (C) */
  float *qkvw;                /* (3C, C) */
  float *qkvb;                /* (3C) */
  float *attprojw;            /* (C, C) */
  float *attprojb;            /* (C) */
  float *ln2w, *ln2b;         /* (C) */
  float *fcw;                 /* (4C, C) */
  float *fcb;                 /* (4C) */
  float *fcprojw;             /* (C, 4C) */
  float *fcprojb;             /* (C) */
} gpt_block_t;
/* Unit 0: the embeddings and the final norm. */
typedef struct gpt_embed {
  float *wte; /* (V, C), tied: also the LM head */
  float *wpe; /* (context, C) */
  float *lnfw, *lnfb; /* (C) */
} gpt_embed_t;

/* Each member's tensor name in the layout ("h.<l>." + name for a block's). */
typedef struct {
  const char *name;
  size_t member; /* offsetof the float * in gpt_block_t / gpt_embed_t */
} gpt_field_t;
#define GPT_F(type, m, name) {name, offsetof(type, m)}
static const gpt_field_t gpt_block_fields[] = {
    GPT_F(gpt_block_t, ln1w, "ln1.w"),           GPT_F(gpt_block_t, ln1b, "ln1.b"),
    GPT_F(gpt_block_t, qkvw, "attn.qkv.w"),      GPT_F(gpt_block_t, qkvb, "attn.qkv.b"),
    GPT_F(gpt_block_t, attprojw, "attn.proj.w"), GPT_F(gpt_block_t, attprojb, "attn.proj.b"),
    GPT_F(gpt_block_t, ln2w, "ln2.w"),           GPT_F(gpt_block_t, ln2b, "ln2.b"),
    GPT_F(gpt_block_t, fcw, "mlp.fc.w"),         GPT_F(gpt_block_t, fcb, "mlp.fc.b"),
    GPT_F(gpt_block_t, fcprojw, "mlp.proj.w"),   GPT_F(gpt_block_t, fcprojb, "mlp.proj.b"),
};
static const gpt_field_t gpt_embed_fields[] = {
    GPT_F(gpt_embed_t, wte, "wte"), GPT_F(gpt_embed_t, wpe, "wpe"),
    GPT_F(gpt_embed_t, lnfw, "lnf.w"), GPT_F(gpt_embed_t, lnfb, "lnf.b"),
};
#undef GPT_F
#define GPT_BLOCK_TENSORS (int)(sizeof gpt_block_fields / sizeof *gpt_block_fields)
#define GPT_EMBED_TENSORS (int)(sizeof gpt_embed_fields / sizeof *gpt_embed_fields)
_Static_assert(sizeof(gpt_block_t) == sizeof gpt_block_fields / sizeof *gpt_block_fields * sizeof(float *),
               "every member of gpt_block_t is named in gpt_block_fields");
_Static_assert(sizeof(gpt_embed_t) == sizeof gpt_embed_fields / sizeof *gpt_embed_fields * sizeof(float *),
               "every member of gpt_embed_t is named in gpt_embed_fields");

/* Per-layer activations kept from forward for backward. Shapes with N = B*T.
 * ln1, ln2 and fch_gelu (and the model's lnf) are read by matrix products
 * alone: in bf16 where the backend offers bf16 activations (gpt_t.acts16,
 * kern.h), in half the floats, else in fp32 (gpt_act_at). qkv is kept in
 * bf16 where the attention takes it so (gpt_t.qkv16): the product's fp32
 * output then lands in backward's scratch (dbig2) and the attention rounds
 * it into the layer's qkv. fch is kept in bf16 where the backend's GELU
 * reads it so (gpt_t.fch16): the fc product's sum without its bias,
 * rounded once (kern.h's gelu_fwd_bf16in adds the bias as it reads), or,
 * where the product writes GELU's output itself (matmul_fwd_bf16_gelu, when
 * the block keeps that output), its sum with the bias's bf16 image. */
typedef struct gpt_layer_acts {
  float *ln1;       /* (N,C) */
  float *ln1_mean;  /* (N) */
  float *ln1_rstd;  /* (N) */
  float *qkv;       /* (N,3C), in bf16 under qkv16 */
  float *atty;      /* (N,C) attention output before its projection (bf16 with qkv16) */
  float *att;       /* what attention keeps for backward (attention_saved floats) */
  float *res2;      /* (N,C) residual after attention */
  float *ln2;       /* (N,C) */
  float *ln2_mean;  /* (N) */
  float *ln2_rstd;  /* (N) */
  float *fch;       /* (N,4C) fc output before GELU; under fch16 bf16, without the bias */
  float *fch_gelu;  /* (N,4C), or NULL: recomputed (gpt_set_recompute) */
  float *res3;      /* (N,C) residual after the MLP: the layer's output */
  int fch_biased;   /* fch holds its bias (bf16): the product wrote GELU too
                     * (kern.h's matmul_fwd_bf16_gelu), the last forward */
} gpt_layer_acts_t;

struct gpt {
  gpt_config_t cfg;
  const kern_backend_t *be;
  int num_tensors;
  gpt_tensor_t *tensors;
  int num_units;
  gpt_unit_t *units;
  size_t num_params;
  float *params; /* (num_params) flat, unit order */
  float *grads;  /* (num_params) same layout */

  /* activations for (B, T); NULL until the first forward */
  int B, T;
  size_t acts_cap, scratch_cap; /* bytes held: a smaller (B, T) reuses them */
  int ckpt;                     /* activation checkpointing per block */
  int recompute;                /* kept by no block (gpt_set_recompute): 1 GELU, 2 + norms */
  int acts16;                   /* the products' inputs in bf16 (gpt_acts_bf16) */
  int qkv16;                    /* qkv kept in bf16 (gpt_qkv_bf16) */
  int fch16;                    /* fch kept in bf16 (gpt_fch_bf16) */
  gpt_unit_hooks_t hooks;       /* how units are reached (gpt_flat_hooks by default) */
  /* unit-local offsets of the named tensors: every block's are the same */
  size_t block_off[GPT_BLOCK_TENSORS], embed_off[GPT_EMBED_TENSORS];
  float *acts_mem;
  float *encoded;         /* (N,C) */
  gpt_layer_acts_t *layer; /* (L) */
  float *lnf;             /* (N,C) */
  float *lnf_mean, *lnf_rstd; /* (N) */
  float *logits;          /* (lrows,V), rows gpt_config_logits_ld apart: a chunk's
                           * logits, then probabilities, then dlogits */
  int lrows;              /* rows the logits hold: min(N, the chunk) */
  int lrows_set;          /* gpt_set_logits_rows (0: gpt_config_logits_rows' default) */
  float *losses;          /* (N) */
  int32_t *tokens;        /* (N) inputs of the last forward */
  int32_t *targets;       /* (N) targets of the last forward */
  /* backward scratch */
  float *dres;            /* (N,C) gradient of the residual stream */
  float *dln;             /* (N,C) gradient of a layernorm output */
  float *dbig1;           /* (N,4C) dfch_gelu (bf16 where matmul_bwd_dinp16 makes it),
                           * then dqkv; a layernorm's output while it is used, when no
                           * block keeps it */
  float *dbig2;           /* (N,4C) dfch (bf16 where gelu_bwd_bf16(in) makes it), then
                           * datty (bf16 likewise); GELU's output and (backward) ln1's
                           * while used, when no block keeps them */
  float *att_scratch;
  int have_targets;       /* the logits hold: 0 logits (a forward without targets), 1
                           * probabilities, 2 dlogits (forward_train), 3 dlogits backward
                           * has used; 4 nothing: forward_train ran the LM head's
                           * backward chunk by chunk (dln holds its gradient) */
  int dlogits16;          /* with 2: the dlogits are bf16, for matmul_bwd_bf16's dout16:
                           * 1 in each row's second half (crossentropy_fwd_bwd_bf16),
                           * 2 over the bf16 logits (crossentropy_fwd_bwd_bf16in) */
  float dloss_scale;      /* forward_train's */
};

/* ---- initialisation ---------------------------------------------------- */

/* A standard normal that depends only on (seed, i): Box-Muller on two
 * counter-based uniforms. */
static double gpt_normal(uint64_t seed, uint64_t i) {
  uint64_t a = rng_mix(seed ^ rng_mix(2 * i));
  uint64_t b = rng_mix(seed ^ rng_mix(2 * i + 1));
  double u1 = rng_unit(a) + 0x1.0p-53; /* (0, 1]: log(u1) is finite */
  double u2 = rng_unit(b);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void gpt_init_range(const gpt_config_t *cfg, uint64_t seed, size_t begin, size_t end,
                    float *dst) {
  int n = gpt_config_tensors(cfg, NULL, 0);
  gpt_tensor_t *t = malloc((size_t)n * sizeof *t);
  FSDP_ASSERT(t);
  gpt_config_tensors(cfg, t, n);
  for (int k = 0; k < n; k++) {
    size_t lo = t[k].offset > begin ? t[k].offset : begin;
    size_t hi = t[k].offset + t[k].numel < end ? t[k].offset + t[k].numel : end;
    if (lo >= hi) continue;
    if (t[k].init_std == 0.f) {
      for (size_t i = lo; i < hi; i++) dst[i - begin] = t[k].init_value;
    } else {
#pragma omp parallel for schedule(static)
      for (size_t i = lo; i < hi; i++)
        dst[i - begin] = (float)(t[k].init_std * gpt_normal(seed, i));
    }
  }
  free(t);
}

/* The flat parameters move between the host and the device in chunks of
 * this many floats, through one host buffer (MEM_WORKSPACE). */
#define GPT_STAGE 65536

int gpt_init_weights(gpt_t *g, uint64_t seed) {
  FSDP_ASSERT(g->params); /* a shell's weights are initialised by whoever holds its shards */
  float *stage = mem_alloc(MEM_WORKSPACE, GPT_STAGE * sizeof(float), "initial weights (staging)");
  if (!stage) return FSDP_ENOMEM;
  for (size_t i = 0, c; i < g->num_params; i += c) {
    c = g->num_params - i < GPT_STAGE ? g->num_params - i : GPT_STAGE;
    gpt_init_range(&g->cfg, seed, i, i + c, stage);
    g->be->copy_h2d(g->params + i, stage, c * sizeof(float));
  }
  g->be->sync();
  mem_free(stage);
  return FSDP_OK;
}

/* ---- create / destroy / accessors --------------------------------------- */

/* flat: 1 allocates the flat parameter and gradient buffers (gpt_create), 0
 * leaves every unit to the hooks (gpt_create_shell). */
static int gpt_create_common(gpt_t **out, const gpt_config_t *cfg, const kern_backend_t *be,
                             int flat) {
  *out = NULL;
  int rc = gpt_config_validate(cfg);
  if (rc) return rc;
  gpt_t *g = calloc(1, sizeof *g);
  if (!g) return err_set(FSDP_ENOMEM, "gpt: out of memory");
  g->cfg = *cfg;
  g->be = be;
  g->num_tensors = gpt_config_tensors(cfg, NULL, 0);
  g->tensors = calloc((size_t)g->num_tensors, sizeof *g->tensors);
  g->num_units = cfg->layers + 1;
  g->units = calloc((size_t)g->num_units, sizeof *g->units);
  g->layer = calloc((size_t)cfg->layers, sizeof *g->layer);
  if (!g->tensors || !g->units || !g->layer) {
    gpt_destroy(g);
    return err_set(FSDP_ENOMEM, "gpt: out of memory");
  }
  gpt_config_tensors(cfg, g->tensors, g->num_tensors);
  gpt_set_hooks(g, NULL);
  for (int k = 0; k < g->num_tensors; k++) {
    gpt_unit_t *u = &g->units[g->tensors[k].unit];
    if (!u->numel) u->offset = g->tensors[k].offset;
    u->numel += g->tensors[k].numel;
  }
  g->num_params = gpt_config_num_params(cfg);
  FSDP_ASSERT(g->num_params == g->tensors[g->num_tensors - 1].offset +
                                   g->tensors[g->num_tensors - 1].numel);
  for (int u = 0; u < g->num_units; u++) {
    gpt_unit_t cu = gpt_config_unit(cfg, u); /* the config-only answer agrees */
    FSDP_ASSERT(cu.offset == g->units[u].offset && cu.numel == g->units[u].numel);
  }
  for (int k = 0; k < GPT_EMBED_TENSORS; k++) {
    int i = gpt_find_tensor(g, gpt_embed_fields[k].name);
    FSDP_ASSERT(i >= 0 && g->tensors[i].unit == 0);
    g->embed_off[k] = g->tensors[i].offset - g->units[0].offset;
  }
  for (int l = 0; l < cfg->layers; l++)
    for (int k = 0; k < GPT_BLOCK_TENSORS; k++) {
      char name[32];
      snprintf(name, sizeof name, "h.%d.%s", l, gpt_block_fields[k].name);
      int i = gpt_find_tensor(g, name);
      FSDP_ASSERT(i >= 0 && g->tensors[i].unit == 1 + l);
      size_t off = g->tensors[i].offset - g->units[1 + l].offset;
      FSDP_ASSERT(l == 0 || off == g->block_off[k]); /* every block is laid out alike */
      g->block_off[k] = off;
    }
  if (!flat) {
    *out = g;
    return FSDP_OK;
  }
  g->params = mem_dev_alloc(be, MEM_PARAMS, g->num_params * sizeof(float), "parameters");
  g->grads = g->params ? mem_dev_calloc(be, MEM_GRADS, g->num_params * sizeof(float), "gradients")
                       : NULL;
  if (!g->grads) {
    rc = err_wrap(FSDP_ENOMEM, "model with %zu parameters", g->num_params);
    gpt_destroy(g);
    return rc;
  }
  *out = g;
  return FSDP_OK;
}

int gpt_create(gpt_t **out, const gpt_config_t *cfg, const kern_backend_t *be) {
  return gpt_create_common(out, cfg, be, 1);
}

int gpt_create_shell(gpt_t **out, const gpt_config_t *cfg, const kern_backend_t *be) {
  return gpt_create_common(out, cfg, be, 0);
}

static void gpt_free_acts(gpt_t *g) {
  mem_dev_free(g->be, g->acts_mem);
  mem_dev_free(g->be, g->att_scratch);
  g->acts_mem = NULL;
  g->att_scratch = NULL;
  g->acts_cap = g->scratch_cap = 0;
  g->B = g->T = 0;
}

void gpt_destroy(gpt_t *g) {
  if (!g) return;
  gpt_free_acts(g);
  free(g->layer);
  mem_dev_free(g->be, g->params);
  mem_dev_free(g->be, g->grads);
  free(g->tensors);
  free(g->units);
  free(g);
}

const gpt_config_t *gpt_get_config(const gpt_t *g) { return &g->cfg; }
const kern_backend_t *gpt_backend(const gpt_t *g) { return g->be; }
size_t gpt_num_params(const gpt_t *g) { return g->num_params; }
int gpt_num_tensors(const gpt_t *g) { return g->num_tensors; }
const gpt_tensor_t *gpt_tensor(const gpt_t *g, int i) { return &g->tensors[i]; }
int gpt_num_units(const gpt_t *g) { return g->num_units; }
gpt_unit_t gpt_unit(const gpt_t *g, int u) { return g->units[u]; }
float *gpt_params(gpt_t *g) { return g->params; }
float *gpt_grads(gpt_t *g) { return g->grads; }
const float *gpt_logits(const gpt_t *g) {
  return g->have_targets || g->lrows < g->B * g->T ? NULL : g->logits;
}
int gpt_logits_ld(const gpt_t *g) { return gpt_config_logits_ld(&g->cfg); }

int gpt_copy_logits(const gpt_t *g, int row, float *out) {
  const int N = g->acts_mem ? g->B * g->T : 0, first = N - g->lrows;
  if (!g->acts_mem || g->have_targets || row < 0 || row >= N)
    return err_set(FSDP_EINVAL, "gpt_copy_logits: row %d of a forward without targets of %d rows "
                   "(run gpt_forward with targets NULL first)", row, N);
  if (row < first)
    return err_set(FSDP_EINVAL, "gpt_copy_logits: row %d: a forward keeps the logits of its last "
                   "%d rows only (rows %d to %d of %d)", row, g->lrows, first, N - 1, N);
  g->be->copy_d2h(out, g->logits + (size_t)(row - first) * (size_t)gpt_logits_ld(g),
                  (size_t)g->cfg.vocab * sizeof(float));
  g->be->sync();
  return FSDP_OK;
}

int gpt_find_tensor(const gpt_t *g, const char *name) {
  for (int k = 0; k < g->num_tensors; k++)
    if (!strcmp(g->tensors[k].name, name)) return k;
  return -1;
}

void gpt_zero_grad(gpt_t *g) {
  if (g->grads) g->be->dev_set(g->grads, 0, g->num_params * sizeof(float));
}

/* ---- activations -------------------------------------------------------- */

void gpt_set_checkpointing(gpt_t *g, int on) {
  if (!!on == g->ckpt) return;
  g->ckpt = !!on;
  g->B = g->T = 0; /* lay the activations out again on the next forward */
  g->have_targets = 0; /* and the last forward's are gone: a backward now is refused */
}

void gpt_set_recompute(gpt_t *g, int level) {
  level = level < 0 ? 0 : level > 2 ? 2 : level;
  if (level == g->recompute) return;
  g->recompute = level;
  g->B = g->T = 0;
  g->have_targets = 0;
}

void gpt_set_logits_rows(gpt_t *g, int rows) {
  if (rows < 0) rows = 0;
  if (rows == g->lrows_set) return;
  g->lrows_set = rows;
  g->B = g->T = 0;
  g->have_targets = 0;
}

/* ---- the products' inputs: bf16 where the backend offers it (kern.h) ---- */

/* 1 when the backend offers bf16 activations and the model's rows suit
 * them (gpt_config_acts_bf16_fits): the plan's rule too. */
static int gpt_acts_bf16(const gpt_t *g) {
  const kern_backend_t *be = g->be;
  return be->layernorm_fwd_bf16 && be->gelu_fwd_bf16 && be->matmul_fwd_bf16 &&
         be->matmul_bwd_bf16 && gpt_config_acts_bf16_fits(&g->cfg);
}

/* 1 when qkv is kept in bf16 too: the backend's attention takes it so for
 * this model (kern.h's attention_bf16_fits); the plan's rule too. */
static int gpt_qkv_bf16(const gpt_t *g) {
  const kern_backend_t *be = g->be;
  return gpt_acts_bf16(g) && be->attention_bf16_fits && be->attention_fwd_bf16 &&
         be->attention_bwd_bf16 && be->attention_bf16_fits(g->cfg.channels, g->cfg.heads);
}

/* 1 when the fc product's output is kept in bf16 too (kern.h's
 * gelu_fwd_bf16in and gelu_bwd_bf16in with the product that writes bf16);
 * the plan's rule too (plan_device_t's fch_bf16). */
static int gpt_fch_bf16(const gpt_t *g) {
  const kern_backend_t *be = g->be;
  return gpt_acts_bf16(g) && be->matmul_fwd_bf16_out16 && be->gelu_fwd_bf16in &&
         be->gelu_bwd_bf16in;
}

/* The residual's gradient in bf16 for the backward of each product that
 * adds to the residual (the attention's and the fc projections): the norm
 * after it rounds dres and sums its runs as its backward holds the rows
 * (kern.h's layernorm_bwd16), and the product's backward reads that in
 * place (matmul_bwd16) where it packed the fp32 dres (6 bytes an element
 * and a launch less a projection). Where the bf16 backward runs
 * (matmul_bwd_dinp16's bf16 dfch_gelu and datty, fch and qkv in bf16), dbig1
 * holds at most 2 N C floats while the copy lives (dfch_gelu; dqkv and
 * the norms' recomputes less), so the copy takes its third N C floats (in
 * bf16: half of them) and the runs' sums its last. */
static int gpt_dres16(const gpt_t *g) {
  const kern_backend_t *be = g->be;
  return g->qkv16 && g->fch16 && be->matmul_bwd_dinp16 && be->layernorm_bwd16 &&
         be->matmul_bwd16 && g->cfg.channels % 8 == 0;
}
static uint16_t *gpt_dres16_at(const gpt_t *g) {
  return (uint16_t *)(g->dbig1 + 2 * (size_t)g->B * g->T * g->cfg.channels);
}
static float *gpt_dsums_at(const gpt_t *g) {
  return g->dbig1 + 3 * (size_t)g->B * g->T * g->cfg.channels;
}

/* Element i of a product's input x (ln1, ln2, fch_gelu, lnf, or the
 * scratch holding one): bf16 or fp32 as the activations are laid out. */
static const void *gpt_act_at(const gpt_t *g, const float *x, size_t i) {
  return g->acts16 ? (const void *)((const uint16_t *)x + i) : (const void *)(x + i);
}

static void gpt_act_layernorm(const gpt_t *g, float *out, float *mean, float *rstd,
                              const float *inp, const float *w, const float *b, int N, int C) {
  if (g->acts16) g->be->layernorm_fwd_bf16((uint16_t *)out, mean, rstd, inp, w, b, N, C);
  else g->be->layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
}

static void gpt_act_gelu(const gpt_t *g, float *out, const float *inp, size_t n) {
  if (g->acts16) g->be->gelu_fwd_bf16((uint16_t *)out, inp, n);
  else g->be->gelu_fwd(out, inp, n);
}

/* GELU of the fc product's output fch (N rows of C) into out: from bf16
 * with the bias added under fch16, else from fp32 (the bias added by the
 * product) */
static void gpt_fc_gelu(const gpt_t *g, float *out, const float *fch, const float *bias, int N,
                        int C) {
  if (g->fch16)
    g->be->gelu_fwd_bf16in((uint16_t *)out, (const uint16_t *)fch, bias, N, C);
  else
    gpt_act_gelu(g, out, fch, (size_t)N * (size_t)C);
}

int gpt_weights16(const gpt_t *g) { return gpt_acts_bf16(g) && g->be->weights16; }

/* A block's four matrices go only to bf16 products (gpt_layer_fwd and
 * gpt_layer_bwd, each with gpt_w16), but the attention's projection, whose
 * backward takes fp32 products where qkv is not kept in bf16; the
 * embeddings to the LM head's (wte) and to the encoder, which reads the
 * images where the backend has encoder_fwd16 (gpt_forward_run); the norms
 * and biases to their ops in fp32. */
int gpt_tensor_fp32(const gpt_t *g, int i) {
  const gpt_tensor_t *t = &g->tensors[i];
  if (!gpt_weights16(g)) return 1;
  const size_t off = t->offset - g->units[t->unit].offset;
  if (t->unit == 0)
    return !(g->be->encoder_fwd16 && (off == g->embed_off[0] || off == g->embed_off[1])); /* wte, wpe */
  for (int k = 0; k < GPT_BLOCK_TENSORS; k++) {
    if (g->block_off[k] != off) continue;
    const size_t m = gpt_block_fields[k].member;
    if (m == offsetof(gpt_block_t, attprojw)) return !gpt_qkv_bf16(g);
    return !(m == offsetof(gpt_block_t, qkvw) || m == offsetof(gpt_block_t, fcw) ||
             m == offsetof(gpt_block_t, fcprojw));
  }
  return 1;
}

/* Weight w's bf16 image in P16, the bf16 image of the unit buffer P that
 * holds it (the params hook's out16), or NULL where there is none */
static const uint16_t *gpt_w16(const float *P, const uint16_t *P16, const float *w) {
  return P16 ? P16 + (w - P) : NULL;
}

/* The products: w16 is w's bf16 image or NULL (kern.h), read by the bf16
 * products only */
static void gpt_act_matmul_fwd(const gpt_t *g, float *out, const void *inp, const float *w,
                               const uint16_t *w16, const float *bias, int N, int IC, int OC,
                               int ldo) {
  if (g->acts16) g->be->matmul_fwd_bf16(out, inp, w, w16, bias, N, IC, OC, ldo);
  else g->be->matmul_fwd(out, inp, w, bias, N, IC, OC, ldo);
}

/* A projection back to the residual stream: out (N, C) = inp w^T + bias +
 * res, inp in fp32 (inp) or bf16 (inp16, the bf16 activations); one op
 * where the backend adds the residual as the product writes it, else the
 * product and the residual after it in place. */
static void gpt_proj_res(const gpt_t *g, float *out, const float *inp, const uint16_t *inp16,
                         const float *w, const uint16_t *w16, const float *bias, const float *res,
                         int N, int IC) {
  const kern_backend_t *be = g->be;
  const int C = g->cfg.channels;
  if (be->matmul_fwd_res) {
    be->matmul_fwd_res(out, inp, inp16, w, w16, bias, res, N, IC, C);
    return;
  }
  if (inp16) be->matmul_fwd_bf16(out, inp16, w, w16, bias, N, IC, C, C);
  else be->matmul_fwd(out, inp, w, bias, N, IC, C, C);
  be->residual_fwd(out, out, res, (size_t)N * C);
}

static void gpt_act_matmul_bwd(const gpt_t *g, float *dinp, float *dw, float *dbias,
                               const float *dout, const void *inp, const float *w,
                               const uint16_t *w16, int N, int IC, int OC, int ldo, int acc) {
  if (g->acts16)
    g->be->matmul_bwd_bf16(dinp, dw, dbias, dout, NULL, inp, w, w16, N, IC, OC, ldo, acc);
  else g->be->matmul_bwd(dinp, dw, dbias, dout, inp, w, N, IC, OC, ldo, acc);
}

/* Lays out the activations of (B, T) in the held block, growing it only when
 * (B, T) needs more than it holds (sampling walks T up one token at a time). */
static int gpt_alloc_acts(gpt_t *g, int B, int T) {
  if (g->acts_mem && g->B == B && g->T == T) return FSDP_OK;
  const gpt_config_t *c = &g->cfg;
  const size_t N = (size_t)B * T, C = (size_t)c->channels, L = (size_t)c->layers;
  const size_t natt = g->be->attention_saved(B, T, c->channels, c->heads);
  const int chunk = g->lrows_set ? g->lrows_set : gpt_config_logits_rows(c, 0);
  g->acts16 = gpt_acts_bf16(g);
  g->qkv16 = gpt_qkv_bf16(g);
  g->fch16 = gpt_fch_bf16(g);
  const int flags = (g->ckpt ? GPT_ACT_CHECKPOINT : 0) | gpt_act_recompute_flags(g->recompute) |
                    (g->acts16 ? GPT_ACT_BF16 : 0) | (g->qkv16 ? GPT_ACT_BF16_QKV : 0) |
                    (g->fch16 ? GPT_ACT_BF16_FCH : 0);
  size_t bytes = gpt_config_act_bytes(c, B, T, flags, natt, chunk); /* the plan's number */
  /* the bf16 qkv ops' scratch holds no copy of qkv (kern.h) */
  size_t (*scratch)(int, int, int, int) =
      g->qkv16 && g->be->attention_scratch_bf16 ? g->be->attention_scratch_bf16
                                                : g->be->attention_scratch;
  size_t sbytes = scratch(B, T, c->channels, c->heads) * sizeof(float);
  if (bytes > g->acts_cap || sbytes > g->scratch_cap) {
    gpt_free_acts(g);
    char what[96];
    snprintf(what, sizeof what, "activations for batch %d x seq_len %d", B, T);
    g->acts_mem = mem_dev_alloc(g->be, MEM_ACTS, bytes, what);
    g->att_scratch =
        g->acts_mem ? mem_dev_alloc(g->be, MEM_WORKSPACE, sbytes, "attention scratch") : NULL;
    if (!g->att_scratch) {
      gpt_free_acts(g);
      return FSDP_ENOMEM;
    }
    g->acts_cap = bytes;
    g->scratch_cap = sbytes;
  }
  float *p = g->acts_mem;
  /* each region as gpt_config_act_bytes counts it (16 bytes aligned under
   * bf16 activations) */
#define TAKE(n) (p += gpt_config_act_region((n), flags), p - gpt_config_act_region((n), flags))
  const size_t h = g->acts16 ? 2 : 1; /* a product's input: bf16 in half the floats (N C even) */
  /* first: the logits' rows are padded to 256 bytes, and so is their start */
  g->lrows = (size_t)chunk < N ? chunk : (int)N;
  g->logits = TAKE((size_t)g->lrows * (size_t)gpt_logits_ld(g));
  g->encoded = TAKE(N * C);
  for (size_t l = 0; l < L; l++) {
    gpt_layer_acts_t *a = &g->layer[l];
    if (!g->ckpt || l == 0) {
      a->ln1 = g->recompute >= 2 ? NULL : TAKE(N * C / h); /* NULL: in dbig1, then dbig2 */
      a->ln1_mean = TAKE(N);
      a->ln1_rstd = TAKE(N);
      a->qkv = TAKE(3 * N * C / (g->qkv16 ? 2 : 1)); /* bf16: N C even */
      a->atty = TAKE(N * C / (g->qkv16 ? 2 : 1)); /* bf16 with qkv */
      a->att = TAKE(natt);
      a->res2 = TAKE(N * C);
      a->ln2 = g->recompute >= 2 ? NULL : TAKE(N * C / h); /* NULL: in dbig1 */
      a->ln2_mean = TAKE(N);
      a->ln2_rstd = TAKE(N);
      a->fch = TAKE(4 * N * C / (g->fch16 ? 2 : 1));
      a->fch_gelu = g->recompute >= 1 ? NULL : TAKE(4 * N * C / h); /* NULL: in dbig2 */
    } else {
      *a = g->layer[0]; /* the shared slot; res3 is the layer's own, below */
    }
    a->res3 = TAKE(N * C);
  }
  g->lnf = TAKE(N * C / h);
  g->lnf_mean = TAKE(N);
  g->lnf_rstd = TAKE(N);
  g->losses = TAKE(N);
  g->dres = TAKE(N * C);
  g->dln = TAKE(N * C);
  g->dbig1 = TAKE(4 * N * C);
  g->dbig2 = TAKE(4 * N * C);
#undef TAKE
  /* the layout fills exactly the bytes gpt_config_act_bytes counts */
  FSDP_ASSERT((size_t)(p - g->acts_mem) * sizeof(float) + 2 * N * sizeof(int32_t) == bytes);
  g->tokens = (int32_t *)p;
  g->targets = g->tokens + N;
  g->B = B;
  g->T = T;
  return FSDP_OK;
}

/* ---- forward / backward ------------------------------------------------- */

/* ---- units: where forward and backward find parameters and gradients --- */

/* The default hooks: every unit lives in the model's flat buffers. */
static int gpt_flat_params(void *ctx, int unit, int phase, float **out,
                           const uint16_t **out16) {
  (void)phase;
  gpt_t *g = ctx;
  *out = g->params + g->units[unit].offset;
  *out16 = NULL; /* the flat buffers have no bf16 image */
  return FSDP_OK;
}
static int gpt_flat_grads(void *ctx, int unit, float **out) {
  gpt_t *g = ctx;
  *out = g->grads + g->units[unit].offset;
  return FSDP_OK;
}
static int gpt_flat_release(void *ctx, int unit, int phase) {
  (void)ctx, (void)unit, (void)phase;
  return FSDP_OK;
}
static int gpt_flat_done(void *ctx, int unit) {
  (void)ctx, (void)unit;
  return FSDP_OK;
}

void gpt_set_hooks(gpt_t *g, const gpt_unit_hooks_t *h) {
  if (h) {
    g->hooks = *h;
  } else {
    g->hooks = (gpt_unit_hooks_t){g, gpt_flat_params, gpt_flat_release, gpt_flat_grads,
                                  gpt_flat_done};
  }
}

/* The named tensors of a block's unit buffer ubuf (parameters or gradients). */
static gpt_block_t gpt_block_at(const gpt_t *g, float *ubuf) {
  gpt_block_t b;
  for (int k = 0; k < GPT_BLOCK_TENSORS; k++)
    *(float **)((char *)&b + gpt_block_fields[k].member) = ubuf + g->block_off[k];
  return b;
}

/* The same for unit 0's buffer. */
static gpt_embed_t gpt_embed_at(const gpt_t *g, float *ubuf) {
  gpt_embed_t e;
  for (int k = 0; k < GPT_EMBED_TENSORS; k++)
    *(float **)((char *)&e + gpt_embed_fields[k].member) = ubuf + g->embed_off[k];
  return e;
}

static int gpt_check_tokens(const gpt_t *g, const int32_t *ids, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= g->cfg.vocab)
      return err_set(FSDP_ERANGE, "%s: token id %d at position %zu (batch row %zu, column %zu) "
                     "is outside the vocabulary 0..%d; tokenize the data with the model's "
                     "vocabulary or raise vocab", what, ids[i], i, i / (size_t)g->T,
                     i % (size_t)g->T, g->cfg.vocab - 1);
  return FSDP_OK;
}

/* Forward of block l with its parameters P (the unit buffer; P16 its bf16
 * image or NULL), from res_in into the layer's activations. Backward calls
 * it again under checkpointing. */
static void gpt_layer_fwd(gpt_t *g, int l, float *P, const uint16_t *P16, const float *res_in) {
  const kern_backend_t *be = g->be;
  const int B = g->B, T = g->T, C = g->cfg.channels, NH = g->cfg.heads;
  const size_t N = (size_t)B * T;
  gpt_layer_acts_t *a = &g->layer[l];
  const gpt_block_t p = gpt_block_at(g, P);
  /* a layernorm's output and GELU's: the block's own, or backward's scratch
   * (dbig1, dbig2), free in a forward and between blocks in backward, where
   * checkpointing recomputes a block */
  float *l1 = a->ln1 ? a->ln1 : g->dbig1;
  gpt_act_layernorm(g, l1, a->ln1_mean, a->ln1_rstd, res_in, p.ln1w, p.ln1b, (int)N, C);
  /* qkv in bf16: written so by its product, with the bias's bf16 image
   * (kern.h's matmul_fwd_bf16_out16: one rounding, as autocast's), or the
   * product into dbig2 (free until GELU's output), rounded into qkv by the
   * attention */
  const uint16_t *qkvb16 = gpt_w16(P, P16, p.qkvb);
  if (g->qkv16 && be->qkv_out16 && be->matmul_fwd_bf16_out16 && qkvb16 &&
      !((uintptr_t)qkvb16 & 15)) {
    be->matmul_fwd_bf16_out16((uint16_t *)a->qkv, (const uint16_t *)l1, p.qkvw,
                              gpt_w16(P, P16, p.qkvw), qkvb16, (int)N, C, 3 * C, 3 * C);
    be->attention_fwd_bf16((uint16_t *)a->atty, a->att, g->att_scratch, NULL, (uint16_t *)a->qkv,
                           B, T, C, NH);
  } else if (g->qkv16) {
    gpt_act_matmul_fwd(g, g->dbig2, l1, p.qkvw, gpt_w16(P, P16, p.qkvw), p.qkvb, (int)N, C, 3 * C,
                       3 * C);
    be->attention_fwd_bf16((uint16_t *)a->atty, a->att, g->att_scratch, g->dbig2,
                           (uint16_t *)a->qkv, B, T, C, NH);
  } else {
    gpt_act_matmul_fwd(g, a->qkv, l1, p.qkvw, gpt_w16(P, P16, p.qkvw), p.qkvb, (int)N, C, 3 * C,
                       3 * C);
    be->attention_fwd(a->atty, a->att, g->att_scratch, a->qkv, B, T, C, NH);
  }
  /* the attention's output: bf16 where qkv is (kern.h's attention_fwd_bf16) */
  gpt_proj_res(g, a->res2, g->qkv16 ? NULL : a->atty, g->qkv16 ? (const uint16_t *)a->atty : NULL,
               p.attprojw, gpt_w16(P, P16, p.attprojw), p.attprojb, res_in, (int)N, C);
  float *l2 = a->ln2 ? a->ln2 : g->dbig1;
  gpt_act_layernorm(g, l2, a->ln2_mean, a->ln2_rstd, a->res2, p.ln2w, p.ln2b, (int)N, C);
  float *gl = a->fch_gelu ? a->fch_gelu : g->dbig2;
  /* GELU in the fc product's write, with the bias's bf16 image (kern.h's
   * matmul_fwd_bf16_gelu), where GELU's output is kept: a recompute from
   * fch would not give its bits */
  const uint16_t *fcb16 = gpt_w16(P, P16, p.fcb);
  a->fch_biased = g->fch16 && be->matmul_fwd_bf16_gelu && a->fch_gelu && fcb16 &&
                  !((uintptr_t)fcb16 & 15) && C % 8 == 0;
  if (a->fch_biased) {
    be->matmul_fwd_bf16_gelu((uint16_t *)gl, (uint16_t *)a->fch, (const uint16_t *)l2, p.fcw,
                             gpt_w16(P, P16, p.fcw), fcb16, (int)N, C, 4 * C);
  } else if (g->fch16) {
    be->matmul_fwd_bf16_out16((uint16_t *)a->fch, (const uint16_t *)l2, p.fcw,
                              gpt_w16(P, P16, p.fcw), NULL, (int)N, C, 4 * C, 4 * C);
    gpt_fc_gelu(g, gl, a->fch, p.fcb, (int)N, 4 * C);
  } else {
    gpt_act_matmul_fwd(g, a->fch, l2, p.fcw, gpt_w16(P, P16, p.fcw), p.fcb, (int)N, C, 4 * C,
                       4 * C);
    gpt_fc_gelu(g, gl, a->fch, p.fcb, (int)N, 4 * C);
  }
  gpt_proj_res(g, a->res3, g->acts16 ? NULL : gl, g->acts16 ? (const uint16_t *)gl : NULL,
               p.fcprojw, gpt_w16(P, P16, p.fcprojw), p.fcprojb, a->res2, (int)N, 4 * C);
}

/* Backward of block l: g->dres holds d(output) and becomes d(res_in); the
 * parameter gradients accumulate into the unit buffer G. */
static void gpt_layer_bwd(gpt_t *g, int l, float *P, const uint16_t *P16, float *G,
                          const float *res_in) {
  const kern_backend_t *be = g->be;
  const int B = g->B, T = g->T, C = g->cfg.channels, NH = g->cfg.heads;
  const size_t N = (size_t)B * T, NC = N * (size_t)C;
  gpt_layer_acts_t *a = &g->layer[l];
  const gpt_block_t p = gpt_block_at(g, P), d = gpt_block_at(g, G);
  float *dfch_gelu = g->dbig1, *dfch = g->dbig2;
  const float *gl = a->fch_gelu;
  if (!gl) { /* recomputed into dbig2, which dfch takes once the product has read it */
    gpt_fc_gelu(g, g->dbig2, a->fch, p.fcb, (int)N, 4 * C);
    gl = g->dbig2;
  }
  /* each activation gradient below is written whole by its first op (acc 0:
   * kern.h), so none is zeroed first. GELU's output gradient in bf16 where
   * the backend writes it so for its bf16 GELU (kern.h's matmul_bwd_dinp16:
   * a rounding more, as autocast keeps a product's output) */
  const int dgelu16 = g->fch16 && be->matmul_bwd_dinp16;
  /* where the fc product wrote GELU (fch its input), GELU's backward in the
   * fc projection's dinp product's write (kern.h's matmul_bwd_dgelu16):
   * dfch itself, in bf16, whose column sums the fc product's backward makes
   * its dbias */
  const int dgelu_in = a->fch_biased && be->matmul_bwd_dgelu16;
  /* dres in bf16 where the norm after the block made it so (gpt_dres16) */
  const int dres16 = gpt_dres16(g);
  uint16_t *dr16 = dres16 ? gpt_dres16_at(g) : NULL;
  float *dsums = dres16 ? gpt_dsums_at(g) : NULL;
  if (dres16)
    be->matmul_bwd16(dgelu_in ? (uint16_t *)dfch : (uint16_t *)dfch_gelu, d.fcprojw, d.fcprojb,
                     dr16, dsums, (const uint16_t *)gl, p.fcprojw, gpt_w16(P, P16, p.fcprojw),
                     dgelu_in ? (const uint16_t *)a->fch : NULL, (int)N, 4 * C, C);
  else if (dgelu_in)
    be->matmul_bwd_dgelu16((uint16_t *)dfch, d.fcprojw, d.fcprojb, g->dres, (const uint16_t *)gl,
                           p.fcprojw, gpt_w16(P, P16, p.fcprojw), (const uint16_t *)a->fch,
                           (int)N, 4 * C, C);
  else if (dgelu16)
    be->matmul_bwd_dinp16((uint16_t *)dfch_gelu, d.fcprojw, d.fcprojb, g->dres, NULL,
                          (const uint16_t *)gl, p.fcprojw, gpt_w16(P, P16, p.fcprojw), (int)N,
                          4 * C, C);
  else
    gpt_act_matmul_bwd(g, dfch_gelu, d.fcprojw, d.fcprojb, g->dres, gl, p.fcprojw,
                       gpt_w16(P, P16, p.fcprojw), (int)N, 4 * C, C, C, 0);
  /* dfch in bf16 where the backend makes it so (kern.h's gelu_bwd_bf16: the
   * operand the fc product packs, its dbias summed on the way) */
  const int dfch16 = g->fch16 || (g->acts16 && be->gelu_bwd_bf16);
  if (dgelu_in)
    ; /* dfch made */
  else if (g->fch16) /* fch with its bias where the product wrote GELU */
    be->gelu_bwd_bf16in((uint16_t *)dfch, d.fcb, (const uint16_t *)a->fch,
                        a->fch_biased ? NULL : p.fcb, dgelu16 ? NULL : dfch_gelu,
                        dgelu16 ? (const uint16_t *)dfch_gelu : NULL, (int)N, 4 * C);
  else if (dfch16)
    be->gelu_bwd_bf16((uint16_t *)dfch, d.fcb, a->fch, dfch_gelu, (int)N, 4 * C);
  else
    be->gelu_bwd(dfch, a->fch, dfch_gelu, 4 * NC, 0);
  const float *l2 = a->ln2;
  if (!l2) { /* again, into dbig1: dfch_gelu is spent */
    gpt_act_layernorm(g, g->dbig1, a->ln2_mean, a->ln2_rstd, a->res2, p.ln2w, p.ln2b, (int)N, C);
    l2 = g->dbig1;
  }
  if (dfch16)
    be->matmul_bwd_bf16(g->dln, d.fcw, dgelu_in ? d.fcb : NULL, NULL, (const uint16_t *)dfch,
                        (const uint16_t *)l2, p.fcw, gpt_w16(P, P16, p.fcw), (int)N, C, 4 * C,
                        4 * C, 0);
  else
    gpt_act_matmul_bwd(g, g->dln, d.fcw, d.fcb, dfch, l2, p.fcw, gpt_w16(P, P16, p.fcw), (int)N, C,
                       4 * C, 4 * C, 0);
  /* the skip path already put d(res3) in dres: adding the norm's gives d(res2) */
  if (dres16)
    be->layernorm_bwd16(g->dres, dr16, dsums, d.ln2w, d.ln2b, g->dln, a->res2, p.ln2w,
                        a->ln2_mean, a->ln2_rstd, (int)N, C);
  else
    be->layernorm_bwd(g->dres, d.ln2w, d.ln2b, g->dln, a->res2, p.ln2w, a->ln2_mean,
                      a->ln2_rstd, (int)N, C);
  /* the attention's output gradient in bf16 where the backend writes it so
   * for the tensor-core attention, which rounds an fp32 one the same way
   * (kern.h: the same values, half the bytes, a cast less) */
  float *datty = g->dbig2, *dqkv = g->dbig1;
  const int datt16 = g->qkv16 && be->matmul_bwd_dinp16;
  const uint16_t *atty16 = (const uint16_t *)a->atty; /* under qkv16 */
  if (dres16)
    be->matmul_bwd16((uint16_t *)datty, d.attprojw, d.attprojb, dr16, dsums, atty16, p.attprojw,
                     gpt_w16(P, P16, p.attprojw), NULL, (int)N, C, C);
  else if (datt16)
    be->matmul_bwd_dinp16((uint16_t *)datty, d.attprojw, d.attprojb, g->dres, NULL, atty16,
                          p.attprojw, gpt_w16(P, P16, p.attprojw), (int)N, C, C);
  else if (g->qkv16)
    be->matmul_bwd_bf16(datty, d.attprojw, d.attprojb, g->dres, NULL, atty16, p.attprojw,
                        gpt_w16(P, P16, p.attprojw), (int)N, C, C, C, 0);
  else
    be->matmul_bwd(datty, d.attprojw, d.attprojb, g->dres, a->atty, p.attprojw, (int)N, C, C, C,
                   0);
  /* dqkv in bf16 where the attention writes it so (kern.h): the operand
   * the qkv product would round it to, its dbias the column sums of those
   * values (matmul_bwd_bf16's dout16), as dfch's for the fc bias */
  const int dqkv16 = g->qkv16 && be->attention_bwd_dqkv16;
  if (dqkv16)
    be->attention_bwd_dqkv16((uint16_t *)dqkv, g->att_scratch, datt16 ? NULL : datty,
                             datt16 ? (const uint16_t *)datty : NULL, (const uint16_t *)a->qkv,
                             atty16, a->att, B, T, C, NH);
  else if (g->qkv16)
    be->attention_bwd_bf16(dqkv, g->att_scratch, datt16 ? NULL : datty,
                           datt16 ? (const uint16_t *)datty : NULL, (const uint16_t *)a->qkv,
                           atty16, a->att, B, T, C, NH, 0);
  else
    be->attention_bwd(dqkv, g->att_scratch, datty, a->qkv, a->atty, a->att, B, T, C, NH, 0);
  const float *l1 = a->ln1;
  if (!l1) { /* again, into dbig2: datty is spent */
    gpt_act_layernorm(g, g->dbig2, a->ln1_mean, a->ln1_rstd, res_in, p.ln1w, p.ln1b, (int)N, C);
    l1 = g->dbig2;
  }
  if (dqkv16)
    be->matmul_bwd_bf16(g->dln, d.qkvw, d.qkvb, NULL, (const uint16_t *)dqkv, (const uint16_t *)l1,
                        p.qkvw, gpt_w16(P, P16, p.qkvw), (int)N, C, 3 * C, 3 * C, 0);
  else
    gpt_act_matmul_bwd(g, g->dln, d.qkvw, d.qkvb, dqkv, l1, p.qkvw, gpt_w16(P, P16, p.qkvw), (int)N,
                       C, 3 * C, 3 * C, 0);
  if (dres16 && l > 0) /* for the block before's fc projection (none before block 0) */
    be->layernorm_bwd16(g->dres, dr16, dsums, d.ln1w, d.ln1b, g->dln, res_in, p.ln1w,
                        a->ln1_mean, a->ln1_rstd, (int)N, C);
  else
    be->layernorm_bwd(g->dres, d.ln1w, d.ln1b, g->dln, res_in, p.ln1w, a->ln1_mean,
                      a->ln1_rstd, (int)N, C);
}

#define GPT_TRY(call)                                                                         \
  do {                                                                                        \
    int rc_ = (call);                                                                         \
    if (rc_) return rc_;                                                                      \
  } while (0)

/* How the LM head's chunks make their dlogits (bwd: they do): 0 in fp32,
 * in bf16 (kern.h) 1 in each row's second half, 2 from logits the product
 * wrote in bf16 (as autocast keeps them), over them. */
static int gpt_dl16(const gpt_t *g, int bwd) {
  const kern_backend_t *be = g->be;
  if (!bwd || !g->acts16 || !be->crossentropy_fwd_bwd_bf16) return 0;
  return be->matmul_fwd_bf16_out16 && be->crossentropy_fwd_bwd_bf16in ? 2 : 1;
}

/* Rows of the LM head's chunks: lrows, the buffer's fp32 rows; with bf16
 * logits (dl16 2) twice as many in the same bytes (rows ld bf16 apart),
 * the batch's N at most: half the chunks, wte packed and its gradient
 * read and written half as often. */
static size_t gpt_lm_rows(const gpt_t *g, int dl16) {
  const size_t N = (size_t)g->B * (size_t)g->T, r = (size_t)g->lrows * (dl16 == 2 ? 2 : 1);
  return r < N ? r : N;
}

/* The LM head's backward for rows [r0, r0 + n) from the bf16 dlogits in
 * the logits' buffer, where `where` (g->dlogits16's) says: in each row's
 * second half (rows 2 ld bf16 apart), or over the bf16 logits (ld apart):
 * their rows of dln, written, and their share of wte's gradient */
static void gpt_lm_head_bwd16(gpt_t *g, const gpt_embed_t *d0, const gpt_embed_t *p0,
                              const uint16_t *wte16, size_t r0, int n, int where) {
  const size_t C = (size_t)g->cfg.channels;
  const int ld = gpt_logits_ld(g);
  const uint16_t *dl = (const uint16_t *)g->logits + (where == 1 ? ld : 0);
  g->be->matmul_bwd_bf16(g->dln + r0 * C, d0->wte, NULL, NULL, dl, gpt_act_at(g, g->lnf, r0 * C),
                         p0->wte, wte16, n, (int)C, g->cfg.vocab, where == 1 ? 2 * ld : ld, 0);
}

/* The LM head and its loss over the N rows of lnf, gpt_lm_rows at a time (p0:
 * unit 0's parameters): each chunk's logits and losses, with bwd the loss's
 * gradient (dscale per row) in place of the chunk's logits, and with d0
 * (unit 0's gradient) that chunk's backward: its rows of dln (written, not
 * accumulated) and its share of wte's gradient, before the next chunk's logits
 * take the buffer. Without d0 the last chunk's probabilities (bwd: loss
 * gradient) stay, which backward uses when one chunk is all the rows (the
 * gradient in bf16 where the backend rounds it so: dlogits16). */
static void gpt_lm_head(gpt_t *g, const gpt_embed_t *p0, const uint16_t *wte16,
                        const gpt_embed_t *d0, int bwd, float dscale) {
  const kern_backend_t *be = g->be;
  const size_t N = (size_t)g->B * (size_t)g->T, C = (size_t)g->cfg.channels;
  const int V = g->cfg.vocab, ld = gpt_logits_ld(g);
  /* dlogits rounded to bf16 as the product would pack them, for the
   * product to read so (gpt_dl16) */
  const int dl16 = gpt_dl16(g, bwd);
  const size_t rows = gpt_lm_rows(g, dl16);
  g->dlogits16 = 0;
  for (size_t r0 = 0; r0 < N; r0 += rows) {
    const int n = (int)(N - r0 < rows ? N - r0 : rows);
    const void *x = gpt_act_at(g, g->lnf, r0 * C);
    if (dl16 == 2) {
      uint16_t *l16 = (uint16_t *)g->logits;
      be->matmul_fwd_bf16_out16(l16, x, p0->wte, wte16, NULL, n, (int)C, V, ld);
      be->crossentropy_fwd_bwd_bf16in(g->losses + r0, l16, g->targets + r0, dscale, n, V, ld);
    } else {
      gpt_act_matmul_fwd(g, g->logits, x, p0->wte, wte16, NULL, n, (int)C, V, ld);
      if (dl16)
        be->crossentropy_fwd_bwd_bf16(g->losses + r0, g->logits, g->targets + r0, dscale, n, V,
                                      ld);
    }
    if (dl16) {
      if (d0) gpt_lm_head_bwd16(g, d0, p0, wte16, r0, n, dl16);
      g->dlogits16 = d0 ? 0 : dl16;
      continue;
    }
    if (bwd) /* the probabilities go straight to dlogits, as gpt_backward would make them */
      be->crossentropy_fwd_bwd(g->losses + r0, g->logits, g->targets + r0, dscale, n, V, ld);
    else
      be->crossentropy_fwd(g->losses + r0, g->logits, g->targets + r0, n, V, ld);
    if (d0)
      gpt_act_matmul_bwd(g, g->dln + r0 * C, d0->wte, NULL, g->logits, x, p0->wte, wte16, n, (int)C,
                         V, ld, 0);
  }
}

/* gpt_forward, and with bwd the loss's gradient (dloss_scale / N) taken
 * with the loss (gpt_forward_train). */
static int gpt_forward_run(gpt_t *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                           float *loss, int bwd, float dloss_scale) {
  const gpt_config_t *c = &g->cfg;
  if (B <= 0) return err_set(FSDP_EINVAL, "batch: %d must be at least 1", B);
  if (T <= 0 || T > c->context)
    return err_set(FSDP_EINVAL, "seq_len: %d is out of range; it must be 1 to the model's "
                   "context %d (raise context or shorten seq_len)", T, c->context);
  if (!g->params && g->hooks.params == gpt_flat_params)
    return err_set(FSDP_EINVAL, "gpt_forward: this model has no parameter buffers "
                   "(gpt_create_shell); install hooks that provide its units first");
  GPT_TRY(gpt_alloc_acts(g, B, T));
  const size_t N = (size_t)B * T;
  const int C = c->channels, V = c->vocab;
  g->have_targets = 0;
  const kern_backend_t *be = g->be;
  /* checked on the host, before the device sees them */
  GPT_TRY(gpt_check_tokens(g, inputs, N, "inputs"));
  if (targets) GPT_TRY(gpt_check_tokens(g, targets, N, "targets"));
  be->copy_h2d(g->tokens, inputs, N * sizeof *inputs);
  if (targets) be->copy_h2d(g->targets, targets, N * sizeof *targets);
  const gpt_unit_hooks_t *h = &g->hooks;
  float *P;
  const uint16_t *P16;
  /* unit 0 is used twice (embeddings first, final norm and logits last, with
   * the LM head's backward when forward_train takes several chunks): it is
   * asked for and released around each use, so the runtime decides whether it
   * stays gathered in between */
  GPT_TRY(h->params(h->ctx, 0, GPT_FWD, &P, &P16));
  gpt_embed_t e = gpt_embed_at(g, P);
  if (P16 && be->encoder_fwd16) /* from the images, as the products read wte (gpt_tensor_fp32) */
    be->encoder_fwd16(g->encoded, g->tokens, gpt_w16(P, P16, e.wte), gpt_w16(P, P16, e.wpe), B, T,
                      C);
  else be->encoder_fwd(g->encoded, g->tokens, e.wte, e.wpe, B, T, C);
  GPT_TRY(h->release(h->ctx, 0, GPT_FWD));
  const float *res = g->encoded;
  for (int l = 0; l < c->layers; l++) {
    GPT_TRY(h->params(h->ctx, 1 + l, GPT_FWD, &P, &P16));
    gpt_layer_fwd(g, l, P, P16, res);
    GPT_TRY(h->release(h->ctx, 1 + l, GPT_FWD));
    res = g->layer[l].res3;
  }
  GPT_TRY(h->params(h->ctx, 0, GPT_FWD, &P, &P16));
  e = gpt_embed_at(g, P);
  const uint16_t *wte16 = gpt_w16(P, P16, e.wte);
  gpt_act_layernorm(g, g->lnf, g->lnf_mean, g->lnf_rstd, res, e.lnfw, e.lnfb, (int)N, C);
  const int chunked = N > gpt_lm_rows(g, gpt_dl16(g, bwd));
  if (!targets) { /* the logits of the last lrows rows (a sample reads the last) */
    gpt_act_matmul_fwd(g, g->logits, gpt_act_at(g, g->lnf, (N - (size_t)g->lrows) * C), e.wte,
                       wte16, NULL, g->lrows, C, V, gpt_logits_ld(g));
  } else if (bwd && chunked) { /* the LM head's backward now, chunk by chunk */
    float *G0;
    GPT_TRY(h->grads(h->ctx, 0, &G0));
    const gpt_embed_t d0 = gpt_embed_at(g, G0);
    gpt_lm_head(g, &e, wte16, &d0, 1, dloss_scale / (float)N);
  } else { /* one chunk: forward_train leaves the loss's gradient to backward */
    gpt_lm_head(g, &e, wte16, NULL, bwd, dloss_scale / (float)N);
  }
  GPT_TRY(h->release(h->ctx, 0, GPT_FWD));
  if (targets) {
    double sum = be->vec_sum(g->losses, N); /* the mean loss over the batch's tokens */
    if (loss) *loss = (float)(sum / (double)N);
    g->have_targets = !bwd ? 1 : chunked ? 4 : 2;
    g->dloss_scale = dloss_scale;
  }
  return FSDP_OK;
}

int gpt_forward(gpt_t *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                float *loss) {
  return gpt_forward_run(g, inputs, targets, B, T, loss, 0, 0.0f);
}

int gpt_forward_train(gpt_t *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                      float dloss_scale, float *loss) {
  if (!targets) return err_set(FSDP_EINVAL, "gpt_forward_train: no targets");
  return gpt_forward_run(g, inputs, targets, B, T, loss, 1, dloss_scale);
}

int gpt_backward(gpt_t *g, float dloss_scale) {
  if (g->acts_mem && g->have_targets == 3)
    return err_set(FSDP_EINVAL, "gpt_backward: backward already ran for the last forward; run "
                   "a forward with targets first");
  if (!g->acts_mem || !g->have_targets)
    return err_set(FSDP_EINVAL, "gpt_backward: no forward with targets to go back through (the "
                   "last had none, or checkpointing or the logits' chunk changed since); call "
                   "gpt_forward with targets first");
  const gpt_config_t *c = &g->cfg;
  const kern_backend_t *be = g->be;
  const gpt_unit_hooks_t *h = &g->hooks;
  const int B = g->B, T = g->T, C = c->channels, V = c->vocab;
  const size_t N = (size_t)B * T, NC = N * (size_t)C;
  float *P, *G, *G0;
  const uint16_t *P16;

  /* mean over the N tokens, times the caller's scale (micro-batch averaging) */
  if (g->have_targets >= 2 && dloss_scale != g->dloss_scale)
    return err_set(FSDP_EINVAL, "gpt_backward: dloss_scale %g is not the %g gpt_forward_train "
                   "already took the loss's gradient with", (double)dloss_scale,
                   (double)g->dloss_scale);
  /* forward_train keeps dlogits (2) only of one chunk: the chunks again
   * only after a forward that kept probabilities (1) */
  const int had = g->have_targets, chunked = had == 1 && N > (size_t)g->lrows;
  if (had == 1 && !chunked)
    be->crossentropy_bwd(g->logits, g->targets, dloss_scale / (float)N, (int)N, V,
                         gpt_logits_ld(g));
  g->have_targets = 3; /* dlogits, used: neither logits (gpt_logits) nor another backward's */
  GPT_TRY(h->params(h->ctx, 0, GPT_BWD, &P, &P16));
  GPT_TRY(h->grads(h->ctx, 0, &G0));
  const gpt_embed_t p0 = gpt_embed_at(g, P), d0 = gpt_embed_at(g, G0);
  const uint16_t *wte16 = gpt_w16(P, P16, p0.wte);
  if (had != 4) { /* the LM head's backward: from the kept dlogits, or chunk by chunk again */
    if (chunked)
      gpt_lm_head(g, &p0, wte16, &d0, 1, dloss_scale / (float)N);
    else if (had == 2 && g->dlogits16)
      gpt_lm_head_bwd16(g, &d0, &p0, wte16, 0, (int)N, g->dlogits16);
    else
      gpt_act_matmul_bwd(g, g->dln, d0.wte, NULL, g->logits, g->lnf, p0.wte, wte16, (int)N, C, V,
                         gpt_logits_ld(g), 0);
  }
  const float *res_last = c->layers ? g->layer[c->layers - 1].res3 : g->encoded;
  be->dev_set(g->dres, 0, NC * sizeof(float));
  if (gpt_dres16(g) && c->layers) /* for the last block's fc projection */
    be->layernorm_bwd16(g->dres, gpt_dres16_at(g), gpt_dsums_at(g), d0.lnfw, d0.lnfb, g->dln,
                        res_last, p0.lnfw, g->lnf_mean, g->lnf_rstd, (int)N, C);
  else
    be->layernorm_bwd(g->dres, d0.lnfw, d0.lnfb, g->dln, res_last, p0.lnfw, g->lnf_mean,
                      g->lnf_rstd, (int)N, C);
  GPT_TRY(h->release(h->ctx, 0, GPT_BWD));

  for (int l = c->layers - 1; l >= 0; l--) {
    const float *res_in = l ? g->layer[l - 1].res3 : g->encoded;
    GPT_TRY(h->params(h->ctx, 1 + l, GPT_BWD, &P, &P16));
    GPT_TRY(h->grads(h->ctx, 1 + l, &G));
    if (g->ckpt) gpt_layer_fwd(g, l, P, P16, res_in); /* refill the shared slot */
    gpt_layer_bwd(g, l, P, P16, G, res_in);
    GPT_TRY(h->release(h->ctx, 1 + l, GPT_BWD));
    GPT_TRY(h->grads_done(h->ctx, 1 + l));
  }
  /* the embeddings' backward needs gradients only, no parameters */
  be->encoder_bwd(d0.wte, d0.wpe, g->dres, g->tokens, B, T, C);
  GPT_TRY(h->grads_done(h->ctx, 0));
  return FSDP_OK;
}

/* ---- weights files ------------------------------------------------------ */

/* Writes all n bytes of p to fd; a message naming path on failure. */
static int gpt_write_all(int fd, const void *p, size_t n, const char *path) {
  for (size_t done = 0; done < n;) {
    ssize_t w = write(fd, (const char *)p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : ENOSPC;
      return err_set_errno(err_from_errno(e), e, "saving weights to %s", path);
    }
    done += (size_t)w;
  }
  return FSDP_OK;
}

int gpt_save(const gpt_t *g, const char *path) {
  char tmp[4096];
  int fd = -1, rc = file_output_check("save", path, "model.weights");
  if (!rc && (rc = file_temp_create(path, tmp, sizeof tmp, &fd)))
    rc = err_wrap(rc, "saving weights to %s", path);
  if (rc) return rc;
  float *stage = mem_alloc(MEM_WORKSPACE, GPT_STAGE * sizeof(float), "saved weights (staging)");
  if (!stage) {
    close(fd);
    unlink(tmp);
    return FSDP_ENOMEM;
  }
  int32_t hdr[GPT_HEADER_INTS];
  gpt_weights_header(&g->cfg, hdr);
  rc = gpt_write_all(fd, hdr, sizeof hdr, path);
  for (size_t i = 0, c; !rc && i < g->num_params; i += c) {
    c = g->num_params - i < GPT_STAGE ? g->num_params - i : GPT_STAGE;
    g->be->copy_d2h(stage, g->params + i, c * sizeof(float));
    g->be->sync();
    rc = gpt_write_all(fd, stage, c * sizeof(float), path);
  }
  mem_free(stage);
  if (!rc && fsync(fd) != 0) rc = err_set_errno(err_from_errno(errno), errno, "saving weights to %s", path);
  if (close(fd) != 0 && !rc) rc = err_set_errno(err_from_errno(errno), errno, "saving weights to %s", path);
  if (!rc) rc = file_temp_place("save", tmp, path);
  if (rc) unlink(tmp);
  return rc;
}

int gpt_weights_open(const char *path, gpt_config_t *cfg, FILE **out) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return err_set_errno(err_from_errno(errno), errno, "init_from: cannot open %s", path);
  int32_t hdr[GPT_HEADER_INTS];
  struct stat st;
  int rc = FSDP_EFORMAT;
  if (fread(hdr, sizeof hdr, 1, f) != 1) {
    err_set(rc, "init_from: %s is shorter than the %zu-byte header of a weights file; it is "
            "truncated or not a weights file", path, sizeof hdr);
  } else if (hdr[0] != GPT_WEIGHTS_MAGIC || hdr[1] != GPT_WEIGHTS_VERSION) {
    err_set(rc, "init_from: %s is not an fsdpd weights file (magic %d version %d, expected %d "
            "version %d), nor a safetensors file", path, hdr[0], hdr[1], GPT_WEIGHTS_MAGIC,
            GPT_WEIGHTS_VERSION);
  } else if ((*cfg = (gpt_config_t){hdr[2], hdr[3], hdr[4], hdr[5], hdr[6]},
              gpt_config_validate(cfg))) {
    err_wrap(rc, "init_from: header of %s", path);
  } else if (fstat(fileno(f), &st) != 0 ||
             (size_t)st.st_size != sizeof hdr + gpt_config_num_params(cfg) * sizeof(float)) {
    err_set(rc, "init_from: %s holds %lld bytes but its header (layers %d, channels %d, heads "
            "%d, vocab %d, context %d) needs %zu; the file is truncated or corrupt", path,
            (long long)st.st_size, cfg->layers, cfg->channels, cfg->heads, cfg->vocab,
            cfg->context, sizeof hdr + gpt_config_num_params(cfg) * sizeof(float));
  } else {
    *out = f;
    return FSDP_OK;
  }
  fclose(f);
  return rc;
}

int gpt_weights_match(const gpt_config_t *f, const gpt_config_t *want, const char *path) {
  if (!memcmp(f, want, sizeof *f)) return FSDP_OK;
  return err_set(FSDP_EINVAL, "init_from: %s holds a model with layers %d, channels %d, heads %d, "
                 "vocab %d, context %d, but the job asks for %d, %d, %d, %d, %d; make the model "
                 "options match the file", path, f->layers, f->channels, f->heads, f->vocab,
                 f->context, want->layers, want->channels, want->heads, want->vocab,
                 want->context);
}

void gpt_weights_header(const gpt_config_t *c, int32_t hdr[256]) {
  memset(hdr, 0, GPT_HEADER_INTS * sizeof *hdr);
  hdr[0] = GPT_WEIGHTS_MAGIC;
  hdr[1] = GPT_WEIGHTS_VERSION;
  hdr[2] = c->layers;
  hdr[3] = c->channels;
  hdr[4] = c->heads;
  hdr[5] = c->vocab;
  hdr[6] = c->context;
}

int gpt_load(gpt_t **out, const char *path, const kern_backend_t *be) {
  *out = NULL;
  gpt_config_t cfg;
  FILE *f;
  int rc = gpt_weights_open(path, &cfg, &f);
  if (rc) return rc;
  gpt_t *g = NULL;
  rc = gpt_create(&g, &cfg, be);
  float *stage = rc ? NULL : mem_alloc(MEM_WORKSPACE, GPT_STAGE * sizeof(float), "loaded weights (staging)");
  if (!rc && !stage) rc = FSDP_ENOMEM;
  for (size_t i = 0, c; !rc && i < g->num_params; i += c) {
    c = g->num_params - i < GPT_STAGE ? g->num_params - i : GPT_STAGE;
    if (fread(stage, sizeof(float), c, f) != c)
      rc = err_set_errno(FSDP_EIO, errno, "init_from: reading %s", path);
    else
      be->copy_h2d(g->params + i, stage, c * sizeof(float));
  }
  be->sync();
  mem_free(stage);
  if (!rc) {
    *out = g;
    g = NULL;
  }
  gpt_destroy(g);
  fclose(f);
  return rc;
}

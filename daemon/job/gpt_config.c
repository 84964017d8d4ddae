/* gpt_config: presets, checks and sizes of a model's shape (see gpt_config.h). */
#include "daemon/job/gpt_config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "daemon/common/err.h"

static const struct {
  const char *name;
  gpt_config_t cfg;
} gpt_presets[] = {
    {"gpt2-124m", {12, 768, 12, 50257, 1024}},
    {"gpt2-350m", {24, 1024, 16, 50257, 1024}},
    {"gpt2-774m", {36, 1280, 20, 50257, 1024}},
    {"gpt2-1558m", {48, 1600, 25, 50257, 1024}},
    {"tiny", {2, 64, 4, 256, 64}},
    {"small", {4, 256, 4, 256, 256}},
};
#define GPT_NUM_PRESETS (int)(sizeof gpt_presets / sizeof gpt_presets[0])

void gpt_config_preset_names(char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < GPT_NUM_PRESETS && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "", gpt_presets[i].name);
}

int gpt_config_preset(gpt_config_t *cfg, const char *name) {
  for (int i = 0; i < GPT_NUM_PRESETS; i++)
    if (!strcmp(name, gpt_presets[i].name)) {
      *cfg = gpt_presets[i].cfg;
      return FSDP_OK;
    }
  char names[256];
  gpt_config_preset_names(names, sizeof names);
  return err_set(FSDP_EINVAL, "model: unknown preset \"%s\"; choose one of %s, or give "
                 "layers, channels, heads, vocab and context explicitly", name, names);
}

int gpt_config_validate(const gpt_config_t *c) {
  if (c->layers <= 0 || c->layers > 4096)
    return err_set(FSDP_EINVAL, "layers: %d is out of range; give 1 to 4096 transformer blocks",
                   c->layers);
  if (c->channels <= 0 || c->channels > 65536)
    return err_set(FSDP_EINVAL, "channels: %d is out of range; give 1 to 65536", c->channels);
  if (c->heads <= 0)
    return err_set(FSDP_EINVAL, "heads: %d must be positive", c->heads);
  if (c->channels % c->heads)
    return err_set(FSDP_EINVAL, "heads: channels %d is not divisible by heads %d; choose heads "
                   "that divide channels (each head gets channels/heads features)",
                   c->channels, c->heads);
  if (c->vocab < 2 || c->vocab > 65536)
    return err_set(FSDP_EINVAL, "vocab: %d is out of range; token files hold 16-bit ids, so "
                   "give 2 to 65536", c->vocab);
  if (c->context <= 0 || c->context > 1 << 20)
    return err_set(FSDP_EINVAL, "context: %d is out of range; give 1 to 1048576 positions",
                   c->context);
  return FSDP_OK;
}

size_t gpt_config_num_params(const gpt_config_t *c) {
  const size_t C = (size_t)c->channels, L = (size_t)c->layers;
  return (size_t)c->vocab * C + (size_t)c->context * C + 2 * C + L * (12 * C * C + 13 * C);
}

gpt_unit_t gpt_config_unit(const gpt_config_t *c, int u) {
  const size_t C = (size_t)c->channels, emb = ((size_t)c->vocab + (size_t)c->context + 2) * C;
  const size_t block = 12 * C * C + 13 * C;
  if (u == 0) return (gpt_unit_t){0, emb};
  return (gpt_unit_t){emb + (size_t)(u - 1) * block, block};
}

int gpt_config_logits_ld(const gpt_config_t *cfg) {
  return (cfg->vocab + GPT_LOGITS_ALIGN - 1) / GPT_LOGITS_ALIGN * GPT_LOGITS_ALIGN;
}

int gpt_config_logits_rows(const gpt_config_t *cfg, int chunk_mib) {
  const size_t row = (size_t)gpt_config_logits_ld(cfg) * sizeof(float);
  const size_t bytes = (size_t)(chunk_mib > 0 ? chunk_mib : GPT_LOGITS_CHUNK_MIB) << 20;
  size_t rows = bytes / (row ? row : 1);
  /* whole tiles of a GPU's products (128 rows) where there are several */
  if (rows > 128) rows -= rows % 128;
  return rows < 1 ? 1 : rows > INT32_MAX ? INT32_MAX : (int)rows;
}

/* Floats of activations + backward scratch for (B, T), excluding the int32
 * token arrays and the attention scratch (counted by the caller); att: the
 * floats a layer's attention keeps for backward (the kernel backend's
 * attention_saved); lrows: the logits' chunk. With
 * checkpointing, each block keeps only its output; the rest of a block's
 * activations live in one slot that backward refills by recomputing. */
static size_t gpt_config_act_floats(const gpt_config_t *c, size_t B, size_t T, int flags,
                                    size_t att, int lrows) {
  const size_t N = B * T, C = (size_t)c->channels, L = (size_t)c->layers;
  const size_t R = lrows > 0 && (size_t)lrows < N ? (size_t)lrows : N;
#define A(n) gpt_config_act_region((n), flags)
  /* all but res3: qkv (3 NC) and atty (NC), both in half under
   * GPT_ACT_BF16_QKV, res2 (NC), fch (4 NC, in half under GPT_ACT_BF16_FCH), GELU's output
   * (4 NC) and ln1, ln2 (NC each)
   * unless recomputed (these and lnf in half under GPT_ACT_BF16), the
   * norms' statistics (4 of N), the attention's */
  const size_t h = flags & GPT_ACT_BF16 ? 2 : 1; /* bf16: N C even (gpt_config_acts_bf16_fits) */
  const size_t gelu = flags & GPT_ACT_RECOMPUTE_GELU ? 0 : A(4 * N * C / h);
  const size_t ln = flags & GPT_ACT_RECOMPUTE_LN ? 0 : 2 * A(N * C / h);
  const size_t q16 = flags & GPT_ACT_BF16_QKV ? 2 : 1;
  const size_t qkv = A(3 * N * C / q16), atty = A(N * C / q16);
  const size_t fch = A(4 * N * C / (flags & GPT_ACT_BF16_FCH ? 2 : 1));
  size_t inner = qkv + atty + A(N * C) + fch + gelu + ln + 4 * A(N) + A(att);
  size_t layers = flags & GPT_ACT_CHECKPOINT ? L * A(N * C) + inner : L * (inner + A(N * C));
  size_t fwd = A(N * C) /* encoded */ + layers + A(N * C / h) + 2 * A(N) /* lnf */ +
               A(R * (size_t)gpt_config_logits_ld(c)) /* logits: one chunk */ + A(N) /* losses */;
  size_t bwd = 2 * A(N * C) /* dres, dln */ + 2 * A(4 * N * C) /* dbig1, dbig2 */;
#undef A
  return fwd + bwd;
}

size_t gpt_config_act_bytes(const gpt_config_t *cfg, int B, int T, int flags, size_t att,
                            int lrows) {
  return gpt_config_act_floats(cfg, (size_t)B, (size_t)T, flags, att, lrows) * sizeof(float) +
         2 * (size_t)B * (size_t)T * sizeof(int32_t);
}

int gpt_config_tensors(const gpt_config_t *cfg, gpt_tensor_t *t, int max) {
  const int C = cfg->channels, L = cfg->layers;
  const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
  int n = 0;
  size_t off = 0;
#define GPT_T(unit_, rows_, cols_, decay_, std_, val_, ...)                           \
  do {                                                                               \
    if (t && n < max) {                                                              \
      gpt_tensor_t *x = &t[n];                                                       \
      snprintf(x->name, sizeof x->name, __VA_ARGS__);                                \
      x->offset = off;                                                               \
      x->rows = (rows_);                                                             \
      x->cols = (cols_);                                                             \
      x->numel = (size_t)(rows_) * (size_t)(cols_);                                  \
      x->decay = (decay_);                                                           \
      x->unit = (unit_);                                                             \
      x->init_std = (std_);                                                          \
      x->init_value = (val_);                                                        \
    }                                                                                \
    off += (size_t)(rows_) * (size_t)(cols_);                                        \
    n++;                                                                             \
  } while (0)
  GPT_T(0, cfg->vocab, C, 1, std, 0.f, "wte");
  GPT_T(0, cfg->context, C, 1, 0.01f, 0.f, "wpe");
  GPT_T(0, 1, C, 0, 0.f, 1.f, "lnf.w");
  GPT_T(0, 1, C, 0, 0.f, 0.f, "lnf.b");
  for (int l = 0; l < L; l++) {
    GPT_T(1 + l, 1, C, 0, 0.f, 1.f, "h.%d.ln1.w", l);
    GPT_T(1 + l, 1, C, 0, 0.f, 0.f, "h.%d.ln1.b", l);
    GPT_T(1 + l, 3 * C, C, 1, std, 0.f, "h.%d.attn.qkv.w", l);
    GPT_T(1 + l, 1, 3 * C, 0, 0.f, 0.f, "h.%d.attn.qkv.b", l);
    GPT_T(1 + l, C, C, 1, proj_std, 0.f, "h.%d.attn.proj.w", l);
    GPT_T(1 + l, 1, C, 0, 0.f, 0.f, "h.%d.attn.proj.b", l);
    GPT_T(1 + l, 1, C, 0, 0.f, 1.f, "h.%d.ln2.w", l);
    GPT_T(1 + l, 1, C, 0, 0.f, 0.f, "h.%d.ln2.b", l);
    GPT_T(1 + l, 4 * C, C, 1, std, 0.f, "h.%d.mlp.fc.w", l);
    GPT_T(1 + l, 1, 4 * C, 0, 0.f, 0.f, "h.%d.mlp.fc.b", l);
    GPT_T(1 + l, C, 4 * C, 1, proj_std, 0.f, "h.%d.mlp.proj.w", l);
    GPT_T(1 + l, 1, C, 0, 0.f, 0.f, "h.%d.mlp.proj.b", l);
  }
#undef GPT_T
  return n;
}

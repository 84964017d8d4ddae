/* Unit tests of the model: configuration checks, parameter layout and units,
 * deterministic sharded-style initialisation, weights files, input checks,
 * and gradient accumulation. Numerical agreement with PyTorch is in
 * test_reference.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/common/err.h"
#include "daemon/common/mem.h"
#include "daemon/train/gpt.h"
#include "tests/unit/testutil.h"

static gpt_config_t tiny(void) {
  gpt_config_t c;
  cr_assert_eq(gpt_config_preset(&c, "tiny"), 0);
  return c;
}

Test(gpt, presets_and_unknown_preset) {
  gpt_config_t c;
  cr_assert_eq(gpt_config_preset(&c, "gpt2-124m"), 0);
  cr_assert_eq(c.layers, 12);
  cr_assert_eq(c.channels, 768);
  /* the published parameter count of GPT-2 small (tied embeddings, vocab 50257) */
  cr_assert_eq(gpt_config_num_params(&c), 124439808u);
  cr_assert_eq(gpt_config_preset(&c, "gpt2-1558m"), 0);
  cr_assert_eq(c.heads, 25);
  int rc = gpt_config_preset(&c, "gpt5");
  cr_assert_eq(rc, FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "gpt5") && strstr(err_msg(), "gpt2-350m"), "%s", err_msg());
}

Test(gpt, channels_not_divisible_by_heads_names_the_field) {
  gpt_config_t c = tiny();
  c.heads = 3; /* 64 % 3 != 0 */
  cr_assert_eq(gpt_config_validate(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "heads") && strstr(err_msg(), "divisible"), "%s", err_msg());
  gpt_t *g = (gpt_t *)1;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), FSDP_EINVAL);
  cr_assert_null(g);
  c = tiny();
  c.vocab = 70000;
  cr_assert_eq(gpt_config_validate(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "vocab"), "%s", err_msg());
}

Test(gpt, units_are_contiguous_blocks) {
  gpt_config_t c = tiny();
  c.layers = 3;
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  cr_assert_eq(gpt_num_units(g), 4);
  size_t next = 0;
  for (int u = 0; u < gpt_num_units(g); u++) {
    gpt_unit_t un = gpt_unit(g, u);
    cr_assert_eq(un.offset, next, "unit %d starts where the previous ends", u);
    next += un.numel;
  }
  cr_assert_eq(next, gpt_num_params(g));
  const size_t C = 64;
  cr_assert_eq(gpt_unit(g, 1).numel, 12 * C * C + 13 * C, "a block's parameters");
  for (int k = 0; k < gpt_num_tensors(g); k++) {
    const gpt_tensor_t *t = gpt_tensor(g, k);
    gpt_unit_t un = gpt_unit(g, t->unit);
    cr_assert(t->offset >= un.offset && t->offset + t->numel <= un.offset + un.numel, "%s", t->name);
    cr_assert_eq(t->decay, t->rows > 1, "%s: decay exactly on matrices", t->name);
  }
  int k = gpt_find_tensor(g, "h.2.mlp.proj.w");
  cr_assert_geq(k, 0);
  cr_assert_eq(gpt_tensor(g, k)->unit, 3);
  cr_assert_eq(gpt_find_tensor(g, "h.3.ln1.w"), -1);
  gpt_destroy(g);
}

Test(gpt, init_is_bit_identical_for_any_split) {
  gpt_config_t c = tiny();
  size_t n = gpt_config_num_params(&c);
  float *whole = malloc(n * sizeof *whole), *parts = malloc(n * sizeof *parts);
  gpt_init_range(&c, 42, 0, n, whole);
  for (int world = 2; world <= 4; world++) {
    memset(parts, 0xff, n * sizeof *parts);
    size_t shard = (n + (size_t)world - 1) / (size_t)world;
    for (int r = 0; r < world; r++) {
      size_t lo = (size_t)r * shard, hi = lo + shard < n ? lo + shard : n;
      gpt_init_range(&c, 42, lo, hi, parts + lo);
    }
    cr_assert_eq(memcmp(whole, parts, n * sizeof *parts), 0, "world %d", world);
  }
  float *other = malloc(n * sizeof *other);
  gpt_init_range(&c, 43, 0, n, other);
  cr_assert_neq(memcmp(whole, other, n * sizeof *other), 0, "another seed, other weights");
  /* GPT-2 init: wte ~ N(0, 0.02), layernorm weights 1, biases 0 */
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  const gpt_tensor_t *wte = gpt_tensor(g, gpt_find_tensor(g, "wte"));
  double s = 0, s2 = 0;
  for (size_t i = 0; i < wte->numel; i++) s += whole[wte->offset + i], s2 += (double)whole[wte->offset + i] * whole[wte->offset + i];
  double mean = s / wte->numel, sd = sqrt(s2 / wte->numel - mean * mean);
  cr_assert(fabs(mean) < 0.002 && fabs(sd - 0.02) < 0.001, "mean %g sd %g", mean, sd);
  cr_assert_eq(whole[gpt_tensor(g, gpt_find_tensor(g, "h.1.ln2.w"))->offset + 5], 1.0f);
  cr_assert_eq(whole[gpt_tensor(g, gpt_find_tensor(g, "h.1.attn.qkv.b"))->offset + 5], 0.0f);
  gpt_destroy(g);
  free(whole);
  free(parts);
  free(other);
}

Test(gpt, weights_file_round_trip_and_corruption) {
  gpt_config_t c = tiny();
  gpt_t *g, *h;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 7);
  char *path = tu_path("w.bin");
  cr_assert_eq(gpt_save(g, path), 0, "%s", err_msg());
  cr_assert_eq(gpt_load(&h, path, kern_cpu()), 0, "%s", err_msg());
  cr_assert_eq(memcmp(gpt_get_config(h), &c, sizeof c), 0);
  cr_assert_eq(memcmp(gpt_params(g), gpt_params(h), gpt_num_params(g) * sizeof(float)), 0);
  gpt_destroy(h);
  /* truncated: keep the header and half the parameters */
  FILE *f = fopen(path, "rb");
  size_t n = 1024 + gpt_num_params(g) * 2;
  char *buf = malloc(n);
  cr_assert_eq(fread(buf, 1, n, f), n);
  fclose(f);
  char *bad = tu_path("trunc.bin");
  tu_write_file(bad, buf, n);
  cr_assert_eq(gpt_load(&h, bad, kern_cpu()), FSDP_EFORMAT);
  cr_assert_null(h);
  cr_assert(strstr(err_msg(), "truncated") && strstr(err_msg(), bad), "%s", err_msg());
  /* not a weights file */
  buf[0] ^= 0x55;
  tu_write_file(bad, buf, n);
  cr_assert_eq(gpt_load(&h, bad, kern_cpu()), FSDP_EFORMAT);
  cr_assert(strstr(err_msg(), "not an fsdpd weights file"), "%s", err_msg());
  /* missing directory: an error, and nothing left behind */
  cr_assert_neq(gpt_save(g, "/nonexistent-dir/w.bin"), 0);
  cr_assert(strstr(err_msg(), "/nonexistent-dir/w.bin"), "%s", err_msg());
  /* a FIFO (or a device) at the path is refused, not renamed over */
  char *fifo = tu_path("w.fifo");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(gpt_save(g, fifo), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "is a FIFO") && strstr(err_msg(), fifo), "%s", err_msg());
  struct stat st;
  cr_assert(!stat(fifo, &st) && S_ISFIFO(st.st_mode), "the FIFO was replaced");
  free(fifo);
  free(buf);
  free(bad);
  free(path);
  gpt_destroy(g);
}

static void fill_tokens(int32_t *x, size_t n, int V, uint64_t seed) {
  for (size_t i = 0; i < n; i++) x[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)V);
}

Test(gpt, bad_inputs_are_errors_that_name_the_field) {
  gpt_config_t c = tiny();
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 1);
  int32_t in[2 * 65], tg[2 * 65];
  fill_tokens(in, 130, c.vocab, 1);
  fill_tokens(tg, 130, c.vocab, 2);
  float loss;
  cr_assert_eq(gpt_forward(g, in, tg, 0, 8, &loss), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "batch"), "%s", err_msg());
  cr_assert_eq(gpt_forward(g, in, tg, -3, 8, &loss), FSDP_EINVAL);
  cr_assert_eq(gpt_forward(g, in, tg, 2, 65, &loss), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "seq_len") && strstr(err_msg(), "context 64"), "%s", err_msg());
  in[11] = 256;
  cr_assert_eq(gpt_forward(g, in, tg, 2, 8, &loss), FSDP_ERANGE);
  cr_assert(strstr(err_msg(), "token id 256 at position 11"), "%s", err_msg());
  in[11] = 3;
  tg[5] = -1;
  cr_assert_eq(gpt_forward(g, in, tg, 2, 8, &loss), FSDP_ERANGE);
  cr_assert(strstr(err_msg(), "targets"), "%s", err_msg());
  tg[5] = 3;
  cr_assert_eq(gpt_forward(g, in, NULL, 2, 8, NULL), 0);
  cr_assert_eq(gpt_backward(g, 1.0f), FSDP_EINVAL, "backward needs a forward with targets");
  gpt_destroy(g);
}

/* The loss of a forward with targets is the mean of -log softmax(logits)[target],
 * recomputed here in double from the logits of a forward without targets. */
Test(gpt, loss_matches_logits) {
  gpt_config_t c = tiny();
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 3);
  enum { B = 3, T = 17 };
  int32_t in[B * T], tg[B * T];
  fill_tokens(in, B * T, c.vocab, 5);
  fill_tokens(tg, B * T, c.vocab, 6);
  cr_assert_eq(gpt_forward(g, in, NULL, B, T, NULL), 0);
  const float *lg = gpt_logits(g);
  double want = 0;
  for (int i = 0; i < B * T; i++) {
    const float *r = lg + (size_t)i * gpt_logits_ld(g);
    double mx = r[0], s = 0;
    for (int v = 1; v < c.vocab; v++) mx = fmax(mx, r[v]);
    for (int v = 0; v < c.vocab; v++) s += exp(r[v] - mx);
    want += -(r[tg[i]] - mx - log(s));
  }
  want /= B * T;
  float loss;
  cr_assert_eq(gpt_forward(g, in, tg, B, T, &loss), 0);
  cr_assert(fabs(loss - want) < 1e-5 * want, "loss %f want %f", loss, want);
  cr_assert(fabs(want - log(256.0)) < 0.1, "an untrained model is near ln(vocab): %f", want);
  gpt_destroy(g);
}

/* One batch of 4 gives the gradient of two batches of 2 accumulated with scale 1/2. */
Test(gpt, gradient_accumulation_equals_full_batch) {
  gpt_config_t c = tiny();
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 9);
  enum { B = 4, T = 16 };
  int32_t in[B * T], tg[B * T];
  fill_tokens(in, B * T, c.vocab, 10);
  fill_tokens(tg, B * T, c.vocab, 11);
  size_t n = gpt_num_params(g);
  float loss, *full = malloc(n * sizeof *full);
  gpt_zero_grad(g);
  cr_assert_eq(gpt_forward(g, in, tg, B, T, &loss), 0);
  cr_assert_eq(gpt_backward(g, 1.0f), 0);
  memcpy(full, gpt_grads(g), n * sizeof *full);
  gpt_zero_grad(g);
  for (int h = 0; h < 2; h++) {
    cr_assert_eq(gpt_forward(g, in + h * (B / 2) * T, tg + h * (B / 2) * T, B / 2, T, &loss), 0);
    cr_assert_eq(gpt_backward(g, 0.5f), 0);
  }
  double err = tu_rel_err_f32f32(gpt_grads(g), full, n);
  cr_assert(err < 1e-5, "accumulated vs full-batch gradient: rel err %g", err);
  double norm = 0;
  for (size_t i = 0; i < n; i++) norm += (double)full[i] * full[i];
  cr_assert(norm > 0, "gradients are not all zero");
  free(full);
  gpt_destroy(g);
}

/* A training step's forward (gpt_forward_train: the loss's gradient taken
 * with the loss) then backward: the loss and every gradient bit for bit as
 * gpt_forward then gpt_backward, at a micro-batch's scale; backward with
 * another scale than the forward took is refused, naming both. lrows: the
 * logits' chunk (0: all 60 rows at once; 7: nine chunks, the last of 4, so
 * forward_train runs the LM head's backward and gpt_backward recomputes it). */
static void forward_train_case(int lrows) {
  gpt_config_t c = tiny();
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 31);
  gpt_set_logits_rows(g, lrows);
  enum { B = 3, T = 20 };
  int32_t in[B * T], tg[B * T];
  fill_tokens(in, B * T, c.vocab, 32);
  fill_tokens(tg, B * T, c.vocab, 33);
  size_t n = gpt_num_params(g);
  float loss, floss, *ref = malloc(n * sizeof *ref);
  gpt_zero_grad(g);
  cr_assert_eq(gpt_forward(g, in, tg, B, T, &loss), 0);
  cr_assert_eq(gpt_backward(g, 0.25f), 0);
  memcpy(ref, gpt_grads(g), n * sizeof *ref);
  gpt_zero_grad(g);
  cr_assert_eq(gpt_forward_train(g, in, tg, B, T, 0.25f, &floss), 0, "%s", err_msg());
  cr_assert_eq(gpt_backward(g, 0.25f), 0, "%s", err_msg());
  cr_expect(!memcmp(&loss, &floss, sizeof loss), "loss %.9g, fused %.9g", loss, floss);
  cr_expect(!memcmp(ref, gpt_grads(g), n * sizeof *ref), "gradients differ from unfused");
  double norm = 0;
  for (size_t i = 0; i < n; i++) norm += (double)ref[i] * ref[i];
  cr_assert(norm > 0, "gradients are not all zero");
  /* the dlogits are spent: neither logits nor another backward's */
  cr_expect_null(gpt_logits(g), "gpt_logits after backward");
  cr_expect_eq(gpt_backward(g, 0.25f), FSDP_EINVAL, "a second backward");
  cr_expect(strstr(err_msg(), "already ran"), "%s", err_msg());
  cr_assert_eq(gpt_forward_train(g, in, tg, B, T, 0.25f, &floss), 0);
  cr_expect_eq(gpt_backward(g, 0.5f), FSDP_EINVAL);
  cr_expect(strstr(err_msg(), "0.5") && strstr(err_msg(), "0.25"), "%s", err_msg());
  cr_expect_eq(gpt_backward(g, 0.25f), 0, "the right scale after a refused one: %s", err_msg());
  cr_expect_eq(gpt_forward_train(g, in, NULL, B, T, 1.0f, &floss), FSDP_EINVAL);
  /* the layout changed between a forward and its backward: refused, never a
   * backward of nothing that reports success (helper-52) */
  cr_assert_eq(gpt_forward_train(g, in, tg, B, T, 0.25f, &floss), 0);
  gpt_set_logits_rows(g, lrows ? 0 : 7);
  cr_expect_eq(gpt_backward(g, 0.25f), FSDP_EINVAL, "a backward after the chunk changed");
  cr_expect(strstr(err_msg(), "changed since"), "%s", err_msg());
  cr_assert_eq(gpt_forward(g, in, tg, B, T, &floss), 0);
  gpt_set_checkpointing(g, 1);
  cr_expect_eq(gpt_backward(g, 0.25f), FSDP_EINVAL, "a backward after checkpointing changed");
  free(ref);
  gpt_destroy(g);
}

Test(gpt, forward_train_equals_forward_then_backward) { forward_train_case(0); }
Test(gpt, forward_train_equals_forward_then_backward_in_chunks) { forward_train_case(7); }

/* The LM head over chunks of the rows: the loss and every gradient of
 * forward_train + backward as with all rows' logits at once (to fp32
 * rounding: wte's gradient sums the chunks in another order), with
 * (N - lrows) rows of logits fewer held; a forward without targets keeps the
 * last rows' logits, the same as the unchunked ones, and names the rows it
 * kept when asked for an earlier one. */
Test(gpt, logits_in_chunks_train_the_same_in_less_memory) {
  gpt_config_t c = tiny();
  enum { B = 3, T = 20, N = B * T, R = 7 };
  int32_t in[N], tg[N];
  fill_tokens(in, N, c.vocab, 42);
  fill_tokens(tg, N, c.vocab, 43);
  gpt_t *g[2];
  float loss[2], last[2][256];
  size_t acts[2];
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(gpt_create(&g[k], &c, kern_cpu()), 0);
    gpt_init_weights(g[k], 41);
    gpt_set_logits_rows(g[k], k ? R : 0);
    const size_t before = mem_current(MEM_ACTS);
    gpt_zero_grad(g[k]);
    cr_assert_eq(gpt_forward_train(g[k], in, tg, B, T, 1.0f, &loss[k]), 0, "%s", err_msg());
    cr_assert_eq(gpt_backward(g[k], 1.0f), 0, "%s", err_msg());
    acts[k] = mem_current(MEM_ACTS) - before;
    cr_assert_eq(gpt_forward(g[k], in, NULL, B, T, NULL), 0, "%s", err_msg());
    cr_assert_eq(gpt_copy_logits(g[k], N - 1, last[k]), 0, "%s", err_msg());
  }
  cr_expect(fabsf(loss[0] - loss[1]) <= 1e-6f * loss[0], "loss %.9g, in chunks %.9g", loss[0],
            loss[1]);
  const size_t n = gpt_num_params(g[0]);
  double err = tu_rel_err_f32f32(gpt_grads(g[1]), gpt_grads(g[0]), n);
  cr_expect(err < 1e-6, "gradients in chunks: relative error %g", err);
  const size_t wte = (size_t)c.vocab * c.channels; /* wte comes first */
  cr_expect(tu_rel_err_f32f32(gpt_grads(g[1]), gpt_grads(g[0]), wte) < 1e-6);
  cr_expect_eq(acts[0] - acts[1], (size_t)(N - R) * gpt_logits_ld(g[0]) * sizeof(float),
               "activations %zu, in chunks %zu", acts[0], acts[1]);
  cr_expect(tu_rel_err_f32f32(last[1], last[0], (size_t)c.vocab) < 1e-6, "the last row's logits");
  cr_expect_not_null(gpt_logits(g[0]));
  cr_expect_null(gpt_logits(g[1]), "not all rows' logits are kept");
  cr_expect_eq(gpt_copy_logits(g[1], N - R - 1, last[1]), FSDP_EINVAL);
  cr_expect(strstr(err_msg(), "last 7 rows") && strstr(err_msg(), "rows 53 to 59"), "%s",
            err_msg());
  gpt_destroy(g[0]);
  gpt_destroy(g[1]);
}

/* ---- activation checkpointing and unit hooks ----------------------------- */

static void fwd_bwd(gpt_t *g, const int32_t *in, const int32_t *tg, int B, int T, float *loss) {
  gpt_zero_grad(g);
  cr_assert_eq(gpt_forward(g, in, tg, B, T, loss), 0, "%s", err_msg());
  cr_assert_eq(gpt_backward(g, 1.0f), 0, "%s", err_msg());
}

Test(gpt, checkpointing_same_gradients_less_memory) {
  gpt_config_t c = tiny();
  c.layers = 4;
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 21);
  enum { B = 2, T = 24 };
  int32_t in[B * T], tg[B * T];
  fill_tokens(in, B * T, c.vocab, 22);
  fill_tokens(tg, B * T, c.vocab, 23);
  size_t n = gpt_num_params(g);
  float loss0, loss1, *ref = malloc(n * sizeof *ref);
  fwd_bwd(g, in, tg, B, T, &loss0);
  size_t acts_plain = mem_current(MEM_ACTS);
  memcpy(ref, gpt_grads(g), n * sizeof *ref);
  gpt_set_checkpointing(g, 1);
  fwd_bwd(g, in, tg, B, T, &loss1);
  size_t acts_ckpt = mem_current(MEM_ACTS);
  cr_assert_eq(loss0, loss1);
  cr_assert_eq(memcmp(ref, gpt_grads(g), n * sizeof *ref), 0,
               "recomputing a block gives the same gradients bit for bit");
  /* three of four blocks keep only their output (N*C floats) */
  size_t N = B * T, C = c.channels;
  size_t att = (size_t)B * c.heads * T; /* the CPU keeps a log-sum-exp a row */
  cr_assert_eq(kern_cpu()->attention_saved(B, T, c.channels, c.heads), att);
  size_t inner = 15 * N * C + 4 * N + att;
  cr_assert_eq(gpt_config_act_bytes(&c, B, T, 0, att, 0) -
                   gpt_config_act_bytes(&c, B, T, 1, att, 0),
               3 * inner * sizeof(float));
  cr_assert_leq(acts_ckpt, acts_plain, "the block was reused, not grown");
  gpt_destroy(g);
  /* a fresh model with checkpointing holds the smaller block */
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 21);
  gpt_set_checkpointing(g, 1);
  size_t before = mem_current(MEM_ACTS);
  fwd_bwd(g, in, tg, B, T, &loss1);
  cr_assert_eq(acts_plain - (mem_current(MEM_ACTS) - before), 3 * inner * sizeof(float));
  cr_assert_eq(memcmp(ref, gpt_grads(g), n * sizeof *ref), 0);
  gpt_destroy(g);
  free(ref);
}

/* What no block keeps, computed again in backward (recompute 1: GELU's
 * output; 2: and the layernorms'): the same loss and gradients bit for bit,
 * with and without activation checkpointing, and 4 (1) or 6 (2) x C floats
 * a token less per kept block (the plan's count, held). */
Test(gpt, recompute_same_gradients_less_memory) {
  gpt_config_t c = tiny();
  c.layers = 3;
  enum { B = 2, T = 24 };
  int32_t in[B * T], tg[B * T];
  fill_tokens(in, B * T, c.vocab, 52);
  fill_tokens(tg, B * T, c.vocab, 53);
  for (int ck = 0; ck < 2; ck++) {
    gpt_t *g[3];
    float loss[3];
    size_t acts[3];
    for (int r = 0; r < 3; r++) {
      cr_assert_eq(gpt_create(&g[r], &c, kern_cpu()), 0);
      gpt_init_weights(g[r], 51);
      gpt_set_checkpointing(g[r], ck);
      gpt_set_recompute(g[r], r);
      const size_t before = mem_current(MEM_ACTS);
      fwd_bwd(g[r], in, tg, B, T, &loss[r]);
      acts[r] = mem_current(MEM_ACTS) - before;
    }
    const size_t n = gpt_num_params(g[0]);
    const size_t kept = ck ? 1 : (size_t)c.layers; /* blocks holding their activations */
    const size_t row = B * T * (size_t)c.channels * sizeof(float);
    for (int r = 1; r < 3; r++) {
      cr_expect(!memcmp(&loss[0], &loss[r], sizeof loss[0]), "loss %.9g, recompute %d %.9g",
                loss[0], r, loss[r]);
      cr_expect(!memcmp(gpt_grads(g[0]), gpt_grads(g[r]), n * sizeof(float)),
                "checkpointing %d: gradients differ with recompute %d", ck, r);
      cr_expect_eq(acts[0] - acts[r], kept * (r == 1 ? 4 : 6) * row,
                   "checkpointing %d, recompute %d: activations %zu, without %zu", ck, r,
                   acts[r], acts[0]);
    }
    for (int r = 0; r < 3; r++) gpt_destroy(g[r]);
  }
}

/* Hooks that behave like a sharded runtime: each unit's parameters are copied
 * into a fresh buffer on demand and poisoned (NaN) and freed on release, and
 * gradients go to per-unit buffers summed into a separate total when done. If
 * the model touched a unit outside its params..release window, or missed a
 * gradient, the results would differ from the flat path. */
typedef struct hook_ctx {
  gpt_t *g;
  float *live[64];   /* gathered parameters per unit */
  float *gbuf[64];   /* unit gradients between grads and grads_done */
  float *total;      /* gradients delivered by grads_done */
  int held, max_held;
  char log[512];
} hook_ctx_t;

static void hook_note(hook_ctx_t *x, const char *what, int unit) {
  size_t n = strlen(x->log);
  snprintf(x->log + n, sizeof x->log - n, "%s%d ", what, unit);
}

static int hk_params(void *ctx, int unit, int phase, float **out, const uint16_t **out16) {
  hook_ctx_t *x = ctx;
  (void)phase;
  gpt_unit_t u = gpt_unit(x->g, unit);
  cr_assert_null(x->live[unit], "unit %d asked for twice without release", unit);
  x->live[unit] = malloc(u.numel * sizeof(float));
  memcpy(x->live[unit], gpt_params(x->g) + u.offset, u.numel * sizeof(float));
  if (++x->held > x->max_held) x->max_held = x->held;
  hook_note(x, "p", unit);
  *out = x->live[unit];
  *out16 = NULL; /* the CPU's products pack nothing */
  return 0;
}

static int hk_release(void *ctx, int unit, int phase) {
  hook_ctx_t *x = ctx;
  (void)phase;
  gpt_unit_t u = gpt_unit(x->g, unit);
  cr_assert_not_null(x->live[unit]);
  for (size_t i = 0; i < u.numel; i++) x->live[unit][i] = NAN;
  free(x->live[unit]);
  x->live[unit] = NULL;
  x->held--;
  hook_note(x, "r", unit);
  return 0;
}

static int hk_grads(void *ctx, int unit, float **out) {
  hook_ctx_t *x = ctx;
  gpt_unit_t u = gpt_unit(x->g, unit);
  cr_assert_null(x->gbuf[unit]);
  x->gbuf[unit] = calloc(u.numel, sizeof(float));
  hook_note(x, "g", unit);
  *out = x->gbuf[unit];
  return 0;
}

static int hk_done(void *ctx, int unit) {
  hook_ctx_t *x = ctx;
  gpt_unit_t u = gpt_unit(x->g, unit);
  for (size_t i = 0; i < u.numel; i++) x->total[u.offset + i] += x->gbuf[unit][i];
  free(x->gbuf[unit]);
  x->gbuf[unit] = NULL;
  hook_note(x, "d", unit);
  return 0;
}

Test(gpt, unit_hooks_see_every_use_in_order) {
  gpt_config_t c = tiny();
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 31);
  enum { B = 2, T = 16 };
  int32_t in[B * T], tg[B * T];
  fill_tokens(in, B * T, c.vocab, 32);
  fill_tokens(tg, B * T, c.vocab, 33);
  size_t n = gpt_num_params(g);
  float loss_flat, loss_hooked, *ref = malloc(n * sizeof *ref);
  fwd_bwd(g, in, tg, B, T, &loss_flat);
  memcpy(ref, gpt_grads(g), n * sizeof *ref);

  hook_ctx_t x = {.g = g, .total = calloc(n, sizeof(float))};
  gpt_unit_hooks_t h = {&x, hk_params, hk_release, hk_grads, hk_done};
  gpt_set_hooks(g, &h);
  gpt_set_checkpointing(g, 1);
  fwd_bwd(g, in, tg, B, T, &loss_hooked);
  cr_assert_eq(loss_flat, loss_hooked);
  cr_assert_eq(memcmp(ref, x.total, n * sizeof *ref), 0, "gradients through the hooks");
  double zero = 0;
  for (size_t i = 0; i < n; i++) zero += fabs(gpt_grads(g)[i]);
  cr_assert_eq(zero, 0, "nothing written to the flat gradients behind the hooks' back");
  cr_assert_eq(x.max_held, 1, "one unit's parameters at a time");
  cr_assert_str_eq(x.log, "p0 r0 p1 r1 p2 r2 p0 r0 p0 g0 r0 p2 g2 r2 d2 p1 g1 r1 d1 d0 ");
  gpt_set_hooks(g, NULL);
  free(x.total);
  free(ref);
  gpt_destroy(g);
}

Test(gpt, shell_has_no_buffers_and_needs_hooks) {
  gpt_config_t c = tiny();
  size_t before = mem_total_current();
  gpt_t *g;
  cr_assert_eq(gpt_create_shell(&g, &c, kern_cpu()), 0);
  cr_assert_null(gpt_params(g));
  cr_assert_null(gpt_grads(g));
  cr_assert_eq(mem_total_current(), before, "a shell allocates no parameters or gradients");
  cr_assert_eq(gpt_num_params(g), gpt_config_num_params(&c));
  int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  cr_assert_eq(gpt_forward(g, in, in, 1, 8, NULL), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "gpt_create_shell") && strstr(err_msg(), "hooks"), "%s", err_msg());
  gpt_zero_grad(g); /* nothing to zero: no crash */
  gpt_destroy(g);
}

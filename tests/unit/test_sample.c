/* Tests of sampling: reproducible for a seed, greedy at a low temperature,
 * bad arguments refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/train/sample.h"

static gpt_t *model(void) {
  gpt_config_t c;
  cr_assert_eq(gpt_config_preset(&c, "tiny"), 0);
  c.context = 16; /* shorter than prompt + new tokens: the window slides */
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 5);
  return g;
}

Test(sample, same_seed_same_text_other_seed_other_text) {
  gpt_t *g = model();
  int32_t prompt[3] = {'a', 'b', 'c'}, x[24], y[24], z[24];
  cr_assert_eq(sample_tokens(g, prompt, 3, 24, 1.0f, 7, x), 0, "%s", err_msg());
  cr_assert_eq(sample_tokens(g, prompt, 3, 24, 1.0f, 7, y), 0);
  cr_assert_eq(sample_tokens(g, prompt, 3, 24, 1.0f, 8, z), 0);
  cr_assert_eq(memcmp(x, y, sizeof x), 0);
  cr_assert_neq(memcmp(x, z, sizeof x), 0);
  for (int i = 0; i < 24; i++) cr_assert(x[i] >= 0 && x[i] < 256);
  gpt_destroy(g);
}

/* At a tiny temperature each token is the argmax of the model's logits. */
Test(sample, low_temperature_is_greedy) {
  gpt_t *g = model();
  int32_t seq[32] = {'h', 'i'}, out[10];
  cr_assert_eq(sample_tokens(g, seq, 2, 10, 1e-4f, 1, out), 0);
  for (int k = 0; k < 10; k++) {
    int len = 2 + k, T = len < 16 ? len : 16;
    cr_assert_eq(gpt_forward(g, seq + len - T, NULL, 1, T, NULL), 0);
    const float *lg = gpt_logits(g) + (size_t)(T - 1) * gpt_logits_ld(g);
    int best = 0;
    for (int v = 1; v < 256; v++)
      if (lg[v] > lg[best]) best = v;
    cr_assert_eq(out[k], best, "token %d: sampled %d, argmax %d", k, out[k], best);
    seq[len] = best;
  }
  gpt_destroy(g);
}

Test(sample, bad_arguments) {
  gpt_t *g = model();
  int32_t prompt[1] = {1}, out[4];
  cr_assert_eq(sample_tokens(g, prompt, 0, 4, 1.0f, 1, out), FSDP_EINVAL);
  cr_assert_eq(sample_tokens(g, prompt, 1, 4, 0.0f, 1, out), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "temperature"), "%s", err_msg());
  prompt[0] = 300;
  cr_assert_eq(sample_tokens(g, prompt, 1, 4, 1.0f, 1, out), FSDP_ERANGE);
  gpt_destroy(g);
}

/* What sample_print writes for these ids into a string. */
static char *printed(const int32_t *ids, int n, int vocab) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  sample_print(f, ids, n, vocab);
  fclose(f);
  return buf;
}

/* Byte samples of a UTF-8 corpus read as text: whole printable characters
 * as they are (they were all '.'), a control byte, a lone continuation byte,
 * a character cut short or an overlong form as '.'; other vocabularies as
 * ids. */
Test(sample, bytes_print_as_utf8_text) {
  const char *text = "caf\xc3\xa9 \xe2\x82\xac\n\xf0\x9f\x99\x82\t!";
  int32_t ids[64];
  int n = 0;
  for (const char *p = text; *p; p++) ids[n++] = (uint8_t)*p;
  char *s = printed(ids, n, 256);
  cr_assert_str_eq(s, "caf\xc3\xa9 \xe2\x82\xac\n\xf0\x9f\x99\x82\t!\n");
  free(s);
  /* 0x01, a lone 0x80, e-acute cut short before 'x', the overlong 0xc0 0xaf */
  const int32_t bad[] = {'a', 0x01, 0x80, 0xc3, 'x', 0xc0, 0xaf, 'z'};
  s = printed(bad, 8, 256);
  cr_assert_str_eq(s, "a...x..z\n");
  free(s);
  const int32_t tok[] = {50256, 7, 0};
  s = printed(tok, 3, 50257);
  cr_assert_str_eq(s, "50256 7 0\n");
  free(s);
}

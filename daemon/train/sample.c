/* sample: autoregressive sampling (see sample.h). */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unictype.h>
#include <unistr.h>

#include "daemon/common/err.h"
#include "daemon/common/rng.h"
#include "daemon/common/mem.h"

int sample_tokens(gpt_t *g, const int32_t *prompt, int n_prompt, int n_new, float temperature,
                  uint64_t seed, int32_t *out) {
  const gpt_config_t *c = gpt_get_config(g);
  if (n_prompt < 1) return err_set(FSDP_EINVAL, "sample: the prompt needs at least one token");
  if (!(temperature > 0)) return err_set(FSDP_EINVAL, "sample: temperature must be positive");
  size_t total = (size_t)n_prompt + (size_t)n_new;
  int32_t *seq = mem_alloc(MEM_WORKSPACE, total * sizeof *seq, "sampled tokens");
  float *lg = seq ? mem_alloc(MEM_WORKSPACE, (size_t)c->vocab * sizeof *lg, "logits of a sample") : NULL;
  if (!lg) {
    mem_free(seq);
    return FSDP_ENOMEM;
  }
  memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
  int rc = FSDP_OK;
  for (int k = 0; k < n_new && !rc; k++) {
    int len = n_prompt + k, T = len < c->context ? len : c->context;
    if ((rc = gpt_forward(g, seq + len - T, NULL, 1, T, NULL)) ||
        (rc = gpt_copy_logits(g, T - 1, lg)))
      break;
    float mx = lg[0];
    for (int v = 1; v < c->vocab; v++) mx = fmaxf(mx, lg[v]);
    double sum = 0;
    for (int v = 0; v < c->vocab; v++) sum += exp((lg[v] - mx) / temperature);
    double u = rng_unit(rng_next(&seed)) * sum, acc = 0;
    int pick = c->vocab - 1;
    for (int v = 0; v < c->vocab; v++) {
      acc += exp((lg[v] - mx) / temperature);
      if (u < acc) {
        pick = v;
        break;
      }
    }
    seq[len] = pick;
  }
  if (!rc) memcpy(out, seq + n_prompt, (size_t)n_new * sizeof *out);
  mem_free(lg);
  mem_free(seq);
  return rc;
}

void sample_print(FILE *f, const int32_t *ids, int n, int vocab) {
  if (vocab != 256) {
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? " " : "", ids[i]);
    fputc('\n', f);
    return;
  }
  /* bytes: whole printable UTF-8 characters as they are (a corpus in any
   * language reads as text), '.' for a control byte or one that is not
   * part of a valid character (a model mid-training makes those) */
  uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
  if (!b) return;
  for (int i = 0; i < n; i++) b[i] = (uint8_t)ids[i];
  for (int i = 0; i < n;) {
    ucs4_t uc;
    const int k = u8_mbtoucr(&uc, b + i, (size_t)(n - i));
    if (k > 0 && (uc == '\n' || uc == '\t' || uc_is_print(uc))) {
      fwrite(b + i, 1, (size_t)k, f);
      i += k;
    } else {
      fputc('.', f);
      i++;
    }
  }
  fputc('\n', f);
  free(b);
}

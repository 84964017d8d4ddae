/* sample: text generation from a trained model, for looking at what it learned.
 * Plain autoregressive sampling: each new token re-runs the forward pass over
 * the last `context` tokens (no KV cache: this is a check, not a server). */
#ifndef FSDP_SAMPLE_H
#define FSDP_SAMPLE_H

#include <stdint.h>
#include <stdio.h>

#include "gpt.h"

/* Continues prompt (n_prompt >= 1 ids) by n_new tokens sampled at temperature
 * (> 0; lower is greedier) from a stream seeded by seed, writing them to out. */
int sample_tokens(gpt_t *g, const int32_t *prompt, int n_prompt, int n_new, float temperature,
                  uint64_t seed, int32_t *out);

/* Prints ids as text when the vocabulary is bytes (vocab 256): printable
 * UTF-8 characters, newline and tab as they are, '.' for any other byte (a
 * control byte, or one not part of a valid character); otherwise as
 * space-separated ids. */
void sample_print(FILE *f, const int32_t *ids, int n, int vocab);

#endif

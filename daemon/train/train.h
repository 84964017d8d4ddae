/* train: the single-rank training loop: data, model, AdamW, schedule, clipping,
 * evaluation and progress. The sharded runtime and the control plane run the
 * same loop. */
#ifndef FSDP_TRAIN_H
#define FSDP_TRAIN_H

#include <stdio.h>

#include "config.h"

typedef struct train_result {
  int steps_done;
  float first_loss;      /* training loss of step 1 */
  float last_loss;       /* training loss of the last step */
  float eval_loss;       /* last evaluation (NAN if none) */
  double tokens_per_s;   /* over steps after the first */
  double seconds;
  size_t mem_peak;       /* accounting allocator peak, bytes */
  size_t mem_planned;    /* what the plan predicted, bytes */
} train_result_t;

/* Learning rate at step (0-based): linear warmup, then cosine to min_lr_frac * lr. */
float train_lr(const config_t *c, int step);
/* Runs c (validated here) and prints a progress line per step to progress
 * (NULL: silent). */
int train_run(const config_t *c, FILE *progress, train_result_t *res);

#endif

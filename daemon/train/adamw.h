/* adamw: the AdamW optimizer over a model's flat parameters: owns the m and v
 * state (fp32, same layout as the parameters) and the step count. Weight decay
 * is decoupled and applies only to tensors marked decay (matrices, embeddings);
 * biases and norm parameters are never decayed. */
#ifndef FSDP_ADAMW_H
#define FSDP_ADAMW_H

#include "gpt.h"

typedef struct adamw_hparams {
  float beta1, beta2, eps, weight_decay;
} adamw_hparams_t;

typedef struct adamw adamw_t;

int adamw_create(adamw_t **out, const gpt_t *g, adamw_hparams_t hp);
void adamw_destroy(adamw_t *o);
/* One step at learning rate lr on the model's params with its grads. */
void adamw_step(adamw_t *o, gpt_t *g, float lr);
int adamw_step_count(const adamw_t *o);
float *adamw_m(adamw_t *o);
float *adamw_v(adamw_t *o);

#endif

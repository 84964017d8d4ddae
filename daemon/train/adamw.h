/* adamw: the AdamW optimizer over a flat run of parameters: owns the m and v
 * state (fp32, the parameters' layout) and the step count. Weight decay is
 * decoupled and applies only to segments marked decay (matrices, embeddings);
 * biases and norm parameters are never decayed.
 *
 * The run is either a whole model (adamw_create: one segment per tensor) or
 * one rank's shards (adamw_create_segments, with the pieces of tensors that
 * fall in them): the update of an element does not depend on where it sits,
 * so sharded steps give the same bytes as the whole-model step.
 *
 * The state is fp32, or bf16 (adamw_create_segments_bf16, for bf16-true
 * training: m and v stored in bf16 and the step taken on bf16 parameters and
 * gradients). A bf16 step widens each chunk of p, g, m and v into a small
 * fp32 scratch, runs the same kernel, and rounds p, m and v back to bf16
 * (nearest-even): the update math exists once, and no fp32 copy of the whole
 * state is ever made. */
#ifndef FSDP_ADAMW_H
#define FSDP_ADAMW_H

#include "gpt.h"
#include "daemon/common/mem.h"
#include "daemon/job/plan.h"

typedef struct adamw_hparams {
  float beta1, beta2, eps, weight_decay;
} adamw_hparams_t;

/* A run of elements [offset, offset+numel) of the buffer with one decay
 * rule (kern.h's, which the backend's adamw_segs takes as it is). */
typedef kern_seg_t adamw_segment_t;

typedef struct adamw adamw_t;

/* For the model's whole flat buffer (on the model's backend). */
int adamw_create(adamw_t **out, const gpt_t *g, adamw_hparams_t hp);
/* For a buffer of n elements on be's device; elements in no segment (padding)
 * are left alone. m and v are allocated under cat (MEM_OPTIM, or MEM_OFFLOAD
 * when offloaded). */
int adamw_create_segments(adamw_t **out, const kern_backend_t *be, size_t n,
                          const adamw_segment_t *segs, int nsegs, adamw_hparams_t hp,
                          mem_cat_t cat);
/* The same with m and v in bf16 (2 bytes each per element, under cat), for
 * adamw_step_bf16; plus a fixed fp32 scratch (MEM_WORKSPACE, ADAMW_CHUNK
 * elements of each of p, g, m, v). */
#define ADAMW_CHUNK PLAN_ADAMW_CHUNK /* the plan counts it (daemon/job/plan.h) */
int adamw_create_segments_bf16(adamw_t **out, const kern_backend_t *be, size_t n,
                               const adamw_segment_t *segs, int nsegs, adamw_hparams_t hp,
                               mem_cat_t cat);
void adamw_destroy(adamw_t *o);
/* One step at learning rate lr on the model's params with its grads. */
void adamw_step(adamw_t *o, gpt_t *g, float lr);
/* One step on any device buffers of the optimizer's length; with params16
 * (or NULL), each stepped parameter's bf16 rounding stored there too (kern.h's
 * adamw_segs: the runtime's bf16 image of its fp32 master shard). Each
 * gradient is taken times gscale (1: as it is; else where
 * adamw_scales_grads): the step vec_scale(grads, gscale) then a step at 1
 * would take, grads left as they were (kern.h's adamw_segs_scaled). */
void adamw_step_buffers(adamw_t *o, float *params, uint16_t *params16, const float *grads,
                        float gscale, float lr);
/* Whether the backend scales the gradients in the step (adamw_step_buffers'
 * gscale other than 1). */
int adamw_scales_grads(const adamw_t *o);
/* One step on bf16 buffers (uint16 storage) of the optimizer's length; the
 * optimizer must have bf16 state. */
void adamw_step_bf16(adamw_t *o, uint16_t *params, const uint16_t *grads, float lr);
int adamw_step_count(const adamw_t *o);
/* Sets the step count (its bias correction): a resumed run's, from its checkpoint. */
void adamw_set_step_count(adamw_t *o, int t);
/* The state: fp32 (NULL for bf16 state) or bf16 (NULL for fp32 state). */
float *adamw_m(adamw_t *o);
float *adamw_v(adamw_t *o);
uint16_t *adamw_m_bf16(adamw_t *o);
uint16_t *adamw_v_bf16(adamw_t *o);

#endif

/* fsdp: the fully sharded runtime of one rank.
 *
 * A rank holds only its shard of every unit: master parameters, the reduced
 * gradient and the AdamW state (shard.h's layout), fp32 or bf16 by policy.
 * The model is a shell (gpt_create_shell) whose unit hooks this module
 * provides: a unit's shards are all-gathered from the shard group just before
 * use (the next unit's gather is issued while the current one computes) and
 * freed after it (FULL_SHARD, HYBRID_SHARD) or kept until backward is done
 * with it (SHARD_GRAD_OP, HYBRID_SHARD_ZERO2, NO_SHARD); a unit's gradient is
 * reduce-scattered (averaged) into the gradient shard as soon as backward has
 * produced it, and averaged across the replica group under HYBRID. Under
 * FULL_SHARD at most two units are gathered at any moment.
 *
 * Each rank trains on its own rows of the global batch with the loss averaged
 * over its tokens, so the averaged gradients are those of the global batch:
 * any mesh trains like one device. Precision: fp32; bf16-mixed (units
 * gathered in bf16, gradients reduced in fp32, fp32 master and AdamW state);
 * or bf16-true (the shard's parameters, gradient and AdamW m and v stored in
 * bf16: 8 bytes per shard element instead of 16; gathers and reductions in
 * bf16; the kernels compute in fp32 on widened values). Under bf16-true an
 * update smaller than half a bf16 ulp of its parameter (about 2^-9 of it) is
 * rounded away: small learning rates stall where fp32 would keep learning. */
#ifndef FSDP_FSDP_H
#define FSDP_FSDP_H

#include "adamw.h"
#include "daemon/job/plan.h"
#include "daemon/job/precision.h"
#include "daemon/job/shard.h"
#include "daemon/comm/comm.h"
#include "gpt.h"

/* Elements of a bf16 gradient shard converted to fp32 at a time under
 * bf16-true (a fixed 2 x FSDP_CHUNK fp32 workspace), and of the host stage
 * weights pass through: the plan counts them (daemon/job/plan.h). */
#define FSDP_CHUNK PLAN_FSDP_CHUNK

typedef struct fsdp_opts {
  const kern_backend_t *be; /* the device every buffer lives on and every op runs on */
  shard_mesh_t mesh;
  comm_t *shard_comm;   /* this rank's shard group (S ranks); NULL when S == 1 */
  comm_t *replica_comm; /* its replica group (R ranks); NULL when R == 1 */
  uint64_t seed;        /* initial weights: the same bytes as one device's */
  adamw_hparams_t hp;
  precision_t precision;
  int offload; /* parameter shard, gradient shard and AdamW state in host memory */
  size_t min_params; /* wrap policy: merge neighbouring units up to this size (0: one per block) */
} fsdp_opts_t;

typedef struct fsdp fsdp_t;

/* Builds the shell model, the layout and this rank's shards (initialised from
 * seed). The communicators stay the caller's. */
int fsdp_create(fsdp_t **out, const gpt_config_t *cfg, const fsdp_opts_t *o);
void fsdp_destroy(fsdp_t *f);
/* The model to run forward and backward on (its hooks are this runtime's). */
gpt_t *fsdp_model(fsdp_t *f);

/* Gradient accumulation: with defer set, the next backward keeps each unit's
 * gradient unsharded (memory: the whole model's gradients) and reduces
 * nothing; the first backward with defer clear reduces the sum once. With
 * defer always clear (the default) every micro-batch is reduce-scattered into
 * the gradient shard: less memory, one reduction per micro-batch. */
void fsdp_defer_reduce(fsdp_t *f, int defer);
/* Starts a step: zeroes the gradient shard. */
void fsdp_zero_grad(fsdp_t *f);
/* Ends a step: global gradient norm (over every shard), clipping to clip (0:
 * off), AdamW on the shard. *norm gets the norm before clipping. A NaN or
 * infinite norm is FSDP_ERANGE on every rank, and nothing is updated. */
int fsdp_step(fsdp_t *f, float lr, float clip, float *norm);
/* Whether this rank's parameter shard (and, with optimizer, its AdamW m and
 * v) holds only finite numbers: a diverged run's state is never saved. */
int fsdp_finite(fsdp_t *f, int optimizer);
/* Averages x over every rank (shard group, then replica group). */
int fsdp_mean(fsdp_t *f, float *x);
/* The same for n values at once (one collective per group). */
int fsdp_mean_n(fsdp_t *f, float *x, size_t n);
/* Gathers the whole model's parameters into dst (num_params fp32 floats;
 * bf16 storage widened, exactly), for checks; every rank of the shard group
 * must call it. */
int fsdp_gather_params(fsdp_t *f, float *dst);
/* Frees every gathered unit: after a forward-only pass (evaluation) under a
 * strategy that keeps parameters, or before a checkpoint. It completes the
 * reduction and the gathers in flight first: their failure is returned (the
 * units are freed all the same). */
int fsdp_reshard(fsdp_t *f);
/* Most units that were gathered (or being gathered) at the same time. */
int fsdp_max_gathered(const fsdp_t *f);
const shard_layout_t *fsdp_layout(const fsdp_t *f);
/* Loads this rank's shards from an fp32 weights file (gpt.h's format) or a
 * safetensors file in GPT-2's layout (daemon/job/safetensors.h), told apart
 * by their first bytes; only this rank's byte ranges are read, rounded to
 * bf16 (nearest-even) under bf16-true. */
int fsdp_load_weights(fsdp_t *f, const char *path);
/* Writes this rank's real elements into their byte ranges of fd, an open
 * fp32 weights file already sized; bf16 storage is widened exactly. Weights
 * pass through a fixed host stage of FSDP_CHUNK floats (MEM_WORKSPACE, held
 * by the runtime): no copy of a unit or of the shard is ever made. */
int fsdp_write_weights(fsdp_t *f, int fd, const char *path);
int fsdp_shard_rank(const fsdp_t *f);

/* The rank's training state, what a checkpoint saves and restores (device
 * pointers): the layout and this rank's place in it, the parameter shard
 * (shard_total elements of elem_bytes: fp32, or bf16 under bf16-true) and the
 * optimizer (its m, v and step count: adamw.h). The caller may write the
 * shard until the next gather: under bf16-mixed the runtime rounds its bf16
 * image of the shard anew before then (one pass over the shard, also after
 * a call that only read it: a checkpoint's save). */
typedef struct fsdp_state {
  const kern_backend_t *be; /* the device the buffers are on */
  const shard_layout_t *layout;
  int shard_rank;
  size_t elem_bytes;
  void *params;
  adamw_t *opt;
} fsdp_state_t;
void fsdp_state(fsdp_t *f, fsdp_state_t *st);

#endif

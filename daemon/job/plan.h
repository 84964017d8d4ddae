/* plan: the memory a job will need per rank, predicted before anything is
 * allocated, so a job that cannot fit is refused at start with the knob that
 * fixes it, not killed by the OOM killer an hour in.
 *
 * The prediction is per accounting category (mem.h) and exact: every byte the
 * runtime allocates goes through the accounting allocator, and the tests hold
 * each category's measured peak equal to the plan's, for one device and for
 * every strategy, precision and accumulation mode of the sharded runtime
 * (which one device runs too). On one fp32 device everything is held at
 * once, so the total is exact too; otherwise the transient categories
 * (gathered units, unsharded unit gradients) peak at different moments, and
 * the total, the sum of the category peaks, is an upper bound of the
 * measured peak. It does not count the process's code and libraries. */
#ifndef FSDP_PLAN_H
#define FSDP_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "daemon/common/mem.h"
#include "daemon/job/config.h"
#include "daemon/job/shard.h"

/* Fixed buffers of the runtime that the plan counts, defined here so the plan
 * (which links no runtime) and the runtime use one number: fsdp.c's host
 * stage and bf16-true gradient chunks (FSDP_CHUNK elements), and adamw.c's
 * bf16 step chunks (ADAMW_CHUNK). */
#define PLAN_FSDP_CHUNK 16384
#define PLAN_ADAMW_CHUNK 16384

typedef struct plan {
  size_t bytes[MEM__COUNT]; /* peak per accounting category */
  size_t total;             /* the sum of the peaks */
  /* what of it the device holds, which limits and admission compare with
   * its memory: total on a CPU device (host memory is its memory); on a GPU
   * the total less the categories kept in host memory (ckpt_snapshot,
   * host_offload: plan_host_bytes) */
  size_t device;
  int host_apart;           /* a GPU's plan: those categories are not on the device */
  int world;                /* ranks of the job */
  /* gradient accumulation's two modes (grad_accum > 1): the grads peak when
   * each micro-batch is reduce-scattered, and when unsharded gradients are
   * kept until the last one (keep_unsharded_grads) */
  size_t grads_reduce_each, grads_keep_unsharded;
} plan_t;

/* Predicts one rank of a job of c (after config_finish) on world ranks.
 * Errors: a strategy, mesh or precision that does not parse or fit. */
int plan_job(const config_t *c, int world, plan_t *p);
/* Whether rank holds an asynchronous checkpoint's snapshot when its job has
 * one: the first replica's ranks write checkpoints, a rank of another
 * replica holds the same shards and writes none. train.c allocates by it. */
int plan_rank_snapshots(const shard_mesh_t *m, int rank);
/* p, a job's plan (plan_job: the figures of a rank of the first replica,
 * the most any rank holds, which the fit check takes), as rank holds it:
 * without the snapshot where that rank has none. */
void plan_for_rank(plan_t *p, const shard_mesh_t *m, int rank);
/* Bytes of p kept in host memory apart from the device: a GPU plan's
 * ckpt_snapshot and host_offload; 0 on a CPU device. */
size_t plan_host_bytes(const plan_t *p);
/* Memory the host can give now (MemAvailable, or this process's control
 * group's room where less: hostmem.h), in bytes; 0 if unknown. */
size_t plan_host_available(void);
/* When p exceeds limit and c's recompute is left to the device (-1, which
 * is 0 on cuda), sets the least level that fits, and replans: 1 when it
 * did. Where none fits with an asynchronous checkpoint's snapshot, the
 * least that fits without it (0 and nothing changed when the device's
 * level does: plan_fit_snapshot then drops the snapshot), else 2. Before
 * plan_fit_snapshot: a snapshot is kept where recomputing makes room. */
int plan_fit_recompute(config_t *c, int world, plan_t *p, size_t limit);
/* When p exceeds limit only by an asynchronous checkpoint's snapshot, turns
 * checkpoint_async off in c (checkpoints are then written in place, the step
 * waiting) and replans: 1 when it did. */
int plan_fit_snapshot(config_t *c, int world, plan_t *p, size_t limit);
/* The same for the host memory a GPU's plan keeps apart (plan_host_bytes):
 * when it exceeds host_limit bytes (0: nothing to check) and dropping the
 * snapshot brings it within, turns checkpoint_async off in c and replans: 1
 * when it did. (The other host category, host_offload, is refused on a GPU
 * by config_finish.) */
int plan_fit_host(config_t *c, int world, plan_t *p, size_t host_limit);
/* FSDP_OK when p fits in limit bytes per rank (0: nothing to check);
 * otherwise an error that states both numbers, what takes the most, and the
 * first single change that makes the job fit (activation checkpointing,
 * FULL_SHARD, reducing every micro-batch, more ranks...). */
int plan_check(const plan_t *p, const config_t *c, size_t limit);
/* plan_check against a limit described by what ("the smallest device it
 * could land on"), which the message names as where the limit comes from. */
int plan_fits(const plan_t *p, const config_t *c, size_t limit, const char *what);
/* One line: "plan (MiB per rank): params=... total=...", and under grad
 * accumulation what the other mode would cost. */
void plan_print(const plan_t *p, const config_t *c, FILE *out);

#endif

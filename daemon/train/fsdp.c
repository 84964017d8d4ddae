/* fsdp: the sharded runtime of one rank (see fsdp.h).
 *
 * It owns the rank's shards (params, grads, AdamW state), the gathered unit
 * buffers and the unsharded gradient buffers, and drives the collectives from
 * the model's unit hooks. Everything it allocates goes through the accounting
 * allocator: params (the shard), params_gathered (units in flight), grads (the
 * shard and a unit's unsharded gradient), optimizer, comm, workspace (fp32
 * chunks of a bf16 shard). What a collective sends from or lands in (the
 * parameter shard, gathered units, unit gradients, the landing) is registered
 * memory on a host-memory device (daemon/comm/reg.c, same accounting), so the
 * ranks on this host read it in place instead of copying it through the
 * ring's links; device memory on any other device.
 *
 * Every buffer it reads or writes lives on the kernel backend's device and is
 * touched only through the backend's table (kernels/kern.h): set, copies,
 * vector ops. Weights move between files (or their initial values) and the
 * device through one small host staging buffer, a chunk at a time.
 *
 * On one rank (S = R = 1) nothing needs communicating: under fp32 a unit's
 * parameters are its shard and backward accumulates straight into the
 * gradient shard (no gathered copies, no unit gradients), which is exactly
 * what the flat model does, at its cost.
 *
 * Under bf16-true the shard is stored in bf16 and the kernels still compute in
 * fp32, so values are rounded (to nearest-even, the backend's f32_to_bf16) in
 * exactly these places, each marked "rounds:" below: a unit's gradient before
 * it is reduced (and the ring's partial sums, once per hop: comm.h), the
 * gradient shard when a reduced gradient is added to it or it is clipped, the
 * AdamW step (adamw.c), and weights initialised or loaded. Widening bf16 to
 * fp32 is exact. */
#include "fsdp.h"
#include "shard_rank.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "daemon/comm/reg.h"
#include "daemon/common/err.h"
#include "daemon/job/safetensors.h"
#include "daemon/common/log.h"
#include "daemon/common/mem.h"
#include "daemon/common/param.h"

struct fsdp {
  fsdp_opts_t opts;
  const kern_backend_t *be;
  gpt_t *model;           /* a shell: no flat buffers; its unit hooks are ours */
  shard_layout_t *layout; /* units, their padding and shards */
  int shards;             /* S: ranks of the shard group */
  int shard_rank;         /* which shard of every unit this rank owns */
  int keeps_params;       /* the strategy keeps units gathered from forward to backward */
  int gather_bf16;        /* units are gathered in bf16 (bf16-mixed and bf16-true) */
  int keep16;             /* the model's products read the bf16 gather (gpt_weights16): it
                           * stays beside the widened unit while the unit is gathered */
  /* under keep16, unit k's tensors the model reads in fp32 (gpt_tensor_fp32),
   * the only ones its gathers widen: wide_seg[wide_at[k] .. wide_at[k + 1])
   * (unit-local, neighbours merged); none for a unit whose every tensor is
   * read so (widened whole). NULL without the backend's bf16_to_f32_segs. */
  kern_seg_t *wide_seg;
  int *wide_at;
  int poison;             /* FSDP_GATHER_POISON: the rest of such a unit is NaN (tests) */
  int bf16_storage;       /* bf16-true: shard, gradient and reductions in bf16 */
  int alias_params;       /* S = 1 under fp32: a unit's parameters are its shard */
  int alias_grads;        /* S = R = 1, fp32 gradients: backward accumulates into the shard */
  comm_dtype_t reduce_dtype;
  int defer_reduce;       /* keep unsharded gradients: no reduction this micro-batch */
  size_t largest;         /* the largest shard_numel */
  /* the shard, in fp32 (fp32, bf16-mixed) or in bf16 (bf16-true): one of each pair */
  float *params;      /* (shard_total) fp32 master shard, or NULL */
  uint16_t *params16; /* (shard_total) bf16 parameter shard, or NULL */
  /* bf16-mixed: the fp32 master's bf16 rounding, what a gather sends (and,
   * on one shard, the units' bf16 weights themselves: alias16); AdamW
   * writes it as it steps the master (kern.h's adamw_segs) */
  uint16_t *image16;
  int image_stale; /* the master was written otherwise (init, load, fsdp_state): round it again */
  int alias16;     /* S = 1 with the image: a unit's bf16 gather is its slice of the image */
  float *grads;       /* (shard_total) fp32 reduced gradient shard, or NULL */
  uint16_t *grads16;  /* (shard_total) bf16 reduced gradient shard, or NULL */
  void *landing;      /* (largest) where a reduce-scatter lands, reduce dtype; NULL when S = 1 */
  float *chunk32;     /* (2 * FSDP_CHUNK) bf16-true: shard chunks widened to fp32 (device) */
  float *stage;       /* (FSDP_CHUNK) host: weights on their way to or from the device */
  size_t *shard_off;  /* per unit: offset of its shard in params / grads */
  float **full;       /* per unit: gathered parameters (padded numel), or NULL */
  uint16_t **recv16;  /* per unit: where a bf16 gather in flight lands */
  uint16_t **full16;  /* per unit under keep16: the landed bf16 gather, full's image, or NULL */
  comm_req_t **gather_req; /* per unit: its all-gather in flight, or NULL */
  float **unit_grad;  /* per unit: unsharded gradient during backward, or NULL */
  int *bwd_done;      /* per FSDP unit: its model units whose gradients are complete */
  int nmodel;         /* model units (embeddings + blocks) */
  int gathered, max_gathered;
  int fwd_tail; /* forward has reached the last block: unit 0's next use ends it */
  /* the one gradient reduction in flight: it overlaps the next unit's backward */
  int pend_unit;        /* -1: none */
  comm_req_t *pend_req; /* its reduce-scatter (or all-reduce when S == 1) */
  void *pend_buf;       /* the unit's gradient being reduced (reduce dtype): freed when done */
  void *pend_out;       /* where its result lands (landing, or pend_buf when S == 1) */
  adamw_t *opt;
};

static size_t fsdp_padded(const fsdp_t *f, int k) {
  return f->layout->units[k].shard_numel * (size_t)f->shards;
}

/* Elements from i to the end of the chunk of n that starts there. */
static size_t fsdp_chunk(size_t i, size_t n) { return n - i < FSDP_CHUNK ? n - i : FSDP_CHUNK; }

/* A buffer a collective sends from or lands in. On a device whose memory is
 * host memory it is registered memory (reg.c: same-host peers read it in
 * place); on any other device, device memory: step 1 for a buffer made and
 * freed within each step (a gathered unit, a unit's gradient), which the
 * backend may keep for the next step's (mem_dev_alloc_step). */
static void *fsdp_buf_alloc(const fsdp_t *f, mem_cat_t cat, size_t bytes, const char *what,
                            int step) {
  if (f->be->host_memory) return comm_reg_alloc(cat, bytes, what);
  return step ? mem_dev_alloc_step(f->be, cat, bytes, what) : mem_dev_alloc(f->be, cat, bytes, what);
}

static void fsdp_buf_free(const fsdp_t *f, void *p) {
  if (f->be->host_memory) comm_reg_free(p);
  else mem_dev_free(f->be, p);
}

static void fsdp_free_unit(fsdp_t *f, int k);

static void fsdp_gathered_one(fsdp_t *f) {
  if (++f->gathered > f->max_gathered) f->max_gathered = f->gathered;
}

/* A gather that failed to start or to land: its buffers go and the unit is
 * not gathered, so its next use gathers it again (never hands the model a
 * buffer nothing landed in). */
static void fsdp_gather_undo(fsdp_t *f, int k) {
  if (f->recv16[k] && !f->alias16) fsdp_buf_free(f, f->recv16[k]);
  f->recv16[k] = NULL;
  fsdp_free_unit(f, k);
}

/* Issues the all-gather of unit k (no-op if gathered or in flight), in bf16
 * when bf16 is set (half the bytes on the wire, and the model computes with
 * bf16 values), else in fp32 (fp32 storage only). Under bf16-true the bf16
 * shard itself is sent; under bf16-mixed its image (the fp32 master's
 * rounding, which AdamW keeps: no pass over the master at each gather, two
 * a step under FULL_SHARD), rounded anew first when the master was written
 * otherwise; on one shard that slice of the image is the gather. With
 * FSDP_GATHER_ROUND=1 (no image) the master is rounded at each gather. */
static int fsdp_gather_start(fsdp_t *f, int k, int bf16) {
  if (f->full[k]) return FSDP_OK;
  FSDP_ASSERT(bf16 || f->params);
  const kern_backend_t *be = f->be;
  if (f->alias_params) { /* one shard under fp32: it is the unit */
    f->full[k] = f->params + f->shard_off[k];
    fsdp_gathered_one(f);
    return FSDP_OK;
  }
  const size_t n = f->layout->units[k].shard_numel, padded = fsdp_padded(f, k);
  const size_t off = f->shard_off[k];
  const void *send = f->params16 ? (const void *)(f->params16 + off) : (const void *)(f->params + off);
  if (bf16 && f->image16) { /* bf16-mixed: the master's rounding, up to date */
    if (f->image_stale) be->f32_to_bf16(f->image16, f->params, f->layout->shard_total);
    f->image_stale = 0;
    send = f->image16 + off;
  }
  f->full[k] = fsdp_buf_alloc(f, MEM_PARAMS_GATHERED, padded * sizeof(float), "gathered unit", 1);
  if (!f->full[k]) return FSDP_ENOMEM;
  fsdp_gathered_one(f);
  if (bf16 && f->alias16) { /* one shard: the image is the unit's bf16 weights */
    f->recv16[k] = f->image16 + off;
    return FSDP_OK;
  }
  int rc = FSDP_OK;
  if (bf16 &&
      !(f->recv16[k] = fsdp_buf_alloc(f, MEM_PARAMS_GATHERED, padded * sizeof(uint16_t),
                                      "bf16 gathered unit", 1)))
    rc = FSDP_ENOMEM;
  if (!rc && bf16 && !f->params16 && !f->image16) {
    /* bf16-mixed without the image (FSDP_GATHER_ROUND=1): the fp32 master
     * rounded straight into this rank's block of the landing buffer, which
     * is then gathered in place (the ring does not copy that block) */
    uint16_t *mine = f->recv16[k] + (size_t)f->shard_rank * n;
    be->f32_to_bf16(mine, send, n);
    send = mine;
  }
  void *recv = bf16 ? (void *)f->recv16[k] : (void *)f->full[k];
  if (!rc && f->shards == 1) { /* NO_SHARD: the shard is the unit */
    if (send != recv) be->copy_d2d(recv, send, n * (bf16 ? sizeof(uint16_t) : sizeof(float)));
    return FSDP_OK;
  }
  if (!rc && (rc = comm_iall_gather(f->opts.shard_comm, send, recv, n,
                                    bf16 ? COMM_BF16 : COMM_F32, &f->gather_req[k])))
    rc = err_wrap(rc, "gathering unit %d", k);
  if (rc) fsdp_gather_undo(f, k); /* nothing is in flight: not gathered */
  return rc;
}

/* Waits for unit k's gather; a bf16 gather is widened to fp32 for the
 * model, and with keep (the model's gathers under keep16) kept beside it as
 * full16 until the unit is freed, else freed (not the image's slice under
 * alias16: the image lives on). */
static int fsdp_gather_wait(fsdp_t *f, int k, int keep) {
  int rc = FSDP_OK;
  if (f->gather_req[k]) {
    rc = comm_wait(f->gather_req[k], -1);
    f->gather_req[k] = NULL;
  }
  if (rc) {
    fsdp_gather_undo(f, k);
    return err_wrap(rc, "gathering unit %d", k);
  }
  if (f->recv16[k]) {
    /* the products read the matrices from full16: only the rest is widened,
     * where the image lies as the model's reads expect (16-byte aligned) */
    const int part = keep && f->wide_at && f->wide_at[k + 1] > f->wide_at[k] &&
                     !((uintptr_t)f->recv16[k] & 15);
    if (part && f->poison) f->be->dev_set(f->full[k], 0xff, fsdp_padded(f, k) * sizeof(float));
    if (part)
      f->be->bf16_to_f32_segs(f->full[k], f->recv16[k], f->wide_seg + f->wide_at[k],
                              f->wide_at[k + 1] - f->wide_at[k]);
    else f->be->bf16_to_f32(f->full[k], f->recv16[k], fsdp_padded(f, k));
    FSDP_ASSERT(!f->full16[k]); /* a unit lands once between its frees */
    if (keep) f->full16[k] = f->recv16[k];
    else if (!f->alias16) fsdp_buf_free(f, f->recv16[k]);
    f->recv16[k] = NULL;
  }
  return FSDP_OK;
}

static void fsdp_free_unit(fsdp_t *f, int k) {
  if (!f->full[k]) return;
  FSDP_ASSERT(!f->gather_req[k]);
  if (!f->alias_params) fsdp_buf_free(f, f->full[k]);
  if (!f->alias16) fsdp_buf_free(f, f->full16[k]);
  f->full[k] = NULL;
  f->full16[k] = NULL;
  f->gathered--;
}

/* The unit the model asks for after model unit u in this phase (gpt.h gives
 * the order), or -1: what to prefetch. */
static int fsdp_next_unit(const fsdp_t *f, int u, int phase) {
  const int L = f->nmodel - 1;
  if (phase == GPT_FWD) return u == 0 ? (f->fwd_tail || L == 0 ? -1 : 1) : u < L ? u + 1 : 0;
  return u == 0 ? L : u > 1 ? u - 1 : -1;
}

/* Model unit u inside the buffer of its FSDP unit (several model units share
 * one under min_params). */
static size_t fsdp_model_offset(const fsdp_t *f, int u) {
  return gpt_unit(f->model, u).offset - f->layout->units[f->layout->unit_of[u]].offset;
}

static int fsdp_params_cb(void *ctx, int u, int phase, float **out, const uint16_t **out16) {
  fsdp_t *f = ctx;
  const int k = f->layout->unit_of[u];
  int rc;
  if ((rc = fsdp_gather_start(f, k, f->gather_bf16)) || (rc = fsdp_gather_wait(f, k, f->keep16)))
    return rc;
  /* prefetch: the next unit's gather runs while this one computes; FULL_SHARD
   * keeps at most two units gathered, the strategies that keep parameters
   * hold what they keep anyway */
  if (phase == GPT_FWD && u == f->nmodel - 1) f->fwd_tail = 1;
  int next = fsdp_next_unit(f, u, phase);
  int nk = next >= 0 ? f->layout->unit_of[next] : -1;
  if (nk >= 0 && nk != k && (f->keeps_params || f->gathered < 2) &&
      (rc = fsdp_gather_start(f, nk, f->gather_bf16)))
    return rc;
  *out = f->full[k] + fsdp_model_offset(f, u);
  *out16 = f->full16[k] ? f->full16[k] + fsdp_model_offset(f, u) : NULL;
  return FSDP_OK;
}

/* The model unit whose backward is the last use of FSDP unit k: backward
 * runs unit 0 (final norm and logits, unless the forward took the LM head's
 * in chunks), then the blocks last to first, so a
 * unit's first block, or block 1 when min_params merged blocks into unit 0. */
static int fsdp_last_bwd_use(const fsdp_t *f, int k) {
  const shard_unit_t *su = &f->layout->units[k];
  return su->first == 0 && su->last >= 1 ? 1 : su->first;
}

static int fsdp_release_cb(void *ctx, int u, int phase) {
  fsdp_t *f = ctx;
  const int k = f->layout->unit_of[u];
  int next = fsdp_next_unit(f, u, phase);
  if (phase == GPT_FWD && u == 0 && f->fwd_tail) f->fwd_tail = 0, next = -1; /* forward is over */
  /* an FSDP unit stays while the model moves on inside it; kept units are
   * freed once backward is done with them (not in between: unit 0 with
   * merged blocks is used again after the others) */
  if (next >= 0 && f->layout->unit_of[next] == k) return FSDP_OK;
  if (!f->keeps_params || (phase == GPT_BWD && u == fsdp_last_bwd_use(f, k))) fsdp_free_unit(f, k);
  return FSDP_OK;
}

static int fsdp_reduce_finish(fsdp_t *f);

static int fsdp_grads_cb(void *ctx, int u, float **out) {
  fsdp_t *f = ctx;
  const int k = f->layout->unit_of[u];
  if (f->alias_grads) { /* one rank: nothing to reduce */
    *out = f->grads + f->shard_off[k] + fsdp_model_offset(f, u);
    return FSDP_OK;
  }
  /* this unit's reduction from the previous micro-batch may still be in flight
   * on its buffer: finish it before backward writes a new gradient */
  if (f->pend_unit == k) {
    int rc = fsdp_reduce_finish(f);
    if (rc) return rc;
  }
  if (!f->unit_grad[k]) {
    f->unit_grad[k] =
        fsdp_buf_alloc(f, MEM_GRADS, fsdp_padded(f, k) * sizeof(float), "unit gradient", 1);
    if (!f->unit_grad[k]) return FSDP_ENOMEM;
    f->be->dev_set(f->unit_grad[k], 0, fsdp_padded(f, k) * sizeof(float));
  }
  *out = f->unit_grad[k] + fsdp_model_offset(f, u);
  return FSDP_OK;
}

/* Adds unit u's reduced gradient src (shard_numel elements, in the reduce
 * dtype) into the gradient shard. */
static void fsdp_grad_add(fsdp_t *f, int u, const void *src) {
  const kern_backend_t *be = f->be;
  const size_t off = f->shard_off[u], n = f->layout->units[u].shard_numel;
  if (!f->bf16_storage) {
    be->vec_add(f->grads + off, src, n);
    return;
  }
  const uint16_t *s16 = src;
  float *a = f->chunk32, *b = f->chunk32 + FSDP_CHUNK;
  for (size_t i = 0, c; i < n; i += c) {
    c = fsdp_chunk(i, n);
    be->bf16_to_f32(a, f->grads16 + off + i, c);
    be->bf16_to_f32(b, s16 + i, c);
    be->vec_add(a, b, c);
    be->f32_to_bf16(f->grads16 + off + i, a, c); /* rounds: the sum, into the bf16 shard */
  }
}

/* Completes the gradient reduction in flight: waits for it, averages across
 * the replica group after a reduce-scatter (HYBRID), adds the result into the
 * gradient shard and frees the unit's unsharded gradient. */
static int fsdp_reduce_finish(fsdp_t *f) {
  const int u = f->pend_unit;
  if (u < 0) return FSDP_OK;
  const size_t n = f->layout->units[u].shard_numel;
  int rc = f->pend_req ? comm_wait(f->pend_req, -1) : FSDP_OK;
  f->pend_req = NULL;
  f->pend_unit = -1;
  if (!rc && f->shards > 1 && f->opts.replica_comm)
    rc = comm_all_reduce(f->opts.replica_comm, f->pend_out, f->pend_out, n, f->reduce_dtype,
                         COMM_AVG);
  if (!rc) fsdp_grad_add(f, u, f->pend_out);
  fsdp_buf_free(f, f->pend_buf);
  f->pend_buf = NULL;
  return rc ? err_wrap(rc, "reducing the gradient of unit %d", u) : FSDP_OK;
}

/* Takes unit u's unsharded fp32 gradient for its reduction, in the reduce
 * dtype: the buffer itself, or under bf16-true a bf16 copy (the fp32 one is
 * freed at once). NULL when out of memory. */
static void *fsdp_grad_for_wire(fsdp_t *f, int u) {
  float *g = f->unit_grad[u];
  f->unit_grad[u] = NULL;
  if (!f->bf16_storage) return g;
  const size_t padded = fsdp_padded(f, u);
  uint16_t *g16 = fsdp_buf_alloc(f, MEM_GRADS, padded * sizeof(uint16_t), "bf16 unit gradient", 1);
  if (g16) f->be->f32_to_bf16(g16, g, padded); /* rounds: the unit's gradient, for the wire */
  fsdp_buf_free(f, g);
  return g16;
}

/* The unit's gradient of this micro-batch is complete: its average over the
 * shard group (reduce-scatter) or the replicas (all-reduce, NO_SHARD) is
 * issued now and completed when the next unit's is, so it runs while backward
 * computes. */
static int fsdp_grads_done_cb(void *ctx, int mu) {
  fsdp_t *f = ctx;
  if (f->alias_grads) return FSDP_OK; /* it is in the gradient shard already */
  const int u = f->layout->unit_of[mu];
  const shard_unit_t *su = &f->layout->units[u];
  /* an FSDP unit is reduced when backward is done with all its model units */
  if (++f->bwd_done[u] < su->last - su->first + 1) return FSDP_OK;
  f->bwd_done[u] = 0;
  if (f->defer_reduce) return FSDP_OK; /* the unit's gradient keeps accumulating unsharded */
  int rc = fsdp_reduce_finish(f);
  if (rc) return rc;
  const size_t n = f->layout->units[u].shard_numel;
  void *g = fsdp_grad_for_wire(f, u);
  if (!g) return FSDP_ENOMEM;
  f->pend_unit = u;
  f->pend_buf = g;
  f->pend_out = f->shards > 1 ? f->landing : g;
  if (f->shards > 1)
    rc = comm_ireduce_scatter(f->opts.shard_comm, g, f->landing, n, f->reduce_dtype, COMM_AVG,
                              &f->pend_req);
  else if (f->opts.replica_comm)
    rc = comm_iall_reduce(f->opts.replica_comm, g, g, n, f->reduce_dtype, COMM_AVG, &f->pend_req);
  if (rc) {
    f->pend_unit = -1;
    fsdp_buf_free(f, f->pend_buf);
    f->pend_buf = NULL;
    return err_wrap(rc, "reducing the gradient of unit %d", u);
  }
  return FSDP_OK;
}

/* ---- weights in and out: fp32 on the host, a chunk at a time ------------ */

/* Stores c fp32 values from the host stage into the parameter shard at off
 * (rounded to bf16 under bf16-true). */
static void fsdp_stage_store(fsdp_t *f, size_t off, size_t c) {
  const kern_backend_t *be = f->be;
  f->image_stale = 1;
  if (!f->params16) {
    be->copy_h2d(f->params + off, f->stage, c * sizeof(float));
    return;
  }
  be->copy_h2d(f->chunk32, f->stage, c * sizeof(float));
  be->f32_to_bf16(f->params16 + off, f->chunk32, c); /* rounds: weights in, to bf16 storage */
}

/* The reverse: c parameters from off into the stage, in fp32 (bf16 widened
 * exactly). */
static void fsdp_stage_fetch(fsdp_t *f, size_t off, size_t c) {
  const kern_backend_t *be = f->be;
  if (!f->params16) {
    be->copy_d2h(f->stage, f->params + off, c * sizeof(float));
  } else {
    be->bf16_to_f32(f->chunk32, f->params16 + off, c);
    be->copy_d2h(f->stage, f->chunk32, c * sizeof(float));
  }
  be->sync();
}

/* Zeroes unit k's padding in the parameter shard (from its real elements on). */
static void fsdp_zero_padding(fsdp_t *f, int k, size_t real) {
  const size_t e = f->params16 ? sizeof(uint16_t) : sizeof(float);
  char *base = f->params16 ? (char *)f->params16 : (char *)f->params;
  f->be->dev_set(base + (f->shard_off[k] + real) * e, 0,
                 (f->layout->units[k].shard_numel - real) * e);
}

/* This rank's shard of the initial weights: one device's bytes (in bf16:
 * rounded from them). */
static void fsdp_init_shard(fsdp_t *f, const gpt_config_t *cfg, uint64_t seed) {
  for (int k = 0; k < f->layout->num_units; k++) {
    size_t begin, real = shard_unit_real(f->layout, f->shard_rank, k, &begin);
    for (size_t i = 0, c; i < real; i += c) {
      c = fsdp_chunk(i, real);
      gpt_init_range(cfg, seed, begin + i, begin + i + c, f->stage);
      fsdp_stage_store(f, f->shard_off[k] + i, c);
    }
    fsdp_zero_padding(f, k, real);
  }
  f->be->sync();
}

/* Where element begin of the flat model lies in a weights file. */
static off_t fsdp_file_at(size_t begin) {
  return GPT_WEIGHTS_HEADER_BYTES + (off_t)(begin * sizeof(float));
}

/* Loads this rank's shards from a safetensors file (safetensors.h). */
static int fsdp_load_safetensors(fsdp_t *f, const char *path) {
  safetensors_t st;
  int fd, rc = safetensors_open(path, gpt_get_config(f->model), &fd, &st);
  if (rc) return err_wrap(rc, "init_from");
  for (int k = 0; !rc && k < f->layout->num_units; k++) {
    size_t begin, real = shard_unit_real(f->layout, f->shard_rank, k, &begin);
    for (size_t i = 0, c; !rc && i < real; i += c) {
      c = fsdp_chunk(i, real);
      if ((rc = safetensors_read(&st, fd, path, begin + i, c, f->stage)))
        rc = err_wrap(rc, "init_from");
      else
        fsdp_stage_store(f, f->shard_off[k] + i, c);
    }
    fsdp_zero_padding(f, k, real);
  }
  f->be->sync();
  safetensors_free(&st);
  close(fd);
  return rc;
}

int fsdp_load_weights(fsdp_t *f, const char *path) {
  struct stat st;
  if (!stat(path, &st) && S_ISDIR(st.st_mode)) /* a checkpoint's, most likely */
    return err_set(FSDP_EINVAL, "init_from: %s is a directory; init_from takes a weights file "
                   "(fsdp-train --save, or a .safetensors from fsdpctl export); to go on from a "
                   "checkpoint, give its directory as resume_from", path);
  uint8_t first[9] = {0};
  FILE *probe = fopen(path, "rb");
  const size_t got = probe ? fread(first, 1, sizeof first, probe) : 0;
  if (probe) fclose(probe);
  if (safetensors_sniff(first, got)) return fsdp_load_safetensors(f, path);
  gpt_config_t fc;
  FILE *file;
  int rc = gpt_weights_open(path, &fc, &file);
  if (rc) return rc;
  if ((rc = gpt_weights_match(&fc, gpt_get_config(f->model), path))) goto out;
  for (int k = 0; !rc && k < f->layout->num_units; k++) {
    size_t begin, real = shard_unit_real(f->layout, f->shard_rank, k, &begin);
    for (size_t i = 0, c; !rc && i < real; i += c) {
      c = fsdp_chunk(i, real);
      rc = shard_file_io(fileno(file), f->stage, c * sizeof(float), fsdp_file_at(begin + i), 0,
                         f->shard_rank, path);
      if (!rc) fsdp_stage_store(f, f->shard_off[k] + i, c);
    }
    fsdp_zero_padding(f, k, real);
  }
  f->be->sync();
out:
  fclose(file);
  return rc;
}

int fsdp_write_weights(fsdp_t *f, int fd, const char *path) {
  int rc = FSDP_OK;
  for (int k = 0; !rc && k < f->layout->num_units; k++) {
    size_t begin, real = shard_unit_real(f->layout, f->shard_rank, k, &begin);
    for (size_t i = 0, c; !rc && i < real; i += c) {
      c = fsdp_chunk(i, real);
      fsdp_stage_fetch(f, f->shard_off[k] + i, c);
      rc = shard_file_io(fd, f->stage, c * sizeof(float), fsdp_file_at(begin + i), 1,
                         f->shard_rank, path);
    }
  }
  return rc;
}

/* ---- create / destroy ----------------------------------------------------- */

/* The shard's persistent state: parameters and gradient (fp32, or bf16 under
 * bf16-true), where a reduce-scatter lands, bf16-true's fp32 chunks, and the
 * host stage. */
static int fsdp_alloc_state(fsdp_t *f) {
  const kern_backend_t *be = f->be;
  const size_t n = f->layout->shard_total;
  /* offload: the shard's state lives in host memory and the optimizer step
   * runs on the CPU (for a CPU device, only the accounting moves) */
  const mem_cat_t pc = f->opts.offload ? MEM_OFFLOAD : MEM_PARAMS;
  const mem_cat_t gc = f->opts.offload ? MEM_OFFLOAD : MEM_GRADS;
  const size_t e = f->bf16_storage ? sizeof(uint16_t) : sizeof(float);
  f->stage = mem_alloc(MEM_WORKSPACE, FSDP_CHUNK * sizeof(float), "weights staging");
  void *params = fsdp_buf_alloc(f, pc, n * e, f->bf16_storage ? "parameter shard (bf16)" : "parameter shard", 0);
  void *grads = mem_dev_calloc(be, gc, n * e, f->bf16_storage ? "gradient shard (bf16)" : "gradient shard");
  if (f->shards > 1)
    f->landing = fsdp_buf_alloc(f, MEM_COMM, f->largest * e, "reduce-scatter landing", 0);
  if (f->bf16_storage) {
    f->params16 = params;
    f->grads16 = grads;
    f->chunk32 = mem_dev_alloc(be, MEM_WORKSPACE, 2 * FSDP_CHUNK * sizeof(float), "fp32 shard chunks");
  } else {
    f->params = params;
    f->grads = grads;
  }
  const int image = f->gather_bf16 && !f->bf16_storage && !param_gather_round(); /* bf16-mixed */
  if (image)
    f->image16 = fsdp_buf_alloc(f, MEM_PARAMS, n * sizeof(uint16_t), "parameter shard's bf16 image", 0);
  f->image_stale = 1;
  f->alias16 = f->image16 && f->shards == 1;
  int ok = f->stage && params && grads && (f->shards == 1 || f->landing) &&
           (!f->bf16_storage || f->chunk32) && (!image || f->image16);
  return ok ? FSDP_OK : FSDP_ENOMEM;
}

/* keep16's widening plan (fsdp_t.wide_seg): per unit, its tensors the model
 * reads in fp32, and those it reads only from the image but which would not
 * lie 16 bytes aligned there (unit-local offset not a multiple of 8), as
 * runs of elements, neighbours merged. A unit with nothing left out keeps
 * no runs: it is widened whole, padding and all, by one wide pass. */
static int fsdp_plan_widening(fsdp_t *f) {
  if (!f->keep16 || !f->be->bf16_to_f32_segs) return FSDP_OK;
  const int nu = f->layout->num_units, nt = gpt_num_tensors(f->model);
  f->wide_at = calloc((size_t)nu + 1, sizeof *f->wide_at);
  f->wide_seg = calloc((size_t)nt, sizeof *f->wide_seg); /* at most a run a tensor */
  if (!f->wide_at || !f->wide_seg) return err_set(FSDP_ENOMEM, "fsdp: out of memory");
  int n = 0;
  for (int k = 0; k < nu; k++) {
    const shard_unit_t *su = &f->layout->units[k];
    const int n0 = n;
    int skipped = 0;
    for (int i = 0; i < nt; i++) {
      const gpt_tensor_t *t = gpt_tensor(f->model, i);
      if (t->unit < su->first || t->unit > su->last || !t->numel) continue;
      const size_t off = t->offset - su->offset;
      if (!gpt_tensor_fp32(f->model, i) && off % 8 == 0) {
        skipped = 1;
        continue;
      }
      if (n > n0 && f->wide_seg[n - 1].offset + f->wide_seg[n - 1].numel == off)
        f->wide_seg[n - 1].numel += t->numel;
      else f->wide_seg[n++] = (kern_seg_t){off, t->numel, 0};
    }
    if (!skipped) n = n0; /* widened whole */
    f->wide_at[k + 1] = n;
  }
  return FSDP_OK;
}

int fsdp_create(fsdp_t **out, const gpt_config_t *cfg, const fsdp_opts_t *o) {
  *out = NULL;
  const shard_mesh_t *m = &o->mesh;
  if ((m->shards > 1) != (o->shard_comm != NULL) || (m->replicas > 1) != (o->replica_comm != NULL))
    return err_set(FSDP_EINVAL, "fsdp: mesh %dx%d needs a shard group communicator when S > 1 "
                   "and a replica group communicator when R > 1", m->replicas, m->shards);
  if (o->shard_comm && comm_size(o->shard_comm) != m->shards)
    return err_set(FSDP_EINVAL, "fsdp: the shard group has %d ranks, the mesh says %d",
                   comm_size(o->shard_comm), m->shards);
  if (o->replica_comm && comm_size(o->replica_comm) != m->replicas)
    return err_set(FSDP_EINVAL, "fsdp: the replica group has %d ranks, the mesh says %d",
                   comm_size(o->replica_comm), m->replicas);
  if (!o->be) return err_set(FSDP_EINVAL, "fsdp: no kernel backend (fsdp_opts_t.be)");
  fsdp_t *f = calloc(1, sizeof *f);
  if (!f) return err_set(FSDP_ENOMEM, "fsdp: out of memory");
  f->opts = *o;
  f->be = o->be;
  f->shards = m->shards;
  f->shard_rank = o->shard_comm ? comm_rank(o->shard_comm) : 0;
  f->keeps_params = shard_strategy_keeps_params(m->strategy);
  f->gather_bf16 = o->precision != PRECISION_FP32;
  f->bf16_storage = o->precision == PRECISION_BF16_TRUE;
  f->alias_params = f->shards == 1 && o->precision == PRECISION_FP32;
  f->alias_grads = f->shards == 1 && m->replicas == 1 && !f->bf16_storage;
  f->reduce_dtype = f->bf16_storage ? COMM_BF16 : COMM_F32;
  f->pend_unit = -1;
  adamw_segment_t *segs = NULL;
  int nsegs = 0, rc;
  if ((rc = gpt_create_shell(&f->model, cfg, f->be))) goto fail;
  f->keep16 = f->gather_bf16 && gpt_weights16(f->model);
  f->poison = param_gather_poison() != 0;
  if ((rc = shard_layout_create(&f->layout, cfg, f->shards, o->min_params)) ||
      (rc = fsdp_plan_widening(f)))
    goto fail;
  f->nmodel = cfg->layers + 1;
  const int nu = f->layout->num_units;
  f->shard_off = calloc((size_t)nu, sizeof *f->shard_off);
  f->full = calloc((size_t)nu, sizeof *f->full);
  f->gather_req = calloc((size_t)nu, sizeof *f->gather_req);
  f->unit_grad = calloc((size_t)nu, sizeof *f->unit_grad);
  f->recv16 = calloc((size_t)nu, sizeof *f->recv16);
  f->full16 = calloc((size_t)nu, sizeof *f->full16);
  f->bwd_done = calloc((size_t)nu, sizeof *f->bwd_done);
  if (!f->shard_off || !f->full || !f->gather_req || !f->unit_grad || !f->recv16 || !f->full16 ||
      !f->bwd_done) {
    rc = err_set(FSDP_ENOMEM, "fsdp: out of memory");
    goto fail;
  }
  size_t off = 0;
  for (int k = 0; k < nu; k++) {
    f->shard_off[k] = off;
    off += f->layout->units[k].shard_numel;
    if (f->layout->units[k].shard_numel > f->largest) f->largest = f->layout->units[k].shard_numel;
  }
  if ((rc = fsdp_alloc_state(f))) goto fail;
  fsdp_init_shard(f, cfg, o->seed);
  if ((rc = shard_segments(f->layout, f->model, f->shard_rank, &segs, &nsegs))) goto fail;
  const mem_cat_t oc = o->offload ? MEM_OFFLOAD : MEM_OPTIM;
  if ((rc = (f->bf16_storage ? adamw_create_segments_bf16 : adamw_create_segments)(
           &f->opt, f->be, f->layout->shard_total, segs, nsegs, o->hp, oc)))
    goto fail;
  free(segs);
  gpt_unit_hooks_t h = {f, fsdp_params_cb, fsdp_release_cb, fsdp_grads_cb, fsdp_grads_done_cb};
  gpt_set_hooks(f->model, &h);
  *out = f;
  return FSDP_OK;
fail:
  free(segs);
  fsdp_destroy(f);
  return rc;
}

void fsdp_destroy(fsdp_t *f) {
  if (!f) return;
  if (f->pend_req) comm_wait(f->pend_req, -1); /* its buffers must outlive it */
  fsdp_buf_free(f, f->pend_buf);
  if (f->layout)
    for (int k = 0; k < f->layout->num_units; k++) {
      if (f->gather_req && f->gather_req[k]) comm_wait(f->gather_req[k], -1); /* the buffer must outlive the op */
      if (f->gather_req) f->gather_req[k] = NULL;
      if (f->recv16) fsdp_gather_wait(f, k, 0); /* frees a bf16 gather's buffers */
      if (f->full && f->full16) fsdp_free_unit(f, k);
      if (f->unit_grad) fsdp_buf_free(f, f->unit_grad[k]);
    }
  adamw_destroy(f->opt);
  fsdp_buf_free(f, f->params);
  fsdp_buf_free(f, f->params16);
  fsdp_buf_free(f, f->image16);
  mem_dev_free(f->be, f->grads);
  mem_dev_free(f->be, f->grads16);
  mem_dev_free(f->be, f->chunk32);
  fsdp_buf_free(f, f->landing);
  mem_free(f->stage);
  comm_reg_trim(); /* the segments kept for this runtime's next unit */
  free(f->shard_off);
  free(f->full);
  free(f->gather_req);
  free(f->unit_grad);
  free(f->recv16);
  free(f->full16);
  free(f->bwd_done);
  free(f->wide_seg);
  free(f->wide_at);
  shard_layout_destroy(f->layout);
  gpt_destroy(f->model);
  free(f);
}

gpt_t *fsdp_model(fsdp_t *f) { return f->model; }
const shard_layout_t *fsdp_layout(const fsdp_t *f) { return f->layout; }
int fsdp_max_gathered(const fsdp_t *f) { return f->max_gathered; }
int fsdp_shard_rank(const fsdp_t *f) { return f->shard_rank; }

void fsdp_state(fsdp_t *f, fsdp_state_t *st) {
  st->be = f->be;
  st->layout = f->layout;
  st->shard_rank = f->shard_rank;
  st->elem_bytes = f->bf16_storage ? sizeof(uint16_t) : sizeof(float);
  st->params = f->params16 ? (void *)f->params16 : (void *)f->params;
  st->opt = f->opt;
  f->image_stale = 1; /* the caller may write the shard (a checkpoint's load) */
}

void fsdp_defer_reduce(fsdp_t *f, int defer) { f->defer_reduce = defer; }

void fsdp_zero_grad(fsdp_t *f) {
  const size_t n = f->layout->shard_total;
  if (f->grads16) f->be->dev_set(f->grads16, 0, n * sizeof *f->grads16);
  else f->be->dev_set(f->grads, 0, n * sizeof *f->grads);
}

/* Sum of squares of one of this rank's shard buffers, x32 (fp32) or x16
 * (bf16, widened chunk by chunk) (the kernel sums in double). */
static double fsdp_sumsq(fsdp_t *f, const float *x32, const uint16_t *x16) {
  const size_t n = f->layout->shard_total;
  if (!x16) return f->be->sumsq(x32, n);
  double s = 0;
  for (size_t i = 0, c; i < n; i += c) {
    c = fsdp_chunk(i, n);
    f->be->bf16_to_f32(f->chunk32, x16 + i, c);
    s += f->be->sumsq(f->chunk32, c);
  }
  return s;
}

static double fsdp_grad_sumsq(fsdp_t *f) { return fsdp_sumsq(f, f->grads, f->grads16); }

int fsdp_finite(fsdp_t *f, int optimizer) {
  /* a sum of squares of floats is finite in double exactly when they all are */
  if (!isfinite(fsdp_sumsq(f, f->params, f->params16))) return 0;
  if (!optimizer) return 1;
  const int bf16 = adamw_m(f->opt) == NULL;
  return isfinite(fsdp_sumsq(f, bf16 ? NULL : adamw_m(f->opt), bf16 ? adamw_m_bf16(f->opt) : NULL)) &&
         isfinite(fsdp_sumsq(f, bf16 ? NULL : adamw_v(f->opt), bf16 ? adamw_v_bf16(f->opt) : NULL));
}

/* Multiplies the gradient shard by s (clipping). */
static void fsdp_grad_scale(fsdp_t *f, float s) {
  const kern_backend_t *be = f->be;
  const size_t n = f->layout->shard_total;
  if (!f->grads16) {
    be->vec_scale(f->grads, s, n);
    return;
  }
  for (size_t i = 0, c; i < n; i += c) {
    c = fsdp_chunk(i, n);
    be->bf16_to_f32(f->chunk32, f->grads16 + i, c);
    be->vec_scale(f->chunk32, s, c);
    be->f32_to_bf16(f->grads16 + i, f->chunk32, c); /* rounds: the clipped gradient */
  }
}

int fsdp_step(fsdp_t *f, float lr, float clip, float *norm) {
  int rc = fsdp_reduce_finish(f); /* the last unit's gradient (unit 0) */
  if (rc) return rc;
  /* the squared norm of the whole gradient: each shard group holds it once
   * (replicas hold equal shards), and padding is zero */
  double sq = fsdp_grad_sumsq(f);
  if (f->opts.shard_comm) {
    /* floats on the wire: the sum as it is, and scaled by 2^-100 for a sum
     * past FLT_MAX (a norm above 1.8e19), which one rank's double holds: the
     * ranks clip such a gradient as one device does, not call it infinite */
    float v[2] = {(float)sq, (float)(sq * 0x1p-100)};
    if ((rc = comm_all_reduce(f->opts.shard_comm, v, v, 2, COMM_F32, COMM_SUM)))
      return err_wrap(rc, "gradient norm");
    sq = isinf(v[0]) && isfinite(v[1]) ? (double)v[1] * 0x1p100 : (double)v[0];
  }
  double n = sqrt(sq);
  if (norm) *norm = (float)n;
  /* a NaN or infinite gradient is never applied: the shard group agrees on
   * n (the replicas hold equal shards), so every rank stops at this step
   * with its weights and AdamW state as the last step left them */
  if (!isfinite(n))
    return err_set(FSDP_ERANGE, "the gradient norm is %s (a NaN or infinite gradient); "
                   "it was not applied", isnan(n) ? "NaN" : "infinite");
  /* clipping: in AdamW's read of each gradient where the backend can
   * (kern.h's adamw_segs_scaled: vec_scale's bits without its pass over the
   * shard, which is left unscaled: nothing reads it before zero_grad) */
  float gscale = 1.0f;
  if (clip > 0 && n > clip) {
    const float s = (float)(clip / (n + 1e-6));
    if (!f->bf16_storage && adamw_scales_grads(f->opt)) gscale = s;
    else fsdp_grad_scale(f, s);
  }
  if (f->bf16_storage) adamw_step_bf16(f->opt, f->params16, f->grads16, lr); /* rounds: p, m, v */
  else {
    /* no unit is gathered here (backward freed them): under alias16 a kept
     * unit's bf16 weights would change beneath its fp32 ones */
    FSDP_ASSERT(!f->gathered);
    adamw_step_buffers(f->opt, f->params, f->image16, f->grads, gscale,
                       lr); /* the image: each p's rounding */
    f->image_stale = 0;
  }
  return FSDP_OK;
}

int fsdp_mean_n(fsdp_t *f, float *x, size_t n) {
  int rc = FSDP_OK;
  if (f->opts.shard_comm) rc = comm_all_reduce(f->opts.shard_comm, x, x, n, COMM_F32, COMM_AVG);
  if (!rc && f->opts.replica_comm)
    rc = comm_all_reduce(f->opts.replica_comm, x, x, n, COMM_F32, COMM_AVG);
  return rc;
}

int fsdp_mean(fsdp_t *f, float *x) { return fsdp_mean_n(f, x, 1); }

int fsdp_reshard(fsdp_t *f) {
  int rc = fsdp_reduce_finish(f);
  for (int k = 0; k < f->layout->num_units; k++) {
    int rk = fsdp_gather_wait(f, k, 0); /* nothing may be in flight into a buffer we free */
    if (!rc) rc = rk;
    fsdp_free_unit(f, k);
  }
  return rc;
}

int fsdp_gather_params(fsdp_t *f, float *dst) {
  /* a unit still gathered for compute is the master's bf16 rounding, and
   * under keep16 widened only in part: each unit is gathered anew */
  int rc = fsdp_reshard(f);
  if (rc) return rc;
  for (int k = 0; k < f->layout->num_units; k++) {
    /* the stored weights (fp32 master, or the bf16 shard widened exactly),
     * whatever the policy gathers for compute */
    if ((rc = fsdp_gather_start(f, k, f->bf16_storage)) || (rc = fsdp_gather_wait(f, k, 0)))
      return rc;
    const shard_unit_t *u = &f->layout->units[k];
    f->be->copy_d2h(dst + u->offset, f->full[k], u->numel * sizeof(float));
    fsdp_free_unit(f, k);
  }
  f->be->sync();
  return FSDP_OK;
}


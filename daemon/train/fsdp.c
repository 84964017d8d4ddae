/* fsdp: the sharded runtime of one rank (see fsdp.h).
 *
 * It owns the rank's shards (params, grads, AdamW state), the gathered unit
 * buffers and the unsharded gradient buffers, and drives the collectives from
 * the model's unit hooks. Everything it allocates goes through the accounting
 * allocator: params (the shard), params_gathered (units in flight), grads (the
 * shard and a unit's unsharded gradient), optimizer, comm, workspace (fp32
 * chunks of a bf16 shard). What a collective sends from or lands in (the
 * parameter shard, gathered units, unit gradients, the landing) is registered
 * memory (daemon/comm/reg.c, same accounting), so the ranks on this host read
 * it in place instead of copying it through the ring's links.
 *
 * Under bf16-true the shard is stored in bf16 and the kernels still compute in
 * fp32, so values are rounded (to nearest-even, the backend's f32_to_bf16) in
 * exactly these places, each marked "rounds:" below: a unit's gradient before
 * it is reduced (and the ring's partial sums, once per hop: comm.h), the
 * gradient shard when a reduced gradient is added to it or it is clipped, the
 * AdamW step (adamw.c), and weights initialised or loaded. Widening bf16 to
 * fp32 is exact. */
#include "fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/comm/reg.h"
#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "mem.h"

struct fsdp {
  fsdp_opts_t o;
  gpt_t *g; /* a shell: no flat buffers */
  const kern_backend_t *be;
  shard_layout_t *l;
  int S, shard_rank, keeps;
  size_t largest;    /* the largest shard_numel */
  /* the shard, in fp32 (fp32, bf16-mixed) or in bf16 (bf16-true): one of each pair */
  float *params;     /* (shard_total) fp32 master shard, or NULL */
  uint16_t *params16; /* (shard_total) bf16 parameter shard, or NULL */
  float *grads;      /* (shard_total) fp32 reduced gradient shard, or NULL */
  uint16_t *grads16; /* (shard_total) bf16 reduced gradient shard, or NULL */
  void *landing;     /* (largest) where a reduce-scatter lands, in the reduce dtype */
  float *wide;       /* (2 * FSDP_CHUNK) bf16-true: gradient shard chunks in fp32 */
  size_t *shard_off; /* per unit: offset of its shard in params / grads */
  float **full;      /* per unit: gathered parameters (padded numel), or NULL */
  uint16_t **recv16;  /* per unit: where a bf16 gather in flight lands */
  int bf16;          /* the precision policy gathers parameters in bf16 */
  int true16;        /* bf16-true: bf16 storage, bf16 reductions */
  comm_dtype_t rdt;  /* the dtype gradients are reduced in */
  int defer;         /* keep unsharded gradients: no reduction this micro-batch */
  int nmodel;        /* model units (embeddings + blocks) */
  int *done;         /* per FSDP unit: its model units whose gradients are complete */
  comm_req_t **req;  /* per unit: its all-gather in flight, or NULL */
  float **ugrad;     /* per unit: unsharded gradient during backward, or NULL */
  int gathered, max_gathered;
  int fwd_tail; /* forward has reached the last block: unit 0's next use ends it */
  /* the one gradient reduction in flight: it overlaps the next unit's backward */
  int pend_unit;         /* -1: none */
  comm_req_t *pend_req;  /* its reduce-scatter (or all-reduce when S == 1) */
  void *pend_buf;        /* the unit's gradient being reduced (rdt): freed when done */
  void *pend_out;        /* where its result lands (landing, or pend_buf when S == 1) */
  adamw_t *opt;
};

static size_t fsdp_padded(const fsdp_t *f, int k) {
  return f->l->units[k].shard_numel * (size_t)f->S;
}

/* Elements from i to the end of the chunk of n that starts there. */
static size_t fsdp_chunk(size_t i, size_t n) { return n - i < FSDP_CHUNK ? n - i : FSDP_CHUNK; }

/* Issues the all-gather of unit k (no-op if gathered or in flight), in bf16
 * when bf16 is set (half the bytes on the wire, and the model computes with
 * bf16 values), else in fp32 (fp32 storage only). Under bf16-true the bf16
 * shard itself is sent; under bf16-mixed the fp32 master is rounded straight
 * into this rank's block of the landing buffer and gathered in place (no
 * bf16 copy of the shard, and the ring does not copy this rank's block). */
static int fsdp_gather_start(fsdp_t *f, int k, int bf16) {
  if (f->full[k]) return FSDP_OK;
  FSDP_ASSERT(bf16 || f->params);
  const size_t n = f->l->units[k].shard_numel, padded = fsdp_padded(f, k);
  const void *send = f->params16 ? (const void *)(f->params16 + f->shard_off[k])
                                 : (const void *)(f->params + f->shard_off[k]);
  f->full[k] = comm_reg_alloc(MEM_PARAMS_GATHERED, padded * sizeof(float), "gathered unit");
  if (!f->full[k]) return FSDP_ENOMEM;
  if (++f->gathered > f->max_gathered) f->max_gathered = f->gathered;
  if (bf16) {
    f->recv16[k] =
        comm_reg_alloc(MEM_PARAMS_GATHERED, padded * sizeof(uint16_t), "bf16 gathered unit");
    if (!f->recv16[k]) return FSDP_ENOMEM;
    if (!f->params16) { /* bf16-mixed: the fp32 master rounded for compute (nearest-even) */
      uint16_t *mine = f->recv16[k] + (size_t)f->shard_rank * n;
      f->be->f32_to_bf16(mine, send, n);
      send = mine;
    }
  }
  void *recv = bf16 ? (void *)f->recv16[k] : (void *)f->full[k];
  if (f->S == 1) { /* NO_SHARD: the shard is the unit */
    if (send != recv) memcpy(recv, send, n * (bf16 ? sizeof(uint16_t) : sizeof(float)));
    return FSDP_OK;
  }
  int rc = comm_iall_gather(f->o.shard_comm, send, recv, n, bf16 ? COMM_BF16 : COMM_F32, &f->req[k]);
  return rc ? err_wrap(rc, "gathering unit %d", k) : FSDP_OK;
}

/* Waits for unit k's gather; a bf16 gather is widened to fp32 for the model. */
static int fsdp_gather_wait(fsdp_t *f, int k) {
  int rc = FSDP_OK;
  if (f->req[k]) {
    rc = comm_wait(f->req[k], -1);
    f->req[k] = NULL;
  }
  if (f->recv16[k]) {
    if (!rc) f->be->bf16_to_f32(f->full[k], f->recv16[k], fsdp_padded(f, k));
    comm_reg_free(f->recv16[k]);
    f->recv16[k] = NULL;
  }
  return rc ? err_wrap(rc, "gathering unit %d", k) : FSDP_OK;
}

static void fsdp_free_unit(fsdp_t *f, int k) {
  if (!f->full[k]) return;
  FSDP_ASSERT(!f->req[k]);
  comm_reg_free(f->full[k]);
  f->full[k] = NULL;
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
  return gpt_unit(f->g, u).offset - f->l->units[f->l->unit_of[u]].offset;
}

static int fsdp_params_cb(void *ctx, int u, int phase, float **out) {
  fsdp_t *f = ctx;
  const int k = f->l->unit_of[u];
  int rc;
  if ((rc = fsdp_gather_start(f, k, f->bf16)) || (rc = fsdp_gather_wait(f, k))) return rc;
  /* prefetch: the next unit's gather runs while this one computes; FULL_SHARD
   * keeps at most two units gathered, the strategies that keep parameters
   * hold what they keep anyway */
  if (phase == GPT_FWD && u == f->nmodel - 1) f->fwd_tail = 1;
  int next = fsdp_next_unit(f, u, phase);
  int nk = next >= 0 ? f->l->unit_of[next] : -1;
  if (nk >= 0 && nk != k && (f->keeps || f->gathered < 2) &&
      (rc = fsdp_gather_start(f, nk, f->bf16)))
    return rc;
  *out = f->full[k] + fsdp_model_offset(f, u);
  return FSDP_OK;
}

/* The model unit whose backward is the last use of FSDP unit k: backward
 * runs unit 0 (final norm and logits), then the blocks last to first, so a
 * unit's first block, or block 1 when min_params merged blocks into unit 0. */
static int fsdp_last_bwd_use(const fsdp_t *f, int k) {
  const shard_unit_t *su = &f->l->units[k];
  return su->first == 0 && su->last >= 1 ? 1 : su->first;
}

static int fsdp_release_cb(void *ctx, int u, int phase) {
  fsdp_t *f = ctx;
  const int k = f->l->unit_of[u];
  int next = fsdp_next_unit(f, u, phase);
  if (phase == GPT_FWD && u == 0 && f->fwd_tail) f->fwd_tail = 0, next = -1; /* forward is over */
  /* an FSDP unit stays while the model moves on inside it; kept units are
   * freed once backward is done with them (not in between: unit 0 with
   * merged blocks is used again after the others) */
  if (next >= 0 && f->l->unit_of[next] == k) return FSDP_OK;
  if (!f->keeps || (phase == GPT_BWD && u == fsdp_last_bwd_use(f, k))) fsdp_free_unit(f, k);
  return FSDP_OK;
}

static int fsdp_reduce_finish(fsdp_t *f);

static int fsdp_grads_cb(void *ctx, int u, float **out) {
  fsdp_t *f = ctx;
  const int k = f->l->unit_of[u];
  /* this unit's reduction from the previous micro-batch may still be in flight
   * on its buffer: finish it before backward writes a new gradient */
  if (f->pend_unit == k) {
    int rc = fsdp_reduce_finish(f);
    if (rc) return rc;
  }
  if (!f->ugrad[k]) {
    f->ugrad[k] = comm_reg_calloc(MEM_GRADS, fsdp_padded(f, k) * sizeof(float), "unit gradient");
    if (!f->ugrad[k]) return FSDP_ENOMEM;
  }
  *out = f->ugrad[k] + fsdp_model_offset(f, u);
  return FSDP_OK;
}

/* Adds unit u's reduced gradient src (shard_numel elements, in the reduce
 * dtype) into the gradient shard. */
static void fsdp_grad_add(fsdp_t *f, int u, const void *src) {
  const size_t off = f->shard_off[u], n = f->l->units[u].shard_numel;
  if (!f->true16) {
    const float *s = src;
    for (size_t i = 0; i < n; i++) f->grads[off + i] += s[i];
    return;
  }
  const uint16_t *s16 = src;
  float *a = f->wide, *b = f->wide + FSDP_CHUNK;
  for (size_t i = 0, c; i < n; i += c) {
    c = fsdp_chunk(i, n);
    f->be->bf16_to_f32(a, f->grads16 + off + i, c);
    f->be->bf16_to_f32(b, s16 + i, c);
    for (size_t j = 0; j < c; j++) a[j] += b[j];
    f->be->f32_to_bf16(f->grads16 + off + i, a, c); /* rounds: the sum, into the bf16 shard */
  }
}

/* Completes the gradient reduction in flight: waits for it, averages across
 * the replica group after a reduce-scatter (HYBRID), adds the result into the
 * gradient shard and frees the unit's unsharded gradient. */
static int fsdp_reduce_finish(fsdp_t *f) {
  const int u = f->pend_unit;
  if (u < 0) return FSDP_OK;
  const size_t n = f->l->units[u].shard_numel;
  int rc = f->pend_req ? comm_wait(f->pend_req, -1) : FSDP_OK;
  f->pend_req = NULL;
  f->pend_unit = -1;
  if (!rc && f->S > 1 && f->o.replica_comm)
    rc = comm_all_reduce(f->o.replica_comm, f->pend_out, f->pend_out, n, f->rdt, COMM_AVG);
  if (!rc) fsdp_grad_add(f, u, f->pend_out);
  comm_reg_free(f->pend_buf);
  f->pend_buf = NULL;
  return rc ? err_wrap(rc, "reducing the gradient of unit %d", u) : FSDP_OK;
}

/* Takes unit u's unsharded fp32 gradient for its reduction, in the reduce
 * dtype: the buffer itself, or under bf16-true a bf16 copy (the fp32 one is
 * freed at once). NULL when out of memory. */
static void *fsdp_grad_for_wire(fsdp_t *f, int u) {
  float *g = f->ugrad[u];
  f->ugrad[u] = NULL;
  if (!f->true16) return g;
  const size_t padded = fsdp_padded(f, u);
  uint16_t *g16 = comm_reg_alloc(MEM_GRADS, padded * sizeof(uint16_t), "bf16 unit gradient");
  if (g16) f->be->f32_to_bf16(g16, g, padded); /* rounds: the unit's gradient, for the wire */
  comm_reg_free(g);
  return g16;
}

/* The unit's gradient of this micro-batch is complete: its average over the
 * shard group (reduce-scatter) or the replicas (all-reduce, NO_SHARD) is
 * issued now and completed when the next unit's is, so it runs while backward
 * computes. */
static int fsdp_grads_done_cb(void *ctx, int mu) {
  fsdp_t *f = ctx;
  const int u = f->l->unit_of[mu];
  const shard_unit_t *su = &f->l->units[u];
  /* an FSDP unit is reduced when backward is done with all its model units */
  if (++f->done[u] < su->last - su->first + 1) return FSDP_OK;
  f->done[u] = 0;
  if (f->defer) return FSDP_OK; /* the unit's gradient keeps accumulating unsharded */
  int rc = fsdp_reduce_finish(f);
  if (rc) return rc;
  const size_t n = f->l->units[u].shard_numel;
  void *g = fsdp_grad_for_wire(f, u);
  if (!g) return FSDP_ENOMEM;
  f->pend_unit = u;
  f->pend_buf = g;
  f->pend_out = f->S > 1 ? f->landing : g;
  if (f->S > 1)
    rc = comm_ireduce_scatter(f->o.shard_comm, g, f->landing, n, f->rdt, COMM_AVG, &f->pend_req);
  else if (f->o.replica_comm)
    rc = comm_iall_reduce(f->o.replica_comm, g, g, n, f->rdt, COMM_AVG, &f->pend_req);
  if (rc) {
    f->pend_unit = -1;
    comm_reg_free(f->pend_buf);
    f->pend_buf = NULL;
    return err_wrap(rc, "reducing the gradient of unit %d", u);
  }
  return FSDP_OK;
}

/* Initialisation and weights files are fp32. Under fp32 storage a unit's
 * shard is filled or written in place; bf16 storage converts one unit's shard
 * at a time through *buf (transient workspace, smaller than the fp32 unit a
 * step gathers: never an fp32 copy of the whole shard). */
static int fsdp_unit_buf(fsdp_t *f, float **buf) {
  *buf = NULL;
  if (!f->params16) return FSDP_OK;
  *buf = mem_alloc(MEM_WORKSPACE, f->largest * sizeof(float), "fp32 copy of a unit's shard");
  return *buf ? FSDP_OK : FSDP_ENOMEM;
}

/* Where unit k's shard is in fp32: the shard itself, or buf. */
static float *fsdp_unit_f32(fsdp_t *f, int k, float *buf) {
  return buf ? buf : f->params + f->shard_off[k];
}

/* Stores buf (unit k's shard in fp32) into a bf16 shard; no-op in fp32. */
static void fsdp_unit_store(fsdp_t *f, int k, const float *buf) {
  if (buf) /* rounds: initial and loaded weights, to bf16 storage */
    f->be->f32_to_bf16(f->params16 + f->shard_off[k], buf, f->l->units[k].shard_numel);
}

/* This rank's shard of the initial weights: one device's bytes (in bf16:
 * rounded from them). */
static int fsdp_init_shard(fsdp_t *f, const gpt_config_t *cfg, uint64_t seed) {
  float *buf;
  int rc = fsdp_unit_buf(f, &buf);
  for (int k = 0; !rc && k < f->l->num_units; k++) {
    shard_init_unit(f->l, cfg, seed, f->shard_rank, k, fsdp_unit_f32(f, k, buf));
    fsdp_unit_store(f, k, buf);
  }
  mem_free(buf);
  return rc;
}

int fsdp_load_weights(fsdp_t *f, const char *path) {
  const gpt_config_t *cfg = gpt_get_config(f->g);
  float *buf;
  int rc = fsdp_unit_buf(f, &buf);
  for (int k = 0; !rc && k < f->l->num_units; k++)
    if (!(rc = shard_load_unit(f->l, cfg, path, f->shard_rank, k, fsdp_unit_f32(f, k, buf))))
      fsdp_unit_store(f, k, buf);
  mem_free(buf);
  return rc;
}

int fsdp_write_weights(fsdp_t *f, int fd, const char *path) {
  float *buf;
  int rc = fsdp_unit_buf(f, &buf);
  for (int k = 0; !rc && k < f->l->num_units; k++) {
    if (buf) f->be->bf16_to_f32(buf, f->params16 + f->shard_off[k], f->l->units[k].shard_numel);
    rc = shard_write_unit(f->l, fd, path, f->shard_rank, k, fsdp_unit_f32(f, k, buf));
  }
  mem_free(buf);
  return rc;
}

/* The shard's persistent state: parameters and gradient (fp32, or bf16 under
 * bf16-true), where a reduce-scatter lands, and bf16-true's fp32 chunks. */
static int fsdp_alloc_state(fsdp_t *f) {
  const size_t n = f->l->shard_total;
  /* offload: the shard's state lives in host memory and the optimizer step
   * runs on the CPU (for a CPU device, only the accounting moves) */
  const mem_cat_t pc = f->o.offload ? MEM_OFFLOAD : MEM_PARAMS;
  const mem_cat_t gc = f->o.offload ? MEM_OFFLOAD : MEM_GRADS;
  if (f->true16) {
    f->params16 = comm_reg_alloc(pc, n * sizeof(uint16_t), "parameter shard (bf16)");
    f->grads16 = mem_calloc(gc, n * sizeof(uint16_t), "gradient shard (bf16)");
    f->wide = mem_alloc(MEM_WORKSPACE, 2 * FSDP_CHUNK * sizeof(float), "fp32 gradient chunks");
    f->landing =
        comm_reg_alloc(MEM_COMM, f->largest * sizeof(uint16_t), "reduce-scatter landing");
    return f->params16 && f->grads16 && f->wide && f->landing ? FSDP_OK : FSDP_ENOMEM;
  }
  f->params = comm_reg_alloc(pc, n * sizeof(float), "parameter shard");
  f->grads = mem_calloc(gc, n * sizeof(float), "gradient shard");
  f->landing = comm_reg_alloc(MEM_COMM, f->largest * sizeof(float), "reduce-scatter landing");
  return f->params && f->grads && f->landing ? FSDP_OK : FSDP_ENOMEM;
}

int fsdp_create(fsdp_t **out, const gpt_config_t *cfg, const fsdp_opts_t *o) {
  *out = NULL;
  const shard_mesh_t *m = &o->mesh;
  if ((m->shards > 1) != (o->shard_comm != NULL) || (m->replicas > 1) != (o->replica_comm != NULL))
    return err_set(FSDP_EINVAL, "fsdp: mesh %dx%d needs a shard group communicator when S > 1 "
                   "and a replica group communicator when R > 1", m->replicas, m->shards);
  if (o->shard_comm && o->shard_comm->size != m->shards)
    return err_set(FSDP_EINVAL, "fsdp: the shard group has %d ranks, the mesh says %d",
                   o->shard_comm->size, m->shards);
  if (o->replica_comm && o->replica_comm->size != m->replicas)
    return err_set(FSDP_EINVAL, "fsdp: the replica group has %d ranks, the mesh says %d",
                   o->replica_comm->size, m->replicas);
  fsdp_t *f = calloc(1, sizeof *f);
  if (!f) return err_set(FSDP_ENOMEM, "fsdp: out of memory");
  f->o = *o;
  f->be = kern_cpu();
  f->S = m->shards;
  f->shard_rank = o->shard_comm ? o->shard_comm->rank : 0;
  f->keeps = shard_strategy_keeps_params(m->strategy);
  f->bf16 = o->precision != FSDP_FP32;
  f->true16 = o->precision == FSDP_BF16_TRUE;
  f->rdt = f->true16 ? COMM_BF16 : COMM_F32;
  f->pend_unit = -1;
  adamw_segment_t *segs = NULL;
  int nsegs = 0, rc;
  if ((rc = gpt_create_shell(&f->g, cfg, f->be))) goto fail;
  if ((rc = shard_layout_create(&f->l, cfg, f->S, o->min_params))) goto fail;
  f->nmodel = cfg->layers + 1;
  const int nu = f->l->num_units;
  f->shard_off = calloc((size_t)nu, sizeof *f->shard_off);
  f->full = calloc((size_t)nu, sizeof *f->full);
  f->req = calloc((size_t)nu, sizeof *f->req);
  f->ugrad = calloc((size_t)nu, sizeof *f->ugrad);
  f->recv16 = calloc((size_t)nu, sizeof *f->recv16);
  f->done = calloc((size_t)nu, sizeof *f->done);
  if (!f->shard_off || !f->full || !f->req || !f->ugrad || !f->recv16 || !f->done) {
    rc = err_set(FSDP_ENOMEM, "fsdp: out of memory");
    goto fail;
  }
  size_t off = 0;
  for (int k = 0; k < nu; k++) {
    f->shard_off[k] = off;
    off += f->l->units[k].shard_numel;
    if (f->l->units[k].shard_numel > f->largest) f->largest = f->l->units[k].shard_numel;
  }
  if ((rc = fsdp_alloc_state(f)) || (rc = fsdp_init_shard(f, cfg, o->seed))) goto fail;
  if ((rc = shard_segments(f->l, f->g, f->shard_rank, &segs, &nsegs))) goto fail;
  const mem_cat_t oc = o->offload ? MEM_OFFLOAD : MEM_OPTIM;
  if ((rc = (f->true16 ? adamw_create_segments_bf16
                       : adamw_create_segments)(&f->opt, f->l->shard_total, segs, nsegs, o->hp, oc)))
    goto fail;
  free(segs);
  gpt_unit_hooks_t h = {f, fsdp_params_cb, fsdp_release_cb, fsdp_grads_cb, fsdp_grads_done_cb};
  gpt_set_hooks(f->g, &h);
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
  comm_reg_free(f->pend_buf);
  if (f->l)
    for (int k = 0; k < f->l->num_units; k++) {
      if (f->req && f->req[k]) comm_wait(f->req[k], -1); /* the buffer must outlive the op */
      if (f->req) f->req[k] = NULL;
      if (f->recv16) fsdp_gather_wait(f, k); /* frees a bf16 gather's buffers */
      if (f->full) fsdp_free_unit(f, k);
      if (f->ugrad) comm_reg_free(f->ugrad[k]);
    }
  adamw_destroy(f->opt);
  comm_reg_free(f->params);
  comm_reg_free(f->params16);
  mem_free(f->grads);
  mem_free(f->grads16);
  comm_reg_free(f->landing);
  mem_free(f->wide);
  comm_reg_trim(); /* the segments kept for this runtime's next unit */
  free(f->shard_off);
  free(f->full);
  free(f->req);
  free(f->ugrad);
  free(f->recv16);
  free(f->done);
  shard_layout_destroy(f->l);
  gpt_destroy(f->g);
  free(f);
}

gpt_t *fsdp_model(fsdp_t *f) { return f->g; }
const shard_layout_t *fsdp_layout(const fsdp_t *f) { return f->l; }
int fsdp_max_gathered(const fsdp_t *f) { return f->max_gathered; }
int fsdp_shard_rank(const fsdp_t *f) { return f->shard_rank; }

void fsdp_defer_reduce(fsdp_t *f, int defer) { f->defer = defer; }

void fsdp_zero_grad(fsdp_t *f) {
  if (f->grads16) memset(f->grads16, 0, f->l->shard_total * sizeof *f->grads16);
  else memset(f->grads, 0, f->l->shard_total * sizeof *f->grads);
}

/* Sum of squares of this rank's gradient shard (the kernel sums in double; a
 * bf16 shard is widened chunk by chunk). */
static double fsdp_grad_sumsq(fsdp_t *f) {
  const size_t n = f->l->shard_total;
  if (!f->grads16) return f->be->sumsq(f->grads, n);
  double s = 0;
  for (size_t i = 0, c; i < n; i += c) {
    c = fsdp_chunk(i, n);
    f->be->bf16_to_f32(f->wide, f->grads16 + i, c);
    s += f->be->sumsq(f->wide, c);
  }
  return s;
}

/* Multiplies the gradient shard by s (clipping). */
static void fsdp_grad_scale(fsdp_t *f, float s) {
  const size_t n = f->l->shard_total;
  if (!f->grads16) {
    for (size_t i = 0; i < n; i++) f->grads[i] *= s;
    return;
  }
  for (size_t i = 0, c; i < n; i += c) {
    c = fsdp_chunk(i, n);
    f->be->bf16_to_f32(f->wide, f->grads16 + i, c);
    for (size_t j = 0; j < c; j++) f->wide[j] *= s;
    f->be->f32_to_bf16(f->grads16 + i, f->wide, c); /* rounds: the clipped gradient */
  }
}

int fsdp_step(fsdp_t *f, float lr, float clip, float *norm) {
  int rc0 = fsdp_reduce_finish(f); /* the last unit's gradient (unit 0) */
  if (rc0) return rc0;
  /* the squared norm of the whole gradient: each shard group holds it once
   * (replicas hold equal shards), and padding is zero */
  float sq = (float)fsdp_grad_sumsq(f);
  if (f->o.shard_comm) {
    int rc = comm_all_reduce(f->o.shard_comm, &sq, &sq, 1, COMM_F32, COMM_SUM);
    if (rc) return err_wrap(rc, "gradient norm");
  }
  double n = sqrt((double)sq);
  if (norm) *norm = (float)n;
  if (clip > 0 && n > clip) fsdp_grad_scale(f, (float)(clip / (n + 1e-6)));
  if (f->true16) adamw_step_bf16(f->opt, f->be, f->params16, f->grads16, lr); /* rounds: p, m, v */
  else adamw_step_buffers(f->opt, f->be, f->params, f->grads, lr);
  return FSDP_OK;
}

int fsdp_mean(fsdp_t *f, float *x) {
  int rc = FSDP_OK;
  if (f->o.shard_comm) rc = comm_all_reduce(f->o.shard_comm, x, x, 1, COMM_F32, COMM_AVG);
  if (!rc && f->o.replica_comm) rc = comm_all_reduce(f->o.replica_comm, x, x, 1, COMM_F32, COMM_AVG);
  return rc;
}

void fsdp_reshard(fsdp_t *f) {
  if (fsdp_reduce_finish(f)) LOG_WARN("fsdp", "reshard: %s", err_msg());
  for (int k = 0; k < f->l->num_units; k++) {
    fsdp_gather_wait(f, k); /* nothing may be in flight into a buffer we free */
    fsdp_free_unit(f, k);
  }
}

int fsdp_gather_params(fsdp_t *f, float *dst) {
  int rc0 = fsdp_reduce_finish(f);
  if (rc0) return rc0;
  for (int k = 0; k < f->l->num_units; k++) {
    int rc;
    /* the stored weights (fp32 master, or the bf16 shard widened exactly),
     * whatever the policy gathers for compute */
    if ((rc = fsdp_gather_start(f, k, f->true16)) || (rc = fsdp_gather_wait(f, k))) return rc;
    memcpy(dst + f->l->units[k].offset, f->full[k], f->l->units[k].numel * sizeof(float));
    fsdp_free_unit(f, k);
  }
  return FSDP_OK;
}

const char *fsdp_precision_describe(fsdp_precision_t p) {
  switch (p) {
  case FSDP_BF16_MIXED:
    return "bf16-mixed: parameters gathered and computed with in bf16 (the CPU backend's "
           "arithmetic is fp32 on those values), gradients reduced in fp32, fp32 master "
           "weights and AdamW state on the shard";
  case FSDP_BF16_TRUE:
    return "bf16-true: parameter and gradient shards stored in bf16, gathered and reduced in "
           "bf16, computed with in fp32 on the bf16 values, AdamW m and v in bf16 (8 bytes "
           "per parameter against fp32's 16); an update below half a bf16 ulp of its weight "
           "(about 2^-9 of it) is lost";
  default:
    return "fp32: storage, compute, reduce and optimizer all fp32";
  }
}

int fsdp_precision_parse(const char *s, fsdp_precision_t *out) {
  if (!strcmp(s, "fp32")) *out = FSDP_FP32;
  else if (!strcmp(s, "bf16-mixed")) *out = FSDP_BF16_MIXED;
  else if (!strcmp(s, "bf16-true")) *out = FSDP_BF16_TRUE;
  else
    return err_set(FSDP_EINVAL, "precision: \"%s\" is not a policy; choose fp32, bf16-mixed or "
                   "bf16-true", s);
  return FSDP_OK;
}

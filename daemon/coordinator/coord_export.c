/* coord_export: ExportCheckpoint, a job's committed checkpoint streamed to
 * the client as one safetensors file (daemon/job/safetensors.h), so fsdpctl,
 * which links only the wire, can write it wherever its user runs it.
 *
 * The checkpoint is one the store says is COMMITTED (the request names a
 * job and a step, never a path: the directory is the one the coordinator
 * recorded), and what is read is that checkpoint: its directory must
 * resolve inside the coordinator's roots (job_path_in_roots, the check a
 * job's paths pass: no link out of them), and its manifest must say what
 * the store recorded at commit (step, shards, each shard's size and
 * checksum: ckpt_manifest_check); the reader checks every shard and block
 * it reads against that manifest. A checkpoint that is not as committed is
 * refused with FSDP_ESTATE (FAILED_PRECONDITION: the request is fine, the
 * checkpoint is not), and when its directory is there and what was read
 * is damaged or other files (not one outside the roots, which is not
 * read), marked damaged as a rank's report checked here would be
 * (coord_ckpt_mark_damaged), and set aside as that one is, on the pool
 * (step-N.damaged: coord_ckpt_set_aside), so that an attempt resuming from
 * an earlier checkpoint writes its step again; not while another export
 * reads it. Reading and converting run on libuv's thread pool, one model
 * unit at a time, never on the loop: the loop only hands pieces to gRPC, up
 * to COORD_EXPORT_BACKLOG messages ahead of the client, waiting on a timer
 * when the client is slower. Memory per export: one unit in fp32 and as
 * stored, plus that backlog. At most COORD_EXPORT_MAX exports run at once;
 * another is refused (ELIMIT), saying so. A client that goes away ends its
 * export at the next piece. While an export reads a checkpoint, retention
 * keeps it (coord_export_reads), and runs again for the job when the export
 * ends: a job that goes on committing never pulls files from under one. A
 * client that accepts nothing for FSDP_STREAM_STALL_S (60 s) is ended. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"
#include "daemon/coordinator/coord_impl.h"
#include "daemon/job/job.h"
#include "daemon/job/safetensors.h"

#define COORD_EXPORT_CHUNK (1u << 20) /* bytes per message: under gRPC's 4 MiB receive limit */
#define COORD_EXPORT_BACKLOG 8        /* messages queued ahead of the client */
#define COORD_EXPORT_WAIT_MS 2        /* a full backlog is looked at again after this */

typedef struct coord_export {
  coord_t *c;
  rpc_call_t *call;         /* NULL once the call ended */
  int64_t job, step;         /* step: the store's, as found */
  uint32_t dtype;
  char dir[STORE_PATH_MAX];  /* the store's: what retention keeps */
  int shards;                /* what committed it, from the store ... */
  ckpt_shard_report_t *rep;  /* ... shards of them, checked against the manifest */
  const char *const *roots;  /* the coordinator's (its options live as long as the process) */
  int nroots;
  char real[PATH_MAX];       /* dir resolved inside them: what is read */
  int damaged;               /* the pool's failure is the checkpoint's, its directory there */
  int shared;                /* another export reads dir: not set aside under it */
  char aside[STORE_PATH_MAX]; /* damaged: where it was set aside ("": left in place) */
  char aside_err[512];       /* ... or why it was not */
  safetensors_export_t *x;  /* opened on the pool ... */
  int opened;               /* ... once this is set */
  uv_work_t work;
  int working;              /* a pool task is in flight */
  int rc;                   /* its result, and its message: */
  char err[512];
  const uint8_t *piece;     /* what the last task produced ... */
  size_t len, off;          /* ... its length, and how much of it went out */
  uint64_t sent;
  uint64_t stalled_since;   /* loop ms when the backlog was found full and still is; 0: not */
  uv_timer_t wait;
} coord_export_t;

static void coord_export_next(coord_export_t *e);

int coord_export_reads(const coord_t *c, const char *dir) {
  int n = 0;
  for (int i = 0; i < COORD_EXPORT_MAX; i++)
    n += c->exports[i] && !strcmp(c->exports[i]->dir, dir);
  return n;
}

int coord_export_of_job(const coord_t *c, int64_t job) {
  for (int i = 0; i < COORD_EXPORT_MAX; i++)
    if (c->exports[i] && c->exports[i]->job == job) return 1;
  return 0;
}

/* The export is over and no pool task holds it: its slot is free, and what
 * retention kept for it may go now. */
static void coord_export_free_cb(uv_handle_t *h) {
  coord_export_t *e = h->data;
  coord_t *c = e->c; /* NULL: the coordinator is being destroyed */
  safetensors_export_close(e->x);
  for (int i = 0; c && i < COORD_EXPORT_MAX; i++)
    if (c->exports[i] == e) c->exports[i] = NULL;
  const coord_job_t *x = c ? coord_job_info(c, e->job) : NULL;
  if (x) coord_ckpt_retain(c, e->job, x->keep);
  free(e->rep);
  free(e);
}

void coord_export_detach(coord_t *c) {
  for (int i = 0; i < COORD_EXPORT_MAX; i++)
    if (c->exports[i]) c->exports[i]->c = NULL, c->exports[i] = NULL;
}

/* Ends the export: the call (when still there) with rc, then the export
 * once no pool task holds it. */
static void coord_export_end(coord_export_t *e, int rc) {
  if (e->call) {
    if (rc) LOG_WARN("coord", "export of job j-%" PRId64 " step %" PRId64 ": %s", e->job, e->step, err_msg());
    else LOG_INFO("coord", "export of job j-%" PRId64 " step %" PRId64 ": %" PRIu64 " bytes sent", e->job,
                  e->step, e->sent);
    rpc_call_finish(e->call, rc);
    e->call = NULL;
  }
  if (e->working || uv_is_closing((uv_handle_t *)&e->wait)) return;
  uv_timer_stop(&e->wait);
  uv_close((uv_handle_t *)&e->wait, coord_export_free_cb);
}

static void coord_export_cancel_cb(rpc_call_t *call, void *arg) {
  (void)call;
  coord_export_t *e = arg;
  e->call = NULL; /* freed as this returns */
  coord_export_end(e, FSDP_OK);
}

/* On the pool: the checkpoint's directory resolved inside the roots (what
 * is read has no link out of them), opened, and its manifest checked
 * against what the store recorded at commit. */
static int coord_export_open(coord_export_t *e) {
  int rc = job_path_in_roots("checkpoint", e->dir, e->roots, e->nroots, "the coordinator reads "
                             "no checkpoint there: put the step's own files back in its "
                             "directory (no link out of the roots)", e->real);
  if (rc == FSDP_EINVAL) rc = FSDP_ESTATE; /* not the request's fault; not damaged either */
  if (!rc) rc = safetensors_export_open(&e->x, e->real, e->dtype);
  if (!rc)
    rc = ckpt_manifest_check(safetensors_export_manifest(e->x), e->dir, e->step, e->shards,
                             e->rep);
  return rc;
}

/* On the pool: open the checkpoint, or produce the next piece. A failure
 * the checkpoint's (a file damaged, missing or not the one committed:
 * what coord_ckpt_verify_done takes for damaged) with its directory there
 * is the checkpoint's damage, not the file system's view of it; the
 * checkpoint is set aside then, here, off the loop (a rename and an
 * fsync). */
static void coord_export_work_cb(uv_work_t *w) {
  coord_export_t *e = w->data;
  e->rc = e->opened ? safetensors_export_next(e->x, &e->piece, &e->len) : coord_export_open(e);
  if (!e->rc) return;
  snprintf(e->err, sizeof e->err, "%s", err_msg());
  struct stat st;
  e->damaged = (e->rc == FSDP_EFORMAT || e->rc == FSDP_ENOENT) && !stat(e->dir, &st) &&
               S_ISDIR(st.st_mode);
  if (e->damaged && !e->shared)
    coord_ckpt_set_aside(e->roots, e->nroots, e->dir, e->aside, sizeof e->aside, e->aside_err,
                         sizeof e->aside_err);
}

/* A pool task failed (e->rc, e->err): the error the call ends with. A
 * checkpoint that is not as committed is FSDP_ESTATE, whatever part of it
 * showed that, and one found damaged is marked so, saying where it went. */
static int coord_export_failed(coord_export_t *e) {
  if (e->rc != FSDP_EFORMAT && e->rc != FSDP_ENOENT && e->rc != FSDP_ESTATE)
    return err_set(e->rc, "%s", e->err);
  char how[STORE_REASON_MAX], marked[STORE_PATH_MAX + 96] = "";
  snprintf(how, sizeof how, "an export read: %.400s", e->err);
  if (e->damaged && e->c)
    coord_ckpt_mark_damaged(e->c, e->job, e->step, how, e->dir, e->aside,
                            e->shared ? "another export reads it" : e->aside_err);
  if (e->damaged)
    snprintf(marked, sizeof marked, " it is marked damaged (committed no more)%s%s;",
             e->aside[0] ? " and set aside as " : "", e->aside);
  return err_set(FSDP_ESTATE, "the checkpoint of step %" PRId64 " of job j-%" PRId64 " is not as "
                 "committed: %s;%s export another step (fsdpctl checkpoints j-%" PRId64 " lists "
                 "them)", e->step, e->job, e->err, marked, e->job);
}

static void coord_export_wait_cb(uv_timer_t *t);

/* Hands the piece to gRPC, as far as the backlog allows. A client that
 * accepts nothing for FSDP_STREAM_STALL_S has its export ended: it would
 * hold one of the COORD_EXPORT_MAX slots, and its checkpoint from
 * retention, for as long as it stays connected. */
static void coord_export_pump(coord_export_t *e) {
  if (!e->call) return coord_export_end(e, FSDP_OK);
  while (e->off < e->len) {
    if (rpc_call_backlog(e->call) >= COORD_EXPORT_BACKLOG) {
      const uint64_t now = coord_mono_ms(e->c);
      const int64_t stall_s = param_stream_stall_s() < 1 ? 1 : param_stream_stall_s();
      if (!e->stalled_since) e->stalled_since = now;
      if (now - e->stalled_since < (uint64_t)stall_s * 1000) {
        uv_timer_start(&e->wait, coord_export_wait_cb, COORD_EXPORT_WAIT_MS, 0);
        return;
      }
      LOG_WARN("coord", "export of job j-%" PRId64 " step %" PRId64 ": its client accepted "
               "nothing for %" PRId64 " s; ended", e->job, e->step, stall_s);
      rpc_call_abort(e->call, err_set(FSDP_ECANCELED, "the coordinator ended this export: its "
                                      "client accepted nothing for %" PRId64 " s "
                                      "(FSDP_STREAM_STALL_S); read it as it comes", stall_s));
      e->call = NULL;
      return coord_export_end(e, FSDP_OK);
    }
    e->stalled_since = 0;
    const size_t n = e->len - e->off < COORD_EXPORT_CHUNK ? e->len - e->off : COORD_EXPORT_CHUNK;
    Fsdp__V1__ExportChunk m = FSDP__V1__EXPORT_CHUNK__INIT;
    m.offset = e->sent;
    m.data.data = (uint8_t *)e->piece + e->off;
    m.data.len = n;
    m.total_bytes = safetensors_export_bytes(e->x);
    m.step = e->step;
    int rc = rpc_call_send(e->call, &m.base);
    if (rc) return coord_export_end(e, rc);
    e->off += n, e->sent += n;
  }
  coord_export_next(e);
}

static void coord_export_wait_cb(uv_timer_t *t) { coord_export_pump(t->data); }

static void coord_export_after_cb(uv_work_t *w, int status) {
  coord_export_t *e = w->data;
  e->working = 0;
  const int rc = !status && e->rc ? coord_export_failed(e) : FSDP_OK; /* marked even if no call */
  if (!e->call) return coord_export_end(e, FSDP_OK);
  if (status) return coord_export_end(e, err_set(FSDP_ECANCELED, "export: canceled"));
  if (rc) return coord_export_end(e, rc);
  if (!e->opened) {
    e->opened = 1;
    return coord_export_next(e);
  }
  if (!e->len) {
    const uint64_t total = safetensors_export_bytes(e->x);
    return coord_export_end(e, e->sent == total ? FSDP_OK
                                                : err_set(FSDP_EINTERNAL, "export: %" PRIu64
                                                          " bytes of %" PRIu64, e->sent, total));
  }
  e->off = 0;
  coord_export_pump(e);
}

static void coord_export_next(coord_export_t *e) {
  e->working = 1;
  e->work.data = e;
  e->shared = coord_export_reads(e->c, e->dir) > 1; /* asked on the loop: exports live there */
  int rc = uv_queue_work(e->c->loop, &e->work, coord_export_work_cb, coord_export_after_cb);
  if (rc) {
    e->working = 0;
    coord_export_end(e, err_set(FSDP_EINTERNAL, "export: uv_queue_work: %s", uv_strerror(rc)));
  }
}

/* The committed checkpoint of job at step (0: the latest) in *k. The error
 * lists the committed steps. */
static int coord_export_find(coord_t *c, int64_t job, const char *job_id, int64_t step,
                             store_ckpt_t *k) {
  store_ckpt_t *v = NULL;
  int n = 0, rc = store_ckpt_list(c->st, job, &v, &n), found = -1;
  char steps[256] = "";
  size_t sl = 0;
  for (int i = 0; !rc && i < n; i++) {
    if (v[i].state != STORE_CKPT_COMMITTED || coord_ckpt_removing(c, v[i].dir)) continue;
    if (sl < sizeof steps)
      sl += (size_t)snprintf(steps + sl, sizeof steps - sl, "%s%" PRId64, sl ? ", " : "", v[i].step);
    if (step ? v[i].step == step : found < 0 || v[i].step > v[found].step) found = i;
  }
  if (!rc && found < 0)
    rc = step ? err_set(FSDP_ENOTFOUND, "step: job %s has no committed checkpoint of step %" PRId64
                        "%s%s%s", job_id, step, sl ? " (committed: " : "; it has none", steps,
                        sl ? ")" : "")
              : err_set(FSDP_ENOTFOUND, "job %s has no committed checkpoint yet (fsdpctl "
                        "checkpoints %s lists them)", job_id, job_id);
  if (!rc) *k = v[found];
  free(v);
  return rc;
}

void coord_export_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__ExportCheckpointRequest *q = (const void *)req;
  store_job_t j;
  if (coord_job_arg(c, call, q->job_id, &j)) return;
  const int64_t job = j.id;
  store_job_free(&j);
  uint32_t dtype;
  if (!q->dtype[0] || !strcmp(q->dtype, "fp32")) dtype = SAFETENSORS_F32;
  else if (!strcmp(q->dtype, "bf16")) dtype = SAFETENSORS_BF16;
  else return (void)rpc_call_finish(call, err_set(FSDP_EINVAL, "dtype: '%.32s': give fp32 or bf16",
                                                  q->dtype));
  if (q->format[0] && strcmp(q->format, "safetensors"))
    return (void)rpc_call_finish(call, err_set(FSDP_EINVAL, "format: '%.32s': the one format is "
                                               "safetensors", q->format));
  if (q->step < 0)
    return (void)rpc_call_finish(call, err_set(FSDP_EINVAL, "step: %" PRId64 ": give a committed "
                                               "step, or 0 for the latest", q->step));
  int slot = 0;
  while (slot < COORD_EXPORT_MAX && c->exports[slot]) slot++;
  if (slot == COORD_EXPORT_MAX)
    return (void)rpc_call_finish(call, err_set(FSDP_ELIMIT, "export: %d exports are running, the "
                                               "most at once; try again when one ends",
                                               COORD_EXPORT_MAX));
  coord_export_t *e = calloc(1, sizeof *e);
  if (!e) return (void)rpc_call_finish(call, err_set(FSDP_ENOMEM, "export: out of memory"));
  e->c = c, e->job = job, e->dtype = dtype, e->roots = c->o.roots, e->nroots = c->o.nroots;
  store_ckpt_t k;
  int rc = coord_export_find(c, job, q->job_id, q->step, &k);
  if (!rc) rc = coord_ckpt_reports(c, &k, &e->rep);
  if (rc) {
    free(e);
    return (void)rpc_call_finish(call, rc);
  }
  e->step = k.step, e->shards = k.shards;
  snprintf(e->dir, sizeof e->dir, "%s", k.dir);
  uv_timer_init(c->loop, &e->wait);
  e->wait.data = e;
  e->call = call;
  c->exports[slot] = e;
  rpc_call_on_cancel(call, coord_export_cancel_cb, e);
  coord_export_next(e);
}

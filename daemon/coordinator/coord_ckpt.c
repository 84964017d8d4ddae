/* coord_ckpt: checkpoints as the coordinator commits them.
 *
 * Each rank of a job's first replica writes its shard and reports it through
 * its fsdpd (ReportCheckpointShard: step, rank, path, bytes, checksum). The
 * coordinator checks the report against what it knows (the attempt's epoch,
 * the rank's shard, the path the format gives that shard under the job's
 * checkpoint_dir: nothing else is ever touched), records it, and when every
 * shard is in, commits: ckpt_commit reads each shard's header, checks it
 * against its report and writes the manifest (fsynced, renamed); then the
 * store marks it COMMITTED in one transaction, and retention removes the
 * committed ones beyond the job's keep_checkpoints (never the latest). A
 * shard that does not check aborts the checkpoint, and so, at once, does a
 * report that a rank could not write its shard (`failed`: a full disk, a
 * shard holding NaN), opening it aborted when it is the first word of it.
 *
 * The manifest is written before the store says COMMITTED: it is what a
 * loader trusts. A coordinator that dies between the two finds, once back,
 * an OPEN checkpoint with every shard reported and commits it again (every
 * shard checked again, the manifest rewritten); one missing a shard stays
 * open until its timeout aborts it. Never half.
 *
 * Aborted checkpoints (a shard missing after --checkpoint-timeout-ms, a bad
 * shard, one not written, or the attempt's end) have their files removed once no attempt of
 * the job runs (a new attempt could be writing the same step's directory),
 * or sooner, while their attempt runs, once each of their shards has been
 * reported, written or not (coord_tally_t): on a nearly full disk the
 * shards written of one would otherwise fail every later checkpoint.
 * Step directories the store has no checkpoint for (a rank killed
 * mid-save, a shard report that never came) are swept: a job's
 * checkpoint_dir at a time, only when no rank can be writing there and no
 * other job has that directory, only the format's names, never a committed
 * one (coord_ckpt_sweep_next).
 *
 * Committing and removing are file system work that can take long (a
 * shard per rank, on a network file system): they run on libuv's thread
 * pool, never the loop, one task per checkpoint (coord_ckpt_commit,
 * coord_ckpt_remove) and one sweep at a time, and the store hears of each
 * when it is done. A directory being removed is not exported. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/coordinator/coord_impl.h"
#include "daemon/job/ckpt.h"
#include "daemon/job/job.h"

/* "xxh64:<16 hex digits>" */
static int coord_ckpt_sum(const char *s, uint64_t *out) {
  char *end = NULL;
  if (!s || strncmp(s, "xxh64:", 6) || strlen(s) != 22)
    return err_set(FSDP_EINVAL, "checksum: \"%.40s\" is not \"xxh64:<16 hex digits>\"", s ? s : "");
  *out = strtoull(s + 6, &end, 16);
  if (*end) return err_set(FSDP_EINVAL, "checksum: \"%.40s\" is not hex", s);
  return FSDP_OK;
}

/* The checkpoint of step was aborted (by this coordinator: the store said
 * so to the caller): one line and the count (fsdp_checkpoint_aborts_total);
 * the store added the event. */
static void coord_ckpt_aborted(coord_t *c, int64_t job, int64_t step, const char *why) {
  LOG_WARN("coord", "job j-%lld: checkpoint of step %lld aborted: %s", (long long)job,
           (long long)step, why);
  c->ckpt_aborts++;
}

/* Why a checkpoint's directory goes. */
typedef enum {
  COORD_RM_ABORTED, /* aborted, and no attempt of the job runs */
  COORD_RM_SETTLED, /* aborted, and every shard of it reported by its attempt, which runs */
  COORD_RM_RETAINED /* committed, beyond keep_checkpoints: the store forgets it */
} coord_rm_why_t;

/* A checkpoint directory on its way out, on the pool. */
typedef struct coord_rm {
  uv_work_t work;
  coord_t *c; /* NULL once the coordinator went (coord_ckpt_detach) */
  int64_t job, step, epoch;
  coord_rm_why_t why;
  const char *const *roots; /* the coordinator's (its options live as long as the process) */
  int nroots;
  int rc;
  char err[512];
  char dir[STORE_PATH_MAX];
  struct coord_rm *next;
} coord_rm_t;

/* A committed checkpoint a rank found damaged as its attempt resumed,
 * checked whole by the coordinator on the pool (ckpt_verify) before it is
 * taken for damaged: a node whose mount of checkpoint_dir is missing or
 * stale reads nothing, and would otherwise demote, one after another, every
 * checkpoint of the job (and the janitor remove them). */
typedef struct coord_verify {
  uv_work_t work;
  coord_t *c; /* NULL once the coordinator went (coord_ckpt_detach) */
  int64_t job, step;
  char dir[STORE_PATH_MAX];
  char said[STORE_REASON_MAX]; /* what the rank said */
  int rc, no_dir;
  int exported;                /* an export reads it: not set aside under it */
  const char *const *roots;    /* the coordinator's */
  int nroots;
  char err[512];
  char aside[STORE_PATH_MAX];  /* damaged: where it was set aside ("": left in place) */
  char aside_err[512];         /* ... or why it was not */
  struct coord_verify *next;
} coord_verify_t;

/* A directory whose removal failed (a file the format does not name in it,
 * a permission): tried again after a wait that doubles up to
 * COORD_RM_RETRY_MAX_MS, and logged on the first failure and whenever its
 * error changes, not at every janitor pass. */
#define COORD_RM_RETRY_MIN_MS 1000
#define COORD_RM_RETRY_MAX_MS 600000
typedef struct coord_rm_fail {
  char dir[STORE_PATH_MAX]; /* the key */
  uint64_t next_ms;         /* not tried before (loop time) */
  uint64_t wait_ms;
  uint64_t err_sum;         /* XXH64 | 1 of the last error logged */
  UT_hash_handle hh;
} coord_rm_fail_t;

/* An aborted checkpoint of a running attempt and which of its shards that
 * attempt's ranks have reported, written or not. A rank reports a shard
 * once its write of it has ended (renamed, or its temporary file and the
 * empty directory it made removed) and never writes that step again in
 * that attempt (fsdp-train tries a failed one again only unreported), so
 * once every shard is in, nothing writes into the directory: its files go
 * while the job runs (COORD_RM_SETTLED). One a shard never reports of
 * (a rank killed mid-save, a lost report), and every one a restarted
 * coordinator knew, waits for no attempt to run, as before. */
typedef struct coord_tally {
  int64_t job, step, epoch;
  int shards, heard;
  struct coord_tally *next;
  uint8_t seen[]; /* a bit per shard */
} coord_tally_t;

static coord_tally_t *coord_tally_find(coord_t *c, int64_t job, int64_t step, int64_t epoch) {
  for (coord_tally_t *t = c->tallies; t; t = t->next)
    if (t->job == job && t->step == step && t->epoch == epoch) return t;
  return NULL;
}

static void coord_tally_drop(coord_t *c, const coord_tally_t *t) {
  for (coord_tally_t **pp = &c->tallies; *pp; pp = &(*pp)->next)
    if (*pp == t) {
      *pp = t->next;
      free((void *)t);
      return;
    }
}

/* Shard (-1: every one) of k, aborted and of a running attempt, was
 * reported by its rank: 1 once each of k's shards has been. The shards
 * reported written before it was aborted count from the store. */
static int coord_tally_heard(coord_t *c, const store_ckpt_t *k, int shard) {
  coord_tally_t *t = coord_tally_find(c, k->job_id, k->step, k->epoch);
  if (!t && (t = calloc(1, sizeof *t + ((size_t)k->shards + 7) / 8))) {
    t->job = k->job_id, t->step = k->step, t->epoch = k->epoch, t->shards = k->shards;
    t->next = c->tallies;
    c->tallies = t;
    store_ckpt_shard_t *sh = NULL;
    int n = 0;
    if (shard >= 0 && !store_ckpt_shards(c->st, k->job_id, k->step, &sh, &n))
      for (int i = 0; i < n; i++) coord_tally_heard(c, k, sh[i].shard);
    free(sh);
  }
  if (!t) return 0; /* out of memory: removed once no attempt runs */
  for (int j = shard < 0 ? 0 : shard; j < t->shards && (shard < 0 || j == shard); j++)
    if (!(t->seen[j / 8] & (1u << (j % 8)))) t->seen[j / 8] |= (uint8_t)(1u << (j % 8)), t->heard++;
  return t->heard == t->shards;
}

/* Whether k, aborted, may go while job j runs: its attempt is j's running
 * one and every shard of it was reported. */
static int coord_tally_settled(coord_t *c, const store_ckpt_t *k, const store_job_t *j) {
  const coord_tally_t *t = coord_tally_find(c, k->job_id, k->step, k->epoch);
  return t && t->heard == t->shards && j->state == STORE_JOB_RUNNING && j->epoch == k->epoch;
}

/* Forgets the tallies of attempts no longer running (their checkpoints go
 * once no attempt runs, the next attempt's are its own). */
static void coord_tally_trim(coord_t *c) {
  for (coord_tally_t *t = c->tallies, *next; t; t = next) {
    next = t->next;
    store_job_t j;
    if (store_job_get(c->st, t->job, &j)) continue;
    const int live = j.state == STORE_JOB_RUNNING && j.epoch == t->epoch;
    store_job_free(&j);
    if (!live) coord_tally_drop(c, t);
  }
}

static void coord_ckpt_remove(coord_t *c, const store_ckpt_t *k, coord_rm_why_t why);

/* Shard of k, an aborted checkpoint of a running attempt, was reported by
 * its rank (written too late, or not written): once every shard of it has
 * been, its files go. A checkpoint found damaged is not the attempt's own. */
static void coord_ckpt_settle(coord_t *c, const store_ckpt_t *k, int shard) {
  if (k->state != STORE_CKPT_ABORTED || !strncmp(k->reason, "damaged:", 8)) return;
  if (coord_tally_heard(c, k, shard) && !coord_export_reads(c, k->dir))
    coord_ckpt_remove(c, k, COORD_RM_SETTLED);
}

int coord_ckpt_removing(const coord_t *c, const char *dir) {
  for (const coord_rm_t *r = c->removing; r; r = r->next)
    if (!strcmp(r->dir, dir)) return 1;
  return 0;
}

static int coord_ckpt_removing_job(const coord_t *c, int64_t job) {
  for (const coord_rm_t *r = c->removing; r; r = r->next)
    if (r->job == job) return 1;
  return 0;
}

#define COORD_SWEEP_MAX 16 /* step directories one sweep removes, or reports left, at most */

/* A job's checkpoint_dir swept on the pool (ckpt_sweep). */
typedef struct coord_sweep {
  uv_work_t work;
  coord_t *c;           /* NULL once the coordinator went (coord_ckpt_detach) */
  int64_t job;
  char dir[STORE_PATH_MAX];
  store_ckpt_t *rows;   /* the store's checkpoints of the job (why one went) */
  int nrows;
  int64_t *skip;        /* their steps, but aborted ones whose files were removed */
  int nskip;
  int64_t now_ms, quiet_ms;
  const char *const *roots; /* the coordinator's */
  int nroots;
  int rc, n;
  char err[512];
  ckpt_leftover_t out[COORD_SWEEP_MAX];
} coord_sweep_t;

/* Whether job's checkpoint_dir is being swept: as the job's own, or as
 * that of the job swept, given to this one by a submit since. */
static int coord_ckpt_sweeping(coord_t *c, int64_t job) {
  if (!c->sweeping) return 0;
  if (c->sweeping->job == job) return 1;
  const coord_job_t *x = coord_job_info(c, job);
  return x && !strcmp(x->ckpt_dir, c->sweeping->dir);
}

/* On the pool: dir (a job's checkpoint_dir or one of its step directories,
 * resolved at submit: job_paths_check) resolved again inside the
 * coordinator's roots into real (PATH_MAX), and still itself: a directory
 * of its path replaced since by a link (by anyone who can write where it
 * lies), out of the roots or into another job's, has the coordinator write
 * and remove nothing there. FSDP_ENOENT: dir is not there. */
static int coord_ckpt_real(const char *const *roots, int nroots, const char *dir, char *real) {
  static const char fix[] = "the coordinator writes and removes nothing there: give the job's "
                            "checkpoint_dir back its own directory (no link in its path)";
  int rc = job_path_in_roots("checkpoint_dir", dir, roots, nroots, fix, real);
  if (!rc && strcmp(real, dir))
    rc = err_set(FSDP_EINVAL, "checkpoint_dir: %s resolves to %s since the job was submitted (a "
                 "link in its path); %s", dir, real, fix);
  return rc;
}

static void coord_ckpt_rm_work(uv_work_t *w) {
  coord_rm_t *r = w->data;
  char real[PATH_MAX];
  r->rc = coord_ckpt_real(r->roots, r->nroots, r->dir, real);
  if (!r->rc || r->rc == FSDP_ENOENT) r->rc = ckpt_remove(r->dir); /* gone: it says what of it */
  if (r->rc) snprintf(r->err, sizeof r->err, "%s", err_msg()); /* err_msg is per thread */
}

static void coord_ckpt_rm_done(uv_work_t *w, int status) {
  coord_rm_t *r = w->data;
  coord_t *c = r->c;
  if (c) {
    for (coord_rm_t **pp = &c->removing; *pp; pp = &(*pp)->next)
      if (*pp == r) {
        *pp = r->next;
        break;
      }
    c->dirty = 1; /* its job may wait for it to be placed again */
    coord_rm_fail_t *f;
    HASH_FIND_STR(c->rm_failed, r->dir, f);
    if (status || r->rc) {
      const char *why = status ? uv_strerror(status) : r->err;
      if (!f && (f = calloc(1, sizeof *f))) {
        snprintf(f->dir, sizeof f->dir, "%s", r->dir);
        HASH_ADD_STR(c->rm_failed, dir, f);
      }
      const uint64_t sum = coord_reason_sum(why);
      if (f) {
        f->wait_ms = f->wait_ms ? f->wait_ms * 2 : COORD_RM_RETRY_MIN_MS;
        if (f->wait_ms > COORD_RM_RETRY_MAX_MS) f->wait_ms = COORD_RM_RETRY_MAX_MS;
        f->next_ms = coord_mono_ms(c) + f->wait_ms;
      }
      if (!f || f->err_sum != sum)
        LOG_WARN("coord", "job j-%lld: checkpoint of step %lld not removed: %s (tried again in "
                 "%.0f s, less often while this stays)", (long long)r->job, (long long)r->step,
                 why, f ? (double)f->wait_ms / 1e3 : 1.0);
      if (f) f->err_sum = sum;
    } else {
      if (f) {
        HASH_DEL(c->rm_failed, f);
        free(f);
      }
      const int forget = r->why == COORD_RM_RETAINED;
      const coord_tally_t *t = coord_tally_find(c, r->job, r->step, r->epoch);
      if (t) coord_tally_drop(c, t);
      if (store_ckpt_removed(c->st, r->job, r->step, r->epoch, forget)) {
        LOG_WARN("coord", "job j-%lld: checkpoint of step %lld: %s", (long long)r->job,
                 (long long)r->step, err_msg());
      } else if (forget) {
        LOG_INFO("coord", "job j-%lld: checkpoint of step %lld removed (keep_checkpoints)",
                 (long long)r->job, (long long)r->step);
      } else {
        c->ckpt_aborted_removed++;
        LOG_INFO("coord", "job j-%lld: aborted checkpoint of step %lld removed (%s)",
                 (long long)r->job, (long long)r->step, r->why == COORD_RM_SETTLED
                 ? "while its attempt runs: every shard of it was reported, written or not, so "
                   "no rank writes there any more, and its space is free for the next checkpoints"
                 : "no attempt of the job runs");
      }
    }
  }
  free(r);
}

/* Removes k's directory on the pool, then tells the store (retained: the
 * row goes too). Once per directory at a time. */
static void coord_ckpt_remove(coord_t *c, const store_ckpt_t *k, coord_rm_why_t why) {
  if (coord_ckpt_removing(c, k->dir)) return;
  const coord_rm_fail_t *f;
  HASH_FIND_STR(c->rm_failed, k->dir, f);
  if (f && coord_mono_ms(c) < f->next_ms) return; /* it failed: not yet again */
  coord_rm_t *r = calloc(1, sizeof *r);
  if (!r) return; /* the next pass tries again */
  r->c = c, r->job = k->job_id, r->step = k->step, r->epoch = k->epoch, r->why = why;
  r->roots = c->o.roots, r->nroots = c->o.nroots;
  snprintf(r->dir, sizeof r->dir, "%s", k->dir);
  r->work.data = r;
  if (uv_queue_work(c->loop, &r->work, coord_ckpt_rm_work, coord_ckpt_rm_done)) {
    free(r);
    return;
  }
  r->next = c->removing;
  c->removing = r;
}

void coord_ckpt_retain(coord_t *c, int64_t job, int keep) {
  store_ckpt_t *v = NULL;
  int n = 0, kept = 0;
  if (keep <= 0 || store_ckpt_list(c->st, job, &v, &n)) return;
  for (int i = 0; i < n; i++) { /* newest first */
    if (v[i].state != STORE_CKPT_COMMITTED || ++kept <= keep) continue;
    if (coord_export_reads(c, v[i].dir)) { /* removed when the export ends */
      LOG_INFO("coord", "job j-%lld: checkpoint of step %lld kept while it is being exported",
               (long long)job, (long long)v[i].step);
      continue;
    }
    coord_ckpt_remove(c, &v[i], COORD_RM_RETAINED);
  }
  free(v);
}

static Fsdp__V1__CheckpointState coord_ckpt_state(store_ckpt_state_t s);

/* A commit on the pool: every shard of k is in. */
typedef struct coord_commit {
  uv_work_t work;
  coord_t *c;          /* NULL once the coordinator went (coord_ckpt_detach) */
  rpc_call_t *call;    /* the last shard's report, answered with the outcome (NULL: none) */
  store_ckpt_t k;
  int keep;
  uint64_t t0;         /* uv_hrtime() of the last shard's report (0: unknown) */
  ckpt_shard_report_t *rep;
  const char *const *roots; /* the coordinator's */
  int nroots;
  int rc;
  char err[STORE_REASON_MAX];
  struct coord_commit *next;
} coord_commit_t;

static void coord_ckpt_commit_work(uv_work_t *w) {
  coord_commit_t *m = w->data;
  char real[PATH_MAX];
  m->rc = coord_ckpt_real(m->roots, m->nroots, m->k.dir, real);
  if (!m->rc) m->rc = ckpt_commit(m->k.dir, m->k.shards, m->rep, 0); /* the reports vouch for each shard */
  if (m->rc) snprintf(m->err, sizeof m->err, "%s", err_msg()); /* err_msg is per thread */
}

/* The manifest is written (or not): COMMITTED, or ABORTED saying why. */
static void coord_ckpt_commit_done(uv_work_t *w, int status) {
  coord_commit_t *m = w->data;
  coord_t *c = m->c;
  const store_ckpt_t *k = &m->k;
  store_ckpt_state_t st = STORE_CKPT_OPEN;
  if (c) {
    for (coord_commit_t **pp = &c->committing; *pp; pp = &(*pp)->next)
      if (*pp == m) {
        *pp = m->next;
        break;
      }
    c->dirty = 1; /* its job may wait for it to be placed again (coord_schedule) */
    if (status && !m->rc) m->rc = FSDP_ECANCELED, snprintf(m->err, sizeof m->err, "%s", uv_strerror(status));
    const char *why = m->rc ? m->err : NULL;
    if (store_ckpt_close(c->st, k->job_id, k->step, k->epoch, why)) {
      LOG_WARN("coord", "job j-%lld: checkpoint of step %lld: %s", (long long)k->job_id,
               (long long)k->step, err_msg());
    } else if (why) {
      coord_ckpt_aborted(c, k->job_id, k->step, why);
      st = STORE_CKPT_ABORTED;
      /* every shard was reported: no rank writes there any more */
      store_ckpt_t a = *k;
      a.state = STORE_CKPT_ABORTED;
      snprintf(a.reason, sizeof a.reason, "%s", why);
      coord_ckpt_settle(c, &a, -1);
    } else {
      c->ckpt_commits++;
      st = STORE_CKPT_COMMITTED;
      if (m->t0) metrics_hist_observe(&c->commit, (double)(uv_hrtime() - m->t0) / 1e9);
      if (m->t0)
        LOG_INFO("coord", "job j-%lld: checkpoint of step %lld committed (%d shards, %.1f MiB) "
                 "%.2f ms after its last shard's report", (long long)k->job_id, (long long)k->step,
                 k->shards, (double)k->bytes / (1 << 20), (double)(uv_hrtime() - m->t0) / 1e6);
      else
        LOG_INFO("coord", "job j-%lld: checkpoint of step %lld committed (%d shards, %.1f MiB)",
                 (long long)k->job_id, (long long)k->step, k->shards, (double)k->bytes / (1 << 20));
      coord_ckpt_retain(c, k->job_id, m->keep);
    }
  }
  if (m->call) {
    Fsdp__V1__ReportCheckpointShardReply rep = FSDP__V1__REPORT_CHECKPOINT_SHARD_REPLY__INIT;
    rep.state = coord_ckpt_state(st);
    rpc_call_reply(m->call, &rep.base);
  }
  free(m->rep);
  free(m);
}

static void coord_ckpt_commit_cancel(rpc_call_t *call, void *arg) {
  (void)call;
  ((coord_commit_t *)arg)->call = NULL; /* freed as this returns */
}

static int coord_ckpt_committing(const coord_t *c, int64_t job, int64_t step) {
  for (const coord_commit_t *m = c->committing; m; m = m->next)
    if (m->k.job_id == job && m->k.step == step) return 1;
  return 0;
}

int coord_ckpt_reports(coord_t *c, const store_ckpt_t *k, ckpt_shard_report_t **out) {
  *out = NULL;
  store_ckpt_shard_t *sh = NULL;
  int n = 0;
  int rc = store_ckpt_shards(c->st, k->job_id, k->step, &sh, &n);
  if (!rc && n != k->shards)
    rc = err_set(FSDP_EINTERNAL, "%d of %d shards recorded", n, k->shards);
  if (!rc && !(*out = calloc((size_t)n, sizeof **out))) rc = err_set(FSDP_ENOMEM, "out of memory");
  for (int j = 0; !rc && j < n; j++) {
    (*out)[j] = (ckpt_shard_report_t){sh[j].shard, "", sh[j].bytes, sh[j].sum};
    ckpt_shard_name((*out)[j].name, sizeof (*out)[j].name, sh[j].shard, k->shards);
  }
  free(sh);
  if (rc) free(*out), *out = NULL;
  return rc;
}

/* Every shard of k is in: ckpt_commit (each shard's header read and checked
 * against its report, the manifest written and fsynced) runs on the pool,
 * then the store closes the checkpoint and call (the last report, or NULL)
 * gets the outcome. t0: uv_hrtime() when that report came in (0: unknown).
 * Once per checkpoint at a time; 0, or an error for call to be failed with. */
static int coord_ckpt_commit(coord_t *c, const store_ckpt_t *k, int keep, uint64_t t0,
                             rpc_call_t *call) {
  if (coord_ckpt_committing(c, k->job_id, k->step)) return FSDP_OK;
  coord_commit_t *m = calloc(1, sizeof *m);
  if (!m) return err_set(FSDP_ENOMEM, "coordinator: out of memory");
  m->c = c, m->k = *k, m->keep = keep, m->t0 = t0, m->work.data = m;
  m->roots = c->o.roots, m->nroots = c->o.nroots;
  int rc = coord_ckpt_reports(c, k, &m->rep);
  if (rc) { /* left open: the janitor tries again */
    free(m);
    return rc;
  }
  if (uv_queue_work(c->loop, &m->work, coord_ckpt_commit_work, coord_ckpt_commit_done)) {
    free(m->rep), free(m);
    return err_set(FSDP_EINTERNAL, "coordinator: cannot queue the commit of step %lld",
                   (long long)k->step);
  }
  m->next = c->committing;
  c->committing = m;
  if (call) {
    m->call = call;
    rpc_call_on_cancel(call, coord_ckpt_commit_cancel, m);
  }
  return FSDP_OK;
}

int coord_ckpt_busy(coord_t *c, int64_t job) {
  for (const coord_commit_t *m = c->committing; m; m = m->next)
    if (m->k.job_id == job) return 1;
  return coord_ckpt_removing_job(c, job) || coord_ckpt_sweeping(c, job);
}

int coord_commits_in_flight(const coord_t *c) {
  int n = 0;
  for (const coord_commit_t *m = c->committing; m; m = m->next) n++;
  return n;
}

void coord_ckpt_detach(coord_t *c) {
  while (c->tallies) coord_tally_drop(c, c->tallies);
  for (coord_verify_t *v = c->verifying; v; v = v->next) v->c = NULL;
  c->verifying = NULL;
  coord_rm_fail_t *f, *tmp;
  HASH_ITER(hh, c->rm_failed, f, tmp) {
    HASH_DEL(c->rm_failed, f);
    free(f);
  }
  if (c->sweeping) c->sweeping->c = NULL;
  c->sweeping = NULL;
  for (coord_rm_t *r = c->removing; r; r = r->next) r->c = NULL;
  c->removing = NULL;
  for (coord_commit_t *m = c->committing; m; m = m->next) m->c = NULL;
  c->committing = NULL;
}

static Fsdp__V1__CheckpointState coord_ckpt_state(store_ckpt_state_t s) {
  switch (s) {
  case STORE_CKPT_OPEN: return FSDP__V1__CHECKPOINT_STATE__CHECKPOINT_STATE_OPEN;
  case STORE_CKPT_COMMITTED: return FSDP__V1__CHECKPOINT_STATE__CHECKPOINT_STATE_COMMITTED;
  default: return FSDP__V1__CHECKPOINT_STATE__CHECKPOINT_STATE_ABORTED;
  }
}

/* A rank could not write its shard (q->failed says why, checked like any
 * report but for the path and checksum): its checkpoint of q->step is
 * aborted now, not at --checkpoint-timeout-ms, logged and counted once. */
static void coord_ckpt_failed(coord_t *c, rpc_call_t *call, int64_t job,
                              const Fsdp__V1__ReportCheckpointShardRequest *q, int shards,
                              int shard, const char *dir) {
  char why[STORE_REASON_MAX];
  snprintf(why, sizeof why, "rank %u could not write its shard: %.400s", q->rank, q->failed);
  coord_text_mend(why); /* the rank's error, of any bytes, cut at 400 */
  store_ckpt_t k;
  int aborted = 0;
  int rc = store_ckpt_fail(c->st, job, q->attempt, q->step, shards, dir, why, &k, &aborted);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  if (aborted) coord_ckpt_aborted(c, job, q->step, why);
  coord_ckpt_settle(c, &k, shard);
  Fsdp__V1__ReportCheckpointShardReply rep = FSDP__V1__REPORT_CHECKPOINT_SHARD_REPLY__INIT;
  rep.state = coord_ckpt_state(k.state);
  rpc_call_reply(call, &rep.base);
}

/* 1 when dir was set aside (ckpt_set_aside's names: dir.damaged, then
 * dir.damaged-2 ...): the last such name in to. */
static int coord_ckpt_aside_found(const char *dir, char *to, size_t len) {
  int found = 0;
  for (int i = 1; i <= 100; i++) {
    char path[STORE_PATH_MAX + 32]; /* ".damaged-" and any int */
    struct stat st;
    if (i == 1) snprintf(path, sizeof path, "%s.damaged", dir);
    else snprintf(path, sizeof path, "%s.damaged-%d", dir, i);
    if (lstat(path, &st) || !S_ISDIR(st.st_mode)) break;
    if ((size_t)snprintf(to, len, "%s", path) >= len) break; /* no name cut short */
    found = 1;
  }
  return found;
}

static void coord_ckpt_verify_work(uv_work_t *w) {
  coord_verify_t *v = w->data;
  struct stat st;
  /* the step's directory gone too: the coordinator's view of the file
   * system, not the checkpoint, is what is wrong (retention removed it, or
   * the mount went) */
  const int seen = !stat(v->dir, &st);
  if (!seen || !S_ISDIR(st.st_mode)) {
    const int e = seen ? ENOTDIR : errno;
    /* ... unless it was set aside as damaged (step-N.damaged, by the
     * coordinator, whose record of it a stop cut off, or by hand): the file
     * system is there, and the checkpoint is not in its step's name */
    if (e == ENOENT && coord_ckpt_aside_found(v->dir, v->aside, sizeof v->aside)) {
      v->rc = FSDP_ENOENT;
      snprintf(v->err, sizeof v->err, "its directory was set aside as damaged: %.300s", v->aside);
      return;
    }
    v->no_dir = 1;
    snprintf(v->err, sizeof v->err, "%.300s: %s", v->dir, strerror(e));
    return;
  }
  v->rc = ckpt_verify(v->dir);
  if (v->rc) snprintf(v->err, sizeof v->err, "%s", err_msg()); /* err_msg is per thread */
  /* damaged here too: set aside, unless an export reads it */
  if ((v->rc == FSDP_EFORMAT || v->rc == FSDP_ENOENT) && !v->exported)
    coord_ckpt_set_aside(v->roots, v->nroots, v->dir, v->aside, sizeof v->aside, v->aside_err,
                         sizeof v->aside_err);
}

int coord_ckpt_set_aside(const char *const *roots, int nroots, const char *dir, char *to,
                         size_t len, char *err, size_t errlen) {
  char real[PATH_MAX];
  int rc = coord_ckpt_real(roots, nroots, dir, real);
  if (!rc) rc = ckpt_set_aside(dir, to, len);
  if (rc) {
    to[0] = 0;
    snprintf(err, errlen, "%s", err_msg()); /* err_msg is per thread */
  }
  return rc;
}

void coord_ckpt_mark_damaged(coord_t *c, int64_t job, int64_t step, const char *how,
                             const char *dir, const char *aside, const char *kept) {
  char why[STORE_REASON_MAX];
  snprintf(why, sizeof why, "damaged: %s", how);
  coord_text_mend(why);
  store_ckpt_t k;
  int changed = 0;
  if (aside && !*aside) aside = NULL;
  if (store_ckpt_damaged(c->st, job, 0, step, why, aside, &k, &changed))
    LOG_WARN("coord", "job j-%lld: checkpoint of step %lld: %s", (long long)job, (long long)step,
             err_msg());
  else if (changed) {
    LOG_WARN("coord", "job j-%lld: committed checkpoint of step %lld is %s; committed no more",
             (long long)job, (long long)step, why);
    c->ckpt_aborts++;
  }
  if (aside)
    LOG_WARN("coord", "job j-%lld: the damaged checkpoint of step %lld is set aside as %s "
             "(removed once no attempt of the job runs); its step may be written again",
             (long long)job, (long long)step, aside);
  else
    LOG_WARN("coord", "job j-%lld: the damaged checkpoint of step %lld stays in %s, so its "
             "step cannot be written again until it is gone: %s", (long long)job,
             (long long)step, dir, kept);
}

static void coord_ckpt_verify_done(uv_work_t *w, int status) {
  coord_verify_t *v = w->data;
  coord_t *c = v->c;
  if (c) {
    for (coord_verify_t **pp = &c->verifying; *pp; pp = &(*pp)->next)
      if (*pp == v) {
        *pp = v->next;
        break;
      }
    const int damaged = !status && !v->no_dir && (v->rc == FSDP_EFORMAT || v->rc == FSDP_ENOENT);
    if (damaged) {
      char why[STORE_REASON_MAX];
      snprintf(why, sizeof why, "%.200s; checked here: %.250s", v->said, v->err);
      coord_ckpt_mark_damaged(c, v->job, v->step, why, v->dir, v->aside,
                              v->exported ? "an export reads it" : v->aside_err);
    } else {
      LOG_WARN("coord", "job j-%lld: a rank found the committed checkpoint of step %lld damaged "
               "(%s), but %s: it stays committed%s", (long long)v->job, (long long)v->step,
               v->said, status ? "it could not be checked here" : v->no_dir ? "the coordinator "
               "cannot see its directory either" : v->rc ? "it could not be checked here"
               : "it checks whole here", !status && !v->no_dir && !v->rc
               ? "; the ranks' nodes see other files than the coordinator (a mount missing or "
                 "stale?)" : "");
      if (v->rc || v->no_dir) LOG_WARN("coord", "job j-%lld: %s", (long long)v->job, v->err);
    }
  }
  free(v);
}

/* Rank q->rank of attempt q->attempt found the job's committed checkpoint
 * of q->step damaged as it resumed (q->failed says how): answered at once
 * with the checkpoint's state; checked on the pool, and committed no more
 * only if the coordinator finds it damaged too. */
static void coord_ckpt_damaged(coord_t *c, rpc_call_t *call, int64_t job,
                               const Fsdp__V1__ReportCheckpointShardRequest *q) {
  store_ckpt_t k;
  int changed = 0;
  int rc = store_ckpt_damaged(c->st, job, q->attempt, q->step, NULL, NULL, &k, &changed);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  int busy = k.state != STORE_CKPT_COMMITTED;
  for (const coord_verify_t *v = c->verifying; v && !busy; v = v->next)
    busy = v->job == job && v->step == q->step;
  coord_verify_t *v = busy ? NULL : calloc(1, sizeof *v);
  if (v) {
    v->c = c, v->job = job, v->step = q->step, v->work.data = v;
    v->roots = c->o.roots, v->nroots = c->o.nroots;
    snprintf(v->dir, sizeof v->dir, "%s", k.dir);
    v->exported = coord_export_reads(c, k.dir);
    snprintf(v->said, sizeof v->said, "rank %u of attempt %u: %.400s", q->rank, q->attempt,
             q->failed);
    coord_text_mend(v->said);
    if (uv_queue_work(c->loop, &v->work, coord_ckpt_verify_work, coord_ckpt_verify_done)) {
      free(v);
    } else {
      v->next = c->verifying;
      c->verifying = v;
      LOG_INFO("coord", "job j-%lld: %s says the committed checkpoint of step %lld is damaged; "
               "checking it", (long long)job, v->said, (long long)q->step);
    }
  }
  Fsdp__V1__ReportCheckpointShardReply rep = FSDP__V1__REPORT_CHECKPOINT_SHARD_REPLY__INIT;
  rep.state = coord_ckpt_state(k.state);
  rpc_call_reply(call, &rep.base);
}

void coord_ckpt_report_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__ReportCheckpointShardRequest *q = (const void *)req;
  const uint64_t t0 = uv_hrtime();
  const int64_t job = coord_id_parse(q->job_id, 'j');
  coord_job_t *x = job ? coord_job_info(c, job) : NULL;
  const int failed = q->failed && q->failed[0]; /* not written: no path or checksum to check */
  uint64_t sum = 0;
  int rc = FSDP_OK;
  if (!x)
    rc = err_set(FSDP_ENOTFOUND, "job_id: '%.64s' is not a job of this coordinator", q->job_id);
  else if (!x->ckpt_dir[0])
    rc = err_set(FSDP_EINVAL, "job j-%lld has no checkpoint_dir: no shard of it is expected",
                 (long long)job);
  else if (q->rank >= (uint32_t)(x->mesh.replicas * x->mesh.shards) || q->step < 0)
    rc = err_set(FSDP_EINVAL, "rank %u, step %" PRId64 ": out of range for job j-%lld", q->rank,
                 q->step, (long long)job);
  if (!rc) rc = coord_rank_is_callers(c, call, q->node_id, job, q->attempt, (int)q->rank);
  if (!rc && q->damaged) {
    if (failed) coord_ckpt_damaged(c, call, job, q);
    else rpc_call_finish(call, err_set(FSDP_EINVAL, "failed: empty: a damaged checkpoint's report "
                                       "says how it is damaged"));
    return;
  }
  if (!rc && !failed) rc = coord_ckpt_sum(q->checksum, &sum);
  shard_place_t pl = {0};
  char dir[STORE_PATH_MAX], want[STORE_PATH_MAX + CKPT_NAME_MAX + 1], name[CKPT_NAME_MAX];
  if (!rc) {
    pl = shard_place(&x->mesh, (int)q->rank);
    if (pl.replica != 0)
      rc = err_set(FSDP_EINVAL, "rank %u is in replica %d: only the first replica's ranks write "
                   "checkpoint shards", q->rank, pl.replica);
  }
  if (!rc) {
    /* the path is the coordinator's to know, not the request's to say */
    ckpt_step_dir(dir, sizeof dir, x->ckpt_dir, q->step);
    ckpt_shard_name(name, sizeof name, pl.shard_rank, x->mesh.shards);
    snprintf(want, sizeof want, "%s/%s", dir, name);
    if (!failed && (!q->path || strcmp(q->path, want)))
      rc = err_set(FSDP_EINVAL, "path: '%.200s' is not where rank %u's shard of step %" PRId64
                   " goes (%s)", q->path ? q->path : "", q->rank, q->step, want);
  }
  for (const coord_commit_t *m = c->committing; !rc && m; m = m->next)
    if (m->k.job_id == job && m->k.step == q->step && m->k.epoch != (int64_t)q->attempt)
      rc = err_set(FSDP_EUNAVAILABLE, "the checkpoint of step %" PRId64 " written by attempt "
                   "%lld is being committed; this attempt's shard of it cannot be taken now",
                   q->step, (long long)m->k.epoch);
    else if (m->k.job_id == job && m->k.step == q->step && failed)
      rc = err_set(FSDP_ESTATE, "every shard of the checkpoint of step %" PRId64 " was reported "
                   "written, and it is being committed; rank %u's report that its shard was not "
                   "written comes too late", q->step, q->rank);
  /* a rank found it damaged and the coordinator is checking: this shard of
   * the step written again is taken once that is known (fsdpd asks again) */
  for (const coord_verify_t *v = c->verifying; !rc && v; v = v->next)
    if (v->job == job && v->step == q->step)
      rc = err_set(FSDP_EUNAVAILABLE, "the committed checkpoint of step %" PRId64 " is being "
                   "checked (a rank found it damaged); this shard of it cannot be taken yet",
                   q->step);
  if (!rc && failed) {
    coord_ckpt_failed(c, call, job, q, x->mesh.shards, pl.shard_rank, dir);
    return;
  }
  store_ckpt_t k;
  if (!rc) {
    store_ckpt_shard_t sh = {pl.shard_rank, (int)q->rank, q->bytes, sum};
    rc = store_ckpt_report(c->st, job, q->attempt, q->step, x->mesh.shards, dir, &sh, &k);
    /* a shard of a checkpoint its attempt aborted (another not written, a
     * timeout) comes too late, but its rank's write has ended */
    char said[STORE_REASON_MAX];
    snprintf(said, sizeof said, "%s", rc == FSDP_ESTATE ? err_msg() : "");
    if (rc == FSDP_ESTATE && store_ckpt_get(c->st, job, q->step, &k) == 1 &&
        k.epoch == (int64_t)q->attempt)
      coord_ckpt_settle(c, &k, pl.shard_rank);
    if (rc == FSDP_ESTATE) err_set(rc, "%s", said); /* the caller's answer */
  }
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  if (k.state == STORE_CKPT_OPEN && k.reported == k.shards &&
      !coord_ckpt_committing(c, k.job_id, k.step)) { /* answered when the commit is done */
    if ((rc = coord_ckpt_commit(c, &k, x->keep, t0, call))) rpc_call_finish(call, rc);
    return;
  }
  Fsdp__V1__ReportCheckpointShardReply rep = FSDP__V1__REPORT_CHECKPOINT_SHARD_REPLY__INIT;
  rep.state = coord_ckpt_state(k.state);
  rpc_call_reply(call, &rep.base);
}

void coord_ckpt_list_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__ListCheckpointsRequest *q = (const void *)req;
  store_job_t j;
  if (coord_job_arg(c, call, q->job_id, &j)) return;
  const int64_t job = j.id;
  store_job_free(&j);
  store_ckpt_t *v = NULL;
  int n = 0;
  int rc = store_ckpt_list(c->st, job, &v, &n);
  Fsdp__V1__Checkpoint *m = calloc((size_t)n + 1, sizeof *m);
  Fsdp__V1__Checkpoint **pm = calloc((size_t)n + 1, sizeof *pm);
  if (!rc && (!m || !pm)) rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
  if (rc) {
    rpc_call_finish(call, rc);
  } else {
    for (int i = 0; i < n; i++) {
      fsdp__v1__checkpoint__init(&m[i]);
      m[i].step = v[i].step;
      m[i].attempt = (uint32_t)v[i].epoch;
      m[i].state = coord_ckpt_state(v[i].state);
      m[i].shards_reported = (uint32_t)v[i].reported;
      m[i].shards_total = (uint32_t)v[i].shards;
      m[i].dir = v[i].dir;
      m[i].opened_unix_ms = v[i].opened_ms;
      m[i].closed_unix_ms = v[i].closed_ms;
      m[i].bytes = v[i].bytes;
      m[i].reason = v[i].reason;
      pm[i] = &m[i];
    }
    Fsdp__V1__ListCheckpointsReply rep = FSDP__V1__LIST_CHECKPOINTS_REPLY__INIT;
    rep.n_checkpoints = (size_t)n;
    rep.checkpoints = pm;
    rpc_call_reply(call, &rep.base);
  }
  free(m), free(pm), free(v);
}

int coord_ckpt_dir_free(coord_t *c, const char *dir, int64_t self) {
  for (int i = 0; i < c->n_sub; i++)
    if (c->sub[i].call && !strcmp(c->sub[i].facts.ckpt_dir, dir))
      return err_set(FSDP_EINVAL, "checkpoint_dir: %s is also that of a job submitted at the same "
                     "moment; give each job its own", dir);
  store_job_dir_t *v = NULL;
  int n = 0, rc = store_jobs_by_checkpoint_dir(c->st, dir, 0, &v, &n);
  for (int i = 0; !rc && i < n; i++) {
    if (v[i].id == self) continue;
    const coord_job_t *x = v[i].dir_unknown ? coord_job_info(c, v[i].id) : NULL;
    if (!v[i].dir_unknown || (x && !strcmp(x->ckpt_dir, dir)))
      rc = err_set(FSDP_EINVAL, "checkpoint_dir: %s is the checkpoint directory of job j-%lld "
                   "(%s); give each job its own (two jobs in one would remove and resume from "
                   "each other's checkpoints)", dir, (long long)v[i].id,
                   store_job_state_name(v[i].state));
  }
  free(v);
  return rc;
}

/* Once per coordinator: retention for every job with committed checkpoints.
 * What an export kept from it when the last coordinator stopped (or died)
 * mid-export would otherwise stay until the job's next commit, or forever
 * once the job has ended. */
static void coord_ckpt_retain_all(coord_t *c) {
  store_ckpt_t *v = NULL;
  int n = 0;
  if (store_ckpt_list(c->st, 0, &v, &n)) {
    LOG_WARN("coord", "checkpoints: %s", err_msg());
    return;
  }
  for (int i = 0; i < n; i++) { /* by job, newest first: each job once */
    if (i && v[i].job_id == v[i - 1].job_id) continue;
    const coord_job_t *x = coord_job_info(c, v[i].job_id);
    if (x) coord_ckpt_retain(c, v[i].job_id, x->keep);
  }
  free(v);
}

/* ---- leftover step directories ------------------------------------------------ */

/* How long a leftover must have been left alone, and its job's last attempt
 * over, before it goes: the longest a checkpoint is given to complete
 * (--checkpoint-timeout-ms), and no less than the longest a rank of an
 * ended attempt can live on (a cut-off node's fence, and a heartbeat
 * timeout more). Also the least time between two rounds. */
static int64_t coord_ckpt_quiet_ms(const coord_t *c) {
  const int64_t fence = (int64_t)coord_fence_ms(c) + c->o.heartbeat_timeout_ms;
  return c->o.checkpoint_timeout_ms > fence ? c->o.checkpoint_timeout_ms : fence;
}

/* What became of job's checkpoint_dir beyond removals (text; "": nothing
 * to say), logged when it differs from what was said last: a directory
 * left for the same reason is not said again every round. */
static void coord_ckpt_sweep_say(coord_t *c, int64_t job, const char *dir, const char *text) {
  coord_job_t *x = coord_job_info(c, job);
  const uint64_t sum = text[0] ? coord_reason_sum(text) : 0;
  if (x && x->sweep_said == sum) return;
  if (x) x->sweep_said = sum;
  if (text[0]) LOG_WARN("coord", "job j-%lld: checkpoint_dir %s: %s", (long long)job, dir, text);
}

static void coord_ckpt_sweep_work(uv_work_t *w) {
  coord_sweep_t *s = w->data;
  char real[PATH_MAX];
  s->rc = coord_ckpt_real(s->roots, s->nroots, s->dir, real);
  if (!s->rc || s->rc == FSDP_ENOENT) /* none: nothing to sweep (ckpt_sweep) */
    s->rc = ckpt_sweep(s->dir, s->skip, s->nskip, s->now_ms, s->quiet_ms, s->out, COORD_SWEEP_MAX,
                       &s->n);
  if (s->rc) snprintf(s->err, sizeof s->err, "%s", err_msg()); /* err_msg is per thread */
}

static void coord_ckpt_sweep_done(uv_work_t *w, int status) {
  coord_sweep_t *s = w->data;
  coord_t *c = s->c;
  if (c) {
    c->sweeping = NULL;
    c->dirty = 1; /* its job, or another of its directory, may wait to be placed */
    char left[1024] = "";
    size_t used = 0;
    if (status || s->rc)
      used += (size_t)snprintf(left, sizeof left, "not swept: %s",
                               status ? uv_strerror(status) : s->err);
    for (int i = 0; i < s->n; i++) {
      const ckpt_leftover_t *l = &s->out[i];
      if (!l->removed) {
        if (used < sizeof left)
          used += (size_t)snprintf(left + used, sizeof left - used, "%s%s; left in place",
                                   used ? "; " : "", l->why);
        continue;
      }
      const store_ckpt_t *k = NULL;
      for (int j = 0; j < s->nrows && !k; j++)
        if (s->rows[j].step == l->step) k = &s->rows[j];
      c->ckpt_leftovers++;
      LOG_INFO("coord", "job j-%lld: leftover step directory %s/step-%08lld removed (%d files, "
               "%.1f MiB): %s, unchanged for %.0f s, no attempt of the job running",
               (long long)s->job, s->dir, (long long)l->step, l->files,
               (double)l->bytes / (1 << 20),
               k ? "its checkpoint was aborted and its files removed before, yet it was there"
                 : "not committed and no checkpoint of that step in the store (a save cut "
                   "short, or a shard report that never came)",
               (double)l->age_ms / 1000);
    }
    coord_ckpt_sweep_say(c, s->job, s->dir, left);
  }
  free(s->rows), free(s->skip), free(s);
}

/* 1 when another job the store keeps has j's checkpoint_dir (or may: a
 * live job stored before schema 6, whose spec does not say otherwise),
 * said once: a step directory does not say which job wrote it, so a
 * shared directory is not swept. */
static int coord_ckpt_dir_shared(coord_t *c, const store_job_ckpt_dir_t *j) {
  store_job_dir_t *v = NULL;
  int n = 0;
  int64_t other = 0;
  if (store_jobs_by_checkpoint_dir(c->st, j->dir, 1, &v, &n)) {
    LOG_WARN("coord", "job j-%lld: checkpoint_dir %s not swept: %s", (long long)j->id, j->dir,
             err_msg());
    return 1;
  }
  for (int i = 0; i < n && !other; i++) {
    const coord_job_t *x = v[i].dir_unknown ? coord_job_info(c, v[i].id) : NULL;
    if (v[i].id != j->id && (!v[i].dir_unknown || !x || !strcmp(x->ckpt_dir, j->dir)))
      other = v[i].id;
  }
  free(v);
  if (!other) return 0;
  char text[256];
  snprintf(text, sizeof text, "also the checkpoint_dir of job j-%lld: leftover step directories "
           "there are not removed (none says which job wrote it); remove them by hand, or give "
           "each job its own directory", (long long)other);
  coord_ckpt_sweep_say(c, j->id, j->dir, text);
  return 1;
}

/* The next job's checkpoint_dir (by id, one a pass, one on the pool at a
 * time) swept for leftover step directories (ckpt_sweep: uncommitted, the
 * format's names only, no link followed), when no rank can be writing
 * there: the job is not running, nothing of its checkpoints is on the pool,
 * its last attempt ended, its fence passed and this coordinator started
 * coord_ckpt_quiet_ms ago, no other job has the directory, and each
 * directory removed was not modified for that long. The store's checkpoints
 * of the job are left to the rest of the janitor (committed, open: to
 * commit or time out, aborted: removed above), but for an aborted one whose
 * files were removed and whose directory came back. */
static void coord_ckpt_sweep_next(coord_t *c) {
  const uint64_t now = coord_mono_ms(c);
  const int64_t quiet = coord_ckpt_quiet_ms(c);
  if (c->sweeping || now < c->started_ms + (uint64_t)quiet) return;
  if (!c->sweep_after) { /* a round begins */
    if (c->sweep_round_ms && now - c->sweep_round_ms < (uint64_t)quiet) return;
    c->sweep_round_ms = now;
  }
  store_job_ckpt_dir_t j;
  int rc = store_job_ckpt_dir_next(c->st, c->sweep_after, &j);
  if (rc) { /* the round is over */
    if (rc != FSDP_ENOENT) LOG_WARN("coord", "checkpoint directories: %s", err_msg());
    c->sweep_after = 0;
    return;
  }
  c->sweep_after = j.id;
  const coord_job_t *x = coord_job_info(c, j.id);
  if (j.state == STORE_JOB_RUNNING || coord_ckpt_busy(c, j.id) || (x && x->fence_until > now) ||
      (j.ended_ms && coord_unix_ms() - j.ended_ms < quiet) || coord_ckpt_dir_shared(c, &j))
    return; /* the next round looks again */
  coord_sweep_t *s = calloc(1, sizeof *s);
  rc = s ? store_ckpt_list(c->st, j.id, &s->rows, &s->nrows) : FSDP_ENOMEM;
  if (!rc && !(s->skip = calloc((size_t)s->nrows + 1, sizeof *s->skip))) rc = FSDP_ENOMEM;
  if (rc) {
    LOG_WARN("coord", "job j-%lld: checkpoint_dir %s not swept: %s", (long long)j.id, j.dir,
             rc == FSDP_ENOMEM ? "out of memory" : err_msg());
    if (s) free(s->rows);
    free(s);
    return;
  }
  for (int i = 0; i < s->nrows; i++)
    if (s->rows[i].state != STORE_CKPT_ABORTED || !s->rows[i].removed)
      s->skip[s->nskip++] = s->rows[i].step;
  s->c = c, s->job = j.id, s->now_ms = coord_unix_ms(), s->quiet_ms = quiet, s->work.data = s;
  s->roots = c->o.roots, s->nroots = c->o.nroots;
  snprintf(s->dir, sizeof s->dir, "%s", j.dir);
  if (uv_queue_work(c->loop, &s->work, coord_ckpt_sweep_work, coord_ckpt_sweep_done)) {
    free(s->rows), free(s->skip), free(s);
    return;
  }
  c->sweeping = s;
}

void coord_ckpt_janitor(coord_t *c) {
  store_ckpt_t *v = NULL;
  int n = 0;
  if (!c->retained) {
    c->retained = 1;
    coord_ckpt_retain_all(c);
  }
  if (store_ckpt_pending(c->st, &v, &n)) {
    LOG_WARN("coord", "checkpoints: %s", err_msg());
    return;
  }
  const int64_t now = coord_unix_ms();
  for (int i = 0; i < n; i++) {
    store_ckpt_t *k = &v[i];
    if (k->state == STORE_CKPT_OPEN) {
      if (k->reported == k->shards) {
        /* every shard in, and no commit running: a coordinator stopped
         * before the store heard how its commit went (the manifest may be
         * out or not): commit again, checking every shard again */
        coord_job_t *x = coord_job_info(c, k->job_id);
        if (!coord_ckpt_committing(c, k->job_id, k->step) &&
            coord_ckpt_commit(c, k, x ? x->keep : 0, 0, NULL))
          LOG_WARN("coord", "job j-%lld: %s", (long long)k->job_id, err_msg());
      } else if (now - k->opened_ms > c->o.checkpoint_timeout_ms) {
        char why[256];
        snprintf(why, sizeof why, "%d of %d shards reported within %.0f s (--checkpoint-timeout-ms)",
                 k->reported, k->shards, c->o.checkpoint_timeout_ms / 1000.0);
        if (!store_ckpt_close(c->st, k->job_id, k->step, k->epoch, why))
          coord_ckpt_aborted(c, k->job_id, k->step, why);
      }
      continue;
    }
    /* aborted, files still there: removed once no attempt of the job runs,
     * nor any rank of a node cut off from it (its fence) */
    store_job_t j;
    if (store_job_get(c->st, k->job_id, &j)) continue;
    const int running = j.state == STORE_JOB_RUNNING, settled = coord_tally_settled(c, k, &j);
    store_job_free(&j);
    const coord_job_t *x = running ? NULL : coord_job_info(c, k->job_id);
    if ((running && !settled) || (x && x->fence_until > coord_mono_ms(c)) ||
        coord_export_reads(c, k->dir))
      continue; /* an export of a checkpoint found damaged since: removed when it ends */
    coord_ckpt_remove(c, k, settled ? COORD_RM_SETTLED : COORD_RM_ABORTED);
  }
  free(v);
  coord_tally_trim(c);
  coord_ckpt_sweep_next(c);
}

/* coord_rpc: the Coordinator service's handlers (proto/fsdp.proto): requests
 * checked and turned into store changes and coord.c's state, replies built
 * from both. Client-facing calls need the user role, node-facing calls the
 * node role, DrainNode the operator's (rpc.h). Every handler answers at once except Heartbeat (held as
 * a long poll), Rendezvous (held until its group is complete, or 1 s),
 * WatchJob (a stream until the job ends) and SubmitJob (answered once the
 * files it names are checked on the pool and it is stored with its turn's).
 *
 * Nothing from a request reaches the file system unchecked: a job's paths go
 * through job_paths_check (inside the operator's roots) before they are
 * stored, and ids are parsed as numbers. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistr.h>
#include <sys/random.h>

#include "daemon/common/err.h"
#include "daemon/common/ini_line.h"
#include "daemon/common/log.h"
#include "daemon/common/text.h"
#include "daemon/coordinator/coord_impl.h"
#include "daemon/job/job.h"
#include "daemon/job/shard.h"

#define COORD_LIST_DEFAULT 1000 /* ListJobs without a limit: the newest this many */
#define COORD_REPLY_BYTES (3u << 20) /* a ListJobs or ListNodes page stays under this (gRPC's 4 MiB) */
#define COORD_VALUE_MAX 4096    /* longest option value accepted */
#define COORD_EVENTS_DEFAULT 100  /* ListEvents without a limit */
#define COORD_EVENTS_MAX 5000     /* the most one ListEvents answers: 5000 of the longest
                                   * events (~590 bytes each) stay under gRPC's 4 MiB */

/* ---- replies' memory: everything a reply points to, freed after sending ---- */

typedef struct coord_arena {
  void **p;
  int n, cap, failed;
  Fsdp__V1__JobSpec **spec; /* parsed specs (coord_spec_free) */
  int nspec, capspec;
} coord_arena_t;

static void *coord_keep(coord_arena_t *a, void *x) {
  if (!x || a->failed) return a->failed = 1, free(x), NULL;
  if (a->n == a->cap) {
    int cap = a->cap ? 2 * a->cap : 64;
    void **p = realloc(a->p, (size_t)cap * sizeof *p);
    if (!p) return a->failed = 1, free(x), NULL;
    a->p = p, a->cap = cap;
  }
  return a->p[a->n++] = x;
}

static void *coord_alloc(coord_arena_t *a, size_t n) { return coord_keep(a, calloc(1, n ? n : 1)); }
static char *coord_str(coord_arena_t *a, const char *s) { return coord_keep(a, strdup(s ? s : "")); }

static char *coord_idstr(coord_arena_t *a, char kind, int64_t id) {
  char b[32];
  coord_id_str(b, sizeof b, kind, id);
  return coord_str(a, b);
}

static void coord_arena_free(coord_arena_t *a) {
  for (int i = 0; i < a->nspec; i++) coord_spec_free(a->spec[i]);
  free(a->spec);
  for (int i = 0; i < a->n; i++) free(a->p[i]);
  free(a->p);
}

/* Replies, or fails the call when building the reply ran out of memory. */
static void coord_reply(rpc_call_t *call, coord_arena_t *a, const ProtobufCMessage *m) {
  if (a->failed) rpc_call_finish(call, err_set(FSDP_ENOMEM, "coordinator: out of memory"));
  else rpc_call_reply(call, m);
  coord_arena_free(a);
}

/* ---- messages from the store's rows ---------------------------------------- */

static Fsdp__V1__JobSpec *coord_spec_msg(coord_arena_t *a, const store_job_t *j) {
  Fsdp__V1__JobSpec *s = coord_alloc(a, sizeof *s);
  if (!s) return NULL;
  if (a->nspec == a->capspec) {
    int cap = a->capspec ? 2 * a->capspec : 8;
    Fsdp__V1__JobSpec **p = realloc(a->spec, (size_t)cap * sizeof *p);
    if (!p) return a->failed = 1, NULL;
    a->spec = p, a->capspec = cap;
  }
  if (coord_spec_from_text(j->spec ? j->spec : "", s)) return a->failed = 1, NULL;
  a->spec[a->nspec++] = s;
  s->name = coord_str(a, j->name);
  s->world_size = (uint32_t)j->world_size;
  s->max_restarts = (uint32_t)j->max_restarts;
  return s;
}

static Fsdp__V1__RankState coord_rank_state(store_rank_state_t s) {
  switch (s) {
  case STORE_RANK_ASSIGNED: return FSDP__V1__RANK_STATE__RANK_STATE_STARTING;
  case STORE_RANK_RUNNING: return FSDP__V1__RANK_STATE__RANK_STATE_RUNNING;
  default: return FSDP__V1__RANK_STATE__RANK_STATE_EXITED;
  }
}

/* ---- a rank's memory as the store keeps it ------------------------------------
 * "name=cur/peak ..." (bytes), for each of mem.h's categories a rank
 * reported: the figures of its exit report (the run's peaks), kept with its
 * row so that fsdpctl memory shows them once the attempt's reports in
 * memory are gone (and after a restart). */

static void coord_memory_add(char *out, size_t cap, size_t *at, const char *name, uint64_t cur,
                             uint64_t peak) {
  int known = 0;
  for (int k = 0; k < COORD_CATS && !known; k++) known = !strcmp(name, mem_cat_name((mem_cat_t)k));
  if (!known) return; /* a name of ours only: no space or '=' a reader would trip on */
  int w = snprintf(out + *at, cap - *at, "%s%s=%" PRIu64 "/%" PRIu64, *at ? " " : "", name, cur,
                   peak);
  if (w > 0 && (size_t)w < cap - *at) *at += (size_t)w;
  else out[*at] = 0;
}

/* The memory an exit report gives: its status's, else the rank's last
 * heartbeat report in this attempt (an fsdpd that sends no status). */
static void coord_memory_of_exit(coord_t *c, int64_t job, const Fsdp__V1__ReportRankExitRequest *q,
                                 char *out, size_t cap) {
  size_t at = 0;
  out[0] = 0;
  if (q->status && q->status->n_memory) {
    for (size_t k = 0; k < q->status->n_memory; k++)
      coord_memory_add(out, cap, &at, q->status->memory[k]->name, q->status->memory[k]->current_bytes,
                       q->status->memory[k]->peak_bytes);
    return;
  }
  const coord_rank_t *r = coord_rank_get(c, job, (int)q->rank, 0);
  if (r && r->epoch == (int64_t)q->attempt)
    for (int k = 0; k < r->ncat; k++) coord_memory_add(out, cap, &at, r->cat[k], r->cur[k], r->peak[k]);
}

/* The step, loss and tokens/s a rank ended at, which its exit report keeps
 * in the store: its last status's, else (none, or an older step) its last
 * heartbeat report's in this attempt; 0 when neither reported a step. */
static int coord_figures_of_exit(coord_t *c, int64_t job, const Fsdp__V1__ReportRankExitRequest *q,
                                 store_figures_t *f) {
  const coord_rank_t *r = coord_rank_get(c, job, (int)q->rank, 0);
  const Fsdp__V1__RankStatus *s = q->status && !q->status->unreported ? q->status : NULL;
  if (r && (r->epoch != (int64_t)q->attempt || !r->reported)) r = NULL;
  if (!r && !s) return 0;
  *f = (store_figures_t){.job_id = job, .epoch = q->attempt, .rank = (int)q->rank};
  if (s && !(r && r->step > s->step))
    f->step = s->step, f->loss = s->loss, f->tokens_per_s = s->tokens_per_s;
  else
    f->step = r->step, f->loss = r->loss, f->tokens_per_s = r->tokens_per_s;
  return 1;
}

/* name's figures in a stored memory text; 0 when it has none. */
static int coord_memory_find(const char *text, const char *name, uint64_t *cur, uint64_t *peak) {
  const size_t len = strlen(name);
  for (const char *p = text; p && *p; p = strchr(p, ' '), p = p ? p + 1 : NULL)
    if (!strncmp(p, name, len) && p[len] == '=' &&
        sscanf(p + len + 1, "%" SCNu64 "/%" SCNu64, cur, peak) == 2)
      return 1;
  return 0;
}

/* The ranks of j's attempt j->epoch, with what they last reported. */
static int coord_ranks_msg(coord_t *c, coord_arena_t *a, const store_job_t *j,
                           Fsdp__V1__RankStatus ***out, size_t *n_out) {
  store_rank_t *r = NULL;
  int n = 0;
  *out = NULL, *n_out = 0;
  if (!j->epoch) return FSDP_OK;
  int rc = store_ranks_of_job(c->st, j->id, j->epoch, &r, &n);
  if (rc) return rc;
  coord_job_t *x = coord_job_info(c, j->id);
  Fsdp__V1__RankStatus **v = coord_alloc(a, (size_t)n * sizeof *v);
  for (int i = 0; v && i < n; i++) {
    Fsdp__V1__RankStatus *s = v[i] = coord_alloc(a, sizeof *s);
    if (!s) break;
    fsdp__v1__rank_status__init(s);
    s->job_id = coord_idstr(a, 'j', j->id);
    s->attempt = (uint32_t)j->epoch, s->rank = (uint32_t)r[i].rank;
    s->state = coord_rank_state(r[i].state);
    s->device = (uint32_t)r[i].device_index;
    s->node_id = coord_idstr(a, 'n', r[i].node_id);
    const coord_rank_t *m = coord_rank_get(c, j->id, r[i].rank, 0);
    if (m && m->epoch != j->epoch) m = NULL;
    /* its latest report in memory, else what the store kept of it (its
     * attempt ended, or the coordinator restarted): the newer */
    s->unreported = !(m && m->reported) && !r[i].reported;
    if (m && m->reported) s->step = m->step, s->loss = m->loss, s->tokens_per_s = m->tokens_per_s;
    if (r[i].reported && !(m && m->reported && m->step >= r[i].step))
      s->step = r[i].step, s->loss = r[i].loss, s->tokens_per_s = r[i].tokens_per_s;
    if (m) {
      s->collective_seq = m->collective_seq;
      s->collective_op = coord_str(a, m->collective_op);
    }
    /* every category of the plan, with what the rank reported of it */
    s->memory = coord_alloc(a, COORD_CATS * sizeof *s->memory);
    for (int k = 0; s->memory && k < COORD_CATS; k++) {
      Fsdp__V1__MemoryCategory *mc = s->memory[k] = coord_alloc(a, sizeof *mc);
      if (!mc) break;
      fsdp__v1__memory_category__init(mc);
      mc->name = (char *)mem_cat_name((mem_cat_t)k);
      mc->planned_bytes = x ? x->planned[k] : 0;
      if (x && k == MEM_SNAPSHOT && !plan_rank_snapshots(&x->mesh, r[i].rank))
        mc->planned_bytes = 0; /* this rank writes no checkpoint */
      for (int q = 0; m && q < m->ncat; q++)
        if (!strcmp(m->cat[q], mc->name)) mc->current_bytes = m->cur[q], mc->peak_bytes = m->peak[q];
      /* an exited rank: its exit report's figures, the last it sent */
      uint64_t cur, peak;
      if (coord_memory_find(r[i].memory, mc->name, &cur, &peak))
        mc->current_bytes = cur, mc->peak_bytes = peak;
      s->n_memory++;
    }
  }
  store_array_free(r);
  if (!a->failed) *out = v, *n_out = (size_t)n;
  return FSDP_OK;
}

static Fsdp__V1__Job *coord_job_msg(coord_t *c, coord_arena_t *a, const store_job_t *j,
                                    int with_ranks) {
  Fsdp__V1__Job *m = coord_alloc(a, sizeof *m);
  if (!m) return NULL;
  fsdp__v1__job__init(m);
  m->job_id = coord_idstr(a, 'j', j->id);
  if (j->spec) {
    m->spec = coord_spec_msg(a, j);
  } else if ((m->spec = coord_alloc(a, sizeof *m->spec))) { /* a list: no options, the rest */
    fsdp__v1__job_spec__init(m->spec);
    m->spec->name = coord_str(a, j->name);
    m->spec->world_size = (uint32_t)j->world_size;
    m->spec->max_restarts = (uint32_t)j->max_restarts;
  }
  m->state = coord_job_state(j->state);
  m->reason = coord_str(a, coord_job_reason(c, j));
  m->attempt = (uint32_t)j->epoch, m->restarts = (uint32_t)j->restarts;
  m->submitted_unix_ms = j->submitted_ms, m->started_unix_ms = j->started_ms;
  m->ended_unix_ms = j->ended_ms;
  coord_job_t *x = coord_job_info(c, j->id);
  m->total_steps = x ? x->steps : 0;
  m->step = coord_job_step(c, j);
  const int64_t ck = store_ckpt_last_committed(c->st, j->id);
  m->last_checkpoint_step = ck > 0 ? ck : 0;
  if (with_ranks && coord_ranks_msg(c, a, j, &m->ranks, &m->n_ranks)) a->failed = 1;
  /* a running attempt after the first: how the one before it ended (a
   * waiting or ended job's reason says that already) */
  char outcome[16], why[STORE_REASON_MAX], prev[STORE_REASON_MAX + 96], at[48] = "";
  if (with_ranks && j->state == STORE_JOB_RUNNING && j->epoch > 1 &&
      store_attempt_ended(c->st, j->id, j->epoch - 1, outcome, sizeof outcome, why, sizeof why) > 0) {
    /* where it ended, when every rank of it had reported a step (the
     * current attempt's ranks show their own figures from its start) */
    const int64_t ended = coord_attempt_step(c, j->id, j->epoch - 1, j->world_size);
    if (ended >= 0) snprintf(at, sizeof at, " at step %lld", (long long)ended);
    snprintf(prev, sizeof prev, "attempt %lld %s%s: %s", (long long)j->epoch - 1,
             !strcmp(outcome, "FAILED") ? "failed" : !strcmp(outcome, "CANCELLED") ? "was stopped"
                                                                                    : "ended",
             at, why[0] ? why : "no reason given");
    m->previous_attempt = coord_str(a, prev);
  }
  return m;
}

int coord_job_arg(coord_t *c, rpc_call_t *call, const char *id, store_job_t *j) {
  int64_t job = coord_id_parse(id, 'j');
  int rc = job ? store_job_get(c->st, job, j)
               : err_set(FSDP_ENOTFOUND, "job_id: '%.64s' is not a job id (they read j-42)", id);
  if (rc == FSDP_ENOTFOUND && job)
    rc = err_set(FSDP_ENOTFOUND, "job %s: no such job (fsdpctl jobs lists them)", id);
  if (rc) rpc_call_finish(call, rc);
  return rc;
}

/* ---- user: jobs ------------------------------------------------------------- */

/* An option as the spec asks it: its last such option, else def. */
static const char *coord_spec_value(const Fsdp__V1__JobSpec *s, const char *key, const char *def) {
  const char *v = def;
  for (size_t i = 0; i < s->n_options; i++)
    if (!strcmp(s->options[i]->key, key)) v = s->options[i]->value;
  return v;
}

/* A numeric option as the spec asks it (a number, already checked), else def. */
static double coord_spec_number(const Fsdp__V1__JobSpec *s, const char *key, double def) {
  const char *v = coord_spec_value(s, key, NULL);
  return v ? strtod(v, NULL) : def;
}

/* An option admission set for the job's ranks to run as admitted (each
 * would otherwise decide again against its own device's memory). */
typedef struct coord_admitted {
  const char *key;
  char value[16];
} coord_admitted_t;

/* The spec as the store keeps it, in *out: INI text, every option under its
 * own section, the paths replaced by what job_paths_check resolved, and
 * the n options admission set (adm: checkpoint_async = 0, a recompute
 * level) last, in place of the spec's own lines for them. Each
 * line reads back as the option it was made from (ini_line_write), or the
 * spec is refused naming it: a line libinih would cut in two must never
 * become two options, the second one unchecked. */
static int coord_spec_text(const Fsdp__V1__JobSpec *s, const config_t *cfg,
                           const coord_admitted_t *adm, int n, char **out) {
  char *text = NULL;
  size_t len = 0;
  *out = NULL;
  FILE *f = open_memstream(&text, &len);
  if (!f) return err_set(FSDP_ENOMEM, "coordinator: out of memory");
  const char *sec = "";
  int rc = FSDP_OK;
  for (size_t i = 0; i < s->n_options && !rc; i++) {
    const Fsdp__V1__Option *o = s->options[i];
    int said_last = 0;
    for (int k = 0; k < n; k++) said_last |= !strcmp(o->key, adm[k].key);
    if (said_last) continue;
    const char *osec = o->section[0] ? o->section : config_section_of(o->key);
    const char *path = job_path_value(cfg, o->key), *v = path ? path : o->value;
    if (strcmp(sec, osec)) fprintf(f, "[%s]\n", sec = osec);
    if ((rc = ini_line_write(f, osec, o->key, v)))
      rc = err_wrap(rc, "options[%zu]%s", i, path ? " (the path as resolved under its root)" : "");
  }
  for (int k = 0; k < n && !rc; k++) {
    const char *osec = config_section_of(adm[k].key);
    if (strcmp(sec, osec)) fprintf(f, "[%s]\n", sec = osec);
    rc = ini_line_write(f, osec, adm[k].key, adm[k].value);
  }
  if (fclose(f) && !rc) rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
  if (rc) free(text);
  else *out = text;
  return rc;
}

/* Text a node reports (a rank's last log line, a collective's name, why a
 * shard was not written), cut to fit by a byte count: every byte that is
 * not part of valid UTF-8 becomes '?', so what the coordinator repeats to
 * clients decodes, and a control character (text_control) a space,
 * so it stays one line in a log and shows as text. */
void coord_text_mend(char *s) {
  const size_t n = strlen(s);
  for (uint8_t *bad; (bad = (uint8_t *)u8_check((const uint8_t *)s, n));) *bad = '?';
  uint8_t *w = (uint8_t *)s;
  ucs4_t u;
  for (const uint8_t *p = (const uint8_t *)s, *next; (next = u8_next(&u, p)) != NULL; p = next) {
    if (text_control(u)) {
      *w++ = ' ';
    } else {
      memmove(w, p, (size_t)(next - p));
      w += next - p;
    }
  }
  *w = 0;
}

/* The least memory of any device a job of device kind ("cpu", "cuda") could
 * land on (0: no such device known, or another kind: job_validate refuses
 * it). A cuda job is planned against the GPUs, not the nodes' CPU devices. */
static int coord_mem_desc(const void *x, const void *y) {
  const uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return (a < b) - (a > b);
}

/* The device memory a job of world ranks of kind is planned and admitted
 * against: the world-th largest of the alive nodes' devices of that kind,
 * the smallest the job lands on when placed on the largest (placement puts
 * its ranks only on devices its plan fits: sched_usable), or the smallest
 * there is when it has more ranks than there are devices (it waits for
 * nodes then, saying so). So a job is refused only when fewer devices than
 * its ranks could ever hold it. 0: no device of the kind offers memory
 * (it waits). Before, every job was planned against the smallest device of
 * its kind, and a GPU another process had half filled refused jobs an idle
 * GPU fitted (helper-111). */
static uint64_t coord_admit_memory(coord_t *c, const char *kind, int world) {
  _Static_assert(sizeof c->dev_mem / sizeof c->dev_mem[0] == STORE_DEV_cuda + 1,
                 "one list a kind");
  if (c->nodes_changed) { /* looked at again: a node came or went, or offers another figure */
    if (coord_pic_refresh(c)) return 0;
    int cap[2] = {0, 0};
    for (int i = 0; i < c->pic_n; i++)
      for (int k = 0; c->pic[i].state == STORE_NODE_ALIVE && k < c->pic[i].n_devices; k++)
        cap[c->pic[i].devices[k].kind]++;
    for (int t = 0; t <= STORE_DEV_cuda; t++) {
      free(c->dev_mem[t]);
      c->dev_mem[t] = calloc((size_t)cap[t] + 1, sizeof *c->dev_mem[t]);
      c->dev_n[t] = 0;
      if (!c->dev_mem[t]) return 0; /* nodes_changed stays: asked again at the next submit */
    }
    c->nodes_changed = 0;
    for (int i = 0; i < c->pic_n; i++)
      for (int k = 0; c->pic[i].state == STORE_NODE_ALIVE && k < c->pic[i].n_devices; k++) {
        const store_device_t *d = &c->pic[i].devices[k];
        if (d->memory_bytes) c->dev_mem[d->kind][c->dev_n[d->kind]++] = d->memory_bytes;
      }
    for (int t = 0; t <= STORE_DEV_cuda; t++)
      qsort(c->dev_mem[t], (size_t)c->dev_n[t], sizeof *c->dev_mem[t], coord_mem_desc);
  }
  for (int t = 0; t <= STORE_DEV_cuda; t++) {
    if (strcmp(kind, store_dev_kind_name((store_dev_kind_t)t)) || !c->dev_n[t]) continue;
    const int at = world < c->dev_n[t] ? world : c->dev_n[t];
    return c->dev_mem[t][(at > 0 ? at : 1) - 1];
  }
  return 0;
}

static void coord_submit_cancel_cb(rpc_call_t *call, void *arg) {
  coord_t *c = arg;
  for (int i = 0; i < c->n_sub; i++)
    if (c->sub[i].call == call) c->sub[i].call = NULL;
}

static void coord_submit_reply(coord_t *c, rpc_call_t *call, int64_t job, const char *note) {
  coord_arena_t a = {0};
  store_job_t j;
  int rc = store_job_get(c->st, job, &j);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  Fsdp__V1__SubmitJobReply rep = FSDP__V1__SUBMIT_JOB_REPLY__INIT;
  rep.job_id = coord_idstr(&a, 'j', job);
  rep.job = coord_job_msg(c, &a, &j, 0);
  store_job_free(&j);
  if (note && note[0]) {
    rep.notes = coord_alloc(&a, sizeof *rep.notes);
    if (rep.notes) rep.notes[0] = coord_str(&a, note), rep.n_notes = 1;
  }
  coord_reply(call, &a, &rep.base);
}

/* A submit is checked in three steps. On the loop, what needs no file:
 * the options as text, the spec validated and planned (coord_submit_cb).
 * On the pool, what the spec names: its paths resolved inside the roots,
 * an init_from's header and the manifest of the checkpoint it would resume
 * from read against the job (coord_checks_work_cb): a file system can take any time (a hung
 * NFS mount, a directory of a million entries) and a header or manifest
 * is parsed, so none of that holds the loop that answers heartbeats: a
 * 99 MiB safetensors header held it 37 s, past every node's fence, and
 * every running rank of the cluster was killed (found by an outside
 * tester). Back on the loop, the rest (coord_submit_checked), and the
 * submit joins its turn's, stored together by coord_submit_flush (one
 * transaction, one fsync). The submits that came since the last batch
 * left are checked as one batch, one pool task, one at a time: a turn's
 * submits stay one transaction, and submits never hold more than one of
 * the pool's threads from checkpoint commits and exports. */
typedef struct coord_check {
  rpc_call_t *call;                    /* NULL once its client went, and its request */
  const Fsdp__V1__SubmitJobRequest *q; /* valid while call is; NULL for a resume */
  int64_t resume;                      /* a ResumeJob of this job, not a submit: only the
                                          checkpoint it resumes from is checked (0: a submit) */
  config_t cfg;                        /* validated; its paths resolved on the pool */
  plan_t plan;
  int rc;                              /* the pool's verdict, and its message */
  char err[1024];
} coord_check_t;

typedef struct coord_checks {
  coord_t *c;                /* NULL once the coordinator went */
  const char *const *roots;  /* the coordinator's (its options live as long as the process) */
  int nroots;
  coord_check_t **k;
  int n, cap;
  uv_work_t work;
} coord_checks_t;

static void coord_checks_free(coord_checks_t *b) {
  for (int i = 0; i < b->n; i++) free(b->k[i]);
  free(b->k), free(b);
}

static void coord_check_cancel_cb(rpc_call_t *call, void *arg) {
  (void)call;
  coord_check_t *k = arg;
  k->call = NULL, k->q = NULL; /* freed as this returns */
}

/* On the pool: each submit's files. Touches nothing but the batch. */
static void coord_checks_work_cb(uv_work_t *w) {
  coord_checks_t *b = w->data;
  for (int i = 0; i < b->n; i++) {
    coord_check_t *k = b->k[i];
    /* a resume's paths too: a root the operator has since removed, or a
     * component since made a link out of the roots, is refused as at submit */
    int rc = job_paths_check(&k->cfg, b->roots, b->nroots);
    if (!rc && !k->resume) rc = job_init_from_check(&k->cfg);
    if (!rc) rc = job_resume_check(&k->cfg);
    if (rc == FSDP_ENOENT || rc == FSDP_EFORMAT) rc = FSDP_EINVAL;
    if ((k->rc = rc)) snprintf(k->err, sizeof k->err, "%s", err_msg());
  }
}

static void coord_submit_checked(coord_t *c, coord_check_t *k);
static void coord_resume_checked(coord_t *c, coord_check_t *k);

static void coord_checks_done_cb(uv_work_t *w, int status) {
  (void)status;
  coord_checks_t *b = w->data;
  coord_t *c = b->c;
  if (c) c->checks_running = NULL;
  for (int i = 0; c && i < b->n; i++) {
    if (!b->k[i]->call) continue; /* its client went meanwhile */
    rpc_call_on_cancel(b->k[i]->call, NULL, NULL);
    if (b->k[i]->resume) coord_resume_checked(c, b->k[i]);
    else coord_submit_checked(c, b->k[i]);
  }
  coord_checks_free(b); /* this turn's flush stores them, then starts the next batch */
}

/* The submits that came since the last batch went, onto the pool (one
 * batch there at a time). */
static void coord_checks_start(coord_t *c) {
  coord_checks_t *b = c->checks_next;
  if (!b || c->checks_running) return;
  c->checks_next = NULL;
  b->work.data = b;
  int rc = uv_queue_work(c->loop, &b->work, coord_checks_work_cb, coord_checks_done_cb);
  if (!rc) {
    c->checks_running = b;
    return;
  }
  rc = err_set(FSDP_EIO, "coordinator: the submit could not be checked (%s); submit again",
               uv_strerror(rc));
  for (int i = 0; i < b->n; i++)
    if (b->k[i]->call) rpc_call_on_cancel(b->k[i]->call, NULL, NULL), rpc_call_finish(b->k[i]->call, rc);
  coord_checks_free(b);
}

void coord_submit_checks_detach(coord_t *c) {
  if (c->checks_next) coord_checks_free(c->checks_next); /* their calls were cancelled */
  if (c->checks_running) c->checks_running->c = NULL;
  c->checks_next = c->checks_running = NULL;
}

/* k (its call set) joins the batch of checks the pool runs next; the batch
 * then owns it. */
#define COORD_CHECKS_MAX 256 /* waiting for the batch out to come back */
static int coord_checks_add(coord_t *c, coord_check_t *k) {
  coord_checks_t *b = c->checks_next;
  /* one batch is on the pool at a time: while it hangs (a file system that
   * does not answer), those waiting are bounded, not each retry's memory */
  if (b && b->n >= COORD_CHECKS_MAX)
    return err_set(FSDP_ELIMIT, "the coordinator is still checking the files of %d submits or "
                   "resumes (a file system slow to answer under a job root?); try again shortly",
                   b->n + (c->checks_running ? c->checks_running->n : 0));
  if (!b && !(b = calloc(1, sizeof *b))) return err_set(FSDP_ENOMEM, "coordinator: out of memory");
  c->checks_next = b;
  b->c = c, b->roots = (const char *const *)c->o.roots, b->nroots = c->o.nroots;
  if (b->n == b->cap) {
    const int cap = b->cap ? 2 * b->cap : 16;
    coord_check_t **p = realloc(b->k, (size_t)cap * sizeof *p);
    if (!p) return err_set(FSDP_ENOMEM, "coordinator: out of memory");
    b->k = p, b->cap = cap;
  }
  b->k[b->n++] = k;
  rpc_call_on_cancel(k->call, coord_check_cancel_cb, k);
  return FSDP_OK;
}

static void coord_submit_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__SubmitJobRequest *q = (const void *)req;
  const Fsdp__V1__JobSpec *s = q->spec;
  if (!s) {
    rpc_call_finish(call, err_set(FSDP_EINVAL, "spec: missing; send a JobSpec with its options"));
    return;
  }
  int rc = FSDP_OK;
  /* a retried submit (same request_id) gets the job the first one made,
   * also after a coordinator restart (the key is stored with the job) */
  int64_t made = 0;
  if (q->request_id[0] && strlen(q->request_id) < sizeof c->sub[0].request_id &&
      !store_job_by_request(c->st, q->request_id, &made)) {
    coord_submit_reply(c, call, made, NULL);
    return;
  }
  const int world = (int)s->world_size;
  coord_check_t *k = NULL;
  job_opt_t *opts = NULL;
  /* a queue without a bound is a disk without one: a loop of submits
   * (8000 in 3 s, an outside tester) grows the database for good */
  int64_t counts[STORE_JOB_CANCELLED + 1];
  if (!store_job_counts(c->st, counts) && counts[STORE_JOB_PENDING] >= c->o.max_pending_jobs) {
    rc = err_set(FSDP_ELIMIT, "%lld jobs wait to be placed, the most this coordinator queues "
                 "(--max-pending-jobs %d); cancel some (fsdpctl jobs --state PENDING) or submit "
                 "once they have started", (long long)counts[STORE_JOB_PENDING],
                 c->o.max_pending_jobs);
    goto fail;
  }
  if ((rc = text_plain("spec.name", s->name, STORE_NAME_MAX - 1)) ||
      (rc = text_plain("request_id", q->request_id, sizeof c->sub[0].request_id - 1)))
    goto fail;
  if (s->world_size < 1 || s->world_size > RPC_SPEC_WORLD_MAX) {
    rc = err_set(FSDP_EINVAL, "spec.world_size: %u; give the number of ranks, 1 to %d "
                 "(fsdpctl submit --ranks N)", s->world_size, RPC_SPEC_WORLD_MAX);
    goto fail;
  }
  if (s->max_restarts > RPC_SPEC_RESTARTS_MAX) {
    rc = err_set(FSDP_EINVAL, "spec.max_restarts: %u; at most %d", s->max_restarts,
                 RPC_SPEC_RESTARTS_MAX);
    goto fail;
  }
  if (!(opts = calloc(s->n_options + 1, sizeof *opts)) || !(k = calloc(1, sizeof *k))) {
    rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
    goto fail;
  }
  for (size_t i = 0; i < s->n_options; i++) {
    const Fsdp__V1__Option *o = s->options[i];
    char what[96];
    snprintf(what, sizeof what, "options[%zu] (%.40s)", i, o->key);
    if ((rc = text_plain(what, o->key, 64)) || (rc = text_plain(what, o->section, 64)) ||
        (rc = text_plain(what, o->value, COORD_VALUE_MAX)))
      goto fail;
    opts[i] = (job_opt_t){o->section, o->key, o->value};
  }
  rc = job_validate(opts, (int)s->n_options, world,
                    coord_admit_memory(c, coord_spec_value(s, "device", "cpu"), world), &k->cfg,
                    &k->plan);
  if (rc == FSDP_ENOMEM) rc = FSDP_EINVAL; /* does not fit: the spec is what must change */
  if (!rc && (k->plan.total == 0)) rc = plan_job(&k->cfg, world, &k->plan);
  if (rc == FSDP_ENOENT || rc == FSDP_EFORMAT) rc = FSDP_EINVAL;
  if (rc) goto fail;
  /* its files next, on the pool, with the others since the last batch */
  k->call = call, k->q = q;
  if ((rc = coord_checks_add(c, k))) goto fail;
  free(opts);
  return;
fail:
  free(opts), free(k);
  rpc_call_finish(call, rc);
}

/* Back from the pool (k->rc, k->err: its files' verdict): the rest of the
 * submit's checks, and the submit queued for its turn's flush. */
static void coord_submit_checked(coord_t *c, coord_check_t *k) {
  rpc_call_t *call = k->call;
  const Fsdp__V1__SubmitJobRequest *q = k->q;
  const Fsdp__V1__JobSpec *s = q->spec;
  config_t *cfg = &k->cfg;
  /* the first of a retried submit may have been stored meanwhile */
  int64_t made = 0;
  if (q->request_id[0] && !store_job_by_request(c->st, q->request_id, &made)) {
    coord_submit_reply(c, call, made, NULL);
    return;
  }
  shard_mesh_t m;
  char desc[256];
  coord_submit_t sub = {.call = call, .world = (int)s->world_size,
                        .max_restarts = (int)s->max_restarts};
  int rc = k->rc ? err_set(k->rc, "%s", k->err) : FSDP_OK;
  if (!rc) rc = shard_mesh_resolve(cfg->strategy, cfg->mesh, sub.world, &m, desc, sizeof desc);
  if (!rc && cfg->checkpoint_dir[0]) rc = coord_ckpt_dir_free(c, cfg->checkpoint_dir, 0);
  if (rc) goto fail;
  /* the job fits its devices (coord_admit_memory) only recomputing more than its
   * device's default, or without an asynchronous checkpoint's snapshot
   * (job_validate: plan_fit_recompute, plan_fit_snapshot): its ranks are
   * told, or each would decide again against its own device's memory and
   * could take more than admission counted */
  coord_admitted_t adm[2];
  int nadm = 0;
  if (coord_spec_number(s, "recompute", -1) < 0 && cfg->recompute >= 0) {
    adm[nadm].key = "recompute";
    snprintf(adm[nadm++].value, sizeof adm->value, "%d", cfg->recompute);
    config_note(cfg, "recompute = %d: the job fits the devices it may land on only recomputing "
                "more than their default", cfg->recompute);
  }
  if (coord_spec_number(s, "checkpoint_async", 1) != 0 && !cfg->checkpoint_async) {
    adm[nadm].key = "checkpoint_async";
    snprintf(adm[nadm++].value, sizeof adm->value, "0");
    config_note(cfg, "checkpoint_async = 0: no room for a checkpoint snapshot beside the job on "
                "the devices it may land on; checkpoints are written in place");
  }
  snprintf(sub.note, sizeof sub.note, "%s", config_adjusted(cfg));
  coord_job_facts(&sub.facts, cfg, &k->plan, &m);
  snprintf(sub.mesh, sizeof sub.mesh, "%dx%d", m.replicas, m.shards);
  snprintf(sub.name, sizeof sub.name, "%s", s->name[0] ? s->name : "job"); /* a name is optional */
  snprintf(sub.request_id, sizeof sub.request_id, "%s", q->request_id);
  if ((rc = coord_spec_text(s, cfg, adm, nadm, &sub.text))) goto fail;
  if (c->n_sub == c->cap_sub) {
    int cap = c->cap_sub ? 2 * c->cap_sub : 32;
    coord_submit_t *p = realloc(c->sub, (size_t)cap * sizeof *p);
    if (!p) {
      free(sub.text);
      rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
      goto fail;
    }
    c->sub = p, c->cap_sub = cap;
  }
  c->sub[c->n_sub++] = sub;
  rpc_call_on_cancel(call, coord_submit_cancel_cb, c);
  return;
fail:
  rpc_call_finish(call, rc);
}

/* This turn's submits, checked, stored in one transaction, placed and answered. */
static void coord_submit_store(coord_t *c) {
  const int n = c->n_sub;
  if (!n) return;
  coord_submit_t *sub = c->sub;
  c->sub = NULL, c->n_sub = c->cap_sub = 0;
  store_job_spec_t *js = calloc((size_t)n, sizeof *js);
  int64_t *ids = calloc((size_t)n, sizeof *ids);
  sched_slot_t **slot = calloc((size_t)n, sizeof *slot);
  char (*why)[512] = calloc((size_t)n, sizeof *why);
  int *placed = calloc((size_t)n, sizeof *placed);
  coord_pic_t p;
  int pic = 0, rc = js && ids && slot && why && placed ? FSDP_OK
                                                     : err_set(FSDP_ENOMEM, "coordinator: out of memory");
  /* Placed now, a submit starts without waiting for the tick; but the
   * older pending jobs come first (submission order). So the pass the tick
   * would run is run first when one is due (a device freed, a node back
   * since the last: an idle cluster's costs a look at the state index);
   * otherwise every pending job was fitted on this picture and did not
   * fit, and a submit placed now jumps none that could run. Before, a
   * submit took the devices an ended job freed from the older job waiting
   * for them (found by an outside tester). */
  if (!rc && coord_schedule_due(c, coord_mono_ms(c))) coord_schedule(c);
  if (!rc && !(pic = !coord_pic_load(c, &p))) { /* stored unplaced: the next pass places them */
    LOG_WARN("coord", "placement of this turn's submits: %s", err_msg());
    c->dirty = 1;
  }
  /* fitted before they are stored, so a job that waits is stored with its
   * reason; a second submit of the turn with the same request id is the
   * first's job (dup[i]: its index + 1) */
  int *dup = calloc((size_t)n, sizeof *dup);
  int m = 0; /* stored */
  if (!rc && !dup) rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
  for (int i = 0; !rc && i < n; i++) {
    for (int k = 0; k < i && !dup[i]; k++)
      if (sub[i].request_id[0] && !strcmp(sub[i].request_id, sub[k].request_id)) dup[i] = k + 1;
    if (dup[i]) continue;
    const coord_job_t *x = &sub[i].facts;
    slot[i] = calloc((size_t)(x->R * x->S) + 1, sizeof **slot);
    if (pic && slot[i] && sub[i].call)
      placed[i] = coord_fit(&p, x, slot[i], why[i], sizeof why[i], &sub[i].facts.whole_since) ==
                  SCHED_PLACED;
    js[m++] = (store_job_spec_t){sub[i].name, sub[i].text, sub[i].world, sub[i].mesh,
                                 sub[i].max_restarts, placed[i] ? NULL : why[i], sub[i].request_id,
                                 x->ckpt_dir};
  }
  if (!rc) rc = store_job_submit_batch(c->st, js, m, ids);
  /* ids[] in stored order back to the submits */
  for (int i = n - 1, k = m - 1; !rc && i >= 0; i--)
    if (!dup[i]) ids[i] = ids[k--];
  for (int i = 0; !rc && i < n; i++)
    if (dup[i]) ids[i] = ids[dup[i] - 1];
  for (int i = 0; i < n; i++) {
    if (!rc && !dup[i]) {
      sub[i].facts.id = ids[i];
      if (!placed[i]) /* its first reason is stored with it */
        sub[i].facts.reason_sum = coord_reason_sum(why[i]), sub[i].facts.reason_stored = 1;
      coord_job_cache(c, &sub[i].facts);
      LOG_INFO("coord", "job j-%lld submitted: %s, %d ranks, mesh %s", (long long)ids[i],
               sub[i].name[0] ? sub[i].name : "(no name)", sub[i].world, sub[i].mesh);
      if (placed[i]) coord_start(c, &p, ids[i], &sub[i].facts, slot[i], why[i]);
    }
    if (sub[i].call) {
      rpc_call_on_cancel(sub[i].call, NULL, NULL);
      if (rc) rpc_call_finish(sub[i].call, rc);
      else coord_submit_reply(c, sub[i].call, ids[i], sub[i].note);
    }
    free(sub[i].text);
    if (slot) free(slot[i]);
  }
  if (pic) coord_pic_wake(c, &p), coord_pic_free(&p);
  free(sub), free(js), free(ids), free(slot), free(why), free(placed), free(dup);
}

void coord_submit_flush(coord_t *c) {
  coord_submit_store(c);
  coord_checks_start(c);
}

static void coord_get_job_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__GetJobRequest *q = (const void *)req;
  store_job_t j;
  if (coord_job_arg(c, call, q->job_id, &j)) return;
  if (q->attempt > j.epoch) {
    store_job_free(&j);
    rpc_call_finish(call, err_set(FSDP_ENOTFOUND, "job %s has had %lld attempt(s), not %u",
                                  q->job_id, (long long)j.epoch, q->attempt));
    return;
  }
  coord_arena_t a = {0};
  Fsdp__V1__GetJobReply rep = FSDP__V1__GET_JOB_REPLY__INIT;
  rep.job = coord_job_msg(c, &a, &j, 1);
  if (rep.job && q->attempt && q->attempt != j.epoch) { /* an earlier attempt's ranks */
    store_job_t k = j;
    k.epoch = q->attempt;
    if (coord_ranks_msg(c, &a, &k, &rep.job->ranks, &rep.job->n_ranks)) a.failed = 1;
  }
  store_job_free(&j);
  coord_reply(call, &a, &rep.base);
}

static void coord_list_jobs_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__ListJobsRequest *q = (const void *)req;
  unsigned states = 0;
  for (size_t k = 0; k < q->n_states; k++)
    for (int s = 0; s <= STORE_JOB_CANCELLED; s++)
      if (q->states[k] == coord_job_state((store_job_state_t)s)) states |= STORE_JOB_BIT(s);
  const uint32_t limit = !q->limit ? COORD_LIST_DEFAULT : q->limit < INT32_MAX ? q->limit : INT32_MAX;
  store_job_t *jobs = NULL;
  int n = 0;
  /* newest last; of the matching ones, the newest `limit`; states asked for
   * that no job can be in (UNSPECIFIED, unknown numbers) match nothing */
  int rc = q->before_id < 0 ? err_set(FSDP_EINVAL, "before_id: %lld; give 0 for the newest, or "
                                      "the next_before_id of the last reply", (long long)q->before_id)
           : q->n_states && !states
               ? FSDP_OK
               : store_job_list(c->st, states, q->before_id, (int)limit, &jobs, &n);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  coord_arena_t a = {0};
  Fsdp__V1__ListJobsReply rep = FSDP__V1__LIST_JOBS_REPLY__INIT;
  rep.jobs = coord_alloc(&a, (size_t)n * sizeof *rep.jobs);
  /* newest first until the reply would pass COORD_REPLY_BYTES: the rest is the next page */
  size_t bytes = 0;
  int first = n;
  while (rep.jobs && first > 0) {
    Fsdp__V1__Job *m = coord_job_msg(c, &a, &jobs[first - 1], 0);
    const size_t b = m ? protobuf_c_message_get_packed_size(&m->base) + 8 : 0;
    if (!m || (bytes + b > COORD_REPLY_BYTES && first < n)) break;
    bytes += b;
    rep.jobs[--first] = m;
  }
  if (rep.jobs) {
    rep.n_jobs = (size_t)(n - first);
    memmove(rep.jobs, rep.jobs + first, rep.n_jobs * sizeof *rep.jobs);
    if (first > 0) rep.next_before_id = jobs[first].id;
  }
  store_jobs_free(jobs, n);
  coord_reply(call, &a, &rep.base);
}

/* Answers a call that changed job id (rc: how the change went) with the
 * job as it is now, in *field of reply (a message whose field is the job). */
static void coord_reply_job(coord_t *c, rpc_call_t *call, int64_t id, int rc,
                            ProtobufCMessage *reply, Fsdp__V1__Job **field) {
  store_job_t j;
  if (!rc) rc = store_job_get(c->st, id, &j);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  coord_arena_t a = {0};
  *field = coord_job_msg(c, &a, &j, 0);
  store_job_free(&j);
  coord_reply(call, &a, reply);
}

static void coord_cancel_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__CancelJobRequest *q = (const void *)req;
  store_job_t j;
  if (coord_job_arg(c, call, q->job_id, &j)) return;
  const int64_t id = j.id, epoch = j.epoch;
  const int running = j.state == STORE_JOB_RUNNING;
  store_job_free(&j);
  char why[400];
  snprintf(why, sizeof why, "cancelled: %.256s", q->reason[0] ? q->reason : "by a user");
  store_job_state_t was;
  int rc = text_plain("reason", q->reason, 256);
  if (!rc && q->checkpoint && q->grace_ms > COORD_STOP_GRACE_MAX_MS)
    rc = err_set(FSDP_EINVAL, "grace_ms: %u; a stop's grace is at most %d ms (1 hour)",
                 q->grace_ms, COORD_STOP_GRACE_MAX_MS);
  coord_job_t *x = rc ? NULL : coord_job_info(c, id);
  /* cancel --checkpoint: the ranks checkpoint at their next step boundary
   * and exit 75 (SIGTERM, SIGKILL after the grace); the attempt stays live
   * so that the checkpoint commits, and its end makes the job CANCELLED
   * (store_job_stop; coord_stop_tick past the grace) */
  if (!rc && q->checkpoint && running && x && x->ckpt_dir[0]) {
    const int grace = q->grace_ms ? (int)q->grace_ms : COORD_STOP_GRACE_MS;
    int64_t at = 0;
    rc = store_job_stop(c->st, id, why, coord_unix_ms() + grace + COORD_STOP_MARGIN_MS, &at);
    if (!rc && at == epoch && !x->stop_until) {
      LOG_INFO("coord", "job j-%lld stopping with a checkpoint (grace %.1f s): %s", (long long)id,
               grace / 1000.0, why);
      coord_stop_set(c, x, coord_mono_ms(c) + (uint64_t)grace + COORD_STOP_MARGIN_MS);
      coord_kill_attempt_grace(c, id, epoch, 0, "cancelled with --checkpoint: checkpoint at the "
                               "next step boundary and stop", grace);
      coord_job_changed(c, id);
    }
    Fsdp__V1__CancelJobReply rep = FSDP__V1__CANCEL_JOB_REPLY__INIT;
    coord_reply_job(c, call, id, rc, &rep.base, &rep.job);
    return;
  }
  if (!rc && q->checkpoint && running)
    snprintf(why + strlen(why), sizeof why - strlen(why), " (with --checkpoint, but the job has "
             "no checkpoint_dir: there was nothing to keep, its ranks were killed)");
  /* its ranks' figures, in case no exit report of them comes (a node gone
   * with them) before a restart forgets them */
  if (!rc && running) coord_ranks_keep(c, id, epoch);
  if (!rc) rc = store_job_cancel(c->st, id, why, &was);
  if (!rc) {
    LOG_INFO("coord", "job j-%lld %s", (long long)id, why);
    if (was == STORE_JOB_RUNNING) {
      coord_kill_attempt(c, id, epoch, 0, why);
      c->ended[COORD_ENDED_CANCELLED]++;
    }
    c->dirty = 1;
    coord_job_changed(c, id);
  }
  Fsdp__V1__CancelJobReply rep = FSDP__V1__CANCEL_JOB_REPLY__INIT;
  coord_reply_job(c, call, id, rc, &rep.base, &rep.job);
}

/* A resume is checked as a submit is, against the checkpoint its ranks
 * would resume from (job_resume_check, on the pool): a job admitted before
 * that check, or whose checkpoint_dir or resume_from changed since, would
 * otherwise fail again at its ranks' start, an attempt and a restart each,
 * with the reason only in their logs (found by an outside tester). */
static void coord_resume_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__ResumeJobRequest *q = (const void *)req;
  store_job_t j;
  if (coord_job_arg(c, call, q->job_id, &j)) return;
  Fsdp__V1__JobSpec spec;
  coord_check_t *k = calloc(1, sizeof *k);
  job_opt_t *opts = NULL;
  plan_t plan;
  int rc = k ? FSDP_OK : err_set(FSDP_ENOMEM, "coordinator: out of memory"), parsed = 0;
  if (!rc) k->call = call, k->resume = j.id;
  /* one that cannot be resumed in its state is told so by the store */
  if (!rc && j.state != STORE_JOB_FAILED && j.state != STORE_JOB_CANCELLED) {
    store_job_free(&j);
    coord_resume_checked(c, k);
    free(k);
    return;
  }
  if (!rc) rc = coord_spec_from_text(j.spec ? j.spec : "", &spec), parsed = !rc;
  if (!rc && !(opts = calloc(spec.n_options + 1, sizeof *opts)))
    rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
  for (size_t i = 0; !rc && i < spec.n_options; i++)
    opts[i] = (job_opt_t){spec.options[i]->section, spec.options[i]->key, spec.options[i]->value};
  if (!rc && (rc = job_validate(opts, (int)spec.n_options, j.world_size, 0, &k->cfg, &plan)))
    rc = err_wrap(FSDP_EINVAL, "job j-%lld cannot be resumed: its spec is refused now (submit it "
                  "again with this changed)", (long long)j.id);
  if (parsed) coord_spec_free(&spec);
  free(opts);
  store_job_free(&j);
  if (!rc) rc = coord_checks_add(c, k); /* the batch owns it */
  if (rc) {
    free(k);
    rpc_call_finish(call, rc);
  }
}

/* Back from the pool: the resume refused, naming what its ranks would
 * refuse, or done. */
static void coord_resume_checked(coord_t *c, coord_check_t *k) {
  const int64_t id = k->resume;
  int rc = k->rc ? err_set(FSDP_EINVAL, "job j-%lld cannot be resumed: its ranks would refuse "
                           "the checkpoint it resumes from: %s; submit it again with that "
                           "changed", (long long)id, k->err)
                 : FSDP_OK;
  const coord_job_t *x = rc ? NULL : coord_job_info(c, id);
  if (!rc && x && x->ckpt_dir[0]) rc = coord_ckpt_dir_free(c, x->ckpt_dir, id);
  if (!rc) rc = store_job_resume(c->st, id, x ? x->ckpt_dir : NULL);
  if (!rc) {
    LOG_INFO("coord", "job j-%lld resumed by a user", (long long)id);
    coord_job_t *x = coord_job_info(c, id);
    if (x) x->failure[0] = 0, x->preempted = 0, x->fails = 0, x->backoff_until = 0, x->n_avoid = 0;
    if (x && x->stop_until) x->stop_until = 0, c->n_stopping--; /* its stop's tick must not end the new attempt */
    c->dirty = 1;
    coord_job_changed(c, id);
  }
  Fsdp__V1__ResumeJobReply rep = FSDP__V1__RESUME_JOB_REPLY__INIT;
  coord_reply_job(c, k->call, id, rc, &rep.base, &rep.job);
}

static void coord_watch_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__WatchJobRequest *q = (const void *)req;
  store_job_t j;
  if (coord_job_arg(c, call, q->job_id, &j)) return;
  const int64_t id = j.id;
  store_job_free(&j);
  coord_watch_add(c, call, id);
}

static void coord_memory_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__GetMemoryStatsRequest *q = (const void *)req;
  store_job_t j;
  if (coord_job_arg(c, call, q->job_id, &j)) return;
  coord_arena_t a = {0};
  Fsdp__V1__GetMemoryStatsReply rep = FSDP__V1__GET_MEMORY_STATS_REPLY__INIT;
  if (coord_ranks_msg(c, &a, &j, &rep.ranks, &rep.n_ranks)) a.failed = 1;
  const coord_job_t *x = coord_job_info(c, j.id);
  rep.plan = x ? coord_alloc(&a, COORD_CATS * sizeof *rep.plan) : NULL;
  for (int k = 0; rep.plan && k < COORD_CATS; k++) {
    Fsdp__V1__MemoryCategory *mc = rep.plan[k] = coord_alloc(&a, sizeof *mc);
    if (!mc) break;
    fsdp__v1__memory_category__init(mc);
    mc->name = (char *)mem_cat_name((mem_cat_t)k);
    mc->planned_bytes = x->planned[k];
    rep.n_plan++;
  }
  store_job_free(&j);
  coord_reply(call, &a, &rep.base);
}

/* A node as the wire shows it. */
static Fsdp__V1__NodeInfo *coord_node_msg(coord_t *c, coord_arena_t *a, const store_node_t *sn) {
  Fsdp__V1__NodeInfo *m = coord_alloc(a, sizeof *m);
  if (!m) return NULL;
  fsdp__v1__node_info__init(m);
  m->node_id = coord_idstr(a, 'n', sn->id);
  m->hostname = coord_str(a, sn->name);
  m->address = coord_str(a, sn->address);
  m->drain_reason = coord_str(a, sn->drain_reason);
  const coord_node_t *ln = coord_node_get(c, sn->id, 0);
  if (sn->state == STORE_NODE_ALIVE)
    m->state = ln && ln->stopping ? FSDP__V1__NODE_STATE__NODE_STATE_STOPPING
                                  : FSDP__V1__NODE_STATE__NODE_STATE_ALIVE;
  else
    m->state = sn->stopped ? FSDP__V1__NODE_STATE__NODE_STATE_STOPPED
                           : FSDP__V1__NODE_STATE__NODE_STATE_DEAD;
  m->last_heartbeat_unix_ms = ln ? ln->heard_unix_ms : sn->last_seen_ms;
  m->devices = coord_alloc(a, (size_t)sn->n_devices * sizeof *m->devices);
  for (int k = 0; m->devices && k < sn->n_devices; k++) {
    Fsdp__V1__Device *d = m->devices[k] = coord_alloc(a, sizeof *d);
    if (!d) break;
    fsdp__v1__device__init(d);
    d->index = (uint32_t)sn->devices[k].index;
    d->kind = (char *)store_dev_kind_name(sn->devices[k].kind);
    d->name = coord_str(a, sn->devices[k].name);
    d->total_bytes = sn->devices[k].memory_bytes;
    for (int i = 0; ln && !ln->dead && i < ln->ndev; i++) /* live: its last heartbeat's */
      if (ln->offers[i].index == sn->devices[k].index) d->used_bytes = ln->offers[i].used;
    d->job_id = sn->devices[k].job_id ? coord_idstr(a, 'j', sn->devices[k].job_id) : "";
    m->n_devices++;
  }
  return m;
}

/* ListNodes from the in-memory picture (coord_pic_refresh): one node, or a
 * page after an id that stops short of COORD_REPLY_BYTES. */
static void coord_nodes_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__ListNodesRequest *q = (const void *)req;
  const int64_t one = q->node_id[0] ? coord_id_parse(q->node_id, 'n') : 0;
  int rc = q->node_id[0] && !one
               ? err_set(FSDP_ENOTFOUND, "node_id: '%.64s' is not a node id (they read n-3)",
                         q->node_id)
           : q->after_id < 0 ? err_set(FSDP_EINVAL, "after_id: %lld; give 0 for the first page, "
                                       "or the next_after_id of the last reply",
                                       (long long)q->after_id)
                             : coord_pic_refresh(c);
  int lo = 0, hi = c->pic_n; /* c->pic[lo..hi) by id: those after after_id, or the one asked for */
  while (!rc && lo < hi && c->pic[lo].id <= (one ? one - 1 : q->after_id)) lo++;
  if (!rc && one && (lo == hi || c->pic[lo].id != one))
    rc = err_set(FSDP_ENOTFOUND, "node %s: no such node (fsdpctl nodes lists them)", q->node_id);
  if (one) hi = lo + 1;
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  coord_arena_t a = {0};
  Fsdp__V1__ListNodesReply rep = FSDP__V1__LIST_NODES_REPLY__INIT;
  rep.nodes = coord_alloc(&a, (size_t)(hi - lo) * sizeof *rep.nodes);
  size_t bytes = 0;
  for (int i = lo; rep.nodes && i < hi; i++) {
    Fsdp__V1__NodeInfo *m = coord_node_msg(c, &a, &c->pic[i]);
    if (!m) break;
    const size_t b = protobuf_c_message_get_packed_size(&m->base) + 8;
    if (rep.n_nodes && bytes + b > COORD_REPLY_BYTES) {
      rep.next_after_id = c->pic[i - 1].id;
      break;
    }
    bytes += b;
    rep.nodes[rep.n_nodes++] = m;
  }
  coord_reply(call, &a, &rep.base);
}

static void coord_drain_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__DrainNodeRequest *q = (const void *)req;
  const int64_t id = coord_id_parse(q->node_id, 'n');
  int rc = FSDP_OK;
  if (!id)
    rc = err_set(FSDP_ENOTFOUND, "node_id: '%.64s' is not a node id (they read n-3; fsdpctl nodes "
                 "lists them)", q->node_id);
  else if (!q->undrain && !q->reason[0])
    rc = err_set(FSDP_EINVAL, "reason: say why node %s is drained (fsdpctl drain %s --reason "
                 "\"disk swap\")", q->node_id, q->node_id);
  else if (q->undrain || (rc = text_plain("reason", q->reason, STORE_DRAIN_MAX - 1)) == FSDP_OK)
    rc = store_node_drain(c->st, id, q->undrain ? NULL : q->reason);
  store_node_t *nodes = NULL;
  int nn = 0;
  if (!rc) rc = store_nodes_get(c->st, &id, 1, &nodes, &nn);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  LOG_INFO("coord", "node %s %s%s%s", q->node_id, q->undrain ? "undrained" : "drained",
           q->undrain ? "" : ": ", q->undrain ? "" : q->reason);
  c->dirty = 1; /* undrained: pending jobs may fit now */
  c->nodes_changed = 1;
  coord_arena_t a = {0};
  Fsdp__V1__DrainNodeReply rep = FSDP__V1__DRAIN_NODE_REPLY__INIT;
  for (int i = 0; i < nn; i++)
    if (nodes[i].id == id) rep.node = coord_node_msg(c, &a, &nodes[i]);
  store_nodes_free(nodes, nn);
  if (!rep.node && !a.failed) a.failed = 1;
  coord_reply(call, &a, &rep.base);
}

static void coord_events_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__ListEventsRequest *q = (const void *)req;
  int64_t job = 0;
  if (q->job_id[0]) {
    store_job_t j;
    if (coord_job_arg(c, call, q->job_id, &j)) return;
    job = j.id;
    store_job_free(&j);
  }
  int rc = FSDP_OK;
  if (q->after_id < 0)
    rc = err_set(FSDP_EINVAL, "after_id: %lld; give 0 for the newest events, or the id of the last "
                 "one seen", (long long)q->after_id);
  else if (q->limit > COORD_EVENTS_MAX)
    rc = err_set(FSDP_EINVAL, "limit: %u; at most %d a call (ask again after the last id for "
                 "more)", q->limit, COORD_EVENTS_MAX);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  const int limit = q->limit ? (int)q->limit : COORD_EVENTS_DEFAULT;
  store_event_t *ev = NULL;
  int n = 0;
  rc = store_event_list(c->st, job, q->after_id || q->follow ? q->after_id : STORE_EVENTS_NEWEST,
                        limit, &ev, &n);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  coord_arena_t a = {0};
  Fsdp__V1__ListEventsReply rep = FSDP__V1__LIST_EVENTS_REPLY__INIT;
  rep.events = coord_alloc(&a, (size_t)n * sizeof *rep.events);
  for (int i = 0; rep.events && i < n; i++) {
    Fsdp__V1__Event *m = coord_alloc(&a, sizeof *m);
    if (!m) break;
    fsdp__v1__event__init(m);
    m->id = ev[i].id;
    m->unix_ms = ev[i].time_ms;
    m->job_id = ev[i].job_id ? coord_idstr(&a, 'j', ev[i].job_id) : "";
    m->node_id = ev[i].node_id ? coord_idstr(&a, 'n', ev[i].node_id) : "";
    m->kind = coord_str(&a, ev[i].kind);
    m->text = coord_str(&a, ev[i].text);
    rep.events[rep.n_events++] = m;
  }
  store_array_free(ev);
  coord_reply(call, &a, &rep.base);
}

/* ---- node ------------------------------------------------------------------- */

/* Device i of a registration as the store takes it, or why not, naming
 * the field: the wire's numbers are unsigned (an index of 2^32 - 1 was
 * shown as device -1, and every refusal said "bad index, kind or memory"). */
static int coord_device(const Fsdp__V1__Device *d, size_t i, store_device_t *out) {
  if (d->index > INT32_MAX)
    return err_set(FSDP_EINVAL, "devices[%zu].index: %u; a device's number on its node, at most "
                   "%d", i, d->index, INT32_MAX);
  if (d->total_bytes > INT64_MAX)
    return err_set(FSDP_EINVAL, "devices[%zu].total_bytes: %llu; its memory in bytes, at most "
                   "%lld", i, (unsigned long long)d->total_bytes, (long long)INT64_MAX);
  int known = 0;
#define XX(x) \
  if (!strcmp(d->kind, #x)) out->kind = STORE_DEV_##x, known = 1;
  STORE_DEV_KINDS(XX)
#undef XX
  if (!known)
    return err_set(FSDP_EINVAL, "devices[%zu].kind: '%.32s'; cpu or cuda", i, d->kind);
  char what[48];
  snprintf(what, sizeof what, "devices[%zu].name", i);
  int rc = text_plain(what, d->name, STORE_NAME_MAX - 1);
  if (rc) return rc;
  out->index = (int)d->index;
  out->memory_bytes = d->total_bytes;
  snprintf(out->name, sizeof out->name, "%s", d->name);
  return FSDP_OK;
}

int coord_rank_is_callers(coord_t *c, rpc_call_t *call, const char *node_id, int64_t job,
                          int64_t epoch, int rank) {
  int64_t on = 0;
  char name[STORE_NAME_MAX];
  int rc = store_rank_node(c->st, job, epoch, rank, &on, name, sizeof name);
  if (rc) return rc;
  const char *me = rpc_call_node(call);
  if (me && strcmp(me, name))
    return err_set(FSDP_EPERM, "rank %d of job j-%lld attempt %lld runs on node %s, and this "
                   "caller's token is node %.127s's: a node speaks only for its own ranks", rank,
                   (long long)job, (long long)epoch, name, me);
  if (coord_id_parse(node_id, 'n') != on)
    return err_set(FSDP_ENOTFOUND, "node_id: '%.64s': rank %d of job j-%lld attempt %lld runs on "
                   "node n-%lld (%s), not there", node_id, rank, (long long)job, (long long)epoch,
                   (long long)on, name);
  return 0;
}

/* One live fsdpd per node name: while the node's session has its heartbeat
 * held (its fsdpd is there: a dead one's call is cancelled with its
 * connection), another fsdpd process registering under that name is
 * refused, rather than each taking the node from the other at every
 * registration. A restarted fsdpd gets in at once: its predecessor's call
 * ended with it. */
static int coord_register_unique(coord_t *c, const Fsdp__V1__RegisterNodeRequest *q) {
  int64_t id;
  char addr[STORE_ADDR_MAX];
  int rc = store_node_find(c->st, q->hostname, &id, addr, sizeof addr);
  const coord_node_t *n = rc ? NULL : coord_node_get(c, id, 0);
  if (rc || !n || !n->poll || !n->instance || !q->instance || n->instance == q->instance) return rc;
  return err_set(FSDP_EEXIST, "hostname: node %s is another fsdpd's, which runs (its Node service "
                 "at %s; this one's at %s); give each fsdpd its own name (fsdpd --name, the host "
                 "name by default), or stop the other first", q->hostname, addr, q->address);
}

_Static_assert(TEXT_NODE_NAME_MAX == STORE_NAME_MAX - 1 && TEXT_NODE_ADDR_MAX == STORE_ADDR_MAX - 1,
               "fsdpd checks its name and address against what the store holds");

static void coord_register_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__RegisterNodeRequest *q = (const void *)req;
  int rc = text_plain("hostname", q->hostname, TEXT_NODE_NAME_MAX);
  if (!rc && !q->hostname[0]) rc = err_set(FSDP_EINVAL, "hostname: empty; fsdpd sends its --name");
  const char *me = rpc_call_node(call);
  /* the fix depends on where the name came from: a token file's line (the
   * operator's to add) or the kubelet's binding (no file to edit) */
  if (!rc && me && strcmp(me, q->hostname) && rpc_call_node_jwt(call))
    rc = err_set(FSDP_EPERM, "hostname: '%s', but this node's service account token is bound to "
                 "node %.127s (its kubernetes.io.node.name): a node registers only under its own "
                 "name; give fsdpd --name=$(NODE_NAME), the pod's spec.nodeName, as "
                 "deploy/k8s/fsdpd.yaml does", q->hostname, me);
  else if (!rc && me && strcmp(me, q->hostname))
    rc = err_set(FSDP_EPERM, "hostname: '%s', but this node's token is node %.127s's: a node "
                 "registers only under its own name (fsdpd --name %.127s), or it needs its own "
                 "line in the coordinator's node token file", q->hostname, me, me);
  if (!rc) rc = text_plain("address", q->address, TEXT_NODE_ADDR_MAX);
  if (!rc && q->n_devices > COORD_NODE_DEVICES_MAX)
    rc = err_set(FSDP_EINVAL, "devices: %zu; a node has at most %d (fsdpd --devices)",
                 q->n_devices, COORD_NODE_DEVICES_MAX);
  /* Refused, where a heartbeat reads the first ranks and warns: a heartbeat
   * only reports, but a registration acts on its list (kills every rank of
   * an attempt that is over, fails attempts whose ranks it lacks) and its
   * answer renews the leases of all it lists, so a part read would leave
   * ranks past the bound running unkilled and unheld, and fail the attempts
   * of those placed there. Refused, the node is unregistered and its fsdpd
   * fences its ranks; then its list is short again. Before, one RegisterNode
   * of 100,000 ranks held the loop 49 s (found by an outside tester). */
  if (!rc && q->n_ranks > COORD_NODE_RANKS_MAX(q->n_devices))
    rc = err_set(FSDP_EINVAL, "ranks: %zu; a node of %zu devices runs at most %zu (2 a device "
                 "and 16)", q->n_ranks, q->n_devices, COORD_NODE_RANKS_MAX(q->n_devices));
  store_device_t *dev = rc ? NULL : calloc(q->n_devices + 1, sizeof *dev);
  if (!rc && !dev) rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
  for (size_t i = 0; !rc && i < q->n_devices; i++) rc = coord_device(q->devices[i], i, &dev[i]);
  int64_t id = 0;
  if (!rc) rc = coord_register_unique(c, q);
  if (!rc) rc = store_node_register(c->st, q->hostname, q->address, dev, (int)q->n_devices, &id);
  free(dev);
  coord_node_t *n = rc ? NULL : coord_node_get(c, id, 1);
  if (!rc && !n) rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  uint64_t session = 0;
  while (!session)
    if (getrandom(&session, sizeof session, 0) != sizeof session) session = (uint64_t)coord_unix_ms();
  coord_node_drop_poll(c, n, "superseded: the node registered again");
  n->n_sent = 0; /* what it runs is in this registration; what it lacks is sent below */
  n->session = session, n->dead = 0, n->stopping = 0, n->stopped = 0, n->ndev = (int)q->n_devices;
  for (size_t i = 0; i < q->n_devices; i++)
    n->offers[i].index = (int)q->devices[i]->index, n->offers[i].bytes = q->devices[i]->total_bytes,
    n->offers[i].used = q->devices[i]->used_bytes;
  n->instance = q->instance;
  if (getrandom(n->log_key, sizeof n->log_key, 0) != (ssize_t)sizeof n->log_key) {
    rpc_call_finish(call, err_set(FSDP_EINTERNAL, "coordinator: no random bytes for node %s's "
                                  "log key", q->hostname));
    return;
  }
  coord_node_heard(c, n);
  n->awaited = 0, n->grace_until_ms = 0; /* back: the heartbeat timeout alone, from now */
  n->resync = 0; /* this registration tells it what its dropped queue held */
  /* Reconcile: ranks it runs that are not of a running attempt are killed;
   * ranks the store has there but it does not run were never started
   * (assigned: told again) or are gone (running: the attempt fails). */
  for (size_t i = 0; i < q->n_ranks; i++) {
    const Fsdp__V1__RankStatus *r = q->ranks[i];
    int64_t job = coord_id_parse(r->job_id, 'j');
    store_job_t j;
    int keep = job && !store_job_get(c->st, job, &j);
    if (keep) keep = j.state == STORE_JOB_RUNNING && j.epoch == (int64_t)r->attempt,
              store_job_free(&j);
    if (keep && r->rank <= INT32_MAX && r->state != FSDP__V1__RANK_STATE__RANK_STATE_EXITED)
      coord_stop_resend(c, id, job, r->attempt, (int)r->rank); /* a stop asked before a restart */
    if (keep || !job || r->rank > INT32_MAX) continue;
    /* Killed whatever its job: the order is the node's own processes' (a
     * rank of a job the store no longer has, purged or before a restore,
     * stops too), and its queue is bounded (coord_order_push). No grace
     * (1 ms: 0 is the node's default): SIGTERM would have it write a
     * checkpoint, into the directory the job's live attempt now writes (a
     * node cut off, or stopped, while the job went on). */
    coord_order_t o = {.kill = 1, .job = job, .epoch = r->attempt, .rank = (int)r->rank,
                       .grace_ms = 1};
    snprintf(o.reason, sizeof o.reason, "its attempt is over");
    coord_order_push(c, id, &o);
    /* this registration's answer renewed their lease: the job's next
     * attempt waits until they are shown gone. Only for a rank the store
     * placed here (or could not say where): before, any node listing
     * another node's job held its restart for good, renewed at each of
     * its registrations (found by an outside tester). */
    if (r->state == FSDP__V1__RANK_STATE__RANK_STATE_EXITED) continue;
    int64_t on = 0;
    const int where = store_rank_node(c->st, job, r->attempt, (int)r->rank, &on, NULL, 0);
    if (where ? where != FSDP_ENOTFOUND : on == id) coord_hold_add(c, job, r->attempt, id);
  }
  store_rank_t *want = NULL;
  int nw = 0;
  if (!store_ranks_of_node(c->st, id, &want, &nw))
    for (int i = 0; i < nw; i++) {
      int runs = 0;
      for (size_t k = 0; k < q->n_ranks && !runs; k++)
        runs = coord_id_parse(q->ranks[k]->job_id, 'j') == want[i].job_id &&
               q->ranks[k]->attempt == (uint32_t)want[i].epoch && q->ranks[k]->rank == (uint32_t)want[i].rank;
      if (runs) continue;
      coord_job_t *x = coord_job_info(c, want[i].job_id);
      if (want[i].state == STORE_RANK_ASSIGNED && x) {
        coord_order_t o = {.job = want[i].job_id, .epoch = want[i].epoch, .rank = want[i].rank,
                           .world = x->R * x->S, .device = want[i].device_index,
                           .shard_group = want[i].shard_group, .replica_group = want[i].replica_group};
        coord_order_push(c, id, &o);
      } else {
        char why[256];
        snprintf(why, sizeof why, "rank %d is gone from node n-%lld (%s registered again "
                 "without it)", want[i].rank, (long long)id, q->hostname);
        coord_attempt_fail(c, want[i].job_id, want[i].epoch, 0, id, why);
      }
    }
  store_array_free(want);
  /* what it runs is here: the holds on it whose ranks it does not run go
   * (those of attempts that failed just above, for ranks it lacks, too) */
  coord_hold_confirm(c, n, q->ranks, q->n_ranks);
  LOG_INFO("coord", "node n-%lld (%s, %zu devices) registered", (long long)id, q->hostname,
           q->n_devices);
  c->dirty = c->nodes_changed = 1;
  char nid[32];
  coord_id_str(nid, sizeof nid, 'n', id);
  Fsdp__V1__RegisterNodeReply rep = FSDP__V1__REGISTER_NODE_REPLY__INIT;
  rep.node_id = nid, rep.session = session;
  rep.heartbeat_interval_ms = (uint32_t)c->o.heartbeat_interval_ms;
  rep.fence_ms = (uint32_t)c->o.restart_grace_ms;
  if (c->o.user_token_file) { /* where no token is checked, neither is a ticket */
    rep.log_key.data = n->log_key;
    rep.log_key.len = sizeof n->log_key;
  }
  rpc_call_reply(call, &rep.base);
}

/* A rank's report from its node's heartbeat. The first of a rank in an
 * attempt is checked with the store (an attempt still live, a rank of it
 * placed on this node) before the coordinator keeps anything of it: a node
 * reporting ranks of old attempts, of other nodes or of no job at all
 * leaves nothing behind. */
/* The record of rank in attempt, made (or one of an earlier attempt
 * emptied) for it; NULL when out of memory, or when the record is of a
 * later attempt, which a late report of this one must not take back. The
 * caller has the rank checked with the store. */
static coord_rank_t *coord_rank_of(coord_t *c, int64_t job, int64_t attempt, int rank) {
  coord_rank_t *r = coord_rank_get(c, job, rank, 1);
  if (!r || r->epoch > attempt) return NULL;
  if (r->epoch < attempt) {
    /* what an earlier attempt reported goes (the key and the hash handle stay) */
    memset(&r->epoch, 0, offsetof(coord_rank_t, hh) - offsetof(coord_rank_t, epoch));
    r->epoch = attempt, r->rank = rank;
  }
  return r;
}

/* A rank's step, loss and tokens/s from a report of it (a heartbeat's, or
 * its exit report's final one), told to the job's watchers when they
 * changed: all three, from one report, so that a step is never shown with
 * another's loss. An unreported status (a rank that has not finished a
 * step) takes back no figure, nor does a report older than them. */
static void coord_rank_figures(coord_t *c, coord_rank_t *r, const Fsdp__V1__RankStatus *s) {
  if (s->unreported || (r->reported && s->step < r->step)) return;
  const int64_t before = r->step;
  const int was = r->reported;
  r->step = s->step, r->loss = s->loss, r->tokens_per_s = s->tokens_per_s, r->reported = 1;
  if (r->step != before || !was) coord_job_changed(c, r->job);
}

static void coord_rank_report(coord_t *c, int64_t node, const Fsdp__V1__RankStatus *s) {
  int64_t job = coord_id_parse(s->job_id, 'j');
  if (!job || s->rank > INT32_MAX || !s->attempt) return;
  coord_rank_t *r = coord_rank_get(c, job, (int)s->rank, 0);
  if (!r || r->epoch != (int64_t)s->attempt) {
    /* first news of this rank in this attempt: its process runs */
    if (store_rank_running(c->st, job, s->attempt, (int)s->rank, node, 0)) return;
    if (!(r = coord_rank_of(c, job, s->attempt, (int)s->rank))) return;
  }
  r->node = node, r->device = (int)s->device, r->state = s->state;
  r->collective_seq = s->collective_seq;
  snprintf(r->collective_op, sizeof r->collective_op, "%s", s->collective_op);
  coord_text_mend(r->collective_op);
  r->ncat = 0;
  for (size_t k = 0; k < s->n_memory && r->ncat < COORD_CATS; k++, r->ncat++) {
    snprintf(r->cat[r->ncat], sizeof r->cat[0], "%s", s->memory[k]->name);
    coord_text_mend(r->cat[r->ncat]);
    r->cur[r->ncat] = s->memory[k]->current_bytes, r->peak[r->ncat] = s->memory[k]->peak_bytes;
  }
  coord_rank_figures(c, r, s);
}

/* What a node's devices offer, from its heartbeat: a GPU's free memory,
 * which its fsdpd measures again while it is idle (others' processes come
 * and go), stored when it changed, and jobs placed by it. */
static void coord_node_offers(coord_t *c, coord_node_t *n, const Fsdp__V1__HeartbeatRequest *q) {
  for (size_t i = 0; i < q->n_devices; i++) {
    const Fsdp__V1__Device *d = q->devices[i];
    for (int k = 0; k < n->ndev; k++) {
      if (n->offers[k].index != (int)d->index) continue;
      n->offers[k].used = d->used_bytes;
      /* a figure registration would refuse is not taken either; 0 is one
       * it takes: a GPU another process filled (before, it was dropped,
       * and the full GPU stayed offered at its old figure: helper-111) */
      if (d->total_bytes == n->offers[k].bytes || d->total_bytes > INT64_MAX) break;
      if (store_device_memory(c->st, n->id, n->offers[k].index, d->total_bytes)) {
        LOG_WARN("coord", "node n-%lld device %d: %s", (long long)n->id, n->offers[k].index,
                 err_msg());
        break;
      }
      LOG_INFO("coord", "node n-%lld device %d offers %.2f GiB now (was %.2f GiB)",
               (long long)n->id, n->offers[k].index, (double)d->total_bytes / (1 << 30),
               (double)n->offers[k].bytes / (1 << 30));
      n->offers[k].bytes = d->total_bytes;
      c->dirty = c->nodes_changed = 1; /* placed by it, and admitted by it */
      break;
    }
  }
}

static void coord_heartbeat_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__HeartbeatRequest *q = (const void *)req;
  coord_node_t *n = coord_node_get(c, coord_id_parse(q->node_id, 'n'), 0);
  if (!n || !n->session || n->session != q->session || n->dead || n->resync) {
    Fsdp__V1__HeartbeatReply rep = FSDP__V1__HEARTBEAT_REPLY__INIT;
    rep.reregister = 1;
    rep.heartbeat_interval_ms = (uint32_t)c->o.heartbeat_interval_ms;
    rpc_call_reply(call, &rep.base);
    return;
  }
  coord_node_heard(c, n);
  if (q->stopping && !n->stopping) LOG_INFO("coord", "node %s is stopping: no new ranks there", q->node_id);
  n->stopping |= q->stopping;
  coord_node_offers(c, n, q);
  uint64_t busy[COORD_NODE_DEVICES_MAX / 64] = {0};
  for (size_t i = 0; i < q->n_devices; i++)
    if (q->devices[i]->job_id[0] && q->devices[i]->index < COORD_NODE_DEVICES_MAX)
      busy[q->devices[i]->index / 64] |= 1ull << (q->devices[i]->index % 64);
  for (size_t w = 0; w < COORD_NODE_DEVICES_MAX / 64; w++) {
    if (n->busy[w] & ~busy[w]) c->dirty = 1; /* a device came free */
    n->busy[w] = busy[w];
  }
  const size_t most = COORD_NODE_RANKS_MAX(n->ndev);
  if (q->n_ranks > most)
    LOG_WARN("coord", "node %s reports %zu ranks, more than %zu for its %d devices: the first "
             "%zu are read", q->node_id, q->n_ranks, most, n->ndev, most);
  for (size_t i = 0; i < q->n_ranks && i < most; i++) coord_rank_report(c, n->id, q->ranks[i]);
  coord_node_confirm(c, n, q->ranks, q->n_ranks < most ? q->n_ranks : most);
  coord_hold_confirm(c, n, q->ranks, q->n_ranks);
  if (!q->leaving) {
    coord_node_hold(c, n, call);
    return;
  }
  coord_node_gone(c, n, coord_mono_ms(c), 1); /* its last call, answered at once */
  Fsdp__V1__HeartbeatReply rep = FSDP__V1__HEARTBEAT_REPLY__INIT;
  rep.heartbeat_interval_ms = (uint32_t)c->o.heartbeat_interval_ms;
  rep.left = 1;
  rpc_call_reply(call, &rep.base);
}

/* The world rank of a rendezvous request's group rank, its group ("world",
 * "shard/<i>": replica i's ranks, "replica/<j>": the ranks holding shard j)
 * and size checked against the job's mesh. */
static int coord_group_rank(coord_t *c, int64_t job, const Fsdp__V1__RendezvousRequest *q, int *w) {
  const coord_job_t *x = coord_job_info(c, job);
  if (!x) return err_set(FSDP_ENOTFOUND, "job j-%lld: not a job of this coordinator", (long long)job);
  const int R = x->mesh.replicas, S = x->mesh.shards;
  int i = -1, end = 0, size;
  char kind = 0;
  if (!strcmp(q->group, "world")) kind = 'w', size = R * S;
  else if (sscanf(q->group, "shard/%d%n", &i, &end) == 1 && !q->group[end] && i >= 0 && i < R)
    kind = 's', size = S;
  else if (sscanf(q->group, "replica/%d%n", &i, &end) == 1 && !q->group[end] && i >= 0 && i < S)
    kind = 'r', size = R;
  else
    return err_set(FSDP_EINVAL, "group: '%s': not a group of job j-%lld's %dx%d mesh (world, "
                   "shard/<0..%d>, replica/<0..%d>)", q->group, (long long)job, R, S, R - 1, S - 1);
  if (q->group_size != (uint32_t)size || q->rank >= q->group_size)
    return err_set(FSDP_EINVAL, "rank %u of group_size %u: group %s of job j-%lld has %d ranks",
                   q->rank, q->group_size, q->group, (long long)job, size);
  const int r = (int)q->rank;
  *w = kind == 'w' ? r : kind == 's' ? i * S + r : r * S + i;
  return 0;
}

static void coord_rendezvous_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__RendezvousRequest *q = (const void *)req;
  int64_t job = coord_id_parse(q->job_id, 'j');
  int rc = job ? FSDP_OK : err_set(FSDP_ENOTFOUND, "job_id: '%.64s' is not a job id", q->job_id);
  if (!rc) rc = text_plain("group", q->group, 63);
  int world_rank = 0;
  if (!rc) rc = coord_group_rank(c, job, q, &world_rank);
  if (!rc) rc = coord_rank_is_callers(c, call, q->node_id, job, q->attempt, world_rank);
  if (!rc) rc = store_rendezvous_put(c->st, job, q->attempt, q->group, (int)q->rank,
                                     q->payload.data, q->payload.len);
  store_rendezvous_t r = {0};
  if (!rc) rc = store_rendezvous_get(c->st, job, q->attempt, q->group, (int)q->group_size, &r);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  if (!r.complete) {
    store_rendezvous_free(&r);
    coord_rdv_hold(c, call, job, q->attempt, q->group, (int)q->group_size);
    return;
  }
  store_rendezvous_free(&r);
  coord_rdv_hold(c, call, job, q->attempt, q->group, (int)q->group_size);
  coord_rdv_answer(c, job, q->attempt, q->group); /* this call and every waiter of the group */
}

static void coord_rank_exit_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__ReportRankExitRequest *q = (const void *)req;
  int64_t job = coord_id_parse(q->job_id, 'j');
  int status = q->term_signal ? -q->term_signal : q->exit_status;
  int rc = !job ? err_set(FSDP_ENOTFOUND, "job_id: '%.64s' is not a job id", q->job_id)
           : q->rank > INT32_MAX ? err_set(FSDP_ENOTFOUND, "rank %u: no such rank", q->rank)
                                 : coord_rank_is_callers(c, call, q->node_id, job, q->attempt, (int)q->rank);
  if (!rc && q->node_stopping) { /* before the verdict: a requeued job must not land there again */
    coord_node_t *n = coord_node_get(c, coord_id_parse(q->node_id, 'n'), 0);
    if (n) n->stopping = 1;
  }
  store_attempt_verdict_t verdict = STORE_ATTEMPT_GOING;
  char memory[STORE_RANK_MEMORY_MAX] = "";
  store_figures_t fig;
  const int has_fig = !rc && coord_figures_of_exit(c, job, q, &fig);
  if (!rc) coord_memory_of_exit(c, job, q, memory, sizeof memory);
  /* fenced: its node stopped it because this coordinator (or its previous
   * run) was silent past the fence it gave: not the job's doing */
  if (!rc)
    rc = (q->fenced ? store_rank_fenced : store_rank_exit)(c->st, job, q->attempt, (int)q->rank,
                                                           status, memory, has_fig ? &fig : NULL,
                                                           &verdict);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  /* its last status is the step and loss it ended at: its last heartbeat
   * report may be many steps older, or there was none (a rank that ended
   * before a heartbeat carried it has no record yet; the store took the
   * exit, so the rank is this attempt's) */
  coord_rank_t *last = q->status ? coord_rank_of(c, job, q->attempt, (int)q->rank) : NULL;
  if (last) coord_rank_figures(c, last, q->status);
  char why[512];
  /* a killed rank's last log line is whatever it printed last (often a
   * line of its start), not a reason: it is named as what it is */
  if (q->term_signal) {
    const char *sig = q->term_signal > 0 && q->term_signal < 65 ? sigabbrev_np(q->term_signal) : NULL;
    snprintf(why, sizeof why, "rank %u on node %.32s was killed by signal %d%s%s%s%s%.300s",
             q->rank, q->node_id, q->term_signal, sig ? " (SIG" : "", sig ? sig : "", sig ? ")" : "",
             q->message[0] ? "; the last line of its log: " : "", q->message);
  } else {
    snprintf(why, sizeof why, "rank %u on node %.32s exited with status %d%s%.300s", q->rank,
             q->node_id, q->exit_status, q->message[0] ? ": " : "", q->message);
  }
  coord_text_mend(why); /* a log line of any bytes, cut at 300 */
  char what[512];
  if (q->fenced)
    snprintf(what, sizeof what, "rank %u on node %.32s was stopped by its node's fence (the "
             "coordinator silent past the fence it gave the node; no restart spent): %.300s",
             q->rank, q->node_id, q->message);
  else
    snprintf(what, sizeof what, "its ranks were stopped on node %.32s (preempted)", q->node_id);
  coord_text_mend(what);
  /* answered once the attempt's end is stored: an error makes fsdpd report
   * again (the tick also settles it when the store takes it) */
  if ((rc = coord_attempt_settle(c, job, q->attempt, verdict, coord_id_parse(q->node_id, 'n'), why,
                                 what))) {
    rpc_call_finish(call, rc);
    return;
  }
  Fsdp__V1__ReportRankExitReply rep = FSDP__V1__REPORT_RANK_EXIT_REPLY__INIT;
  rpc_call_reply(call, &rep.base);
}

/* GetLogTicket: a ticket for one rank's log on one node (ticket.h), under
 * the key the node got at its registration with this coordinator. */
static void coord_log_ticket_cb(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  coord_t *c = arg;
  const Fsdp__V1__GetLogTicketRequest *q = (const void *)m;
  int rc = text_plain("job_id", q->job_id, 63);
  const int64_t id = coord_id_parse(q->node_id, 'n');
  const coord_node_t *n = rc || !id ? NULL : coord_node_get(c, id, 0);
  if (!rc && (!n || !n->session))
    rc = err_set(FSDP_ENOTFOUND, "node %s is not registered with this coordinator (fsdpctl nodes "
                 "lists the nodes)", q->node_id);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  char t[TICKET_MAX] = "";
  if (c->o.user_token_file)
    ticket_make(t, n->log_key, sizeof n->log_key, q->job_id, q->rank, q->node_id,
                coord_unix_ms() / 1000 + TICKET_LIFE_S);
  Fsdp__V1__GetLogTicketReply rep = FSDP__V1__GET_LOG_TICKET_REPLY__INIT;
  rep.ticket = t;
  rpc_call_reply(call, &rep.base);
}

/* ---- registration ------------------------------------------------------------- */

int coord_rpc_register(coord_t *c) {
#define M(name, Req, Rep, stream, role, cb)                                                      \
  {"/fsdp.v1.Coordinator/" name, &fsdp__v1__##Req##__descriptor, &fsdp__v1__##Rep##__descriptor, \
   stream, role, cb, c}
  const rpc_method_t methods[] = {
      M("SubmitJob", submit_job_request, submit_job_reply, 0, RPC_ROLE_USER, coord_submit_cb),
      M("GetJob", get_job_request, get_job_reply, 0, RPC_ROLE_USER, coord_get_job_cb),
      M("ListJobs", list_jobs_request, list_jobs_reply, 0, RPC_ROLE_USER, coord_list_jobs_cb),
      M("CancelJob", cancel_job_request, cancel_job_reply, 0, RPC_ROLE_USER, coord_cancel_cb),
      M("ResumeJob", resume_job_request, resume_job_reply, 0, RPC_ROLE_USER, coord_resume_cb),
      M("WatchJob", watch_job_request, job_progress, 1, RPC_ROLE_USER, coord_watch_cb),
      M("GetMemoryStats", get_memory_stats_request, get_memory_stats_reply, 0, RPC_ROLE_USER,
        coord_memory_cb),
      M("ListCheckpoints", list_checkpoints_request, list_checkpoints_reply, 0, RPC_ROLE_USER,
        coord_ckpt_list_cb),
      M("ExportCheckpoint", export_checkpoint_request, export_chunk, 1, RPC_ROLE_USER,
        coord_export_cb),
      M("ListNodes", list_nodes_request, list_nodes_reply, 0, RPC_ROLE_USER, coord_nodes_cb),
      M("ListEvents", list_events_request, list_events_reply, 0, RPC_ROLE_USER, coord_events_cb),
      M("DrainNode", drain_node_request, drain_node_reply, 0, RPC_ROLE_OPERATOR, coord_drain_cb),
      M("GetLogTicket", get_log_ticket_request, get_log_ticket_reply, 0, RPC_ROLE_USER,
        coord_log_ticket_cb),
      M("RegisterNode", register_node_request, register_node_reply, 0, RPC_ROLE_NODE,
        coord_register_cb),
      M("Heartbeat", heartbeat_request, heartbeat_reply, 0, RPC_ROLE_NODE, coord_heartbeat_cb),
      M("Rendezvous", rendezvous_request, rendezvous_reply, 0, RPC_ROLE_NODE, coord_rendezvous_cb),
      M("ReportRankExit", report_rank_exit_request, report_rank_exit_reply, 0, RPC_ROLE_NODE,
        coord_rank_exit_cb),
      M("ReportCheckpointShard", report_checkpoint_shard_request, report_checkpoint_shard_reply, 0,
        RPC_ROLE_NODE, coord_ckpt_report_cb),
  };
#undef M
  return rpc_server_add_all(c->srv, methods, sizeof methods / sizeof methods[0]);
}

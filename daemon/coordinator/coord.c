/* coord: the coordinator's state machine around the store (see coord.h):
 * liveness and node death, placement of pending jobs, what each node is
 * still to be told and its delivery through the held heartbeat, failing and
 * killing attempts, and the open calls that wait on state (WatchJob streams,
 * rendezvous). The RPC handlers are coord_rpc.c.
 *
 * One timer (coord_tick_cb, every COORD_TICK_MS) does the periodic work:
 * answers rendezvous calls held past COORD_RDV_HOLD_MS, declares nodes dead
 * after the heartbeat timeout, and places pending jobs when something they
 * depend on changed (a job ended or was submitted, a node came or went, a
 * device was freed). Held heartbeats have a timer of their own
 * (coord_beat_cb), armed for the first one due, so each is answered when
 * its interval ends rather than on the tick after. */
/* uthash: an allocation that fails is reported, not fatal (coord_job_cache) */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(elt) (coord_hash_oom = 1)
static int coord_hash_oom;
#include "daemon/common/text.h"
#include "daemon/coordinator/coord_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "daemon/common/err.h"
#include "daemon/common/ini_line.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"
#include "daemon/coordinator/sched.h"
#include "daemon/job/job.h"
#include "daemon/job/shard.h"

#define COORD_TICK_MS 50
#define COORD_SLOW_PASS_MS 100 /* a placement pass this long is logged */
#define COORD_WATCH_BACKLOG 1024 /* progress messages a watcher may leave unread */
#define COORD_BEAT_SLACK_MS 250
#define COORD_JANITOR_MS 1000 /* checkpoints' timeouts and removals are looked at this often */
#define COORD_SETTLE_RETRY_MS 1000 /* an attempt's end the store failed to take, tried again */
#define COORD_FENCE_MARGIN_MS 1000 /* a fenced node's fsdpd kills its ranks within this */
/* after the fence and its margin from a restart, for the fenced ranks'
 * exit reports to come in (fsdpd retries each within a second or two) */
#define COORD_OUTAGE_SLACK_MS 5000
#define COORD_FENCE_SLACK_MS 1000  /* a heartbeat answered this late fences no healthy node */
#define COORD_PURGE_MS 10000  /* retention (events, ended jobs), this often (and at start) */
#define COORD_STALL_LOG_MS 10000 /* a stall of the loop is logged at most this often */
#define COORD_PURGE_BATCH 2000
#define COORD_PURGE_PASSES 10
#define COORD_JOB_PURGE_BATCH 50  /* ended jobs removed a transaction (each with its rows) */
#define COORD_PURGE_BUDGET_MS 50  /* a retention pass stops after this long (the loop answers heartbeats) */

int64_t coord_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t coord_mono_ms(coord_t *c) {
  uv_update_time(c->loop);
  return uv_now(c->loop);
}

void coord_id_str(char *buf, size_t len, char kind, int64_t id) {
  snprintf(buf, len, "%c-%lld", kind, (long long)id);
}

/* "j-42" -> 42; 0 for anything else (ids start at 1). */
int64_t coord_id_parse(const char *s, char kind) {
  if (!s || s[0] != kind || s[1] != '-' || s[2] < '1' || s[2] > '9') return 0;
  int64_t v = 0;
  for (const char *p = s + 2; *p; p++) {
    if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return 0;
    v = v * 10 + (*p - '0');
  }
  return v;
}

Fsdp__V1__JobState coord_job_state(store_job_state_t s) {
  switch (s) {
  case STORE_JOB_PENDING: return FSDP__V1__JOB_STATE__JOB_STATE_PENDING;
  case STORE_JOB_RUNNING: return FSDP__V1__JOB_STATE__JOB_STATE_RUNNING;
  case STORE_JOB_SUCCEEDED: return FSDP__V1__JOB_STATE__JOB_STATE_SUCCEEDED;
  case STORE_JOB_FAILED: return FSDP__V1__JOB_STATE__JOB_STATE_FAILED;
  case STORE_JOB_CANCELLED: return FSDP__V1__JOB_STATE__JOB_STATE_CANCELLED;
  }
  return FSDP__V1__JOB_STATE__JOB_STATE_UNSPECIFIED;
}

/* ---- a job's spec: INI text in the store, options on the wire ------------ */

typedef struct coord_spec_ctx {
  Fsdp__V1__JobSpec *spec;
  int cap, failed;
} coord_spec_ctx_t;

static int coord_spec_ini_cb(void *user, const char *section, const char *key, const char *value) {
  coord_spec_ctx_t *x = user;
  Fsdp__V1__JobSpec *s = x->spec;
  if ((int)s->n_options == x->cap) {
    int cap = x->cap ? 2 * x->cap : 16;
    Fsdp__V1__Option **p = realloc(s->options, (size_t)cap * sizeof *p);
    if (!p) return x->failed = 1, 0;
    s->options = p, x->cap = cap;
  }
  Fsdp__V1__Option *o = malloc(sizeof *o);
  if (!o) return x->failed = 1, 0;
  fsdp__v1__option__init(o);
  char unq[1024]; /* a line holds less (ini_line_max) */
  const char *v = ini_line_unquote(value, unq, sizeof unq);
  o->section = strdup(section), o->key = strdup(key), o->value = strdup(v ? v : value);
  s->options[s->n_options++] = o;
  if (!o->section || !o->key || !o->value) return x->failed = 1, 0;
  return 1;
}

int coord_spec_from_text(const char *text, Fsdp__V1__JobSpec *spec) {
  fsdp__v1__job_spec__init(spec);
  coord_spec_ctx_t x = {spec, 0, 0};
  int too_long;
  int line = ini_line_parse(NULL, text, coord_spec_ini_cb, &x, &too_long);
  if (line || x.failed) {
    coord_spec_free(spec);
    return x.failed ? err_set(FSDP_ENOMEM, "coordinator: out of memory reading a job's spec")
                    : err_set(FSDP_EFORMAT, "coordinator: a stored job spec does not parse "
                              "(line %d%s); the database was changed by hand?", line,
                              too_long ? ", too long" : "");
  }
  return FSDP_OK;
}

void coord_spec_free(Fsdp__V1__JobSpec *spec) {
  for (size_t i = 0; i < spec->n_options; i++) {
    Fsdp__V1__Option *o = spec->options[i];
    if (!o) continue;
    free(o->section), free(o->key), free(o->value), free(o);
  }
  free(spec->options);
  fsdp__v1__job_spec__init(spec);
}

/* ---- in-memory tables ----------------------------------------------------- */

coord_node_t *coord_node_get(coord_t *c, int64_t id, int create) {
  if (id <= 0) return NULL;
  if (id >= c->cap_node) {
    if (!create) return NULL;
    int64_t cap = c->cap_node ? c->cap_node : 64;
    while (cap <= id) cap *= 2;
    coord_node_t **p = realloc(c->node, (size_t)cap * sizeof *p);
    if (!p) return NULL;
    memset(p + c->cap_node, 0, (size_t)(cap - c->cap_node) * sizeof *p);
    c->node = p, c->cap_node = cap;
  }
  if (!c->node[id] && create) {
    coord_node_t *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->id = id;
    n->coord = c;
    coord_node_heard(c, n);
    c->node[id] = n;
  }
  return c->node[id];
}

/* The stall the loop is coming out of (ms), which the next tick adds to
 * coord_t.deaf_ms (coord_tick_cb): its tick is more than a tick late
 * (counted from the store's opening before the first). */
static uint64_t coord_stall_pending(const coord_t *c, uint64_t now) {
  return c->tick_ms && now - c->tick_ms > 2 * COORD_TICK_MS ? now - c->tick_ms - COORD_TICK_MS : 0;
}

/* 1 when n is beating: its heartbeat is held now (a node keeps one in
 * flight, and the call is cancelled when its process or connection dies),
 * or it called, or was answered, a moment ago (between an answer and its
 * next call). A node that stopped gets no new ranks while its timeout runs
 * out. */
static int coord_node_beating(const coord_node_t *n, uint64_t now) {
  const uint64_t last = n->heard_ms > n->answered_ms ? n->heard_ms : n->answered_ms;
  return n->poll || now - last <= COORD_BEAT_SLACK_MS;
}

void coord_node_heard(coord_t *c, coord_node_t *n) {
  const uint64_t now = coord_mono_ms(c);
  /* placement leaves a quiet node out (coord_pic_load): a job that waited
   * meanwhile may fit on it now (else it waited for some other change) */
  if (!coord_node_beating(n, now)) c->dirty = 1;
  n->heard_ms = now, n->heard_unix_ms = coord_unix_ms();
  /* a call read as the loop comes out of a stall came after it (or waited
   * it out): that stall is not this node's to be excused again */
  n->deaf_heard_ms = c->deaf_ms + coord_stall_pending(c, n->heard_ms);
}

/* How long n has been silent (ms): since its last call, less the time the
 * loop itself was held up meanwhile (coord_tick_cb), at most the restart
 * grace of it. A call that came then waited unread, and a held heartbeat
 * was answered late: the node cannot be blamed for the coordinator's
 * deafness; however slow the loop stays, a silent node is dead within the
 * timeout and the grace (by when its fence has stopped its ranks). */
static uint64_t coord_node_silent_ms(const coord_t *c, const coord_node_t *n, uint64_t now) {
  if (now <= n->heard_ms) return 0; /* heard in this tick (a node made as another died) */
  uint64_t deaf = c->deaf_ms > n->deaf_heard_ms ? c->deaf_ms - n->deaf_heard_ms : 0;
  if (deaf > (uint64_t)c->o.restart_grace_ms) deaf = (uint64_t)c->o.restart_grace_ms;
  const uint64_t since = now - n->heard_ms;
  return since > deaf ? since - deaf : 0;
}

coord_rank_t *coord_rank_get(coord_t *c, int64_t job, int rank, int create) {
  const int64_t key[2] = {job, rank};
  coord_rank_t *r;
  HASH_FIND(hh, c->ranks, key, sizeof key, r);
  if (r || !create) return r;
  if (!(r = calloc(1, sizeof *r))) return NULL;
  memcpy(r->key, key, sizeof key);
  r->job = job, r->rank = rank;
  coord_hash_oom = 0;
  HASH_ADD(hh, c->ranks, key, sizeof r->key, r);
  if (coord_hash_oom) return free(r), NULL;
  return r;
}

/* Keeps in the store the figures the ranks of job's attempt epoch reported
 * (job 0: of every attempt in memory), which live only here: a report
 * writes nothing (a store write per step of every rank would be the
 * coordinator's whole disk budget), so this runs where they would be lost,
 * before an attempt's end forgets them or the coordinator stops. One
 * transaction for all; a failure is logged and costs only the figures. */
void coord_ranks_keep(coord_t *c, int64_t job, int64_t epoch) {
  int n = 0;
  const coord_rank_t *r;
  for (r = c->ranks; r; r = r->hh.next)
    n += r->reported && (!job || (r->job == job && r->epoch == epoch));
  if (!n) return;
  store_figures_t *f = calloc((size_t)n, sizeof *f);
  if (!f) {
    LOG_WARN("coord", "out of memory: the last figures of %d rank(s) are not kept", n);
    return;
  }
  n = 0;
  for (r = c->ranks; r; r = r->hh.next)
    if (r->reported && (!job || (r->job == job && r->epoch == epoch)))
      f[n++] = (store_figures_t){.job_id = r->job, .epoch = r->epoch, .rank = r->rank,
                                 .step = r->step, .loss = r->loss, .tokens_per_s = r->tokens_per_s};
  if (store_rank_figures(c->st, f, n)) {
    if (job)
      LOG_WARN("coord", "job j-%lld attempt %lld: its ranks' last figures are not kept (status "
               "will show them as not reported): %s", (long long)job, (long long)epoch, err_msg());
    else
      LOG_WARN("coord", "the last figures of %d running rank(s) are not kept: %s", n, err_msg());
  }
  free(f);
}

/* Forgets the ranks' reports of a job (its attempt ended). */
void coord_ranks_forget(coord_t *c, int64_t job) {
  coord_rank_t *r, *tmp;
  HASH_ITER(hh, c->ranks, r, tmp) {
    if (r->job != job) continue;
    HASH_DEL(c->ranks, r);
    free(r);
  }
}

coord_job_t *coord_job_info(coord_t *c, int64_t id) {
  coord_job_t *hit;
  HASH_FIND(hh, c->jobs, &id, sizeof id, hit);
  if (hit) return hit;
  store_job_t j;
  if (store_job_get(c->st, id, &j)) return NULL;
  Fsdp__V1__JobSpec spec;
  int rc = coord_spec_from_text(j.spec ? j.spec : "", &spec);
  int world = j.world_size;
  store_job_free(&j);
  if (rc) return NULL;
  job_opt_t *opts = calloc(spec.n_options + 1, sizeof *opts);
  if (!opts) return coord_spec_free(&spec), NULL;
  for (size_t i = 0; i < spec.n_options; i++)
    opts[i] = (job_opt_t){spec.options[i]->section, spec.options[i]->key, spec.options[i]->value};
  config_t cfg;
  plan_t plan;
  shard_mesh_t m;
  char desc[256];
  rc = job_validate(opts, (int)spec.n_options, world, 0, &cfg, &plan);
  if (!rc) rc = plan_job(&cfg, world, &plan);
  if (!rc) rc = shard_mesh_resolve(cfg.strategy, cfg.mesh, world, &m, desc, sizeof desc);
  free(opts);
  coord_spec_free(&spec);
  if (rc) return NULL;
  coord_job_t x;
  coord_job_facts(&x, &cfg, &plan, &m);
  x.id = id;
  return coord_job_cache(c, &x);
}

void coord_job_facts(coord_job_t *x, const config_t *cfg, const plan_t *plan, const shard_mesh_t *m) {
  memset(x, 0, sizeof *x);
  x->R = m->replicas, x->S = m->shards, x->steps = cfg->steps;
  x->mesh = *m;
  snprintf(x->kind, sizeof x->kind, "%s", cfg->device);
  snprintf(x->ckpt_dir, sizeof x->ckpt_dir, "%s", cfg->checkpoint_dir);
  x->keep = cfg->keep_checkpoints;
  x->need = plan->device; /* what its device must hold */
  for (int k = 0; k < COORD_CATS; k++) x->planned[k] = plan->bytes[k];
}

coord_job_t *coord_job_cache(coord_t *c, const coord_job_t *x) {
  coord_job_t *e = malloc(sizeof *e);
  if (!e) return NULL;
  *e = *x;
  coord_hash_oom = 0;
  HASH_ADD(hh, c->jobs, id, sizeof e->id, e);
  if (coord_hash_oom) { /* not added: uthash could not grow its table */
    free(e);
    return NULL;
  }
  return e;
}

/* ---- telling nodes -------------------------------------------------------- */

/* Appends o to a node's array of orders; FSDP_ENOMEM when it cannot grow. */
static int coord_orders_add(coord_order_t **v, int *n, int *cap, const coord_order_t *o) {
  if (*n == *cap) {
    int grown = *cap ? 2 * *cap : 8;
    coord_order_t *p = realloc(*v, (size_t)grown * sizeof *p);
    if (!p) return FSDP_ENOMEM;
    *v = p, *cap = grown;
  }
  (*v)[(*n)++] = *o;
  return FSDP_OK;
}

/* A node's queue holds at most COORD_NODE_ORDERS_MAX of its devices: more
 * is a node that takes no orders (one registering again and again without a
 * heartbeat, each registration a kill per rank it lists grew the
 * coordinator from 265 MB to 971 MB; found by an outside tester). Past the
 * bound the queue is emptied and the node is told to register again
 * (coord_node_t.resync), and nothing more is queued for it until it does.
 * That is safe: a registration tells it again all a queue can hold (a kill
 * of every rank it lists that no running attempt has, every assignment the
 * store has there), and the holds of the kills dropped stay, so their jobs'
 * next attempts wait until the node shows those ranks gone, or its fence
 * has stopped them. */
void coord_order_push(coord_t *c, int64_t node, const coord_order_t *o) {
  coord_node_t *n = coord_node_get(c, node, 1);
  if (!n || n->resync) return;
  if ((size_t)n->n_order >= COORD_NODE_ORDERS_MAX(n->ndev)) {
    LOG_WARN("coord", "node n-%lld has %d orders queued, the most for its %d devices, and has "
             "taken none: they are dropped, and it is told to register again", (long long)node,
             n->n_order, n->ndev);
    free(n->order);
    n->order = NULL, n->n_order = n->cap_order = 0, n->resync = 1;
    return;
  }
  if (coord_orders_add(&n->order, &n->n_order, &n->cap_order, o)) {
    LOG_WARN("coord", "out of memory queueing an order for node n-%lld", (long long)node);
    return;
  }
  coord_node_deliver(c, n);
}

void coord_node_confirm(coord_t *c, coord_node_t *n, Fsdp__V1__RankStatus *const *ranks, size_t nr) {
  if (!n->n_sent) return;
  const uint64_t now = coord_mono_ms(c), wait = 2 * (uint64_t)c->o.heartbeat_interval_ms;
  /* pushing an order may answer the node's held heartbeat, which adds to
   * n->sent: the ones to send again are taken out first */
  coord_order_t *again = malloc((size_t)n->n_sent * sizeof *again);
  int kept = 0, nagain = 0;
  for (int i = 0; i < n->n_sent; i++) {
    coord_order_t *o = &n->sent[i];
    int seen = 0;
    for (size_t k = 0; k < nr && !seen; k++)
      seen = ranks[k]->attempt == (uint64_t)o->epoch && ranks[k]->rank == (uint32_t)o->rank &&
             coord_id_parse(ranks[k]->job_id, 'j') == o->job;
    if (seen) continue;
    if ((++o->unseen < COORD_ASSIGN_UNSEEN || now - o->sent_ms < wait) || !again) n->sent[kept++] = *o;
    else again[nagain++] = *o;
  }
  n->n_sent = kept;
  for (int i = 0; i < nagain; i++) {
    coord_order_t *o = &again[i];
    store_job_t j;
    int live = !store_job_get(c->st, o->job, &j);
    if (live) live = j.state == STORE_JOB_RUNNING && j.epoch == o->epoch, store_job_free(&j);
    if (!live) continue;
    LOG_WARN("coord", "node n-%lld has not listed rank %d of job j-%lld attempt %lld in %d "
             "heartbeats since it was assigned: sending the assignment again", (long long)n->id,
             o->rank, (long long)o->job, (long long)o->epoch, o->unseen);
    o->unseen = 0;
    coord_order_push(c, n->id, o);
  }
  free(again);
}

/* ---- the held heartbeats' heap ---- */

static int coord_held_less(const coord_node_t *a, const coord_node_t *b) {
  return a->poll_until != b->poll_until ? a->poll_until < b->poll_until : a->held_seq < b->held_seq;
}

static void coord_held_put(coord_t *c, int i, coord_node_t *n) {
  c->held[i] = n;
  n->held_pos = i + 1;
}

static void coord_held_up(coord_t *c, int i) {
  coord_node_t *n = c->held[i];
  while (i > 0 && coord_held_less(n, c->held[(i - 1) / 2])) {
    coord_held_put(c, i, c->held[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  coord_held_put(c, i, n);
}

static void coord_held_down(coord_t *c, int i) {
  coord_node_t *n = c->held[i];
  for (;;) {
    int m = 2 * i + 1;
    if (m >= c->n_held) break;
    if (m + 1 < c->n_held && coord_held_less(c->held[m + 1], c->held[m])) m++;
    if (!coord_held_less(c->held[m], n)) break;
    coord_held_put(c, i, c->held[m]);
    i = m;
  }
  coord_held_put(c, i, n);
}

/* Adds n (its poll_until set); FSDP_ENOMEM when the heap cannot grow. */
static int coord_held_push(coord_t *c, coord_node_t *n) {
  if (c->n_held == c->cap_held) {
    const int cap = c->cap_held ? 2 * c->cap_held : 1024;
    coord_node_t **p = realloc(c->held, (size_t)cap * sizeof *p);
    if (!p) return err_set(FSDP_ENOMEM, "coordinator: out of memory holding a heartbeat");
    c->held = p, c->cap_held = cap;
  }
  n->held_seq = ++c->held_seq;
  coord_held_put(c, c->n_held++, n);
  coord_held_up(c, c->n_held - 1);
  return FSDP_OK;
}

/* Takes n out of the held heartbeats (its poll is being answered or ended). */
static void coord_held_unlink(coord_t *c, coord_node_t *n) {
  const int i = n->held_pos - 1;
  if (i < 0) return;
  n->held_pos = 0;
  coord_node_t *last = c->held[--c->n_held];
  if (i == c->n_held) return;
  coord_held_put(c, i, last);
  coord_held_down(c, i);
  coord_held_up(c, last->held_pos - 1);
}

static void coord_poll_cancel_cb(rpc_call_t *call, void *arg) {
  coord_node_t *n = arg;
  if (n->poll != call) return;
  n->poll = NULL;
  coord_held_unlink(n->coord, n);
}

void coord_node_drop_poll(coord_t *c, coord_node_t *n, const char *why) {
  rpc_call_t *call = n->poll;
  if (!call) return;
  n->poll = NULL;
  coord_held_unlink(c, n);
  rpc_call_on_cancel(call, NULL, NULL);
  rpc_call_finish(call, err_set(FSDP_ESTALE, "%s", why));
}

/* Answers n's held heartbeat with whatever is queued for it (possibly
 * nothing: the interval passed), and empties the queue. */
static void coord_node_answer(coord_t *c, coord_node_t *n) {
  rpc_call_t *call = n->poll;
  n->poll = NULL;
  n->answered_ms = coord_mono_ms(c);
  coord_held_unlink(c, n);
  rpc_call_on_cancel(call, NULL, NULL);
  Fsdp__V1__HeartbeatReply rep = FSDP__V1__HEARTBEAT_REPLY__INIT;
  rep.heartbeat_interval_ms = (uint32_t)c->o.heartbeat_interval_ms;
  int na = 0, nk = 0;
  for (int i = 0; i < n->n_order; i++) n->order[i].kill ? nk++ : na++;
  Fsdp__V1__RankAssignment *as = calloc((size_t)na + 1, sizeof *as);
  Fsdp__V1__RankAssignment **ap = calloc((size_t)na + 1, sizeof *ap);
  Fsdp__V1__JobSpec *specs = calloc((size_t)na + 1, sizeof *specs);
  Fsdp__V1__Kill *ks = calloc((size_t)nk + 1, sizeof *ks);
  Fsdp__V1__Kill **kp = calloc((size_t)nk + 1, sizeof *kp);
  char (*ids)[32] = calloc((size_t)n->n_order + 1, sizeof *ids);
  uint8_t (*secrets)[RING_SECRET_BYTES] = calloc((size_t)na + 1, sizeof *secrets);
  /* the plan's tunables as this coordinator planned with them: the same for
   * every assignment; those a node of an older build may not know only
   * where they are not at their defaults (param.h) */
  char plan_env[PARAM_PLAN_ENV_N][PARAM_PLAN_ENV_LEN], *plan_envp[PARAM_PLAN_ENV_N];
  size_t n_plan_env = 0;
  for (int k = 0; k < PARAM_PLAN_ENV_N; k++)
    if (param_plan_env_sent(k)) {
      param_plan_env(k, plan_env[n_plan_env]);
      plan_envp[n_plan_env] = plan_env[n_plan_env];
      n_plan_env++;
    }
  uint32_t *kranks = calloc((size_t)nk + 1, sizeof *kranks);
  if (!as || !ap || !specs || !ks || !kp || !ids || !kranks || !secrets) {
    rpc_call_finish(call, err_set(FSDP_ENOMEM, "coordinator: out of memory answering a heartbeat"));
    goto out; /* the orders stay queued for the next heartbeat */
  }
  for (int i = 0; i < n->n_order; i++) {
    const coord_order_t *o = &n->order[i];
    coord_id_str(ids[i], sizeof ids[i], 'j', o->job);
    if (o->kill) {
      Fsdp__V1__Kill *k = &ks[rep.n_kills];
      fsdp__v1__kill__init(k);
      k->job_id = ids[i], k->attempt = (uint32_t)o->epoch, k->grace_ms = (uint32_t)o->grace_ms;
      k->reason = (char *)o->reason;
      if (o->rank >= 0) kranks[rep.n_kills] = (uint32_t)o->rank, k->ranks = &kranks[rep.n_kills],
                        k->n_ranks = 1;
      kp[rep.n_kills++] = k;
      continue;
    }
    store_job_t j;
    if (store_job_get(c->st, o->job, &j)) continue; /* gone: nothing to start */
    Fsdp__V1__JobSpec *sp = &specs[rep.n_assignments];
    int rc = coord_spec_from_text(j.spec ? j.spec : "", sp);
    if (!rc) {
      sp->name = strdup(j.name);
      sp->world_size = (uint32_t)j.world_size;
      sp->max_restarts = (uint32_t)j.max_restarts;
    }
    store_job_free(&j);
    if (rc) {
      LOG_WARN("coord", "job j-%lld: %s", (long long)o->job, err_msg());
      continue;
    }
    Fsdp__V1__RankAssignment *a = &as[rep.n_assignments];
    fsdp__v1__rank_assignment__init(a);
    a->job_id = ids[i], a->attempt = (uint32_t)o->epoch, a->rank = (uint32_t)o->rank;
    a->world_size = (uint32_t)o->world, a->device = (uint32_t)o->device;
    a->shard_group = (uint32_t)o->shard_group, a->replica_group = (uint32_t)o->replica_group;
    a->spec = sp;
    /* the attempt's ring secret; none for one started before there were.
     * One the store cannot read now is not sent without it (its ranks would
     * not agree): the assignment goes with a later heartbeat (the orders
     * sent are followed up: coord_node_confirm) */
    const int src = store_attempt_secret(c->st, o->job, o->epoch, secrets[rep.n_assignments]);
    if (src && src != FSDP_ENOTFOUND) {
      LOG_WARN("coord", "job j-%lld rank %d: its attempt's ring secret: %s; assigned later",
               (long long)o->job, o->rank, err_msg());
      /* the name first: coord_spec_free sets it to protobuf-c's static "",
       * which freed after it killed the coordinator */
      free(sp->name), coord_spec_free(sp);
      continue;
    }
    if (!src) a->ring_secret = (ProtobufCBinaryData){RING_SECRET_BYTES, secrets[rep.n_assignments]};
    a->n_plan_env = n_plan_env, a->plan_env = plan_envp;
    ap[rep.n_assignments++] = a;
  }
  rep.assignments = ap, rep.kills = kp;
  rpc_call_reply(call, &rep.base);
  /* assignments wait in n->sent until the node's heartbeats list them */
  for (int i = 0; i < n->n_order; i++) {
    coord_order_t o = n->order[i];
    o.sent_ms = coord_mono_ms(c), o.unseen = 0;
    if (!o.kill && coord_orders_add(&n->sent, &n->n_sent, &n->cap_sent, &o))
      LOG_WARN("coord", "out of memory: node n-%lld's assignment of job j-%lld rank %d is not "
               "followed up", (long long)n->id, (long long)o.job, o.rank);
  }
  n->n_order = 0;
  for (size_t i = 0; i < rep.n_assignments; i++) free(specs[i].name), coord_spec_free(&specs[i]);
out:
  if (secrets) explicit_bzero(secrets, ((size_t)na + 1) * sizeof *secrets);
  free(as), free(ap), free(specs), free(ks), free(kp), free(ids), free(kranks), free(secrets);
}

void coord_node_deliver(coord_t *c, coord_node_t *n) {
  if (n->poll && n->n_order) coord_node_answer(c, n);
}

/* Answers every held heartbeat whose slot has come, then sleeps until the
 * next one's. A node answered at its slot has its next slot one interval
 * after this one, not after the answer: late answers (a busy loop) do not
 * move the node's phase, so nodes that one stall made late do not beat
 * together from then on. */
static void coord_beat_cb(uv_timer_t *t) {
  coord_t *c = t->data;
  const uint64_t now = coord_mono_ms(c);
  while (c->n_held && c->held[0]->poll_until <= now) {
    coord_node_t *n = c->held[0];
    metrics_hist_observe(&c->hb_late, (double)(now - n->poll_until) / 1e3);
    n->slot = n->poll_until + (uint64_t)c->o.heartbeat_interval_ms;
    coord_node_answer(c, n);
  }
  if (c->n_held) uv_timer_start(&c->beat, coord_beat_cb, c->held[0]->poll_until - now, 0);
}

/* Holds a node's heartbeat until there is news or its slot comes: the one
 * its last answer at a slot set (moved on by whole intervals when the node
 * comes later than that: a stall longer than an interval keeps phases too),
 * or one interval from now for its first heartbeat. A heartbeat answered
 * early, with news, leaves the slot where it was. */
void coord_node_hold(coord_t *c, coord_node_t *n, rpc_call_t *call) {
  if (n->poll) coord_node_answer(c, n); /* a node has one in flight; answer an older one */
  const uint64_t now = coord_mono_ms(c), iv = (uint64_t)c->o.heartbeat_interval_ms;
  if (!n->slot || n->slot > now + iv) n->slot = now + iv;
  else if (n->slot <= now) n->slot += ((now - n->slot) / iv + 1) * iv;
  n->poll_until = n->slot;
  int rc = coord_held_push(c, n);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  n->poll = call;
  if (c->held[0] == n) /* a new first: the timer sleeps until its slot */
    uv_timer_start(&c->beat, coord_beat_cb, n->poll_until - now, 0);
  rpc_call_on_cancel(call, coord_poll_cancel_cb, n);
  coord_node_deliver(c, n);
}

/* ---- attempts ------------------------------------------------------------- */

void coord_hold_add(coord_t *c, int64_t job, int64_t epoch, int64_t node) {
  const int64_t key[3] = {job, epoch, node};
  coord_hold_t *h;
  HASH_FIND(hh, c->holds, key, sizeof key, h);
  if (h) return;
  if ((h = calloc(1, sizeof *h))) {
    memcpy(h->key, key, sizeof key);
    coord_hash_oom = 0;
    HASH_ADD(hh, c->holds, key, sizeof h->key, h);
    if (!coord_hash_oom) return;
    free(h); /* not added: uthash could not grow its table */
  }
  /* the job waits the node's whole fence instead */
  coord_job_t *x = coord_job_info(c, job);
  coord_node_t *n = coord_node_get(c, node, 0);
  const uint64_t until = coord_mono_ms(c) + coord_fence_ms(c);
  if (x && n && until > x->fence_until) x->fence_until = until, x->fence_node = node;
}

void coord_hold_confirm(coord_t *c, const coord_node_t *n, Fsdp__V1__RankStatus *const *ranks,
                        size_t nr) {
  coord_hold_t *h, *tmp;
  int freed = 0;
  HASH_ITER(hh, c->holds, h, tmp) {
    if (h->key[2] != n->id) continue;
    int alive = 0;
    for (size_t k = 0; k < nr && !alive; k++)
      alive = ranks[k]->attempt == (uint64_t)h->key[1] &&
              ranks[k]->state != FSDP__V1__RANK_STATE__RANK_STATE_EXITED &&
              coord_id_parse(ranks[k]->job_id, 'j') == h->key[0];
    if (alive) continue;
    HASH_DEL(c->holds, h);
    free(h);
    freed = 1;
  }
  if (freed) c->dirty = 1; /* a job may wait for it */
}

/* When job's next attempt may start as far as its holds go (loop time; 0:
 * now): the latest fence of a node it waits on, each counted from the
 * node's last call (a node that still answers is renewing its ranks'
 * leases); *node: that node. Holds past their fence go. */
static uint64_t coord_hold_until(coord_t *c, int64_t job, uint64_t now, int64_t *node) {
  uint64_t until = 0;
  coord_hold_t *h, *tmp;
  HASH_ITER(hh, c->holds, h, tmp) {
    const coord_node_t *n = coord_node_get(c, h->key[2], 0);
    const uint64_t end = n ? n->heard_ms + coord_fence_ms(c) : 0;
    if (end <= now) { /* fenced by now: gone */
      HASH_DEL(c->holds, h);
      free(h);
      continue;
    }
    if (h->key[0] == job && end > until) until = end, *node = h->key[2];
  }
  return until;
}

static int coord_rank_node_cmp(const void *a, const void *b) {
  const int64_t x = ((const store_rank_t *)a)->node_id, y = ((const store_rank_t *)b)->node_id;
  return (x > y) - (x < y);
}

void coord_kill_attempt(coord_t *c, int64_t job, int64_t epoch, int64_t except_node,
                        const char *why) {
  coord_kill_attempt_grace(c, job, epoch, except_node, why, 1);
}

void coord_kill_attempt_grace(coord_t *c, int64_t job, int64_t epoch, int64_t except_node,
                              const char *why, int grace_ms) {
  store_rank_t *r = NULL;
  int n = 0;
  if (store_ranks_of_job(c->st, job, epoch, &r, &n)) {
    LOG_WARN("coord", "job j-%lld: cannot list its ranks to stop them: %s", (long long)job,
             err_msg());
    return;
  }
  qsort(r, (size_t)n, sizeof *r, coord_rank_node_cmp); /* each node once, in one pass */
  for (int i = 0; i < n; i++) {
    if (i && r[i - 1].node_id == r[i].node_id) continue;
    /* until the node shows them gone, the next attempt waits (a node cut
     * off now would run them until its fence) */
    coord_hold_add(c, job, epoch, r[i].node_id);
    if (r[i].node_id == except_node) continue;
    /* no grace (1 ms: 0 is the node's default) unless a stop asks for one:
     * an attempt over in the store already would refuse a checkpoint its
     * ranks wrote on SIGTERM, a full write wasted and its directory left
     * behind */
    coord_order_t o = {.kill = 1, .job = job, .epoch = epoch, .rank = -1, .grace_ms = grace_ms};
    snprintf(o.reason, sizeof o.reason, "%s", why);
    coord_order_push(c, r[i].node_id, &o);
  }
  store_array_free(r);
}

/* Ends a running attempt as failed: its other ranks are killed, the job
 * restarts or fails by its policy (store_attempt_end). */
/* rc, the store's answer to ending a job's attempt (doing what): ESTALE (it
 * had ended already) is none; another failure is logged and left to the
 * tick (c->unsettled). */
static int coord_attempt_stored(coord_t *c, int rc, int64_t job, const char *doing) {
  if (rc == FSDP_ESTALE || !rc) return 0;
  LOG_WARN("coord", "job j-%lld: %s: %s (tried again in %d ms)", (long long)job, doing, err_msg(),
           COORD_SETTLE_RETRY_MS);
  c->unsettled = 1;
  return rc;
}

/* x's attempt failed (laid to node, 0: none known) and it restarts: the
 * next placements avoid node while others will do; a failure soon after the attempt
 * started (a link or a node failing again) counts toward the wait before
 * the next start, 0 for the first, then the backoff, doubling, at most
 * COORD_BACKOFF_MAX_MS; else restarts burn in seconds, each placed on the
 * same nodes, and a failure a minute of patience would outlast fails the
 * job. */
static void coord_backoff(coord_t *c, coord_job_t *x, int64_t node) {
  const uint64_t now = coord_mono_ms(c);
  if (!x->started_ms || now - x->started_ms >= COORD_BACKOFF_RESET_MS) x->fails = 0, x->n_avoid = 0;
  x->fails++;
  int k = 0; /* node goes last, once */
  for (int i = 0; i < x->n_avoid; i++)
    if (x->avoid[i] != node) x->avoid[k++] = x->avoid[i];
  x->n_avoid = k;
  if (node && x->n_avoid == COORD_AVOID_MAX)
    memmove(x->avoid, x->avoid + 1, --x->n_avoid * sizeof *x->avoid);
  if (node) x->avoid[x->n_avoid++] = node;
  x->backoff_until = 0;
  if (c->o.restart_backoff_ms <= 0 || x->fails < 2) return;
  uint64_t wait = (uint64_t)c->o.restart_backoff_ms;
  for (int k = 2; k < x->fails && wait < COORD_BACKOFF_MAX_MS; k++) wait *= 2;
  if (wait > COORD_BACKOFF_MAX_MS) wait = COORD_BACKOFF_MAX_MS;
  x->backoff_until = now + wait;
}

int coord_attempt_fail(coord_t *c, int64_t job, int64_t epoch, int64_t except_node, int64_t node,
                       const char *why) {
  coord_kill_attempt(c, job, epoch, except_node, why);
  coord_ranks_keep(c, job, epoch); /* forgotten below */
  store_job_state_t state;
  int rc = store_attempt_end(c->st, job, epoch, 0, why, &state);
  const int failed = coord_attempt_stored(c, rc, job, "ending its attempt");
  /* the first failure of an attempt is its story; a second (ESTALE: already
   * ended, e.g. a registration missing several of its ranks) changes nothing */
  coord_job_t *x = rc ? NULL : coord_job_info(c, job);
  if (x) x->preempted = 0, snprintf(x->failure, sizeof x->failure, "%s", why);
  if (x && state == STORE_JOB_PENDING) coord_backoff(c, x, node);
  if (!rc) {
    c->ended[state == STORE_JOB_CANCELLED ? COORD_ENDED_CANCELLED : COORD_ENDED_FAILED]++; /* a stop's */
    LOG_INFO("coord", "job j-%lld attempt %lld failed (%s): now %s", (long long)job,
             (long long)epoch, why, store_job_state_name(state));
  }
  coord_ranks_forget(c, job);
  c->dirty = 1;
  coord_job_changed(c, job);
  return failed;
}

/* A failure (why, laid to node) of an attempt that ran through the
 * coordinator's outage, before coord_t.outage_until: held, not settled (1).
 * Its nodes may have fenced its ranks while the coordinator was down, and a
 * rank whose ring peer was fenced fails on its own, its report racing the
 * fenced one's: the failure is the outage's, not the job's. The tick
 * settles it (coord_outage_tick) when a fenced rank of it is reported
 * (then a requeue), when no rank of it is left running, or at
 * outage_until (then the failure it is). */
static int coord_outage_hold(coord_t *c, int64_t job, int64_t epoch, int64_t node, const char *why) {
  coord_job_t *x = coord_job_info(c, job);
  if (!x || x->outage_epoch != epoch || coord_mono_ms(c) >= c->outage_until) return 0;
  if (!x->held) {
    x->held = 1, x->held_node = node, c->n_outage_held++;
    snprintf(x->held_why, sizeof x->held_why, "%s", why);
    LOG_INFO("coord", "job j-%lld attempt %lld: %s; it ran through the coordinator's outage, so "
             "its end waits (at most %.1f s) for its other ranks: one its node fenced meanwhile "
             "makes it a requeue", (long long)job, (long long)epoch, why,
             (double)(c->outage_until - coord_mono_ms(c)) / 1000);
  }
  return 1;
}

/* Ends an attempt as its ranks' verdict says (store_rank_exit's, or
 * store_attempt_verdict's at start): why is the failure for FAILED, what the
 * preemption for PREEMPTED and the fence for FENCED; GOING and ENDED leave
 * it. */
int coord_attempt_settle(coord_t *c, int64_t job, int64_t epoch, store_attempt_verdict_t v,
                         int64_t node, const char *why, const char *what) {
  int rc = 0;
  if (v == STORE_ATTEMPT_FAILED && coord_outage_hold(c, job, epoch, node, why)) return 0;
  coord_job_t *h = v != STORE_ATTEMPT_GOING ? coord_job_info(c, job) : NULL;
  if (h && h->outage_epoch == epoch && h->held) h->held = 0, c->n_outage_held--;
  if (v == STORE_ATTEMPT_SUCCEEDED || v == STORE_ATTEMPT_PREEMPTED || v == STORE_ATTEMPT_FENCED)
    coord_ranks_keep(c, job, epoch); /* what a restart would lose, or the requeue forgets */
  if (v == STORE_ATTEMPT_SUCCEEDED) {
    store_job_state_t state;
    rc = store_attempt_end(c->st, job, epoch, 1, "", &state);
    if (!(rc = coord_attempt_stored(c, rc, job, "ending its attempt"))) {
      c->ended[COORD_ENDED_SUCCEEDED]++;
      LOG_INFO("coord", "job j-%lld attempt %lld succeeded", (long long)job, (long long)epoch);
    }
    c->dirty = 1;
    coord_job_changed(c, job);
  } else if (v == STORE_ATTEMPT_FAILED) {
    rc = coord_attempt_fail(c, job, epoch, 0, node, why);
  } else if (v == STORE_ATTEMPT_PREEMPTED || v == STORE_ATTEMPT_FENCED) {
    /* fenced: the others may run on (their node answered in time), and
     * cannot go on without the fenced rank */
    if (v == STORE_ATTEMPT_FENCED) coord_kill_attempt(c, job, epoch, 0, what);
    rc = store_attempt_requeue(c->st, job, epoch, what);
    coord_job_t *x = coord_job_info(c, job);
    const int stop = x && x->stop_until; /* cancel --checkpoint: the store cancelled it */
    if (!(rc = coord_attempt_stored(c, rc, job, "requeueing"))) {
      c->ended[stop ? COORD_ENDED_CANCELLED : COORD_ENDED_PREEMPTED]++;
      LOG_INFO("coord", "job j-%lld attempt %lld %s", (long long)job, (long long)epoch,
               stop ? "stopped as asked: cancelled" : v == STORE_ATTEMPT_FENCED
               ? "fenced: requeued, no restart spent" : "preempted: requeued, no restart spent");
    }
    if (x) x->preempted = 1, snprintf(x->failure, sizeof x->failure, "%s", what);
    coord_ranks_forget(c, job);
    c->dirty = 1;
    coord_job_changed(c, job);
  }
  return rc;
}

/* At start: a running job whose ranks had all exited, or one of which had
 * failed, when the previous coordinator stopped between the rank's exit and
 * the attempt's end (two transactions; the exit report was answered first,
 * so no node tells it again) is ended now. Left, it would run forever: no
 * rank of it is left to report, and a node's registration reconciles only
 * live ranks. */
static void coord_attempts_settle(coord_t *c, const char *when) {
  int64_t *jobs = NULL;
  int nj = 0;
  if (store_job_ids(c->st, STORE_JOB_RUNNING, &jobs, &nj)) {
    LOG_WARN("coord", "running jobs, to settle those whose ranks are done: %s", err_msg());
    c->unsettled = 1;
    return;
  }
  for (int i = 0; i < nj; i++) {
    int64_t epoch = 0;
    store_attempt_verdict_t v;
    if (store_attempt_verdict(c->st, jobs[i], &epoch, &v)) {
      LOG_WARN("coord", "job j-%lld, to settle it: %s", (long long)jobs[i], err_msg());
      c->unsettled = 1;
      continue;
    }
    if (v == STORE_ATTEMPT_GOING || v == STORE_ATTEMPT_ENDED) continue;
    char why[512] = "", what[160];
    store_rank_t *r = NULL;
    int n = 0;
    int64_t node = 0;
    if (v == STORE_ATTEMPT_FAILED && !store_ranks_of_job(c->st, jobs[i], epoch, &r, &n))
      for (int k = 0; k < n && !why[0]; k++) {
        if (r[k].state == STORE_RANK_LOST || r[k].state == STORE_RANK_FAILED) node = r[k].node_id;
        if (r[k].state == STORE_RANK_LOST)
          snprintf(why, sizeof why, "rank %d on node n-%lld was lost %s", r[k].rank,
                   (long long)r[k].node_id, when);
        else if (r[k].state == STORE_RANK_FAILED)
          snprintf(why, sizeof why, "rank %d on node n-%lld exited with status %d %s", r[k].rank,
                   (long long)r[k].node_id, r[k].exit_status, when);
      }
    store_array_free(r);
    if (!why[0]) snprintf(why, sizeof why, "a rank failed %s", when);
    if (v == STORE_ATTEMPT_FENCED)
      snprintf(what, sizeof what, "a rank was stopped by its node's fence (the coordinator silent "
               "past the fence it gave the node; no restart spent) %s", when);
    else
      snprintf(what, sizeof what, "its ranks were stopped (preempted) %s", when);
    LOG_INFO("coord", "job j-%lld: its attempt %lld was over %s: ending it", (long long)jobs[i],
             (long long)epoch, when);
    coord_attempt_settle(c, jobs[i], epoch, v, node, why, what);
  }
  free(jobs);
}

/* ---- liveness ------------------------------------------------------------- */

/* The fence a node was given, and COORD_FENCE_MARGIN_MS for its fsdpd to
 * kill its ranks. */
uint64_t coord_fence_ms(const coord_t *c) {
  return (uint64_t)c->o.restart_grace_ms + COORD_FENCE_MARGIN_MS;
}

/* At start: every job that ran before and may run again waits out a fence
 * from now (coord_job_t.fence_until, fence_node 0): the pending ones, and
 * the failed or cancelled ones whose attempt ended within two fences of now,
 * which a user may resume (the old coordinator's holds on them, in memory,
 * are gone, and a node cut off when the attempt ended may still run its
 * ranks until its fence). */
static void coord_fence_pending(coord_t *c) {
  static const store_job_state_t states[] = {STORE_JOB_PENDING, STORE_JOB_FAILED, STORE_JOB_CANCELLED};
  const int64_t now_unix = coord_unix_ms(), fence = (int64_t)coord_fence_ms(c);
  for (size_t s = 0; s < sizeof states / sizeof *states; s++) {
    int64_t *jobs = NULL;
    int nj = 0;
    if (store_job_ids(c->st, states[s], &jobs, &nj)) {
      LOG_WARN("coord", "%s jobs, to hold their restarts for the nodes' fence: %s",
               store_job_state_name(states[s]), err_msg());
      continue; /* a start without it: no worse than before the fence was known */
    }
    for (int i = 0; i < nj; i++) {
      store_job_t j;
      if (store_job_get(c->st, jobs[i], &j)) continue;
      const int held = j.epoch > 0 && (states[s] == STORE_JOB_PENDING || j.ended_ms > now_unix - 2 * fence);
      store_job_free(&j);
      coord_job_t *x = held ? coord_job_info(c, jobs[i]) : NULL;
      if (x) x->fence_until = c->started_ms + coord_fence_ms(c), x->fence_node = 0;
    }
    store_array_free(jobs);
  }
}

/* At start, once the attempts over before it are settled: those running
 * now ran through the outage (coord_outage_hold). */
static void coord_outage_mark(coord_t *c) {
  int64_t *jobs = NULL;
  int nj = 0;
  c->outage_until = c->started_ms + coord_fence_ms(c) + COORD_OUTAGE_SLACK_MS;
  if (store_job_ids(c->st, STORE_JOB_RUNNING, &jobs, &nj)) {
    LOG_WARN("coord", "running jobs, to hold their failures for the nodes' fence: %s", err_msg());
    return; /* their failures count as before the hold was known */
  }
  for (int i = 0; i < nj; i++) {
    store_job_t j;
    if (store_job_get(c->st, jobs[i], &j)) continue;
    coord_job_t *x = coord_job_info(c, jobs[i]);
    if (x) x->outage_epoch = j.epoch;
    store_job_free(&j);
    /* a stop asked before the restart (cancel --checkpoint) runs on to its
     * time: its ranks are told again as their nodes register */
    int64_t asked = 0, until = 0;
    if (x && !store_job_stopping(c->st, jobs[i], &asked, &until, NULL, 0) && asked) {
      /* at least the nodes' time to register again and report the stop's
       * exits, lest the first tick cancel a stop that ended meanwhile */
      const int64_t left = until - coord_unix_ms(), grace = c->o.restart_grace_ms;
      coord_stop_set(c, x, c->started_ms + (uint64_t)(left > grace ? left : grace));
    }
  }
  store_array_free(jobs);
}

void coord_stop_set(coord_t *c, coord_job_t *x, uint64_t until) {
  if (!x->stop_until) c->n_stopping++;
  x->stop_until = until ? until : 1;
}

void coord_stop_resend(coord_t *c, int64_t node, int64_t job, int64_t epoch, int rank) {
  const coord_job_t *x = coord_job_info(c, job);
  const uint64_t now = coord_mono_ms(c);
  if (!x || !x->stop_until || x->stop_until <= now + COORD_STOP_MARGIN_MS) return;
  coord_order_t o = {.kill = 1, .job = job, .epoch = epoch, .rank = rank,
                     .grace_ms = (int)(x->stop_until - COORD_STOP_MARGIN_MS - now)};
  snprintf(o.reason, sizeof o.reason, "cancelled with --checkpoint: checkpoint at the next step "
           "boundary and stop");
  coord_order_push(c, node, &o);
}

/* On the tick, while a stop is asked (cancel --checkpoint): a job whose
 * ranks have not all ended by its stop_until is CANCELLED now, what is left
 * of it killed, saying no checkpoint was written as it stopped; one ended
 * meanwhile (its ranks' exits, a plain cancel) is let go. */
static void coord_stop_tick(coord_t *c, uint64_t now) {
  for (coord_job_t *x = c->jobs, *next; x && c->n_stopping; x = next) {
    next = x->hh.next;
    if (!x->stop_until) continue;
    store_job_t j;
    if (store_job_get(c->st, x->id, &j)) continue; /* the next tick */
    const int running = j.state == STORE_JOB_RUNNING;
    const int64_t epoch = j.epoch;
    store_job_free(&j);
    if (running && now < x->stop_until) continue;
    x->stop_until = 0, c->n_stopping--;
    if (!running) continue;
    int64_t asked = 0, until = 0;
    char why[STORE_REASON_MAX] = "cancelled", how[128];
    store_job_stopping(c->st, x->id, &asked, &until, NULL, 0);
    snprintf(how, sizeof how, "its ranks did not stop within the grace of %.0f s: killed",
             asked && until > asked ? (double)(until - asked - COORD_STOP_MARGIN_MS) / 1000 : 0.0);
    /* as a stop's end says it: the step its checkpoint kept (committed
     * before a rank failed to exit in time), else the latest */
    store_job_stop_reason(c->st, x->id, epoch, how, why, sizeof why);
    coord_ranks_keep(c, x->id, epoch);
    store_job_state_t was;
    if (store_job_cancel(c->st, x->id, why, &was)) {
      LOG_WARN("coord", "job j-%lld: cancelling it past its stop's grace: %s", (long long)x->id,
               err_msg());
      coord_stop_set(c, x, now + COORD_SETTLE_RETRY_MS);
      continue;
    }
    LOG_WARN("coord", "job j-%lld %s", (long long)x->id, why);
    coord_kill_attempt(c, x->id, epoch, 0, why);
    c->ended[COORD_ENDED_CANCELLED]++;
    coord_ranks_forget(c, x->id);
    c->dirty = 1;
    coord_job_changed(c, x->id);
  }
}

/* On the tick, while a failure is held (coord_outage_hold): each held
 * attempt is settled once a fenced rank of it is reported (FENCED: a
 * requeue; its exit report settles it first, this is for a store that
 * refused then), once none of its ranks runs, or at coord_t.outage_until
 * (the failure held). */
static void coord_outage_tick(coord_t *c, uint64_t now) {
  for (coord_job_t *x = c->jobs, *next; x && c->n_outage_held; x = next) {
    next = x->hh.next;
    if (!x->held) continue;
    int64_t epoch = 0;
    store_attempt_verdict_t v;
    if (store_attempt_verdict(c->st, x->id, &epoch, &v)) continue; /* the next tick */
    int live = 0;
    store_rank_t *r = NULL;
    int n = 0;
    if (v == STORE_ATTEMPT_FAILED && !store_ranks_of_job(c->st, x->id, epoch, &r, &n))
      for (int k = 0; k < n; k++)
        live += r[k].state == STORE_RANK_ASSIGNED || r[k].state == STORE_RANK_RUNNING;
    store_array_free(r);
    if (epoch != x->outage_epoch || v == STORE_ATTEMPT_ENDED) {
      x->held = 0, c->n_outage_held--; /* ended otherwise (a node gone, a cancel) */
    } else if (v == STORE_ATTEMPT_FENCED) {
      coord_attempt_settle(c, x->id, epoch, v, 0, NULL, "a rank was stopped by its node's fence "
                           "(the coordinator silent past the fence it gave the node; no restart "
                           "spent)");
    } else if (v == STORE_ATTEMPT_FAILED && (!live || now >= c->outage_until)) {
      char why[sizeof x->held_why];
      snprintf(why, sizeof why, "%s", x->held_why);
      x->outage_epoch = 0; /* settled as it is now: no hold again */
      x->held = 0, c->n_outage_held--;
      coord_attempt_settle(c, x->id, epoch, v, x->held_node, why, NULL);
    }
  }
}

/* A node gone: silent past the heartbeat timeout (or not back within the
 * restart grace after a coordinator restart), or (stopped) its fsdpd
 * stopped and said so in its last heartbeat, which it sends once every rank
 * it ran has ended and been reported. Ranks still assigned or running there
 * are lost: their attempts fail, or for a stopped node (ranks it never
 * started, an assignment that crossed its stop) are requeued as a
 * preemption is, and need no fence. Only a silent node counts as a death
 * (fsdp_nodes_declared_dead_total, its alert). */
void coord_node_gone(coord_t *c, coord_node_t *n, uint64_t now, int stopped) {
  int64_t *jobs = NULL;
  int nj = 0;
  n->dead = 1;
  n->stopped = stopped;
  c->nodes_died += !stopped;
  n->session = 0;
  char why[256];
  const double silent = (double)coord_node_silent_ms(c, n, now) / 1000;
  if (stopped)
    snprintf(why, sizeof why, "node n-%lld stopped (its fsdpd said so as it exited)",
             (long long)n->id);
  else if (n->awaited)
    snprintf(why, sizeof why, "node n-%lld did not register again within %.1f s of the "
             "coordinator's restart (--restart-grace-ms): declared dead (silent since before "
             "the restart: it may only have fenced its ranks, so no restart spent)",
             (long long)n->id, silent);
  else
    snprintf(why, sizeof why, "node n-%lld was not heard from for %.1f s (heartbeat timeout "
             "%.1f s): declared dead", (long long)n->id, silent, c->o.heartbeat_timeout_ms / 1000.0);
  int rc = store_node_mark_dead(c->st, n->id, n->heard_unix_ms, stopped, &jobs, &nj);
  if (rc) {
    LOG_WARN("coord", "node n-%lld: %s", (long long)n->id, err_msg());
    return;
  }
  if (stopped) LOG_INFO("coord", "%s; %d job(s) affected", why, nj);
  else LOG_WARN("coord", "%s; %d job(s) affected", why, nj);
  /* The node may live, cut off: its fsdpd kills its ranks once it has had
   * no answer for the fence (from the send of its last answered call, which
   * is no later than heard_ms). Its jobs' next attempts wait for that. */
  const uint64_t fenced = n->heard_ms + coord_fence_ms(c);
  for (int i = 0; i < nj; i++) {
    store_job_t j;
    if (store_job_get(c->st, jobs[i], &j)) continue;
    int64_t epoch = j.epoch;
    int running = j.state == STORE_JOB_RUNNING;
    store_job_free(&j);
    if (!running) continue;
    if (stopped) {
      coord_kill_attempt(c, jobs[i], epoch, n->id, why);
      coord_attempt_settle(c, jobs[i], epoch, STORE_ATTEMPT_PREEMPTED, 0, NULL, why);
      continue;
    }
    coord_job_t *x = coord_job_info(c, jobs[i]);
    if (x && fenced > x->fence_until) x->fence_until = fenced, x->fence_node = n->id;
    /* silent since before the restart: as if its node had reported its
     * ranks fenced (which it does when back), the outcome whichever comes
     * first; its ranks are LOST, so this is no verdict of theirs */
    if (n->awaited) coord_attempt_settle(c, jobs[i], epoch, STORE_ATTEMPT_FENCED, 0, NULL, why);
    else coord_attempt_fail(c, jobs[i], epoch, n->id, n->id, why);
  }
  store_array_free(jobs);
  /* a stopped node's ranks have all ended: no job waits to see them gone
   * (the kills above held them on it too) */
  if (stopped) coord_hold_confirm(c, n, NULL, 0);
  n->n_order = n->n_sent = 0; /* a dead node is told nothing more; it re-registers */
  if (n->poll) coord_node_answer(c, n); /* a heartbeat it holds (a stopped one's, cut short) */
  c->dirty = c->nodes_changed = 1;
}

/* ---- rendezvous ----------------------------------------------------------- */

static void coord_rdv_reply(coord_rdv_t *w, const store_rendezvous_t *r) {
  Fsdp__V1__RendezvousReply rep = FSDP__V1__RENDEZVOUS_REPLY__INIT;
  ProtobufCBinaryData *p = NULL;
  if (r && r->complete) {
    p = calloc((size_t)r->n + 1, sizeof *p);
    if (!p) {
      rpc_call_finish(w->call, err_set(FSDP_ENOMEM, "coordinator: out of memory"));
      return;
    }
    for (int i = 0; i < r->n; i++) p[i].data = r->entry[i].data, p[i].len = r->entry[i].len;
    rep.complete = 1, rep.payloads = p, rep.n_payloads = (size_t)r->n;
  }
  rpc_call_reply(w->call, &rep.base);
  free(p);
}

static void coord_rdv_remove(coord_t *c, coord_rdv_t *w) {
  for (coord_rdv_t **p = &c->rdv; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  free(w);
}

void coord_rdv_answer(coord_t *c, int64_t job, int64_t epoch, const char *group) {
  for (coord_rdv_t *w = c->rdv, *next; w; w = next) {
    next = w->next;
    if (w->job != job || w->epoch != epoch || strcmp(w->group, group)) continue;
    store_rendezvous_t r = {0};
    int rc = store_rendezvous_get(c->st, job, epoch, group, w->expected, &r);
    if (rc == FSDP_OK && !r.complete) {
      store_rendezvous_free(&r);
      return; /* the others of the group wait on */
    }
    rpc_call_on_cancel(w->call, NULL, NULL);
    if (rc) rpc_call_finish(w->call, rc);
    else coord_rdv_reply(w, &r);
    store_rendezvous_free(&r);
    coord_rdv_remove(c, w);
  }
}

/* ---- watchers ------------------------------------------------------------- */

static int coord_state_ended(Fsdp__V1__JobState s) {
  return s == FSDP__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
         s == FSDP__V1__JOB_STATE__JOB_STATE_FAILED || s == FSDP__V1__JOB_STATE__JOB_STATE_CANCELLED;
}

static void coord_watch_remove(coord_t *c, coord_watch_t *w) {
  for (coord_watch_t **p = &c->watch; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  free(w);
}

/* The figures each rank of job's attempt epoch (world ranks) last
 * reported, in f[rank]: the newer of its report in memory and what the
 * store kept (at its exit report, as its attempt ended: coord_ranks_keep),
 * so an ended attempt's, and one's after a restart, are there; f[rank].epoch
 * 0: none. Returns how many ranks have figures. The store is read only when
 * memory lacks a rank (an attempt ended, starting, or after a restart). */
static int coord_attempt_figures(coord_t *c, int64_t job, int64_t epoch, int world,
                                 store_figures_t *f) {
  int heard = 0;
  memset(f, 0, (size_t)world * sizeof *f);
  for (int i = 0; i < world; i++) {
    const coord_rank_t *r = coord_rank_get(c, job, i, 0);
    if (!r || r->epoch != epoch || !r->reported) continue;
    f[i] = (store_figures_t){.job_id = job, .epoch = epoch, .rank = i, .step = r->step,
                             .loss = r->loss, .tokens_per_s = r->tokens_per_s};
    heard++;
  }
  store_figures_t *k = NULL;
  int n = 0;
  if (heard == world || store_rank_figures_of(c->st, job, epoch, &k, &n)) return heard;
  for (int i = 0; i < n; i++) {
    const int rank = k[i].rank;
    if (rank < 0 || rank >= world || (f[rank].epoch && f[rank].step >= k[i].step)) continue;
    heard += !f[rank].epoch;
    f[rank] = k[i];
  }
  store_array_free(k);
  return heard;
}

/* The slowest rank's step in f (world ranks' figures, heard of them with
 * some) when every rank has figures; else -1. */
static int64_t coord_figures_step(const store_figures_t *f, int world, int heard) {
  int64_t step = -1;
  for (int i = 0; heard == world && i < world; i++)
    if (step < 0 || f[i].step < step) step = f[i].step;
  return step;
}

/* The lowest rank of f whose figures are of step (rank 0's when it is
 * there; the loss is averaged over ranks, the same on each); NULL: none. */
static const store_figures_t *coord_figures_at(const store_figures_t *f, int world, int64_t step) {
  for (int i = 0; f && i < world; i++)
    if (f[i].epoch && f[i].step == step) return &f[i];
  return NULL;
}

int64_t coord_attempt_step(coord_t *c, int64_t job, int64_t epoch, int world) {
  store_figures_t *f = world > 0 && epoch > 0 ? calloc((size_t)world, sizeof *f) : NULL;
  const int64_t step =
      f ? coord_figures_step(f, world, coord_attempt_figures(c, job, epoch, world, f)) : -1;
  free(f);
  return step;
}

/* Where j stands (coord_job_step), and in *at (may be NULL; epoch 0: none)
 * a rank's figures of that very step, so a step is never shown with another
 * step's loss: rank 0's final report while another's is still a heartbeat
 * behind is not paired with the step of the one behind. */
static int64_t coord_job_standing(coord_t *c, const store_job_t *j, store_figures_t *at) {
  const int world = j->world_size;
  store_figures_t *f = world > 0 && j->epoch > 0 ? calloc((size_t)world, sizeof *f) : NULL;
  int64_t step =
      f ? coord_figures_step(f, world, coord_attempt_figures(c, j->id, j->epoch, world, f)) : -1;
  if (j->state == STORE_JOB_SUCCEEDED) { /* it did every step */
    const coord_job_t *x = coord_job_info(c, j->id);
    if (x) step = x->steps;
  }
  if (step < 0) {
    /* a rank of its latest attempt reported no step (it starts, or resumes,
     * or ended before its first report came): where it stands is its
     * latest committed checkpoint, where a resume goes on (not 0: a
     * requeued job at 470 showed 470, 0, 479 while its new attempt
     * started, found by helper-110). An attempt whose every rank reported
     * stands where they did, ended or not: a job that failed at step 856
     * after committing 850 shows 856, as it did before its end, with its
     * checkpoint beside it (Job.last_checkpoint_step) */
    store_ckpt_t *k = NULL;
    int n = 0;
    step = 0;
    if (!store_ckpt_list(c->st, j->id, &k, &n))
      for (int i = 0; i < n; i++)
        if (k[i].state == STORE_CKPT_COMMITTED && k[i].step > step) step = k[i].step;
    store_array_free(k);
  }
  if (at) {
    const store_figures_t *a = coord_figures_at(f, world, step);
    if (a) *at = *a;
    else memset(at, 0, sizeof *at);
  }
  free(f);
  return step;
}

int64_t coord_job_step(coord_t *c, const store_job_t *j) { return coord_job_standing(c, j, NULL); }

/* The job's progress as the slowest rank has it, with the loss and speed a
 * rank reported of that very step: a rank further on (rank 0's final
 * report while another's is still a heartbeat behind) is not paired with
 * the step of one behind it. */
static void coord_progress(coord_t *c, const store_job_t *j, Fsdp__V1__JobProgress *p) {
  coord_job_t *x = coord_job_info(c, j->id);
  store_figures_t at;
  const int64_t step = coord_job_standing(c, j, &at);
  if (at.epoch) p->loss = at.loss, p->tokens_per_s = at.tokens_per_s;
  p->unreported = !at.epoch;
  p->step = step;
  p->total_steps = x ? x->steps : 0;
  p->state = coord_job_state(j->state);
  p->attempt = (uint32_t)j->epoch;
  p->unix_ms = coord_unix_ms();
  if (x && step > 0) {
    const uint64_t now = coord_mono_ms(c);
    if (x->rate_epoch != j->epoch) x->rate_epoch = j->epoch, x->rate_step0 = step, x->rate_t0 = now;
    if (step > x->rate_step0 && now > x->rate_t0)
      p->eta_s = (double)(x->steps - step) * (double)(now - x->rate_t0) / 1000.0 /
                 (double)(step - x->rate_step0);
  }
}

/* Sends each watcher of job what changed; ends the streams of an ended job. */
void coord_job_changed(coord_t *c, int64_t job) {
  /* checkpoints the store aborted as this job's attempt ended (every end of
   * an attempt tells this function after it): logged and counted here */
  const uint64_t at_end = store_ckpt_aborted_at_end(c->st);
  if (at_end > c->ckpt_aborts_at_end) {
    LOG_WARN("coord", "job j-%lld: %llu checkpoint(s) aborted: its attempt ended before every "
             "shard was reported (fsdpctl checkpoints j-%lld)", (long long)job,
             (unsigned long long)(at_end - c->ckpt_aborts_at_end), (long long)job);
    c->ckpt_aborts += at_end - c->ckpt_aborts_at_end;
    c->ckpt_aborts_at_end = at_end;
  }
  coord_job_t *x;
  HASH_FIND(hh, c->jobs, &job, sizeof job, x);
  if (x) { /* whatever the store's reason is now, the next wait's first is written */
    x->reason_sum = 0, x->reason_stored = 0;
    free(x->waiting);
    x->waiting = NULL;
  }
  store_job_t j;
  int got = 0;
  for (coord_watch_t *w = c->watch, *next; w; w = next) {
    next = w->next;
    if (w->job != job) continue;
    if (!got && store_job_get(c->st, job, &j)) return;
    got = 1;
    char id[32];
    coord_id_str(id, sizeof id, 'j', job);
    Fsdp__V1__JobProgress p = FSDP__V1__JOB_PROGRESS__INIT;
    p.job_id = id;
    coord_progress(c, &j, &p);
    p.message = (char *)coord_job_reason(c, &j);
    if ((int)p.state == w->last_state && p.step == w->last_step) continue;
    w->last_state = (int)p.state, w->last_step = p.step;
    if (rpc_call_backlog(w->call) >= COORD_WATCH_BACKLOG && !coord_state_ended(p.state)) {
      /* a watcher that reads nothing would queue a message a step for ever */
      LOG_WARN("coord", "watch of job %s: %d messages unread; ended", id, COORD_WATCH_BACKLOG);
      rpc_call_on_cancel(w->call, NULL, NULL);
      rpc_call_abort(w->call, err_set(FSDP_ECANCELED, "the coordinator ended this watch: %d "
                                      "progress messages went unread; read them as they come",
                                      COORD_WATCH_BACKLOG));
      coord_watch_remove(c, w);
      continue;
    }
    rpc_call_send(w->call, &p.base);
    if (coord_state_ended(p.state)) {
      rpc_call_on_cancel(w->call, NULL, NULL);
      rpc_call_finish(w->call, FSDP_OK);
      coord_watch_remove(c, w);
    }
  }
  if (got) store_job_free(&j);
}

static void coord_watch_cancel_cb(rpc_call_t *call, void *arg) {
  coord_watch_t *w = arg;
  (void)call;
  coord_watch_remove(w->c, w);
}

void coord_watch_add(coord_t *c, rpc_call_t *call, int64_t job) {
  /* each holds memory (up to its backlog) and costs work at every change:
   * without a cap one client could open them until the coordinator fails */
  int open = 0;
  for (const coord_watch_t *x = c->watch; x; x = x->next) open++;
  const int64_t max = param_watch_streams_max();
  if (open >= max) {
    rpc_call_finish(call, err_set(FSDP_ELIMIT, "the coordinator serves at most %lld WatchJob "
                                  "streams at once and %d are open; end one (an `fsdpctl watch` "
                                  "left running?) or try again later (the operator sets "
                                  "FSDP_WATCH_STREAMS_MAX)", (long long)max, open));
    return;
  }
  coord_watch_t *w = calloc(1, sizeof *w);
  if (!w) {
    rpc_call_finish(call, err_set(FSDP_ENOMEM, "coordinator: out of memory for a watch"));
    return;
  }
  *w = (coord_watch_t){call, job, -1, -1, c->watch, c};
  c->watch = w;
  rpc_call_on_cancel(call, coord_watch_cancel_cb, w);
  coord_job_changed(c, job);
}

static void coord_rdv_cancel_cb(rpc_call_t *call, void *arg) {
  coord_rdv_t *w = arg;
  (void)call;
  coord_rdv_remove(w->c, w);
}

void coord_rdv_hold(coord_t *c, rpc_call_t *call, int64_t job, int64_t epoch, const char *group,
                    int expected) {
  coord_rdv_t *w = calloc(1, sizeof *w);
  if (!w) {
    rpc_call_finish(call, err_set(FSDP_ENOMEM, "coordinator: out of memory for a rendezvous"));
    return;
  }
  *w = (coord_rdv_t){.call = call, .job = job, .epoch = epoch, .expected = expected,
                     .until = coord_mono_ms(c) + COORD_RDV_HOLD_MS, .next = c->rdv, .c = c};
  snprintf(w->group, sizeof w->group, "%s", group);
  c->rdv = w;
  rpc_call_on_cancel(call, coord_rdv_cancel_cb, w);
}

/* ---- placement ------------------------------------------------------------ */

static int coord_node_busy(const coord_node_t *n, int index) {
  return n && index >= 0 && index < COORD_NODE_DEVICES_MAX &&
         (n->busy[index / 64] >> (index % 64) & 1);
}

/* The cluster as placement sees it: alive nodes (known to the store and
 * heard since this coordinator started) and their devices, a device held
 * while the store says a job holds it or while its node still reports
 * processes of an earlier job on it. */
void coord_pic_free(coord_pic_t *p) { free(p->sn), free(p->sd), free(p->freeing); }

void coord_pic_wake(coord_t *c, const coord_pic_t *p) {
  if (p->wake && (!c->fence_wake_ms || p->wake < c->fence_wake_ms)) c->fence_wake_ms = p->wake;
}

static int coord_node_id_cmp(const void *a, const void *b) {
  const int64_t x = ((const store_node_t *)a)->id, y = ((const store_node_t *)b)->id;
  return x < y ? -1 : x > y;
}

static int coord_id_cmp(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

int coord_pic_refresh(coord_t *c) {
  int64_t *ids = NULL;
  int n = 0, all = 0, rc;
  store_nodes_touched(c->st, &ids, &n, &all);
  if (all || !c->pic_ok) {
    free(ids);
    store_node_t *nodes;
    int nn;
    if ((rc = store_node_list(c->st, &nodes, &nn))) return c->pic_ok = 0, rc;
    store_nodes_free(c->pic, c->pic_n);
    c->pic = nodes, c->pic_n = nn, c->pic_ok = 1;
    return FSDP_OK;
  }
  if (n > 1) qsort(ids, (size_t)n, sizeof *ids, coord_id_cmp);
  int k = 0;
  for (int i = 0; i < n; i++)
    if (!k || ids[i] != ids[k - 1]) ids[k++] = ids[i];
  store_node_t *got = NULL;
  int ng = 0;
  rc = k ? store_nodes_get(c->st, ids, k, &got, &ng) : FSDP_OK;
  free(ids);
  if (rc) return c->pic_ok = 0, rc; /* the ids are spent: read everything next time */
  if (!ng) return FSDP_OK;
  store_node_t *grown = realloc(c->pic, (size_t)(c->pic_n + ng) * sizeof *grown);
  if (!grown) {
    store_nodes_free(got, ng);
    return c->pic_ok = 0, err_set(FSDP_ENOMEM, "coordinator: out of memory placing jobs");
  }
  c->pic = grown;
  int added = 0;
  for (int i = 0; i < ng; i++) {
    store_node_t *old = bsearch(&got[i], c->pic, (size_t)c->pic_n, sizeof *c->pic,
                                coord_node_id_cmp);
    if (old) {
      free(old->devices);
      *old = got[i];
    } else {
      c->pic[c->pic_n + added++] = got[i]; /* a new node: ids only grow, but sort to be sure */
    }
  }
  free(got); /* its rows' devices now belong to c->pic */
  if (added) {
    c->pic_n += added;
    qsort(c->pic, (size_t)c->pic_n, sizeof *c->pic, coord_node_id_cmp);
  }
  return FSDP_OK;
}

int coord_pic_load(coord_t *c, coord_pic_t *p) {
  memset(p, 0, sizeof *p);
  int rc = coord_pic_refresh(c);
  if (rc) return rc;
  p->nodes = c->pic, p->nn = c->pic_n;
  int nd = 0;
  for (int i = 0; i < p->nn; i++) nd += p->nodes[i].n_devices;
  p->sn = calloc((size_t)p->nn + 1, sizeof *p->sn);
  p->sd = calloc((size_t)nd + 1, sizeof *p->sd);
  p->freeing = calloc((size_t)nd + 1, 1);
  if (!p->sn || !p->sd || !p->freeing) {
    coord_pic_free(p);
    return err_set(FSDP_ENOMEM, "coordinator: out of memory placing jobs");
  }
  const uint64_t now = coord_mono_ms(c);
  p->now = now;
  /* a node reports its ranks gone at its next heartbeat */
  p->whole_wait_ms = 2 * (uint64_t)(c->o.heartbeat_interval_ms > 0 ? c->o.heartbeat_interval_ms : 1000) + 1000;
  for (int i = 0; i < p->nn; i++) {
    const store_node_t *n = &p->nodes[i];
    coord_node_t *ln = coord_node_get(c, n->id, 0);
    const int beating = ln && coord_node_beating(ln, now);
    p->sn[i] = (sched_node_t){n->id, n->name,
                              n->state == STORE_NODE_ALIVE && ln && ln->session && !ln->dead &&
                                  !ln->stopping && beating,
                              n->drain_reason[0] != 0,
                              n->stopped || (ln && ln->stopping && !ln->dead)};
    for (int k = 0; k < n->n_devices; k++) {
      const store_device_t *d = &n->devices[k];
      p->freeing[p->nd] = d->job_id == 0 && coord_node_busy(ln, d->index);
      p->sd[p->nd++] = (sched_device_t){0, i, d->index, store_dev_kind_name(d->kind),
                                        d->memory_bytes, d->job_id != 0 || coord_node_busy(ln, d->index)};
    }
  }
  return FSDP_OK;
}

/* Whether job would be placed with every shard group inside a node were the
 * devices being released (coord_pic_t.freeing) free already. */
static int coord_fit_whole_soon(const coord_pic_t *p, const sched_job_t *job) {
  int any = 0;
  for (int i = 0; i < p->nd && !any; i++) any = p->freeing[i];
  sched_device_t *sd = any ? malloc((size_t)p->nd * sizeof *sd) : NULL;
  sched_slot_t *slot = sd ? calloc((size_t)(job->replicas * job->shards), sizeof *slot) : NULL;
  char note[512];
  int whole = 0;
  if (slot) {
    for (int i = 0; i < p->nd; i++) sd[i] = p->sd[i], sd[i].held &= !p->freeing[i];
    whole = sched_place(p->sn, p->nn, sd, p->nd, job, slot, note, sizeof note) == SCHED_PLACED &&
            !note[0];
  }
  free(sd), free(slot);
  return whole;
}

/* Fits a job of facts x on the picture: SCHED_PLACED with its slots (their
 * devices then held in the picture), or SCHED_WAIT with the reason in note.
 * A placement whose shard group would span nodes waits up to
 * p->whole_wait_ms instead where devices being released would keep every
 * group whole: a job placed as another ends found the ended job's devices
 * held until their node's next heartbeat (an outside tester). */
int coord_fit(coord_pic_t *p, const coord_job_t *x, sched_slot_t *slot, char *note,
                     size_t len, uint64_t *whole_since) {
  char *avoid = x->n_avoid ? calloc((size_t)p->nn + 1, 1) : NULL;
  for (int i = 0; avoid && i < p->nn; i++) /* the oldest failure 1, the latest n_avoid */
    for (int k = 0; k < x->n_avoid; k++)
      if (p->sn[i].id == x->avoid[k]) avoid[i] = (char)(k + 1);
  sched_job_t sj = {x->R, x->S, x->kind, x->need, avoid};
  int rc = sched_place(p->sn, p->nn, p->sd, p->nd, &sj, slot, note, len);
  if (rc == SCHED_PLACED && note[0] && whole_since && coord_fit_whole_soon(p, &sj)) {
    /* the wait's start is kept across a pass that found otherwise (a node
     * quiet a moment): the bound holds; one long past starts anew */
    if (!*whole_since || p->now - *whole_since > 4 * p->whole_wait_ms) *whole_since = p->now;
    const uint64_t waited = p->now - *whole_since;
    if (waited < p->whole_wait_ms) {
      /* a pass when its wait is up, freed or not (a submit's too) */
      if (!p->wake || *whole_since + p->whole_wait_ms < p->wake) p->wake = *whole_since + p->whole_wait_ms;
      snprintf(note, len, "waiting %.1f s at most for devices their nodes are releasing (the ranks "
               "of an attempt that ended, exiting there): with them every shard group fits inside "
               "one node, where now one would span nodes", (double)(p->whole_wait_ms - waited) / 1e3);
      free(avoid);
      return SCHED_WAIT;
    }
  }
  if (rc == SCHED_PLACED && whole_since) *whole_since = 0;
  for (int r = 0; rc == SCHED_PLACED && r < x->R * x->S; r++) p->sd[slot[r].device].held = 1;
  /* where it failed before: said in the placement's note, avoided or not */
  for (int i = 0, used; rc == SCHED_PLACED && avoid && i < p->nn; i++) {
    if (!avoid[i]) continue;
    used = 0;
    for (int r = 0; r < x->R * x->S && !used; r++) used = p->sd[slot[r].device].node == i;
    const size_t at = strnlen(note, len);
    snprintf(note + at, len - at, "%s%s node %s%s, where an attempt of it failed%s",
             at ? "; " : "", used ? "on" : "not on", p->sn[i].name, used ? " again" : "",
             used ? ": no other node will do" : "");
  }
  free(avoid);
  return rc;
}

/* Starts the job's next attempt on the slots coord_fit gave: the store
 * records it, each node is told its ranks. */
void coord_start(coord_t *c, const coord_pic_t *p, int64_t job, const coord_job_t *x,
                        const sched_slot_t *slot, const char *note) {
  const int W = x->R * x->S;
  store_placement_t *pl = calloc((size_t)W + 1, sizeof *pl);
  int64_t epoch = 0;
  if (!pl) {
    LOG_WARN("coord", "job j-%lld: out of memory placing it", (long long)job);
    c->dirty = 1;
    return;
  }
  for (int r = 0; r < W; r++) {
    const sched_device_t *d = &p->sd[slot[r].device];
    pl[r] = (store_placement_t){r, p->sn[d->node].id, d->index, r / x->S, r % x->S};
  }
  if (store_attempt_start(c->st, job, pl, W, &epoch)) {
    LOG_WARN("coord", "job j-%lld: placing it: %s", (long long)job, err_msg());
    c->dirty = 1;   /* tried again by the timer... */
    c->pic_ok = 0;  /* ...on the cluster read whole (the picture was wrong about a device) */
    free(pl);
    return;
  }
  if (note[0]) store_event_add(c->st, job, 0, "job.placement", "%s", note);
  if (epoch > 1) {
    c->restarts++;
  } else {
    store_job_t j;
    if (!store_job_get(c->st, job, &j)) {
      const int64_t waited = coord_unix_ms() - j.submitted_ms;
      metrics_hist_observe(&c->sched, waited > 0 ? (double)waited / 1e3 : 0);
      store_job_free(&j);
    }
  }
  LOG_INFO("coord", "job j-%lld attempt %lld: %d ranks placed%s%s", (long long)job,
           (long long)epoch, W, note[0] ? "; " : "", note);
  for (int r = 0; r < W; r++) {
    coord_order_t o = {.job = job, .epoch = epoch, .rank = r, .world = W,
                       .device = pl[r].device_index, .shard_group = pl[r].shard_group,
                       .replica_group = pl[r].replica_group};
    coord_order_push(c, pl[r].node_id, &o);
  }
  free(pl);
  coord_job_changed(c, job);
}

/* One placement pass over the pending jobs: the picture, the shapes found
 * not to fit it (a job of the same shape waits for the same reason, and
 * sched_place is not run again until a placement changes the picture), and
 * the reasons that changed, written in one transaction at the end. */
#define COORD_MEMO 16
typedef struct coord_pass {
  coord_pic_t pic;
  struct {
    int R, S;
    char kind[8];
    uint64_t need;
    char note[512];
  } memo[COORD_MEMO];
  int n_memo;
  int64_t *ids;      /* jobs whose reason changed... */
  char **why;        /* ...to what */
  coord_job_t **job; /* ...whose reason_sum is set once it is written */
  uint64_t *sum;
  int n, cap;
} coord_pass_t;

/* Fits x on the pass's picture, reusing the verdict on a shape that did not fit. */
static int coord_pass_fit(coord_pass_t *ps, coord_job_t *x, sched_slot_t *slot, char *note,
                          size_t len) {
  for (int i = 0; i < ps->n_memo; i++)
    if (ps->memo[i].R == x->R && ps->memo[i].S == x->S && ps->memo[i].need == x->need &&
        !strcmp(ps->memo[i].kind, x->kind)) {
      snprintf(note, len, "%s", ps->memo[i].note);
      return SCHED_WAIT;
    }
  int rc = coord_fit(&ps->pic, x, slot, note, len, &x->whole_since);
  if (rc == SCHED_PLACED) {
    ps->n_memo = 0; /* the picture changed */
  } else if (rc == SCHED_WAIT) {
    const int k = ps->n_memo < COORD_MEMO ? ps->n_memo++ : COORD_MEMO - 1;
    ps->memo[k].R = x->R, ps->memo[k].S = x->S, ps->memo[k].need = x->need;
    snprintf(ps->memo[k].kind, sizeof ps->memo[k].kind, "%s", x->kind);
    snprintf(ps->memo[k].note, sizeof ps->memo[k].note, "%s", note);
  }
  return rc;
}

uint64_t coord_reason_sum(const char *why) { return XXH64(why, strlen(why), 0) | 1; }

const char *coord_job_reason(coord_t *c, const store_job_t *j) {
  coord_job_t *x = NULL;
  if (j->state == STORE_JOB_PENDING) HASH_FIND(hh, c->jobs, &j->id, sizeof j->id, x);
  return x && x->waiting ? x->waiting : j->reason;
}

/* Records why x waits: the first reason of a wait is queued for the store,
 * a later one is kept in memory (coord_job_t.reason_sum). */
static void coord_pass_wait(coord_pass_t *ps, coord_job_t *x, const char *why) {
  const uint64_t sum = coord_reason_sum(why);
  if (x->reason_sum == sum) return;
  if (x->reason_stored) {
    char *w = strdup(why);
    if (!w) return; /* the store's older reason shows meanwhile */
    free(x->waiting);
    x->waiting = w, x->reason_sum = sum;
    return;
  }
  if (ps->n == ps->cap) {
    const int cap = ps->cap ? 2 * ps->cap : 64;
    int64_t *ids = realloc(ps->ids, (size_t)cap * sizeof *ids);
    if (ids) ps->ids = ids;
    char **w = realloc(ps->why, (size_t)cap * sizeof *w);
    if (w) ps->why = w;
    coord_job_t **j = realloc(ps->job, (size_t)cap * sizeof *j);
    if (j) ps->job = j;
    uint64_t *u = realloc(ps->sum, (size_t)cap * sizeof *u);
    if (u) ps->sum = u;
    if (!ids || !w || !j || !u) return; /* written by a later pass */
    ps->cap = cap;
  }
  if (!(ps->why[ps->n] = strdup(why))) return;
  ps->ids[ps->n] = x->id, ps->job[ps->n] = x, ps->sum[ps->n] = sum;
  ps->n++;
}

/* Places one PENDING job on the pass's picture, or notes why it waits. */
static void coord_place(coord_t *c, coord_pass_t *ps, int64_t job) {
  coord_job_t *x = coord_job_info(c, job);
  if (!x) {
    LOG_WARN("coord", "job j-%lld: its stored spec no longer resolves: %s", (long long)job,
             err_msg());
    return;
  }
  const uint64_t now = coord_mono_ms(c);
  if (x->backoff_until > now) { /* failing again and again: not placed yet */
    char why[STORE_REASON_MAX], failure[216];
    snprintf(why, sizeof why, "restarting after attempt failed (%s); its %d%s failure in a row "
             "soon after a start: waiting %.0f s more before the next (--restart-backoff-ms, "
             "doubling), so that a node or link that fails again does not use up every restart "
             "at once", text_clip(failure, sizeof failure, x->failure, 200), x->fails,
             x->fails == 2 ? "nd" : x->fails == 3 ? "rd" : "th",
             (double)(x->backoff_until - now) / 1000);
    coord_pass_wait(ps, x, why);
    if (!c->fence_wake_ms || x->backoff_until < c->fence_wake_ms) c->fence_wake_ms = x->backoff_until;
    return;
  }
  int64_t held_by = 0;
  const uint64_t held = coord_hold_until(c, job, now, &held_by);
  if (held > now && held >= x->fence_until) {
    char why[STORE_REASON_MAX];
    snprintf(why, sizeof why, "%s (%.200s); waiting for node n-%lld to show its ranks of the last "
             "attempt gone (at most %.0f s more: then its fence, --restart-grace-ms, has stopped "
             "them), lest they write beside the next attempt", x->preempted ? "requeued after "
             "preemption" : x->failure[0] ? "restarting after attempt failed" : "restarting",
             x->failure[0] ? x->failure : "its attempt ended", (long long)held_by,
             (double)(held - now) / 1000);
    coord_pass_wait(ps, x, why);
    if (!c->fence_wake_ms || held < c->fence_wake_ms) c->fence_wake_ms = held;
    return;
  }
  if (x->fence_until > now) { /* not placed: its slots stay free for others meanwhile */
    char why[STORE_REASON_MAX];
    const double left = (double)(x->fence_until - now) / 1000;
    if (x->fence_node)
      snprintf(why, sizeof why, "restarting after attempt failed (%.200s); waiting %.0f s more: "
               "node n-%lld may run its ranks until it has had no answer for %.1f s (its fence, "
               "--restart-grace-ms), and they must not write beside the next attempt",
               x->failure, left, (long long)x->fence_node, c->o.restart_grace_ms / 1000.0);
    else
      snprintf(why, sizeof why, "restarting; waiting %.0f s more: the coordinator restarted, and "
               "a node cut off from it before may run this job's last ranks until it has had no "
               "answer for %.1f s (its fence, --restart-grace-ms)", left,
               c->o.restart_grace_ms / 1000.0);
    coord_pass_wait(ps, x, why);
    if (!c->fence_wake_ms || x->fence_until < c->fence_wake_ms) c->fence_wake_ms = x->fence_until;
    return;
  }
  sched_slot_t *slot = calloc((size_t)(x->R * x->S) + 1, sizeof *slot);
  char note[512];
  int rc = slot ? coord_pass_fit(ps, x, slot, note, sizeof note) : FSDP_ENOMEM;
  if (rc == SCHED_WAIT && x->failure[0]) { /* waiting to restart: say after what */
    char why[STORE_REASON_MAX], failure[216];
    snprintf(why, sizeof why, "%s (%s); %.250s", x->preempted ? "requeued after preemption"
             : "restarting after attempt failed", text_clip(failure, sizeof failure, x->failure, 200),
             note);
    coord_pass_wait(ps, x, why);
  } else if (rc == SCHED_WAIT) {
    coord_pass_wait(ps, x, note);
  }
  if (rc == SCHED_PLACED) {
    coord_start(c, &ps->pic, job, x, slot, note);
    x->started_ms = now;
  }
  free(slot);
}

int coord_schedule_due(coord_t *c, uint64_t now) {
  if (c->fence_wake_ms && now >= c->fence_wake_ms) c->fence_wake_ms = 0, c->dirty = 1;
  return c->dirty;
}

/* Places every PENDING job it can, in submission order (a job that cannot
 * start does not hold back a smaller one behind it). */
void coord_schedule(coord_t *c) {
  c->dirty = 0;
  const uint64_t t0 = uv_hrtime();
  int64_t *jobs = NULL;
  int nj = 0;
  if (store_job_ids(c->st, STORE_JOB_PENDING, &jobs, &nj)) {
    LOG_WARN("coord", "placement: %s", err_msg());
    return;
  }
  coord_pass_t *ps = nj ? calloc(1, sizeof *ps) : NULL;
  /* nothing waits: the cluster's picture (every node and device) is not read */
  if (nj && (!ps || coord_pic_load(c, &ps->pic))) {
    LOG_WARN("coord", "placement: %s", ps ? err_msg() : "out of memory");
    free(ps);
    ps = NULL;
  } else if (nj) {
    /* A job whose checkpoint is being committed or whose old files are
     * being removed waits for that: its next attempt loads the newest
     * committed checkpoint, which the commit's retention could otherwise
     * remove under it. */
    for (int i = 0; i < nj; i++)
      if (!coord_ckpt_busy(c, jobs[i])) coord_place(c, ps, jobs[i]);
    coord_pic_wake(c, &ps->pic);
    coord_pic_free(&ps->pic);
  }
  if (ps && ps->n) {
    if (store_jobs_set_pending_reasons(c->st, ps->ids, (const char *const *)ps->why, ps->n))
      LOG_WARN("coord", "placement: the pending jobs' reasons: %s", err_msg());
    else
      for (int i = 0; i < ps->n; i++) {
        coord_job_t *x = ps->job[i];
        x->reason_sum = ps->sum[i], x->reason_stored = 1;
        free(x->waiting);
        x->waiting = NULL;
      }
  }
  for (int i = 0; ps && i < ps->n; i++) free(ps->why[i]);
  if (ps) free(ps->ids), free(ps->why), free(ps->job), free(ps->sum);
  const double ms = (double)(uv_hrtime() - t0) / 1e6;
  metrics_hist_observe(&c->pass, ms / 1e3);
  if (ms >= COORD_SLOW_PASS_MS) /* the loop answered nothing meanwhile: say so */
    LOG_INFO("coord", "placement: a pass over %d pending jobs took %.0f ms (%d reasons written)",
             nj, ms, ps ? ps->n : 0);
  free(ps);
  free(jobs);
}

/* ---- the timer ------------------------------------------------------------ */

/* The audit log's retention: events older than --event-retention-days go,
 * COORD_PURGE_BATCH at a time (each its own short transaction), at most
 * COORD_PURGE_PASSES batches and COORD_PURGE_BUDGET_MS a pass; the rest next
 * pass. */
static void coord_events_purge(coord_t *c) {
  const int days = c->o.event_retention_days;
  if (days < 0) return;
  const int64_t before = coord_unix_ms() - (int64_t)days * 86400000;
  int removed = COORD_PURGE_BATCH, total = 0;
  const uint64_t t0 = uv_hrtime();
  for (int i = 0; i < COORD_PURGE_PASSES && removed == COORD_PURGE_BATCH &&
                  uv_hrtime() - t0 < (uint64_t)COORD_PURGE_BUDGET_MS * 1000000; i++) {
    if (store_event_purge(c->st, before, COORD_PURGE_BATCH, &removed)) {
      LOG_WARN("coord", "events: %s", err_msg());
      return;
    }
    total += removed;
  }
  if (total) LOG_INFO("coord", "events: %d older than %d days removed", total, days);
}

static void coord_job_drop(coord_t *c, coord_job_t *x) {
  HASH_DEL(c->jobs, x);
  free(x->waiting);
  free(x);
}

/* Forgets what the coordinator keeps in memory of a job removed from the store. */
static void coord_job_forget(coord_t *c, int64_t id) {
  coord_ranks_forget(c, id);
  coord_job_t *x;
  HASH_FIND(hh, c->jobs, &id, sizeof id, x);
  if (x) coord_job_drop(c, x);
}

/* Bounds the facts kept of jobs that are not live: a listing of a long
 * history derives each ended job's facts once (its spec validated, its plan
 * made), and without a bound they would stay for the coordinator's life
 * (about 1.6 KB each). Every pending and running job stays (placement, the
 * ETA and a restart's reason live there); of the others, those first looked
 * up longest ago go beyond COORD_JOBS_KEPT, to be derived again if asked
 * for. Runs on the tick, never inside a call that holds an entry. */
static void coord_jobs_trim(coord_t *c) {
  const unsigned n = HASH_COUNT(c->jobs);
  if (n <= COORD_JOBS_KEPT + (unsigned)c->jobs_live) return;
  unsigned live = 0;
  for (int s = STORE_JOB_PENDING; s <= STORE_JOB_RUNNING; s++) {
    int64_t *ids = NULL;
    int k = 0;
    if (store_job_ids(c->st, (store_job_state_t)s, &ids, &k)) {
      LOG_WARN("coord", "jobs: the live ones not read to trim the memory of others: %s", err_msg());
      return;
    }
    for (int i = 0; i < k; i++) {
      coord_job_t *x;
      HASH_FIND(hh, c->jobs, &ids[i], sizeof ids[i], x);
      if (x) x->live = 1, live++;
    }
    free(ids);
  }
  c->jobs_live = (int)live;
  unsigned drop = n - live > COORD_JOBS_KEPT ? n - live - COORD_JOBS_KEPT : 0;
  coord_job_t *x, *tmp;
  HASH_ITER(hh, c->jobs, x, tmp) {
    if (!x->live && drop) coord_job_drop(c, x), drop--;
    else x->live = 0;
  }
}

/* Ended jobs' retention: jobs that ended more than --job-retention-days ago
 * go from the store with their rows (never their files), but not while an
 * export reads one of their checkpoints or a commit or removal of theirs is
 * on the pool (the next pass takes them). COORD_JOB_PURGE_BATCH a
 * transaction, at most COORD_PURGE_PASSES of them and COORD_PURGE_BUDGET_MS
 * a pass (a long history goes over many minutes, heartbeats answered). */
static void coord_jobs_purge(coord_t *c) {
  const int days = c->o.job_retention_days;
  if (days <= 0) return;
  const int64_t before = coord_unix_ms() - (int64_t)days * 86400000;
  const uint64_t t0 = uv_hrtime();
  int total = 0;
  for (int pass = 0; pass < COORD_PURGE_PASSES &&
                     uv_hrtime() - t0 < (uint64_t)COORD_PURGE_BUDGET_MS * 1000000; pass++) {
    int64_t *ids = NULL;
    int n = 0, k = 0;
    int rc = store_job_purgeable(c->st, before, COORD_JOB_PURGE_BATCH, &ids, &n);
    for (int i = 0; !rc && i < n; i++)
      if (!coord_export_of_job(c, ids[i]) && !coord_ckpt_busy(c, ids[i])) ids[k++] = ids[i];
    if (!rc && k) rc = store_job_purge(c->st, ids, k);
    for (int i = 0; !rc && i < k; i++) coord_job_forget(c, ids[i]);
    free(ids);
    if (rc) {
      LOG_WARN("coord", "jobs' retention: %s", err_msg());
      return;
    }
    total += k;
    if (n < COORD_JOB_PURGE_BATCH || !k) break;
  }
  if (total) LOG_INFO("coord", "jobs: %d that ended more than %d days ago removed", total, days);
}

static void coord_tick_cb(uv_timer_t *t) {
  coord_t *c = t->data;
  const uint64_t now = coord_mono_ms(c);
  /* a tick this late: the loop was held up (a store write waiting on its
   * disk's fsync or on a lock, a long callback), reading no call and
   * answering no held heartbeat meanwhile. That time counts toward no
   * node's silence: a node beating on time is not declared dead for it
   * (heartbeats come an interval apart, so a stall of the timeout less an
   * interval did that before) */
  const uint64_t late = coord_stall_pending(c, now);
  c->deaf_ms += late;
  if (late >= (uint64_t)c->o.heartbeat_interval_ms &&
      (!c->stall_logged_ms || now - c->stall_logged_ms >= COORD_STALL_LOG_MS)) {
    c->stall_logged_ms = now;
    LOG_WARN("coord", "the coordinator's loop was held up %.1f s (a database write waiting on "
             "its disk or a lock?): nodes' silence meanwhile does not count toward the heartbeat "
             "timeout (said at most every %d s; fsdp_coordinator_stalled_seconds_total counts "
             "every stall)", (double)late / 1000, COORD_STALL_LOG_MS / 1000);
  }
  c->tick_ms = now;
  for (int64_t id = 1; id < c->cap_node; id++) {
    coord_node_t *n = c->node[id];
    if (!n) continue;
    const uint64_t silent = coord_node_silent_ms(c, n, now);
    /* (awaited: from the restart, the grace, less the loop's stalls too) */
    if (!n->dead && silent > (uint64_t)c->o.heartbeat_timeout_ms &&
        n->heard_ms + silent >= n->grace_until_ms)
      coord_node_gone(c, n, now, 0);
  }
  for (coord_rdv_t *w = c->rdv, *next; w; w = next) {
    next = w->next;
    if (now < w->until) continue;
    rpc_call_on_cancel(w->call, NULL, NULL);
    coord_rdv_reply(w, NULL); /* not yet: ask again */
    coord_rdv_remove(c, w);
  }
  if (c->n_outage_held) coord_outage_tick(c, now);
  if (c->n_stopping) coord_stop_tick(c, now);
  /* an attempt whose end the store failed to take (a full disk, a lock
   * held elsewhere) is ended once it takes it: its ranks may all be gone */
  if (c->unsettled && now - c->settled_ms >= COORD_SETTLE_RETRY_MS) {
    c->unsettled = 0;
    c->settled_ms = now;
    coord_attempts_settle(c, "before its end could be stored");
  }
  if (coord_schedule_due(c, now)) coord_schedule(c);
  if (now - c->janitor_ms >= COORD_JANITOR_MS) {
    c->janitor_ms = now;
    coord_ckpt_janitor(c);
    coord_jobs_trim(c);
  }
  if (!c->purged_ms || now - c->purged_ms >= COORD_PURGE_MS) {
    c->purged_ms = now ? now : 1;
    coord_events_purge(c);
    coord_jobs_purge(c);
  }
}

/* After each turn of the loop's callbacks: that turn's submits, stored together. */
static void coord_flush_cb(uv_check_t *h) { coord_submit_flush(h->data); }

/* ---- life ----------------------------------------------------------------- */

/* o's defaults where it leaves 0 (coord.h). */
static void coord_opts_fill(coord_opts_t *o) {
  if (!o->heartbeat_interval_ms) o->heartbeat_interval_ms = 1000;
  if (!o->heartbeat_timeout_ms) o->heartbeat_timeout_ms = 5000;
  if (!o->restart_grace_ms) o->restart_grace_ms = 3 * o->heartbeat_timeout_ms;
  if (!o->checkpoint_timeout_ms) o->checkpoint_timeout_ms = 300000;
  if (!o->restart_backoff_ms) o->restart_backoff_ms = 10000;
  if (!o->max_pending_jobs) o->max_pending_jobs = 10000;
  if (!o->event_retention_days) o->event_retention_days = 90;
}

/* The options alone, filled: what coord_create refuses before it opens anything. */
static int coord_opts_refuse(const coord_opts_t *o) {
  if (!o->nroots)
    return err_set(FSDP_EINVAL, "coordinator: no --root: give the directories job paths (data, "
                   "init_from, save) must lie in, e.g. --root /data");
  /* the grace is also each node's fence: a node with no answer for that
   * long stops its ranks. Shorter than the timeout, a blip the timeout
   * forgives would stop them; a node learns its heartbeat was heard only
   * when it is answered, up to two intervals after it was sent */
  const int g = o->restart_grace_ms, t = o->heartbeat_timeout_ms,
            two = 2 * o->heartbeat_interval_ms + COORD_FENCE_SLACK_MS, least = t > two ? t : two;
  if (g < least)
    return err_set(FSDP_EINVAL, "--restart-grace-ms %d is too short: it is also each node's fence "
                   "(a node with no answer for that long stops its ranks), so it must be at least "
                   "the heartbeat timeout, and two heartbeat intervals and a second (a late answer "
                   "must not fence a healthy node); give at least %d", g, least);
  return 0;
}

static rpc_server_opts_t coord_server_opts(const coord_opts_t *o) {
  return (rpc_server_opts_t){.addr = o->listen, .user_token_file = o->user_token_file,
                             .node_token_file = o->node_token_file,
                             .operator_token_file = o->operator_token_file,
                             .node_jwks_file = o->node_jwks_file,
                             .node_jwt_audience = o->node_jwt_audience,
                             .node_jwt_subject = o->node_jwt_subject,
                             .node_jwt_issuer = o->node_jwt_issuer,
                             .tls_cert_file = o->tls_cert_file, .tls_key_file = o->tls_key_file};
}

int coord_opts_check(const coord_opts_t *given) {
  coord_opts_t o = *given;
  coord_opts_fill(&o);
  int rc = coord_opts_refuse(&o);
  const rpc_server_opts_t ro = coord_server_opts(&o);
  if (!rc) rc = rpc_server_check(&ro);
  if (!rc && o.metrics_listen) rc = metrics_listen_check(o.metrics_listen);
  if (!rc && o.health_listen) rc = rpc_server_check(&(rpc_server_opts_t){.addr = o.health_listen,
                                                                    .addr_option = "--health-listen"});
  return rc;
}

int coord_create(coord_t **out, uv_loop_t *loop, const coord_opts_t *o) {
  coord_opts_t filled = *o;
  coord_opts_fill(&filled);
  if (coord_opts_refuse(&filled)) return FSDP_EINVAL;
  coord_t *c = calloc(1, sizeof *c);
  if (!c) return err_set(FSDP_ENOMEM, "coordinator: out of memory");
  c->loop = loop;
  c->o = filled;
  store_opts_t so = {.sync_normal = o->sync_normal};
  int rc = store_open(o->db, &so, &c->st);
  if (rc) {
    free(c);
    return rc;
  }
  /* the first tick's lateness counts from here: the rest of the start
   * (servers, a restart's pending fences) and a stall before the first
   * tick are no restored node's silence (coord_stall_pending) */
  c->tick_ms = coord_mono_ms(c);
  /* nodes the store has alive get restart_grace_ms from now to register
   * again: after a restart every fsdpd reconnects at once (each waiting up
   * to its 1 s backoff), and a node declared dead fails its jobs over */
  store_node_t *nodes = NULL;
  int nn = 0;
  if (!(rc = store_node_list(c->st, &nodes, &nn)))
    for (int i = 0; i < nn && !rc; i++) {
      if (nodes[i].state != STORE_NODE_ALIVE) continue;
      coord_node_t *n = coord_node_get(c, nodes[i].id, 1);
      if (!n) {
        rc = err_set(FSDP_ENOMEM, "coordinator: out of memory");
        break;
      }
      n->grace_until_ms = n->heard_ms + (uint64_t)c->o.restart_grace_ms;
      n->awaited = 1;
    }
  store_nodes_free(nodes, nn);
  /* a job that waits to restart may have ranks left on a node the last
   * coordinator declared dead, cut off and not yet fenced: they are dead a
   * fence after the node's last call, which came before this start */
  c->started_ms = coord_mono_ms(c);
  if (!rc) coord_fence_pending(c);
  const rpc_server_opts_t ro = coord_server_opts(o);
  if (!rc) rc = rpc_server_create(&c->srv, loop, &ro);
  if (!rc) rc = coord_rpc_register(c);
  if (!rc) rc = rpc_server_start(c->srv);
  /* health alone, in plaintext, for a probe that cannot do TLS or tokens:
   * it says the process serves, nothing of the cluster */
  rpc_server_opts_t ho = {.addr = o->health_listen, .addr_option = "--health-listen"};
  if (!rc && o->health_listen && !(rc = rpc_server_create(&c->health, loop, &ho)))
    rc = rpc_server_start(c->health);
  /* 1 ms .. 30 s (a stall of the loop, late past a timeout), with 1 s, the
   * alert's threshold, a bound: inside a bucket the p99 is interpolated,
   * and a few beats 0.5 s late would read as over 1 s */
  static const double hb_le[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 30};
  metrics_hist_init_bounds(&c->hb_late, hb_le, (int)(sizeof hb_le / sizeof *hb_le));
  metrics_hist_init(&c->sched, 0.1, 3);     /* 100 ms .. 5 h: a job may wait for nodes */
  metrics_hist_init(&c->pass, 0.001, 2);    /* 1 ms .. 2 s */
  metrics_hist_init(&c->commit, 0.001, 3);  /* 1 ms .. 3 min: large checkpoints' headers */
  if (!rc && o->metrics_listen)
    rc = metrics_server_start(&c->metrics, loop, o->metrics_listen, coord_metrics_render, c);
  if (rc) {
    if (c->health) rpc_server_destroy(c->health);
    if (c->srv) rpc_server_destroy(c->srv);
    store_close(c->st);
    for (int64_t i = 0; i < c->cap_node; i++) free(c->node ? c->node[i] : NULL);
    free(c->node), free(c);
    return rc;
  }
  uv_timer_init(loop, &c->tick);
  c->tick.data = c;
  uv_timer_start(&c->tick, coord_tick_cb, COORD_TICK_MS, COORD_TICK_MS);
  uv_timer_init(loop, &c->beat);
  c->beat.data = c;
  uv_check_init(loop, &c->flush);
  c->flush.data = c;
  uv_check_start(&c->flush, coord_flush_cb);
  c->dirty = c->nodes_changed = 1;
  coord_attempts_settle(c, "before the coordinator restarted");
  /* after: a failure stored before the restart came before the outage */
  coord_outage_mark(c);
  *out = c;
  return FSDP_OK;
}

int coord_port(const coord_t *c) { return rpc_server_port(c->srv); }
int coord_reload_tokens(coord_t *c) { return rpc_server_reload_tokens(c->srv); }
int coord_running_jobs(coord_t *c) {
  int64_t n[STORE_JOB_CANCELLED + 1];
  return store_job_counts(c->st, n) ? -1 : (int)n[STORE_JOB_RUNNING];
}

int coord_nodes_live(const coord_t *c) {
  int n = 0;
  for (int64_t i = 0; i < c->cap_node; i++)
    n += c->node[i] && !c->node[i]->dead && c->node[i]->session;
  return n;
}

int coord_metrics_port(const coord_t *c) { return c->metrics ? metrics_server_port(c->metrics) : 0; }

/* The handles close one after another (tick, beat, flush); the last frees. */
static void coord_free_cb(uv_handle_t *h) {
  coord_t *c = h->data;
  if (!uv_is_closing((uv_handle_t *)&c->beat)) {
    uv_close((uv_handle_t *)&c->beat, coord_free_cb);
    return;
  }
  if (!uv_is_closing((uv_handle_t *)&c->flush)) {
    uv_close((uv_handle_t *)&c->flush, coord_free_cb);
    return;
  }
  for (int64_t i = 0; i < c->cap_node; i++)
    if (c->node[i]) free(c->node[i]->order), free(c->node[i]->sent), free(c->node[i]);
  coord_job_t *x, *tmp;
  HASH_ITER(hh, c->jobs, x, tmp) coord_job_drop(c, x);
  store_nodes_free(c->pic, c->pic_n);
  coord_rank_t *r, *rtmp;
  HASH_ITER(hh, c->ranks, r, rtmp) {
    HASH_DEL(c->ranks, r);
    free(r);
  }
  free(c->node), free(c->held);
  free(c);
}

void coord_destroy(coord_t *c) {
  if (!c) return;
  uv_timer_stop(&c->tick);
  uv_timer_stop(&c->beat);
  uv_check_stop(&c->flush);
  metrics_server_stop(c->metrics); /* before the state it reads goes */
  rpc_server_destroy(c->srv); /* cancel callbacks forget the held calls */
  if (c->health) rpc_server_destroy(c->health);
  coord_export_detach(c);     /* before the store goes: they close later */
  coord_ckpt_detach(c);       /* so do removals still on the pool */
  coord_submit_checks_detach(c);
  for (int i = 0; i < c->n_sub; i++) free(c->sub[i].text); /* their calls were cancelled */
  free(c->sub);
  free(c->dev_mem[0]), free(c->dev_mem[1]);
  coord_hold_t *h, *htmp;
  HASH_ITER(hh, c->holds, h, htmp) {
    HASH_DEL(c->holds, h);
    free(h);
  }
  /* the running ranks' figures, for the next coordinator to show until
   * their heartbeats come (and for good, if their attempt ends meanwhile) */
  coord_ranks_keep(c, 0, 0);
  store_close(c->st);
  uv_close((uv_handle_t *)&c->tick, coord_free_cb);
}

/* End-to-end tests of bin/fsdpctl: the program runs as a process against a
 * FAKE coordinator and a fake Node service served by this test process (the
 * RPC layer on a libuv loop in a thread), whose canned handlers record each
 * request. So the tests check what fsdpctl sends (options, world size,
 * filters, log offsets), what it prints (tables, JSON parsed with jansson,
 * plain watch lines through a pipe) and its exit codes (job outcome, not
 * found, unreachable, unauthenticated, usage), and that an independent
 * Python gRPC client (tests/e2e/python_client.py) can use the same API.
 * Every wait is bounded: fsdpctl is killed after CTL_LIMIT_S. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/rpc.h"
#include "proto/fsdp.pb-c.h"
#include "tests/unit/testutil.h"

#define SVC "/fsdp.v1.Coordinator/"
#define CTL_LIMIT_S 20.0
#define MIB (1024ull * 1024ull)

/* ---- what the fake servers record ------------------------------------------------ */

#define REC_MAX 16
static struct {
  pthread_mutex_t mu;
  char method[REC_MAX][64];
  uint8_t *req[REC_MAX];
  size_t len[REC_MAX];
  int calls[REC_MAX];
  int n;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Keeps the last request of a method, packed (on the loop's thread). */
static void rec_put(const char *method, const ProtobufCMessage *m) {
  pthread_mutex_lock(&R.mu);
  int i = 0;
  while (i < R.n && strcmp(R.method[i], method)) i++;
  if (i == R.n && R.n < REC_MAX) snprintf(R.method[R.n++], sizeof R.method[0], "%s", method);
  if (i < REC_MAX) {
    free(R.req[i]);
    R.len[i] = protobuf_c_message_get_packed_size(m);
    R.req[i] = malloc(R.len[i] + 1);
    protobuf_c_message_pack(m, R.req[i]);
    R.calls[i]++;
  }
  pthread_mutex_unlock(&R.mu);
}

/* The last request of method (short name), unpacked (free it), and how many came. */
static void *rec_get(const char *method, const ProtobufCMessageDescriptor *d, int *calls) {
  void *m = NULL;
  pthread_mutex_lock(&R.mu);
  if (calls) *calls = 0;
  for (int i = 0; i < R.n; i++)
    if (!strcmp(strrchr(R.method[i], '/') + 1, method)) {
      m = protobuf_c_message_unpack(d, NULL, R.len[i], R.req[i]);
      if (calls) *calls = R.calls[i];
    }
  pthread_mutex_unlock(&R.mu);
  cr_assert_not_null(m, "the fake server got no %s request", method);
  return m;
}

/* ---- canned handlers (on the loop's thread) --------------------------------------- */

static int node_port; /* the fake Node service's, for ListNodes */
static int fake_gen;  /* how many times the fake servers started (fake_restart: 2) */
/* GetJob of j-restart: cancelled by the server once while set (as calls in
 * flight are when a coordinator stops), then the job has SUCCEEDED */
static volatile int cancel_once, cancelled;

/* hostile: the servers' strings carry what a terminal acts on (set before
 * fake_start): an OSC that retitles the window, a clear screen, an 8-bit
 * CSI (C1), DEL, a right-to-left override, an OSC 52 that writes the
 * clipboard, cursor moves that would hide the lines above. */
static int hostile;
#define EVIL_HOST "host-\x1b]0;owned\x07"
#define EVIL_NAME "gnp\u202eexe.txt"
#define EVIL_REASON "\x1b[2J\xc2\x9b" "31mred\x7f"
#define EVIL_ERROR "job j-evil: \x1b]52;c;aGk=\x07no such job"
#define EVIL_MESSAGE "rank 0 exited\x1b[1A\x1b[2K"

static void h_submit(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__SubmitJobRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  if (req->spec && !strcmp(req->spec->name, "bad")) {
    rpc_call_finish(call, err_set(FSDP_EINVAL, "model.heads: 5 does not divide channels 64; "
                                  "give heads that divide it\nsteps: \"abc\" is not a number"));
    return;
  }
  if (req->spec && !strcmp(req->spec->name, "locked")) { /* the coordinator's store, busy */
    rpc_call_finish(call, err_set(FSDP_ETIMEDOUT, "state database /var/lib/fsdp/state.db: locked "
                                  "by another connection for over 5000 ms; is another "
                                  "fsdp-coordinator using it?"));
    return;
  }
  Fsdp__V1__Job job = FSDP__V1__JOB__INIT;
  job.job_id = "j-42";
  job.spec = req->spec;
  job.state = FSDP__V1__JOB_STATE__JOB_STATE_PENDING;
  job.reason = "waiting for 2 devices";
  Fsdp__V1__SubmitJobReply rep = FSDP__V1__SUBMIT_JOB_REPLY__INIT;
  rep.job_id = "j-42";
  rep.job = &job;
  char *notes[] = {"seq_len set to the model's context, 64"};
  rep.notes = notes;
  rep.n_notes = 1;
  rpc_call_reply(call, &rep.base);
}

/* j-42: RUNNING at step 40 of 300 with two ranks on n-1. */
static void fill_job(Fsdp__V1__Job *job, Fsdp__V1__JobSpec *spec, Fsdp__V1__RankStatus *rs,
                     Fsdp__V1__RankStatus **rp, const char *id) {
  fsdp__v1__job__init(job);
  fsdp__v1__job_spec__init(spec);
  spec->name = "demo";
  spec->world_size = 2;
  spec->max_restarts = 3;
  job->job_id = (char *)id;
  job->spec = spec;
  job->state = FSDP__V1__JOB_STATE__JOB_STATE_RUNNING;
  job->attempt = 1;
  job->step = 40;
  job->total_steps = 300;
  job->submitted_unix_ms = (int64_t)time(NULL) * 1000 - 180000;
  job->started_unix_ms = (int64_t)time(NULL) * 1000 - 120000;
  for (int r = 0; rs && r < 2; r++) {
    fsdp__v1__rank_status__init(&rs[r]);
    rs[r].job_id = (char *)id;
    rs[r].rank = (uint32_t)r;
    rs[r].node_id = "n-1";
    rs[r].device = (uint32_t)r;
    rs[r].state = FSDP__V1__RANK_STATE__RANK_STATE_RUNNING;
    rs[r].step = 40;
    rs[r].loss = 3.25;
    rs[r].tokens_per_s = 1234;
    rp[r] = &rs[r];
  }
  if (rs) job->ranks = rp, job->n_ranks = 2;
}

static void h_get_job(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__GetJobRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  if (hostile && !strcmp(req->job_id, "j-evil")) {
    rpc_call_finish(call, err_set(FSDP_ENOTFOUND, "%s", EVIL_ERROR));
    return;
  }
  const int restart = !strcmp(req->job_id, "j-restart");
  if (restart && cancel_once) {
    cancel_once = 0, cancelled = 1;
    rpc_call_finish(call, err_set(FSDP_ECANCELED, "the server is stopping"));
    return;
  }
  if (strcmp(req->job_id, "j-42") && strcmp(req->job_id, "j-ok") && strcmp(req->job_id, "j-nan") &&
      strcmp(req->job_id, "j-fresh") && !restart) {
    rpc_call_finish(call, err_set(FSDP_ENOTFOUND, "job %s: no such job; fsdpctl jobs lists them",
                                  req->job_id));
    return;
  }
  Fsdp__V1__Job job;
  Fsdp__V1__JobSpec spec;
  Fsdp__V1__RankStatus rs[2], *rp[2];
  fill_job(&job, &spec, rs, rp, req->job_id);
  if (!strcmp(req->job_id, "j-ok") || (restart && (fake_gen > 1 || cancelled)))
    job.state = FSDP__V1__JOB_STATE__JOB_STATE_SUCCEEDED;
  if (!strcmp(req->job_id, "j-nan")) /* a diverged run: rank 0's loss NaN, rank 1's speed inf */
    rs[0].loss = NAN, rs[1].tokens_per_s = INFINITY;
  if (!strcmp(req->job_id, "j-fresh")) /* rank 1 has reported no step: its zeros are no figures */
    rs[1].unreported = 1, rs[1].step = 0, rs[1].loss = 0, rs[1].tokens_per_s = 0;
  if (hostile) spec.name = EVIL_NAME, job.reason = EVIL_REASON, rs[1].node_id = EVIL_HOST;
  Fsdp__V1__GetJobReply rep = FSDP__V1__GET_JOB_REPLY__INIT;
  rep.job = &job;
  rpc_call_reply(call, &rep.base);
}

/* utf8_jobs: the two jobs' names and j-43's reason in UTF-8 (CJK, accents). */
static int utf8_jobs;
#define CJK_NAME "\u65e5\u672c\u8a9e\u30e2\u30c7\u30eb" /* 6 wide characters: 12 columns, 18 bytes */
#define CJK_REASON "x\u30e1\u30e2\u30ea\u4e0d\u8db3\u3067\u30e9\u30f3\u30af" "1" "\u304c\u7d42" \
                   "\u4e86\u3057\u307e\u3057\u305f\u3001\u518d\u958b\u306f\u624b\u52d5\u3067"

static void h_list_jobs(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  rec_put(rpc_call_method(call), m);
  const Fsdp__V1__ListJobsRequest *req = (const void *)m;
  if (req->limit == 5 || (req->before_id && req->limit < 5)) {
    /* a coordinator with j-1..j-9 whose replies hold 2 jobs each: the
     * newest 2 below before_id, oldest first, and where to go on */
    static Fsdp__V1__Job pj[2];
    static Fsdp__V1__JobSpec ps[2];
    static char pid[2][16];
    Fsdp__V1__Job *jobs[2];
    const int top = req->before_id ? (int)req->before_id - 1 : 9;
    int k = 0;
    for (int id = top - ((int)req->limit < 2 ? (int)req->limit : 2) + 1; id <= top; id++, k++) {
      snprintf(pid[k], sizeof pid[k], "j-%d", id);
      fill_job(&pj[k], &ps[k], NULL, NULL, pid[k]);
      jobs[k] = &pj[k];
    }
    Fsdp__V1__ListJobsReply rep = FSDP__V1__LIST_JOBS_REPLY__INIT;
    rep.jobs = jobs;
    rep.n_jobs = (size_t)k;
    rep.next_before_id = top - k + 1 > 1 ? top - k + 1 : 0;
    rpc_call_reply(call, &rep.base);
    return;
  }
  Fsdp__V1__Job a, b, *jobs[2] = {&a, &b};
  Fsdp__V1__JobSpec sa, sb;
  fill_job(&a, &sa, NULL, NULL, "j-42");
  fill_job(&b, &sb, NULL, NULL, "j-43");
  sb.name = "other";
  b.state = FSDP__V1__JOB_STATE__JOB_STATE_FAILED;
  b.reason = "rank 1 on node n-2 exited with status 1: out of memory";
  b.restarts = 2;
  if (utf8_jobs) sa.name = CJK_NAME, sb.name = "caf\u00e9", b.reason = CJK_REASON;
  if (hostile) sa.name = EVIL_NAME, b.reason = EVIL_REASON;
  Fsdp__V1__ListJobsReply rep = FSDP__V1__LIST_JOBS_REPLY__INIT;
  rep.jobs = jobs;
  rep.n_jobs = 2;
  rpc_call_reply(call, &rep.base);
}

static void h_cancel(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__CancelJobRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  Fsdp__V1__Job job;
  Fsdp__V1__JobSpec spec;
  fill_job(&job, &spec, NULL, NULL, req->job_id);
  job.state = FSDP__V1__JOB_STATE__JOB_STATE_CANCELLED;
  job.reason = req->reason;
  Fsdp__V1__CancelJobReply rep = FSDP__V1__CANCEL_JOB_REPLY__INIT;
  rep.job = &job;
  rpc_call_reply(call, &rep.base);
}

/* j-restart lives through a restart of the fake coordinator (fake_restart):
 * before it, a RUNNING step whose stream stays open, events 1..3 and the
 * job RUNNING; after it, steps 2 and 3 (SUCCEEDED), events 1..6 and the
 * job SUCCEEDED. back_watch and back_events: when the first WatchJob and
 * ListEvents of j-restart came after the restart (0: none yet). */
static double back_watch, back_events;
static void h_restart_cancel(rpc_call_t *call, void *arg) { (void)call, (void)arg; }
static void h_watch_restart(rpc_call_t *call) {
  pthread_mutex_lock(&R.mu);
  if (fake_gen > 1 && !back_watch) back_watch = tu_now_s();
  pthread_mutex_unlock(&R.mu);
  for (int step = fake_gen > 1 ? 2 : 1; step <= (fake_gen > 1 ? 3 : 1); step++) {
    Fsdp__V1__JobProgress p = FSDP__V1__JOB_PROGRESS__INIT;
    p.job_id = "j-restart";
    p.step = step;
    p.total_steps = 3;
    p.state = step == 3 ? FSDP__V1__JOB_STATE__JOB_STATE_SUCCEEDED
                        : FSDP__V1__JOB_STATE__JOB_STATE_RUNNING;
    rpc_call_send(call, &p.base);
  }
  if (fake_gen > 1) rpc_call_finish(call, 0);
  else rpc_call_on_cancel(call, h_restart_cancel, NULL); /* open until the server goes */
}

/* j-flaky: a RUNNING step, then the stream breaks (UNAVAILABLE, as when the
 * coordinator restarts); asked again, the next step and SUCCEEDED. j-down:
 * a RUNNING step, then every stream breaks at once. */
static int watch_flaky_calls, watch_down_calls;
static int h_watch_broken(rpc_call_t *call, const char *job) {
  const int flaky = !strcmp(job, "j-flaky");
  if (!flaky && strcmp(job, "j-down")) return 0;
  const int first = (flaky ? watch_flaky_calls++ : watch_down_calls++) == 0;
  /* each one's first stream: step 1; j-flaky's second: steps 2 and 3 (SUCCEEDED) */
  const int from = first ? 1 : 2, to = first ? 1 : flaky ? 3 : 0;
  for (int step = from; step <= to; step++) {
    Fsdp__V1__JobProgress p = FSDP__V1__JOB_PROGRESS__INIT;
    p.job_id = (char *)job;
    p.step = step;
    p.total_steps = 3;
    p.state = step == 3 ? FSDP__V1__JOB_STATE__JOB_STATE_SUCCEEDED
                        : FSDP__V1__JOB_STATE__JOB_STATE_RUNNING;
    rpc_call_send(call, &p.base);
  }
  rpc_call_finish(call, flaky && !first ? 0 : err_set(FSDP_EUNAVAILABLE, "the coordinator is going away"));
  return 1;
}

/* j-ok: two RUNNING steps then SUCCEEDED; j-nan: the same with a NaN loss;
 * j-fresh: the same, its first step's figures none reported; j-bad: one
 * step then FAILED; j-flaky, j-down: above; else NOT_FOUND. */
static void h_watch(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__WatchJobRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  if (h_watch_broken(call, req->job_id)) return;
  if (!strcmp(req->job_id, "j-restart")) {
    h_watch_restart(call);
    return;
  }
  if (!strcmp(req->job_id, "j-cancel")) { /* an ETA unknown, then one sent with the end */
    for (int i = 1; i <= 2; i++) {
      Fsdp__V1__JobProgress p = FSDP__V1__JOB_PROGRESS__INIT;
      p.job_id = req->job_id;
      p.state = i < 2 ? FSDP__V1__JOB_STATE__JOB_STATE_RUNNING : FSDP__V1__JOB_STATE__JOB_STATE_CANCELLED;
      p.step = i, p.total_steps = 3, p.loss = 4.5, p.tokens_per_s = 100;
      p.eta_s = i < 2 ? 0 : 1962.25;
      rpc_call_send(call, &p.base);
    }
    rpc_call_finish(call, 0);
    return;
  }
  const int nan = !strcmp(req->job_id, "j-nan"), none = !strcmp(req->job_id, "j-fresh");
  int ok = !strcmp(req->job_id, "j-ok") || nan || none;
  if (!ok && strcmp(req->job_id, "j-bad")) {
    rpc_call_finish(call, err_set(FSDP_ENOTFOUND, "job %s: no such job", req->job_id));
    return;
  }
  int n = ok ? 3 : 2;
  for (int i = 1; i <= n; i++) {
    Fsdp__V1__JobProgress p = FSDP__V1__JOB_PROGRESS__INIT;
    p.job_id = req->job_id;
    p.state = i < n ? FSDP__V1__JOB_STATE__JOB_STATE_RUNNING
              : ok  ? FSDP__V1__JOB_STATE__JOB_STATE_SUCCEEDED
                    : FSDP__V1__JOB_STATE__JOB_STATE_FAILED;
    p.attempt = 1;
    p.step = i;
    p.total_steps = 3;
    p.loss = nan ? NAN : 5.0 - i;
    p.tokens_per_s = 1000.0 * i;
    if (none && i == 1) p.unreported = 1, p.loss = 0, p.tokens_per_s = 0;
    p.eta_s = i < n ? 3.0 - i : 0;
    p.message = i == n && !ok ? hostile ? EVIL_MESSAGE : "rank 0 exited with status 1" : "";
    rpc_call_send(call, &p.base);
  }
  rpc_call_finish(call, 0);
}

static void h_memory(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  rec_put(rpc_call_method(call), m);
  Fsdp__V1__MemoryCategory cat[2][2], *cp[2][2];
  Fsdp__V1__RankStatus rs[2], *rp[2];
  static const char *const names[2] = {"params", "optimizer"};
  for (int r = 0; r < 2; r++) {
    for (int k = 0; k < 2; k++) {
      fsdp__v1__memory_category__init(&cat[r][k]);
      cat[r][k].name = (char *)names[k];
      cat[r][k].planned_bytes = (uint64_t)(k + 1) * 4 * MIB;
      cat[r][k].current_bytes = (uint64_t)(k + 1) * 2 * MIB;
      cat[r][k].peak_bytes = (uint64_t)(k + 1) * 3 * MIB + (uint64_t)r * MIB / 2;
      cp[r][k] = &cat[r][k];
    }
    fsdp__v1__rank_status__init(&rs[r]);
    rs[r].job_id = "j-42";
    rs[r].rank = (uint32_t)r;
    rs[r].node_id = "n-1";
    rs[r].memory = cp[r];
    rs[r].n_memory = 2;
    rp[r] = &rs[r];
  }
  Fsdp__V1__GetMemoryStatsReply rep = FSDP__V1__GET_MEMORY_STATS_REPLY__INIT;
  rep.ranks = rp;
  rep.n_ranks = 2;
  Fsdp__V1__MemoryCategory *pp[2] = {&cat[0][0], &cat[0][1]};
  rep.plan = pp, rep.n_plan = 2;
  const Fsdp__V1__GetMemoryStatsRequest *q = (const void *)m;
  if (!strcmp(q->job_id, "j-43")) rep.n_ranks = 0; /* pending: the plan alone */
  rpc_call_reply(call, &rep.base);
}

static void h_checkpoints(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  rec_put(rpc_call_method(call), m);
  Fsdp__V1__ListCheckpointsReply rep = FSDP__V1__LIST_CHECKPOINTS_REPLY__INIT;
  rpc_call_reply(call, &rep.base);
}

/* nodes_paged: the listing comes in two pages, n-1 then n-2 (host-b). */
static int nodes_paged;
static void h_nodes(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  rec_put(rpc_call_method(call), m);
  const Fsdp__V1__ListNodesRequest *req = (const void *)m;
  Fsdp__V1__Device dev[2], *dp[2];
  for (int i = 0; i < 2; i++) {
    fsdp__v1__device__init(&dev[i]);
    dev[i].index = (uint32_t)i;
    dev[i].kind = "cpu";
    dev[i].total_bytes = 8ull << 30;
    dev[i].used_bytes = i ? 0 : 1ull << 30;
    dev[i].job_id = i ? "" : "j-42";
    dp[i] = &dev[i];
  }
  char addr[32];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", node_port);
  Fsdp__V1__NodeInfo node = FSDP__V1__NODE_INFO__INIT, *np = &node;
  node.node_id = "n-1";
  node.hostname = "host-a";
  node.address = addr;
  node.state = FSDP__V1__NODE_STATE__NODE_STATE_ALIVE;
  node.last_heartbeat_unix_ms = (int64_t)time(NULL) * 1000 - 3000;
  node.devices = dp;
  node.n_devices = 2;
  Fsdp__V1__ListNodesReply rep = FSDP__V1__LIST_NODES_REPLY__INIT;
  rep.nodes = &np;
  rep.n_nodes = 1;
  if (nodes_paged && req->after_id == 0) rep.next_after_id = 1;
  if (nodes_paged && req->after_id == 1) /* its fsdpd stopped: nothing of it is free */
    node.node_id = "n-2", node.hostname = "host-b", node.state = FSDP__V1__NODE_STATE__NODE_STATE_STOPPED;
  if (hostile) node.hostname = EVIL_HOST;
  rpc_call_reply(call, &rep.base);
}

/* DrainNode: n-1 drained (or undrained) as asked; another id NOT_FOUND. */
static void h_drain(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__DrainNodeRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  if (strcmp(req->node_id, "n-1")) {
    rpc_call_finish(call, err_set(FSDP_ENOTFOUND, "node %s: no such node", req->node_id));
    return;
  }
  Fsdp__V1__Device dev = FSDP__V1__DEVICE__INIT, *dp = &dev;
  dev.kind = "cpu", dev.job_id = "j-42";
  Fsdp__V1__NodeInfo node = FSDP__V1__NODE_INFO__INIT;
  node.node_id = "n-1", node.hostname = "host-a";
  node.drain_reason = req->undrain ? "" : hostile ? EVIL_REASON : req->reason;
  node.devices = &dp, node.n_devices = 1;
  Fsdp__V1__DrainNodeReply rep = FSDP__V1__DRAIN_NODE_REPLY__INIT;
  rep.node = &node;
  rpc_call_reply(call, &rep.base);
}

/* ListEvents, as the coordinator pages them. "" and j-42: five events, one
 * a node's. j-ok (SUCCEEDED in GetJob): EV_OK events, of which the first
 * call sees ev_first (2 unless a test sets it) and later calls all (they
 * arrive while fsdpctl follows); the first 1000 name a node, the rest none. */
#define EV_OK 1003
static int64_t ev_first = 2;
static void h_events(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__ListEventsRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  static int calls;
  const int ok = !strcmp(req->job_id, "j-ok"), restart = !strcmp(req->job_id, "j-restart");
  pthread_mutex_lock(&R.mu);
  if (restart && fake_gen > 1 && !back_events) back_events = tu_now_s();
  pthread_mutex_unlock(&R.mu);
  if (!ok && *req->job_id && strcmp(req->job_id, "j-42") && !restart) {
    rpc_call_finish(call, err_set(FSDP_ENOTFOUND, "job %s: no such job", req->job_id));
    return;
  }
  const int64_t visible = ok ? (calls++ ? EV_OK : ev_first) : restart ? 3 + 3 * (fake_gen > 1) : 5;
  const int64_t limit = req->limit ? req->limit : 100;
  int64_t first = req->after_id + 1, last = req->after_id + limit;
  if (!req->after_id && !req->follow) first = visible - limit + 1, last = visible; /* the newest */
  if (first < 1) first = 1;
  if (last > visible) last = visible;
  static Fsdp__V1__Event ev[EV_OK];
  static Fsdp__V1__Event *ep[EV_OK];
  static char text[EV_OK][24];
  static const char *const kinds[5] = {"node.registered", "job.submitted", "attempt.started",
                                       "rank.exited", "attempt.ended"};
  size_t n = 0;
  for (int64_t id = first; id <= last; id++, n++) {
    Fsdp__V1__Event *e = &ev[n];
    fsdp__v1__event__init(e);
    e->id = id;
    e->unix_ms = 1700000000000 + id * 1000;
    e->job_id = ok ? "j-ok" : restart ? "j-restart" : id == 1 ? "" : "j-42";
    e->node_id = !ok && id == 1 ? "n-1" : ok && id <= 1000 ? "n-12345" : "";
    e->kind = ok || restart ? "test.tick" : (char *)kinds[id - 1];
    snprintf(text[n], sizeof text[n], "e%lld", (long long)id);
    e->text = text[n];
    ep[n] = e;
  }
  Fsdp__V1__ListEventsReply rep = FSDP__V1__LIST_EVENTS_REPLY__INIT;
  rep.events = ep;
  rep.n_events = n;
  rpc_call_reply(call, &rep.base);
}

/* ExportCheckpoint. j-42: "hello world\n" of step 7 in two pieces, and when
 * export_race names a file, that file is created ("theirs\n") between them,
 * as by someone else while fsdpctl exports. j-short: 6 bytes of the 10 it
 * announces. j-stall: one piece, then nothing (the call stays open). */
static char export_race[1100];
static void h_export_cancel(rpc_call_t *call, void *arg) { (void)call, (void)arg; }
static void h_export(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__ExportCheckpointRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  static const char *const pieces[] = {"hello ", "world\n"};
  const int stall = !strcmp(req->job_id, "j-stall"), short_ = !strcmp(req->job_id, "j-short");
  uint64_t off = 0;
  for (int i = 0; i < 2; i++) {
    Fsdp__V1__ExportChunk ch = FSDP__V1__EXPORT_CHUNK__INIT;
    ch.offset = off;
    ch.data.data = (uint8_t *)pieces[i];
    ch.data.len = strlen(pieces[i]);
    ch.total_bytes = stall ? 100 : short_ ? 10 : 12;
    ch.step = 7;
    off += ch.data.len;
    rpc_call_send(call, &ch.base);
    if (stall) {
      rpc_call_on_cancel(call, h_export_cancel, NULL);
      return;
    }
    if (short_) break;
    if (!i && export_race[0]) tu_write_file(export_race, "theirs\n", 7);
  }
  rpc_call_finish(call, 0);
}

/* While set, the Node service's streams lapse as fsdpd's do when their
 * ticket expires: each takes only the newest ticket, and one followed from
 * the start ends ABORTED after two lines (loop thread only). */
static int logs_lapse, tickets_made;
/* With logs_lapse: GetLogTicket answers UNAVAILABLE this many times after
 * the first ticket (the coordinator restarting), and the lapsed ticket is
 * refused (EAUTH, "expired") until a fresh one is made (loop thread only). */
static int tickets_away, ticket_lapsed;
static int logs_refuse; /* the Node service refuses every ticket (EAUTH) */
/* The Node service holds a stream followed from the start open after two
 * chunks (until the node goes: fake_node_restart), as fsdpd does while the
 * rank runs; its chunks say they are attempt 1's (loop thread only). */
static int logs_hold;
/* The node comes back on a port of its own, not the one it had (set before
 * the flip that brings it back; the loop's thread reads it). */
static volatile int node_move;
static void h_logs_cancel(rpc_call_t *call, void *arg) { (void)call, (void)arg; }

/* GetLogTicket: a ticket naming what it is for, which h_logs checks (and
 * which one it is, when logs_lapse). */
static void h_ticket(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__GetLogTicketRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  char t[160];
  if (tickets_away && tickets_made >= 1) {
    tickets_away--;
    rpc_call_finish(call, err_set(FSDP_EUNAVAILABLE, "the coordinator is restarting"));
    return;
  }
  snprintf(t, sizeof t, "ticket:%s:%s:%u", req->node_id, req->job_id, req->rank);
  if (logs_lapse) snprintf(t + strlen(t), sizeof t - strlen(t), ":%d", ++tickets_made);
  Fsdp__V1__GetLogTicketReply rep = FSDP__V1__GET_LOG_TICKET_REPLY__INIT;
  rep.ticket = t;
  rpc_call_reply(call, &rep.base);
}

/* Whether the last GetRankLogs carried a token the node would take as a
 * user's (it must not: the node's operator could use it at the coordinator). */
static int logs_got_user_token;
static int fake_user_token; /* the fake servers check tokens */

/* The Node service: three chunks of the log, in order. Followed from the
 * start, the stream breaks (UNAVAILABLE; with logs_lapse, its ticket lapses:
 * ABORTED) after two; followed from an offset, it goes on from the line
 * there and ends. Open at the RPC layer, as fsdpd's: it wants the ticket
 * h_ticket made for this node (n-1). */
static void h_logs(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__GetRankLogsRequest *req = (const void *)m;
  rec_put(rpc_call_method(call), m);
  logs_got_user_token = fake_user_token && rpc_call_auth(call, RPC_ROLE_USER) == 0;
  char want[160];
  snprintf(want, sizeof want, "ticket:n-1:%s:%u", req->job_id, req->rank);
  if (logs_lapse) snprintf(want + strlen(want), sizeof want - strlen(want), ":%d", tickets_made);
  if (strcmp(req->ticket, want)) {
    rpc_call_finish(call, err_set(FSDP_EAUTH, "ticket \"%s\", wanted \"%s\"", req->ticket, want));
    return;
  }
  if (logs_refuse) {
    rpc_call_finish(call, err_set(FSDP_EAUTH, "GetRankLogs: the log ticket expired"));
    return;
  }
  if (ticket_lapsed && ticket_lapsed == tickets_made) {
    rpc_call_finish(call, err_set(FSDP_EAUTH, "GetRankLogs: the log ticket expired"));
    return;
  }
  static const char *const plain[] = {"step 1 loss 5.0\n", "step 2 loss 4.0\n", "step 3 loss 3.0\n"};
  /* hostile: an escape sequence, an "\u00e9" cut between two chunks, a CRLF
   * cut between two, and a progress bar's returns */
  static const char *const evil[] = {"\x1b]0;log\x07 caf\xc3", "\xa9\tok\r", "\n10%\r50%\rend\n"};
  const char *const *lines = hostile ? evil : plain;
  const int breaks = req->follow && req->offset <= 0;
  /* where fsdpd starts: an offset past the end is the end, a negative one
   * that many bytes before it */
  int64_t off = 0, size = 0, start;
  for (int i = 0; i < 3; i++) size += (int64_t)strlen(lines[i]);
  start = req->offset >= 0 ? (req->offset < size ? req->offset : size)
                           : (size + req->offset > 0 ? size + req->offset : 0);
  if (start == size && req->offset > size) { /* from the end: an empty chunk says where */
    Fsdp__V1__LogChunk c = FSDP__V1__LOG_CHUNK__INIT;
    c.offset = size;
    rpc_call_send(call, &c.base);
    /* followed, the first such stream breaks: the next must start there */
    static int broke;
    rpc_call_finish(call, req->follow && !broke++ ? err_set(FSDP_EUNAVAILABLE, "the connection was lost") : 0);
    return;
  }
  for (int i = 0; i < 3; i++) {
    Fsdp__V1__LogChunk c = FSDP__V1__LOG_CHUNK__INIT;
    c.offset = off;
    c.attempt = logs_hold;
    c.data.data = (uint8_t *)lines[i];
    c.data.len = strlen(lines[i]);
    off += (int64_t)c.data.len;
    if (c.offset + (int64_t)c.data.len <= start) continue;
    if (breaks && i == 2 && logs_hold) {
      rpc_call_on_cancel(call, h_logs_cancel, NULL);
      return;
    }
    if (breaks && i == 2) {
      if (logs_lapse) ticket_lapsed = tickets_made;
      rpc_call_finish(call, logs_lapse ? err_set(FSDP_ESTALE, "job %s rank %u: the log stream "
                                                 "ended, its log ticket expired; resume at byte "
                                                 "%lld", req->job_id, req->rank,
                                                 (long long)c.offset)
                                       : err_set(FSDP_EUNAVAILABLE, "the connection was lost"));
      return;
    }
    rpc_call_send(call, &c.base);
  }
  rpc_call_finish(call, 0);
}

/* ---- the fake servers, on a loop in a thread of the test --------------------------- */

static struct {
  pthread_t thread;
  uv_loop_t loop;
  uv_async_t wake;
  uv_async_t node_flip; /* the node stops, or starts again on its port */
  int node_flips;       /* done (F.mu) */
  int node_hold;        /* while the node is down: a socket bound to its port, not listening */
  rpc_server_t *coord, *node;
  rpc_server_opts_t opts;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ready, rc, port, started;
  int node_plain; /* the node serves without the coordinator's TLS */
  char err[1024];
} F = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void stop_cb(uv_async_t *a) {
  (void)a;
  rpc_server_destroy(F.coord);
  if (F.node) rpc_server_destroy(F.node);
  if (F.node_hold >= 0) close(F.node_hold);
  F.node_hold = -1;
  uv_close((uv_handle_t *)&F.wake, NULL);
  uv_close((uv_handle_t *)&F.node_flip, NULL);
}

/* The fake Node service on addr, with F.opts' tokens, in F.node. */
static int node_serve(const char *addr) {
  rpc_server_opts_t no = F.opts; /* the node: the same tokens, its own port */
  no.addr = addr;
  if (F.node_plain) no.tls_cert_file = no.tls_key_file = NULL;
  const rpc_method_t logs = {"/fsdp.v1.Node/GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor,
                             &fsdp__v1__log_chunk__descriptor, 1, 0, h_logs, NULL};
  int rc = rpc_server_create(&F.node, &F.loop, &no);
  if (!rc) rc = rpc_server_add(F.node, &logs);
  if (!rc) rc = rpc_server_start(F.node);
  return rc;
}

/* The node alone goes (its streams end as a killed fsdpd's do), or comes
 * back on the port it had, as fsdpd restarts. While it is down its port is
 * held by a socket that does not listen (a connect is refused, as to a
 * stopped fsdpd), so that no other socket of the test run takes it. */
static void node_flip_cb(uv_async_t *a) {
  (void)a;
  int rc = 0;
  if (F.node) {
    rpc_server_destroy(F.node);
    F.node = NULL;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)node_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    F.node_hold = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (F.node_hold >= 0 &&
        (setsockopt(F.node_hold, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
         bind(F.node_hold, (struct sockaddr *)&sa, sizeof sa)))
      rc = err_set(FSDP_EIO, "holding port %d: %s", node_port, strerror(errno));
  } else if (node_move) { /* on another port (fsdpd's --listen 127.0.0.1:0); the old one refuses */
    rc = node_serve("127.0.0.1:0");
    if (!rc) node_port = rpc_server_port(F.node); /* what ListNodes says from now on */
  } else {
    if (F.node_hold >= 0) close(F.node_hold);
    F.node_hold = -1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", node_port);
    rc = node_serve(addr);
  }
  pthread_mutex_lock(&F.mu);
  F.rc = rc;
  snprintf(F.err, sizeof F.err, "%s", rc ? err_msg() : "");
  F.node_flips++;
  pthread_cond_broadcast(&F.cv);
  pthread_mutex_unlock(&F.mu);
}

#define U RPC_ROLE_USER
static int add_coordinator(rpc_server_t *s) {
  const rpc_method_t m[] = {
      {SVC "SubmitJob", &fsdp__v1__submit_job_request__descriptor,
       &fsdp__v1__submit_job_reply__descriptor, 0, U, h_submit, NULL},
      {SVC "GetJob", &fsdp__v1__get_job_request__descriptor, &fsdp__v1__get_job_reply__descriptor,
       0, U, h_get_job, NULL},
      {SVC "ListJobs", &fsdp__v1__list_jobs_request__descriptor,
       &fsdp__v1__list_jobs_reply__descriptor, 0, U, h_list_jobs, NULL},
      {SVC "CancelJob", &fsdp__v1__cancel_job_request__descriptor,
       &fsdp__v1__cancel_job_reply__descriptor, 0, U, h_cancel, NULL},
      {SVC "WatchJob", &fsdp__v1__watch_job_request__descriptor,
       &fsdp__v1__job_progress__descriptor, 1, U, h_watch, NULL},
      {SVC "GetMemoryStats", &fsdp__v1__get_memory_stats_request__descriptor,
       &fsdp__v1__get_memory_stats_reply__descriptor, 0, U, h_memory, NULL},
      {SVC "ListCheckpoints", &fsdp__v1__list_checkpoints_request__descriptor,
       &fsdp__v1__list_checkpoints_reply__descriptor, 0, U, h_checkpoints, NULL},
      {SVC "ListNodes", &fsdp__v1__list_nodes_request__descriptor,
       &fsdp__v1__list_nodes_reply__descriptor, 0, U, h_nodes, NULL},
      {SVC "ListEvents", &fsdp__v1__list_events_request__descriptor,
       &fsdp__v1__list_events_reply__descriptor, 0, U, h_events, NULL},
      {SVC "DrainNode", &fsdp__v1__drain_node_request__descriptor,
       &fsdp__v1__drain_node_reply__descriptor, 0, U, h_drain, NULL},
      {SVC "GetLogTicket", &fsdp__v1__get_log_ticket_request__descriptor,
       &fsdp__v1__get_log_ticket_reply__descriptor, 0, U, h_ticket, NULL},
      {SVC "ExportCheckpoint", &fsdp__v1__export_checkpoint_request__descriptor,
       &fsdp__v1__export_chunk__descriptor, 1, U, h_export, NULL},
  };
  return rpc_server_add_all(s, m, sizeof m / sizeof m[0]);
}

static void *server_thread(void *arg) {
  (void)arg;
  uv_loop_init(&F.loop);
  uv_async_init(&F.loop, &F.wake, stop_cb);
  uv_async_init(&F.loop, &F.node_flip, node_flip_cb);
  F.node = NULL, F.node_hold = -1;
  int rc = rpc_server_create(&F.coord, &F.loop, &F.opts);
  if (!rc) rc = add_coordinator(F.coord);
  if (!rc) rc = rpc_server_start(F.coord);
  if (!rc) rc = node_serve("127.0.0.1:0");
  pthread_mutex_lock(&F.mu);
  F.rc = rc;
  F.port = rc ? 0 : rpc_server_port(F.coord);
  node_port = rc ? 0 : rpc_server_port(F.node);
  snprintf(F.err, sizeof F.err, "%s", err_msg());
  F.ready = 1;
  pthread_cond_broadcast(&F.cv);
  pthread_mutex_unlock(&F.mu);
  if (rc) {
    if (F.coord) rpc_server_destroy(F.coord);
    if (F.node) rpc_server_destroy(F.node);
    uv_close((uv_handle_t *)&F.wake, NULL);
    uv_close((uv_handle_t *)&F.node_flip, NULL);
  }
  uv_run(&F.loop, UV_RUN_DEFAULT); /* until stop_cb closes the wake handle */
  uv_loop_close(&F.loop);
  return NULL;
}

static char coord_addr[64];
static void fake_run(void);

/* Starts both fake servers (tokens: user and node token files, or NULL)
 * and points FSDP_COORDINATOR at the coordinator. */
static void fake_start_tls(const char *user_token, const char *node_token, const char *cert,
                           const char *key, int node_plain) {
  memset(&F.opts, 0, sizeof F.opts);
  F.opts.addr = "127.0.0.1:0";
  F.opts.user_token_file = user_token;
  F.opts.node_token_file = node_token;
  F.opts.tls_cert_file = cert;
  F.opts.tls_key_file = key;
  F.node_plain = node_plain;
  fake_user_token = user_token != NULL;
  fake_run();
}

/* Starts the fake servers with F.opts. */
static void fake_run(void) {
  F.ready = 0; /* a test may start them again after fake_stop */
  fake_gen++;
  pthread_create(&F.thread, NULL, server_thread, NULL);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&F.mu);
  while (!F.ready)
    if (pthread_cond_timedwait(&F.cv, &F.mu, &until)) break;
  int ready = F.ready;
  pthread_mutex_unlock(&F.mu);
  cr_assert(ready, "the fake servers did not start within 10 s");
  if (F.rc) pthread_join(F.thread, NULL);
  cr_assert_eq(F.rc, 0, "fake servers: %s", F.err);
  F.started = 1;
  snprintf(coord_addr, sizeof coord_addr, "127.0.0.1:%d", F.port);
  setenv("FSDP_COORDINATOR", coord_addr, 1);
  unsetenv("FSDP_TOKEN_FILE");
}

static void fake_start(const char *user_token, const char *node_token) {
  fake_start_tls(user_token, node_token, NULL, NULL, 0);
}

static void fake_stop(void) {
  if (!F.started) return;
  F.started = 0;
  uv_async_send(&F.wake);
  pthread_join(F.thread, NULL);
}

/* Stops the fake servers and starts them again as they were away_s later,
 * the coordinator on its port, as a coordinator restarts; returns once it
 * serves: the time then. */
static double fake_restart(double away_s) {
  static char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", F.port);
  fake_stop();
  nanosleep(&(struct timespec){(time_t)away_s, (long)((away_s - (time_t)away_s) * 1e9)}, NULL);
  F.opts.addr = listen;
  fake_run();
  cr_assert_str_eq(coord_addr, listen, "the coordinator came back on another port");
  return tu_now_s();
}

/* The fake node stops (its streams broken) or starts again on its port,
 * the coordinator serving on; returns once done. */
static void fake_node_flip(void) {
  pthread_mutex_lock(&F.mu);
  const int want = F.node_flips + 1;
  pthread_mutex_unlock(&F.mu);
  uv_async_send(&F.node_flip);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&F.mu);
  while (F.node_flips < want)
    if (pthread_cond_timedwait(&F.cv, &F.mu, &until)) break;
  const int done = F.node_flips >= want, rc = F.rc;
  pthread_mutex_unlock(&F.mu);
  cr_assert(done, "the fake node did not stop or start within 10 s");
  cr_assert_eq(rc, 0, "the fake node: %s", F.err);
}

/* ---- running fsdpctl ---------------------------------------------------------------- */

#define OUT_MAX (256 * 1024)
static char out[OUT_MAX], err[OUT_MAX];
static double ctl_seconds;
static const char *ctl_stdout_file; /* non-NULL: fsdpctl's stdout is this file, not out */

/* Runs bin/fsdpctl with args (NULL-terminated), stdout and stderr into
 * out and err (pipes: not a terminal); returns its exit status. Killed after
 * CTL_LIMIT_S (a failure). */
static int ctl(const char *const *args) {
  const char *argv[64] = {"fsdpctl"};
  int n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  char bin[1024];
  snprintf(bin, sizeof bin, "%s/bin/fsdpctl", tu_root());
  cr_assert_eq(access(bin, X_OK), 0, "%s is not there: build it first (make)", bin);
  int po[2], pe[2];
  cr_assert_eq(pipe(po), 0);
  cr_assert_eq(pipe(pe), 0);
  double t0 = tu_now_s();
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (!pid) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]), close(pe[0]), close(po[1]), close(pe[1]);
    if (ctl_stdout_file) {
      int fd = open(ctl_stdout_file, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || dup2(fd, 1) < 0) _exit(127);
    }
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  close(po[1]), close(pe[1]);
  size_t no = 0, ne = 0;
  struct pollfd p[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_ = 2;
  while (open_ && tu_now_s() - t0 < CTL_LIMIT_S) {
    if (poll(p, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; i++) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char *buf = i ? err : out;
      size_t *k = i ? &ne : &no;
      ssize_t r = read(p[i].fd, buf + *k, OUT_MAX - 1 - *k);
      if (r > 0) *k += (size_t)r;
      if (r <= 0 || *k == OUT_MAX - 1) close(p[i].fd), p[i].fd = -1, open_--;
    }
  }
  out[no] = 0, err[ne] = 0;
  for (int i = 0; i < 2; i++)
    if (p[i].fd >= 0) close(p[i].fd);
  int st = 0;
  if (open_) kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  ctl_seconds = tu_now_s() - t0;
  cr_assert(!open_, "fsdpctl ran past %.0f s; stdout: %s stderr: %s", CTL_LIMIT_S, out, err);
  cr_assert(WIFEXITED(st), "fsdpctl died of signal %d; stderr: %s", WTERMSIG(st), err);
  return WEXITSTATUS(st);
}
#define CTL(...) ctl((const char *const[]){__VA_ARGS__, NULL})

static json_t *parse_json(const char *text) {
  json_error_t e;
  json_t *j = json_loads(text, 0, &e);
  cr_assert_not_null(j, "not one JSON document (%s at line %d): %s", e.text, e.line, text);
  return j;
}

static void expect_in(const char *hay, const char *needle) {
  cr_assert(strstr(hay, needle), "\"%s\" is not in:\n%s", needle, hay);
}

static char *write_tmp(const char *name, const char *text) {
  char *p = tu_path(name);
  tu_write_file(p, text, strlen(text));
  return p;
}

/* ---- submit ---------------------------------------------------------------------------- */

TestSuite(fsdpctl, .fini = fake_stop, .timeout = 30 * TU_SLOW);

static void expect_opt(const Fsdp__V1__JobSpec *s, size_t i, const char *sec, const char *key,
                       const char *val) {
  cr_assert_lt(i, s->n_options, "option %zu (%s) missing: %zu sent", i, key, s->n_options);
  const Fsdp__V1__Option *o = s->options[i];
  cr_assert(!strcmp(o->section, sec) && !strcmp(o->key, key) && !strcmp(o->value, val),
            "option %zu: [%s] %s = \"%s\", expected [%s] %s = \"%s\"", i, o->section, o->key,
            o->value, sec, key, val);
}

Test(fsdpctl, submit_sends_the_job_file_with_the_flags_on_top) {
  fake_start(NULL, NULL);
  char *job = write_tmp("job.conf", "; a job file as fsdp-train reads it\n"
                                    "[model]\nmodel = tiny\nlayers = 3\n"
                                    "[train]\nsteps = 10\nbatch = 2\n"
                                    "[shard]\nstrategy = FULL_SHARD\nmesh = 1x2\n"
                                    "[output]\nsample_prompt = \"  hi  \"\n");
  int rc = CTL("submit", "--steps", "20", job, "--set", "shard.strategy=SHARD_GRAD_OP", "--lr=0.01",
               "--name", "demo", "--max-restarts", "2");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_str_eq(out, "j-42\n");
  expect_in(err, "note: seq_len set to the model's context, 64");
  Fsdp__V1__SubmitJobRequest *req = rec_get("SubmitJob", &fsdp__v1__submit_job_request__descriptor, NULL);
  const Fsdp__V1__JobSpec *s = req->spec;
  cr_assert_not_null(s);
  cr_assert_str_eq(s->name, "demo");
  cr_assert_eq(s->world_size, 2, "the mesh 1x2 makes 2 ranks, got %u", s->world_size);
  cr_assert_eq(s->max_restarts, 2);
  /* the file in its order less the keys a flag overrides, then the flags in theirs */
  expect_opt(s, 0, "model", "model", "tiny");
  expect_opt(s, 1, "model", "layers", "3");
  expect_opt(s, 2, "train", "batch", "2");
  expect_opt(s, 3, "shard", "mesh", "1x2");
  expect_opt(s, 4, "output", "sample_prompt", "  hi  ");
  expect_opt(s, 5, "", "steps", "20");
  expect_opt(s, 6, "shard", "strategy", "SHARD_GRAD_OP");
  expect_opt(s, 7, "", "lr", "0.01");
  cr_assert_eq(s->n_options, 8, "%zu options sent", s->n_options);
  cr_assert_eq(strlen(req->request_id), 32, "request id \"%s\"", req->request_id);
  char first[40];
  snprintf(first, sizeof first, "%s", req->request_id);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  free(job);

  /* --ranks wins over nothing; a --mesh flag alone gives R*S; each submit its own key */
  cr_assert_eq(CTL("submit", "--ranks", "4", "--model", "tiny"), 0, "%s", err);
  req = rec_get("SubmitJob", &fsdp__v1__submit_job_request__descriptor, NULL);
  cr_assert_eq(req->spec->world_size, 4);
  cr_assert_eq(req->spec->n_options, 1);
  expect_opt(req->spec, 0, "", "model", "tiny");
  cr_assert_str_neq(req->request_id, first, "two submits share a request id");
  protobuf_c_message_free_unpacked(&req->base, NULL);
  cr_assert_eq(CTL("submit", "--mesh", "2x3"), 0, "%s", err);
  req = rec_get("SubmitJob", &fsdp__v1__submit_job_request__descriptor, NULL);
  cr_assert_eq(req->spec->world_size, 6);
  protobuf_c_message_free_unpacked(&req->base, NULL);

  /* a line too long for libinih is refused, not cut into two options */
  char longline[400];
  snprintf(longline, sizeof longline, "[output]\nsample_prompt = %0183d%s\n", 0,
           "save = /elsewhere/x.bin");
  char *bad = write_tmp("long.conf", longline);
  rc = CTL("submit", bad);
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "long.conf:2: longer than 199 characters");
  free(bad);
}

/* --request-id: every retry of one submit (a Kubernetes Job's second pod)
 * sends the id it is given, so the coordinator, which keeps the first job
 * made under an id, gives it that job instead of a second one. An id the
 * coordinator would refuse is refused here, before any call. */
Test(fsdpctl, a_retried_submit_sends_the_request_id_it_is_given) {
  fake_start(NULL, NULL);
  const char *uid = "0f4c5a4e-6a3b-4d8e-9a43-2b0d6c1e7f10";
  int calls = 0;
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(CTL("submit", "--ranks", "1", "--request-id", uid), 0, "%s", err);
    Fsdp__V1__SubmitJobRequest *req =
        rec_get("SubmitJob", &fsdp__v1__submit_job_request__descriptor, &calls);
    cr_assert_str_eq(req->request_id, uid, "try %d", i);
    cr_assert_eq(calls, i + 1);
    /* the option is the submit's, not a job option named request-id */
    cr_assert_eq(req->spec->n_options, 0, "%zu options", req->spec->n_options);
    protobuf_c_message_free_unpacked(&req->base, NULL);
  }
  cr_assert_eq(CTL("submit", "--ranks", "1", "--request-id=k8s-1"), 0, "%s", err);
  Fsdp__V1__SubmitJobRequest *req = rec_get("SubmitJob", &fsdp__v1__submit_job_request__descriptor, &calls);
  cr_assert_str_eq(req->request_id, "k8s-1");
  protobuf_c_message_free_unpacked(&req->base, NULL);

  /* refused as the coordinator refuses it: empty (a Job's label the
   * cluster does not set), too long, a control character, not UTF-8 */
  char long_id[80];
  memset(long_id, 'a', 64), long_id[64] = 0;
  const struct { const char *id, *why; } bad[] = {
      {"", "--request-id: empty"},
      {long_id, "--request-id: 64 bytes; at most 63"},
      {"job\x1b[2J", "a control character (U+001B)"},
      {"caf\xe9", "not UTF-8 at byte 3"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = CTL("submit", "--ranks", "1", "--request-id", bad[i].id);
    cr_assert_eq(rc, 2, "id %zu: exit %d: %s", i, rc, err);
    expect_in(err, bad[i].why);
  }
  memset(long_id, 'a', 63), long_id[63] = 0; /* the longest the coordinator keeps */
  cr_assert_eq(CTL("submit", "--ranks", "1", "--request-id", long_id), 0, "%s", err);
  req = rec_get("SubmitJob", &fsdp__v1__submit_job_request__descriptor, &calls);
  cr_assert_str_eq(req->request_id, long_id);
  cr_assert_eq(calls, 4, "a refused id reached the coordinator: %d submits", calls);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

Test(fsdpctl, submit_json_and_a_refusal) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("--output", "json", "submit", "--ranks", "2", "--steps", "5"), 0, "%s", err);
  json_t *j = parse_json(out);
  cr_assert_str_eq(json_string_value(json_object_get(j, "job_id")), "j-42");
  json_t *job = json_object_get(j, "job");
  cr_assert_str_eq(json_string_value(json_object_get(job, "state")), "PENDING");
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(job, "spec"), "world_size")), 2);
  cr_assert_eq(json_array_size(json_object_get(j, "notes")), 1);
  json_decref(j);
  /* the coordinator refuses: INVALID_ARGUMENT is 2, with its sentence */
  int rc = CTL("submit", "--ranks", "1", "--name", "bad");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  cr_assert(!strncmp(err, "fsdpctl: ", 9), "%s", err);
  expect_in(err, "model.heads: 5 does not divide channels 64");
  cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "more than one line: %s", err);
  /* its problems numbered, where one's own words hold "; " (they were run
   * together by a space), and the job file named */
  expect_in(err, "(1) ");
  expect_in(err, "give heads that divide it (2) steps: \"abc\" is not a number");
  char *jf = write_tmp("refused.conf", "[train]\nsteps = 5\n");
  rc = CTL("submit", jf, "--ranks", "1", "--name", "bad");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "submitting the job of ");
  expect_in(err, "refused.conf (and the command line's options): ");
  free(jf);
}

/* ---- tables and JSON of the listing commands --------------------------------------------- */

Test(fsdpctl, jobs_table_json_and_state_filter) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("jobs", "--state", "running", "--state", "FAILED"), 0, "%s", err);
  expect_in(out, "JOB");
  expect_in(out, "REASON");
  expect_in(out, "j-42");
  expect_in(out, "RUNNING");
  expect_in(out, "40/300");
  expect_in(out, "3m");
  expect_in(out, "rank 1 on node n-2 exited with status 1: out of memory"); /* a pipe: not cut */
  /* aligned: the STATE column starts at the same place on every line */
  const char *h = strstr(out, "STATE"), *l2 = strchr(out, '\n') + 1;
  cr_assert_eq(strstr(l2, "RUNNING") - l2, h - out, "columns do not line up:\n%s", out);
  Fsdp__V1__ListJobsRequest *req = rec_get("ListJobs", &fsdp__v1__list_jobs_request__descriptor, NULL);
  cr_assert_eq(req->n_states, 2);
  cr_assert_eq(req->states[0], FSDP__V1__JOB_STATE__JOB_STATE_RUNNING);
  cr_assert_eq(req->states[1], FSDP__V1__JOB_STATE__JOB_STATE_FAILED);
  protobuf_c_message_free_unpacked(&req->base, NULL);

  cr_assert_eq(CTL("jobs", "-o", "json"), 0, "%s", err);
  json_t *j = parse_json(out);
  cr_assert(json_is_array(j) && json_array_size(j) == 2, "%s", out);
  json_t *b = json_array_get(j, 1);
  cr_assert_str_eq(json_string_value(json_object_get(b, "job_id")), "j-43");
  cr_assert_str_eq(json_string_value(json_object_get(b, "state")), "FAILED");
  cr_assert_eq(json_integer_value(json_object_get(b, "restarts")), 2);
  cr_assert_eq(json_integer_value(json_object_get(b, "total_steps")), 300);
  json_decref(j);
}

/* Columns line up by what a terminal shows, not by bytes: a CJK name takes
 * two columns a character, an accented one one. */
Test(fsdpctl, tables_align_utf8_by_display_width) {
  utf8_jobs = 1;
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("jobs"), 0, "%s", err);
  /* NAME is 12 columns wide (the CJK name's): "café" (5 bytes) gets 8 blanks */
  expect_in(out, "JOB   NAME          STATE");
  expect_in(out, "j-42  " CJK_NAME "  RUNNING");
  expect_in(out, "j-43  caf\u00e9          FAILED");
  expect_in(out, CJK_REASON "\n"); /* a pipe: never cut */
}

/* UTF-8 text of a terminal line: its columns (wide characters 2, combining
 * accents 0), or -1 when it is not valid UTF-8. Independent of the client's
 * libunistring, for the few scripts the tests print. */
static int utf8_columns(const char *s) {
  int cols = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    unsigned cp, n = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 ? 4 : 0;
    if (!n) return -1;
    cp = n == 1 ? *p : *p & (0x7f >> n);
    for (unsigned k = 1; k < n; k++) {
      if ((p[k] & 0xc0) != 0x80) return -1; /* also a string that ends mid-character */
      cp = cp << 6 | (p[k] & 0x3f);
    }
    p += n;
    if (cp >= 0x300 && cp <= 0x36f) continue;
    cols += (cp >= 0x1100 && cp <= 0x115f) || (cp >= 0x2e80 && cp <= 0xa4cf) ||
                    (cp >= 0xac00 && cp <= 0xd7a3) || (cp >= 0xf900 && cp <= 0xfaff) ||
                    (cp >= 0xff00 && cp <= 0xff60) || (cp >= 0xffe0 && cp <= 0xffe6)
                ? 2
                : 1;
  }
  return cols;
}

/* Runs bin/fsdpctl on a pseudo-terminal cols wide; its output (less the
 * terminal's \r) into out; returns its exit status. Bounded by CTL_LIMIT_S. */
static int ctl_pty(unsigned short cols, const char *const *args) {
  char bin[1024];
  snprintf(bin, sizeof bin, "%s/bin/fsdpctl", tu_root());
  const char *argv[16] = {"fsdpctl"};
  for (int k = 0; k < 14 && args[k]; k++) argv[k + 1] = args[k];
  struct winsize ws = {.ws_row = 40, .ws_col = cols};
  int master;
  pid_t pid = forkpty(&master, NULL, NULL, &ws);
  cr_assert_geq(pid, 0);
  if (!pid) {
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  size_t n = 0;
  for (double t0 = tu_now_s(); n < OUT_MAX - 1 && tu_now_s() - t0 < CTL_LIMIT_S;) {
    struct pollfd p = {master, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t r = read(master, out + n, OUT_MAX - 1 - n);
    if (r <= 0) break; /* EIO: the child closed the terminal */
    n += (size_t)r;
  }
  close(master);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (out[i] != '\r') out[k++] = out[i];
  out[k] = 0;
  int st;
  if (waitpid(pid, &st, WNOHANG) == 0) kill(pid, SIGKILL), waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st), "fsdpctl on a terminal died: %s", out);
  return WEXITSTATUS(st);
}

/* On a terminal the last column is cut to its width: at a character's
 * boundary (a wide character that does not fit whole is left out), so the
 * line stays valid UTF-8 and within the terminal. Three widths, so the cut
 * falls in every place of a 3-byte character. */
Test(fsdpctl, tables_cut_utf8_at_character_boundaries) {
  utf8_jobs = 1;
  fake_start(NULL, NULL);
  for (unsigned short cols = 70; cols < 73; cols++) {
    cr_assert_eq(ctl_pty(cols, (const char *const[]){"jobs", NULL}), 0, "%s", out);
    int lines = 0, cut = 0;
    for (char *line = out, *nl; lines < 10 && (nl = strchr(line, '\n')); line = nl + 1, lines++) {
      *nl = 0;
      const int w = utf8_columns(line);
      cr_assert_geq(w, 0, "%u columns: not valid UTF-8: \"%s\"", cols, line);
      cr_assert_leq(w, cols, "%u columns: a line of %d: \"%s\"", cols, w, line);
      if (strstr(line, "j-43")) {
        const size_t l = strlen(line);
        cut = l > 3 && !strcmp(line + l - 3, "...");
        cr_assert_geq(w, cols - 1, "%u columns: cut short at %d: \"%s\"", cols, w, line);
      }
    }
    cr_assert(lines == 3 && cut, "%u columns, %d lines, j-43 cut %d:\n%s", cols, lines, cut, out);
  }
}

/* More nodes than one reply holds: fsdpctl asks after the last id until no
 * next page is given, and lists them all. */
Test(fsdpctl, nodes_are_listed_a_page_at_a_time) {
  nodes_paged = 1;
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("nodes", "-o", "json"), 0, "%s", err);
  json_t *j = parse_json(out);
  cr_assert(json_is_array(j) && json_array_size(j) == 2, "%s", out);
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(j, 1), "hostname")), "host-b");
  json_decref(j);
  int calls;
  Fsdp__V1__ListNodesRequest *req = rec_get("ListNodes", &fsdp__v1__list_nodes_request__descriptor, &calls);
  cr_assert(calls == 2 && req->after_id == 1, "%d calls, the last after %lld", calls,
            (long long)req->after_id);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  /* a stopped node's devices are not free, whatever holds them (an outside
   * tester found "2x cpu (2 free)" on one) */
  cr_assert_eq(CTL("nodes"), 0, "%s", err);
  const char *a = strstr(out, "host-a"), *b = strstr(out, "host-b");
  cr_assert(a && b && strstr(a, "(1 free)") && strstr(a, "(1 free)") < b, "%s", out);
  cr_assert(strstr(b, "STOPPED") && strstr(b, "(0 free)"), "%s", out);
}

/* More jobs than one reply holds: fsdpctl asks page after page (below the
 * oldest id it has) until it has --limit of them, and prints them oldest
 * first. */
Test(fsdpctl, jobs_are_listed_a_page_at_a_time) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("jobs", "--limit", "5", "-o", "json"), 0, "%s", err);
  json_t *j = parse_json(out);
  cr_assert(json_is_array(j) && json_array_size(j) == 5, "%s", out);
  for (int i = 0; i < 5; i++) {
    char want[16];
    snprintf(want, sizeof want, "j-%d", 5 + i);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(j, (size_t)i), "job_id")), want);
  }
  json_decref(j);
  int calls;
  Fsdp__V1__ListJobsRequest *req = rec_get("ListJobs", &fsdp__v1__list_jobs_request__descriptor, &calls);
  cr_assert_eq(calls, 3, "5 jobs in pages of 2: %d calls", calls);
  cr_assert(req->limit == 1 && req->before_id == 6, "the last page: limit %u below %lld", req->limit,
            (long long)req->before_id);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

Test(fsdpctl, status_shows_the_job_and_its_ranks) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("status", "j-42"), 0, "%s", err);
  expect_in(out, "j-42");
  expect_in(out, "RUNNING");
  expect_in(out, "40/300");
  expect_in(out, "restarts 0 of 3");
  expect_in(out, "TOKENS/S");
  expect_in(out, "n-1");
  expect_in(out, "3.2500");
  expect_in(out, "1234");
  /* then the job's latest events, after its ranks */
  Fsdp__V1__ListEventsRequest *ev = rec_get("ListEvents", &fsdp__v1__list_events_request__descriptor, NULL);
  cr_assert(!strcmp(ev->job_id, "j-42") && ev->limit == 5 && !ev->after_id, "%s %u", ev->job_id, ev->limit);
  protobuf_c_message_free_unpacked(&ev->base, NULL);
  cr_assert(strstr(out, "attempt.ended") > strstr(out, "TOKENS/S"), "%s", out);
  cr_assert_eq(CTL("status", "j-42", "--output=json"), 0, "%s", err);
  json_t *j = parse_json(out);
  cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "RUNNING");
  json_t *r1 = json_array_get(json_object_get(j, "ranks"), 1);
  cr_assert_eq(json_integer_value(json_object_get(r1, "rank")), 1);
  cr_assert_str_eq(json_string_value(json_object_get(r1, "state")), "RUNNING");
  cr_assert_float_eq(json_real_value(json_object_get(r1, "loss")), 3.25, 1e-12);
  cr_assert_str_eq(json_string_value(json_object_get(r1, "node_id")), "n-1");
  json_decref(j);
}

Test(fsdpctl, nodes_memory_checkpoints_cancel) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("nodes"), 0, "%s", err);
  expect_in(out, "n-1");
  expect_in(out, "host-a");
  expect_in(out, "ALIVE");
  expect_in(out, "2x cpu (1 free)");
  expect_in(out, "1.0 GiB / 16.0 GiB");
  cr_assert(strstr(out, "3s ago") || strstr(out, "4s ago"), "%s", out);
  cr_assert_eq(CTL("nodes", "--output", "json"), 0, "%s", err);
  json_t *j = parse_json(out);
  json_t *n = json_array_get(j, 0);
  cr_assert_str_eq(json_string_value(json_object_get(n, "state")), "ALIVE");
  cr_assert_eq(json_array_size(json_object_get(n, "devices")), 2);
  cr_assert_eq(json_integer_value(json_object_get(json_array_get(json_object_get(n, "devices"), 0),
                                                  "total_bytes")), 8ll << 30);
  json_decref(j);

  cr_assert_eq(CTL("memory", "j-42"), 0, "%s", err);
  expect_in(out, "PLANNED MiB");
  expect_in(out, "PEAK MiB");
  /* rank 1's optimizer: planned 8, current 4, peak 6.5 MiB, side by side */
  cr_assert(strstr(out, "optimizer") && strstr(out, "8.0") && strstr(out, "6.5"), "%s", out);
  const char *row = NULL; /* rank 1's optimizer line: the last with that category */
  for (const char *q = out; (q = strstr(q, "optimizer")); q++) row = q;
  cr_assert_not_null(row, "%s", out);
  cr_assert(strstr(row, "8.0") < strstr(row, "4.0") && strstr(row, "4.0") < strstr(row, "6.5"), "%s", row);
  /* a job with no ranks (waiting to be placed): its plan per rank */
  cr_assert_eq(CTL("memory", "j-43"), 0, "%s", err);
  expect_in(err, "job j-43 has no ranks now; its plan, per rank:");
  row = strstr(out, "optimizer");
  cr_assert(row && strstr(row, "8.0") && strstr(row, "-"), "%s", out);
  cr_assert_eq(CTL("memory", "j-42", "-o", "json"), 0, "%s", err);
  j = parse_json(out);
  json_t *cat = json_array_get(json_object_get(json_array_get(j, 1), "memory"), 1);
  cr_assert_str_eq(json_string_value(json_object_get(cat, "name")), "optimizer");
  cr_assert_eq(json_integer_value(json_object_get(cat, "peak_bytes")), (json_int_t)(6 * MIB + MIB / 2));
  json_decref(j);

  cr_assert_eq(CTL("checkpoints", "j-42"), 0, "%s", err);
  expect_in(out, "STEP");
  cr_assert_eq(CTL("checkpoints", "j-42", "-o", "json"), 0, "%s", err);
  j = parse_json(out);
  cr_assert(json_is_array(j) && !json_array_size(j), "%s", out);
  json_decref(j);

  cr_assert_eq(CTL("cancel", "j-42", "--reason", "wrong data"), 0, "%s", err);
  expect_in(out, "j-42 CANCELLED");
  Fsdp__V1__CancelJobRequest *req = rec_get("CancelJob", &fsdp__v1__cancel_job_request__descriptor, NULL);
  cr_assert_str_eq(req->job_id, "j-42");
  cr_assert_str_eq(req->reason, "wrong data");
  cr_assert(!req->checkpoint && !req->grace_ms);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  /* --checkpoint with a grace: in ms, and never 0 (the coordinator's "use
   * the default, 60 s") however small the grace asked (a reviewer) */
  static const struct { const char *grace; uint32_t ms; } g[] = {{"2.5", 2500}, {"0.0004", 1}};
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(CTL("cancel", "j-42", "--checkpoint", "--grace", g[k].grace), 0, "%s", err);
    req = rec_get("CancelJob", &fsdp__v1__cancel_job_request__descriptor, NULL);
    cr_expect(req->checkpoint && req->grace_ms == g[k].ms, "--grace %s sent %u ms", g[k].grace,
              req->grace_ms);
    protobuf_c_message_free_unpacked(&req->base, NULL);
  }
  cr_assert_eq(CTL("cancel", "j-42", "--grace", "5"), 2, "--grace without --checkpoint: %s", err);
}

/* ---- events ----------------------------------------------------------------------------- */

Test(fsdpctl, events_list_a_job_or_the_cluster_newest_last) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("events", "j-42", "--limit", "3"), 0, "%s", err);
  Fsdp__V1__ListEventsRequest *req = rec_get("ListEvents", &fsdp__v1__list_events_request__descriptor, NULL);
  cr_assert(!strcmp(req->job_id, "j-42") && req->limit == 3 && req->after_id == 0,
            "job %s limit %u after %lld", req->job_id, req->limit, (long long)req->after_id);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  expect_in(out, "KIND");
  /* the newest three, oldest first, with their local times */
  const char *a = strstr(out, "attempt.started"), *b = strstr(out, "rank.exited"),
             *c = strstr(out, "attempt.ended");
  cr_assert(a && b && c && a < b && b < c && !strstr(out, "job.submitted"), "%s", out);
  char when[32];
  const time_t t = 1700000005;
  strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
  expect_in(out, when);
  cr_assert_eq(CTL("events", "-o", "json"), 0, "%s", err);
  req = rec_get("ListEvents", &fsdp__v1__list_events_request__descriptor, NULL);
  cr_assert(!*req->job_id && req->limit == 100, "the cluster's, 100 by default: %u", req->limit);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  json_t *j = parse_json(out), *e0 = json_array_get(j, 0);
  cr_assert_eq(json_array_size(j), 5);
  cr_assert_str_eq(json_string_value(json_object_get(e0, "node_id")), "n-1");
  cr_assert_str_eq(json_string_value(json_object_get(e0, "kind")), "node.registered");
  json_decref(j);
  cr_assert_eq(CTL("events", "j-9"), 3, "%s", err);
  expect_in(err, "no such job");
  cr_assert_eq(CTL("events", "j-42", "--limit", "0"), 2);
  expect_in(err, "--limit 0");
  cr_assert_eq(CTL("events", "j-42", "--limit", "5001"), 2);
  expect_in(err, "--limit 5001");
}

/* --follow pages through what arrives (a full page is asked again at once)
 * and stops once the job has ended and nothing more came: every event
 * printed once, in order. */
Test(fsdpctl, events_follow_pages_until_the_job_has_ended) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("events", "j-ok", "--follow", "-o", "json"), 0, "%s", err);
  int64_t want = 1;
  for (char *line = out, *nl; *line; line = nl + 1) {
    nl = strchr(line, '\n');
    cr_assert_not_null(nl, "an unended line: %s", line);
    *nl = 0;
    json_t *e = parse_json(line);
    cr_assert_eq(json_integer_value(json_object_get(e, "id")), want, "event %lld out of order",
                 (long long)want);
    json_decref(e);
    want++;
  }
  cr_assert_eq(want, EV_OK + 1, "%lld events printed of %d", (long long)want - 1, EV_OK);
  int calls, gets;
  Fsdp__V1__ListEventsRequest *req = rec_get("ListEvents", &fsdp__v1__list_events_request__descriptor, &calls);
  cr_assert_eq(req->after_id, EV_OK, "the last ask is after the last event");
  protobuf_c_message_free_unpacked(&req->base, NULL);
  /* newest 2; 3..1002 (a full page); 1003; nothing, then the job's end, then nothing */
  cr_assert_eq(calls, 5, "%d ListEvents calls", calls);
  Fsdp__V1__GetJobRequest *g = rec_get("GetJob", &fsdp__v1__get_job_request__descriptor, &gets);
  cr_assert_eq(gets, 1, "the job's state is asked only when a page is empty");
  protobuf_c_message_free_unpacked(&g->base, NULL);
  cr_assert_eq(CTL("events", "j-ok", "--follow", "--limit", "1"), 0, "%s", err);
  /* all had come by then: the newest one, then nothing new */
  cr_assert(strstr(out, "EVENT") && strstr(out, "e1003\n") && !strstr(out, "e1002"), "%.300s", out);
}

/* A job with no events yet when --follow starts: every event that comes
 * after is printed, from the first (not the newest page of them), and the
 * pages keep the first one's columns. */
Test(fsdpctl, events_follow_from_an_empty_start) {
  ev_first = 0;
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("events", "j-ok", "--follow"), 0, "%s", err);
  int rows = 0;
  long at = -1;
  for (char *line = out, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
    *nl = 0;
    if (strstr(line, "TIME") == line) continue;
    char want[16];
    snprintf(want, sizeof want, " e%d", ++rows);
    const size_t l = strlen(line), k = strlen(want);
    cr_assert(l >= k && !strcmp(line + l - k, want), "row %d is \"%s\", not event %d", rows, line,
              rows);
    const char *kind = strstr(line, "test.tick");
    cr_assert_not_null(kind, "%s", line);
    if (at < 0) at = kind - line;
    cr_assert_eq(kind - line, at, "row %d's columns moved: \"%s\"", rows, line);
  }
  cr_assert_eq(rows, EV_OK, "%d events printed of %d", rows, EV_OK);
  Fsdp__V1__ListEventsRequest *req = rec_get("ListEvents", &fsdp__v1__list_events_request__descriptor, NULL);
  cr_assert(req->follow && req->after_id == EV_OK, "the last ask: after %lld, follow %d",
            (long long)req->after_id, req->follow);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

Test(fsdpctl, drain_and_undrain_a_node) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("drain", "n-1"), 2, "a drain without --reason");
  expect_in(err, "--reason");
  cr_assert_eq(CTL("drain", "n-1", "--reason", "disk swap"), 0, "%s", err);
  expect_in(out, "node n-1 drained: disk swap (1 device(s) still running a job)");
  Fsdp__V1__DrainNodeRequest *q = rec_get("DrainNode", &fsdp__v1__drain_node_request__descriptor, NULL);
  cr_assert(!strcmp(q->node_id, "n-1") && !strcmp(q->reason, "disk swap") && !q->undrain);
  protobuf_c_message_free_unpacked(&q->base, NULL);
  cr_assert_eq(CTL("undrain", "n-1"), 0, "%s", err);
  expect_in(out, "node n-1 takes ranks again");
  q = rec_get("DrainNode", &fsdp__v1__drain_node_request__descriptor, NULL);
  cr_assert(q->undrain, "undrain sent a drain");
  protobuf_c_message_free_unpacked(&q->base, NULL);
  cr_assert_eq(CTL("undrain", "n-1", "--reason", "x"), 2, "undrain takes no reason");
  cr_assert_eq(CTL("drain", "n-7", "--reason", "x"), 3, "%s", err);
  expect_in(err, "no such node");
  cr_assert_eq(CTL("nodes"), 0, "%s", err);
  expect_in(out, "DRAINED");
}

/* ---- watch ------------------------------------------------------------------------------ */

Test(fsdpctl, watch_exits_with_the_jobs_outcome) {
  fake_start(NULL, NULL);
  int rc = CTL("watch", "j-ok");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  /* stdout is a pipe here: one plain line per message, nothing redrawn */
  cr_assert_null(strchr(out, '\r'), "%s", out);
  cr_assert_null(strchr(out, '\033'), "%s", out);
  int lines = 0;
  for (const char *p = out; (p = strchr(p, '\n')); p++) lines++;
  cr_assert_eq(lines, 3, "%s", out);
  expect_in(out, "step 1/3");
  expect_in(out, "loss 3.0000");
  expect_in(out, "2000 tok/s");
  expect_in(out, "SUCCEEDED");

  rc = CTL("watch", "j-bad");
  cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
  expect_in(out, "FAILED");
  expect_in(out, "rank 0 exited with status 1");

  rc = CTL("watch", "j-none");
  cr_assert_eq(rc, 3, "exit %d: %s", rc, err);
  expect_in(err, "job j-none: no such job");

  /* submit --watch: the id, then the watch, and the watch's exit code */
  cr_assert_eq(CTL("submit", "--ranks", "1", "--watch"), 3, "%s", err); /* the fake's j-42 has no stream */
  cr_assert(!strncmp(out, "j-42\n", 5), "%s", out);

  cr_assert_eq(CTL("watch", "j-ok", "-o", "json"), 0, "%s", err);
  const char *second = strchr(out, '\n') + 1;
  char *first = strndup(out, (size_t)(second - out));
  json_t *j = parse_json(first);
  free(first);
  cr_assert_eq(json_integer_value(json_object_get(j, "step")), 1);
  cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "RUNNING");
  json_decref(j);
}

/* A watch whose stream breaks (the coordinator restarting) watches again
 * and ends with the job's outcome; one that stays unreachable gives up after
 * --timeout with exit 4. */
Test(fsdpctl, a_broken_watch_watches_again_until_the_timeout) {
  fake_start(NULL, NULL);
  watch_flaky_calls = watch_down_calls = 0;
  int rc = CTL("watch", "j-flaky");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  expect_in(out, "step 1/3");
  expect_in(out, "step 2/3");
  expect_in(out, "SUCCEEDED");
  expect_in(err, "the watch of job j-flaky broke");
  cr_assert_eq(watch_flaky_calls, 2, "%d streams", watch_flaky_calls);
  const double t0 = tu_now_s();
  rc = CTL("watch", "j-down", "--timeout", "1");
  const double dt = tu_now_s() - t0;
  cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
  expect_in(err, "stayed unreachable for 1 s: ");
  /* said once: the message is not written over itself */
  cr_assert(strstr(err, "stayed unreachable") == strstr(err, "stayed unreachable for 1 s: ") &&
                !strstr(strstr(err, "stayed unreachable") + 1, "stayed unreachable"),
            "%s", err);
  cr_assert(dt >= 1.0 && dt < 5.0, "gave up after %.2f s (--timeout 1)", dt);
  cr_assert_gt(watch_down_calls, 2, "it watched again (%d streams)", watch_down_calls);
}

/* bin/fsdpctl with args (NULL-terminated) in the background, its stdout and
 * stderr into the files NAME.out and NAME.err of the test's directory: its pid. */
static pid_t ctl_spawn(const char *name, const char *const *args) {
  const char *argv[64] = {"fsdpctl"};
  int n = 1;
  for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  char bin[1024], path[2][256];
  snprintf(bin, sizeof bin, "%s/bin/fsdpctl", tu_root());
  for (int i = 0; i < 2; i++) {
    char *p = tu_path(name);
    snprintf(path[i], sizeof path[i], "%s.%s", p, i ? "err" : "out");
    free(p);
  }
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (!pid) {
    for (int i = 0; i < 2; i++) {
      int fd = open(path[i], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || dup2(fd, 1 + i) < 0) _exit(127);
    }
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  return pid;
}
#define CTL_SPAWN(name, ...) ctl_spawn(name, (const char *const[]){__VA_ARGS__, NULL})

/* What fsdpctl spawned as name wrote to stdout ("out") or stderr ("err"), into buf. */
static const char *ctl_spawned_output(const char *name, const char *which, char *buf, size_t len) {
  char file[64];
  snprintf(file, sizeof file, "%s.%s", name, which);
  char *p = tu_path(file), *text = tu_slurp(p, NULL);
  snprintf(buf, len, "%s", text ? text : "");
  free(text), free(p);
  return buf;
}

/* The exit status of the fsdpctl pid, which must exit within limit_s. */
static int ctl_reap(pid_t pid, double limit_s) {
  int status = 0;
  pid_t w = 0;
  for (double t0 = tu_now_s(); !w && tu_now_s() - t0 < limit_s;) {
    w = waitpid(pid, &status, WNOHANG);
    if (!w) nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  if (!w) kill(pid, SIGKILL), waitpid(pid, &status, 0);
  cr_assert_eq(w, pid, "fsdpctl ran past %.0f s", limit_s);
  cr_assert(WIFEXITED(status), "fsdpctl died of signal %d", WTERMSIG(status));
  return WEXITSTATUS(status);
}

/* A call a follower makes that the server cancels (a coordinator stopping
 * cancels the calls in flight: CANCELLED, not UNAVAILABLE) is tried again
 * as for an unreachable one: events --follow ends with the job, exit 0.
 * Before, it exited 6 (seen under the sanitizers' timing in the restart
 * test below). */
Test(fsdpctl, a_follower_takes_a_call_the_server_cancelled_for_a_break) {
  fake_start(NULL, NULL);
  cancel_once = 1;
  const int rc = CTL("events", "j-restart", "--follow", "--timeout", "20");
  cr_expect_eq(rc, 0, "events: exit %d: %s%s", rc, out, err);
  expect_in(err, "following the events of j-restart broke");
  cr_expect(cancelled, "the server cancelled no call");
}

/* A coordinator that restarts (gone 3 s) under a watch and an events
 * --follow: both find it again as soon as it serves, carry on and end with
 * the job (exit 0), every event printed once. Before, the watch's channel
 * sat in gRPC's reconnect backoff (failing every try without trying) for
 * seconds after the coordinator was back, and events --follow gave up at
 * the first break. */
Test(fsdpctl, watch_and_events_follow_carry_on_through_a_coordinator_restart) {
  fake_start(NULL, NULL);
  const pid_t w = CTL_SPAWN("watch", "watch", "j-restart", "--timeout", "30");
  const pid_t e = CTL_SPAWN("events", "events", "j-restart", "--follow", "-o", "json", "--timeout", "30");
  char wout[4096], eout[4096], werr[4096], eerr[4096];
  /* until both follow: the watch at step 1, events 1..3 printed */
  for (double t0 = tu_now_s(); tu_now_s() - t0 < CTL_LIMIT_S; nanosleep(&(struct timespec){0, 20000000}, NULL))
    if (strstr(ctl_spawned_output("watch", "out", wout, sizeof wout), "step 1/3") &&
        strstr(ctl_spawned_output("events", "out", eout, sizeof eout), "\"e3\""))
      break;
  expect_in(wout, "step 1/3");
  expect_in(eout, "\"e3\"");
  const double back = fake_restart(3.0);
  const int wrc = ctl_reap(w, CTL_LIMIT_S), erc = ctl_reap(e, CTL_LIMIT_S);
  ctl_spawned_output("watch", "out", wout, sizeof wout);
  ctl_spawned_output("watch", "err", werr, sizeof werr);
  ctl_spawned_output("events", "out", eout, sizeof eout);
  ctl_spawned_output("events", "err", eerr, sizeof eerr);
  cr_assert_eq(wrc, 0, "watch: exit %d: %s%s", wrc, wout, werr);
  cr_assert_eq(erc, 0, "events: exit %d: %s%s", erc, eout, eerr);
  expect_in(wout, "step 3/3");
  expect_in(wout, "SUCCEEDED");
  expect_in(werr, "the watch of job j-restart broke");
  expect_in(eerr, "following the events of j-restart broke");
  expect_in(eerr, "asking again after event 3");
  /* every event once, in order */
  int ids = 0;
  for (char *line = eout, *nl; ids < 10 && (nl = strchr(line, '\n')); line = nl + 1, ids++) {
    *nl = 0;
    json_t *j = parse_json(line);
    cr_assert_eq(json_integer_value(json_object_get(j, "id")), ids + 1, "line %d: %s", ids + 1, line);
    json_decref(j);
  }
  cr_assert_eq(ids, 6, "%d events printed of 6", ids);
  /* each tried again within its longest wait (1.6 s) of the coordinator's return */
  pthread_mutex_lock(&R.mu);
  const double dw = back_watch - back, de = back_events - back;
  pthread_mutex_unlock(&R.mu);
  printf("back after the restart: the watch in %.2f s, events --follow in %.2f s\n", dw, de);
  cr_expect(back_watch && dw < 2.5, "the watch came back %.2f s after the coordinator", dw);
  cr_expect(back_events && de < 2.5, "events --follow came back %.2f s after the coordinator", de);
}

/* A coordinator that goes for good under a watch and an events --follow:
 * each gives up once it has been unreachable for --timeout (exit 4), not
 * before and not long after. */
Test(fsdpctl, watch_and_events_follow_give_up_on_a_coordinator_gone_for_good) {
  fake_start(NULL, NULL);
  const pid_t w = CTL_SPAWN("watch", "watch", "j-restart", "--timeout", "2");
  const pid_t e = CTL_SPAWN("events", "events", "j-restart", "--follow", "--timeout", "2");
  char wout[4096], eout[4096], werr[4096], eerr[4096];
  for (double t0 = tu_now_s(); tu_now_s() - t0 < CTL_LIMIT_S; nanosleep(&(struct timespec){0, 20000000}, NULL))
    if (strstr(ctl_spawned_output("watch", "out", wout, sizeof wout), "step 1/3") &&
        strstr(ctl_spawned_output("events", "out", eout, sizeof eout), "e3"))
      break;
  fake_stop();
  const double t0 = tu_now_s();
  const int wrc = ctl_reap(w, CTL_LIMIT_S);
  const double dw = tu_now_s() - t0;
  const int erc = ctl_reap(e, CTL_LIMIT_S);
  const double de = tu_now_s() - t0;
  ctl_spawned_output("watch", "err", werr, sizeof werr);
  ctl_spawned_output("events", "err", eerr, sizeof eerr);
  cr_assert_eq(wrc, 4, "watch: exit %d: %s", wrc, werr);
  cr_assert_eq(erc, 4, "events: exit %d: %s", erc, eerr);
  expect_in(werr, "the coordinator stayed unreachable for 2 s");
  expect_in(eerr, "the coordinator stayed unreachable for 2 s");
  cr_expect(dw >= 2.0 && dw < 5.0, "the watch gave up after %.2f s (--timeout 2)", dw);
  cr_expect(de >= 2.0 && de < 5.0, "events --follow gave up after %.2f s (--timeout 2)", de);
}

/* A diverged run reports a NaN loss (and a speed can be infinite): JSON has
 * no such numbers, so they print as null, and the rest of the document with
 * them. */
Test(fsdpctl, json_prints_nan_and_infinity_as_null) {
  fake_start(NULL, NULL);
  int rc = CTL("status", "j-nan", "-o", "json");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  json_t *j = parse_json(out), *ranks = json_object_get(j, "ranks");
  json_t *r0 = json_array_get(ranks, 0), *r1 = json_array_get(ranks, 1);
  cr_assert(json_is_null(json_object_get(r0, "loss")), "%s", out);
  cr_assert_float_eq(json_real_value(json_object_get(r0, "tokens_per_s")), 1234.0, 1e-9);
  cr_assert(json_is_null(json_object_get(r1, "tokens_per_s")), "%s", out);
  cr_assert_float_eq(json_real_value(json_object_get(r1, "loss")), 3.25, 1e-12);
  json_decref(j);
  cr_assert_eq(CTL("status", "j-nan"), 0, "%s", err); /* the table says nan as printf does */
  expect_in(out, "nan");

  /* watch: a line per message, each with "loss": null, and the job's outcome */
  rc = CTL("watch", "j-nan", "-o", "json");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  int lines = 0;
  for (char *line = out, *nl; lines < 10 && (nl = strchr(line, '\n')); line = nl + 1, lines++) {
    *nl = 0;
    j = parse_json(line);
    cr_assert(json_is_null(json_object_get(j, "loss")), "%s", line);
    cr_assert_eq(json_integer_value(json_object_get(j, "step")), lines + 1);
    json_decref(j);
  }
  cr_assert_eq(lines, 3, "%d lines of 3", lines);
}

/* A figure no rank reported (unreported: a rank that ended or started
 * before any report of a step reached the coordinator) is "-" in tables and
 * watch lines and null in JSON, never 0 and 0.0000: a loss of 0 reads as a
 * perfect one. */
Test(fsdpctl, figures_none_reported_show_as_a_dash_and_null) {
  fake_start(NULL, NULL);
  cr_assert_eq(CTL("status", "j-fresh"), 0, "%s", err);
  const char *row = strstr(out, "\n   1  n-1");
  cr_assert(row, "%s", out);
  char step[16], loss[16], speed[16];
  cr_assert_eq(sscanf(row, " 1 n-1 1 RUNNING %15s %15s %15s", step, loss, speed), 3, "%s", out);
  cr_expect(!strcmp(step, "-") && !strcmp(loss, "-") && !strcmp(speed, "-"),
            "rank 1: step %s loss %s tok/s %s", step, loss, speed);
  expect_in(out, "3.2500"); /* rank 0's, reported */

  int rc = CTL("status", "j-fresh", "-o", "json");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  json_t *j = parse_json(out), *ranks = json_object_get(j, "ranks");
  json_t *r0 = json_array_get(ranks, 0), *r1 = json_array_get(ranks, 1);
  for (const char *const *f = (const char *const[]){"step", "loss", "tokens_per_s", NULL}; *f; f++) {
    cr_expect(json_is_null(json_object_get(r1, *f)), "rank 1's %s: %s", *f, out);
    cr_expect(!json_is_null(json_object_get(r0, *f)), "rank 0's %s: %s", *f, out);
  }
  json_decref(j);

  cr_assert_eq(CTL("watch", "j-fresh"), 0, "%s", err);
  expect_in(out, "step 1/3 | loss - | - tok/s");
  expect_in(out, "step 2/3 | loss 3.0000 | 2000 tok/s");
  rc = CTL("watch", "j-fresh", "-o", "json");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  char *nl = strchr(out, '\n');
  cr_assert(nl, "%s", out);
  *nl = 0;
  j = parse_json(out);
  cr_expect(json_is_null(json_object_get(j, "loss")) && json_is_null(json_object_get(j, "tokens_per_s")),
            "%s", out);
  cr_expect_eq(json_integer_value(json_object_get(j, "step")), 1, "%s", out);
  json_decref(j);
}

/* On a terminal (a pseudo-terminal here) watch redraws one line in place. */
Test(fsdpctl, watch_draws_a_progress_bar_on_a_terminal) {
  fake_start(NULL, NULL);
  char bin[1024];
  snprintf(bin, sizeof bin, "%s/bin/fsdpctl", tu_root());
  int master;
  pid_t pid = forkpty(&master, NULL, NULL, NULL);
  cr_assert_geq(pid, 0);
  if (!pid) {
    execl(bin, "fsdpctl", "watch", "j-ok", (char *)NULL);
    _exit(127);
  }
  size_t n = 0;
  double t0 = tu_now_s();
  while (n < OUT_MAX - 1 && tu_now_s() - t0 < CTL_LIMIT_S) {
    struct pollfd p = {master, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t r = read(master, out + n, OUT_MAX - 1 - n);
    if (r <= 0) break; /* EIO: the child closed the terminal */
    n += (size_t)r;
  }
  out[n] = 0;
  close(master);
  int st;
  if (waitpid(pid, &st, WNOHANG) == 0) kill(pid, SIGKILL), waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "watch on a terminal: %s", out);
  /* every update starts with a carriage return and a clear to the end of line */
  int redraws = 0;
  for (const char *p = out; (p = strstr(p, "\r\033[K")); p++) redraws++;
  cr_assert_geq(redraws, 3, "%d redraws: %s", redraws, out);
  expect_in(out, "[################........] step 2/3");
  expect_in(out, "ETA 1s");
  expect_in(out, "job j-ok SUCCEEDED");
}

/* ---- failures and their exit codes ----------------------------------------------------------- */

Test(fsdpctl, not_found_is_3_with_the_servers_words) {
  fake_start(NULL, NULL);
  int rc = CTL("status", "j-missing");
  cr_assert_eq(rc, 3, "exit %d: %s", rc, err);
  cr_assert(!strncmp(err, "fsdpctl: ", 9), "%s", err);
  expect_in(err, "job j-missing: no such job; fsdpctl jobs lists them");
  cr_assert_str_eq(out, "");
}

Test(fsdpctl, unreachable_is_4_within_the_timeout) {
  char addr[64];
  int fd = tu_listen_loopback(addr, sizeof addr);
  close(fd); /* a port nobody listens on now */
  setenv("FSDP_COORDINATOR", addr, 1);
  int rc = CTL("--timeout", "3", "jobs");
  cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
  cr_assert_lt(ctl_seconds, 3.5, "took %.2f s", ctl_seconds);
  expect_in(err, "UNAVAILABLE");
  expect_in(err, "FSDP_COORDINATOR");
  expect_in(err, addr);
  rc = CTL("watch", "j-ok", "--coordinator", addr);
  cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
  cr_assert_lt(ctl_seconds, 3.5, "took %.2f s", ctl_seconds);
}

/* A --tls-ca file that cannot be a CA is the user's to fix (exit 2, the
 * file and what is wrong named), found before connecting: not an
 * UNAVAILABLE that points at --coordinator. */
Test(fsdpctl, a_tls_ca_that_is_no_pem_certificate_is_a_usage_error) {
  fake_start(NULL, NULL);
  char *empty = write_tmp("empty.pem", "");
  char *text = write_tmp("text.pem", "not a certificate\n");
  char *key = write_tmp("key.pem", "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n");
  char *cut = write_tmp("cut.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n");
  const struct {
    const char *file, *why;
  } cases[] = {
      {empty, "the file is empty"}, {"/dev/null", "the file is empty"},
      {text, "no PEM certificate in it"}, {key, "no PEM certificate in it"},
      {cut, "a certificate without its \"-----END CERTIFICATE-----\" line"},
      {"/no/such/ca.pem", "cannot open it (No such file or directory)"},
      {tu_tmpdir(), "not a regular file (a directory)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = CTL("--tls-ca", cases[i].file, "jobs");
    cr_assert_eq(rc, 2, "--tls-ca %s: exit %d: %s", cases[i].file, rc, err);
    char want[1200];
    snprintf(want, sizeof want, "--tls-ca %s: %s", cases[i].file, cases[i].why);
    expect_in(err, want);
    expect_in(err, "PEM file of the CA");
    cr_assert_null(strstr(err, "UNAVAILABLE"), "%s", err);
    cr_assert_lt(ctl_seconds, 2.0, "the check took %.2f s", ctl_seconds);
  }
  /* the watch and a node's logs are checked the same way */
  cr_assert_eq(CTL("watch", "j-ok", "--tls-ca", empty), 2, "%s", err);
  cr_assert_eq(CTL("logs", "j-42", "--tls-ca", empty), 2, "%s", err);
  /* a real bundle passes the check: the fake's plaintext port then fails the handshake */
  const char *bundle = "/etc/ssl/certs/ca-certificates.crt";
  if (!access(bundle, R_OK)) {
    int rc = CTL("--timeout", "3", "--tls-ca", bundle, "jobs");
    cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
    cr_assert_null(strstr(err, "--tls-ca"), "%s", err);
  }
  free(empty), free(text), free(key), free(cut);
}

Test(fsdpctl, tokens_come_from_files_only) {
  char *user = write_tmp("user.token", "user-secret-00001\n");
  char *node = write_tmp("node.token", "node-secret-00002\n");
  char *wrong = write_tmp("wrong.token", "nope\n");
  fake_start(user, node);
  int rc = CTL("jobs");
  cr_assert_eq(rc, 5, "exit %d: %s", rc, err);
  expect_in(err, "UNAUTHENTICATED");
  expect_in(err, "--token-file");
  /* the fix said once, in fsdpctl's terms: no second, vaguer one */
  const char *give = strstr(err, "; give");
  cr_assert(give && !strstr(give + 1, "; give") && !strstr(err, "token file of this cluster"),
            "%s", err);
  cr_assert_eq(CTL("jobs", "--token-file", user), 0, "%s", err);
  cr_assert_eq(CTL("--token-file", wrong, "jobs"), 5, "%s", err);
  setenv("FSDP_TOKEN_FILE", user, 1);
  cr_assert_eq(CTL("status", "j-42"), 0, "%s", err);
  /* the logs go to the node with the same token */
  cr_assert_eq(CTL("logs", "j-42"), 0, "%s", err);
  /* there is no flag that takes a token's value */
  rc = CTL("--token", "user-secret-1", "jobs");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "--token-file");
  cr_assert_eq(CTL("jobs", "--token=user-secret-1"), 2, "%s", err);
  free(user), free(node), free(wrong);
}

Test(fsdpctl, usage_errors_are_2_and_name_the_option) {
  setenv("FSDP_COORDINATOR", "127.0.0.1:1", 1); /* never reached */
  static const struct {
    const char *args[6];
    const char *named;
  } cases[] = {
      {{"jobs", "--bogus"}, "--bogus"},
      {{"jobs", "--state", "SLEEPING"}, "--state SLEEPING"},
      {{"jobs", "--state", "RESTARTING"}, "a job waiting to restart is PENDING"},
      {{"submit", "--steps", "5"}, "--ranks"},
      {{"submit", "--ranks", "two"}, "--ranks two"},
      {{"submit", "--ranks"}, "--ranks needs a value"},
      {{"submit", "--mesh", "2y2"}, "mesh \"2y2\""},
      {{"submit", "--set", "novalue"}, "--set novalue"},
      {{"--timeout", "0", "jobs"}, "--timeout 0"},
      {{"--output", "yaml", "jobs"}, "--output yaml"},
      {{"status"}, "which job"},
      {{"status", "a", "b"}, "unexpected argument \"b\""},
      {{"logs", "j-1", "--rank", "-1"}, "--rank -1"},
      {{"frobnicate"}, "unknown command \"frobnicate\""},
      {{"submit", "/no/such/job.conf", "--ranks", "1"}, "/no/such/job.conf"},
      /* the ranges stated are those the coordinator takes */
      {{"submit", "--ranks", "-1"}, "--ranks -1: not a whole number from 1 to 4096"},
      {{"submit", "--ranks", "0"}, "--ranks 0: not a whole number from 1 to 4096"},
      {{"submit", "--ranks", "4097"}, "from 1 to 4096"},
      {{"submit", "--max-restarts", "1001"}, "--max-restarts 1001: not a whole number from 0 to 1000"},
      {{"--timeout", "1e9", "jobs"}, "--timeout 1e9: give seconds, more than 0 and at most 1000000"},
      {{"events", "--limit", "0"}, "--limit 0: not a whole number from 1 to 5000"},
      /* fopen takes a directory, which reads as an empty job file */
      {{"submit", "/", "--ranks", "1"}, "job file /: is a directory"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = ctl(cases[i].args);
    cr_assert_eq(rc, 2, "%s %s: exit %d: %s", cases[i].args[0], cases[i].args[1], rc, err);
    expect_in(err, cases[i].named);
    cr_assert_lt(ctl_seconds, 2.0, "a usage error took %.2f s", ctl_seconds);
  }
  cr_assert_eq(CTL("--help"), 0);
  expect_in(out, "Exit codes");
  expect_in(out, "FSDP_COORDINATOR");
  cr_assert_eq(CTL("submit", "--help"), 0);
  expect_in(out, "--max-restarts");
  cr_assert_eq(CTL("--version"), 0);
  expect_in(out, "fsdpctl ");
}

/* stdout on a full disk (/dev/full: every write fails with ENOSPC): the
 * output is lost, so no command may exit 0; the error names stdout. */
Test(fsdpctl, a_stdout_that_cannot_be_written_is_a_failure) {
  fake_start(NULL, NULL);
  cr_assert_eq(access("/dev/full", W_OK), 0, "this test needs /dev/full");
  static const char *const cases[][5] = {
      {"jobs", "-o", "json"}, {"jobs"},          {"events"},        {"events", "j-ok", "--follow"},
      {"status", "j-42"},     {"nodes"},         {"--version"},     {"watch", "j-ok", "-o", "json"},
      {"watch", "j-ok"},      {"logs", "j-42"},  {"submit", "--ranks", "1"}, {"cancel", "j-42"},
  };
  ctl_stdout_file = "/dev/full";
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = ctl(cases[i]);
    cr_assert_eq(rc, 6, "%s %s > /dev/full: exit %d: %s", cases[i][0], cases[i][1] ? cases[i][1] : "",
                 rc, err);
    expect_in(err, "writing to stdout: No space left on device");
    if (!strcmp(cases[i][0], "submit")) /* the job was made: its id on stderr, not lost */
      expect_in(err, "the job is j-42\n");
    else
      cr_assert_eq(strchr(err, '\n'), err + strlen(err) - 1, "more than one line: %s", err);
  }
  ctl_stdout_file = NULL;
  cr_assert_eq(CTL("jobs"), 0, "%s", err); /* the same commands to a pipe are fine */
}

/* ---- export ------------------------------------------------------------------------------------ */

/* Files in dir whose name holds ".partial-" (export's temporaries). */
static int partial_files(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s: %s", dir, strerror(errno));
  int n = 0;
  struct dirent *e;
  for (int k = 0; k < 1000 && (e = readdir(d)); k++) n += strstr(e->d_name, ".partial-") != NULL;
  closedir(d);
  return n;
}

static void expect_file(const char *path, const char *text) {
  size_t n = 0;
  char *got = tu_slurp(path, &n);
  cr_assert_not_null(got, "%s is not there", path);
  cr_assert(n == strlen(text) && !memcmp(got, text, n), "%s holds \"%.*s\", not \"%s\"", path,
            (int)n, got, text);
  free(got);
}

/* A directory of its own for an export test (name under the test's
 * temporary directory), with the fake coordinator started; model gets
 * DIR/model.safetensors. Free the directory's name. */
static char *export_dir(const char *name, char *model, size_t len) {
  fake_start(NULL, NULL);
  char *dir = tu_path(name);
  cr_assert(!mkdir(dir, 0755) || errno == EEXIST);
  snprintf(model, len, "%s/model.safetensors", dir);
  return dir;
}

/* Without --force a file at -o FILE is never replaced, even one made after
 * the check at the start (while the pieces come): the end is atomic. */
Test(fsdpctl, export_never_replaces_a_file_made_while_it_ran) {
  char model[1100], *dir = export_dir("export", model, sizeof model);
  unlink(model);
  cr_assert_eq(CTL("export", "j-42", "-o", model), 0, "%s", err);
  expect_file(model, "hello world\n");
  expect_in(out, "step 7 of job j-42");
  cr_assert_eq(CTL("export", "j-42", "-o", model), 2, "%s", err); /* there before: refused at once */
  expect_in(err, "the file exists");
  cr_assert_eq(CTL("export", "j-42", "-o", model, "--force"), 0, "%s", err);
  /* --force replaces a file, never a FIFO or a device (a link to
   * /dev/null here: a rename would replace the link, not the device) */
  char fifo[1200], null[1200];
  snprintf(fifo, sizeof fifo, "%s/export.fifo", dir);
  snprintf(null, sizeof null, "%s/export.null", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(symlink("/dev/null", null), 0);
  cr_assert_eq(CTL("export", "j-42", "-o", fifo, "--force"), 2, "%s", err);
  expect_in(err, "is a FIFO, not a file");
  cr_assert_eq(CTL("export", "j-42", "-o", null, "--force"), 2, "%s", err);
  expect_in(err, "is a character device, not a file: give a file path");
  struct stat fst;
  cr_assert(!stat(fifo, &fst) && S_ISFIFO(fst.st_mode), "the FIFO was replaced");
  cr_assert(!lstat(null, &fst) && S_ISLNK(fst.st_mode), "the link was replaced");
  unlink(fifo), unlink(null);
  cr_assert_eq(partial_files(dir), 0, "a temporary was left in %s", dir);

  /* made while it ran: left as it was, the export's temporary removed */
  unlink(model);
  snprintf(export_race, sizeof export_race, "%s", model);
  int rc = CTL("export", "j-42", "-o", model);
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "created while the export ran");
  expect_in(err, "--force");
  expect_file(model, "theirs\n");
  cr_assert_eq(partial_files(dir), 0, "a temporary was left in %s", dir);
  /* with --force it is replaced */
  unlink(model);
  cr_assert_eq(CTL("export", "j-42", "-o", model, "--force"), 0, "%s", err);
  expect_file(model, "hello world\n");
  export_race[0] = 0;

  /* a stream that ends short: a failure, and nothing left behind */
  unlink(model);
  rc = CTL("export", "j-short", "-o", model);
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "the stream ended after 6 bytes of 10");
  cr_assert_neq(access(model, F_OK), 0, "a short export made %s", model);
  cr_assert_eq(partial_files(dir), 0, "a temporary was left in %s", dir);
  free(dir);
}

/* The file system of vfat and some FUSE and SMB mounts: neither
 * RENAME_NOREPLACE nor hard links (tests/e2e/fs_shim.c makes both fail as
 * there). The export still lands, and a file made while it ran is still
 * left as it was. */
Test(fsdpctl, export_lands_where_the_file_system_has_no_atomic_no_replace) {
  char model[1100], *dir = export_dir("export-vfat", model, sizeof model);
  setenv("LD_PRELOAD", tu_fs_shim(), 1), setenv("FS_NO_NOREPLACE", "1", 1);
  int rc = CTL("export", "j-42", "-o", model);
  const mode_t mask = umask(0);
  umask(mask);
  struct stat st = {0};
  cr_assert_eq(stat(model, &st), 0, "exit %d, no %s: %s", rc, model, err);
  cr_assert_eq(st.st_mode & 0777, 0666 & ~mask, "mode %o", (unsigned)(st.st_mode & 0777));
  snprintf(export_race, sizeof export_race, "%s", model);
  unlink(model);
  int race = CTL("export", "j-42", "-o", model);
  export_race[0] = 0;
  unsetenv("LD_PRELOAD"), unsetenv("FS_NO_NOREPLACE");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_eq(race, 2, "exit %d: %s", race, err);
  expect_in(err, "created while the export ran");
  expect_file(model, "theirs\n");
  cr_assert_eq(partial_files(dir), 0, "a temporary was left in %s", dir);
  free(dir);
}

/* A container's fsdpctl gets the same PID every time, so a temporary that a
 * SIGKILLed export left can carry the PID of the next: that export still
 * runs, under a name of its own, and leaves the other file alone. */
Test(fsdpctl, export_beside_a_killed_exports_temporary) {
  char model[1100], bin[1024], stale[1200], *dir = export_dir("export-stale", model, sizeof model);
  snprintf(bin, sizeof bin, "%s/bin/fsdpctl", tu_root());
  int go[2];
  cr_assert_eq(pipe(go), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (!pid) { /* runs fsdpctl once the stale file with its PID is there */
    char c;
    close(go[1]);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1), dup2(null, 2);
    if (read(go[0], &c, 1) != 1) _exit(126);
    execl(bin, "fsdpctl", "export", "j-42", "-o", model, (char *)NULL);
    _exit(127);
  }
  close(go[0]);
  snprintf(stale, sizeof stale, "%s.partial-%d", model, (int)pid);
  tu_write_file(stale, "stale", 5);
  cr_assert_eq(write(go[1], "g", 1), 1);
  close(go[1]);
  const int rc = ctl_reap(pid, CTL_LIMIT_S);
  cr_assert_eq(rc, 0, "exit %d", rc);
  expect_file(model, "hello world\n");
  expect_file(stale, "stale");
  cr_assert_eq(partial_files(dir), 1, "the export's own temporary was left in %s", dir);
  free(dir);
}

/* The temporary fsdpctl pid is writing in dir (FILE.partial-PID-XXXXXX)
 * into buf; 0 when there is none yet. */
static int partial_of(const char *dir, pid_t pid, char *buf, size_t len) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "model.safetensors.partial-%d-", (int)pid);
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s: %s", dir, strerror(errno));
  struct dirent *e;
  int found = 0;
  for (int k = 0; k < 1000 && !found && (e = readdir(d)); k++)
    if (!strncmp(e->d_name, prefix, strlen(prefix)))
      found = 1, snprintf(buf, len, "%s/%s", dir, e->d_name);
  closedir(d);
  return found;
}

/* SIGINT (^C) or SIGTERM mid-export: fsdpctl dies of the signal as a
 * program should, and its temporary FILE.partial-PID-XXXXXX goes with it. */
Test(fsdpctl, export_interrupted_leaves_no_temporary) {
  char model[1100], bin[1024], partial[1200], *dir = export_dir("export-sig", model, sizeof model);
  snprintf(bin, sizeof bin, "%s/bin/fsdpctl", tu_root());
  static const int sigs[] = {SIGINT, SIGTERM};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (!pid) {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1), dup2(null, 2);
      execl(bin, "fsdpctl", "export", "j-stall", "-o", model, (char *)NULL);
      _exit(127);
    }
    /* until the first piece is in the temporary */
    struct stat st = {0};
    double t0 = tu_now_s();
    partial[0] = 0;
    while (tu_now_s() - t0 < CTL_LIMIT_S &&
           (!(partial[0] || partial_of(dir, pid, partial, sizeof partial)) || stat(partial, &st) ||
            st.st_size < 6))
      nanosleep(&(struct timespec){0, 20000000}, NULL);
    int status = 0;
    if (st.st_size < 6) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    cr_assert_geq(st.st_size, 6, "no piece reached %s within %.0f s", partial, CTL_LIMIT_S);
    kill(pid, sigs[i]);
    pid_t w = 0;
    for (t0 = tu_now_s(); !w && tu_now_s() - t0 < CTL_LIMIT_S;) {
      w = waitpid(pid, &status, WNOHANG);
      if (!w) nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    if (!w) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    cr_assert_eq(w, pid, "fsdpctl outlived signal %d by %.0f s", sigs[i], CTL_LIMIT_S);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == sigs[i], "signal %d: status 0x%x",
              sigs[i], status);
    cr_assert_neq(access(partial, F_OK), 0, "signal %d left %s", sigs[i], partial);
    cr_assert_neq(access(model, F_OK), 0, "signal %d made %s", sigs[i], model);
  }
  free(dir);
}

/* ---- logs -------------------------------------------------------------------------------------- */

/* Without --attempt, logs asks the node for the job's attempt as the
 * coordinator has it now, not for the node's latest: a follow stays in it
 * when the node restarts, also with an fsdpd too old to say which
 * attempt's chunks it sends (found by helper-110: it ran on into the next
 * attempt's log from the old byte). */
Test(fsdpctl, logs_ask_for_the_jobs_attempt_now) {
  fake_start(NULL, NULL);
  int rc = CTL("logs", "j-42", "--rank", "1");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  Fsdp__V1__GetRankLogsRequest *req =
      rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, NULL);
  cr_expect_eq(req->attempt, 1, "attempt %u asked for, not the job's 1", req->attempt);
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

Test(fsdpctl, logs_stream_the_nodes_chunks_in_order) {
  fake_start(NULL, NULL);
  int rc = CTL("logs", "j-42", "--rank", "1", "--tail", "100", "--attempt", "1");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_str_eq(out, "step 1 loss 5.0\nstep 2 loss 4.0\nstep 3 loss 3.0\n");
  Fsdp__V1__GetRankLogsRequest *req =
      rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, NULL);
  cr_assert_str_eq(req->job_id, "j-42");
  cr_assert_eq(req->rank, 1);
  cr_assert_eq(req->attempt, 1);
  cr_assert_eq(req->offset, -100);
  cr_assert(!req->follow);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  Fsdp__V1__GetJobRequest *gq = rec_get("GetJob", &fsdp__v1__get_job_request__descriptor, NULL);
  cr_assert_eq(gq->attempt, 1, "the node of attempt 1's rank, not the current attempt's");
  protobuf_c_message_free_unpacked(&gq->base, NULL);
  Fsdp__V1__ListNodesRequest *nq = rec_get("ListNodes", &fsdp__v1__list_nodes_request__descriptor, NULL);
  cr_assert_str_eq(nq->node_id, "n-1", "the rank's node only, not the whole cluster");
  protobuf_c_message_free_unpacked(&nq->base, NULL);
  /* a rank the job does not have: not found */
  rc = CTL("logs", "j-42", "--rank", "7");
  cr_assert_eq(rc, 3, "exit %d: %s", rc, err);
  expect_in(err, "no rank 7");
}

/* A followed log whose stream breaks is opened again where it stopped:
 * every line once, in order. */
Test(fsdpctl, a_followed_log_whose_stream_breaks_goes_on_where_it_stopped) {
  fake_start(NULL, NULL);
  int rc = CTL("logs", "j-42", "--follow");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_str_eq(out, "step 1 loss 5.0\nstep 2 loss 4.0\nstep 3 loss 3.0\n");
  expect_in(err, "the log stream from node n-1 broke");
  expect_in(err, "resuming at byte 32");
  int calls = 0;
  Fsdp__V1__GetRankLogsRequest *req =
      rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, &calls);
  cr_expect_eq(calls, 2);
  cr_expect_eq(req->offset, 32, "the second stream starts after what was printed");
  cr_expect(req->follow);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  /* each stream with a ticket of its own (the first may have expired) */
  Fsdp__V1__GetLogTicketRequest *tq =
      rec_get("GetLogTicket", &fsdp__v1__get_log_ticket_request__descriptor, &calls);
  cr_expect_eq(calls, 2, "%d tickets", calls);
  protobuf_c_message_free_unpacked(&tq->base, NULL);
}

/* A fake cluster whose node holds its log open, and `fsdpctl logs j-42
 * --follow` started on it, once it has printed step 2 (lout: its output):
 * the follower's pid. */
static pid_t follow_to_step_2(char *lout, size_t len) {
  logs_hold = 1; /* set before the servers' thread starts */
  fake_start(NULL, NULL);
  const pid_t p = CTL_SPAWN("logs", "logs", "j-42", "--follow");
  for (double t0 = tu_now_s(); tu_now_s() - t0 < CTL_LIMIT_S; nanosleep(&(struct timespec){0, 20000000}, NULL))
    if (strstr(ctl_spawned_output("logs", "out", lout, len), "step 2")) break;
  expect_in(lout, "step 2 loss 4.0\n");
  return p;
}

/* The node's fsdpd restarts under a followed log (gone 6.5 s, longer than
 * the 5 reopenings, 4.6 s, after which it used to give up): it is opened
 * again where it stopped, in the attempt it was reading (the node's chunks
 * say 1), as soon as the node serves again, said once on stderr, and ends
 * with the log (exit 0), every line once. */
Test(fsdpctl, a_followed_log_carries_on_through_an_fsdpd_restart) {
  char lout[4096], lerr[4096];
  const pid_t p = follow_to_step_2(lout, sizeof lout);
  fake_node_flip();
  nanosleep(&(struct timespec){6, 500000000}, NULL);
  fake_node_flip();
  const double back = tu_now_s();
  const int rc = ctl_reap(p, CTL_LIMIT_S);
  const double dt = tu_now_s() - back;
  ctl_spawned_output("logs", "out", lout, sizeof lout);
  ctl_spawned_output("logs", "err", lerr, sizeof lerr);
  cr_assert_eq(rc, 0, "exit %d: %s", rc, lerr);
  cr_assert_str_eq(lout, "step 1 loss 5.0\nstep 2 loss 4.0\nstep 3 loss 3.0\n");
  expect_in(lerr, "the log stream from node n-1 broke");
  expect_in(lerr, "resuming at byte 32");
  cr_expect(!strstr(strstr(lerr, "broke") + 1, "broke"), "said once: %s", lerr);
  cr_expect(dt < 2.5 * TU_SLOW, "it came back %.2f s after the node", dt);
  int calls = 0;
  Fsdp__V1__GetRankLogsRequest *req =
      rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, &calls);
  cr_expect_eq(calls, 2, "the node served two streams: %d", calls);
  cr_expect_eq(req->offset, 32, "the last stream starts after what was printed");
  cr_expect_eq(req->attempt, 1, "the attempt it was reading, not the node's latest then");
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* A node gone for good under a followed log given --timeout: it gives up
 * once the node has been unreachable that long (exit 4), saying so and
 * where the log stopped; not before and not long after. */
Test(fsdpctl, a_followed_log_gives_up_on_a_node_gone_for_its_timeout) {
  logs_hold = 1; /* set before the servers' thread starts */
  fake_start(NULL, NULL);
  const pid_t p = CTL_SPAWN("logs", "logs", "j-42", "--follow", "--timeout", "2");
  char lout[4096], lerr[4096];
  for (double t0 = tu_now_s(); tu_now_s() - t0 < CTL_LIMIT_S; nanosleep(&(struct timespec){0, 20000000}, NULL))
    if (strstr(ctl_spawned_output("logs", "out", lout, sizeof lout), "step 2")) break;
  expect_in(lout, "step 2 loss 4.0\n");
  fake_node_flip();
  const double t0 = tu_now_s();
  const int rc = ctl_reap(p, CTL_LIMIT_S);
  const double dt = tu_now_s() - t0;
  ctl_spawned_output("logs", "err", lerr, sizeof lerr);
  cr_assert_eq(rc, 4, "exit %d: %s", rc, lerr);
  expect_in(lerr, "node n-1 stayed unreachable for 2 s");
  expect_in(lerr, "followed to byte 32");
  expect_in(lerr, "fsdpctl logs j-42 --rank 0 --attempt 1 reads it whole");
  cr_expect(dt >= 2.0 && dt < 5.0, "it gave up after %.2f s (--timeout 2)", dt);
}

/* A node that refuses the ticket is no matter of the user's token (fsdpctl
 * never sends a node one): the hint says to run the command again, not to
 * give a token file. */
Test(fsdpctl, a_refused_log_ticket_is_not_blamed_on_the_token) {
  logs_refuse = 1; /* set before the servers' thread starts */
  fake_start(NULL, NULL);
  int rc = CTL("logs", "j-42");
  cr_assert_neq(rc, 0, "%s", out);
  expect_in(err, "the log ticket expired");
  expect_in(err, "run the command again for a fresh one");
  cr_expect(!strstr(err, "token-file"), "%s", err);
}

/* A followed log whose ticket lapses while the coordinator cannot give a
 * fresh one (it restarts: two refusals here) waits for it, saying so once,
 * then goes on where it stopped (before, it ended with the node's
 * "expired"). */
Test(fsdpctl, a_followed_log_whose_ticket_lapses_while_the_coordinator_is_away_waits_for_it) {
  logs_lapse = 1, tickets_away = 2; /* set before the servers' thread starts */
  fake_start(NULL, NULL);
  int rc = CTL("logs", "j-42", "--follow");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_str_eq(out, "step 1 loss 5.0\nstep 2 loss 4.0\nstep 3 loss 3.0\n");
  expect_in(err, "the log ticket for node n-1 expired and the coordinator cannot give a new one");
  expect_in(err, "the coordinator is restarting");
  expect_in(err, "resume at byte 32");
  cr_expect(!strstr(strstr(err, "waiting for it") + 1, "waiting for it"), "said once: %s", err);
  int calls = 0;
  Fsdp__V1__GetRankLogsRequest *req =
      rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, &calls);
  cr_expect_eq(calls, 4, "the first, two with the lapsed ticket, the last: %d", calls);
  cr_expect_eq(req->offset, 32, "the last stream starts after what was printed");
  cr_expect_str_eq(req->ticket, "ticket:n-1:j-42:0:2", "with the second ticket");
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* A followed log whose ticket lapses (fsdpd ends the stream ABORTED once
 * the ticket expired, or its key changed) goes on with a fresh ticket where
 * it stopped: every line once, in order, and nothing said on stderr, for
 * this is routine. */
Test(fsdpctl, a_followed_log_whose_ticket_lapses_goes_on_quietly) {
  logs_lapse = 1; /* set before the servers' thread starts */
  fake_start(NULL, NULL);
  int rc = CTL("logs", "j-42", "--follow");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_str_eq(out, "step 1 loss 5.0\nstep 2 loss 4.0\nstep 3 loss 3.0\n");
  cr_assert_str_eq(err, "", "a lapsed ticket is no error");
  int calls = 0;
  Fsdp__V1__GetRankLogsRequest *req =
      rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, &calls);
  cr_expect_eq(calls, 2);
  cr_expect_eq(req->offset, 32, "the second stream starts after what was printed");
  cr_expect_str_eq(req->ticket, "ticket:n-1:j-42:0:2", "with the second ticket");
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* Whether s holds what a terminal acts on: a C0 control but newline and
 * tab, DEL, a C1 control (UTF-8 c2 80..9f) or a bidi override; which, in
 * *what. */
static int has_control(const char *s, const char **what) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    *what = (const char *)p;
    if ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f) return 1;
    if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) return 1;
    if (!strncmp((const char *)p, "\u202e", 3)) return 1;
  }
  return 0;
}

static void expect_plain(const char *s, const char *cmd) {
  const char *at = NULL;
  cr_expect(!has_control(s, &at), "%s: a control character at byte %zu of:\n%s", cmd,
            (size_t)(at - s), s);
}

/* fsdpctl trusts no server: what a reply says (a node's hostname, a job's
 * name and reason, a drain reason, an error, a watch message) reaches the
 * terminal with its control characters escaped, in tables, lines, errors
 * and JSON (the same strings to a parser). A rank's log is its own bytes:
 * piped, byte for byte; on a terminal, escaped too, but for its newlines
 * and tabs, with a character cut between two chunks shown whole. */
Test(fsdpctl, a_servers_control_characters_are_shown_escaped, .timeout = 60 * TU_SLOW) {
  hostile = 1;
  fake_start(NULL, NULL);
  static const struct {
    const char *args[6], *want; /* in stdout, or else stderr */
    int code;
  } cases[] = {
      {{"nodes"}, "host-\\x1b]0;owned\\x07", 0},
      {{"jobs"}, "gnp\\u202eexe.txt", 0},
      {{"jobs"}, "\\x1b[2J\\u009b31mred\\x7f", 0},
      {{"status", "j-42"}, "\\x1b[2J\\u009b31mred\\x7f", 0},
      {{"status", "j-42"}, "host-\\x1b]0;owned\\x07", 0},
      {{"drain", "n-1", "--reason", "disk"}, "drained: \\x1b[2J\\u009b31mred\\x7f (1 device", 0},
      {{"status", "j-evil"}, "\\x1b]52;c;aGk=\\x07no such job", 3},
      {{"watch", "j-bad"}, "rank 0 exited\\x1b[1A\\x1b[2K", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const int rc = ctl(cases[i].args);
    cr_expect_eq(rc, cases[i].code, "%s: exit %d: %s", cases[i].args[0], rc, err);
    expect_plain(out, cases[i].args[0]);
    expect_plain(err, cases[i].args[0]);
    cr_expect(strstr(out, cases[i].want) || strstr(err, cases[i].want),
              "%s: \"%s\" in neither:\n%s\n%s", cases[i].args[0], cases[i].want, out, err);
  }
  /* JSON in ASCII, which a parser reads back as the server's strings */
  cr_assert_eq(CTL("jobs", "--output", "json"), 0, "%s", err);
  expect_plain(out, "jobs --output json");
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  cr_assert_not_null(j, "%s: %s", je.text, out);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(j, 0), "spec"), "name")), EVIL_NAME);
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(j, 1), "reason")), EVIL_REASON);
  json_decref(j);
  /* the log: raw through a pipe, escaped on a terminal */
  cr_assert_eq(CTL("logs", "j-42"), 0, "%s", err);
  cr_expect_str_eq(out, "\x1b]0;log\x07 caf\u00e9\tok\r\n10%\r50%\rend\n");
  cr_assert_eq(ctl_pty(80, (const char *const[]){"logs", "j-42", NULL}), 0, "%s", out);
  expect_plain(out, "logs on a terminal");
  /* a return is a line end there: no line overwrites another */
  expect_in(out, "\\x1b]0;log\\x07 caf\u00e9\tok\n10%\n50%\nend\n");
}

/* A coordinator in TLS and a node whose fsdpd serves without a certificate
 * (deploy/k8s: a pod has none for its IP): logs reaches it with
 * --node-tls-ca plaintext (or FSDP_NODE_TLS_CA), and without says how; a
 * node in TLS is checked against --node-tls-ca's CA, not --tls-ca's. */
Test(fsdpctl, logs_reach_nodes_as_node_tls_ca_says, .timeout = 60 * TU_SLOW) {
  const char *d = tu_tmpdir();
  tu_tls_make(d);
  char cert[600], key[600], ca[600], other[600], empty[600];
  snprintf(cert, sizeof cert, "%s/srv.pem", d);
  snprintf(key, sizeof key, "%s/srv.key", d);
  snprintf(ca, sizeof ca, "%s/ca.pem", d);
  snprintf(other, sizeof other, "%s/otherca.pem", d);
  snprintf(empty, sizeof empty, "%s/empty.pem", d);
  tu_write_file(empty, "", 0);
  static const char lines[] = "step 1 loss 5.0\nstep 2 loss 4.0\nstep 3 loss 3.0\n";
  fake_start_tls(NULL, NULL, cert, key, 1);
  int rc = CTL("--tls-ca", ca, "logs", "j-42");
  cr_assert_eq(rc, 4, "TLS to a plaintext node: exit %d: %s", rc, err);
  expect_in(err, "needs --node-tls-ca plaintext");
  rc = CTL("--tls-ca", ca, "--node-tls-ca", "plaintext", "logs", "j-42");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_str_eq(out, lines);
  setenv("FSDP_NODE_TLS_CA", "plaintext", 1);
  rc = CTL("--tls-ca", ca, "logs", "j-42");
  unsetenv("FSDP_NODE_TLS_CA");
  cr_assert_eq(rc, 0, "FSDP_NODE_TLS_CA=plaintext: exit %d: %s", rc, err);
  cr_assert_str_eq(out, lines);
  rc = CTL("--tls-ca", ca, "--node-tls-ca", empty, "logs", "j-42");
  cr_assert_eq(rc, 2, "an empty --node-tls-ca: exit %d: %s", rc, err);
  expect_in(err, "--node-tls-ca ");
  expect_in(err, "the file is empty");
  fake_stop();
  /* both in TLS: the node is checked against --node-tls-ca's CA */
  fake_start_tls(NULL, NULL, cert, key, 0);
  rc = CTL("--tls-ca", ca, "logs", "j-42");
  cr_assert_eq(rc, 0, "TLS to both: exit %d: %s", rc, err);
  cr_assert_str_eq(out, lines);
  rc = CTL("--tls-ca", ca, "--node-tls-ca", other, "logs", "j-42");
  cr_assert_eq(rc, 4, "the node checked against another CA: exit %d: %s", rc, err);
  rc = CTL("--tls-ca", ca, "--node-tls-ca", ca, "logs", "j-42");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
}

/* A TLS server closes a plaintext client's connection as it opens: the
 * error says to speak TLS (--tls-ca), not to check the address, for the
 * coordinator and for a node reached with --node-tls-ca plaintext. */
Test(fsdpctl, plaintext_to_a_tls_server_suggests_tls, .timeout = 60 * TU_SLOW) {
  const char *d = tu_tmpdir();
  tu_tls_make(d);
  char cert[600], key[600], ca[600];
  snprintf(cert, sizeof cert, "%s/srv.pem", d);
  snprintf(key, sizeof key, "%s/srv.key", d);
  snprintf(ca, sizeof ca, "%s/ca.pem", d);
  fake_start_tls(NULL, NULL, cert, key, 0);
  int rc = CTL("--timeout", "5", "nodes");
  cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
  expect_in(err, "may require TLS: pass --tls-ca FILE");
  cr_assert_null(strstr(err, "check --coordinator"), "%s", err);
  rc = CTL("--timeout", "5", "--tls-ca", ca, "--node-tls-ca", "plaintext", "logs", "j-42");
  cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
  expect_in(err, "may require TLS: drop --node-tls-ca plaintext");
  /* TLS both ways still works, and a refused port is still an address to check */
  cr_assert_eq(CTL("--tls-ca", ca, "logs", "j-42"), 0, "%s", err);
  setenv("FSDP_COORDINATOR", "127.0.0.1:1", 1);
  cr_assert_eq(CTL("--timeout", "3", "nodes"), 4, "%s", err);
  expect_in(err, "check --coordinator");
  cr_assert_null(strstr(err, "may require TLS"), "%s", err);
}

/* fsdpctl's help calls -o --output, but after export -o is the file: a
 * format's name there is refused, not written as a weights file. */
Test(fsdpctl, export_o_with_a_format_name_is_refused) {
  char model[1100], *dir = export_dir("export-o", model, sizeof model);
  unlink("json");
  for (int i = 0; i < 2; i++) {
    const char *fmt = i ? "table" : "json";
    int rc = CTL("export", "j-42", "-o", fmt);
    cr_expect_eq(rc, 2, "-o %s: exit %d: %s", fmt, rc, err);
    expect_in(err, "-o names the file to write");
    cr_expect_neq(access(fmt, F_OK), 0, "export wrote a file named %s", fmt);
    unlink(fmt);
  }
  /* -o json before the command is the format */
  cr_assert_eq(CTL("-o", "json", "export", "j-42", "-o", model), 0, "%s", err);
  expect_file(model, "hello world\n");
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  cr_expect_not_null(j, "--output json: %s", out);
  json_decref(j);
  free(dir);
}

/* fsdpctl never hands a node the user's token (a node's operator could use
 * it at the coordinator): it asks the coordinator for a ticket for that
 * rank's log on that node, and gives the node that alone. */
Test(fsdpctl, logs_give_the_node_a_ticket_never_the_token) {
  char *user = write_tmp("user.token", "user-secret-00001\n");
  char *node = write_tmp("node.token", "node-secret-00002\n");
  fake_start(user, node);
  setenv("FSDP_TOKEN_FILE", user, 1);
  logs_got_user_token = -1;
  int rc = CTL("logs", "j-42", "--rank", "1");
  unsetenv("FSDP_TOKEN_FILE");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_str_eq(out, "step 1 loss 5.0\nstep 2 loss 4.0\nstep 3 loss 3.0\n");
  cr_assert_eq(logs_got_user_token, 0, "the node was sent a token it takes as a user's");
  Fsdp__V1__GetLogTicketRequest *tq =
      rec_get("GetLogTicket", &fsdp__v1__get_log_ticket_request__descriptor, NULL);
  cr_assert_str_eq(tq->node_id, "n-1");
  cr_assert_str_eq(tq->job_id, "j-42");
  cr_assert_eq(tq->rank, 1);
  protobuf_c_message_free_unpacked(&tq->base, NULL);
  free(user);
  free(node);
}

/* ---- an independent client ---------------------------------------------------------------------- */

Test(fsdpctl, python_grpc_client_submits_reads_and_checks_health, .timeout = 60 * TU_SLOW) {
  char *user = write_tmp("user.token", "user-secret-00001\n");
  char *node = write_tmp("node.token", "node-secret-00002\n");
  fake_start(user, node);
  char cmd[2048], buf[4096];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/e2e/python_client.py %s %s %s 2>&1",
           tu_root(), tu_root(), coord_addr, user);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  buf[n] = 0;
  int st = pclose(p);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "python client: %s", buf);
  cr_assert_str_eq(buf, "submit j-42\nget j-42 JOB_STATE_RUNNING 2\nhealth SERVING\n");
  Fsdp__V1__SubmitJobRequest *req = rec_get("SubmitJob", &fsdp__v1__submit_job_request__descriptor, NULL);
  cr_assert_str_eq(req->request_id, "py-1");
  cr_assert_eq(req->spec->world_size, 2);
  expect_opt(req->spec, 1, "train", "steps", "5");
  protobuf_c_message_free_unpacked(&req->base, NULL);
  free(user), free(node);
}

/* ---- found by an outside tester (helper-117) ------------------------------------------------------ */

/* The node's fsdpd restarts under a followed log on a new port (its
 * default --listen 127.0.0.1:0) and registers that address: the follower
 * asks the coordinator where the node is now, goes on there where it
 * stopped, says so, and ends with the log (exit 0), every line once.
 * Before, it dialed the old address for good. */
Test(fsdpctl, a_followed_log_finds_a_restarted_fsdpd_on_its_new_port) {
  char lout[4096], lerr[4096];
  const pid_t p = follow_to_step_2(lout, sizeof lout);
  const int old_port = node_port;
  fake_node_flip();
  nanosleep(&(struct timespec){1, 0}, NULL);
  node_move = 1;
  fake_node_flip();
  const double back = tu_now_s();
  cr_assert_neq(node_port, old_port, "the node came back on its old port");
  const int rc = ctl_reap(p, 10.0);
  const double dt = tu_now_s() - back;
  ctl_spawned_output("logs", "out", lout, sizeof lout);
  ctl_spawned_output("logs", "err", lerr, sizeof lerr);
  cr_assert_eq(rc, 0, "exit %d: %s", rc, lerr);
  cr_assert_str_eq(lout, "step 1 loss 5.0\nstep 2 loss 4.0\nstep 3 loss 3.0\n");
  char moved[128];
  snprintf(moved, sizeof moved, "node n-1 is at 127.0.0.1:%d now (was 127.0.0.1:%d)", node_port, old_port);
  expect_in(lerr, moved);
  cr_expect(dt < 2.5 * TU_SLOW, "it came back %.2f s after the node", dt);
  Fsdp__V1__GetRankLogsRequest *req =
      rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, NULL);
  cr_expect_eq(req->offset, 32, "the last stream starts after what was printed");
  cr_expect_eq(req->attempt, 1, "in the attempt it was reading");
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* A port that takes connections and never speaks HTTP/2 (another program
 * on it): the watch gives up after --timeout (exit 4), as a unary call
 * does, not after gRPC's connect timeout (20 s). */
Test(fsdpctl, a_watch_gives_up_on_a_port_that_never_speaks_within_the_timeout) {
  char addr[64];
  const int fd = tu_listen_loopback(addr, sizeof addr); /* listens; the kernel accepts; no one speaks */
  const int rc = CTL("watch", "j-1", "--timeout", "2", "--coordinator", addr);
  close(fd);
  cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
  expect_in(err, "no message for 2 s");
  expect_in(err, "check --coordinator");
  cr_assert(ctl_seconds >= 2.0 && ctl_seconds < 4.0 * TU_SLOW, "gave up after %.2f s (--timeout 2)",
            ctl_seconds);
}

/* A TCP relay to the fake coordinator that can freeze: then it reads and
 * writes nothing and accepts no connection (the kernel still completes
 * them), as a coordinator stopped with SIGSTOP. */
static struct {
  pthread_t thread;
  int lfd, target;
  volatile int frozen, stop;
  char addr[64];
} X;

static void *relay_thread(void *arg) {
  (void)arg;
  int fds[64][2], n = 0;
  while (!X.stop) {
    if (X.frozen) {
      nanosleep(&(struct timespec){0, 20000000}, NULL);
      continue;
    }
    struct pollfd p[1 + 128];
    p[0] = (struct pollfd){X.lfd, POLLIN, 0};
    for (int i = 0; i < n; i++)
      p[1 + 2 * i] = (struct pollfd){fds[i][0], POLLIN, 0}, p[2 + 2 * i] = (struct pollfd){fds[i][1], POLLIN, 0};
    if (poll(p, (nfds_t)(1 + 2 * n), 20) <= 0 || X.frozen) continue;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < 2; k++) {
        if (fds[i][0] < 0 || !(p[1 + 2 * i + k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[65536];
        ssize_t r = read(fds[i][k], buf, sizeof buf);
        for (ssize_t w = 0, o = 0; r > 0 && o < r; o += w)
          if ((w = write(fds[i][!k], buf + o, (size_t)(r - o))) <= 0) r = -1;
        if (r <= 0) close(fds[i][0]), close(fds[i][1]), fds[i][0] = fds[i][1] = -1;
      }
    if ((p[0].revents & POLLIN) && n < 64) {
      const int a = accept(X.lfd, NULL, NULL);
      const int b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)X.target)};
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (a >= 0 && b >= 0 && !connect(b, (struct sockaddr *)&sa, sizeof sa)) {
        fds[n][0] = a, fds[n][1] = b, n++;
      } else {
        if (a >= 0) close(a);
        if (b >= 0) close(b);
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (fds[i][0] >= 0) close(fds[i][0]), close(fds[i][1]);
  close(X.lfd);
  return NULL;
}

/* A coordinator frozen under a watch (kill -STOP: its connections stay
 * open, its port takes new ones, nothing answers): the watch notices within
 * --timeout (its keepalive pings go unanswered), tries again, and gives up
 * once it has been unreachable for --timeout (exit 4), as events --follow
 * does. Before, the ping timeout was 30 s (found near 60 s), and every
 * try again waited out gRPC's 20 s connect timeout: still running after 75 s. */
Test(fsdpctl, a_watch_gives_up_on_a_frozen_coordinator_within_the_timeout) {
  fake_start(NULL, NULL);
  X.target = F.port, X.frozen = X.stop = 0;
  X.lfd = tu_listen_loopback(X.addr, sizeof X.addr);
  cr_assert_geq(X.lfd, 0);
  pthread_create(&X.thread, NULL, relay_thread, NULL);
  const pid_t w = CTL_SPAWN("watch", "watch", "j-restart", "--timeout", "2", "--coordinator", X.addr);
  const pid_t e = CTL_SPAWN("events", "events", "j-restart", "--follow", "--timeout", "2",
                            "--coordinator", X.addr);
  char wout[4096], werr[4096], eout[4096];
  for (double t0 = tu_now_s(); tu_now_s() - t0 < CTL_LIMIT_S; nanosleep(&(struct timespec){0, 20000000}, NULL))
    if (strstr(ctl_spawned_output("watch", "out", wout, sizeof wout), "step 1/3") &&
        strstr(ctl_spawned_output("events", "out", eout, sizeof eout), "e3"))
      break;
  expect_in(wout, "step 1/3");
  /* frozen under a quiet watch, as a coordinator is between a job's messages */
  nanosleep(&(struct timespec){3, 0}, NULL);
  X.frozen = 1;
  const double t0 = tu_now_s();
  const int wrc = ctl_reap(w, 15.0);
  const double dw = tu_now_s() - t0;
  const int erc = ctl_reap(e, 15.0);
  X.stop = 1;
  pthread_join(X.thread, NULL);
  ctl_spawned_output("watch", "err", werr, sizeof werr);
  printf("a frozen coordinator: the watch gave up after %.2f s (--timeout 2)\n", dw);
  cr_assert_eq(wrc, 4, "watch: exit %d: %s", wrc, werr);
  cr_assert_eq(erc, 4, "events --follow: exit %d", erc);
  expect_in(werr, "the coordinator stayed unreachable for 2 s");
  /* unnoticed for at most --timeout (pings every 1 s, 1 s for the answer),
   * then unreachable for --timeout, and a try's --timeout at most */
  cr_expect(dw >= 2.0 && dw < 8.0 * TU_SLOW, "the watch gave up after %.2f s (--timeout 2)", dw);
}

/* A DEADLINE_EXCEEDED the coordinator sent (its database locked) shows its
 * words, not "no answer within 10 s", and no fix pointing at
 * --coordinator (it answered); one the client's own deadline ends still
 * says so. */
Test(fsdpctl, a_deadline_the_server_sent_shows_its_words) {
  fake_start(NULL, NULL);
  int rc = CTL("submit", "--ranks", "1", "--name", "locked");
  cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
  expect_in(err, "fsdpctl: submitting the job: ");
  expect_in(err, "DEADLINE_EXCEEDED: state database /var/lib/fsdp/state.db: locked by another "
                 "connection for over 5000 ms");
  cr_assert_null(strstr(err, "no answer within"), "%s", err);
  cr_assert_null(strstr(err, "check --coordinator"), "%s", err);
  char addr[64];
  const int fd = tu_listen_loopback(addr, sizeof addr);
  rc = CTL("jobs", "--timeout", "1", "--coordinator", addr);
  close(fd);
  cr_assert_eq(rc, 4, "exit %d: %s", rc, err);
  expect_in(err, "DEADLINE_EXCEEDED: no answer within 1 s");
  expect_in(err, "check --coordinator");
}

/* A port out of range (gRPC takes 99999 as 34463) and a directory as a
 * token file are usage errors naming what is wrong and where it came from
 * (exit 2), found before any call. */
Test(fsdpctl, a_port_out_of_range_and_a_directory_token_file_are_usage_errors) {
  setenv("FSDP_COORDINATOR", "127.0.0.1:99999", 1);
  int rc = CTL("jobs");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "FSDP_COORDINATOR: 127.0.0.1:99999: port 99999 is out of range: a port is from 1 to 65535");
  rc = CTL("jobs", "--coordinator", "[::1]:0");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "--coordinator: [::1]:0: port 0 is out of range");
  rc = CTL("watch", "j-1", "--coordinator", "dns:///localhost:123456");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "port 123456 is out of range");
  setenv("FSDP_COORDINATOR", "127.0.0.1:1", 1); /* never reached */
  rc = CTL("jobs", "--token-file", tu_tmpdir());
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  char want[1024];
  snprintf(want, sizeof want, "token file %s: a directory, not a file; give the path of the file itself",
           tu_tmpdir());
  expect_in(err, want);
  cr_assert_lt(ctl_seconds, 2.0, "a usage error took %.2f s", ctl_seconds);
}

/* watch -o json: an ETA none knows (the proto's 0) is null, and an ended
 * job has none (null; "ETA -" in the lines), whatever the coordinator sent
 * with the end (1962.25 s for a cancelled job). */
Test(fsdpctl, watch_says_no_eta_when_unknown_or_ended) {
  fake_start(NULL, NULL);
  int rc = CTL("watch", "j-cancel", "-o", "json");
  cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
  int lines = 0;
  for (char *line = out, *nl; lines < 4 && (nl = strchr(line, '\n')); line = nl + 1, lines++) {
    *nl = 0;
    json_t *j = parse_json(line), *eta = json_object_get(j, "eta_s");
    cr_assert(eta && json_is_null(eta), "line %d: eta_s is not null: %s", lines + 1, line);
    json_decref(j);
  }
  cr_assert_eq(lines, 2);
  cr_assert_eq(CTL("watch", "j-cancel"), 1, "%s", err);
  expect_in(out, "CANCELLED");
  cr_assert_null(strstr(out, "ETA 3"), "%s", out);
  cr_assert_null(strstr(out, "ETA 0"), "%s", out);
  const char *second = strchr(out, '\n') + 1;
  expect_in(second, "| ETA -");
  /* an ETA that is known is a number */
  cr_assert_eq(CTL("watch", "j-ok", "-o", "json"), 0, "%s", err);
  *strchr(out, '\n') = 0;
  json_t *j = parse_json(out);
  cr_assert_float_eq(json_real_value(json_object_get(j, "eta_s")), 2.0, 1e-9, "%s", out);
  json_decref(j);
}

/* logs -o json is refused (a log is bytes, not JSON), and jobs -o json
 * does not show each job's options as empty (ListJobs carries none). */
Test(fsdpctl, logs_refuse_json_and_the_listing_leaves_out_options) {
  fake_start(NULL, NULL);
  int rc = CTL("logs", "j-42", "-o", "json");
  cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
  expect_in(err, "--output json: a log is printed as the rank wrote it, never as JSON");
  cr_assert_str_eq(out, "");
  cr_assert_eq(CTL("-o", "json", "logs", "j-42"), 2, "%s", err);
  cr_assert_eq(CTL("jobs", "-o", "json"), 0, "%s", err);
  json_t *j = parse_json(out), *spec = json_object_get(json_array_get(j, 0), "spec");
  cr_assert(json_is_object(spec), "%s", out);
  cr_assert_null(json_object_get(spec, "options"), "a listing's job shows options: %s", out);
  cr_assert_str_eq(json_string_value(json_object_get(spec, "name")), "demo");
  json_decref(j);
}

/* On a terminal 60 columns wide the nodes table fits (its columns add up
 * to 88 here), as jobs' and status' do: each line cut at the width. */
Test(fsdpctl, the_nodes_table_fits_the_terminal) {
  fake_start(NULL, NULL);
  cr_assert_eq(ctl_pty(60, (const char *const[]){"nodes", NULL}), 0, "%s", out);
  int lines = 0;
  for (char *line = out, *nl; lines < 10 && (nl = strchr(line, '\n')); line = nl + 1, lines++) {
    *nl = 0;
    const int w = utf8_columns(line);
    cr_assert(w >= 0 && w <= 60, "a line of %d columns: \"%s\"", w, line);
    cr_assert(!strcmp(line + strlen(line) - 3, "..."), "not cut: \"%s\"", line);
  }
  cr_assert_eq(lines, 2, "%s", out);
  /* a pipe gets the lines whole */
  cr_assert_eq(CTL("nodes"), 0, "%s", err);
  const char *row = strstr(out, "n-1");
  cr_assert(row && strstr(row, "1.0 GiB / 16.0 GiB") && strstr(row, "-\n") - row > 60, "%s", out);
}

/* --tail 0 is none of the log (as tail -c 0), not the whole of it: an
 * offset at the end; jobs --limit 0 is every job, not the default 1000. */
Test(fsdpctl, tail_0_prints_nothing_and_limit_0_lists_every_job) {
  fake_start(NULL, NULL);
  int rc = CTL("logs", "j-42", "--tail", "0");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  cr_assert_str_eq(out, "", "--tail 0 printed the log");
  Fsdp__V1__GetRankLogsRequest *req =
      rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, NULL);
  cr_assert_eq(req->offset, INT64_MAX, "offset %lld", (long long)req->offset);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  /* followed from the end, a stream that breaks before its first byte
   * resumes where the end was (the node's empty chunk said), not at the
   * end again, which would skip what was written meanwhile */
  int calls = 0;
  rc = CTL("logs", "j-42", "--tail", "0", "--follow");
  cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
  expect_in(err, "resuming at byte 48");
  req = rec_get("GetRankLogs", &fsdp__v1__get_rank_logs_request__descriptor, &calls);
  cr_assert_eq(req->offset, 48, "the second stream asked for byte %lld", (long long)req->offset);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  cr_assert_eq(CTL("jobs", "--limit", "0"), 0, "%s", err);
  Fsdp__V1__ListJobsRequest *lq = rec_get("ListJobs", &fsdp__v1__list_jobs_request__descriptor, NULL);
  cr_assert_eq(lq->limit, UINT32_MAX, "--limit 0 asked for %u", lq->limit);
  protobuf_c_message_free_unpacked(&lq->base, NULL);
  expect_in(out, "j-43");
  cr_assert_eq(CTL("jobs"), 0, "%s", err);
  lq = rec_get("ListJobs", &fsdp__v1__list_jobs_request__descriptor, NULL);
  cr_assert_eq(lq->limit, 1000, "no --limit asked for %u", lq->limit);
  protobuf_c_message_free_unpacked(&lq->base, NULL);
}

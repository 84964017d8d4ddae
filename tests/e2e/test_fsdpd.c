/* End-to-end tests of fsdpd, run as a program against a fake coordinator.
 *
 * The fake coordinator is this test's own rpc_server on a libuv loop in a
 * thread: RegisterNode records the request and names the node "n-1";
 * Heartbeat holds each call HOLD_MS, then answers with the reply the test
 * queued (assignments, kills), or empty, or `reregister` when the session is
 * not the current one (a restarted coordinator); Rendezvous collects the
 * payloads of a (job, attempt) and answers complete once all are in (after a
 * short hold otherwise), ESTALE for jobs named "stale-*"; ReportRankExit
 * records. bin/fsdpd runs as a process with --devices cpu:2 on 127.0.0.1 and
 * starts bin/fsdp-train ranks (the `tiny` model) through it.
 *
 * Covered: registration (devices, Node address), a 2-rank job to the end
 * (exits reported, heartbeats with rising steps and memory, logs, ring
 * addresses only from Rendezvous), GetRankLogs, a Kill mid-job (both ranks
 * gone within grace + 1 s, nothing of their groups left), the coordinator
 * going away and coming back (fsdpd re-registers with its ranks, which kept
 * running), a "../" job id refused before it reaches a path, an ended
 * attempt's rendezvous (ESTALE) given up without a report, SIGTERM to
 * fsdpd, the root checks (no --run-as refused with exit 2; ranks run as
 * nobody), FIFOs in a rank's log's place (refused, never waited on), the
 * cap on log streams, the end of a stalled one and of one whose ticket
 * lapsed (expired, or the node given a new key), and the limit on open
 * files. The test process is a child subreaper: whatever fsdpd leaves is
 * its to kill and reap in .fini, so no process outlives a test. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/rpc.h"
#include "daemon/common/ticket.h"
#include "daemon/job/job.h"
#include "proto/fsdp.pb-c.h"
#include "tests/unit/testutil.h"

#define HOLD_MS 150      /* the fake coordinator's heartbeat hold */
#define GRACE_S 2        /* fsdpd --grace */
#define MAX_RECS 8192
#define MAX_EXITS 16
#define MAX_JOBS 8
#define NOBODY 65534

/* ---- the fake coordinator's state (F.mu guards it) ------------------------------- */

typedef struct hb_rec {
  char job[32];
  uint32_t rank;
  int64_t step;
  int nmem, has_params;
  int running;
} hb_rec_t;

typedef struct exit_rec {
  char job[32], message[512];
  uint32_t attempt, rank;
  int32_t exit_status, term_signal;
  int node_stopping;
  int fenced;
  double at;
} exit_rec_t;

typedef struct rdv_job {
  char job[32];
  uint32_t attempt, size;
  char payload[8][64];
  unsigned have;
  int calls;
} rdv_job_t;

static struct {
  pthread_t thread;
  uv_loop_t loop;
  uv_async_t wake;
  rpc_server_t *srv;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ready, rc, port, stop;
  char err[1024];
  /* what fsdpd told it */
  int regs;
  char reg_node_id[64], reg_address[128], reg_host[128];
  int reg_ndev, reg_ncpu, reg_nranks, reg_exited;
  int refuse_exits, exit_refusals; /* ReportRankExit answered UNAVAILABLE while set */
  unsigned exit_refused_ranks;      /* a bit for each rank refused so */
  int refuse_regs, reg_refusals;   /* RegisterNode refused while set: 1 UNAUTHENTICATED, 2 ALREADY_EXISTS */
  int key_next;                    /* RegisterNode gives log_key_next */
  uint64_t session, generation;
  int heartbeats, reregisters_sent, dev_busy_seen;
  /* heartbeats saying fsdpd leaves; the exits reported before the first,
   * and the ranks it still called running */
  int leaves, leave_nexits, leave_running;
  int takes_no_leave; /* answers a leaving heartbeat as an older coordinator: no left */
  hb_rec_t recs[MAX_RECS];
  int nrecs;
  exit_rec_t exits[MAX_EXITS];
  int nexits;
  rdv_job_t jobs[MAX_JOBS];
  int njobs;
  /* what it tells fsdpd next */
  uint8_t *queued;
  size_t queued_len;
} F = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* fsdpd, as a process */
static int fsdpd_pid;
static char *workdir, *fsdpd_log, *tokens;

/* ---- handlers (on the fake's loop thread) ----------------------------------------- */

/* The log ticket key the fake coordinator gives at registration, when set
 * (log_key_next instead while F.key_next is set: a new key, as a real
 * coordinator gives at each registration); and the fence
 * (RegisterNodeReply.fence_ms; 0: none). */
static int log_key_given;
static uint32_t fence_ms_given;
static const uint8_t log_key[TICKET_KEY_BYTES] = "0123456789abcdef0123456789abcde";
static const uint8_t log_key_next[TICKET_KEY_BYTES] = "the next registration's new key";

static void h_register(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__RegisterNodeRequest *req = (const void *)m;
  pthread_mutex_lock(&F.mu);
  if (F.refuse_regs) {
    F.reg_refusals++;
    const int twin = F.refuse_regs == 2;
    pthread_mutex_unlock(&F.mu);
    rpc_call_finish(call, twin ? err_set(FSDP_EEXIST, "another live fsdpd holds node %s (the test's "
                                         "twin)", req->hostname)
                               : err_set(FSDP_EAUTH, "the test's coordinator takes no node now"));
    return;
  }
  F.regs++;
  snprintf(F.reg_node_id, sizeof F.reg_node_id, "%s", req->node_id);
  snprintf(F.reg_address, sizeof F.reg_address, "%s", req->address);
  snprintf(F.reg_host, sizeof F.reg_host, "%s", req->hostname);
  F.reg_ndev = (int)req->n_devices;
  F.reg_ncpu = 0;
  for (size_t i = 0; i < req->n_devices; i++)
    F.reg_ncpu += !strcmp(req->devices[i]->kind, "cpu") && req->devices[i]->index == i &&
                  req->devices[i]->total_bytes > 0;
  F.reg_nranks = (int)req->n_ranks;
  F.reg_exited = 0;
  for (size_t i = 0; i < req->n_ranks; i++)
    F.reg_exited += req->ranks[i]->state == FSDP__V1__RANK_STATE__RANK_STATE_EXITED;
  F.session = F.generation * 1000 + (uint64_t)F.regs;
  Fsdp__V1__RegisterNodeReply rep = FSDP__V1__REGISTER_NODE_REPLY__INIT;
  rep.node_id = "n-1";
  rep.session = F.session;
  rep.heartbeat_interval_ms = HOLD_MS;
  if (log_key_given)
    rep.log_key.data = (uint8_t *)(F.key_next ? log_key_next : log_key), rep.log_key.len = sizeof log_key;
  rep.fence_ms = fence_ms_given;
  pthread_mutex_unlock(&F.mu);
  rpc_call_reply(call, &rep.base);
}

typedef struct hold {
  uv_timer_t timer;
  rpc_call_t *call;
  int reregister, left;
  char job[32];
  uint32_t attempt;
  int rdv_index;
} hold_t;

static void hold_closed(uv_handle_t *h) { free(h->data); }

static void hold_cancel(rpc_call_t *call, void *arg) {
  (void)call;
  hold_t *h = arg;
  uv_close((uv_handle_t *)&h->timer, hold_closed);
}

/* The held heartbeat's answer: what the test queued, or nothing. */
static void heartbeat_answer(uv_timer_t *t) {
  hold_t *h = t->data;
  pthread_mutex_lock(&F.mu);
  Fsdp__V1__HeartbeatReply *rep = NULL;
  if (F.queued && !h->reregister) {
    rep = fsdp__v1__heartbeat_reply__unpack(NULL, F.queued_len, F.queued);
    free(F.queued);
    F.queued = NULL;
  }
  pthread_mutex_unlock(&F.mu);
  Fsdp__V1__HeartbeatReply empty = FSDP__V1__HEARTBEAT_REPLY__INIT;
  empty.reregister = h->reregister;
  empty.left = h->left; /* as a coordinator that takes the leave answers */
  rpc_call_reply(h->call, rep ? &rep->base : &empty.base);
  if (rep) fsdp__v1__heartbeat_reply__free_unpacked(rep, NULL);
  uv_close((uv_handle_t *)&h->timer, hold_closed);
}

static void h_heartbeat(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__HeartbeatRequest *req = (const void *)m;
  hold_t *h = calloc(1, sizeof *h);
  pthread_mutex_lock(&F.mu);
  F.heartbeats++;
  h->reregister = req->session != F.session || strcmp(req->node_id, "n-1");
  h->left = req->leaving && !h->reregister && !F.takes_no_leave;
  F.reregisters_sent += h->reregister;
  if (req->leaving && !F.leaves++) {
    F.leave_nexits = F.nexits;
    for (size_t i = 0; i < req->n_ranks; i++)
      F.leave_running += req->ranks[i]->state == FSDP__V1__RANK_STATE__RANK_STATE_RUNNING;
  }
  for (size_t i = 0; i < req->n_devices; i++) F.dev_busy_seen += req->devices[i]->job_id[0] != 0;
  for (size_t i = 0; i < req->n_ranks && F.nrecs < MAX_RECS; i++) {
    const Fsdp__V1__RankStatus *st = req->ranks[i];
    hb_rec_t *r = &F.recs[F.nrecs++];
    snprintf(r->job, sizeof r->job, "%s", st->job_id);
    r->rank = st->rank;
    r->step = st->step;
    r->running = st->state == FSDP__V1__RANK_STATE__RANK_STATE_RUNNING;
    r->nmem = (int)st->n_memory;
    for (size_t k = 0; k < st->n_memory; k++)
      r->has_params |= !strcmp(st->memory[k]->name, "params") && st->memory[k]->peak_bytes > 0;
  }
  /* something queued goes out at once, and a leaving one's answer;
   * otherwise the call is held */
  int now = F.queued != NULL || h->reregister || req->leaving;
  pthread_mutex_unlock(&F.mu);
  h->call = call;
  uv_timer_init(&F.loop, &h->timer);
  h->timer.data = h;
  rpc_call_on_cancel(call, hold_cancel, h);
  uv_timer_start(&h->timer, heartbeat_answer, now ? 0 : HOLD_MS, 0);
}

/* A rendezvous answer: complete with every payload once all are in. */
static void rendezvous_answer(uv_timer_t *t) {
  hold_t *h = t->data;
  Fsdp__V1__RendezvousReply rep = FSDP__V1__RENDEZVOUS_REPLY__INIT;
  ProtobufCBinaryData p[8];
  pthread_mutex_lock(&F.mu);
  rdv_job_t *j = &F.jobs[h->rdv_index];
  if (j->have == (1u << j->size) - 1) {
    rep.complete = 1;
    rep.n_payloads = j->size;
    for (uint32_t r = 0; r < j->size; r++) p[r] = (ProtobufCBinaryData){strlen(j->payload[r]),
                                                                        (uint8_t *)j->payload[r]};
    rep.payloads = p;
  }
  rpc_call_reply(h->call, &rep.base); /* encoded now, under the lock that keeps payloads still */
  pthread_mutex_unlock(&F.mu);
  uv_close((uv_handle_t *)&h->timer, hold_closed);
}

static void h_rendezvous(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__RendezvousRequest *req = (const void *)m;
  if (!strncmp(req->job_id, "stale-", 6)) {
    rpc_call_finish(call, err_set(FSDP_ESTALE, "job %s: attempt %u has ended", req->job_id, req->attempt));
    return;
  }
  pthread_mutex_lock(&F.mu);
  int i = 0;
  while (i < F.njobs && (strcmp(F.jobs[i].job, req->job_id) || F.jobs[i].attempt != req->attempt)) i++;
  int bad = req->group_size > 8 || req->rank >= req->group_size || strcmp(req->group, "world") ||
            req->payload.len >= 64 || strcmp(req->node_id, "n-1") || (i == F.njobs && i == MAX_JOBS);
  if (!bad && i == F.njobs) {
    F.njobs++;
    snprintf(F.jobs[i].job, sizeof F.jobs[i].job, "%s", req->job_id);
    F.jobs[i].attempt = req->attempt;
    F.jobs[i].size = req->group_size;
  }
  if (!bad) {
    rdv_job_t *j = &F.jobs[i];
    j->calls++;
    memcpy(j->payload[req->rank], req->payload.data, req->payload.len);
    j->payload[req->rank][req->payload.len] = 0;
    j->have |= 1u << req->rank;
  }
  int complete = !bad && F.jobs[i].have == (1u << F.jobs[i].size) - 1;
  pthread_mutex_unlock(&F.mu);
  if (bad) {
    rpc_call_finish(call, err_set(FSDP_EINVAL, "rendezvous: a malformed request"));
    return;
  }
  hold_t *h = calloc(1, sizeof *h);
  h->call = call;
  h->rdv_index = i;
  uv_timer_init(&F.loop, &h->timer);
  h->timer.data = h;
  rpc_call_on_cancel(call, hold_cancel, h);
  uv_timer_start(&h->timer, rendezvous_answer, complete ? 0 : 100, 0);
}

static void h_report_exit(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__ReportRankExitRequest *req = (const void *)m;
  pthread_mutex_lock(&F.mu);
  if (F.refuse_exits) {
    F.exit_refusals++;
    if (req->rank < 32) F.exit_refused_ranks |= 1u << req->rank;
    pthread_mutex_unlock(&F.mu);
    rpc_call_finish(call, err_set(FSDP_EUNAVAILABLE, "the test's coordinator is not taking exits now"));
    return;
  }
  if (F.nexits < MAX_EXITS) {
    exit_rec_t *e = &F.exits[F.nexits++];
    snprintf(e->job, sizeof e->job, "%s", req->job_id);
    snprintf(e->message, sizeof e->message, "%s", req->message);
    e->attempt = req->attempt;
    e->rank = req->rank;
    e->exit_status = req->exit_status;
    e->term_signal = req->term_signal;
    e->node_stopping = req->node_stopping;
    e->fenced = req->fenced;
    e->at = tu_now_s();
  }
  pthread_mutex_unlock(&F.mu);
  Fsdp__V1__ReportRankExitReply rep = FSDP__V1__REPORT_RANK_EXIT_REPLY__INIT;
  rpc_call_reply(call, &rep.base);
}

/* ---- the fake's loop, in its thread ------------------------------------------------ */

static void wake_cb(uv_async_t *a) {
  (void)a;
  pthread_mutex_lock(&F.mu);
  int stop = F.stop;
  pthread_mutex_unlock(&F.mu);
  if (stop) {
    rpc_server_destroy(F.srv); /* cancels held calls: their timers close */
    F.srv = NULL;
    uv_close((uv_handle_t *)&F.wake, NULL);
  }
}

static void *fake_thread(void *arg) {
  (void)arg;
  uv_loop_init(&F.loop);
  uv_async_init(&F.loop, &F.wake, wake_cb);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", F.port);
  const rpc_server_opts_t o = {.addr = addr};
  const rpc_method_t ms[] = {
      {"/fsdp.v1.Coordinator/RegisterNode", &fsdp__v1__register_node_request__descriptor,
       &fsdp__v1__register_node_reply__descriptor, 0, RPC_ROLE_NODE, h_register, NULL},
      {"/fsdp.v1.Coordinator/Heartbeat", &fsdp__v1__heartbeat_request__descriptor,
       &fsdp__v1__heartbeat_reply__descriptor, 0, RPC_ROLE_NODE, h_heartbeat, NULL},
      {"/fsdp.v1.Coordinator/Rendezvous", &fsdp__v1__rendezvous_request__descriptor,
       &fsdp__v1__rendezvous_reply__descriptor, 0, RPC_ROLE_NODE, h_rendezvous, NULL},
      {"/fsdp.v1.Coordinator/ReportRankExit", &fsdp__v1__report_rank_exit_request__descriptor,
       &fsdp__v1__report_rank_exit_reply__descriptor, 0, RPC_ROLE_NODE, h_report_exit, NULL},
  };
  int rc = rpc_server_create(&F.srv, &F.loop, &o);
  if (!rc) rc = rpc_server_add_all(F.srv, ms, sizeof ms / sizeof ms[0]);
  if (!rc) rc = rpc_server_start(F.srv);
  pthread_mutex_lock(&F.mu);
  F.rc = rc;
  if (!rc) F.port = rpc_server_port(F.srv);
  snprintf(F.err, sizeof F.err, "%s", err_msg());
  F.ready = 1;
  pthread_cond_broadcast(&F.cv);
  pthread_mutex_unlock(&F.mu);
  if (rc) {
    if (F.srv) rpc_server_destroy(F.srv);
    uv_close((uv_handle_t *)&F.wake, NULL);
  }
  uv_run(&F.loop, UV_RUN_DEFAULT);
  uv_loop_close(&F.loop);
  return NULL;
}

/* Starts the fake on F.port (0: any); a new generation of sessions. */
static void fake_start(void) {
  F.ready = F.stop = 0;
  F.generation++;
  F.session = 0; /* a restarted coordinator knows no session */
  pthread_create(&F.thread, NULL, fake_thread, NULL);
  double until = tu_now_s() + 10;
  while (tu_now_s() < until) {
    pthread_mutex_lock(&F.mu);
    int ready = F.ready;
    pthread_mutex_unlock(&F.mu);
    if (ready) break;
    usleep(5000);
  }
  cr_assert(F.ready, "the fake coordinator did not start within 10 s");
  if (F.rc) pthread_join(F.thread, NULL);
  cr_assert_eq(F.rc, 0, "fake coordinator: %s", F.err);
}

static void fake_stop(void) {
  if (!F.ready || F.rc) return;
  pthread_mutex_lock(&F.mu);
  F.stop = 1;
  pthread_mutex_unlock(&F.mu);
  uv_async_send(&F.wake);
  pthread_join(F.thread, NULL);
  F.ready = 0;
}

/* ---- processes, from /proc ---------------------------------------------------------- */

/* Calls fn for every process (its pid, state, parent and group); returns
 * how many calls returned non-zero. */
static int proc_each(int (*fn)(int pid, char st, int ppid, int pgrp, void *arg), void *arg) {
  int n = 0;
  DIR *d = opendir("/proc");
  for (struct dirent *e; d && (e = readdir(d));) {
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    /* "pid (comm) state ppid pgrp ...": comm may hold anything; parse after the last ')' */
    char *rp = strrchr(buf, ')'), st;
    int ppid, pgrp;
    if (rp && sscanf(rp + 1, " %c %d %d", &st, &ppid, &pgrp) == 3)
      n += fn(atoi(e->d_name), st, ppid, pgrp, arg) != 0;
  }
  if (d) closedir(d);
  return n;
}

/* SIGKILLs a child of ours (fsdpd, or a rank reparented to this subreaper). */
static int kill_child(int pid, char st, int ppid, int pgrp, void *arg) {
  (void)st, (void)pgrp, (void)arg;
  return ppid == getpid() && kill(pid, SIGKILL) == 0;
}

typedef struct pids {
  int ppid, n, pid[2];
} pids_t;

static int note_child(int pid, char st, int ppid, int pgrp, void *arg) {
  pids_t *p = arg;
  (void)pgrp;
  if (ppid != p->ppid || st == 'Z' || p->n == 2) return 0;
  p->pid[p->n++] = pid;
  return 1;
}

static int in_group(int pid, char st, int ppid, int pgrp, void *arg) {
  (void)pid, (void)st, (void)ppid;
  return pgrp == *(int *)arg;
}

/* 1 when any process (zombies included) is in process group pgid. */
static int group_alive(int pgid) { return proc_each(in_group, &pgid) > 0; }

/* ---- fsdpd, the process -------------------------------------------------------------- */

#define FSDPD_LEAK_FD 77

/* Runs bin/fsdpd with args (NULL-terminated, after --coordinator), its
 * output into fsdpd_log; returns its pid. */
static int fsdpd_spawn(const char *const *extra) {
  char coord[64], root[1024], prog[1100];
  snprintf(coord, sizeof coord, "127.0.0.1:%d", F.port);
  snprintf(root, sizeof root, "%s", tu_root());
  snprintf(prog, sizeof prog, "%s/bin/fsdpd", root);
  const char *argv[40] = {prog, "--coordinator", coord};
  int n = 3;
  for (int i = 0; extra && extra[i] && n < 38; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  int pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(fsdpd_log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    /* a descriptor its parent left open (not close-on-exec), which must not
     * reach the ranks: FSDPD_LEAK_FD, to the log */
    dup2(fd, FSDPD_LEAK_FD);
    execv(prog, (char **)argv);
    _exit(127);
  }
  return pid;
}

/* The usual daemon: 2 CPU devices, ranks as nobody when we are root. */
static void fsdpd_start(void) {
  const char *args[] = {"--devices", "cpu:2", "--work-dir", workdir, "--grace", "2",
                        geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  fsdpd_pid = fsdpd_spawn(args);
}

/* Waits until cond() holds (F.mu held while it is asked), at most secs. */
static int wait_for(int (*cond)(void), double secs) {
  double until = tu_now_s() + secs;
  for (;;) {
    pthread_mutex_lock(&F.mu);
    int ok = cond();
    pthread_mutex_unlock(&F.mu);
    if (ok) return 1;
    if (tu_now_s() > until) return 0;
    usleep(10000);
  }
}

static int registered(void) { return F.regs >= 1; }

/* A cleared record for the next test, the fake on a fresh port, the dirs. */
static void setup(void) {
  cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  pthread_mutex_lock(&F.mu);
  free(F.queued);
  F.queued = NULL;
  F.refuse_regs = F.reg_refusals = F.key_next = 0;
  F.regs = F.heartbeats = F.reregisters_sent = F.dev_busy_seen = F.nrecs = F.nexits = F.njobs = 0;
  memset(F.jobs, 0, sizeof F.jobs);
  F.port = 0;
  pthread_mutex_unlock(&F.mu);
  /* the ranks run as nobody: the token file must be theirs to read */
  cr_assert_eq(chmod(tu_tmpdir(), 0755), 0);
  if (!tokens) tokens = tu_token_file("tokens.bin", 1 << 14, 7, 256);
  cr_assert_eq(chmod(tokens, 0644), 0);
  free(workdir);
  free(fsdpd_log);
  static int n;
  char name[64];
  snprintf(name, sizeof name, "work-%d", ++n);
  workdir = tu_path(name);
  snprintf(name, sizeof name, "fsdpd-%d.log", n);
  fsdpd_log = tu_path(name);
  fake_start();
}

/* Every process left (fsdpd, and ranks reparented to us) is killed and reaped. */
static void teardown(void) {
  unsetenv("FSDP_LOG_STREAMS_MAX"); /* set by some tests for their fsdpd */
  unsetenv("FSDP_STREAM_STALL_S");
  if (fsdpd_pid > 0) {
    kill(fsdpd_pid, SIGKILL);
    waitpid(fsdpd_pid, NULL, 0);
    fsdpd_pid = 0;
  }
  for (int round = 0; round < 100 && proc_each(kill_child, NULL); round++) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    usleep(10000);
  }
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  fake_stop();
}

/* ---- jobs ---------------------------------------------------------------------------- */

/* The reply the next heartbeat gets (replacing one not sent yet). */
static void queue_reply(const Fsdp__V1__HeartbeatReply *rep) {
  size_t n = fsdp__v1__heartbeat_reply__get_packed_size(rep);
  uint8_t *b = malloc(n);
  fsdp__v1__heartbeat_reply__pack(rep, b);
  pthread_mutex_lock(&F.mu);
  free(F.queued);
  F.queued = b;
  F.queued_len = n;
  pthread_mutex_unlock(&F.mu);
}

/* The ring secret of every job queued here, and its FSDP_RING_SECRET. */
static const uint8_t JOB_SECRET[32] = {0xfe, 0xed, 0xfa, 0xce, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                       13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 0xff};
#define JOB_SECRET_HEX "feedface0102030405060708090a0b0c0d0e0f101112131415161718191a1bff"
static size_t job_secret_len = sizeof JOB_SECRET; /* what the assignments give of it */
/* the plan's tunables the assignments carry (NULL-ended; none by default) */
static char *job_plan_env[4];

/* Queues a heartbeat reply with one assignment per rank (rank r on device r). */
/* A job of world ranks and steps steps, plus the option [output]
 * sample_prompt = prompt when prompt is not NULL. */
/* The checkpoint_dir of the jobs queued next (NULL: none). */
static const char *job_ckpt_dir;

static void queue_job_prompt(const char *job, int world, int steps, const char *prompt) {
  char vsteps[32];
  snprintf(vsteps, sizeof vsteps, "%d", steps);
  Fsdp__V1__Option o[11];
  Fsdp__V1__Option *po[11];
  /* steps twice, as a spec stored before the coordinator refused that may
   * hold it: the rank's job file takes the last alone (fsdp-train refuses a
   * key set twice), so every job here runs its steps, not 1 */
  const char *kv[11][3] = {{"train", "steps", "1"},     {"model", "model", "tiny"},
                           {"train", "steps", vsteps},
                           {"train", "batch", "2"},     {"train", "seq_len", "32"},
                           {"optim", "warmup_steps", "1"}, {"data", "data", tokens},
                           {"", "eval_fraction", "0.1"}, {"output", "sample_prompt", prompt}};
  int nopt = prompt ? 9 : 8;
  if (job_ckpt_dir) { /* a checkpoint every 50 steps there */
    const char *ck[2][3] = {{"output", "checkpoint_dir", job_ckpt_dir},
                            {"output", "checkpoint_every", "50"}};
    memcpy(kv[nopt], ck, sizeof ck);
    nopt += 2;
  }
  for (int i = 0; i < nopt; i++) {
    fsdp__v1__option__init(&o[i]);
    o[i].section = (char *)kv[i][0];
    o[i].key = (char *)kv[i][1];
    o[i].value = (char *)kv[i][2];
    po[i] = &o[i];
  }
  Fsdp__V1__JobSpec spec = FSDP__V1__JOB_SPEC__INIT;
  spec.name = "test";
  spec.world_size = (uint32_t)world;
  spec.n_options = (size_t)nopt;
  spec.options = po;
  Fsdp__V1__RankAssignment a[2], *pa[2];
  for (int r = 0; r < world; r++) {
    fsdp__v1__rank_assignment__init(&a[r]);
    /* the attempt's ring secret, as the coordinator draws one */
    a[r].ring_secret = (ProtobufCBinaryData){job_secret_len, (uint8_t *)JOB_SECRET};
    for (a[r].n_plan_env = 0; job_plan_env[a[r].n_plan_env];) a[r].n_plan_env++;
    a[r].plan_env = job_plan_env;
    a[r].job_id = (char *)job;
    a[r].attempt = 1;
    a[r].rank = (uint32_t)r;
    a[r].world_size = (uint32_t)world;
    a[r].device = (uint32_t)r;
    a[r].spec = &spec;
    pa[r] = &a[r];
  }
  Fsdp__V1__HeartbeatReply rep = FSDP__V1__HEARTBEAT_REPLY__INIT;
  rep.n_assignments = (size_t)world;
  rep.assignments = pa;
  queue_reply(&rep);
}

static void queue_job(const char *job, int world, int steps) {
  queue_job_prompt(job, world, steps, NULL);
}

static void queue_kill(const char *job, uint32_t grace_ms) {
  Fsdp__V1__Kill k = FSDP__V1__KILL__INIT;
  k.job_id = (char *)job;
  k.attempt = 1;
  k.reason = "cancelled by the test";
  k.grace_ms = grace_ms;
  Fsdp__V1__Kill *pk = &k;
  Fsdp__V1__HeartbeatReply rep = FSDP__V1__HEARTBEAT_REPLY__INIT;
  rep.n_kills = 1;
  rep.kills = &pk;
  queue_reply(&rep);
}

static int two_exits(void) { return F.nexits >= 2; }

/* The highest step heartbeats carried for rank r of job (F.mu held). */
static int64_t max_step(const char *job, uint32_t r) {
  int64_t s = -1;
  for (int i = 0; i < F.nrecs; i++)
    if (F.recs[i].rank == r && !strcmp(F.recs[i].job, job) && F.recs[i].step > s) s = F.recs[i].step;
  return s;
}

static int training_j2(void) { return max_step("j-2", 0) >= 3 && max_step("j-2", 1) >= 3; }

static unsigned proc_uid(int pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  FILE *f = fopen(path, "r");
  unsigned uid = ~0u;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "Uid: %u", &uid) == 1) break;
  if (f) fclose(f);
  return uid;
}

/* The value of name in the environment rank pid started with, copied to
 * buf; NULL when it had none. */
static const char *rank_env(int pid, const char *name, char *buf, size_t len) {
  char path[64], env[16384];
  snprintf(path, sizeof path, "/proc/%d/environ", pid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(env, 1, sizeof env - 1, f) : 0;
  if (f) fclose(f);
  env[n] = 0;
  const size_t nl = strlen(name);
  for (size_t at = 0; at < n; at += strlen(env + at) + 1)
    if (!strncmp(env + at, name, nl) && env[at + nl] == '=') {
      snprintf(buf, len, "%s", env + at + nl + 1);
      return buf;
    }
  return NULL;
}

/* Starts the long job j-2 and waits until both ranks have reported 3 steps;
 * its ranks' pids (fsdpd's children) in pids. */
static void start_long_job(int pids[2]) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "fsdpd did not register within 10 s:\n%s", tu_slurp(fsdpd_log, NULL));
  queue_job("j-2", 2, 1000000);
  cr_assert(wait_for(training_j2, 20), "the ranks did not report 3 steps within 20 s:\n%s",
            tu_slurp(fsdpd_log, NULL));
  pids_t p = {.ppid = fsdpd_pid};
  proc_each(note_child, &p);
  cr_assert_eq(p.n, 2, "fsdpd should have two rank children");
  pids[0] = p.pid[0], pids[1] = p.pid[1];
}

/* A client of fsdpd's Node service, at the address it registered. */
static rpc_client_t *node_client(void) {
  char addr[128];
  pthread_mutex_lock(&F.mu);
  snprintf(addr, sizeof addr, "%s", F.reg_address);
  pthread_mutex_unlock(&F.mu);
  rpc_client_t *c;
  const rpc_client_opts_t co = {.target = addr};
  cr_assert_eq(rpc_client_create(&c, &co), 0, "%s", err_msg());
  return c;
}

/* ---- tests --------------------------------------------------------------------------- */

TestSuite(fsdpd, .init = setup, .fini = teardown);

static int j1_complete(void) { return F.njobs >= 1 && F.jobs[0].have == 3; }

Test(fsdpd, registers_runs_a_job_to_the_end_and_serves_its_logs, .timeout = 40 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "fsdpd did not register within 10 s:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.reg_ndev, 2);
  cr_expect_eq(F.reg_ncpu, 2, "two cpu devices, indexed 0 and 1, with memory");
  cr_expect_str_eq(F.reg_node_id, "", "a first registration has no id yet");
  cr_expect(!strncmp(F.reg_address, "127.0.0.1:", 10) && atoi(F.reg_address + 10) > 0,
            "the Node service's bound address: %s", F.reg_address);
  char node_addr[128];
  snprintf(node_addr, sizeof node_addr, "%s", F.reg_address);
  pthread_mutex_unlock(&F.mu);

  queue_job("j-1", 2, 400); /* long enough for a few heartbeats */
  cr_assert(wait_for(two_exits, 30), "both ranks' exits were not reported within 30 s:\n%s",
            tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  for (int i = 0; i < 2; i++) {
    exit_rec_t *e = &F.exits[i];
    cr_expect(!strcmp(e->job, "j-1") && e->attempt == 1 && e->exit_status == 0 && !e->term_signal,
              "rank %u: %s exit %d signal %d (%s)", e->rank, e->job, e->exit_status, e->term_signal,
              e->message);
    cr_expect(strstr(e->message, "train: done"), "the last line of its log: %s", e->message);
  }
  cr_expect_neq(F.exits[0].rank, F.exits[1].rank);
  /* the ring addresses came from the rendezvous: one per rank, ports the ranks' listeners had */
  cr_assert(j1_complete(), "rendezvous of j-1 incomplete");
  cr_expect(strncmp(F.jobs[0].payload[0], "127.0.0.1:", 10) == 0 &&
            strncmp(F.jobs[0].payload[1], "127.0.0.1:", 10) == 0 &&
            strcmp(F.jobs[0].payload[0], F.jobs[0].payload[1]), "payloads %s %s",
            F.jobs[0].payload[0], F.jobs[0].payload[1]);
  /* heartbeats relayed the ranks' reports: steps rising, memory by category */
  int64_t last[2] = {-1, -1};
  int rising = 1, running = 0, mem = 0;
  for (int i = 0; i < F.nrecs; i++) {
    hb_rec_t *r = &F.recs[i];
    if (strcmp(r->job, "j-1") || r->rank > 1) continue;
    rising &= r->step >= last[r->rank];
    last[r->rank] = r->step;
    running += r->running;
    mem += r->nmem >= 6 && r->has_params;
  }
  cr_expect(rising, "a rank's step went back in the heartbeats");
  cr_expect(running > 0 && mem > 0, "no heartbeat carried a running rank with its memory "
            "(%d records, %d running, %d with memory)", F.nrecs, running, mem);
  cr_expect_gt(F.dev_busy_seen, 0, "no heartbeat named a device as held by the job");
  pthread_mutex_unlock(&F.mu);

  /* the log on disk, and the same bytes through GetRankLogs */
  char path[1200];
  snprintf(path, sizeof path, "%s/jobs/j-1/1/rank-0.log", workdir);
  char *log = tu_slurp(path, NULL);
  cr_expect(strstr(log, "step   400/400 | loss"), "rank 0's log lacks its progress lines:\n%s", log);
  snprintf(path, sizeof path, "%s/jobs/j-1/1/rank-1.log", workdir);
  struct stat sb;
  cr_expect_eq(stat(path, &sb), 0, "rank 1 has a log too");

  rpc_client_t *c;
  const rpc_client_opts_t co = {.target = node_addr};
  cr_assert_eq(rpc_client_create(&c, &co), 0, "%s", err_msg());
  Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
  req.job_id = "j-1";
  req.rank = 0; /* attempt 0: the latest */
  rpc_stream_t *st;
  cr_assert_eq(rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 10), 0, "%s", err_msg());
  size_t got = 0, cap = 1 << 20;
  char *text = calloc(1, cap);
  ProtobufCMessage *m;
  int rc;
  while ((rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m)) == 1) {
    Fsdp__V1__LogChunk *ch = (void *)m;
    cr_expect_eq(ch->offset, (int64_t)got);
    cr_expect_eq(ch->attempt, 1, "the attempt whose log it is, asked for as 0: %u", ch->attempt);
    if (got + ch->data.len < cap) memcpy(text + got, ch->data.data, ch->data.len);
    got += ch->data.len;
    protobuf_c_message_free_unpacked(m, NULL);
  }
  cr_expect_eq(rc, 0, "the stream ends OK: %s", err_msg());
  cr_expect_str_eq(text, log, "GetRankLogs returns the log file");
  rpc_stream_close(st);
  /* the last 20 bytes, and a job id that is not one */
  req.offset = -20;
  cr_assert_eq(rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 10), 0);
  cr_assert_eq(rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), 1, "%s", err_msg());
  cr_expect_eq(((Fsdp__V1__LogChunk *)m)->data.len, 20);
  protobuf_c_message_free_unpacked(m, NULL);
  rpc_stream_close(st);
  /* from the end (fsdpctl logs --tail 0): an empty chunk says where that
   * is, so a follower whose stream breaks resumes there, not at the end
   * again, which would skip what was written meanwhile */
  req.offset = INT64_MAX;
  cr_assert_eq(rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 10), 0);
  cr_assert_eq(rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), 1, "%s", err_msg());
  cr_expect_eq(((Fsdp__V1__LogChunk *)m)->data.len, 0);
  cr_expect_eq(((Fsdp__V1__LogChunk *)m)->offset, (int64_t)strlen(log), "where the end is");
  protobuf_c_message_free_unpacked(m, NULL);
  cr_expect_eq(rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), 0, "then the end");
  rpc_stream_close(st);
  req.offset = 0;
  req.job_id = "../j-1";
  cr_assert_eq(rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 10), 0);
  cr_expect_eq(rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), FSDP_EINVAL);
  cr_expect(strstr(err_msg(), "not an id"), "%s", err_msg());
  rpc_stream_close(st);
  rpc_client_destroy(c);
  free(text);
  free(log);
}

/* A hard link another rank's user put where fsdpd writes a rank's job file
 * or log (the attempt directory is theirs) is refused, as a FIFO is (below),
 * never truncated or written through: the file it names keeps its bytes
 * (helper-56: fsdpd, as root, would have written through such a path). */
Test(fsdpd, a_link_planted_for_a_ranks_files_is_not_written_through, .timeout = 40 * TU_SLOW) {
  char dir[1200], victim[1200], conf[1300], log[1300], cmd[1400], out[256];
  snprintf(dir, sizeof dir, "%s/jobs/j-7/1", workdir);
  snprintf(victim, sizeof victim, "%s/victim", workdir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s", out);
  tu_write_file(victim, "precious\n", 9);
  snprintf(conf, sizeof conf, "%s/rank-0.conf", dir);
  snprintf(log, sizeof log, "%s/rank-1.log", dir);
  cr_assert_eq(link(victim, conf), 0, "link %s: %s", conf, strerror(errno));
  cr_assert_eq(link(victim, log), 0, "link %s: %s", log, strerror(errno));
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  queue_job("j-7", 2, 3);
  cr_assert(wait_for(two_exits, 30), "the ranks did not end:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  for (int i = 0; i < 2; i++) {
    const exit_rec_t *e = &F.exits[i];
    cr_expect_eq(e->exit_status, 127, "rank %u started: %s", e->rank, e->message);
    cr_expect(strstr(e->message, e->rank ? "rank-1.log" : "rank-0.conf") &&
                  strstr(e->message, "not a plain file"),
              "rank %u: %s", e->rank, e->message);
  }
  pthread_mutex_unlock(&F.mu);
  char *v = tu_slurp(victim, NULL);
  cr_expect_str_eq(v, "precious\n", "the linked file was written through");
  free(v);
}

/* A rank whose log is already there (a job of that id and attempt ran on
 * this node before: a coordinator restored from an older backup handed the
 * id out again) keeps it: the earlier log is moved aside to rank-R.log.N
 * (the first N free), with a warning, and the new rank runs with a log of
 * its own; the earlier one was truncated before (an outside tester lost a
 * 2.2 MB log that way). */
Test(fsdpd, a_log_already_there_is_moved_aside_not_overwritten, .timeout = 40 * TU_SLOW) {
  char dir[1200], p[1300], cmd[1400], out[256];
  snprintf(dir, sizeof dir, "%s/jobs/j-8/1", workdir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s", out);
  snprintf(p, sizeof p, "%s/rank-0.log", dir);
  tu_write_file(p, "the earlier job's rank 0\n", 25);
  snprintf(p, sizeof p, "%s/rank-1.log", dir);
  tu_write_file(p, "the earlier job's rank 1\n", 25);
  snprintf(p, sizeof p, "%s/rank-1.log.1", dir);
  tu_write_file(p, "an even earlier one\n", 20);
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  queue_job("j-8", 2, 3);
  cr_assert(wait_for(two_exits, 30), "the ranks did not end:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  for (int i = 0; i < 2; i++)
    cr_expect_eq(F.exits[i].exit_status, 0, "rank %u: %s", F.exits[i].rank, F.exits[i].message);
  pthread_mutex_unlock(&F.mu);
  static const struct { const char *name, *text; } kept[] = {
      {"rank-0.log.1", "the earlier job's rank 0\n"},
      {"rank-1.log.2", "the earlier job's rank 1\n"},
      {"rank-1.log.1", "an even earlier one\n"}};
  for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, kept[i].name);
    char *t = tu_slurp(p, NULL);
    cr_expect(t && !strcmp(t, kept[i].text), "%s: %s", kept[i].name, t ? t : "missing");
    free(t);
  }
  for (int r = 0; r < 2; r++) {
    snprintf(p, sizeof p, "%s/rank-%d.log", dir, r);
    char *t = tu_slurp(p, NULL);
    cr_expect(t && !strstr(t, "earlier"), "rank %d's own log: %s", r, t ? t : "missing");
    free(t);
  }
  char *l = tu_slurp(fsdpd_log, NULL);
  cr_expect(l && strstr(l, "kept as") && strstr(l, "rank-0.log.1"), "no warning:\n%s", l);
  free(l);
}

Test(fsdpd, a_kill_stops_both_ranks_within_the_grace_and_leaves_nothing, .timeout = 40 * TU_SLOW) {
  int pids[2];
  start_long_job(pids);
  if (geteuid() == 0)
    for (int i = 0; i < 2; i++) cr_expect_eq(proc_uid(pids[i]), NOBODY, "ranks run as nobody");
  /* nothing fsdpd was started with passes to them: not a descriptor its
   * parent left open, not root's HOME (an outside tester found a 0600
   * token file, open in fsdpd's parent, readable by a rank as nobody) */
  for (int i = 0; i < 2; i++) {
    char fdp[64], hb[PATH_MAX], ub[64];
    snprintf(fdp, sizeof fdp, "/proc/%d/fd/%d", pids[i], FSDPD_LEAK_FD);
    cr_expect_neq(access(fdp, F_OK), 0, "rank pid %d holds fsdpd's inherited descriptor", pids[i]);
    if (geteuid() != 0) continue;
    const struct passwd *pw = getpwnam("nobody");
    const char *h = rank_env(pids[i], "HOME", hb, sizeof hb), *u = rank_env(pids[i], "USER", ub, sizeof ub);
    cr_expect(pw && h && !strcmp(h, pw->pw_dir), "rank pid %d: HOME %s", pids[i], h ? h : "unset");
    cr_expect(u && !strcmp(u, "nobody"), "rank pid %d: USER %s", pids[i], u ? u : "unset");
  }
  /* each rank's memory limit is its device's, as fsdpd registered it */
  for (int i = 0; i < 2; i++) {
    char vb[64], sb[128];
    const char *v = rank_env(pids[i], "FSDP_DEVICE_MEMORY_BYTES", vb, sizeof vb);
    const char *sec = rank_env(pids[i], "FSDP_RING_SECRET", sb, sizeof sb);
    cr_expect(v && strtoull(v, NULL, 10) > 0, "rank pid %d: FSDP_DEVICE_MEMORY_BYTES %s", pids[i],
              v ? v : "unset");
    /* and its share of the host's (what a GPU's rank may keep there): half
     * the host's memory, the node having 2 devices */
    char hb[64];
    const char *h = rank_env(pids[i], "FSDP_HOST_MEMORY_BYTES", hb, sizeof hb);
    const uint64_t half = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE) / 2;
    cr_expect(h && strtoull(h, NULL, 10) == half, "rank pid %d: FSDP_HOST_MEMORY_BYTES %s, not %llu",
              pids[i], h ? h : "unset", (unsigned long long)half);
    /* and the attempt's ring secret, which the two ranks proved to each other */
    cr_expect(sec && !strcmp(sec, JOB_SECRET_HEX), "rank pid %d: FSDP_RING_SECRET %s", pids[i],
              sec ? sec : "unset");
  }
  /* a follower of rank 0's log, from its last 100 bytes: it gets them now,
   * and its stream ends by itself once the rank is gone */
  rpc_client_t *c = node_client();
  Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
  req.job_id = "j-2";
  req.attempt = 1;
  req.follow = 1;
  req.offset = -100;
  rpc_stream_t *st;
  ProtobufCMessage *m;
  cr_assert_eq(rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 15), 0, "%s", err_msg());
  cr_assert_eq(rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), 1, "%s", err_msg());
  protobuf_c_message_free_unpacked(m, NULL);

  const double t0 = tu_now_s();
  queue_kill("j-2", 1000);
  cr_assert(wait_for(two_exits, 1.0 + 1.0 + 1.0), "the exits were not reported within grace + 2 s:\n%s",
            tu_slurp(fsdpd_log, NULL));
  int rc, chunks = 0;
  while ((rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m)) == 1) {
    chunks++;
    protobuf_c_message_free_unpacked(m, NULL);
  }
  cr_expect_eq(rc, 0, "the follow stream ends OK once the rank has exited: %s", err_msg());
  cr_expect_lt(tu_now_s() - t0, 5.0, "and soon after");
  cr_expect_gt(chunks, 0, "lines written while following arrived");
  rpc_stream_close(st);
  rpc_client_destroy(c);
  pthread_mutex_lock(&F.mu);
  for (int i = 0; i < 2; i++) {
    exit_rec_t *e = &F.exits[i];
    /* SIGTERM: the rank stops at its step boundary (exit 75), or, stuck, SIGKILL */
    cr_expect((!e->term_signal && e->exit_status == JOB_EXIT_PREEMPTED) || e->term_signal == SIGKILL,
              "rank %u: signal %d, status %d", e->rank, e->term_signal, e->exit_status);
    cr_expect(!e->node_stopping, "a kill order is not the node stopping");
    cr_expect_lt(e->at - t0, 1.0 + 1.0, "rank %u reported %.2f s after the kill", e->rank, e->at - t0);
  }
  pthread_mutex_unlock(&F.mu);
  for (int i = 0; i < 2; i++) cr_expect(!group_alive(pids[i]), "rank pid %d's group outlived it", pids[i]);
}

static int reregistered(void) { return F.regs >= 2; }

Test(fsdpd, survives_the_coordinator_going_away_and_reregisters_with_its_ranks, .timeout = 40 * TU_SLOW) {
  int pids[2];
  start_long_job(pids);
  fake_stop();
  usleep(1500 * 1000); /* a coordinator restart */
  for (int i = 0; i < 2; i++) cr_assert_eq(kill(pids[i], 0), 0, "rank %d died with the coordinator", i);
  char *log = tu_slurp(fsdpd_log, NULL);
  cr_expect(strstr(log, "retrying every 1000 ms at most, ranks keep running"), "%s", log);
  free(log);
  pthread_mutex_lock(&F.mu);
  int64_t before = max_step("j-2", 0);
  pthread_mutex_unlock(&F.mu);
  fake_start(); /* the same port; sessions of the old one are unknown */
  cr_assert(wait_for(reregistered, 10), "fsdpd did not register again within 10 s:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  cr_expect_geq(F.reregisters_sent, 1, "told to re-register");
  cr_expect_str_eq(F.reg_node_id, "n-1", "it comes back with the id it had");
  cr_expect_eq(F.reg_nranks, 2, "and with the ranks it still runs");
  pthread_mutex_unlock(&F.mu);
  double until = tu_now_s() + 10;
  int64_t after = before;
  while (after <= before + 5 && tu_now_s() < until) {
    usleep(20000);
    pthread_mutex_lock(&F.mu);
    after = max_step("j-2", 0);
    pthread_mutex_unlock(&F.mu);
  }
  cr_expect_gt(after, before + 5, "the ranks kept training and reporting (%lld -> %lld)",
               (long long)before, (long long)after);
  queue_kill("j-2", 1000);
  cr_expect(wait_for(two_exits, 5), "killed ranks reported");
}

/* A coordinator silent past the fence it gave (2 s here; its restart grace
 * in life): the coordinator has declared the node dead and runs the jobs
 * elsewhere, so fsdpd stops its ranks at once, without a checkpoint; within
 * the fence they run on (a coordinator restart stops nothing), and back,
 * fsdpd registers again without them (helper-57: a node SIGSTOPped past the
 * timeout kept ranks writing beside the job's next attempt). */
Test(fsdpd, stops_its_ranks_when_the_coordinator_is_silent_past_its_fence, .timeout = 40 * TU_SLOW) {
  fence_ms_given = 2000;
  int pids[2];
  start_long_job(pids);
  fake_stop();
  const double t0 = tu_now_s();
  usleep(1200 * 1000);
  for (int i = 0; i < 2; i++) cr_assert_eq(kill(pids[i], 0), 0, "rank %d stopped within the fence", i);
  int alive = 2;
  while (alive && tu_now_s() - t0 < 8) {
    usleep(20000);
    alive = 0;
    for (int i = 0; i < 2; i++) alive += kill(pids[i], 0) == 0 && group_alive(pids[i]);
  }
  const double took = tu_now_s() - t0;
  cr_assert_eq(alive, 0, "ranks still running %.1f s into the silence:\n%s", took,
               tu_slurp(fsdpd_log, NULL));
  /* the coordinator restarts the jobs a margin (1 s) after the fence */
  cr_expect_lt(took, 2.0 + 1.0, "stopped %.2f s into a 2 s fence", took);
  fprintf(stderr, "fence: the ranks were dead %.2f s into the silence (fence 2 s)\n", took);
  char *log = tu_slurp(fsdpd_log, NULL);
  cr_expect(strstr(log, "no answer from the coordinator") && strstr(log, "ranks are stopped"), "%s",
            log);
  free(log);
  fake_start();
  cr_assert(wait_for(reregistered, 10), "fsdpd did not register again:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  /* none running: those it stopped come back as exited (their exits not yet
   * reported), or not at all */
  cr_expect_eq(F.reg_exited, F.reg_nranks, "it comes back with %d of %d ranks still running",
               F.reg_nranks - F.reg_exited, F.reg_nranks);
  pthread_mutex_unlock(&F.mu);
  /* their exits say they were fenced, and why (not the rank's last log
   * line): the coordinator requeues the job without spending a restart */
  cr_expect(wait_for(two_exits, 10), "the fenced ranks' exits were not reported");
  pthread_mutex_lock(&F.mu);
  for (int i = 0; i < F.nexits; i++) {
    cr_expect(F.exits[i].fenced, "rank %u's exit is not reported fenced: status %d signal %d: %s",
              F.exits[i].rank, F.exits[i].exit_status, F.exits[i].term_signal, F.exits[i].message);
    cr_expect(strstr(F.exits[i].message, "no answer from the coordinator"), "rank %u: %s",
              F.exits[i].rank, F.exits[i].message);
  }
  pthread_mutex_unlock(&F.mu);
  fence_ms_given = 0;
}

/* A coordinator away for longer than gRPC's first reconnect backoffs is
 * still tried at fsdpd's own backoff (at most 1 s), so it is found within
 * about a second of its return however long it was away. Before, the
 * session retried on the channel whose connects had failed, which gRPC
 * holds in its reconnect backoff (1 s, growing 1.6 times a try to 2 min),
 * failing every call without trying: a coordinator back after 10 s was
 * found 6.5 s later, past the 15 s fence counted from fsdpd's last answered
 * heartbeat, and fsdpd stopped every rank though the coordinator was down
 * for less than its restart grace (with a 5 s grace, a restart of 1.65 s
 * under load did it). In 9 s of failed connects gRPC's backoff leaves a
 * wait of at least 2.76 s between two tries (1 s, 1.6 s, 2.56 s, 4.1 s,
 * each within 20%). */
Test(fsdpd, a_coordinator_away_is_tried_every_second_and_found_as_soon_as_it_is_back,
     .timeout = 40 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "fsdpd did not register within 10 s:\n%s", tu_slurp(fsdpd_log, NULL));
  fake_stop();
  int tries;
  const double longest = tu_connect_gaps(F.port, 9.0, &tries);
  fprintf(stderr, "coordinator away 9 s: %d tries to connect, at most %.2f s apart\n", tries, longest);
  cr_expect_lt(longest, 2.5, "fsdpd tried to connect %d times in 9 s, once after a wait of %.2f s "
               "(its backoff is at most 1 s)", tries, longest);
  fake_start(); /* the same port */
  const double back = tu_now_s();
  cr_assert(wait_for(reregistered, 10), "fsdpd did not register again within 10 s:\n%s",
            tu_slurp(fsdpd_log, NULL));
  const double took = tu_now_s() - back;
  fprintf(stderr, "registered again %.2f s after the coordinator was back\n", took);
  cr_expect_lt(took, 2.0, "registered again %.2f s after the coordinator was back:\n%s", took,
               tu_slurp(fsdpd_log, NULL));
}

/* Waits (at most secs) for text in fsdpd's log after byte from; the
 * line it is in (free it), or NULL. */
static char *log_line_after(size_t from, const char *text, double secs) {
  for (const double until = tu_now_s() + secs;; usleep(20000)) {
    size_t n = 0;
    char *log = tu_slurp(fsdpd_log, &n), *at = n > from ? strstr(log + from, text) : NULL;
    if (at) {
      char *start = at;
      while (start > log && start[-1] != '\n') start--;
      char *line = strndup(start, strcspn(start, "\n"));
      free(log);
      return line;
    }
    free(log);
    if (tu_now_s() > until) return NULL;
  }
}

/* The line fsdpd logs when the coordinator stops answering says of the
 * ranks only what is true: none run before the first registration, and a
 * registered node with none has none to keep running. */
Test(fsdpd, the_retry_line_says_what_becomes_of_the_ranks, .timeout = 30 * TU_SLOW) {
  fake_stop(); /* nothing answers on its port: fsdpd starts unregistered */
  fsdpd_start();
  char *line = log_line_after(0, "retrying every", 10);
  cr_assert_not_null(line, "no retry line:\n%s", tu_slurp(fsdpd_log, NULL));
  cr_expect(strstr(line, "RegisterNode") && strstr(line, "no rank runs before") &&
                !strstr(line, "ranks keep running"), "%s", line);
  free(line);
  fake_start(); /* the same port */
  cr_assert(wait_for(registered, 10), "fsdpd did not register within 10 s:\n%s",
            tu_slurp(fsdpd_log, NULL));
  size_t mark = 0;
  free(tu_slurp(fsdpd_log, &mark));
  fake_stop();
  line = log_line_after(mark, "retrying every", 10);
  cr_assert_not_null(line, "no retry line once registered:\n%s", tu_slurp(fsdpd_log, NULL));
  cr_expect(strstr(line, "Heartbeat") && !strstr(line, "ranks keep running") &&
                !strstr(line, "no rank runs before"), "%s", line);
  free(line);
}

/* fsdpd tightens its umask to at least 0027 before it makes anything, its
 * work directory and lock file included, whatever umask it was started with
 * (a shell's 0022; docs/OPERATIONS.md). */
Test(fsdpd, its_work_dir_and_lock_are_not_for_every_user, .timeout = 20 * TU_SLOW) {
  const mode_t old = umask(022);
  fsdpd_start();
  umask(old);
  cr_assert(wait_for(registered, 10), "fsdpd did not register within 10 s:\n%s",
            tu_slurp(fsdpd_log, NULL));
  char lock[1100];
  snprintf(lock, sizeof lock, "%s/fsdpd.lock", workdir);
  struct stat d, l;
  cr_assert_eq(stat(workdir, &d), 0);
  cr_assert_eq(stat(lock, &l), 0);
  cr_expect_eq(d.st_mode & 07777, 0750, "work dir mode %04o", (unsigned)(d.st_mode & 07777));
  cr_expect_eq(l.st_mode & 07777, 0640, "lock mode %04o", (unsigned)(l.st_mode & 07777));
}

/* 1 for a process pid that is not a zombie. */
static int runs_pid(int pid, char st, int ppid, int pgrp, void *arg) {
  (void)ppid, (void)pgrp;
  return pid == *(int *)arg && st != 'Z';
}

/* An fsdpd frozen (SIGSTOP: a debugger, a hung daemon) cannot fence its
 * ranks, so each rank holds the node's lease itself (RankLease, renewed as
 * the coordinator answers): past it, it ends at once, writing nothing,
 * within the coordinator's 1 s margin of the 2 s fence, while fsdpd is
 * still stopped; woken, fsdpd relays their last words. */
Test(fsdpd, a_frozen_fsdpds_ranks_end_themselves_at_its_lease, .timeout = 40 * TU_SLOW) {
  fence_ms_given = 2000;
  int pids[2];
  start_long_job(pids);
  cr_assert_eq(kill(fsdpd_pid, SIGSTOP), 0);
  const double t0 = tu_now_s();
  int alive = 2;
  while (alive && tu_now_s() - t0 < 8) {
    usleep(20000);
    alive = proc_each(runs_pid, &pids[0]) + proc_each(runs_pid, &pids[1]);
  }
  const double took = tu_now_s() - t0;
  kill(fsdpd_pid, SIGCONT);
  cr_assert_eq(alive, 0, "ranks of a frozen fsdpd still running %.1f s into its freeze", took);
  cr_expect_lt(took, 2.0 + 1.0, "ended %.2f s into the freeze (fence 2 s)", took);
  fprintf(stderr, "lease: the ranks of a frozen fsdpd ended %.2f s into it (fence 2 s)\n", took);
  /* their output comes through fsdpd, woken now */
  for (int r = 0; r < 2; r++) {
    char lp[1200], *log = NULL;
    snprintf(lp, sizeof lp, "%s/jobs/j-2/1/rank-%d.log", workdir, r);
    for (const double t1 = tu_now_s(); tu_now_s() - t1 < 5; usleep(50000)) {
      free(log);
      log = tu_slurp(lp, NULL);
      if (log && strstr(log, "the node's lease ended")) break;
    }
    cr_expect(log && strstr(log, "the node's lease ended"), "rank %d's log:\n%s", r, log);
    free(log);
  }
  fence_ms_given = 0;
}

/* Waits up to secs for fsdpd to register beyond its regs-th registration;
 * how many the fake has taken then. */
static int regs_after(int regs, double secs) {
  const double until = tu_now_s() + secs;
  int now = regs;
  while (now == regs && tu_now_s() < until) {
    usleep(20000);
    pthread_mutex_lock(&F.mu);
    now = F.regs;
    pthread_mutex_unlock(&F.mu);
  }
  return now;
}

static int refused_twice(void) { return F.reg_refusals >= 2; }

/* From now on RegisterNode is refused (F.refuse_regs: how), and fsdpd's next
 * heartbeat is told to register again; the registrations so far. */
static int refuse_registrations(int how) {
  pthread_mutex_lock(&F.mu);
  F.refuse_regs = how;
  const int regs = F.regs;
  F.session = 0;
  pthread_mutex_unlock(&F.mu);
  return regs;
}

/* Lines of fsdpd's log that hold what. */
static int log_count(const char *what) {
  char *log = tu_slurp(fsdpd_log, NULL);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, what)); p += strlen(what)) n++;
  free(log);
  return n;
}

static int reg_refused(void) { return F.reg_refusals >= 1; }

/* A refusal that passes within --refused-timeout (the coordinator's token
 * files read again, say) does not end fsdpd: it asks each second and
 * registers once taken. */
Test(fsdpd, a_first_registration_refused_for_less_than_the_timeout_goes_on, .timeout = 30 * TU_SLOW) {
  pthread_mutex_lock(&F.mu);
  F.refuse_regs = 1;
  pthread_mutex_unlock(&F.mu);
  const char *args[] = {"--devices", "cpu:1", "--work-dir", workdir, "--refused-timeout", "10",
                        geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  fsdpd_pid = fsdpd_spawn(args);
  cr_assert(wait_for(reg_refused, 10), "fsdpd did not register");
  usleep(2500 * 1000); /* refused each second meanwhile */
  pthread_mutex_lock(&F.mu);
  const int refusals = F.reg_refusals;
  F.refuse_regs = 0;
  pthread_mutex_unlock(&F.mu);
  cr_expect_geq(refusals, 2, "asked %d times in 2.5 s: not each second", refusals);
  cr_assert(wait_for(registered, 5), "fsdpd did not register once taken:\n%s", tu_slurp(fsdpd_log, NULL));
  cr_expect_eq(waitpid(fsdpd_pid, NULL, WNOHANG), 0, "fsdpd exited");
  cr_expect_eq(log_count("start fsdpd again"), 0, "fsdpd gave up:\n%s", tu_slurp(fsdpd_log, NULL));
  cr_expect_geq(log_count("stopping if it still refuses after 10 s"), 1, "the refusal was not "
                "logged as an error saying what comes:\n%s", tu_slurp(fsdpd_log, NULL));
}

/* Refused once it has run (a coordinator restarted with other tokens, say),
 * fsdpd neither exits nor stops its ranks: it asks again every 5 s, logs
 * the refusal as an error once (not once per try), and registers with its
 * ranks when the coordinator takes it. (Refused at its first registration
 * it exits 78: test_cluster.) */
Test(fsdpd, a_refusal_once_registered_keeps_the_ranks_and_is_asked_again, .timeout = 40 * TU_SLOW) {
  int pids[2];
  start_long_job(pids);
  const int regs = refuse_registrations(1);
  cr_assert(wait_for(refused_twice, 15), "fsdpd did not ask again after a refusal:\n%s",
            tu_slurp(fsdpd_log, NULL));
  cr_expect_eq(waitpid(fsdpd_pid, NULL, WNOHANG), 0, "fsdpd exited on a refusal with ranks running");
  for (int i = 0; i < 2; i++) cr_expect_eq(kill(pids[i], 0), 0, "rank %d died with the refusal", i);
  cr_expect_eq(log_count("the coordinator refused RegisterNode"), 1,
               "the refusal is logged once a minute, not once a try:\n%s", tu_slurp(fsdpd_log, NULL));
  cr_expect_eq(log_count("start fsdpd again"), 0, "a registered fsdpd is not told to restart");
  pthread_mutex_lock(&F.mu);
  F.refuse_regs = 0;
  pthread_mutex_unlock(&F.mu);
  const int now = regs_after(regs, 10);
  cr_assert_gt(now, regs, "fsdpd did not register once taken");
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.reg_nranks, 2, "with the ranks it kept running");
  pthread_mutex_unlock(&F.mu);
  queue_kill("j-2", 1000);
  cr_expect(wait_for(two_exits, 5), "killed ranks reported");
}

/* A refusal is no answer either: the coordinator counts a refused node as
 * silent and runs its jobs elsewhere, so past the fence it gave the ranks
 * stop, as for a silence (helper-58: a rotated node token left them running
 * for good). */
Test(fsdpd, a_refusal_past_the_fence_stops_the_ranks, .timeout = 40 * TU_SLOW) {
  fence_ms_given = 2000;
  int pids[2];
  start_long_job(pids);
  const double t0 = tu_now_s();
  refuse_registrations(1);
  int alive = 2;
  while (alive && tu_now_s() - t0 < 10) {
    usleep(20000);
    alive = (kill(pids[0], 0) == 0) + (kill(pids[1], 0) == 0);
  }
  const double took = tu_now_s() - t0;
  cr_expect_eq(alive, 0, "ranks still running %.1f s into the refusals:\n%s", took,
               tu_slurp(fsdpd_log, NULL));
  /* "register again" is no answer either, and the refusals' 5 s waits are
   * cut at the fence: dead within the coordinator's 1 s margin of it */
  cr_expect_lt(took, 2.0 + 1.0, "stopped %.2f s into the refusals (fence 2 s)", took);
  cr_expect_eq(log_count("ERROR fsdpd: no answer from the coordinator"), 1, "%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  F.refuse_regs = 0;
  pthread_mutex_unlock(&F.mu);
  fence_ms_given = 0;
}

/* Refused ALREADY_EXISTS once registered: another fsdpd registered under
 * this node's name while this one's heartbeat was between calls, and the
 * coordinator took this one's ranks for gone (their jobs fail over). The
 * ranks are stopped (left, they would hold their devices for attempts no
 * one commits), with one error naming the fix; fsdpd itself stays, reports
 * the exits, and registers again, without ranks, once the name is free. */
static int pids_gone(const int *pids) { return kill(pids[0], 0) && kill(pids[1], 0); }
static const int *gone_pids;
static int ranks_gone(void) { return pids_gone(gone_pids); }

Test(fsdpd, a_name_another_fsdpd_took_stops_the_ranks, .timeout = 40 * TU_SLOW) {
  int pids[2];
  start_long_job(pids);
  const int regs = refuse_registrations(2);
  gone_pids = pids;
  cr_assert(wait_for(ranks_gone, 20), "the ranks still run after ALREADY_EXISTS:\n%s",
            tu_slurp(fsdpd_log, NULL));
  cr_expect_eq(waitpid(fsdpd_pid, NULL, WNOHANG), 0, "fsdpd exited on ALREADY_EXISTS");
  cr_expect_eq(log_count("another fsdpd registered as node"), 1,
               "one error says why the ranks stopped:\n%s", tu_slurp(fsdpd_log, NULL));
  cr_expect_eq(log_count("give each node's fsdpd its own --name"), 1, "and names the fix");
  cr_expect(wait_for(two_exits, 10), "the stopped ranks' exits were not reported");
  cr_assert(wait_for(refused_twice, 15), "fsdpd did not ask again");
  cr_expect_eq(log_count("another fsdpd registered as node"), 1, "the ranks are stopped once");
  pthread_mutex_lock(&F.mu);
  F.refuse_regs = 0;
  pthread_mutex_unlock(&F.mu);
  cr_assert_gt(regs_after(regs, 10), regs, "fsdpd did not register once the name was free");
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.reg_nranks, 0, "it registered with ranks it had stopped");
  pthread_mutex_unlock(&F.mu);
}

static int one_exit(void) { return F.nexits >= 1; }
/* both ranks' exits refused, and tried again (not one rank's alone: the
 * other may not have been seen to exit yet on a loaded machine) */
static int exits_refused(void) { return F.exit_refusals >= 4 && F.exit_refused_ranks == 3u; }

/* A rank that exited while its report cannot get through is still the
 * node's to report: a registration then lists it EXITED, so a coordinator
 * does not take it for a rank gone missing and fail its attempt (which it
 * did: a job whose ranks all succeeded ended FAILED, "rank 0 is gone from
 * node"; found by review). */
Test(fsdpd, a_rank_whose_exit_is_not_reported_yet_is_listed_when_fsdpd_registers_again,
     .timeout = 40 * TU_SLOW) {
  int pids[2];
  start_long_job(pids);
  pthread_mutex_lock(&F.mu);
  F.refuse_exits = 1;
  pthread_mutex_unlock(&F.mu);
  for (int i = 0; i < 2; i++) kill(pids[i], SIGKILL);
  cr_assert(wait_for(exits_refused, 10), "fsdpd did not try to report the exits");
  pthread_mutex_lock(&F.mu);
  const int regs = F.regs;
  F.session = 0; /* its next heartbeat is told to register again */
  pthread_mutex_unlock(&F.mu);
  const int now = regs_after(regs, 10);
  cr_assert_gt(now, regs, "fsdpd did not register again");
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.reg_nranks, 2, "the registration lists the ranks whose exits are not reported yet");
  cr_expect_eq(F.reg_exited, 2, "as EXITED");
  F.refuse_exits = 0;
  pthread_mutex_unlock(&F.mu);
  cr_expect(wait_for(two_exits, 10), "the exits were reported once taken");
  /* and its log does not count them running (it said "2 rank(s) running") */
  char *log = tu_slurp(fsdpd_log, NULL);
  cr_expect(strstr(log, "0 rank(s) running, 2 ended with their exit still to report"), "%s", log);
  free(log);
}

Test(fsdpd, a_job_id_with_a_path_in_it_is_refused_before_any_file, .timeout = 20 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  queue_job("../../escape", 1, 5);
  cr_assert(wait_for(one_exit, 5), "the refusal was not reported:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.exits[0].exit_status, 127);
  cr_expect(strstr(F.exits[0].message, "not an id"), "%s", F.exits[0].message);
  cr_expect_eq(F.njobs, 0, "no rendezvous for a refused rank");
  pthread_mutex_unlock(&F.mu);
  char p[1200];
  struct stat sb;
  snprintf(p, sizeof p, "%s/escape", tu_tmpdir());
  cr_expect_neq(stat(p, &sb), 0, "%s was created", p);
  snprintf(p, sizeof p, "%s/escape", workdir);
  cr_expect_neq(stat(p, &sb), 0, "%s was created", p);
  snprintf(p, sizeof p, "%s/jobs", workdir);
  DIR *d = opendir(p);
  int entries = 0;
  for (struct dirent *e; d && (e = readdir(d));) entries += e->d_name[0] != '.';
  if (d) closedir(d);
  cr_expect_eq(entries, 0, "nothing under %s", p);
}

/* An option whose `key = value` line libinih would cut in two (the rest
 * read as an option of its own, here a save path) is refused before the
 * rank's job file is written: the coordinator refuses such a spec at
 * submit, and fsdpd does not take its word for it. */
/* A ring secret that is not 32 bytes (a coordinator's bug, or a forged
 * reply) is refused with the assignment, before any process starts. */
Test(fsdpd, a_ring_secret_of_another_length_is_refused, .timeout = 20 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  job_secret_len = 5;
  queue_job("j-5", 1, 5);
  cr_assert(wait_for(one_exit, 5), "the refusal was not reported:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.exits[0].exit_status, 127);
  cr_expect(strstr(F.exits[0].message, "ring_secret of 5 bytes"), "%s", F.exits[0].message);
  cr_expect_eq(F.njobs, 0, "no rendezvous for a refused rank");
  pthread_mutex_unlock(&F.mu);
}

/* The memory plan's tunables come with the assignment, as the coordinator
 * admitted the job with them, over fsdpd's own, and one the assignment
 * does not name is its default (param.h: a coordinator sends a newer one
 * only where it is not), never fsdpd's own; one that is not a plan tunable
 * (or not an integer, or named twice) refuses the assignment. */
Test(fsdpd, a_rank_runs_with_the_plans_tunables_from_its_assignment, .timeout = 40 * TU_SLOW) {
  setenv("FSDP_COMM_STAGING_BYTES", "999999", 1); /* fsdpd's own: not the plan's */
  setenv("FSDP_CUDA_ATTN_CUDNN", "1", 1);         /* fsdpd's own, not named: the default */
  setenv("FSDP_CUDA_ATTN_FP32", "1", 1);
  job_plan_env[0] = "FSDP_COMM_STAGING_BYTES=1048576";
  job_plan_env[1] = "FSDP_ATTN_BLOCK=32";
  int pids[2];
  start_long_job(pids);
  unsetenv("FSDP_COMM_STAGING_BYTES");
  unsetenv("FSDP_CUDA_ATTN_CUDNN");
  unsetenv("FSDP_CUDA_ATTN_FP32");
  const char *want[][2] = {{"FSDP_COMM_STAGING_BYTES", "1048576"}, {"FSDP_ATTN_BLOCK", "32"},
                           {"FSDP_CUDA_ATTN_CUDNN", "0"}, {"FSDP_CUDA_ATTN_FP32", "0"},
                           {"FSDP_COMM_SHM", "1"}};
  for (int i = 0; i < 2; i++)
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
      char b[64];
      const char *v = rank_env(pids[i], want[k][0], b, sizeof b);
      cr_expect(v && !strcmp(v, want[k][1]), "rank pid %d: %s %s, not %s", pids[i], want[k][0],
                v ? v : "unset", want[k][1]);
    }
}

Test(fsdpd, a_plan_tunable_named_twice_is_refused, .timeout = 20 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  job_plan_env[0] = "FSDP_ATTN_BLOCK=32";
  job_plan_env[1] = "FSDP_ATTN_BLOCK=64";
  queue_job("j-8", 1, 5);
  cr_assert(wait_for(one_exit, 5), "the refusal was not reported:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.exits[0].exit_status, 127);
  cr_expect(strstr(F.exits[0].message, "named before"), "%s", F.exits[0].message);
  pthread_mutex_unlock(&F.mu);
}

Test(fsdpd, a_plan_env_that_is_not_a_plan_tunable_is_refused, .timeout = 20 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  job_plan_env[0] = "LD_PRELOAD=/tmp/evil.so";
  queue_job("j-6", 1, 5);
  cr_assert(wait_for(one_exit, 5), "the refusal was not reported:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.exits[0].exit_status, 127);
  cr_expect(strstr(F.exits[0].message, "plan_env") && strstr(F.exits[0].message, "LD_PRELOAD"),
            "%s", F.exits[0].message);
  cr_expect_eq(F.njobs, 0, "no rendezvous for a refused rank");
  pthread_mutex_unlock(&F.mu);
}

/* A rank whose assignment carries no ring secret (a coordinator of before)
 * runs without one: never with one fsdpd itself was started with. */
Test(fsdpd, a_rank_never_inherits_fsdpds_own_ring_secret, .timeout = 40 * TU_SLOW) {
  setenv("FSDP_RING_SECRET", JOB_SECRET_HEX, 1); /* fsdpd's environment */
  job_secret_len = 0;
  int pids[2];
  start_long_job(pids);
  unsetenv("FSDP_RING_SECRET");
  for (int i = 0; i < 2; i++) {
    char sb[128];
    const char *sec = rank_env(pids[i], "FSDP_RING_SECRET", sb, sizeof sb);
    cr_expect_null(sec, "rank pid %d started with FSDP_RING_SECRET=%s", pids[i], sec);
  }
}

Test(fsdpd, an_option_libinih_would_cut_in_two_is_refused, .timeout = 20 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  char prompt[300];
  snprintf(prompt, sizeof prompt, "%0183d%s", 0, "save = /tmp/outside.bin");
  queue_job_prompt("j-long", 1, 5, prompt);
  cr_assert(wait_for(one_exit, 5), "the refusal was not reported:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.exits[0].exit_status, 127);
  cr_expect(strstr(F.exits[0].message, "sample_prompt") && strstr(F.exits[0].message, "at most 199"),
            "%s", F.exits[0].message);
  pthread_mutex_unlock(&F.mu);
}

Test(fsdpd, sigterm_stops_the_ranks_reports_them_and_exits_0, .timeout = 40 * TU_SLOW) {
  int pids[2];
  start_long_job(pids);
  const double t0 = tu_now_s();
  cr_assert_eq(kill(fsdpd_pid, SIGTERM), 0);
  int status = 0, done = 0;
  while (!done && tu_now_s() - t0 < GRACE_S + 5) {
    done = waitpid(fsdpd_pid, &status, WNOHANG) == fsdpd_pid;
    if (!done) usleep(10000);
  }
  cr_assert(done, "fsdpd still runs %d s after SIGTERM:\n%s", GRACE_S + 5, tu_slurp(fsdpd_log, NULL));
  fsdpd_pid = 0;
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x\n%s", status, tu_slurp(fsdpd_log, NULL));
  cr_expect_lt(tu_now_s() - t0, GRACE_S + 3.0);
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.nexits, 2, "both exits reported before fsdpd exited");
  for (int i = 0; i < F.nexits; i++) {
    /* each rank stopped at its step boundary and said so (exit 75), and the
     * report says the node is stopping: its job is requeued, not failed */
    if (F.exits[i].term_signal || F.exits[i].exit_status != JOB_EXIT_PREEMPTED) {
      /* the rank's own log says why (a rare SIGABRT here once, not reproduced) */
      char lp[1200];
      snprintf(lp, sizeof lp, "%s/jobs/j-2/1/rank-%u.log", workdir, F.exits[i].rank);
      char *log = tu_slurp(lp, NULL);
      cr_expect(0, "rank %u: signal %d, status %d; its log:\n%s", F.exits[i].rank,
                F.exits[i].term_signal, F.exits[i].exit_status, log);
      free(log);
    }
    cr_expect(F.exits[i].node_stopping, "rank %u's exit does not say the node is stopping",
              F.exits[i].rank);
  }
  /* and last it said it leaves, so the node is stopped, not dead at its
   * heartbeat timeout */
  cr_expect(F.leaves == 1 && F.leave_nexits == 2 && F.leave_running == 0,
            "%d leaving heartbeat(s), the first after %d exit report(s) with %d rank(s) running",
            F.leaves, F.leave_nexits, F.leave_running);
  pthread_mutex_unlock(&F.mu);
  cr_expect_gt(log_count("told the coordinator that node"), 0, "%s", tu_slurp(fsdpd_log, NULL));
  for (int i = 0; i < 2; i++) cr_expect(!group_alive(pids[i]), "rank pid %d's group outlived fsdpd", pids[i]);
}

/* A coordinator of an older build answers the leaving heartbeat as any
 * heartbeat (it knows no leave, and will count the node dead at its
 * timeout): fsdpd does not say it told it, but that it could not. */
Test(fsdpd, a_coordinator_that_takes_no_leave_is_not_said_to_have_taken_it, .timeout = 40 * TU_SLOW) {
  F.takes_no_leave = 1;
  int pids[2];
  start_long_job(pids);
  cr_assert_eq(kill(fsdpd_pid, SIGTERM), 0);
  int status = 0, done = 0;
  for (const double t0 = tu_now_s(); !done && tu_now_s() - t0 < GRACE_S + 5;) {
    done = waitpid(fsdpd_pid, &status, WNOHANG) == fsdpd_pid;
    if (!done) usleep(10000);
  }
  cr_assert(done, "fsdpd still runs after SIGTERM:\n%s", tu_slurp(fsdpd_log, NULL));
  fsdpd_pid = 0;
  pthread_mutex_lock(&F.mu);
  const int leaves = F.leaves;
  pthread_mutex_unlock(&F.mu);
  cr_expect_eq(leaves, 1);
  cr_expect(log_count("takes no leave") == 1 && log_count("told the coordinator") == 0, "%s",
            tu_slurp(fsdpd_log, NULL));
}

/* A stopping fsdpd tries its ranks' last checkpoint shard reports until
 * its report deadline (the grace + 3 s), not for good: a coordinator that
 * never answers them (this fake does not serve ReportCheckpointShard) does
 * not keep fsdpd from exiting, and what was given up is said. */
Test(fsdpd, a_stop_gives_up_unanswered_shard_reports_at_its_deadline, .timeout = 40 * TU_SLOW) {
  char *ck = tu_path("ckpt");
  cr_assert_eq(mkdir(ck, 0777), 0);
  chmod(ck, 0777); /* the ranks run as nobody */
  job_ckpt_dir = ck;
  int pids[2];
  start_long_job(pids);
  job_ckpt_dir = NULL;
  const double t0 = tu_now_s();
  cr_assert_eq(kill(fsdpd_pid, SIGTERM), 0);
  int status = 0, done = 0;
  while (!done && tu_now_s() - t0 < GRACE_S + 10) {
    done = waitpid(fsdpd_pid, &status, WNOHANG) == fsdpd_pid;
    if (!done) usleep(10000);
  }
  const double took = tu_now_s() - t0;
  cr_assert(done, "fsdpd still runs %.0f s after SIGTERM:\n%s", took, tu_slurp(fsdpd_log, NULL));
  fsdpd_pid = 0;
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
  cr_expect_lt(took, GRACE_S + 3.0 + 1.0, "fsdpd exited %.2f s after SIGTERM", took);
  char lp[1200];
  snprintf(lp, sizeof lp, "%s/jobs/j-2/1/rank-0.log", workdir);
  cr_expect_gt(log_count("by its report deadline"), 0, "%s\nrank 0:\n%s", tu_slurp(fsdpd_log, NULL),
               tu_slurp(lp, NULL));
  free(ck);
}

Test(fsdpd, refuses_to_run_ranks_as_root, .timeout = 10 * TU_SLOW) {
  if (geteuid() != 0) cr_skip_test("needs root");
  const char *args[] = {"--devices", "cpu:1", "--work-dir", workdir, NULL};
  int pid = fsdpd_spawn(args), status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  char *out = tu_slurp(fsdpd_log, NULL);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "status 0x%x", status);
  cr_expect(strstr(out, "--run-as") && strstr(out, "root"), "%s", out);
  const char *root_args[] = {"--devices", "cpu:1", "--work-dir", workdir, "--run-as", "root", NULL};
  pid = fsdpd_spawn(root_args);
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "--run-as root: status 0x%x", status);
  free(out);
}

/* A coordinator address whose port is out of range is refused at start
 * (exit 2) naming the option: gRPC would dial 99999 - 65536 = 34463. */
Test(fsdpd, a_coordinator_port_out_of_range_is_refused, .timeout = 10 * TU_SLOW) {
  const char *args[] = {"--coordinator", "127.0.0.1:99999", "--devices", "cpu:1", "--work-dir",
                        workdir, NULL};
  int pid = fsdpd_spawn(args), status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  char *out = tu_slurp(fsdpd_log, NULL);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "status 0x%x", status);
  cr_expect(strstr(out, "--coordinator (or FSDP_COORDINATOR): 127.0.0.1:99999: port 99999 is out of "
                        "range: a port is from 1 to 65535"), "%s", out);
  free(out);
}

/* A second fsdpd in a work directory another one runs in is refused at
 * start (exit 2), naming the other's pid: the two would start ranks into
 * the same attempt directories and serve each other's logs. Once the first
 * is gone, the directory is free again. */
Test(fsdpd, a_second_fsdpd_in_the_same_work_dir_is_refused, .timeout = 30 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "fsdpd did not register within 10 s:\n%s",
            tu_slurp(fsdpd_log, NULL));
  const char *args[] = {"--devices", "cpu:1", "--work-dir", workdir, "--name", "twin",
                        geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  int pid = fsdpd_spawn(args), status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  char *out = tu_slurp(fsdpd_log, NULL), want[128];
  snprintf(want, sizeof want, "is another fsdpd's (pid %d), which runs", fsdpd_pid);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "status 0x%x", status);
  cr_expect(strstr(out, want), "\"%s\" missing in:\n%s", want, out);
  free(out);
  kill(fsdpd_pid, SIGTERM);
  cr_assert_eq(waitpid(fsdpd_pid, &status, 0), fsdpd_pid);
  fsdpd_pid = 0;
  pid = fsdpd_spawn(args); /* free again: it runs until stopped */
  usleep(700 * 1000);
  cr_expect_eq(waitpid(pid, &status, WNOHANG), 0, "the work directory was not free again:\n%s",
               tu_slurp(fsdpd_log, NULL));
  kill(pid, SIGTERM);
  waitpid(pid, &status, 0);
}

/* Options that would go wrong later are refused at start: an empty --grace
 * (FSDP_GRACE= in fsdpd.env) was 0 s, every rank SIGKILLed on a stop with
 * no checkpoint; a --listen port past 65535 was served modulo 65536; a
 * --name the coordinator refuses (a control character, over 127 bytes)
 * was retried at every registration forever, the node never registering. */
Test(fsdpd, options_that_would_go_wrong_later_are_refused_at_start, .timeout = 20 * TU_SLOW) {
  const char *grace[] = {"--devices", "cpu:1", "--work-dir", workdir, "--grace", "", NULL};
  const char *refused[] = {"--devices", "cpu:1", "--work-dir", workdir, "--refused-timeout", "",
                           NULL};
  const char *port[] = {"--devices", "cpu:1", "--work-dir", workdir, "--listen", "127.0.0.1:70700",
                        geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  char long_name[200];
  memset(long_name, 'n', 128), long_name[128] = 0;
  const char *esc[] = {"--devices", "cpu:1", "--work-dir", workdir, "--name", "a\033]0;b",
                       geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  const char *len[] = {"--devices", "cpu:1", "--work-dir", workdir, "--name", long_name,
                       geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  /* the token and TLS files too: a malformed one is a bad option (exit 2,
   * which the unit does not restart), a missing one 1 (it may yet come) */
  char missing[4200], spaced[4200];
  snprintf(missing, sizeof missing, "%s/no-such-token", workdir);
  snprintf(spaced, sizeof spaced, "%s.spaced-token", workdir);
  tu_write_file(spaced, "two words\n", 10);
  chmod(spaced, 0600);
  const char *tok[] = {"--devices", "cpu:1", "--work-dir", workdir, "--token-file", missing,
                       geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  const char *flaw[] = {"--devices", "cpu:1", "--work-dir", workdir, "--token-file", spaced,
                        geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  const char *ca[] = {"--devices", "cpu:1", "--work-dir", workdir, "--tls-ca", missing,
                      geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  const char *user[] = {"--devices", "cpu:1", "--work-dir", workdir, "--user-token-file", missing,
                        geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  const char *metrics[] = {"--devices", "cpu:1", "--work-dir", workdir, "--metrics-listen",
                           "localhost:9102", geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  const char *const *cases[] = {grace, refused, port, esc, len, tok, flaw, ca, user, metrics};
  const char *want[] = {"--grace: \"\" is not a number", "--refused-timeout: \"\" is not a number",
                        "--listen 127.0.0.1:70700: give HOST:PORT with a port from 0 to 65535",
                        "--name: a control character (U+001B) at byte 1",
                        "--name: 128 bytes; at most 127",
                        "no-such-token: cannot open", "holds a space", "TLS CA file",
                        "no-such-token: cannot open",
                        "fsdpd: --metrics-listen 'localhost:9102' is not a numeric address"};
  for (int i = 0; i < 10; i++) {
    struct stat before = {0};
    stat(fsdpd_log, &before); /* its log is appended to: this case's lines follow */
    int pid = fsdpd_spawn(cases[i]), status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    size_t n;
    char *out = tu_slurp(fsdpd_log, &n);
    const char *mine = out + ((size_t)before.st_size <= n ? (size_t)before.st_size : n);
    /* a file not there (yet) is 1, which systemd restarts; the rest 2 */
    const int want_rc = cases[i] == tok || cases[i] == ca || cases[i] == user ? 1 : 2;
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == want_rc, "case %d: status 0x%x", i,
              status);
    cr_expect(strstr(mine, want[i]), "case %d: \"%s\" missing in:\n%s", i, want[i], mine);
    free(out);
  }
}

/* A Node service asked to serve beyond loopback without tokens is refused
 * at start (exit 2, saying how to fix it); with --insecure it serves,
 * warning; on loopback, or with a node token (the coordinator then checks
 * tokens and gives the node its log tickets' key), it serves quietly. */
Test(fsdpd, open_rank_logs_beyond_loopback_are_refused_unless_insecure, .timeout = 20 * TU_SLOW) {
  char cmd[2400], out[8192], *nt = tu_path("node.token"), tok[700];
  tu_write_file(nt, "node-secret-0987654321\n", 23);
  snprintf(tok, sizeof tok, "--token-file '%s'", nt);
  const char *extra[] = {"--listen 0.0.0.0:0", "--listen 0.0.0.0:0 --insecure",
                         "--listen 127.0.0.1:0", "--listen 0.0.0.0:0"};
  for (int k = 0; k < 4; k++) {
    snprintf(cmd, sizeof cmd, "timeout 1 %s/bin/fsdpd --coordinator 127.0.0.1:1 --devices cpu:1 "
             "--work-dir '%s' %s %s %s 2>&1; echo \"exit $?\"", tu_root(), workdir, extra[k],
             k == 3 ? tok : "", geteuid() == 0 ? "--run-as nobody" : "");
    tu_sh(cmd, out, sizeof out);
    if (k == 0) {
      cr_assert(strstr(out, "exit 2") && strstr(out, "0.0.0.0:0 without tokens") &&
                    strstr(out, "--insecure"), "%s", out);
      continue;
    }
    cr_assert(strstr(out, "Node service on"), "case %d: %s", k, out);
    cr_assert_eq(strstr(out, "no tokens (--insecure): anyone who can reach 0.0.0.0:0") != NULL,
                 k == 1, "case %d: %s", k, out);
  }
  free(nt);
}

/* fsdpd on a free loopback port with --advertise adv registers the Node
 * service at want; in both, %s stands for that port. */
static void advertised_as(const char *adv_fmt, const char *want_fmt) {
  char listen[64], adv[64], want[64];
  close(tu_listen_loopback(listen, sizeof listen)); /* a free port */
  snprintf(adv, sizeof adv, adv_fmt, strrchr(listen, ':') + 1);
  snprintf(want, sizeof want, want_fmt, strrchr(listen, ':') + 1);
  const char *args[] = {"--devices", "cpu:1", "--work-dir", workdir, "--listen", listen,
                        "--advertise", adv, geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  fsdpd_pid = fsdpd_spawn(args);
  cr_assert(wait_for(registered, 10), "fsdpd did not register within 10 s:\n%s",
            tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  char got[128];
  snprintf(got, sizeof got, "%s", F.reg_address);
  pthread_mutex_unlock(&F.mu);
  cr_assert_str_eq(got, want);
}

/* fsdpd with the options args (after --coordinator) exits 2 at start,
 * saying want. */
static void refused_at_start(const char *const *args, const char *want) {
  cr_assert_eq(truncate(fsdpd_log, 0), 0);
  int pid = fsdpd_spawn(args), status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  char *out = tu_slurp(fsdpd_log, NULL);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 2, "%s: status 0x%x", want, status);
  cr_expect(strstr(out, want), "wanted \"%s\": %s", want, out);
  free(out);
}

/* --advertise: the Node service's address as registered, where clients
 * reach it when the listen address is not theirs to dial (a pod's 0.0.0.0
 * registered as the host node's name, which no port answers on); a bad one
 * is refused at start. */
Test(fsdpd, advertise_is_the_registered_node_address, .timeout = 20 * TU_SLOW) {
  advertised_as("localhost:%s", "localhost:%s");
  /* a port 0, none after the colon, one out of range, an IPv6 address out
   * of brackets (its last colon read as a port's), no host, a bracket left
   * open or followed by anything but a port */
  static const char *const bads[] = {"10.0.0.5:0", "10.0.0.5:", "host:65536", "fe80::1", ":7071",
                                     "[::1", "[]:7071", "[::1]x"};
  for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
    const char *bad[] = {"--devices", "cpu:1", "--work-dir", workdir, "--advertise", bads[i], NULL};
    char want[128];
    snprintf(want, sizeof want, "--advertise: \"%s\" is neither HOST nor HOST:PORT", bads[i]);
    refused_at_start(bad, want);
  }
}

/* --advertise HOST alone: registered with the port the Node service bound,
 * so that a launcher that listens on port 0 (the Slurm script, on every
 * address) can still name a host clients resolve (its node's NodeAddr: a
 * Slurm node name need not be a host name; found by a tester); an IPv6
 * address in brackets. A unix: socket has no port to add. */
Test(fsdpd, advertise_a_host_alone_is_registered_with_the_bound_port, .timeout = 20 * TU_SLOW) {
  advertised_as("[::1]", "[::1]:%s");
  const char *unix_args[] = {"--devices", "cpu:1", "--work-dir", workdir, "--listen",
                             "unix:/tmp/fsdpd-no.sock", "--advertise", "localhost", NULL};
  refused_at_start(unix_args, "a unix: --listen has none to add");
}

static int j3_done(void) { return F.nexits >= 1 && !strcmp(F.exits[F.nexits - 1].job, "j-3"); }

/* An ended attempt (ESTALE from Rendezvous) is given up without a report,
 * and its device is free for the next job at once. */
Test(fsdpd, a_stale_rendezvous_is_given_up_and_frees_the_device, .timeout = 20 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  queue_job("stale-1", 1, 5);
  double until = tu_now_s() + 5;
  char *out = NULL;
  while (tu_now_s() < until) {
    free(out);
    out = tu_slurp(fsdpd_log, NULL);
    if (strstr(out, "rendezvous refused")) break;
    usleep(20000);
  }
  cr_assert(strstr(out, "rendezvous refused") && strstr(out, "given up"), "%s", out);
  free(out);
  queue_job("j-3", 1, 5);
  cr_assert(wait_for(j3_done, 10), "j-3 did not run after the stale rank:\n%s", tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  cr_expect_eq(F.nexits, 1, "no exit is reported for the stale attempt's rank");
  cr_expect_eq(F.exits[0].exit_status, 0, "%s", F.exits[0].message);
  pthread_mutex_unlock(&F.mu);
}

/* With tokens given, fsdpd's own Node service wants the user token: none is
 * UNAUTHENTICATED, the node token PERMISSION_DENIED, the user's gets in. */
Test(fsdpd, its_node_service_requires_the_user_token_when_configured, .timeout = 20 * TU_SLOW) {
  char *ut = tu_path("user.token"), *nt = tu_path("node.token");
  tu_write_file(ut, "user-secret-1234567890\n", 23);
  tu_write_file(nt, "node-secret-0987654321\n", 23);
  const char *args[] = {"--devices", "cpu:1", "--work-dir", workdir, "--user-token-file", ut,
                        "--node-token-file", nt, geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  fsdpd_pid = fsdpd_spawn(args);
  cr_assert(wait_for(registered, 10), "fsdpd did not register");
  char addr[128];
  pthread_mutex_lock(&F.mu);
  snprintf(addr, sizeof addr, "%s", F.reg_address);
  pthread_mutex_unlock(&F.mu);
  const char *token[] = {NULL, nt, ut};
  const int want[] = {FSDP_EAUTH, FSDP_EPERM, FSDP_ENOTFOUND};
  for (int i = 0; i < 3; i++) {
    rpc_client_t *c;
    const rpc_client_opts_t co = {.target = addr, .token_file = token[i]};
    cr_assert_eq(rpc_client_create(&c, &co), 0, "%s", err_msg());
    Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
    req.job_id = "j-9"; /* no such job here: the user gets as far as NOT_FOUND */
    rpc_stream_t *st;
    int rc = rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 10);
    ProtobufCMessage *m = NULL;
    if (!rc) rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), rpc_stream_close(st);
    cr_expect_eq(rc, want[i], "token %d: %d %s", i, rc, err_msg());
    rpc_client_destroy(c);
  }
  /* the user token's digest alone, as on Kubernetes, where a node's own
   * identity is its service account token and it holds no node token */
  kill(fsdpd_pid, SIGKILL);
  waitpid(fsdpd_pid, NULL, 0);
  char *dg = tu_path("user.token.sha256"), cmd[1400], out[512];
  snprintf(cmd, sizeof cmd, "echo \"sha256:$(tr -d '\\n' < '%s' | sha256sum | cut -c1-64)\" > '%s'", ut, dg);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s", out);
  pthread_mutex_lock(&F.mu);
  F.regs = 0;
  pthread_mutex_unlock(&F.mu);
  const char *alone[] = {"--devices", "cpu:1", "--work-dir", workdir, "--user-token-file", dg,
                         geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  fsdpd_pid = fsdpd_spawn(alone);
  cr_assert(wait_for(registered, 10), "fsdpd with the user token's digest alone did not start:\n%s",
            tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  snprintf(addr, sizeof addr, "%s", F.reg_address);
  pthread_mutex_unlock(&F.mu);
  for (int i = 0; i < 3; i += 2) {
    rpc_client_t *c;
    const rpc_client_opts_t co = {.target = addr, .token_file = token[i]};
    cr_assert_eq(rpc_client_create(&c, &co), 0, "%s", err_msg());
    Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
    req.job_id = "j-9";
    rpc_stream_t *st;
    int rc = rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 10);
    ProtobufCMessage *m = NULL;
    if (!rc) rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), rpc_stream_close(st);
    cr_expect_eq(rc, want[i], "user token alone, token %d: %d %s", i, rc, err_msg());
    rpc_client_destroy(c);
  }
  free(ut), free(nt), free(dg);
}

/* ---- rank logs that are not what fsdpd wrote -------------------------------------- */

/* The attempt directory <work-dir>/jobs/<job>/1, made by the test as fsdpd
 * would, with rank-0.log and rank-1.log holding bytes each (0: none). */
static void fake_attempt(const char *job, size_t bytes) {
  char p[1200];
  const char *fmt[] = {"%s", "%s/jobs", "%s/jobs/%s", "%s/jobs/%s/1"};
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, fmt[i], workdir, job);
    cr_assert(!mkdir(p, 0755) || errno == EEXIST, "mkdir %s: %s", p, strerror(errno));
  }
  char *buf = malloc(bytes + 1);
  for (size_t i = 0; i < bytes; i++) buf[i] = i % 64 == 63 ? '\n' : 'a' + (char)(i % 26);
  for (int r = 0; r < 2; r++) {
    snprintf(p, sizeof p, "%s/jobs/%s/1/rank-%d.log", workdir, job, r);
    tu_write_file(p, buf, bytes);
  }
  free(buf);
}

/* The first message or end of GetRankLogs(job, attempt 1, rank): 1 with the
 * chunk's length in *len, or the stream's end (0, or a code with err_msg()). */
static int logs_first(rpc_client_t *c, const char *job, uint32_t rank, double timeout_s, size_t *len) {
  Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
  req.job_id = (char *)job;
  req.attempt = 1;
  req.rank = rank;
  rpc_stream_t *st;
  int rc = rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, timeout_s);
  if (rc) return rc;
  ProtobufCMessage *m = NULL;
  rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m);
  if (rc == 1) *len = ((Fsdp__V1__LogChunk *)m)->data.len, protobuf_c_message_free_unpacked(m, NULL);
  rpc_stream_close(st);
  return rc;
}

/* Given a key at its registration (the coordinator checks tokens), fsdpd's
 * Node service takes a log ticket for that rank on this node, unexpired and
 * made with that key, and nothing else: not a user token, nor another
 * rank's, node's or key's ticket. */
/* fsdpd on one cpu device with a token file (opt, holding token, made here
 * as name), registered, and a 100-byte log of each rank of job, attempt 1:
 * the file's path. */
static char *fsdpd_with_token(const char *opt, const char *name, const char *token,
                              const char *job) {
  char *t = tu_path(name);
  tu_write_file(t, token, strlen(token));
  const char *args[] = {"--devices", "cpu:1", "--work-dir", workdir, opt, t,
                        geteuid() == 0 ? "--run-as" : NULL, "nobody", NULL};
  fsdpd_pid = fsdpd_spawn(args);
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  fake_attempt(job, 100);
  return t;
}

Test(fsdpd, its_node_service_takes_a_ticket_for_the_rank_alone, .timeout = 30 * TU_SLOW) {
  log_key_given = 1;
  char *ut = fsdpd_with_token("--user-token-file", "user.token", "user-secret-1234567890\n", "j-7");
  char addr[128];
  pthread_mutex_lock(&F.mu);
  snprintf(addr, sizeof addr, "%s", F.reg_address);
  pthread_mutex_unlock(&F.mu);
  static const uint8_t other_key[TICKET_KEY_BYTES] = "another key, another coordinator";
  const int64_t now = (int64_t)time(NULL);
  struct {
    const uint8_t *key;
    const char *job, *node;
    uint32_t rank;
    int64_t expiry;
    const char *token; /* the user token sent along */
    int want;
  } cases[] = {
      {log_key, "j-7", "n-1", 0, now + 60, NULL, 1},
      {log_key, "j-7", "n-1", 1, now + 60, ut, 1},
      {NULL, NULL, NULL, 0, 0, ut, FSDP_EAUTH},            /* a user token, no ticket */
      {log_key, "j-7", "n-1", 1, now + 60, NULL, FSDP_EAUTH}, /* rank 1's, for rank 0 (below) */
      {log_key, "j-7", "n-2", 0, now + 60, NULL, FSDP_EAUTH}, /* another node's */
      {log_key, "j-8", "n-1", 0, now + 60, NULL, FSDP_EAUTH}, /* another job's */
      {log_key, "j-7", "n-1", 0, now - 1, NULL, FSDP_EAUTH},  /* expired */
      {other_key, "j-7", "n-1", 0, now + 60, NULL, FSDP_EAUTH},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char t[TICKET_MAX] = "";
    if (cases[i].key)
      ticket_make(t, cases[i].key, TICKET_KEY_BYTES, cases[i].job, cases[i].rank, cases[i].node,
                  cases[i].expiry);
    rpc_client_t *c;
    const rpc_client_opts_t co = {.target = addr, .token_file = cases[i].token};
    cr_assert_eq(rpc_client_create(&c, &co), 0, "%s", err_msg());
    Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
    req.job_id = "j-7", req.attempt = 1, req.ticket = t;
    req.rank = i == 1 ? 1 : 0;
    rpc_stream_t *st;
    int rc = rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 10);
    ProtobufCMessage *m = NULL;
    if (!rc) rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), rpc_stream_close(st);
    if (m) protobuf_c_message_free_unpacked(m, NULL);
    cr_expect_eq(rc, cases[i].want, "case %zu: %d %s", i, rc, err_msg());
    if (cases[i].want == FSDP_EAUTH) cr_expect(strstr(err_msg(), "ticket"), "%s", err_msg());
    rpc_client_destroy(c);
  }
  log_key_given = 0;
  free(ut);
}

/* A follower of rank 0 of j-2's log from offset (< 0: from the end) with a
 * ticket made with key until expiry; its first message or end in *rc. */
static rpc_stream_t *follow_open(rpc_client_t *c, const uint8_t *key, int64_t expiry,
                                 int64_t offset, int *rc) {
  char t[TICKET_MAX];
  ticket_make(t, key, TICKET_KEY_BYTES, "j-2", 0, "n-1", expiry);
  Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
  req.job_id = "j-2", req.attempt = 1, req.follow = 1, req.offset = offset, req.ticket = t;
  rpc_stream_t *st;
  cr_assert_eq(rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 20), 0, "%s",
               err_msg());
  ProtobufCMessage *m = NULL;
  if ((*rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m)) == 1)
    protobuf_c_message_free_unpacked(m, NULL);
  return st;
}

/* Reads st to its end, which it returns; the next byte it would read in
 * *next (the end of the last chunk, when one came). */
static int follow_drain(rpc_stream_t *st, int64_t *next) {
  ProtobufCMessage *m;
  int rc;
  while ((rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m)) == 1) {
    const Fsdp__V1__LogChunk *ch = (const void *)m;
    *next = ch->offset + (int64_t)ch->data.len;
    protobuf_c_message_free_unpacked(m, NULL);
  }
  rpc_stream_close(st);
  return rc;
}

/* A followed stream lives no longer than its ticket: once the ticket has
 * expired, or the node registered again with a new key, it ends ABORTED
 * (FSDP_ESTALE) naming the byte to resume at, while the rank runs on (it
 * used to run until the rank exited). The new key's tickets then open it. */
Test(fsdpd, a_followed_log_ends_with_its_ticket_or_the_nodes_key, .timeout = 60 * TU_SLOW) {
  log_key_given = 1;
  int pids[2];
  start_long_job(pids);
  rpc_client_t *c = node_client();
  char log[1200];
  snprintf(log, sizeof log, "%s/jobs/j-2/1/rank-0.log", workdir);
  struct stat sb;
  cr_assert_eq(stat(log, &sb), 0, "%s", log);
  /* good for 2 s more: it ends 1 to 2 s from now (expiries are whole seconds) */
  double t0 = tu_now_s();
  int rc;
  rpc_stream_t *st = follow_open(c, log_key, (int64_t)time(NULL) + 2, -100, &rc);
  cr_expect_eq(rc, 1, "%d %s", rc, err_msg());
  int64_t next = sb.st_size - 100;
  rc = follow_drain(st, &next);
  double took = tu_now_s() - t0;
  cr_expect_eq(rc, FSDP_ESTALE, "%d %s", rc, err_msg());
  char want[64];
  snprintf(want, sizeof want, "resume at byte %lld ", (long long)next);
  cr_expect(strstr(err_msg(), "its log ticket expired") && strstr(err_msg(), want),
            "\"%s\" missing in: %s", want, err_msg());
  cr_expect(took > 0.5 && took < 4.0, "ended %.1f s in", took);
  cr_expect_eq(kill(pids[0], 0), 0, "the rank runs on");

  /* a ticket for an hour; the node registers again and gets a new key */
  const int64_t hour = (int64_t)time(NULL) + 3600;
  st = follow_open(c, log_key, hour, -1, &rc);
  cr_expect_eq(rc, 1, "%d %s", rc, err_msg());
  pthread_mutex_lock(&F.mu);
  const int regs = F.regs;
  F.key_next = 1;
  F.session++; /* the next heartbeat is told to register again */
  pthread_mutex_unlock(&F.mu);
  t0 = tu_now_s();
  rc = follow_drain(st, &next);
  took = tu_now_s() - t0;
  cr_expect_eq(rc, FSDP_ESTALE, "%d %s", rc, err_msg());
  cr_expect(strstr(err_msg(), "registered again and has a new log ticket key"), "%s", err_msg());
  cr_expect_lt(took, 5.0, "ended %.1f s after the registration was asked for", took);
  pthread_mutex_lock(&F.mu);
  cr_expect_gt(F.regs, regs, "it registered again");
  pthread_mutex_unlock(&F.mu);
  /* the old key's tickets are refused now, the new key's read on */
  st = follow_open(c, log_key, hour, -1, &rc);
  rpc_stream_close(st);
  cr_expect_eq(rc, FSDP_EAUTH, "the old key's ticket: %d %s", rc, err_msg());
  st = follow_open(c, log_key_next, hour, -1, &rc);
  rpc_stream_close(st);
  cr_expect_eq(rc, 1, "the new key's ticket: %d %s", rc, err_msg());
  rpc_client_destroy(c);
  log_key_given = 0;
}

/* An fsdpd given a node token whose coordinator issues no log tickets (it
 * checks no tokens): once registered, its rank logs are served by the user
 * token rule (here none: open), not refused for want of a key. */
Test(fsdpd, its_node_service_without_a_key_follows_the_user_token_rule, .timeout = 30 * TU_SLOW) {
  char *nt = fsdpd_with_token("--token-file", "node.token", "node-secret-0987654321\n", "j-6");
  rpc_client_t *c = node_client();
  size_t len = 0;
  int rc = 0;
  /* registration reaches the loop just after the fake counts it */
  for (const double t0 = tu_now_s(); tu_now_s() - t0 < 5; usleep(20000))
    if ((rc = logs_first(c, "j-6", 0, 5, &len)) != FSDP_EUNAVAILABLE) break;
  cr_expect_eq(rc, 1, "%d %s", rc, err_msg());
  cr_expect_eq(len, 100);
  rpc_client_destroy(c);
  free(nt);
}

/* The rank's user can replace its log by a FIFO (the attempt directory is
 * theirs): GetRankLogs refuses it at once, instead of fsdpd's loop waiting
 * in open() for a writer that never comes, and the Node service goes on. */
Test(fsdpd, a_log_replaced_by_a_fifo_is_refused_and_fsdpd_keeps_answering, .timeout = 30 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  fake_attempt("j-fifo", 100);
  char p[1200];
  snprintf(p, sizeof p, "%s/jobs/j-fifo/1/rank-0.log", workdir);
  cr_assert_eq(unlink(p), 0);
  cr_assert_eq(mkfifo(p, 0644), 0, "mkfifo %s", p);
  rpc_client_t *c = node_client();
  size_t len = 0;
  const double t0 = tu_now_s();
  int rc = logs_first(c, "j-fifo", 0, 5, &len);
  cr_expect_eq(rc, FSDP_ESTATE, "a FIFO for a log: %d %s", rc, err_msg());
  cr_expect(strstr(err_msg(), "not a regular file") && strstr(err_msg(), "rank-0.log"), "%s", err_msg());
  cr_expect_lt(tu_now_s() - t0, 2.0, "answered at once");
  /* the loop was not held: the next call is answered, with the file's bytes */
  rc = logs_first(c, "j-fifo", 1, 5, &len);
  cr_expect_eq(rc, 1, "rank 1's log after the FIFO: %d %s", rc, err_msg());
  cr_expect_eq(len, 100);
  rpc_client_destroy(c);
}

/* The exit report's last line comes from the rank's log: a log replaced by
 * a FIFO while the rank ran delays neither its report nor the other rank's,
 * and the report says why it has no line. */
Test(fsdpd, a_rank_whose_log_became_a_fifo_is_still_reported, .timeout = 40 * TU_SLOW) {
  int pids[2];
  start_long_job(pids);
  char p[1200];
  snprintf(p, sizeof p, "%s/jobs/j-2/1/rank-0.log", workdir);
  cr_assert_eq(unlink(p), 0);
  cr_assert_eq(mkfifo(p, 0644), 0, "mkfifo %s", p);
  queue_kill("j-2", 1000);
  cr_assert(wait_for(two_exits, 5), "the exits were not reported within 5 s of the kill:\n%s",
            tu_slurp(fsdpd_log, NULL));
  pthread_mutex_lock(&F.mu);
  int found = 0;
  for (int i = 0; i < F.nexits; i++)
    if (F.exits[i].rank == 0) {
      found = 1;
      cr_expect(strstr(F.exits[i].message, "cannot be read") &&
                strstr(F.exits[i].message, "not a regular file"), "%s", F.exits[i].message);
    }
  cr_expect(found, "rank 0's exit was reported");
  pthread_mutex_unlock(&F.mu);
}


/* Ranks of an attempt share its directory, their user's: one could put a
 * FIFO where fsdpd is about to create another's log or job file. fsdpd
 * refuses to start that rank, at once, instead of waiting in open() for a
 * reader, and says so in the rank's exit report. */
Test(fsdpd, a_fifo_planted_for_a_ranks_log_or_job_file_fails_that_rank_at_once, .timeout = 30 * TU_SLOW) {
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  const char *names[] = {"rank-0.conf", "rank-0.log"};
  for (int i = 0; i < 2; i++) {
    const char *job = i ? "j-6" : "j-5";
    fake_attempt(job, 0);
    char p[1200];
    snprintf(p, sizeof p, "%s/jobs/%s/1/%s", workdir, job, names[i]);
    unlink(p);
    cr_assert_eq(mkfifo(p, 0644), 0, "mkfifo %s", p);
    pthread_mutex_lock(&F.mu);
    F.nexits = 0;
    pthread_mutex_unlock(&F.mu);
    queue_job(job, 1, 5);
    cr_assert(wait_for(one_exit, 10), "%s: the rank's exit was not reported within 10 s:\n%s",
              names[i], tu_slurp(fsdpd_log, NULL));
    pthread_mutex_lock(&F.mu);
    cr_expect_str_eq(F.exits[0].job, job);
    cr_expect_eq(F.exits[0].exit_status, 127, "%s: never started", names[i]);
    cr_expect(strstr(F.exits[0].message, names[i]), "%s: %s", names[i], F.exits[0].message);
    pthread_mutex_unlock(&F.mu);
  }
}

/* ---- how many log streams, and for how long ------------------------------------------ */

#define STREAMS_CAP 4

/* A stream of rank 0's log of job (attempt 1) whose first chunk has come:
 * fsdpd has it open. Its client then reads nothing more. */
static rpc_stream_t *logs_held(rpc_client_t *c, const char *job) {
  Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
  req.job_id = (char *)job;
  req.attempt = 1;
  rpc_stream_t *st;
  cr_assert_eq(rpc_stream_open(c, &st, "/fsdp.v1.Node/GetRankLogs", &req.base, 60), 0, "%s", err_msg());
  ProtobufCMessage *m = NULL;
  cr_assert_eq(rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m), 1, "%s", err_msg());
  protobuf_c_message_free_unpacked(m, NULL);
  return st;
}

/* Each stream holds a descriptor of fsdpd's: past FSDP_LOG_STREAMS_MAX one
 * more is refused at once, with how many are open and what to do, and once
 * one ends a new one is served. The logs are large and their clients read
 * one chunk, so the streams stay open until closed. */
Test(fsdpd, log_streams_past_the_cap_are_refused_until_one_ends, .timeout = 40 * TU_SLOW) {
  char cap[16];
  snprintf(cap, sizeof cap, "%d", STREAMS_CAP);
  setenv("FSDP_LOG_STREAMS_MAX", cap, 1); /* this test's process only, and fsdpd's */
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  fake_attempt("j-many", 16u << 20);
  rpc_client_t *c = node_client();
  rpc_stream_t *held[STREAMS_CAP];
  for (int i = 0; i < STREAMS_CAP; i++) held[i] = logs_held(c, "j-many");
  size_t len = 0;
  const double t0 = tu_now_s();
  int rc = logs_first(c, "j-many", 1, 10, &len);
  cr_expect_eq(rc, FSDP_ELIMIT, "stream %d: %d %s", STREAMS_CAP + 1, rc, err_msg());
  cr_expect(strstr(err_msg(), "RESOURCE_EXHAUSTED") && strstr(err_msg(), "at most 4 log streams") &&
            strstr(err_msg(), "4 are open") && strstr(err_msg(), "FSDP_LOG_STREAMS_MAX"), "%s", err_msg());
  cr_expect_lt(tu_now_s() - t0, 2.0, "refused at once");
  /* one ends (its client goes): a new one is served soon after */
  rpc_stream_close(held[0]);
  rc = FSDP_ELIMIT;
  for (double until = tu_now_s() + 5; rc == FSDP_ELIMIT && tu_now_s() < until;) {
    rc = logs_first(c, "j-many", 1, 10, &len);
    if (rc == FSDP_ELIMIT) usleep(50 * 1000);
  }
  cr_expect_eq(rc, 1, "a stream after one ended: %d %s", rc, err_msg());
  for (int i = 1; i < STREAMS_CAP; i++) rpc_stream_close(held[i]);
  rpc_client_destroy(c);
}

/* A client that stops reading does not keep its stream (and descriptor)
 * for good: after FSDP_STREAM_STALL_S with nothing accepted fsdpd ends it,
 * with a message saying why, and its slot serves the next stream. */
Test(fsdpd, a_log_stream_whose_client_stopped_reading_is_ended, .timeout = 40 * TU_SLOW) {
  setenv("FSDP_LOG_STREAMS_MAX", "1", 1);
  setenv("FSDP_STREAM_STALL_S", "1", 1);
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  fake_attempt("j-stall", 16u << 20);
  rpc_client_t *c = node_client();
  const double t0 = tu_now_s();
  rpc_stream_t *st = logs_held(c, "j-stall");
  size_t len = 0;
  int rc = logs_first(c, "j-stall", 1, 10, &len);
  cr_expect_eq(rc, FSDP_ELIMIT, "the one slot is taken: %d %s", rc, err_msg());
  for (double until = tu_now_s() + 10; rc == FSDP_ELIMIT && tu_now_s() < until;) {
    usleep(100 * 1000);
    rc = logs_first(c, "j-stall", 1, 10, &len);
  }
  cr_expect_eq(rc, 1, "the stalled stream's slot was not freed within 10 s: %d %s", rc, err_msg());
  cr_expect_gt(tu_now_s() - t0, 0.9, "not before FSDP_STREAM_STALL_S");
  /* the stalled client, reading at last: what had reached it, then the reason */
  ProtobufCMessage *m = NULL;
  int n = 0;
  while (n < 10000 && (rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, &m)) == 1)
    n++, protobuf_c_message_free_unpacked(m, NULL);
  cr_expect_eq(rc, FSDP_ECANCELED, "after %d chunks: %d %s", n, rc, err_msg());
  cr_expect(strstr(err_msg(), "accepted nothing for 1 s"), "%s", err_msg());
  rpc_stream_close(st);
  rpc_client_destroy(c);
}

/* The soft limit on open files is raised to the hard one at start, and said. */
Test(fsdpd, raises_its_soft_limit_on_open_files_to_the_hard_one, .timeout = 20 * TU_SLOW) {
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max < 8192) cr_skip_test("the hard limit on open files is %llu", (unsigned long long)rl.rlim_max);
  rl.rlim_cur = 1024, rl.rlim_max = 8192; /* this test's process only, and fsdpd's */
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0, "%s", strerror(errno));
  fsdpd_start();
  cr_assert(wait_for(registered, 10), "%s", tu_slurp(fsdpd_log, NULL));
  char p[64], line[256];
  snprintf(p, sizeof p, "/proc/%d/limits", fsdpd_pid);
  FILE *f = fopen(p, "r");
  cr_assert(f, "%s", p);
  unsigned long long soft = 0, hard = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Max open files %llu %llu", &soft, &hard) == 2) break;
  fclose(f);
  cr_expect_eq(soft, 8192, "soft limit %llu", soft);
  cr_expect_eq(hard, 8192, "hard limit %llu", hard);
  char *out = tu_slurp(fsdpd_log, NULL);
  cr_expect(strstr(out, "open files: at most 8192 (soft limit raised from 1024"), "%s", out);
  free(out);
}

/* Tests of the RPC layer (daemon/common/rpc*.c) over real sockets on
 * 127.0.0.1: a server on a libuv loop in a thread of the test, the blocking
 * client on the test's own thread, proto/fsdp.proto's messages both ways.
 *
 * Covered: a unary call and a server stream through the real messages; an
 * error's code and sentence carried across; an unknown method answered at
 * once; truncated and oversized requests; bearer tokens and roles; the
 * health service; a deadline on a handler that never answers (the client
 * times out, the server frees the call); shutdown with a call in flight;
 * TLS with a throwaway CA (openssl), and a client trusting another CA;
 * what a peer may hold before any token is read (raw HTTP/2 by hand: the
 * streams of a connection capped in SETTINGS and enforced, an idle
 * connection closed, the listener alive after a flood of connections past
 * RLIMIT_NOFILE).
 * Every wait is bounded. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/rpc.h"
#include "daemon/common/rpc_impl.h"
#include "daemon/common/text.h"
#include "proto/fsdp.pb-c.h"
#include "proto/health.pb-c.h"
#include "tests/unit/testutil.h"

#define GET_JOB "/fsdp.v1.Coordinator/GetJob"
#define CANCEL_JOB "/fsdp.v1.Coordinator/CancelJob"
#define WATCH_JOB "/fsdp.v1.Coordinator/WatchJob"
#define LIST_NODES "/fsdp.v1.Coordinator/ListNodes"
#define HEARTBEAT "/fsdp.v1.Coordinator/Heartbeat"
#define DRAIN_NODE "/fsdp.v1.Coordinator/DrainNode"
#define REGISTER_NODE "/fsdp.v1.Coordinator/RegisterNode"
#define HEALTH "/grpc.health.v1.Health/Check"
#define WATCH_N 40

/* ---- handlers (on the server's loop thread) ----------------------------------- */

/* GetJob echoes the id back in a job at step 42. */
static void h_get_job(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__GetJobRequest *req = (const void *)m;
  Fsdp__V1__Job job = FSDP__V1__JOB__INIT;
  job.job_id = req->job_id;
  job.state = FSDP__V1__JOB_STATE__JOB_STATE_RUNNING;
  job.step = 42;
  Fsdp__V1__GetJobReply rep = FSDP__V1__GET_JOB_REPLY__INIT;
  rep.job = &job;
  rpc_call_reply(call, &rep.base);
}

/* CancelJob fails the way a store lookup would. */
static void h_cancel_job(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)arg;
  const Fsdp__V1__CancelJobRequest *req = (const void *)m;
  rpc_call_finish(call, err_set(FSDP_ENOTFOUND, "job %s: no such job; fsdpctl jobs lists them",
                                req->job_id));
}

/* WatchJob sends WATCH_N progress messages, one per millisecond, then OK;
 * for job "stall", 2 and then nothing until the call is cancelled. */
typedef struct watch {
  uv_timer_t timer;
  rpc_call_t *call;
  int sent;
  int stall;
} watch_t;
static int watch_cancels;

static void watch_closed(uv_handle_t *h) { free(h->data); }

static void watch_tick(uv_timer_t *t) {
  watch_t *w = t->data;
  if (w->stall && w->sent == 2) {
    uv_timer_stop(&w->timer);
    return;
  }
  if (w->sent == WATCH_N) {
    rpc_call_finish(w->call, 0);
    uv_close((uv_handle_t *)&w->timer, watch_closed);
    return;
  }
  Fsdp__V1__JobProgress p = FSDP__V1__JOB_PROGRESS__INIT;
  p.job_id = "j-1";
  p.step = w->sent++;
  p.total_steps = WATCH_N;
  rpc_call_send(w->call, &p.base);
}

static void watch_cancel(rpc_call_t *call, void *arg) {
  (void)call;
  watch_t *w = arg;
  watch_cancels++;
  uv_close((uv_handle_t *)&w->timer, watch_closed);
}

static void h_watch_job(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  uv_loop_t *loop = arg;
  watch_t *w = calloc(1, sizeof *w);
  w->call = call;
  w->stall = !strcmp(((const Fsdp__V1__WatchJobRequest *)m)->job_id, "stall");
  uv_timer_init(loop, &w->timer);
  w->timer.data = w;
  uv_timer_start(&w->timer, watch_tick, 1, 1);
  rpc_call_on_cancel(call, watch_cancel, w);
}

/* ListNodes never answers: the handler keeps the call until it is cancelled. */
static rpc_call_t *hung;
static int hung_cancels;

static void hung_cancel(rpc_call_t *call, void *arg) {
  (void)arg;
  cr_assert_eq(call, hung);
  hung = NULL;
  hung_cancels++;
}

static void h_list_nodes(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)m, (void)arg;
  hung = call;
  rpc_call_on_cancel(call, hung_cancel, NULL);
}

/* Heartbeat: a node method. */
static void h_heartbeat(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)m, (void)arg;
  Fsdp__V1__HeartbeatReply rep = FSDP__V1__HEARTBEAT_REPLY__INIT;
  rep.heartbeat_interval_ms = rpc_call_role(call) == RPC_ROLE_NODE ? 1000 : 1;
  rpc_call_reply(call, &rep.base);
}

/* DrainNode: an operator method; the reply names the role the call came with. */
static void h_drain_node(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)m, (void)arg;
  Fsdp__V1__NodeInfo node = FSDP__V1__NODE_INFO__INIT;
  node.node_id = rpc_call_role(call) == RPC_ROLE_OPERATOR ? "operator"
                 : rpc_call_role(call) == RPC_ROLE_USER   ? "user"
                                                           : "open";
  Fsdp__V1__DrainNodeReply rep = FSDP__V1__DRAIN_NODE_REPLY__INIT;
  rep.node = &node;
  rpc_call_reply(call, &rep.base);
}

/* RegisterNode: a node method; the reply's node_id is the node the token named. */
static void h_register_node(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  (void)m, (void)arg;
  Fsdp__V1__RegisterNodeReply rep = FSDP__V1__REGISTER_NODE_REPLY__INIT;
  rep.node_id = rpc_call_node(call) ? (char *)rpc_call_node(call) : "(none)";
  rpc_call_reply(call, &rep.base);
}

/* ---- the server, on a loop in its own thread ----------------------------------- */

static struct {
  pthread_t thread;
  uv_loop_t loop;
  uv_async_t wake;
  rpc_server_t *srv;
  rpc_server_opts_t opts;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ready, rc, port;
  char err[1024];
  void (*job)(void);
  int job_done, stop;
} F = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void wake_cb(uv_async_t *a) {
  (void)a;
  pthread_mutex_lock(&F.mu);
  void (*job)(void) = F.job;
  int stop = F.stop;
  pthread_mutex_unlock(&F.mu);
  if (job) {
    job();
    pthread_mutex_lock(&F.mu);
    F.job = NULL;
    F.job_done = 1;
    pthread_cond_broadcast(&F.cv);
    pthread_mutex_unlock(&F.mu);
  }
  if (stop) {
    rpc_server_destroy(F.srv);
    F.srv = NULL;
    uv_close((uv_handle_t *)&F.wake, NULL);
  }
}

static int add_methods(rpc_server_t *s) {
  const rpc_method_t m[] = {
      {GET_JOB, &fsdp__v1__get_job_request__descriptor, &fsdp__v1__get_job_reply__descriptor, 0,
       RPC_ROLE_USER, h_get_job, NULL},
      {CANCEL_JOB, &fsdp__v1__cancel_job_request__descriptor,
       &fsdp__v1__cancel_job_reply__descriptor, 0, RPC_ROLE_USER, h_cancel_job, NULL},
      {WATCH_JOB, &fsdp__v1__watch_job_request__descriptor, &fsdp__v1__job_progress__descriptor, 1,
       RPC_ROLE_USER, h_watch_job, &F.loop},
      {LIST_NODES, &fsdp__v1__list_nodes_request__descriptor,
       &fsdp__v1__list_nodes_reply__descriptor, 0, RPC_ROLE_USER, h_list_nodes, NULL},
      {HEARTBEAT, &fsdp__v1__heartbeat_request__descriptor, &fsdp__v1__heartbeat_reply__descriptor,
       0, RPC_ROLE_NODE, h_heartbeat, NULL},
      {DRAIN_NODE, &fsdp__v1__drain_node_request__descriptor,
       &fsdp__v1__drain_node_reply__descriptor, 0, RPC_ROLE_OPERATOR, h_drain_node, NULL},
      {REGISTER_NODE, &fsdp__v1__register_node_request__descriptor,
       &fsdp__v1__register_node_reply__descriptor, 0, RPC_ROLE_NODE, h_register_node, NULL},
  };
  return rpc_server_add_all(s, m, sizeof m / sizeof m[0]);
}

static void *server_thread(void *arg) {
  (void)arg;
  uv_loop_init(&F.loop);
  uv_async_init(&F.loop, &F.wake, wake_cb);
  int rc = rpc_server_create(&F.srv, &F.loop, &F.opts);
  if (!rc && (rc = add_methods(F.srv))) rpc_server_destroy(F.srv);
  if (!rc && (rc = rpc_server_start(F.srv))) rpc_server_destroy(F.srv);
  pthread_mutex_lock(&F.mu);
  F.rc = rc;
  F.port = rc ? 0 : rpc_server_port(F.srv);
  snprintf(F.err, sizeof F.err, "%s", err_msg());
  F.ready = 1;
  pthread_cond_broadcast(&F.cv);
  pthread_mutex_unlock(&F.mu);
  if (rc) uv_close((uv_handle_t *)&F.wake, NULL);
  uv_run(&F.loop, UV_RUN_DEFAULT); /* until the wake handle closes after the server */
  uv_loop_close(&F.loop);
  return NULL;
}

/* Waits on F.cv until *flag, at most 10 s. */
static void wait_flag(int *flag) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&F.mu);
  while (!*flag)
    if (pthread_cond_timedwait(&F.cv, &F.mu, &until)) break;
  int ok = *flag;
  pthread_mutex_unlock(&F.mu);
  cr_assert(ok, "the server's loop did not answer within 10 s");
}

/* Starts a server; returns rpc_server_create/start's code (message in F.err). */
static int srv_try(const rpc_server_opts_t *o) {
  F.opts = *o;
  if (!F.opts.addr) F.opts.addr = "127.0.0.1:0";
  F.ready = F.stop = 0;
  pthread_create(&F.thread, NULL, server_thread, NULL);
  wait_flag(&F.ready);
  if (F.rc) pthread_join(F.thread, NULL);
  return F.rc;
}

static void srv_start(const rpc_server_opts_t *o) {
  int rc = srv_try(o);
  cr_assert_eq(rc, 0, "server: %s", F.err);
  cr_assert_gt(F.port, 0);
}

/* Runs job on the loop's thread and waits for it. */
static void on_loop(void (*job)(void)) {
  pthread_mutex_lock(&F.mu);
  F.job = job;
  F.job_done = 0;
  pthread_mutex_unlock(&F.mu);
  uv_async_send(&F.wake);
  wait_flag(&F.job_done);
}

static void srv_stop(void) {
  pthread_mutex_lock(&F.mu);
  F.stop = 1;
  pthread_mutex_unlock(&F.mu);
  uv_async_send(&F.wake);
  pthread_join(F.thread, NULL);
}

static int q_calls, q_cancels;
static void query_job(void) {
  q_calls = rpc_server_calls(F.srv);
  q_cancels = hung_cancels;
}

/* Polls the server until it holds no call (the last reply's batch may still
 * be completing when the client has its answer), at most 5 s. */
static void expect_idle(void) {
  double until = tu_now_s() + 5;
  do {
    on_loop(query_job);
    if (!q_calls) return;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  } while (tu_now_s() < until);
  cr_assert_eq(q_calls, 0, "the server still holds %d calls", q_calls);
}

/* ---- client helpers -------------------------------------------------------------- */

static char target[64];

static rpc_client_t *client(const char *token_file, const char *ca_file, const char *host) {
  snprintf(target, sizeof target, "%s:%d", host ? host : "127.0.0.1", F.port);
  rpc_client_opts_t o = {.target = target, .token_file = token_file, .tls_ca_file = ca_file};
  rpc_client_t *c;
  int rc = rpc_client_create(&c, &o);
  cr_assert_eq(rc, 0, "client: %s", err_msg());
  return c;
}

static int get_job(rpc_client_t *c, const char *id, Fsdp__V1__GetJobReply **rep) {
  Fsdp__V1__GetJobRequest req = FSDP__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)id;
  *rep = NULL;
  return rpc_client_call(c, GET_JOB, &req.base, &fsdp__v1__get_job_reply__descriptor,
                         (ProtobufCMessage **)rep, 10);
}

static void expect_get_job_ok(rpc_client_t *c) {
  Fsdp__V1__GetJobReply *rep;
  int rc = get_job(c, "j-7", &rep);
  cr_assert_eq(rc, 0, "%s", err_msg());
  cr_assert_not_null(rep->job);
  cr_assert_str_eq(rep->job->job_id, "j-7");
  cr_assert_eq(rep->job->step, 42);
  cr_assert_eq(rep->job->state, FSDP__V1__JOB_STATE__JOB_STATE_RUNNING);
  protobuf_c_message_free_unpacked(&rep->base, NULL);
}

static int heartbeat(rpc_client_t *c, uint32_t *interval) {
  Fsdp__V1__HeartbeatRequest req = FSDP__V1__HEARTBEAT_REQUEST__INIT;
  req.node_id = "n-1";
  Fsdp__V1__HeartbeatReply *rep;
  int rc = rpc_client_call(c, HEARTBEAT, &req.base, &fsdp__v1__heartbeat_reply__descriptor,
                           (ProtobufCMessage **)&rep, 10);
  if (!rc) {
    *interval = rep->heartbeat_interval_ms;
    protobuf_c_message_free_unpacked(&rep->base, NULL);
  }
  return rc;
}

static int health(rpc_client_t *c, const char *service, int *status) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)service;
  Grpc__Health__V1__HealthCheckResponse *rep;
  int rc = rpc_client_call(c, HEALTH, &req.base, &grpc__health__v1__health_check_response__descriptor,
                           (ProtobufCMessage **)&rep, 10);
  if (!rc) {
    *status = rep->status;
    protobuf_c_message_free_unpacked(&rep->base, NULL);
  }
  return rc;
}

static void write_token(const char *name, const char *text) {
  char *p = tu_path(name);
  tu_write_file(p, text, strlen(text));
  free(p);
}

/* The common case: an open server and a client of it. */
static rpc_client_t *open_default(void) {
  srv_start(&(rpc_server_opts_t){0});
  return client(NULL, NULL, NULL);
}

/* Checks the server let go of every call, then ends both. */
static void close_checked(rpc_client_t *c) {
  expect_idle();
  rpc_client_destroy(c);
  srv_stop();
}

/* ---- tests ----------------------------------------------------------------------- */

Test(rpc, status_mapping_round_trips, .timeout = 5) {
  for (int code = FSDP__ERR_FIRST + 1; code < FSDP__ERR_LAST; code++) {
    grpc_status_code st = rpc_status_from_err(code);
    cr_assert_neq(st, GRPC_STATUS_OK, "%s maps to OK", err_name(code));
    cr_assert_eq(rpc_status_from_err(rpc_err_from_status(st)), st, "%s", err_name(code));
  }
  cr_assert_eq(rpc_status_from_err(0), GRPC_STATUS_OK);
  cr_assert_eq(rpc_err_from_status(GRPC_STATUS_UNAUTHENTICATED), FSDP_EAUTH);
  cr_assert_eq(rpc_err_from_status(GRPC_STATUS_PERMISSION_DENIED), FSDP_EPERM);
  cr_assert_eq(rpc_err_from_status(GRPC_STATUS_UNAVAILABLE), FSDP_EUNAVAILABLE);
  cr_assert_eq(rpc_err_from_status(GRPC_STATUS_DEADLINE_EXCEEDED), FSDP_ETIMEDOUT);
  cr_assert_eq(rpc_status_from_err(FSDP_EINVAL), GRPC_STATUS_INVALID_ARGUMENT);
  cr_assert_str_eq(rpc_status_name(GRPC_STATUS_UNIMPLEMENTED), "UNIMPLEMENTED");
}

Test(rpc, unary_call_through_the_real_messages, .timeout = 20) {
  rpc_client_t *c = open_default();
  for (int i = 0; i < 3; i++) expect_get_job_ok(c);
  close_checked(c);
}

Test(rpc, an_error_arrives_with_its_code_and_sentence, .timeout = 20) {
  rpc_client_t *c = open_default();
  Fsdp__V1__CancelJobRequest req = FSDP__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = "j-404";
  ProtobufCMessage *rep;
  int rc = rpc_client_call(c, CANCEL_JOB, &req.base, &fsdp__v1__cancel_job_reply__descriptor, &rep, 10);
  cr_assert_eq(rc, FSDP_ENOTFOUND, "%s", err_msg());
  cr_assert_null(rep);
  cr_assert(strstr(err_msg(), "job j-404: no such job; fsdpctl jobs lists them"), "%s", err_msg());
  cr_assert(strstr(err_msg(), CANCEL_JOB) && strstr(err_msg(), target), "%s", err_msg());
  close_checked(c);
}

Test(rpc, server_stream_delivers_every_message_in_order, .timeout = 20) {
  rpc_client_t *c = open_default();
  for (int round = 0; round < 2; round++) {
    Fsdp__V1__WatchJobRequest req = FSDP__V1__WATCH_JOB_REQUEST__INIT;
    req.job_id = "j-1";
    rpc_stream_t *st;
    cr_assert_eq(rpc_stream_open(c, &st, WATCH_JOB, &req.base, 10), 0, "%s", err_msg());
    int got = 0, rc;
    Fsdp__V1__JobProgress *p;
    while ((rc = rpc_stream_next(st, &fsdp__v1__job_progress__descriptor, (ProtobufCMessage **)&p)) == 1) {
      cr_assert_eq(p->step, got, "message %d carries step %lld", got, (long long)p->step);
      cr_assert_str_eq(p->job_id, "j-1");
      protobuf_c_message_free_unpacked(&p->base, NULL);
      cr_assert_leq(++got, WATCH_N);
    }
    cr_assert_eq(rc, 0, "%s", err_msg());
    cr_assert_eq(got, WATCH_N);
    cr_assert_eq(rpc_stream_next(st, &fsdp__v1__job_progress__descriptor, (ProtobufCMessage **)&p), 0,
                 "the end repeats");
    rpc_stream_close(st);
  }
  /* a stream closed by the client half way: the handler is told, the server frees the call */
  Fsdp__V1__WatchJobRequest req = FSDP__V1__WATCH_JOB_REQUEST__INIT;
  rpc_stream_t *st;
  cr_assert_eq(rpc_stream_open(c, &st, WATCH_JOB, &req.base, 10), 0, "%s", err_msg());
  ProtobufCMessage *p;
  cr_assert_eq(rpc_stream_next(st, &fsdp__v1__job_progress__descriptor, &p), 1, "%s", err_msg());
  protobuf_c_message_free_unpacked(p, NULL);
  rpc_stream_close(st);
  close_checked(c);
}

Test(rpc, unknown_method_is_unimplemented_at_once, .timeout = 20) {
  rpc_client_t *c = open_default();
  void *rep;
  size_t n;
  double t0 = tu_now_s();
  int rc = rpc_client_call_raw(c, "/fsdp.v1.Coordinator/NoSuchMethod", "", 0, &rep, &n, 10);
  double dt = tu_now_s() - t0;
  cr_assert_eq(rc, FSDP_EUNSUPPORTED, "%s", err_msg());
  cr_assert_lt(dt, 1.0, "answered after %.3f s (deadline 10 s)", dt);
  cr_assert(strstr(err_msg(), "UNIMPLEMENTED") && strstr(err_msg(), "NoSuchMethod"), "%s", err_msg());
  close_checked(c);
}

Test(rpc, truncated_request_is_invalid_argument_naming_the_method, .timeout = 20) {
  rpc_client_t *c = open_default();
  Fsdp__V1__GetJobRequest req = FSDP__V1__GET_JOB_REQUEST__INIT;
  req.job_id = "a job id long enough to cut in the middle";
  uint8_t buf[128];
  size_t n = protobuf_c_message_pack(&req.base, buf);
  void *rep;
  size_t rn;
  int rc = rpc_client_call_raw(c, GET_JOB, buf, n / 2, &rep, &rn, 10);
  cr_assert_eq(rc, FSDP_EINVAL, "%s", err_msg());
  cr_assert(strstr(err_msg(), "INVALID_ARGUMENT") && strstr(err_msg(), GET_JOB ": the request does "
            "not decode as fsdp.v1.GetJobRequest"), "%s", err_msg());
  /* the whole message still works on the same channel */
  rc = rpc_client_call_raw(c, GET_JOB, buf, n, &rep, &rn, 10);
  cr_assert_eq(rc, 0, "%s", err_msg());
  free(rep);
  close_checked(c);
}

/* A string with a NUL byte in it is refused naming the field, not served
 * for the text before the NUL (protobuf-c's strings end there; helper-56:
 * GetRankLogs of "j-2\0x" read j-2's log). */
Test(rpc, a_string_holding_a_nul_is_refused_naming_the_field, .timeout = 20) {
  rpc_client_t *c = open_default();
  /* GetJobRequest: field 1 job_id, "j-7\0x" */
  static const uint8_t top[] = {0x0a, 5, 'j', '-', '7', 0, 'x'};
  void *rep;
  size_t rn;
  int rc = rpc_client_call_raw(c, GET_JOB, top, sizeof top, &rep, &rn, 10);
  cr_assert_eq(rc, FSDP_EINVAL, "%s", err_msg());
  cr_assert(strstr(err_msg(), "field job_id holds a NUL byte"), "%s", err_msg());
  /* the same without the NUL is served */
  static const uint8_t ok[] = {0x0a, 3, 'j', '-', '7'};
  rc = rpc_client_call_raw(c, GET_JOB, ok, sizeof ok, &rep, &rn, 10);
  cr_assert_eq(rc, 0, "%s", err_msg());
  free(rep);
  close_checked(c);
}

Test(rpc, oversized_request_is_resource_exhausted, .timeout = 20) {
  srv_start(&(rpc_server_opts_t){.max_request_bytes = 1024});
  rpc_client_t *c = client(NULL, NULL, NULL);
  char id[4096];
  memset(id, 'x', sizeof id - 1);
  id[sizeof id - 1] = 0;
  Fsdp__V1__GetJobReply *rep;
  int rc = get_job(c, id, &rep);
  cr_assert_eq(rc, FSDP_ELIMIT, "%s", err_msg());
  cr_assert(strstr(err_msg(), "RESOURCE_EXHAUSTED"), "%s", err_msg());
  expect_get_job_ok(c); /* a small one still passes */
  close_checked(c);
}

/* DrainNode; *who: the role the server saw ("operator", "user", "open"). */
static int drain(rpc_client_t *c, char *who, size_t n) {
  Fsdp__V1__DrainNodeRequest req = FSDP__V1__DRAIN_NODE_REQUEST__INIT;
  req.node_id = "n-1";
  req.reason = "test";
  Fsdp__V1__DrainNodeReply *rep;
  int rc = rpc_client_call(c, DRAIN_NODE, &req.base, &fsdp__v1__drain_node_reply__descriptor,
                           (ProtobufCMessage **)&rep, 10);
  if (!rc) {
    snprintf(who, n, "%s", rep->node ? rep->node->node_id : "");
    protobuf_c_message_free_unpacked(&rep->base, NULL);
  }
  return rc;
}

static rpc_server_opts_t token_opts(void) {
  write_token("user.token", "user-secret-1234\n");
  write_token("node.token", "node-secret-5678\n");
  write_token("wrong.token", "user-secret-1235\n");
  write_token("operator.token", "operator-secret-9012\n");
  static char u[512], nd[512];
  char *p = tu_path("user.token");
  snprintf(u, sizeof u, "%s", p);
  free(p);
  p = tu_path("node.token");
  snprintf(nd, sizeof nd, "%s", p);
  free(p);
  return (rpc_server_opts_t){.user_token_file = u, .node_token_file = nd};
}

Test(rpc, tokens_and_roles, .timeout = 30) {
  rpc_server_opts_t o = token_opts();
  srv_start(&o);
  char *wrong = tu_path("wrong.token");
  rpc_client_t *none = client(NULL, NULL, NULL), *bad = client(wrong, NULL, NULL);
  rpc_client_t *user = client(o.user_token_file, NULL, NULL), *node = client(o.node_token_file, NULL, NULL);
  free(wrong);
  Fsdp__V1__GetJobReply *rep;
  uint32_t iv = 0;
  int status = 0;

  cr_assert_eq(get_job(none, "j-7", &rep), FSDP_EAUTH, "%s", err_msg());
  cr_assert(strstr(err_msg(), "UNAUTHENTICATED") && strstr(err_msg(), "no token"), "%s", err_msg());
  cr_assert_eq(heartbeat(none, &iv), FSDP_EAUTH, "%s", err_msg());
  cr_assert_eq(get_job(bad, "j-7", &rep), FSDP_EAUTH, "%s", err_msg());
  cr_assert(strstr(err_msg(), "not valid"), "%s", err_msg());
  cr_assert_eq(heartbeat(bad, &iv), FSDP_EAUTH, "%s", err_msg());
  /* an unknown method tells nothing to a caller without a token */
  void *raw;
  size_t rn;
  cr_assert_eq(rpc_client_call_raw(none, "/fsdp.v1.Coordinator/Nope", "", 0, &raw, &rn, 10),
               FSDP_EAUTH, "%s", err_msg());
  cr_assert_eq(rpc_client_call_raw(user, "/fsdp.v1.Coordinator/Nope", "", 0, &raw, &rn, 10),
               FSDP_EUNSUPPORTED, "%s", err_msg());

  expect_get_job_ok(user);
  cr_assert_eq(heartbeat(user, &iv), FSDP_EPERM, "%s", err_msg());
  cr_assert(strstr(err_msg(), "PERMISSION_DENIED") && strstr(err_msg(), "a user token may not"),
            "%s", err_msg());
  cr_assert_eq(heartbeat(node, &iv), 0, "%s", err_msg());
  cr_assert_eq(iv, 1000, "the handler saw the node role");
  cr_assert_eq(get_job(node, "j-7", &rep), FSDP_EPERM, "%s", err_msg());

  /* Health needs no token */
  cr_assert_eq(health(none, "", &status), 0, "%s", err_msg());
  cr_assert_eq(status, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  expect_idle();
  rpc_client_destroy(none);
  rpc_client_destroy(bad);
  rpc_client_destroy(user);
  rpc_client_destroy(node);
  srv_stop();
}

Test(rpc, operator_role, .timeout = 30) {
  rpc_server_opts_t o = token_opts();
  char who[32];
  uint32_t iv = 0;
  /* no operator token: a user may call the operator's methods, a node may not */
  srv_start(&o);
  rpc_client_t *user = client(o.user_token_file, NULL, NULL), *node = client(o.node_token_file, NULL, NULL);
  cr_assert_eq(drain(user, who, sizeof who), 0, "%s", err_msg());
  cr_assert_str_eq(who, "user");
  cr_assert_eq(drain(node, who, sizeof who), FSDP_EPERM, "%s", err_msg());
  cr_assert(strstr(err_msg(), "a node token may not") && strstr(err_msg(), "needs the user token"),
            "no operator token here, so none is asked for: %s", err_msg());
  rpc_client_destroy(user);
  rpc_client_destroy(node);
  srv_stop();

  /* with one: the operator's methods need it; the operator may do what a user may, not a node */
  char *opf = tu_path("operator.token");
  o.operator_token_file = opf;
  srv_start(&o);
  user = client(o.user_token_file, NULL, NULL), node = client(o.node_token_file, NULL, NULL);
  rpc_client_t *op = client(opf, NULL, NULL);
  cr_assert_eq(drain(user, who, sizeof who), FSDP_EPERM, "%s", err_msg());
  cr_assert(strstr(err_msg(), "PERMISSION_DENIED") && strstr(err_msg(), "a user token may not") &&
            strstr(err_msg(), "needs the operator token"), "%s", err_msg());
  cr_assert_eq(drain(node, who, sizeof who), FSDP_EPERM, "%s", err_msg());
  cr_assert_eq(drain(op, who, sizeof who), 0, "%s", err_msg());
  cr_assert_str_eq(who, "operator");
  expect_get_job_ok(op);
  expect_get_job_ok(user);
  cr_assert_eq(heartbeat(op, &iv), FSDP_EPERM, "%s", err_msg());
  cr_assert(strstr(err_msg(), "an operator token may not"), "%s", err_msg());
  cr_assert_eq(heartbeat(node, &iv), 0, "%s", err_msg());
  Fsdp__V1__GetJobReply *rep;
  cr_assert_eq(get_job(node, "j-7", &rep), FSDP_EPERM, "%s", err_msg());
  cr_assert(strstr(err_msg(), "needs the user or operator token"), "%s", err_msg());
  expect_idle();
  rpc_client_destroy(user);
  rpc_client_destroy(node);
  rpc_client_destroy(op);
  srv_stop();

  /* the operator's token must be its own, and comes only with the other two */
  rpc_server_opts_t alone = {.operator_token_file = opf};
  cr_assert_eq(srv_try(&alone), FSDP_EINVAL);
  cr_assert(strstr(F.err, "without the user and node"), "%s", F.err);
  rpc_server_opts_t same = o;
  same.operator_token_file = o.user_token_file;
  cr_assert_eq(srv_try(&same), FSDP_EINVAL);
  cr_assert(strstr(F.err, "holds the user token"), "%s", F.err);
  same.operator_token_file = o.node_token_file;
  cr_assert_eq(srv_try(&same), FSDP_EINVAL);
  cr_assert(strstr(F.err, "holds the node token"), "%s", F.err);
  same.operator_token_file = "/nonexistent/op.token";
  cr_assert_eq(srv_try(&same), FSDP_ENOENT);
  cr_assert(strstr(F.err, "/nonexistent/op.token"), "%s", F.err);
  free(opf);
}

/* The node RegisterNode's handler was told the caller is ("(none)": no
 * name), or "" when the call failed (its code in *rc). */
static void registered_as(rpc_client_t *c, char *who, size_t n, int *rc) {
  Fsdp__V1__RegisterNodeRequest req = FSDP__V1__REGISTER_NODE_REQUEST__INIT;
  Fsdp__V1__RegisterNodeReply *rep;
  who[0] = 0;
  *rc = rpc_client_call(c, REGISTER_NODE, &req.base, &fsdp__v1__register_node_reply__descriptor,
                        (ProtobufCMessage **)&rep, 10);
  if (!*rc) {
    snprintf(who, n, "%s", rep->node_id);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
  }
}

/* A node token file of "NAME TOKEN" lines: each token names its node to the
 * handler; one shared token names none. Bad tables are refused by line. */
Test(rpc, a_token_per_node_names_the_node, .timeout = 30) {
  rpc_server_opts_t o = token_opts();
  write_token("nodes.tokens", "# fsdpd --name, token\n\nalpha alpha-secret-0001\n  beta\tbeta-secret-00002  \r\n");
  write_token("alpha.token", "alpha-secret-0001\n");
  write_token("beta.token", "beta-secret-00002\n");
  char *table = tu_path("nodes.tokens"), *ta = tu_path("alpha.token"), *tb = tu_path("beta.token");
  char who[64];
  int rc;
  /* shared: a node, not a name */
  srv_start(&o);
  rpc_client_t *shared = client(o.node_token_file, NULL, NULL);
  registered_as(shared, who, sizeof who, &rc);
  cr_expect_eq(rc, 0, "%s", err_msg());
  cr_expect_str_eq(who, "(none)");
  rpc_client_destroy(shared);
  srv_stop();

  rpc_server_opts_t per = {.user_token_file = o.user_token_file, .node_token_file = table};
  srv_start(&per);
  rpc_client_t *a = client(ta, NULL, NULL), *b = client(tb, NULL, NULL);
  rpc_client_t *user = client(o.user_token_file, NULL, NULL), *old = client(o.node_token_file, NULL, NULL);
  registered_as(a, who, sizeof who, &rc);
  cr_expect_str_eq(who, "alpha", "%s", err_msg());
  registered_as(b, who, sizeof who, &rc);
  cr_expect_str_eq(who, "beta", "%s", err_msg());
  registered_as(user, who, sizeof who, &rc);
  cr_expect_eq(rc, FSDP_EPERM, "a user registered a node");
  registered_as(old, who, sizeof who, &rc);
  cr_expect_eq(rc, FSDP_EAUTH, "the shared token is not in the table");
  uint32_t iv = 0;
  cr_expect_eq(heartbeat(b, &iv), 0, "%s", err_msg());
  cr_expect_eq(iv, 1000, "beta's token is a node's");
  expect_get_job_ok(user);
  expect_idle();
  rpc_client_destroy(a), rpc_client_destroy(b), rpc_client_destroy(user), rpc_client_destroy(old);
  srv_stop();

  static const struct {
    const char *text, *says;
  } bad[] = {
      {"alpha alpha-secret-0001\ngamma\n", "line 2 is not NAME TOKEN"},
      {"alpha alpha-key-000001 extra\n", "line 1 is not NAME TOKEN"},
      {"alpha alpha-key-000001\nalpha alpha-key-000002\n",
       "line 2 gives node alpha the name of an earlier line"},
      {"alpha alpha-key-000001\nbeta alpha-key-000001\n",
       "line 2 gives node beta the token of an earlier line"},
      {"alpha user-secret-1234\n", "same token"},
      {"# nobody yet\n\n", "no node in it"},
      {"alpha alpha-key-00000\x01\n", "not printable ASCII"},
      {"alpha alpha-key-000001\nbeta b-1\n", "line 2 holds a token shorter than 16 bytes"},
      {"alpha alpha-key-000001\nbeta abababababababab\n",
       "line 2 holds a token of fewer than 5 different characters"},
      {"alpha aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n", "line 1 holds a token of fewer than 5"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_token("bad.tokens", bad[i].text);
    char *p = tu_path("bad.tokens");
    rpc_server_opts_t x = {.user_token_file = o.user_token_file, .node_token_file = p};
    cr_expect_eq(srv_try(&x), FSDP_EINVAL, "case %zu", i);
    cr_expect(strstr(F.err, bad[i].says) && strstr(F.err, p), "case %zu: %s", i, F.err);
    free(p);
  }
  /* the operator's token is its own, not a node's */
  write_token("op-is-beta.token", "beta-secret-00002\n");
  char *opb = tu_path("op-is-beta.token");
  rpc_server_opts_t x = {.user_token_file = o.user_token_file, .node_token_file = table,
                         .operator_token_file = opb};
  cr_expect_eq(srv_try(&x), FSDP_EINVAL);
  cr_expect(strstr(F.err, "holds the node token"), "%s", F.err);
  free(opb), free(table), free(ta), free(tb);
}

/* ---- Kubernetes service account tokens (rpc_jwt.c) ---------------------------- */

#define SA_SUB "system:serviceaccount:fsdp:fsdpd"

/* `sh -c cmd` must succeed; its output in out. */
static void sh_ok(const char *cmd, char *out, size_t n) {
  int rc = tu_sh(cmd, out, n);
  cr_assert_eq(rc, 0, "%s: %d\n%s", cmd, rc, out);
}

/* A JWT minted by tests/unit/jwt_mint.py (openssl signs it) with the given
 * header and claims (JSON; @NOW+N is now plus N seconds) into the token
 * file name; its path (malloc'd). key: the PEM file that signs. */
static char *mint(const char *name, const char *key, const char *header, const char *claims) {
  char *h = tu_path("jwt-header.json"), *c = tu_path("jwt-claims.json"), *out = tu_path(name);
  tu_write_file(h, header, strlen(header));
  tu_write_file(c, claims, strlen(claims));
  char cmd[4096], res[8192];
  snprintf(cmd, sizeof cmd, "python3 '%s/tests/unit/jwt_mint.py' token '%s' '%s' '%s' > '%s'",
           tu_root(), key, h, c, out);
  sh_ok(cmd, res, sizeof res);
  free(h), free(c);
  return out;
}

/* Claims as the API server writes them for fsdpd's pod on node, with
 * changes: sub, aud, exp and nbf as given (NULL: the usual). */
static const char *claims_for(const char *node, const char *sub, const char *aud, const char *exp,
                              const char *nbf) {
  static char buf[2048];
  char nodepart[256] = "";
  if (node) snprintf(nodepart, sizeof nodepart, "\"node\": {\"name\": \"%s\", \"uid\": \"u3\"}, ", node);
  snprintf(buf, sizeof buf,
           "{\"iss\": \"https://kubernetes.default.svc\", \"sub\": \"%s\", \"aud\": %s, "
           "\"exp\": \"%s\", \"nbf\": \"%s\", \"iat\": \"@NOW-5\", \"kubernetes.io\": "
           "{\"namespace\": \"fsdp\", %s\"pod\": {\"name\": \"fsdpd-x\", \"uid\": \"u1\"}, "
           "\"serviceaccount\": {\"name\": \"fsdpd\", \"uid\": \"u2\"}}}",
           sub ? sub : SA_SUB, aud ? aud : "[\"fsdp-coordinator\"]", exp ? exp : "@NOW+3600",
           nbf ? nbf : "@NOW-5", nodepart);
  return buf;
}

/* A node may show the projected service account token of fsdpd's pod: one
 * signed by a key of the cluster's JWKS, for this audience and fsdpd's
 * service account, unexpired, names its node, as a per-node token would.
 * Every other token is turned away, saying why: expired, not yet valid,
 * another audience, another service account (any pod can mint one for its
 * own), no node, another issuer, another key, a key id not in the set, and
 * the two classic forgeries, alg none and HS256 keyed with the public key.
 * Such a token is a node's: no user method. A user token still works. */
Test(rpc, a_kubernetes_service_account_token_names_its_node, .timeout = 60) {
  rpc_server_opts_t base = token_opts();
  char out[8192], cmd[4096];
  char *k1 = tu_path("sa1.pem"), *k2 = tu_path("sa2.pem"), *jwks = tu_path("jwks.json");
  snprintf(cmd, sizeof cmd, "openssl genrsa -out '%s' 2048 && openssl genrsa -out '%s' 2048 && "
           "python3 '%s/tests/unit/jwt_mint.py' jwks '%s' kid-1 > '%s'", k1, k2, tu_root(), k1, jwks);
  sh_ok(cmd, out, sizeof out);
  rpc_server_opts_t o = {.user_token_file = base.user_token_file, .node_jwks_file = jwks,
                         .node_jwt_subject = SA_SUB};
  srv_start(&o);
  const char *rs256 = "{\"alg\": \"RS256\", \"kid\": \"kid-1\"}";
  char who[64];
  int rc;
  char *good = mint("good.jwt", k1, rs256, claims_for("gpu-7", NULL, NULL, NULL, NULL));
  rpc_client_t *c = client(good, NULL, NULL);
  for (int i = 0; i < 2; i++) { /* the second from what the server remembers */
    registered_as(c, who, sizeof who, &rc);
    cr_expect_eq(rc, 0, "%s", err_msg());
    cr_expect_str_eq(who, "gpu-7");
  }
  Fsdp__V1__GetJobReply *gr = NULL; /* checked only where a node may call: unknown here */
  cr_expect_eq(get_job(c, "j-1", &gr), FSDP_EAUTH, "a node's token called a user method");
  if (gr) protobuf_c_message_free_unpacked(&gr->base, NULL);
  rpc_client_destroy(c);
  rpc_client_t *user = client(base.user_token_file, NULL, NULL);
  expect_get_job_ok(user);
  rpc_client_destroy(user);
  /* aud may also be one string */
  char *one = mint("one-aud.jwt", k1, rs256,
                   claims_for("gpu-8", NULL, "\"fsdp-coordinator\"", NULL, NULL));
  c = client(one, NULL, NULL);
  registered_as(c, who, sizeof who, &rc);
  cr_expect(rc == 0 && !strcmp(who, "gpu-8"), "%d %s: %s", rc, who, err_msg());
  rpc_client_destroy(c);
  static const struct {
    const char *name, *key_is, *header, *sub, *aud, *exp, *nbf, *node, *says;
  } bad[] = {
      {"expired", "k1", NULL, NULL, NULL, "@NOW-120", NULL, "gpu-7", "expired"},
      {"early", "k1", NULL, NULL, NULL, NULL, "@NOW+600", "gpu-7", "not valid yet"},
      {"aud", "k1", NULL, NULL, "[\"kubernetes\", \"vault\"]", NULL, NULL, "gpu-7", "audience"},
      {"sub", "k1", NULL, "system:serviceaccount:default:builder", NULL, NULL, NULL, "gpu-7",
       "service account"},
      {"nonode", "k1", NULL, NULL, NULL, NULL, NULL, NULL, "names no node"},
      {"otherkey", "k2", NULL, NULL, NULL, NULL, NULL, "gpu-7", "no key"},
      {"kid", "k1", "{\"alg\": \"RS256\", \"kid\": \"kid-9\"}", NULL, NULL, NULL, NULL, "gpu-7",
       "no key"},
      {"none", "k1", "{\"alg\": \"none\"}", NULL, NULL, NULL, NULL, "gpu-7", "not"},
      {"hs256", "pub", "{\"alg\": \"HS256\", \"kid\": \"kid-1\"}", NULL, NULL, NULL, NULL, "gpu-7",
       "RS256"},
  };
  char *pub = tu_path("sa1.pub.pem");
  snprintf(cmd, sizeof cmd, "openssl rsa -in '%s' -pubout -out '%s'", k1, pub);
  sh_ok(cmd, out, sizeof out);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s.jwt", bad[i].name);
    const char *key = !strcmp(bad[i].key_is, "k1") ? k1 : !strcmp(bad[i].key_is, "k2") ? k2 : pub;
    char *t = mint(name, key, bad[i].header ? bad[i].header : rs256,
                   claims_for(bad[i].node, bad[i].sub, bad[i].aud, bad[i].exp, bad[i].nbf));
    c = client(t, NULL, NULL);
    registered_as(c, who, sizeof who, &rc);
    cr_expect_eq(rc, FSDP_EAUTH, "%s: %d, as %s", bad[i].name, rc, who);
    cr_expect(strstr(err_msg(), bad[i].says), "%s: %s", bad[i].name, err_msg());
    rpc_client_destroy(c);
    free(t);
  }
  /* the signature covers the first two parts: good's signature on a body
   * naming another node (made by another key) is refused, and so are good
   * with its signature cut short and with one signature byte changed */
  size_t gn, on;
  char *gt = tu_slurp(good, &gn);
  char *other = mint("other-body.jwt", k2, rs256, claims_for("gpu-8", NULL, NULL, NULL, NULL));
  char *ot = tu_slurp(other, &on);
  free(other);
  cr_assert(gt && ot && strrchr(gt, '.') && strrchr(ot, '.'));
  while (gn && (gt[gn - 1] == '\n')) gt[--gn] = 0;
  const char *gsig = strrchr(gt, '.');
  *strrchr(ot, '.') = 0;
  char forged[4][8192];
  snprintf(forged[0], sizeof forged[0], "%s%s", ot, gsig); /* spliced */
  snprintf(forged[1], sizeof forged[1], "%.*s", (int)gn - 4, gt); /* short */
  snprintf(forged[2], sizeof forged[2], "%s", gt);
  char *mid = forged[2] + (gsig - gt) + 20; /* inside the signature */
  *mid = *mid == 'A' ? 'B' : 'A';
  /* the last character's spare bits (342 characters: 4 of them past the
   * 256 bytes) set: the same bytes, another text */
  static const char b64u[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  snprintf(forged[3], sizeof forged[3], "%s", gt);
  cr_assert_eq(strlen(gsig + 1) % 4, 2, "an RS256-2048 signature is 342 characters");
  char *last = forged[3] + gn - 1;
  *last = b64u[(strchr(b64u, *last) - b64u) ^ 1];
  for (int i = 0; i < 4; i++) {
    char *t = tu_path("forged.jwt");
    tu_write_file(t, forged[i], strlen(forged[i]));
    c = client(t, NULL, NULL);
    registered_as(c, who, sizeof who, &rc);
    cr_expect_eq(rc, FSDP_EAUTH, "forgery %d: %d, as %s", i, rc, who);
    cr_expect(strstr(err_msg(), "no key"), "forgery %d: %s", i, err_msg());
    rpc_client_destroy(c);
    free(t);
  }
  free(gt), free(ot);
  srv_stop();
  /* an issuer, when given, must be the token's */
  rpc_server_opts_t oi = o;
  oi.node_jwt_issuer = "https://other.cluster";
  srv_start(&oi);
  c = client(good, NULL, NULL);
  registered_as(c, who, sizeof who, &rc);
  cr_expect(rc == FSDP_EAUTH && strstr(err_msg(), "issuer"), "%d: %s", rc, err_msg());
  rpc_client_destroy(c);
  srv_stop();
  srv_start(&o);
  /* the cluster's key rotated: a token of the new key is refused until the
   * JWKS file holds it, then taken without a restart */
  char *k3 = tu_path("sa3.pem"), *jwks2 = tu_path("jwks2.json");
  snprintf(cmd, sizeof cmd, "openssl genrsa -out '%s' 2048 && python3 '%s/tests/unit/jwt_mint.py' "
           "jwks '%s' kid-3 | sed 's/\"n\": \"\\([^\"]*\\)\"/\"n\": \"\\1==\"/' > '%s'",
           k3, tu_root(), k3, jwks2);
  sh_ok(cmd, out, sizeof out); /* its n with padding, as some writers give it */
  char *rotated = mint("rotated.jwt", k3, "{\"alg\": \"RS256\", \"kid\": \"kid-3\"}",
                       claims_for("gpu-9", NULL, NULL, NULL, NULL));
  c = client(rotated, NULL, NULL);
  registered_as(c, who, sizeof who, &rc);
  cr_expect_eq(rc, FSDP_EAUTH, "a key not in the set: %s", err_msg());
  usleep(1100 * 1000); /* a refused token looks at the file once a second at most */
  cr_assert_eq(rename(jwks2, jwks), 0);
  registered_as(c, who, sizeof who, &rc);
  cr_expect(rc == 0 && !strcmp(who, "gpu-9"), "after the JWKS file changed: %d %s: %s", rc, who,
            err_msg());
  rpc_client_destroy(c);
  free(k3), free(jwks2), free(rotated);
  srv_stop();
  /* a node file or JWKS without a user token file would leave a server open */
  rpc_server_opts_t open_o = {.node_jwks_file = jwks, .node_jwt_subject = SA_SUB, .user_only = 1};
  cr_expect_eq(srv_try(&open_o), FSDP_EINVAL);
  cr_expect(strstr(F.err, "without the user token file"), "%s", F.err);
  free(k1), free(k2), free(jwks), free(good), free(one), free(pub);
}

/* A JWKS file the server cannot use is refused at create, naming the file
 * and what is wrong; so is one without the service account to expect. */
Test(rpc, a_bad_node_jwks_file_is_refused_naming_it, .timeout = 30) {
  rpc_server_opts_t base = token_opts();
  char out[8192], cmd[4096];
  char *weak = tu_path("weak.pem"), *ec = tu_path("ec.pem"), *j = tu_path("bad-jwks.json");
  snprintf(cmd, sizeof cmd, "openssl genrsa -out '%s' 1024 && openssl ecparam -name prime256v1 "
           "-genkey -noout -out '%s'", weak, ec);
  sh_ok(cmd, out, sizeof out);
  char weak_jwks[4096];
  snprintf(cmd, sizeof cmd, "python3 '%s/tests/unit/jwt_mint.py' jwks '%s' w", tu_root(), weak);
  sh_ok(cmd, weak_jwks, sizeof weak_jwks);
  static const struct {
    const char *text, *says;
  } bad[] = {
      {"{\"keys\": [", "not JSON"},
      {"{\"key\": []}", "no \"keys\" array"},
      {"{\"keys\": [{\"kty\": \"EC\", \"crv\": \"P-256\", \"x\": \"AA\", \"y\": \"AA\"}]}",
       "no RSA signing key"},
      {"{\"keys\": [{\"kty\": \"RSA\", \"n\": \"!!\", \"e\": \"AQAB\"}]}", "not an RSA public key"},
      {NULL, "2048 bits"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *text = bad[i].text ? bad[i].text : weak_jwks;
    tu_write_file(j, text, strlen(text));
    rpc_server_opts_t o = {.user_token_file = base.user_token_file, .node_jwks_file = j,
                           .node_jwt_subject = SA_SUB};
    cr_expect_eq(srv_try(&o), FSDP_EINVAL, "case %zu", i);
    cr_expect(strstr(F.err, bad[i].says) && strstr(F.err, j), "case %zu: %s", i, F.err);
  }
  rpc_server_opts_t nosub = {.user_token_file = base.user_token_file, .node_jwks_file = j};
  cr_expect_eq(srv_try(&nosub), FSDP_EINVAL);
  cr_expect(strstr(F.err, "system:serviceaccount"), "%s", F.err);
  free(weak), free(ec), free(j);
}

/* A client reads its token file again when it changes (the kubelet renews a
 * projected token by renaming a new file over it): the next call sends the
 * new token. A file that no longer reads keeps the token it had. */
Test(rpc, a_client_sends_the_token_its_file_holds_now, .timeout = 30) {
  rpc_server_opts_t o = token_opts();
  write_token("renew.tokens", "alpha alpha-secret-0001\nbeta beta-secret-00002\n");
  char *table = tu_path("renew.tokens"), *mine = tu_path("mine.token"), *next = tu_path("next.token");
  rpc_server_opts_t per = {.user_token_file = o.user_token_file, .node_token_file = table};
  srv_start(&per);
  tu_write_file(mine, "alpha-secret-0001\n", 18);
  rpc_client_t *c = client(mine, NULL, NULL);
  char who[64];
  int rc;
  registered_as(c, who, sizeof who, &rc);
  cr_expect_str_eq(who, "alpha", "%s", err_msg());
  tu_write_file(next, "beta-secret-00002\n", 18);
  cr_assert_eq(rename(next, mine), 0);
  registered_as(c, who, sizeof who, &rc);
  cr_expect_str_eq(who, "beta", "the renewed token was not sent: %s", err_msg());
  tu_write_file(next, "two words\n", 10);
  cr_assert_eq(rename(next, mine), 0);
  registered_as(c, who, sizeof who, &rc);
  cr_expect_str_eq(who, "beta", "a token file that does not read replaced the token: %s", err_msg());
  rpc_client_destroy(c);
  srv_stop();
  free(table), free(mine), free(next);
}

/* "sha256:<hex>" of token, by coreutils' sha256sum (not our code), into out. */
static void digest_of(const char *token, char *out, size_t n) {
  char cmd[256], hex[65] = "";
  snprintf(cmd, sizeof cmd, "printf %%s '%s' | sha256sum", token);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  cr_assert_eq(fscanf(p, "%64s", hex), 1);
  pclose(p);
  cr_assert_eq(strlen(hex), 64);
  snprintf(out, n, "sha256:%s\n", hex);
}

/* A server may hold only a token's digest: the token still gets in, the
 * digest itself does not (nor can a client send it), and a digest of
 * another role's token is caught like the token. */
Test(rpc, a_server_may_hold_only_the_digest_of_a_token, .timeout = 30) {
  rpc_server_opts_t o = token_opts(); /* user-secret-1234, node-secret-5678 */
  char dig[128], line[256];
  digest_of("user-secret-1234", dig, sizeof dig);
  write_token("user.sha256", dig);
  digest_of("beta-secret-00002", dig, sizeof dig);
  snprintf(line, sizeof line, "alpha alpha-secret-0001\nbeta %s", dig);
  write_token("nodes.tokens", line);
  write_token("beta.token", "beta-secret-00002\n");
  char *ud = tu_path("user.sha256"), *table = tu_path("nodes.tokens"), *tb = tu_path("beta.token");
  rpc_server_opts_t d = {.user_token_file = ud, .node_token_file = table};
  srv_start(&d);
  rpc_client_t *user = client(o.user_token_file, NULL, NULL), *b = client(tb, NULL, NULL);
  expect_get_job_ok(user);
  char who[64];
  int rc;
  registered_as(b, who, sizeof who, &rc);
  cr_expect_str_eq(who, "beta", "a node's digest names it too: %s", err_msg());
  /* the digest is no token */
  rpc_client_t *c;
  rpc_client_opts_t co = {.target = "127.0.0.1:1", .token_file = ud};
  cr_expect_eq(rpc_client_create(&c, &co), FSDP_EINVAL, "a client sent a digest");
  cr_expect(strstr(err_msg(), "a client sends the token itself") && strstr(err_msg(), ud), "%s", err_msg());
  rpc_client_destroy(user), rpc_client_destroy(b);
  srv_stop();
  /* a digest of the user's token in the node file is the user's token */
  digest_of("user-secret-1234", dig, sizeof dig);
  write_token("node-is-user.sha256", dig);
  char *nu = tu_path("node-is-user.sha256");
  rpc_server_opts_t same = {.user_token_file = o.user_token_file, .node_token_file = nu};
  cr_expect_eq(srv_try(&same), FSDP_EINVAL);
  cr_expect(strstr(F.err, "same token"), "%s", F.err);
  write_token("short.sha256", "sha256:0123abcd\n");
  char *sh = tu_path("short.sha256");
  rpc_server_opts_t bad = {.user_token_file = sh, .node_token_file = o.node_token_file};
  cr_expect_eq(srv_try(&bad), FSDP_EINVAL);
  cr_expect(strstr(F.err, "64 hex digits") && strstr(F.err, sh), "%s", F.err);
  free(ud), free(table), free(tb), free(nu), free(sh);
}

Test(rpc, token_and_tls_files_are_checked_at_create, .timeout = 20) {
  rpc_server_opts_t o = token_opts();
  rpc_server_opts_t half = {.user_token_file = o.user_token_file};
  cr_assert_eq(srv_try(&half), FSDP_EINVAL);
  cr_assert(strstr(F.err, "give both"), "%s", F.err);
  rpc_server_opts_t same = {.user_token_file = o.user_token_file, .node_token_file = o.user_token_file};
  cr_assert_eq(srv_try(&same), FSDP_EINVAL);
  cr_assert(strstr(F.err, "same token"), "%s", F.err);
  write_token("empty.token", " \n");
  char *empty = tu_path("empty.token");
  rpc_server_opts_t e = {.user_token_file = empty, .node_token_file = o.node_token_file};
  cr_assert_eq(srv_try(&e), FSDP_EINVAL);
  cr_assert(strstr(F.err, "is empty") && strstr(F.err, empty), "%s", F.err);
  free(empty);
  /* a token that could be guessed is refused, saying how to make one; 16
   * bytes pass (the shortest the tests above use) */
  write_token("short.token", "abc\n");
  write_token("fifteen.token", "user-secret-123\n");
  char *sh = tu_path("short.token"), *fifteen = tu_path("fifteen.token");
  const char *roles[][3] = {{sh, o.node_token_file, NULL}, {o.user_token_file, sh, NULL},
                            {o.user_token_file, o.node_token_file, fifteen}};
  for (int i = 0; i < 3; i++) {
    rpc_server_opts_t s = {.user_token_file = roles[i][0], .node_token_file = roles[i][1],
                           .operator_token_file = roles[i][2]};
    cr_expect_eq(srv_try(&s), FSDP_EINVAL, "case %d", i);
    cr_expect(strstr(F.err, "shorter than 16 bytes") && strstr(F.err, "openssl rand -hex 32") &&
                  strstr(F.err, i == 2 ? fifteen : sh), "case %d: %s", i, F.err);
  }
  free(sh), free(fifteen);
  /* a pattern: one sentence with its own fix, not a format's fix after it
   * (a digest of a pattern is no better) */
  write_token("pattern.token", "abababababababababab\n");
  char *pat = tu_path("pattern.token");
  rpc_server_opts_t p = {.user_token_file = pat, .node_token_file = o.node_token_file};
  cr_expect_eq(srv_try(&p), FSDP_EINVAL);
  cr_expect(strstr(F.err, "fewer than 5 different characters") && strstr(F.err, pat) &&
                strstr(F.err, "openssl rand -hex 32") && !strstr(F.err, "sha256:") &&
                !strstr(F.err, "put one token"), "%s", F.err);
  free(pat);
  rpc_server_opts_t missing = {.user_token_file = "/nonexistent/u.token", .node_token_file = o.node_token_file};
  cr_assert_eq(srv_try(&missing), FSDP_ENOENT);
  cr_assert(strstr(F.err, "/nonexistent/u.token"), "%s", F.err);
  rpc_server_opts_t tls = {.tls_cert_file = "/nonexistent/c.pem"};
  cr_assert_eq(srv_try(&tls), FSDP_EINVAL);
  rpc_client_opts_t co = {.target = "127.0.0.1:1", .token_file = "/nonexistent/t"};
  rpc_client_t *c;
  cr_assert_eq(rpc_client_create(&c, &co), FSDP_ENOENT);
  cr_assert(strstr(err_msg(), "/nonexistent/t"), "%s", err_msg());
}

Test(rpc, health_check, .timeout = 20) {
  rpc_client_t *c = open_default();
  int status = -1;
  cr_assert_eq(health(c, "", &status), 0, "%s", err_msg());
  cr_assert_eq(status, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  status = -1;
  cr_assert_eq(health(c, "fsdp.v1.Coordinator", &status), 0, "%s", err_msg());
  cr_assert_eq(status, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
  cr_assert_eq(health(c, "fsdp.v1.Coord", &status), FSDP_ENOTFOUND, "%s", err_msg());
  close_checked(c);
}

static void query_watch_cancels(void) { q_cancels = watch_cancels; }

/* A stream with an idle limit: a server that stops sending ends it with
 * ETIMEDOUT after that long (long before its deadline), and is told; one
 * that keeps sending is not cut short however long it lasts. */
Test(rpc, a_stalled_stream_ends_after_its_idle_limit, .timeout = 20) {
  rpc_client_t *c = open_default();
  Fsdp__V1__WatchJobRequest req = FSDP__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = "stall";
  rpc_stream_t *st;
  ProtobufCMessage *p;
  cr_assert_eq(rpc_stream_open(c, &st, WATCH_JOB, &req.base, 10), 0, "%s", err_msg());
  rpc_stream_set_idle(st, 0.3);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(rpc_stream_next(st, &fsdp__v1__job_progress__descriptor, &p), 1, "%s", err_msg());
    protobuf_c_message_free_unpacked(p, NULL);
  }
  const double t0 = tu_now_s();
  cr_assert_eq(rpc_stream_next(st, &fsdp__v1__job_progress__descriptor, &p), FSDP_ETIMEDOUT);
  const double dt = tu_now_s() - t0;
  cr_expect(dt >= 0.25 && dt < 2, "gave up after %.3f s with a 0.3 s idle limit", dt);
  cr_expect(strstr(err_msg(), "no message for 0.3 s") && strstr(err_msg(), "WatchJob"), "%s",
            err_msg());
  cr_assert_eq(rpc_stream_next(st, &fsdp__v1__job_progress__descriptor, &p), FSDP_ETIMEDOUT,
               "the end repeats");
  rpc_stream_close(st);
  expect_idle(); /* the server saw the cancel and freed the call */
  on_loop(query_watch_cancels);
  cr_expect_eq(q_cancels, 1, "the handler was told");

  req.job_id = "j-1"; /* 40 messages, 1 ms apart: about 40 ms, far over nothing */
  cr_assert_eq(rpc_stream_open(c, &st, WATCH_JOB, &req.base, 10), 0, "%s", err_msg());
  rpc_stream_set_idle(st, 0.5);
  int got = 0, rc;
  while ((rc = rpc_stream_next(st, &fsdp__v1__job_progress__descriptor, &p)) == 1) {
    got++;
    protobuf_c_message_free_unpacked(p, NULL);
  }
  cr_expect_eq(rc, 0, "%s", err_msg());
  cr_expect_eq(got, WATCH_N);
  rpc_stream_close(st);
  close_checked(c);
}

Test(rpc, deadline_on_a_handler_that_never_answers, .timeout = 20) {
  rpc_client_t *c = open_default();
  Fsdp__V1__ListNodesRequest req = FSDP__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *rep;
  double t0 = tu_now_s();
  int rc = rpc_client_call(c, LIST_NODES, &req.base, &fsdp__v1__list_nodes_reply__descriptor, &rep, 0.3);
  double dt = tu_now_s() - t0;
  cr_assert_eq(rc, FSDP_ETIMEDOUT, "%s", err_msg());
  cr_assert(strstr(err_msg(), LIST_NODES), "%s", err_msg());
  cr_assert(dt >= 0.25 && dt < 3, "the call took %.3f s with a 0.3 s deadline", dt);
  expect_idle(); /* the server saw the deadline too and freed the call */
  on_loop(query_job);
  cr_assert_eq(q_cancels, 1, "the handler was told once");
  close_checked(c);
}

static int bg_rc;
static double bg_dt;
static void *bg_list_nodes(void *arg) {
  rpc_client_t *c = arg;
  Fsdp__V1__ListNodesRequest req = FSDP__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *rep;
  double t0 = tu_now_s();
  bg_rc = rpc_client_call(c, LIST_NODES, &req.base, &fsdp__v1__list_nodes_reply__descriptor, &rep, 10);
  bg_dt = tu_now_s() - t0;
  return NULL;
}

Test(rpc, shutdown_cancels_calls_in_flight, .timeout = 20) {
  rpc_client_t *c = open_default();
  pthread_t t;
  pthread_create(&t, NULL, bg_list_nodes, c);
  double until = tu_now_s() + 5;
  do on_loop(query_job);
  while (q_calls < 1 && tu_now_s() < until);
  cr_assert_eq(q_calls, 1, "the call did not reach the handler");
  srv_stop(); /* returns once gRPC gave every call back: nothing leaks (ASan build) */
  cr_assert_eq(hung_cancels, 1);
  pthread_join(t, NULL);
  cr_assert_lt(bg_rc, 0);
  cr_assert_lt(bg_dt, 5, "the client waited %.3f s for a server that shut down", bg_dt);
  rpc_client_destroy(c);
}

Test(rpc, tls, .timeout = 30) {
  const char *d = tu_tmpdir();
  tu_tls_make(d);
  char cert[600], key[600], ca[600], other[600];
  snprintf(cert, sizeof cert, "%s/srv.pem", d);
  snprintf(key, sizeof key, "%s/srv.key", d);
  snprintf(ca, sizeof ca, "%s/ca.pem", d);
  snprintf(other, sizeof other, "%s/otherca.pem", d);
  rpc_server_opts_t o = token_opts();
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  srv_start(&o);
  rpc_client_t *ip = client(o.user_token_file, ca, "127.0.0.1");
  expect_get_job_ok(ip);
  rpc_client_t *name = client(o.user_token_file, ca, "localhost");
  expect_get_job_ok(name);
  rpc_client_t *notoken = client(NULL, ca, NULL);
  Fsdp__V1__GetJobReply *rep;
  cr_assert_eq(get_job(notoken, "j-7", &rep), FSDP_EAUTH, "%s", err_msg());

  double t0 = tu_now_s();
  rpc_client_t *wrong = client(o.user_token_file, other, NULL);
  cr_assert_eq(get_job(wrong, "j-7", &rep), FSDP_EUNAVAILABLE, "%s", err_msg());
  cr_assert(strstr(err_msg(), "CA file"), "%s", err_msg());
  rpc_client_t *plain = client(o.user_token_file, NULL, NULL);
  cr_assert_eq(get_job(plain, "j-7", &rep), FSDP_EUNAVAILABLE, "%s", err_msg());
  cr_assert_lt(tu_now_s() - t0, 5, "refusals take milliseconds, not the 10 s deadline");
  expect_idle();
  rpc_client_destroy(ip);
  rpc_client_destroy(name);
  rpc_client_destroy(notoken);
  rpc_client_destroy(wrong);
  rpc_client_destroy(plain);
  srv_stop();
}

/* A second server on a port in use fails to bind (gRPC's default
 * SO_REUSEPORT would let it share the first's connections: two
 * coordinators over two state databases). */
Test(rpc, a_port_in_use_is_refused, .timeout = 20) {
  rpc_server_opts_t o = {0};
  srv_start(&o);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", F.port);
  uv_loop_t loop;
  uv_loop_init(&loop);
  rpc_server_t *second = NULL;
  rpc_server_opts_t so = {.addr = addr};
  int rc = rpc_server_create(&second, &loop, &so);
  if (!rc) rc = rpc_server_start(second);
  cr_expect_eq(rc, FSDP_EUNAVAILABLE, "a second server on %s: %d (%s)", addr, rc, err_msg());
  cr_expect(strstr(err_msg(), addr) && strstr(err_msg(), "in use"), "%s", err_msg());
  if (second) rpc_server_destroy(second);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  /* the first still serves */
  rpc_client_t *c = client(NULL, NULL, NULL);
  Fsdp__V1__GetJobReply *rep;
  cr_expect_eq(get_job(c, "j-7", &rep), 0, "%s", err_msg());
  if (rep) protobuf_c_message_free_unpacked(&rep->base, NULL);
  rpc_client_destroy(c);
}

/* A client whose server is gone tries it again at least every second
 * (RPC_RECONNECT_MAX_MS, its timer serviced: rpc_client_env), however long
 * it has been gone, so calls on a channel that stays (fsdpd's ranks'
 * reports after a coordinator restart) find the server within about a
 * second of its return. gRPC's own reconnect backoff (1 s, growing 1.6
 * times a try to 2 min, each within 20%) leaves a wait of at least 2.76 s
 * between two tries in 9 s; without the env, the backup poller's 5 s. */
typedef struct caller {
  rpc_client_t *c;
  atomic_int stop;
} caller_t;

/* Calls every 100 ms until stop (each fails: nobody serves). */
static void *caller_main(void *arg) {
  caller_t *k = arg;
  while (!atomic_load(&k->stop)) {
    Fsdp__V1__GetJobReply *rep = NULL;
    if (!get_job(k->c, "j-7", &rep) && rep) protobuf_c_message_free_unpacked(&rep->base, NULL);
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  return NULL;
}

Test(rpc, a_client_tries_a_server_gone_at_least_every_second, .timeout = 30) {
  rpc_client_env(); /* as fsdpd does (this test's process has no gRPC yet) */
  char addr[64];
  int fd = tu_listen_loopback(addr, sizeof addr);
  close(fd); /* its port, for the listener below */
  rpc_client_opts_t o = {.target = addr};
  caller_t k = {NULL, 0};
  cr_assert_eq(rpc_client_create(&k.c, &o), 0, "%s", err_msg());
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, caller_main, &k), 0);
  int tries;
  const double longest = tu_connect_gaps(atoi(strrchr(addr, ':') + 1), 9.0, &tries);
  atomic_store(&k.stop, 1);
  pthread_join(th, NULL);
  rpc_client_t *c = k.c;
  rpc_client_destroy(c);
  cr_expect_lt(longest, 2.0, "%d tries to connect in 9 s, once after a wait of %.2f s", tries,
               longest);
}

Test(rpc, dead_address_is_unavailable_with_advice, .timeout = 20) {
  char addr[64];
  int fd = tu_listen_loopback(addr, sizeof addr); /* a port nobody serves gRPC on: closed now */
  close(fd);
  rpc_client_opts_t o = {.target = addr};
  rpc_client_t *c;
  cr_assert_eq(rpc_client_create(&c, &o), 0, "%s", err_msg());
  Fsdp__V1__GetJobReply *rep;
  double t0 = tu_now_s();
  cr_assert_eq(get_job(c, "j-7", &rep), FSDP_EUNAVAILABLE, "%s", err_msg());
  cr_assert_lt(tu_now_s() - t0, 5);
  cr_assert(strstr(err_msg(), addr) && strstr(err_msg(), "check that the server runs"), "%s", err_msg());
  rpc_client_destroy(c);
}

/* text_clip: long text quoted in a line is cut at a word's end with "...",
 * never inside a UTF-8 sequence; short text is whole; a long word alone is
 * cut where it must be. */
Test(rpc, text_clip_cuts_at_a_word_and_never_inside_a_character) {
  char out[64];
  cr_assert_str_eq(text_clip(out, sizeof out, "short text", 20), "short text");
  cr_assert_str_eq(text_clip(out, sizeof out, "train 8437, eval 936; train 27 tokens", 24),
                   "train 8437, eval 936;...");
  cr_assert_str_eq(text_clip(out, sizeof out, "abcdefghijklmnopqrstuvwxyz", 10), "abcdefghij...");
  /* "é" is two bytes: a cut at byte 5 would split the second one */
  cr_assert_str_eq(text_clip(out, sizeof out, "ééééé", 5), "éé...");
  cr_assert_str_eq(text_clip(out, 8, "a b c d e f g h", 100), "a b c d");
}

/* ---- what a peer may hold before any token is read (rpc_server.c, rpc_guard.c) ---- */

/* A raw HTTP/2 connection to the test server: the client preface and an
 * empty SETTINGS sent. */
static int h2_open(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)F.port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
  static const char pre[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
  cr_assert_eq(send(fd, pre, sizeof pre - 1, MSG_NOSIGNAL), (ssize_t)(sizeof pre - 1));
  return fd;
}

static void h2_frame(uint8_t *f, uint32_t len, uint8_t type, uint8_t flags, uint32_t sid) {
  f[0] = (uint8_t)(len >> 16), f[1] = (uint8_t)(len >> 8), f[2] = (uint8_t)len;
  f[3] = type, f[4] = flags;
  f[5] = (uint8_t)(sid >> 24), f[6] = (uint8_t)(sid >> 16), f[7] = (uint8_t)(sid >> 8), f[8] = (uint8_t)sid;
}

/* Reads frames for at most limit_s: returns the first frame of the given
 * type (its payload in p, at most n bytes, its length in *len), or -1 when
 * the server closed the connection, -2 at the time limit. */
static int h2_wait(int fd, int type, double limit_s, uint8_t *p, size_t n, uint32_t *len) {
  static uint8_t buf[1 << 16];
  size_t have = 0;
  const double until = tu_now_s() + limit_s;
  for (;;) {
    while (have >= 9) {
      const uint32_t l = (uint32_t)buf[0] << 16 | (uint32_t)buf[1] << 8 | buf[2];
      if (have < 9 + l) break;
      if (buf[3] == type && !(type == 4 && (buf[4] & 1))) { /* a SETTINGS ack is not what we want */
        if (p) memcpy(p, buf + 9, l < n ? l : n);
        if (len) *len = l;
        return type;
      }
      memmove(buf, buf + 9 + l, have - 9 - l);
      have -= 9 + l;
    }
    const double left = until - tu_now_s();
    if (left <= 0 || have == sizeof buf) return -2;
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, (int)(left * 1000) + 1) <= 0) continue;
    ssize_t r = recv(fd, buf + have, sizeof buf - have, 0);
    if (r <= 0) return -1;
    have += (size_t)r;
  }
}

Test(rpc, the_server_caps_the_streams_of_a_connection, .timeout = 30) {
  srv_start(&(rpc_server_opts_t){0});
  int fd = h2_open();
  uint8_t p[256];
  uint32_t len = 0;
  cr_assert_eq(h2_wait(fd, 4, 5, p, sizeof p, &len), 4, "no SETTINGS from the server");
  int64_t streams = -1;
  for (uint32_t i = 0; i + 6 <= len && i + 6 <= sizeof p; i += 6)
    if ((p[i] << 8 | p[i + 1]) == 3)
      streams = (int64_t)((uint32_t)p[i + 2] << 24 | (uint32_t)p[i + 3] << 16 | (uint32_t)p[i + 4] << 8 | p[i + 5]);
  cr_assert_eq(streams, 100, "SETTINGS_MAX_CONCURRENT_STREAMS %lld, not FSDP_RPC_STREAMS_MAX's 100",
               (long long)streams);
  /* acknowledged, the cap holds: 101 calls that send headers and never a
   * message lose the connection (they were all kept, ~12 KiB each) */
  static uint8_t out[9 + 101 * (9 + 256)];
  size_t o = 0;
  h2_frame(out, 0, 4, 1, 0), o = 9;
  static const char *hdr[][2] = {{":method", "POST"}, {":scheme", "http"}, {":path", GET_JOB},
                                 {":authority", "x"}, {"content-type", "application/grpc"},
                                 {"te", "trailers"}};
  uint8_t hb[256];
  size_t hn = 0;
  for (size_t k = 0; k < sizeof hdr / sizeof hdr[0]; k++) {
    const size_t nl = strlen(hdr[k][0]), vl = strlen(hdr[k][1]);
    hb[hn++] = 0, hb[hn++] = (uint8_t)nl, memcpy(hb + hn, hdr[k][0], nl), hn += nl;
    hb[hn++] = (uint8_t)vl, memcpy(hb + hn, hdr[k][1], vl), hn += vl;
  }
  cr_assert_leq(9 + 101 * (9 + hn), sizeof out, "a HEADERS frame of %zu bytes", hn);
  for (uint32_t k = 0; k < 101; k++) {
    h2_frame(out + o, (uint32_t)hn, 1, 4, 1 + 2 * k); /* HEADERS, END_HEADERS, no END_STREAM */
    memcpy(out + o + 9, hb, hn);
    o += 9 + hn;
  }
  cr_assert_eq(send(fd, out, o, MSG_NOSIGNAL), (ssize_t)o);
  int r = h2_wait(fd, 7, 10, NULL, 0, NULL); /* GOAWAY, or the connection closed */
  cr_assert(r == 7 || r == -1, "101 open streams on one connection were all kept");
  close(fd);
  srv_stop();
}

Test(rpc, an_idle_connection_is_closed_and_clients_connect_again, .timeout = 30) {
  setenv("FSDP_RPC_IDLE_MS", "300", 1);
  rpc_client_t *c = open_default();
  int fd = h2_open();
  uint8_t ack[9];
  h2_frame(ack, 0, 4, 1, 0);
  cr_assert_eq(send(fd, ack, 9, MSG_NOSIGNAL), 9);
  const double t0 = tu_now_s();
  int r = h2_wait(fd, 7, 5, NULL, 0, NULL);
  cr_assert(r == 7 || r == -1, "a connection with no call was kept 5 s (FSDP_RPC_IDLE_MS 300)");
  cr_assert_gt(tu_now_s() - t0, 0.2, "closed before its idle time");
  close(fd);
  /* a call's connection, idle past the limit, is made again by the next call */
  expect_get_job_ok(c);
  struct timespec s = {1, 0};
  nanosleep(&s, NULL);
  expect_get_job_ok(c);
  close_checked(c);
}

/* A child opens n connections at once (non-blocking), sends each the
 * preface, holds them hold_s and exits. */
static void flood_child(int port_pipe, int n, double hold_s) {
  alarm(30);
  int port = 0;
  if (read(port_pipe, &port, sizeof port) != sizeof port) _exit(2);
  static int fds[4096];
  if (n > 4096) n = 4096;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; i++) {
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fds[i] >= 0) (void)connect(fds[i], (struct sockaddr *)&a, sizeof a);
  }
  struct timespec s = {1, 0};
  nanosleep(&s, NULL);
  static const char pre[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) (void)send(fds[i], pre, sizeof pre - 1, MSG_NOSIGNAL);
  s.tv_sec = (time_t)hold_s;
  nanosleep(&s, NULL);
  _exit(0);
}

/* The listener's guard mirrors a private struct of gRPC 1.51's core: it is
 * used under that core alone (another's would call through a layout it no
 * longer has), and this machine's is that one, or the test below proves
 * nothing. */
Test(rpc, the_listeners_guard_is_used_only_under_the_grpc_it_mirrors) {
  cr_expect(rpc__guard_fits(RPC_GUARD_GRPC_CORE));
  cr_expect(!rpc__guard_fits("30.0.0"));
  cr_expect(!rpc__guard_fits("29.0.0.1"));
  cr_expect(!rpc__guard_fits(NULL));
  cr_assert(rpc__guard_fits(grpc_version_string()), "this gRPC core is %s, the guard mirrors %s",
            grpc_version_string(), RPC_GUARD_GRPC_CORE);
}

Test(rpc, the_listener_outlives_a_flood_that_would_exhaust_its_descriptors, .timeout = 60) {
  int pp[2];
  cr_assert_eq(pipe(pp), 0);
  pid_t kid = fork(); /* before any thread of the test's */
  cr_assert_geq(kid, 0);
  if (!kid) {
    close(pp[1]);
    flood_child(pp[0], 1500, 3);
  }
  close(pp[0]);
  /* 1024 descriptors against 1,500 connections: gRPC 1.51's listener
   * stopped for good at the first EMFILE */
  struct rlimit rl = {1024, 1024};
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  srv_start(&(rpc_server_opts_t){0});
  cr_assert_eq(write(pp[1], &F.port, sizeof F.port), (ssize_t)sizeof F.port);
  close(pp[1]);
  int st = 0;
  cr_assert_eq(waitpid(kid, &st, 0), kid);
  cr_assert(WIFEXITED(st) && !WEXITSTATUS(st), "the flooding child failed (%d)", st);
  rpc_client_t *c = client(NULL, NULL, NULL);
  expect_get_job_ok(c); /* 10 s deadline: a dead listener never answers */
  close_checked(c);
}

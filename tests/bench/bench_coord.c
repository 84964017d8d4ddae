/* bench_coord: the coordinator's control-plane rates on loopback. It starts
 * bin/fsdp-coordinator on a fresh database (synchronous=FULL, the default)
 * and drives it from concurrent client threads, each a blocking RPC client
 * of its own:
 *   - SubmitJob: a valid 2-rank tiny job (validated, its data path resolved
 *     inside the root, stored; no node, so it stays PENDING), per-call
 *     latency p50/p99 and calls per second over BENCH_COORD_SECONDS;
 *   - GetJob of those jobs, the same figures.
 *   - placement over that queue (every job still PENDING): a node of one
 *     device registers (too small for the 2-rank jobs: each pending reason
 *     changes, and all are written), then a job is cancelled (a pass where
 *     no reason changes); the coordinator's loop is busy with each pass, so
 *     the longest GetJob of a client probing every 5 ms meanwhile shows
 *     what a pass over the queue stalls every other call (heartbeats too).
 *   - a Kubernetes service account token's check (rpc_jwt.c, on the loop
 *     thread for each token it has not seen): a valid one and a forged one
 *     (a signature byte changed), with the fuzz corpus' key and token.
 * Prints `bench:` lines and a `bench: target` line per goal (issue 10: at
 * least 2,000 submits/s on the 2-core machine). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/rpc.h"
#include "daemon/common/rpc_impl.h"
#include "daemon/train/data.h"
#include "proto/fsdp.pb-c.h"
#include "tests/bench/benchutil.h"

#define MAX_CALLS 400000

typedef struct worker {
  pthread_t th;
  const char *addr;
  int op; /* 0 submit, 1 get */
  double until;
  double *lat;
  int n, failed;
  int64_t first_job, njobs; /* GetJob reads j-first .. j-(first+njobs-1) */
  char data_opt[600];
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  rpc_client_t *cl;
  rpc_client_opts_t o = {.target = w->addr};
  if (rpc_client_create(&cl, &o)) {
    w->failed = 1;
    return NULL;
  }
  Fsdp__V1__Option opt[3], *optp[3];
  const char *kv[3][2] = {{"model", "tiny"}, {"data", w->data_opt}, {"steps", "10"}};
  for (int i = 0; i < 3; i++) {
    fsdp__v1__option__init(&opt[i]);
    opt[i].key = (char *)kv[i][0], opt[i].value = (char *)kv[i][1];
    optp[i] = &opt[i];
  }
  Fsdp__V1__JobSpec spec = FSDP__V1__JOB_SPEC__INIT;
  spec.name = "bench", spec.world_size = 2, spec.options = optp, spec.n_options = 3;
  char id[32];
  while (w->n < MAX_CALLS / 16 && bench_now_s() < w->until) {
    const double t0 = bench_now_s();
    ProtobufCMessage *rep = NULL;
    int rc;
    if (w->op == 0) {
      Fsdp__V1__SubmitJobRequest q = FSDP__V1__SUBMIT_JOB_REQUEST__INIT;
      q.spec = &spec;
      rc = rpc_client_call(cl, "/fsdp.v1.Coordinator/SubmitJob", &q.base,
                           &fsdp__v1__submit_job_reply__descriptor, &rep, 10.0);
    } else {
      Fsdp__V1__GetJobRequest q = FSDP__V1__GET_JOB_REQUEST__INIT;
      snprintf(id, sizeof id, "j-%lld", (long long)(w->first_job + w->n % w->njobs));
      q.job_id = id;
      rc = rpc_client_call(cl, "/fsdp.v1.Coordinator/GetJob", &q.base,
                           &fsdp__v1__get_job_reply__descriptor, &rep, 10.0);
    }
    if (rc) {
      fprintf(stderr, "bench_coord: %s\n", err_msg());
      w->failed = 1;
      break;
    }
    protobuf_c_message_free_unpacked(rep, NULL);
    w->lat[w->n++] = bench_now_s() - t0;
  }
  rpc_client_destroy(cl);
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Runs op from nthreads clients for secs; prints the figures; calls/s. */
static double run(const char *addr, const char *data_opt, int op, int nthreads, double secs,
                  int64_t njobs, int64_t *done) {
  worker_t w[16];
  double *lat = malloc(sizeof(double) * MAX_CALLS);
  const double t0 = bench_now_s();
  for (int i = 0; i < nthreads; i++) {
    w[i] = (worker_t){.addr = addr, .op = op, .until = t0 + secs,
                      .lat = lat + (size_t)i * (MAX_CALLS / 16), .first_job = 1,
                      .njobs = njobs > 0 ? njobs : 1};
    snprintf(w[i].data_opt, sizeof w[i].data_opt, "%s", data_opt);
    pthread_create(&w[i].th, NULL, worker_main, &w[i]);
  }
  int total = 0, failed = 0;
  for (int i = 0; i < nthreads; i++) pthread_join(w[i].th, NULL);
  const double wall = bench_now_s() - t0;
  double *all = malloc(sizeof(double) * MAX_CALLS);
  for (int i = 0; i < nthreads; i++) {
    memcpy(all + total, w[i].lat, sizeof(double) * (size_t)w[i].n);
    total += w[i].n, failed |= w[i].failed;
  }
  qsort(all, (size_t)total, sizeof *all, cmp_double);
  const double rate = total / wall;
  printf("bench: coord op=%s clients=%d calls=%d calls_per_s=%.0f p50_ms=%.2f p99_ms=%.2f%s\n",
         op ? "GetJob" : "SubmitJob", nthreads, total, rate,
         total ? all[total / 2] * 1e3 : 0.0, total ? all[(size_t)(total * 0.99)] * 1e3 : 0.0,
         failed ? " errors=yes" : "");
  if (done) *done = total;
  free(all), free(lat);
  return failed ? -1 : rate;
}

/* ---- placement over a long queue ---- */

#define PROBES_MAX 100000
typedef struct probe {
  pthread_t th;
  const char *addr;
  volatile int stop;
  double t0[PROBES_MAX], dt[PROBES_MAX]; /* each GetJob: when it began, how long it took */
  volatile int calls;
  int failed;
} probe_t;

/* The longest GetJob that began in [from, to). */
static double probe_worst(const probe_t *p, double from, double to) {
  double w = 0;
  for (int i = 0; i < p->calls; i++)
    if (p->t0[i] >= from && p->t0[i] < to && p->dt[i] > w) w = p->dt[i];
  return w;
}

/* Waits until two more probes have come back: the loop answers again. */
static void probe_wait_answered(const probe_t *p) {
  const int n = p->calls;
  while (p->calls < n + 2 && !p->failed) nanosleep(&(struct timespec){0, 1000000}, NULL);
}

static void *probe_main(void *arg) {
  probe_t *p = arg;
  rpc_client_t *cl;
  rpc_client_opts_t o = {.target = p->addr};
  if (rpc_client_create(&cl, &o)) return p->failed = 1, NULL;
  while (!p->stop && p->calls < PROBES_MAX) {
    Fsdp__V1__GetJobRequest q = FSDP__V1__GET_JOB_REQUEST__INIT;
    q.job_id = "j-1";
    ProtobufCMessage *rep = NULL;
    const double t0 = bench_now_s();
    if (rpc_client_call(cl, "/fsdp.v1.Coordinator/GetJob", &q.base,
                        &fsdp__v1__get_job_reply__descriptor, &rep, 30.0)) {
      p->failed = 1;
      break;
    }
    protobuf_c_message_free_unpacked(rep, NULL);
    p->t0[p->calls] = t0, p->dt[p->calls] = bench_now_s() - t0;
    p->calls++;
    nanosleep(&(struct timespec){0, 5000000}, NULL);
  }
  rpc_client_destroy(cl);
  return NULL;
}

typedef struct beater {
  pthread_t th;
  const char *addr;
  char node[32];
  uint64_t session;
  volatile int stop;
} beater_t;

/* Keeps the node's heartbeat in flight, so placement counts it alive. */
static void *beater_main(void *arg) {
  beater_t *b = arg;
  rpc_client_t *cl;
  rpc_client_opts_t o = {.target = b->addr};
  if (rpc_client_create(&cl, &o)) return NULL;
  while (!b->stop) {
    Fsdp__V1__HeartbeatRequest q = FSDP__V1__HEARTBEAT_REQUEST__INIT;
    q.node_id = b->node, q.session = b->session;
    ProtobufCMessage *rep = NULL;
    if (rpc_client_call(cl, "/fsdp.v1.Coordinator/Heartbeat", &q.base,
                        &fsdp__v1__heartbeat_reply__descriptor, &rep, 30.0))
      break;
    protobuf_c_message_free_unpacked(rep, NULL);
  }
  rpc_client_destroy(cl);
  return NULL;
}

/* One node of one CPU device registers (each pending job's reason changes),
 * then job j-2 is cancelled (a pass in which none does). */
static int placement(const char *addr, int64_t pending) {
  rpc_client_t *cl;
  rpc_client_opts_t o = {.target = addr};
  if (rpc_client_create(&cl, &o)) return -1;
  probe_t *pr = calloc(1, sizeof *pr);
  beater_t bt = {.addr = addr};
  if (!pr) return -1;
  pr->addr = addr;
  pthread_create(&pr->th, NULL, probe_main, pr);
  nanosleep(&(struct timespec){0, 300000000}, NULL);
  Fsdp__V1__Device d = FSDP__V1__DEVICE__INIT, *dp = &d;
  d.kind = "cpu", d.name = "cpu:0", d.total_bytes = 64ull << 30;
  Fsdp__V1__RegisterNodeRequest rq = FSDP__V1__REGISTER_NODE_REQUEST__INIT;
  rq.hostname = "bench", rq.address = "127.0.0.1:9", rq.devices = &dp, rq.n_devices = 1;
  Fsdp__V1__RegisterNodeReply *rr = NULL;
  const double t_reg = bench_now_s();
  int rc = rpc_client_call(cl, "/fsdp.v1.Coordinator/RegisterNode", &rq.base,
                           &fsdp__v1__register_node_reply__descriptor, (ProtobufCMessage **)&rr, 30.0);
  if (!rc) {
    snprintf(bt.node, sizeof bt.node, "%s", rr->node_id);
    bt.session = rr->session;
    protobuf_c_message_free_unpacked(&rr->base, NULL);
    pthread_create(&bt.th, NULL, beater_main, &bt);
  }
  nanosleep(&(struct timespec){1, 500000000}, NULL);
  probe_wait_answered(pr);
  const double t_cancel = bench_now_s();
  Fsdp__V1__CancelJobRequest cq = FSDP__V1__CANCEL_JOB_REQUEST__INIT;
  cq.job_id = "j-2", cq.reason = "bench";
  ProtobufCMessage *crep = NULL;
  if (!rc && !(rc = rpc_client_call(cl, "/fsdp.v1.Coordinator/CancelJob", &cq.base,
                                    &fsdp__v1__cancel_job_reply__descriptor, &crep, 30.0)))
    protobuf_c_message_free_unpacked(crep, NULL);
  nanosleep(&(struct timespec){1, 0}, NULL);
  probe_wait_answered(pr);
  pr->stop = bt.stop = 1;
  pthread_join(pr->th, NULL);
  if (bt.session) pthread_join(bt.th, NULL);
  rpc_client_destroy(cl);
  if (rc) fprintf(stderr, "bench_coord: placement: %s\n", err_msg());
  printf("bench: coord_placement pending=%lld getjob_max_ms_every_reason_changed=%.1f "
         "getjob_max_ms_none_changed=%.1f probes=%d%s\n", (long long)pending,
         probe_worst(pr, t_reg, t_cancel) * 1e3, probe_worst(pr, t_cancel, 1e30) * 1e3, pr->calls,
         pr->failed ? " errors=yes" : "");
  rc = rc || pr->failed ? -1 : 0;
  free(pr);
  return rc;
}

/* Microseconds per rpc__jwt_node of tok (n bytes), each call a token the
 * cache has not seen (its digest made distinct); -1 on an unexpected result. */
static double jwt_check_us(rpc_jwks_t *j, const char *tok, size_t n, int want_ok) {
  enum { REPS = 2000 };
  char node[RPC_NODE_NAME_MAX];
  const double t0 = bench_now_s();
  for (int i = 0; i < REPS; i++) {
    uint8_t sha[RPC_DIGEST_LEN] = {0}; /* the token's SHA-256 in the server: here a counter */
    memcpy(sha, &i, sizeof i);
    sha[4] = (uint8_t)want_ok;
    /* inside the corpus token's validity, 1900000000 to 2000000000 */
    if ((rpc__jwt_node(j, (const uint8_t *)tok, n, sha, 1950000000, node, sizeof node) == 0) !=
        want_ok)
      return -1;
  }
  return (bench_now_s() - t0) / REPS * 1e6;
}

static int jwt_bench(void) {
  const char *dir = "tests/fuzz/corpus/node_jwt";
  char jwks[256], tokf[256];
  snprintf(jwks, sizeof jwks, "%s/jwks", dir);
  snprintf(tokf, sizeof tokf, "%s/k8s-token", dir);
  rpc_jwks_t *j;
  const rpc_jwt_opts_t o = {jwks, "fsdp-coordinator", "system:serviceaccount:fsdp:fsdpd", NULL};
  FILE *f = fopen(tokf, "rb");
  char tok[8192];
  size_t n = f ? fread(tok, 1, sizeof tok - 1, f) : 0;
  if (f) fclose(f);
  while (n && tok[n - 1] == '\n') n--;
  if (!n || rpc__jwks_load(&j, &o)) {
    fprintf(stderr, "bench_coord: %s or %s: %s\n", jwks, tokf, n ? err_msg() : "unreadable");
    return 1;
  }
  const double good = jwt_check_us(j, tok, n, 1);
  tok[n - 10] = tok[n - 10] == 'A' ? 'B' : 'A'; /* inside the signature */
  const double forged = jwt_check_us(j, tok, n, 0);
  rpc__jwks_free(j);
  printf("bench: coord_jwt_check new_token_us=%.1f forged_token_us=%.1f (RS256, 2048-bit key, "
         "one check each)\n", good, forged);
  return good < 0 || forged < 0;
}

int main(void) {
  const char *secs_env = getenv("BENCH_COORD_SECONDS");
  const double secs = secs_env ? atof(secs_env) : 3.0;
  char dir[] = "/tmp/fsdp-bench-coord-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char path[600], db[600], data_opt[600];
  snprintf(path, sizeof path, "%s/tok.bin", dir);
  snprintf(db, sizeof db, "%s/state.db", dir);
  snprintf(data_opt, sizeof data_opt, "%s", path);
  uint16_t *tok = malloc(20000 * sizeof *tok);
  for (int i = 0; i < 20000; i++) tok[i] = (uint16_t)(i * 7 % 256);
  if (data_write(path, tok, 20000)) {
    fprintf(stderr, "bench_coord: %s\n", err_msg());
    return 1;
  }
  free(tok);
  int fd[2];
  if (pipe(fd)) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fd[1], 1);
    int nul = open("/dev/null", 1);
    dup2(nul, 2);
    execl("bin/fsdp-coordinator", "fsdp-coordinator", "--db", db, "--root", dir, "--listen",
          "127.0.0.1:0", (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  const int port = bench_serving_port(fd[0], 10);
  if (!port) {
    fprintf(stderr, "bench_coord: the coordinator did not start (bin/fsdp-coordinator built?)\n");
    return 1;
  }
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  int rc = 0;
  int64_t submitted = 0, n;
  double best = 0;
  for (int t = 1; t <= 16; t *= 4) {
    double r = run(addr, data_opt, 0, t, secs, 0, &n);
    if (r < 0) rc = 1;
    if (r > best) best = r;
    submitted += n;
  }
  printf("bench: target name=coord_submits_per_s calls_per_s=%.0f goal=>=2000 met=%s\n", best,
         best >= 2000 ? "yes" : "no");
  for (int t = 1; t <= 16; t *= 4)
    if (run(addr, data_opt, 1, t, secs, submitted, NULL) < 0) rc = 1;
  if (placement(addr, submitted)) rc = 1;
  if (jwt_bench()) rc = 1;
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) rc = 1;
  return rc;
}

/* bench_nodesim: how many nodes' heartbeats fsdp-coordinator sustains.
 *
 * One process plays N nodes the way fsdpd does it (docs/ARCHITECTURE.md,
 * "Heartbeats are long polls"): each registers (RegisterNode, hostname
 * "sim-<i>", one CPU device), then keeps exactly one Heartbeat in flight,
 * sending the next as soon as the reply arrives. The coordinator holds each
 * heartbeat until the node's slot (one interval after its last slot, 1000
 * ms here), so each node beats at 1 Hz and what it costs the coordinator
 * shows as LATENESS: reply time - send time - interval. A node whose last
 * answer came late sends late and is answered at its usual slot, so that
 * reply's lateness is negative by as much (p50 is about -0.2 ms: the round
 * trip). For each N (1000, 2500, 5000, 7500, 10000 by default; the first N
 * that misses the goal ends the run) it starts bin/fsdp-coordinator on a
 * fresh database, registers the nodes (many registrations in flight), lets
 * every node beat for a warm-up, then measures over a window: p50 and p99
 * lateness, heartbeats per second, and replies that said "register again"
 * (the coordinator lost or declared dead a node: must be 0).
 *
 * It uses gRPC's C core asynchronously and directly, not rpc.h's blocking
 * client: one completion queue, one batch per call whose tag is the node, so
 * 10,000 calls in flight cost one thread. The calls are spread over
 * SIM_CHANNELS channels, each with its own connection (a local subchannel
 * pool: channels to one target would otherwise share one), as many nodes
 * would spread over connections.
 *
 * The coordinator runs with `--sync normal` (one fsync fewer per commit):
 * only the registrations write the database, and the figure is about
 * heartbeats, which write nothing.
 *
 * Prints one `bench: coord_heartbeats` line per N and a `bench: target
 * name=coord_nodes_sustained` line (issue 10: 10,000 nodes with p99 lateness
 * under 10 ms on the 2-core machine). Environment: BENCH_NODESIM_NODES
 * (comma-separated N), BENCH_NODESIM_WINDOW_S (measuring window, default 5). */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "daemon/common/rpc.h"
#include "proto/fsdp.pb-c.h"
#include "tests/bench/benchutil.h"

#define SIM_INTERVAL_MS 1000      /* --heartbeat-interval-ms given to the coordinator */
#define SIM_CHANNELS 16           /* connections the nodes are spread over */
#define SIM_REG_INFLIGHT 256      /* registrations in flight at once */
#define SIM_REG_DEADLINE_S 60.0   /* all N registered within this, or the run fails */
#define SIM_WARMUP_S 3.0          /* every node beats twice or more before measuring */
#define SIM_STOP_DEADLINE_S 10.0  /* cancelled calls come back within this */
#define SIM_BEAT_TIMEOUT_MS 15000 /* a heartbeat's deadline: the interval and ample slack */
#define SIM_GOAL_NODES 10000
#define SIM_GOAL_P99_MS 10.0
#define SIM_MAX_RUNS 16
#define SIM_BATCH 64              /* completions taken (and time-stamped) before handling */

enum { SIM_NONE, SIM_REGISTER, SIM_BEAT };

/* One simulated node: at most one call in flight, whose batch writes back here. */
typedef struct sim_node {
  int index;
  int kind;                     /* SIM_REGISTER or SIM_BEAT while a call is in flight */
  char id[32];                  /* "n-7" once registered */
  uint64_t session;
  double sent;                  /* when the call in flight was started */
  grpc_call *call;
  grpc_byte_buffer *request;    /* ours until the batch completes */
  grpc_byte_buffer *reply;
  grpc_metadata_array md, trailing;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;
} sim_node_t;

typedef struct sim {
  int n;
  sim_node_t *node;
  grpc_channel *ch[SIM_CHANNELS];
  grpc_completion_queue *cq;
  grpc_slice m_register, m_beat;
  int stopping;                 /* no call is started once set */
  int inflight;                 /* calls started and not completed */
  int next_register, registered;
  int next_beat;                /* nodes below this have started beating */
  double win_start, win_end;    /* replies received in [start, end) are measured */
  double *late;                 /* lateness of each measured reply, ms */
  size_t n_late, cap_late;
  long beats, reregister, errors;
  char first_error[256];
} sim_t;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void sim_error(sim_t *s, const char *fmt, const char *a, const char *b) {
  s->errors++;
  if (!s->first_error[0]) snprintf(s->first_error, sizeof s->first_error, fmt, a, b);
}

/* Starts node nd's call of kind with request req: one batch, tag nd. */
static void sim_start(sim_t *s, sim_node_t *nd, int kind, const ProtobufCMessage *req,
                      int timeout_ms) {
  uint8_t buf[256];
  const size_t len = protobuf_c_message_get_packed_size(req);
  if (len > sizeof buf) abort(); /* our own small messages: a programming error */
  protobuf_c_message_pack(req, buf);
  grpc_slice sl = grpc_slice_from_copied_buffer((const char *)buf, len);
  nd->request = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  const gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                             gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
  nd->call = grpc_channel_create_call(s->ch[nd->index % SIM_CHANNELS], NULL,
                                      GRPC_PROPAGATE_DEFAULTS, s->cq,
                                      kind == SIM_REGISTER ? s->m_register : s->m_beat, NULL,
                                      deadline, NULL);
  grpc_metadata_array_init(&nd->md);
  grpc_metadata_array_init(&nd->trailing);
  nd->reply = NULL;
  nd->error_string = NULL;
  nd->details = grpc_empty_slice();
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = nd->request;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &nd->md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &nd->reply;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &nd->trailing;
  ops[5].data.recv_status_on_client.status = &nd->status;
  ops[5].data.recv_status_on_client.status_details = &nd->details;
  ops[5].data.recv_status_on_client.error_string = &nd->error_string;
  nd->kind = kind;
  nd->sent = bench_now_s();
  if (grpc_call_start_batch(nd->call, ops, 6, nd, NULL) != GRPC_CALL_OK) abort();
  s->inflight++;
}

static void sim_register(sim_t *s, sim_node_t *nd) {
  char host[32];
  snprintf(host, sizeof host, "sim-%d", nd->index);
  Fsdp__V1__Device dev = FSDP__V1__DEVICE__INIT, *devp = &dev;
  dev.kind = "cpu", dev.name = "cpu:0", dev.total_bytes = 16ull << 30;
  Fsdp__V1__RegisterNodeRequest q = FSDP__V1__REGISTER_NODE_REQUEST__INIT;
  q.hostname = host, q.address = "127.0.0.1:1", q.version = "bench_nodesim";
  q.devices = &devp, q.n_devices = 1;
  sim_start(s, nd, SIM_REGISTER, &q.base, 30000);
}

static void sim_beat(sim_t *s, sim_node_t *nd) {
  Fsdp__V1__Device dev = FSDP__V1__DEVICE__INIT, *devp = &dev;
  dev.kind = "cpu", dev.name = "cpu:0", dev.total_bytes = 16ull << 30;
  Fsdp__V1__HeartbeatRequest q = FSDP__V1__HEARTBEAT_REQUEST__INIT;
  q.node_id = nd->id, q.session = nd->session;
  q.devices = &devp, q.n_devices = 1;
  sim_start(s, nd, SIM_BEAT, &q.base, SIM_BEAT_TIMEOUT_MS);
}

/* The reply's message decoded as desc, or NULL (status not OK, or garbage). */
static ProtobufCMessage *sim_decode(sim_node_t *nd, const ProtobufCMessageDescriptor *desc) {
  if (nd->status != GRPC_STATUS_OK || !nd->reply) return NULL;
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, nd->reply)) return NULL;
  grpc_slice all = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(all),
                                                  GRPC_SLICE_START_PTR(all));
  grpc_slice_unref(all);
  return m;
}

/* Node nd's call completed at time t: account for it and start its next one. */
static void sim_done(sim_t *s, sim_node_t *nd, double t) {
  s->inflight--;
  const int kind = nd->kind;
  nd->kind = SIM_NONE;
  ProtobufCMessage *m = sim_decode(nd, kind == SIM_REGISTER ? &fsdp__v1__register_node_reply__descriptor
                                                            : &fsdp__v1__heartbeat_reply__descriptor);
  const int measured = t >= s->win_start && t < s->win_end;
  if (!m && !s->stopping) {
    char detail[160];
    snprintf(detail, sizeof detail, "%.*s", (int)GRPC_SLICE_LENGTH(nd->details),
             (const char *)GRPC_SLICE_START_PTR(nd->details));
    sim_error(s, "%s: %s", rpc_status_name(nd->status), detail);
  }
  grpc_call_unref(nd->call);
  nd->call = NULL;
  grpc_byte_buffer_destroy(nd->request);
  if (nd->reply) grpc_byte_buffer_destroy(nd->reply);
  grpc_metadata_array_destroy(&nd->md);
  grpc_metadata_array_destroy(&nd->trailing);
  grpc_slice_unref(nd->details);
  gpr_free((void *)nd->error_string);
  int again = SIM_NONE;
  if (kind == SIM_REGISTER && m) {
    const Fsdp__V1__RegisterNodeReply *r = (const void *)m;
    snprintf(nd->id, sizeof nd->id, "%s", r->node_id);
    nd->session = r->session;
    s->registered++;
    /* the first heartbeats are paced by sim_run; a node registering again
     * (told to) beats at once, as fsdpd does */
    again = nd->index < s->next_beat ? SIM_BEAT : SIM_NONE;
  } else if (kind == SIM_BEAT && m) {
    const Fsdp__V1__HeartbeatReply *r = (const void *)m;
    if (r->reregister) { /* as fsdpd does: register again */
      s->reregister++;
      again = SIM_REGISTER;
    } else {
      again = SIM_BEAT;
      if (measured) {
        if (s->n_late == s->cap_late) {
          s->cap_late = s->cap_late ? 2 * s->cap_late : 65536;
          s->late = realloc(s->late, s->cap_late * sizeof *s->late);
          if (!s->late) abort();
        }
        s->late[s->n_late++] = (t - nd->sent) * 1e3 - r->heartbeat_interval_ms;
      }
    }
    if (measured) s->beats++;
  } else if (kind == SIM_BEAT) {
    again = SIM_BEAT; /* an error: fsdpd would try again, so do we */
  }
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  if (s->stopping || again == SIM_NONE) return;
  if (again == SIM_BEAT) sim_beat(s, nd);
  else sim_register(s, nd);
}

/* Waits up to timeout_s for completions and handles them. Up to SIM_BATCH
 * are taken off the queue first, each stamped as it is taken, so the time
 * spent starting the next calls does not count as the coordinator's. */
static void sim_poll(sim_t *s, double timeout_s) {
  grpc_event ev[SIM_BATCH];
  double at[SIM_BATCH];
  int k = 0;
  gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                 gpr_time_from_micros((int64_t)(timeout_s * 1e6), GPR_TIMESPAN));
  while (k < SIM_BATCH) {
    ev[k] = grpc_completion_queue_next(s->cq, dl, NULL);
    if (ev[k].type != GRPC_OP_COMPLETE) break;
    at[k] = bench_now_s();
    k++;
    dl = gpr_inf_past(GPR_CLOCK_MONOTONIC); /* the rest: only what is already there */
  }
  for (int i = 0; i < k; i++) sim_done(s, ev[i].tag, at[i]);
}

/* utime + stime of pid in seconds, from /proc (-1: unknown). */
static double proc_cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  unsigned long ut, st;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* The CPUs the coordinator and the simulator are pinned to, -1 when not
 * pinned (BENCH_NODESIM_PIN=0, or fewer than 2 CPUs allowed). */
static int pin_coord = -1, pin_sim = -1;

/* Pins the calling thread (and the threads and children it makes after) to cpu. */
static void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set))
    perror("bench_nodesim: sched_setaffinity");
}

/* Picks two CPUs: the first two this process may run on. */
static void pin_choose(void) {
  const char *e = getenv("BENCH_NODESIM_PIN");
  cpu_set_t set;
  if ((e && !strcmp(e, "0")) || sched_getaffinity(0, sizeof set, &set)) return;
  for (int cpu = 0; cpu < CPU_SETSIZE && pin_sim < 0; cpu++)
    if (CPU_ISSET(cpu, &set)) {
      if (pin_coord < 0) pin_coord = cpu;
      else pin_sim = cpu;
    }
  if (pin_sim < 0) pin_coord = -1;
}

/* Starts the coordinator on dir/state.db; its port, 0 on failure. */
static int coord_start(const char *dir, pid_t *pid) {
  char db[600], logf[600], ms[16];
  snprintf(db, sizeof db, "%s/state.db", dir);
  snprintf(logf, sizeof logf, "%s/coordinator.log", dir);
  snprintf(ms, sizeof ms, "%d", SIM_INTERVAL_MS);
  int fd[2];
  if (pipe(fd)) return 0;
  *pid = fork();
  if (*pid < 0) return 0;
  if (*pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pin_to(pin_coord);
    dup2(fd[1], 1);
    int lf = open(logf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (lf >= 0) dup2(lf, 2);
    close(fd[0]), close(fd[1]);
    execl("bin/fsdp-coordinator", "fsdp-coordinator", "--db", db, "--root", dir, "--listen",
          "127.0.0.1:0", "--sync", "normal", "--heartbeat-interval-ms", ms, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  const int port = bench_serving_port(fd[0], 10);
  close(fd[0]);
  return port;
}

static void coord_stop(pid_t pid) {
  kill(pid, SIGTERM);
  const double deadline = bench_now_s() + 10;
  int st;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (bench_now_s() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return;
    }
    usleep(10000);
  }
}

typedef struct sim_result {
  int n, ok;
  double beats_per_s, p50, p99, max, coord_cpu, sim_cpu, reg_s;
  long reregister, errors;
} sim_result_t;

/* One run with n nodes against a fresh coordinator in dir. */
static int sim_run(const char *dir, int n, double window_s, sim_result_t *res) {
  memset(res, 0, sizeof *res);
  res->n = n;
  pid_t pid;
  const int port = coord_start(dir, &pid);
  if (!port) {
    fprintf(stderr, "bench_nodesim: the coordinator did not start (bin/fsdp-coordinator built? "
            "its log: %s/coordinator.log)\n", dir);
    return -1;
  }
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  sim_t s = {.n = n};
  s.node = calloc((size_t)n, sizeof *s.node);
  if (!s.node) abort();
  for (int i = 0; i < n; i++) s.node[i].index = i;
  s.win_start = s.win_end = 1e300; /* nothing measured before the window is set */
  s.cq = grpc_completion_queue_create_for_next(NULL);
  s.m_register = grpc_slice_from_static_string("/fsdp.v1.Coordinator/RegisterNode");
  s.m_beat = grpc_slice_from_static_string("/fsdp.v1.Coordinator/Heartbeat");
  grpc_arg arg = {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL};
  arg.value.integer = 1;
  grpc_channel_args args = {1, &arg};
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  for (int i = 0; i < SIM_CHANNELS; i++) s.ch[i] = grpc_channel_create(target, creds, &args);
  grpc_channel_credentials_release(creds);

  /* register every node, SIM_REG_INFLIGHT at a time */
  const double t0 = bench_now_s();
  int rc = 0;
  while (s.registered < n && !s.errors) {
    while (s.next_register < n && s.next_register - s.registered < SIM_REG_INFLIGHT)
      sim_register(&s, &s.node[s.next_register++]);
    if (bench_now_s() - t0 > SIM_REG_DEADLINE_S) {
      sim_error(&s, "%s%s", "registration did not finish within the deadline", "");
      break;
    }
    sim_poll(&s, 0.1);
  }
  res->reg_s = bench_now_s() - t0;
  if (s.errors) rc = -1;
  /* The first heartbeats spread evenly over one interval: nodes started at
   * independent times beat at independent phases. (Started as each
   * registration returned, the phases would crowd into the registration's
   * seconds, and the coordinator would see bursts above N per second.)
   * Then the warm-up, then the window. */
  const double t1 = bench_now_s(), spread = SIM_INTERVAL_MS / 1e3;
  s.win_start = t1 + spread + SIM_WARMUP_S, s.win_end = s.win_start + window_s;
  double cpu0 = -1, sim0 = 0;
  for (;;) {
    const double now = bench_now_s();
    if (now >= s.win_end || rc) break;
    while (s.next_beat < n && now >= t1 + spread * s.next_beat / n) {
      sim_node_t *nd = &s.node[s.next_beat++];
      if (nd->kind == SIM_NONE && nd->id[0]) sim_beat(&s, nd);
    }
    if (cpu0 < 0 && now >= s.win_start) cpu0 = proc_cpu_s(pid), sim0 = bench_cpu_s();
    sim_poll(&s, s.next_beat < n ? 0.001 : 0.05);
  }
  const double cpu1 = proc_cpu_s(pid), sim1 = bench_cpu_s();
  res->coord_cpu = cpu0 >= 0 && cpu1 >= 0 ? (cpu1 - cpu0) / window_s : -1;
  res->sim_cpu = (sim1 - sim0) / window_s;

  /* stop: cancel whatever is in flight and take every completion back */
  s.stopping = 1;
  for (int i = 0; i < n; i++)
    if (s.node[i].call) grpc_call_cancel(s.node[i].call, NULL);
  const double t2 = bench_now_s();
  while (s.inflight > 0 && bench_now_s() - t2 < SIM_STOP_DEADLINE_S) sim_poll(&s, 0.1);
  if (s.inflight > 0) {
    fprintf(stderr, "bench_nodesim: %d calls did not end after their cancellation\n", s.inflight);
    rc = -1;
  }
  for (int i = 0; i < SIM_CHANNELS; i++) grpc_channel_destroy(s.ch[i]);
  if (s.inflight <= 0) { /* else the queue is left as it is: calls still point at it */
    grpc_completion_queue_shutdown(s.cq);
    while (grpc_completion_queue_next(s.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {}
    grpc_completion_queue_destroy(s.cq);
  }
  coord_stop(pid);

  qsort(s.late, s.n_late, sizeof *s.late, cmp_double);
  if (s.n_late) {
    res->p50 = s.late[s.n_late / 2];
    res->p99 = s.late[(size_t)((double)s.n_late * 0.99)];
    res->max = s.late[s.n_late - 1];
  }
  res->beats_per_s = (double)s.beats / window_s;
  res->reregister = s.reregister;
  res->errors = s.errors;
  /* every node must have beaten in the window: an interval of 1 s and a
   * window of several seconds leave no excuse */
  res->ok = !rc && !s.errors && !s.reregister && s.n_late >= (size_t)n &&
            res->p99 < SIM_GOAL_P99_MS;
  if (s.first_error[0]) fprintf(stderr, "bench_nodesim: nodes=%d: first error: %s\n", n, s.first_error);
  free(s.late);
  free(s.node);
  return rc;
}

int main(void) {
  /* every node costs no descriptor here (calls share SIM_CHANNELS connections),
   * but the coordinator inherits the limit: give it the hard one */
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  signal(SIGPIPE, SIG_IGN);
  pin_choose();
  pin_to(pin_sim); /* before grpc_init: gRPC's threads inherit it */
  const char *w = getenv("BENCH_NODESIM_WINDOW_S");
  const double window_s = w && atof(w) > 0 ? atof(w) : 5.0;
  const char *list = getenv("BENCH_NODESIM_NODES");
  char nodes[256];
  snprintf(nodes, sizeof nodes, "%s", list && *list ? list : "1000,2500,5000,7500,10000");
  grpc_init();
  char dir[] = "/tmp/fsdp-bench-nodesim-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  printf("bench: coord_heartbeats_setup coordinator_sync=normal interval_ms=%d timeout_ms=5000 "
         "channels=%d warmup_s=%.0f window_s=%.0f coord_cpu_pin=%d sim_cpu_pin=%d\n",
         SIM_INTERVAL_MS, SIM_CHANNELS, SIM_WARMUP_S, window_s, pin_coord, pin_sim);
  fflush(stdout);
  int best = 0, rc = 0, runs = 0;
  for (char *save = NULL, *tok = strtok_r(nodes, ",", &save); tok && runs < SIM_MAX_RUNS;
       tok = strtok_r(NULL, ",", &save), runs++) {
    const int n = atoi(tok);
    if (n < 1 || n > 1000000) {
      fprintf(stderr, "bench_nodesim: BENCH_NODESIM_NODES: '%s' is not a node count\n", tok);
      rc = 1;
      break;
    }
    char db[600];
    snprintf(db, sizeof db, "rm -f '%s'/state.db*", dir); /* a fresh database per run */
    if (system(db)) rc = 1;
    sim_result_t r;
    if (sim_run(dir, n, window_s, &r)) rc = 1;
    printf("bench: coord_heartbeats nodes=%d beats_per_s=%.0f late_p50_ms=%.2f late_p99_ms=%.2f "
           "late_max_ms=%.2f reregister=%ld errors=%ld register_s=%.1f coord_cpu=%.2f sim_cpu=%.2f\n",
           n, r.beats_per_s, r.p50, r.p99, r.max, r.reregister, r.errors, r.reg_s, r.coord_cpu,
           r.sim_cpu);
    fflush(stdout);
    if (!r.ok) break;
    if (n > best) best = n;
  }
  printf("bench: target name=coord_nodes_sustained nodes=%d goal=>=%d met=%s\n", best,
         SIM_GOAL_NODES, best >= SIM_GOAL_NODES ? "yes" : "no");
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) rc = 1;
  grpc_shutdown();
  return rc;
}

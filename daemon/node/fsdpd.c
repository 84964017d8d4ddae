/* fsdpd: the node daemon. One per node: it owns the node's devices,
 * registers them with the coordinator, keeps a heartbeat in flight, runs
 * the ranks it is assigned and serves their logs (the Node service).
 *
 *   fsdpd --coordinator ADDR [--devices SPEC] [--run-as USER] [...]   (--help)
 *
 * Threads: the main thread runs the libuv loop, which owns all state (the
 * ranks and their processes, report channels, the Node service's calls,
 * timers, signals). The coordinator session (agent.c) blocks in its calls
 * on a thread of its own and hands replies to the loop; Rendezvous and
 * ReportRankExit calls run on libuv's thread pool, one call per work item
 * (ranks.c); the RPC server has its completion-queue thread (rpc.h). A
 * publish timer (PUBLISH_MS) packs the node's state for the next heartbeat
 * when it changed.
 *
 * SIGTERM or SIGINT: every rank is stopped (SIGTERM, SIGKILL after the
 * grace), their exits are reported (until grace + 3 s), and fsdpd exits 0.
 * On SIGTERM a rank stops at its next step boundary, writes a checkpoint
 * (its shard report goes before its exit) and exits JOB_EXIT_PREEMPTED: the
 * coordinator requeues the job, which resumes from that checkpoint
 * wherever it is placed next (preemption: how Slurm and Kubernetes stop a
 * node's work).
 * Exit status: 0 after a signal, 1 when it cannot start, 2 on bad usage,
 * FSDPD_EXIT_REFUSED (78, sysexits' EX_CONFIG) when the coordinator kept
 * refusing its first registration (a token or name it does not take) for
 * --refused-timeout, before any rank ran: the configuration must change,
 * and the unit's RestartPreventExitStatus keeps systemd from retrying.
 * Refused once registered, fsdpd keeps asking and its ranks keep running. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/common/crash.h"
#include "daemon/common/file.h"
#include "daemon/common/err.h"
#include "daemon/common/ring_secret.h"
#include "daemon/common/log.h"
#include "daemon/common/netaddr.h"
#include "daemon/common/rpc.h"
#include "daemon/common/text.h"
#include "daemon/node/agent.h"
#include "daemon/node/inventory.h"
#include "daemon/node/logs.h"
#include "daemon/node/ranks.h"
#include "daemon/node/supervise.h"
#include "daemon/node/workdir.h"

#define FSDPD_VERSION "0.1.0"
#define PUBLISH_MS 100         /* the heartbeat's data is at most this old */
#define SHUTDOWN_POLL_MS 50
#define SHUTDOWN_REPORTS_S 3.0 /* beyond the grace: time left to report the exits */
#define FSDPD_EXIT_REFUSED 78  /* EX_CONFIG */

typedef struct fsdpd {
  /* options */
  const char *coordinator, *devices, *name, *listen, *rank_host, *work_dir, *run_as;
  const char *token_file, *user_token_file, *node_token_file, *tls_ca, *tls_cert, *tls_key;
  const char *rank_program;
  /* the ranks' user's HOME, USER and LOGNAME (with --run-as), NULL-ended */
  char user_vars[3][PATH_MAX + 16];
  char *user_env[4];
  double grace_s;
  double refused_s; /* a first registration refused this long ends fsdpd */
  const char *metrics_listen;
  const char *advertise; /* the Node service's address as registered (NULL: from --listen) */
  int advertise_host;     /* --advertise is a host alone: registered with the bound port */
  int insecure;          /* --insecure: the Node service beyond loopback without tokens */
  metrics_server_t *metrics;
  /* state */
  uv_loop_t loop;
  inventory_t inv;
  rpc_client_t *client;  /* the ranks' calls (Rendezvous, their reports) */
  rpc_client_t *session; /* the agent's alone (agent_opts_t.client) */
  rpc_server_t *server;
  ranks_t *ranks;
  logs_t *logs;
  agent_t *agent;
  uv_signal_t sigint, sigterm;
  uv_timer_t publish, shutdown;
  uint64_t shutdown_deadline;
  int stopping, exit_status;
  int exit_now;             /* a GPU measurement that never returns is out: no loop run waits */
  int ranks_done;           /* stopped with every rank ended and its exit reported (or given up):
                               the coordinator is told the node left (agent_leave) */
  char address[300], hostname[256], workdir_buf[PATH_MAX], program_buf[PATH_MAX];
} fsdpd_t;

static void usage(FILE *f) {
  fprintf(f,
    "usage: fsdpd --coordinator ADDR [options]\n"
    "The node daemon: registers this node's devices with the coordinator, runs the ranks\n"
    "it is assigned (one process per device) and serves their logs.\n"
    "  --coordinator ADDR    the coordinator (host:port; default $FSDP_COORDINATOR)\n"
    "  --devices SPEC        cpu:N, cuda, cuda:0,1 or auto (default auto)\n"
    "  --name NAME           the node's host name as registered (default: hostname;\n"
    "                        plain UTF-8, at most 127 bytes)\n"
    "  --listen ADDR         the Node service (rank logs; default 127.0.0.1:0, the bound\n"
    "                        address is registered: on 0.0.0.0, as --name:PORT)\n"
    "  --insecure            serve the Node service beyond loopback without tokens: anyone\n"
    "                        who reaches it reads every rank's log (a closed, trusted\n"
    "                        network only; else refused)\n"
    "  --advertise HOST[:PORT]\n"
    "                        the Node service's address as registered, where fsdpctl logs\n"
    "                        reaches it when --listen's is not (a pod's IP behind NAT, a\n"
    "                        Slurm node name that is no host name); HOST alone: with the\n"
    "                        bound port (IPv6 in brackets)\n"
    "  --rank-host HOST      IPv4 or IPv6 address ranks listen on for their ring\n"
    "                        (default 127.0.0.1)\n"
    "  --work-dir DIR        job files and rank logs (default /var/lib/fsdpd as root, else\n"
    "                        $XDG_STATE_HOME/fsdpd or ~/.local/state/fsdpd); one fsdpd's\n"
    "                        alone (fsdpd.lock there: a second one is refused)\n"
    "  --run-as USER         the user ranks run as; required when fsdpd runs as root\n"
    "  --token-file FILE     the node token sent to the coordinator\n"
    "  --user-token-file FILE\n"
    "                        rank logs need not it: a coordinator that checks tokens\n"
    "                        gives the Node service the key of its log tickets, and\n"
    "                        it takes those alone; under one that checks none, the\n"
    "                        token the Node service requires of direct callers (never\n"
    "                        fsdpctl, which sends nodes no token; the file may hold\n"
    "                        its digest, sha256:<64 hex>, instead)\n"
    "  --node-token-file FILE  also accepted there (no Node method is a node's)\n"
    "  --tls-ca FILE         check the coordinator's certificate against this CA\n"
    "  --tls-cert FILE, --tls-key FILE\n"
    "                        serve the Node service over TLS\n"
    "  --rank-program PATH   what a rank runs (default: fsdp-train beside fsdpd)\n"
    "  --metrics-listen ADDR serve Prometheus metrics at http://ADDR/metrics (IPV4:PORT\n"
    "                        or [IPV6]:PORT, e.g. 0.0.0.0:9102 or [::]:9102; default: none)\n"
    "  --grace SECONDS       SIGTERM -> SIGKILL for ranks: on SIGTERM a rank stops at its\n"
    "                        next step boundary and checkpoints, within this (default 30)\n"
    "  --refused-timeout SECONDS\n"
    "                        a first registration the coordinator keeps refusing (a token\n"
    "                        or name it does not take) ends fsdpd, exit 78, after this\n"
    "                        long, asked again each second till then (default 60; 0: at\n"
    "                        the first refusal)\n"
    "Exit status: 0 after SIGTERM or SIGINT, 1 when it cannot start, 2 on bad usage, 78 when\n"
    "the coordinator refused its first registration for --refused-timeout.\n");
}

/* ---- the loop's callbacks --------------------------------------------------------- */

static void fsdpd_publish(fsdpd_t *D) {
  uint8_t *buf;
  size_t len;
  if (ranks_pack(D->ranks, &buf, &len)) {
    LOG_ERROR("fsdpd", "%s", err_msg());
    return;
  }
  if (agent_publish(D->agent, buf, len)) LOG_ERROR("fsdpd", "%s", err_msg());
  free(buf);
}

static void fsdpd_publish_cb(uv_timer_t *t) {
  fsdpd_t *D = t->data;
  if (ranks_dirty(D->ranks)) fsdpd_publish(D);
}

static void fsdpd_registered_cb(void *arg, const char *node_id, const uint8_t *log_key,
                                size_t log_key_len) {
  fsdpd_t *D = arg;
  ranks_set_node_id(D->ranks, node_id);
  logs_set_identity(D->logs, node_id, log_key, log_key_len);
}

static void fsdpd_stop(fsdpd_t *D);

/* The first registration was refused: nothing can have run (ranks come
 * only from a registered session), and the operator should see fsdpd fail
 * (systemctl status, a pod's restarts) rather than a node that never
 * appears. Once registered, the agent keeps asking instead. */
static void fsdpd_refused_cb(void *arg, const char *why) {
  fsdpd_t *D = arg;
  if (D->stopping) return;
  LOG_ERROR("fsdpd", "the coordinator at %s refuses node %s: %s; fix that and start fsdpd again "
            "(exit status %d)", D->coordinator, D->name, why, FSDPD_EXIT_REFUSED);
  D->exit_status = FSDPD_EXIT_REFUSED;
  fsdpd_stop(D);
}

/* Refused ALREADY_EXISTS once registered: another fsdpd (a cloned host
 * name, a second daemon started by hand) registered as this node while this
 * one's heartbeat was between calls. The coordinator took this node's ranks
 * for gone then and failed their jobs over; left running they would hold
 * their devices and write for attempts no one will commit. They are
 * stopped; fsdpd keeps asking, and registers again if the other goes. */
static void fsdpd_superseded_cb(void *arg, const char *why) {
  fsdpd_t *D = arg;
  if (D->stopping) return;
  LOG_ERROR("fsdpd", "another fsdpd registered as node %s at %s (%s): this one's ranks are no "
            "longer the coordinator's and are stopped; give each node's fsdpd its own --name",
            D->name, D->coordinator, why);
  ranks_kill_all(D->ranks, "another fsdpd registered under this node's name", RANKS_NO_GRACE_S);
  fsdpd_publish(D);
}

/* The coordinator answered: the ranks' lease is renewed (ranks_lease), as
 * long as ranks run (a stop's last checkpoints included). */
static void fsdpd_lease_cb(void *arg, uint64_t until_ns, int registered) {
  fsdpd_t *D = arg;
  if (D->ranks) ranks_lease(D->ranks, until_ns, registered);
}

/* The coordinator has been silent past the fence it gave: it declared this
 * node dead and runs (or will run) its jobs elsewhere. The ranks stop now,
 * writing nothing (no grace: a checkpoint would land beside the live
 * attempt's); fsdpd keeps asking, and registers again without them. */
static void fsdpd_fence_cb(void *arg, const char *why) {
  fsdpd_t *D = arg;
  if (D->stopping) return;
  LOG_ERROR("fsdpd", "%s: this node's ranks are stopped; their jobs go on elsewhere from their "
            "last checkpoint", why);
  ranks_fence(D->ranks, why); /* reported as fenced: no restart of their jobs is spent */
  fsdpd_publish(D);
}

static void fsdpd_reply_cb(void *arg, const Fsdp__V1__HeartbeatReply *rep) {
  fsdpd_t *D = arg;
  for (size_t i = 0; i < rep->n_kills; i++) ranks_kill(D->ranks, rep->kills[i]);
  for (size_t i = 0; i < rep->n_assignments; i++) ranks_assign(D->ranks, rep->assignments[i]);
  fsdpd_publish(D); /* the coordinator sees the new ranks in the very next heartbeat */
}

static void fsdpd_metrics_cb(metrics_buf_t *b, void *arg) {
  const fsdpd_t *D = arg;
  if (D->ranks) ranks_metrics(D->ranks, b);
  if (!D->agent) return;
  int up;
  uint64_t refusals;
  agent_health(D->agent, &up, &refusals);
  metrics_family(b, "fsdp_node_coordinator_up", "gauge",
                 "1 when the coordinator answered this node's last call (registration or "
                 "heartbeat), else 0.");
  metrics_sample(b, "fsdp_node_coordinator_up", NULL, up);
  metrics_family(b, "fsdp_node_coordinator_refusals_total", "counter",
                 "Calls the coordinator refused for this node's token or name (an expired or "
                 "rotated token, another fsdpd under its name).");
  metrics_sample(b, "fsdp_node_coordinator_refusals_total", NULL, (double)refusals);
}

static void fsdpd_close_all(fsdpd_t *D) {
  uv_close((uv_handle_t *)&D->sigint, NULL);
  uv_close((uv_handle_t *)&D->sigterm, NULL);
  uv_close((uv_handle_t *)&D->publish, NULL);
  uv_close((uv_handle_t *)&D->shutdown, NULL);
  metrics_server_stop(D->metrics); /* before the ranks it reads go */
  D->metrics = NULL;
  if (D->server) rpc_server_destroy(D->server), D->server = NULL; /* ends the log streams */
  ranks_destroy(D->ranks);
  D->ranks = NULL;
}

static void fsdpd_shutdown_cb(uv_timer_t *t) {
  fsdpd_t *D = t->data;
  if (!ranks_idle(D->ranks) && uv_now(&D->loop) < D->shutdown_deadline) return;
  if (ranks_measuring(D->ranks)) return; /* back, or given up, within 10 s */
  uv_timer_stop(t);
  D->exit_now = ranks_measures_hung() > 0;
  D->ranks_done = ranks_idle(D->ranks);
  fsdpd_close_all(D); /* the loop ends once the handles are closed and the work is back */
  if (D->exit_now) uv_stop(&D->loop); /* that work is never back */
}

static void fsdpd_signal_cb(uv_signal_t *h, int sig) {
  fsdpd_t *D = h->data;
  if (D->stopping) {
    LOG_WARN("fsdpd", "got %s again: already stopping", strsignal(sig));
    return;
  }
  LOG_INFO("fsdpd", "got %s: stopping every rank (SIGTERM, SIGKILL after %.1f s), then exiting",
           strsignal(sig), D->grace_s);
  fsdpd_stop(D);
}

/* Every rank stopped (SIGTERM, SIGKILL after the grace), their exits
 * reported, then the loop ends. */
static void fsdpd_stop(fsdpd_t *D) {
  D->stopping = 1;
  uint64_t now = uv_now(&D->loop);
  D->shutdown_deadline = now + (uint64_t)((D->grace_s + SHUTDOWN_REPORTS_S) * 1000.0);
  ranks_stop_all(D->ranks, D->grace_s, D->shutdown_deadline);
  uv_timer_start(&D->shutdown, fsdpd_shutdown_cb, 0, SHUTDOWN_POLL_MS);
}

/* ---- options -------------------------------------------------------------------- */

static int bad(const char *opt, const char *fmt, const char *val) {
  fprintf(stderr, "fsdpd: %s: ", opt);
  fprintf(stderr, fmt, val);
  fprintf(stderr, " (fsdpd --help)\n");
  return 2;
}

/* The default work dir (see usage). */
static int fsdpd_default_workdir(fsdpd_t *D) {
  const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
  int n;
  if (geteuid() == 0) n = snprintf(D->workdir_buf, sizeof D->workdir_buf, "/var/lib/fsdpd");
  else if (xdg && *xdg) n = snprintf(D->workdir_buf, sizeof D->workdir_buf, "%s/fsdpd", xdg);
  else if (home && *home) n = snprintf(D->workdir_buf, sizeof D->workdir_buf, "%s/.local/state/fsdpd", home);
  else return bad("--work-dir", "%s", "no default without HOME; give one");
  if (n < 0 || (size_t)n >= sizeof D->workdir_buf) return bad("--work-dir", "%s", "default path too long");
  D->work_dir = D->workdir_buf;
  return 0;
}

/* fsdp-train beside our own binary. */
static int fsdpd_default_program(fsdpd_t *D) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return bad("--rank-program", "%s", "cannot find fsdpd's own path; give one");
  self[n] = 0;
  char *slash = strrchr(self, '/');
  *slash = 0;
  if (snprintf(D->program_buf, sizeof D->program_buf, "%s/fsdp-train", self) >= (int)sizeof D->program_buf)
    return bad("--rank-program", "%s", "default path too long");
  D->rank_program = D->program_buf;
  return 0;
}

static int fsdpd_options(fsdpd_t *D, int argc, char **argv, int *as_user, unsigned *uid, unsigned *gid) {
  enum { O_COORD = 256, O_DEVICES, O_NAME, O_LISTEN, O_RANKHOST, O_WORKDIR, O_RUNAS, O_TOKEN,
         O_UTOKEN, O_NTOKEN, O_CA, O_CERT, O_KEY, O_PROGRAM, O_GRACE, O_METRICS, O_REFUSED, O_ADVERTISE,
         O_INSECURE, O_HELP };
  static const struct option opts[] = {
      {"coordinator", required_argument, NULL, O_COORD}, {"devices", required_argument, NULL, O_DEVICES},
      {"name", required_argument, NULL, O_NAME}, {"listen", required_argument, NULL, O_LISTEN},
      {"rank-host", required_argument, NULL, O_RANKHOST}, {"work-dir", required_argument, NULL, O_WORKDIR},
      {"run-as", required_argument, NULL, O_RUNAS}, {"token-file", required_argument, NULL, O_TOKEN},
      {"user-token-file", required_argument, NULL, O_UTOKEN},
      {"node-token-file", required_argument, NULL, O_NTOKEN}, {"tls-ca", required_argument, NULL, O_CA},
      {"tls-cert", required_argument, NULL, O_CERT}, {"tls-key", required_argument, NULL, O_KEY},
      {"rank-program", required_argument, NULL, O_PROGRAM}, {"grace", required_argument, NULL, O_GRACE},
      {"metrics-listen", required_argument, NULL, O_METRICS},
      {"advertise", required_argument, NULL, O_ADVERTISE},
      {"refused-timeout", required_argument, NULL, O_REFUSED},
      {"insecure", no_argument, NULL, O_INSECURE},
      {"help", no_argument, NULL, O_HELP}, {NULL, 0, NULL, 0}};
  int ch;
  char *end;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (ch) {
    case O_COORD: D->coordinator = optarg; break;
    case O_DEVICES: D->devices = optarg; break;
    case O_NAME: D->name = optarg; break;
    case O_LISTEN: D->listen = optarg; break;
    case O_RANKHOST: D->rank_host = optarg; break;
    case O_WORKDIR: D->work_dir = optarg; break;
    case O_RUNAS: D->run_as = optarg; break;
    case O_TOKEN: D->token_file = optarg; break;
    case O_UTOKEN: D->user_token_file = optarg; break;
    case O_INSECURE: D->insecure = 1; break;
    case O_NTOKEN: D->node_token_file = optarg; break;
    case O_CA: D->tls_ca = optarg; break;
    case O_CERT: D->tls_cert = optarg; break;
    case O_KEY: D->tls_key = optarg; break;
    case O_PROGRAM: D->rank_program = optarg; break;
    case O_METRICS: D->metrics_listen = optarg; break;
    case O_ADVERTISE: D->advertise = optarg; break;
    case O_GRACE:
      D->grace_s = strtod(optarg, &end);
      if (end == optarg || *end || !(D->grace_s >= 0 && D->grace_s <= 3600))
        return bad("--grace", "\"%s\" is not a number of seconds from 0 to 3600", optarg);
      break;
    case O_REFUSED:
      D->refused_s = strtod(optarg, &end);
      if (end == optarg || *end || !(D->refused_s >= 0 && D->refused_s <= 86400))
        return bad("--refused-timeout", "\"%s\" is not a number of seconds from 0 to 86400", optarg);
      break;
    case O_HELP: usage(stdout); exit(0);
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) return bad("arguments", "unexpected \"%s\"; every option has a --name", argv[optind]);
  if (!D->coordinator) D->coordinator = getenv("FSDP_COORDINATOR");
  if (!D->coordinator || !*D->coordinator)
    return bad("--coordinator", "%s", "required (or FSDP_COORDINATOR): the coordinator's host:port");
  if (rpc_target_check(D->coordinator)) return bad("--coordinator (or FSDP_COORDINATOR)", "%s", err_msg());
  if (D->advertise) { /* what clients dial: HOST:PORT with a real port, or HOST alone */
    const char *a = D->advertise, *colon = strrchr(a, ':');
    const size_t n = strlen(a);
    const int bracketed = a[0] == '[', host_only = !colon || (bracketed && a[n - 1] == ']');
    const size_t hl = host_only ? n : (size_t)(colon - a); /* the host's length */
    char *pend = NULL;
    const long port = host_only ? 1 : strtol(colon + 1, &pend, 10);
    /* an IPv6 host in brackets ([fd00::5]), so that its last colon is not a port's */
    const int host_ok = bracketed ? hl > 2 && a[hl - 1] == ']' && !memchr(a + 1, '[', hl - 1)
                                  : hl > 0 && !memchr(a, ':', hl) && !memchr(a, ']', hl);
    if (!host_ok || (!host_only && (!colon[1] || *pend || port < 1 || port > 65535)) ||
        hl + sizeof ":65535" > sizeof D->address)
      return bad("--advertise", "\"%s\" is neither HOST nor HOST:PORT with a port from 1 to "
                 "65535 (an IPv6 address in brackets)", a);
    if (host_only && !strncmp(D->listen, "unix:", 5))
      return bad("--advertise", "\"%s\" has no port, and a unix: --listen has none to add",
                 a);
    D->advertise_host = host_only;
  }
  /* the Node service (every rank's log) open beyond loopback: only when
   * the operator says so (a unit started before its tokens were set up) */
  if (!D->token_file && !D->user_token_file && !D->insecure && !rpc_addr_is_local(D->listen))
    return bad("--listen", "%s without tokens: anyone who can reach it could read every rank's "
               "log; give --token-file (the coordinator's node token: its log tickets then guard "
               "the logs, docs/OPERATIONS.md), listen on 127.0.0.1, or pass --insecure on a "
               "closed, trusted network", D->listen);
  if (D->node_token_file && !D->user_token_file)
    return bad("--node-token-file", "%s", "goes with --user-token-file, which the Node service "
               "requires of its callers");
  if (!D->tls_cert != !D->tls_key)
    return bad(D->tls_cert ? "--tls-key" : "--tls-cert", "%s", "TLS needs both --tls-cert and --tls-key");
  /* who the ranks run as: never root */
  *as_user = 0;
  if (D->run_as) {
    struct passwd *pw = getpwnam(D->run_as);
    if (!pw) return bad("--run-as", "no user \"%s\" on this node", D->run_as);
    if (pw->pw_uid == 0)
      return bad("--run-as", "\"%s\" is root; ranks never run as root: name an unprivileged user", D->run_as);
    if (geteuid() != 0 && pw->pw_uid != geteuid())
      return bad("--run-as", "running ranks as \"%s\" needs fsdpd to run as root", D->run_as);
    *as_user = geteuid() == 0;
    *uid = pw->pw_uid;
    *gid = pw->pw_gid;
    /* not root's (fsdpd's): a rank that writes a cache or a config under
     * $HOME would try /root */
    snprintf(D->user_vars[0], sizeof D->user_vars[0], "HOME=%s", pw->pw_dir);
    snprintf(D->user_vars[1], sizeof D->user_vars[1], "USER=%s", pw->pw_name);
    snprintf(D->user_vars[2], sizeof D->user_vars[2], "LOGNAME=%s", pw->pw_name);
    for (int k = 0; k < 3; k++) D->user_env[k] = D->user_vars[k];
  } else if (geteuid() == 0) {
    fprintf(stderr, "fsdpd: --run-as: required when fsdpd runs as root, so that ranks never run as "
                    "root; give an unprivileged user (e.g. --run-as nobody, or a dedicated account)\n");
    return 2;
  }
  if (!D->work_dir && fsdpd_default_workdir(D)) return 2;
  if (!D->rank_program && fsdpd_default_program(D)) return 2;
  if (access(D->rank_program, X_OK))
    return bad("--rank-program", "%s is not an executable file", D->rank_program);
  return 0;
}

/* ---- the GPUs a rank can use ---------------------------------------------------- */

#define FSDPD_PROBE_S 60 /* loading CUDA and NCCL can take seconds on a cold node */

typedef struct fsdpd_probe {
  int done, late;
  int64_t status;
  int term_signal;
  uv_timer_t timer;
  supervise_t *set;
} fsdpd_probe_t;

static void fsdpd_probe_exit(supervise_t *s, void *arg, int64_t status, int term_signal) {
  (void)s;
  fsdpd_probe_t *p = arg;
  p->done = 1, p->status = status, p->term_signal = term_signal;
  uv_timer_stop(&p->timer);
}

static void fsdpd_probe_late(uv_timer_t *t) {
  fsdpd_probe_t *p = t->data;
  p->late = 1;
  supervise_stop(p->set, 0);
}

/* Whether the ranks this fsdpd starts can use the node's GPUs: the rank
 * program's --probe-device cuda, run as the ranks run (their user, fsdpd's
 * environment) with the same supervision, within FSDPD_PROBE_S. A driver
 * that lists GPUs says nothing of the CUDA plugin, cuBLASLt or NCCL a rank
 * needs: without this, a node would offer GPUs on which every job fails.
 * 0, or an error with the probe's own last words. */
static int fsdpd_probe_gpus(const fsdpd_t *D, int as_user, unsigned uid, unsigned gid) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  FILE *out = tmpfile();
  supervise_t *s = NULL;
  const supervise_opts_t so = {.out = out, .err = out};
  fsdpd_probe_t p = {0};
  char *argv[] = {(char *)D->rank_program, "--probe-device", "cuda", NULL};
  const supervise_child_opts_t co = {.argv = argv, .env = as_user ? D->user_env : NULL, .cwd = "/",
                                     .as_user = as_user, .uid = uid, .gid = gid,
                                     .exit_cb = fsdpd_probe_exit, .arg = &p};
  int rc = out ? supervise_create(&s, &loop, &so)
               : err_set_errno(FSDP_EIO, errno, "probing the GPUs: a temporary file");
  uv_timer_init(&loop, &p.timer);
  p.timer.data = &p;
  p.set = s;
  if (!rc && !(rc = supervise_spawn(s, &co, NULL))) {
    uv_timer_start(&p.timer, fsdpd_probe_late, FSDPD_PROBE_S * 1000, 0);
    uv_run(&loop, UV_RUN_DEFAULT); /* until it exits (killed when late) */
  }
  uv_close((uv_handle_t *)&p.timer, NULL);
  if (s) supervise_destroy(s);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  if (!rc && !(p.done && !p.term_signal && p.status == 0)) {
    char text[2048] = ""; /* the end of what it said: its last line is the verdict */
    size_t n = 0;
    if (out && !fseek(out, 0, SEEK_END)) {
      const long size = ftell(out);
      if (size > 0 && !fseek(out, size > (long)sizeof text - 1 ? size - (long)sizeof text + 1 : 0,
                             SEEK_SET))
        n = fread(text, 1, sizeof text - 1, out);
    }
    text[n] = 0;
    while (n && text[n - 1] == '\n') text[--n] = 0;
    const char *nl = strrchr(text, '\n'), *last = nl ? nl + 1 : text;
    char how[64];
    if (p.term_signal) snprintf(how, sizeof how, "killed by signal %d", p.term_signal);
    else snprintf(how, sizeof how, "exit %lld", (long long)p.status);
    rc = p.late ? err_set(FSDP_ETIMEDOUT, "%s --probe-device cuda did not answer within %d s",
                          D->rank_program, FSDPD_PROBE_S)
                : err_set(FSDP_EUNSUPPORTED, "the GPUs the driver lists cannot be used by ranks "
                          "here: %s --probe-device cuda: %s (%s)", D->rank_program,
                          last[0] ? last : "it said nothing", how);
  }
  if (out) fclose(out);
  return rc;
}

/* ---- descriptors ----------------------------------------------------------------- */

#define FSDPD_NOFILE_WANT 4096 /* below this a busy node may run out: said at start */

/* Raises the soft limit on open files to the hard one, as many daemons do:
 * every rank's listener, report channel and log, every gRPC connection and
 * log stream takes one, and the usual soft default (1024) is soon reached.
 * Ranks inherit it (they use epoll and poll, never select). Logs what it got. */
static void fsdpd_raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl)) {
    LOG_WARN("fsdpd", "cannot read the limit on open files: %s", strerror(errno));
    return;
  }
  const unsigned long long was = (unsigned long long)rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl)) {
      LOG_WARN("fsdpd", "cannot raise the limit on open files from %llu to its hard limit %llu: %s",
               was, (unsigned long long)rl.rlim_max, strerror(errno));
      rl.rlim_cur = (rlim_t)was;
    }
  }
  const unsigned long long now = (unsigned long long)rl.rlim_cur;
  if (now < FSDPD_NOFILE_WANT)
    LOG_WARN("fsdpd", "at most %llu open files (hard limit %llu): too few for a busy node; raise "
             "it (systemd: LimitNOFILE=65536, as in deploy/systemd/fsdpd.service; else ulimit -n or prlimit --nofile)",
             now, (unsigned long long)rl.rlim_max);
  else if (now != was)
    LOG_INFO("fsdpd", "open files: at most %llu (soft limit raised from %llu to the hard limit)", now, was);
  else
    LOG_INFO("fsdpd", "open files: at most %llu", now);
}

/* ---- main ------------------------------------------------------------------------ */

int main(int argc, char **argv) {
  crash_install("fsdpd");
  /* nothing fsdpd was started with passes to its ranks (another user's,
   * with --run-as): a descriptor its parent left open to a secret */
  file_cloexec_inherited();
  /* a rank's ring secret is its attempt's, from its assignment, or none:
   * never one this daemon was started with */
  unsetenv(RING_SECRET_VAR);
  fsdpd_t D = {.devices = "auto", .listen = "127.0.0.1:0", .rank_host = "127.0.0.1", .grace_s = 30.0,
              .refused_s = 60.0};
  int as_user = 0;
  unsigned uid = 0, gid = 0;
  int rc = fsdpd_options(&D, argc, argv, &as_user, &uid, &gid);
  if (rc) return rc;
  if (!D.name) {
    if (gethostname(D.hostname, sizeof D.hostname - 1)) snprintf(D.hostname, sizeof D.hostname, "localhost");
    D.name = D.hostname;
  }
  /* what the coordinator would refuse at every registration, said once */
  if (!D.name[0] || text_plain("--name", D.name, TEXT_NODE_NAME_MAX)) {
    fprintf(stderr, "fsdpd: %s (fsdpd --help)\n", D.name[0] ? err_msg() : "--name: empty");
    return 2;
  }
  struct sockaddr_storage rank_addr;
  socklen_t rank_addr_len;
  if (netaddr_parse("--rank-host", D.rank_host, 0, &rank_addr, &rank_addr_len)) {
    fprintf(stderr, "fsdpd: %s\n", err_msg());
    return 2;
  }
  if (inventory_find(D.devices, &D.inv)) {
    fprintf(stderr, "fsdpd: --devices: %s\n", err_msg());
    return 2;
  }
  if (D.inv.count && !strcmp(D.inv.dev[0].kind, "cuda") && fsdpd_probe_gpus(&D, as_user, uid, gid)) {
    if (D.devices[0] && strcmp(D.devices, "auto")) {
      fprintf(stderr, "fsdpd: --devices %s: %s\n", D.devices, err_msg());
      return 2;
    }
    LOG_WARN("fsdpd", "--devices auto: %s; offering one CPU device instead", err_msg());
    if (inventory_find("cpu:1", &D.inv)) {
      fprintf(stderr, "fsdpd: --devices: %s\n", err_msg());
      return 2;
    }
  }
  /* the Node service has user methods alone: a user token file serves by itself */
  const rpc_server_opts_t so = {.addr = D.listen, .user_token_file = D.user_token_file,
                                .node_token_file = D.node_token_file, .user_only = 1,
                                .tls_cert_file = D.tls_cert, .tls_key_file = D.tls_key};
  const rpc_client_opts_t co = {.target = D.coordinator, .token_file = D.token_file, .tls_ca_file = D.tls_ca};
  int bad = rpc_server_check(&so);
  if (!bad) bad = rpc_client_check(&co);
  if (!bad && D.metrics_listen) bad = metrics_listen_check(D.metrics_listen);
  if (bad) {
    fprintf(stderr, "fsdpd: %s (fsdpd --help)\n", err_msg());
    /* the operator's to fix (2: the unit does not restart it), but for a
     * file not there yet (a secret a provisioner writes after boot): 1 */
    return bad == FSDP_ENOENT ? 1 : 2;
  }
  /* what it and its ranks write (its work directory and lock, job files,
   * logs, checkpoints) is never for every user of the host, whatever umask
   * it was started with (the units set 0027; a shell's is often 0022) */
  umask(umask(0) | 027);
  if (workdir_mkdirs(D.work_dir, 0755)) {
    fprintf(stderr, "fsdpd: --work-dir: %s\n", err_msg());
    return 1;
  }
  int lock_fd; /* held until the process ends */
  if (workdir_lock(D.work_dir, &lock_fd)) {
    fprintf(stderr, "fsdpd: %s\n", err_msg());
    return 2;
  }
  rpc_client_env(); /* before gRPC's first init, and any thread */
  /* Rendezvous calls wait on the pool, up to one per device at once; libuv's
   * default of 4 threads would serialise a larger node's rendezvous */
  if (!getenv("UV_THREADPOOL_SIZE")) {
    char n[16];
    snprintf(n, sizeof n, "%d", D.inv.count * 2 + 4 < 128 ? D.inv.count * 2 + 4 : 128);
    setenv("UV_THREADPOOL_SIZE", n, 1);
  }
  /* after the environment is set (the driver's threads may read it) */
  inventory_measure(&D.inv);
  signal(SIGPIPE, SIG_IGN); /* a closed socket is an error, not our death */
  fsdpd_raise_nofile();

  if (rpc_client_create(&D.client, &co) || rpc_client_create(&D.session, &co)) {
    fprintf(stderr, "fsdpd: %s\n", err_msg());
    return 1;
  }
  uv_loop_init(&D.loop);
  const ranks_opts_t ro = {.loop = &D.loop, .client = D.client, .inv = &D.inv, .work_dir = D.work_dir,
                           .rank_program = D.rank_program, .rank_host = D.rank_host, .as_user = as_user,
                           .uid = uid, .gid = gid, .user_env = D.user_env, .grace_s = D.grace_s};
  if (ranks_create(&D.ranks, &ro) || logs_create(&D.logs, &D.loop, D.work_dir, D.ranks) ||
      rpc_server_create(&D.server, &D.loop, &so) || logs_register(D.logs, D.server) ||
      rpc_server_start(D.server)) {
    fprintf(stderr, "fsdpd: %s\n", err_msg());
    return 1;
  }
  /* the registered address: the listen host, or our name when it listens on every address */
  const char *colon = strrchr(D.listen, ':');
  int hl = colon ? (int)(colon - D.listen) : (int)strlen(D.listen);
  int any = !strncmp(D.listen, "0.0.0.0", (size_t)hl) || !strncmp(D.listen, "[::]", (size_t)hl) || !hl;
  if (D.advertise_host)
    snprintf(D.address, sizeof D.address, "%s:%d", D.advertise, rpc_server_port(D.server));
  else if (D.advertise) snprintf(D.address, sizeof D.address, "%s", D.advertise);
  else if (!strncmp(D.listen, "unix:", 5)) snprintf(D.address, sizeof D.address, "%s", D.listen);
  else snprintf(D.address, sizeof D.address, "%.*s:%d", any ? (int)strlen(D.name) : hl,
                any ? D.name : D.listen, rpc_server_port(D.server));
  if (text_plain(D.advertise ? "--advertise" : "the Node service's address", D.address,
                 TEXT_NODE_ADDR_MAX)) {
    fprintf(stderr, "fsdpd: %s (fsdpd --help)\n", err_msg());
    return 2;
  }
  if (D.metrics_listen &&
      metrics_server_start(&D.metrics, &D.loop, D.metrics_listen, fsdpd_metrics_cb, &D)) {
    fprintf(stderr, "fsdpd: %s\n", err_msg());
    return 1;
  }
  if (D.metrics) LOG_INFO("fsdpd", "metrics on port %d", metrics_server_port(D.metrics));
  /* with a token, the coordinator checks tokens and hands this node the key
   * of the log tickets its Node service then requires */
  if (D.token_file) logs_expect_tickets(D.logs);
  if (!D.user_token_file && !D.token_file && !rpc_addr_is_local(D.listen)) /* --insecure */
    LOG_WARN("fsdpd", "no tokens (--insecure): anyone who can reach %s may read every rank's log",
             D.listen);
  LOG_INFO("fsdpd", "node %s: %d device(s) (%s), Node service on %s, coordinator %s, work dir %s, ranks run "
           "%s%s", D.name, D.inv.count, D.devices, D.address, D.coordinator, D.work_dir,
           as_user ? "as " : "as fsdpd's user", as_user ? D.run_as : "");
  for (int i = 0; i < D.inv.count; i++) {
    const inventory_device_t *d = &D.inv.dev[i];
    if (strcmp(d->kind, "cuda")) continue;
    if (d->free_error)
      LOG_WARN("fsdpd", "cuda:%d (%s): its free memory could not be measured with a CUDA context "
               "(%s, CUDA error %d); jobs are planned against its total, %.2f GiB, part of which "
               "a rank's context takes: a plan near it is refused as its ranks open", d->index,
               d->name, d->free_error == INVENTORY_CU_NOT_FOUND
                            ? "the driver lacks cuMemGetInfo and the primary context calls: update it"
                            : "another process holds it in exclusive-process mode?",
               d->free_error, (double)d->total / (1 << 30));
    else if (d->total - d->memory > INVENTORY_HELD_MAX)
      LOG_WARN("fsdpd", "cuda:%d (%s): %.2f GiB free of %.2f GiB with a CUDA context on it, more "
               "than a context takes: other processes held memory there for 4 s (see nvidia-smi); "
               "jobs are planned against that, and jobs that need it to place all their ranks "
               "are admitted against it: it is measured again while idle (FSDP_GPU_MEASURE_S)",
               d->index, d->name,
               (double)d->memory / (1 << 30), (double)d->total / (1 << 30));
    else
      LOG_INFO("fsdpd", "cuda:%d (%s): %.2f GiB free of %.2f GiB with a CUDA context on it; jobs "
               "are planned against that", d->index, d->name, (double)d->memory / (1 << 30),
               (double)d->total / (1 << 30));
  }

  uv_signal_t *sigs[2] = {&D.sigint, &D.sigterm};
  const int signums[2] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; i++) {
    uv_signal_init(&D.loop, sigs[i]);
    sigs[i]->data = &D;
    uv_signal_start(sigs[i], fsdpd_signal_cb, signums[i]);
  }
  uv_timer_init(&D.loop, &D.publish);
  uv_timer_init(&D.loop, &D.shutdown);
  D.publish.data = D.shutdown.data = &D;
  uv_timer_start(&D.publish, fsdpd_publish_cb, PUBLISH_MS, PUBLISH_MS);

  uint8_t *state = NULL; /* the devices, for the first registration */
  size_t state_len = 0;
  const agent_opts_t ao = {.loop = &D.loop, .client = D.session, .hostname = D.name, .address = D.address,
                           .version = FSDPD_VERSION, .registered_cb = fsdpd_registered_cb,
                           .refused_cb = fsdpd_refused_cb, .refused_exit_s = D.refused_s,
                           .superseded_cb = fsdpd_superseded_cb,
                           .fence_cb = fsdpd_fence_cb, .lease_cb = fsdpd_lease_cb,
                           .reply_cb = fsdpd_reply_cb, .arg = &D};
  agent_opts_t aos = ao;
  if (ranks_pack(D.ranks, &state, &state_len) ||
      (aos.state = state, aos.state_len = state_len, agent_start(&D.agent, &aos))) {
    fprintf(stderr, "fsdpd: %s\n", err_msg());
    return 1;
  }
  free(state);
  uv_run(&D.loop, UV_RUN_DEFAULT); /* until fsdpd_close_all after a signal */
  if (D.exit_now) { /* every rank is stopped, and reported unless the deadline passed first */
    LOG_WARN("fsdpd", "stopped, leaving a GPU measurement the driver never answered");
    agent_stop(D.agent, 1.0);
    fflush(NULL);
    _exit(D.exit_status);
  }

  /* every rank ended: the coordinator counts the node stopped, not dead
   * (which would fire its alert and fence its jobs) at its heartbeat timeout */
  if (D.ranks_done) {
    const int left = agent_leave(D.agent, D.client); /* the ranks' client: theirs are done */
    if (left && left != FSDP_ENOTFOUND)
      LOG_WARN("fsdpd", "could not tell the coordinator that node %s stopped (%s): it counts the "
               "node dead once its heartbeat timeout is over", D.name, err_msg());
    else if (!left)
      LOG_INFO("fsdpd", "told the coordinator that node %s stopped", D.name);
  }
  /* the session thread may sit in a heartbeat for up to its interval + 5 s
   * (the leave above answers a held one): waited for briefly; if it is still
   * inside its call, the process ends under it (nothing of the loop's is
   * left to clean) */
  int joined = agent_stop(D.agent, 1.0);
  if (joined) agent_destroy(D.agent);
  logs_destroy(D.logs);
  uv_run(&D.loop, UV_RUN_DEFAULT); /* close callbacks */
  LOG_INFO("fsdpd", "stopped");
  if (!joined) {
    fflush(NULL);
    _exit(D.exit_status);
  }
  uv_loop_close(&D.loop);
  rpc_client_destroy(D.session); /* the agent's thread is joined */
  rpc_client_destroy(D.client);
  return D.exit_status;
}

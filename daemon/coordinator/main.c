/* fsdp-coordinator: the cluster's one coordinator (daemon/coordinator/coord.h).
 * Options name files, never secrets: tokens are read from files. It needs no
 * privilege and says so when started as root. SIGTERM or SIGINT stops it
 * cleanly (calls in flight cancelled, the database closed); the nodes keep
 * their ranks running and re-register when it is back. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "daemon/common/crash.h"
#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/rpc.h"
#include "daemon/coordinator/coord.h"
#include "daemon/coordinator/store.h"

#define ROOTS_MAX 32

static void usage(FILE *f) {
  fprintf(f,
          "usage: fsdp-coordinator --db FILE --root DIR [--root DIR ...] [options]\n"
          "       fsdp-coordinator --db FILE --backup FILE\n"
          "       fsdp-coordinator --db FILE --restore BACKUP\n"
          "  --db FILE                  the cluster's state (SQLite; created if absent)\n"
          "  --root DIR                 a directory job paths (data, init_from, save,\n"
          "                             checkpoint_dir, resume_from) may lie in;\n"
          "                             relative job paths resolve against the first\n"
          "  --listen ADDR              where to serve (default 127.0.0.1:7070; port 0: any);\n"
          "                             beyond loopback only with tokens, or --insecure\n"
          "  --insecure                 serve beyond loopback without tokens: anyone who\n"
          "                             reaches the port submits jobs and registers nodes\n"
          "                             (a closed, trusted network only)\n"
          "  --user-token-file FILE     bearer token of users (fsdpctl); with --node-token-file,\n"
          "  --node-token-file FILE     every call needs one of the two (default: open); the\n"
          "                             node file holds one token for every node, or lines\n"
          "                             NAME TOKEN: a token per node (fsdpd --name), with which\n"
          "                             a node acts only as itself. Any token in these files\n"
          "                             may be given as its digest, sha256:<64 hex>. A token\n"
          "                             is 16 bytes at least (openssl rand -hex 32)\n"
          "  --operator-token-file FILE with the two above: the token of operators, who may\n"
          "                             also drain nodes (without it, users may)\n"
          "  --node-jwks-file FILE      Kubernetes: nodes may also show the projected service\n"
          "                             account token of fsdpd's pod, checked against these\n"
          "                             keys (kubectl get --raw /openid/v1/jwks); its\n"
          "                             kubernetes.io.node.name claim is the node's name.\n"
          "                             With --user-token-file; --node-token-file optional\n"
          "  --node-jwt-subject SUB     with it, required: fsdpd's service account,\n"
          "                             system:serviceaccount:NAMESPACE:NAME\n"
          "  --node-jwt-audience AUD    the audience the token must hold (fsdp-coordinator)\n"
          "  --node-jwt-issuer ISS      the issuer it must name (default: not checked)\n"
          "  --tls-cert FILE --tls-key FILE   serve TLS\n"
          "  --heartbeat-interval-ms N  how long a node's heartbeat is held (default 1000)\n"
          "  --heartbeat-timeout-ms N   a node silent this long is dead (default 5000; time\n"
          "                             the coordinator itself was held up is not counted,\n"
          "                             up to the restart grace of it)\n"
          "  --restart-grace-ms N       at start, how long nodes the database has alive get\n"
          "                             to register again before they are dead (its own\n"
          "                             stalls not counted; default 3 x the heartbeat\n"
          "                             timeout); also each node's fence: a node\n"
          "                             with no answer this long kills its ranks, and a dead\n"
          "                             node's jobs restart this + 1 s after its last call\n"
          "  --checkpoint-timeout-ms N  a checkpoint still missing a shard this long after its\n"
          "                             first is aborted (default 300000)\n"
          "  --restart-backoff-ms N     a job failing again within 10 min of its restart waits\n"
          "                             this before the next one, doubled at each more, at\n"
          "                             most 5 min (default 10000; 0: restart at once)\n"
          "  --max-pending-jobs N       a submit is refused while this many jobs wait to be\n"
          "                             placed (default 10000): one user's loop of submits\n"
          "                             cannot fill the database's disk\n"
          "  --sync normal|full         SQLite synchronous mode (default full: what was\n"
          "                             answered survives a power loss)\n"
          "  --metrics-listen ADDR      serve Prometheus metrics at http://ADDR/metrics\n"
          "                             (IPV4:PORT or [IPV6]:PORT, e.g. 0.0.0.0:9101 or\n"
          "                             [::]:9101; default: none)\n"
          "  --health-listen ADDR       serve gRPC health alone there, plaintext and without a\n"
          "                             token, for probes that cannot do TLS (kubelet's grpc:\n"
          "                             probe with --tls-cert on; default: none)\n"
          "  --stop-grace SECONDS       on SIGTERM, keep serving while jobs still run or nodes\n"
          "                             registered with it have not said they leave, up to\n"
          "                             this long, so that nodes stopped by the same signal\n"
          "                             (a batch allocation ending) report their ranks'\n"
          "                             checkpoints and exits, and leave, first (default 0:\n"
          "                             stop at once)\n"
          "  --event-retention-days N   audit events (the database's events table) older\n"
          "                             than this are removed (default 90; 0: kept forever)\n"
          "  --job-retention-days N     jobs that ended more than N days ago are removed from\n"
          "                             the database with their attempts, ranks, events and\n"
          "                             checkpoint records (never their files; default 0:\n"
          "                             kept forever)\n"
          "  --backup FILE              with --db only: copy the database into the new FILE\n"
          "                             and exit; safe while a coordinator runs on it (SQLite's\n"
          "                             online backup)\n"
          "  --restore BACKUP           with --db only, the coordinator stopped: replace the\n"
          "                             database with the backup BACKUP and exit, through\n"
          "                             SQLite, so the log (FILE-wal) a killed coordinator left\n"
          "                             is not replayed over it; then start the coordinator\n"
          "SIGHUP reads the token files again (a node's line added, a token rotated).\n"
          "exit status: 0 stopped by a signal, 1 failed, 2 bad option\n");
}

#define COMMIT_WAIT_S 20 /* a stop waits this long at most for commits on the pool (under
                          * the 30 s systemd and Kubernetes give before SIGKILL) */

static uv_signal_t sig_term, sig_int, sig_hup;
static uv_timer_t stop_wait;
static coord_t *coord;
static int stop_grace_s;         /* --stop-grace */
static uint64_t stop_signal_ms;  /* when the signal came (0: not stopping) */
static uint64_t stop_jobs_until; /* the wait for running jobs ends (the grace) */

static void stop_now(void) {
  coord_destroy(coord);
  coord = NULL;
  uv_close((uv_handle_t *)&sig_term, NULL);
  uv_close((uv_handle_t *)&sig_int, NULL);
  uv_close((uv_handle_t *)&sig_hup, NULL);
  uv_close((uv_handle_t *)&stop_wait, NULL);
}

/* What a stop waits for: running jobs and live nodes (only with
 * --stop-grace, for as long as it says) and checkpoint commits on the pool
 * (always, up to COMMIT_WAIT_S past the grace: a checkpoint whose every
 * shard is in is committed and its last report answered before the store
 * closes, also one whose last shard came near the grace's end). A node
 * stopped by the same signal says it leaves after its ranks' exits: a
 * coordinator gone by then (the job requeued, nothing else running) left it
 * counted dead at its heartbeat timeout, with "could not tell the
 * coordinator" in its log (under Slurm, on every scancel and requeue). */
static int stop_jobs(void) { return stop_grace_s ? coord_running_jobs(coord) : 0; }
static int stop_nodes(void) { return stop_grace_s ? coord_nodes_live(coord) : 0; }

static void stop_wait_cb(uv_timer_t *t) {
  const uint64_t now = uv_now(t->loop);
  const int running = stop_jobs(), nodes = stop_nodes(), commits = coord_commits_in_flight(coord);
  if ((running > 0 || nodes > 0) && now < stop_jobs_until) return;
  if (commits > 0 && now < stop_jobs_until + COMMIT_WAIT_S * 1000ull) return;
  const double after = (double)(now - stop_signal_ms) / 1e3;
  if (running > 0 || nodes > 0)
    LOG_WARN("coord", "--stop-grace of %d s over with %d job(s) still running and %d node(s) "
             "not left: stopping %.1f s after the signal", stop_grace_s, running > 0 ? running : 0,
             nodes, after);
  if (commits > 0)
    LOG_WARN("coord", "%d checkpoint commit(s) still running %.1f s after the signal: stopping "
             "(the next start commits them)", commits, after);
  if (running <= 0 && nodes <= 0 && !commits)
    LOG_INFO("coord", "nothing left to wait for: stopping %.1f s after the signal", after);
  stop_now();
}

static void on_signal(uv_signal_t *s, int signum) {
  const int running = stop_jobs(), nodes = stop_nodes(), commits = coord_commits_in_flight(coord);
  if (stop_signal_ms || (running <= 0 && nodes <= 0 && commits == 0)) {
    LOG_INFO("coord", "signal %d: stopping", signum);
    stop_now();
    return;
  }
  /* the nodes got the same signal (a batch system stopping its allocation):
   * their ranks checkpoint and report through this coordinator first, and
   * then they leave */
  const int wait = running > 0 || nodes > 0;
  stop_signal_ms = uv_now(s->loop);
  stop_jobs_until = stop_signal_ms + (wait ? (uint64_t)stop_grace_s * 1000 : 0);
  LOG_INFO("coord", "signal %d: stopping once %d running job(s) have stopped and %d node(s) have "
           "left (at most %d s) and no checkpoint commit runs (%d now; at most %d s more); a "
           "second signal stops now", signum, running > 0 ? running : 0, nodes,
           wait ? stop_grace_s : 0, commits, COMMIT_WAIT_S);
  uv_timer_start(&stop_wait, stop_wait_cb, 50, 50);
}

/* The token files, for SIGHUP's line (NULL: not given). */
static const char *token_files[3];

/* The first token file under systemd's credentials directory (LoadCredential
 * copies a file there once, as the service starts), or NULL. */
static const char *token_file_copied(void) {
  const char *cred = getenv("CREDENTIALS_DIRECTORY");
  const size_t n = cred ? strlen(cred) : 0;
  for (int i = 0; n && i < 3; i++)
    if (token_files[i] && !strncmp(token_files[i], cred, n) && token_files[i][n] == '/')
      return token_files[i];
  return NULL;
}

/* SIGHUP: the token files again (a node's line added, a token rotated). */
static void on_hup(uv_signal_t *s, int signum) {
  (void)s, (void)signum;
  if (!coord) return;
  const char *copy = token_file_copied();
  if (coord_reload_tokens(coord))
    LOG_WARN("coord", "SIGHUP: the tokens in use stay: %s", err_msg());
  else if (copy) /* the copy is what it was: a changed source needs a restart */
    LOG_INFO("coord", "SIGHUP: token files read again, but %s is systemd's copy of its "
             "LoadCredential= source, made when the service started: a changed source file "
             "takes `systemctl restart`, not a reload", copy);
  else
    LOG_INFO("coord", "SIGHUP: token files read again; calls from now on are checked against them");
}

/* A whole number of unit in [lo, hi] (the message names the option and the range). */
static int whole(const char *opt, const char *v, long lo, long hi, const char *unit, int *out) {
  char *end;
  long x = strtol(v, &end, 10);
  if (*v == '\0' || *end || x < lo || x > hi) {
    fprintf(stderr, "fsdp-coordinator: %s: '%s' is not a number of %s (%ld to %ld)\n", opt, v,
            unit, lo, hi);
    return -1;
  }
  *out = (int)x;
  return 0;
}

static int positive(const char *opt, const char *v, int *out) {
  return whole(opt, v, 1, 3600000, "milliseconds", out);
}

int main(int argc, char **argv) {
  crash_install("fsdp-coordinator");
  static const struct option longopts[] = {
      {"db", required_argument, 0, 'd'},          {"root", required_argument, 0, 'r'},
      {"listen", required_argument, 0, 'l'},      {"user-token-file", required_argument, 0, 'u'},
      {"node-token-file", required_argument, 0, 'n'}, {"tls-cert", required_argument, 0, 'c'},
      {"tls-key", required_argument, 0, 'k'},     {"heartbeat-interval-ms", required_argument, 0, 'i'},
      {"heartbeat-timeout-ms", required_argument, 0, 't'}, {"sync", required_argument, 0, 's'},
      {"checkpoint-timeout-ms", required_argument, 0, 'C'}, {"backup", required_argument, 0, 'b'},
      {"restart-backoff-ms", required_argument, 0, 'B'},
      {"max-pending-jobs", required_argument, 0, 'P'},
      {"restore", required_argument, 0, 'X'},
      {"metrics-listen", required_argument, 0, 'm'}, {"stop-grace", required_argument, 0, 'g'},
      {"event-retention-days", required_argument, 0, 'e'},
      {"job-retention-days", required_argument, 0, 'J'},
      {"operator-token-file", required_argument, 0, 'O'},
      {"health-listen", required_argument, 0, 'H'},
      {"restart-grace-ms", required_argument, 0, 'R'},
      {"node-jwks-file", required_argument, 0, 'W'}, {"node-jwt-subject", required_argument, 0, 'S'},
      {"node-jwt-audience", required_argument, 0, 'A'}, {"node-jwt-issuer", required_argument, 0, 'I'},
      {"insecure", no_argument, 0, 'N'},
      {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
  const char *roots[ROOTS_MAX];
  coord_opts_t o = {.listen = "127.0.0.1:7070", .roots = roots};
  const char *backup = NULL, *restore = NULL;
  int insecure = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (ch) {
    case 'd': o.db = optarg; break;
    case 'r':
      if (o.nroots == ROOTS_MAX) {
        fprintf(stderr, "fsdp-coordinator: --root: at most %d roots\n", ROOTS_MAX);
        return 2;
      }
      roots[o.nroots++] = optarg;
      break;
    case 'l': o.listen = optarg; break;
    case 'u': o.user_token_file = optarg; break;
    case 'n': o.node_token_file = optarg; break;
    case 'O': o.operator_token_file = optarg; break;
    case 'H': o.health_listen = optarg; break;
    case 'R': if (positive("--restart-grace-ms", optarg, &o.restart_grace_ms)) return 2; break;
    case 'W': o.node_jwks_file = optarg; break;
    case 'S': o.node_jwt_subject = optarg; break;
    case 'A': o.node_jwt_audience = optarg; break;
    case 'I': o.node_jwt_issuer = optarg; break;
    case 'c': o.tls_cert_file = optarg; break;
    case 'k': o.tls_key_file = optarg; break;
    case 'i': if (positive("--heartbeat-interval-ms", optarg, &o.heartbeat_interval_ms)) return 2; break;
    case 't': if (positive("--heartbeat-timeout-ms", optarg, &o.heartbeat_timeout_ms)) return 2; break;
    case 'C': if (positive("--checkpoint-timeout-ms", optarg, &o.checkpoint_timeout_ms)) return 2; break;
    case 'B':
      if (whole("--restart-backoff-ms", optarg, 0, COORD_BACKOFF_MAX_MS, "milliseconds",
                &o.restart_backoff_ms))
        return 2;
      if (!o.restart_backoff_ms) o.restart_backoff_ms = -1; /* none */
      break;
    case 'P': if (positive("--max-pending-jobs", optarg, &o.max_pending_jobs)) return 2; break;
    case 's':
      if (strcmp(optarg, "normal") && strcmp(optarg, "full")) {
        fprintf(stderr, "fsdp-coordinator: --sync: '%s'; normal or full\n", optarg);
        return 2;
      }
      o.sync_normal = !strcmp(optarg, "normal");
      break;
    case 'b': backup = optarg; break;
    case 'X': restore = optarg; break;
    case 'm': o.metrics_listen = optarg; break;
    case 'g': if (whole("--stop-grace", optarg, 0, 3600, "seconds", &stop_grace_s)) return 2; break;
    case 'e': /* 0: forever */
      if (whole("--event-retention-days", optarg, 0, 36500, "days", &o.event_retention_days)) return 2;
      if (!o.event_retention_days) o.event_retention_days = -1;
      break;
    case 'J':
      if (whole("--job-retention-days", optarg, 0, 36500, "days", &o.job_retention_days)) return 2;
      break;
    case 'N': insecure = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (backup && restore) {
    fprintf(stderr, "fsdp-coordinator: --backup and --restore: one at a time\n");
    return 2;
  }
  if (restore && o.db && optind == argc) {
    store_restore_info_t info;
    int version, had_wal, rc = store_restore(o.db, restore, &version, &had_wal, &info);
    if (rc) {
      fprintf(stderr, "fsdp-coordinator: %s\n", err_msg());
      return 1;
    }
    printf("fsdp-coordinator: %s restored from the backup %s (schema version %d)%s; start the "
           "coordinator on it\n", o.db, restore, version,
           had_wal ? ", replacing its state and the log (-wal) the last coordinator left" : "");
    /* what the backup lacks of what the replaced database had handed out:
     * the operator cleans up after it (OPERATIONS.md, Backups and upgrades) */
    if (info.report) fputs(info.report, stdout);
    if (info.known && !info.report)
      printf("fsdp-coordinator: nothing was handed out after this backup: no job, node, attempt, "
             "checkpoint or event is lost\n");
    printf("fsdp-coordinator: ids go on from job j-%lld, node n-%lld, event %lld%s\n",
           (long long)info.next_job, (long long)info.next_node, (long long)info.next_event,
           info.known ? "" : " (a gap: see above)");
    free(info.report);
    return 0;
  }
  if (backup && o.db && optind == argc) {
    int version, rc = store_backup(o.db, backup, &version);
    if (rc) {
      fprintf(stderr, "fsdp-coordinator: %s\n", err_msg());
      return 1;
    }
    printf("fsdp-coordinator: backup of %s (schema version %d) written to %s\n", o.db, version,
           backup);
    return 0;
  }
  if (optind < argc || !o.db || !o.nroots) {
    fprintf(stderr, "fsdp-coordinator: %s\n",
            optind < argc ? "unexpected arguments" : !o.db ? "--db FILE is required"
                                                            : "--root DIR is required (at least one)");
    usage(stderr);
    return 2;
  }
  for (int i = 0; i < o.nroots; i++) { /* else every submit fails later, as the user's error */
    struct stat st;
    const int bad = stat(roots[i], &st) ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (bad) {
      fprintf(stderr, "fsdp-coordinator: --root %s: %s; create it (owned by the service's user) "
              "or mount it before the coordinator starts\n", roots[i], strerror(bad));
      return 2;
    }
  }
  if (o.heartbeat_timeout_ms && o.heartbeat_interval_ms &&
      o.heartbeat_timeout_ms <= o.heartbeat_interval_ms) {
    fprintf(stderr, "fsdp-coordinator: --heartbeat-timeout-ms must exceed the interval\n");
    return 2;
  }
  if (!o.node_jwks_file && (o.node_jwt_subject || o.node_jwt_audience || o.node_jwt_issuer)) {
    fprintf(stderr, "fsdp-coordinator: --node-jwt-subject, --node-jwt-audience and "
            "--node-jwt-issuer go with --node-jwks-file\n");
    return 2;
  }
  if (geteuid() == 0)
    LOG_WARN("coord", "running as root: the coordinator needs no privilege; run it as its own user");
  /* open access is fine on loopback (one machine, the demo), not beyond it
   * unless the operator says so: a unit installed and started before its
   * tokens were set up must not serve the network open */
  if (!o.user_token_file && !rpc_addr_is_local(o.listen)) {
    if (!insecure) {
      fprintf(stderr, "fsdp-coordinator: --listen %s without tokens: anyone who can reach it "
              "could submit and cancel jobs and register nodes; give --user-token-file and "
              "--node-token-file (docs/OPERATIONS.md), listen on 127.0.0.1, or pass --insecure "
              "on a closed, trusted network\n", o.listen);
      return 2;
    }
    LOG_WARN("coord", "no tokens (--insecure): anyone who can reach %s may submit and cancel jobs "
             "and register nodes", o.listen);
  }
  if (coord_opts_check(&o)) { /* a bad option (2), not a failure to serve (1) */
    fprintf(stderr, "fsdp-coordinator: %s\n", err_msg());
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  /* its umask is left as it was started with: the ranks' user must read the
   * manifests it writes, and may be another user than its own with no
   * group in common (a root coordinator, ranks run as nobody); its unit
   * sets 0027, where both are fsdp */
  grpc_init();
  uv_loop_t loop;
  uv_loop_init(&loop);
  int rc = coord_create(&coord, &loop, &o);
  if (rc) {
    fprintf(stderr, "fsdp-coordinator: %s\n", err_msg());
    uv_loop_close(&loop);
    grpc_shutdown();
    return 1;
  }
  if (!strncmp(o.listen, "unix:", 5)) /* no port: scripts reading one find none */
    printf("fsdp-coordinator: serving on %s (database %s)\n", o.listen, o.db);
  else
    printf("fsdp-coordinator: serving on port %d (database %s)\n", coord_port(coord), o.db);
  if (o.metrics_listen) printf("fsdp-coordinator: metrics on port %d\n", coord_metrics_port(coord));
  fflush(stdout);
  uv_timer_init(&loop, &stop_wait);
  uv_signal_init(&loop, &sig_term);
  uv_signal_init(&loop, &sig_int);
  uv_signal_start(&sig_term, on_signal, SIGTERM);
  uv_signal_start(&sig_int, on_signal, SIGINT);
  uv_signal_init(&loop, &sig_hup);
  token_files[0] = o.user_token_file, token_files[1] = o.node_token_file;
  token_files[2] = o.operator_token_file;
  uv_signal_start(&sig_hup, on_hup, SIGHUP);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  grpc_shutdown();
  return 0;
}

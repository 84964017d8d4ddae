/* fsdp-launch: the local launcher. Starts the N rank processes of one job on
 * this machine and supervises them, until the control plane does this per node.
 *
 *   fsdp-launch -n N [--grace SECONDS] -- PROGRAM [ARGS...]
 *
 * Each rank gets, in its environment, FSDP_RANK, FSDP_WORLD_SIZE and FSDP_ADDRS
 * (one host:port per rank, comma-separated: where each rank listens), and its
 * own listening socket, already bound, as file descriptor 3 (FSDP_LISTEN_FD=3),
 * so no port can be taken between choosing it and using it. FSDP_RING_SECRET,
 * drawn for the run, is what each rank proves to its neighbours
 * (daemon/common/ring_secret.h): a process that reaches the ranks' ports
 * cannot join the ring.
 *
 * Supervision is supervise.h's (each rank in its own session, output lines
 * prefixed "[rank R] ", a rank's group killed when it exits); the policy is
 * this file's: when a rank fails (non-zero exit or a signal), or the launcher
 * gets SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session), the set
 * is stopped (SIGTERM to every rank's group, SIGKILL after the grace
 * period). Nothing outlives the launcher.
 * Exit status, for the scripts around it (a retry loop, a Slurm batch
 * script): 0 when every rank exited 0; 75 (JOB_EXIT_PREEMPTED) when every
 * rank exited 75, stopped when asked (run it again to go on); 2 on bad
 * usage, or when the first rank to fail exited 2 (it refused an option:
 * running it again changes nothing); 1 otherwise. */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/common/err.h"
#include "daemon/common/ring_secret.h"
#include "daemon/job/job.h" /* JOB_EXIT_PREEMPTED */
#include "daemon/node/supervise.h"

typedef struct launch launch_t;

typedef struct launch_rank {
  launch_t *L;
  int rank;
  int listen_fd;
  int64_t status;
  int term_signal;
} launch_rank_t;

struct launch {
  uv_loop_t loop;
  supervise_t *set;
  int n;
  launch_rank_t *ranks;
  int failed; /* first rank that failed, n for a signal, -1 if none */
  double grace_s;
  uv_signal_t sigs[3]; /* SIGINT, SIGTERM, SIGHUP */
  char secret_env[RING_SECRET_ENV_LEN]; /* the run's ring secret, for every rank */
};

static void launch_usage(FILE *f) {
  fprintf(f, "usage: fsdp-launch -n RANKS [--grace SECONDS] -- PROGRAM [ARGS...]\n"
             "Starts RANKS copies of PROGRAM on this machine as the ranks of one job and\n"
             "supervises them: when one fails, the others are stopped (SIGTERM, then SIGKILL\n"
             "after --grace seconds, default 5). Each rank's environment has FSDP_RANK,\n"
             "FSDP_WORLD_SIZE, FSDP_ADDRS and FSDP_LISTEN_FD=3 (its bound listening socket).\n"
             "SIGINT, SIGTERM or SIGHUP stops every rank. Exit status: 0 every rank done,\n"
             "75 every rank stopped when asked (run it again to go on), 2 bad usage or a\n"
             "refused option, 1 a rank failed.\n");
}

static void launch_stop(launch_t *L, const char *why) {
  if (supervise_stopping(L->set)) return;
  if (supervise_running(L->set))
    fprintf(stderr, "fsdp-launch: %s; stopping the other ranks (SIGTERM, SIGKILL after %.1f s)\n",
            why, L->grace_s);
  supervise_stop(L->set, L->grace_s);
}

static void launch_kill_cb(supervise_t *s, void *arg, int running) {
  launch_t *L = arg;
  (void)s;
  fprintf(stderr, "fsdp-launch: %d rank(s) still running after %.1f s: killing them\n", running,
          L->grace_s);
}

static void launch_exit_cb(supervise_t *s, void *arg, int64_t status, int term_signal) {
  launch_rank_t *R = arg;
  launch_t *L = R->L;
  (void)s;
  R->status = status;
  R->term_signal = term_signal;
  if ((status || term_signal) && !supervise_stopping(L->set)) {
    char why[128];
    if (term_signal)
      snprintf(why, sizeof why, "rank %d was killed by signal %d (%s)", R->rank, term_signal,
               strsignal(term_signal));
    else
      snprintf(why, sizeof why, "rank %d exited with status %lld", R->rank, (long long)status);
    L->failed = R->rank;
    launch_stop(L, why);
  }
}

static void launch_signal_cb(uv_signal_t *h, int sig) {
  launch_t *L = h->data;
  char why[64];
  snprintf(why, sizeof why, "got %s", strsignal(sig));
  if (L->failed < 0) L->failed = L->n; /* not a rank's fault, but a failure all the same */
  launch_stop(L, why);
}

/* The launcher's exit status from its ranks' (the header says what each
 * means): a stop every rank made when asked is not a crash, and a refused
 * option is not something a retry mends. */
static int launch_status(const launch_t *L, int stopped) {
  if (stopped == L->n) return JOB_EXIT_PREEMPTED;
  if (L->failed < 0) return 0;
  const launch_rank_t *F = L->failed < L->n ? &L->ranks[L->failed] : NULL;
  return F && !F->term_signal && F->status == 2 ? 2 : 1;
}

/* A listening TCP socket on 127.0.0.1 with a port the kernel picks. */
static int launch_listen(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64) ||
      getsockname(fd, (struct sockaddr *)&a, &al)) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

static int launch_spawn(launch_t *L, launch_rank_t *R, char **argv, const char *addrs) {
  char vrank[32], vworld[40], prefix[32];
  char *vaddrs = malloc(strlen(addrs) + 16);
  if (!vaddrs)
    return err_set(FSDP_ENOMEM, "out of memory for its environment (%zu bytes of addresses)",
                   strlen(addrs));
  snprintf(vrank, sizeof vrank, "FSDP_RANK=%d", R->rank);
  snprintf(vworld, sizeof vworld, "FSDP_WORLD_SIZE=%d", L->n);
  sprintf(vaddrs, "FSDP_ADDRS=%s", addrs);
  snprintf(prefix, sizeof prefix, "[rank %d] ", R->rank);
  char *env[] = {vrank, vworld, vaddrs, "FSDP_LISTEN_FD=3", L->secret_env, NULL};
  const supervise_child_opts_t o = {.argv = argv, .env = env, .fds = &R->listen_fd, .nfds = 1,
                                    .prefix = prefix, .exit_cb = launch_exit_cb, .arg = R};
  int rc = supervise_spawn(L->set, &o, NULL);
  free(vaddrs);
  return rc;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"ranks", required_argument, NULL, 'n'},
                                       {"grace", required_argument, NULL, 'g'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  launch_t L = {.failed = -1, .grace_s = 5.0};
  int ch;
  char *end;
  /* the reader of our output gone (`fsdp-launch ... | head`) is no reason to
   * die and take the ranks' work with us: the relay stops writing there and
   * says so (supervise_emit); libuv's spawn gives the ranks SIGPIPE back */
  signal(SIGPIPE, SIG_IGN);
  while ((ch = getopt_long(argc, argv, "+n:g:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'n':
      L.n = (int)strtol(optarg, &end, 10);
      if (*end || L.n < 1 || L.n > 1024) {
        fprintf(stderr, "fsdp-launch: -n: \"%s\" is not a number of ranks from 1 to 1024\n", optarg);
        return 2;
      }
      break;
    case 'g':
      L.grace_s = strtod(optarg, &end);
      if (*end || !(L.grace_s >= 0 && L.grace_s <= 3600)) {
        fprintf(stderr, "fsdp-launch: --grace: \"%s\" is not a number of seconds from 0 to 3600\n",
                optarg);
        return 2;
      }
      break;
    case 'h':
      launch_usage(stdout);
      return 0;
    default:
      launch_usage(stderr);
      return 2;
    }
  }
  if (!L.n || optind >= argc) {
    fprintf(stderr, "fsdp-launch: %s\n", !L.n ? "-n RANKS is required" : "no program to run after --");
    launch_usage(stderr);
    return 2;
  }
  char **cmd = argv + optind;

  L.ranks = calloc((size_t)L.n, sizeof *L.ranks);
  char *addrs = calloc((size_t)L.n, 24);
  if (!L.ranks || !addrs) {
    fprintf(stderr, "fsdp-launch: out of memory for %d ranks\n", L.n);
    return 1;
  }
  uint8_t secret[RING_SECRET_BYTES];
  if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret) {
    fprintf(stderr, "fsdp-launch: getrandom (the run's ring secret): %s\n", strerror(errno));
    return 1;
  }
  ring_secret_env(L.secret_env, secret);
  explicit_bzero(secret, sizeof secret);
  for (int r = 0; r < L.n; r++) {
    int port = 0;
    L.ranks[r] = (launch_rank_t){.L = &L, .rank = r, .listen_fd = launch_listen(&port)};
    if (L.ranks[r].listen_fd < 0) {
      fprintf(stderr, "fsdp-launch: cannot listen on 127.0.0.1 for rank %d: %s\n", r, strerror(errno));
      return 1;
    }
    sprintf(addrs + strlen(addrs), "%s127.0.0.1:%d", r ? "," : "", port);
  }

  uv_loop_init(&L.loop);
  const supervise_opts_t so = {.kill_cb = launch_kill_cb, .arg = &L};
  if (supervise_create(&L.set, &L.loop, &so)) {
    fprintf(stderr, "fsdp-launch: %s\n", err_msg());
    return 1;
  }
  /* unreferenced: the loop ends when the ranks are done, not when signals are */
  const int signums[3] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(&L.loop, &L.sigs[i]);
    L.sigs[i].data = &L;
    uv_signal_start(&L.sigs[i], launch_signal_cb, signums[i]);
    uv_unref((uv_handle_t *)&L.sigs[i]);
  }
  for (int r = 0; r < L.n && !supervise_stopping(L.set); r++) {
    if (launch_spawn(&L, &L.ranks[r], cmd, addrs)) {
      char why[1024];
      snprintf(why, sizeof why, "rank %d: %s", r, err_msg());
      L.failed = r;
      if (!supervise_running(L.set)) fprintf(stderr, "fsdp-launch: %s\n", why);
      launch_stop(&L, why); /* stops what started; nothing more is spawned */
    }
  }
  for (int r = 0; r < L.n; r++) close(L.ranks[r].listen_fd); /* the ranks hold them now */
  uv_run(&L.loop, UV_RUN_DEFAULT);
  for (int i = 0; i < 3; i++) uv_close((uv_handle_t *)&L.sigs[i], NULL);
  supervise_destroy(L.set);
  uv_run(&L.loop, UV_RUN_DEFAULT); /* the close callbacks */
  uv_loop_close(&L.loop);

  int stopped = 0;
  for (int r = 0; r < L.n; r++) {
    launch_rank_t *R = &L.ranks[r];
    if (R->term_signal)
      fprintf(stderr, "fsdp-launch: rank %d: killed by signal %d (%s)\n", r, R->term_signal,
              strsignal(R->term_signal));
    else if (R->status)
      fprintf(stderr, "fsdp-launch: rank %d: exit status %lld\n", r, (long long)R->status);
    stopped += !R->term_signal && R->status == JOB_EXIT_PREEMPTED;
  }
  const int rc = launch_status(&L, stopped);
  free(addrs);
  free(L.ranks);
  return rc;
}

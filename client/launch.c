/* fsdp-launch: the local launcher. Starts the N rank processes of one job on
 * this machine and supervises them, until the control plane does this per node.
 *
 *   fsdp-launch -n N [--grace SECONDS] -- PROGRAM [ARGS...]
 *
 * Each rank gets, in its environment, FSDP_RANK, FSDP_WORLD_SIZE and FSDP_ADDRS
 * (one host:port per rank, comma-separated: where each rank listens), and its
 * own listening socket, already bound, as file descriptor 3 (FSDP_LISTEN_FD=3),
 * so no port can be taken between choosing it and using it.
 *
 * Supervision: each rank runs in its own session (process group). The lines
 * it prints come out prefixed with "[rank R]". When a rank fails (non-zero exit
 * or a signal), or the launcher gets SIGINT or SIGTERM, every other rank's
 * group gets SIGTERM, and SIGKILL after the grace period; when a rank exits,
 * whatever it left in its group is killed. Nothing outlives the launcher.
 * Exit status: 0 when every rank exited 0, 1 when one failed, 2 on bad usage.
 *
 * Everything runs on one libuv loop: callbacks never block. */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

extern char **environ;

#define LAUNCH_LINE_MAX 4096

typedef struct launch launch_t;

/* One output stream of a rank, cut into lines for prefixing. */
typedef struct launch_stream {
  uv_pipe_t pipe;
  FILE *to;
  int rank;
  size_t len;
  char line[LAUNCH_LINE_MAX];
} launch_stream_t;

typedef struct launch_rank {
  launch_t *L;
  int rank;
  int listen_fd;
  uv_process_t proc;
  launch_stream_t out, err;
  int running;
  int64_t status;
  int term_signal;
} launch_rank_t;

struct launch {
  uv_loop_t loop;
  int n;
  launch_rank_t *ranks;
  int running;
  int stopping;
  int failed;          /* first rank that failed, -1 if none */
  double grace_s;
  uv_timer_t grace;
  uv_signal_t sigint, sigterm;
};

static void launch_usage(FILE *f) {
  fprintf(f, "usage: fsdp-launch -n RANKS [--grace SECONDS] -- PROGRAM [ARGS...]\n"
             "Starts RANKS copies of PROGRAM on this machine as the ranks of one job and\n"
             "supervises them: when one fails, the others are stopped (SIGTERM, then SIGKILL\n"
             "after --grace seconds, default 5). Each rank's environment has FSDP_RANK,\n"
             "FSDP_WORLD_SIZE, FSDP_ADDRS and FSDP_LISTEN_FD=3 (its bound listening socket).\n");
}

static void launch_flush_line(launch_stream_t *s) {
  fprintf(s->to, "[rank %d] %.*s\n", s->rank, (int)s->len, s->line);
  fflush(s->to);
  s->len = 0;
}

static void launch_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  static char slab[65536]; /* one loop thread, and read_cb consumes it at once */
  (void)suggested;
  *buf = uv_buf_init(slab, sizeof slab);
}

static void launch_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  launch_stream_t *s = st->data;
  if (nread < 0) { /* EOF or error: the last partial line, then close */
    if (s->len) launch_flush_line(s);
    uv_close((uv_handle_t *)st, NULL);
    return;
  }
  for (ssize_t i = 0; i < nread; i++) {
    char c = buf->base[i];
    if (c == '\n') {
      launch_flush_line(s);
    } else {
      s->line[s->len++] = c;
      if (s->len == sizeof s->line) launch_flush_line(s); /* an endless line: cut it */
    }
  }
}

/* Signals every rank's process group that is still running. */
static void launch_signal_all(launch_t *L, int sig) {
  for (int r = 0; r < L->n; r++)
    if (L->ranks[r].running) uv_kill(-L->ranks[r].proc.pid, sig);
}

static void launch_grace_cb(uv_timer_t *t) {
  launch_t *L = t->data;
  if (L->running) {
    fprintf(stderr, "fsdp-launch: %d rank(s) still running after %.1f s: killing them\n",
            L->running, L->grace_s);
    launch_signal_all(L, SIGKILL);
  }
}

static void launch_stop(launch_t *L, const char *why) {
  if (L->stopping) return;
  L->stopping = 1;
  if (L->running) {
    fprintf(stderr, "fsdp-launch: %s; stopping the other ranks (SIGTERM, SIGKILL after %.1f s)\n",
            why, L->grace_s);
    launch_signal_all(L, SIGTERM);
    uv_timer_start(&L->grace, launch_grace_cb, (uint64_t)(L->grace_s * 1000), 0);
  }
}

static void launch_close_loop_handles(launch_t *L) {
  uv_timer_stop(&L->grace);
  uv_close((uv_handle_t *)&L->grace, NULL);
  uv_close((uv_handle_t *)&L->sigint, NULL);
  uv_close((uv_handle_t *)&L->sigterm, NULL);
}

static void launch_exit_cb(uv_process_t *p, int64_t status, int term_signal) {
  launch_rank_t *R = p->data;
  launch_t *L = R->L;
  R->running = 0;
  R->status = status;
  R->term_signal = term_signal;
  L->running--;
  /* whatever the rank started in its session goes with it */
  uv_kill(-p->pid, SIGKILL);
  uv_close((uv_handle_t *)p, NULL);
  if ((status || term_signal) && !L->stopping) {
    char why[128];
    if (term_signal)
      snprintf(why, sizeof why, "rank %d was killed by signal %d (%s)", R->rank, term_signal,
               strsignal(term_signal));
    else
      snprintf(why, sizeof why, "rank %d exited with status %lld", R->rank, (long long)status);
    L->failed = R->rank;
    launch_stop(L, why);
  }
  if (!L->running) launch_close_loop_handles(L);
}

static void launch_signal_cb(uv_signal_t *h, int sig) {
  launch_t *L = h->data;
  char why[64];
  snprintf(why, sizeof why, "got %s", strsignal(sig));
  if (L->failed < 0) L->failed = L->n; /* not a rank's fault, but a failure all the same */
  launch_stop(L, why);
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
  size_t nenv = 0;
  while (environ[nenv]) nenv++;
  char **env = calloc(nenv + 5, sizeof *env);
  char vrank[32], vworld[40], vfd[32];
  char *vaddrs = malloc(strlen(addrs) + 16);
  if (!env || !vaddrs) {
    free(env);
    free(vaddrs);
    return UV_ENOMEM;
  }
  size_t k = 0;
  for (size_t i = 0; i < nenv; i++) /* ours replace any inherited values */
    if (strncmp(environ[i], "FSDP_RANK=", 10) && strncmp(environ[i], "FSDP_WORLD_SIZE=", 16) &&
        strncmp(environ[i], "FSDP_ADDRS=", 11) && strncmp(environ[i], "FSDP_LISTEN_FD=", 15))
      env[k++] = environ[i];
  snprintf(vrank, sizeof vrank, "FSDP_RANK=%d", R->rank);
  snprintf(vworld, sizeof vworld, "FSDP_WORLD_SIZE=%d", L->n);
  snprintf(vfd, sizeof vfd, "FSDP_LISTEN_FD=3");
  sprintf(vaddrs, "FSDP_ADDRS=%s", addrs);
  env[k++] = vrank;
  env[k++] = vworld;
  env[k++] = vaddrs;
  env[k++] = vfd;

  uv_stdio_container_t stdio[4];
  launch_stream_t *streams[2] = {&R->out, &R->err};
  for (int i = 0; i < 2; i++) {
    uv_pipe_init(&L->loop, &streams[i]->pipe, 0);
    streams[i]->pipe.data = streams[i];
    streams[i]->rank = R->rank;
    streams[i]->to = i ? stderr : stdout;
    stdio[1 + i].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1 + i].data.stream = (uv_stream_t *)&streams[i]->pipe;
  }
  stdio[0].flags = UV_IGNORE;
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = R->listen_fd;
  uv_process_options_t o = {
      .exit_cb = launch_exit_cb,
      .file = argv[0],
      .args = argv,
      .env = env,
      .flags = UV_PROCESS_DETACHED, /* its own session: its group can be signalled whole */
      .stdio_count = 4,
      .stdio = stdio,
  };
  R->proc.data = R;
  int rc = uv_spawn(&L->loop, &R->proc, &o);
  free(env);
  free(vaddrs);
  if (rc) {
    uv_close((uv_handle_t *)&R->out.pipe, NULL);
    uv_close((uv_handle_t *)&R->err.pipe, NULL);
    return rc;
  }
  R->running = 1;
  L->running++;
  uv_read_start((uv_stream_t *)&R->out.pipe, launch_alloc_cb, launch_read_cb);
  uv_read_start((uv_stream_t *)&R->err.pipe, launch_alloc_cb, launch_read_cb);
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"ranks", required_argument, NULL, 'n'},
                                       {"grace", required_argument, NULL, 'g'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  launch_t L = {.failed = -1, .grace_s = 5.0};
  int ch;
  char *end;
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
  if (!L.ranks || !addrs) return 1;
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
  uv_timer_init(&L.loop, &L.grace);
  L.grace.data = &L;
  uv_signal_init(&L.loop, &L.sigint);
  uv_signal_init(&L.loop, &L.sigterm);
  L.sigint.data = L.sigterm.data = &L;
  uv_signal_start(&L.sigint, launch_signal_cb, SIGINT);
  uv_signal_start(&L.sigterm, launch_signal_cb, SIGTERM);
  for (int r = 0; r < L.n && !L.stopping; r++) {
    int rc = launch_spawn(&L, &L.ranks[r], cmd, addrs);
    if (rc) {
      char why[256];
      snprintf(why, sizeof why, "cannot start rank %d (%s): %s", r, cmd[0], uv_strerror(rc));
      L.failed = r;
      if (!L.running) fprintf(stderr, "fsdp-launch: %s\n", why);
      launch_stop(&L, why); /* stops what started; nothing more is spawned */
      L.stopping = 1;
      if (!L.running) launch_close_loop_handles(&L);
    }
  }
  for (int r = 0; r < L.n; r++) close(L.ranks[r].listen_fd); /* the ranks hold them now */
  uv_run(&L.loop, UV_RUN_DEFAULT);
  uv_loop_close(&L.loop);

  int rc = 0;
  for (int r = 0; r < L.n; r++) {
    launch_rank_t *R = &L.ranks[r];
    if (R->term_signal) {
      fprintf(stderr, "fsdp-launch: rank %d: killed by signal %d (%s)\n", r, R->term_signal,
              strsignal(R->term_signal));
      rc = 1;
    } else if (R->status) {
      fprintf(stderr, "fsdp-launch: rank %d: exit status %lld\n", r, (long long)R->status);
      rc = 1;
    }
  }
  if (L.failed >= 0) rc = 1;
  free(addrs);
  free(L.ranks);
  return rc;
}

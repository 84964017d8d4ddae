/* supervise: children in their own sessions, their output relayed with a
 * prefix, their groups killed when they exit or are stopped (see supervise.h).
 *
 * Ownership: a child's memory belongs to the set from spawn until the last
 * of its three handles (process, stdout pipe, stderr pipe) is closed; the
 * set's memory until its timer is closed (supervise_destroy). Handles are
 * freed only in their close callbacks, as libuv requires. */
#include "supervise.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/shm_name.h"
#include "daemon/job/job.h" /* JOB_SUPERVISOR_PID_ENV */

extern char **environ;

#define SUPERVISE_FDS_MAX 16   /* descriptors handed down beyond stdio */
#define SUPERVISE_READ_BYTES 65536
/* Reads of what a child left in a pipe when it exits: its own writes are all
 * in the pipe by then (at most the pipe's size), but a descendant still dying
 * from the group's SIGKILL may write a little more; the bound keeps one that
 * does not die fast from holding the loop. */
#define SUPERVISE_DRAIN_READS 64

typedef struct supervise_child supervise_child_t;

/* One output stream of a child, cut into lines for prefixing. */
typedef struct supervise_stream {
  uv_pipe_t pipe;
  supervise_child_t *child;
  FILE *to;
  int eof;   /* the pipe ended (or failed): nothing more to read */
  size_t len;
  char line[SUPERVISE_LINE_MAX];
} supervise_stream_t;

struct supervise_child {
  supervise_t *set;
  uv_process_t proc;
  supervise_stream_t out, err;
  char *prefix;
  supervise_exit_cb exit_cb;
  void *arg;
  int open_handles;         /* freed when it reaches 0 */
  supervise_child_t *next;  /* in the set's list of running children */
};

struct supervise {
  uv_loop_t *loop;
  supervise_opts_t o;
  uv_timer_t grace;
  int stopping;
  int running;
  supervise_child_t *children; /* running ones */
  /* every read lands here: one loop thread, and each read is consumed in its callback */
  char buf[SUPERVISE_READ_BYTES];
};

/* ---- output relay ------------------------------------------------------ */

/* Relays the line held. A destination whose reader is gone (EPIPE: the
 * pipe fsdp-launch's output went into, `| head`, closed; SIGPIPE is
 * ignored) gets nothing more: its error indicator, which stdio keeps set,
 * marks it, so the first line to find it gone says so once, on stderr, and
 * the children run on, their lines to it read and dropped. Another error
 * (a full disk under a log file) loses the line and the next is tried. */
static void supervise_emit(supervise_stream_t *st) {
  FILE *to = st->to;
  const int len = (int)st->len;
  st->len = 0;
  if (ferror(to)) return; /* gone, said already */
  errno = 0;
  if (fprintf(to, "%s%.*s\n", st->child->prefix, len, st->line) >= 0 && fflush(to) == 0) return;
  if (errno != EPIPE) {
    clearerr(to);
    return;
  }
  /* where stderr is the one gone, this finds no reader either */
  fprintf(stderr, "%s: %s has no reader any more (EPIPE): the children's lines to it are "
          "dropped from now on; they run on\n", program_invocation_short_name,
          to == stdout ? "standard output" : to == stderr ? "standard error" : "an output");
}

/* Appends n bytes of output, relaying every line they complete. A line
 * longer than the buffer goes out in pieces of the buffer's size (a line of
 * exactly that size, newline next, still goes out whole). */
static void supervise_feed(supervise_stream_t *st, const char *p, size_t n) {
  while (n) {
    const char *nl = memchr(p, '\n', n);
    size_t take = nl ? (size_t)(nl - p) : n, room = sizeof st->line - st->len;
    if (take > room) { /* an over-long line: cut it where the buffer ends */
      memcpy(st->line + st->len, p, room);
      st->len += room;
      supervise_emit(st);
      p += room, n -= room;
      continue;
    }
    memcpy(st->line + st->len, p, take);
    st->len += take;
    p += take, n -= take;
    if (nl) {
      supervise_emit(st);
      p++, n--;
    }
  }
}

static void supervise_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  supervise_stream_t *st = h->data;
  (void)suggested;
  *buf = uv_buf_init(st->child->set->buf, sizeof st->child->set->buf);
}

static void supervise_read_cb(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf) {
  supervise_stream_t *st = h->data;
  if (nread > 0) {
    supervise_feed(st, buf->base, (size_t)nread);
  } else if (nread < 0) { /* EOF or a read error: the stream is over either way */
    st->eof = 1;
    uv_read_stop(h);
    if (st->len) supervise_emit(st);
  }
}

/* What a child left in a pipe when it exited, read now so that it is relayed
 * before the exit callback; then the partial last line, if any. */
static void supervise_drain(supervise_stream_t *st) {
  uv_os_fd_t fd;
  if (!st->eof && uv_fileno((const uv_handle_t *)&st->pipe, &fd) == 0) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); /* as libuv keeps it; never wait here */
    char *buf = st->child->set->buf;
    for (int i = 0; i < SUPERVISE_DRAIN_READS; i++) {
      ssize_t n = read(fd, buf, sizeof st->child->set->buf);
      if (n > 0) supervise_feed(st, buf, (size_t)n);
      else if (n < 0 && errno == EINTR) continue;
      else break; /* end of stream, nothing more now (EAGAIN), or an error */
    }
  }
  if (st->len) supervise_emit(st);
}

/* ---- children ---------------------------------------------------------- */

static void supervise_child_release(supervise_child_t *c) {
  if (--c->open_handles == 0) {
    free(c->prefix);
    free(c);
  }
}

static void supervise_proc_close_cb(uv_handle_t *h) { supervise_child_release(h->data); }

static void supervise_pipe_close_cb(uv_handle_t *h) {
  supervise_child_release(((supervise_stream_t *)h->data)->child);
}

static void supervise_child_close(supervise_child_t *c) {
  uv_close((uv_handle_t *)&c->proc, supervise_proc_close_cb);
  uv_close((uv_handle_t *)&c->out.pipe, supervise_pipe_close_cb);
  uv_close((uv_handle_t *)&c->err.pipe, supervise_pipe_close_cb);
}

static void supervise_signal_all(supervise_t *s, int sig) {
  for (supervise_child_t *c = s->children; c; c = c->next) uv_kill(-c->proc.pid, sig);
}

/* Removes the ring links (shm_name.h) that the exited child pid created and
 * no consumer mapped: a rank killed or failing mid-bootstrap would leave them
 * in /dev/shm for good. Only names of that exact pid; one short directory
 * read of a tmpfs, so the loop is not held. */
static void supervise_sweep_shm(int pid) {
  char prefix[48];
  int len = snprintf(prefix, sizeof prefix, SHM_NAME_RING_PREFIX "%d-", pid);
  DIR *d = opendir(SHM_NAME_DIR);
  if (!d) return; /* no /dev/shm: no links either */
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, (size_t)len) != 0) continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0)
      LOG_INFO("supervise", "removed " SHM_NAME_DIR "/%s, a ring link process %d left", e->d_name,
               pid);
    else if (errno != ENOENT)
      LOG_WARN("supervise", "cannot remove " SHM_NAME_DIR "/%s, a ring link process %d left (%s): "
               "remove it by hand", e->d_name, pid, strerror(errno));
  }
  closedir(d);
}

static void supervise_proc_exit_cb(uv_process_t *p, int64_t status, int term_signal) {
  supervise_child_t *c = p->data;
  supervise_t *s = c->set;
  /* whatever it started in its session goes with it; the group outlives its
   * leader's reaping while members are left, so its id is not reused yet */
  uv_kill(-p->pid, SIGKILL);
  supervise_drain(&c->out);
  supervise_drain(&c->err);
  supervise_sweep_shm(p->pid);
  for (supervise_child_t **pp = &s->children; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  if (--s->running == 0) uv_timer_stop(&s->grace);
  supervise_exit_cb cb = c->exit_cb;
  void *arg = c->arg;
  supervise_child_close(c);
  if (cb) cb(s, arg, status, term_signal); /* last: it may stop or destroy the set */
}

/* This process's environment with extra's entries added, each replacing an
 * inherited entry of its name: a malloc'd array of borrowed strings. */
static char **supervise_env(char *const *extra) {
  size_t ne = 0, nx = 0;
  while (environ[ne]) ne++;
  while (extra[nx]) nx++;
  char **env = calloc(ne + nx + 1, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < ne; i++) {
    int replaced = 0;
    for (size_t j = 0; j < nx && !replaced; j++) {
      const char *eq = strchr(extra[j], '=');
      size_t len = eq ? (size_t)(eq - extra[j]) : strlen(extra[j]);
      replaced = !strncmp(environ[i], extra[j], len) && environ[i][len] == '=';
    }
    if (!replaced) env[k++] = environ[i];
  }
  for (size_t j = 0; j < nx; j++) env[k++] = extra[j];
  return env;
}

int supervise_spawn(supervise_t *s, const supervise_child_opts_t *o, int *pid) {
  FSDP_ASSERT(o->argv && o->argv[0] && o->nfds >= 0 && o->nfds <= SUPERVISE_FDS_MAX);
  if (s->stopping)
    return err_set(FSDP_ECANCELED, "not starting %s: its set of processes is being stopped",
                   o->argv[0]);
  supervise_child_t *c = calloc(1, sizeof *c);
  char *prefix = strdup(o->prefix ? o->prefix : "");
  /* the child learns who supervises it: fsdp-train dies with it (its
   * PR_SET_PDEATHSIG), so a launcher or fsdpd killed outright leaves no
   * rank training on, holding its device */
  char me[48];
  snprintf(me, sizeof me, JOB_SUPERVISOR_PID_ENV "=%d", (int)getpid());
  size_t nx = 0;
  while (o->env && o->env[nx]) nx++;
  char **extra = calloc(nx + 2, sizeof *extra);
  if (extra) {
    for (size_t i = 0; i < nx; i++) extra[i] = o->env[i];
    extra[nx] = me;
  }
  char **env = extra ? supervise_env(extra) : NULL;
  free(extra);
  if (!c || !prefix || !env) {
    free(c), free(prefix), free(env);
    return err_set(FSDP_ENOMEM, "not starting %s: out of memory for its environment and relay",
                   o->argv[0]);
  }
  *c = (supervise_child_t){.set = s, .prefix = prefix, .exit_cb = o->exit_cb, .arg = o->arg,
                           .open_handles = 3};
  uv_stdio_container_t stdio[3 + SUPERVISE_FDS_MAX];
  supervise_stream_t *streams[2] = {&c->out, &c->err};
  FILE *to[2] = {o->out ? o->out : s->o.out ? s->o.out : stdout,
                 o->err ? o->err : s->o.err ? s->o.err : stderr};
  for (int i = 0; i < 2; i++) {
    uv_pipe_init(s->loop, &streams[i]->pipe, 0);
    streams[i]->pipe.data = streams[i];
    streams[i]->child = c;
    streams[i]->to = to[i];
    stdio[1 + i].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1 + i].data.stream = (uv_stream_t *)&streams[i]->pipe;
  }
  stdio[0].flags = UV_IGNORE; /* /dev/null */
  for (int i = 0; i < o->nfds; i++) {
    stdio[3 + i].flags = UV_INHERIT_FD;
    stdio[3 + i].data.fd = o->fds[i];
  }
  uv_process_options_t po = {
      .exit_cb = supervise_proc_exit_cb,
      .file = o->argv[0],
      .args = (char **)o->argv,
      .env = env, /* NULL: ours */
      .cwd = o->cwd,
      /* its own session: its group can be signalled whole */
      .flags = UV_PROCESS_DETACHED | (o->as_user ? UV_PROCESS_SETUID | UV_PROCESS_SETGID : 0),
      .uid = o->uid,
      .gid = o->gid,
      .stdio_count = 3 + o->nfds,
      .stdio = stdio,
  };
  c->proc.data = c;
  int rc = uv_spawn(s->loop, &c->proc, &po);
  free(env);
  if (rc) { /* the handles are initialised all the same, and freed through their close */
    supervise_child_close(c);
    return err_set(err_from_errno(-rc), "cannot start %s: %s; check that it exists and is executable",
                   o->argv[0], uv_strerror(rc));
  }
  c->next = s->children;
  s->children = c;
  s->running++;
  uv_read_start((uv_stream_t *)&c->out.pipe, supervise_alloc_cb, supervise_read_cb);
  uv_read_start((uv_stream_t *)&c->err.pipe, supervise_alloc_cb, supervise_read_cb);
  if (pid) *pid = c->proc.pid;
  return FSDP_OK;
}

/* ---- the set ----------------------------------------------------------- */

static void supervise_grace_cb(uv_timer_t *t) {
  supervise_t *s = t->data;
  if (!s->running) return;
  if (s->o.kill_cb) s->o.kill_cb(s, s->o.arg, s->running);
  supervise_signal_all(s, SIGKILL);
}

void supervise_stop(supervise_t *s, double grace_s) {
  if (s->stopping) return;
  s->stopping = 1;
  if (!s->running) return;
  if (grace_s <= 0) { /* no grace: nothing runs after this call, not even a SIGTERM handler */
    supervise_signal_all(s, SIGKILL);
    return;
  }
  supervise_signal_all(s, SIGTERM);
  /* a stopped child gets its SIGTERM only once continued */
  supervise_signal_all(s, SIGCONT);
  /* from now, never short: the loop's clock is read afresh (it is the last
   * iteration's) and counts whole milliseconds, so one more */
  uv_update_time(s->grace.loop);
  uv_timer_start(&s->grace, supervise_grace_cb, (uint64_t)ceil(grace_s * 1000.0) + 1, 0);
}

int supervise_stopping(const supervise_t *s) { return s->stopping; }

int supervise_running(const supervise_t *s) { return s->running; }

int supervise_create(supervise_t **out, uv_loop_t *loop, const supervise_opts_t *o) {
  supervise_t *s = calloc(1, sizeof *s);
  if (!s) return err_set(FSDP_ENOMEM, "supervise: out of memory for a set of processes");
  s->loop = loop;
  if (o) s->o = *o;
  uv_timer_init(loop, &s->grace);
  s->grace.data = s;
  *out = s;
  return FSDP_OK;
}

static void supervise_free_cb(uv_handle_t *h) { free(h->data); }

void supervise_destroy(supervise_t *s) {
  if (!s) return;
  FSDP_ASSERT(s->running == 0 && !s->children);
  uv_close((uv_handle_t *)&s->grace, supervise_free_cb);
}

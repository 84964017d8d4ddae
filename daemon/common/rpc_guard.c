/* rpc_guard: keeps a server's listener alive through a flood of connections.
 *
 * gRPC 1.51's listener (src/core/lib/iomgr/tcp_server_posix.cc, on_read)
 * stops for good the first time accept4 fails with anything but EAGAIN,
 * ECONNABORTED or EINTR: one EMFILE and the port never accepts again, even
 * once the descriptors are back (grpc/grpc#16058, #20418; later releases
 * retry on a timer). Idle HTTP/2 connections cost a peer nothing, so any
 * peer that reaches the port could stop the server that way. Two defences:
 *
 * - the soft RLIMIT_NOFILE is raised to the hard one when a server is made
 *   (Debian's default soft limit is 1024 whatever systemd's LimitNOFILE
 *   allows the hard one);
 * - a socket mutator, which gRPC calls on every socket it accepts before it
 *   makes a connection of it: a socket accepted onto a descriptor at or
 *   above the cap (the limit less a quarter of it, 256 at least) is shut
 *   down at once, so gRPC reads its end and closes it at its next poll. As
 *   Linux hands out the lowest free descriptor, such a number means that
 *   many are open; the quarter above stays for accept4's bursts (up to
 *   somaxconn, 4096, queued at once) and for the rest of the process (the
 *   database, logs, the ranks' ring sockets);
 * - the listen backlog set to half that reserve (4096 at most): accept4
 *   takes every queued connection in one go before gRPC closes any it was
 *   told to end, so a queue longer than the reserve (2,500 connections
 *   opened at once against a 2,000 limit) met EMFILE all the same.
 *
 * The mutator's types are gRPC's own (src/core/lib/iomgr/socket_mutator.h,
 * not installed): they are mirrored here for 1.51. gRPC calls the mutator
 * on the listening socket too, which proves the mirror right:
 * rpc__guard_saw_listener says whether it did, and the server warns when
 * not (the cap is then off; the raised limit still holds). */
#include <errno.h>
#include <string.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <grpc/grpc.h>
#include <grpc/support/sync.h>

#include "daemon/common/log.h"
#include "rpc_impl.h"

#define RPC_GUARD_RESERVE_MIN 256
#define RPC_GUARD_BACKLOG_MAX 4096 /* gRPC's own: somaxconn, 4096 on current kernels */

/* Mirror of gRPC 1.51's grpc_fd_usage, grpc_mutate_socket_info,
 * grpc_socket_mutator_vtable and struct grpc_socket_mutator. */
typedef enum { RPC_FD_CLIENT_CONNECTION, RPC_FD_SERVER_LISTENER, RPC_FD_SERVER_CONNECTION } rpc_fd_usage_t;
typedef struct {
  int fd;
  rpc_fd_usage_t usage;
} rpc_mutate_info_t;
typedef struct {
  bool (*mutate_fd)(int fd, grpc_socket_mutator *m);
  int (*compare)(grpc_socket_mutator *a, grpc_socket_mutator *b);
  void (*destroy)(grpc_socket_mutator *m);
  bool (*mutate_fd_2)(const rpc_mutate_info_t *info, grpc_socket_mutator *m);
} rpc_mutator_vtable_t;
struct grpc_socket_mutator {
  const rpc_mutator_vtable_t *vtable;
  gpr_refcount refcount;
};

#define RPC_GUARD_LISTENERS 8
static atomic_int rpc_guard_listener;        /* gRPC called the mutator on a listening socket */
static atomic_int rpc_guard_nlisten;         /* listening sockets seen since rpc__guard_listen_begin */
static int rpc_guard_listen_fd[RPC_GUARD_LISTENERS];
static atomic_uint_fast64_t rpc_guard_shed;  /* connections shut down at the cap */

int rpc__guard_cap(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT32_MAX)
    return INT32_MAX;
  const long lim = (long)rl.rlim_cur, reserve = lim / 4 > RPC_GUARD_RESERVE_MIN ? lim / 4
                                                                               : RPC_GUARD_RESERVE_MIN;
  /* a limit this small leaves no room to shed from: no cap (a limit of 300
   * would shed every connection past descriptor 44) */
  if (lim < 4 * RPC_GUARD_RESERVE_MIN) return INT32_MAX;
  return (int)(lim - reserve);
}

static bool rpc_guard_mutate(const rpc_mutate_info_t *info, grpc_socket_mutator *m) {
  (void)m;
  if (info->usage == RPC_FD_SERVER_LISTENER) {
    atomic_store(&rpc_guard_listener, 1);
    const int i = atomic_fetch_add(&rpc_guard_nlisten, 1);
    if (i < RPC_GUARD_LISTENERS) rpc_guard_listen_fd[i] = info->fd;
  }
  if (info->usage != RPC_FD_SERVER_CONNECTION || info->fd < rpc__guard_cap()) return true;
  /* Returning false would stop the listener just as EMFILE does: keep the
   * socket, ended, for gRPC to close. SO_LINGER 0 makes that close a reset,
   * leaving nothing in TIME_WAIT. */
  struct linger lg = {1, 0};
  (void)setsockopt(info->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  (void)shutdown(info->fd, SHUT_RDWR);
  const uint64_t n = atomic_fetch_add(&rpc_guard_shed, 1) + 1;
  if (n == 1 || n % 10000 == 0) /* gRPC's thread: log.h is thread-safe */
    LOG_WARN("rpc", "a connection onto descriptor %d, at the cap of %d (RLIMIT_NOFILE less "
            "a quarter): ended at once, so the listener keeps descriptors to accept with (%llu "
            "so far; raise LimitNOFILE, or look for a flood of connections)",
            info->fd, rpc__guard_cap(), (unsigned long long)n);
  return true;
}

static bool rpc_guard_mutate_1(int fd, grpc_socket_mutator *m) {
  (void)fd, (void)m;
  return true;
}
static int rpc_guard_compare(grpc_socket_mutator *a, grpc_socket_mutator *b) { return (a > b) - (a < b); }
static void rpc_guard_destroy(grpc_socket_mutator *m) { (void)m; /* static: never freed */ }

static const rpc_mutator_vtable_t rpc_guard_vtable = {rpc_guard_mutate_1, rpc_guard_compare,
                                                      rpc_guard_destroy, rpc_guard_mutate};
static grpc_socket_mutator rpc_guard_mutator = {&rpc_guard_vtable, {1}};

/* The channel argument's own table: gRPC copies and drops the pointer with
 * these, counting references in the mutator as its own code does. */
static void *rpc_guard_arg_copy(void *p) {
  gpr_ref(&((grpc_socket_mutator *)p)->refcount);
  return p;
}
static void rpc_guard_arg_destroy(void *p) {
  grpc_socket_mutator *m = p;
  if (gpr_unref(&m->refcount)) m->vtable->destroy(m);
}
static int rpc_guard_arg_cmp(void *a, void *b) { return (a > b) - (a < b); }
static const grpc_arg_pointer_vtable rpc_guard_arg_vtable = {rpc_guard_arg_copy, rpc_guard_arg_destroy,
                                                             rpc_guard_arg_cmp};

grpc_arg rpc__guard_arg(void) {
  grpc_arg a = {.type = GRPC_ARG_POINTER, .key = GRPC_ARG_SOCKET_MUTATOR};
  a.value.pointer.p = &rpc_guard_mutator;
  a.value.pointer.vtable = &rpc_guard_arg_vtable;
  return a;
}

int rpc__guard_saw_listener(void) { return atomic_load(&rpc_guard_listener); }

int rpc__guard_fits(const char *core) { return core && !strcmp(core, RPC_GUARD_GRPC_CORE); }

void rpc__guard_listen_begin(void) { atomic_store(&rpc_guard_nlisten, 0); }

int rpc__guard_listen_end(void) {
  int n = atomic_load(&rpc_guard_nlisten);
  if (n > RPC_GUARD_LISTENERS) n = RPC_GUARD_LISTENERS;
  const int cap = rpc__guard_cap();
  if (cap == INT32_MAX) return n; /* no cap: gRPC's own backlog */
  struct rlimit rl;
  long lim = getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur > INT32_MAX ? INT32_MAX : (long)rl.rlim_cur;
  long backlog = (lim - cap) / 2;
  if (backlog > RPC_GUARD_BACKLOG_MAX) backlog = RPC_GUARD_BACKLOG_MAX;
  if (backlog < 16) backlog = 16;
  /* listen() again on a listening socket sets its backlog (Linux); one
   * that is no longer a listener (closed, its number reused) is left */
  for (int i = 0; i < n; i++) {
    int on = 0;
    socklen_t ol = sizeof on;
    if (getsockopt(rpc_guard_listen_fd[i], SOL_SOCKET, SO_ACCEPTCONN, &on, &ol) || !on) continue;
    if (listen(rpc_guard_listen_fd[i], (int)backlog))
      LOG_WARN("rpc", "cannot set the listener's backlog to %ld: %s", backlog, strerror(errno));
  }
  return n;
}

uint64_t rpc__guard_shed(void) { return atomic_load(&rpc_guard_shed); }

void rpc__guard_raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= rl.rlim_max) return;
  const rlim_t was = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl))
    LOG_WARN("rpc", "cannot raise the open-file limit from %llu to %llu: %s",
            (unsigned long long)was, (unsigned long long)rl.rlim_max, strerror(errno));
}

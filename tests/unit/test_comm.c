/* Tests of the collectives (daemon/comm) with the ring backend: N rank
 * processes forked on 127.0.0.1, each checking its results against float64
 * references computed here, and the failure paths (a killed rank, a divergent
 * op, comm_abort, a dead bootstrap address, mis-wired groups).
 *
 * The parent binds every rank's listening socket on 127.0.0.1:0 before
 * forking, so the ports are known and free. Children never use Criterion's
 * asserts: they write a verdict into shared memory and _exit; the parent waits
 * for them with a bound, kills them past it, and asserts. */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/comm/ring.h"
#include "daemon/comm/reg.h"
#include "daemon/common/err.h"
#include "daemon/common/rng.h"
#include "kernels/kern_math.h"
#include "tests/unit/comm_ref.h"
#include "tests/unit/testutil.h"

#define MAXR 8

typedef struct {
  int fail;          /* 1: the child's checks failed (msg says why) */
  int code;          /* the comm error a fault test saw */
  int64_t t_err_ns;  /* when it saw it (CLOCK_MONOTONIC, system-wide) */
  volatile int ready;
  char msg[2048];
} slot_t;

typedef struct {
  slot_t s[MAXR];
  volatile int64_t t_kill_ns;
  volatile int stall; /* the victim of a strike stops issuing collectives */
} shared_t;

typedef struct {
  int n;
  int lfd[MAXR];
  char addr[MAXR][64];
  const char *ptr[MAXR];
} group_t;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void group_bind(group_t *g, int n) {
  g->n = n;
  for (int i = 0; i < n; i++) {
    g->lfd[i] = tu_listen_loopback(g->addr[i], sizeof g->addr[i]);
    g->ptr[i] = g->addr[i];
  }
}

static int group_create(group_t *g, int rank, const char *name, int64_t timeout_ms,
                        comm_t **c) {
  comm_ring_opts_t o = {.rank = rank, .size = g->n, .addrs = g->ptr, .name = name,
                        .listen_fd = g->lfd[rank], .timeout_ms = timeout_ms,
                        .chunk_bytes = 1024, .staging_bytes = 4096};
  g->lfd[rank] = -1; /* owned by the communicator now */
  return comm_ring_create(&o, c);
}

static shared_t *shared_new(void) {
  shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  return sh;
}

static int child_fail(shared_t *sh, int rank, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sh->s[rank].msg, sizeof sh->s[rank].msg, fmt, ap);
  va_end(ap);
  sh->s[rank].fail = 1;
  return 1;
}

typedef int (*child_fn)(int rank, void *arg, shared_t *sh);

/* Forks n children running fn(rank); closes listeners the child does not own. */
static void spawn(pid_t *pids, int n, child_fn fn, void *arg, shared_t *sh, group_t **gs, int ng) {
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    cr_assert(p >= 0);
    if (p == 0) {
      for (int k = 0; k < ng; k++)
        for (int i = 0; i < gs[k]->n; i++)
          if (i != r && gs[k]->lfd[i] >= 0) close(gs[k]->lfd[i]), gs[k]->lfd[i] = -1;
      int rc = fn(r, arg, sh);
      _exit(rc ? 1 : 0);
    }
    pids[r] = p;
  }
  for (int k = 0; k < ng; k++)
    for (int i = 0; i < gs[k]->n; i++)
      if (gs[k]->lfd[i] >= 0) close(gs[k]->lfd[i]), gs[k]->lfd[i] = -1;
}

/* Waits for every child, at most limit_s; kills the rest past it. Returns how
 * many exited 0; *hung is set when some had to be killed. */
static int reap(pid_t *pids, int n, double limit_s, int *hung) {
  int64_t until = now_ns() + (int64_t)(limit_s * 1e9);
  int ok = 0, left = n, st[MAXR];
  int done[MAXR] = {0};
  *hung = 0;
  while (left > 0) {
    for (int r = 0; r < n; r++) {
      if (done[r] || pids[r] <= 0) {
        if (!done[r] && pids[r] <= 0) done[r] = 1, left--;
        continue;
      }
      pid_t w = waitpid(pids[r], &st[r], WNOHANG);
      if (w == pids[r]) {
        done[r] = 1, left--;
        if (WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) ok++;
      }
    }
    if (left == 0) break;
    if (now_ns() > until) {
      *hung = 1;
      for (int r = 0; r < n; r++)
        if (!done[r] && pids[r] > 0) kill(pids[r], SIGKILL), waitpid(pids[r], NULL, 0);
      break;
    }
    usleep(5000);
  }
  return ok;
}

static void assert_children(shared_t *sh, pid_t *pids, int n, double limit_s) {
  int hung;
  int ok = reap(pids, n, limit_s, &hung);
  for (int r = 0; r < n; r++) cr_expect(!sh->s[r].fail, "rank %d: %s", r, sh->s[r].msg);
  cr_assert(!hung, "children still running after %.0f s", limit_s);
  cr_assert_eq(ok, n, "%d of %d ranks exited cleanly", ok, n);
}

/* ---- deterministic inputs and float64 references (comm_ref.h) ---- */

static int check_reduce(shared_t *sh, int rank, int N, const void *out, size_t n, size_t base,
                        uint64_t seed, comm_dtype_t dt, comm_redop_t op, const char *what) {
  char why[256];
  return comm_ref_check_reduce(why, sizeof why, N, out, n, base, seed, dt, op)
             ? child_fail(sh, rank, "%s: %s", what, why)
             : 0;
}

static int check_exact(shared_t *sh, int rank, const void *out, size_t n, uint64_t seed, int src,
                       size_t base, comm_dtype_t dt, const char *what) {
  char why[256];
  return comm_ref_check_exact(why, sizeof why, out, n, seed, src, base, dt)
             ? child_fail(sh, rank, "%s: %s", what, why)
             : 0;
}

/* ---- correctness of every op and dtype ---- */

/* Same-host links: RING_CMA reads the peer's memory (FSDP_COMM_CMA=1),
 * RING_COPY copies through the shared-memory link (FSDP_COMM_CMA=0, the
 * default), RING_TCP keeps every link on TCP (FSDP_COMM_SHM=0); RING_REG is
 * RING_COPY with registered buffers (reg.c), which the peers read in place.
 * Set in the child before its ring. */
typedef enum { RING_COPY, RING_CMA, RING_TCP, RING_REG } xport_t;

static void xport_set(xport_t x) {
  setenv("FSDP_COMM_CMA", x == RING_CMA ? "1" : "0", 1);
  if (x == RING_TCP) setenv("FSDP_COMM_SHM", "0", 1);
}

/* A test buffer: registered under RING_REG, else from malloc. */
static void *xbuf(xport_t x, size_t bytes) {
  return x == RING_REG ? comm_reg_alloc(MEM_COMM, bytes ? bytes : 1, "test buffer")
                       : malloc(bytes ? bytes : 1);
}

static void xfree(xport_t x, void *p) {
  if (x == RING_REG) comm_reg_free(p);
  else free(p);
}

/* How many of c's links carry records for every op: 2 on a CMA ring of 2+
 * ranks on this host, else 0 (every test rank is on this host); and how
 * many map the neighbours' registered memory: 2 on any shared-memory ring. */
static int xport_check(shared_t *sh, int rank, comm_t *c, xport_t x) {
  int want = x == RING_CMA && comm_size(c) > 1 ? 2 : 0, got = comm_ring_cma_links(c);
  if (got != want)
    return child_fail(sh, rank, "%d links read the peer's memory, expected %d", got, want);
  want = x != RING_TCP && comm_size(c) > 1 ? 2 : 0, got = comm_ring_reg_links(c);
  if (got != want)
    return child_fail(sh, rank, "%d links map the peer's registered memory, expected %d", got,
                      want);
  return 0;
}

/* After a run: ops went out as records exactly when the ring reads the
 * peer's memory (CMA) or the buffers were registered. */
static int xport_check_records(shared_t *sh, int rank, comm_t *c, xport_t x) {
  uint64_t n = comm_ring_record_ops(c);
  int want = (x == RING_CMA || x == RING_REG) && comm_size(c) > 1;
  if ((n > 0) != want)
    return child_fail(sh, rank, "%llu ops sent as records, expected %s", (unsigned long long)n,
                      want ? "some" : "none");
  return 0;
}

typedef struct {
  group_t g;
  xport_t x;
} ops_arg_t;

/* Odd counts, counts off the chunk (1024 bytes), the staging slot (1024
 * bytes) and the shared-memory grains, and one over many of each. */
static int child_ops(int rank, void *argp, shared_t *sh) {
  ops_arg_t *arg = argp;
  const int N = arg->g.n;
  comm_t *c;
  xport_set(arg->x);
  if (group_create(&arg->g, rank, "world", 10000, &c) < 0)
    return child_fail(sh, rank, "create: %s", err_msg());
  if (xport_check(sh, rank, c, arg->x)) return 1;
  static const size_t counts[] = {0, 1, 5, 37, 257, 4099, 70001};
  uint64_t seed = 1;
  char what[128];
  for (int d = 0; d < 2; d++) {
    comm_dtype_t dt = d ? COMM_BF16 : COMM_F32;
    size_t esz = comm_dtype_size(dt);
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      size_t n = counts[ci];
      uint8_t *in = xbuf(arg->x, n * N * esz + 8), *out = xbuf(arg->x, n * N * esz + 8);
      /* all_gather, out of place and in place */
      for (int inplace = 0; inplace < 2; inplace++) {
        seed++;
        snprintf(what, sizeof what, "all_gather %s n=%zu%s", comm_dtype_name(dt), n,
                 inplace ? " in place" : "");
        void *src = inplace ? out + rank * n * esz : in;
        comm_ref_fill(src, seed, rank, 0, n, dt);
        if (comm_all_gather(c, src, out, n, dt) < 0)
          return child_fail(sh, rank, "%s: %s", what, err_msg());
        for (int j = 0; j < N; j++)
          if (check_exact(sh, rank, out + j * n * esz, n, seed, j, 0, dt, what)) return 1;
      }
      for (int op = 0; op < 2; op++) {
        comm_redop_t ro = op ? COMM_AVG : COMM_SUM;
        seed++;
        snprintf(what, sizeof what, "reduce_scatter %s %s n=%zu", comm_dtype_name(dt),
                 op ? "avg" : "sum", n);
        comm_ref_fill(in, seed, rank, 0, n * N, dt);
        if (comm_reduce_scatter(c, in, out, n, dt, ro) < 0)
          return child_fail(sh, rank, "%s: %s", what, err_msg());
        if (check_reduce(sh, rank, N, out, n, rank * n, seed, dt, ro, what)) return 1;
        for (int inplace = 0; inplace < 2; inplace++) {
          seed++;
          snprintf(what, sizeof what, "all_reduce %s %s n=%zu%s", comm_dtype_name(dt),
                   op ? "avg" : "sum", n, inplace ? " in place" : "");
          comm_ref_fill(in, seed, rank, 0, n, dt);
          if (comm_all_reduce(c, in, inplace ? in : out, n, dt, ro) < 0)
            return child_fail(sh, rank, "%s: %s", what, err_msg());
          if (check_reduce(sh, rank, N, inplace ? in : out, n, 0, seed, dt, ro, what)) return 1;
        }
      }
      seed++;
      int root = (int)((n + ci) % (size_t)N);
      snprintf(what, sizeof what, "broadcast %s n=%zu root=%d", comm_dtype_name(dt), n, root);
      if (rank == root) comm_ref_fill(out, seed, rank, 0, n, dt);
      else memset(out, 0xff, n * esz);
      if (comm_broadcast(c, out, n, dt, root) < 0)
        return child_fail(sh, rank, "%s: %s", what, err_msg());
      if (check_exact(sh, rank, out, n, seed, root, 0, dt, what)) return 1;
      if (comm_barrier(c) < 0) return child_fail(sh, rank, "barrier: %s", err_msg());
      xfree(arg->x, in);
      xfree(arg->x, out);
    }
  }
  if (xport_check_records(sh, rank, c, arg->x)) return 1;
  comm_destroy(c);
  return 0;
}

static void run_ops(int n, xport_t x) {
  shared_t *sh = shared_new();
  ops_arg_t arg = {.x = x};
  group_bind(&arg.g, n);
  group_t *gs[] = {&arg.g};
  pid_t pids[MAXR];
  spawn(pids, n, child_ops, &arg, sh, gs, 1);
  assert_children(sh, pids, n, 40);
}

/* A rank whose communication thread is slow to look (every wait stalls 20
 * ms, as on a loaded machine) must not take its next rank's normal end for
 * a failure: the next rank may consume this rank's last records and finish
 * the job while this rank still waits, and that op succeeded. */
static int child_slow_waits(int rank, void *argp, shared_t *sh) {
  ops_arg_t *arg = argp;
  xport_set(arg->x);
  comm_ring_test_stall_ns = 20000000;
  comm_t *c;
  if (group_create(&arg->g, rank, "slow", 10000, &c) < 0)
    return child_fail(sh, rank, "create: %s", err_msg());
  uint8_t *in = xbuf(arg->x, 64), *out = xbuf(arg->x, 64 * MAXR);
  for (int i = 0; i < 8; i++) {
    memset(in, rank + i, 64);
    if (comm_all_gather(c, in, out, 16, COMM_F32) < 0 || comm_barrier(c) < 0)
      return child_fail(sh, rank, "op %d: %s", i, err_msg());
    for (int r = 0; r < comm_size(c); r++)
      if (out[64 * r] != (uint8_t)(r + i)) return child_fail(sh, rank, "op %d: wrong bytes", i);
  }
  xfree(arg->x, in);
  xfree(arg->x, out);
  comm_destroy(c);
  return 0;
}

static void run_slow_waits(int n, xport_t x) {
  shared_t *sh = shared_new();
  ops_arg_t arg = {.x = x};
  group_bind(&arg.g, n);
  group_t *gs[] = {&arg.g};
  pid_t pids[MAXR];
  spawn(pids, n, child_slow_waits, &arg, sh, gs, 1);
  assert_children(sh, pids, n, 40);
}

Test(comm, slow_waits_take_a_normal_end_as_one_2_ranks_cma, .timeout = 60) {
  run_slow_waits(2, RING_CMA);
}
Test(comm, slow_waits_take_a_normal_end_as_one_3_ranks_registered, .timeout = 60) {
  run_slow_waits(3, RING_REG);
}

Test(comm, ops_and_dtypes_1_rank, .timeout = 60) { run_ops(1, RING_CMA); }
Test(comm, ops_and_dtypes_2_ranks, .timeout = 60) { run_ops(2, RING_CMA); }
Test(comm, ops_and_dtypes_3_ranks, .timeout = 60) { run_ops(3, RING_CMA); }
Test(comm, ops_and_dtypes_4_ranks, .timeout = 60) { run_ops(4, RING_CMA); }
Test(comm, ops_and_dtypes_2_ranks_copying_link, .timeout = 60) { run_ops(2, RING_COPY); }
Test(comm, ops_and_dtypes_3_ranks_copying_link, .timeout = 60) { run_ops(3, RING_COPY); }
Test(comm, ops_and_dtypes_4_ranks_copying_link, .timeout = 60) { run_ops(4, RING_COPY); }
Test(comm, ops_and_dtypes_3_ranks_tcp, .timeout = 60) { run_ops(3, RING_TCP); }
Test(comm, ops_and_dtypes_2_ranks_registered_buffers, .timeout = 60) { run_ops(2, RING_REG); }
Test(comm, ops_and_dtypes_3_ranks_registered_buffers, .timeout = 60) { run_ops(3, RING_REG); }
Test(comm, ops_and_dtypes_4_ranks_registered_buffers, .timeout = 60) { run_ops(4, RING_REG); }

/* Buffers far beyond the sockets' and the staging's sizes, default tunables:
 * every link must keep streaming (a reduce-scatter that buffered a whole
 * step before sending on would deadlock here). */
static int child_large(int rank, void *argp, shared_t *sh) {
  ops_arg_t *arg = argp;
  const int N = arg->g.n;
  xport_set(arg->x);
  comm_ring_opts_t o = {.rank = rank, .size = N, .addrs = arg->g.ptr, .name = "large",
                        .listen_fd = arg->g.lfd[rank], .timeout_ms = 20000};
  comm_t *c;
  if (comm_ring_create(&o, &c) < 0) return child_fail(sh, rank, "create: %s", err_msg());
  if (xport_check(sh, rank, c, arg->x)) return 1;
  const size_t n = (size_t)3 << 20; /* per rank: 12 MiB of fp32 */
  float *in = xbuf(arg->x, n * N * 4), *out = xbuf(arg->x, n * N * 4);
  comm_ref_fill(in, 77, rank, 0, n * N, COMM_F32);
  if (comm_reduce_scatter(c, in, out, n, COMM_F32, COMM_SUM) < 0)
    return child_fail(sh, rank, "reduce_scatter: %s", err_msg());
  if (check_reduce(sh, rank, N, out, n, rank * n, 77, COMM_F32, COMM_SUM, "large reduce_scatter"))
    return 1;
  comm_ref_fill(in, 78, rank, 0, n, COMM_F32);
  if (comm_all_gather(c, in, out, n, COMM_F32) < 0)
    return child_fail(sh, rank, "all_gather: %s", err_msg());
  for (int j = 0; j < N; j++)
    if (check_exact(sh, rank, out + j * n, n, 78, j, 0, COMM_F32, "large all_gather")) return 1;
  if (xport_check_records(sh, rank, c, arg->x)) return 1;
  xfree(arg->x, in);
  xfree(arg->x, out);
  comm_destroy(c);
  return 0;
}

static void run_large(xport_t x) {
  shared_t *sh = shared_new();
  ops_arg_t arg = {.x = x};
  group_bind(&arg.g, 3);
  group_t *gs[] = {&arg.g};
  pid_t pids[MAXR];
  spawn(pids, 3, child_large, &arg, sh, gs, 1);
  assert_children(sh, pids, 3, 45);
}

Test(comm, large_buffers_stream_through_the_ring, .timeout = 60) { run_large(RING_COPY); }
Test(comm, large_buffers_stream_through_a_cma_ring, .timeout = 60) { run_large(RING_CMA); }
Test(comm, large_registered_buffers_are_read_in_place, .timeout = 60) { run_large(RING_REG); }

/* ---- two communicators at once, async ops waited out of order ---- */

typedef struct {
  group_t world, sub; /* sub = world ranks 0 and 2 */
} multi_arg_t;

static int child_multi(int rank, void *argp, shared_t *sh) {
  multi_arg_t *a = argp;
  comm_t *w, *s = NULL;
  if (group_create(&a->world, rank, "world", 10000, &w) < 0)
    return child_fail(sh, rank, "world: %s", err_msg());
  int srank = rank == 0 ? 0 : rank == 2 ? 1 : -1;
  if (srank >= 0 && group_create(&a->sub, srank, "shard0", 10000, &s) < 0)
    return child_fail(sh, rank, "sub: %s", err_msg());
  const size_t n1 = 1000, n2 = 333;
  float *ar = malloc(n1 * 4), *bc = malloc(n1 * 4), *sin_ = malloc(n2 * 4), *sout = malloc(2 * n2 * 4);
  uint16_t *sar = malloc(n1 * 2);
  for (int round = 0; round < 3; round++) {
    uint64_t seed = 100 + (uint64_t)round * 10;
    comm_req_t *r1, *r2, *r3 = NULL, *r4 = NULL;
    comm_ref_fill(ar, seed, rank, 0, n1, COMM_F32);
    if (rank == 1) comm_ref_fill(bc, seed + 1, rank, 0, n1, COMM_F32);
    if (comm_iall_reduce(w, ar, ar, n1, COMM_F32, COMM_SUM, &r1) < 0 ||
        comm_ibroadcast(w, bc, n1, COMM_F32, 1, &r2) < 0)
      return child_fail(sh, rank, "issue world: %s", err_msg());
    if (s) {
      comm_ref_fill(sin_, seed + 2, srank, 0, n2, COMM_F32);
      comm_ref_fill(sar, seed + 3, srank, 0, n1, COMM_BF16);
      if (comm_iall_gather(s, sin_, sout, n2, COMM_F32, &r3) < 0 ||
          comm_iall_reduce(s, sar, sar, n1, COMM_BF16, COMM_AVG, &r4) < 0)
        return child_fail(sh, rank, "issue sub: %s", err_msg());
    }
    /* wait in reverse order of issue */
    if (r4 && comm_wait(r4, -1) < 0) return child_fail(sh, rank, "sub all_reduce: %s", err_msg());
    if (r3 && comm_wait(r3, -1) < 0) return child_fail(sh, rank, "sub all_gather: %s", err_msg());
    if (comm_wait(r2, -1) < 0) return child_fail(sh, rank, "broadcast: %s", err_msg());
    if (comm_wait(r1, -1) < 0) return child_fail(sh, rank, "all_reduce: %s", err_msg());
    if (check_reduce(sh, rank, 3, ar, n1, 0, seed, COMM_F32, COMM_SUM, "world all_reduce") ||
        check_exact(sh, rank, bc, n1, seed + 1, 1, 0, COMM_F32, "world broadcast"))
      return 1;
    if (s) {
      for (int j = 0; j < 2; j++)
        if (check_exact(sh, rank, sout + j * n2, n2, seed + 2, j, 0, COMM_F32, "sub all_gather"))
          return 1;
      if (check_reduce(sh, rank, 2, sar, n1, 0, seed + 3, COMM_BF16, COMM_AVG, "sub all_reduce"))
        return 1;
    }
  }
  /* issue order on one communicator: the broadcast sees the all_reduce's result */
  comm_ref_fill(ar, 7, rank, 0, n1, COMM_F32);
  comm_req_t *q1, *q2;
  if (comm_iall_reduce(w, ar, ar, n1, COMM_F32, COMM_SUM, &q1) < 0 ||
      comm_ibroadcast(w, ar, n1, COMM_F32, 2, &q2) < 0)
    return child_fail(sh, rank, "issue: %s", err_msg());
  if (comm_wait(q2, -1) < 0 || comm_wait(q1, -1) < 0)
    return child_fail(sh, rank, "ordered pair: %s", err_msg());
  if (check_reduce(sh, rank, 3, ar, n1, 0, 7, COMM_F32, COMM_SUM, "all_reduce then broadcast"))
    return 1;
  comm_destroy(s);
  comm_destroy(w);
  return 0;
}

Test(comm, two_communicators_interleaved_async_ops, .timeout = 60) {
  shared_t *sh = shared_new();
  multi_arg_t a;
  group_bind(&a.world, 3);
  group_bind(&a.sub, 2);
  /* sub rank 1 is world rank 2: move its listener to that slot for spawn */
  int subl[2] = {a.sub.lfd[0], a.sub.lfd[1]};
  group_t subv = a.sub;
  subv.n = 3;
  subv.lfd[0] = subl[0], subv.lfd[1] = -1, subv.lfd[2] = subl[1];
  group_t *gs[] = {&a.world, &subv};
  pid_t pids[MAXR];
  spawn(pids, 3, child_multi, &a, sh, gs, 2);
  /* children hold a.sub.lfd by value; their own copy was closed for others */
  assert_children(sh, pids, 3, 40);
}

/* ---- split ---- */

/* 4 world ranks split as a 2x2 mesh: shard groups {0,1} {2,3} (color w/2) and
 * replica groups {0,2} {1,3} (color w%2, keyed in reverse to check ordering);
 * an all_reduce of the world rank in each shows who is in it. */
static int child_split(int rank, void *argp, shared_t *sh) {
  group_t *g = argp;
  comm_t *world, *shard, *rep;
  if (group_create(g, rank, "world", 10000, &world) < 0)
    return child_fail(sh, rank, "create: %s", err_msg());
  if (comm_split(world, rank / 2, rank % 2, "shard", 10000, &shard) ||
      comm_split(world, rank % 2, -rank, "replica", 10000, &rep))
    return child_fail(sh, rank, "split: %s", err_msg());
  comm_t *none;
  if (comm_split(world, rank == 3 ? 0 : -1, 0, "solo", 10000, &none))
    return child_fail(sh, rank, "split with color -1: %s", err_msg());
  if ((rank == 3) != (none != NULL) || (none && comm_size(none) != 1))
    return child_fail(sh, rank, "color -1 must join nothing");
  float x = (float)rank, y = (float)rank;
  if (comm_all_reduce(shard, &x, &x, 1, COMM_F32, COMM_SUM) ||
      comm_all_reduce(rep, &y, &y, 1, COMM_F32, COMM_SUM))
    return child_fail(sh, rank, "all_reduce: %s", err_msg());
  float want_x = rank < 2 ? 1.0f : 5.0f, want_y = rank % 2 ? 4.0f : 2.0f;
  if (x != want_x || y != want_y || comm_rank(shard) != rank % 2 || comm_rank(rep) != 1 - rank / 2)
    return child_fail(sh, rank, "rank %d: shard sum %g (want %g) rank %d, replica sum %g (want %g) "
                      "rank %d", rank, x, want_x, comm_rank(shard), y, want_y, comm_rank(rep));
  comm_destroy(none);
  comm_destroy(shard);
  comm_destroy(rep);
  comm_destroy(world);
  return 0;
}

Test(comm, split_makes_the_groups_of_a_mesh, .timeout = 60) {
  shared_t *sh = shared_new();
  static group_t g;
  group_bind(&g, 4);
  group_t *gs[] = {&g};
  pid_t pids[MAXR];
  spawn(pids, 4, child_split, &g, sh, gs, 1);
  assert_children(sh, pids, 4, 40);
}

/* The same split when the ranks' addresses are long (a 54-character host,
 * here 127.0.0.1 written in hex with leading zeros): each sub-group's
 * address came out cut at 55 characters, its port lost, so every job of
 * more than one rank on a long host name failed at its first split. */
Test(comm, split_works_with_long_host_names, .timeout = 60) {
  shared_t *sh = shared_new();
  static group_t g;
  group_bind(&g, 4);
  const char *host = "0x00000000000000000000000000000000000000000007f000001";
  for (int i = 0; i < 4; i++) {
    const char *port = strrchr(g.addr[i], ':');
    char a[sizeof g.addr[i]];
    cr_assert_lt(snprintf(a, sizeof a, "%s%s", host, port), (int)sizeof a);
    snprintf(g.addr[i], sizeof g.addr[i], "%s", a);
  }
  group_t *gs[] = {&g};
  pid_t pids[MAXR];
  spawn(pids, 4, child_split, &g, sh, gs, 1);
  assert_children(sh, pids, 4, 40);
}

/* ---- faults ---- */

typedef struct {
  group_t g;
  int64_t timeout_ms;
  int variant;
  xport_t x;  /* the same-host links */
  int victim; /* a strike's: stops issuing collectives when sh->stall is set */
} fault_arg_t;

static void record(shared_t *sh, int rank, int rc) {
  sh->s[rank].code = rc;
  sh->s[rank].t_err_ns = now_ns();
  snprintf(sh->s[rank].msg, sizeof sh->s[rank].msg, "%s", err_msg());
}

static int child_kill(int rank, void *argp, shared_t *sh) {
  fault_arg_t *a = argp;
  comm_t *c;
  if (group_create(&a->g, rank, "world", a->timeout_ms, &c) < 0)
    return child_fail(sh, rank, "create: %s", err_msg());
  size_t n = 1 << 18;
  float *buf = calloc(n, 4);
  for (int it = 0;; it++) {
    while (rank == a->victim && sh->stall) pause(); /* stuck before a collective: killed later */
    int rc = comm_all_reduce(c, buf, buf, n, COMM_F32, COMM_SUM);
    if (rc < 0) {
      record(sh, rank, rc);
      break;
    }
    sh->s[rank].ready = 1;
    if (it > 100000) return child_fail(sh, rank, "never failed");
  }
  comm_destroy(c);
  return 0;
}

/* N ranks in a loop of all_reduce; rank 1 is struck: killed (SIGKILL: its
 * sockets close), stopped (SIGSTOP: silent, named through the missing beats)
 * or, with sig 0, stuck before its next collective (its communication thread
 * still beats: named by the rank that never gets its header). Every other
 * rank must fail within the timeout + 1 s with an error naming it, and
 * holding want. */
static void run_strike(int N, int sig, const char *want) {
  shared_t *sh = shared_new();
  const int victim = 1;
  fault_arg_t a = {.timeout_ms = 2000, .victim = victim};
  const char *what = sig == SIGKILL ? "SIGKILL" : sig == SIGSTOP ? "SIGSTOP" : "stuck";
  group_bind(&a.g, N);
  char vaddr[80];
  snprintf(vaddr, sizeof vaddr, "rank %d (%s)", victim, a.g.addr[victim]);
  group_t *gs[] = {&a.g};
  pid_t pids[MAXR];
  spawn(pids, N, child_kill, &a, sh, gs, 1);
  int64_t until = now_ns() + 15 * 1000000000ll;
  for (int r = 0; r < N; r++)
    while (!sh->s[r].ready && now_ns() < until) usleep(2000);
  usleep(50000);
  sh->t_kill_ns = now_ns();
  if (sig) kill(pids[victim], sig);
  else sh->stall = 1;
  pid_t vpid = pids[victim];
  pids[victim] = 0;
  int hung;
  reap(pids, N, 10, &hung);
  kill(vpid, SIGKILL);
  waitpid(vpid, NULL, 0);
  cr_assert(!hung, "%s, %d ranks: a surviving rank did not return", what, N);
  for (int r = 0; r < N; r++) {
    if (r == victim) continue;
    const char *m = sh->s[r].msg;
    cr_expect(!sh->s[r].fail, "%s, %d ranks: rank %d: %s", what, N, r, m);
    double dt = (sh->s[r].t_err_ns - sh->t_kill_ns) / 1e9;
    cr_log_info("%s, %d ranks: rank %d after %.3f s: %s", what, N, r, dt, m);
    cr_expect(sh->s[r].code == FSDP_EPEER || sh->s[r].code == FSDP_ETIMEDOUT,
              "%s, %d ranks: rank %d: code %d: %s", what, N, r, sh->s[r].code, m);
    cr_expect(dt < a.timeout_ms / 1000.0 + 1.0, "%s, %d ranks: rank %d failed %.2f s after", what,
              N, r, dt);
    cr_expect(strstr(m, vaddr) && strstr(m, want), "%s, %d ranks: rank %d's error does not name "
              "%s (\"%s\"): %s", what, N, r, vaddr, want, m);
  }
}

Test(comm, killed_rank_is_named_by_every_other_rank_within_timeout, .timeout = 60) {
  run_strike(4, SIGKILL, "closed its connection");
}

/* Only the rank before a stopped one hears its silence (half a timeout);
 * its notice reaches every other rank before their own deadlines. */
Test(comm, stopped_rank_is_named_by_every_other_rank_within_timeout, .timeout = 60) {
  for (int N = 2; N <= 4; N++) run_strike(N, SIGSTOP, "stopped or hung");
}

/* Alive (it beats) but never at the collective: the rank after it names it
 * at its deadline; the others, whose previous rank is in the op, wait a
 * grace for that notice rather than blame their own neighbour. */
Test(comm, rank_stuck_before_a_collective_is_named_by_every_other_rank, .timeout = 60) {
  for (int N = 3; N <= 4; N++) run_strike(N, 0, "has not issued this collective");
}

static int child_diverge(int rank, void *argp, shared_t *sh) {
  fault_arg_t *a = argp;
  comm_t *c;
  xport_set(a->x);
  if (group_create(&a->g, rank, "world", a->timeout_ms, &c) < 0)
    return child_fail(sh, rank, "create: %s", err_msg());
  float buf[300] = {0};
  if (comm_all_reduce(c, buf, buf, 10, COMM_F32, COMM_SUM) < 0)
    return child_fail(sh, rank, "first op: %s", err_msg());
  int64_t t0 = now_ns();
  int rc = a->variant == 0 ? comm_all_reduce(c, buf, buf, rank == 1 ? 100 : 200, COMM_F32, COMM_SUM)
           : rank == 1     ? comm_all_gather(c, buf, buf, 50, COMM_F32)
                           : comm_all_reduce(c, buf, buf, 200, COMM_F32, COMM_SUM);
  record(sh, rank, rc);
  sh->s[rank].t_err_ns -= t0;
  /* a later op fails at once: the communicator is broken */
  if (rc < 0 && comm_barrier(c) != rc) return child_fail(sh, rank, "later op: %s", err_msg());
  comm_destroy(c);
  return 0;
}

static void run_diverge(int variant, xport_t x, const char *a_sig, const char *b_sig) {
  shared_t *sh = shared_new();
  fault_arg_t a = {.timeout_ms = 5000, .variant = variant, .x = x};
  group_bind(&a.g, 3);
  group_t *gs[] = {&a.g};
  pid_t pids[MAXR];
  spawn(pids, 3, child_diverge, &a, sh, gs, 1);
  assert_children(sh, pids, 3, 20);
  for (int r = 0; r < 3; r++) {
    const char *m = sh->s[r].msg;
    cr_log_info("rank %d: %s", r, m);
    cr_expect_eq(sh->s[r].code, FSDP_EPEER, "rank %d: code %d: %s", r, sh->s[r].code, m);
    cr_expect(sh->s[r].t_err_ns < 2000000000ll, "rank %d took %.2f s", r, sh->s[r].t_err_ns / 1e9);
    cr_expect(strstr(m, "diverged") && strstr(m, a_sig) && strstr(m, b_sig) && strstr(m, "rank 1"),
              "rank %d's error does not name both signatures: %s", r, m);
  }
}

Test(comm, divergent_size_is_an_error_naming_both, .timeout = 30) {
  run_diverge(0, RING_COPY, "count=100", "count=200");
  run_diverge(0, RING_CMA, "count=100", "count=200");
}

Test(comm, divergent_op_is_an_error_naming_both, .timeout = 30) {
  run_diverge(1, RING_COPY, "all_gather #2", "all_reduce #2");
  run_diverge(1, RING_CMA, "all_gather #2", "all_reduce #2");
}

static void *abort_later(void *p) {
  usleep(200000);
  comm_abort(p);
  return NULL;
}

static int child_abort(int rank, void *argp, shared_t *sh) {
  fault_arg_t *a = argp;
  comm_t *c;
  if (group_create(&a->g, rank, "world", a->timeout_ms, &c) < 0)
    return child_fail(sh, rank, "create: %s", err_msg());
  float buf[64] = {0};
  if (rank == 0) {
    pthread_t t;
    pthread_create(&t, NULL, abort_later, c);
    int64_t t0 = now_ns();
    comm_req_t *q;
    int rc = comm_iall_reduce(c, buf, buf, 64, COMM_F32, COMM_SUM, &q);
    if (rc == 0) {
      rc = comm_wait(q, 0);
      if (rc != COMM_PENDING) return child_fail(sh, rank, "op ended alone: %d %s", rc, err_msg());
      rc = comm_wait(q, -1);
    }
    record(sh, rank, rc);
    sh->s[rank].t_err_ns -= t0;
    pthread_join(t, NULL);
    comm_req_t *q2;
    t0 = now_ns();
    int rc2 = comm_ibarrier(c, &q2);
    if (rc2 != FSDP_ECANCELED || now_ns() - t0 > 100000000)
      return child_fail(sh, rank, "an op after abort: %d %s", rc2, err_msg());
  } else {
    usleep(600000);
    int64_t t0 = now_ns();
    int rc = comm_barrier(c);
    record(sh, rank, rc);
    sh->s[rank].t_err_ns -= t0;
  }
  comm_destroy(c);
  return 0;
}

Test(comm, abort_from_another_thread_unblocks_and_tells_the_peer, .timeout = 30) {
  shared_t *sh = shared_new();
  fault_arg_t a = {.timeout_ms = 10000};
  group_bind(&a.g, 2);
  group_t *gs[] = {&a.g};
  pid_t pids[MAXR];
  spawn(pids, 2, child_abort, &a, sh, gs, 1);
  assert_children(sh, pids, 2, 20);
  cr_log_info("rank 0: %s", sh->s[0].msg);
  cr_log_info("rank 1: %s", sh->s[1].msg);
  cr_expect_eq(sh->s[0].code, FSDP_ECANCELED, "%s", sh->s[0].msg);
  cr_expect(sh->s[0].t_err_ns < 1000000000ll, "abort took %.2f s", sh->s[0].t_err_ns / 1e9);
  cr_expect_eq(sh->s[1].code, FSDP_EPEER, "%s", sh->s[1].msg);
  cr_expect(sh->s[1].t_err_ns < 1000000000ll, "peer learned in %.2f s", sh->s[1].t_err_ns / 1e9);
  cr_expect(strstr(sh->s[1].msg, "rank 0 failed first") && strstr(sh->s[1].msg, "abort"), "%s",
            sh->s[1].msg);
}

Test(comm, bootstrap_to_a_dead_address_fails_within_the_timeout, .timeout = 20) {
  char self[64], dead[64];
  int lfd = tu_listen_loopback(self, sizeof self);
  int dfd = tu_listen_loopback(dead, sizeof dead);
  close(dfd); /* nobody listens there now */
  const char *addrs[] = {self, dead};
  comm_ring_opts_t o = {.rank = 0, .size = 2, .addrs = addrs, .name = "world", .listen_fd = lfd,
                        .timeout_ms = 500};
  comm_t *c = NULL;
  int64_t t0 = now_ns();
  int rc = comm_ring_create(&o, &c);
  double dt = (now_ns() - t0) / 1e9;
  cr_log_info("%s", err_msg());
  cr_assert_eq(rc, FSDP_ETIMEDOUT, "%d %s", rc, err_msg());
  cr_assert_null(c);
  cr_assert(dt >= 0.45 && dt < 1.5, "took %.2f s", dt);
  cr_assert(strstr(err_msg(), dead) && strstr(err_msg(), "rank 1"), "%s", err_msg());
}

/* Ranks [from, to) of a mis-wired bootstrap must fail by themselves, well
 * before its timeout (20 s here: failing within 5 s of t0 is failing at
 * once, not waiting it out), with EPEER and a message naming each of want. */
static void assert_fast_mismatch(shared_t *sh, int from, int to, int64_t t0,
                                 const char *const *want, int nwant) {
  for (int r = from; r < to; r++) {
    const char *m = sh->s[r].msg;
    double dt = (sh->s[r].t_err_ns - t0) / 1e9;
    cr_log_info("rank %d after %.3f s: %s", r, dt, m);
    cr_expect_eq(sh->s[r].code, FSDP_EPEER, "rank %d: code %d after %.2f s: %s", r,
                 sh->s[r].code, dt, m);
    cr_expect(dt < 5.0, "rank %d took %.2f s to fail (the bootstrap timeout is 20 s)", r, dt);
    for (int i = 0; i < nwant; i++)
      cr_expect(strstr(m, want[i]), "rank %d's error does not name %s: %s", r, want[i], m);
  }
}

/* Two ranks given each other's addresses, each of another run: of another
 * group (variant 0) or another job (1). */
static int child_miswired(int rank, void *argp, shared_t *sh) {
  fault_arg_t *a = argp;
  comm_ring_opts_t o = {.rank = rank, .size = 2, .addrs = a->g.ptr, .name = "world",
                        .listen_fd = a->g.lfd[rank], .timeout_ms = a->timeout_ms};
  if (a->variant == 0) o.name = rank == 0 ? "alpha" : "beta";
  else o.job = rank == 0 ? "job-a" : "job-b", o.attempt = 1;
  a->g.lfd[rank] = -1;
  comm_t *c = NULL;
  int rc = comm_ring_create(&o, &c);
  record(sh, rank, rc);
  comm_destroy(c);
  return 0;
}

/* Each rank dials the other and meets a rank of another run: each side
 * refuses the other's hello, and each, refused by the rank it dialled (and
 * met by a hello of another run from the very rank it waits for), fails at
 * once naming both (not at the timeout, as when both took the other for a
 * stray and went on waiting). */
static void run_miswired(int variant, const char *want0, const char *want1) {
  shared_t *sh = shared_new();
  fault_arg_t a = {.timeout_ms = 20000, .variant = variant};
  group_bind(&a.g, 2);
  group_t *gs[] = {&a.g};
  pid_t pids[MAXR];
  int64_t t0 = now_ns();
  spawn(pids, 2, child_miswired, &a, sh, gs, 1);
  assert_children(sh, pids, 2, 25);
  const char *want[] = {want0, want1};
  assert_fast_mismatch(sh, 0, 2, t0, want, 2);
}

Test(comm, miswired_groups_fail_at_once_naming_both_sides, .timeout = 40) {
  run_miswired(0, "'alpha'", "'beta'");
}

Test(comm, ranks_of_two_jobs_fail_at_once_naming_both_jobs, .timeout = 40) {
  run_miswired(1, "'job-a'", "'job-b'");
}

/* x: a rank of a 2-rank world whose rank 1 address is y's rank 1 (of a
 * 3-rank world); y's rank 2 is a listener the parent holds, so y's rank 1
 * gets past its own connect and waits for its rank 0, which x claims to
 * be. */
typedef struct {
  group_t x, y;
} worlds_arg_t;

static int child_worlds(int rank, void *argp, shared_t *sh) {
  worlds_arg_t *a = argp;
  comm_t *c = NULL;
  group_t *g = rank == 0 ? &a->x : &a->y;
  comm_ring_opts_t o = {.rank = rank, .size = g->n, .addrs = g->ptr, .name = "world",
                        .listen_fd = g->lfd[rank], .timeout_ms = 20000};
  g->lfd[rank] = -1;
  int rc = comm_ring_create(&o, &c);
  record(sh, rank, rc);
  comm_destroy(c);
  return 0;
}

/* A rank's next address is a rank of a world of another size, waiting for
 * the rank this one claims to be: both fail at once, naming both sizes. */
Test(comm, a_rank_of_another_world_size_fails_both_sides_at_once, .timeout = 40) {
  shared_t *sh = shared_new();
  worlds_arg_t a;
  group_bind(&a.x, 2);
  group_bind(&a.y, 3);
  close(a.x.lfd[1]), a.x.lfd[1] = -1;
  snprintf(a.x.addr[1], sizeof a.x.addr[1], "%s", a.y.addr[1]);
  close(a.y.lfd[0]), a.y.lfd[0] = -1; /* nobody: y's rank 1 never dials its rank 0 */
  int y2 = a.y.lfd[2];                /* held here: y's rank 1 connects, nobody answers */
  a.y.lfd[2] = -1;
  group_t *gs[] = {&a.x, &a.y};
  pid_t pids[MAXR];
  int64_t t0 = now_ns();
  spawn(pids, 2, child_worlds, &a, sh, gs, 2);
  assert_children(sh, pids, 2, 25);
  close(y2);
  const char *want[] = {"size 2", "size 3"};
  assert_fast_mismatch(sh, 0, 2, t0, want, 2);
}

/* Rank `rank` of g, a healthy 2-rank ring of job "j" (attempt, secret):
 * forms it (when, in t_err_ns) and checks a sum over it. */
static int healthy_pair(shared_t *sh, group_t *g, int rank, uint32_t attempt,
                        const uint8_t *secret) {
  comm_t *c = NULL;
  comm_ring_opts_t o = {.rank = rank, .size = 2, .addrs = g->ptr, .name = "world",
                        .listen_fd = g->lfd[rank], .timeout_ms = 20000, .job = "j",
                        .attempt = attempt, .secret = secret};
  if (comm_ring_create(&o, &c) < 0) return child_fail(sh, rank, "create: %s", err_msg());
  sh->s[rank].t_err_ns = now_ns(); /* formed */
  float x = 1.0f + (float)rank;
  int rc = comm_all_reduce(c, &x, &x, 1, COMM_F32, COMM_SUM);
  comm_destroy(c);
  if (rc < 0) return child_fail(sh, rank, "all_reduce: %s", err_msg());
  if (x != 3.0f) return child_fail(sh, rank, "sum %g", x);
  return 0;
}

/* h: a healthy 2-rank ring of job "j" attempt 2, whose rank 0 starts late;
 * s: a stale rank 0 of attempt 1 whose rank 1 address is h's rank 1. */
typedef struct {
  group_t h, s;
} stale_arg_t;

static int child_stale(int rank, void *argp, shared_t *sh) {
  stale_arg_t *a = argp;
  comm_t *c = NULL;
  if (rank == 2) { /* the stale one */
    const char *addrs[2] = {a->s.addr[2], a->h.addr[1]};
    comm_ring_opts_t o = {.rank = 0, .size = 2, .addrs = addrs, .name = "world",
                          .listen_fd = a->s.lfd[2], .timeout_ms = 20000, .job = "j",
                          .attempt = 1};
    int rc = comm_ring_create(&o, &c);
    record(sh, rank, rc);
    comm_destroy(c);
    return 0;
  }
  if (rank == 0) usleep(300000); /* the stale rank reaches rank 1 first */
  return healthy_pair(sh, &a->h, rank, 2, NULL);
}

/* A rank of an earlier attempt of the same job, connecting to a rank of
 * this attempt as the very rank it waits for, is a stale rank, not a
 * mis-wired one: turned away (and told so, so it fails at once) while the
 * healthy ring forms. */
Test(comm, a_stale_rank_of_an_earlier_attempt_is_turned_away, .timeout = 40) {
  shared_t *sh = shared_new();
  stale_arg_t a;
  group_bind(&a.h, 2);
  group_bind(&a.s, 3);
  close(a.s.lfd[0]), a.s.lfd[0] = -1;
  close(a.s.lfd[1]), a.s.lfd[1] = -1;
  group_t *gs[] = {&a.h, &a.s};
  pid_t pids[MAXR];
  int64_t t0 = now_ns();
  spawn(pids, 3, child_stale, &a, sh, gs, 2);
  assert_children(sh, pids, 3, 25);
  for (int r = 0; r < 2; r++) {
    double dt = (sh->s[r].t_err_ns - t0) / 1e9;
    cr_expect(dt < 5.0, "the healthy ring took %.2f s to form (rank %d)", dt, r);
  }
  const char *want[] = {"attempt 1", "attempt 2"}; /* the stale rank's, told by rank 1 */
  assert_fast_mismatch(sh, 2, 3, t0, want, 2);
}

/* A blocking connection to "127.0.0.1:PORT" (one of group_bind's). */
static int connect_loopback(const char *addr) {
  const char *colon = strrchr(addr, ':');
  cr_assert_not_null(colon, "%s", addr);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect to %s: %s",
            addr, strerror(errno));
  return fd;
}

/* ---- authentication: the run's secret ---- */

static const uint8_t SECRET_A[COMM_RING_SECRET_BYTES] = {
    0x5a, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f};
static const uint8_t SECRET_B[COMM_RING_SECRET_BYTES] = {0xb0}; /* another attempt's */

/* h: a 2-rank ring of job "j" attempt 1 with SECRET_A, whose rank 0 starts
 * only when the parent (or the impostor) says so (sh->s[0].ready). Index 2:
 * a rank 0 of the same job and attempt whose rank 1 address is arranged by
 * the test (x.addr[2] its own), with `secret`. */
typedef struct {
  group_t h, x;
  const char *next2; /* index 2's next address */
  const char *name2; /* index 2's group (NULL: "world") */
  const uint8_t *secret2;
  int gate2; /* index 2 opens the gate when it is done */
} secret_arg_t;

static int child_secret(int rank, void *argp, shared_t *sh) {
  secret_arg_t *a = argp;
  comm_t *c = NULL;
  if (rank == 2) {
    const char *addrs[2] = {a->x.addr[2], a->next2};
    comm_ring_opts_t o = {.rank = 0, .size = 2, .addrs = addrs,
                          .name = a->name2 ? a->name2 : "world", .listen_fd = a->x.lfd[2],
                          .timeout_ms = 5000, .job = "j", .attempt = 1, .secret = a->secret2};
    int rc = comm_ring_create(&o, &c);
    record(sh, rank, rc);
    comm_destroy(c);
    if (a->gate2) sh->s[0].ready = 1;
    return 0;
  }
  for (int i = 0; rank == 0 && !sh->s[0].ready && i < 1500; i++) usleep(10000);
  return healthy_pair(sh, &a->h, rank, 1, SECRET_A);
}

/* A rank that claims to be the very rank 0 that rank 1 waits for (same job,
 * attempt, group and size) but holds another secret is turned away, and
 * told so (it fails at once, naming FSDP_RING_SECRET); the real rank 0,
 * coming later, forms the ring. Without the secret it would have been taken
 * for rank 0. */
Test(comm, a_rank_without_the_runs_secret_is_turned_away, .timeout = 40) {
  shared_t *sh = shared_new();
  secret_arg_t a = {.secret2 = SECRET_B, .gate2 = 1};
  group_bind(&a.h, 2);
  group_bind(&a.x, 3);
  close(a.x.lfd[0]), a.x.lfd[0] = -1;
  close(a.x.lfd[1]), a.x.lfd[1] = -1;
  a.next2 = a.h.addr[1];
  group_t *gs[] = {&a.h, &a.x};
  pid_t pids[MAXR];
  int64_t t0 = now_ns();
  spawn(pids, 3, child_secret, &a, sh, gs, 2);
  assert_children(sh, pids, 3, 30);
  for (int r = 0; r < 2; r++) {
    double dt = (sh->s[r].t_err_ns - t0) / 1e9;
    cr_expect(dt < 5.0, "the healthy ring took %.2f s to form (rank %d)", dt, r);
  }
  const char *want[] = {"FSDP_RING_SECRET", "turned away"};
  assert_fast_mismatch(sh, 2, 3, t0, want, 2);
}

/* Reads n bytes from fd within ms (1, or 0 on a short read or timeout). */
static int read_within(int fd, void *p, size_t n, int ms) {
  size_t got = 0;
  while (got < n) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, ms) != 1) return 0;
    ssize_t k = recv(fd, (char *)p + got, n - got, 0);
    if (k <= 0) return 0;
    got += (size_t)k;
  }
  return 1;
}

/* Whether rank 1 closed fd within ms (its end read, nothing more sent). */
static int closed_within(int fd, int ms) {
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  char b[8];
  return poll(&pf, 1, ms) == 1 && recv(fd, b, sizeof b, MSG_DONTWAIT) == 0;
}

/* Starts the ring h of child_secret (its rank 0 held back) and index 2 (a
 * rank 0 of group a->name2 with the run's secret, dialling a recorder the
 * parent holds); the hello it sent, recorded, in hello. */
static void record_hello(secret_arg_t *a, shared_t *sh, pid_t *pids, uint8_t hello[272]) {
  char rec_addr[64];
  int rec = tu_listen_loopback(rec_addr, sizeof rec_addr);
  a->next2 = rec_addr; /* read by the children, forked below */
  group_bind(&a->h, 2);
  group_bind(&a->x, 3);
  close(a->x.lfd[0]), a->x.lfd[0] = -1;
  close(a->x.lfd[1]), a->x.lfd[1] = -1;
  group_t *gs[] = {&a->h, &a->x};
  spawn(pids, 3, child_secret, a, sh, gs, 2);
  a->next2 = NULL;
  cr_assert_eq(listen(rec, 4), 0);
  struct pollfd pf = {.fd = rec, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 10000), 1, "index 2 never dialled the recorder");
  int fd = accept(rec, NULL, NULL);
  cr_assert(fd >= 0);
  cr_assert(read_within(fd, hello, 272, 5000), "no hello recorded");
  close(fd);
  close(rec);
  uint32_t magic;
  memcpy(&magic, hello, 4);
  cr_assert_eq(magic, 0x48525346u, "what was recorded is not a hello");
}

/* Sends hello to addr on a new connection and reads what is answered within
 * ms: the connection, and the answer's magic in *magic. */
static int replay(const char *addr, const uint8_t hello[272], int ms, uint32_t *magic) {
  uint8_t answer[272];
  int fd = connect_loopback(addr);
  cr_assert_eq(send(fd, hello, 272, MSG_NOSIGNAL), (ssize_t)272);
  cr_assert(read_within(fd, answer, sizeof answer, ms), "no answer to a replayed hello");
  memcpy(magic, answer, 4);
  return fd;
}

/* After rank 0 was let go at t0, ranks 0 and 1 formed the ring within
 * max_s (it takes milliseconds; a replay that held rank 1's attention would
 * hold it for RING_BOOT_PROOF_MS, 5 s). */
static void assert_formed(shared_t *sh, pid_t *pids, int64_t t0, double max_s) {
  int hung;
  reap(pids, 3, 30, &hung);
  cr_assert(!hung);
  for (int r = 0; r < 2; r++) {
    cr_expect(!sh->s[r].fail, "rank %d: %s", r, sh->s[r].msg);
    double dt = (sh->s[r].t_err_ns - t0) / 1e9;
    cr_expect(dt < max_s, "the ring took %.2f s to form after rank 0 started (rank %d)", dt, r);
  }
}

/* The hello of a real rank 0 (index 2, with the run's secret), recorded by
 * the parent standing where it dials, then replayed to rank 1: rank 1 takes
 * it for rank 0's and answers, but the replayer cannot prove the secret for
 * the answer's fresh nonce. A forged proof is turned away at once; replays
 * that stay silent, more of them than rank 1 hears at once, shut nobody
 * out: the real rank 0, started meanwhile, forms the ring well within the
 * timeout. */
Test(comm, a_replayed_hello_is_turned_away, .timeout = 40) {
  shared_t *sh = shared_new();
  secret_arg_t a = {.secret2 = SECRET_A};
  pid_t pids[MAXR];
  uint8_t hello[272];
  record_hello(&a, sh, pids, hello);
  /* replay 1, with a forged proof: answered, then closed */
  uint32_t magic;
  int r1 = replay(a.h.addr[1], hello, 5000, &magic);
  cr_assert_eq(magic, 0x48525346u, "rank 1 answered the replayed hello with %08x", magic);
  uint8_t proof[40] = {0x46, 0x53, 0x52, 0x50}; /* "FSRP", and a mac of zeros */
  cr_assert_eq(send(r1, proof, sizeof proof, MSG_NOSIGNAL), (ssize_t)sizeof proof);
  cr_expect(closed_within(r1, 3000), "rank 1 kept the replay with a forged proof");
  close(r1);
  /* 20 more, each answered and then silent: more than the 16 heard at once */
  enum { SILENT = 20 };
  int quiet[SILENT];
  for (int i = 0; i < SILENT; i++) /* heard at once, though 16 answered ones wait for proofs */
    quiet[i] = replay(a.h.addr[1], hello, 2000, &magic);
  const int64_t t0 = now_ns();
  sh->s[0].ready = 1;
  assert_formed(sh, pids, t0, 2.5);
  for (int i = 0; i < SILENT; i++) close(quiet[i]);
}

/* A hello of another group of the same attempt (a shard group: the same
 * run's secret), recorded and replayed to a world rank as the very rank it
 * waits for, proves nothing there (each group macs with a key of its own):
 * turned away, not taken for a mis-wired rank of another run that fails the
 * acceptor; the real rank 0 forms the ring. */
Test(comm, a_replayed_hello_of_another_group_does_not_fail_the_acceptor, .timeout = 40) {
  shared_t *sh = shared_new();
  secret_arg_t a = {.secret2 = SECRET_A, .name2 = "shard"};
  pid_t pids[MAXR];
  uint8_t hello[272];
  record_hello(&a, sh, pids, hello);
  uint32_t magic;
  int r1 = replay(a.h.addr[1], hello, 5000, &magic);
  cr_expect_eq(magic, 0x4e525346u, "rank 1 answered %08x, not a refusal", magic);
  close(r1);
  usleep(200000);
  const int64_t t0 = now_ns();
  sh->s[0].ready = 1;
  assert_formed(sh, pids, t0, 5.0);
}

static int child_strays(int rank, void *argp, shared_t *sh) {
  fault_arg_t *a = argp;
  comm_t *c = NULL;
  if (group_create(&a->g, rank, "world", a->timeout_ms, &c) < 0)
    return child_fail(sh, rank, "create: %s", err_msg());
  float x[4] = {1.0f + (float)rank, 2, 3, 4};
  int rc = comm_all_reduce(c, x, x, 4, COMM_F32, COMM_SUM);
  comm_destroy(c);
  if (rc < 0) return child_fail(sh, rank, "all_reduce: %s", err_msg());
  if (x[0] != 3.0f || x[3] != 8.0f) return child_fail(sh, rank, "sum %g %g", x[0], x[3]);
  return 0;
}

/* A port scanner's garbage and a connection that says nothing, both queued
 * at rank 0's listener before rank 1 dials it, are turned away: the ring
 * still forms, well within the timeout. */
Test(comm, stray_connections_before_the_peer_do_not_stop_the_bootstrap, .timeout = 30) {
  shared_t *sh = shared_new();
  fault_arg_t a = {.timeout_ms = 8000};
  group_bind(&a.g, 2);
  int garbage = connect_loopback(a.g.addr[0]);
  char junk[200];
  memset(junk, 'G', sizeof junk); /* more than a hello, none of it a magic */
  cr_assert_eq(send(garbage, junk, sizeof junk, MSG_NOSIGNAL), (ssize_t)sizeof junk);
  int hold = connect_loopback(a.g.addr[0]); /* connects, then holds without a word */
  group_t *gs[] = {&a.g};
  pid_t pids[MAXR];
  int64_t t0 = now_ns();
  spawn(pids, 2, child_strays, &a, sh, gs, 1);
  assert_children(sh, pids, 2, 20);
  double dt = (now_ns() - t0) / 1e9;
  cr_expect(dt < 6.0, "the ring took %.2f s to form (the timeout is 8 s)", dt);
  /* rank 0 closed both strays */
  for (int i = 0; i < 2; i++) {
    int fd = i ? hold : garbage;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    cr_expect_eq(poll(&pf, 1, 2000), 1, "stray %d still open", i);
    char b[8];
    ssize_t k = recv(fd, b, sizeof b, MSG_DONTWAIT);
    cr_expect(k <= 0, "stray %d got %zd bytes", i, k);
    close(fd);
  }
}

Test(comm, bad_arguments_are_refused_with_a_message) {
  comm_ring_opts_t o = {.rank = 0, .size = 1, .name = "solo", .listen_fd = -1};
  comm_t *c;
  cr_assert_eq(comm_ring_create(&o, &c), 0, "%s", err_msg());
  cr_assert(comm_supports(c, COMM_OP_REDUCE_SCATTER, COMM_BF16));
  cr_assert(!comm_supports(c, COMM_OP__COUNT, COMM_F32));
  float x[4] = {1, 2, 3, 4};
  cr_assert_eq(comm_broadcast(c, x, 4, COMM_F32, 1), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "root 1"), "%s", err_msg());
  cr_assert_eq(comm_all_reduce(c, NULL, x, 4, COMM_F32, COMM_SUM), FSDP_EINVAL);
  cr_assert_eq(comm_all_gather(c, x, x, SIZE_MAX / 2, COMM_F32), FSDP_EINVAL);
  cr_assert_eq(comm_all_reduce(c, x, x, 4, COMM_F32, COMM_AVG), 0);
  cr_assert_eq(x[2], 3.0f);
  comm_ring_opts_t bad = {.rank = 2, .size = 2, .listen_fd = -1};
  cr_assert_eq(comm_ring_create(&bad, &c), FSDP_EINVAL);
  comm_destroy(NULL);
}

/* ---- transports: shared memory between ranks on this host, TCP forced ---- */

/* How many shared-memory links this process has mapped (the ring maps one per
 * same-host link and unlinks the name, so /proc/self/maps is the witness). */
static int shm_links_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "/fsdpd-ring-")) n++;
  fclose(f);
  return n;
}

/* FNV-1a's step taken on 8-byte words, then on the tail's bytes: byte by
 * byte it spent a third of the transport comparison's CPU. Each step is a
 * bijection of the state, so outputs differing in one word still differ. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  size_t i = 0;
  for (uint64_t w; i + 8 <= n; i += 8) {
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

typedef struct {
  group_t g;
  int tcp_rank;  /* this rank runs with FSDP_COMM_SHM=0; -1: none; MAXR: every rank */
  int copy_rank; /* this rank runs with FSDP_COMM_CMA=0; the same */
  int reg_rank;  /* this rank's buffers are registered; the same */
} xport_arg_t;

/* What rank r runs with in a. */
static xport_t xport_of(const xport_arg_t *a, int r) {
  if (a->tcp_rank == r || a->tcp_rank == MAXR) return RING_TCP;
  return a->copy_rank == r || a->copy_rank == MAXR ? RING_COPY : RING_CMA;
}

/* Every op at sizes around and far beyond the link buffer (wrapping it many
 * times), default tunables; the hash of every output goes to the parent. */
static int child_xport(int rank, void *argp, shared_t *sh) {
  xport_arg_t *a = argp;
  const int N = a->g.n;
  xport_set(xport_of(a, rank));
  comm_ring_opts_t o = {.rank = rank, .size = N, .addrs = a->g.ptr, .name = "xport",
                        .listen_fd = a->g.lfd[rank], .timeout_ms = 20000};
  comm_t *c;
  if (comm_ring_create(&o, &c) < 0) return child_fail(sh, rank, "create: %s", err_msg());
  /* links to or from a TCP rank stay TCP; the rest are shared memory */
  int tcp_all = a->tcp_rank == MAXR, me_tcp = a->tcp_rank == rank;
  int want = tcp_all || me_tcp ? 0
                               : 2 - ((rank + 1) % N == a->tcp_rank) - ((rank - 1 + N) % N == a->tcp_rank);
  if (shm_links_mapped() != want)
    return child_fail(sh, rank, "%d shared-memory links mapped, expected %d", shm_links_mapped(),
                      want);
  /* a link reads the peer's memory when both ends allow it */
  xport_t me = xport_of(a, rank), nx = xport_of(a, (rank + 1) % N),
          pv = xport_of(a, (rank - 1 + N) % N);
  int cma = (me == RING_CMA && nx == RING_CMA) + (me == RING_CMA && pv == RING_CMA);
  if (comm_ring_cma_links(c) != cma)
    return child_fail(sh, rank, "%d links read the peer's memory, expected %d",
                      comm_ring_cma_links(c), cma);
  static const size_t counts[] = {1, 1000, 300001, (size_t)3 << 20};
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
    for (int d = 0; d < 2; d++) {
      comm_dtype_t dt = d ? COMM_BF16 : COMM_F32;
      size_t n = counts[ci], esz = comm_dtype_size(dt);
      xport_t bx = a->reg_rank == rank || a->reg_rank == MAXR ? RING_REG : RING_COPY;
      uint8_t *in = xbuf(bx, n * N * esz), *out = xbuf(bx, n * N * esz);
      if (!in || !out) return child_fail(sh, rank, "no memory");
      comm_ref_fill(in, 100 + ci, rank, 0, n * N, dt);
      if (comm_all_gather(c, in, out, n, dt) < 0) return child_fail(sh, rank, "ag: %s", err_msg());
      h = fnv(h, out, n * N * esz);
      if (comm_reduce_scatter(c, in, out, n, dt, COMM_AVG) < 0)
        return child_fail(sh, rank, "rs: %s", err_msg());
      h = fnv(h, out, n * esz);
      if (comm_all_reduce(c, in, in, n * N, dt, COMM_SUM) < 0)
        return child_fail(sh, rank, "ar: %s", err_msg());
      h = fnv(h, in, n * N * esz);
      if (comm_broadcast(c, out, n, dt, (int)(ci % (size_t)N)) < 0)
        return child_fail(sh, rank, "bc: %s", err_msg());
      h = fnv(h, out, n * esz);
      if (comm_barrier(c) < 0) return child_fail(sh, rank, "barrier: %s", err_msg());
      xfree(bx, in);
      xfree(bx, out);
    }
  snprintf(sh->s[rank].msg, sizeof sh->s[rank].msg, "%016llx", (unsigned long long)h);
  comm_destroy(c);
  return 0;
}

static void run_xport(int n, int tcp_rank, int copy_rank, int reg_rank, char hashes[MAXR][17]) {
  shared_t *sh = shared_new();
  xport_arg_t a = {.tcp_rank = tcp_rank, .copy_rank = copy_rank, .reg_rank = reg_rank};
  group_bind(&a.g, n);
  group_t *gs[] = {&a.g};
  pid_t pids[MAXR];
  spawn(pids, n, child_xport, &a, sh, gs, 1);
  assert_children(sh, pids, n, 50);
  for (int r = 0; r < n; r++) snprintf(hashes[r], 17, "%.16s", sh->s[r].msg);
}

/* Every transport and mix of them gives the same bytes as TCP, n ranks (one
 * test per n, so that Criterion runs them side by side). */
static void compare_transports(int n) {
  char cma[MAXR][17], copy[MAXR][17], tcp[MAXR][17], mixed[MAXR][17], mixed_cma[MAXR][17];
  char reg[MAXR][17], mixed_reg[MAXR][17], reg_cma[MAXR][17];
  run_xport(n, -1, -1, -1, cma);
  run_xport(n, -1, MAXR, -1, copy);
  run_xport(n, MAXR, -1, -1, tcp);
  run_xport(n, 1, -1, -1, mixed);       /* rank 1 on TCP */
  run_xport(n, -1, 1, -1, mixed_cma);   /* rank 1's links copy, the others' read */
  run_xport(n, -1, MAXR, MAXR, reg);    /* registered buffers, read in place */
  run_xport(n, -1, MAXR, 1, mixed_reg); /* rank 1's buffers registered, the others' not */
  run_xport(n, -1, 1, 0, reg_cma);      /* rank 0 registered on CMA links, rank 1 copies */
  for (int r = 0; r < n; r++) {
    cr_expect_str_eq(reg[r], tcp[r], "%d ranks, rank %d: registered and TCP differ", n, r);
    cr_expect_str_eq(mixed_reg[r], tcp[r], "%d ranks, rank %d: registered/plain and TCP differ",
                     n, r);
    cr_expect_str_eq(reg_cma[r], tcp[r], "%d ranks, rank %d: registered/CMA and TCP differ", n,
                     r);
    cr_expect_str_eq(cma[r], tcp[r], "%d ranks, rank %d: CMA and TCP outputs differ", n, r);
    cr_expect_str_eq(copy[r], tcp[r], "%d ranks, rank %d: copying shm and TCP differ", n, r);
    cr_expect_str_eq(mixed[r], tcp[r], "%d ranks, rank %d: shm/TCP mixed and TCP differ", n, r);
    cr_expect_str_eq(mixed_cma[r], tcp[r], "%d ranks, rank %d: CMA/copy mixed and TCP differ",
                     n, r);
  }
}

Test(comm, shared_memory_tcp_and_mixed_rings_give_identical_bytes_2_ranks, .timeout = 180) {
  compare_transports(2);
}

Test(comm, shared_memory_tcp_and_mixed_rings_give_identical_bytes_3_ranks, .timeout = 180) {
  compare_transports(3);
}

/* A rank killed mid-stream on shared-memory links: its neighbours sleep on
 * futexes, not sockets, and must still name it within the timeout. */
static int child_kill_shm(int rank, void *argp, shared_t *sh) {
  fault_arg_t *a = argp;
  xport_set(a->x);
  comm_ring_opts_t o = {.rank = rank, .size = a->g.n, .addrs = a->g.ptr, .name = "world",
                        .listen_fd = a->g.lfd[rank], .timeout_ms = a->timeout_ms};
  comm_t *c;
  if (comm_ring_create(&o, &c) < 0) return child_fail(sh, rank, "create: %s", err_msg());
  if (shm_links_mapped() != 2) return child_fail(sh, rank, "not on shared memory");
  if (xport_check(sh, rank, c, a->x)) return 1;
  size_t n = (size_t)4 << 20; /* 16 MiB per rank: many link buffers per op */
  float *in = xbuf(a->x, n * 4), *out = xbuf(a->x, n * (size_t)a->g.n * 4);
  memset(in, 0, n * 4);
  memset(out, 0, n * (size_t)a->g.n * 4);
  for (int it = 0;; it++) {
    int rc = it % 2 ? comm_all_gather(c, in, out, n, COMM_F32)
                    : comm_reduce_scatter(c, out, in, n, COMM_F32, COMM_SUM);
    if (rc < 0) {
      record(sh, rank, rc);
      break;
    }
    sh->s[rank].ready = 1;
    if (it > 100000) return child_fail(sh, rank, "never failed");
  }
  comm_destroy(c);
  return 0;
}

static void run_kill_shm(xport_t x) {
  for (int N = 2; N <= 3; N++) {
    shared_t *sh = shared_new();
    fault_arg_t a = {.timeout_ms = 2000, .x = x};
    const int victim = N - 1;
    group_bind(&a.g, N);
    char vaddr[80];
    snprintf(vaddr, sizeof vaddr, "rank %d (%s)", victim, a.g.addr[victim]);
    group_t *gs[] = {&a.g};
    pid_t pids[MAXR];
    spawn(pids, N, child_kill_shm, &a, sh, gs, 1);
    int64_t until = now_ns() + 15 * 1000000000ll;
    for (int r = 0; r < N; r++)
      while (!sh->s[r].ready && !sh->s[r].fail && now_ns() < until) usleep(2000);
    usleep(30000);
    sh->t_kill_ns = now_ns();
    kill(pids[victim], SIGKILL);
    waitpid(pids[victim], NULL, 0);
    pids[victim] = 0;
    int hung;
    reap(pids, N, 10, &hung);
    cr_assert(!hung, "a surviving rank did not return");
    for (int r = 0; r < N; r++) {
      if (r == victim) continue;
      cr_expect(!sh->s[r].fail, "rank %d: %s", r, sh->s[r].msg);
      double dt = (sh->s[r].t_err_ns - sh->t_kill_ns) / 1e9;
      cr_log_info("%d ranks: rank %d after %.3f s: %s", N, r, dt, sh->s[r].msg);
      cr_expect(sh->s[r].code == FSDP_EPEER, "rank %d: code %d: %s", r, sh->s[r].code,
                sh->s[r].msg);
      cr_expect(dt < a.timeout_ms / 1000.0 + 1.0, "rank %d failed %.2f s after the kill", r, dt);
      cr_expect(strstr(sh->s[r].msg, vaddr), "rank %d's error does not name %s: %s", r, vaddr,
                sh->s[r].msg);
    }
  }
}

Test(comm, killed_rank_on_shared_memory_is_named_within_timeout, .timeout = 60) {
  run_kill_shm(RING_CMA);
}

Test(comm, killed_rank_on_a_copying_link_is_named_within_timeout, .timeout = 60) {
  run_kill_shm(RING_COPY);
}

Test(comm, killed_rank_whose_buffers_are_read_in_place_is_named_within_timeout, .timeout = 60) {
  run_kill_shm(RING_REG);
}

/* A rank aborts in the middle of a large all_gather on CMA links (or with
 * registered buffers) and at once overwrites its input, as a caller may once
 * its op has failed: its peer, which reads that input directly, must fail
 * naming it, or (if it had read everything before) hold the right bytes,
 * never the overwritten ones. */
static void *abort_soon(void *p) {
  usleep(1000);
  comm_abort(p);
  return NULL;
}

static int child_abort_read(int rank, void *argp, shared_t *sh) {
  fault_arg_t *a = argp;
  xport_set(a->x);
  comm_ring_opts_t o = {.rank = rank, .size = 2, .addrs = a->g.ptr, .name = "world",
                        .listen_fd = a->g.lfd[rank], .timeout_ms = a->timeout_ms};
  comm_t *c;
  if (comm_ring_create(&o, &c) < 0) return child_fail(sh, rank, "create: %s", err_msg());
  if (xport_check(sh, rank, c, a->x)) return 1;
  const size_t n = (size_t)8 << 20; /* 32 MiB of fp32 per rank */
  float *in = xbuf(a->x, n * 4), *out = xbuf(a->x, 2 * n * 4);
  if (!in || !out) return child_fail(sh, rank, "no memory");
  comm_ref_fill(in, 55, rank, 0, n, COMM_F32);
  if (comm_barrier(c) < 0) return child_fail(sh, rank, "barrier: %s", err_msg());
  pthread_t t;
  if (rank == 0) pthread_create(&t, NULL, abort_soon, c);
  int rc = comm_all_gather(c, in, out, n, COMM_F32);
  if (rank == 0) {
    memset(in, 0x7f, n * 4); /* the caller reuses its buffer */
    pthread_join(t, NULL);
  }
  record(sh, rank, rc);
  if (rank == 1 && rc == 0 && check_exact(sh, rank, out, n, 55, 0, 0, COMM_F32, "all_gather"))
    return 1;
  comm_destroy(c);
  return 0;
}

static void run_abort_read(xport_t x) {
  for (int round = 0; round < 3; round++) {
    shared_t *sh = shared_new();
    fault_arg_t a = {.timeout_ms = 5000, .x = x};
    group_bind(&a.g, 2);
    group_t *gs[] = {&a.g};
    pid_t pids[MAXR];
    spawn(pids, 2, child_abort_read, &a, sh, gs, 1);
    assert_children(sh, pids, 2, 30);
    cr_log_info("rank 0: %s", sh->s[0].msg);
    cr_log_info("rank 1: %s", sh->s[1].msg);
    cr_expect(sh->s[1].code == 0 || (sh->s[1].code == FSDP_EPEER && strstr(sh->s[1].msg, "rank 0")),
              "rank 1: code %d: %s", sh->s[1].code, sh->s[1].msg);
    if (sh->s[1].code == 0) cr_expect_eq(sh->s[0].code, 0, "rank 0 failed alone: %s", sh->s[0].msg);
  }
}

Test(comm, abort_while_the_peer_reads_its_memory_never_delivers_reused_bytes, .timeout = 60) {
  run_abort_read(RING_CMA);
}

Test(comm, abort_while_the_peer_reads_its_registered_buffer_never_delivers_reused_bytes,
     .timeout = 60) {
  run_abort_read(RING_REG);
}

/* ---- registered memory (reg.c) ---- */

Test(reg, buffers_are_accounted_found_and_reused_by_size) {
  const size_t before = mem_current(MEM_COMM), bytes = 100000;
  uint8_t *p = comm_reg_alloc(MEM_COMM, bytes, "test");
  cr_assert(p);
  cr_expect_eq(mem_current(MEM_COMM) - before, bytes, "accounted as requested");
  cr_expect_eq((uintptr_t)p % 64, 0);
  comm_reg_seg_t g;
  cr_expect(comm_reg_find(p + 10, bytes - 10, &g) && g.base == p && g.bytes >= bytes);
  cr_expect(!comm_reg_find(p, g.bytes + 1, &g), "a range past the segment is not in it");
  int x;
  cr_expect(!comm_reg_find(&x, sizeof x, &g), "the stack is not registered");
  memset(p, 0xab, bytes);
  comm_reg_free(p);
  cr_expect_eq(mem_current(MEM_COMM), before);
  cr_expect(!comm_reg_find(p, 1, &g), "a freed buffer is not registered");
  uint8_t *q = comm_reg_calloc(MEM_COMM, bytes, "test");
  cr_expect_eq(q, p, "the kept segment of that size is reused");
  size_t nonzero = 0;
  for (size_t i = 0; i < bytes; i++) nonzero += q[i] != 0;
  cr_expect_eq(nonzero, 0, "%zu bytes of a reused calloc are not 0", nonzero);
  comm_reg_free(q);
  comm_reg_trim();
}

Test(reg, off_switch_gives_plain_memory) {
  pid_t p = fork();
  cr_assert(p >= 0);
  if (p == 0) { /* the parameter is read once per process */
    setenv("FSDP_COMM_REG", "0", 1);
    void *b = comm_reg_alloc(MEM_COMM, 8192, "test");
    comm_reg_seg_t g, pr;
    uint64_t tok;
    int bad = !b || comm_reg_find(b, 1, &g) || comm_reg_probe(&pr, &tok) == 0;
    comm_reg_free(b);
    _exit(bad);
  }
  int st;
  waitpid(p, &st, 0);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "FSDP_COMM_REG=0 still registered a buffer");
}

/* A peer process maps a segment by its descriptor, and refuses a descriptor
 * that names another segment (a number reused after a free). */
Test(reg, a_peer_maps_a_segment_and_refuses_a_stale_name, .timeout = 20) {
  int tx[2], go[2];
  cr_assert(pipe(tx) == 0 && pipe(go) == 0);
  pid_t p = fork();
  cr_assert(p >= 0);
  if (p == 0) {
    uint64_t *b = comm_reg_alloc(MEM_COMM, 1 << 20, "test");
    for (size_t i = 0; i < (1 << 20) / 8; i++) b[i] = i * 0x9e3779b97f4a7c15ull;
    comm_reg_seg_t g;
    if (!comm_reg_find(b, 8, &g)) _exit(2);
    if (write(tx[1], &g, sizeof g) != sizeof g) _exit(3);
    char c;
    if (read(go[0], &c, 1) != 1) _exit(4); /* until the parent has read it */
    comm_reg_free(b);
    comm_reg_trim(); /* the descriptor is closed: its number may name something else */
    uint64_t *b2 = comm_reg_alloc(MEM_COMM, 1 << 20, "test");
    if (!comm_reg_find(b2, 8, &g) || write(tx[1], &g, sizeof g) != sizeof g) _exit(5);
    if (read(go[0], &c, 1) != 1) _exit(6);
    _exit(0);
  }
  comm_reg_seg_t g, g2;
  cr_assert_eq(read(tx[0], &g, sizeof g), (ssize_t)sizeof g);
  comm_reg_peer_t *pp = comm_reg_peer_open(p);
  const uint64_t *m = (const uint64_t *)comm_reg_peer_map(pp, g.id, g.fd, 1 << 20);
  cr_assert(m, "mapping the child's segment: %s", err_msg());
  for (size_t i = 0; i < (1 << 20) / 8; i += 4099)
    cr_expect_eq(m[i], i * 0x9e3779b97f4a7c15ull, "word %zu", i);
  cr_expect(!comm_reg_peer_map(pp, g.id, g.fd, (1 << 20) + 1 + g.bytes), "past its end");
  cr_assert_eq(write(go[1], "x", 1), 1);
  cr_assert_eq(read(tx[0], &g2, sizeof g2), (ssize_t)sizeof g2);
  cr_expect_neq(g2.id, g.id);
  cr_expect_eq(g2.fd, g.fd, "the test needs the number reused");
  cr_expect(!comm_reg_peer_map(pp, g.id, g.fd, 8), "a reused number taken for the old segment");
  cr_expect(strstr(err_msg(), "not registered segment"), "%s", err_msg());
  cr_expect(comm_reg_peer_map(pp, g2.id, g2.fd, 8), "the new segment: %s", err_msg());
  cr_assert_eq(write(go[1], "x", 1), 1);
  int st;
  waitpid(p, &st, 0);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exit %d", WEXITSTATUS(st));
  comm_reg_peer_close(pp);
}

Test(reg, a_forked_child_does_not_own_its_parents_segments) {
  uint8_t *b = comm_reg_calloc(MEM_COMM, 4096, "test");
  cr_assert(b);
  pid_t p = fork();
  cr_assert(p >= 0);
  if (p == 0) {
    comm_reg_seg_t g;
    if (comm_reg_find(b, 1, &g)) _exit(1);
    uint8_t *c = comm_reg_alloc(MEM_COMM, 4096, "test"); /* never the parent's pages */
    if (!c) _exit(2);
    memset(c, 0x5a, 4096);
    _exit(0);
  }
  int st;
  waitpid(p, &st, 0);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child saw its parent's segment as its own");
  size_t changed = 0;
  for (size_t i = 0; i < 4096; i++) changed += b[i] != 0;
  cr_expect_eq(changed, 0, "the child wrote %zu bytes of its parent's buffer", changed);
  comm_reg_free(b);
}

/* Freed segments are kept for reuse, but never more bytes of them than the
 * most ever in use at once. */
Test(reg, kept_segments_stay_within_the_peak_in_use) {
  comm_reg_trim();
  const size_t base = comm_reg_mapped(), mib = 1 << 20;
  void *a = comm_reg_alloc(MEM_COMM, mib, "test");
  comm_reg_free(a);
  cr_expect_eq(comm_reg_mapped() - base, mib, "a freed segment is kept");
  void *b = comm_reg_alloc(MEM_COMM, 2 * mib, "test"); /* no 2 MiB kept: a new one */
  cr_expect_eq(comm_reg_mapped() - base, 3 * mib);
  comm_reg_free(b); /* 3 MiB kept over a 2 MiB peak: the older 1 MiB goes */
  cr_expect_eq(comm_reg_mapped() - base, 2 * mib);
  void *c = comm_reg_alloc(MEM_COMM, 2 * mib, "test");
  cr_expect_eq(c, b, "the kept 2 MiB segment is reused");
  void *d = comm_reg_alloc(MEM_COMM, mib, "test"); /* peak 3 MiB */
  comm_reg_free(c);
  comm_reg_free(d);
  cr_expect_eq(comm_reg_mapped() - base, 3 * mib, "both kept: within the 3 MiB peak");
  comm_reg_trim();
  cr_expect_eq(comm_reg_mapped(), base);
}

/* test_nccl: the NCCL backend (daemon/comm/nccl.c) on one GPU, at world
 * size 1, through the comm_* front as the trainer calls it.
 *
 *  - conformance, as tests/unit/test_comm.c checks the ring: every op x dtype
 *    (f32, bf16) x reduction, out of place and in place, counts 0, 1, odd and
 *    over 2^24, buffers in device memory; the expectations are float64 sums
 *    of one rank (so the input, exactly: compared bit for bit), copies for
 *    gathers and broadcasts, and the bytes past each output untouched;
 *  - the table (supports, buffer_bytes, names), create's argument checks,
 *    split with color 0 (a working group of one) and color -1 (no group);
 *  - ordering: an op issued behind a kernel that holds the compute stream
 *    stays pending (wait with a bound returns COMM_PENDING), and once the
 *    kernel ends it sees what the compute stream wrote before the issue;
 *  - failures: an op that cannot start (its compute stream held) ends with
 *    FSDP_ETIMEDOUT within its timeout + slack and leaves the communicator
 *    broken (later issues fail at once, same code); comm_abort from another
 *    thread ends pending ops with FSDP_ECANCELED promptly (timed); destroy
 *    returns at once with the GPU held; a world of 2 that rank 1 never joins
 *    fails create with FSDP_ETIMEDOUT within its bound; the aborts running in
 *    the background finish once the GPU is released (comm_nccl_quiesce), and
 *    the world still works after all that.
 *
 * Figures, printed and not bounded: how late a wait that began before its op
 * could run wakes after the op completes (its polls), and the device memory
 * NCCL takes for the world of 1 (cudaMemGetInfo around its creation) against
 * what the memory plan counts for it (daemon/comm/nccl_size.h).
 *
 * The held stream: tests/cuda/nccl_spin.cu's kernel, waiting for a flag in
 * mapped pinned memory that the host sets only after the checks (or the
 * watchdog sets when a phase runs far past its bound, which fails the test
 * but lets it report). One line per check; exit 0 when all pass or there is
 * no GPU (skipped), 1 when a check failed, 2 when the setup itself failed. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "daemon/comm/comm.h"
#include "daemon/comm/nccl.h"
#include "daemon/comm/nccl_size.h"
#include "daemon/common/err.h"
#include "daemon/common/rng.h"
#include "kernels/kern_math.h"
#include "tests/cuda/check.h"

/* tests/cuda/nccl_spin.cu */
int nccl_spin_start(const volatile int *dev_flag, void *stream, long long cap_ms);

#define SLACK_MS 1500          /* a timeout ends within its bound + this */
#define ABORT_BOUND_MS 500     /* comm_abort -> wait returns within this */
#define DESTROY_BOUND_MS 1000  /* destroy with the GPU held returns within this */
#define SPIN_CAP_MS 120000     /* the spin kernel ends by itself after this */
#define PAD 64                 /* elements past each output that must stay untouched */
#define BIG ((size_t)(1u << 24) + 3)

static atomic_int watchdog_fired;
static cudaStream_t cs; /* the compute stream */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}


/* ---- the held streams ------------------------------------------------------- */

typedef struct {
  volatile int *host; /* mapped pinned memory */
  int *dev;
} flag_t;

static flag_t flags[2];

static void flag_release(flag_t *f) {
  if (!f->host) return;
  *f->host = 1;
  __sync_synchronize();
}

static void release_all(void) {
  for (int i = 0; i < 2; i++) flag_release(&flags[i]);
}

/* Setup failures end the test (exit 2), first letting the GPU go. */
static void cu_fatal(cudaError_t e, const char *call, int line) {
  fprintf(stderr, "test_nccl: line %d: %s: %s (%s)\n", line, call, cudaGetErrorString(e),
          cudaGetErrorName(e));
  release_all();
  exit(2);
}
#define CU(call)                                   \
  do {                                             \
    cudaError_t e_ = (call);                       \
    if (e_ != cudaSuccess) cu_fatal(e_, #call, __LINE__); \
  } while (0)

static void flag_init(flag_t *f) {
  void *h, *d;
  CU(cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped));
  CU(cudaHostGetDevicePointer(&d, h, 0));
  f->host = h;
  f->dev = d;
  *f->host = 0;
}

static void hold(flag_t *f) {
  *f->host = 0;
  __sync_synchronize();
  CU((cudaError_t)nccl_spin_start(f->dev, cs, SPIN_CAP_MS));
}

/* Waits (bounded) for the compute stream to drain once its kernel is released. */
static int drain(double bound_ms) {
  double t0 = now_ms();
  for (;;) {
    cudaError_t e = cudaStreamQuery(cs);
    if (e == cudaSuccess) return 1;
    if (e != cudaErrorNotReady) cu_fatal(e, "cudaStreamQuery", __LINE__);
    if (now_ms() - t0 > bound_ms) return 0;
    usleep(1000);
  }
}

/* The watchdog: a phase far past its bound (a hang, not a slow check) gets
 * the held streams released, so the run goes on and reports. */
static const char *volatile phase = "start";
static volatile double phase_deadline = 1e300;

static void phase_set(const char *name, double bound_ms) {
  phase = name;
  phase_deadline = now_ms() + bound_ms;
  printf("-- %s\n", name);
  fflush(stdout);
}

static void *watchdog(void *arg) {
  (void)arg;
  for (;;) {
    usleep(100000);
    if (now_ms() > phase_deadline) {
      printf("WATCHDOG: phase '%s' is far past its bound: releasing the held streams\n", phase);
      fflush(stdout);
      atomic_store(&watchdog_fired, 1);
      release_all();
      phase_deadline = now_ms() + 60000;
    }
  }
  return NULL;
}

/* ---- data --------------------------------------------------------------------- */

static uint64_t seed_state = 12345;

/* n random elements of dt into h (f32, or bf16 from rounded f32), in [-1, 1). */
static void fill(void *h, size_t n, comm_dtype_t dt) {
  for (size_t i = 0; i < n; i++) {
    float f = (float)(rng_unit(rng_next(&seed_state)) * 2.0 - 1.0);
    if (dt == COMM_F32) ((float *)h)[i] = f;
    else ((uint16_t *)h)[i] = kern_f32_to_bf16(f);
  }
}

static double get(const void *h, size_t i, comm_dtype_t dt) {
  return dt == COMM_F32 ? ((const float *)h)[i] : kern_bf16_to_f32(((const uint16_t *)h)[i]);
}

/* got[i] == the float64 expectation (one rank: the input itself, for a sum,
 * an average or a copy) and the same bits; then PAD elements of 0xa5 bytes. */
static int same(const void *got, const void *want, size_t n, comm_dtype_t dt, char *why,
                size_t wn) {
  size_t esz = comm_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    double exact = get(want, i, dt); /* sum over 1 rank; / 1 for the average */
    if (get(got, i, dt) != exact || memcmp((const char *)got + i * esz,
                                           (const char *)want + i * esz, esz)) {
      snprintf(why, wn, "element %zu: got %.9g, float64 reference %.9g", i, get(got, i, dt),
               exact);
      return 0;
    }
  }
  const unsigned char *p = (const unsigned char *)got + n * esz;
  for (size_t b = 0; b < PAD * esz; b++)
    if (p[b] != 0xa5) {
      snprintf(why, wn, "byte %zu past the %zu elements was written (0x%02x)", b, n, p[b]);
      return 0;
    }
  return 1;
}

static int expect_code(int rc, int want, const char *what, double ms) {
  return check(rc == want, "%s: %s (%.0f ms): %s", what, err_name(rc), ms,
               rc < 0 ? err_msg() : "no error");
}

/* ---- conformance ---------------------------------------------------------------- */

typedef struct {
  comm_t *c;
  void *d_a, *d_b;  /* device, BIG + PAD elements of 4 bytes */
  void *h_in, *h_out;
} bufs_t;

/* Runs a (issue + wait, polling with wait 0 when poll), returns the code. */
static int run(comm_t *c, const comm_args_t *a, int poll) {
  if (!poll) return comm_run(c, a);
  comm_req_t *req;
  int rc = comm_issue(c, a, &req);
  if (rc < 0) return rc;
  double t0 = now_ms();
  while ((rc = comm_wait(req, 0)) == COMM_PENDING) {
    if (now_ms() - t0 > 60000) return comm_wait(req, -1);
    usleep(100);
  }
  return rc;
}

static void conform_one(bufs_t *b, comm_op_t op, comm_dtype_t dt, comm_redop_t ro, size_t n,
                        int inplace) {
  const size_t esz = comm_dtype_size(dt);
  char what[160], why[256] = "";
  snprintf(what, sizeof what, "%s %s%s%s n=%zu%s", comm_op_name(op), comm_dtype_name(dt),
           op == COMM_OP_REDUCE_SCATTER || op == COMM_OP_ALL_REDUCE ? " " : "",
           op == COMM_OP_REDUCE_SCATTER || op == COMM_OP_ALL_REDUCE
               ? (ro == COMM_AVG ? "avg" : "sum") : "",
           n, inplace ? " in place" : "");
  fill(b->h_in, n, dt);
  /* the output: 0xa5 everywhere, then the input where the op works in place */
  CU(cudaMemset(b->d_b, 0xa5, (n + PAD) * esz));
  void *src = b->d_a;
  if (inplace || op == COMM_OP_BROADCAST) {
    CU(cudaMemcpy(b->d_b, b->h_in, n * esz, cudaMemcpyHostToDevice));
    src = b->d_b;
  } else {
    CU(cudaMemcpy(b->d_a, b->h_in, n * esz, cudaMemcpyHostToDevice));
  }
  comm_args_t a = {.op = op, .dtype = dt, .redop = ro, .send = src, .recv = b->d_b, .count = n,
                   .root = 0};
  int poll = op == COMM_OP_ALL_REDUCE && !inplace;
  double t0 = now_ms();
  int rc = run(b->c, &a, poll);
  double ms = now_ms() - t0;
  if (rc != 0) {
    check(0, "%s: %s: %s", what, err_name(rc), err_msg());
    return;
  }
  CU(cudaMemcpy(b->h_out, b->d_b, (n + PAD) * esz, cudaMemcpyDeviceToHost));
  int ok = same(b->h_out, b->h_in, n, dt, why, sizeof why);
  check(ok, "%s: %s (%.1f ms%s)", what, ok ? "exact" : why, ms, poll ? ", polled" : "");
}

static void conformance(bufs_t *b) {
  static const size_t counts[] = {0, 1, 37, 4099, BIG};
  for (int d = 0; d < 2; d++) {
    comm_dtype_t dt = d ? COMM_BF16 : COMM_F32;
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      size_t n = counts[ci];
      for (int ip = 0; ip < 2; ip++) conform_one(b, COMM_OP_ALL_GATHER, dt, COMM_SUM, n, ip);
      for (int r = 0; r < 2; r++) {
        comm_redop_t ro = r ? COMM_AVG : COMM_SUM;
        conform_one(b, COMM_OP_REDUCE_SCATTER, dt, ro, n, 0);
        for (int ip = 0; ip < 2; ip++) conform_one(b, COMM_OP_ALL_REDUCE, dt, ro, n, ip);
      }
      conform_one(b, COMM_OP_BROADCAST, dt, COMM_SUM, n, 1);
    }
  }
  int rc = comm_barrier(b->c);
  check(rc == 0, "barrier: %s", rc ? err_msg() : "ok");
  comm_req_t *req;
  rc = comm_ibarrier(b->c, &req);
  if (rc == 0) rc = comm_wait(req, 10000);
  check(rc == 0, "ibarrier + wait(10 s): %s", rc ? err_msg() : "ok");
}

/* ---- host buffers (comm.h: up to COMM_HOST_BYTES, staged) ------------------------ */

/* The runtime's control values (a loss, a gradient norm, a checkpoint's
 * choice) are host floats: every op takes them, in and out of place; one too
 * large for the staging buffer is refused with a message that says so, and
 * the group stays whole (a group of its own, all the same). */
static void host_buffers(bufs_t *b) {
  static const comm_op_t ops[] = {COMM_OP_ALL_REDUCE, COMM_OP_ALL_GATHER, COMM_OP_REDUCE_SCATTER,
                                  COMM_OP_BROADCAST};
  for (int d = 0; d < 2; d++)
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++)
      for (int inplace = 0; inplace < 2; inplace++) {
        const comm_dtype_t dt = d ? COMM_BF16 : COMM_F32;
        const comm_op_t op = ops[k];
        if (inplace && op == COMM_OP_BROADCAST) continue; /* it is */
        uint8_t in[64], out[64 + PAD * sizeof(float)]; /* same() reads PAD elements past n */
        const size_t n = 13;
        fill(in, n, dt);
        memset(out, 0xa5, sizeof out);
        if (inplace || op == COMM_OP_BROADCAST) memcpy(out, in, n * comm_dtype_size(dt));
        comm_args_t a = {.op = op, .dtype = dt, .redop = COMM_SUM,
                         .send = inplace ? (void *)out : (void *)in, .recv = out, .count = n};
        int rc = comm_run(b->c, &a);
        char why[256] = "";
        int ok = rc == 0 && same(out, in, n, dt, why, sizeof why);
        for (size_t i = n * comm_dtype_size(dt); ok && i < sizeof out; i++) ok = out[i] == 0xa5;
        check(ok, "%s %s n=%zu on host buffers%s: %s", comm_op_name(op), comm_dtype_name(dt), n,
              inplace ? " in place" : "", rc ? err_msg() : ok ? "exact" : why[0] ? why : "wrote past its end");
      }
  comm_t *g = NULL;
  int rc = comm_split(b->c, 0, 0, "big-host", 0, &g);
  if (!check(rc == 0 && g, "split for the refusal: %s", rc ? err_msg() : "ok")) return;
  static float big[COMM_HOST_BYTES / sizeof(float)];
  rc = comm_all_reduce(g, big, big, COMM_HOST_BYTES / sizeof(float), COMM_F32, COMM_SUM);
  check(rc == FSDP_EINVAL && strstr(err_msg(), "pass device memory"),
        "all_reduce of %d host bytes each way: %s: %s", COMM_HOST_BYTES, err_name(rc), err_msg());
  float one = 2.5f;
  rc = comm_all_reduce(g, &one, &one, 1, COMM_F32, COMM_SUM);
  check(rc == 0 && one == 2.5f, "after the refusal the group still works: %s",
        rc ? err_msg() : "ok");
  comm_destroy(g);
}

/* ---- the table, create's checks, split ---------------------------------------- */

static void table(comm_t *w, const uint8_t *id) {
  const comm_backend_t *be = comm_backend(w);
  int all = 1;
  for (int op = 0; op < COMM_OP__COUNT; op++)
    for (int d = 0; d < COMM_DTYPE__COUNT; d++)
      all &= comm_supports(w, (comm_op_t)op, (comm_dtype_t)d) == 1;
  check(all, "supports: every op on f32 and bf16");
  check(!strcmp(be->name, "nccl") && comm_size(w) == 1 && comm_rank(w) == 0 &&
            !strcmp(comm_name(w), "world"),
        "world: backend %s, rank %d of %d, name '%s'", be->name, comm_rank(w), comm_size(w),
        comm_name(w));
  size_t b1 = comm_buffer_bytes(be, 1), b8 = comm_buffer_bytes(be, 8);
  check(b1 == 0 && b8 > 0, "buffer_bytes: %zu for 1 rank, %zu MiB for 8", b1, b8 >> 20);

  comm_t *x = NULL;
  struct {
    comm_nccl_opts_t o;
    const char *what;
  } bad[] = {
      {{.rank = 1, .size = 1, .id = id, .name = "bad"}, "rank 1 of size 1"},
      {{.rank = -1, .size = 2, .id = id, .name = "bad"}, "rank -1"},
      {{.rank = 0, .size = 0, .id = id, .name = "bad"}, "size 0"},
      {{.rank = 0, .size = 1, .id = NULL, .name = "bad"}, "NULL id"},
      {{.rank = 0, .size = 1, .id = id, .name = "bad", .timeout_ms = -5}, "negative timeout"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = comm_nccl_create(&bad[i].o, &x);
    check(rc == FSDP_EINVAL && !x, "create with %s: %s: %s", bad[i].what, err_name(rc), err_msg());
  }
  int rc = comm_nccl_create(NULL, &x);
  check(rc == FSDP_EINVAL && !x, "create with NULL options: %s", err_name(rc));
  rc = comm_broadcast(w, NULL, 0, COMM_F32, 1);
  check(rc == FSDP_EINVAL, "broadcast from root 1 of 1 (the front refuses): %s", err_name(rc));
}

static void split(bufs_t *b) {
  comm_t *w = b->c, *sh = NULL, *none = (comm_t *)1;
  double t0 = now_ms();
  int rc = comm_split(w, 0, 0, "shard", 0, &sh);
  check(rc == 0 && sh && comm_size(sh) == 1 && comm_rank(sh) == 0 &&
            !strcmp(comm_name(sh), "shard") && comm_backend(sh) == comm_backend(w),
        "split color 0: %s (%.0f ms)%s%s", rc ? err_name(rc) : "a group of 1", now_ms() - t0,
        rc ? ": " : "", rc ? err_msg() : "");
  if (sh) {
    bufs_t s = *b;
    s.c = sh;
    conform_one(&s, COMM_OP_ALL_REDUCE, COMM_F32, COMM_SUM, 1000, 0);
    conform_one(&s, COMM_OP_ALL_GATHER, COMM_BF16, COMM_SUM, 1001, 0);
    t0 = now_ms();
    comm_destroy(sh);
    check(1, "split group destroyed (%.0f ms)", now_ms() - t0);
  }
  rc = comm_split(w, -1, 0, "none", 0, &none);
  check(rc == 0 && none == NULL, "split color -1: %s, out %s", rc ? err_msg() : "ok",
        none ? "set" : "NULL");
  rc = comm_barrier(w);
  check(rc == 0, "world after the splits: %s", rc ? err_msg() : "ok");
}

/* ---- failures ------------------------------------------------------------------ */

static comm_t *make(const char *name, int64_t timeout_ms) {
  uint8_t id[COMM_NCCL_ID_BYTES];
  comm_t *c = NULL;
  int rc = comm_nccl_unique_id(id);
  if (rc == 0) {
    comm_nccl_opts_t o = {.rank = 0, .size = 1, .id = id, .name = name, .timeout_ms = timeout_ms,
                          .stream = cs};
    rc = comm_nccl_create(&o, &c);
  }
  if (rc) {
    fprintf(stderr, "test_nccl: cannot make group '%s': %s\n", name, err_msg());
    release_all();
    exit(2);
  }
  return c;
}

static void create_timeout(void) {
  uint8_t id[COMM_NCCL_ID_BYTES];
  int rc = comm_nccl_unique_id(id);
  if (!check(rc == 0, "unique id for a world of 2: %s", rc ? err_msg() : "ok")) return;
  comm_nccl_opts_t o = {.rank = 0, .size = 2, .id = id, .name = "lonely", .timeout_ms = 2000,
                        .stream = cs};
  comm_t *c = (comm_t *)1;
  double t0 = now_ms();
  rc = comm_nccl_create(&o, &c);
  double ms = now_ms() - t0;
  expect_code(rc, FSDP_ETIMEDOUT, "create of a world of 2 that rank 1 never joins", ms);
  check(c == NULL, "failed create leaves out NULL");
  check(ms >= 1990 && ms <= 2000 + SLACK_MS, "create gave up after %.0f ms (timeout 2000, slack %d)",
        ms, SLACK_MS);
  check(strstr(err_msg(), "lonely") && strstr(err_msg(), "2 ranks") &&
            strstr(err_msg(), "never joined"),
        "its message names the group, its size and the ranks that never joined");
  t0 = now_ms();
  rc = comm_nccl_quiesce(20000);
  check(rc == 0, "the abort of the stuck join ended (%.0f ms)", now_ms() - t0);
}

/* Ordering: an op behind a held compute stream is pending; released, it
 * sees the bytes the compute stream wrote before the issue. */
static void ordering(bufs_t *b) {
  enum { N = 4099 };
  float *hp, *hq;
  CU(cudaHostAlloc((void **)&hp, N * sizeof(float), cudaHostAllocDefault));
  CU(cudaHostAlloc((void **)&hq, N * sizeof(float), cudaHostAllocDefault));
  for (int i = 0; i < N; i++) hp[i] = (float)i + 0.25f, hq[i] = -1;
  hold(&flags[0]);
  CU(cudaMemcpyAsync(b->d_a, hp, N * sizeof(float), cudaMemcpyHostToDevice, cs));
  comm_req_t *req;
  int rc = comm_iall_reduce(b->c, b->d_a, b->d_b, N, COMM_F32, COMM_SUM, &req);
  check(rc == 0, "all_reduce issued behind a held compute stream: %s", rc ? err_msg() : "ok");
  if (rc == 0) {
    double t0 = now_ms();
    rc = comm_wait(req, 300);
    double ms = now_ms() - t0;
    check(rc == COMM_PENDING && ms >= 290 && ms < 300 + SLACK_MS,
          "wait(300 ms) while held: %s after %.0f ms", rc == COMM_PENDING ? "pending" : err_msg(),
          ms);
    flag_release(&flags[0]);
    if (rc == COMM_PENDING) {
      t0 = now_ms();
      rc = comm_wait(req, -1);
      check(rc == 0, "released: wait: %s (%.0f ms)", rc ? err_msg() : "done", now_ms() - t0);
    }
    CU(cudaMemcpyAsync(hq, b->d_b, N * sizeof(float), cudaMemcpyDeviceToHost, cs));
    check(drain(10000), "compute stream drained");
    int ok = 1;
    for (int i = 0; i < N && ok; i++) ok = hq[i] == hp[i];
    check(ok, "the op saw what the compute stream wrote before it, and the compute stream "
          "saw its result");
  }
  flag_release(&flags[0]);
  CU(cudaFreeHost(hp));
  CU(cudaFreeHost(hq));
}

/* Releases flags[0] after delay_ms, noting when. */
typedef struct {
  int delay_ms;
  double t_release;
} releaser_t;

static void *releaser(void *arg) {
  releaser_t *r = arg;
  usleep((useconds_t)r->delay_ms * 1000);
  r->t_release = now_ms();
  flag_release(&flags[0]);
  return NULL;
}

/* A figure: a wait that began 3 ms before its op could run (the compute
 * stream held, then released from another thread) returns this long after
 * the release (the kernel's end, the op, and the wait's last poll). */
static void wake_latency(bufs_t *b) {
  enum { N = 1024, DELAY_MS = 3, REPS = 5 };
  double worst = 0, sum = 0;
  int done = 0;
  for (int r = 0; r < REPS; r++) {
    hold(&flags[0]);
    comm_req_t *req;
    if (comm_iall_reduce(b->c, b->d_a, b->d_b, N, COMM_F32, COMM_SUM, &req)) break;
    releaser_t rel = {.delay_ms = DELAY_MS};
    pthread_t th;
    if (pthread_create(&th, NULL, releaser, &rel)) {
      flag_release(&flags[0]);
      comm_wait(req, -1);
      break;
    }
    const int rc = comm_wait(req, -1);
    const double t = now_ms();
    pthread_join(th, NULL);
    if (rc) break;
    const double late = t - rel.t_release;
    sum += late, done++;
    if (late > worst) worst = late;
  }
  flag_release(&flags[0]);
  check(done == REPS, "the waits behind a held stream completed (%d of %d)", done, REPS);
  printf("figure: a wait issued %d ms before its op could run returned %.0f us after the "
         "release on average, %.0f us at worst (%d runs)\n", DELAY_MS,
         done ? sum / done * 1e3 : 0.0, worst * 1e3, done);
}

typedef struct {
  comm_t *c;
  int delay_ms;
  double t_abort, t_done;
} aborter_t;

static void *aborter(void *arg) {
  aborter_t *a = arg;
  usleep((useconds_t)a->delay_ms * 1000);
  a->t_abort = now_ms();
  comm_abort(a->c);
  a->t_done = now_ms();
  return NULL;
}

static void failures(bufs_t *b) {
  comm_t *t = make("T", 0), *ab = make("A", 60000), *d = make("D", 60000);
  hold(&flags[1]);
  phase_set("timeout of an op that cannot start", 30000);
  /* T: the op's own timeout. Every op queued while the stream is held is a
   * copy at one rank (no kernel: a kernel CUDA has not loaded yet could need
   * a context synchronisation to load, which the held stream would block). */
  comm_args_t a = {.op = COMM_OP_ALL_REDUCE, .dtype = COMM_BF16, .redop = COMM_SUM,
                   .send = b->d_a, .recv = b->d_b, .count = 1025, .timeout_ms = 1000};
  comm_req_t *req;
  double t0 = now_ms();
  int rc = comm_issue(t, &a, &req);
  check(rc == 0, "T: issue with a 1000 ms timeout: %s", rc ? err_msg() : "ok");
  if (rc == 0) {
    rc = comm_wait(req, -1);
    double ms = now_ms() - t0;
    expect_code(rc, FSDP_ETIMEDOUT, "T: wait", ms);
    check(ms >= 990 && ms <= 1000 + SLACK_MS, "T: timed out after %.0f ms (timeout 1000, slack %d)",
          ms, SLACK_MS);
    check(strstr(err_msg(), "'T'") && strstr(err_msg(), "all_reduce") &&
              strstr(err_msg(), "bf16") && strstr(err_msg(), "1025") &&
              strstr(err_msg(), "1000 ms"),
          "T: the message names the group, op, dtype, count and timeout");
  }
  t0 = now_ms();
  rc = comm_all_gather(t, b->d_a, b->d_b, 8, COMM_F32);
  double ms = now_ms() - t0;
  expect_code(rc, FSDP_ETIMEDOUT, "T broken: a later all_gather fails at once", ms);
  check(ms < 100 && strstr(err_msg(), "broken"), "T: at once (%.1f ms), saying it is broken", ms);
  rc = comm_ibarrier(t, &req);
  expect_code(rc, FSDP_ETIMEDOUT, "T broken: a later barrier", 0);
  comm_t *sub = NULL;
  rc = comm_split(t, 0, 0, "T2", 0, &sub);
  expect_code(rc, FSDP_ETIMEDOUT, "T broken: split", 0);

  phase_set("comm_abort from another thread", 30000);
  comm_req_t *r1 = NULL, *r2 = NULL;
  int rc1 = comm_iall_gather(ab, b->d_a, b->d_b, 1024, COMM_F32, &r1);
  int rc2 = comm_ireduce_scatter(ab, b->d_a, b->d_b, 1024, COMM_BF16, COMM_SUM, &r2);
  check(rc1 == 0 && rc2 == 0, "A: two ops issued behind the held stream: %s",
        rc1 || rc2 ? err_msg() : "ok");
  if (rc1 == 0 && rc2 == 0) {
    aborter_t ar = {.c = ab, .delay_ms = 300};
    pthread_t th;
    if (pthread_create(&th, NULL, aborter, &ar) != 0) {
      check(0, "A: cannot start the aborting thread");
    } else {
      rc = comm_wait(r1, -1);
      double t_ret = now_ms();
      pthread_join(th, NULL);
      expect_code(rc, FSDP_ECANCELED, "A: first op after comm_abort", t_ret - ar.t_abort);
      check(t_ret >= ar.t_abort && t_ret - ar.t_abort <= ABORT_BOUND_MS,
            "A: the waiter returned %.1f ms after comm_abort (bound %d)", t_ret - ar.t_abort,
            ABORT_BOUND_MS);
      check(ar.t_done - ar.t_abort <= ABORT_BOUND_MS, "A: comm_abort itself took %.1f ms",
            ar.t_done - ar.t_abort);
      t0 = now_ms();
      rc = comm_wait(r2, -1);
      expect_code(rc, FSDP_ECANCELED, "A: the second op, queued behind it", now_ms() - t0);
    }
  }
  t0 = now_ms();
  rc = comm_barrier(ab);
  expect_code(rc, FSDP_ECANCELED, "A: an issue after the abort fails at once", now_ms() - t0);

  phase_set("destroy with the GPU held", 30000);
  rc = comm_iall_reduce(d, b->d_a, b->d_b, 64, COMM_F32, COMM_SUM, &req);
  check(rc == 0, "D: op issued behind the held stream, never waited: %s", rc ? err_msg() : "ok");
  comm_t *cs3[3] = {t, ab, d};
  const char *nm[3] = {"T (timed out)", "A (aborted)", "D (op running)"};
  for (int i = 0; i < 3; i++) {
    t0 = now_ms();
    comm_destroy(cs3[i]);
    ms = now_ms() - t0;
    check(ms <= DESTROY_BOUND_MS, "destroy %s returned in %.1f ms with the GPU held", nm[i], ms);
  }

  phase_set("release and background aborts", 60000);
  flag_release(&flags[1]);
  check(drain(10000), "compute stream drained after the release");
  t0 = now_ms();
  rc = comm_nccl_quiesce(20000);
  check(rc == 0, "the background aborts ended %.0f ms after the release", now_ms() - t0);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  setenv("NCCL_DEBUG", "WARN", 0);
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    printf("test_nccl: no GPU (%s): skipped\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 0;
  }
  CU(cudaSetDevice(0));
  struct cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, 0));
  int ver = 0;
  CU(cudaRuntimeGetVersion(&ver));
  printf("test_nccl: %s, CUDA runtime %d\n", prop.name, ver);
  CU(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  flag_init(&flags[0]);
  flag_init(&flags[1]);
  pthread_t wd;
  if (pthread_create(&wd, NULL, watchdog, NULL) == 0) pthread_detach(wd);

  phase_set("world", 60000);
  uint8_t id[COMM_NCCL_ID_BYTES];
  int rc = comm_nccl_unique_id(id);
  if (!check(rc == 0, "unique id: %s", rc ? err_msg() : "ok")) return 1;
  comm_t *w = NULL;
  comm_nccl_opts_t o = {.rank = 0, .size = 1, .id = id, .name = "world", .timeout_ms = 30000,
                        .stream = cs};
  size_t free0 = 0, free1 = 0, total = 0;
  CU(cudaMemGetInfo(&free0, &total));
  double t0 = now_ms();
  rc = comm_nccl_create(&o, &w);
  if (!check(rc == 0 && w, "create world of 1: %s (%.0f ms)", rc ? err_msg() : "ok",
             now_ms() - t0))
    return 1;
  CU(cudaMemGetInfo(&free1, &total));
  printf("figure: the world of 1 took %.1f MiB of device memory (cudaMemGetInfo; with the "
         "backend's 4 KiB staging buffer, which a pool may round up); the plan counts %.1f MiB "
         "for it (nccl_size.h)\n",
         ((double)free0 - (double)free1) / (1 << 20),
         (double)comm_nccl_size_bytes(1) / (1 << 20));

  bufs_t b = {.c = w};
  size_t bytes = (BIG + PAD) * sizeof(float);
  CU(cudaMalloc(&b.d_a, bytes));
  CU(cudaMalloc(&b.d_b, bytes));
  b.h_in = malloc(bytes);
  b.h_out = malloc(bytes);
  if (!b.h_in || !b.h_out) {
    fprintf(stderr, "test_nccl: out of host memory\n");
    return 2;
  }

  phase_set("table and create's checks", 60000);
  table(w, id);
  phase_set("conformance", 240000);
  conformance(&b);
  phase_set("host buffers", 60000);
  host_buffers(&b);
  phase_set("split", 60000);
  split(&b);
  phase_set("create of a world that one rank never joins", 30000);
  create_timeout();
  phase_set("ordering after the compute stream", 30000);
  ordering(&b);
  wake_latency(&b);
  failures(&b);

  phase_set("world after the failures", 60000);
  conform_one(&b, COMM_OP_ALL_REDUCE, COMM_BF16, COMM_AVG, 4099, 0);
  t0 = now_ms();
  comm_destroy(w);
  check(1, "world destroyed (%.0f ms)", now_ms() - t0);
  rc = comm_nccl_quiesce(20000);
  check(rc == 0, "no abort left running");
  check(!atomic_load(&watchdog_fired), "no phase needed the watchdog");
  release_all();
  CU(cudaFree(b.d_a));
  CU(cudaFree(b.d_b));
  free(b.h_in);
  free(b.h_out);
  phase_deadline = 1e300;
  printf("test_nccl: %d checks, %d failed\n", n_checks, n_fails);
  return n_fails ? 1 : 0;
}

/* test_nccl_ranks: the NCCL backend (daemon/comm/nccl.c) at several ranks,
 * on the CPU emulator's NCCL (tests/cuda/emu/nccl_emu.cc: rank processes
 * over shared memory). A lent GPU machine has one GPU, so this is where the
 * backend's multi-rank paths run at all: the unique id carried to every
 * rank, ncclCommSplit's groups of a mesh, the rank order NCCL's gathers and
 * scatters use, averages, and what a missing or diverging peer does.
 *
 *  - conformance, as tests/unit/test_comm.c checks the ring: ranks forked
 *    (2, 3 and 4), every op x dtype (f32, bf16) x reduction, out of place
 *    and in place, counts 0, 1, odd and over the emulator's 4 MiB a round,
 *    against float64 references, and the bytes past each output untouched;
 *  - split: a 2 x 2 mesh's shard and replica groups (sizes, ranks, a sum
 *    over only the group's members), keys that reverse the order, and a rank
 *    that joins no group;
 *  - failures: ranks calling different collectives both fail, the message
 *    naming both calls; an op whose peer never calls it ends with
 *    FSDP_ETIMEDOUT within its timeout and breaks the communicator; a peer
 *    killed with SIGKILL the same; comm_abort from another thread ends a
 *    pending op with FSDP_ECANCELED promptly; a world that rank 1 never
 *    joins fails create within its timeout;
 *  - training: fsdp-train on the emulated GPU plugin (FSDP_CUDA_PLUGIN),
 *    started by fsdp-launch as 2 ranks (FULL_SHARD, SHARD_GRAD_OP,
 *    NO_SHARD, gradient accumulation with and without unsharded gradients,
 *    activation checkpointing, bf16-mixed, bf16-true) and 4 (HYBRID_SHARD
 *    and HYBRID_SHARD_ZERO2 2 x 2), and a checkpoint of 2 ranks resumed by
 *    4 of another mesh, each against one rank on the whole batch: the
 *    losses as printed (4 decimals) and, the sharp check, the weights the
 *    ranks save together (1e-5 per tensor; bf16-mixed 1e-4, bf16-true,
 *    whose weights are bf16, 1e-2; in both the biases against 10 Adam
 *    steps).
 *
 * Children report into shared memory and _exit; the parent bounds them,
 * kills them past the bound and prints one line per check. Exit 0 when all
 * pass, 1 when a check failed. Run from the project's root (bin/); the
 * training runs the plugin FSDP_CUDA_PLUGIN names (skipped, saying so,
 * when unset), as `make test` runs it: the emulator's. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "daemon/comm/comm.h"
#include "daemon/comm/nccl.h"
#include "daemon/common/err.h"
#include "daemon/common/rng.h"
#include "daemon/job/config.h"
#include "daemon/job/plan.h"
#include "daemon/train/data.h"
#include "daemon/train/gpt.h"
#include "kernels/kern.h"
#include "kernels/kern_math.h"
#include "tests/cuda/check.h"
#include "tests/unit/comm_ref.h"

#define MAXR 4
#define PAD 16            /* elements past each output that must stay untouched */
#define SLACK_MS 1500     /* a timeout ends within its bound + this */
#define ABORT_BOUND_MS SLACK_MS /* the abort 200 ms in, seen within the same slack as a timeout: a loaded 2-core CI took 743 ms */

typedef struct {
  int fail, code;
  double ms; /* how long the op under test took */
  char msg[1024];
} slot_t;

typedef struct {
  uint8_t id[COMM_NCCL_ID_BYTES];
  slot_t s[MAXR];
  volatile int victim_ready; /* the victim of run_ranks may be killed now */
  volatile int victim_dead;  /* and it has been (reaped) */
} shared_t;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int child_fail(shared_t *sh, int rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int child_fail(shared_t *sh, int rank, const char *fmt, ...) {
  if (sh->s[rank].fail) return 1; /* the first failure says the most */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sh->s[rank].msg, sizeof sh->s[rank].msg, fmt, ap);
  va_end(ap);
  sh->s[rank].fail = 1;
  return 1;
}

static shared_t *shared_new(void) {
  shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  memset(sh, 0, sizeof *sh);
  if (comm_nccl_unique_id(sh->id)) {
    fprintf(stderr, "test_nccl_ranks: %s\n", err_msg());
    exit(2);
  }
  return sh;
}

typedef int (*child_fn)(int rank, int n, shared_t *sh);

/* Forks n ranks running fn, waits up to limit_s for them (kills the rest
 * past it); 0 when every one exited 0 with no failure reported. victim >= 0:
 * that rank is SIGKILLed once it set sh->victim_ready, and sh->victim_dead
 * is set when it has been reaped. */
static int run_ranks(const char *name, int n, child_fn fn, shared_t *sh, double limit_s,
                     int victim) {
  pid_t pids[MAXR];
  fflush(stdout);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      exit(2);
    }
    if (pids[r] == 0) {
      /* one GPU a rank, as fsdpd gives them: the emulator stops a process
       * that makes a context on a second (a stray one on another's GPU) */
      if (cudaSetDevice(r % 2) != cudaSuccess) _exit(child_fail(sh, r, "cudaSetDevice(%d)", r % 2));
      int rc = fn(r, n, sh);
      /* the aborts a failure handed to reapers end before the process
       * does (the emulator's segment goes with them) */
      if (comm_nccl_quiesce(5000)) rc = child_fail(sh, r, "aborts still running after 5 s");
      fflush(stdout);
      _exit(rc ? 1 : 0);
    }
  }
  const double t0 = now_ms();
  int left = n, ok = 1, killed = 0;
  int status[MAXR] = {0};
  while (left > 0) {
    if (victim >= 0 && !killed && sh->victim_ready) {
      kill(pids[victim], SIGKILL);
      killed = 1;
    }
    for (int r = 0; r < n; r++) {
      if (!pids[r]) continue;
      pid_t w = waitpid(pids[r], &status[r], WNOHANG);
      if (w == pids[r]) {
        pids[r] = 0, left--;
        if (r == victim) __atomic_store_n(&sh->victim_dead, 1, __ATOMIC_RELEASE);
      }
    }
    if (now_ms() - t0 > limit_s * 1e3) {
      for (int r = 0; r < n; r++)
        if (pids[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], &status[r], 0);
          printf("  %s: rank %d still running after %.0f s: killed\n", name, r, limit_s);
          ok = 0;
          left--;
        }
      break;
    }
    usleep(2000);
  }
  for (int r = 0; r < n; r++) {
    if (r == victim) continue;
    if (sh->s[r].fail) {
      printf("  %s: rank %d: %s\n", name, r, sh->s[r].msg);
      ok = 0;
    } else if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r])) {
      printf("  %s: rank %d ended with status 0x%x\n", name, r, status[r]);
      ok = 0;
    }
  }
  return ok ? 0 : -1;
}

/* A world whose ops order after work on `stream` (NULL: the legacy one). */
static comm_t *make_on(int rank, int n, shared_t *sh, int64_t timeout_ms, cudaStream_t stream) {
  comm_nccl_opts_t o = {.rank = rank, .size = n, .id = sh->id, .name = "world",
                        .timeout_ms = timeout_ms, .stream = stream};
  comm_t *c = NULL;
  if (comm_nccl_create(&o, &c) < 0) {
    child_fail(sh, rank, "create: %s", err_msg());
    return NULL;
  }
  if (comm_rank(c) != rank || comm_size(c) != n) {
    child_fail(sh, rank, "create: rank %d of %d, wanted %d of %d", comm_rank(c), comm_size(c),
               rank, n);
    return NULL;
  }
  return c;
}

static comm_t *make(int rank, int n, shared_t *sh, int64_t timeout_ms) {
  return make_on(rank, n, sh, timeout_ms, NULL);
}

/* ---- deterministic inputs, float64 references (tests/unit/comm_ref.h) --- */

static int check_reduce(shared_t *sh, int rank, int N, const void *out, size_t n, size_t base,
                        uint64_t seed, comm_dtype_t dt, comm_redop_t op, const char *what) {
  char why[256];
  return comm_ref_check_reduce(why, sizeof why, N, out, n, base, seed, dt, op)
             ? child_fail(sh, rank, "%s: %s", what, why)
             : 0;
}

static int check_exact(shared_t *sh, int rank, const void *out, size_t n, uint64_t seed, int src,
                       comm_dtype_t dt, const char *what) {
  char why[256];
  return comm_ref_check_exact(why, sizeof why, out, n, seed, src, 0, dt)
             ? child_fail(sh, rank, "%s: %s", what, why)
             : 0;
}

/* The PAD elements past n*esz bytes of a buffer: untouched (0x5a). */
static int check_pad(shared_t *sh, int rank, const uint8_t *p, size_t bytes, const char *what) {
  for (size_t i = 0; i < (size_t)PAD * 4; i++)
    if (p[bytes + i] != 0x5a)
      return child_fail(sh, rank, "%s: byte %zu past the output was written", what, i);
  return 0;
}

/* ---- conformance ---------------------------------------------------------- */

/* A device buffer of bytes + the pad, and its host mirror. */
typedef struct {
  uint8_t *dev, *host;
  size_t cap;
} dbuf_t;

static int dbuf_new(dbuf_t *b, size_t bytes) {
  b->cap = bytes + PAD * 4;
  b->host = malloc(b->cap);
  return b->host && cudaMalloc((void **)&b->dev, b->cap) == cudaSuccess ? 0 : -1;
}
static void dbuf_free(dbuf_t *b) {
  cudaFree(b->dev);
  free(b->host);
}
/* host -> device, the pad set */
static void dbuf_put(dbuf_t *b, size_t bytes) {
  memset(b->host + bytes, 0x5a, b->cap - bytes);
  cudaMemcpy(b->dev, b->host, b->cap, cudaMemcpyHostToDevice);
}
static void dbuf_get(dbuf_t *b) { cudaMemcpy(b->host, b->dev, b->cap, cudaMemcpyDeviceToHost); }

static int child_ops(int rank, int N, shared_t *sh) {
  comm_t *c = make(rank, N, sh, 20000);
  if (!c) return 1;
  /* the last: over the emulator's 4 MiB slot a round, for every op */
  static const size_t counts[] = {0, 1, 5, 4099, (1u << 20) + 3};
  uint64_t seed = 100;
  char what[128];
  for (int d = 0; d < 2; d++) {
    const comm_dtype_t dt = d ? COMM_BF16 : COMM_F32;
    const size_t esz = comm_dtype_size(dt);
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      const size_t n = counts[ci], all = n * (size_t)N * esz;
      dbuf_t in, out;
      if (dbuf_new(&in, all) || dbuf_new(&out, all))
        return child_fail(sh, rank, "no memory for %zu bytes", all);
      for (int inplace = 0; inplace < 2; inplace++) {
        seed++;
        snprintf(what, sizeof what, "all_gather %s n=%zu%s", comm_dtype_name(dt), n,
                 inplace ? " in place" : "");
        memset(out.host, 0, all);
        comm_ref_fill(inplace ? out.host + rank * n * esz : in.host, seed, rank, 0, n, dt);
        dbuf_put(&in, n * esz);
        dbuf_put(&out, all);
        if (comm_all_gather(c, inplace ? out.dev + rank * n * esz : in.dev, out.dev, n, dt) < 0)
          return child_fail(sh, rank, "%s: %s", what, err_msg());
        dbuf_get(&out);
        for (int j = 0; j < N; j++)
          if (check_exact(sh, rank, out.host + j * n * esz, n, seed, j, dt, what)) return 1;
        if (check_pad(sh, rank, out.host, all, what)) return 1;
      }
      for (int op = 0; op < 2; op++) {
        const comm_redop_t ro = op ? COMM_AVG : COMM_SUM;
        for (int inplace = 0; inplace < 2; inplace++) { /* in place: this rank's block */
          seed++;
          snprintf(what, sizeof what, "reduce_scatter %s %s n=%zu%s", comm_dtype_name(dt),
                   op ? "avg" : "sum", n, inplace ? " in place" : "");
          comm_ref_fill(in.host, seed, rank, 0, n * N, dt);
          dbuf_put(&in, all);
          dbuf_put(&out, n * esz);
          dbuf_t *res = inplace ? &in : &out;
          const size_t at = inplace ? rank * n * esz : 0;
          if (comm_reduce_scatter(c, in.dev, res->dev + at, n, dt, ro) < 0)
            return child_fail(sh, rank, "%s: %s", what, err_msg());
          dbuf_get(res);
          if (check_reduce(sh, rank, N, res->host + at, n, rank * n, seed, dt, ro, what) ||
              check_pad(sh, rank, res->host, inplace ? all : n * esz, what))
            return 1;
        }
        for (int inplace = 0; inplace < 2; inplace++) {
          seed++;
          snprintf(what, sizeof what, "all_reduce %s %s n=%zu%s", comm_dtype_name(dt),
                   op ? "avg" : "sum", n, inplace ? " in place" : "");
          comm_ref_fill(in.host, seed, rank, 0, n, dt);
          dbuf_put(&in, n * esz);
          dbuf_put(&out, n * esz);
          dbuf_t *res = inplace ? &in : &out;
          if (comm_all_reduce(c, in.dev, res->dev, n, dt, ro) < 0)
            return child_fail(sh, rank, "%s: %s", what, err_msg());
          dbuf_get(res);
          if (check_reduce(sh, rank, N, res->host, n, 0, seed, dt, ro, what) ||
              check_pad(sh, rank, res->host, n * esz, what))
            return 1;
        }
      }
      for (int root = 0; root < N; root += N - 1) {
        seed++;
        snprintf(what, sizeof what, "broadcast %s n=%zu root=%d", comm_dtype_name(dt), n, root);
        if (rank == root) comm_ref_fill(out.host, seed, rank, 0, n, dt);
        else memset(out.host, 0xff, n * esz);
        dbuf_put(&out, n * esz);
        if (comm_broadcast(c, out.dev, n, dt, root) < 0)
          return child_fail(sh, rank, "%s: %s", what, err_msg());
        dbuf_get(&out);
        if (check_exact(sh, rank, out.host, n, seed, root, dt, what) ||
            check_pad(sh, rank, out.host, n * esz, what))
          return 1;
      }
      if (comm_barrier(c) < 0) return child_fail(sh, rank, "barrier: %s", err_msg());
      dbuf_free(&in);
      dbuf_free(&out);
    }
  }
  comm_destroy(c);
  return 0;
}

/* ---- stream order ----------------------------------------------------------- */

/* On a compute stream of the rank's own (as the kernels' is): rank + 1 copied
 * into 64 floats (from page-locked memory: the copy reads it when it runs),
 * summed over the world into another buffer, copied back on the same
 * stream. Each rank's first element of the result goes to sh->s[rank].ms.
 * Right only when the op waits for the copy queued before it, and the copy
 * back for the op: on the emulator's deferred streams
 * (CUDA_EMU_STREAMS=deferred), which run work no event orders as late as
 * it can, a missing cudaStreamWaitEvent gives the wrong sum; on
 * synchronous streams every order is right. STREAM_ORDER_RACE set: the
 * input is zeroed on the compute stream after the op is issued and before
 * it is waited for, a race a runtime must not make: its sum is wrong where
 * the compute stream runs ahead of the collective (CUDA_EMU_STREAMS=ahead),
 * and right on the other streams, which hide it. */
static int child_stream_order(int rank, int N, shared_t *sh) {
  cudaStream_t cs;
  float *d = NULL, *sum = NULL, *pin = NULL, out[64];
  if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&d, sizeof out) != cudaSuccess ||
      cudaMalloc((void **)&sum, sizeof out) != cudaSuccess ||
      cudaHostAlloc((void **)&pin, sizeof out, cudaHostAllocDefault) != cudaSuccess)
    return child_fail(sh, rank, "stream order: a stream or buffers");
  comm_t *c = make_on(rank, N, sh, 20000, cs);
  if (!c) return 1;
  memset(out, 0, sizeof out);
  cudaMemcpy(d, out, sizeof out, cudaMemcpyHostToDevice); /* zeros, done */
  for (int i = 0; i < 64; i++) pin[i] = (float)(rank + 1);
  int rc = cudaMemcpyAsync(d, pin, sizeof out, cudaMemcpyHostToDevice, cs) == cudaSuccess ? 0 : -1;
  comm_req_t *q = NULL;
  if (rc == 0) rc = comm_iall_reduce(c, d, sum, 64, COMM_F32, COMM_SUM, &q);
  if (rc == 0 && getenv("STREAM_ORDER_RACE") &&
      cudaMemsetAsync(d, 0, sizeof out, cs) != cudaSuccess)
    rc = -1;
  if (rc == 0) rc = comm_wait(q, -1);
  if (rc == 0 && cudaMemcpyAsync(out, sum, sizeof out, cudaMemcpyDeviceToHost, cs) != cudaSuccess)
    rc = -1;
  if (rc == 0 && cudaStreamSynchronize(cs) != cudaSuccess) rc = -1;
  if (rc < 0) return child_fail(sh, rank, "stream order: %s", err_msg());
  sh->s[rank].ms = out[0];
  for (int i = 1; i < 64; i++)
    if (out[i] != out[0]) return child_fail(sh, rank, "stream order: element %d differs", i);
  comm_destroy(c);
  cudaFree(d);
  cudaFree(sum);
  cudaFreeHost(pin);
  cudaStreamDestroy(cs);
  return 0;
}

/* The sums child_stream_order's ranks saw, each against N (N + 1) / 2:
 * how many ranks saw it (-1: a rank failed). env: NAME=VALUE for the ranks. */
static int stream_order_right(int N, const char *env) {
  char name[64] = "";
  if (env) {
    snprintf(name, sizeof name, "%.*s", (int)strcspn(env, "="), env);
    setenv(name, env + strlen(name) + 1, 1);
  }
  shared_t *sh = shared_new();
  const int rc = run_ranks("stream order", N, child_stream_order, sh, 60, -1);
  if (env) unsetenv(name);
  int right = 0;
  for (int r = 0; r < N; r++) right += sh->s[r].ms == N * (N + 1) / 2.0;
  munmap(sh, sizeof *sh);
  return rc < 0 ? -1 : right;
}

/* ---- split ---------------------------------------------------------------- */

/* The sum over c of each member's world rank + 1 (one float), or -1. */
static double group_sum(comm_t *c, int world_rank) {
  float *d, h = (float)(world_rank + 1);
  if (cudaMalloc((void **)&d, sizeof h) != cudaSuccess) return -1;
  cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice);
  int rc = comm_all_reduce(c, d, d, 1, COMM_F32, COMM_SUM);
  cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(d);
  return rc < 0 ? -1 : h;
}

static int child_split(int rank, int N, shared_t *sh) {
  comm_t *w = make(rank, N, sh, 20000), *shard = NULL, *rep = NULL, *rev = NULL, *eq = NULL;
  if (!w) return 1;
  const int shards = 2, s = rank % shards, r = rank / shards;
  if (comm_split(w, r, s, "shard", 0, &shard) < 0 || comm_split(w, s, r, "replica", 0, &rep) < 0)
    return child_fail(sh, rank, "split: %s", err_msg());
  if (comm_size(shard) != 2 || comm_rank(shard) != s || comm_size(rep) != 2 ||
      comm_rank(rep) != r)
    return child_fail(sh, rank, "mesh groups: shard %d of %d, replica %d of %d; wanted %d of 2, "
                      "%d of 2", comm_rank(shard), comm_size(shard), comm_rank(rep),
                      comm_size(rep), s, r);
  /* shard group of replica r: world ranks 2r, 2r+1; replica group of shard s: s, s+2 */
  const double want_shard = (2 * r + 1) + (2 * r + 2), want_rep = (s + 1) + (s + 3);
  const double got_shard = group_sum(shard, rank), got_rep = group_sum(rep, rank);
  if (got_shard != want_shard || got_rep != want_rep)
    return child_fail(sh, rank, "sums over the groups: shard %g (want %g), replica %g (want %g): "
                      "%s", got_shard, want_shard, got_rep, want_rep, err_msg());
  /* one group, keys reversing the order; the last rank joins none */
  const int color = rank == N - 1 ? -1 : 0;
  if (comm_split(w, color, N - rank, "reversed", 0, &rev) < 0)
    return child_fail(sh, rank, "split reversed: %s", err_msg());
  if (rank == N - 1) {
    if (rev) return child_fail(sh, rank, "color -1 made a group");
  } else if (!rev || comm_size(rev) != N - 1 || comm_rank(rev) != N - 2 - rank) {
    return child_fail(sh, rank, "reversed: rank %d of %d, wanted %d of %d",
                      rev ? comm_rank(rev) : -1, rev ? comm_size(rev) : -1, N - 2 - rank, N - 1);
  }
  if (rev && group_sum(rev, rank) != (double)(N - 1) * N / 2)
    return child_fail(sh, rank, "sum over the reversed group: %s", err_msg());
  /* equal keys: ordered by rank in the parent */
  if (comm_split(w, 0, 7, "equal", 0, &eq) < 0)
    return child_fail(sh, rank, "split with equal keys: %s", err_msg());
  if (comm_size(eq) != N || comm_rank(eq) != rank)
    return child_fail(sh, rank, "equal keys: rank %d of %d, wanted %d of %d", comm_rank(eq),
                      comm_size(eq), rank, N);
  /* the world still works after its splits */
  if (group_sum(w, rank) != (double)N * (N + 1) / 2)
    return child_fail(sh, rank, "world sum after the splits: %s", err_msg());
  comm_destroy(eq);
  comm_destroy(rev);
  comm_destroy(rep);
  comm_destroy(shard);
  comm_destroy(w);
  return 0;
}

/* ---- failures --------------------------------------------------------------- */

/* A world of N (its default timeout tmo) and 64 zeroed floats of device
 * memory: the buffer, or NULL (the failure reported). */
static float *world_buf(int rank, int N, shared_t *sh, int64_t tmo, comm_t **c) {
  static const float zeros[64];
  float *d = NULL;
  if (!(*c = make(rank, N, sh, tmo))) return NULL;
  if (cudaMalloc((void **)&d, sizeof zeros) != cudaSuccess) {
    child_fail(sh, rank, "cudaMalloc");
    return NULL;
  }
  cudaMemcpy(d, zeros, sizeof zeros, cudaMemcpyHostToDevice);
  return d;
}

static void world_free(comm_t *c, float *d) {
  cudaFree(d);
  comm_destroy(c);
}

/* What the op under test returned (rc, its message) and how long it took. */
static void record(shared_t *sh, int rank, int rc, double t0) {
  sh->s[rank].ms = now_ms() - t0;
  sh->s[rank].code = rc;
  snprintf(sh->s[rank].msg, sizeof sh->s[rank].msg, "%s", rc < 0 ? err_msg() : "");
}

static int child_diverge(int rank, int N, shared_t *sh) {
  comm_t *c;
  float *d = world_buf(rank, N, sh, 5000, &c);
  if (!d) return 1;
  const double t0 = now_ms();
  record(sh, rank, rank == 0 ? comm_all_reduce(c, d, d, 8, COMM_F32, COMM_SUM)
                             : comm_all_gather(c, d, d + 8, 8, COMM_F32), t0);
  /* a later op fails at once: the communicator is broken */
  if (comm_barrier(c) >= 0) return child_fail(sh, rank, "a barrier after the divergence succeeded");
  world_free(c, d);
  return 0;
}

/* Rank 1 issues nothing for the timeout and its slack: rank 0's op waits on it. */
static int child_timeout(int rank, int N, shared_t *sh) {
  comm_t *c;
  float *d = world_buf(rank, N, sh, 400, &c);
  if (!d) return 1;
  if (rank == 0) {
    const double t0 = now_ms();
    const int rc = comm_all_reduce(c, d, d, 16, COMM_F32, COMM_SUM);
    record(sh, 0, rc, t0);
    const double t1 = now_ms();
    const int later = comm_barrier(c);
    if (later != rc || now_ms() - t1 > 200)
      return child_fail(sh, 0, "after the timeout a barrier returned %d in %.0f ms (want %d at "
                        "once)", later, now_ms() - t1, rc);
  } else {
    usleep(400000 + SLACK_MS * 1000);
  }
  world_free(c, d);
  return 0;
}

static void *abort_later(void *p) {
  usleep(200000);
  comm_abort((comm_t *)p);
  return NULL;
}

/* Rank 1's op, whose peer never comes, ended by comm_abort from a thread of
 * its own (one that never chose a GPU, as a signal handler's would be: on
 * GPU 1, the emulator stops a rank whose abort selects GPU 0). */
static int child_abort(int rank, int N, shared_t *sh) {
  comm_t *c;
  float *d = world_buf(rank, N, sh, 30000, &c);
  if (!d) return 1;
  if (rank == 1) {
    pthread_t t;
    pthread_create(&t, NULL, abort_later, c);
    const double t0 = now_ms();
    record(sh, 1, comm_all_reduce(c, d, d, 16, COMM_F32, COMM_SUM), t0);
    pthread_join(t, NULL);
  } else {
    usleep(1500000);
  }
  world_free(c, d);
  return 0;
}

/* Rank N-1 is killed while it sleeps; the others then call an op. */
static int child_killed(int rank, int N, shared_t *sh) {
  comm_t *c;
  float *d = world_buf(rank, N, sh, 600, &c);
  if (!d) return 1;
  if (comm_barrier(c) < 0) return child_fail(sh, rank, "first barrier: %s", err_msg());
  if (rank == N - 1) {
    sh->victim_ready = 1;
    pause(); /* until SIGKILL */
    return 0;
  }
  for (const double t = now_ms(); !__atomic_load_n(&sh->victim_dead, __ATOMIC_ACQUIRE);)
    if (now_ms() - t > 10000) return child_fail(sh, rank, "the victim was not killed");
    else usleep(2000);
  const double t0 = now_ms();
  record(sh, rank, comm_all_reduce(c, d, d, 16, COMM_F32, COMM_SUM), t0);
  world_free(c, d);
  return 0;
}

static int child_no_join(int rank, int N, shared_t *sh) {
  if (rank == 1) return 0; /* never joins */
  comm_nccl_opts_t o = {.rank = rank, .size = N, .id = sh->id, .name = "world", .timeout_ms = 500};
  comm_t *c = NULL;
  const double t0 = now_ms();
  record(sh, rank, comm_nccl_create(&o, &c), t0);
  comm_destroy(c);
  return 0;
}

/* ---- training through fsdp-launch ---------------------------------------- */

/* Runs a shell command, its output into out; its exit status. */
static int sh_run(const char *cmd, char *out, size_t len) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = fread(out, 1, len - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* "train: done: S steps, loss A -> B, eval E" of rank 0 (or of the only
 * rank, unprefixed). */
static int done_line(const char *out, float *first, float *last, float *eval) {
  const char *d = strstr(out, "train: done:");
  return d && sscanf(d, "train: done: %*d steps, loss %f -> %f, eval %f", first, last, eval) == 3
             ? 0
             : -1;
}

/* A command fsdp-launch runs fsdp-train through, what it does (for the
 * messages), and what rank 0 then says and does not say (NULL: nothing). */
typedef struct {
  const char *cmd, *what, *says, *not_says;
} wrap_t;

/* One fsdp-launch run of the tiny model on the emulated GPU plugin. */
typedef struct {
  const char *ranks, *extra;
  const wrap_t *wrap;   /* how fsdp-launch runs fsdp-train, or NULL: as is */
  int ref;              /* the job compared against (-1: none, a reference) */
  double loss_tol, w_tol; /* relative */
  int skip;             /* losses not compared: 1 the first (a resumed run's is a later
                         * step's), 4 the eval (another batch evaluates other windows) */
  double w_floor;       /* the weights' per-element scale below which a tensor's
                         * difference is measured against it instead (0: none) */
} job_t;

/* The plan's total for each rank of the job fsdp-train makes of opts
 * ("--key value" pairs) at `ranks` ranks and recompute level r: the least
 * device memory that holds it (0: the options do not make a job). */
static size_t job_plan_total(const char *opts, int ranks, int r) {
  char buf[1024], *save = NULL;
  snprintf(buf, sizeof buf, "%s --recompute %d", opts, r);
  config_t c;
  config_default(&c);
  for (char *k = strtok_r(buf, " ", &save); k; k = strtok_r(NULL, " ", &save)) {
    char *v = strtok_r(NULL, " ", &save);
    if (strncmp(k, "--", 2) || !v || config_set(&c, k + 2, v)) return 0;
  }
  plan_t p;
  return config_finish(&c) || plan_job(&c, ranks, &p) ? 0 : p.total;
}

static void training(const char *plugin) {
  char data[64], ckpt[80];
  snprintf(data, sizeof data, "/tmp/test_nccl_ranks.%d.tok", (int)getpid());
  snprintf(ckpt, sizeof ckpt, "/tmp/test_nccl_ranks.%d.ckpt", (int)getpid());
  /* tokens of the tiny model's vocabulary (256) */
  static uint16_t tok[16384];
  uint64_t s = 7;
  for (size_t i = 0; i < sizeof tok / sizeof *tok; i++) tok[i] = (uint16_t)(rng_next(&s) % 256);
  if (data_write(data, tok, sizeof tok / sizeof *tok)) {
    check(0, "training: a token file: %s", err_msg());
    return;
  }
  if (mkdir(ckpt, 0700)) {
    check(0, "training: mkdir %s: %s", ckpt, strerror(errno));
    unlink(data);
    return;
  }
  const char *common = "--model tiny --steps 6 --warmup_steps 2 --seq_len 32 --lr 3e-4 "
                       "--eval_batches 2 --sample_tokens 0 --device cuda";
  char save_every[256], resume[256];
  snprintf(save_every, sizeof save_every, "--batch 2 --checkpoint_dir %s --checkpoint_every 3",
           ckpt);
  snprintf(resume, sizeof resume, "--batch 1 --strategy HYBRID_SHARD --mesh 2x2 --resume_from "
           "%s/step-00000003 --auto_resume 0", ckpt);
  /* bf16 jobs' biases, which start at zero, measured against 10 Adam steps
   * an element at the jobs' lr (3e-4): below */
  const double floor10 = 10 * 3e-4;
  /* ranks whose devices differ: rank 1's memory (FSDP_DEVICE_MEMORY_BYTES,
   * as fsdpd sets it) between the job's plan at recompute 1 and at 0, its
   * default on cuda, so that rank 1 alone raises the level to fit
   * (plan_fit_recompute) and rank 0 keeps 0; the ranks compare recompute as
   * the job gave it (train_same_job), so both run the one job, and the
   * same weights, recomputing being exact (before stop 43 both stopped at
   * open, "not given the same job"; without the raise rank 1's plan does
   * not fit and it stops there) */
  char plan_opts[512], small[256], host[256];
  snprintf(plan_opts, sizeof plan_opts, "%s --batch 2 --data %s", common, data);
  const size_t p0 = job_plan_total(plan_opts, 2, 0), p1 = job_plan_total(plan_opts, 2, 1);
  check(p0 > p1 && p1 > 0, "training: the job's plan at recompute 1 (%zu bytes) below that at "
        "0 (%zu): %s", p1, p0, err_msg());
  snprintf(small, sizeof small, "sh -c 'if [ \"$FSDP_RANK\" = 1 ]; then export "
           "FSDP_DEVICE_MEMORY_BYTES=%zu; fi; exec \"$0\" \"$@\"' ", (p0 + p1) / 2);
  /* rank 0's share of the host (FSDP_HOST_MEMORY_BYTES, as fsdpd sets it)
   * too small for its snapshot of the shard, which is page-locked host
   * memory on a GPU: it writes its checkpoints in place, saying so, while
   * rank 1 writes its own from a snapshot; the checkpoints resumed below */
  snprintf(host, sizeof host, "sh -c 'if [ \"$FSDP_RANK\" = 0 ]; then export "
           "FSDP_HOST_MEMORY_BYTES=4096; fi; exec \"$0\" \"$@\"' ");
  const wrap_t smaller = {small, "rank 1's device smaller", NULL, NULL},
               in_place = {host, "rank 0's share of the host small",
                           "no room in host memory for a checkpoint snapshot", ": snapshot of"};
  const job_t jobs[] = {
      {"1", "--batch 4", NULL, -1, 0, 0, 0, 0},
      {"2", "--batch 2", NULL, 0, 1e-4, 1e-5, 0, 0},
      /* rank 1 recomputing GELU to fit its smaller device (above): job 1's bits */
      {"2", "--batch 2", &smaller, 1, 0, 0, 0, 0},
      {"4", "--batch 1 --strategy HYBRID_SHARD --mesh 2x2", NULL, 0, 1e-4, 1e-5, 0, 0},
      {"2", "--batch 2 --strategy SHARD_GRAD_OP", NULL, 0, 1e-4, 1e-5, 0, 0},
      {"2", "--batch 2 --strategy NO_SHARD", NULL, 0, 1e-4, 1e-5, 0, 0},
      {"1", "--batch 4 --precision bf16-mixed", NULL, -1, 0, 0, 0, 0},
      /* bf16-mixed: the logits are rounded to bf16 (kern.h's
       * matmul_fwd_bf16_out16), where a product summed in another order
       * (the ranks' fewer rows) may round a logit the other way; the biases
       * near zero are measured against 10 Adam steps as bf16-true's below
       * (5.4e-5 at worst on the emulator, 2.4e-4 without the floor; the
       * matrices 9e-6) */
      {"2", "--batch 2 --precision bf16-mixed", NULL, 6, 1e-3, 1e-4, 0, floor10},
      /* the other paths a GPU job takes through the collectives */
      {"2", "--batch 1 --grad_accum 2", NULL, 0, 1e-4, 1e-5, 4, 0},
      {"2", "--batch 1 --grad_accum 2 --keep_unsharded_grads 1", NULL, 0, 1e-4, 1e-5, 4, 0},
      {"2", "--batch 2 --activation_checkpointing 1", NULL, 0, 1e-4, 1e-5, 0, 0},
      {"4", "--batch 1 --strategy HYBRID_SHARD_ZERO2 --mesh 2x2", NULL, 0, 1e-4, 1e-5, 0, 0},
      {"1", "--batch 4 --precision bf16-true", NULL, -1, 0, 0, 0, 0},
      /* bf16 weights: the biases, which start at zero, hold about 2 Adam
       * steps after these 6 (lr 3e-4), where one rounding of another gradient
       * is a whole bf16 step of a tiny number and a gradient near zero on one
       * side of the reduction's rounding moves its element by up to an Adam
       * step: their difference is measured against 10 steps (10 lr an
       * element). A wrong gradient still fails it tenfold: the emulator's
       * reduction mutated to take one rank's half of the batch for the whole
       * moved the biases 1.7 lr an element (0.17 here) and the matrices
       * 2.5e-2 to 5e-2 */
      {"2", "--batch 2 --precision bf16-true", NULL, 12, 1e-3, 1e-2, 0, floor10},
      /* checkpoints of 2 ranks at steps 3 and 6; the one of step 3 resumed
       * by 4 ranks of another mesh ends where the uninterrupted run did */
      {"2", save_every, &in_place, 0, 1e-4, 1e-5, 0, 0},
      {"4", resume, NULL, 0, 1e-4, 1e-5, 1, 0}};
  const int n_jobs = (int)(sizeof jobs / sizeof *jobs);
  float loss[sizeof jobs / sizeof *jobs][3] = {{0}};
  gpt_t *w[sizeof jobs / sizeof *jobs] = {0};
  for (int j = 0; j < n_jobs; j++) {
    const job_t *jb = &jobs[j];
    char cmd[2048], save[96];
    static char out[1 << 18];
    snprintf(save, sizeof save, "%s.%d.bin", data, j);
    snprintf(cmd, sizeof cmd, "FSDP_CUDA_PLUGIN=%s FSDP_COMM_TIMEOUT_MS=60000 timeout 600 "
             "bin/fsdp-launch -n %s -- %sbin/fsdp-train %s %s --data %s --save %s 2>&1",
             plugin, jb->ranks, jb->wrap ? jb->wrap->cmd : "", common, jb->extra, data, save);
    const double t0 = now_ms();
    int rc = sh_run(cmd, out, sizeof out);
    float *L = loss[j];
    if (rc != 0 || done_line(out, &L[0], &L[1], &L[2]) != 0) {
      check(0, "training on %s emulated GPU rank(s), %s (%s): exit %d", jb->ranks, jb->extra,
            jb->wrap ? jb->wrap->what : "as is", rc);
      fprintf(stderr, "%s\n", out);
      unlink(save);
      continue;
    }
    printf("training on %s rank(s), %s (%s): loss %.6f -> %.6f, eval %.6f (%.1f s)\n", jb->ranks,
           jb->extra, jb->wrap ? jb->wrap->what : "as is", L[0], L[1], L[2],
           (now_ms() - t0) / 1e3);
    if (j == 0)
      check(strstr(out, "cuda device 0: cuda_emu") != NULL, "training: the job ran on the "
            "emulated GPU");
    if (jb->wrap && jb->wrap->says)
      check(strstr(out, jb->wrap->says) && !strstr(out, jb->wrap->not_says), "training on %s "
            "rank(s), %s (%s): rank 0 says \"%s\" and not \"%s\"", jb->ranks, jb->extra,
            jb->wrap->what, jb->wrap->says, jb->wrap->not_says);
    if (gpt_load(&w[j], save, kern_cpu())) {
      check(0, "training on %s rank(s), %s: the saved weights: %s", jb->ranks, jb->extra,
            err_msg());
      w[j] = NULL;
    }
    unlink(save);
    if (jb->ref < 0 || !w[j] || !w[jb->ref]) continue;
    const float *R = loss[jb->ref];
    double d = 0;
    for (int k = 0; k < 3; k++)
      if (!(jb->skip & (1 << k))) d = fmax(d, fabs(L[k] - R[k]) / fabs(R[k]));
    check(d <= jb->loss_tol, "training: %s ranks (%s; %s) against %s (%s): worst loss difference "
          "%.3e (bound %.0e, relative)", jb->ranks, jb->extra, jb->wrap ? jb->wrap->what : "as is",
          jobs[jb->ref].ranks,
          jobs[jb->ref].extra, d, jb->loss_tol);
    /* the weights the ranks saved together, per tensor, relative L2 (the
     * key bias, whose gradient is zero up to rounding, left out as in
     * test_train.c; a tensor smaller than the job's floor an element
     * measured against the floor) */
    const gpt_t *ref_w = w[jb->ref];
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < gpt_num_tensors(ref_w); i++) {
      const gpt_tensor_t *t = gpt_tensor(ref_w, i);
      if (strstr(t->name, "qkv.b")) continue;
      const float *a = gpt_params(w[j]) + t->offset, *b = gpt_params((gpt_t *)ref_w) + t->offset;
      double num = 0, den = 0;
      for (size_t k = 0; k < t->numel; k++)
        num += ((double)a[k] - b[k]) * ((double)a[k] - b[k]), den += (double)b[k] * b[k];
      den = fmax(den, (double)t->numel * jb->w_floor * jb->w_floor);
      const double e2 = den > 0 ? sqrt(num / den) : sqrt(num);
      if (e2 >= worst) worst = e2, worst_name = t->name;
    }
    char floor[48] = "";
    if (jb->w_floor > 0) snprintf(floor, sizeof floor, "; floor %.0e an element", jb->w_floor);
    check(worst <= jb->w_tol, "training: %s ranks' weights against %s rank's: worst tensor %s "
          "%.3e (bound %.0e%s)", jb->ranks, jobs[jb->ref].ranks, worst_name, worst, jb->w_tol,
          floor);
  }
  for (int j = 0; j < n_jobs; j++) gpt_destroy(w[j]);
  char rm[256];
  snprintf(rm, sizeof rm, "rm -rf '%s'", ckpt);
  if (system(rm)) printf("  could not remove %s\n", ckpt);
  unlink(data);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *plugin = getenv("FSDP_CUDA_PLUGIN");
  setenv("CUDA_EMU_DEVICES", "2", 1); /* the emulator's: ranks on GPUs 0 and 1 */

  for (int n = 2; n <= 4; n++) {
    shared_t *sh = shared_new();
    char name[64];
    snprintf(name, sizeof name, "conformance at %d ranks", n);
    const double t0 = now_ms();
    int rc = run_ranks(name, n, child_ops, sh, 240, -1);
    check(rc == 0, "%s: every op, dtype, reduction and count (%.1f s)", name,
          (now_ms() - t0) / 1e3);
    munmap(sh, sizeof *sh);
  }

  {
    const char *streams = getenv("CUDA_EMU_STREAMS");
    const int deferred = streams && !strcmp(streams, "deferred");
    const int ahead = streams && !strcmp(streams, "ahead");
    const int right = stream_order_right(3, NULL);
    check(right == 3, "stream order: an op after the copy queued before it on the compute "
          "stream, the copy back after the op: %d of 3 ranks summed right (CUDA_EMU_STREAMS=%s)",
          right, streams && *streams ? streams : "sync");
    if (deferred) {
      /* the check's teeth: without the waits the same ranks sum wrong */
      const int wrong = stream_order_right(3, "CUDA_EMU_DROP_WAITS=1");
      check(wrong == 0, "stream order with cudaStreamWaitEvent dropped (CUDA_EMU_DROP_WAITS=1): "
            "%d of 3 ranks summed right (0 wanted: the deferred streams show a missing wait)",
            wrong);
    } else if (ahead) {
      /* the check's teeth here: a write queued before the wait runs first */
      const int wrong = stream_order_right(3, "STREAM_ORDER_RACE=1");
      check(wrong == 0, "stream order with a write to the op's buffer queued before its wait: "
            "%d of 3 ranks summed right (0 wanted: CUDA_EMU_STREAMS=ahead runs the compute "
            "stream ahead of the collective)", wrong);
    } else {
      printf("stream order's races: only on the emulator's deferred or ahead streams "
             "(CUDA_EMU_STREAMS): skipped\n");
    }
  }

  {
    shared_t *sh = shared_new();
    check(run_ranks("split", 4, child_split, sh, 60, -1) == 0,
          "split: a 2 x 2 mesh's groups, reversed keys, a rank in no group, equal keys");
    munmap(sh, sizeof *sh);
  }

  {
    shared_t *sh = shared_new();
    int rc = run_ranks("diverge", 2, child_diverge, sh, 30, -1);
    check(rc == 0, "diverge: both ranks ran");
    for (int r = 0; r < 2; r++)
      check(sh->s[r].code < 0 && strstr(sh->s[r].msg, "ncclAllReduce(count=8") &&
                strstr(sh->s[r].msg, "ncclAllGather(count=8"),
            "diverge: rank %d's error names both calls (%d in %.0f ms): %s", r, sh->s[r].code,
            sh->s[r].ms, sh->s[r].msg);
    munmap(sh, sizeof *sh);
  }

  {
    shared_t *sh = shared_new();
    int rc = run_ranks("timeout", 2, child_timeout, sh, 30, -1);
    check(rc == 0 && sh->s[0].code == FSDP_ETIMEDOUT && sh->s[0].ms >= 400 &&
              sh->s[0].ms <= 400 + SLACK_MS,
          "timeout: an op whose peer never comes: %s in %.0f ms (bound 400 + %d): %s",
          err_name(sh->s[0].code), sh->s[0].ms, SLACK_MS, sh->s[0].msg);
    munmap(sh, sizeof *sh);
  }

  {
    shared_t *sh = shared_new();
    int rc = run_ranks("abort", 2, child_abort, sh, 30, -1);
    check(rc == 0 && sh->s[1].code == FSDP_ECANCELED && sh->s[1].ms <= 200 + ABORT_BOUND_MS,
          "abort: comm_abort from another thread ends the pending op: %s in %.0f ms (bound %d): "
          "%s", err_name(sh->s[1].code), sh->s[1].ms, 200 + ABORT_BOUND_MS, sh->s[1].msg);
    munmap(sh, sizeof *sh);
  }

  {
    shared_t *sh = shared_new();
    int rc = run_ranks("killed", 3, child_killed, sh, 30, 2);
    for (int r = 0; r < 2; r++)
      check(rc == 0 && sh->s[r].code == FSDP_ETIMEDOUT && sh->s[r].ms <= 600 + SLACK_MS,
            "killed peer: rank %d's op: %s in %.0f ms (bound 600 + %d): %s", r,
            err_name(sh->s[r].code), sh->s[r].ms, SLACK_MS, sh->s[r].msg);
    munmap(sh, sizeof *sh);
  }

  {
    shared_t *sh = shared_new();
    int rc = run_ranks("no join", 2, child_no_join, sh, 30, -1);
    check(rc == 0 && sh->s[0].code == FSDP_ETIMEDOUT && sh->s[0].ms <= 500 + SLACK_MS,
          "a world rank 1 never joins: create fails with %s in %.0f ms (bound 500 + %d): %s",
          err_name(sh->s[0].code), sh->s[0].ms, SLACK_MS, sh->s[0].msg);
    munmap(sh, sizeof *sh);
  }

  if (plugin && *plugin) training(plugin);
  else printf("training through fsdp-launch: skipped (FSDP_CUDA_PLUGIN unset)\n");

  /* every segment this test's ranks made (named by this process's id) is gone */
  char left[128];
  snprintf(left, sizeof left, "ls /dev/shm | grep -q '^fsdp-nccl-emu[.]%d[.]'", (int)getpid());
  check(system(left) != 0, "no shared-memory segment of the emulated NCCL is left in /dev/shm");
  printf("test_nccl_ranks: %d checks, %d failed\n", n_checks, n_fails);
  return n_fails ? 1 : 0;
}

/* nccl: the collectives on GPUs, comm_backend_t over NCCL (see nccl.h).
 *
 * What a communicator owns: the NCCL communicator (non-blocking, so that
 * creation, split and every op can be bounded and ended by ncclCommAbort), a
 * CUDA stream of its own (non-blocking) that every op runs on, an event
 * recorded on the compute stream at each issue, a one-float device buffer for
 * barriers, and a pool of requests, each with its completion event (created
 * once, reused; no device memory is allocated per op). It does not own the
 * compute stream or the caller's buffers.
 *
 * Life of an op: issue records the event on the compute stream, makes the
 * own stream wait for it, enqueues the NCCL op there (a non-blocking NCCL
 * communicator may answer ncclInProgress: the launch then finishes on an NCCL
 * thread, and ncclCommGetAsyncError is polled until it has, before anything
 * else touches the communicator) and records the request's completion event.
 * wait polls that event and NCCL's error state with short sleeps (10 us
 * growing to 100 us for its first 20 ms, then to 1 ms; Linux's timer slack,
 * 50 us by default, lengthens each), until the op ends, its timeout passes
 * (counted from issue) or comm_abort is called.
 *
 * Breaking: the first failure (a timeout, an NCCL or CUDA error, comm_abort,
 * destroy with ops running) breaks the communicator under mu: the ops still
 * running are failed with that failure's code, later issues fail at once with
 * it, and the NCCL communicator is handed to a reaper thread that calls
 * ncclCommAbort. Off the caller's thread because ncclCommAbort waits for
 * NCCL's streams, which wait for the compute stream: a stuck kernel there
 * would hold the caller too. The reaper keeps a reference to the
 * communicator; its memory goes when the last reference does (nccl_unref),
 * so comm_destroy never waits for the GPU either. comm_nccl_quiesce waits for
 * the reapers.
 *
 * Locking: mu guards the NCCL handle, the request lists and the broken state;
 * every NCCL call on a live communicator is made under it (NCCL's
 * communicators are not thread-safe), and it is never held across a sleep or
 * a call that waits for the GPU, so comm_abort takes it promptly. issue_mu
 * keeps issues and splits of one communicator in order across threads. */
#include "daemon/comm/nccl.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "daemon/comm/nccl_size.h"
#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/mem.h"
#include "daemon/common/param.h"

static_assert(sizeof(ncclUniqueId) == COMM_NCCL_ID_BYTES,
              "COMM_NCCL_ID_BYTES must be sizeof(ncclUniqueId) of the NCCL built against");

#define NCCL_MSG 768
#define NCCL_POLL_FIRST_NS 50000LL /* 50 us, doubling to 1 ms */
#define NCCL_POLL_MAX_NS 1000000LL
/* A wait (nccl_wait) polls finer for its first 20 ms: from 10 us, doubling to
 * 100 us. The op is ordered after the compute stream's work queued before it
 * was issued, so it usually completes within a unit's compute (well under a
 * millisecond for GPT-2's layers on an H100), and while the host sleeps past
 * that it queues nothing: the GPU drains the one unit it has queued and
 * idles. With the others' doubling to 1 ms the host could wake most of a
 * millisecond late on each of a step's ~40 waits (gathers and gradient
 * reductions, GPT-2 124M); now at most 100 us. Past 20 ms (a slow peer) the
 * wait backs off to 1 ms as the others do. Not yet measured on a GPU. */
#define NCCL_WAIT_FIRST_NS 10000LL
#define NCCL_WAIT_FINE_NS 20000000LL
#define NCCL_WAIT_FINE_MAX_NS 100000LL

typedef enum { REQ_PENDING, REQ_OK, REQ_FAILED } nccl_req_state_t;

typedef struct nccl_comm nccl_t;

typedef struct nccl_req {
  comm_req_t base; /* first: what callers hold */
  nccl_t *c;
  struct nccl_req *next; /* in c->busy (issued, not yet waited) or c->pool */
  cudaEvent_t done;      /* recorded on c->stream after the op; made once */
  comm_args_t a;
  uint32_t seq;
  int64_t timeout_ms;
  int64_t deadline_ns; /* issue + timeout */
  nccl_req_state_t state;
  int rc;               /* REQ_FAILED: the code, and msg */
  char msg[NCCL_MSG];
  /* an op on host buffers, run on c->host_buf: its result goes to host_out
   * (host_bytes of it, from host_buf + host_off) when waited */
  int staged;
  void *host_out;
  size_t host_off, host_bytes;
} nccl_req_t;

struct nccl_comm {
  comm_t base;              /* first: rank, size, name */
  pthread_mutex_t mu;       /* everything below that changes */
  pthread_mutex_t issue_mu; /* one issue or split at a time */
  ncclComm_t nc;            /* NULL once handed to a reaper (or finalized) */
  ncclComm_t split_slot;    /* where an ncclCommSplit in flight writes the child */
  int dev;                  /* the CUDA device current at create */
  cudaStream_t compute;     /* the caller's (NULL: the legacy default stream) */
  cudaStream_t stream;      /* own, non-blocking: every op runs here */
  cudaEvent_t ready;        /* recorded on compute at each issue */
  float *barrier_buf;       /* 1 float on the device (stream-ordered allocation) */
  uint8_t *host_buf;        /* COMM_HOST_BYTES on the device: host buffers' ops run here */
  uint8_t *host_bounce;     /* COMM_HOST_BYTES page-locked: their bytes on the way (a copy
                             * from pageable memory may wait for the stream; this never) */
  cudaStream_t host_stream; /* own, non-blocking: a staged op's result copied back */
  int host_busy;            /* a staged op is in flight (one at a time) */
  int64_t timeout_ms;       /* default per op */
  atomic_int aborted;
  int broken_rc; /* the first failure's code, 0 while healthy */
  char broken_msg[NCCL_MSG];
  uint32_t seq;
  nccl_req_t *busy; /* issued and not yet waited */
  nccl_req_t *pool; /* free requests, events made */
  int refs;         /* the owner, plus each reaper at work */
  size_t counted;   /* MEM_COMM bytes counted for NCCL's buffers (nccl_size.h) */
};

/* Aborts running on reaper threads (comm_nccl_quiesce). */
static atomic_int nccl_reaping;

static int64_t nccl_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* now + ms, saturating (a huge timeout or wait means none). */
static int64_t nccl_deadline(int64_t ms) {
  int64_t now = nccl_now_ns();
  if (ms < 0 || ms > (INT64_MAX - now) / 1000000) return INT64_MAX;
  return now + ms * 1000000;
}

/* Sleeps *step ns, then doubles it up to max ns. */
static void nccl_nap_to(int64_t *step, int64_t max) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)*step};
  nanosleep(&ts, NULL);
  *step = *step * 2 > max ? max : *step * 2;
}

static void nccl_nap(int64_t *step) { nccl_nap_to(step, NCCL_POLL_MAX_NS); }

/* ---- errors: CUDA's and NCCL's codes enter the project's table here -------- */

static int nccl_map_cuda(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation: return FSDP_ENOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle: return FSDP_EINVAL;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary: return FSDP_EUNSUPPORTED;
    default: return FSDP_EIO; /* the device failed (a kernel fault, a lost context, ...) */
  }
}

static int nccl_map_nccl(ncclResult_t r) {
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return FSDP_EINVAL;
    case ncclRemoteError: return FSDP_EPEER;
    case ncclSystemError: return FSDP_EIO;       /* sockets, shared memory, the network */
    case ncclUnhandledCudaError: return FSDP_EIO; /* CUDA failed under NCCL */
    default: return FSDP_EINTERNAL;
  }
}

static const char *nccl_text_cuda(cudaError_t e) {
  static _Thread_local char buf[256];
  snprintf(buf, sizeof buf, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
  return buf;
}

static const char *nccl_text_nccl(ncclResult_t r) {
  static _Thread_local char buf[512];
  const char *last = ncclGetLastError(NULL);
  int has = last && *last;
  snprintf(buf, sizeof buf, "%s%s%s", ncclGetErrorString(r), has ? "; NCCL's last error: " : "",
           has ? last : "");
  return buf;
}

/* One generator for both libraries (ggml's CUDA_CHECK_GEN): 0, or the mapped
 * code with "group 'g' rank r: <call>: <library's text>" as the message. */
#define NCCL_CHECK_GEN(fn, type, ok, map, text)                                           \
  static int fn(type r, const nccl_t *c, const char *call) {                              \
    if (r == ok) return 0;                                                                \
    return err_set(map(r), "group '%s' rank %d: %s: %s", c ? c->base.name : "?",         \
                   c ? c->base.rank : -1, call, text(r));                                 \
  }
NCCL_CHECK_GEN(nccl_check_cuda, cudaError_t, cudaSuccess, nccl_map_cuda, nccl_text_cuda)
NCCL_CHECK_GEN(nccl_check_nccl, ncclResult_t, ncclSuccess, nccl_map_nccl, nccl_text_nccl)
#define CUDA_CHECK(c, call) nccl_check_cuda((call), (c), #call)
#define NCCL_CHECK(c, call) nccl_check_nccl((call), (c), #call)

/* ---- small helpers ------------------------------------------------------- */

/* Makes c's device current on this thread, and leaves it so. A process
 * holds one GPU; setting a thread back to its earlier device would, on a
 * thread that never chose one (a reaper, a thread calling comm_abort),
 * select CUDA's default device 0, and CUDA 12's cudaSetDevice makes a
 * context there: hundreds of MiB of a GPU another rank owns, from every
 * rank on GPU 1 and up whose group broke (found on the emulator, which
 * stops a process that makes a context on a second device). */
static void nccl_dev_enter(const nccl_t *c) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  if (cur != c->dev && cudaSetDevice(c->dev) != cudaSuccess)
    LOG_WARN("comm", "group '%s': cudaSetDevice(%d) failed", c->base.name, c->dev);
}

static ncclDataType_t nccl_dtype(comm_dtype_t dt) {
  return dt == COMM_BF16 ? ncclBfloat16 : ncclFloat32;
}

/* The NCCL operation of redop r on c. On a communicator of one rank an
 * average is the sum (a copy), and it is asked for as one: NCCL 2.28's
 * one-rank kernel for ncclAvg (oneRankReduce, a pre-multiplied sum) splits
 * the count into equal 16-byte-aligned block segments rounded down, and leaves
 * the last count % blocks elements unwritten (seen on an H200: of 2^24 + 3
 * floats, the last 3 kept the receive buffer's old bytes; test_nccl's BIG). */
static ncclRedOp_t nccl_redop(const nccl_t *c, comm_redop_t r) {
  return r == COMM_AVG && c->base.size > 1 ? ncclAvg : ncclSum;
}

/* "all_reduce #3 (bf16 count=1025 avg)", for messages. */
static void nccl_sig(char *buf, size_t n, const nccl_req_t *q) {
  const comm_args_t *a = &q->a;
  const char *dt = comm_dtype_name(a->dtype);
  if (a->op == COMM_OP_BARRIER)
    snprintf(buf, n, "barrier #%u", q->seq);
  else if (a->op == COMM_OP_BROADCAST)
    snprintf(buf, n, "broadcast #%u (%s count=%zu root=%d)", q->seq, dt, a->count, a->root);
  else if (a->op == COMM_OP_ALL_GATHER)
    snprintf(buf, n, "all_gather #%u (%s count=%zu per rank)", q->seq, dt, a->count);
  else
    snprintf(buf, n, "%s #%u (%s count=%zu%s %s)", comm_op_name(a->op), q->seq, dt, a->count,
             a->op == COMM_OP_REDUCE_SCATTER ? " per rank" : "",
             a->redop == COMM_AVG ? "avg" : "sum");
}

/* ---- the communicator's life ------------------------------------------------ */

/* Frees what c holds; the NCCL communicator is gone already (destroyed, or
 * aborted by a reaper). Never waits for the GPU: the buffer is freed in the
 * stream's order, and a stream or event with work still queued is released
 * by CUDA when that work ends. */
static void nccl_free(nccl_t *c) {
  nccl_dev_enter(c);
  if (c->barrier_buf && c->stream &&
      CUDA_CHECK(c, cudaFreeAsync(c->barrier_buf, c->stream)) < 0)
    LOG_WARN("comm", "%s", err_msg());
  if (c->host_buf && c->stream && CUDA_CHECK(c, cudaFreeAsync(c->host_buf, c->stream)) < 0)
    LOG_WARN("comm", "%s", err_msg());
  if (c->host_stream && CUDA_CHECK(c, cudaStreamDestroy(c->host_stream)) < 0)
    LOG_WARN("comm", "%s", err_msg());
  if (c->host_bounce && CUDA_CHECK(c, cudaFreeHost(c->host_bounce)) < 0) LOG_WARN("comm", "%s", err_msg());
  for (int list = 0; list < 2; list++) {
    nccl_req_t *q = list ? c->pool : c->busy;
    while (q) {
      nccl_req_t *next = q->next;
      if (q->done) (void)cudaEventDestroy(q->done);
      free(q);
      q = next;
    }
  }
  if (c->ready) (void)cudaEventDestroy(c->ready);
  if (c->stream && CUDA_CHECK(c, cudaStreamDestroy(c->stream)) < 0) LOG_WARN("comm", "%s", err_msg());
  if (c->counted) mem_account(MEM_COMM, c->counted, 0);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->issue_mu);
  free(c);
}

static void nccl_unref(nccl_t *c) {
  pthread_mutex_lock(&c->mu);
  int left = --c->refs;
  pthread_mutex_unlock(&c->mu);
  if (left == 0) nccl_free(c);
}

/* A communicator with its stream, events and barrier buffer, no NCCL
 * communicator yet: 0 and *out, or a negative code with a message. */
static int nccl_alloc(const char *name, int rank, int size, cudaStream_t compute,
                      int64_t timeout_ms, nccl_t **out) {
  *out = NULL;
  nccl_t *c = calloc(1, sizeof *c);
  if (!c) return err_set(FSDP_ENOMEM, "group '%s': no memory for an NCCL communicator", name);
  c->base.be = &comm_nccl_backend;
  c->base.rank = rank;
  c->base.size = size;
  snprintf(c->base.name, sizeof c->base.name, "%s", name);
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->issue_mu, NULL);
  c->refs = 1;
  c->compute = compute;
  c->timeout_ms = timeout_ms > 0 ? timeout_ms : param_comm_timeout_ms();
  if (c->timeout_ms <= 0) c->timeout_ms = 5000;
  atomic_init(&c->aborted, 0);
  int rc;
  if ((rc = CUDA_CHECK(c, cudaGetDevice(&c->dev))) < 0 ||
      (rc = CUDA_CHECK(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking))) < 0 ||
      (rc = CUDA_CHECK(c, cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming))) < 0 ||
      (rc = CUDA_CHECK(c, cudaMallocAsync((void **)&c->barrier_buf, sizeof(float), c->stream))) < 0 ||
      (rc = CUDA_CHECK(c, cudaMemsetAsync(c->barrier_buf, 0, sizeof(float), c->stream))) < 0 ||
      (rc = CUDA_CHECK(c, cudaStreamCreateWithFlags(&c->host_stream, cudaStreamNonBlocking))) < 0 ||
      (rc = CUDA_CHECK(c, cudaMallocAsync((void **)&c->host_buf, COMM_HOST_BYTES, c->stream))) < 0 ||
      (rc = CUDA_CHECK(c, cudaHostAlloc((void **)&c->host_bounce, COMM_HOST_BYTES,
                                        cudaHostAllocDefault))) < 0) {
    char msg[NCCL_MSG];
    snprintf(msg, sizeof msg, "%s", err_msg());
    nccl_free(c);
    return err_set(rc, "%s", msg);
  }
  /* NCCL allocates its buffers out of the accounting allocator's sight: the
   * estimate the plan uses is counted for it, so plan and count agree and
   * the GPU checks measure the estimate against cudaMemGetInfo */
  c->counted = comm_nccl_size_bytes(size);
  if (c->counted) mem_account(MEM_COMM, c->counted, 1);
  *out = c;
  return 0;
}

/* Hands nc to a reaper thread that aborts it (see the top of the file). */
typedef struct {
  nccl_t *c;
  ncclComm_t nc;
} nccl_reap_t;

static void *nccl_reaper(void *arg) {
  nccl_reap_t *j = arg;
  nccl_t *c = j->c;
  nccl_dev_enter(c);
  int64_t t0 = nccl_now_ns();
  ncclResult_t r = ncclCommAbort(j->nc);
  if (r != ncclSuccess && r != ncclInProgress)
    LOG_WARN("comm", "group '%s' rank %d: ncclCommAbort: %s", c->base.name, c->base.rank,
             nccl_text_nccl(r));
  /* A split this communicator was running when it broke may have made its
   * child after all (NCCL's thread is joined by now): abort it too. */
  ncclComm_t orphan = __atomic_exchange_n(&c->split_slot, NULL, __ATOMIC_ACQ_REL);
  if (orphan) (void)ncclCommAbort(orphan);
  /* what the communicator's stream still holds (a staged op's copy from
   * the page-locked bounce buffer, queued behind the compute stream) runs
   * before that buffer is freed with the communicator (helper-50) */
  (void)cudaStreamSynchronize(c->stream);
  LOG_DEBUG("comm", "group '%s' rank %d: NCCL communicator aborted in %.1f ms", c->base.name,
            c->base.rank, (double)(nccl_now_ns() - t0) / 1e6);
  free(j);
  nccl_unref(c);
  atomic_fetch_sub(&nccl_reaping, 1);
  return NULL;
}

static void nccl_reap(nccl_t *c, ncclComm_t nc) {
  if (!nc) return;
  pthread_mutex_lock(&c->mu);
  c->refs++;
  pthread_mutex_unlock(&c->mu);
  atomic_fetch_add(&nccl_reaping, 1);
  nccl_reap_t *j = malloc(sizeof *j);
  pthread_t t;
  pthread_attr_t at;
  int started = 0;
  if (j) {
    j->c = c;
    j->nc = nc;
    if (pthread_attr_init(&at) == 0) {
      pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
      started = pthread_create(&t, &at, nccl_reaper, j) == 0;
      pthread_attr_destroy(&at);
    }
  }
  if (started) return;
  LOG_WARN("comm", "group '%s': no thread for ncclCommAbort; aborting on this one", c->base.name);
  if (j) {
    nccl_reaper(j);
  } else {
    (void)ncclCommAbort(nc);
    nccl_unref(c);
    atomic_fetch_sub(&nccl_reaping, 1);
  }
}

/* Under mu. The first failure breaks c: it keeps rc and msg for later
 * issues, fails the ops still running (trigger gets msg itself, the others
 * a line naming them) and takes the NCCL handle, which the caller passes to
 * nccl_reap once mu is released. Later failures change nothing. */
static ncclComm_t nccl_break_locked(nccl_t *c, int rc, const char *msg, nccl_req_t *trigger) {
  if (c->broken_rc) return NULL;
  c->broken_rc = rc;
  snprintf(c->broken_msg, sizeof c->broken_msg, "%s", msg);
  for (nccl_req_t *q = c->busy; q; q = q->next) {
    if (q->state != REQ_PENDING) continue;
    /* finished before the abort flag can cut it short: it stands */
    if (q != trigger && cudaEventQuery(q->done) == cudaSuccess) {
      q->state = REQ_OK;
      continue;
    }
    q->state = REQ_FAILED;
    q->rc = rc;
    if (q == trigger) {
      snprintf(q->msg, sizeof q->msg, "%s", msg);
    } else {
      char sig[160];
      nccl_sig(sig, sizeof sig, q);
      snprintf(q->msg, sizeof q->msg, "%s on rank %d of group '%s' did not complete: %s", sig,
               c->base.rank, c->base.name, msg);
    }
  }
  ncclComm_t nc = c->nc;
  c->nc = NULL;
  return nc;
}

/* Breaks c with the current message (err_msg()) and code rc; returns rc
 * with that message still set. Not under mu. */
static int nccl_fail(nccl_t *c, int rc) {
  char msg[NCCL_MSG];
  snprintf(msg, sizeof msg, "%s", err_msg());
  pthread_mutex_lock(&c->mu);
  ncclComm_t nc = nccl_break_locked(c, rc, msg, NULL);
  pthread_mutex_unlock(&c->mu);
  nccl_reap(c, nc);
  return err_set(rc, "%s", msg);
}

/* Under mu: 0 when c takes ops, else the code and message issue must fail with. */
static int nccl_usable_locked(const nccl_t *c, const char *what) {
  if (atomic_load(&c->aborted))
    return err_set(FSDP_ECANCELED, "%s on rank %d of group '%s': the communicator was aborted",
                   what, c->base.rank, c->base.name);
  if (c->broken_rc)
    return err_set(c->broken_rc, "%s on rank %d of group '%s': the communicator is broken by an "
                   "earlier failure: %s", what, c->base.rank, c->base.name, c->broken_msg);
  if (!c->nc)
    return err_set(FSDP_ESTATE, "%s on rank %d of group '%s': the communicator is closed", what,
                   c->base.rank, c->base.name);
  return 0;
}

#define NCCL_SETTLE_TIMEOUT 1

/* Polls the state of *slot (read under c->mu: a break may take it) until it
 * leaves ncclInProgress: 0; a negative code with a message (NCCL's error;
 * c aborted or broken meanwhile); or NCCL_SETTLE_TIMEOUT at deadline_ns,
 * for the caller to word. what names the step in messages. */
static int nccl_settle(nccl_t *c, ncclComm_t *slot, int64_t deadline_ns, const char *what) {
  int64_t step = NCCL_POLL_FIRST_NS / 5; /* enqueues finish in tens of us */
  for (;;) {
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    ncclResult_t state = ncclInProgress;
    if (slot == &c->nc && (rc = nccl_usable_locked(c, what)) < 0) {
      pthread_mutex_unlock(&c->mu);
      return rc;
    }
    ncclResult_t r = ncclCommGetAsyncError(*slot, &state);
    pthread_mutex_unlock(&c->mu);
    if (r != ncclSuccess) return nccl_check_nccl(r, c, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return 0;
    if (state != ncclInProgress)
      return err_set(nccl_map_nccl(state), "group '%s' rank %d: %s failed: %s", c->base.name,
                     c->base.rank, what, nccl_text_nccl(state));
    if (nccl_now_ns() >= deadline_ns) return NCCL_SETTLE_TIMEOUT;
    nccl_nap(&step);
  }
}

/* ---- the backend table ---------------------------------------------------- */

static int nccl_supports(comm_op_t op, comm_dtype_t dt) {
  return (unsigned)op < COMM_OP__COUNT && (unsigned)dt < COMM_DTYPE__COUNT;
}

/* Under mu: a request from the pool, or a new one; NULL with a message. */
static nccl_req_t *nccl_req_get_locked(nccl_t *c) {
  nccl_req_t *q = c->pool;
  if (q) {
    c->pool = q->next;
    q->next = NULL;
    return q;
  }
  q = calloc(1, sizeof *q);
  if (!q) {
    err_set(FSDP_ENOMEM, "group '%s': no memory for a collective request", c->base.name);
    return NULL;
  }
  if (CUDA_CHECK(c, cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming)) < 0) {
    free(q);
    return NULL;
  }
  q->base.be = &comm_nccl_backend;
  q->c = c;
  return q;
}

/* Under mu: q back to the pool (off the busy list if it is there). */
static void nccl_req_put_locked(nccl_t *c, nccl_req_t *q) {
  if (q->staged) c->host_busy = 0, q->staged = 0;
  for (nccl_req_t **pp = &c->busy; *pp; pp = &(*pp)->next)
    if (*pp == q) {
      *pp = q->next;
      break;
    }
  q->next = c->pool;
  c->pool = q;
}

/* Under mu: the NCCL call of q's op on the own stream. */
static ncclResult_t nccl_enqueue_locked(nccl_t *c, const comm_args_t *a) {
  ncclDataType_t dt = nccl_dtype(a->dtype);
  switch (a->op) {
    case COMM_OP_ALL_GATHER:
      return ncclAllGather(a->send, a->recv, a->count, dt, c->nc, c->stream);
    case COMM_OP_REDUCE_SCATTER:
      return ncclReduceScatter(a->send, a->recv, a->count, dt, nccl_redop(c, a->redop), c->nc,
                               c->stream);
    case COMM_OP_ALL_REDUCE:
      return ncclAllReduce(a->send, a->recv, a->count, dt, nccl_redop(c, a->redop), c->nc,
                           c->stream);
    case COMM_OP_BROADCAST:
      return ncclBroadcast(a->recv, a->recv, a->count, dt, a->root, c->nc, c->stream);
    case COMM_OP_BARRIER:
      return ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclFloat32, ncclSum, c->nc,
                           c->stream);
    default: return ncclInvalidArgument;
  }
}

/* Whether p is host memory (pageable or page-locked): such buffers are
 * staged through c->host_buf (comm.h's COMM_HOST_BYTES). */
static int nccl_is_host(const void *p) {
  if (!p) return 0;
  struct cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* an older runtime's answer for pageable memory */
    return 1;
  }
  return at.type == cudaMemoryTypeUnregistered || at.type == cudaMemoryTypeHost;
}

/* The bytes an op reads (*sb, from send; broadcast: recv) and writes (*rb,
 * into recv). */
static void nccl_op_bytes(const nccl_t *c, const comm_args_t *a, size_t *sb, size_t *rb) {
  const size_t e = a->dtype == COMM_BF16 ? 2 : 4, n = a->count * e, all = n * (size_t)c->base.size;
  switch (a->op) {
    case COMM_OP_ALL_GATHER: *sb = n, *rb = all; break;
    case COMM_OP_REDUCE_SCATTER: *sb = all, *rb = n; break;
    default: *sb = n, *rb = n; break; /* all_reduce; broadcast reads and writes recv */
  }
}

/* The staging layout of an op on host buffers: its input at host_buf[0,
 * *sb), its output at host_buf[*off, *off + *rb); 0, or EINVAL (with a
 * message; nothing is touched, the communicator stays whole) when it does
 * not fit COMM_HOST_BYTES. */
static int nccl_stage_fits(const nccl_t *c, const comm_args_t *a, size_t *sb, size_t *rb,
                           size_t *off, const char *sig) {
  nccl_op_bytes(c, a, sb, rb);
  *off = (*sb + 15) / 16 * 16;
  if (*off + *rb <= COMM_HOST_BYTES) return 0;
  return err_set(FSDP_EINVAL, "%s on rank %d of group '%s': %zu bytes of host buffers (%zu sent, "
                 "%zu received); NCCL takes host buffers of up to %d bytes in all: pass device "
                 "memory", sig, c->base.rank, c->base.name, *sb + *rb, *sb, *rb, COMM_HOST_BYTES);
}

/* Under mu: an op on host buffers moved onto c->host_buf (nccl_stage_fits
 * said it fits, and no other is in flight): its input copied there through
 * the page-locked bounce buffer (so the copy is truly in stream order and
 * the call never waits for the GPU), the result copied back when waited.
 * 0 and *sa, the op on the device, or a code with a message. */
static int nccl_stage_locked(nccl_t *c, nccl_req_t *q, const comm_args_t *a, comm_args_t *sa) {
  size_t sb, rb, off;
  (void)nccl_stage_fits(c, a, &sb, &rb, &off, "");
  *sa = *a;
  sa->send = c->host_buf;
  sa->recv = c->host_buf + off;
  const void *in = a->op == COMM_OP_BROADCAST ? a->recv : a->send;
  uint8_t *to = a->op == COMM_OP_BROADCAST ? c->host_buf + off : c->host_buf;
  memcpy(c->host_bounce, in, sb);
  int rc = sb ? CUDA_CHECK(c, cudaMemcpyAsync(to, c->host_bounce, sb, cudaMemcpyHostToDevice,
                                              c->stream))
              : 0;
  if (rc) return rc;
  q->staged = 1, q->host_out = a->recv, q->host_off = off, q->host_bytes = rb;
  c->host_busy = 1;
  return 0;
}

/* A staged op's result, after it completed (q->done has fired), into the
 * caller's host buffer through the bounce buffer: a copy on a stream of its
 * own, so nothing queued behind the op is waited for. */
static int nccl_unstage(nccl_t *c, nccl_req_t *q) {
  if (!q->host_bytes) return 0;
  int rc = CUDA_CHECK(c, cudaStreamWaitEvent(c->host_stream, q->done, 0));
  if (!rc)
    rc = CUDA_CHECK(c, cudaMemcpyAsync(c->host_bounce, c->host_buf + q->host_off, q->host_bytes,
                                       cudaMemcpyDeviceToHost, c->host_stream));
  if (!rc) rc = CUDA_CHECK(c, cudaStreamSynchronize(c->host_stream));
  if (!rc) memcpy(q->host_out, c->host_bounce, q->host_bytes);
  return rc;
}

static int nccl_issue(comm_t *base, const comm_args_t *a, comm_req_t **out) {
  nccl_t *c = (nccl_t *)base;
  *out = NULL;
  nccl_dev_enter(c);
  pthread_mutex_lock(&c->issue_mu);
  pthread_mutex_lock(&c->mu);
  nccl_req_t *q = NULL;
  /* host buffers: refused (the caller's mistake, not the group's: it stays
   * whole) when too large or while another such op is in flight */
  const int host = a->count > 0 && a->op != COMM_OP_BARRIER &&
                   (nccl_is_host(a->recv) || (a->op != COMM_OP_BROADCAST && nccl_is_host(a->send)));
  size_t sb, rb, off;
  int rc = host ? nccl_stage_fits(c, a, &sb, &rb, &off, comm_op_name(a->op)) : 0;
  if (rc == 0 && host && c->host_busy)
    rc = err_set(FSDP_EINVAL, "%s on rank %d of group '%s': another op on host buffers is still "
                 "in flight (wait for it first: NCCL stages one at a time)", comm_op_name(a->op),
                 c->base.rank, c->base.name);
  if (rc < 0) {
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->issue_mu);
    return rc;
  }
  rc = nccl_usable_locked(c, comm_op_name(a->op));
  if (rc == 0 && !(q = nccl_req_get_locked(c))) rc = FSDP_ENOMEM;
  if (rc < 0) {
    pthread_mutex_unlock(&c->mu);
    goto out;
  }
  q->a = *a;
  q->seq = ++c->seq;
  q->state = REQ_PENDING;
  q->rc = 0;
  q->msg[0] = 0;
  q->timeout_ms = a->timeout_ms > 0 ? a->timeout_ms : c->timeout_ms;
  q->deadline_ns = nccl_deadline(q->timeout_ms);
  char sig[160];
  nccl_sig(sig, sizeof sig, q);
  /* after everything queued on the compute stream so far */
  ncclResult_t r = ncclSuccess;
  comm_args_t sa = *a; /* a, or the op moved onto host_buf */
  if ((rc = CUDA_CHECK(c, cudaEventRecord(c->ready, c->compute))) == 0 &&
      (rc = CUDA_CHECK(c, cudaStreamWaitEvent(c->stream, c->ready, 0))) == 0 &&
      (!host || (rc = nccl_stage_locked(c, q, a, &sa)) == 0) &&
      (a->count > 0 || a->op == COMM_OP_BARRIER)) { /* nothing to move: only the ordering */
    r = nccl_enqueue_locked(c, &sa);
    if (r != ncclSuccess && r != ncclInProgress) rc = nccl_check_nccl(r, c, sig);
  }
  pthread_mutex_unlock(&c->mu);
  if (rc == 0 && r == ncclInProgress) { /* NCCL's thread is launching it */
    rc = nccl_settle(c, &c->nc, q->deadline_ns, sig);
    if (rc == NCCL_SETTLE_TIMEOUT)
      rc = err_set(FSDP_ETIMEDOUT, "%s on rank %d of group '%s' (%d ranks) could not be started "
                   "within its timeout of %lld ms: NCCL was still connecting to the peers (one "
                   "is dead or stuck); the communicator is aborted", sig, c->base.rank,
                   c->base.name, c->base.size, (long long)q->timeout_ms);
  }
  pthread_mutex_lock(&c->mu);
  if (rc == 0) rc = nccl_usable_locked(c, sig); /* an abort while NCCL was launching it */
  if (rc == 0) rc = CUDA_CHECK(c, cudaEventRecord(q->done, c->stream));
  if (rc == 0) {
    q->next = c->busy;
    c->busy = q;
    *out = &q->base;
  } else {
    nccl_req_put_locked(c, q);
  }
  pthread_mutex_unlock(&c->mu);
  /* a failure of this op breaks c (a no-op when an earlier one or an abort did) */
  if (rc < 0) rc = nccl_fail(c, rc);
out:
  pthread_mutex_unlock(&c->issue_mu);
  return rc;
}

static int nccl_wait(comm_req_t *req, int64_t wait_ms) {
  nccl_req_t *q = (nccl_req_t *)req;
  nccl_t *c = q->c;
  nccl_dev_enter(c);
  int64_t until = nccl_deadline(wait_ms); /* < 0: none */
  const int64_t fine_until = nccl_now_ns() + NCCL_WAIT_FINE_NS;
  int64_t step = NCCL_WAIT_FIRST_NS;
  int rc;
  for (;;) {
    ncclComm_t dead = NULL;
    pthread_mutex_lock(&c->mu);
    int64_t now = nccl_now_ns();
    if (q->state == REQ_PENDING) {
      char sig[160], msg[NCCL_MSG];
      int fail = 0;
      cudaError_t e = cudaEventQuery(q->done);
      if (e == cudaSuccess) {
        q->state = REQ_OK;
      } else if (e != cudaErrorNotReady) {
        nccl_sig(sig, sizeof sig, q);
        fail = nccl_check_cuda(e, c, sig);
      } else {
        ncclResult_t state = ncclSuccess, r = ncclSuccess;
        if (c->nc) r = ncclCommGetAsyncError(c->nc, &state);
        nccl_sig(sig, sizeof sig, q);
        if (r != ncclSuccess)
          fail = nccl_check_nccl(r, c, "ncclCommGetAsyncError");
        else if (state != ncclSuccess && state != ncclInProgress)
          fail = err_set(nccl_map_nccl(state), "%s on rank %d of group '%s' failed: %s", sig,
                         c->base.rank, c->base.name, nccl_text_nccl(state));
        else if (now >= q->deadline_ns)
          fail = err_set(FSDP_ETIMEDOUT, "%s on rank %d of group '%s' (%d ranks) did not "
                         "complete within its timeout of %lld ms since it was issued: a peer is "
                         "dead or stuck, or this GPU's compute stream never reached the op; the "
                         "communicator is aborted (destroy it and rebuild the group)", sig,
                         c->base.rank, c->base.name, c->base.size, (long long)q->timeout_ms);
      }
      if (fail) {
        snprintf(msg, sizeof msg, "%s", err_msg());
        dead = nccl_break_locked(c, fail, msg, q);
        if (q->state == REQ_PENDING) { /* broken earlier, yet q was left running: cannot be */
          q->state = REQ_FAILED;
          q->rc = fail;
          snprintf(q->msg, sizeof q->msg, "%s", msg);
        }
      }
    }
    if (q->state != REQ_PENDING) {
      if (q->state == REQ_OK) {
        /* the compute stream's later work sees the op's result */
        rc = CUDA_CHECK(c, cudaStreamWaitEvent(c->compute, q->done, 0));
      } else {
        /* A failed op may go on touching its buffers until the reaper's
         * ncclCommAbort ends its kernel, and the caller frees them now
         * (fsdp.c, to the stream-ordered pool, where the compute stream's
         * next allocation could take them): that stream's later work waits
         * for the op's end too. Its own failure (a broken context) is not
         * this op's error. */
        (void)cudaStreamWaitEvent(c->compute, q->done, 0);
        rc = err_set(q->rc, "%s", q->msg);
      }
      if (q->state == REQ_OK && !rc && q->staged) {
        /* the host's copy, out of mu (it waits for the GPU); host_buf stays
         * this op's until the request goes back */
        pthread_mutex_unlock(&c->mu);
        rc = nccl_unstage(c, q);
        pthread_mutex_lock(&c->mu);
      }
      const int unstaged = q->staged; /* a CUDA error copying back breaks c, as any would */
      nccl_req_put_locked(c, q);
      pthread_mutex_unlock(&c->mu);
      nccl_reap(c, dead);
      if (rc < 0 && unstaged && !dead) rc = nccl_fail(c, rc);
      break;
    }
    pthread_mutex_unlock(&c->mu);
    if (now >= until) {
      rc = COMM_PENDING;
      break;
    }
    nccl_nap_to(&step, now < fine_until ? NCCL_WAIT_FINE_MAX_NS : NCCL_POLL_MAX_NS);
  }
  return rc;
}

static void nccl_abort(comm_t *base) {
  nccl_t *c = (nccl_t *)base;
  nccl_dev_enter(c);
  atomic_store(&c->aborted, 1);
  char msg[NCCL_MSG];
  snprintf(msg, sizeof msg, "rank %d of group '%s' aborted its communicator (comm_abort)",
           c->base.rank, c->base.name);
  pthread_mutex_lock(&c->mu);
  ncclComm_t nc = nccl_break_locked(c, FSDP_ECANCELED, msg, NULL);
  pthread_mutex_unlock(&c->mu);
  nccl_reap(c, nc);
}

static void nccl_destroy(comm_t *base) {
  nccl_t *c = (nccl_t *)base;
  nccl_dev_enter(c);
  pthread_mutex_lock(&c->mu);
  int running = 0;
  for (nccl_req_t *q = c->busy; q; q = q->next)
    if (q->state == REQ_PENDING) running |= cudaEventQuery(q->done) != cudaSuccess;
  ncclComm_t nc = NULL;
  if (running || c->broken_rc || atomic_load(&c->aborted)) {
    char msg[NCCL_MSG];
    snprintf(msg, sizeof msg, "group '%s' rank %d: the communicator was destroyed with ops "
             "still running", c->base.name, c->base.rank);
    nc = nccl_break_locked(c, FSDP_ECANCELED, msg, NULL);
    pthread_mutex_unlock(&c->mu);
    nccl_reap(c, nc);
  } else {
    /* a clean end: NCCL flushes and frees, bounded by the default timeout */
    nc = c->nc;
    c->nc = NULL;
    pthread_mutex_unlock(&c->mu);
    int rc = -1;
    if (nc) {
      ncclResult_t r = ncclCommFinalize(nc);
      if (r == ncclSuccess || r == ncclInProgress) {
        ncclComm_t slot = nc;
        rc = nccl_settle(c, &slot, nccl_deadline(c->timeout_ms), "ncclCommFinalize");
        if (rc == NCCL_SETTLE_TIMEOUT)
          err_set(FSDP_ETIMEDOUT, "group '%s' rank %d: ncclCommFinalize did not end within %lld "
                  "ms", c->base.name, c->base.rank, (long long)c->timeout_ms);
      } else {
        nccl_check_nccl(r, c, "ncclCommFinalize");
      }
      if (rc == 0 && NCCL_CHECK(c, ncclCommDestroy(nc)) < 0) LOG_WARN("comm", "%s", err_msg());
      if (rc != 0) {
        LOG_WARN("comm", "%s; aborting it instead", err_msg());
        nccl_reap(c, nc);
      }
    }
  }
  nccl_unref(c); /* the owner's reference: requests never waited go with it */
}

static size_t nccl_buffer_bytes(int size) { return comm_nccl_size_bytes(size); }

static int nccl_split(comm_t *base, int color, int key, const char *name, int64_t timeout_ms,
                      comm_t **out);

const comm_backend_t comm_nccl_backend = {
    .name = "nccl",
    .supports = nccl_supports,
    .issue = nccl_issue,
    .wait = nccl_wait,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
    .split = nccl_split,
    .buffer_bytes = nccl_buffer_bytes, /* nccl_size.h: an estimate, see there */
};

/* ---- creation and split ------------------------------------------------------ */

/* c's NCCL communicator is made (or being made by NCCL's thread): waits for
 * it, then reads its rank and size. 0, or a negative code with a message
 * (a timeout worded by the caller's timeout_what). */
static int nccl_join(nccl_t *c, int64_t deadline_ns, int64_t timeout_ms, const char *what) {
  int rc = nccl_settle(c, &c->nc, deadline_ns, what);
  if (rc == NCCL_SETTLE_TIMEOUT)
    return err_set(FSDP_ETIMEDOUT, "group '%s' (%d ranks): %s: not complete after %lld ms on "
                   "rank %d: some ranks never joined (dead, not started, or given another id "
                   "or color); FSDP_COMM_TIMEOUT_MS sets this bound", c->base.name, c->base.size,
                   what, (long long)timeout_ms, c->base.rank);
  if (rc < 0) return rc;
  int n = 0, r = 0;
  pthread_mutex_lock(&c->mu);
  if ((rc = NCCL_CHECK(c, ncclCommCount(c->nc, &n))) == 0)
    rc = NCCL_CHECK(c, ncclCommUserRank(c->nc, &r));
  pthread_mutex_unlock(&c->mu);
  if (rc < 0) return rc;
  c->base.size = n;
  c->base.rank = r;
  return 0;
}

int comm_nccl_unique_id(uint8_t id[COMM_NCCL_ID_BYTES]) {
  if (!id) return err_set(FSDP_EINVAL, "comm_nccl_unique_id: NULL id");
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess)
    return err_set(nccl_map_nccl(r), "ncclGetUniqueId: %s (NCCL needs a usable network interface "
                   "for its bootstrap, even on one node: see NCCL_SOCKET_IFNAME)",
                   nccl_text_nccl(r));
  memcpy(id, &u, sizeof u);
  return 0;
}

int comm_nccl_create(const comm_nccl_opts_t *o, comm_t **out) {
  if (!out) return err_set(FSDP_EINVAL, "comm_nccl_create: NULL out");
  *out = NULL;
  if (!o) return err_set(FSDP_EINVAL, "comm_nccl_create: NULL options");
  const char *name = o->name && *o->name ? o->name : "world";
  if (o->size < 1 || o->rank < 0 || o->rank >= o->size)
    return err_set(FSDP_EINVAL, "comm_nccl_create: group '%s': rank %d of size %d (need 0 <= "
                   "rank < size)", name, o->rank, o->size);
  if (!o->id)
    return err_set(FSDP_EINVAL, "comm_nccl_create: group '%s': NULL NCCL id (rank 0 makes it "
                   "with comm_nccl_unique_id and the bootstrap carries it)", name);
  if (strlen(name) > 63)
    return err_set(FSDP_EINVAL, "comm_nccl_create: group name \"%s\" is over 63 bytes", name);
  if (o->timeout_ms < 0)
    return err_set(FSDP_EINVAL, "comm_nccl_create: group '%s': timeout %lld ms is negative (0 "
                   "means the default)", name, (long long)o->timeout_ms);
  nccl_t *c;
  int rc = nccl_alloc(name, o->rank, o->size, (cudaStream_t)o->stream, o->timeout_ms, &c);
  if (rc < 0) return err_wrap(rc, "comm_nccl_create");
  nccl_dev_enter(c);
  const int64_t t0 = nccl_now_ns(), deadline = nccl_deadline(c->timeout_ms);
  ncclUniqueId uid;
  memcpy(&uid, o->id, sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c->nc, o->size, uid, o->rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    rc = nccl_check_nccl(r, c, "ncclCommInitRankConfig");
  else
    rc = nccl_join(c, deadline, c->timeout_ms, "ncclCommInitRankConfig");
  if (rc < 0) {
    char msg[NCCL_MSG];
    snprintf(msg, sizeof msg, "%s", err_msg());
    pthread_mutex_lock(&c->mu);
    ncclComm_t nc = c->nc;
    c->nc = NULL;
    pthread_mutex_unlock(&c->mu);
    nccl_reap(c, nc); /* a join in flight ends there */
    nccl_unref(c);
    return err_set(rc, "%s", msg);
  }
  LOG_DEBUG("comm", "group '%s': rank %d of %d joined (NCCL, %.0f ms)", c->base.name,
            c->base.rank, c->base.size, (double)(nccl_now_ns() - t0) / 1e6);
  *out = &c->base;
  return 0;
}

static int nccl_split(comm_t *base, int color, int key, const char *name, int64_t timeout_ms,
                      comm_t **out) {
  nccl_t *p = (nccl_t *)base;
  *out = NULL;
  if (strlen(name) > 63)
    return err_set(FSDP_EINVAL, "split of group '%s': name \"%s\" is over 63 bytes", p->base.name,
                   name);
  const int64_t tmo = timeout_ms > 0 ? timeout_ms : p->timeout_ms;
  nccl_dev_enter(p);
  pthread_mutex_lock(&p->issue_mu);
  nccl_t *child = NULL;
  char what[160];
  snprintf(what, sizeof what, "split of group '%s' into '%s' (color %d)", p->base.name, name,
           color);
  pthread_mutex_lock(&p->mu);
  int rc = nccl_usable_locked(p, what);
  pthread_mutex_unlock(&p->mu);
  if (rc < 0) goto out;
  if (color >= 0 && (rc = nccl_alloc(name, -1, -1, p->compute, tmo, &child)) < 0) {
    rc = err_wrap(rc, "%s", what);
    goto out;
  }
  const int64_t deadline = nccl_deadline(tmo);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.splitShare = 0; /* own resources: a child's abort must not reach the parent */
  pthread_mutex_lock(&p->mu);
  if ((rc = nccl_usable_locked(p, what)) == 0) {
    __atomic_store_n(&p->split_slot, NULL, __ATOMIC_RELEASE);
    ncclResult_t r = ncclCommSplit(p->nc, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key,
                                   &p->split_slot, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) rc = nccl_check_nccl(r, p, what);
  }
  pthread_mutex_unlock(&p->mu);
  if (rc == 0) rc = nccl_settle(p, &p->nc, deadline, what);
  if (rc == NCCL_SETTLE_TIMEOUT)
    rc = err_set(FSDP_ETIMEDOUT, "%s: not complete after %lld ms on rank %d of %d: some ranks "
                 "of '%s' never called split (dead or stuck); '%s' is aborted", what,
                 (long long)tmo, p->base.rank, p->base.size, p->base.name, p->base.name);
  if (rc < 0) {
    /* the split was the parent's collective: its failure breaks the parent
     * (the reaper also aborts a child NCCL may still make) */
    rc = nccl_fail(p, rc);
    goto out;
  }
  pthread_mutex_lock(&p->mu);
  rc = nccl_usable_locked(p, what);
  ncclComm_t cn = NULL;
  if (rc == 0) cn = __atomic_exchange_n(&p->split_slot, NULL, __ATOMIC_ACQ_REL);
  pthread_mutex_unlock(&p->mu);
  if (rc < 0) goto out; /* aborted meanwhile: the reaper owns the slot */
  if (color < 0) {
    if (cn) (void)ncclCommAbort(cn); /* NCCL made none; a stray one must not live */
    goto out;
  }
  if (!cn) {
    rc = err_set(FSDP_EINTERNAL, "%s: NCCL returned no communicator", what);
    goto out;
  }
  child->nc = cn;
  child->base.size = p->base.size; /* for messages until NCCL says */
  if ((rc = nccl_join(child, deadline, tmo, "ncclCommSplit")) < 0) {
    char msg[NCCL_MSG];
    snprintf(msg, sizeof msg, "%s", err_msg());
    child->nc = NULL;
    nccl_reap(child, cn);
    rc = err_set(rc, "%s", msg);
    goto out;
  }
  /* its buffers, now that its size is known (nccl_alloc could not count
   * them: before, a split group's were missing from the count the plan is
   * held to) */
  child->counted = comm_nccl_size_bytes(child->base.size);
  if (child->counted) mem_account(MEM_COMM, child->counted, 1);
  LOG_DEBUG("comm", "%s: rank %d of %d", what, child->base.rank, child->base.size);
  *out = &child->base;
  child = NULL;
out:
  if (child) {
    char msg[NCCL_MSG];
    snprintf(msg, sizeof msg, "%s", err_msg());
    nccl_unref(child);
    err_set(rc, "%s", msg);
  }
  pthread_mutex_unlock(&p->issue_mu);
  return rc;
}

int comm_nccl_quiesce(int64_t wait_ms) {
  int64_t until = nccl_deadline(wait_ms > 0 ? wait_ms : 0), step = NCCL_POLL_FIRST_NS;
  while (atomic_load(&nccl_reaping) > 0) {
    if (nccl_now_ns() >= until) return COMM_PENDING;
    nccl_nap(&step);
  }
  return 0;
}

/* comm: collectives on a group of ranks, behind one backend table.
 *
 * A communicator (comm_t) is one group: the world, a shard group or a replica
 * group are each their own communicator. The world is made by a backend's own
 * create call from what the rank was told about its peers (boot.h is the one
 * place that does it); groups are split from it (comm_split). A backend (ring
 * over TCP and shared memory for CPU devices, ring.h; NCCL next) fills a
 * static const comm_backend_t (after ggml's ggml_backend_i and redis's
 * ConnectionType); callers only use the comm_* functions below.
 *
 * Contract, for every backend:
 *  - Every op is asynchronous: comm_i*() queues it and returns a request;
 *    comm_wait() waits for it with a bound and releases it. Ops of one
 *    communicator run in issue order (the ring runs them on a communication
 *    thread the communicator owns; NCCL would run them on its stream), so the
 *    caller computes while they run. The caller keeps the buffers alive and
 *    untouched (read-only for inputs) until the request is waited.
 *  - Every op has a timeout, counted from when it starts running (0: the
 *    communicator's default, FSDP_COMM_TIMEOUT_MS). A dead, stalled or
 *    divergent peer makes the op fail within it, with a message naming the
 *    peer rank; it never hangs.
 *  - After any op fails, the communicator is broken: every later op fails at
 *    once with the same code. Destroy it and rebuild the group (NCCL's model).
 *  - comm_abort() from any thread fails the running and queued ops and every
 *    later one with FSDP_ECANCELED, promptly; comm_destroy() always returns.
 *  - Buffers are the device's memory (the CPU's: any host memory). Every
 *    backend also takes host buffers of up to COMM_HOST_BYTES in all
 *    (send and receive together) for the control values a rank agrees on
 *    with its peers (a loss, a gradient norm, a checkpoint's choice): the
 *    NCCL backend stages them through device memory of its own, one such
 *    op in flight per communicator (the send part rounded up to 16 bytes);
 *    a larger host buffer there is refused, the communicator left whole.
 *  - Counts are in elements. all_gather and reduce_scatter take the per-rank
 *    count (send count elements, receive count*size; and the reverse);
 *    all_reduce and broadcast take the whole count, any value.
 *  - bf16 is uint16 storage. Reductions add in fp32 per element and round to
 *    bf16 (round-to-nearest-even) once per hop: a sum over n ranks is rounded
 *    at most n-1 times, each within 2^-8 of the value rounded (bf16 keeps 8
 *    significant bits), so it is within (n-1) * 2^-8 * sum|x_i| of the exact
 *    sum (for n = 2 it is exactly bf16(a + b)); an average divides the last
 *    fp32 sum by n before its one rounding. fp32 sums are plain fp32 adds in
 *    ring order (a fixed order for a given group size and rank).
 */
#ifndef FSDP_COMM_H
#define FSDP_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  COMM_OP_ALL_GATHER,
  COMM_OP_REDUCE_SCATTER,
  COMM_OP_ALL_REDUCE,
  COMM_OP_BROADCAST,
  COMM_OP_BARRIER,
  COMM_OP__COUNT
} comm_op_t;

typedef enum { COMM_F32, COMM_BF16, COMM_DTYPE__COUNT } comm_dtype_t;

/* Host buffers every backend takes, in bytes (the contract above). */
#define COMM_HOST_BYTES 4096
typedef enum { COMM_SUM, COMM_AVG, COMM_REDOP__COUNT } comm_redop_t;

/* One collective. Unused fields are ignored (redop outside reductions, root
 * outside broadcast, buffers for barrier). */
typedef struct {
  comm_op_t op;
  comm_dtype_t dtype;
  comm_redop_t redop;
  const void *send; /* all_gather: count; reduce_scatter: count*size; all_reduce: count */
  void *recv;       /* all_gather: count*size; reduce_scatter: count; all_reduce: count;
                       broadcast: count, in place (the root's is the source) */
  size_t count;
  int root;           /* broadcast */
  int64_t timeout_ms; /* 0: the communicator's default */
} comm_args_t;

typedef struct comm comm_t;
typedef struct comm_req comm_req_t;

/* What comm_wait returns while the op is still running (the request stays valid). */
#define COMM_PENDING 1

typedef struct comm_backend {
  const char *name;
  /* 1 when the backend runs op on dtype, 0 when not (never a crash). */
  int (*supports)(comm_op_t op, comm_dtype_t dtype);
  /* Queues an op (arguments already checked); 0 and *req, or a negative code. */
  int (*issue)(comm_t *c, const comm_args_t *a, comm_req_t **req);
  /* See comm_wait. */
  int (*wait)(comm_req_t *req, int64_t wait_ms);
  void (*abort)(comm_t *c);
  void (*destroy)(comm_t *c);
  /* See comm_split. */
  int (*split)(comm_t *c, int color, int key, const char *name, int64_t timeout_ms,
               comm_t **out);
  /* Bytes one communicator of size ranks holds (MEM_COMM) with the default
   * tunables, for memory plans made before any communicator exists. */
  size_t (*buffer_bytes)(int size);
} comm_backend_t;

/* Backends embed these as their first member; callers use the accessors. */
struct comm {
  const comm_backend_t *be;
  int rank, size;
  char name[64]; /* the group's name, in every message */
};
struct comm_req {
  const comm_backend_t *be;
};

/* Asynchronous ops: 0 and *req, or a negative code (bad arguments, a broken or
 * aborted communicator) with a message and *req = NULL. */
int comm_issue(comm_t *c, const comm_args_t *a, comm_req_t **req);
int comm_iall_gather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                     comm_req_t **req);
int comm_ireduce_scatter(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                         comm_redop_t redop, comm_req_t **req);
int comm_iall_reduce(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                     comm_redop_t redop, comm_req_t **req);
int comm_ibroadcast(comm_t *c, void *buf, size_t count, comm_dtype_t dt, int root,
                    comm_req_t **req);
int comm_ibarrier(comm_t *c, comm_req_t **req);

/* Waits up to wait_ms (< 0: until the op ends, which its own timeout bounds).
 * COMM_PENDING: still running, req stays valid. Otherwise the op's result (0 or
 * a negative code, its message set on this thread) and req is released. */
int comm_wait(comm_req_t *req, int64_t wait_ms);

/* Blocking forms: issue and wait. */
int comm_run(comm_t *c, const comm_args_t *a);
int comm_all_gather(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt);
int comm_reduce_scatter(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                        comm_redop_t redop);
int comm_all_reduce(comm_t *c, const void *send, void *recv, size_t count, comm_dtype_t dt,
                    comm_redop_t redop);
int comm_broadcast(comm_t *c, void *buf, size_t count, comm_dtype_t dt, int root);
int comm_barrier(comm_t *c);

/* Makes this rank's sub-group from c, as ncclCommSplit does: every rank of c
 * calls it (it is collective); the ranks with the same color >= 0 form a
 * group ordered by key (ties: rank in c), named name; color < 0 takes part
 * but joins nothing (*out = NULL). timeout_ms bounds the connection (0: c's
 * default). 0, or a negative code with a message. */
int comm_split(comm_t *c, int color, int key, const char *name, int64_t timeout_ms,
               comm_t **out);

int comm_rank(const comm_t *c);
int comm_size(const comm_t *c);
/* The group's name ("world", "shard", "replica"): every message names it. */
const char *comm_name(const comm_t *c);
const comm_backend_t *comm_backend(const comm_t *c);
/* be->buffer_bytes(size): what a communicator of size ranks holds. */
size_t comm_buffer_bytes(const comm_backend_t *be, int size);

int comm_supports(const comm_t *c, comm_op_t op, comm_dtype_t dt);
/* Fails the running and queued ops and every later one with FSDP_ECANCELED
 * and tells the peers (they fail with FSDP_EPEER naming this rank). Any thread. */
void comm_abort(comm_t *c);
/* Aborts what is still running, joins the backend's threads, closes its
 * connections, frees requests never waited. Always returns; NULL is a no-op. */
void comm_destroy(comm_t *c);

const char *comm_op_name(comm_op_t op);
const char *comm_dtype_name(comm_dtype_t dt);
size_t comm_dtype_size(comm_dtype_t dt);

#endif

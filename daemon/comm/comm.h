/* comm: collectives on a group of ranks, behind one backend table.
 *
 * A communicator (comm_t) is one group: the world, a shard group or a replica
 * group are each their own communicator, made from the list of every member's
 * address (the control plane hands those out; until then a local launcher or
 * a test does). A backend (ring over TCP for CPU devices now, NCCL later) fills
 * a static const comm_backend_t (after ggml's ggml_backend_i and redis's
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
} comm_backend_t;

/* Backends embed these as their first member; callers use the functions. */
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

/* The ring over TCP (ring.c). Rank r listens at addrs[r], connects to rank
 * r+1 and accepts rank r-1; a handshake checks the group's name and size and
 * both ranks, so mis-wired address lists are an error naming both sides. */
typedef struct {
  int rank, size;
  const char *const *addrs; /* size entries, "host:port" ("[v6]:port" too) */
  const char *name;         /* group name, up to 63 bytes; both sides must agree */
  int listen_fd;            /* -1: bind addrs[rank]; else a bound socket, owned from now on */
  int64_t timeout_ms;       /* bootstrap deadline and default op timeout; 0: FSDP_COMM_TIMEOUT_MS */
  size_t chunk_bytes;       /* 0: FSDP_COMM_CHUNK_BYTES */
  size_t staging_bytes;     /* 0: FSDP_COMM_STAGING_BYTES */
} comm_ring_opts_t;

extern const comm_backend_t comm_ring_backend;

/* Makes this rank's sub-group ring from a world ring (ring_split.c), as
 * ncclCommSplit does: every world rank calls it (collective); the ranks with
 * the same color >= 0 form a ring ordered by key (ties: world rank), named
 * name; color < 0 takes part but joins nothing (*out = NULL). self_addr is the
 * rank's world address: the sub-group listens on the same host. */
int comm_ring_split(comm_t *world, const char *self_addr, int color, int key, const char *name,
                    int64_t timeout_ms, comm_t **out);
/* The bytes one ring communicator of size ranks holds in MEM_COMM with the
 * default tunables (memory plans count it per communicator). */
size_t comm_ring_buffer_bytes(int size);
/* Connects the ring (blocking, bounded by timeout_ms); 0 and *out, or a code. */
int comm_ring_create(const comm_ring_opts_t *o, comm_t **out);

#endif

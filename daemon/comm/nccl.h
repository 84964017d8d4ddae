/* nccl: the collectives on GPUs (comm_backend_t over NCCL).
 *
 * Built into the CUDA plugin (libfsdp-cuda.so, daemon/train/device_cuda.h),
 * never into the main binaries. Communicators are made from an NCCL unique
 * id that reaches every rank through the job's bootstrap (boot.h: rank 0
 * makes it, the ring bootstrap carries it); groups are split with
 * ncclCommSplit. Every communicator is non-blocking (ncclConfig_t.blocking
 * 0), so creation, split and every op can be bounded by a timeout and ended
 * by ncclCommAbort.
 *
 * Ordering: an op is enqueued on the communicator's own stream after an
 * event recorded on the compute stream given at create (the kernels' stream,
 * kern_cuda_stream), so it sees every kernel queued before it; comm_wait
 * polls the op's completion event and ncclCommGetAsyncError until the op
 * ends, its timeout passes (the communicator is then aborted: broken, as
 * comm.h says) or comm_abort is called, and on success makes the compute
 * stream wait for the op too. Buffers are device memory of the current
 * device.
 *
 * One GPU a process: a communicator serves the device current on the
 * thread that made it, and every call makes that device current on the
 * calling thread and leaves it so (setting a thread back to CUDA's default
 * device 0 would make a context on a GPU another rank owns).
 *
 * Timeouts count from issue, not from when the GPU starts the op (the host
 * cannot see that without polling): an op stuck behind a compute stream
 * that never reaches it times out too. The ops of one communicator run in
 * issue order on its stream, so an op issued behind a long one waits for it
 * within its own timeout.
 *
 * Aborts (a timeout, an NCCL error, comm_abort, destroy with ops running)
 * fail the running ops at once and run ncclCommAbort on a thread of their
 * own: it waits for NCCL's streams, hence for the compute stream, and must
 * not hold the caller. comm_destroy never waits for the GPU on that path;
 * comm_nccl_quiesce waits for those threads (before exit).
 *
 * Reductions: fp32 sums are NCCL's (its own order: not the ring's bytes);
 * bf16 sums add in fp32 inside NCCL's kernels and round per hop, as the
 * ring does; COMM_AVG is ncclAvg, which scales each input by 1/n before the
 * sum (for bf16, by a bf16 1/n): exact for a power-of-two group, within
 * bf16 rounding of comm.h's "divide the last sum" otherwise. */
#ifndef FSDP_COMM_NCCL_H
#define FSDP_COMM_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/comm/comm.h"

/* sizeof(ncclUniqueId), checked where nccl.h is included. */
#define COMM_NCCL_ID_BYTES 128

extern const comm_backend_t comm_nccl_backend;

typedef struct comm_nccl_opts {
  int rank, size;
  const uint8_t *id;  /* COMM_NCCL_ID_BYTES, the same on every rank */
  const char *name;   /* the group's name ("world") */
  int64_t timeout_ms; /* creation and the default per op (0: FSDP_COMM_TIMEOUT_MS) */
  void *stream;       /* the compute stream (a cudaStream_t) ops order after */
} comm_nccl_opts_t;

/* A new unique id (rank 0 calls it, once per communicator made by create). */
int comm_nccl_unique_id(uint8_t id[COMM_NCCL_ID_BYTES]);
/* Joins the communicator every rank of o->size joins with the same id:
 * 0 and *out, or a negative code with a message (NCCL's error, a timeout
 * naming the ranks that never came). */
int comm_nccl_create(const comm_nccl_opts_t *o, comm_t **out);
/* Waits up to wait_ms for the aborts still running in the background to end:
 * 0 when none is left, COMM_PENDING when some still are (a GPU stream that
 * never drains keeps ncclCommAbort waiting). */
int comm_nccl_quiesce(int64_t wait_ms);

#endif

/* nccl_emu.cc: NCCL for cuda_emu (cuda_emu.h), one rank a communicator:
 * what daemon/comm/nccl.c calls, so the CUDA plugin built on the emulator
 * (build/emu/libfsdp-cuda.so) trains through the same NCCL backend a GPU
 * does. With one rank every collective is a copy (an average of one is the
 * value itself); each runs when it is called, as the emulated stream does.
 * Non-blocking communicators (config.blocking = 0) answer ncclInProgress to
 * init, split and finalize, and ncclCommGetAsyncError then says ncclSuccess,
 * so nccl.c's polling runs. A communicator of more than one rank is refused
 * (ncclInvalidUsage, saying why): ranks on several GPUs stay the ring's and a
 * GPU's to show. Buffers must be device memory (cudaMalloc), as NCCL's. */
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_emu.h"

struct ncclComm {
  int blocking;
};

static pthread_mutex_t nccl_emu_mu = PTHREAD_MUTEX_INITIALIZER;
static char nccl_emu_last[256];

static ncclResult_t nccl_emu_fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t nccl_emu_fail(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&nccl_emu_mu);
  vsnprintf(nccl_emu_last, sizeof nccl_emu_last, fmt, ap);
  pthread_mutex_unlock(&nccl_emu_mu);
  va_end(ap);
  return r;
}

static size_t nccl_emu_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64: return 8;
  default: return 0;
  }
}

static ncclResult_t nccl_emu_new(ncclComm_t *out, const ncclConfig_t *cfg) {
  ncclComm *c = (ncclComm *)calloc(1, sizeof *c);
  if (!c) return nccl_emu_fail(ncclSystemError, "cuda_emu: out of memory");
  c->blocking = !cfg || cfg->blocking != 0;
  *out = c;
  return c->blocking ? ncclSuccess : ncclInProgress;
}

/* One collective of n elements of t from send to recv (ring of one). */
static ncclResult_t nccl_emu_copy(const char *what, const void *send, void *recv, size_t n,
                                  ncclDataType_t t, ncclComm_t c) {
  if (!c) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: %s on a NULL communicator", what);
  const size_t es = nccl_emu_size(t);
  if (!es) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: %s: data type %d", what, (int)t);
  if (!n) return ncclSuccess;
  if (!emu::device_range(send, n * es) || !emu::device_range(recv, n * es))
    return nccl_emu_fail(ncclInvalidArgument,
                         "cuda_emu: %s of %zu bytes: a buffer is not device memory", what, n * es);
  if (send != recv) memmove(recv, send, n * es);
  return ncclSuccess;
}

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "cuda_emu %p", (void *)id);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId, int rank,
                                    ncclConfig_t *config) {
  *comm = NULL;
  if (nranks != 1 || rank != 0)
    return nccl_emu_fail(ncclInvalidUsage,
                         "cuda_emu: rank %d of %d: the emulated NCCL has one "
                         "rank a communicator",
                         rank, nranks);
  return nccl_emu_new(comm, config);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int, ncclComm_t *newcomm,
                           ncclConfig_t *config) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: split of a NULL communicator");
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = NULL;
    return comm->blocking ? ncclSuccess : ncclInProgress;
  }
  const ncclResult_t r = nccl_emu_new(newcomm, config);
  return r == ncclSuccess && !comm->blocking ? ncclInProgress : r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: NULL communicator");
  *state = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: finalize of NULL");
  return comm->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  free(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  free(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: NULL communicator");
  *count = 1;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm) return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: NULL communicator");
  *rank = 0;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t, ncclComm_t comm, cudaStream_t) {
  return nccl_emu_copy("ncclAllReduce", send, recv, count, t, comm);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t, ncclComm_t comm, cudaStream_t) {
  return nccl_emu_copy("ncclReduceScatter", send, recv, recvcount, t, comm);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t) {
  return nccl_emu_copy("ncclAllGather", send, recv, sendcount, t, comm);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t) {
  if (root != 0)
    return nccl_emu_fail(ncclInvalidArgument, "cuda_emu: broadcast root %d of 1", root);
  return nccl_emu_copy("ncclBroadcast", send, recv, count, t, comm);
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t) { return nccl_emu_last; }

} /* extern "C" */

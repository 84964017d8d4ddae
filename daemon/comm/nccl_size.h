/* nccl_size: the device memory an NCCL communicator takes, as a formula with
 * no code behind it (header only), for the memory plan (daemon/job/plan.c),
 * which links no collective, and for the backend's buffer_bytes.
 *
 * NCCL allocates it inside ncclCommInitRank / ncclCommSplit, out of the
 * accounting allocator's sight, so this is an estimate from NCCL's defaults
 * (NCCL_BUFFSIZE 4 MiB for the Simple protocol, plus the LL and LL128
 * buffers, per channel and per ring neighbour, sending and receiving), not
 * a count: the GPU checks measure the real figure (cudaMemGetInfo around a
 * communicator's creation) and docs/ARCHITECTURE.md records it. A group of
 * one rank has no peer and takes no buffers. */
#ifndef FSDP_COMM_NCCL_SIZE_H
#define FSDP_COMM_NCCL_SIZE_H

#include <stddef.h>

/* Channels NCCL opens on one node of NVLink GPUs (H100: up to 32; fewer over PCIe). */
#define COMM_NCCL_SIZE_CHANNELS 32
/* Per channel and neighbour: Simple 4 MiB + LL128 ~4.6 MiB + LL 256 KiB, rounded up. */
#define COMM_NCCL_SIZE_PER_PEER ((size_t)9 << 20)

static inline size_t comm_nccl_size_bytes(int size) {
  if (size < 2) return 0;
  return (size_t)COMM_NCCL_SIZE_CHANNELS * 2 /* neighbours */ * COMM_NCCL_SIZE_PER_PEER;
}

#endif

/* ring_size: the bytes a ring communicator holds, as formulas with no code
 * behind them (header only). The ring sizes its buffers with them (ring.c's
 * staging, shm.c's links) and the memory plan (daemon/job/plan.c), which
 * links no collective, predicts MEM_COMM with them: one formula, so the plan
 * and the ring cannot drift. docs/RING.md states it. */
#ifndef FSDP_COMM_RING_SIZE_H
#define FSDP_COMM_RING_SIZE_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/common/param.h"

/* A shared-memory link maps its header and its data: what it counts in
 * MEM_COMM on each side while mapped (shm.c asserts the header's size). */
#define COMM_SHM_HDR_BYTES 192
#define COMM_SHM_MAP_BYTES(cap) (COMM_SHM_HDR_BYTES + (cap))

/* The capacity of a link asked for cap bytes: a power of two, 64 KiB to 1 GiB. */
static inline uint64_t comm_ring_size_link(size_t cap) {
  uint64_t c = 65536;
  while (c < cap && c < ((uint64_t)1 << 30)) c <<= 1;
  return c;
}

/* The reduce staging of a communicator asked for st bytes: at least 64,
 * whole fp32 and bf16 elements. */
static inline size_t comm_ring_size_staging(int64_t st) {
  return (size_t)(st < 64 ? 64 : st) & ~(size_t)3;
}

/* Bytes one communicator of size ranks holds with the tunables of this
 * process (FSDP_COMM_STAGING_BYTES, FSDP_COMM_SHM, FSDP_COMM_SHM_BYTES): its
 * staging and two shared-memory links. A link that stays TCP maps nothing,
 * so this is the most it holds. */
static inline size_t comm_ring_size_bytes(int size) {
  if (size < 2) return 0;
  const int64_t sb = param_comm_shm_bytes();
  const size_t links = param_comm_shm() != 0 ? 2 : 0;
  return comm_ring_size_staging(param_comm_staging_bytes()) +
         links * COMM_SHM_MAP_BYTES((size_t)comm_ring_size_link(sb > 0 ? (size_t)sb : 0));
}

#endif

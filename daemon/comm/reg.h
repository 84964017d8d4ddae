/* reg: registered memory, which the ranks on this host read in place (what
 * NCCL calls user-buffer registration, ncclMemAlloc + ncclCommRegister, and
 * Open MPI's vader BTL does with XPMEM).
 *
 * A buffer from comm_reg_alloc is a memfd mapping of its own. When every
 * buffer a collective sends from lies in registered memory, the ring posts
 * records that name (segment, offset, length) instead of copying the bytes
 * into its shared-memory link, and the next rank maps the segment (through
 * /proc/<pid>/fd, once, then cached) and reads the bytes where they lie: one
 * pass over memory instead of two, which is what a large all-gather or
 * reduce-scatter on one host is bound by. Any other buffer works as before
 * (the link copies), so registering is an optimisation, never a requirement.
 *
 * Accounting: a buffer counts its requested bytes in its category while it is
 * held, exactly as mem_alloc does. A freed segment is kept (uncounted) for
 * the next allocation of the same size, so the training loop's per-unit
 * buffers keep their pages and the peers' mappings stay valid; the kept ones
 * never add up to more than the most registered memory ever used at once
 * (longest-kept released first), and comm_reg_trim releases them all. A
 * training step settles after its first run on each buffer size's most at
 * once and creates nothing afterwards (seen with the small preset on 2
 * ranks, and as zero page faults per step in bench_fsdp). A peer's mapping
 * of a segment does not add memory: it is the same pages (but it keeps a
 * released segment's pages alive until the peer drops it: when the owner
 * names a new segment under the same descriptor number, or the link ends).
 *
 * Where memfds cannot be made (or FSDP_COMM_REG=0) comm_reg_alloc is
 * mem_alloc. Thread-safe. Internal to daemon/comm and its callers in
 * daemon/train. */
#ifndef FSDP_COMM_REG_H
#define FSDP_COMM_REG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/common/mem.h"

/* One segment as its owner sees it: what a record names. */
typedef struct {
  uint64_t id; /* unique in this process's lifetime; also in the memfd's name */
  int fd;      /* the owner's descriptor of the memfd */
  const uint8_t *base;
  size_t bytes; /* mapped (whole pages) */
} comm_reg_seg_t;

/* Like mem_alloc / mem_calloc (NULL with err_set on failure), 64-byte aligned
 * (page-aligned when registered). */
void *comm_reg_alloc(mem_cat_t cat, size_t bytes, const char *what);
void *comm_reg_calloc(mem_cat_t cat, size_t bytes, const char *what);
/* Frees what comm_reg_alloc returned (registered or not); NULL is a no-op. */
void comm_reg_free(void *p);
/* Releases the segments kept for reuse. */
void comm_reg_trim(void);
/* Bytes of registered segments mapped now, used and kept (whole pages). */
size_t comm_reg_mapped(void);
/* 1 and *out when [p, p + n) lies inside one live registered buffer, else 0. */
int comm_reg_find(const void *p, size_t n, comm_reg_seg_t *out);
/* This process's probe: a segment (not accounted) whose first 8 bytes hold
 * *token, for peers to check at bootstrap that they can map this process's
 * memory. 0, or a code when registration is off or unavailable. */
int comm_reg_probe(comm_reg_seg_t *out, uint64_t *token);

/* The consumer's side: the segments of one peer process mapped here
 * (read-only), cached by id. */
typedef struct comm_reg_peer comm_reg_peer_t;
comm_reg_peer_t *comm_reg_peer_open(pid_t pid);
/* The bytes of segment (id, fd) of the peer, at least end bytes long: mapped
 * on first use (the descriptor is checked to be that segment: a memfd of this
 * name), then from the cache. NULL with err_set when it cannot be mapped
 * (another host, no permission, the peer is gone, or it is not that
 * segment). */
const uint8_t *comm_reg_peer_map(comm_reg_peer_t *pp, uint64_t id, int fd, uint64_t end);
/* Unmaps everything; NULL is a no-op. */
void comm_reg_peer_close(comm_reg_peer_t *pp);

#endif

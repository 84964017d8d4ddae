/* cma: a byte stream carried by reference over a shared-memory link, read
 * with Linux cross-memory attach (process_vm_readv(2); Open MPI's vader BTL
 * calls it CMA). Internal to daemon/comm; ring.c uses it on a same-host link
 * whose consumer could read the producer's memory at bootstrap.
 *
 * The producer does not copy its bytes into the link: it posts records, each
 * the address and length of bytes in its own memory (or, for at most
 * COMM_CMA_INLINE bytes, the bytes themselves), and the consumer copies them
 * straight from the producer's process into their destination: one copy per
 * byte instead of two. A record stays in the link until the consumer has
 * copied all it names, so the link's consumer position tells the producer
 * which of its bytes are still needed: it must not change or free them before
 * (comm_shm_reached).
 *
 * Records are 16 bytes ({address, length}; address 0: length bytes follow,
 * padded to 16), so the ring buffer never splits a record's head. */
#ifndef FSDP_COMM_CMA_H
#define FSDP_COMM_CMA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/comm/shm.h"

#define COMM_CMA_INLINE 256                   /* sends up to this size are copied in */
#define COMM_CMA_RECORD_MAX (16 + COMM_CMA_INLINE) /* room a post may need */

/* The consumer's end: the producer's process and how far into the record at
 * the link's head it has copied. */
typedef struct {
  comm_shm_link_t *link;
  pid_t pid;
  uint64_t done;
} comm_cma_rx_t;

/* Lets any process of this user read this one (PR_SET_PTRACER_ANY, for
 * kernels with Yama's ptrace_scope 1; ignored where there is no Yama). Once
 * per process; harmless to repeat. */
void comm_cma_allow(void);
/* Consumer: reads 8 bytes at addr in process pid; 0 when they equal want,
 * else a negative errno (-EPERM, -ENOSYS, -ESRCH, ...; -EIO: other bytes). */
int comm_cma_probe(pid_t pid, uint64_t addr, uint64_t want);

/* Producer: posts the n bytes at p (not copied unless n <= COMM_CMA_INLINE)
 * when the link has room for the record; returns n, or 0 (no room). */
size_t comm_cma_post(comm_shm_link_t *l, const void *p, size_t n);
/* Consumer: copies up to n bytes of the stream into p; returns the bytes
 * copied (0: no record yet), or a negative errno: -ESRCH (the producer's
 * process is gone), -ECANCELED (the producer abandoned the stream: what this
 * call copied may be stale, so none of it counts), -EFAULT (its memory is
 * gone), another process_vm_readv error. */
ssize_t comm_cma_pull(comm_cma_rx_t *rx, void *p, size_t n);

/* For tests: how many of a ring communicator's links (out, in) carry
 * records (ring.c). */
struct comm;
int comm_ring_cma_links(const struct comm *c);

#endif

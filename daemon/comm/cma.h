/* cma: a byte stream carried by reference over a shared-memory link.
 * Internal to daemon/comm; ring.c uses it on a same-host link for an op whose
 * sender's buffers the receiver can read where they lie.
 *
 * The producer does not copy its bytes into the link: it posts records, each
 * naming bytes in its own memory (or, for at most COMM_CMA_INLINE bytes,
 * carrying the bytes themselves), and the consumer copies them straight into
 * their destination (or reduces them where they lie): one copy per byte
 * instead of two. A record names either
 *  - a registered segment (reg.c) and an offset in it: the consumer maps the
 *    segment once and reads it with plain loads; or
 *  - an address in the producer's process, read with Linux cross-memory
 *    attach (process_vm_readv(2); Open MPI's vader BTL calls it CMA).
 * A record stays in the link until the consumer has used all it names, so
 * the link's consumer position tells the producer which of its bytes are
 * still needed: it must not change or free them before (comm_shm_reached).
 *
 * Records are a 32-byte head ({address or offset, length, segment id,
 * segment descriptor, kind}) and, inline, the bytes padded to 16, so the ring
 * buffer never splits a head. */
#ifndef FSDP_COMM_CMA_H
#define FSDP_COMM_CMA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/comm/reg.h"
#include "daemon/comm/shm.h"

#define COMM_CMA_INLINE 256                        /* sends up to this size are copied in */
#define COMM_CMA_HEAD 32                           /* a record's head */
#define COMM_CMA_RECORD_MAX (COMM_CMA_HEAD + COMM_CMA_INLINE) /* room a post may need */

/* The consumer's end: the producer's process, its segments mapped here, and
 * how far into the record at the link's head it has used. */
typedef struct {
  comm_shm_link_t *link;
  pid_t pid;
  comm_reg_peer_t *peer;
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
 * when the link has room for the record; returns n, or 0 (no room). seg: the
 * registered segment holding them (comm_reg_find), or NULL: read by address
 * (process_vm_readv). */
size_t comm_cma_post(comm_shm_link_t *l, const void *p, size_t n, const comm_reg_seg_t *seg);
/* Consumer: copies up to n bytes of the stream into p (nt: with
 * kern.h copy_stream, for an output that outsizes the caches); returns the
 * bytes copied (0: no record yet), or a negative errno: -ESRCH (the
 * producer's process is gone), -ECANCELED (the producer abandoned the stream:
 * what this call copied may be stale, so none of it counts), -EFAULT (its
 * memory is gone), -EACCES (its segment cannot be mapped here; err_msg says
 * why), another process_vm_readv error. */
ssize_t comm_cma_pull(comm_cma_rx_t *rx, void *p, size_t n, int nt);
/* Consumer: the next bytes of the stream, readable in place (*p) when the
 * record at the head names a registered segment: their length, at most n
 * (0: no record yet); -EAGAIN when the record must be pulled instead; a
 * negative errno as comm_cma_pull. Use them, then comm_cma_done. */
ssize_t comm_cma_view(comm_cma_rx_t *rx, const void **p, size_t n);
/* Consumer: k bytes of a view were used; 0, or -ECANCELED when the producer
 * abandoned the stream meanwhile (what was read may be stale). */
int comm_cma_done(comm_cma_rx_t *rx, size_t k);

#endif

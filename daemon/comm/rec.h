/* rec: a byte stream carried by reference over a shared-memory link: records.
 * Internal to daemon/comm; the ring uses it on a same-host link for an op
 * whose sender's buffers the receiver can read where they lie.
 *
 * The producer does not copy its bytes into the link: it posts records, each
 * naming bytes in its own memory (or, for at most COMM_REC_INLINE bytes,
 * carrying the bytes themselves), and the consumer copies them straight into
 * their destination (or reduces them where they lie): one copy per byte
 * instead of two. A record names either
 *  - a registered segment (reg.c) and an offset in it: the consumer maps the
 *    segment once and reads it with plain loads; or
 *  - an address in the producer's process, read with cross-memory attach
 *    (cma.h: process_vm_readv).
 * A record stays in the link until the consumer has used all it names, so
 * the link's consumer position tells the producer which of its bytes are
 * still needed: it must not change or free them before (comm_shm_reached).
 *
 * Records are a 32-byte head ({address or offset, length, segment id,
 * segment descriptor, kind}) and, inline, the bytes padded to 16, so the ring
 * buffer never splits a head. */
#ifndef FSDP_COMM_REC_H
#define FSDP_COMM_REC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/comm/reg.h"
#include "daemon/comm/shm.h"

#define COMM_REC_INLINE 256                        /* sends up to this size are copied in */
#define COMM_REC_HEAD 32                           /* a record's head */
#define COMM_REC_RECORD_MAX (COMM_REC_HEAD + COMM_REC_INLINE) /* room a post may need */

/* The consumer's end: the producer's process, its segments mapped here, and
 * how far into the record at the link's head it has used. */
typedef struct {
  comm_shm_link_t *link;
  pid_t pid;
  comm_reg_peer_t *peer;
  uint64_t done;
} comm_rec_rx_t;

/* Producer: posts the n bytes at p (not copied unless n <= COMM_REC_INLINE)
 * when the link has room for the record; returns n, or 0 (no room). seg: the
 * registered segment holding them (comm_reg_find), or NULL: read by address
 * (process_vm_readv). */
size_t comm_rec_post(comm_shm_link_t *l, const void *p, size_t n, const comm_reg_seg_t *seg);
/* Consumer: copies up to n bytes of the stream into p (stream: with kern.h
 * copy_stream, for an output that outsizes the caches); returns the bytes
 * copied (0: no record yet), or a negative errno: -ESRCH (the producer's
 * process is gone), -ECANCELED (the producer abandoned the stream: what this
 * call copied may be stale, so none of it counts), -EFAULT (its memory is
 * gone), -EACCES (its segment cannot be mapped here; err_msg says why),
 * another process_vm_readv error. */
ssize_t comm_rec_pull(comm_rec_rx_t *rx, void *p, size_t n, int stream);
/* Consumer: the next bytes of the stream, readable in place (*p) when the
 * record at the head names a registered segment: their length, at most n
 * (0: no record yet); -EAGAIN when the record must be pulled instead; a
 * negative errno as comm_rec_pull. Use them, then comm_rec_done. */
ssize_t comm_rec_view(comm_rec_rx_t *rx, const void **p, size_t n);
/* Consumer: k bytes of a view were used; 0, or -ECANCELED when the producer
 * abandoned the stream meanwhile (what was read may be stale). */
int comm_rec_done(comm_rec_rx_t *rx, size_t k);

#endif

/* shm: a one-way byte stream through shared memory between two processes on
 * one host (the ring's transport for a link whose ends share a host; NCCL's
 * SHM transport has the same shape). Internal to daemon/comm.
 *
 * A link is a ring buffer of cap bytes in a POSIX shared-memory object, a
 * header holding the producer's and the consumer's positions, and two futex
 * words through which a side that ran dry (no data, no room) sleeps and the
 * other side wakes it. The producer creates the object and sends its name and
 * a random token over the TCP bootstrap; the consumer maps it, checks the
 * token (a peer on another host cannot open it, so the check also tells "same
 * host"), and both unlink the name, so nothing outlives the two processes.
 *
 * It carries bytes only (rec.c layers records that point into the producer's
 * memory on top): failures, liveness and aborts stay with the caller
 * (ring_live.c watches its TCP sockets between waits, comm_shm_wait sleeps
 * at most until the time it is given). One producer thread and one consumer
 * thread. */
#ifndef FSDP_COMM_SHM_H
#define FSDP_COMM_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/comm/ring_size.h" /* COMM_SHM_MAP_BYTES, the link's capacity */

typedef struct comm_shm_link comm_shm_link_t;

#define COMM_SHM_NAME 48

/* Producer side: creates and maps a link of cap bytes (rounded to a power of
 * two, at least 64 KiB); name and token go to the consumer. 0, or a code. */
int comm_shm_create(size_t cap, comm_shm_link_t **out, char name[COMM_SHM_NAME], uint64_t *token);
/* Consumer side: maps the link the producer named, checks token and cap, and
 * unlinks the name. 0, or a code (not on this host, or not shared). */
int comm_shm_attach(const char *name, uint64_t token, uint64_t cap, comm_shm_link_t **out);
/* Removes the name (the mapping stays); harmless when already gone. */
void comm_shm_unlink(const char *name);
/* Unmaps; NULL is a no-op. */
void comm_shm_close(comm_shm_link_t *l);
uint64_t comm_shm_cap(const comm_shm_link_t *l);

/* Copies up to n bytes in (producer) or out (consumer), as room or data
 * allows, waking the other side if it sleeps; returns the bytes moved.
 * stream: p is where the bytes end up, not read again soon (kern.h
 * copy_stream). */
size_t comm_shm_write(comm_shm_link_t *l, const void *p, size_t n);
size_t comm_shm_read(comm_shm_link_t *l, void *p, size_t n, int stream);
/* Consumer: copies up to n bytes from its position without consuming them
 * (returns the bytes copied), and consumes n bytes (at most what is there),
 * waking the producer if it sleeps. read = peek + consume. */
size_t comm_shm_peek(const comm_shm_link_t *l, void *p, size_t n);
void comm_shm_consume(comm_shm_link_t *l, size_t n);
/* Consumer: the bytes readable in place at its position, up to the end of
 * the buffer (*p points at them; the data is 64-byte aligned at position 0);
 * they stay valid until consumed. */
size_t comm_shm_view(const comm_shm_link_t *l, const void **p);
/* 1 when the consumer has data. */
int comm_shm_readable(const comm_shm_link_t *l);
/* Producer: bytes of room now; its position (bytes written since creation);
 * 1 when the consumer has consumed up to position pos (pos may be "below 0"
 * as an unsigned wrap: positions compare by signed difference). */
uint64_t comm_shm_room(const comm_shm_link_t *l);
uint64_t comm_shm_tell(const comm_shm_link_t *l);
int comm_shm_reached(const comm_shm_link_t *l, uint64_t pos);

/* Sleeps until in (consumer, may be NULL) has data, the consumer of out
 * (producer, may be NULL) has reached position out_pos (comm_shm_tell(out) -
 * cap + 1: room for a byte; comm_shm_tell(out): everything consumed),
 * comm_shm_kick on either, or CLOCK_MONOTONIC until_ns. Spins briefly first.
 * 1: ready, 0: not (time, a kick, a spurious wake). */
int comm_shm_wait(comm_shm_link_t *in, comm_shm_link_t *out, uint64_t out_pos, int64_t until_ns);
/* Wakes whoever sleeps on the link, either side, either process (abort,
 * failure): any thread. */
void comm_shm_kick(comm_shm_link_t *l);
/* Producer: gives the stream up for good (its op failed): what the link
 * holds, and whatever its records point at, is void from now on. Then kicks.
 * Consumer: 1 once the producer gave up. */
void comm_shm_abandon(comm_shm_link_t *l);
int comm_shm_abandoned(const comm_shm_link_t *l);

#endif

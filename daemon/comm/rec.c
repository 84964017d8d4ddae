/* rec: records in a shared-memory link that point into the producer's memory,
 * read through a mapping of its registered segment or copied out with
 * process_vm_readv (cma.c); rec.h states the contract.
 *
 * What can go wrong on the consumer's side, and how it shows:
 *  - the producer's process is gone (killed, exited): ESRCH (address
 *    records; a mapped segment stays readable, below);
 *  - the producer's op failed and its caller may already reuse or free the
 *    buffers the records name: the producer abandons the link before its
 *    failure reaches its caller (comm_shm_abandon), and the consumer looks at
 *    that flag after every copy, so a copy that may have raced with the reuse
 *    is discarded (ECANCELED), never delivered; a freed buffer can also show
 *    as EFAULT first;
 *  - the kernel or a sandbox refuses (EPERM, ENOSYS): the bootstrap's probe
 *    sees that first and the link stays a copying one;
 *  - a registered segment cannot be mapped (EACCES, with err_msg): the
 *    bootstrap mapped the producer's probe segment, so this means the
 *    producer closed the segment's descriptor (it died, or freed it early).
 * A mapped segment never faults: its pages live as long as a mapping does,
 * even after the producer's death.
 * What cannot happen: a consumer delivering bytes its producer's caller had
 * already reused (the flag is set before the producer's op returns, and read
 * after the copy), or a producer returning while its records are unread (it
 * waits for the consumer position, or abandons). What can: the consumer's op
 * succeeds while the producer's fails afterwards (it failed after everything
 * was read, so what was read was right); and, were a killed producer's pid
 * taken by another process of the same user within the milliseconds before
 * its neighbours see the closed socket, a copy from that process (unmapped
 * addresses fail with EFAULT; process_vm_readv takes a pid, not a pidfd). */
#include "daemon/comm/rec.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "daemon/comm/cma.h"
#include "daemon/common/err.h"
#include "kernels/kern.h"

#define REC_PAD(n) (((n) + 15) & ~(size_t)15)

enum { REC_INLINE, REC_ADDR, REC_SEG };

typedef struct {
  uint64_t addr; /* REC_ADDR: address in the producer; REC_SEG: offset in the segment */
  uint64_t len;
  uint64_t seg;  /* REC_SEG: the segment's id */
  int32_t fd;    /* REC_SEG: the producer's descriptor of it */
  uint32_t kind;
} rec_head_t;

_Static_assert(sizeof(rec_head_t) == COMM_REC_HEAD, "a record's head is 32 bytes");

size_t comm_rec_post(comm_shm_link_t *l, const void *p, size_t n, const comm_reg_seg_t *seg) {
  _Alignas(8) uint8_t rec[COMM_REC_RECORD_MAX];
  rec_head_t h = {.len = n};
  size_t bytes = COMM_REC_HEAD;
  if (n <= COMM_REC_INLINE) { /* small (headers, barrier tokens): copied in, never pointed at */
    h.kind = REC_INLINE;
    bytes += REC_PAD(n);
    memset(rec + COMM_REC_HEAD + n, 0, bytes - COMM_REC_HEAD - n);
    memcpy(rec + COMM_REC_HEAD, p, n);
  } else if (seg) {
    h.kind = REC_SEG;
    h.addr = (uint64_t)((const uint8_t *)p - seg->base);
    h.seg = seg->id;
    h.fd = seg->fd;
  } else {
    h.kind = REC_ADDR;
    h.addr = (uint64_t)(uintptr_t)p;
  }
  memcpy(rec, &h, sizeof h);
  if (!n || comm_shm_room(l) < bytes) return 0;
  comm_shm_write(l, rec, bytes);
  return n;
}

/* The head of the record at the link's head; 0 when none is there yet. */
static int rec_head(const comm_rec_rx_t *rx, rec_head_t *h) {
  return comm_shm_peek(rx->link, h, sizeof *h) == sizeof *h;
}

/* Where a REC_SEG record's bytes lie here, from rx->done on; NULL with
 * err_set when its segment cannot be mapped. */
static const uint8_t *rec_seg_bytes(comm_rec_rx_t *rx, const rec_head_t *h) {
  if (!rx->peer && !(rx->peer = comm_reg_peer_open(rx->pid))) {
    err_set(FSDP_ENOMEM, "no memory for a peer's segment table");
    return NULL;
  }
  const uint8_t *m = comm_reg_peer_map(rx->peer, h->seg, h->fd, h->addr + h->len);
  return m ? m + h->addr + rx->done : NULL;
}

int comm_rec_done(comm_rec_rx_t *rx, size_t k) {
  /* Only now look whether the producer gave up: if it did, it may have reused
   * the bytes while they were being read. */
  atomic_thread_fence(memory_order_seq_cst);
  if (comm_shm_abandoned(rx->link)) return -ECANCELED;
  rec_head_t h;
  if (!k || !rec_head(rx, &h)) return 0;
  rx->done += k;
  if (rx->done == h.len) {
    comm_shm_consume(rx->link, COMM_REC_HEAD + (h.kind == REC_INLINE ? REC_PAD((size_t)h.len) : 0));
    rx->done = 0;
  }
  return 0;
}

ssize_t comm_rec_view(comm_rec_rx_t *rx, const void **p, size_t n) {
  rec_head_t h;
  if (!rec_head(rx, &h)) return 0;
  if (h.kind != REC_SEG) return -EAGAIN;
  const uint8_t *b = rec_seg_bytes(rx, &h);
  if (!b) return -EACCES;
  *p = b;
  return (ssize_t)(h.len - rx->done < n ? h.len - rx->done : n);
}

ssize_t comm_rec_pull(comm_rec_rx_t *rx, void *p, size_t n, int stream) {
  _Alignas(8) uint8_t rec[COMM_REC_RECORD_MAX];
  rec_head_t h;
  if (!rec_head(rx, &h)) return 0;
  size_t k = h.len - rx->done < n ? (size_t)(h.len - rx->done) : n;
  if (h.kind == REC_INLINE) {
    size_t bytes = COMM_REC_HEAD + REC_PAD((size_t)h.len);
    if (comm_shm_peek(rx->link, rec, bytes) < bytes) return 0; /* the rest is on its way */
    memcpy(p, rec + COMM_REC_HEAD + rx->done, k);
  } else if (h.kind == REC_SEG) {
    const uint8_t *b = rec_seg_bytes(rx, &h);
    if (!b) return -EACCES;
    if (stream) kern_cpu()->copy_stream(p, b, k);
    else memcpy(p, b, k);
  } else {
    ssize_t got = comm_cma_read(rx->pid, p, h.addr + rx->done, k);
    if (got < 0) return got;
    if (got == 0) return -EFAULT;
    k = (size_t)got; /* short: the next call meets the fault */
  }
  int rc = comm_rec_done(rx, k);
  return rc < 0 ? rc : (ssize_t)k;
}

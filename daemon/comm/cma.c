/* cma: records in a shared-memory link that point into the producer's memory,
 * read through a mapping of its registered segment or copied out with
 * process_vm_readv (see cma.h for the contract).
 *
 * What can go wrong on the consumer's side, and how it shows:
 *  - the producer's process is gone (killed, exited): ESRCH;
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
#include "daemon/comm/cma.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>

#include "daemon/common/err.h"
#include "kernels/kern.h"

#define CMA_PAD(n) (((n) + 15) & ~(size_t)15)

static void cma_allow_once(void) {
#ifdef PR_SET_PTRACER
  /* EINVAL where Yama is absent: nothing to allow then */
  (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
}

void comm_cma_allow(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, cma_allow_once);
}

int comm_cma_probe(pid_t pid, uint64_t addr, uint64_t want) {
  uint64_t got = 0;
  struct iovec lv = {&got, sizeof got}, rv = {(void *)(uintptr_t)addr, sizeof got};
  ssize_t k = process_vm_readv(pid, &lv, 1, &rv, 1, 0);
  if (k < 0) return -errno;
  return k == (ssize_t)sizeof got && got == want ? 0 : -EIO;
}

enum { CMA_INLINE, CMA_ADDR, CMA_SEG };

typedef struct {
  uint64_t addr; /* CMA_ADDR: address in the producer; CMA_SEG: offset in the segment */
  uint64_t len;
  uint64_t seg;  /* CMA_SEG: the segment's id */
  int32_t fd;    /* CMA_SEG: the producer's descriptor of it */
  uint32_t kind;
} cma_head_t;

_Static_assert(sizeof(cma_head_t) == COMM_CMA_HEAD, "a record's head is 32 bytes");

size_t comm_cma_post(comm_shm_link_t *l, const void *p, size_t n, const comm_reg_seg_t *seg) {
  _Alignas(8) uint8_t rec[COMM_CMA_RECORD_MAX];
  cma_head_t h = {.len = n};
  size_t bytes = COMM_CMA_HEAD;
  if (n <= COMM_CMA_INLINE) { /* small (headers, barrier tokens): copied in, never pointed at */
    h.kind = CMA_INLINE;
    bytes += CMA_PAD(n);
    memset(rec + COMM_CMA_HEAD + n, 0, bytes - COMM_CMA_HEAD - n);
    memcpy(rec + COMM_CMA_HEAD, p, n);
  } else if (seg) {
    h.kind = CMA_SEG;
    h.addr = (uint64_t)((const uint8_t *)p - seg->base);
    h.seg = seg->id;
    h.fd = seg->fd;
  } else {
    h.kind = CMA_ADDR;
    h.addr = (uint64_t)(uintptr_t)p;
  }
  memcpy(rec, &h, sizeof h);
  if (!n || comm_shm_room(l) < bytes) return 0;
  comm_shm_write(l, rec, bytes);
  return n;
}

/* The head of the record at the link's head; 0 when none is there yet. */
static int cma_head(const comm_cma_rx_t *rx, cma_head_t *h) {
  return comm_shm_peek(rx->link, h, sizeof *h) == sizeof *h;
}

/* Where a CMA_SEG record's bytes lie here, from rx->done on; NULL with
 * err_set when its segment cannot be mapped. */
static const uint8_t *cma_seg_bytes(comm_cma_rx_t *rx, const cma_head_t *h) {
  if (!rx->peer && !(rx->peer = comm_reg_peer_open(rx->pid))) {
    err_set(FSDP_ENOMEM, "no memory for a peer's segment table");
    return NULL;
  }
  const uint8_t *m = comm_reg_peer_map(rx->peer, h->seg, h->fd, h->addr + h->len);
  return m ? m + h->addr + rx->done : NULL;
}

int comm_cma_done(comm_cma_rx_t *rx, size_t k) {
  /* Only now look whether the producer gave up: if it did, it may have reused
   * the bytes while they were being read. */
  atomic_thread_fence(memory_order_seq_cst);
  if (comm_shm_abandoned(rx->link)) return -ECANCELED;
  cma_head_t h;
  if (!k || !cma_head(rx, &h)) return 0;
  rx->done += k;
  if (rx->done == h.len) {
    comm_shm_consume(rx->link, COMM_CMA_HEAD + (h.kind == CMA_INLINE ? CMA_PAD((size_t)h.len) : 0));
    rx->done = 0;
  }
  return 0;
}

ssize_t comm_cma_view(comm_cma_rx_t *rx, const void **p, size_t n) {
  cma_head_t h;
  if (!cma_head(rx, &h)) return 0;
  if (h.kind != CMA_SEG) return -EAGAIN;
  const uint8_t *b = cma_seg_bytes(rx, &h);
  if (!b) return -EACCES;
  *p = b;
  return (ssize_t)(h.len - rx->done < n ? h.len - rx->done : n);
}

ssize_t comm_cma_pull(comm_cma_rx_t *rx, void *p, size_t n, int nt) {
  _Alignas(8) uint8_t rec[COMM_CMA_RECORD_MAX];
  cma_head_t h;
  if (!cma_head(rx, &h)) return 0;
  size_t k = h.len - rx->done < n ? (size_t)(h.len - rx->done) : n;
  if (h.kind == CMA_INLINE) {
    size_t bytes = COMM_CMA_HEAD + CMA_PAD((size_t)h.len);
    if (comm_shm_peek(rx->link, rec, bytes) < bytes) return 0; /* the rest is on its way */
    memcpy(p, rec + COMM_CMA_HEAD + rx->done, k);
  } else if (h.kind == CMA_SEG) {
    const uint8_t *b = cma_seg_bytes(rx, &h);
    if (!b) return -EACCES;
    if (nt) kern_cpu()->copy_stream(p, b, k);
    else memcpy(p, b, k);
  } else {
    struct iovec lv = {p, k}, rv = {(void *)(uintptr_t)(h.addr + rx->done), k};
    ssize_t got = process_vm_readv(rx->pid, &lv, 1, &rv, 1, 0);
    if (got < 0) return -errno;
    if (got == 0) return -EFAULT;
    k = (size_t)got; /* short: the next call meets the fault */
  }
  int rc = comm_cma_done(rx, k);
  return rc < 0 ? rc : (ssize_t)k;
}

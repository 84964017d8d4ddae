/* cma: records in a shared-memory link that point into the producer's memory,
 * copied out with process_vm_readv (see cma.h for the contract).
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
 *    sees that first and the link stays a copying one.
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

size_t comm_cma_post(comm_shm_link_t *l, const void *p, size_t n) {
  uint64_t rec[COMM_CMA_RECORD_MAX / 8];
  size_t bytes = 16;
  if (n <= COMM_CMA_INLINE) { /* small (headers, barrier tokens): copied in, never pointed at */
    rec[0] = 0;
    bytes += CMA_PAD(n);
    memset((uint8_t *)rec + 16 + n, 0, bytes - 16 - n);
    memcpy(rec + 2, p, n);
  } else {
    rec[0] = (uint64_t)(uintptr_t)p;
  }
  rec[1] = n;
  if (!n || comm_shm_room(l) < bytes) return 0;
  comm_shm_write(l, rec, bytes);
  return n;
}

ssize_t comm_cma_pull(comm_cma_rx_t *rx, void *p, size_t n) {
  uint64_t rec[COMM_CMA_RECORD_MAX / 8];
  if (comm_shm_peek(rx->link, rec, 16) < 16) return 0;
  const uint64_t addr = rec[0], len = rec[1];
  size_t k = len - rx->done < n ? (size_t)(len - rx->done) : n, bytes = 16;
  if (addr == 0) {
    bytes += CMA_PAD((size_t)len);
    if (comm_shm_peek(rx->link, rec, bytes) < bytes) return 0; /* the rest is on its way */
    memcpy(p, (uint8_t *)rec + 16 + rx->done, k);
  } else {
    struct iovec lv = {p, k}, rv = {(void *)(uintptr_t)(addr + rx->done), k};
    ssize_t got = process_vm_readv(rx->pid, &lv, 1, &rv, 1, 0);
    if (got < 0) return -errno;
    if (got == 0) return -EFAULT;
    k = (size_t)got; /* short: the next call meets the fault */
  }
  /* Only now look whether the producer gave up: if it did, it may have reused
   * the bytes while they were being copied. */
  atomic_thread_fence(memory_order_seq_cst);
  if (comm_shm_abandoned(rx->link)) return -ECANCELED;
  rx->done += k;
  if (rx->done == len) {
    comm_shm_consume(rx->link, bytes);
    rx->done = 0;
  }
  return (ssize_t)k;
}

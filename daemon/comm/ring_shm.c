/* ring_shm: the link table of a copying shared-memory link (shm.c) between
 * the ranks of one host: the sender copies the op's bytes in, the receiver
 * copies them out or reduces them where they lie in the link. The link
 * carries no failures: a dead peer shows on its socket, which the waits
 * watch (ring_live_wait). */
#include "daemon/comm/ring_impl.h"

static ssize_t ring_shm_send(ring_t *r, ring_op_t *o, const void *p, size_t n) {
  (void)o;
  return (ssize_t)comm_shm_write(r->shm_out, p, n);
}

static ssize_t ring_shm_recv(ring_t *r, ring_op_t *o, void *p, size_t n, int uncached) {
  (void)o;
  return (ssize_t)comm_shm_read(r->shm_in, p, n, uncached);
}

static ssize_t ring_shm_view(ring_t *r, const void **p, size_t n) {
  (void)n; /* all there is, up to the end of the buffer: the caller takes at most n */
  return (ssize_t)comm_shm_view(r->shm_in, p);
}

static int ring_shm_viewed(ring_t *r, ring_op_t *o, size_t k) {
  (void)o;
  comm_shm_consume(r->shm_in, k);
  return 0;
}

const ring_link_t ring_shm_link = {
    .name = "shm",
    .shared = 1,
    .send_min = 1,
    .grain = (size_t)64 << 10, /* reduced while in cache */
    .send = ring_shm_send,
    .posted = ring_copied_posted,
    .consumed = ring_copied_consumed,
    .recv = ring_shm_recv,
    .view = ring_shm_view,
    .viewed = ring_shm_viewed,
};

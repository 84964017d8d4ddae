/* ring_tcp: the link table of a ring link over TCP (between hosts, or when
 * shared memory is off): the op's bytes go through the same sockets as the
 * reverse direction's frames, non-blocking; poll() tells when they can
 * move (ring_live_wait). A failed send or an ended stream is named here. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "daemon/comm/ring_impl.h"
#include "daemon/common/err.h"
#include "daemon/common/log.h"

static ssize_t ring_tcp_send(ring_t *r, ring_op_t *o, const void *p, size_t n) {
  ssize_t k = send(r->fd_next, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k >= 0) return k;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  int e = errno;
  /* A notice explains more than a reset: read it when the next rank left one. */
  int rc = ring_live_hear(r, o, 0);
  if (rc < 0) return rc;
  return err_set(FSDP_EPEER,
                 "%s on rank %d of group '%s': sending to rank %d (%s) failed: %s: that rank "
                 "exited, crashed or was killed; see its log, then restart the job from its last "
                 "checkpoint",
                 o->sig, r->base.rank, r->base.name, r->rank_next, r->addr_next, strerror(e));
}

static ssize_t ring_tcp_recv(ring_t *r, ring_op_t *o, void *p, size_t n, int uncached) {
  (void)uncached; /* the kernel copies */
  ssize_t k = recv(r->fd_prev, p, n, MSG_DONTWAIT);
  if (k > 0) return k;
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  return ring_live_prev_closed(r, o, k == 0 ? 0 : errno);
}

static ssize_t ring_tcp_view(ring_t *r, const void **p, size_t n) {
  (void)r, (void)p, (void)n;
  return -1; /* in the kernel's buffers: received, always */
}

static int ring_tcp_viewed(ring_t *r, ring_op_t *o, size_t k) {
  (void)r, (void)o, (void)k;
  FSDP_ASSERT(!"a socket has nothing to view");
  return 0;
}

const ring_link_t ring_tcp_link = {
    .name = "tcp",
    .send_min = 1,
    .send = ring_tcp_send,
    .posted = ring_copied_posted,
    .consumed = ring_copied_consumed,
    .recv = ring_tcp_recv,
    .view = ring_tcp_view,
    .viewed = ring_tcp_viewed,
};

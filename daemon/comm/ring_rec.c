/* ring_rec: the link tables of records (rec.c) over a shared-memory link:
 * the sender posts where the op's bytes lie in its memory, the receiver
 * reads them from there (a mapping of a registered segment, or
 * process_vm_readv), so the sender's buffers stay in use until the
 * receiver has consumed every record (posted, consumed). Two tables: one
 * for the ops whose buffers are registered, on a copying link, and one for
 * a link that carries records for every op (FSDP_COMM_CMA=1). A record that
 * cannot be read names the sender here. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "daemon/comm/ring_impl.h"
#include "daemon/common/err.h"

/* The registered segment of the op's that holds [p, p + n), or NULL. */
static const comm_reg_seg_t *ring_rec_seg_of(const ring_op_t *o, const void *p, size_t n) {
  const uint8_t *q = p;
  for (int i = 0; i < o->nseg; i++) {
    const comm_reg_seg_t *g = &o->seg[i];
    if (q >= g->base && q < g->base + g->bytes && n <= (size_t)(g->base + g->bytes - q)) return g;
  }
  return NULL;
}

/* A record of the previous rank could not be read (k: rec.c's -errno). */
static int ring_rec_failed(ring_t *r, ring_op_t *o, int k) {
  if (k == -ECANCELED)
    return ring_live_prev_gone(r, o, "failed during this collective", "it abandoned its link");
  char why[RING_MSG];
  if (k == -EACCES) snprintf(why, sizeof why, "mapping its buffer: %s", err_msg());
  else snprintf(why, sizeof why, "process_vm_readv of its memory: %s", strerror(-k));
  return ring_live_prev_gone(r, o, k == -ESRCH ? "is gone" : "could not be read", why);
}

static ssize_t ring_rec_send(ring_t *r, ring_op_t *o, const void *p, size_t n) {
  return (ssize_t)comm_rec_post(r->shm_out, p, n, ring_rec_seg_of(o, p, n));
}

static ssize_t ring_rec_recv(ring_t *r, ring_op_t *o, void *p, size_t n, int uncached) {
  ssize_t k = comm_rec_pull(&r->rec_rx, p, n, uncached);
  return k >= 0 ? k : ring_rec_failed(r, o, (int)k);
}

/* The next rank reads this rank's memory until it has consumed the records
 * naming it. */
static uint64_t ring_rec_posted(const ring_t *r) { return comm_shm_tell(r->shm_out); }

static int ring_rec_consumed(const ring_t *r, uint64_t pos) {
  return comm_shm_reached(r->shm_out, pos);
}

static ssize_t ring_rec_view(ring_t *r, const void **p, size_t n) {
  ssize_t v = comm_rec_view(&r->rec_rx, p, n);
  return v < 0 ? -1 : v; /* an error shows again when the record is received */
}

static int ring_rec_viewed(ring_t *r, ring_op_t *o, size_t k) {
  int rc = comm_rec_done(&r->rec_rx, k);
  return rc < 0 ? ring_rec_failed(r, o, rc) : 0;
}

/* The two record tables differ in their name and grain only. */
#define RING_REC_LINK_FNS                                                                \
  .shared = 1, .send_min = COMM_REC_RECORD_MAX, .send = ring_rec_send,                   \
  .posted = ring_rec_posted, .consumed = ring_rec_consumed, .recv = ring_rec_recv,       \
  .view = ring_rec_view, .viewed = ring_rec_viewed

/* Records for the ops whose buffers are registered, on a copying link. */
const ring_link_t ring_rec_link = {.name = "rec", RING_REC_LINK_FNS};

/* Records for every op (FSDP_COMM_CMA=1), read with process_vm_readv where
 * not registered: a reduction takes more per call, since each costs a
 * system call. */
const ring_link_t ring_rec_cma_link = {
    .name = "shm+cma",
    .grain = (size_t)256 << 10,
    RING_REC_LINK_FNS,
};

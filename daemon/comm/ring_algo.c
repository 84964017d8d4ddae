/* ring_algo: one op of a ring communicator, as the thread runs it: the
 * header both neighbours compare, then the data of reduce_scatter,
 * all_gather, all_reduce, broadcast and barrier, streamed slice by slice
 * around the ring (docs/RING.md, "Forward direction").
 *
 * It owns the algorithms and the choice, per op, of sending records (every
 * buffer the op sends from is registered) or bytes; it moves data only
 * through the op's link tables (o->out, o->in) and waits only through
 * ring_live_wait. The element-wise reductions are the CPU kernels'. */
#include <stdatomic.h>
#include <string.h>

#include "daemon/comm/ring_impl.h"
#include "daemon/common/err.h"
#include "kernels/kern.h"

/* ring_live_wait for data (it watches the next rank itself while that rank
 * still reads this rank's records). */
static int ring_algo_poll(ring_t *r, ring_op_t *o, int want_send, int want_recv, int watch_next) {
  return ring_live_wait(r, o, want_send, want_recv, watch_next, NULL);
}

/* Outputs from this size up are written uncached (kern.h copy_stream): they would
 * not stay in the caches anyway, and skipping the read of every destination
 * line saves a third of the memory traffic; smaller ones stay cached for the
 * caller, who usually reads them next. */
#define RING_UNCACHED_MIN ((size_t)8 << 20)

static size_t ring_algo_out_bytes(const comm_args_t *a, int N) {
  size_t b = a->count * comm_dtype_size(a->dtype);
  return a->op == COMM_OP_ALL_GATHER ? b * (size_t)N : a->op == COMM_OP_BARRIER ? 0 : b;
}

static void ring_algo_copy_out(const ring_op_t *o, void *dst, const void *src, size_t n) {
  if (o->uncached) kern_cpu()->copy_stream(dst, src, n);
  else memcpy(dst, src, n);
}

/* Waits until the next rank has consumed what this rank posted up to pos: it
 * reads this rank's memory until then (records; at once elsewhere). */
static int ring_algo_wait_consumed(ring_t *r, ring_op_t *o, uint64_t pos) {
  while (!o->out->consumed(r, pos)) {
    int rc = ring_live_wait(r, o, 0, 0, 0, &pos); /* owed: what is not consumed yet */
    if (rc < 0) return rc;
  }
  return 0;
}

typedef struct {
  uint8_t *p;
  size_t n;
} ring_algo_span_t;

/* Sends the spans ss to the next rank while receiving rs from the previous
 * one, never sending byte x of the send stream before byte x - lead of the
 * receive stream has arrived (all_gather and broadcast forward what they
 * receive; lead is what a rank has of its own). copy0: where the bytes of
 * ss[0] also go, copied right after they are sent while they are still in
 * cache (an out-of-place all_gather's own block: one read of the input
 * instead of two), or NULL. */
#define RING_COPY_GRAIN ((size_t)256 << 10)
static int ring_algo_stream_fwd(ring_t *r, ring_op_t *o, const ring_algo_span_t *ss, int nss,
                                const ring_algo_span_t *rs, int nrs, size_t lead,
                                uint8_t *copy0) {
  size_t stot = 0, rtot = 0, sent = 0, recvd = 0, soff = 0, roff = 0;
  int si = 0, ri = 0;
  for (int i = 0; i < nss; i++) stot += ss[i].n;
  for (int i = 0; i < nrs; i++) rtot += rs[i].n;
  while (sent < stot || recvd < rtot) {
    int progress = 0;
    size_t slim = lead + recvd < stot ? lead + recvd : stot;
    if (sent < slim) {
      while (soff == ss[si].n) si++, soff = 0;
      size_t n = ss[si].n - soff;
      if (n > slim - sent) n = slim - sent;
      if (n > r->chunk) n = r->chunk;
      if (copy0 && si == 0 && n > RING_COPY_GRAIN) n = RING_COPY_GRAIN;
      ssize_t k = o->out->send(r, o, ss[si].p + soff, n);
      if (k < 0) return (int)k;
      if (k > 0 && copy0 && si == 0)
        ring_algo_copy_out(o, copy0 + soff, ss[0].p + soff, (size_t)k);
      if (k > 0) sent += (size_t)k, soff += (size_t)k, progress = 1;
    }
    if (recvd < rtot) {
      while (roff == rs[ri].n) ri++, roff = 0;
      size_t n = rs[ri].n - roff;
      if (n > r->chunk) n = r->chunk;
      ssize_t k = o->in->recv(r, o, rs[ri].p + roff, n, o->uncached);
      if (k < 0) return (int)k;
      if (k > 0) recvd += (size_t)k, roff += (size_t)k, progress = 1;
    }
    if (progress) {
      int rc = ring_live_turn(r, o, recvd < rtot);
      if (rc < 0) return rc;
      continue;
    }
    int rc = ring_algo_poll(r, o, sent < slim, recvd < rtot, sent < stot);
    if (rc < 0) return rc;
  }
  return 0;
}

/* dst = a + b over n elements (bf16: in fp32, one rounding), divided by div
 * when div != 1 (the average's division happens before that one rounding);
 * a may be unaligned. The arithmetic is the CPU kernels' (kern.h). */
static void ring_algo_reduce(comm_dtype_t dt, void *dst, const void *a, const void *b, size_t n,
                             float div, int uncached) {
  const kern_backend_t *k = kern_cpu();
  if (dt == COMM_F32) k->reduce_f32(dst, a, b, n, div, uncached);
  else k->reduce_bf16(dst, a, b, n, div, uncached);
}

/* The next bytes from the previous rank, readable in place (*p) when they
 * start a whole element (koff: bytes of the piece so far): in a copying
 * shared-memory link, or in the previous rank's registered buffer that a
 * record names. Their length, whole elements, at most n (0: none yet); -1
 * when they must be received into the slot instead (a partial element there,
 * one across the end of the link's buffer, a record read otherwise, an error
 * the receive then reports). Used, they are passed on with the link's viewed. */
static ssize_t ring_algo_view(ring_t *r, const ring_op_t *o, const void **p, size_t n, size_t koff,
                              size_t esz) {
  if (koff % esz) return -1;
  ssize_t v = o->in->view(r, p, n);
  if (v < 0) return -1;
  size_t k = (size_t)v;
  if (k && k < esz) return -1;
  return (ssize_t)((k < n ? k : n) / esz * esz);
}

/* Ring reduce-scatter over blocks (offsets boff, lengths blen, in elements):
 * at step s this rank sends block rank-s-1 (its own values at s = 0, else the
 * partial sum it just made) and receives block rank-s-2, adding its own
 * values to it; after N-1 steps it holds the full sum of block rank, written
 * to dst. Blocks are cut in slices of one staging slot; the streams go slice
 * by slice (slice 0 of every step, then slice 1, ...), so a received piece is
 * sent on right after it is reduced (its elements are reduced as they arrive,
 * while in cache) and RING_SLOTS slots bound the memory whatever the size.
 * Piece i of either stream is (slice i / (N-1), step i % (N-1)); sent piece
 * i (step >= 1) is received piece i-1 plus this rank's values. */
#define RING_SLOTS 4
static int ring_algo_stream_rs(ring_t *r, ring_op_t *o, const uint8_t *own, const size_t *boff,
                               const size_t *blen, uint8_t *dst, comm_dtype_t dt, float div) {
  const int N = r->base.size, me = r->base.rank, S = N - 1;
  const size_t esz = comm_dtype_size(dt);
  const size_t slotb = r->staging_bytes / RING_SLOTS / esz * esz, pe = slotb / esz;
  size_t maxlen = 0;
  for (int b = 0; b < N; b++)
    if (blen[b] > maxlen) maxlen = blen[b];
  if (!maxlen) return 0;
  const size_t P = (maxlen + pe - 1) / pe * (size_t)S; /* pieces per stream */
  size_t ms = 0, moff = 0; /* send: piece, bytes of it sent */
  size_t kr = 0, koff = 0; /* receive: piece, bytes of it received (and reduced) */
  /* records: a slot is refilled only once the next rank has read the piece sent
   * from it (posted[slot]: the link position after that piece) */
  uint64_t posted[RING_SLOTS] = {0};
#define PIECE_BLOCK(i, first) ((me - (int)((i) % (size_t)S) - (first) + 2 * N) % N)
#define PIECE_ELEMS(b, i)                                                          \
  (blen[b] > ((i) / (size_t)S) * pe                                               \
       ? (blen[b] - ((i) / (size_t)S) * pe < pe ? blen[b] - ((i) / (size_t)S) * pe : pe) \
       : 0)
  while (ms < P || kr < P) {
    int progress = 0;
    /* send piece ms: own values at step 0, else received piece ms-1, reduced */
    if (ms < P && (ms % (size_t)S == 0 || kr >= ms)) {
      int b = PIECE_BLOCK(ms, 1);
      size_t len = PIECE_ELEMS(b, ms) * esz;
      if (moff < len) {
        const uint8_t *p = ms % (size_t)S == 0
                               ? own + (boff[b] + ms / (size_t)S * pe) * esz
                               : r->staging + ((ms - 1) % RING_SLOTS) * slotb;
        size_t n = len - moff < r->chunk ? len - moff : r->chunk;
        ssize_t k = o->out->send(r, o, p + moff, n);
        if (k < 0) return (int)k;
        moff += (size_t)k, progress |= k > 0;
      }
      if (moff == len) {
        if (ms % (size_t)S) posted[(ms - 1) % RING_SLOTS] = o->out->posted(r);
        ms++, moff = 0, progress = 1;
      }
    }
    /* receive piece kr into slot kr % SLOTS once piece kr-SLOTS has been sent
     * on (as piece kr-SLOTS+1); pieces of the last step are consumed at once */
    int slot_free = kr < P && (kr < RING_SLOTS || (kr - RING_SLOTS) % (size_t)S == (size_t)S - 1 ||
                               ms >= kr - RING_SLOTS + 2);
    int slot_read = kr < P && o->out->consumed(r, posted[kr % RING_SLOTS]);
    if (slot_free && slot_read) {
      int b = PIECE_BLOCK(kr, 2);
      size_t ne = PIECE_ELEMS(b, kr), len = ne * esz;
      uint8_t *slot = r->staging + (kr % RING_SLOTS) * slotb;
      if (koff < len) {
        /* reduce the whole elements that arrived, while they are in cache:
         * in place in a copying link, else after receiving them into the
         * slot */
        const uint8_t *mine = own + (boff[b] + kr / (size_t)S * pe) * esz, *from;
        size_t n = len - koff < r->chunk ? len - koff : r->chunk, e0 = koff / esz, e1;
        if (o->in->grain && n > o->in->grain) n = o->in->grain;
        ssize_t v = ring_algo_view(r, o, (const void **)&from, n, koff, esz);
        size_t k = v > 0 ? (size_t)v : 0;
        int in_link = v >= 0;
        if (in_link) {
          e1 = e0 + k / esz;
        } else {
          ssize_t got = o->in->recv(r, o, slot + koff, n, 0);
          if (got < 0) return (int)got;
          k = (size_t)got, from = slot + e0 * esz, e1 = (koff + k) / esz;
        }
        if (kr % (size_t)S < (size_t)S - 1)
          ring_algo_reduce(dt, slot + e0 * esz, from, mine + e0 * esz, e1 - e0, 1.0f, 0);
        else
          ring_algo_reduce(dt, dst + (kr / (size_t)S * pe + e0) * esz, from, mine + e0 * esz,
                      e1 - e0, div, o->uncached);
        if (in_link) {
          int rc = o->in->viewed(r, o, k);
          if (rc < 0) return rc;
        }
        koff += k, progress |= k > 0;
      }
      if (koff == len) kr++, koff = 0, progress = 1;
    }
    if (progress) {
      int rc = ring_live_turn(r, o, kr < P);
      if (rc < 0) return rc;
      continue;
    }
    int want_send = ms < P && (ms % (size_t)S == 0 || kr >= ms), rc;
    if (slot_free && !slot_read)
      rc = ring_live_wait(r, o, want_send, 0, ms < P, &posted[kr % RING_SLOTS]);
    else
      rc = ring_algo_poll(r, o, want_send, kr < P, ms < P);
    if (rc < 0) return rc;
  }
#undef PIECE_BLOCK
#undef PIECE_ELEMS
  return 0;
}

/* All-gather of blocks in buf: this rank's block is in place, or own (not
 * overlapping buf) holds it and is copied in as it is sent. */
static int ring_algo_gather_blocks(ring_t *r, ring_op_t *o, uint8_t *buf, const size_t *boff,
                                   const size_t *blen, size_t esz, const uint8_t *own) {
  const int N = r->base.size, me = r->base.rank;
  ring_algo_span_t ss[N - 1], rs[N - 1];
  for (int s = 0; s < N - 1; s++) {
    int b = (me - s + N) % N, c = (me - s - 1 + N) % N;
    ss[s] = (ring_algo_span_t){buf + boff[b] * esz, blen[b] * esz};
    rs[s] = (ring_algo_span_t){buf + boff[c] * esz, blen[c] * esz};
  }
  uint8_t *copy0 = NULL;
  if (own) copy0 = ss[0].p, ss[0].p = (uint8_t *)own;
  return ring_algo_stream_fwd(r, o, ss, N - 1, rs, N - 1, ss[0].n, copy0);
}

static int ring_algo_run_data(ring_t *r, ring_op_t *o);

/* 1 when the next rank maps this rank's registered segments and every buffer
 * the op sends from lies in one (o->seg gets them): its data then go as
 * records naming them, read in place. */
static int ring_algo_registered(ring_t *r, ring_op_t *o) {
  const comm_args_t *a = o->a;
  const size_t b = a->count * comm_dtype_size(a->dtype), N = (size_t)r->base.size;
  const void *p[3];
  size_t n[3];
  int k = 0;
  o->nseg = 0;
  if (!r->reg_out || !b) return 0;
  switch (a->op) {
    case COMM_OP_ALL_GATHER: /* what it forwards from its output, and its input */
      p[k] = a->recv, n[k++] = b * N;
      p[k] = a->send, n[k++] = b;
      break;
    case COMM_OP_REDUCE_SCATTER: /* its input, and partial sums from the staging */
      p[k] = a->send, n[k++] = b * N;
      p[k] = r->staging, n[k++] = r->staging_bytes;
      break;
    case COMM_OP_ALL_REDUCE: /* and the gather's forwarding from its output */
      p[k] = a->send, n[k++] = b;
      p[k] = r->staging, n[k++] = r->staging_bytes;
      p[k] = a->recv, n[k++] = b;
      break;
    case COMM_OP_BROADCAST:
      p[k] = a->recv, n[k++] = b;
      break;
    default:
      return 0;
  }
  for (int i = 0; i < k; i++)
    if (!comm_reg_find(p[i], n[i], &o->seg[o->nseg++])) {
      o->nseg = 0;
      return 0;
    }
  return 1;
}

int ring_algo_run(ring_t *r, ring_op_t *o) {
  const comm_args_t *a = o->a;
  const int N = r->base.size, me = r->base.rank;

  o->uncached = ring_algo_out_bytes(a, N) >= RING_UNCACHED_MIN;
  if (N > 1) { /* a notice already waiting explains more than anything this op would see */
    int rc = ring_live_hear(r, o, 1);
    if (rc == 0) rc = ring_live_silent(r, o);
    if (rc < 0) return rc;
  }
  /* the header goes as the link always carries data; what follows, as it says */
  o->out = r->out;
  o->in = r->in;
  if (N > 1) { /* the header: both sides must be at the same collective */
    /* on a link that carries records for every op they name addresses, even
     * in registered buffers (o->seg stays empty) */
    int rec = o->out == &ring_rec_cma_link || ring_algo_registered(r, o);
    ring_hdr_t mine = {.magic = RING_HDR_MAGIC, .seq = o->seq, .op = (uint8_t)a->op,
                       .dtype = (uint8_t)a->dtype, .xport = (uint8_t)rec, .root = a->root,
                       .count = a->count};
    if (a->op == COMM_OP_REDUCE_SCATTER || a->op == COMM_OP_ALL_REDUCE)
      mine.redop = (uint8_t)a->redop;
    if (a->op != COMM_OP_BROADCAST) mine.root = 0;
    if (a->op == COMM_OP_BARRIER) mine.dtype = 0, mine.count = 0;
    ring_hdr_t theirs;
    ring_algo_span_t s = {(uint8_t *)&mine, sizeof mine};
    ring_algo_span_t rv = {(uint8_t *)&theirs, sizeof theirs};
    int rc = ring_algo_stream_fwd(r, o, &s, 1, &rv, 1, sizeof mine, NULL);
    if (rc < 0) return rc;
    o->hdr_in = 1;
    if (theirs.magic != RING_HDR_MAGIC)
      return err_set(FSDP_EPEER,
                     "%s on rank %d of group '%s': rank %d (%s) sent bytes that are not a "
                     "collective header: the ranks' streams are out of step (a different count "
                     "in an earlier op?) or a stray process connected",
                     o->sig, me, r->base.name, r->rank_prev, r->addr_prev);
    int rec_in = theirs.xport == 1 && r->rec_rx.link;
    mine.xport = theirs.xport = 0;
    if (memcmp(&mine, &theirs, sizeof mine) != 0) {
      char ts[160];
      ring_sig(ts, sizeof ts, theirs.op, theirs.dtype, theirs.redop, theirs.root, theirs.count,
               theirs.seq);
      return err_set(FSDP_EPEER,
                     "group '%s': collectives diverged: rank %d issued %s but its previous rank "
                     "%d (%s) issued %s at the same position; every rank of a group must issue "
                     "the same collectives, with the same sizes, in the same order",
                     r->base.name, me, o->sig, r->rank_prev, r->addr_prev, ts);
    }
    /* a link that carries records for every op already does */
    if (rec && o->out == &ring_shm_link) o->out = &ring_rec_link;
    if (rec_in && o->in == &ring_shm_link) o->in = &ring_rec_link;
    if (rec) atomic_fetch_add(&r->record_ops, 1);
  }
  int rc = ring_algo_run_data(r, o);
  /* records: the next rank reads this op's buffers until it has consumed
   * every one: the op is not over before */
  if (rc == 0) rc = ring_algo_wait_consumed(r, o, o->out->posted(r));
  return rc;
}

/* The data of one op, after the headers matched. */
static int ring_algo_run_data(ring_t *r, ring_op_t *o) {
  const comm_args_t *a = o->a;
  const int N = r->base.size, me = r->base.rank;
  const size_t esz = comm_dtype_size(a->dtype);
  const float div = (a->redop == COMM_AVG) ? (float)N : 1.0f;
  switch (a->op) {
    case COMM_OP_BARRIER: {
      /* An all_gather of one byte each: every rank has heard from every rank. */
      static const uint8_t zero[4096]; /* the group size limit */
      uint8_t tok[4096];
      memcpy(tok, zero, sizeof tok);
      size_t boff[N], blen[N];
      for (int i = 0; i < N; i++) boff[i] = (size_t)i, blen[i] = 1;
      return N > 1 ? ring_algo_gather_blocks(r, o, tok, boff, blen, 1, NULL) : 0;
    }
    case COMM_OP_ALL_GATHER: {
      size_t n = a->count, bytes = n * esz;
      uint8_t *out = a->recv;
      const uint8_t *in = a->send, *own = NULL;
      /* an input apart from the output is copied in as it is sent; one that
       * overlaps it (but is not in place) is moved first */
      if (in != out + (size_t)me * bytes && bytes) {
        if (N > 1 && (in + bytes <= out || in >= out + (size_t)N * bytes)) own = in;
        else memmove(out + (size_t)me * bytes, in, bytes);
      }
      if (N == 1 || !bytes) return 0;
      size_t boff[N], blen[N];
      for (int i = 0; i < N; i++) boff[i] = (size_t)i * n, blen[i] = n;
      return ring_algo_gather_blocks(r, o, out, boff, blen, esz, own);
    }
    case COMM_OP_REDUCE_SCATTER: {
      size_t n = a->count;
      if (!n) return 0;
      const uint8_t *in = a->send;
      if (N == 1) {
        if (div == 1.0f) memmove(a->recv, in, n * esz);
        return 0;
      }
      size_t boff[N], blen[N];
      for (int i = 0; i < N; i++) boff[i] = (size_t)i * n, blen[i] = n;
      return ring_algo_stream_rs(r, o, in, boff, blen, a->recv, a->dtype, div);
    }
    case COMM_OP_ALL_REDUCE: {
      size_t n = a->count;
      uint8_t *out = a->recv;
      if (!n) return 0;
      if (N == 1) {
        if ((const void *)out != a->send) memmove(out, a->send, n * esz);
        return 0;
      }
      size_t boff[N], blen[N], q = n / (size_t)N, rem = n % (size_t)N, off = 0;
      for (int i = 0; i < N; i++) {
        boff[i] = off;
        blen[i] = q + ((size_t)i < rem);
        off += blen[i];
      }
      int rc =
          ring_algo_stream_rs(r, o, a->send, boff, blen, out + boff[me] * esz, a->dtype, div);
      /* in place, the gather overwrites input the next rank may still read */
      if (rc == 0) rc = ring_algo_wait_consumed(r, o, o->out->posted(r));
      if (rc < 0) return rc;
      return ring_algo_gather_blocks(r, o, out, boff, blen, esz, NULL);
    }
    case COMM_OP_BROADCAST: {
      size_t bytes = a->count * esz;
      if (N == 1 || !bytes) return 0;
      ring_algo_span_t seg = {a->recv, bytes};
      int is_root = me == a->root, is_last = (a->root - 1 + N) % N == me;
      return ring_algo_stream_fwd(r, o, &seg, is_last ? 0 : 1, &seg, is_root ? 0 : 1,
                             is_root ? bytes : 0, NULL);
    }
    default:
      return err_set(FSDP_EINTERNAL, "%s: unknown op", o->sig);
  }
}

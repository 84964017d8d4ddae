/* ring: the collectives over TCP for CPU devices (the ring algorithms NCCL
 * and Gloo use), behind comm_backend_t.
 *
 * What it owns: two sockets per communicator (to the next rank, from the
 * previous one), up to two shared-memory links (same-host neighbours), a
 * communication thread that runs the queued ops in issue order, a bounded
 * staging buffer for reductions (MEM_COMM), and a wake pipe that comm_abort
 * writes to. It does not own the caller's buffers.
 *
 * docs/RING.md describes the protocol: the wire format, the reverse
 * direction and how a failed or stalled rank is named, the transports, and
 * the memory formula (comm_ring_buffer_bytes). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon/comm/cma.h"
#include "daemon/comm/rec.h"
#include "daemon/comm/reg.h"
#include "daemon/comm/ring.h"
#include "daemon/comm/shm.h"
#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"
#include "daemon/common/mem.h"
#include "kernels/kern.h"

#define RING_HELLO_MAGIC 0x48525346u  /* "FSRH" */
#define RING_HDR_MAGIC 0x4f525346u    /* "FSRO" */
#define RING_NOTICE_MAGIC 0x41525346u /* "FSRA" */
#define RING_BEAT_MAGIC 0x42525346u   /* "FSRB" */
#define RING_BYE_MAGIC 0x59525346u    /* "FSRY" */
#define RING_VERSION 5u
#define RING_SHM_MAGIC 0x53525346u /* "FSRS" */
#define RING_MSG 512
#define RING_ADDR 128
#define RING_BEAT_MS 100  /* beat period, at most (timeout / 10 when shorter) */
#define RING_GRACE_MS 500 /* a deadline's wait for a notice, at most (timeout / 4) */

/* How the next rank's reverse stream ended. */
enum { RING_NEXT_OPEN, RING_NEXT_BYE, RING_NEXT_GONE };

typedef struct {
  uint32_t magic, version;
  int32_t size, from, to;
  char name[64];
  char pad[12];
} ring_hello_t;

typedef struct {
  uint32_t magic, seq;
  uint8_t op, dtype, redop;
  uint8_t xport; /* 1: this op's data follow as records (rec.c); not compared */
  int32_t root;
  uint64_t count;
  uint64_t pad2;
} ring_hdr_t;

typedef struct {
  uint32_t magic;
  int32_t origin, code;
  char msg[RING_MSG - 12];
} ring_notice_t;

/* The bootstrap's last step, on each link: the producer (rank r) offers a
 * shared-memory link to rank r+1 (name empty: no offer), with its pid, the
 * address of a word holding the token when it also offers records for every
 * op (cma = 1), and its registration probe segment (reg = 1: reg.c); rank r+1
 * answers whether it could map the link (accepted = 1), read that word
 * (cma = 1) and map that segment and read its token there (reg = 1). */
typedef struct {
  uint32_t magic;
  uint32_t accepted;
  uint64_t token, cap;
  char name[COMM_SHM_NAME];
  int32_t pid;
  uint32_t cma;
  uint64_t probe; /* address of the token in the producer */
  uint32_t reg;
  int32_t reg_fd;
  uint64_t reg_id, reg_token;
} ring_shm_offer_t;

/* A beat or a bye on the reverse direction. */
typedef struct {
  uint32_t magic;
  int32_t rank;
} ring_beat_t;

_Static_assert(sizeof(ring_hdr_t) == 32, "wire header is 32 bytes");
_Static_assert(sizeof(ring_beat_t) == 8, "beat is 8 bytes");
_Static_assert(sizeof(ring_notice_t) == RING_MSG, "notice is 512 bytes");

typedef struct ring ring_t;
typedef struct ring_op ring_op_t;

/* A transport: how an op's data move to the next rank (send, on the link
 * out) and come from the previous one (recv, view, on the link in). One
 * table per transport, after redis's ae_epoll.c / ae_kqueue.c behind ae.c:
 * the bootstrap picks one per link (ring_t out, in: TCP, a copying
 * shared-memory link, or one carrying records for every op), and an op
 * whose data go as records over a shared-memory link takes the records'
 * (ring_op_t out, in). The algorithms and the waits call these, never a
 * transport directly. */
typedef struct ring_link {
  const char *name; /* in log lines */
  /* 1: the data go through shared memory: a wait sleeps on the link's
   * futexes (shm_out, shm_in), and the sockets carry only the reverse
   * direction's frames and a peer's end. 0: through the socket, whose
   * readiness poll() tells. */
  int shared;
  /* Bytes of room a send needs (shared links): a byte, or a whole record. */
  size_t send_min;
  /* Bytes a reduction takes from the link in one go, to add them while they
   * are in cache (0: as many as came, up to a chunk). */
  size_t grain;
  /* Sends up to n bytes at p as far as the link takes them now: the bytes
   * taken (0: none now), or a negative code naming the next rank. */
  ssize_t (*send)(ring_t *r, ring_op_t *o, const void *p, size_t n);
  /* Where the next rank must have consumed up to before this rank is done
   * with the buffers it sent from so far (records name them), and whether it
   * has; 0 and 1 where the bytes were copied. */
  uint64_t (*posted)(const ring_t *r);
  int (*consumed)(const ring_t *r, uint64_t pos);
  /* Receives up to n bytes into p (uncached: as ring_op_t's): the bytes
   * received (0: none yet), or a negative code naming the previous rank. */
  ssize_t (*recv)(ring_t *r, ring_op_t *o, void *p, size_t n, int uncached);
  /* The next bytes readable where they lie (*p): their length, at most n (0:
   * none yet), or -1 when they must be received instead. Once used, they
   * are passed with viewed: 0, or a negative code naming the previous rank. */
  ssize_t (*view)(ring_t *r, const void **p, size_t n);
  int (*viewed)(ring_t *r, ring_op_t *o, size_t k);
} ring_link_t;

static const ring_link_t ring_tcp_link, ring_shm_link, ring_rec_link, ring_rec_cma_link;

typedef struct ring_req {
  comm_req_t base;
  struct ring *r;
  comm_args_t a;
  uint32_t seq;
  int done, rc;
  char msg[RING_MSG];
  struct ring_req *next;     /* queue */
  struct ring_req *all_next; /* every live request, for destroy */
} ring_req_t;

struct ring {
  comm_t base;
  int fd_next, fd_prev; /* to rank+1, from rank-1 */
  int wake[2];          /* comm_abort -> the thread */
  char addr_self[RING_ADDR], addr_next[RING_ADDR], addr_prev[RING_ADDR];
  int rank_next, rank_prev;
  int64_t timeout_ms;
  size_t chunk, staging_bytes;
  uint8_t *staging;
  /* how data move on each link, chosen at bootstrap: ring_tcp_link,
   * ring_shm_link, or ring_rec_cma_link (records for every op, CMA) */
  const ring_link_t *out, *in;
  /* same-host links: the data (headers included) goes through these instead
   * of fd_next / fd_prev, which then carry only notices and liveness */
  comm_shm_link_t *shm_out, *shm_in;
  int reg_out;          /* the next rank maps this rank's registered segments */
  comm_rec_rx_t rec_rx; /* .link set: shm_in may carry records of the previous rank */
  int reg_in;           /* this rank maps the previous rank's registered segments */
  atomic_ullong record_ops; /* ops whose data this rank sent as records (tests) */
  uint64_t cma_probe;   /* read by the next rank at bootstrap */

  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* queue changes and completions */
  ring_req_t *head, *tail, *all;
  uint32_t seq_issue; /* under mu */
  int stop;           /* under mu */
  atomic_int aborted;
  /* Set once by the thread when an op fails; read under mu by issue. */
  int broken_rc;
  char broken_msg[RING_MSG];
  int notice_sent; /* thread only */
  /* The reverse direction, thread only (ring_destroy's bye comes after the
   * join): frames from the next rank not yet whole (rx), frames for the
   * previous one the socket has not taken yet (tx: frames never interleave). */
  uint8_t rx[RING_MSG];
  size_t rx_len;
  uint8_t tx[2 * RING_MSG];
  size_t tx_len;
  int next_end, next_errno; /* RING_NEXT_*; errno of a reset (0: end of stream) */
  int64_t heard_ns;         /* when bytes last came from the next rank */
  int64_t beat_ns, beat_due;
};

/* The op the thread is running: its deadline, names for messages, and the
 * transports its data take. */
struct ring_op {
  ring_t *r;
  const comm_args_t *a;
  uint32_t seq;
  int64_t deadline_ns, timeout_ms;
  int64_t silence_ns; /* the next rank not heard from for longer: stopped or hung */
  int hdr_in;         /* the previous rank's header arrived: it is at this op */
  char sig[160]; /* "all_reduce #3 (f32 count=100 sum)" */
  int uncached;  /* the output outsizes the caches: written with non-temporal stores
                    (kern.h copy_stream), past them */
  /* the links' own (ring_t out, in) for the header; for the data,
   * ring_rec_link instead of ring_shm_link when they go as records */
  const ring_link_t *out, *in;
  comm_reg_seg_t seg[3]; /* records from registered memory: the segments it sends from */
  int nseg;
};

static int64_t ring_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int ring_ms_left(int64_t deadline_ns) {
  int64_t left = deadline_ns - ring_now_ns();
  if (left <= 0) return 0;
  int64_t ms = (left + 999999) / 1000000;
  return ms > 1000000000 ? 1000000000 : (int)ms;
}

static void ring_sig(char *buf, size_t n, int op, int dt, int redop, int root, uint64_t count,
                     uint32_t seq) {
  if (op == COMM_OP_BARRIER)
    snprintf(buf, n, "barrier #%u", seq);
  else if (op == COMM_OP_BROADCAST)
    snprintf(buf, n, "broadcast #%u (%s count=%llu root=%d)", seq,
             comm_dtype_name((comm_dtype_t)dt), (unsigned long long)count, root);
  else if (op == COMM_OP_ALL_GATHER)
    snprintf(buf, n, "all_gather #%u (%s count=%llu per rank)", seq,
             comm_dtype_name((comm_dtype_t)dt), (unsigned long long)count);
  else
    snprintf(buf, n, "%s #%u (%s count=%llu%s %s)", comm_op_name((comm_op_t)op), seq,
             comm_dtype_name((comm_dtype_t)dt), (unsigned long long)count,
             op == COMM_OP_REDUCE_SCATTER ? " per rank" : "", redop == COMM_AVG ? "avg" : "sum");
}

/* ---- the reverse direction: beats, notices, bye ---- */

/* Sends what tx holds, as far as the socket takes it now. A previous rank
 * that is gone takes nothing more: its frames are dropped. */
static void ring_tx_flush(ring_t *r) {
  while (r->tx_len) {
    ssize_t k = send(r->fd_prev, r->tx, r->tx_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) r->tx_len = 0;
    if (k <= 0) return;
    memmove(r->tx, r->tx + k, r->tx_len - (size_t)k);
    r->tx_len -= (size_t)k;
  }
}

/* Queues a whole frame behind what is pending and sends; -1 when it does not
 * fit (the previous rank stopped reading long ago). */
static int ring_tx_frame(ring_t *r, const void *f, size_t n) {
  if (r->fd_prev < 0) return -1;
  ring_tx_flush(r);
  if (r->tx_len + n > sizeof r->tx) return -1;
  memcpy(r->tx + r->tx_len, f, n);
  r->tx_len += n;
  ring_tx_flush(r);
  return 0;
}

/* Every H: a beat to the previous rank (none behind a frame the socket has
 * not taken, so a stopped reader costs no memory; none after a notice, the
 * last frame). */
static void ring_tick(ring_t *r, int64_t now) {
  r->beat_due = now + r->beat_ns;
  ring_tx_flush(r);
  if (r->tx_len || r->notice_sent) return;
  ring_beat_t b = {.magic = RING_BEAT_MAGIC, .rank = r->base.rank};
  ring_tx_frame(r, &b, sizeof b);
}

static void ring_send_notice(ring_t *r, const ring_notice_t *note) {
  if (r->fd_prev < 0 || r->notice_sent) return;
  r->notice_sent = 1;
  /* behind at most a beat; what the socket cannot take now goes at the next ticks */
  int rc = ring_tx_frame(r, note, sizeof *note);
  comm_shm_kick(r->shm_in); /* the previous rank may sleep on that link: wake it to read this */
  if (rc < 0 || r->tx_len)
    LOG_DEBUG("comm", "group '%s' rank %d: could not pass a failure notice to rank %d%s",
              r->base.name, r->base.rank, r->rank_prev, rc < 0 ? "" : " at once");
}

/* "<op> on rank R of group 'G'", or "rank R of group 'G'" between ops. */
static const char *ring_where(const ring_t *r, const ring_op_t *o, char *buf, size_t n) {
  if (o) snprintf(buf, n, "%s on rank %d of group '%s'", o->sig, r->base.rank, r->base.name);
  else snprintf(buf, n, "rank %d of group '%s'", r->base.rank, r->base.name);
  return buf;
}

/* The next rank's stream ended while this rank needs it, or it died first. */
static int ring_next_gone(ring_t *r, ring_op_t *o) {
  char w[256];
  ring_where(r, o, w, sizeof w);
  if (r->next_end == RING_NEXT_BYE)
    return err_set(FSDP_EPEER,
                   "%s: rank %d (%s) ended its communicator while this rank still needed it: "
                   "the ranks issued different numbers of collectives (see that rank's log for "
                   "its last one)",
                   w, r->rank_next, r->addr_next);
  return err_set(FSDP_EPEER,
                 "%s: rank %d (%s) closed its connection (%s): that rank exited, crashed or was "
                 "killed; see its log, then restart the job from its last checkpoint",
                 w, r->rank_next, r->addr_next,
                 r->next_errno ? strerror(r->next_errno) : "end of stream");
}

/* A notice from the next rank: this rank's failure, passed on unchanged so it
 * stays short and names the cause. */
static int ring_take_notice(ring_t *r, ring_op_t *o, ring_notice_t *note) {
  char w[256];
  note->msg[sizeof note->msg - 1] = 0;
  err_set(FSDP_EPEER, "%s: rank %d failed first: %s", ring_where(r, o, w, sizeof w),
          (int)note->origin, note->msg);
  ring_send_notice(r, note);
  return FSDP_EPEER;
}

/* Reads what the next rank sent on the reverse direction, without waiting
 * (but for the rest of a notice already begun, up to 1 s): beats (heard_ns),
 * a bye or the end of the stream (next_end), a notice (returned as this op's
 * failure, or between ops (o NULL) the communicator's, and passed on). need:
 * the op still needs the next rank, so its end is a failure too. */
static int ring_hear(ring_t *r, ring_op_t *o, int need) {
  int64_t until = 0;
  char w[256];
  while (r->next_end == RING_NEXT_OPEN) {
    ssize_t k = recv(r->fd_next, r->rx + r->rx_len, sizeof r->rx - r->rx_len, MSG_DONTWAIT);
    if (k > 0) {
      r->rx_len += (size_t)k;
      r->heard_ns = ring_now_ns();
      size_t off = 0;
      while (r->rx_len - off >= 4 && r->next_end == RING_NEXT_OPEN) {
        uint32_t m;
        memcpy(&m, r->rx + off, sizeof m);
        size_t fl = m == RING_NOTICE_MAGIC                        ? sizeof(ring_notice_t)
                    : m == RING_BEAT_MAGIC || m == RING_BYE_MAGIC ? sizeof(ring_beat_t)
                                                                  : 0;
        if (!fl) {
          r->next_end = RING_NEXT_GONE;
          return err_set(FSDP_EPEER,
                         "%s: rank %d (%s) sent an unreadable frame (magic %08x) on the reverse "
                         "direction: a version mismatch or a stray connection",
                         ring_where(r, o, w, sizeof w), r->rank_next, r->addr_next, m);
        }
        if (r->rx_len - off < fl) break;
        if (m == RING_NOTICE_MAGIC) {
          ring_notice_t note;
          memcpy(&note, r->rx + off, sizeof note);
          r->rx_len = 0;               /* a notice is the last frame: */
          r->next_end = RING_NEXT_BYE; /* nothing more to read, and its end is explained */
          return ring_take_notice(r, o, &note);
        }
        if (m == RING_BYE_MAGIC) r->next_end = RING_NEXT_BYE;
        off += fl;
      }
      memmove(r->rx, r->rx + off, r->rx_len - off);
      r->rx_len -= off;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      uint32_t m = 0;
      if (r->rx_len >= 4) memcpy(&m, r->rx, sizeof m);
      if (m != RING_NOTICE_MAGIC) break; /* nothing, or part of a beat: later */
      /* the rest of a notice is on its way */
      if (!until) until = ring_now_ns() + 1000000000;
      struct pollfd p = {.fd = r->fd_next, .events = POLLIN};
      int ms = ring_ms_left(until);
      if (ms > 0 && (poll(&p, 1, ms) >= 0 || errno == EINTR)) continue;
      r->next_end = RING_NEXT_GONE;
      return err_set(FSDP_EPEER,
                     "%s: rank %d (%s) sent an unreadable failure notice (%zu bytes): a version "
                     "mismatch or a stray connection",
                     ring_where(r, o, w, sizeof w), r->rank_next, r->addr_next, r->rx_len);
    }
    r->next_end = RING_NEXT_GONE; /* died: no notice, no bye */
    r->next_errno = k == 0 ? 0 : errno;
  }
  if (need && r->next_end != RING_NEXT_OPEN) return ring_next_gone(r, o);
  return 0;
}

/* Liveness while an op runs: the next rank beats every H, so a long silence
 * means its process is stopped or hung. Call right after ring_hear. */
static int ring_silent(ring_t *r, ring_op_t *o) {
  if (r->next_end != RING_NEXT_OPEN) return 0;
  int64_t quiet = ring_now_ns() - r->heard_ns;
  if (quiet <= o->silence_ns) return 0;
  return err_set(FSDP_ETIMEDOUT,
                 "%s on rank %d of group '%s': rank %d (%s) has not been heard from for %lld ms: "
                 "its process is stopped or hung (SIGSTOP, a debugger, a frozen host); check its "
                 "state and log, then restart the job from its last checkpoint",
                 o->sig, r->base.rank, r->base.name, r->rank_next, r->addr_next,
                 (long long)(quiet / 1000000));
}

static int ring_aborted(ring_t *r, ring_op_t *o) {
  if (!atomic_load_explicit(&r->aborted, memory_order_relaxed)) return 0;
  return err_set(FSDP_ECANCELED, "%s on rank %d of group '%s': the communicator was aborted",
                 o->sig, r->base.rank, r->base.name);
}

/* Before a rank names a neighbour on its own evidence: up to ms for the next
 * rank's word, which comes from further on and knows more: its notice
 * (returned), its death with neither notice nor bye (it failed first: named),
 * its silence (named). 0: nothing came (or it ended normally). Beats go on. */
static int ring_await_word(ring_t *r, ring_op_t *o, int ms) {
  int64_t until = ring_now_ns() + (int64_t)ms * 1000000;
  for (;;) {
    int rc = ring_aborted(r, o);
    if (rc == 0) rc = ring_hear(r, o, 0);
    if (rc < 0) return rc;
    if (r->next_end == RING_NEXT_GONE) return ring_next_gone(r, o);
    if (r->next_end == RING_NEXT_BYE) return 0;
    int64_t now = ring_now_ns();
    if (now >= r->beat_due) ring_tick(r, now);
    if ((rc = ring_silent(r, o)) < 0) return rc;
    if (now >= until) return 0;
    struct pollfd p[2] = {{.fd = r->fd_next, .events = POLLIN},
                          {.fd = r->wake[0], .events = POLLIN}};
    poll(p, 2, ring_ms_left(until < r->beat_due ? until : r->beat_due));
  }
}

/* ---- socket waits ---- */

static int ring_timeout(ring_t *r, ring_op_t *o, int want_recv) {
  int peer = want_recv ? r->rank_prev : r->rank_next;
  const char *addr = want_recv ? r->addr_prev : r->addr_next;
  if (want_recv && !o->hdr_in) /* not even its header: it is not at this collective */
    return err_set(FSDP_ETIMEDOUT,
                   "%s on rank %d of group '%s': timed out after %lld ms waiting for data from "
                   "rank %d (%s): that rank has not issued this collective (it is stuck before "
                   "it, in computation or another collective, or stalled; check its log and its "
                   "last collective); raise FSDP_COMM_TIMEOUT_MS if it is merely slow",
                   o->sig, r->base.rank, r->base.name, (long long)o->timeout_ms, peer, addr);
  /* The peer is at this op and alive, but stuck: likely behind a rank further
   * on, whose own neighbour knows; that one's notice travels here. */
  int grace = (int)(o->timeout_ms / 4 < RING_GRACE_MS ? o->timeout_ms / 4 : RING_GRACE_MS);
  int rc = ring_await_word(r, o, grace);
  if (rc < 0) return rc;
  return err_set(FSDP_ETIMEDOUT,
                 "%s on rank %d of group '%s': timed out after %lld ms %s rank %d (%s): that rank "
                 "%s; check its log and the other ranks'; raise FSDP_COMM_TIMEOUT_MS if it is "
                 "merely slow",
                 o->sig, r->base.rank, r->base.name, (long long)o->timeout_ms,
                 want_recv ? "waiting for data from" : "waiting to send to", peer, addr,
                 want_recv ? "is in this collective but stuck (waiting on another rank, or slow)"
                           : "is alive but takes no data (it has not issued this collective, "
                             "or is stuck in it)");
}

/* An abort (error), the deadline (1), else 0; every H also beats, reads the
 * next rank's frames (a notice fails the op at once) and checks its silence. */
static int ring_check(ring_t *r, ring_op_t *o) {
  int rc = ring_aborted(r, o);
  if (rc < 0) return rc;
  int64_t now = ring_now_ns();
  if (now >= r->beat_due) {
    ring_tick(r, now);
    if ((rc = ring_hear(r, o, 0)) < 0 || (rc = ring_silent(r, o)) < 0) return rc;
  }
  if (now >= o->deadline_ns) return 1;
  return 0;
}

/* One turn of a wait loop: an abort, a notice or silence ends the op with
 * its error, and so does the deadline (ring_timeout names whom it waited
 * for: the previous rank when want_recv, else the next); 0 to go on. */
static int ring_turn(ring_t *r, ring_op_t *o, int want_recv) {
  int rc = ring_check(r, o);
  return rc == 1 ? ring_timeout(r, o, want_recv) : rc;
}

static int ring_prev_closed(ring_t *r, ring_op_t *o, int e);

/* Waits until the next rank can take data (want_send), the previous one has
 * sent some (want_recv), the next rank has consumed this rank's records up
 * to *reach (reach not NULL), the deadline, an abort or a notice, reading the
 * next rank's frames meanwhile. watch_next: this op still has data to send,
 * so the next rank closing or failing matters. When both links are sockets
 * it sleeps in poll() until the next beat; when one is shared memory, on its
 * futexes in slices of at most 10 ms (1 ms when the other side is a socket
 * it waits on), looking at the sockets (frames, a closed peer, a socket
 * side's readiness) between them, so a dead peer is seen within a slice and
 * a notice or an abort at once (their senders kick the links). */
static int ring_poll_until(ring_t *r, ring_op_t *o, int want_send, int want_recv, int watch_next,
                           const uint64_t *reach) {
  const int shm = o->in->shared || o->out->shared;
  comm_shm_link_t *in = want_recv && o->in->shared ? r->shm_in : NULL;
  comm_shm_link_t *out = (want_send || reach) && o->out->shared ? r->shm_out : NULL;
  uint64_t out_pos = 0;
  if (out) {
    out_pos = want_send ? comm_shm_tell(out) - comm_shm_cap(out) + o->out->send_min : *reach;
    if (want_send && reach && (int64_t)(*reach - out_pos) < 0) out_pos = *reach;
  }
  int sock_send = want_send && !o->out->shared, sock_recv = want_recv && !o->in->shared;
  int need = want_send || watch_next || reach;
  struct pollfd p[3];
  p[0].fd = r->wake[0];
  p[0].events = POLLIN;
  /* on a shared-memory link nothing comes through fd_prev: readable = closed */
  p[2].fd = want_recv ? r->fd_prev : -1;
  p[2].events = POLLIN;
  for (;;) {
    int rc = ring_turn(r, o, want_recv);
    if (rc < 0) return rc;
    if (need && r->next_end != RING_NEXT_OPEN) return ring_next_gone(r, o);
    int open = r->next_end == RING_NEXT_OPEN; /* frames may come */
    p[1].fd = (open || sock_send) ? r->fd_next : -1;
    p[1].events = (short)((sock_send ? POLLOUT : 0) | (open ? POLLIN : 0));
    p[0].revents = p[1].revents = p[2].revents = 0;
    int64_t until = o->deadline_ns < r->beat_due ? o->deadline_ns : r->beat_due;
    int n = poll(p, 3, shm ? 0 : ring_ms_left(until));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return err_set_errno(FSDP_EINTERNAL, errno, "%s: poll", o->sig);
    if (n > 0) {
      if (p[0].revents) continue; /* abort: reported by ring_check */
      if (open && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
        if ((rc = ring_hear(r, o, need)) < 0) return rc;
        continue; /* beats */
      }
      if (p[1].revents & POLLOUT) return 0;
      if (p[2].revents && sock_recv) return 0;
      if (p[2].revents) {
        if (comm_shm_readable(r->shm_in)) return 0; /* what it wrote before leaving */
        char b;
        ssize_t k = recv(r->fd_prev, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return ring_prev_closed(r, o, k < 0 ? errno : 0);
      }
    }
    if (!shm) continue; /* deadline or beat: ring_check */
    if ((in && comm_shm_readable(in)) || (out && comm_shm_reached(out, out_pos))) return 0;
    int64_t slice = (sock_send || sock_recv || (!in && !out)) ? 1000000 : 10000000;
    until = ring_now_ns() + slice;
    if (until > o->deadline_ns) until = o->deadline_ns;
    if (in || out) {
      if (comm_shm_wait(in, out, out_pos, until)) return 0;
    } else {
      p[0].revents = p[1].revents = p[2].revents = 0;
      if (poll(p, 3, 1) > 0) continue;
    }
  }
}

/* ring_poll_until for data: also watches the next rank while it still reads
 * this rank's records. */
static int ring_poll(ring_t *r, ring_op_t *o, int want_send, int want_recv, int watch_next) {
  watch_next |= !o->out->consumed(r, o->out->posted(r));
  return ring_poll_until(r, o, want_send, want_recv, watch_next, NULL);
}

/* The previous rank left or failed: "rank N (addr) <what> (<why>)". */
static int ring_prev_gone(ring_t *r, ring_op_t *o, const char *what, const char *why) {
  /* The previous rank is gone. If that is the echo of a failure further
   * back, the next rank's notice (travelling the other way) names the rank
   * that failed first: wait for it briefly. A next rank that died without a
   * notice died first (every failing rank sends one before it closes): the
   * previous rank's end is the echo, and ring_await_word names the next. */
  int grace = ring_ms_left(o->deadline_ns);
  if (grace > 200) grace = 200;
  int rc = ring_await_word(r, o, grace);
  if (rc < 0) return rc;
  return err_set(FSDP_EPEER,
                 "%s on rank %d of group '%s': rank %d (%s) %s (%s): that rank exited, crashed, "
                 "failed or was killed; see its log, then restart the job from its last checkpoint",
                 o->sig, r->base.rank, r->base.name, r->rank_prev, r->addr_prev, what, why);
}

/* The previous rank's connection ended (e: its errno, 0 for end of stream). */
static int ring_prev_closed(ring_t *r, ring_op_t *o, int e) {
  return ring_prev_gone(r, o, "closed its connection", e ? strerror(e) : "end of stream");
}

/* ---- links: TCP ---- */

static ssize_t tcp_send(ring_t *r, ring_op_t *o, const void *p, size_t n) {
  ssize_t k = send(r->fd_next, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k >= 0) return k;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  int e = errno;
  /* A notice explains more than a reset: read it when the next rank left one. */
  int rc = ring_hear(r, o, 0);
  if (rc < 0) return rc;
  return err_set(FSDP_EPEER,
                 "%s on rank %d of group '%s': sending to rank %d (%s) failed: %s: that rank "
                 "exited, crashed or was killed; see its log, then restart the job from its last "
                 "checkpoint",
                 o->sig, r->base.rank, r->base.name, r->rank_next, r->addr_next, strerror(e));
}

static ssize_t tcp_recv(ring_t *r, ring_op_t *o, void *p, size_t n, int uncached) {
  (void)uncached; /* the kernel copies */
  ssize_t k = recv(r->fd_prev, p, n, MSG_DONTWAIT);
  if (k > 0) return k;
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  return ring_prev_closed(r, o, k == 0 ? 0 : errno);
}

/* Bytes that crossed a socket are copies: nothing of this rank's is read later. */
static uint64_t tcp_posted(const ring_t *r) {
  (void)r;
  return 0;
}

static int tcp_consumed(const ring_t *r, uint64_t pos) {
  (void)r, (void)pos;
  return 1;
}

static ssize_t tcp_view(ring_t *r, const void **p, size_t n) {
  (void)r, (void)p, (void)n;
  return -1; /* in the kernel's buffers: received, always */
}

static int tcp_viewed(ring_t *r, ring_op_t *o, size_t k) {
  (void)r, (void)o, (void)k;
  FSDP_ASSERT(!"a socket has nothing to view");
  return 0;
}

static const ring_link_t ring_tcp_link = {
    .name = "tcp",
    .send_min = 1,
    .send = tcp_send,
    .posted = tcp_posted,
    .consumed = tcp_consumed,
    .recv = tcp_recv,
    .view = tcp_view,
    .viewed = tcp_viewed,
};

/* ---- links: shared memory, copying ---- */

/* A dead peer shows on its socket, which the waits watch (ring_poll_until). */
static ssize_t shm_send(ring_t *r, ring_op_t *o, const void *p, size_t n) {
  (void)o;
  return (ssize_t)comm_shm_write(r->shm_out, p, n);
}

static ssize_t shm_recv(ring_t *r, ring_op_t *o, void *p, size_t n, int uncached) {
  (void)o;
  return (ssize_t)comm_shm_read(r->shm_in, p, n, uncached);
}

/* The receiver copies out of the link: nothing of this rank's is read later. */
static uint64_t shm_posted(const ring_t *r) {
  (void)r;
  return 0;
}

static int shm_consumed(const ring_t *r, uint64_t pos) {
  (void)r, (void)pos;
  return 1;
}

static ssize_t shm_view(ring_t *r, const void **p, size_t n) {
  (void)n; /* all there is, up to the end of the buffer: the caller takes at most n */
  return (ssize_t)comm_shm_view(r->shm_in, p);
}

static int shm_viewed(ring_t *r, ring_op_t *o, size_t k) {
  (void)o;
  comm_shm_consume(r->shm_in, k);
  return 0;
}

static const ring_link_t ring_shm_link = {
    .name = "shm",
    .shared = 1,
    .send_min = 1,
    .grain = (size_t)64 << 10,
    .send = shm_send,
    .posted = shm_posted,
    .consumed = shm_consumed,
    .recv = shm_recv,
    .view = shm_view,
    .viewed = shm_viewed,
};

/* ---- links: records over shared memory (rec.c) ---- */

/* The registered segment of the op's that holds [p, p + n), or NULL. */
static const comm_reg_seg_t *rec_seg_of(const ring_op_t *o, const void *p, size_t n) {
  const uint8_t *q = p;
  for (int i = 0; i < o->nseg; i++) {
    const comm_reg_seg_t *g = &o->seg[i];
    if (q >= g->base && q < g->base + g->bytes && n <= (size_t)(g->base + g->bytes - q)) return g;
  }
  return NULL;
}

/* A record of the previous rank could not be read (k: rec.c's -errno). */
static int rec_failed(ring_t *r, ring_op_t *o, int k) {
  if (k == -ECANCELED)
    return ring_prev_gone(r, o, "failed during this collective", "it abandoned its link");
  char why[RING_MSG];
  if (k == -EACCES) snprintf(why, sizeof why, "mapping its buffer: %s", err_msg());
  else snprintf(why, sizeof why, "process_vm_readv of its memory: %s", strerror(-k));
  return ring_prev_gone(r, o, k == -ESRCH ? "is gone" : "could not be read", why);
}

static ssize_t rec_send(ring_t *r, ring_op_t *o, const void *p, size_t n) {
  return (ssize_t)comm_rec_post(r->shm_out, p, n, rec_seg_of(o, p, n));
}

static ssize_t rec_recv(ring_t *r, ring_op_t *o, void *p, size_t n, int uncached) {
  ssize_t k = comm_rec_pull(&r->rec_rx, p, n, uncached);
  return k >= 0 ? k : rec_failed(r, o, (int)k);
}

/* The next rank reads this rank's memory until it has consumed the records
 * naming it. */
static uint64_t rec_posted(const ring_t *r) { return comm_shm_tell(r->shm_out); }

static int rec_consumed(const ring_t *r, uint64_t pos) {
  return comm_shm_reached(r->shm_out, pos);
}

static ssize_t rec_view(ring_t *r, const void **p, size_t n) {
  ssize_t v = comm_rec_view(&r->rec_rx, p, n);
  return v < 0 ? -1 : v; /* an error shows again when the record is received */
}

static int rec_viewed(ring_t *r, ring_op_t *o, size_t k) {
  int rc = comm_rec_done(&r->rec_rx, k);
  return rc < 0 ? rec_failed(r, o, rc) : 0;
}

/* Records for the ops whose buffers are registered, on a copying link. */
static const ring_link_t ring_rec_link = {
    .name = "rec",
    .shared = 1,
    .send_min = COMM_REC_RECORD_MAX,
    .send = rec_send,
    .posted = rec_posted,
    .consumed = rec_consumed,
    .recv = rec_recv,
    .view = rec_view,
    .viewed = rec_viewed,
};

/* Records for every op (FSDP_COMM_CMA=1), read with process_vm_readv where
 * not registered: a reduction takes more per call, since each costs a
 * system call. */
static const ring_link_t ring_rec_cma_link = {
    .name = "shm+cma",
    .shared = 1,
    .send_min = COMM_REC_RECORD_MAX,
    .grain = (size_t)256 << 10,
    .send = rec_send,
    .posted = rec_posted,
    .consumed = rec_consumed,
    .recv = rec_recv,
    .view = rec_view,
    .viewed = rec_viewed,
};

/* ---- streams ---- */

/* Outputs from this size up are written uncached (kern.h copy_stream): they would
 * not stay in the caches anyway, and skipping the read of every destination
 * line saves a third of the memory traffic; smaller ones stay cached for the
 * caller, who usually reads them next. */
#define RING_UNCACHED_MIN ((size_t)8 << 20)

static size_t ring_out_bytes(const comm_args_t *a, int N) {
  size_t b = a->count * comm_dtype_size(a->dtype);
  return a->op == COMM_OP_ALL_GATHER ? b * (size_t)N : a->op == COMM_OP_BARRIER ? 0 : b;
}

static void ring_copy_out(const ring_op_t *o, void *dst, const void *src, size_t n) {
  if (o->uncached) kern_cpu()->copy_stream(dst, src, n);
  else memcpy(dst, src, n);
}

/* Waits until the next rank has consumed what this rank posted up to pos: it
 * reads this rank's memory until then (records; at once elsewhere). */
static int ring_wait_consumed(ring_t *r, ring_op_t *o, uint64_t pos) {
  while (!o->out->consumed(r, pos)) {
    int rc = ring_poll_until(r, o, 0, 0, 1, &pos);
    if (rc < 0) return rc;
  }
  return 0;
}

typedef struct {
  uint8_t *p;
  size_t n;
} ring_seg_t;

/* Sends the segments ss to the next rank while receiving rs from the previous
 * one, never sending byte x of the send stream before byte x - lead of the
 * receive stream has arrived (all_gather and broadcast forward what they
 * receive; lead is what a rank has of its own). copy0: where the bytes of
 * ss[0] also go, copied right after they are sent while they are still in
 * cache (an out-of-place all_gather's own block: one read of the input
 * instead of two), or NULL. */
#define RING_COPY_GRAIN ((size_t)256 << 10)
static int ring_stream_fwd(ring_t *r, ring_op_t *o, const ring_seg_t *ss, int nss,
                           const ring_seg_t *rs, int nrs, size_t lead, uint8_t *copy0) {
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
      if (k > 0 && copy0 && si == 0) ring_copy_out(o, copy0 + soff, ss[0].p + soff, (size_t)k);
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
      int rc = ring_turn(r, o, recvd < rtot);
      if (rc < 0) return rc;
      continue;
    }
    int rc = ring_poll(r, o, sent < slim, recvd < rtot, sent < stot);
    if (rc < 0) return rc;
  }
  return 0;
}

/* dst = a + b over n elements (bf16: in fp32, one rounding), divided by div
 * when div != 1 (the average's division happens before that one rounding);
 * a may be unaligned. The arithmetic is the CPU kernels' (kern.h). */
static void ring_reduce(comm_dtype_t dt, void *dst, const void *a, const void *b, size_t n,
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
static ssize_t ring_view(ring_t *r, const ring_op_t *o, const void **p, size_t n, size_t koff,
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
static int ring_stream_rs(ring_t *r, ring_op_t *o, const uint8_t *own, const size_t *boff,
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
        ssize_t v = ring_view(r, o, (const void **)&from, n, koff, esz);
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
          ring_reduce(dt, slot + e0 * esz, from, mine + e0 * esz, e1 - e0, 1.0f, 0);
        else
          ring_reduce(dt, dst + (kr / (size_t)S * pe + e0) * esz, from, mine + e0 * esz,
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
      int rc = ring_turn(r, o, kr < P);
      if (rc < 0) return rc;
      continue;
    }
    int want_send = ms < P && (ms % (size_t)S == 0 || kr >= ms), rc;
    if (slot_free && !slot_read)
      rc = ring_poll_until(r, o, want_send, 0, 1, &posted[kr % RING_SLOTS]);
    else
      rc = ring_poll(r, o, want_send, kr < P, ms < P);
    if (rc < 0) return rc;
  }
#undef PIECE_BLOCK
#undef PIECE_ELEMS
  return 0;
}

/* All-gather of blocks in buf: this rank's block is in place, or own (not
 * overlapping buf) holds it and is copied in as it is sent. */
static int ring_gather_blocks(ring_t *r, ring_op_t *o, uint8_t *buf, const size_t *boff,
                              const size_t *blen, size_t esz, const uint8_t *own) {
  const int N = r->base.size, me = r->base.rank;
  ring_seg_t ss[N - 1], rs[N - 1];
  for (int s = 0; s < N - 1; s++) {
    int b = (me - s + N) % N, c = (me - s - 1 + N) % N;
    ss[s] = (ring_seg_t){buf + boff[b] * esz, blen[b] * esz};
    rs[s] = (ring_seg_t){buf + boff[c] * esz, blen[c] * esz};
  }
  uint8_t *copy0 = NULL;
  if (own) copy0 = ss[0].p, ss[0].p = (uint8_t *)own;
  return ring_stream_fwd(r, o, ss, N - 1, rs, N - 1, ss[0].n, copy0);
}

/* ---- one op ---- */

static int ring_run_data(ring_t *r, ring_op_t *o);

/* 1 when the next rank maps this rank's registered segments and every buffer
 * the op sends from lies in one (o->seg gets them): its data then go as
 * records naming them, read in place. */
static int ring_op_registered(ring_t *r, ring_op_t *o) {
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

static int ring_run_op(ring_t *r, ring_op_t *o) {
  const comm_args_t *a = o->a;
  const int N = r->base.size, me = r->base.rank;

  if (N > 1) { /* a notice already waiting explains more than anything this op would see */
    int rc = ring_hear(r, o, 1);
    if (rc == 0) rc = ring_silent(r, o);
    if (rc < 0) return rc;
  }
  /* the header goes as the link always carries data; what follows, as it says */
  o->out = r->out;
  o->in = r->in;
  if (N > 1) { /* the header: both sides must be at the same collective */
    int rec = o->out == &ring_rec_cma_link || ring_op_registered(r, o);
    ring_hdr_t mine = {.magic = RING_HDR_MAGIC, .seq = o->seq, .op = (uint8_t)a->op,
                       .dtype = (uint8_t)a->dtype, .xport = (uint8_t)rec, .root = a->root,
                       .count = a->count};
    if (a->op == COMM_OP_REDUCE_SCATTER || a->op == COMM_OP_ALL_REDUCE)
      mine.redop = (uint8_t)a->redop;
    if (a->op != COMM_OP_BROADCAST) mine.root = 0;
    if (a->op == COMM_OP_BARRIER) mine.dtype = 0, mine.count = 0;
    ring_hdr_t theirs;
    ring_seg_t s = {(uint8_t *)&mine, sizeof mine}, rv = {(uint8_t *)&theirs, sizeof theirs};
    int rc = ring_stream_fwd(r, o, &s, 1, &rv, 1, sizeof mine, NULL);
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
  int rc = ring_run_data(r, o);
  /* records: the next rank reads this op's buffers until it has consumed
   * every one: the op is not over before */
  if (rc == 0) rc = ring_wait_consumed(r, o, o->out->posted(r));
  return rc;
}

/* The data of one op, after the headers matched. */
static int ring_run_data(ring_t *r, ring_op_t *o) {
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
      return N > 1 ? ring_gather_blocks(r, o, tok, boff, blen, 1, NULL) : 0;
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
      return ring_gather_blocks(r, o, out, boff, blen, esz, own);
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
      return ring_stream_rs(r, o, in, boff, blen, a->recv, a->dtype, div);
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
      int rc = ring_stream_rs(r, o, a->send, boff, blen, out + boff[me] * esz, a->dtype, div);
      /* in place, the gather overwrites input the next rank may still read */
      if (rc == 0) rc = ring_wait_consumed(r, o, o->out->posted(r));
      if (rc < 0) return rc;
      return ring_gather_blocks(r, o, out, boff, blen, esz, NULL);
    }
    case COMM_OP_BROADCAST: {
      size_t bytes = a->count * esz;
      if (N == 1 || !bytes) return 0;
      ring_seg_t seg = {a->recv, bytes};
      int is_root = me == a->root, is_last = (a->root - 1 + N) % N == me;
      return ring_stream_fwd(r, o, &seg, is_last ? 0 : 1, &seg, is_root ? 0 : 1,
                             is_root ? bytes : 0, NULL);
    }
    default:
      return err_set(FSDP_EINTERNAL, "%s: unknown op", o->sig);
  }
}

/* ---- the communication thread ---- */

static void ring_complete(ring_t *r, ring_req_t *q, int rc, const char *msg) {
  /* under mu */
  q->rc = rc;
  snprintf(q->msg, sizeof q->msg, "%s", rc < 0 ? msg : "");
  q->done = 1;
  pthread_cond_broadcast(&r->cv);
}

/* Thread, not under mu: the first failure (err_msg()) breaks the communicator. */
static void ring_break(ring_t *r, int rc) {
  pthread_mutex_lock(&r->mu);
  if (!r->broken_rc) {
    r->broken_rc = rc;
    snprintf(r->broken_msg, sizeof r->broken_msg, "%s", err_msg());
  }
  pthread_mutex_unlock(&r->mu);
}

static void ring_fail(ring_t *r, int rc) {
  /* thread, not under mu */
  ring_notice_t note;
  memset(&note, 0, sizeof note);
  note.magic = RING_NOTICE_MAGIC;
  note.origin = r->base.rank;
  note.code = rc;
  snprintf(note.msg, sizeof note.msg, "%s", err_msg());
  ring_break(r, rc);
  /* Before the failure reaches the caller, who may then reuse the buffers the
   * next rank could still be reading (records): it must not deliver those bytes. */
  if (r->out == &ring_rec_cma_link || r->reg_out) comm_shm_abandon(r->shm_out);
  /* A rank that read a notice already passed it on (notice_sent); others start one. */
  ring_send_notice(r, &note);
}

/* Between ops, every H (thread, not under mu): a beat, and the next rank's
 * frames: a notice breaks the communicator and is passed on at once, so it
 * crosses a rank that is not in a collective (busy computing, or stuck
 * before one) on its way to the ranks that are. */
static void ring_idle_tick(ring_t *r) {
  ring_tick(r, ring_now_ns());
  int rc = ring_hear(r, NULL, 0);
  if (rc < 0) ring_break(r, rc);
}

static void *ring_thread(void *arg) {
  ring_t *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->head && !r->stop && !(atomic_load(&r->aborted) && !r->notice_sent)) {
      if (r->base.size < 2) {
        pthread_cond_wait(&r->cv, &r->mu);
        continue;
      }
      struct timespec ts = {.tv_sec = (time_t)(r->beat_due / 1000000000),
                            .tv_nsec = (long)(r->beat_due % 1000000000)};
      int w = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
      if (w == ETIMEDOUT || ring_now_ns() >= r->beat_due) {
        pthread_mutex_unlock(&r->mu);
        ring_idle_tick(r);
        pthread_mutex_lock(&r->mu);
      }
    }
    if (atomic_load(&r->aborted) && !r->notice_sent) {
      pthread_mutex_unlock(&r->mu);
      err_set(FSDP_ECANCELED, "rank %d of group '%s' aborted its communicator (comm_abort)",
              r->base.rank, r->base.name);
      ring_fail(r, FSDP_ECANCELED);
      pthread_mutex_lock(&r->mu);
      continue;
    }
    if (!r->head) break; /* stop */
    ring_req_t *q = r->head;
    r->head = q->next;
    if (!r->head) r->tail = NULL;
    int broken = r->broken_rc;
    pthread_mutex_unlock(&r->mu);

    ring_op_t o = {.r = r, .a = &q->a, .seq = q->seq};
    o.timeout_ms = q->a.timeout_ms ? q->a.timeout_ms : r->timeout_ms;
    o.deadline_ns = ring_now_ns() + o.timeout_ms * 1000000;
    /* beats come every H <= RING_BEAT_MS: some slack over a few of them */
    o.silence_ns = (o.timeout_ms / 2 > 4 * RING_BEAT_MS ? o.timeout_ms / 2 : 4 * RING_BEAT_MS) *
                   1000000;
    ring_sig(o.sig, sizeof o.sig, q->a.op, q->a.dtype, q->a.redop, q->a.root, q->a.count, q->seq);
    o.uncached = ring_out_bytes(&q->a, r->base.size) >= RING_UNCACHED_MIN;
    int rc;
    if (atomic_load(&r->aborted))
      rc = err_set(FSDP_ECANCELED, "%s on rank %d of group '%s': the communicator was aborted",
                   o.sig, r->base.rank, r->base.name);
    else if (broken)
      rc = err_set(broken, "%s on rank %d: the communicator is broken by an earlier failure: %s",
                   o.sig, r->base.rank, r->broken_msg);
    else if ((rc = ring_run_op(r, &o)) < 0)
      ring_fail(r, rc);
    pthread_mutex_lock(&r->mu);
    ring_complete(r, q, rc, err_msg());
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

/* ---- backend table ---- */

static int ring_supports(comm_op_t op, comm_dtype_t dt) {
  return (unsigned)op < COMM_OP__COUNT && (unsigned)dt < COMM_DTYPE__COUNT;
}

static int ring_issue(comm_t *c, const comm_args_t *a, comm_req_t **out) {
  ring_t *r = (ring_t *)c;
  pthread_mutex_lock(&r->mu);
  int rc = 0;
  if (atomic_load(&r->aborted))
    rc = err_set(FSDP_ECANCELED, "%s on rank %d of group '%s': the communicator was aborted",
                 comm_op_name(a->op), c->rank, c->name);
  else if (r->broken_rc)
    rc = err_set(r->broken_rc, "%s on rank %d: the communicator is broken by an earlier failure: %s",
                 comm_op_name(a->op), c->rank, r->broken_msg);
  if (rc < 0) {
    pthread_mutex_unlock(&r->mu);
    return rc;
  }
  ring_req_t *q = calloc(1, sizeof *q);
  if (!q) {
    pthread_mutex_unlock(&r->mu);
    return err_set(FSDP_ENOMEM, "group '%s': no memory for a collective request", c->name);
  }
  q->base.be = &comm_ring_backend;
  q->r = r;
  q->a = *a;
  q->seq = ++r->seq_issue;
  if (r->tail) r->tail->next = q;
  else r->head = q;
  r->tail = q;
  q->all_next = r->all;
  r->all = q;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  *out = &q->base;
  return 0;
}

static void ring_req_release(ring_t *r, ring_req_t *q) {
  /* under mu */
  for (ring_req_t **pp = &r->all; *pp; pp = &(*pp)->all_next)
    if (*pp == q) {
      *pp = q->all_next;
      break;
    }
  free(q);
}

static int ring_wait(comm_req_t *req, int64_t wait_ms) {
  ring_req_t *q = (ring_req_t *)req;
  ring_t *r = q->r;
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  if (wait_ms >= 0) {
    until.tv_sec += wait_ms / 1000;
    until.tv_nsec += (wait_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&r->mu);
  while (!q->done) {
    if (wait_ms < 0) {
      pthread_cond_wait(&r->cv, &r->mu);
    } else if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT && !q->done) {
      pthread_mutex_unlock(&r->mu);
      return COMM_PENDING;
    }
  }
  int rc = q->rc;
  if (rc < 0) err_set(rc, "%s", q->msg);
  ring_req_release(r, q);
  pthread_mutex_unlock(&r->mu);
  return rc;
}

static void ring_abort(comm_t *c) {
  ring_t *r = (ring_t *)c;
  atomic_store(&r->aborted, 1);
  char b = 1;
  if (r->wake[1] >= 0 && write(r->wake[1], &b, 1) < 0) { /* full pipe: already woken */
  }
  comm_shm_kick(r->shm_in); /* the thread may sleep on a futex rather than in poll */
  comm_shm_kick(r->shm_out);
  pthread_mutex_lock(&r->mu);
  for (ring_req_t *q = r->head; q; q = q->next) {
    char m[RING_MSG];
    snprintf(m, sizeof m, "%s #%u on rank %d of group '%s': the communicator was aborted",
             comm_op_name(q->a.op), q->seq, c->rank, c->name);
    ring_complete(r, q, FSDP_ECANCELED, m);
  }
  r->head = r->tail = NULL;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

static void ring_free(ring_t *r) {
  if (r->fd_next >= 0) close(r->fd_next);
  if (r->fd_prev >= 0) close(r->fd_prev);
  if (r->wake[0] >= 0) close(r->wake[0]);
  if (r->wake[1] >= 0) close(r->wake[1]);
  comm_reg_free(r->staging);
  comm_reg_peer_close(r->rec_rx.peer);
  comm_shm_close(r->shm_in);
  comm_shm_close(r->shm_out);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}

static size_t comm_ring_buffer_bytes(int size);

static void ring_destroy(comm_t *c) {
  ring_t *r = (ring_t *)c;
  pthread_mutex_lock(&r->mu);
  int busy = r->head != NULL;
  for (ring_req_t *q = r->all; q; q = q->all_next) busy |= !q->done;
  /* A normal end tells nobody; ops still queued or running are aborted. */
  if (busy) {
    pthread_mutex_unlock(&r->mu);
    ring_abort(c);
    pthread_mutex_lock(&r->mu);
  }
  r->stop = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  if (r->thread_started) pthread_join(r->thread, NULL);
  /* A normal end says so (a failure already sent its notice), so the
   * previous rank can tell it from a death. */
  if (r->base.size > 1 && !r->notice_sent) {
    ring_beat_t bye = {.magic = RING_BYE_MAGIC, .rank = r->base.rank};
    ring_tx_frame(r, &bye, sizeof bye);
  }
  while (r->all) {
    ring_req_t *q = r->all;
    r->all = q->all_next;
    free(q);
  }
  ring_free(r);
}

const comm_backend_t comm_ring_backend = {
    .name = "ring",
    .supports = ring_supports,
    .issue = ring_issue,
    .wait = ring_wait,
    .abort = ring_abort,
    .destroy = ring_destroy,
    .split = comm_ring_split,
    .buffer_bytes = comm_ring_buffer_bytes,
};

/* ---- bootstrap ---- */

static int ring_parse_addr(const char *addr, char *host, size_t hn, char *port, size_t pn) {
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || !colon[1]) return -1;
  const char *h = addr;
  size_t len = (size_t)(colon - addr);
  if (h[0] == '[' && len >= 2 && h[len - 1] == ']') h++, len -= 2;
  if (len >= hn || strlen(colon + 1) >= pn) return -1;
  memcpy(host, h, len);
  host[len] = 0;
  snprintf(port, pn, "%s", colon + 1);
  return 0;
}

static int ring_resolve(const char *addr, struct addrinfo **res, int passive) {
  char host[RING_ADDR], port[16];
  if (ring_parse_addr(addr, host, sizeof host, port, sizeof port) < 0)
    return err_set(FSDP_EINVAL, "address \"%s\" is not host:port", addr);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = passive ? AI_PASSIVE : 0};
  int g = getaddrinfo(host, port, &hints, res);
  if (g) return err_set(FSDP_EINVAL, "address \"%s\": %s", addr, gai_strerror(g));
  return 0;
}

static void ring_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Blocking exchange of a small struct with a bounded wait. */
static int ring_io_all(int fd, void *p, size_t n, int sending, int64_t deadline) {
  size_t done = 0;
  while (done < n) {
    ssize_t k = sending ? send(fd, (char *)p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, (char *)p + done, n - done, MSG_DONTWAIT);
    if (k > 0) {
      done += (size_t)k;
      continue;
    }
    if (k == 0) return -ECONNRESET;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -errno;
    struct pollfd pf = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
    int ms = ring_ms_left(deadline);
    if (ms == 0) return -ETIMEDOUT;
    if (poll(&pf, 1, ms) < 0 && errno != EINTR) return -errno;
  }
  return 0;
}

static int ring_connect_next(ring_t *r, int64_t deadline) {
  struct addrinfo *res;
  int rc = ring_resolve(r->addr_next, &res, 0);
  if (rc < 0)
    return err_wrap(rc, "rank %d of group '%s': connecting to rank %d", r->base.rank, r->base.name,
                    r->rank_next);
  int last = ETIMEDOUT;
  while (ring_now_ns() < deadline) {
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = errno;
      break;
    }
    int e = 0;
    if (connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
      e = errno;
      if (e == EINPROGRESS) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int n = poll(&pf, 1, ring_ms_left(deadline));
        socklen_t sl = sizeof e;
        if (n == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl);
        else e = ETIMEDOUT;
      }
    }
    if (!e) {
      r->fd_next = fd;
      freeaddrinfo(res);
      return 0;
    }
    close(fd);
    last = e;
    /* not listening yet: try again shortly, within the deadline */
    struct timespec ts = {0, 20 * 1000000};
    int ms = ring_ms_left(deadline);
    if (ms < 20) ts.tv_nsec = (long)ms * 1000000;
    nanosleep(&ts, NULL);
  }
  freeaddrinfo(res);
  return err_set(FSDP_ETIMEDOUT,
                 "rank %d of group '%s' could not connect to rank %d at %s within %lld ms (last "
                 "error: %s): is that rank running, and listening on that address?",
                 r->base.rank, r->base.name, r->rank_next, r->addr_next,
                 (long long)r->timeout_ms, strerror(last));
}

static int ring_listen(ring_t *r, int *lfd) {
  struct addrinfo *res;
  int rc = ring_resolve(r->addr_self, &res, 1);
  if (rc < 0) return err_wrap(rc, "rank %d of group '%s': listening", r->base.rank, r->base.name);
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) < 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return err_set_errno(FSDP_EIO, e,
                         "rank %d of group '%s': cannot listen on %s (another process on that "
                         "port? pick a free one)",
                         r->base.rank, r->base.name, r->addr_self);
  }
  freeaddrinfo(res);
  *lfd = fd;
  return 0;
}

/* Consumer: whether the producer's offer of records can be taken (both want
 * them and its memory can be read here: same uid, no seccomp or Yama in the
 * way); 1 or 0. */
static int ring_cma_accept(ring_t *r, const ring_shm_offer_t *theirs) {
  if (!theirs->cma || param_comm_cma() == 0) return 0;
  int e = comm_cma_probe((pid_t)theirs->pid, theirs->probe, theirs->token);
  if (e < 0)
    LOG_DEBUG("comm", "group '%s' rank %d: cannot read rank %d's memory (%s): copying link",
              r->base.name, r->base.rank, r->rank_prev, strerror(-e));
  return e == 0;
}

/* Consumer: whether the producer's registered segments can be mapped here
 * (its probe segment maps and holds its token); 1 and rx->peer, or 0. */
static int ring_reg_accept(ring_t *r, const ring_shm_offer_t *theirs, comm_rec_rx_t *rx) {
  if (!theirs->reg || param_comm_reg() == 0) return 0;
  if (!rx->peer && !(rx->peer = comm_reg_peer_open((pid_t)theirs->pid))) return 0;
  const uint8_t *m = comm_reg_peer_map(rx->peer, theirs->reg_id, theirs->reg_fd, 8);
  uint64_t got = 0;
  if (m) memcpy(&got, m, sizeof got);
  if (m && got == theirs->reg_token) return 1;
  LOG_DEBUG("comm", "group '%s' rank %d: cannot map rank %d's registered memory (%s): its "
            "buffers are copied", r->base.name, r->base.rank, r->rank_prev,
            m ? "another token" : err_msg());
  return 0;
}

/* The last bootstrap step: each link becomes shared memory when its producer
 * could create one and its consumer could map it (same host, same /dev/shm,
 * FSDP_COMM_SHM not 0 on either side); otherwise it stays TCP. A shared link
 * carries records (rec.c) when the consumer could also read the producer's
 * memory and FSDP_COMM_CMA is not 0 on either side. Every rank sends its
 * offer before reading, and offers and answers fit any socket buffer, so the
 * step cannot deadlock. */
static int ring_shm_negotiate(ring_t *r, int64_t deadline) {
  const int me = r->base.rank;
  int want = param_comm_shm() != 0;
  ring_shm_offer_t mine = {.magic = RING_SHM_MAGIC}, theirs, ans;
  int cma_in = 0, reg_in = 0;
  comm_rec_rx_t rx = {0};
  comm_shm_link_t *out = NULL, *in = NULL;
  if (want) {
    int64_t bytes = param_comm_shm_bytes();
    if (comm_shm_create(bytes > 0 ? (size_t)bytes : 0, &out, mine.name, &mine.token) < 0) {
      LOG_DEBUG("comm", "group '%s' rank %d: no shared memory towards rank %d (%s): TCP",
                r->base.name, me, r->rank_next, err_msg());
      out = NULL;
      mine.name[0] = 0;
    } else {
      mine.cap = comm_shm_cap(out);
      mine.pid = (int32_t)getpid();
      if (param_comm_cma() != 0) {
        comm_cma_allow();
        r->cma_probe = mine.token;
        mine.cma = 1;
        mine.probe = (uint64_t)(uintptr_t)&r->cma_probe;
      }
      comm_reg_seg_t probe;
      if (comm_reg_probe(&probe, &mine.reg_token) == 0)
        mine.reg = 1, mine.reg_id = probe.id, mine.reg_fd = probe.fd;
    }
  }
  int e = ring_io_all(r->fd_next, &mine, sizeof mine, 1, deadline);
  if (e == 0) e = ring_io_all(r->fd_prev, &theirs, sizeof theirs, 0, deadline);
  if (e == 0) {
    theirs.name[COMM_SHM_NAME - 1] = 0;
    ans = (ring_shm_offer_t){.magic = RING_SHM_MAGIC};
    if (want && theirs.magic == RING_SHM_MAGIC && theirs.name[0]) {
      if (comm_shm_attach(theirs.name, theirs.token, theirs.cap, &in) == 0) {
        ans.accepted = 1, ans.cma = (uint32_t)(cma_in = ring_cma_accept(r, &theirs));
        ans.reg = (uint32_t)(reg_in = ring_reg_accept(r, &theirs, &rx));
      } else
        LOG_DEBUG("comm", "group '%s' rank %d: shared memory from rank %d refused (%s): TCP",
                  r->base.name, me, r->rank_prev, err_msg());
    }
    e = ring_io_all(r->fd_prev, &ans, sizeof ans, 1, deadline);
  }
  if (e == 0) e = ring_io_all(r->fd_next, &ans, sizeof ans, 0, deadline);
  comm_shm_unlink(mine.name); /* mapped by both now, or never to be */
  if (e < 0) {
    comm_shm_close(out);
    comm_shm_close(in);
    comm_reg_peer_close(rx.peer);
    return err_set(e == -ETIMEDOUT ? FSDP_ETIMEDOUT : FSDP_EPEER,
                   "rank %d of group '%s': choosing the transport with ranks %d (%s) and %d (%s): "
                   "%s (did a rank fail? see its log)",
                   me, r->base.name, r->rank_next, r->addr_next, r->rank_prev, r->addr_prev,
                   strerror(-e));
  }
  if (!(ans.magic == RING_SHM_MAGIC && ans.accepted == 1)) {
    comm_shm_close(out);
    out = NULL;
  }
  r->shm_out = out;
  r->shm_in = in;
  r->out = !out ? &ring_tcp_link : ans.cma == 1 ? &ring_rec_cma_link : &ring_shm_link;
  r->in = !in ? &ring_tcp_link : cma_in ? &ring_rec_cma_link : &ring_shm_link;
  r->reg_out = out && ans.reg == 1;
  if (cma_in || reg_in) {
    rx.link = in;
    rx.pid = (pid_t)theirs.pid;
    r->rec_rx = rx;
    r->reg_in = reg_in;
  } else {
    comm_reg_peer_close(rx.peer);
  }
  return 0;
}

static int ring_bootstrap(ring_t *r, int lfd) {
  const int me = r->base.rank, N = r->base.size;
  int64_t deadline = ring_now_ns() + r->timeout_ms * 1000000;
  if (listen(lfd, 64) < 0)
    return err_set_errno(FSDP_EINVAL, errno, "rank %d of group '%s': listen on %s", me,
                         r->base.name, r->addr_self);
  int rc = ring_connect_next(r, deadline);
  if (rc < 0) return rc;
  ring_hello_t hi = {.magic = RING_HELLO_MAGIC, .version = RING_VERSION, .size = N, .from = me,
                     .to = r->rank_next};
  snprintf(hi.name, sizeof hi.name, "%s", r->base.name);
  int e = ring_io_all(r->fd_next, &hi, sizeof hi, 1, deadline);
  if (e < 0) goto io_next;

  /* accept the previous rank */
  for (;;) {
    struct pollfd pf = {.fd = lfd, .events = POLLIN};
    int ms = ring_ms_left(deadline);
    if (ms == 0 || poll(&pf, 1, ms) == 0)
      return err_set(FSDP_ETIMEDOUT,
                     "rank %d of group '%s' (%s): rank %d (%s) did not connect within %lld ms: is "
                     "it running, with the same address list?",
                     me, r->base.name, r->addr_self, r->rank_prev, r->addr_prev,
                     (long long)r->timeout_ms);
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      r->fd_prev = fd;
      break;
    }
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
      return err_set_errno(FSDP_EIO, errno, "rank %d of group '%s': accept on %s", me,
                           r->base.name, r->addr_self);
  }
  ring_tune(r->fd_prev);
  ring_hello_t ph;
  e = ring_io_all(r->fd_prev, &ph, sizeof ph, 0, deadline);
  if (e < 0)
    return err_set(e == -ETIMEDOUT ? FSDP_ETIMEDOUT : FSDP_EPEER,
                   "rank %d of group '%s' (%s): reading the hello of the connecting rank: %s", me,
                   r->base.name, r->addr_self, strerror(-e));
  ph.name[sizeof ph.name - 1] = 0;
  if (ph.magic != RING_HELLO_MAGIC || ph.version != RING_VERSION)
    return err_set(FSDP_EPEER,
                   "rank %d of group '%s' (%s): a connection that is not an fsdpd ring of this "
                   "version (magic %08x version %u) arrived where rank %d (%s) was expected",
                   me, r->base.name, r->addr_self, ph.magic, ph.version, r->rank_prev,
                   r->addr_prev);
  if (ph.size != N || ph.from != r->rank_prev || ph.to != me || strcmp(ph.name, r->base.name))
    return err_set(FSDP_EPEER,
                   "rank %d of group '%s' (size %d, at %s) expected its previous rank %d (%s) "
                   "but was reached by rank %d of group '%s' (size %d) dialling rank %d: the "
                   "address lists handed to the ranks disagree",
                   me, r->base.name, N, r->addr_self, r->rank_prev, r->addr_prev, (int)ph.from,
                   ph.name, (int)ph.size, (int)ph.to);
  ring_hello_t reply = hi;
  reply.to = r->rank_prev;
  e = ring_io_all(r->fd_prev, &reply, sizeof reply, 1, deadline);
  if (e < 0)
    return err_set(FSDP_EPEER, "rank %d of group '%s': answering rank %d (%s): %s", me,
                   r->base.name, r->rank_prev, r->addr_prev, strerror(-e));

  ring_hello_t nh;
  e = ring_io_all(r->fd_next, &nh, sizeof nh, 0, deadline);
  if (e < 0) goto io_next;
  nh.name[sizeof nh.name - 1] = 0;
  if (nh.magic != RING_HELLO_MAGIC || nh.size != N || nh.from != r->rank_next || nh.to != me ||
      strcmp(nh.name, r->base.name))
    return err_set(FSDP_EPEER,
                   "rank %d of group '%s' (size %d) dialled rank %d at %s but rank %d of group "
                   "'%s' (size %d) answered: the address lists handed to the ranks disagree",
                   me, r->base.name, N, r->rank_next, r->addr_next, (int)nh.from, nh.name,
                   (int)nh.size);
  return ring_shm_negotiate(r, deadline);
io_next:
  return err_set(e == -ETIMEDOUT ? FSDP_ETIMEDOUT : FSDP_EPEER,
                 "rank %d of group '%s': handshake with rank %d at %s: %s (was the rank started "
                 "with the same address list? did it fail? see its log)",
                 me, r->base.name, r->rank_next, r->addr_next, strerror(-e));
}


int comm_ring_create(const comm_ring_opts_t *o, comm_t **out) {
  *out = NULL;
  if (!o || o->size < 1 || o->rank < 0 || o->rank >= o->size || (o->size > 1 && !o->addrs))
    return err_set(FSDP_EINVAL, "comm_ring_create: rank %d of size %d (need 0 <= rank < size)",
                   o ? o->rank : -1, o ? o->size : -1);
  if (o->size > 4096)
    return err_set(FSDP_EINVAL, "comm_ring_create: group size %d is over the ring's 4096", o->size);
  const char *name = o->name ? o->name : "";
  if (strlen(name) > 63)
    return err_set(FSDP_EINVAL, "comm_ring_create: group name \"%s\" is over 63 bytes", name);
  ring_t *r = calloc(1, sizeof *r);
  if (!r) return err_set(FSDP_ENOMEM, "comm_ring_create: no memory");
  r->base.be = &comm_ring_backend;
  r->base.rank = o->rank;
  r->base.size = o->size;
  snprintf(r->base.name, sizeof r->base.name, "%s", name);
  r->fd_next = r->fd_prev = r->wake[0] = r->wake[1] = -1;
  r->out = r->in = &ring_tcp_link; /* until the bootstrap finds better */
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_destroy(&r->cv);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
  }
  r->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : param_comm_timeout_ms();
  if (r->timeout_ms <= 0) r->timeout_ms = 5000;
  int64_t ch = o->chunk_bytes ? (int64_t)o->chunk_bytes : param_comm_chunk_bytes();
  int64_t st = o->staging_bytes ? (int64_t)o->staging_bytes : param_comm_staging_bytes();
  if (ch < 64) ch = 64;
  if (st < 64) st = 64;
  r->chunk = (size_t)ch;
  r->staging_bytes = (size_t)st & ~(size_t)3; /* whole fp32 and bf16 elements */
  int rc = 0;
  int lfd = o->listen_fd;
  if (o->addrs) snprintf(r->addr_self, RING_ADDR, "%s", o->addrs[o->rank]);
  if (o->size > 1) {
    r->rank_next = (o->rank + 1) % o->size;
    r->rank_prev = (o->rank - 1 + o->size) % o->size;
    snprintf(r->addr_next, RING_ADDR, "%s", o->addrs[r->rank_next]);
    snprintf(r->addr_prev, RING_ADDR, "%s", o->addrs[r->rank_prev]);
    r->staging = comm_reg_alloc(MEM_COMM, r->staging_bytes, "ring reduce staging");
    if (!r->staging) {
      rc = FSDP_ENOMEM;
      goto fail;
    }
    if (lfd < 0 && (rc = ring_listen(r, &lfd)) < 0) goto fail;
    rc = ring_bootstrap(r, lfd);
    close(lfd);
    lfd = -1;
    if (rc < 0) goto fail;
    ring_tune(r->fd_next);
  } else if (lfd >= 0) {
    close(lfd);
    lfd = -1;
  }
  r->beat_ns = (r->timeout_ms / 10 < RING_BEAT_MS ? r->timeout_ms / 10 : RING_BEAT_MS) * 1000000;
  if (r->beat_ns < 1000000) r->beat_ns = 1000000;
  r->heard_ns = r->beat_due = ring_now_ns(); /* the hello was the last word */
  if (pipe2(r->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
    rc = err_set_errno(FSDP_EINTERNAL, errno, "comm_ring_create: pipe");
    goto fail;
  }
  if (pthread_create(&r->thread, NULL, ring_thread, r) != 0) {
    rc = err_set(FSDP_EINTERNAL, "comm_ring_create: cannot start the communication thread");
    goto fail;
  }
  r->thread_started = 1;
  LOG_DEBUG("comm", "group '%s': rank %d of %d connected (next %s over %s%s, prev %s over %s%s)",
            name, o->rank, o->size, r->addr_next, r->out->name, r->reg_out ? "+reg" : "",
            r->addr_prev, r->in->name, r->reg_in ? "+reg" : "");
  *out = &r->base;
  return 0;
fail:
  if (lfd >= 0) close(lfd);
  ring_free(r);
  return rc;
}

/* docs/RING.md's memory formula, with the default tunables (a link that
 * stays TCP maps nothing, so this is the most a communicator holds). */
static size_t comm_ring_buffer_bytes(int size) {
  if (size < 2) return 0;
  int64_t st = param_comm_staging_bytes(), sb = param_comm_shm_bytes();
  size_t staging = (size_t)(st < 64 ? 64 : st) & ~(size_t)3; /* as comm_ring_create */
  size_t links = param_comm_shm() != 0 ? 2 : 0;
  return staging + links * COMM_SHM_MAP_BYTES((size_t)comm_shm_round_cap(sb > 0 ? (size_t)sb : 0));
}

const char *comm_ring_self_addr(const comm_t *c) { return ((const ring_t *)c)->addr_self; }

int comm_ring_cma_links(const comm_t *c) {
  const ring_t *r = (const ring_t *)c;
  return (r->out == &ring_rec_cma_link) + (r->in == &ring_rec_cma_link);
}

int comm_ring_reg_links(const comm_t *c) {
  const ring_t *r = (const ring_t *)c;
  return r->reg_out + r->reg_in;
}

uint64_t comm_ring_record_ops(const comm_t *c) {
  return atomic_load(&((const ring_t *)c)->record_ops);
}

/* ring_impl: what the files of the ring backend share; internal to them.
 *
 *   ring.c       the backend table, the request queue, the communication
 *                thread, create and destroy (ring_*)
 *   ring_boot.c  bootstrap: listen, connect, hello, the transport offer
 *                (ring_boot_*)
 *   ring_live.c  the reverse direction (beats, notices, bye), liveness,
 *                deadlines, naming the rank that failed, and every wait of
 *                an op (ring_live_*)
 *   ring_algo.c  one op: its header, then the algorithms (ring_algo_*)
 *   ring_tcp.c, ring_shm.c, ring_rec.c
 *                the link tables (ring_tcp_link, ...; ring_link_t below)
 *   ring_split.c comm_split (through ring.h only)
 *
 * A function's prefix names its file: ring_boot_* in ring_boot.c, ...;
 * plain ring_* in ring.c, or inline here. docs/RING.md describes the
 * protocol all of them speak. */
#ifndef FSDP_COMM_RING_IMPL_H
#define FSDP_COMM_RING_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "daemon/comm/comm.h"
#include "daemon/comm/rec.h"
#include "daemon/comm/reg.h"
#include "daemon/comm/ring.h"
#include "daemon/comm/shm.h"

/* The wire (docs/RING.md), one magic per message; RING_VERSION, in the
 * hello, changes with any of them. */
#define RING_HELLO_MAGIC 0x48525346u  /* "FSRH" */
#define RING_REFUSE_MAGIC 0x4e525346u /* "FSRN": a hello turned away, and by whom */
#define RING_OFFER_MAGIC 0x53525346u  /* "FSRS" */
#define RING_HDR_MAGIC 0x4f525346u    /* "FSRO" */
#define RING_NOTICE_MAGIC 0x41525346u /* "FSRA" */
#define RING_BEAT_MAGIC 0x42525346u   /* "FSRB" */
#define RING_BYE_MAGIC 0x59525346u    /* "FSRY" */
#define RING_PROOF_MAGIC 0x50525346u  /* "FSRP": the dialler's proof of the secret */
#define RING_VERSION 7u
#define RING_MAC_BYTES 32 /* HMAC-SHA-256 */
#define RING_MSG 512  /* a notice, and every message buffer */
#define RING_ADDR 128 /* "host:port" */
#define RING_BEAT_MS 100  /* beat period, at most (timeout / 10 when shorter) */
#define RING_GRACE_MS 500 /* a deadline's wait for a notice, at most (timeout / 4) */

/* How the next rank's reverse stream ended. */
enum { RING_NEXT_OPEN, RING_NEXT_BYE, RING_NEXT_GONE };

/* An op's header, forward. */
typedef struct {
  uint32_t magic, seq;
  uint8_t op, dtype, redop;
  uint8_t xport; /* 1: this op's data follow as records (rec.c); not compared */
  int32_t root;
  uint64_t count;
  uint64_t pad2;
} ring_hdr_t;

/* A failure notice, reverse: a rank's last frame. */
typedef struct {
  uint32_t magic;
  int32_t origin, code;
  char msg[RING_MSG - 12];
} ring_notice_t;

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

extern const ring_link_t ring_tcp_link;     /* ring_tcp.c */
extern const ring_link_t ring_shm_link;     /* ring_shm.c: copying */
extern const ring_link_t ring_rec_link;     /* ring_rec.c: records of registered buffers */
extern const ring_link_t ring_rec_cma_link; /* ring_rec.c: records for every op (CMA) */

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
  char job[COMM_RING_JOB_MAX + 1]; /* whose ring: "" (none) or the job's id, */
  uint32_t attempt;                /* and its attempt (comm_ring_opts_t) */
  int has_secret;                           /* the run's secret given (comm_ring_opts_t) */
  uint8_t run_secret[COMM_RING_SECRET_BYTES]; /* as given: what split groups are given */
  uint8_t secret[COMM_RING_SECRET_BYTES];     /* this group's key, HMAC(run's, its name);
                                               * all zero when none */
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

static inline int64_t ring_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Milliseconds to deadline_ns, rounded up (0: past), for poll(). */
static inline int ring_ms_left(int64_t deadline_ns) {
  int64_t left = deadline_ns - ring_now_ns();
  if (left <= 0) return 0;
  int64_t ms = (left + 999999) / 1000000;
  return ms > 1000000000 ? 1000000000 : (int)ms;
}

/* The posted and consumed of the links whose receiver copies the bytes: a
 * sender's buffers are its own again once sent. */
static inline uint64_t ring_copied_posted(const ring_t *r) {
  (void)r;
  return 0;
}

static inline int ring_copied_consumed(const ring_t *r, uint64_t pos) {
  (void)r, (void)pos;
  return 1;
}

/* ring.c */

/* "all_reduce #3 (f32 count=100 sum)": an op as messages name it. */
void ring_sig(char *buf, size_t n, int op, int dt, int redop, int root, uint64_t count,
              uint32_t seq);

/* ring_boot.c */

/* Connects r to its neighbours (r's ranks, addresses, name and timeout
 * set): listens on lfd (-1: binds addr_self), connects to the next rank,
 * accepts the previous one, checks the hellos and chooses each link's
 * transport (r->out, r->in). Closes lfd. 0, or a code with a message. */
int ring_boot_connect(ring_t *r, int lfd);

/* ring_live.c: the thread only; o is the op running. */

/* A beat to the previous rank (unless a frame is still pending, or after a
 * notice), and the next one due beat_ns after now. */
void ring_live_tick(ring_t *r, int64_t now);
/* Reads the next rank's frames without waiting: beats, a bye, the end of
 * its stream, a notice (returned as o's failure, or between ops, o NULL,
 * the communicator's, and passed on). need: o still needs the next rank, so
 * its end is a failure too. */
int ring_live_hear(ring_t *r, ring_op_t *o, int need);
/* o fails when the next rank has been silent for over o->silence_ns (its
 * process is stopped or hung); call right after ring_live_hear. */
int ring_live_silent(ring_t *r, ring_op_t *o);
/* One turn of a wait loop: an abort, a notice, silence or the deadline end
 * the op with its error (the deadline names the previous rank when
 * want_recv, else the next); 0 to go on. Beats when one is due. */
int ring_live_turn(ring_t *r, ring_op_t *o, int want_recv);
/* Waits until the next rank can take data (want_send), the previous one has
 * sent some (want_recv), or the next rank has consumed up to *reach (not
 * NULL), with ring_live_turn's ends. watch_next: o still has data to send,
 * so the next rank's end matters. 0: ready (or a spurious wake). */
int ring_live_wait(ring_t *r, ring_op_t *o, int want_send, int want_recv, int watch_next,
                   const uint64_t *reach);
/* The previous rank left or failed: "rank N (addr) <what> (<why>)", after a
 * short wait for a notice that names the rank that failed first. */
int ring_live_prev_gone(ring_t *r, ring_op_t *o, const char *what, const char *why);
/* The previous rank's connection ended (e: its errno, 0: end of stream). */
int ring_live_prev_closed(ring_t *r, ring_op_t *o, int e);
/* This rank failed with rc (err_msg()): its notice to the previous rank, once. */
void ring_live_notify(ring_t *r, int rc);
/* A normal end: the bye to the previous rank (after the thread is joined). */
void ring_live_bye(ring_t *r);

/* ring_algo.c */

/* Runs op o (the thread): its header, then its data. 0, or a code. */
int ring_algo_run(ring_t *r, ring_op_t *o);

#endif

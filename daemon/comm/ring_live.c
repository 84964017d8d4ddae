/* ring_live: the reverse direction and liveness of a ring communicator, and
 * every wait of its ops (docs/RING.md, "Reverse direction").
 *
 * It owns the frames that go from a rank to its previous one (beats every H,
 * the failure notice, the bye) and reads the next rank's; from them, and
 * from the op's deadline, it decides which rank an op's failure names: the
 * next rank when it died unannounced or went silent, the previous one when
 * it never issued the collective, else whoever a notice says failed first.
 * Every wait of an op goes through ring_live_wait, which sleeps on the
 * sockets or the shared-memory links (the link table says which) and wakes
 * for beats, frames, an abort and the deadline. The thread only. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>

#include "daemon/comm/ring_impl.h"
#include "daemon/common/err.h"
#include "daemon/common/log.h"

/* Sends what tx holds, as far as the socket takes it now. A previous rank
 * that is gone takes nothing more: its frames are dropped. */
static void ring_live_flush(ring_t *r) {
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
static int ring_live_frame(ring_t *r, const void *f, size_t n) {
  if (r->fd_prev < 0) return -1;
  ring_live_flush(r);
  if (r->tx_len + n > sizeof r->tx) return -1;
  memcpy(r->tx + r->tx_len, f, n);
  r->tx_len += n;
  ring_live_flush(r);
  return 0;
}

/* Every H: a beat to the previous rank (none behind a frame the socket has
 * not taken, so a stopped reader costs no memory; none after a notice, the
 * last frame). */
void ring_live_tick(ring_t *r, int64_t now) {
  r->beat_due = now + r->beat_ns;
  ring_live_flush(r);
  if (r->tx_len || r->notice_sent) return;
  ring_beat_t b = {.magic = RING_BEAT_MAGIC, .rank = r->base.rank};
  ring_live_frame(r, &b, sizeof b);
}

/* Sends a notice, this rank's own or the next rank's passed on: its last frame. */
static void ring_live_send_notice(ring_t *r, const ring_notice_t *note) {
  if (r->fd_prev < 0 || r->notice_sent) return;
  r->notice_sent = 1;
  /* behind at most a beat; what the socket cannot take now goes at the next ticks */
  int rc = ring_live_frame(r, note, sizeof *note);
  comm_shm_kick(r->shm_in); /* the previous rank may sleep on that link: wake it to read this */
  if (rc < 0 || r->tx_len)
    LOG_DEBUG("comm", "group '%s' rank %d: could not pass a failure notice to rank %d%s",
              r->base.name, r->base.rank, r->rank_prev, rc < 0 ? "" : " at once");
}

void ring_live_notify(ring_t *r, int rc) {
  ring_notice_t note;
  memset(&note, 0, sizeof note);
  note.magic = RING_NOTICE_MAGIC;
  note.origin = r->base.rank;
  note.code = rc;
  snprintf(note.msg, sizeof note.msg, "%s", err_msg());
  /* a rank that read a notice already passed it on (notice_sent) */
  ring_live_send_notice(r, &note);
}

/* A normal end says so (a failure already sent its notice), so the previous
 * rank can tell it from a death. */
void ring_live_bye(ring_t *r) {
  if (r->base.size < 2 || r->notice_sent) return;
  ring_beat_t bye = {.magic = RING_BYE_MAGIC, .rank = r->base.rank};
  ring_live_frame(r, &bye, sizeof bye);
}

/* "<op> on rank R of group 'G'", or "rank R of group 'G'" between ops. */
static const char *ring_live_where(const ring_t *r, const ring_op_t *o, char *buf, size_t n) {
  if (o) snprintf(buf, n, "%s on rank %d of group '%s'", o->sig, r->base.rank, r->base.name);
  else snprintf(buf, n, "rank %d of group '%s'", r->base.rank, r->base.name);
  return buf;
}

/* "<where>: rank N (addr) closed its connection (<why>): ...": the next
 * rank died unannounced (no notice, no bye). */
static void ring_live_death_msg(const ring_t *r, const ring_op_t *o, char *buf, size_t n) {
  char w[256];
  const int k = snprintf(buf, n,
                         "%s: rank %d (%s) closed its connection (%s): that rank exited, crashed "
                         "or was killed; see its log, then restart the job from its last "
                         "checkpoint",
                         ring_live_where(r, o, w, sizeof w), r->rank_next, r->addr_next,
                         r->next_errno ? strerror(r->next_errno) : "end of stream");
  if (k >= (int)n && n > 4) memcpy(buf + n - 4, "...", 4); /* cut: says so */
}

/* The next rank's stream ended while this rank needs it, or it died first. */
static int ring_live_next_gone(ring_t *r, ring_op_t *o) {
  char w[256];
  ring_live_where(r, o, w, sizeof w);
  if (r->next_end == RING_NEXT_BYE)
    return err_set(FSDP_EPEER,
                   "%s: rank %d (%s) ended its communicator while this rank still needed it: "
                   "the ranks issued different numbers of collectives (see that rank's log for "
                   "its last one)",
                   w, r->rank_next, r->addr_next);
  char m[sizeof(((ring_notice_t *)0)->msg)];
  ring_live_death_msg(r, o, m, sizeof m);
  return err_set(FSDP_EPEER, "%s", m);
}

/* The next rank died unannounced: this rank says so to the previous one at
 * once, as its notice, even while its own op does not need the next rank
 * yet (it waits on the previous one, its sends all taken). Else a rank
 * further back whose own previous rank fails on the death and exits sees
 * only that echo, and names the echo: the notice names the dead rank. */
static void ring_live_tell_death(ring_t *r, ring_op_t *o) {
  ring_notice_t note;
  memset(&note, 0, sizeof note);
  note.magic = RING_NOTICE_MAGIC;
  note.origin = r->base.rank;
  note.code = FSDP_EPEER;
  ring_live_death_msg(r, o, note.msg, sizeof note.msg);
  ring_live_send_notice(r, &note);
}

/* A notice from the next rank: this rank's failure, passed on unchanged so it
 * stays short and names the cause. */
static int ring_live_take_notice(ring_t *r, ring_op_t *o, ring_notice_t *note) {
  char w[256];
  note->msg[sizeof note->msg - 1] = 0;
  err_set(FSDP_EPEER, "%s: rank %d failed first: %s", ring_live_where(r, o, w, sizeof w),
          (int)note->origin, note->msg);
  ring_live_send_notice(r, note);
  return FSDP_EPEER;
}

/* Reads what the next rank sent on the reverse direction, without waiting
 * (but for the rest of a notice already begun, up to 1 s): beats (heard_ns),
 * a bye or the end of the stream (next_end), a notice (returned as this op's
 * failure, or between ops (o NULL) the communicator's, and passed on). need:
 * the op still needs the next rank, so its end is a failure too. */
int ring_live_hear(ring_t *r, ring_op_t *o, int need) {
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
                         ring_live_where(r, o, w, sizeof w), r->rank_next, r->addr_next, m);
        }
        if (r->rx_len - off < fl) break;
        if (m == RING_NOTICE_MAGIC) {
          ring_notice_t note;
          memcpy(&note, r->rx + off, sizeof note);
          r->rx_len = 0;               /* a notice is the last frame: */
          r->next_end = RING_NEXT_BYE; /* nothing more to read, and its end is explained */
          return ring_live_take_notice(r, o, &note);
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
                     ring_live_where(r, o, w, sizeof w), r->rank_next, r->addr_next, r->rx_len);
    }
    r->next_end = RING_NEXT_GONE; /* died: no notice, no bye */
    r->next_errno = k == 0 ? 0 : errno;
    ring_live_tell_death(r, o);
  }
  if (need && r->next_end != RING_NEXT_OPEN) return ring_live_next_gone(r, o);
  return 0;
}

/* Liveness while an op runs: the next rank beats every H, so a long silence
 * means its process is stopped or hung. Call right after ring_live_hear. */
int ring_live_silent(ring_t *r, ring_op_t *o) {
  if (r->next_end != RING_NEXT_OPEN) return 0;
  int64_t quiet = ring_now_ns() - r->heard_ns;
  if (quiet <= o->silence_ns) return 0;
  return err_set(FSDP_ETIMEDOUT,
                 "%s on rank %d of group '%s': rank %d (%s) has not been heard from for %lld ms: "
                 "its process is stopped or hung (SIGSTOP, a debugger, a frozen host), or the "
                 "network between the two ranks is cut; check its state and log and the link, "
                 "then restart the job from its last checkpoint",
                 o->sig, r->base.rank, r->base.name, r->rank_next, r->addr_next,
                 (long long)(quiet / 1000000));
}

static int ring_live_aborted(ring_t *r, ring_op_t *o) {
  if (!atomic_load_explicit(&r->aborted, memory_order_relaxed)) return 0;
  return err_set(FSDP_ECANCELED, "%s on rank %d of group '%s': the communicator was aborted",
                 o->sig, r->base.rank, r->base.name);
}

/* Before a rank names a neighbour on its own evidence: up to ms for the next
 * rank's word, which comes from further on and knows more: its notice
 * (returned), its death with neither notice nor bye (it failed first: named),
 * its silence (named). 0: nothing came (or it ended normally). Beats go on. */
static int ring_live_await_word(ring_t *r, ring_op_t *o, int ms) {
  int64_t until = ring_now_ns() + (int64_t)ms * 1000000;
  for (;;) {
    int rc = ring_live_aborted(r, o);
    if (rc == 0) rc = ring_live_hear(r, o, 0);
    if (rc < 0) return rc;
    if (r->next_end == RING_NEXT_GONE) return ring_live_next_gone(r, o);
    if (r->next_end == RING_NEXT_BYE) return 0;
    int64_t now = ring_now_ns();
    if (now >= r->beat_due) ring_live_tick(r, now);
    if ((rc = ring_live_silent(r, o)) < 0) return rc;
    if (now >= until) return 0;
    struct pollfd p[2] = {{.fd = r->fd_next, .events = POLLIN},
                          {.fd = r->wake[0], .events = POLLIN}};
    poll(p, 2, ring_ms_left(until < r->beat_due ? until : r->beat_due));
  }
}

static int ring_live_timeout(ring_t *r, ring_op_t *o, int want_recv) {
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
  int rc = ring_live_await_word(r, o, grace);
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
static int ring_live_check(ring_t *r, ring_op_t *o) {
  int rc = ring_live_aborted(r, o);
  if (rc < 0) return rc;
  int64_t now = ring_now_ns();
  if (now >= r->beat_due) {
    ring_live_tick(r, now);
    if ((rc = ring_live_hear(r, o, 0)) < 0 || (rc = ring_live_silent(r, o)) < 0) return rc;
  }
  if (now >= o->deadline_ns) return 1;
  return 0;
}

/* One turn of a wait loop: an abort, a notice or silence ends the op with
 * its error, and so does the deadline (ring_live_timeout names whom it waited
 * for: the previous rank when want_recv, else the next); 0 to go on. */
int ring_live_turn(ring_t *r, ring_op_t *o, int want_recv) {
  int rc = ring_live_check(r, o);
  return rc == 1 ? ring_live_timeout(r, o, want_recv) : rc;
}

int64_t comm_ring_test_stall_ns;

/* Whether this op still needs the next rank: data to send to it (want_send,
 * watch_next), or records it has not consumed yet (up to *reach, or all this
 * rank posted): then its end, even a normal one, fails the op. */
static int ring_live_owes_next(ring_t *r, ring_op_t *o, int want_send, int watch_next,
                               const uint64_t *reach) {
  return want_send || watch_next || (reach && !o->out->consumed(r, *reach)) ||
         !o->out->consumed(r, o->out->posted(r));
}

/* Waits until the next rank can take data (want_send), the previous one has
 * sent some (want_recv), the next rank has consumed this rank's records up
 * to *reach (reach not NULL), the deadline, an abort or a notice, reading the
 * next rank's frames meanwhile. watch_next: this op still has data to send,
 * so the next rank closing or failing matters (so does it while the next
 * rank has records of this rank's still to read: ring_live_owes_next). When both links are sockets
 * it sleeps in poll() until the next beat; when one is shared memory, on its
 * futexes in slices of at most 10 ms (1 ms when the other side is a socket
 * it waits on), looking at the sockets (frames, a closed peer, a socket
 * side's readiness) between them, so a dead peer is seen within a slice and
 * a notice or an abort at once (their senders kick the links). */
int ring_live_wait(ring_t *r, ring_op_t *o, int want_send, int want_recv, int watch_next,
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
  struct pollfd p[3];
  p[0].fd = r->wake[0];
  p[0].events = POLLIN;
  /* on a shared-memory link nothing comes through fd_prev: readable = closed */
  p[2].fd = want_recv ? r->fd_prev : -1;
  p[2].events = POLLIN;
  for (;;) {
    if (comm_ring_test_stall_ns) {
      struct timespec ts = {comm_ring_test_stall_ns / 1000000000, comm_ring_test_stall_ns % 1000000000};
      nanosleep(&ts, NULL);
    }
    int rc = ring_live_turn(r, o, want_recv);
    if (rc < 0) return rc;
    /* Decided every turn, after the next rank's end is seen: it may consume
     * the last of this rank's records and end normally while this rank still
     * waits (on its previous rank, or for that very consumption), which is no
     * failure of this op. */
    if (r->next_end != RING_NEXT_OPEN && ring_live_owes_next(r, o, want_send, watch_next, reach))
      return ring_live_next_gone(r, o);
    int open = r->next_end == RING_NEXT_OPEN; /* frames may come */
    p[1].fd = (open || sock_send) ? r->fd_next : -1;
    p[1].events = (short)((sock_send ? POLLOUT : 0) | (open ? POLLIN : 0));
    p[0].revents = p[1].revents = p[2].revents = 0;
    int64_t until = o->deadline_ns < r->beat_due ? o->deadline_ns : r->beat_due;
    int n = poll(p, 3, shm ? 0 : ring_ms_left(until));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return err_set_errno(FSDP_EINTERNAL, errno, "%s: poll", o->sig);
    if (n > 0) {
      if (p[0].revents) continue; /* abort: reported by ring_live_check */
      if (open && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
        if ((rc = ring_live_hear(r, o, 0)) < 0) return rc; /* its end: next turn */
        continue; /* beats */
      }
      if (p[1].revents & POLLOUT) return 0;
      if (p[2].revents && sock_recv) return 0;
      if (p[2].revents) {
        if (comm_shm_readable(r->shm_in)) return 0; /* what it wrote before leaving */
        char b;
        ssize_t k = recv(r->fd_prev, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return ring_live_prev_closed(r, o, k < 0 ? errno : 0);
      }
    }
    if (!shm) continue; /* deadline or beat: ring_live_check */
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

/* The previous rank left or failed: "rank N (addr) <what> (<why>)". */
int ring_live_prev_gone(ring_t *r, ring_op_t *o, const char *what, const char *why) {
  /* The previous rank is gone. If that is the echo of a failure further
   * back, the next rank's notice (travelling the other way) names the rank
   * that failed first: wait for it briefly. A next rank that died without a
   * notice died first (every failing rank sends one before it closes): the
   * previous rank's end is the echo, and ring_live_await_word names the next. */
  int grace = ring_ms_left(o->deadline_ns);
  if (grace > 200) grace = 200;
  int rc = ring_live_await_word(r, o, grace);
  if (rc < 0) return rc;
  return err_set(FSDP_EPEER,
                 "%s on rank %d of group '%s': rank %d (%s) %s (%s): that rank exited, crashed, "
                 "failed or was killed; see its log, then restart the job from its last checkpoint",
                 o->sig, r->base.rank, r->base.name, r->rank_prev, r->addr_prev, what, why);
}

/* The previous rank's connection ended (e: its errno, 0 for end of stream). */
int ring_live_prev_closed(ring_t *r, ring_op_t *o, int e) {
  return ring_live_prev_gone(r, o, "closed its connection", e ? strerror(e) : "end of stream");
}

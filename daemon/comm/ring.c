/* ring: the collectives of CPU devices (the ring algorithms NCCL and Gloo
 * use, over TCP and shared memory), behind comm_backend_t.
 *
 * What a ring communicator owns: two sockets (to the next rank, from the
 * previous one), up to two shared-memory links (same-host neighbours), a
 * communication thread that runs the queued ops in issue order, a bounded
 * staging buffer for reductions (MEM_COMM), and a wake pipe that comm_abort
 * writes to. It does not own the caller's buffers.
 *
 * This file is the backend table, the request queue, the thread and the
 * communicator's life (create, abort, destroy, breaking it after a failure);
 * ring_impl.h says which file holds the rest. docs/RING.md describes the
 * protocol: the wire format, the reverse direction and how a failed or
 * stalled rank is named, the transports, and the memory formula
 * (ring_size.h). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/comm/ring_impl.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/mem.h"
#include "daemon/common/param.h"

void ring_sig(char *buf, size_t n, int op, int dt, int redop, int root, uint64_t count,
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

/* Thread, not under mu: an op failed (err_msg()). */
static void ring_fail(ring_t *r, int rc) {
  ring_break(r, rc);
  /* Before the failure reaches the caller, who may then reuse the buffers the
   * next rank could still be reading (records): it must not deliver those bytes. */
  if (r->out == &ring_rec_cma_link || r->reg_out) comm_shm_abandon(r->shm_out);
  ring_live_notify(r, rc);
}

/* Between ops, every H (thread, not under mu): a beat, and the next rank's
 * frames: a notice breaks the communicator and is passed on at once, so it
 * crosses a rank that is not in a collective (busy computing, or stuck
 * before one) on its way to the ranks that are. */
static void ring_idle_tick(ring_t *r) {
  ring_live_tick(r, ring_now_ns());
  int rc = ring_live_hear(r, NULL, 0);
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
    int rc;
    if (atomic_load(&r->aborted))
      rc = err_set(FSDP_ECANCELED, "%s on rank %d of group '%s': the communicator was aborted",
                   o.sig, r->base.rank, r->base.name);
    else if (broken)
      rc = err_set(broken, "%s on rank %d: the communicator is broken by an earlier failure: %s",
                   o.sig, r->base.rank, r->broken_msg);
    else if ((rc = ring_algo_run(r, &o)) < 0)
      ring_fail(r, rc);
    pthread_mutex_lock(&r->mu);
    ring_complete(r, q, rc, err_msg());
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

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
  explicit_bzero(r->secret, sizeof r->secret);
  explicit_bzero(r->run_secret, sizeof r->run_secret);
  free(r);
}

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
  ring_live_bye(r);
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
    .buffer_bytes = comm_ring_size_bytes, /* ring_size.h: the plan's formula */
};

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
  const char *job = o->job ? o->job : "";
  if (strlen(job) > COMM_RING_JOB_MAX)
    return err_set(FSDP_EINVAL, "comm_ring_create: job id \"%.40s...\" is over %d bytes", job,
                   COMM_RING_JOB_MAX);
  ring_t *r = calloc(1, sizeof *r);
  if (!r) return err_set(FSDP_ENOMEM, "comm_ring_create: no memory");
  r->base.be = &comm_ring_backend;
  r->base.rank = o->rank;
  r->base.size = o->size;
  snprintf(r->base.name, sizeof r->base.name, "%s", name);
  snprintf(r->job, sizeof r->job, "%s", job);
  r->attempt = o->attempt;
  if (o->secret) {
    /* a key of the group's own: a hello recorded in one group (the world)
     * proves nothing in another (a shard group), where it would otherwise
     * pass for a rank of another run and fail the acceptor */
    char label[96];
    const int n = snprintf(label, sizeof label, "fsdpd ring group %s", name);
    unsigned len = 0;
    memcpy(r->run_secret, o->secret, sizeof r->run_secret);
    r->has_secret = 1;
    if (!HMAC(EVP_sha256(), o->secret, COMM_RING_SECRET_BYTES, (const uint8_t *)label, (size_t)n,
              r->secret, &len) ||
        len != sizeof r->secret) {
      explicit_bzero(r, sizeof *r); /* nothing else is made yet */
      free(r);
      return err_set(FSDP_EINTERNAL, "comm_ring_create: HMAC-SHA-256 failed (OpenSSL)");
    }
  }
  r->fd_next = r->fd_prev = r->wake[0] = r->wake[1] = -1;
  r->out = r->in = &ring_tcp_link; /* until the bootstrap finds better */
  pthread_mutex_init(&r->mu, NULL);
  pthread_condattr_t ca; /* ring_wait and the idle beats count in CLOCK_MONOTONIC */
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&r->cv, &ca);
  pthread_condattr_destroy(&ca);
  r->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : param_comm_timeout_ms();
  if (r->timeout_ms <= 0) r->timeout_ms = 5000;
  int64_t ch = o->chunk_bytes ? (int64_t)o->chunk_bytes : param_comm_chunk_bytes();
  int64_t st = o->staging_bytes ? (int64_t)o->staging_bytes : param_comm_staging_bytes();
  if (ch < 64) ch = 64;
  r->chunk = (size_t)ch;
  r->staging_bytes = comm_ring_size_staging(st); /* the size the plan counts */
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
    rc = ring_boot_connect(r, lfd);
    lfd = -1;
    if (rc < 0) goto fail;
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

const char *comm_ring_self_addr(const comm_t *c) { return ((const ring_t *)c)->addr_self; }

void comm_ring_run(const comm_t *c, comm_ring_opts_t *o) {
  const ring_t *r = (const ring_t *)c;
  o->job = r->job;
  o->attempt = r->attempt;
  o->secret = r->has_secret ? r->run_secret : NULL;
}

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

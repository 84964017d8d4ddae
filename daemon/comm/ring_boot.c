/* ring_boot: how a ring communicator connects (docs/RING.md, "Bootstrap"):
 * listen, connect to the next rank, accept the previous one, the hello both
 * ways, and the offer that chooses each link's transport: TCP, a copying
 * shared-memory link, or records (r->out, r->in, the shared-memory links,
 * and what the neighbours can map of each other's memory). Everything here
 * is bounded by the communicator's timeout and runs before the thread
 * starts. A rank that cannot connect, or a neighbour that is not the rank
 * the address list says, is an error naming both sides. A connection
 * accepted that is not the previous rank's is answered with a refusal (when
 * it is a ring's hello), logged and closed, and the wait for that rank goes
 * on, unless it claims to be that very rank, of another run proving the
 * same secret (rings run without one): then both sides fail at once. The
 * rank that dialled fails as soon as it reads a refusal, or the end of the
 * connection, from the rank it dialled. With a secret (docs/RING.md,
 * "Authentication"), a hello that does not prove it (another run's rank,
 * a replay into another group, a stranger) is refused and turned away: the
 * dialler fails at once, the acceptor goes on waiting. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon/comm/cma.h"
#include "daemon/comm/ring_impl.h"
#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/netaddr.h"
#include "daemon/common/param.h"

/* The first message on each connection, both ways: who sends, whom it
 * meant, and whose ring it is (the group and its size, the job and its
 * attempt). With RING_REFUSE_MAGIC, the answer of a rank that turns a hello
 * away: its own identity, and in `to` the rank it waits for. */
typedef struct {
  uint32_t magic, version;
  int32_t size, from, to;
  uint32_t attempt;
  char name[64];
  char job[COMM_RING_JOB_MAX]; /* zero-padded; all of it may be the id */
  uint8_t nonce[16];           /* fresh for every hello (none in a refusal) */
  uint8_t mac[RING_MAC_BYTES]; /* HMAC-SHA-256 under the run's secret (ring_boot_hello) */
  char pad[8];
} ring_boot_hello_t;

/* The dialler's last word of the handshake: the mac, under the run's secret,
 * of its hello and the acceptor's answer, so a hello recorded and replayed,
 * which cannot make it for the answer's fresh nonce, is turned away. */
typedef struct {
  uint32_t magic, pad;
  uint8_t mac[RING_MAC_BYTES];
} ring_boot_proof_t;

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
} ring_boot_offer_t;

_Static_assert(sizeof(ring_boot_hello_t) == 272, "hello is 272 bytes");
_Static_assert(sizeof(ring_boot_proof_t) == 40, "proof is 40 bytes");
_Static_assert(sizeof(ring_boot_offer_t) == 112, "offer is 112 bytes");

static int ring_boot_parse_addr(const char *addr, char *host, size_t hn, char *port, size_t pn) {
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

static int ring_boot_resolve(const char *addr, struct addrinfo **res, int passive) {
  char host[RING_ADDR], port[16];
  if (ring_boot_parse_addr(addr, host, sizeof host, port, sizeof port) < 0)
    return err_set(FSDP_EINVAL, "address \"%s\" is not host:port", addr);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = passive ? AI_PASSIVE : 0};
  int g = getaddrinfo(host, port, &hints, res);
  if (g) return err_set(FSDP_EINVAL, "address \"%s\": %s", addr, gai_strerror(g));
  return 0;
}

static void ring_boot_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Blocking exchange of a small struct with a bounded wait. */
static int ring_boot_io_all(int fd, void *p, size_t n, int sending, int64_t deadline) {
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

static int ring_boot_connect_next(ring_t *r, int64_t deadline) {
  struct addrinfo *res;
  int rc = ring_boot_resolve(r->addr_next, &res, 0);
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

static int ring_boot_listen(ring_t *r, int *lfd) {
  struct addrinfo *res;
  int rc = ring_boot_resolve(r->addr_self, &res, 1);
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
static int ring_boot_cma_accept(ring_t *r, const ring_boot_offer_t *theirs) {
  if (!theirs->cma || param_comm_cma() == 0) return 0;
  int e = comm_cma_probe((pid_t)theirs->pid, theirs->probe, theirs->token);
  if (e < 0)
    LOG_DEBUG("comm", "group '%s' rank %d: cannot read rank %d's memory (%s): copying link",
              r->base.name, r->base.rank, r->rank_prev, strerror(-e));
  return e == 0;
}

/* Consumer: whether the producer's registered segments can be mapped here
 * (its probe segment maps and holds its token); 1 and rx->peer, or 0. */
static int ring_boot_reg_accept(ring_t *r, const ring_boot_offer_t *theirs, comm_rec_rx_t *rx) {
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

/* The last bootstrap step, which picks r->out and r->in: each link becomes
 * shared memory when its producer could create one and its consumer could
 * map it (same host, same /dev/shm, FSDP_COMM_SHM not 0 on either side);
 * otherwise it stays TCP. A shared link carries records (rec.c) for the ops
 * whose buffers are registered when the consumer could map the producer's
 * probe segment (FSDP_COMM_REG not 0 on either side), and for every op when
 * it could read the producer's memory (process_vm_readv; FSDP_COMM_CMA=1 on
 * both sides). Every rank sends its offer before reading, and offers and
 * answers fit any socket buffer, so the step cannot deadlock. */
static int ring_boot_choose_links(ring_t *r, int64_t deadline) {
  const int me = r->base.rank;
  int want = param_comm_shm() != 0;
  ring_boot_offer_t mine = {.magic = RING_OFFER_MAGIC}, theirs, ans;
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
  int e = ring_boot_io_all(r->fd_next, &mine, sizeof mine, 1, deadline);
  if (e == 0) e = ring_boot_io_all(r->fd_prev, &theirs, sizeof theirs, 0, deadline);
  if (e == 0) {
    theirs.name[COMM_SHM_NAME - 1] = 0;
    ans = (ring_boot_offer_t){.magic = RING_OFFER_MAGIC};
    if (want && theirs.magic == RING_OFFER_MAGIC && theirs.name[0]) {
      if (comm_shm_attach(theirs.name, theirs.token, theirs.cap, &in) == 0) {
        ans.accepted = 1, ans.cma = (uint32_t)(cma_in = ring_boot_cma_accept(r, &theirs));
        ans.reg = (uint32_t)(reg_in = ring_boot_reg_accept(r, &theirs, &rx));
      } else
        LOG_DEBUG("comm", "group '%s' rank %d: shared memory from rank %d refused (%s): TCP",
                  r->base.name, me, r->rank_prev, err_msg());
    }
    e = ring_boot_io_all(r->fd_prev, &ans, sizeof ans, 1, deadline);
  }
  if (e == 0) e = ring_boot_io_all(r->fd_next, &ans, sizeof ans, 0, deadline);
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
  if (!(ans.magic == RING_OFFER_MAGIC && ans.accepted == 1)) {
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

/* How long an accepted connection has to send its hello before it is taken
 * for a stray (a port scanner, a health check, a stale rank) and closed: a
 * rank sends its hello as soon as its connect completes. Connections are
 * heard side by side, so a silent one delays nobody. */
#define RING_BOOT_HELLO_MS 1000
/* How long an answered connection has to send its proof: the dialler sends
 * it as soon as it reads the answer, which it watches for all along. */
#define RING_BOOT_PROOF_MS 5000
/* Connections heard at once while a rank waits for its previous one; a new
 * one takes the place of the one heard longest (so a flood of replayed
 * hellos, each answered and waiting for a proof, cannot shut the real rank
 * out). */
#define RING_BOOT_CANDS 16

/* What a rank told about a mismatch can do about it (both sides say it). */
#define RING_BOOT_MISWIRED                                                                 \
  "start every rank of one attempt with the same job, world size and address list "     \
  "(fsdp-launch and fsdpd do), and look for a rank of another job or attempt still "     \
  "running, or a launcher given another run's addresses"

/* Why a hello whose proof of the secret fails may come (both sides say it). */
#define RING_BOOT_NO_SECRET                                                                \
  "a rank started with another FSDP_RING_SECRET (of another attempt or job, or none), "  \
  "or not a rank at all"

/* One rank's bootstrap on its two connections: the hello it sent its next
 * rank (whose answer is bound to its nonce) and whether that answer came. */
typedef struct {
  ring_t *r;
  int64_t deadline;
  ring_boot_hello_t hi;
  int answered;
} ring_boot_t;

/* HMAC-SHA-256 under r's secret (all zero when it has none: the same code,
 * proving nothing) of label, a and b (b may be NULL); 0, or -1 when OpenSSL
 * fails (nothing is then taken as proved). */
static int ring_boot_mac(const ring_t *r, const char *label, const void *a, const void *b,
                         uint8_t out[RING_MAC_BYTES]) {
  uint8_t buf[32 + 2 * sizeof(ring_boot_hello_t)];
  size_t nl = strlen(label), n = nl;
  memcpy(buf, label, nl);
  memcpy(buf + n, a, sizeof(ring_boot_hello_t)), n += sizeof(ring_boot_hello_t);
  if (b) memcpy(buf + n, b, sizeof(ring_boot_hello_t)), n += sizeof(ring_boot_hello_t);
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), r->secret, (int)sizeof r->secret, buf, n, out, &len) ||
      len != RING_MAC_BYTES)
    return -1;
  return 0;
}

/* The mac of hello h (its own mac field taken as zero): of a hello, or,
 * with to (the hello it answers), of an answer. */
static int ring_boot_hello_mac(const ring_t *r, const ring_boot_hello_t *h,
                               const ring_boot_hello_t *to, uint8_t out[RING_MAC_BYTES]) {
  ring_boot_hello_t z = *h;
  memset(z.mac, 0, sizeof z.mac);
  return ring_boot_mac(r, to ? "fsdpd ring answer" : "fsdpd ring hello", &z, to, out);
}

/* Whether h carries the mac of r's secret (to: as above), in constant time. */
static int ring_boot_hello_proved(const ring_t *r, const ring_boot_hello_t *h,
                                  const ring_boot_hello_t *to) {
  uint8_t m[RING_MAC_BYTES];
  return ring_boot_hello_mac(r, h, to, m) == 0 && CRYPTO_memcmp(m, h->mac, sizeof m) == 0;
}

/* r's hello (magic RING_HELLO_MAGIC) or refusal (RING_REFUSE_MAGIC) to
 * rank `to`. A hello gets a fresh nonce and its mac (an answer's binds the
 * hello it answers, answering); a refusal has neither. */
static int ring_boot_hello(const ring_t *r, uint32_t magic, int to,
                           const ring_boot_hello_t *answering, ring_boot_hello_t *h) {
  *h = (ring_boot_hello_t){.magic = magic, .version = RING_VERSION, .size = r->base.size,
                           .from = r->base.rank, .to = to, .attempt = r->attempt};
  snprintf(h->name, sizeof h->name, "%s", r->base.name);
  memcpy(h->job, r->job, strnlen(r->job, sizeof h->job)); /* ring.c: at most that long */
  if (magic != RING_HELLO_MAGIC) return 0;
  if (getrandom(h->nonce, sizeof h->nonce, 0) != (ssize_t)sizeof h->nonce)
    return err_set_errno(FSDP_EIO, errno, "rank %d of group '%s': getrandom (the hello's nonce)",
                         r->base.rank, r->base.name);
  if (ring_boot_hello_mac(r, h, answering, h->mac))
    return err_set(FSDP_EINTERNAL, "rank %d of group '%s': HMAC-SHA-256 failed (OpenSSL)",
                   r->base.rank, r->base.name);
  return 0;
}

/* "rank 1 of group 'world' (size 3, job '7' attempt 2)": whom h says it is
 * from (its name terminated by the reader). */
static void ring_boot_who(char *buf, size_t n, const ring_boot_hello_t *h) {
  int jl = (int)strnlen(h->job, sizeof h->job);
  char job[COMM_RING_JOB_MAX + 32] = "";
  if (jl) snprintf(job, sizeof job, ", job '%.*s' attempt %u", jl, h->job, h->attempt);
  else if (h->attempt) snprintf(job, sizeof job, ", attempt %u", h->attempt);
  snprintf(buf, n, "rank %d of group '%s' (size %d%s)", (int)h->from, h->name, (int)h->size, job);
}

/* Whether h's job id is r's (both may be none). */
static int ring_boot_same_job(const ring_t *r, const ring_boot_hello_t *h) {
  size_t jl = strnlen(h->job, sizeof h->job);
  return jl == strlen(r->job) && !memcmp(h->job, r->job, jl);
}

/* Appends "; " and a difference to buf (n bytes, a string). */
__attribute__((format(printf, 3, 4))) static void ring_boot_differs(char *buf, size_t n,
                                                                     const char *fmt, ...) {
  size_t k = strlen(buf);
  if (k && k + 2 < n) memcpy(buf + k, "; ", 3), k += 2;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + k, n - k, fmt, ap);
  va_end(ap);
}

/* Whether h is of r's run (job, attempt, group and size): 1, or 0 with what
 * differs in buf ("job '7' there, '8' here; size 2 there, 3 here"). */
static int ring_boot_same_run(const ring_t *r, const ring_boot_hello_t *h, char *buf, size_t n) {
  buf[0] = 0;
  if (!ring_boot_same_job(r, h))
    ring_boot_differs(buf, n, "job '%.*s' there, '%s' here", (int)strnlen(h->job, sizeof h->job),
                      h->job, r->job);
  if (h->attempt != r->attempt)
    ring_boot_differs(buf, n, "attempt %u there, %u here", h->attempt, r->attempt);
  if (h->size != r->base.size)
    ring_boot_differs(buf, n, "size %d there, %d here", (int)h->size, r->base.size);
  if (strcmp(h->name, r->base.name))
    ring_boot_differs(buf, n, "group '%s' there, '%s' here", h->name, r->base.name);
  return buf[0] == 0;
}

/* A connection accepted while waiting for the previous rank, heard side by
 * side with the others: its hello, then (answered) its proof. */
typedef struct {
  int fd;
  char peer[80];
  int64_t since; /* accepted then */
  int64_t until; /* its hello by then (RING_BOOT_HELLO_MS); answered: its proof (RING_BOOT_PROOF_MS) */
  int answered;
  size_t got; /* bytes of the message being read */
  ring_boot_hello_t hello, answer;
  ring_boot_proof_t proof;
} ring_boot_cand_t;

/* Judges c's whole hello: 0 (the previous rank by its account: answered, its
 * proof is next), 1 (turned away, why in why[n]) or a code with a message
 * (the previous rank, by its own account, of another run: fail). A ring's
 * hello that is not the previous rank's, or that does not prove the run's
 * secret, is answered with this rank's refusal, so its sender fails at once. */
static int ring_boot_judge(ring_boot_t *b, ring_boot_cand_t *c, char *why, size_t n) {
  ring_t *r = b->r;
  const int me = r->base.rank;
  ring_boot_hello_t *ph = &c->hello, no;
  const int proved = ring_boot_hello_proved(r, ph, NULL); /* on the bytes as they came */
  ph->name[sizeof ph->name - 1] = 0;
  char diff[400], who[300];
  int same = ring_boot_same_run(r, ph, diff, sizeof diff);
  if (proved && same && ph->from == r->rank_prev && ph->to == me) {
    int rc = ring_boot_hello(r, RING_HELLO_MAGIC, r->rank_prev, ph, &c->answer);
    if (rc < 0) return rc;
    int e = ring_boot_io_all(c->fd, &c->answer, sizeof c->answer, 1, b->deadline);
    if (e < 0) {
      snprintf(why, n, "a connection from %s ended before its answer (%s)", c->peer, strerror(-e));
      return 1;
    }
    c->answered = 1, c->got = 0;
    c->until = ring_now_ns() + (int64_t)RING_BOOT_PROOF_MS * 1000000;
    if (c->until > b->deadline) c->until = b->deadline;
    return 0;
  }
  /* refused: tell it (best effort: it may be gone), then judge */
  (void)ring_boot_hello(r, RING_REFUSE_MAGIC, r->rank_prev, NULL, &no);
  (void)ring_boot_io_all(c->fd, &no, sizeof no, 1, c->until);
  ring_boot_who(who, sizeof who, ph);
  if (!proved) {
    snprintf(why, n, "%s connected from %s without proving this run's secret (%s); turned away",
             who, c->peer, RING_BOOT_NO_SECRET);
    return 1;
  }
  if (!same && ph->from == r->rank_prev && ph->to == me) {
    /* It claims to be the rank this one waits for. Of an earlier attempt of
     * the same job it is a stale rank connecting late: turned away, the
     * real one may still come. Of any other run, the ranks were mis-wired. */
    if (!(ring_boot_same_job(r, ph) && ph->attempt < r->attempt)) {
      char mine[300];
      ring_boot_who(mine, sizeof mine, &b->hi);
      return err_set(FSDP_EPEER,
                     "%s at %s: the rank it waits for (rank %d, %s) connected from %s as %s, of "
                     "another run (%s): %s",
                     mine, r->addr_self, r->rank_prev, r->addr_prev, c->peer, who, diff,
                     RING_BOOT_MISWIRED);
    }
    snprintf(why, n, "%s connected from %s: a rank of an earlier attempt (%s), turned away", who,
             c->peer, diff);
    return 1;
  }
  snprintf(why, n,
           "%s dialling rank %d connected from %s where rank %d (%s) was expected%s%s: the "
           "address lists handed to the ranks disagree; turned away",
           who, (int)ph->to, c->peer, r->rank_prev, r->addr_prev, same ? "" : ", of another run: ",
           same ? "" : diff);
  return 1;
}

/* Reads what c has sent: 0 (more to come), 1 (turned away, why in why[n]),
 * 2 (the previous rank, proved) or a code with a message (fail). */
static int ring_boot_cand_read(ring_boot_t *b, ring_boot_cand_t *c, char *why, size_t n) {
  for (;;) {
    uint8_t *buf = c->answered ? (uint8_t *)&c->proof : (uint8_t *)&c->hello;
    /* the hello's magic and version first: a stray's garbage, or another
     * version's hello of another size, is known without waiting for more */
    size_t want = c->answered ? sizeof c->proof : c->got < 8 ? 8 : sizeof c->hello;
    ssize_t k = recv(c->fd, buf + c->got, want - c->got, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (k <= 0) {
      snprintf(why, n, "a connection from %s ended before its %s (%s)", c->peer,
               c->answered ? "proof" : "hello", k == 0 ? "closed" : strerror(errno));
      return 1;
    }
    if ((c->got += (size_t)k) < want) continue;
    if (c->answered) {
      uint8_t m[RING_MAC_BYTES];
      if (c->proof.magic == RING_PROOF_MAGIC &&
          ring_boot_mac(b->r, "fsdpd ring proof", &c->hello, &c->answer, m) == 0 &&
          CRYPTO_memcmp(m, c->proof.mac, sizeof m) == 0)
        return 2;
      snprintf(why, n,
               "a connection from %s sent the hello of rank %d but not its proof of this run's "
               "secret (a hello recorded and replayed?); turned away",
               c->peer, b->r->rank_prev);
      return 1;
    }
    if (want == 8) {
      if (c->hello.magic == RING_HELLO_MAGIC && c->hello.version == RING_VERSION) continue;
      snprintf(why, n,
               "a connection from %s is not an fsdpd ring of this version (magic %08x version %u)",
               c->peer, c->hello.magic, c->hello.version);
      return 1;
    }
    return ring_boot_judge(b, c, why, n);
  }
}

/* Reads the next rank's answer to this rank's hello on r->fd_next: its hello,
 * proved (then this rank's proof goes back, and b->answered), or a refusal,
 * or the end of the connection (a code with a message naming both sides:
 * nothing the bootstrap can wait out). */
static int ring_boot_answer(ring_boot_t *b) {
  ring_t *r = b->r;
  const int me = r->base.rank;
  ring_boot_hello_t nh;
  char mine[300], who[300], diff[400];
  ring_boot_who(mine, sizeof mine, &b->hi);
  int e = ring_boot_io_all(r->fd_next, &nh, sizeof nh, 0, b->deadline);
  if (e == -ECONNRESET || e == -EPIPE)
    return err_set(FSDP_EPEER,
                   "%s at %s: rank %d at %s closed the connection without answering its hello: "
                   "that rank failed (see its log: a mis-wired rank names what differs there), "
                   "or what listens there is not a rank of this run",
                   mine, r->addr_self, r->rank_next, r->addr_next);
  if (e < 0)
    return err_set(e == -ETIMEDOUT ? FSDP_ETIMEDOUT : FSDP_EPEER,
                   "rank %d of group '%s': handshake with rank %d at %s: %s (was the rank started "
                   "with the same address list? did it fail? see its log)",
                   me, r->base.name, r->rank_next, r->addr_next, strerror(-e));
  const int proved = nh.magic == RING_HELLO_MAGIC && ring_boot_hello_proved(r, &nh, &b->hi);
  nh.name[sizeof nh.name - 1] = 0;
  ring_boot_who(who, sizeof who, &nh);
  int same = nh.version == RING_VERSION && ring_boot_same_run(r, &nh, diff, sizeof diff);
  if (nh.magic == RING_REFUSE_MAGIC && nh.version == RING_VERSION) {
    if (ring_boot_same_job(r, &nh) && nh.attempt > r->attempt)
      return err_set(FSDP_EPEER,
                     "%s at %s dialled rank %d at %s and was turned away by %s: a later attempt "
                     "of this job holds that address, so this rank's attempt is over; it is to "
                     "be stopped, not restarted",
                     mine, r->addr_self, r->rank_next, r->addr_next, who);
    if (!same)
      return err_set(FSDP_EPEER,
                     "%s at %s dialled rank %d at %s and was turned away by %s, of another run "
                     "(%s): %s",
                     mine, r->addr_self, r->rank_next, r->addr_next, who, diff,
                     RING_BOOT_MISWIRED);
    if (nh.to == me)
      return err_set(FSDP_EPEER,
                     "%s at %s dialled rank %d at %s and was turned away by %s, which waits for "
                     "this very rank but could not check its proof of the run's secret: the "
                     "ranks were given different FSDP_RING_SECRETs (fsdp-launch and fsdpd give "
                     "every rank of an attempt the same one)",
                     mine, r->addr_self, r->rank_next, r->addr_next, who);
    return err_set(FSDP_EPEER,
                   "%s at %s dialled rank %d at %s and was turned away by %s, which waits for "
                   "rank %d: the address lists handed to the ranks disagree; %s",
                   mine, r->addr_self, r->rank_next, r->addr_next, who, (int)nh.to,
                   RING_BOOT_MISWIRED);
  }
  if (nh.magic != RING_HELLO_MAGIC || nh.version != RING_VERSION || !same ||
      nh.from != r->rank_next || nh.to != me)
    return err_set(FSDP_EPEER,
                   "%s dialled rank %d at %s but %s answered%s%s (magic %08x version %u): the "
                   "address lists handed to the ranks disagree",
                   mine, r->rank_next, r->addr_next, who, same ? "" : ": ", same ? "" : diff,
                   nh.magic, nh.version);
  if (!proved)
    return err_set(FSDP_EPEER,
                   "%s dialled rank %d at %s and %s answered without proving this run's secret: "
                   "%s",
                   mine, r->rank_next, r->addr_next, who, RING_BOOT_NO_SECRET);
  ring_boot_proof_t pf = {.magic = RING_PROOF_MAGIC};
  if (ring_boot_mac(r, "fsdpd ring proof", &b->hi, &nh, pf.mac))
    return err_set(FSDP_EINTERNAL, "rank %d of group '%s': HMAC-SHA-256 failed (OpenSSL)", me,
                   r->base.name);
  e = ring_boot_io_all(r->fd_next, &pf, sizeof pf, 1, b->deadline);
  if (e < 0)
    return err_set(e == -ETIMEDOUT ? FSDP_ETIMEDOUT : FSDP_EPEER,
                   "rank %d of group '%s': sending the proof to rank %d at %s: %s (did it fail? "
                   "see its log)",
                   me, r->base.name, r->rank_next, r->addr_next, strerror(-e));
  b->answered = 1;
  return 0;
}

/* Drops candidate i of *n (closing it unless keep). */
static void ring_boot_cand_drop(ring_boot_cand_t *c, int *n, int i, int keep) {
  if (!keep) close(c[i].fd);
  c[i] = c[--*n];
}

/* Accepts the previous rank into r->fd_prev. Connections are heard side by
 * side (up to RING_BOOT_CANDS): one whose hello is not that rank's (garbage,
 * another group, nothing within RING_BOOT_HELLO_MS), or that does not prove
 * the run's secret, is logged once and closed, and the wait goes on until
 * the deadline; a timeout then names the last one turned away. Meanwhile the
 * next rank's answer is read as soon as it comes (b->answered): a refusal or
 * a closed connection fails the bootstrap at once. */
static int ring_boot_accept_prev(ring_boot_t *b, int lfd) {
  ring_t *r = b->r;
  const int me = r->base.rank;
  char why[1280] = "";
  int strays = 0, nc = 0, rc = 0;
  ring_boot_cand_t c[RING_BOOT_CANDS];
  for (;;) {
    struct pollfd pf[2 + RING_BOOT_CANDS] = {
        {.fd = lfd, .events = POLLIN},
        {.fd = b->answered ? -1 : r->fd_next, .events = POLLIN}};
    int64_t wake = b->deadline;
    for (int i = 0; i < nc; i++) {
      pf[2 + i] = (struct pollfd){.fd = c[i].fd, .events = POLLIN};
      if (c[i].until < wake) wake = c[i].until;
    }
    if (ring_ms_left(b->deadline) == 0) {
      char more[1400] = "";
      if (strays)
        snprintf(more, sizeof more, " (%d connection%s turned away, the last: %s)", strays,
                 strays == 1 ? "" : "s", why);
      rc = err_set(FSDP_ETIMEDOUT,
                   "rank %d of group '%s' (%s): rank %d (%s) did not connect within %lld ms: is "
                   "it running, with the same address list and secret?%s",
                   me, r->base.name, r->addr_self, r->rank_prev, r->addr_prev,
                   (long long)r->timeout_ms, more);
      break;
    }
    int k = poll(pf, (nfds_t)(2 + nc), ring_ms_left(wake));
    if (k < 0 && errno != EINTR) {
      rc = err_set_errno(FSDP_EIO, errno, "rank %d of group '%s': poll", me, r->base.name);
      break;
    }
    if (k <= 0) memset(pf, 0, sizeof pf);
    if (pf[1].revents && (rc = ring_boot_answer(b)) < 0) break;
    /* candidates last to first: dropping one moves the last into its place */
    const int64_t now = ring_now_ns();
    int took = -1;
    for (int i = nc - 1; i >= 0 && took < 0 && rc >= 0; i--) {
      int v = 0;
      if (pf[2 + i].revents) v = ring_boot_cand_read(b, &c[i], why, sizeof why);
      else if (c[i].until <= now) {
        if (c[i].answered)
          snprintf(why, sizeof why,
                   "a connection from %s sent the hello of rank %d but not its proof of this "
                   "run's secret within %d ms (a hello recorded and replayed?); turned away",
                   c[i].peer, r->rank_prev, RING_BOOT_PROOF_MS);
        else
          snprintf(why, sizeof why, "a connection from %s sent no hello within %d ms",
                   c[i].peer, RING_BOOT_HELLO_MS);
        v = 1;
      }
      if (v < 0) rc = v;
      else if (v == 2) took = i;
      else if (v == 1) {
        ring_boot_cand_drop(c, &nc, i, 0);
        strays++;
        LOG_WARN("comm", "rank %d of group '%s' (%s): %s; closed it, still waiting for rank %d (%s)",
                 me, r->base.name, r->addr_self, why, r->rank_prev, r->addr_prev);
      }
    }
    if (rc < 0) break;
    if (took >= 0) {
      r->fd_prev = c[took].fd;
      ring_boot_cand_drop(c, &nc, took, 1);
      break;
    }
    if (!pf[0].revents) continue;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      /* Linux hands a connection's pending network error to accept: retried
       * (accept(2)), as are a reset before it was taken and no connection */
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED || errno == EPROTO ||
          errno == ENETDOWN || errno == ENOPROTOOPT || errno == EHOSTDOWN || errno == ENONET ||
          errno == EHOSTUNREACH || errno == EOPNOTSUPP || errno == ENETUNREACH)
        continue;
      rc = err_set_errno(FSDP_EIO, errno, "rank %d of group '%s': accept on %s", me,
                         r->base.name, r->addr_self);
      break;
    }
    ring_boot_tune(fd);
    if (nc == RING_BOOT_CANDS) { /* the one heard longest makes room */
      int old = 0;
      for (int i = 1; i < nc; i++)
        if (c[i].since < c[old].since) old = i;
      snprintf(why, sizeof why, "a connection from %s, heard the longest of %d at once, made room "
               "for a new one%s", c[old].peer, RING_BOOT_CANDS,
               c[old].answered ? " (it had not sent its proof of this run's secret)" : "");
      ring_boot_cand_drop(c, &nc, old, 0);
      strays++;
      LOG_WARN("comm", "rank %d of group '%s' (%s): %s; closed it, still waiting for rank %d (%s)",
               me, r->base.name, r->addr_self, why, r->rank_prev, r->addr_prev);
    }
    c[nc] = (ring_boot_cand_t){.since = ring_now_ns(), .fd = fd, .until = ring_now_ns() + (int64_t)RING_BOOT_HELLO_MS * 1000000};
    if (c[nc].until > b->deadline) c[nc].until = b->deadline;
    netaddr_format((const struct sockaddr *)&ss, c[nc].peer, sizeof c[nc].peer);
    nc++;
  }
  while (nc > 0) ring_boot_cand_drop(c, &nc, nc - 1, 0);
  return rc < 0 ? rc : 0;
}

static int ring_boot_handshake(ring_t *r, int lfd) {
  const int me = r->base.rank;
  ring_boot_t b = {.r = r, .deadline = ring_now_ns() + r->timeout_ms * 1000000};
  if (listen(lfd, 64) < 0)
    return err_set_errno(FSDP_EINVAL, errno, "rank %d of group '%s': listen on %s", me,
                         r->base.name, r->addr_self);
  int rc = ring_boot_hello(r, RING_HELLO_MAGIC, r->rank_next, NULL, &b.hi);
  if (!rc) rc = ring_boot_connect_next(r, b.deadline);
  if (rc < 0) return rc;
  int e = ring_boot_io_all(r->fd_next, &b.hi, sizeof b.hi, 1, b.deadline);
  if (e < 0)
    return err_set(e == -ETIMEDOUT ? FSDP_ETIMEDOUT : FSDP_EPEER,
                   "rank %d of group '%s': sending the hello to rank %d at %s: %s (did it fail? "
                   "see its log)",
                   me, r->base.name, r->rank_next, r->addr_next, strerror(-e));
  if ((rc = ring_boot_accept_prev(&b, lfd)) < 0) return rc;
  if (!b.answered && (rc = ring_boot_answer(&b)) < 0) return rc;
  return ring_boot_choose_links(r, b.deadline);
}

int ring_boot_connect(ring_t *r, int lfd) {
  int rc = 0;
  if (lfd < 0 && (rc = ring_boot_listen(r, &lfd)) < 0) return rc;
  rc = ring_boot_handshake(r, lfd);
  close(lfd);
  if (rc < 0) return rc;
  ring_boot_tune(r->fd_next);
  return 0;
}

/* shm: the shared-memory byte stream behind the ring's same-host links (see
 * shm.h for the contract).
 *
 * Layout of the object: a 192-byte header (identity; the producer's position
 * `head` with its futex word and sleep flag; the consumer's `tail` with
 * theirs, each on its own cache line so the two sides do not share lines),
 * then cap bytes of data. Positions count bytes since creation (never wrap
 * in practice: 2^64); data of position x lives at x % cap.
 *
 * Sleeping is the classic futex handshake: the side that ran dry reads the
 * other side's bell, raises its sleep flag, checks the position again and
 * only then waits for the bell to change; the other side publishes its new
 * position, then rings (bell += 1, FUTEX_WAKE) when it sees the flag. Both
 * orders are sequentially consistent, so a wake is never lost. The futexes
 * are shared (not FUTEX_PRIVATE): the words live in a MAP_SHARED mapping. A
 * thread waiting on both directions uses futex_waitv (Linux 5.16); without
 * it, it waits on the receive side in 1 ms slices.
 *
 * Each side counts its mapping (header and data) in MEM_COMM while it holds
 * it, so the training run's memory report sees the links. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "daemon/comm/shm.h"
#include "daemon/common/err.h"
#include "daemon/common/mem.h"
#include "daemon/common/shm_name.h"
#include "kernels/kern.h"

#define SHM_MAGIC 0x4d535346u /* "FSSM" */
#define SHM_VERSION 2u
#define SHM_SPINS 2000 /* ~ tens of microseconds of polling before a futex sleep */

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared positions need lock-free atomics");

typedef struct {
  uint32_t magic, version;
  uint64_t token, cap;
  uint8_t pad0[40];
  _Alignas(64) _Atomic uint64_t head; /* producer's position */
  _Atomic uint32_t head_bell;         /* rung by the producer */
  _Atomic uint32_t head_sleep;        /* the consumer sleeps on head_bell */
  _Atomic uint32_t abandoned;         /* the producer gave the stream up */
  _Alignas(64) _Atomic uint64_t tail; /* consumer's position */
  _Atomic uint32_t tail_bell;         /* rung by the consumer */
  _Atomic uint32_t tail_sleep;        /* the producer sleeps on tail_bell */
  _Alignas(64) uint8_t data[];
} shm_hdr_t;

_Static_assert(sizeof(shm_hdr_t) == COMM_SHM_HDR_BYTES, "shm header is 192 bytes");

struct comm_shm_link {
  shm_hdr_t *h;
  size_t map_bytes;
  uint64_t cap, grain; /* grain: bytes copied per published position */
  uint64_t pos;        /* this side's own position (head or tail) */
  int producer;
};

static long shm_futex(_Atomic uint32_t *w, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)w, op, val, ts, NULL, FUTEX_BITSET_MATCH_ANY);
}

static void shm_ring(_Atomic uint32_t *bell) {
  atomic_fetch_add(bell, 1);
  shm_futex(bell, FUTEX_WAKE, INT_MAX, NULL);
}

static int shm_map(int fd, uint64_t cap, comm_shm_link_t **out, int producer) {
  size_t bytes = COMM_SHM_MAP_BYTES((size_t)cap);
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return err_set_errno(FSDP_EIO, errno, "shm: mmap of %zu bytes", bytes);
  comm_shm_link_t *l = calloc(1, sizeof *l);
  if (!l) {
    munmap(p, bytes);
    return err_set(FSDP_ENOMEM, "shm: no memory");
  }
  l->h = p;
  l->map_bytes = bytes;
  l->cap = cap;
  l->grain = cap / 8;
  l->producer = producer;
  mem_account(MEM_COMM, bytes, 1);
  *out = l;
  return 0;
}

int comm_shm_create(size_t cap, comm_shm_link_t **out, char name[COMM_SHM_NAME], uint64_t *token) {
  *out = NULL;
  uint64_t c = comm_ring_size_link(cap);
  static atomic_uint serial;
  uint64_t tok = 0;
  if (getrandom(&tok, sizeof tok, GRND_NONBLOCK) != (ssize_t)sizeof tok)
    tok = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32;
  tok |= 1; /* never 0 */
  snprintf(name, COMM_SHM_NAME, "/" SHM_NAME_RING_PREFIX "%d-%u-%08x", (int)getpid(),
           atomic_fetch_add(&serial, 1), (unsigned)(tok >> 32));
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return err_set_errno(FSDP_EIO, errno, "shm: cannot create %s", name);
  int rc = 0;
  if (ftruncate(fd, (off_t)(sizeof(shm_hdr_t) + c)) < 0) {
    rc = err_set_errno(FSDP_EIO, errno, "shm: cannot size %s to %llu bytes", name,
                       (unsigned long long)c);
    goto out;
  }
  if ((rc = shm_map(fd, c, out, 1)) < 0) goto out;
  shm_hdr_t *h = (*out)->h;
  h->token = tok;
  h->cap = c;
  h->version = SHM_VERSION;
  atomic_store(&h->head, 0);
  atomic_store(&h->tail, 0);
  atomic_thread_fence(memory_order_seq_cst);
  h->magic = SHM_MAGIC;
  *token = tok;
out:
  close(fd);
  if (rc < 0) shm_unlink(name);
  return rc;
}

int comm_shm_attach(const char *name, uint64_t token, uint64_t cap, comm_shm_link_t **out) {
  *out = NULL;
  if (name[0] != '/' || memchr(name, 0, COMM_SHM_NAME) == NULL || strchr(name + 1, '/') ||
      cap < 65536 || cap > ((uint64_t)1 << 30) || (cap & (cap - 1)))
    return err_set(FSDP_EINVAL, "shm: a malformed offer");
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return err_set_errno(FSDP_EIO, errno, "shm: cannot open %s", name);
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != sizeof(shm_hdr_t) + cap) {
    rc = err_set(FSDP_EINVAL, "shm: %s has not the offered size", name);
    goto out;
  }
  if ((rc = shm_map(fd, cap, out, 0)) < 0) goto out;
  shm_hdr_t *h = (*out)->h;
  if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || h->token != token || h->cap != cap) {
    comm_shm_close(*out);
    *out = NULL;
    rc = err_set(FSDP_EINVAL, "shm: %s is not the offered link (another host's name?)", name);
  }
out:
  close(fd);
  shm_unlink(name);
  return rc;
}

void comm_shm_unlink(const char *name) {
  if (name && name[0]) shm_unlink(name);
}

void comm_shm_close(comm_shm_link_t *l) {
  if (!l) return;
  munmap(l->h, l->map_bytes);
  mem_account(MEM_COMM, l->map_bytes, 0);
  free(l);
}

uint64_t comm_shm_cap(const comm_shm_link_t *l) { return l->cap; }

size_t comm_shm_write(comm_shm_link_t *l, const void *p, size_t n) {
  shm_hdr_t *h = l->h;
  uint64_t head = l->pos, room = l->cap - (head - atomic_load_explicit(&h->tail, memory_order_acquire));
  size_t done = 0;
  while (done < n && room) {
    uint64_t off = head & (l->cap - 1), k = n - done;
    if (k > room) k = room;
    if (k > l->grain) k = l->grain;
    if (k > l->cap - off) k = l->cap - off;
    memcpy(h->data + off, (const uint8_t *)p + done, (size_t)k);
    head += k, done += (size_t)k, room -= k;
    atomic_store(&h->head, head); /* seq_cst: pairs with the consumer's sleep flag */
    if (atomic_load(&h->head_sleep)) shm_ring(&h->head_bell);
    if (!room) room = l->cap - (head - atomic_load_explicit(&h->tail, memory_order_acquire));
  }
  l->pos = head;
  return done;
}

static size_t shm_peek(const comm_shm_link_t *l, void *p, size_t n,
                       void (*copy)(void *, const void *, size_t)) {
  const shm_hdr_t *h = l->h;
  uint64_t tail = l->pos, avail = atomic_load_explicit(&h->head, memory_order_acquire) - tail;
  if (n > avail) n = (size_t)avail;
  uint64_t off = tail & (l->cap - 1), k = n < l->cap - off ? n : l->cap - off;
  copy(p, h->data + off, (size_t)k);
  copy((uint8_t *)p + k, h->data, n - (size_t)k);
  return n;
}

static void shm_memcpy(void *d, const void *s, size_t n) { memcpy(d, s, n); }

size_t comm_shm_peek(const comm_shm_link_t *l, void *p, size_t n) {
  return shm_peek(l, p, n, shm_memcpy);
}

size_t comm_shm_view(const comm_shm_link_t *l, const void **p) {
  uint64_t avail = atomic_load_explicit(&l->h->head, memory_order_acquire) - l->pos;
  uint64_t off = l->pos & (l->cap - 1);
  *p = l->h->data + off;
  return (size_t)(avail < l->cap - off ? avail : l->cap - off);
}

void comm_shm_consume(comm_shm_link_t *l, size_t n) {
  shm_hdr_t *h = l->h;
  uint64_t avail = atomic_load_explicit(&h->head, memory_order_acquire) - l->pos;
  l->pos += n < avail ? n : avail;
  atomic_store(&h->tail, l->pos); /* seq_cst: pairs with the producer's sleep flag */
  if (atomic_load(&h->tail_sleep)) shm_ring(&h->tail_bell);
}

size_t comm_shm_read(comm_shm_link_t *l, void *p, size_t n, int stream) {
  size_t done = 0;
  while (done < n) { /* a grain at a time, so the producer refills while this copies */
    size_t k = shm_peek(l, (uint8_t *)p + done, n - done < l->grain ? n - done : l->grain,
                        stream ? kern_cpu()->copy_stream : shm_memcpy);
    if (!k) break;
    comm_shm_consume(l, k);
    done += k;
  }
  return done;
}

int comm_shm_readable(const comm_shm_link_t *l) {
  return atomic_load_explicit(&l->h->head, memory_order_acquire) != l->pos;
}

uint64_t comm_shm_room(const comm_shm_link_t *l) {
  return l->cap - (l->pos - atomic_load_explicit(&l->h->tail, memory_order_acquire));
}

uint64_t comm_shm_tell(const comm_shm_link_t *l) { return l->pos; }

int comm_shm_reached(const comm_shm_link_t *l, uint64_t pos) {
  return (int64_t)(atomic_load_explicit(&l->h->tail, memory_order_acquire) - pos) >= 0;
}

void comm_shm_abandon(comm_shm_link_t *l) {
  if (!l) return;
  atomic_store(&l->h->abandoned, 1);
  comm_shm_kick(l);
}

int comm_shm_abandoned(const comm_shm_link_t *l) { return atomic_load(&l->h->abandoned) != 0; }

static int shm_ready(comm_shm_link_t *in, comm_shm_link_t *out, uint64_t out_pos) {
  return (in && comm_shm_readable(in)) || (out && comm_shm_reached(out, out_pos));
}

static inline void shm_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

int comm_shm_wait(comm_shm_link_t *in, comm_shm_link_t *out, uint64_t out_pos, int64_t until_ns) {
  for (int i = 0; i < SHM_SPINS; i++) {
    if (shm_ready(in, out, out_pos)) return 1;
    shm_relax();
  }
  /* raise the flags, then look again: a position published after this look
   * sees the flag and rings */
  uint32_t bin = 0, bout = 0;
  if (in) bin = atomic_load(&in->h->head_bell), atomic_store(&in->h->head_sleep, 1);
  if (out) bout = atomic_load(&out->h->tail_bell), atomic_store(&out->h->tail_sleep, 1);
  int ready = shm_ready(in, out, out_pos);
  if (!ready) {
    struct timespec ts = {(time_t)(until_ns / 1000000000), (long)(until_ns % 1000000000)};
    long rc = -1;
    errno = ENOSYS;
#ifdef SYS_futex_waitv
    if (in && out) {
      struct futex_waitv w[2] = {
          {.val = bin, .uaddr = (uintptr_t)&in->h->head_bell, .flags = FUTEX_32},
          {.val = bout, .uaddr = (uintptr_t)&out->h->tail_bell, .flags = FUTEX_32}};
      rc = syscall(SYS_futex_waitv, w, 2, 0, &ts, CLOCK_MONOTONIC);
    }
#endif
    if (rc < 0 && errno == ENOSYS) {
      if (in && out) { /* no futex_waitv: watch the send side every millisecond */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t soon = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec + 1000000;
        if (soon < until_ns) ts = (struct timespec){(time_t)(soon / 1000000000), (long)(soon % 1000000000)};
      }
      if (in) shm_futex(&in->h->head_bell, FUTEX_WAIT_BITSET, bin, &ts);
      else shm_futex(&out->h->tail_bell, FUTEX_WAIT_BITSET, bout, &ts);
    }
    ready = shm_ready(in, out, out_pos);
  }
  if (in) atomic_store(&in->h->head_sleep, 0);
  if (out) atomic_store(&out->h->tail_sleep, 0);
  return ready;
}

void comm_shm_kick(comm_shm_link_t *l) {
  if (!l) return;
  shm_ring(&l->h->head_bell);
  shm_ring(&l->h->tail_bell);
}

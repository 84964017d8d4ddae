/* reg: registered memory (see reg.h for the contract).
 *
 * Each buffer is a memfd ("fsdp-reg-<id>") of whole pages, mapped shared and
 * kept in a process-wide table with its descriptor. A peer maps it by opening
 * /proc/<owner pid>/fd/<fd> (the kernel allows that to processes that may
 * ptrace-read the owner: the same user, as the shared-memory links need
 * anyway) and checks, on the descriptor it got, that it is the memfd of that
 * id: a descriptor number reused for something else is refused, not read.
 *
 * The segments are MADV_DONTFORK and a forked child forgets the table (it
 * must not hand its parent's pages out as its own buffers): test harnesses
 * and launchers fork ranks. */
#include "daemon/comm/reg.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"

#define REG_MAX 512     /* segments per process, live and kept */
#define REG_PEER_MAX 64 /* a peer's segments mapped here, at most */

typedef struct {
  uint8_t *base;
  size_t bytes; /* mapped */
  size_t want;  /* requested: what is accounted while used */
  int fd;
  int used;
  mem_cat_t cat;
  uint64_t id, freed; /* freed: when it was freed (a tick), for eviction */
} reg_seg_t;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static reg_seg_t reg_tab[REG_MAX];
static int reg_n;
static uint64_t reg_ids, reg_tick;
/* mapped bytes of the used and of the kept segments, and the most ever used:
 * the kept ones are released (longest-kept first) before they would pass
 * that peak, so keeping at most doubles the peak; in a training step, whose
 * buffers come and go in the same sizes every step, the kept set settles on
 * each size's most at once and nothing is created again */
static size_t reg_used, reg_kept, reg_peak;
static int reg_off; /* memfd_create failed here: plain memory from now on */
static reg_seg_t reg_probe_seg;
static uint64_t reg_probe_token;

static size_t reg_page(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (size_t)p : 4096;
}

static void reg_release(reg_seg_t *s) {
  munmap(s->base, s->bytes);
  close(s->fd);
}

/* Releases the longest-kept segment; 0 when none is kept. Under reg_mu. */
static int reg_release_oldest(void) {
  int old = -1;
  for (int i = 0; i < reg_n; i++)
    if (!reg_tab[i].used && (old < 0 || reg_tab[i].freed < reg_tab[old].freed)) old = i;
  if (old < 0) return 0;
  reg_kept -= reg_tab[old].bytes;
  reg_release(&reg_tab[old]);
  reg_tab[old] = reg_tab[--reg_n];
  return 1;
}

/* In a forked child: the parent's segments are not the child's (and,
 * MADV_DONTFORK, not even mapped). */
static void reg_atfork_child(void) {
  for (int i = 0; i < reg_n; i++) close(reg_tab[i].fd);
  if (reg_probe_seg.base) close(reg_probe_seg.fd);
  memset(reg_tab, 0, sizeof reg_tab);
  memset(&reg_probe_seg, 0, sizeof reg_probe_seg);
  reg_n = 0;
  reg_used = reg_kept = reg_peak = 0;
  pthread_mutex_init(&reg_mu, NULL);
}

static void reg_init_once(void) { pthread_atfork(NULL, NULL, reg_atfork_child); }
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

/* A new segment of bytes (whole pages), not in the table; 0 or a code. */
static int reg_create(size_t bytes, reg_seg_t *s) {
  char name[40];
  uint64_t id = ++reg_ids;
  snprintf(name, sizeof name, "fsdp-reg-%016llx", (unsigned long long)id);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) {
    reg_off = 1; /* a sandbox without memfds: plain memory from now on */
    return err_set_errno(FSDP_EIO, errno, "memfd_create");
  }
  if (ftruncate(fd, (off_t)bytes) < 0) {
    int e = errno;
    close(fd);
    return err_set_errno(FSDP_ENOMEM, e, "ftruncate of a %zu-byte memfd", bytes);
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return err_set_errno(FSDP_ENOMEM, e, "mmap of a %zu-byte memfd", bytes);
  }
  (void)madvise(p, bytes, MADV_DONTFORK);
  *s = (reg_seg_t){.base = p, .bytes = bytes, .fd = fd, .id = id};
  return 0;
}


void *comm_reg_alloc(mem_cat_t cat, size_t bytes, const char *what) {
  pthread_once(&reg_once, reg_init_once);
  if (!bytes || param_comm_reg() == 0) return mem_alloc(cat, bytes, what);
  const size_t pg = reg_page();
  if (bytes > SIZE_MAX - pg) return mem_alloc(cat, bytes, what);
  const size_t whole = (bytes + pg - 1) / pg * pg;
  pthread_mutex_lock(&reg_mu);
  if (reg_off) {
    pthread_mutex_unlock(&reg_mu);
    return mem_alloc(cat, bytes, what);
  }
  reg_seg_t *s = NULL;
  for (int i = 0; i < reg_n && !s; i++)
    if (!reg_tab[i].used && reg_tab[i].bytes == whole) s = &reg_tab[i];
  if (s) {
    reg_kept -= whole;
  } else {
    while (reg_n == REG_MAX && reg_release_oldest()) {
    }
    reg_seg_t fresh;
    if (reg_create(whole, &fresh) < 0) {
      /* no memfds here, or no memory: the plain allocator decides */
      LOG_DEBUG("comm", "registered memory unavailable (%s): this buffer is not registered",
                err_msg());
      pthread_mutex_unlock(&reg_mu);
      return mem_alloc(cat, bytes, what);
    }
    if (reg_n == REG_MAX) { /* every entry in use */
      pthread_mutex_unlock(&reg_mu);
      reg_release(&fresh);
      return mem_alloc(cat, bytes, what);
    }
    s = &reg_tab[reg_n++];
    *s = fresh;
  }
  reg_used += whole;
  if (reg_used > reg_peak) reg_peak = reg_used;
  s->used = 1;
  s->cat = cat;
  s->want = bytes;
  void *p = s->base;
  pthread_mutex_unlock(&reg_mu);
  mem_account(cat, bytes, 1);
  return p;
}

void *comm_reg_calloc(mem_cat_t cat, size_t bytes, const char *what) {
  void *p = comm_reg_alloc(cat, bytes, what);
  if (p) memset(p, 0, bytes);
  return p;
}

void comm_reg_free(void *p) {
  if (!p) return;
  pthread_mutex_lock(&reg_mu);
  reg_seg_t *s = NULL;
  for (int i = 0; i < reg_n && !s; i++)
    if (reg_tab[i].used && reg_tab[i].base == p) s = &reg_tab[i];
  if (!s) {
    pthread_mutex_unlock(&reg_mu);
    mem_free(p);
    return;
  }
  s->used = 0;
  s->freed = ++reg_tick;
  reg_used -= s->bytes;
  reg_kept += s->bytes;
  while (reg_kept > reg_peak && reg_release_oldest()) {
  }
  mem_cat_t cat = s->cat;
  size_t want = s->want;
  pthread_mutex_unlock(&reg_mu);
  mem_account(cat, want, 0);
}

void comm_reg_trim(void) {
  pthread_mutex_lock(&reg_mu);
  while (reg_release_oldest()) {
  }
  reg_peak = reg_used;
  pthread_mutex_unlock(&reg_mu);
}

size_t comm_reg_mapped(void) {
  pthread_mutex_lock(&reg_mu);
  size_t n = reg_used + reg_kept;
  pthread_mutex_unlock(&reg_mu);
  return n;
}

int comm_reg_find(const void *p, size_t n, comm_reg_seg_t *out) {
  const uint8_t *q = p;
  int found = 0;
  pthread_mutex_lock(&reg_mu);
  for (int i = 0; i < reg_n && !found; i++) {
    const reg_seg_t *s = &reg_tab[i];
    if (s->used && q >= s->base && q < s->base + s->bytes && n <= (size_t)(s->base + s->bytes - q)) {
      *out = (comm_reg_seg_t){.id = s->id, .fd = s->fd, .base = s->base, .bytes = s->bytes};
      found = 1;
    }
  }
  pthread_mutex_unlock(&reg_mu);
  return found;
}

int comm_reg_probe(comm_reg_seg_t *out, uint64_t *token) {
  pthread_once(&reg_once, reg_init_once);
  if (param_comm_reg() == 0) return err_set(FSDP_EINVAL, "FSDP_COMM_REG=0");
  pthread_mutex_lock(&reg_mu);
  int rc = 0;
  if (!reg_probe_seg.base && (rc = reg_create(reg_page(), &reg_probe_seg)) == 0) {
    while (!reg_probe_token)
      if (getrandom(&reg_probe_token, sizeof reg_probe_token, 0) != sizeof reg_probe_token)
        reg_probe_token = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)reg_ids;
    memcpy(reg_probe_seg.base, &reg_probe_token, sizeof reg_probe_token);
  }
  if (rc == 0) {
    *out = (comm_reg_seg_t){.id = reg_probe_seg.id, .fd = reg_probe_seg.fd,
                            .base = reg_probe_seg.base, .bytes = reg_probe_seg.bytes};
    *token = reg_probe_token;
  }
  pthread_mutex_unlock(&reg_mu);
  return rc;
}

/* ---- a peer's segments ---- */

typedef struct {
  uint64_t id;
  int fd;
  const uint8_t *map;
  size_t bytes;
} reg_map_t;

struct comm_reg_peer {
  pid_t pid;
  int n, next_evict;
  reg_map_t m[REG_PEER_MAX];
};

comm_reg_peer_t *comm_reg_peer_open(pid_t pid) {
  comm_reg_peer_t *pp = calloc(1, sizeof *pp);
  if (pp) pp->pid = pid;
  return pp;
}

static void reg_unmap(reg_map_t *m) { munmap((void *)m->map, m->bytes); }

/* Maps the peer's descriptor fd after checking it is the memfd of segment id. */
static int reg_map_new(const comm_reg_peer_t *pp, uint64_t id, int fd, reg_map_t *m) {
  char path[64], link[128], want[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pp->pid, fd);
  int mfd = open(path, O_RDONLY | O_CLOEXEC);
  if (mfd < 0) return err_set_errno(FSDP_EPEER, errno, "opening %s", path);
  /* what was opened, not what the number meant a moment earlier */
  snprintf(path, sizeof path, "/proc/self/fd/%d", mfd);
  ssize_t k = readlink(path, link, sizeof link - 1);
  link[k > 0 ? k : 0] = 0;
  snprintf(want, sizeof want, "/memfd:fsdp-reg-%016llx", (unsigned long long)id);
  struct stat st;
  if (strncmp(link, want, strlen(want)) != 0 || fstat(mfd, &st) < 0 || st.st_size <= 0) {
    close(mfd);
    return err_set(FSDP_EPEER, "descriptor %d of process %d is \"%s\", not registered segment "
                   "%016llx: the segment was freed while named",
                   fd, (int)pp->pid, link, (unsigned long long)id);
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, mfd, 0);
  int e = errno;
  close(mfd);
  if (p == MAP_FAILED) return err_set_errno(FSDP_ENOMEM, e, "mapping a peer's segment");
  *m = (reg_map_t){.id = id, .fd = fd, .map = p, .bytes = (size_t)st.st_size};
  return 0;
}

const uint8_t *comm_reg_peer_map(comm_reg_peer_t *pp, uint64_t id, int fd, uint64_t end) {
  for (int i = 0; i < pp->n; i++)
    if (pp->m[i].id == id) {
      if (end > pp->m[i].bytes) break;
      return pp->m[i].map;
    }
  /* a descriptor number in use again names a new segment: the old one's
   * owner closed it, so it was freed */
  for (int i = 0; i < pp->n;)
    if (pp->m[i].fd == fd || pp->m[i].id == id) {
      reg_unmap(&pp->m[i]);
      pp->m[i] = pp->m[--pp->n];
    } else {
      i++;
    }
  reg_map_t m;
  if (reg_map_new(pp, id, fd, &m) < 0) return NULL;
  if (end > m.bytes) {
    reg_unmap(&m);
    err_set(FSDP_EPEER, "registered segment %016llx of process %d has %zu bytes, %llu named",
            (unsigned long long)id, (int)pp->pid, m.bytes, (unsigned long long)end);
    return NULL;
  }
  if (pp->n == REG_PEER_MAX) { /* round robin: the cache only saves mmaps */
    int v = pp->next_evict++ % REG_PEER_MAX;
    reg_unmap(&pp->m[v]);
    pp->m[v] = m;
  } else {
    pp->m[pp->n++] = m;
  }
  return m.map;
}

void comm_reg_peer_close(comm_reg_peer_t *pp) {
  if (!pp) return;
  for (int i = 0; i < pp->n; i++) reg_unmap(&pp->m[i]);
  free(pp);
}

/* mem: the accounting allocator (see mem.h). Each block carries a 64-byte
 * header with its size and category, so mem_free needs nothing but the pointer
 * and the counters can never drift from what is really held. */
#include "daemon/common/mem.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "kernels/kern.h"

#define MEM_ALIGN 64
#define MEM_MAGIC 0x6d656d66u /* "fmem" */

typedef struct mem_hdr {
  size_t bytes;
  uint32_t cat;
  uint32_t magic;
} mem_hdr_t;

static atomic_size_t mem_cur[MEM__COUNT], mem_pk[MEM__COUNT];
static atomic_size_t mem_cur_total, mem_pk_total;
/* peaks since the last mem_step_begin, for the per-step report */
static atomic_size_t mem_pk_step[MEM__COUNT], mem_pk_step_total;

static const char *const mem_names[] = {
#define XX(e, s) s,
    MEM_CATEGORY_LIST(XX)
#undef XX
};

const char *mem_cat_name(mem_cat_t cat) {
  return (unsigned)cat < MEM__COUNT ? mem_names[cat] : "?";
}

static void mem_peak_update(atomic_size_t *peak, size_t now) {
  size_t p = atomic_load(peak);
  while (now > p && !atomic_compare_exchange_weak(peak, &p, now)) {
  }
}

/* The sharded runtime frees and reallocates unit-sized buffers (gathered
 * parameters, unsharded gradients) every step. glibc serves blocks over its
 * mmap threshold (at most 32 MiB) with fresh mappings, so each reuse would
 * fault in and zero every page again (measured: 200-300k faults per gpt2-124m
 * step). Serving them from the heap, and not trimming it, lets freed blocks be
 * reused warm; the accounting above is unchanged (it counts live blocks). */
static pthread_once_t mem_once = PTHREAD_ONCE_INIT;
static void mem_tune_malloc(void) {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

static void mem_count(mem_cat_t cat, size_t bytes) {
  size_t now = atomic_fetch_add(&mem_cur[cat], bytes) + bytes;
  mem_peak_update(&mem_pk[cat], now);
  mem_peak_update(&mem_pk_step[cat], now);
  now = atomic_fetch_add(&mem_cur_total, bytes) + bytes;
  mem_peak_update(&mem_pk_total, now);
  mem_peak_update(&mem_pk_step_total, now);
}

static void mem_uncount(mem_cat_t cat, size_t bytes) {
  atomic_fetch_sub(&mem_cur[cat], bytes);
  atomic_fetch_sub(&mem_cur_total, bytes);
}

void mem_account(mem_cat_t cat, size_t bytes, int held) {
  FSDP_ASSERT((unsigned)cat < MEM__COUNT);
  if (held) mem_count(cat, bytes);
  else mem_uncount(cat, bytes);
}

void *mem_alloc(mem_cat_t cat, size_t bytes, const char *what) {
  FSDP_ASSERT((unsigned)cat < MEM__COUNT);
  pthread_once(&mem_once, mem_tune_malloc);
  void *raw = NULL;
  if (bytes > SIZE_MAX - MEM_ALIGN || posix_memalign(&raw, MEM_ALIGN, bytes + MEM_ALIGN) != 0) {
    err_set(FSDP_ENOMEM, "cannot allocate %.1f MiB for %s (%s): out of host memory; "
            "use a smaller batch or sequence length, or a smaller model",
            bytes / 1048576.0, what, mem_cat_name(cat));
    return NULL;
  }
  mem_hdr_t *h = raw;
  h->bytes = bytes;
  h->cat = cat;
  h->magic = MEM_MAGIC;
  mem_count(cat, bytes);
  return (char *)raw + MEM_ALIGN;
}

void *mem_calloc(mem_cat_t cat, size_t bytes, const char *what) {
  void *p = mem_alloc(cat, bytes, what);
  if (p) memset(p, 0, bytes);
  return p;
}

void mem_free(void *p) {
  if (!p) return;
  mem_hdr_t *h = (mem_hdr_t *)((char *)p - MEM_ALIGN);
  FSDP_ASSERT(h->magic == MEM_MAGIC);
  h->magic = 0;
  mem_uncount((mem_cat_t)h->cat, h->bytes);
  free(h);
}

/* ---- device memory ------------------------------------------------------
 * A device block cannot carry a header the host writes, so its size and
 * category live here, in a list searched by address: a rank holds tens of
 * device blocks, not millions. */
typedef struct {
  void *p;
  size_t bytes;
  mem_cat_t cat;
  int step; /* from dev_alloc_step */
} mem_dev_block_t;

static pthread_mutex_t mem_dev_mu = PTHREAD_MUTEX_INITIALIZER;
static mem_dev_block_t *mem_dev_blocks;
static size_t mem_dev_n, mem_dev_cap;

/* The backend's allocation and free for a buffer of this kind. */
static void *mem_dev_get(const kern_backend_t *be, size_t bytes, int step) {
  return step && be->dev_alloc_step ? be->dev_alloc_step(bytes) : be->dev_alloc(bytes);
}
static void mem_dev_put(const kern_backend_t *be, void *p, int step) {
  if (step && be->dev_free_step) be->dev_free_step(p);
  else be->dev_free(p);
}

static void *mem_dev_take(const kern_backend_t *be, mem_cat_t cat, size_t bytes, const char *what,
                          int step) {
  FSDP_ASSERT((unsigned)cat < MEM__COUNT);
  if (be->host_memory) return mem_alloc(cat, bytes, what);
  void *p = mem_dev_get(be, bytes ? bytes : 1, step);
  pthread_mutex_lock(&mem_dev_mu);
  if (p && mem_dev_n == mem_dev_cap) {
    size_t cap = mem_dev_cap ? 2 * mem_dev_cap : 64;
    mem_dev_block_t *nb = realloc(mem_dev_blocks, cap * sizeof *nb);
    if (nb) mem_dev_blocks = nb, mem_dev_cap = cap;
  }
  int kept = p && mem_dev_n < mem_dev_cap;
  if (kept) mem_dev_blocks[mem_dev_n++] = (mem_dev_block_t){p, bytes, cat, step};
  pthread_mutex_unlock(&mem_dev_mu);
  if (!kept) {
    if (p) mem_dev_put(be, p, step);
    err_set(FSDP_ENOMEM, "cannot allocate %.1f MiB of %s memory for %s (%s): the device is "
            "full; use a smaller batch or sequence length, shard more, or turn on activation "
            "checkpointing", bytes / 1048576.0, be->name, what, mem_cat_name(cat));
    return NULL;
  }
  mem_count(cat, bytes);
  return p;
}

void *mem_dev_alloc(const kern_backend_t *be, mem_cat_t cat, size_t bytes, const char *what) {
  return mem_dev_take(be, cat, bytes, what, 0);
}

void *mem_dev_alloc_step(const kern_backend_t *be, mem_cat_t cat, size_t bytes,
                         const char *what) {
  return mem_dev_take(be, cat, bytes, what, 1);
}

void *mem_dev_calloc(const kern_backend_t *be, mem_cat_t cat, size_t bytes, const char *what) {
  void *p = mem_dev_alloc(be, cat, bytes, what);
  if (p) be->dev_set(p, 0, bytes);
  return p;
}

void mem_dev_free(const kern_backend_t *be, void *p) {
  if (!p) return;
  if (be->host_memory) {
    mem_free(p);
    return;
  }
  mem_dev_block_t b = {NULL, 0, MEM_PARAMS, 0};
  pthread_mutex_lock(&mem_dev_mu);
  for (size_t i = 0; i < mem_dev_n; i++)
    if (mem_dev_blocks[i].p == p) {
      b = mem_dev_blocks[i];
      mem_dev_blocks[i] = mem_dev_blocks[--mem_dev_n];
      break;
    }
  pthread_mutex_unlock(&mem_dev_mu);
  FSDP_ASSERT(b.p == p); /* freeing what mem_dev_alloc never gave is a programmer error */
  mem_uncount(b.cat, b.bytes);
  mem_dev_put(be, p, b.step);
}

size_t mem_current(mem_cat_t cat) { return atomic_load(&mem_cur[cat]); }
size_t mem_peak(mem_cat_t cat) { return atomic_load(&mem_pk[cat]); }
size_t mem_total_current(void) { return atomic_load(&mem_cur_total); }
size_t mem_total_peak(void) { return atomic_load(&mem_pk_total); }

/* Peaks pk (per category) and pk_total restart from what is held now. */
static void mem_restart(atomic_size_t *pk, atomic_size_t *pk_total) {
  for (int c = 0; c < MEM__COUNT; c++) atomic_store(&pk[c], atomic_load(&mem_cur[c]));
  atomic_store(pk_total, atomic_load(&mem_cur_total));
}

void mem_step_begin(void) { mem_restart(mem_pk_step, &mem_pk_step_total); }

void mem_run_begin(void) {
  mem_restart(mem_pk, &mem_pk_total);
  mem_step_begin();
}

void mem_snapshot(mem_snapshot_t *s, int step) {
  const atomic_size_t *pk = step ? mem_pk_step : mem_pk;
  for (int c = 0; c < MEM__COUNT; c++) {
    s->cur[c] = atomic_load(&mem_cur[c]);
    s->peak[c] = atomic_load(&pk[c]);
  }
  s->total_cur = mem_total_current();
  s->total_peak = atomic_load(step ? &mem_pk_step_total : &mem_pk_total);
}

void mem_snapshot_print(FILE *out, const char *prefix, const mem_snapshot_t *s) {
  fprintf(out, "%s", prefix ? prefix : "mem:");
  for (int c = 0; c < MEM__COUNT; c++)
    if (s->peak[c]) fprintf(out, " %s=%.1f/%.1f", mem_names[c], s->cur[c] / 1048576.0,
                            s->peak[c] / 1048576.0);
  fprintf(out, " total=%.1f/%.1f MiB (current/peak)\n", s->total_cur / 1048576.0,
          s->total_peak / 1048576.0);
}

/* The value of a "Key: N kB" line of /proc/self/status, in bytes. */
static size_t mem_proc_status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0, klen = strlen(key);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, klen) && line[klen] == ':') {
      sscanf(line + klen + 1, "%zu", &kb);
      break;
    }
  fclose(f);
  return kb * 1024;
}

size_t mem_process_peak_rss(void) { return mem_proc_status_kb("VmHWM"); }
size_t mem_process_anon_rss(void) { return mem_proc_status_kb("RssAnon"); }

/* mem: the accounting allocator (see mem.h). Each block carries a 64-byte
 * header with its size and category, so mem_free needs nothing but the pointer
 * and the counters can never drift from what is really held. */
#include "mem.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"

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

static void mem_print(FILE *out, const char *prefix, const atomic_size_t *pk, const atomic_size_t *pk_total) {
  fprintf(out, "%s", prefix ? prefix : "mem:");
  for (int c = 0; c < MEM__COUNT; c++)
    if (atomic_load(&mem_pk[c])) fprintf(out, " %s=%.1f/%.1f", mem_names[c],
                                         mem_current(c) / 1048576.0, atomic_load(&pk[c]) / 1048576.0);
  fprintf(out, " total=%.1f/%.1f MiB (current/peak)\n", mem_total_current() / 1048576.0,
          atomic_load(pk_total) / 1048576.0);
}

void mem_report(FILE *out, const char *prefix) { mem_print(out, prefix, mem_pk, &mem_pk_total); }

void mem_report_step(FILE *out, const char *prefix) {
  mem_print(out, prefix, mem_pk_step, &mem_pk_step_total);
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

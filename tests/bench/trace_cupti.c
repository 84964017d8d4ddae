/* trace_cupti: CUPTI's activity API through dlopen (trace_cupti.h).
 *
 * CUPTI hands records over in buffers it asks us for (buf_requested) and
 * gives back full (buf_completed, possibly on a thread of its own): each
 * record is copied out at once into the growing arrays below, its name
 * interned, and the buffer freed. The record layouts are those of the
 * headers this is built with; gpu-pack.sh carries the libcupti of the same
 * toolkit, whose records have them. */
#include "tests/bench/trace_cupti.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if __has_include(<cupti.h>)
#include <cupti.h>

#define TRACE_BUF_BYTES (8u << 20)

static struct {
  void *lib;
  CUptiResult (*register_cbs)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*enable)(CUpti_ActivityKind);
  CUptiResult (*disable)(CUpti_ActivityKind);
  CUptiResult (*flush_all)(uint32_t);
  CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
  CUptiResult (*timestamp)(uint64_t *);
  CUptiResult (*callback_name)(CUpti_CallbackDomain, uint32_t, const char **);
  CUptiResult (*result_string)(CUptiResult, const char **);

  pthread_mutex_t mu;
  trace_gpu_t *gpu;
  size_t ngpu, gpu_cap;
  trace_api_t *api;
  size_t napi, api_cap;
  const char **names; /* interned copies */
  const void **keys;  /* the pointer each name came from (CUPTI shares them) */
  size_t nnames, names_cap;
  uint64_t t0;
  int oom;
  CUptiResult bad; /* a buffer's records ended early */
} tc = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const CUpti_ActivityKind trace_kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};

/* Grows *arr (of *cap elements of size es) to hold n + 1; 0 or -1. */
static int grow(void **arr, size_t *cap, size_t n, size_t es) {
  if (n < *cap) return 0;
  const size_t c = *cap ? *cap * 2 : 4096;
  void *p = realloc(*arr, c * es);
  if (!p) return -1;
  *arr = p, *cap = c;
  return 0;
}

/* The index of name (first seen at key), interned; -1 when out of memory.
 * A runtime or driver call's name (api) loses its version suffix (_v7000). */
static int intern(const void *key, const char *name, int api) {
  for (size_t i = 0; i < tc.nnames; i++)
    if (tc.keys[i] == key) return (int)i;
  size_t len = strlen(name);
  const char *v = api ? strrchr(name, '_') : NULL;
  if (v && v[1] == 'v' && v[2] && strspn(v + 2, "0123456789") == strlen(v + 2)) len = (size_t)(v - name);
  for (size_t i = 0; i < tc.nnames; i++)
    if (strlen(tc.names[i]) == len && !strncmp(tc.names[i], name, len)) return (int)i;
  if (grow((void **)&tc.names, &tc.names_cap, tc.nnames, sizeof *tc.names)) return -1;
  const void **k = realloc(tc.keys, tc.names_cap * sizeof *k);
  char *copy = strndup(name, len);
  if (!k || !copy) {
    if (k) tc.keys = k;
    free(copy);
    return -1;
  }
  tc.keys = k;
  tc.keys[tc.nnames] = key;
  tc.names[tc.nnames] = copy;
  return (int)tc.nnames++;
}

static void add_gpu(uint64_t start, uint64_t end, uint32_t corr, uint32_t stream, const void *key,
                    const char *name) {
  const int n = intern(key, name, 0);
  if (n < 0 || grow((void **)&tc.gpu, &tc.gpu_cap, tc.ngpu, sizeof *tc.gpu)) {
    tc.oom = 1;
    return;
  }
  tc.gpu[tc.ngpu++] = (trace_gpu_t){start, end, corr, stream, n};
}

static void add_api(const CUpti_ActivityAPI *a, CUpti_CallbackDomain dom) {
  const char *name = NULL;
  if (tc.callback_name(dom, a->cbid, &name) != CUPTI_SUCCESS || !name)
    name = dom == CUPTI_CB_DOMAIN_RUNTIME_API ? "cuda runtime call" : "cuda driver call";
  const int n = intern(name, name, 1);
  if (n < 0 || grow((void **)&tc.api, &tc.api_cap, tc.napi, sizeof *tc.api)) {
    tc.oom = 1;
    return;
  }
  tc.api[tc.napi++] = (trace_api_t){a->start, a->end, a->correlationId, a->threadId, n};
}

static const char *memcpy_name(uint8_t kind) {
  switch (kind) {
  case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
  case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
  case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
  default: return "memcpy other";
  }
}

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *buf = aligned_alloc(8, TRACE_BUF_BYTES);
  *size = *buf ? TRACE_BUF_BYTES : 0;
  *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                   size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity *r = NULL;
  CUptiResult rc = CUPTI_SUCCESS;
  pthread_mutex_lock(&tc.mu);
  while (buf && (rc = tc.next_record(buf, valid, &r)) == CUPTI_SUCCESS) {
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
      add_gpu(k->start, k->end, k->correlationId, k->streamId, k->name,
              k->name ? k->name : "kernel");
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
      const char *name = memcpy_name(m->copyKind);
      add_gpu(m->start, m->end, m->correlationId, m->streamId, name, name);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
      add_gpu(m->start, m->end, m->correlationId, m->streamId, "memset", "memset");
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
      add_api((const CUpti_ActivityAPI *)r, CUPTI_CB_DOMAIN_RUNTIME_API);
      break;
    case CUPTI_ACTIVITY_KIND_DRIVER:
      add_api((const CUpti_ActivityAPI *)r, CUPTI_CB_DOMAIN_DRIVER_API);
      break;
    default: break;
    }
  }
  /* the end of the buffer, or a record CUPTI had not finished (a flush
   * before the GPU was done): the rest is lost, and the summary would be
   * short without saying so */
  if (buf && rc != CUPTI_ERROR_MAX_LIMIT_REACHED) tc.bad = rc;
  pthread_mutex_unlock(&tc.mu);
  free(buf);
}

/* msg = what failed, with CUPTI's words for rc; -1. */
static int fail(char *msg, size_t cap, const char *what, CUptiResult rc) {
  const char *s = NULL;
  if (tc.result_string) tc.result_string(rc, &s);
  snprintf(msg, cap, "%s: %s", what, s ? s : "failed");
  return -1;
}

static int load(char *msg, size_t cap) {
  if (tc.lib) return 0;
  void *lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(msg, cap, "cannot open libcupti.so.13 (CUDA's CUPTI; put its folder on "
             "LD_LIBRARY_PATH): %s", dlerror());
    return -1;
  }
  struct { void **fn; const char *sym; } syms[] = {
      {(void **)&tc.register_cbs, "cuptiActivityRegisterCallbacks"},
      {(void **)&tc.enable, "cuptiActivityEnable"},
      {(void **)&tc.disable, "cuptiActivityDisable"},
      {(void **)&tc.flush_all, "cuptiActivityFlushAll"},
      {(void **)&tc.next_record, "cuptiActivityGetNextRecord"},
      {(void **)&tc.timestamp, "cuptiGetTimestamp"},
      {(void **)&tc.callback_name, "cuptiGetCallbackName"},
      {(void **)&tc.result_string, "cuptiGetResultString"}};
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if (!(*syms[i].fn = dlsym(lib, syms[i].sym))) {
      snprintf(msg, cap, "libcupti has no %s: another CUPTI than CUDA 13's", syms[i].sym);
      dlclose(lib);
      return -1;
    }
  tc.lib = lib;
  return 0;
}

int trace_cupti_start(char *msg, size_t cap) {
  if (load(msg, cap)) return -1;
  CUptiResult rc = tc.register_cbs(buf_requested, buf_completed);
  if (rc != CUPTI_SUCCESS) return fail(msg, cap, "cuptiActivityRegisterCallbacks", rc);
  for (size_t i = 0; i < sizeof trace_kinds / sizeof trace_kinds[0]; i++)
    if ((rc = tc.enable(trace_kinds[i])) != CUPTI_SUCCESS) {
      for (size_t j = 0; j < i; j++) tc.disable(trace_kinds[j]);
      return fail(msg, cap, "cuptiActivityEnable", rc);
    }
  tc.timestamp(&tc.t0);
  return 0;
}

int trace_cupti_stop(trace_t *t, char *msg, size_t cap) {
  memset(t, 0, sizeof *t);
  uint64_t t1 = 0;
  tc.timestamp(&t1);
  for (size_t i = 0; i < sizeof trace_kinds / sizeof trace_kinds[0]; i++)
    tc.disable(trace_kinds[i]);
  const CUptiResult rc = tc.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  pthread_mutex_lock(&tc.mu);
  *t = (trace_t){.gpu = tc.gpu, .ngpu = tc.ngpu, .api = tc.api, .napi = tc.napi,
                 .names = tc.names, .nnames = tc.nnames, .t0 = tc.t0, .t1 = t1};
  const int oom = tc.oom;
  const CUptiResult bad = tc.bad;
  tc.gpu = NULL, tc.api = NULL, tc.names = NULL;
  free(tc.keys), tc.keys = NULL;
  tc.ngpu = tc.gpu_cap = tc.napi = tc.api_cap = tc.nnames = tc.names_cap = 0;
  tc.oom = 0, tc.bad = CUPTI_SUCCESS;
  pthread_mutex_unlock(&tc.mu);
  if (rc != CUPTI_SUCCESS || bad != CUPTI_SUCCESS) {
    trace_cupti_free(t);
    return fail(msg, cap, rc != CUPTI_SUCCESS ? "cuptiActivityFlushAll" : "a buffer's records",
                rc != CUPTI_SUCCESS ? rc : bad);
  }
  if (oom) {
    trace_cupti_free(t);
    snprintf(msg, cap, "out of memory keeping the trace's records");
    return -1;
  }
  return 0;
}

#else /* built without CUDA's headers */

int trace_cupti_start(char *msg, size_t cap) {
  snprintf(msg, cap, "built without CUDA's headers (cupti.h): no tracing");
  return -1;
}

int trace_cupti_stop(trace_t *t, char *msg, size_t cap) {
  memset(t, 0, sizeof *t);
  snprintf(msg, cap, "built without CUDA's headers (cupti.h): no tracing");
  return -1;
}

#endif

void trace_cupti_free(trace_t *t) {
  free(t->gpu);
  free(t->api);
  for (size_t i = 0; i < t->nnames; i++) free((void *)t->names[i]);
  free((void *)t->names);
  memset(t, 0, sizeof *t);
}

/* inventory: the node's devices from fsdpd's --devices spec (see inventory.h).
 *
 * GPUs come from the CUDA driver API through dlopen: the driver library is
 * what every CUDA machine has (the toolkit need not be installed), and a
 * machine without it still runs fsdpd with CPU devices. A CPU device's memory
 * is the host's physical memory split N ways: a capacity, like a GPU's
 * memory, that the scheduler compares with a job's memory plan. A GPU's is
 * what is free with a CUDA context on it (inventory_cuda_free), not its
 * total: a context takes hundreds of MiB, and a plan admitted against the
 * total could not open on the GPU (train.c bounds each rank by the same
 * measure, taken again as it starts). */
#include "inventory.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/hostmem.h"

/* The few driver entry points used, by their C ABI (cuda.h is not needed). */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_get_fn)(int *, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_mem_fn)(size_t *, int);
typedef int (*cu_retain_fn)(void **, int);
typedef int (*cu_release_fn)(int);
typedef int (*cu_push_fn)(void *);
typedef int (*cu_pop_fn)(void **);
typedef int (*cu_info_fn)(size_t *, size_t *);

/* GPU dev's free memory with a CUDA context of this process on it, into
 * *bytes: what a rank may plan to take there, its own context costing about
 * what this one does (and other processes' memory held). The device's
 * primary context is retained for this alone and released; the CUDA error
 * where it cannot be had (a GPU in exclusive-process mode another process
 * holds, an older driver). */
static int inventory_cuda_free(void *lib, int dev, size_t *bytes) {
  cu_retain_fn retain = (cu_retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
  cu_release_fn release = (cu_release_fn)dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
  cu_push_fn push = (cu_push_fn)dlsym(lib, "cuCtxPushCurrent_v2");
  cu_pop_fn pop = (cu_pop_fn)dlsym(lib, "cuCtxPopCurrent_v2");
  cu_info_fn info = (cu_info_fn)dlsym(lib, "cuMemGetInfo_v2");
  if (!retain || !release || !push || !pop || !info) return INVENTORY_CU_NOT_FOUND;
  void *ctx = NULL;
  int e = retain(&ctx, dev);
  if (e) return e;
  size_t total = 0;
  if (!(e = push(ctx))) {
    e = info(bytes, &total);
    void *was = NULL;
    pop(&was);
  }
  release(dev);
  return e;
}

/* The host's memory (its control group's limit where lower: a container's)
 * divided n ways; 0 where it cannot be read. */
static uint64_t inventory_host_share(int n) { return n > 0 ? hostmem_total() / (uint64_t)n : 0; }

static int inventory_cpu(int n, inventory_t *out) {
  const uint64_t each = inventory_host_share(n);
  if (!each) return err_set_errno(FSDP_EIO, errno, "devices: cannot read this host's memory size");
  for (int i = 0; i < n; i++) {
    inventory_device_t *d = &out->dev[out->count++];
    snprintf(d->kind, sizeof d->kind, "cpu");
    d->index = i;
    snprintf(d->name, sizeof d->name, "CPU device %d of %d", i, n);
    d->memory = d->total = each;
  }
  return FSDP_OK;
}

/* Every GPU the driver sees, or those whose ordinals are in want (nwant > 0). */
static int inventory_cuda(const int *want, int nwant, inventory_t *out) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return err_set(FSDP_EUNSUPPORTED, "devices: cuda: no NVIDIA driver on this node (%s); "
                   "install the driver, or use --devices cpu:N", dlerror());
  cu_init_fn init = (cu_init_fn)dlsym(lib, "cuInit");
  cu_count_fn count = (cu_count_fn)dlsym(lib, "cuDeviceGetCount");
  cu_get_fn get = (cu_get_fn)dlsym(lib, "cuDeviceGet");
  cu_name_fn name = (cu_name_fn)dlsym(lib, "cuDeviceGetName");
  cu_mem_fn mem = (cu_mem_fn)dlsym(lib, "cuDeviceTotalMem_v2");
  int rc = FSDP_OK, n = 0, e;
  if (!init || !count || !get || !name || !mem) {
    rc = err_set(FSDP_EUNSUPPORTED, "devices: cuda: libcuda.so.1 lacks the driver API "
                 "(cuInit, cuDeviceGetCount, ...); reinstall the NVIDIA driver");
    goto out;
  }
  if ((e = init(0)) || (e = count(&n)) || n == 0) {
    rc = err_set(FSDP_EUNSUPPORTED, "devices: cuda: the driver finds no usable GPU (CUDA error "
                 "%d); check nvidia-smi, or use --devices cpu:N", n == 0 && !e ? 100 : e);
    goto out;
  }
  for (int k = 0; k < (nwant ? nwant : n) && rc == FSDP_OK; k++) {
    int ord = nwant ? want[k] : k, dev;
    size_t bytes = 0;
    if (ord >= n) {
      rc = err_set(FSDP_ERANGE, "devices: cuda:%d: this node has %d GPUs (ordinals 0-%d)", ord,
                   n, n - 1);
      break;
    }
    inventory_device_t *d = &out->dev[out->count];
    if ((e = get(&dev, ord)) || (e = name(d->name, (int)sizeof d->name, dev)) ||
        (e = mem(&bytes, dev))) {
      rc = err_set(FSDP_EIO, "devices: cuda:%d: the driver cannot describe it (CUDA error %d)",
                   ord, e);
      break;
    }
    snprintf(d->kind, sizeof d->kind, "cuda");
    d->index = ord;
    d->memory = d->total = bytes;
    d->free_error = INVENTORY_NOT_MEASURED;
    out->count++;
  }
out:
  dlclose(lib);
  return rc;
}

/* Whether d, measured, shows more held than a context takes. */
static int inventory_held(const inventory_device_t *d) {
  return !strcmp(d->kind, "cuda") && !d->free_error && d->total - d->memory > INVENTORY_HELD_MAX;
}

/* The driver for measuring, opened once and kept loaded: its threads may
 * outlive the contexts (never closed). */
static void *inventory_lib;
static void inventory_lib_open(void) { inventory_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); }

int inventory_gpu_free(int index, uint64_t *bytes) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, inventory_lib_open);
  void *lib = inventory_lib;
  cu_init_fn init = lib ? (cu_init_fn)dlsym(lib, "cuInit") : NULL;
  cu_get_fn get = lib ? (cu_get_fn)dlsym(lib, "cuDeviceGet") : NULL;
  int dev = 0, e = init && get ? init(0) : INVENTORY_CU_NOT_FOUND;
  size_t free_bytes = 0;
  if (!e) e = get(&dev, index);
  if (!e) e = inventory_cuda_free(lib, dev, &free_bytes);
  *bytes = free_bytes;
  return e;
}

void inventory_measure(inventory_t *inv) {
  int any = 0;
  for (int i = 0; i < inv->count; i++) any |= !strcmp(inv->dev[i].kind, "cuda");
  if (!any) return;
  /* memory others hold is measured again a few times, a second apart:
   * ranks of a previous fsdpd killed a moment ago give theirs back as they
   * go (a unit restarted after 2 s), and one stray figure would set every
   * job's admission (the coordinator's smallest device) */
  for (int round = 0; round < INVENTORY_SETTLE_ROUNDS; round++) {
    int held = 0;
    for (int i = 0; i < inv->count; i++) {
      inventory_device_t *d = &inv->dev[i];
      if (strcmp(d->kind, "cuda") || (round && !inventory_held(d))) continue;
      uint64_t free_bytes = 0;
      d->free_error = inventory_gpu_free(d->index, &free_bytes);
      d->memory = !d->free_error && free_bytes < d->total ? free_bytes : d->total;
      held |= inventory_held(d);
    }
    if (!held || round + 1 == INVENTORY_SETTLE_ROUNDS) break;
    nanosleep(&(struct timespec){1, 0}, NULL);
  }
}

/* "N": a whole number in 1..max; -1 otherwise. */
static int inventory_number(const char *s, size_t len, int max) {
  if (len == 0 || len > 4) return -1;
  int v = 0;
  for (size_t i = 0; i < len; i++) {
    if (!isdigit((unsigned char)s[i])) return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v <= max ? v : -1;
}

static int inventory_find_spec(const char *spec, inventory_t *out) {
  memset(out, 0, sizeof *out);
  if (!spec || !*spec || !strcmp(spec, "auto")) {
    if (inventory_cuda(NULL, 0, out) == FSDP_OK) return FSDP_OK;
    memset(out, 0, sizeof *out);
    return inventory_cpu(1, out);
  }
  if (!strncmp(spec, "cpu:", 4)) {
    int n = inventory_number(spec + 4, strlen(spec + 4), INVENTORY_MAX);
    if (n < 1)
      return err_set(FSDP_EINVAL, "devices: '%s': cpu:N wants N from 1 to %d (e.g. cpu:2)", spec,
                     INVENTORY_MAX);
    return inventory_cpu(n, out);
  }
  if (!strcmp(spec, "cuda")) return inventory_cuda(NULL, 0, out);
  if (!strncmp(spec, "cuda:", 5)) {
    int want[INVENTORY_MAX], nwant = 0;
    for (const char *p = spec + 5;; p++) {
      const char *end = strchr(p, ',');
      size_t len = end ? (size_t)(end - p) : strlen(p);
      int ord = inventory_number(p, len, 9999);
      if (ord < 0 || nwant == INVENTORY_MAX)
        return err_set(FSDP_EINVAL, "devices: '%s': cuda:LIST wants GPU ordinals separated by "
                       "commas (e.g. cuda:0,1), at most %d", spec, INVENTORY_MAX);
      for (int k = 0; k < nwant; k++)
        if (want[k] == ord)
          return err_set(FSDP_EINVAL, "devices: '%s': GPU %d is named twice", spec, ord);
      want[nwant++] = ord;
      if (!end) break;
      p = end;
    }
    return inventory_cuda(want, nwant, out);
  }
  return err_set(FSDP_EINVAL, "devices: '%s' is not a device spec: use cpu:N, cuda, cuda:0,1 or "
                 "auto", spec);
}

int inventory_find(const char *spec, inventory_t *out) {
  const int rc = inventory_find_spec(spec, out);
  if (!rc) out->host_share = inventory_host_share(out->count);
  return rc;
}

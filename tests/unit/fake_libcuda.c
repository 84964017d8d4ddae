/* fake_libcuda: a stand-in for the NVIDIA driver library, built as
 * libcuda.so.1 for test_inventory, so that fsdpd's GPU discovery runs on
 * machines without a GPU. FAKE_CUDA_GPUS sets how many GPUs it reports
 * (default 2); GPU i has 80 GiB >> i, of which FAKE_CUDA_HELD_MIB (default
 * 0) are held once a context is current (the context's own, other
 * processes'), for the first FAKE_CUDA_HELD_CALLS reads of it (unset: all;
 * then a process holding them is gone); FAKE_CUDA_HELD_FILE, a file holding
 * that number, read at each measure, overrides it while it is there (a
 * test's other process coming and going). While a context is retained the
 * file FAKE_CUDA_CTX_MARK (when set) exists, and retaining takes
 * FAKE_CUDA_RETAIN_MS (default 0), and while the file FAKE_CUDA_HANG_FILE
 * is there (at most 2 minutes: a driver that does not answer), so a test
 * sees when the caller held a context; FAKE_CUDA_RETAIN_LOG, a file each
 * retain adds a line to, counts them. FAKE_CUDA_CTX_ERROR, set, is what retaining a primary
 * context returns (46: CUDA_ERROR_DEVICE_UNAVAILABLE, a GPU in
 * exclusive-process mode that another process holds). Return codes follow
 * the driver's: 0 success, 100 no device, 101 invalid device, 201 no
 * context current. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int fake_gpus(void) {
  const char *s = getenv("FAKE_CUDA_GPUS");
  return s ? atoi(s) : 2;
}

int cuInit(unsigned flags) { return flags ? 1 : 0; }

int cuDeviceGetCount(int *n) {
  *n = fake_gpus();
  return 0;
}

int cuDeviceGet(int *dev, int ordinal) {
  if (ordinal < 0 || ordinal >= fake_gpus()) return 101;
  *dev = ordinal;
  return 0;
}

int cuDeviceGetName(char *name, int len, int dev) {
  snprintf(name, (size_t)len, "Fake GPU %d", dev);
  return 0;
}

int cuDeviceTotalMem_v2(size_t *bytes, int dev) {
  *bytes = ((size_t)80 << 30) >> dev;
  return 0;
}

/* the primary context of GPU i is the pointer (void *)(i + 1); one current */
static int fake_current = -1, fake_retained[64];

int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  const char *e = getenv("FAKE_CUDA_CTX_ERROR");
  if (e && *e) return atoi(e);
  if (dev < 0 || dev >= fake_gpus() || dev >= 64) return 101;
  fake_retained[dev]++;
  *ctx = (void *)(size_t)(dev + 1);
  const char *mark = getenv("FAKE_CUDA_CTX_MARK"), *ms = getenv("FAKE_CUDA_RETAIN_MS");
  const char *log = getenv("FAKE_CUDA_RETAIN_LOG");
  FILE *f = mark && *mark ? fopen(mark, "w") : NULL;
  if (f) fclose(f);
  if ((f = log && *log ? fopen(log, "a") : NULL)) fprintf(f, "retain %d\n", dev), fclose(f);
  const int wait = ms ? atoi(ms) : 0;
  if (wait > 0) nanosleep(&(struct timespec){wait / 1000, wait % 1000 * 1000000L}, NULL);
  const char *hang = getenv("FAKE_CUDA_HANG_FILE");
  for (int i = 0; hang && *hang && i < 2400 && !access(hang, F_OK); i++)
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  return 0;
}

int cuDevicePrimaryCtxRelease_v2(int dev) {
  if (dev < 0 || dev >= 64 || !fake_retained[dev]) return 201;
  fake_retained[dev]--;
  const char *mark = getenv("FAKE_CUDA_CTX_MARK");
  if (mark && *mark) unlink(mark);
  return 0;
}

int cuCtxPushCurrent_v2(void *ctx) {
  const int dev = (int)(size_t)ctx - 1;
  if (dev < 0 || dev >= 64 || !fake_retained[dev]) return 201;
  fake_current = dev;
  return 0;
}

int cuCtxPopCurrent_v2(void **ctx) {
  if (fake_current < 0) return 201;
  if (ctx) *ctx = (void *)(size_t)(fake_current + 1);
  fake_current = -1;
  return 0;
}

int cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  if (fake_current < 0) return 201;
  const char *h = getenv("FAKE_CUDA_HELD_MIB"), *calls = getenv("FAKE_CUDA_HELD_CALLS");
  static int reads;
  cuDeviceTotalMem_v2(total, fake_current);
  size_t held = calls && reads++ >= atoi(calls) ? 0 : (size_t)(h ? atol(h) : 0) << 20;
  const char *file = getenv("FAKE_CUDA_HELD_FILE");
  FILE *f = file ? fopen(file, "r") : NULL;
  long mib = 0;
  if (f && fscanf(f, "%ld", &mib) == 1 && mib >= 0) held = (size_t)mib << 20;
  if (f) fclose(f);
  *free_bytes = held < *total ? *total - held : 0;
  return 0;
}

/* fake_libcuda: a stand-in for the NVIDIA driver library, built as
 * libcuda.so.1 for test_inventory, so that fsdpd's GPU discovery runs on
 * machines without a GPU. FAKE_CUDA_GPUS sets how many GPUs it reports
 * (default 2); GPU i has 80 GiB >> i. Return codes follow the driver's:
 * 0 success, 100 no device, 101 invalid device. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

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

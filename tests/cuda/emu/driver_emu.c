/* driver_emu.c: the few CUDA driver API calls fsdpd's inventory makes
 * (daemon/node/inventory.c: cuInit, cuDeviceGetCount, cuDeviceGet,
 * cuDeviceGetName, cuDeviceTotalMem_v2, through dlopen of libcuda.so.1),
 * built as build/emu/driver/libcuda.so.1. An fsdpd started with that
 * directory on LD_LIBRARY_PATH and FSDP_CUDA_PLUGIN naming the emulated
 * plugin (build/emu/libfsdp-cuda.so) serves emulated GPUs: the same count
 * (CUDA_EMU_DEVICES, default 1), name and memory (CUDA_EMU_MEMORY, default
 * 8 GiB) the emulated runtime (cuda_emu.cc) gives its ranks. Error codes
 * are the driver's: 100 no device, 101 invalid device, 1 invalid value. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned long long driver_emu_env(const char *name, unsigned long long dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  return *end ? dflt : x;
}

static int driver_emu_count(void) { return (int)driver_emu_env("CUDA_EMU_DEVICES", 1); }

int cuInit(unsigned flags) { return flags ? 1 : 0; }

int cuDeviceGetCount(int *n) {
  if (!n) return 1;
  *n = driver_emu_count();
  return 0;
}

int cuDeviceGet(int *dev, int ordinal) {
  if (!dev) return 1;
  if (ordinal < 0 || ordinal >= driver_emu_count()) return 101;
  *dev = ordinal;
  return 0;
}

int cuDeviceGetName(char *name, int len, int dev) {
  if (!name || len <= 0) return 1;
  if (dev < 0 || dev >= driver_emu_count()) return 101;
  snprintf(name, (size_t)len, "cuda_emu (CPU)");
  return 0;
}

int cuDeviceTotalMem_v2(size_t *bytes, int dev) {
  if (!bytes) return 1;
  if (dev < 0 || dev >= driver_emu_count()) return 101;
  *bytes = (size_t)driver_emu_env("CUDA_EMU_MEMORY", 8ull << 30);
  return 0;
}

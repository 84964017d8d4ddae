/* device: what a job's ranks compute and communicate with: a kind of device
 * and the two backends that serve it, the kernels (kernels/kern.h) and the
 * collectives (daemon/comm/comm.h). The training loop and the runtime ask
 * here and nowhere else. The memory plan (daemon/job/plan.c) links no
 * backend: its device profile reads the backends' header-only size formulas,
 * picked by the same config.device.
 *
 * Two kinds (config.device):
 *  - cpu: the CPU kernels and the ring, linked into every program;
 *  - cuda: one GPU per rank, the CUDA kernels and NCCL, from the CUDA plugin
 *    (device_cuda.h), loaded here on first use. The rank's GPU is
 *    FSDP_CUDA_DEVICE (fsdpd sets it), else its rank modulo the GPUs it
 *    sees. NCCL's world is made from an id the ring's bootstrap carries
 *    (comm_boot_ids_t). */
#ifndef FSDP_DEVICE_H
#define FSDP_DEVICE_H

#include "daemon/comm/boot.h"
#include "daemon/comm/comm.h"
#include "daemon/job/config.h"
#include "kernels/kern.h"

typedef struct device {
  const char *name;           /* "cpu" or "cuda" */
  const kern_backend_t *kern; /* as configured by device_open */
  const comm_backend_t *comm;
  const comm_boot_ids_t *ids; /* how comm_boot_connect makes the world (NULL: the ring) */
  /* Waits up to wait_ms for what the collectives still end in the
   * background (NCCL: the aborts of broken communicators, whose kernels
   * may still touch buffers): 0 when nothing is left, else not 0. NULL
   * where nothing runs in the background (the ring). */
  int (*settle)(int64_t wait_ms);
  size_t memory;              /* bytes of the rank's own device memory (0: host memory, shared) */
  /* bytes of it a job may plan to take, measured as the device opened:
   * its free memory and the kernels' workspace, which the plan counts
   * (what the CUDA context, the libraries and other processes hold is
   * not); 0: not measured (cpu, or an older plugin) */
  size_t usable;
  char desc[160];             /* "cpu kernels at avx512", "cuda device 0: NVIDIA H100 ..." */
} device_t;

/* Configures the process's device for rank of c, which shares its host with
 * ranks_on_host ranks (CPU: its threads are c->threads, else FSDP_THREADS,
 * else the host's cores shared among its ranks). Call once per process.
 * 0 and *out, or a negative code with a message that says what is missing
 * (the plugin, a CUDA library, a GPU) and how to run instead. */
int device_open(const config_t *c, int rank, int ranks_on_host, const device_t **out);

/* The CUDA plugin, loaded (once; later calls return the first answer):
 * 0 and *out, or a negative code with a message naming the file and what
 * dlopen said. For tests and tools; device_open calls it for cuda jobs. */
struct device_cuda_plugin;
int device_cuda_load(const struct device_cuda_plugin **out);

/* Whether a rank of this process's build and environment can use devices of
 * kind ("cpu", "cuda") here, without opening one: for cuda, the plugin loads
 * and sees a GPU. 0 and what was found in what ("cuda: 2 GPUs"), or a
 * negative code with device_open's message. fsdp-train --probe-device. */
int device_probe(const char *kind, char *what, size_t n);

#endif

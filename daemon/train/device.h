/* device: what a job's ranks compute and communicate with: a kind of device
 * and the two backends that serve it, the kernels (kernels/kern.h) and the
 * collectives (daemon/comm/comm.h). The training loop and the runtime ask
 * here and nowhere else, so a second kind of device (GPU ranks: CUDA kernels
 * and NCCL) is one more entry, not a change to them. The memory plan
 * (daemon/job/plan.c) links no backend: its device profile reads the
 * backends' header-only size formulas with the tunables device_open hands
 * them, and needs the same new entry.
 *
 * Today every job runs on CPU devices: the CPU kernels and the ring. */
#ifndef FSDP_DEVICE_H
#define FSDP_DEVICE_H

#include "daemon/job/config.h"
#include "daemon/comm/comm.h"
#include "kernels/kern.h"

typedef struct device {
  const char *name;           /* "cpu" */
  const kern_backend_t *kern; /* as configured by device_open (defaults before) */
  const comm_backend_t *comm;
} device_t;

/* The device a job of c runs on. */
const device_t *device_for(const config_t *c);
/* Configures the process's device for a rank of c that shares its host with
 * ranks_on_host ranks (its CPU threads: c->threads, else FSDP_THREADS, else
 * the host's cores shared among its ranks; the kernels' tunables). */
const device_t *device_open(const config_t *c, int ranks_on_host);

#endif

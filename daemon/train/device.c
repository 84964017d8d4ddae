/* device: the device of a job and its backends (see device.h). */
#include "device.h"

#include <unistd.h>

#include "daemon/comm/ring.h"
#include "daemon/common/param.h"

static device_t device_cpu = {"cpu", NULL, &comm_ring_backend};

const device_t *device_for(const config_t *c) {
  (void)c; /* one kind of device so far */
  if (!device_cpu.kern) device_cpu.kern = kern_cpu();
  return &device_cpu;
}

const device_t *device_open(const config_t *c, int ranks_on_host) {
  int threads = c->threads ? c->threads : (int)param_threads();
  if (!threads && ranks_on_host > 1) { /* the host's ranks share its cores */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores / ranks_on_host > 0 ? (int)(cores / ranks_on_host) : 1;
  }
  const kern_cpu_opts_t ko = {threads, (int)param_attn_block()};
  device_cpu.kern = kern_cpu_init(&ko);
  return &device_cpu;
}

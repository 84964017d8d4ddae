/* device: the device of a job and its backends (see device.h). */
#include "device.h"

#include <unistd.h>

#include "daemon/comm/ring.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"

static device_t device_cpu = {"cpu", NULL, &comm_ring_backend};

const device_t *device_for(const config_t *c) {
  (void)c; /* one kind of device so far */
  if (!device_cpu.kern) device_cpu.kern = kern_cpu();
  return &device_cpu;
}

/* FSDP_CPU_ISA as a level of the CPU kernels: the value is the x86-64
 * psABI level number (x86-64-v3 is 3), 0 for the best the processor has.
 * Anything else, or a level the processor lacks, runs at the best level
 * with a warning that names the variable and the choices. */
#define DEVICE_CPU_ISA_CHOICES "0 auto, 1 generic, 3 avx2, 4 avx512"

static kern_cpu_isa_t device_cpu_isa(void) {
  const int64_t v = param_cpu_isa();
  const kern_cpu_isa_t best = kern_cpu_isa_best();
  if (v < 0 || v > KERN_CPU_ISA_AVX512 || !kern_cpu_isa_name((kern_cpu_isa_t)v)) {
    LOG_WARN("device", "FSDP_CPU_ISA=%lld is not a level (" DEVICE_CPU_ISA_CHOICES
             "); running at auto (%s)", (long long)v, kern_cpu_isa_name(best));
    return KERN_CPU_ISA_AUTO;
  }
  if ((kern_cpu_isa_t)v > best) {
    LOG_WARN("device", "FSDP_CPU_ISA=%lld (%s): this processor lacks it; running at %s, its best ("
             DEVICE_CPU_ISA_CHOICES ")", (long long)v, kern_cpu_isa_name((kern_cpu_isa_t)v),
             kern_cpu_isa_name(best));
    return KERN_CPU_ISA_AUTO;
  }
  return (kern_cpu_isa_t)v;
}

const device_t *device_open(const config_t *c, int ranks_on_host) {
  int threads = c->threads ? c->threads : (int)param_threads();
  if (!threads && ranks_on_host > 1) { /* the host's ranks share its cores */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores / ranks_on_host > 0 ? (int)(cores / ranks_on_host) : 1;
  }
  const kern_cpu_opts_t ko = {threads, (int)param_attn_block(), device_cpu_isa()};
  device_cpu.kern = kern_cpu_init(&ko);
  LOG_INFO("device", "cpu kernels at %s (the processor's best: %s)",
           kern_cpu_isa_name(kern_cpu_isa()), kern_cpu_isa_name(kern_cpu_isa_best()));
  return &device_cpu;
}

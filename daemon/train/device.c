/* device: the device of a job and its backends (see device.h). */
#include "device.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/comm/ring.h"
#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/mem.h"
#include "daemon/common/param.h"
#include "daemon/train/device_cuda.h"

/* ---- cpu ------------------------------------------------------------------- */

static device_t device_cpu = {.name = "cpu", .comm = &comm_ring_backend};

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

static const device_t *device_cpu_open(const config_t *c, int ranks_on_host) {
  int threads = c->threads ? c->threads : (int)param_threads();
  if (!threads && ranks_on_host > 1) { /* the host's ranks share its cores */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores / ranks_on_host > 0 ? (int)(cores / ranks_on_host) : 1;
  }
  const kern_cpu_opts_t ko = {threads, (int)param_attn_block(), device_cpu_isa()};
  device_cpu.kern = kern_cpu_init(&ko);
  snprintf(device_cpu.desc, sizeof device_cpu.desc, "cpu kernels at %s (the processor's best: %s)",
           kern_cpu_isa_name(kern_cpu_isa()), kern_cpu_isa_name(kern_cpu_isa_best()));
  LOG_INFO("device", "%s", device_cpu.desc);
  return &device_cpu;
}

/* ---- cuda ------------------------------------------------------------------ */

#define DEVICE_CUDA_FIX "; or run on CPU devices (device = cpu)"

static const device_cuda_plugin_t *device_cuda_pl;
static int device_cuda_rc = 1; /* 1: not tried yet */
static char device_cuda_msg[768];

/* Where the plugin is: FSDP_CUDA_PLUGIN, else ../lib/fsdpd/ beside the program. */
static int device_cuda_path(char *out, size_t n) {
  const char *env = getenv("FSDP_CUDA_PLUGIN");
  if (env && *env) return snprintf(out, n, "%s", env) < (int)n ? FSDP_OK : FSDP_EINVAL;
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return err_set(FSDP_EIO, "device cuda: cannot find this program's directory "
                               "(/proc/self/exe); set FSDP_CUDA_PLUGIN to the plugin's path");
  exe[len] = 0;
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  return snprintf(out, n, "%s/../lib/fsdpd/" DEVICE_CUDA_FILE, exe) < (int)n ? FSDP_OK : FSDP_EINVAL;
}

static int device_cuda_try_load(void) {
  char path[PATH_MAX + 64];
  if (device_cuda_path(path, sizeof path))
    return err_set(FSDP_EINVAL, "device cuda: the plugin's path is too long; set FSDP_CUDA_PLUGIN");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return err_set(FSDP_EUNSUPPORTED, "device cuda: cannot load the CUDA plugin: %s (it is "
                   "built when nvcc is found, and needs cuBLASLt and NCCL on the library path)"
                   DEVICE_CUDA_FIX, dlerror());
  const device_cuda_plugin_t *(*get)(void) =
      (const device_cuda_plugin_t *(*)(void))dlsym(h, DEVICE_CUDA_SYMBOL);
  const device_cuda_plugin_t *p = get ? get() : NULL;
  if (!p || p->abi != DEVICE_CUDA_ABI) {
    int abi = p ? p->abi : -1;
    dlclose(h);
    return err_set(FSDP_EUNSUPPORTED, "device cuda: %s is not this build's CUDA plugin (%s %d, "
                   "this program wants %d); rebuild it with the programs" DEVICE_CUDA_FIX,
                   path, p ? "ABI" : "no " DEVICE_CUDA_SYMBOL ", ABI", abi, DEVICE_CUDA_ABI);
  }
  device_cuda_pl = p; /* never closed: its kernels and threads live as long as the process */
  return FSDP_OK;
}

int device_cuda_load(const device_cuda_plugin_t **out) {
  if (device_cuda_rc == 1) {
    device_cuda_rc = device_cuda_try_load();
    if (device_cuda_rc) snprintf(device_cuda_msg, sizeof device_cuda_msg, "%s", err_msg());
  }
  *out = device_cuda_pl;
  return device_cuda_rc ? err_set(device_cuda_rc, "%s", device_cuda_msg) : FSDP_OK;
}

static device_t device_cuda = {.name = "cuda"};

static int device_cuda_make_id(uint8_t *id) { return device_cuda_pl->nccl_unique_id(id); }

static int device_cuda_create(void *arg, int rank, int world, const uint8_t *id, const char *name,
                              comm_t **out) {
  (void)arg;
  const comm_nccl_opts_t o = {.rank = rank, .size = world, .id = id, .name = name,
                              .stream = device_cuda_pl->kern_stream()};
  return device_cuda_pl->nccl_create(&o, out);
}

static const comm_boot_ids_t device_cuda_ids = {
    .id_bytes = COMM_NCCL_ID_BYTES, .make_id = device_cuda_make_id, .create = device_cuda_create};

/* The plugin and the GPUs it sees (how many), or an error saying what is missing. */
static int device_cuda_count(const device_cuda_plugin_t **p) {
  int rc = device_cuda_load(p);
  if (rc) return rc;
  char msg[512] = "";
  int n = (*p)->device_count(msg, sizeof msg);
  if (n <= 0)
    return err_set(FSDP_EUNSUPPORTED, "device cuda: no GPU: %s" DEVICE_CUDA_FIX,
                   msg[0] ? msg : "none found");
  return n;
}

int device_probe(const char *kind, char *what, size_t len) {
  if (!strcmp(kind, "cpu")) {
    const kern_cpu_isa_t isa = device_cpu_isa();
    snprintf(what, len, "cpu: kernels at %s",
             kern_cpu_isa_name(isa == KERN_CPU_ISA_AUTO ? kern_cpu_isa_best() : isa));
    return FSDP_OK;
  }
  if (strcmp(kind, "cuda"))
    return err_set(FSDP_EINVAL, "probe: '%s' is not a device kind: give cpu or cuda", kind);
  const device_cuda_plugin_t *p;
  int n = device_cuda_count(&p);
  if (n < 0) return n;
  snprintf(what, len, "cuda: %d GPU%s", n, n == 1 ? "" : "s");
  return FSDP_OK;
}

kern_cuda_opts_t device_cuda_opts(int device, int bf16, int tf32) {
  const kern_cuda_opts_t o = {.device = device, .tf32 = tf32, .bf16 = bf16,
                              .attn_gemm = param_cuda_attn_gemm() != 0,
                              .gemm_fast16bf = param_cuda_gemm_fast16bf() != 0,
                              .attn_fp32 = param_cuda_attn_fp32() != 0,
                              .acts_fp32 = param_cuda_acts_fp32() != 0,
                              .dinp_fp32 = param_cuda_dinp_fp32() != 0,
                              .gelu_exact = param_cuda_gelu_exact() != 0,
                              /* bf16 jobs' tensor-core attention only (the plan counts
                               * its scratch there: plan.c), not opened for a job that
                               * cannot use it */
                              .attn_cudnn = bf16 && param_cuda_attn_fp32() == 0 &&
                                            param_cuda_attn_gemm() == 0 &&
                                            param_cuda_attn_cudnn() != 0,
                              .gemm_algo = KERN_CUDA_GEMM_ALGO(param_cuda_gemm_algo())};
  return o;
}

int device_cuda_params_check(void) {
  /* said before anything loads: the kernels would clamp FSDP_CUDA_GEMM_ALGO
   * (KERN_CUDA_GEMM_ALGO); its range is param.h's */
  return param_check();
}

static int device_cuda_open(const config_t *c, int rank, const device_t **out) {
  int rc = device_cuda_params_check();
  if (rc) return rc;
  const device_cuda_plugin_t *p;
  int n = device_cuda_count(&p);
  if (n < 0) return n;
  char msg[512] = "";
  int64_t ord = param_cuda_device();
  if (ord < 0) ord = rank % n;
  if (ord >= n)
    return err_set(FSDP_EINVAL, "FSDP_CUDA_DEVICE: %lld, but this process sees %d GPU%s (0 to "
                   "%d); fix the variable or CUDA_VISIBLE_DEVICES", (long long)ord, n,
                   n == 1 ? "" : "s", n - 1);
  /* bf16-mixed and bf16-true compute their products on bf16 tensor cores */
  const kern_cuda_opts_t ko = device_cuda_opts((int)ord, strcmp(c->precision, "fp32") != 0, c->tf32);
  const kern_backend_t *k = p->kern_init(&ko, msg, sizeof msg);
  if (!k) return err_set(FSDP_EIO, "device cuda: GPU %lld: %s", (long long)ord, msg);
  static int reserved_counted; /* the kernels keep it for the process's life */
  if (!reserved_counted++) mem_account(MEM_WORKSPACE, p->reserved_bytes(), 1);
  /* the comparisons' switches: FSDP_CUDA_RES_APART, the table less
   * matmul_fwd_res; FSDP_CUDA_WEIGHTS_PACK, weights16 0; FSDP_CUDA_QKV_APART,
   * qkv_out16 0; matmul_fwd_bf16_gelu and matmul_bwd_dgelu16 only under
   * FSDP_CUDA_GELU_FUSED */
  static kern_backend_t switched;
  const int res_apart = param_cuda_res_apart() && k->matmul_fwd_res,
            weights_pack = param_cuda_weights_pack() && k->weights16,
            qkv_apart = param_cuda_qkv_apart() && k->qkv_out16,
            gelu_apart = !param_cuda_gelu_fused() && (k->matmul_fwd_bf16_gelu ||
                                                      k->matmul_bwd_dgelu16);
  if (res_apart || weights_pack || qkv_apart || gelu_apart) {
    switched = *k;
    if (res_apart) switched.matmul_fwd_res = NULL;
    if (weights_pack) switched.weights16 = 0;
    if (qkv_apart) switched.qkv_out16 = 0;
    if (gelu_apart) switched.matmul_fwd_bf16_gelu = NULL, switched.matmul_bwd_dgelu16 = NULL;
    k = &switched;
  }
  device_cuda.kern = k;
  device_cuda.comm = p->comm;
  device_cuda.ids = &device_cuda_ids;
  device_cuda.settle = p->nccl_quiesce;
  device_cuda.memory = p->device_memory();
  device_cuda.usable = p->device_usable ? p->device_usable() : 0;
  if (p->device_usable && !device_cuda.usable)
    LOG_WARN("device", "cuda device %lld: its free memory could not be read (cudaMemGetInfo); "
             "the job is planned against its total", (long long)ord);
  snprintf(device_cuda.desc, sizeof device_cuda.desc, "cuda device %lld: %s, %.1f GiB, %s matrix "
           "products", (long long)ord, p->device_name(), (double)p->device_memory() / (1 << 30),
           ko.bf16 ? "bf16" : c->tf32 ? "TF32" : "fp32");
  LOG_INFO("device", "%s", device_cuda.desc);
  *out = &device_cuda;
  return FSDP_OK;
}

int device_open(const config_t *c, int rank, int ranks_on_host, const device_t **out) {
  *out = NULL;
  if (!strcmp(c->device, "cuda")) return device_cuda_open(c, rank, out);
  if (c->device[0] && strcmp(c->device, "cpu"))
    return err_set(FSDP_EINVAL, "device: \"%s\" is not a kind of device; use cpu or cuda",
                   c->device);
  *out = device_cpu_open(c, ranks_on_host);
  return FSDP_OK;
}

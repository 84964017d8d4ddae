/* device_cuda: the CUDA plugin, the one door between the engine and CUDA.
 *
 * The CUDA kernels (kernels/cuda) and the NCCL collectives (daemon/comm/nccl.h)
 * are built into one shared object, libfsdp-cuda.so, linked against cudart
 * (statically), cuBLASLt and NCCL. No main binary links it: device.c loads it
 * with dlopen when a job asks for device = cuda, and looks up the one symbol
 * below. So every program starts, and trains on CPU devices, on a machine
 * without the CUDA libraries or a GPU; only a cuda job needs them, and a
 * missing plugin, library or GPU is an error that says which.
 *
 * The plugin calls back into its host program for the project's error state
 * and log (err_set, log_*): programs that load it export their symbols
 * (-rdynamic), so the error a collective sets is the one the caller reads.
 *
 * Where it is looked for: FSDP_CUDA_PLUGIN (a path, set by the operator), else
 * ../lib/fsdpd/libfsdp-cuda.so next to the running program (the build tree's
 * bin/ and an install's PREFIX/bin alike). */
#ifndef FSDP_DEVICE_CUDA_H
#define FSDP_DEVICE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/comm/nccl.h"
#include "kernels/cuda/cuda.h"

/* Raised when the table below changes: a plugin of another version is refused. */
#define DEVICE_CUDA_ABI 25 /* 2: kern_cuda_opts_t.gemm_fast16bf; 3: .attn_fp32, host_pin; 4: pool_stats;
                           * 5: kern_backend_t's dev_alloc_step and crossentropy_fwd_bwd;
                           * 6: nccl_quiesce; 7: matmul_bwd, attention_bwd and gelu_bwd take acc;
                           * 8: kern_backend_t's bf16 activations; 9: kern_cuda_opts_t.gemm_algo;
                           * 10: kern_backend_t's gelu_bwd_bf16; 11: its bf16 logits and
                           * attention_scratch_bf16; 12: gelu_fwd_bf16in, gelu_bwd_bf16in;
                           * 13: matmul_bwd_dinp16, dout16 of attention_bwd_bf16 and
                           * gelu_bwd_bf16in; 14: kern_cuda_opts_t.gelu_exact,
                           * kern_backend_t's matmul_fwd_res, attention_fwd_bf16's and
                           * attention_bwd_bf16's out in bf16; 15: the bf16
                           * products' w16, kern_backend_t's weights16;
                           * 16: its adamw_segs; 17: adamw_segs's p16;
                           * 18: kern_cuda_opts_t.attn_cudnn; 19: matmul_fwd_bf16_out16's
                           * bias16, attention_fwd_bf16's qkv NULL, qkv_out16;
                           * 20: matmul_fwd_bf16_gelu, matmul_bwd_dgelu16, gelu_*_bf16in's bias
                           * NULL, matmul_bwd_bf16's dbias with dout16;
                           * 21: kern_backend_t's adamw_segs_scaled; 22: its bf16_to_f32_segs and
                           * encoder_fwd16; 23: its attention_bwd_dqkv16; 24: its
                           * layernorm_bwd16 and matmul_bwd16; 25: device_usable */
#define DEVICE_CUDA_SYMBOL "device_cuda_plugin"
#define DEVICE_CUDA_FILE "libfsdp-cuda.so"

typedef struct device_cuda_plugin {
  int abi; /* DEVICE_CUDA_ABI of the plugin's build */
  /* kernels/cuda/cuda.h */
  int (*device_count)(char *msg, size_t n);
  const kern_backend_t *(*kern_init)(const kern_cuda_opts_t *o, char *msg, size_t n);
  void *(*kern_stream)(void);
  size_t (*reserved_bytes)(void);
  const char *(*device_name)(void);
  size_t (*device_memory)(void);
  void (*pool_stats)(size_t *reserved, size_t *reserved_high, size_t *used_high);
  /* daemon/comm/nccl.h */
  const comm_backend_t *comm;
  int (*nccl_unique_id)(uint8_t id[COMM_NCCL_ID_BYTES]);
  int (*nccl_create)(const comm_nccl_opts_t *o, comm_t **out);
  int (*nccl_quiesce)(int64_t wait_ms);
  /* kernels/cuda/cuda.h again (NULL in a plugin built from an older
   * device_cuda.c: tests/cuda/gpu-pack.sh's bases) */
  size_t (*device_usable)(void);
} device_cuda_plugin_t;

/* A cuda rank's kernel options (device.c): its GPU, the job's precision
 * (bf16: every product on bf16 tensor cores, as bf16-mixed and bf16-true
 * compute) and TF32, and param.h's FSDP_CUDA_* settings; bench_cuda's
 * too. */
kern_cuda_opts_t device_cuda_opts(int device, int bf16, int tf32);
/* The tunables device_cuda_opts reads that it would otherwise clamp
 * (FSDP_CUDA_GEMM_ALGO: 0-15), refused by name: call it first. */
int device_cuda_params_check(void);

/* The plugin's one exported function (DEVICE_CUDA_SYMBOL). */
const device_cuda_plugin_t *device_cuda_plugin(void);

#endif

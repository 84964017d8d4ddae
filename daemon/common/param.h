/* param: every tunable of the project, declared once (after NCCL's NCCL_PARAM).
 *
 * Each entry has a name, the environment variable that overrides it, a
 * default, the range a value must lie in (lo to hi, both included), what is
 * done with a value outside it, and a sentence for `--help-params`. The getter
 * param_<name>() reads the environment once, on first use. A value that is not
 * a decimal integer, or one outside the range of a PARAM_WARN entry, is
 * reported once on stderr, naming the variable, its range and the default used
 * instead. A PARAM_REFUSE entry keeps a value outside its range and
 * param_check() refuses it, by name, where running on with another value would
 * be wrong. Job options (steps, batch, ...) are not tunables: they belong to
 * the job and live in its config. */
#ifndef FSDP_PARAM_H
#define FSDP_PARAM_H

#include <stdint.h>
#include <stdio.h>

#define PARAM_MAX INT64_MAX
#define PARAM_WARN 0   /* out of range: a warning, and the default */
#define PARAM_REFUSE 1 /* out of range: param_check() refuses it */

/* XX(name, env, default, lo, hi, bad, help) */
#define FSDP_PARAM_LIST(XX)                                                          \
  XX(threads, "FSDP_THREADS", 0, 0, 4096, PARAM_WARN, "CPU threads for kernels (0: all online cores)")   \
  XX(log_level, "FSDP_LOG_LEVEL", 2, 0, 3, PARAM_WARN, "0 error, 1 warn, 2 info, 3 debug")             \
  XX(log_json, "FSDP_LOG_JSON", 0, 0, 1, PARAM_WARN, "1: one JSON object per log line")                \
  XX(attn_block, "FSDP_ATTN_BLOCK", 64, 1, 4096, PARAM_WARN, "query rows per attention work item")        \
  XX(cpu_isa, "FSDP_CPU_ISA", 0, 0, 4, PARAM_WARN,                                                     \
     "CPU kernels' x86-64 level: 0 auto (the best this CPU has), 1 generic, 3 avx2, 4 avx512") \
  XX(progress_every, "FSDP_PROGRESS_EVERY", 1, 1, 1000000000, PARAM_WARN, "print a progress line every N steps")     \
  XX(cuda_device, "FSDP_CUDA_DEVICE", -1, -1, 4095, PARAM_WARN,                                            \
     "device cuda: this rank's GPU ordinal (-1: its rank modulo the GPUs it sees; fsdpd sets it)") \
  XX(device_memory_bytes, "FSDP_DEVICE_MEMORY_BYTES", 0, 0, PARAM_MAX, PARAM_WARN,                             \
     "a rank's memory limit when its job sets no memory_limit_mib: its device's bytes (fsdpd sets it from its inventory; 0: the host's available memory divided among the world's ranks, as under fsdp-launch, where they share one host)") \
  XX(host_memory_bytes, "FSDP_HOST_MEMORY_BYTES", 0, 0, PARAM_MAX, PARAM_WARN,                                 \
     "device cuda: the host memory a rank may keep apart from its GPU, its asynchronous checkpoint's snapshot, at most the host's available memory as it starts (fsdpd sets it: the host's memory divided among the node's devices; 0: the host's available memory divided among the world's ranks, as under fsdp-launch); a snapshot beyond it is dropped and checkpoints are written in place") \
  XX(cuda_attn_gemm, "FSDP_CUDA_ATTN_GEMM", 0, 0, 1, PARAM_WARN,                                       \
     "device cuda: 1: attention by strided products keeping the probabilities (0: the fused kernel where one is built)") \
  XX(cuda_gemm_fast16bf, "FSDP_CUDA_GEMM_FAST16BF", 0, 0, 1, PARAM_WARN,                               \
     "device cuda, bf16 products: 1: cuBLASLt rounds the fp32 operands itself (CUBLAS_COMPUTE_32F_FAST_16BF; 0: they are packed to bf16 first), for comparison") \
  XX(cuda_attn_fp32, "FSDP_CUDA_ATTN_FP32", 0, 0, 1, PARAM_WARN,                                       \
     "device cuda, bf16 jobs: 1: the fused attention computes in fp32 on CUDA cores (0: on bf16 tensor cores)") \
  XX(cuda_attn_cudnn, "FSDP_CUDA_ATTN_CUDNN", 0, 0, 1, PARAM_WARN,                                     \
     "device cuda, bf16 jobs: 1: the attention by cuDNN's fused flash attention (libcudnn.so.9, 9.10.2 or newer, loaded at start: a rank fails without it; shapes cuDNN has no engine for run the kernels, said once), with dq's fp32 accumulator and a bf16 dqkv in the attention's scratch (10 bytes a token and channel more) (0: the project's own tensor-core kernels)") \
  XX(cuda_acts_fp32, "FSDP_CUDA_ACTS_FP32", 0, 0, 1, PARAM_WARN,                                       \
     "device cuda, bf16 jobs: 1: every activation kept in fp32, the products packing theirs (0: the products' inputs and qkv kept in bf16), for comparison") \
  XX(cuda_dinp_fp32, "FSDP_CUDA_DINP_FP32", 0, 0, 1, PARAM_WARN,                                       \
     "device cuda, bf16 jobs: 1: backward's activation gradients all in fp32 (0: GELU's and the attention's output gradients written in bf16 by their products, kern.h's matmul_bwd_dinp16, the attention's own by it, attention_bwd_dqkv16, and the residual's for the projections by the norms' backward, layernorm_bwd16), for comparison") \
  XX(cuda_gelu_exact, "FSDP_CUDA_GELU_EXACT", 0, 0, 1, PARAM_WARN,                                     \
     "device cuda, bf16 jobs: 1: GELU of the bf16 activations computes the CPU's bits (0: the fast form, on the special function unit, within a bf16 rounding step of them), for comparison") \
  XX(cuda_res_apart, "FSDP_CUDA_RES_APART", 0, 0, 1, PARAM_WARN,                                       \
     "device cuda, bf16 jobs: 1: the residual added by a pass after the projections' products (0: by the products as they write, kern.h's matmul_fwd_res), for comparison") \
  XX(cuda_qkv_apart, "FSDP_CUDA_QKV_APART", 0, 0, 1, PARAM_WARN,                                       \
     "device cuda, bf16 jobs: 1: a block's qkv product writes fp32 and the attention rounds it to bf16 (0: the product writes bf16, adding its bias's bf16 image before its one rounding, kern.h's qkv_out16), for comparison") \
  XX(cuda_gelu_fused, "FSDP_CUDA_GELU_FUSED", 0, 0, 1, PARAM_WARN,                                     \
     "device cuda, bf16 jobs: 1: GELU in the fc product's write and its backward in the fc projection's dinp product's (cuBLASLt's GELU_AUX_BIAS and DGELU epilogues, kern.h's matmul_fwd_bf16_gelu and matmul_bwd_dgelu16: no GELU passes), where GELU's output is kept (recompute 0) (0: GELU by passes of its own after the products), until a GPU's A/B says which is faster") \
  XX(cuda_weights_pack, "FSDP_CUDA_WEIGHTS_PACK", 0, 0, 1, PARAM_WARN,                                 \
     "device cuda, bf16 jobs: 1: the products pack each fp32 weight to bf16 as they read it (0: they read the unit's bf16 gather, kept beside the widened unit, kern.h's weights16), for comparison") \
  XX(gather_round, "FSDP_GATHER_ROUND", 0, 0, 1, PARAM_WARN,                                            \
     "bf16-mixed: 1: each gather rounds the unit's fp32 master shard to bf16 (0: the gathers send the master's bf16 image, which AdamW writes as it steps: 2 bytes a parameter of the shard more, a pass over the shard at each gather less; on one shard the image is the units' bf16 weights, so 1 saves less there, nothing under NO_SHARD on a GPU), for comparison or for that memory") \
  XX(gather_poison, "FSDP_GATHER_POISON", 0, 0, 1, PARAM_WARN,                                          \
     "bf16 gathers (bf16-mixed, bf16-true) whose products read the gathered bf16 weights (device cuda): 1: each gather first fills the unit's fp32 copy with NaN, so that an op reading in fp32 a tensor the gather does not widen (gpt_tensor_fp32 says which it widens) makes the loss NaN, for tests (0: what the unit's memory held)") \
  XX(cuda_gemm_algo, "FSDP_CUDA_GEMM_ALGO", 0, 0, 15, PARAM_REFUSE,                                       \
     "device cuda: every product takes the algorithm cuBLASLt's heuristic ranks this many places below its first (0: its first; at most 15, a rank refuses more), for comparison") \
  XX(comm_timeout_ms, "FSDP_COMM_TIMEOUT_MS", 5000, 1, 86400000, PARAM_WARN, "collective timeout, and ring bootstrap") \
  XX(comm_chunk_bytes, "FSDP_COMM_CHUNK_BYTES", 1048576, 64, 1 << 30, PARAM_WARN, "ring: bytes per socket call")       \
  XX(comm_staging_bytes, "FSDP_COMM_STAGING_BYTES", 4194304, 64, 1LL << 36, PARAM_WARN, "ring: reduce staging per comm") \
  XX(comm_shm, "FSDP_COMM_SHM", 1, 0, 1, PARAM_WARN, "ring: shared memory to a rank on this host (0: TCP only)")  \
  XX(comm_shm_bytes, "FSDP_COMM_SHM_BYTES", 2097152, 0, 1 << 30, PARAM_WARN, "ring: shared-memory link buffer per link") \
  XX(comm_cma, "FSDP_COMM_CMA", 0, 0, 1, PARAM_WARN, "ring: 1: same-host links read the peer by process_vm_readv") \
  XX(comm_reg, "FSDP_COMM_REG", 1, 0, 1, PARAM_WARN, "registered buffers: peers on this host read them in place (0: off)") \
  XX(gpu_measure_s, "FSDP_GPU_MEASURE_S", 10, 0, 86400, PARAM_WARN,                                        \
     "fsdpd: every this many seconds one idle GPU's free memory is measured again (its ranks wait the moment it takes) and a figure that moved by 64 MiB or more is what the node offers from its next heartbeat (0: measured only as fsdpd starts; a measurement the driver has not answered in 10 s is given up, its GPU's ranks start and none is measured again)") \
  XX(log_streams_max, "FSDP_LOG_STREAMS_MAX", 64, 1, 1 << 20, PARAM_WARN,                                    \
     "fsdpd: GetRankLogs streams open at once (each holds a file descriptor); more are refused") \
  XX(watch_streams_max, "FSDP_WATCH_STREAMS_MAX", 1024, 1, 1 << 20, PARAM_WARN,                              \
     "coordinator: WatchJob streams open at once (each holds memory and work at every change); more are refused") \
  XX(rpc_keepalive_s, "FSDP_RPC_KEEPALIVE_S", 30, 1, 3600, PARAM_WARN,                                    \
     "RPC clients (fsdpctl, fsdpd): ping the server this often while a call is open; one unanswered as long ends the call") \
  XX(rpc_streams_max, "FSDP_RPC_STREAMS_MAX", 100, 1, 65536, PARAM_WARN,                          \
     "RPC servers: calls one connection may hold open at once (HTTP/2 MAX_CONCURRENT_STREAMS; a client's further calls wait for one to end, a peer that opens more loses the connection)") \
  XX(rpc_idle_ms, "FSDP_RPC_IDLE_MS", 120000, 0, 86400000, PARAM_WARN,                             \
     "RPC servers: a connection without a call for this long is closed (clients connect again at their next call; 0: never)") \
  XX(rpc_handshake_ms, "FSDP_RPC_HANDSHAKE_MS", 20000, 100, 3600000, PARAM_WARN,                    \
     "RPC servers: a connection that has not finished TLS and sent HTTP/2's preface and SETTINGS this long after it opened is closed") \
  XX(stream_stall_s, "FSDP_STREAM_STALL_S", 60, 1, 86400, PARAM_WARN,                                     \
     "a stream whose client accepts nothing for this many seconds is ended (fsdpd's GetRankLogs, the coordinator's ExportCheckpoint)")

#define XX(name, env, def, lo, hi, bad, help) int64_t param_##name(void);
FSDP_PARAM_LIST(XX)
#undef XX

/* Prints every tunable, its variable, default, range and current value. */
void param_dump(FILE *out);

/* FSDP_OK, or FSDP_EINVAL with err_msg() naming the first PARAM_REFUSE
 * tunable set outside its range, the range and how to fix it. */
int param_check(void);

/* The tunables the memory plan reads (daemon/job/plan.c and the size
 * formulas it calls): a job is admitted with the coordinator's values, so
 * the coordinator hands them to each rank with its assignment and fsdpd
 * sets them for the rank over its own (RankAssignment.plan_env), a
 * tunable the assignment does not name at its default. So that a node of
 * an older build (which knows fewer, refuses a name it does not know and
 * keeps its own value of one it is not sent) runs a newer coordinator's
 * jobs, the coordinator sends the first PARAM_PLAN_ENV_BASE always (every
 * build since stop 46 knows them) and a later one only where its value is
 * not the default: a job that needs it refused there, by name, and every
 * other job run. New tunables go at the end. */
#define PARAM_PLAN_ENV_N 11
#define PARAM_PLAN_ENV_BASE 10
#define PARAM_PLAN_ENV_LEN 64 /* "NAME=VALUE", terminated */
/* Entry i (0 <= i < PARAM_PLAN_ENV_N) as this process has it:
 * "NAME=VALUE" into out. */
void param_plan_env(int i, char out[PARAM_PLAN_ENV_LEN]);
/* Entry i at its default, "NAME=DEFAULT". */
void param_plan_env_default(int i, char out[PARAM_PLAN_ENV_LEN]);
/* Whether the coordinator sends entry i: i < PARAM_PLAN_ENV_BASE, or its
 * value is not its default. */
int param_plan_env_sent(int i);
/* The entry "NAME=VALUE" e names (0 <= i < PARAM_PLAN_ENV_N), or -1. */
int param_plan_env_index(const char *e);
/* Whether e is "NAME=VALUE" for one of them with a decimal integer value. */
int param_plan_env_ok(const char *e);

#endif

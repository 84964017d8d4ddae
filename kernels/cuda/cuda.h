/* kernels/cuda: the CUDA backend of the op set (kernels/kern.h), on one GPU.
 *
 * Built with nvcc into the CUDA plugin (libfsdp-cuda.so, see
 * daemon/train/device_cuda.h) and never linked into the main binaries, which
 * load it with dlopen only when a job asks for a GPU: a machine without CUDA
 * libraries or GPU still runs every program on CPU devices.
 *
 * The backend owns one CUDA stream; every op and every memory operation of the
 * table is queued on it, in call order, and returns without waiting for the
 * GPU, except copy_d2h, vec_sum and sumsq, which return results the host reads
 * and so wait for the stream. The collectives (NCCL, daemon/comm/nccl.h) order
 * themselves after it through kern_cuda_stream().
 *
 * Numerics follow the CPU backend: every element-wise formula comes from
 * kernels/kern_math.h (compiled -fmad=false, so the same bits where the CPU's
 * loops run the same formula); matrix products go through cuBLASLt in fp32
 * (TF32 tensor cores only when kern_cuda_opts_t.tf32 asks, bf16 tensor cores
 * when .bf16 does: fp32 in memory, the operands rounded to bf16 into packing
 * buffers a block at a time, fp32 accumulation); reductions sum in
 * fixed orders (the same bytes from run to run, not the CPU's order).
 *
 * kernels/ is a leaf: no daemon code here. A CUDA error inside an op is not
 * recoverable (the context is lost): the backend prints the op, the CUDA
 * error and its place on stderr and aborts the rank, whose supervisor reports
 * it. Init errors return. */
#ifndef FSDP_KERN_CUDA_H
#define FSDP_KERN_CUDA_H

#include <stddef.h>

#include "kernels/kern.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kern_cuda_opts {
  int device; /* CUDA device ordinal (the rank's GPU on its node) */
  int tf32;   /* 1: fp32 matrix products may use TF32 tensor cores */
  int bf16;   /* 1: matrix products run on bf16 tensor cores (operands rounded to
               * bf16, fp32 accumulation and output); wins over tf32 */
  int attn_gemm; /* 1: attention by strided products keeping the probabilities,
                  * even where a fused kernel exists (size.h says where) */
  int gemm_fast16bf; /* 1 (with bf16): cuBLASLt rounds the fp32 operands itself
                      * (CUBLAS_COMPUTE_32F_FAST_16BF) instead of the products taking
                      * them packed to bf16; for comparison (FSDP_CUDA_GEMM_FAST16BF) */
  int attn_fp32; /* 1 (with bf16): the fused attention computes in fp32 on CUDA
                  * cores instead of bf16 tensor cores (FSDP_CUDA_ATTN_FP32) */
  int acts_fp32; /* 1 (with bf16): the table offers no bf16 activations (kern.h),
                  * so a model keeps every activation in fp32; for comparison
                  * (FSDP_CUDA_ACTS_FP32) */
  int gemm_algo; /* every product takes the algorithm cuBLASLt's heuristic ranks
                  * this many places below its first (the last it offers when it
                  * offers fewer); 0, its first, but for comparison
                  * (FSDP_CUDA_GEMM_ALGO) */
  int dinp_fp32; /* 1 (with bf16): the table offers no matmul_bwd_dinp16 (kern.h),
                  * so backward's activation gradients stay fp32; for comparison
                  * (FSDP_CUDA_DINP_FP32) */
  int gelu_exact; /* 1 (with bf16): GELU of the bf16 activations (kern.h's
                   * gelu_fwd_bf16in, gelu_bwd_bf16in) computes kern_math.h's
                   * kern_gelu, the CPU's bits, instead of the fast form
                   * (gelu.cu); for comparison (FSDP_CUDA_GELU_EXACT) */
  int attn_cudnn; /* 1 (with bf16): the attention of the bf16 activations (kern.h's
                   * attention_fwd_bf16, attention_bwd_bf16) by cuDNN's fused flash
                   * attention (cudnn.cu: libcudnn.so.9, loaded now; init fails
                   * without it), where cuDNN has an engine for the shapes, else
                   * attention_tc.cu's kernels (FSDP_CUDA_ATTN_CUDNN) */
} kern_cuda_opts_t;

/* gemm_algo from a setting: 0 to 15 (cuBLASLt's ranking is asked for that
 * many plus one) */
#define KERN_CUDA_GEMM_ALGO(v) ((v) < 0 ? 0 : (v) > 15 ? 15 : (int)(v))

/* The number of CUDA devices this process sees; 0 with a reason in msg
 * (no driver, no GPU, the toolkit's stub driver) when none. */
int kern_cuda_device_count(char *msg, size_t n);

/* Selects o->device, makes the backend's stream, cuBLASLt handle and
 * workspace. NULL with the reason in msg (device out of range, no GPU, out
 * of memory). Later calls return the same table on the same device and
 * only take o's modes (tf32, bf16, attn_gemm, gemm_fast16bf, attn_fp32, acts_fp32, gemm_algo, dinp_fp32, gelu_exact): a process runs one job at a
 * time, and each job sets its own before it allocates. */
const kern_backend_t *kern_cuda_init(const kern_cuda_opts_t *o, char *msg, size_t n);

/* The backend's stream (a cudaStream_t), for the collectives to order on. */
void *kern_cuda_stream(void);

/* Device bytes the backend holds of its own (the cuBLASLt workspace and
 * reduction scratch), allocated at init: the memory plan's MEM_WORKSPACE. */
size_t kern_cuda_reserved_bytes(void);

/* The pool of dev_alloc_step (kern.h: the buffers that live within a step),
 * in bytes: what the device gave it now (reserved: idle blocks included), the
 * most it held, and the most its live buffers took at once, since init; 0
 * before. */
void kern_cuda_pool_stats(size_t *reserved, size_t *reserved_high, size_t *used_high);

/* Products since init that asked cuBLASLt for a GELU epilogue (GELU_AUX(_BIAS),
 * DGELU) and got a pass after the product instead (kern.h's
 * matmul_fwd_bf16_gelu, matmul_bwd_dgelu16): 0 where every one fused. */
unsigned long kern_cuda_gelu_passes(void);

/* Device name and total memory of the selected device ("" / 0 before init). */
const char *kern_cuda_device_name(void);
size_t kern_cuda_device_memory(void);

/* What a job may plan to take on the selected device now: its free memory
 * (cudaMemGetInfo: not what the CUDA context, the libraries' handles and
 * other processes hold) and what this backend holds that the plan counts,
 * its workspace (kern_cuda_reserved_bytes), less what the step buffers'
 * pool may keep idle beside them (size.h's KERN_CUDA_SIZE_POOL_SLACK); 0
 * before init. */
size_t kern_cuda_device_usable(void);

#ifdef __cplusplus
}
#endif

#endif

/* size: the CUDA backend's memory formulas with no code behind them (header
 * only, plain C: no CUDA header needed). The backend sizes its scratch and
 * its own reserved memory with them (attention.cu, backend.cu) and the memory
 * plan (daemon/job/plan.c), which links no kernel, can predict MEM_WORKSPACE
 * with them: one formula, so they cannot drift. */
#ifndef FSDP_KERN_CUDA_SIZE_H
#define FSDP_KERN_CUDA_SIZE_H

#include <stddef.h>

/* The cuBLASLt workspace, allocated once at init (its heuristics pick
 * algorithms that fit in it). */
#define KERN_CUDA_SIZE_WORKSPACE ((size_t)32 << 20)

/* Blocks of the first stage of the double reductions (sumsq, vec_sum): each
 * writes one partial sum, and a second stage adds them in a fixed tree. The
 * scratch holds the partials and the final sum. */
#define KERN_CUDA_SIZE_REDUCE_BLOCKS 1024

/* bf16 elements of each of the two packing buffers of the bf16 matrix
 * products (matmul.cu): a product's operands are rounded to bf16 into them,
 * a block of rows and columns at a time, before cuBLASLt multiplies them on
 * bf16 tensor cores. */
#define KERN_CUDA_SIZE_PACK_ELEMS ((size_t)16 << 20)

/* Floats of the column sums' runs a block of the joint backward makes as it
 * packs dout (matmul.cu: dbias, a run of 32 rows a float a column): a
 * block of packed dout holds at most KERN_CUDA_SIZE_PACK_ELEMS elements,
 * so its runs this many whenever its rows are 32 or more. */
#define KERN_CUDA_SIZE_COLSUM_FLOATS (KERN_CUDA_SIZE_PACK_ELEMS / 32)

/* Device bytes the backend holds of its own from init on
 * (kern_cuda_reserved_bytes): the cuBLASLt workspace, the reduction scratch,
 * the two packing buffers and the column sums' runs. */
static inline size_t kern_cuda_size_reserved(void) {
  return KERN_CUDA_SIZE_WORKSPACE + (size_t)(KERN_CUDA_SIZE_REDUCE_BLOCKS + 1) * sizeof(double) +
         2 * KERN_CUDA_SIZE_PACK_ELEMS * sizeof(unsigned short) +
         KERN_CUDA_SIZE_COLSUM_FLOATS * sizeof(float);
}

/* Attention runs as a fused kernel (attention.cu: the scores never leave
 * the chip; forward keeps each query row's log-sum-exp and backward
 * recomputes the probabilities) when a kernel is built for the head size and
 * the operator did not ask for the strided products (gemm 1:
 * kern_cuda_opts_t.attn_gemm, FSDP_CUDA_ATTN_GEMM). The products keep the
 * (B, NH, T, T) probabilities: the fallback for other head sizes. */
#define KERN_CUDA_ATTN_FUSED_HS(hs) ((hs) == 16 || (hs) == 32 || (hs) == 64 || (hs) == 128)

static inline int kern_cuda_size_attn_fused(int C, int NH, int gemm) {
  return !gemm && NH > 0 && C % NH == 0 && KERN_CUDA_ATTN_FUSED_HS(C / NH);
}

/* The fused op runs on bf16 tensor cores with qkv kept in bf16 (kern.h's
 * attention_fwd_bf16; tc: bf16 jobs, unless FSDP_CUDA_ATTN_FP32): head
 * sizes whose kernels fit every GPU's shared memory (attention_tc.cu checks
 * it at build), so the plan and the model know before the device does. */
static inline int kern_cuda_size_attn_tc_qkv16(int C, int NH, int gemm, int tc) {
  return tc && kern_cuda_size_attn_fused(C, NH, gemm) && C / NH <= 64;
}

/* Floats forward keeps for backward (kern_backend_t.attention_saved): the
 * log-sum-exp of every query row (B, NH, T) fused, the probabilities
 * (B, NH, T, T) with the products. */
static inline size_t kern_cuda_size_attention_saved(int B, int T, int C, int NH, int gemm) {
  const size_t rows = (size_t)B * (size_t)NH * (size_t)T;
  return kern_cuda_size_attn_fused(C, NH, gemm) ? rows : rows * (size_t)T;
}

/* Where attention_tc.cu's bf16 copies start in the scratch, in floats:
 * after the fused kernels' D rows (B, NH, T), at a 16-byte boundary. */
static inline size_t kern_cuda_size_attn_tc_copies_at(int B, int T, int NH) {
  return ((size_t)B * (size_t)NH * (size_t)T + 3) & ~(size_t)3;
}

/* Device bytes the step buffers' pool (backend.cu's dev_alloc_step) may
 * hold beyond what its live buffers take, which no plan counts: a GPU's
 * stream-ordered pool maps memory in pages of 2 MiB and carves buffers out
 * of them, so a page a buffer takes part of keeps its rest from a larger
 * buffer; taken as 2 MiB for each of 8 buffers live at once (a step's
 * gathered units, their bf16 landings, unit gradients and the reduction
 * in flight: fewer at one rank), an estimate. kern_cuda_device_usable
 * leaves it out of what a job may plan to take. */
#define KERN_CUDA_SIZE_POOL_SLACK ((size_t)16 << 20)

/* Bytes of workspace cuDNN's fused attention may take (cudnn.cu: an engine
 * that wants more is passed over); its flash-attention engines on an H200
 * ask 256 (tests/cuda/test_cudnn_graphs.c asks cuDNN for gpt2's shapes). */
#define KERN_CUDA_SIZE_CUDNN_WS ((size_t)1 << 20)

/* Where cuDNN's attention (kern_cuda_opts_t.attn_cudnn, with the caller's
 * qkv16) keeps dq's fp32 accumulator in the scratch, in floats: from the
 * first 256-byte boundary after the D rows and dout's bf16 copy (64 floats
 * of room for that), B T C floats; then the engine's workspace, from the
 * next; then, from the next, dqkv in bf16 (3 B T C / 2 floats), where
 * cuDNN writes the gradients in bf16 (cudnn.cu) for attention.cu to widen
 * (attention.cu rounds each start up). */
static inline size_t kern_cuda_size_attn_cudnn_acc_at(int B, int T, int C, int NH) {
  return kern_cuda_size_attn_tc_copies_at(B, T, NH) + (size_t)B * (size_t)T * (size_t)C / 2;
}
static inline size_t kern_cuda_size_attn_cudnn_ws_at(int B, int T, int C, int NH) {
  return kern_cuda_size_attn_cudnn_acc_at(B, T, C, NH) + (size_t)B * (size_t)T * (size_t)C + 64;
}
static inline size_t kern_cuda_size_attn_cudnn_g16_at(int B, int T, int C, int NH) {
  return kern_cuda_size_attn_cudnn_ws_at(B, T, C, NH) + 64 + KERN_CUDA_SIZE_CUDNN_WS / sizeof(float);
}

/* Floats of attention's scratch (both passes'). Fused: every query row's
 * dout . out (B, NH, T), which the key pass reads; on bf16 tensor cores (tc:
 * bf16 jobs, unless FSDP_CUDA_ATTN_FP32) then also the bf16 copies of qkv
 * (B, T, 3C) and dout (B, T, C) the kernels stage their tiles from, 2C
 * floats a token, or with qkv16 (the caller keeps qkv in bf16: kern.h's
 * attention_*_bf16, where kern_cuda_size_attn_tc_qkv16) dout's alone, C / 2;
 * with cuDNN's attention (cudnn, with qkv16) also dq's accumulator, the
 * engine's workspace and a bf16 dqkv (kern_cuda_size_attn_cudnn_g16_at), so
 * either runs in it. Products: the score gradients of one batch row, (NH, T, T); backward
 * walks the batch one row at a time on the one stream, so the rows reuse
 * it. */
static inline size_t kern_cuda_size_attention_scratch(int B, int T, int C, int NH, int gemm,
                                                      int tc, int qkv16, int cudnn) {
  if (!kern_cuda_size_attn_fused(C, NH, gemm)) return (size_t)NH * (size_t)T * (size_t)T;
  if (!tc) return (size_t)B * (size_t)NH * (size_t)T;
  if (qkv16 && cudnn)
    return kern_cuda_size_attn_cudnn_g16_at(B, T, C, NH) + 64 +
           3 * (size_t)B * (size_t)T * (size_t)C / 2;
  const size_t a_token = qkv16 ? (size_t)C / 2 : 2 * (size_t)C; /* C even: heads of 16 on */
  return kern_cuda_size_attn_tc_copies_at(B, T, NH) + (size_t)B * (size_t)T * a_token;
}

#endif

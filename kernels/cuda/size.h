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

/* Device bytes the backend holds of its own from init on
 * (kern_cuda_reserved_bytes). */
static inline size_t kern_cuda_size_reserved(void) {
  return KERN_CUDA_SIZE_WORKSPACE + (size_t)(KERN_CUDA_SIZE_REDUCE_BLOCKS + 1) * sizeof(double);
}

/* Floats of attention backward's scratch: the score gradients of one batch
 * row, (NH, T, T). Backward walks the batch one row at a time on the one
 * stream, so the rows reuse it; B and C do not enter. */
static inline size_t kern_cuda_size_attention_scratch(int B, int T, int C, int NH) {
  (void)B;
  (void)C;
  return (size_t)NH * (size_t)T * (size_t)T;
}

#endif

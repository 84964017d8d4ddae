/* size: the CPU backend's scratch sizes as formulas with no code behind them
 * (header only). The backend sizes its scratch with them (attention.c,
 * backend.c) and the memory plan (daemon/job/plan.c), which links no kernel,
 * predicts MEM_WORKSPACE with them: one formula, so they cannot drift. */
#ifndef FSDP_KERN_CPU_SIZE_H
#define FSDP_KERN_CPU_SIZE_H

#include <stddef.h>

/* Query rows per attention block (kern_cpu_opts_t.attn_block; <= 0: 64). */
static inline int kern_cpu_size_attn_rows(int attn_block) { return attn_block > 0 ? attn_block : 64; }

/* Rows of one block of a sequence of T: the configured rows, at most T. */
static inline int kern_cpu_size_block(int attn_block, int T) {
  const int r = kern_cpu_size_attn_rows(attn_block);
  return r > T ? T : r;
}

/* Floats forward keeps for backward: each query row's log-sum-exp, (B,NH,T). */
static inline size_t kern_cpu_size_attention_saved(int B, int T, int NH) {
  return (size_t)B * (size_t)NH * (size_t)T;
}

/* Floats of attention's scratch: per (batch, head) pair, one block of
 * probabilities and (backward) their gradient, rows x T each. One slice per
 * pair rather than per thread: the size then does not depend on the thread
 * count, which may change between this call and the op. */
static inline size_t kern_cpu_size_attention_scratch(int B, int T, int NH, int attn_block) {
  return (size_t)B * (size_t)NH * 2 * (size_t)kern_cpu_size_block(attn_block, T) * (size_t)T;
}

#endif

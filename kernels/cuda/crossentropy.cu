/* crossentropy: softmax cross-entropy over rows of V logits (ld apart), the formulas of
 * kernels/cpu/crossentropy.c. Forward: one block per row turns the logits
 * into probabilities in place in two passes over the row (the logits are
 * B*T*V floats, the largest thing a step streams): the first reads it once
 * for its maximum and sum together (each thread keeps a running maximum and
 * its sum of e^(x - max), rescaled by e^(old - new) when the maximum grows;
 * the threads' pairs are then combined in a fixed tree), the second writes
 * e^(x - max) * (1/sum) by kern_expf; losses = log(sum) - (x[target] - max).
 * The sum's rounding is not the CPU's (TOL_RED apart). Backward:
 * dlogits = (p - onehot(target)) * dloss in place (the CPU's bits), a block
 * row per row (kern_cuda_rows_grid: no index divided by V). fwd_bwd: the
 * forward kernel writing (p rounded) * dloss in its second pass, the bits of
 * forward then backward, one pass over the logits less (with -fmad=false, as
 * every file here: a fused multiply-add of p * dloss would not round p).
 * fwd_bwd_bf16: the same, the gradient rounded to bf16 (the bits the LM
 * head's product would pack) into the row's second half, so the product
 * reads it as it is: its second pass walks the row from its end, a barrier
 * between reading an element and writing the bf16 that covers it (a bf16 at
 * element j of the second half lies over float ld/2 + j/2 >= j, read in this
 * or an earlier turn).
 *
 * Where a row fits in a block's shared memory (V + 32 floats within the
 * device's opt-in limit: V = 50257 on 9.0's 227 KiB; on 8.0's 163 KiB,
 * V up to 41,696), every form is
 * ce_row_kernel instead: a block of 1024 threads, one an SM, reads the row
 * once into shared memory (where the rows are aligned by cp.async, 16
 * bytes a copy, a thread's every copy in flight at once: loads into
 * registers had one in flight a thread, each waiting for the store before
 * it), finding its maximum; then e^(x - max) stored over it and summed, each
 * thread its own elements in a fixed order, the threads' sums in the fixed
 * tree; then the outputs from the stored e^(x - max), with no barrier turns
 * (the row in memory is not read again). One exponential an element instead
 * of two, one read of the row from memory instead of two. The same formulas
 * (p = e * (1/sum), rounded, then times dloss), the sum in another order than
 * the streaming kernel's: every form takes the same kernel for the same V, so
 * fwd_bwd stays forward then backward, bit for bit. In the bf16 mode
 * (kern_cuda_opts_t.bf16: the dlogits are rounded to bf16 for the product)
 * the exponential is the special function unit's (kern_cuda_exp2_approx of
 * (x - max) log2(e): about 2 ulp, plus the argument's rounding, |x - max|
 * ulp at most), not kern_expf's 25 instructions: the kernel was bound by
 * issuing them. fp32 jobs keep kern_expf. */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

#define CE_THREADS 512 /* a multiple of 32, at most 1024 */

/* The block's max (op 0) or sum (op 1) of v, in a fixed tree; every thread
 * gets it. sh holds one value per warp. */
__device__ static float ce_block_reduce(float v, int op, float *sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  v = op ? kern_cuda_warp_sum(v) : kern_cuda_warp_max(v);
  __syncthreads(); /* sh may still be read from a previous call */
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : (op ? 0.0f : -INFINITY);
  return op ? kern_cuda_warp_sum(r) : kern_cuda_warp_max(r);
}

/* bwd 1: the row's dlogits instead of its probabilities, 2: the same in
 * bf16 in the row's second half (see above) */
__global__ static void crossentropy_fwd_kernel(float *losses, float *logits, const int32_t *targets,
                                               int V, int64_t ld, int bwd, float dloss) {
  __shared__ float sh[32];
  float *x = logits + (int64_t)blockIdx.x * ld;
  /* x[target] is read by every thread now, before any thread overwrites it
   * (the reductions below hold a barrier before the first write) */
  const int t = targets[blockIdx.x];
  const float xt = x[t];
  /* pass 1: this thread's running maximum and sum of e^(x - max) */
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = x[j];
    if (v > m) {
      s = m == -INFINITY ? 0.0f : s * kern_expf(m - v);
      m = v;
    }
    if (m != -INFINITY) s += kern_expf(v - m); /* m is -inf only while every x was */
  }
  const float mx = ce_block_reduce(m, 0, sh);
  s = m == -INFINITY ? 0.0f : s * kern_expf(m - mx); /* this thread's sum, at the row's max */
  s = ce_block_reduce(s, 1, sh);
  /* pass 2: the probabilities */
  const float inv = 1.0f / s;
  if (!bwd) {
    for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = kern_expf(x[j] - mx) * inv;
  } else if (bwd == 2) {
    uint16_t *o = (uint16_t *)x + ld;
    for (int turn = (V + blockDim.x - 1) / blockDim.x - 1; turn >= 0; turn--) {
      const int j = turn * blockDim.x + threadIdx.x;
      float g = 0.0f;
      if (j < V) {
        const float p = kern_expf(x[j] - mx) * inv;
        g = j == t ? (p - 1.0f) * dloss : p * dloss;
      }
      __syncthreads(); /* every float of this turn read before a bf16 covers one */
      if (j < V) o[j] = kern_f32_to_bf16(g);
    }
  } else {
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float p = kern_expf(x[j] - mx) * inv;
      x[j] = j == t ? (p - 1.0f) * dloss : p * dloss;
    }
  }
  /* -log p[target], taken from the sum: finite even where p[target] is 0 */
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) - (xt - mx);
}

#define CE_ROW_THREADS 1024
#define CE_ROW_SCRATCH 32 /* floats before the row in shared memory: the reductions' */

/* The dynamic shared memory ce_row_kernel takes for a row of V */
static size_t ce_row_smem(int V) { return ((size_t)V + CE_ROW_SCRATCH) * sizeof(float); }

/* The output of element j, e = e^(x[j] - max): the probability, or (bwd) the
 * gradient, as crossentropy_fwd_kernel forms them */
__device__ __forceinline__ float ce_out(float e, float inv, int j, int t, int bwd, float dloss) {
  const float p = e * inv;
  return !bwd ? p : j == t ? (p - 1.0f) * dloss : p * dloss;
}

/* e^(x - mx): kern_expf's bits, or (fast) the special function unit's */
__device__ __forceinline__ float ce_exp(float x, float mx, int fast) {
  return fast ? kern_cuda_exp2_approx((x - mx) * 1.44269504088896341f) : kern_expf(x - mx);
}

/* One row a block, through shared memory (the file's comment); wide: the
 * rows are 16-byte aligned (logits and ld), for 16-byte loads and stores;
 * fast: the bf16 mode's exponential */
__global__ static void __launch_bounds__(CE_ROW_THREADS)
    ce_row_kernel(float *losses, float *logits, const int32_t *targets, int V, int64_t ld, int bwd,
                  float dloss, int wide, int fast) {
  extern __shared__ float4 ce_smem[];
  float *sh = (float *)ce_smem, *row = sh + CE_ROW_SCRATCH;
  float4 *row4 = (float4 *)row;
  float *x = logits + (int64_t)blockIdx.x * ld;
  const int t = targets[blockIdx.x], V4 = V / 4;
  /* x[target] from memory now: pass 3 writes there only after two barriers,
   * while the shared copy is overwritten by e^(x - max) in pass 2, which
   * other threads may start before this one reads it */
  const float xt = x[t];
  /* pass 1: the row into shared memory, and this thread's maximum */
  float m = -INFINITY;
  if (wide) {
    /* every 16 bytes of the thread's share in flight at once */
    for (int c = threadIdx.x; c < V4; c += blockDim.x) kern_cuda_cp_async(row4 + c, x + 4 * c, true);
    kern_cuda_cp_commit();
    kern_cuda_cp_wait<0>(); /* the thread's own copies, which it alone reads here */
    for (int c = threadIdx.x; c < V4; c += blockDim.x) {
      const float4 v = row4[c];
      m = v.x > m ? v.x : m, m = v.y > m ? v.y : m, m = v.z > m ? v.z : m, m = v.w > m ? v.w : m;
    }
    for (int j = 4 * V4 + threadIdx.x; j < V; j += blockDim.x) {
      row[j] = x[j];
      m = row[j] > m ? row[j] : m;
    }
  } else {
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      row[j] = x[j];
      m = row[j] > m ? row[j] : m;
    }
  }
  const float mx = ce_block_reduce(m, 0, sh); /* a barrier: the row is in */
  /* pass 2: e^(x - max) over the row, and this thread's sum of them, its
   * elements in order (4 a turn, then the tail) */
  float s = 0.0f;
  for (int c = threadIdx.x; c < V4; c += blockDim.x) {
    float4 v = row4[c];
    v.x = ce_exp(v.x, mx, fast), v.y = ce_exp(v.y, mx, fast);
    v.z = ce_exp(v.z, mx, fast), v.w = ce_exp(v.w, mx, fast);
    s += v.x, s += v.y, s += v.z, s += v.w;
    row4[c] = v;
  }
  for (int j = 4 * V4 + threadIdx.x; j < V; j += blockDim.x) {
    row[j] = ce_exp(row[j], mx, fast);
    s += row[j];
  }
  s = ce_block_reduce(s, 1, sh); /* a barrier: every e stored */
  const float inv = 1.0f / s;
  /* pass 3: the outputs */
  if (bwd == 2) { /* bf16, 8 a store, in the row's second half */
    uint16_t *o = (uint16_t *)x + ld;
    const int V8 = V / 8;
    for (int c = threadIdx.x; c < V8; c += blockDim.x) {
      const float4 a = row4[2 * c], b = row4[2 * c + 1];
      const int j = 8 * c;
      kern_cuda_store_u16x8(
          o + j, kern_cuda_bf16x8(make_float4(ce_out(a.x, inv, j, t, 1, dloss), ce_out(a.y, inv, j + 1, t, 1, dloss),
                                              ce_out(a.z, inv, j + 2, t, 1, dloss), ce_out(a.w, inv, j + 3, t, 1, dloss)),
                                  make_float4(ce_out(b.x, inv, j + 4, t, 1, dloss), ce_out(b.y, inv, j + 5, t, 1, dloss),
                                              ce_out(b.z, inv, j + 6, t, 1, dloss), ce_out(b.w, inv, j + 7, t, 1, dloss))));
    }
    for (int j = 8 * V8 + threadIdx.x; j < V; j += blockDim.x)
      o[j] = kern_f32_to_bf16(ce_out(row[j], inv, j, t, 1, dloss));
  } else if (wide) {
    for (int c = threadIdx.x; c < V4; c += blockDim.x) {
      const float4 e = row4[c];
      const int j = 4 * c;
      kern_cuda_store_f32x4(x + j, make_float4(ce_out(e.x, inv, j, t, bwd, dloss), ce_out(e.y, inv, j + 1, t, bwd, dloss),
                                               ce_out(e.z, inv, j + 2, t, bwd, dloss), ce_out(e.w, inv, j + 3, t, bwd, dloss)));
    }
    for (int j = 4 * V4 + threadIdx.x; j < V; j += blockDim.x) x[j] = ce_out(row[j], inv, j, t, bwd, dloss);
  } else {
    for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = ce_out(row[j], inv, j, t, bwd, dloss);
  }
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) - (xt - mx);
}

/* ---- bf16 logits (kern.h's crossentropy_fwd_bwd_bf16in) --------------------
 * The LM head's product wrote the logits in bf16 (matmul_fwd_bf16_out16):
 * half the bytes to read, and the row in shared memory half the room, so
 * two blocks share an SM (one at fp32: its loads and its arithmetic did not
 * overlap). ce_row16_kernel is ce_row_kernel's bf16 mode on the logits
 * widened, bit for bit (a NaN's payload aside: the fast mode rounds its
 * bf16 by cvt, a fifth of the kernel's instructions by count, against the
 * casts' integer code): each thread the same elements in the same order
 * (the sum's 4 a turn, then the tail), the same exponential; e^(x - max) is
 * taken again in the last pass instead of stored (the row stays bf16), the
 * same value. Its outputs, the bf16 dlogits, go over the logits in place
 * (the row was read whole into shared memory before). Rows that do not fit
 * take the streaming kernel on bf16 (crossentropy_fwd_kernel's form: its
 * bits, not the row kernel's). */

__device__ __forceinline__ float ce_x16(uint16_t h) { return kern_bf16_to_f32(h); }
/* The low (0) or high (1) bf16 of a 32-bit word, widened */
__device__ __forceinline__ float ce_half(uint32_t w, int hi) {
  return ce_x16((uint16_t)(hi ? w >> 16 : w & 0xffffu));
}

/* One row a block, in bf16 (above); wide: rows 16-byte aligned. Two
 * blocks an SM: 32 registers a thread. */
__global__ static void __launch_bounds__(CE_ROW_THREADS, 2)
    ce_row16_kernel(float *losses, uint16_t *logits, const int32_t *targets, int V, int64_t ld,
                    float dloss, int wide, int fast) {
  extern __shared__ float4 ce_smem[];
  float *sh = (float *)ce_smem;
  uint16_t *row = (uint16_t *)(sh + CE_ROW_SCRATCH);
  uint16_t *x = logits + (int64_t)blockIdx.x * ld;
  const int t = targets[blockIdx.x], V4 = V / 4, V8 = V / 8;
  const float xt = ce_x16(x[t]); /* before any thread writes the row (two barriers) */
  /* pass 1: the row into shared memory, and this thread's maximum */
  float m = -INFINITY;
  if (wide) {
    for (int c = threadIdx.x; c < V8; c += blockDim.x) kern_cuda_cp_async(row + 8 * c, x + 8 * c, true);
    kern_cuda_cp_commit();
    kern_cuda_cp_wait<0>();
    for (int c = threadIdx.x; c < V8; c += blockDim.x) {
      const uint4 v = *(const uint4 *)(row + 8 * c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const float lo = ce_half(w[k], 0), hi = ce_half(w[k], 1);
        m = lo > m ? lo : m, m = hi > m ? hi : m;
      }
    }
    for (int j = 8 * V8 + threadIdx.x; j < V; j += blockDim.x) {
      row[j] = x[j];
      m = ce_x16(row[j]) > m ? ce_x16(row[j]) : m;
    }
  } else {
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      row[j] = x[j];
      m = ce_x16(row[j]) > m ? ce_x16(row[j]) : m;
    }
  }
  const float mx = ce_block_reduce(m, 0, sh); /* a barrier: the row is in */
  /* pass 2: this thread's sum of e^(x - max), ce_row_kernel's elements and order */
  float s = 0.0f;
  for (int c = threadIdx.x; c < V4; c += blockDim.x) { /* 8 bytes a load: no bank conflict */
    const uint2 r = *(const uint2 *)(row + 4 * c);
    s += ce_exp(ce_half(r.x, 0), mx, fast), s += ce_exp(ce_half(r.x, 1), mx, fast);
    s += ce_exp(ce_half(r.y, 0), mx, fast), s += ce_exp(ce_half(r.y, 1), mx, fast);
  }
  for (int j = 4 * V4 + threadIdx.x; j < V; j += blockDim.x) s += ce_exp(ce_x16(row[j]), mx, fast);
  s = ce_block_reduce(s, 1, sh);
  const float inv = 1.0f / s;
  /* pass 3: the bf16 gradient over the row, from the shared copy */
  const int v8 = wide ? V8 : 0;
  for (int c = threadIdx.x; c < v8; c += blockDim.x) {
    const uint4 r = *(const uint4 *)(row + 8 * c);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
    const int j = 8 * c;
    float g[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
      g[k] = ce_out(ce_exp(ce_half(w[k / 2], k % 2), mx, fast), inv, j + k, t, 1, dloss);
    const float4 lo = make_float4(g[0], g[1], g[2], g[3]), hi = make_float4(g[4], g[5], g[6], g[7]);
    /* the fast mode's rounding by cvt: the same bits, a NaN's payload aside */
    kern_cuda_store_u16x8(x + j, fast ? kern_cuda_bf16x8_rn(lo, hi) : kern_cuda_bf16x8(lo, hi));
  }
  for (int j = 8 * v8 + threadIdx.x; j < V; j += blockDim.x)
    x[j] = kern_f32_to_bf16(ce_out(ce_exp(ce_x16(row[j]), mx, fast), inv, j, t, 1, dloss));
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) - (xt - mx);
}

/* The streaming form on bf16 logits: crossentropy_fwd_kernel's two passes
 * (kern_expf), the bf16 gradient in place, each element written by the
 * thread that read it */
__global__ static void crossentropy_fwd16_kernel(float *losses, uint16_t *logits,
                                                 const int32_t *targets, int V, int64_t ld,
                                                 float dloss) {
  __shared__ float sh[32];
  uint16_t *x = logits + (int64_t)blockIdx.x * ld;
  const int t = targets[blockIdx.x];
  const float xt = ce_x16(x[t]);
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = ce_x16(x[j]);
    if (v > m) {
      s = m == -INFINITY ? 0.0f : s * kern_expf(m - v);
      m = v;
    }
    if (m != -INFINITY) s += kern_expf(v - m);
  }
  const float mx = ce_block_reduce(m, 0, sh);
  s = m == -INFINITY ? 0.0f : s * kern_expf(m - mx);
  s = ce_block_reduce(s, 1, sh);
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = kern_expf(ce_x16(x[j]) - mx) * inv;
    x[j] = kern_f32_to_bf16(j == t ? (p - 1.0f) * dloss : p * dloss);
  }
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) - (xt - mx);
}

/* The dynamic shared memory ce_row16_kernel takes for a row of V */
static size_t ce_row16_smem(int V) {
  return CE_ROW_SCRATCH * sizeof(float) + (((size_t)V + 7) & ~(size_t)7) * sizeof(uint16_t);
}

extern "C" void kern_cuda_crossentropy_fwd_bwd_bf16in(float *losses, uint16_t *logits16,
                                                      const int32_t *targets, float dloss, int N,
                                                      int V, int ld) {
  if (N <= 0 || V <= 0) return;
  KERN_CUDA_ASSERT(ld >= V && ld % 8 == 0);
  const size_t smem = ce_row16_smem(V);
  if (smem <= kern_cuda_st.smem_optin) {
    static int asked; /* all of the opt-in limit */
    kern_cuda_smem_allow(ce_row16_kernel, kern_cuda_st.smem_optin, &asked);
    ce_row16_kernel<<<N, CE_ROW_THREADS, smem, kern_cuda_st.stream>>>(
        losses, logits16, targets, V, (int64_t)ld, dloss, kern_cuda_aligned16(logits16),
        kern_cuda_st.bf16);
  } else {
    crossentropy_fwd16_kernel<<<N, CE_THREADS, 0, kern_cuda_st.stream>>>(losses, logits16, targets,
                                                                          V, (int64_t)ld, dloss);
  }
  KERN_CUDA_LAUNCHED();
}

/* Every form's launch: ce_row_kernel where the row fits in shared memory,
 * else the streaming kernel */
static void ce_launch(float *losses, float *logits, const int32_t *targets, int N, int V, int ld,
                      int bwd, float dloss) {
  const size_t smem = ce_row_smem(V);
  if (smem <= kern_cuda_st.smem_optin) {
    static int asked; /* all of the opt-in limit */
    kern_cuda_smem_allow(ce_row_kernel, kern_cuda_st.smem_optin, &asked);
    const int wide = kern_cuda_aligned16(logits) && ld % 4 == 0;
    ce_row_kernel<<<N, CE_ROW_THREADS, smem, kern_cuda_st.stream>>>(losses, logits, targets, V,
                                                                    (int64_t)ld, bwd, dloss, wide,
                                                                    kern_cuda_st.bf16);
  } else {
    crossentropy_fwd_kernel<<<N, CE_THREADS, 0, kern_cuda_st.stream>>>(losses, logits, targets, V,
                                                                        (int64_t)ld, bwd, dloss);
  }
  KERN_CUDA_LAUNCHED();
}

__global__ static void crossentropy_bwd_kernel(float *probs, const int32_t *targets, float dloss,
                                               int N, int V, int64_t ld) {
  for (int64_t r = blockIdx.y; r < N; r += gridDim.y) {
    float *p = probs + r * ld;
    const int t = targets[r];
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < V; j += gridDim.x * blockDim.x)
      p[j] = j == t ? (p[j] - 1.0f) * dloss : p[j] * dloss;
  }
}

extern "C" void kern_cuda_crossentropy_fwd(float *losses, float *logits, const int32_t *targets,
                                           int N, int V, int ld) {
  if (N <= 0 || V <= 0) return;
  KERN_CUDA_ASSERT(ld >= V);
  ce_launch(losses, logits, targets, N, V, ld, 0, 0.0f);
}

extern "C" void kern_cuda_crossentropy_fwd_bwd(float *losses, float *logits,
                                               const int32_t *targets, float dloss, int N, int V,
                                               int ld) {
  if (N <= 0 || V <= 0) return;
  KERN_CUDA_ASSERT(ld >= V);
  ce_launch(losses, logits, targets, N, V, ld, 1, dloss);
}

extern "C" void kern_cuda_crossentropy_fwd_bwd_bf16(float *losses, float *logits,
                                                    const int32_t *targets, float dloss, int N,
                                                    int V, int ld) {
  if (N <= 0 || V <= 0) return;
  KERN_CUDA_ASSERT(ld >= V && ld % 8 == 0 && kern_cuda_aligned16(logits));
  ce_launch(losses, logits, targets, N, V, ld, 2, dloss);
}

extern "C" void kern_cuda_crossentropy_bwd(float *probs, const int32_t *targets, float dloss, int N,
                                           int V, int ld) {
  if (N <= 0 || V <= 0) return;
  KERN_CUDA_ASSERT(ld >= V);
  crossentropy_bwd_kernel<<<kern_cuda_rows_grid(N, V), kern_cuda_rows_threads(V), 0,
                            kern_cuda_st.stream>>>(probs, targets, dloss, N, V, (int64_t)ld);
  KERN_CUDA_LAUNCHED();
}

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
 * or an earlier turn). */
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
  crossentropy_fwd_kernel<<<N, CE_THREADS, 0, kern_cuda_st.stream>>>(losses, logits, targets, V,
                                                                      (int64_t)ld, 0, 0.0f);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_crossentropy_fwd_bwd(float *losses, float *logits,
                                               const int32_t *targets, float dloss, int N, int V,
                                               int ld) {
  if (N <= 0 || V <= 0) return;
  KERN_CUDA_ASSERT(ld >= V);
  crossentropy_fwd_kernel<<<N, CE_THREADS, 0, kern_cuda_st.stream>>>(losses, logits, targets, V,
                                                                      (int64_t)ld, 1, dloss);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_crossentropy_fwd_bwd_bf16(float *losses, float *logits,
                                                    const int32_t *targets, float dloss, int N,
                                                    int V, int ld) {
  if (N <= 0 || V <= 0) return;
  KERN_CUDA_ASSERT(ld >= V && ld % 8 == 0 && kern_cuda_aligned16(logits));
  crossentropy_fwd_kernel<<<N, CE_THREADS, 0, kern_cuda_st.stream>>>(losses, logits, targets, V,
                                                                      (int64_t)ld, 2, dloss);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_crossentropy_bwd(float *probs, const int32_t *targets, float dloss, int N,
                                           int V, int ld) {
  if (N <= 0 || V <= 0) return;
  KERN_CUDA_ASSERT(ld >= V);
  crossentropy_bwd_kernel<<<kern_cuda_rows_grid(N, V), kern_cuda_rows_threads(V), 0,
                            kern_cuda_st.stream>>>(probs, targets, dloss, N, V, (int64_t)ld);
  KERN_CUDA_LAUNCHED();
}

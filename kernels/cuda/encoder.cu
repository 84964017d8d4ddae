/* encoder: token + position embedding, out[b,t] = wte[tok[b,t]] + wpe[t], and
 * its backward into dwte and dwpe, without atomics.
 *
 * A token may repeat within the batch, so dwte's rows cannot be split by
 * position. As on the CPU, each element dwte[v][c] has one owner that adds
 * its terms in the CPU's order (positions t, then b): the CPU's bits. The
 * owner is a warp lane: a warp takes 32 columns and one of ENC_PARTS classes
 * of token ids (tok % ENC_PARTS), reads 32 positions' tokens at a time,
 * and for each position of its class, in order, adds that position's 32
 * columns of dout into its token's row of dwte (one 128-byte read and write
 * a position). Before, a thread owned a column and read every position's
 * token one at a time: 1.75 ms of a gpt2-124m step on an H200 (B=16, T=1024),
 * latency-bound on 16384 dependent steps a thread.
 * dwpe is a separate kernel, one thread per (t, c) summing over b in order. */
#include "kernels/cuda/cuda_impl.h"

#define ENC_PARTS 32 /* warps per 32 columns of dwte, each a class of token ids */
#define ENC_THREADS 128

/* (wte and wpe fp32, or their bf16 images, widened as read: encoder_fwd16) */
template <typename W>
__global__ static void encoder_fwd_kernel(float *out, const int32_t *tok, const W *wte,
                                          const W *wpe, int T, int C, size_t n) {
  KERN_CUDA_FOR(i, n) {
    const size_t bt = i / (size_t)C, c = i % (size_t)C, t = bt % (size_t)T;
    out[i] = kern_cuda_f32<W>(wte[(size_t)tok[bt] * C + c]) + kern_cuda_f32<W>(wpe[t * C + c]);
  }
}

/* dwpe[t][c] += dout[b][t][c] for b = 0..B-1 */
__global__ static void encoder_bwd_wpe_kernel(float *dwpe, const float *dout, int B, int T, int C) {
  const size_t n = (size_t)T * C;
  KERN_CUDA_FOR(i, n) {
    const size_t t = i / (size_t)C, c = i % (size_t)C;
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dout[((size_t)b * T + t) * C + c];
    dwpe[i] = acc;
  }
}

/* warp (32 columns from c0, part): dwte[v][c] += dout[b][t][c] for every
 * position (t, then b) in order whose token v is of its part */
__global__ static void encoder_bwd_wte_kernel(float *dwte, const float *dout, const int32_t *tok,
                                              int B, int T, int C) {
  const int lane = threadIdx.x % 32;
  const int c = (blockIdx.x * (ENC_THREADS / 32) + threadIdx.x / 32) * 32 + lane;
  const uint32_t part = blockIdx.y;
  const int n = B * T;
  for (int k0 = 0; k0 < n; k0 += 32) { /* warp-uniform: every lane reaches the ballot */
    const int k = k0 + lane, b = k % B, t = k / B;
    const int64_t bt = (int64_t)b * T + t;
    const int32_t v = k < n ? tok[bt] : 0;
    unsigned mine = __ballot_sync(0xffffffffu, k < n && (uint32_t)v % ENC_PARTS == part);
    while (mine) {
      const int src = __ffs((int)mine) - 1;
      mine &= mine - 1;
      const int32_t vs = __shfl_sync(0xffffffffu, v, src);
      const int64_t bs = __shfl_sync(0xffffffffu, bt, src);
      if (c < C) dwte[(size_t)vs * C + c] += dout[(size_t)bs * C + c];
    }
  }
}

template <typename W>
static void encoder_fwd_any(float *out, const int32_t *tok, const W *wte, const W *wpe, int B,
                            int T, int C) {
  const size_t n = (size_t)(B > 0 ? B : 0) * (size_t)(T > 0 ? T : 0) * (size_t)(C > 0 ? C : 0);
  if (!n) return;
  encoder_fwd_kernel<W><<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                          kern_cuda_st.stream>>>(out, tok, wte, wpe, T, C, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_encoder_fwd(float *out, const int32_t *tok, const float *wte,
                                      const float *wpe, int B, int T, int C) {
  encoder_fwd_any(out, tok, wte, wpe, B, T, C);
}

/* from the bf16 images: no widening of the embeddings (a third of
 * gpt2-124m's parameters) at each gather of unit 0 (fsdp.c) */
extern "C" void kern_cuda_encoder_fwd16(float *out, const int32_t *tok, const uint16_t *wte16,
                                        const uint16_t *wpe16, int B, int T, int C) {
  encoder_fwd_any(out, tok, wte16, wpe16, B, T, C);
}

extern "C" void kern_cuda_encoder_bwd(float *dwte, float *dwpe, const float *dout,
                                      const int32_t *tok, int B, int T, int C) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  const size_t n = (size_t)T * C;
  encoder_bwd_wpe_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                           kern_cuda_st.stream>>>(dwpe, dout, B, T, C);
  KERN_CUDA_LAUNCHED();
  const int warps = (C + 31) / 32; /* a warp 32 columns */
  const dim3 grid((unsigned)((warps + ENC_THREADS / 32 - 1) / (ENC_THREADS / 32)), ENC_PARTS);
  encoder_bwd_wte_kernel<<<grid, ENC_THREADS, 0, kern_cuda_st.stream>>>(dwte, dout, tok, B, T, C);
  KERN_CUDA_LAUNCHED();
}

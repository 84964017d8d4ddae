/* encoder: token + position embedding, out[b,t] = wte[tok[b,t]] + wpe[t], and
 * its backward into dwte and dwpe, without atomics.
 *
 * A token may repeat within the batch, so dwte's rows cannot be split by
 * position. As on the CPU, a thread owns a column c and walks the positions
 * in the CPU's order (t, then b), adding dout into dwte[tok][c]; for more
 * threads than channels, ENC_PARTS threads share a column, each taking only
 * the tokens with tok % ENC_PARTS equal to its part. Every element of dwte
 * still has one owner and sees its terms in the CPU's order: the CPU's bits.
 * dwpe is a separate kernel, one thread per (t, c) summing over b in order. */
#include "kernels/cuda/cuda_impl.h"

#define ENC_PARTS 32 /* threads per column of dwte, each a class of token ids */
#define ENC_THREADS 128

__global__ static void encoder_fwd_kernel(float *out, const int32_t *tok, const float *wte,
                                          const float *wpe, int T, int C, size_t n) {
  KERN_CUDA_FOR(i, n) {
    const size_t bt = i / (size_t)C, c = i % (size_t)C, t = bt % (size_t)T;
    out[i] = wte[(size_t)tok[bt] * C + c] + wpe[t * C + c];
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

/* thread (c, part): dwte[v][c] += dout[b][t][c] for every position (t, b) in
 * order whose token v is of its part */
__global__ static void encoder_bwd_wte_kernel(float *dwte, const float *dout, const int32_t *tok,
                                              int B, int T, int C) {
  const int c = blockIdx.x * ENC_THREADS + threadIdx.x;
  const uint32_t part = blockIdx.y;
  if (c >= C) return;
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++) {
      const size_t bt = (size_t)b * T + t;
      const int32_t v = tok[bt];
      if ((uint32_t)v % ENC_PARTS != part) continue;
      dwte[(size_t)v * C + c] += dout[bt * C + c];
    }
}

extern "C" void kern_cuda_encoder_fwd(float *out, const int32_t *tok, const float *wte,
                                      const float *wpe, int B, int T, int C) {
  const size_t n = (size_t)(B > 0 ? B : 0) * (size_t)(T > 0 ? T : 0) * (size_t)(C > 0 ? C : 0);
  if (!n) return;
  encoder_fwd_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                       kern_cuda_st.stream>>>(out, tok, wte, wpe, T, C, n);
  KERN_CUDA_LAUNCHED();
}

extern "C" void kern_cuda_encoder_bwd(float *dwte, float *dwpe, const float *dout,
                                      const int32_t *tok, int B, int T, int C) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  const size_t n = (size_t)T * C;
  encoder_bwd_wpe_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                           kern_cuda_st.stream>>>(dwpe, dout, B, T, C);
  KERN_CUDA_LAUNCHED();
  const dim3 grid((unsigned)((C + ENC_THREADS - 1) / ENC_THREADS), ENC_PARTS);
  encoder_bwd_wte_kernel<<<grid, ENC_THREADS, 0, kern_cuda_st.stream>>>(dwte, dout, tok, B, T, C);
  KERN_CUDA_LAUNCHED();
}

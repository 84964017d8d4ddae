/* colsum: column sums over rows, in kern_math.h's order (KERN_COLSUM_ROWS):
 * matmul's dbias and layernorm's dw and db, the CPU's bits
 * (kern_cpu_colsum).
 *
 * A block owns 32 columns, a lane each; its COLSUM_WARPS warps each sum one
 * run of KERN_COLSUM_ROWS rows at a time (a row's 32 columns are one
 * coalesced read), and the first warp adds the runs' sums to its columns in
 * row order through shared memory, COLSUM_WARPS runs a round. No atomics and
 * no scratch: one writer per column. */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

#define COLSUM_WARPS 16

__global__ static void __launch_bounds__(COLSUM_WARPS * 32)
    colsum_kernel(float *sd, float *sdx, const float *dout, const float *inp, const float *mean,
                  const float *rstd, int N, int C) {
  __shared__ float shd[COLSUM_WARPS][32], shx[COLSUM_WARPS][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c = blockIdx.x * 32 + lane;
  const bool on = c < C;
  float ad = on ? sd[c] : 0.0f, ax = on && sdx ? sdx[c] : 0.0f;
  const int runs = (N + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
  for (int j0 = 0; j0 < runs; j0 += COLSUM_WARPS) {
    const int j = j0 + warp;
    float pd = 0.0f, px = 0.0f;
    if (on && j < runs) {
      const int n1 = N - j * KERN_COLSUM_ROWS < KERN_COLSUM_ROWS ? N : (j + 1) * KERN_COLSUM_ROWS;
      for (int n = j * KERN_COLSUM_ROWS; n < n1; n++) {
        const int64_t i = (int64_t)n * C + c;
        const float d = dout[i];
        pd += d;
        if (sdx) px += d * (inp[i] - mean[n]) * rstd[n];
      }
    }
    shd[warp][lane] = pd;
    shx[warp][lane] = px;
    __syncthreads();
    if (warp == 0) {
      const int nw = runs - j0 < COLSUM_WARPS ? runs - j0 : COLSUM_WARPS;
      for (int w = 0; w < nw; w++) {
        ad += shd[w][lane];
        ax += shx[w][lane];
      }
    }
    __syncthreads();
  }
  if (warp == 0 && on) {
    sd[c] = ad;
    if (sdx) sdx[c] = ax;
  }
}

void kern_cuda_colsum(float *sd, float *sdx, const float *dout, const float *inp,
                      const float *mean, const float *rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  colsum_kernel<<<(C + 31) / 32, COLSUM_WARPS * 32, 0, kern_cuda_st.stream>>>(sd, sdx, dout, inp,
                                                                            mean, rstd, N, C);
  KERN_CUDA_LAUNCHED();
}

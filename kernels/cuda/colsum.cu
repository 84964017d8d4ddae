/* colsum: column sums over rows, in kern_math.h's order (KERN_COLSUM_ROWS):
 * matmul's dbias and layernorm's dw and db, the CPU's bits
 * (kern_cpu_colsum).
 *
 * Two stages: a warp sums one run of KERN_COLSUM_ROWS rows for 32 columns, a
 * lane each (a row's 32 columns are one coalesced read), all runs at once,
 * into scratch; then a thread per column adds the runs' sums to it in row
 * order (a block 16 columns, a tile of up to 512 runs at a time through
 * shared memory). No atomics; one writer per column. matmul.cu's joint backward
 * makes the first stage's sums of dout as it packs it (gemm_pack_colsum)
 * and adds them with kern_cuda_colsum_add, block of rows by block: the same
 * order; so does gelu.cu's backward into bf16 (kern_cuda_pack_colsum, cuda_impl.h,
 * serves both). */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

#define COLSUM_WARPS 16

/* Stage 1: the sum of every run alone for columns [c0, c0 + cs) of dout (N,
 * C): partial[j][c - c0], and the dw terms' at partial + runs * cs; a warp a
 * run of 32 columns, every run at once, so every SM reads. */

/* (dout of T: fp32, or bf16 widened as it is read) */
template <typename T>
__global__ static void __launch_bounds__(COLSUM_WARPS * 32)
    colsum_runs_kernel(float *partial, const T *dout, const float *inp, const float *mean,
                       const float *rstd, int N, int64_t ld, int c0, int cs, int with_x) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int k = blockIdx.x * 32 + lane; /* the slice's column */
  const int runs = (N + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
  const int j = blockIdx.y * COLSUM_WARPS + warp;
  if (k >= cs || j >= runs) return;
  float pd = 0.0f, px = 0.0f;
  const int n1 = N - j * KERN_COLSUM_ROWS < KERN_COLSUM_ROWS ? N : (j + 1) * KERN_COLSUM_ROWS;
  for (int n = j * KERN_COLSUM_ROWS; n < n1; n++) {
    const int64_t i = n * ld + c0 + k;
    const float d = kern_cuda_f32<T>(dout[i]);
    pd += d;
    if (with_x) px += d * (inp[i] - mean[n]) * rstd[n];
  }
  partial[(int64_t)j * cs + k] = pd;
  if (with_x) partial[((int64_t)runs + j) * cs + k] = px;
}

/* Stage 2: a block COLSUM_ADD_COLS columns: its warps read a tile of up to
 * COLSUM_ADD_TILE runs' sums into shared memory (every load of the tile in
 * flight at once: 16 a thread), then the first COLSUM_ADD_COLS threads, one
 * a column, add them to the column's sum in row order; tile by tile. A
 * training step's runs (512 at N = 16384) are one tile. (Before: 32
 * columns a block and tiles of 128 runs, so 4 rounds of loading then
 * adding, and 24 blocks for 768 columns: about 12 us a call, 109 calls
 * and 1.3 ms a gpt2-124m step on an H200, 2026-11-28. A thread a column
 * reading the runs itself had a few loads in flight.) */
#define COLSUM_ADD_TILE 512
#define COLSUM_ADD_COLS 16
#define COLSUM_ADD_THREADS 512
__global__ static void __launch_bounds__(COLSUM_ADD_THREADS)
    colsum_add_kernel(float *sd, float *sdx, const float *partial, int runs, int cs) {
  __shared__ float tile[COLSUM_ADD_TILE][COLSUM_ADD_COLS];
  const int c = threadIdx.x % COLSUM_ADD_COLS, row = threadIdx.x / COLSUM_ADD_COLS;
  const int k = blockIdx.x * COLSUM_ADD_COLS + c;
  const bool adder = threadIdx.x < COLSUM_ADD_COLS && k < cs;
  for (int half = 0; half < (sdx ? 2 : 1); half++) {
    float *out = half ? sdx : sd;
    const float *p = partial + (half ? (int64_t)runs * cs : 0);
    float a = adder ? out[k] : 0.0f;
    for (int j0 = 0; j0 < runs; j0 += COLSUM_ADD_TILE) {
      const int nj = runs - j0 < COLSUM_ADD_TILE ? runs - j0 : COLSUM_ADD_TILE;
#pragma unroll
      for (int i = 0; i < COLSUM_ADD_TILE * COLSUM_ADD_COLS / COLSUM_ADD_THREADS; i++) {
        const int j = i * (COLSUM_ADD_THREADS / COLSUM_ADD_COLS) + row;
        if (j < nj) tile[j][c] = k < cs ? p[(int64_t)(j0 + j) * cs + k] : 0.0f;
      }
      __syncthreads();
      if (adder) {
#pragma unroll 8
        for (int j = 0; j < nj; j++) a += tile[j][c];
      }
      __syncthreads(); /* the tile read before the next overwrites it */
    }
    if (adder) out[k] = a;
  }
}

void kern_cuda_colsum_add(float *sd, float *sdx, const float *partial, int runs, int cs) {
  if (runs <= 0 || cs <= 0) return;
  colsum_add_kernel<<<(cs + COLSUM_ADD_COLS - 1) / COLSUM_ADD_COLS, COLSUM_ADD_THREADS, 0,
                      kern_cuda_st.stream>>>(sd, sdx, partial, runs, cs);
  KERN_CUDA_LAUNCHED();
}

/* The runs' sums live in the packing buffers (matmul.cu's, idle between
 * products: one stream), as many columns at a time as fit there. */
int kern_cuda_colsum_slice(int runs, int per_run, int C) {
  const size_t room = 2 * KERN_CUDA_SIZE_PACK_ELEMS * sizeof(uint16_t) / sizeof(float);
  const size_t per_col = (size_t)runs * per_run;
  const int cs = room / per_col >= (size_t)C ? C : (int)(room / per_col) & ~31;
  KERN_CUDA_ASSERT(cs >= 32 || cs == C); /* N below 2^23 rows */
  return cs;
}

template <typename T>
static void colsum_any(float *sd, float *sdx, const T *dout, const float *inp, const float *mean,
                       const float *rstd, int N, int C, int64_t ld) {
  if (N <= 0 || C <= 0) return;
  const int runs = (N + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
  const int cs = kern_cuda_colsum_slice(runs, sdx ? 2 : 1, C);
  float *partial = (float *)kern_cuda_st.pack;
  for (int c0 = 0; c0 < C; c0 += cs) {
    const int n = C - c0 < cs ? C - c0 : cs;
    const dim3 grid((unsigned)((n + 31) / 32), (unsigned)((runs + COLSUM_WARPS - 1) / COLSUM_WARPS));
    colsum_runs_kernel<T><<<grid, COLSUM_WARPS * 32, 0, kern_cuda_st.stream>>>(
        partial, dout, inp, mean, rstd, N, ld, c0, n, sdx != NULL);
    KERN_CUDA_LAUNCHED();
    kern_cuda_colsum_add(sd + c0, sdx ? sdx + c0 : NULL, partial, runs, n);
  }
}

void kern_cuda_colsum(float *sd, float *sdx, const float *dout, const float *inp,
                      const float *mean, const float *rstd, int N, int C, int64_t ld) {
  colsum_any(sd, sdx, dout, inp, mean, rstd, N, C, ld);
}

void kern_cuda_colsum16(float *sd, const uint16_t *dout16, int N, int C, int64_t ld) {
  colsum_any(sd, (float *)NULL, dout16, (const float *)NULL, (const float *)NULL,
             (const float *)NULL, N, C, ld);
}

/* sumsq: sum of squares of a float array in double (gradient norms for
 * clipping), and the plain double sum behind vec_sum: kern_cuda_sum_f64.
 *
 * Two stages in a fixed order that depends on n only (not on the GPU): a
 * grid of min(KERN_CUDA_SIZE_REDUCE_BLOCKS, ceil(n / 256)) blocks of 256
 * threads, thread t of the grid summing x[t], x[t + grid], ... in turn, each
 * block adding its threads in a fixed tree into one partial in the reserved
 * scratch; then one block adds the partials in a fixed tree. The result is
 * copied back and the call waits for it (the host reads it). */
#include "kernels/cuda/cuda_impl.h"

#define SUM_THREADS 256
#define SUM_FINAL_THREADS 1024 /* >= KERN_CUDA_SIZE_REDUCE_BLOCKS */

static_assert(SUM_FINAL_THREADS >= KERN_CUDA_SIZE_REDUCE_BLOCKS, "one final thread per partial");

/* The block's sum of v in a fixed tree, valid in thread 0. */
__device__ static double sum_block(double v) {
  __shared__ double sh[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  v = kern_cuda_warp_sum_f64(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) v = kern_cuda_warp_sum_f64(lane < nw ? sh[lane] : 0.0);
  return v;
}

__global__ static void sum_partial_kernel(double *partial, const float *x, size_t n, int square) {
  double s = 0.0;
  KERN_CUDA_FOR(i, n) {
    const double v = x[i];
    s += square ? v * v : v;
  }
  s = sum_block(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ static void sum_final_kernel(double *out, const double *partial, int count) {
  const double v = (int)threadIdx.x < count ? partial[threadIdx.x] : 0.0;
  const double s = sum_block(v);
  if (threadIdx.x == 0) *out = s;
}

double kern_cuda_sum_f64(const float *x, size_t n, int square) {
  if (!n) return 0.0;
  size_t nb = (n + SUM_THREADS - 1) / SUM_THREADS;
  const int blocks = nb > KERN_CUDA_SIZE_REDUCE_BLOCKS ? KERN_CUDA_SIZE_REDUCE_BLOCKS : (int)nb;
  double *partial = kern_cuda_st.reduce, *result = partial + KERN_CUDA_SIZE_REDUCE_BLOCKS;
  sum_partial_kernel<<<blocks, SUM_THREADS, 0, kern_cuda_st.stream>>>(partial, x, n, square);
  KERN_CUDA_LAUNCHED();
  sum_final_kernel<<<1, SUM_FINAL_THREADS, 0, kern_cuda_st.stream>>>(result, partial, blocks);
  KERN_CUDA_LAUNCHED();
  double s = 0.0;
  KERN_CUDA_CHECK(
      cudaMemcpyAsync(&s, result, sizeof s, cudaMemcpyDeviceToHost, kern_cuda_st.stream));
  KERN_CUDA_CHECK(cudaStreamSynchronize(kern_cuda_st.stream));
  return s;
}

extern "C" double kern_cuda_sumsq(const float *x, size_t n) { return kern_cuda_sum_f64(x, n, 1); }

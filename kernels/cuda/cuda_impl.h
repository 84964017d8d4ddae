/* cuda_impl: private header of the CUDA backend (the .cu files of kernels/cuda).
 *
 * Declares the kern_cuda_* functions that backend.cu gathers into the table
 * (one op per .cu file; semantics in kernels/kern.h), the state made at
 * kern_cuda_init (stream, cuBLASLt handle and workspace, reduction scratch),
 * the check macros and the launch helpers the files share. Nothing outside
 * kernels/cuda includes this.
 *
 * Every file here is compiled by nvcc with -fmad=false (the Makefile's rule
 * for kernels/cuda): no fused multiply-adds, so kern_math.h's formulas give
 * the bits gcc gives the CPU kernels (gcc in ISO C mode contracts nothing).
 * Division and sqrtf stay IEEE-rounded (nvcc's defaults, no --use_fast_math). */
#ifndef FSDP_KERN_CUDA_IMPL_H
#define FSDP_KERN_CUDA_IMPL_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/size.h"
#include "kernels/kern_math.h"

/* ---- errors -----------------------------------------------------------------
 * A failed CUDA or cuBLAS call inside an op is not recoverable (cuda.h): it
 * prints the op (the enclosing function), the call, the library's error
 * string and the place, then aborts. One generator for both status types
 * (ggml's CUDA_CHECK_GEN): the success value and the function that names an
 * error are its arguments. Kernels run asynchronously, so an error raised
 * while a kernel runs is reported by the next checked call, which may belong
 * to a later op; build with -DKERN_CUDA_SYNC_CHECK to synchronize after every
 * launch and name the kernel that failed. */
[[noreturn]] void kern_cuda_fail(const char *op, const char *call, long code, const char *what,
                                 const char *file, int line);

#define KERN_CUDA_CHECK_GEN(call, ok, name_fn)                                                     \
  do {                                                                                             \
    const auto kc_err_ = (call);                                                                   \
    if (kc_err_ != (ok))                                                                           \
      kern_cuda_fail(__func__, #call, (long)kc_err_, name_fn(kc_err_), __FILE__, __LINE__);        \
  } while (0)

#define KERN_CUDA_CHECK(call) KERN_CUDA_CHECK_GEN(call, cudaSuccess, cudaGetErrorString)
#define KERN_CUBLAS_CHECK(call)                                                                    \
  KERN_CUDA_CHECK_GEN(call, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString)

/* After every kernel launch: a bad configuration fails here, at its op. */
#ifdef KERN_CUDA_SYNC_CHECK
#define KERN_CUDA_LAUNCHED()                                                                       \
  do {                                                                                             \
    KERN_CUDA_CHECK(cudaGetLastError());                                                           \
    KERN_CUDA_CHECK(cudaStreamSynchronize(kern_cuda_st.stream));                                   \
  } while (0)
#else
#define KERN_CUDA_LAUNCHED() KERN_CUDA_CHECK(cudaGetLastError())
#endif

/* A broken invariant (a programmer error) stops with file and line. */
#define KERN_CUDA_ASSERT(cond)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fsdp: cuda kernel assertion failed in %s: %s (%s:%d)\n", __func__, #cond,   \
              __FILE__, __LINE__);                                                                 \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* ---- the backend's state (backend.cu), set once by kern_cuda_init --------- */
typedef struct kern_cuda_state {
  int ready;           /* 1 after a successful kern_cuda_init */
  int device;          /* the selected ordinal */
  int tf32;            /* matrix products may use TF32 tensor cores */
  int bf16;            /* matrix products on bf16 tensor cores (wins over tf32) */
  int attn_gemm;       /* attention by strided products even where a fused kernel is built */
  int attn_fp32;       /* with bf16: the fused attention stays fp32 (not attention_tc.cu) */
  int acts_fp32;       /* with bf16: no bf16 activations offered (backend.cu's tables) */
  int dinp_fp32;       /* with bf16: no matmul_bwd_dinp16 offered (backend.cu's tables) */
  int gelu_exact;      /* with bf16: the bf16 activations' GELU is kern_gelu's (gelu.cu) */
  int attn_cudnn;      /* with bf16: the bf16 attention ops by cuDNN (cudnn.cu), opened */
  cudaStream_t stream; /* every op and memory operation, in call order */
  cublasLtHandle_t lt; /* cuBLASLt */
  void *workspace;     /* KERN_CUDA_SIZE_WORKSPACE bytes, cuBLASLt's */
  double *reduce;      /* KERN_CUDA_SIZE_REDUCE_BLOCKS partials + the final sum */
  uint16_t *pack;      /* 2 x KERN_CUDA_SIZE_PACK_ELEMS bf16: the products' packed operands */
  float *colsum;       /* KERN_CUDA_SIZE_COLSUM_FLOATS: the joint backward's dbias runs */
  cudaMemPool_t pool;  /* dev_alloc_step's device memory, in stream order */
  long live;           /* buffers of dev_alloc and dev_alloc_step not yet freed */
  int fast16bf;        /* bf16 products on the fp32 operands (CUBLAS_COMPUTE_32F_FAST_16BF) */
  int gemm_algo;       /* the place in cuBLASLt's heuristic ranking each product takes (matmul.cu) */
  char name[256];      /* cudaDeviceProp.name */
  size_t memory;       /* cudaDeviceProp.totalGlobalMem */
  size_t smem_optin;   /* cudaDeviceProp.sharedMemPerBlockOptin: a block's shared memory, asked for */
  unsigned long gelu_passes; /* products whose GELU (or its backward) cuBLASLt refused: the
                              * pass after ran instead (matmul.cu's gemm_lt_bias) */
} kern_cuda_state_t;

extern kern_cuda_state_t kern_cuda_st;

/* Lets kernel take up to smem bytes of dynamic shared memory (past the 48
 * KiB a launch gets unasked) and asks for the SM's largest shared-memory
 * carveout; once (*asked), as the backend keeps the device its first
 * kern_cuda_init selected for the life of the process (cudaFuncSetAttribute
 * holds for the current device). */
template <typename K> static void kern_cuda_smem_allow(K kernel, size_t smem, int *asked) {
  if (*asked) return;
  KERN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  KERN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       (int)cudaSharedmemCarveoutMaxShared));
  *asked = 1;
}

/* ---- launch helpers ---------------------------------------------------------
 * Element-wise kernels walk [0, n) in grid-stride loops, so any n fits in a
 * grid capped at KERN_CUDA_MAX_BLOCKS; callers return before launching when
 * there is nothing to do (a grid of 0 blocks is an error). */
#define KERN_CUDA_THREADS 256
#ifdef FSDP_CUDA_EMU_H
/* On the emulator a small cap, so the tests' sizes take every grid-stride
 * loop through several turns (on a GPU only past 16.7M elements: AdamW's
 * second turn, a shard of gpt2-124m) */
#define KERN_CUDA_MAX_BLOCKS 37u
#else
#define KERN_CUDA_MAX_BLOCKS 65535u
#endif

static inline unsigned kern_cuda_blocks(size_t n, unsigned threads) {
  size_t b = (n + threads - 1) / threads;
  return b > KERN_CUDA_MAX_BLOCKS ? KERN_CUDA_MAX_BLOCKS : (unsigned)(b ? b : 1);
}

/* The launch of a kernel over rows of a matrix (rows x cols): a block row
 * (y) per matrix row, up to 8 blocks (x) along it, so no thread divides an
 * index by a row length; kern_cuda_rows_threads threads a block, fewer than
 * KERN_CUDA_THREADS for a narrow row (an attention head's 64 columns would
 * leave 3 of 4 threads idle). The kernel loops over rows (gridDim.y apart)
 * and columns (gridDim.x * blockDim.x apart). */
static inline unsigned kern_cuda_rows_threads(int64_t cols) {
  if (cols >= KERN_CUDA_THREADS) return KERN_CUDA_THREADS;
  return cols <= 32 ? 32 : (unsigned)(cols + 31) / 32 * 32;
}
static inline dim3 kern_cuda_rows_grid(int64_t rows, int64_t cols) {
  const int64_t t = kern_cuda_rows_threads(cols), x = (cols + t - 1) / t;
  return dim3((unsigned)(x > 8 ? 8 : x < 1 ? 1 : x),
              (unsigned)(rows > KERN_CUDA_MAX_BLOCKS ? KERN_CUDA_MAX_BLOCKS : rows < 1 ? 1 : rows));
}

#define KERN_CUDA_FOR(i, n)                                                                        \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n);                  \
       i += (size_t)gridDim.x * blockDim.x)

/* An element read as fp32: a float as it is, a bf16 (uint16 storage)
 * widened (exact): for kernels that take either. */
template <typename T> __device__ __forceinline__ float kern_cuda_f32(T v);
template <> __device__ __forceinline__ float kern_cuda_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float kern_cuda_f32<uint16_t>(uint16_t v) {
  return kern_bf16_to_f32(v);
}

/* ---- wide accesses ----------------------------------------------------------
 * The memory-bound kernels (the casts, the products' packing) move 16 bytes
 * per load or store: one float or one bf16 a thread issues 4 or 8 times the
 * memory instructions for the same bytes, and keeps fewer bytes in flight.
 * A 16-byte access needs a 16-byte aligned address (a GPU stops the kernel
 * with a misaligned-address error), so callers test their pointers with
 * kern_cuda_aligned16 and take scalar code where it fails; the emulator
 * checks every wide access (KERN_CUDA_WIDE_CHECK, cuda_emu.h: aligned, and
 * inside one device buffer). */
#ifndef KERN_CUDA_WIDE_CHECK
#define KERN_CUDA_WIDE_CHECK(p) ((void)0)
#endif
#ifndef KERN_CUDA_WIDE_CHECK8
#define KERN_CUDA_WIDE_CHECK8(p) ((void)0)
#endif

__host__ __device__ __forceinline__ bool kern_cuda_aligned16(const void *p) {
  return !((uintptr_t)p & 15);
}

__device__ __forceinline__ float4 kern_cuda_load_f32x4(const float *p) {
  KERN_CUDA_WIDE_CHECK(p);
  return *(const float4 *)p;
}

/* The same through the read-only path (ld.global.nc): for data no thread
 * of the kernel writes, so the compiler may issue it ahead of the stores
 * before it (a plain load waits behind any store that may alias it). */
__device__ __forceinline__ float4 kern_cuda_load_f32x4_ro(const float *p) {
  KERN_CUDA_WIDE_CHECK(p);
#ifdef FSDP_CUDA_EMU_H
  return *(const float4 *)p;
#else
  return __ldg((const float4 *)p);
#endif
}

__device__ __forceinline__ void kern_cuda_store_f32x4(float *p, float4 v) {
  KERN_CUDA_WIDE_CHECK(p);
  *(float4 *)p = v;
}

/* 8 uint16 (bf16) as a uint4: element 2k in the low half of word k (the GPU,
 * like x86, is little-endian) */
__device__ __forceinline__ uint4 kern_cuda_load_u16x8(const uint16_t *p) {
  KERN_CUDA_WIDE_CHECK(p);
  return *(const uint4 *)p;
}

__device__ __forceinline__ void kern_cuda_store_u16x8(uint16_t *p, uint4 v) {
  KERN_CUDA_WIDE_CHECK(p);
  *(uint4 *)p = v;
}

/* 4 uint16 (bf16) as a uint2, an 8-byte load: p 8-byte aligned */
__device__ __forceinline__ uint2 kern_cuda_load_u16x4(const uint16_t *p) {
  KERN_CUDA_WIDE_CHECK8(p);
  return *(const uint2 *)p;
}

/* 4 uint16 (bf16) as a uint2, an 8-byte store: p 8-byte aligned */
__device__ __forceinline__ void kern_cuda_store_u16x4(uint16_t *p, uint2 v) {
  KERN_CUDA_WIDE_CHECK8(p);
  *(uint2 *)p = v;
}

/* Elements of esize bytes from p to its next 16-byte boundary: the head an
 * element-wise kernel does one a thread before its 16-byte accesses, which
 * need every array's boundary at that same element (the caller checks each
 * with kern_cuda_aligned16(x + head)). */
static inline size_t kern_cuda_head16(const void *p, size_t esize) {
  return (size_t)(-(uintptr_t)p & 15) / esize;
}

/* The walk of a wide element-wise kernel over [0, n): wide(j) for each
 * group of W elements starting at j = head + W i (16-byte aligned there:
 * the launcher checked, kern_cuda_head16), grid-stride; one(i) for the head
 * (i < head < W) and the tail after the last whole group (fewer than W),
 * by the grid's first threads (a grid has at least one block of at least W
 * threads). n >= head + W. */
template <int W, typename Wide, typename One>
__device__ __forceinline__ void kern_cuda_for_wide(size_t n, size_t head, Wide wide, One one) {
  const size_t groups = (n - head) / W, rest = head + groups * W;
  KERN_CUDA_FOR(i, groups) wide(head + W * i);
  const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < head) one(t);
  if (t < n - rest) one(rest + t);
}

/* lo and hi rounded to bf16 (kern_f32_to_bf16, as the scalar code rounds
 * them) in one word, lo in the low half: a uint4 of four is 8 in order */
__device__ __forceinline__ uint32_t kern_cuda_bf16x2(float lo, float hi) {
  return (uint32_t)kern_f32_to_bf16(lo) | (uint32_t)kern_f32_to_bf16(hi) << 16;
}

/* kern_cuda_bf16x2 in one cvt.rn.bf16x2.f32: nearest even as
 * kern_f32_to_bf16, but a NaN the hardware's canonical one (its payload
 * and sign not kept); for the kernels that need not the CPU's bits */
__device__ __forceinline__ uint32_t kern_cuda_bf16x2_rn(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

/* the two bf16 of a word (kern_cuda_bf16x2's layout) widened, the low first */
__device__ __forceinline__ float2 kern_cuda_f32x2(uint32_t w) {
  return make_float2(kern_bf16_to_f32((uint16_t)w), kern_bf16_to_f32((uint16_t)(w >> 16)));
}

/* a and b (8 floats, a first) as 8 bf16 in kern_cuda_load_u16x8's layout */
__device__ __forceinline__ uint4 kern_cuda_bf16x8(float4 a, float4 b) {
  return make_uint4(kern_cuda_bf16x2(a.x, a.y), kern_cuda_bf16x2(a.z, a.w),
                    kern_cuda_bf16x2(b.x, b.y), kern_cuda_bf16x2(b.z, b.w));
}

/* The same by four cvt.rn.bf16x2 (kern_cuda_bf16x2_rn): the same bits but
 * a NaN's, for the kernels that need not the CPU's */
__device__ __forceinline__ uint4 kern_cuda_bf16x8_rn(float4 a, float4 b) {
  return make_uint4(kern_cuda_bf16x2_rn(a.x, a.y), kern_cuda_bf16x2_rn(a.z, a.w),
                    kern_cuda_bf16x2_rn(b.x, b.y), kern_cuda_bf16x2_rn(b.z, b.w));
}

/* 2^x on the special function unit (ex2.approx: about 2 ulp, 2^-inf = +0,
 * subnormals flushed); exp2f on the emulator */
__device__ __forceinline__ float kern_cuda_exp2_approx(float x) {
#ifdef FSDP_CUDA_EMU_H
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

/* 1 / x on the special function unit (rcp.approx: within 1 ulp; a subnormal
 * result flushed to 0, so 1 / x is 0 past |x| = 2^126); 1.0f / x on the
 * emulator */
__device__ __forceinline__ float kern_cuda_rcp_approx(float x) {
#ifdef FSDP_CUDA_EMU_H
  return 1.0f / x;
#else
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

/* cp.async: 16 bytes from src (device memory) into dst (shared memory),
 * 16-byte aligned both, without passing through registers, so a thread has
 * every copy it issues in flight at once; zeros where !valid (a source size
 * of 0: src is then any mapped address, not read). The copy lands by a
 * later kern_cuda_cp_wait (visible to the thread that issued it; to the
 * block's other threads after a barrier); its group is closed by
 * kern_cuda_cp_commit. On the emulator the copy lands only at the wait
 * (emu::cp_async), so a tile read before its wait and barrier fails the
 * tests. The issue has no memory clobber (the wait has): the compiler may
 * move plain accesses across it, so a caller never touches a destination
 * between its copy and the wait. */
__device__ __forceinline__ void kern_cuda_cp_async(void *dst, const void *src, bool valid) {
#ifdef FSDP_CUDA_EMU_H
  emu::cp_async(dst, src, 16, valid ? 16 : 0);
#else
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  const size_t s = __cvta_generic_to_global(src);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(s), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void kern_cuda_cp_commit(void) {
#ifdef FSDP_CUDA_EMU_H
  emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/* Waits for the thread's copies of every group committed but the N latest. */
template <int N> __device__ __forceinline__ void kern_cuda_cp_wait(void) {
#ifdef FSDP_CUDA_EMU_H
  emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* Sums and maxima over a warp by butterfly (xor) exchanges: every lane ends
 * with the same value, formed in the same fixed tree whatever the data (a + b
 * and b + a round alike), so results do not vary from run to run. */
__device__ __forceinline__ float kern_cuda_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double kern_cuda_warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* max as the CPU kernels take it (a compare, not fmaxf) */
__device__ __forceinline__ float kern_cuda_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

/* ---- matrix products (matmul.cu) --------------------------------------------
 * Row-major, as kern_cpu_sgemm: C (M, N) = alpha op(A) op(B) + beta C with
 * op(A) (M, K), op(B) (K, N), ta/tb 'N' or 'T'; batch > 1 repeats it on
 * A + i*sA, B + i*sB, C + i*sC (strides in floats). Through cublasLtMatmul
 * on the backend's stream; op names the caller in error messages. */
void kern_cuda_gemm(const char *op, char ta, char tb, int M, int N, int K, float alpha,
                    const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb,
                    int64_t sB, float beta, float *C, int64_t ldc, int64_t sC, int batch);

/* ---- GELU (gelu.cu) -----------------------------------------------------------
 * out = bf16(gelu(inp + bias[c])) over N rows of C bf16, rows ld apart (C
 * and ld multiples of 8, inp and out 16-byte aligned; bias NULL: none),
 * as gelu_fwd_bf16in; grad: out = bf16(gelu'(inp + bias[c]) out) instead.
 * The products' GELU where cuBLASLt's epilogues do not serve (matmul.cu). */
void kern_cuda_gelu_rows16(uint16_t *out, const uint16_t *inp, const float *bias, int N, int C,
                           int64_t ld, int grad);

/* ---- column sums (colsum.cu) --------------------------------------------------
 * sd[c] += the sum over the N rows of dout (N, C; rows ld apart, inp's too),
 * and, where sdx is not
 * NULL, sdx[c] += the sum of dout (inp - mean[n]) rstd[n]; in kern_math.h's
 * order (KERN_COLSUM_ROWS), the CPU's bits. */
void kern_cuda_colsum(float *sd, float *sdx, const float *dout, const float *inp,
                      const float *mean, const float *rstd, int N, int C, int64_t ld);
/* sd[c] += the sum over the N rows of dout16 (bf16, widened; rows ld apart),
 * in the same order. */
void kern_cuda_colsum16(float *sd, const uint16_t *dout16, int N, int C, int64_t ld);
/* The second stage alone: sd[c] += partial[j * cs + c] for runs j in order
 * (the first stage's sums of cs columns, made elsewhere in its order), and
 * where sdx is not NULL sdx[c] += partial[(runs + j) * cs + c] likewise. */
void kern_cuda_colsum_add(float *sd, float *sdx, const float *partial, int runs, int cs);

/* The columns a slice of the first stage's sums takes at once: all C, or
 * as many (a multiple of 32) as fit runs x per_run sums a column in the
 * packing buffers (colsum.cu's room for them). */
int kern_cuda_colsum_slice(int runs, int per_run, int C);

/* The first stage of a column sum over a matrix made on the way, and the
 * matrix packed to bf16 (matmul.cu's dout, gelu.cu's dinp): for rows [0,
 * rows) and columns [0, cols), dst[n dld + j] = bf16(x(n, j)) (as the casts
 * round) and partial[run cols + j] = the sum of x(n, j) over the run's
 * KERN_COLSUM_ROWS rows from zero, row by row (colsum.cu's order). A block
 * (KERN_PACK_COLSUM_THREADS threads, kern_cuda_pack_colsum_grid) takes a
 * run's rows by KERN_PACK_COLSUM_TILE columns in two phases: its threads
 * make the tile's elements, 4 columns of a row each at a time (four(n, j)
 * as a float4 where wide says x's 4 elements from (n, j) may be loaded so,
 * else one(n, j) an element), store them to dst (8 bytes at once where st8
 * says dst's rows allow) and keep them fp32 in shared memory; then a thread
 * a column sums the run's rows in order from zero. The rows of a tile are
 * made in parallel, the sums alone in order: with a thread owning a
 * column's 32 rows end to end (before 2026-11-28) GELU's backward took 79
 * registers, 3 blocks an SM, and moved its bytes at half the fp32 form's
 * rate on an H200. A thread loads all its rows of a run before it stores
 * any (dst must not overlap what four and one read). */
#define KERN_PACK_COLSUM_TILE 256
#define KERN_PACK_COLSUM_THREADS 256
static inline dim3 kern_cuda_pack_colsum_grid(int rows, int cols) {
  const int runs = (rows + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
  return dim3((unsigned)((cols + KERN_PACK_COLSUM_TILE - 1) / KERN_PACK_COLSUM_TILE),
              (unsigned)(runs < (int)KERN_CUDA_MAX_BLOCKS ? runs : KERN_CUDA_MAX_BLOCKS));
}
template <typename Four, typename One>
__device__ __forceinline__ void kern_cuda_pack_colsum(uint16_t *dst, int64_t dld, float *partial,
                                                      int rows, int cols, bool wide, bool st8,
                                                      Four four, One one) {
  __shared__ __align__(16) float tile[KERN_COLSUM_ROWS][KERN_PACK_COLSUM_TILE];
  const int runs = (rows + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS;
  const int q = threadIdx.x % (KERN_PACK_COLSUM_TILE / 4),
            r0 = threadIdx.x / (KERN_PACK_COLSUM_TILE / 4);
  const int j0 = blockIdx.x * KERN_PACK_COLSUM_TILE, j = j0 + 4 * q;
  const bool whole = j + 4 <= cols;
  /* a thread's rows of a run: every load first, then every store, so that
   * its PER loads are in flight at once (with a store between them the
   * compiler must keep each load after the store before it, which may
   * alias: one load in flight a thread, a third of the memory's rate) */
  constexpr int STEP = KERN_PACK_COLSUM_THREADS / (KERN_PACK_COLSUM_TILE / 4),
                PER = KERN_COLSUM_ROWS / STEP;
  static_assert(KERN_COLSUM_ROWS % STEP == 0, "a run's rows in whole steps");
  for (int run = blockIdx.y; run < runs; run += gridDim.y) {
    const int n0 = run * KERN_COLSUM_ROWS,
              nr = rows - n0 < KERN_COLSUM_ROWS ? rows - n0 : KERN_COLSUM_ROWS;
    float4 v[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int r = r0 + i * STEP;
      const int64_t n = n0 + r;
      v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r >= nr) continue;
      if (wide && whole) {
        v[i] = four(n, j);
      } else {
        float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = 0; k < 4 && j + k < cols; k++) e[k] = one(n, j + k);
        v[i] = make_float4(e[0], e[1], e[2], e[3]);
      }
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const int r = r0 + i * STEP;
      if (r >= nr) continue;
      uint16_t *d = dst + (int64_t)(n0 + r) * dld + j;
      if (st8 && whole) {
        kern_cuda_store_u16x4(d, make_uint2(kern_cuda_bf16x2(v[i].x, v[i].y),
                                            kern_cuda_bf16x2(v[i].z, v[i].w)));
      } else {
        const float e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
        for (int k = 0; k < 4 && j + k < cols; k++) d[k] = kern_f32_to_bf16(e[k]);
      }
      *(float4 *)&tile[r][4 * q] = v[i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < KERN_PACK_COLSUM_TILE && j0 + c < cols; c += blockDim.x) {
      float sum = 0.0f;
      for (int r = 0; r < nr; r++) sum += tile[r][c];
      partial[(int64_t)run * cols + j0 + c] = sum;
    }
    __syncthreads(); /* the tile is the next run's */
  }
}

/* ---- attention on bf16 tensor cores (attention_tc.cu) -------------------------
 * The fused op of attention.cu (same saved log-sum-exp, same scratch) with
 * its products in bf16; 1 when launched, 0 when no kernel is built for the
 * head size C / NH (attention.cu's fused list) or its shared memory is more
 * than this GPU gives a block (then the fp32 kernels serve). qkv16: where
 * forward rounds qkv (the caller keeps it) and backward reads it (qkv then
 * unused), or NULL: the scratch's copy. out in fp32 (out) or bf16 (out16,
 * each element forward's fp32 rounded), one of the two. */
int kern_cuda_attention_tc_fwd(float *out, uint16_t *out16, float *lse, float *scratch,
                               const float *qkv, uint16_t *qkv16, int B, int T, int C, int NH);
int kern_cuda_attention_tc_bwd(float *dqkv, uint16_t *dqkv16, float *scratch, const float *dout,
                               const uint16_t *dout16, const float *qkv, const uint16_t *qkv16,
                               const float *out, const uint16_t *out16, const float *lse, int B,
                               int T, int C, int NH, int acc);

/* ---- double sums in a fixed order (sumsq.cu) --------------------------------
 * sum of x[i] (square 0) or x[i]^2 (square 1), in double; waits for the
 * stream and returns it. The order depends on n only. */
double kern_cuda_sum_f64(const float *x, size_t n, int square);

/* ---- the ops, one file each ------------------------------------------------ */
extern "C" {
void kern_cuda_encoder_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe,
                           int B, int T, int C);
void kern_cuda_encoder_fwd16(float *out, const int32_t *tok, const uint16_t *wte16,
                            const uint16_t *wpe16, int B, int T, int C);
void kern_cuda_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B,
                           int T, int C);

void kern_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                             const float *b, int N, int C);
void kern_cuda_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C);

void kern_cuda_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N,
                          int IC, int OC, int ldo);
void kern_cuda_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                          const float *w, int N, int IC, int OC, int ldo, int acc);

void kern_cuda_attention_fwd(float *out, float *att, float *scratch, const float *qkv, int B,
                             int T, int C, int NH);
void kern_cuda_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *out, const float *att, int B, int T, int C, int NH, int acc);
size_t kern_cuda_attention_saved(int B, int T, int C, int NH);
size_t kern_cuda_attention_scratch(int B, int T, int C, int NH);

void kern_cuda_gelu_fwd(float *out, const float *inp, size_t n);
void kern_cuda_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n, int acc);

void kern_cuda_residual_fwd(float *out, const float *a, const float *b, size_t n);
void kern_cuda_residual_bwd(float *da, float *db, const float *dout, size_t n);

void kern_cuda_crossentropy_fwd(float *losses, float *logits, const int32_t *targets, int N, int V,
                                int ld);
void kern_cuda_crossentropy_bwd(float *probs, const int32_t *targets, float dloss, int N, int V,
                                int ld);
void kern_cuda_crossentropy_fwd_bwd(float *losses, float *logits, const int32_t *targets,
                                    float dloss, int N, int V, int ld);

void kern_cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float wd, int t);
void kern_cuda_adamw_segs(float *p, uint16_t *p16, const float *g, float *m, float *v,
                          const kern_seg_t *seg, int nseg, float lr, float beta1, float beta2,
                          float eps, float wd, int t);
void kern_cuda_adamw_segs_scaled(float *p, uint16_t *p16, const float *g, float gscale, float *m,
                                 float *v, const kern_seg_t *seg, int nseg, float lr, float beta1,
                                 float beta2, float eps, float wd, int t);

void kern_cuda_f32_to_bf16(uint16_t *out, const float *inp, size_t n);
void kern_cuda_bf16_to_f32(float *out, const uint16_t *inp, size_t n);
void kern_cuda_bf16_to_f32_segs(float *out, const uint16_t *inp, const kern_seg_t *seg, int nseg);

double kern_cuda_sumsq(const float *x, size_t n);

/* bf16 activations (kern.h), offered in bf16 mode only (backend.cu) */
void kern_cuda_layernorm_fwd_bf16(uint16_t *out, float *mean, float *rstd, const float *inp,
                                  const float *w, const float *b, int N, int C);
void kern_cuda_gelu_fwd_bf16(uint16_t *out, const float *inp, size_t n);
void kern_cuda_gelu_bwd_bf16(uint16_t *dinp16, float *dbias, const float *inp, const float *dout,
                             int N, int C);
void kern_cuda_gelu_fwd_bf16in(uint16_t *out, const uint16_t *inp, const float *bias, int N, int C);
void kern_cuda_gelu_bwd_bf16in(uint16_t *dinp16, float *dbias, const uint16_t *inp,
                               const float *bias, const float *dout, const uint16_t *dout16, int N,
                               int C);
void kern_cuda_matmul_fwd_bf16(float *out, const uint16_t *inp, const float *w, const uint16_t *w16,
                               const float *bias, int N, int IC, int OC, int ldo);
void kern_cuda_matmul_bwd_bf16(float *dinp, float *dw, float *dbias, const float *dout,
                               const uint16_t *dout16, const uint16_t *inp, const float *w,
                               const uint16_t *w16, int N, int IC, int OC, int ldo, int acc);
void kern_cuda_matmul_bwd_dinp16(uint16_t *dinp16, float *dw, float *dbias, const float *dout,
                                 const float *inp, const uint16_t *inp16, const float *w,
                                 const uint16_t *w16, int N, int IC, int OC);
void kern_cuda_matmul_fwd_res(float *out, const float *inp, const uint16_t *inp16, const float *w,
                              const uint16_t *w16, const float *bias, const float *res, int N,
                              int IC, int OC);
void kern_cuda_crossentropy_fwd_bwd_bf16(float *losses, float *logits, const int32_t *targets,
                                         float dloss, int N, int V, int ld);
void kern_cuda_matmul_fwd_bf16_out16(uint16_t *out, const uint16_t *inp, const float *w,
                                     const uint16_t *w16, const uint16_t *bias16, int N, int IC,
                                     int OC, int ldo);
void kern_cuda_matmul_bwd_dgelu16(uint16_t *dinp16, float *dw, float *dbias, const float *dout,
                                  const uint16_t *inp16, const float *w, const uint16_t *w16,
                                  const uint16_t *pre16, int N, int IC, int OC);
void kern_cuda_matmul_fwd_bf16_gelu(uint16_t *out16, uint16_t *pre16, const uint16_t *inp,
                                    const float *w, const uint16_t *w16, const uint16_t *bias16,
                                    int N, int IC, int OC);
void kern_cuda_crossentropy_fwd_bwd_bf16in(float *losses, uint16_t *logits16,
                                           const int32_t *targets, float dloss, int N, int V,
                                           int ld);
int kern_cuda_attention_bf16_fits(int C, int NH);
size_t kern_cuda_attention_scratch_bf16(int B, int T, int C, int NH);
void kern_cuda_attention_fwd_bf16(uint16_t *out16, float *att, float *scratch, const float *qkv,
                                  uint16_t *qkv16, int B, int T, int C, int NH);
void kern_cuda_attention_bwd_bf16(float *dqkv, float *scratch, const float *dout,
                                  const uint16_t *dout16, const uint16_t *qkv16,
                                  const uint16_t *out16, const float *att, int B, int T, int C,
                                  int NH, int acc);
void kern_cuda_attention_bwd_dqkv16(uint16_t *dqkv16, float *scratch, const float *dout,
                                   const uint16_t *dout16, const uint16_t *qkv16,
                                   const uint16_t *out16, const float *att, int B, int T, int C,
                                   int NH);
void kern_cuda_layernorm_bwd16(float *dinp, uint16_t *dinp16, float *dsums, float *dw, float *db,
                               const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C);
void kern_cuda_matmul_bwd16(uint16_t *dinp16, float *dw, float *dbias, const uint16_t *dout16,
                            const float *dsums, const uint16_t *inp16, const float *w,
                            const uint16_t *w16, const uint16_t *pre16, int N, int IC, int OC);
}

#endif

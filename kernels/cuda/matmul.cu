/* matmul: the linear layer, out = inp @ w^T + bias, and its backward, with
 * the products done by cuBLASLt in fp32 (TF32 when kern_cuda_opts_t.tf32,
 * bf16 tensor cores with fp32 accumulation when .bf16: bf16-mixed jobs, the
 * operands packed to bf16 first, see gemm_bf16_packed).
 * Also owns kern_cuda_gemm, the one place that calls cublasLtMatmul.
 *
 * cuBLASLt is column-major; a row-major matrix is the column-major view of
 * its transpose, so row-major C = op(A) op(B) is computed as column-major
 * C^T = op(B)^T op(A)^T: the operands swap, their flags stay. Descriptors
 * are made and destroyed per call (host memory only: no device allocation
 * in an op), and the algorithm comes from cuBLASLt's heuristic each time,
 * told the true alignment of every pointer (its default assumes 256 bytes,
 * which views into qkv and odd widths do not have). Batched calls may
 * interleave their matrices (attention's heads: stride hs inside rows of
 * 3C); -DKERN_CUDA_GEMM_NO_BATCH makes one call per matrix instead, to rule
 * that out when debugging.
 *
 * The bias (forward) is added by the product itself (cuBLASLt's BIAS
 * epilogue: D = A B + bias, in the product's one write of D, where the CPU
 * writes the product and adds the bias in a second pass over it), or, where
 * cuBLASLt has no algorithm with it or the bias is less than 16-byte
 * aligned (cuBLASLt has been seen to fail at run time below that), by a
 * pass after the product; dbias is a column sum in the CPU's order
 * (kern_cuda_colsum: the same bits). */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/kern_math.h"

/* The largest power of two, up to 256, dividing the pointer, the leading
 * dimension and the batch stride in bytes (elements of esize bytes): what
 * every matrix of the call is aligned to. */
static uint32_t gemm_align(const void *p, int64_t ld, int64_t stride, int batch, size_t esize) {
  uint64_t x = (uint64_t)(uintptr_t)p | (uint64_t)ld * esize;
  if (batch > 1) x |= (uint64_t)stride * esize;
  uint32_t a = 256;
  while (a > (uint32_t)esize && (x & (a - 1))) a >>= 1;
  return a;
}

/* Bytes of an element of type t (fp32 or bf16). */
static size_t gemm_esize(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

/* A column-major layout of rows x cols of type t with leading dimension ld,
 * batched. */
static cublasLtMatrixLayout_t gemm_layout(cudaDataType_t t, uint64_t rows, uint64_t cols,
                                          int64_t ld, int64_t stride, int batch) {
  cublasLtMatrixLayout_t l;
  KERN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld));
  if (batch > 1) {
    int32_t b = batch;
    KERN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
    KERN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

/* What a product adds to its sum or writes beside it, each NULL when
 * unused: C = alpha op(A) op(B) + beta Cin + bias. bias: N floats added to
 * every row of an fp32 C; bias16: N bf16, of a bf16 C, added to the fp32
 * sums before their one rounding (as autocast adds a bf16 layer's bias);
 * Cin: beta's input where it is not C itself (fp32, C's layout); pre16
 * (bf16 C, batch 1): GELU in the product's write (kern.h's
 * matmul_fwd_bf16_gelu): pre16 (C's layout) takes the sums with their bias,
 * rounded, and C their GELU, rounded; dgelu16 (bf16 C, batch 1, beta 0, no
 * bias): GELU's backward in it (kern.h's matmul_bwd_dgelu16): C takes each
 * sum times GELU's derivative at dgelu16's element (C's layout), rounded. */
typedef struct {
  const float *bias;
  const uint16_t *bias16;
  const float *Cin;
  uint16_t *pre16;
  const uint16_t *dgelu16;
} gemm_epi_t;

/* e for the block of C whose first element is at element at of C (and of
 * Cin and pre16, in its layout) and first column n0; first: the block
 * takes the first part of each element's sum (beta applies there), which
 * takes e, the parts after nothing. */
static gemm_epi_t gemm_epi_at(const gemm_epi_t &e, int64_t at, int n0, bool first) {
  /* GELU of a whole sum only (a bf16 C is never cut) */
  KERN_CUDA_ASSERT(first || (!e.pre16 && !e.dgelu16));
  if (!first) return gemm_epi_t{};
  return gemm_epi_t{e.bias ? e.bias + n0 : NULL, e.bias16 ? e.bias16 + n0 : NULL,
                    e.Cin ? e.Cin + at : NULL, e.pre16 ? e.pre16 + at : NULL,
                    e.dgelu16 ? e.dgelu16 + at : NULL};
}

/* One cublasLtMatmul, row-major C = alpha op(A) op(B) + beta C with e (the
 * bias by the BIAS epilogue, GELU by GELU_AUX(_BIAS); batch 1 for either),
 * A and B of type ab (fp32, or bf16 packed), C of type cd (fp32; bf16 for
 * a product rounded once from its fp32 sums, gemm_bf16_out), computed as
 * ct. 0, or -1 (nothing queued) when cuBLASLt has no algorithm for it; *why
 * then says so. */
static int gemm_lt(cudaDataType_t ab, cublasComputeType_t ct, char ta, char tb, int M, int N,
                   int K, float alpha, const void *A, int64_t lda, int64_t sA, const void *B,
                   int64_t ldb, int64_t sB, float beta, void *C, cudaDataType_t cd, int64_t ldc,
                   int64_t sC, int batch, const gemm_epi_t &e, cublasStatus_t *why) {
  const void *Cin = e.Cin ? (const void *)e.Cin : C;
  const float *bias = e.bias;
  const uint16_t *bias16 = e.bias16;
  const size_t es = gemm_esize(ab);
  /* column-major: D' (N x M) = op(B') (N x K) op(A') (K x M), B' = B, A' = A */
  const cublasOperation_t opb = tb == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N; /* first operand */
  const cublasOperation_t opa = ta == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N; /* second operand */
  /* stored shapes (column-major rows x cols) of the views: B is (K, N) row-major
   * when 'N', so (N, K) column-major; A is (M, K) row-major when 'N', so (K, M) */
  cublasLtMatrixLayout_t lb = tb == 'N' ? gemm_layout(ab, N, K, ldb, sB, batch)
                                        : gemm_layout(ab, K, N, ldb, sB, batch);
  cublasLtMatrixLayout_t la = ta == 'N' ? gemm_layout(ab, K, M, lda, sA, batch)
                                        : gemm_layout(ab, M, K, lda, sA, batch);
  cublasLtMatrixLayout_t lc = gemm_layout(cd, N, M, ldc, sC, batch);

  cublasLtMatmulDesc_t desc;
  KERN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
  KERN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
  KERN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
  const int has_epi = bias || bias16 || e.pre16 || e.dgelu16;
  if (has_epi) {
    KERN_CUDA_ASSERT(batch == 1 && (!e.dgelu16 || (!bias16 && !e.pre16 && beta == 0.0f)));
    const cublasLtEpilogue_t epi =
        e.dgelu16 ? CUBLASLT_EPILOGUE_DGELU
        : e.pre16 ? (bias16 ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                  : CUBLASLT_EPILOGUE_BIAS;
    KERN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  }
  if (bias || bias16) { /* column-major D has N rows: the bias is a column, added to every one */
    const cudaDataType_t bt = bias ? CUDA_R_32F : CUDA_R_16BF;
    const void *bp = bias ? (const void *)bias : (const void *)bias16;
    KERN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bp, sizeof bp));
    KERN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &bt, sizeof bt));
  }
  if (e.pre16 || e.dgelu16) { /* GELU's input: D's type and layout (the aux's type defaults to D's) */
    const void *aux = e.pre16 ? (const void *)e.pre16 : (const void *)e.dgelu16;
    KERN_CUDA_ASSERT(cd == CUDA_R_16BF && ldc % 8 == 0 && kern_cuda_aligned16(aux));
    const int64_t ld = ldc;
    KERN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    KERN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }

  cublasLtMatmulPreference_t pref;
  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = KERN_CUDA_SIZE_WORKSPACE;
  const uint32_t al_first = gemm_align(B, ldb, sB, batch, es),
                 al_second = gemm_align(A, lda, sA, batch, es),
                 al_d = gemm_align(C, ldc, sC, batch, gemm_esize(cd)),
                 al_in = gemm_align(Cin, ldc, sC, batch, gemm_esize(cd)),
                 al_c = al_in < al_d ? al_in : al_d;
  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_first, sizeof al_first));
  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_second, sizeof al_second));
  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
  if (cd != CUDA_R_32F) { /* a split sum reduced in fp32, never in D's bf16: rounded once */
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  }

  /* the heuristic's first algorithm, or (FSDP_CUDA_GEMM_ALGO, for
   * comparison) one ranked lower */
  cublasLtMatmulHeuristicResult_t ranked[16];
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
      kern_cuda_st.lt, desc, lb, la, lc, lc, pref, kern_cuda_st.gemm_algo + 1, ranked, &found);
  int ok = hs == CUBLAS_STATUS_SUCCESS && found >= 1;
  const cublasLtMatmulHeuristicResult_t &res =
      ranked[ok ? (kern_cuda_st.gemm_algo < found ? kern_cuda_st.gemm_algo : found - 1) : 0];
  /* beta's input Cin (C itself, in place, unless a caller gave another) and
   * the output C: the same layout */
  if (ok) {
    const cublasStatus_t ms =
        cublasLtMatmul(kern_cuda_st.lt, desc, &alpha, B, lb, A, la, &beta, Cin, lc, C, lc,
                       &res.algo, kern_cuda_st.workspace, KERN_CUDA_SIZE_WORKSPACE,
                       kern_cuda_st.stream);
    /* with the bias epilogue, cuBLASLt has been reported to refuse at this
     * call an algorithm its heuristic gave (NOT_SUPPORTED, EXECUTION_FAILED,
     * before queuing anything): the caller then adds the bias (and GELU)
     * itself */
    if (ms != CUBLAS_STATUS_SUCCESS && has_epi) ok = 0, *why = ms;
    else KERN_CUBLAS_CHECK(ms);
  } else {
    *why = hs == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : hs;
  }

  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  KERN_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
  KERN_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
  KERN_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
  KERN_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
  return ok ? 0 : -1;
}

/* A product with no algorithm is a programmer error: it names itself. */
[[noreturn]] static void gemm_none(const char *op, char ta, char tb, int M, int N, int K,
                                   int64_t lda, int64_t ldb, int64_t ldc, int64_t sA, int64_t sB,
                                   int64_t sC, int batch, cublasStatus_t why) {
  fprintf(stderr,
          "fsdp: cuda backend: %s: cuBLASLt has no algorithm for %c%c M=%d N=%d K=%d lda=%lld "
          "ldb=%lld ldc=%lld strides %lld %lld %lld batch=%d: %s (%s:%d)\n",
          op, ta, tb, M, N, K, (long long)lda, (long long)ldb, (long long)ldc, (long long)sA,
          (long long)sB, (long long)sC, batch, cublasLtGetStatusString(why), __FILE__, __LINE__);
  abort();
}

/* out (N, OC; rows ldo apart) += bias (OC) on every row: a block row (y) per
 * row, its threads (x) along it (no division per element) */
__global__ static void bias_add_kernel(float *out, const float *bias, int N, int OC, int64_t ldo) {
  for (int64_t r = blockIdx.y; r < N; r += gridDim.y) {
    float *o = out + r * ldo;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < OC; c += gridDim.x * blockDim.x)
      o[c] += bias[c];
  }
}

/* out16 (N, OC; rows ldo apart) = bf16(out16 + bias16) on every row: the
 * bias of a bf16 product cuBLASLt has no BIAS epilogue for (rounded twice) */
__global__ static void bias_add16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *bias, int N,
                                         int OC, int64_t ldo) {
  for (int64_t r = blockIdx.y; r < N; r += gridDim.y) {
    __nv_bfloat16 *o = out + r * ldo;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < OC; c += gridDim.x * blockDim.x)
      o[c] = __float2bfloat16_rn(__bfloat162float(o[c]) + __bfloat162float(bias[c]));
  }
}

/* The bias of a product queued after it: C (M rows, ldc apart) += bias (N),
 * fp32, or bf16 (bias16, into a bf16 C). */
static void gemm_bias_add(void *C, const float *bias, const uint16_t *bias16, int M, int N,
                          int64_t ldc) {
  if (bias16)
    bias_add16_kernel<<<kern_cuda_rows_grid(M, N), kern_cuda_rows_threads(N), 0,
                        kern_cuda_st.stream>>>((__nv_bfloat16 *)C, (const __nv_bfloat16 *)bias16,
                                               M, N, ldc);
  else
    bias_add_kernel<<<kern_cuda_rows_grid(M, N), kern_cuda_rows_threads(N), 0,
                      kern_cuda_st.stream>>>((float *)C, bias, M, N, ldc);
  KERN_CUDA_LAUNCHED();
}

/* gemm_lt with e: the bias (when set) added to every row of C by the BIAS
 * epilogue where cuBLASLt has an algorithm for it and the bias is 16-byte
 * aligned, else by a pass after the product (for bias16: a rounding more);
 * GELU (e.pre16) by the GELU epilogue on the same terms, else the product
 * with its bias into pre16 and GELU from there into C by a pass after
 * (GELU of the rounded sum); GELU's backward (e.dgelu16) by the DGELU
 * epilogue, else by a pass over the rounded product. 0, or -1 (nothing
 * queued). */
static int gemm_lt_bias(cudaDataType_t ab, cublasComputeType_t ct, char ta, char tb, int M,
                        int N, int K, float alpha, const void *A, int64_t lda, int64_t sA,
                        const void *B, int64_t ldb, int64_t sB, float beta, void *C,
                        cudaDataType_t cd, int64_t ldc, int64_t sC, int batch,
                        const gemm_epi_t &e, cublasStatus_t *why) {
  KERN_CUDA_ASSERT(!e.bias || cd == CUDA_R_32F); /* a bf16 C's bias is bias16 */
  KERN_CUDA_ASSERT(!e.bias16 || (cd == CUDA_R_16BF && !e.bias));
  KERN_CUDA_ASSERT(!e.Cin || cd == CUDA_R_32F);
  KERN_CUDA_ASSERT((!e.pre16 && !e.dgelu16) || cd == CUDA_R_16BF);
  const void *bp = e.bias ? (const void *)e.bias : (const void *)e.bias16;
  if ((bp || e.pre16 || e.dgelu16) && !((uintptr_t)bp & 15) &&
      !gemm_lt(ab, ct, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, cd, ldc, sC,
               batch, e, why))
    return 0;
  if (e.pre16) {
    const gemm_epi_t sum = {NULL, e.bias16, NULL, NULL, NULL};
    if (gemm_lt_bias(ab, ct, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, e.pre16, cd,
                     ldc, sC, batch, sum, why))
      return -1;
    kern_cuda_gelu_rows16((uint16_t *)C, e.pre16, NULL, M, N, ldc, 0);
    kern_cuda_st.gelu_passes++; /* counted: a GPU's tests see a refusal (cuda.h) */
    return 0;
  }
  if (e.dgelu16) { /* the product rounded, then GELU's derivative times it: a rounding more */
    if (gemm_lt(ab, ct, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, cd, ldc, sC,
                batch, gemm_epi_t{}, why))
      return -1;
    kern_cuda_gelu_rows16((uint16_t *)C, e.dgelu16, NULL, M, N, ldc, 1);
    kern_cuda_st.gelu_passes++;
    return 0;
  }
  const gemm_epi_t plain = {NULL, NULL, e.Cin, NULL, NULL};
  if (gemm_lt(ab, ct, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, cd, ldc, sC, batch,
              plain, why))
    return -1;
  if (bp) gemm_bias_add(C, e.bias, e.bias16, M, N, ldc);
  return 0;
}

/* ---- ragged shapes ---------------------------------------------------------
 * Tensor-core kernels want 16-byte aligned accesses along every dimension;
 * cuBLASLt gave the products with one not a multiple of 8 elements (the LM
 * head's blocks holding 50257's odd tail) sm80 CUTLASS kernels (stop 39's
 * trace: cutlass::Kernel2, 2 kernels of 4 calls a step, 3.49 and 3.40 ms,
 * a few hundred GFLOP each, about 100 TFLOP/s) where every other product
 * ran on its Hopper kernels (nvjet) at 450-550. So a product is
 * made in parts: each of M, N and K past 8 and not a multiple of 8 is cut
 * into its multiple of 8 and the rest (under 8: a sliver whose product is
 * small), the parts of K in order, the first with beta and the bias, the
 * second accumulating (beta 1). Every element of C keeps its K terms; only
 * the order cuBLASLt sums them in may change. */

/* The element offset of op(X)[r][c] in X stored row-major with leading
 * dimension ld ('T': X holds op(X) transposed). */
static inline int64_t gemm_at(char t, int64_t r, int64_t c, int64_t ld) {
  return t == 'N' ? r * ld + c : c * ld + r;
}

/* Where a dimension of x elements is cut: its multiple of 8, or x. */
static inline int gemm_cut(int x) { return x > 8 && x % 8 ? x & ~7 : x; }

/* part(m0, mm, n0, nn, k0, kk, first) for each part of an M x N x K
 * product (first: the part's K starts at 0, so beta and the bias are its);
 * a product of no K is one part. */
template <typename Part> static void gemm_parts(int M, int N, int K, Part part) {
  const int cut[3] = {gemm_cut(M), gemm_cut(N), gemm_cut(K)};
  for (int m = 0; m < (cut[0] < M ? 2 : 1); m++)
    for (int n = 0; n < (cut[1] < N ? 2 : 1); n++)
      for (int k = 0; k < (cut[2] < K ? 2 : 1); k++) {
        const int m0 = m ? cut[0] : 0, n0 = n ? cut[1] : 0, k0 = k ? cut[2] : 0;
        part(m0, (m ? M : cut[0]) - m0, n0, (n ? N : cut[1]) - n0, k0, (k ? K : cut[2]) - k0,
             k == 0);
      }
}

/* ---- bf16 products on packed operands -----------------------------------------
 * PyTorch's autocast hands cuBLAS bf16 tensors; ours are fp32 in memory. A
 * bf16 product rounds (kern_f32_to_bf16, as the casts) the block of each
 * operand it needs into one of the two packing buffers, rows padded to 8
 * elements (16 bytes, what the tensor-core kernels want), and multiplies the
 * packed blocks with fp32 accumulation into C in place. A product too large
 * for the buffers is cut into blocks of C's rows (mc), of the sum (kc) and of
 * C's columns (nc), looped m, k, n: A's block is packed once, B's once per
 * block of rows, and C's block (m, n) sees its k blocks in order, beta on the
 * first and 1 after. Strided batches (attention's heads) pack g matrices at
 * a time. cuBLASLt's own CUBLAS_COMPUTE_32F_FAST_16BF on the fp32 operands
 * (kern_cuda_opts_t.gemm_fast16bf) stays for comparison, and serves a block
 * for which cuBLASLt has no bf16 algorithm. */

static inline int64_t pad8(int64_t x) { return (x + 7) & ~(int64_t)7; }

/* dst[b][i][j] = bf16(src[b * sstride + i * sld + j]) for b < g, i < rows,
 * j < cols; dst rows dld apart, matrices dstride apart. A block row (y) per
 * matrix row, its threads (x) along the row, 8 elements each: one 16-byte
 * store of 8 bf16 (every packed row is 16-byte aligned: gemm_pack), read by
 * two 16-byte loads where the source row is 16-byte aligned too, else by 8
 * scalar ones (a view at an odd column or with an odd ld: attention's heads
 * of 3 columns, an odd IC; the same bytes, in more instructions). A row's
 * last cols % 8 elements go one by one. */
__global__ static void gemm_pack_kernel(uint16_t *dst, const float *src, int64_t sld,
                                        int64_t sstride, int64_t dld, int64_t dstride, int rows,
                                        int cols, int g) {
  for (int64_t rr = blockIdx.y; rr < (int64_t)g * rows; rr += gridDim.y) {
    const int64_t b = rr / rows, r = rr % rows;
    const float *s = src + b * sstride + r * sld;
    uint16_t *d = dst + b * dstride + r * dld;
    const bool wide = kern_cuda_aligned16(s);
    for (int j = 8 * (blockIdx.x * blockDim.x + threadIdx.x); j < cols;
         j += 8 * gridDim.x * blockDim.x) {
      if (cols - j < 8) { /* the row's tail */
        for (int k = j; k < cols; k++) d[k] = kern_f32_to_bf16(s[k]);
        continue;
      }
      float4 lo, hi;
      if (wide) {
        lo = kern_cuda_load_f32x4(s + j);
        hi = kern_cuda_load_f32x4(s + j + 4);
      } else {
        lo = make_float4(s[j], s[j + 1], s[j + 2], s[j + 3]);
        hi = make_float4(s[j + 4], s[j + 5], s[j + 6], s[j + 7]);
      }
      kern_cuda_store_u16x8(d + j, kern_cuda_bf16x8(lo, hi));
    }
  }
}

/* Packs op(X)[r0 .. r0+R, c0 .. c0+Cn] of g matrices (stored row-major with
 * ld and stride; t 'T': op(X) is the stored matrix transposed) into dst, in
 * X's stored orientation; returns the packed leading dimension. dst is
 * 16-byte aligned (the buffers are cudaMalloc's, 256-byte aligned, and the
 * callers' offsets into them are packed rows), and so, with rows padded to 8
 * elements and matrices a whole number of rows apart, is every packed row:
 * gemm_pack_kernel's 16-byte stores. */
static int64_t gemm_pack(uint16_t *dst, const float *X, char t, int64_t ld, int64_t stride,
                         int r0, int c0, int R, int Cn, int g, int64_t dstride) {
  const int rows = t == 'N' ? R : Cn, cols = t == 'N' ? Cn : R;
  const float *src = t == 'N' ? X + (int64_t)r0 * ld + c0 : X + (int64_t)c0 * ld + r0;
  const int64_t dld = pad8(cols);
  const int64_t nrows = (int64_t)g * rows;
  KERN_CUDA_ASSERT(kern_cuda_aligned16(dst) && (g == 1 || dstride % 8 == 0));
  if (nrows > 0 && cols > 0) {
    /* threads along a row cover 8 elements each */
    const int64_t groups = (cols + 7) / 8;
    gemm_pack_kernel<<<kern_cuda_rows_grid(nrows, groups), kern_cuda_rows_threads(groups), 0,
                       kern_cuda_st.stream>>>(dst, src, ld, stride, dld, dstride, rows, cols, g);
    KERN_CUDA_LAUNCHED();
  }
  return dld;
}

/* gemm_pack of dout's block (rows [r0, r0 + R), columns [c0, c0 + Cn), rows
 * ld apart, 'N') with the first stage of its column sums on the way
 * (kern_cuda_pack_colsum; r0 starts a run): partial[j * Cn + c] for the
 * block's runs j. */
static_assert(KERN_COLSUM_ROWS == 32, "size.h's KERN_CUDA_SIZE_COLSUM_FLOATS counts runs of 32 rows");
__global__ static void __launch_bounds__(KERN_PACK_COLSUM_THREADS)
    gemm_pack_colsum_kernel(uint16_t *dst, float *partial, const float *src, int64_t sld,
                            int64_t dld, int rows, int cols, bool wide) {
  kern_cuda_pack_colsum(
      dst, dld, partial, rows, cols, wide, true,
      [&](int64_t n, int j) { return kern_cuda_load_f32x4(src + n * sld + j); },
      [&](int64_t n, int j) { return src[n * sld + j]; });
}

/* Launches it; returns the packed leading dimension. */
static int64_t gemm_pack_colsum(uint16_t *dst, float *partial, const float *X, int64_t ld, int r0,
                                int c0, int R, int Cn) {
  const int64_t dld = pad8(Cn);
  KERN_CUDA_ASSERT(kern_cuda_aligned16(dst) && r0 % KERN_COLSUM_ROWS == 0);
  if (R > 0 && Cn > 0) {
    const float *src = X + (int64_t)r0 * ld + c0;
    gemm_pack_colsum_kernel<<<kern_cuda_pack_colsum_grid(R, Cn), KERN_PACK_COLSUM_THREADS, 0,
                              kern_cuda_st.stream>>>(dst, partial, src, ld, dld, R, Cn,
                                                     ld % 4 == 0 && kern_cuda_aligned16(src));
    KERN_CUDA_LAUNCHED();
  }
  return dld;
}

/* Elements a packed block of op(X) (R x Cn) takes. */
static size_t gemm_packed(char t, int64_t R, int64_t Cn) {
  return (size_t)(t == 'N' ? R * pad8(Cn) : Cn * pad8(R));
}

/* Half of x, rounded up to a multiple of 64 (x > 128: it shrinks). */
static int gemm_half(int x) { return ((x + 1) / 2 + 63) & ~63; }

/* C (M x N) = alpha op(A) op(B) + beta C with e on packed blocks
 * pa and pb (their leading dimensions and batch strides plda, psa, pldb,
 * psb); where cuBLASLt has no bf16 algorithm for it, the same blocks of the
 * fp32 operands (Af, Bf: op(Af) starts at the block's first element) rounded
 * by cuBLASLt itself. An operand that came in bf16 has no fp32 block (NULL):
 * then nothing serves, and the product names itself. */
static void gemm_packed_block(const char *op, char ta, char tb, int M, int N, int K, float alpha,
                              const uint16_t *pa, int64_t plda, int64_t psa, const uint16_t *pb,
                              int64_t pldb, int64_t psb, const float *Af, int64_t lda, int64_t sA,
                              const float *Bf, int64_t ldb, int64_t sB, float beta, void *C,
                              cudaDataType_t cd, int64_t ldc, int64_t sC, int batch,
                              const gemm_epi_t &e) {
  gemm_parts(M, N, K, [&](int m0, int mm, int n0, int nn, int k0, int kk, bool first) {
    /* a bf16 C is rounded once: its sum is never cut (gemm_bf16_out) */
    KERN_CUDA_ASSERT(cd == CUDA_R_32F || (k0 == 0 && kk == K));
    const int64_t a = gemm_at(ta, m0, k0, plda), b = gemm_at(tb, k0, n0, pldb);
    const int64_t at = (int64_t)m0 * ldc + n0;
    void *c = (char *)C + at * (int64_t)gemm_esize(cd);
    const float bt = first ? beta : 1.0f;
    /* e with the first part of the sum; the parts after add to C */
    const gemm_epi_t ep = gemm_epi_at(e, at, n0, first);
    cublasStatus_t why;
    if (!gemm_lt_bias(CUDA_R_16BF, CUBLAS_COMPUTE_32F, ta, tb, mm, nn, kk, alpha, pa + a, plda,
                      psa, pb + b, pldb, psb, bt, c, cd, ldc, sC, batch, ep, &why))
      return;
    if (!Af || !Bf ||
        gemm_lt_bias(CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF, ta, tb, mm, nn, kk, alpha,
                     Af + gemm_at(ta, m0, k0, lda), lda, sA, Bf + gemm_at(tb, k0, n0, ldb), ldb,
                     sB, bt, c, cd, ldc, sC, batch, ep, &why))
      gemm_none(op, ta, tb, mm, nn, kk, lda, ldb, ldc, sA, sB, sC, batch, why);
  });
}

/* A bf16 operand: X's elements in fp32 (packed block by block) or, where X16
 * is set, already in bf16 (the caller's bf16 activation: its blocks are
 * views, nothing packed), at the same leading dimension and batch stride. */
typedef struct {
  const float *x;
  const uint16_t *x16;
  int64_t ld, stride;
} gemm_operand_t;

/* A weight w (rows of IC) as a product's operand: its bf16 image w16 where
 * the caller gives one that suits (kern.h: 16-byte aligned, rows of 16-byte
 * multiples), read in place, else w, packed. With w16, w is never read, not
 * even where cuBLASLt refuses a bf16 block (gemm_packed_block: no fp32
 * block then, and the product names itself): the runtime need not widen
 * such a weight (fsdp.c), so w may hold anything. */
static gemm_operand_t gemm_weight(const float *w, const uint16_t *w16, int IC) {
  const int fits = w16 && IC % 8 == 0 && kern_cuda_aligned16(w16);
  return gemm_operand_t{fits ? NULL : w, fits ? w16 : NULL, IC, 0};
}

/* The block of op(X) at (r0, c0), R x Cn, of g matrices from the batch's
 * b0-th: packed into dst, or X16's own elements; *pld and *ps its leading
 * dimension and batch stride. */
static const uint16_t *gemm_block(uint16_t *dst, const gemm_operand_t *X, char t, int b0, int r0,
                                  int c0, int R, int Cn, int g, int64_t *pld, int64_t *ps) {
  if (X->x16) {
    *pld = X->ld, *ps = X->stride;
    return X->x16 + (int64_t)b0 * X->stride + gemm_at(t, r0, c0, X->ld);
  }
  *ps = (int64_t)gemm_packed(t, R, Cn);
  *pld = gemm_pack(dst, X->x + (int64_t)b0 * X->stride, t, X->ld, X->stride, r0, c0, R, Cn, g, *ps);
  return dst;
}

/* op(X)'s block at (r0, c0) of matrix b0 in fp32 (NULL for a bf16 operand). */
static const float *gemm_block_f32(const gemm_operand_t *X, char t, int b0, int r0, int c0) {
  if (!X->x) return NULL;
  return X->x + (int64_t)b0 * X->stride + gemm_at(t, r0, c0, X->ld);
}

/* C of type cd: fp32, or bf16 (gemm_bf16_out: the sum is then never cut,
 * so that each element is rounded once, and a product whose blocks cannot
 * hold the whole sum is refused); beta's input Cin where it is not C (fp32,
 * C's layout: the first block of each element's sum reads it, the blocks
 * after add to C) */
static void gemm_bf16_packed(const char *op, char ta, char tb, int M, int N, int K, float alpha,
                             const gemm_operand_t *A, const gemm_operand_t *B, float beta,
                             void *C, cudaDataType_t cd, int64_t ldc, int64_t sC, int batch,
                             const gemm_epi_t &e) {
  const size_t cap = KERN_CUDA_SIZE_PACK_ELEMS;
  uint16_t *pa = kern_cuda_st.pack, *pb = kern_cuda_st.pack + cap;
  int mc = M, nc = N, kc = K, g = batch;
  const int whole_k = cd != CUDA_R_32F;
  for (;;) { /* an operand in bf16 takes no room */
    const size_t na = A->x16 ? 0 : gemm_packed(ta, mc, kc), nb = B->x16 ? 0 : gemm_packed(tb, kc, nc);
    if ((size_t)g * na <= cap && (size_t)g * nb <= cap) break;
    if (g > 1) g = (g + 1) / 2;
    else if (na > cap && mc > 2048) mc = gemm_half(mc);
    else if (nb > cap && nc > 2048) nc = gemm_half(nc);
    else if (kc > 256 && !whole_k) kc = gemm_half(kc);
    else if (mc > 256) mc = gemm_half(mc);
    else if (nc > 256 || !whole_k) nc = gemm_half(nc); /* 256 x 256 blocks fit: the loop ends */
    else if (mc > 64) mc = gemm_half(mc); /* the whole sum: blocks of fewer rows and columns */
    else if (nc > 64) nc = gemm_half(nc);
    else gemm_none(op, ta, tb, M, N, K, 0, 0, ldc, 0, 0, sC, batch, CUBLAS_STATUS_NOT_SUPPORTED);
  }
  for (int b0 = 0; b0 < batch; b0 += g) {
    const int gb = batch - b0 < g ? batch - b0 : g;
    char *Cb = (char *)C + (int64_t)b0 * sC * (int64_t)gemm_esize(cd);
    for (int m0 = 0; m0 < M; m0 += mc) {
      const int mm = M - m0 < mc ? M - m0 : mc;
      for (int k0 = 0; k0 < K; k0 += kc) {
        const int kk = K - k0 < kc ? K - k0 : kc;
        int64_t plda, psa, pldb, psb;
        const uint16_t *ba = gemm_block(pa, A, ta, b0, m0, k0, mm, kk, gb, &plda, &psa);
        for (int n0 = 0; n0 < N; n0 += nc) {
          const int nn = N - n0 < nc ? N - n0 : nc;
          const uint16_t *bb = gemm_block(pb, B, tb, b0, k0, n0, kk, nn, gb, &pldb, &psb);
          /* e with C's first block of the sum (beta applies there) */
          const int64_t at = (int64_t)m0 * ldc + n0;
          gemm_packed_block(op, ta, tb, mm, nn, kk, alpha, ba, plda, psa, bb, pldb, psb,
                            gemm_block_f32(A, ta, b0, m0, k0), A->ld, A->stride,
                            gemm_block_f32(B, tb, b0, k0, n0), B->ld, B->stride,
                            k0 ? 1.0f : beta, Cb + at * (int64_t)gemm_esize(cd), cd, ldc, sC,
                            gb, gemm_epi_at(e, (int64_t)b0 * sC + at, n0, !k0));
        }
      }
    }
  }
}

/* kern_cuda_gemm, with a bias (N floats, batch 1) added to every row of C
 * when set. */
static void gemm_any(const char *op, char ta, char tb, int M, int N, int K, float alpha,
                     const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb,
                     int64_t sB, float beta, float *C, int64_t ldc, int64_t sC, int batch,
                     const float *bias) {
  KERN_CUDA_ASSERT((ta == 'N' || ta == 'T') && (tb == 'N' || tb == 'T') && batch >= 1);
  KERN_CUDA_ASSERT(!bias || batch == 1);
  if (M <= 0 || N <= 0) return;
#ifdef KERN_CUDA_GEMM_NO_BATCH
  /* a debugging switch: one call per matrix of the batch (attention's
   * batches interleave their heads, stride hs inside rows of 3C) */
  if (batch > 1) {
    for (int i = 0; i < batch; i++)
      gemm_any(op, ta, tb, M, N, K, alpha, A + i * sA, lda, 0, B + i * sB, ldb, 0, beta,
               C + i * sC, ldc, 0, 1, NULL);
    return;
  }
#endif
  if (K <= 0) { /* an empty sum: C = beta C; only beta 1 (accumulating) occurs here */
    KERN_CUDA_ASSERT(beta == 1.0f && !bias);
    return;
  }
  if (kern_cuda_st.bf16 && !kern_cuda_st.fast16bf) {
    const gemm_operand_t a = {A, NULL, lda, sA}, b = {B, NULL, ldb, sB};
    gemm_bf16_packed(op, ta, tb, M, N, K, alpha, &a, &b, beta, C, CUDA_R_32F, ldc, sC, batch,
                     gemm_epi_t{bias, NULL, NULL, NULL, NULL});
    return;
  }
  const cublasComputeType_t ct = kern_cuda_st.bf16   ? CUBLAS_COMPUTE_32F_FAST_16BF
                                 : kern_cuda_st.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                     : CUBLAS_COMPUTE_32F;
  gemm_parts(M, N, K, [&](int m0, int mm, int n0, int nn, int k0, int kk, bool first) {
    cublasStatus_t why;
    if (gemm_lt_bias(CUDA_R_32F, ct, ta, tb, mm, nn, kk, alpha, A + gemm_at(ta, m0, k0, lda), lda,
                     sA, B + gemm_at(tb, k0, n0, ldb), ldb, sB, first ? beta : 1.0f,
                     C + (int64_t)m0 * ldc + n0, CUDA_R_32F, ldc, sC, batch,
                     gemm_epi_at(gemm_epi_t{bias, NULL, NULL, NULL, NULL}, 0, n0, first), &why))
      gemm_none(op, ta, tb, mm, nn, kk, lda, ldb, ldc, sA, sB, sC, batch, why);
  });
}

void kern_cuda_gemm(const char *op, char ta, char tb, int M, int N, int K, float alpha,
                    const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb,
                    int64_t sB, float beta, float *C, int64_t ldc, int64_t sC, int batch) {
  gemm_any(op, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch, NULL);
}

extern "C" void kern_cuda_matmul_fwd(float *out, const float *inp, const float *w,
                                     const float *bias, int N, int IC, int OC, int ldo) {
  KERN_CUDA_ASSERT(ldo >= OC);
  /* out (N, OC) = inp (N, IC) @ w (OC, IC)^T + bias */
  gemm_any(__func__, 'N', 'T', N, OC, IC, 1.0f, inp, IC, 0, w, IC, 0, 0.0f, out, ldo, 0, 1, bias);
}

/* ---- matmul_bwd's two bf16 products, dout packed once ----------------------
 * dinp (N, IC) += dout (N, OC) @ w (OC, IC) and dw (OC, IC) += dout^T @ inp
 * (N, IC) both read dout, the largest operand (the LM head's is N x 50257):
 * packed for each product apart it is read and rounded twice. Here dout is
 * cut into blocks of mr rows and kc columns, each packed once into the first
 * buffer and multiplied twice: by w's kc rows of the block's columns into
 * dinp's mr rows, and (transposed) by inp's mr rows into dw's kc rows. The
 * second buffer holds inp's block (packed once per block of rows) and w's
 * (once per block), side by side. dinp's rows see dout's column blocks in
 * order and dw's rows its row blocks in order, each accumulated with beta 1
 * as the separate products do. mr and kc are chosen among the sizes that fit
 * for the fewest bytes moved (w packed once per row block, dw read and
 * written once per row block, dinp once per column block; the count keeps
 * w's packing per row block even where inp in bf16 and one block of
 * columns let it be packed once, so the blocks stay those timed); a product whose
 * IC leaves no such blocks (256 rows and columns at least, unless the matrix
 * is smaller) takes the separate products. */

/* The blocks (mr, kc) for a joint backward of these shapes; 0 when none fit.
 * inp16: inp came in bf16, so the second buffer holds w's block alone;
 * dout16: dout came in bf16, so the first buffer holds nothing; whole: kc
 * must be all OC (a bf16 dinp, each element's sum rounded once). */
static int gemm_bwd_blocks(int N, int IC, int OC, int inp16, int dout16, int whole, int *mr_out,
                           int *kc_out) {
  const int64_t cap = (int64_t)KERN_CUDA_SIZE_PACK_ELEMS, ic8 = pad8(IC);
  const int min_r = N < 256 ? N : 256, min_c = OC < 256 ? OC : 256;
  double best = -1;
  for (int mr = N;; mr = gemm_half(mr)) {
    /* kc: as many of dout's columns as fit mr rows of the first buffer
     * (padded rows: a multiple of 8 unless it is all OC), with w's kc rows
     * beside inp's mr in the second */
    const int64_t row_room = dout16 ? INT64_MAX : cap / mr,
                  w_room = cap / ic8 - (inp16 ? 0 : mr);
    int64_t kc = OC;
    if (pad8(OC) > row_room || OC > w_room)
      kc = (row_room < w_room ? row_room : w_room) & ~(int64_t)7;
    if (kc > 0 && kc < OC) { /* as many blocks, evened out: no sliver of a last one */
      const int64_t nc = (OC + kc - 1) / kc, even = pad8((OC + nc - 1) / nc);
      if (even < kc) kc = even;
    }
    if (mr >= min_r && kc >= min_c && (!whole || kc >= OC)) {
      /* per block of rows: w packed (6 bytes an element) and read by its
       * products (2), dw read and written (8); per block of columns: inp's
       * packed block read (2), dinp read and written (8) */
      const double nr = (double)((N + mr - 1) / mr), nc = (double)((OC + kc - 1) / kc);
      const double bytes = nr * (double)OC * IC * 16 + nc * (double)N * IC * 10;
      if (best < 0 || bytes < best) best = bytes, *mr_out = mr, *kc_out = (int)kc;
    }
    if (mr <= 128 || mr <= min_r) break; /* gemm_half shrinks only past 128 */
  }
  return best >= 0;
}

/* dbias += the column sums of dout (N rows of OC), fp32 or bf16, in
 * colsum's order */
static void gemm_dbias(float *dbias, const gemm_operand_t *dout, int N, int OC) {
  if (dout->x) kern_cuda_colsum(dbias, NULL, dout->x, NULL, NULL, NULL, N, OC, dout->ld);
  else kern_cuda_colsum16(dbias, dout->x16, N, OC, dout->ld);
}

/* dbias (when set; dout in fp32) is summed as dout's blocks are packed
 * (gemm_pack_colsum, its runs added block by block of rows: colsum's order)
 * where a block's runs fit their buffer, else by kern_cuda_colsum first.
 * dinp of type dcd: fp32, or bf16 (one block of all OC columns, acc 0). */
static int gemm_bwd_joint(void *dinp, cudaDataType_t dcd, float *dw, float *dbias,
                          const gemm_operand_t *dout, const gemm_operand_t *inp,
                          const gemm_operand_t *wo, int N, int IC, int OC, int acc,
                          const uint16_t *dgelu16 = NULL) {
  int mr = 0, kc = 0;
  if (!gemm_bwd_blocks(N, IC, OC, inp->x16 != NULL, dout->x16 != NULL, dcd != CUDA_R_32F, &mr,
                       &kc))
    return 0;
  const int fused = dbias && dout->x &&
                    (size_t)(mr + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS * (size_t)kc <=
                        KERN_CUDA_SIZE_COLSUM_FLOATS;
  if (dbias && !fused) gemm_dbias(dbias, dout, N, OC);
  uint16_t *pa = kern_cuda_st.pack, *pb = kern_cuda_st.pack + KERN_CUDA_SIZE_PACK_ELEMS;
  /* w in bf16 (its image: read in place), or inp in bf16 and one block of
   * columns: w's one block stays packed in the second buffer for every
   * block of rows (nothing else uses it then) */
  const float *w = wo->x;
  const int w_once = !wo->x16 && inp->x16 && kc >= OC;
  const int64_t pldw_once = w_once ? gemm_pack(pb, w, 'N', IC, 0, 0, 0, OC, IC, 1, 0) : 0;
  for (int r0 = 0; r0 < N; r0 += mr) {
    const int rr = N - r0 < mr ? N - r0 : mr;
    /* inp's rows of the block (packed, or its own in bf16), then (after a
     * packed block) w's rows of each column block */
    int64_t pld, ps;
    const uint16_t *pi = gemm_block(pb, inp, 'N', 0, r0, 0, rr, IC, 1, &pld, &ps);
    uint16_t *pw = inp->x16 ? pb : pb + (int64_t)rr * pld;
    for (int c0 = 0; c0 < OC; c0 += kc) {
      const int cc = OC - c0 < kc ? OC - c0 : kc;
      const float *dout_rc = gemm_block_f32(dout, 'N', 0, r0, c0),
                  *w_c = w ? w + (int64_t)c0 * IC : NULL;
      int64_t plda, psa;
      const uint16_t *pd = pa;
      if (fused) { /* packed with its runs' column sums, added to dbias's columns in row order */
        plda = gemm_pack_colsum(pa, kern_cuda_st.colsum, dout->x, dout->ld, r0, c0, rr, cc);
        kern_cuda_colsum_add(dbias + c0, NULL, kern_cuda_st.colsum,
                             (rr + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS, cc);
      } else {
        pd = gemm_block(pa, dout, 'N', 0, r0, c0, rr, cc, 1, &plda, &psa);
      }
      const uint16_t *pwc = wo->x16 ? wo->x16 + (int64_t)c0 * IC : pw;
      const int64_t pldw = wo->x16 ? IC
                           : w_once ? pldw_once
                                    : gemm_pack(pw, w, 'N', IC, 0, c0, 0, cc, IC, 1, 0);
      /* without acc, dinp's rows take their first column block with beta 0 (not read) */
      gemm_packed_block(__func__, 'N', 'N', rr, IC, cc, 1.0f, pd, plda, 0, pwc, pldw, 0, dout_rc,
                        dout->ld, 0, w_c, IC, 0, acc || c0 ? 1.0f : 0.0f,
                        (char *)dinp + (int64_t)r0 * IC * (int64_t)gemm_esize(dcd), dcd, IC, 0, 1,
                        gemm_epi_t{NULL, NULL, NULL, NULL,
                                   dgelu16 ? dgelu16 + (int64_t)r0 * IC : NULL});
      gemm_packed_block(__func__, 'T', 'N', cc, IC, rr, 1.0f, pd, plda, 0, pi, pld, 0, dout_rc,
                        dout->ld, 0, gemm_block_f32(inp, 'N', 0, r0, 0), IC, 0, 1.0f,
                        dw + (int64_t)c0 * IC, CUDA_R_32F, IC, 0, 1, gemm_epi_t{});
    }
  }
  return 1;
}

/* matmul_bwd with dout (rows dout->ld apart) and inp each in fp32 or (x16)
 * in bf16; dbias needs dout in fp32. */
static void matmul_bwd_any(float *dinp, float *dw, float *dbias, const gemm_operand_t *dout,
                           const gemm_operand_t *inp, const float *w, const uint16_t *w16, int N,
                           int IC, int OC, int acc) {
  KERN_CUDA_ASSERT(dout->ld >= OC);
  if (dinp && !acc && OC <= 0 && N > 0 && IC > 0) /* an empty sum written: zeros */
    KERN_CUDA_CHECK(cudaMemsetAsync(dinp, 0, (size_t)N * IC * sizeof(float), kern_cuda_st.stream));
  const gemm_operand_t wo = gemm_weight(w, w16, IC);
  if (dinp && dw && N > 0 && IC > 0 && OC > 0 && kern_cuda_st.bf16 && !kern_cuda_st.fast16bf &&
      gemm_bwd_joint(dinp, CUDA_R_32F, dw, dbias, dout, inp, &wo, N, IC, OC, acc))
    return; /* dbias too */
  if (dbias) gemm_dbias(dbias, dout, N, OC);
  const int bf16_ops = dout->x16 || inp->x16; /* the bf16 mode's products, on the operands given */
  /* dinp (N, IC) += dout (N, OC) @ w (OC, IC); = without acc */
  if (dinp && OC > 0 && N > 0 && IC > 0) {
    if (bf16_ops)
      gemm_bf16_packed(__func__, 'N', 'N', N, IC, OC, 1.0f, dout, &wo, acc ? 1.0f : 0.0f, dinp,
                       CUDA_R_32F, IC, 0, 1, gemm_epi_t{});
    else
      kern_cuda_gemm(__func__, 'N', 'N', N, IC, OC, 1.0f, dout->x, dout->ld, 0, w, IC, 0,
                     acc ? 1.0f : 0.0f, dinp, IC, 0, 1);
  }
  /* dw (OC, IC) += dout^T (OC, N) @ inp (N, IC) */
  if (!dw || OC <= 0 || IC <= 0 || N <= 0) return;
  if (bf16_ops)
    gemm_bf16_packed(__func__, 'T', 'N', OC, IC, N, 1.0f, dout, inp, 1.0f, dw, CUDA_R_32F, IC, 0, 1,
                     gemm_epi_t{});
  else
    kern_cuda_gemm(__func__, 'T', 'N', OC, IC, N, 1.0f, dout->x, dout->ld, 0, inp->x, IC, 0, 1.0f,
                   dw, IC, 0, 1);
}

extern "C" void kern_cuda_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                                     const float *inp, const float *w, int N, int IC, int OC,
                                     int ldo, int acc) {
  const gemm_operand_t d = {dout, NULL, ldo, 0}, x = {inp, NULL, IC, 0};
  matmul_bwd_any(dinp, dw, dbias, &d, &x, w, NULL, N, IC, OC, acc);
}

/* ---- bf16 activations -------------------------------------------------------
 * The products of a bf16 job round their operands to bf16 (gemm_pack), so an
 * input kept in bf16 by the op that made it (layernorm's, GELU's: rounded as
 * the packing would) gives the same operand, and the product reads it as it
 * is: no packing pass, half the bytes kept. Offered only in that mode
 * (backend.cu's table), where the fp32 path would round it anyway. */

extern "C" void kern_cuda_matmul_fwd_bf16(float *out, const uint16_t *inp, const float *w,
                                          const uint16_t *w16, const float *bias, int N, int IC,
                                          int OC, int ldo) {
  /* IC 0 is refused as matmul_fwd's gemm_any refuses it */
  KERN_CUDA_ASSERT(ldo >= OC && IC > 0 && kern_cuda_st.bf16 && !kern_cuda_st.fast16bf);
  KERN_CUDA_ASSERT(IC % 8 == 0 && kern_cuda_aligned16(inp)); /* kern.h: 16-byte rows */
  if (N <= 0 || OC <= 0) return;
  const gemm_operand_t a = {NULL, inp, IC, 0}, b = gemm_weight(w, w16, IC);
  gemm_bf16_packed(__func__, 'N', 'T', N, OC, IC, 1.0f, &a, &b, 0.0f, out, CUDA_R_32F, ldo, 0, 1,
                   gemm_epi_t{bias, NULL, NULL, NULL, NULL});
}

/* matmul_fwd_res (kern.h): the product with the residual as beta's input of
 * its first block of the sum (cuBLASLt reads res as it writes out: D =
 * product + res + bias), so no residual pass after it reads out again. */
extern "C" void kern_cuda_matmul_fwd_res(float *out, const float *inp, const uint16_t *inp16,
                                         const float *w, const uint16_t *w16, const float *bias,
                                         const float *res, int N, int IC, int OC) {
  KERN_CUDA_ASSERT(!inp != !inp16 && res && IC > 0 && kern_cuda_st.bf16 && !kern_cuda_st.fast16bf);
  KERN_CUDA_ASSERT(!inp16 || (IC % 8 == 0 && kern_cuda_aligned16(inp16))); /* kern.h */
  if (N <= 0 || OC <= 0) return;
  const gemm_operand_t a = {inp, inp16, IC, 0}, b = gemm_weight(w, w16, IC);
  gemm_bf16_packed(__func__, 'N', 'T', N, OC, IC, 1.0f, &a, &b, 1.0f, out, CUDA_R_32F, OC, 0, 1,
                   gemm_epi_t{bias, NULL, res, NULL, NULL});
}

/* The LM head's logits in bf16 (kern.h's matmul_fwd_bf16_out16): each
 * element the product's fp32 sum rounded once, by cuBLASLt's write of D,
 * as PyTorch's autocast keeps a linear layer's output: half the bytes
 * written, and read by the cross-entropy (crossentropy_fwd_bwd_bf16in).
 * bias16 (the block's qkv product, written in bf16 for the attention):
 * added to the sums before that rounding by cuBLASLt's BIAS epilogue, as
 * autocast adds a bf16 layer's bias. */
extern "C" void kern_cuda_matmul_fwd_bf16_out16(uint16_t *out, const uint16_t *inp,
                                                const float *w, const uint16_t *w16,
                                                const uint16_t *bias16, int N, int IC, int OC,
                                                int ldo) {
  KERN_CUDA_ASSERT(ldo >= OC && ldo % 8 == 0 && kern_cuda_aligned16(out) && IC > 0 &&
                   kern_cuda_st.bf16 && !kern_cuda_st.fast16bf);
  /* 16-byte rows (kern.h), so that the sum is never cut (gemm_parts) */
  KERN_CUDA_ASSERT(IC % 8 == 0 && kern_cuda_aligned16(inp));
  KERN_CUDA_ASSERT(!bias16 || kern_cuda_aligned16(bias16)); /* kern.h */
  if (N <= 0 || OC <= 0) return;
  const gemm_operand_t a = {NULL, inp, IC, 0}, b = gemm_weight(w, w16, IC);
  gemm_bf16_packed(__func__, 'N', 'T', N, OC, IC, 1.0f, &a, &b, 0.0f, out, CUDA_R_16BF, ldo, 0, 1,
                   gemm_epi_t{NULL, bias16, NULL, NULL, NULL});
}

/* The fc product with GELU in its write (kern.h's matmul_fwd_bf16_gelu):
 * cuBLASLt's GELU_AUX_BIAS epilogue adds bias16 to each fp32 sum, writes
 * the sum rounded into pre16 (GELU's input, kept for backward) and GELU of
 * the sum, rounded, into out16: no pass of GELU over the product's output
 * after it (reading N x OC bf16 and writing as many). Where cuBLASLt has
 * no algorithm with the epilogue, the product with its bias into pre16 and
 * a pass of GELU from it. */
extern "C" void kern_cuda_matmul_fwd_bf16_gelu(uint16_t *out16, uint16_t *pre16,
                                               const uint16_t *inp, const float *w,
                                               const uint16_t *w16, const uint16_t *bias16, int N,
                                               int IC, int OC) {
  KERN_CUDA_ASSERT(IC > 0 && kern_cuda_st.bf16 && !kern_cuda_st.fast16bf);
  /* 16-byte rows of every bf16 matrix and the bias (kern.h): the sum never cut */
  KERN_CUDA_ASSERT(IC % 8 == 0 && OC % 8 == 0 && kern_cuda_aligned16(inp) &&
                   kern_cuda_aligned16(out16) && kern_cuda_aligned16(pre16) &&
                   (!bias16 || kern_cuda_aligned16(bias16)));
  if (N <= 0 || OC <= 0) return;
  const gemm_operand_t a = {NULL, inp, IC, 0}, b = gemm_weight(w, w16, IC);
  gemm_bf16_packed(__func__, 'N', 'T', N, OC, IC, 1.0f, &a, &b, 0.0f, out16, CUDA_R_16BF, OC, 0, 1,
                   gemm_epi_t{NULL, bias16, NULL, pre16, NULL});
}

extern "C" void kern_cuda_matmul_bwd_bf16(float *dinp, float *dw, float *dbias, const float *dout,
                                          const uint16_t *dout16, const uint16_t *inp,
                                          const float *w, const uint16_t *w16, int N, int IC, int OC,
                                          int ldo, int acc) {
  KERN_CUDA_ASSERT(kern_cuda_st.bf16 && !kern_cuda_st.fast16bf);
  KERN_CUDA_ASSERT(IC % 8 == 0 && kern_cuda_aligned16(inp)); /* kern.h: 16-byte rows */
  /* dout in one form; in bf16 its rows 16-byte multiples (dbias then the
   * column sums of the bf16 values) */
  KERN_CUDA_ASSERT(!dout != !dout16 &&
                   (!dout16 || (ldo % 8 == 0 && kern_cuda_aligned16(dout16))));
  const gemm_operand_t d = {dout, dout16, ldo, 0}, x = {NULL, inp, IC, 0};
  matmul_bwd_any(dinp, dw, dbias, &d, &x, w, w16, N, IC, OC, acc);
}

/* matmul_bwd_dinp16 (kern.h): dinp's product writes bf16, each element its
 * sum over all OC rounded once by cuBLASLt's write of D (as
 * matmul_fwd_bf16_out16's), in the joint blocks where a block of all OC
 * columns fits, else by the separate products (dbias by colsum first).
 * dgelu16 (matmul_bwd_dgelu16): each sum times GELU's derivative at its
 * element of dgelu16 before that rounding (cuBLASLt's DGELU epilogue).
 * dout (N x OC, dense) in fp32 or in bf16 (matmul_bwd16); dsums: dbias
 * from its runs (layernorm_bwd16's), added in order as colsum adds them. */
static void matmul_bwd_dinp16_any(uint16_t *dinp16, float *dw, float *dbias,
                                  const gemm_operand_t *d, const float *dsums, const float *inp,
                                  const uint16_t *inp16, const float *w, const uint16_t *w16,
                                  const uint16_t *dgelu16, int N, int IC, int OC) {
  KERN_CUDA_ASSERT(kern_cuda_st.bf16 && !kern_cuda_st.fast16bf && !inp != !inp16 &&
                   !d->x != !d->x16 && d->ld == OC);
  /* 16-byte rows of dinp16 (and inp16, dgelu16); OC a multiple of 8 so that no sum is cut (gemm_parts) */
  KERN_CUDA_ASSERT(IC % 8 == 0 && OC % 8 == 0 && kern_cuda_aligned16(dinp16) &&
                   (!inp16 || kern_cuda_aligned16(inp16)) &&
                   (!dgelu16 || kern_cuda_aligned16(dgelu16)));
  if (N <= 0 || IC <= 0) return;
  if (OC <= 0) { /* an empty sum written: zeros (+0.0 in bf16 too; GELU's derivative times 0) */
    KERN_CUDA_CHECK(cudaMemsetAsync(dinp16, 0, (size_t)N * IC * sizeof(uint16_t),
                                    kern_cuda_st.stream));
    return;
  }
  if (dbias && dsums) { /* the runs' sums made: their second stage alone */
    kern_cuda_colsum_add(dbias, NULL, dsums, (N + KERN_COLSUM_ROWS - 1) / KERN_COLSUM_ROWS, OC);
    dbias = NULL;
  }
  const gemm_operand_t x = {inp, inp16, IC, 0}, wo = gemm_weight(w, w16, IC);
  if (gemm_bwd_joint(dinp16, CUDA_R_16BF, dw, dbias, d, &x, &wo, N, IC, OC, 0, dgelu16)) return;
  if (dbias) gemm_dbias(dbias, d, N, OC);
  gemm_bf16_packed(__func__, 'N', 'N', N, IC, OC, 1.0f, d, &wo, 0.0f, dinp16, CUDA_R_16BF, IC, 0,
                   1, gemm_epi_t{NULL, NULL, NULL, NULL, dgelu16});
  gemm_bf16_packed(__func__, 'T', 'N', OC, IC, N, 1.0f, d, &x, 1.0f, dw, CUDA_R_32F, IC, 0, 1,
                   gemm_epi_t{});
}

extern "C" void kern_cuda_matmul_bwd_dinp16(uint16_t *dinp16, float *dw, float *dbias,
                                            const float *dout, const float *inp,
                                            const uint16_t *inp16, const float *w,
                                            const uint16_t *w16, int N, int IC, int OC) {
  const gemm_operand_t d = {dout, NULL, OC, 0};
  matmul_bwd_dinp16_any(dinp16, dw, dbias, &d, NULL, inp, inp16, w, w16, NULL, N, IC, OC);
}

/* matmul_bwd16 (kern.h): dout in bf16 as layernorm_bwd16 rounded it (read
 * in place: no packing pass), dbias from the runs it summed */
extern "C" void kern_cuda_matmul_bwd16(uint16_t *dinp16, float *dw, float *dbias,
                                       const uint16_t *dout16, const float *dsums,
                                       const uint16_t *inp16, const float *w, const uint16_t *w16,
                                       const uint16_t *pre16, int N, int IC, int OC) {
  KERN_CUDA_ASSERT(dout16 && kern_cuda_aligned16(dout16) && inp16 && (!dbias || dsums));
  const gemm_operand_t d = {NULL, dout16, OC, 0};
  matmul_bwd_dinp16_any(dinp16, dw, dbias, &d, dsums, NULL, inp16, w, w16, pre16, N, IC, OC);
}

/* matmul_bwd_dgelu16 (kern.h): the fc projection's backward with GELU's
 * backward in its dinp product's write, where GELU's input pre16 is kept
 * (matmul_fwd_bf16_gelu's): no pass of GELU's backward after it (reading
 * two N x IC bf16 matrices and writing one). */
extern "C" void kern_cuda_matmul_bwd_dgelu16(uint16_t *dinp16, float *dw, float *dbias,
                                             const float *dout, const uint16_t *inp16,
                                             const float *w, const uint16_t *w16,
                                             const uint16_t *pre16, int N, int IC, int OC) {
  KERN_CUDA_ASSERT(inp16 && pre16);
  const gemm_operand_t d = {dout, NULL, OC, 0};
  matmul_bwd_dinp16_any(dinp16, dw, dbias, &d, NULL, NULL, inp16, w, w16, pre16, N, IC, OC);
}

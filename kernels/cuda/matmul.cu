/* matmul: the linear layer, out = inp @ w^T + bias, and its backward, with
 * the products done by cuBLASLt in fp32 (TF32 when kern_cuda_opts_t.tf32,
 * bf16 tensor cores with fp32 accumulation when .bf16: bf16-mixed jobs).
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
 * The bias (forward) is a separate element-wise pass after the product, as
 * the CPU adds it; dbias sums each column over the rows in row order, one
 * thread per column, the CPU's order (so the same bits). */
#include "kernels/cuda/cuda_impl.h"

/* The largest power of two, up to 256, dividing the pointer, the leading
 * dimension and the batch stride in bytes: what every matrix of the call is
 * aligned to. */
static uint32_t gemm_align(const void *p, int64_t ld, int64_t stride, int batch) {
  uint64_t x = (uint64_t)(uintptr_t)p | (uint64_t)ld * sizeof(float);
  if (batch > 1) x |= (uint64_t)stride * sizeof(float);
  uint32_t a = 256;
  while (a > 4 && (x & (a - 1))) a >>= 1;
  return a;
}

/* A column-major layout of rows x cols with leading dimension ld, batched. */
static cublasLtMatrixLayout_t gemm_layout(uint64_t rows, uint64_t cols, int64_t ld, int64_t stride,
                                          int batch) {
  cublasLtMatrixLayout_t l;
  KERN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, rows, cols, ld));
  if (batch > 1) {
    int32_t b = batch;
    KERN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
    KERN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

void kern_cuda_gemm(const char *op, char ta, char tb, int M, int N, int K, float alpha,
                    const float *A, int64_t lda, int64_t sA, const float *B, int64_t ldb,
                    int64_t sB, float beta, float *C, int64_t ldc, int64_t sC, int batch) {
  KERN_CUDA_ASSERT((ta == 'N' || ta == 'T') && (tb == 'N' || tb == 'T') && batch >= 1);
  if (M <= 0 || N <= 0) return;
#ifdef KERN_CUDA_GEMM_NO_BATCH
  /* a debugging switch: one call per matrix of the batch (attention's
   * batches interleave their heads, stride hs inside rows of 3C) */
  if (batch > 1) {
    for (int i = 0; i < batch; i++)
      kern_cuda_gemm(op, ta, tb, M, N, K, alpha, A + i * sA, lda, 0, B + i * sB, ldb, 0, beta,
                     C + i * sC, ldc, 0, 1);
    return;
  }
#endif
  if (K <= 0) { /* an empty sum: C = beta C; only beta 1 (accumulating) occurs here */
    KERN_CUDA_ASSERT(beta == 1.0f);
    return;
  }
  /* column-major: D' (N x M) = op(B') (N x K) op(A') (K x M), B' = B, A' = A */
  const cublasOperation_t opb = tb == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N; /* first operand */
  const cublasOperation_t opa = ta == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N; /* second operand */
  /* stored shapes (column-major rows x cols) of the views: B is (K, N) row-major
   * when 'N', so (N, K) column-major; A is (M, K) row-major when 'N', so (K, M) */
  cublasLtMatrixLayout_t lb =
      tb == 'N' ? gemm_layout(N, K, ldb, sB, batch) : gemm_layout(K, N, ldb, sB, batch);
  cublasLtMatrixLayout_t la =
      ta == 'N' ? gemm_layout(K, M, lda, sA, batch) : gemm_layout(M, K, lda, sA, batch);
  cublasLtMatrixLayout_t lc = gemm_layout(N, M, ldc, sC, batch);

  cublasLtMatmulDesc_t desc;
  const cublasComputeType_t ct = kern_cuda_st.bf16   ? CUBLAS_COMPUTE_32F_FAST_16BF
                                 : kern_cuda_st.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                     : CUBLAS_COMPUTE_32F;
  KERN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
  KERN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
  KERN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));

  cublasLtMatmulPreference_t pref;
  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = KERN_CUDA_SIZE_WORKSPACE;
  const uint32_t al_first = gemm_align(B, ldb, sB, batch),
                 al_second = gemm_align(A, lda, sA, batch), al_c = gemm_align(C, ldc, sC, batch);
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

  /* no algorithm (or a status saying so) names the product that has none */
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(kern_cuda_st.lt, desc, lb, la, lc, lc, pref, 1, &res, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found < 1) {
    fprintf(stderr,
            "fsdp: cuda backend: %s: cuBLASLt has no algorithm for %c%c M=%d N=%d K=%d lda=%lld "
            "ldb=%lld ldc=%lld strides %lld %lld %lld batch=%d alignments %u %u %u: %s (%s:%d)\n",
            op, ta, tb, M, N, K, (long long)lda, (long long)ldb, (long long)ldc, (long long)sA,
            (long long)sB, (long long)sC, batch, al_second, al_first, al_c,
            cublasLtGetStatusString(hs), __FILE__, __LINE__);
    abort();
  }
  /* C is both the input (beta) and the output: the same layout, in place */
  KERN_CUBLAS_CHECK(cublasLtMatmul(kern_cuda_st.lt, desc, &alpha, B, lb, A, la, &beta, C, lc, C, lc,
                                   &res.algo, kern_cuda_st.workspace, KERN_CUDA_SIZE_WORKSPACE,
                                   kern_cuda_st.stream));

  KERN_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  KERN_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
  KERN_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
  KERN_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
  KERN_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
}

/* out (N, OC) += bias (OC) on every row */
__global__ static void bias_add_kernel(float *out, const float *bias, size_t n, int OC) {
  KERN_CUDA_FOR(i, n) out[i] += bias[i % (size_t)OC];
}

/* dbias[c] += dout[n][c] for n = 0..N-1 in order: one thread per column */
__global__ static void bias_grad_kernel(float *dbias, const float *dout, int N, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float acc = dbias[c];
  for (int n = 0; n < N; n++) acc += dout[(int64_t)n * OC + c];
  dbias[c] = acc;
}

extern "C" void kern_cuda_matmul_fwd(float *out, const float *inp, const float *w,
                                     const float *bias, int N, int IC, int OC) {
  /* out (N, OC) = inp (N, IC) @ w (OC, IC)^T */
  kern_cuda_gemm(__func__, 'N', 'T', N, OC, IC, 1.0f, inp, IC, 0, w, IC, 0, 0.0f, out, OC, 0, 1);
  const size_t n = (size_t)N * OC;
  if (bias && n) {
    bias_add_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                      kern_cuda_st.stream>>>(out, bias, n, OC);
    KERN_CUDA_LAUNCHED();
  }
}

extern "C" void kern_cuda_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                                     const float *inp, const float *w, int N, int IC, int OC) {
  /* dinp (N, IC) += dout (N, OC) @ w (OC, IC) */
  if (dinp)
    kern_cuda_gemm(__func__, 'N', 'N', N, IC, OC, 1.0f, dout, OC, 0, w, IC, 0, 1.0f, dinp, IC, 0,
                   1);
  /* dw (OC, IC) += dout^T (OC, N) @ inp (N, IC) */
  if (dw)
    kern_cuda_gemm(__func__, 'T', 'N', OC, IC, N, 1.0f, dout, OC, 0, inp, IC, 0, 1.0f, dw, IC, 0,
                   1);
  if (dbias && OC > 0) {
    bias_grad_kernel<<<(OC + KERN_CUDA_THREADS - 1) / KERN_CUDA_THREADS, KERN_CUDA_THREADS, 0,
                       kern_cuda_st.stream>>>(dbias, dout, N, OC);
    KERN_CUDA_LAUNCHED();
  }
}

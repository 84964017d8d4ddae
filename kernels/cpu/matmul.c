/* matmul: the linear layer, out = inp @ w^T + bias, and its backward, all
 * products through oneDNN's dnnl_sgemm (row-major C API). Also owns
 * kern_cpu_sgemm, the one place that calls dnnl_sgemm. */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include "daemon/common/log.h"
#include "kernels/cpu/cpu.h"

void kern_cpu_sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                    float *C, int64_t ldc) {
  dnnl_status_t st = dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  FSDP_ASSERT(st == dnnl_success);
}

void kern_cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N,
                         int IC, int OC) {
  kern_cpu_sgemm('N', 'T', N, OC, IC, 1.0f, inp, IC, w, IC, 0.0f, out, OC);
  if (!bias) return;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float *o = out + (int64_t)n * OC;
    for (int c = 0; c < OC; c++) o[c] += bias[c];
  }
}

void kern_cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int IC, int OC) {
  kern_cpu_sgemm('N', 'N', N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dinp, IC);
  kern_cpu_sgemm('T', 'N', OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
  if (!dbias) return;
  /* Column sums: each thread owns a range of output channels (race-free). */
#pragma omp parallel
  {
    int c0, c1;
    kern_cpu_channel_range(OC, &c0, &c1);
    for (int n = 0; n < N; n++) {
      const float *d = dout + (int64_t)n * OC;
      for (int c = c0; c < c1; c++) dbias[c] += d[c];
    }
  }
}

/* matmul: the linear layer, out = inp @ w^T + bias, and its backward, with the
 * products done by oneDNN's dnnl_sgemm (row-major C API). Also owns
 * kern_cpu_sgemm, the one place that calls dnnl_sgemm.
 *
 * We split each product among the OpenMP team ourselves: every thread computes
 * one tile of C with a single-threaded sgemm (oneDNN runs single-threaded inside
 * a parallel region). On 2 cores this matched oneDNN's own threading on the
 * GPT-2 shapes and beat it by 20% on one (N=1024, IC=3072, OC=768 forward: 200
 * vs 165 GFLOP/s); it also lets the bias add run on each tile while it is in
 * cache, and the three gradients of backward run in one parallel region. */
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* Signals are held off the thread while oneDNN's sgemm runs. Its JIT kernels
 * (Debian's oneDNN 2.6; fixed upstream in 3.11, oneDNN issue #4845) point
 * rsp at their heap workspace while they run, so a signal handled on that
 * thread writes its frame (some 3 KiB of saved registers with AVX-512) into
 * the heap below the workspace: glibc then aborts at a later free, or data
 * is silently overwritten. A rank met it as a rare abort when SIGTERM (a
 * preemption) came mid-step. A signal sent to the process goes to a thread
 * that takes it, or waits for the call's end. The synchronous ones a fault
 * raises stay open: blocked, the kernel would kill the process without the
 * crash handler's report, and the process is ending either way. */
static sigset_t sgemm_held;
static pthread_once_t sgemm_once = PTHREAD_ONCE_INIT;
static _Thread_local int sgemm_depth; /* holds open on this thread */

static void sgemm_held_init(void) {
  sigfillset(&sgemm_held);
  const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS};
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&sgemm_held, faults[i]);
}

void kern_cpu_sgemm_hold(sigset_t *was) {
  if (sgemm_depth++) return;
  pthread_once(&sgemm_once, sgemm_held_init);
  pthread_sigmask(SIG_BLOCK, &sgemm_held, was);
}

void kern_cpu_sgemm_release(const sigset_t *was) {
  if (--sgemm_depth) return;
  pthread_sigmask(SIG_SETMASK, was, NULL);
}

void kern_cpu_sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                    int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  sigset_t was;
  kern_cpu_sgemm_hold(&was);
  dnnl_status_t st = dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  kern_cpu_sgemm_release(&was);
  KERN_CPU_ASSERT(st == dnnl_success);
}

/* Columns of C are split in multiples of 16 floats (64 bytes), so tiles side by
 * side do not write to the same cache line (when rows are aligned). */
#define TILE_COLS 16

typedef struct {
  int64_t m0, m1, n0, n1; /* rows [m0, m1), columns [n0, n1) of C */
} tile_t;

/* This thread's tile of an M x N result, the team laid out as a pm x pn grid.
 * The grid makes tiles as even as possible, then as square as possible (least
 * packing of A and B per flop). Empty (m0 == m1 or n0 == n1) when the matrix
 * has fewer tiles than the team has threads. */
static tile_t my_tile(int64_t M, int64_t N) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t nb = (N + TILE_COLS - 1) / TILE_COLS;
  int pm = 1;
  int64_t best_area = INT64_MAX, best_half = INT64_MAX;
  for (int p = 1; p <= nt; p++) {
    if (nt % p) continue;
    int64_t tm = (M + p - 1) / p, tn = (nb + nt / p - 1) / (nt / p) * TILE_COLS;
    int64_t area = tm * tn, half = tm + tn;
    if (area < best_area || (area == best_area && half < best_half)) {
      pm = p;
      best_area = area;
      best_half = half;
    }
  }
  const int pn = nt / pm, i = id / pn, j = id % pn;
  tile_t t = {M * i / pm, M * (i + 1) / pm, nb * j / pn * TILE_COLS, nb * (j + 1) / pn * TILE_COLS};
  if (t.n1 > N) t.n1 = N;
  if (t.n0 > N) t.n0 = N;
  return t;
}

void kern_cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N,
                         int IC, int OC, int ldo) {
  KERN_CPU_ASSERT(ldo >= OC);
#pragma omp parallel
  {
    tile_t t = my_tile(N, OC);
    kern_cpu_sgemm('N', 'T', t.m1 - t.m0, t.n1 - t.n0, IC, 1.0f, inp + t.m0 * IC, IC, w + t.n0 * IC,
                   IC, 0.0f, out + t.m0 * (int64_t)ldo + t.n0, ldo);
    /* on the tile just written, while it is still in cache */
    if (bias)
      for (int64_t n = t.m0; n < t.m1; n++) {
        float *o = out + n * ldo;
        for (int64_t c = t.n0; c < t.n1; c++) o[c] += bias[c];
      }
  }
}

/* The three gradients write disjoint memory, so each thread goes from its tile
 * of dinp to its tile of dw to its channels of dbias without a barrier. */
void kern_cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int N, int IC, int OC, int ldo, int acc) {
  KERN_CPU_ASSERT(ldo >= OC);
  if (OC <= 0) { /* an empty sum: sgemm leaves C as it was, even with beta 0 */
    if (!acc && N > 0 && IC > 0) memset(dinp, 0, (size_t)N * IC * sizeof(float));
    return;
  }
#pragma omp parallel
  {
    /* dinp (N, IC) += dout (N, OC) @ w (OC, IC); = without acc (beta 0: not read) */
    tile_t t = my_tile(N, IC);
    kern_cpu_sgemm('N', 'N', t.m1 - t.m0, t.n1 - t.n0, OC, 1.0f, dout + t.m0 * (int64_t)ldo, ldo,
                   w + t.n0, IC, acc ? 1.0f : 0.0f, dinp + t.m0 * IC + t.n0, IC);
    /* dw (OC, IC) += dout^T (OC, N) @ inp (N, IC) */
    t = my_tile(OC, IC);
    kern_cpu_sgemm('T', 'N', t.m1 - t.m0, t.n1 - t.n0, N, 1.0f, dout + t.m0, ldo, inp + t.n0, IC,
                   1.0f, dw + t.m0 * IC + t.n0, IC);
    /* dbias: column sums, each thread over its own channels, in
     * kern_math.h's order */
    if (dbias) {
      int c0, c1;
      kern_cpu_channel_range(OC, &c0, &c1);
      kern_cpu_colsum(dbias, NULL, dout, NULL, NULL, NULL, N, ldo, c0, c1);
    }
  }
}

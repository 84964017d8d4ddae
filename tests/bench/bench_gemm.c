/* bench_gemm: large square sgemm throughput of the CPU matrix libraries we could
 * use, measured in one binary so the ratios come from one run: oneDNN's
 * dnnl_sgemm (linked: the library the cpu kernels call), and OpenBLAS and BLIS
 * through cblas_sgemm, each loaded with dlopen(RTLD_LOCAL) so that their
 * identically named symbols do not collide.
 *
 *   bench_gemm [-l onednn,blis,openblas] [-n 2048[,4096]] [-r REPS] THREADS...
 *
 * One line per (library, threads, n): best GFLOP/s over REPS timed calls after
 * one warm-up call (best, not mean: the machines are shared and noisy, and the
 * best is what the library can do). kernel= names what the library chose:
 * oneDNN's effective ISA, BLIS's sub-configuration, OpenBLAS's core (it reads
 * OPENBLAS_CORETYPE when it is loaded, so a run with another core type is a
 * separate process; this program never sets it).
 *
 * Exit status: 0, 1 on a failed or wrong product, 3 when a requested library
 * is not installed (run.sh skips it then). */
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/bench/benchutil.h"

#define EXIT_MISSING 3

/* CBLAS enum values (cblas.h), passed as int: the same ABI. */
enum { ROW_MAJOR = 101, NO_TRANS = 111 };
typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha,
                               const float *A, int lda, const float *B, int ldb, float beta,
                               float *C, int ldc);

typedef struct gemm_lib {
  const char *name;
  void *dl;              /* NULL for oneDNN (linked) */
  cblas_sgemm_fn sgemm;  /* NULL for oneDNN */
  void (*set_threads)(int n);
  char kernel[64];
} gemm_lib_t;

static const char *onednn_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
  case dnnl_cpu_isa_sse41: return "sse41";
  case dnnl_cpu_isa_avx: return "avx";
  case dnnl_cpu_isa_avx2: return "avx2";
  case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
  case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
  case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
  case dnnl_cpu_isa_avx512_core: return "avx512_core";
  case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
  case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
  case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
  default: return "unknown";
  }
}

static void omp_threads(int n) { omp_set_num_threads(n); }

static void *sym(void *dl, const char *name) {
  dlerror();
  return dlsym(dl, name);
}

/* 0, or EXIT_MISSING with a message when the library is not there. */
static int lib_open(gemm_lib_t *L, const char *name) {
  memset(L, 0, sizeof *L);
  L->name = name;
  if (!strcmp(name, "onednn")) {
    L->set_threads = omp_threads;
    snprintf(L->kernel, sizeof L->kernel, "%s", onednn_isa_name(dnnl_get_effective_cpu_isa()));
    return 0;
  }
  const char *so;
  if (!strcmp(name, "openblas")) so = "libopenblas.so.0";
  else if (!strcmp(name, "blis")) so = "libblis.so.4";
  else {
    fprintf(stderr, "bench_gemm: unknown library '%s' (onednn, blis, openblas)\n", name);
    return 2;
  }
  L->dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!L->dl) {
    fprintf(stderr, "bench_gemm: %s not loadable (%s); install its Debian package\n", so, dlerror());
    return EXIT_MISSING;
  }
  L->sgemm = (cblas_sgemm_fn)sym(L->dl, "cblas_sgemm");
  if (!strcmp(name, "openblas")) {
    L->set_threads = (void (*)(int))sym(L->dl, "openblas_set_num_threads");
    char *(*corename)(void) = (char *(*)(void))sym(L->dl, "openblas_get_corename");
    snprintf(L->kernel, sizeof L->kernel, "%s", corename ? corename() : "unknown");
  } else {
    /* BLIS' OpenMP build: its own thread count, not omp_set_num_threads. */
    L->set_threads = (void (*)(int))sym(L->dl, "bli_thread_set_num_threads");
    int (*arch_id)(void) = (int (*)(void))sym(L->dl, "bli_arch_query_id");
    const char *(*arch_str)(int) = (const char *(*)(int))sym(L->dl, "bli_arch_string");
    snprintf(L->kernel, sizeof L->kernel, "%s", arch_id && arch_str ? arch_str(arch_id()) : "unknown");
  }
  if (!L->sgemm || !L->set_threads) {
    fprintf(stderr, "bench_gemm: %s lacks cblas_sgemm or its thread setter\n", so);
    return 1;
  }
  return 0;
}

/* C (n,n) = A (n,n) @ B (n,n), row-major. */
static int lib_sgemm(const gemm_lib_t *L, int n, const float *A, const float *B, float *C) {
  if (L->sgemm) {
    L->sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    return 0;
  }
  return dnnl_sgemm('N', 'N', n, n, n, 1.0f, A, n, B, n, 0.0f, C, n) == dnnl_success ? 0 : 1;
}

/* Spot-checks entries against a double-precision dot product: a wrong symbol or
 * a wrong argument order would otherwise pass as a fast benchmark. */
static int check_product(int n, const float *A, const float *B, const float *C) {
  uint64_t s = 12345;
  for (int k = 0; k < 32; k++) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    int i = (int)((s >> 33) % (uint64_t)n), j = (int)((s >> 13) % (uint64_t)n);
    double ref = 0, mag = 0;
    for (int p = 0; p < n; p++) {
      ref += (double)A[(size_t)i * n + p] * B[(size_t)p * n + j];
      mag += fabs((double)A[(size_t)i * n + p] * B[(size_t)p * n + j]);
    }
    if (fabs(C[(size_t)i * n + j] - ref) > 1e-4 * mag + 1e-6) return 1;
  }
  return 0;
}

static int run(const gemm_lib_t *L, int threads, int n, int reps) {
  size_t nn = (size_t)n * n;
  float *A = aligned_alloc(64, nn * sizeof(float));
  float *B = aligned_alloc(64, nn * sizeof(float));
  float *C = aligned_alloc(64, nn * sizeof(float));
  int rc = 1;
  if (!A || !B || !C) {
    fprintf(stderr, "bench_gemm: out of memory for n=%d\n", n);
    goto out;
  }
  uint32_t s = 1;
  for (size_t i = 0; i < nn; i++) {
    s = s * 1664525u + 1013904223u;
    A[i] = (float)(s >> 8) / (float)(1u << 24) - 0.5f;
    s = s * 1664525u + 1013904223u;
    B[i] = (float)(s >> 8) / (float)(1u << 24) - 0.5f;
  }
  memset(C, 0, nn * sizeof(float));
  L->set_threads(threads);
  if (lib_sgemm(L, n, A, B, C) || check_product(n, A, B, C)) { /* warm-up, checked */
    fprintf(stderr, "bench_gemm: lib=%s n=%d: wrong or failed product\n", L->name, n);
    goto out;
  }
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now_s();
    lib_sgemm(L, n, A, B, C);
    double dt = bench_now_s() - t0;
    if (dt < best) best = dt;
  }
  printf("bench: gemm lib=%s threads=%d n=%d gflops=%.1f kernel=%s reps=%d\n", L->name, threads, n,
         2.0 * n * n * (double)n / best * 1e-9, L->kernel, reps);
  fflush(stdout);
  rc = 0;
out:
  free(A);
  free(B);
  free(C);
  return rc;
}

static int parse_list(const char *s, int *out, int max) {
  int k = 0;
  char *end;
  while (*s && k < max) {
    long v = strtol(s, &end, 10);
    if (end == s || v <= 0 || v > 65536) return -1;
    out[k++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return k;
}

static int usage(void) {
  fprintf(stderr, "usage: bench_gemm [-l onednn,blis,openblas] [-n 2048[,4096]] [-r REPS] THREADS...\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *libs = "onednn,blis,openblas";
  int sizes[8] = {2048}, nsizes = 1, reps = 5, threads[16], nthreads = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-l") && i + 1 < argc) {
      libs = argv[++i];
    } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
      if ((nsizes = parse_list(argv[++i], sizes, 8)) <= 0) return usage();
    } else if (!strcmp(argv[i], "-r") && i + 1 < argc) {
      reps = atoi(argv[++i]);
      if (reps <= 0) return usage();
    } else if (argv[i][0] != '-' && nthreads < 16) {
      if (parse_list(argv[i], &threads[nthreads++], 1) != 1) return usage();
    } else {
      return usage();
    }
  }
  if (nthreads == 0) threads[nthreads++] = 1;

  char buf[256];
  snprintf(buf, sizeof buf, "%s", libs);
  int rc = 0;
  for (char *save = NULL, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
    gemm_lib_t L;
    int lrc = lib_open(&L, name);
    if (lrc) {
      if (lrc == EXIT_MISSING && rc == 0) rc = EXIT_MISSING;
      else if (lrc != EXIT_MISSING) rc = 1;
      continue;
    }
    for (int s = 0; s < nsizes; s++)
      for (int t = 0; t < nthreads; t++)
        if (run(&L, threads[t], sizes[s], reps)) rc = 1;
    /* Libraries stay loaded: unloading OpenMP/pthread pools mid-process is unsafe. */
  }
  return rc;
}

/* bench_comm: ring all_gather and reduce_scatter bus bandwidth with 2 rank
 * processes on loopback, against this machine's single-thread memcpy
 * bandwidth measured in the same run.
 *
 * Figures follow nccl-tests: bytes is the whole buffer (all_gather's output,
 * reduce_scatter's input), algbw = bytes / time, busbw = algbw * (n-1)/n.
 * Each size runs a fixed number of ops (the same on both ranks, at least 10),
 * each timed alone after a barrier; the median is reported, with rank 0's CPU time
 * per op (every thread of the process), which a loaded machine does not
 * inflate: a time_ms far above cpu_ms means the ranks waited for a core.
 * Buffers are filled with nonzero bytes first: pages never written (malloc
 * plus a memset to 0 becomes calloc) all read the kernel's one zero page,
 * which stays in cache and would make reading the input free.
 * Output: `bench:` lines. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/bench/benchutil.h"
#include "daemon/comm/ring.h"
#include "daemon/comm/reg.h"
#include "daemon/common/err.h"

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double memcpy_gbps(size_t bytes) {
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b) return 0;
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double best = 1e30;
  for (int i = 0; i < 5; i++) {
    double t = bench_now_s();
    memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
    t = bench_now_s() - t;
    if (t < best) best = t;
  }
  free(a);
  free(b);
  return bytes / best / 1e9;
}


#define NSIZES 5
static const size_t sizes_mib[NSIZES] = {1, 4, 16, 64, 256};

/* The ops, as nccl-tests reports them: out of place, and in place (this
 * rank's block of the all_gather output is its input; its reduce_scatter
 * result lands on its block of the input). */
#define NOPS 4
static const char *const op_names[NOPS] = {"all_gather", "reduce_scatter", "all_gather",
                                           "reduce_scatter"};
static const char *const op_place[NOPS] = {"out", "out", "in", "in"};

/* Buffers from malloc, and registered ones (comm_reg_alloc, as the training
 * runtime allocates what it communicates; nccl-tests' -R). */
#define NBUFS 2
static const char *const buf_names[NBUFS] = {"plain", "registered"};

/* Runs every op and size on buffers of kind reg; rank 0 writes the median
 * seconds to med[op][size] and the median CPU seconds to cpu[op][size]. */
static int run_rank(int rank, const char *const *addrs, int lfd, int reg,
                    double med[NOPS][NSIZES], double cpu[NOPS][NSIZES]) {
  const int N = 2;
  comm_ring_opts_t o = {.rank = rank, .size = N, .addrs = addrs, .name = "bench",
                        .listen_fd = lfd, .timeout_ms = 30000};
  comm_t *c;
  if (comm_ring_create(&o, &c) < 0) {
    fprintf(stderr, "bench_comm rank %d: %s\n", rank, err_msg());
    return 1;
  }
  size_t maxb = sizes_mib[NSIZES - 1] << 20;
  char *big = reg ? comm_reg_alloc(MEM_COMM, maxb, "bench") : malloc(maxb);
  char *small = reg ? comm_reg_alloc(MEM_COMM, maxb / N, "bench") : malloc(maxb / N);
  if (!big || !small) return 1;
  memset(big, 1, maxb);
  memset(small, 1, maxb / N);
  for (int op = 0; op < NOPS; op++) {
    for (int s = 0; s < NSIZES; s++) {
      size_t bytes = sizes_mib[s] << 20, count = bytes / 4 / N;
      char *mine = big + (size_t)rank * count * 4; /* this rank's block, in place */
      int iters = (int)((1024u << 20) / bytes);
      if (iters > 40) iters = 40;
      if (iters < 30) iters = 30;
      double t[64], u[64];
      for (int i = -1; i < iters; i++) { /* one warm-up */
        if (comm_barrier(c) < 0) goto fail;
        double t0 = bench_now_s(), u0 = bench_cpu_s();
        int rc = op % 2 == 0
                     ? comm_all_gather(c, op < 2 ? small : mine, big, count, COMM_F32)
                     : comm_reduce_scatter(c, big, op < 2 ? small : mine, count, COMM_F32, COMM_SUM);
        if (rc < 0) goto fail;
        if (i >= 0) t[i] = bench_now_s() - t0, u[i] = bench_cpu_s() - u0;
      }
      qsort(t, (size_t)iters, sizeof *t, cmp_d);
      qsort(u, (size_t)iters, sizeof *u, cmp_d);
      med[op][s] = t[iters / 2];
      cpu[op][s] = u[iters / 2];
    }
  }
  comm_destroy(c);
  if (reg) comm_reg_free(big), comm_reg_free(small);
  else free(big), free(small);
  return 0;
fail:
  fprintf(stderr, "bench_comm rank %d: %s\n", rank, err_msg());
  comm_destroy(c);
  return 1;
}

int main(void) {
  const int N = 2;
  double mc = memcpy_gbps((size_t)256 << 20);
  printf("bench: memcpy gbps=%.2f bytes=256MiB threads=1\n", mc);
  fflush(stdout);

  double at64[NBUFS][NOPS] = {{0}};
  for (int reg = 0; reg < NBUFS; reg++) {
    char addr[2][64];
    int lfd[2];
    for (int i = 0; i < N; i++)
      if ((lfd[i] = bench_listen_loopback(addr[i], sizeof addr[i])) < 0) {
        perror("bench_comm: bind");
        return 1;
      }
    const char *addrs[2] = {addr[0], addr[1]};
    pid_t p = fork();
    if (p < 0) return 1;
    double med[NOPS][NSIZES], cpu[NOPS][NSIZES];
    if (p == 0) {
      close(lfd[0]);
      _exit(run_rank(1, addrs, lfd[1], reg, med, cpu));
    }
    close(lfd[1]);
    int rc = run_rank(0, addrs, lfd[0], reg, med, cpu);
    int st = 0;
    waitpid(p, &st, 0);
    if (rc || !WIFEXITED(st) || WEXITSTATUS(st)) return 1;
    for (int op = 0; op < NOPS; op++)
      for (int s = 0; s < NSIZES; s++) {
        double bytes = (double)(sizes_mib[s] << 20), alg = bytes / med[op][s] / 1e9;
        double bus = alg * (N - 1) / N;
        if (sizes_mib[s] == 64) at64[reg][op] = bus;
        printf("bench: comm op=%s place=%s buffers=%s ranks=%d bytes=%zu algbw_gbps=%.2f "
               "busbw_gbps=%.2f time_ms=%.3f cpu_ms=%.3f\n", op_names[op], op_place[op],
               buf_names[reg], N, sizes_mib[s] << 20, alg, bus, med[op][s] * 1e3,
               cpu[op][s] * 1e3);
      }
    fflush(stdout);
  }
  for (int reg = 0; reg < NBUFS; reg++)
    for (int op = 0; op < NOPS; op++) {
      double ratio = mc > 0 ? at64[reg][op] / mc : 0;
      /* the sharded runtime allocates everything it communicates registered */
      printf("bench: target name=ring_busbw_vs_memcpy op=%s place=%s buffers=%s bytes=64MiB "
             "ratio=%.2f goal=>=0.50 met=%s busbw_gbps=%.2f memcpy_gbps=%.2f "
             "used_by_training=%s\n", op_names[op], op_place[op], buf_names[reg], ratio,
             ratio >= 0.50 ? "yes" : "no", at64[reg][op], mc, reg ? "yes" : "no");
    }
  return 0;
}

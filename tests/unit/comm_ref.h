/* comm_ref: the inputs and float64 references the collective tests check
 * every backend against (test_comm.c: the ring; tests/cuda/test_nccl_ranks.c:
 * NCCL at several ranks). Each rank fills its buffers with values drawn from
 * (seed, rank, index), so any rank can compute what every other sent.
 * Header-only: the two tests link different libraries. */
#ifndef FSDP_TESTS_COMM_REF_H
#define FSDP_TESTS_COMM_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/comm/comm.h"
#include "daemon/common/rng.h"
#include "kernels/kern_math.h"

/* Value of element i on rank r for a test case (seed). bf16: rounded to bf16. */
static inline double comm_ref_val(uint64_t seed, int r, size_t i, comm_dtype_t dt) {
  double v = rng_unit(rng_mix(seed * 1000003u + (uint64_t)r * 0x100000001ull + i)) * 2.0 - 1.0;
  float f = (float)v;
  if (dt == COMM_BF16) f = kern_bf16_to_f32(kern_f32_to_bf16(f));
  return f;
}

/* p[0, n) = rank r's elements off .. off+n. */
static inline void comm_ref_fill(void *p, uint64_t seed, int r, size_t off, size_t n,
                                 comm_dtype_t dt) {
  for (size_t i = 0; i < n; i++) {
    float f = (float)comm_ref_val(seed, r, off + i, dt);
    if (dt == COMM_F32) ((float *)p)[i] = f;
    else ((uint16_t *)p)[i] = kern_f32_to_bf16(f);
  }
}

static inline double comm_ref_get(const void *p, size_t i, comm_dtype_t dt) {
  return dt == COMM_F32 ? ((const float *)p)[i] : kern_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* out[i] (i < n) against the sum (or average) over N ranks of element
 * base+i: 0, or -1 with why (len bytes) naming the element. Bounds: fp32
 * within 4e-7 of the magnitude per rank; bf16, N-1 roundings each within
 * 2^-8 of a partial sum, and at 2 ranks exactly one rounding of the fp32
 * sum (or average). */
static inline int comm_ref_check_reduce(char *why, size_t len, int N, const void *out, size_t n,
                                        size_t base, uint64_t seed, comm_dtype_t dt,
                                        comm_redop_t op) {
  for (size_t i = 0; i < n; i++) {
    double exact = 0, mag = 0;
    for (int j = 0; j < N; j++) {
      double x = comm_ref_val(seed, j, base + i, dt);
      exact += x;
      mag += fabs(x);
    }
    if (op == COMM_AVG) exact /= N, mag /= N;
    double got = comm_ref_get(out, i, dt), tol;
    if (dt == COMM_F32) tol = 4e-7 * mag * N + 1e-30;
    else tol = (N - 1) * 0x1p-8 * mag * 1.0001 + 1e-30;
    if (fabs(got - exact) > tol) {
      snprintf(why, len, "element %zu: got %.9g, float64 reference %.9g (tolerance %.3g)", i,
               got, exact, tol);
      return -1;
    }
    if (dt == COMM_BF16 && N == 2) { /* exactly one rounding of the fp32 sum */
      float a = (float)comm_ref_val(seed, 0, base + i, dt),
            b = (float)comm_ref_val(seed, 1, base + i, dt);
      float s = op == COMM_AVG ? (b + a) / 2.0f : b + a;
      if (((const uint16_t *)out)[i] != kern_f32_to_bf16(s)) {
        snprintf(why, len, "element %zu: 2-rank bf16 sum is not bf16(a + b)", i);
        return -1;
      }
    }
  }
  return 0;
}

/* out[0, n) equal to rank src's elements base .. base+n: 0, or -1 with why. */
static inline int comm_ref_check_exact(char *why, size_t len, const void *out, size_t n,
                                       uint64_t seed, int src, size_t base, comm_dtype_t dt) {
  for (size_t i = 0; i < n; i++)
    if (comm_ref_get(out, i, dt) != comm_ref_val(seed, src, base + i, dt)) {
      snprintf(why, len, "element %zu from rank %d: got %.9g, want %.9g", i, src,
               comm_ref_get(out, i, dt), comm_ref_val(seed, src, base + i, dt));
      return -1;
    }
  return 0;
}

#endif

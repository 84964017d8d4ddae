/* mma.h for cuda_emu (cuda_emu.h): nvcuda::wmma's 16 x 16 x 16 fragments
 * with bf16 or fp32 operands and fp32 accumulators, what kernels/cuda uses.
 *
 * A fragment holds 8 of its 256 elements in each of the warp's 32 lanes
 * (a and b: lane l has elements 8l .. 8l+7 of the matrix in row-major
 * order; the accumulator: 32e + l; the hardware's mappings differ, and code
 * may not depend on any). Loads,
 * stores and fills touch only the lane's own elements; mma_sync gathers the
 * warp's operands (a warp barrier), computes the lane's 8 outputs in fp32
 * (bf16 x bf16 is exact in fp32; the sum over k in order), waits for the warp
 * again and writes them, so d may be a, b or c. Pointers must be 256-bit
 * aligned and leading dimensions multiples of 16 bytes, as the CUDA guide
 * requires; a violation stops the run naming it. */
#ifndef FSDP_CUDA_EMU_MMA_H
#define FSDP_CUDA_EMU_MMA_H

#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda_emu.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {
  static const bool is_col = false;
};
struct col_major {
  static const bool is_col = true;
};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int m, int n, int k, class T, class Layout = void> struct fragment {
  static_assert(m == 16 && n == 16 && k == 16, "cuda_emu: only 16 x 16 x 16 fragments");
  enum { num_elements = 8 };
  T x[8];
};

static inline int emu_lane(void) { return emu::cur->lin & 31; }

static inline void emu_check(const void *p, unsigned ldm, size_t es, const char *what) {
  if ((uintptr_t)p % 32) emu::fail("wmma::%s: pointer %p is not 256-bit aligned", what, p);
  if ((size_t)ldm * es % 16)
    emu::fail("wmma::%s: leading dimension %u (%zu-byte elements) is not a multiple of 16 bytes",
              what, ldm, es);
}

static inline float emu_f(float v) { return v; }
static inline float emu_f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* matrix_a / matrix_b: the layout is the fragment's */
template <class Use, class T, class L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
  emu_check(p, ldm, sizeof(T), "load_matrix_sync");
  const int base = emu_lane() * 8;
  for (int e = 0; e < 8; e++) {
    const int r = (base + e) / 16, c = (base + e) % 16;
    f.x[e] = L::is_col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
  }
}

/* The accumulator's lanes hold other elements than a and b's (element e
 * of lane l is matrix element 32e + l), as the hardware's layouts differ
 * too: code that moved an accumulator's x[] into an operand's computes
 * garbage here as there. */
static inline int emu_acc_index(int e) { return e * 32 + emu_lane(); }

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ldm, layout_t l) {
  emu_check(p, ldm, sizeof(float), "load_matrix_sync");
  for (int e = 0; e < 8; e++) {
    const int r = emu_acc_index(e) / 16, c = emu_acc_index(e) % 16;
    f.x[e] = l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
  }
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t l) {
  emu_check(p, ldm, sizeof(float), "store_matrix_sync");
  for (int e = 0; e < 8; e++) {
    const int r = emu_acc_index(e) / 16, c = emu_acc_index(e) % 16;
    (l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[e];
  }
}

template <class Use, class T, class L, class V>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, V v) {
  for (int e = 0; e < 8; e++)
    f.x[e] = (T)v;
}

/* d = a b + c; every lane calls it (a warp collective). */
template <class T, class LA, class LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
  struct ops {
    const T *a, *b;
  } mine = {a.x, b.x}, all[32];
  emu::warp_gather(&mine, all, sizeof mine);
  /* element i of a and b is in lane i / 8, slot i % 8 */
  auto A = [&](int r, int k) { return emu_f(all[(r * 16 + k) / 8].a[(r * 16 + k) % 8]); };
  auto B = [&](int k, int n) { return emu_f(all[(k * 16 + n) / 8].b[(k * 16 + n) % 8]); };
  float out[8];
  for (int e = 0; e < 8; e++) {
    const int r = emu_acc_index(e) / 16, n = emu_acc_index(e) % 16;
    float s = 0.0f;
    for (int k = 0; k < 16; k++)
      s += A(r, k) * B(k, n);
    out[e] = s + c.x[e];
  }
  emu::sync_warp(2); /* every lane has read a and b */
  for (int e = 0; e < 8; e++)
    d.x[e] = out[e];
}

} /* namespace wmma */
} /* namespace nvcuda */

#endif

/* cuda_emu: runs kernels/cuda's kernels on the CPU, so their logic (every
 * index, tile edge, barrier and warp exchange) is tested where there is no
 * GPU: in `make test`, in CI.
 *
 * What it is: the .cu files compiled by g++ as C++ against CUDA's own host
 * headers (the types, enums and prototypes of the runtime, cuBLASLt and
 * bf16), with this header force-included (-include) and two rewrites done by
 * tests/cuda/emu/emu-cu.pl before compiling: `k<<<grid, block, smem,
 * stream>>>(args)` becomes `emu::cfg(grid, block, smem, stream).k(k)(args)`,
 * and `extern __shared__ T name[];` a pointer to the launch's dynamic shared
 * memory. cuda_emu.cc holds the runtime: device memory is host memory, a
 * stream runs each call as it is made (or queues it: CUDA_EMU_STREAMS), and a
 * launch runs each block in turn,
 * each of its threads on its own small stack (a fiber), switching at
 * __syncthreads, __syncwarp, the warp shuffles, WMMA's mma_sync and the
 * PTX warp collectives attention_tc.cu uses (mma.sync m16n8k16, ldmatrix)
 * (the order in which threads run between barriers: cuda_emu.cc). cp.async
 * copies land when their thread waits for them (or, in the random order,
 * half of them at once: emu::cp_async). cuBLASLt's
 * matmul is oneDNN's sgemm on the operands rounded as the compute type
 * rounds them.
 *
 * What it checks that a GPU would too: launch limits (1024 threads a block,
 * 48 KiB of dynamic shared memory unless cudaFuncSetAttribute allowed more,
 * never more than the device's opt-in limit), WMMA's alignment rules (256-bit
 * aligned pointers, leading dimensions of 16 bytes), the 16-byte loads and
 * stores of cuda_impl.h's wide accesses and its 8-byte ones (aligned,
 * inside a device buffer: emu::wide_access), ldmatrix's and cp.async's addresses (aligned, in
 * dynamic shared memory), a cp.async read before it was waited for and
 * a barrier passed, or never waited for at all, a barrier some threads
 * never reach (a deadlock, reported with the kernel and block), lanes of a
 * warp at different collectives, a warp collective with lanes exited or
 * missing, device and dynamic shared memory read before it is written (both
 * start as 0xff bytes: NaN) or dynamic shared memory past its end (a guard
 * page). What it cannot check: speed; a race between warps that only a
 * warp held elsewhere than at its first three __syncwarps would show (the
 * random order holds one there: cuda_emu.cc); static __shared__ arrays read before written (see __shared__ below);
 * the order of streams and events by default (every call is done when it
 * returns, so a missing cudaStreamWaitEvent passes; CUDA_EMU_STREAMS=deferred
 * queues work and runs it only when waited for, latest first, which shows
 * one, and CUDA_EMU_STREAMS=ahead runs the kernels ahead of NCCL's
 * collectives, which shows a buffer reused before its collective was
 * waited for: cuda_emu.cc); __launch_bounds__; and the GPU's own
 * rounding of expf and friends (glibc's here; kern_math.h's formulas are the
 * same bits on both).
 *
 * WMMA fragments are split across the warp's 32 lanes (8 elements each, as on
 * the hardware, though the mapping is this emulator's own): code that assumed
 * a mapping would compute garbage here too. */
#ifndef FSDP_CUDA_EMU_H
#define FSDP_CUDA_EMU_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

/* ---- the device qualifiers become plain C++ ---- */
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __shared__
/* One copy: blocks run one at a time. Unlike dynamic shared memory it is
 * not refilled with 0xff at each block (gcc places a template's statics
 * where it will): a block reads what the last one left, zeros at first. */
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __forceinline__
#define __forceinline__ inline

namespace emu {

/* A cp.async copy issued and not yet landed (cp_async). */
struct async_copy {
  void *dst;
  const void *src;
  unsigned bytes, src_bytes, group;
};
#define EMU_ASYNC_MAX 64 /* copies a thread may have in flight */

/* One emulated thread (a fiber). */
struct thread {
  void *sp;           /* saved stack pointer while switched out */
  uint3 tid;          /* threadIdx */
  int lin;            /* linear index in the block */
  int state;          /* RUN, BLOCK_BAR, WARP_BAR, DONE (cuda_emu.cc) */
  int tag;            /* at a warp barrier: which collective (sync_warp) */
  unsigned exchanges; /* warp exchanges made so far (their slots: parity) */
  char *stack;        /* its stack (reused from launch to launch) */
  async_copy pend[EMU_ASYNC_MAX]; /* its cp.async copies in flight, in issue order */
  int npend;
  unsigned committed; /* cp.async groups committed so far */
};

extern thread *cur; /* the thread running now */
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;

/* Barriers and exchanges (cuda_emu.cc). */
void sync_block(void);
/* A warp barrier; tag says which collective it is (0: __syncwarp), and every
 * lane of the warp must be at the same one (else the run stops). */
void sync_warp(int tag = 0);
/* Every lane puts `bytes` of `v` in its warp's slot, waits for the warp, and
 * gets lane `src`'s (the caller computes src). */
void warp_exchange(const void *v, void *out, size_t bytes, int src);
/* Every lane gets every lane's `bytes` of `v`, in lane order, into all[32]. */
void warp_gather(const void *v, void *all, size_t bytes);
void *dyn_smem(void);
/* Do bytes at p lie inside the running block's dynamic shared memory? */
bool in_dyn_smem(const void *p, size_t bytes);
/* cp.async.{ca,cg}.shared.global [dst], [src], bytes, src_bytes
 * (attention_tc.cu's tc_cp_async): a copy of src_bytes (0 or bytes) from
 * device memory into the block's dynamic shared memory, the rest zeros,
 * both ends aligned to bytes (4, 8 or 16). It lands when the thread waits
 * for its group (cp_async_wait), so a read before the wait, or by another
 * thread before a barrier after it, sees the old bytes; in the random order
 * (CUDA_EMU_ORDER=random) half the copies land at once instead, over
 * whatever another warp may still be reading there. A thread that ends with
 * copies in flight stops the run. */
void cp_async(void *dst, const void *src, unsigned bytes, unsigned src_bytes);
/* cp.async.commit_group: the copies issued since the last one form a group. */
void cp_async_commit(void);
/* cp.async.wait_group n: lands every committed group but the n latest. */
void cp_async_wait(unsigned n);
/* Is [p, p + n) inside one cudaMalloc'ed buffer? */
bool device_range(const void *p, size_t n);
/* One of cuda_impl.h's n-byte loads or stores (16, or 8; what: the helper)
 * at p: stops the run unless p is n-byte aligned (a GPU's
 * misaligned-address error, where a CPU would read on) and, with
 * synchronous streams, the n bytes lie inside one device buffer (a wide
 * access past the end that scalar code would not make). */
void wide_access(const void *p, const char *what, size_t n = 16);
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

typedef void (*body_fn)(void *);
struct cfg;
/* A launch (cuda_emu.cc): the checks a GPU makes at the launch (a failure
 * is the launch's error, cudaGetLastError), then `grid` on c's stream. */
void launch(const cfg &c, const void *kernel, const char *name, std::function<void()> grid);
/* Every block of a launch, one after another. */
void run_grid(const cfg &c, const char *name, body_fn body, void *ctx);

/* A launch's configuration; .k(kernel) binds the kernel, (args) launches it:
 * the arguments are copied (as a GPU's launch copies them) into the work
 * its stream runs (at once, or queued: CUDA_EMU_STREAMS, cuda_emu.cc). */
struct cfg {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0) : grid(g), block(b), smem(s), stream(st) {}
  template <class... P> struct bound {
    const cfg *c;
    void (*f)(P...);
    const char *name;
    template <class... A> void operator()(A &&...a) const {
      auto args = std::make_shared<std::tuple<P...>>(static_cast<P>(a)...);
      void (*fn)(P...) = f;
      const cfg cc = *c;
      const char *nm = name;
      launch(cc, (const void *)f, name, [fn, args, cc, nm]() {
        struct ctx_t {
          void (*f)(P...);
          std::tuple<P...> *args;
        } ctx = {fn, args.get()};
        run_grid(cc, nm,
                 [](void *p) {
                   ctx_t *x = (ctx_t *)p;
                   std::apply(x->f, *x->args); /* each thread gets its own copies */
                 },
                 &ctx);
      });
    }
  };
  template <class... P> bound<P...> k(void (*f)(P...), const char *name) const {
    return bound<P...>{this, f, name};
  }
};

/* Streams (cuda_emu.cc): are they deferred (CUDA_EMU_STREAMS=deferred or
 * ahead)? */
bool deferred(void);
/* Queues work on stream s (or runs it now, when not deferred): `step` is
 * called, with stream_mu() held, until it says it is done (a collective
 * waiting for its peers says not yet). collective: NCCL's (which
 * CUDA_EMU_STREAMS=ahead holds back while the other work runs ahead). */
void enqueue(cudaStream_t s, std::function<bool()> step, bool collective = false);
/* Held while queued work runs; nccl_emu.cc takes it to touch what queued
 * collectives touch. */
std::mutex &stream_mu(void);

} /* namespace emu */

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (attention_tc.cu's
 * kern_cuda_mma_bf16): d += a b for the warp's 16 x 16 a and 16 x 8 b, in
 * the PTX ISA's fragment layouts, which (unlike WMMA's) are documented and
 * which code may build on. With g = lane / 4 and t = lane % 4, each 32-bit
 * register holding two bf16 (the lower column or row in its low half):
 * a[0] is a's row g, columns 2t and 2t + 1; a[1] row g + 8, the same
 * columns; a[2] and a[3] the same rows at columns 8 + 2t, 8 + 2t + 1; b[0]
 * is b's column g at rows 2t, 2t + 1, and b[1] at rows 8 + 2t, 8 + 2t + 1;
 * d[0], d[1] are d's row g, columns 2t, 2t + 1 and d[2], d[3] row g + 8. A
 * warp collective; products exact in fp32, summed over k in order. */
namespace emu {
static inline float mma_bf16_at(uint32_t w, int hi) {
  uint32_t u = (hi ? w >> 16 : w & 0xffffu) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  struct ops {
    uint32_t a[4], b[2];
  } mine, all[32];
  memcpy(mine.a, a, sizeof mine.a);
  memcpy(mine.b, b, sizeof mine.b);
  warp_gather(&mine, all, sizeof mine);
  auto A = [&](int r, int k) { return mma_bf16_at(all[r % 8 * 4 + k % 8 / 2].a[r / 8 + 2 * (k / 8)], k % 2); };
  auto B = [&](int k, int n) { return mma_bf16_at(all[n * 4 + k % 8 / 2].b[k / 8], k % 2); };
  const int g = (cur->lin & 31) / 4, t = (cur->lin & 31) % 4;
  float out[4];
  for (int e = 0; e < 4; e++) {
    const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
    float s = 0.0f;
    for (int k = 0; k < 16; k++) s += A(r, k) * B(k, n);
    out[e] = d[e] + s;
  }
  sync_warp(3); /* every lane has read a and b */
  for (int e = 0; e < 4; e++) d[e] = out[e];
}
} /* namespace emu */

/* ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 (attention_tc.cu's
 * tc_ldsm): lane l gives the address of row l % 8 of matrix l / 8 (lanes
 * from 8N on: ignored), 16 bytes of the block's dynamic shared memory,
 * 16-byte aligned (else the run stops, naming the lane); with g = lane / 4
 * and t = lane % 4, r[m] gets matrix m's row g, the bf16 at columns 2t and
 * 2t + 1 (the lower in the low half), or with TR its column g at rows 2t
 * and 2t + 1. A warp collective: every lane reads before any goes on. */
namespace emu {
template <int N, bool TR> static inline void ldmatrix(uint32_t r[N], const void *row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix takes 1, 2 or 4 matrices");
  const void *all[32];
  warp_gather(&row, all, sizeof row);
  for (int l = 0; l < 8 * N; l++)
    if ((uintptr_t)all[l] % 16 || !in_dyn_smem(all[l], 16))
      fail("ldmatrix: lane %d's row address %p is not 16 aligned bytes of the block's dynamic "
           "shared memory", l, all[l]);
  const int g = (cur->lin & 31) / 4, t = (cur->lin & 31) % 4;
  uint32_t out[N];
  for (int m = 0; m < N; m++) {
    if (!TR) {
      memcpy(&out[m], (const char *)all[8 * m + g] + 4 * t, 4);
    } else {
      uint16_t lo, hi;
      memcpy(&lo, (const char *)all[8 * m + 2 * t] + 2 * g, 2);
      memcpy(&hi, (const char *)all[8 * m + 2 * t + 1] + 2 * g, 2);
      out[m] = lo | (uint32_t)hi << 16;
    }
  }
  sync_warp(4); /* every lane has read */
  for (int m = 0; m < N; m++) r[m] = out[m];
}
} /* namespace emu */

/* cuda_impl.h's wide accesses, each checked (emu::wide_access) */
#define KERN_CUDA_WIDE_CHECK(p) emu::wide_access(p, __func__)
#define KERN_CUDA_WIDE_CHECK8(p) emu::wide_access(p, __func__, 8)

#define threadIdx (emu::cur->tid)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

static inline void __syncthreads(void) { emu::sync_block(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) emu::fail("__syncwarp with a partial mask (%#x) is not emulated", mask);
  emu::sync_warp();
}

template <class T> static inline T emu_shfl(unsigned mask, T v, int src) {
  if (mask != 0xffffffffu)
    emu::fail("a warp shuffle with a partial mask (%#x) is not emulated", mask);
  T r;
  emu::warp_exchange(&v, &r, sizeof v, src);
  return r;
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  if (width != 32) emu::fail("__shfl_sync of width %d is not emulated", width);
  return emu_shfl(mask, v, src & 31);
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  if (width != 32) emu::fail("__shfl_xor_sync of width %d is not emulated", width);
  if (lane_mask < 0 || lane_mask > 31) emu::fail("__shfl_xor_sync with lane mask %d", lane_mask);
  return emu_shfl(mask, v, (emu::cur->lin & 31) ^ lane_mask);
}
/* The warp's lanes (of mask, the whole warp) whose pred is not 0, a bit each. */
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) emu::fail("a warp ballot with a partial mask (%#x) is not emulated", mask);
  int mine = pred != 0, all[32];
  emu::warp_gather(&mine, all, sizeof mine);
  unsigned r = 0;
  for (int l = 0; l < 32; l++) r |= (unsigned)all[l] << l;
  return r;
}
static inline int __ffs(int x) { return __builtin_ffs(x); }

/* nvcc's C++ overloads (cuda_runtime.h declares them for nvcc only) */
template <class T> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, T *f) {
  return ::cudaFuncGetAttributes(a, (const void *)f);
}
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *f, cudaFuncAttribute attr, int v) {
  return ::cudaFuncSetAttribute((const void *)f, attr, v);
}

/* The device's integer min and max, and a rounded fused multiply-add. */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }

#endif

/* cuda_emu.cc: the runtime of cuda_emu (cuda_emu.h says what it is and what
 * it checks): fibers and the block scheduler, the CUDA runtime calls
 * kernels/cuda makes, and cuBLASLt's matmul over oneDNN's sgemm.
 *
 * Scheduling: each pass over a block runs every runnable thread until it
 * reaches a barrier or ends; then a barrier every live thread of its scope
 * has reached is released. By default (CUDA_EMU_ORDER=forward) threads run
 * first to last, and a warp's lanes hand on to each other at its warp
 * barriers without the scheduler (yield), so each warp runs on to its next
 * __syncthreads before the next warp starts: warp 0 is always ahead, which
 * shows a missing __syncthreads where it reads what later warps have yet
 * to write, or overwrites what they have yet to read. CUDA_EMU_ORDER=random (CUDA_EMU_SEED, default 1) runs each
 * pass's threads in a random order and releases one releasable warp at a
 * time, so warps drift apart between __syncthreads as they may on a GPU: a
 * missing __syncthreads (a warp overwriting shared memory another still
 * reads) or __syncwarp (a lane reading what another has not written) that
 * the fixed order happens to satisfy shows there. Between two __syncthreads
 * it also holds one warp back at a __syncwarp until the others can go no
 * further (stretch_start).
 *
 * Environment: CUDA_EMU_SMEM_OPTIN sets the shared memory a block
 * may ask for (default 232448, an H100's; 101376 is compute capability
 * 8.6's); CUDA_EMU_MEMORY caps device memory in bytes (default 8 GiB);
 * CUDA_EMU_DEVICES sets how many GPUs it has (default 1; 0: a machine with
 * none), each the same emulated device; a process may make a context on
 * one of them only (emu_ctx_on: CUDA_EMU_MULTI_DEVICE=1 lifts that).
 *
 * Memory: stream-ordered pools (cudaMemPoolCreate, cudaMallocAsync's default
 * pool) keep the blocks freed into them against CUDA_EMU_MEMORY as a GPU's
 * pool holds them, until a trim or a synchronization past the release
 * threshold (CUDA_EMU_POOLS=0: a device without pools); cuda_emu_waits counts
 * the calls that make a GPU's host wait. CUDA_EMU_LT_BIAS_REFUSE=1 makes
 * cublasLtMatmul refuse every epilogue with a bias its heuristic offered,
 * CUDA_EMU_LT_GELU_REFUSE=1 every GELU epilogue (DGELU's too).
 * A freed block's host memory goes only after CUDA_EMU_QUARANTINE bytes
 * (default 256 MiB) freed since (emu_quarantine): a kernel that reads it
 * after its free finds NaN, or faults where the block spans whole pages,
 * never a later allocation's data. */
#include <atomic>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <oneapi/dnnl/dnnl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"

/* ---- fibers --------------------------------------------------------------
 * x86-64 System V: emu_ctx_switch saves the callee-saved registers on the
 * current stack, stores the stack pointer in *save and continues on `to`'s
 * stack (MXCSR and the x87 control word are not switched: no kernel changes
 * them). A new fiber's stack holds such a
 * frame whose return address is emu_ctx_start, which calls
 * emu_fiber_main(r12). */
#if !defined(__x86_64__)
#error "cuda_emu's fibers are written for x86-64"
#endif
extern "C" void emu_ctx_switch(void **save, void *to);
extern "C" void emu_ctx_start(void);
__asm__(".text\n"
        ".globl emu_ctx_switch\n"
        ".type emu_ctx_switch,@function\n"
        "emu_ctx_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_ctx_switch, .-emu_ctx_switch\n"
        ".globl emu_ctx_start\n"
        ".type emu_ctx_start,@function\n"
        "emu_ctx_start:\n"
        "  movq %r12, %rdi\n  call emu_fiber_main\n  ud2\n"
        ".size emu_ctx_start, .-emu_ctx_start\n");

namespace emu {

enum { RUN, BLOCK_BAR, WARP_BAR, DONE };

thread *cur;
uint3 block_idx;
dim3 block_dim, grid_dim;

static const size_t STACK = 256 << 10; /* each fiber's, its lowest page a guard */
static void *sched_sp;
static thread *threads;
static int nthreads, cap;
static char *stacks;
static body_fn body;
static void *body_ctx;
static const char *kernel_name; /* the running kernel's, for messages */
/* The exchanges' values, [parity][warp][lane][bytes]: exchange k of a warp
 * uses parity k % 2, so one barrier an exchange suffices (a lane writes the
 * slots of k + 1 only after every lane passed k's barrier, which each
 * reached after reading k - 1's). */
static unsigned char slots[2][32][32][32];
/* The block's barrier counts: threads at __syncthreads, done, and per warp
 * at a warp barrier and done; runq holds the threads the next pass runs. */
static int at_block, done, warp_wait[32], warp_done[32], *runq, nrun;
static unsigned char *smem_map, *smem_ptr;
static size_t smem_map_bytes, smem_bytes;
static int random_order = -1; /* CUDA_EMU_ORDER=random */
static uint64_t rng = 1;      /* CUDA_EMU_SEED */

static uint32_t rand_below(uint32_t n) { /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) % n);
}

/* The random order's held warp (-1: none) between two __syncthreads, held
 * at its hold-th __syncwarp there; syncs: each warp's __syncwarps since. */
static int victim = -1, hold, syncs[32];

/* A new stretch between __syncthreads: in the random order, a warp drawn to
 * be held at its 1st, 2nd or 3rd __syncwarp until no other warp can move,
 * as a GPU may leave one warp far behind the others (a missing
 * __syncthreads that lets a warp overwrite what another has yet to read
 * shows then). */
static void stretch_start(int n) {
  memset(syncs, 0, sizeof syncs);
  victim = random_order && n > 32 ? (int)rand_below((uint32_t)(n + 31) / 32) : -1;
  hold = random_order ? 1 + (int)rand_below(3) : 0;
}

void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cuda_emu: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (cur)
    fprintf(stderr, " (kernel %s, block (%u, %u, %u), thread (%u, %u, %u))", kernel_name,
            block_idx.x, block_idx.y, block_idx.z, cur->tid.x, cur->tid.y, cur->tid.z);
  fprintf(stderr, "\n");
  abort();
}

/* Fails unless every lane of warp w waits at the collective lane 0 does. */
static void warp_tags_agree(int w, int n) {
  for (int i = w * 32; i < w * 32 + 32 && i < n; i++)
    if (threads[i].state == WARP_BAR && threads[i].tag != threads[w * 32].tag) {
      cur = &threads[i];
      fail("lanes of warp %d meet at different warp collectives (lane 0 at %d, this at %d: "
           "0 __syncwarp, 2 mma_sync, 1000 + n an exchange of n bytes)",
           w, threads[w * 32].tag, threads[i].tag);
    }
}

/* Switches from the current thread, now at a barrier (state), to the one
 * that runs next. In the forward order a lane at a warp barrier goes
 * straight to the next lane of its warp, and the warp's last lane to
 * arrive releases the warp and goes on with lane 0: a warp runs on to its
 * next __syncthreads (or its end) without the scheduler, one switch a lane
 * and collective (shuffles dominate the fp32 kernels' time here). That the
 * next lane is RUN means it is due later in this pass, which skips it. */
static void yield(int state) {
  cur->state = state;
  thread *next = NULL;
  if (state == BLOCK_BAR) {
    at_block++;
  } else {
    const int w = cur->lin / 32;
    warp_wait[w]++;
    if (!random_order) {
      if (cur->lin % 32 != 31 && cur->lin + 1 < nthreads && threads[cur->lin + 1].state == RUN) {
        next = &threads[cur->lin + 1];
      } else if (warp_wait[w] == 32) {
        warp_tags_agree(w, nthreads);
        for (int i = w * 32; i < w * 32 + 32; i++) threads[i].state = RUN;
        warp_wait[w] = 0;
        next = &threads[w * 32];
      }
    }
  }
  if (!next) {
    emu_ctx_switch(&cur->sp, sched_sp);
    return;
  }
  thread *me = cur;
  cur = next;
  emu_ctx_switch(&me->sp, next->sp);
}

void sync_block(void) { yield(BLOCK_BAR); }

/* A warp collective needs all 32 lanes: one that has exited or never was
 * (a block of other than a multiple of 32 threads) is undefined on a GPU. */
void sync_warp(int tag) {
  const int w = cur->lin / 32;
  if (warp_done[w] || nthreads - w * 32 < 32)
    fail("a warp collective (%s) in warp %d with %d of its 32 lanes",
         tag ? "exchange" : "__syncwarp", w,
         (nthreads - w * 32 < 32 ? nthreads - w * 32 : 32) - warp_done[w]);
  cur->tag = tag;
  yield(WARP_BAR);
}

/* Puts v in the lane's slot of its next exchange and waits for the warp;
 * the slots of that exchange, [lane][bytes]. */
static unsigned char (*exchange_slots(const void *v, size_t bytes))[32] {
  if (bytes > sizeof slots[0][0][0]) fail("a warp exchange of %zu bytes", bytes);
  const int w = cur->lin / 32, l = cur->lin % 32;
  unsigned char(*s)[32] = slots[cur->exchanges++ & 1][w];
  memcpy(s[l], v, bytes);
  sync_warp(1000 + (int)bytes);
  return s;
}

void warp_gather(const void *v, void *all, size_t bytes) {
  unsigned char(*s)[32] = exchange_slots(v, bytes);
  for (int i = 0; i < 32; i++)
    memcpy((char *)all + (size_t)i * bytes, s[i], bytes);
}

void warp_exchange(const void *v, void *out, size_t bytes, int src) {
  if (cur->lin / 32 * 32 + src >= nthreads)
    fail("a shuffle reads lane %d, past the block's last thread", src);
  memcpy(out, exchange_slots(v, bytes)[src], bytes);
}

void *dyn_smem(void) { return smem_ptr; }

static void async_land(const async_copy &c) {
  memcpy(c.dst, c.src, c.src_bytes);
  memset((char *)c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
}

void cp_async(void *dst, const void *src, unsigned bytes, unsigned src_bytes) {
  if ((bytes != 4 && bytes != 8 && bytes != 16) || (src_bytes != 0 && src_bytes != bytes))
    fail("cp.async of %u bytes, %u from the source: not a form used here", bytes, src_bytes);
  if ((uintptr_t)dst % bytes || !in_dyn_smem(dst, bytes))
    fail("cp.async to %p: not %u aligned bytes of the block's dynamic shared memory", dst, bytes);
  if ((uintptr_t)src % bytes)
    fail("cp.async from %p: not aligned to its %u bytes (on a GPU: a misaligned address error)",
         src, bytes);
  if (src_bytes && !deferred() && !device_range(src, src_bytes))
    fail("cp.async from %p: its %u bytes are not inside one device buffer", src, src_bytes);
  if (cur->npend == EMU_ASYNC_MAX)
    fail("more than %d cp.async copies in flight in one thread", EMU_ASYNC_MAX);
  const async_copy c{dst, src, bytes, src_bytes, cur->committed};
  if (random_order && rand_below(2)) { /* it lands at once: over a buffer still being read */
    async_land(c);
    return;
  }
  cur->pend[cur->npend++] = c;
}

void cp_async_commit(void) { cur->committed++; }

void cp_async_wait(unsigned n) {
  int kept = 0;
  for (int i = 0; i < cur->npend; i++) {
    async_copy &c = cur->pend[i];
    if (c.group + n < cur->committed) { /* committed, and not among the n latest */
      async_land(c);
    } else {
      cur->pend[kept++] = c;
    }
  }
  cur->npend = kept;
}

bool in_dyn_smem(const void *p, size_t bytes) {
  const unsigned char *c = (const unsigned char *)p;
  return c >= smem_ptr && bytes <= smem_bytes && (size_t)(c - smem_ptr) <= smem_bytes - bytes;
}

} /* namespace emu */

extern "C" [[noreturn]] void emu_fiber_main(emu::thread *t) {
  emu::body(emu::body_ctx);
  if (t->npend)
    emu::fail("thread %d ended with %d cp.async copies never waited for", t->lin, t->npend);
  t->state = emu::DONE;
  emu::done++;
  emu::warp_done[t->lin / 32]++;
  emu_ctx_switch(&t->sp, emu::sched_sp);
  __builtin_unreachable();
}

namespace emu {

/* The frame emu_ctx_switch pops: after its `ret` the stack pointer is top,
 * 16-byte aligned, as emu_ctx_start's call needs. */
static void *fiber_frame(char *top, thread *t) {
  uint64_t *f = (uint64_t *)(((uintptr_t)top & ~(uintptr_t)15) - 56);
  f[0] = f[1] = f[2] = 0;                    /* r15, r14, r13 */
  f[3] = (uint64_t)(uintptr_t)t;             /* r12: emu_fiber_main's argument */
  f[4] = f[5] = 0;                           /* rbx, rbp */
  f[6] = (uint64_t)(uintptr_t)emu_ctx_start; /* the return address */
  return f;
}

static void fibers_reserve(int n) {
  if (n <= cap) return;
  if (stacks) munmap(stacks, (size_t)cap * STACK);
  free(threads);
  stacks = (char *)mmap(NULL, (size_t)n * STACK, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  threads = (thread *)calloc((size_t)n, sizeof *threads);
  free(runq);
  runq = (int *)calloc((size_t)n, sizeof *runq);
  if (stacks == MAP_FAILED || !threads || !runq) fail("no memory for %d fibers", n);
  for (int i = 0; i < n; i++) {
    threads[i].stack = stacks + (size_t)i * STACK;
    mprotect(threads[i].stack, (size_t)getpagesize(), PROT_NONE);
  }
  cap = n;
}

/* Dynamic shared memory: `bytes` ending at a guard page, 0xff (NaN) at each
 * block's start. */
static void smem_prepare(size_t bytes) {
  const size_t page = (size_t)getpagesize(), round = (bytes + 127) / 128 * 128;
  const size_t need = (round + page - 1) / page * page + page;
  if (need > smem_map_bytes) {
    if (smem_map) munmap(smem_map, smem_map_bytes);
    smem_map = (unsigned char *)mmap(NULL, need, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (smem_map == MAP_FAILED) fail("no memory for %zu bytes of shared memory", bytes);
    smem_map_bytes = need;
    mprotect(smem_map + need - page, page, PROT_NONE);
  }
  smem_ptr = smem_map + smem_map_bytes - page - round;
  smem_bytes = round; /* all of it 0xff at each block's start */
}

/* Runs the threads of one block until all are done: a pass runs the
 * threads of runq, each until it waits at a barrier or ends; then the
 * barriers every live thread of their scope reached are released (exited
 * threads count as arrived), their threads making the next runq. */
static void run_block(int n) {
  for (int i = 0; i < n; i++) {
    thread *t = &threads[i];
    t->lin = i;
    t->tid.x = (unsigned)i % block_dim.x;
    t->tid.y = (unsigned)i / block_dim.x % block_dim.y;
    t->tid.z = (unsigned)i / (block_dim.x * block_dim.y);
    t->state = RUN;
    t->exchanges = 0;
    t->npend = 0;
    t->committed = 0;
    t->sp = fiber_frame(t->stack + STACK, t);
    runq[i] = i;
  }
  nrun = n;
  at_block = done = 0;
  memset(warp_wait, 0, sizeof warp_wait);
  memset(warp_done, 0, sizeof warp_done);
  stretch_start(n);
  if (smem_bytes) memset(smem_ptr, 0xff, smem_bytes);
  for (;;) {
    if (random_order)
      for (int i = nrun - 1; i > 0; i--) {
        const int j = (int)rand_below((uint32_t)i + 1), x = runq[i];
        runq[i] = runq[j], runq[j] = x;
      }
    for (int k = 0; k < nrun; k++) {
      cur = &threads[runq[k]];
      if (cur->state != RUN) continue; /* run already, by a lane before it (yield) */
      emu_ctx_switch(&sched_sp, cur->sp);
    }
    cur = NULL;
    nrun = 0;
    if (done == n) return;
    if (at_block && at_block + done == n) {
      for (int i = 0; i < n; i++)
        if (threads[i].state == BLOCK_BAR) threads[i].state = RUN, runq[nrun++] = i;
      at_block = 0;
      stretch_start(n);
      continue;
    }
    int ready[32], nready = 0;
    for (int w = 0; w * 32 < n; w++) {
      const int size = n - w * 32 < 32 ? n - w * 32 : 32;
      if (warp_wait[w] && warp_wait[w] + warp_done[w] == size) ready[nready++] = w;
    }
    for (int r = 0; r < nready; r++) {
      const int w = ready[r];
      if (w != victim || threads[w * 32].tag != 0 || syncs[w] + 1 != hold) continue;
      if (nready > 1)
        ready[r] = ready[--nready]; /* held while another warp can move */
      else
        victim = -1; /* no other can: the hold is over */
      break;
    }
    if (random_order && nready > 1) ready[0] = ready[rand_below((uint32_t)nready)], nready = 1;
    for (int r = 0; r < nready; r++) {
      const int w = ready[r];
      warp_tags_agree(w, n);
      syncs[w] += threads[w * 32].tag == 0;
      for (int i = w * 32; i < w * 32 + 32 && i < n; i++)
        if (threads[i].state == WARP_BAR) threads[i].state = RUN, runq[nrun++] = i;
      warp_wait[w] = 0;
    }
    if (!nrun) {
      int wb = 0;
      for (int w = 0; w * 32 < n; w++)
        wb += warp_wait[w];
      fail("deadlock: %d threads at __syncthreads, %d at a warp barrier, %d done, of %d", at_block,
           wb, done, n);
    }
  }
}

} /* namespace emu */

/* ---- the runtime's state ------------------------------------------------- */

/* Kernels run on the thread that launches them; the other calls may come
 * from any thread (NCCL's watchdog, a checkpoint writer): the maps are
 * under emu_mu, and the last error is per thread, as CUDA's. */
static thread_local cudaError_t emu_last = cudaSuccess;
static std::mutex emu_mu;
static std::map<uintptr_t, size_t> emu_allocs;     /* device memory: start -> bytes */
static std::map<uintptr_t, size_t> emu_hosts;      /* its host memory: start -> bytes */
static std::map<uintptr_t, size_t> emu_registered; /* cudaHostRegister'ed ranges */
static std::map<const void *, int> emu_smem_allowed;
static size_t emu_allocated; /* live device memory plus what pools hold idle */
static std::map<std::string, unsigned long> emu_launches; /* by the name at the launch */
static std::map<std::string, unsigned long> emu_waits;    /* the host-blocking calls, by name */

/* CUDA_EMU_LAUNCH_REPORT=1: every kernel's launches, by name, on stderr at
 * exit ("cuda_emu: launches N name"), most first: which kernels a run (a
 * step: two runs' difference) launches, on a machine without a GPU. */
static void emu_launch_report(void) {
  std::lock_guard<std::mutex> g(emu_mu);
  std::multimap<unsigned long, std::string, std::greater<unsigned long>> by;
  for (const auto &e : emu_launches) by.emplace(e.second, e.first);
  for (const auto &e : by) fprintf(stderr, "cuda_emu: launches %lu %s\n", e.first, e.second.c_str());
}

/* A stream-ordered memory pool (cudaMemPoolCreate; cudaMallocAsync's is
 * emu_default_pool): the sizes of the blocks freed into it and not yet
 * released, which count as allocated device memory (emu_allocated) as a
 * GPU's pool holds them, though the emulator gives their host memory back.
 * An allocation takes the smallest idle block it fits in (the rest of the
 * block stays with it), else new memory; a synchronizing call releases idle
 * blocks beyond the release threshold (default 0, as CUDA's). */
struct emu_pool {
  std::multimap<size_t, bool> idle; /* rounded size -> (unused) */
  uint64_t release = 0;
  uint64_t reserved = 0, used = 0;           /* idle and live blocks; live blocks */
  uint64_t reserved_high = 0, used_high = 0; /* their highs (cudaMemPoolAttr*MemHigh) */
};
static emu_pool emu_default_pool;
static std::vector<emu_pool *> emu_pools = {&emu_default_pool}; /* every pool */
static std::map<uintptr_t, std::pair<emu_pool *, size_t>> emu_pooled; /* start -> pool, block */

static cudaError_t emu_err(cudaError_t e) {
  if (e != cudaSuccess) emu_last = e;
  return e;
}

static size_t emu_env_size(const char *name, size_t dflt) {
  const char *v = getenv(name);
  return v && *v ? (size_t)strtoull(v, NULL, 0) : dflt;
}

static size_t emu_smem_optin(void) { return emu_env_size("CUDA_EMU_SMEM_OPTIN", 232448); }

/* The current device, per thread as CUDA's (a thread that never set one is
 * on device 0), and the devices this process made a context on. A call
 * that works on the current device (cudaSetDevice itself: CUDA 12
 * initializes the context there; an allocation, a synchronous copy, a
 * stream or event, a launch, cuBLASLt's handle) makes one. A process holds
 * one GPU (a rank, fsdpd's probe): a context on a second is a stray one,
 * hundreds of MiB of a GPU another rank owns, so the run stops there,
 * naming the call (CUDA_EMU_MULTI_DEVICE=1 allows it). */
static thread_local int emu_tl_dev = -1;
static std::atomic<uint64_t> emu_ctx_devs{0};

static int emu_cur_dev(void) { return emu_tl_dev < 0 ? 0 : emu_tl_dev; }

static void emu_ctx_on(int d, const char *call) {
  const uint64_t bit = 1ull << (d & 63), had = emu_ctx_devs.fetch_or(bit);
  if (had && !(had & bit) && !emu_env_size("CUDA_EMU_MULTI_DEVICE", 0))
    emu::fail("%s makes a context on GPU %d in a process that works on GPU %d (%s): a stray "
              "context on a GPU another process owns; a thread must cudaSetDevice(its GPU) "
              "before any call that uses the current device, and never set another",
              call, d, __builtin_ctzll(had),
              emu_tl_dev < 0 ? "this thread never set a device: CUDA's default is 0"
                             : "this thread set it");
}
static void emu_ctx(const char *call) { emu_ctx_on(emu_cur_dev(), call); }

/* Is [p, p + n) inside one range of m? */
static bool emu_within(const std::map<uintptr_t, size_t> &m, const void *p, size_t n) {
  auto it = m.upper_bound((uintptr_t)p);
  if (it == m.begin()) return false;
  --it;
  return (uintptr_t)p + n <= it->first + it->second;
}

static bool emu_is_device(const void *p, size_t n) {
  std::lock_guard<std::mutex> g(emu_mu);
  return emu_within(emu_allocs, p, n ? n : 1);
}

bool emu::device_range(const void *p, size_t n) { return emu_is_device(p, n); }

/* The range is checked with synchronous streams only: queued work may use a
 * buffer whose cudaFreeAsync the host has already made (legal in stream
 * order), and emu_allocs, kept in the host's order, no longer lists it. */
void emu::wide_access(const void *p, const char *what, size_t n) {
  if ((uintptr_t)p & (n - 1))
    fail("%s at %p: %s %zu-byte access at an address not %zu-byte aligned (on a GPU: a "
         "misaligned address error)",
         what, p, n == 8 ? "an" : "a", n, n);
  if (!deferred() && !emu_is_device(p, n))
    fail("%s at %p: the %zu bytes are not inside one device buffer", what, p, n);
}

void emu::launch(const cfg &c, const void *kernel, const char *name, std::function<void()> grid) {
  emu_ctx(name);
  const dim3 block = c.block, grid_ = c.grid;
  const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
  if (!nt || nt > 1024 || block.z > 64 || !grid_.x || !grid_.y || !grid_.z || grid_.y > 65535 ||
      grid_.z > 65535 || grid_.x > 2147483647u) {
    fprintf(stderr,
            "cuda_emu: launch of %s with grid (%u, %u, %u), block (%u, %u, %u): "
            "invalid configuration\n",
            name, grid_.x, grid_.y, grid_.z, block.x, block.y, block.z);
    emu_err(cudaErrorInvalidConfiguration);
    return;
  }
  size_t allowed = 48 << 10;
  {
    std::lock_guard<std::mutex> g(emu_mu);
    auto a = emu_smem_allowed.find(kernel);
    if (a != emu_smem_allowed.end()) allowed = (size_t)a->second;
  }
  if (c.smem > allowed) {
    fprintf(stderr,
            "cuda_emu: launch of %s asks for %zu bytes of dynamic shared memory, "
            "%zu allowed (cudaFuncSetAttribute)\n",
            name, c.smem, allowed);
    emu_err(cudaErrorInvalidValue);
    return;
  }
  {
    std::lock_guard<std::mutex> g(emu_mu);
    if (emu_launches.empty() && getenv("CUDA_EMU_LAUNCH_REPORT")) atexit(emu_launch_report);
    emu_launches[name]++;
  }
  emu::enqueue(c.stream, [grid]() {
    grid();
    return true;
  });
}

void emu::run_grid(const cfg &c, const char *name, body_fn b, void *ctx) {
  if (emu::random_order < 0) {
    const char *o = getenv("CUDA_EMU_ORDER");
    if (o && *o && strcmp(o, "forward") && strcmp(o, "random")) {
      fprintf(stderr, "cuda_emu: CUDA_EMU_ORDER=%s: use forward or random\n", o);
      exit(2);
    }
    emu::random_order = o && !strcmp(o, "random");
    emu::rng = emu_env_size("CUDA_EMU_SEED", 1);
  }
  const int nt = (int)(c.block.x * c.block.y * c.block.z);
  emu::fibers_reserve(nt);
  emu::smem_prepare(c.smem);
  emu::body = b;
  emu::body_ctx = ctx;
  emu::kernel_name = name;
  emu::nthreads = nt;
  emu::grid_dim = c.grid;
  emu::block_dim = c.block;
  for (unsigned z = 0; z < c.grid.z; z++)
    for (unsigned y = 0; y < c.grid.y; y++)
      for (unsigned x = 0; x < c.grid.x; x++) {
        emu::block_idx = make_uint3(x, y, z);
        emu::run_block(nt);
      }
  emu::smem_bytes = 0;
}

/* How many times a kernel was launched under `name` (as its launch wrote it:
 * "tc_fwd_kernel<HS, O>"), for tests that must know a path ran. */
/* The opt-in limit of a block's dynamic shared memory the emulated device
 * reports (sharedMemPerBlockOptin): tests/cuda's check of which kernel a
 * launcher chose by it. */
extern "C" size_t cuda_emu_smem_optin(void) { return emu_smem_optin(); }

extern "C" unsigned long cuda_emu_launches(const char *name) {
  std::lock_guard<std::mutex> g(emu_mu);
  auto it = emu_launches.find(name);
  return it == emu_launches.end() ? 0 : it->second;
}

/* How many times the host called `name`, one of the calls that wait for the
 * device ("cudaMalloc", "cudaFree", "cudaMemcpy", "cudaStreamSynchronize",
 * "cudaDeviceSynchronize", "cudaEventSynchronize"), for tests that hold a
 * path to not waiting. */
extern "C" unsigned long cuda_emu_waits(const char *name) {
  std::lock_guard<std::mutex> g(emu_mu);
  auto it = emu_waits.find(name);
  return it == emu_waits.end() ? 0 : it->second;
}

/* ---- streams ---------------------------------------------------------------
 * CUDA_EMU_STREAMS=sync (the default): a call on a stream does its work
 * before it returns, so every stream and event is always done.
 *
 * CUDA_EMU_STREAMS=deferred: a call on a stream queues its work, as a GPU's
 * does, and queued work runs only when the host needs it done, and then only
 * the work it needs: a synchronization runs its stream (cudaStreamSynchronize,
 * a copy to pageable memory), its event's stream up to the event
 * (cudaEventSynchronize, and cudaEventQuery, which answers cudaErrorNotReady
 * when that work cannot finish yet: a collective waiting for its peers), or
 * every stream (cudaDeviceSynchronize, cudaFree, cudaStreamDestroy's stream);
 * a stream's work behind a cudaStreamWaitEvent runs the event's stream up to
 * the event first. Work no wait orders stays queued as long as it can, and
 * the device's synchronization runs the streams whose last work came latest
 * first. So a reader that misses a wait runs before the work that writes
 * what it reads, and work that should wait before it overwrites a buffer
 * runs before the reader still queued ahead of it on another stream: the
 * results come out wrong, where the synchronous streams hide both.
 * CUDA_EMU_STREAMS=ahead is the other race: queued, but at each of those
 * points every stream's work other than NCCL's collectives first runs as
 * far as its waits allow (kernels racing ahead of a slow network), so work
 * queued after a collective that overwrites the buffer it reads, or frees
 * it, before a wait for the collective runs before the collective does.
 * CUDA_EMU_DROP_WAITS=1 makes cudaStreamWaitEvent do nothing (read at each
 * call), for the test that shows the deferred streams catch a missing wait.
 *
 * Host memory a queued copy reads or writes: from pageable memory the bytes
 * are taken at the call (CUDA stages them before it returns); to pageable
 * memory the call waits for its stream and copies (CUDA returns once the
 * copy is done); page-locked memory (cudaHostRegister) is read or written
 * when the copy runs, as a GPU's DMA does. cudaFreeAsync gives a block back
 * to its pool at the call (stream-ordered reuse), its memory once the stream
 * reaches the free. The legacy default stream does not wait for the others,
 * as the non-blocking streams the backend makes behave. */
namespace {

struct emu_stream;
struct emu_step {
  std::function<bool()> run; /* the work; or, when null, a wait: */
  bool collective = false;   /* NCCL's work (CUDA_EMU_STREAMS=ahead holds it back) */
  emu_stream *on = nullptr;  /* the stream a cudaStreamWaitEvent waits for */
  uint64_t upto = 0;         /* until it has done this many steps */
};
struct emu_stream {
  std::deque<emu_step> q;
  uint64_t queued = 0, done = 0; /* steps ever queued, and done */
  uint64_t last = 0;             /* when its last step was queued (emu_stamp) */
};
struct emu_event {
  emu_stream *s = nullptr; /* the stream of its last record (none: done) */
  uint64_t upto = 0;
};

std::mutex emu_q_mu; /* every stream's queue, and the work running */
emu_stream emu_legacy; /* stream 0, cudaStreamLegacy, cudaStreamPerThread */
std::vector<emu_stream *> emu_streams = {&emu_legacy}; /* kept: events may name them */
uint64_t emu_stamp;
int emu_deferred = -1;

emu_stream *emu_sq(cudaStream_t s) {
  return s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread ? &emu_legacy
                                                                      : (emu_stream *)s;
}

/* Runs s's steps until it has done `upto` (emu_q_mu held); false when a step
 * cannot finish yet. */
bool emu_run_to(emu_stream *s, uint64_t upto) {
  while (s->done < upto) {
    emu_step &st = s->q.front();
    if (st.run ? !st.run() : !emu_run_to(st.on, st.upto)) return false;
    s->q.pop_front();
    s->done++;
  }
  return true;
}

/* CUDA_EMU_STREAMS=ahead: every stream's work but the collectives, as far
 * as it can go (emu_q_mu held): the kernels race ahead of slow collectives,
 * as on a GPU whose network lags. */
void emu_run_ahead(void) {
  for (bool moved = true; moved;) {
    moved = false;
    for (emu_stream *s : emu_streams)
      while (!s->q.empty()) {
        emu_step &st = s->q.front();
        if (st.run ? st.collective || !st.run() : st.on->done < st.upto) break;
        s->q.pop_front();
        s->done++;
        moved = true;
      }
  }
}

/* Every stream to its end, the one whose last step came latest first. */
bool emu_run_all(void) {
  std::vector<emu_stream *> order(emu_streams);
  std::sort(order.begin(), order.end(),
            [](const emu_stream *a, const emu_stream *b) { return a->last > b->last; });
  bool all = true;
  for (emu_stream *s : order) all &= emu_run_to(s, s->queued);
  return all;
}

/* Waits, as the host does, until s (NULL: every stream) has done upto steps:
 * tries again while a step cannot finish (its peers run in other processes
 * or threads, which need emu_q_mu between tries). */
void emu_finish(emu_stream *s, uint64_t upto) {
  if (!emu::deferred()) return;
  for (;;) {
    {
      std::lock_guard<std::mutex> g(emu_q_mu);
      if (emu_deferred == 2) emu_run_ahead();
      if (s ? emu_run_to(s, upto) : emu_run_all()) return;
    }
    const struct timespec ts = {0, 20000};
    nanosleep(&ts, nullptr);
  }
}

void emu_finish_stream(cudaStream_t s) {
  emu_stream *q = emu_sq(s);
  uint64_t upto;
  {
    std::lock_guard<std::mutex> g(emu_q_mu);
    upto = q->queued;
  }
  emu_finish(q, upto);
}

} /* namespace */

bool emu::deferred(void) { /* emu_deferred: 0 sync, 1 deferred, 2 ahead */
  if (emu_deferred < 0) {
    const char *v = getenv("CUDA_EMU_STREAMS");
    if (v && *v && strcmp(v, "sync") && strcmp(v, "deferred") && strcmp(v, "ahead")) {
      fprintf(stderr, "cuda_emu: CUDA_EMU_STREAMS=%s: use sync, deferred or ahead\n", v);
      exit(2);
    }
    emu_deferred = !v || !*v || !strcmp(v, "sync") ? 0 : !strcmp(v, "deferred") ? 1 : 2;
  }
  return emu_deferred;
}

std::mutex &emu::stream_mu(void) { return emu_q_mu; }

void emu::enqueue(cudaStream_t s, std::function<bool()> step, bool collective) {
  if (!emu::deferred()) {
    while (!step()) sched_yield();
    return;
  }
  std::lock_guard<std::mutex> g(emu_q_mu);
  emu_stream *q = emu_sq(s);
  q->q.push_back(emu_step{std::move(step), collective});
  q->queued++;
  q->last = ++emu_stamp;
}

/* ---- the CUDA runtime ---------------------------------------------------- */

extern "C" {

cudaError_t cudaGetLastError(void) {
  cudaError_t e = emu_last;
  emu_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return emu_last; }

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorHostMemoryAlreadyRegistered:
    return "part or all of the requested memory range is already mapped";
  case cudaErrorHostMemoryNotRegistered:
    return "pointer does not correspond to a registered memory region";
  default: return "unknown error (cuda_emu)";
  }
}

const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }

cudaError_t cudaGetDeviceCount(int *n) {
  *n = (int)emu_env_size("CUDA_EMU_DEVICES", 1);
  return *n ? cudaSuccess : emu_err(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int d) {
  int n;
  cudaGetDeviceCount(&n);
  if (d < 0 || d >= n) return emu_err(cudaErrorInvalidDevice);
  emu_ctx_on(d, "cudaSetDevice");
  emu_tl_dev = d;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
  int n;
  cudaGetDeviceCount(&n);
  if (d < 0 || d >= n) return emu_err(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "cuda_emu (CPU)");
  p->totalGlobalMem = emu_env_size("CUDA_EMU_MEMORY", (size_t)8 << 30);
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = emu_smem_optin();
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->multiProcessorCount = 132;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, const void *f) {
  memset(a, 0, sizeof *a);
  std::lock_guard<std::mutex> g(emu_mu);
  auto it = emu_smem_allowed.find(f);
  a->maxDynamicSharedSizeBytes = it == emu_smem_allowed.end() ? 48 << 10 : it->second;
  a->maxThreadsPerBlock = 1024;
  a->ptxVersion = a->binaryVersion = 90;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *f, cudaFuncAttribute attr, int v) {
  emu_ctx("cudaFuncSetAttribute");
  std::lock_guard<std::mutex> g(emu_mu);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (v < 0 || (size_t)v > emu_smem_optin()) {
    fprintf(stderr,
            "cuda_emu: cudaFuncSetAttribute(%p, MaxDynamicSharedMemorySize, %d): more "
            "than the device's %zu\n",
            f, v, emu_smem_optin());
    return emu_err(cudaErrorInvalidValue);
  }
  emu_smem_allowed[f] = v;
  return cudaSuccess;
}

/* Freed blocks' host memory, oldest first, and its bytes: each is NaN or,
 * where it spans whole pages (emu_alloc's blocks of 64 KiB on),
 * inaccessible (and its pages given back: madvise), so a kernel reading it
 * after its free (a missing
 * stream wait, a buffer freed early) computes NaN or faults, as it would
 * have when glibc unmapped large blocks, instead of reading the block's
 * next owner's data; the oldest go once CUDA_EMU_QUARANTINE bytes wait
 * (the newest stays, however large).
 * Its own lock: a stream's deferred free takes it on the stream's thread. */
struct emu_quarantined {
  void *p;
  size_t bytes;
  bool locked; /* PROT_NONE */
};
static std::mutex emu_quarantine_mu;
static std::deque<emu_quarantined> emu_quarantine_q;
static size_t emu_quarantine_bytes;
static const size_t EMU_PAGE = 4096, EMU_PAGED = 64 << 10;

/* A fault in a quarantined block stops the run saying so, with the kernel
 * and thread (emu::fail); any other goes to the handler before this one
 * (the program's own, or the default) as the access faults again. */
static struct sigaction emu_segv_before;
static void emu_segv(int sig, siginfo_t *si, void *uc) {
  (void)sig, (void)uc;
  const uintptr_t a = (uintptr_t)si->si_addr;
  for (const emu_quarantined &q : emu_quarantine_q)
    if (q.locked && a >= (uintptr_t)q.p && a < (uintptr_t)q.p + q.bytes)
      emu::fail("an access at %p, %zu bytes into a %zu-byte block of device memory already freed "
                "(cudaFree or cudaFreeAsync): a use after free",
                si->si_addr, (size_t)(a - (uintptr_t)q.p), q.bytes);
  sigaction(SIGSEGV, &emu_segv_before, nullptr);
}

static void emu_quarantine(void *p, size_t bytes) {
  const bool whole = (uintptr_t)p % EMU_PAGE == 0 && bytes % EMU_PAGE == 0 && bytes;
  const emu_quarantined q = {p, bytes,
                             whole && madvise(p, bytes, MADV_DONTNEED) == 0 &&
                                 mprotect(p, bytes, PROT_NONE) == 0};
  if (!q.locked) memset(p, 0xff, bytes);
  const size_t cap = emu_env_size("CUDA_EMU_QUARANTINE", (size_t)256 << 20);
  std::lock_guard<std::mutex> g(emu_quarantine_mu);
  static bool handled;
  if (q.locked && !handled) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = emu_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    handled = sigaction(SIGSEGV, &sa, &emu_segv_before) == 0;
  }
  emu_quarantine_q.push_back(q);
  emu_quarantine_bytes += bytes;
  while (emu_quarantine_bytes > cap && emu_quarantine_q.size() > 1) {
    const emu_quarantined old = emu_quarantine_q.front();
    emu_quarantine_q.pop_front();
    emu_quarantine_bytes -= old.bytes;
    if (old.locked && mprotect(old.p, old.bytes, PROT_READ | PROT_WRITE) != 0) {
      perror("cuda_emu: mprotect of a freed block");
      abort();
    }
    free(old.p);
  }
}

/* Device memory of n bytes (block: the rounded bytes it takes, already
 * counted in emu_allocated when it comes from a pool's idle block). From
 * 64 KiB on its host memory is whole pages (emu_quarantine). */
static cudaError_t emu_alloc(void **p, size_t n, size_t block, bool counted) {
  const size_t host = block >= EMU_PAGED ? (block + EMU_PAGE - 1) / EMU_PAGE * EMU_PAGE : block;
  *p = aligned_alloc(block >= EMU_PAGED ? EMU_PAGE : 256, host);
  if (!*p) return emu_err(cudaErrorMemoryAllocation);
  memset(*p, 0xff, host); /* NaN: cudaMalloc's memory holds anything */
  emu_allocs[(uintptr_t)*p] = n;
  emu_hosts[(uintptr_t)*p] = host;
  if (!counted) emu_allocated += block;
  return cudaSuccess;
}

static size_t emu_round(size_t n) { return n ? (n + 255) / 256 * 256 : 256; }

static bool emu_fits(size_t block) {
  return emu_allocated + block <= emu_env_size("CUDA_EMU_MEMORY", (size_t)8 << 30);
}

/* Gives back what pool holds idle beyond keep bytes (emu_mu held). */
static void emu_pool_trim(emu_pool *pool, uint64_t keep) {
  uint64_t held = 0;
  for (auto &b : pool->idle) held += b.first;
  while (held > keep && !pool->idle.empty()) {
    auto big = std::prev(pool->idle.end());
    held -= big->first;
    emu_allocated -= big->first;
    pool->reserved -= big->first;
    pool->idle.erase(big);
  }
}

/* A synchronizing call: each pool releases what it holds beyond its threshold. */
static void emu_synced(const char *call) {
  std::lock_guard<std::mutex> g(emu_mu);
  emu_waits[call]++;
  for (emu_pool *pool : emu_pools) emu_pool_trim(pool, pool->release);
}

cudaError_t cudaMalloc(void **p, size_t n) {
  emu_ctx("cudaMalloc");
  std::lock_guard<std::mutex> g(emu_mu);
  emu_waits["cudaMalloc"]++;
  const size_t block = emu_round(n);
  if (!emu_fits(block)) return *p = NULL, emu_err(cudaErrorMemoryAllocation);
  return emu_alloc(p, n, block, false);
}

/* Frees p (emu_mu held): a pooled block goes idle in its pool. Its host
 * memory is quarantined now (emu_quarantine: NaN or inaccessible), or,
 * with release false, by the caller later; *host (if given): its bytes. */
static cudaError_t emu_free(void *p, bool release = true, size_t *host = nullptr) {
  auto it = emu_allocs.find((uintptr_t)p);
  if (it == emu_allocs.end()) return emu_err(cudaErrorInvalidValue);
  auto h = emu_hosts.find((uintptr_t)p);
  const size_t bytes = h->second;
  emu_hosts.erase(h);
  if (host) *host = bytes;
  auto pooled = emu_pooled.find((uintptr_t)p);
  if (pooled != emu_pooled.end()) {
    pooled->second.first->idle.emplace(pooled->second.second, true);
    pooled->second.first->used -= pooled->second.second;
    emu_pooled.erase(pooled);
  } else {
    emu_allocated -= emu_round(it->second);
  }
  emu_allocs.erase(it);
  if (release) emu_quarantine(p, bytes);
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  emu_ctx("cudaFree");
  emu_finish(nullptr, 0); /* it waits for the device */
  std::lock_guard<std::mutex> g(emu_mu);
  emu_waits["cudaFree"]++; /* it waits for the device, even for NULL */
  return p ? emu_free(p) : cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  if (!emu_is_device(p, n)) {
    fprintf(stderr, "cuda_emu: cudaMemsetAsync(%p, %zu bytes): not device memory\n", p, n);
    return emu_err(cudaErrorInvalidValue);
  }
  emu::enqueue(s, [p, v, n]() {
    memset(p, v, n);
    return true;
  });
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
  const bool dd = emu_is_device(dst, n), sd = emu_is_device(src, n);
  const bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice && dd && !sd) ||
                  (kind == cudaMemcpyDeviceToHost && !dd && sd) ||
                  (kind == cudaMemcpyDeviceToDevice && dd && sd) ||
                  (kind == cudaMemcpyHostToHost && !dd && !sd);
  if (!ok) {
    fprintf(stderr,
            "cuda_emu: cudaMemcpyAsync(%p <- %p, %zu bytes, kind %d): the pointers are "
            "not of that kind\n",
            dst, src, n, (int)kind);
    return emu_err(cudaErrorInvalidValue);
  }
  if (!n) return cudaSuccess;
  bool dl, sl; /* page-locked host memory */
  {
    std::lock_guard<std::mutex> g(emu_mu);
    dl = emu_within(emu_registered, dst, n), sl = emu_within(emu_registered, src, n);
  }
  if (!dd && !dl) { /* to pageable memory: done when the call returns */
    emu_finish_stream(s);
    memmove(dst, src, n);
  } else if (!sd && !sl) { /* from pageable memory: its bytes as they are now */
    auto copy = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                            (const unsigned char *)src + n);
    emu::enqueue(s, [dst, copy]() {
      memcpy(dst, copy->data(), copy->size());
      return true;
    });
  } else {
    emu::enqueue(s, [dst, src, n]() {
      memmove(dst, src, n);
      return true;
    });
  }
  return cudaSuccess;
}

/* On the legacy default stream, and done when it returns. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  emu_ctx("cudaMemcpy");
  emu_synced("cudaMemcpy");
  const cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, 0);
  emu_finish_stream(0);
  return e;
}

/* ---- stream-ordered memory: a block freed is free for reuse as soon as
 * cudaFreeAsync returns (its host memory goes when the stream reaches the
 * free: CUDA_EMU_STREAMS above) */

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const cudaMemPoolProps *props) {
  int n;
  cudaGetDeviceCount(&n);
  if (!props || props->allocType != cudaMemAllocationTypePinned ||
      props->location.type != cudaMemLocationTypeDevice || props->location.id < 0 ||
      props->location.id >= n)
    return emu_err(cudaErrorInvalidValue);
  emu_ctx_on(props->location.id, "cudaMemPoolCreate");
  std::lock_guard<std::mutex> g(emu_mu);
  emu_pool *ep = new emu_pool;
  emu_pools.push_back(ep);
  *pool = (cudaMemPool_t)ep;
  return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  std::lock_guard<std::mutex> g(emu_mu);
  emu_pool *ep = (emu_pool *)pool;
  for (auto &b : emu_pooled)
    if (b.second.first == ep) return emu_err(cudaErrorInvalidValue); /* still in use */
  emu_pool_trim(ep, 0);
  emu_pools.erase(std::find(emu_pools.begin(), emu_pools.end(), ep));
  delete ep;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *v) {
  if (attr != cudaMemPoolAttrReleaseThreshold) return cudaSuccess;
  std::lock_guard<std::mutex> g(emu_mu);
  ((emu_pool *)pool)->release = *(uint64_t *)v;
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *v) {
  std::lock_guard<std::mutex> g(emu_mu);
  const emu_pool *ep = (const emu_pool *)pool;
  switch (attr) {
  case cudaMemPoolAttrReleaseThreshold: *(uint64_t *)v = ep->release; return cudaSuccess;
  case cudaMemPoolAttrReservedMemCurrent: *(uint64_t *)v = ep->reserved; return cudaSuccess;
  case cudaMemPoolAttrReservedMemHigh: *(uint64_t *)v = ep->reserved_high; return cudaSuccess;
  case cudaMemPoolAttrUsedMemCurrent: *(uint64_t *)v = ep->used; return cudaSuccess;
  case cudaMemPoolAttrUsedMemHigh: *(uint64_t *)v = ep->used_high; return cudaSuccess;
  default: return emu_err(cudaErrorInvalidValue);
  }
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  std::lock_guard<std::mutex> g(emu_mu);
  emu_pool_trim((emu_pool *)pool, keep);
  return cudaSuccess;
}

/* A pool's allocation: the smallest idle block that holds it, unless that
 * is over EMU_POOL_SLACK larger (a GPU's pool carves a request out of its
 * free memory, mapped in 2 MiB pages, and keeps the rest free: a small
 * buffer takes at most a page's rest, never a whole large block, which
 * would leave the next large request to a fresh block and the device
 * fuller than kernels/cuda/size.h's KERN_CUDA_SIZE_POOL_SLACK allows);
 * else a fresh one. */
static const size_t EMU_POOL_SLACK = 2 << 20;

static cudaError_t emu_pool_alloc(void **p, size_t n, emu_pool *pool) {
  std::lock_guard<std::mutex> g(emu_mu);
  const size_t need = emu_round(n);
  auto fit = pool->idle.lower_bound(need);
  size_t block = need;
  bool counted = false;
  if (fit != pool->idle.end() && fit->first - need <= EMU_POOL_SLACK) {
    block = fit->first, counted = true;
    pool->idle.erase(fit);
  } else if (!emu_fits(block)) {
    return *p = NULL, emu_err(cudaErrorMemoryAllocation);
  }
  const cudaError_t e = emu_alloc(p, n, block, counted);
  if (e != cudaSuccess) { /* the idle block taken is given back */
    if (counted) emu_allocated -= block, pool->reserved -= block;
    return e;
  }
  emu_pooled[(uintptr_t)*p] = {pool, block};
  if (!counted) pool->reserved += block;
  pool->used += block;
  pool->reserved_high = std::max(pool->reserved_high, pool->reserved);
  pool->used_high = std::max(pool->used_high, pool->used);
  return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t) {
  return emu_pool_alloc(p, n, (emu_pool *)pool);
}

cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) {
  return emu_pool_alloc(p, n, &emu_default_pool);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  if (!emu::deferred()) {
    std::lock_guard<std::mutex> g(emu_mu);
    return emu_free(p);
  }
  size_t n;
  {
    std::lock_guard<std::mutex> g(emu_mu);
    const cudaError_t e = emu_free(p, false, &n);
    if (e != cudaSuccess) return e;
  }
  /* quarantined in the stream's order: work on another stream
   * that still reads it, for want of a wait, reads garbage here as it may
   * on a GPU once the pool gives the block to the next allocation */
  emu::enqueue(s, [p, n]() {
    emu_quarantine(p, n);
    return true;
  });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
  emu_ctx("cudaHostAlloc");
  *p = aligned_alloc(4096, n ? (n + 4095) / 4096 * 4096 : 4096);
  if (!*p) return emu_err(cudaErrorMemoryAllocation);
  return cudaHostRegister(*p, n, flags);
}

cudaError_t cudaFreeHost(void *p) {
  if (!p) return cudaSuccess;
  const cudaError_t e = cudaHostUnregister(p);
  if (e == cudaSuccess) free(p);
  return e;
}

/* Only what the backend asks: memory pools (CUDA_EMU_POOLS=0: a device
 * without them, as under some vGPU profiles). */
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int d) {
  int n;
  cudaGetDeviceCount(&n);
  if (d < 0 || d >= n) return emu_err(cudaErrorInvalidDevice);
  if (attr != cudaDevAttrMemoryPoolsSupported) return emu_err(cudaErrorInvalidValue);
  *v = emu_env_size("CUDA_EMU_POOLS", 1) != 0;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) {
  *d = emu_cur_dev();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  emu_ctx("cudaMemGetInfo");
  std::lock_guard<std::mutex> g(emu_mu);
  *total = emu_env_size("CUDA_EMU_MEMORY", (size_t)8 << 30);
  *free_bytes = *total > emu_allocated ? *total - emu_allocated : 0; /* a cap lowered below it */
  return cudaSuccess;
}

/* Events and streams (CUDA_EMU_STREAMS above). */
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
  emu_ctx("cudaEventCreateWithFlags");
  *e = (cudaEvent_t) new (std::nothrow) emu_event;
  return *e ? cudaSuccess : emu_err(cudaErrorMemoryAllocation);
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> g(emu_q_mu);
  delete (emu_event *)e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return emu_err(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(emu_q_mu);
  emu_event *ev = (emu_event *)e;
  ev->s = emu_sq(s);
  ev->upto = ev->s->queued;
  return cudaSuccess;
}
/* Runs what the event waits for as far as it can go. */
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return emu_err(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(emu_q_mu);
  const emu_event *ev = (const emu_event *)e;
  if (emu::deferred() && emu_deferred == 2) emu_run_ahead();
  return !ev->s || emu_run_to(ev->s, ev->upto) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return emu_err(cudaErrorInvalidResourceHandle);
  emu_synced("cudaEventSynchronize");
  emu_event ev;
  {
    std::lock_guard<std::mutex> g(emu_q_mu);
    ev = *(const emu_event *)e;
  }
  if (ev.s) emu_finish(ev.s, ev.upto);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (!e) return emu_err(cudaErrorInvalidResourceHandle);
  if (!emu::deferred() || emu_env_size("CUDA_EMU_DROP_WAITS", 0)) return cudaSuccess;
  std::lock_guard<std::mutex> g(emu_q_mu);
  const emu_event *ev = (const emu_event *)e;
  emu_stream *q = emu_sq(s);
  if (ev->s && ev->s != q) {
    q->q.push_back(emu_step{nullptr, false, ev->s, ev->upto});
    q->queued++;
  }
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  emu_synced("cudaStreamSynchronize");
  emu_finish_stream(s);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  emu_ctx("cudaDeviceSynchronize");
  emu_synced("cudaDeviceSynchronize");
  emu_finish(nullptr, 0);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
  emu_ctx("cudaStreamCreateWithFlags");
  emu_stream *q = new (std::nothrow) emu_stream;
  if (!q) return emu_err(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(emu_q_mu);
  emu_streams.push_back(q);
  *s = (cudaStream_t)q;
  return cudaSuccess;
}

/* Its queued work still runs (at the device's next synchronization), as
 * on a GPU; the stream stays, as events recorded on it may name it. */
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaHostRegister(void *p, size_t n, unsigned) {
  emu_ctx("cudaHostRegister");
  std::lock_guard<std::mutex> g(emu_mu);
  if (emu_within(emu_registered, p, 1)) return emu_err(cudaErrorHostMemoryAlreadyRegistered);
  emu_registered[(uintptr_t)p] = n;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p) {
  std::lock_guard<std::mutex> g(emu_mu);
  if (!emu_registered.erase((uintptr_t)p)) return emu_err(cudaErrorHostMemoryNotRegistered);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
  memset(a, 0, sizeof *a);
  const bool dev = emu_is_device(p, 1);
  std::lock_guard<std::mutex> g(emu_mu);
  a->type = dev                                ? cudaMemoryTypeDevice
            : emu_within(emu_registered, p, 1) ? cudaMemoryTypeHost
                                               : cudaMemoryTypeUnregistered;
  a->devicePointer = a->type == cudaMemoryTypeDevice ? (void *)p : NULL;
  a->hostPointer = a->type == cudaMemoryTypeHost ? (void *)p : NULL;
  return cudaSuccess;
}

} /* extern "C" */

/* ---- cuBLASLt: cublasLtMatmul on fp32 and bf16 operands ------------------
 * Layouts are column-major (the default order), batches strided; alpha and
 * beta are host floats. The product goes to oneDNN's row-major sgemm (C^T =
 * op(B)^T op(A)^T) on fp32 copies of the operands, rounded to bf16 for
 * COMPUTE_32F_FAST_16BF and to TF32 for COMPUTE_32F_FAST_TF32, as the
 * tensor cores take them. A pointer less aligned than the preference said
 * (256 bytes when unset) fails the call, as an algorithm chosen for it
 * would fail on the GPU. */

struct emu_layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride;
};
struct emu_desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa, transb;
  int32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT; /* DEFAULT, BIAS, GELU_AUX(_BIAS) */
  const void *bias = nullptr;                   /* BIAS: one element per row of D */
  int32_t bias_type = -1;                       /* unset: D's type */
  void *aux = nullptr;                          /* GELU_AUX: GELU's input, D's layout */
  int64_t aux_ld = 0;
  int32_t aux_type = -1; /* unset: D's type */
};

/* The epilogue's parts: a bias added, GELU applied (its input to aux). */
static bool emu_epi_bias(int32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
static bool emu_epi_gelu(int32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
/* ... or its backward, reading GELU's input from aux (DGELU) */
static bool emu_epi_aux(int32_t e) { return emu_epi_gelu(e) || e == CUBLASLT_EPILOGUE_DGELU; }
struct emu_pref {
  uint64_t workspace;
  uint32_t align[4]; /* A, B, C, D */
  uint32_t schemes;  /* CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK */
};

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  emu_ctx("cublasLtCreate");
  *h = (cublasLtHandle_t)malloc(1);
  return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  free(h);
  return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  default: return "CUBLAS_STATUS_(other, cuda_emu)";
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  emu_layout *x = new emu_layout{type, rows, cols, ld, 1, 0};
  *l = (cublasLtMatrixLayout_t)x;
  return ld < (int64_t)rows ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete (emu_layout *)l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t a, const void *buf,
                                                size_t n) {
  emu_layout *x = (emu_layout *)l;
  if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && n == sizeof(int32_t))
    memcpy(&x->batch, buf, n);
  else if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && n == sizeof(int64_t))
    memcpy(&x->stride, buf, n);
  else
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c,
                                        cudaDataType_t s) {
  emu_desc *x = new emu_desc;
  x->compute = c, x->scale = s, x->transa = x->transb = CUBLAS_OP_N;
  *d = (cublasLtMatmulDesc_t)x;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete (emu_desc *)d;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t n) {
  emu_desc *x = (emu_desc *)d;
  if (a == CUBLASLT_MATMUL_DESC_BIAS_POINTER || a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER) {
    if (n != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(a == CUBLASLT_MATMUL_DESC_BIAS_POINTER ? (void *)&x->bias : (void *)&x->aux, buf, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) {
    if (n != sizeof x->aux_ld) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&x->aux_ld, buf, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (n != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
  if (a == CUBLASLT_MATMUL_DESC_TRANSA)
    memcpy(&x->transa, buf, n);
  else if (a == CUBLASLT_MATMUL_DESC_TRANSB)
    memcpy(&x->transb, buf, n);
  else if (a == CUBLASLT_MATMUL_DESC_EPILOGUE)
    memcpy(&x->epilogue, buf, n);
  else if (a == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE)
    memcpy(&x->bias_type, buf, n);
  else if (a == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE)
    memcpy(&x->aux_type, buf, n);
  else
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  *p = (cublasLtMatmulPreference_t) new emu_pref{0, {256, 256, 256, 256},
                                                 CUBLASLT_REDUCTION_SCHEME_MASK};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete (emu_pref *)p;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t n) {
  emu_pref *x = (emu_pref *)p;
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && n == sizeof(uint64_t)) {
    memcpy(&x->workspace, buf, n);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK && n == sizeof(uint32_t)) {
    memcpy(&x->schemes, buf, n);
    return (x->schemes & ~(uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK) ? CUBLAS_STATUS_INVALID_VALUE
                                                                    : CUBLAS_STATUS_SUCCESS;
  }
  const int i = a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
                : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
                : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
                : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                                  : -1;
  if (i < 0 || n != sizeof(uint32_t)) return CUBLAS_STATUS_NOT_SUPPORTED;
  memcpy(&x->align[i], buf, n);
  return CUBLAS_STATUS_SUCCESS;
}

/* The shapes and types of one product, or why there is none. */
static cublasStatus_t emu_lt_check(const emu_desc *d, const emu_layout *a, const emu_layout *b,
                                   const emu_layout *c, const emu_layout *dd) {
  const uint64_t am = d->transa == CUBLAS_OP_N ? a->rows : a->cols;
  const uint64_t ak = d->transa == CUBLAS_OP_N ? a->cols : a->rows;
  const uint64_t bk = d->transb == CUBLAS_OP_N ? b->rows : b->cols;
  const uint64_t bn = d->transb == CUBLAS_OP_N ? b->cols : b->rows;
  if (am != c->rows || bn != c->cols || ak != bk || c->rows != dd->rows || c->cols != dd->cols ||
      a->batch != c->batch || b->batch != c->batch || dd->batch != c->batch)
    return CUBLAS_STATUS_INVALID_VALUE;
  /* C and D fp32, or both bf16 from bf16 operands (the sums rounded once) */
  const bool d16 = c->type == CUDA_R_16BF && dd->type == CUDA_R_16BF && a->type == CUDA_R_16BF;
  if ((!d16 && (c->type != CUDA_R_32F || dd->type != CUDA_R_32F)) || d->scale != CUDA_R_32F ||
      a->type != b->type)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  /* epilogues: only on an unbatched product; BIAS, fp32 for fp32 D, bf16
   * for bf16 D (the type llm.c's products give it on a GPU); GELU_AUX(_BIAS)
   * and DGELU on bf16 D, the aux of D's type (a GPU refuses another,
   * INVALID_VALUE) with a leading dimension of D's rows at least, a
   * multiple of 8 */
  const int32_t bt = d->bias_type == -1 ? (d16 ? CUDA_R_16BF : CUDA_R_32F) : d->bias_type;
  const int32_t e = d->epilogue;
  if (e != CUBLASLT_EPILOGUE_DEFAULT &&
      ((!emu_epi_bias(e) && !emu_epi_aux(e)) || (emu_epi_aux(e) && !d16) ||
       (emu_epi_bias(e) && bt != (d16 ? CUDA_R_16BF : CUDA_R_32F)) || c->batch != 1))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (emu_epi_aux(e) && ((d->aux_type != -1 && d->aux_type != (int32_t)dd->type) ||
                         d->aux_ld < (int64_t)dd->rows || d->aux_ld % 8))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (a->type == CUDA_R_16BF)
    return d->compute == CUBLAS_COMPUTE_32F ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
  if (a->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  return d->compute == CUBLAS_COMPUTE_32F || d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                 d->compute == CUBLAS_COMPUTE_32F_FAST_16BF
             ? CUBLAS_STATUS_SUCCESS
             : CUBLAS_STATUS_NOT_SUPPORTED;
}

#define EMU_LT_RANK 4 /* the algorithm's data word holding its rank */
/* ... and whether it may split the sum and reduce it in D's type (the
 * preference's reduction schemes allow INPLACE or OUTPUT_TYPE): a bf16 D is
 * then rounded twice, as cuBLASLt may do on a GPU (emu_lt_run) */
#define EMU_LT_SPLIT_OUT 5
static std::atomic<int> emu_lt_last_rank{-1};
static std::atomic<unsigned long> emu_lt_ragged{0};

/* Products given to cublasLtMatmul with M, N or K past 8 and not a
 * multiple of 8 (which a GPU's cuBLASLt runs on slow kernels: matmul.cu
 * cuts them): tests/cuda's check that none is. */
extern "C" unsigned long cuda_emu_lt_ragged(void) { return emu_lt_ragged.load(); }

/* The heuristic's rank of the algorithm the last cublasLtMatmul was given
 * (-1 before any): tests/cuda's check of FSDP_CUDA_GEMM_ALGO. */
extern "C" int cuda_emu_lt_last_rank(void) { return emu_lt_last_rank.load(); }

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *res, int *found) {
  *found = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t s = emu_lt_check((emu_desc *)desc, (emu_layout *)A, (emu_layout *)B,
                                        (emu_layout *)C, (emu_layout *)D);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  /* CUDA_EMU_LT_ALGOS (default 4) algorithms, the same product each, their
   * rank in the algorithm's data (after the alignments) for
   * cuda_emu_lt_last_rank */
  const int n = (int)emu_env_size("CUDA_EMU_LT_ALGOS", 4);
  for (int i = 0; i < requested && i < n; i++) {
    memset(&res[i], 0, sizeof res[i]);
    memcpy(res[i].algo.data, ((emu_pref *)pref)->align, sizeof((emu_pref *)pref)->align);
    res[i].algo.data[EMU_LT_RANK] = (uint64_t)i;
    res[i].algo.data[EMU_LT_SPLIT_OUT] =
        (((emu_pref *)pref)->schemes &
         (CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)) != 0;
    res[i].state = CUBLAS_STATUS_SUCCESS;
    res[i].wavesCount = 1.0f;
    ++*found;
  }
  return CUBLAS_STATUS_SUCCESS;
}

/* An fp32 copy of a stored operand's batch, rounded as the compute type
 * takes it. */
static void emu_lt_operand(std::vector<float> &out, const void *p, const emu_layout *l,
                           cublasComputeType_t ct) {
  const size_t n = l->cols ? (size_t)l->ld * (l->cols - 1) + l->rows : 0;
  out.resize(n ? n : 1);
  for (size_t i = 0; i < n; i++) {
    float v = l->type == CUDA_R_16BF ? __bfloat162float(((const __nv_bfloat16 *)p)[i])
                                     : ((const float *)p)[i];
    if (ct == CUBLAS_COMPUTE_32F_FAST_16BF) {
      v = __bfloat162float(__float2bfloat16_rn(v));
    } else if (ct == CUBLAS_COMPUTE_32F_FAST_TF32) {
      uint32_t u;
      memcpy(&u, &v, 4);
      if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
      memcpy(&v, &u, 4);
    }
    out[i] = v;
  }
}

/* The product itself, on the stream (what cublasLtMatmul checked). */
/* GELU as cuBLASLt's epilogue is taken to compute it: the tanh form, in
 * fp32 (written here, apart from kern_math.h's kern_gelu) */
static float emu_gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}
static float emu_gelu_grad(float x) {
  const float k = 0.7978845608f, c = 0.044715f, t = tanhf(k * (x + c * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
}

static void emu_lt_run(const emu_desc *d, const emu_layout *a, const emu_layout *b,
                       const emu_layout *c, const emu_layout *dl, float alpha, float bt,
                       const void *A, const void *B, const void *C, void *D, uint64_t M,
                       uint64_t N, uint64_t K, size_t ea, bool bias, bool split_out) {
  std::vector<float> ta, tb, t16;
  const bool d16 = dl->type == CUDA_R_16BF; /* then C is D (in place) */
  for (int32_t i = 0; i < c->batch; i++) {
    /* another C (fp32, D's layout: cublasLtMatmul checked): beta's input,
     * copied into D first, so the product below adds to it there */
    if (C != D)
      for (uint64_t n = 0; n < N; n++)
        for (uint64_t m = 0; m < M; m++)
          ((float *)D)[(size_t)i * dl->stride + m + n * dl->ld] =
              ((const float *)C)[(size_t)i * c->stride + m + n * c->ld];
    /* a bf16 D: the product into an fp32 copy of it (its rows ld apart),
     * each element rounded once into D after */
    float *out = (float *)D + (size_t)i * dl->stride;
    __nv_bfloat16 *out16 = (__nv_bfloat16 *)D + (size_t)i * dl->stride;
    if (d16) {
      t16.assign(N ? (size_t)dl->ld * (N - 1) + M : 1, 0.0f);
      for (uint64_t n = 0; n < N; n++)
        for (uint64_t m = 0; m < M; m++)
          t16[m + n * dl->ld] = __bfloat162float(out16[m + n * dl->ld]);
      out = t16.data();
    }
    if (!K) { /* no product: D = beta C, written even where beta is 0 (oneDNN leaves it) */
      for (uint64_t n = 0; n < N; n++)
        for (uint64_t m = 0; m < M; m++)
          out[m + n * dl->ld] = bt == 0.0f ? 0.0f : bt * out[m + n * dl->ld];
    } else {
        emu_lt_operand(ta, (const char *)A + (size_t)i * a->stride * ea, a, d->compute);
      emu_lt_operand(tb, (const char *)B + (size_t)i * b->stride * ea, b, d->compute);
      /* column-major D (M x N, ld) is row-major D^T (N x M): D^T = op(B)^T op(A)^T */
      auto sgemm = [&](const float *pa, float beta) {
        if (dnnl_sgemm(d->transb == CUBLAS_OP_N ? 'N' : 'T', d->transa == CUBLAS_OP_N ? 'N' : 'T',
                       (dnnl_dim_t)N, (dnnl_dim_t)M, (dnnl_dim_t)K, alpha, tb.data(), b->ld, pa,
                       a->ld, beta, out, dl->ld) != dnnl_success)
          emu::fail("cublasLtMatmul: oneDNN's sgemm failed (%llu x %llu x %llu)",
                    (unsigned long long)M, (unsigned long long)N, (unsigned long long)K);
      };
      if (d16 && split_out && K >= 2) {
        /* the sum in two halves of K, the first rounded into D, the second
         * added to it there (INPLACE's way): A's other half zeroed in each */
        std::vector<float> half(ta.size());
        for (int h = 0; h < 2; h++) {
          for (size_t x = 0; x < half.size(); x++) {
            const size_t k = d->transa == CUBLAS_OP_N ? x / a->ld : x % a->ld;
            half[x] = (k < K / 2) == (h == 0) ? ta[x] : 0.0f;
          }
          sgemm(half.data(), h ? 1.0f : bt);
          for (uint64_t n = 0; n < N; n++)
            for (uint64_t m = 0; m < M; m++)
              out[m + n * dl->ld] = __bfloat162float(__float2bfloat16_rn(out[m + n * dl->ld]));
        }
      } else {
        sgemm(ta.data(), bt);
      }
      if (bias) /* added to the product as written: the CPU's two roundings (bf16 D: to
                 * its fp32 sums, then rounded once) */
        for (uint64_t n = 0; n < N; n++)
          for (uint64_t m = 0; m < M; m++)
            out[m + n * dl->ld] += d16 ? __bfloat162float(((const __nv_bfloat16 *)d->bias)[m])
                                       : ((const float *)d->bias)[m];
      if (emu_epi_gelu(d->epilogue)) /* (batch 1, bf16 D) the sum to aux, rounded; GELU of it to D */
        for (uint64_t n = 0; n < N; n++)
          for (uint64_t m = 0; m < M; m++) {
            float &v = out[m + n * dl->ld];
            ((__nv_bfloat16 *)d->aux)[m + n * d->aux_ld] = __float2bfloat16_rn(v);
            v = emu_gelu(v);
          }
      if (d->epilogue == CUBLASLT_EPILOGUE_DGELU) /* the sum times GELU's derivative at aux */
        for (uint64_t n = 0; n < N; n++)
          for (uint64_t m = 0; m < M; m++)
            out[m + n * dl->ld] *=
                emu_gelu_grad(__bfloat162float(((const __nv_bfloat16 *)d->aux)[m + n * d->aux_ld]));
    }
    if (d16)
      for (uint64_t n = 0; n < N; n++)
        for (uint64_t m = 0; m < M; m++)
          out16[m + n * dl->ld] = __float2bfloat16_rn(out[m + n * dl->ld]);
  }
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Al, const void *B,
                              cublasLtMatrixLayout_t Bl, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *algo, void *, size_t, cudaStream_t stream) {
  const emu_desc *d = (const emu_desc *)desc;
  const emu_layout *a = (const emu_layout *)Al, *b = (const emu_layout *)Bl,
                   *c = (const emu_layout *)Cl, *dl = (const emu_layout *)Dl;
  cublasStatus_t s = emu_lt_check(d, a, b, c, dl);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  uint32_t align[4] = {256, 256, 256, 256};
  if (algo) memcpy(align, algo->data, sizeof align);
  emu_lt_last_rank = algo ? (int)algo->data[EMU_LT_RANK] : -1;
  const bool split_out = algo && algo->data[EMU_LT_SPLIT_OUT];
  const void *ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; i++)
    if ((uintptr_t)ptrs[i] % align[i]) {
      fprintf(stderr,
              "cuda_emu: cublasLtMatmul: matrix %c at %p is less aligned than the %u "
              "bytes its algorithm was chosen for\n",
              "ABCD"[i], ptrs[i], align[i]);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  /* C apart from D (beta's input): fp32, D's layout, not overlapping it */
  if (C != D && beta && *(const float *)beta != 0.0f) {
    if (dl->type != CUDA_R_32F || c->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    const size_t span = ((size_t)(c->batch - 1) * c->stride + (size_t)c->ld * (c->cols - 1) +
                         c->rows) * 4;
    if (c->ld != dl->ld || c->stride != dl->stride || c->rows != dl->rows ||
        c->cols != dl->cols || c->batch != dl->batch || !emu::device_range(C, span))
      emu::fail("cublasLtMatmul: C at %p is not D's layout in device memory", C);
    if ((const char *)C < (const char *)D + span && (const char *)D < (const char *)C + span)
      emu::fail("cublasLtMatmul: C at %p and D at %p overlap", C, D);
  }
  const size_t ea = a->type == CUDA_R_16BF ? 2 : 4;
  const uint64_t M = c->rows, N = c->cols, K = d->transa == CUBLAS_OP_N ? a->cols : a->rows;
  const bool bias = emu_epi_bias(d->epilogue), gelu = emu_epi_aux(d->epilogue);
  for (uint64_t x : {M, N, K})
    if (x > 8 && x % 8) {
      emu_lt_ragged++;
      break;
    }
  /* CUDA_EMU_LT_BIAS_REFUSE=1: refuse every BIAS epilogue here, after the
   * heuristic gave an algorithm for it, as cuBLASLt has been reported to */
  if (bias && emu_env_size("CUDA_EMU_LT_BIAS_REFUSE", 0)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (gelu && emu_env_size("CUDA_EMU_LT_GELU_REFUSE", 0)) return CUBLAS_STATUS_NOT_SUPPORTED;
  /* GELU's input (written, or DGELU's read): N columns of M bf16, aux_ld
   * apart, in device memory, 16-byte aligned (none: a GPU answers
   * NOT_SUPPORTED) */
  if (gelu && !d->aux) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (gelu && ((uintptr_t)d->aux % 16 ||
               !emu::device_range(d->aux, ((size_t)d->aux_ld * (N - 1) + M) * 2))) {
    fprintf(stderr,
            "cuda_emu: cublasLtMatmul: the GELU epilogues' aux %p is not %llu x %llu bf16 "
            "(ld %lld) of 16-byte aligned device memory\n",
            d->aux, (unsigned long long)M, (unsigned long long)N, (long long)d->aux_ld);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  /* the bias: M floats of device memory, 16-byte aligned (less has been seen
   * to fail at run time on a GPU) */
  if (bias && (!d->bias || (uintptr_t)d->bias % 16 ||
               !emu::device_range(d->bias, M * (dl->type == CUDA_R_16BF ? 2 : 4)))) {
    fprintf(stderr,
            "cuda_emu: cublasLtMatmul: the BIAS epilogue's pointer %p is not %llu elements of "
            "16-byte aligned device memory\n",
            (const void *)d->bias, (unsigned long long)M);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  /* what the call names, as it is now: alpha, beta and the descriptors are
   * read at the call (the host may change them before the product runs) */
  const float al = *(const float *)alpha, bt = *(const float *)beta;
  const emu_desc dv = *d;
  const emu_layout av = *a, bv = *b, cv = *c, dv_l = *dl;
  emu::enqueue(stream, [=]() {
    emu_lt_run(&dv, &av, &bv, &cv, &dv_l, al, bt, A, B, bt != 0.0f ? C : D, D, M, N, K, ea, bias,
               split_out);
    return true;
  });
  return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */

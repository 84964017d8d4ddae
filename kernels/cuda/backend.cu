/* backend: the CUDA backend's entry points (kernels/cuda/cuda.h), its table,
 * the state made at init (one non-blocking stream, the cuBLASLt handle and
 * workspace, the reduction scratch, a memory pool), and the table's memory
 * section: device memory allocated and freed in stream order from the pool,
 * sets and copies queued on the stream, and the element-wise vector ops. The
 * ops live one per file. */
#include <string.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cudnn.h"

kern_cuda_state_t kern_cuda_st;

[[noreturn]] void kern_cuda_fail(const char *op, const char *call, long code, const char *what,
                                 const char *file, int line) {
  fprintf(stderr, "fsdp: cuda backend: %s: %s failed: %s (error %ld) (%s:%d)\n", op, call,
          what ? what : "unknown error", code, file, line);
  abort();
}

/* Every op of the table is implemented here. */
static int kern_cuda_supports_op(kern_op_t op) { return op >= 0 && op < KERN_OP__COUNT; }

/* The GPU does the work: there are no host threads to set. */
static void kern_cuda_set_threads(int n) { (void)n; }
static int kern_cuda_get_threads(void) { return 1; }

/* ---- memory ------------------------------------------------------------------ */

/* Device memory. A buffer held across steps (dev_alloc: parameters, AdamW's
 * state, activations, ...) is cudaMalloc's: made once, it never waits again.
 * A buffer that lives within one step (dev_alloc_step: each gathered unit
 * and unit gradient, made and freed every step at the same sizes) comes
 * from the backend's stream-ordered pool: cudaMallocFromPoolAsync is usable
 * by the ops queued after it, and cudaFreeAsync frees once the ops queued
 * before it have run. Neither waits for the device, where cudaMalloc and
 * cudaFree would empty the queue the host keeps ahead of the GPU at every
 * unit. The pool keeps what is freed (its release threshold is the
 * maximum) for the next step's buffers of the same sizes; kept apart from
 * the long-lived buffers, it is never pinned by them.
 *
 * Every stream that uses a step buffer is ordered after its allocation on
 * this stream and before its free here: the collectives' stream waits on an
 * event of this stream at issue, and this stream waits on a collective's
 * event when it completes (daemon/comm/nccl.c), before the runtime frees
 * what it sent or received. A collective that fails instead leaves its
 * kernel to the abort of its communicator, which may end after the runtime
 * has freed the buffer; the step then ends the rank in an error, and
 * nothing the device computes after it is kept (a checkpoint in flight
 * writes its host snapshot). Closing waits for those aborts (train_close,
 * device_t.settle) before the runtime's buffers go, and the pool's last
 * trim waits for every stream.
 *
 * NULL when the device is full (the error is cleared: it is not sticky, and a
 * later check must not report it). A step buffer the device has no room for
 * is first tried again after the pool gives back what it holds idle (once
 * the frees queued so far have run: cudaMemPoolTrimTo counts a block whose
 * free the host has not seen complete as in use), so blocks kept for one
 * size give way to another. When the last buffer of either kind goes (a
 * job closed), the pool gives everything back to the device, for whatever
 * the process or another one runs on the GPU next. Every allocation is
 * aligned to at least 256 bytes (CUDA's promise, asserted). */
static void kern_cuda_dev_live(long d) {
  if (__atomic_add_fetch(&kern_cuda_st.live, d, __ATOMIC_ACQ_REL) != 0) return;
  /* every stream, not only this one: a collective's kernel that failed
   * may still run on its communicator's stream until its abort ends it */
  KERN_CUDA_CHECK(cudaDeviceSynchronize());
  KERN_CUDA_CHECK(cudaMemPoolTrimTo(kern_cuda_st.pool, 0));
}

static void *kern_cuda_dev_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  kern_cuda_dev_live(1);
  return p;
}

/* cudaFree waits for the device, so a buffer queued ops still use may go. */
static void kern_cuda_dev_free(void *p) {
  if (!p) return;
  KERN_CUDA_CHECK(cudaFree(p));
  kern_cuda_dev_live(-1);
}

static void *kern_cuda_dev_alloc_step(size_t bytes) {
  void *p = NULL;
  for (int tries = 0;; tries++) {
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, kern_cuda_st.pool,
                                                  kern_cuda_st.stream);
    if (e == cudaSuccess) break;
    (void)cudaGetLastError();
    if (tries || e != cudaErrorMemoryAllocation) return NULL;
    KERN_CUDA_CHECK(cudaStreamSynchronize(kern_cuda_st.stream));
    KERN_CUDA_CHECK(cudaMemPoolTrimTo(kern_cuda_st.pool, 0));
  }
  KERN_CUDA_ASSERT(((uintptr_t)p & 255) == 0);
  kern_cuda_dev_live(1);
  return p;
}

/* In stream order: ops queued before the free may still use the buffer. */
static void kern_cuda_dev_free_step(void *p) {
  if (!p) return;
  KERN_CUDA_CHECK(cudaFreeAsync(p, kern_cuda_st.stream));
  kern_cuda_dev_live(-1);
}

static void kern_cuda_dev_set(void *dst, int v, size_t bytes) {
  if (bytes) KERN_CUDA_CHECK(cudaMemsetAsync(dst, v, bytes, kern_cuda_st.stream));
}

/* From pageable memory, cudaMemcpyAsync stages src before it returns, so the
 * caller may reuse src at once; from page-locked memory the copy is truly
 * asynchronous, so we wait for it to keep that promise. */
static void kern_cuda_copy_h2d(void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  cudaPointerAttributes a;
  int pinned = 0;
  if (cudaPointerGetAttributes(&a, src) == cudaSuccess)
    pinned = a.type == cudaMemoryTypeHost;
  else
    (void)cudaGetLastError();
  KERN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, kern_cuda_st.stream));
  if (pinned) KERN_CUDA_CHECK(cudaStreamSynchronize(kern_cuda_st.stream));
}

/* In stream order (after every op queued before it), and complete on return. */
static void kern_cuda_copy_d2h(void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  KERN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, kern_cuda_st.stream));
  KERN_CUDA_CHECK(cudaStreamSynchronize(kern_cuda_st.stream));
}

static void kern_cuda_copy_d2d(void *dst, const void *src, size_t bytes) {
  if (bytes)
    KERN_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, kern_cuda_st.stream));
}

/* cudaHostRegister: not an op (a failure is the caller's to handle, and
 * leaves no error behind for the next checked call). */
static int kern_cuda_host_pin(void *p, size_t bytes) {
  if (!p || !bytes) return 0;
  if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) return 0;
  (void)cudaGetLastError();
  return -1;
}

static void kern_cuda_host_unpin(void *p) {
  if (p && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

static void kern_cuda_sync(void) { KERN_CUDA_CHECK(cudaStreamSynchronize(kern_cuda_st.stream)); }

/* The FSDP runtime's gradient sums and scalings, memory-bound: as
 * residual.cu, 4 elements a thread in float4 accesses where both arrays'
 * 16-byte boundaries fall at the same element (a head of up to 3 and a
 * tail of (n - head) % 4 one a thread, in the same launch), else one a
 * thread. The same operation on each element: the CPU's bits. */
__global__ static void vec_add_kernel(float *y, const float *x, size_t n) {
  KERN_CUDA_FOR(i, n) y[i] += x[i];
}

/* y + head and x + head 16-byte aligned, n >= head + 4 */
__global__ static void vec_add_wide_kernel(float *y, const float *x, size_t n, size_t head) {
  kern_cuda_for_wide<4>(
      n, head,
      [&](size_t j) {
        const float4 a = kern_cuda_load_f32x4(y + j), b = kern_cuda_load_f32x4(x + j);
        kern_cuda_store_f32x4(y + j, make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w));
      },
      [&](size_t i) { y[i] += x[i]; });
}

__global__ static void vec_scale_kernel(float *y, float s, size_t n) {
  KERN_CUDA_FOR(i, n) y[i] *= s;
}

/* y + head 16-byte aligned, n >= head + 4 */
__global__ static void vec_scale_wide_kernel(float *y, float s, size_t n, size_t head) {
  kern_cuda_for_wide<4>(
      n, head,
      [&](size_t j) {
        const float4 a = kern_cuda_load_f32x4(y + j);
        kern_cuda_store_f32x4(y + j, make_float4(a.x * s, a.y * s, a.z * s, a.w * s));
      },
      [&](size_t i) { y[i] *= s; });
}

static void kern_cuda_vec_add(float *y, const float *x, size_t n) {
  if (!n) return;
  const size_t head = kern_cuda_head16(y, sizeof *y);
  if (n >= head + 4 && kern_cuda_aligned16(x + head))
    vec_add_wide_kernel<<<kern_cuda_blocks((n - head) / 4, KERN_CUDA_THREADS), KERN_CUDA_THREADS,
                          0, kern_cuda_st.stream>>>(y, x, n, head);
  else
    vec_add_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                     kern_cuda_st.stream>>>(y, x, n);
  KERN_CUDA_LAUNCHED();
}

static void kern_cuda_vec_scale(float *y, float s, size_t n) {
  if (!n) return;
  const size_t head = kern_cuda_head16(y, sizeof *y);
  if (n >= head + 4)
    vec_scale_wide_kernel<<<kern_cuda_blocks((n - head) / 4, KERN_CUDA_THREADS),
                            KERN_CUDA_THREADS, 0, kern_cuda_st.stream>>>(y, s, n, head);
  else
    vec_scale_kernel<<<kern_cuda_blocks(n, KERN_CUDA_THREADS), KERN_CUDA_THREADS, 0,
                       kern_cuda_st.stream>>>(y, s, n);
  KERN_CUDA_LAUNCHED();
}

/* In double, in sumsq.cu's fixed order (not index order: kern.h asks for a
 * fixed order, the same bytes from run to run). */
static double kern_cuda_vec_sum(const float *x, size_t n) { return kern_cuda_sum_f64(x, n, 0); }


/* In kern_backend_t's order (C++ wants designators in declaration order). */
static const kern_backend_t kern_cuda_table = {
    .name = "cuda",
    .supports_op = kern_cuda_supports_op,
    .set_threads = kern_cuda_set_threads,
    .get_threads = kern_cuda_get_threads,
    .host_memory = 0,
    .dev_alloc = kern_cuda_dev_alloc,
    .dev_free = kern_cuda_dev_free,
    .dev_alloc_step = kern_cuda_dev_alloc_step,
    .dev_free_step = kern_cuda_dev_free_step,
    .dev_set = kern_cuda_dev_set,
    .copy_h2d = kern_cuda_copy_h2d,
    .copy_d2h = kern_cuda_copy_d2h,
    .copy_d2d = kern_cuda_copy_d2d,
    .host_pin = kern_cuda_host_pin,
    .host_unpin = kern_cuda_host_unpin,
    .sync = kern_cuda_sync,
    .vec_add = kern_cuda_vec_add,
    .vec_scale = kern_cuda_vec_scale,
    .vec_sum = kern_cuda_vec_sum,
    .reduce_f32 = NULL,
    .reduce_bf16 = NULL,
    .copy_stream = NULL,
    .encoder_fwd = kern_cuda_encoder_fwd,
    .encoder_bwd = kern_cuda_encoder_bwd,
    .layernorm_fwd = kern_cuda_layernorm_fwd,
    .layernorm_bwd = kern_cuda_layernorm_bwd,
    .matmul_fwd = kern_cuda_matmul_fwd,
    .matmul_bwd = kern_cuda_matmul_bwd,
    .attention_fwd = kern_cuda_attention_fwd,
    .attention_bwd = kern_cuda_attention_bwd,
    .attention_saved = kern_cuda_attention_saved,
    .attention_scratch = kern_cuda_attention_scratch,
    .gelu_fwd = kern_cuda_gelu_fwd,
    .gelu_bwd = kern_cuda_gelu_bwd,
    .residual_fwd = kern_cuda_residual_fwd,
    .residual_bwd = kern_cuda_residual_bwd,
    .crossentropy_fwd = kern_cuda_crossentropy_fwd,
    .crossentropy_bwd = kern_cuda_crossentropy_bwd,
    .crossentropy_fwd_bwd = kern_cuda_crossentropy_fwd_bwd,
    .adamw = kern_cuda_adamw,
    .adamw_segs = kern_cuda_adamw_segs,
    .f32_to_bf16 = kern_cuda_f32_to_bf16,
    .bf16_to_f32 = kern_cuda_bf16_to_f32,
    .sumsq = kern_cuda_sumsq,
    .weights16 = 0, /* kern_cuda_table_bf16 below */
    .qkv_out16 = 0,
    .layernorm_fwd_bf16 = NULL,
    .gelu_fwd_bf16 = NULL,
    .matmul_fwd_bf16 = NULL,
    .matmul_bwd_bf16 = NULL,
    .crossentropy_fwd_bwd_bf16 = NULL,
    .attention_bf16_fits = NULL,
    .attention_fwd_bf16 = NULL,
    .attention_bwd_bf16 = NULL,
    .attention_scratch_bf16 = NULL,
    .gelu_bwd_bf16 = NULL,
    .matmul_fwd_bf16_out16 = NULL,
    .crossentropy_fwd_bwd_bf16in = NULL,
    .gelu_fwd_bf16in = NULL,
    .gelu_bwd_bf16in = NULL,
    .matmul_bwd_dinp16 = NULL,
    .matmul_fwd_res = NULL,
    .matmul_fwd_bf16_gelu = NULL,
    .matmul_bwd_dgelu16 = NULL,
    .adamw_segs_scaled = kern_cuda_adamw_segs_scaled,
    .bf16_to_f32_segs = kern_cuda_bf16_to_f32_segs,
    .encoder_fwd16 = kern_cuda_encoder_fwd16,
    .attention_bwd_dqkv16 = NULL, /* kern_cuda_table_bf16 below */
    .layernorm_bwd16 = NULL,
    .matmul_bwd16 = NULL,
};

/* The table of a bf16 job whose products pack their operands (not
 * gemm_fast16bf): the same ops, and the bf16 activations kern.h offers then
 * (unless acts_fp32 asks for none). */
static kern_backend_t kern_cuda_with_bf16_acts(kern_backend_t t) {
  t.layernorm_fwd_bf16 = kern_cuda_layernorm_fwd_bf16;
  t.gelu_fwd_bf16 = kern_cuda_gelu_fwd_bf16;
  t.matmul_fwd_bf16 = kern_cuda_matmul_fwd_bf16;
  t.matmul_bwd_bf16 = kern_cuda_matmul_bwd_bf16;
  t.crossentropy_fwd_bwd_bf16 = kern_cuda_crossentropy_fwd_bwd_bf16;
  t.attention_bf16_fits = kern_cuda_attention_bf16_fits;
  t.attention_fwd_bf16 = kern_cuda_attention_fwd_bf16;
  t.attention_bwd_bf16 = kern_cuda_attention_bwd_bf16;
  t.attention_bwd_dqkv16 = kern_cuda_attention_bwd_dqkv16;
  t.attention_scratch_bf16 = kern_cuda_attention_scratch_bf16;
  t.gelu_bwd_bf16 = kern_cuda_gelu_bwd_bf16;
  t.matmul_fwd_bf16_out16 = kern_cuda_matmul_fwd_bf16_out16;
  t.crossentropy_fwd_bwd_bf16in = kern_cuda_crossentropy_fwd_bwd_bf16in;
  t.gelu_fwd_bf16in = kern_cuda_gelu_fwd_bf16in;
  t.gelu_bwd_bf16in = kern_cuda_gelu_bwd_bf16in;
  t.matmul_bwd_dinp16 = kern_cuda_matmul_bwd_dinp16;
  t.matmul_fwd_res = kern_cuda_matmul_fwd_res;
  t.matmul_fwd_bf16_gelu = kern_cuda_matmul_fwd_bf16_gelu;
  t.matmul_bwd_dgelu16 = kern_cuda_matmul_bwd_dgelu16;
  t.layernorm_bwd16 = kern_cuda_layernorm_bwd16;
  t.matmul_bwd16 = kern_cuda_matmul_bwd16;
  t.weights16 = 1; /* a bf16 weight read in place: no packing pass (kern.h) */
  t.qkv_out16 = 1; /* qkv written in bf16 by its product (kern.h) */
  return t;
}
static const kern_backend_t kern_cuda_table_bf16 = kern_cuda_with_bf16_acts(kern_cuda_table);
/* the same without bf16 activation gradients (dinp_fp32, for comparison) */
static kern_backend_t kern_cuda_without_dinp16(kern_backend_t t) {
  t.matmul_bwd_dinp16 = NULL;
  t.matmul_bwd_dgelu16 = NULL;
  t.attention_bwd_dqkv16 = NULL;
  t.layernorm_bwd16 = NULL;
  t.matmul_bwd16 = NULL;
  return t;
}
static const kern_backend_t kern_cuda_table_bf16_dinp32 =
    kern_cuda_without_dinp16(kern_cuda_table_bf16);

/* The table for the modes taken. */
static const kern_backend_t *kern_cuda_table_for_modes(void) {
  if (!kern_cuda_st.bf16 || kern_cuda_st.fast16bf || kern_cuda_st.acts_fp32) return &kern_cuda_table;
  return kern_cuda_st.dinp_fp32 ? &kern_cuda_table_bf16_dinp32 : &kern_cuda_table_bf16;
}

/* ---- entry points ---------------------------------------------------------- */

/* Why cudaGetDeviceCount found no GPU, in words an operator can act on. */
static const char *no_gpu_reason(cudaError_t e) {
  switch (e) {
  case cudaErrorStubLibrary:
    return "the CUDA driver found is the toolkit's stub library, not a real driver";
  case cudaErrorInsufficientDriver:
    return "no NVIDIA driver is loaded, or it is older than this build's CUDA runtime";
  case cudaErrorNoDevice: return "the driver sees no CUDA device (check CUDA_VISIBLE_DEVICES)";
  default: return cudaGetErrorString(e);
  }
}

/* msg: the reason alone (callers say "no GPU: " themselves). */
extern "C" int kern_cuda_device_count(char *msg, size_t n) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (msg && n) snprintf(msg, n, "%s (CUDA error %d)", no_gpu_reason(e), (int)e);
    return 0;
  }
  if (count <= 0) {
    if (msg && n) snprintf(msg, n, "the CUDA driver reports 0 devices");
    return 0;
  }
  if (msg && n) msg[0] = '\0';
  return count;
}

/* The pool of dev_alloc_step: device memory of `device`, keeping all it is
 * given back (the release threshold: without it, the pool would return its
 * memory at every synchronization and map it again at the next allocation). */
static cudaError_t kern_cuda_pool_create(int device, cudaMemPool_t *pool) {
  cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaError_t e = cudaMemPoolCreate(pool, &props);
  if (e != cudaSuccess) return *pool = NULL, e;
  uint64_t keep = UINT64_MAX;
  return cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &keep);
}

/* Init's one cleanup path: what was made is unmade, in reverse. */
static void kern_cuda_teardown(void) {
  kern_cudnn_close();
  if (kern_cuda_st.pool) (void)cudaMemPoolDestroy(kern_cuda_st.pool);
  if (kern_cuda_st.colsum) (void)cudaFree(kern_cuda_st.colsum);
  if (kern_cuda_st.pack) (void)cudaFree(kern_cuda_st.pack);
  if (kern_cuda_st.reduce) (void)cudaFree(kern_cuda_st.reduce);
  if (kern_cuda_st.workspace) (void)cudaFree(kern_cuda_st.workspace);
  if (kern_cuda_st.lt) (void)cublasLtDestroy(kern_cuda_st.lt);
  if (kern_cuda_st.stream) (void)cudaStreamDestroy(kern_cuda_st.stream);
  (void)cudaGetLastError();
  memset(&kern_cuda_st, 0, sizeof kern_cuda_st);
}

/* The job's modes: its matrix products' and its attention's. */
static void kern_cuda_take_modes(const kern_cuda_opts_t *o) {
  kern_cuda_st.tf32 = o->tf32 != 0;
  kern_cuda_st.bf16 = o->bf16 != 0;
  kern_cuda_st.attn_gemm = o->attn_gemm != 0;
  kern_cuda_st.fast16bf = o->gemm_fast16bf != 0;
  kern_cuda_st.attn_fp32 = o->attn_fp32 != 0;
  kern_cuda_st.acts_fp32 = o->acts_fp32 != 0;
  kern_cuda_st.dinp_fp32 = o->dinp_fp32 != 0;
  kern_cuda_st.gelu_exact = o->gelu_exact != 0;
  kern_cuda_st.attn_cudnn = o->attn_cudnn != 0;
  kern_cuda_st.gemm_algo = KERN_CUDA_GEMM_ALGO(o->gemm_algo);
}

/* cuDNN, where the job's modes ask for its attention (attn_cudnn): opened on
 * the backend's stream, kept for the process's life. 1, or 0 with msg. */
static int kern_cuda_cudnn_open(char *msg, size_t n) {
  if (!kern_cuda_st.attn_cudnn) return 1;
  char why[384];
  if (kern_cudnn_open((void *)kern_cuda_st.stream, why, sizeof why)) return 1;
  snprintf(msg, n, "FSDP_CUDA_ATTN_CUDNN=1: %s; leave FSDP_CUDA_ATTN_CUDNN unset to run the "
           "attention on the project's own kernels", why);
  kern_cuda_st.attn_cudnn = 0; /* the table stays the kernels' */
  return 0;
}

extern "C" const kern_backend_t *kern_cuda_init(const kern_cuda_opts_t *o, char *msg, size_t n) {
  const kern_cuda_opts_t d = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  if (!o) o = &d;
  char tmp[256];
  if (!msg || !n) msg = tmp, n = sizeof tmp;
  if (kern_cuda_st.ready) { /* the device stays; the job's modes are taken */
    kern_cuda_take_modes(o);
    if (!kern_cuda_cudnn_open(msg, n)) return NULL;
    return kern_cuda_table_for_modes();
  }
  char why[256];
  int count = kern_cuda_device_count(why, sizeof why);
  if (!count) {
    snprintf(msg, n, "no GPU: %s", why);
    return NULL;
  }
  if (o->device < 0 || o->device >= count) {
    snprintf(msg, n, "CUDA device %d is out of range: this process sees %d device%s (0..%d)",
             o->device, count, count == 1 ? "" : "s", count - 1);
    return NULL;
  }
  cudaDeviceProp prop;
  cudaFuncAttributes fa;
  int pools = 0;
  cudaError_t e;
  cublasStatus_t s;
  if ((e = cudaSetDevice(o->device)) != cudaSuccess ||
      (e = cudaGetDeviceProperties(&prop, o->device)) != cudaSuccess) {
    snprintf(msg, n, "CUDA device %d: cannot select it: %s (CUDA error %d)", o->device,
             cudaGetErrorString(e), (int)e);
    goto fail;
  }
  /* the build carries sm_80 and sm_90 code and compute_90 PTX (Makefile's
   * NVFLAGS); a kernel's attributes say whether one of them loads here */
  if (prop.major < 8 || (e = cudaFuncGetAttributes(&fa, vec_add_kernel)) != cudaSuccess) {
    snprintf(msg, n,
             "CUDA device %d (%s, compute capability %d.%d): this build's kernels do not "
             "run on it (they need 8.0 or newer)%s%s",
             o->device, prop.name, prop.major, prop.minor, prop.major < 8 ? "" : ": ",
             prop.major < 8 ? "" : cudaGetErrorString(e));
    goto fail;
  }
  kern_cuda_st.device = o->device;
  kern_cuda_take_modes(o);
  snprintf(kern_cuda_st.name, sizeof kern_cuda_st.name, "%s", prop.name);
  kern_cuda_st.memory = prop.totalGlobalMem;
  kern_cuda_st.smem_optin = prop.sharedMemPerBlockOptin; /* 99 KiB on 8.6 and 8.9, 163 on 8.0, 227 on 9.0 */
  if ((e = cudaStreamCreateWithFlags(&kern_cuda_st.stream, cudaStreamNonBlocking)) != cudaSuccess) {
    snprintf(msg, n, "CUDA device %d: cannot create a stream: %s (CUDA error %d)", o->device,
             cudaGetErrorString(e), (int)e);
    goto fail;
  }
  if ((e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, o->device)) !=
      cudaSuccess) {
    snprintf(msg, n, "CUDA device %d (%s): cannot ask whether it has stream-ordered memory "
             "pools (cudaDevAttrMemoryPoolsSupported): %s (CUDA error %d)", o->device, prop.name,
             cudaGetErrorString(e), (int)e);
    goto fail;
  }
  if (!pools) {
    snprintf(msg, n, "CUDA device %d (%s): no stream-ordered memory pools "
             "(cudaDevAttrMemoryPoolsSupported is 0, as under some vGPU profiles); fsdpd "
             "allocates each step's buffers from one", o->device, prop.name);
    goto fail;
  }
  if ((e = kern_cuda_pool_create(o->device, &kern_cuda_st.pool)) != cudaSuccess) {
    snprintf(msg, n, "CUDA device %d: cannot create a memory pool: %s (CUDA error %d)", o->device,
             cudaGetErrorString(e), (int)e);
    goto fail;
  }
  if ((s = cublasLtCreate(&kern_cuda_st.lt)) != CUBLAS_STATUS_SUCCESS) {
    snprintf(msg, n, "CUDA device %d: cublasLtCreate failed: %s", o->device,
             cublasLtGetStatusString(s));
    goto fail;
  }
  if ((e = cudaMalloc(&kern_cuda_st.workspace, KERN_CUDA_SIZE_WORKSPACE)) != cudaSuccess ||
      (e = cudaMalloc((void **)&kern_cuda_st.reduce,
                      (KERN_CUDA_SIZE_REDUCE_BLOCKS + 1) * sizeof(double))) != cudaSuccess ||
      (e = cudaMalloc((void **)&kern_cuda_st.pack,
                      2 * KERN_CUDA_SIZE_PACK_ELEMS * sizeof(uint16_t))) != cudaSuccess ||
      (e = cudaMalloc((void **)&kern_cuda_st.colsum,
                      KERN_CUDA_SIZE_COLSUM_FLOATS * sizeof(float))) != cudaSuccess) {
    snprintf(msg, n, "CUDA device %d: no memory for the backend's %zu reserved bytes: %s",
             o->device, kern_cuda_size_reserved(), cudaGetErrorString(e));
    goto fail;
  }
  if (!kern_cuda_cudnn_open(msg, n)) goto fail;
  kern_cuda_st.ready = 1;
  msg[0] = '\0';
  return kern_cuda_table_for_modes();

fail:
  kern_cuda_teardown();
  return NULL;
}

extern "C" void *kern_cuda_stream(void) { return (void *)kern_cuda_st.stream; }

extern "C" size_t kern_cuda_reserved_bytes(void) {
  return kern_cuda_st.ready ? kern_cuda_size_reserved() : 0;
}

extern "C" void kern_cuda_pool_stats(size_t *reserved, size_t *reserved_high, size_t *used_high) {
  uint64_t r = 0, rh = 0, uh = 0;
  if (kern_cuda_st.ready) {
    KERN_CUDA_CHECK(cudaMemPoolGetAttribute(kern_cuda_st.pool, cudaMemPoolAttrReservedMemCurrent, &r));
    KERN_CUDA_CHECK(cudaMemPoolGetAttribute(kern_cuda_st.pool, cudaMemPoolAttrReservedMemHigh, &rh));
    KERN_CUDA_CHECK(cudaMemPoolGetAttribute(kern_cuda_st.pool, cudaMemPoolAttrUsedMemHigh, &uh));
  }
  *reserved = (size_t)r, *reserved_high = (size_t)rh, *used_high = (size_t)uh;
}

extern "C" unsigned long kern_cuda_gelu_passes(void) { return kern_cuda_st.gelu_passes; }

extern "C" const char *kern_cuda_device_name(void) { return kern_cuda_st.name; }

extern "C" size_t kern_cuda_device_memory(void) { return kern_cuda_st.memory; }

extern "C" size_t kern_cuda_device_usable(void) {
  size_t free_bytes = 0, total = 0;
  if (!kern_cuda_st.ready || cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const size_t usable = free_bytes + kern_cuda_size_reserved();
  return usable > KERN_CUDA_SIZE_POOL_SLACK ? usable - KERN_CUDA_SIZE_POOL_SLACK : 0;
}

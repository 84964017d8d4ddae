/* cudnn: causal attention by cuDNN's fused flash attention (its graph API,
 * the backend descriptors of cudnn_graph.h), for the bf16 attention ops
 * (kern.h's attention_fwd_bf16 and attention_bwd_bf16) when the operator
 * asks for it (kern_cuda_opts_t.attn_cudnn, FSDP_CUDA_ATTN_CUDNN=1); by
 * default attention_tc.cu's kernels run them.
 *
 * libcudnn.so.9 is loaded with dlopen when asked for, never linked, so the
 * plugin loads where cuDNN is not installed. Host code only: no kernel in
 * this file, and none of the CUDA runtime (the stream comes as a pointer),
 * so tests/cuda/test_cudnn_graphs.c builds it for the CPU and asks cuDNN,
 * with no GPU, which of its engines take the graphs below (cuDNN 9.8's
 * device properties from JSON: "deviceless").
 *
 * The graphs are the pattern cuDNN's flash-attention engines match (the
 * one cudnn-frontend's SDPA nodes lower to), for qkv as the model keeps it,
 * (B, T, 3C) bf16 with head h's q, k and v at columns h hs, C + h hs and
 * 2C + h hs, viewed as (B, NH, T, hs) with strides (3CT, hs, 3C, 1):
 *
 *  - forward: S = q k^T scale, the causal mask (row index >= column index,
 *    else -inf), the softmax (its row maxima and sums, their log-sum-exp
 *    written to lse (B, NH, T), the layout attention.cu keeps), P rounded
 *    to bf16, out = P v in bf16 (B, T, C).
 *  - backward: D = rowsum(dout * out) (written to D, B NH T floats), S and
 *    P = exp(S scale - lse) again, dv = P^T dout, dP = dout v^T, dS = P (dP -
 *    D) scale, dk = dS^T q, dq = dS k accumulated in fp32 (dq_acc, B T C
 *    floats, in the layout (B, NH, T, hs)) then written: dq, dk and dv in
 *    fp32 straight into dqkv (B, T, 3C), as the other kernels write it.
 *
 * Plans are made once a shape (heuristics, then the first engine whose
 * workspace fits KERN_CUDA_SIZE_CUDNN_WS and whose plan builds) and kept
 * until kern_cudnn_close. */
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cudnn.h"
#include "kernels/cuda/size.h"

/* ---- the library ------------------------------------------------------------ */

#define KCD_FNS(X)                                                                                 \
  X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnGetLastErrorString) X(cudnnCreate)              \
  X(cudnnDestroy) X(cudnnSetStream) X(cudnnBackendCreateDescriptor)                                \
  X(cudnnBackendDestroyDescriptor) X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute)         \
  X(cudnnBackendFinalize) X(cudnnBackendExecute)

static struct {
  void *so;
#define X(f) decltype(&::f) f;
  KCD_FNS(X)
#undef X
  int open;                        /* kern_cudnn_open or _deviceless succeeded */
  cudnnHandle_t handle;            /* NULL when deviceless */
  cudnnBackendDescriptor_t device; /* deviceless: the GPU the heuristics and plans are for */
} kcd;

/* cuDNN 9.10.2 on, as cudnn-frontend asks of these graphs: from 9.6 a
 * non-virtual accumulator (dq_acc) is cleared by the engine itself, from
 * 9.8 device properties exist (deviceless planning), before 9.10 the mask
 * wanted -FLT_MAX for -inf, and 9.10.0 and 9.10.1 have known bugs in the
 * bf16 backward. */
#define KCD_MIN_VERSION 91002

static int kcd_load(char *msg, size_t n) {
  if (kcd.so) return 1;
  void *so = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    snprintf(msg, n, "cannot load cuDNN (libcudnn.so.9: %s); install cuDNN 9 (its directory on "
             "LD_LIBRARY_PATH) or leave FSDP_CUDA_ATTN_CUDNN unset", dlerror());
    return 0;
  }
#define X(f)                                                                                       \
  if (!(kcd.f = (decltype(&::f))dlsym(so, #f))) {                                                    \
    snprintf(msg, n, "libcudnn.so.9 has no %s: a cuDNN older than %d.%d.%d", #f,                  \
             KCD_MIN_VERSION / 10000, KCD_MIN_VERSION / 100 % 100, KCD_MIN_VERSION % 100);         \
    dlclose(so);                                                                                   \
    return 0;                                                                                      \
  }
  KCD_FNS(X)
#undef X
  const size_t v = kcd.cudnnGetVersion();
  if (v < KCD_MIN_VERSION) {
    snprintf(msg, n, "libcudnn.so.9 is cuDNN %zu.%zu.%zu; the fused attention needs %d.%d.%d or "
             "newer", v / 10000, v / 100 % 100, v % 100, KCD_MIN_VERSION / 10000,
             KCD_MIN_VERSION / 100 % 100, KCD_MIN_VERSION % 100);
    dlclose(so);
    return 0;
  }
  kcd.so = so;
  return 1;
}

/* A failed call's status and cuDNN's own last message into msg. */
static void kcd_why(char *msg, size_t n, const char *what, cudnnStatus_t s) {
  char last[256] = "";
  kcd.cudnnGetLastErrorString(last, sizeof last);
  snprintf(msg, n, "%s: %s%s%s", what, kcd.cudnnGetErrorString(s), last[0] ? ": " : "", last);
}

/* The device properties from cuDNN's JSON (deviceless) or the handle. */
static int kcd_device_from(const void *json, size_t len, char *msg, size_t n) {
  cudnnStatus_t s = kcd.cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &kcd.device);
  if (s == CUDNN_STATUS_SUCCESS) {
    s = json ? kcd.cudnnBackendSetAttribute(kcd.device, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
                                            CUDNN_TYPE_CHAR, (int64_t)len, json)
             : kcd.cudnnBackendSetAttribute(kcd.device, CUDNN_ATTR_DEVICEPROP_HANDLE,
                                            CUDNN_TYPE_HANDLE, 1, &kcd.handle);
    if (s == CUDNN_STATUS_SUCCESS) s = kcd.cudnnBackendFinalize(kcd.device);
  }
  if (s != CUDNN_STATUS_SUCCESS) {
    kcd_why(msg, n, "cuDNN's device properties", s);
    if (kcd.device) kcd.cudnnBackendDestroyDescriptor(kcd.device);
    kcd.device = NULL;
    return 0;
  }
  return 1;
}

/* On a device the graphs name the handle (as cudnn-frontend's do) and
 * cuDNN finds the device from it; deviceless, the heuristics and plans
 * name the device properties instead. */
extern "C" int kern_cudnn_open(void *stream, char *msg, size_t n) {
  if (kcd.open) return 1;
  if (!kcd_load(msg, n)) return 0;
  cudnnStatus_t s = kcd.cudnnCreate(&kcd.handle);
  if (s == CUDNN_STATUS_SUCCESS) s = kcd.cudnnSetStream(kcd.handle, (cudaStream_t)stream);
  if (s != CUDNN_STATUS_SUCCESS) {
    kcd_why(msg, n, "cudnnCreate", s);
    kern_cudnn_close();
    return 0;
  }
  kcd.open = 1;
  return 1;
}

extern "C" int kern_cudnn_open_deviceless(const char *json, char *msg, size_t n) {
  if (kcd.open) return 1;
  if (!kcd_load(msg, n)) return 0;
  if (!kcd_device_from(json, strlen(json), msg, n)) {
    kern_cudnn_close();
    return 0;
  }
  kcd.open = 1;
  return 1;
}

extern "C" int kern_cudnn_device_json(char *buf, size_t n) {
  const cudnnBackendAttributeName_t a = CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION;
  int64_t len = 0;
  char why[320];
  if (!kcd.device && kcd.handle && !kcd_device_from(NULL, 0, why, sizeof why)) return 0;
  if (!kcd.device ||
      kcd.cudnnBackendGetAttribute(kcd.device, a, CUDNN_TYPE_CHAR, 0, &len, NULL) !=
          CUDNN_STATUS_SUCCESS ||
      len < 0 || (size_t)len >= n ||
      kcd.cudnnBackendGetAttribute(kcd.device, a, CUDNN_TYPE_CHAR, len, &len, buf) !=
          CUDNN_STATUS_SUCCESS)
    return 0;
  buf[len] = '\0';
  return 1;
}

/* ---- graphs --------------------------------------------------------------------
 * A graph under construction: every descriptor it made (destroyed with it
 * unless kept by a plan), its operations, and the first failure. */

#define KCD_MAX_DESCS 160
#define KCD_MAX_OPS 32

typedef struct {
  cudnnBackendDescriptor_t d[KCD_MAX_DESCS];
  int nd;
  cudnnBackendDescriptor_t op[KCD_MAX_OPS];
  int nop;
  int64_t next_uid; /* virtual tensors' */
  cudnnStatus_t err;
  const char *at; /* what failed */
} kcd_graph_t;

static cudnnBackendDescriptor_t kcd_new(kcd_graph_t *g, cudnnBackendDescriptorType_t t) {
  if (g->err || g->nd == KCD_MAX_DESCS) {
    if (!g->err) g->err = CUDNN_STATUS_INTERNAL_ERROR, g->at = "too many descriptors";
    return NULL;
  }
  cudnnBackendDescriptor_t d = NULL;
  const cudnnStatus_t s = kcd.cudnnBackendCreateDescriptor(t, &d);
  if (s != CUDNN_STATUS_SUCCESS) {
    g->err = s, g->at = "cudnnBackendCreateDescriptor";
    return NULL;
  }
  return g->d[g->nd++] = d;
}

static void kcd_set(kcd_graph_t *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                    cudnnBackendAttributeType_t t, int64_t count, const void *v, const char *what) {
  if (g->err) return;
  const cudnnStatus_t s = kcd.cudnnBackendSetAttribute(d, a, t, count, v);
  if (s != CUDNN_STATUS_SUCCESS) g->err = s, g->at = what;
}

static void kcd_fin(kcd_graph_t *g, cudnnBackendDescriptor_t d, const char *what) {
  if (g->err) return;
  const cudnnStatus_t s = kcd.cudnnBackendFinalize(d);
  if (s != CUDNN_STATUS_SUCCESS) g->err = s, g->at = what;
}

/* The uids of the tensors that carry data (the variant pack's); virtual
 * ones count on from KCD_VIRTUAL. */
enum {
  KCD_Q = 1, KCD_K, KCD_V, KCD_O, KCD_LSE, KCD_DO, KCD_D, KCD_DQ_ACC, KCD_DQ, KCD_DK, KCD_DV,
  KCD_SCALE, KCD_NEG_INF, KCD_ONE, KCD_VIRTUAL = 100
};

typedef struct {
  int64_t dim[4], stride[4];
} kcd_shape_t;

/* A 4-d tensor: uid 0 makes a virtual one (an intermediate the engine keeps
 * on chip); by_value, a scalar passed from host memory. */
static cudnnBackendDescriptor_t kcd_tensor(kcd_graph_t *g, int64_t uid, cudnnDataType_t t,
                                           const kcd_shape_t *s, int by_value) {
  cudnnBackendDescriptor_t d = kcd_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const bool virt = uid == 0, byv = by_value != 0;
  const int64_t u = virt ? g->next_uid++ : uid, align = 16;
  kcd_set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &u, "a tensor's uid");
  kcd_set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t, "a tensor's type");
  kcd_set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, s->dim, "a tensor's dims");
  kcd_set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, s->stride, "a tensor's strides");
  kcd_set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "an alignment");
  kcd_set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "virtual");
  if (byv) kcd_set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byv, "by value");
  kcd_fin(g, d, "a tensor");
  return d;
}

static void kcd_op(kcd_graph_t *g, cudnnBackendDescriptor_t o, const char *what) {
  kcd_fin(g, o, what);
  if (g->err) return;
  if (g->nop == KCD_MAX_OPS) {
    g->err = CUDNN_STATUS_INTERNAL_ERROR, g->at = "too many operations";
    return;
  }
  g->op[g->nop++] = o;
}

/* An operation of type t whose attributes name the descriptors given (its
 * tensors and its own descriptor; a NULL one left unset), into the graph. */
typedef struct {
  cudnnBackendAttributeName_t name;
  cudnnBackendDescriptor_t d;
} kcd_ref_t;

static void kcd_operation(kcd_graph_t *g, cudnnBackendDescriptorType_t t, const kcd_ref_t *refs,
                          int n, const char *what) {
  cudnnBackendDescriptor_t o = kcd_new(g, t);
  for (int i = 0; i < n; i++)
    if (refs[i].d) kcd_set(g, o, refs[i].name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &refs[i].d, what);
  kcd_op(g, o, what);
}

/* y = mode(x, b) (b NULL for one input; t, BINARY_SELECT's condition: y = t ?
 * x : b; axis, GEN_INDEX's), computed in prec. */
static void kcd_pointwise(kcd_graph_t *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                          cudnnBackendDescriptor_t t, int64_t axis, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t p = kcd_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  kcd_set(g, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  kcd_set(g, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise prec");
  if (axis >= 0)
    kcd_set(g, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
  kcd_fin(g, p, "a pointwise descriptor");
  const kcd_ref_t r[] = {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p},
                         {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
                         {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b},
                         {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t},
                         {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}};
  kcd_operation(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, r, 5, "a pointwise operation");
}

/* c = a b (batched over the first two dims), accumulated in fp32 */
static void kcd_matmul(kcd_graph_t *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                       cudnnBackendDescriptor_t c) {
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t m = kcd_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  kcd_set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "matmul type");
  kcd_fin(g, m, "a matmul descriptor");
  const kcd_ref_t r[] = {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                         {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                         {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                         {CUDNN_ATTR_OPERATION_MATMUL_DESC, m}};
  kcd_operation(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, r, 4, "a matmul operation");
}

/* y = the reduction (max or sum) of x over the dims where y is 1 */
static void kcd_reduce(kcd_graph_t *g, cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x,
                       cudnnBackendDescriptor_t y) {
  const cudnnDataType_t f = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t m = kcd_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  kcd_set(g, m, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op, "op");
  kcd_set(g, m, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "reduction type");
  kcd_fin(g, m, "a reduction descriptor");
  const kcd_ref_t r[] = {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                         {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y},
                         {CUDNN_ATTR_OPERATION_REDUCTION_DESC, m}};
  kcd_operation(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, r, 3, "a reduction operation");
}

/* y = x seen with other dims and strides (a transpose) */
static void kcd_reshape(kcd_graph_t *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  const kcd_ref_t r[] = {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x},
                         {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y}};
  kcd_operation(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, r, 2, "a reshape operation");
}

/* The shapes of one attention call. */
typedef struct {
  kcd_shape_t qkv, kt, out, scores, scores_t, rows, one, acc;
} kcd_shapes_t;

static kcd_shapes_t kcd_shapes(int B, int T, int C, int NH) {
  const int64_t b = B, t = T, c = C, h = NH, hs = C / NH, c3 = 3 * c;
  kcd_shapes_t s = {
      {{b, h, t, hs}, {t * c3, hs, c3, 1}}, /* q, k or v in qkv; dq, dk, dv in dqkv */
      {{b, h, hs, t}, {t * c3, hs, 1, c3}}, /* k^T (v^T) in qkv */
      {{b, h, t, hs}, {t * c, hs, c, 1}},   /* out, dout (B, T, C) */
      {{b, h, t, t}, {h * t * t, t * t, t, 1}},
      {{b, h, t, t}, {h * t * t, t * t, 1, t}}, /* the scores transposed */
      {{b, h, t, 1}, {h * t, t, 1, 1}},         /* lse, D: a float a query row */
      {{1, 1, 1, 1}, {1, 1, 1, 1}},
      {{b, h, t, hs}, {h * t * hs, t * hs, hs, 1}}, /* dq's fp32 accumulator */
  };
  return s;
}

/* S = q k^T scale (less lse, a row's, where given: backward), then
 * causally masked (-inf above the diagonal), in cudnn-frontend's order:
 * the scores both passes start from. */
static cudnnBackendDescriptor_t kcd_masked_scores(kcd_graph_t *g, const kcd_shapes_t *s,
                                                  cudnnBackendDescriptor_t q,
                                                  cudnnBackendDescriptor_t kt,
                                                  cudnnBackendDescriptor_t scale,
                                                  cudnnBackendDescriptor_t lse) {
  const cudnnDataType_t F = CUDNN_DATA_FLOAT, I = CUDNN_DATA_INT32, BO = CUDNN_DATA_BOOLEAN;
  cudnnBackendDescriptor_t qk = kcd_tensor(g, 0, F, &s->scores, 0);
  kcd_matmul(g, q, kt, qk);
  cudnnBackendDescriptor_t sc = kcd_tensor(g, 0, F, &s->scores, 0);
  kcd_pointwise(g, CUDNN_POINTWISE_MUL, F, qk, scale, NULL, -1, sc);
  if (lse) {
    cudnnBackendDescriptor_t x = kcd_tensor(g, 0, F, &s->scores, 0);
    kcd_pointwise(g, CUDNN_POINTWISE_SUB, F, sc, lse, NULL, -1, x);
    sc = x;
  }
  cudnnBackendDescriptor_t row = kcd_tensor(g, 0, I, &s->scores, 0),
                           col = kcd_tensor(g, 0, I, &s->scores, 0),
                           keep = kcd_tensor(g, 0, BO, &s->scores, 0);
  kcd_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, sc, NULL, NULL, 2, row);
  kcd_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, F, sc, NULL, NULL, 3, col);
  kcd_pointwise(g, CUDNN_POINTWISE_CMP_GE, BO, row, col, NULL, -1, keep);
  cudnnBackendDescriptor_t neg_inf = kcd_tensor(g, KCD_NEG_INF, F, &s->one, 1);
  cudnnBackendDescriptor_t masked = kcd_tensor(g, 0, F, &s->scores, 0);
  kcd_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, F, sc, neg_inf, keep, -1, masked);
  return masked;
}

static void kcd_graph_fwd(kcd_graph_t *g, const kcd_shapes_t *s) {
  const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t q = kcd_tensor(g, KCD_Q, BF, &s->qkv, 0),
                           kt = kcd_tensor(g, KCD_K, BF, &s->kt, 0),
                           v = kcd_tensor(g, KCD_V, BF, &s->qkv, 0),
                           scale = kcd_tensor(g, KCD_SCALE, F, &s->one, 1);
  cudnnBackendDescriptor_t S = kcd_masked_scores(g, s, q, kt, scale, NULL);
  cudnnBackendDescriptor_t m = kcd_tensor(g, 0, F, &s->rows, 0), x = kcd_tensor(g, 0, F, &s->scores, 0),
                           e = kcd_tensor(g, 0, F, &s->scores, 0), l = kcd_tensor(g, 0, F, &s->rows, 0);
  kcd_reduce(g, CUDNN_REDUCE_TENSOR_MAX, S, m);
  kcd_pointwise(g, CUDNN_POINTWISE_SUB, F, S, m, NULL, -1, x);
  kcd_pointwise(g, CUDNN_POINTWISE_EXP, F, x, NULL, NULL, -1, e);
  kcd_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, l);
  cudnnBackendDescriptor_t logl = kcd_tensor(g, 0, F, &s->rows, 0),
                           lse = kcd_tensor(g, KCD_LSE, F, &s->rows, 0);
  kcd_pointwise(g, CUDNN_POINTWISE_LOG, F, l, NULL, NULL, -1, logl);
  kcd_pointwise(g, CUDNN_POINTWISE_ADD, F, m, logl, NULL, -1, lse);
  cudnnBackendDescriptor_t p = kcd_tensor(g, 0, BF, &s->scores, 0); /* bf16: the product's operand */
  kcd_pointwise(g, CUDNN_POINTWISE_DIV, F, e, l, NULL, -1, p);
  kcd_matmul(g, p, v, kcd_tensor(g, KCD_O, BF, &s->out, 0));
}

/* out16: dq, dk and dv written in bf16 (to a buffer in dqkv's layout the
 * caller widens), for a cuDNN that takes no fp32 outputs: NVIDIA documents
 * bf16 ones, and fp32 ones are not among its documented combinations. */
static void kcd_graph_bwd(kcd_graph_t *g, const kcd_shapes_t *s, int out16) {
  const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT, G = out16 ? BF : F;
  cudnnBackendDescriptor_t q = kcd_tensor(g, KCD_Q, BF, &s->qkv, 0),
                           kt = kcd_tensor(g, KCD_K, BF, &s->kt, 0),
                           vt = kcd_tensor(g, KCD_V, BF, &s->kt, 0),
                           o = kcd_tensor(g, KCD_O, BF, &s->out, 0),
                           dout = kcd_tensor(g, KCD_DO, BF, &s->out, 0),
                           lse = kcd_tensor(g, KCD_LSE, F, &s->rows, 0),
                           scale = kcd_tensor(g, KCD_SCALE, F, &s->one, 1),
                           one = kcd_tensor(g, KCD_ONE, F, &s->one, 1);
  /* D = rowsum(dout * out), written */
  cudnnBackendDescriptor_t dxo = kcd_tensor(g, 0, F, &s->out, 0), d0 = kcd_tensor(g, 0, F, &s->rows, 0),
                           D = kcd_tensor(g, KCD_D, F, &s->rows, 0);
  kcd_pointwise(g, CUDNN_POINTWISE_MUL, F, dout, o, NULL, -1, dxo);
  kcd_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dxo, d0);
  kcd_pointwise(g, CUDNN_POINTWISE_MUL, F, d0, one, NULL, -1, D);
  /* P = exp(S - lse); dv = P^T dout */
  cudnnBackendDescriptor_t x = kcd_masked_scores(g, s, q, kt, scale, lse);
  cudnnBackendDescriptor_t p = kcd_tensor(g, 0, F, &s->scores, 0),
                           pt = kcd_tensor(g, 0, BF, &s->scores_t, 0);
  kcd_pointwise(g, CUDNN_POINTWISE_EXP, F, x, NULL, NULL, -1, p);
  kcd_reshape(g, p, pt);
  kcd_matmul(g, pt, dout, kcd_tensor(g, KCD_DV, G, &s->qkv, 0));
  /* dS = P (dout v^T - D) scale; dk = dS^T q */
  cudnnBackendDescriptor_t dp = kcd_tensor(g, 0, F, &s->scores, 0), dpd = kcd_tensor(g, 0, F, &s->scores, 0),
                           dsu = kcd_tensor(g, 0, F, &s->scores, 0), ds = kcd_tensor(g, 0, F, &s->scores, 0),
                           dst = kcd_tensor(g, 0, BF, &s->scores_t, 0);
  kcd_matmul(g, dout, vt, dp);
  kcd_pointwise(g, CUDNN_POINTWISE_SUB, F, dp, D, NULL, -1, dpd);
  kcd_pointwise(g, CUDNN_POINTWISE_MUL, F, dpd, p, NULL, -1, dsu);
  kcd_pointwise(g, CUDNN_POINTWISE_MUL, F, dsu, scale, NULL, -1, ds);
  kcd_reshape(g, ds, dst);
  kcd_matmul(g, dst, q, kcd_tensor(g, KCD_DK, G, &s->qkv, 0));
  /* dq = dS k, accumulated in fp32, then written */
  cudnnBackendDescriptor_t k = kcd_tensor(g, 0, BF, &s->qkv, 0),
                           acc = kcd_tensor(g, KCD_DQ_ACC, F, &s->acc, 0);
  kcd_reshape(g, kt, k);
  kcd_matmul(g, ds, k, acc);
  kcd_pointwise(g, CUDNN_POINTWISE_IDENTITY, F, acc, NULL, NULL, -1,
                kcd_tensor(g, KCD_DQ, G, &s->qkv, 0));
}

/* ---- plans ----------------------------------------------------------------------- */

typedef struct {
  int bwd, B, T, C, NH;          /* bwd: KERN_CUDNN_FWD, _BWD or _BWD16 */
  int ok;                        /* 1: plan (on a device) or config (deviceless) chosen */
  int out16;                     /* backward's dq, dk and dv in bf16 (kcd_graph_bwd) */
  cudnnBackendDescriptor_t plan; /* NULL deviceless */
  int64_t workspace;             /* bytes */
  int64_t engine;                /* cuDNN's global index of the chosen engine */
  char why[320];                 /* when !ok */
  int said;                      /* why was printed */
  cudnnBackendDescriptor_t *keep; /* the graph's descriptors, which the plan refers to */
  int nkeep;
} kcd_plan_t;

#define KCD_MAX_PLANS 32
static kcd_plan_t kcd_plans[KCD_MAX_PLANS];
static int kcd_nplans;

static void kcd_destroy(cudnnBackendDescriptor_t *d, int n) {
  for (int i = n - 1; i >= 0; i--) kcd.cudnnBackendDestroyDescriptor(d[i]);
}

/* The graph's heuristic configurations in order; the first whose workspace
 * fits the scratch's room and (on a device) whose plan builds. */
static void kcd_plan_make(kcd_plan_t *p) {
  static kcd_graph_t g; /* large; plans are made one at a time (one stream) */
  memset(&g, 0, sizeof g);
  g.next_uid = KCD_VIRTUAL;
  const kcd_shapes_t s = kcd_shapes(p->B, p->T, p->C, p->NH);
  if (p->bwd) kcd_graph_bwd(&g, &s, p->out16);
  else kcd_graph_fwd(&g, &s);
  const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  cudnnBackendDescriptor_t og = kcd_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  kcd_set(&g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, D, g.nop, g.op, "the graph's operations");
  if (kcd.handle)
    kcd_set(&g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &kcd.handle,
            "the graph's handle");
  kcd_fin(&g, og, "the operation graph");
  cudnnBackendDescriptor_t heur = kcd_new(&g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  kcd_set(&g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, D, 1, &og, "heuristics' graph");
  kcd_set(&g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics' mode");
  if (!kcd.handle)
    kcd_set(&g, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, D, 1, &kcd.device, "heuristics' device");
  kcd_fin(&g, heur, "the heuristics");
  enum { MAX_CFG = 8 };
  cudnnBackendDescriptor_t cfg[MAX_CFG];
  int64_t ncfg = 0;
  for (int i = 0; i < MAX_CFG; i++) cfg[i] = kcd_new(&g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  if (!g.err) {
    const cudnnStatus_t st =
        kcd.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, D, MAX_CFG, &ncfg, cfg);
    if (st != CUDNN_STATUS_SUCCESS) g.err = st, g.at = "the heuristics' results";
  }
  if (g.err) {
    kcd_why(p->why, sizeof p->why, g.at, g.err);
    kcd_destroy(g.d, g.nd);
    return;
  }
  snprintf(p->why, sizeof p->why, "none of cuDNN's %lld engine configurations for the graph",
           (long long)ncfg);
  for (int64_t i = 0; i < ncfg && !p->ok; i++) {
    int64_t ws = -1, got = 0, engine = -1;
    cudnnBackendDescriptor_t e = kcd_new(&g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    if (g.err ||
        kcd.cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                     1, &got, &ws) != CUDNN_STATUS_SUCCESS ||
        kcd.cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE, D, 1, &got, &e) !=
            CUDNN_STATUS_SUCCESS ||
        kcd.cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                     &engine) != CUDNN_STATUS_SUCCESS)
      continue;
    if (ws < 0 || (size_t)ws > KERN_CUDA_SIZE_CUDNN_WS) {
      snprintf(p->why, sizeof p->why, "cuDNN's engine %lld wants %lld bytes of workspace, more "
               "than the %zu its scratch holds", (long long)engine, (long long)ws,
               (size_t)KERN_CUDA_SIZE_CUDNN_WS);
      continue;
    }
    if (kcd.handle) { /* a device: the plan itself (it compiles the engine's kernels) */
      cudnnBackendDescriptor_t plan = NULL;
      cudnnStatus_t st = kcd.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
      if (st == CUDNN_STATUS_SUCCESS)
        st = kcd.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, D, 1, &cfg[i]);
      if (st == CUDNN_STATUS_SUCCESS) st = kcd.cudnnBackendFinalize(plan);
      if (st == CUDNN_STATUS_SUCCESS)
        st = kcd.cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                          CUDNN_TYPE_INT64, 1, &got, &ws);
      if (st != CUDNN_STATUS_SUCCESS || ws < 0 || (size_t)ws > KERN_CUDA_SIZE_CUDNN_WS) {
        if (st != CUDNN_STATUS_SUCCESS) kcd_why(p->why, sizeof p->why, "the execution plan", st);
        if (plan) kcd.cudnnBackendDestroyDescriptor(plan);
        continue;
      }
      p->plan = plan;
    }
    p->ok = 1, p->workspace = ws, p->engine = engine;
  }
  /* a plan refers to its engine configuration and graph: they stay with it */
  if (p->plan && (p->keep = (cudnnBackendDescriptor_t *)malloc(g.nd * sizeof *p->keep))) {
    memcpy(p->keep, g.d, g.nd * sizeof *p->keep);
    p->nkeep = g.nd;
  } else {
    if (p->plan) kcd.cudnnBackendDestroyDescriptor(p->plan), p->plan = NULL, p->ok = 0;
    kcd_destroy(g.d, g.nd);
  }
}

static kcd_plan_t *kcd_plan(int bwd, int B, int T, int C, int NH) {
  for (int i = 0; i < kcd_nplans; i++) {
    kcd_plan_t *p = &kcd_plans[i];
    if (p->bwd == bwd && p->B == B && p->T == T && p->C == C && p->NH == NH) return p;
  }
  if (kcd_nplans == KCD_MAX_PLANS) return NULL;
  kcd_plan_t *p = &kcd_plans[kcd_nplans++];
  memset(p, 0, sizeof *p);
  p->bwd = bwd, p->B = B, p->T = T, p->C = C, p->NH = NH, p->out16 = bwd == KERN_CUDNN_BWD16;
  if (NH <= 0 || C % NH) {
    snprintf(p->why, sizeof p->why, "C = %d is not a multiple of NH = %d", C, NH);
    return p;
  }
  kcd_plan_make(p);
  if (!p->ok && bwd == KERN_CUDNN_BWD) { /* then with the gradients in bf16 */
    char why32[sizeof p->why];
    memcpy(why32, p->why, sizeof why32);
    p->out16 = 1;
    kcd_plan_make(p);
    if (!p->ok) {
      char why16[sizeof p->why];
      memcpy(why16, p->why, sizeof why16);
      snprintf(p->why, sizeof p->why, "fp32 gradients: %.140s; bf16 ones: %.140s", why32, why16);
    }
  }
  return p;
}

extern "C" int kern_cudnn_sdpa_plan(int bwd, int B, int T, int C, int NH, size_t *workspace,
                                    long *engine, int *out16, char *why, size_t n) {
  kcd_plan_t *p = kcd.open ? kcd_plan(bwd, B, T, C, NH) : NULL;
  if (!p || !p->ok) {
    snprintf(why, n, "%s", !kcd.open ? "cuDNN is not open" : p ? p->why : "too many shapes");
    return 0;
  }
  if (workspace) *workspace = (size_t)p->workspace;
  if (engine) *engine = (long)p->engine;
  if (out16) *out16 = p->out16;
  return 1;
}

/* Runs plan p with its tensors (uids and pointers, n of them). */
static int kcd_run(kcd_plan_t *p, const int64_t *uids, void *const *ptrs, int n, void *ws) {
  cudnnBackendDescriptor_t vp = NULL;
  const cudnnBackendAttributeType_t V = CUDNN_TYPE_VOID_PTR;
  cudnnStatus_t s = kcd.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (s == CUDNN_STATUS_SUCCESS)
    s = kcd.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (s == CUDNN_STATUS_SUCCESS)
    s = kcd.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, V, n, ptrs);
  if (s == CUDNN_STATUS_SUCCESS)
    s = kcd.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, V, 1, &ws);
  if (s == CUDNN_STATUS_SUCCESS) s = kcd.cudnnBackendFinalize(vp);
  if (s == CUDNN_STATUS_SUCCESS) s = kcd.cudnnBackendExecute(kcd.handle, p->plan, vp);
  if (vp) kcd.cudnnBackendDestroyDescriptor(vp);
  if (s != CUDNN_STATUS_SUCCESS) {
    char why[320];
    kcd_why(why, sizeof why, "cudnnBackendExecute", s);
    fprintf(stderr, "fsdp: cuda backend: cuDNN attention (%s, B=%d T=%d C=%d NH=%d): %s\n",
            p->bwd ? "backward" : "forward", p->B, p->T, p->C, p->NH, why);
    abort(); /* queued work may be half done: nothing to fall back on */
  }
  return 1;
}

/* The plan for a call, or NULL (said once a shape) where there is none:
 * the caller's kernels run it instead. */
static kcd_plan_t *kcd_plan_for(int bwd, int B, int T, int C, int NH) {
  kcd_plan_t *p = kcd.handle ? kcd_plan(bwd, B, T, C, NH) : NULL;
  static int full_said;
  if (kcd.handle && !p && !full_said++)
    fprintf(stderr, "fsdp: cuda backend: cuDNN attention: plans for %d shapes made, no room for "
            "more (B=%d T=%d C=%d NH=%d); attention_tc.cu's kernels run the rest\n", KCD_MAX_PLANS,
            B, T, C, NH);
  if (p && !p->ok && !p->said) {
    fprintf(stderr, "fsdp: cuda backend: cuDNN attention %s B=%d T=%d C=%d NH=%d: %s; "
            "attention_tc.cu's kernels run it\n", bwd ? "backward" : "forward", B, T, C, NH, p->why);
    p->said = 1;
  }
  return p && p->ok ? p : NULL;
}

extern "C" int kern_cudnn_sdpa_fwd(uint16_t *out16, float *lse, const uint16_t *qkv16, void *ws,
                                   int B, int T, int C, int NH) {
  kcd_plan_t *p = kcd_plan_for(KERN_CUDNN_FWD, B, T, C, NH);
  if (!p) return 0;
  float scale = 1.0f / sqrtf((float)(C / NH)), neg_inf = -INFINITY;
  const int64_t uids[] = {KCD_Q, KCD_K, KCD_V, KCD_O, KCD_LSE, KCD_SCALE, KCD_NEG_INF};
  void *const ptrs[] = {(void *)qkv16, (void *)(qkv16 + C), (void *)(qkv16 + 2 * C), out16, lse,
                        &scale, &neg_inf};
  return kcd_run(p, uids, ptrs, 7, ws);
}

static int kcd_bwd16; /* kern_cudnn_bwd16: backward's bf16 gradients asked for */

extern "C" void kern_cudnn_bwd16(int on) { kcd_bwd16 = on != 0; }

extern "C" int kern_cudnn_sdpa_bwd(float *dqkv, uint16_t *dqkv16, float *D, float *dq_acc,
                                   void *ws, const uint16_t *dout16, const uint16_t *qkv16,
                                   const uint16_t *out16, const float *lse, int B, int T, int C,
                                   int NH) {
  kcd_plan_t *p = kcd_plan_for(kcd_bwd16 || !dqkv ? KERN_CUDNN_BWD16 : KERN_CUDNN_BWD, B, T, C, NH);
  if (!p) return 0;
  float scale = 1.0f / sqrtf((float)(C / NH)), neg_inf = -INFINITY, one = 1.0f;
  void *g = p->out16 ? (void *)dqkv16 : (void *)dqkv;
  const size_t es = p->out16 ? 2 : 4; /* the gradients' element */
  const int64_t uids[] = {KCD_Q,  KCD_K,      KCD_V,  KCD_O,  KCD_DO,    KCD_LSE,     KCD_D,
                          KCD_DQ_ACC, KCD_DQ, KCD_DK, KCD_DV, KCD_SCALE, KCD_NEG_INF, KCD_ONE};
  void *const ptrs[] = {(void *)qkv16,
                        (void *)(qkv16 + C),
                        (void *)(qkv16 + 2 * C),
                        (void *)out16,
                        (void *)dout16,
                        (void *)lse,
                        D,
                        dq_acc,
                        g,
                        (char *)g + es * (size_t)C,
                        (char *)g + es * 2 * (size_t)C,
                        &scale,
                        &neg_inf,
                        &one};
  kcd_run(p, uids, ptrs, 14, ws);
  return p->out16 ? 2 : 1;
}

extern "C" void kern_cudnn_close(void) {
  for (int i = 0; i < kcd_nplans; i++) {
    kcd_plan_t *p = &kcd_plans[i];
    if (p->plan) kcd.cudnnBackendDestroyDescriptor(p->plan);
    kcd_destroy(p->keep, p->nkeep);
    free(p->keep);
  }
  kcd_nplans = 0;
  if (kcd.device) kcd.cudnnBackendDestroyDescriptor(kcd.device);
  if (kcd.handle) kcd.cudnnDestroy(kcd.handle);
  kcd.device = NULL, kcd.handle = NULL, kcd.open = 0; /* the library stays loaded (cuDNN's own state) */
}

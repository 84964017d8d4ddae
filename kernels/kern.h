/* kern: the op set every model computes with, behind one backend table.
 *
 * A backend (cpu now, cuda later) fills a static const kern_backend_t; callers
 * hold a pointer to it and never name a backend's functions directly (after
 * ggml's ggml_backend_i). Pointers are device pointers of that backend: code
 * outside kernels/ never reads or writes them itself, it asks the table (the
 * memory section below: allocation, set, copies, the few vector ops a runtime
 * needs between ops).
 *
 * kernels/ is a leaf: it includes nothing of the daemon. Tunables reach a
 * backend through its init call (kern_cpu_init), never from the environment.
 *
 * Conventions, for every op:
 *  - Tensors are dense, row-major fp32 unless the op says otherwise. Shapes are in
 *    the comment of each member: B batch, T sequence, C channels, NH heads, V vocab,
 *    N rows (B*T), IC/OC input/output features.
 *  - Backward ops ACCUMULATE (+=) into every gradient they write, parameters and
 *    activations alike: gradient accumulation over micro-batches and the
 *    residual stream both rely on it. Callers zero gradients when they start.
 *    The exceptions are the activation gradients of the ops that take acc
 *    (matmul_bwd's dinp, attention_bwd's dqkv, gelu_bwd's dinp): with acc 0
 *    they are written (=), their old contents never read, so a caller whose
 *    buffer holds nothing yet skips zeroing it and the op skips reading the
 *    zeros (on a GPU two passes over memory a buffer); acc 1 accumulates.
 *    The same values either way (the sign of a zero aside).
 *  - Ops never allocate. Scratch memory is passed in, sized by *_scratch().
 *  - Where an op takes a leading dimension (ld, ldo), rows are that many floats
 *    apart; the caller pads a wide matrix's rows to KERN_LD_ALIGN floats (the
 *    logits: V = 50257 would leave every row but the first 4-byte aligned, and
 *    a GPU's tensor-core products and vector loads want 16 bytes and more).
 *    The results are the dense layout's up to the product library's choice of
 *    kernel, which may depend on the leading dimension (oneDNN's sgemm takes
 *    another path for one that is a multiple of 256 floats).
 */
#ifndef FSDP_KERN_H
#define FSDP_KERN_H

#include <stddef.h>
#include <stdint.h>

/* Floats a padded row's leading dimension is a multiple of: 256 bytes, the
 * most alignment cuBLASLt asks of a matrix. */
#define KERN_LD_ALIGN 64

typedef enum {
  KERN_OP_ENCODER,
  KERN_OP_LAYERNORM,
  KERN_OP_MATMUL,
  KERN_OP_ATTENTION,
  KERN_OP_GELU,
  KERN_OP_RESIDUAL,
  KERN_OP_CROSSENTROPY,
  KERN_OP_ADAMW,
  KERN_OP_CAST,
  KERN_OP_SUMSQ,
  KERN_OP__COUNT
} kern_op_t;

/* A run of elements [offset, offset + numel) of a buffer, with weight
 * decay or not (adamw_segs) */
typedef struct kern_seg {
  size_t offset, numel;
  int decay;
} kern_seg_t;

typedef struct kern_backend {
  const char *name;
  /* 1 when the op is implemented by this backend, 0 when not (never a crash). */
  int (*supports_op)(kern_op_t op);
  /* Worker threads the backend uses (CPU: OpenMP threads); n <= 0 means all cores. */
  void (*set_threads)(int n);
  int (*get_threads)(void);

  /* ---- memory: device buffers, from the host's side ---------------------
   * host_memory 1: device pointers are host pointers (the CPU backend), so
   * the accounting allocator serves device buffers as host ones and
   * dev_alloc / dev_free are NULL. Otherwise dev_alloc returns device memory
   * (64-byte aligned; NULL when the device is full) and the caller counts it
   * (mem_dev_alloc, daemon/common/mem.h, is the one caller). dev_alloc_step
   * serves a buffer that lives within one training step (a gathered unit, a
   * unit's gradient: made and freed every step, at the same sizes), freed by
   * dev_free_step: the backend may keep its memory for the next step's
   * buffers (CUDA: a stream-ordered pool, where neither call waits for the
   * device as cudaMalloc and cudaFree do); NULL: dev_alloc and dev_free
   * serve those too. */
  int host_memory;
  void *(*dev_alloc)(size_t bytes);
  void (*dev_free)(void *p);
  void *(*dev_alloc_step)(size_t bytes);
  void (*dev_free_step)(void *p);
  /* Every byte of dst[0, bytes) set to v. */
  void (*dev_set)(void *dst, int v, size_t bytes);
  /* Copies of bytes between host and device memory (regions never overlap). */
  void (*copy_h2d)(void *dst, const void *src, size_t bytes);
  void (*copy_d2h)(void *dst, const void *src, size_t bytes);
  void (*copy_d2d)(void *dst, const void *src, size_t bytes);
  /* Page-locks host memory that copy_d2h and copy_h2d will move often (a
   * checkpoint's snapshot), so a GPU's DMA moves it at the bus's speed
   * instead of through a staging copy: 0, or a negative code when it cannot
   * (copies still work, slower). host_unpin undoes it before the memory is
   * freed. NULL in a backend whose device memory is host memory. */
  int (*host_pin)(void *p, size_t bytes);
  void (*host_unpin)(void *p);
  /* Waits until every op queued so far has finished (a GPU's stream): after
   * it the host may read what copy_d2h wrote. The CPU runs ops synchronously. */
  void (*sync)(void);
  /* y (n) += x; y (n) *= s: element-wise, the same bytes for any thread count. */
  void (*vec_add)(float *y, const float *x, size_t n);
  void (*vec_scale)(float *y, float s, size_t n);
  /* Sum of x (n), accumulated in double in index order (a fixed order: the
   * same bytes whatever the thread count). For short vectors (a batch's losses). */
  double (*vec_sum)(const float *x, size_t n);

  /* ---- the CPU collectives' element-wise work (host memory; NULL in a
   * device backend, whose collectives reduce on the device) ----
   * dst = (a + b) / div over n elements (div 1: the plain sum); bf16 (uint16
   * storage) adds in fp32 and rounds once, after the division. a may be
   * unaligned. stream: dst is not read again soon, so it is written with
   * non-temporal stores (a large collective's output). */
  void (*reduce_f32)(float *dst, const void *a, const float *b, size_t n, float div, int stream);
  void (*reduce_bf16)(uint16_t *dst, const void *a, const uint16_t *b, size_t n, float div,
                      int stream);
  /* memcpy for a destination not read again soon: non-temporal stores from
   * 4 KiB up, then a store fence. */
  void (*copy_stream)(void *dst, const void *src, size_t n);

  /* out (B,T,C) = wte[tok] + wpe[t]. tok (B,T) must be < V (checked by the caller). */
  void (*encoder_fwd)(float *out, const int32_t *tok, const float *wte, const float *wpe, int B,
                      int T, int C);
  /* dwte (V,C) += scatter of dout rows; dwpe (T,C) += sum over b. */
  void (*encoder_bwd)(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B,
                      int T, int C);

  /* out (N,C) = (inp - mean) * rstd * w + b; saves mean (N), rstd (N). */
  void (*layernorm_fwd)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                        const float *b, int N, int C);
  void (*layernorm_bwd)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C);

  /* out (N,OC) = inp (N,IC) @ w (OC,IC)^T + bias (OC); bias may be NULL. out's
   * rows are ldo >= OC floats apart (the LM head's logits pad theirs, see
   * KERN_LD_ALIGN); columns OC..ldo-1 are not touched. */
  void (*matmul_fwd)(float *out, const float *inp, const float *w, const float *bias, int N,
                     int IC, int OC, int ldo);
  /* dinp (N,IC) += dout @ w (acc 1; = with acc 0); dw (OC,IC) += dout^T @ inp; dbias (OC) +=
   * column sums (if not NULL). dout's rows are ldo >= OC floats apart. */
  void (*matmul_bwd)(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int IC, int OC, int ldo, int acc);

  /* Causal multi-head attention. qkv (B,T,3C) holds q, k, v side by side, each
   * (NH heads of C/NH). out (B,T,C). att (attention_saved() floats) is what
   * forward keeps for backward, the backend's own: each query row's
   * log-sum-exp of its scaled scores (B,NH,T) where backward computes the
   * probabilities again (the CPU backend, the GPU's fused kernel), the
   * softmax probabilities (B,NH,T,T; entries above the diagonal 0) in the
   * GPU's strided-product path. scratch holds attention_scratch() floats,
   * forward's and backward's work; nothing in it outlives an op. */
  void (*attention_fwd)(float *out, float *att, float *scratch, const float *qkv, int B, int T,
                        int C, int NH);
  /* dqkv (B,T,3C) += gradient (acc 1; = with acc 0); out is forward's output,
   * att what it kept; scratch holds attention_scratch() floats. */
  void (*attention_bwd)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                        const float *out, const float *att, int B, int T, int C, int NH,
                        int acc);
  size_t (*attention_saved)(int B, int T, int C, int NH);
  size_t (*attention_scratch)(int B, int T, int C, int NH);

  /* GELU (tanh form), element-wise over n. */
  void (*gelu_fwd)(float *out, const float *inp, size_t n);
  /* dinp += GELU'(inp) * dout (acc 1; = with acc 0) */
  void (*gelu_bwd)(float *dinp, const float *inp, const float *dout, size_t n, int acc);

  /* out = a + b over n; backward: da += dout, db += dout. */
  void (*residual_fwd)(float *out, const float *a, const float *b, size_t n);
  void (*residual_bwd)(float *da, float *db, const float *dout, size_t n);

  /* Softmax cross-entropy over rows of V logits, ld >= V floats apart. Forward turns
   * logits (N,V) into probabilities IN PLACE and writes losses (N) = -log p[target].
   * Backward turns the probabilities into dlogits = (p - onehot(target)) * dloss IN
   * PLACE. Columns V..ld-1 are not touched. */
  void (*crossentropy_fwd)(float *losses, float *logits, const int32_t *targets, int N, int V,
                           int ld);
  void (*crossentropy_bwd)(float *probs, const int32_t *targets, float dloss, int N, int V,
                           int ld);
  /* Both at once, for a step that goes on to backward: the losses, and the
   * logits turned straight into the dlogits, the bits crossentropy_fwd then
   * crossentropy_bwd give (p rounded, then times dloss), with one pass less
   * over the largest matrix a step streams. */
  void (*crossentropy_fwd_bwd)(float *losses, float *logits, const int32_t *targets, float dloss,
                               int N, int V, int ld);

  /* AdamW (decoupled weight decay) over n elements at step t (1-based). */
  void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                float beta2, float eps, float wd, int t);
  /* adamw over nseg segments of the same buffers at once (a multi-tensor
   * step: on a GPU one launch, not one a tensor): segment k's elements
   * with weight decay wd where seg[k].decay, else 0, each adamw's bits;
   * elements in no segment untouched. seg (host memory, read at the call)
   * in increasing order of offset, not overlapping. Where p16 is not NULL,
   * each stepped element's new value is also stored there, at its index,
   * rounded to bf16 (f32_to_bf16's bits): the parameters' bf16 image kept
   * up to date in the same pass (fsdp.c gathers it). */
  void (*adamw_segs)(float *p, uint16_t *p16, const float *g, float *m, float *v,
                     const kern_seg_t *seg, int nseg, float lr, float beta1, float beta2,
                     float eps, float wd, int t);

  /* fp32 <-> bf16 (uint16 storage), round-to-nearest-even. */
  void (*f32_to_bf16)(uint16_t *out, const float *inp, size_t n);
  void (*bf16_to_f32)(float *out, const uint16_t *inp, size_t n);

  /* sum of x[i]^2, accumulated in double, in a fixed order: the same bytes
   * whatever the thread count. */
  double (*sumsq)(const float *x, size_t n);

  /* ---- bf16 activations (optional) ---------------------------------------
   * Offered (non-NULL, all four) only by a backend whose matrix products
   * round their inputs to bf16 anyway (the CUDA backend in bf16 mode, where
   * it packs its operands): an activation read by products alone (a
   * layernorm's output, GELU's) may then be kept in bf16 (uint16 storage)
   * as the op that makes it rounds it (round-to-nearest-even, f32_to_bf16's
   * bits), and the products take it so: the same operands, no rounding pass,
   * half the bytes. NULL in a backend that computes its products in fp32 (the
   * CPU's), where the caller keeps fp32. Shapes and contracts as the fp32
   * ops above; the products' results may differ from theirs in the order
   * their library sums (a product no longer cut into blocks to fit its
   * packing buffer), not in their operands. The products' inp rows are
   * 16-byte multiples (IC % 8 == 0) and inp 16-byte aligned.
   *
   * Every product of this section takes its weight w (fp32) and w16, w's
   * bf16 image (each element w's, exactly: w is w16 widened), or NULL: with
   * w16 the product reads it as its operand instead of packing w (the same
   * operand, the pass and 6 bytes an element less each time). weights16 1
   * says that pays here: a runtime that gathers a unit's weights in bf16
   * and widens them for the model (fsdp.c) then keeps the gathered image
   * beside the fp32 one for the products (0: FSDP_CUDA_WEIGHTS_PACK, the
   * products pack w; or no bf16 products). A w16 not 16-byte aligned is
   * not read (w is packed); one 16-byte aligned (IC % 8 == 0) is read and w
   * never is, so w's elements need not be written (fsdp.c widens only the
   * tensors read in fp32: gpt.h's gpt_tensor_fp32). */
  int weights16;
  /* 1: a block's qkv product may write qkv in bf16 itself, with its bias's
   * bf16 image (matmul_fwd_bf16_out16's bias16; attention_fwd_bf16 with
   * qkv NULL reads it): no fp32 qkv and no rounding pass (0:
   * FSDP_CUDA_QKV_APART, for comparison; or no bf16 products). */
  int qkv_out16;
  void (*layernorm_fwd_bf16)(uint16_t *out, float *mean, float *rstd, const float *inp,
                             const float *w, const float *b, int N, int C);
  void (*gelu_fwd_bf16)(uint16_t *out, const float *inp, size_t n);
  void (*matmul_fwd_bf16)(float *out, const uint16_t *inp, const float *w, const uint16_t *w16,
                          const float *bias, int N, int IC, int OC, int ldo);
  /* dout in fp32, or in bf16 (dout16, rows ldo bf16 apart, a multiple of
   * 8; dbias then the column sums of its values widened, in the CPU's
   * order): one of the two, the other NULL */
  void (*matmul_bwd_bf16)(float *dinp, float *dw, float *dbias, const float *dout,
                          const uint16_t *dout16, const uint16_t *inp, const float *w,
                          const uint16_t *w16, int N, int IC, int OC, int ldo, int acc);
  /* crossentropy_fwd_bwd with the gradient rounded to bf16 for the LM
   * head's product (the bits its packing gives): row r's V dlogits land in
   * the second half of the row's ld floats, a bf16 matrix with rows 2 ld
   * apart at (uint16_t *)logits + ld (ld a multiple of 8); the row's fp32
   * values, and its padding, are spent. */
  void (*crossentropy_fwd_bwd_bf16)(float *losses, float *logits, const int32_t *targets,
                                    float dloss, int N, int V, int ld);
  /* Attention whose backward reads qkv in bf16, as forward rounded it for
   * its own products (the GPU's tensor-core attention): forward takes qkv
   * (fp32, from the product) and leaves it rounded in qkv16 (B,T,3C), which
   * the caller keeps for backward instead of qkv; and writes out (B,T,C) in
   * bf16 (out16, 4-byte aligned), each element attention_fwd's rounded
   * (nearest even), for its readers, the projection's product (which
   * would round it so) and backward (D = dout . out, as FlashAttention
   * takes it from its bf16 output). Backward gives attention_bwd's values
   * with out = out16 widened, bit for bit. qkv NULL: qkv16 holds qkv in
   * bf16 already (its product wrote it so: matmul_fwd_bf16_out16 with
   * bias16), and forward reads it. Only for the shapes
   * attention_bf16_fits(C, NH) says (1), which depends on the model and the
   * job's modes, not on the device. */
  int (*attention_bf16_fits)(int C, int NH);
  void (*attention_fwd_bf16)(uint16_t *out16, float *att, float *scratch, const float *qkv,
                             uint16_t *qkv16, int B, int T, int C, int NH);
  /* attention_bwd_bf16's dout in fp32, or in bf16 (dout16, as
   * matmul_bwd_dinp16 writes it; 16-byte aligned, as qkv16): one of the
   * two, the other NULL; fp32 dout gives the same values as dout16 = its
   * rounding (the kernels read dout rounded, D = dout . out too) */
  void (*attention_bwd_bf16)(float *dqkv, float *scratch, const float *dout,
                             const uint16_t *dout16, const uint16_t *qkv16, const uint16_t *out16,
                             const float *att, int B, int T, int C, int NH, int acc);
  /* Floats of the scratch the two above take: attention_scratch's, less
   * what a copy of qkv took there (the caller's qkv16 is it). Where
   * attention_bf16_fits. */
  size_t (*attention_scratch_bf16)(int B, int T, int C, int NH);
  /* gelu_bwd (acc 0) for a product's dout (N rows of C, dense): dinp
   * rounded to bf16 into dinp16 (N, C), what matmul_bwd_bf16 would pack
   * from the fp32 dinp, and dbias += its column sums, the bits
   * matmul_bwd_bf16's dbias gives from the fp32 dinp; for matmul_bwd_bf16's
   * dout16 (C a multiple of 8, dinp16 16-byte aligned) with no dbias. The
   * fp32 dinp is never made. Optional beside the four above. */
  void (*gelu_bwd_bf16)(uint16_t *dinp16, float *dbias, const float *inp, const float *dout, int N,
                        int C);
  /* The LM head's logits in bf16, as autocast keeps a product's output:
   * matmul_fwd_bf16 without a bias, each element its fp32 sum rounded once
   * to bf16 (nearest even) into out16 (N rows ldo bf16 apart, ldo a
   * multiple of 8, out16 16-byte aligned); and crossentropy_fwd_bwd_bf16
   * from such logits (rows ld bf16 apart, ld a multiple of 8), the bf16
   * dlogits written over them in place (the row's first V). The same
   * formulas as crossentropy_fwd_bwd_bf16 on the logits widened. Optional
   * beside the four above, both or neither. bias16 (NULL: none; OC bf16,
   * 16-byte aligned): added to each fp32 sum before its rounding, as
   * autocast adds a bf16 layer's bias (where the device cannot, after it:
   * a rounding more), for qkv written in bf16 (attention_fwd_bf16 with qkv
   * NULL). */
  void (*matmul_fwd_bf16_out16)(uint16_t *out16, const uint16_t *inp, const float *w,
                                const uint16_t *w16, const uint16_t *bias16, int N, int IC, int OC,
                                int ldo);
  void (*crossentropy_fwd_bwd_bf16in)(float *losses, uint16_t *logits16, const int32_t *targets,
                                      float dloss, int N, int V, int ld);
  /* The fc product's output in bf16 as under autocast, but rounded before
   * its bias, not after (half of its 4 N C floats a layer, read by GELU, its
   * recompute and its backward): the product writes its sum without the
   * bias, rounded once to bf16 (matmul_fwd_bf16_out16), and GELU adds the
   * bias (fp32, not NULL) as it reads: out = bf16(gelu(inp + bias[c])) over
   * N rows of C (C a multiple of 8, inp and out 16-byte aligned, rows
   * dense); backward as gelu_bwd_bf16 on x = inp + bias[c] (dinp16 and
   * dbias its bits). bias NULL: inp holds the bias already (x = inp
   * widened: matmul_fwd_bf16_gelu's pre16). Optional beside gelu_bwd_bf16
   * and the bf16 logits' product, both or neither. */
  void (*gelu_fwd_bf16in)(uint16_t *out, const uint16_t *inp, const float *bias, int N, int C);
  /* dout in fp32, or in bf16 (dout16, dense, 8-byte aligned: as
   * matmul_bwd_dinp16 writes it): one of the two, the other NULL */
  void (*gelu_bwd_bf16in)(uint16_t *dinp16, float *dbias, const uint16_t *inp, const float *bias,
                          const float *dout, const uint16_t *dout16, int N, int C);
  /* matmul_bwd (acc 0) in the bf16 mode with dinp in bf16, as autocast
   * keeps a product's output: each element of dinp16 (N, IC; IC and OC
   * multiples of 8, 16-byte aligned) its fp32 sum over all OC rounded once
   * (nearest even), for a bf16 reader (attention_bwd_bf16's dout16, which
   * rounds an fp32 dout the same way itself; gelu_bwd_bf16in's, where it
   * is a rounding more, as under autocast): half the bytes written and
   * read. dw as matmul_bwd_bf16's from the same operands (its sum possibly
   * in another order of blocks), dbias its bits; inp in fp32 (inp) or bf16
   * (inp16, IC-wide rows, 16-byte aligned), one of the two; dout fp32
   * (N, OC), dense. Optional. */
  void (*matmul_bwd_dinp16)(uint16_t *dinp16, float *dw, float *dbias, const float *dout,
                            const float *inp, const uint16_t *inp16, const float *w,
                            const uint16_t *w16, int N, int IC, int OC);
  /* A block's projection with the residual added as it is written, in the
   * bf16 mode: out (N, OC, dense) = inp w^T + bias + res (res N x OC,
   * dense; out itself, or a buffer not overlapping it), inp in fp32 (inp,
   * its rows packed as matmul_fwd's) or bf16 (inp16, as matmul_fwd_bf16's),
   * one of the two. matmul_fwd then residual_fwd within a rounding of each
   * element (the three terms may be added in another order), with one pass
   * over out less. Optional. */
  void (*matmul_fwd_res)(float *out, const float *inp, const uint16_t *inp16, const float *w,
                         const uint16_t *w16, const float *bias, const float *res, int N, int IC,
                         int OC);
  /* The fc product with GELU in its write, in the bf16 mode: pre16 (N, OC,
   * dense) = bf16(inp16 w^T + bias16), each element its fp32 sum with the
   * bias's bf16 image added (as matmul_fwd_bf16_out16 with bias16), GELU's
   * input kept for backward (gelu_bwd_bf16in with bias NULL); and out16
   * (N, OC, dense) its GELU rounded to bf16: the device's GELU (tanh form)
   * of the fp32 sum, or (where the device has no such product) gelu_fwd_bf16in
   * of pre16, so within a bf16 step and GELU's approximation of
   * bf16(kern_gelu(pre16 widened)). IC and OC multiples of 8, every pointer
   * 16-byte aligned. Optional. */
  void (*matmul_fwd_bf16_gelu)(uint16_t *out16, uint16_t *pre16, const uint16_t *inp16,
                               const float *w, const uint16_t *w16, const uint16_t *bias16, int N,
                               int IC, int OC);
  /* matmul_bwd_dinp16 for the product whose input inp16 is GELU's output
   * (N, IC) with GELU's backward in its dinp product's write: dinp16 =
   * bf16(gelu'(pre16) x (dout w)), each element's fp32 sum over all OC times
   * the device's GELU derivative at pre16's element (GELU's input,
   * matmul_fwd_bf16_gelu's), rounded once (where the device has no such
   * product: the sum rounded, then gelu_bwd_bf16in's derivative times it, a
   * rounding more); dw and dbias as matmul_bwd_dinp16's. pre16 (N, IC, dense)
   * 16-byte aligned. Optional beside matmul_fwd_bf16_gelu. */
  void (*matmul_bwd_dgelu16)(uint16_t *dinp16, float *dw, float *dbias, const float *dout,
                             const uint16_t *inp16, const float *w, const uint16_t *w16,
                             const uint16_t *pre16, int N, int IC, int OC);
  /* adamw_segs on the gradient scaled by gscale as each element is read
   * (g[i] * gscale, vec_scale's bits: the step global-norm clipping would
   * take after vec_scale(g, gscale)), g itself left as it was: the clipping
   * without its pass over the gradient. Optional. */
  void (*adamw_segs_scaled)(float *p, uint16_t *p16, const float *g, float gscale, float *m,
                            float *v, const kern_seg_t *seg, int nseg, float lr, float beta1,
                            float beta2, float eps, float wd, int t);
  /* bf16_to_f32 on nseg segments of inp at once (on a GPU one launch for
   * the small ones, not one each): each element of segment k (offset,
   * numel; decay unused) widened into out at the same index, bf16_to_f32's
   * bits; elements in no segment untouched. seg (host memory, read at the
   * call) in order of offset, not overlapping. For a runtime that widens
   * only the tensors its model reads in fp32 (fsdp.c). Optional. */
  void (*bf16_to_f32_segs)(float *out, const uint16_t *inp, const kern_seg_t *seg, int nseg);
  /* encoder_fwd from wte's and wpe's bf16 images, each element widened as
   * it is read: encoder_fwd's bits on the widened tensors. Optional; for a
   * model whose runtime keeps the images (weights16). */
  void (*encoder_fwd16)(float *out, const int32_t *tok, const uint16_t *wte16,
                        const uint16_t *wpe16, int B, int T, int C);
  /* attention_bwd_bf16 (acc 0) with the gradients written in bf16, dqkv16
   * (B, T, 3C) 16-byte aligned, for the qkv product's backward, which
   * takes them so (matmul_bwd_bf16's dout16) where it would round them:
   * each element attention_bwd_bf16's fp32 one rounded (f32_to_bf16's
   * bits) where the device's kernels run it, cuDNN's bf16 where it does
   * (FSDP_CUDA_ATTN_CUDNN). No fp32 gradients written, and none rounded
   * by the product. Optional beside attention_bwd_bf16. */
  void (*attention_bwd_dqkv16)(uint16_t *dqkv16, float *scratch, const float *dout,
                               const uint16_t *dout16, const uint16_t *qkv16,
                               const uint16_t *out16, const float *att, int B, int T, int C,
                               int NH);
  /* layernorm_bwd (dinp += the norm's gradient: the residual's gradient,
   * whole), with that dinp rounded to bf16 into dinp16 (N, C: C a multiple
   * of 8, dense, dinp16 and dinp 16-byte aligned; f32_to_bf16's bits) and
   * its column sums' runs into dsums (KERN_COLSUM_ROWS rows each, kern_math.h,
   * summed from zero in row order: run j's C sums at dsums + j C), for the
   * backward of the product that wrote the residual (matmul_bwd16): what
   * matmul_bwd_dinp16 would pack from the fp32 dinp and sum into its dbias,
   * made while the norm's backward holds the rows. Optional, with
   * matmul_bwd16. */
  void (*layernorm_bwd16)(float *dinp, uint16_t *dinp16, float *dsums, float *dw, float *db,
                          const float *dout, const float *inp, const float *w, const float *mean,
                          const float *rstd, int N, int C);
  /* matmul_bwd_dinp16 (pre16 NULL) or matmul_bwd_dgelu16 (pre16) with dout
   * in bf16 (dout16, N x OC, dense, 16-byte aligned) and dbias (or NULL)
   * += the column sums whose runs dsums holds (layernorm_bwd16's): the bits
   * those ops' dbias has from the fp32 dout that dout16 rounds; dinp16 too,
   * and dw as theirs from the same operands (its sum possibly in another
   * order of blocks). */
  void (*matmul_bwd16)(uint16_t *dinp16, float *dw, float *dbias, const uint16_t *dout16,
                       const float *dsums, const uint16_t *inp16, const float *w,
                       const uint16_t *w16, const uint16_t *pre16, int N, int IC, int OC);
} kern_backend_t;

/* The x86-64 levels the CPU kernels are built for, numbered as the psABI's
 * microarchitecture levels (x86-64-vN). Each level is a table of its own,
 * with the same results bit for bit (kernels/cpu/cpu.h says how); they
 * differ only in speed. */
typedef enum kern_cpu_isa {
  KERN_CPU_ISA_AUTO = 0,    /* the best level this processor runs */
  KERN_CPU_ISA_GENERIC = 1, /* baseline x86-64 (SSE2): any x86-64 processor */
  KERN_CPU_ISA_AVX2 = 3,    /* x86-64-v3: AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE */
  KERN_CPU_ISA_AVX512 = 4   /* x86-64-v4: AVX-512 F, BW, CD, DQ, VL */
} kern_cpu_isa_t;

/* The CPU backend's tunables; the caller reads them from its own
 * configuration (the daemon: FSDP_THREADS, FSDP_ATTN_BLOCK, FSDP_CPU_ISA). */
typedef struct kern_cpu_opts {
  int threads;        /* OpenMP threads; <= 0: every online core */
  int attn_block;     /* attention: query rows per work item; <= 0: 64 */
  kern_cpu_isa_t isa; /* AUTO: the best this processor has; a level it lacks
                       * is lowered to the best it has (kern_cpu_isa tells) */
} kern_cpu_opts_t;

/* The CPU backend (OpenMP + oneDNN sgemm), configured by o (NULL: the
 * defaults). Its settings are process-wide (OpenMP's thread count is), so the
 * last call wins; call it once at start. */
const kern_backend_t *kern_cpu_init(const kern_cpu_opts_t *o);
/* The CPU backend as last configured (the defaults when never). */
const kern_backend_t *kern_cpu(void);

/* The level kern_cpu() runs at. */
kern_cpu_isa_t kern_cpu_isa(void);
/* The best level this processor (and its OS, which must save the wide
 * registers) supports. */
kern_cpu_isa_t kern_cpu_isa_best(void);
/* The table of one level, NULL when this processor lacks it (AUTO: the best).
 * Tables share kern_cpu_init's settings; for tests and benchmarks that
 * compare levels. */
const kern_backend_t *kern_cpu_isa_table(kern_cpu_isa_t isa);
/* "auto", "generic", "avx2", "avx512"; NULL for a value not in the enum. */
const char *kern_cpu_isa_name(kern_cpu_isa_t isa);

#endif

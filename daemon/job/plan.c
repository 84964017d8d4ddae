/* plan: memory prediction and the fit check (see plan.h).
 *
 * The sharded part mirrors fsdp.c's schedule; each rule below names the
 * runtime behaviour it counts, and test_plan.c holds every category equal to
 * what ranks really allocate, so a change to one without the other fails. */
#include "daemon/job/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/comm/ring_size.h"
#include "daemon/common/err.h"
#include "daemon/common/hostmem.h"
#include "daemon/common/param.h"
#include "daemon/job/precision.h"
#include "daemon/job/shard.h"
#include "daemon/comm/nccl_size.h"
#include "kernels/cpu/size.h"
#include "kernels/cuda/size.h"

#define MIB(x) ((double)(x) / 1048576.0)

/* ---- the device ------------------------------------------------------------- */

/* What a kind of device adds to the plan: its kernels' attention scratch and
 * its collectives' buffers. They come from the header-only formulas the
 * backends size themselves with (kernels/cpu/size.h, daemon/comm/ring_size.h),
 * read with the tunables daemon/train/device.c hands the backends, so the plan
 * links no backend and still counts their bytes. A second kind of device
 * (CUDA kernels, NCCL) is one more profile, picked as device_for picks. */
typedef struct plan_device {
  size_t (*attention_saved)(int B, int T, int C, int NH);   /* floats a layer keeps */
  /* floats; bf16: the job's products; qkv16: gpt.c keeps qkv in bf16 (GPT_ACT_BF16_QKV) */
  size_t (*attention_scratch)(int B, int T, int C, int NH, int bf16, int qkv16);
  size_t (*comm_bytes)(int size);                           /* one communicator of size ranks */
  size_t (*reserved)(void); /* what the kernels hold from their init on (workspace) */
  /* 1 when the kernels offer bf16 activations to a job of this precision
   * (kern.h; gpt.c then keeps them where the model's rows suit) */
  int (*acts_bf16)(int bf16);
  /* 1 when, with those, its attention keeps qkv in bf16 for this model */
  int (*qkv_bf16)(int bf16, int C, int NH);
  /* 1 when, with those, its GELU reads the fc product's output in bf16
   * (kern.h's gelu_fwd_bf16in) */
  int (*fch_bf16)(int bf16);
  /* 1 when, with those, its products read the bf16 gather of a unit's
   * weights, which the runtime then keeps beside the widened unit (kern.h's
   * weights16) */
  int (*weights16)(int bf16);
} plan_device_t;

static size_t plan_cpu_attention_scratch(int B, int T, int C, int NH, int bf16, int qkv16) {
  (void)C, (void)bf16, (void)qkv16;
  return kern_cpu_size_attention_scratch(B, T, NH, (int)param_attn_block());
}

static size_t plan_cpu_attention_saved(int B, int T, int C, int NH) {
  (void)C;
  return kern_cpu_size_attention_saved(B, T, NH);
}

static size_t plan_cpu_reserved(void) { return 0; }

/* fp32 products: no bf16 activations, fc output or weights */
static int plan_cpu_no_bf16(int bf16) { return (void)bf16, 0; }
static int plan_cpu_qkv_bf16(int bf16, int C, int NH) { return (void)bf16, (void)C, (void)NH, 0; }

static const plan_device_t plan_cpu = {plan_cpu_attention_saved, plan_cpu_attention_scratch,
                                       comm_ring_size_bytes, plan_cpu_reserved, plan_cpu_no_bf16,
                                       plan_cpu_qkv_bf16, plan_cpu_no_bf16, plan_cpu_no_bf16};

/* GPU ranks: the CUDA kernels' attention (fused or not, as the device picks
 * with FSDP_CUDA_ATTN_GEMM), scratch and cuBLASLt workspace
 * (kernels/cuda/size.h), NCCL's buffers (an estimate: nccl_size.h). */
static size_t plan_cuda_attention_saved(int B, int T, int C, int NH) {
  return kern_cuda_size_attention_saved(B, T, C, NH, param_cuda_attn_gemm() != 0);
}

static size_t plan_cuda_attention_scratch(int B, int T, int C, int NH, int bf16, int qkv16) {
  /* bf16 jobs' fused attention runs on tensor cores unless FSDP_CUDA_ATTN_FP32, as device.c asks */
  return kern_cuda_size_attention_scratch(B, T, C, NH, param_cuda_attn_gemm() != 0,
                                          bf16 && param_cuda_attn_fp32() == 0, qkv16,
                                          param_cuda_attn_cudnn() != 0);
}

/* a bf16 job's products pack their operands, unless FSDP_CUDA_GEMM_FAST16BF,
 * and the table offers bf16 activations, unless FSDP_CUDA_ACTS_FP32
 * (device.c's kern_cuda_opts_t; backend.cu's tables) */
static int plan_cuda_acts_bf16(int bf16) {
  return bf16 && param_cuda_gemm_fast16bf() == 0 && param_cuda_acts_fp32() == 0;
}

/* the tensor-core attention (bf16 jobs unless FSDP_CUDA_ATTN_FP32) at the
 * head sizes size.h names (attention.cu's kern_cuda_attention_bf16_fits) */
static int plan_cuda_qkv_bf16(int bf16, int C, int NH) {
  return kern_cuda_size_attn_tc_qkv16(C, NH, param_cuda_attn_gemm() != 0,
                                      bf16 && param_cuda_attn_fp32() == 0);
}

/* backend.cu's bf16 table offers the bf16 GELU ops with the bf16
 * activations */
static int plan_cuda_fch_bf16(int bf16) { return plan_cuda_acts_bf16(bf16); }

/* and sets weights16 there, unless FSDP_CUDA_WEIGHTS_PACK (device.c) */
static int plan_cuda_weights16(int bf16) {
  return plan_cuda_acts_bf16(bf16) && param_cuda_weights_pack() == 0;
}

static const plan_device_t plan_cuda = {plan_cuda_attention_saved, plan_cuda_attention_scratch,
                                        comm_nccl_size_bytes, kern_cuda_size_reserved,
                                        plan_cuda_acts_bf16, plan_cuda_qkv_bf16,
                                        plan_cuda_fch_bf16, plan_cuda_weights16};

static const plan_device_t *plan_device(const config_t *c) {
  return !strcmp(c->device, "cuda") ? &plan_cuda : &plan_cpu; /* as device_open picks */
}

/* ---- the training loop ------------------------------------------------------ */

/* Activations and the workspace of the training loop and the sample: the
 * model's activations for (B, T), its attention scratch, the loop's input and
 * target batches (a rank's own rows of the global batch: batch x seq_len),
 * and after training the sample's forward passes (B = 1, T growing to the
 * context) with its token buffers and one row of logits on the host. gpt.c
 * reallocates activations only when a shape needs more, so each is the larger
 * of training and sampling. */
static void plan_loop(const config_t *c, plan_t *p) {
  const plan_device_t *dev = plan_device(c);
  const gpt_config_t *g = &c->gpt;
  const size_t f = sizeof(float);
  const int bf16 = strcmp(c->precision, "fp32") != 0; /* products on bf16 tensor cores */
  /* the products' inputs, and qkv, in bf16 as gpt.c keeps them (gpt_acts_bf16, gpt_qkv_bf16) */
  const int a16 = dev->acts_bf16(bf16) && gpt_config_acts_bf16_fits(g);
  const int q16 = a16 && dev->qkv_bf16(bf16, g->channels, g->heads);
  const int f16 = a16 && dev->fch_bf16(bf16); /* gpt_fch_bf16 */
  const int ck = (c->activation_checkpointing ? GPT_ACT_CHECKPOINT : 0) |
                 gpt_act_recompute_flags(config_recompute(c)) | (a16 ? GPT_ACT_BF16 : 0) |
                 (q16 ? GPT_ACT_BF16_QKV : 0) | (f16 ? GPT_ACT_BF16_FCH : 0);
  size_t scratch =
      dev->attention_scratch(c->batch, c->seq_len, g->channels, g->heads, bf16, q16) * f;
  const int lrows = gpt_config_logits_rows(g, config_logits_chunk_mib(c));
  size_t acts = gpt_config_act_bytes(g, c->batch, c->seq_len, ck,
                                     dev->attention_saved(c->batch, c->seq_len, g->channels, g->heads),
                                     lrows);
  const size_t batches = 2 * (size_t)c->batch * (size_t)c->seq_len * sizeof(int32_t); /* a rank's rows */
  size_t sample = 0;
  if (c->sample_tokens > 0) {
    const size_t np = g->vocab == 256 && c->sample_prompt[0] ? strlen(c->sample_prompt) : 1;
    const size_t n = np + (size_t)c->sample_tokens;
    const int T = n - 1 < (size_t)g->context ? (int)(n - 1) : g->context;
    size_t s_scratch = dev->attention_scratch(1, T, g->channels, g->heads, bf16, q16) * f;
    size_t s_acts = gpt_config_act_bytes(g, 1, T, ck, dev->attention_saved(1, T, g->channels, g->heads),
                                         lrows);
    if (s_acts > acts) acts = s_acts;
    if (s_scratch > scratch) scratch = s_scratch;
    sample = (size_t)c->sample_tokens * sizeof(int32_t) + n * sizeof(int32_t) +
             (size_t)g->vocab * f;
  }
  p->bytes[MEM_ACTS] = acts;
  p->bytes[MEM_WORKSPACE] = dev->reserved() + scratch + batches + sample;
}

/* ---- the sharded runtime ---------------------------------------------------- */

/* The FSDP units in the order the model asks for their parameters (gpt.c):
 * forward unit 0, the blocks, unit 0 again (final norm and logits); backward
 * unit 0, then the blocks last to first. Consecutive model units of one FSDP
 * unit (min_params) are one entry. Returns the count. */
static int plan_order(const shard_layout_t *l, int L, int bwd, int *seq) {
  int n = 0;
  for (int i = 0; i < L + 2 - bwd; i++) {
    int mu = bwd ? (i ? L + 1 - i : 0) : (i <= L ? i : 0);
    int k = l->unit_of[mu];
    if (!n || seq[n - 1] != k) seq[n++] = k;
  }
  return n;
}

/* Elements of unit k's gathered (padded) buffer. */
static size_t plan_padded(const shard_layout_t *l, int k) {
  return l->units[k].shard_numel * (size_t)l->S;
}

/* Peak bytes of gathered parameters. A gathered unit is fp32 (4 bytes per
 * padded element), plus, while its bf16 gather is in flight, the bf16 buffer
 * it lands in (x = 2 bytes; 0 where it is the image's slice: fsdp.c's
 * alias16), which stays while the unit is held where the
 * products read it (k16 = 2 bytes: fsdp.c's keep16, gpt_weights16). The
 * unit in use is held while the next one's gather lands (prefetch).
 * FULL_SHARD and HYBRID_SHARD free a unit after use, so that pair is all
 * they hold. Strategies that keep units hold every unit gathered so far in
 * forward; backward only frees them, each after its last use (fsdp.c), so
 * it adds nothing. */
static size_t plan_gathered(const shard_layout_t *l, int L, int keeps, size_t x, size_t k16) {
  const size_t h = 4 + k16; /* bytes per element of a unit held */
  int *seq = malloc(sizeof *seq * (size_t)(L + 2));
  if (!seq) return 0;
#define MAX(a, b) ((a) > (b) ? (a) : (b))
  size_t best = 0;
  for (int bwd = 0; bwd < 2; bwd++) {
    const int n = plan_order(l, L, bwd, seq);
    size_t held = 0; /* fp32 units held while seq[i] lands */
    for (int i = 0; i < n; i++) {
      if (keeps && (bwd || (i == n - 1 && n > 1))) break; /* unit 0 again, backward: kept */
      held = keeps && !bwd ? held : i ? h * plan_padded(l, seq[i - 1]) : 0;
      best = MAX(best, held + (4 + x) * plan_padded(l, seq[i]));
      if (keeps && !bwd) held += h * plan_padded(l, seq[i]);
    }
  }
#undef MAX
  free(seq);
  return best;
}

/* Peak bytes of unsharded unit gradients (fp32, padded). Unit 0's lives
 * through the whole backward (the logits' gradient starts it, the embeddings'
 * ends it; with the logits in several chunks it starts at the forward's LM
 * head, when nothing else is held: the same peak). A block unit's gradient is handed to its reduction when complete
 * and freed when that completes, which is when the next unit's is issued: so
 * it is held beside the next unit's and unit 0's. Under bf16-true (w = 2) the
 * reduction takes a bf16 copy (the fp32 one is freed once copied). Keeping
 * unsharded gradients across micro-batches holds every unit's. */
static size_t plan_unit_grads(const shard_layout_t *l, int L, int keep_all, size_t w) {
  const int u0 = l->unit_of[0];
  const size_t p0 = plan_padded(l, u0), pend = w ? w : 4; /* bytes per element in reduction */
  size_t all = 0, best = (4 + w) * p0, first = p0, prev = 0; /* prev: the pending unit's bytes */
  for (int k = 0; k < l->num_units; k++) all += plan_padded(l, k);
  for (int mu = L, last = -1; mu >= 1; mu--) {
    const int k = l->unit_of[mu];
    if (k == u0 || k == last) continue;
    const size_t pk = plan_padded(l, k);
    if (last < 0) first = pk;
    /* beside the pending one's while backward fills it, then its copy for the wire */
    const size_t now = 4 * p0 + (prev + 4 * pk > (4 + w) * pk ? prev + 4 * pk : (4 + w) * pk);
    if (now > best) best = now;
    prev = pend * pk;
    last = k;
  }
  return keep_all ? 4 * all + w * first : best;
}

/* Every rank, one device included, runs the runtime; on one rank under fp32
 * it gathers and reduces nothing (fsdp.c aliases units to the shard). */
static int plan_runtime(const config_t *c, int world, plan_t *p) {
  shard_mesh_t m;
  precision_t prec;
  shard_layout_t *l;
  int rc;
  if ((rc = shard_mesh_resolve(c->strategy, c->mesh, world, &m, NULL, 0)) ||
      (rc = precision_parse(c->precision, &prec)) ||
      (rc = shard_layout_create(&l, &c->gpt, m.shards, (size_t)c->min_params)))
    return rc;
  const int L = c->gpt.layers, true16 = prec == PRECISION_BF16_TRUE;
  /* bf16-mixed keeps the master's bf16 image (fsdp.c's image16; unless
   * FSDP_GATHER_ROUND); on one shard a unit's bf16 gather is its slice of
   * it (alias16): nothing lands */
  const int image16 = prec == PRECISION_BF16_MIXED && param_gather_round() == 0;
  const int alias16 = image16 && m.shards == 1;
  /* bf16 gathers land in a bf16 buffer */
  const size_t x = prec != PRECISION_FP32 && !alias16 ? 2 : 0;
  const plan_device_t *dev = plan_device(c);
  /* kept for the products (gpt_weights16: bf16 activations, as plan_loop's a16) */
  const size_t k16 = x && dev->weights16(1) && gpt_config_acts_bf16_fits(&c->gpt) ? 2 : 0;
  const size_t e = true16 ? 2 : 4;            /* bytes per element of the shard's state */
  size_t largest = 0;
  for (int k = 0; k < l->num_units; k++)
    if (l->units[k].shard_numel > largest) largest = l->units[k].shard_numel;
  /* the shard: master weights, gradient, AdamW m and v (fp32, or bf16 under
   * bf16-true), in host_offload when offloaded */
  const size_t sh = l->shard_total * e;
  /* an asynchronous checkpoint's host snapshot: parameters, m and v */
  if (c->checkpoint_dir[0] && c->checkpoint_every && c->checkpoint_async)
    p->bytes[MEM_SNAPSHOT] = 3 * sh;
  p->bytes[c->offload ? MEM_OFFLOAD : MEM_PARAMS] += sh;
  if (image16) p->bytes[MEM_PARAMS] += l->shard_total * 2;
  p->bytes[c->offload ? MEM_OFFLOAD : MEM_GRADS] += sh;
  p->bytes[c->offload ? MEM_OFFLOAD : MEM_OPTIM] += 2 * sh;
  /* one shard under fp32: units are the shard itself; one rank with fp32
   * gradients: backward writes the gradient shard itself */
  const int alias_params = m.shards == 1 && prec == PRECISION_FP32;
  const int alias_grads = m.shards == 1 && m.replicas == 1 && !true16;
  p->bytes[MEM_PARAMS_GATHERED] =
      alias_params ? 0 : plan_gathered(l, L, shard_strategy_keeps_params(m.strategy), x, k16);
  /* both accumulation modes, for the report; the job's own counts */
  const size_t w = true16 ? 2 : 0;
  const size_t gsh = c->offload ? 0 : sh;
  p->grads_reduce_each = gsh + (alias_grads ? 0 : plan_unit_grads(l, L, 0, w));
  p->grads_keep_unsharded = gsh + (alias_grads ? 0 : plan_unit_grads(l, L, 1, w));
  p->bytes[MEM_GRADS] = c->keep_unsharded_grads && c->grad_accum > 1 ? p->grads_keep_unsharded
                                                                       : p->grads_reduce_each;
  /* communication: each communicator's buffers (world, which is also the
   * shard group when R = 1 and the replica group when S = 1; a HYBRID
   * mesh's shard and replica groups besides: comm_boot_connect) and the
   * reduce-scatter landing when S > 1 (reduce dtype; a bf16-mixed gather
   * sends from the master's bf16 image, counted in params above) */
  size_t comm = m.shards > 1 ? e * largest : 0;
  if (world > 1) comm += dev->comm_bytes(world);
  if (m.shards > 1 && m.replicas > 1)
    comm += dev->comm_bytes(m.shards) + dev->comm_bytes(m.replicas);
  p->bytes[MEM_COMM] = comm;
  plan_loop(c, p);
  /* held for the runtime's life, so on top of the loop's: the host stage
   * weights pass through (fsdp.c), and under bf16-true the fp32 chunks of
   * the gradient shard (fsdp.c) and of AdamW's state (adamw.c) */
  p->bytes[MEM_WORKSPACE] += PLAN_FSDP_CHUNK * sizeof(float);
  if (true16) p->bytes[MEM_WORKSPACE] += 2 * PLAN_FSDP_CHUNK * sizeof(float) + 4 * PLAN_ADAMW_CHUNK * sizeof(float);
  shard_layout_destroy(l);
  return FSDP_OK;
}

int plan_job(const config_t *c, int world, plan_t *p) {
  memset(p, 0, sizeof *p);
  p->world = world;
  int rc = plan_runtime(c, world, p);
  for (int k = 0; k < MEM__COUNT; k++) p->total += p->bytes[k];
  p->host_apart = plan_device(c) == &plan_cuda;
  p->device = p->total - plan_host_bytes(p);
  return rc;
}

size_t plan_host_bytes(const plan_t *p) {
  return p->host_apart ? p->bytes[MEM_SNAPSHOT] + p->bytes[MEM_OFFLOAD] : 0;
}

/* The snapshot's bytes the device holds: a CPU device's, none of a GPU's. */
static size_t plan_snapshot_on_device(const plan_t *p) {
  return p->host_apart ? 0 : p->bytes[MEM_SNAPSHOT];
}

int plan_rank_snapshots(const shard_mesh_t *m, int rank) {
  return shard_place(m, rank).replica == 0;
}

void plan_for_rank(plan_t *p, const shard_mesh_t *m, int rank) {
  if (plan_rank_snapshots(m, rank)) return;
  p->total -= p->bytes[MEM_SNAPSHOT];
  p->device -= plan_snapshot_on_device(p);
  p->bytes[MEM_SNAPSHOT] = 0;
}

size_t plan_host_available(void) { return (size_t)hostmem_available(); }

/* ---- the fit check ---------------------------------------------------------- */

/* What the device holds of c changed by one knob, or 0 when that plan fails. */
static size_t plan_total_of(const config_t *c, int world) {
  plan_t q;
  return plan_job(c, world, &q) ? 0 : q.device;
}

/* The first single change that fits, as advice; 0 when none does. */
static int plan_advice(const plan_t *p, const config_t *c, size_t limit, char *out, size_t len) {
  config_t k = *c;
  size_t t;
  /* the figure limits compare: a GPU's own, its host memory apart */
  const char *on = p->host_apart ? " on its GPU" : "";
  if (config_recompute(c) < 2) { /* the cheapest: a GELU and two norms more a block in backward */
    k.recompute = 2;
    if ((t = plan_total_of(&k, p->world)) && t <= limit)
      return snprintf(out, len, "set recompute = 2 (the plan is then %.0f MiB%s)", MIB(t), on), 1;
    k = *c;
  }
  if (config_logits_chunk_mib(c) > GPT_LOGITS_CHUNK_MIB) { /* a GPU's larger logits chunk */
    k.logits_chunk_mib = GPT_LOGITS_CHUNK_MIB;
    if ((t = plan_total_of(&k, p->world)) && t <= limit)
      return snprintf(out, len, "set logits_chunk_mib = %d (the plan is then %.0f MiB%s)",
                      GPT_LOGITS_CHUNK_MIB, MIB(t), on), 1;
    k = *c;
  }
  if (!c->activation_checkpointing) {
    k.activation_checkpointing = 1;
    if ((t = plan_total_of(&k, p->world)) && t <= limit)
      return snprintf(out, len, "set activation_checkpointing = 1 (the plan is then %.0f MiB%s)",
                      MIB(t), on), 1;
    k = *c;
  }
  if (c->keep_unsharded_grads && c->grad_accum > 1) {
    k.keep_unsharded_grads = 0;
    if ((t = plan_total_of(&k, p->world)) && t <= limit)
      return snprintf(out, len, "set keep_unsharded_grads = 0 to reduce every micro-batch into "
                      "the gradient shard (the plan is then %.0f MiB%s)", MIB(t), on), 1;
    k = *c;
  }
  shard_strategy_t st;
  if (!shard_strategy_parse(c->strategy, &st) && shard_strategy_keeps_params(st)) {
    const char *to = st == SHARD_HYBRID_SHARD_ZERO2 ? "HYBRID_SHARD" : "FULL_SHARD";
    snprintf(k.strategy, sizeof k.strategy, "%s", to);
    if (st == SHARD_NO_SHARD) k.mesh[0] = 0; /* "N" means Nx1 only under NO_SHARD */
    if ((t = plan_total_of(&k, p->world)) && t <= limit)
      return snprintf(out, len, "set strategy = %s, which frees each unit's parameters after "
                      "use (the plan is then %.0f MiB%s)", to, MIB(t), on), 1;
    k = *c;
  }
  /* fewer sequences a micro-batch, as many a step: the largest divisor of
   * batch that fits, grad_accum raised by as much */
  for (int b = c->batch - 1; b >= 1; b--) {
    if (c->batch % b || (long)c->grad_accum * (c->batch / b) > 1 << 20) continue;
    k.batch = b, k.grad_accum = c->grad_accum * (c->batch / b);
    if ((t = plan_total_of(&k, p->world)) && t <= limit)
      return snprintf(out, len, "set batch = %d and grad_accum = %d, the same tokens a step (the "
                      "plan is then %.0f MiB%s)", b, k.grad_accum, MIB(t), on), 1;
  }
  k = *c;
  /* more ranks in one shard group: the smallest power of two that fits */
  k.mesh[0] = 0;
  snprintf(k.strategy, sizeof k.strategy, "FULL_SHARD");
  for (int w = p->world * 2; w <= 4096; w *= 2)
    if ((t = plan_total_of(&k, w)) && t <= limit)
      return snprintf(out, len, "shard the model over %d ranks (FULL_SHARD, %.0f MiB per rank%s)",
                      w, MIB(t), on), 1;
  return 0;
}

int plan_fit_recompute(config_t *c, int world, plan_t *p, size_t limit) {
  if (!limit || p->device <= limit || c->recompute >= 0) return 0;
  /* the least level that fits with the snapshot; where none does, the
   * least that fits without the part of it the device holds
   * (plan_fit_snapshot then drops the snapshot: a level that fits only so
   * would recompute for nothing), else 2 (plan_check then says what fits).
   * Today only a GPU's default is below 2, and its snapshot is host memory:
   * there none does and it is 2; a device whose snapshot is its own memory
   * would take the middle way. */
  plan_t q[3];
  const int from = config_recompute(c);
  for (int level = from; level <= 2; level++) {
    config_t k = *c;
    k.recompute = level;
    if (level == from) q[level] = *p;
    else if (plan_job(&k, world, &q[level])) return 0;
    if (level > from && q[level].device <= limit) return c->recompute = level, *p = q[level], 1;
  }
  int level = from;
  while (level < 2 && q[level].device - plan_snapshot_on_device(&q[level]) > limit) level++;
  if (level == from) return 0;
  c->recompute = level;
  *p = q[level];
  return 1;
}

int plan_fit_snapshot(config_t *c, int world, plan_t *p, size_t limit) {
  const size_t snap = plan_snapshot_on_device(p); /* a GPU's is in host memory */
  if (!limit || p->device <= limit || !snap || p->device - snap > limit) return 0;
  c->checkpoint_async = 0; /* fits without the snapshot: checkpoints are written in place */
  return plan_job(c, world, p) ? 0 : 1;
}

int plan_fit_host(config_t *c, int world, plan_t *p, size_t host_limit) {
  const size_t host = plan_host_bytes(p), snap = p->host_apart ? p->bytes[MEM_SNAPSHOT] : 0;
  if (!host_limit || host <= host_limit || !snap || host - snap > host_limit) return 0;
  c->checkpoint_async = 0;
  return plan_job(c, world, p) ? 0 : 1;
}

int plan_check(const plan_t *p, const config_t *c, size_t limit) {
  return plan_fits(p, c, limit, "memory_limit_mib, or the rank's device memory: a GPU's own, a CPU "
                   "rank's share of the host's available memory");
}

int plan_fits(const plan_t *p, const config_t *c, size_t limit, const char *what) {
  if (!limit || p->device <= limit) return FSDP_OK;
  int top = 0; /* of what the device holds */
  for (int k = 1; k < MEM__COUNT; k++)
    if (p->bytes[k] > p->bytes[top] && (!p->host_apart || (k != MEM_SNAPSHOT && k != MEM_OFFLOAD)))
      top = k;
  char advice[512];
  if (!plan_advice(p, c, limit, advice, sizeof advice)) {
    /* none of plan_advice's single changes fits: where the bytes are */
    const int n = snprintf(advice, sizeof advice, "no single change fits (recompute, "
                           "activation_checkpointing, strategy, a smaller batch with more "
                           "grad_accum, up to 4096 ranks); ");
    char *a = advice + n;
    const size_t alen = sizeof advice - (size_t)n;
    if (top == MEM_ACTS)
      snprintf(a, alen, "activations grow with seq_len (now %d) and batch (now %d): shorten "
               "seq_len, or give the rank more memory", c->seq_len, c->batch);
    else if (top == MEM_WORKSPACE) /* the kernels' fixed buffers and their scratch */
      snprintf(a, alen, "the workspace is the kernels' own buffers and their "
               "scratch, which grows with batch (now %d) and seq_len (now %d), with seq_len "
               "squared where the heads are too narrow or too wide for the fused attention; lower "
               "them, or give the rank more memory", c->batch, c->seq_len);
    else
      snprintf(a, alen, "parameters, gradients and AdamW state take %s per "
               "parameter of the shard: choose a smaller model, or shard it over more ranks",
               !strcmp(c->precision, "bf16-true") ? "8 bytes"
               : !strcmp(c->precision, "bf16-mixed") && !param_gather_round()
                   ? "18 bytes (16, and the weights' bf16 image: FSDP_GATHER_ROUND=1 drops it "
                     "on a sharded job)"
                   : "16 bytes");
  }
  char host[96] = "";
  if (plan_host_bytes(p))
    snprintf(host, sizeof host, " on its GPU (and %.0f MiB of host memory)", MIB(plan_host_bytes(p)));
  return err_set(FSDP_ENOMEM, "memory: the job needs %.0f MiB per rank%s but %.0f MiB is available "
                 "(%s); %s takes the most (%.0f MiB); %s", MIB(p->device), host, MIB(limit), what,
                 mem_cat_name((mem_cat_t)top), MIB(p->bytes[top]), advice);
}

void plan_print(const plan_t *p, const config_t *c, FILE *out) {
  fprintf(out, "plan (MiB%s):", p->world > 1 ? " per rank" : "");
  for (int k = 0; k < MEM__COUNT; k++)
    if (p->bytes[k]) fprintf(out, " %s=%.1f", mem_cat_name((mem_cat_t)k), MIB(p->bytes[k]));
  if (plan_host_bytes(p)) /* a GPU's: what it holds, and what host memory holds */
    fprintf(out, " total=%.1f (gpu=%.1f host=%.1f)\n", MIB(p->total), MIB(p->device),
            MIB(plan_host_bytes(p)));
  else
    fprintf(out, " total=%.1f\n", MIB(p->total));
  if (c->grad_accum > 1)
    fprintf(out, "plan: gradient accumulation over %d micro-batches: grads %.1f MiB reducing each "
            "micro-batch%s, %.1f MiB keeping unsharded gradients to the last%s\n", c->grad_accum,
            MIB(p->grads_reduce_each), c->keep_unsharded_grads ? "" : " (this job)",
            MIB(p->grads_keep_unsharded), c->keep_unsharded_grads ? " (this job)" : "");
}

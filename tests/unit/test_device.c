/* Tests of the kernel table's memory section and of the code above it, on a
 * device the host cannot touch. The guarded backend is the CPU backend with
 * device memory of its own: pages mapped PROT_NONE except while one of the
 * table's functions runs. So any read or write of a device buffer from
 * outside the table (gpt.c, fsdp.c, adamw.c, sample.c, the accounting
 * allocator) faults, and the test crashes, while everything that goes
 * through the table computes exactly what the CPU backend computes: the same
 * losses and weights bit for bit, the same memory per category.
 *
 * One rank only: the ring (the CPU devices' collectives) reads host memory
 * by design, and a GPU's collectives are NCCL's. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/mem.h"
#include "daemon/common/rng.h"
#include "daemon/train/adamw.h"
#include "daemon/train/ckpt_rank.h"
#include "daemon/train/fsdp.h"
#include "daemon/train/gpt.h"
#include "daemon/train/sample.h"
#include "tests/unit/testutil.h"

/* ---- the guarded device ---------------------------------------------------- */

enum { GUARD_MAX = 512 };
static struct {
  void *p;
  size_t len;
} guard_regions[GUARD_MAX];
static int guard_n, guard_allocs;
static const kern_backend_t *cpu;

static void guard_protect(int prot) {
  for (int i = 0; i < guard_n; i++)
    cr_assert_eq(mprotect(guard_regions[i].p, guard_regions[i].len, prot), 0);
}
static void guard_open(void) { guard_protect(PROT_READ | PROT_WRITE); }
static void guard_close(void) { guard_protect(PROT_NONE); }

static void *guard_alloc(size_t bytes) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = (bytes + pg - 1) / pg * pg;
  if (guard_n == GUARD_MAX) return NULL;
  void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return NULL;
  guard_regions[guard_n].p = p;
  guard_regions[guard_n++].len = len;
  guard_allocs++;
  return p;
}

static void guard_free(void *p) {
  for (int i = 0; i < guard_n; i++)
    if (guard_regions[i].p == p) {
      munmap(p, guard_regions[i].len);
      guard_regions[i] = guard_regions[--guard_n];
      return;
    }
  cr_assert_fail("guard_free of %p, which the device never gave", p);
}

/* Every function of the table that touches memory opens the device for the
 * length of the CPU backend's call. */
#define GUARD_VOID(name, params, args) \
  static void g_##name params {        \
    guard_open();                      \
    cpu->name args;                    \
    guard_close();                     \
  }
#define GUARD_RET(type, name, params, args) \
  static type g_##name params {             \
    guard_open();                           \
    type r = cpu->name args;                \
    guard_close();                          \
    return r;                               \
  }
GUARD_VOID(encoder_fwd, (float *o, const int32_t *t, const float *e, const float *p, int B, int T, int C), (o, t, e, p, B, T, C))
GUARD_VOID(encoder_bwd, (float *de, float *dp, const float *d, const int32_t *t, int B, int T, int C), (de, dp, d, t, B, T, C))
GUARD_VOID(layernorm_fwd, (float *o, float *m, float *r, const float *i, const float *w, const float *b, int N, int C), (o, m, r, i, w, b, N, C))
GUARD_VOID(layernorm_bwd, (float *di, float *dw, float *db, const float *d, const float *i, const float *w, const float *m, const float *r, int N, int C), (di, dw, db, d, i, w, m, r, N, C))
GUARD_VOID(matmul_fwd, (float *o, const float *i, const float *w, const float *b, int N, int IC, int OC, int ld), (o, i, w, b, N, IC, OC, ld))
GUARD_VOID(matmul_bwd, (float *di, float *dw, float *db, const float *d, const float *i, const float *w, int N, int IC, int OC, int ld, int acc), (di, dw, db, d, i, w, N, IC, OC, ld, acc))
GUARD_VOID(attention_fwd, (float *o, float *a, float *s, const float *q, int B, int T, int C, int NH), (o, a, s, q, B, T, C, NH))
GUARD_VOID(attention_bwd, (float *dq, float *s, const float *d, const float *q, const float *o, const float *a, int B, int T, int C, int NH, int acc), (dq, s, d, q, o, a, B, T, C, NH, acc))
GUARD_VOID(gelu_fwd, (float *o, const float *i, size_t n), (o, i, n))
GUARD_VOID(gelu_bwd, (float *di, const float *i, const float *d, size_t n, int acc), (di, i, d, n, acc))
GUARD_VOID(residual_fwd, (float *o, const float *a, const float *b, size_t n), (o, a, b, n))
GUARD_VOID(residual_bwd, (float *da, float *db, const float *d, size_t n), (da, db, d, n))
GUARD_VOID(crossentropy_fwd, (float *l, float *g, const int32_t *t, int N, int V, int ld), (l, g, t, N, V, ld))
GUARD_VOID(crossentropy_bwd, (float *p, const int32_t *t, float d, int N, int V, int ld), (p, t, d, N, V, ld))
GUARD_VOID(crossentropy_fwd_bwd, (float *l, float *g, const int32_t *t, float d, int N, int V, int ld), (l, g, t, d, N, V, ld))
GUARD_VOID(adamw, (float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float e, float wd, int t), (p, g, m, v, n, lr, b1, b2, e, wd, t))
GUARD_VOID(adamw_segs, (float *p, uint16_t *p16, const float *g, float *m, float *v, const kern_seg_t *s, int ns, float lr, float b1, float b2, float e, float wd, int t), (p, p16, g, m, v, s, ns, lr, b1, b2, e, wd, t))
GUARD_VOID(adamw_segs_scaled, (float *p, uint16_t *p16, const float *g, float gs, float *m, float *v, const kern_seg_t *s, int ns, float lr, float b1, float b2, float e, float wd, int t), (p, p16, g, gs, m, v, s, ns, lr, b1, b2, e, wd, t))
GUARD_VOID(f32_to_bf16, (uint16_t *o, const float *i, size_t n), (o, i, n))
GUARD_VOID(bf16_to_f32, (float *o, const uint16_t *i, size_t n), (o, i, n))
GUARD_VOID(bf16_to_f32_segs, (float *o, const uint16_t *i, const kern_seg_t *s, int ns), (o, i, s, ns))
GUARD_RET(double, sumsq, (const float *x, size_t n), (x, n))
GUARD_VOID(dev_set, (void *d, int v, size_t n), (d, v, n))
GUARD_VOID(copy_h2d, (void *d, const void *s, size_t n), (d, s, n))
GUARD_VOID(copy_d2h, (void *d, const void *s, size_t n), (d, s, n))
GUARD_VOID(copy_d2d, (void *d, const void *s, size_t n), (d, s, n))
GUARD_VOID(vec_add, (float *y, const float *x, size_t n), (y, x, n))
GUARD_VOID(vec_scale, (float *y, float s, size_t n), (y, s, n))
GUARD_RET(double, vec_sum, (const float *x, size_t n), (x, n))

/* What host_pin and host_unpin were asked (the guarded device copies by
 * "DMA" too: it pins). */
static struct {
  void *p, *unpinned;
  size_t bytes;
  int pins, unpins, fail;
} pinrec;
static int g_host_pin(void *p, size_t bytes) {
  pinrec.pins++, pinrec.p = p, pinrec.bytes = bytes;
  return pinrec.fail ? -1 : 0;
}
static void g_host_unpin(void *p) { pinrec.unpins++, pinrec.unpinned = p; }

static kern_backend_t guarded;

static const kern_backend_t *guarded_backend(void) {
  cpu = kern_cpu();
  cpu->set_threads(1);
  guarded = *cpu;
  guarded.name = "guarded";
  guarded.host_memory = 0;
  guarded.dev_alloc = guard_alloc;
  guarded.dev_free = guard_free;
#define G(m) guarded.m = g_##m
  G(encoder_fwd), G(encoder_bwd), G(layernorm_fwd), G(layernorm_bwd), G(matmul_fwd);
  G(matmul_bwd), G(attention_fwd), G(attention_bwd), G(gelu_fwd), G(gelu_bwd);
  G(residual_fwd), G(residual_bwd), G(crossentropy_fwd), G(crossentropy_bwd), G(adamw);
  G(crossentropy_fwd_bwd), G(adamw_segs), G(adamw_segs_scaled);
  G(f32_to_bf16), G(bf16_to_f32), G(bf16_to_f32_segs), G(sumsq), G(dev_set), G(copy_h2d), G(copy_d2h);
  G(copy_d2d), G(vec_add), G(vec_scale), G(vec_sum);
#undef G
  guarded.host_pin = g_host_pin;
  guarded.host_unpin = g_host_unpin;
  guarded.reduce_f32 = NULL; /* the collectives of a device reduce on the device */
  guarded.reduce_bf16 = NULL;
  guarded.copy_stream = NULL;
  return &guarded;
}

/* ---- the accounting allocator on a device ---------------------------------- */

Test(device, accounting_counts_device_memory) {
  const kern_backend_t *be = guarded_backend();
  mem_run_begin();
  size_t before = mem_current(MEM_OPTIM);
  float *a = mem_dev_alloc(be, MEM_OPTIM, 5000, "a");
  float *b = mem_dev_calloc(be, MEM_OPTIM, 3000, "b");
  cr_assert(a && b, "%s", err_msg());
  cr_assert_eq(guard_n, 2, "both came from the device's allocator");
  cr_assert_eq(mem_current(MEM_OPTIM) - before, 8000, "the bytes asked for, counted");
  float z[750];
  be->copy_d2h(z, b, sizeof z);
  for (int i = 0; i < 750; i++) cr_assert_eq(z[i], 0.0f, "calloc zeroed through the device");
  mem_dev_free(be, a);
  cr_assert_eq(mem_current(MEM_OPTIM) - before, 3000);
  cr_assert_eq(mem_peak(MEM_OPTIM) - before, 8000);
  mem_dev_free(be, b);
  cr_assert_eq(guard_n, 0);
  cr_assert_eq(mem_current(MEM_OPTIM), before);
  /* a full device: NULL, FSDP_ENOMEM, and a message naming the device and the buffer */
  cr_assert_null(mem_dev_alloc(be, MEM_ACTS, (size_t)1 << 60, "activations for batch 9"));
  cr_assert(strstr(err_msg(), "guarded") && strstr(err_msg(), "activations for batch 9"),
            "%s", err_msg());
  cr_assert_eq(mem_current(MEM_ACTS), 0, "nothing counted for a failed allocation");
}

/* ---- the flat model ---------------------------------------------------------- */

static gpt_config_t cfg(void) {
  gpt_config_t c = {.layers = 2, .channels = 32, .heads = 4, .vocab = 256, .context = 16};
  return c;
}

static void batch(int step, int32_t *in, int32_t *tg, int n) {
  uint64_t s = 77 + (uint64_t)step;
  for (int i = 0; i < n; i++) in[i] = (int32_t)(rng_next(&s) % 256);
  for (int i = 0; i < n; i++) tg[i] = (int32_t)(rng_next(&s) % 256);
}

/* Three steps of the flat model and AdamW on be, its final weights saved to
 * path, and a sample of 6 tokens. */
static void flat_run(const kern_backend_t *be, const char *path, float *losses, int32_t *sample) {
  const gpt_config_t c = cfg();
  enum { B = 2, T = 16 };
  gpt_t *g;
  adamw_t *o;
  cr_assert_eq(gpt_create(&g, &c, be), 0, "%s", err_msg());
  cr_assert_eq(gpt_init_weights(g, 5), 0);
  cr_assert_eq(adamw_create(&o, g, (adamw_hparams_t){0.9f, 0.95f, 1e-8f, 0.1f}), 0);
  int32_t in[B * T], tg[B * T];
  for (int s = 0; s < 3; s++) {
    batch(s, in, tg, B * T);
    gpt_zero_grad(g);
    cr_assert_eq(gpt_forward(g, in, tg, B, T, &losses[s]), 0, "%s", err_msg());
    cr_assert_eq(gpt_backward(g, 1.0f), 0, "%s", err_msg());
    adamw_step(o, g, 1e-3f);
  }
  cr_assert_eq(gpt_save(g, path), 0, "%s", err_msg());
  int32_t prompt[2] = {'a', 'b'};
  cr_assert_eq(sample_tokens(g, prompt, 2, 6, 0.8f, 9, sample), 0, "%s", err_msg());
  adamw_destroy(o);
  gpt_destroy(g);
}

static int files_equal(const char *a, const char *b) {
  char cmd[2 * 4096 + 16];
  snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
  return system(cmd) == 0;
}

Test(device, flat_model_runs_on_a_device_the_host_cannot_touch) {
  char *pc = tu_path("cpu.w"), *pg = tu_path("guarded.w");
  float lc[3], lg[3];
  int32_t sc[6], sg[6];
  const kern_backend_t *dev = guarded_backend(); /* one thread for both runs */
  flat_run(kern_cpu(), pc, lc, sc);
  mem_snapshot_t mc, mg;
  mem_snapshot(&mc, 0);
  mem_run_begin();
  flat_run(dev, pg, lg, sg);
  mem_snapshot(&mg, 0);
  cr_assert_gt(guard_allocs, 0, "the model's buffers came from the device");
  cr_assert_eq(guard_n, 0, "and went back to it");
  cr_assert_eq(memcmp(lc, lg, sizeof lc), 0, "losses %a %a %a vs %a %a %a", lc[0], lc[1], lc[2],
               lg[0], lg[1], lg[2]);
  cr_assert_eq(memcmp(sc, sg, sizeof sc), 0, "the same sample");
  cr_assert(files_equal(pc, pg), "the same weights file");
  for (int k = 0; k < MEM__COUNT; k++)
    cr_assert_eq(mc.peak[k], mg.peak[k], "%s: %zu on the CPU, %zu on the device",
                 mem_cat_name((mem_cat_t)k), mc.peak[k], mg.peak[k]);
  /* a weights file loads onto the device, and computes the same loss */
  gpt_t *a, *b;
  cr_assert_eq(gpt_load(&a, pg, kern_cpu()), 0, "%s", err_msg());
  cr_assert_eq(gpt_load(&b, pg, dev), 0, "%s", err_msg());
  int32_t in[32], tg[32];
  float la, lb;
  batch(9, in, tg, 32);
  cr_assert_eq(gpt_forward(a, in, tg, 2, 16, &la), 0);
  cr_assert_eq(gpt_forward(b, in, tg, 2, 16, &lb), 0);
  cr_assert_eq(la, lb);
  gpt_destroy(a);
  gpt_destroy(b);
  free(pc);
  free(pg);
}

/* ---- the sharded runtime on one rank ------------------------------------------ */

/* Three steps of the runtime (mesh 1x1) on be under prec, two micro-batches
 * each (the second with the reduction deferred when defer), clipping on,
 * then the weights written to path and read back. Memory peaks into *m. */
static void runtime_run(const kern_backend_t *be, precision_t prec, int defer,
                        const char *path, float *losses, float *norms, mem_snapshot_t *m) {
  const gpt_config_t c = cfg();
  enum { B = 2, T = 16 };
  mem_run_begin();
  fsdp_opts_t o = {.be = be, .mesh = {1, 1, SHARD_FULL_SHARD}, .seed = 3,
                   .hp = {0.9f, 0.95f, 1e-8f, 0.1f}, .precision = prec};
  fsdp_t *f;
  cr_assert_eq(fsdp_create(&f, &c, &o), 0, "%s", err_msg());
  gpt_t *g = fsdp_model(f);
  int32_t in[B * T], tg[B * T];
  for (int s = 0; s < 3; s++) {
    fsdp_zero_grad(f);
    losses[s] = 0;
    for (int k = 0; k < 2; k++) {
      float l;
      batch(2 * s + k, in, tg, B * T);
      fsdp_defer_reduce(f, defer && k == 0);
      cr_assert_eq(gpt_forward(g, in, tg, B, T, &l), 0, "%s", err_msg());
      cr_assert_eq(gpt_backward(g, 0.5f), 0, "%s", err_msg());
      losses[s] += l / 2;
    }
    cr_assert_eq(fsdp_step(f, 1e-3f, 0.05f, &norms[s]), 0, "%s", err_msg());
  }
  cr_assert_eq(fsdp_reshard(f), 0, "%s", err_msg());
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0);
  int32_t hdr[256];
  gpt_weights_header(&c, hdr);
  cr_assert_eq(write(fd, hdr, sizeof hdr), (ssize_t)sizeof hdr);
  cr_assert_eq(ftruncate(fd, GPT_WEIGHTS_HEADER_BYTES + (off_t)(gpt_config_num_params(&c) * 4)), 0);
  cr_assert_eq(fsdp_write_weights(f, fd, path), 0, "%s", err_msg());
  close(fd);
  cr_assert_eq(fsdp_load_weights(f, path), 0, "%s", err_msg());
  float *w = malloc(gpt_config_num_params(&c) * sizeof *w);
  cr_assert_eq(fsdp_gather_params(f, w), 0, "%s", err_msg());
  float l;
  batch(99, in, tg, B * T);
  cr_assert_eq(gpt_forward(g, in, tg, B, T, &l), 0);
  losses[3] = l;
  mem_snapshot(m, 0);
  free(w);
  fsdp_destroy(f);
}

static void runtime_matches(precision_t prec, int defer) {
  char *pc = tu_path("rt_cpu.w"), *pg = tu_path("rt_guarded.w");
  float lc[4], lg[4], nc[3], ng[3];
  mem_snapshot_t mc, mg;
  const kern_backend_t *dev = guarded_backend(); /* one thread for both runs */
  runtime_run(kern_cpu(), prec, defer, pc, lc, nc, &mc);
  runtime_run(dev, prec, defer, pg, lg, ng, &mg);
  cr_assert_eq(guard_n, 0, "every device buffer went back");
  cr_assert_eq(memcmp(lc, lg, sizeof lc), 0, "losses %a %a %a %a vs %a %a %a %a", lc[0], lc[1],
               lc[2], lc[3], lg[0], lg[1], lg[2], lg[3]);
  cr_assert_eq(memcmp(nc, ng, sizeof nc), 0, "gradient norms");
  cr_assert(nc[0] > 0.05f, "clipping was on (norm %f)", nc[0]);
  cr_assert(files_equal(pc, pg), "the same weights file");
  for (int k = 0; k < MEM__COUNT; k++)
    cr_assert_eq(mc.peak[k], mg.peak[k], "%s: %zu on the CPU, %zu on the device",
                 mem_cat_name((mem_cat_t)k), mc.peak[k], mg.peak[k]);
  free(pc);
  free(pg);
}

/* An asynchronous checkpoint's snapshot is host memory the device copies
 * into often: on a device (not the CPU) it is page-locked whole when made
 * and unlocked before it is freed; a lock refused leaves it usable. */
Test(device, a_checkpoint_snapshot_is_page_locked_on_a_device) {
  const gpt_config_t c = cfg();
  for (int dev = 0; dev < 3; dev++) {
    memset(&pinrec, 0, sizeof pinrec);
    pinrec.fail = dev == 2;
    const kern_backend_t *be = dev ? guarded_backend() : kern_cpu();
    fsdp_opts_t o = {.be = be, .mesh = {1, 1, SHARD_FULL_SHARD}, .seed = 3,
                     .hp = {0.9f, 0.95f, 1e-8f, 0.1f}, .precision = PRECISION_BF16_MIXED};
    fsdp_t *f;
    cr_assert_eq(fsdp_create(&f, &c, &o), 0, "%s", err_msg());
    const size_t n = ckpt_rank_snapshot_bytes(f);
    const size_t before = mem_current(MEM_SNAPSHOT);
    uint8_t *snap = ckpt_rank_snapshot_alloc(f);
    cr_assert_not_null(snap, "case %d", dev);
    cr_expect_eq(mem_current(MEM_SNAPSHOT) - before, n, "case %d: counted as the snapshot", dev);
    cr_expect_eq(snap[0] | snap[n - 1], 0, "case %d: touched (zeroed) when made", dev);
    cr_expect_eq(pinrec.pins, dev ? 1 : 0, "case %d: %d pins", dev, pinrec.pins);
    if (dev) cr_expect(pinrec.p == snap && pinrec.bytes == n, "case %d: pinned %p %zu", dev, pinrec.p, pinrec.bytes);
    cr_expect_eq(pinrec.unpins, 0);
    ckpt_rank_snapshot_free(f, snap);
    cr_expect_eq(pinrec.unpins, dev ? 1 : 0, "case %d: %d unpins", dev, pinrec.unpins);
    if (dev) cr_expect(pinrec.unpinned == snap, "case %d", dev);
    cr_expect_eq(mem_current(MEM_SNAPSHOT), before, "case %d: freed", dev);
    fsdp_destroy(f);
  }
  cr_assert_eq(guard_n, 0, "every device buffer went back");
}

Test(device, runtime_fp32_runs_on_a_device_the_host_cannot_touch) { runtime_matches(PRECISION_FP32, 0); }
Test(device, runtime_bf16_mixed_runs_on_a_device_the_host_cannot_touch) {
  runtime_matches(PRECISION_BF16_MIXED, 1);
}
Test(device, runtime_bf16_true_runs_on_a_device_the_host_cannot_touch) {
  runtime_matches(PRECISION_BF16_TRUE, 1);
}

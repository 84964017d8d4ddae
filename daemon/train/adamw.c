/* adamw: AdamW state and steps over segments of a flat buffer (see adamw.h).
 * The update math is the kernel's (kern_adamw_elem); this module owns the m and
 * v buffers (fp32 or bf16), the step count, and which elements are decayed. */
#include "adamw.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/mem.h"

struct adamw {
  const kern_backend_t *be; /* the state lives on its device; the update is its kernel */
  adamw_hparams_t hp;
  size_t n;
  float *m, *v;        /* (n) each, the parameters' layout: fp32 state, or NULL */
  uint16_t *m16, *v16; /* (n) each: bf16 state, or NULL */
  float *chunk32;      /* (4 * ADAMW_CHUNK) bf16 state: p, g, m, v of one chunk in fp32 */
  int nsegs;
  adamw_segment_t *segs;
  int t;        /* steps taken */
};

static int adamw_alloc(adamw_t **out, const kern_backend_t *be, size_t n,
                       const adamw_segment_t *segs, int nsegs, adamw_hparams_t hp, mem_cat_t cat,
                       int bf16) {
  *out = NULL;
  adamw_t *o = calloc(1, sizeof *o);
  if (!o) return err_set(FSDP_ENOMEM, "adamw: out of memory");
  o->be = be;
  o->hp = hp;
  o->n = n;
  o->nsegs = nsegs;
  o->segs = malloc((size_t)(nsegs ? nsegs : 1) * sizeof *segs);
  int ok;
  if (bf16) {
    o->m16 = mem_dev_calloc(be, cat, n * sizeof(uint16_t), "AdamW first moment (bf16)");
    o->v16 = o->m16 ? mem_dev_calloc(be, cat, n * sizeof(uint16_t), "AdamW second moment (bf16)")
                    : NULL;
    o->chunk32 = o->v16 ? mem_dev_alloc(be, MEM_WORKSPACE, 4 * ADAMW_CHUNK * sizeof(float),
                                        "AdamW fp32 chunk of bf16 state") : NULL;
    ok = o->chunk32 != NULL;
  } else {
    o->m = mem_dev_calloc(be, cat, n * sizeof(float), "AdamW first moment");
    o->v = o->m ? mem_dev_calloc(be, cat, n * sizeof(float), "AdamW second moment") : NULL;
    ok = o->v != NULL;
  }
  if (!ok || !o->segs) {
    adamw_destroy(o);
    return FSDP_ENOMEM;
  }
  memcpy(o->segs, segs, (size_t)nsegs * sizeof *segs);
  for (int k = 0; k < nsegs; k++) { /* in order, apart (kern.h's adamw_segs) */
    FSDP_ASSERT(segs[k].offset + segs[k].numel <= n);
    FSDP_ASSERT(!k || segs[k].offset >= segs[k - 1].offset + segs[k - 1].numel);
  }
  *out = o;
  return FSDP_OK;
}

int adamw_create_segments(adamw_t **out, const kern_backend_t *be, size_t n,
                          const adamw_segment_t *segs, int nsegs, adamw_hparams_t hp,
                          mem_cat_t cat) {
  return adamw_alloc(out, be, n, segs, nsegs, hp, cat, 0);
}

int adamw_create_segments_bf16(adamw_t **out, const kern_backend_t *be, size_t n,
                               const adamw_segment_t *segs, int nsegs, adamw_hparams_t hp,
                               mem_cat_t cat) {
  return adamw_alloc(out, be, n, segs, nsegs, hp, cat, 1);
}

int adamw_create(adamw_t **out, const gpt_t *g, adamw_hparams_t hp) {
  int nt = gpt_num_tensors(g);
  adamw_segment_t *segs = malloc((size_t)nt * sizeof *segs);
  if (!segs) return err_set(FSDP_ENOMEM, "adamw: out of memory");
  for (int k = 0; k < nt; k++) {
    const gpt_tensor_t *t = gpt_tensor(g, k);
    segs[k] = (adamw_segment_t){t->offset, t->numel, t->decay};
  }
  int rc = adamw_create_segments(out, gpt_backend(g), gpt_num_params(g), segs, nt, hp, MEM_OPTIM);
  free(segs);
  return rc;
}

void adamw_destroy(adamw_t *o) {
  if (!o) return;
  mem_dev_free(o->be, o->m);
  mem_dev_free(o->be, o->v);
  mem_dev_free(o->be, o->m16);
  mem_dev_free(o->be, o->v16);
  mem_dev_free(o->be, o->chunk32);
  free(o->segs);
  free(o);
}

/* n elements of segment s through the kernel (bf16-true's chunks; the
 * fp32 step takes every segment in one adamw_segs). */
static void adamw_kernel(const adamw_t *o, const adamw_segment_t *s, float *p, const float *g,
                         float *m, float *v, size_t n, float lr) {
  o->be->adamw(p, g, m, v, n, lr, o->hp.beta1, o->hp.beta2, o->hp.eps,
               s->decay ? o->hp.weight_decay : 0.f, o->t);
}

int adamw_scales_grads(const adamw_t *o) { return o->be->adamw_segs_scaled != NULL; }

void adamw_step_buffers(adamw_t *o, float *p, uint16_t *p16, const float *gr, float gscale,
                        float lr) {
  FSDP_ASSERT(o->m && (gscale == 1.0f || adamw_scales_grads(o)));
  o->t++;
  /* every segment at once (kern.h), each segment's adamw bits */
  if (gscale != 1.0f)
    o->be->adamw_segs_scaled(p, p16, gr, gscale, o->m, o->v, o->segs, o->nsegs, lr, o->hp.beta1,
                             o->hp.beta2, o->hp.eps, o->hp.weight_decay, o->t);
  else
    o->be->adamw_segs(p, p16, gr, o->m, o->v, o->segs, o->nsegs, lr, o->hp.beta1, o->hp.beta2,
                      o->hp.eps, o->hp.weight_decay, o->t);
}

void adamw_step_bf16(adamw_t *o, uint16_t *p, const uint16_t *gr, float lr) {
  FSDP_ASSERT(o->m16);
  o->t++;
  const kern_backend_t *be = o->be;
  float *wp = o->chunk32, *wg = wp + ADAMW_CHUNK, *wm = wg + ADAMW_CHUNK, *wv = wm + ADAMW_CHUNK;
  for (int k = 0; k < o->nsegs; k++) {
    const adamw_segment_t *s = &o->segs[k];
    for (size_t i = s->offset, end = s->offset + s->numel; i < end; i += ADAMW_CHUNK) {
      const size_t c = end - i < ADAMW_CHUNK ? end - i : ADAMW_CHUNK;
      be->bf16_to_f32(wp, p + i, c); /* widening is exact */
      be->bf16_to_f32(wg, gr + i, c);
      be->bf16_to_f32(wm, o->m16 + i, c);
      be->bf16_to_f32(wv, o->v16 + i, c);
      adamw_kernel(o, s, wp, wg, wm, wv, c, lr);
      /* the step's rounding: each new p, m and v to bf16, nearest-even (an
       * update below half a bf16 ulp of p is lost here: bf16-true's limit) */
      be->f32_to_bf16(p + i, wp, c);
      be->f32_to_bf16(o->m16 + i, wm, c);
      be->f32_to_bf16(o->v16 + i, wv, c);
    }
  }
}

void adamw_step(adamw_t *o, gpt_t *g, float lr) {
  adamw_step_buffers(o, gpt_params(g), NULL, gpt_grads(g), 1.0f, lr);
}

int adamw_step_count(const adamw_t *o) { return o->t; }
void adamw_set_step_count(adamw_t *o, int t) { o->t = t; }
float *adamw_m(adamw_t *o) { return o->m; }
float *adamw_v(adamw_t *o) { return o->v; }
uint16_t *adamw_m_bf16(adamw_t *o) { return o->m16; }
uint16_t *adamw_v_bf16(adamw_t *o) { return o->v16; }

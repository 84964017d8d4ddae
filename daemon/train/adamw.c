/* adamw: AdamW state and steps over segments of a flat buffer (see adamw.h).
 * The update math is the kernel's (kern_adamw_elem); this module owns the m and
 * v buffers, the step count, and which elements are decayed. */
#include "adamw.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "mem.h"

struct adamw {
  adamw_hparams_t hp;
  size_t n;
  float *m, *v; /* (n) each, the parameters' layout */
  int nsegs;
  adamw_segment_t *segs;
  int t;        /* steps taken */
};

int adamw_create_segments(adamw_t **out, size_t n, const adamw_segment_t *segs, int nsegs,
                          adamw_hparams_t hp, mem_cat_t cat) {
  *out = NULL;
  adamw_t *o = calloc(1, sizeof *o);
  if (!o) return err_set(FSDP_ENOMEM, "adamw: out of memory");
  o->hp = hp;
  o->n = n;
  o->nsegs = nsegs;
  o->segs = malloc((size_t)(nsegs ? nsegs : 1) * sizeof *segs);
  o->m = mem_calloc(cat, n * sizeof(float), "AdamW first moment");
  o->v = o->m ? mem_calloc(cat, n * sizeof(float), "AdamW second moment") : NULL;
  if (!o->v || !o->segs) {
    adamw_destroy(o);
    return FSDP_ENOMEM;
  }
  memcpy(o->segs, segs, (size_t)nsegs * sizeof *segs);
  for (int k = 0; k < nsegs; k++) FSDP_ASSERT(segs[k].offset + segs[k].numel <= n);
  *out = o;
  return FSDP_OK;
}

int adamw_create(adamw_t **out, const gpt_t *g, adamw_hparams_t hp) {
  int nt = gpt_num_tensors(g);
  adamw_segment_t *segs = malloc((size_t)nt * sizeof *segs);
  if (!segs) return err_set(FSDP_ENOMEM, "adamw: out of memory");
  for (int k = 0; k < nt; k++) {
    const gpt_tensor_t *t = gpt_tensor(g, k);
    segs[k] = (adamw_segment_t){t->offset, t->numel, t->decay};
  }
  int rc = adamw_create_segments(out, gpt_num_params(g), segs, nt, hp, MEM_OPTIM);
  free(segs);
  return rc;
}

void adamw_destroy(adamw_t *o) {
  if (!o) return;
  mem_free(o->m);
  mem_free(o->v);
  free(o->segs);
  free(o);
}

void adamw_step_buffers(adamw_t *o, const kern_backend_t *be, float *p, const float *gr,
                        float lr) {
  o->t++;
  /* one kernel call per segment: decay differs between them */
  for (int k = 0; k < o->nsegs; k++) {
    const adamw_segment_t *s = &o->segs[k];
    be->adamw(p + s->offset, gr + s->offset, o->m + s->offset, o->v + s->offset, s->numel, lr,
              o->hp.beta1, o->hp.beta2, o->hp.eps, s->decay ? o->hp.weight_decay : 0.f, o->t);
  }
}

void adamw_step(adamw_t *o, gpt_t *g, float lr) {
  adamw_step_buffers(o, gpt_backend(g), gpt_params(g), gpt_grads(g), lr);
}

int adamw_step_count(const adamw_t *o) { return o->t; }
float *adamw_m(adamw_t *o) { return o->m; }
float *adamw_v(adamw_t *o) { return o->v; }

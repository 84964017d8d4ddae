/* adamw: AdamW state and steps over a model's flat parameters (see adamw.h).
 * The update math is the kernel's (kern_adamw_elem); this module owns the m and
 * v buffers, the step count, and which tensors are decayed. */
#include "adamw.h"

#include <stdlib.h>

#include "daemon/common/err.h"
#include "mem.h"

struct adamw {
  adamw_hparams_t hp;
  size_t n;
  float *m, *v; /* (n) each, the parameters' layout */
  int t;        /* steps taken */
};

int adamw_create(adamw_t **out, const gpt_t *g, adamw_hparams_t hp) {
  *out = NULL;
  adamw_t *o = calloc(1, sizeof *o);
  if (!o) return err_set(FSDP_ENOMEM, "adamw: out of memory");
  o->hp = hp;
  o->n = gpt_num_params(g);
  o->m = mem_calloc(MEM_OPTIM, o->n * sizeof(float), "AdamW first moment");
  o->v = o->m ? mem_calloc(MEM_OPTIM, o->n * sizeof(float), "AdamW second moment") : NULL;
  if (!o->v) {
    adamw_destroy(o);
    return FSDP_ENOMEM;
  }
  *out = o;
  return FSDP_OK;
}

void adamw_destroy(adamw_t *o) {
  if (!o) return;
  mem_free(o->m);
  mem_free(o->v);
  free(o);
}

void adamw_step(adamw_t *o, gpt_t *g, float lr) {
  const kern_backend_t *be = gpt_backend(g);
  float *p = gpt_params(g), *gr = gpt_grads(g);
  o->t++;
  /* one kernel call per tensor: decay differs between tensors */
  for (int k = 0; k < gpt_num_tensors(g); k++) {
    const gpt_tensor_t *t = gpt_tensor(g, k);
    be->adamw(p + t->offset, gr + t->offset, o->m + t->offset, o->v + t->offset, t->numel, lr,
              o->hp.beta1, o->hp.beta2, o->hp.eps, t->decay ? o->hp.weight_decay : 0.f, o->t);
  }
}

int adamw_step_count(const adamw_t *o) { return o->t; }
float *adamw_m(adamw_t *o) { return o->m; }
float *adamw_v(adamw_t *o) { return o->v; }

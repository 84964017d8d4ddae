/* shard_rank: a rank's shards' initial values, file I/O and AdamW segments
 * (see shard_rank.h). */
#include "shard_rank.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/common/err.h"

void shard_init_unit(const shard_layout_t *l, const gpt_config_t *cfg, uint64_t seed, int r, int k,
                     float *shard) {
  size_t begin, real = shard_unit_real(l, r, k, &begin);
  if (real) gpt_init_range(cfg, seed, begin, begin + real, shard);
  memset(shard + real, 0, (l->units[k].shard_numel - real) * sizeof *shard);
}

void shard_init_weights(const shard_layout_t *l, const gpt_config_t *cfg, uint64_t seed, int r,
                        float *shard) {
  for (int k = 0; k < l->num_units; k++) {
    shard_init_unit(l, cfg, seed, r, k, shard);
    shard += l->units[k].shard_numel;
  }
}

int shard_segments(const shard_layout_t *l, const gpt_t *g, int r, adamw_segment_t **segs,
                   int *nsegs) {
  const int nt = gpt_num_tensors(g);
  /* a shard cuts at most every tensor once, plus one piece per unit boundary */
  adamw_segment_t *out = malloc((size_t)(nt + l->num_units) * sizeof *out);
  if (!out) return err_set(FSDP_ENOMEM, "shard segments: out of memory");
  int n = 0;
  size_t base = 0; /* where this unit's shard starts in the rank's buffer */
  for (int k = 0; k < l->num_units; k++) {
    const shard_unit_t *u = &l->units[k];
    size_t lo = u->offset + (size_t)r * u->shard_numel, hi = lo + u->shard_numel; /* global */
    for (int i = 0; i < nt; i++) {
      const gpt_tensor_t *t = gpt_tensor(g, i);
      size_t a = t->offset > lo ? t->offset : lo;
      size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
      if (a < b && t->unit >= u->first && t->unit <= u->last)
        out[n++] = (adamw_segment_t){base + (a - lo), b - a, t->decay};
    }
    base += u->shard_numel;
  }
  *segs = out;
  *nsegs = n;
  return FSDP_OK;
}


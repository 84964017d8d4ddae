/* shard_rank: what one rank does with the bytes of its shards, on the layout
 * daemon/job/shard.h computes: their initial values, their byte ranges in a
 * weights file, and the AdamW segments they hold. Training-side (it needs
 * the model and the optimizer); the geometry itself is the job's. */
#ifndef FSDP_SHARD_RANK_H
#define FSDP_SHARD_RANK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "adamw.h"
#include "daemon/job/shard.h"
#include "gpt.h"

/* Fills rank r's shard of every unit (shard_total floats, units in order) with
 * the initial weights: gpt_init_range over the real elements it owns, zeros in
 * the padding. No rank ever materialises more than its shard. */
void shard_init_weights(const shard_layout_t *l, const gpt_config_t *cfg, uint64_t seed, int r,
                        float *shard);
/* The same for unit k alone: its shard (shard_numel floats) into buf. */
void shard_init_unit(const shard_layout_t *l, const gpt_config_t *cfg, uint64_t seed, int r, int k,
                     float *buf);

/* The AdamW segments of rank r's shards (offsets into its shard_total
 * buffer): the pieces of each tensor that fall in them, with the tensor's decay
 * rule; padding belongs to no segment. *segs is malloc'd (free it). */
int shard_segments(const shard_layout_t *l, const gpt_t *g, int r, adamw_segment_t **segs,
                   int *nsegs);

#endif

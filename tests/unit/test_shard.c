/* Tests of the sharding geometry: strategy and mesh checks with their
 * messages, the groups a mesh makes, the padded layout, and that sharded
 * initialisation reassembles to the single-device weights byte for byte. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/train/shard_rank.h"

Test(shard, strategy_names) {
  shard_strategy_t s;
  cr_assert_eq(shard_strategy_parse("hybrid_shard", &s), 0);
  cr_assert_eq(s, SHARD_HYBRID_SHARD);
  cr_assert_str_eq(shard_strategy_name(SHARD_SHARD_GRAD_OP), "SHARD_GRAD_OP");
  cr_assert_eq(shard_strategy_parse("ZERO3", &s), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "ZERO3") && strstr(err_msg(), "FULL_SHARD"), "%s", err_msg());
  cr_assert(shard_strategy_keeps_params(SHARD_SHARD_GRAD_OP));
  cr_assert(!shard_strategy_keeps_params(SHARD_FULL_SHARD));
}

Test(shard, mesh_parse_and_validate) {
  shard_mesh_t m;
  char desc[256];
  cr_assert_eq(shard_mesh_parse("2x2", SHARD_HYBRID_SHARD, &m), 0);
  cr_assert(m.replicas == 2 && m.shards == 2);
  cr_assert_eq(shard_mesh_validate(&m, 4, desc, sizeof desc), 0, "%s", err_msg());
  cr_assert_str_eq(desc, "HYBRID_SHARD on 4 ranks: 2 shard groups of 2: {0,1} {2,3}; gradients "
                         "all-reduced across replica groups {0,2} {1,3}");
  cr_assert_eq(shard_mesh_parse("4", SHARD_FULL_SHARD, &m), 0);
  cr_assert(m.replicas == 1 && m.shards == 4);
  cr_assert_eq(shard_mesh_validate(&m, 4, desc, sizeof desc), 0);
  cr_assert_str_eq(desc, "FULL_SHARD on 4 ranks: 1 shard group of 4: {0,1,2,3}");
  cr_assert_eq(shard_mesh_parse("3", SHARD_NO_SHARD, &m), 0);
  cr_assert(m.replicas == 3 && m.shards == 1);
  cr_assert_eq(shard_mesh_validate(&m, 3, desc, sizeof desc), 0);
  cr_assert(strstr(desc, "no sharding") && strstr(desc, "{0,1,2}"), "%s", desc);
  /* the errors name the mesh and what would fit */
  cr_assert_eq(shard_mesh_parse("2x3", SHARD_HYBRID_SHARD, &m), 0);
  cr_assert_eq(shard_mesh_validate(&m, 4, desc, sizeof desc), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "2x3 is 6 ranks but the job has 4"), "%s", err_msg());
  cr_assert_eq(shard_mesh_parse("2x2", SHARD_FULL_SHARD, &m), 0);
  cr_assert_eq(shard_mesh_validate(&m, 4, desc, sizeof desc), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "1x4") && strstr(err_msg(), "HYBRID_SHARD"), "%s", err_msg());
  cr_assert_eq(shard_mesh_parse("1x4", SHARD_NO_SHARD, &m), 0);
  cr_assert_eq(shard_mesh_validate(&m, 4, desc, sizeof desc), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "4x1"), "%s", err_msg());
  const char *bad[] = {"", "x2", "2x", "0x4", "2x2x2", "-1", "two"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_assert_eq(shard_mesh_parse(bad[i], SHARD_HYBRID_SHARD, &m), FSDP_EINVAL, "\"%s\"", bad[i]);
    cr_assert(strstr(err_msg(), "mesh"), "%s", err_msg());
  }
}

Test(shard, groups_of_a_mesh) {
  shard_mesh_t m = {3, 2, SHARD_HYBRID_SHARD};
  int sg[2], rg[3];
  shard_group_ranks(&m, 3, sg, rg);
  cr_assert(sg[0] == 2 && sg[1] == 3, "rank 3 shards with rank 2");
  cr_assert(rg[0] == 1 && rg[1] == 3 && rg[2] == 5, "and replicates with 1 and 5");
  shard_place_t p = shard_place(&m, 5);
  cr_assert(p.shard_rank == 1 && p.replica == 2 && p.first_of_group == 4);
}

static gpt_config_t cfg_small(void) {
  gpt_config_t c;
  cr_assert_eq(gpt_config_preset(&c, "tiny"), 0);
  c.layers = 3;
  c.vocab = 250; /* odd sizes, so the padding is not trivially zero */
  c.context = 37;
  return c;
}

Test(shard, layout_covers_every_parameter_once) {
  gpt_config_t c = cfg_small();
  for (int S = 1; S <= 4; S++) {
    shard_layout_t *l;
    cr_assert_eq(shard_layout_create(&l, &c, S, 0), 0, "%s", err_msg());
    cr_assert_eq(l->num_units, c.layers + 1, "one unit per block plus embeddings");
    size_t next = 0, total = 0;
    for (int k = 0; k < l->num_units; k++) {
      const shard_unit_t *u = &l->units[k];
      cr_assert_eq(u->offset, next);
      next += u->numel;
      cr_assert_eq(u->shard_numel % SHARD_ALIGN, 0);
      cr_assert_geq(u->shard_numel * S, u->numel, "the shards hold the unit");
      cr_assert_lt(u->shard_numel * S - u->numel, (size_t)S * SHARD_ALIGN, "padding is minimal");
      total += u->shard_numel;
    }
    cr_assert_eq(next, gpt_config_num_params(&c));
    cr_assert_eq(total, l->shard_total);
    shard_layout_destroy(l);
  }
}

Test(shard, min_params_merges_neighbours) {
  gpt_config_t c = cfg_small();
  const size_t block = gpt_config_unit(&c, 1).numel;
  shard_layout_t *l;
  cr_assert_eq(shard_layout_create(&l, &c, 2, 2 * block), 0);
  /* embeddings (18496) + block 0 (49984) are still under 2 blocks, so block 1
   * joins them; block 2 (model unit 3) is left alone at the end, smaller */
  cr_assert_lt(gpt_config_unit(&c, 0).numel + block, 2 * block);
  cr_assert_eq(l->num_units, 2);
  cr_assert(l->units[0].first == 0 && l->units[0].last == 2);
  cr_assert(l->units[1].first == 3 && l->units[1].last == 3, "the last may be smaller");
  cr_assert_eq(l->units[1].numel, block);
  cr_assert(l->unit_of[0] == 0 && l->unit_of[2] == 0 && l->unit_of[3] == 1);
  shard_layout_destroy(l);
  cr_assert_eq(shard_layout_create(&l, &c, 0, 0), FSDP_EINVAL);
}

/* Each rank fills only its own shard; put side by side, the shards are the
 * single-device initial weights, byte for byte, for any world size. */
Test(shard, sharded_init_is_bit_identical_for_world_1_to_4) {
  gpt_config_t c = cfg_small();
  size_t n = gpt_config_num_params(&c);
  float *whole = malloc(n * sizeof *whole), *gathered = malloc(n * sizeof *gathered);
  gpt_init_range(&c, 1234, 0, n, whole);
  for (int S = 1; S <= 4; S++) {
    shard_layout_t *l;
    cr_assert_eq(shard_layout_create(&l, &c, S, 0), 0);
    float **shards = malloc((size_t)S * sizeof *shards);
    for (int r = 0; r < S; r++) {
      shards[r] = malloc(l->shard_total * sizeof(float));
      shard_init_weights(l, &c, 1234, r, shards[r]);
    }
    memset(gathered, 0xff, n * sizeof *gathered);
    size_t soff = 0;
    for (int k = 0; k < l->num_units; k++) {
      const shard_unit_t *u = &l->units[k];
      for (int r = 0; r < S; r++)
        for (size_t i = 0; i < u->shard_numel; i++) {
          size_t e = (size_t)r * u->shard_numel + i;
          if (e < u->numel) gathered[u->offset + e] = shards[r][soff + i];
          else cr_assert_eq(shards[r][soff + i], 0.0f, "padding is zero");
        }
      soff += u->shard_numel;
    }
    cr_assert_eq(memcmp(whole, gathered, n * sizeof *whole), 0, "world size %d", S);
    for (int r = 0; r < S; r++) free(shards[r]);
    free(shards);
    shard_layout_destroy(l);
  }
  free(whole);
  free(gathered);
}

/* AdamW run on each rank's shards, put side by side, gives the bytes of AdamW
 * on the whole model: parameters, m and v, after several steps. */
#include "daemon/common/rng.h"

static float grad_of(size_t i, int step) {
  return (float)(rng_unit(rng_mix(i * 7 + (size_t)step)) - 0.5) * 0.01f;
}

Test(shard, sharded_adamw_equals_whole_model_adamw) {
  gpt_config_t c = cfg_small();
  gpt_t *g;
  cr_assert_eq(gpt_create(&g, &c, kern_cpu()), 0);
  gpt_init_weights(g, 77);
  const size_t n = gpt_num_params(g);
  const adamw_hparams_t hp = {0.9f, 0.95f, 1e-8f, 0.1f};
  adamw_t *whole;
  cr_assert_eq(adamw_create(&whole, g, hp), 0);
  for (int step = 0; step < 3; step++) {
    for (size_t i = 0; i < n; i++) gpt_grads(g)[i] = grad_of(i, step);
    adamw_step(whole, g, 1e-3f * (float)(step + 1));
  }
  for (int S = 1; S <= 4; S++) {
    shard_layout_t *l;
    cr_assert_eq(shard_layout_create(&l, &c, S, 0), 0);
    float *gathered = malloc(n * sizeof(float)), *gm = malloc(n * sizeof(float));
    for (int r = 0; r < S; r++) {
      adamw_segment_t *segs;
      int nsegs;
      cr_assert_eq(shard_segments(l, g, r, &segs, &nsegs), 0);
      float *p = malloc(l->shard_total * sizeof(float)), *gr = malloc(l->shard_total * sizeof(float));
      shard_init_weights(l, &c, 77, r, p);
      adamw_t *o;
      cr_assert_eq(adamw_create_segments(&o, kern_cpu(), l->shard_total, segs, nsegs, hp, MEM_OPTIM), 0);
      for (int step = 0; step < 3; step++) {
        size_t base = 0;
        for (int k = 0; k < l->num_units; k++) {
          const shard_unit_t *u = &l->units[k];
          for (size_t i = 0; i < u->shard_numel; i++) {
            size_t e = (size_t)r * u->shard_numel + i;
            gr[base + i] = e < u->numel ? grad_of(u->offset + e, step) : 0.0f;
          }
          base += u->shard_numel;
        }
        adamw_step_buffers(o, p, NULL, gr, 1.0f, 1e-3f * (float)(step + 1));
      }
      size_t base = 0;
      for (int k = 0; k < l->num_units; k++) {
        const shard_unit_t *u = &l->units[k];
        for (size_t i = 0; i < u->shard_numel; i++) {
          size_t e = (size_t)r * u->shard_numel + i;
          if (e < u->numel) {
            gathered[u->offset + e] = p[base + i];
            gm[u->offset + e] = adamw_m(o)[base + i];
          } else {
            cr_assert_eq(p[base + i], 0.0f, "padding is never updated");
          }
        }
        base += u->shard_numel;
      }
      adamw_destroy(o);
      free(segs);
      free(p);
      free(gr);
    }
    cr_assert_eq(memcmp(gathered, gpt_params(g), n * sizeof(float)), 0, "params, S=%d", S);
    cr_assert_eq(memcmp(gm, adamw_m(whole), n * sizeof(float)), 0, "m, S=%d", S);
    free(gathered);
    free(gm);
    shard_layout_destroy(l);
  }
  adamw_destroy(whole);
  gpt_destroy(g);
}

/* Tests of the memory plan: it equals, category by category, what a run
 * allocates through the accounting allocator, and a job that would not fit is
 * refused before anything is allocated, with the knob that fixes it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"
#include "daemon/train/plan.h"
#include "daemon/train/train.h"
#include "tests/unit/testutil.h"

static char *token_file(void) {
  enum { N = 20000 };
  static uint16_t tok[N];
  uint64_t s = 3;
  for (int i = 0; i < N; i++) tok[i] = (uint16_t)(tu_rand_u64(&s) % 256);
  char *path = tu_path("tokens.bin");
  cr_assert_eq(data_write(path, tok, N), 0, "%s", err_msg());
  return path;
}

static config_t job(const char *data, int ckpt) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 2;
  c.warmup_steps = 1;
  c.batch = 3;
  c.seq_len = 40;
  c.activation_checkpointing = ckpt;
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  return c;
}

static void plan_matches_run(int ckpt) {
  char *data = token_file();
  config_t c = job(data, ckpt);
  plan_t p;
  plan_single(&c, &p);
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  for (int k = 0; k < MEM__COUNT; k++)
    cr_assert_eq(mem_peak((mem_cat_t)k), p.bytes[k], "%s: measured %zu, planned %zu",
                 mem_cat_name((mem_cat_t)k), mem_peak((mem_cat_t)k), p.bytes[k]);
  cr_assert_eq(mem_total_peak(), p.total);
  cr_assert_eq(r.mem_planned, p.total);
  cr_assert_eq(mem_total_current(), 0, "everything was freed");
  free(data);
}

Test(plan, equals_what_a_run_allocates) { plan_matches_run(0); }
Test(plan, equals_what_a_run_allocates_with_checkpointing) { plan_matches_run(1); }

Test(plan, checkpointing_plans_less) {
  char *data = token_file();
  config_t a = job(data, 0), b = job(data, 1);
  plan_t pa, pb;
  plan_single(&a, &pa);
  plan_single(&b, &pb);
  cr_assert_lt(pb.bytes[MEM_ACTS], pa.bytes[MEM_ACTS]);
  cr_assert_eq(pb.bytes[MEM_PARAMS], pa.bytes[MEM_PARAMS]);
  free(data);
}

Test(plan, a_job_that_does_not_fit_is_refused_with_the_fix) {
  char *data = token_file();
  config_t c = job(data, 0);
  c.batch = 64; /* activations dominate */
  plan_t p;
  plan_single(&c, &p);
  config_t ck = c;
  ck.activation_checkpointing = 1;
  plan_t q;
  plan_single(&ck, &q);
  size_t limit = (p.total + q.total) / 2; /* fits only with checkpointing */
  cr_assert_eq(plan_check(&p, &c, limit), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "activation_checkpointing = 1"), "%s", err_msg());
  cr_assert_eq(plan_check(&q, &ck, limit), 0);
  cr_assert_eq(plan_check(&q, &ck, q.total - 1), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "lower batch") && strstr(err_msg(), "grad_accum"), "%s", err_msg());
  /* through the loop: refused before anything is allocated */
  c.memory_limit_mib = 1;
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "memory_limit_mib"), "%s", err_msg());
  cr_assert_eq(mem_total_peak(), 0, "nothing was allocated");
  free(data);
}

Test(plan, model_state_dominated_job_points_at_the_model) {
  char *data = token_file();
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "gpt2-124m"), 0);
  c.batch = 1;
  c.seq_len = 8;
  cr_assert_eq(config_finish(&c), 0);
  plan_t p;
  plan_single(&c, &p);
  cr_assert_eq(p.bytes[MEM_PARAMS], 124439808u * 4, "4 bytes per parameter");
  cr_assert_eq(p.bytes[MEM_OPTIM], 124439808u * 8, "AdamW m and v");
  cr_assert_eq(plan_check(&p, &c, 1u << 30), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "16 bytes per parameter") && strstr(err_msg(), "shard"), "%s",
            err_msg());
  free(data);
}

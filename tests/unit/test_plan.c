/* Tests of the memory plan: it equals, category by category, what a run
 * allocates through the accounting allocator, on one device and in the ranks
 * of every sharded strategy, and a job that would not fit is refused before
 * anything is allocated, with the knob that fixes it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"
#include "daemon/job/plan.h"
#include "daemon/job/shard.h"
#include "daemon/train/train.h"
#include "tests/unit/testutil.h"

/* The defaults with data and model set (not finished). */
static config_t job_of(const char *data, const char *model) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", model), 0);
  return c;
}

static config_t job(const char *data, int ckpt) {
  config_t c = job_of(data, "tiny");
  c.steps = 2;
  c.warmup_steps = 1;
  c.batch = 3;
  c.seq_len = 40;
  c.activation_checkpointing = ckpt;
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  return c;
}

static void plan_matches_run(int ckpt) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c = job(data, ckpt);
  plan_t p;
  cr_assert_eq(plan_job(&c, 1, &p), 0);
  /* one fp32 device runs the runtime at the flat model's cost: its units
   * are the shard itself and backward writes the gradient shard */
  cr_assert_eq(p.bytes[MEM_PARAMS_GATHERED], 0);
  cr_assert_eq(p.bytes[MEM_GRADS], p.bytes[MEM_PARAMS]);
  cr_assert_eq(p.bytes[MEM_COMM], 0);
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
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t a = job(data, 0), b = job(data, 1);
  plan_t pa, pb;
  cr_assert_eq(plan_job(&a, 1, &pa), 0);
  cr_assert_eq(plan_job(&b, 1, &pb), 0);
  cr_assert_lt(pb.bytes[MEM_ACTS], pa.bytes[MEM_ACTS]);
  cr_assert_eq(pb.bytes[MEM_PARAMS], pa.bytes[MEM_PARAMS]);
  free(data);
}

/* Heads of 1 (the attention's scores whole, heads x T x T a row) at a long
 * seq_len: the workspace dominates, and no option of the job shrinks it
 * but batch and seq_len: the advice says that, not "a smaller model". */
Test(plan, a_job_whose_workspace_does_not_fit_is_told_what_the_workspace_holds) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c = job_of(data, "tiny");
  c.dims.layers = 1;
  c.dims.channels = 128;
  c.dims.heads = 128;
  c.dims.context = 4096;
  c.seq_len = 4096;
  c.batch = 1;
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  plan_t p;
  cr_assert_eq(plan_job(&c, 1, &p), 0);
  for (int k = 0; k < MEM__COUNT; k++)
    cr_assert_leq(p.bytes[k], p.bytes[MEM_WORKSPACE], "%s", mem_cat_name((mem_cat_t)k));
  cr_assert_eq(plan_check(&p, &c, p.total / 2), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "workspace takes the most") &&
                strstr(err_msg(), "the workspace is the kernels' own buffers") &&
                !strstr(err_msg(), "smaller model"),
            "%s", err_msg());
  free(data);
}

Test(plan, a_job_that_does_not_fit_is_refused_with_the_fix) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c = job(data, 0);
  c.batch = 64; /* activations dominate */
  plan_t p;
  cr_assert_eq(plan_job(&c, 1, &p), 0);
  config_t ck = c;
  ck.activation_checkpointing = 1;
  plan_t q;
  cr_assert_eq(plan_job(&ck, 1, &q), 0);
  size_t limit = (p.total + q.total) / 2; /* fits only with checkpointing */
  cr_assert_eq(plan_check(&p, &c, limit), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "activation_checkpointing = 1"), "%s", err_msg());
  cr_assert_eq(plan_check(&q, &ck, limit), 0);
  cr_assert_eq(plan_check(&q, &ck, q.total - 1), FSDP_ENOMEM);
  /* a smaller batch with more grad_accum, as many tokens a step, and the
   * advice holds: it fits (an outside tester followed "lower batch" to a
   * plan that still did not fit) */
  const char *adv = strstr(err_msg(), "set batch = ");
  cr_assert(adv && strstr(adv, "grad_accum = ") && strstr(adv, "the same tokens a step"), "%s",
            err_msg());
  config_t cb = ck;
  cb.batch = atoi(adv + strlen("set batch = "));
  cb.grad_accum = atoi(strstr(adv, "grad_accum = ") + strlen("grad_accum = "));
  cr_assert_eq(cb.batch * cb.grad_accum, ck.batch * ck.grad_accum, "%s", adv);
  plan_t qb;
  cr_assert_eq(plan_job(&cb, 1, &qb), 0);
  cr_assert_eq(plan_check(&qb, &cb, q.total - 1), 0, "the advice does not fit: %s", adv);
  /* where no single change fits, it says so, then where the bytes are */
  cr_assert_eq(plan_check(&q, &ck, 1 << 20), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "no single change fits") && strstr(err_msg(), "takes the most"), "%s",
            err_msg());
  /* through the loop: refused before anything is allocated */
  c.memory_limit_mib = 1;
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "memory_limit_mib"), "%s", err_msg());
  cr_assert_eq(mem_total_peak(), 0, "nothing was allocated");
  free(data);
}

/* recompute = 2 (cpu's default) plans 6 x C floats a token less per block
 * than 0; a job that fits only with it is told so first (the cheapest
 * change). */
Test(plan, recompute_plans_less_and_is_the_first_advice) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t on = job(data, 0), off = on;
  cr_assert_eq(on.recompute, -1, "by device by default");
  cr_assert_eq(config_recompute(&on), 2, "GELU and the layernorms by default on cpu");
  off.recompute = 0;
  off.batch = on.batch = 64;
  plan_t p, q;
  cr_assert_eq(plan_job(&off, 1, &p), 0);
  cr_assert_eq(plan_job(&on, 1, &q), 0);
  const size_t blocks = (size_t)on.gpt.layers, tokens = (size_t)on.batch * on.seq_len;
  cr_assert_eq(p.bytes[MEM_ACTS] - q.bytes[MEM_ACTS],
               blocks * tokens * 6 * (size_t)on.gpt.channels * sizeof(float));
  cr_assert_eq(plan_check(&p, &off, (p.total + q.total) / 2), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "recompute = 2"), "%s", err_msg());
  free(data);
}

/* logits_chunk_mib sets the LM head's chunk for the run and the plan alike:
 * tiny's rows are 1 KiB of logits, so 1 MiB cuts 30 x 40 rows into 1024 and
 * 176, where the default's 128 MiB takes all 1200 at once. */
Test(plan, logits_chunk_mib_is_the_chunk_of_both_the_run_and_the_plan) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t one = job(data, 0);
  one.batch = 30;
  config_t whole = one;
  cr_assert_eq(whole.logits_chunk_mib, 0, "the default: by device");
  cr_assert_eq(config_logits_chunk_mib(&whole), GPT_LOGITS_CHUNK_MIB, "a cpu job's");
  cr_assert_eq(config_set(&one, "logits_chunk_mib", "1"), 0, "%s", err_msg());
  plan_t p, q;
  cr_assert_eq(plan_job(&one, 1, &p), 0);
  cr_assert_eq(plan_job(&whole, 1, &q), 0);
  const size_t row = (size_t)gpt_config_logits_ld(&one.gpt) * sizeof(float);
  cr_assert_eq(row, 1024);
  cr_assert_eq(q.bytes[MEM_ACTS] - p.bytes[MEM_ACTS], (1200 - 1024) * row,
               "the logits of 176 rows fewer at once");
  train_result_t r;
  cr_assert_eq(train_run(&one, NULL, &r), 0, "%s", err_msg());
  for (int k = 0; k < MEM__COUNT; k++)
    cr_assert_eq(mem_peak((mem_cat_t)k), p.bytes[k], "%s: measured %zu, planned %zu",
                 mem_cat_name((mem_cat_t)k), mem_peak((mem_cat_t)k), p.bytes[k]);
  train_result_t rw;
  cr_assert_eq(train_run(&whole, NULL, &rw), 0, "%s", err_msg());
  cr_assert(isfinite(r.last_loss));
  cr_assert_float_eq(r.first_loss, rw.first_loss, 1e-6 * rw.first_loss, "chunks: %.9g, all rows "
                     "at once: %.9g", r.first_loss, rw.first_loss);
  cr_assert_float_eq(r.last_loss, rw.last_loss, 1e-4 * rw.last_loss);
  config_t bad = one;
  cr_assert_neq(config_set(&bad, "logits_chunk_mib", "-1"), 0);
  cr_assert(strstr(err_msg(), "logits_chunk_mib"), "%s", err_msg());
  cr_assert_neq(config_set(&bad, "logits_chunk_mib", "4097"), 0, "past 2^30 floats a chunk");
  cr_assert(strstr(err_msg(), "logits_chunk_mib"), "%s", err_msg());
  free(data);
}

Test(plan, model_state_dominated_job_points_at_the_model) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c = job_of(data, "gpt2-124m");
  c.batch = 1;
  c.seq_len = 8;
  cr_assert_eq(config_finish(&c), 0);
  plan_t p;
  cr_assert_eq(plan_job(&c, 1, &p), 0);
  cr_assert_eq(p.bytes[MEM_PARAMS], 124439808u * 4, "4 bytes per parameter");
  cr_assert_eq(p.bytes[MEM_OPTIM], 124439808u * 8, "AdamW m and v");
  cr_assert_eq(plan_check(&p, &c, 1u << 30), FSDP_ENOMEM);
  const char *adv = strstr(err_msg(), "shard the model over ");
  cr_assert(adv, "%s", err_msg());
  /* the advice holds: that many FULL_SHARD ranks fit, half as many do not */
  int w = atoi(adv + strlen("shard the model over "));
  cr_assert_geq(w, 2, "%s", err_msg());
  plan_t pw, ph;
  cr_assert_eq(plan_job(&c, w, &pw), 0);
  cr_assert_leq(pw.total, 1u << 30);
  cr_assert_eq(pw.bytes[MEM_PARAMS] * (size_t)w >= 124439808u * 4, 1, "each rank holds 1/%d", w);
  cr_assert_eq(plan_job(&c, w / 2, &ph), 0);
  cr_assert_gt(ph.total, 1u << 30, "%d ranks would not have fitted", w / 2);
  free(data);
}

/* ---- the sharded runtime: ranks forked in this test, each running train_run */

/* One rank: trains c, then holds each category's measured peak against the
 * plan for its world, as this rank holds it (plan_for_rank); exits 0 when
 * they agree, 1 naming the first that does not. The total peak is at most
 * the plan's total (the sum of the peaks). */
static void plan_rank(const config_t *c, int rank, int world, const char *addrs, int lfd) {
  char v[32];
  snprintf(v, sizeof v, "%d", rank);
  setenv("FSDP_RANK", v, 1);
  snprintf(v, sizeof v, "%d", world);
  setenv("FSDP_WORLD_SIZE", v, 1);
  snprintf(v, sizeof v, "%d", lfd);
  setenv("FSDP_LISTEN_FD", v, 1);
  setenv("FSDP_ADDRS", addrs, 1);
  plan_t p;
  shard_mesh_t m;
  train_result_t r;
  if (plan_job(c, world, &p) || shard_mesh_resolve(c->strategy, c->mesh, world, &m, NULL, 0) ||
      train_run(c, NULL, &r)) {
    fprintf(stderr, "rank %d: %s\n", rank, err_msg());
    _exit(2);
  }
  plan_for_rank(&p, &m, rank);
  int bad = mem_total_peak() > p.total || r.mem_planned != p.total;
  for (int k = 0; k < MEM__COUNT; k++)
    if (mem_peak((mem_cat_t)k) != p.bytes[k]) {
      fprintf(stderr, "rank %d: %s measured %zu, planned %zu\n", rank, mem_cat_name((mem_cat_t)k),
              mem_peak((mem_cat_t)k), p.bytes[k]);
      bad = 1;
    }
  if (bad) _exit(1);
  if (rank == 0)
    fprintf(stderr, "plan: %s %s world %d: measured total peak %.2f MiB = %.3f of the plan's "
            "%.2f MiB\n", c->strategy, c->precision, world, mem_total_peak() / 1048576.0,
            (double)mem_total_peak() / (double)p.total, p.total / 1048576.0);
  _exit(0);
}

static void plan_world(const config_t *c, int world) {
  char addrs[256] = "", addr[32];
  int fds[8];
  for (int r = 0; r < world; r++) {
    fds[r] = tu_listen_loopback(addr, sizeof addr);
    snprintf(addrs + strlen(addrs), sizeof addrs - strlen(addrs), "%s%s", r ? "," : "", addr);
  }
  pid_t pid[8];
  for (int r = 0; r < world; r++) {
    pid[r] = fork();
    cr_assert_neq(pid[r], -1);
    if (!pid[r]) {
      for (int q = 0; q < world; q++)
        if (q != r) close(fds[q]);
      alarm(120); /* a stuck rank ends itself */
      plan_rank(c, r, world, addrs, fds[r]);
    }
  }
  for (int r = 0; r < world; r++) close(fds[r]);
  for (int r = 0; r < world; r++) {
    int st;
    cr_assert_eq(waitpid(pid[r], &st, 0), pid[r]);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s mesh '%s' %s: rank %d of %d: status %d",
              c->strategy, c->mesh, c->precision, r, world, st);
  }
}

/* A sharded job of the tiny preset, 2 steps with an evaluation. */
static config_t sharded(const char *data, const char *strategy, const char *mesh) {
  config_t c = job(data, 0);
  cr_assert_eq(config_set(&c, "strategy", strategy), 0);
  cr_assert_eq(config_set(&c, "mesh", mesh), 0);
  c.threads = 1;
  c.eval_every = 1;
  c.eval_batches = 1;
  return c;
}

Test(plan, equals_what_sharded_ranks_allocate, .timeout = 300) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  const struct {
    const char *strategy, *mesh;
    int world;
  } m[] = {{"FULL_SHARD", "", 2},        {"SHARD_GRAD_OP", "", 2}, {"NO_SHARD", "", 2},
           {"FULL_SHARD", "", 3},        {"HYBRID_SHARD", "2x2", 4},
           {"HYBRID_SHARD_ZERO2", "2x2", 4}, {"FULL_SHARD", "1", 1}};
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    plan_world((config_t[]){sharded(data, m[i].strategy, m[i].mesh)}, m[i].world);
  free(data);
}

Test(plan, equals_what_sharded_ranks_allocate_in_every_mode, .timeout = 300) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c = sharded(data, "FULL_SHARD", "");
  cr_assert_eq(config_set(&c, "precision", "bf16-mixed"), 0);
  plan_world(&c, 2);
  /* one shard: the units' bf16 weights are the master's image (alias16) */
  c = sharded(data, "NO_SHARD", "");
  cr_assert_eq(config_set(&c, "precision", "bf16-mixed"), 0);
  plan_world(&c, 2);
  c = sharded(data, "FULL_SHARD", "1");
  cr_assert_eq(config_set(&c, "precision", "bf16-mixed"), 0);
  plan_world(&c, 1);
  setenv("FSDP_GATHER_ROUND", "1", 1); /* no image: the ranks round at each gather */
  plan_world(&c, 1);
  c = sharded(data, "FULL_SHARD", "");
  cr_assert_eq(config_set(&c, "precision", "bf16-mixed"), 0);
  plan_world(&c, 2);
  unsetenv("FSDP_GATHER_ROUND");
  c = sharded(data, "FULL_SHARD", "");
  c.grad_accum = 2;
  c.keep_unsharded_grads = 1;
  plan_world(&c, 2);
  c.keep_unsharded_grads = 0;
  c.min_params = 30000; /* merged units */
  c.activation_checkpointing = 1;
  plan_world(&c, 3);
  c = sharded(data, "SHARD_GRAD_OP", "");
  c.offload = 1;
  c.sample_tokens = 50;
  cr_assert_eq(config_set(&c, "precision", "bf16-mixed"), 0);
  plan_world(&c, 2);
  free(data);
}

Test(plan, equals_what_bf16_true_ranks_allocate, .timeout = 300) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256), *w = tu_path("plan.weights");
  config_t c = sharded(data, "FULL_SHARD", "");
  cr_assert_eq(config_set(&c, "precision", "bf16-true"), 0);
  cr_assert_eq(config_set(&c, "save", w), 0);
  c.grad_accum = 2;
  plan_world(&c, 2);
  c = sharded(data, "HYBRID_SHARD", "2x2");
  cr_assert_eq(config_set(&c, "precision", "bf16-true"), 0);
  cr_assert_eq(config_set(&c, "init_from", w), 0);
  c.grad_accum = 2;
  c.keep_unsharded_grads = 1;
  c.sample_tokens = 30;
  plan_world(&c, 4);
  c = sharded(data, "NO_SHARD", "");
  cr_assert_eq(config_set(&c, "precision", "bf16-true"), 0);
  c.offload = 1;
  c.min_params = 30000;
  plan_world(&c, 2);
  free(w);
  free(data);
}

Test(plan, reports_both_accumulation_modes) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c = sharded(data, "FULL_SHARD", "");
  cr_assert_eq(config_set(&c, "model", "small"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  c.grad_accum = 4;
  plan_t a, b;
  cr_assert_eq(plan_job(&c, 2, &a), 0);
  c.keep_unsharded_grads = 1;
  cr_assert_eq(plan_job(&c, 2, &b), 0);
  cr_assert_eq(a.grads_keep_unsharded, b.grads_keep_unsharded);
  cr_assert_eq(a.bytes[MEM_GRADS], a.grads_reduce_each);
  cr_assert_eq(b.bytes[MEM_GRADS], b.grads_keep_unsharded);
  /* keeping them: the fp32 gradient shard plus every unit's padded gradient */
  shard_layout_t *l;
  cr_assert_eq(shard_layout_create(&l, &c.gpt, 2, 0), 0);
  cr_assert_eq(b.grads_keep_unsharded, l->shard_total * 4 * 3, "shard + both shards' units");
  shard_layout_destroy(l);
  cr_assert_lt(a.grads_reduce_each, b.grads_keep_unsharded, "4 blocks: reducing each holds 2");
  char buf[1024];
  FILE *f = fmemopen(buf, sizeof buf, "w");
  plan_print(&b, &c, f);
  fclose(f);
  cr_assert(strstr(buf, "keeping unsharded gradients to the last (this job)"), "%s", buf);
  free(data);
}

Test(plan, a_sharded_job_that_does_not_fit_gets_the_strategy_that_does) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c = sharded(data, "SHARD_GRAD_OP", "");
  cr_assert_eq(config_set(&c, "model", "small"), 0);
  c.activation_checkpointing = 1;
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  plan_t p, q;
  cr_assert_eq(plan_job(&c, 4, &p), 0);
  config_t f = c;
  cr_assert_eq(config_set(&f, "strategy", "FULL_SHARD"), 0);
  cr_assert_eq(plan_job(&f, 4, &q), 0);
  cr_assert_lt(q.total, p.total, "FULL_SHARD frees units after use");
  cr_assert_eq(plan_check(&p, &c, (p.total + q.total) / 2), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "strategy = FULL_SHARD") && strstr(err_msg(), "per rank"), "%s",
            err_msg());
  free(data);
}

/* A cuda job recomputes nothing by default (config_recompute: a GPU's
 * memory is the job's); where that plan does not fit, plan_fit_recompute
 * takes the least level that does (1, then 2), and 2 where none does (the
 * fit check then refuses it); a level the job sets, and a cpu job's
 * default (2), are left alone. */
Test(plan, a_cuda_jobs_default_recompute_rises_only_to_fit) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c = job(data, 0);
  cr_assert_eq(config_set(&c, "device", "cuda"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert_eq(config_recompute(&c), 0);
  plan_t p[3];
  for (int level = 0; level < 3; level++) {
    config_t k = c;
    k.recompute = level;
    cr_assert_eq(plan_job(&k, 1, &p[level]), 0);
  }
  cr_assert(p[0].total > p[1].total && p[1].total > p[2].total, "%zu %zu %zu", p[0].total,
            p[1].total, p[2].total);
  config_t d = c;
  plan_t q = p[0];
  cr_assert_eq(plan_fit_recompute(&d, 1, &q, p[0].total), 0, "fits: nothing to do");
  cr_assert_eq(d.recompute, -1);
  /* each limit from the level's plan to one byte below the lower level's */
  const size_t limits[][2] = {{p[1].total, 1}, {p[0].total - 1, 1}, {p[1].total - 1, 2},
                              {p[2].total, 2}, {p[2].total - 1, 2}};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    d = c, q = p[0];
    cr_assert_eq(plan_fit_recompute(&d, 1, &q, limits[i][0]), 1);
    cr_assert_eq(d.recompute, (int)limits[i][1], "limit %zu", limits[i][0]);
    cr_assert(!memcmp(&q, &p[limits[i][1]], sizeof q), "the plan at the level taken");
  }
  cr_assert_eq(plan_check(&q, &d, p[2].total - 1), FSDP_ENOMEM, "none fits: refused");
  d = c, q = p[0];
  cr_assert_eq(config_set(&d, "recompute", "0"), 0);
  cr_assert_eq(plan_fit_recompute(&d, 1, &q, p[1].total), 0, "the job's own level stays");
  cr_assert_eq(d.recompute, 0);
  cr_assert_eq(plan_fit_recompute(&d, 1, &q, 0), 0, "no limit");
  config_t cpu = job(data, 0);
  plan_t pc;
  cr_assert_eq(plan_job(&cpu, 1, &pc), 0);
  cr_assert_eq(plan_fit_recompute(&cpu, 1, &pc, pc.total - 1), 0, "cpu's default is 2 already");
  cr_assert_eq(cpu.recompute, -1);
  free(data);
}

/* An asynchronous checkpoint's snapshot is host memory on a GPU (pinned,
 * ckpt_rank.c), so a cuda job's plan holds it apart (plan_host_bytes) and
 * the GPU's memory is compared with the rest: a limit between the two fits
 * at recompute 0 with the snapshot kept, a lower one raises recompute and
 * still keeps it, and a refusal states both. Before, it counted against the
 * GPU: gpt2-774m on one GPU lost 9.3 GB to it, recomputing or dropping the
 * snapshot for nothing. On a CPU device it is the device's memory. */
Test(plan, a_cuda_jobs_checkpoint_snapshot_is_host_memory_not_the_gpus) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256), *dir = tu_path("ck");
  cr_assert_eq(mkdir(dir, 0755), 0);
  config_t c = job(data, 0);
  cr_assert_eq(config_set(&c, "checkpoint_dir", dir), 0);
  cr_assert_eq(config_set(&c, "checkpoint_every", "1"), 0);
  config_t cpu = c;
  cr_assert_eq(config_set(&c, "device", "cuda"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert_eq(config_finish(&cpu), 0, "%s", err_msg());
  plan_t p[3], pc;
  for (int level = 0; level < 3; level++) {
    config_t k = c;
    k.recompute = level;
    cr_assert_eq(plan_job(&k, 1, &p[level]), 0);
  }
  const size_t snap = p[0].bytes[MEM_SNAPSHOT];
  cr_assert(snap > 0 && p[2].bytes[MEM_SNAPSHOT] == snap);
  cr_assert_eq(plan_host_bytes(&p[0]), snap);
  cr_assert_eq(p[0].device, p[0].total - snap);
  cr_assert_eq(plan_job(&cpu, 1, &pc), 0);
  cr_assert(pc.bytes[MEM_SNAPSHOT] > 0 && pc.device == pc.total && !plan_host_bytes(&pc),
            "a CPU device's snapshot is its own memory");
  /* the GPU holds all but the snapshot: it fits as planned */
  config_t d = c;
  plan_t q = p[0];
  cr_assert_eq(plan_fit_recompute(&d, 1, &q, p[0].device), 0, "fits at level 0");
  cr_assert_eq(plan_fit_snapshot(&d, 1, &q, p[0].device), 0, "the snapshot is not the GPU's");
  cr_assert(d.recompute == -1 && d.checkpoint_async);
  cr_assert_eq(plan_check(&q, &d, p[0].device), 0, "%s", err_msg());
  /* less: a level rises, the snapshot stays */
  cr_assert_eq(plan_fit_recompute(&d, 1, &q, p[1].device), 1);
  cr_assert_eq(plan_fit_snapshot(&d, 1, &q, p[1].device), 0);
  cr_assert(d.recompute == 1 && d.checkpoint_async && q.bytes[MEM_SNAPSHOT] == snap);
  /* refused: the GPU's figure, and the host's apart */
  q = p[0];
  cr_assert_eq(plan_check(&q, &c, p[0].device - 1), FSDP_ENOMEM);
  char want[96];
  snprintf(want, sizeof want, "needs %.0f MiB per rank on its GPU (and %.0f MiB of host memory)",
           p[0].device / 1048576.0, snap / 1048576.0);
  cr_assert(strstr(err_msg(), want) && !strstr(err_msg(), "ckpt_snapshot takes the most"), "%s",
            err_msg());
  /* and the advice's figure is the GPU's too (recompute 2 fits: p[2]) */
  snprintf(want, sizeof want, "set recompute = 2 (the plan is then %.0f MiB on its GPU)",
           p[2].device / 1048576.0);
  cr_assert(strstr(err_msg(), want), "%s", err_msg());
  char line[1024] = "";
  FILE *f = fmemopen(line, sizeof line - 1, "w");
  plan_print(&p[0], &c, f);
  fclose(f);
  snprintf(want, sizeof want, "(gpu=%.1f host=%.1f)", p[0].device / 1048576.0, snap / 1048576.0);
  cr_assert(strstr(line, want), "%s", line);
  /* the rank's share of the host holds the snapshot: kept; one byte less
   * (page-locked, it would meet the OOM killer at the first checkpoint):
   * dropped, checkpoints written in place, the GPU's figure as it was */
  d = c, q = p[0];
  cr_assert_eq(plan_fit_host(&d, 1, &q, snap), 0, "the snapshot fits the host");
  cr_assert_eq(plan_fit_host(&d, 1, &q, 0), 0, "no host limit");
  cr_assert(d.checkpoint_async && q.bytes[MEM_SNAPSHOT] == snap);
  cr_assert_eq(plan_fit_host(&d, 1, &q, snap - 1), 1);
  cr_assert(!d.checkpoint_async && !q.bytes[MEM_SNAPSHOT] && !plan_host_bytes(&q) &&
                q.device == p[0].device, "snapshot %zu, device %zu of %zu", q.bytes[MEM_SNAPSHOT],
            q.device, p[0].device);
  /* a CPU device's snapshot is its own memory (plan_fit_snapshot's) */
  config_t e = cpu;
  plan_t r = pc;
  cr_assert_eq(plan_fit_host(&e, 1, &r, 1), 0);
  cr_assert(e.checkpoint_async && r.bytes[MEM_SNAPSHOT] == pc.bytes[MEM_SNAPSHOT]);
  free(data), free(dir);
}

/* A job that checkpoints asynchronously plans its snapshot (parameters, m
 * and v of the shard), and a run measures exactly that; when only the
 * snapshot does not fit, plan_fit_snapshot turns it off and the plan fits. */
Test(plan, the_checkpoint_snapshot_is_planned_and_falls_back_when_short) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256), *dir = tu_path("ck");
  cr_assert_eq(mkdir(dir, 0755), 0);
  config_t c = job(data, 0);
  snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s", dir);
  c.checkpoint_every = 1;
  plan_t p;
  cr_assert_eq(plan_job(&c, 1, &p), 0);
  cr_assert_eq(p.bytes[MEM_SNAPSHOT], p.bytes[MEM_PARAMS] + p.bytes[MEM_OPTIM],
               "fp32: parameters and m and v");
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  cr_assert_eq(mem_peak(MEM_SNAPSHOT), p.bytes[MEM_SNAPSHOT]);
  config_t d = c;
  const size_t without = p.total - p.bytes[MEM_SNAPSHOT];
  cr_assert_eq(plan_fit_snapshot(&d, 1, &p, without), 1);
  cr_assert(!d.checkpoint_async && p.total == without && !p.bytes[MEM_SNAPSHOT]);
  d = c;
  cr_assert_eq(plan_job(&d, 1, &p), 0);
  cr_assert_eq(plan_fit_snapshot(&d, 1, &p, without - 1), 0, "no fallback when it would not fit");
  cr_assert(d.checkpoint_async);
  free(data), free(dir);
}

/* Only the first replica writes checkpoints, so only its ranks hold a
 * snapshot: a hybrid job's plan (its largest rank's) counts it, and each
 * rank's share of it (plan_for_rank) is what that rank measures. */
Test(plan, the_checkpoint_snapshot_is_planned_where_ranks_write_checkpoints, .timeout = 120) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256), *dir = tu_path("ck");
  cr_assert_eq(mkdir(dir, 0755), 0);
  config_t c = sharded(data, "HYBRID_SHARD", "2x2");
  snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s", dir);
  c.checkpoint_every = 1;
  plan_t p, q;
  shard_mesh_t m;
  cr_assert_eq(plan_job(&c, 4, &p), 0);
  cr_assert_eq(shard_mesh_resolve(c.strategy, c.mesh, 4, &m, NULL, 0), 0);
  cr_assert_gt(p.bytes[MEM_SNAPSHOT], 0);
  q = p;
  plan_for_rank(&q, &m, 1);
  cr_assert(!memcmp(&p, &q, sizeof p), "rank 1 (first replica) holds the job's plan");
  plan_for_rank(&q, &m, 2);
  cr_assert_eq(q.bytes[MEM_SNAPSHOT], 0, "rank 2 (second replica) writes no checkpoint");
  cr_assert_eq(q.total, p.total - p.bytes[MEM_SNAPSHOT]);
  plan_world(&c, 4);
  free(data), free(dir);
}

/* A cuda job plans what the GPU backend keeps for attention: one
 * log-sum-exp per query row where the fused kernel runs (the tiny model's
 * head size, 16, has one), as the CPU does, the probabilities with
 * FSDP_CUDA_ATTN_GEMM=1; nothing else of the plan moves. (The tunable is
 * read once per process, and each test is one.) */
static void cuda_attention_plan(int gemm) {
  if (gemm) cr_assert_eq(setenv("FSDP_CUDA_ATTN_GEMM", "1", 1), 0);
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t cpu = job(data, 0), gpu = cpu;
  cr_assert_eq(config_set(&gpu, "device", "cuda"), 0);
  cr_assert_eq(config_set(&gpu, "recompute", "2"), 0); /* cpu's default; cuda's is 0 */
  cr_assert_eq(config_finish(&gpu), 0, "%s", err_msg());
  plan_t pc, pg;
  cr_assert_eq(plan_job(&cpu, 1, &pc), 0);
  cr_assert_eq(plan_job(&gpu, 1, &pg), 0);
  const size_t B = (size_t)cpu.batch, T = (size_t)cpu.seq_len, NH = (size_t)cpu.gpt.heads;
  const size_t L = (size_t)cpu.gpt.layers, probs = B * NH * T * T, lse = B * NH * T;
  if (gemm)
    cr_assert_eq(pg.bytes[MEM_ACTS] - pc.bytes[MEM_ACTS], L * (probs - lse) * sizeof(float),
                 "every layer keeps B*NH*T*T floats instead of B*NH*T");
  else
    cr_assert_eq(pg.bytes[MEM_ACTS], pc.bytes[MEM_ACTS]);
  cr_assert_eq(pg.bytes[MEM_PARAMS], pc.bytes[MEM_PARAMS]);
  cr_assert_eq(pg.bytes[MEM_OPTIM], pc.bytes[MEM_OPTIM]);
  free(data);
}

/* A bf16 cuda job's attention runs on tensor cores from bf16 copies of
 * qkv and dout in its scratch (attention_tc.cu), or of dout alone where the
 * model keeps qkv in bf16 (kern.h's attention_scratch_bf16): C bf16 a token
 * more workspace than the same job in fp32, whose fused kernels' scratch is
 * the D rows alone; 4C with the activations in fp32 (FSDP_CUDA_ACTS_FP32:
 * qkv too in fp32). */
static size_t cuda_workspace(const char *data, const char *precision, config_t *out) {
  config_t c = job(data, 0);
  cr_assert_eq(config_set(&c, "device", "cuda"), 0);
  cr_assert_eq(config_set(&c, "precision", precision), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  plan_t p;
  cr_assert_eq(plan_job(&c, 1, &p), 0);
  *out = c;
  return p.bytes[MEM_WORKSPACE];
}

static void cuda_attention_copies(int acts_fp32) {
  if (acts_fp32) setenv("FSDP_CUDA_ACTS_FP32", "1", 1); /* this test's own process (criterion) */
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c;
  const size_t w32 = cuda_workspace(data, "fp32", &c), w16 = cuda_workspace(data, "bf16-mixed", &c);
  const size_t B = (size_t)c.batch, T = (size_t)c.seq_len, C = (size_t)c.gpt.channels,
               NH = (size_t)c.gpt.heads;
  /* the copies start at the 16-byte boundary after the D rows */
  const size_t d = B * NH * T, at = (d + 3) / 4 * 4, per_token = acts_fp32 ? 4 * C : C;
  cr_assert_eq(w16 - w32, (at - d) * sizeof(float) + B * T * per_token * 2,
               "bf16 %zu, fp32 %zu: the difference is not the copies of %s", w16, w32,
               acts_fp32 ? "qkv and dout" : "dout");
  free(data);
}

Test(plan, a_bf16_cuda_job_plans_the_tensor_core_attentions_bf16_copy_of_dout) {
  cuda_attention_copies(0);
}

Test(plan, a_bf16_cuda_job_with_fp32_activations_plans_copies_of_qkv_and_dout) {
  cuda_attention_copies(1);
}

/* FSDP_CUDA_ATTN_CUDNN=1: cuDNN's attention (kernels/cuda/cudnn.cu) keeps
 * dq's fp32 accumulator (B T C floats), its engine's workspace (1 MiB) and
 * dqkv in bf16 (where cuDNN writes the gradients so: 6 bytes a token and
 * channel) in the bf16 job's scratch after the D rows and dout's copy (as
 * cuda_attention_copies), each with 256 bytes of room to align it in; an
 * fp32 job's attention is not cuDNN's: the D rows alone. */
Test(plan, a_bf16_cuda_job_with_cudnn_attention_plans_dqs_accumulator_and_workspace) {
  setenv("FSDP_CUDA_ATTN_CUDNN", "1", 1); /* this test's own process (criterion) */
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t c;
  const size_t w32 = cuda_workspace(data, "fp32", &c), w16 = cuda_workspace(data, "bf16-mixed", &c);
  const size_t B = (size_t)c.batch, T = (size_t)c.seq_len, C = (size_t)c.gpt.channels,
               NH = (size_t)c.gpt.heads;
  const size_t d = B * NH * T, at = (d + 3) / 4 * 4;
  cr_assert_eq(w16 - w32,
               (at - d) * sizeof(float) + B * T * C * 2 + (B * T * C + 64 + 64) * sizeof(float) +
                   ((size_t)1 << 20) + 64 * sizeof(float) + B * T * 3 * C * 2,
               "bf16 %zu, fp32 %zu: the difference is not dout's copy, dq's accumulator, "
               "cuDNN's workspace and a bf16 dqkv", w16, w32);
  free(data);
}

/* A cuda job's logits chunk is 1024 MiB unless the job sets one (each chunk
 * reads the embedding twice at memory speed), a cpu job's 128; where the
 * larger chunk alone makes a job not fit, the refusal says to set 128. A
 * vocabulary of 32768 tokens makes a row 128 KiB: 1024 and 128 MiB chunks
 * are 8192 and 1024 rows of the batch's 128 x 64. */
Test(plan, a_cuda_jobs_logits_chunk_is_larger_and_named_when_it_does_not_fit) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  config_t cpu = job_of(data, "tiny");
  cr_assert_eq(config_set(&cpu, "vocab", "32768"), 0, "%s", err_msg());
  cpu.batch = 128, cpu.seq_len = 64;
  config_t gpu = cpu, set = cpu;
  cr_assert_eq(config_set(&gpu, "device", "cuda"), 0);
  cr_assert_eq(config_set(&set, "device", "cuda"), 0);
  cr_assert_eq(config_set(&set, "logits_chunk_mib", "128"), 0);
  cr_assert_eq(config_finish(&cpu), 0, "%s", err_msg());
  cr_assert_eq(config_finish(&gpu), 0, "%s", err_msg());
  cr_assert_eq(config_finish(&set), 0, "%s", err_msg());
  cr_assert_eq(config_logits_chunk_mib(&cpu), GPT_LOGITS_CHUNK_MIB);
  cr_assert_eq(config_logits_chunk_mib(&gpu), GPT_LOGITS_CHUNK_MIB_GPU);
  cr_assert_eq(config_logits_chunk_mib(&set), 128, "the job's own");
  plan_t pc, pg, ps;
  cr_assert_eq(plan_job(&cpu, 1, &pc), 0);
  cr_assert_eq(plan_job(&gpu, 1, &pg), 0, "%s", err_msg());
  cr_assert_eq(plan_job(&set, 1, &ps), 0);
  const size_t row = (size_t)gpt_config_logits_ld(&gpu.gpt) * sizeof(float);
  cr_assert_eq(row, 128u << 10);
  cr_assert_eq(pg.bytes[MEM_ACTS] - ps.bytes[MEM_ACTS], (8192 - 1024) * row,
               "the logits of 7168 rows more at once");
  cr_assert_eq(plan_check(&pg, &gpu, (pg.total + ps.total) / 2), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "set logits_chunk_mib = 128"), "%s", err_msg());
  free(data);
}

/* MEM_ACTS of a cuda job of the tiny model (B 4, T 64) at precision prec,
 * recompute 0, channels C, heads NH. */
static size_t cuda_acts(const char *data, const char *prec, const char *C, const char *NH) {
  config_t c = job_of(data, "tiny");
  cr_assert_eq(config_set(&c, "device", "cuda"), 0);
  cr_assert_eq(config_set(&c, "precision", prec), 0);
  cr_assert_eq(config_set(&c, "channels", C), 0);
  cr_assert_eq(config_set(&c, "heads", NH), 0);
  cr_assert_eq(config_set(&c, "recompute", "0"), 0);
  c.batch = 4, c.seq_len = 64;
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  plan_t p;
  cr_assert_eq(plan_job(&c, 1, &p), 0, "%s", err_msg());
  return p.bytes[MEM_ACTS];
}

/* kern.h's bf16 activations: a bf16 job on a GPU keeps its products' inputs
 * (ln1, ln2, GELU's output a block, lnf) in bf16, as gpt.c lays them out,
 * each block's fc product output (fch, 4 N C: the bf16 GELU reads it), and
 * each block's qkv and attention output (3 N C and N C) where the
 * tensor-core attention takes and writes them so (head sizes 16 to 64)
 * (test_cuda_train holds the plan to the measured peaks on the emulator) */
Test(plan, a_cuda_bf16_job_plans_its_products_inputs_in_bf16) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  const size_t N = 4 * 64, L = 2;
  size_t C = 64; /* heads of 16: qkv too */
  cr_assert_eq(cuda_acts(data, "fp32", "64", "4") - cuda_acts(data, "bf16-mixed", "64", "4"),
               (L * 14 * N * C + N * C) * sizeof(float) / 2);
  cr_assert_eq(cuda_acts(data, "fp32", "64", "4") - cuda_acts(data, "bf16-true", "64", "4"),
               (L * 14 * N * C + N * C) * sizeof(float) / 2);
  C = 256; /* heads of 128: qkv and atty stay fp32 (those kernels do not fit every GPU) */
  cr_assert_eq(cuda_acts(data, "fp32", "256", "2") - cuda_acts(data, "bf16-mixed", "256", "2"),
               (L * 10 * N * C + N * C) * sizeof(float) / 2);
  /* rows of 36 channels are not 16-byte multiples in bf16: fp32 kept */
  cr_assert_eq(cuda_acts(data, "fp32", "36", "4"), cuda_acts(data, "bf16-mixed", "36", "4"));
  free(data);
}

/* With the tunable env set to 1 a cuda bf16 job plans fp32 activations, as
 * the fp32 job's. */
static void cuda_acts_fp32_under(const char *env) {
  setenv(env, "1", 1); /* this test's own process (criterion) */
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  cr_assert_eq(cuda_acts(data, "fp32", "64", "4"), cuda_acts(data, "bf16-mixed", "64", "4"));
  free(data);
}

/* FSDP_CUDA_ACTS_FP32: no bf16 activations at all, for comparison */
Test(plan, a_cuda_bf16_job_with_fp32_activations_asked_plans_fp32) {
  cuda_acts_fp32_under("FSDP_CUDA_ACTS_FP32");
}

/* FSDP_CUDA_ATTN_FP32: the fp32 fused attention reads fp32 qkv; the products'
 * inputs and fch are bf16 still */
Test(plan, a_cuda_bf16_job_with_fp32_attention_plans_fp32_qkv) {
  setenv("FSDP_CUDA_ATTN_FP32", "1", 1); /* this test's own process (criterion) */
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  const size_t N = 4 * 64, C = 64, L = 2;
  cr_assert_eq(cuda_acts(data, "fp32", "64", "4") - cuda_acts(data, "bf16-mixed", "64", "4"),
               (L * 10 * N * C + N * C) * sizeof(float) / 2);
  free(data);
}

/* FSDP_CUDA_GEMM_FAST16BF: cuBLASLt rounds the fp32 operands itself, the
 * table offers no bf16 activations (backend.cu), and the plan counts fp32 */
Test(plan, a_cuda_bf16_job_with_fast16bf_plans_fp32_activations) {
  cuda_acts_fp32_under("FSDP_CUDA_GEMM_FAST16BF");
}

Test(plan, a_cuda_job_plans_the_fused_attentions_log_sum_exp) { cuda_attention_plan(0); }
Test(plan, a_cuda_job_with_attention_by_products_plans_the_probabilities) { cuda_attention_plan(1); }

/* A bf16 cuda job keeps each gathered unit's bf16 gather beside the
 * widened unit for its products (kern.h's weights16, fsdp.c's keep16): 6
 * bytes an element of every unit held, not 4. Under SHARD_GRAD_OP on 2
 * ranks every unit stays, so the peak is the forward's last block landing
 * (4 + 2 bytes an element either way) beside all the units before it: 6
 * bytes an element of every unit kept, else 4 of those before the block and
 * 6 of the block. FSDP_CUDA_WEIGHTS_PACK=1 (the products pack the fp32
 * weights) keeps none; a cpu job's products are fp32: none. On one shard
 * (NO_SHARD) a bf16-mixed unit's bf16 weights are its slice of the master's
 * bf16 image (fsdp.c's alias16): 4 bytes an element of every unit, whether
 * the products read them or not, and the image's 2 bytes an element in
 * params beside the master's 4; with FSDP_GATHER_ROUND=1 (round, no image)
 * one shard lands and keeps as two do, and params are the master's 4. The
 * sizes from the layout. */
static void gathered_check(const char *device, int kept, int round) {
  char *data = tu_token_file("tokens.bin", 20000, 3, 256);
  for (int S = 1; S <= 2; S++) {
    config_t c = job(data, 0);
    cr_assert_eq(config_set(&c, "device", device), 0);
    cr_assert_eq(config_set(&c, "precision", "bf16-mixed"), 0);
    cr_assert_eq(config_set(&c, "strategy", S == 1 ? "NO_SHARD" : "SHARD_GRAD_OP"), 0, "%s", err_msg());
    cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
    plan_t p;
    cr_assert_eq(plan_job(&c, S, &p), 0, "%s", err_msg());
    shard_layout_t *l;
    cr_assert_eq(shard_layout_create(&l, &c.gpt, S, (size_t)c.min_params), 0);
    size_t all = 0;
    for (int k = 0; k < l->num_units; k++) all += l->units[k].shard_numel * (size_t)S;
    const size_t last = l->units[l->unit_of[c.gpt.layers]].shard_numel * (size_t)S;
    const size_t total = l->shard_total;
    shard_layout_destroy(l);
    const int alias16 = S == 1 && !round;
    const size_t want = alias16 ? 4 * all : kept ? 6 * all : 4 * (all - last) + 6 * last;
    cr_assert_eq(p.bytes[MEM_PARAMS_GATHERED], want, "%s S=%d: %zu bytes gathered, not %zu (%s)",
                 device, S, p.bytes[MEM_PARAMS_GATHERED], want,
                 alias16 ? "the image's slices" : kept ? "the bf16 gathers kept" : "none kept");
    cr_assert_eq(p.bytes[MEM_PARAMS], (round ? 4 : 6) * total, "%s S=%d: params %zu bytes, not "
                 "the master%s (%d bytes an element of the shard's %zu)", device, S,
                 p.bytes[MEM_PARAMS], round ? "" : " and its bf16 image", round ? 4 : 6, total);
  }
  free(data);
}

Test(plan, a_bf16_cuda_job_plans_the_bf16_gathers_its_products_read) {
  gathered_check("cuda", 1, 0);
  gathered_check("cpu", 0, 0);
}

Test(plan, a_bf16_mixed_job_that_rounds_at_each_gather_plans_no_image) {
  setenv("FSDP_GATHER_ROUND", "1", 1); /* this test's own process (criterion) */
  gathered_check("cuda", 1, 1);
  gathered_check("cpu", 0, 1);
}

Test(plan, a_bf16_cuda_job_whose_products_pack_the_weights_keeps_no_bf16_gather) {
  setenv("FSDP_CUDA_WEIGHTS_PACK", "1", 1); /* this test's own process (criterion) */
  gathered_check("cuda", 0, 0);
}

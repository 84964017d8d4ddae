/* Tests of checkpoints (daemon/job/ckpt.h, daemon/train/ckpt_rank.h): the
 * shard header's encoding, exact resume, resharding to other meshes and
 * precisions, and damaged checkpoints refused naming the file and section.
 * Jobs run as rank processes through fsdp-launch, as users run them.
 *
 * The reference for what a checkpoint holds is read here, independently of
 * the loader: each shard file's header and params section, placed by the
 * layout's own arithmetic (unit k's shard j holds elements offset + j *
 * shard_numel onward) into the model's flat buffer. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/job/ckpt.h"
#include "daemon/job/config.h"
#include "daemon/train/data.h"
#include "daemon/train/gpt.h"
#include "kernels/kern_math.h"
#include "kernels/kern.h"
#include "tests/unit/testutil.h"

/* paths here are short temporary ones in buffers of PATH_MAX */
#pragma GCC diagnostic ignored "-Wformat-truncation"


static char *g_data;

static const char *data_file(void) {
  if (!g_data) g_data = tu_token_file("ckpt_tokens.bin", 200000, 11, 256);
  return g_data;
}

/* fsdp-launch -n N fsdp-train (tiny, this test's data) ARGS. */
static void launch(int n, const char *args, int want, char *out, size_t len) {
  tu_launch_tiny(n, data_file(), args, want, out, len);
}

static char *mkdir_tmp(const char *name) {
  char *p = tu_path(name);
  cr_assert(mkdir(p, 0755) == 0, "mkdir %s", p);
  return p;
}

/* The model's parameters as the checkpoint in dir stores them (fp32; a bf16
 * section widened), read from its shard files without the loader. */
static float *ckpt_params(const char *dir, size_t *numel) {
  ckpt_manifest_t m;
  cr_assert_eq(ckpt_manifest_read(dir, &m), 0, "%s", err_msg());
  const size_t n = gpt_config_num_params(&m.model);
  float *w = calloc(n, sizeof *w);
  for (int j = 0; j < m.shards; j++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, m.shard[j].name);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0, "%s", path);
    ckpt_header_t h;
    cr_assert_eq(ckpt_header_read(fd, path, &h), 0, "%s", err_msg());
    const ckpt_section_t *s = &h.sec[0];
    cr_assert_eq(s->kind, CKPT_SEC_PARAMS);
    const size_t e = ckpt_dtype_bytes(s->dtype);
    uint8_t *buf = malloc(s->bytes);
    cr_assert_eq(pread(fd, buf, s->bytes, (off_t)s->offset), (ssize_t)s->bytes);
    size_t at = 0; /* unit k's place in the shard */
    for (uint32_t k = 0; k < h.num_units; k++) {
      const shard_unit_t *u = &h.units[k];
      const size_t first = (size_t)j * u->shard_numel;
      const size_t real = u->numel > first ? (u->numel - first < u->shard_numel ? u->numel - first
                                                                                : u->shard_numel)
                                           : 0;
      for (size_t i = 0; i < real; i++) {
        const uint8_t *x = buf + (at + i) * e;
        float v;
        if (e == 4) memcpy(&v, x, 4);
        else v = kern_bf16_to_f32((uint16_t)(x[0] | x[1] << 8));
        w[u->offset + first + i] = v;
      }
      at += u->shard_numel;
    }
    free(buf);
    ckpt_header_free(&h);
    close(fd);
  }
  *numel = n;
  ckpt_manifest_free(&m);
  return w;
}

/* The parameters of a weights file fsdp-train saved. */
static float *weights(const char *path, size_t *numel) {
  gpt_t *g;
  cr_assert_eq(gpt_load(&g, path, kern_cpu()), 0, "%s", err_msg());
  *numel = gpt_num_params(g);
  float *w = malloc(*numel * sizeof *w);
  memcpy(w, gpt_params(g), *numel * sizeof *w);
  gpt_destroy(g);
  return w;
}

/* ---- the header ------------------------------------------------------------ */

static void header_of(ckpt_header_t *h, shard_layout_t **lay) {
  gpt_config_t cfg;
  cr_assert_eq(gpt_config_preset(&cfg, "tiny"), 0);
  cr_assert_eq(shard_layout_create(lay, &cfg, 3, 0), 0);
  memset(h, 0, sizeof *h);
  h->shard_rank = 2, h->shards = 3, h->replicas = 2, h->strategy = SHARD_HYBRID_SHARD;
  h->precision = 1, h->model = cfg, h->shard_total = (*lay)->shard_total, h->step = 77;
  h->data_epoch = 3, h->data_window = 12345, h->adam_steps = 77, h->seed = 0xfeedULL;
  h->run = 0x5eed5eedULL;
  h->sched = (ckpt_sched_t){.batch = 8, .seq_len = 64, .steps = 300, .warmup_steps = 20,
                            .lr = 3e-3f, .min_lr_frac = 0.1f, .data_tokens = 900001,
                            .data_train_tokens = 810016, .data_sum = 0x0123456789abcdefULL};
  h->num_units = (uint32_t)(*lay)->num_units;
  h->units = malloc(h->num_units * sizeof *h->units);
  memcpy(h->units, (*lay)->units, h->num_units * sizeof *h->units);
  h->num_sections = CKPT_SECTIONS;
  const uint32_t dt[3] = {CKPT_DTYPE_F32, CKPT_DTYPE_BF16, CKPT_DTYPE_BF16};
  for (int i = 0; i < 3; i++)
    h->sec[i] = (ckpt_section_t){(uint32_t)i + 1, dt[i], 0, h->shard_total * ckpt_dtype_bytes(dt[i]), NULL};
  cr_assert_eq(ckpt_header_layout(h), 0);
  uint64_t st = 5;
  for (int i = 0; i < 3; i++)
    for (uint64_t k = 0; k < ckpt_blocks(h->sec[i].bytes); k++) h->sec[i].sums[k] = tu_rand_u64(&st);
}

/* Encoded and decoded, every field comes back; any one byte of the header
 * changed, it is refused with a message. */
Test(ckpt, header_round_trip_and_every_changed_byte_is_refused) {
  ckpt_header_t h, d;
  shard_layout_t *lay;
  header_of(&h, &lay);
  uint8_t *p;
  cr_assert_eq(ckpt_header_encode(&h, &p), 0);
  cr_assert_eq(ckpt_header_decode(p, h.header_bytes, "t", &d), 0, "%s", err_msg());
  cr_assert(d.shard_rank == 2 && d.shards == 3 && d.replicas == 2 && d.step == 77 &&
            d.data_epoch == 3 && d.data_window == 12345 && d.adam_steps == 77 &&
            !memcmp(&d.sched, &h.sched, sizeof d.sched) &&
            d.seed == 0xfeedULL && d.run == 0x5eed5eedULL && d.num_units == h.num_units &&
            d.sum == h.sum &&
            !memcmp(&d.model, &h.model, sizeof d.model));
  for (uint32_t k = 0; k < d.num_units; k++)
    cr_assert(!memcmp(&d.units[k], &h.units[k], sizeof d.units[k]), "unit %u", k);
  for (int i = 0; i < 3; i++) {
    cr_assert(d.sec[i].offset == h.sec[i].offset && d.sec[i].bytes == h.sec[i].bytes &&
              d.sec[i].offset % CKPT_ALIGN == 0);
    for (uint64_t k = 0; k < ckpt_blocks(d.sec[i].bytes); k++)
      cr_assert_eq(d.sec[i].sums[k], h.sec[i].sums[k]);
  }
  ckpt_header_free(&d);
  for (uint64_t i = 0; i < h.header_bytes; i++) {
    p[i] ^= 0x10;
    cr_assert_neq(ckpt_header_decode(p, h.header_bytes, "t", &d), 0, "byte %lu changed, accepted",
                  (unsigned long)i);
    cr_assert(strstr(err_msg(), "t: "), "%s", err_msg());
    p[i] ^= 0x10;
  }
  /* cut short anywhere: refused */
  for (uint64_t n = 0; n < h.header_bytes; n += 7)
    cr_assert_neq(ckpt_header_decode(p, n, "t", &d), 0, "cut at %lu, accepted", (unsigned long)n);
  free(p);
  ckpt_header_free(&h);
  shard_layout_destroy(lay);
}

/* ---- resume ---------------------------------------------------------------- */

/* The progress line of step s ("step     9/12 | loss 5.1234 | lr ...") up to
 * its timing, from fsdp-launch's output. */
static void step_line(const char *out, int s, int steps, char *buf, size_t len) {
  char key[64];
  snprintf(key, sizeof key, "[rank 0] step %5d/%d | loss", s, steps);
  const char *p = strstr(out, key);
  cr_assert_not_null(p, "no line for step %d in:\n%s", s, out);
  const char *end = strstr(p, " | norm");
  cr_assert_not_null(end);
  end = strchr(end + 7, '|'); /* past the norm */
  snprintf(buf, len, "%.*s", (int)(end - p), p);
}

/* A job resumed from its step-8 checkpoint ends with the same bytes as the
 * run that went on: every shard file of step 12 (parameters, AdamW m and v,
 * step, data position) is identical but for the run's id in its header
 * (and so the header's checksum), and so are steps 9-12's losses. */
Test(ckpt, resume_is_exact, .timeout = 120) {
  char *a = mkdir_tmp("resume-a"), *b = mkdir_tmp("resume-b"), args[4096];
  static char out_a[1 << 17], out_b[1 << 17];
  snprintf(args, sizeof args, "--steps 12 --batch 2 --checkpoint_dir %s --checkpoint_every 4", a);
  launch(2, args, 0, out_a, sizeof out_a);
  cr_assert_not_null(strstr(out_a, "checkpoint step 12"), "%s", out_a);
  snprintf(args, sizeof args, "--steps 12 --batch 2 --checkpoint_dir %s --checkpoint_every 4 "
           "--resume_from %s/step-00000008", b, a);
  launch(2, args, 0, out_b, sizeof out_b);
  cr_assert_not_null(strstr(out_b, "resumed from"), "%s", out_b);
  cr_assert_null(strstr(out_b, "step     8/12"), "the resumed run redid step 8:\n%s", out_b);
  for (int s = 9; s <= 12; s++) {
    char la[256], lb[256];
    step_line(out_a, s, 12, la, sizeof la);
    step_line(out_b, s, 12, lb, sizeof lb);
    cr_assert_str_eq(la, lb, "step %d", s);
  }
  for (int j = 0; j < 2; j++) {
    char pa[4096], pb[4096], name[CKPT_NAME_MAX];
    ckpt_shard_name(name, sizeof name, j, 2);
    snprintf(pa, sizeof pa, "%s/step-00000012/%s", a, name);
    snprintf(pb, sizeof pb, "%s/step-00000012/%s", b, name);
    size_t na, nb;
    char *fa = tu_slurp(pa, &na), *fb = tu_slurp(pb, &nb);
    cr_assert(na == nb && na > 152, "%s and %s differ in size", pa, pb);
    /* all but the run's id (bytes 136..143) and so the header's checksum
     * (its last 8 bytes, at the length given at byte 24) */
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)(uint8_t)fa[24 + i] << (8 * i);
    cr_assert(hl <= na && hl > 152);
    memset(fa + 136, 0, 8), memset(fb + 136, 0, 8);
    memset(fa + hl - 8, 0, 8), memset(fb + hl - 8, 0, 8);
    cr_assert(!memcmp(fa, fb, na), "%s and %s differ", pa, pb);
    free(fa), free(fb);
  }
  free(a), free(b);
}

/* Checkpoints written by earlier builds (shard versions 1 and 2: no run id;
 * a data position in batches, not windows; version 3: no record of the
 * token file), kept in tests/fixtures (its
 * README says how they were made), still resume: resumed from their step 4,
 * a run of this build reaches step 8 with the parameters the run that wrote
 * them had there (within 1e-5 of each value's size: the kernels' sums have
 * changed order since, by ulps), so their sections, schedule and data
 * position were read as meant (a position read wrong trains on other
 * batches, off by about the learning rate). */
Test(ckpt, checkpoints_of_earlier_versions_resume, .timeout = 60) {
  char *data = tu_token_file("fixture_tokens.bin", 200000, 11, 64);
  static char out[1 << 16];
  for (int v = 1; v <= 3; v++) {
    char fx[4096], shard[4200], args[8192], name[32];
    snprintf(fx, sizeof fx, "%s/tests/fixtures/ckpt-v%d", tu_root(), v);
    snprintf(shard, sizeof shard, "%s/step-00000004/shard-00000-of-00001.fsdp", fx);
    int fd = open(shard, O_RDONLY);
    cr_assert_geq(fd, 0, "%s", shard);
    ckpt_header_t h;
    cr_assert_eq(ckpt_header_read(fd, shard, &h), 0, "%s", err_msg());
    cr_assert_eq(h.version, (uint32_t)v, "the fixture %s is of version %u", shard, h.version);
    ckpt_header_free(&h);
    close(fd);
    snprintf(name, sizeof name, "old-v%d", v);
    char *ck = mkdir_tmp(name);
    snprintf(args, sizeof args, "--layers 1 --channels 8 --heads 2 --vocab 64 --context 32 "
             "--steps 8 --batch 2 --checkpoint_every 4 --checkpoint_dir %s "
             "--resume_from %s/step-00000004", ck, fx);
    tu_launch_tiny(1, data, args, 0, out, sizeof out);
    cr_assert(strstr(out, "resumed from") && (v == 3) == !strstr(out, "older checkpoint"), "%s",
              out);
    cr_assert_null(strstr(out, "token file"), "a checkpoint without its token file's record "
                   "is taken as this job's, quietly:\n%s", out);
    char want_dir[4200], got_dir[4200];
    snprintf(want_dir, sizeof want_dir, "%s/step-00000008", fx);
    snprintf(got_dir, sizeof got_dir, "%s/step-00000008", ck);
    size_t nw, ng;
    float *want = ckpt_params(want_dir, &nw), *got = ckpt_params(got_dir, &ng);
    cr_assert_eq(nw, ng);
    double worst = 0;
    for (size_t i = 0; i < nw; i++) {
      const double d = fabs((double)got[i] - want[i]) / fmax(1.0, fabs(want[i]));
      if (d > worst) worst = d;
    }
    cr_log_info("version %d: step 8 parameters within %.2e of the writer's", v, worst);
    cr_expect_leq(worst, 1e-5, "version %d: a parameter is %.3e off the writer's", v, worst);
    free(want), free(got), free(ck);
  }
  free(data);
}

/* The data position and global batch a checkpoint's shard 0 records. */
static data_pos_t ckpt_pos(const char *root, int step, int shards, int *batch) {
  char path[4200];
  snprintf(path, sizeof path, "%s/step-%08d/shard-00000-of-%05d.fsdp", root, step, shards);
  int fd = open(path, O_RDONLY);
  cr_assert_geq(fd, 0, "%s", path);
  ckpt_header_t h;
  cr_assert_eq(ckpt_header_read(fd, path, &h), 0, "%s", err_msg());
  close(fd);
  data_pos_t pos = {h.data_epoch, h.data_window};
  *batch = h.sched.batch;
  ckpt_header_free(&h);
  return pos;
}

/* A run of 4 ranks x batch 2 (global batch 8) checkpointed at step 2 goes
 * on under 2 ranks x batch 4 (the same global batch) and under 2 ranks x
 * batch 2 (4) at the first window it has not read. Each checkpoint after
 * the resume records the position a walk of the data API from a fresh
 * position gives (2 batches of 8, then batches of the new size), and the
 * windows that walk reads are the uninterrupted order's next ones (read one
 * window at a time from a fresh position): no window repeated or skipped.
 * Under the same global batch the losses are the uninterrupted run's. */
Test(ckpt, a_resume_under_another_global_batch_reads_the_next_unread_windows, .timeout = 180) {
  enum { T = 32, K = 2, STEPS = 4 };
  static char out_a[1 << 17], out[1 << 17];
  char *a = mkdir_tmp("regrid-a"), args[4096], from[4200];
  snprintf(args, sizeof args, "--steps %d --batch 2 --checkpoint_dir %s --checkpoint_every 1 "
           "--keep_checkpoints 0", STEPS, a);
  launch(4, args, 0, out_a, sizeof out_a);
  snprintf(from, sizeof from, "%s/step-%08d", a, K);
  config_t c;
  config_default(&c);
  data_t *d;
  cr_assert_eq(data_open(&d, data_file(), 256, c.eval_fraction, T), FSDP_OK, "%s", err_msg());
  enum { MAXW = K * 8 + (STEPS - K) * 8 };
  static int32_t order[MAXW * T], in[8 * T], tg[8 * T];
  data_pos_t one = {0, 0};
  for (int w = 0; w < MAXW; w++)
    cr_assert_eq(data_next_batch(d, &one, c.seed, 1, T, order + (size_t)w * T, tg), FSDP_OK);
  int batch;
  data_pos_t saved = {0, 0};
  for (int k = 0; k < K; k++)
    cr_assert_eq(data_next_batch(d, &saved, c.seed, 8, T, in, tg), FSDP_OK, "%s", err_msg());
  data_pos_t at = ckpt_pos(a, K, 4, &batch);
  cr_assert(at.epoch == saved.epoch && at.window == saved.window && batch == 8,
            "step %d of 4 x 2 records (%llu, %llu), batch %d", K,
            (unsigned long long)at.epoch, (unsigned long long)at.window, batch);
  const struct { int ranks, batch; } then[] = {{2, 4}, {2, 2}};
  for (size_t i = 0; i < sizeof then / sizeof *then; i++) {
    const int B = then[i].ranks * then[i].batch;
    char *dir = tu_path(i ? "regrid-c" : "regrid-b");
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(args, sizeof args, "--steps %d --batch %d --checkpoint_dir %s --checkpoint_every 1 "
             "--keep_checkpoints 0 --resume_from %s", STEPS, then[i].batch, dir, from);
    launch(then[i].ranks, args, 0, out, sizeof out);
    cr_assert_not_null(strstr(out, "resumed from"), "%s", out);
    if (B != 8) {
      char note[128];
      snprintf(note, sizeof note, "batch x ranks 8 -> %d (the windows one micro-batch draws", B);
      cr_assert_not_null(strstr(out, note), "no note on the changed batch:\n%s", out);
    }
    data_pos_t pos = saved;
    size_t read = (size_t)K * 8;
    for (int s = K + 1; s <= STEPS; s++) {
      cr_assert_eq(data_next_batch(d, &pos, c.seed, B, T, in, tg), FSDP_OK, "%s", err_msg());
      cr_assert_eq(memcmp(in, order + read * T, (size_t)B * T * sizeof *in), 0,
                   "%d ranks x batch %d, step %d: not the next unread windows", then[i].ranks,
                   then[i].batch, s);
      read += (size_t)B;
      at = ckpt_pos(dir, s, then[i].ranks, &batch);
      cr_assert(at.epoch == pos.epoch && at.window == pos.window && batch == B,
                "%d ranks x batch %d, step %d records (%llu, %llu), batch %d; the data API "
                "says (%llu, %llu)", then[i].ranks, then[i].batch, s,
                (unsigned long long)at.epoch, (unsigned long long)at.window, batch,
                (unsigned long long)pos.epoch, (unsigned long long)pos.window);
      if (B == 8) { /* the same batches: the same losses, within the sums' order */
        float la, lb;
        char key[64];
        snprintf(key, sizeof key, "[rank 0] step %5d/%d | loss", s, STEPS);
        const char *pa = strstr(out_a, key), *pb = strstr(out, key);
        cr_assert(pa && pb, "no line for step %d", s);
        cr_assert_eq(sscanf(pa + strlen(key), "%f", &la), 1);
        cr_assert_eq(sscanf(pb + strlen(key), "%f", &lb), 1);
        cr_assert_leq(fabsf(la - lb), 1e-4f, "step %d: loss %f, uninterrupted %f", s, lb, la);
      }
    }
    free(dir);
  }
  data_close(d);
  free(a);
}

/* A resume under another seq_len cannot keep the order (its windows are
 * others): it goes on at the same token offset into the epoch, in the order
 * of the new windows, and says so; another steps or lr is said as a changed
 * learning-rate curve. Nothing is said when nothing changed. */
Test(ckpt, a_resume_under_another_seq_len_or_schedule_says_what_it_means, .timeout = 120) {
  static char out[1 << 17];
  char *a = mkdir_tmp("reseq-a"), *b = mkdir_tmp("reseq-b"), args[4096];
  snprintf(args, sizeof args, "--steps 4 --batch 2 --checkpoint_dir %s --checkpoint_every 2", a);
  launch(2, args, 0, out, sizeof out);
  snprintf(args, sizeof args, "--steps 6 --batch 2 --seq_len 16 --lr 1e-3 --checkpoint_dir %s "
           "--checkpoint_every 3 --resume_from %s/step-00000002", b, a);
  launch(2, args, 0, out, sizeof out);
  cr_assert_not_null(strstr(out, "train: note: seq_len 32 -> 16: "), "%s", out);
  cr_assert_not_null(strstr(out, "the data continues at the same share of epoch 0 (8 windows "
                            "of 32 tokens read: window 16 of 16 tokens)"), "%s", out);
  cr_assert_not_null(strstr(out, "the learning-rate schedule changed (lr 0.003 -> 0.001, "
                            "steps 4 -> 6): step 3 goes on at this job's rate"), "%s", out);
  cr_assert_null(strstr(out, "global batch"), "the global batch did not change:\n%s", out);
  int batch;
  data_pos_t at = ckpt_pos(b, 3, 2, &batch); /* step 3: one batch of 4 after window 16 */
  cr_assert(at.epoch == 0 && at.window == 20 && batch == 4, "(%llu, %llu), batch %d",
            (unsigned long long)at.epoch, (unsigned long long)at.window, batch);
  /* a run longer than the checkpoint's, from its end: that run had no rate
   * for the next step (its curve, carried past its end, climbs again) */
  snprintf(args, sizeof args, "--steps 6 --batch 2 --resume_from %s/step-00000004", a);
  launch(2, args, 0, out, sizeof out);
  cr_assert_not_null(strstr(out, "(steps 4 -> 6): step 5 goes on at this job's rate for it, "),
                     "%s", out);
  cr_assert_not_null(strstr(out, "(the checkpoint's run had ended at step 4, at "), "%s", out);
  cr_assert_null(strstr(out, "would have used"), "%s", out);
  /* and unchanged, nothing is said */
  snprintf(args, sizeof args, "--steps 4 --batch 2 --resume_from %s/step-00000002", a);
  launch(2, args, 0, out, sizeof out);
  cr_assert_not_null(strstr(out, "resumed from"), "%s", out);
  cr_assert_null(strstr(out, "train: note: seq_len"), "%s", out);
  cr_assert_null(strstr(out, "learning-rate schedule changed"), "%s", out);
  cr_assert_null(strstr(out, "global batch"), "%s", out);
  cr_assert_null(strstr(out, "token file"), "%s", out);
  free(a), free(b);
}

/* A run extended without warmup_steps given: the default warmup shrank to
 * the first run's steps and grows with the new ones, so the note says
 * warmup_steps changed though the user never set it; it says why and how
 * to keep the run's. */
Test(ckpt, a_default_warmup_that_follows_steps_is_explained_on_resume, .timeout = 60) {
  static char out[1 << 16];
  char *a = mkdir_tmp("rewarm-a"), cmd[8192];
  snprintf(cmd, sizeof cmd, "-n 1 -- %s/bin/fsdp-train --model tiny --seq_len 32 --eval_batches 2 "
           "--sample_tokens 0 --eval_every 0 --data %s --steps 4 --checkpoint_dir %s "
           "--checkpoint_every 4", tu_root(), data_file(), a);
  cr_assert_eq(tu_run_bin("fsdp-launch", cmd, out, sizeof out), 0, "%s", out);
  snprintf(cmd, sizeof cmd, "-n 1 -- %s/bin/fsdp-train --model tiny --seq_len 32 --eval_batches 2 "
           "--sample_tokens 0 --eval_every 0 --data %s --steps 6 --checkpoint_dir %s", tu_root(),
           data_file(), a);
  cr_assert_eq(tu_run_bin("fsdp-launch", cmd, out, sizeof out), 0, "%s", out);
  cr_assert_not_null(strstr(out, "warmup_steps 4 -> 6 (not given: its default shrinks to a "
                            "shorter run's steps; set warmup_steps to keep the run's)"), "%s", out);
  free(a);
}

/* The training split's tokens of this test's file at eval_fraction f, T 32. */
static size_t train_tokens(double f) {
  data_t *d;
  cr_assert_eq(data_open(&d, data_file(), 256, f, 32), 0, "%s", err_msg());
  const size_t n = data_num_train_tokens(d);
  data_close(d);
  return n;
}

/* A checkpoint records the token file its run read (its tokens, training
 * split and XXH64). A resume on another file starts that file from its
 * beginning, saying so: two steps after the resume it is where a fresh
 * run is after two steps, not four. One on the same file split elsewhere
 * (eval_fraction) goes on at the same share of the epoch, saying which
 * tokens changed sides. */
Test(ckpt, a_resume_on_another_token_file_or_split_says_what_it_means, .timeout = 120) {
  static char out[1 << 17];
  char *a = mkdir_tmp("redata-a"), *b = mkdir_tmp("redata-b"), *c = mkdir_tmp("redata-c");
  char *other = tu_token_file("ckpt_other_tokens.bin", 200000, 12, 256), args[4096];
  snprintf(args, sizeof args, "--steps 4 --batch 2 --checkpoint_dir %s --checkpoint_every 2", a);
  launch(2, args, 0, out, sizeof out);
  int batch;
  const data_pos_t two = ckpt_pos(a, 2, 2, &batch), four = ckpt_pos(a, 4, 2, &batch);
  cr_assert(two.window == 8 && four.window == 16, "%llu %llu", (unsigned long long)two.window,
            (unsigned long long)four.window);

  snprintf(args, sizeof args, "--steps 4 --batch 2 --checkpoint_dir %s --checkpoint_every 4 "
           "--resume_from %s/step-00000002", b, a);
  tu_launch_tiny(2, other, args, 0, out, sizeof out);
  cr_assert_not_null(strstr(out, "is not the token file the checkpoint's run read (200000 "
                            "tokens"), "%s", out);
  cr_assert_not_null(strstr(out, "the data starts at the beginning of this file's order (epoch "
                            "0, window 0), not at the checkpoint's position (epoch 0, window "
                            "8)"), "%s", out);
  data_pos_t at = ckpt_pos(b, 4, 2, &batch);
  cr_assert(at.epoch == two.epoch && at.window == two.window, "(%llu, %llu): not two batches "
            "from the start", (unsigned long long)at.epoch, (unsigned long long)at.window);

  const size_t was = train_tokens(0.1), now = train_tokens(0.3);
  cr_assert_lt(now, was);
  snprintf(args, sizeof args, "--steps 4 --batch 2 --eval_fraction 0.3 --checkpoint_dir %s "
           "--checkpoint_every 4 --resume_from %s/step-00000002", c, a);
  launch(2, args, 0, out, sizeof out);
  char want[512];
  snprintf(want, sizeof want, "the token file's training split is its first %zu tokens now, %zu "
           "in the checkpoint's run (eval_fraction or seq_len changed): tokens [%zu, %zu) were "
           "trained on and are held out now", now, was, now, was);
  cr_assert_not_null(strstr(out, want), "%s missing in:\n%s", want, out);
  cr_assert_null(strstr(out, "is not the token file"), "%s", out);
  at = ckpt_pos(c, 4, 2, &batch);
  const uint64_t share = (uint64_t)((double)two.window * (double)now / (double)was);
  cr_assert(at.epoch == 0 && at.window == share + 8, "(%llu, %llu), not window %llu + 8",
            (unsigned long long)at.epoch, (unsigned long long)at.window,
            (unsigned long long)share);
  free(a), free(b), free(c), free(other);
}

/* ---- reshard ---------------------------------------------------------------- */

/* A checkpoint saved under 1x4 FULL_SHARD loads under 1, 2x1, 1x3, 2x2 HYBRID
 * and bf16-true with every parameter equal to the stored value (rounded to
 * bf16 under bf16-true); training resumed under 1x3 ends where one device
 * does (the same global batch of 12); and that 1x3 checkpoint loads back
 * under 1x4. */
Test(ckpt, reshards_to_any_mesh_and_back, .timeout = 240) {
  static char out[1 << 17];
  char *a = mkdir_tmp("reshard-a"), *c3 = mkdir_tmp("reshard-c3"), *one = tu_path("one.bin");
  char args[4096], dir8[4096], dir12[4096];
  snprintf(args, sizeof args, "--steps 12 --batch 3 --checkpoint_dir %s --checkpoint_every 8", a);
  launch(4, args, 0, out, sizeof out);
  snprintf(dir8, sizeof dir8, "%s/step-00000008", a);
  size_t n, m;
  float *stored = ckpt_params(dir8, &n);
  struct { int ranks; const char *extra; } meshes[] = {
      {1, "--batch 12"},
      {2, "--batch 6 --strategy HYBRID_SHARD --mesh 2x1"},
      {3, "--batch 4 --mesh 1x3"},
      {4, "--batch 3 --strategy HYBRID_SHARD --mesh 2x2"},
      {4, "--batch 3 --precision bf16-true"},
  };
  for (size_t i = 0; i < sizeof meshes / sizeof *meshes; i++) {
    char *w = tu_path("resharded.bin");
    snprintf(args, sizeof args, "--steps 8 %s --resume_from %s --save %s", meshes[i].extra, dir8, w);
    launch(meshes[i].ranks, args, 0, out, sizeof out);
    float *got = weights(w, &m);
    cr_assert_eq(m, n);
    const int bf16 = strstr(meshes[i].extra, "bf16-true") != NULL;
    for (size_t k = 0; k < n; k++) {
      const float want = bf16 ? kern_bf16_to_f32(kern_f32_to_bf16(stored[k])) : stored[k];
      cr_assert(!memcmp(&got[k], &want, sizeof want), "%d ranks %s: parameter %zu is %.9g, the "
                "checkpoint holds %.9g", meshes[i].ranks, meshes[i].extra, k, got[k], want);
    }
    free(got), free(w);
  }
  /* training goes on under 1x3 as one device trains the same batches */
  snprintf(args, sizeof args, "--steps 12 --batch 12 --save %s", one);
  launch(1, args, 0, out, sizeof out);
  char *w3 = tu_path("three.bin");
  snprintf(args, sizeof args, "--steps 12 --batch 4 --mesh 1x3 --resume_from %s --save %s "
           "--checkpoint_dir %s --checkpoint_every 4", dir8, w3, c3);
  launch(3, args, 0, out, sizeof out);
  float *ref = weights(one, &m), *got = weights(w3, &m);
  gpt_t *g;
  cr_assert_eq(gpt_load(&g, one, kern_cpu()), 0);
  for (int t = 0; t < gpt_num_tensors(g); t++) {
    const gpt_tensor_t *x = gpt_tensor(g, t);
    if (strstr(x->name, "qkv.b")) continue; /* the key bias gets no gradient: test_fsdp.c */
    double e = tu_rel_err_f32f32(got + x->offset, ref + x->offset, x->numel);
    cr_assert_leq(e, 1e-5, "%s: resumed under 1x3 differs from one device by %.3e", x->name, e);
  }
  gpt_destroy(g);
  /* and back: 1x3's step 12 under 1x4 */
  snprintf(dir12, sizeof dir12, "%s/step-00000012", c3);
  float *stored12 = ckpt_params(dir12, &n);
  char *w4 = tu_path("back.bin");
  snprintf(args, sizeof args, "--steps 12 --batch 3 --resume_from %s --save %s", c3, w4);
  launch(4, args, 0, out, sizeof out);
  float *back = weights(w4, &m);
  cr_assert(!memcmp(back, stored12, n * sizeof *back), "1x3's checkpoint loaded under 1x4 differs");
  free(stored), free(stored12), free(ref), free(got), free(back);
  free(a), free(c3), free(one), free(w3), free(w4);
}

/* ---- damage ------------------------------------------------------------------ */

static void copy_file(const char *from, const char *to) {
  size_t n;
  char *p = tu_slurp(from, &n);
  tu_write_file(to, p, n);
  free(p);
}

/* A copy of the 2-shard checkpoint src in dst (a step directory). */
static void copy_ckpt(const char *src, const char *dst) {
  mkdir(dst, 0755);
  const char *names[] = {"shard-00000-of-00002.fsdp", "shard-00001-of-00002.fsdp", CKPT_MANIFEST};
  for (int i = 0; i < 3; i++) {
    char f[4096], t[4096];
    snprintf(f, sizeof f, "%s/%s", src, names[i]);
    snprintf(t, sizeof t, "%s/%s", dst, names[i]);
    copy_file(f, t);
  }
}

/* Changes one byte of path at off. */
static void flip(const char *path, off_t off) {
  int fd = open(path, O_RDWR);
  cr_assert_geq(fd, 0);
  uint8_t x;
  cr_assert_eq(pread(fd, &x, 1, off), 1);
  x ^= 0x01;
  cr_assert_eq(pwrite(fd, &x, 1, off), 1);
  close(fd);
}

/* Resuming from dir fails, and the message holds every one of want. */
static void refused(const char *dir, const char *const *want) {
  static char out[1 << 16];
  char args[4096];
  snprintf(args, sizeof args, "--steps 12 --batch 2 --resume_from %s", dir);
  launch(2, args, 1, out, sizeof out);
  for (; *want; want++) cr_assert_not_null(strstr(out, *want), "no \"%s\" in:\n%s", *want, out);
}

/* A changed byte in any section, a truncated shard, a manifest its shards
 * contradict, a shard another run wrote, a missing manifest: never loaded, and
 * the error names the file and, for data, the section. The latest committed
 * checkpoint is found past an uncommitted one. */
Test(ckpt, damaged_checkpoints_never_load, .timeout = 120) {
  static char out[1 << 17];
  char *root = mkdir_tmp("damage"), args[4096], good[4096], bad[4096], path[4096];
  snprintf(args, sizeof args, "--steps 8 --batch 2 --checkpoint_dir %s --checkpoint_every 4", root);
  launch(2, args, 0, out, sizeof out);
  snprintf(good, sizeof good, "%s/step-00000008", root);
  snprintf(bad, sizeof bad, "%s/bad", tu_tmpdir());
  ckpt_header_t h;
  snprintf(path, sizeof path, "%s/shard-00001-of-00002.fsdp", good);
  int fd = open(path, O_RDONLY);
  cr_assert_eq(ckpt_header_read(fd, path, &h), 0);
  close(fd);
  snprintf(path, sizeof path, "%s/shard-00001-of-00002.fsdp", bad);
  for (int i = 0; i < CKPT_SECTIONS; i++) {
    copy_ckpt(good, bad);
    flip(path, (off_t)(h.sec[i].offset + h.sec[i].bytes - 3));
    char sec[64];
    snprintf(sec, sizeof sec, "section %s", ckpt_section_name(h.sec[i].kind));
    refused(bad, (const char *[]){"shard-00001-of-00002.fsdp", sec, "checksum mismatch", NULL});
  }
  copy_ckpt(good, bad);
  flip(path, 40); /* the header */
  refused(bad, (const char *[]){"shard-00001-of-00002.fsdp", "header", NULL});
  copy_ckpt(good, bad);
  cr_assert_eq(truncate(path, (off_t)h.sec[2].offset + 100), 0);
  refused(bad, (const char *[]){"shard-00001-of-00002.fsdp", "bytes", NULL});
  /* a shard of another step, under the right name: not what was committed */
  copy_ckpt(good, bad);
  char other[4096];
  snprintf(other, sizeof other, "%s/step-00000004/shard-00001-of-00002.fsdp", root);
  copy_file(other, path);
  refused(bad, (const char *[]){"shard-00001-of-00002.fsdp", "not the shard the manifest committed",
                                NULL});
  /* a manifest of another model, mesh, precision or wrap policy than its
   * shards: damaged (a resume from checkpoint_dir falls back past it), not a
   * checkpoint of another model (a tester's one-bit flip, vocab 256 -> 254,
   * was refused as "holds a model of vocab 254"), nor taken unchecked */
  char man[4096];
  snprintf(man, sizeof man, "%s/%s", bad, CKPT_MANIFEST);
  const char *edits[][2] = {{"\"vocab\": 256", "\"vocab\": 255"},
                            {"\"precision\": \"fp32\"", "\"precision\": \"bf16-true\""},
                            {"\"strategy\": \"FULL_SHARD\"", "\"strategy\": \"NO_SHARD\""},
                            {"\"replicas\": 1", "\"replicas\": 3"},
                            {"\"min_params\": 0", "\"min_params\": 9"}};
  for (size_t e = 0; e < sizeof edits / sizeof *edits; e++) {
    copy_ckpt(good, bad);
    size_t n;
    char *text = tu_slurp(man, &n), *p = strstr(text, edits[e][0]);
    cr_assert_not_null(p, "%s", text);
    char *fixed = malloc(n + 64);
    const size_t at = (size_t)(p - text);
    const int m = snprintf(fixed, n + 64, "%.*s%s%s", (int)at, text, edits[e][1],
                           p + strlen(edits[e][0]));
    tu_write_file(man, fixed, (size_t)m);
    free(text), free(fixed);
    refused(bad, (const char *[]){"shard-00000-of-00002.fsdp: header", "the checkpoint is damaged",
                                  NULL});
  }
  /* not committed */
  copy_ckpt(good, bad);
  unlink(man);
  refused(bad, (const char *[]){"not a committed checkpoint", NULL});
  /* the latest committed: step 12 is there without its manifest */
  char s12[4096], latest[4096];
  snprintf(s12, sizeof s12, "%s/step-00000012", root);
  copy_ckpt(good, s12);
  snprintf(man, sizeof man, "%s/%s", s12, CKPT_MANIFEST);
  unlink(man);
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, good);
  ckpt_header_free(&h);
  free(root);
}

/* A damaged part of the newest committed checkpoint (a checksum that does
 * not match, a shard gone) in the directory a run resumes from sends every
 * rank back to the committed checkpoint before it, saying so, where it used
 * to fail every restart the same way; with only damaged ones, or a step
 * directory named itself, the run fails naming the file. */
Test(ckpt, a_damaged_newest_checkpoint_falls_back_to_the_one_before, .timeout = 120) {
  static char out[1 << 17];
  char *root = mkdir_tmp("fallback"), args[4096], path[4096], man[4096];
  snprintf(args, sizeof args, "--steps 8 --batch 2 --checkpoint_dir %s --checkpoint_every 4", root);
  launch(2, args, 0, out, sizeof out);
  ckpt_header_t h;
  snprintf(path, sizeof path, "%s/step-00000008/shard-00001-of-00002.fsdp", root);
  int fd = open(path, O_RDONLY);
  cr_assert_eq(ckpt_header_read(fd, path, &h), 0);
  close(fd);
  flip(path, (off_t)(h.sec[1].offset + 10));
  ckpt_header_free(&h);
  snprintf(args, sizeof args, "--steps 12 --batch 2 --checkpoint_dir %s --checkpoint_every 4 "
           "--auto_resume 1", root);
  launch(2, args, 0, out, sizeof out);
  cr_assert(strstr(out, "step-00000008 is damaged") && strstr(out, "checksum mismatch"), "%s", out);
  snprintf(man, sizeof man, "resumed from %s/step-00000004 at step 4", root);
  cr_assert(strstr(out, man), "%s", out);
  /* the run went on from step 4 and committed its own step 8 and 12 */
  snprintf(man, sizeof man, "%s/step-00000012/%s", root, CKPT_MANIFEST);
  cr_assert_eq(access(man, F_OK), 0, "%s", out);
  /* a shard gone from every checkpoint but the oldest: back to that one */
  for (int step = 8; step <= 12; step += 4) {
    snprintf(path, sizeof path, "%s/step-%08d/shard-00000-of-00002.fsdp", root, step);
    cr_assert_eq(unlink(path), 0, "%s", path);
  }
  launch(2, args, 0, out, sizeof out);
  snprintf(man, sizeof man, "resumed from %s/step-00000004 at step 4", root);
  cr_assert(strstr(out, man), "%s", out);
  /* nothing undamaged left: the run fails, naming what it could not read */
  snprintf(path, sizeof path, "%s/step-00000004/shard-00000-of-00002.fsdp", root);
  cr_assert_eq(unlink(path), 0);
  for (int step = 8; step <= 12; step += 4) { /* the run above wrote them again */
    snprintf(path, sizeof path, "%s/step-%08d/shard-00000-of-00002.fsdp", root, step);
    unlink(path);
  }
  launch(2, args, 1, out, sizeof out);
  cr_assert(strstr(out, "no committed checkpoint") && strstr(out, "older than step 4"), "%s", out);
  free(root);
}

/* The tester's case: the newest manifest's model edited (vocab 256 -> 254,
 * one bit) in checkpoint_dir: the run falls back to the step before, as for
 * any damage, instead of failing every restart as a model mismatch. */
Test(ckpt, a_manifest_whose_model_its_shards_contradict_falls_back, .timeout = 120) {
  static char out[1 << 17];
  char *root = mkdir_tmp("manmodel"), args[4096], man[4096];
  snprintf(args, sizeof args, "--steps 8 --batch 2 --checkpoint_dir %s --checkpoint_every 4", root);
  launch(2, args, 0, out, sizeof out);
  snprintf(man, sizeof man, "%s/step-00000008/%s", root, CKPT_MANIFEST);
  size_t n;
  char *text = tu_slurp(man, &n), *p = strstr(text, "\"vocab\": 256");
  cr_assert_not_null(p, "%s", text);
  p[11] = '4';
  tu_write_file(man, text, n);
  free(text);
  snprintf(args, sizeof args, "--steps 12 --batch 2 --checkpoint_dir %s --checkpoint_every 4 "
           "--auto_resume 1", root);
  launch(2, args, 0, out, sizeof out);
  cr_assert(strstr(out, "step-00000008 is damaged") && strstr(out, "header"), "%s", out);
  snprintf(man, sizeof man, "resumed from %s/step-00000004 at step 4", root);
  cr_assert(strstr(out, man), "%s", out);
  free(root);
}

/* Defects A and B under fsdp-launch: a manifest that is not JSON is a
 * damaged checkpoint like one with a damaged shard. Named itself, the run
 * fails naming manifest.json (not "no manifest"); newest in checkpoint_dir,
 * it is said damaged, set aside whole, and the run goes back to the one
 * before and writes and commits that step again. A shard cut short the
 * same: its step is written again, and retention keeps the newest whole
 * ones (the whole step before it is not removed in its place). */
static void damaged_is_written_again(const char *name, int cut) {
  static char out[1 << 17];
  char *root = mkdir_tmp(name), args[4096], path[4096], want[4096];
  snprintf(args, sizeof args, "--steps 12 --batch 2 --checkpoint_dir %s --checkpoint_every 4", root);
  launch(2, args, 0, out, sizeof out);
  if (cut) {
    snprintf(path, sizeof path, "%s/step-00000012/shard-00001-of-00002.fsdp", root);
    cr_assert_eq(truncate(path, 1000), 0);
  } else {
    snprintf(path, sizeof path, "%s/step-00000012/%s", root, CKPT_MANIFEST);
    tu_write_file(path, "garbage{\n", 9);
    snprintf(args, sizeof args, "--steps 16 --batch 2 --resume_from %s/step-00000012", root);
    launch(2, args, 1, out, sizeof out);
    cr_assert(strstr(out, CKPT_MANIFEST) && strstr(out, "line 1") &&
              !strstr(out, "not a committed checkpoint") && !strstr(out, "resume_from: resume_from"),
              "%s", out);
  }
  snprintf(args, sizeof args, "--steps 20 --batch 2 --checkpoint_dir %s --checkpoint_every 4", root);
  launch(2, args, 0, out, sizeof out);
  cr_assert(strstr(out, "step-00000012 is damaged") && strstr(out, "set aside"), "%s", out);
  snprintf(want, sizeof want, "resumed from %s/step-00000008 at step 8", root);
  cr_assert(strstr(out, want), "%s", out);
  cr_assert_null(strstr(out, "NOT written"), "%s", out);
  for (int step = 12; step <= 20; step += 4) {
    snprintf(path, sizeof path, "%s/step-%08d", root, step);
    cr_expect_eq(ckpt_verify(path), 0, "step %d: %s\n%s", step, err_msg(), out);
  }
  snprintf(path, sizeof path, "%s/step-00000012.damaged", root);
  cr_expect_eq(access(path, F_OK), 0, "not set aside:\n%s", out);
  snprintf(path, sizeof path, "%s/step-00000008", root);
  cr_expect_neq(access(path, F_OK), 0, "keep_checkpoints 3 kept step 8 beside 12, 16, 20");
  free(root);
}

Test(ckpt, a_damaged_manifest_is_a_damaged_checkpoint_whose_step_is_written_again,
     .timeout = 120) {
  damaged_is_written_again("badman-run", 0);
}

Test(ckpt, a_cut_shards_step_is_written_again_and_retention_keeps_whole_ones, .timeout = 120) {
  damaged_is_written_again("cut-run", 1);
}

/* ---- manifests ------------------------------------------------------------------ */

/* A manifest of one step in dir (made there) with this model and shards x
 * shard_total; the files' names are the format's, their sums made up. */
static void write_manifest(const char *dir, gpt_config_t c, int shards, long long shard_total) {
  char files[4096] = "", man[4096];
  size_t at = 0;
  for (int j = 0; j < shards; j++) {
    char name[CKPT_NAME_MAX];
    ckpt_shard_name(name, sizeof name, j, shards);
    at += (size_t)snprintf(files + at, sizeof files - at, "%s{\"shard\": %d, \"name\": \"%s\", "
                           "\"bytes\": 4096, \"xxh64\": \"0123456789abcdef\"}", j ? ", " : "",
                           j, name);
  }
  char text[8192];
  const int n = snprintf(text, sizeof text,
      "{\"format\": \"fsdpd-checkpoint\", \"version\": 1, \"step\": 4, \"shards\": %d, "
      "\"replicas\": 1, \"strategy\": \"FULL_SHARD\", \"precision\": \"fp32\", "
      "\"min_params\": 0, \"shard_total\": %lld, \"model\": {\"layers\": %d, "
      "\"channels\": %d, \"heads\": %d, \"vocab\": %d, \"context\": %d}, \"units\": [], "
      "\"files\": [%s]}\n", shards, shard_total, c.layers, c.channels, c.heads, c.vocab,
      c.context, files);
  mkdir(dir, 0755);
  snprintf(man, sizeof man, "%s/%s", dir, CKPT_MANIFEST);
  tu_write_file(man, text, (size_t)n);
}

/* A manifest's model is checked as a job's is, and must fit its shards:
 * sizes no job can have (the one that overflowed an export's byte counts and
 * aborted the coordinator), heads that do not divide channels and a model
 * larger than its shards are refused naming manifest.json and the field, and
 * such a directory is not a committed checkpoint. */
Test(ckpt, manifests_with_impossible_models_are_refused) {
  char *root = mkdir_tmp("manifests"), dir[4096], latest[4096];
  gpt_config_t tiny;
  cr_assert_eq(gpt_config_preset(&tiny, "tiny"), 0);
  snprintf(dir, sizeof dir, "%s/step-00000004", root);
  write_manifest(dir, tiny, 2, 60288); /* the good one: tiny over 2 shards */
  ckpt_manifest_t m;
  cr_assert_eq(ckpt_manifest_read(dir, &m), 0, "%s", err_msg());
  cr_assert_eq(memcmp(&m.model, &tiny, sizeof tiny), 0);
  ckpt_manifest_free(&m);
  const struct {
    gpt_config_t model;
    int shards;
    long long shard_total;
    const char *field;
  } cases[] = {
      {{1, 536870911, 1, 2147483647, 2147483647}, 1, 1LL << 40, "channels"},
      {{2, 64, 3, 256, 64}, 2, 60288, "heads"},
      {{5000, 64, 4, 256, 64}, 1, 1LL << 40, "layers"},
      {{2, 64, 4, 2147483647, 64}, 1, 1LL << 40, "vocab"},
      {{2, 64, 4, 256, 2000000}, 1, 1LL << 40, "context"},
      {{2, 64, 4, 256, 64}, 2, 1000, "shard_total"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_manifest(dir, cases[i].model, cases[i].shards, cases[i].shard_total);
    cr_assert_eq(ckpt_manifest_read(dir, &m), FSDP_EFORMAT, "case %zu (%s) was read", i,
                 cases[i].field);
    cr_assert_not_null(strstr(err_msg(), dir), "%s", err_msg());
    cr_assert_not_null(strstr(err_msg(), CKPT_MANIFEST), "%s", err_msg());
    cr_assert_not_null(strstr(err_msg(), cases[i].field), "case %zu: no \"%s\" in: %s", i,
                       cases[i].field, err_msg());
    /* the newest step holding a manifest: its load finds it damaged, as
     * it would a damaged shard, rather than passing it over unsaid */
    cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "case %zu: %s", i, err_msg());
    cr_assert_str_eq(latest, dir);
    cr_assert_eq(ckpt_verify(dir), FSDP_EFORMAT, "case %zu", i);
    /* named itself, the error is the manifest's, not "no manifest" */
    cr_assert_eq(ckpt_latest(dir, latest, sizeof latest), FSDP_EFORMAT, "case %zu", i);
    cr_assert_not_null(strstr(err_msg(), CKPT_MANIFEST), "%s", err_msg());
    cr_assert_not_null(strstr(err_msg(), cases[i].field), "case %zu: %s", i, err_msg());
  }
  free(root);
}

/* ---- the file system calls of removal and commit ---------------------------------- */

/* This binary's unlink, rmdir and fsync stand in front of libc's (the
 * library is linked in statically, so ckpt.c calls these), in the manner of
 * tests/e2e/fs_shim.c: while fs_trace is set each call is appended to
 * fs_log as "unlink NAME", "rmdir NAME" or "fsync NAME" (NAME the path's
 * last component), and while fs_fail_dir is set an fsync of a directory
 * fails with EIO, as a disk's transient error would. */
static int fs_trace, fs_fail_dir;
static char fs_log[8192];

static void fs_note(const char *op, const char *path) {
  if (!fs_trace) return;
  const char *slash = strrchr(path, '/');
  const size_t at = strlen(fs_log);
  snprintf(fs_log + at, sizeof fs_log - at, "%s %s\n", op, slash ? slash + 1 : path);
}

int unlink(const char *path) {
  static int (*real)(const char *);
  if (!real) real = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
  fs_note("unlink", path);
  return real(path);
}

int rmdir(const char *path) {
  static int (*real)(const char *);
  if (!real) real = (int (*)(const char *))dlsym(RTLD_NEXT, "rmdir");
  fs_note("rmdir", path);
  return real(path);
}

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  path[n > 0 ? n : 0] = 0;
  fs_note("fsync", path);
  struct stat st;
  if (fs_fail_dir && !fstat(fd, &st) && S_ISDIR(st.st_mode)) {
    errno = EIO;
    return -1;
  }
  return real(fd);
}

/* Where op NAME first comes in fs_log (-1: never). */
static long fs_at(const char *op_name) {
  const char *p = strstr(fs_log, op_name);
  return p ? p - fs_log : -1;
}

#define RUN_A UINT64_C(0x0123456789abcdef)
#define RUN_B UINT64_C(0xfedcba9876543210)

/* Shard j of the 3 of header_of's layout, of step and run, in dir (made when
 * it is not there): a whole header and zeros after it (what a commit reads:
 * headers and sizes); fill, the byte its sections hold. */
static void make_shard(const char *dir, int j, int64_t step, uint64_t run) {
  mkdir(dir, 0755);
  ckpt_header_t h;
  shard_layout_t *lay;
  header_of(&h, &lay);
  h.shard_rank = j, h.step = step, h.run = run;
  uint8_t *p;
  cr_assert_eq(ckpt_header_encode(&h, &p), 0, "%s", err_msg());
  char name[CKPT_NAME_MAX], path[4096];
  ckpt_shard_name(name, sizeof name, j, 3);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  tu_write_file(path, p, h.header_bytes);
  cr_assert_eq(truncate(path, (off_t)ckpt_file_bytes(&h)), 0);
  free(p);
  ckpt_header_free(&h);
  shard_layout_destroy(lay);
}

static void make_shards(const char *dir, int64_t step) {
  for (int j = 0; j < 3; j++) make_shard(dir, j, step, RUN_A);
}

/* Checkpoints of steps 4 and 8 committed in root, their directories in s4
 * and s8 (4096 bytes each). */
static void committed_4_and_8(const char *root, char *s4, char *s8) {
  snprintf(s4, 4096, "%s/step-00000004", root);
  snprintf(s8, 4096, "%s/step-00000008", root);
  make_shards(s4, 4), make_shards(s8, 8);
  cr_assert_eq(ckpt_commit(s4, 3, NULL, RUN_A), 0, "%s", err_msg());
  cr_assert_eq(ckpt_commit(s8, 3, NULL, RUN_A), 0, "%s", err_msg());
}

/* ckpt_sweep removes an uncommitted step directory left alone for the
 * quiet period, not one the caller names, not a fresh one; and odd step
 * directories (links, here more than a sweep reports) are said up to half
 * of its room, so that they never keep a leftover from going. */
Test(ckpt, a_sweep_removes_old_leftovers_and_is_not_starved_by_odd_ones) {
  char *root = mkdir_tmp("sweep"), dir[4096], path[4096];
  const int64_t now = (int64_t)time(NULL) * 1000 + 3600 * 1000; /* all of it an hour old */
  for (int i = 0; i < 12; i++) { /* links named as steps, listed in any order */
    snprintf(dir, sizeof dir, "%s/step-%08d", root, 100 + i);
    cr_assert_eq(symlink("/", dir), 0);
  }
  snprintf(dir, sizeof dir, "%s/step-00000004", root), make_shards(dir, 4); /* the caller's */
  snprintf(dir, sizeof dir, "%s/step-00000008", root), make_shards(dir, 8); /* a leftover */
  snprintf(path, sizeof path, "%s/.shard-00000-of-00003.fsdp.tmp.77", dir);
  tu_write_file(path, "x", 1);
  ckpt_leftover_t out[4];
  int n = 0;
  const int64_t skip[] = {4};
  /* fresh (the quiet period longer than their age): nothing goes */
  cr_assert_eq(ckpt_sweep(root, skip, 1, now, 2 * 3600 * 1000, out, 4, &n), 0, "%s", err_msg());
  cr_assert_eq(access(dir, F_OK), 0, "a fresh leftover went");
  cr_assert_eq(ckpt_sweep(root, skip, 1, now, 60 * 1000, out, 4, &n), 0, "%s", err_msg());
  int removed = 0, left = 0;
  for (int i = 0; i < n; i++) {
    if (out[i].removed) {
      removed++;
      cr_expect_eq(out[i].step, 8);
      cr_expect_eq(out[i].files, 4, "%d files", out[i].files);
    } else {
      left++;
      cr_expect(strstr(out[i].why, "not a directory (a link?)"), "%s", out[i].why);
    }
  }
  cr_expect_eq(removed, 1, "the leftover was not removed (%d left said)", left);
  cr_expect_eq(left, 2, "%d links said, of a room of 4", left);
  cr_expect_neq(access(dir, F_OK), 0, "%s is still there", dir);
  snprintf(dir, sizeof dir, "%s/step-00000004/shard-00000-of-00003.fsdp", root);
  cr_expect_eq(access(dir, F_OK), 0, "the caller's step went");
  snprintf(dir, sizeof dir, "%s/step-00000100", root);
  struct stat st;
  cr_expect(!lstat(dir, &st) && S_ISLNK(st.st_mode), "a link went");
  free(root);
}

/* Removal makes the manifest's removal durable (an fsync of the directory)
 * before any shard goes, so a power loss cannot leave a manifest over
 * missing shards; when that fsync fails the shards stay and the error says
 * so. A checkpoint whose manifest is gone is never the latest, and removing
 * it again finishes the job. ckpt_remove_aborted leaves a committed one. */
Test(ckpt, removal_makes_the_manifest_gone_durable_before_a_shard_goes) {
  char *root = mkdir_tmp("remove"), s4[4096], s8[4096], latest[4096], path[4096];
  committed_4_and_8(root, s4, s8);
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, s8);
  fs_log[0] = 0, fs_trace = 1;
  cr_assert_eq(ckpt_remove(s8), 0, "%s", err_msg());
  fs_trace = 0;
  const long man = fs_at("unlink " CKPT_MANIFEST "\n"), sync = fs_at("fsync step-00000008\n");
  const long shard = fs_at("unlink shard-"), dir = fs_at("rmdir step-00000008\n");
  cr_assert(man >= 0 && sync > man && shard > sync && dir > shard,
            "not manifest, fsync of the directory, shards, directory:\n%s", fs_log);
  cr_assert_eq(access(s8, F_OK), -1, "%s is still there", s8);
  /* the fsync fails: the manifest is gone, the shards are kept */
  make_shards(s8, 8);
  cr_assert_eq(ckpt_commit(s8, 3, NULL, RUN_A), 0, "%s", err_msg());
  fs_fail_dir = 1;
  cr_assert_neq(ckpt_remove(s8), 0, "removed without a durable fsync");
  fs_fail_dir = 0;
  cr_assert_not_null(strstr(err_msg(), s8), "%s", err_msg());
  cr_assert_not_null(strstr(err_msg(), "shards are kept"), "%s", err_msg());
  snprintf(path, sizeof path, "%s/%s", s8, CKPT_MANIFEST);
  cr_assert_eq(access(path, F_OK), -1, "the manifest is still there");
  for (int j = 0; j < 3; j++) {
    char name[CKPT_NAME_MAX];
    ckpt_shard_name(name, sizeof name, j, 3);
    snprintf(path, sizeof path, "%s/%s", s8, name);
    cr_assert_eq(access(path, F_OK), 0, "%s went after a failed fsync", path);
  }
  /* a directory without its manifest is never chosen */
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, s4);
  cr_assert_eq(ckpt_remove(s8), 0, "%s", err_msg());
  cr_assert_eq(access(s8, F_OK), -1, "%s is still there", s8);
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, s4);
  /* what a checkpoint that did not commit left goes; a committed one stays whole */
  make_shards(s8, 8);
  cr_assert_eq(ckpt_remove_aborted(s8), 0, "%s", err_msg());
  cr_assert_eq(access(s8, F_OK), -1, "%s is still there", s8);
  cr_assert_eq(ckpt_remove_aborted(s4), FSDP_EEXIST, "a committed checkpoint was removed");
  cr_assert(strstr(err_msg(), s4) && strstr(err_msg(), "committed"), "%s", err_msg());
  snprintf(path, sizeof path, "%s/%s", s4, CKPT_MANIFEST);
  cr_assert_eq(access(path, F_OK), 0, "the manifest of a committed checkpoint went");
  snprintf(path, sizeof path, "%s/shard-00002-of-00003.fsdp", s4);
  cr_assert_eq(access(path, F_OK), 0, "a shard of a committed checkpoint went");
  free(root);
}

/* Committing a committed checkpoint again (the janitor after a crash, or a
 * second rank finishing with the first) writes nothing, and when its
 * directory fsync fails the manifest an earlier commit made durable stays,
 * byte for byte, and loads. A first commit whose fsync fails leaves no
 * manifest and no temporary file. */
Test(ckpt, a_failed_recommit_leaves_the_committed_manifest) {
  char *root = mkdir_tmp("recommit"), dir[4096], man[4096], latest[4096];
  snprintf(dir, sizeof dir, "%s/step-00000004", root);
  snprintf(man, sizeof man, "%s/%s", dir, CKPT_MANIFEST);
  make_shards(dir, 4);
  cr_assert_eq(ckpt_commit(dir, 3, NULL, RUN_A), 0, "%s", err_msg());
  size_t n0, n1;
  char *before = tu_slurp(man, &n0);
  fs_fail_dir = 1;
  cr_assert_neq(ckpt_commit(dir, 3, NULL, RUN_A), 0, "committed without a durable fsync");
  fs_fail_dir = 0;
  cr_assert_eq(access(man, F_OK), 0, "a transient error removed a committed checkpoint's manifest");
  cr_assert_not_null(strstr(err_msg(), dir), "%s", err_msg());
  cr_assert_not_null(strstr(err_msg(), "left as it was"), "%s", err_msg());
  char *after = tu_slurp(man, &n1);
  cr_assert(n0 == n1 && !memcmp(before, after, n0), "the manifest changed");
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, dir);
  fs_log[0] = 0, fs_trace = 1;
  cr_assert_eq(ckpt_commit(dir, 3, NULL, RUN_A), 0, "%s", err_msg()); /* idempotent */
  fs_trace = 0;
  cr_assert_eq(fs_at("unlink"), -1, "a re-commit removed a file:\n%s", fs_log);
  /* a first commit: what it wrote goes */
  snprintf(dir, sizeof dir, "%s/step-00000008", root);
  snprintf(man, sizeof man, "%s/%s", dir, CKPT_MANIFEST);
  make_shards(dir, 8);
  fs_fail_dir = 1;
  cr_assert_neq(ckpt_commit(dir, 3, NULL, RUN_A), 0, "committed without a durable fsync");
  fs_fail_dir = 0;
  cr_assert_eq(access(man, F_OK), -1, "a manifest that is not durable was left");
  char cmd[4096], out[4096];
  snprintf(cmd, sizeof cmd, "ls -a %s | grep tmp", dir);
  cr_assert_neq(tu_sh(cmd, out, sizeof out), 0, "a temporary file was left: %s", out);
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_not_null(strstr(latest, "step-00000004"), "%s", latest);
  free(before), free(after), free(root);
}

/* A run that stopped mid-save left shard 1 of step 8; a later run (resumed
 * from an earlier step) writes shards 0 and 2 of step 8 and its ranks commit
 * without reports (fsdp-launch). The mixed checkpoint is never committed:
 * the stale shard is as good as missing, naming the file and the run, and
 * once its rank writes this run's shard 1 over it the checkpoint commits. A
 * committer with reports (the coordinator) goes by them, not by runs. */
Test(ckpt, a_shard_of_another_run_is_never_committed_without_reports) {
  char *root = mkdir_tmp("stale"), dir[4096], man[4096], latest[4096];
  snprintf(dir, sizeof dir, "%s/step-00000008", root);
  snprintf(man, sizeof man, "%s/%s", dir, CKPT_MANIFEST);
  make_shard(dir, 1, 8, RUN_A); /* the run that stopped */
  make_shard(dir, 0, 8, RUN_B);
  make_shard(dir, 2, 8, RUN_B);
  for (int i = 0; i < 2; i++) { /* ranks 0 and 2 of run B, as each finishes */
    cr_assert_eq(ckpt_commit(dir, 3, NULL, RUN_B), FSDP_ENOENT, "a mixed checkpoint committed");
    cr_assert_not_null(strstr(err_msg(), "shard-00001-of-00003.fsdp"), "%s", err_msg());
    cr_assert_not_null(strstr(err_msg(), "another run"), "%s", err_msg());
    cr_assert_eq(access(man, F_OK), -1, "a manifest over a mixed checkpoint");
  }
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), FSDP_ENOENT);
  make_shard(dir, 1, 8, RUN_B); /* rank 1 of run B writes its own over the stale one */
  cr_assert_eq(ckpt_commit(dir, 3, NULL, RUN_B), 0, "%s", err_msg());
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, dir);
  /* reports vouch for shards whatever their run */
  char dir2[4096];
  snprintf(dir2, sizeof dir2, "%s/step-00000012", root);
  make_shard(dir2, 0, 12, RUN_A), make_shard(dir2, 1, 12, RUN_B), make_shard(dir2, 2, 12, 0);
  ckpt_shard_report_t rep[3];
  for (int j = 0; j < 3; j++) {
    char path[4096];
    ckpt_shard_name(rep[j].name, sizeof rep[j].name, j, 3);
    snprintf(path, sizeof path, "%s/%s", dir2, rep[j].name);
    int fd = open(path, O_RDONLY);
    ckpt_header_t h;
    cr_assert_eq(ckpt_header_read(fd, path, &h), 0, "%s", err_msg());
    close(fd);
    rep[j].shard_rank = j, rep[j].bytes = ckpt_file_bytes(&h), rep[j].sum = h.sum;
    ckpt_header_free(&h);
  }
  cr_assert_eq(ckpt_commit(dir2, 3, rep, 0), 0, "%s", err_msg());
  free(root);
}

/* Every shard of a run's checkpoint carries one run id, which all its ranks
 * drew together; another run has another. */
Test(ckpt, a_runs_shards_carry_its_run_id, .timeout = 120) {
  static char out[1 << 16];
  uint64_t run[2] = {0, 0};
  for (int r = 0; r < 2; r++) {
    char root[4096], args[4096];
    snprintf(root, sizeof root, "%s/runid-%d", tu_tmpdir(), r);
    cr_assert_eq(mkdir(root, 0755), 0);
    snprintf(args, sizeof args, "--steps 4 --batch 2 --checkpoint_dir %s --checkpoint_every 4", root);
    launch(2, args, 0, out, sizeof out);
    for (int j = 0; j < 2; j++) {
      char path[4200];
      snprintf(path, sizeof path, "%s/step-00000004/shard-%05d-of-00002.fsdp", root, j);
      int fd = open(path, O_RDONLY);
      ckpt_header_t h;
      cr_assert_eq(ckpt_header_read(fd, path, &h), 0, "%s", err_msg());
      close(fd);
      cr_assert_eq(h.version, CKPT_VERSION);
      cr_assert_neq(h.run, 0, "%s carries no run", path);
      if (j == 0) run[r] = h.run;
      else cr_assert_eq(h.run, run[r], "the ranks of one run disagree on its id");
      ckpt_header_free(&h);
    }
  }
  cr_assert_neq(run[0], run[1], "two runs drew one id");
}

/* ---- options ------------------------------------------------------------------- */

Test(ckpt, options_are_checked) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", "x.bin"), 0);
  cr_assert_eq(config_set(&c, "checkpoint_every", "10"), 0);
  cr_assert_neq(config_finish(&c), 0);
  cr_assert_not_null(strstr(err_msg(), "checkpoint_dir"), "%s", err_msg());
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", "x.bin"), 0);
  cr_assert_eq(config_set(&c, "resume_from", "ck"), 0);
  cr_assert_eq(config_set(&c, "init_from", "w.bin"), 0);
  cr_assert_neq(config_finish(&c), 0);
  cr_assert_not_null(strstr(err_msg(), "init_from"), "%s", err_msg());
}

/* ---- a full disk --------------------------------------------------------------- */

/* fsdp-launch -n 2 fsdp-train (tiny, this test's data) ARGS with env (""
 * or VAR=value ...) and its checkpoint_dir on a 2 MiB tmpfs mounted at mnt
 * (two shards of the tiny model and a manifest fit, three shards do not),
 * in a mount namespace of its own so that nothing outlives the test. Its
 * output in out, then "launch=<exit status>" and, for each step directory
 * left, "== <dir>" and what it holds. Skips the test where no tmpfs can be
 * mounted. */
static void small_disk_launch(const char *mnt, const char *env, const char *args, char *out,
                              size_t len) {
  if (geteuid() != 0) cr_skip_test("needs root to mount a small tmpfs in its own mount namespace");
  char cmd[16384];
  snprintf(cmd, sizeof cmd,
           "unshare -m --propagation private sh -c '"
           "mount -t tmpfs -o size=2m tmpfs %s || { echo mount-failed; exit 0; }; "
           "FSDP_PROGRESS_EVERY=100 %s %s/bin/fsdp-launch -n 2 -- %s/bin/fsdp-train " TU_TINY_TRAIN
           " --data %s --checkpoint_dir %s %s; "
           "echo launch=$?; for d in %s/step-*; do echo \"== $d\"; ls -a $d; done' 2>&1",
           mnt, env, tu_root(), tu_root(), data_file(), mnt, args, mnt);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(out, 1, len - 1, p);
  out[n] = 0;
  pclose(p);
  if (strstr(out, "mount-failed")) cr_skip_test("cannot mount a tmpfs here:\n%s", out);
}

/* A checkpoint_dir on a 2 MiB tmpfs: step 4's checkpoint fits, step 8's does not
 * (written in place, so both ranks finish step 4's before either starts
 * step 8's; in the background a fast rank's step 8 could take the space a
 * slow rank's step 4 still needs, which fails step 4 as cleanly).
 * Training goes on to the end; step 8 has no manifest and no temporary file
 * left (nor, when nothing is in it, the directory its rank made), step 4
 * stays committed and whole, and it is the latest. */
Test(ckpt, a_full_disk_leaves_no_partial_checkpoint_and_training_goes_on, .timeout = 120) {
  char *mnt = mkdir_tmp("small");
  static char out[1 << 17];
  small_disk_launch(mnt, "", "--steps 12 --batch 2 --checkpoint_every 4 --checkpoint_async 0",
                    out, sizeof out);
  cr_assert_not_null(strstr(out, "launch=0"), "training did not go on to the end:\n%s", out);
  cr_assert_not_null(strstr(out, "NOT written"), "no rank said its shard was not written:\n%s", out);
  char *s4 = strstr(out, "== "), *s8 = s4 ? strstr(s4 + 3, "== ") : NULL;
  cr_assert(s4 && strstr(s4, "step-00000004") && (!s8 || strstr(s4, "step-00000004") < s8),
            "%s", out);
  if (s8) *s8 = 0; /* s4: step 4's listing */
  cr_assert(strstr(s4, CKPT_MANIFEST) && strstr(s4, "shard-00000-of-00002.fsdp") &&
            strstr(s4, "shard-00001-of-00002.fsdp"), "step 4 is not whole:\n%s", s4);
  if (s8) { /* the later steps' directories, when a shard is in them */
    s8[0] = '=';
    cr_assert_null(strstr(s8, CKPT_MANIFEST), "a later step was committed without space:\n%s", s8);
    cr_assert_null(strstr(s8, ".tmp."), "a temporary file was left:\n%s", s8);
  }
  free(mnt);
}

/* The defect a tester found: on a nearly full disk one failed checkpoint
 * failed every later one, as the shards its other ranks wrote kept their
 * space. On the 2 MiB tmpfs rank 0's shard of step 4 meets ENOSPC
 * (tests/e2e/fs_shim.c), rank 1's is written; once every rank's write of
 * it has ended the ranks agree it failed (in the loss's all-reduce) and
 * rank 0 removes step 4 while training runs, so step 8's two shards fit
 * and it commits (three shards do not fit: with step 4's left, step 8
 * fails too). */
Test(ckpt, a_checkpoint_a_full_disk_failed_is_removed_so_the_next_one_commits, .timeout = 120) {
  char *mnt = mkdir_tmp("small"), env[9000];
  snprintf(env, sizeof env, "LD_PRELOAD=%s ENOSPC_MATCH=step-00000004/.shard-00000", tu_fs_shim());
  static char out[1 << 17];
  small_disk_launch(mnt, env, "--steps 12 --batch 2 --checkpoint_every 4 --checkpoint_async 0",
                    out, sizeof out);
  cr_assert_not_null(strstr(out, "launch=0"), "training did not go on to the end:\n%s", out);
  const char *failed = strstr(out, "checkpoint step 4 NOT written (");
  cr_assert(failed && strstr(failed, "No space left on device"), "step 4 did not fail:\n%s", out);
  const char *eol = strchr(failed, '\n');
  cr_assert(eol && !strncmp(eol - 16, "training goes on", 16), "%.*s", (int)(eol - failed), failed);
  const char *gone = strstr(out, "train: checkpoint step 4 removed: 1 rank(s) could not write");
  const char *s8 = strstr(out, "/step-00000008 (shard-00000-of-00002.fsdp, ");
  cr_assert(gone && gone > failed, "step 4 was not removed:\n%s", out);
  cr_assert(s8, "rank 0 did not write its shard of step 8:\n%s", out);
  cr_assert(gone < s8, "step 4 was removed after step 8's save, not while training ran:\n%s", out);
  const char *left = strstr(out, "launch=0");
  cr_assert_null(strstr(left, "step-00000004"), "step 4 is still there:\n%s", left);
  const char *l8 = strstr(left, "== ");
  cr_assert(l8 && strstr(l8, "step-00000008") && strstr(l8, CKPT_MANIFEST) &&
            strstr(l8, "shard-00000-of-00002.fsdp") && strstr(l8, "shard-00001-of-00002.fsdp"),
            "step 8 is not committed whole:\n%s", left);
  free(mnt);
}

/* A checkpoint whose shards are all written but whose manifest is not (the
 * disk full at the commit: the fs shim fails step 4's manifest with ENOSPC)
 * never commits: its shards are removed once every rank's write has ended,
 * as a failed shard's checkpoint is, so step 8 has the space (a tester
 * found step 4's shards kept for ever, and every later checkpoint failing
 * on the full disk, the run ending with step 0's nothing). */
Test(ckpt, a_checkpoint_whose_manifest_was_not_written_is_removed, .timeout = 120) {
  char *mnt = mkdir_tmp("small"), env[9000];
  snprintf(env, sizeof env, "LD_PRELOAD=%s ENOSPC_MATCH=step-00000004/.manifest", tu_fs_shim());
  static char out[1 << 17];
  small_disk_launch(mnt, env, "--steps 12 --batch 2 --checkpoint_every 4 --checkpoint_async 0",
                    out, sizeof out);
  cr_assert_not_null(strstr(out, "launch=0"), "training did not go on to the end:\n%s", out);
  /* one rank commits, or both at once when they finish together */
  const char *failed = strstr(out, "checkpoint step 4 removed: ");
  cr_assert(failed && strstr(failed, " rank(s) could not write their shard or its manifest"),
            "step 4's shards were not removed:\n%s", out);
  const char *left = strstr(out, "launch=0");
  cr_assert_null(strstr(left, "step-00000004"), "step 4 is still there:\n%s", left);
  const char *l8 = strstr(left, "step-00000008");
  cr_assert(l8 && strstr(l8, CKPT_MANIFEST), "step 8 is not committed:\n%s", left);
  free(mnt);
}

/* The run's last checkpoint failing is not followed by "training goes on":
 * the run ends, and its last committed checkpoint is where a resume starts. */
Test(ckpt, a_last_checkpoint_not_written_says_the_run_ends_without_it, .timeout = 120) {
  char *mnt = mkdir_tmp("small"), env[9000];
  snprintf(env, sizeof env, "LD_PRELOAD=%s ENOSPC_MATCH=step-00000004/.shard-00000", tu_fs_shim());
  static char out[1 << 17];
  small_disk_launch(mnt, env, "--steps 4 --batch 2 --checkpoint_every 4 --checkpoint_async 0",
                    out, sizeof out);
  const char *failed = strstr(out, "checkpoint step 4 NOT written (");
  cr_assert_not_null(failed, "step 4 did not fail:\n%s", out);
  const char *eol = strchr(failed, '\n');
  cr_assert(eol && !strncmp(eol - 23, "the run ends without it", 23), "%.*s",
            (int)(eol ? eol - failed : 200), failed);
  free(mnt);
}

/* Rank 0's shard of step 4 fails at once, rank 1's, written in the
 * background, takes a second in its fsync (tests/e2e/fs_shim.c): step 4 is
 * removed only once rank 1's write has ended, so that write succeeds and
 * nothing of it is left, and step 8 commits. */
Test(ckpt, a_failed_checkpoint_is_removed_only_once_every_ranks_write_ended, .timeout = 120) {
  char *root = mkdir_tmp("slowpeer"), args[4600], dir[4200];
  snprintf(args, sizeof args, "--steps 12 --batch 2 --checkpoint_dir %s --checkpoint_every 4", root);
  setenv("LD_PRELOAD", tu_fs_shim(), 1);
  setenv("ENOSPC_MATCH", "step-00000004/.shard-00000", 1);
  setenv("SLOW_FSYNC_MATCH", "step-00000004/.shard-00001", 1);
  static char out[1 << 17];
  launch(2, args, 0, out, sizeof out);
  unsetenv("LD_PRELOAD"), unsetenv("ENOSPC_MATCH"), unsetenv("SLOW_FSYNC_MATCH");
  cr_assert_not_null(strstr(out, "train: checkpoint step 4 removed: 1 rank(s) could not write"),
                     "%s", out);
  cr_assert_null(strstr(out, "rank 1: checkpoint of step 4 not written"),
                 "step 4 was removed under rank 1's write:\n%s", out);
  snprintf(dir, sizeof dir, "%s/step-00000004", root);
  cr_assert_eq(access(dir, F_OK), -1, "%s is still there:\n%s", dir, out);
  snprintf(dir, sizeof dir, "%s/step-00000008/%s", root, CKPT_MANIFEST);
  cr_assert_eq(access(dir, F_OK), 0, "step 8 did not commit:\n%s", out);
  free(root);
}

/* A checkpoint the job cannot resume (another seed, a step past its steps)
 * is refused by every rank as it opens it, before a byte of data is read,
 * naming the field, both values and the fix: the rule ckpt_resume_check
 * holds, which the coordinator checks a submit by too (test_job), in the
 * same words. From checkpoint_dir (auto_resume) the fix also offers a
 * directory of the job's own. */
Test(ckpt, a_checkpoint_the_job_does_not_match_is_refused_naming_the_fix, .timeout = 120) {
  char *root = mkdir_tmp("want"), args[4600];
  static char out[1 << 16];
  snprintf(args, sizeof args, "--steps 4 --batch 2 --checkpoint_dir %s --checkpoint_every 4", root);
  launch(2, args, 0, out, sizeof out);
  struct {
    const char *args, *key, *want;
  } cases[] = {
      {"--steps 8 --seed 7 --resume_from", "resume_from: ",
       "step-00000004 was trained with seed 1337, this job has 7; the data order would differ: "
       "set seed = 1337"},
      {"--steps 2 --resume_from", "resume_from: ",
       "step-00000004 is at step 4, past this job's steps 2; raise steps"},
      {"--steps 2 --checkpoint_dir", "checkpoint_dir (auto_resume): ",
       "is at step 4, past this job's steps 2; raise steps (or give this job a checkpoint_dir of "
       "its own"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(args, sizeof args, "--batch 2 %s %s", cases[i].args, root);
    launch(2, args, 1, out, sizeof out);
    const char *k = strstr(out, cases[i].key);
    cr_expect(k && strstr(k, cases[i].want), "case %zu: %s", i, out);
  }
  free(root);
}

/* The manifest records the run's seed (its shards'), so that what a resume
 * must match is in the manifest alone (the coordinator checks a submit with
 * it, job_resume_check); a shard whose header has another seed than the
 * manifest's is damaged, a manifest without one (written before it was
 * recorded) reads with the seed unknown, and one whose seed is not a u64's
 * decimal text is damaged. */
Test(ckpt, a_manifest_records_the_runs_seed) {
  char *root = mkdir_tmp("seed"), s4[4096], s8[4096], man[4096];
  committed_4_and_8(root, s4, s8);
  ckpt_manifest_t m;
  cr_assert_eq(ckpt_manifest_read(s8, &m), 0, "%s", err_msg());
  cr_expect(m.has_seed && m.seed == 0xfeedULL, "seed %d %llu", m.has_seed,
            (unsigned long long)m.seed);
  ckpt_manifest_free(&m);
  snprintf(man, sizeof man, "%s/%s", s8, CKPT_MANIFEST);
  size_t n;
  char *text = tu_slurp(man, &n), *at = strstr(text, "\"seed\": \"65261\"");
  cr_assert_not_null(at, "%s", text);
  const size_t off = (size_t)(at - text);
  struct {
    const char *with; /* in place of "seed": "65261" */
    int read, has, header;
  } cases[] = {
      {"\"seed\": \"65262\"", FSDP_OK, 1, FSDP_EFORMAT}, /* not its shards' */
      {"\"seeds\": \"65261\"", FSDP_OK, 0, FSDP_OK},     /* none: unknown */
      {"\"seed\": \"-65261\"", FSDP_EFORMAT, 0, 0},
      {"\"seed\": 65261", FSDP_EFORMAT, 0, 0},
      {"\"seed\": \"99999999999999999999\"", FSDP_EFORMAT, 0, 0}, /* past 2^64 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char buf[8192];
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)off, text, cases[i].with,
             text + off + strlen("\"seed\": \"65261\""));
    tu_write_file(man, buf, strlen(buf));
    cr_expect_eq(ckpt_manifest_read(s8, &m), cases[i].read, "case %zu: %s", i, err_msg());
    if (cases[i].read) {
      cr_expect(strstr(err_msg(), "seed"), "case %zu: %s", i, err_msg());
      continue;
    }
    cr_expect_eq(m.has_seed, cases[i].has, "case %zu", i);
    ckpt_manifest_free(&m);
    ckpt_reader_t rd;
    cr_assert_eq(ckpt_reader_open(&rd, s8), 0, "%s", err_msg());
    cr_expect_eq(ckpt_reader_header(&rd, 0), cases[i].header, "case %zu: %s", i, err_msg());
    if (cases[i].header) cr_expect(strstr(err_msg(), "seed"), "case %zu: %s", i, err_msg());
    ckpt_reader_close(&rd);
  }
  free(text), free(root);
}

/* A manifest that is not JSON, or of a step other than its directory's, is
 * damaged: named itself (resume_from) the error names manifest.json and
 * what is wrong, never "no manifest"; in a directory of checkpoints it is
 * the newest, found damaged as it is loaded (not passed over unsaid). */
Test(ckpt, a_damaged_manifest_is_named_not_passed_over) {
  char *root = mkdir_tmp("badman"), s4[4096], s8[4096], man[4096], latest[4096];
  committed_4_and_8(root, s4, s8);
  snprintf(man, sizeof man, "%s/%s", s8, CKPT_MANIFEST);
  size_t n;
  char *good = tu_slurp(man, &n);
  tu_write_file(man, "garbage{\n", 9);
  cr_assert_eq(ckpt_latest(s8, latest, sizeof latest), FSDP_EFORMAT);
  cr_assert(strstr(err_msg(), man) && strstr(err_msg(), "line 1") &&
            !strstr(err_msg(), "not a committed"), "%s", err_msg());
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, s8);
  cr_assert_eq(ckpt_latest_below(root, 8, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, s4);
  /* step 4's manifest under step 8's name */
  char s4man[4096];
  snprintf(s4man, sizeof s4man, "%s/%s", s4, CKPT_MANIFEST);
  char *four = tu_slurp(s4man, &n);
  tu_write_file(man, four, n);
  ckpt_manifest_t m;
  cr_assert_eq(ckpt_manifest_read(s8, &m), FSDP_EFORMAT, "a manifest of step 4 read in step 8's");
  cr_assert(strstr(err_msg(), "\"step\" is 4") && strstr(err_msg(), "step 8"), "%s", err_msg());
  free(good), free(four), free(root);
}

/* A checkpoint found damaged is set aside whole (every file, the damaged
 * manifest too) under a name the format does not give, never over one set
 * aside before; its step is free to be written and committed again, and a
 * second mover finds it gone. A shard cut short says its size, not two
 * equal checksums. */
Test(ckpt, a_damaged_checkpoint_is_set_aside_whole_and_its_step_freed) {
  char *root = mkdir_tmp("aside"), s4[4096], s8[4096], to[4096], path[4096], latest[4096];
  committed_4_and_8(root, s4, s8);
  snprintf(path, sizeof path, "%s/shard-00000-of-00003.fsdp", s8);
  cr_assert_eq(truncate(path, 1000), 0);
  cr_assert_eq(ckpt_verify(s8), FSDP_EFORMAT);
  cr_assert(strstr(err_msg(), "1000 bytes, committed") && !strstr(err_msg(), "checksum"), "%s",
            err_msg());
  cr_assert_eq(ckpt_set_aside(s8, to, sizeof to), 0, "%s", err_msg());
  cr_assert_eq(access(s8, F_OK), -1, "%s is still there", s8);
  snprintf(path, sizeof path, "%s.damaged/%s", s8, CKPT_MANIFEST);
  cr_assert_eq(access(path, F_OK), 0, "%s", to);
  cr_assert_eq(ckpt_set_aside(s8, to, sizeof to), FSDP_ENOENT, "a second mover moved something");
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, s4);
  /* written and committed again, then found damaged again */
  make_shards(s8, 8);
  cr_assert_eq(ckpt_commit(s8, 3, NULL, RUN_A), 0, "%s", err_msg());
  cr_assert_eq(ckpt_latest(root, latest, sizeof latest), 0, "%s", err_msg());
  cr_assert_str_eq(latest, s8);
  cr_assert_eq(ckpt_set_aside(s8, to, sizeof to), 0, "%s", err_msg());
  snprintf(path, sizeof path, "%s.damaged-2", s8);
  cr_assert_str_eq(to, path);
  snprintf(path, sizeof path, "%s.damaged/shard-00000-of-00003.fsdp", s8);
  struct stat st;
  cr_assert(!stat(path, &st) && st.st_size == 1000, "the first one set aside was touched");
  free(root);
}

/* Retention keeps the newest `keep` whole checkpoints: one whose shard is
 * cut is not counted among them (the whole one below it stays). */
Test(ckpt, retention_never_counts_a_cut_checkpoint_as_kept) {
  char *root = mkdir_tmp("retaincut"), dir[4096], path[4096];
  for (int step = 4; step <= 12; step += 4) {
    snprintf(dir, sizeof dir, "%s/step-%08d", root, step);
    make_shards(dir, step);
    cr_assert_eq(ckpt_commit(dir, 3, NULL, RUN_A), 0, "%s", err_msg());
  }
  snprintf(path, sizeof path, "%s/step-00000012/shard-00002-of-00003.fsdp", root);
  cr_assert_eq(truncate(path, 1000), 0);
  cr_assert_eq(ckpt_retain(root, 2), 0, "%s", err_msg());
  for (int step = 4; step <= 12; step += 4) {
    snprintf(dir, sizeof dir, "%s/step-%08d", root, step);
    cr_expect_eq(access(dir, F_OK), 0, "step %d was removed", step);
  }
  cr_assert_eq(ckpt_retain(root, 1), 0, "%s", err_msg());
  snprintf(dir, sizeof dir, "%s/step-00000004", root);
  cr_expect_neq(access(dir, F_OK), 0, "step 4 is beyond the one kept");
  free(root);
}

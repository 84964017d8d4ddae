/* Tests of the training loop: the schedule, that training on the demo corpus
 * learns (a stated bound), bad jobs refused with a clear message, and the
 * fsdp-train command's exit codes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"
#include "daemon/train/train.h"
#include "tests/unit/testutil.h"

#define DEMO_CORPUS "/usr/share/games/fortunes/computers"

Test(train, lr_schedule_warmup_then_cosine) {
  config_t c;
  config_default(&c);
  c.steps = 100;
  c.warmup_steps = 10;
  c.lr = 1e-3f;
  c.min_lr_frac = 0.1f;
  cr_assert_float_eq(train_lr(&c, 0), 1e-4f, 1e-9);
  cr_assert_float_eq(train_lr(&c, 9), 1e-3f, 1e-9);
  cr_assert_float_eq(train_lr(&c, 10), 1e-3f, 1e-9, "decay starts at the peak");
  cr_assert_float_eq(train_lr(&c, 99), 1e-4f, 1e-9, "ends at min_lr_frac * lr");
  cr_assert_float_eq(train_lr(&c, 10 + 89 / 2.0), 5.5e-4f, 2e-5, "half-way is the mean");
  for (int s = 11; s < 100; s++) cr_assert_leq(train_lr(&c, s), train_lr(&c, s - 1));
}

/* The demo corpus as a byte-level token file. */
static char *demo_tokens(void) {
  FILE *f = fopen(DEMO_CORPUS, "rb");
  cr_assert_not_null(f, "%s is missing: install the Debian package fortunes (make does)", DEMO_CORPUS);
  static uint16_t tok[1 << 21];
  size_t n = 0;
  int ch;
  while (n < sizeof tok / sizeof tok[0] && (ch = fgetc(f)) != EOF) tok[n++] = (uint16_t)ch;
  fclose(f);
  char *path = tu_path("demo.bin");
  cr_assert_eq(data_write(path, tok, n), 0, "%s", err_msg());
  return path;
}

/* Stated bound: the tiny preset (2 layers, 64 channels) on the demo corpus
 * starts at ln(256) = 5.55 and must be below 2.9 in training and held-out loss
 * within 300 steps of 8 x 64 tokens. */
Test(train, learns_the_demo_corpus, .timeout = 300) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 300;
  c.batch = 8;
  c.seq_len = 64;
  c.lr = 3e-3f;
  c.warmup_steps = 20;
  c.eval_batches = 16;
  c.threads = 2;
  train_result_t r;
  int rc = train_run(&c, NULL, &r);
  cr_assert_eq(rc, 0, "%s", err_msg());
  cr_log_info("loss %.4f -> %.4f, eval %.4f, %.0f tok/s", r.first_loss, r.last_loss, r.eval_loss,
              r.tokens_per_s);
  cr_assert(fabsf(r.first_loss - logf(256)) < 0.2f, "starts near ln(256): %f", r.first_loss);
  cr_assert_lt(r.last_loss, 2.9f);
  cr_assert_lt(r.eval_loss, 2.9f);
  cr_assert_eq(r.steps_done, 300);
  free(data);
}

Test(train, missing_data_file_is_named) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", "/nonexistent/tokens.bin"), 0);
  train_result_t r;
  int rc = train_run(&c, NULL, &r);
  cr_assert_eq(rc, FSDP_ENOENT);
  cr_assert(strstr(err_msg(), "/nonexistent/tokens.bin"), "%s", err_msg());
}

Test(train, init_from_must_match_the_model) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 2;
  c.warmup_steps = 1;
  c.seq_len = 32;
  char *w = tu_path("w.bin");
  cr_assert_eq(config_set(&c, "save", w), 0);
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  c.save[0] = 0;
  cr_assert_eq(config_set(&c, "init_from", w), 0);
  cr_assert_eq(train_run(&c, NULL, &r), 0, "resume from saved weights: %s", err_msg());
  cr_assert_eq(config_set(&c, "layers", "3"), 0);
  cr_assert_eq(train_run(&c, NULL, &r), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "init_from") && strstr(err_msg(), "layers 2"), "%s", err_msg());
  free(w);
  free(data);
}

static int run_cmd(const char *args, char *out, size_t len) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s/bin/fsdp-train %s 2>&1", tu_root(), args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(out, 1, len - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(train, command_exit_codes_and_messages) {
  char out[65536];
  cr_assert_eq(run_cmd("--help", out, sizeof out), 0);
  cr_assert(strstr(out, "--grad_accum") && strstr(out, "[optim]"), "%s", out);
  cr_assert_eq(run_cmd("--model tiny --heads 3 --data x.bin", out, sizeof out), 2);
  cr_assert(strstr(out, "heads") && strstr(out, "divisible"), "%s", out);
  cr_assert_eq(run_cmd("--batch 0", out, sizeof out), 2);
  cr_assert(strstr(out, "batch"), "%s", out);
  cr_assert_eq(run_cmd("--no-such-flag 1", out, sizeof out), 2);
  cr_assert_eq(run_cmd("--data /nonexistent/t.bin", out, sizeof out), 1);
  cr_assert(strstr(out, "/nonexistent/t.bin"), "%s", out);
}

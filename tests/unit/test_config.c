/* Unit tests of the job options: parsing from text, job files, and the checks
 * that name the option and the fix. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/train/config.h"
#include "tests/unit/testutil.h"

static config_t base(void) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", "/tmp/x.bin"), 0);
  return c;
}

Test(config, sets_typed_values) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "steps", "250"), 0);
  cr_assert_eq(config_set(&c, "lr", "3e-4"), 0);
  cr_assert_eq(config_set(&c, "seed", "0xdeadbeef"), 0);
  cr_assert_eq(config_set(&c, "eval_fraction", "0.25"), 0);
  cr_assert_eq(c.steps, 250);
  cr_assert_float_eq(c.lr, 3e-4f, 1e-10);
  cr_assert_eq(c.seed, 0xdeadbeefu);
  cr_assert_float_eq(c.eval_fraction, 0.25, 1e-12);
}

Test(config, bad_values_name_the_key) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "batch", "0"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "batch") && strstr(err_msg(), "out of range"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "batch", "-4"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "batch"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "steps", "ten"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "steps") && strstr(err_msg(), "not a number"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "steps", "2.5"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "whole number"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "seed", "-1"), FSDP_EINVAL);
  cr_assert_eq(config_set(&c, "lr", "nan"), FSDP_EINVAL);
  cr_assert_eq(config_set(&c, "learning_rate", "1"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "unknown option \"learning_rate\""), "%s", err_msg());
  cr_assert_eq(c.batch, 4, "a rejected value leaves the option unchanged");
}

Test(config, cross_field_checks) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "seq_len", "65"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "seq_len") && strstr(err_msg(), "context 64"), "%s", err_msg());
  c = base();
  cr_assert_eq(config_set(&c, "heads", "5"), 0); /* small preset: 256 channels */
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "heads") && strstr(err_msg(), "divisible"), "%s", err_msg());
  c = base();
  cr_assert_eq(config_set(&c, "model", "gpt2-9000b"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "gpt2-9000b"), "%s", err_msg());
  c = base();
  c.data[0] = 0;
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "data"), "%s", err_msg());
  c = base();
  cr_assert_eq(config_set(&c, "warmup_steps", "500"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "warmup_steps"), "%s", err_msg());
}

Test(config, explicit_dimensions_override_the_preset) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "layers", "3"), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "seq_len", "32"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert_eq(c.gpt.layers, 3, "explicit layers win whatever the order");
  cr_assert_eq(c.gpt.channels, 64);
  c = base();
  cr_assert_eq(config_set(&c, "model", ""), 0);
  cr_assert_eq(config_set(&c, "layers", "2"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "channels"), "%s", err_msg());
}

Test(config, job_file_round_trip) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "steps", "77"), 0);
  cr_assert_eq(config_set(&c, "lr", "0.002"), 0);
  cr_assert_eq(config_set(&c, "save", "/tmp/out.bin"), 0);
  char *path = tu_path("job.conf");
  FILE *f = fopen(path, "w");
  config_write(&c, f);
  fclose(f);
  config_t d;
  config_default(&d);
  cr_assert_eq(config_load_file(&d, path), 0, "%s", err_msg());
  cr_assert_eq(d.steps, 77);
  cr_assert_float_eq(d.lr, 0.002f, 1e-9);
  cr_assert_str_eq(d.save, "/tmp/out.bin");
  cr_assert_str_eq(d.data, "/tmp/x.bin");
  free(path);
}

Test(config, job_file_errors_name_file_and_key) {
  config_t c;
  config_default(&c);
  char *path = tu_path("bad.conf");
  const char *bad_value = "[train]\nsteps = 10\nbatch = zero\n";
  tu_write_file(path, bad_value, strlen(bad_value));
  cr_assert_eq(config_load_file(&c, path), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), path) && strstr(err_msg(), "batch"), "%s", err_msg());
  const char *wrong_section = "[optim]\nsteps = 10\n";
  tu_write_file(path, wrong_section, strlen(wrong_section));
  cr_assert_eq(config_load_file(&c, path), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "[train]"), "%s", err_msg());
  const char *garbage = "steps = 10\nthis is not an option line\n";
  tu_write_file(path, garbage, strlen(garbage));
  cr_assert_eq(config_load_file(&c, path), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), ":2:"), "the line is named: %s", err_msg());
  cr_assert_eq(config_load_file(&c, "/nonexistent/job.conf"), FSDP_ENOENT);
  cr_assert(strstr(err_msg(), "/nonexistent/job.conf"), "%s", err_msg());
  free(path);
}

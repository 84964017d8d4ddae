/* Unit tests of the job options: parsing from text, job files, defaults fitted
 * to the model and the run (and explicit values refused instead), the printed
 * job file, and the checks that name the option and the fix. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/job/config.h"
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
  cr_assert_eq(config_set(&c, "seed", "3735928559"), 0);
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
  /* an integer's range in whole numbers (not 1.04858e+06) */
  cr_assert(strstr(err_msg(), "from 1 to 1048576 "), "%s", err_msg());
  cr_assert_eq(config_set(&c, "batch", "-4"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "batch"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "steps", "ten"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "steps") && strstr(err_msg(), "not a whole number"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "steps", "2.5"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "whole number"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "lr", "ten"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "lr") && strstr(err_msg(), "not a number"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "seed", "-1"), FSDP_EINVAL);
  cr_assert_eq(config_set(&c, "lr", "nan"), FSDP_EINVAL);
  cr_assert_eq(config_set(&c, "learning_rate", "1"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "unknown option \"learning_rate\""), "%s", err_msg());
  cr_assert_eq(c.batch, 4, "a rejected value leaves the option unchanged");
}

/* One rule for every integer option, seed's too: decimal digits, leading
 * zeros decimal (seed read 010 as 8 and 0x10 as 16; steps read 1e3 as 1000);
 * a real number in decimal, not hexadecimal (lr took 0x1p-10). */
Test(config, integers_are_decimal_digits) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "seed", "010"), 0, "%s", err_msg());
  cr_assert_eq(c.seed, 10);
  cr_assert_eq(config_set(&c, "steps", "010"), 0, "%s", err_msg());
  cr_assert_eq(c.steps, 10);
  cr_assert_eq(config_set(&c, "seed", "18446744073709551615"), 0, "%s", err_msg());
  cr_assert_eq(c.seed, UINT64_MAX);
  cr_assert_eq(config_set(&c, "recompute", "-1"), 0, "%s", err_msg());
  static const char *const bad[][2] = {{"seed", "0x10"}, {"steps", "0x10"}, {"steps", "1e3"},
                                       {"seed", "1e3"}, {"steps", "+5"}, {"steps", "5 "},
                                       {"seed", "-"}, {"steps", "10.0"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(config_set(&c, bad[i][0], bad[i][1]), FSDP_EINVAL, "%s %s", bad[i][0], bad[i][1]);
    cr_expect(strstr(err_msg(), bad[i][0]) && strstr(err_msg(), "decimal digits"), "%s",
              err_msg());
  }
  cr_assert_eq(config_set(&c, "seed", "18446744073709551616"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "seed") && strstr(err_msg(), "out of range"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "steps", "99999999999999999999"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "steps") && strstr(err_msg(), "out of range"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "lr", "0x1p-10"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "lr") && strstr(err_msg(), "hexadecimal"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "lr", "-0X1p-10"), FSDP_EINVAL);
  cr_assert_eq(config_set(&c, "lr", "1e-3"), 0, "%s", err_msg());
  cr_assert_float_eq(c.lr, 1e-3f, 1e-9);
  cr_assert_eq(c.seed, UINT64_MAX, "a rejected value leaves the option unchanged");
  cr_assert_eq(c.steps, 10);
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
  /* the device and what only a GPU has */
  c = base();
  cr_assert_eq(config_set(&c, "device", "gpu"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "device") && strstr(err_msg(), "cpu or cuda"), "%s", err_msg());
  c = base();
  cr_assert_eq(config_set(&c, "tf32", "1"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "tf32") && strstr(err_msg(), "device = cuda"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "device", "cuda"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert_eq(config_set(&c, "offload", "1"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "offload") && strstr(err_msg(), "cuda"), "%s", err_msg());
  /* and what only a CPU device has: said (before, ignored without a word),
   * not refused, so that a job stored with it still resolves */
  cr_assert_eq(config_set(&c, "offload", "0"), 0);
  cr_assert_eq(config_set(&c, "threads", "8"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert(strstr(config_adjusted(&c), "threads = 8 is ignored"), "%s", config_adjusted(&c));
  cr_assert_eq(config_set(&c, "device", "cpu"), 0);
  cr_assert_eq(config_set(&c, "tf32", "0"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert(!strstr(config_adjusted(&c), "threads"), "%s", config_adjusted(&c));
}

/* Options that run, but not as meant (an outside tester found each
 * accepted without a word): said at the check, or refused where the value
 * cannot mean anything. */
Test(config, options_that_run_otherwise_than_meant_are_said) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "strategy", "HYBRID_SHARD"), 0);
  cr_assert_eq(config_check(&c, 8, NULL, NULL), 0, "%s", err_msg());
  cr_assert(strstr(config_adjusted(&c), "HYBRID_SHARD without a mesh: one replica of all 8 ranks, "
                   "the same as FULL_SHARD") && strstr(config_adjusted(&c), "mesh = RxS (e.g. 4x2)"),
            "%s", config_adjusted(&c));
  cr_assert_eq(config_set(&c, "mesh", "4x2"), 0);
  cr_assert_eq(config_check(&c, 8, NULL, NULL), 0, "%s", err_msg());
  cr_assert(!strstr(config_adjusted(&c), "mesh"), "%s", config_adjusted(&c));
  c = base();
  cr_assert_eq(config_set(&c, "min_params", "1.5"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "min_params: 1.5 is not a whole number"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "min_params", "1e15"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert(strstr(config_adjusted(&c), "is more than the model's") &&
            strstr(config_adjusted(&c), "one unit"), "%s", config_adjusted(&c));
  c = base();
  cr_assert_eq(config_set(&c, "keep_unsharded_grads", "1"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert(strstr(config_adjusted(&c), "keep_unsharded_grads = 1 does nothing with grad_accum 1"),
            "%s", config_adjusted(&c));
  cr_assert_eq(config_set(&c, "grad_accum", "2"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert(!strstr(config_adjusted(&c), "keep_unsharded"), "%s", config_adjusted(&c));
}

/* The first runs a new user tries: `--model tiny` (the default seq_len 256 is
 * longer than tiny's context 64) and `--steps 5` (the default warmup of 10 is
 * longer than the run). Defaults give way, and the note says how. */
Test(config, defaults_fit_the_model_and_the_run) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "steps", "5"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert_eq(c.seq_len, 64, "seq_len follows tiny's context");
  cr_assert_eq(c.warmup_steps, 5, "warmup is clipped to the run");
  const char *note = config_adjusted(&c);
  cr_assert(strstr(note, "seq_len = 64") && strstr(note, "256") && strstr(note, "context"), "%s", note);
  cr_assert(strstr(note, "warmup_steps = 5") && strstr(note, "10"), "%s", note);
  cr_assert_eq(config_is_given(&c, "seq_len"), 1, "an adjusted value is the job's from now on");
  cr_assert_eq(config_finish(&c), 0, "finishing twice (main, then train_open) is harmless");
  cr_assert_eq(c.seq_len, 64);
  /* what fits is left alone, and nothing is noted */
  c = base();
  cr_assert_eq(config_set(&c, "steps", "5"), 0);
  cr_assert_eq(config_set(&c, "warmup_steps", "2"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert_eq(c.seq_len, 256, "small's context is 256: the default fits");
  cr_assert_eq(c.warmup_steps, 2);
  cr_assert_str_eq(config_adjusted(&c), "");
  /* a context shortened explicitly shortens the default seq_len the same way */
  c = base();
  cr_assert_eq(config_set(&c, "context", "100"), 0);
  cr_assert_eq(config_finish(&c), 0, "%s", err_msg());
  cr_assert_eq(c.seq_len, 100);
  cr_assert_eq(c.warmup_steps, 10, "a default warmup within the run stays");
}

/* What the user set is theirs: a value that does not fit is refused with the
 * option and the fix, even when it equals the default. */
Test(config, explicit_values_that_do_not_fit_are_refused) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "seq_len", "256"), 0);
  cr_assert_eq(config_is_given(&c, "seq_len"), 1);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "seq_len: 256") && strstr(err_msg(), "context 64") &&
            strstr(err_msg(), "shorten seq_len"), "%s", err_msg());
  c = base();
  cr_assert_eq(config_set(&c, "steps", "5"), 0);
  cr_assert_eq(config_set(&c, "warmup_steps", "10"), 0);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "warmup_steps: 10") && strstr(err_msg(), "steps 5") &&
            strstr(err_msg(), "raise steps"), "%s", err_msg());
  /* code that writes a field directly with a value of its own set it too */
  c = base();
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.seq_len = 128;
  cr_assert_eq(config_is_given(&c, "seq_len"), 1);
  cr_assert_eq(config_finish(&c), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "seq_len: 128"), "%s", err_msg());
  cr_assert_eq(config_is_given(&c, "no_such_option"), -1);
}

/* Loads text as a job file over the defaults (and data) into *c, then
 * finishes it: config_finish's code. */
static int finish_job_text(config_t *c, const char *text) {
  char *path = tu_path("job_text.conf");
  tu_write_file(path, text, strlen(text));
  *c = base();
  cr_assert_eq(config_load_file(c, path), 0, "%s", err_msg());
  free(path);
  return config_finish(c);
}

/* A job file is the user's word, like a flag: its values are explicit; the
 * keys it leaves out keep defaults that fit themselves. */
Test(config, a_job_file_counts_as_explicit) {
  config_t c;
  cr_assert_eq(finish_job_text(&c, "[model]\nmodel = tiny\n[train]\nseq_len = 256\n"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "seq_len: 256"), "%s", err_msg());
  cr_assert_eq(finish_job_text(&c, "[train]\nsteps = 5\n[optim]\nwarmup_steps = 10\n"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "warmup_steps: 10"), "%s", err_msg());
  cr_assert_eq(finish_job_text(&c, "[model]\nmodel = tiny\n[train]\nsteps = 5\n"), 0, "%s", err_msg());
  cr_assert_eq(c.seq_len, 64);
  cr_assert_eq(c.warmup_steps, 5);
}

/* Reads a whole file (the tests' small job files) into a malloc'd string. */
/* --print-config prints the job as it would run: the preset's dimensions
 * (not the 0 that means "the preset's") and the fitted defaults, as comments
 * since they follow the other options; read back, it describes the same run. */
Test(config, the_printed_job_is_the_effective_one) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "steps", "5"), 0);
  cr_assert_eq(config_resolve(&c), 0, "%s", err_msg());
  char *path = tu_path("effective.conf");
  FILE *f = fopen(path, "w");
  config_write(&c, f);
  fclose(f);
  char *text = tu_slurp(path, NULL);
  const char *want[] = {"\nmodel = tiny\n", "\n; layers = 2\n", "\n; channels = 64\n",
                        "\n; heads = 4\n", "\n; vocab = 256\n", "\n; context = 64\n",
                        "\n; seq_len = 64\n", "\n; warmup_steps = 5\n", "\nsteps = 5\n",
                        "\nsample_prompt = \"The \"\n"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_assert(strstr(text, want[i]), "missing %s in:\n%s", want[i], text);
  config_t d;
  config_default(&d);
  cr_assert_eq(config_load_file(&d, path), 0, "%s", err_msg());
  cr_assert_eq(config_finish(&d), 0, "%s", err_msg());
  cr_assert(!memcmp(&d.gpt, &c.gpt, sizeof c.gpt), "same model");
  cr_assert_eq(d.seq_len, c.seq_len);
  cr_assert_eq(d.warmup_steps, c.warmup_steps);
  cr_assert_str_eq(d.sample_prompt, "The ", "the prompt's trailing space survives the file");
  /* a value no job file line can hold is refused, naming it, and nothing written */
  config_t q = c;
  cr_assert_eq(config_set(&q, "sample_prompt", "Hi ; there"), 0);
  char buf[64] = "";
  FILE *mf = fmemopen(buf, sizeof buf, "w");
  cr_assert_eq(config_write(&q, mf), FSDP_EINVAL, "a ' ;' was written");
  fclose(mf);
  cr_assert(strstr(err_msg(), "sample_prompt") && strstr(err_msg(), "comment"), "%s", err_msg());
  cr_assert_str_eq(buf, "", "part of a job file was written");
  /* another model set after resolving: the dimensions printed are its own
   * again (the set ones), not the stale preset's */
  cr_assert_eq(config_set(&c, "model", "small"), 0);
  f = fopen(path, "w");
  config_write(&c, f);
  fclose(f);
  free(text);
  text = tu_slurp(path, NULL);
  cr_assert(strstr(text, "\n; layers = 0\n"), "%s", text);
  free(text);
  free(path);
}

/* The command: `fsdp-train --print-config --model tiny` with no data file yet
 * prints tiny's dimensions, and on stderr the note on what it fitted. */
Test(config, fsdp_train_print_config) {
  char out[16384];
  cr_assert_eq(tu_run_bin("fsdp-train", "--print-config --model tiny --steps 5", out, sizeof out), 0,
               "%s", out);
  cr_assert(strstr(out, "layers = 2\n") && strstr(out, "channels = 64\n") &&
            strstr(out, "seq_len = 64\n") && strstr(out, "warmup_steps = 5\n"), "%s", out);
  cr_assert(strstr(out, "fsdp-train: note: seq_len = 64"), "%s", out);
  cr_assert_eq(tu_run_bin("fsdp-train", "--print-config --model gpt2-9000b", out, sizeof out), 2);
  cr_assert(strstr(out, "gpt2-9000b"), "%s", out);
}

/* --print-config checks the job as a run does: the same message and exit
 * status 2 (it printed and exited 0), all but the data file, which the
 * command that runs the file may give. */
Test(config, fsdp_train_print_config_checks_like_a_run) {
  char out[16384];
  static const char *const bad[][2] = {
      {"--model tiny --seq_len 65", "seq_len: 65 is longer than the model's context 64"},
      {"--model tiny --steps 5 --warmup_steps 6", "warmup_steps: 6 is more than steps 5"},
      {"--precision bf16 --strategy FOO --device gpu", "strategy: unknown \"FOO\""},
      {"--precision bf16", "precision"},
      {"--device gpu", "device: \"gpu\" is not a kind of device"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char args[256];
    snprintf(args, sizeof args, "--print-config %s", bad[i][0]);
    cr_expect_eq(tu_run_bin("fsdp-train", args, out, sizeof out), 2, "%s: %s", args, out);
    cr_expect(strstr(out, bad[i][1]) && !strstr(out, "[model]"), "%s: %s", args, out);
    snprintf(args, sizeof args, "--data /nonexistent %s", bad[i][0]);
    cr_expect_eq(tu_run_bin("fsdp-train", args, out, sizeof out), 2, "a run: %s: %s", args, out);
    cr_expect(strstr(out, bad[i][1]), "a run: %s: %s", args, out);
  }
}

/* A second --config is refused, naming both (the first was silently
 * dropped); a repeated option flag keeps the usual last-wins. */
Test(config, fsdp_train_config_given_twice_is_refused) {
  char out[16384], args[512];
  char *a = tu_path("a.conf"), *b = tu_path("b.conf");
  FILE *f = fopen(a, "w");
  fputs("steps = 7\n", f);
  fclose(f);
  f = fopen(b, "w");
  fputs("batch = 3\n", f);
  fclose(f);
  snprintf(args, sizeof args, "--config %s --config %s --print-config", a, b);
  cr_assert_eq(tu_run_bin("fsdp-train", args, out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "--config given twice") && strstr(out, a) && strstr(out, b), "%s", out);
  snprintf(args, sizeof args, "--config %s --steps 8 --steps 9 --print-config", a);
  cr_assert_eq(tu_run_bin("fsdp-train", args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "\nsteps = 9\n"), "%s", out);
  free(a);
  free(b);
}

/* README's recipe: the printed file run with other flags (fewer steps than
 * the default warmup, another model) runs as those options would have, the
 * defaults fitted again (a printed warmup_steps 10 once refused --steps 1). */
Test(config, fsdp_train_printed_job_fed_back_with_flags) {
  char out[16384], args[512];
  char *path = tu_path("printed.conf");
  snprintf(args, sizeof args, "--print-config --model small --data corpus.bin");
  cr_assert_eq(tu_run_bin("fsdp-train", args, out, sizeof out), 0, "%s", out);
  FILE *f = fopen(path, "w");
  fputs(out, f);
  fclose(f);
  snprintf(args, sizeof args, "--config %s --steps 1 --sample_tokens 300 --print-config", path);
  cr_assert_eq(tu_run_bin("fsdp-train", args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "\nsteps = 1\n") && strstr(out, "\n; warmup_steps = 1\n"), "%s", out);
  snprintf(args, sizeof args, "--config %s --model tiny --print-config", path);
  cr_assert_eq(tu_run_bin("fsdp-train", args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "\n; layers = 2\n") && strstr(out, "\n; seq_len = 64\n"), "%s", out);
  free(path);
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

/* c written as a job file (its path returned: free it) and read back over
 * the defaults into *d. */
static char *write_and_read(const config_t *c, config_t *d) {
  char *path = tu_path("job.conf");
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  cr_assert_eq(config_write(c, f), 0, "%s", err_msg());
  fclose(f);
  config_default(d);
  cr_assert_eq(config_load_file(d, path), 0, "%s", err_msg());
  return path;
}

Test(config, job_file_round_trip) {
  config_t c = base();
  cr_assert_eq(config_set(&c, "steps", "77"), 0);
  cr_assert_eq(config_set(&c, "lr", "0.002"), 0);
  cr_assert_eq(config_set(&c, "save", "/tmp/out.bin"), 0);
  config_t d;
  char *path = write_and_read(&c, &d);
  cr_assert_eq(d.steps, 77);
  cr_assert_float_eq(d.lr, 0.002f, 1e-9);
  cr_assert_str_eq(d.save, "/tmp/out.bin");
  cr_assert_str_eq(d.data, "/tmp/x.bin");
  free(path);
}

/* text written as the job file path and loaded over the defaults into *c:
 * config_load_file's code. */
static int load_text(config_t *c, const char *path, const char *text) {
  tu_write_file(path, text, strlen(text));
  config_default(c);
  return config_load_file(c, path);
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
  /* a line libinih would cut in two: the part past the cut is not an option */
  char longline[400];
  snprintf(longline, sizeof longline, "steps = 10\n[output]\nsample_prompt = %0183d%s\n", 0,
           "save = /elsewhere/x.bin");
  tu_write_file(path, longline, strlen(longline));
  config_default(&c);
  cr_assert_eq(config_load_file(&c, path), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), ":3:") && strstr(err_msg(), "199"), "%s", err_msg());
  cr_assert_str_eq(c.save, "", "the option past the cut was taken: %s", c.save);
  cr_assert_eq(config_load_file(&c, "/nonexistent/job.conf"), FSDP_ENOENT);
  cr_assert(strstr(err_msg(), "/nonexistent/job.conf"), "%s", err_msg());
  free(path);
}

/* What a hand-written job file may do wrong, each refused or read as meant
 * (helper-55's review): an indented line is a line of its own, not the
 * continuation of the previous value libinih would make it; a key set twice
 * is refused, not last-wins; a directory is not an empty job file. */
Test(config, hand_written_job_files_are_read_as_meant) {
  config_t c;
  char *path = tu_path("hand.conf");
  cr_assert_eq(load_text(&c, path, "[output]\n  save = out.weights\n\tsample_tokens = 40\n"
                                   "[train]\n    steps = 9\n"), 0, "%s", err_msg());
  cr_assert_str_eq(c.save, "out.weights");
  cr_assert_eq(c.sample_tokens, 40);
  cr_assert_eq(c.steps, 9);
  cr_assert_eq(load_text(&c, path, "[train]\nsteps = 5\nsteps = 7\n"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "steps is set twice") && strstr(err_msg(), path), "%s", err_msg());
  config_default(&c);
  cr_assert_eq(config_load_file(&c, tu_tmpdir()), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "not a regular file"), "%s", err_msg());
  free(path);
}

/* A FIFO as the job file is refused at once (fopen waited for a writer,
 * forever), as a directory and /dev/null are; a link to a job file is
 * followed, and a missing file is named. */
Test(config, a_job_file_that_is_not_a_regular_file_is_refused_at_once, .timeout = 20) {
  config_t c;
  char *fifo = tu_path("job.fifo"), *real = tu_path("real.conf"), *link = tu_path("link.conf");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  config_default(&c);
  cr_assert_eq(config_load_file(&c, fifo), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), fifo) && strstr(err_msg(), "not a regular file"), "%s", err_msg());
  cr_assert_eq(config_load_file(&c, "/dev/null"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "not a regular file"), "%s", err_msg());
  cr_assert_eq(load_text(&c, real, "steps = 6\n"), 0, "%s", err_msg());
  cr_assert_eq(symlink(real, link), 0);
  config_default(&c);
  cr_assert_eq(config_load_file(&c, link), 0, "%s", err_msg());
  cr_assert_eq(c.steps, 6);
  unlink(real);
  cr_assert_eq(config_load_file(&c, real), FSDP_ENOENT);
  cr_assert(strstr(err_msg(), "job file") && strstr(err_msg(), real), "%s", err_msg());
  char out[4096], args[512]; /* the command the tester ran */
  snprintf(args, sizeof args, "--config %s --print-config", fifo);
  cr_assert_eq(tu_run_bin("fsdp-train", args, out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "not a regular file"), "%s", out);
  free(fifo);
  free(real);
  free(link);
}

/* A printed job runs the same job: reals print as the shortest text that
 * reads back bit for bit (%g's six digits did not), and numbers a float
 * cannot hold, or with a space before them, are refused. */
Test(config, printed_reals_read_back_exactly_and_odd_numbers_are_refused) {
  config_t c = base(), d;
  cr_assert_eq(config_set(&c, "lr", "0.00123456789"), 0);
  cr_assert_eq(config_set(&c, "eval_fraction", "0.123456789012345"), 0);
  cr_assert_eq(config_set(&c, "min_lr_frac", "0.1"), 0);
  char *path = write_and_read(&c, &d);
  cr_assert(d.lr == c.lr && d.eval_fraction == c.eval_fraction && d.min_lr_frac == c.min_lr_frac,
            "lr %.9g/%.9g, eval_fraction %.17g/%.17g", (double)d.lr, (double)c.lr, d.eval_fraction,
            c.eval_fraction);
  size_t n;
  char *text = tu_slurp(path, &n);
  cr_assert(strstr(text, "min_lr_frac = 0.1\n"), "0.1 prints as 0.1:\n%s", text);
  free(text), free(path);
  cr_assert_eq(config_set(&c, "seed", " -1"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "starts with a space"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "lr", "1e-50"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "would be 0"), "%s", err_msg());
  cr_assert_eq(config_set(&c, "lr", "0"), 0);
}

/* Unit tests of the tunables: defaults, environment overrides, bad values.
 * Each Criterion test runs in its own process, so setenv before the first read
 * decides what that test sees. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/param.h"

Test(param, default_when_unset) {
  unsetenv("FSDP_ATTN_BLOCK");
  cr_assert_eq(param_attn_block(), 64);
}

Test(param, environment_overrides) {
  setenv("FSDP_THREADS", "3", 1);
  cr_assert_eq(param_threads(), 3);
  setenv("FSDP_THREADS", "5", 1);
  cr_assert_eq(param_threads(), 3, "read once, on first use");
}

Test(param, bad_value_keeps_default) {
  setenv("FSDP_PROGRESS_EVERY", "often", 1);
  cr_assert_eq(param_progress_every(), 1);
}

/* What param.c wrote on stderr while fn ran. */
static char *stderr_of(void (*fn)(void)) {
  static char buf[4096];
  FILE *tmp = tmpfile();
  cr_assert(tmp);
  fflush(stderr);
  const int keep = dup(2);
  dup2(fileno(tmp), 2);
  fn();
  fflush(stderr);
  dup2(keep, 2);
  close(keep);
  rewind(tmp);
  const size_t n = fread(buf, 1, sizeof buf - 1, tmp);
  buf[n] = 0;
  fclose(tmp);
  return buf;
}

static int64_t got[4];
static void read_four(void) {
  got[0] = param_threads(), got[1] = param_comm_timeout_ms();
  got[2] = param_log_level(), got[3] = param_progress_every();
}

/* Out of its range (param.h's list): said, naming the variable, the range and
 * the value used, the default; FSDP_THREADS=100000 once crashed libgomp. */
Test(param, out_of_range_warns_and_keeps_default) {
  setenv("FSDP_THREADS", "100000", 1);
  setenv("FSDP_COMM_TIMEOUT_MS", "0", 1);
  setenv("FSDP_LOG_LEVEL", "9", 1);
  setenv("FSDP_PROGRESS_EVERY", "-5", 1);
  const char *err = stderr_of(read_four);
  cr_assert_eq(got[0], 0);
  cr_assert_eq(got[1], 5000);
  cr_assert_eq(got[2], 2);
  cr_assert_eq(got[3], 1);
  cr_assert(strstr(err, "FSDP_THREADS=100000 is outside its range, 0 to 4096; using the default 0"), "%s", err);
  cr_assert(strstr(err, "FSDP_COMM_TIMEOUT_MS=0 is outside its range, 1 to 86400000; using the "
                        "default 5000"), "%s", err);
  cr_assert(strstr(err, "FSDP_LOG_LEVEL=9 is outside its range, 0 to 3"), "%s", err);
  cr_assert(strstr(err, "FSDP_PROGRESS_EVERY=-5 is outside its range, 1 to"), "%s", err);
}

Test(param, in_range_is_taken_without_a_word) {
  setenv("FSDP_THREADS", "4096", 1);
  setenv("FSDP_COMM_TIMEOUT_MS", "1", 1);
  setenv("FSDP_LOG_LEVEL", "0", 1);
  setenv("FSDP_PROGRESS_EVERY", "010", 1); /* decimal: ten, not octal eight */
  const char *err = stderr_of(read_four);
  cr_assert(got[0] == 4096 && got[1] == 1 && got[2] == 0 && got[3] == 10, "%s", err);
  cr_assert_str_eq(err, "");
}

Test(param, hex_is_not_a_decimal_integer) {
  setenv("FSDP_COMM_TIMEOUT_MS", "0x10", 1);
  cr_assert_eq(param_comm_timeout_ms(), 5000);
}

/* A PARAM_REFUSE tunable keeps its value and param_check() refuses it by name. */
Test(param, refused_out_of_range_is_named_by_check) {
  setenv("FSDP_CUDA_GEMM_ALGO", "16", 1);
  cr_assert_eq(param_cuda_gemm_algo(), 16);
  cr_assert_eq(param_check(), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "FSDP_CUDA_GEMM_ALGO: 16; give 0 to 15, or unset it"), "%s", err_msg());
}

Test(param, in_range_passes_check) {
  setenv("FSDP_CUDA_GEMM_ALGO", "15", 1);
  cr_assert_eq(param_check(), FSDP_OK);
}

/* The list itself: every default inside its range, every range not empty. */
Test(param, every_default_is_in_its_range) {
#define XX(name, env, def, lo, hi, bad, help) \
  cr_assert((lo) <= (def) && (def) <= (hi), "%s: default %lld outside %lld to %lld", env, \
            (long long)(def), (long long)(lo), (long long)(hi));
  FSDP_PARAM_LIST(XX)
#undef XX
}

Test(param, dump_lists_every_variable) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  param_dump(f);
  fclose(f);
  cr_assert(strstr(buf, "FSDP_THREADS") && strstr(buf, "FSDP_LOG_LEVEL"), "%s", buf);
  free(buf);
}

/* The plan's tunables a coordinator sends (param.h): the first
 * PARAM_PLAN_ENV_BASE always, a later one where it is not at its default;
 * each named by its entry, its default written as a node sets it. */
static int plan_sent(const char *name) {
  for (int i = 0; i < PARAM_PLAN_ENV_N; i++) {
    char e[PARAM_PLAN_ENV_LEN];
    param_plan_env(i, e);
    if (!strncmp(e, name, strlen(name)) && e[strlen(name)] == '=') return param_plan_env_sent(i);
  }
  cr_assert_fail("%s is not a plan tunable", name);
  return -1;
}

Test(param, plan_tunables_past_the_base_are_sent_only_when_set) {
  unsetenv("FSDP_CUDA_ATTN_CUDNN");
  setenv("FSDP_ATTN_BLOCK", "64", 1); /* the base: sent at its default too */
  cr_assert_eq(plan_sent("FSDP_ATTN_BLOCK"), 1);
  cr_assert_eq(plan_sent("FSDP_CUDA_ATTN_CUDNN"), 0, "at its default: not sent");
  for (int i = 0; i < PARAM_PLAN_ENV_N; i++) {
    char e[PARAM_PLAN_ENV_LEN], d[PARAM_PLAN_ENV_LEN];
    param_plan_env(i, e), param_plan_env_default(i, d);
    cr_assert_eq(param_plan_env_index(e), i, "%s", e);
    cr_assert_eq(param_plan_env_index(d), i, "%s", d);
    cr_assert(param_plan_env_ok(d), "%s", d);
    cr_assert_eq(param_plan_env_sent(i), i < PARAM_PLAN_ENV_BASE || strcmp(e, d), "%s (%s)", e, d);
  }
  char d[PARAM_PLAN_ENV_LEN];
  param_plan_env_default(PARAM_PLAN_ENV_N - 1, d);
  cr_assert_str_eq(d, "FSDP_CUDA_ATTN_CUDNN=0");
  cr_assert_eq(param_plan_env_index("FSDP_CUDA_ATTN_CUDNNX=1"), -1);
  cr_assert_eq(param_plan_env_index("LD_PRELOAD=x"), -1);
}

Test(param, a_plan_tunable_past_the_base_set_is_sent) {
  setenv("FSDP_CUDA_ATTN_CUDNN", "1", 1);
  cr_assert_eq(plan_sent("FSDP_CUDA_ATTN_CUDNN"), 1);
}

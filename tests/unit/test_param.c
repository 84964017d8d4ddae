/* Unit tests of the tunables: defaults, environment overrides, bad values.
 * Each Criterion test runs in its own process, so setenv before the first read
 * decides what that test sees. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

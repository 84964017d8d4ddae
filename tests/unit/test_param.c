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

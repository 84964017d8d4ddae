/* testutil_train: the test helpers that need the engine (daemon/train), apart
 * from testutil.c so that tests of the coordinator link no training code. */
#include "testutil.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"

char *tu_token_file(const char *name, size_t n, uint64_t seed, int vocab) {
  uint16_t *tok = malloc(n * sizeof *tok);
  cr_assert_not_null(tok);
  for (size_t i = 0; i < n; i++) tok[i] = (uint16_t)(tu_rand_u64(&seed) % (uint64_t)vocab);
  char *path = tu_path(name);
  cr_assert_eq(data_write(path, tok, n), 0, "%s", err_msg());
  free(tok);
  return path;
}

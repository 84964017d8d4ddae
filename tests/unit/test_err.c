/* Unit tests of the error table and the per-thread message. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "daemon/common/err.h"

Test(err, names_and_descriptions_come_from_one_table) {
  cr_assert_str_eq(err_name(FSDP_EINVAL), "EINVAL");
  cr_assert_str_eq(err_name(FSDP_ETIMEDOUT), "ETIMEDOUT");
  cr_assert_str_eq(err_str(FSDP_ENOSPC), "no space left on device");
  cr_assert_str_eq(err_name(FSDP_OK), "OK");
  cr_assert_str_eq(err_name(12345), "EUNKNOWN");
  cr_assert(FSDP_EINVAL < 0 && FSDP_EINTERNAL < 0, "codes are negative");
}

Test(err, set_returns_code_and_keeps_message) {
  int rc = err_set(FSDP_ERANGE, "batch: %d is too big", 7);
  cr_assert_eq(rc, FSDP_ERANGE);
  cr_assert_str_eq(err_msg(), "batch: 7 is too big");
}

Test(err, wrap_prefixes_context) {
  err_set(FSDP_EIO, "disk on fire");
  int rc = err_wrap(FSDP_EIO, "saving %s", "w.bin");
  cr_assert_eq(rc, FSDP_EIO);
  cr_assert_str_eq(err_msg(), "saving w.bin: disk on fire");
}

Test(err, errno_mapping_and_text) {
  cr_assert_eq(err_from_errno(ENOSPC), FSDP_ENOSPC);
  cr_assert_eq(err_from_errno(ENOENT), FSDP_ENOENT);
  cr_assert_eq(err_from_errno(EPIPE), FSDP_EIO);
  err_set_errno(FSDP_ENOENT, ENOENT, "open %s", "x");
  cr_assert(strstr(err_msg(), "open x: ") && strstr(err_msg(), strerror(ENOENT)), "%s", err_msg());
}

Test(err, long_messages_are_truncated_not_overflowed) {
  char big[3000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  err_set(FSDP_EINVAL, "%s", big);
  err_wrap(FSDP_EINVAL, "%s", big);
  cr_assert(strlen(err_msg()) < 1024);
}

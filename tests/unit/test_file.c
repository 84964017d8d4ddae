/* Tests of file.c, the open of a file in a directory others may write: a
 * regular file opens (blocking, close-on-exec); a FIFO, for reading or for
 * writing, is refused at once with nobody at its other end (an open that
 * waited would hang this test past its timeout); a link is not followed; a
 * directory is refused; a missing file is FSDP_ENOENT. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "tests/unit/testutil.h"

Test(file, a_regular_file_opens_blocking_and_close_on_exec) {
  char *p = tu_path("regular");
  tu_write_file(p, "abc", 3);
  int fd = -1;
  cr_assert_eq(file_open_regular(p, O_RDONLY, 0, &fd), 0, "%s", err_msg());
  cr_expect_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "O_NONBLOCK is cleared");
  cr_expect(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  char b[4] = {0};
  cr_expect_eq(read(fd, b, sizeof b), 3);
  close(fd);
  /* created for writing, as a rank's log is */
  char *w = tu_path("created");
  cr_assert_eq(file_open_regular(w, O_WRONLY | O_CREAT | O_TRUNC, 0600, &fd), 0, "%s", err_msg());
  cr_expect_eq(write(fd, "x", 1), 1);
  close(fd);
  free(p), free(w);
}

Test(file, a_fifo_is_refused_at_once_for_reading_and_writing, .timeout = 10) {
  char *p = tu_path("fifo");
  cr_assert_eq(mkfifo(p, 0600), 0);
  int fd = -1;
  cr_expect_eq(file_open_regular(p, O_RDONLY, 0, &fd), FSDP_EFORMAT);
  cr_expect(strstr(err_msg(), "not a regular file") && strstr(err_msg(), p), "%s", err_msg());
  cr_expect_eq(fd, -1, "no descriptor given");
  cr_expect_eq(file_open_regular(p, O_WRONLY | O_CREAT | O_TRUNC, 0600, &fd), FSDP_EFORMAT,
               "writing to a FIFO with no reader: %s", err_msg());
  cr_expect(strstr(err_msg(), "not a regular file") && strstr(err_msg(), p), "%s", err_msg());
  /* with a reader at the other end the open succeeds, and is refused after */
  int r = open(p, O_RDONLY | O_NONBLOCK);
  cr_assert_geq(r, 0);
  cr_expect_eq(file_open_regular(p, O_WRONLY, 0, &fd), FSDP_EFORMAT, "%s", err_msg());
  close(r);
  free(p);
}

Test(file, a_link_a_directory_and_a_missing_file_are_refused) {
  char *t = tu_path("target"), *l = tu_path("link"), *d = tu_path("dir"), *m = tu_path("missing");
  tu_write_file(t, "abc", 3);
  cr_assert_eq(symlink(t, l), 0);
  cr_assert_eq(mkdir(d, 0700), 0);
  int fd = -1;
  cr_expect_lt(file_open_regular(l, O_RDONLY, 0, &fd), 0, "a link is not followed");
  cr_expect(strstr(err_msg(), l), "%s", err_msg());
  cr_expect_eq(file_open_regular(d, O_RDONLY, 0, &fd), FSDP_EFORMAT, "%s", err_msg());
  cr_expect_eq(file_open_regular(m, O_RDONLY, 0, &fd), FSDP_ENOENT, "%s", err_msg());
  cr_expect_eq(fd, -1);
  free(t), free(l), free(d), free(m);
}

/* Tests of file.c, the open of a file in a directory others may write: a
 * regular file opens (blocking, close-on-exec); a FIFO, for reading or for
 * writing, is refused at once with nobody at its other end (an open that
 * waited would hang this test past its timeout); a link is not followed; a
 * directory is refused; a missing file is FSDP_ENOENT. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
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

/* An output written by a temporary and a rename (file_output_check): what
 * the rename would replace is refused, naming the option, the path, what is
 * there and the fix; nothing there, or a regular file, passes. A link is
 * followed: one to /dev/null is a character device (and renaming over the
 * link would not touch /dev/null, so the test is safe without the check). */
Test(file, an_output_that_is_no_regular_file_is_refused) {
  char *fifo = tu_path("out-fifo"), *null = tu_path("out-null"), *d = tu_path("out-dir");
  char *reg = tu_path("out-reg"), *none = tu_path("out-none");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(symlink("/dev/null", null), 0);
  cr_assert_eq(mkdir(d, 0700), 0);
  tu_write_file(reg, "x", 1);
  const struct {
    const char *path, *says;
  } bad[] = {{fifo, "is a FIFO, not a file"},
             {null, "is a character device, not a file"},
             {d, "is a directory, not a file"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(file_output_check("save", bad[i].path, "model.bin"), FSDP_EINVAL, "%s", bad[i].path);
    const char *m = err_msg();
    cr_expect(!strncmp(m, "save: ", 6) && strstr(m, bad[i].path) && strstr(m, bad[i].says) &&
              (strstr(m, "give a file path") || strstr(m, "model.bin")), "%s", m);
  }
  cr_expect_eq(file_output_check("save", reg, "model.bin"), 0, "%s", err_msg());
  cr_expect_eq(file_output_check("save", none, "model.bin"), 0, "%s", err_msg());
  /* the last look, at the rename: a FIFO there is refused and left as it is */
  char tmp[4200];
  int fd = -1;
  cr_assert_eq(file_temp_create(fifo, tmp, sizeof tmp, &fd), 0, "%s", err_msg());
  close(fd);
  cr_expect_eq(file_temp_place("-o", tmp, fifo), FSDP_EINVAL);
  struct stat st;
  cr_expect(!stat(fifo, &st) && S_ISFIFO(st.st_mode), "the FIFO was replaced");
  unlink(tmp);
  free(fifo), free(null), free(d), free(reg), free(none);
}

/* A temporary is its writer's own: "<path>.tmp.<pid>" when free; a link
 * planted there (or any file) is neither followed nor reused, another name
 * is taken, and what the link points at is untouched. */
Test(file, a_temporary_is_created_never_through_a_link) {
  char *out = tu_path("w.bin"), *victim = tu_path("victim.txt"), planted[4200], tmp[4200];
  tu_write_file(victim, "precious", 8);
  int fd = -1;
  cr_assert_eq(file_temp_create(out, tmp, sizeof tmp, &fd), 0, "%s", err_msg());
  snprintf(planted, sizeof planted, "%s.tmp.%d", out, (int)getpid());
  cr_expect_str_eq(tmp, planted, "the first name is <path>.tmp.<pid> (docs/FORMATS.md)");
  close(fd);
  unlink(tmp);
  cr_assert_eq(symlink(victim, planted), 0);
  cr_assert_eq(file_temp_create(out, tmp, sizeof tmp, &fd), 0, "%s", err_msg());
  cr_expect_str_neq(tmp, planted);
  cr_expect(!strncmp(tmp, planted, strlen(planted)) && tmp[strlen(planted)] == '.', "%s", tmp);
  cr_expect_eq(write(fd, "weights", 7), 7);
  close(fd);
  cr_assert_eq(file_temp_place("save", tmp, out), 0, "%s", err_msg());
  size_t n;
  char *v = tu_slurp(victim, &n);
  cr_expect(n == 8 && !memcmp(v, "precious", 8), "written through the planted link");
  struct stat st;
  cr_expect(!lstat(planted, &st) && S_ISLNK(st.st_mode), "the planted link is left alone");
  free(v), free(out), free(victim);
}

/* file_same: by inode where both exist (a hard link, another spelling),
 * by resolved name where one does not. */
Test(file, the_same_file_by_inode_or_by_name) {
  char *a = tu_path("same-a"), *h = tu_path("same-hard"), *b = tu_path("same-b");
  tu_write_file(a, "x", 1);
  tu_write_file(b, "x", 1);
  cr_assert_eq(link(a, h), 0);
  char dotted[4200], missing[4200], missing2[4200];
  snprintf(dotted, sizeof dotted, "%s/./same-a", tu_tmpdir());
  snprintf(missing, sizeof missing, "%s/new.bin", tu_tmpdir());
  snprintf(missing2, sizeof missing2, "%s/../%s/new.bin", tu_tmpdir(), strrchr(tu_tmpdir(), '/') + 1);
  cr_expect(file_same(a, h));
  cr_expect(file_same(a, dotted));
  cr_expect(!file_same(a, b), "equal contents are not the same file");
  cr_expect(file_same(missing, missing2), "%s, %s", missing, missing2);
  cr_expect(!file_same(missing, a));
  free(a), free(h), free(b);
}

/* A path the user names (--config): a link to a regular file is followed,
 * a link to a FIFO is still refused at once. */
Test(file, a_named_path_follows_a_link_but_never_waits, .timeout = 10) {
  char *t = tu_path("target"), *l = tu_path("link"), *p = tu_path("fifo"), *lp = tu_path("link2");
  tu_write_file(t, "abc", 3);
  cr_assert_eq(symlink(t, l), 0);
  cr_assert_eq(mkfifo(p, 0600), 0);
  cr_assert_eq(symlink(p, lp), 0);
  int fd = -1;
  cr_assert_eq(file_open_regular_named(l, O_RDONLY, 0, &fd), FSDP_OK, "%s", err_msg());
  char buf[4] = "";
  cr_expect_eq(read(fd, buf, 3), 3);
  cr_expect_str_eq(buf, "abc");
  close(fd);
  fd = -1;
  cr_expect_eq(file_open_regular_named(lp, O_RDONLY, 0, &fd), FSDP_EFORMAT, "%s", err_msg());
  cr_expect_eq(fd, -1);
  free(t), free(l), free(p), free(lp);
}

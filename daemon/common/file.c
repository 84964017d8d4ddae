/* file: see file.h. */
#include "daemon/common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"

static int file_open(const char *path, int flags, mode_t mode, int *out) {
  int fd = open(path, flags | O_CLOEXEC | O_NONBLOCK, mode);
  struct stat st;
  /* ENXIO: a FIFO with no reader, a socket or a device without a driver */
  if ((fd < 0 && errno == ENXIO) || (fd >= 0 && (fstat(fd, &st) || !S_ISREG(st.st_mode)))) {
    if (fd >= 0) close(fd);
    return err_set(FSDP_EFORMAT, "%s is not a regular file (a FIFO, a directory or a device)", path);
  }
  if (fd < 0) return err_set_errno(err_from_errno(errno), errno, "%s cannot be opened", path);
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)) {
    int e = errno;
    close(fd);
    return err_set_errno(FSDP_EIO, e, "%s: clearing O_NONBLOCK", path);
  }
  *out = fd;
  return FSDP_OK;
}

int file_open_regular(const char *path, int flags, mode_t mode, int *out) {
  return file_open(path, flags | O_NOFOLLOW, mode, out);
}

int file_open_regular_named(const char *path, int flags, mode_t mode, int *out) {
  return file_open(path, flags, mode, out);
}

/* ---- outputs written by a temporary and a rename --------------------------- */

static const char *file_kind(mode_t m) {
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISDIR(m)) return "a directory";
  return "something other than a regular file";
}

int file_output_check(const char *key, const char *path, const char *example) {
  struct stat st;
  /* nothing there, or a look that fails (EACCES, ELOOP): the write says why */
  if (stat(path, &st) || S_ISREG(st.st_mode)) return FSDP_OK;
  if (S_ISDIR(st.st_mode) && example)
    return err_set(FSDP_EINVAL, "%s: %s is a directory, not a file: give the path of the file to "
                   "write (e.g. %s/%s)", key, path, path, example);
  return err_set(FSDP_EINVAL, "%s: %s is %s, not a file: give a file path (writing would "
                 "replace it)", key, path, file_kind(st.st_mode));
}

int file_temp_create(const char *path, char *tmp, size_t size, int *fd) {
  *fd = -1;
  for (int i = 0; i < 8; i++) {
    int n;
    if (!i) {
      n = snprintf(tmp, size, "%s.tmp.%d", path, (int)getpid());
    } else {
      uint32_t r;
      if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = (uint32_t)ts.tv_nsec ^ (uint32_t)i << 28;
      }
      n = snprintf(tmp, size, "%s.tmp.%d.%08x", path, (int)getpid(), (unsigned)r);
    }
    if (n < 0 || (size_t)n >= size)
      return err_set(FSDP_EINVAL, "%s: the path is too long for a temporary name beside it", path);
    const int f = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (f >= 0) {
      *fd = f;
      return FSDP_OK;
    }
    if (errno != EEXIST) /* EEXIST: taken, a link to anywhere included; try another */
      return err_set_errno(err_from_errno(errno), errno, "cannot create %s (check that the "
                           "directory exists and is writable)", tmp);
  }
  return err_set(FSDP_EEXIST, "cannot create a temporary beside %s: every name tried (%s) was "
                 "taken", path, tmp);
}

int file_temp_place(const char *key, const char *tmp, const char *path) {
  int rc = file_output_check(key, path, NULL);
  if (rc) return rc;
  if (rename(tmp, path))
    return err_set_errno(err_from_errno(errno), errno, "%s: renaming %s to %s", key, tmp, path);
  return FSDP_OK;
}

/* p resolved as far as it exists, into out (PATH_MAX): realpath of p, else
 * of its directory with its last component appended, else p as written. */
static void file_resolve(const char *p, char *out) {
  if (realpath(p, out)) return;
  char d[PATH_MAX], b[PATH_MAX], r[PATH_MAX];
  const size_t n = strlen(p);
  if (n >= PATH_MAX) {
    memcpy(out, p, PATH_MAX - 1);
    out[PATH_MAX - 1] = 0;
    return;
  }
  memcpy(d, p, n + 1);
  memcpy(b, p, n + 1);
  const char *base = basename(b);
  if (!realpath(dirname(d), r) || strlen(r) + 1 + strlen(base) >= PATH_MAX) {
    memcpy(out, p, n + 1);
    return;
  }
  strcpy(out, r);
  if (strcmp(r, "/")) strcat(out, "/");
  strcat(out, base);
}

int file_same(const char *a, const char *b) {
  struct stat sa, sb;
  if (!stat(a, &sa) && !stat(b, &sb)) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  char ra[PATH_MAX], rb[PATH_MAX];
  file_resolve(a, ra);
  file_resolve(b, rb);
  return !strcmp(ra, rb);
}

void file_cloexec_inherited(void) {
#ifdef CLOSE_RANGE_CLOEXEC
  if (!close_range(3, ~0u, CLOSE_RANGE_CLOEXEC)) return;
#endif
  /* a kernel before 5.11: each one open */
  const long max = sysconf(_SC_OPEN_MAX);
  for (int fd = 3; fd < (max > 0 && max < 1 << 20 ? max : 1 << 16); fd++) {
    const int fl = fcntl(fd, F_GETFD);
    if (fl >= 0 && !(fl & FD_CLOEXEC)) fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
  }
}

/* file: see file.h. */
#include "daemon/common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"

int file_open_regular(const char *path, int flags, mode_t mode, int *out) {
  int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode);
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

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

/* fs_shim: an LD_PRELOAD shim for tests that need the file system to behave
 * as some do.
 * - A known delay (a checkpoint commit still on the coordinator's thread
 *   pool when a signal comes): fsync of a file whose path contains
 *   SLOW_FSYNC_MATCH sleeps SLOW_FSYNC_MS (default 1000) first.
 * - No atomic no-replace placement, as vfat and some FUSE or SMB mounts:
 *   with FS_NO_NOREPLACE set, renameat2 with RENAME_NOREPLACE fails with
 *   EINVAL and link with EPERM.
 * - A full disk for chosen files: pwrite or write to a file whose path
 *   contains ENOSPC_MATCH fails with ENOSPC (a rank's shard of one
 *   checkpoint, or its manifest).
 * - No locks, as NFS without its lock daemon or Lustre mounted noflock:
 *   with FS_NO_FLOCK set, flock fails with ENOLCK.
 * - A slow file system, as an NFS server that answers late: open of a
 *   path containing SLOW_OPEN_MATCH sleeps SLOW_OPEN_MS (default 1000)
 *   first (a submit whose data file takes that long to check).
 * Every other call, and every call without those variables set, is the
 * real one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/file.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* 1 when fd's path contains the value of the variable env (set, not empty). */
static int fd_matches(int fd, const char *env) {
  const char *match = getenv(env);
  if (!match || !*match) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strstr(path, match) != NULL;
}

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  if (fd_matches(fd, "SLOW_FSYNC_MATCH")) {
    const char *ms = getenv("SLOW_FSYNC_MS");
    const long t = ms ? atol(ms) : 1000;
    nanosleep(&(struct timespec){t / 1000, t % 1000 * 1000000L}, NULL);
  }
  return real(fd);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) {
  static ssize_t (*real)(int, const void *, size_t, off_t);
  if (!real) real = (ssize_t(*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  if (fd_matches(fd, "ENOSPC_MATCH")) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n, at);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at) { return pwrite(fd, buf, n, at); }

ssize_t write(int fd, const void *buf, size_t n) {
  static ssize_t (*real)(int, const void *, size_t);
  if (!real) real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
  if (fd > 2 && fd_matches(fd, "ENOSPC_MATCH")) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n);
}

static int no_noreplace(void) {
  const char *v = getenv("FS_NO_NOREPLACE");
  return v && *v;
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
              unsigned int flags) {
  static int (*real)(int, const char *, int, const char *, unsigned int);
  if (!real)
    real = (int (*)(int, const char *, int, const char *, unsigned int))dlsym(RTLD_NEXT, "renameat2");
  if ((flags & RENAME_NOREPLACE) && no_noreplace()) {
    errno = EINVAL;
    return -1;
  }
  return real(olddirfd, oldpath, newdirfd, newpath, flags);
}

int link(const char *oldpath, const char *newpath) {
  static int (*real)(const char *, const char *);
  if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "link");
  if (no_noreplace()) {
    errno = EPERM;
    return -1;
  }
  return real(oldpath, newpath);
}

int flock(int fd, int op) {
  static int (*real)(int, int);
  if (!real) real = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
  const char *v = getenv("FS_NO_FLOCK");
  if (v && *v) {
    errno = ENOLCK;
    return -1;
  }
  return real(fd, op);
}

/* open and open64: the mode is there only with O_CREAT or O_TMPFILE. */
static int slow_open(const char *sym, const char *path, int flags, va_list ap) {
  static int (*real[2])(const char *, int, ...);
  const int k = !strcmp(sym, "open64");
  if (!real[k]) real[k] = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, sym);
  const char *match = getenv("SLOW_OPEN_MATCH");
  if (match && *match && strstr(path, match)) {
    const char *ms = getenv("SLOW_OPEN_MS");
    const long t = ms ? atol(ms) : 1000;
    nanosleep(&(struct timespec){t / 1000, t % 1000 * 1000000L}, NULL);
  }
  if (flags & (O_CREAT | O_TMPFILE)) return real[k](path, flags, va_arg(ap, int));
  return real[k](path, flags);
}

int open(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const int fd = slow_open("open", path, flags, ap);
  va_end(ap);
  return fd;
}

int open64(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const int fd = slow_open("open64", path, flags, ap);
  va_end(ap);
  return fd;
}

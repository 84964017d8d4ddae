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
 * Every other call, and every call without those variables set, is the
 * real one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
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

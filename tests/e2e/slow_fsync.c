/* slow_fsync: an LD_PRELOAD shim for tests that need file system work to
 * take a known time (a checkpoint commit still on the coordinator's thread
 * pool when a signal comes). fsync of a file whose path contains
 * SLOW_FSYNC_MATCH sleeps SLOW_FSYNC_MS (default 1000) first; every other
 * fsync, and every fsync without SLOW_FSYNC_MATCH set, is the real one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  const char *match = getenv("SLOW_FSYNC_MATCH"), *ms = getenv("SLOW_FSYNC_MS");
  if (match && *match) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    if (n > 0) {
      path[n] = 0;
      if (strstr(path, match)) {
        const long t = ms ? atol(ms) : 1000;
        nanosleep(&(struct timespec){t / 1000, t % 1000 * 1000000L}, NULL);
      }
    }
  }
  return real(fd);
}

/* benchutil: see benchutil.h. */
#include "tests/bench/benchutil.h"

#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int bench_listen_loopback(char *addr, size_t n) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  snprintf(addr, n, "127.0.0.1:%d", ntohs(sa.sin_port));
  return fd;
}

static double bench_clock(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double bench_now_s(void) { return bench_clock(CLOCK_MONOTONIC); }
double bench_cpu_s(void) { return bench_clock(CLOCK_PROCESS_CPUTIME_ID); }

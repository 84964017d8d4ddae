/* benchutil: see benchutil.h. */
#include "tests/bench/benchutil.h"

#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int bench_serving_port(int fd, double timeout_s) {
  char buf[512];
  size_t n = 0;
  const double deadline = bench_now_s() + timeout_s;
  while (bench_now_s() < deadline && n < sizeof buf - 1) {
    struct pollfd q = {fd, POLLIN, 0};
    if (poll(&q, 1, 100) <= 0) continue;
    ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
    buf[n] = 0;
    char *at = strstr(buf, "serving on port ");
    if (at && atoi(at + 16) > 0) return atoi(at + 16);
  }
  return 0;
}

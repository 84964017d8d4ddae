/* benchutil: what the benchmarks that fork rank processes share. */
#ifndef FSDP_BENCHUTIL_H
#define FSDP_BENCHUTIL_H

#include <stddef.h>

/* A TCP socket bound on 127.0.0.1 at a port the kernel picks; its
 * "127.0.0.1:PORT" in addr (n bytes). -1 on failure. */
int bench_listen_loopback(char *addr, size_t n);

/* Wall-clock seconds (CLOCK_MONOTONIC) and this process's CPU seconds, all
 * threads included (CLOCK_PROCESS_CPUTIME_ID). */
double bench_now_s(void);
double bench_cpu_s(void);

/* The port in fsdp-coordinator's "serving on port N" line, read from fd (its
 * stdout) for up to timeout_s; 0 when it did not come. fd is left open. */
int bench_serving_port(int fd, double timeout_s);

#endif

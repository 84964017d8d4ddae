/* testutil: see testutil.h. */
#include "testutil.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/rng.h"

uint64_t tu_rand_u64(uint64_t *s) { return rng_next(s); }

double tu_rand_uniform(uint64_t *s, double lo, double hi) {
  return lo + (hi - lo) * rng_unit(tu_rand_u64(s));
}

void tu_fill_f32(float *x, size_t n, uint64_t *s, double lo, double hi) {
  for (size_t i = 0; i < n; i++) x[i] = (float)tu_rand_uniform(s, lo, hi);
}

void tu_fill_f64(double *x, size_t n, uint64_t *s, double lo, double hi) {
  for (size_t i = 0; i < n; i++) x[i] = tu_rand_uniform(s, lo, hi);
}

double tu_rel_err_f32(const float *a, const double *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return sqrt(num / den);
}

double tu_rel_err_f32f32(const float *a, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return sqrt(num / den);
}

static char tu_dir[512];

static void tu_rmdir(void) {
  if (!tu_dir[0]) return;
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tu_dir);
  if (system(cmd) != 0) fprintf(stderr, "testutil: could not remove %s\n", tu_dir);
}

const char *tu_tmpdir(void) {
  if (!tu_dir[0]) {
    const char *base = getenv("TMPDIR");
    snprintf(tu_dir, sizeof tu_dir, "%s/fsdp-test-XXXXXX", base && *base ? base : "/tmp");
    cr_assert_not_null(mkdtemp(tu_dir), "mkdtemp %s", tu_dir);
    atexit(tu_rmdir);
  }
  return tu_dir;
}

char *tu_path(const char *name) {
  const char *d = tu_tmpdir();
  size_t n = strlen(d) + strlen(name) + 2;
  char *p = malloc(n);
  cr_assert_not_null(p);
  snprintf(p, n, "%s/%s", d, name);
  return p;
}

void tu_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "open %s", path);
  cr_assert_eq(fwrite(data, 1, n, f), n);
  cr_assert_eq(fclose(f), 0);
}

const char *tu_root(void) {
  const char *r = getenv("FSDP_ROOT");
  return r && *r ? r : ".";
}

int tu_listen_loopback(char *addr, size_t n) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 64) == 0 &&
            getsockname(fd, (struct sockaddr *)&sa, &sl) == 0, "listening on 127.0.0.1");
  snprintf(addr, n, "127.0.0.1:%d", ntohs(sa.sin_port));
  return fd;
}

int tu_run_bin(const char *program, const char *args, char *out, size_t len) {
  size_t n = strlen(tu_root()) + strlen(program) + strlen(args) + 32;
  char *cmd = malloc(n);
  cr_assert_not_null(cmd);
  snprintf(cmd, n, "%s/bin/%s %s 2>&1", tu_root(), program, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p, "popen %s", cmd);
  size_t got = fread(out, 1, len - 1, p);
  out[got] = 0;
  int st = pclose(p);
  free(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

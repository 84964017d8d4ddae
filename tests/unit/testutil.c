/* testutil: see testutil.h. */
#include "testutil.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <poll.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/rng.h"

/* Every test process computes on one thread unless the environment says
 * otherwise (FSDP_THREADS, OMP_NUM_THREADS) or the test sets its own
 * (config threads, kern_cpu()->set_threads). Criterion runs two tests at once
 * and many tests fork ranks, so a process that took every core for its own
 * loops made the cores' threads spin against each other: that, not the
 * work, was most of `make test`'s time. For the same reason the threads of
 * a test that does take several sleep when they wait (OMP_WAIT_POLICY
 * passive): spinning, the demo-corpus run of test_train took 8 s of CPU
 * instead of 1.7 beside one other test. The variables also reach the
 * programs and scripts the tests start (fsdp-train, PyTorch), and, set here
 * in the binary, hold however it is run: make test, run.sh, or by hand.
 * Criterion execs a fresh process per test, whose OpenMP runtime reads them
 * as it starts; omp_set_num_threads covers this process. */
__attribute__((constructor)) static void tu_one_thread(void) {
  setenv("FSDP_THREADS", "1", 0);
  setenv("OMP_WAIT_POLICY", "passive", 0);
  if (!getenv("OMP_NUM_THREADS")) {
    setenv("OMP_NUM_THREADS", "1", 1);
    omp_set_num_threads(1);
  }
}

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

const char *tu_build(void) {
  const char *b = getenv("FSDP_TEST_BUILD");
  return b && *b ? b : "build";
}

const char *tu_fs_shim(void) {
  static char v[8192];
  char shim[4096], asan[4096] = "";
  char rel[4096];
  snprintf(rel, sizeof rel, "%s/%s/tests/fs_shim.so", tu_root(), tu_build());
  /* absolute: ranks run in a directory of their own */
  cr_assert_not_null(realpath(rel, shim), "%s: build it first (make)", rel);
#if defined(__SANITIZE_ADDRESS__)
  FILE *maps = fopen("/proc/self/maps", "r");
  cr_assert_not_null(maps);
  char line[8192];
  while (!asan[0] && fgets(line, sizeof line, maps)) {
    char *p = strchr(line, '/');
    if (p && strstr(p, "/libasan.so")) snprintf(asan, sizeof asan, "%.*s", (int)strcspn(p, "\n"), p);
  }
  fclose(maps);
  cr_assert(asan[0], "a sanitized test without libasan mapped");
#endif
  snprintf(v, sizeof v, "%s%s%s", asan, asan[0] ? ":" : "", shim);
  return v;
}

char *tu_slurp(const char *path, size_t *n) {
  size_t len = 0, cap = 4096;
  char *s = malloc(cap);
  cr_assert_not_null(s);
  FILE *f = fopen(path, "rb");
  for (size_t k; f && (k = fread(s + len, 1, cap - 1 - len, f)) > 0;) {
    len += k;
    if (cap - 1 - len == 0) {
      s = realloc(s, cap *= 2);
      cr_assert_not_null(s);
    }
  }
  if (f) fclose(f);
  s[len] = 0;
  if (n) *n = len;
  return s;
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

double tu_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void tu_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

extern char **environ;

void tu_world_start(tu_world_t *w, int n, const char *program, const char *args,
                    const char *const *env, const char *const *rank_env,
                    const char *const *rank_args) {
  static int worlds; /* log names stay apart when a test starts several worlds */
  cr_assert(n >= 1 && n <= TU_WORLD_MAX, "a world of 1 to %d ranks", TU_WORLD_MAX);
  memset(w, 0, sizeof *w);
  w->n = n;
  int lfd[TU_WORLD_MAX];
  char addrs[TU_WORLD_MAX * 24] = "", a[32];
  for (int r = 0; r < n; r++) {
    lfd[r] = tu_listen_loopback(a, sizeof a);
    snprintf(addrs + strlen(addrs), sizeof addrs - strlen(addrs), "%s%s", r ? "," : "", a);
  }
  /* Ours come first: getenv returns the first match, so they win over inherited ones. */
  size_t ne = 0, nx = 0;
  while (environ[ne]) ne++;
  while (env && env[nx]) nx++;
  char **envp = calloc(ne + nx + 6, sizeof *envp);
  char vrank[32], vworld[32], vaddrs[sizeof addrs + 16], vfd[] = "FSDP_LISTEN_FD=3";
  cr_assert_not_null(envp);
  snprintf(vworld, sizeof vworld, "FSDP_WORLD_SIZE=%d", n);
  snprintf(vaddrs, sizeof vaddrs, "FSDP_ADDRS=%s", addrs);
  size_t k = 0;
  char vmine[256] = ""; /* rank r's own (rank_env) */
  envp[k++] = vrank, envp[k++] = vmine, envp[k++] = vworld, envp[k++] = vaddrs, envp[k++] = vfd;
  for (size_t i = 0; i < nx; i++) envp[k++] = (char *)env[i];
  for (size_t i = 0; i < ne; i++) envp[k++] = environ[i];

  worlds++;
  for (int r = 0; r < n; r++) {
    char name[64], *log, *cmd;
    snprintf(name, sizeof name, "world%d-rank%d.log", worlds, r);
    log = tu_path(name);
    snprintf(w->log[r], sizeof w->log[r], "%s", log);
    free(log);
    int out = open(w->log[r], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert(out >= 0, "open %s", w->log[r]);
    const char *extra = rank_args && rank_args[r] ? rank_args[r] : "";
    size_t len = strlen(tu_root()) + strlen(program) + strlen(args) + strlen(extra) + 32;
    cr_assert_not_null(cmd = malloc(len));
    snprintf(cmd, len, "exec %s/bin/%s %s %s", tu_root(), program, args, extra);
    snprintf(vrank, sizeof vrank, "FSDP_RANK=%d", r);
    /* none: FSDP_RANK again (an entry without '=' is not a variable) */
    snprintf(vmine, sizeof vmine, "%s", rank_env && rank_env[r] ? rank_env[r] : vrank);
    pid_t parent = getpid(), pid = fork();
    cr_assert(pid >= 0, "fork");
    if (pid == 0) { /* only async-signal-safe calls from here to exec */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127); /* the test died before prctl */
      dup2(out, 1), dup2(out, 2), dup2(lfd[r], 3);
      fcntl(3, F_SETFD, 0); /* dup2 onto itself keeps FD_CLOEXEC */
      char *argv[] = {"sh", "-c", cmd, NULL};
      execve("/bin/sh", argv, envp);
      _exit(127);
    }
    w->pid[r] = pid;
    close(out);
    close(lfd[r]); /* the rank holds it now */
    free(cmd);
  }
  free(envp);
}

char *tu_world_output(const tu_world_t *w, int r) {
  FILE *f = fopen(w->log[r], "rb");
  cr_assert_not_null(f, "open %s", w->log[r]);
  size_t cap = 4096, len = 0, got;
  char *s = malloc(cap);
  cr_assert_not_null(s);
  while ((got = fread(s + len, 1, cap - len - 1, f)) > 0) {
    len += got;
    if (cap - len < 2048) cr_assert_not_null(s = realloc(s, cap *= 2));
  }
  fclose(f);
  s[len] = 0;
  return s;
}

/* 1 once rank r has exited (reaped now or before), 0 while it runs. */
static int tu_world_reap(tu_world_t *w, int r) {
  if (!w->pid[r]) return 1;
  int st = 0;
  pid_t p = waitpid(w->pid[r], &st, WNOHANG);
  if (p == 0) return 0;
  w->status[r] = p > 0 ? st : -1;
  w->exit_s[r] = tu_now_s();
  w->pid[r] = 0;
  return 1;
}

int tu_world_wait_lines(tu_world_t *w, int r, const char *prefix, int count, double timeout_s) {
  const double deadline = tu_now_s() + timeout_s;
  const size_t pn = strlen(prefix);
  for (;;) {
    int exited = tu_world_reap(w, r), seen = 0; /* reaped first: its last lines are in the file */
    char *out = tu_world_output(w, r);
    for (const char *l = out; *l;) {
      seen += strncmp(l, prefix, pn) == 0;
      const char *nl = strchr(l, '\n');
      if (!nl) break;
      l = nl + 1;
    }
    free(out);
    if (seen >= count) return 0;
    if (exited || tu_now_s() > deadline) return -1;
    tu_sleep_ms(20);
  }
}

int tu_world_wait_exits(tu_world_t *w, int except, double timeout_s) {
  const double deadline = tu_now_s() + timeout_s;
  for (;;) {
    int running = 0;
    for (int r = 0; r < w->n; r++) running += r != except && !tu_world_reap(w, r);
    if (!running || tu_now_s() > deadline) return running;
    tu_sleep_ms(5);
  }
}

void tu_world_kill(tu_world_t *w) {
  for (int r = 0; r < w->n; r++) {
    if (!w->pid[r]) continue;
    kill(w->pid[r], SIGKILL); /* ends a stopped process too */
    int st = 0;
    w->status[r] = waitpid(w->pid[r], &st, 0) > 0 ? st : -1;
    w->exit_s[r] = tu_now_s();
    w->pid[r] = 0;
  }
}

void tu_launch_tiny(int n, const char *data, const char *args, int want, char *out, size_t len) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "-n %d -- %s/bin/fsdp-train " TU_TINY_TRAIN " --data %s %s", n,
           tu_root(), data, args);
  int rc = tu_run_bin("fsdp-launch", cmd, out, len);
  cr_assert_eq(rc, want, "fsdp-launch %s: exit %d, expected %d:\n%s", cmd, rc, want, out);
}

int tu_sh(const char *cmd, char *out, size_t len) {
  char c[8192];
  snprintf(c, sizeof c, "%s 2>&1", cmd);
  FILE *p = popen(c, "r");
  cr_assert_not_null(p, "popen %s", cmd);
  size_t n = fread(out, 1, len - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void tu_tls_ca(const char *dir, const char *name) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
           "-keyout %s.key -out %s.pem -days 2 -subj /CN=fsdp-test-%s >/dev/null 2>&1",
           dir, name, name, name);
  cr_assert_eq(system(cmd), 0, "openssl could not make CA %s", name);
}

void tu_tls_make(const char *dir) {
  tu_tls_ca(dir, "ca");
  tu_tls_ca(dir, "otherca");
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext && "
           "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout srv.key "
           "-out srv.csr -subj /CN=localhost >/dev/null 2>&1 && "
           "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
           "-extfile san.ext -out srv.pem >/dev/null 2>&1",
           dir);
  cr_assert_eq(system(cmd), 0, "openssl could not make the server certificate");
}

double tu_connect_gaps(int port, double secs, int *tries) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &(int){1}, sizeof(int));
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "port %d: %s", port, strerror(errno));
  cr_assert_eq(listen(fd, 16), 0);
  const double t0 = tu_now_s();
  double last = t0, longest = 0;
  *tries = 0;
  for (double now = t0; now - t0 < secs; now = tu_now_s()) {
    struct pollfd q = {fd, POLLIN, 0};
    if (poll(&q, 1, 20) <= 0) continue;
    const int c = accept(fd, NULL, NULL);
    if (c < 0) continue;
    close(c);
    now = tu_now_s();
    if (now - last > longest) longest = now - last;
    last = now;
    ++*tries;
  }
  if (tu_now_s() - last > longest) longest = tu_now_s() - last;
  close(fd);
  return longest;
}

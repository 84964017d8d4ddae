/* cluster: see cluster.h. */
#include "tests/e2e/cluster.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/unit/testutil.h"

/* Forks `sh -c cmd` with stdout to a pipe (returned in *out_fd, or closed). */
static pid_t cluster_spawn(const char *cmd, int *out_fd) {
  int fd[2];
  cr_assert_eq(pipe(fd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fd[1], 1);
    close(fd[0]), close(fd[1]);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  if (out_fd) *out_fd = fd[0];
  else close(fd[0]);
  return pid;
}

void cluster_coord_start(cluster_proc_t *p, const char *db, const char *listen, const char *extra) {
  snprintf(p->log, sizeof p->log, "%s.log", db);
  char cmd[6144];
  int n = snprintf(cmd, sizeof cmd, "'%s/bin/fsdp-coordinator' --db '%s' --root '%s' --listen %s %s",
                   tu_root(), db, tu_tmpdir(), listen, extra ? extra : "");
  cr_assert_lt((size_t)n, sizeof cmd, "the coordinator's command line is too long");
  cluster_coord_run(p, cmd);
}

void cluster_coord_run(cluster_proc_t *p, const char *command) {
  char cmd[8192];
  int len = snprintf(cmd, sizeof cmd, "exec %s 2>>'%s'", command, p->log);
  cr_assert_lt((size_t)len, sizeof cmd, "the coordinator's command line is too long");
  int fd;
  p->pid = cluster_spawn(cmd, &fd);
  char buf[512];
  size_t n = 0;
  int port = 0;
  const double deadline = tu_now_s() + 10;
  while (!port && tu_now_s() < deadline) {
    struct pollfd q = {fd, POLLIN, 0};
    if (poll(&q, 1, 100) <= 0) continue;
    ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
    buf[n] = 0;
    char *at = strstr(buf, "serving on port ");
    if (at) port = atoi(at + 16);
  }
  /* the metrics line follows in the same write (one fflush) */
  char *m = strstr(buf, "metrics on port ");
  p->metrics_port = m ? atoi(m + 16) : 0;
  close(fd);
  cr_assert_gt(port, 0, "the coordinator did not start (%s): %.400s", p->log, buf);
  snprintf(p->addr, sizeof p->addr, "127.0.0.1:%d", port);
}

void cluster_fsdpd_start(cluster_proc_t *p, const char *coord, const char *name, int ndev,
                         const char *extra) {
  cluster_fsdpd_spawn(p, coord, name, ndev, extra);
  cluster_wait_alive(coord, name);
}

void cluster_fsdpd_spawn(cluster_proc_t *p, const char *coord, const char *name, int ndev,
                         const char *extra) {
  char devices[32];
  snprintf(devices, sizeof devices, "cpu:%d", ndev);
  cluster_fsdpd_spawn_on(p, coord, name, devices, NULL, extra);
}

void cluster_fsdpd_spawn_on(cluster_proc_t *p, const char *coord, const char *name,
                            const char *devices, const char *env, const char *extra) {
  char *work = tu_path(name);
  snprintf(p->log, sizeof p->log, "%s.log", work);
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "exec env %s '%s/bin/fsdpd' --coordinator %s --devices %s --name %s --work-dir '%s' "
           "--grace 5 %s %s >>'%s' 2>&1",
           env ? env : "", tu_root(), coord, devices, name, work,
           geteuid() == 0 ? "--run-as nobody" : "", extra ? extra : "", p->log);
  free(work);
  p->pid = cluster_spawn(cmd, NULL);
}

pid_t cluster_run(const char *cmd) { return cluster_spawn(cmd, NULL); }

void cluster_wait_alive(const char *coord, const char *name) {
  char args[128], out[8192];
  snprintf(args, sizeof args, "nodes");
  const double deadline = tu_now_s() + 10;
  for (;;) {
    cluster_ctl(coord, args, out, sizeof out);
    char *line = strstr(out, name);
    char *eol = line ? strchr(line, '\n') : NULL;
    if (line && strstr(line, "ALIVE") && (!eol || strstr(line, "ALIVE") < eol)) break;
    cr_assert_lt(tu_now_s(), deadline, "fsdpd %s did not register:\n%s", name, out);
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  }
}

int cluster_stop(cluster_proc_t *p, int sig) {
  if (p->pid <= 0) return -1;
  kill(p->pid, sig);
  int st = cluster_wait_exit(p, 15);
  if (p->pid > 0) {
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    p->pid = 0;
  }
  return st;
}

int cluster_wait_exit(cluster_proc_t *p, double timeout_s) {
  if (p->pid <= 0) return -1;
  const double deadline = tu_now_s() + timeout_s;
  int st = -1;
  while (waitpid(p->pid, &st, WNOHANG) == 0) {
    if (tu_now_s() > deadline) return -1;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  p->pid = 0;
  return st;
}

int cluster_ctl(const char *coord, const char *args, char *out, size_t len) {
  char a[4096];
  snprintf(a, sizeof a, "--coordinator %s %s", coord, args);
  return tu_run_bin("fsdpctl", a, out, len);
}

pid_t cluster_pid_under(const char *dir) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  struct dirent *e;
  pid_t found = 0;
  const size_t n = strlen(dir);
  while (!found && (e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char link[300], cwd[1024];
    snprintf(link, sizeof link, "/proc/%s/cwd", e->d_name);
    ssize_t k = readlink(link, cwd, sizeof cwd - 1);
    if (k <= 0) continue;
    cwd[k] = 0;
    if (!strncmp(cwd, dir, n) && (cwd[n] == '/' || cwd[n] == 0)) found = (pid_t)atoi(e->d_name);
  }
  closedir(d);
  return found;
}

double cluster_wait_gone(const char *dir, double timeout_s) {
  const double t0 = tu_now_s();
  while (cluster_pid_under(dir)) {
    if (tu_now_s() - t0 > timeout_s) return -1;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  return tu_now_s() - t0;
}

void cluster_wait_file(const char *path, double timeout_s) {
  const double limit = timeout_s * TU_SLOW, t0 = tu_now_s();
  while (access(path, F_OK) && tu_now_s() - t0 < limit) nanosleep(&(struct timespec){0, 2000000}, NULL);
  cr_assert_eq(access(path, F_OK), 0, "no %s within %.0f s", path, limit);
}

void cluster_db_check(const char *path) {
  sqlite3 *h;
  cr_assert_eq(sqlite3_open(path, &h), SQLITE_OK, "%s", path);
  sqlite3_stmt *s;
  cr_assert_eq(sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
  cr_expect_str_eq((const char *)sqlite3_column_text(s, 0), "ok", "%s", path);
  sqlite3_finalize(s);
  sqlite3_close(h);
}

void cluster_sa_keys(const char *key, const char *jwks) {
  char cmd[4096], out[4096];
  snprintf(cmd, sizeof cmd, "openssl genrsa -out '%s' 2048 && python3 '%s/tests/unit/jwt_mint.py' "
           "jwks '%s' k > '%s'", key, tu_root(), key, jwks);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s", out);
}

void cluster_sa_token(const char *path, const char *key, const char *node, const char *exp) {
  char *h = tu_path("sa-header.json"), *c = tu_path("sa-claims.json");
  const char *header = "{\"alg\": \"RS256\", \"kid\": \"k\"}";
  char claims[1024], cmd[4096], out[4096];
  snprintf(claims, sizeof claims,
           "{\"iss\": \"https://kubernetes.default.svc\", \"sub\": \"system:serviceaccount:fsdp:fsdpd\", "
           "\"aud\": [\"fsdp-coordinator\"], \"exp\": \"%s\", \"iat\": \"@NOW-1\", \"nbf\": \"@NOW-1\", "
           "\"kubernetes.io\": {\"namespace\": \"fsdp\", \"node\": {\"name\": \"%s\", \"uid\": \"n1\"}, "
           "\"pod\": {\"name\": \"fsdpd-abcde\", \"uid\": \"p1\"}}}", exp, node);
  tu_write_file(h, header, strlen(header));
  tu_write_file(c, claims, strlen(claims));
  snprintf(cmd, sizeof cmd, "python3 '%s/tests/unit/jwt_mint.py' token '%s' '%s' '%s' > '%s.new' && "
           "chmod 644 '%s.new' && mv '%s.new' '%s'", tu_root(), key, h, c, path, path, path, path);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s", out);
  free(h), free(c);
}

/* Tests of deploy/systemd: the units as systemd reads them, without systemd
 * running (systemd-analyze works offline), and their command lines run the
 * way systemd would run them.
 *   - `systemd-analyze verify` accepts both units with no output at all: it
 *     only warns about a misspelled key and still exits 0, so the output is
 *     what is checked (a broken copy shows the check failing);
 *   - `systemd-analyze security --offline=yes` scores the coordinator's unit
 *     below 4.0 and fsdpd's, which must reach GPUs, at most 2.0;
 *   - fsdpd's device ACL, read as systemd reads it against the /proc/devices
 *     of GPU nodes (NVIDIA's current and older driver, InfiniBand), opens
 *     the GPUs, the driver's devices and the verbs devices, not a disk, and
 *     its ranks may pin memory (LimitMEMLOCK=infinity) as NCCL's RDMA does;
 *   - each unit's ExecStart, expanded with its own Environment= lines (the
 *     paths and ports moved into the test's directory), starts the
 *     coordinator and an fsdpd (as an unprivileged user, as User= does), a
 *     job runs, and SIGTERM stops each within its TimeoutStopSec, fsdpd's
 *     ranks checkpointing first, each exiting 0;
 *   - what the units' comments and docs/OPERATIONS.md tell operators to put
 *     in FSDP_COORD_ARGS and FSDPD_ARGS reaches the programs as file paths
 *     once systemd has substituted it: credentials by /run/credentials/UNIT/,
 *     never by $CREDENTIALS_DIRECTORY, which systemd does not expand there. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <fnmatch.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/e2e/cluster.h"
#include "tests/unit/testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation"

/* deploy/systemd/NAME with @BINDIR@ set to this tree's bin/, written into
 * the test's directory; its path (free it), its text in *text (free it). */
static char *unit(const char *name, char **text) {
  char src[1024];
  snprintf(src, sizeof src, "%s/deploy/systemd/%s", tu_root(), name);
  FILE *f = fopen(src, "r");
  cr_assert_not_null(f, "%s", src);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  char bindir[PATH_MAX + 8], rootdir[PATH_MAX], *out = malloc(2 * n + 4096), *o = out;
  cr_assert_not_null(realpath(tu_root(), rootdir)); /* ExecStart needs an absolute path */
  snprintf(bindir, sizeof bindir, "%s/bin", rootdir);
  for (const char *p = buf; *p;) {
    if (!strncmp(p, "@BINDIR@", 8)) o += sprintf(o, "%s", bindir), p += 8;
    else *o++ = *p++;
  }
  *o = 0;
  char *path = tu_path(name);
  tu_write_file(path, out, strlen(out));
  *text = out;
  return path;
}

Test(systemd, units_verify_with_no_warning_and_a_misspelling_is_caught) {
  char *tc, *tf, cmd[4096], out[8192];
  char *c = unit("fsdp-coordinator.service", &tc), *f = unit("fsdpd.service", &tf);
  snprintf(cmd, sizeof cmd, "systemd-analyze verify '%s' '%s'", c, f);
  int rc = tu_sh(cmd, out, sizeof out);
  cr_assert_eq(rc, 0, "%s: exit %d:\n%s", cmd, rc, out);
  cr_assert_eq(out[0], 0, "systemd-analyze verify warned:\n%s", out);
  /* the check fails when it should: a misspelled key only warns */
  char *bad = tu_path("fsdpd-bad.service"), *p = strstr(tf, "NoNewPrivileges");
  cr_assert_not_null(p);
  memmove(p + 1, p, strlen(p) + 1);
  p[0] = 'X';
  tu_write_file(bad, tf, strlen(tf));
  snprintf(cmd, sizeof cmd, "systemd-analyze verify '%s'", bad);
  tu_sh(cmd, out, sizeof out);
  cr_assert(strstr(out, "Unknown key"), "a misspelled key went unnoticed:\n%s", out);
  /* one user for both: the ranks (fsdpd's user) make each checkpoint's step
   * directory, 0750 under fsdpd's UMask, and the coordinator reads their
   * shards and writes the manifest there (a user of its own could not:
   * every checkpoint aborted, found by review) */
  cr_assert(strstr(tc, "\nUser=fsdp\n") && strstr(tf, "\nUser=fsdp\n") && !strstr(tc, "DynamicUser"),
            "the coordinator and fsdpd must run as the same user (fsdp)");
  free(c), free(f), free(tc), free(tf), free(bad);
}

/* The overall exposure systemd-analyze gives a unit. */
static double exposure(const char *path) {
  char cmd[2048], out[1 << 15];
  snprintf(cmd, sizeof cmd, "systemd-analyze security --offline=yes --no-pager '%s'", path);
  tu_sh(cmd, out, sizeof out);
  const char *at = strstr(out, "Overall exposure level for ");
  cr_assert_not_null(at, "%s:\n%s", cmd, out);
  at = strchr(at, ':');
  double v = -1;
  cr_assert(at && sscanf(at + 1, "%lf", &v) == 1, "%s", out);
  return v;
}

Test(systemd, units_are_hardened) {
  char *tc, *tf;
  char *c = unit("fsdp-coordinator.service", &tc), *f = unit("fsdpd.service", &tf);
  const double ec = exposure(c), ef = exposure(f);
  cr_assert_lt(ec, 4.0, "the coordinator's unit scores %.1f", ec);
  cr_assert_leq(ef, 2.0, "fsdpd's unit scores %.1f (docs/OPERATIONS.md: 1.8, GPUs and the "
                "network being what it must keep)", ef);
  /* both run as fsdp: fsdpd and its ranks do not see the coordinator's
   * state directory (its database) nor its credentials (its tokens), on a
   * host running both (an outside tester read both as a rank's user) */
  const char *state = strstr(tc, "\nStateDirectory=");
  char dir[128] = "";
  cr_assert(state && sscanf(state + 16, "%127s", dir) == 1, "%s", tc);
  const char *hide = strstr(tf, "\nInaccessiblePaths=");
  char want[256];
  snprintf(want, sizeof want, "-/var/lib/%s", dir);
  cr_assert(hide && strstr(hide, want) < strchr(hide + 1, '\n') && strstr(hide, want), "%s", tf);
  cr_assert(strstr(hide, "-/run/credentials/fsdp-coordinator.service") < strchr(hide + 1, '\n') &&
            strstr(hide, "-/run/credentials/fsdp-coordinator.service"), "%s", tf);
  /* a bad option (exit 2) is not restarted over and over */
  cr_assert(strstr(tc, "\nRestartPreventExitStatus=2\n"), "%s", tc);
  cr_assert(strstr(tf, "\nRestartPreventExitStatus=2 78\n"), "%s", tf);
  free(c), free(f), free(tc), free(tf);
}

/* Whether the unit's device ACL (DevicePolicy=closed and its DeviceAllow=
 * lines) lets a process open the character device at path, major maj, with
 * access acc, on a node whose /proc/devices is proc: what systemd does at
 * start, where "char-NAME" allows every major whose name in /proc/devices
 * matches NAME (fnmatch) and a /dev path that node alone. */
static int device_allowed(const char *text, const char *proc, const char *path, int maj,
                          const char *acc) {
  for (const char *p = text; (p = strstr(p, "\nDeviceAllow=")); p++) {
    char spec[256], a[8] = "";
    if (sscanf(p + 13, "%255s %7s", spec, a) < 1) continue;
    if (strspn(acc, a) != strlen(acc)) continue; /* a grants less than acc */
    if (!strncmp(spec, "/dev/", 5) && !strcmp(spec, path)) return 1;
    if (strncmp(spec, "char-", 5)) continue;
    const char *c = strstr(proc, "Character devices:\n"), *end = strstr(proc, "\n\n");
    for (const char *l = c ? strchr(c, '\n') + 1 : NULL; l && *l && (!end || l < end);
         l = strchr(l, '\n') + 1) {
      int m;
      char name[128];
      if (sscanf(l, "%d %127s", &m, name) == 2 && m == maj && !fnmatch(spec + 5, name, 0)) return 1;
      if (!strchr(l, '\n')) break;
    }
  }
  return 0;
}

/* What a GPU rank needs of /dev, under fsdpd's unit: the GPUs and the
 * driver's control and unified-memory devices (CUDA) and, for NCCL across
 * nodes, the InfiniBand/RoCE verbs devices (libibverbs opens
 * /dev/infiniband/uverbsN per adapter; NCCL's own transport needs no
 * rdma_cm). Checked against the /proc/devices of two nodes: NVIDIA's
 * current driver registers major 195 as "nvidia" and "nvidiactl", its older
 * one as "nvidia-frontend" (the unit allowed only that one, and no verbs
 * device: found by review). The rest of /dev stays closed. */
Test(systemd, fsdpds_device_acl_lets_gpu_ranks_reach_gpus_and_infiniband) {
  static const char *nodes[][2] = {
      {"current NVIDIA driver",
       "Character devices:\n  1 mem\n  5 /dev/tty\n 10 misc\n195 nvidia\n195 nvidiactl\n"
       "231 infiniband_mad\n231 infiniband_verbs\n234 infiniband_verbs\n509 nvidia-nvswitch\n"
       "510 nvidia-uvm\n511 nvidia-caps\n\nBlock devices:\n  8 sd\n"},
      {"older NVIDIA driver",
       "Character devices:\n  1 mem\n 10 misc\n195 nvidia-frontend\n231 infiniband_mad\n"
       "231 infiniband_verbs\n510 nvidia-uvm\n511 nvidia-caps\n\nBlock devices:\n  8 sd\n"}};
  static const struct {
    const char *path;
    int maj;
    const char *acc;
  } need[] = {{"/dev/nvidia0", 195, "rw"},           {"/dev/nvidiactl", 195, "rw"},
              {"/dev/nvidia-uvm", 510, "rw"},        {"/dev/nvidia-caps/nvidia-cap1", 511, "r"},
              {"/dev/infiniband/uverbs0", 231, "rw"}},
    denied[] = {{"/dev/sda", 8, "r"}, {"/dev/mem", 1, "r"}, {"/dev/fuse", 10, "rw"}};
  char *text;
  free(unit("fsdpd.service", &text));
  cr_assert(strstr(text, "\nDevicePolicy=closed\n"), "fsdpd's unit: DevicePolicy=closed is gone");
  for (size_t n = 0; n < sizeof nodes / sizeof *nodes; n++) {
    for (size_t i = 0; i < sizeof need / sizeof *need; i++)
      cr_assert(device_allowed(text, nodes[n][1], need[i].path, need[i].maj, need[i].acc),
                "fsdpd's unit (%s): a rank cannot open %s (%s)", nodes[n][0], need[i].path,
                need[i].acc);
    for (size_t i = 0; i < sizeof denied / sizeof *denied; i++)
      cr_assert(!device_allowed(text, nodes[n][1], denied[i].path, denied[i].maj, denied[i].acc),
                "fsdpd's unit (%s) opens %s to the ranks", nodes[n][0], denied[i].path);
  }
  /* a dynamically numbered verbs device (the fixed range holds 32) */
  cr_assert(device_allowed(text, nodes[0][1], "/dev/infiniband/uverbs40", 234, "rw"),
            "fsdpd's unit: a 33rd adapter's verbs device is closed");
  free(text);
}

/* NCCL over InfiniBand registers (pins) its buffers with the adapter, which
 * the kernel charges to RLIMIT_MEMLOCK: systemd's default of 8M fails a
 * multi-node GPU job at init; NCCL asks containers for memlock=-1. */
Test(systemd, fsdpds_ranks_may_pin_memory_for_rdma) {
  char *text;
  free(unit("fsdpd.service", &text));
  const char *p = strstr(text, "\nLimitMEMLOCK=");
  cr_assert_not_null(p, "fsdpd's unit leaves RLIMIT_MEMLOCK at systemd's default (8M)");
  cr_assert(!strncmp(p + 14, "infinity\n", 9), "fsdpd's unit: %.*s (NCCL over InfiniBand wants "
            "no limit)", (int)strcspn(p + 1, "\n"), p + 1);
  free(text);
}

/* ---- the command lines, as systemd runs them ------------------------------- */

typedef struct {
  char key[64], value[512];
} env_t;

/* The unit's Environment= settings, then the overrides (key=value). */
static int unit_env(const char *text, env_t *env, int max, const char *const *over) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, "\nEnvironment=")); p++) {
    const char *kv = p + 13, *eq = strchr(kv, '='), *eol = strchr(kv, '\n');
    cr_assert(eq && eol && eq < eol && n < max);
    snprintf(env[n].key, sizeof env[n].key, "%.*s", (int)(eq - kv), kv);
    snprintf(env[n].value, sizeof env[n].value, "%.*s", (int)(eol - eq - 1), eq + 1);
    n++;
  }
  for (; *over; over++) {
    const char *eq = strchr(*over, '=');
    int i = 0;
    while (i < n && strncmp(env[i].key, *over, (size_t)(eq - *over))) i++;
    cr_assert_lt(i, n, "the unit sets no %s", *over);
    snprintf(env[i].value, sizeof env[i].value, "%s", eq + 1);
  }
  return n;
}

/* The unit's ExecStart with ${KEY} and $KEY replaced from env (as systemd
 * does: an unset one is empty); key=value's int setting in *timeout_s. */
static void unit_exec(const char *text, const env_t *env, int n, char *cmd, size_t len,
                      int *timeout_s) {
  const char *p = strstr(text, "\nExecStart="), *stop = strstr(text, "\nTimeoutStopSec=");
  cr_assert(p && stop);
  *timeout_s = atoi(stop + 16);
  p += 11;
  size_t o = 0;
  while (*p && *p != '\n' && o + 1 < len) {
    if (*p != '$') {
      cmd[o++] = *p++;
      continue;
    }
    const int brace = p[1] == '{';
    const char *k = p + 1 + brace, *e = k;
    while ((*e >= 'A' && *e <= 'Z') || *e == '_' || (*e >= '0' && *e <= '9')) e++;
    for (int i = 0; i < n; i++)
      if (strlen(env[i].key) == (size_t)(e - k) && !strncmp(env[i].key, k, (size_t)(e - k)))
        o += (size_t)snprintf(cmd + o, len - o, "%s", env[i].value);
    p = e + brace;
  }
  cmd[o] = 0;
}

/* Where "CREDENTIALS_DIRECTORY" at p (in text) would reach a program unexpanded:
 * systemd substitutes $VAR and ${VAR} on Exec*= lines only, never inside an
 * Environment= value nor inside the value of a variable an Exec line
 * substitutes (the environment files' *_ARGS), so an option given it anywhere
 * but an Exec line gets the text as written. NULL when it is fine: on an Exec
 * line of a unit, or in prose that gives it to no option. */
static const char *credentials_misuse(const char *text, const char *p, int is_unit) {
  const char *line = p;
  while (line > text && line[-1] != '\n') line--;
  if (is_unit) return strncmp(line, "Exec", 4) ? line : NULL;
  const char *q = p;
  while (q > text && strchr("${` \t\n", q[-1])) q--; /* back over `${` and the space */
  const char *w = q;
  while (w > text && (isalnum((unsigned char)w[-1]) || w[-1] == '-')) w--;
  return q - w > 2 && !strncmp(w, "--", 2) ? w : NULL;
}

/* The paths the operator is told to give the units' file options: each
 * VAR=value example line of docs/OPERATIONS.md for a unit's *_ARGS variable,
 * substituted into the unit's ExecStart the way systemd does (one pass: a
 * value is not expanded again), names absolute files, and a credential by the
 * path systemd gives it, /run/credentials/UNIT/NAME, NAME loaded by a
 * LoadCredential=NAME: line shown there. The units' comments and the guide
 * never give an option $CREDENTIALS_DIRECTORY outside an Exec line (both
 * advised `--user-token-file ${CREDENTIALS_DIRECTORY}/user.token` in
 * FSDP_COORD_ARGS, which the coordinator would get as written; found by
 * review). */
Test(systemd, credential_paths_shown_to_operators_reach_the_programs_as_paths) {
  char src[1024], *ops;
  snprintf(src, sizeof src, "%s/docs/OPERATIONS.md", tu_root());
  ops = tu_slurp(src, NULL);
  cr_assert(ops[0], "%s is empty or missing", src);
  const char *units[2][2] = {{"fsdp-coordinator.service", "FSDP_COORD_ARGS"},
                             {"fsdpd.service", "FSDPD_ARGS"}};
  for (const char *p = ops; (p = strstr(p, "CREDENTIALS_DIRECTORY")); p++) {
    const char *w = credentials_misuse(ops, p, 0);
    cr_assert_null(w, "docs/OPERATIONS.md gives an option $CREDENTIALS_DIRECTORY, which systemd "
                   "does not expand there: \"%.80s\"", w);
  }
  for (int u = 0; u < 2; u++) {
    char *text, key[64], *unused = unit(units[u][0], &text);
    free(unused);
    for (const char *p = text; (p = strstr(p, "CREDENTIALS_DIRECTORY")); p++) {
      const char *line = credentials_misuse(text, p, 1);
      cr_assert_null(line, "%s: $CREDENTIALS_DIRECTORY outside an Exec line reaches nothing "
                     "expanded: \"%.*s\"", units[u][0], line ? (int)strcspn(line, "\n") : 0, line);
    }
    for (const char *p = text; (p = strstr(p, "\nEnvironment=")); p++)
      cr_assert_null(memchr(p + 1, '$', strcspn(p + 1, "\n")),
                     "%s: systemd expands no variable in \"%.*s\"", units[u][0],
                     (int)strcspn(p + 1, "\n"), p + 1);
    /* the comments name this unit's own credentials (fsdpd's hides the
     * coordinator's from its ranks: that line names another's on purpose) */
    for (const char *p = text; (p = strstr(p, "/run/credentials/")); p++) {
      const char *bol = p;
      while (bol > text && bol[-1] != '\n') bol--;
      if (!strncmp(bol, "InaccessiblePaths=", 18)) continue;
      const size_t ul = strlen(units[u][0]);
      cr_assert(!strncmp(p + 17, units[u][0], ul) && (p[17 + ul] == '/' || p[17 + ul] == ' '),
                "%s: \"%.60s\" is another unit's credential", units[u][0], p);
    }
    /* each example line of the guide for this unit's *_ARGS, as systemd passes it */
    snprintf(key, sizeof key, "%s=", units[u][1]);
    int examples = 0, credentials = 0;
    for (const char *p = ops; (p = strstr(p, key)); p++) {
      const char *line = p;
      while (line > ops && line[-1] == ' ') line--;
      if (p - line < 4 || (line > ops && line[-1] != '\n')) continue; /* not a code line */
      char over[1024], cmd[4096];
      snprintf(over, sizeof over, "%.*s", (int)strcspn(p, "\n"), p);
      env_t env[32];
      int n = unit_env(text, env, 32, (const char *[]){over, NULL}), stop;
      unit_exec(text, env, n, cmd, sizeof cmd, &stop);
      examples++;
      char *save, *arg = strtok_r(cmd, " ", &save), *prev = NULL;
      for (; arg; prev = arg, arg = strtok_r(NULL, " ", &save)) {
        const size_t pl = prev ? strlen(prev) : 0;
        const int file_opt = prev && (!strncmp(prev, "--tls-", 6) ||
                                      (pl > 7 && !strncmp(prev, "--", 2) && !strcmp(prev + pl - 5, "-file")));
        if (!file_opt) continue;
        cr_assert(arg[0] == '/' && !strpbrk(arg, "$%"), "%s as docs/OPERATIONS.md shows it: "
                  "%s gets \"%s\", not a file's path\n(%s)", units[u][0], prev, arg, over);
        if (strncmp(arg, "/run/credentials/", 17)) continue;
        char want[300], load[300];
        snprintf(want, sizeof want, "/run/credentials/%s/", units[u][0]);
        cr_assert(!strncmp(arg, want, strlen(want)), "%s: %s %s names another unit's credential "
                  "(systemd gives this one's in %s)", units[u][0], prev, arg, want);
        snprintf(load, sizeof load, "LoadCredential=%s:", arg + strlen(want));
        cr_assert_not_null(strstr(ops, load), "docs/OPERATIONS.md shows %s %s but no %s line that "
                           "loads it", prev, arg, load);
        credentials++;
      }
    }
    cr_assert_gt(examples, 0, "docs/OPERATIONS.md shows no %s line for %s", key, units[u][0]);
    cr_assert_gt(credentials, 0, "docs/OPERATIONS.md shows %s no token by its credential path",
                 units[u][0]);
    free(text);
  }
  free(ops);
}

/* Waits up to timeout_s for pid to exit; its status, or -1. Seconds in *took. */
static int wait_exit(pid_t pid, double timeout_s, double *took) {
  const double t0 = tu_now_s();
  int st;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (tu_now_s() - t0 > timeout_s) return -1;
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  *took = tu_now_s() - t0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(systemd, the_units_command_lines_run_a_job_and_stop_on_sigterm_in_time, .timeout = 150 * TU_SLOW) {
  chmod(tu_tmpdir(), 0755);
  char *tc, *tf;
  free(unit("fsdp-coordinator.service", &tc));
  free(unit("fsdpd.service", &tf));
  env_t env[32];
  char db[700], work[700], root[700], cmd[4096], out[1 << 14], o1[800], o2[800], o3[800];
  snprintf(db, sizeof db, "%s/unit-state.db", tu_tmpdir());
  snprintf(root, sizeof root, "FSDP_ROOT=%s", tu_tmpdir());
  snprintf(o1, sizeof o1, "FSDP_DB=%s", db);
  int n = unit_env(tc, env, 32, (const char *[]){o1, root, "FSDP_LISTEN=127.0.0.1:0",
                                                 "FSDP_METRICS_LISTEN=127.0.0.1:0", NULL});
  int stop_c, stop_f;
  unit_exec(tc, env, n, cmd, sizeof cmd, &stop_c);
  cluster_proc_t coord = {0};
  snprintf(coord.log, sizeof coord.log, "%s.log", db);
  cluster_coord_run(&coord, cmd);
  cr_assert_gt(coord.metrics_port, 0, "the unit's coordinator serves no /metrics");
  /* fsdpd as the unit's User= does: not root, its work directory its own */
  snprintf(work, sizeof work, "%s/unit-work", tu_tmpdir());
  cr_assert_eq(mkdir(work, 0755), 0);
  if (geteuid() == 0) cr_assert_eq(chown(work, 65534, 65534), 0);
  snprintf(o1, sizeof o1, "FSDP_COORDINATOR=%s", coord.addr);
  snprintf(o2, sizeof o2, "FSDP_WORK_DIR=%s", work);
  n = unit_env(tf, env, 32, (const char *[]){o1, o2, "FSDP_DEVICES=cpu:2",
                                            "FSDP_LISTEN=127.0.0.1:0",
                                            "FSDP_METRICS_LISTEN=127.0.0.1:0", NULL});
  char exec[4096];
  unit_exec(tf, env, n, exec, sizeof exec, &stop_f);
  cr_assert(strstr(exec, "--grace 30"), "%s", exec);
  cr_assert_gt(stop_f, 30, "fsdpd's TimeoutStopSec (%d s) leaves its ranks no time to "
               "checkpoint within --grace 30", stop_f);
  snprintf(o3, sizeof o3, "%s/unit-fsdpd.log", tu_tmpdir());
  snprintf(cmd, sizeof cmd, "exec %s %s >>'%s' 2>&1",
           geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups" : "", exec, o3);
  pid_t fsdpd = cluster_run(cmd);
  char host[256];
  gethostname(host, sizeof host);
  cluster_wait_alive(coord.addr, host);
  /* a job that runs until stopped, checkpointing */
  char *data = tu_token_file("unit-tok.bin", 40000, 3, 256), ck[800], conf[900], a[2048];
  chmod(data, 0644);
  snprintf(ck, sizeof ck, "%s/unit-ck", tu_tmpdir());
  cr_assert_eq(mkdir(ck, 0777), 0);
  chmod(ck, 0777);
  snprintf(conf, sizeof conf, "%s/unit.conf", tu_tmpdir());
  snprintf(a, sizeof a, "[model]\nmodel = tiny\n[data]\ndata = %s\n[train]\nbatch = 2\nseq_len = 32\n"
           "steps = 100000\neval_every = 0\n[output]\ncheckpoint_dir = %s\ncheckpoint_every = 100000\n",
           data, ck);
  tu_write_file(conf, a, strlen(a));
  snprintf(a, sizeof a, "submit '%s' --ranks 2", conf);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  char job[32];
  snprintf(job, sizeof job, "%.*s", (int)strcspn(out, "\n"), out);
  const double t0 = tu_now_s();
  for (;;) { /* running */
    snprintf(a, sizeof a, "status %s", job);
    cluster_ctl(coord.addr, a, out, sizeof out);
    if (strstr(out, "RUNNING")) break;
    cr_assert_lt(tu_now_s() - t0, 30, "the job did not start:\n%s", out);
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  }
  /* both ranks have done steps (the coordinator's /metrics shows their reports):
   * a rank stopped before its first step has nothing to checkpoint */
  for (int r = 0; r < 2; r++)
    for (;;) {
      char q[512], want[96];
      snprintf(q, sizeof q, "curl -s -m 5 http://127.0.0.1:%d/metrics", coord.metrics_port);
      snprintf(want, sizeof want, "\nfsdp_rank_step{job=\"%s\",rank=\"%d\"} ", job, r);
      tu_sh(q, out, sizeof out);
      const char *at = strstr(out, want);
      if (at && atof(at + strlen(want)) > 0) break;
      cr_assert_lt(tu_now_s() - t0, 60, "rank %d did no step:\n%.2000s", r, out);
      nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
  /* systemctl stop: SIGTERM to fsdpd (KillMode=mixed), then the coordinator */
  double took;
  kill(fsdpd, SIGTERM);
  int st = wait_exit(fsdpd, stop_f, &took);
  cr_assert_eq(st, 0, "fsdpd: exit %d within its TimeoutStopSec of %d s (log %s)", st, stop_f, o3);
  snprintf(a, sizeof a, "checkpoints %s", job);
  const double t1 = tu_now_s();
  while (cluster_ctl(coord.addr, a, out, sizeof out), !strstr(out, "COMMITTED") && tu_now_s() - t1 < 5)
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  cr_assert(strstr(out, "COMMITTED"), "the ranks did not checkpoint on SIGTERM:\n%s", out);
  kill(coord.pid, SIGTERM);
  double took_c;
  st = wait_exit(coord.pid, stop_c, &took_c);
  cr_assert_eq(st, 0, "the coordinator: exit %d within its TimeoutStopSec of %d s", st, stop_c);
  cr_log_info("fsdpd stopped in %.2f s (ranks checkpointed), the coordinator in %.2f s", took,
              took_c);
  free(tc), free(tf), free(data);
}

/* `make install DESTDIR= PREFIX=`: the programs executable under BINDIR, the
 * units there with ExecStart naming the installed program (the rest of each
 * unit as checked above), the sysusers file, the alerting rules, the
 * documentation. */
Test(systemd, make_install_puts_programs_units_and_docs_where_packagers_expect, .timeout = 120 * TU_SLOW) {
  char dest[800], cmd[4096], out[1 << 14], path[1200];
  snprintf(dest, sizeof dest, "%s/destdir", tu_tmpdir());
  snprintf(cmd, sizeof cmd, "make -s -C '%s' install DESTDIR='%s' PREFIX=/opt/fsdp", tu_root(), dest);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s:\n%s", cmd, out);
  const char *progs[] = {"fsdp-coordinator", "fsdpd", "fsdpctl", "fsdp-train", "fsdp-launch",
                         "fsdp-tokenize"};
  for (size_t i = 0; i < sizeof progs / sizeof *progs; i++) {
    snprintf(path, sizeof path, "%s/opt/fsdp/bin/%s", dest, progs[i]);
    cr_assert_eq(access(path, X_OK), 0, "%s is not installed", path);
  }
  const char *units[][2] = {{"fsdp-coordinator.service", "fsdp-coordinator"}, {"fsdpd.service", "fsdpd"}};
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/opt/fsdp/lib/systemd/system/%s", dest, units[i][0]);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s is not installed", path);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    char want[200], *src;
    snprintf(want, sizeof want, "\nExecStart=/opt/fsdp/bin/%s ", units[i][1]);
    cr_assert(strstr(out, want), "%s: no \"%s\"", path, want + 1);
    cr_assert_null(strstr(out, "@BINDIR@"), "%s: the placeholder is left", path);
    free(unit(units[i][0], &src)); /* the same unit but for the path */
    char *p = strstr(src, "\nExecStart=") + 11, *q = strstr(out, "\nExecStart=") + 11;
    cr_assert(!strncmp(src, out, (size_t)(p - src)) && !strcmp(strchr(p, ' '), strchr(q, ' ')),
              "%s differs from deploy/systemd/%s beyond ExecStart's path", path, units[i][0]);
    free(src);
  }
  snprintf(path, sizeof path, "%s/opt/fsdp/lib/sysusers.d/fsdpd.conf", dest);
  cr_assert_eq(access(path, R_OK), 0, "%s", path);
  snprintf(path, sizeof path, "%s/opt/fsdp/share/doc/fsdpd/OPERATIONS.md", dest);
  cr_assert_eq(access(path, R_OK), 0, "%s", path);
  snprintf(path, sizeof path, "%s/opt/fsdp/share/fsdpd/prometheus/fsdp-alerts.yml", dest);
  cr_assert_eq(access(path, R_OK), 0, "%s", path);
  /* the Slurm script, its programs where this install put them, and the manifests */
  snprintf(path, sizeof path, "%s/opt/fsdp/share/fsdpd/slurm/fsdp.sbatch", dest);
  cr_assert_eq(access(path, X_OK), 0, "%s is not installed", path);
  char *sb = tu_slurp(path, NULL);
  cr_expect(strstr(sb, "bin=${FSDP_BIN:-/opt/fsdp/bin}") && !strstr(sb, "/usr/local/bin"), "%s", path);
  free(sb);
  const char *manifests[] = {"coordinator.yaml", "fsdpd.yaml", "submit-job.yaml"};
  for (size_t i = 0; i < sizeof manifests / sizeof *manifests; i++) {
    snprintf(path, sizeof path, "%s/opt/fsdp/share/fsdpd/k8s/%s", dest, manifests[i]);
    cr_expect_eq(access(path, R_OK), 0, "%s is not installed", path);
  }
}

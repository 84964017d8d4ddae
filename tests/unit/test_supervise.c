/* Tests of the process supervisor (daemon/node/supervise.c) with real child
 * processes (/bin/sh scripts): the output relay (prefixes, both streams, a
 * last line with no newline, over-long lines), exit statuses and signals,
 * the environment and descriptors a child is given, stop with SIGTERM and
 * SIGKILL after the grace, and the child's process group killed with it.
 *
 * The test process is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever
 * a child leaves behind becomes ours, so each test's .fini can check that
 * nothing is left: every descendant dead and reaped within a bound. Every
 * loop runs against a deadline. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/node/supervise.h"
#include "tests/unit/testutil.h"

/* What a child's exit callback saw. */
typedef struct exit_rec {
  int calls;
  int64_t status;
  int sig;
  double at; /* tu_now_s() */
  long out_len; /* bytes relayed to stdout when the callback ran */
} exit_rec_t;

static uv_loop_t loop;
static uv_timer_t tick; /* wakes the loop so run_until can look at its deadline */
static supervise_t *S;
static FILE *out, *err;
static int kill_calls, kill_running;

static void kill_cb(supervise_t *s, void *arg, int running) {
  (void)s, (void)arg;
  kill_calls++;
  kill_running = running;
}

static void exit_cb(supervise_t *s, void *arg, int64_t status, int sig) {
  exit_rec_t *r = arg;
  (void)s;
  r->calls++;
  r->status = status;
  r->sig = sig;
  r->at = tu_now_s();
  fflush(out);
  r->out_len = ftell(out);
}

static void tick_cb(uv_timer_t *t) { (void)t; }

/* Runs the loop until done(arg) or timeout_s; returns done(arg). */
static int run_until(int (*done)(void *), void *arg, double timeout_s) {
  const double deadline = tu_now_s() + timeout_s;
  uv_timer_start(&tick, tick_cb, 5, 5);
  int ok;
  while (!(ok = done(arg)) && tu_now_s() < deadline) uv_run(&loop, UV_RUN_ONCE);
  uv_timer_stop(&tick);
  return ok;
}

static int all_exited(void *arg) {
  (void)arg;
  return supervise_running(S) == 0;
}

/* Everything relayed to f so far (malloc'd, NUL-terminated). */
static char *relayed(FILE *f) {
  fflush(f);
  long n = ftell(f);
  cr_assert_geq(n, 0);
  char *s = malloc((size_t)n + 1);
  cr_assert_not_null(s);
  cr_assert_eq(pread(fileno(f), s, (size_t)n, 0), n);
  s[n] = 0;
  return s;
}

static int out_has(void *want) {
  char *s = relayed(out);
  int found = strstr(s, want) != NULL;
  free(s);
  return found;
}

static void setup(void) {
  cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  cr_assert_eq(uv_loop_init(&loop), 0);
  uv_timer_init(&loop, &tick);
  cr_assert_not_null(out = tmpfile());
  cr_assert_not_null(err = tmpfile());
  const supervise_opts_t o = {.out = out, .err = err, .kill_cb = kill_cb};
  cr_assert_eq(supervise_create(&S, &loop, &o), 0);
  kill_calls = kill_running = 0;
}

/* Stops whatever a failed test left running, then checks that nothing is
 * left: no child of the set, no descendant (ours, as subreaper) alive or
 * unreaped, no handle open on the loop. */
static void teardown(void) {
  if (supervise_running(S)) {
    supervise_stop(S, 0);
    run_until(all_exited, NULL, 10);
  }
  cr_expect_eq(supervise_running(S), 0, "children still running 10 s after SIGKILL");
  supervise_destroy(S);
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  cr_expect_eq(uv_loop_close(&loop), 0, "a handle was left open on the loop");
  const double deadline = tu_now_s() + 5;
  pid_t p;
  int st;
  while ((p = waitpid(-1, &st, WNOHANG)) >= 0 && tu_now_s() < deadline)
    if (p == 0) nanosleep(&(struct timespec){0, 5000000}, NULL);
  cr_expect(p < 0 && errno == ECHILD, "a descendant of a child was still alive 5 s after the end");
  fclose(out), fclose(err);
}

TestSuite(supervise, .init = setup, .fini = teardown, .timeout = 30);

/* Starts `sh -c script` with prefix; its exit lands in r. */
static int spawn_sh(const char *script, const char *prefix, exit_rec_t *r, int *pid) {
  char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
  const supervise_child_opts_t o = {.argv = argv, .prefix = prefix, .exit_cb = exit_cb, .arg = r};
  return supervise_spawn(S, &o, pid);
}

/* Waits (bounded) for descendant pid, orphaned to us, to end; its wait status. */
static int reap_orphan(int pid, double timeout_s) {
  const double deadline = tu_now_s() + timeout_s;
  for (;;) {
    int st = 0;
    pid_t p = waitpid(pid, &st, WNOHANG);
    if (p == pid) return st;
    cr_assert_eq(p, 0, "waitpid %d: %s", pid, strerror(errno));
    cr_assert_lt(tu_now_s(), deadline, "process %d still runs %.1f s later", pid, timeout_s);
    nanosleep(&(struct timespec){0, 2000000}, NULL);
  }
}

/* The number after "pid=" in the relayed output. */
static int pid_in_output(void) {
  char *s = relayed(out), *p = strstr(s, "pid=");
  cr_assert_not_null(p, "no pid line in:\n%s", s);
  int pid = atoi(p + 4);
  free(s);
  cr_assert_gt(pid, 1);
  return pid;
}

Test(supervise, relays_each_stream_with_the_prefix_and_a_last_line_without_newline) {
  exit_rec_t a = {0}, b = {0};
  cr_assert_eq(spawn_sh("echo one; echo two >&2; echo three; printf 'no newline'", "[a] ", &a, NULL), 0);
  cr_assert_eq(spawn_sh("printf 'partial to stderr' >&2", "[b] ", &b, NULL), 0);
  cr_assert(run_until(all_exited, NULL, 10));
  cr_assert_eq(a.calls, 1);
  cr_assert_eq(b.calls, 1);
  char *o = relayed(out), *e = relayed(err);
  cr_expect_str_eq(o, "[a] one\n[a] three\n[a] no newline\n", "stdout relayed:\n%s", o);
  cr_expect_eq(a.out_len, (long)strlen(o), "a's exit callback ran before its last line");
  /* the two children's stderr lines may come in either order */
  cr_expect(strstr(e, "[a] two\n") && strstr(e, "[b] partial to stderr\n") &&
            strlen(e) == strlen("[a] two\n[b] partial to stderr\n"), "stderr relayed:\n%s", e);
  free(o), free(e);
}

/* A line longer than SUPERVISE_LINE_MAX is relayed in pieces of that size;
 * one of exactly that size is relayed whole, with no empty line after it. */
Test(supervise, an_over_long_line_is_relayed_in_pieces) {
  const int over = 2 * SUPERVISE_LINE_MAX + 100, exact = SUPERVISE_LINE_MAX;
  char script[512];
  snprintf(script, sizeof script,
           "head -c %d /dev/zero | tr '\\0' x; echo; head -c %d /dev/zero | tr '\\0' y; echo; "
           "printf tail", over, exact);
  exit_rec_t r = {0};
  cr_assert_eq(spawn_sh(script, "> ", &r, NULL), 0);
  cr_assert(run_until(all_exited, NULL, 10));
  cr_assert_eq(r.status, 0);
  const struct { char c; int n; } want[] = {{'x', SUPERVISE_LINE_MAX}, {'x', SUPERVISE_LINE_MAX},
                                            {'x', over - 2 * SUPERVISE_LINE_MAX}, {'y', exact},
                                            {0, 4}};
  char *o = relayed(out), *l = o;
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char *nl = strchr(l, '\n');
    cr_assert_not_null(nl, "line %zu missing", i);
    cr_assert(!strncmp(l, "> ", 2), "line %zu lacks its prefix", i);
    int len = (int)(nl - l) - 2;
    cr_expect_eq(len, want[i].n, "line %zu: %d bytes, %d expected", i, len, want[i].n);
    if (want[i].c)
      for (int k = 0; k < len; k++) cr_assert_eq(l[2 + k], want[i].c, "line %zu byte %d", i, k);
    else
      cr_expect(!strncmp(l + 2, "tail", 4));
    l = nl + 1;
  }
  cr_expect_str_eq(l, "", "more lines than expected");
  cr_expect_eq(r.out_len, (long)strlen(o), "the exit callback ran before the output was relayed");
  free(o);
}

Test(supervise, reports_exit_status_and_signal) {
  exit_rec_t ok = {0}, seven = {0}, usr1 = {0};
  cr_assert_eq(spawn_sh("exit 0", "", &ok, NULL), 0);
  cr_assert_eq(spawn_sh("exit 7", "", &seven, NULL), 0);
  cr_assert_eq(spawn_sh("kill -USR1 $$", "", &usr1, NULL), 0);
  cr_assert_eq(supervise_running(S), 3);
  cr_assert(run_until(all_exited, NULL, 10));
  cr_expect(ok.calls == 1 && ok.status == 0 && ok.sig == 0, "%d %lld %d", ok.calls,
            (long long)ok.status, ok.sig);
  cr_expect(seven.calls == 1 && seven.status == 7 && seven.sig == 0, "%d %lld %d", seven.calls,
            (long long)seven.status, seven.sig);
  cr_expect(usr1.calls == 1 && usr1.status == 0 && usr1.sig == SIGUSR1, "%d %lld %d", usr1.calls,
            (long long)usr1.status, usr1.sig);
  cr_expect_eq(kill_calls, 0, "nothing was stopped");
}

/* Extra entries replace inherited ones of the same name (once each in the
 * child's environment), and descriptors arrive as fd 3 and 4. */
Test(supervise, a_child_gets_its_environment_and_descriptors) {
  setenv("SUPERVISE_T", "inherited", 1);
  setenv("SUPERVISE_KEPT", "kept", 1);
  int p3[2], p4[2];
  cr_assert(pipe(p3) == 0 && pipe(p4) == 0);
  char *argv[] = {"/bin/sh", "-c",
                  "echo \"$SUPERVISE_T $SUPERVISE_KEPT $SUPERVISE_NEW\"; env | grep -c '^SUPERVISE_T='; "
                  "echo three >&3; echo four >&4", NULL};
  char *env[] = {"SUPERVISE_T=replaced", "SUPERVISE_NEW=new", NULL};
  const int fds[2] = {p3[1], p4[1]};
  exit_rec_t r = {0};
  const supervise_child_opts_t o = {.argv = argv, .env = env, .fds = fds, .nfds = 2,
                                    .exit_cb = exit_cb, .arg = &r};
  cr_assert_eq(supervise_spawn(S, &o, NULL), 0, "%s", err_msg());
  close(p3[1]), close(p4[1]);
  cr_assert(run_until(all_exited, NULL, 10));
  cr_assert_eq(r.status, 0);
  char *s = relayed(out), buf[16] = {0};
  cr_expect_str_eq(s, "replaced kept new\n1\n");
  cr_expect(read(p3[0], buf, sizeof buf - 1) == 6 && !strcmp(buf, "three\n"), "fd 3 got \"%s\"", buf);
  memset(buf, 0, sizeof buf);
  cr_expect(read(p4[0], buf, sizeof buf - 1) == 5 && !strcmp(buf, "four\n"), "fd 4 got \"%s\"", buf);
  close(p3[0]), close(p4[0]);
  free(s);
}

Test(supervise, a_program_that_cannot_start_is_an_error_naming_it) {
  char *argv[] = {"/nonexistent/fsdp-prog", NULL};
  exit_rec_t r = {0};
  const supervise_child_opts_t o = {.argv = argv, .exit_cb = exit_cb, .arg = &r};
  cr_assert_eq(supervise_spawn(S, &o, NULL), FSDP_ENOENT);
  cr_expect(strstr(err_msg(), "/nonexistent/fsdp-prog"), "%s", err_msg());
  cr_expect_eq(supervise_running(S), 0);
  uv_run(&loop, UV_RUN_NOWAIT); /* its handles close */
  cr_expect_eq(r.calls, 0, "no exit callback for a child that never started");
}

/* SIGTERM ends a well-behaved child at once; one that ignores it is
 * SIGKILLed when the grace ends, not before; nothing starts after a stop. */
Test(supervise, stop_kills_a_child_ignoring_sigterm_after_the_grace) {
  const double grace = 1.0; /* a margin for a loaded machine: the polite child must end inside it */
  exit_rec_t polite = {0}, stubborn = {0};
  cr_assert_eq(spawn_sh("echo polite; while :; do sleep 0.05; done", "", &polite, NULL), 0);
  cr_assert_eq(spawn_sh("trap '' TERM; echo stubborn; while :; do sleep 0.05; done", "", &stubborn,
                        NULL), 0);
  cr_assert(run_until(out_has, "stubborn", 10) && run_until(out_has, "polite", 10),
            "the children did not start");
  const double t0 = tu_now_s();
  supervise_stop(S, grace);
  cr_assert(supervise_stopping(S));
  exit_rec_t never = {0};
  cr_expect_eq(spawn_sh("exit 0", "", &never, NULL), FSDP_ECANCELED, "a stopping set starts nothing");
  cr_assert(run_until(all_exited, NULL, 10));
  cr_expect_eq(polite.sig, SIGTERM);
  cr_expect_lt(polite.at - t0, grace, "SIGTERM ends a well-behaved child at once");
  cr_expect_eq(stubborn.sig, SIGKILL);
  cr_expect(stubborn.at - t0 >= grace && stubborn.at - t0 < grace + 2.0,
            "SIGKILL when the %.1f s grace ends: after %.3f s", grace, stubborn.at - t0);
  cr_expect(kill_calls == 1 && kill_running == 1, "kill_cb: %d calls, %d running", kill_calls,
            kill_running);
}

/* No grace (0): SIGKILL at once, without a SIGTERM first, so a child that
 * would do something on SIGTERM (a rank: write a checkpoint) does nothing;
 * no kill_cb (no grace ended). */
Test(supervise, stop_without_grace_kills_at_once_without_sigterm) {
  exit_rec_t r = {0};
  cr_assert_eq(spawn_sh("trap 'echo handled; exit 3' TERM; echo up; while :; do sleep 0.05; done",
                        "", &r, NULL), 0);
  cr_assert(run_until(out_has, "up", 10));
  const double t0 = tu_now_s();
  supervise_stop(S, 0);
  cr_assert(run_until(all_exited, NULL, 10));
  cr_expect_eq(r.sig, SIGKILL, "ended by signal %d, status %lld", r.sig, (long long)r.status);
  cr_expect_lt(r.at - t0, 1.0, "SIGKILL came %.3f s after the stop", r.at - t0);
  cr_expect(!out_has("handled"), "the child handled a SIGTERM it should never have had");
  cr_expect_eq(kill_calls, 0, "kill_cb called %d times with no grace to end", kill_calls);
}

/* A stopped (SIGSTOP) child that handles SIGTERM still gets to handle it,
 * long before the grace (the kernel would hold the signal until SIGCONT). */
Test(supervise, stop_lets_a_stopped_child_handle_sigterm) {
  exit_rec_t r = {0};
  int pid;
  cr_assert_eq(spawn_sh("trap 'echo cleaning up; exit 3' TERM; echo up; while :; do sleep 0.05; done",
                        "", &r, &pid), 0);
  cr_assert(run_until(out_has, "up", 10));
  cr_assert_eq(kill(pid, SIGSTOP), 0);
  const double t0 = tu_now_s();
  supervise_stop(S, 20);
  cr_assert(run_until(all_exited, NULL, 10), "a stopped child waited for the grace");
  cr_expect(r.status == 3 && r.sig == 0, "status %lld, signal %d", (long long)r.status, r.sig);
  char *o = relayed(out);
  o[r.out_len] = 0; /* what was out when the callback ran */
  cr_expect(strstr(o, "cleaning up"), "%s", o);
  cr_expect_lt(r.at - t0, 2.0);
  cr_expect_eq(kill_calls, 0);
  free(o);
}

/* A child that exits leaves nothing behind: what it started in its group
 * (here a background sleep) is SIGKILLed with it. */
Test(supervise, a_childs_group_dies_with_it) {
  exit_rec_t r = {0};
  cr_assert_eq(spawn_sh("sleep 31.4159 & echo pid=$!; exit 0", "", &r, NULL), 0);
  cr_assert(run_until(all_exited, NULL, 10));
  cr_assert_eq(r.status, 0);
  int st = reap_orphan(pid_in_output(), 5);
  cr_expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the grandchild ended with status 0x%x", st);
}

/* On stop, a grandchild that ignores SIGTERM dies too: its parent ends at
 * SIGTERM, and its group is SIGKILLed then, before any grace. */
Test(supervise, stop_kills_grandchildren_ignoring_sigterm) {
  exit_rec_t r = {0};
  /* the grandchild says its pid once it ignores SIGTERM (exec keeps that) */
  cr_assert_eq(spawn_sh("sh -c 'trap \"\" TERM; echo pid=$$; exec sleep 27.1828' & wait", "", &r, NULL),
               0);
  cr_assert(run_until(out_has, "pid=", 10));
  const int gpid = pid_in_output();
  const double t0 = tu_now_s();
  supervise_stop(S, 20);
  cr_assert(run_until(all_exited, NULL, 10));
  cr_expect_eq(r.sig, SIGTERM);
  int st = reap_orphan(gpid, 5);
  cr_expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the grandchild ended with status 0x%x", st);
  cr_expect_lt(tu_now_s() - t0, 5.0, "the grandchild waited for the grace");
}

Test(supervise, a_child_with_its_own_files_writes_there_and_not_to_the_set) {
  FILE *log = tmpfile(), *elog = tmpfile();
  cr_assert(log && elog);
  exit_rec_t a = {0}, b = {0};
  char *argv[] = {"/bin/sh", "-c", "echo to-log; echo to-elog >&2", NULL};
  const supervise_child_opts_t o = {.argv = argv, .out = log, .err = elog, .exit_cb = exit_cb,
                                    .arg = &a};
  cr_assert_eq(supervise_spawn(S, &o, NULL), 0, "%s", err_msg());
  cr_assert_eq(spawn_sh("echo to-set", "[b] ", &b, NULL), 0);
  cr_assert(run_until(all_exited, NULL, 10));
  char *l = relayed(log), *el = relayed(elog), *o2 = relayed(out), *e2 = relayed(err);
  cr_expect_str_eq(l, "to-log\n");
  cr_expect_str_eq(el, "to-elog\n");
  cr_expect_str_eq(o2, "[b] to-set\n");
  cr_expect_str_eq(e2, "");
  free(l), free(el), free(o2), free(e2);
  fclose(log), fclose(elog);
}

/* A daemon started as root runs its ranks as an unprivileged user: uid, gid
 * and no supplementary group of root's. */
Test(supervise, a_child_runs_as_the_user_it_is_given) {
  if (geteuid() != 0) cr_skip_test("needs root to change user");
  exit_rec_t a = {0};
  char *argv[] = {"/bin/sh", "-c", "echo \"$(id -u) $(id -g) $(id -G)\"", NULL};
  const supervise_child_opts_t o = {.argv = argv, .as_user = 1, .uid = 65534, .gid = 65534,
                                    .exit_cb = exit_cb, .arg = &a};
  cr_assert_eq(supervise_spawn(S, &o, NULL), 0, "%s", err_msg());
  cr_assert(run_until(all_exited, NULL, 10));
  cr_assert_eq(a.status, 0);
  char *s = relayed(out);
  cr_expect_str_eq(s, "65534 65534 65534\n");
  free(s);
}

/* A rank killed mid-bootstrap leaves its ring link's name in /dev/shm
 * (shm_name.h): by the child's exit callback the supervisor has removed the
 * names of that pid, and only those (a name of another pid that begins with
 * the same digits stays). */
Test(supervise, a_killed_childs_ring_links_are_removed_before_its_exit_callback) {
  if (access("/dev/shm", W_OK) != 0) cr_skip_test("no writable /dev/shm here");
  exit_rec_t r = {0};
  int pid = 0;
  cr_assert_eq(spawn_sh(": > /dev/shm/fsdpd-ring-$$-0-0badc0de; : > /dev/shm/fsdpd-ring-$$-1-1;"
                        " : > /dev/shm/fsdpd-ring-${$}7-0-0badc0de; echo made; kill -9 $$",
                        "", &r, &pid),
                0);
  cr_assert(run_until(all_exited, NULL, 10));
  cr_assert_eq(r.sig, SIGKILL);
  char mine[2][96], other[96];
  snprintf(mine[0], sizeof mine[0], "/dev/shm/fsdpd-ring-%d-0-0badc0de", pid);
  snprintf(mine[1], sizeof mine[1], "/dev/shm/fsdpd-ring-%d-1-1", pid);
  snprintf(other, sizeof other, "/dev/shm/fsdpd-ring-%d7-0-0badc0de", pid);
  int other_left = access(other, F_OK) == 0;
  unlink(other);
  char *o = relayed(out);
  cr_assert(strstr(o, "made"), "the child did not create its names: %s", o);
  free(o);
  for (int i = 0; i < 2; i++) {
    int left = access(mine[i], F_OK) == 0;
    unlink(mine[i]);
    cr_expect(!left, "%s is left after the child's exit", mine[i]);
  }
  cr_expect(other_left, "%s (another pid's) was removed", other);
}

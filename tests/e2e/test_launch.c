/* End-to-end tests of fsdp-launch, run as a program: what each rank is given (rank, world, addresses, a
 * bound listening socket), prefixed output, and supervision: one failing rank
 * stops the others within the grace period and nothing survives. Every test
 * is bounded (Criterion timeouts; the ranks' sleeps are ended by the launcher). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/testutil.h"

/* Runs fsdp-launch with args (shell words), output and errors into out. */
static int launch(const char *args, char *out, size_t len, double *secs) {
  double t0 = tu_now_s();
  int rc = tu_run_bin("fsdp-launch", args, out, len);
  if (secs) *secs = tu_now_s() - t0;
  return rc;
}

/* 1 when a process runs `sleep SECS`; the pattern's [.] keeps pgrep from
 * matching the shell that runs it. */
static int survivors(const char *secs_int, const char *secs_frac) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "pgrep -f 'sleep %s[.]%s' >/dev/null", secs_int, secs_frac);
  return system(cmd) == 0;
}

Test(launch, ranks_get_their_place_and_a_listening_socket, .timeout = 30) {
  char out[16384];
  /* each rank connects to its own address: the socket it was handed listens there */
  int rc = launch("-n 3 -- bash -c 'echo \"me=$FSDP_RANK of $FSDP_WORLD_SIZE fd=$FSDP_LISTEN_FD\"; "
                  "IFS=, read -ra A <<< \"$FSDP_ADDRS\"; n=${A[$FSDP_RANK]}; "
                  "exec 5<>/dev/tcp/${n%:*}/${n#*:} && echo connected; "
                  "echo oops >&2'", out, sizeof out, NULL);
  cr_assert_eq(rc, 0, "%s", out);
  for (int r = 0; r < 3; r++) {
    char want[64];
    snprintf(want, sizeof want, "[rank %d] me=%d of 3 fd=3", r, r);
    cr_assert(strstr(out, want), "missing \"%s\" in:\n%s", want, out);
    snprintf(want, sizeof want, "[rank %d] connected", r);
    cr_assert(strstr(out, want), "missing \"%s\" in:\n%s", want, out);
    snprintf(want, sizeof want, "[rank %d] oops", r);
    cr_assert(strstr(out, want), "stderr is relayed too:\n%s", out);
  }
}

Test(launch, a_failing_rank_stops_the_others, .timeout = 30) {
  char out[16384];
  double secs;
  int rc = launch("-n 3 --grace 5 -- sh -c 'if [ \"$FSDP_RANK\" = 1 ]; then sleep 0.2; exit 3; fi; "
                  "sleep 31.4159 & wait'", out, sizeof out, &secs);
  cr_assert_eq(rc, 1, "%s", out);
  cr_assert(strstr(out, "rank 1 exited with status 3"), "%s", out);
  cr_assert_lt(secs, 5.0, "SIGTERM ends well-behaved ranks at once (%.2f s)", secs);
  cr_assert(!survivors("31", "4159"), "a rank's child survived the launcher");
}

Test(launch, a_rank_ignoring_sigterm_is_killed_after_the_grace, .timeout = 30) {
  char out[16384];
  double secs;
  int rc = launch("-n 2 --grace 1 -- sh -c 'trap \"\" TERM; if [ \"$FSDP_RANK\" = 1 ]; then exit 4; fi; "
                  "sleep 27.1828'", out, sizeof out, &secs);
  cr_assert_eq(rc, 1);
  cr_assert(strstr(out, "killing them") && strstr(out, "rank 0: killed by signal 9"), "%s", out);
  cr_assert(secs >= 1.0 && secs < 3.0, "killed after the 1 s grace, not before: %.2f s", secs);
  cr_assert(!survivors("27", "1828"));
}

Test(launch, bad_usage, .timeout = 10) {
  char out[4096];
  cr_assert_eq(launch("-- true", out, sizeof out, NULL), 2);
  cr_assert(strstr(out, "-n RANKS is required"), "%s", out);
  cr_assert_eq(launch("-n 0 -- true", out, sizeof out, NULL), 2);
  cr_assert(strstr(out, "-n"), "%s", out);
  cr_assert_eq(launch("-n 2", out, sizeof out, NULL), 2);
  cr_assert(strstr(out, "no program"), "%s", out);
  cr_assert_eq(launch("-n 2 -- /nonexistent/prog", out, sizeof out, NULL), 1);
  cr_assert(strstr(out, "rank 0: cannot start /nonexistent/prog"), "%s", out);
}

/* Faults in a sharded training job, seen by the training ranks themselves:
 * a world of 3 fsdp-train ranks (FULL_SHARD over 3) started directly, the way
 * fsdp-launch starts them but with no launcher to stop the rest. One rank is
 * killed, stopped, or started with a different model; every other rank must
 * notice on its own and exit with status 1 ("the run failed") within the
 * collective timeout + 1 s, naming the rank at fault, or saying that the
 * collectives diverged. Every wait is bounded, and .fini kills and reaps
 * whatever is left, whatever happened. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"
#include "tests/unit/testutil.h"

#define TIMEOUT_MS 2000 /* FSDP_COMM_TIMEOUT_MS for the ranks */
#define STR_(x) #x
#define STR(x) STR_(x)
/* What the ring's failure handling promises (docs/ARCHITECTURE.md, daemon/comm):
 * every other rank names a dead or stalled rank within the collective timeout
 * + 1 s. */
#define BOUND_S (TIMEOUT_MS / 1000.0 + 1.0)
#define VICTIM 1

static tu_world_t W;

static void teardown(void) { tu_world_kill(&W); }

/* 64k tokens of a byte-level vocabulary: what they say does not matter here
 * (variant 0 or 1: two files of one size that differ). */
static char *token_file(int variant) {
  static uint16_t tok[1 << 16];
  for (size_t i = 0; i < sizeof tok / sizeof tok[0]; i++)
    tok[i] = (uint16_t)((i * 7 + i / 13 + (size_t)variant * (i % 3)) % 256);
  char *path = tu_path(variant ? "tokens-1.bin" : "tokens.bin");
  cr_assert_eq(data_write(path, tok, sizeof tok / sizeof tok[0]), 0, "%s", err_msg());
  return path;
}

/* Three ranks of a job long enough to be still running when the test strikes,
 * printing every step, on token file data (NULL: token_file(0)); rank_args:
 * more flags for one rank (or NULL). */
static void start_world(const char *data, const char *const *rank_args) {
  static const char *const env[] = {"FSDP_COMM_TIMEOUT_MS=" STR(TIMEOUT_MS), "FSDP_PROGRESS_EVERY=1",
                                    NULL};
  char *mine = data ? NULL : token_file(0), args[1024];
  snprintf(args, sizeof args, "--model tiny --steps 10000 --warmup_steps 1 --batch 2 --seq_len 32 "
           "--threads 1 --strategy FULL_SHARD --mesh 3 --data %s", data ? data : mine);
  tu_world_start(&W, 3, "fsdp-train", args, env, NULL, rank_args);
  free(mine);
}

/* Rank 0 alone prints progress ("one voice per job"); a step it finished is
 * one every rank took part in, since each step's collectives need them all. */
static void wait_until_training(void) {
  if (tu_world_wait_lines(&W, 0, "step ", 2, 60) == 0) return;
  char *out = tu_world_output(&W, 0);
  cr_assert_fail("rank 0 did not finish 2 steps within 60 s:\n%s", out);
}

/* The line fsdp-train ends a failed run with (or the whole output when missing). */
static const char *error_line(const char *out, char *buf, size_t n) {
  const char *l = strstr(out, "fsdp-train: ");
  const char *e = l ? strchr(l, '\n') : NULL;
  if (!l) return out;
  snprintf(buf, n, "%.*s", e ? (int)(e - l) : (int)strlen(l), l);
  return buf;
}

/* Every rank but `except` exits by itself with status 1 within bound_s of
 * t0, and its output holds `want`. */
static void expect_failed_ranks(const char *what, int except, double t0, double bound_s,
                                const char *want) {
  int left = tu_world_wait_exits(&W, except, bound_s + 2.0); /* a little over, to measure */
  for (int r = 0; r < W.n; r++) {
    if (r == except) continue;
    char *out = tu_world_output(&W, r), line[2048];
    double secs = W.exit_s[r] - t0;
    if (W.pid[r]) {
      cr_log_error("%s: rank %d still running %.1f s later", what, r, bound_s + 2.0);
    } else {
      cr_log_info("%s: rank %d exited %s %d after %.3f s: %s", what, r,
                  WIFEXITED(W.status[r]) ? "with status" : "by signal",
                  WIFEXITED(W.status[r]) ? WEXITSTATUS(W.status[r]) : WTERMSIG(W.status[r]), secs,
                  error_line(out, line, sizeof line));
      cr_expect(WIFEXITED(W.status[r]) && WEXITSTATUS(W.status[r]) == 1,
                "%s: rank %d: exit status 1 expected (status 0x%x):\n%s", what, r, W.status[r], out);
      cr_expect_leq(secs, bound_s, "%s: rank %d exited after %.3f s, over the %.1f s bound:\n%s",
                    what, r, secs, bound_s, out);
      cr_expect(strstr(out, want), "%s: rank %d: \"%s\" missing in:\n%s", what, r, want, out);
    }
    free(out);
  }
  cr_assert_eq(left, 0, "%s: %d rank(s) hung", what, left);
}

/* The dead or stalled rank as the ring names a peer: "rank 1 (127.0.0.1:PORT)",
 * PORT being its address in the failing group (the shard group's listeners
 * are not the FSDP_ADDRS ones, so the port is left open). */
#define VICTIM_NAME "rank " STR(VICTIM) " (127.0.0.1:"

static void strike_during_a_step(const char *what, int sig) {
  start_world(NULL, NULL);
  wait_until_training();
  double t0 = tu_now_s();
  cr_assert_eq(kill(W.pid[VICTIM], sig), 0);
  expect_failed_ranks(what, VICTIM, t0, BOUND_S, VICTIM_NAME);
}

TestSuite(fault, .fini = teardown, .timeout = 90 * TU_SLOW);

Test(fault, a_killed_rank_is_named_by_every_other_rank) {
  strike_during_a_step("SIGKILL", SIGKILL);
}

Test(fault, a_stalled_rank_is_named_by_every_other_rank) {
  strike_during_a_step("SIGSTOP", SIGSTOP);
}

/* One rank with a model of 3 layers instead of 2: the ranks compare their
 * options at open (train_same_job) and every rank stops there, saying so,
 * before a collective could diverge (the ring's own check of diverged
 * collectives, behind it, is test_comm's); the bound is the usual one plus
 * 10 s for starting up. */
Test(fault, a_rank_given_another_model_stops_every_rank_at_open) {
  const char *rank_args[3] = {[VICTIM] = "--layers 3"};
  double t0 = tu_now_s();
  start_world(NULL, rank_args);
  expect_failed_ranks("divergent", -1, t0, 10.0 + BOUND_S, "not given the same job");
}

/* Ranks whose devices differ in memory (FSDP_DEVICE_MEMORY_BYTES, as fsdpd
 * sets it; a GPU's own under fsdp-launch): rank 1's 11.1 MiB holds the job's
 * plan without its checkpoint snapshot (10.6 MiB a rank) but not with it
 * (11.2), so it writes its shard in place (checkpoint_async 0, saying so)
 * while rank 0 snapshots, and both still run one job: their options compare
 * as the job gave them (train_same_job; before, both stopped at open as
 * "not given the same job"), and the checkpoint commits. */
Test(fault, ranks_with_devices_of_two_sizes_run_one_job) {
  static const char *const env[] = {"FSDP_COMM_TIMEOUT_MS=" STR(TIMEOUT_MS), NULL};
  const char *const rank_env[2] = {"FSDP_DEVICE_MEMORY_BYTES=1073741824",
                                   "FSDP_DEVICE_MEMORY_BYTES=11649024"};
  char *data = token_file(0), *ck = tu_path("ck-sizes"), args[2048];
  cr_assert_eq(mkdir(ck, 0755), 0, "%s", ck);
  snprintf(args, sizeof args, "--model tiny --steps 6 --warmup_steps 1 --batch 2 --seq_len 32 "
           "--threads 1 --strategy FULL_SHARD --mesh 2 --eval_every 0 --sample_tokens 0 "
           "--data %s --checkpoint_dir %s --checkpoint_every 5", data, ck);
  tu_world_start(&W, 2, "fsdp-train", args, env, rank_env, NULL);
  cr_assert_eq(tu_world_wait_exits(&W, -1, 60), 0, "the ranks still run after 60 s");
  for (int r = 0; r < 2; r++) {
    char *out = tu_world_output(&W, r);
    cr_expect(WIFEXITED(W.status[r]) && WEXITSTATUS(W.status[r]) == 0, "rank %d:\n%s", r, out);
    /* rank 1 drops its own silently (one voice per job: rank 0's) */
    if (r == 0)
      cr_expect(strstr(out, "writing it in the background") &&
                    !strstr(out, "no room for a checkpoint snapshot"),
                "rank 0 dropped its snapshot:\n%s", out);
    free(out);
  }
  char man[1024];
  snprintf(man, sizeof man, "%s/step-00000005/manifest.json", ck);
  cr_expect_eq(access(man, F_OK), 0, "step 5's checkpoint did not commit");
  free(data), free(ck);
}

/* One rank whose copy of the token file differs from the others' under the
 * same path, as on a node whose copy was re-tokenized or cut short: each
 * rank's shell opens its file as descriptor 5 and every rank reads
 * /proc/self/fd/5, so the options are alike and only the tokens differ. The
 * ranks compare their files' checksums at open (train_same_data) and every
 * rank stops there, naming the path, instead of each training on its own
 * text. */
Test(fault, a_rank_given_another_token_file_stops_every_rank_at_open) {
  char *a = token_file(0), *b = token_file(1), redir[3][4200];
  const char *rank_args[3];
  for (int r = 0; r < 3; r++) {
    snprintf(redir[r], sizeof redir[r], "5<%s", r == VICTIM ? b : a);
    rank_args[r] = redir[r];
  }
  double t0 = tu_now_s();
  start_world("/proc/self/fd/5", rank_args);
  expect_failed_ranks("token files", -1, t0, 10.0 + BOUND_S,
                      "the ranks' token files differ: 1 of 3");
  free(a), free(b);
}

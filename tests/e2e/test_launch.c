/* End-to-end tests of fsdp-launch, run as a program: what each rank is given
 * (rank, world, addresses, a bound listening socket), prefixed output, and
 * supervision: one failing rank, or a signal to the launcher, stops the
 * others within the grace period and nothing survives; and how fsdp-train's
 * ranks stop (the signals, a dead launcher, a checkpoint_dir in use). Every test is bounded
 * (Criterion timeouts; the ranks' sleeps are ended by the launcher). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

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

Test(launch, ranks_get_their_place_and_a_listening_socket, .timeout = 30 * TU_SLOW) {
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

/* The secret rank r was given, from its "[rank r] secret=..." line, in s (65). */
static int secret_of(const char *out, int r, char s[65]) {
  char key[48];
  snprintf(key, sizeof key, "[rank %d] secret=", r);
  const char *p = strstr(out, key);
  if (!p) return 0;
  p += strlen(key);
  size_t n = strspn(p, "0123456789abcdef");
  if (n != 64 || (p[n] != '\n' && p[n] != 0)) return 0;
  memcpy(s, p, 64);
  s[64] = 0;
  return 1;
}

/* Every rank of a run gets its ring secret (64 hex digits, the same for
 * all, which they prove to each other); the next run gets another. */
Test(launch, each_run_draws_one_ring_secret_for_its_ranks, .timeout = 30 * TU_SLOW) {
  char out[2][4096], s[2][3][65];
  for (int run = 0; run < 2; run++) {
    int rc = launch("-n 3 -- sh -c 'echo \"secret=$FSDP_RING_SECRET\"'", out[run], sizeof out[run],
                    NULL);
    cr_assert_eq(rc, 0, "%s", out[run]);
    for (int r = 0; r < 3; r++)
      cr_assert(secret_of(out[run], r, s[run][r]), "rank %d has no secret of 64 hex digits:\n%s", r,
                out[run]);
    cr_expect_str_eq(s[run][1], s[run][0]);
    cr_expect_str_eq(s[run][2], s[run][0]);
  }
  cr_expect_str_neq(s[0][0], s[1][0], "two runs drew the same secret");
}

Test(launch, a_failing_rank_stops_the_others, .timeout = 30 * TU_SLOW) {
  char out[16384];
  double secs;
  int rc = launch("-n 3 --grace 5 -- sh -c 'if [ \"$FSDP_RANK\" = 1 ]; then sleep 0.2; exit 3; fi; "
                  "sleep 31.4159 & wait'", out, sizeof out, &secs);
  cr_assert_eq(rc, 1, "%s", out);
  cr_assert(strstr(out, "rank 1 exited with status 3"), "%s", out);
  cr_assert_lt(secs, 5.0, "SIGTERM ends well-behaved ranks at once (%.2f s)", secs);
  cr_assert(!survivors("31", "4159"), "a rank's child survived the launcher");
}

/* Rank 1 fails only once rank 0 ignores SIGTERM (a file says so; rank 1
 * waits for it at most 10 s): failing at once, it could stop rank 0 before
 * its trap was set. */
Test(launch, a_rank_ignoring_sigterm_is_killed_after_the_grace, .timeout = 30 * TU_SLOW) {
  char out[16384], args[1024], *ready = tu_path("rank0-ignores-term");
  double secs;
  snprintf(args, sizeof args,
           "-n 2 --grace 1 -- sh -c 'if [ \"$FSDP_RANK\" = 1 ]; then "
           "for i in $(seq 200); do [ -e %s ] && break; sleep 0.05; done; exit 4; fi; "
           "trap \"\" TERM; touch %s; sleep 27.1828'", ready, ready);
  int rc = launch(args, out, sizeof out, &secs);
  free(ready);
  cr_assert_eq(rc, 1);
  cr_assert(strstr(out, "killing them") && strstr(out, "rank 0: killed by signal 9"), "%s", out);
  cr_assert(secs >= 1.0 && secs < 3.0, "killed after the 1 s grace, not before: %.2f s", secs);
  cr_assert(!survivors("27", "1828"));
}

Test(launch, bad_usage, .timeout = 10 * TU_SLOW) {
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

/* `fsdp-launch ... | head -1`: the reader of the launcher's output gone, it
 * once died of SIGPIPE (exit 141) and the ranks with it. Now it says so once
 * on stderr, drops their lines, and the ranks run to their end (each writes
 * a file after its last line); the launcher exits 0 with them. */
Test(launch, a_gone_reader_of_the_output_stops_only_the_forwarding, .timeout = 30 * TU_SLOW) {
  char *err = tu_path("launch.err"), *st = tu_path("launch.status"), *done = tu_path("done");
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "(%s/bin/fsdp-launch -n 2 -- sh -c 'echo first; sleep 0.5; seq 1 5000; "
           "echo rank $FSDP_RANK on >&2; touch %s.$FSDP_RANK' 2>%s; echo $? >%s) | head -1 "
           ">/dev/null", tu_root(), done, err, st);
  cr_assert_eq(system(cmd), 0);
  char *status = tu_slurp(st, NULL), *text = tu_slurp(err, NULL);
  cr_assert_str_eq(status, "0\n", "the launcher's exit status (141: SIGPIPE); stderr:\n%s", text);
  const char *say = "standard output has no reader any more";
  cr_assert(strstr(text, say) && !strstr(strstr(text, say) + 1, say), "said once:\n%s", text);
  cr_assert(strstr(text, "[rank 0] rank 0 on") && strstr(text, "[rank 1] rank 1 on"),
            "stderr still relayed:\n%s", text);
  for (int r = 0; r < 2; r++) {
    char path[4200];
    snprintf(path, sizeof path, "%s.%d", done, r);
    cr_assert_eq(access(path, F_OK), 0, "rank %d did not run to its end:\n%s", r, text);
  }
  free(status), free(text), free(err), free(st), free(done);
}

/* The launcher started the way a job's ranks are (testutil's world of one
 * process), so the test can signal it; .fini ends whatever is left. */
static tu_world_t W;

static void kill_world(void) { tu_world_kill(&W); }

Test(launch, a_signal_to_the_launcher_stops_every_rank, .timeout = 30 * TU_SLOW, .fini = kill_world) {
  tu_world_start(&W, 1, "fsdp-launch", "-n 2 -- sh -c 'echo up; sleep 16.1803 & wait'", NULL, NULL,
                 NULL);
  cr_assert_eq(tu_world_wait_lines(&W, 0, "[rank ", 2, 10), 0, "the ranks did not start:\n%s",
               tu_world_output(&W, 0));
  const double t0 = tu_now_s();
  cr_assert_eq(kill(W.pid[0], SIGTERM), 0);
  int left = tu_world_wait_exits(&W, -1, 10);
  char *out = tu_world_output(&W, 0);
  cr_assert_eq(left, 0, "the launcher still runs 10 s after SIGTERM:\n%s", out);
  cr_expect(WIFEXITED(W.status[0]) && WEXITSTATUS(W.status[0]) == 1,
            "a stopped job is a failure: status 0x%x\n%s", W.status[0], out);
  cr_expect(strstr(out, "got Terminated") && strstr(out, "rank 0: killed by signal 15") &&
            strstr(out, "rank 1: killed by signal 15"), "%s", out);
  cr_expect_lt(W.exit_s[0] - t0, 5.0, "SIGTERM ends the ranks at once, not after the grace");
  cr_expect(!survivors("16", "1803"), "a rank's child survived the launcher");
  free(out);
}

/* fsdp-train's ranks under fsdp-launch: a tiny model training for ever into
 * checkpoint_dir ck, made here (periodic checkpoints never come); seed marks
 * them for pgrep. From "--model" on: fsdp-train's own arguments. */
static void train_args(char *args, size_t len, const char *data, const char *ck,
                       const char *seed) {
  cr_assert_eq(mkdir(ck, 0755), 0);
  snprintf(args, len, "-n 2 -- %s/bin/fsdp-train --model tiny --steps 1000000 "
           "--warmup_steps 1 --batch 2 --seq_len 32 --eval_fraction 0 --data %s --seed %s "
           "--checkpoint_dir %s --checkpoint_every 1000000", tu_root(), data, seed, ck);
}

/* Starts bin/program args as the world W, every step printed
 * (FSDP_PROGRESS_EVERY 1: under fsdp-launch, lines to its pipe) and env1
 * (or NULL) besides. */
static void start_printing(const char *program, const char *args, const char *env1) {
  const char *env[] = {"FSDP_PROGRESS_EVERY=1", env1, NULL};
  tu_world_start(&W, 1, program, args, env, NULL, NULL);
}

/* Committed checkpoints (manifests) in ck. */
static int committed(const char *ck) {
  char cmd[1024], out[4096];
  snprintf(cmd, sizeof cmd, "ls %s/step-*/manifest.json 2>/dev/null | wc -l", ck);
  tu_sh(cmd, out, sizeof out);
  return atoi(out);
}

/* A launcher killed outright (SIGKILL: no chance to stop its ranks) leaves
 * no rank training on, holding its cores: each fsdp-train asked the kernel
 * for SIGTERM when its parent dies (FSDP_SUPERVISOR_PID, set by the
 * launcher) and stops at its next step boundary, with a committed
 * checkpoint of that step. Their output is the dead launcher's pipe: a
 * line printed there (the progress, the checkpoint's) must not kill them
 * (SIGPIPE) before the checkpoint commits. */
Test(launch, a_launcher_killed_outright_leaves_no_rank_training, .timeout = 60 * TU_SLOW,
     .fini = kill_world) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *ck = tu_path("ck"), args[2048];
  train_args(args, sizeof args, data, ck, "7531598");
  start_printing("fsdp-launch", args, NULL);
  cr_assert_eq(tu_world_wait_lines(&W, 0, "[rank 0] train: model", 1, 20), 0, "no start:\n%s",
               tu_world_output(&W, 0));
  nanosleep(&(struct timespec){1, 0}, NULL); /* training */
  cr_assert_eq(system("pgrep -f 'seed 753159[8]' >/dev/null"), 0, "the ranks are not running");
  cr_assert_eq(kill(W.pid[0], SIGKILL), 0);
  tu_world_wait_exits(&W, -1, 5);
  int alive = 1;
  for (double until = tu_now_s() + 10; alive && tu_now_s() < until;) {
    alive = system("pgrep -f 'seed 753159[8]' >/dev/null") == 0;
    if (alive) nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  if (alive) (void)system("pkill -9 -f 'seed 753159[8]'");
  cr_expect(!alive, "ranks still trained 10 s after their launcher was killed");
  cr_expect_eq(committed(ck), 1, "the ranks' stop checkpoint was not committed (a rank died "
               "writing to its dead launcher's pipe?)");
  free(data), free(ck);
}

/* SIGHUP (a closed terminal or ssh session) stops the job as SIGTERM does:
 * every rank stops after the same step with a committed checkpoint of it,
 * and the launcher says so with their status, 75, which a retry loop reads
 * as "run it again to go on" (not 1, a crash). */
Test(launch, a_hangup_stops_the_job_with_a_checkpoint, .timeout = 60 * TU_SLOW,
     .fini = kill_world) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *ck = tu_path("ck"), args[2048];
  train_args(args, sizeof args, data, ck, "7531599");
  start_printing("fsdp-launch", args, NULL);
  cr_assert_eq(tu_world_wait_lines(&W, 0, "[rank 0] step ", 2, 20 * TU_SLOW), 0, "no steps:\n%s",
               tu_world_output(&W, 0));
  cr_assert_eq(kill(W.pid[0], SIGHUP), 0);
  int left = tu_world_wait_exits(&W, -1, 20 * TU_SLOW);
  char *out = tu_world_output(&W, 0);
  if (left) (void)system("pkill -9 -f 'seed 753159[9]'");
  cr_assert_eq(left, 0, "the launcher still runs 20 s after SIGHUP:\n%s", out);
  cr_expect(WIFEXITED(W.status[0]) && WEXITSTATUS(W.status[0]) == 75,
            "every rank stopped when asked: status 0x%x\n%s", W.status[0], out);
  cr_expect(strstr(out, "got Hangup"), "%s", out);
  cr_expect_eq(committed(ck), 1, "%s", out);
  free(out), free(data), free(ck);
}

/* Ranks that refuse their options exit 2, and so does the launcher: running
 * the same command again changes nothing, unlike a crash (1). */
Test(launch, ranks_refusing_their_options_exit_2, .timeout = 30 * TU_SLOW) {
  char out[16384], args[1024];
  snprintf(args, sizeof args, "-n 2 -- %s/bin/fsdp-train --model no-such-model", tu_root());
  cr_assert_eq(launch(args, out, sizeof out, NULL), 2, "%s", out);
  cr_assert(strstr(out, "no-such-model"), "%s", out);
}

/* The ranks refuse, before training, a save that would replace the token
 * file they train on (the same file by another name here), and one at a
 * FIFO; the files stay as they were. (Every rank checks, but the first to
 * refuse stops the launch: the other may be stopped before it says so.) */
Test(launch, ranks_refuse_a_save_over_their_data_or_a_fifo, .timeout = 30 * TU_SLOW) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *fifo = tu_path("w.fifo");
  char out[65536], args[4096];
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  size_t n0, n1;
  char *before = tu_slurp(data, &n0);
  snprintf(args, sizeof args, "-n 2 -- %s/bin/fsdp-train --model tiny --steps 1 --seq_len 32 "
           "--data %s --save %s/./tok.bin", tu_root(), data, tu_tmpdir());
  cr_assert_eq(launch(args, out, sizeof out, NULL), 1, "%s", out);
  cr_expect(strstr(out, "is the data file") && !strstr(out, "step "), "%s", out);
  char *after = tu_slurp(data, &n1);
  cr_expect(n0 == n1 && !memcmp(before, after, n0), "the token file was replaced");
  snprintf(args, sizeof args, "-n 2 -- %s/bin/fsdp-train --model tiny --steps 1 --seq_len 32 "
           "--data %s --save %s", tu_root(), data, fifo);
  cr_assert_eq(launch(args, out, sizeof out, NULL), 1, "%s", out);
  cr_expect(strstr(out, "is a FIFO, not a file") && !strstr(out, "step "), "%s", out);
  struct stat st;
  cr_expect(!stat(fifo, &st) && S_ISFIFO(st.st_mode), "the FIFO was replaced");
  free(before), free(after), free(data), free(fifo);
}

/* One run per checkpoint_dir: a second run into a directory another run
 * writes would commit steps over its checkpoints (a shard renamed over one
 * the other's manifest vouches for). The second is refused at start, every
 * rank, naming the directory and the run that holds it (rank 0 of the
 * first, a world of one here); the first trains on. */
Test(launch, a_second_run_into_a_checkpoint_dir_in_use_is_refused, .timeout = 60 * TU_SLOW,
     .fini = kill_world) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *ck = tu_path("ck"), args[2048];
  char out[65536], pid[32];
  train_args(args, sizeof args, data, ck, "7531600");
  tu_world_start(&W, 1, "fsdp-train", strstr(args, "--model"), NULL, NULL, NULL);
  cr_assert_eq(tu_world_wait_lines(&W, 0, "train: model", 1, 20 * TU_SLOW), 0, "no start:\n%s",
               tu_world_output(&W, 0));
  cr_assert_eq(launch(args, out, sizeof out, NULL), 1, "%s", out);
  snprintf(pid, sizeof pid, "pid %d on ", W.pid[0]);
  cr_expect(strstr(out, ck) && strstr(out, "in use by another run") && strstr(out, pid),
            "%s", out);
  cr_expect(strstr(out, "[rank 1] fsdp-train: checkpoint_dir: rank 0 could not lock"), "%s", out);
  cr_expect_eq(tu_world_wait_exits(&W, -1, 0.5), 1, "the first run stopped");
  cr_assert_eq(kill(W.pid[0], SIGTERM), 0);
  cr_expect_eq(tu_world_wait_exits(&W, -1, 20 * TU_SLOW), 0);
  cr_expect(WIFEXITED(W.status[0]) && WEXITSTATUS(W.status[0]) == 75, "0x%x", W.status[0]);
  free(data), free(ck);
}

/* Under an owner of commits (fsdpd: a report channel) rank 0 waits for a
 * held checkpoint_dir lock (the job's previous attempt may still be
 * ending), saying so, and every rank waits with it, one collective a look:
 * a lock held three times the communicator's timeout does not time the
 * other rank out (it did when the wait was one collective). The report
 * channel here is /dev/null, fd 5, which fsdp-launch passes on. */
Test(launch, under_fsdpd_a_held_checkpoint_dir_is_waited_for_past_the_comm_timeout,
     .timeout = 90 * TU_SLOW) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *ck = tu_path("ck"), cmd[4096];
  char out[65536];
  cr_assert_eq(mkdir(ck, 0755), 0);
  const int timeout_ms = 1500 * TU_SLOW;
  snprintf(cmd, sizeof cmd,
           "{ touch '%s/.fsdp-train.lock' && { flock '%s/.fsdp-train.lock' sleep %.1f & } && "
           "sleep 0.5 && t0=$(date +%%s.%%N) && FSDP_REPORT_FD=5 FSDP_COMM_TIMEOUT_MS=%d "
           "%s/bin/fsdp-launch -n 2 -- "
           "%s/bin/fsdp-train --model tiny --steps 2 --warmup_steps 1 --batch 2 --seq_len 32 "
           "--eval_fraction 0 --data %s --checkpoint_dir %s 5>/dev/null; echo launch=$?; "
           "echo \"secs=$(echo \"$t0 $(date +%%s.%%N)\" | awk '{print $2 - $1}')\"; wait; }",
           ck, ck, 2.5 * timeout_ms / 1000, timeout_ms, tu_root(), tu_root(), data, ck);
  tu_sh(cmd, out, sizeof out);
  const char *at = strstr(out, "secs="); /* fsdp-launch's own time, not the holder's */
  const double secs = at ? atof(at + 5) : 0;
  cr_expect(strstr(out, "launch=0"), "%s", out);
  cr_expect(strstr(out, "[rank 0]") && strstr(out, "is in use by another run") &&
            strstr(out, "waiting up to 30 s"), "%s", out);
  /* the lock was held 2.5 timeouts from 0.5 s before the launch */
  cr_expect_geq(secs, 2.5 * timeout_ms / 1000 - 0.6, "it did not wait for the lock:\n%s", out);
  free(data), free(ck);
}

/* A stopped run's ranks agree on what their stop line says once every
 * rank's last shard is written: a shard write slower than the
 * communicator's timeout (rank 1's fsync held three times it, by the fs
 * shim) is waited for, and both lines say the checkpoint is committed (with
 * the op timeout, "whether its checkpoint was committed is not known"). */
Test(launch, a_stop_whose_last_shard_is_slower_than_the_comm_timeout_is_agreed_on,
     .timeout = 90 * TU_SLOW) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *ck = tu_path("ck"), *log = tu_path("log");
  char cmd[8192];
  static char out[1 << 17];
  cr_assert_eq(mkdir(ck, 0755), 0);
  const int timeout_ms = 1000 * TU_SLOW;
  snprintf(cmd, sizeof cmd,
           "{ FSDP_PROGRESS_EVERY=1000 LD_PRELOAD='%s' SLOW_FSYNC_MATCH=shard-00001 SLOW_FSYNC_MS=%d "
           "FSDP_COMM_TIMEOUT_MS=%d "
           "%s/bin/fsdp-launch -n 2 --grace %d -- %s/bin/fsdp-train --model tiny --steps 100000 "
           "--warmup_steps 1 --batch 2 --seq_len 32 --eval_fraction 0 --data %s "
           "--checkpoint_dir %s --checkpoint_async 0 > '%s' 2>&1 & p=$!; i=0; "
           "until grep -q 'train: model' '%s' || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; "
           "sleep 1; kill -TERM $p; wait $p; echo launch=$?; tail -n 60 '%s'; }",
           tu_fs_shim(), 3 * timeout_ms, timeout_ms, tu_root(), 6 * timeout_ms / 1000, tu_root(),
           data, ck, log, log, log);
  tu_sh(cmd, out, sizeof out);
  cr_expect(strstr(out, "launch=75"), "%s", out);
  for (int r = 0; r < 2; r++) {
    char want[64];
    snprintf(want, sizeof want, "[rank %d] fsdp-train: stopped after step ", r);
    const char *line = strstr(out, want), *eol = line ? strchr(line, '\n') : NULL;
    cr_expect(line && eol && strstr(line, "its checkpoint is committed") &&
              strstr(line, "its checkpoint is committed") < eol, "rank %d:\n%s", r, out);
  }
  cr_expect_eq(committed(ck), 1, "%s", out);
  free(data), free(ck), free(log);
}

/* A checkpoint_dir on a file system that takes no lock (the fs shim fails
 * flock with ENOLCK, as NFS without its lock daemon or Lustre mounted
 * noflock) is no reason to refuse the run: it trains and checkpoints as
 * before the lock, and says nothing keeps a second run out (found by
 * helper-109: every rank refused to start there). */
Test(launch, a_checkpoint_dir_that_takes_no_lock_is_used_with_a_warning, .timeout = 60 * TU_SLOW) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *ck = tu_path("ck"), args[2048];
  char out[65536];
  cr_assert_eq(mkdir(ck, 0755), 0);
  snprintf(args, sizeof args, "-n 2 -- %s/bin/fsdp-train --model tiny --steps 2 --warmup_steps 1 "
           "--batch 2 --seq_len 32 --eval_fraction 0 --data %s --checkpoint_dir %s "
           "--checkpoint_every 2", tu_root(), data, ck);
  setenv("LD_PRELOAD", tu_fs_shim(), 1);
  setenv("FS_NO_FLOCK", "1", 1);
  const int rc = launch(args, out, sizeof out, NULL);
  unsetenv("LD_PRELOAD");
  unsetenv("FS_NO_FLOCK");
  cr_expect_eq(rc, 0, "%s", out);
  cr_expect(strstr(out, "takes no lock") && strstr(out, "second run"), "%s", out);
  cr_expect_eq(committed(ck), 1, "%s", out);
  free(data), free(ck);
}

/* fsdp-train run by hand stops on Ctrl-C (SIGINT) or a closed terminal
 * (SIGHUP) as on SIGTERM: at a step boundary, with a committed checkpoint
 * of that step, exit 75; not at once, with a temporary shard left behind. */
Test(launch, fsdp_train_alone_stops_with_a_checkpoint_on_sigint_and_sighup,
     .timeout = 60 * TU_SLOW, .fini = kill_world) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), args[2048];
  const int sigs[2] = {SIGINT, SIGHUP};
  for (int i = 0; i < 2; i++) {
    char name[16], *ck;
    snprintf(name, sizeof name, "ck%d", i);
    train_args(args, sizeof args, data, ck = tu_path(name), "7531601");
    start_printing("fsdp-train", strstr(args, "--model"), NULL);
    cr_assert_eq(tu_world_wait_lines(&W, 0, "step ", 2, 20 * TU_SLOW), 0, "no steps:\n%s",
                 tu_world_output(&W, 0));
    cr_assert_eq(kill(W.pid[0], sigs[i]), 0);
    cr_assert_eq(tu_world_wait_exits(&W, -1, 20 * TU_SLOW), 0, "still running after %s",
                 strsignal(sigs[i]));
    char *out = tu_world_output(&W, 0);
    cr_expect(WIFEXITED(W.status[0]) && WEXITSTATUS(W.status[0]) == 75, "%s: status 0x%x\n%s",
              strsignal(sigs[i]), W.status[0], out);
    cr_expect_eq(committed(ck), 1, "%s:\n%s", strsignal(sigs[i]), out);
    free(out), free(ck);
  }
  free(data);
}

/* A checkpoint_dir that takes no files is refused before training, as an
 * unwritable `save` path is: not a run that trains to its end failing
 * every checkpoint and exits 0. Read-only for root too: a read-only mount
 * (skipped where the test may not mount). */
Test(launch, an_unwritable_checkpoint_dir_is_refused_at_start, .timeout = 60 * TU_SLOW) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *ro = tu_path("ro"), cmd[2048];
  char out[65536];
  cr_assert_eq(mkdir(ro, 0755), 0);
  int mounted = 0;
  if (geteuid() == 0) {
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=1m,ro tmpfs %s 2>/dev/null", ro);
    if (system(cmd)) cr_skip_test("cannot mount a read-only tmpfs here");
    mounted = 1;
  } else {
    cr_assert_eq(chmod(ro, 0555), 0);
  }
  snprintf(cmd, sizeof cmd, "--model tiny --steps 2 --seq_len 32 --data %s --checkpoint_dir %s "
           "--checkpoint_every 1", data, ro);
  const int rc = tu_run_bin("fsdp-train", cmd, out, sizeof out);
  if (mounted) {
    snprintf(cmd, sizeof cmd, "umount %s", ro);
    cr_expect_eq(system(cmd), 0);
  }
  cr_expect_eq(rc, 1, "%s", out);
  cr_expect(strstr(out, "checkpoint_dir: cannot create files in") &&
            strstr(out, "before training") && !strstr(out, "step "), "%s", out);
  free(data), free(ro);
}

/* A stop whose checkpoint cannot be written (a full disk: the fs shim
 * fails the shard's writes) still exits 75, which requeues the job, but its
 * last line does not claim a checkpoint: it says none was committed and
 * where a resume goes on from (here: nothing committed, step 0). */
Test(launch, a_stop_whose_checkpoint_failed_says_where_a_resume_goes_on_from,
     .timeout = 60 * TU_SLOW, .fini = kill_world) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *ck = tu_path("ck"), args[2048];
  char preload[1024];
  train_args(args, sizeof args, data, ck, "7531602");
  snprintf(preload, sizeof preload, "LD_PRELOAD=%s", tu_fs_shim());
  setenv("ENOSPC_MATCH", "/.shard-00000", 1); /* only the shim reads it */
  start_printing("fsdp-train", strstr(args, "--model"), preload);
  cr_assert_eq(tu_world_wait_lines(&W, 0, "step ", 2, 20 * TU_SLOW), 0, "no steps:\n%s",
               tu_world_output(&W, 0));
  cr_assert_eq(kill(W.pid[0], SIGTERM), 0);
  cr_assert_eq(tu_world_wait_exits(&W, -1, 20 * TU_SLOW), 0, "still running after SIGTERM");
  char *out = tu_world_output(&W, 0);
  cr_expect(WIFEXITED(W.status[0]) && WEXITSTATUS(W.status[0]) == 75, "status 0x%x\n%s",
            W.status[0], out);
  cr_expect_eq(committed(ck), 0, "%s", out);
  cr_expect(strstr(out, "its checkpoint was NOT committed: 1 rank(s) could not write") &&
            strstr(out, "a resume starts over from step 0") &&
            !strstr(out, "checkpoint is written") && !strstr(out, "checkpoint is committed"),
            "%s", out);
  free(out), free(data), free(ck);
}

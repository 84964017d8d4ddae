/* Tests of deploy/slurm/fsdp.sbatch under a real Slurm on this machine:
 * munged, slurmctld and two slurmd started by the test (nodes n1 and n2 on
 * this host, each slurmd with -N, its own port and spool; their own
 * directories, ../shared/TOOLCHAIN.md's recipe), the batch script run with
 * sbatch as a user runs it.
 *   - the batch job's exit code is the training job's outcome: 0 when it
 *     succeeds, 1 when it fails (ranks that cannot load init_from), 2 when
 *     the coordinator refuses it;
 *   - `scontrol requeue` of a running job: its ranks checkpoint at the next
 *     step boundary, the allocation is requeued and runs again (Restarts=1),
 *     resumes from that checkpoint, and ends with the final step's shard
 *     files byte-identical to an uninterrupted run's;
 *   - the script takes whole nodes, one fsdpd each, and asks for no GPU: its
 *     job waits for a node another job holds a CPU of, rather than share it;
 *   - the coordinator needs tokens the script made for the allocation;
 *   - on two nodes, a 2-rank job runs a rank on each (each fsdpd registered
 *     under its Slurm node name) and ends with a one-machine run's shards;
 *   - `scancel` of a running job ends its allocation without a requeue and
 *     cancels the training job; fsdpd is registered at its node's NodeAddr
 *     (where fsdpctl logs reaches it), not at a Slurm node name;
 *   - fsdpd that cannot start fails the allocation at once; fsdpd or the
 *     coordinator killed mid-run requeues it and the job goes on in the
 *     next, also one node's fsdpd of two (srun runs on without it); a
 *     coordinator that exits at its start ends it at once, exit 2;
 *   - nothing the script started is left running, between two allocations
 *     of a requeue or afterwards (its watch was), no watch line comes twice,
 *     and fsdpd leaves before the coordinator stops;
 *   - nothing is left running afterwards.
 * Slurm's daemons run as root here: as another user the tests skip, saying so. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/e2e/cluster.h"
#include "tests/unit/testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation"

static char dir[600], conf[700], env[2048], root[4096];
static int fsdp_port; /* the coordinator's, FSDP_PORT */
static pid_t daemons[4]; /* slurmctld, slurmd of n1 and of n2, munged */

static pid_t pid_of(const char *file) {
  FILE *f = fopen(file, "r");
  int pid = 0;
  if (f && fscanf(f, "%d", &pid) != 1) pid = 0;
  if (f) fclose(f);
  return pid;
}

/* A port free now on 127.0.0.1. */
static int free_port(void) {
  char addr[64];
  int fd = tu_listen_loopback(addr, sizeof addr);
  close(fd);
  return atoi(strrchr(addr, ':') + 1);
}

static void run_ok(const char *cmd) {
  char out[8192];
  int rc = tu_sh(cmd, out, sizeof out);
  cr_assert_eq(rc, 0, "%s: exit %d:\n%s", cmd, rc, out);
}

static void setup(void) {
  if (geteuid() != 0) return;
  cr_assert_not_null(realpath(tu_root(), root)); /* the batch job runs elsewhere */
  snprintf(dir, sizeof dir, "%s/slurm", tu_tmpdir());
  chmod(tu_tmpdir(), 0755);
  char cmd[4096], host[256];
  gethostname(host, sizeof host);
  snprintf(cmd, sizeof cmd,
           "set -e; d='%s'; mkdir -p $d/munge $d/spool $d/state $d/log; chmod 755 $d $d/munge; "
           "chown munge:munge $d/munge; dd if=/dev/urandom of=$d/munge.key bs=1024 count=1 2>/dev/null; "
           "chown munge:munge $d/munge.key; chmod 400 $d/munge.key; "
           "runuser -u munge -- munged --key-file=$d/munge.key --socket=$d/munge/munge.socket "
           "--pid-file=$d/munge/munged.pid --log-file=$d/munge/munged.log --seed-file=$d/munge/seed",
           dir);
  run_ok(cmd);
  snprintf(conf, sizeof conf, "%s/slurm.conf", dir);
  char text[4096];
  snprintf(text, sizeof text,
           "ClusterName=fsdptest\nSlurmctldHost=%s(127.0.0.1)\nSlurmctldPort=%d\n"
           "SlurmUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
           "AuthInfo=socket=%s/munge/munge.socket,cred_expire=10\nProctrackType=proctrack/linuxproc\n"
           "TaskPlugin=task/none\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
           "StateSaveLocation=%s/state\nSlurmdSpoolDir=%s/spool-%%n\nSlurmctldPidFile=%s/slurmctld.pid\n"
           "SlurmdPidFile=%s/slurmd-%%n.pid\nSlurmctldLogFile=%s/log/slurmctld.log\n"
           "SlurmdLogFile=%s/log/slurmd-%%n.log\nAccountingStorageType=accounting_storage/none\n"
           "JobAcctGatherType=jobacct_gather/none\nKillWait=30\nReturnToService=2\n"
           "SchedulerParameters=sched_interval=1,bf_interval=1\n"
           "NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=%s Port=%d CPUs=%ld State=UNKNOWN\n"
           "NodeName=n2 NodeAddr=127.0.0.1 NodeHostname=%s Port=%d CPUs=%ld State=UNKNOWN\n"
           "PartitionName=main Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP\n",
           host, free_port(), dir, dir, dir, dir, dir, dir, dir, host, free_port(),
           sysconf(_SC_NPROCESSORS_ONLN), host, free_port(), sysconf(_SC_NPROCESSORS_ONLN));
  tu_write_file(conf, text, strlen(text));
  setenv("SLURM_CONF", conf, 1);
  /* two Slurm nodes on this one host, each its own slurmd (-N), port and spool */
  snprintf(cmd, sizeof cmd, "slurmctld -f '%s' && slurmd -N n1 -f '%s' && slurmd -N n2 -f '%s'",
           conf, conf, conf);
  run_ok(cmd);
  char out[4096];
  const double t0 = tu_now_s();
  while (tu_sh("sinfo -h -N -o %t", out, sizeof out), strcmp(out, "idle\nidle\n")) {
    cr_assert_lt(tu_now_s() - t0, 30, "the Slurm nodes are not idle: %s", out);
    nanosleep(&(struct timespec){0, 200000000}, NULL);
  }
  const char *pidfiles[4] = {"slurmctld.pid", "slurmd-n1.pid", "slurmd-n2.pid", "munge/munged.pid"};
  for (int i = 0; i < 4; i++) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", dir, pidfiles[i]);
    daemons[i] = pid_of(p);
    cr_assert_gt(daemons[i], 0, "no pid in %s", p);
  }
  /* what the batch script needs, as a user would export it */
  fsdp_port = free_port();
  snprintf(env, sizeof env, "FSDP_BIN='%s/bin' FSDP_ROOT='%s' FSDP_PORT=%d FSDP_COORD_HOST=127.0.0.1 "
           "FSDP_DEVICES=cpu:2 FSDP_GRACE=20 "
           /* expanded on the node, as a per-node --rank-host would be */
           "FSDPD_ARGS='--run-as nobody --rank-host $(echo 127.0.0.1)'", root, tu_tmpdir(),
           fsdp_port);
}

static void teardown(void) {
  if (geteuid() != 0 || !conf[0]) return;
  char out[4096];
  tu_sh("scancel --full -s KILL --user=root; scontrol shutdown", out, sizeof out);
  /* nothing of the jobs is left: no process runs in the test's directory */
  cr_expect_geq(cluster_wait_gone(tu_tmpdir(), 10), 0, "processes of the jobs outlived the test");
  /* the daemons end: slurmctld and the slurmds by the shutdown, munged by SIGTERM */
  const double t0 = tu_now_s();
  while ((kill(daemons[0], 0) == 0 || kill(daemons[1], 0) == 0 || kill(daemons[2], 0) == 0) &&
         tu_now_s() - t0 < 15)
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  kill(daemons[3], SIGTERM);
  while (kill(daemons[3], 0) == 0 && tu_now_s() - t0 < 20)
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  for (int i = 0; i < 4; i++) {
    cr_expect_neq(kill(daemons[i], 0), 0, "daemon %d (pid %d) outlived the test", i, daemons[i]);
    if (kill(daemons[i], 0) == 0) kill(daemons[i], SIGKILL);
  }
}

TestSuite(slurm, .init = setup, .fini = teardown, .timeout = 240 * TU_SLOW);

#define SKIP_UNLESS_ROOT()                                                               \
  if (geteuid() != 0) cr_skip_test("Slurm's daemons need root on this machine; skipped")

/* A job file of the tiny model; more lines in extra. */
static char *job_file(const char *name, const char *extra) {
  char *data = tu_path("tok.bin");
  if (access(data, F_OK)) free(tu_token_file("tok.bin", 40000, 9, 256));
  chmod(data, 0644);
  char text[2048];
  snprintf(text, sizeof text, "[model]\nmodel = tiny\n[data]\ndata = %s\n[train]\nbatch = 2\n"
           "seq_len = 32\neval_every = 0\n%s", data, extra);
  free(data);
  char *p = tu_path(name);
  tu_write_file(p, text, strlen(text));
  return p;
}

/* sbatch --wait of the script on conf with state in its own directory; the
 * batch job's exit code. */
static int sbatch_wait_env(const char *jobconf, const char *state, const char *more, char *out,
                           size_t len) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd '%s' && env %s %s FSDP_STATE='%s/%s' timeout %d sbatch --wait -o "
           "'%s/%s.out' '%s/deploy/slurm/fsdp.sbatch' '%s' --ranks 2", tu_tmpdir(), env, more,
           tu_tmpdir(), state, 200 * TU_SLOW, tu_tmpdir(), state, root, jobconf);
  return tu_sh(cmd, out, len);
}
static int sbatch_wait(const char *jobconf, const char *state, char *out, size_t len) {
  return sbatch_wait_env(jobconf, state, "", out, len);
}

/* The batch job's output (STATE.out) holds what, or (want 0) does not. */
static void sbatch_out_says(const char *state, const char *what, int want) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s.out", tu_tmpdir(), state);
  char *text = tu_slurp(path, NULL);
  cr_assert_not_null(text, "%s", path);
  cr_expect_eq(strstr(text, what) != NULL, want, "%s %s \"%s\":\n%s", path,
               want ? "does not say" : "says", what, text);
  free(text);
}

/* The processes the batch script of state started, and theirs: those whose
 * environment holds its FSDP_STATE (sbatch and srun pass it on to each),
 * Slurm's own slurmstepd aside; first: only the first allocation's (no
 * SLURM_RESTART_COUNT past 0). "PID COMM" lines into out, how many. */
static int procs_of_run(const char *state, int first, char *out, size_t len) {
  char want[1200];
  const int wl = snprintf(want, sizeof want, "FSDP_STATE=%s/%s", tu_tmpdir(), state) + 1; /* its NUL too */
  static char env[1 << 18];
  DIR *d = opendir("/proc");
  cr_assert_not_null(d);
  struct dirent *e;
  int n = 0;
  size_t o = 0;
  out[0] = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    const size_t k = fread(env, 1, sizeof env, f);
    fclose(f);
    int found = 0, later = 0;
    for (size_t i = 0; i < k; i += strnlen(env + i, k - i) + 1) {
      found |= i + (size_t)wl <= k && !memcmp(env + i, want, (size_t)wl);
      later |= !strncmp(env + i, "SLURM_RESTART_COUNT=", 20) && atoi(env + i + 20) > 0;
    }
    if (!found || (first && later)) continue;
    snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
    if ((f = fopen(path, "r"))) {
      if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
      fclose(f);
    }
    comm[strcspn(comm, "\n")] = 0;
    if (!strcmp(comm, "slurmstepd")) continue;
    n++;
    if (o < len) o += (size_t)snprintf(out + o, len - o, "%s %s\n", e->d_name, comm);
  }
  closedir(d);
  return n;
}
static int procs_of(const char *state, char *out, size_t len) { return procs_of_run(state, 0, out, len); }

/* None of those (first: of the first allocation) is left within limit_s
 * (they may be on their way out). */
static void none_left_of_run(const char *state, int first, double limit_s, const char *when) {
  char out[4096];
  const double t0 = tu_now_s();
  while (procs_of_run(state, first, out, sizeof out) && tu_now_s() - t0 < limit_s)
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  cr_expect_eq(procs_of_run(state, first, out, sizeof out), 0, "%s, processes the batch script "
               "started still run:\n%s", when, out);
}
static void none_left_of(const char *state, double limit_s, const char *when) {
  none_left_of_run(state, 0, limit_s, when);
}

/* The pid of the one process named comm among those of state (0: none). */
static pid_t proc_of(const char *state, const char *comm) {
  char out[4096], *save;
  procs_of(state, out, sizeof out);
  for (char *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
    if (!strcmp(strchr(l, ' ') + 1, comm)) return atoi(l);
  return 0;
}

/* STATE.out shows no watch line of a step's report twice (a watch left
 * running from an allocation before printed each one again; a state's line,
 * "loss -", may come again at a new attempt) and no watch giving up. */
static void no_watch_twice(const char *state) {
  char cmd[1400], out[4096];
  snprintf(cmd, sizeof cmd, "grep '^j-1 ' '%s/%s.out' | grep -v ' loss - ' | sort | uniq -d | head -5", tu_tmpdir(), state);
  tu_sh(cmd, out, sizeof out);
  cr_expect_eq(out[0], 0, "%s.out has watch lines twice:\n%s", state, out);
  sbatch_out_says(state, "stayed unreachable", 0);
}

/* The batch job id's squeue lines are gone within limit_s; else it is
 * cancelled (SIGKILL) and the test fails. */
static void gone_within(int id, double limit_s, const char *state) {
  char cmd[256], out[4096];
  snprintf(cmd, sizeof cmd, "squeue -h -j %d -o '%%T %%r'", id);
  const double t0 = tu_now_s();
  while (tu_sh(cmd, out, sizeof out), out[0] && tu_now_s() - t0 < limit_s)
    nanosleep(&(struct timespec){0, 500000000}, NULL);
  if (!out[0]) return;
  char path[1200];
  snprintf(path, sizeof path, "%s/%s.out", tu_tmpdir(), state);
  char *said = tu_slurp(path, NULL);
  snprintf(cmd, sizeof cmd, "scancel --full -s KILL %d; scancel %d", id, id);
  char o2[1024];
  tu_sh(cmd, o2, sizeof o2);
  cr_assert_fail("batch job %d is still %s after %.0f s; its output:\n%s", id, out, limit_s,
                 said ? said : "(none)");
}

Test(slurm, the_batch_jobs_exit_code_is_the_training_jobs_outcome) {
  SKIP_UNLESS_ROOT();
  char out[1 << 14];
  char *ok = job_file("ok.conf", "steps = 50\n");
  cr_assert_eq(sbatch_wait(ok, "ok", out, sizeof out), 0, "a succeeding job:\n%s", out);
  /* the coordinator listened beyond loopback with tokens of the allocation's
   * own, in a directory only the job's user reads */
  char path[1200];
  struct stat sb;
  snprintf(path, sizeof path, "%s/ok/tokens", tu_tmpdir());
  cr_assert_eq(stat(path, &sb), 0, "%s: no tokens were made", path);
  cr_expect_eq(sb.st_mode & 0777, 0700, "%s: mode %o", path, sb.st_mode & 0777);
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/ok/tokens/%s.token", tu_tmpdir(), i ? "node" : "user");
    char *t = tu_slurp(path, NULL);
    cr_assert_not_null(t, "%s", path);
    cr_expect_eq(strlen(t), 64, "%s: %s", path, t);
    cr_expect_eq(strspn(t, "0123456789abcdef"), 64, "%s: %s", path, t);
    free(t);
  }
  snprintf(path, sizeof path, "%s/ok/coordinator.log", tu_tmpdir());
  char *log = tu_slurp(path, NULL);
  cr_assert_not_null(log, "%s", path);
  cr_expect(!strstr(log, "no tokens"), "the coordinator ran open to anyone:\n%s", log);
  free(log);
  /* ranks that fail: init_from is no weights file */
  char *junk = tu_path("junk.bin"), extra[1024];
  static char zeros[4096];
  tu_write_file(junk, zeros, sizeof zeros);
  chmod(junk, 0644);
  snprintf(extra, sizeof extra, "steps = 50\n[model]\ninit_from = %s\n", junk);
  char *bad = job_file("bad.conf", extra);
  cr_assert_eq(sbatch_wait(bad, "bad", out, sizeof out), 1, "a failing job:\n%s", out);
  /* a grace not below Slurm's KillWait (30 s here) is said before the job starts */
  sbatch_out_says("ok", "KillWait", 0);
  char *refused = job_file("refused.conf", "steps = 0\n");
  cr_assert_eq(sbatch_wait_env(refused, "refused", "FSDP_GRACE=30", out, sizeof out), 2,
               "a refused job:\n%s", out);
  sbatch_out_says("refused", "FSDP_GRACE is 30 s and Slurm's KillWait 30 s", 1);
  free(ok), free(junk), free(bad), free(refused);
}

/* The #SBATCH options of the script as sbatch reads them: those before its
 * first line that is neither a comment nor blank, one per line in out. */
static void sbatch_options(char *out, size_t len) {
  char path[4200];
  snprintf(path, sizeof path, "%s/deploy/slurm/fsdp.sbatch", root);
  char *text = tu_slurp(path, NULL), *save;
  size_t o = 0;
  out[0] = 0;
  for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
    if (l[strspn(l, " \t")] && l[0] != '#') break;
    if (!strncmp(l, "#SBATCH ", 8)) o += (size_t)snprintf(out + o, len - o, "%s\n", l + 8);
  }
  free(text);
}

/* fsdpd serves every device of its node (FSDP_DEVICES=auto): the script
 * takes whole nodes, one fsdpd on each, and forces no GPU request (the demo
 * runs on CPU devices; a GPU run adds --gres at submit, as its comment
 * shows). Without --exclusive a second job was placed on the same node and
 * its processes shared fsdpd's GPUs (found by review): here a job of one CPU
 * holds one of the node's CPUs, and the script's job waits for it instead of
 * starting beside it. */
Test(slurm, the_batch_job_takes_whole_nodes_one_fsdpd_each) {
  SKIP_UNLESS_ROOT();
  char opts[4096], out[1 << 14], cmd[4096];
  sbatch_options(opts, sizeof opts);
  cr_assert(strstr(opts, "--exclusive\n"), "fsdp.sbatch shares its nodes; #SBATCH options:\n%s", opts);
  cr_assert(strstr(opts, "--ntasks-per-node=1\n"), "#SBATCH options:\n%s", opts);
  cr_assert(!strstr(opts, "--gres") && !strstr(opts, "--gpus"),
            "fsdp.sbatch asks for GPUs, which CPU-only nodes do not have:\n%s", opts);
  snprintf(cmd, sizeof cmd, "grep -c -- '--gres=gpu:' '%s/deploy/slurm/fsdp.sbatch'", root);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "fsdp.sbatch does not show how a GPU run asks for GPUs");
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    cr_log_warn("one CPU: any job fills the node, so sharing cannot be told apart; checked the "
                "options only");
    return;
  }
  /* both on n1: on two nodes the script's job could otherwise take n2 */
  cr_assert_eq(tu_sh("sbatch --parsable -w n1 -o /dev/null --wrap 'exec sleep 300'", out, sizeof out),
               0, "%s", out);
  const int other = atoi(out);
  char *jc = job_file("whole.conf", "steps = 50\n");
  snprintf(cmd, sizeof cmd, "cd '%s' && env %s FSDP_STATE='%s/whole' sbatch --parsable -w n1 -o "
           "'%s/whole.out' '%s/deploy/slurm/fsdp.sbatch' '%s' --ranks 2", tu_tmpdir(), env,
           tu_tmpdir(), tu_tmpdir(), root, jc);
  /* the other job first runs (the node idle until then), then the script's is submitted */
  const double t0 = tu_now_s();
  char q[256];
  snprintf(q, sizeof q, "squeue -h -j %d -o %%T", other);
  while (tu_sh(q, out, sizeof out), !strstr(out, "RUNNING")) {
    cr_assert_lt(tu_now_s() - t0, 30, "a job of one CPU did not start: %s", out);
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s", out);
  const int id = atoi(out);
  snprintf(q, sizeof q, "squeue -h -j %d -o '%%T %%r'", id);
  char state[256] = "";
  const double t1 = tu_now_s();
  while (tu_now_s() - t1 < 5) { /* it would start at once on the CPU left */
    tu_sh(q, state, sizeof state);
    if (!strstr(state, "PENDING")) break;
    nanosleep(&(struct timespec){0, 200000000}, NULL);
  }
  /* both gone before any verdict: a job left running outlives the test */
  snprintf(cmd, sizeof cmd, "scancel --full -s KILL %d %d; scancel %d %d", id, other, id, other);
  tu_sh(cmd, out, sizeof out);
  snprintf(q, sizeof q, "squeue -h -j %d,%d", id, other);
  const double t2 = tu_now_s();
  while (tu_sh(q, out, sizeof out), out[0]) {
    cr_assert_lt(tu_now_s() - t2, 30, "the jobs outlived scancel:\n%s", out);
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  cr_assert(strstr(state, "PENDING"), "the script's job ran beside another job on its node: %s", state);
  free(jc);
}

/* The 2-rank job jc, run by fsdp-launch on this machine with its checkpoints
 * in ref, ends with step's shards equal to those in ck. */
static void same_shards_as_one_machine(const char *jc, const char *ck, const char *ref, int step) {
  char cmd[4096], out[1 << 14];
  setenv("FSDP_PROGRESS_EVERY", "1000", 1);
  snprintf(cmd, sizeof cmd, "-n 2 -- %s/bin/fsdp-train --config %s --checkpoint_dir %s", tu_root(),
           jc, ref);
  static char lo[1 << 16];
  cr_assert_eq(tu_run_bin("fsdp-launch", cmd, lo, sizeof lo), 0, "%s", lo);
  for (int j = 0; j < 2; j++) {
    /* byte for byte but for the run's id (bytes 137..144, cmp counts from 1)
     * and so the header's checksum (its last 8 bytes; its length at byte 24) */
    snprintf(cmd, sizeof cmd, "a='%s/step-%08d/shard-%05d-of-00002.fsdp'; "
             "b='%s/step-%08d/shard-%05d-of-00002.fsdp'; "
             "[ \"$(stat -c %%s \"$a\")\" = \"$(stat -c %%s \"$b\")\" ] || { echo sizes; exit 1; }; "
             "hl=$(od -An -t u8 -j 24 -N 8 \"$a\" | tr -d ' '); cmp -l \"$a\" \"$b\" | "
             "awk -v hl=\"$hl\" '($1 < 137 || $1 > 144) && ($1 <= hl - 8 || $1 > hl) "
             "{ print; bad = 1 } END { exit bad }'", ck, step, j, ref, step, j);
    cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "shard %d differs from the one-machine run's: %s",
                 j, out);
  }
}

/* The script submitted (no --wait) on a 2-rank job of steps steps,
 * checkpointing every 300 into ck (made here), with its state in STATE and
 * output in STATE.out, once its ranks run: its first checkpoint committed
 * (its manifest's path in man). The Slurm job's id; *jc the job file. */
/* envx: more of the environment ("A=1 B=2"), sb: more sbatch options */
static int sbatch_running_opts(const char *state, const char *ck, int steps, const char *opts,
                               const char *envx, const char *sb, char **jc, char *man, size_t len) {
  char extra[1024], cmd[4096], out[4096];
  cr_assert_eq(mkdir(ck, 0777), 0);
  chmod(ck, 0777);
  snprintf(extra, sizeof extra, "steps = %d\n[output]\ncheckpoint_dir = %s\ncheckpoint_every = 300\n",
           steps, ck);
  snprintf(cmd, sizeof cmd, "%s.conf", state);
  *jc = job_file(cmd, extra);
  snprintf(cmd, sizeof cmd, "cd '%s' && env %s %s FSDP_STATE='%s/%s' sbatch --parsable %s -o '%s/%s.out' "
           "'%s/deploy/slurm/fsdp.sbatch' '%s' --ranks 2 %s", tu_tmpdir(), env, envx, tu_tmpdir(),
           state, sb, tu_tmpdir(), state, root, *jc, opts);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s", out);
  const int id = atoi(out);
  cr_assert_gt(id, 0, "%s", out);
  snprintf(man, len, "%s/step-00000300/manifest.json", ck);
  cluster_wait_file(man, 60);
  return id;
}
static int sbatch_running(const char *state, const char *ck, int steps, char **jc, char *man,
                          size_t len) {
  return sbatch_running_opts(state, ck, steps, "", "", "", jc, man, len);
}

/* A running batch job stopped by cmd (%d: its id): its ranks checkpoint, the
 * allocation is requeued and runs again, resumes from that checkpoint, and
 * ends with the uninterrupted run's bytes. */
static void preempted_resumes_exactly(const char *how) {
  char ck[700], ref[700], cmd[4096], out[1 << 14], man[800], *jc;
  snprintf(ck, sizeof ck, "%s/ck", tu_tmpdir());
  snprintf(ref, sizeof ref, "%s/ck-ref", tu_tmpdir());
  cr_assert_eq(mkdir(ref, 0755), 0);
  const int id = sbatch_running("long", ck, 3000, &jc, man, sizeof man);
  snprintf(cmd, sizeof cmd, how, id);
  run_ok(cmd);
  /* requeued (held cred_expire + 1 s): nothing of the first allocation is
   * left meanwhile (its watch was: it went on into the next one) */
  snprintf(cmd, sizeof cmd, "scontrol show job -o %d", id);
  const double t0 = tu_now_s();
  while (tu_sh(cmd, out, sizeof out), !strstr(out, "Restarts=1") ||
         !(strstr(out, "JobState=PENDING") || strstr(out, "JobState=RUNNING"))) {
    cr_assert_lt(tu_now_s() - t0, 120 * TU_SLOW, "the job was not requeued: %s", out);
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
  none_left_of_run("long", 1, 5, "between the allocations");
  /* run again, to its end */
  snprintf(cmd, sizeof cmd, "squeue -h -j %d -o %%T", id);
  const double t1 = tu_now_s();
  while (tu_sh(cmd, out, sizeof out), out[0]) {
    cr_assert_lt(tu_now_s() - t1, 180 * TU_SLOW, "the job is still queued or running:\n%s", out);
    nanosleep(&(struct timespec){0, 500000000}, NULL);
  }
  none_left_of("long", 10, "after the allocation");
  no_watch_twice("long");
  /* fsdpd left before the coordinator stopped, and the job's state was read */
  sbatch_out_says("long", "could not tell the coordinator", 0);
  sbatch_out_says("long", "did not answer", 0);
  snprintf(cmd, sizeof cmd, "scontrol show job %d", id);
  run_ok(cmd);
  tu_sh(cmd, out, sizeof out);
  cr_assert(strstr(out, "JobState=COMPLETED") && strstr(out, "ExitCode=0:0") &&
                strstr(out, "Restarts=1"), "%s", out);
  /* the second attempt resumed from the checkpoint the SIGTERM wrote */
  snprintf(cmd, sizeof cmd, "grep -h 'resumed from' '%s'/long/node-*/jobs/j-1/2/rank-0.log", tu_tmpdir());
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "the requeued attempt did not resume:\n%s", out);
  cr_assert_null(strstr(out, "step-00000300 "), "it resumed from the periodic checkpoint, not the "
                 "preemption's: %s", out);
  /* and ends where the uninterrupted run ends */
  same_shards_as_one_machine(jc, ck, ref, 3000);
  free(jc);
}


Test(slurm, a_requeued_job_checkpoints_and_its_next_allocation_resumes_exactly) {
  SKIP_UNLESS_ROOT();
  preempted_resumes_exactly("scontrol requeue %d");
}

/* What --signal=B:TERM@N does before the time limit: SIGTERM to the batch
 * script alone, which stops fsdpd (its ranks checkpoint) and requeues the
 * allocation itself. */
Test(slurm, a_signal_to_the_batch_script_checkpoints_requeues_and_resumes_exactly) {
  SKIP_UNLESS_ROOT();
  preempted_resumes_exactly("scancel --batch --signal=TERM %d");
}

/* `scancel JOBID`, a user's cancel: Slurm signals the batch script and
 * every process of the job once and ends it, and the script must not
 * requeue it (it did: scancel requeued the allocation, and a second scancel
 * was needed; found by a tester). The ranks checkpoint as on a preemption,
 * the training job is cancelled too (a coordinator on its database says so
 * afterwards, with the checkpoint kept), and the Slurm job ends CANCELLED
 * with Restarts=0. While it runs, each fsdpd is registered at its node's
 * NodeAddr (127.0.0.1 here), not at its Slurm node name (n1, which no
 * resolver knows): fsdpctl logs reads a rank's log (it failed with "DNS
 * resolution failed for n1:PORT"; found by the same tester). */
Test(slurm, a_scancel_ends_the_allocation_and_cancels_the_training_job) {
  SKIP_UNLESS_ROOT();
  char ck[700], cmd[4096], out[1 << 14], tok[800], man[800], *jc;
  snprintf(ck, sizeof ck, "%s/ck-cancel", tu_tmpdir());
  const int id = sbatch_running("cancel", ck, 100000, &jc, man, sizeof man);
  snprintf(tok, sizeof tok, "--token-file '%s/cancel/tokens/user.token'", tu_tmpdir());
  /* the node's registered address is one fsdpctl reaches */
  char coord[64], rlog[800];
  snprintf(coord, sizeof coord, "127.0.0.1:%d", fsdp_port);
  snprintf(cmd, sizeof cmd, "%s nodes", tok);
  cr_expect_eq(cluster_ctl(coord, cmd, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, " 127.0.0.1:") && !strstr(out, " n1:"),
            "fsdpd is not registered at its NodeAddr, 127.0.0.1:\n%s", out);
  snprintf(rlog, sizeof rlog, "%s/cancel-rank-0.log", tu_tmpdir());
  snprintf(cmd, sizeof cmd, "'%s/bin/fsdpctl' --coordinator %s %s logs j-1 --rank 0 >'%s' 2>&1",
           root, coord, tok, rlog);
  const int rc = tu_sh(cmd, out, sizeof out);
  char *text = tu_slurp(rlog, NULL);
  cr_expect(rc == 0 && text && strstr(text, "step "), "fsdpctl logs: exit %d:\n%.2000s", rc,
            text ? text : "");
  free(text);
  /* the cancel */
  snprintf(cmd, sizeof cmd, "scancel %d", id);
  run_ok(cmd);
  snprintf(cmd, sizeof cmd, "squeue -h -j %d -o '%%T %%r'", id);
  const double t0 = tu_now_s();
  while (tu_sh(cmd, out, sizeof out), out[0]) {
    cr_assert_lt(tu_now_s() - t0, 60 * TU_SLOW, "the job outlived scancel:\n%s", out);
    cr_assert(!strstr(out, "PENDING"), "scancel requeued the job: %s", out);
    nanosleep(&(struct timespec){0, 200000000}, NULL);
  }
  snprintf(cmd, sizeof cmd, "scontrol show job %d", id);
  tu_sh(cmd, out, sizeof out);
  cr_expect(strstr(out, "JobState=CANCELLED") && strstr(out, "Restarts=0"), "%s", out);
  sbatch_out_says("cancel", "SIGTERM from scancel", 1);
  sbatch_out_says("cancel", "requeueing the allocation", 0);
  /* fsdpd left before the coordinator stopped (it did not: the coordinator
   * stopped once the job was requeued, before fsdpd's last call) */
  sbatch_out_says("cancel", "could not tell the coordinator", 0);
  none_left_of("cancel", 10, "after the scancel");
  /* the training job: cancelled, for the scancel, its checkpoints kept */
  cluster_proc_t c = {0};
  snprintf(cmd, sizeof cmd, "--user-token-file '%s/cancel/tokens/user.token' "
           "--node-token-file '%s/cancel/tokens/node.token'", tu_tmpdir(), tu_tmpdir());
  char db[800];
  snprintf(db, sizeof db, "%s/cancel/state.db", tu_tmpdir());
  cluster_coord_start(&c, db, "127.0.0.1:0", cmd);
  snprintf(cmd, sizeof cmd, "%s status j-1", tok);
  cluster_ctl(c.addr, cmd, out, sizeof out);
  cluster_stop(&c, SIGTERM);
  /* the script's own account last: what a truncated log still shows */
  snprintf(cmd, sizeof cmd, "%s/cancel.out", tu_tmpdir());
  char *said = tu_slurp(cmd, NULL);
  cr_expect(strstr(out, "CANCELLED") && strstr(out, "scancel"),
            "the training job was not cancelled with the allocation:\n%s\nthe script said:\n%s", out,
            said ? said : "(nothing)");
  free(said);
  cr_expect_eq(access(man, F_OK), 0, "%s: the committed checkpoint is gone", man);
  free(jc);
}

/* Two Slurm nodes: the script starts an fsdpd on each, registered under its
 * Slurm node name (the nodes share this host and its host name), and a
 * 2-rank job places a rank on each and ends with the same shards, byte for
 * byte, as a one-machine run of the same job. */
Test(slurm, a_two_node_allocation_runs_a_rank_on_each_node) {
  SKIP_UNLESS_ROOT();
  char ck[700], ref[700], extra[1024], cmd[4096], out[1 << 14];
  snprintf(ck, sizeof ck, "%s/ck2", tu_tmpdir());
  snprintf(ref, sizeof ref, "%s/ck2-ref", tu_tmpdir());
  cr_assert_eq(mkdir(ck, 0777), 0);
  chmod(ck, 0777);
  cr_assert_eq(mkdir(ref, 0755), 0);
  snprintf(extra, sizeof extra, "steps = 300\n[output]\ncheckpoint_dir = %s\ncheckpoint_every = 300\n",
           ck);
  char *jc = job_file("two.conf", extra);
  snprintf(cmd, sizeof cmd, "cd '%s' && env %s FSDP_DEVICES=cpu:1 FSDP_STATE='%s/two' timeout %d "
           "sbatch --wait --nodes=2 -o '%s/two.out' '%s/deploy/slurm/fsdp.sbatch' '%s' --ranks 2",
           tu_tmpdir(), env, tu_tmpdir(), 200 * TU_SLOW, tu_tmpdir(), root, jc);
  int rc = tu_sh(cmd, out, sizeof out);
  snprintf(cmd, sizeof cmd, "cat '%s/two.out' '%s/two/coordinator.log'", tu_tmpdir(), tu_tmpdir());
  static char log[1 << 16];
  tu_sh(cmd, log, sizeof log);
  cr_assert_eq(rc, 0, "the two-node job: %s\n%s", out, log);
  /* each node's fsdpd ran one rank, in its own work directory */
  for (int n = 1; n <= 2; n++) {
    snprintf(cmd, sizeof cmd, "ls '%s'/two/node-n%d/jobs/j-1/1/ | grep -c '^rank-[01].log$'",
             tu_tmpdir(), n);
    tu_sh(cmd, out, sizeof out);
    cr_expect_eq(atoi(out), 1, "node n%d ran %s rank(s), not one:\n%s", n, out, log);
  }
  cr_expect(strstr(log, "(n1, 1 devices) registered") && strstr(log, "(n2, 1 devices) registered"),
            "the nodes did not register under their Slurm names:\n%s", log);
  same_shards_as_one_machine(jc, ck, ref, 300);
  free(jc);
}

/* fsdpd that cannot start (as root without --run-as: exit 2 at once) ends
 * the allocation, failed, saying so; the training job stays queued in
 * FSDP_STATE. The allocation was held till its time limit, the watch
 * showing the job PENDING for want of a node (found by a tester). */
Test(slurm, an_fsdpd_that_cannot_start_fails_the_allocation) {
  SKIP_UNLESS_ROOT();
  char cmd[4096], out[1 << 14];
  char *jc = job_file("nostart.conf", "steps = 50\n");
  snprintf(cmd, sizeof cmd, "cd '%s' && env %s FSDPD_ARGS= FSDP_STATE='%s/nostart' sbatch --parsable "
           "-o '%s/nostart.out' '%s/deploy/slurm/fsdp.sbatch' '%s' --ranks 2", tu_tmpdir(), env,
           tu_tmpdir(), tu_tmpdir(), root, jc);
  cr_assert_eq(tu_sh(cmd, out, sizeof out), 0, "%s", out);
  const int id = atoi(out);
  gone_within(id, 60 * TU_SLOW, "nostart");
  snprintf(cmd, sizeof cmd, "scontrol show job %d", id);
  tu_sh(cmd, out, sizeof out);
  cr_expect(strstr(out, "JobState=FAILED") && strstr(out, "ExitCode=1:0") && strstr(out, "Restarts=0"),
            "%s", out);
  sbatch_out_says("nostart", "--run-as", 1); /* fsdpd's own word */
  sbatch_out_says("nostart", "fsdpd could not start", 1);
  none_left_of("nostart", 10, "after the allocation");
  free(jc);
}

/* The coordinator that exits at its start (its database in use by another
 * coordinator) ends the allocation at once, exit 2, with the end of its log;
 * the script waited the 10 s out and said "did not start within 10 s". */
Test(slurm, a_coordinator_that_exits_at_its_start_ends_the_allocation_at_once) {
  SKIP_UNLESS_ROOT();
  char dbdir[800], db[900], out[1 << 14];
  snprintf(dbdir, sizeof dbdir, "%s/locked", tu_tmpdir());
  cr_assert_eq(mkdir(dbdir, 0755), 0);
  snprintf(db, sizeof db, "%s/state.db", dbdir);
  cluster_proc_t c = {0};
  cluster_coord_start(&c, db, "127.0.0.1:0", "");
  char *jc = job_file("locked.conf", "steps = 50\n");
  const int rc = sbatch_wait(jc, "locked", out, sizeof out);
  cluster_stop(&c, SIGTERM);
  cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
  sbatch_out_says("locked", "did not start within", 0);
  sbatch_out_says("locked", "the coordinator exited at its start", 1);
  sbatch_out_says("locked", "in use by another coordinator", 1); /* its log's last lines */
  none_left_of("locked", 10, "after the allocation");
  free(jc);
}

/* A process of the allocation killed (SIGKILL) mid-run, comm its name: the
 * script says so (said), requeues the allocation, and the next one runs
 * the job to its end from its checkpoint on the same database. Without it
 * the allocation was held till its time limit (fsdpd gone, the job
 * PENDING), or ended FAILED, exit 4, not requeued, with the job RUNNING in
 * the database (the coordinator gone; both found by a tester). */
static void killed_requeues_and_resumes(const char *state, const char *comm, const char *said,
                                        int nodes) {
  char ck[700], cmd[4096], out[1 << 14], man[800], *jc;
  snprintf(ck, sizeof ck, "%s/ck-%s", tu_tmpdir(), state);
  /* a lost node's attempt spends a restart */
  const int id = sbatch_running_opts(state, ck, 1500, "--max-restarts 1",
                                     nodes > 1 ? "FSDP_DEVICES=cpu:1" : "",
                                     nodes > 1 ? "--nodes=2" : "", &jc, man, sizeof man);
  const pid_t pid = proc_of(state, comm);
  if (!pid) {
    procs_of(state, out, sizeof out);
    snprintf(cmd, sizeof cmd, "scancel %d", id);
    tu_sh(cmd, man, sizeof man);
    cr_assert_fail("no %s among the job's processes:\n%s", comm, out);
  }
  kill(pid, SIGKILL);
  gone_within(id, 240 * TU_SLOW, state);
  snprintf(cmd, sizeof cmd, "scontrol show job %d", id);
  tu_sh(cmd, out, sizeof out);
  snprintf(cmd, sizeof cmd, "%s/%s.out", tu_tmpdir(), state);
  char *text = tu_slurp(cmd, NULL);
  cr_expect(strstr(out, "JobState=COMPLETED") && strstr(out, "ExitCode=0:0") &&
                strstr(out, "Restarts=1"), "%s\nits output:\n%s", out, text ? text : "");
  free(text);
  sbatch_out_says(state, said, 1);
  sbatch_out_says(state, "requeueing the allocation", 1);
  snprintf(cmd, sizeof cmd, "%s/step-00001500/manifest.json", ck);
  cr_expect_eq(access(cmd, F_OK), 0, "the job did not reach its end: no %s", cmd);
  none_left_of(state, 10, "after the allocation");
  no_watch_twice(state);
  free(jc);
}

Test(slurm, fsdpd_killed_mid_run_requeues_the_allocation) {
  SKIP_UNLESS_ROOT();
  killed_requeues_and_resumes("fsdpdkill", "fsdpd", "fsdpd stopped (node n", 1);
}

/* On two nodes, one fsdpd killed: srun runs on with the other's, and the
 * allocation was held, the job waiting for the lost node, till its time
 * limit (found by a tester); the script sees it within seconds, stops the
 * other and requeues the allocation, and the next runs the job to its end. */
Test(slurm, one_nodes_fsdpd_killed_on_two_nodes_requeues_the_allocation) {
  SKIP_UNLESS_ROOT();
  killed_requeues_and_resumes("fsdpdkill2", "fsdpd", "fsdpd stopped (node n", 2);
}

Test(slurm, the_coordinator_killed_mid_run_requeues_the_allocation) {
  SKIP_UNLESS_ROOT();
  killed_requeues_and_resumes("coordkill", "fsdp-coordinato", "the coordinator exited (status", 1);
}

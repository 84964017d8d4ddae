/* End-to-end tests of the whole service on 127.0.0.1: a real coordinator,
 * real node daemons with CPU devices, real ranks (fsdp-train), driven with
 * fsdpctl, as a user would:
 *   - a 4-rank HYBRID 2x2 job on two nodes keeps each shard group on one
 *     node and trains exactly as the same job under fsdp-launch, loss for
 *     loss;
 *   - three 2-rank jobs on 4 devices: two run, the third waits with its
 *     reason, then runs when a cancel frees devices (the cancelled ranks gone
 *     within 2 s);
 *   - an fsdpd killed with SIGKILL mid-job: its node declared dead within the
 *     timeout + 1 s, the job's other ranks stopped, the job back to PENDING to
 *     restart (its policy) with the reason;
 *   - the coordinator killed with SIGKILL mid-job and started again on its
 *     database: the node registers again, the job carries on to the end,
 *     PRAGMA integrity_check is ok.
 * Ranks run as nobody when the test runs as root. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/job/ckpt.h"
#include "daemon/job/safetensors.h"
#include "daemon/train/gpt.h"
#include "kernels/kern.h"
#include "tests/e2e/cluster.h"
#include "tests/unit/testutil.h"

#define TIMEOUT_MS 2000

static cluster_proc_t coord, node[2];
static char data[600];

static void setup(void) {
  chmod(tu_tmpdir(), 0755); /* the ranks' user reads the data and its directory */
  char *d = tu_token_file("tok.bin", 40000, 7, 256);
  snprintf(data, sizeof data, "%s", d);
  free(d);
  chmod(data, 0644);
  char *db = tu_path("state.db");
  char extra[64];
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d", TIMEOUT_MS);
  cluster_coord_start(&coord, db, "127.0.0.1:0", extra);
  free(db);
}

static void teardown(void) {
  for (int i = 0; i < 2; i++) cluster_stop(&node[i], SIGTERM);
  cluster_stop(&coord, SIGTERM);
}

TestSuite(cluster, .init = setup, .fini = teardown, .timeout = 120 * TU_SLOW);

/* A job file of the tiny model on the test's data; more lines in extra. */
/* 1 when text has a line setting key. */
static int sets_key(const char *text, const char *key) {
  const size_t n = strlen(key);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, key, n) && (p[n] == ' ' || p[n] == '=')) return 1;
  return 0;
}

static char *job_file(const char *name, const char *extra) {
  char text[2048], train[128] = "";
  /* the defaults below, but for those extra sets (a key set twice is refused) */
  static const char *const keys[] = {"batch", "seq_len", "eval_every"};
  static const char *const vals[] = {"2", "32", "0"};
  for (int i = 0; i < 3; i++)
    if (!sets_key(extra, keys[i]))
      snprintf(train + strlen(train), sizeof train - strlen(train), "%s = %s\n", keys[i], vals[i]);
  snprintf(text, sizeof text, "%s[data]\ndata = %s\n[train]\n%s%s\n",
           sets_key(extra, "model") ? "" : "[model]\nmodel = tiny\n", data, train, extra);
  char *p = tu_path(name);
  tu_write_file(p, text, strlen(text));
  return p;
}

/* Submits; the job id (static). */
static const char *submit(const char *conf, const char *args) {
  static char id[32];
  char a[1024], out[4096];
  snprintf(a, sizeof a, "submit '%s' %s", conf, args);
  int rc = cluster_ctl(coord.addr, a, out, sizeof out);
  cr_assert_eq(rc, 0, "fsdpctl %s:\n%s", a, out);
  cr_assert(!strncmp(out, "j-", 2), "%s", out);
  snprintf(id, sizeof id, "%.*s", (int)strcspn(out, "\n"), out);
  return id;
}

/* The job's state word from `fsdpctl status` ("RUNNING"), and its output. */
static const char *state_of(const char *job, char *out, size_t len) {
  static char st[32];
  char a[128];
  snprintf(a, sizeof a, "status %s", job);
  cluster_ctl(coord.addr, a, out, len);
  char *s = strstr(out, "\nstate");
  st[0] = 0;
  if (s) sscanf(s + 6, "%31s", st);
  return st;
}

/* Waits (bounded) until the job's state is want. */
static int wait_state(const char *job, const char *want, double timeout_s) {
  char out[8192];
  const double deadline = tu_now_s() + timeout_s;
  while (strcmp(state_of(job, out, sizeof out), want)) {
    if (tu_now_s() > deadline) return 0;
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  }
  return 1;
}

/* The losses of the "step k/N | loss X" lines in text (prefix: what the
 * line starts with, e.g. "[rank 0] step"), joined by spaces. */
static void losses(const char *text, const char *prefix, char *out, size_t len) {
  out[0] = 0;
  for (const char *p = text; (p = strstr(p, prefix)); p++) {
    if (p != text && p[-1] != '\n') continue;
    const char *l = strstr(p, "| loss ");
    const char *eol = strchr(p, '\n');
    if (!l || (eol && l > eol)) continue;
    char v[32];
    sscanf(l + 7, "%31s", v);
    strncat(out, v, len - strlen(out) - 2);
    strncat(out, " ", len - strlen(out) - 1);
  }
}

Test(cluster, hybrid_2x2_on_two_nodes_trains_as_under_fsdp_launch) {
  cluster_fsdpd_start(&node[0], coord.addr, "alpha", 2, NULL);
  cluster_fsdpd_start(&node[1], coord.addr, "beta", 2, NULL);
  char *conf = job_file("hybrid.conf", "steps = 6\n[shard]\nstrategy = HYBRID_SHARD\nmesh = 2x2\n");
  const char *job = submit(conf, "--ranks 4 --name hybrid");
  char out[65536], a[256];
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  /* each shard group on one node, the two groups on different nodes */
  snprintf(a, sizeof a, "--output json status %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  char nodes[4][16];
  const char *p = out;
  for (int r = 0; r < 4; r++) {
    p = strstr(p, "\"node_id\": \"");
    cr_assert_not_null(p, "%s", out);
    p += 12;
    snprintf(nodes[r], sizeof nodes[r], "%.*s", (int)strcspn(p, "\""), p);
  }
  cr_expect_str_eq(nodes[0], nodes[1]);
  cr_expect_str_eq(nodes[2], nodes[3]);
  cr_expect_str_neq(nodes[0], nodes[2]);
  /* rank 0's losses, step by step, against fsdp-launch's */
  char svc[4096], ref[4096];
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  losses(out, "step", svc, sizeof svc);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "-n 4 -- env FSDP_THREADS=1 '%s/bin/fsdp-train' --config '%s'",
           tu_root(), conf);
  cr_assert_eq(tu_run_bin("fsdp-launch", cmd, out, sizeof out), 0, "%s", out);
  losses(out, "[rank 0] step", ref, sizeof ref);
  cr_assert_gt(strlen(ref), 0, "%s", out);
  cr_expect_str_eq(svc, ref, "losses under the service: %s\nunder fsdp-launch: %s", svc, ref);
  free(conf);
}

/* The PLANNED and PEAK MiB of category cat for rank r in `fsdpctl memory`
 * output ("" : no row); planned may be NULL. */
static void memory_row(const char *table, int r, const char *cat, char *planned_out, char *out,
                       size_t len) {
  out[0] = 0;
  if (planned_out) planned_out[0] = 0;
  for (const char *p = table; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    int rank;
    char node[32], name[32], planned[32], cur[32], peak[32];
    if (sscanf(p, "%d %31s %31s %31s %31s %31s", &rank, node, name, planned, cur, peak) == 6 &&
        rank == r && !strcmp(name, cat)) {
      snprintf(out, len, "%s", peak);
      if (planned_out) snprintf(planned_out, len, "%s", planned);
    }
  }
}

/* The CUDA plugin built on the emulator (tests/cuda/emu), an absolute path
 * (fsdpd's probe and ranks run elsewhere), and the directory of the fake
 * driver library fsdpd's inventory loads (tests/unit/fake_libcuda.c); ""
 * when nvcc did not build the plugin. */
static const char *emu_plugin(char driver[PATH_MAX + 64]) {
  static char plugin[PATH_MAX + 64];
  char root[PATH_MAX], lib[PATH_MAX + 128];
  cr_assert_not_null(realpath(tu_root(), root));
  snprintf(plugin, sizeof plugin, "%s/%s/emu/libfsdp-cuda.so", root, tu_build());
  snprintf(driver, PATH_MAX + 64, "%s/%s/tests/fake-cuda", root, tu_build());
  snprintf(lib, sizeof lib, "%s/libcuda.so.1", driver);
  return access(plugin, R_OK) || access(lib, R_OK) ? "" : plugin;
}

/* node[i], fsdpd named name, registered: with 2 CPU devices (gpus 0), or
 * serving `gpus` emulated GPUs (the fake driver for its inventory, the
 * emulated plugin for its probe and ranks; the test's own fsdp-launch runs
 * get the plugin too, FSDP_CUDA_PLUGIN). -1 when the emulator is not built
 * here. */
static int node_start_env(int i, const char *name, int gpus, const char *extra) {
  if (!gpus) {
    cluster_fsdpd_start(&node[i], coord.addr, name, 2, NULL);
    return 0;
  }
  char driver[PATH_MAX + 64], env[4 * PATH_MAX];
  const char *plugin = emu_plugin(driver);
  if (!*plugin) return -1;
  /* each GPU 600 MiB short of its total with a context on it (the fake
   * driver's FAKE_CUDA_HELD_MIB): what the node offers */
  snprintf(env, sizeof env, "LD_LIBRARY_PATH='%s' FAKE_CUDA_GPUS=%d FAKE_CUDA_HELD_MIB=600 "
           "FSDP_CUDA_PLUGIN='%s' CUDA_EMU_DEVICES=%d %s", driver, gpus, plugin, gpus, extra);
  setenv("FSDP_CUDA_PLUGIN", plugin, 1);
  cluster_fsdpd_spawn_on(&node[i], coord.addr, name, "cuda", env, NULL);
  cluster_wait_alive(coord.addr, name);
  return 0;
}

static int node_start(int i, const char *name, int gpus) { return node_start_env(i, name, gpus, ""); }

/* Expects node[i]'s log to hold want; else says what, with the log. */
static void expect_log(int i, const char *want, const char *what) {
  char *log = tu_slurp(node[i].log, NULL);
  cr_expect(log && strstr(log, want), "%s:\n%s", what, log ? log : "(no log)");
  free(log);
}

/* Polls `fsdpctl --output json nodes` until it holds want, up to 15 s:
 * whether it did. */
static int nodes_show(const char *want, char *out, size_t len) {
  for (int i = 0; i < 150; i++) {
    if (cluster_ctl(coord.addr, "--output json nodes", out, len) == 0 && strstr(out, want)) return 1;
    usleep(100 * 1000);
  }
  return 0;
}

/* A GPU's free memory moves as other processes come and go: fsdpd measures
 * an idle GPU again (FSDP_GPU_MEASURE_S, here each second), the next
 * heartbeat carries the figure and the coordinator offers it, admits by it
 * and takes it back up. Another process taking 70 GiB of the fake 80 GiB
 * GPU after fsdpd started (FAKE_CUDA_HELD_FILE) leaves 10 GiB, and a job
 * that plans 12.5 GiB is refused at submit, naming it; before, the start's
 * 79.4 GiB stayed offered and the job's rank failed at open. */
Test(cluster, memory_another_process_takes_on_an_idle_gpu_is_no_longer_offered) {
  char *held = tu_path("held-mib"), extra[PATH_MAX + 64], out[65536];
  tu_write_file(held, "600\n", 4);
  snprintf(extra, sizeof extra, "FSDP_GPU_MEASURE_S=1 FAKE_CUDA_HELD_FILE='%s'", held);
  if (node_start_env(0, "gpu", 1, extra))
    cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  cr_assert(nodes_show("85270200320", out, sizeof out), "GPU 0 as fsdpd started:\n%s", out);
  tu_write_file(held, "71680\n", 6);
  cr_assert(nodes_show("10737418240", out, sizeof out), "the 10 GiB left are not offered:\n%s",
            out);
  expect_log(0, "cuda:0 (Fake GPU 0): 10.00 GiB free now, of 80.00 GiB (was 79.41 GiB)",
             "fsdpd does not say what GPU 0 offers now");
  char *conf = job_file("big.conf", "batch = 16\nseq_len = 1024\ndevice = cuda\nrecompute = 0\n"
                        "[model]\nmodel = gpt2-124m\n");
  char a[PATH_MAX + 64];
  snprintf(a, sizeof a, "submit '%s' --ranks 1", conf);
  cr_assert_neq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "a job beyond the GPU's 10 GiB "
                "was admitted:\n%s", out);
  cr_expect(strstr(out, "10240 MiB is available"), "the refusal does not name the 10 GiB:\n%s",
            out);
  /* the process gone: the GPU's memory is offered again */
  tu_write_file(held, "600\n", 4);
  cr_assert(nodes_show("85270200320", out, sizeof out), "GPU 0's memory is not offered again:\n%s",
            out);
  free(conf), free(held);
}

/* Measuring a GPU again holds a CUDA context of fsdpd's on it, which in
 * exclusive-process mode fails a rank's own: a rank assigned meanwhile
 * waits for it to end. Each measurement here holds its context 1.5 s
 * (FAKE_CUDA_RETAIN_MS, the file FAKE_CUDA_CTX_MARK there meanwhile) and
 * one starts each second, so the GPU is measured most of the time; each
 * rank, a script, fails (exit 3) when it starts while the file is there.
 * Three jobs, each submitted as a measurement begins, all succeed; with
 * the wait left out each fails. */
Test(cluster, a_rank_never_starts_while_fsdpd_measures_its_gpu) {
  char *mark = tu_path("ctx-held"), *prog = tu_path("rank.sh"), extra[PATH_MAX + 128];
  char script[PATH_MAX + 256], a[PATH_MAX + 64], out[65536];
  snprintf(script, sizeof script, "#!/bin/sh\n[ \"$1\" = --probe-device ] && exit 0\n"
           "[ -e '%s' ] && exit 3\nexit 0\n", mark);
  tu_write_file(prog, script, strlen(script));
  cr_assert_eq(chmod(prog, 0755), 0);
  snprintf(extra, sizeof extra, "FSDP_GPU_MEASURE_S=1 FAKE_CUDA_RETAIN_MS=1500 "
           "FAKE_CUDA_CTX_MARK='%s'", mark);
  char driver[PATH_MAX + 64], env[4 * PATH_MAX];
  if (!*emu_plugin(driver)) cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  snprintf(env, sizeof env, "LD_LIBRARY_PATH='%s' FAKE_CUDA_GPUS=1 %s", driver, extra);
  snprintf(a, sizeof a, "--rank-program '%s'", prog);
  cluster_fsdpd_spawn_on(&node[0], coord.addr, "gpu", "cuda", env, a);
  cluster_wait_alive(coord.addr, "gpu");
  char *conf = job_file("gpu.conf", "device = cuda\n");
  for (int i = 0; i < 3; i++) {
    char job[32];
    /* submitted as a measurement begins */
    for (int k = 0; k < 100 && access(mark, F_OK); k++) usleep(50 * 1000);
    cr_assert_eq(access(mark, F_OK), 0, "fsdpd does not measure its GPU again");
    snprintf(job, sizeof job, "%s", submit(conf, "--ranks 1 --max-restarts 0"));
    snprintf(a, sizeof a, "watch %s", job);
    cluster_ctl(coord.addr, a, out, sizeof out);
    cr_assert(wait_state(job, "SUCCEEDED", 10), "job %d: its rank started while fsdpd held a "
              "context on its GPU:\n%s", i, out);
  }
  expect_log(0, "rank 0: waits for device 0 while fsdpd measures its free memory",
             "fsdpd does not say why a rank waits");
  free(conf), free(prog), free(mark);
}

/* A node given some of its GPUs (--devices cuda:1,0: the second GPU first,
 * of an 80 and a 40 GiB one) registers each under its place in that list,
 * and a rank placed on one runs on that GPU: device 0 is GPU 1 (40 GiB),
 * and a rank on it is told CUDA device 1. Before, fsdpd registered the
 * CUDA ordinals and read the coordinator's numbers as places: cuda:1 alone
 * refused every rank, and cuda:1,0 ran a rank placed on the 80 GiB GPU on
 * the 40 GiB one (helper-111). */
Test(cluster, a_node_given_some_of_its_gpus_runs_each_rank_on_the_gpu_it_was_placed_on) {
  char driver[PATH_MAX + 64], env[4 * PATH_MAX], out[65536];
  const char *plugin = emu_plugin(driver);
  if (!*plugin) cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  snprintf(env, sizeof env, "LD_LIBRARY_PATH='%s' FAKE_CUDA_GPUS=2 FAKE_CUDA_HELD_MIB=600 "
           "FSDP_CUDA_PLUGIN='%s' CUDA_EMU_DEVICES=2", driver, plugin);
  setenv("FSDP_CUDA_PLUGIN", plugin, 1);
  cluster_fsdpd_spawn_on(&node[0], coord.addr, "gpu", "cuda:1", env, NULL);
  cluster_wait_alive(coord.addr, "gpu");
  char *conf = job_file("gpu1.conf", "steps = 2\ndevice = cuda\n");
  char job[32], a[128];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 1 --max-restarts 0"));
  snprintf(a, sizeof a, "watch %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_assert(wait_state(job, "SUCCEEDED", 20), "a rank on the node's only GPU:\n%s", out);
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_expect(strstr(out, "cuda device 1"), "the rank did not run on GPU 1:\n%.2000s", out);
  free(conf);
}

/* A GPU is measured again as soon as its rank exits, not only at the next
 * tick (FSDP_GPU_MEASURE_S, here an hour): memory another process took
 * while the job ran is no longer offered once the job is over. */
Test(cluster, a_gpu_is_measured_again_as_its_rank_exits) {
  char *held = tu_path("held-mib"), *prog = tu_path("rank.sh"), out[65536];
  char script[256], extra[3 * PATH_MAX], a[PATH_MAX + 64];
  snprintf(script, sizeof script, "#!/bin/sh\nexit 0\n");
  tu_write_file(prog, script, strlen(script));
  cr_assert_eq(chmod(prog, 0755), 0);
  tu_write_file(held, "600\n", 4);
  char driver[PATH_MAX + 64];
  if (!*emu_plugin(driver)) cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  snprintf(extra, sizeof extra, "LD_LIBRARY_PATH='%s' FAKE_CUDA_GPUS=1 FSDP_GPU_MEASURE_S=3600 "
           "FAKE_CUDA_HELD_FILE='%s'", driver, held);
  snprintf(a, sizeof a, "--rank-program '%s'", prog);
  cluster_fsdpd_spawn_on(&node[0], coord.addr, "gpu", "cuda", extra, a);
  cluster_wait_alive(coord.addr, "gpu");
  cr_assert(nodes_show("85270200320", out, sizeof out), "GPU 0 as fsdpd started:\n%s", out);
  tu_write_file(held, "71680\n", 6); /* taken while no job ran: not measured (an hour's tick) */
  usleep(1500 * 1000);
  cr_assert_eq(cluster_ctl(coord.addr, "--output json nodes", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "85270200320"), "GPU 0 was measured again before its rank exited:\n%s",
            out);
  char *conf = job_file("gpu.conf", "device = cuda\n");
  char job[32];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 1 --max-restarts 0"));
  cr_assert(wait_state(job, "SUCCEEDED", 15), "the job did not end");
  cr_assert(nodes_show("10737418240", out, sizeof out), "GPU 0 was not measured again as its "
            "rank exited:\n%s", out);
  free(conf), free(prog), free(held);
}

/* A GPU another process fills while it is idle is measured at 0 bytes
 * free, and the coordinator offers it so: not at its old figure (the
 * heartbeat's 0 was dropped, and a rank placed on the full GPU;
 * helper-111). */
Test(cluster, a_gpu_another_process_filled_is_offered_at_nothing) {
  char *held = tu_path("held-mib"), out[65536], extra[3 * PATH_MAX], driver[PATH_MAX + 64];
  tu_write_file(held, "600\n", 4);
  const char *plugin = emu_plugin(driver);
  if (!*plugin) cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  snprintf(extra, sizeof extra, "LD_LIBRARY_PATH='%s' FAKE_CUDA_GPUS=1 FSDP_GPU_MEASURE_S=1 "
           "FAKE_CUDA_HELD_FILE='%s' FSDP_CUDA_PLUGIN='%s' CUDA_EMU_DEVICES=1", driver, held, plugin);
  cluster_fsdpd_spawn_on(&node[0], coord.addr, "gpu", "cuda", extra, NULL);
  cluster_wait_alive(coord.addr, "gpu");
  cr_assert(nodes_show("85270200320", out, sizeof out), "GPU 0 as fsdpd started:\n%s", out);
  tu_write_file(held, "81920\n", 6); /* all of its 80 GiB */
  cr_expect(nodes_show("\"total_bytes\": 0,", out, sizeof out), "the full GPU is still offered:\n%s",
            out);
  free(held);
}

/* Lines of a file (0: none). */
static int lines_of(const char *path) {
  FILE *f = fopen(path, "r");
  int n = 0;
  for (int ch; f && (ch = fgetc(f)) != EOF;) n += ch == '\n';
  if (f) fclose(f);
  return n;
}

/* A measurement the driver never answers (a GPU fallen off the bus) does
 * not keep its GPU's ranks waiting for good: after 10 s fsdpd says so and
 * they start, it measures no GPU again (not even as the rank exits: each
 * would hold a pool thread for good), and it stops when asked, the call
 * still out; asked to stop while a measurement hangs, it stops once that
 * one is given up. The driver here hangs in cuDevicePrimaryCtxRetain while
 * FAKE_CUDA_HANG_FILE is there. */
Test(cluster, a_gpu_whose_driver_hangs_while_measured_still_starts_its_ranks) {
  char *mark = tu_path("ctx-held"), *hang = tu_path("hang"), *prog = tu_path("rank.sh");
  char *retains = tu_path("retains");
  char script[PATH_MAX + 256], extra[3 * PATH_MAX], a[PATH_MAX + 64];
  snprintf(script, sizeof script, "#!/bin/sh\n[ \"$1\" = --probe-device ] && exit 0\nexit 0\n");
  tu_write_file(prog, script, strlen(script));
  cr_assert_eq(chmod(prog, 0755), 0);
  char driver[PATH_MAX + 64];
  if (!*emu_plugin(driver)) cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  snprintf(extra, sizeof extra, "LD_LIBRARY_PATH='%s' FAKE_CUDA_GPUS=1 FSDP_GPU_MEASURE_S=1 "
           "FAKE_CUDA_CTX_MARK='%s' FAKE_CUDA_HANG_FILE='%s' FAKE_CUDA_RETAIN_LOG='%s'", driver,
           mark, hang, retains);
  snprintf(a, sizeof a, "--rank-program '%s'", prog);
  cluster_fsdpd_spawn_on(&node[0], coord.addr, "gpu", "cuda", extra, a);
  cluster_wait_alive(coord.addr, "gpu");
  tu_write_file(hang, "", 0);
  for (int k = 0; k < 100 && access(mark, F_OK); k++) usleep(50 * 1000);
  cr_assert_eq(access(mark, F_OK), 0, "fsdpd does not measure its GPU again");
  char *conf = job_file("gpu.conf", "device = cuda\n");
  char job[32];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 1 --max-restarts 0"));
  const double t0 = tu_now_s();
  const int ok = wait_state(job, "SUCCEEDED", 25);
  const double took = tu_now_s() - t0;
  usleep(500 * 1000); /* a measurement as the rank exited would have begun */
  /* and fsdpd still stops when asked, the call still out */
  const double s0 = tu_now_s();
  const int st = ok ? cluster_stop(&node[0], SIGTERM) : -1;
  const double stop_s = tu_now_s() - s0;
  unlink(hang); /* the pool thread returns */
  cr_assert(ok, "the job's rank still waits for a measurement that never ends");
  cr_expect_gt(took, 5, "the rank did not wait for the measurement (%.1f s)", took);
  cr_expect_eq(lines_of(retains), 2, "contexts retained: %d, not 2 (as fsdpd started, and the "
               "measurement given up)", lines_of(retains));
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0 && stop_s < 10, "fsdpd did not stop on "
            "SIGTERM: status %d after %.1f s", st, stop_s);
  expect_log(0, "cuda:0: measuring its free memory has taken 10 s: the driver does not answer",
             "fsdpd does not say the driver hangs");
  expect_log(0, "stopped, leaving a GPU measurement the driver never answered",
             "fsdpd does not say what it left");
  /* again (a node of another name: registered is this fsdpd), stopped
   * while the measurement hangs: once it is given up */
  unlink(mark);
  cluster_fsdpd_spawn_on(&node[0], coord.addr, "gpu2", "cuda", extra, a);
  cluster_wait_alive(coord.addr, "gpu2");
  const int before = lines_of(retains);
  tu_write_file(hang, "", 0);
  for (int k = 0; k < 100 && lines_of(retains) == before; k++) usleep(50 * 1000);
  cr_assert_gt(lines_of(retains), before, "fsdpd does not measure its GPU again");
  const double s1 = tu_now_s();
  const int st2 = cluster_stop(&node[0], SIGTERM);
  const double stop2_s = tu_now_s() - s1;
  unlink(hang);
  cr_expect(WIFEXITED(st2) && WEXITSTATUS(st2) == 0 && stop2_s < 14, "fsdpd did not stop on "
            "SIGTERM during a hung measurement: status %d after %.1f s", st2, stop2_s);
  free(conf), free(prog), free(hang), free(mark), free(retains);
}

/* A GPU job through the whole service, on emulated GPUs (the CUDA plugin
 * and NCCL built on tests/cuda/emu, and the fake driver for fsdpd's
 * inventory): fsdpd finds 4 GPUs, probes that its ranks can use them, the
 * coordinator places a 4-rank HYBRID_SHARD 2 x 2 job on them, each rank
 * takes its own GPU (FSDP_CUDA_DEVICE) and the ranks reduce through NCCL's
 * world, shard and replica groups; the losses are fsdp-launch's for the
 * same job, step for step, and the comm plan is each rank's count. What a
 * user with a GPU node does first; skipped where nvcc did not build the
 * emulator. */
Test(cluster, a_hybrid_cuda_job_on_four_emulated_gpus_trains_as_under_fsdp_launch) {
  if (node_start(0, "gpu", 4)) cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  const char *plugin = getenv("FSDP_CUDA_PLUGIN");
  char out[65536], a[256];
  cr_assert_eq(cluster_ctl(coord.addr, "nodes", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "cuda"), "the node's GPUs are not listed:\n%s", out);
  /* a GPU offers what is free with a context on it, not its total: the
   * fake GPU 0's 80 GiB less the 600 MiB held */
  cr_assert_eq(cluster_ctl(coord.addr, "--output json nodes", out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "85270200320") && !strstr(out, "85899345920"), "GPU 0's memory is not "
            "its free memory with a context on it:\n%s", out);
  expect_log(0, "cuda:0 (Fake GPU 0): 79.41 GiB free of 80.00 GiB with a CUDA context",
             "fsdpd does not say what GPU 0 offers");
  char *conf = job_file("gpu.conf", "steps = 4\ndevice = cuda\n[shard]\nstrategy = HYBRID_SHARD\n"
                        "mesh = 2x2\n");
  const char *job = submit(conf, "--ranks 4 --name gpu");
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  /* each rank on its own emulated GPU */
  for (int r = 0; r < 4; r++) {
    char want[64];
    snprintf(a, sizeof a, "logs %s --rank %d", job, r);
    cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
    snprintf(want, sizeof want, "cuda device %d: cuda_emu", r);
    cr_assert(strstr(out, want), "rank %d's log lacks \"%s\":\n%s", r, want, out);
  }
  char svc[4096], ref[4096];
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  losses(out, "step", svc, sizeof svc);
  char cmd[2 * PATH_MAX];
  snprintf(cmd, sizeof cmd, "-n 4 -- env FSDP_THREADS=1 CUDA_EMU_DEVICES=4 FSDP_CUDA_PLUGIN='%s' "
           "'%s/bin/fsdp-train' --config '%s'", plugin, tu_root(), conf);
  cr_assert_eq(tu_run_bin("fsdp-launch", cmd, out, sizeof out), 0, "%s", out);
  losses(out, "[rank 0] step", ref, sizeof ref);
  cr_assert_gt(strlen(ref), 0, "%s", out);
  cr_expect_str_eq(svc, ref, "losses under the service: %s\nunder fsdp-launch: %s", svc, ref);
  /* the plan's communicators (NCCL's buffers, as nccl_size.h estimates
   * them, for the world and the shard and replica groups split from it)
   * are what each rank counted */
  snprintf(a, sizeof a, "memory %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  for (int r = 0; r < 4; r++) {
    char planned[32], peak[32];
    memory_row(out, r, "comm", planned, peak, sizeof peak);
    cr_expect(peak[0] && !strcmp(planned, peak), "rank %d: comm planned %s MiB, peak %s MiB:\n%s",
              r, planned, peak, out);
  }
  free(conf);
}

/* A job of 3 steps whose sampling after training raises the activation
 * peak (a context-long window where the steps had seq_len 16): once it has
 * ended, `fsdpctl memory` shows each rank's run peaks with the final
 * figures, as rank 0's own closing line says them, also after the
 * coordinator restarted (before, every category showed 0.0: no status had
 * reached the coordinator, and a longer job showed the last step's peak). */
Test(cluster, fsdpctl_memory_shows_the_ranks_final_peaks_after_the_job) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *conf = job_file("short.conf", "steps = 3\nbatch = 1\nseq_len = 16\n[output]\n"
                                      "sample_tokens = 100\n");
  char job[32], out[65536], a[256], want[32], got[32];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2"));
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert(wait_state(job, "SUCCEEDED", 10), "%s", out);
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  const char *line = strstr(out, "mem (MiB):"), *acts = line ? strstr(line, " activations=") : NULL;
  cr_assert_not_null(acts, "rank 0's closing memory line:\n%s", out);
  snprintf(want, sizeof want, "%.*s", (int)strcspn(acts + 13, " \n"), acts + 13);
  const char *slash = strchr(want, '/');
  cr_assert_not_null(slash, "%s", want);
  memmove(want, slash + 1, strlen(slash)); /* its peak */
  for (int restarted = 0; restarted < 2; restarted++) {
    snprintf(a, sizeof a, "memory %s", job);
    cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
    memory_row(out, 0, "activations", NULL, got, sizeof got);
    cr_expect_str_eq(got, want, "rank 0's activation peak%s: fsdpctl memory %s, its log %s:\n%s",
                     restarted ? " after a restart" : "", got, want, out);
    memory_row(out, 1, "activations", NULL, got, sizeof got);
    cr_expect_str_eq(got, want, "rank 1's activation peak (the same job): %s:\n%s", got, out);
    if (restarted) break;
    char addr[64], db[600], extra[64];
    snprintf(addr, sizeof addr, "%s", coord.addr);
    snprintf(db, sizeof db, "%.*s", (int)(strlen(coord.log) - 4), coord.log);
    cluster_stop(&coord, SIGTERM);
    snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d", TIMEOUT_MS);
    cluster_coord_start(&coord, db, addr, extra);
  }
  free(conf);
}

/* A tester's 6-step job ended before any heartbeat carried a report of
 * its ranks: the watch's last line and `fsdpctl status` said loss 0.0000
 * and step 0 for both ranks (a perfect loss). Each rank's exit report
 * carries its final figures: after the end, status shows every rank at step
 * 6 with the loss rank 0's log ends with, and so does the watch. */
Test(cluster, status_after_a_short_job_shows_each_ranks_last_step_and_loss) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *conf = job_file("six.conf", "steps = 6\n");
  char job[32], out[65536], a[256], want[32];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2"));
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  char watch[65536];
  snprintf(watch, sizeof watch, "%s", out);
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  static const char last[] = "step     6/6 | loss ";
  const char *l = strstr(out, last);
  cr_assert_not_null(l, "rank 0's log:\n%s", out);
  l += strlen(last);
  snprintf(want, sizeof want, "%.*s", (int)strcspn(l, " "), l);
  char line[64];
  snprintf(line, sizeof line, "SUCCEEDED");
  const char *end = strstr(watch, line);
  cr_assert_not_null(end, "%s", watch);
  snprintf(line, sizeof line, "step 6/6 | loss %s |", want);
  cr_expect(strstr(end, line), "the watch's last line, not '%s':\n%s", line, watch);

  snprintf(a, sizeof a, "status %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  for (int r = 0; r < 2; r++) {
    char row[32], step[16], loss[16];
    snprintf(row, sizeof row, "\n   %d  ", r);
    const char *p = strstr(out, row);
    cr_assert_not_null(p, "rank %d:\n%s", r, out);
    cr_assert_eq(sscanf(p, " %*d %*s %*d EXITED %15s %15s", step, loss), 2, "%s", out);
    cr_expect_str_eq(step, "6", "rank %d:\n%s", r, out);
    cr_expect_str_eq(loss, want, "rank %d's loss, its log's %s:\n%s", r, want, out);
  }
  snprintf(a, sizeof a, "--output json status %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  /* each rank's "step", "loss" and "tokens_per_s" (the job's own "step" first) */
  int ranks = 0;
  for (const char *p = strstr(out, "\"ranks\""); p && (p = strstr(p, "\"step\": ")); p++, ranks++) {
    double loss = -1, speed = -1;
    const char *lp = strstr(p, "\"loss\": "), *tp = strstr(p, "\"tokens_per_s\": ");
    cr_expect(!strncmp(p, "\"step\": 6,", 10), "rank %d: %.20s\n%s", ranks, p, out);
    cr_expect(lp && sscanf(lp + 8, "%lf", &loss) == 1 && fabs(loss - strtod(want, NULL)) < 1e-4,
              "rank %d's loss, its log's %s:\n%s", ranks, want, out);
    cr_expect(tp && sscanf(tp + 16, "%lf", &speed) == 1 && speed > 0, "rank %d:\n%s", ranks, out);
  }
  cr_expect_eq(ranks, 2, "%s", out);
  free(conf);
}

Test(cluster, three_jobs_on_four_devices_the_third_waits_and_cancel_frees_devices) {
  cluster_fsdpd_start(&node[0], coord.addr, "quad", 4, NULL);
  char *conf = job_file("long.conf", "steps = 100000\n");
  char a_id[32], b_id[32], x_id[32], out[8192];
  snprintf(a_id, sizeof a_id, "%s", submit(conf, "--ranks 2"));
  snprintf(b_id, sizeof b_id, "%s", submit(conf, "--ranks 2"));
  snprintf(x_id, sizeof x_id, "%s", submit(conf, "--ranks 2"));
  cr_assert(wait_state(a_id, "RUNNING", 10));
  cr_assert(wait_state(b_id, "RUNNING", 10));
  cr_assert_str_eq(state_of(x_id, out, sizeof out), "PENDING");
  cr_expect(strstr(out, "waiting for 2 free cpu devices"), "%s", out);
  /* the ranks run: wait until both report steps, so the cancel stops working ranks */
  char a[256], dir[700];
  snprintf(a, sizeof a, "cancel %s", a_id);
  snprintf(dir, sizeof dir, "%s/quad/jobs/%s", tu_tmpdir(), a_id);
  struct stat sb;
  const double d0 = tu_now_s();
  while (stat(dir, &sb) && tu_now_s() - d0 < 10) nanosleep(&(struct timespec){0, 20000000}, NULL);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  const double gone = cluster_wait_gone(dir, 10);
  cr_expect(gone >= 0 && gone < 2.0, "the cancelled ranks took %.2f s to go", gone);
  cr_expect(wait_state(x_id, "RUNNING", 5), "the waiting job starts on the freed devices");
  free(conf);
}

Test(cluster, a_killed_fsdpd_is_declared_dead_and_its_job_restarts) {
  cluster_fsdpd_start(&node[0], coord.addr, "alpha", 2, NULL);
  cluster_fsdpd_start(&node[1], coord.addr, "beta", 2, NULL);
  char *conf = job_file("long.conf", "steps = 100000\n[shard]\nstrategy = HYBRID_SHARD\nmesh = 2x2\n");
  const char *job = submit(conf, "--ranks 4 --max-restarts 1");
  cr_assert(wait_state(job, "RUNNING", 10));
  char out[8192], dir[700];
  /* training: rank logs exist on both nodes */
  snprintf(dir, sizeof dir, "%s/alpha/jobs/%s", tu_tmpdir(), job);
  struct stat sb;
  const double d0 = tu_now_s();
  while (stat(dir, &sb) && tu_now_s() - d0 < 10) nanosleep(&(struct timespec){0, 20000000}, NULL);
  nanosleep(&(struct timespec){0, 500000000}, NULL);
  const double t0 = tu_now_s();
  cluster_stop(&node[1], SIGKILL);
  /* beta is declared dead within the timeout + 2 s (1 s for the last
   * heartbeat's hold and the tick, 1 s for stalls of a loaded machine's
   * coordinator, which it does not count as beta's silence) */
  double dead = -1;
  while (tu_now_s() - t0 < TIMEOUT_MS / 1000.0 + 4) {
    cluster_ctl(coord.addr, "nodes", out, sizeof out);
    char *b = strstr(out, "beta");
    char *eol = b ? strchr(b, '\n') : NULL;
    if (b && strstr(b, "DEAD") && (!eol || strstr(b, "DEAD") < eol)) {
      dead = tu_now_s() - t0;
      break;
    }
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  }
  cr_expect(dead >= 0 && dead < TIMEOUT_MS / 1000.0 + 2.0, "beta declared dead after %.2f s:\n%s",
            dead, out);
  /* the job left RUNNING (its ranks on alpha saw their peers go, or the
   * node's death failed it), and waits to restart (max_restarts 1): beta's
   * devices are not used, it stopped beating */
  int pending = wait_state(job, "PENDING", 3);
  state_of(job, out, sizeof out);
  cr_assert(pending, "%s", out);
  nanosleep(&(struct timespec){0, 500000000}, NULL);
  cr_assert_str_eq(state_of(job, out, sizeof out), "PENDING", "%s", out);
  char a[128];
  snprintf(a, sizeof a, "--output json status %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_expect(strstr(out, "\"restarts\": 1"), "%s", out);
  cr_expect(strstr(out, "restarting after attempt failed") &&
                (strstr(out, "declared dead") || strstr(out, "rank ")), "%s", out);
  /* it waits out beta's fence first (beta's ranks might live, cut off),
   * then for devices: either way the wait names why */
  cr_expect(strstr(out, "on dead nodes") || strstr(out, "its fence"),
            "the wait names the dead node's fence or devices:\n%s", out);
  /* alpha's ranks of the job are stopped; beta's died with their fsdpd */
  cr_expect_geq(cluster_wait_gone(dir, 10), 0, "alpha's ranks still run");
  snprintf(dir, sizeof dir, "%s/beta/jobs/%s", tu_tmpdir(), job);
  cr_expect_geq(cluster_wait_gone(dir, 5), 0, "beta's ranks outlived their fsdpd");
  free(conf);
}

Test(cluster, a_restarted_coordinator_lets_the_running_job_finish) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *conf = job_file("mid.conf", "steps = 1500\n");
  char job[32], out[16384], a[256];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2"));
  cr_assert(wait_state(job, "RUNNING", 10));
  nanosleep(&(struct timespec){0, 500000000}, NULL);
  char addr[64], db[600];
  snprintf(addr, sizeof addr, "%s", coord.addr);
  snprintf(db, sizeof db, "%.*s", (int)(strlen(coord.log) - 4), coord.log);
  cluster_stop(&coord, SIGKILL);
  nanosleep(&(struct timespec){0, 300000000}, NULL);
  char extra[64];
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d", TIMEOUT_MS);
  cluster_coord_start(&coord, db, addr, extra);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  snprintf(a, sizeof a, "--output json status %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_expect(strstr(out, "\"attempt\": 1"), "the job carried on in its first attempt:\n%s", out);
  cluster_stop(&coord, SIGTERM);
  cluster_db_check(db);
  free(conf);
}

/* The event ids in text (fsdpctl events -o json: one object a line, or an
 * array), in order, into ids (at most max); how many. */
static int event_ids(const char *text, long long *ids, int max) {
  int n = 0;
  for (const char *p = text; n < max && (p = strstr(p, "\"id\":")); p += 5)
    ids[n++] = strtoll(p + 5, NULL, 10);
  return n;
}

/* The coordinator stopped (SIGTERM) under a watch and an events --follow
 * and started again 3 s later: both carry on and end with the job (exit 0),
 * the events printed once each, as the job's whole listing has them. Before,
 * the watch kept failing while the coordinator served again, and events
 * --follow exited 4 at the first break (found by a tester). */
Test(cluster, a_watch_and_events_follow_outlive_a_coordinator_restart) {
  char addr[64], db[600], extra[128], job[32], cmd[2048];
  snprintf(addr, sizeof addr, "%s", coord.addr);
  snprintf(db, sizeof db, "%.*s", (int)(strlen(coord.log) - 4), coord.log);
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d --restart-grace-ms %d", TIMEOUT_MS,
           30000 * TU_SLOW);
  cluster_stop(&coord, SIGTERM); /* again with a grace past the outage */
  cluster_coord_start(&coord, db, addr, extra);
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *conf = job_file("restart.conf", "steps = 3000\n");
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2"));
  cr_assert(wait_state(job, "RUNNING", 10));
  char *wf = tu_path("watch.txt"), *ef = tu_path("events.txt"), *eerr = tu_path("events.err");
  snprintf(cmd, sizeof cmd, "exec '%s/bin/fsdpctl' --coordinator %s watch %s >'%s' 2>&1", tu_root(),
           addr, job, wf);
  cluster_proc_t w = {.pid = cluster_run(cmd)};
  snprintf(cmd, sizeof cmd, "exec '%s/bin/fsdpctl' --coordinator %s events %s --follow --limit 5000 "
           "-o json >'%s' 2>'%s'", tu_root(), addr, job, ef, eerr);
  cluster_proc_t e = {.pid = cluster_run(cmd)};
  nanosleep(&(struct timespec){1, 0}, NULL);
  cluster_stop(&coord, SIGTERM);
  nanosleep(&(struct timespec){3, 0}, NULL);
  cluster_coord_start(&coord, db, addr, extra);
  const int ws = cluster_wait_exit(&w, 120 * TU_SLOW), es = cluster_wait_exit(&e, 120 * TU_SLOW);
  char *wout = tu_slurp(wf, NULL), *eout = tu_slurp(ef, NULL), *eerrs = tu_slurp(eerr, NULL);
  cr_assert(ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "watch: status 0x%x:\n%s", ws, wout);
  cr_assert(es >= 0 && WIFEXITED(es) && WEXITSTATUS(es) == 0, "events: status 0x%x:\n%s", es, eerrs);
  cr_expect(strstr(wout, "SUCCEEDED") && strstr(wout, "broke"), "%s", wout);
  static char all[1 << 20];
  snprintf(cmd, sizeof cmd, "--output json events %s --limit 5000", job);
  cr_assert_eq(cluster_ctl(coord.addr, cmd, all, sizeof all), 0, "%s", all);
  long long got[512], want[512];
  const int ng = event_ids(eout, got, 512), nw = event_ids(all, want, 512);
  cr_expect_eq(ng, nw, "%d events followed, %d listed:\n%s", ng, nw, eout);
  for (int i = 0; i < ng && i < nw; i++)
    cr_expect_eq(got[i], want[i], "event %d: id %lld followed, %lld listed", i, got[i], want[i]);
  free(wout), free(eout), free(eerrs), free(wf), free(ef), free(eerr), free(conf);
}

/* step-N directories under root that hold a manifest, the first in *first (-1: none). */
static int committed_steps(const char *root, int steps, int every, int *first_odd) {
  int n = 0;
  *first_odd = -1;
  for (int step = 1; step <= steps; step++) {
    char man[800];
    snprintf(man, sizeof man, "%s/step-%08d/manifest.json", root, step);
    if (access(man, F_OK)) continue;
    n++;
    if (step % every && *first_odd < 0) *first_odd = step;
  }
  return n;
}

/* Compares the step's shard files of two checkpoint roots, byte for byte,
 * but for the run's id in the header (bytes 136..143) and so the header's
 * checksum (its last 8 bytes; the header's length is at byte 24): two runs
 * write the same bytes under their own ids (docs/FORMATS.md). */
static void shards_identical(const char *a, const char *b, int step, int S) {
  for (int j = 0; j < S; j++) {
    char pa[900], pb[900];
    snprintf(pa, sizeof pa, "%s/step-%08d/shard-%05d-of-%05d.fsdp", a, step, j, S);
    snprintf(pb, sizeof pb, "%s/step-%08d/shard-%05d-of-%05d.fsdp", b, step, j, S);
    FILE *fa = fopen(pa, "rb"), *fb = fopen(pb, "rb");
    cr_assert(fa && fb, "%s or %s missing", pa, pb);
    long n = 0, hl = 0;
    int ca, cb;
    do {
      ca = fgetc(fa), cb = fgetc(fb);
      if (n >= 24 && n < 32 && ca != EOF) hl |= (long)ca << (8 * (n - 24));
      const int run = n >= 136 && n < 144, sum = n >= 32 && n >= hl - 8 && n < hl;
      if (!run && !sum) cr_assert_eq(ca, cb, "%s and %s differ at byte %ld", pa, pb, n);
      n++;
    } while (ca != EOF && cb != EOF);
    cr_assert_eq(ca, cb, "%s and %s differ in length", pa, pb);
    fclose(fa), fclose(fb);
  }
}

/* A checkpoint root the ranks' user writes (name) and one for the
 * reference run (name-ref), in the test's directory. */
static void ckpt_roots(const char *name, char **ck, char **ref) {
  char r[128];
  snprintf(r, sizeof r, "%s-ref", name);
  *ck = tu_path(name), *ref = tu_path(r);
  cr_assert_eq(mkdir(*ck, 0777), 0);
  chmod(*ck, 0777); /* the ranks' user writes there */
  cr_assert_eq(mkdir(*ref, 0755), 0);
}

/* A 2-rank job of `steps` steps (extra: more [train] lines) checkpointed
 * every `every` into a fresh root name (*ck; its uninterrupted twin's in
 * *ref), submitted with opts and running: its job file (the caller frees
 * it, and *ck and *ref), its id in job (32 bytes). */
static char *ckpt_job(const char *name, int steps, const char *extra, int every, const char *opts,
                      char **ck, char **ref, char *job) {
  char text[1024], file[160];
  ckpt_roots(name, ck, ref);
  snprintf(text, sizeof text, "steps = %d\n%s[output]\ncheckpoint_dir = %s\ncheckpoint_every = %d\n",
           steps, extra, *ck, every);
  snprintf(file, sizeof file, "%s.conf", name);
  char *conf = job_file(file, text);
  snprintf(job, 32, "%s", submit(conf, opts));
  cr_assert(wait_state(job, "RUNNING", 10));
  return conf;
}

/* The job file run uninterrupted by fsdp-launch (2 ranks) into ref: its
 * step's shards must be those the service wrote into ck, byte for byte. */
static void matches_uninterrupted(const char *conf, const char *ck, const char *ref, int step) {
  static char out[1 << 16];
  char a[2048];
  setenv("FSDP_PROGRESS_EVERY", "500", 1); /* a progress line per 500 steps: the output fits */
  snprintf(a, sizeof a, "-n 2 -- %s/bin/fsdp-train --config %s --checkpoint_dir %s", tu_root(),
           conf, ref);
  cr_assert_eq(tu_run_bin("fsdp-launch", a, out, sizeof out), 0, "%s", out);
  shards_identical(ck, ref, step, 2);
}

/* The job of `steps` steps (extra: more [train] lines) on the node "solo",
 * checkpointed every `every`: a rank SIGKILLed once the first checkpoint
 * committed, the job restarted once and resumed, ending with the bytes of
 * the uninterrupted run. */
static void killed_rank_resumes(const char *extra, int steps, int every) {
  char *ck, *ref, a[2048], job[32];
  static char out[1 << 16];
  char *conf = ckpt_job("ck-service", steps, extra, every, "--ranks 2 --max-restarts 1", &ck, &ref, job);
  /* the first checkpoint committed, then a rank killed */
  char man[800], dir[700];
  snprintf(man, sizeof man, "%s/step-%08d/manifest.json", ck, every);
  cluster_wait_file(man, 30);
  snprintf(dir, sizeof dir, "%s/solo/jobs/%s", tu_tmpdir(), job);
  pid_t victim = cluster_pid_under(dir);
  cr_assert_gt(victim, 0, "no rank process under %s", dir);
  cr_assert_eq(kill(victim, SIGKILL), 0);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  snprintf(a, sizeof a, "--output json status %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_assert(strstr(out, "\"restarts\": 1"), "the job did not restart once:\n%s", out);
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_assert(strstr(out, "resumed from"), "attempt 2 did not resume:\n%s", out);
  /* the coordinator committed (the ranks reported their shards through fsdpd) */
  FILE *lf = fopen(coord.log, "r");
  cr_assert_not_null(lf, "%s", coord.log);
  int committed = 0;
  char line[1024], said[64];
  snprintf(said, sizeof said, "checkpoint of step %d committed", steps);
  while (fgets(line, sizeof line, lf)) committed |= strstr(line, said) != NULL;
  fclose(lf);
  cr_assert(committed, "the coordinator's log (%s) does not say \"%s\"", coord.log, said);
  /* the coordinator committed; retention kept the newest 3 (keep_checkpoints) */
  snprintf(a, sizeof a, "checkpoints %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  char last[16];
  snprintf(last, sizeof last, "%d", steps);
  cr_assert(strstr(out, last) && strstr(out, "COMMITTED") && strstr(out, "2/2"), "%s", out);
  int dirs = -1;
  for (const double w0 = tu_now_s(); tu_now_s() - w0 < 5; nanosleep(&(struct timespec){0, 50000000}, NULL)) {
    dirs = 0;
    for (int step = every; step <= steps; step += every) {
      snprintf(man, sizeof man, "%s/step-%08d", ck, step);
      dirs += access(man, F_OK) == 0;
    }
    if (dirs == 3) break;
  }
  cr_assert_eq(dirs, 3, "%d step directories left, keep_checkpoints is 3:\n%s", dirs, out);
  for (int step = steps - 2 * every; step <= steps; step += every) {
    snprintf(man, sizeof man, "%s/step-%08d/manifest.json", ck, step);
    cr_assert_eq(access(man, F_OK), 0, "%s missing", man);
  }
  matches_uninterrupted(conf, ck, ref, steps);
  free(ck), free(ref), free(conf);
}

/* A coordinator away (SIGKILL, back 4 s later) for longer than a shard
 * report's round of tries (about 1.6 s) while the ranks checkpoint: the
 * reports wait and are tried again, so every checkpoint whose shards were
 * all written commits once it is back (before, those of the outage were
 * given up: whole shards, never committed, never cleaned), but for those
 * fsdpd dropped, saying so, past 16 waiting a rank (the oldest go). */
Test(cluster, checkpoints_written_while_the_coordinator_is_away_commit_when_it_is_back) {
  char addr[64], db[600], extra[128];
  /* a restart grace (each node's fence) far past the outage, however long
   * the coordinator takes to start again on a loaded machine */
  snprintf(addr, sizeof addr, "%s", coord.addr);
  snprintf(db, sizeof db, "%.*s", (int)(strlen(coord.log) - 4), coord.log);
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d --restart-grace-ms %d", TIMEOUT_MS,
           30000 * TU_SLOW);
  cluster_stop(&coord, SIGTERM);
  cluster_coord_start(&coord, db, addr, extra);
  const mode_t mask = umask(022); /* a shell's: the daemons make their own stricter */
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  umask(mask);
  char *ck, *ref, text[1024], out[16384], a[256], man[800];
  ckpt_roots("ck-away", &ck, &ref);
  snprintf(text, sizeof text, "steps = 4000\n[output]\ncheckpoint_dir = %s\ncheckpoint_every = 200\n"
           "keep_checkpoints = 0\n", ck);
  char *conf = job_file("away.conf", text);
  char job[32];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2"));
  snprintf(man, sizeof man, "%s/step-00000200/manifest.json", ck);
  cluster_wait_file(man, 30);
  const time_t away = time(NULL);
  cluster_stop(&coord, SIGKILL);
  /* (longer where the programs are slower: a checkpoint must fall in it) */
  nanosleep(&(struct timespec){4 * TU_SLOW, 0}, NULL);
  const time_t back = time(NULL);
  cluster_coord_start(&coord, db, addr, extra);
  snprintf(a, sizeof a, "watch %s", job);
  char *log = NULL;
  if (cluster_ctl(coord.addr, a, out, sizeof out)) {
    log = tu_slurp(node[0].log, NULL);
    cr_assert_fail("%s\nfsdpd's log:\n%s", out, log);
  }
  log = tu_slurp(node[0].log, NULL);
  int whole = 0, in_outage = 0, dropped = 0;
  for (int step = 200; step <= 4000; step += 200) {
    char sh[2][900], drop[64];
    struct stat st[2];
    for (int j = 0; j < 2; j++)
      snprintf(sh[j], sizeof sh[j], "%s/step-%08d/shard-%05d-of-00002.fsdp", ck, step, j);
    snprintf(man, sizeof man, "%s/step-%08d/manifest.json", ck, step);
    if (stat(sh[0], &st[0]) || stat(sh[1], &st[1])) continue;
    whole++;
    snprintf(drop, sizeof drop, "step %d's is dropped", step);
    if (access(man, F_OK) && strstr(log, drop)) {
      dropped++;
      continue;
    }
    cr_expect_eq(access(man, F_OK), 0, "step %d: both shards written, never committed", step);
    in_outage += st[0].st_mtime >= away && st[1].st_mtime <= back;
    /* the ranks' shards are never for every user of the host, whatever
     * umask fsdpd was started with */
    cr_expect(!(st[0].st_mode & 0007) && !(st[1].st_mode & 0007), "step %d: shard modes %04o, %04o",
              step, (unsigned)(st[0].st_mode & 07777), (unsigned)(st[1].st_mode & 07777));
  }
  printf("coordinator away %d s: %d checkpoints written, %d of them in the outage and committed "
         "after, %d dropped (16 waiting a rank)\n", 4 * TU_SLOW, whole, in_outage, dropped);
  cr_expect_gt(in_outage, 0, "no checkpoint was written while the coordinator was away");
  free(log);
  cluster_stop(&coord, SIGTERM);
  free(ck), free(ref), free(conf);
}

/* A coordinator away past its nodes' fence (the restart grace, 3 s here):
 * fsdpd stops the ranks as its fence says, reports them fenced once the
 * coordinator is back, and the job (max_restarts 0) is requeued without
 * spending a restart, resuming from its last checkpoint to an uninterrupted
 * run's bytes. Before, such an outage ended every job FAILED, "killed by
 * signal 9" (an outside tester). */
Test(cluster, an_outage_past_the_fence_requeues_its_jobs_without_a_restart) {
  char addr[64], db[600], extra[128];
  snprintf(addr, sizeof addr, "%s", coord.addr);
  snprintf(db, sizeof db, "%.*s", (int)(strlen(coord.log) - 4), coord.log);
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d --restart-grace-ms %d", TIMEOUT_MS, 3000);
  cluster_stop(&coord, SIGTERM);
  cluster_coord_start(&coord, db, addr, extra);
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *ck, *ref, a[2048], job[32], man[800];
  static char out[1 << 16];
  char *conf = ckpt_job("ck-fence", 3000, "", 300, "--ranks 2 --max-restarts 0", &ck, &ref, job);
  snprintf(man, sizeof man, "%s/step-00000300/manifest.json", ck);
  cluster_wait_file(man, 30);
  cluster_stop(&coord, SIGKILL);
  /* past the fence: fsdpd stops the ranks */
  for (const double t0 = tu_now_s(); tu_now_s() - t0 < 20 * TU_SLOW; nanosleep(&(struct timespec){0, 100000000}, NULL)) {
    char *l = tu_slurp(node[0].log, NULL);
    const int fenced = l && strstr(l, "this node's ranks are stopped") != NULL;
    free(l);
    if (fenced) break;
  }
  char dir[700];
  snprintf(dir, sizeof dir, "%s/solo/jobs/%s", tu_tmpdir(), job);
  for (const double t0 = tu_now_s(); cluster_pid_under(dir) > 0 && tu_now_s() - t0 < 10 * TU_SLOW;)
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  cr_assert_eq(cluster_pid_under(dir), 0, "the ranks outlived the fence:\n%s", tu_slurp(node[0].log, NULL));
  cluster_coord_start(&coord, db, addr, extra);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  snprintf(a, sizeof a, "--output json status %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_assert(strstr(out, "\"restarts\": 0") && strstr(out, "SUCCEEDED"), "%s", out);
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_assert(strstr(out, "resumed from"), "the requeued attempt began again:\n%.2000s", out);
  matches_uninterrupted(conf, ck, ref, 3000);
  cluster_stop(&coord, SIGTERM);
  free(ck), free(ref), free(conf);
}

/* A rank killed (SIGKILL) after a committed checkpoint: the attempt fails,
 * the job restarts (max_restarts 1), its ranks resume from the latest
 * committed checkpoint (auto_resume), and the job ends with the bytes of the
 * same job run without interruption under fsdp-launch: step 3000's shard
 * files (parameters, AdamW state, step, data position) are identical. */
Test(cluster, a_killed_rank_resumes_from_the_last_checkpoint_exactly) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  killed_rank_resumes("", 3000, 300);
}

/* The same on two emulated GPUs: the rank that dies takes its NCCL
 * communicators with it, the other's ops fail or are stopped by fsdpd,
 * and the restarted ranks make new ones and resume exactly. */
Test(cluster, a_killed_rank_of_a_cuda_job_resumes_exactly) {
  if (node_start(0, "solo", 2)) cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  killed_rank_resumes("device = cuda\n", 60, 10);
}

/* The line of `fsdpctl checkpoints` output out that lists step's directory
 * (static; "" when none). */
static const char *ckpt_line(const char *out, int step) {
  static char line[1024];
  char dir[32];
  snprintf(dir, sizeof dir, "/step-%08d", step);
  const char *p = strstr(out, dir), *b = p;
  line[0] = 0;
  if (!p) return line;
  while (b > out && b[-1] != '\n') b--;
  snprintf(line, sizeof line, "%.*s", (int)strcspn(b, "\n"), b);
  return line;
}

/* A checkpoint_dir the ranks can no longer write (made read-only once the
 * first checkpoint committed): each rank says, through its fsdpd, that its
 * shard was not written, and the coordinator aborts each later checkpoint
 * with the rank and the error as the reason, logged, while the job trains
 * on to the end. Without those reports the coordinator never heard of
 * them: no row, no event, no log line, and a job that succeeded with its
 * last checkpoints missing said nothing (--checkpoint-timeout-ms is 5
 * minutes here; the end of the attempt aborts only checkpoints it has
 * heard of). */
Test(cluster, a_checkpoint_the_ranks_cannot_write_is_aborted_with_their_error) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *ck, *ref, a[256], job[32];
  static char out[1 << 16];
  char *conf = ckpt_job("ck-ro", 1200, "", 300, "--ranks 2", &ck, &ref, job);
  char man[800];
  snprintf(man, sizeof man, "%s/step-00000300/manifest.json", ck);
  cluster_wait_file(man, 30);
  cr_assert_eq(chmod(ck, 0555), 0); /* no new step directory (the ranks are not root) */
  /* a step whose directory a rank made before that (a loaded machine lets
   * the ranks run ahead of the commit) may still commit: only later ones
   * are held to the abort */
  int first = 600;
  for (char d[800];; first += 300) {
    snprintf(d, sizeof d, "%s/step-%08d", ck, first);
    if (access(d, F_OK)) break;
  }
  cr_assert_leq(first, 900, "the job outran the test: steps up to %d made before the chmod", first - 300);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert_str_eq(state_of(job, out, sizeof out), "SUCCEEDED", "%s", out);
  snprintf(a, sizeof a, "checkpoints %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_expect(strstr(ckpt_line(out, 300), "COMMITTED"), "%s", out);
  for (int step = first; step <= 1200; step += 300) {
    const char *l = ckpt_line(out, step);
    cr_expect(strstr(l, "ABORTED") && strstr(l, "could not write its shard") &&
              strstr(l, "cannot create") && strstr(l, "rank "), "step %d:\n%s", step, out);
    char dir[800];
    snprintf(dir, sizeof dir, "%s/step-%08d", ck, step);
    cr_expect_neq(access(dir, F_OK), 0, "%s was made", dir);
  }
  FILE *lf = fopen(coord.log, "r");
  cr_assert_not_null(lf, "%s", coord.log);
  int said = 0;
  char line[1024];
  while (fgets(line, sizeof line, lf))
    said += strstr(line, "WARN") && strstr(line, "aborted: rank ") &&
            strstr(line, "could not write its shard");
  fclose(lf);
  const int aborts = (1200 - first) / 300 + 1;
  cr_expect_eq(said, aborts, "the coordinator's log (%s) says %d of %d aborts", coord.log, said,
               aborts);
  chmod(ck, 0777);
  free(ck), free(ref), free(conf);
}

/* The tester's defect under the service: rank 0's shard of step 600 meets
 * ENOSPC (tests/e2e/fs_shim.c), rank 1's is written; on a nearly full disk
 * that shard kept its space until the job ended and failed every later
 * checkpoint. The coordinator removes step 600 as soon as both ranks have
 * reported it, while the job runs, and the later steps commit. */
Test(cluster, a_checkpoint_a_rank_could_not_write_goes_while_the_job_runs) {
  setenv("LD_PRELOAD", tu_fs_shim(), 1), setenv("ENOSPC_MATCH", "step-00000600/.shard-00000", 1);
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  unsetenv("LD_PRELOAD"), unsetenv("ENOSPC_MATCH");
  char *ck, *ref, a[256], job[32], dir[800];
  static char out[1 << 16];
  char *conf = ckpt_job("ck-full", 1200, "", 300, "--ranks 2", &ck, &ref, job);
  snprintf(dir, sizeof dir, "%s/step-00000900/manifest.json", ck);
  cluster_wait_file(dir, 60);
  snprintf(dir, sizeof dir, "%s/step-00000600", ck);
  cr_expect_neq(access(dir, F_OK), 0, "%s is there as step 900 commits", dir);
  char *log = tu_slurp(coord.log, NULL);
  snprintf(a, sizeof a, "aborted checkpoint of step 600 removed (while its attempt runs");
  cr_expect(log && strstr(log, a), "the coordinator's log (%s) does not say \"%s\"", coord.log, a);
  free(log);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert_str_eq(state_of(job, out, sizeof out), "SUCCEEDED", "%s", out);
  snprintf(a, sizeof a, "checkpoints %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  const char *l = ckpt_line(out, 600);
  cr_expect(strstr(l, "ABORTED") && strstr(l, "rank 0 could not write its shard") &&
            strstr(l, "No space left on device"), "%s", out);
  for (int step = 900; step <= 1200; step += 300)
    cr_expect(strstr(ckpt_line(out, step), "COMMITTED"), "step %d:\n%s", step, out);
  free(ck), free(ref), free(conf);
}

/* The pid in a rank's temporary shard name under root (".shard-J-of-S.fsdp.tmp.PID"),
 * and its step, while one is being written; 0 when none is. */
static pid_t shard_writer(const char *root, int *step) {
  DIR *d = opendir(root);
  pid_t pid = 0;
  for (struct dirent *e; d && !pid && (e = readdir(d));) {
    int st;
    if (sscanf(e->d_name, "step-%d", &st) != 1) continue;
    char sub[900];
    snprintf(sub, sizeof sub, "%s/%s", root, e->d_name);
    DIR *s = opendir(sub);
    for (struct dirent *f; s && !pid && (f = readdir(s));) {
      const char *t = strstr(f->d_name, ".tmp.");
      if (f->d_name[0] == '.' && t && !strncmp(f->d_name, ".shard-", 7)) pid = atoi(t + 5), *step = st;
    }
    if (s) closedir(s);
  }
  if (d) closedir(d);
  return pid;
}

/* A rank SIGKILLed while it writes its shard: that checkpoint never
 * commits, the attempt fails, the restarted one resumes from the checkpoint
 * before (the half-written one is never loaded), and the job ends with the
 * bytes of an uninterrupted run. */
Test(cluster, a_rank_killed_while_writing_its_shard_resumes_from_the_previous_checkpoint) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *ck, *ref, text[1024], a[2048];
  static char out[1 << 16];
  ckpt_roots("ck-midwrite", &ck, &ref);
  /* the small preset: a shard of ~19 MB takes long enough to be caught writing */
  snprintf(text, sizeof text, "steps = 300\neval_batches = 2\n[model]\nmodel = small\n[output]\n"
           "checkpoint_dir = %s\ncheckpoint_every = 30\n", ck);
  char *conf = job_file("midwrite.conf", text);
  char job[32];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2 --max-restarts 1"));
  char man[800];
  snprintf(man, sizeof man, "%s/step-00000030/manifest.json", ck);
  cluster_wait_file(man, 60);
  int killed_step = 0;
  pid_t writer = 0;
  for (const double t0 = tu_now_s(); !writer && tu_now_s() - t0 < 30 * TU_SLOW;) {
    writer = shard_writer(ck, &killed_step);
    if (!writer) nanosleep(&(struct timespec){0, 500000}, NULL);
  }
  cr_assert_gt(writer, 0, "no shard caught being written within 30 s");
  cr_assert_eq(kill(writer, SIGKILL), 0, "pid %d", writer);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  snprintf(a, sizeof a, "--output json status %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_assert(strstr(out, "\"restarts\": 1"), "%s", out);
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  const char *r = strstr(out, "resumed from ");
  cr_assert_not_null(r, "attempt 2 did not resume:\n%.3000s", out);
  int from = -1;
  const char *at = strstr(r, " at step ");
  cr_assert(at && sscanf(at, " at step %d", &from) == 1, "%s", r);
  cr_assert(from >= 30 && from < killed_step, "resumed at step %d; the shard of step %d was being "
            "written when its rank was killed", from, killed_step);
  matches_uninterrupted(conf, ck, ref, 300);
  free(ck), free(ref), free(conf);
}

/* Waits (bounded) until rank 0 of the job logged step `step` or later. */
static int wait_step(const char *job, int step, double timeout_s) {
  static char out[1 << 16];
  char a[128];
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  for (const double t0 = tu_now_s(); tu_now_s() - t0 < timeout_s * TU_SLOW;) {
    cluster_ctl(coord.addr, a, out, sizeof out);
    int last = 0, k;
    for (const char *p = out; (p = strstr(p, "step ")); p += 5)
      if ((p == out || p[-1] == '\n') && sscanf(p, "step %d/", &k) == 1 && k > last) last = k;
    if (last >= step) return 1;
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  return 0;
}

/* A byte of step's shard 1 under ck flipped. */
static void shard_flip(const char *ck, int step) {
  char sh[900];
  snprintf(sh, sizeof sh, "%s/step-%08d/shard-00001-of-00002.fsdp", ck, step);
  struct stat st;
  cr_assert_eq(stat(sh, &st), 0, "%s", sh);
  FILE *f = fopen(sh, "r+b");
  cr_assert_not_null(f, "%s", sh);
  fseek(f, st.st_size / 2, SEEK_SET);
  const int c = fgetc(f);
  fseek(f, st.st_size / 2, SEEK_SET);
  fputc(c ^ 0x10, f);
  fclose(f);
}

/* The job of `steps` steps, checkpointed every `every`, preempted once
 * rank 0 logged step `at` (see below); with damage, the checkpoint of the
 * step it stopped at is damaged before it runs again: it resumes from the
 * committed one before, and the coordinator lists the damaged one as such. */
static void preempted_resumes(int gpu, int steps, int every, int at, int damage) {
  if (node_start(0, "first", 2 * gpu)) cr_skip_test("the emulated CUDA plugin is not built here (no nvcc)");
  char *ck, *ref, a[2048], job[32];
  static char out[1 << 16];
  char *conf = ckpt_job("ck-preempt", steps, gpu ? "device = cuda\n" : "", every,
                        "--ranks 2 --max-restarts 0", &ck, &ref, job);
  cr_assert(wait_step(job, at, 60), "rank 0 did not log step %d within %d s", at, 60 * TU_SLOW);
  const double stopped_at = tu_now_s();
  cluster_stop(&node[0], SIGTERM);
  /* its fsdpd said it stopped as it exited: the node is STOPPED at once,
   * not DEAD at the heartbeat timeout (no death: no alert, no fence) */
  cr_assert_eq(cluster_ctl(coord.addr, "nodes", out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "STOPPED") && !strstr(out, "DEAD"), "%.1f s after the SIGTERM:\n%s",
            tu_now_s() - stopped_at, out);
  cr_assert(wait_state(job, "PENDING", 10), "%s", state_of(job, out, sizeof out) ? out : "");
  snprintf(a, sizeof a, "--output json status %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_assert(strstr(out, "\"restarts\": 0") && strstr(out, "preempted"), "%s", out);
  cr_expect(strstr(out, "2 on nodes stopping or stopped") && !strstr(out, "dead nodes"),
            "the wait calls the stopped node's devices dead:\n%s", out);
  cluster_ctl(coord.addr, "events", out, sizeof out);
  cr_expect(strstr(out, "node.stopped") && !strstr(out, "node.dead"), "%s", out);
  int odd;
  cr_assert_geq(committed_steps(ck, steps, every, &odd), 1 + damage);
  cr_assert_gt(odd, every * damage, "no checkpoint of the step the job stopped at");
  const int from = damage ? odd / every * every : odd;
  if (damage) shard_flip(ck, odd);
  /* another node takes it, from that checkpoint */
  cr_assert_eq(node_start(1, "second", 2 * gpu), 0);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  char want[64];
  snprintf(want, sizeof want, "at step %d ", from);
  cr_assert(strstr(out, "resumed from") && strstr(out, want), "not resumed at step %d:\n%.2000s",
            from, out);
  cr_assert(!damage || strstr(out, "is damaged"), "%.2000s", out);
  if (damage) {
    snprintf(a, sizeof a, "checkpoints %s", job);
    cluster_ctl(coord.addr, a, out, sizeof out);
    const char *line = ckpt_line(out, odd);
    cr_expect(strstr(line, "ABORTED") && strstr(line, "damaged"), "step %d: %s\n%s", odd, line, out);
    cr_expect(strstr(ckpt_line(out, steps), "COMMITTED"), "%s", out);
  }
  matches_uninterrupted(conf, ck, ref, steps);
  if (damage) { /* its files go once the job has ended */
    char dir[800];
    snprintf(dir, sizeof dir, "%s/step-%08d", ck, odd);
    for (const double t0 = tu_now_s(); !access(dir, F_OK) && tu_now_s() - t0 < 10;)
      nanosleep(&(struct timespec){0, 50000000}, NULL);
    cr_expect_neq(access(dir, F_OK), 0, "the damaged %s is still there after the job ended", dir);
  }
  free(ck), free(ref), free(conf);
}

/* SIGTERM to the fsdpd of a running job (preemption): its ranks stop after
 * the same step, write a checkpoint of it, exit 75; the job goes back to
 * PENDING without spending a restart (max_restarts 0), runs on another node
 * from that checkpoint, and ends with the bytes of an uninterrupted run. */
Test(cluster, a_preempted_job_checkpoints_requeues_and_resumes_exactly) {
  preempted_resumes(0, 3000, 1000, 100, 0); /* stopped some steps later, before 1000 */
}

/* The same for a cuda job on emulated GPUs. */
Test(cluster, a_preempted_cuda_job_checkpoints_requeues_and_resumes_exactly) {
  preempted_resumes(1, 80, 40, 5, 0);
}

/* `fsdpctl resume` of a cancelled job: back to PENDING with its restarts
 * from zero, it continues from its latest committed checkpoint and ends
 * with the bytes of an uninterrupted run; a running job cannot be resumed. */
/* The newest committed checkpoint damaged while its job waits (a byte of a
 * shard flipped after a preemption): the next attempt finds it so, goes
 * back to the committed one before it, and tells the coordinator, which
 * lists it ABORTED as damaged (no longer the job's latest); the job ends
 * with the bytes of an uninterrupted run, and the damaged step's files go
 * once it has ended. */
Test(cluster, a_damaged_newest_checkpoint_is_committed_no_more_and_the_job_ends_exactly) {
  preempted_resumes(0, 3000, 100, 150, 1);
}

/* fsdpctl resume of job, watched to its end: rank 0's log in out. */
static void resumed_to_its_end(const char *job, char *out, size_t len) {
  char a[128];
  snprintf(a, sizeof a, "resume %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, len), 0, "%s", out);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, len), 0, "%s", out);
  snprintf(a, sizeof a, "logs %s --rank 0", job);
  cluster_ctl(coord.addr, a, out, len);
}

Test(cluster, a_cancelled_job_resumes_from_its_last_checkpoint) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *ck, *ref, text[1024], a[2048];
  static char out[1 << 16];
  ckpt_roots("ck-resume", &ck, &ref);
  snprintf(text, sizeof text, "steps = 3000\n[output]\ncheckpoint_dir = %s\ncheckpoint_every = 300\n",
           ck);
  char *conf = job_file("resume-cancel.conf", text);
  char job[32], man[800];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2"));
  cr_assert(wait_state(job, "RUNNING", 10));
  snprintf(a, sizeof a, "resume %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 2, "a running job was resumed:\n%s", out);
  char said[64]; /* by the id users know, not the store's row number */
  snprintf(said, sizeof said, "job %s is RUNNING", job);
  cr_assert(strstr(out, "only a FAILED or CANCELLED job") && strstr(out, said), "%s", out);
  snprintf(man, sizeof man, "%s/step-00000300/manifest.json", ck);
  cluster_wait_file(man, 30);
  snprintf(a, sizeof a, "cancel %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert(wait_state(job, "CANCELLED", 5));
  resumed_to_its_end(job, out, sizeof out);
  cr_assert(strstr(out, "resumed from"), "the resumed attempt began again:\n%.2000s", out);
  matches_uninterrupted(conf, ck, ref, 3000);
  free(ck), free(ref), free(conf);
}

/* `fsdpctl cancel --checkpoint` of a running job: its ranks checkpoint the
 * step they are on (between two of checkpoint_every's), the coordinator
 * commits it, the job ends CANCELLED naming that step; resumed, it goes on
 * from that very step (a plain cancel loses every step since the last
 * checkpoint) and ends with the bytes of an uninterrupted run. */
Test(cluster, a_job_cancelled_with_a_checkpoint_resumes_from_the_step_it_stopped_at) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *ck, *ref, a[2048], job[32];
  static char out[1 << 16];
  char *conf = ckpt_job("ck-stop", 3000, "", 1000, "--ranks 2", &ck, &ref, job);
  cr_assert(wait_step(job, 100, 60), "rank 0 did not log step 100 within %d s", 60 * TU_SLOW);
  snprintf(a, sizeof a, "cancel %s --checkpoint --reason done-for-now", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert(wait_state(job, "CANCELLED", 30), "%s", state_of(job, out, sizeof out) ? out : "");
  int odd;
  cr_assert_eq(committed_steps(ck, 3000, 1000, &odd), 1, "one checkpoint, the stop's");
  cr_assert(odd > 100 && odd < 1000, "the stop's checkpoint is of step %d", odd);
  snprintf(a, sizeof a, "--output json status %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  char want[64];
  snprintf(want, sizeof want, "step %d", odd);
  cr_assert(strstr(out, want) && strstr(out, "CANCELLED"), "the reason does not name step %d:\n%s",
            odd, out);
  resumed_to_its_end(job, out, sizeof out);
  snprintf(want, sizeof want, "at step %d ", odd);
  cr_assert(strstr(out, "resumed from") && strstr(out, want), "not resumed at step %d:\n%.2000s",
            odd, out);
  matches_uninterrupted(conf, ck, ref, 3000);
  free(ck), free(ref), free(conf);
}

/* A backup taken with `fsdp-coordinator --backup` while a job runs, then
 * the coordinator lost (SIGKILL) and a new one started on the backup at the
 * same address: the node registers again and the job runs to its end in its
 * first attempt; the restored database passes integrity_check. */
Test(cluster, a_backup_taken_during_a_job_restores_into_a_coordinator_that_carries_on) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *conf = job_file("backup.conf", "steps = 1500\n");
  char job[32], out[16384], a[2048];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2"));
  cr_assert(wait_state(job, "RUNNING", 10));
  char addr[64], db[600], *bk = tu_path("backup.db");
  snprintf(addr, sizeof addr, "%s", coord.addr);
  snprintf(db, sizeof db, "%.*s", (int)(strlen(coord.log) - 4), coord.log);
  snprintf(a, sizeof a, "--db '%s' --backup '%s'", db, bk);
  cr_assert_eq(tu_run_bin("fsdp-coordinator", a, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "written to"), "%s", out);
  cr_assert_eq(tu_run_bin("fsdp-coordinator", a, out, sizeof out), 1, "a backup replaced a file");
  cr_assert(strstr(out, "exists"), "%s", out);
  cluster_stop(&coord, SIGKILL);
  char extra[64];
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d", TIMEOUT_MS);
  cluster_coord_start(&coord, bk, addr, extra);
  snprintf(a, sizeof a, "watch %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  snprintf(a, sizeof a, "--output json status %s", job);
  cluster_ctl(coord.addr, a, out, sizeof out);
  cr_expect(strstr(out, "\"attempt\": 1"), "the job carried on in its first attempt:\n%s", out);
  cluster_stop(&coord, SIGTERM);
  cluster_db_check(bk);
  free(conf), free(bk);
}

/* 1 when two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb, ca, cb;
  while (same && ((ca = fgetc(fa)) != EOF) | ((cb = fgetc(fb)) != EOF)) same = ca == cb;
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

/* fsdpctl export streams a committed checkpoint through the coordinator:
 * the file is, byte for byte, what the library exports from the checkpoint
 * (latest in fp32, a chosen step in bf16); an uncommitted step, an existing
 * file, a bad dtype and an unknown job are refused with their exit codes and
 * leave no file behind. A job submitted with init_from the exported file
 * starts from exactly the checkpoint's parameters (lr 0: the steps change
 * nothing; its saved weights are compared with the checkpoint read by
 * ckpt_reader). */
Test(cluster, fsdpctl_exports_a_committed_checkpoint_and_a_job_starts_from_it) {
  cluster_fsdpd_start(&node[0], coord.addr, "solo", 2, NULL);
  char *ck, *ref, text[1024], a[4096];
  static char out[1 << 16];
  ckpt_roots("ck-export", &ck, &ref);
  snprintf(text, sizeof text, "steps = 12\n[output]\ncheckpoint_dir = %s\ncheckpoint_every = 4\n", ck);
  char *conf = job_file("export.conf", text);
  char job[32];
  snprintf(job, sizeof job, "%s", submit(conf, "--ranks 2 --watch"));
  char *f1 = tu_path("export.safetensors"), *f2 = tu_path("export-bf16.safetensors");
  char *lib = tu_path("lib.safetensors"), *bad = tu_path("never.safetensors");
  char d12[900], d8[900];
  snprintf(d12, sizeof d12, "%s/step-00000012", ck);
  snprintf(d8, sizeof d8, "%s/step-00000008", ck);
  snprintf(a, sizeof a, "export %s -o '%s'", job, f1);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "step 12"), "%s", out);
  cr_assert_eq(safetensors_export_file(d12, SAFETENSORS_F32, lib), 0, "%s", err_msg());
  cr_assert(same_file(f1, lib), "fsdpctl's export of step 12 differs from the library's");
  snprintf(a, sizeof a, "export %s --step 8 --dtype bf16 -o '%s'", job, f2);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert_eq(safetensors_export_file(d8, SAFETENSORS_BF16, lib), 0, "%s", err_msg());
  cr_assert(same_file(f2, lib), "fsdpctl's bf16 export of step 8 differs from the library's");
  /* refusals */
  struct { const char *args; int code; const char *says; } no[] = {
      {"--step 5", 3, "committed: 12, 8, 4"},
      {"--dtype fp16", 2, "dtype"},
      {"--format gguf", 2, "safetensors"},
  };
  for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
    snprintf(a, sizeof a, "export %s %s -o '%s'", job, no[i].args, bad);
    cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), no[i].code, "%s: %s", no[i].args, out);
    cr_assert(strstr(out, no[i].says), "%s: %s", no[i].args, out);
  }
  snprintf(a, sizeof a, "export j-999 -o '%s'", bad);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 3, "%s", out);
  snprintf(a, sizeof a, "export %s -o '%s'", job, f1);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "exists"), "%s", out);
  snprintf(a, sizeof a, "export %s --force -o '%s'", job, f1);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert_neq(access(bad, F_OK), 0, "a refused export left %s", bad);
  DIR *dir = opendir(tu_tmpdir());
  for (struct dirent *de; dir && (de = readdir(dir));)
    cr_assert_null(strstr(de->d_name, ".partial"), "%s left behind", de->d_name);
  if (dir) closedir(dir);
  /* a job starts from the export */
  char *wdir = tu_path("export-w"), w[900];
  cr_assert_eq(mkdir(wdir, 0777), 0);
  chmod(wdir, 0777);
  snprintf(w, sizeof w, "%s/w.bin", wdir);
  snprintf(text, sizeof text, "steps = 2\n[model]\ninit_from = %s\n[optim]\nwarmup_steps = 1\nlr = 0\n"
           "weight_decay = 0\n[output]\nsave = %s\n", f1, w);
  char *conf2 = job_file("import.conf", text);
  submit(conf2, "--ranks 2 --watch");
  gpt_t *g;
  cr_assert_eq(gpt_load(&g, w, kern_cpu()), 0, "%s", err_msg());
  ckpt_reader_t rd;
  cr_assert_eq(ckpt_reader_open(&rd, d12), 0, "%s", err_msg());
  const size_t n = gpt_num_params(g);
  float *want = malloc(n * sizeof *want);
  cr_assert_eq(ckpt_reader_read(&rd, CKPT_SEC_PARAMS, 0, n, want, CKPT_DTYPE_F32), 0, "%s", err_msg());
  cr_assert(!memcmp(gpt_params(g), want, n * sizeof *want),
            "the job started from the export does not hold the checkpoint's parameters");
  ckpt_reader_close(&rd);
  gpt_destroy(g);
  free(want), free(f1), free(f2), free(lib), free(bad), free(wdir), free(conf), free(conf2);
  free(ck), free(ref);
}

/* With tokens configured, fsdpd registers with the node token and a user
 * reaches the coordinator only with the user token. */
Test(cluster, tokens_let_the_node_register_and_the_user_in) {
  cluster_stop(&coord, SIGTERM);
  char *ut = tu_path("user.token"), *nt = tu_path("node.token"), *db = tu_path("auth.db");
  tu_write_file(ut, "user-secret-1234567890\n", 23);
  tu_write_file(nt, "node-secret-0987654321\n", 23);
  char extra[1400], out[8192];
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d --user-token-file '%s' --node-token-file '%s'",
           TIMEOUT_MS, ut, nt);
  cluster_coord_start(&coord, db, "127.0.0.1:0", extra);
  /* fsdpctl without a token: refused (5); cluster_fsdpd_start's readiness
   * check lists the nodes with the user token from the environment */
  cr_expect_eq(cluster_ctl(coord.addr, "nodes", out, sizeof out), 5, "%s", out);
  setenv("FSDP_TOKEN_FILE", ut, 1);
  char opt[700];
  snprintf(opt, sizeof opt, "--token-file '%s'", nt);
  cluster_fsdpd_start(&node[0], coord.addr, "secure", 1, opt);
  cr_expect_eq(cluster_ctl(coord.addr, "nodes", out, sizeof out), 0, "%s", out);
  /* a node token is no user token */
  setenv("FSDP_TOKEN_FILE", nt, 1);
  cr_expect_eq(cluster_ctl(coord.addr, "nodes", out, sizeof out), 5, "%s", out);
  unsetenv("FSDP_TOKEN_FILE");
  free(ut), free(nt), free(db);
}

/* A node the coordinator keeps refusing at its first registration exits 78
 * (EX_CONFIG, which the systemd unit does not restart) once --refused-timeout
 * has passed, naming the refusal, instead of asking for ever as a node that
 * never appears: a name that is not its token's, then a token it does not
 * take. The same node with the right name and token then registers. */
Test(cluster, a_node_refused_at_its_first_registration_exits_saying_why) {
  cluster_stop(&coord, SIGTERM);
  char *ut = tu_path("user.token"), *nt = tu_path("refusing.tokens"), *mine = tu_path("mine.token");
  char *wrong = tu_path("wrong.token"), *db = tu_path("refusing.db");
  tu_write_file(ut, "user-secret-1234567890\n", 23);
  const char *table = "other other-secret-0001\nown own-secret-00002\n";
  tu_write_file(nt, table, strlen(table));
  tu_write_file(mine, "own-secret-00002\n", 17);
  tu_write_file(wrong, "not-a-node-secret-3\n", 20);
  char extra[1400], out[8192], opt[700];
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d --user-token-file '%s' --node-token-file '%s'",
           TIMEOUT_MS, ut, nt);
  cluster_coord_start(&coord, db, "127.0.0.1:0", extra);
  setenv("FSDP_TOKEN_FILE", ut, 1);
  const struct {
    const char *name, *token, *status, *words;
  } refused[] = {{"other", mine, "PERMISSION_DENIED", "fsdpd --name own"},
                 {"own", wrong, "UNAUTHENTICATED", "token is not valid"}};
  for (int i = 0; i < 2; i++) {
    snprintf(opt, sizeof opt, "--token-file '%s' --refused-timeout 2", refused[i].token);
    double t0 = tu_now_s();
    cluster_fsdpd_spawn(&node[0], coord.addr, refused[i].name, 1, opt);
    int st = cluster_wait_exit(&node[0], 15);
    double took = tu_now_s() - t0;
    size_t n = 0;
    char *log = tu_slurp(node[0].log, &n);
    cr_assert_neq(st, -1, "fsdpd %s, refused, still runs after 15 s:\n%s", refused[i].name, log);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 78, "fsdpd %s: wait status %#x, not exit 78:\n%s",
              refused[i].name, st, log);
    cr_expect(took >= 2.0 && took < 6.0, "fsdpd %s gave up after %.1f s, not 2 s of refusals",
              refused[i].name, took);
    cr_expect(strstr(log, refused[i].status) && strstr(log, refused[i].words) &&
                  strstr(log, "start fsdpd again"),
              "fsdpd %s's log does not say why it stopped:\n%s", refused[i].name, log);
    free(log);
  }
  cr_expect_eq(cluster_ctl(coord.addr, "nodes", out, sizeof out), 0, "%s", out);
  cr_expect(!strstr(out, "own") && !strstr(out, "other"), "a refused node is listed:\n%s", out);
  snprintf(opt, sizeof opt, "--token-file '%s'", mine);
  cluster_fsdpd_start(&node[0], coord.addr, "own", 1, opt);
  unsetenv("FSDP_TOKEN_FILE");
  free(ut), free(nt), free(mine), free(wrong), free(db);
}

static size_t log_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) ? 0 : (size_t)sb.st_size;
}

/* What the log at path holds from byte from on ("" when nothing). */
static char *log_since(const char *path, size_t from) {
  size_t n = 0;
  char *all = tu_slurp(path, &n);
  char *tail = strdup(all && from < n ? all + from : "");
  free(all);
  return tail;
}

/* Two fsdpd under one name (a cloned host name, --name given twice): the
 * second is refused while the first runs, and exits 78 saying so, where
 * before each took the node from the other at every registration. The
 * first keeps its session. Once the first is killed, a new fsdpd under the
 * name registers at once: its predecessor's held heartbeat ended with it. */
Test(cluster, a_second_fsdpd_under_a_nodes_name_is_refused_while_the_first_runs) {
  char out[8192];
  cluster_fsdpd_start(&node[0], coord.addr, "twin", 1, NULL);
  /* the daemons under one name share a log: each one's lines are those after its start */
  size_t first_end = log_size(node[0].log);
  double t0 = tu_now_s();
  /* (a work directory of its own: one fsdpd's alone, fsdpd.lock) */
  char *work2 = tu_path("twin-2"), extra[1200];
  snprintf(extra, sizeof extra, "--refused-timeout 0 --work-dir '%s'", work2);
  free(work2);
  cluster_fsdpd_spawn(&node[1], coord.addr, "twin", 1, extra);
  int st = cluster_wait_exit(&node[1], 15);
  char *log = log_since(node[1].log, first_end);
  cr_assert_neq(st, -1, "the second fsdpd still runs after 15 s:\n%s", log);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 78, "wait status %#x, not exit 78:\n%s", st, log);
  cr_expect_lt(tu_now_s() - t0, 5.0, "the second fsdpd took %.1f s to give up", tu_now_s() - t0);
  cr_expect(strstr(log, "ALREADY_EXISTS") && strstr(log, "another fsdpd") && strstr(log, "--name"),
            "the second fsdpd's log does not say why:\n%s", log);
  free(log);
  log = log_since(node[0].log, 0);
  cr_expect(!strstr(log, "superseded") && !strstr(log, "registering again"),
            "the first fsdpd lost its session to the second:\n%s", log);
  free(log);
  cr_expect_eq(cluster_ctl(coord.addr, "nodes", out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "twin") && strstr(out, "ALIVE"), "the first is no longer alive:\n%s", out);
  /* a crashed fsdpd's successor is not kept out */
  cluster_stop(&node[0], SIGKILL);
  const size_t killed_end = log_size(node[1].log);
  t0 = tu_now_s();
  cluster_fsdpd_spawn(&node[1], coord.addr, "twin", 1, NULL);
  for (;;) {
    log = log_since(node[1].log, killed_end);
    int in = strstr(log, "registered as node") != NULL;
    cr_assert(in || tu_now_s() - t0 < 10, "a new fsdpd after the first was killed did not "
              "register within 10 s:\n%s", log);
    free(log);
    if (in) break;
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  cr_expect_lt(tu_now_s() - t0, 3.0, "the successor took %.1f s to register", tu_now_s() - t0);
  cr_expect_eq(cluster_wait_exit(&node[1], 0), -1, "the successor exited");
}

/* Kubernetes nodes show the projected service account token of fsdpd's
 * pod, no token file per node: the coordinator checks it against the
 * cluster's keys (a JWKS) and takes the node the token is bound to as the
 * caller. fsdpd kube-a registers and runs a job; an fsdpd claiming to be
 * kube-b with kube-a's token is refused and exits 78. When kube-a's token
 * file is renewed, fsdpd sends the new one: an expired token put there is
 * refused (its ranks go on), a fresh one is taken again. */
Test(cluster, kubernetes_nodes_are_known_by_their_service_account_tokens, .timeout = 120 * TU_SLOW) {
  cluster_stop(&coord, SIGTERM);
  char *ut = tu_path("user.token"), *key = tu_path("sa.pem"), *jwks = tu_path("jwks.json");
  char *tok = tu_path("kube-a.jwt"), *db = tu_path("kube.db");
  tu_write_file(ut, "user-secret-1234567890\n", 23);
  char out[8192], extra[2000], opt[700];
  cluster_sa_keys(key, jwks);
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d --user-token-file '%s' --node-jwks-file '%s' "
           "--node-jwt-subject system:serviceaccount:fsdp:fsdpd --node-jwt-audience fsdp-coordinator",
           TIMEOUT_MS * 10, ut, jwks);
  cluster_coord_start(&coord, db, "127.0.0.1:0", extra);
  setenv("FSDP_TOKEN_FILE", ut, 1);
  cluster_sa_token(tok, key, "kube-a", "@NOW+3600");
  snprintf(opt, sizeof opt, "--token-file '%s'", tok);
  cluster_fsdpd_start(&node[0], coord.addr, "kube-a", 1, opt);
  /* another name with kube-a's token: refused */
  char opt0[800];
  snprintf(opt0, sizeof opt0, "%s --refused-timeout 0", opt);
  cluster_fsdpd_spawn(&node[1], coord.addr, "kube-b", 1, opt0);
  int st = cluster_wait_exit(&node[1], 15);
  char *log = tu_slurp(node[1].log, NULL);
  cr_expect(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 78 && strstr(log, "PERMISSION_DENIED"),
            "kube-b with kube-a's token: wait status %#x:\n%s", st, log);
  free(log);
  /* a job runs while the token is renewed: expired, then fresh */
  char *conf = job_file("kube.conf", "steps = 2000\n");
  const char *id = submit(conf, "--ranks 1");
  cr_assert(wait_state(id, "RUNNING", 30), "%s", state_of(id, out, sizeof out));
  cluster_sa_token(tok, key, "kube-a", "@NOW-600");
  const double t0 = tu_now_s();
  for (;;) {
    log = tu_slurp(node[0].log, NULL);
    const int refused = strstr(log, "the coordinator refused Heartbeat") && strstr(log, "expired");
    free(log);
    if (refused) break;
    cr_assert_lt(tu_now_s() - t0, 15, "an expired token was not refused");
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  }
  cluster_sa_token(tok, key, "kube-a", "@NOW+3600");
  for (;;) {
    log = tu_slurp(node[0].log, NULL);
    const char *back = strstr(log, "the coordinator answers again");
    free(log);
    if (back) break;
    cr_assert_lt(tu_now_s() - t0, 30, "the renewed token was not taken");
    nanosleep(&(struct timespec){0, 50000000}, NULL);
  }
  cr_expect(wait_state(id, "SUCCEEDED", 90), "the job across the renewal: %s", state_of(id, out, sizeof out));
  unsetenv("FSDP_TOKEN_FILE");
  free(ut), free(key), free(jwks), free(tok), free(db), free(conf);
}

/* With a token per node, fsdpd "own" registers with its own token and a
 * 2-rank job on it runs to the end: its rendezvous, exits and the rank
 * reports all pass as its own. */
Test(cluster, with_a_token_per_node_a_job_runs_to_the_end) {
  cluster_stop(&coord, SIGTERM);
  char *ut = tu_path("user.token"), *nt = tu_path("nodes.tokens"), *mine = tu_path("own.token");
  char *db = tu_path("pernode.db");
  tu_write_file(ut, "user-secret-1234567890\n", 23);
  const char *table = "other other-secret-0001\nown own-secret-00002\n";
  tu_write_file(nt, table, strlen(table));
  tu_write_file(mine, "own-secret-00002\n", 17);
  char extra[1400], out[8192], opt[700];
  snprintf(extra, sizeof extra, "--heartbeat-timeout-ms %d --user-token-file '%s' --node-token-file '%s'",
           TIMEOUT_MS, ut, nt);
  cluster_coord_start(&coord, db, "127.0.0.1:0", extra);
  setenv("FSDP_TOKEN_FILE", ut, 1);
  snprintf(opt, sizeof opt, "--token-file '%s'", mine);
  cluster_fsdpd_start(&node[0], coord.addr, "own", 2, opt);
  char *conf = job_file("pernode.conf", "steps = 3\n");
  const char *id = submit(conf, "--ranks 2");
  cr_expect(wait_state(id, "SUCCEEDED", 60), "%s", state_of(id, out, sizeof out));
  unsetenv("FSDP_TOKEN_FILE");
  free(ut), free(nt), free(mine), free(db), free(conf);
}

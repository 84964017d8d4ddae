/* Tests of the training loop: the schedule, that training on the demo corpus
 * learns (a stated bound), bad jobs refused with a clear message, and the
 * fsdp-train command's exit codes. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"
#include "daemon/train/gpt.h"
#include "daemon/train/train.h"
#include "tests/unit/testutil.h"

#define DEMO_CORPUS "/usr/share/games/fortunes/computers"

Test(train, lr_schedule_warmup_then_cosine) {
  config_t c;
  config_default(&c);
  c.steps = 100;
  c.warmup_steps = 10;
  c.lr = 1e-3f;
  c.min_lr_frac = 0.1f;
  cr_assert_float_eq(train_lr(&c, 0), 1e-4f, 1e-9);
  cr_assert_float_eq(train_lr(&c, 9), 1e-3f, 1e-9);
  cr_assert_float_eq(train_lr(&c, 10), 1e-3f, 1e-9, "decay starts at the peak");
  cr_assert_float_eq(train_lr(&c, 99), 1e-4f, 1e-9, "ends at min_lr_frac * lr");
  cr_assert_float_eq(train_lr(&c, 10 + 89 / 2.0), 5.5e-4f, 2e-5, "half-way is the mean");
  for (int s = 11; s < 100; s++) cr_assert_leq(train_lr(&c, s), train_lr(&c, s - 1));
}

/* The demo corpus as a byte-level token file. */
static char *demo_tokens(void) {
  FILE *f = fopen(DEMO_CORPUS, "rb");
  cr_assert_not_null(f, "%s is missing: install the Debian package fortunes (make test does)", DEMO_CORPUS);
  static uint16_t tok[1 << 21];
  size_t n = 0;
  int ch;
  while (n < sizeof tok / sizeof tok[0] && (ch = fgetc(f)) != EOF) tok[n++] = (uint16_t)ch;
  fclose(f);
  char *path = tu_path("demo.bin");
  cr_assert_eq(data_write(path, tok, n), 0, "%s", err_msg());
  return path;
}

/* Stated bound: the tiny preset (2 layers, 64 channels) on the demo corpus
 * starts at ln(256) = 5.55 and must be below 2.9 in training and held-out loss
 * within 300 steps of 8 x 64 tokens. */
Test(train, learns_the_demo_corpus, .timeout = 300) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 300;
  c.batch = 8;
  c.seq_len = 64;
  c.lr = 3e-3f;
  c.warmup_steps = 20;
  c.eval_batches = 16;
  c.threads = 2;
  train_result_t r;
  int rc = train_run(&c, NULL, &r);
  cr_assert_eq(rc, 0, "%s", err_msg());
  cr_log_info("loss %.4f -> %.4f, eval %.4f, %.0f tok/s", r.first_loss, r.last_loss, r.eval_loss,
              r.tokens_per_s);
  cr_assert(fabsf(r.first_loss - logf(256)) < 0.2f, "starts near ln(256): %f", r.first_loss);
  cr_assert_lt(r.last_loss, 2.9f);
  cr_assert_lt(r.eval_loss, 2.9f);
  cr_assert_eq(r.steps_done, 300);
  free(data);
}

Test(train, missing_data_file_is_named) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", "/nonexistent/tokens.bin"), 0);
  train_result_t r;
  int rc = train_run(&c, NULL, &r);
  cr_assert_eq(rc, FSDP_ENOENT);
  cr_assert(strstr(err_msg(), "/nonexistent/tokens.bin"), "%s", err_msg());
}

Test(train, init_from_must_match_the_model) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 2;
  c.warmup_steps = 1;
  c.seq_len = 32;
  char *w = tu_path("w.bin");
  cr_assert_eq(config_set(&c, "save", w), 0);
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  c.save[0] = 0;
  cr_assert_eq(config_set(&c, "init_from", w), 0);
  cr_assert_eq(train_run(&c, NULL, &r), 0, "resume from saved weights: %s", err_msg());
  cr_assert_eq(config_set(&c, "layers", "3"), 0);
  cr_assert_eq(train_run(&c, NULL, &r), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "init_from") && strstr(err_msg(), "layers 2"), "%s", err_msg());
  /* a directory (a checkpoint's, most likely) is named as one, with the
   * option that takes it (it was "shorter than the header of a weights file") */
  char *dir = tu_path("ckpt-dir");
  cr_assert_eq(mkdir(dir, 0755), 0);
  cr_assert_eq(config_set(&c, "layers", "2"), 0);
  cr_assert_eq(config_set(&c, "init_from", dir), 0);
  cr_assert_eq(train_run(&c, NULL, &r), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "is a directory") && strstr(err_msg(), "resume_from"), "%s",
            err_msg());
  free(dir);
  free(w);
  free(data);
}

/* init_from with a checkpoint_dir that holds a checkpoint (auto_resume):
 * the run goes on from the checkpoint, as a requeued job must, and says
 * that init_from was not used and how to start from it. */
Test(train, init_from_under_a_checkpoint_it_goes_on_from_is_said_to_be_unused, .timeout = 60) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens(), *w = tu_path("w0.bin"), *ck = tu_path("ck-init");
  cr_assert_eq(mkdir(ck, 0755), 0);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 2, c.warmup_steps = 1, c.batch = 2, c.seq_len = 32, c.eval_batches = 1;
  cr_assert_eq(config_set(&c, "save", w), 0);
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  c.save[0] = 0;
  cr_assert_eq(config_set(&c, "checkpoint_dir", ck), 0);
  c.checkpoint_every = 1;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  cr_assert_eq(config_set(&c, "init_from", w), 0);
  c.steps = 3;
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  cr_assert_eq(train_run(&c, out, &r), 0, "%s", err_msg());
  fclose(out);
  cr_assert(strstr(text, "resumed from") && strstr(text, "note: not init_from") &&
                strstr(text, "auto_resume = 0"), "%s", text);
  free(text), free(data), free(w), free(ck);
}

/* ---- the step API ---------------------------------------------------------- */

typedef struct {
  int n;
  train_metrics_t m[16];
} metrics_log_t;

static void log_metrics(void *ctx, const train_metrics_t *m) {
  metrics_log_t *l = ctx;
  cr_assert_lt(l->n, 16);
  l->m[l->n++] = *m;
}

/* A run driven a step at a time: every step reports its metrics, an
 * evaluation is reported on the steps it is due, the state advances, and the
 * losses are train_run's bit for bit (one loop, two drivers). */
Test(train, step_api_reports_every_step) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 6, c.warmup_steps = 2, c.batch = 2, c.seq_len = 32, c.grad_accum = 2;
  c.eval_every = 4, c.eval_batches = 2;
  metrics_log_t log = {0};
  train_opts_t o = {.metrics = log_metrics, .ctx = &log};
  train_t *t;
  cr_assert_eq(train_open(&t, &c, &o), 0, "%s", err_msg());
  train_state_t st;
  train_state(t, &st);
  cr_assert_eq(st.step, 0);
  cr_assert_not_null(st.runtime);
  for (int s = 1; !train_done(t); s++) {
    cr_assert_eq(train_step(t), 0, "%s", err_msg());
    cr_assert_eq(log.n, s, "one report per step");
    const train_metrics_t *m = &log.m[s - 1];
    cr_assert_eq(m->step, s);
    cr_assert_eq(m->steps, 6);
    cr_assert_eq(m->rank, 0);
    cr_assert_eq(m->world, 1);
    cr_assert_eq(m->tokens, 2u * 32 * 2, "batch x seq_len x grad_accum");
    cr_assert(isfinite(m->loss) && m->loss > 0, "%f", m->loss);
    cr_assert_float_eq(m->lr, train_lr(&c, s - 1), 0);
    cr_assert(m->grad_norm > 0 && m->step_s > 0 && m->tokens_per_s > 0);
    cr_assert_eq(m->evaluated, s == 4 || s == 6, "evaluations after steps 4 and 6 (step %d)", s);
    cr_assert_gt(m->mem.peak[MEM_PARAMS], 0, "memory by category is reported");
    cr_assert_geq(m->mem.total_peak, m->mem.total_cur);
    train_state(t, &st);
    cr_assert_eq(st.step, s);
    cr_assert(st.data.epoch == 0 && st.data.window == (uint64_t)(2 * 2 * s), "two micro-batches of 2 windows a step (%d)", s);
  }
  cr_assert_eq(train_step(t), FSDP_EINVAL, "no step after the last");
  cr_assert_eq(train_finish(t), 0, "%s", err_msg());
  train_result_t r;
  train_result(t, &r);
  train_close(t);
  cr_assert_eq(r.steps_done, 6);
  cr_assert_eq(r.first_loss, log.m[0].loss);
  cr_assert_eq(r.last_loss, log.m[5].loss);
  cr_assert_eq(r.eval_loss, log.m[5].eval_loss);
  train_result_t rr;
  cr_assert_eq(train_run(&c, NULL, &rr), 0, "%s", err_msg());
  cr_assert_eq(rr.last_loss, r.last_loss, "%a vs %a", rr.last_loss, r.last_loss);
  cr_assert_eq(rr.eval_loss, r.eval_loss);
  free(data);
}

/* ---- the report channel to fsdpd (report.c) ------------------------------ */

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/common/frame.h"
#include "daemon/train/report.h"
#include "proto/fsdp.pb-c.h"

/* The statuses a rank wrote on its report channel: step and peak by category. */
typedef struct {
  int n;
  int64_t step[16];
  uint64_t peak[16][MEM__COUNT];
} reports_t;

static int reports_add(void *arg, const uint8_t *data, size_t n) {
  reports_t *f = arg;
  Fsdp__V1__RankReport *rep = fsdp__v1__rank_report__unpack(NULL, n, data);
  cr_assert(rep && rep->kind_case == FSDP__V1__RANK_REPORT__KIND_STATUS, "not a status frame");
  cr_assert_lt(f->n, 16);
  const Fsdp__V1__RankStatus *st = rep->status;
  f->step[f->n] = st->step;
  for (size_t k = 0; k < st->n_memory; k++)
    for (int c = 0; c < MEM__COUNT; c++)
      if (!strcmp(st->memory[k]->name, mem_cat_name((mem_cat_t)c)))
        f->peak[f->n][c] = st->memory[k]->peak_bytes;
  f->n++;
  fsdp__v1__rank_report__free_unpacked(rep, NULL);
  return 0;
}

/* A report channel on a socket, as fsdpd gives a rank one (FSDP_REPORT_FD);
 * its reading end in *rd. */
static report_t *report_socket(int *rd) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  char fd[16];
  snprintf(fd, sizeof fd, "%d", sv[1]);
  cr_assert_eq(setenv("FSDP_REPORT_FD", fd, 1), 0);
  report_t *rep;
  cr_assert_eq(report_open_from_env(&rep), 0, "%s", err_msg());
  cr_assert_not_null(rep);
  *rd = sv[0];
  return rep;
}

/* Feeds every frame on fd, to its end, to add(arg), and closes fd. */
static void reports_read(int fd, frame_cb add, void *arg) {
  frame_reader_t fr;
  frame_reader_init(&fr, 1 << 16);
  char b[4096];
  ssize_t n;
  while ((n = read(fd, b, sizeof b)) > 0)
    cr_assert_eq(frame_reader_feed(&fr, b, (size_t)n, add, arg), 0, "%s", err_msg());
  frame_reader_free(&fr);
  close(fd);
}

/* Runs c with its reports on a socket (FSDP_REPORT_FD, as fsdpd starts a
 * rank) through metrics (the per-step hook, ctx the channel) and finished
 * (the final one), and reads back every frame. */
static void run_reporting(const config_t *c, train_metrics_cb metrics, train_metrics_cb finished,
                          reports_t *f) {
  int rd;
  report_t *rep = report_socket(&rd);
  train_hooks_t h = {.metrics = metrics, .ctx = rep, .finished = finished};
  train_result_t r;
  cr_assert_eq(train_run_with(c, NULL, &h, &r), 0, "%s", err_msg());
  report_close(rep); /* the reader sees the end */
  reports_read(rd, reports_add, f);
}

/* After step 1, 8 MiB of host_offload is taken and given back (between steps). */
static void report_after_a_spike(void *ctx, const train_metrics_t *m) {
  if (m->step == 1) mem_free(mem_alloc(MEM_OFFLOAD, 8 << 20, "a spike between steps"));
  report_metrics(ctx, m);
}

/* ---- the node's lease ---- */

static uint64_t lease_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void lease_write(int fd, uint64_t until) {
  Fsdp__V1__RankLease l = FSDP__V1__RANK_LEASE__INIT;
  l.until_ns = until;
  uint8_t b[32];
  const size_t n = fsdp__v1__rank_lease__pack(&l, b);
  cr_assert_eq(frame_write(fd, b, n), 0, "%s", err_msg());
}

/* A child that opens the report channel with `stale` expired leases waiting
 * on it, then `last` (with have_last), and lives 1.5 s: its exit status. */
static int lease_child(int stale, int have_last, uint64_t last) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const uint64_t now = lease_now_ns();
  for (int i = 0; i < stale; i++) lease_write(sv[0], now - 10000000000ull + (uint64_t)i * 1000000);
  if (have_last) lease_write(sv[0], last);
  const pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", sv[1]);
    setenv("FSDP_REPORT_FD", fd, 1);
    unsetenv("FSDP_NODE_PID");
    report_t *rep;
    if (report_open_from_env(&rep) || !rep) _exit(9);
    nanosleep(&(struct timespec){1, 500000000}, NULL);
    _exit(0);
  }
  close(sv[1]);
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  close(sv[0]);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A rank ends itself (status 3) once its node's lease has passed, and goes
 * by the newest lease waiting, however many older ones came before it (a
 * rank stopped a while reads them all at once: helper-61 #3 saw one end on
 * the 19th of 40); a lease of 0 means none. */
Test(train, a_rank_ends_at_its_leases_end_and_goes_by_the_newest) {
  cr_expect_eq(lease_child(3, 0, 0), REPORT_EXIT_FENCED, "expired leases alone");
  cr_expect_eq(lease_child(60, 1, lease_now_ns() + 15000000000ull), 0,
               "60 expired leases, then one 15 s ahead");
  cr_expect_eq(lease_child(5, 1, lease_now_ns() + 400000000ull), REPORT_EXIT_FENCED,
               "a lease that ends within the child's life");
  cr_expect_eq(lease_child(5, 1, 0), 0, "expired leases, then 0: none");
  cr_expect_eq(lease_child(0, 0, 0), 0, "no lease");
}

/* RankStatus.peak_bytes is over the run (proto/fsdp.proto): a peak between
 * steps 1 and 2 is in every later report, not only in step 1's, and no
 * category's reported peak ever goes down (fsdpctl memory showed the last
 * step's peaks). */
Test(train, the_report_channel_carries_the_runs_peaks) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 4, c.warmup_steps = 1, c.batch = 2, c.seq_len = 16, c.sample_tokens = 0;
  reports_t f = {0};
  run_reporting(&c, report_after_a_spike, NULL, &f);
  cr_assert_geq(f.n, 4, "one status a step at least (%d)", f.n);
  for (int s = 0; s < 4; s++) cr_assert_eq(f.step[s], s + 1);
  for (int s = 1; s < f.n; s++) {
    cr_assert_geq(f.peak[s][MEM_OFFLOAD], 8u << 20, "report %d: host_offload peak %llu, not the "
                  "run's (8 MiB after step 1)", s, (unsigned long long)f.peak[s][MEM_OFFLOAD]);
    for (int k = 0; k < MEM__COUNT; k++)
      cr_assert_geq(f.peak[s][k], f.peak[s - 1][k], "report %d: the %s peak went down", s,
                    mem_cat_name((mem_cat_t)k));
  }
  free(data);
}

/* After the last step's report, one more: the final figures after
 * train_finish, whose sampling (a context-long window where steps had
 * seq_len) raised the activation peak above every step's; fsdpd relays it
 * with the rank's exit (a short job showed nothing, a long one the last
 * step's peak). */
Test(train, a_final_status_follows_train_finish) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 3, c.warmup_steps = 1, c.batch = 1, c.seq_len = 16, c.sample_tokens = 100;
  reports_t f = {0};
  run_reporting(&c, report_metrics, report_metrics, &f);
  cr_assert_eq(f.n, 4, "3 step reports and the final one (%d)", f.n);
  cr_assert_eq(f.step[3], 3, "the final report is at the last step");
  cr_assert_eq(f.peak[3][MEM_ACTS], mem_peak(MEM_ACTS), "the final report has the run's "
               "activation peak (%llu of %zu)", (unsigned long long)f.peak[3][MEM_ACTS],
               mem_peak(MEM_ACTS));
  cr_assert_gt(f.peak[3][MEM_ACTS], f.peak[2][MEM_ACTS], "sampling raised the activation peak");
  free(data);
}

/* Without memory_limit_mib a rank's limit is its device's memory as fsdpd
 * gives it (FSDP_DEVICE_MEMORY_BYTES), not the host's available memory
 * divided by the world (a quarter of the host for a rank of 2 hosts x 2):
 * 1 MiB refuses the tiny model, saying the limit. */
Test(train, a_ranks_memory_limit_is_its_devices_as_fsdpd_says) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 1, c.warmup_steps = 1, c.batch = 1, c.seq_len = 16;
  cr_assert_eq(setenv("FSDP_DEVICE_MEMORY_BYTES", "1048576", 1), 0);
  train_t *t;
  cr_assert_eq(train_open(&t, &c, NULL), FSDP_ENOMEM, "a 1 MiB device: %s", err_msg());
  cr_assert(strstr(err_msg(), "1 MiB is available"), "%s", err_msg());
  free(data);
}

/* A save path that cannot be written is found before the first step, with
 * the option named, and nothing is trained. */
Test(train, an_unwritable_save_path_is_refused_before_training) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "save", "/nonexistent-dir/w.bin"), 0);
  c.steps = 1000000, c.warmup_steps = 1, c.seq_len = 32;
  metrics_log_t log = {0};
  train_opts_t o = {.metrics = log_metrics, .ctx = &log};
  train_t *t;
  cr_assert_eq(train_open(&t, &c, &o), FSDP_ENOENT);
  cr_assert(strstr(err_msg(), "save") && strstr(err_msg(), "/nonexistent-dir/w.bin"), "%s",
            err_msg());
  cr_assert_eq(log.n, 0, "not a step ran");
  cr_assert_eq(mem_total_current(), 0, "nothing is left allocated");
  free(data);
}

/* What the run would find wrong only later is refused at open, naming the
 * option and with nothing trained or left allocated: a save path that is a
 * directory (found at the end, after training, before); a checkpoint_dir
 * that does not exist or is a file (every checkpoint skipped, a requeued
 * job started over); a held-out split too small for one evaluation batch
 * (a NaN evaluation); a batch larger than the training split (found at
 * step 1, after allocating for it). */
Test(train, what_the_run_would_find_wrong_later_is_refused_at_open) {
  char *data = demo_tokens(), *dir = tu_path("adir"), *file = tu_path("afile");
  char *fifo = tu_path("afifo"), *null = tu_path("anull");
  cr_assert_eq(mkdir(dir, 0755), 0);
  tu_write_file(file, "x", 1);
  /* the save's rename would replace these: a FIFO, and a device (through a
   * link to /dev/null: a rename replaces the link, never /dev/null itself) */
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(symlink("/dev/null", null), 0);
  char missing[700];
  snprintf(missing, sizeof missing, "%s/none", dir);
  const struct {
    const char *key, *value, *eval, *batch, *want;
    int rc;
  } cases[] = {
      {"save", dir, "0.1", "2", "is a directory", FSDP_EINVAL},
      {"save", fifo, "0.1", "2", "is a FIFO, not a file: give a file path", FSDP_EINVAL},
      {"save", null, "0.1", "2", "is a character device, not a file", FSDP_EINVAL},
      {"save", data, "0.1", "2", "is the data file", FSDP_EINVAL},
      {"checkpoint_dir", missing, "0.1", "2", "existing directory", FSDP_ENOENT},
      {"checkpoint_dir", file, "0.1", "2", "is not a directory", FSDP_EINVAL},
      {"seed", "1", "0.0003", "2", "fewer than one evaluation batch", FSDP_EINVAL},
      {"seed", "1", "0", "8000", "lower batch", FSDP_EINVAL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    config_t c;
    config_default(&c);
    cr_assert_eq(config_set(&c, "data", data), 0);
    cr_assert_eq(config_set(&c, "model", "tiny"), 0);
    cr_assert_eq(config_set(&c, cases[i].key, cases[i].value), 0, "%s", err_msg());
    cr_assert_eq(config_set(&c, "eval_fraction", cases[i].eval), 0);
    cr_assert_eq(config_set(&c, "batch", cases[i].batch), 0);
    c.steps = 1000000, c.warmup_steps = 1, c.seq_len = 32;
    metrics_log_t log = {0};
    train_opts_t o = {.metrics = log_metrics, .ctx = &log};
    train_t *t;
    cr_assert_eq(train_open(&t, &c, &o), cases[i].rc, "case %zu (%s = %s): %s", i, cases[i].key,
                 cases[i].value, err_msg());
    cr_assert(strstr(err_msg(), cases[i].want), "case %zu: %s", i, err_msg());
    if (i < 6) cr_assert(strstr(err_msg(), cases[i].key), "case %zu: %s", i, err_msg());
    cr_assert_eq(log.n, 0, "not a step ran");
    cr_assert_eq(mem_total_current(), 0, "nothing is left allocated");
  }
  struct stat st;
  cr_assert(!stat(fifo, &st) && S_ISFIFO(st.st_mode), "the FIFO is left as it was");
  cr_assert(!lstat(null, &st) && S_ISLNK(st.st_mode), "the link is left as it was");
  free(data), free(dir), free(file), free(fifo), free(null);
}

/* c: one step of the tiny model on data, saving its weights to save. */
static void one_step_saving(config_t *c, const char *data, const char *save) {
  config_default(c);
  cr_assert_eq(config_set(c, "data", data), 0);
  cr_assert_eq(config_set(c, "model", "tiny"), 0);
  cr_assert_eq(config_set(c, "save", save), 0);
  c->steps = 1, c->warmup_steps = 1, c->seq_len = 32;
}

/* save naming a file the run reads is refused before training, however it
 * is spelled: the data (the token file would be replaced by the weights,
 * a hard link included) and init_from. */
Test(train, a_save_that_is_a_file_the_run_reads_is_refused_at_open) {
  char *data = demo_tokens(), *hard = tu_path("demo-hard.bin"), *w = tu_path("w-in.bin");
  cr_assert_eq(link(data, hard), 0);
  char dotted[4200];
  snprintf(dotted, sizeof dotted, "%s/./demo.bin", tu_tmpdir());
  size_t n0;
  char *before = tu_slurp(data, &n0);
  const char *same[] = {dotted, hard};
  for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
    config_t c;
    config_default(&c);
    cr_assert_eq(config_set(&c, "data", data), 0);
    cr_assert_eq(config_set(&c, "model", "tiny"), 0);
    cr_assert_eq(config_set(&c, "save", same[i]), 0);
    c.steps = 1, c.warmup_steps = 1, c.seq_len = 32;
    train_result_t r;
    cr_assert_eq(train_run(&c, NULL, &r), FSDP_EINVAL, "save = %s: %s", same[i], err_msg());
    cr_assert(strstr(err_msg(), "save: ") && strstr(err_msg(), "is the data file") &&
              strstr(err_msg(), "give save a path of its own"), "%s", err_msg());
  }
  size_t n1;
  char *after = tu_slurp(data, &n1);
  cr_assert(n0 == n1 && !memcmp(before, after, n0), "the token file was replaced");
  /* init_from: weights saved by a first run, then named as both */
  config_t c;
  one_step_saving(&c, data, w);
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  cr_assert_eq(config_set(&c, "init_from", w), 0);
  cr_assert_eq(train_run(&c, NULL, &r), FSDP_EINVAL, "%s", err_msg());
  cr_assert(strstr(err_msg(), "is the init_from file"), "%s", err_msg());
  free(before), free(after), free(data), free(hard), free(w);
}

/* save writes a temporary of its own, <save>.tmp.<pid> or another name
 * when that is taken, created O_EXCL | O_NOFOLLOW: links planted at the
 * names a save might use (the old fixed <save>.tmp.sharded, and
 * <save>.tmp.<pid>) are not written through, the file they point at keeps
 * its bytes, and the weights land at the save path, with no temporary
 * left behind. */
Test(train, a_save_never_writes_through_a_link_at_its_temporary_name) {
  char *data = demo_tokens(), *w = tu_path("sym.w"), *victim = tu_path("victim.txt");
  tu_write_file(victim, "precious", 8);
  char planted[2][4200];
  snprintf(planted[0], sizeof planted[0], "%s.tmp.sharded", w);
  snprintf(planted[1], sizeof planted[1], "%s.tmp.%d", w, (int)getpid());
  for (int i = 0; i < 2; i++) cr_assert_eq(symlink(victim, planted[i]), 0);
  config_t c;
  one_step_saving(&c, data, w);
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  size_t n;
  char *v = tu_slurp(victim, &n);
  cr_assert(n == 8 && !memcmp(v, "precious", 8), "the weights were written through a link");
  struct stat st;
  cr_assert(!lstat(w, &st) && S_ISREG(st.st_mode), "the weights are at %s", w);
  gpt_t *g;
  cr_assert_eq(gpt_load(&g, w, kern_cpu()), 0, "%s", err_msg());
  gpt_destroy(g);
  for (int i = 0; i < 2; i++)
    cr_assert(!lstat(planted[i], &st) && S_ISLNK(st.st_mode), "%s is left alone", planted[i]);
  DIR *d = opendir(tu_tmpdir());
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, "sym.w.tmp.", 10))
      cr_assert(!strcmp(e->d_name, "sym.w.tmp.sharded") ||
                strcspn(e->d_name + 10, ".") == strlen(e->d_name + 10),
                "a temporary is left: %s", e->d_name);
  closedir(d);
  free(v), free(data), free(w), free(victim);
}

static int run_cmd(const char *args, char *out, size_t len) {
  return tu_run_bin("fsdp-train", args, out, len);
}

Test(train, command_exit_codes_and_messages) {
  char out[65536];
  cr_assert_eq(run_cmd("--help", out, sizeof out), 0);
  cr_assert(strstr(out, "--grad_accum") && strstr(out, "[optim]"), "%s", out);
  cr_assert_eq(run_cmd("--model tiny --heads 3 --data x.bin", out, sizeof out), 2);
  cr_assert(strstr(out, "heads") && strstr(out, "divisible"), "%s", out);
  cr_assert_eq(run_cmd("--batch 0", out, sizeof out), 2);
  cr_assert(strstr(out, "batch"), "%s", out);
  cr_assert_eq(run_cmd("--no-such-flag 1", out, sizeof out), 2);
  /* a mesh that is not the launcher's world (one rank here) is a bad option */
  cr_assert_eq(run_cmd("--model tiny --mesh 2x2 --data x.bin", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "mesh: 2x2 is 4 ranks but the job has 1"), "%s", out);
  cr_assert_eq(run_cmd("--data /nonexistent/t.bin", out, sizeof out), 1);
  cr_assert(strstr(out, "/nonexistent/t.bin"), "%s", out);
}

/* A run that fails says why on its last line, whatever it printed before on
 * stdout (the plan, the precision): fsdpd reports a rank's last log line as
 * its job's reason, and stdout to a file or a pipe is line-buffered, not
 * held back past the error. */
Test(train, a_failed_runs_last_line_is_its_error) {
  char *data = tu_token_file("tok.bin", 20000, 1, 256), *empty = tu_path("empty"), args[2048];
  cr_assert_eq(mkdir(empty, 0755), 0);
  snprintf(args, sizeof args, "--model tiny --data %s --steps 3 --batch 2 --seq_len 32 "
           "--resume_from %s", data, empty);
  char out[65536];
  cr_assert_eq(run_cmd(args, out, sizeof out), 1, "%s", out);
  cr_assert(strstr(out, "train: precision"), "the run printed its precision first:\n%s", out);
  size_t n = strlen(out);
  while (n && out[n - 1] == '\n') out[--n] = 0;
  const char *last = strrchr(out, '\n');
  last = last ? last + 1 : out;
  cr_expect(strstr(last, "resume_from") && strstr(last, "no committed checkpoint"),
            "the last line is not the error: %s\n(the whole output:\n%s)", last, out);
  free(data), free(empty);
}

/* ---- sharded jobs through fsdp-launch ------------------------------------ */

static int launch_cmd(const char *args, char *out, size_t len) {
  return tu_run_bin("fsdp-launch", args, out, len);
}

/* A job of 2 ranks (FULL_SHARD) and one of 4 (HYBRID_SHARD 2x2) started by
 * fsdp-launch train like one device on the whole batch: the same losses and,
 * in the weights file the ranks write together, the same weights. */
Test(train, sharded_jobs_train_like_one_device, .timeout = 120) {
  char *data = demo_tokens(), *w1 = tu_path("one.bin"), *w2 = tu_path("two.bin"), *w4 = tu_path("four.bin");
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "save", w1), 0);
  c.steps = 12, c.warmup_steps = 2, c.batch = 4, c.seq_len = 32, c.lr = 3e-4f, c.eval_batches = 4;
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  const char *common = "--model tiny --steps 12 --warmup_steps 2 --seq_len 32 --lr 3e-4 "
                       "--eval_batches 4";
  struct { const char *ranks, *extra, *path; } jobs[] = {
      {"2", "--batch 2", w2}, {"4", "--batch 1 --strategy HYBRID_SHARD --mesh 2x2", w4}};
  for (int j = 0; j < 2; j++) {
    char args[4096], out[65536];
    snprintf(args, sizeof args, "-n %s -- %s/bin/fsdp-train %s %s --data %s --save %s",
             jobs[j].ranks, tu_root(), common, jobs[j].extra, data, jobs[j].path);
    cr_assert_eq(launch_cmd(args, out, sizeof out), 0, "%s", out);
    const char *done = strstr(out, "[rank 0] train: done:");
    cr_assert_not_null(done, "%s", out);
    float first, last, eval;
    cr_assert_eq(sscanf(done, "[rank 0] train: done: %*d steps, loss %f -> %f, eval %f", &first,
                        &last, &eval), 3, "%s", done);
    cr_assert(fabsf(first - r.first_loss) <= 1e-4f && fabsf(last - r.last_loss) <= 1e-4f &&
              fabsf(eval - r.eval_loss) <= 1e-4f, "%s ranks: loss %f -> %f eval %f; one device "
              "%f -> %f eval %f", jobs[j].ranks, first, last, eval, r.first_loss, r.last_loss,
              r.eval_loss);
    gpt_t *a, *b;
    cr_assert_eq(gpt_load(&a, w1, kern_cpu()), 0, "%s", err_msg());
    cr_assert_eq(gpt_load(&b, jobs[j].path, kern_cpu()), 0, "%s", err_msg());
    for (int i = 0; i < gpt_num_tensors(a); i++) {
      const gpt_tensor_t *t = gpt_tensor(a, i);
      if (strstr(t->name, "qkv.b")) continue; /* the key bias: see test_fsdp.c */
      double e = tu_rel_err_f32f32(gpt_params(b) + t->offset, gpt_params(a) + t->offset, t->numel);
      cr_assert_leq(e, 1e-5, "%s ranks: %s differs by %.3e", jobs[j].ranks, t->name, e);
    }
    gpt_destroy(a);
    gpt_destroy(b);
  }
  free(data), free(w1), free(w2), free(w4);
}

/* A rank killed mid-run: the job stops at once, saying which rank died, and
 * leaves no process behind. */
/* Ranks given different options (here rank 1 another batch, which changes
 * no collective's size) stop at open, every rank saying why, instead of
 * training on with a loss that looks fine. */
Test(train, ranks_given_different_jobs_stop_at_open, .timeout = 60) {
  char *data = demo_tokens(), args[4096], out[65536];
  const char *diff[] = {"--batch 3", "--seed 7", "--lr 0.01"};
  for (int k = 0; k < 3; k++) {
    snprintf(args, sizeof args, "-n 2 -- sh -c 'X=; if [ \"$FSDP_RANK\" = 1 ]; then X=\"%s\"; fi; "
             "exec %s/bin/fsdp-train --model tiny --steps 3 --warmup_steps 1 --batch 2 "
             "--seq_len 32 --data %s $X'", diff[k], tu_root(), data);
    cr_assert_eq(launch_cmd(args, out, sizeof out), 1, "%s: %s", diff[k], out);
    for (int r = 0; r < 2; r++) {
      char want[96];
      snprintf(want, sizeof want, "[rank %d] fsdp-train: the ranks were not given the same job", r);
      cr_assert(strstr(out, want), "%s: missing \"%s\":\n%s", diff[k], want, out);
    }
    cr_assert_null(strstr(out, "step 1"), "%s: a step ran:\n%s", diff[k], out);
  }
  /* the same job on every rank runs */
  snprintf(args, sizeof args, "-n 2 -- %s/bin/fsdp-train --model tiny --steps 2 --warmup_steps 1 "
           "--batch 2 --seq_len 32 --data %s", tu_root(), data);
  cr_assert_eq(launch_cmd(args, out, sizeof out), 0, "%s", out);
  free(data);
}

/* A rank killed while its peers checkpoint every step: the survivor's last
 * words are the step's failure, not what finishing its last checkpoint
 * found (a shard missing, a manifest not there: the dead rank's). */
Test(train, a_killed_ranks_failure_is_what_its_peer_reports, .timeout = 60) {
  char *data = demo_tokens(), *ck = tu_path("ck"), args[4096], out[1 << 17];
  cr_assert_eq(mkdir(ck, 0755), 0);
  snprintf(args, sizeof args, "-n 2 --grace 2 -- env FSDP_PROGRESS_EVERY=1000000 sh -c 'if [ "
           "\"$FSDP_RANK\" = 1 ]; then (sleep 1.5; kill -9 $$) & fi; exec %s/bin/fsdp-train "
           "--model tiny --steps 1000000 --warmup_steps 1 --batch 2 --seq_len 32 --data %s "
           "--checkpoint_dir %s --checkpoint_every 1 --keep_checkpoints 2 --seed 8642098'",
           tu_root(), data, ck);
  cr_assert_eq(launch_cmd(args, out, sizeof out), 1, "%s", out);
  const char *last = strstr(out, "[rank 0] fsdp-train: ");
  cr_assert_not_null(last, "rank 0 said nothing:\n%s", out);
  char line[512];
  snprintf(line, sizeof line, "%.*s", (int)strcspn(last, "\n"), last);
  cr_assert(!strstr(line, "manifest") && !strstr(line, "cannot be committed"),
            "rank 0's last words are its last checkpoint's, not the step's failure: %s", line);
  cr_assert(strstr(line, "rank 1"), "the dead rank is not named: %s", line);
  cr_assert_neq(system("pgrep -f 'seed 864209[8]' >/dev/null"), 0, "no rank survived");
  free(data), free(ck);
}

Test(train, a_killed_rank_stops_the_job, .timeout = 60) {
  char *data = demo_tokens(), args[4096], out[65536];
  /* a progress line (and its memory line) every 20 steps: the output fits in out */
  snprintf(args, sizeof args, "-n 2 --grace 2 -- env FSDP_PROGRESS_EVERY=20 sh -c 'if [ \"$FSDP_RANK\" = 1 ]; then "
           "(sleep 1.5; kill -9 $$) & fi; exec %s/bin/fsdp-train --model tiny --steps 1000000 "
           "--warmup_steps 1 --batch 2 --seq_len 32 --data %s --seed 8642097'", tu_root(), data);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cr_assert_eq(launch_cmd(args, out, sizeof out), 1, "%s", out);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  cr_assert(strstr(out, "rank 1 was killed by signal 9"), "%s", out);
  cr_assert(strstr(out, "[rank 0] step"), "training was under way: %s", out);
  cr_assert_lt(secs, 1.5 + 5.0 + 1.0, "stopped within the comm timeout + 1 s (%.2f s)", secs);
  cr_assert_neq(system("pgrep -f 'seed 864209[7]' >/dev/null"), 0, "no rank survived");
  free(data);
}

/* ---- divergence ------------------------------------------------------------ */

#include "daemon/train/fsdp.h"
#include "daemon/job/ckpt.h"

/* The latest committed checkpoint under dir, opened on one rank: its step,
 * and whether every parameter is finite. */
static void latest_checkpoint(const char *data, const char *dir, int *step, int *finite) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "resume_from", dir), 0);
  c.steps = 1000, c.warmup_steps = 1, c.batch = 2, c.seq_len = 32, c.seed = 8642099;
  train_t *t;
  cr_assert_eq(train_open(&t, &c, NULL), 0, "%s", err_msg());
  train_state_t st;
  train_state(t, &st);
  *step = st.step;
  const size_t n = gpt_config_num_params(gpt_get_config(fsdp_model(st.runtime)));
  float *p = malloc(n * sizeof *p);
  cr_assert_not_null(p);
  cr_assert_eq(fsdp_gather_params(st.runtime, p), 0, "%s", err_msg());
  *finite = 1;
  for (size_t i = 0; i < n; i++) *finite &= isfinite(p[i]) != 0;
  free(p);
  train_close(t);
}

/* lr 10 with weight decay 10 (each step multiplies the matrices by -99)
 * diverges on 2 ranks: at step 8 the loss is still finite but the gradient
 * is NaN. That step stops the run, naming it, before the update: every
 * committed checkpoint holds finite weights (before, step 8's NaN update was
 * checkpointed and committed, and the run stopped at step 9). */
Test(train, a_nan_gradient_stops_the_run_before_its_update, .timeout = 60) {
  char *data = demo_tokens(), *ck = tu_path("ck"), args[4096], out[1 << 17];
  cr_assert_eq(mkdir(ck, 0755), 0);
  snprintf(args, sizeof args, "-n 2 -- %s/bin/fsdp-train --model tiny --steps 30 "
           "--warmup_steps 1 --batch 2 --seq_len 32 --data %s --lr 10 --weight_decay 10 "
           "--checkpoint_dir %s --checkpoint_every 1 --keep_checkpoints 2 --seed 8642099",
           tu_root(), data, ck);
  cr_assert_eq(launch_cmd(args, out, sizeof out), 1, "%s", out);
  const char *said = strstr(out, "[rank 0] fsdp-train: step ");
  cr_assert_not_null(said, "rank 0 said nothing:\n%s", out);
  int failed = 0;
  cr_assert_eq(sscanf(said, "[rank 0] fsdp-train: step %d", &failed), 1, "%s", said);
  cr_assert(strstr(said, "gradient norm is NaN") && strstr(said, "lr (now 10)"), "%.300s", said);
  int step, finite;
  latest_checkpoint(data, ck, &step, &finite);
  cr_assert_eq(step, failed - 1, "the latest checkpoint is the step before the failed one (%d, "
               "failed at %d)", step, failed);
  cr_assert(finite, "the committed checkpoint of step %d holds NaN or Inf", step);
  free(data), free(ck);
}

/* An update that leaves the model computing NaN (lr 10, beta2 0 and eps
 * 1e-30: step 2 divides by a gradient's square root near 0) while the
 * step's own loss and gradient were finite: the evaluation after it says so
 * and stops the run there, before the save (before, the run ended "done"
 * with eval "none (eval_fraction 0)" and saved the model). */
Test(train, a_nan_evaluation_stops_the_run_before_the_save) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens(), *w = tu_path("w.bin");
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "save", w), 0);
  c.steps = 2, c.warmup_steps = 1, c.batch = 4, c.seq_len = 32, c.lr = 10;
  c.beta1 = 0.999999f, c.beta2 = 0, c.eps = 1e-30f, c.grad_clip = 0;
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), FSDP_ERANGE, "%s", err_msg());
  cr_assert(strstr(err_msg(), "step 2: the evaluation loss") && strstr(err_msg(), "NaN"), "%s",
            err_msg());
  struct stat st;
  cr_assert_neq(stat(w, &st), 0, "a diverged model was saved to %s", w);
  free(data), free(w);
}

/* A run of one step reports that step's rate, not 0 (the rate is measured
 * over the steps after the first, and there were none). */
Test(train, a_one_step_run_reports_its_rate) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens();
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  c.steps = 1, c.warmup_steps = 1, c.batch = 2, c.seq_len = 32;
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  cr_assert_eq(r.steps_run, 1);
  cr_expect_gt(r.tokens_per_s, 0, "one step, %g tokens/s", r.tokens_per_s);
  cr_expect_lt(r.tokens_per_s, 2.0 * 32 / 1e-6, "a rate of %g tokens/s is not of this step",
               r.tokens_per_s);
  free(data);
}

/* A NaN in the parameters the loss never reads (a position row past
 * seq_len) trains on with finite losses: such a model is neither
 * checkpointed nor saved, and a weights file holding one is refused as
 * init_from, on every rank. */
Test(train, a_model_holding_nan_is_never_written_nor_loaded, .timeout = 60) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens(), *w = tu_path("w.bin"), *ck = tu_path("ck");
  cr_assert_eq(mkdir(ck, 0755), 0);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "save", w), 0);
  cr_assert_eq(config_set(&c, "checkpoint_dir", ck), 0);
  c.steps = 1, c.warmup_steps = 1, c.batch = 2, c.seq_len = 32, c.checkpoint_every = 1;
  size_t wpe_last = 0;
  for (int async = 0; async < 2; async++) { /* written in place, and by the writer thread */
    c.checkpoint_async = async;
    train_t *t;
    cr_assert_eq(train_open(&t, &c, NULL), 0, "%s", err_msg());
    train_state_t st;
    train_state(t, &st);
    fsdp_state_t fs;
    fsdp_state(st.runtime, &fs);
    const gpt_config_t *g = gpt_get_config(fsdp_model(st.runtime));
    wpe_last = (size_t)g->vocab * g->channels + (size_t)(g->context - 1) * g->channels;
    ((float *)fs.params)[wpe_last + 5] = NAN; /* one device: the shard is the flat model, on the host */
    cr_assert_eq(train_step(t), 0, "%s", err_msg());
    cr_assert_eq(train_finish(t), FSDP_EIO);
    cr_assert(strstr(err_msg(), "NaN"), "%s", err_msg());
    train_close(t);
    char dir[4096];
    cr_assert_eq(ckpt_latest(ck, dir, sizeof dir), FSDP_ENOENT, "async %d: a checkpoint was committed: %s",
                 async, dir);
    struct stat sb;
    cr_assert_neq(stat(w, &sb), 0, "a model holding NaN was saved to %s", w);
  }
  /* the same file written without the check, loaded on 2 ranks */
  c.checkpoint_every = 0, c.checkpoint_dir[0] = 0;
  cr_assert_eq(train_run(&c, NULL, &(train_result_t){0}), 0, "%s", err_msg());
  FILE *f = fopen(w, "r+b");
  cr_assert_not_null(f);
  const float nan = NAN;
  cr_assert_eq(fseek(f, 1024 + (long)(wpe_last + 5) * 4, SEEK_SET), 0);
  cr_assert_eq(fwrite(&nan, 4, 1, f), 1);
  cr_assert_eq(fclose(f), 0);
  char args[4096], out[65536];
  snprintf(args, sizeof args, "-n 2 -- %s/bin/fsdp-train --model tiny --steps 2 --warmup_steps 1 "
           "--batch 2 --seq_len 32 --data %s --init_from %s", tu_root(), data, w);
  cr_assert_eq(launch_cmd(args, out, sizeof out), 1, "%s", out);
  for (int r = 0; r < 2; r++) {
    char want[64];
    snprintf(want, sizeof want, "[rank %d] fsdp-train: init_from: ", r);
    cr_assert(strstr(out, want) && strstr(out, "NaN or Inf"), "missing \"%s\":\n%s", want, out);
  }
  cr_assert_null(strstr(out, "step 1"), "a step ran:\n%s", out);
  free(data), free(w), free(ck);
}

/* A run that would checkpoint steps its checkpoint_dir holds another run's
 * of is refused at start, naming both steps: before, a rewind (resume_from
 * an earlier step, auto_resume = 0) into the same directory wrote none of
 * those steps ("committed already"), and the next restart went on from the
 * other run's latest, losing the rewound run's work (helper-53). With
 * auto_resume the directory's own latest is taken, as before; another
 * checkpoint_dir takes the rewind. */
Test(train, a_run_never_checkpoints_into_steps_another_run_committed, .timeout = 60) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens(), *ck = tu_path("ck"), *ck2 = tu_path("ck2");
  cr_assert_eq(mkdir(ck, 0755), 0);
  cr_assert_eq(mkdir(ck2, 0755), 0);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "checkpoint_dir", ck), 0);
  c.steps = 4, c.warmup_steps = 1, c.batch = 2, c.seq_len = 32, c.checkpoint_every = 1;
  c.keep_checkpoints = 0, c.eval_batches = 1;
  train_result_t r;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  char step2[4200], dir[4096];
  snprintf(step2, sizeof step2, "%s/step-00000002", ck);
  config_t rew = c;
  rew.auto_resume = 0;
  cr_assert_eq(config_set(&rew, "resume_from", step2), 0);
  cr_assert_eq(train_run(&rew, NULL, &r), FSDP_EEXIST, "a rewind into the same directory");
  cr_assert(strstr(err_msg(), "holds step 4") && strstr(err_msg(), "starts at step 2") &&
                strstr(err_msg(), "checkpoint_dir of its own"), "%s", err_msg());
  config_t fresh = c;
  fresh.auto_resume = 0;
  cr_assert_eq(train_run(&fresh, NULL, &r), FSDP_EEXIST, "a fresh start into a used directory");
  cr_assert(strstr(err_msg(), "starts at step 0"), "%s", err_msg());
  cr_assert_eq(ckpt_latest(ck, dir, sizeof dir), 0);
  cr_assert(strstr(dir, "step-00000004"), "the first run's checkpoints stay: %s", dir);
  /* the rewind in a directory of its own: it goes on from step 2 */
  cr_assert_eq(config_set(&rew, "checkpoint_dir", ck2), 0);
  cr_assert_eq(train_run(&rew, NULL, &r), 0, "%s", err_msg());
  cr_assert_eq(ckpt_latest(ck2, dir, sizeof dir), 0);
  cr_assert(strstr(dir, "step-00000004"), "%s", dir);
  /* and with auto_resume the directory's latest is its own: taken */
  c.steps = 5;
  cr_assert_eq(train_run(&c, NULL, &r), 0, "%s", err_msg());
  cr_assert_eq(ckpt_latest(ck, dir, sizeof dir), 0);
  cr_assert(strstr(dir, "step-00000005"), "%s", dir);
  free(data), free(ck), free(ck2);
}

/* The checkpoint shard frames a rank wrote: step, rank, path and failed. */
typedef struct {
  int n;
  int64_t step[4];
  uint32_t rank[4];
  char path[4][256], failed[4][512];
} shard_frames_t;

static int shard_frames_add(void *arg, const uint8_t *data, size_t n) {
  shard_frames_t *f = arg;
  Fsdp__V1__RankReport *rep = fsdp__v1__rank_report__unpack(NULL, n, data);
  cr_assert_not_null(rep);
  if (rep->kind_case == FSDP__V1__RANK_REPORT__KIND_SHARD) {
    cr_assert_lt(f->n, 4);
    f->step[f->n] = rep->shard->step, f->rank[f->n] = rep->shard->rank;
    snprintf(f->path[f->n], sizeof f->path[0], "%s", rep->shard->path);
    snprintf(f->failed[f->n], sizeof f->failed[0], "%s", rep->shard->failed);
    f->n++;
  }
  fsdp__v1__rank_report__free_unpacked(rep, NULL);
  return 0;
}

/* A rank whose shard cannot be written (here: NaN in its weights, which no
 * checkpoint takes) says so on its report channel, for fsdpd to relay: one
 * shard frame with its step and rank, no path, and the error in `failed`,
 * so the coordinator aborts that checkpoint at once instead of after
 * --checkpoint-timeout-ms; and the step directory it made is gone (no
 * empty step-N/ left under checkpoint_dir). In place and by the writer
 * thread alike. */
Test(train, a_shard_not_written_is_reported_and_leaves_no_directory, .timeout = 60) {
  config_t c;
  config_default(&c);
  char *data = demo_tokens(), *ck = tu_path("ck");
  cr_assert_eq(mkdir(ck, 0755), 0);
  cr_assert_eq(config_set(&c, "data", data), 0);
  cr_assert_eq(config_set(&c, "model", "tiny"), 0);
  cr_assert_eq(config_set(&c, "checkpoint_dir", ck), 0);
  c.steps = 1, c.warmup_steps = 1, c.batch = 2, c.seq_len = 32, c.checkpoint_every = 1;
  c.sample_tokens = 0;
  for (int async = 0; async < 2; async++) {
    c.checkpoint_async = async;
    int rd;
    report_t *rep = report_socket(&rd);
    train_opts_t o = {.checkpoint = report_checkpoint, .ctx = rep};
    train_t *t;
    cr_assert_eq(train_open(&t, &c, &o), 0, "%s", err_msg());
    train_state_t st;
    train_state(t, &st);
    fsdp_state_t fs;
    fsdp_state(st.runtime, &fs);
    const gpt_config_t *g = gpt_get_config(fsdp_model(st.runtime));
    /* the last position's embedding: a 32-token step never reads it */
    ((float *)fs.params)[(size_t)g->vocab * g->channels + (size_t)(g->context - 1) * g->channels] = NAN;
    cr_assert_eq(train_step(t), 0, "%s", err_msg());
    train_finish(t); /* the writer thread's shard is reported by the end of the run */
    train_close(t);
    report_close(rep);
    shard_frames_t f = {0};
    reports_read(rd, shard_frames_add, &f);
    cr_assert_eq(f.n, 1, "async %d: %d shard frames", async, f.n);
    cr_expect(f.step[0] == 1 && f.rank[0] == 0 && !f.path[0][0], "async %d: step %lld rank %u "
              "path '%s'", async, (long long)f.step[0], f.rank[0], f.path[0]);
    cr_expect(strstr(f.failed[0], "NaN"), "async %d: failed '%s'", async, f.failed[0]);
    DIR *d = opendir(ck);
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d));)
      cr_expect(e->d_name[0] == '.', "async %d: %s/%s left behind", async, ck, e->d_name);
    closedir(d);
  }
  unsetenv("FSDP_REPORT_FD");
  free(data), free(ck);
}

/* sample_prompt is text: a model with a vocabulary other than bytes cannot
 * read it without a tokenizer and starts from token 0; a prompt given is
 * not dropped without a word. */
Test(train, a_text_prompt_a_token_vocabulary_cannot_read_is_said) {
  char *data = demo_tokens(), args[4096], out[65536];
  snprintf(args, sizeof args, "--model tiny --vocab 512 --seq_len 32 --data %s --steps 1 "
           "--eval_batches 1 --sample_tokens 2 --sample_prompt Hello", data);
  cr_assert_eq(run_cmd(args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "sample_prompt is text") && strstr(out, "vocab 512 starts from token 0"),
            "%s", out);
  snprintf(args, sizeof args, "--model tiny --vocab 512 --seq_len 32 --data %s --steps 1 "
           "--eval_batches 1 --sample_tokens 2", data);
  cr_assert_eq(run_cmd(args, out, sizeof out), 0, "%s", out);
  cr_assert_null(strstr(out, "sample_prompt is text"), "no prompt given, none to speak of:\n%s", out);
  free(data);
}

/* A token file made for another vocabulary than the model's (bytes, 256,
 * under a vocab-512 model) is said at start, with the fix; the same
 * vocabulary, or a file that does not say, is quiet. */
Test(train, a_token_file_made_for_another_vocabulary_is_said) {
  uint16_t *tok = malloc(20000 * sizeof *tok);
  cr_assert_not_null(tok);
  for (int i = 0; i < 20000; i++) tok[i] = (uint16_t)(i * 7 % 256);
  char *p = tu_path("bytes256.bin"), args[4200], out[65536];
  cr_assert_eq(data_write_for(p, tok, 20000, 256), 0, "%s", err_msg());
  const char *want = "was made for a vocabulary of 256 (bytes: fsdp-tokenize), the model has 512";
  for (int k = 0; k < 3; k++) {
    if (k == 2) cr_assert_eq(data_write(p, tok, 20000), 0, "%s", err_msg()); /* not said */
    snprintf(args, sizeof args, "--model tiny --vocab %d --seq_len 32 --data %s --steps 1 "
             "--eval_batches 1 --sample_tokens 0", k == 1 ? 256 : 512, p);
    cr_assert_eq(run_cmd(args, out, sizeof out), 0, "%s", out);
    cr_assert_eq(strstr(out, want) != NULL, k == 0, "case %d:\n%s", k, out);
  }
  free(tok), free(p);
}

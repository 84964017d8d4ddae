/* test_isa: a training rank gives the same losses, bit for bit, whatever ISA
 * level its CPU kernels run at. test_kernels compares the levels op by op;
 * this is the end-to-end check, through the tunable a user sets
 * (FSDP_CPU_ISA, read by daemon/train/device.c): the generic paths forced
 * against the default (the best level this processor has).
 *
 * Each run is a forked child, so that it can set FSDP_CPU_ISA before anything
 * reads it (tunables are read once per process). The child trains the tiny
 * model a few steps through train_open/train_step and writes, per step, the
 * loss, the gradient norm and any evaluation loss as raw bits, then the
 * level its kernels ran at, to a pipe. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"
#include "daemon/train/train.h"
#include "kernels/kern.h"
#include "kernels/kern_math.h"
#include "tests/unit/testutil.h"

enum { ISA_STEPS = 6 };

typedef struct {
  int32_t step, evaluated;
  uint32_t loss, grad_norm, eval_loss; /* float bits */
} isa_step_t;

typedef struct {
  isa_step_t s[ISA_STEPS];
  int n;
  int32_t level; /* kern_cpu_isa() after the run */
} isa_trace_t;

static void isa_write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t k = write(fd, b, n);
    if (k <= 0) _exit(3);
    b += k, n -= (size_t)k;
  }
}

static void isa_on_step(void *ctx, const train_metrics_t *m) {
  isa_step_t s = {m->step, m->evaluated, kern_asuint(m->loss), kern_asuint(m->grad_norm),
                  kern_asuint(m->evaluated ? m->eval_loss : 0.0f)};
  isa_write_all(*(int *)ctx, &s, sizeof s);
}

/* The child: isa is FSDP_CPU_ISA's value (NULL: unset, the default). */
static _Noreturn void isa_child(int fd, const char *isa, const char *data, const char *precision) {
  if (isa) setenv("FSDP_CPU_ISA", isa, 1);
  else unsetenv("FSDP_CPU_ISA");
  config_t c;
  config_default(&c);
  if (config_set(&c, "data", data) || config_set(&c, "model", "tiny") ||
      config_set(&c, "precision", precision))
    _exit(4);
  c.steps = ISA_STEPS;
  c.batch = 4;
  c.seq_len = 64; /* softmax rows of every length 1..64 */
  c.warmup_steps = 2;
  c.lr = 3e-3f;
  c.eval_every = 3;
  c.eval_batches = 2;
  c.threads = 2;
  train_opts_t o = {.metrics = isa_on_step, .ctx = &fd};
  train_t *t;
  if (train_open(&t, &c, &o)) {
    fprintf(stderr, "test_isa child: %s\n", err_msg());
    _exit(5);
  }
  while (!train_done(t))
    if (train_step(t)) _exit(6);
  train_close(t);
  isa_step_t end = {-1, (int32_t)kern_cpu_isa(), 0, 0, 0};
  isa_write_all(fd, &end, sizeof end);
  _exit(0);
}

static void isa_run(isa_trace_t *tr, const char *isa, const char *data, const char *precision) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(p[0]);
    isa_child(p[1], isa, data, precision);
  }
  close(p[1]);
  memset(tr, 0, sizeof *tr);
  tr->level = -1;
  isa_step_t s;
  size_t got = 0;
  ssize_t k;
  while ((k = read(p[0], (char *)&s + got, sizeof s - got)) > 0) {
    got += (size_t)k;
    if (got < sizeof s) continue;
    got = 0;
    if (s.step == -1) tr->level = s.evaluated;
    else if (tr->n < ISA_STEPS) tr->s[tr->n++] = s;
  }
  close(p[0]);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "FSDP_CPU_ISA=%s: the child failed (status %d)",
            isa ? isa : "(unset)", st);
  cr_assert_eq(tr->n, ISA_STEPS, "FSDP_CPU_ISA=%s: %d steps reported", isa ? isa : "(unset)", tr->n);
}

static void check_generic_matches_default(const char *precision) {
  char *data = tu_token_file("tokens.bin", 1 << 15, 7, 256);
  isa_trace_t def, gen;
  isa_run(&def, NULL, data, precision);
  isa_run(&gen, "1", data, precision);
  cr_assert_eq(gen.level, KERN_CPU_ISA_GENERIC, "FSDP_CPU_ISA=1 ran at %d", gen.level);
  cr_assert_eq(def.level, kern_cpu_isa_best(), "the default ran at %d", def.level);
  if (def.level == KERN_CPU_ISA_GENERIC)
    cr_log_warn("this processor's best level is generic: both runs took the same paths");
  int evals = 0;
  for (int i = 0; i < ISA_STEPS; i++) {
    const isa_step_t *a = &def.s[i], *b = &gen.s[i];
    const float la = kern_asfloat(a->loss), lb = kern_asfloat(b->loss);
    cr_expect_eq(a->step, b->step);
    cr_expect_eq(a->loss, b->loss, "%s step %d: loss %a (%s) vs %a (generic)", precision, a->step,
                 la, kern_cpu_isa_name((kern_cpu_isa_t)def.level), lb);
    cr_expect_eq(a->grad_norm, b->grad_norm, "%s step %d: grad norm bits 0x%08x vs 0x%08x",
                 precision, a->step, a->grad_norm, b->grad_norm);
    cr_expect_eq(a->evaluated, b->evaluated);
    cr_expect_eq(a->eval_loss, b->eval_loss, "%s step %d: eval loss bits 0x%08x vs 0x%08x",
                 precision, a->step, a->eval_loss, b->eval_loss);
    evals += a->evaluated;
  }
  cr_expect_geq(evals, 2, "evaluations ran");
  /* the runs trained: a constant loss would make the comparison empty */
  cr_expect_neq(def.s[0].loss, def.s[ISA_STEPS - 1].loss);
  free(data);
}

Test(isa, generic_forced_matches_default_fp32, .timeout = 120) {
  check_generic_matches_default("fp32");
}

Test(isa, generic_forced_matches_default_bf16, .timeout = 120) {
  check_generic_matches_default("bf16-mixed");
}

/* The tunable's values: a level number runs at that level, anything else at
 * the best one (device.c warns, naming the variable and the choices). */
static int isa_level_for(const char *value) {
  char *data = tu_token_file("tokens.bin", 1 << 15, 7, 256);
  isa_trace_t tr;
  isa_run(&tr, value, data, "fp32");
  free(data);
  return tr.level;
}

Test(isa, tunable_values, .timeout = 120) {
  const int best = kern_cpu_isa_best();
  cr_expect_eq(isa_level_for("0"), best, "0: auto");
  cr_expect_eq(isa_level_for("2"), best, "2 is not a level");
  cr_expect_eq(isa_level_for("avx2"), best, "not an integer");
  if (best >= KERN_CPU_ISA_AVX2) cr_expect_eq(isa_level_for("3"), KERN_CPU_ISA_AVX2);
}

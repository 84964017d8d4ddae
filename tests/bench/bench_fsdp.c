/* bench_fsdp: the sharded training step with 2 rank processes on loopback
 * (ring communicators, 1 OpenMP thread each) under FULL_SHARD (mesh 1x2),
 * SHARD_GRAD_OP (1x2) and NO_SHARD (2x1), against one rank, and how much of
 * the step's communication hides behind compute.
 *
 *   bench_fsdp PRESET B T STEPS
 *
 * B and T are per rank: every configuration runs the same micro-batch on each
 * rank, so the global batch is B x ranks and tokens_per_s counts global tokens.
 * Each rank trains on its own rows (a fixed pseudo-random token sequence). A
 * step is what the training loop does (train.c): zero the gradient, forward,
 * backward, average the loss over the ranks, the optimizer step (global norm,
 * no clipping, AdamW on the shard). The flat path (one rank, and the
 * compute-only run) is bench_train's step: zero, forward, backward, AdamW.
 *
 * Two rank processes run STEPS rounds (after two warm-up rounds); a round runs
 * every configuration once, back to back, each after a barrier, so that a
 * busy neighbour on this shared machine slows all of them alike:
 *  - one rank alone (rank 0; rank 1 waits), the flat gpt/adamw step, 1 thread
 *    and then 2 threads: the single-device step (fsdp_one_rank lines);
 *  - both ranks running the flat step at once, no communication, 1 thread
 *    each: compute_ms, what a rank's compute costs while its peer computes
 *    too (they share the caches and memory bandwidth; against one rank alone
 *    that sharing would be counted as communication);
 *  - each strategy's step, 1 thread per rank: step_ms. The communicator is
 *    wrapped in a recording backend (bench_train -p's timing-layer idea): it
 *    logs every collective a step issues (op, size, group) and the time the
 *    rank is blocked in comm_wait (wait_ms: communication the step did not
 *    hide, whatever the runtime's schedule);
 *  - each strategy's collectives of one step (logged in the last warm-up
 *    round), replayed blocking, one after the other, with no compute: comm_ms.
 *
 * A step's time is the slower rank's; the median over the rounds is reported.
 * exposed_ms = step_ms - compute_ms; hidden_share = 1 - exposed_ms / comm_ms,
 * clamped to [0, 1] (1: the step costs no more than its compute; 0: it costs
 * its compute plus every collective run alone, or more). Everything lives at
 * once in each rank (the flat model and a runtime per strategy): for
 * gpt2-124m about 6 GiB per rank.
 *
 * Diagnostics on the fsdp line: wait_gather_ms / wait_reduce_ms split wait_ms
 * (all-gathers; reduce-scatters and all-reduces); comm_mib is one rank's
 * payload per step; comm_cpu_ms the CPU time a rank spends during the replay
 * (the ring's thread moving bytes through loopback TCP: on a 2-core machine
 * running two 1-thread ranks, comm that runs beside compute takes its CPU
 * from compute); page_faults the minor faults per step (buffers allocated
 * per unit per step come back as fresh pages from mmap).
 *
 * Lines (stdout):
 *   bench: fsdp_one_rank model= B= T= threads= step_ms= tokens_per_s= ...
 *   bench: fsdp_compute_only model= ranks=2 B= T= threads=1 step_ms= ...
 *   bench: fsdp model= strategy= mesh= ranks=2 B= T= step_ms= tokens_per_s=
 *          compute_ms= comm_ms= exposed_ms= hidden_share= wait_ms= ...
 * Exit status 0; 1 when a phase fails (its message on stderr); 2 on bad usage. */
#include <arpa/inet.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/bench/benchutil.h"
#include "daemon/comm/ring.h"
#include "daemon/common/err.h"
#include "daemon/train/adamw.h"
#include "daemon/train/fsdp.h"
#include "daemon/train/gpt.h"

#define RANKS 2
#define MAX_STEPS 64
#define WARMUP 1
#define MAX_LOG 1024
#define LR 1e-4f

static const adamw_hparams_t HP = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.1f};

static double minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_minflt;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(const double *v, int n) {
  double s[MAX_STEPS * RANKS];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_d);
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static double minimum(const double *v, int n) {
  double m = v[0];
  for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
  return m;
}

/* ---- the recording communicator ------------------------------------------ */

/* Wraps a ring communicator: every op goes to the ring unchanged; issue logs
 * it (while recording) and wait adds the time the caller was blocked. */
typedef struct rec_comm {
  struct comm base; /* first: comm.c sees a comm_t */
  comm_t *inner;
} rec_comm_t;

typedef struct rec_req {
  struct comm_req base;
  comm_req_t *inner;
  int reduce; /* 0: all-gather (or other), 1: reduce-scatter or all-reduce */
} rec_req_t;

typedef struct rec_entry {
  comm_t *inner;
  comm_args_t a; /* buffers dropped: the replay brings its own */
} rec_entry_t;

/* One rank process: its log and waits (processes do not share these). */
static struct {
  int recording, n, overflow;
  rec_entry_t log[MAX_LOG];
  double wait_s[2]; /* blocked in comm_wait: gathers, reductions */
  size_t bytes;     /* per-rank payload of the logged ops */
} rec;

extern const comm_backend_t rec_backend;

static int rec_supports(comm_op_t op, comm_dtype_t dt) { return comm_ring_backend.supports(op, dt); }

static int rec_issue(comm_t *c, const comm_args_t *a, comm_req_t **req) {
  rec_comm_t *w = (rec_comm_t *)c;
  rec_req_t *r = malloc(sizeof *r);
  if (!r) return err_set(FSDP_ENOMEM, "bench_fsdp: out of memory");
  int rc = comm_issue(w->inner, a, &r->inner);
  if (rc < 0) {
    free(r);
    return rc;
  }
  r->base.be = &rec_backend;
  r->reduce = a->op == COMM_OP_REDUCE_SCATTER || a->op == COMM_OP_ALL_REDUCE;
  if (rec.recording) {
    if (rec.n < MAX_LOG) {
      rec_entry_t *e = &rec.log[rec.n++];
      e->inner = w->inner;
      e->a = *a;
      e->a.send = e->a.recv = NULL;
      size_t total = a->op == COMM_OP_ALL_GATHER || a->op == COMM_OP_REDUCE_SCATTER
                         ? a->count * (size_t)comm_size(c) : a->count;
      rec.bytes += total * comm_dtype_size(a->dtype);
    } else {
      rec.overflow = 1;
    }
  }
  *req = &r->base;
  return 0;
}

static int rec_wait(comm_req_t *req, int64_t wait_ms) {
  rec_req_t *r = (rec_req_t *)req;
  double t0 = bench_now_s();
  int rc = comm_wait(r->inner, wait_ms);
  rec.wait_s[r->reduce] += bench_now_s() - t0;
  if (rc != COMM_PENDING) free(r);
  return rc;
}

static void rec_abort(comm_t *c) { comm_abort(((rec_comm_t *)c)->inner); }

static void rec_destroy(comm_t *c) {
  comm_destroy(((rec_comm_t *)c)->inner);
  free(c);
}

/* Wraps communicators made elsewhere: it never splits, and holds nothing of
 * its own. */
static int rec_split(comm_t *c, int color, int key, const char *name, int64_t timeout_ms,
                     comm_t **out) {
  (void)c, (void)color, (void)key, (void)name, (void)timeout_ms;
  *out = NULL;
  return err_set(FSDP_EUNSUPPORTED, "the recording backend does not split");
}
static size_t rec_buffer_bytes(int size) { return (void)size, 0; }

const comm_backend_t rec_backend = {"recording", rec_supports, rec_issue, rec_wait, rec_abort,
                                    rec_destroy, rec_split, rec_buffer_bytes};

static comm_t *rec_wrap(comm_t *inner) {
  rec_comm_t *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->base.be = &rec_backend;
  w->base.rank = comm_rank(inner);
  w->base.size = comm_size(inner);
  snprintf(w->base.name, sizeof w->base.name, "%s", comm_name(inner));
  w->inner = inner;
  return &w->base;
}

/* Runs the logged collectives once, blocking, one after the other. */
static int rec_replay(float *send, float *recv) {
  for (int i = 0; i < rec.n; i++) {
    comm_args_t a = rec.log[i].a;
    a.send = send;
    a.recv = recv;
    int rc = comm_run(rec.log[i].inner, &a);
    if (rc < 0) return rc;
  }
  return 0;
}

static size_t rec_max_elems(void) {
  size_t m = 1;
  for (int i = 0; i < rec.n; i++) {
    const comm_args_t *a = &rec.log[i].a;
    size_t e = a->op == COMM_OP_ALL_GATHER || a->op == COMM_OP_REDUCE_SCATTER
                   ? a->count * (size_t)comm_size(rec.log[i].inner) : a->count;
    if (e > m) m = e;
  }
  return m;
}

/* ---- what the processes share ------------------------------------------- */

enum { PH_ONE_1T, PH_ONE_2T, PH_COMPUTE, PH_FULL, PH_GRAD_OP, PH_NO_SHARD, PH__COUNT };

typedef struct phase_result {
  double step_s[RANKS][MAX_STEPS];
  double wait_s[RANKS][MAX_STEPS][2];
  double comm_s[RANKS][MAX_STEPS];
  double comm_cpu_s[RANKS][MAX_STEPS]; /* CPU time of the replay (the ring's thread) */
  double faults[RANKS][MAX_STEPS];     /* minor page faults in the step */
  int ops;
  double bytes;
  float loss;
} phase_result_t;

typedef struct shared {
  phase_result_t ph[PH__COUNT];
} shared_t;

static const struct {
  shard_strategy_t st;
  int R, S;
  const char *mesh;
} strategies[3] = {{SHARD_FULL_SHARD, 1, 2, "1x2"},
                   {SHARD_SHARD_GRAD_OP, 1, 2, "1x2"},
                   {SHARD_NO_SHARD, 2, 1, "2x1"}};

typedef struct job {
  gpt_config_t cfg;
  int B, T, steps;
  shared_t *sh;
} job_t;

/* Rank r's rows of the global batch: rows r*B .. r*B+B-1 of a fixed sequence. */
static void make_batch(const job_t *j, int r, int32_t *in, int32_t *tg) {
  const int B = j->B, T = j->T;
  uint64_t s = 42;
  for (int row = 0; row < (r + 1) * B; row++)
    for (int t = 0; t <= T; t++) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      int32_t v = (int32_t)((s >> 33) % (uint64_t)j->cfg.vocab);
      if (row < r * B) continue;
      int b = row - r * B;
      if (t < T) in[b * T + t] = v;
      if (t > 0) tg[b * T + t - 1] = v;
    }
}

static int flat_step(gpt_t *g, adamw_t *opt, const int32_t *in, const int32_t *tg, int B, int T,
                     float *loss) {
  gpt_zero_grad(g);
  int rc = gpt_forward_train(g, in, tg, B, T, 1.0f, loss);
  if (rc == 0) rc = gpt_backward(g, 1.0f);
  if (rc == 0) adamw_step(opt, g, LR);
  return rc;
}

static int sharded_step(fsdp_t *f, const int32_t *in, const int32_t *tg, int B, int T,
                           float *loss) {
  fsdp_zero_grad(f);
  int rc = gpt_forward_train(fsdp_model(f), in, tg, B, T, 1.0f, loss);
  if (rc == 0) rc = gpt_backward(fsdp_model(f), 1.0f);
  if (rc == 0) rc = fsdp_mean(f, loss);
  if (rc == 0) rc = fsdp_step(f, LR, 0.0f, NULL);
  return rc;
}

/* What a rank holds: the flat model (the one-rank and compute-only steps),
 * one runtime per strategy, and its rows of the batch. */
typedef struct rank_state {
  gpt_t *g;
  adamw_t *opt;
  fsdp_t *f[3];
  int32_t *in, *tg;
  float *send, *recv; /* replay buffers */
  rec_entry_t log[3][MAX_LOG];
  int nlog[3];
  size_t bytes[3];
} rank_state_t;

static int rank_setup(rank_state_t *s, const job_t *j, int r, comm_t *world) {
  const size_t n = (size_t)j->B * j->T;
  s->in = malloc(n * sizeof *s->in);
  s->tg = malloc(n * sizeof *s->tg);
  if (!s->in || !s->tg) return err_set(FSDP_ENOMEM, "bench_fsdp: token buffers");
  make_batch(j, r, s->in, s->tg);
  int rc = gpt_create(&s->g, &j->cfg, kern_cpu());
  if (rc < 0) return rc;
  gpt_init_weights(s->g, 1337);
  if ((rc = adamw_create(&s->opt, s->g, HP)) < 0) return rc;
  for (int k = 0; k < 3; k++) {
    fsdp_opts_t o = {.be = kern_cpu(), .mesh = {strategies[k].R, strategies[k].S, strategies[k].st},
                     .seed = 1337, .hp = HP};
    if (strategies[k].S > 1) o.shard_comm = world;
    else o.replica_comm = world;
    if ((rc = fsdp_create(&s->f[k], &j->cfg, &o)) < 0) return rc;
  }
  return 0;
}

static void rank_teardown(rank_state_t *s) {
  for (int k = 0; k < 3; k++) fsdp_destroy(s->f[k]);
  adamw_destroy(s->opt);
  gpt_destroy(s->g);
  free(s->in);
  free(s->tg);
  free(s->send);
  free(s->recv);
}

/* One round: every configuration once, back to back, each after a barrier,
 * so a busy neighbour slows them alike. Round i < 0 is a warm-up; the last
 * warm-up records each strategy's collectives for the replays. */
static int rank_round(rank_state_t *s, const job_t *j, int r, comm_t *world, int i) {
  comm_t *ring = ((rec_comm_t *)world)->inner;
  shared_t *sh = j->sh;
  float loss = NAN;
  double t0;
  int rc;
  /* one rank alone (rank 1 waits in the next barrier), 1 then 2 threads */
  for (int th = 1; th <= 2; th++) {
    if ((rc = comm_barrier(ring)) < 0) return rc;
    if (r != 0) continue;
    kern_cpu()->set_threads(th);
    t0 = bench_now_s();
    rc = flat_step(s->g, s->opt, s->in, s->tg, j->B, j->T, &loss);
    if (i >= 0) sh->ph[PH_ONE_1T + th - 1].step_s[0][i] = bench_now_s() - t0;
    kern_cpu()->set_threads(1);
    if (rc < 0) return rc;
  }
  /* both ranks compute, no communication */
  if ((rc = comm_barrier(ring)) < 0) return rc;
  t0 = bench_now_s();
  if ((rc = flat_step(s->g, s->opt, s->in, s->tg, j->B, j->T, &loss)) < 0) return rc;
  if (i >= 0) sh->ph[PH_COMPUTE].step_s[r][i] = bench_now_s() - t0;
  if (!isfinite(loss)) return err_set(FSDP_EINVAL, "bench_fsdp: flat loss is not finite");
  for (int k = 0; k < 3; k++) {
    phase_result_t *p = &sh->ph[PH_FULL + k];
    if ((rc = comm_barrier(ring)) < 0) return rc;
    rec.wait_s[0] = rec.wait_s[1] = 0;
    rec.recording = i == -1;
    rec.n = rec.overflow = 0;
    rec.bytes = 0;
    double f0 = minflt();
    t0 = bench_now_s();
    rc = sharded_step(s->f[k], s->in, s->tg, j->B, j->T, &loss);
    double t = bench_now_s() - t0;
    f0 = minflt() - f0;
    rec.recording = 0;
    if (rc < 0) return rc;
    if (!isfinite(loss))
      return err_set(FSDP_EINVAL, "bench_fsdp: %s loss is not finite", shard_strategy_name(strategies[k].st));
    if (i == -1) {
      if (rec.overflow) return err_set(FSDP_EINVAL, "bench_fsdp: over %d collectives a step", MAX_LOG);
      memcpy(s->log[k], rec.log, (size_t)rec.n * sizeof *rec.log);
      s->nlog[k] = rec.n;
      s->bytes[k] = rec.bytes;
    }
    if (i < 0) continue;
    p->step_s[r][i] = t;
    p->faults[r][i] = f0;
    p->wait_s[r][i][0] = rec.wait_s[0];
    p->wait_s[r][i][1] = rec.wait_s[1];
    if (r == 0) {
      p->loss = loss;
      p->ops = s->nlog[k];
      p->bytes = (double)s->bytes[k];
    }
  }
  if (i < 0) return 0;
  /* the same collectives alone, blocking, no compute */
  if (!s->send) {
    size_t m = 1;
    for (int k = 0; k < 3; k++) {
      rec.n = s->nlog[k];
      memcpy(rec.log, s->log[k], (size_t)rec.n * sizeof *rec.log);
      size_t e = rec_max_elems();
      m = e > m ? e : m;
    }
    s->send = calloc(m, sizeof *s->send);
    s->recv = calloc(m, sizeof *s->recv);
    if (!s->send || !s->recv) return err_set(FSDP_ENOMEM, "bench_fsdp: replay buffers");
  }
  for (int k = 0; k < 3; k++) {
    rec.n = s->nlog[k];
    memcpy(rec.log, s->log[k], (size_t)rec.n * sizeof *rec.log);
    if ((rc = comm_barrier(ring)) < 0) return rc;
    double c0 = bench_cpu_s();
    t0 = bench_now_s();
    if ((rc = rec_replay(s->send, s->recv)) < 0) return rc;
    sh->ph[PH_FULL + k].comm_s[r][i] = bench_now_s() - t0;
    sh->ph[PH_FULL + k].comm_cpu_s[r][i] = bench_cpu_s() - c0;
  }
  return 0;
}


/* A rank process: every round. */
static int rank_main(const job_t *j, int r, const char *const *addrs, int lfd) {
  comm_ring_opts_t ro = {.rank = r, .size = RANKS, .addrs = addrs, .name = "bench_fsdp",
                         .listen_fd = lfd, .timeout_ms = 300000};
  comm_t *ring = NULL, *world = NULL;
  rank_state_t *s = calloc(1, sizeof *s);
  kern_cpu()->set_threads(1);
  int rc = s ? comm_ring_create(&ro, &ring) : err_set(FSDP_ENOMEM, "bench_fsdp: out of memory");
  if (rc < 0) goto out;
  if (!(world = rec_wrap(ring))) {
    comm_destroy(ring);
    rc = err_set(FSDP_ENOMEM, "bench_fsdp: out of memory");
    goto out;
  }
  if ((rc = rank_setup(s, j, r, world)) < 0) goto out;
  for (int i = -WARMUP; i < j->steps; i++)
    if ((rc = rank_round(s, j, r, world, i)) < 0) goto out;
out:
  if (rc < 0) fprintf(stderr, "bench_fsdp rank %d: %s (%s)\n", r, err_msg(), err_name(rc));
  if (s) rank_teardown(s);
  free(s);
  comm_destroy(world);
  return rc < 0;
}

static int wait_child(pid_t p, const char *what) {
  int st = 0;
  if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st)) {
    fprintf(stderr, "bench_fsdp: %s failed (status %d)\n", what, st);
    return 1;
  }
  return 0;
}

/* Per step: the slower rank (ranks 0..n-1); the median and the fastest step. */
static void step_stats(const phase_result_t *p, int nranks, int steps, double *med, double *min) {
  double v[MAX_STEPS];
  for (int i = 0; i < steps; i++) {
    v[i] = p->step_s[0][i];
    for (int r = 1; r < nranks; r++) v[i] = fmax(v[i], p->step_s[r][i]);
  }
  *med = median(v, steps);
  *min = minimum(v, steps);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: bench_fsdp PRESET B T STEPS (STEPS <= %d)\n", MAX_STEPS);
    return 2;
  }
  job_t j = {.B = atoi(argv[2]), .T = atoi(argv[3]), .steps = atoi(argv[4])};
  const char *preset = argv[1];
  if (j.B <= 0 || j.T <= 0 || j.steps <= 0 || j.steps > MAX_STEPS) {
    fprintf(stderr, "usage: bench_fsdp PRESET B T STEPS (STEPS <= %d)\n", MAX_STEPS);
    return 2;
  }
  if (gpt_config_preset(&j.cfg, preset) < 0 || gpt_config_validate(&j.cfg) < 0) {
    fprintf(stderr, "bench_fsdp: %s\n", err_msg());
    return 2;
  }
  if (j.T > j.cfg.context) {
    fprintf(stderr, "bench_fsdp: T=%d exceeds the context %d of %s\n", j.T, j.cfg.context, preset);
    return 2;
  }
  j.sh = mmap(NULL, sizeof *j.sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (j.sh == MAP_FAILED) {
    perror("bench_fsdp: mmap");
    return 1;
  }
  memset(j.sh, 0, sizeof *j.sh);
  fflush(stdout);

  char addr[RANKS][64];
  int lfd[RANKS];
  for (int r = 0; r < RANKS; r++)
    if ((lfd[r] = bench_listen_loopback(addr[r], sizeof addr[r])) < 0) {
      perror("bench_fsdp: bind");
      return 1;
    }
  const char *addrs[RANKS] = {addr[0], addr[1]};
  pid_t pid[RANKS];
  for (int r = 0; r < RANKS; r++) {
    if ((pid[r] = fork()) < 0) return 1;
    if (pid[r] == 0) {
      for (int q = 0; q < RANKS; q++)
        if (q != r) close(lfd[q]);
      _exit(rank_main(&j, r, addrs, lfd[r]));
    }
  }
  for (int r = 0; r < RANKS; r++) close(lfd[r]);
  int bad = 0;
  for (int r = 0; r < RANKS; r++) bad |= wait_child(pid[r], "a rank");
  if (bad) return 1;

  const double tok1 = (double)j.B * j.T, tok2 = tok1 * RANKS;
  double one_ms[2], med, min;
  for (int t = 0; t < 2; t++) {
    step_stats(&j.sh->ph[PH_ONE_1T + t], 1, j.steps, &med, &min);
    one_ms[t] = med * 1e3;
    printf("bench: fsdp_one_rank model=%s B=%d T=%d threads=%d step_ms=%.1f tokens_per_s=%.1f "
           "step_ms_min=%.1f steps=%d\n",
           preset, j.B, j.T, t + 1, med * 1e3, tok1 / med, min * 1e3, j.steps);
  }
  step_stats(&j.sh->ph[PH_COMPUTE], RANKS, j.steps, &med, &min);
  const double compute_ms = med * 1e3;
  printf("bench: fsdp_compute_only model=%s ranks=%d B=%d T=%d threads=1 step_ms=%.1f "
         "tokens_per_s=%.1f step_ms_min=%.1f steps=%d vs_one_rank=%.2f\n",
         preset, RANKS, j.B, j.T, compute_ms, tok2 / med, min * 1e3, j.steps,
         compute_ms / one_ms[0]);
  for (int k = 0; k < 3; k++) {
    const phase_result_t *p = &j.sh->ph[PH_FULL + k];
    step_stats(p, RANKS, j.steps, &med, &min);
    double comm[MAX_STEPS], wag[RANKS * MAX_STEPS], wrs[RANKS * MAX_STEPS];
    double ccpu[RANKS * MAX_STEPS], flt[RANKS * MAX_STEPS];
    for (int i = 0; i < j.steps; i++) comm[i] = fmax(p->comm_s[0][i], p->comm_s[1][i]);
    for (int r = 0; r < RANKS; r++) {
      for (int i = 0; i < j.steps; i++) {
        wag[r * j.steps + i] = p->wait_s[r][i][0];
        wrs[r * j.steps + i] = p->wait_s[r][i][1];
        ccpu[r * j.steps + i] = p->comm_cpu_s[r][i];
        flt[r * j.steps + i] = p->faults[r][i];
      }
    }
    const double step_ms = med * 1e3, comm_ms = median(comm, j.steps) * 1e3;
    const double exposed = step_ms - compute_ms;
    double hidden = comm_ms > 0 ? 1.0 - exposed / comm_ms : 0;
    hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
    const double wag_ms = median(wag, RANKS * j.steps) * 1e3;
    const double wrs_ms = median(wrs, RANKS * j.steps) * 1e3;
    printf("bench: fsdp model=%s strategy=%s mesh=%s ranks=%d threads=1 B=%d T=%d step_ms=%.1f "
           "tokens_per_s=%.1f compute_ms=%.1f comm_ms=%.1f exposed_ms=%.1f hidden_share=%.2f "
           "wait_ms=%.1f wait_gather_ms=%.1f wait_reduce_ms=%.1f comm_ops=%d comm_mib=%.1f "
           "comm_cpu_ms=%.1f page_faults=%.0f "
           "step_ms_min=%.1f one_rank_ms=%.1f speedup_vs_one_rank=%.2f steps=%d loss=%.4f\n",
           preset, shard_strategy_name(strategies[k].st), strategies[k].mesh, RANKS, j.B, j.T,
           step_ms, tok2 / med, compute_ms, comm_ms, exposed, hidden, wag_ms + wrs_ms, wag_ms,
           wrs_ms, p->ops, p->bytes / (1024.0 * 1024.0), median(ccpu, RANKS * j.steps) * 1e3,
           median(flt, RANKS * j.steps), min * 1e3, one_ms[0],
           (tok2 / med) / (tok1 / (one_ms[0] * 1e-3)), j.steps, p->loss);
  }
  fflush(stdout);
  munmap(j.sh, sizeof *j.sh);
  return 0;
}

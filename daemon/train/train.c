/* train: the training loop of one rank (see train.h). It owns the order of a
 * step: zero grads, micro-batches (forward, backward scaled by 1/grad_accum),
 * global-norm clipping, the scheduled AdamW step, evaluation; the runtime
 * (fsdp.c), the model and the kernels own all the arithmetic, on the device. */
#include "train.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt_rank.h"
#include "daemon/comm/boot.h"
#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"
#include "device.h"
#include "gpt.h"
#include "daemon/job/job.h"
#include "daemon/job/plan.h"
#include "sample.h"
#include "daemon/job/shard.h"

/* How long closing waits for a broken communicator's abort (device_t.settle). */
#define TRAIN_SETTLE_MS 10000

/* The thread writing an asynchronous checkpoint from the snapshot. */
typedef struct train_writer {
  pthread_t thread;
  int busy;                 /* started, not joined */
  atomic_int done;          /* the thread finished */
  ckpt_rank_image_t img;
  char root[CONFIG_PATH_MAX];
  int step, rc;
  char err[1024];
  char dir[CONFIG_PATH_MAX + 32];
  ckpt_shard_report_t rep;
  double write_ms;
} train_writer_t;

/* A checkpoint this rank took part in whose outcome the ranks have not
 * agreed on yet (train_saves_agree): every rank lists the same steps, the
 * ones that write nothing (other replicas) as written. */
typedef enum { TRAIN_SAVE_WRITING, TRAIN_SAVE_WRITTEN, TRAIN_SAVE_FAILED } train_save_state_t;
typedef struct train_save {
  int step;
  train_save_state_t state;
} train_save_t;
/* Each save waits for the rank's write before it, so at a step's
 * all-reduce only the newest can still be writing: two at most. */
#define TRAIN_SAVES 4

struct train {
  config_t cfg;       /* finished (config_finish) */
  int recompute_asked; /* cfg.recompute as the job gave it, before fitting it to this rank */
  int async_asked;     /* cfg.checkpoint_async as the job gave it, likewise */
  train_opts_t opts;  /* opts.out is NULL on every rank but 0: one voice per job */
  const device_t *dev;
  comm_boot_t boot;   /* how this rank found its peers */
  comm_groups_t groups;
  shard_mesh_t mesh;
  plan_t plan;
  fsdp_t *runtime;
  gpt_t *model;       /* the runtime's */
  data_t *data;
  data_pos_t pos;     /* where the next training batch starts */
  int32_t *in, *tg;   /* (batch x world, seq_len) host token batches: the global batch */
  int step;           /* steps done */
  int first_step;     /* steps done when this run began: 0, or a resumed checkpoint's */
  int stop_agreed;    /* the ranks agreed to stop after this step (opts.stop) */
  int ckpt_step;      /* the step of the last checkpoint written (-1: none) */
  uint64_t run;       /* this run's id, every rank's alike (train_run_id) */
  void *snapshot;     /* host copy an asynchronous checkpoint is written from (MEM_SNAPSHOT) */
  train_writer_t writer;
  double ckpt_lost_s; /* training time the checkpoints cost (the step waited) */
  train_save_t saves[TRAIN_SAVES]; /* oldest first */
  int n_saves;
  int ckpt_told_failed; /* the step whose shard the owner of commits heard was not written (-1) */
  int ckpt_lock;        /* rank 0: the fd whose flock holds checkpoint_dir for the run (-1) */
  double t_start, t_after_first;
  train_result_t res;
};

float train_lr(const config_t *c, int step) {
  if (step < c->warmup_steps) return c->lr * (float)(step + 1) / (float)c->warmup_steps;
  int decay_steps = c->steps - c->warmup_steps;
  if (decay_steps <= 1) return c->lr;
  double progress = (double)(step - c->warmup_steps) / (double)(decay_steps - 1);
  double min_lr = (double)c->lr * c->min_lr_frac;
  return (float)(min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * ((double)c->lr - min_lr));
}

static double train_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- open ------------------------------------------------------------------ */

/* The host memory this rank may keep apart from its device: its share as
 * fsdpd gives it (FSDP_HOST_MEMORY_BYTES), at most what the host has
 * available now; else the available memory divided among the world's
 * ranks, which share this host under fsdp-launch. 0: unknown. */
static size_t train_host_limit(int world) {
  const size_t avail = plan_host_available();
  const int64_t share = param_host_memory_bytes();
  if (share <= 0) return avail / (size_t)(world > 0 ? world : 1);
  return avail && avail < (size_t)share ? avail : (size_t)share;
}

/* A file can be created at path + suffix (and is removed again); where
 * says where that is, for the message. */
static int train_probe(const char *key, const char *path, const char *suffix, const char *where) {
  /* a name no other rank takes: ranks on other hosts (or pods, each with
   * its own pid namespace) share a directory and may share a pid */
  char probe[CONFIG_PATH_MAX + 64];
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint64_t)(train_now() * 1e9);
  snprintf(probe, sizeof probe, "%s%s.%d.%016llx", path, suffix, (int)getpid(),
           (unsigned long long)r);
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    return err_set_errno(err_from_errno(errno), errno, "%s: cannot create files %s %s (the "
                         "directory must exist and be writable); fix the path before training",
                         key, where, path);
  close(fd);
  unlink(probe);
  return FSDP_OK;
}

/* A file can be created next to path (its directory exists and takes
 * writes) and path is nothing yet or a regular file (the rename at the end
 * would replace a directory, a device or a FIFO): found before the first
 * step, not after the last. */
static int train_check_writable(const char *key, const char *path) {
  int rc = file_output_check(key, path, "model.weights");
  return rc ? rc : train_probe(key, path, ".tmp.check", "next to");
}

/* A directory the run writes into exists, is one, and takes new files
 * (every rank's own look: each writes its shard there): a missing or
 * read-only checkpoint_dir would otherwise skip every checkpoint ("not
 * written", training goes on) and, with auto_resume, start a requeued job
 * over from step 0. */
static int train_check_dir(const char *key, const char *path) {
  struct stat st;
  if (stat(path, &st) != 0)
    return err_set_errno(err_from_errno(errno), errno, "%s: %s (it must be an existing "
                         "directory: create it, or fix the path)", key, path);
  if (!S_ISDIR(st.st_mode))
    return err_set(FSDP_EINVAL, "%s: %s is not a directory; give the directory checkpoints go "
                   "in", key, path);
  return train_probe(key, path, "/.tmp.check", "in");
}

static int train_agree(train_t *t, int bad, int *total);

/* How long rank 0 under an owner of commits (fsdpd) waits for a
 * checkpoint_dir's lock: the service runs one job per directory, so a
 * holder there is the job's previous attempt, whose rank 0 may still be
 * ending (or its node's file system lease running out). */
#define TRAIN_LOCK_WAIT_S 30
/* How long the ranks of a stopped run wait for each other's last shard
 * write to agree on what their stop line says (train_stop_said): longer
 * than any write, shorter than forever (a peer that died fails it at once) */
#define TRAIN_STOP_AGREE_MS (10 * 60 * 1000)

/* Rank 0's look at checkpoint_dir's lock through *fd (opened at the first
 * look; closed here once it is no longer wanted): FSDP_OK when taken
 * (t->ckpt_lock), or when the file system takes no lock (Lustre mounted
 * noflock, some FUSE mounts: a warning, and the run goes on unguarded, as
 * it did before the lock); FSDP_EEXIST while another run holds it (its
 * holder in err_msg); another code when the lock file cannot be made. */
static int train_lock_try(train_t *t, int *fd) {
  const char *dir = t->cfg.checkpoint_dir;
  char path[CONFIG_PATH_MAX + 32], who[128] = "";
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_LOCK);
  if (*fd < 0 && (*fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
    return err_set_errno(err_from_errno(errno), errno, "checkpoint_dir: cannot create %s (the "
                         "directory must be writable)", path);
  if (flock(*fd, LOCK_EX | LOCK_NB)) {
    const int e = errno;
    if (e == EWOULDBLOCK) {
      const ssize_t n = pread(*fd, who, sizeof who - 1, 0);
      who[n > 0 ? n : 0] = 0;
      who[strcspn(who, "\n")] = 0;
      return err_set(FSDP_EEXIST, "checkpoint_dir: %s is in use by another run (%s holds %s); "
                     "two runs in one directory write over each other's checkpoints: stop that "
                     "run, or give this one a checkpoint_dir of its own", dir,
                     who[0] ? who : "a process that did not say its pid", CKPT_LOCK);
    }
    close(*fd);
    *fd = -1;
    if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS || e == EINVAL) {
      LOG_WARN("train", "checkpoint_dir: %s takes no lock (%s): nothing keeps a second run out "
               "of it; run one at a time there", dir, strerror(e));
      return FSDP_OK;
    }
    return err_set_errno(err_from_errno(e), e, "checkpoint_dir: cannot lock %s", path);
  }
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  const int n = snprintf(who, sizeof who, "pid %d on %s\n", (int)getpid(), host);
  if (ftruncate(*fd, 0) || pwrite(*fd, who, (size_t)n, 0) != n) /* only a name for the refused */
    LOG_WARN("train", "checkpoint_dir: could not write the holder's pid into %s", path);
  t->ckpt_lock = *fd;
  *fd = -1;
  return FSDP_OK;
}

/* One run at a time in a checkpoint_dir: a second would write the same
 * steps, and its shard could replace one under the other's committed
 * manifest. Rank 0 holds an flock on CKPT_LOCK there for the run, its pid
 * and host written in it for whoever is refused. Only rank 0: on a file
 * system the nodes share, an flock is one lock for them all, and the run's
 * other ranks would be refused by their own rank 0. Every rank learns each
 * look's outcome (one all-reduce a look: taken, held, failed), so the whole
 * run waits, starts or refuses together; under an owner of commits rank 0
 * looks again every 200 ms for TRAIN_LOCK_WAIT_S, each look a collective
 * of its own, so no rank sits in one past the communicator's timeout. */
static int train_lock_dir(train_t *t) {
  char why[1024] = "";
  const double until = train_now() + (t->opts.checkpoint ? TRAIN_LOCK_WAIT_S : 0);
  int fd = -1, rc, said = 0;
  float v[2]; /* rank 0 waits on (held); rank 0 failed */
  for (;;) {
    rc = t->boot.rank == 0 ? train_lock_try(t, &fd) : FSDP_OK;
    if (rc) snprintf(why, sizeof why, "%s", err_msg());
    const int wait = rc == FSDP_EEXIST && train_now() < until;
    if (wait && !said++) /* err_msg names the holder */
      LOG_WARN("train", "%s; waiting up to %d s for it to end (under fsdpd the holder is the job's "
               "previous attempt, still ending)", err_msg(), TRAIN_LOCK_WAIT_S);
    v[0] = (float)wait, v[1] = (float)(rc && !wait);
    int crc = t->groups.world ? comm_all_reduce(t->groups.world, v, v, 2, COMM_F32, COMM_SUM) : 0;
    if (crc) {
      if (fd >= 0) close(fd);
      return err_wrap(crc, "checkpoint_dir: agreeing on its lock");
    }
    if (v[0] == 0) break;
    nanosleep(&(struct timespec){0, 200000000}, NULL);
  }
  if (fd >= 0) close(fd);
  if (v[1] == 0) return FSDP_OK;
  return rc ? err_set(rc, "%s", why)
            : err_set(FSDP_EEXIST, "checkpoint_dir: rank 0 could not lock %s for this run (its "
                      "log says why)", t->cfg.checkpoint_dir);
}

/* How many ranks hold an h other than rank 0's (0: every rank's is alike):
 * one sum over the world gives every rank rank 0's h in 8-bit pieces (exact
 * in floats), a second counts the ranks whose own differs. */
static int train_ranks_differ(train_t *t, uint64_t h, const char *what, float *differ) {
  float v[8];
  for (int i = 0; i < 8; i++) v[i] = t->boot.rank == 0 ? (float)((h >> (8 * i)) & 0xff) : 0.f;
  int rc = comm_all_reduce(t->groups.world, v, v, 8, COMM_F32, COMM_SUM);
  if (rc) return err_wrap(rc, "comparing the ranks' %s", what);
  *differ = 0;
  for (int i = 0; i < 8; i++) *differ += v[i] != (float)((h >> (8 * i)) & 0xff);
  *differ = *differ > 0;
  if ((rc = comm_all_reduce(t->groups.world, differ, differ, 1, COMM_F32, COMM_SUM)))
    return err_wrap(rc, "comparing the ranks' %s", what);
  return FSDP_OK;
}

/* Every rank runs the same job: a rank given another batch, seq_len or
 * seed would train on with a loss that looks fine (only a change of a
 * collective's size is caught, as diverged collectives). The ranks compare
 * a hash of their effective options (config_write's text), recompute and
 * checkpoint_async as the job gave them: a level each rank fitted to its own
 * device's memory changes no value it computes, nor does a snapshot it had
 * no room for (its shard is written in place; no rank waits for another's
 * write), as on GPUs of two sizes under fsdp-launch. */
static int train_same_job(train_t *t) {
  if (!t->groups.world || t->boot.world < 2) return FSDP_OK;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return err_set(FSDP_ENOMEM, "train: out of memory");
  config_t asked = t->cfg;
  asked.recompute = t->recompute_asked;
  asked.checkpoint_async = t->async_asked;
  int rc = config_write(&asked, f);
  if (fclose(f) && !rc) rc = err_set(FSDP_ENOMEM, "train: out of memory");
  const uint64_t h = rc ? 0 : XXH64(text, len, 0);
  free(text);
  if (rc) return rc;
  float differ;
  if ((rc = train_ranks_differ(t, h, "options", &differ))) return rc;
  if (differ > 0)
    return err_set(FSDP_EINVAL, "the ranks were not given the same job: %.0f of %d see options "
                   "that differ from rank 0's (this is rank %d); give every rank the same job "
                   "file and flags (compare their --print-config)", differ, t->boot.world,
                   t->boot.rank);
  return FSDP_OK;
}

/* Every rank reads the same tokens: `data` is a path on each node, and
 * nodes whose copies differ (one re-tokenized, one copied short) would each
 * train on their own text with nothing failing. The ranks compare their
 * files' checksums as train_same_job compares options. */
static int train_same_data(train_t *t) {
  if (!t->groups.world || t->boot.world < 2) return FSDP_OK;
  float differ;
  int rc = train_ranks_differ(t, data_sum(t->data), "token files", &differ);
  if (rc) return rc;
  if (differ > 0)
    return err_set(FSDP_EINVAL, "data: the ranks' token files differ: %.0f of %d read a %s "
                   "other than rank 0's (this is rank %d; its file has %zu tokens, XXH64 "
                   "%016llx); every node must hold the same file at that path: copy one "
                   "everywhere (compare `xxhsum` of each copy)", differ, t->boot.world,
                   t->cfg.data, t->boot.rank, data_num_tokens(t->data),
                   (unsigned long long)data_sum(t->data));
  return FSDP_OK;
}

/* How many ranks hold a NaN or Inf in their shard of the parameters (and,
 * with optimizer, of AdamW's m and v): every rank learns the same count, so
 * all refuse a diverged model together. */
static int train_nonfinite(train_t *t, int optimizer, int *bad) {
  return train_agree(t, !fsdp_finite(t->runtime, optimizer), bad);
}

/* The mesh, the rank's groups and the runtime (initialised, or loaded from
 * init_from). */
static int train_open_runtime(train_t *t) {
  const config_t *c = &t->cfg;
  adamw_hparams_t hp = {c->beta1, c->beta2, c->eps, c->weight_decay};
  precision_t prec;
  char desc[512];
  int rc;
  if ((rc = precision_parse(c->precision, &prec)) ||
      (rc = shard_mesh_resolve(c->strategy, c->mesh, t->boot.world, &t->mesh, desc, sizeof desc)))
    return rc;
  if (t->opts.out)
    fprintf(t->opts.out, "train: %s\ntrain: precision %s%s\n", desc, precision_describe(prec),
            /* a GPU's bf16 products are bf16's (its device line says so) */
            prec == PRECISION_BF16_MIXED && !strcmp(t->dev->name, "cpu")
                ? " (the CPU backend's arithmetic is fp32 on the bf16 values)" : "");
  if ((rc = comm_boot_connect(&t->boot, t->mesh.replicas, t->mesh.shards, &t->groups)) ||
      (rc = train_same_job(t)))
    return rc;
  fsdp_opts_t o = {t->dev->kern, t->mesh, t->groups.shard, t->groups.replica, c->seed, hp, prec,
                   c->offload, (size_t)c->min_params};
  if ((rc = fsdp_create(&t->runtime, &c->gpt, &o))) return rc;
  t->model = fsdp_model(t->runtime);
  if (!c->init_from[0]) return FSDP_OK;
  if ((rc = fsdp_load_weights(t->runtime, c->init_from))) return rc;
  int bad; /* trained on, it would stop at a NaN loss, or be saved */
  if ((rc = train_nonfinite(t, 0, &bad))) return rc;
  if (bad)
    return err_set(FSDP_EINVAL, "init_from: %s holds NaN or Inf parameters (in %d rank(s)' "
                   "shards): it is a diverged model; start from other weights", c->init_from, bad);
  return FSDP_OK;
}

/* Continues from the latest committed checkpoint resume_from names (or,
 * with auto_resume, checkpoint_dir holds: none there is a fresh start): the
 * shards, AdamW, the step and the data position (under any mesh). */
/* Which checkpoint to resume from, as rank 0 found it: every rank takes
 * the same one (each looking on its own, a commit landing between two
 * looks would split them). The rule is ckpt_resume_choose, which the
 * coordinator checks a submit with too; RESUME_FAILED is rank 0's own. */
enum {
  RESUME_NONE = CKPT_FROM_NONE,
  RESUME_GIVEN = CKPT_FROM_GIVEN,
  RESUME_UNDER_GIVEN = CKPT_FROM_UNDER_GIVEN,
  RESUME_UNDER_OWN = CKPT_FROM_UNDER_OWN,
  RESUME_FAILED
};

static int train_resume_choose(train_t *t, int *src, int64_t *step) {
  const config_t *c = &t->cfg;
  ckpt_from_t from;
  const int rc = ckpt_resume_choose(c->resume_from, c->checkpoint_dir, c->auto_resume,
                                    CKPT_HEADER_MAX, &from, step);
  *src = (int)from;
  return rc;
}

/* The run's id, which every shard this run writes carries: rank 0 draws 64
 * random bits and every rank takes them (one all-reduce of four 16-bit
 * parts, exact in floats), so the ranks make it themselves whoever started
 * them. A report-less commit (fsdp-launch) takes only this run's shards: a
 * shard an earlier run left in a step directory when it stopped mid-save is
 * never committed beside this run's. */
static int train_run_id(train_t *t) {
  uint64_t id = 0;
  if (t->boot.rank == 0 && getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ (uint64_t)getpid() << 40;
  }
  if (t->boot.rank == 0 && !id) id = 1; /* 0: no run (a version 1 shard) */
  float v[4];
  for (int i = 0; i < 4; i++) v[i] = (float)((id >> (16 * i)) & 0xffff);
  int rc = t->groups.world ? comm_all_reduce(t->groups.world, v, v, 4, COMM_F32, COMM_SUM) : 0;
  if (rc) return err_wrap(rc, "checkpoint: agreeing on the run's id");
  t->run = 0;
  for (int i = 0; i < 4; i++) t->run |= (uint64_t)v[i] << (16 * i);
  return FSDP_OK;
}

/* What the data position and the learning rate depend on besides the step,
 * as this job has them: what a checkpoint records (ckpt_sched_t). */
static ckpt_sched_t train_sched(const train_t *t) {
  const config_t *c = &t->cfg;
  return (ckpt_sched_t){c->batch * t->boot.world, c->seq_len, c->steps, c->warmup_steps, c->lr,
                        c->min_lr_frac, data_num_tokens(t->data), data_num_train_tokens(t->data),
                        data_sum(t->data)};
}

/* The data position when this job's token file or its split is not the
 * checkpoint's run's (version 4 records them; an older one is taken as
 * this job's): another file starts from its beginning, as a new corpus
 * would; the same file split elsewhere (eval_fraction) goes on at the same
 * share of the epoch, and rank 0 says which tokens changed sides. */
static data_pos_t train_resume_data(const train_t *t, const ckpt_sched_t *was,
                                    const ckpt_sched_t *now, data_pos_t pos) {
  FILE *out = t->opts.out;
  if (!was->data_tokens && !was->data_sum) return pos; /* unknown */
  if (was->data_tokens != now->data_tokens || was->data_sum != now->data_sum) {
    if (out)
      fprintf(out, "train: note: %s is not the token file the checkpoint's run read (%llu "
              "tokens, XXH64 %016llx; this one has %llu, XXH64 %016llx): the data starts at the "
              "beginning of this file's order (epoch 0, window 0), not at the checkpoint's "
              "position (epoch %llu, window %llu)\n", t->cfg.data,
              (unsigned long long)was->data_tokens, (unsigned long long)was->data_sum,
              (unsigned long long)now->data_tokens, (unsigned long long)now->data_sum,
              (unsigned long long)pos.epoch, (unsigned long long)pos.window);
    return (data_pos_t){0, 0};
  }
  if (was->data_train_tokens == now->data_train_tokens) return pos;
  const uint64_t a = was->data_train_tokens, b = now->data_train_tokens;
  const uint64_t lo = a < b ? a : b, hi = a < b ? b : a;
  /* the epoch's order is over another number of windows: a new order */
  const uint64_t w = a ? (uint64_t)((double)pos.window * (double)b / (double)a) : 0;
  if (out)
    fprintf(out, "train: note: the token file's training split is its first %llu tokens now, "
            "%llu in the checkpoint's run (eval_fraction or seq_len changed): tokens [%llu, "
            "%llu) %s; the epoch's order is a new one, and the data goes on at the same share "
            "of epoch %llu (window %llu, was %llu)\n", (unsigned long long)b,
            (unsigned long long)a, (unsigned long long)lo, (unsigned long long)hi,
            b > a ? "were held out and are trained on now: evaluation from here on is not "
                    "comparable with the run's earlier evaluations"
                  : "were trained on and are held out now: evaluation from here on includes "
                    "text the model was trained on",
            (unsigned long long)pos.epoch, (unsigned long long)w,
            (unsigned long long)pos.window);
  pos.window = w;
  return pos;
}

/* The data position to go on from, in this job's windows, from a
 * checkpoint's (m); rank 0 says what a changed global batch, seq_len or
 * schedule means for the run. A version 1 or 2 checkpoint counts batches of
 * a global batch it does not record: taken as this job's. */
static data_pos_t train_resume_pos(const train_t *t, const ckpt_rank_meta_t *m, const char *dir) {
  const ckpt_sched_t now = train_sched(t), *was = &m->sched;
  FILE *out = t->opts.out;
  data_pos_t pos = {m->data_epoch, m->data_window};
  if (!was->batch) {
    pos.window = m->data_window * (uint64_t)now.batch;
    if (out)
      fprintf(out, "train: note: %s is an older checkpoint (shard version 1 or 2): its data "
              "position counts batches and does not record their size; it is taken as this "
              "job's batch x ranks, %d, so if the run that wrote it had another, "
              "windows of epoch %llu are repeated or skipped\n", dir, now.batch,
              (unsigned long long)pos.epoch);
    return pos;
  }
  if (was->seq_len != now.seq_len) {
    /* windows of another length are other windows, in another order: go on
     * at the same token offset into the epoch, rounded down */
    pos.window = m->data_window * (uint64_t)was->seq_len / (uint64_t)now.seq_len;
    if (out)
      fprintf(out, "train: note: seq_len %d -> %d: the epoch's order is over windows of %d "
              "tokens now, a new order of other windows; the data continues at the same share "
              "of epoch %llu (%llu windows of %d tokens read: window %llu of %d tokens), not at "
              "the windows the checkpoint's run would have read next\n", was->seq_len,
              now.seq_len, now.seq_len, (unsigned long long)pos.epoch,
              (unsigned long long)m->data_window, was->seq_len,
              (unsigned long long)pos.window, now.seq_len);
  } else if (was->batch != now.batch && out) {
    fprintf(out, "train: note: batch x ranks %d -> %d (the windows one micro-batch draws; a step "
            "draws grad_accum of them): the data continues at the next unread window of epoch "
            "%llu's order (window %llu), the windows the checkpoint's run would have read next, "
            "%d a draw; the epoch ends when fewer than %d are left\n", was->batch, now.batch,
            (unsigned long long)pos.epoch, (unsigned long long)pos.window, now.batch, now.batch);
  }
  pos = train_resume_data(t, was, &now, pos);
  if (out && (was->lr != now.lr || was->min_lr_frac != now.min_lr_frac ||
              was->steps != now.steps || was->warmup_steps != now.warmup_steps)) {
    char what[512] = "";
    size_t n = 0;
    if (was->lr != now.lr)
      n += (size_t)snprintf(what + n, sizeof what - n, ", lr %g -> %g", (double)was->lr,
                            (double)now.lr);
    if (was->min_lr_frac != now.min_lr_frac && n < sizeof what)
      n += (size_t)snprintf(what + n, sizeof what - n, ", min_lr_frac %g -> %g",
                            (double)was->min_lr_frac, (double)now.min_lr_frac);
    if (was->steps != now.steps && n < sizeof what)
      n += (size_t)snprintf(what + n, sizeof what - n, ", steps %d -> %d", was->steps, now.steps);
    if (was->warmup_steps != now.warmup_steps && n < sizeof what)
      snprintf(what + n, sizeof what - n, ", warmup_steps %d -> %d%s", was->warmup_steps,
               now.warmup_steps,
               config_is_set(&t->cfg, "warmup_steps") ? ""
                   : " (not given: its default shrinks to a shorter run's steps; set "
                     "warmup_steps to keep the run's)");
    config_t old = t->cfg;
    old.lr = was->lr, old.min_lr_frac = was->min_lr_frac, old.steps = was->steps;
    old.warmup_steps = was->warmup_steps;
    const int s = (int)m->step;
    char then[160]; /* what the checkpoint's run did there, or at its end */
    if (s < was->steps)
      snprintf(then, sizeof then, "the checkpoint's run would have used %g",
               (double)train_lr(&old, s));
    else
      snprintf(then, sizeof then, "the checkpoint's run had ended at step %d, at %g", was->steps,
               (double)train_lr(&old, was->steps - 1));
    fprintf(out, "train: note: the learning-rate schedule changed (%s): step %d goes on at this "
            "job's rate for it, %g (%s), and the curve is this job's from there on\n", what + 2,
            s + 1, (double)train_lr(&t->cfg, s), then);
  }
  return pos;
}

/* The committed checkpoint before `step` in the root resume chose from
 * (src), rank 0's fallback when that step's is damaged: *step, or
 * RESUME_FAILED saying there is none. */
static int train_resume_older(const train_t *t, int src, int64_t *step) {
  const config_t *c = &t->cfg;
  const char *root = src == RESUME_UNDER_OWN ? c->checkpoint_dir : c->resume_from;
  char dir[CONFIG_PATH_MAX + 32];
  ckpt_manifest_t m;
  int rc = ckpt_latest_below(root, *step, dir, sizeof dir);
  if (!rc && !(rc = ckpt_manifest_read(dir, &m))) {
    *step = m.step;
    ckpt_manifest_free(&m);
    return src;
  }
  LOG_ERROR("train", "resume: no committed checkpoint of %s older than step %lld to fall back "
            "to: %s", root, (long long)*step, err_msg());
  return RESUME_FAILED;
}

/* Rank 0 without an owner of commits (fsdp-launch): the damaged checkpoint
 * dir, chosen from a root (src), is moved out of its step's name when that
 * root is checkpoint_dir, where this run saves: so that its step is written
 * and committed again and retention does not count it, with nothing of it
 * lost (ckpt_set_aside). Under fsdpd the coordinator does it, once it has
 * checked the checkpoint damaged itself. */
static void train_resume_set_aside(train_t *t, int src, const char *dir) {
  const config_t *c = &t->cfg;
  const char *root = src == RESUME_UNDER_OWN ? c->checkpoint_dir : c->resume_from;
  char to[CONFIG_PATH_MAX + 64];
  if (!c->checkpoint_dir[0] || strcmp(root, c->checkpoint_dir)) return;
  if (ckpt_set_aside(dir, to, sizeof to)) {
    LOG_WARN("train", "resume: the damaged %s stays where it is, so its step will not be written "
             "again: %s", dir, err_msg());
    return;
  }
  LOG_WARN("train", "resume: the damaged %s is set aside as %s (its step is written again; "
           "remove it once it is of no more use)", dir, to);
  if (t->opts.out)
    fprintf(t->opts.out, "train: checkpoint %s set aside as %s\n", dir, to);
}

static int train_resume(train_t *t) {
  const config_t *c = &t->cfg;
  int src = RESUME_NONE, rc = FSDP_OK;
  int64_t step = 0;
  if (t->boot.rank == 0 && (rc = train_resume_choose(t, &src, &step))) src = RESUME_FAILED;
  char dir[CONFIG_PATH_MAX + 32];
  ckpt_rank_meta_t m;
  const char *key = "resume_from";
  for (;;) {
    /* rank 0's choice to all (one sum; the step in two exact halves) */
    float v[3] = {(float)src, (float)(step >> 12), (float)(step & 4095)};
    if (t->boot.rank != 0) v[0] = v[1] = v[2] = 0;
    int crc = t->groups.world ? comm_all_reduce(t->groups.world, v, v, 3, COMM_F32, COMM_SUM) : 0;
    if (crc) return err_wrap(crc, "resume: agreeing on the checkpoint");
    src = (int)v[0], step = ((int64_t)v[1] << 12) | (int64_t)v[2];
    key = src == RESUME_UNDER_OWN ? "checkpoint_dir (auto_resume)" : "resume_from";
    if (src == RESUME_FAILED) /* rank 0's error names its field (train_resume_choose) */
      return rc ? rc
                : err_set(FSDP_EPEER, "resume: rank 0 could not read the checkpoint (its log says "
                          "why)");
    if (src == RESUME_NONE) return FSDP_OK;
    if (src == RESUME_GIVEN) snprintf(dir, sizeof dir, "%s", c->resume_from);
    else ckpt_step_dir(dir, sizeof dir, src == RESUME_UNDER_OWN ? c->checkpoint_dir : c->resume_from,
                       step);
    const ckpt_want_t want = {c->gpt, c->seed, c->steps, src == RESUME_UNDER_OWN};
    rc = ckpt_rank_load(t->runtime, dir, &want, &m);
    /* every rank's outcome: a damaged part (a checksum, a cut or missing
     * file) on any rank sends all back to the previous committed
     * checkpoint, as long as they chose from a directory of checkpoints;
     * anything else fails */
    const int damaged = rc == FSDP_EFORMAT || rc == FSDP_ENOENT;
    float f[2] = {damaged, rc && !damaged};
    if (rc) LOG_ERROR("train", "resume: %s: %s", dir, err_msg());
    crc = t->groups.world ? comm_all_reduce(t->groups.world, f, f, 2, COMM_F32, COMM_SUM) : 0;
    if (crc) return err_wrap(crc, "resume: agreeing on the checkpoint's load");
    if (!f[0] && !f[1]) break;
    if (f[1] || src == RESUME_GIVEN)
      return rc ? err_wrap(rc, "%s", key)
                : err_set(FSDP_EPEER, "%s: %s: %g rank(s) could not load their part (their logs say "
                          "why)", key, dir, (double)(f[0] + f[1]));
    if (t->opts.out)
      fprintf(t->opts.out, "train: checkpoint %s is damaged (%g rank(s) could not read their part: "
              "their logs say where); going back to the committed checkpoint before it\n", dir,
              (double)f[0]);
    LOG_WARN("train", "resume: checkpoint %s is damaged (%g rank(s)); trying the one before it",
             dir, (double)f[0]);
    if (t->boot.rank == 0 && !t->opts.checkpoint)
      train_resume_set_aside(t, src, dir);
    if (t->boot.rank == 0 && src == RESUME_UNDER_OWN && t->opts.checkpoint) {
      /* its owner counts it committed no more: not the job's latest, and
       * its step is written again (a report that fails changes nothing here) */
      char why[600];
      snprintf(why, sizeof why, "%g rank(s) could not read their part%s%.400s", (double)f[0],
               rc ? "; rank 0: " : "", rc ? err_msg() : "");
      const train_ckpt_t k = {.rank = 0, .step = (int)step, .dir = dir, .failed = why, .damaged = 1};
      t->opts.checkpoint(t->opts.ctx, &k);
    }
    rc = FSDP_OK;
    if (t->boot.rank == 0) src = train_resume_older(t, src, &step);
  }
  int bad; /* a diverged run's (written before they were refused) */
  if ((rc = train_nonfinite(t, 1, &bad))) return rc;
  if (bad)
    return err_set(FSDP_EINVAL, "%s: %s holds NaN or Inf parameters or AdamW state (in %d "
                   "rank(s)' parts): it is a diverged run's; resume from an earlier checkpoint",
                   key, dir, bad);
  t->step = t->first_step = (int)m.step;
  t->res.steps_done = t->step;
  if (t->opts.out)
    fprintf(t->opts.out, "train: resumed from %s at step %d (saved as %s %dx%d, %s)\n", dir,
            t->step, shard_strategy_name(m.mesh.strategy), m.mesh.replicas, m.mesh.shards,
            precision_name(m.precision));
  t->pos = train_resume_pos(t, &m, dir);
  if (t->opts.out && c->resume_from[0] && src == RESUME_UNDER_OWN)
    fprintf(t->opts.out, "train: note: not resume_from %s: checkpoint_dir holds a later step, "
            "this job's own (a restarted or requeued job goes on from there); to start from "
            "resume_from, give a checkpoint_dir of its own\n", c->resume_from);
  /* a fine-tune started into a used checkpoint_dir would otherwise go on
   * from its old run's weights without a word (found by an outside tester);
   * not refused: a requeued or restarted job with init_from must go on */
  if (c->init_from[0] && src == RESUME_UNDER_OWN) {
    LOG_WARN("train", "init_from %s is not used: checkpoint_dir %s holds step %d, which this run "
             "goes on from", c->init_from, c->checkpoint_dir, t->step);
    if (t->opts.out)
      fprintf(t->opts.out, "train: note: not init_from %s: checkpoint_dir holds this job's "
              "checkpoint of step %d, which it goes on from (a restarted or requeued job); to "
              "start from init_from, give a checkpoint_dir of its own or set auto_resume = 0\n",
              c->init_from, t->step);
  }
  return FSDP_OK;
}

/* A save of step begins on this rank (again, for a retry of the same step). */
static void train_save_begin(train_t *t, int step) {
  if (t->n_saves && t->saves[t->n_saves - 1].step == step) {
    t->saves[t->n_saves - 1].state = TRAIN_SAVE_WRITING;
    return;
  }
  if (t->n_saves == TRAIN_SAVES) /* never in practice: the oldest is left undecided, kept */
    memmove(t->saves, t->saves + 1, --t->n_saves * sizeof *t->saves);
  t->saves[t->n_saves++] = (train_save_t){step, TRAIN_SAVE_WRITING};
}

/* This rank's write of step's shard ended (written: reported or committed). */
static void train_save_end(train_t *t, int step, train_save_state_t state) {
  for (int i = t->n_saves - 1; i >= 0; i--)
    if (t->saves[i].step == step) {
      t->saves[i].state = state;
      return;
    }
}

/* The oldest save's part of the loss's all-reduce: v[0] 1 while this rank
 * still writes it, v[1] 1 when it could not. */
static void train_saves_say(const train_t *t, float *v) {
  const train_save_state_t s = t->n_saves ? t->saves[0].state : TRAIN_SAVE_WRITTEN;
  v[0] = s == TRAIN_SAVE_WRITING ? 1.0f : 0.0f;
  v[1] = s == TRAIN_SAVE_FAILED ? 1.0f : 0.0f;
}

/* v: train_saves_say's values averaged over the ranks. Once no rank writes
 * the oldest save any more, every rank knows how it went and forgets it. If
 * a rank could not write its shard the checkpoint never commits (the ranks
 * that wrote theirs found one missing as they tried), and without an owner
 * of commits (fsdp-launch) rank 0 removes what the others wrote of it: on
 * a full disk those shards would take the space of every later checkpoint.
 * No rank writes there any more, and none commits it (each tried before
 * its write ended); ckpt_remove_aborted leaves a directory that holds a
 * manifest. Under fsdpd the coordinator removes it, once every shard of it
 * is reported. */
static void train_saves_agree(train_t *t, const float *v) {
  if (!t->n_saves || v[0] > 0) return;
  const int step = t->saves[0].step, failed = (int)lroundf(v[1] * (float)t->boot.world);
  memmove(t->saves, t->saves + 1, --t->n_saves * sizeof *t->saves);
  if (v[1] <= 0 || t->boot.rank != 0 || t->opts.checkpoint) return;
  char dir[CONFIG_PATH_MAX + 32];
  ckpt_step_dir(dir, sizeof dir, t->cfg.checkpoint_dir, step);
  if (ckpt_remove_aborted(dir)) {
    LOG_WARN("train", "checkpoint of step %d (%d rank(s) did not write their shard): %s", step,
             failed, err_msg());
    return;
  }
  LOG_INFO("train", "checkpoint of step %d removed: %d rank(s) did not write their shard or its "
           "manifest, and every rank's write of it has ended", step, failed);
  if (t->opts.out)
    fprintf(t->opts.out, "train: checkpoint step %d removed: %d rank(s) could not write their "
            "shard or its manifest, so it never commits; what was written of it is gone, and its "
            "space is free for the next checkpoint\n", step, failed);
}

/* Writes this rank's shard of the checkpoint of the step just done (the
 * first replica's ranks; the others hold the same shards), then commits the
 * checkpoint when every shard is there: whichever rank finishes last sees
 * them all. Nobody waits for anybody. A shard that cannot be written (a full
 * disk) is said and left out, and training goes on: a checkpoint missing a
 * shard never commits. */
/* A shard written: the owner commits it (the coordinator, through fsdpd,
 * when it gave a hook), else this rank tries (the last to finish succeeds). */
static void train_ckpt_written(train_t *t, int step, const char *dir, const ckpt_shard_report_t *rep,
                               double ms, const char *how) {
  const config_t *c = &t->cfg;
  int rc;
  if (t->opts.checkpoint) {
    train_save_end(t, step, TRAIN_SAVE_WRITTEN);
    train_ckpt_t k = {t->boot.rank, step, dir, rep, NULL, 0};
    if ((rc = t->opts.checkpoint(t->opts.ctx, &k)))
      LOG_WARN("train", "step %d: checkpoint shard written but not reported: %s", step, err_msg());
  } else {
    rc = ckpt_commit(dir, t->mesh.shards, NULL, t->run); /* only this run's shards */
    /* a shard still missing is the others' to commit; any other failure
     * (the manifest not written on a full disk) leaves a checkpoint that
     * never commits: counted as this rank's failed save, so rank 0 removes
     * its shards once every rank's write has ended (train_saves_agree), or
     * they would take the space of every later checkpoint */
    if (rc && rc != FSDP_ENOENT)
      LOG_WARN("train", "step %d: checkpoint %s not committed: %s", step, dir, err_msg());
    train_save_end(t, step, rc && rc != FSDP_ENOENT ? TRAIN_SAVE_FAILED : TRAIN_SAVE_WRITTEN);
    if (!rc) ckpt_retain(c->checkpoint_dir, c->keep_checkpoints);
  }
  if (t->opts.out)
    fprintf(t->opts.out, "train: checkpoint step %d: %s (%s, %.1f MiB %s %.0f ms)%s\n", step,
            dir, rep->name, (double)rep->bytes / (1 << 20), how, ms,
            t->opts.checkpoint ? (rc ? ", NOT reported" : ", reported") : rc ? "" : ", committed");
}

/* A shard that could not be written: nothing of it is left under a shard's
 * name (nor the step directory this rank made, when it is empty), so it
 * never commits; the owner of commits, when there is one, is told at once
 * (the coordinator, through fsdpd, aborts the checkpoint instead of timing
 * it out). Training goes on, and the last committed checkpoint stays the
 * one a restart takes. */
static void train_ckpt_failed(train_t *t, int step, const char *why) {
  /* a run that stops or ends here goes on nowhere: its last committed
   * checkpoint is where a resume starts */
  const char *then = train_done(t) ? "the run ends without it" : "training goes on";
  LOG_WARN("train", "rank %d: checkpoint of step %d not written: %s; %s", t->boot.rank, step, why,
           then);
  if (t->opts.out)
    fprintf(t->opts.out, "train: checkpoint step %d NOT written (%s); %s\n", step, why, then);
  if (t->opts.checkpoint) {
    train_ckpt_t k = {t->boot.rank, step, NULL, NULL, why, 0};
    if (t->opts.checkpoint(t->opts.ctx, &k))
      LOG_WARN("train", "step %d: checkpoint shard not written, nor reported: %s", step, err_msg());
    else
      t->ckpt_told_failed = step;
  }
  train_save_end(t, step, TRAIN_SAVE_FAILED);
}

static void *train_writer_main(void *arg) {
  train_writer_t *w = arg;
  ckpt_rank_writer_priority();
  const double t0 = train_now();
  w->rc = ckpt_rank_write(&w->img, w->root, &w->rep, w->dir, sizeof w->dir);
  if (w->rc) snprintf(w->err, sizeof w->err, "%s", err_msg()); /* err_msg is per thread */
  w->write_ms = 1e3 * (train_now() - t0);
  atomic_store(&w->done, 1);
  return NULL;
}

/* Waits for the shard being written (wait 0: only if it is done), then
 * reports or commits it. */
static void train_writer_finish(train_t *t, int wait) {
  train_writer_t *w = &t->writer;
  if (!w->busy || (!wait && !atomic_load(&w->done))) return;
  pthread_join(w->thread, NULL);
  w->busy = 0;
  ckpt_rank_image_free(&w->img);
  if (w->rc && t->ckpt_step == w->step) t->ckpt_step = -1;
  if (w->rc) train_ckpt_failed(t, w->step, w->err);
  else train_ckpt_written(t, w->step, w->dir, &w->rep, w->write_ms, "written in the background in");
}

/* Writes this rank's shard of the checkpoint of the step just done (the
 * first replica's ranks; the others hold the same shards), then commits the
 * checkpoint when every shard is there: whichever rank finishes last sees
 * them all. Nobody waits for anybody. A shard that cannot be written (a full
 * disk) is said (to the owner of commits too) and left out, and training
 * goes on: a checkpoint missing a shard never commits. With checkpoint_async the step waits only for a copy
 * of the shard into the snapshot (and for the previous write, if it is still
 * going); a thread writes it while training goes on. */
static int train_checkpoint(train_t *t) {
  const config_t *c = &t->cfg;
  train_save_begin(t, t->step);
  if (shard_place(&t->mesh, t->boot.rank).replica != 0) { /* the first replica writes */
    train_save_end(t, t->step, TRAIN_SAVE_WRITTEN);
    t->ckpt_step = t->step;
    return FSDP_OK;
  }
  precision_t prec;
  precision_parse(c->precision, &prec);
  ckpt_rank_meta_t m = {t->step, t->pos.epoch, t->pos.window, c->seed, train_sched(t), t->mesh,
                        prec, (uint64_t)c->min_params, t->run};
  const double t0 = train_now();
  int rc;
  /* a shard holding NaN or Inf is not written (ckpt_rank_write checks it on
   * the writer's thread, off the step): a resume never loads a diverged model */
  if (t->snapshot) {
    train_writer_finish(t, 1); /* the snapshot is one buffer: the last write must be done */
    train_writer_t *w = &t->writer;
    if ((rc = ckpt_rank_snapshot(t->runtime, &m, t->snapshot, &w->img))) {
      train_ckpt_failed(t, t->step, err_msg());
      return FSDP_OK;
    }
    snprintf(w->root, sizeof w->root, "%s", c->checkpoint_dir);
    w->step = t->step;
    atomic_store(&w->done, 0);
    if (pthread_create(&w->thread, NULL, train_writer_main, w)) {
      ckpt_rank_image_free(&w->img);
      train_ckpt_failed(t, t->step, "cannot start the checkpoint writer thread");
      return FSDP_OK;
    }
    w->busy = 1;
    t->ckpt_step = t->step;
    const double lost = train_now() - t0;
    t->ckpt_lost_s += lost;
    if (t->opts.out)
      fprintf(t->opts.out, "train: checkpoint step %d: snapshot of %.1f MiB in %.0f ms; writing it "
              "in the background\n", t->step,
              (double)ckpt_rank_snapshot_bytes(t->runtime) / (1 << 20), 1e3 * lost);
    return FSDP_OK;
  }
  ckpt_shard_report_t rep;
  char dir[CONFIG_PATH_MAX + 32];
  rc = ckpt_rank_save(t->runtime, &m, c->checkpoint_dir, &rep, dir, sizeof dir);
  t->ckpt_lost_s += train_now() - t0;
  if (rc) {
    train_ckpt_failed(t, t->step, err_msg());
    return FSDP_OK;
  }
  t->ckpt_step = t->step;
  train_ckpt_written(t, t->step, dir, &rep, 1e3 * (train_now() - t0), "in");
  return FSDP_OK;
}

int train_open(train_t **out, const config_t *c, const train_opts_t *o) {
  *out = NULL;
  train_t *t = calloc(1, sizeof *t);
  if (!t) return err_set(FSDP_ENOMEM, "train: out of memory");
  t->cfg = *c;
  t->opts = o ? *o : (train_opts_t){0};
  t->res.eval_loss = NAN;
  t->ckpt_step = -1;
  t->ckpt_told_failed = -1;
  t->ckpt_lock = -1;
  /* the defaults fitted to the model and the run: said by the caller's
   * finish, or by this one when the caller did not finish its config */
  char adjusted[sizeof c->adjusted];
  snprintf(adjusted, sizeof adjusted, "%s", config_adjusted(c));
  c = &t->cfg;
  int rc;
  if ((rc = config_finish(&t->cfg)) || (rc = comm_boot_from_env(&t->boot))) goto fail;
  if (t->boot.rank != 0) t->opts.out = NULL;
  if (!adjusted[0]) snprintf(adjusted, sizeof adjusted, "%s", config_adjusted(c));
  if (t->opts.out && adjusted[0])
    fprintf(t->opts.out, "train: note: %s; set an option explicitly to choose its value\n",
            adjusted);
  mem_run_begin(); /* the run's report counts this run, whatever the process held before */
  if ((rc = device_open(c, t->boot.rank, t->boot.world, &t->dev))) goto fail;
  t->boot.ids = t->dev->ids;
  /* every rank plans the same job and refuses it alike, before connecting */
  if ((rc = plan_job(c, t->boot.world, &t->plan))) goto fail;
  /* not a job option: ranks hash the options to check they run one job,
   * and devices differ; fsdpd says what this rank's device has */
  const int64_t device = param_device_memory_bytes();
  size_t limit = c->memory_limit_mib ? (size_t)c->memory_limit_mib << 20
                 : device > 0        ? (size_t)device
                 : t->dev->memory    ? t->dev->memory /* a GPU's own, under fsdp-launch too */
                                     : plan_host_available() / (size_t)t->boot.world;
  /* and never past what the device can give the job (a GPU's total less
   * what its CUDA context, the libraries and other processes hold): a plan
   * between the two would pass and fail at its first step */
  char bound[256] = "";
  if (t->dev->usable && t->dev->usable < limit) {
    limit = t->dev->usable;
    snprintf(bound, sizeof bound, "the GPU's free memory as the rank started, of its %.0f MiB: "
             "the CUDA context, the libraries and other processes hold the rest",
             (double)t->dev->memory / (1 << 20));
  }
  const size_t need0 = t->plan.device;
  const int level0 = config_recompute(c);
  t->recompute_asked = c->recompute;
  t->async_asked = c->checkpoint_async;
  if (plan_fit_recompute(&t->cfg, t->boot.world, &t->plan, limit) && t->opts.out)
    fprintf(t->opts.out, "train: note: recompute = %d: at the %s default (%d) the plan needs %.0f "
            "MiB, more than this rank's %.0f MiB; set recompute to choose\n", c->recompute,
            c->device, level0, (double)need0 / (1 << 20), (double)limit / (1 << 20));
  if (plan_fit_snapshot(&t->cfg, t->boot.world, &t->plan, limit) && t->opts.out)
    fprintf(t->opts.out, "train: note: no room for a checkpoint snapshot beside the job "
            "(%.0f MiB); checkpoints are written in place (checkpoint_async = 0)%s\n",
            (double)limit / (1 << 20),
            config_logits_chunk_mib(c) > GPT_LOGITS_CHUNK_MIB
                ? "; a smaller logits_chunk_mib (128) may leave room for it" : "");
  /* a GPU's snapshot is page-locked host memory, which the rank's share of
   * the host must hold beside its siblings' (or the first checkpoint
   * meets the OOM killer): without room it is dropped */
  const size_t snap = t->plan.bytes[MEM_SNAPSHOT], host = train_host_limit(t->boot.world);
  if (plan_fit_host(&t->cfg, t->boot.world, &t->plan, host) && t->opts.out)
    fprintf(t->opts.out, "train: note: no room in host memory for a checkpoint snapshot of %.1f "
            "MiB (this rank's share of the host: %.0f MiB); checkpoints are written in place "
            "(checkpoint_async = 0)\n", (double)snap / (1 << 20), (double)host / (1 << 20));
  if ((rc = bound[0] ? plan_fits(&t->plan, c, limit, bound) : plan_check(&t->plan, c, limit)))
    goto fail;
  if (t->opts.out) plan_print(&t->plan, c, t->opts.out);
  if (c->save[0] && ((rc = train_check_writable("save", c->save)) || (rc = job_save_apart(c))))
    goto fail;
  if (c->checkpoint_dir[0] && (rc = train_check_dir("checkpoint_dir", c->checkpoint_dir))) goto fail;
  if ((rc = train_open_runtime(t))) goto fail;
  if ((rc = data_open(&t->data, c->data, c->gpt.vocab, c->eval_fraction, c->seq_len)) ||
      (rc = data_check_batch(t->data, c->batch * t->boot.world, c->seq_len, c->eval_fraction > 0)) ||
      (rc = train_same_data(t)))
    goto fail;
  if (t->opts.out && data_made_vocab(t->data) && data_made_vocab(t->data) != c->gpt.vocab)
    fprintf(t->opts.out, "train: note: %s was made for a vocabulary of %d%s, the model has %d: "
            "%s; set vocab = %d, or make the token file for this model\n", c->data,
            data_made_vocab(t->data), data_made_vocab(t->data) == 256 ? " (bytes: fsdp-tokenize)" : "",
            c->gpt.vocab,
            data_made_vocab(t->data) < c->gpt.vocab
                ? "the ids past it never occur, and their rows of the embedding only decay"
                : "such files may hold ids the model cannot take (this one's all fit)",
            data_made_vocab(t->data));
  if (c->checkpoint_dir[0] && ((rc = train_lock_dir(t)) || (rc = train_run_id(t)))) goto fail;
  if ((c->resume_from[0] || c->checkpoint_dir[0]) && (rc = train_resume(t)))
    goto fail;
  if (c->checkpoint_dir[0] && c->checkpoint_every && c->checkpoint_async &&
      plan_rank_snapshots(&t->mesh, t->boot.rank) &&
      !(t->snapshot = ckpt_rank_snapshot_alloc(t->runtime))) {
    rc = FSDP_ENOMEM;
    goto fail;
  }
  gpt_set_checkpointing(t->model, c->activation_checkpointing);
  gpt_set_recompute(t->model, config_recompute(c));
  gpt_set_logits_rows(t->model, gpt_config_logits_rows(&c->gpt, config_logits_chunk_mib(c)));
  /* every rank draws the same global batch and reads its own rows of it */
  const size_t N = (size_t)c->batch * (size_t)c->seq_len;
  t->in = mem_alloc(MEM_WORKSPACE, N * sizeof *t->in, "input batch");
  t->tg = mem_alloc(MEM_WORKSPACE, N * sizeof *t->tg, "target batch");
  if (!t->in || !t->tg) {
    rc = FSDP_ENOMEM;
    goto fail;
  }
  if (t->opts.out)
    fprintf(t->opts.out, "train: model %s (layers %d, channels %d, heads %d, vocab %d, context %d): "
            "%.2fM params | precision %s | %d rank%s x %d threads on %s | activation "
            "checkpointing %s | %zu train + %zu eval tokens | %zu tokens/step\n",
            c->model[0] ? c->model : "custom", c->gpt.layers, c->gpt.channels, c->gpt.heads,
            c->gpt.vocab, c->gpt.context, gpt_num_params(t->model) / 1e6, c->precision,
            t->boot.world, t->boot.world == 1 ? "" : "s", t->dev->kern->get_threads(),
            t->dev->name, c->activation_checkpointing ? "on" : "off",
            data_num_train_tokens(t->data), data_num_eval_tokens(t->data),
            N * (size_t)t->boot.world * (size_t)c->grad_accum);
  plan_t mine = t->plan; /* the job's plan is its largest rank's; this is this rank's */
  plan_for_rank(&mine, &t->mesh, t->boot.rank);
  t->res.mem_planned = mine.total;
  t->t_start = train_now();
  *out = t;
  return FSDP_OK;
fail:
  train_close(t);
  return rc;
}

/* ---- steps ----------------------------------------------------------------- */

/* Mean loss over the evaluation batches (all of them when eval_batches is 0),
 * over every rank: each evaluates its own rows of each global batch. */
static int train_eval(train_t *t, float *out) {
  const config_t *c = &t->cfg;
  const int BG = c->batch * t->boot.world;
  size_t nb = data_eval_num_batches(t->data, BG, c->seq_len);
  if (c->eval_batches && (size_t)c->eval_batches < nb) nb = (size_t)c->eval_batches;
  const int first = t->boot.rank * c->batch;
  double sum = 0;
  for (size_t k = 0; k < nb; k++) {
    float loss;
    int rc = data_eval_rows(t->data, k, BG, c->seq_len, first, c->batch, t->in, t->tg);
    if (!rc) rc = gpt_forward(t->model, t->in, t->tg, c->batch, c->seq_len, &loss);
    if (rc) return err_wrap(rc, "evaluation batch %zu", k);
    sum += loss;
  }
  *out = nb ? (float)(sum / (double)nb) : NAN;
  int rc = fsdp_mean(t->runtime, out);
  /* strategies that keep units would hold them past a forward-only pass */
  int rs = fsdp_reshard(t->runtime);
  return rc ? rc : rs;
}

int train_done(const train_t *t) { return t->step >= t->cfg.steps || t->stop_agreed; }
int train_stopped(const train_t *t) { return t->stop_agreed && t->step < t->cfg.steps; }

int train_step(train_t *t) {
  const config_t *c = &t->cfg;
  if (train_done(t))
    return err_set(FSDP_EINVAL, "train_step: all %d steps are done", c->steps);
  const int BG = c->batch * t->boot.world;
  const size_t N = (size_t)c->batch * (size_t)c->seq_len;
  train_metrics_t m = {.rank = t->boot.rank, .world = t->boot.world, .step = t->step + 1,
                       .steps = c->steps, .lr = train_lr(c, t->step),
                       .tokens = N * (size_t)t->boot.world * (size_t)c->grad_accum};
  double t0 = train_now(), loss_sum = 0;
  int rc;
  train_writer_finish(t, 0); /* a background write that is done: report it */
  mem_step_begin();
  fsdp_zero_grad(t->runtime);
  for (int k = 0; k < c->grad_accum; k++) {
    float loss;
    fsdp_defer_reduce(t->runtime, c->keep_unsharded_grads && k < c->grad_accum - 1);
    if ((rc = data_next_rows(t->data, &t->pos, c->seed, BG, c->seq_len, t->boot.rank * c->batch,
                             c->batch, t->in, t->tg)) ||
        (rc = gpt_forward_train(t->model, t->in, t->tg, c->batch, c->seq_len,
                                1.0f / (float)c->grad_accum, &loss)) ||
        (rc = gpt_backward(t->model, 1.0f / (float)c->grad_accum)))
      return err_wrap(rc, "step %d", m.step);
    loss_sum += loss;
  }
  /* the loss, whether any rank was asked to stop, and how the oldest
   * checkpoint not agreed on went: one collective */
  float v[4] = {(float)(loss_sum / c->grad_accum), t->opts.stop && *t->opts.stop ? 1.0f : 0.0f};
  train_saves_say(t, v + 2);
  if ((rc = fsdp_mean_n(t->runtime, v, 4))) return err_wrap(rc, "step %d: averaging the loss", m.step);
  m.loss = v[0];
  if (v[1] > 0) t->stop_agreed = 1;
  train_saves_agree(t, v + 2);
  char fix[128]; /* what to change when training diverged */
  if (c->grad_clip > 0) snprintf(fix, sizeof fix, "lower lr (now %g) or grad_clip (now %g)", c->lr, c->grad_clip);
  else snprintf(fix, sizeof fix, "lower lr (now %g) or set grad_clip (now 0: off)", c->lr);
  if (!isfinite(m.loss))
    return err_set(FSDP_ERANGE, "step %d: the training loss is %s; training diverged: %s",
                   m.step, isnan(m.loss) ? "NaN" : "infinite", fix);
  if ((rc = fsdp_step(t->runtime, m.lr, c->grad_clip, &m.grad_norm)) == FSDP_ERANGE) {
    char why[512];
    snprintf(why, sizeof why, "%s", err_msg());
    return err_set(rc, "step %d (loss %.4f): %s; training diverged: %s", m.step, m.loss, why, fix);
  }
  if (rc) return err_wrap(rc, "step %d", m.step);
  double t1 = train_now();
  m.step_s = t1 - t0;
  m.tokens_per_s = (double)m.tokens / m.step_s;
  mem_snapshot(&m.mem, 1);
  mem_snapshot(&m.mem_run, 0);
  t->step++;
  if (t->step == t->first_step + 1) {
    t->res.first_loss = m.loss;
    t->t_after_first = t1;
  }
  t->res.last_loss = m.loss;
  t->res.steps_done = t->step;
  t->res.steps_run = t->step - t->first_step;
  t->res.seconds = t1 - t->t_start;
  t->res.ckpt_lost_s = t->ckpt_lost_s;
  if (t->step > t->first_step + 1)
    t->res.tokens_per_s =
        (double)m.tokens * (t->step - t->first_step - 1) / (t1 - t->t_after_first);
  else /* one step so far: its own rate (warm-up included), not 0 */
    t->res.tokens_per_s = m.tokens_per_s;
  if (data_num_eval_tokens(t->data) &&
      (t->step >= c->steps || (c->eval_every && t->step % c->eval_every == 0))) {
    if ((rc = train_eval(t, &t->res.eval_loss))) return err_wrap(rc, "step %d", m.step);
    if (!isfinite(t->res.eval_loss)) /* before this step's checkpoint and the save */
      return err_set(FSDP_ERANGE, "step %d: the evaluation loss after its update is %s "
                     "(training loss %.4f, gradient norm %g); training diverged: %s", m.step,
                     isnan(t->res.eval_loss) ? "NaN" : "infinite", m.loss, m.grad_norm, fix);
    m.evaluated = 1;
    m.eval_loss = t->res.eval_loss;
  }
  if (c->checkpoint_every && t->step % c->checkpoint_every == 0 && (rc = train_checkpoint(t)))
    return rc;
  /* stopping: what was trained is kept (a shard of this step the
   * coordinator heard was not written is not tried again: it aborted that
   * checkpoint and may be removing its directory) */
  if (train_stopped(t) && c->checkpoint_dir[0] && t->ckpt_step != t->step &&
      t->ckpt_told_failed != t->step && (rc = train_checkpoint(t)))
    return rc;
  if (t->opts.metrics) t->opts.metrics(t->opts.ctx, &m);
  return FSDP_OK;
}

/* ---- the end of the run ---------------------------------------------------- */

/* How many ranks report a failure (bad != 0): every rank learns the same
 * count; within timeout_ms (0: the communicator's op timeout). */
static int train_agree_within(train_t *t, int bad, int *total, int64_t timeout_ms) {
  float x = (float)(bad != 0);
  const comm_args_t a = {.op = COMM_OP_ALL_REDUCE, .dtype = COMM_F32, .redop = COMM_SUM,
                         .send = &x, .recv = &x, .count = 1, .timeout_ms = timeout_ms};
  int rc = t->groups.world ? comm_run(t->groups.world, &a) : 0;
  *total = (int)x;
  return rc;
}
static int train_agree(train_t *t, int bad, int *total) {
  return train_agree_within(t, bad, total, 0);
}

/* A weights file written by the shard ranks of the first replica, each into
 * its own byte ranges of one temporary file, renamed by rank 0 once all of
 * them succeeded: no rank holds the whole model, and a failure on any rank
 * leaves no file under the real name. Rank 0 makes the temporary, a name of
 * its own (file_temp_create: never a link followed, never another run's
 * file), and tells the others its name. */
static int train_save(train_t *t, const char *path) {
  /* rank 0's status word, then the temporary's name: float storage, as the
   * boot's id (a broadcast moves the bytes, it never computes on them) */
  float msg[1 + (CONFIG_PATH_MAX + 64) / sizeof(float)];
  char *tmp = (char *)(msg + 1);
  const size_t tmp_size = sizeof msg - sizeof msg[0];
  memset(msg, 0, sizeof msg);
  const gpt_config_t *cfg = gpt_get_config(t->model);
  const int rank = t->boot.rank;
  int rc = FSDP_OK, bad = 0, total;
  char why[1024] = "";
  if (rank == 0) {
    int32_t hdr[256];
    gpt_weights_header(cfg, hdr);
    off_t size = GPT_WEIGHTS_HEADER_BYTES + (off_t)(gpt_config_num_params(cfg) * sizeof(float));
    int fd = -1;
    int32_t status = file_temp_create(path, tmp, tmp_size, &fd);
    if (!status && (write(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr || ftruncate(fd, size)))
      status = err_set_errno(err_from_errno(errno), errno, "saving weights to %s", tmp);
    if (fd >= 0) close(fd);
    if (status) {
      if (fd >= 0) unlink(tmp);
      snprintf(why, sizeof why, "%s", err_msg());
    }
    memcpy(msg, &status, sizeof status);
  }
  if (t->groups.world &&
      (rc = comm_broadcast(t->groups.world, msg, sizeof msg / sizeof msg[0], COMM_F32, 0)))
    return rc;
  int32_t status;
  memcpy(&status, msg, sizeof status);
  tmp[tmp_size - 1] = 0;
  if (status) return err_set(FSDP_EIO, "save: rank 0 could not create a temporary beside %s%s%s",
                             path, why[0] ? ": " : "", why);
  if (rank < t->mesh.shards) { /* the first replica's shard group writes */
    int fd = open(tmp, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      bad = 1;
      err_set_errno(err_from_errno(errno), errno, "save: open %s", tmp);
    } else if (!fsdp_finite(t->runtime, 0)) {
      bad = 1;
      err_set(FSDP_ERANGE, "rank %d's parameters hold NaN or Inf (training diverged); a "
              "diverged model is not saved", rank);
      close(fd);
    } else {
      bad = fsdp_write_weights(t->runtime, fd, tmp) != FSDP_OK;
      if (!bad && fsync(fd)) bad = 1, err_set_errno(err_from_errno(errno), errno, "save: fsync %s", tmp);
      close(fd);
    }
    if (bad) snprintf(why, sizeof why, "%s", err_msg());
  }
  if ((rc = train_agree(t, bad, &total))) return rc;
  if (!total && rank == 0 && file_temp_place("save", tmp, path))
    bad = 1, snprintf(why, sizeof why, "%s", err_msg());
  if (!total && (rc = train_agree(t, bad, &total))) return rc;
  if (total) {
    if (rank == 0) unlink(tmp);
    return err_set(FSDP_EIO, "save: %d rank(s) failed writing %s%s%s; no file was left under "
                   "that name", total, path, why[0] ? ": " : "", why);
  }
  return FSDP_OK;
}

/* A look at what the model learned: sample_tokens tokens after the prompt
 * (its bytes for a byte-level model, token 0 otherwise). Every rank runs the
 * forward passes in lockstep (they gather units); rank 0 prints. */
static int train_sample(train_t *t) {
  const config_t *c = &t->cfg;
  int32_t prompt[256];
  int np = 0;
  if (c->gpt.vocab == 256)
    for (const char *p = c->sample_prompt; *p && np < 256; p++) prompt[np++] = (unsigned char)*p;
  if (!np) prompt[np++] = 0;
  int32_t *toks = mem_alloc(MEM_WORKSPACE, (size_t)c->sample_tokens * sizeof *toks, "sample");
  if (!toks) return FSDP_ENOMEM;
  int rc = sample_tokens(t->model, prompt, np, c->sample_tokens, c->sample_temperature, c->seed,
                         toks);
  if (!rc && t->opts.out) {
    if (c->gpt.vocab != 256 && c->sample_prompt[0] && config_is_set(c, "sample_prompt") == 1)
      fprintf(t->opts.out, "train: note: sample_prompt is text, which only a byte vocabulary "
              "(vocab 256) reads without a tokenizer; vocab %d starts from token 0 instead\n",
              c->gpt.vocab);
    fprintf(t->opts.out, "sample (temperature %g):\n%s", c->sample_temperature,
            c->gpt.vocab == 256 ? c->sample_prompt : "");
    sample_print(t->opts.out, toks, c->sample_tokens, c->gpt.vocab);
  }
  mem_free(toks);
  int rs = fsdp_reshard(t->runtime);
  return rc ? rc : rs;
}

int train_finish(train_t *t) {
  const config_t *c = &t->cfg;
  int rc;
  train_writer_finish(t, 1);
  if (c->save[0] && (rc = train_save(t, c->save))) return rc;
  if (c->sample_tokens > 0 && (rc = train_sample(t))) return rc;
  t->res.mem_peak = mem_total_peak();
  if (t->opts.out) {
    mem_snapshot_t s;
    mem_snapshot(&s, 0);
    mem_snapshot_print(t->opts.out, "mem (MiB):", &s);
    if (c->save[0]) fprintf(t->opts.out, "train: saved weights to %s\n", c->save);
  }
  return FSDP_OK;
}

const config_t *train_config(const train_t *t) { return &t->cfg; }

void train_state(train_t *t, train_state_t *st) {
  st->step = t->step;
  st->data = t->pos;
  st->runtime = t->runtime;
}

void train_result(const train_t *t, train_result_t *res) {
  *res = t->res;
  res->ckpt_lost_s = t->ckpt_lost_s;
  if (!res->mem_peak) res->mem_peak = mem_total_peak();
}

void train_close(train_t *t) {
  if (!t) return;
  train_writer_finish(t, 1);
  if (t->snapshot) ckpt_rank_snapshot_free(t->runtime, t->snapshot);
  mem_free(t->in);
  mem_free(t->tg);
  data_close(t->data);
  /* a collective that failed left its kernel to an abort running in the
   * background: it ends before the buffers it may touch go back to the
   * device, and before the process exits under it (bounded: an abort that
   * hangs is the driver's, and the rank ends anyway) */
  if (t->dev && t->dev->settle && t->dev->settle(TRAIN_SETTLE_MS))
    LOG_WARN("train", "a communicator's abort still runs after %d ms; closing anyway",
             TRAIN_SETTLE_MS);
  fsdp_destroy(t->runtime); /* its model is the shell it owns */
  comm_groups_destroy(&t->groups);
  if (t->dev && t->dev->settle && t->dev->settle(TRAIN_SETTLE_MS))
    LOG_WARN("train", "a communicator's abort still runs after %d ms; exiting anyway",
             TRAIN_SETTLE_MS);
  comm_boot_free(&t->boot);
  if (t->ckpt_lock >= 0) close(t->ckpt_lock); /* the last: the run's writes are done */
  free(t);
}

/* ---- fsdp-train's progress lines: one consumer of the metrics ------------- */

static void train_print_metrics(void *ctx, const train_metrics_t *m) {
  FILE *out = ctx;
  const int every = param_progress_every() > 0 ? (int)param_progress_every() : 1;
  if (m->step % every == 0 || m->step == m->steps) {
    fprintf(out, "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms\n",
            m->step, m->steps, m->loss, m->lr, m->grad_norm, m->tokens_per_s, 1e3 * m->step_s);
    char what[48]; /* this step's memory by category: now and its peak */
    snprintf(what, sizeof what, "mem  %5d/%d (MiB):", m->step, m->steps);
    mem_snapshot_print(out, what, &m->mem);
  }
  if (m->evaluated) fprintf(out, "eval  %5d/%d | loss %.4f\n", m->step, m->steps, m->eval_loss);
  fflush(out);
}

/* The progress lines (rank 0) and the caller's consumer (every rank). */
typedef struct train_consumers {
  FILE *progress;
  train_metrics_cb metrics;
  train_ckpt_cb checkpoint;
  void *ctx;
} train_consumers_t;

static int train_ckpt_forward(void *ctx, const train_ckpt_t *ck) {
  const train_consumers_t *k = ctx;
  return k->checkpoint(k->ctx, ck);
}

static void train_consume(void *ctx, const train_metrics_t *m) {
  const train_consumers_t *k = ctx;
  if (k->progress) train_print_metrics(k->progress, m);
  if (k->metrics) k->metrics(k->ctx, m);
}

/* The run's last figures, for hooks->finished: what train_finish added to
 * the peaks (the sample's activations, the save) is in them. */
static void train_report_final(train_t *t, const train_hooks_t *h) {
  const config_t *c = &t->cfg;
  train_metrics_t m = {.rank = t->boot.rank, .world = t->boot.world, .step = t->step,
                       .steps = c->steps, .loss = t->res.last_loss,
                       .tokens_per_s = t->res.tokens_per_s, .no_step = !t->res.steps_run};
  mem_snapshot(&m.mem_run, 0);
  m.mem = m.mem_run;
  h->finished(h->ctx, &m);
}

/* What became of a stopped run's last checkpoint, for its last line: every
 * rank learns how many could not write their shard of it (once every write
 * has ended, so every commit has been tried); without an owner of commits
 * each rank looks which step checkpoint_dir's latest committed one is, the
 * step a resume goes on from. Said only when it is true: a stop is exit 75
 * whatever became of its checkpoint (requeued, the job goes on from that
 * latest one), so the line is what tells a person what was kept. */
static int train_stop_said(train_t *t, char *what, size_t len) {
  const config_t *c = &t->cfg;
  if (!c->checkpoint_dir[0]) {
    snprintf(what, len, "; no checkpoint_dir: a restart begins again");
    return FSDP_OK;
  }
  /* the ranks arrive as their own writes end: a replica that writes no
   * shard, or a fast writer, waits here for the slowest's whole write, so
   * not within the op timeout; and a run asked to stop is still one that
   * stopped when asked (exit 75), whatever this agreement does */
  int failed, rc = train_agree_within(t, t->ckpt_step != t->step, &failed, TRAIN_STOP_AGREE_MS);
  if (rc) {
    snprintf(what, len, "; whether its checkpoint was committed is not known (the ranks could not "
             "agree: %.300s): a resume goes on from the latest committed one", err_msg());
    return FSDP_OK;
  }
  char dir[CONFIG_PATH_MAX + 32];
  int64_t latest = -1;
  if (!ckpt_latest(c->checkpoint_dir, dir, sizeof dir)) ckpt_dir_step(dir, &latest);
  if (!failed && (t->opts.checkpoint || latest == t->step)) {
    snprintf(what, len, t->opts.checkpoint ? "; its checkpoint's shards are written and reported"
                                           : "; its checkpoint is committed");
    return FSDP_OK;
  }
  char from[2 * CONFIG_PATH_MAX + 128];
  if (latest >= 0) snprintf(from, sizeof from, "goes on from step %lld (%s)", (long long)latest, dir);
  else snprintf(from, sizeof from, "starts over from step 0 (%s holds no committed checkpoint)",
                c->checkpoint_dir);
  if (failed)
    snprintf(what, len, "; its checkpoint was NOT committed: %d rank(s) could not write their "
             "shard (see above); a resume %s", failed, from);
  else
    snprintf(what, len, "; its checkpoint was NOT committed (see above); a resume %s", from);
  return FSDP_OK;
}

int train_run_with(const config_t *c, FILE *progress, const train_hooks_t *h,
                   train_result_t *res) {
  train_t *t;
  memset(res, 0, sizeof *res);
  res->eval_loss = NAN;
  const train_hooks_t none = {0};
  if (!h) h = &none;
  train_consumers_t k = {NULL, h->metrics, h->checkpoint, h->ctx};
  train_opts_t o = {progress, train_consume, &k, NULL, h->stop};
  if (h->checkpoint) o.checkpoint = train_ckpt_forward; /* with ctx = &k, as metrics */
  int rc = train_open(&t, c, &o);
  if (rc) return rc;
  k.progress = t->opts.out; /* rank 0 speaks for the job */
  while (!rc && !train_done(t)) rc = train_step(t);
  /* a failed step's message outlives what finishing the last checkpoint
   * says (a commit that finds a shard missing, because a peer died) */
  char why[1024] = "";
  if (rc) snprintf(why, sizeof why, "%s", err_msg());
  train_writer_finish(t, 1); /* the last checkpoint is written and reported before the end */
  if (!rc && train_stopped(t)) {
    char what[3 * CONFIG_PATH_MAX + 512];
    if ((rc = train_stop_said(t, what, sizeof what))) snprintf(why, sizeof why, "%s", err_msg());
    else rc = err_set(FSDP_EPREEMPTED, "stopped after step %d of %d (asked to stop)%s", t->step,
                      c->steps, what);
  } else if (!rc) {
    rc = train_finish(t);
  }
  train_result(t, res);
  if (h->finished) train_report_final(t, h);
  train_close(t);
  if (why[0]) err_set(rc, "%s", why);
  return rc;
}

int train_run(const config_t *c, FILE *progress, train_result_t *res) {
  return train_run_with(c, progress, NULL, res);
}

/* ranks: assignment -> rendezvous -> spawn -> exit report (see ranks.h). */
#include "daemon/node/ranks.h"


#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/job/job.h" /* JOB_EXIT_PREEMPTED */
#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/ini_line.h"
#include "daemon/common/frame.h"
#include "daemon/common/log.h"
#include "daemon/common/netaddr.h"
#include "daemon/common/param.h"
#include "daemon/common/ring_secret.h"
#include "daemon/node/supervise.h"
#include "daemon/node/workdir.h"

#define RANKS_RENDEZVOUS_S 5.0 /* a call's deadline: the coordinator holds it ~1 s */
#define RANKS_REPORT_S 3.0     /* ReportRankExit's deadline */
#define RANKS_BACKOFF_MAX_MS 1000
#define RANKS_GROUP_POLL_MS 20 /* while a finished rank's group still has members */
#define RANKS_MESSAGE_MAX 512  /* of the last log line sent with an exit */
#define RANKS_PAYLOAD_MAX 256  /* a ring address */
#define RANKS_SHARD_TRIES 6    /* a checkpoint shard's report: tries a round (~1.6 s) */
#define RANKS_SHARDS_QUEUED 16 /* reports waiting per rank: past it the oldest waiting goes */

typedef enum { RK_WAITING, RK_RENDEZVOUS, RK_RUNNING, RK_EXITED } rk_state_t;

typedef struct rank rank_t;

typedef enum { RK_CALL_RENDEZVOUS, RK_CALL_EXIT, RK_CALL_SHARD } rk_call_t;

/* A checkpoint shard the rank wrote, waiting to be relayed. */
typedef struct rk_shard {
  Fsdp__V1__ReportCheckpointShardRequest *req; /* one malloc'd block */
  int rounds;                                   /* of tries that found no coordinator */
  struct rk_shard *next;
} rk_shard_t;

/* One blocking call on the thread pool. */
typedef struct rk_work {
  uv_work_t req;
  rank_t *rk;
  rk_call_t kind;
  ProtobufCMessage *request; /* built on the loop, freed there */
  ProtobufCMessage *reply;   /* filled by the pool thread */
  int rc;
  char err[1024];
} rk_work_t;

struct rank {
  ranks_t *R;
  rank_t *next;
  Fsdp__V1__RankAssignment *a; /* our copy (unpacked from its bytes) */
  rk_state_t state;
  int listen_fd;
  char payload[64];
  int killed;
  int fenced;                  /* stopped at the node's fence (or its lease): why says so */
  double grace_s;
  char why[RANKS_MESSAGE_MAX]; /* why it never started, or the kill's reason */
  int work;                    /* a call in flight (the rank is kept until it is back) */
  int backoff_ms;
  uv_timer_t timer;            /* retries and the group poll */
  int handles;                 /* open handles: freed when 0 and no work */
  supervise_t *set;
  int pid;
  FILE *log;
  char dir[PATH_MAX];
  uv_pipe_t report;
  int report_open;
  frame_reader_t fr;
  Fsdp__V1__RankStatus *status; /* the latest report */
  int started;                  /* spawned */
  int alive;                    /* spawned, and its process group not yet empty */
  int64_t exit_status;
  int term_signal;
  int group_waits;              /* polls of a group with members left */
  int reported;                 /* the exit report is done (or given up) */
  int exit_pending;             /* exited; its report waits for the shards' */
  rk_shard_t *shards, **shards_tail; /* checkpoint shards to relay, in order */
  int freeing;
};

struct ranks {
  ranks_opts_t o;
  char node_id[256];
  rank_t *list;
  int dirty, stopping, destroying;
  uint64_t report_deadline; /* after it, exit reports are given up (stopping) */
  _Atomic uint64_t calls_until; /* the same, for the pool's calls (uv_hrtime ms; 0: none) */
  uint64_t lease_ns;        /* the node's lease (ranks_lease); 0: none yet */
  int ncpu_threads;
  uint64_t exits[4];        /* rank exits since fsdpd started: ok, failed, preempted, signal */
  uv_timer_t *measure_timer; /* measures an idle GPU again (FSDP_GPU_MEASURE_S) */
  struct gpu_measure *measuring; /* the measurement in flight: its GPU starts no rank */
  int measure_next;         /* the inventory index the next one looks at first */
  int measure_gave_up;      /* one was given up (RANKS_MEASURE_HUNG_MS): none is made again */
};

/* ---- bookkeeping --------------------------------------------------------------- */

static void rk_maybe_free(rank_t *rk);

/* Every shard report still queued goes. */
static void rk_shards_drop(rank_t *rk) {
  while (rk->shards) {
    rk_shard_t *x = rk->shards;
    rk->shards = x->next;
    free(x->req), free(x);
  }
  rk->shards_tail = &rk->shards;
}

static void rk_handle_closed(uv_handle_t *h) {
  rank_t *rk = h->data;
  rk->handles--;
  rk_maybe_free(rk);
}

static void rk_close_report(rank_t *rk) {
  if (!rk->report_open) return;
  rk->report_open = 0;
  uv_close((uv_handle_t *)&rk->report, rk_handle_closed);
}

static void rk_report_drain(rank_t *rk);

/* Unlinks and frees a rank once nothing refers to it: no call in flight and
 * its handles closed. */
static void rk_maybe_free(rank_t *rk) {
  if (!rk->freeing || rk->work) return;
  if (!uv_is_closing((uv_handle_t *)&rk->timer)) uv_close((uv_handle_t *)&rk->timer, rk_handle_closed);
  rk_close_report(rk);
  if (rk->handles) return;
  ranks_t *R = rk->R;
  for (rank_t **pp = &R->list; *pp; pp = &(*pp)->next)
    if (*pp == rk) {
      *pp = rk->next;
      break;
    }
  if (rk->listen_fd >= 0) close(rk->listen_fd);
  if (rk->log) fclose(rk->log);
  frame_reader_free(&rk->fr);
  rk_shards_drop(rk);
  if (rk->status) fsdp__v1__rank_status__free_unpacked(rk->status, NULL);
  fsdp__v1__rank_assignment__free_unpacked(rk->a, NULL);
  free(rk);
  R->dirty = 1;
  if (R->destroying && !R->list) free(R);
}

static void rk_forget(rank_t *rk) {
  rk->freeing = 1;
  rk_maybe_free(rk);
}

static const char *rk_job(const rank_t *rk) { return rk->a->job_id; }

/* The coordinator's final answers to a shard's report: done, stale,
 * unknown, refused, already committed or aborted, a conflict. Anything else
 * (unreachable, late, a restart) is tried again until it answers. */
static int rk_shard_final(int rc) {
  return !rc || rc == FSDP_ESTALE || rc == FSDP_ENOTFOUND || rc == FSDP_EINVAL ||
         rc == FSDP_ESTATE || rc == FSDP_EEXIST;
}

/* ---- calls on the thread pool --------------------------------------------------- */

static void rk_work_cb(uv_work_t *req) {
  rk_work_t *w = req->data;
  ranks_t *R = w->rk->R;
  static const struct {
    const char *method;
    const ProtobufCMessageDescriptor *reply;
    double deadline_s;
  } calls[] = {
      [RK_CALL_RENDEZVOUS] = {"/fsdp.v1.Coordinator/Rendezvous",
                              &fsdp__v1__rendezvous_reply__descriptor, RANKS_RENDEZVOUS_S},
      [RK_CALL_EXIT] = {"/fsdp.v1.Coordinator/ReportRankExit",
                        &fsdp__v1__report_rank_exit_reply__descriptor, RANKS_REPORT_S},
      [RK_CALL_SHARD] = {"/fsdp.v1.Coordinator/ReportCheckpointShard",
                         &fsdp__v1__report_checkpoint_shard_reply__descriptor, RANKS_REPORT_S},
  };
  /* a shard's report is retried here, on the pool (bounded): the loop's
   * timer belongs to the rank's own life (retries of its calls, the group
   * poll) */
  const int tries = w->kind == RK_CALL_SHARD ? RANKS_SHARD_TRIES : 1;
  for (int i = 0, ms = 50; i < tries; i++, ms *= 2) {
    /* a stopping fsdpd's report deadline ends waits and calls alike */
    uint64_t until = atomic_load(&R->calls_until), now = uv_hrtime() / 1000000;
    if (i && until && now >= until) break;
    if (i) {
      const uint64_t wait = until && until - now < (uint64_t)ms ? until - now : (uint64_t)ms;
      nanosleep(&(struct timespec){(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L}, NULL);
      until = atomic_load(&R->calls_until), now = uv_hrtime() / 1000000;
    }
    double deadline_s = calls[w->kind].deadline_s;
    if (until) {
      const double left = now < until ? (double)(until - now) / 1e3 : 0.001;
      if (left < deadline_s) deadline_s = left;
    }
    w->rc = rpc_client_call(R->o.client, calls[w->kind].method, w->request, calls[w->kind].reply,
                            &w->reply, deadline_s);
    if (rk_shard_final(w->rc)) break;
  }
  if (w->rc) snprintf(w->err, sizeof w->err, "%s", err_msg()); /* err_msg is per thread */
}

static void rk_after_rendezvous(rank_t *rk, rk_work_t *w);
static void rk_after_report(rank_t *rk, rk_work_t *w);
static void rk_report_start(rank_t *rk);
static void rk_pump(rank_t *rk);

/* A stopping fsdpd's report deadline passed: the shard reports left (of
 * step, and those queued behind it) are given up, saying so; dropped here
 * unless a call still holds the first. */
static void rk_shards_give_up(rank_t *rk, int64_t step, const char *why, int drop) {
  int left = 0;
  for (const rk_shard_t *x = rk->shards; x; x = x->next) left++;
  LOG_WARN("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": fsdpd is stopping and the "
           "coordinator has not answered the checkpoint shard report of step %" PRId64 " by its "
           "report deadline (%s): given up with %d more waiting; those checkpoints will not "
           "commit", rk_job(rk), rk->a->attempt, rk->a->rank, step, why, left);
  if (drop) rk_shards_drop(rk);
}

static void rk_after_shard(rank_t *rk, rk_work_t *w, int retried) {
  const Fsdp__V1__ReportCheckpointShardRequest *q = (const void *)w->request;
  if (w->rc && !retried && !rk_shard_final(w->rc)) {
    rk_shards_give_up(rk, q->step, w->err, 1); /* fsdpd stops now */
  } else if (w->rc && (!retried || rk->shards->rounds == 1))
    LOG_WARN("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": checkpoint step %" PRId64
             " shard report: %s%s", rk_job(rk), rk->a->attempt, rk->a->rank, q->step, w->err,
             retried ? "; trying again until the coordinator answers" : "");
  rk_pump(rk);
}

static void rk_after_work_cb(uv_work_t *req, int status) {
  rk_work_t *w = req->data;
  rank_t *rk = w->rk;
  (void)status;
  rk->work = 0;
  /* a shard's report the coordinator has not answered stays first in the
   * queue, tried again (a coordinator restart loses no checkpoint) */
  /* a stopping fsdpd tries until its report deadline, then gives up what is
   * left (it exits meanwhile, its ranks are stopped): said below */
  const int late = rk->R->stopping && uv_now(rk->R->o.loop) >= rk->R->report_deadline;
  const int retried = w->kind == RK_CALL_SHARD && !rk_shard_final(w->rc) && !rk->freeing && !late;
  if (retried) {
    rk->shards->rounds++;
  } else if (w->kind == RK_CALL_SHARD) { /* off the queue: its request is w's, freed below */
    rk_shard_t *x = rk->shards;
    rk->shards = x->next;
    if (!rk->shards) rk->shards_tail = &rk->shards;
    free(x);
  }
  if (rk->freeing) {
    /* destroyed meanwhile: nothing more to do */
  } else if (w->kind == RK_CALL_EXIT) {
    rk_after_report(rk, w);
  } else if (w->kind == RK_CALL_SHARD) {
    rk_after_shard(rk, w, retried);
  } else {
    rk_after_rendezvous(rk, w);
  }
  if (w->reply) protobuf_c_message_free_unpacked(w->reply, NULL);
  if (!retried) free(w->request); /* one block: see rk_call; a retried one stays queued */
  free(w);
  rk_maybe_free(rk);
}

/* Queues one call; request is a malloc'd block the work owns. */
static void rk_call(rank_t *rk, rk_call_t kind, ProtobufCMessage *request) {
  rk_work_t *w = calloc(1, sizeof *w);
  FSDP_ASSERT(w);
  w->rk = rk;
  w->kind = kind;
  w->request = request;
  w->req.data = w;
  rk->work = 1;
  int rc = uv_queue_work(rk->R->o.loop, &w->req, rk_work_cb, rk_after_work_cb);
  FSDP_ASSERT(rc == 0);
}

static int rk_backoff(rank_t *rk) {
  rk->backoff_ms = rk->backoff_ms ? rk->backoff_ms * 2 : 50;
  if (rk->backoff_ms > RANKS_BACKOFF_MAX_MS) rk->backoff_ms = RANKS_BACKOFF_MAX_MS;
  return rk->backoff_ms;
}

/* ---- the exit and its report -------------------------------------------------- */

static void rk_report_timer_cb(uv_timer_t *t) { rk_report_start(t->data); }

/* The next call of a running or exited rank: its shards' reports in order,
 * then its exit's (so the coordinator hears of a checkpoint before the exit
 * that follows it). */
static void rk_pump(rank_t *rk) {
  if (rk->work || rk->freeing) return;
  if (rk->shards) {
    rk_call(rk, RK_CALL_SHARD, &rk->shards->req->base);
    return;
  }
  if (rk->exit_pending) {
    rk->exit_pending = 0;
    rk_report_start(rk);
  }
}

/* The last non-empty line of the rank's log (its error, for a failed rank). */
static void rk_last_line(rank_t *rk, char *out, size_t n) {
  out[0] = 0;
  if (!rk->dir[0]) return;
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/rank-%" PRIu32 ".log", rk->dir, rk->a->rank);
  int fd, rc = file_open_regular(path, O_RDONLY, 0, &fd); /* never a FIFO's wait on the loop */
  if (rc) {
    if (rc != FSDP_ENOENT) {
      LOG_WARN("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": its last line is not read: %s",
               rk_job(rk), rk->a->attempt, rk->a->rank, err_msg());
      snprintf(out, n, "(its log cannot be read: %.400s)", err_msg());
    }
    return;
  }
  char buf[4096];
  off_t end = lseek(fd, 0, SEEK_END), from = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
  ssize_t got = pread(fd, buf, sizeof buf - 1, from);
  close(fd);
  if (got <= 0) return;
  buf[got] = 0;
  while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r' || buf[got - 1] == ' ')) buf[--got] = 0;
  char *line = strrchr(buf, '\n');
  line = line ? line + 1 : buf;
  snprintf(out, n, "%.*s", (int)n - 1, line); /* bounded: a line may be 4 KiB */
}

static void rk_report_start(rank_t *rk) {
  ranks_t *R = rk->R;
  if (R->stopping && uv_now(R->o.loop) >= R->report_deadline) {
    LOG_WARN("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": its exit was not reported "
             "before fsdpd stopped; the coordinator will learn it from the node's next registration",
             rk_job(rk), rk->a->attempt, rk->a->rank);
    rk->reported = 1;
    rk_forget(rk);
    return;
  }
  /* one block: the message and its strings, freed with free() after the call */
  char msg[RANKS_MESSAGE_MAX];
  /* a fenced rank's last log line is whatever it was doing: the fence is why */
  if (rk->started && !rk->fenced) rk_last_line(rk, msg, sizeof msg);
  else snprintf(msg, sizeof msg, "%s", rk->why);
  size_t nid = strlen(R->node_id) + 1, njob = strlen(rk_job(rk)) + 1, nmsg = strlen(msg) + 1;
  Fsdp__V1__ReportRankExitRequest *req = malloc(sizeof *req + nid + njob + nmsg);
  FSDP_ASSERT(req);
  fsdp__v1__report_rank_exit_request__init(req);
  char *p = (char *)(req + 1);
  req->node_id = memcpy(p, R->node_id, nid);
  req->job_id = memcpy(p + nid, rk_job(rk), njob);
  req->message = memcpy(p + nid + njob, msg, nmsg);
  req->attempt = rk->a->attempt;
  req->rank = rk->a->rank;
  req->exit_status = (int32_t)rk->exit_status;
  req->term_signal = rk->term_signal;
  req->node_stopping = R->stopping; /* before the verdict requeues its job */
  req->fenced = rk->fenced;          /* not the job's fault: requeued, no restart spent */
  /* its final figures (the status it sent after the run): read by the pool
   * thread, never changed now that its channel is closed, and rk outlives
   * the call */
  req->status = rk->status;
  rk_call(rk, RK_CALL_EXIT, &req->base);
}

static void rk_after_report(rank_t *rk, rk_work_t *w) {
  if (!w->rc || w->rc == FSDP_ESTALE || w->rc == FSDP_ENOTFOUND) {
    if (w->rc)
      LOG_INFO("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": exit report refused (%s); "
               "nothing more to tell", rk_job(rk), rk->a->attempt, rk->a->rank, w->err);
    rk->reported = 1;
    rk_forget(rk);
    return;
  }
  LOG_DEBUG("fsdpd", "job %s rank %" PRIu32 ": exit report: %s; retrying", rk_job(rk), rk->a->rank,
            w->err);
  uv_timer_start(&rk->timer, rk_report_timer_cb, (uint64_t)rk_backoff(rk), 0);
}

static void rank_try_start_waiting(ranks_t *R);
static void gpu_measure_soon(ranks_t *R, uint32_t d);

/* The rank is over (or never ran): report it, and free its device. */
static void rk_exited(rank_t *rk) {
  rk->state = RK_EXITED;
  rk->R->dirty = 1;
  if (rk->listen_fd >= 0) close(rk->listen_fd), rk->listen_fd = -1;
  rk->backoff_ms = 0;
  rk->exit_pending = 1;
  rk_pump(rk); /* after its shards' reports, if any are still going */
  rank_try_start_waiting(rk->R);
  gpu_measure_soon(rk->R, rk->a->device);
}

static void rk_not_started(rank_t *rk, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rk_not_started(rank_t *rk, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rk->why, sizeof rk->why, fmt, ap);
  va_end(ap);
  LOG_WARN("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": not started: %s", rk_job(rk),
           rk->a->attempt, rk->a->rank, rk->why);
  rk->exit_status = RANKS_NOT_STARTED;
  rk->term_signal = 0;
  rk_exited(rk);
}

/* 1 when a process of group pgid is left (zombies included: not reaped yet). */
static int rk_group_alive(int pgid) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int found = 0;
  for (struct dirent *e; !found && (e = readdir(d));) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) continue;
    buf[n] = 0;
    /* "pid (comm) state ppid pgrp ...": comm may hold spaces; parse after the last ')' */
    char *rp = strrchr(buf, ')');
    int ppid, pgrp;
    char st;
    if (rp && sscanf(rp + 1, " %c %d %d", &st, &ppid, &pgrp) == 3 && pgrp == pgid) found = 1;
  }
  closedir(d);
  return found;
}

static void rk_group_poll_cb(uv_timer_t *t) {
  rank_t *rk = t->data;
  if (rk_group_alive(rk->pid)) {
    kill(-rk->pid, SIGKILL);
    if (++rk->group_waits == 50)
      LOG_WARN("fsdpd", "job %s rank %" PRIu32 ": processes of its group %d are still there 1 s after "
               "it exited; device %" PRIu32 " stays busy until they are gone", rk_job(rk), rk->a->rank,
               rk->pid, rk->a->device);
    uv_timer_start(&rk->timer, rk_group_poll_cb, RANKS_GROUP_POLL_MS, 0);
    return;
  }
  rk->alive = 0;
  rk_exited(rk);
}

static void rk_exit_cb(supervise_t *s, void *arg, int64_t status, int term_signal) {
  rank_t *rk = arg;
  (void)s;
  rk->exit_status = status;
  rk->term_signal = term_signal;
  /* it ended itself at the node's lease, which fsdpd saw pass too: the
   * coordinator was silent past its fence (a race with fsdpd_fence_cb's
   * SIGKILL, whichever came first) */
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  if (!term_signal && status == JOB_EXIT_FENCED && !rk->fenced && rk->R->lease_ns &&
      (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec >= rk->R->lease_ns) {
    rk->fenced = 1;
    snprintf(rk->why, sizeof rk->why, "it ended itself at its node's lease: fsdpd had no answer "
             "from the coordinator for the fence it gave");
  }
  rk->R->exits[term_signal ? 3 : status == 0 ? 0 : status == JOB_EXIT_PREEMPTED ? 2 : 1]++;
  LOG_INFO("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 " (pid %d): %s %d", rk_job(rk),
           rk->a->attempt, rk->a->rank, rk->pid, term_signal ? "killed by signal" : "exited with status",
           term_signal ? term_signal : (int)status);
  supervise_destroy(rk->set); /* allowed in the exit callback: it runs last */
  rk->set = NULL;
  if (rk->log) fclose(rk->log), rk->log = NULL;
  rk_report_drain(rk); /* a shard report written just before the exit is not lost */
  rk_close_report(rk); /* what it reported last stays its status */
  /* the supervisor SIGKILLed its group; the device is free once the group is empty */
  rk_group_poll_cb(&rk->timer);
}

/* ---- the report channel -------------------------------------------------------- */

/* Queues the relay of a checkpoint shard the rank reported. The rank says
 * only what it wrote (step, path, bytes, checksum), or that it could not
 * write it and why (failed); who it is (node, job, attempt, rank) is
 * fsdpd's to say, and the coordinator checks the path and the text. */
static int rk_shard_queue(rank_t *rk, const Fsdp__V1__ReportCheckpointShardRequest *in) {
  int queued = 0;
  for (const rk_shard_t *x = rk->shards; x; x = x->next) queued++;
  if (queued >= RANKS_SHARDS_QUEUED) {
    /* the coordinator has been away for a while: the oldest report waiting
     * (not the one in flight) goes, so the newest checkpoints can commit
     * when it is back; the channel stays open (it carries the progress) */
    rk_shard_t **pp = rk->work ? &rk->shards->next : &rk->shards, *old = *pp;
    *pp = old->next;
    if (rk->shards_tail == &old->next) rk->shards_tail = pp;
    LOG_WARN("fsdpd", "job %s rank %" PRIu32 ": %d checkpoint shard reports wait for the "
             "coordinator; step %" PRId64 "'s is dropped (that checkpoint will not commit, the "
             "newer ones still can)", rk_job(rk), rk->a->rank, queued, old->req->step);
    free(old->req);
    free(old);
  }
  const char *path = in->path ? in->path : "", *sum = in->checksum ? in->checksum : "";
  const char *failed = in->failed ? in->failed : "";
  const size_t nid = strlen(rk->R->node_id) + 1, njob = strlen(rk_job(rk)) + 1;
  const size_t npath = strlen(path) + 1, nsum = strlen(sum) + 1, nfailed = strlen(failed) + 1;
  rk_shard_t *x = calloc(1, sizeof *x);
  Fsdp__V1__ReportCheckpointShardRequest *q =
      malloc(sizeof *q + nid + njob + npath + nsum + nfailed);
  if (!x || !q) {
    free(x), free(q);
    return err_set(FSDP_ENOMEM, "out of memory for a checkpoint report");
  }
  fsdp__v1__report_checkpoint_shard_request__init(q);
  char *p = (char *)(q + 1);
  q->node_id = memcpy(p, rk->R->node_id, nid);
  q->job_id = memcpy(p += nid, rk_job(rk), njob);
  q->path = memcpy(p += njob, path, npath);
  q->checksum = memcpy(p += npath, sum, nsum);
  q->failed = memcpy(p += nsum, failed, nfailed);
  q->attempt = rk->a->attempt;
  q->rank = rk->a->rank;
  q->step = in->step;
  q->bytes = in->bytes;
  q->damaged = in->damaged;
  x->req = q;
  *rk->shards_tail = x;
  rk->shards_tail = &x->next;
  rk_pump(rk);
  return 0;
}

static int rk_frame_cb(void *arg, const uint8_t *data, size_t n) {
  rank_t *rk = arg;
  Fsdp__V1__RankReport *rep = fsdp__v1__rank_report__unpack(NULL, n, data);
  if (!rep || rep->kind_case == FSDP__V1__RANK_REPORT__KIND__NOT_SET) {
    if (rep) fsdp__v1__rank_report__free_unpacked(rep, NULL);
    return err_set(FSDP_EFORMAT, "a report of %zu bytes that is not a RankReport", n);
  }
  int rc = 0;
  if (rep->kind_case == FSDP__V1__RANK_REPORT__KIND_STATUS) {
    if (rk->status) fsdp__v1__rank_status__free_unpacked(rk->status, NULL);
    rk->status = rep->status;
    rep->status = NULL, rep->kind_case = FSDP__V1__RANK_REPORT__KIND__NOT_SET; /* kept */
    rk->R->dirty = 1;
  } else {
    rc = rk_shard_queue(rk, rep->shard);
  }
  fsdp__v1__rank_report__free_unpacked(rep, NULL);
  return rc;
}

static void rk_report_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  static char b[16384]; /* the loop's thread only; consumed before the next read */
  (void)h, (void)hint;
  *buf = uv_buf_init(b, sizeof b);
}

/* Reads what the rank wrote that the loop has not read yet (its process
 * is gone: the socket holds all of it, and nothing more comes). */
static void rk_report_drain(rank_t *rk) {
  uv_os_fd_t fd;
  if (!rk->report_open || uv_fileno((uv_handle_t *)&rk->report, &fd)) return;
  char b[16384];
  for (int i = 0; i < 64; i++) { /* bounded: 1 MiB, far above what a rank writes between reads */
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (n <= 0) return;
    if (frame_reader_feed(&rk->fr, b, (size_t)n, rk_frame_cb, rk)) return;
  }
}

static void rk_report_read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  rank_t *rk = s->data;
  if (n == 0) return;
  if (n < 0) { /* the rank closed its end (it exited, or stopped reporting) */
    rk_close_report(rk);
    return;
  }
  int rc = frame_reader_feed(&rk->fr, buf->base, (size_t)n, rk_frame_cb, rk);
  if (rc) {
    /* closing (not just ignoring) ends the rank's writes with EPIPE: a rank
     * never blocks on a channel nobody reads */
    LOG_WARN("fsdpd", "job %s rank %" PRIu32 ": %s; no more reports are read from it (it keeps "
             "training)", rk_job(rk), rk->a->rank, err_msg());
    rk_close_report(rk);
  }
}

/* The lease to one rank: a RankLease frame, written behind whatever is
 * queued (a rank reads them on a thread of its own: report.c). */
static void rk_lease_written(uv_write_t *req, int status) {
  (void)status; /* a rank gone, or its channel closed: it keeps the lease it has */
  free(req);
}

static void rk_lease_send(rank_t *rk) {
  /* a rank that reads none (a program of its own, a reader that quit) has
   * its last one waiting: the next goes when it is taken */
  if (!rk->report_open || uv_stream_get_write_queue_size((uv_stream_t *)&rk->report)) return;
  Fsdp__V1__RankLease l = FSDP__V1__RANK_LEASE__INIT;
  l.until_ns = rk->R->lease_ns;
  const size_t n = fsdp__v1__rank_lease__get_packed_size(&l);
  uv_write_t *req = malloc(sizeof *req + FRAME_HEADER + n);
  if (!req) return; /* the next renewal carries it */
  uint8_t *b = (uint8_t *)(req + 1);
  frame_header(b, n);
  fsdp__v1__rank_lease__pack(&l, b + FRAME_HEADER);
  uv_buf_t buf = uv_buf_init((char *)b, (unsigned)(FRAME_HEADER + n));
  if (uv_write(req, (uv_stream_t *)&rk->report, &buf, 1, rk_lease_written)) free(req);
}

void ranks_lease(ranks_t *R, uint64_t until_ns, int reset) {
  if (reset ? until_ns == R->lease_ns : until_ns <= R->lease_ns) return;
  R->lease_ns = until_ns;
  for (rank_t *rk = R->list; rk; rk = rk->next)
    if (rk->state == RK_RUNNING) rk_lease_send(rk);
}

/* ---- spawning ----------------------------------------------------------------- */

/* A section or key of a job file: what the option table's names are made of. */
static int rk_word_ok(const char *s, int empty_ok) {
  if (!*s) return empty_ok;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_' || *s == '-' || *s == '.'))
      return 0;
  return 1;
}

/* Checks the spec's options: a newline in a value, a bracket in a key, or
 * a line libinih would cut in two would let a request add lines of its own
 * to the job file. */
static int rk_options_check(const Fsdp__V1__RankAssignment *a) {
  const Fsdp__V1__JobSpec *sp = a->spec;
  for (size_t i = 0; sp && i < sp->n_options; i++) {
    const Fsdp__V1__Option *o = sp->options[i];
    if (!rk_word_ok(o->section, 1) || !rk_word_ok(o->key, 0) || strpbrk(o->value, "\r\n"))
      return err_set(FSDP_EINVAL, "option %zu ([%.32s] %.32s) is not a job file line (sections and "
                     "keys are words, values one line)", i, o->section, o->key);
    int rc = ini_line_check(o->section, o->key, o->value);
    if (rc) return err_wrap(rc, "option %zu", i);
  }
  return FSDP_OK;
}

/* A new file at path in an attempt directory. A plain file there (an
 * earlier start's) is replaced; anything else (a FIFO, a symbolic or hard
 * link: put there by another rank of the attempt, whose user owns the
 * directory) is refused, never opened or written through; one put there
 * meanwhile fails the create (EEXIST). */
static int rk_create(const char *path, mode_t mode, int *fd) {
  struct stat st;
  if (!lstat(path, &st)) {
    if (!S_ISREG(st.st_mode) || st.st_nlink != 1)
      return err_set(FSDP_EFORMAT, "%s is not a plain file (a FIFO, a link, a directory: put "
                     "there by a rank's user?); it is not written through: remove it", path);
    if (unlink(path) && errno != ENOENT)
      return err_set_errno(err_from_errno(errno), errno, "cannot replace %s", path);
  }
  return file_open_regular(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND, mode, fd);
}

/* The spec's options as a job file: options with no section first, then
 * each section's, in their order. */
static int rk_write_job(rank_t *rk, const char *path) {
  const Fsdp__V1__JobSpec *sp = rk->a->spec;
  ranks_t *R = rk->R;
  /* the attempt directory is the ranks' user's: another rank of the
   * attempt may have put a FIFO here, which must not hold the loop, or a
   * hard link to a file of root's, which must not be truncated: a new file
   * or nothing */
  int fd, rc = rk_create(path, 0600, &fd);
  if (rc) return err_wrap(rc, "cannot write the rank's job file");
  FILE *f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    return err_set(FSDP_ENOMEM, "cannot write %s: out of memory", path);
  }
  fprintf(f, "# job %s attempt %" PRIu32 " rank %" PRIu32 " of %" PRIu32 ", written by fsdpd\n",
          rk_job(rk), rk->a->attempt, rk->a->rank, rk->a->world_size);
  for (int pass = 0; pass < 2 && sp; pass++) {
    const char *cur = "";
    for (size_t i = 0; i < sp->n_options; i++) {
      const Fsdp__V1__Option *o = sp->options[i];
      if ((pass == 0) != (o->section[0] == 0)) continue;
      /* one line a key, the last (fsdp-train refuses a key set twice; a job
       * submitted before the coordinator refused them may hold one) */
      int later = 0;
      for (size_t k = i + 1; k < sp->n_options && !later; k++) later = !strcmp(sp->options[k]->key, o->key);
      if (later) continue;
      if (pass == 1 && strcmp(cur, o->section)) fprintf(f, "[%s]\n", cur = o->section);
      (void)ini_line_write(f, o->section, o->key, o->value); /* checked: rk_options_check */
    }
  }
  int bad = ferror(f);
  if (R->o.as_user && fchown(fileno(f), R->o.uid, R->o.gid)) bad = 1;
  if (fclose(f) || bad) return err_set(FSDP_EIO, "cannot write %s", path);
  return FSDP_OK;
}

/* A log already at path is an earlier run's: a job of this id ran this
 * attempt on this node before (a coordinator restored from an older backup
 * handed its id out again, before it kept ids above those handed out; a
 * node moved between clusters; a work directory reused). Its log may be the
 * only record of that run, so it is never truncated: it is moved aside, to
 * path.N (the first N free: link, which never replaces, then unlink), with
 * a warning, and the new rank runs. Refusing the rank instead would fail a
 * job for a name clash the coordinator no longer makes, and would leave the
 * operator nothing to do but the same move. 0, or an error (the log could
 * not be kept: the rank does not start). */
#define RK_LOG_ASIDE_MAX 1000
static int rk_keep_old_log(rank_t *rk, const char *path) {
  struct stat sb;
  if (lstat(path, &sb) || !S_ISREG(sb.st_mode) || sb.st_nlink != 1)
    return 0; /* none; or not a plain file, which rk_create refuses */
  char aside[PATH_MAX + 48];
  for (int i = 1; i <= RK_LOG_ASIDE_MAX; i++) {
    snprintf(aside, sizeof aside, "%s.%d", path, i);
    int moved = !link(path, aside) && !(unlink(path) && errno != ENOENT);
    /* no hard links (vfat, SMB, some FUSE mounts; fs.protected_hardlinks
     * for another user's file): a rename that never replaces */
    if (!moved && errno != EEXIST)
      moved = !renameat2(AT_FDCWD, path, AT_FDCWD, aside, RENAME_NOREPLACE);
    if (!moved) {
      if (errno == EEXIST) continue;
      break;
    }
    LOG_WARN("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": %s was already there (%lld "
             "bytes: an earlier run of a job with this id and attempt on this node); kept as %s, "
             "not overwritten", rk_job(rk), rk->a->attempt, rk->a->rank, path,
             (long long)sb.st_size, aside);
    return 0;
  }
  return err_set_errno(FSDP_EEXIST, errno, "%s is an earlier run's log (%lld bytes: a job of this "
                       "id and attempt ran on this node before) and cannot be moved aside (to "
                       "%s): it is not overwritten; move it away, then run the job again", path,
                       (long long)sb.st_size, aside);
}

static FILE *rk_open_log(rank_t *rk, char *path) {
  ranks_t *R = rk->R;
  int fd; /* as rk_write_job: never a FIFO's wait, nor another's file */
  if (rk_keep_old_log(rk, path)) return NULL;
  if (rk_create(path, 0640, &fd)) {
    err_wrap(FSDP_EIO, "cannot create the rank's log");
    return NULL;
  }
  if (R->o.as_user && fchown(fd, R->o.uid, R->o.gid)) { /* its owner may read it */
  }
  FILE *f = fdopen(fd, "w");
  if (!f) close(fd), err_set(FSDP_ENOMEM, "cannot open the rank's log %s", path);
  return f;
}

static int rk_spawn(rank_t *rk, const Fsdp__V1__RendezvousReply *rep) {
  ranks_t *R = rk->R;
  const Fsdp__V1__RankAssignment *a = rk->a;
  int rc;
  /* FSDP_ADDRS: the payloads in rank order, checked before they reach an environment */
  if (rep->n_payloads != a->world_size)
    return err_set(FSDP_EINVAL, "rendezvous gave %zu addresses for %" PRIu32 " ranks",
                   rep->n_payloads, a->world_size);
  size_t len = 0;
  for (size_t i = 0; i < rep->n_payloads; i++) {
    const ProtobufCBinaryData *p = &rep->payloads[i];
    int ok = p->len > 0 && p->len <= RANKS_PAYLOAD_MAX;
    for (size_t j = 0; ok && j < p->len; j++) ok = p->data[j] > ' ' && p->data[j] < 127 && p->data[j] != ',';
    if (!ok)
      return err_set(FSDP_EINVAL, "rendezvous payload of rank %zu is not a host:port address", i);
    len += p->len + 1;
  }
  char *addrs = malloc(len + 16);
  if (!addrs) return err_set(FSDP_ENOMEM, "out of memory for %zu bytes of addresses", len);
  char *q = addrs + sprintf(addrs, "FSDP_ADDRS=");
  for (size_t i = 0; i < rep->n_payloads; i++) {
    if (i) *q++ = ',';
    memcpy(q, rep->payloads[i].data, rep->payloads[i].len);
    q += rep->payloads[i].len;
  }
  *q = 0;

  char conf[PATH_MAX + 64], logp[PATH_MAX + 32];
  char vsecret[RING_SECRET_ENV_LEN] = "";
  int sv[2] = {-1, -1};
  if ((rc = workdir_make_attempt(R->o.work_dir, rk_job(rk), a->attempt, R->o.as_user, R->o.uid,
                                 R->o.gid, rk->dir, sizeof rk->dir)))
    goto out;
  /* one file per rank: ranks of one attempt on this node share the directory,
   * and a file rewritten while another rank reads it would be half a job */
  char confname[48];
  snprintf(confname, sizeof confname, "rank-%" PRIu32 ".conf", a->rank);
  snprintf(conf, sizeof conf, "%s/%s", rk->dir, confname);
  snprintf(logp, sizeof logp, "%s/rank-%" PRIu32 ".log", rk->dir, a->rank);
  if ((rc = rk_write_job(rk, conf))) goto out;
  if (!(rk->log = rk_open_log(rk, logp))) {
    rc = FSDP_EIO;
    goto out;
  }
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
    rc = err_set_errno(FSDP_EIO, errno, "cannot make the report channel");
    goto out;
  }
  char vrank[32], vworld[40], vthreads[40], vnode[40], vattempt[40];
  char vjob[WORKDIR_ID_MAX + 16]; /* the id passed workdir_id_check at assignment */
  snprintf(vnode, sizeof vnode, "FSDP_NODE_PID=%ld", (long)getpid()); /* the rank dies with us */
  /* whose run the ring's hello says it is: a rank of another job or attempt
   * that reaches this one's port is told apart (daemon/comm/ring_boot.c) */
  snprintf(vjob, sizeof vjob, "FSDP_JOB_ID=%s", rk_job(rk));
  snprintf(vattempt, sizeof vattempt, "FSDP_ATTEMPT=%" PRIu32, a->attempt);
  snprintf(vrank, sizeof vrank, "FSDP_RANK=%" PRIu32, a->rank);
  snprintf(vworld, sizeof vworld, "FSDP_WORLD_SIZE=%" PRIu32, a->world_size);
  snprintf(vthreads, sizeof vthreads, "FSDP_THREADS=%d", R->ncpu_threads);
  const int is_cpu = !strcmp(R->o.inv->dev[a->device].kind, "cpu");
  /* a CPU rank gets its share of the cores, a GPU rank its GPU (device.h) */
  char vgpu[40];
  snprintf(vgpu, sizeof vgpu, "FSDP_CUDA_DEVICE=%d", R->o.inv->dev[a->device].index);
  /* its memory limit: the device's, as registered (not the host's divided
   * among the job's ranks, most of which run elsewhere) */
  char vmem[64];
  snprintf(vmem, sizeof vmem, "FSDP_DEVICE_MEMORY_BYTES=%" PRIu64, R->o.inv->dev[a->device].memory);
  /* and its share of the host's, for what it keeps there (a GPU's snapshot) */
  char vhost[64];
  snprintf(vhost, sizeof vhost, "FSDP_HOST_MEMORY_BYTES=%" PRIu64, R->o.inv->host_share);
  /* the attempt's ring secret, which each rank proves to its neighbours */
  if (a->ring_secret.len == RING_SECRET_BYTES) ring_secret_env(vsecret, a->ring_secret.data);
  /* the plan's tunables as the coordinator admitted the job with them (over
   * this daemon's own; one it does not name at its default: param.h), then
   * the secret; checked at assignment */
  char *env[16 + PARAM_PLAN_ENV_N] = {vrank, vworld, addrs, "FSDP_LISTEN_FD=3", "FSDP_REPORT_FD=4",
                                      vnode, vjob, vattempt, vmem, vhost, is_cpu ? vthreads : vgpu};
  int ne = 11;
  char unnamed[PARAM_PLAN_ENV_N][PARAM_PLAN_ENV_LEN];
  for (int k = 0; k < PARAM_PLAN_ENV_N; k++) {
    size_t i = 0;
    while (i < a->n_plan_env && param_plan_env_index(a->plan_env[i]) != k) i++;
    if (i < a->n_plan_env) {
      env[ne++] = a->plan_env[i];
    } else {
      param_plan_env_default(k, unnamed[k]);
      env[ne++] = unnamed[k];
    }
  }
  if (vsecret[0]) env[ne++] = vsecret;
  for (int k = 0; R->o.as_user && R->o.user_env && R->o.user_env[k] && k < 3; k++)
    env[ne++] = R->o.user_env[k];
  env[ne] = NULL;
  char *argv[] = {(char *)R->o.rank_program, "--config", confname, NULL};
  const int fds[2] = {rk->listen_fd, sv[1]};
  const supervise_child_opts_t co = {.argv = argv, .env = env, .fds = fds, .nfds = 2,
                                     .out = rk->log, .err = rk->log, .cwd = rk->dir,
                                     .as_user = R->o.as_user, .uid = R->o.uid, .gid = R->o.gid,
                                     .exit_cb = rk_exit_cb, .arg = rk};
  if ((rc = supervise_create(&rk->set, R->o.loop, NULL))) goto out;
  if ((rc = supervise_spawn(rk->set, &co, &rk->pid))) {
    supervise_destroy(rk->set);
    rk->set = NULL;
    goto out;
  }
  rk->started = rk->alive = 1;
  rk->state = RK_RUNNING;
  R->dirty = 1;
  /* the rank holds its copies now */
  close(rk->listen_fd), rk->listen_fd = -1;
  close(sv[1]), sv[1] = -1;
  uv_pipe_init(R->o.loop, &rk->report, 0);
  rk->report.data = rk;
  rk->handles++;
  rk->report_open = 1;
  if (uv_pipe_open(&rk->report, sv[0]) == 0) {
    sv[0] = -1; /* the pipe owns it */
    uv_read_start((uv_stream_t *)&rk->report, rk_report_alloc_cb, rk_report_read_cb);
    if (R->lease_ns) rk_lease_send(rk);
  } else {
    rk_close_report(rk);
  }
  LOG_INFO("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 "/%" PRIu32 ": started on device %" PRIu32
           " (pid %d, log %s)", rk_job(rk), a->attempt, a->rank, a->world_size, a->device, rk->pid, logp);
  if (rk->killed) supervise_stop(rk->set, rk->grace_s);
out:
  explicit_bzero(vsecret, sizeof vsecret);
  if (sv[0] >= 0) close(sv[0]);
  if (sv[1] >= 0) close(sv[1]);
  free(addrs);
  return rc;
}

/* ---- rendezvous ---------------------------------------------------------------- */

static void rk_rendezvous_start(rank_t *rk);
static void rk_rendezvous_timer_cb(uv_timer_t *t) { rk_rendezvous_start(t->data); }

static void rk_rendezvous_start(rank_t *rk) {
  ranks_t *R = rk->R;
  if (rk->killed) {
    rk_not_started(rk, "killed during its rendezvous (%s)", rk->why[0] ? rk->why : "no reason given");
    return;
  }
  size_t nid = strlen(R->node_id) + 1, njob = strlen(rk_job(rk)) + 1, np = strlen(rk->payload);
  Fsdp__V1__RendezvousRequest *req = malloc(sizeof *req + nid + njob + np + 8);
  FSDP_ASSERT(req);
  fsdp__v1__rendezvous_request__init(req);
  char *p = (char *)(req + 1);
  req->node_id = memcpy(p, R->node_id, nid);
  req->job_id = memcpy(p + nid, rk_job(rk), njob);
  req->group = memcpy(p + nid + njob, "world", 6);
  req->payload.data = memcpy(p + nid + njob + 6, rk->payload, np);
  req->payload.len = np;
  req->attempt = rk->a->attempt;
  req->group_size = rk->a->world_size;
  req->rank = rk->a->rank;
  rk_call(rk, RK_CALL_RENDEZVOUS, &req->base);
}

static void rk_after_rendezvous(rank_t *rk, rk_work_t *w) {
  if (rk->killed) {
    rk_not_started(rk, "killed during its rendezvous (%s)", rk->why[0] ? rk->why : "no reason given");
    return;
  }
  if (w->rc == FSDP_ESTALE || w->rc == FSDP_ENOTFOUND) {
    /* the attempt ended: nobody waits for this rank, nor for its report */
    LOG_INFO("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": rendezvous refused (%s); given up",
             rk_job(rk), rk->a->attempt, rk->a->rank, w->err);
    rk->reported = 1;
    rk->state = RK_EXITED;
    if (rk->listen_fd >= 0) close(rk->listen_fd), rk->listen_fd = -1;
    rk_forget(rk);
    rank_try_start_waiting(rk->R);
    return;
  }
  if (w->rc == FSDP_EUNAVAILABLE || w->rc == FSDP_ETIMEDOUT || w->rc == FSDP_ECANCELED ||
      w->rc == FSDP_EINTERNAL) {
    /* the coordinator is away (a restart): keep the rank waiting for it */
    uv_timer_start(&rk->timer, rk_rendezvous_timer_cb, (uint64_t)rk_backoff(rk), 0);
    return;
  }
  if (w->rc) {
    rk_not_started(rk, "rendezvous failed: %s", w->err);
    return;
  }
  rk->backoff_ms = 0;
  const Fsdp__V1__RendezvousReply *rep = (const void *)w->reply;
  if (!rep->complete) { /* the coordinator held the call; ask again */
    rk_rendezvous_start(rk);
    return;
  }
  if (rk_spawn(rk, rep)) rk_not_started(rk, "%s", err_msg());
}

/* ---- devices and waiting ranks ------------------------------------------------- */

/* The rank holding device d (starting, or its processes alive), or NULL. */
static rank_t *rk_device_holder(ranks_t *R, uint32_t d, const rank_t *except) {
  for (rank_t *rk = R->list; rk; rk = rk->next)
    if (rk != except && rk->a->device == d && !rk->freeing &&
        (rk->state == RK_RENDEZVOUS || rk->state == RK_RUNNING || rk->alive))
      return rk;
  return NULL;
}

/* ---- measuring idle GPUs again -------------------------------------------------- */

/* A GPU's free memory moves as other processes come and go: measured only
 * as fsdpd started, a GPU others held then would be offered less for good,
 * and one they took since more than it has (its ranks refuse at open).
 * Every FSDP_GPU_MEASURE_S one idle GPU (no rank of this node assigned to
 * it) is measured again on the loop's pool, its ranks waiting meanwhile (a
 * context of ours on it would fail theirs in exclusive-process mode); a
 * figure that moved by RANKS_MEASURE_STEP or more goes in the next
 * heartbeat, and the coordinator places by it. */
#define RANKS_MEASURE_STEP (64ull << 20)
/* A measurement not back by then is a driver that does not answer (a GPU
 * fallen off the bus, Xid errors): its GPU's ranks stop waiting for it and
 * no GPU is measured again (its call cannot be taken back: the pool thread
 * stays with it, and fsdpd exits without it, ranks_measures_hung) */
#define RANKS_MEASURE_HUNG_MS 10000

/* Measurements given up whose call is still out (ranks_measures_hung):
 * one fsdpd has one ranks_t, and the count outlives it. */
static atomic_int gpu_measures_hung;

typedef struct gpu_measure {
  uv_work_t req;
  int given_up;             /* counted in gpu_measures_hung until it returns */
  ranks_t *R;               /* NULL once given up, or once ranks_destroy ran */
  int dev, index;           /* inventory slot, CUDA ordinal */
  uint64_t queued_ms;       /* uv_now as it was queued */
  int err;
  uint64_t free_bytes;
} gpu_measure_t;

static void gpu_measure_tick(uv_timer_t *t);

/* FSDP_GPU_MEASURE_S in ms, at most a day. */
static uint64_t gpu_measure_every_ms(void) {
  const int64_t s = param_gpu_measure_s();
  return (uint64_t)(s > 86400 ? 86400 : s < 1 ? 1 : s) * 1000;
}

/* Whether a rank of this node is assigned device d and not yet gone. */
static int rk_device_wanted(const ranks_t *R, int d) {
  for (const rank_t *rk = R->list; rk; rk = rk->next)
    if (!rk->freeing && rk->a->device == (uint32_t)d && rk->state != RK_EXITED) return 1;
  return 0;
}

static void gpu_measure_work(uv_work_t *req) {
  gpu_measure_t *m = req->data;
  m->err = inventory_gpu_free(m->index, &m->free_bytes);
}

static void gpu_measure_done(uv_work_t *req, int status) {
  gpu_measure_t *m = req->data;
  ranks_t *R = m->R;
  if (m->given_up) atomic_fetch_sub(&gpu_measures_hung, 1);
  if (R) {
    R->measuring = NULL;
    inventory_device_t *d = &R->o.inv->dev[m->dev];
    const uint64_t now = m->free_bytes < d->total ? m->free_bytes : d->total;
    if (status || m->err) {
      LOG_DEBUG("fsdpd", "cuda:%d: its free memory cannot be measured again (%s %d); offered "
                "as before", d->index, status ? "libuv error" : "CUDA error", status ? status : m->err);
    } else if (now + RANKS_MEASURE_STEP <= d->memory || d->memory + RANKS_MEASURE_STEP <= now) {
      LOG_INFO("fsdpd", "cuda:%d (%s): %.2f GiB free now, of %.2f GiB (was %.2f GiB): offered so",
               d->index, d->name, (double)now / (1 << 30), (double)d->total / (1 << 30),
               (double)d->memory / (1 << 30));
      d->memory = now;
      d->free_error = 0;
      R->dirty = 1; /* the next heartbeat says so */
    }
    rank_try_start_waiting(R);
    uv_timer_start(R->measure_timer, gpu_measure_tick, gpu_measure_every_ms(), 0);
  }
  free(m);
}

static void gpu_measure_tick(uv_timer_t *t) {
  ranks_t *R = t->data;
  const inventory_t *inv = R->o.inv;
  if (R->measuring) { /* RANKS_MEASURE_HUNG_MS after it was queued */
    gpu_measure_t *m = R->measuring;
    LOG_ERROR("fsdpd", "cuda:%d: measuring its free memory has taken %.0f s: the driver does not "
              "answer (see nvidia-smi, and the kernel log for Xid errors); its ranks start "
              "without waiting for it, and no GPU is measured again until fsdpd restarts",
              m->index, (double)(uv_now(R->o.loop) - m->queued_ms) / 1e3);
    m->R = NULL, R->measuring = NULL;
    m->given_up = 1;
    atomic_fetch_add(&gpu_measures_hung, 1);
    R->measure_gave_up = 1;
    rank_try_start_waiting(R);
    return;
  }
  if (R->stopping) return;
  for (int k = 0; k < inv->count; k++) {
    const int d = (R->measure_next + k) % inv->count;
    if (strcmp(inv->dev[d].kind, "cuda") || rk_device_wanted(R, d)) continue;
    gpu_measure_t *m = calloc(1, sizeof *m);
    if (!m) break; /* tried again at the next tick */
    *m = (gpu_measure_t){.R = R, .dev = d, .index = inv->dev[d].index,
                         .queued_ms = uv_now(R->o.loop)};
    m->req.data = m;
    if (uv_queue_work(R->o.loop, &m->req, gpu_measure_work, gpu_measure_done)) {
      free(m);
      break;
    }
    R->measuring = m;
    R->measure_next = d + 1;
    uv_timer_start(t, gpu_measure_tick, RANKS_MEASURE_HUNG_MS, 0); /* back before it, or hung */
    return;
  }
  uv_timer_start(t, gpu_measure_tick, gpu_measure_every_ms(), 0); /* none idle now */
}

static void gpu_measure_start(ranks_t *R) {
  int gpus = 0;
  for (int i = 0; i < R->o.inv->count; i++) gpus += !strcmp(R->o.inv->dev[i].kind, "cuda");
  if (!gpus || param_gpu_measure_s() <= 0) return;
  R->measure_timer = calloc(1, sizeof *R->measure_timer);
  if (!R->measure_timer) return; /* measured as fsdpd started, as before */
  uv_timer_init(R->o.loop, R->measure_timer);
  R->measure_timer->data = R;
  uv_timer_start(R->measure_timer, gpu_measure_tick, gpu_measure_every_ms(), 0);
}

static void gpu_measure_timer_closed(uv_handle_t *h) { free(h); }

/* GPU d, free again, measured now rather than at the next tick (unless a
 * rank waits for it, or a measurement is going): what it offers is current
 * in the heartbeats that follow the exit, so a restart, which waits for
 * the node to show its ranks gone, is mostly placed by it, not again on a
 * GPU others took since (whose rank refused at open, saying so). */
static void gpu_measure_soon(ranks_t *R, uint32_t d) {
  if (!R->measure_timer || R->measuring || R->measure_gave_up || R->stopping ||
      d >= (uint32_t)R->o.inv->count || strcmp(R->o.inv->dev[d].kind, "cuda"))
    return;
  R->measure_next = (int)d;
  uv_timer_start(R->measure_timer, gpu_measure_tick, 0, 0);
}

/* Whether d may start a rank: no rank holds it and it is not being measured. */
static int rk_device_free(ranks_t *R, uint32_t d, const rank_t *except) {
  return !rk_device_holder(R, d, except) && !(R->measuring && R->measuring->dev == (int)d);
}

static int rk_bind(rank_t *rk) {
  ranks_t *R = rk->R;
  struct sockaddr_storage sa;
  socklen_t al;
  int rc = netaddr_parse("--rank-host", R->o.rank_host, 0, &sa, &al);
  if (rc) return rc;
  int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, al) || listen(fd, 64) ||
      getsockname(fd, (struct sockaddr *)&sa, &al)) {
    int e = errno;
    if (fd >= 0) close(fd);
    return err_set_errno(FSDP_EIO, e, "cannot listen on %s for the rank's ring", R->o.rank_host);
  }
  rk->listen_fd = fd;
  netaddr_format((struct sockaddr *)&sa, rk->payload, sizeof rk->payload);
  return FSDP_OK;
}

/* Starts, in assignment order, each waiting rank whose device is free. */
static void rank_try_start_waiting(ranks_t *R) {
  if (R->stopping) return;
  /* the list is newest first: walk to the oldest by repeated scans (lists are short) */
  for (;;) {
    rank_t *first = NULL;
    for (rank_t *rk = R->list; rk; rk = rk->next)
      if (rk->state == RK_WAITING && !rk->freeing && rk_device_free(R, rk->a->device, rk))
        first = rk;
    if (!first) return;
    first->state = RK_RENDEZVOUS;
    R->dirty = 1;
    if (rk_bind(first)) {
      rk_not_started(first, "%s", err_msg());
      continue;
    }
    rk_rendezvous_start(first);
  }
}

/* ---- the API -------------------------------------------------------------------- */

int ranks_create(ranks_t **out, const ranks_opts_t *o) {
  ranks_t *R = calloc(1, sizeof *R);
  if (!R) return err_set(FSDP_ENOMEM, "fsdpd: out of memory for its ranks");
  R->o = *o;
  int cpus = 0;
  for (int i = 0; i < o->inv->count; i++) cpus += !strcmp(o->inv->dev[i].kind, "cpu");
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  R->ncpu_threads = cpus && cores / cpus > 1 ? (int)(cores / cpus) : 1;
  R->dirty = 1;
  gpu_measure_start(R);
  *out = R;
  return FSDP_OK;
}

void ranks_set_node_id(ranks_t *R, const char *node_id) {
  snprintf(R->node_id, sizeof R->node_id, "%s", node_id);
}

static rank_t *rk_find(const ranks_t *R, const char *job, uint32_t attempt, uint32_t rank) {
  for (rank_t *rk = R->list; rk; rk = rk->next)
    if (!rk->freeing && rk->a->attempt == attempt && rk->a->rank == rank && !strcmp(rk_job(rk), job))
      return rk;
  return NULL;
}

void ranks_assign(ranks_t *R, const Fsdp__V1__RankAssignment *a) {
  if (R->stopping) {
    LOG_INFO("fsdpd", "job %.64s rank %" PRIu32 ": assignment ignored, fsdpd is stopping", a->job_id,
             a->rank);
    return;
  }
  if (rk_find(R, a->job_id, a->attempt, a->rank)) return; /* sent again (after a re-registration) */
  size_t n = fsdp__v1__rank_assignment__get_packed_size(a);
  uint8_t *b = malloc(n ? n : 1);
  rank_t *rk = calloc(1, sizeof *rk);
  FSDP_ASSERT(b && rk);
  fsdp__v1__rank_assignment__pack(a, b);
  rk->a = fsdp__v1__rank_assignment__unpack(NULL, n, b);
  free(b);
  FSDP_ASSERT(rk->a);
  rk->R = R;
  rk->listen_fd = -1;
  rk->shards_tail = &rk->shards;
  rk->grace_s = R->o.grace_s;
  frame_reader_init(&rk->fr, RANKS_REPORT_MAX);
  uv_timer_init(R->o.loop, &rk->timer);
  rk->timer.data = rk;
  rk->handles = 1;
  rk->next = R->list;
  R->list = rk;
  R->dirty = 1;
  /* checked before anything touches the file system or the network */
  int rc = workdir_id_check("job_id", a->job_id);
  if (!rc && a->attempt == 0) rc = err_set(FSDP_EINVAL, "attempt 0 (attempts count from 1)");
  if (!rc && (a->world_size == 0 || a->world_size > 4096 || a->rank >= a->world_size))
    rc = err_set(FSDP_EINVAL, "rank %" PRIu32 " of a world of %" PRIu32, a->rank, a->world_size);
  if (!rc && a->ring_secret.len && a->ring_secret.len != RING_SECRET_BYTES)
    rc = err_set(FSDP_EINVAL, "ring_secret of %zu bytes (%d, or none)", a->ring_secret.len,
                 RING_SECRET_BYTES);
  for (size_t i = 0; !rc && i < a->n_plan_env; i++) {
    if (!param_plan_env_ok(a->plan_env[i]) || i >= PARAM_PLAN_ENV_N)
      rc = err_set(FSDP_EINVAL, "plan_env: \"%.80s\" is not one of this fsdpd's plan tunables "
                   "with an integer value (or there are more than %d): a coordinator of a newer "
                   "build planned the job with it; upgrade this node, or run the job without it",
                   a->plan_env[i], PARAM_PLAN_ENV_N);
    for (size_t j = 0; !rc && j < i; j++)
      if (param_plan_env_index(a->plan_env[j]) == param_plan_env_index(a->plan_env[i]))
        rc = err_set(FSDP_EINVAL, "plan_env: \"%.80s\" names a tunable named before",
                     a->plan_env[i]);
  }
  if (!rc && a->device >= (uint32_t)R->o.inv->count)
    rc = err_set(FSDP_EINVAL, "device %" PRIu32 ": this node has %d", a->device, R->o.inv->count);
  if (!rc) rc = rk_options_check(a);
  if (rc) {
    rk_not_started(rk, "assignment refused: %s", err_msg());
    return;
  }
  rk->state = RK_WAITING;
  if (rk_device_holder(R, a->device, rk))
    LOG_INFO("fsdpd", "job %s rank %" PRIu32 ": waits for device %" PRIu32 " to be free of the "
             "processes of an earlier rank", a->job_id, a->rank, a->device);
  else if (!rk_device_free(R, a->device, rk))
    LOG_INFO("fsdpd", "job %s rank %" PRIu32 ": waits for device %" PRIu32 " while fsdpd "
             "measures its free memory", a->job_id, a->rank, a->device);
  rank_try_start_waiting(R);
}

/* Stops one rank, whatever its state. */
static void rk_kill(rank_t *rk, const char *reason, double grace_s) {
  if (rk->freeing || rk->state == RK_EXITED) return;
  rk->killed = 1;
  /* 0 is the node's default; RANKS_NO_GRACE_S or less is none */
  if (grace_s > 0) rk->grace_s = grace_s <= RANKS_NO_GRACE_S ? 0 : grace_s;
  snprintf(rk->why, sizeof rk->why, "%s", reason[0] ? reason : "no reason given");
  char grace[48] = "no grace: SIGKILL";
  if (rk->grace_s > 0) snprintf(grace, sizeof grace, "grace %.1f s", rk->grace_s);
  LOG_INFO("fsdpd", "job %s attempt %" PRIu32 " rank %" PRIu32 ": kill (%s), %s", rk_job(rk),
           rk->a->attempt, rk->a->rank, rk->why, grace);
  if (rk->state == RK_WAITING) {
    rk_not_started(rk, "killed before it started (%s)", rk->why);
  } else if (rk->state == RK_RENDEZVOUS) {
    /* the call in flight comes back within its deadline and gives up; the
     * listener goes now so no peer connects to a rank that will not run */
    if (rk->listen_fd >= 0) close(rk->listen_fd), rk->listen_fd = -1;
    if (!rk->work && uv_is_active((uv_handle_t *)&rk->timer)) {
      uv_timer_stop(&rk->timer);
      rk_rendezvous_start(rk);
    }
  } else if (rk->set) {
    supervise_stop(rk->set, rk->grace_s);
  }
}

void ranks_kill(ranks_t *R, const Fsdp__V1__Kill *k) {
  for (rank_t *rk = R->list; rk; rk = rk->next) {
    if (strcmp(rk_job(rk), k->job_id)) continue;
    if (k->attempt && rk->a->attempt > k->attempt) continue; /* a newer attempt than the kill's */
    int named = !k->n_ranks;
    for (size_t i = 0; i < k->n_ranks && !named; i++) named = k->ranks[i] == rk->a->rank;
    if (named) rk_kill(rk, k->reason, k->grace_ms / 1000.0);
  }
}

void ranks_kill_all(ranks_t *R, const char *reason, double grace_s) {
  for (rank_t *rk = R->list; rk; rk = rk->next) rk_kill(rk, reason, grace_s);
}

void ranks_fence(ranks_t *R, const char *why) {
  for (rank_t *rk = R->list; rk; rk = rk->next) {
    if (rk->freeing || rk->state == RK_EXITED) continue;
    rk->fenced = 1; /* before the kill: a rank that never ran is reported from inside it */
    rk_kill(rk, why, RANKS_NO_GRACE_S);
  }
}

int ranks_dirty(const ranks_t *R) { return R->dirty; }

int ranks_pack(ranks_t *R, uint8_t **buf, size_t *len) {
  const inventory_t *inv = R->o.inv;
  size_t nr = 0;
  for (rank_t *rk = R->list; rk; rk = rk->next) nr++;
  Fsdp__V1__Device *devs = calloc((size_t)inv->count, sizeof *devs);
  Fsdp__V1__Device **pdevs = calloc((size_t)inv->count, sizeof *pdevs);
  Fsdp__V1__RankStatus *sts = calloc(nr ? nr : 1, sizeof *sts);
  Fsdp__V1__RankStatus **psts = calloc(nr ? nr : 1, sizeof *psts);
  if (!devs || !pdevs || !sts || !psts) {
    free(devs), free(pdevs), free(sts), free(psts);
    return err_set(FSDP_ENOMEM, "fsdpd: out of memory for a heartbeat");
  }
  for (int i = 0; i < inv->count; i++) {
    fsdp__v1__device__init(&devs[i]);
    /* the coordinator's number for a device is its place in this node's
     * list, as every assignment, rank status and busy bit here reads it;
     * a GPU's CUDA ordinal stays here (FSDP_CUDA_DEVICE). Before, the
     * ordinal was registered: with --devices cuda:1 every assignment was
     * refused ("device 1: this node has 1"), and with cuda:1,0 a rank
     * placed on the 80 GiB GPU ran on the 40 GiB one (helper-111). */
    devs[i].index = (uint32_t)i;
    devs[i].kind = (char *)inv->dev[i].kind;
    devs[i].name = (char *)inv->dev[i].name;
    devs[i].total_bytes = inv->dev[i].memory;
    pdevs[i] = &devs[i];
  }
  size_t k = 0;
  for (rank_t *rk = R->list; rk; rk = rk->next) {
    if (rk->freeing) continue;
    uint32_t d = rk->a->device;
    /* a device is busy while the rank's processes live: from its spawn until its group is empty */
    if (rk->alive && d < (uint32_t)inv->count) {
      devs[d].job_id = (char *)rk_job(rk);
      if (rk->status)
        for (size_t m = 0; m < rk->status->n_memory; m++)
          devs[d].used_bytes += rk->status->memory[m]->current_bytes;
    }
    /* a rank whose exit is not reported yet stays listed, EXITED: a
     * registration meanwhile must not read it as a rank gone missing */
    Fsdp__V1__RankStatus *st = &sts[k];
    if (rk->status) *st = *rk->status; /* a shallow copy: only read while packing */
    else fsdp__v1__rank_status__init(st), st->unreported = 1; /* its zeros are no step */
    st->job_id = (char *)rk_job(rk);
    st->attempt = rk->a->attempt;
    st->rank = rk->a->rank;
    st->device = rk->a->device;
    st->node_id = R->node_id;
    st->state = rk->state == RK_EXITED                  ? FSDP__V1__RANK_STATE__RANK_STATE_EXITED
                : rk->status && rk->state == RK_RUNNING ? FSDP__V1__RANK_STATE__RANK_STATE_RUNNING
                                                        : FSDP__V1__RANK_STATE__RANK_STATE_STARTING;
    psts[k] = st;
    k++;
  }
  Fsdp__V1__HeartbeatRequest hb = FSDP__V1__HEARTBEAT_REQUEST__INIT;
  hb.n_devices = (size_t)inv->count;
  hb.devices = pdevs;
  hb.n_ranks = k;
  hb.ranks = psts;
  hb.stopping = R->stopping; /* no new ranks for a node shutting down */
  *len = fsdp__v1__heartbeat_request__get_packed_size(&hb);
  *buf = malloc(*len ? *len : 1);
  int rc = FSDP_OK;
  if (*buf) fsdp__v1__heartbeat_request__pack(&hb, *buf);
  else rc = err_set(FSDP_ENOMEM, "fsdpd: out of memory for a heartbeat");
  free(devs), free(pdevs), free(sts), free(psts);
  R->dirty = 0;
  return rc;
}

int ranks_log_active(const ranks_t *R, const char *job, uint32_t attempt, uint32_t rank) {
  const rank_t *rk = rk_find(R, job, attempt, rank);
  /* the log is closed once its exit callback ran: the pipes were drained before */
  return rk && rk->state != RK_EXITED && (!rk->started || rk->log);
}

void ranks_stop_all(ranks_t *R, double grace_s, uint64_t report_deadline) {
  R->stopping = 1;
  R->dirty = 1; /* the next heartbeat says so */
  R->report_deadline = report_deadline;
  atomic_store(&R->calls_until, report_deadline); /* the loop's clock is uv_hrtime's, in ms */
  /* SIGTERM asks each rank to stop at its next step boundary and checkpoint
   * (daemon/train/main.c); its shard report, then its exit, are relayed
   * until report_deadline, and SIGKILL follows after the grace. */
  for (rank_t *rk = R->list; rk; rk = rk->next) rk_kill(rk, "fsdpd is stopping", grace_s);
}

int ranks_idle(const ranks_t *R) {
  for (const rank_t *rk = R->list; rk; rk = rk->next)
    if (!rk->freeing) return 0;
  return 1;
}

void ranks_destroy(ranks_t *R) {
  if (!R) return;
  R->destroying = 1;
  if (R->measure_timer) uv_close((uv_handle_t *)R->measure_timer, gpu_measure_timer_closed);
  if (R->measuring) R->measuring->R = NULL, R->measuring = NULL; /* it ends on the pool, freed */
  if (!R->list) {
    free(R);
    return;
  }
  for (rank_t *rk = R->list, *next; rk; rk = next) {
    next = rk->next;
    if (rk->set) { /* past the deadline with a process that would not die: left to process exit */
      LOG_ERROR("fsdpd", "job %s rank %" PRIu32 " (pid %d) still runs as fsdpd exits", rk_job(rk),
                rk->a->rank, rk->pid);
      continue;
    }
    /* one in flight is its call's (it ends by the deadline): the rest go
     * when the rank is freed, after it */
    if (rk->shards) rk_shards_give_up(rk, rk->shards->req->step, "fsdpd exits", !rk->work);
    rk_forget(rk);
  }
}

int ranks_measuring(const ranks_t *R) { return R->measuring != NULL; }

int ranks_measures_hung(void) { return atomic_load(&gpu_measures_hung); }

void ranks_metrics(const ranks_t *R, metrics_buf_t *b) {
  static const char *const states[] = {"waiting", "rendezvous", "running", "exited"};
  int count[4] = {0}, n = 0;
  for (const rank_t *rk = R->list; rk; rk = rk->next) count[rk->state]++, n++;
  metrics_family(b, "fsdp_node_ranks", "gauge", "Ranks this fsdpd holds, by state.");
  for (int s = 0; s < 4; s++)
    metrics_sample(b, "fsdp_node_ranks", (const char *[]){"state", states[s], NULL}, count[s]);
  static const char *const outcomes[] = {"succeeded", "failed", "preempted", "signal"};
  metrics_family(b, "fsdp_node_rank_exits_total", "counter",
                 "Rank processes that ended since fsdpd started, by how.");
  for (int o = 0; o < 4; o++)
    metrics_sample(b, "fsdp_node_rank_exits_total", (const char *[]){"outcome", outcomes[o], NULL},
                   (double)R->exits[o]);
  metrics_family(b, "fsdp_node_device_memory_offered_bytes", "gauge",
                 "What each device offers jobs: a CPU device's share of the host's memory, a "
                 "GPU's free memory with a context on it as last measured.");
  for (int i = 0; i < R->o.inv->count; i++) {
    const inventory_device_t *d = &R->o.inv->dev[i];
    char name[32];
    snprintf(name, sizeof name, "%s:%d", d->kind, d->index);
    metrics_sample(b, "fsdp_node_device_memory_offered_bytes", (const char *[]){"device", name, NULL},
                   (double)d->memory);
  }
  metrics_rank_t *m = calloc((size_t)n + 1, sizeof *m);
  const char **cats = NULL;
  uint64_t *bytes = NULL;
  size_t ncat = 0;
  for (const rank_t *rk = R->list; rk; rk = rk->next) ncat += rk->status ? rk->status->n_memory : 0;
  cats = calloc(ncat + 1, sizeof *cats), bytes = calloc(2 * ncat + 1, sizeof *bytes);
  if (!m || !cats || !bytes) {
    b->failed = 1;
  } else {
    int k = 0;
    size_t at = 0;
    for (const rank_t *rk = R->list; rk; rk = rk->next) {
      if (!rk->status || rk->state != RK_RUNNING) continue; /* a report of a running rank */
      const Fsdp__V1__RankStatus *st = rk->status;
      metrics_rank_t *x = &m[k++];
      snprintf(x->job, sizeof x->job, "%s", rk_job(rk));
      x->rank = (int)rk->a->rank, x->step = (double)st->step, x->loss = st->loss;
      x->unreported = (int)st->unreported;
      x->tokens_per_s = st->tokens_per_s, x->ncat = (int)st->n_memory;
      x->cat = &cats[at], x->cur = &bytes[2 * at], x->peak = &bytes[2 * at + st->n_memory];
      for (size_t i = 0; i < st->n_memory; i++) {
        cats[at + i] = st->memory[i]->name;
        bytes[2 * at + i] = st->memory[i]->current_bytes;
        bytes[2 * at + st->n_memory + i] = st->memory[i]->peak_bytes;
      }
      at += st->n_memory;
    }
    metrics_ranks_write(b, m, k);
  }
  free(m), free(cats), free(bytes);
}

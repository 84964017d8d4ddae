/* report: the rank's side of the report channel (see report.h). */
#include "daemon/train/report.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <unistr.h>

#include "daemon/common/err.h"
#include "daemon/common/frame.h"
#include "proto/fsdp.pb-c.h"

/* Why a shard was not written, as the rank reports it: at most this many
 * bytes (proto/fsdp.proto: ReportCheckpointShardRequest.failed). */
#define REPORT_FAILED_MAX 400

struct report {
  int fd; /* -1 once the reports stopped */
};

/* ---- the node's lease (proto: RankLease), on a thread of its own ---- */

/* The clock of the lease: fsdpd's (CLOCK_BOOTTIME, which counts a suspend). */
static uint64_t report_lease_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int report_lease_frame(void *arg, const uint8_t *data, size_t n) {
  uint64_t *until = arg;
  Fsdp__V1__RankLease *l = fsdp__v1__rank_lease__unpack(NULL, n, data);
  if (!l) return err_set(FSDP_EINVAL, "a frame of %zu bytes that is not a RankLease", n);
  *until = l->until_ns; /* each replaces the last: fsdpd sends them in order */
  fsdp__v1__rank_lease__free_unpacked(l, NULL);
  return FSDP_OK;
}

/* Every lease waiting on fd, into *until: 0, or -1 when the channel ended
 * (closed, or a frame that is not a lease). */
static int report_lease_drain(int fd, frame_reader_t *fr, uint64_t *until) {
  for (;;) {
    uint8_t b[4096];
    const ssize_t got = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (got <= 0) return -1; /* fsdpd closed the channel: it stops this rank itself if it must */
    if (frame_reader_feed(fr, b, (size_t)got, report_lease_frame, until)) {
      dprintf(2, "fsdp-train: a lease from fsdpd could not be read (%s); this rank no longer "
              "watches it\n", err_msg());
      return -1;
    }
  }
}

/* Reads the leases fsdpd sends until it closes the channel; ends the
 * process at once, wherever the run is, when the clock passes the latest:
 * no step, checkpoint or shard rename comes after (a temporary file may be
 * left; it is never taken for a shard). Everything waiting is read before
 * the clock is looked at, so a rank that was stopped a while (SIGSTOP, a
 * frozen cgroup) goes by the newest lease, not the oldest. A frame it
 * cannot read ends the watch, not the run: fsdpd still fences the ranks
 * it can. */
static void *report_lease_main(void *arg) {
  const int fd = (int)(intptr_t)arg;
  frame_reader_t fr;
  frame_reader_init(&fr, 256);
  uint64_t until = 0;
  while (!report_lease_drain(fd, &fr, &until)) {
    int wait_ms = -1;
    if (until) {
      const uint64_t now = report_lease_now();
      if (now >= until) {
        /* the output goes through fsdpd, which may be frozen with its pipe
         * full: the line is written if it fits, never waited for */
        fcntl(2, F_SETFL, fcntl(2, F_GETFL) | O_NONBLOCK);
        dprintf(2, "fsdp-train: the node's lease ended %.3f s ago: fsdpd has had no answer from "
                "the coordinator for the fence it gave (or is frozen), and the job runs elsewhere; "
                "this rank ends now, writing nothing\n", (double)(now - until) / 1e9);
        _exit(REPORT_EXIT_FENCED);
      }
      const uint64_t left = until - now;
      wait_ms = left / 1000000 >= INT32_MAX ? INT32_MAX : (int)(left / 1000000) + 1;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, wait_ms) < 0 && errno != EINTR) break;
  }
  frame_reader_free(&fr);
  close(fd);
  return NULL;
}

int report_open_from_env(report_t **out) {
  *out = NULL;
  const char *v = getenv("FSDP_REPORT_FD");
  if (!v || !*v) return FSDP_OK;
  char *end;
  long fd = strtol(v, &end, 10);
  if (*end || fd < 0 || fd > (1 << 20) || fcntl((int)fd, F_GETFD) < 0)
    return err_set(FSDP_EINVAL, "FSDP_REPORT_FD: \"%s\" is not an open descriptor; it is set by "
                   "fsdpd for the ranks it starts (unset it to run fsdp-train by hand)", v);
  /* the channel is a socket (send ignores SIGPIPE per call); a pipe given by
   * hand needs SIGPIPE ignored so a gone reader is an error, not our death */
  struct stat sb;
  if (fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0 || fstat((int)fd, &sb) ||
      (!S_ISSOCK(sb.st_mode) && signal(SIGPIPE, SIG_IGN) == SIG_ERR))
    return err_set(FSDP_EINVAL, "FSDP_REPORT_FD: cannot set up descriptor %ld", fd);
  /* A rank dies with the fsdpd that started it: a node daemon that crashed
   * leaves no rank running on a device nobody accounts for. */
  const char *node = getenv("FSDP_NODE_PID");
  if (node && *node) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if ((long)getppid() != atol(node))
      return err_set(FSDP_EPEER, "fsdpd (pid %s) that started this rank is gone; not training", node);
  }
  report_t *r = malloc(sizeof *r);
  if (!r) return err_set(FSDP_ENOMEM, "report channel: out of memory");
  r->fd = (int)fd;
  *out = r;
  /* the lease's reader has a descriptor of its own: the reports' may close */
  const int lfd = S_ISSOCK(sb.st_mode) ? fcntl((int)fd, F_DUPFD_CLOEXEC, 0) : -1;
  pthread_t th;
  pthread_attr_t at;
  if (lfd >= 0 && !pthread_attr_init(&at)) {
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, report_lease_main, (void *)(intptr_t)lfd)) {
      fprintf(stderr, "fsdp-train: no thread for the node's lease: this rank stops only when "
              "fsdpd stops it\n");
      close(lfd);
    }
    pthread_attr_destroy(&at);
  }
  return FSDP_OK;
}

/* Closes the channel both ways: the lease's reader (a descriptor of its
 * own on the same socket) sees its end and goes, and so the daemon sees
 * the channel's end now, not at the process's exit. */
static void report_shut(report_t *r) {
  if (r->fd < 0) return;
  shutdown(r->fd, SHUT_RDWR); /* a pipe given by hand: ENOTSOCK, nothing to do */
  close(r->fd);
  r->fd = -1;
}

/* One frame; a failure closes the channel (training goes on). */
static int report_send(report_t *r, int rank, const Fsdp__V1__RankReport *rep) {
  uint8_t buf[8192]; /* a status with every category is a few hundred bytes; a shard, its path */
  size_t n = fsdp__v1__rank_report__get_packed_size(rep);
  if (n > sizeof buf) return FSDP_OK; /* cannot happen with the fields above; skip rather than stop */
  fsdp__v1__rank_report__pack(rep, buf);
  if (frame_write(r->fd, buf, n)) {
    fprintf(stderr, "fsdp-train: rank %d: reports to the node daemon stopped (%s); training goes on\n",
            rank, err_msg());
    report_shut(r);
    return FSDP_EPEER;
  }
  return FSDP_OK;
}

void report_metrics(void *ctx, const train_metrics_t *m) {
  report_t *r = ctx;
  if (r->fd < 0) return;
  Fsdp__V1__MemoryCategory cats[MEM__COUNT], *pcats[MEM__COUNT];
  for (int i = 0; i < MEM__COUNT; i++) {
    fsdp__v1__memory_category__init(&cats[i]);
    cats[i].name = (char *)mem_cat_name((mem_cat_t)i);
    cats[i].current_bytes = m->mem_run.cur[i];
    cats[i].peak_bytes = m->mem_run.peak[i]; /* over the run, as RankStatus says */
    pcats[i] = &cats[i];
  }
  Fsdp__V1__RankStatus st = FSDP__V1__RANK_STATUS__INIT;
  st.rank = (uint32_t)m->rank;
  st.state = FSDP__V1__RANK_STATE__RANK_STATE_RUNNING;
  st.step = m->step;
  st.loss = m->loss;
  st.tokens_per_s = m->tokens_per_s;
  st.unreported = m->no_step;
  st.n_memory = MEM__COUNT;
  st.memory = pcats;
  Fsdp__V1__RankReport rep = FSDP__V1__RANK_REPORT__INIT;
  rep.kind_case = FSDP__V1__RANK_REPORT__KIND_STATUS;
  rep.status = &st;
  report_send(r, m->rank, &rep);
}

/* s cut to at most cap - 1 bytes and made one line of UTF-8: a byte that is
 * not part of valid UTF-8 (a sequence the cut split, a path's Latin-1)
 * becomes '?', a control character a space. protobuf's other runtimes
 * refuse a message whose strings are not UTF-8. */
static void report_text(char *dst, size_t cap, const char *s) {
  snprintf(dst, cap, "%s", s);
  const size_t n = strlen(dst);
  for (uint8_t *bad; (bad = (uint8_t *)u8_check((const uint8_t *)dst, n));) *bad = '?';
  for (char *p = dst; *p; p++)
    if ((unsigned char)*p < 0x20) *p = ' ';
}

int report_checkpoint(void *ctx, const train_ckpt_t *k) {
  report_t *r = ctx;
  char path[4200], sum[32], failed[REPORT_FAILED_MAX + 1] = "";
  if (k->failed) report_text(failed, sizeof failed, k->failed); /* it may be err_msg()'s text */
  if (r->fd < 0)
    return err_set(FSDP_EPEER, "checkpoint step %d: the report channel to fsdpd is closed; the "
                   "shard cannot be reported, so the checkpoint cannot be committed", k->step);
  Fsdp__V1__ReportCheckpointShardRequest sh = FSDP__V1__REPORT_CHECKPOINT_SHARD_REQUEST__INIT;
  sh.step = k->step;
  sh.rank = (uint32_t)k->rank;
  if (k->failed) { /* not written (or damaged): why, and no path, size or checksum */
    sh.failed = failed[0] ? failed : k->damaged ? "damaged" : "not written";
    sh.damaged = k->damaged != 0;
  } else {
    snprintf(path, sizeof path, "%s/%s", k->dir, k->shard->name);
    snprintf(sum, sizeof sum, "xxh64:%016" PRIx64, k->shard->sum);
    sh.path = path;
    sh.bytes = k->shard->bytes;
    sh.checksum = sum;
  }
  Fsdp__V1__RankReport rep = FSDP__V1__RANK_REPORT__INIT;
  rep.kind_case = FSDP__V1__RANK_REPORT__KIND_SHARD;
  rep.shard = &sh;
  return report_send(r, k->rank, &rep) ? err_set(FSDP_EPEER, "checkpoint step %d: reports to "
                                                 "fsdpd stopped", k->step) : FSDP_OK;
}

void report_close(report_t *r) {
  if (!r) return;
  report_shut(r);
  free(r);
}

/* logs: GetRankLogs (see logs.h). */
#include "daemon/node/logs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"
#include "daemon/common/ticket.h"
#include "daemon/node/workdir.h"

#define LOGS_BACKLOG 4 /* chunks queued ahead of a client before the stream waits */

struct logs {
  uv_loop_t *loop;
  const char *work_dir;
  const ranks_t *ranks;
  int streams;        /* open now: each holds its log's descriptor until closed */
  int streams_max;    /* FSDP_LOG_STREAMS_MAX */
  uint64_t stall_ms;  /* FSDP_STREAM_STALL_S */
  /* from the coordinator at the last registration: this node's id and its
   * log tickets' key (key_len 0: the coordinator issues none) */
  char node_id[64];
  uint8_t key[TICKET_KEY_BYTES];
  size_t key_len;
  int tickets; /* fsdpd sends the coordinator a token: it will give a key */
  int bad_key;  /* the coordinator gave a key of another length: refuse, never open */
  uint64_t key_gen; /* counts changes of the key (or of node_id under one): a
                     * stream opened under an older one ends */
};

typedef struct logs_stream {
  logs_t *L;
  rpc_call_t *call;
  uv_timer_t timer;
  int fd;
  int64_t off;
  uint64_t stalled_since; /* uv_now when its backlog last became full; 0: not full */
  int follow;
  /* opened at an offset from the end (--tail): its first tick says where
   * that is, with an empty chunk when nothing is there to send, so a
   * follower whose stream breaks resumes at that byte, not at the end
   * again (skipping what was written meanwhile) */
  int placed;
  uint64_t key_gen; /* L->key_gen when it opened */
  int64_t expiry;   /* its ticket's, seconds since the epoch; 0: opened without one */
  char job[WORKDIR_ID_MAX + 1];
  uint32_t attempt, rank;
} logs_stream_t;

static void logs_stream_closed(uv_handle_t *h) {
  logs_stream_t *st = h->data;
  if (st->fd >= 0) close(st->fd);
  st->L->streams--;
  free(st);
}

static void logs_stream_end(logs_stream_t *st, int rc) {
  if (st->call) rpc_call_finish(st->call, rc);
  st->call = NULL;
  uv_close((uv_handle_t *)&st->timer, logs_stream_closed);
}

/* A client that accepts nothing for stall_ms: ended now, not after what it
 * was sent (which it may never read), so its descriptor and slot are freed. */
static void logs_stream_stalled(logs_stream_t *st) {
  const logs_t *L = st->L;
  LOG_INFO("fsdpd", "job %s rank %" PRIu32 ": a log stream's client accepted nothing for %" PRIu64
           " s; ended", st->job, st->rank, L->stall_ms / 1000);
  rpc_call_abort(st->call, err_set(FSDP_ECANCELED, "fsdpd ended this log stream of job %s rank %"
                                   PRIu32 ": its client accepted nothing for %" PRIu64 " s "
                                   "(FSDP_STREAM_STALL_S); read it as it comes, or ask again",
                                   st->job, st->rank, L->stall_ms / 1000));
  st->call = NULL;
  uv_close((uv_handle_t *)&st->timer, logs_stream_closed);
}

static void logs_cancel_cb(rpc_call_t *call, void *arg) {
  logs_stream_t *st = arg;
  (void)call;
  st->call = NULL; /* freed as this returns */
  uv_close((uv_handle_t *)&st->timer, logs_stream_closed);
}

/* A stream lives no longer than what let it open: its ticket's expiry and
 * the node's key (a new one at each registration). Past either it ends
 * ABORTED, saying where to resume, which fsdpctl logs --follow does with a
 * fresh ticket; asked each tick, so it costs a time() and two compares. */
static int logs_stream_lapsed(logs_stream_t *st) {
  const logs_t *L = st->L;
  if (st->key_gen == L->key_gen && (!st->expiry || (int64_t)time(NULL) < st->expiry)) return 0;
  logs_stream_end(st, err_set(FSDP_ESTALE, "job %s rank %" PRIu32 ": the log stream ended, %s; "
                              "resume at byte %" PRId64 " with a fresh ticket from the "
                              "coordinator (fsdpctl logs --follow does)", st->job, st->rank,
                              st->key_gen != L->key_gen
                                  ? "this node registered again and has a new log ticket key"
                                  : "its log ticket expired", st->off));
  return 1;
}

/* Sends the chunk at st->off and moves past it; nonzero: the stream ended. */
static int logs_stream_send(logs_stream_t *st, uint8_t *data, size_t len) {
  Fsdp__V1__LogChunk c = FSDP__V1__LOG_CHUNK__INIT;
  c.offset = st->off;
  c.attempt = st->attempt;
  c.data.data = data;
  c.data.len = len;
  if (rpc_call_send(st->call, &c.base)) {
    logs_stream_end(st, FSDP_ENOMEM);
    return -1;
  }
  st->off += (int64_t)len;
  st->placed = 0;
  return 0;
}

/* Sends what the file holds beyond st->off, as far as the backlog allows. */
static void logs_tick_cb(uv_timer_t *t) {
  logs_stream_t *st = t->data;
  if (logs_stream_lapsed(st)) return;
  /* asked before reading: a rank that exited has written its last byte */
  int active = st->follow && ranks_log_active(st->L->ranks, st->job, st->attempt, st->rank);
  static uint8_t buf[LOGS_CHUNK]; /* the loop's thread only */
  for (;;) {
    if (rpc_call_backlog(st->call) >= LOGS_BACKLOG) { /* the next tick goes on */
      const uint64_t now = uv_now(st->L->loop);
      if (!st->stalled_since) st->stalled_since = now;
      else if (now - st->stalled_since >= st->L->stall_ms) logs_stream_stalled(st);
      return;
    }
    st->stalled_since = 0;
    ssize_t n = pread(st->fd, buf, sizeof buf, st->off);
    if (n < 0) {
      logs_stream_end(st, err_set_errno(FSDP_EIO, errno, "job %s rank %" PRIu32 ": reading its log",
                                        st->job, st->rank));
      return;
    }
    if (n == 0) break;
    if (logs_stream_send(st, buf, (size_t)n)) return;
  }
  if (st->placed && logs_stream_send(st, NULL, 0)) return;
  if (!active) logs_stream_end(st, 0); /* everything is sent */
}

void logs_expect_tickets(logs_t *L) { L->tickets = 1; }

void logs_set_identity(logs_t *L, const char *node_id, const uint8_t *key, size_t key_len) {
  const size_t len = key_len == TICKET_KEY_BYTES ? key_len : 0;
  /* a ticket names the key and the node: either changed, the old ones fail */
  if (len != L->key_len || (len && (memcmp(L->key, key, len) ||
                                    strncmp(L->node_id, node_id, sizeof L->node_id))))
    L->key_gen++;
  snprintf(L->node_id, sizeof L->node_id, "%s", node_id);
  L->bad_key = key_len && key_len != TICKET_KEY_BYTES;
  L->key_len = len;
  if (L->key_len) memcpy(L->key, key, key_len);
  if (L->bad_key)
    LOG_ERROR("fsdpd", "the coordinator gave a log ticket key of %zu bytes, not %d (another "
              "version?): rank logs are refused until it gives a good one", key_len,
              TICKET_KEY_BYTES);
}

/* Who may read: where the coordinator issues log tickets, the holder of one
 * for this rank here (never a user token: a node must not hold one); else
 * the user token, when fsdpd was given one (--user-token-file). */
static int logs_allowed(const logs_t *L, rpc_call_t *call, const Fsdp__V1__GetRankLogsRequest *req) {
  if (L->key_len)
    return *req->ticket ? ticket_check(req->ticket, L->key, L->key_len, req->job_id, req->rank,
                                       L->node_id, (int64_t)time(NULL))
                        : err_set(FSDP_EAUTH, "GetRankLogs: no log ticket: this node takes one "
                                  "from the coordinator's GetLogTicket (fsdpctl logs asks for it), "
                                  "never a user token");
  if (L->bad_key)
    return err_set(FSDP_EUNAVAILABLE, "GetRankLogs: the coordinator gave this node a log ticket "
                   "key it cannot use (another version?); its log says so");
  if (L->tickets && !*L->node_id)
    return err_set(FSDP_EUNAVAILABLE, "GetRankLogs: this node is not registered with the "
                   "coordinator yet, so it cannot check a log ticket; try again shortly");
  return rpc_call_auth(call, RPC_ROLE_USER); /* registered, and the coordinator issues none */
}

static void logs_get_rank_logs(rpc_call_t *call, const ProtobufCMessage *m, void *arg) {
  logs_t *L = arg;
  const Fsdp__V1__GetRankLogsRequest *req = (const void *)m;
  /* each stream holds a descriptor: without a cap, clients could take
   * every one fsdpd may open, and its next rank could not listen */
  int rc = logs_allowed(L, call, req);
  if (rc) {
    rpc_call_finish(call, rc);
    return;
  }
  rc = L->streams >= L->streams_max
               ? err_set(FSDP_ELIMIT, "fsdpd serves at most %d log streams at once and %d are "
                         "open; end one (a `fsdpctl logs --follow` left running?) or try again "
                         "later (the node's operator sets FSDP_LOG_STREAMS_MAX)", L->streams_max,
                         L->streams)
               : workdir_id_check("job_id", req->job_id);
  uint32_t attempt = req->attempt;
  if (!rc && !attempt) rc = workdir_latest_attempt(L->work_dir, req->job_id, &attempt);
  char dir[PATH_MAX], path[PATH_MAX + 32];
  if (!rc) rc = workdir_attempt_dir(L->work_dir, req->job_id, attempt, dir, sizeof dir);
  int fd = -1;
  if (!rc) {
    snprintf(path, sizeof path, "%s/rank-%" PRIu32 ".log", dir, req->rank);
    /* the attempt directory is the ranks' user's: the log may have been
     * replaced by a FIFO, which must not hold the loop in open() */
    rc = file_open_regular(path, O_RDONLY, 0, &fd);
    if (rc == FSDP_EFORMAT)
      rc = err_set(FSDP_ESTATE, "job %s attempt %" PRIu32 " rank %" PRIu32 ": its log %s is not a "
                   "regular file (a FIFO, a directory or a device put there by the rank's user); "
                   "it is not read: remove it", req->job_id, attempt, req->rank, path);
    else if (rc)
      rc = err_wrap(rc == FSDP_ENOENT ? FSDP_ENOTFOUND : rc,
                    "job %s attempt %" PRIu32 " rank %" PRIu32 " has no log on this node (fsdpctl "
                    "status names the node of each rank)", req->job_id, attempt, req->rank);
  }
  logs_stream_t *st = rc ? NULL : calloc(1, sizeof *st);
  if (!rc && !st) rc = err_set(FSDP_ENOMEM, "fsdpd: out of memory for a log stream");
  if (rc) {
    if (fd >= 0) close(fd);
    rpc_call_finish(call, rc);
    return;
  }
  struct stat sb;
  int64_t size = fstat(fd, &sb) ? 0 : (int64_t)sb.st_size;
  *st = (logs_stream_t){.L = L, .call = call, .fd = fd, .follow = req->follow, .attempt = attempt,
                        .rank = req->rank, .key_gen = L->key_gen,
                        .expiry = L->key_len ? ticket_expiry(req->ticket) : 0};
  snprintf(st->job, sizeof st->job, "%s", req->job_id);
  st->off = req->offset >= 0 ? (req->offset < size ? req->offset : size)
                             : (size + req->offset > 0 ? size + req->offset : 0);
  st->placed = req->offset < 0 || req->offset > size;
  uv_timer_init(L->loop, &st->timer);
  st->timer.data = st;
  L->streams++;
  uv_timer_start(&st->timer, logs_tick_cb, 0, LOGS_TICK_MS);
  rpc_call_on_cancel(call, logs_cancel_cb, st);
}

int logs_create(logs_t **out, uv_loop_t *loop, const char *work_dir, const ranks_t *ranks) {
  logs_t *L = calloc(1, sizeof *L);
  if (!L) return err_set(FSDP_ENOMEM, "fsdpd: out of memory for the Node service");
  const int64_t max = param_log_streams_max(), stall = param_stream_stall_s();
  *L = (logs_t){.loop = loop, .work_dir = work_dir, .ranks = ranks,
                .streams_max = max < 1 ? 1 : max > 1 << 20 ? 1 << 20 : (int)max,
                .stall_ms = (uint64_t)(stall < 1 ? 1 : stall > 86400 ? 86400 : stall) * 1000};
  *out = L;
  return FSDP_OK;
}

int logs_register(logs_t *L, rpc_server_t *srv) {
  const rpc_method_t m = {.path = "/fsdp.v1.Node/GetRankLogs",
                          .request = &fsdp__v1__get_rank_logs_request__descriptor,
                          .reply = &fsdp__v1__log_chunk__descriptor,
                          .server_streaming = 1,
                          .roles = 0, /* logs_allowed checks the caller */
                          .handler = logs_get_rank_logs,
                          .arg = L};
  return rpc_server_add(srv, &m);
}

void logs_destroy(logs_t *L) {
  if (L) FSDP_ASSERT(L->streams == 0); /* rpc_server_destroy ended them, the loop closed them */
  free(L);
}

/* rpc_client: blocking client calls over one channel (see rpc.h).
 *
 * Each call has its own pluck completion queue, so calls from several
 * threads never see each other's completions and no thread of ours runs in
 * the background. A call's deadline bounds every wait: a batch holding
 * RECV_STATUS_ON_CLIENT completes by then at the latest (gRPC's promise);
 * the pluck waits a little longer and cancels the call if even that passes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"
#include "rpc_impl.h"

#define RPC_PLUCK_SLACK_S 5.0 /* past the deadline before a pluck gives up on gRPC */

struct rpc_client {
  grpc_channel *ch;
  grpc_channel_credentials *creds; /* ch's, kept to make it again (rpc_client_reconnect) */
  int keepalive_s, recv_window;   /* ch's options, the same */
  char *target;
  int has_auth;
  int tls;
  /* The token, read again when its file changes (a kubelet renews a
   * projected service account token): mu guards auth, the file's identity
   * when read, and the retired values, which calls in flight on other
   * threads may still send and which live until the client goes. */
  pthread_mutex_t mu;
  char *token_file;
  grpc_metadata auth; /* authorization: Bearer <token> */
  struct stat token_st;
  grpc_slice *retired;
  int n_retired, warned;
};

struct rpc_stream {
  rpc_client_t *c;
  grpc_call *call;
  grpc_completion_queue *cq;
  char *method;
  double timeout_s;
  gpr_timespec deadline;
  /* written by gRPC until the status batch completes */
  grpc_metadata_array md_in, trailing;
  grpc_status_code status;
  grpc_slice details;
  const char *error_string;
  grpc_byte_buffer *msg;
  int md_received; /* RECV_INITIAL_METADATA was asked for */
  int ended;   /* the status batch was plucked */
  int rc;      /* after the end: 0 or the error */
  char *err;   /* the error's message, replayed on every later next */
  double idle_s; /* the most a next waits for its message (0: up to the deadline) */
  int idled;     /* a next waited that long: the call was cancelled for it */
  int own_deadline; /* it ended for its deadline or idle limit (rpc_client_deadline_passed) */
};

static void rpc_client_free(rpc_client_t *c);

/* The token file as "Bearer <token>" in *value, its identity in c->token_st. */
static int rpc_client_token_read(rpc_client_t *c, grpc_slice *value) {
  struct stat st;
  if (stat(c->token_file, &st)) memset(&st, 0, sizeof st);
  char *token = NULL;
  int rc = rpc__read_token(c->token_file, &token);
  if (rc) return rc;
  size_t n = strlen(token);
  char *v = malloc(n + 8);
  if (v) {
    memcpy(v, "Bearer ", 7);
    memcpy(v + 7, token, n + 1);
    *value = grpc_slice_from_copied_buffer(v, n + 7);
    c->token_st = st;
  }
  rpc__free_secret(v);
  rpc__free_secret(token);
  return v ? 0 : err_set(FSDP_ENOMEM, "rpc client: out of memory");
}

/* The token to send now: read again when its file is another (renamed over,
 * as the kubelet's atomic writer does) or was written since. A file that no
 * longer reads keeps the token in use, with one warning. */
static grpc_metadata rpc_client_auth(rpc_client_t *c) {
  pthread_mutex_lock(&c->mu);
  struct stat st;
  if (!stat(c->token_file, &st) &&
      (st.st_ino != c->token_st.st_ino || st.st_dev != c->token_st.st_dev ||
       st.st_size != c->token_st.st_size || st.st_mtim.tv_sec != c->token_st.st_mtim.tv_sec ||
       st.st_mtim.tv_nsec != c->token_st.st_mtim.tv_nsec ||
       st.st_ctim.tv_sec != c->token_st.st_ctim.tv_sec ||
       st.st_ctim.tv_nsec != c->token_st.st_ctim.tv_nsec)) { /* ctime: a chmod made it readable */
    grpc_slice fresh;
    grpc_slice *grown = realloc(c->retired, (size_t)(c->n_retired + 1) * sizeof *grown);
    if (grown) c->retired = grown;
    if (!grown || rpc_client_token_read(c, &fresh)) {
      if (!c->warned) LOG_WARN("rpc", "token file %s changed but %s; sending the token read "
                               "before", c->token_file, grown ? err_msg() : "out of memory");
      c->warned = 1;
      c->token_st = st; /* not again until it changes again */
    } else if (grpc_slice_eq(fresh, c->auth.value)) { /* touched, not renewed */
      grpc_slice_unref(fresh);
      c->warned = 0;
    } else {
      c->retired[c->n_retired++] = c->auth.value;
      c->auth.value = fresh;
      c->warned = 0;
    }
  }
  grpc_metadata md = c->auth;
  pthread_mutex_unlock(&c->mu);
  return md;
}

/* A channel to c->target with c's credentials and options (NULL: none
 * could be made). own_pool: with subchannels of its own, never those of
 * another channel to the target (gRPC shares them process-wide, with their
 * backoff). */
static grpc_channel *rpc_client_channel(rpc_client_t *c, int own_pool) {
  if (!c->creds) return NULL;
  /* While a call is open the client pings the server every
   * FSDP_RPC_KEEPALIVE_S (30 s) and gives up on it when a ping goes
   * unanswered as long: a coordinator that stopped answering (frozen, its
   * host gone, the network cut) ends a watch or a log stream with
   * UNAVAILABLE instead of leaving it waiting forever. Pings go on while no
   * data flows (a quiet watch): gRPC's default stops after two. The ack is
   * read while the caller waits in a call (this gRPC's transport is driven
   * by polling), so a caller that does not come back to its stream for
   * that long (a `fsdpctl logs -f | less` paused) loses it too. */
  const int ka = c->keepalive_s;
  /* A fixed receive window (no BDP probing) bounds what a server can
   * have sent toward a stream the caller is not reading. */
  /* A server gone is tried again at least every second (gRPC's reconnect
   * backoff, 1 s growing 1.6 times a try, stops at 2 min, and every call
   * made meanwhile fails without trying): a coordinator back from a
   * restart is found by the calls on a channel that stays (fsdpd's ranks'
   * reports, rendezvous and exits) within a second of its return, not
   * seconds later (with rpc_client_env: gRPC's timers must fire). One
   * connect a second to a server that is down costs nothing worth the
   * wait. */
  grpc_arg args[7] = {
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = ka * 1000},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = ka * 1000},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, .value.integer = 0},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
       .value.integer = RPC_RECONNECT_MAX_MS},
  };
  size_t n = 4;
  if (own_pool)
    args[n++] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                           .value.integer = 1};
  if (c->recv_window > 0) {
    args[n++] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0};
    args[n++] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                           .value.integer = c->recv_window};
  }
  grpc_channel_args ch_args = {n, args};
  return grpc_channel_create(c->target, c->creds, &ch_args);
}

void rpc_client_env(void) { setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "500", 0); }

/* One host:port, [v6]:port or bare name or address of a target (len bytes). */
static int rpc_target_port_check(const char *target, const char *hp, size_t len) {
  const char *port = NULL, *end = hp + len;
  if (len && hp[0] == '[') {
    const char *rb = memchr(hp, ']', len);
    if (rb && rb + 1 < end && rb[1] == ':') port = rb + 2;
  } else {
    const char *colon = memchr(hp, ':', len);
    /* more than one colon: an IPv6 address without brackets, no port */
    if (colon && !memchr(colon + 1, ':', (size_t)(end - colon - 1))) port = colon + 1;
  }
  if (!port || port == end) return 0;
  unsigned long v = 0;
  for (const char *p = port; p < end; p++) {
    if (*p < '0' || *p > '9') return 0; /* a service name: the resolver's */
    if (v <= 65535) v = v * 10 + (unsigned long)(*p - '0');
  }
  if (v >= 1 && v <= 65535) return 0;
  return err_set(FSDP_EINVAL, "%s: port %.*s is out of range: a port is from 1 to 65535", target,
                 (int)(end - port), port);
}

int rpc_target_check(const char *target) {
  if (!target || !*target) return err_set(FSDP_EINVAL, "rpc client: no server address");
  if (!strncmp(target, "unix:", 5) || !strncmp(target, "unix-abstract:", 14)) return 0;
  const char *t = target;
  int list = 0; /* ipv4:a:p,b:p */
  if (!strncmp(t, "dns:", 4)) {
    t += 4;
    if (!strncmp(t, "//", 2)) { /* dns://[authority]/host:port */
      const char *slash = strchr(t + 2, '/');
      t = slash ? slash + 1 : t + 2;
    }
  } else if (!strncmp(t, "ipv4:", 5) || !strncmp(t, "ipv6:", 5)) {
    t += 5, list = 1;
  }
  for (;;) {
    const char *comma = list ? strchr(t, ',') : NULL;
    const size_t len = comma ? (size_t)(comma - t) : strlen(t);
    int rc = rpc_target_port_check(target, t, len);
    if (rc || !comma) return rc;
    t = comma + 1;
  }
}

int rpc_client_check(const rpc_client_opts_t *o) {
  int rc = rpc_target_check(o->target);
  if (rc) return rc;
  char *text = NULL;
  rc = o->token_file ? rpc__read_token(o->token_file, &text) : 0;
  rpc__free_secret(text);
  text = NULL;
  if (!rc && o->tls_ca_file) rc = rpc__read_file(o->tls_ca_file, "TLS CA file", RPC_PEM_MAX, &text, NULL);
  free(text);
  return rc;
}

int rpc_client_create(rpc_client_t **out, const rpc_client_opts_t *o) {
  *out = NULL;
  if (rpc_target_check(o->target)) return FSDP_EINVAL;
  rpc_client_t *c = calloc(1, sizeof *c);
  if (!c || !(c->target = strdup(o->target))) {
    free(c);
    return err_set(FSDP_ENOMEM, "rpc client: out of memory");
  }
  char *token = NULL, *ca = NULL;
  int rc = 0;
  pthread_mutex_init(&c->mu, NULL);
  if (o->token_file) {
    if (!(c->token_file = strdup(o->token_file))) {
      rc = err_set(FSDP_ENOMEM, "rpc client: out of memory");
      goto fail;
    }
    if ((rc = rpc_client_token_read(c, &c->auth.value))) goto fail;
    c->auth.key = grpc_slice_from_static_string("authorization");
    c->has_auth = 1;
  }
  if (o->tls_ca_file &&
      (rc = rpc__read_file(o->tls_ca_file, "TLS CA file", RPC_PEM_MAX, &ca, NULL)))
    goto fail;
  rpc__init();
  c->creds = ca ? grpc_ssl_credentials_create(ca, NULL, NULL, NULL) : grpc_insecure_credentials_create();
  c->tls = ca != NULL;
  const int64_t want = o->keepalive_s > 0 ? o->keepalive_s : param_rpc_keepalive_s();
  c->keepalive_s = want < 1 ? 1 : want > 3600 ? 3600 : (int)want;
  c->recv_window = o->recv_window;
  c->ch = rpc_client_channel(c, 0);
  if (!c->ch) {
    if (c->creds) grpc_channel_credentials_release(c->creds);
    c->creds = NULL;
    grpc_shutdown();
    rc = err_set(FSDP_EINVAL, "rpc client: cannot make a channel to %s%s", c->target,
                 ca ? " (is the CA file PEM?)" : "");
    goto fail;
  }
  rpc__free_secret(token);
  free(ca);
  *out = c;
  return 0;
fail:
  rpc__free_secret(token);
  free(ca);
  rpc_client_free(c);
  return rc;
}

/* What create made, but the channel. */
static void rpc_client_free(rpc_client_t *c) {
  if (c->has_auth) grpc_slice_unref(c->auth.value);
  for (int i = 0; i < c->n_retired; i++) grpc_slice_unref(c->retired[i]);
  free(c->retired);
  free(c->token_file);
  pthread_mutex_destroy(&c->mu);
  free(c->target);
  free(c);
}

void rpc_client_destroy(rpc_client_t *c) {
  if (!c) return;
  grpc_channel_destroy(c->ch);
  grpc_channel_credentials_release(c->creds);
  rpc_client_free(c);
  grpc_shutdown();
}

int rpc_client_reconnect(rpc_client_t *c) {
  if (!c) return 0;
  grpc_channel *ch = rpc_client_channel(c, 1);
  if (!ch) return err_set(FSDP_EINTERNAL, "rpc client: cannot make a channel to %s again", c->target);
  grpc_channel_destroy(c->ch);
  c->ch = ch;
  return 0;
}

/* Waits for tag; if gRPC has not completed it well past the deadline,
 * cancels the call (which completes everything pending) and waits again. */
static int rpc_pluck(grpc_completion_queue *cq, grpc_call *call, void *tag, gpr_timespec deadline) {
  gpr_timespec limit = gpr_time_add(deadline, gpr_time_from_micros(
                                                  (int64_t)(RPC_PLUCK_SLACK_S * 1e6), GPR_TIMESPAN));
  grpc_event ev = grpc_completion_queue_pluck(cq, tag, limit, NULL);
  if (ev.type == GRPC_QUEUE_TIMEOUT) {
    grpc_call_cancel(call, NULL);
    ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  }
  return ev.type == GRPC_OP_COMPLETE ? ev.success : 0;
}

static void rpc_cq_destroy(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  grpc_completion_queue_destroy(cq);
}

/* What a user can do about a status, after the server's own words. */
static const char *rpc_advice(grpc_status_code st, int tls) {
  switch (st) {
  case GRPC_STATUS_UNAVAILABLE:
    return tls ? "; check that the server runs at that address and is reachable, that its "
                 "certificate is signed by the CA file given and names that host"
               : "; check that the server runs at that address and is reachable";
  case GRPC_STATUS_DEADLINE_EXCEEDED:
    return "; the server may be overloaded, stalled or unreachable";
  /* none for UNAUTHENTICATED: the server's words name the token file, and a
   * program adds its own option for it (fsdpctl --token-file) */
  default: return "";
  }
}

/* Whether this thread's last DEADLINE_EXCEEDED was the call's own deadline
 * (or a stream's idle limit) passing, not the server's status. */
static __thread int rpc_own_deadline;
int rpc_client_deadline_passed(void) { return rpc_own_deadline; }

/* Maps a call's final status to err.h with a sentence naming the call.
 * DEADLINE_EXCEEDED is the call's own deadline passing (gRPC's words,
 * "Deadline Exceeded", add nothing: "no answer within N s") unless the
 * server sent it with words of its own, or before the deadline (a server
 * that gave up on its database's lock): then its words, as any status's. */
static int rpc_status_err(rpc_client_t *c, const char *method, grpc_status_code st,
                          grpc_slice details, const char *error_string, double timeout_s,
                          gpr_timespec deadline) {
  if (st == GRPC_STATUS_OK) return 0;
  int n = (int)GRPC_SLICE_LENGTH(details);
  const char *d = (const char *)GRPC_SLICE_START_PTR(details);
  const int server_words = n && !(n == 17 && !memcmp(d, "Deadline Exceeded", 17));
  if (!n && error_string) d = error_string, n = (int)strlen(error_string);
  rpc_own_deadline = st == GRPC_STATUS_DEADLINE_EXCEEDED && !server_words &&
                     gpr_time_cmp(gpr_now(deadline.clock_type), deadline) >= 0;
  if (rpc_own_deadline)
    return err_set(FSDP_ETIMEDOUT, "%s at %s: DEADLINE_EXCEEDED: no answer within %g s%s", method,
                   c->target, timeout_s, rpc_advice(st, c->tls));
  if (st == GRPC_STATUS_DEADLINE_EXCEEDED) /* the server's: it answered, it is reachable */
    return err_set(FSDP_ETIMEDOUT, "%s at %s: DEADLINE_EXCEEDED: %.*s", method, c->target, n, d);
  return err_set(rpc_err_from_status(st), "%s at %s: %s: %.*s%s", method, c->target,
                 rpc_status_name(st), n, d, rpc_advice(st, c->tls));
}

static grpc_call *rpc_new_call(rpc_client_t *c, grpc_completion_queue *cq, const char *method,
                               gpr_timespec deadline) {
  grpc_slice m = grpc_slice_from_copied_string(method);
  grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                             deadline, NULL);
  grpc_slice_unref(m);
  return call;
}

/* The ops that open a call: the token (into *md, which must outlive the
 * batch's start), the request, the half-close. */
static size_t rpc_send_ops(rpc_client_t *c, grpc_op *ops, grpc_byte_buffer *bb, grpc_metadata *md) {
  memset(ops, 0, 3 * sizeof *ops);
  if (c->has_auth) *md = rpc_client_auth(c);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = c->has_auth;
  ops[0].data.send_initial_metadata.metadata = c->has_auth ? md : NULL;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  return 3;
}

int rpc_client_call_raw(rpc_client_t *c, const char *method, const void *req, size_t req_len,
                        void **reply, size_t *reply_len, double timeout_s) {
  *reply = NULL;
  *reply_len = 0;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  gpr_timespec deadline = rpc__deadline(timeout_s);
  grpc_call *call = rpc_new_call(c, cq, method, deadline);
  grpc_slice s = grpc_slice_from_copied_buffer(req, req_len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_metadata_array md_in, trailing;
  grpc_metadata_array_init(&md_in);
  grpc_metadata_array_init(&trailing);
  grpc_byte_buffer *resp = NULL;
  grpc_status_code st = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  const char *error_string = NULL;
  grpc_op ops[6];
  grpc_metadata auth;
  size_t n = rpc_send_ops(c, ops, bb, &auth);
  memset(ops + n, 0, 3 * sizeof *ops);
  ops[n++].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n - 1].data.recv_initial_metadata.recv_initial_metadata = &md_in;
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &resp;
  ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[n].data.recv_status_on_client.trailing_metadata = &trailing;
  ops[n].data.recv_status_on_client.status = &st;
  ops[n].data.recv_status_on_client.status_details = &details;
  ops[n++].data.recv_status_on_client.error_string = &error_string;
  int rc = 0;
  grpc_call_error e = grpc_call_start_batch(call, ops, n, (void *)1, NULL);
  if (e != GRPC_CALL_OK) {
    rc = err_set(FSDP_EINTERNAL, "%s at %s: gRPC refused the call (grpc_call_error %d)", method,
                 c->target, (int)e);
  } else {
    rpc_pluck(cq, call, (void *)1, deadline);
    rc = rpc_status_err(c, method, st, details, error_string, timeout_s, deadline);
    if (!rc && !resp)
      rc = err_set(FSDP_EINTERNAL, "%s at %s: the server answered OK without a reply message",
                   method, c->target);
    if (!rc) {
      grpc_slice flat = rpc__flatten(resp);
      size_t len = GRPC_SLICE_LENGTH(flat);
      if (len && !(*reply = malloc(len))) {
        rc = err_set(FSDP_ENOMEM, "%s: out of memory for a %zu-byte reply", method, len);
      } else {
        if (len) memcpy(*reply, GRPC_SLICE_START_PTR(flat), len);
        *reply_len = len;
      }
      grpc_slice_unref(flat);
    }
  }
  if (resp) grpc_byte_buffer_destroy(resp);
  grpc_byte_buffer_destroy(bb);
  grpc_slice_unref(details);
  if (error_string) gpr_free((void *)error_string);
  grpc_metadata_array_destroy(&md_in);
  grpc_metadata_array_destroy(&trailing);
  grpc_call_unref(call);
  rpc_cq_destroy(cq);
  return rc;
}

int rpc_client_call(rpc_client_t *c, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply,
                    double timeout_s) {
  *reply = NULL;
  size_t n = protobuf_c_message_get_packed_size(req);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return err_set(FSDP_ENOMEM, "%s: out of memory for the request", method);
  protobuf_c_message_pack(req, buf);
  void *rep;
  size_t rep_len;
  int rc = rpc_client_call_raw(c, method, buf, n, &rep, &rep_len, timeout_s);
  free(buf);
  if (rc) return rc;
  *reply = protobuf_c_message_unpack(reply_desc, NULL, rep_len, rep);
  free(rep);
  if (!*reply)
    return err_set(FSDP_EFORMAT, "%s at %s: the reply does not decode as %s; are client and "
                   "server built from the same proto/fsdp.proto?", method, c->target,
                   reply_desc->name);
  return 0;
}

/* ---- server streaming --------------------------------------------------------------- */

static int rpc_stream_end(rpc_stream_t *st);

#define RPC_TAG_SENT ((void *)1)
#define RPC_TAG_STATUS ((void *)2)
#define RPC_TAG_MSG ((void *)3)

int rpc_stream_open(rpc_client_t *c, rpc_stream_t **out, const char *method,
                    const ProtobufCMessage *req, double timeout_s) {
  return rpc_stream_open_idle(c, out, method, req, timeout_s, 0);
}

int rpc_stream_open_idle(rpc_client_t *c, rpc_stream_t **out, const char *method,
                         const ProtobufCMessage *req, double timeout_s, double idle_s) {
  *out = NULL;
  rpc_stream_t *st = calloc(1, sizeof *st);
  if (!st || !(st->method = strdup(method))) {
    free(st);
    return err_set(FSDP_ENOMEM, "%s: out of memory", method);
  }
  st->c = c;
  st->timeout_s = timeout_s;
  st->deadline = rpc__deadline(timeout_s);
  st->cq = grpc_completion_queue_create_for_pluck(NULL);
  st->call = rpc_new_call(c, st->cq, method, st->deadline);
  grpc_metadata_array_init(&st->md_in);
  grpc_metadata_array_init(&st->trailing);
  st->details = grpc_empty_slice();
  grpc_byte_buffer *bb = rpc__pack(req);
  grpc_op ops[3];
  grpc_metadata auth;
  size_t n = rpc_send_ops(c, ops, bb, &auth);
  grpc_call_error e1 = grpc_call_start_batch(st->call, ops, n, RPC_TAG_SENT, NULL);
  /* the status in a batch of its own: it completes last, after every message */
  grpc_op sop;
  memset(&sop, 0, sizeof sop);
  sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  sop.data.recv_status_on_client.trailing_metadata = &st->trailing;
  sop.data.recv_status_on_client.status = &st->status;
  sop.data.recv_status_on_client.status_details = &st->details;
  sop.data.recv_status_on_client.error_string = &st->error_string;
  grpc_call_error e2 = e1 == GRPC_CALL_OK ? grpc_call_start_batch(st->call, &sop, 1, RPC_TAG_STATUS, NULL)
                                          : e1;
  int rc = 0;
  rpc_stream_set_idle(st, idle_s);
  if (e1 == GRPC_CALL_OK && e2 == GRPC_CALL_OK && st->idle_s > 0 &&
      gpr_time_cmp(rpc__deadline(st->idle_s), st->deadline) < 0) {
    /* sent within idle_s, or the call is given up (the cancel completes the batch) */
    gpr_timespec until = rpc__deadline(st->idle_s);
    if (grpc_completion_queue_pluck(st->cq, RPC_TAG_SENT, until, NULL).type == GRPC_QUEUE_TIMEOUT) {
      st->idled = 1;
      grpc_call_cancel(st->call, NULL);
      rpc_pluck(st->cq, st->call, RPC_TAG_SENT, st->deadline);
    }
  } else if (e1 == GRPC_CALL_OK) {
    rpc_pluck(st->cq, st->call, RPC_TAG_SENT, st->deadline);
  }
  grpc_byte_buffer_destroy(bb);
  if (st->idled) {
    rc = rpc_stream_end(st);
    rpc_stream_close(st);
    return rc;
  }
  if (e2 != GRPC_CALL_OK) {
    rc = err_set(FSDP_EINTERNAL, "%s at %s: gRPC refused the call (grpc_call_error %d)", method,
                 c->target, (int)e2);
    if (e1 == GRPC_CALL_OK) grpc_call_cancel(st->call, NULL);
    st->ended = 1; /* no status batch to wait for */
    rpc_stream_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

/* The status, once: maps it and keeps the message for later calls. */
static int rpc_stream_end(rpc_stream_t *st) {
  if (!st->ended) {
    rpc_pluck(st->cq, st->call, RPC_TAG_STATUS, st->deadline);
    st->ended = 1;
    st->rc = st->idled ? err_set(FSDP_ETIMEDOUT, "%s at %s: no message for %g s%s", st->method,
                                 st->c->target, st->idle_s,
                                 rpc_advice(GRPC_STATUS_DEADLINE_EXCEEDED, st->c->tls))
                       : rpc_status_err(st->c, st->method, st->status, st->details,
                                        st->error_string, st->timeout_s, st->deadline);
    st->own_deadline = st->idled || rpc_own_deadline;
    if (st->rc) st->err = strdup(err_msg());
  }
  if (st->rc) err_set(st->rc, "%s", st->err ? st->err : err_str(st->rc));
  rpc_own_deadline = st->own_deadline;
  return st->rc;
}

int rpc_stream_next(rpc_stream_t *st, const ProtobufCMessageDescriptor *desc,
                    ProtobufCMessage **msg) {
  *msg = NULL;
  if (st->ended) return rpc_stream_end(st);
  grpc_op ops[2];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!st->md_received) { /* with the first message, so that open does not wait for it */
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &st->md_in;
    st->md_received = 1;
  }
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &st->msg;
  st->msg = NULL;
  if (grpc_call_start_batch(st->call, ops, n, RPC_TAG_MSG, NULL) != GRPC_CALL_OK)
    return rpc_stream_end(st);
  int plucked = 0;
  if (st->idle_s > 0) { /* the message within idle_s, or the call is given up */
    gpr_timespec until = rpc__deadline(st->idle_s);
    if (gpr_time_cmp(until, st->deadline) < 0) {
      plucked = grpc_completion_queue_pluck(st->cq, RPC_TAG_MSG, until, NULL).type != GRPC_QUEUE_TIMEOUT;
      if (!plucked) {
        st->idled = 1;
        grpc_call_cancel(st->call, NULL); /* completes the batch */
      }
    }
  }
  if (!plucked) rpc_pluck(st->cq, st->call, RPC_TAG_MSG, st->deadline);
  if (st->idled && st->msg) { /* came as it was given up: the stream is over all the same */
    grpc_byte_buffer_destroy(st->msg);
    st->msg = NULL;
  }
  if (!st->msg) return rpc_stream_end(st); /* no more messages: the status says why */
  grpc_slice flat = rpc__flatten(st->msg);
  grpc_byte_buffer_destroy(st->msg);
  st->msg = NULL;
  *msg = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(flat), GRPC_SLICE_START_PTR(flat));
  grpc_slice_unref(flat);
  if (!*msg) {
    grpc_call_cancel(st->call, NULL);
    rpc_stream_end(st);
    st->rc = err_set(FSDP_EFORMAT, "%s at %s: a streamed message does not decode as %s; are "
                     "client and server built from the same proto/fsdp.proto?", st->method,
                     st->c->target, desc->name);
    free(st->err);
    st->err = strdup(err_msg());
    return st->rc;
  }
  return 1;
}

void rpc_stream_set_idle(rpc_stream_t *st, double idle_s) { st->idle_s = idle_s > 0 ? idle_s : 0; }

void rpc_stream_close(rpc_stream_t *st) {
  if (!st) return;
  if (!st->ended) {
    grpc_call_cancel(st->call, NULL);
    rpc_pluck(st->cq, st->call, RPC_TAG_STATUS, st->deadline);
  }
  grpc_metadata_array_destroy(&st->md_in);
  grpc_metadata_array_destroy(&st->trailing);
  grpc_slice_unref(st->details);
  if (st->error_string) gpr_free((void *)st->error_string);
  grpc_call_unref(st->call);
  rpc_cq_destroy(st->cq);
  free(st->method);
  free(st->err);
  free(st);
}

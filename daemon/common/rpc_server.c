/* rpc_server: a gRPC server whose completion queue feeds a libuv loop (see
 * rpc.h for the contract).
 *
 * Threads: the queue thread only moves (tag, ok) pairs from
 * grpc_completion_queue_next into s->q, every completion already there at
 * once, and wakes the loop (uv_async_send, which coalesces: each wake-up
 * drains the whole queue). Every other line here runs on the loop's thread.
 *
 * Calls: each registered method keeps RPC_ARMED_PER_METHOD requests armed
 * (grpc_server_request_registered_call, which reads the request message
 * with the call), re-armed as soon as a call arrives; the generic
 * grpc_server_request_call is armed as well, so a method nobody registered
 * is answered UNIMPLEMENTED at once instead of waiting for its deadline. A
 * call's end (RECV_CLOSE_ON_SERVER: answered, or cancelled by a deadline,
 * the client or shutdown) is awaited on a batch of its own when someone must
 * hear of it early: a handler that holds the call with a cancel callback, a
 * stream once its first message goes, and every call at shutdown. Otherwise
 * it rides in the batch with the final status, so a unary call costs gRPC
 * one batch and one completion for its answer, not two (bench_coord). A call
 * has at most one send batch; replies wait in a queue behind it.
 *
 * Ownership: an rpc_call_t is freed when nothing refers to it: no batch
 * pending in gRPC (what gRPC writes back lives in the struct until then) and
 * the handler done with it (answered, or told of the cancellation). */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <openssl/crypto.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/param.h"
#include "proto/health.pb-c.h"
#include "rpc_impl.h"

#define RPC_JWKS_CHECK_S 1 /* a token no key verifies looks at the JWKS file this often, at most */

#define RPC_METHODS_MAX 64
/* Requests kept armed per registered method. A call that arrives while none
 * is armed waits in gRPC until the loop re-arms one: a round trip through
 * the queue thread and the loop per batch of arrivals. With one armed, that
 * round trip capped a method at ~7k calls/s and queued 10,000 nodes'
 * heartbeats for hundreds of ms (bench_nodesim); 32 still fell short; 256
 * matches a burst at once; 1024 cost more CPU than it saved. Each costs an
 * rpc_call_t and gRPC's request record (~1 KiB), ~4 MiB for the
 * coordinator's methods. */
#define RPC_ARMED_PER_METHOD 256
#define RPC_CQ_BATCH 64 /* completions the queue thread hands over at once, at most */
#define RPC_HEALTH_CHECK "/grpc.health.v1.Health/Check"

typedef enum {
  RPC_TAG_REQUEST, /* a registered call arrived (or, ok = 0, the server shut down) */
  RPC_TAG_GENERIC, /* a call to an unregistered method arrived */
  RPC_TAG_CLOSE,   /* RECV_CLOSE_ON_SERVER: the call is over */
  RPC_TAG_SEND,    /* a send batch completed */
  RPC_TAG_SHUTDOWN /* grpc_server_shutdown_and_notify's tag */
} rpc_tag_kind_t;

typedef struct rpc_tag {
  rpc_tag_kind_t kind;
  void *owner; /* the rpc_call_t, or the server for RPC_TAG_SHUTDOWN */
} rpc_tag_t;

typedef struct rpc_reg {
  rpc_method_t m;
  void *handle; /* grpc_server_register_method's */
} rpc_reg_t;

/* One reply or the final status, queued behind the send in flight. */
typedef struct rpc_out {
  grpc_byte_buffer *msg;   /* NULL for the status */
  int final;
  grpc_status_code status;
  grpc_slice details;
  struct rpc_out *next;
} rpc_out_t;

struct rpc_call {
  rpc_server_t *s;
  rpc_reg_t *reg;                /* NULL for a generic (unregistered) call */
  rpc_tag_t t_req, t_close, t_send;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;        /* the request's metadata */
  grpc_byte_buffer *payload;     /* registered calls: the request's bytes */
  grpc_call_details details;     /* generic calls: the method asked for */
  int cancelled;                 /* written by RECV_CLOSE_ON_SERVER */
  ProtobufCMessage *req;
  unsigned role;
  char node[RPC_NODE_NAME_MAX];  /* the node its token names (per-node tokens), else "" */
  int node_jwt;                  /* node came from a service account token, not a token file */
  char method[256];              /* for messages */
  int close_pending, send_pending;
  int close_in_send;             /* RECV_CLOSE_ON_SERVER rides in the send batch pending */
  int held;                      /* the handler may still answer */
  int answered;                  /* the final status is queued or sent */
  int ended;                     /* RECV_CLOSE_ON_SERVER completed */
  int md_sent;
  rpc_out_t *out, *out_tail;     /* waiting to be sent */
  rpc_out_t *inflight;           /* in the send batch pending */
  rpc_cancel_cb cancel_cb;
  void *cancel_arg;
  rpc_call_t *prev, *next;       /* the server's started calls */
};

typedef struct rpc_ev {
  void *tag;
  int ok;
} rpc_ev_t;

struct rpc_server {
  uv_loop_t *loop;
  uv_async_t async;
  grpc_server *server;
  grpc_completion_queue *cq;
  rpc_server_opts_t o;
  char *addr;
  rpc_keys_t keys;                /* none: auth off */
  struct stat jwks_st;            /* the node JWKS file when read */
  time_t jwks_checked;            /* when a token no key verified last looked at it */
  uint64_t refused[2];            /* calls refused: no or an unknown token, a role's method not its */
  char *cert_pem, *key_pem;       /* NULL: plaintext */
  rpc_reg_t regs[RPC_METHODS_MAX];
  int nregs;
  int port;
  int started, closing, shutdown_seen;
  int armed;                      /* requests waiting for a call */
  int live;                       /* started calls not yet freed */
  rpc_call_t *calls;
  rpc_tag_t t_shutdown;
  /* the queue thread's hand-over */
  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  rpc_ev_t *q, *q_spare;
  size_t q_len, q_cap, q_spare_cap;
};

/* ---- the queue thread ------------------------------------------------------- */

/* Hands n completions to the loop: one lock and one wake-up for all. */
static void rpc_push(rpc_server_t *s, const rpc_ev_t *ev, size_t n) {
  pthread_mutex_lock(&s->mu);
  if (s->q_len + n > s->q_cap) {
    size_t cap = s->q_cap ? 2 * s->q_cap : 64;
    while (cap < s->q_len + n) cap *= 2;
    rpc_ev_t *q = realloc(s->q, cap * sizeof *q);
    FSDP_ASSERT(q); /* a completion cannot be dropped: gRPC would wait for it forever */
    s->q = q;
    s->q_cap = cap;
  }
  memcpy(s->q + s->q_len, ev, n * sizeof *ev);
  s->q_len += n;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->async);
}

/* Waits for a completion, then takes every other one already there without
 * waiting (up to RPC_CQ_BATCH), and hands them over together: under load
 * the loop wakes once per batch, not once per completion. */
static void *rpc_cq_thread(void *arg) {
  rpc_server_t *s = arg;
  rpc_ev_t ev[RPC_CQ_BATCH];
  for (;;) {
    size_t n = 0;
    int down = 0;
    gpr_timespec until = gpr_inf_future(GPR_CLOCK_REALTIME);
    while (n < RPC_CQ_BATCH) {
      grpc_event e = grpc_completion_queue_next(s->cq, until, NULL);
      if (e.type == GRPC_QUEUE_SHUTDOWN) { down = 1; break; }
      if (e.type == GRPC_QUEUE_TIMEOUT) break;
      ev[n++] = (rpc_ev_t){e.tag, e.success};
      until = gpr_inf_past(GPR_CLOCK_REALTIME);
    }
    if (n) rpc_push(s, ev, n);
    if (down) break;
  }
  return NULL;
}

/* ---- calls -------------------------------------------------------------------- */

static void rpc_out_free(rpc_out_t *o) {
  if (o->msg) grpc_byte_buffer_destroy(o->msg);
  if (o->final) grpc_slice_unref(o->details);
  free(o);
}

static void rpc_call_free(rpc_call_t *c) {
  while (c->out) {
    rpc_out_t *o = c->out;
    c->out = o->next;
    rpc_out_free(o);
  }
  if (c->call) grpc_call_unref(c->call);
  grpc_metadata_array_destroy(&c->md);
  if (c->payload) grpc_byte_buffer_destroy(c->payload);
  if (!c->reg) grpc_call_details_destroy(&c->details);
  if (c->req) protobuf_c_message_free_unpacked(c->req, NULL);
  free(c);
}

/* Frees a started call once gRPC and the handler are both done with it. */
static void rpc_call_maybe_free(rpc_call_t *c) {
  if (c->close_pending || c->send_pending || c->held) return;
  rpc_server_t *s = c->s;
  if (c->prev) c->prev->next = c->next;
  else s->calls = c->next;
  if (c->next) c->next->prev = c->prev;
  s->live--;
  rpc_call_free(c);
}

/* Arms a request for a call of reg (NULL: the generic one). */
static void rpc_arm(rpc_server_t *s, rpc_reg_t *reg) {
  if (s->closing) return;
  rpc_call_t *c = calloc(1, sizeof *c);
  FSDP_ASSERT(c);
  c->s = s;
  c->reg = reg;
  c->t_req = (rpc_tag_t){reg ? RPC_TAG_REQUEST : RPC_TAG_GENERIC, c};
  c->t_close = (rpc_tag_t){RPC_TAG_CLOSE, c};
  c->t_send = (rpc_tag_t){RPC_TAG_SEND, c};
  grpc_metadata_array_init(&c->md);
  grpc_call_error e;
  if (reg) {
    e = grpc_server_request_registered_call(s->server, reg->handle, &c->call, &c->deadline, &c->md,
                                            &c->payload, s->cq, s->cq, &c->t_req);
  } else {
    grpc_call_details_init(&c->details);
    e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq, &c->t_req);
  }
  if (e != GRPC_CALL_OK) {
    /* only a programming error or a server already shutting down gets here */
    LOG_ERROR("rpc", "%s: cannot wait for calls (grpc_call_error %d)",
              reg ? reg->m.path : "generic", (int)e);
    rpc_call_free(c);
    return;
  }
  s->armed++;
}

/* Waits for the call's end on its own batch (once). */
static void rpc_close_arm(rpc_call_t *c) {
  if (c->close_pending || c->ended) return;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL);
  FSDP_ASSERT(e == GRPC_CALL_OK);
  c->close_pending = 1;
}

/* Starts the batch for the next queued reply, if none is in flight. */
static void rpc_pump(rpc_call_t *c) {
  if (c->send_pending || !c->out) return;
  grpc_op ops[4];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->md_sent = 1;
  }
  rpc_out_t *o = c->out, *st = NULL;
  if (o->msg) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = o->msg;
    /* a unary reply goes out with its status in one batch */
    if (o->next && o->next->final) st = o->next;
  } else {
    st = o;
  }
  if (st) {
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = st->status;
    ops[n++].data.send_status_from_server.status_details = &st->details;
    if (!c->close_pending && !c->ended) { /* the call's end rides with its status */
      ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
      ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
      c->close_pending = c->close_in_send = 1;
    }
  } else {
    rpc_close_arm(c); /* a stream: its end must be seen while it runs */
  }
  rpc_out_t *last = st ? st : o;
  c->out = last->next;
  if (!c->out) c->out_tail = NULL;
  last->next = NULL;
  c->inflight = o;
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL);
  FSDP_ASSERT(e == GRPC_CALL_OK);
  c->send_pending = 1;
}

static void rpc_append(rpc_call_t *c, rpc_out_t *o) {
  if (c->out_tail) c->out_tail->next = o;
  else c->out = o;
  c->out_tail = o;
}

static void rpc_enqueue(rpc_call_t *c, rpc_out_t *o) {
  rpc_append(c, o);
  rpc_pump(c);
}

/* The call's end: the handler is told if it has not answered. */
static void rpc_on_close(rpc_call_t *c) {
  c->close_pending = 0;
  c->ended = 1;
  if (!c->answered) {
    LOG_DEBUG("rpc", "%s: cancelled before its answer", c->method);
    c->answered = 1; /* nothing more may be queued */
    if (c->held && c->cancel_cb) c->cancel_cb(c, c->cancel_arg);
    c->held = 0;
  }
  rpc_call_maybe_free(c);
}

static void rpc_on_send(rpc_call_t *c, int ok) {
  c->send_pending = 0;
  if (c->close_in_send) /* the status went out with the close: the call is over */
    c->close_in_send = c->close_pending = 0, c->ended = 1;
  while (c->inflight) {
    rpc_out_t *o = c->inflight;
    c->inflight = o->next;
    rpc_out_free(o);
  }
  if (!ok) { /* the call is broken (client gone, deadline): drop what waits */
    while (c->out) {
      rpc_out_t *o = c->out;
      c->out = o->next;
      rpc_out_free(o);
    }
    c->out_tail = NULL;
  }
  rpc_pump(c);
  rpc_call_maybe_free(c);
}

/* ---- auth --------------------------------------------------------------------- */

static const char *rpc_role_name(unsigned role) {
  return role == RPC_ROLE_USER ? "user" : role == RPC_ROLE_NODE ? "node" : "operator";
}

/* "user or node": the roles of a set, in RPC_ROLE_* order. */
static void rpc_role_names(unsigned roles, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = 0;
  for (unsigned r = RPC_ROLE_USER; r <= RPC_ROLE_OPERATOR && at < n; r <<= 1)
    if (roles & r) at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? " or " : "", rpc_role_name(r));
}

/* The node JWKS file's identity as its keys were read. */
static void rpc_jwks_stat(rpc_server_t *s) {
  if (!s->o.node_jwks_file || stat(s->o.node_jwks_file, &s->jwks_st)) memset(&s->jwks_st, 0, sizeof s->jwks_st);
}

/* A token no key of the node JWKS verified: at most every
 * RPC_JWKS_CHECK_S, the file is looked at, and read again (with every token
 * file) when it was replaced, as a ConfigMap updated after the cluster's
 * signing key rotated is. 1 when the keys were read again. */
static int rpc_jwks_changed(rpc_server_t *s, time_t now) {
  struct stat st;
  if (now - s->jwks_checked < RPC_JWKS_CHECK_S || stat(s->o.node_jwks_file, &st)) return 0;
  s->jwks_checked = now;
  if (st.st_ino == s->jwks_st.st_ino && st.st_dev == s->jwks_st.st_dev &&
      st.st_size == s->jwks_st.st_size && st.st_mtim.tv_sec == s->jwks_st.st_mtim.tv_sec &&
      st.st_mtim.tv_nsec == s->jwks_st.st_mtim.tv_nsec && st.st_ctim.tv_sec == s->jwks_st.st_ctim.tv_sec &&
      st.st_ctim.tv_nsec == s->jwks_st.st_ctim.tv_nsec)
    return 0;
  if (rpc_server_reload_tokens(s)) {
    LOG_WARN("rpc", "node JWKS file %s changed but cannot be used: %s; the keys read before stay",
             s->o.node_jwks_file, err_msg());
    s->jwks_st = st; /* not again until it changes again */
    return 0;
  }
  LOG_INFO("rpc", "node JWKS file %s changed: its keys read again", s->o.node_jwks_file);
  return 1;
}

/* Checks the caller's token against the roles allowed; sets c->role. */
static int rpc_auth(rpc_server_t *s, rpc_call_t *c, unsigned roles) {
  if ((!s->keys.n && !s->keys.jwks) || !roles) return 0;
  if (roles & RPC_ROLE_USER) roles |= RPC_ROLE_OPERATOR; /* the operator may do what users may */
  if (!s->keys.has_operator && (roles & RPC_ROLE_OPERATOR)) roles |= RPC_ROLE_USER;
  const grpc_slice *val = NULL;
  int count = 0;
  for (size_t i = 0; i < c->md.count; i++)
    if (!grpc_slice_str_cmp(c->md.metadata[i].key, "authorization")) {
      val = &c->md.metadata[i].value;
      count++;
    }
  if (count == 0)
    return err_set(FSDP_EAUTH, "%s: no token: this server requires one (authorization: Bearer "
                   "<token>, from the token file the operator gave you)", c->method);
  if (count > 1)
    return err_set(FSDP_EAUTH, "%s: %d authorization headers; send exactly one", c->method, count);
  const uint8_t *p = GRPC_SLICE_START_PTR(*val);
  size_t n = GRPC_SLICE_LENGTH(*val);
  if (n < 7 || strncasecmp((const char *)p, "bearer ", 7))
    return err_set(FSDP_EAUTH, "%s: the authorization header is not \"Bearer <token>\"", c->method);
  p += 7, n -= 7;
  uint8_t sha[RPC_DIGEST_LEN];
  const rpc_key_t *k = rpc__keys_match(&s->keys, p, n, sha);
  if (k) {
    c->role = k->role;
    snprintf(c->node, sizeof c->node, "%s", k->name ? k->name : "");
  } else if (s->keys.jwks && (roles & RPC_ROLE_NODE) && rpc__jwt_like(p, n)) {
    /* a Kubernetes node's service account token (only where a node may call) */
    const time_t now = time(NULL);
    int rc = rpc__jwt_node(s->keys.jwks, p, n, sha, (int64_t)now, c->node, sizeof c->node);
    if (rc == FSDP_ENOTFOUND && rpc_jwks_changed(s, now)) /* the cluster's keys rotated? */
      rc = rpc__jwt_node(s->keys.jwks, p, n, sha, (int64_t)now, c->node, sizeof c->node);
    if (rc == FSDP_ENOTFOUND) rc = FSDP_EAUTH;
    OPENSSL_cleanse(sha, sizeof sha);
    if (rc) {
      char why[512];
      snprintf(why, sizeof why, "%s", err_msg());
      return err_set(rc, "%s: %s", c->method, why);
    }
    c->role = RPC_ROLE_NODE;
    c->node_jwt = 1;
  } else {
    OPENSSL_cleanse(sha, sizeof sha);
    return err_set(FSDP_EAUTH, "%s: the token is not valid on this server; check the token "
                   "file the client reads", c->method);
  }
  OPENSSL_cleanse(sha, sizeof sha);
  if (!(c->role & roles)) {
    char need[48];
    rpc_role_names(s->keys.has_operator ? roles : roles & ~(unsigned)RPC_ROLE_OPERATOR, need, sizeof need);
    return err_set(FSDP_EPERM, "%s: %s %s token may not call this method; it needs the %s token",
                   c->method, c->role == RPC_ROLE_OPERATOR ? "an" : "a", rpc_role_name(c->role),
                   need);
  }
  return 0;
}

/* ---- a call arrives ------------------------------------------------------------ */

/* Reads a varint at *p (below end): 0 and *v, or -1 when cut short. */
static int rpc_wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    const uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* The first string field of a message (d, its wire bytes) whose bytes hold
 * a NUL, nested messages included: its name, or NULL. protobuf-c hands a
 * handler the string up to the NUL, so a request would be served for other
 * text than it sent ("j-2\0x" as "j-2") and no check would see the rest.
 * The bytes already decoded as d: what does not parse here is passed. */
static const char *rpc_wire_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                                const uint8_t *end, int depth) {
  while (p < end && depth < 16) {
    uint64_t key, v;
    if (rpc_wire_varint(&p, end, &key)) return NULL;
    switch (key & 7) {
    case 0: if (rpc_wire_varint(&p, end, &v)) return NULL; break;
    case 1: p += 8; break;
    case 5: p += 4; break;
    case 2: {
      if (rpc_wire_varint(&p, end, &v) || v > (uint64_t)(end - p)) return NULL;
      const ProtobufCFieldDescriptor *f =
          protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
      if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)v)) return f->name;
      if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
        const char *in = rpc_wire_nul(f->descriptor, p, p + v, depth + 1);
        if (in) return in;
      }
      p += v;
      break;
    }
    default: return NULL;
    }
  }
  return NULL;
}

/* Takes a call that arrived: arms its end, then checks and decodes it, and
 * hands it to its handler or answers it with an error. */
static void rpc_start(rpc_server_t *s, rpc_call_t *c) {
  s->armed--;
  s->live++;
  c->next = s->calls;
  if (s->calls) s->calls->prev = c;
  s->calls = c;
  c->held = 1;
  if (c->reg) {
    snprintf(c->method, sizeof c->method, "%s", c->reg->m.path);
  } else {
    size_t n = GRPC_SLICE_LENGTH(c->details.method);
    if (n > sizeof c->method - 1) n = sizeof c->method - 1;
    memcpy(c->method, GRPC_SLICE_START_PTR(c->details.method), n);
    c->method[n] = 0;
  }
  rpc_reg_t *reg = c->reg;
  int rc = rpc_auth(s, c, reg ? reg->m.roles : RPC_ROLE_USER | RPC_ROLE_NODE);
  if (rc) {
    s->refused[rc == FSDP_EPERM]++;
    goto fail;
  }
  if (!reg) {
    rc = err_set(FSDP_EUNSUPPORTED, "%s: no such method on this server (a client newer than "
                 "the server, or a wrong address?)", c->method);
    goto fail;
  }
  if (!c->payload) {
    rc = err_set(FSDP_EINVAL, "%s: the call carried no request message", c->method);
    goto fail;
  }
  grpc_slice bytes = rpc__flatten(c->payload);
  grpc_byte_buffer_destroy(c->payload);
  c->payload = NULL;
  c->req = protobuf_c_message_unpack(reg->m.request, NULL, GRPC_SLICE_LENGTH(bytes),
                                     GRPC_SLICE_START_PTR(bytes));
  const char *nul = c->req ? rpc_wire_nul(reg->m.request, GRPC_SLICE_START_PTR(bytes),
                                          GRPC_SLICE_END_PTR(bytes), 0)
                           : NULL;
  grpc_slice_unref(bytes);
  if (!c->req) {
    rc = err_set(FSDP_EINVAL, "%s: the request does not decode as %s (truncated, or not "
                 "this method's message)", c->method, reg->m.request->name);
    goto fail;
  }
  if (nul) {
    rc = err_set(FSDP_EINVAL, "%s: field %s holds a NUL byte; send text without one", c->method,
                 nul);
    goto fail;
  }
  reg->m.handler(c, c->req, reg->m.arg);
  return;
fail:
  LOG_DEBUG("rpc", "%s", err_msg());
  rpc_call_finish(c, rc);
}

static void rpc_event(rpc_server_t *s, void *tag, int ok) {
  rpc_tag_t *t = tag;
  rpc_call_t *c = t->owner;
  switch (t->kind) {
  case RPC_TAG_REQUEST:
  case RPC_TAG_GENERIC:
    if (!ok) { /* the server is shutting down: this request will never get a call */
      s->armed--;
      rpc_call_free(c);
      return;
    }
    rpc_arm(s, c->reg);
    rpc_start(s, c);
    return;
  case RPC_TAG_CLOSE:
    rpc_on_close(c);
    return;
  case RPC_TAG_SEND:
    rpc_on_send(c, ok);
    return;
  case RPC_TAG_SHUTDOWN:
    s->shutdown_seen = 1;
    return;
  }
}

/* Handles every completion handed over so far. */
static void rpc_drain(rpc_server_t *s) {
  for (;;) {
    pthread_mutex_lock(&s->mu);
    rpc_ev_t *q = s->q;
    size_t n = s->q_len, cap = s->q_cap;
    s->q = s->q_spare, s->q_cap = s->q_spare_cap, s->q_len = 0;
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++) rpc_event(s, q[i].tag, q[i].ok);
    s->q_spare = q, s->q_spare_cap = cap; /* swapped back next time: no allocation per wake-up */
    if (!n) return;
  }
}

static void rpc_async_cb(uv_async_t *a) { rpc_drain(a->data); }

/* ---- answering -------------------------------------------------------------------- */

static int rpc_call_check(rpc_call_t *c, const char *what) {
  if (c->answered)
    return err_set(FSDP_ESTATE, "%s: %s after the call was answered or ended", c->method, what);
  return 0;
}

/* msg packed for the call, not yet queued. */
static int rpc_out_msg(rpc_call_t *c, const ProtobufCMessage *msg, rpc_out_t **out) {
  int rc = rpc_call_check(c, "a send");
  if (rc) return rc;
  FSDP_ASSERT(c->reg && msg->descriptor == c->reg->m.reply);
  rpc_out_t *o = calloc(1, sizeof *o);
  if (!o || !(o->msg = rpc__pack(msg))) {
    free(o);
    return err_set(FSDP_ENOMEM, "%s: out of memory for a reply", c->method);
  }
  *out = o;
  return 0;
}

int rpc_call_send(rpc_call_t *c, const ProtobufCMessage *msg) {
  rpc_out_t *o = NULL;
  int rc = rpc_out_msg(c, msg, &o);
  if (!rc) rpc_enqueue(c, o);
  return rc;
}

int rpc_call_finish(rpc_call_t *c, int rc) {
  int crc = rpc_call_check(c, "a finish");
  if (crc) return crc;
  rpc_out_t *o = calloc(1, sizeof *o);
  FSDP_ASSERT(o); /* without it the call would never end */
  o->final = 1;
  o->status = rpc_status_from_err(rc);
  o->details = grpc_slice_from_copied_string(rc ? err_msg() : "");
  c->answered = 1;
  c->held = 0;
  rpc_enqueue(c, o);
  rpc_call_maybe_free(c); /* not yet: the batch and the close are pending */
  return 0;
}

int rpc_call_abort(rpc_call_t *c, int rc) {
  int crc = rpc_call_check(c, "an abort");
  if (crc) return crc;
  c->answered = 1;
  c->held = 0;
  while (c->out) { /* never sent: the batch in flight fails once the call is cancelled */
    rpc_out_t *o = c->out;
    c->out = o->next;
    rpc_out_free(o);
  }
  c->out_tail = NULL;
  grpc_call_error e = grpc_call_cancel_with_status(c->call, rpc_status_from_err(rc),
                                                   rc ? err_msg() : "", NULL);
  FSDP_ASSERT(e == GRPC_CALL_OK);
  rpc_call_maybe_free(c); /* now, or when the pending batches come back */
  return 0;
}

/* The message is queued without a pump, so that rpc_call_finish's pump
 * finds it with the status behind it and sends both in one batch: one write
 * and one completion per unary call instead of two (bench_nodesim's
 * heartbeats: fewer syscalls and wake-ups on the loop's thread). */
int rpc_call_reply(rpc_call_t *c, const ProtobufCMessage *reply) {
  FSDP_ASSERT(!c->reg || !c->reg->m.server_streaming);
  rpc_out_t *o = NULL;
  int rc = rpc_out_msg(c, reply, &o);
  if (rc) return rc;
  rpc_append(c, o);
  return rpc_call_finish(c, 0);
}

int rpc_call_backlog(const rpc_call_t *c) {
  int n = c->send_pending;
  for (const rpc_out_t *o = c->out; o; o = o->next) n++;
  return n;
}

void rpc_call_on_cancel(rpc_call_t *c, rpc_cancel_cb cb, void *arg) {
  c->cancel_cb = cb;
  c->cancel_arg = arg;
  if (cb && !c->answered) rpc_close_arm(c);
}

const char *rpc_call_method(const rpc_call_t *c) { return c->method; }
unsigned rpc_call_role(const rpc_call_t *c) { return c->role; }

int rpc_call_auth(rpc_call_t *c, unsigned roles) { return rpc_auth(c->s, c, roles); }
const char *rpc_call_node(const rpc_call_t *c) { return c->node[0] ? c->node : NULL; }
int rpc_call_node_jwt(const rpc_call_t *c) { return c->node_jwt; }

/* ---- health -------------------------------------------------------------------------- */

/* grpc.health.v1.Health/Check: SERVING for the server ("") and for every
 * service with a method registered; NOT_FOUND for others, as the spec says. */
static void rpc_health_check(rpc_call_t *c, const ProtobufCMessage *m, void *arg) {
  rpc_server_t *s = arg;
  const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
  const char *svc = req->service ? req->service : "";
  size_t n = strlen(svc);
  int known = n == 0;
  for (int i = 0; i < s->nregs && !known; i++) {
    const char *p = s->regs[i].m.path;
    known = p[0] == '/' && !strncmp(p + 1, svc, n) && p[1 + n] == '/';
  }
  if (!known) {
    rpc_call_finish(c, err_set(FSDP_ENOTFOUND, "health: no service %s here", svc));
    return;
  }
  Grpc__Health__V1__HealthCheckResponse rep = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  rep.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  rpc_call_reply(c, &rep.base);
}

/* ---- the server ------------------------------------------------------------------------ */

static void rpc_server_free(rpc_server_t *s) {
  free(s->addr);
  rpc__keys_free(&s->keys);
  free(s->cert_pem);
  rpc__free_secret(s->key_pem);
  free(s->q);
  free(s->q_spare);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}

static void rpc_async_closed(uv_handle_t *h) { rpc_server_free(h->data); }

/* What the options say together, before a file is read. */
static int rpc_server_opts_check(const rpc_server_opts_t *o) {
  if (!o->addr || !*o->addr) return err_set(FSDP_EINVAL, "rpc server: no address to listen on");
  if (!o->user_token_file && (o->node_token_file || o->node_jwks_file))
    return err_set(FSDP_EINVAL, "rpc server: a %s without the user token file: give both (users "
                   "and nodes hold different tokens) or neither (open to anyone who can connect)",
                   o->node_token_file ? "node token file" : "node JWKS file");
  if (!o->user_only && !o->user_token_file != !(o->node_token_file || o->node_jwks_file))
    return err_set(FSDP_EINVAL, "rpc server: a %s token file without a %s one: give both (users "
                   "and nodes hold different tokens) or neither (open to anyone who can connect)%s",
                   o->user_token_file ? "user" : "node", o->user_token_file ? "node" : "user",
                   o->user_token_file ? "; nodes may also show Kubernetes service account tokens "
                   "(a node JWKS file)" : "");
  if (o->operator_token_file && !o->user_token_file)
    return err_set(FSDP_EINVAL, "rpc server: an operator token file without the user and node "
                   "ones: give all three (an operator token alone would leave every call open)");
  if (!o->tls_cert_file != !o->tls_key_file)
    return err_set(FSDP_EINVAL, "rpc server: TLS needs both a certificate and a key file");
  return 0;
}

static int rpc_server_check_addr(const char *addr, const char *option);

int rpc_server_check(const rpc_server_opts_t *o) {
  int rc = rpc_server_opts_check(o);
  if (!rc) rc = rpc_server_check_addr(o->addr, o->addr_option);
  rpc_keys_t keys;
  if (!rc && !(rc = rpc__keys_load(&keys, o->user_token_file, o->node_token_file,
                                   o->operator_token_file,
                                   &(rpc_jwt_opts_t){o->node_jwks_file, o->node_jwt_audience,
                                                     o->node_jwt_subject, o->node_jwt_issuer})))
    rpc__keys_free(&keys);
  char *pem[2] = {NULL, NULL};
  if (!rc && o->tls_cert_file &&
      !(rc = rpc__read_file(o->tls_cert_file, "TLS certificate", RPC_PEM_MAX, &pem[0], NULL)))
    rc = rpc__read_file(o->tls_key_file, "TLS key", RPC_PEM_MAX, &pem[1], NULL);
  free(pem[0]);
  rpc__free_secret(pem[1]);
  return rc;
}

/* A tunable as a gRPC integer argument: at least min, at most INT32_MAX. */
static int rpc_param_int(int64_t v, int min) { return v < min ? min : v > INT32_MAX ? INT32_MAX : (int)v; }

int rpc_server_create(rpc_server_t **out, uv_loop_t *loop, const rpc_server_opts_t *o) {
  *out = NULL;
  int rc = rpc_server_opts_check(o);
  if (rc) return rc;
  rpc_server_t *s = calloc(1, sizeof *s);
  if (!s) return err_set(FSDP_ENOMEM, "rpc server: out of memory");
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->loop = loop;
  s->o = *o;
  if (!s->o.max_request_bytes) s->o.max_request_bytes = RPC_MAX_MESSAGE_DEFAULT;
  s->o.addr = NULL;
  s->t_shutdown = (rpc_tag_t){RPC_TAG_SHUTDOWN, s};
  if (!(s->addr = strdup(o->addr))) {
    rc = err_set(FSDP_ENOMEM, "rpc server: out of memory");
    goto fail;
  }
  if ((rc = rpc__keys_load(&s->keys, o->user_token_file, o->node_token_file, o->operator_token_file,
                           &(rpc_jwt_opts_t){o->node_jwks_file, o->node_jwt_audience,
                                             o->node_jwt_subject, o->node_jwt_issuer})))
    goto fail;
  rpc_jwks_stat(s);
  if (o->tls_cert_file &&
      ((rc = rpc__read_file(o->tls_cert_file, "TLS certificate", RPC_PEM_MAX, &s->cert_pem, NULL)) ||
       (rc = rpc__read_file(o->tls_key_file, "TLS key", RPC_PEM_MAX, &s->key_pem, NULL))))
    goto fail;
  if ((rc = uv_async_init(loop, &s->async, rpc_async_cb))) {
    rc = err_set(FSDP_EINTERNAL, "rpc server: uv_async_init: %s", uv_strerror(rc));
    goto fail;
  }
  s->async.data = s;
  rpc__init();
  /* Clients ping every FSDP_RPC_KEEPALIVE_S while a call is open
   * (rpc_client.c): pings a second or more apart are welcome, never
   * answered with "too many pings" (gRPC's default wants 5 minutes between
   * them). The server pings too, every minute, so a client that vanished
   * without closing (a held WatchJob, a node's held heartbeat) is let go.
   * No SO_REUSEPORT (gRPC sets it by default on Linux): a second server on
   * a port in use fails to bind, where it would share the connections with
   * the first (two coordinators over two state databases). */
  grpc_arg arg[10] = {
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
       .value.integer = 1000},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_MAX_PING_STRIKES, .value.integer = 0},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = 60000},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = 20000},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
      /* What a peer may hold before any token is looked at (gRPC reads a
       * call's headers and message before the server sees it). Streams: a
       * call that sent its headers and never its message was kept forever,
       * ~12 KiB each, any number on one connection (250,000 took a
       * coordinator to 4 GB); the cap is advertised in SETTINGS, enforced
       * once the peer acknowledges them, and gRPC clients queue calls
       * beyond it. Idle: a connection without calls (a flood of them held
       * descriptors and memory for good) is closed; a node's held heartbeat,
       * a watch or a followed log are calls, so theirs never idle. The
       * handshake limit closes one that never finishes TLS and SETTINGS
       * (gRPC's default 120 s). */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_CONCURRENT_STREAMS},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_CONNECTION_IDLE_MS},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS},
      rpc__guard_arg(), /* rpc_guard.c: the listener never meets EMFILE */
  };
  arg[0].value.integer = s->o.max_request_bytes > INT32_MAX ? INT32_MAX : (int)s->o.max_request_bytes;
  arg[6].value.integer = rpc_param_int(param_rpc_streams_max(), 1);
  arg[7].value.integer = param_rpc_idle_ms() > 0 ? rpc_param_int(param_rpc_idle_ms(), 1) : INT32_MAX;
  arg[8].value.integer = rpc_param_int(param_rpc_handshake_ms(), 100);
  rpc__guard_raise_nofile();
  /* the mutator is gRPC's private struct mirrored for 1.51 (core 29.0.0):
   * under any other core it is left out, lest gRPC call through a layout
   * it no longer has (the cap is then off; the raised limit stays) */
  const int guard = rpc__guard_fits(grpc_version_string());
  grpc_channel_args args = {guard ? 10 : 9, arg};
  s->server = grpc_server_create(&args, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  rpc_method_t health = {RPC_HEALTH_CHECK, &grpc__health__v1__health_check_request__descriptor,
                         &grpc__health__v1__health_check_response__descriptor, 0, 0,
                         rpc_health_check, s};
  rpc_server_add(s, &health);
  if (pthread_create(&s->thread, NULL, rpc_cq_thread, s)) {
    /* nothing can be served: undo through destroy, which copes with no thread */
    rpc_server_destroy(s);
    return err_set(FSDP_EINTERNAL, "rpc server: cannot start its completion-queue thread");
  }
  s->thread_started = 1;
  *out = s;
  return 0;
fail:
  rpc_server_free(s);
  return rc;
}

int rpc_server_add(rpc_server_t *s, const rpc_method_t *m) {
  FSDP_ASSERT(!s->started && m->path && m->request && m->reply && m->handler);
  if (s->nregs == RPC_METHODS_MAX)
    return err_set(FSDP_ELIMIT, "rpc server: more than %d methods", RPC_METHODS_MAX);
  for (int i = 0; i < s->nregs; i++)
    if (!strcmp(s->regs[i].m.path, m->path))
      return err_set(FSDP_EEXIST, "rpc server: %s registered twice", m->path);
  rpc_reg_t *r = &s->regs[s->nregs];
  r->m = *m;
  r->handle = grpc_server_register_method(s->server, m->path, NULL,
                                          GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  if (!r->handle) return err_set(FSDP_EINVAL, "rpc server: gRPC refused to register %s", m->path);
  s->nregs++;
  return 0;
}

int rpc_server_add_all(rpc_server_t *s, const rpc_method_t *m, size_t n) {
  int rc = FSDP_OK;
  for (size_t i = 0; i < n && !rc; i++) rc = rpc_server_add(s, &m[i]);
  return rc;
}

int rpc_server_reload_tokens(rpc_server_t *s) {
  if (!s->keys.n)
    return err_set(FSDP_EINVAL, "rpc server: it was started without token files: none to read again");
  rpc_keys_t fresh;
  int rc = rpc__keys_load(&fresh, s->o.user_token_file, s->o.node_token_file, s->o.operator_token_file,
                          &(rpc_jwt_opts_t){s->o.node_jwks_file, s->o.node_jwt_audience,
                                            s->o.node_jwt_subject, s->o.node_jwt_issuer});
  if (rc) return rc;
  rpc__keys_free(&s->keys); /* calls in flight keep the role and name they came with */
  s->keys = fresh;
  rpc_jwks_stat(s);
  return 0;
}

/* HOST:PORT with PORT 0 to 65535 (gRPC takes 70700 as 70700 mod 65536 and
 * serves on another port than the operator wrote), or unix:PATH. */
static int rpc_server_check_addr(const char *addr, const char *option) {
  if (!strncmp(addr, "unix:", 5)) return 0;
  const char *colon = strrchr(addr, ':');
  char *end;
  errno = 0;
  const unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
  if (!colon || !colon[1] || !isdigit((unsigned char)colon[1]) || *end || errno || port > 65535)
    return err_set(FSDP_EINVAL, "%s %s: give HOST:PORT with a port from 0 to 65535 (0: any "
                   "free one), or unix:PATH", option ? option : "--listen", addr);
  return 0;
}

int rpc_server_start(rpc_server_t *s) {
  FSDP_ASSERT(!s->started);
  const char *option = s->o.addr_option ? s->o.addr_option : "--listen";
  if (rpc_server_check_addr(s->addr, option)) return FSDP_EINVAL;
  grpc_server_credentials *creds;
  if (s->cert_pem) {
    grpc_ssl_pem_key_cert_pair pair = {s->key_pem, s->cert_pem};
    creds = grpc_ssl_server_credentials_create_ex(NULL, &pair, 1,
                                                  GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  if (!creds) return err_set(FSDP_EINVAL, "rpc server: TLS certificate %s or key %s is not "
                             "usable PEM", s->o.tls_cert_file, s->o.tls_key_file);
  rpc__guard_listen_begin();
  s->port = grpc_server_add_http2_port(s->server, s->addr, creds);
  if (s->port) rpc__guard_listen_end(); /* a failed add closed what it made */
  grpc_server_credentials_release(creds);
  if (!s->port)
    return err_set(FSDP_EUNAVAILABLE, "rpc server: cannot listen on %s (in use, not an address "
                   "of this host, or a bad certificate or key); pick another %s", s->addr, option);
  if (!strncmp(s->addr, "unix:", 5)) s->port = 0;
  else if (!rpc__guard_fits(grpc_version_string()))
    LOG_WARN("rpc", "gRPC core %s, not the %s whose socket mutator rpc_guard.c mirrors: "
             "connections on %s are not capped below the open-file limit, and a flood of them "
             "may stop its listener for good", grpc_version_string(), RPC_GUARD_GRPC_CORE, s->addr);
  else if (!rpc__guard_saw_listener())
    LOG_WARN("rpc", "gRPC did not call the socket mutator on %s's listener (not gRPC 1.51's "
             "layout?): connections are not capped below the open-file limit", s->addr);
  grpc_server_start(s->server);
  s->started = 1;
  for (int i = 0; i < s->nregs; i++)
    for (int k = 0; k < RPC_ARMED_PER_METHOD; k++) rpc_arm(s, &s->regs[i]);
  rpc_arm(s, NULL);
  return 0;
}

int rpc_server_port(const rpc_server_t *s) { return s->port; }

int rpc_addr_is_local(const char *addr) {
  return !strncmp(addr, "127.", 4) || !strncmp(addr, "[::1]", 5) ||
         !strncmp(addr, "localhost:", 10) || !strncmp(addr, "unix:", 5);
}

void rpc_server_refusals(const rpc_server_t *s, uint64_t *unauthenticated, uint64_t *denied) {
  *unauthenticated = s->refused[0], *denied = s->refused[1];
}
int rpc_server_calls(const rpc_server_t *s) { return s->live; }

void rpc_server_destroy(rpc_server_t *s) {
  s->closing = 1;
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
  grpc_server_cancel_all_calls(s->server);
  for (rpc_call_t *c = s->calls; c; c = c->next) rpc_close_arm(c); /* held quietly: end them */
  if (s->thread_started) {
    /* Handle completions here, on the loop's thread, until gRPC has given
     * back every armed request and call and said the server is done. */
    pthread_mutex_lock(&s->mu);
    for (;;) {
      while (!s->q_len) pthread_cond_wait(&s->cv, &s->mu);
      pthread_mutex_unlock(&s->mu);
      rpc_drain(s);
      pthread_mutex_lock(&s->mu);
      if (s->shutdown_seen && !s->armed && !s->live && !s->q_len) break;
    }
    pthread_mutex_unlock(&s->mu);
  } else {
    for (;;) {
      grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
      if (ev.type == GRPC_OP_COMPLETE && ev.tag == &s->t_shutdown) break;
    }
  }
  grpc_server_destroy(s->server);
  grpc_completion_queue_shutdown(s->cq);
  if (s->thread_started) pthread_join(s->thread, NULL);
  else while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
              GRPC_QUEUE_SHUTDOWN) {}
  grpc_completion_queue_destroy(s->cq);
  grpc_shutdown();
  uv_close((uv_handle_t *)&s->async, rpc_async_closed);
}

/* agent: the coordinator session (see agent.h). */
#include "daemon/node/agent.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"

#define AGENT_BACKOFF_MIN_MS 50
#define AGENT_BACKOFF_MAX_MS 1000 /* the contract: a restarted coordinator is seen within 1 s */
#define AGENT_CALL_S 5.0          /* RegisterNode's deadline, and the heartbeat's beyond its hold */
#define AGENT_REFUSED_MS 5000     /* a refusal is asked again this often: only the coordinator can change it */
#define AGENT_REFUSED_LOG_S 60.0  /* a refusal that stays is logged again this often */
#define AGENT_LEAVE_S 2.0         /* agent_leave's deadline: a stop is not held up for long */

/* A message for the loop. */
typedef struct agent_msg {
  int kind; /* 0: registered (text = node id), 1: a heartbeat reply (packed), 2: refused (text),
               3: superseded (text) */
  uint8_t *data;
  size_t len;
  struct agent_msg *next;
} agent_msg_t;

struct agent {
  agent_opts_t o;
  uv_async_t async;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop, ended;
  int up;           /* the last call to the coordinator was answered */
  uint64_t refusals; /* calls it refused (agent_refusal) */
  /* the session the coordinator knows, for agent_leave: node id and session
   * while registered (registered 0 from a "register again" on) */
  char node_id[256];
  uint64_t session;
  int registered;
  uint8_t *state; /* the latest published HeartbeatRequest */
  size_t state_len;
  agent_msg_t *head, *tail;
};

/* CLOCK_BOOTTIME: a suspended host's silence counts toward the fence, as it
 * does at the coordinator (proto: RankLease) */
static double agent_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sleeps ms unless asked to stop; 1 when asked. */
static int agent_sleep(agent_t *a, int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&a->mu);
  while (!a->stop && pthread_cond_timedwait(&a->cv, &a->mu, &ts) != ETIMEDOUT) {
  }
  int stop = a->stop;
  pthread_mutex_unlock(&a->mu);
  return stop;
}

static int agent_stopping(agent_t *a) {
  pthread_mutex_lock(&a->mu);
  int s = a->stop;
  pthread_mutex_unlock(&a->mu);
  return s;
}

/* The latest published state, unpacked (NULL when nothing was published). */
static Fsdp__V1__HeartbeatRequest *agent_state(agent_t *a) {
  pthread_mutex_lock(&a->mu);
  Fsdp__V1__HeartbeatRequest *hb =
      a->state ? fsdp__v1__heartbeat_request__unpack(NULL, a->state_len, a->state) : NULL;
  pthread_mutex_unlock(&a->mu);
  return hb;
}

static void agent_post(agent_t *a, int kind, const ProtobufCMessage *m, const char *text) {
  agent_msg_t *msg = calloc(1, sizeof *msg);
  size_t len = m ? protobuf_c_message_get_packed_size(m) : strlen(text) + 1;
  if (!msg || !(msg->data = malloc(len ? len : 1))) {
    free(msg);
    LOG_ERROR("fsdpd", "out of memory for a message from the coordinator: dropped");
    return;
  }
  msg->kind = kind;
  msg->len = len;
  if (m) protobuf_c_message_pack(m, msg->data);
  else memcpy(msg->data, text, len);
  pthread_mutex_lock(&a->mu);
  if (a->tail) a->tail->next = msg;
  else a->head = msg;
  a->tail = msg;
  pthread_mutex_unlock(&a->mu);
  uv_async_send(&a->async);
}

/* On the loop: every queued message, in order (wake-ups coalesce). */
static void agent_async_cb(uv_async_t *h) {
  agent_t *a = h->data;
  pthread_mutex_lock(&a->mu);
  agent_msg_t *m = a->head;
  a->head = a->tail = NULL;
  pthread_mutex_unlock(&a->mu);
  while (m) {
    agent_msg_t *next = m->next;
    if (m->kind == 0) {
      Fsdp__V1__RegisterNodeReply *rep = fsdp__v1__register_node_reply__unpack(NULL, m->len, m->data);
      if (rep && a->o.registered_cb)
        a->o.registered_cb(a->o.arg, rep->node_id, rep->log_key.data, rep->log_key.len);
      if (rep) fsdp__v1__register_node_reply__free_unpacked(rep, NULL);
    } else if (m->kind == 2) {
      if (a->o.refused_cb) a->o.refused_cb(a->o.arg, (const char *)m->data);
    } else if (m->kind == 3) {
      if (a->o.superseded_cb) a->o.superseded_cb(a->o.arg, (const char *)m->data);
    } else if (m->kind == 4) {
      if (a->o.fence_cb) a->o.fence_cb(a->o.arg, (const char *)m->data);
    } else if (m->kind == 5) {
      char *end;
      const unsigned long long until = strtoull((const char *)m->data, &end, 10);
      if (a->o.lease_cb) a->o.lease_cb(a->o.arg, until, atoi(end));
    } else {
      Fsdp__V1__HeartbeatReply *rep = fsdp__v1__heartbeat_reply__unpack(NULL, m->len, m->data);
      if (rep && a->o.reply_cb) a->o.reply_cb(a->o.arg, rep);
      if (rep) fsdp__v1__heartbeat_reply__free_unpacked(rep, NULL);
    }
    free(m->data);
    free(m);
    m = next;
  }
}

/* A refusal: the coordinator (or what stands before it) knows the caller
 * and will not take it: a token it does not take, a name that is not the
 * token's, a name another live fsdpd holds. Only a change of configuration
 * ends one. Everything else (unreachable, late, failing, a store error,
 * which may come back as INVALID_ARGUMENT) passes by itself. */
int agent_refusal(int rc) { return rc == FSDP_EAUTH || rc == FSDP_EPERM || rc == FSDP_EEXIST; }

/* The session: register, then one heartbeat in flight at a time. */
/* A call's deadline (s), cut to end at fence_at (agent_now's clock; 0:
 * none), so a coordinator that never answers is seen as silent past its
 * fence when it is, not a call's deadline later. */
static double agent_until(double fence_at, double secs) {
  if (!fence_at) return secs;
  const double left = fence_at - agent_now();
  return left < 0.001 ? 0.001 : left < secs ? left : secs;
}

/* A wait (ms), cut the same way. */
static int agent_until_ms(double fence_at, int ms) {
  return (int)ceil(1e3 * agent_until(fence_at, ms / 1e3));
}

/* What a retry line says of the ranks, true in each state: none run before
 * the first registration; a stopping fsdpd's are ending or gone; and a
 * node may have none. st: the state published (NULL: none yet). */
static const char *agent_ranks_note(int ever, const Fsdp__V1__HeartbeatRequest *st) {
  size_t live = 0;
  for (size_t i = 0; st && i < st->n_ranks; i++)
    live += st->ranks[i]->state != FSDP__V1__RANK_STATE__RANK_STATE_EXITED;
  if (!ever) return " (not registered yet: no rank runs before)";
  if (st && st->stopping) return live ? ", while fsdpd stops its ranks" : ", while fsdpd stops";
  return live ? ", ranks keep running" : "";
}

static void *agent_main(void *arg) {
  agent_t *a = arg;
  char node_id[256] = "", refusal[512] = "";
  uint64_t session = 0;
  uint32_t interval_ms = 1000;
  int registered = 0, ever = 0, backoff = AGENT_BACKOFF_MIN_MS, lost = 0, superseded = 0;
  uint64_t instance = 0; /* this process's, for every registration (proto: instance) */
  while (!instance && getrandom(&instance, sizeof instance, 0) != sizeof instance)
    instance = (uint64_t)(agent_now() * 1e9) ^ (uint64_t)getpid() << 32;
  double refusal_logged = 0, refused_since = 0;
  /* the fence the coordinator gave (s; 0: none), when it last answered, and
   * whether this silence has fenced the ranks already */
  double fence_s = 0, answered = agent_now();
  int fenced = 0;
  while (!agent_stopping(a)) {
    Fsdp__V1__HeartbeatRequest *st = agent_state(a);
    int rc;
    const char *what;
    double t0 = agent_now();
    int quiet = 0; /* an empty heartbeat reply */
    int heard = 0; /* the reply says the coordinator counts this node alive */
    /* no call or wait runs past the fence: the coordinator restarts this
     * node's jobs elsewhere a margin after it (coord_node_gone) */
    const double fence_at = ever && fence_s > 0 && !fenced ? answered + fence_s : 0;
    if (!registered) {
      what = "RegisterNode";
      Fsdp__V1__RegisterNodeRequest req = FSDP__V1__REGISTER_NODE_REQUEST__INIT;
      req.hostname = (char *)a->o.hostname;
      req.address = (char *)a->o.address;
      req.version = (char *)a->o.version;
      req.node_id = node_id;
      req.instance = instance;
      if (st) {
        req.n_devices = st->n_devices, req.devices = st->devices;
        req.n_ranks = st->n_ranks, req.ranks = st->ranks;
      }
      Fsdp__V1__RegisterNodeReply *rep = NULL;
      rc = rpc_client_call(a->o.client, "/fsdp.v1.Coordinator/RegisterNode", &req.base,
                           &fsdp__v1__register_node_reply__descriptor, (ProtobufCMessage **)&rep,
                           agent_until(fence_at, AGENT_CALL_S));
      if (!rc) {
        heard = 1;
        snprintf(node_id, sizeof node_id, "%s", rep->node_id);
        session = rep->session;
        if (rep->heartbeat_interval_ms) interval_ms = rep->heartbeat_interval_ms;
        fence_s = rep->fence_ms / 1000.0;
        registered = ever = 1;
        superseded = 0;
        pthread_mutex_lock(&a->mu);
        snprintf(a->node_id, sizeof a->node_id, "%s", node_id);
        a->session = session, a->registered = 1;
        pthread_mutex_unlock(&a->mu);
        size_t live = 0; /* those listed ended, their exit not reported yet, are not running */
        for (size_t i = 0; st && i < st->n_ranks; i++)
          live += st->ranks[i]->state != FSDP__V1__RANK_STATE__RANK_STATE_EXITED;
        LOG_INFO("fsdpd", "registered as node %s (session %llu, heartbeat every %u ms, %zu rank(s) "
                 "running, %zu ended with their exit still to report)", node_id,
                 (unsigned long long)session, interval_ms, live, (st ? st->n_ranks : 0) - live);
        agent_post(a, 0, &rep->base, NULL);
        protobuf_c_message_free_unpacked(&rep->base, NULL);
      }
    } else {
      what = "Heartbeat";
      Fsdp__V1__HeartbeatRequest empty = FSDP__V1__HEARTBEAT_REQUEST__INIT;
      Fsdp__V1__HeartbeatRequest *req = st ? st : &empty;
      char *their_id = req->node_id; /* put back before st is freed */
      req->node_id = node_id;
      req->session = session;
      Fsdp__V1__HeartbeatReply *rep = NULL;
      rc = rpc_client_call(a->o.client, "/fsdp.v1.Coordinator/Heartbeat", &req->base,
                           &fsdp__v1__heartbeat_reply__descriptor, (ProtobufCMessage **)&rep,
                           agent_until(fence_at, interval_ms / 1000.0 + AGENT_CALL_S));
      req->node_id = their_id;
      if (!rc) {
        if (rep->heartbeat_interval_ms) interval_ms = rep->heartbeat_interval_ms;
        /* "register again" is an answer from a coordinator that does not
         * count this node alive (it declared it dead, or restarted): the
         * fence runs on */
        heard = !rep->reregister;
        if (rep->reregister) {
          LOG_INFO("fsdpd", "the coordinator does not know node %s's session %llu (it restarted, "
                   "declared the node dead, or dropped more orders than the node took in time): "
                   "registering again", node_id,
                   (unsigned long long)session);
          registered = 0;
          pthread_mutex_lock(&a->mu);
          a->registered = 0;
          pthread_mutex_unlock(&a->mu);
        } else if (rep->n_assignments || rep->n_kills) {
          agent_post(a, 1, &rep->base, NULL);
        } else {
          quiet = 1;
        }
        protobuf_c_message_free_unpacked(&rep->base, NULL);
      }
    }
    const char *ranks_note = agent_ranks_note(ever, st);
    if (st) fsdp__v1__heartbeat_request__free_unpacked(st, NULL);
    pthread_mutex_lock(&a->mu);
    a->up = !rc;
    a->refusals += rc && agent_refusal(rc);
    pthread_mutex_unlock(&a->mu);
    /* a refusal is no answer either: the coordinator counts the node as
     * silent and runs its jobs elsewhere all the same */
    if (fence_at && !heard && agent_now() >= fence_at) {
      /* the coordinator has run this node's jobs elsewhere by now (or will
       * when it is back): ranks left running would write beside theirs */
      char why[768];
      snprintf(why, sizeof why, "no answer from the coordinator for %.0f s, past the %.0f s it "
               "gave (%s)", agent_now() - answered, fence_s,
               rc ? err_msg() : "it answers that it does not count this node alive");
      agent_post(a, 4, NULL, why);
      fenced = 1;
    }
    if (rc && agent_refusal(rc)) {
      /* a refusal is an operator's to fix: logged as an error, again each
       * minute while it stays (a transient failure's line comes once). The
       * first registration refused for refused_exit_s ends fsdpd (the loop
       * says why): no rank can run before it. A refusal may also pass (the
       * coordinator's token files read again, a clock set right), so it is
       * asked again meanwhile, each second until registered, then every 5 s. */
      const double now = agent_now();
      if (!refused_since) refused_since = now;
      if (ever && rc == FSDP_EEXIST && !superseded) {
        /* the name is another live fsdpd's now: the coordinator counted this
         * one's ranks as gone when it registered, so they run for no job */
        agent_post(a, 3, NULL, err_msg());
        superseded = 1;
      }
      if (!ever && a->o.refused_cb && now - refused_since >= a->o.refused_exit_s) {
        agent_post(a, 2, NULL, err_msg());
        if (agent_sleep(a, AGENT_REFUSED_MS)) break;
        continue;
      }
      if (strncmp(refusal, err_msg(), sizeof refusal - 1) || now - refusal_logged >= AGENT_REFUSED_LOG_S) {
        snprintf(refusal, sizeof refusal, "%s", err_msg());
        refusal_logged = now;
        if (superseded)
          LOG_ERROR("fsdpd", "the coordinator refused %s: %s; asking again every %d s (the ranks "
                    "were stopped)", what, refusal, AGENT_REFUSED_MS / 1000);
        else if (ever)
          LOG_ERROR("fsdpd", "the coordinator refused %s: %s; asking again every %d s%s", what,
                    refusal, AGENT_REFUSED_MS / 1000, ranks_note);
        else
          LOG_ERROR("fsdpd", "the coordinator refused %s: %s; asking again each second, and "
                    "stopping if it still refuses after %g s", what, refusal, a->o.refused_exit_s);
      }
      lost = 1;
      if (agent_sleep(a, agent_until_ms(fence_at, ever ? AGENT_REFUSED_MS : AGENT_BACKOFF_MAX_MS)))
        break;
      continue;
    }
    if (rc) {
      /* one line when the coordinator goes, one when it is back: not one per retry */
      if (!lost) LOG_WARN("fsdpd", "%s: %s; retrying every %d ms at most%s", what, err_msg(),
                          AGENT_BACKOFF_MAX_MS, ranks_note);
      lost = 1;
      /* unreachable: the next try on a new channel. One whose connects
       * failed sits out gRPC's reconnect backoff (1 s, growing 1.6 times a
       * try to 2 min), failing every call without trying, so a coordinator
       * back after 2 s was found 1 s late, after 10 s 6.5 s late: past the
       * fence, and every rank stopped, though it was down for less than its
       * restart grace. (A late answer, DEADLINE_EXCEEDED, keeps the
       * connection: a busy coordinator gets no handshakes on top.) */
      if (rc == FSDP_EUNAVAILABLE && rpc_client_reconnect(a->o.client))
        LOG_WARN("fsdpd", "%s", err_msg()); /* it keeps the channel it has */
      if (agent_sleep(a, agent_until_ms(fence_at, backoff))) break;
      backoff = backoff * 2 > AGENT_BACKOFF_MAX_MS ? AGENT_BACKOFF_MAX_MS : backoff * 2;
      continue;
    }
    if (lost) LOG_INFO("fsdpd", "the coordinator answers again (%s)", what);
    lost = 0;
    if (heard) {
      fenced = 0, answered = t0; /* the coordinator heard it when it was sent */
      /* the ranks' own fence, should this thread or the loop freeze; a
       * registration may change it either way (0: none) */
      char until[48];
      snprintf(until, sizeof until, "%llu %d",
               fence_s > 0 ? (unsigned long long)((answered + fence_s) * 1e9) : 0ull,
               what[0] == 'R');
      agent_post(a, 5, NULL, until);
    }
    refusal[0] = 0, refused_since = 0;
    backoff = AGENT_BACKOFF_MIN_MS;
    /* a coordinator should hold an empty heartbeat for its interval; one that
     * answers at once must not make this a busy loop */
    double spent_ms = 1e3 * (agent_now() - t0);
    if (quiet && spent_ms < 10 && agent_sleep(a, 10)) break;
  }
  pthread_mutex_lock(&a->mu);
  a->ended = 1;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

int agent_start(agent_t **out, const agent_opts_t *o) {
  agent_t *a = calloc(1, sizeof *a);
  if (!a) return err_set(FSDP_ENOMEM, "fsdpd: out of memory for the coordinator session");
  a->o = *o;
  a->o.state = NULL;
  if (o->state && !(a->state = malloc(o->state_len ? o->state_len : 1))) {
    free(a);
    return err_set(FSDP_ENOMEM, "fsdpd: out of memory for the node's state");
  }
  if (o->state) memcpy(a->state, o->state, a->state_len = o->state_len);
  pthread_mutex_init(&a->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_cond_init(&a->cv, &ca); /* CLOCK_REALTIME: agent_sleep's deadlines */
  pthread_condattr_destroy(&ca);
  uv_async_init(o->loop, &a->async, agent_async_cb);
  a->async.data = a;
  uv_unref((uv_handle_t *)&a->async); /* the session does not keep the loop alive: fsdpd's handles do */
  if (pthread_create(&a->thread, NULL, agent_main, a)) {
    uv_close((uv_handle_t *)&a->async, NULL);
    return err_set(FSDP_EINTERNAL, "fsdpd: cannot start the coordinator session's thread");
  }
  *out = a;
  return FSDP_OK;
}

void agent_health(agent_t *a, int *up, uint64_t *refusals) {
  pthread_mutex_lock(&a->mu);
  *up = a->up, *refusals = a->refusals;
  pthread_mutex_unlock(&a->mu);
}

int agent_publish(agent_t *a, const uint8_t *state, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return err_set(FSDP_ENOMEM, "fsdpd: out of memory for the node's state");
  memcpy(copy, state, len);
  pthread_mutex_lock(&a->mu);
  free(a->state);
  a->state = copy;
  a->state_len = len;
  pthread_mutex_unlock(&a->mu);
  return FSDP_OK;
}

int agent_leave(agent_t *a, rpc_client_t *via) {
  pthread_mutex_lock(&a->mu);
  a->stop = 1; /* no heartbeat after this one: the coordinator would say "register again" */
  pthread_cond_broadcast(&a->cv);
  char node_id[sizeof a->node_id];
  snprintf(node_id, sizeof node_id, "%s", a->node_id);
  const uint64_t session = a->session;
  const int registered = a->registered;
  pthread_mutex_unlock(&a->mu);
  if (!registered) return err_set(FSDP_ENOTFOUND, "not registered: nothing to tell");
  Fsdp__V1__HeartbeatRequest *st = agent_state(a);
  Fsdp__V1__HeartbeatRequest empty = FSDP__V1__HEARTBEAT_REQUEST__INIT;
  Fsdp__V1__HeartbeatRequest *req = st ? st : &empty;
  char *their_id = req->node_id; /* put back before st is freed */
  const size_t their_ranks = req->n_ranks;
  req->node_id = node_id;
  req->session = session;
  req->stopping = req->leaving = 1;
  /* every rank has ended and been reported: none is listed (the state last
   * published may be older than the last exits, and list them running) */
  req->n_ranks = 0;
  Fsdp__V1__HeartbeatReply *rep = NULL;
  int rc = rpc_client_call(via, "/fsdp.v1.Coordinator/Heartbeat", &req->base,
                           &fsdp__v1__heartbeat_reply__descriptor, (ProtobufCMessage **)&rep,
                           AGENT_LEAVE_S);
  req->node_id = their_id;
  req->n_ranks = their_ranks;
  if (st) fsdp__v1__heartbeat_request__free_unpacked(st, NULL);
  /* a coordinator that no longer knows the session (it restarted, or
   * declared the node dead) has nothing to be told */
  if (!rc && rep->reregister) rc = err_set(FSDP_ESTATE, "the coordinator does not know session %llu",
                                           (unsigned long long)session);
  else if (!rc && !rep->left) /* an older coordinator took it for a heartbeat */
    rc = err_set(FSDP_EUNSUPPORTED, "the coordinator is of a build that takes no leave");
  if (rep) protobuf_c_message_free_unpacked(&rep->base, NULL);
  return rc;
}

int agent_stop(agent_t *a, double wait_s) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  long ns = ts.tv_nsec + (long)((wait_s - (long)wait_s) * 1e9);
  ts.tv_sec += (time_t)wait_s + ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  pthread_mutex_lock(&a->mu);
  a->stop = 1;
  pthread_cond_broadcast(&a->cv);
  while (!a->ended && pthread_cond_timedwait(&a->cv, &a->mu, &ts) != ETIMEDOUT) {
  }
  int ended = a->ended;
  pthread_mutex_unlock(&a->mu);
  if (ended) pthread_join(a->thread, NULL);
  return ended;
}

static void agent_closed_cb(uv_handle_t *h) {
  agent_t *a = h->data;
  while (a->head) {
    agent_msg_t *m = a->head;
    a->head = m->next;
    free(m->data);
    free(m);
  }
  free(a->state);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  free(a);
}

void agent_destroy(agent_t *a) {
  if (a) uv_close((uv_handle_t *)&a->async, agent_closed_cb);
}

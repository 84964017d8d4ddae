/* agent: fsdpd's session with the coordinator, on a thread of its own.
 *
 * The thread registers the node (RegisterNode), then keeps exactly one
 * Heartbeat call in flight: the coordinator holds it until it has
 * assignments or kills for the node, or for heartbeat_interval_ms (the
 * call's deadline is that + 5 s). A reply with assignments or kills is
 * handed to the loop; one saying `reregister` makes the thread register
 * again, with the node id it had and the ranks it still runs. A coordinator
 * that is down or slow (UNAVAILABLE, DEADLINE_EXCEEDED, anything else) is
 * retried with a backoff of at most 1 s, and nothing is stopped meanwhile:
 * ranks outlive a coordinator restart. A refusal (agent_refusal: a token
 * or name the coordinator does not take) is logged as an error each minute
 * and asked again: each second before the node is first registered, and a
 * first registration still refused after refused_exit_s is handed to the
 * loop (refused_cb), which ends fsdpd (no rank can run before it); every
 * 5 s once registered, ranks running on, but for ALREADY_EXISTS: another
 * live fsdpd registered under this node's name meanwhile, so the
 * coordinator took the node's ranks for gone (their jobs fail over), and
 * the loop is told once (superseded_cb) to stop them.
 *
 * Threading: the thread owns nothing of the loop's. What it sends (devices
 * and rank statuses) is a packed HeartbeatRequest the loop publishes with
 * agent_publish (a mutex guards the bytes); what it receives goes to the
 * loop through a mutex-protected queue and a uv_async, and the callbacks run
 * on the loop's thread. Blocking calls never run on the loop. */
#ifndef FSDP_AGENT_H
#define FSDP_AGENT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/common/rpc.h"
#include "proto/fsdp.pb-c.h"

typedef struct agent agent_t;

typedef struct agent_opts {
  uv_loop_t *loop;
  /* the session's own, no other thread's: a coordinator it could not reach
   * is tried again on a new channel (rpc_client_reconnect), which needs no
   * call open on it */
  rpc_client_t *client;
  const char *hostname, *address, *version;
  /* the node's state for the first registration (see agent_publish); copied */
  const uint8_t *state;
  size_t state_len;
  /* on the loop: the node is registered as node_id (again, after a lost
   * session), its log tickets' key log_key (ticket.h; log_key_len 0: none) */
  void (*registered_cb)(void *arg, const char *node_id, const uint8_t *log_key,
                        size_t log_key_len);
  /* on the loop: the first RegisterNode was refused (agent_refusal) for
   * refused_exit_s (0: at once), the last time for the reason given */
  void (*refused_cb)(void *arg, const char *why);
  double refused_exit_s;
  /* on the loop: once registered, RegisterNode was refused ALREADY_EXISTS
   * (another live fsdpd holds the name); once per such refusal */
  void (*superseded_cb)(void *arg, const char *why);
  /* on the loop: no answer from the coordinator for longer than the fence
   * it gave at registration (RegisterNodeReply.fence_ms): the ranks must
   * stop; once per such silence */
  void (*fence_cb)(void *arg, const char *why);
  /* on the loop: the node's lease is now until_ns (CLOCK_BOOTTIME; 0:
   * none): when its fence ends unless the coordinator answers again (proto:
   * RankLease); after each answered call, registered set after a
   * registration (which may shorten or end it) */
  void (*lease_cb)(void *arg, uint64_t until_ns, int registered);
  /* on the loop: a heartbeat's reply with assignments or kills (owned by the agent) */
  void (*reply_cb)(void *arg, const Fsdp__V1__HeartbeatReply *rep);
  void *arg;
} agent_opts_t;

int agent_start(agent_t **out, const agent_opts_t *o);
/* 1 when a call's error code is the coordinator's refusal, not a failure
 * that passes: FSDP_EAUTH, FSDP_EPERM, FSDP_EEXIST (its name is another
 * live fsdpd's). */
int agent_refusal(int rc);
/* The node's state for the next RegisterNode or Heartbeat: a packed
 * HeartbeatRequest with devices and ranks (the agent adds node id and
 * session). Copied. */
int agent_publish(agent_t *a, const uint8_t *state, size_t len);
/* Whether the coordinator answered the session's last call, and how many
 * calls it refused (agent_refusal) since start. Any thread. */
void agent_health(agent_t *a, int *up, uint64_t *refusals);
/* fsdpd's last call, once every rank it ran has ended and its exit has been
 * reported (or given up): a heartbeat with leaving set, so that the
 * coordinator counts the node STOPPED at once, not dead at its heartbeat
 * timeout (a planned stop is no death: no alert, no fence). Ends the
 * session first. The call goes through via, a client of the coordinator
 * no other thread uses then: the session's own may be swapped for a new
 * channel by the agent thread (rpc_client_reconnect) while it ends.
 * Blocks up to 2 s; 0 when the coordinator took it (HeartbeatReply.left),
 * FSDP_ENOTFOUND when no session is registered (nothing to tell). */
int agent_leave(agent_t *a, rpc_client_t *via);
/* Asks the thread to end and waits up to wait_s for it: 1 when it ended (then
 * agent_destroy frees everything), 0 when it is still inside a call (the
 * caller then leaves it to process exit; see fsdpd.c). */
int agent_stop(agent_t *a, double wait_s);
/* After agent_stop returned 1; closes the async handle on the loop. */
void agent_destroy(agent_t *a);

#endif

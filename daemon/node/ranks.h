/* ranks: the rank processes fsdpd runs, from assignment to reported exit.
 *
 * A rank's life (every step on the loop's thread; blocking calls to the
 * coordinator run on libuv's thread pool, one call per work item, and their
 * results come back to the loop):
 *   WAITING     assigned; its device still holds processes of an earlier
 *               rank (a device is free only when they are all gone)
 *   RENDEZVOUS  a TCP listener bound on --rank-host, its "host:port"
 *               published with Rendezvous(group "world") until the
 *               coordinator answers complete (an ended attempt, ESTALE, or a
 *               Kill: given up, listener closed)
 *   RUNNING     job file written, RANK_PROGRAM --config rank-R.conf started
 *               through supervise (own session, its log file, as the run-as
 *               user, cwd its attempt directory) with FSDP_RANK,
 *               FSDP_WORLD_SIZE, FSDP_ADDRS (the payloads, in rank order),
 *               FSDP_LISTEN_FD=3, FSDP_REPORT_FD=4, FSDP_JOB_ID and
 *               FSDP_ATTEMPT (whose ring it is), FSDP_DEVICE_MEMORY_BYTES
 *               (its device's, its memory limit), FSDP_HOST_MEMORY_BYTES
 *               (its share of the host's) and, on CPU devices, FSDP_THREADS
 *               (on a GPU, FSDP_CUDA_DEVICE); its report frames read into
 *               its latest status
 *   EXITED      its process is reaped and its process group empty (polled
 *               in /proc, SIGKILLed again while not); ReportRankExit is
 *               retried until acknowledged, or ESTALE / NOT_FOUND
 * then it is forgotten. A rank that never started (refused assignment,
 * failed rendezvous or spawn, killed before it ran) is reported with exit
 * status RANKS_NOT_STARTED and the reason as its message.
 *
 * One supervise set per rank, so a Kill naming some ranks of a job stops
 * exactly those. */
#ifndef FSDP_RANKS_H
#define FSDP_RANKS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/common/metrics.h"
#include "daemon/common/rpc.h"
#include "daemon/node/inventory.h"
#include "proto/fsdp.pb-c.h"

#define RANKS_NOT_STARTED 127  /* exit status reported for a rank that never ran */
#define RANKS_REPORT_MAX (64u << 10) /* largest report frame accepted from a rank */

typedef struct ranks ranks_t;

typedef struct ranks_opts {
  uv_loop_t *loop;
  rpc_client_t *client;
  inventory_t *inv;        /* its GPUs' memory is measured again while idle (ranks.c) */
  const char *work_dir, *rank_program, *rank_host;
  int as_user;             /* run ranks as uid/gid */
  unsigned uid, gid;
  /* with as_user: HOME, USER and LOGNAME of that user, over fsdpd's own
   * (NULL-terminated; at most 3) */
  char *const *user_env;
  double grace_s;          /* SIGTERM -> SIGKILL when a Kill gives none */
} ranks_opts_t;

int ranks_create(ranks_t **out, const ranks_opts_t *o);
/* The node's id for Rendezvous and ReportRankExit (after each registration). */
void ranks_set_node_id(ranks_t *R, const char *node_id);
void ranks_assign(ranks_t *R, const Fsdp__V1__RankAssignment *a);
void ranks_kill(ranks_t *R, const Fsdp__V1__Kill *k);
/* A kill's grace this short is none: SIGKILL at once, no SIGTERM, so a rank
 * begins nothing more (not a checkpoint). The wire's 1 ms (Kill.grace_ms;
 * its 0 is the node's default). */
#define RANKS_NO_GRACE_S 0.001
/* Kills every rank (SIGTERM, SIGKILL after grace_s; 0: the ranks' grace;
 * RANKS_NO_GRACE_S: none), for reason; unlike ranks_stop_all, later
 * assignments still start. */
void ranks_kill_all(ranks_t *R, const char *reason, double grace_s);
/* The node's fence (the coordinator silent past the fence it gave): every
 * rank is SIGKILLed at once (no grace) and its exit reported as fenced
 * (ReportRankExitRequest.fenced, why its message), so the coordinator
 * requeues its job without spending a restart. A rank that ended itself at
 * the node's lease (JOB_EXIT_FENCED once the lease passed) is reported so
 * too. */
void ranks_fence(ranks_t *R, const char *why);
/* The node's lease (CLOCK_BOOTTIME ns, 0: none; proto: RankLease): sent to
 * every running rank when it is later than the last (or, reset, after a
 * registration, whatever it is), and to each rank as it starts. A rank ends
 * itself once the clock passes the last it got, so ranks stop at the fence
 * even when fsdpd cannot stop them (frozen). */
void ranks_lease(ranks_t *R, uint64_t until_ns, int reset);
/* 1 when something a heartbeat carries changed since the last ranks_pack. */
int ranks_dirty(const ranks_t *R);
/* A packed HeartbeatRequest with the devices (job_id set where processes
 * live) and every rank's latest status (malloc'd into *buf). */
int ranks_pack(ranks_t *R, uint8_t **buf, size_t *len);
/* 1 while rank (job, attempt, rank) may still write to its log. */
int ranks_log_active(const ranks_t *R, const char *job, uint32_t attempt, uint32_t rank);
/* Stops every rank (SIGTERM, SIGKILL after grace_s) and refuses new ones;
 * exit reports are then tried until report_deadline (loop time, ms). */
void ranks_stop_all(ranks_t *R, double grace_s, uint64_t report_deadline);
/* 1 when no rank is left: all exited and reported (or given up). */
int ranks_idle(const ranks_t *R);
/* After ranks_idle, or after the deadline: frees what is left (work in
 * flight finishes on the loop first: run it until it returns). */
void ranks_destroy(ranks_t *R);
/* 1 while a GPU is being measured again (it ends, or is given up, within
 * 10 s): wait for it before ranks_destroy. */
int ranks_measuring(const ranks_t *R);
/* Measurements of a GPU given up as the driver never answered whose call
 * is still out: a loop run until their work returns may never end. */
int ranks_measures_hung(void);
/* fsdpd's /metrics: its ranks by state, their exits by outcome, and each
 * running rank's latest report (metrics.h's rank families). */
void ranks_metrics(const ranks_t *R, metrics_buf_t *b);

#endif

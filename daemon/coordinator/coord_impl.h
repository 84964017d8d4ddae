/* coord_impl: what coord.c (state, liveness, scheduling, deliveries) and
 * coord_rpc.c (the handlers) share. Not for other modules. */
#ifndef FSDP_COORD_IMPL_H
#define FSDP_COORD_IMPL_H

#include <stdint.h>
#include <uthash.h>

#include "daemon/common/mem.h"
#include "daemon/common/metrics.h"
#include "daemon/common/rpc.h"
#include "daemon/common/ticket.h"
#include "daemon/coordinator/coord.h"
#include "daemon/coordinator/sched.h"
#include "daemon/job/ckpt.h"
#include "daemon/job/config.h"
#include "daemon/job/plan.h"
#include "daemon/job/shard.h"
#include "daemon/coordinator/store.h"
#include "proto/fsdp.pb-c.h"

#define COORD_CATS MEM__COUNT
#define COORD_RDV_HOLD_MS 1000 /* a rendezvous call is answered "not yet" after this */

/* Something a node is still to be told. */
typedef struct coord_order {
  int kill;                 /* 0: assign rank; 1: kill */
  int64_t job, epoch;
  int rank;                 /* assign: the rank; kill: -1 for every rank of the job there */
  int world, device, shard_group, replica_group;
  int grace_ms;
  char reason[256];
  uint64_t sent_ms;         /* an assignment sent: when (loop time) */
  int unseen;               /* heartbeats since, without the rank in them */
} coord_order_t;

#define COORD_NODE_DEVICES_MAX 4096 /* devices a node may register */
/* The ranks a node of ndev devices may list (a heartbeat's read, a
 * registration's most): a rank per device, and an earlier attempt's for a
 * while. More is not a node of ours, and each listed rank costs the store a
 * look. */
#define COORD_NODE_RANKS_MAX(ndev) (2 * (size_t)(ndev) + 16)
/* The orders a node of ndev devices may have queued (coord_order_push): a
 * kill and an assignment for each rank it may run. */
#define COORD_NODE_ORDERS_MAX(ndev) (2 * COORD_NODE_RANKS_MAX(ndev))

typedef struct coord_node {
  int64_t id;
  uint64_t session;         /* 0: not registered since this coordinator started */
  uint64_t instance;        /* the registered fsdpd process's (proto: instance; 0: unknown) */
  uint64_t heard_ms;        /* loop time of its last call (coord_node_heard) */
  uint64_t answered_ms;     /* loop time its held heartbeat was last answered */
  uint64_t deaf_heard_ms;   /* coord_t.deaf_ms then (coord_node_silent_ms) */
  uint64_t grace_until_ms;  /* the store had it alive at start: not dead before (loop time) */
  int awaited;              /* that, and it has not called since */
  int64_t heard_unix_ms;
  int dead;
  int stopping;             /* its fsdpd said it is shutting down: no new ranks (until it registers) */
  int stopped;              /* dead because its fsdpd stopped and said so (coord_node_gone) */
  rpc_call_t *poll;         /* its held heartbeat */
  uint64_t poll_until;      /* when it is answered: its slot */
  uint64_t slot;            /* loop time its next heartbeat is answered (0: none yet) */
  int held_pos;             /* 1 + its place in coord.held while poll is set; 0: not there */
  uint64_t held_seq;        /* arrival order among equal slots */
  struct coord *coord;      /* for its poll's cancel callback */
  coord_order_t *order;
  int n_order, cap_order;
  int resync;               /* its queue overflowed and was emptied: it registers again */
  coord_order_t *sent;      /* assignments sent and not yet seen in its heartbeats */
  int n_sent, cap_sent;
  int ndev;                 /* devices it registered with */
  struct {
    int index;
    uint64_t bytes; /* its memory, as the store has it */
    uint64_t used;  /* what its rank uses, as the last heartbeat said (ListNodes; not stored) */
  } offers[COORD_NODE_DEVICES_MAX];
  uint8_t log_key[TICKET_KEY_BYTES]; /* its log tickets' (ticket.h), new at each registration */
  /* devices it reports still running a job's processes, a bit each */
  uint64_t busy[COORD_NODE_DEVICES_MAX / 64];
} coord_node_t;

/* A rank's latest report, in coord_t.ranks by (job, rank). */
typedef struct coord_rank {
  int64_t key[2];           /* job, rank: the hash key */
  int64_t job, epoch, node;
  int rank, device, state;  /* state: Fsdp__V1__RankState */
  int64_t step;
  double loss, tokens_per_s;
  int reported;             /* step, loss and tokens_per_s are a report's (not a start's zeros) */
  int ncat;
  char cat[COORD_CATS][24];
  uint64_t cur[COORD_CATS], peak[COORD_CATS];
  uint64_t collective_seq;
  char collective_op[64];
  UT_hash_handle hh;
} coord_rank_t;

#define COORD_JOBS_KEPT 4096 /* facts of jobs not live kept in memory (coord_jobs_trim) */
#define COORD_ASSIGN_UNSEEN 3 /* heartbeats without a rank assigned before it is sent again */
#define COORD_STR_(x) #x
#define COORD_STR(x) COORD_STR_(x)


/* A hold (coord_hold_*): ranks of attempt epoch of job told to stop on
 * node, in coord_t.holds. */
typedef struct coord_hold {
  int64_t key[3];           /* job, epoch, node: the hash key */
  UT_hash_handle hh;
} coord_hold_t;

/* What the coordinator derives from a job's spec, once. */
#define COORD_EXPORT_MAX 2 /* exports at once (coord_export.c) */

/* Nodes a job's placement avoids after failures there, at most (the oldest
 * forgotten first). */
#define COORD_AVOID_MAX 8

typedef struct coord_job {
  int64_t id;
  int R, S, steps;
  char kind[8];                   /* the device kind every rank needs (config device) */
  uint64_t need;                  /* plan total per rank */
  uint64_t planned[COORD_CATS];   /* per category */
  int64_t rate_epoch, rate_step0; /* for the ETA: the first step seen this attempt... */
  uint64_t rate_t0;               /* ...and when */
  char failure[320];              /* the last one's reason, shown while it waits to restart */
  int preempted;                  /* ... which was a preemption, not a failure */
  shard_mesh_t mesh;
  char ckpt_dir[CONFIG_PATH_MAX]; /* checkpoint_dir ("": none) */
  int keep;                       /* keep_checkpoints */
  /* Why it waits (placement's note, with counts that change with every
   * device taken or freed): the store gets the first reason of each wait,
   * with its job.pending event; later ones stay here, where replies read
   * them, so a long queue does not rewrite every row and log an event per
   * job at each change of the cluster. All three reset by coord_job_changed. */
  uint64_t reason_sum;            /* XXH64 | 1 of the latest reason; 0: none yet */
  int reason_stored;              /* this wait's first reason is in the store */
  char *waiting;                  /* the latest, when the store's is older (heap); NULL */
  int live;                       /* scratch of coord_jobs_trim: pending or running */
  /* A node of its last attempt was declared dead: its fsdpd kills the ranks
   * it runs once the coordinator has been silent for the fence it gave
   * (restart_grace_ms), so the next attempt starts no sooner, lest the old
   * ranks write checkpoints beside it (coord_node_gone) */
  uint64_t fence_until;           /* loop time; 0: none */
  int64_t fence_node;
  /* Failures in a row, each within COORD_BACKOFF_RESET_MS of its attempt's
   * start: from the second on, the restart waits (coord_backoff). In
   * memory: a coordinator's restart forgets them, and a user's resume. */
  int fails;
  /* The node each of those failures is laid to (the failing rank's, the dead
   * one's), the latest last: the next placements put no rank there while
   * other nodes will do (sched_job_t.avoid); also in memory only */
  int64_t avoid[COORD_AVOID_MAX];
  int n_avoid;
  uint64_t started_ms;            /* loop time the last attempt was placed */
  uint64_t whole_since;           /* coord_fit's: waiting for devices being released since */
  uint64_t backoff_until;         /* loop time; 0: none */
  uint64_t sweep_said;            /* coord_reason_sum of what the last leftover sweep of its
                                     checkpoint_dir left and why (said once, not every round) */
  /* Its attempt ran through the coordinator's outage (running at start):
   * its nodes may have fenced its ranks, and a rank whose peer was fenced
   * fails on its own, perhaps reported first. Until coord_t.outage_until a
   * failure of it is held (coord_outage_hold), not settled: a fenced rank
   * reported meanwhile makes it a requeue that spends no restart. */
  int64_t outage_epoch;           /* that attempt (0: none) */
  /* cancel --checkpoint asked its ranks to checkpoint and stop: by then
   * (loop time: the grace and COORD_STOP_MARGIN_MS) what is left is killed
   * and the job CANCELLED (coord_stop_tick); 0: no stop asked. The store
   * keeps the stop (store_job_stop), so a restart does not requeue it. */
  uint64_t stop_until;
  int held;                       /* a failure of it is held: ... */
  int64_t held_node;              /* ... laid to this node, */
  char held_why[512];             /* ... for this reason */
  UT_hash_handle hh;              /* in coord_t.jobs, by id */
} coord_job_t;

typedef struct coord_watch {
  rpc_call_t *call;
  int64_t job, last_step;
  int last_state;
  struct coord_watch *next;
  struct coord *c;
} coord_watch_t;

/* A validated submit, stored with the others of its loop turn in one
 * transaction (one fsync for all: coord_submit_flush). */
typedef struct coord_submit {
  rpc_call_t *call;         /* NULL: cancelled before the flush */
  char *text;               /* the spec as stored */
  char name[STORE_NAME_MAX];
  char mesh[32];
  char request_id[64];
  char note[768];           /* the defaults resolution fitted, and config_check's notes */
  int world, max_restarts;
  coord_job_t facts;
} coord_submit_t;

typedef struct coord_rdv {
  rpc_call_t *call;
  int64_t job, epoch;
  char group[64];
  int expected;
  uint64_t until;
  struct coord_rdv *next;
  struct coord *c;
} coord_rdv_t;

/* How an attempt ended, for fsdp_attempts_ended_total{outcome}. */
typedef enum {
  COORD_ENDED_SUCCEEDED,
  COORD_ENDED_FAILED,
  COORD_ENDED_PREEMPTED,
  COORD_ENDED_CANCELLED,
  COORD_ENDED_N
} coord_ended_t;

struct coord {
  uv_loop_t *loop;
  coord_opts_t o;
  store_t *st;
  rpc_server_t *srv;
  rpc_server_t *health;     /* --health-listen: grpc.health.v1 alone, plaintext (NULL: none) */
  uv_timer_t tick;
  /* Held heartbeats: a binary min-heap by slot (then arrival), so holding,
   * answering and cancelling one are O(log n) wherever its slot lies (a
   * node answered early with news keeps a slot in the middle). `beat` fires
   * when the first falls due, to the millisecond, instead of on the next
   * tick (up to COORD_TICK_MS late, which alone broke the 10 ms goal). */
  struct coord_node **held;
  int n_held, cap_held;
  uint64_t held_seq;
  uv_timer_t beat;
  coord_node_t **node;      /* by id (ids are dense, from 1) */
  int64_t cap_node;
  coord_rank_t *ranks;      /* the ranks of live attempts heard from, by (job, rank) (uthash) */
  coord_job_t *jobs;        /* what is known of each job, by id (uthash; coord_job_info) */
  int jobs_live;            /* live jobs among them at the last trim (coord_jobs_trim) */
  store_node_t *pic;        /* every node and its devices as the store has them, by id: */
  int pic_n, pic_ok;        /* placement's picture, read again only where it changed */
  coord_watch_t *watch;
  coord_rdv_t *rdv;
  int dirty;                /* something changed that placement depends on */
  uint64_t started_ms;      /* loop time at start: a restarting job waits out the fence from here */
  uint64_t outage_until;    /* loop time: until then failures of attempts running at start are
                             * held (coord_job_t.outage_epoch) */
  int n_outage_held;        /* jobs with a failure held */
  int n_stopping;           /* jobs with coord_job_t.stop_until set */
  /* Ranks of an ended attempt told to stop (a kill order) on a node that has
   * not yet shown them gone: the job's next attempt waits until the node's
   * heartbeat lists none of them alive, or, silent, until its fence has
   * surely stopped them (coord_hold_*). */
  coord_hold_t *holds;      /* by (job, epoch, node) (uthash): adding one is O(1) */
  uint64_t fence_wake_ms;   /* the first coord_job_t.fence_until a waiting job has (0: none) */
  coord_submit_t *sub;      /* submits waiting for this loop turn's commit */
  int n_sub, cap_sub;
  /* submits whose files are checked on the pool (coord_rpc.c): those of the
   * turns since the batch before went, and the one batch on the pool */
  struct coord_checks *checks_next, *checks_running;
  uv_check_t flush;         /* runs coord_submit_flush after each turn's callbacks */
  int nodes_changed;        /* a node registered or died, or a device's offer changed, since
                             * dev_mem was read */
  /* the alive nodes' devices' memory by kind (cpu, cuda), largest first,
   * those that offer none (a full GPU) left out: what submits are admitted
   * against (coord_admit_memory) */
  uint64_t *dev_mem[2];
  int dev_n[2];
  uint64_t janitor_ms;      /* when coord_ckpt_janitor last ran */
  uint64_t tick_ms;         /* loop time of the last tick (coord_tick_cb), or of the store's opening */
  uint64_t deaf_ms;         /* how long the loop has been held up, in all, since start */
  uint64_t stall_logged_ms; /* when a stall was last logged (0: never) */
  int unsettled;            /* an attempt's end failed to be stored: the tick settles again */
  uint64_t settled_ms;      /* when it last tried */
  uint64_t purged_ms;       /* when the audit log's retention last ran (0: not yet) */
  int retained;             /* its first run applied every job's retention */
  struct coord_rm *removing; /* checkpoint directories being removed on the pool */
  struct coord_tally *tallies; /* aborted checkpoints of running attempts: shards reported */
  struct coord_rm_fail *rm_failed; /* ...and those whose removal failed, by dir (uthash) */
  struct coord_verify *verifying;  /* checkpoints a rank found damaged, being checked on the pool */
  struct coord_commit *committing; /* checkpoints being committed on the pool */
  /* Leftover step directories (coord_ckpt_janitor): one job's checkpoint_dir
   * swept on the pool at a time, the jobs visited by id, a round at most
   * every coord_ckpt_quiet_ms */
  struct coord_sweep *sweeping;
  int64_t sweep_after;      /* the last job visited this round (0: none yet) */
  uint64_t sweep_round_ms;  /* loop time the round began (0: none yet) */
  /* ExportCheckpoint: each running export, from its start until no pool task
   * reads its files any more; what it reads is kept from retention */
  struct coord_export *exports[COORD_EXPORT_MAX];
  /* for /metrics (coord_metrics.c), counted since this coordinator started */
  metrics_server_t *metrics;
  metrics_hist_t hb_late;   /* a held heartbeat's answer after its interval ended */
  metrics_hist_t sched;     /* a job's submit to its first attempt's placement */
  metrics_hist_t pass;      /* a placement pass (the loop answers nothing meanwhile) */
  metrics_hist_t commit;    /* a checkpoint's last shard report to its commit */
  uint64_t ckpt_commits, ckpt_aborts, restarts;
  uint64_t nodes_died; /* nodes declared dead (fsdp_nodes_declared_dead_total) */
  uint64_t ckpt_leftovers;  /* leftover step directories removed */
  uint64_t ckpt_aborted_removed; /* aborted checkpoints whose files were removed */
  uint64_t ended[COORD_ENDED_N]; /* attempts ended, by coord_ended_t */
  uint64_t ckpt_aborts_at_end; /* store_ckpt_aborted_at_end when coord_job_changed last looked */
};

/* coord.c, for the handlers */
int64_t coord_unix_ms(void);
uint64_t coord_mono_ms(coord_t *c);
/* How long after a node's last call its ranks are surely dead when it is
 * cut off (its fence and the margin its fsdpd kills them within). */
uint64_t coord_fence_ms(const coord_t *c);
coord_node_t *coord_node_get(coord_t *c, int64_t id, int create);
/* n called now: its silence starts again (heard_ms, heard_unix_ms). */
void coord_node_heard(coord_t *c, coord_node_t *n);
coord_rank_t *coord_rank_get(coord_t *c, int64_t job, int rank, int create);
/* What is known of a job: from coord_t.jobs (one lookup), else resolved from
 * its stored spec and kept there. NULL when that fails. The entry stays
 * where it is until the job leaves the store (retention). */
coord_job_t *coord_job_info(coord_t *c, int64_t job);
void coord_order_push(coord_t *c, int64_t node, const coord_order_t *o);
/* Ends n's held heartbeat without its orders (they stay queued), failing
 * it with ESTALE and why: a node that registers again has given it up (its
 * fsdpd keeps one call in flight), so orders sent on it would be lost. */
void coord_node_drop_poll(coord_t *c, coord_node_t *n, const char *why);
void coord_node_deliver(coord_t *c, coord_node_t *n);
/* A heartbeat of n listed these ranks: assignments sent to it that it
 * lists are confirmed; one it has not listed for COORD_ASSIGN_UNSEEN
 * heartbeats and 2 intervals (its answer was lost: a heartbeat answered
 * as fsdpd gave up on it) is sent again while its attempt runs. */
void coord_node_confirm(coord_t *c, coord_node_t *n, Fsdp__V1__RankStatus *const *ranks, size_t nr);
void coord_kill_attempt(coord_t *c, int64_t job, int64_t epoch, int64_t except_node, const char *why);
/* The same with a grace (ms) for the ranks: SIGTERM, each checkpoints at its
 * next step boundary and exits 75; SIGKILL after it (cancel --checkpoint). */
void coord_kill_attempt_grace(coord_t *c, int64_t job, int64_t epoch, int64_t except_node,
                              const char *why, int grace_ms);
/* A stop asked of job (cancel --checkpoint): COORD_STOP_GRACE_MS by default,
 * what is left killed COORD_STOP_MARGIN_MS after the grace. */
#define COORD_STOP_GRACE_MS 60000
#define COORD_STOP_GRACE_MAX_MS 3600000
#define COORD_STOP_MARGIN_MS 3000
void coord_stop_set(coord_t *c, coord_job_t *x, uint64_t until);
/* Registration: a rank of a stopping job it lists as running is told the
 * stop again (with the grace left): the coordinator may have restarted
 * before its order was delivered. */
void coord_stop_resend(coord_t *c, int64_t node, int64_t job, int64_t epoch, int rank);
/* Job's next attempt waits for node to show its ranks of attempt epoch
 * gone (or its fence to pass). */
void coord_hold_add(coord_t *c, int64_t job, int64_t epoch, int64_t node);
/* A heartbeat (or registration) of node n listed these ranks: the holds on
 * n whose attempt has no rank alive among them are released. */
void coord_hold_confirm(coord_t *c, const coord_node_t *n, Fsdp__V1__RankStatus *const *ranks,
                        size_t nr);
/* Both return 0, or the store's error when the attempt's end could not be
 * stored: then c->unsettled, and the tick settles every running attempt
 * whose ranks are done, by their verdict, every COORD_SETTLE_RETRY_MS until
 * the store takes it. */
/* node: the node the failure is laid to (the failing rank's, the dead
 * one's), which the job's next placements avoid; 0: none known. */
int coord_attempt_fail(coord_t *c, int64_t job, int64_t epoch, int64_t except_node, int64_t node,
                       const char *why);
int coord_attempt_settle(coord_t *c, int64_t job, int64_t epoch, store_attempt_verdict_t v,
                         int64_t node, const char *why, const char *what);
/* Drops what the job's ranks reported (its attempt ended). */
void coord_ranks_forget(coord_t *c, int64_t job);
/* Keeps in the store the figures the ranks of job's attempt epoch reported
 * (job 0: every rank's in memory), before they are forgotten. */
void coord_ranks_keep(coord_t *c, int64_t job, int64_t epoch);
/* The slowest rank's step of job's attempt epoch when every rank reported
 * one (memory, else the store's); -1 otherwise. */
int64_t coord_attempt_step(coord_t *c, int64_t job, int64_t epoch, int world);
void coord_schedule(coord_t *c);
/* Whether a placement pass is due (the tick runs one): something pending
 * jobs depend on changed since the last (c->dirty), or a fence one waits
 * out has passed. */
int coord_schedule_due(coord_t *c, uint64_t now);
/* The cluster as placement sees it: alive nodes (known to the store and
 * heard since this coordinator started) and their devices, a device held
 * while the store says a job holds it or while its node still reports
 * processes of an earlier job on it. */
typedef struct coord_pic {
  const store_node_t *nodes; /* coord_t.pic's: valid until the next coord_pic_load */
  int nn, nd;
  sched_node_t *sn;
  sched_device_t *sd;
  /* per device: held only because its node still reports ranks of an
   * attempt that has ended (they exit within a heartbeat or so) */
  char *freeing;
  uint64_t now;          /* loop time of the load */
  uint64_t wake;         /* coord_fit's: when a job's wait for devices being released ends
                            (0: none), for coord_pic_wake */
  uint64_t whole_wait_ms; /* how long a job waits for freeing devices to keep its groups whole */
} coord_pic_t;
/* Brings coord_t.pic (every node and its devices as the store has them) up
 * to date: the nodes the store says changed are read again, or all of them
 * the first time, after a failure, or when too many changed. */
int coord_pic_refresh(coord_t *c);
int coord_pic_load(coord_t *c, coord_pic_t *p);
void coord_pic_free(coord_pic_t *p);
/* A placement pass due when a wait coord_fit began on p ends (p->wake). */
void coord_pic_wake(coord_t *c, const coord_pic_t *p);
/* whole_since (NULL: never wait): when the job began to wait for devices
 * being released to keep its shard groups whole (0: not waiting), which
 * coord_fit sets, and clears once it places the job. */
int coord_fit(coord_pic_t *p, const coord_job_t *x, sched_slot_t *slot, char *note, size_t len,
              uint64_t *whole_since);
void coord_start(coord_t *c, const coord_pic_t *p, int64_t job, const coord_job_t *x,
                 const sched_slot_t *slot, const char *note);
/* A job's facts from its resolved config, plan and mesh; kept by id. */
void coord_job_facts(coord_job_t *x, const config_t *cfg, const plan_t *plan, const shard_mesh_t *m);
coord_job_t *coord_job_cache(coord_t *c, const coord_job_t *x);
/* coord_job_t.reason_sum of a pending reason (never 0). */
uint64_t coord_reason_sum(const char *why);
/* The reason a job in the store row j waits: the latest one placement gave
 * (coord_job_t.waiting) while it is PENDING, else the store's. */
const char *coord_job_reason(coord_t *c, const store_job_t *j);
void coord_job_changed(coord_t *c, int64_t job);
/* Where j stands: the slowest rank's last step of its latest attempt, ended
 * or not, when every rank of it reported one (the store keeps them past the
 * attempt's end and a restart); a succeeded job's last step; otherwise its
 * latest committed checkpoint (0: none). */
int64_t coord_job_step(coord_t *c, const store_job_t *j);
void coord_rdv_answer(coord_t *c, int64_t job, int64_t epoch, const char *group);
/* Calls held open: a node's heartbeat (long poll), a rendezvous waiting for
 * its group, a WatchJob stream. */
void coord_node_hold(coord_t *c, coord_node_t *n, rpc_call_t *call);
void coord_node_gone(coord_t *c, coord_node_t *n, uint64_t now, int stopped);
void coord_rdv_hold(coord_t *c, rpc_call_t *call, int64_t job, int64_t epoch, const char *group,
                    int expected);
void coord_watch_add(coord_t *c, rpc_call_t *call, int64_t job);
/* ids on the wire: "j-42", "n-3" */
void coord_id_str(char *buf, size_t len, char kind, int64_t id);
int64_t coord_id_parse(const char *s, char kind);
/* the job's spec, stored as INI text, as a JobSpec (coord_spec_free) */
int coord_spec_from_text(const char *text, Fsdp__V1__JobSpec *spec);
void coord_spec_free(Fsdp__V1__JobSpec *spec);
Fsdp__V1__JobState coord_job_state(store_job_state_t s);

/* coord_ckpt.c: ReportCheckpointShard and ListCheckpoints, and the
 * periodic work (commits a restart left, timeouts, removing aborted files) */
void coord_ckpt_report_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg);

/* coord_rpc.c, for coord_ckpt.c: a node's call about world rank `rank` of
 * job's attempt epoch is the node's to make. The rank must be placed on the
 * node the request names (node_id; else ENOTFOUND: the node gives up on
 * it), and with per-node tokens that node must be the caller's (else
 * EPERM). */
int coord_rank_is_callers(coord_t *c, rpc_call_t *call, const char *node_id, int64_t job,
                          int64_t epoch, int rank);
/* coord_rpc.c: text a node reports, made fit to repeat (see there). */
void coord_text_mend(char *s);
void coord_ckpt_list_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg);
void coord_ckpt_janitor(coord_t *c);
/* Keeps the newest keep committed checkpoints of job (keep <= 0: all),
 * removing older ones that no export is reading. */
void coord_ckpt_retain(coord_t *c, int64_t job, int keep);
/* Whether dir is being removed (on the pool). */
int coord_ckpt_removing(const coord_t *c, const char *dir);
/* Whether a commit or a removal of job's checkpoints, or a sweep of its
 * checkpoint_dir, is on the pool (the job is not placed meanwhile: a new
 * attempt could write where a removal works, or load what a commit's
 * retention removes). */
int coord_ckpt_busy(coord_t *c, int64_t job);
/* The coordinator goes: removals and commits still running forget it. */
void coord_ckpt_detach(coord_t *c);
/* What committed k, from the store: each shard's size and checksum as its
 * rank reported them (ckpt.h's reports, k->shards of them, by shard rank),
 * in *out, malloc'd. */
int coord_ckpt_reports(coord_t *c, const store_ckpt_t *k, ckpt_shard_report_t **out);
/* On the pool: the checkpoint in dir, found damaged by the coordinator,
 * moved out of its step's name, whole (ckpt_set_aside), so that an attempt
 * that resumes from an earlier one writes that step again (a rank refuses
 * to write under a manifest) and the janitor removes it later from where
 * it went; only when dir, resolved inside the roots, is still itself (the
 * coordinator moves nothing through a link). Its new name in to; else
 * to is "" and err (errlen) says why. */
int coord_ckpt_set_aside(const char *const *roots, int nroots, const char *dir, char *to,
                         size_t len, char *err, size_t errlen);
/* The committed checkpoint of job's step in dir, found damaged by the
 * coordinator itself (how: what it read), is ABORTED with the reason
 * "damaged: how": committed no more, logged and counted once; its files go
 * as an aborted checkpoint's do, from aside when coord_ckpt_set_aside moved
 * them there (NULL or "": it did not, kept says why), which is logged. */
void coord_ckpt_mark_damaged(coord_t *c, int64_t job, int64_t step, const char *how,
                             const char *dir, const char *aside, const char *kept);
/* 0 when no job still to run but self (stored, or in this turn's submits)
 * has checkpoint_dir dir; else an error naming it. */
int coord_ckpt_dir_free(coord_t *c, const char *dir, int64_t self);

/* coord_export.c: how many running exports read the checkpoint in dir
 * (0: none; else retention keeps it, and runs again when they end) */
int coord_export_reads(const coord_t *c, const char *dir);
/* Whether an export of job's checkpoints is running. */
int coord_export_of_job(const coord_t *c, int64_t job);
/* The coordinator goes: the exports still closing (their calls are
 * cancelled) forget it, and touch neither its store nor its retention. */
void coord_export_detach(coord_t *c);

/* coord_metrics.c: what /metrics shows (rendered on the loop) */
void coord_metrics_render(metrics_buf_t *b, void *arg);

/* coord_export.c: ExportCheckpoint */
void coord_export_cb(rpc_call_t *call, const ProtobufCMessage *req, void *arg);

/* coord_rpc.c */
int coord_rpc_register(coord_t *c);
/* The job a request names (*j: store_job_free it), or the call finished
 * with NOT_FOUND and its error returned. */
int coord_job_arg(coord_t *c, rpc_call_t *call, const char *id, store_job_t *j);
void coord_submit_flush(coord_t *c);
/* The coordinator goes: submits still to be checked are dropped (their
 * calls were cancelled), the batch on the pool is freed when it is back. */
void coord_submit_checks_detach(coord_t *c);

#endif

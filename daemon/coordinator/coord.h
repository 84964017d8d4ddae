/* coord: fsdp-coordinator's service: the Coordinator RPCs of proto/fsdp.proto
 * over the store (state on disk), the scheduler (placement) and the job
 * library (admission), on one libuv loop.
 *
 * What it keeps in memory, and why there: liveness (each node's last
 * heartbeat, so heartbeats write nothing), what each node is still to be told
 * (assignments and kills, delivered by its next heartbeat), the latest
 * progress and memory of every rank (what heartbeats carry, replaced each
 * time), and the calls it holds open (a heartbeat long poll per node,
 * rendezvous waiting for their group, WatchJob streams). After a restart all
 * of it is rebuilt from the store and from the nodes re-registering.
 *
 * Heartbeats are long polls: a node keeps one Heartbeat call in flight; the
 * coordinator answers at once when it has assignments or kills for the node
 * (so a placed rank reaches its node in the time of one reply), else after
 * the heartbeat interval. A node not heard for the heartbeat timeout is dead:
 * its jobs' attempts fail (restarting by their policy) and their other
 * ranks are killed.
 *
 * Threading: everything runs on the loop's thread (rpc.h's contract). */
#ifndef FSDP_COORD_H
#define FSDP_COORD_H

#include <uv.h>

typedef struct coord coord_t;

/* Restarts of a job failing again and again (coord_opts_t.restart_backoff_ms):
 * the longest wait, and how long an attempt must have run for its failure
 * to count as a first again. */
#define COORD_BACKOFF_MAX_MS (5 * 60 * 1000)
#define COORD_BACKOFF_RESET_MS (10 * 60 * 1000)

typedef struct coord_opts {
  const char *listen;            /* "127.0.0.1:7070"; port 0 picks one (coord_port) */
  const char *db;                /* SQLite file */
  const char *const *roots;      /* directories every job path must resolve inside */
  int nroots;
  const char *user_token_file;   /* both or neither (rpc.h) */
  const char *node_token_file;
  const char *operator_token_file; /* optional: DrainNode needs it (else the user's) */
  /* nodes' Kubernetes service account tokens (rpc.h, "Kubernetes nodes") */
  const char *node_jwks_file, *node_jwt_audience, *node_jwt_subject, *node_jwt_issuer;
  const char *tls_cert_file, *tls_key_file;
  int heartbeat_interval_ms;     /* 0: 1000 */
  int heartbeat_timeout_ms;      /* 0: 5000 */
  int restart_grace_ms;          /* nodes the store has alive at start are not declared dead
                                    before this (and the timeout) passed; 0: 3 x the timeout */
  int checkpoint_timeout_ms;     /* an open checkpoint missing a shard this long aborts; 0: 300000 */
  int restart_backoff_ms;        /* a job's attempt failing again within COORD_BACKOFF_RESET_MS
                                    of its start waits this before its restart, doubled at each
                                    more such failure, at most COORD_BACKOFF_MAX_MS (its first
                                    failure restarts at once); 0: 10000; < 0: none */
  int max_pending_jobs;          /* submits past this many PENDING jobs are refused; 0: 10000 */
  int sync_normal;               /* the store's synchronous=NORMAL (store.h) */
  const char *metrics_listen;    /* "0.0.0.0:9101": /metrics there (NULL: none) */
  const char *health_listen;     /* "0.0.0.0:7079": gRPC health alone, plaintext, no token, for
                                    probes that cannot speak TLS (kubelet's grpc:) (NULL: none) */
  int event_retention_days;      /* audit events older than this go; 0: 90; < 0: kept forever */
  int job_retention_days;        /* jobs ended longer ago go, with their rows; 0: kept forever */
} coord_opts_t;

/* What coord_create would refuse in o itself (option values, the token,
 * JWKS and TLS files they name, the listen addresses' form), checked before
 * anything opens: the operator's to fix, where a later failure is the run's. */
int coord_opts_check(const coord_opts_t *o);
/* Opens the store, reads back what was running, starts serving. */
int coord_create(coord_t **c, uv_loop_t *loop, const coord_opts_t *o);
/* Reads its token files again (SIGHUP): see rpc_server_reload_tokens. */
int coord_reload_tokens(coord_t *c);
int coord_port(const coord_t *c);
/* Jobs in state RUNNING (-1 when the store cannot say). */
int coord_running_jobs(coord_t *c);
/* Nodes registered since it started and neither dead nor stopped: a stop
 * with --stop-grace waits for them to say they leave (their fsdpd stopped
 * by the same signal). */
int coord_nodes_live(const coord_t *c);
/* Checkpoint commits still on the thread pool: a stop waits for them (their
 * last shard's report is answered with the outcome). */
int coord_commits_in_flight(const coord_t *c);
/* The /metrics port (0: not serving them). */
int coord_metrics_port(const coord_t *c);
/* Stops serving (calls in flight are cancelled) and closes the store. Run
 * the loop once more before uv_loop_close. */
void coord_destroy(coord_t *c);

#endif

/* store: the coordinator's cluster state, one SQLite database (WAL).
 *
 * It owns the connection, the schema and its migrations, and every write of
 * the cluster's state: each function below is one state change made in one
 * transaction (all of it or none), named after the change; no caller writes
 * SQL. It knows nothing of gRPC or protobuf: the coordinator translates
 * requests into these calls. It holds state, not policy, with one exception
 * kept here because it must be atomic with the attempt's end: whether a
 * failed attempt restarts (restarts < max_restarts).
 *
 * What is not here, on purpose: liveness. Heartbeat times live in the
 * coordinator's memory, so a heartbeat writes nothing; the store records a
 * node's last-seen time only when its state changes (registration, death).
 *
 * One store_t is used by one thread. Every function returns 0 or a negative
 * FSDP_E* code with err_msg() saying what failed (SQLite's codes are mapped:
 * SQLITE_BUSY -> FSDP_ETIMEDOUT, SQLITE_FULL -> FSDP_ENOSPC, a corrupt file
 * or one that is not a database -> FSDP_EFORMAT). Times are Unix milliseconds
 * from the store's clock; 0 means "not yet". Rows come back in caller-owned
 * structs: fixed-size text, and arrays the store allocates, freed by the
 * matching _free. The schema is docs/FORMATS.md's "Coordinator database". */
#ifndef FSDP_STORE_H
#define FSDP_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/common/ring_secret.h"

/* The schema version this build writes and reads (PRAGMA user_version). */
#define STORE_SCHEMA_VERSION 12

/* Text bounds: longer input is refused (EINVAL) so what is stored reads back
 * whole; reasons and event text are free text and are cut to fit on read. */
#define STORE_NAME_MAX 128    /* node, job, device and group names, with the NUL */
#define STORE_ADDR_MAX 256    /* a node's address */
#define STORE_MESH_MAX 32     /* "2x2" */
#define STORE_REASON_MAX 512  /* reasons and event text */
#define STORE_KIND_MAX 32     /* event kinds ("job.submitted") */
#define STORE_DRAIN_MAX 257   /* a node's drain reason */
#define STORE_PAYLOAD_MAX 65536 /* one rendezvous payload, bytes */
#define STORE_PATH_MAX 1100   /* a checkpoint's directory */

typedef struct store store_t;

/* ---- enums, stored as their names (readable with the sqlite3 shell) ---- */
#define STORE_NODE_STATES(XX) XX(ALIVE) XX(DEAD)
#define STORE_DEV_KINDS(XX) XX(cpu) XX(cuda)
#define STORE_JOB_STATES(XX) XX(PENDING) XX(RUNNING) XX(SUCCEEDED) XX(FAILED) XX(CANCELLED)
/* ASSIGNED: placed, its fsdpd not yet reported a process; RUNNING: it has;
 * SUCCEEDED/FAILED: exited (0 / otherwise); STOPPED: its attempt was ended
 * around it (another rank failed, cancel); LOST: its node died. */
#define STORE_RANK_STATES(XX) XX(ASSIGNED) XX(RUNNING) XX(SUCCEEDED) XX(FAILED) XX(STOPPED) XX(LOST)

typedef enum {
#define XX(x) STORE_NODE_##x,
  STORE_NODE_STATES(XX)
#undef XX
} store_node_state_t;
typedef enum {
#define XX(x) STORE_DEV_##x,
  STORE_DEV_KINDS(XX)
#undef XX
} store_dev_kind_t;
typedef enum {
#define XX(x) STORE_JOB_##x,
  STORE_JOB_STATES(XX)
#undef XX
} store_job_state_t;
typedef enum {
#define XX(x) STORE_RANK_##x,
  STORE_RANK_STATES(XX)
#undef XX
} store_rank_state_t;

const char *store_node_state_name(store_node_state_t s);
const char *store_dev_kind_name(store_dev_kind_t k);
const char *store_job_state_name(store_job_state_t s);
const char *store_rank_state_name(store_rank_state_t s);

/* ---- rows ---- */
typedef struct store_device {
  int64_t node_id;
  int index;                    /* the device's number on its node */
  store_dev_kind_t kind;
  char name[STORE_NAME_MAX];    /* "NVIDIA H100 80GB HBM3", "cpu" */
  uint64_t memory_bytes;
  int64_t job_id;               /* the job holding it; 0: free */
} store_device_t;

typedef struct store_node {
  int64_t id;
  char name[STORE_NAME_MAX];
  char address[STORE_ADDR_MAX]; /* where its fsdpd listens */
  store_node_state_t state;
  int64_t registered_ms;        /* first registration */
  int64_t last_seen_ms;         /* at its last state change (not every heartbeat) */
  char drain_reason[STORE_DRAIN_MAX]; /* drained by an operator: why ("": takes ranks) */
  int stopped;                  /* DEAD because its fsdpd stopped and said so, not silent */
  int n_devices;
  store_device_t *devices;      /* by index; freed by store_nodes_free */
} store_node_t;

/* What a job is submitted with (validated by the coordinator before). */
typedef struct store_job_spec {
  const char *name;
  const char *spec;             /* the job's key = value options, as text */
  int world_size;
  const char *mesh;             /* "R x S" as the spec gave it, e.g. "2x2" */
  int max_restarts;
  const char *reason;           /* why it waits, known at submit (NULL: none yet) */
  const char *request_id;       /* the client's idempotency key (NULL or "": none); unique */
  const char *checkpoint_dir;   /* its resolved checkpoint_dir (NULL or "": none) */
} store_job_spec_t;

typedef struct store_job {
  int64_t id;
  char name[STORE_NAME_MAX];
  char *spec;                   /* store_job_get only (NULL from store_job_list) */
  int world_size;
  char mesh[STORE_MESH_MAX];
  store_job_state_t state;
  char reason[STORE_REASON_MAX]; /* why PENDING / FAILED / CANCELLED ("" when none) */
  int max_restarts;
  int restarts;                 /* attempts restarted so far */
  int64_t epoch;                /* the current (or last) attempt; 0 before the first */
  int64_t submitted_ms, started_ms, ended_ms; /* started: the first attempt */
} store_job_t;

/* Where one rank of an attempt runs (store_attempt_start's input). */
typedef struct store_placement {
  int rank;
  int64_t node_id;
  int device_index;
  int shard_group;              /* which S-way shard group (0 .. R-1) */
  int replica_group;            /* which replica group (0 .. S-1) */
} store_placement_t;

#define STORE_RANK_MEMORY_MAX 640 /* "name=cur/peak" for each of mem.h's categories */

typedef struct store_rank {
  int64_t job_id;
  int64_t epoch;
  int rank;
  int64_t node_id;
  int device_index;
  int shard_group, replica_group;
  store_rank_state_t state;
  int has_exit;                 /* exit_status is known */
  int exit_status;              /* exit code, or -signal */
  int64_t pid;                  /* 0 until its fsdpd reports the process */
  /* its memory as its exit report gave it ("" : none yet): the coordinator's
   * text (coord_rpc.c), opaque here */
  char memory[STORE_RANK_MEMORY_MAX];
  /* the figures it last reported (store_rank_figures), 0 when reported is 0 */
  int reported;
  int64_t step;
  double loss, tokens_per_s;
} store_rank_t;

/* A rank's figures from one report of it (a heartbeat's or its exit
 * report's): its step, and the loss and tokens/s of that step (a NaN loss is
 * kept as one). */
typedef struct store_figures {
  int64_t job_id, epoch;
  int rank;
  int64_t step;
  double loss, tokens_per_s;
} store_figures_t;

typedef struct store_event {
  int64_t id;                   /* ascending: a reader resumes after the last it saw */
  int64_t time_ms;
  int64_t job_id, node_id;      /* 0: none */
  char kind[STORE_KIND_MAX];
  char text[STORE_REASON_MAX];
} store_event_t;

/* One payload of a rendezvous group. */
typedef struct store_rendezvous_entry {
  int rank;
  size_t len;
  unsigned char *data;
} store_rendezvous_entry_t;

typedef struct store_rendezvous {
  int complete;                 /* every expected rank has put */
  int n;                        /* payloads present, by rank ascending */
  store_rendezvous_entry_t *entry;
} store_rendezvous_t;

/* What a rank's exit means for its attempt. */
typedef enum {
  STORE_ATTEMPT_GOING = 0,  /* ranks still running, none failed */
  STORE_ATTEMPT_SUCCEEDED,  /* every rank exited 0: end it as SUCCEEDED */
  STORE_ATTEMPT_FAILED,     /* a rank failed or was lost: stop the others, end it as FAILED */
  STORE_ATTEMPT_ENDED,      /* the attempt was already ended: nothing to do */
  STORE_ATTEMPT_PREEMPTED,  /* every rank is gone, none failed, some stopped on SIGTERM
                             * (JOB_EXIT_PREEMPTED): requeue it (store_attempt_requeue) */
  STORE_ATTEMPT_FENCED,     /* a rank was stopped by its node's fence (store_rank_fenced),
                             * whatever the others did since (a peer gone breaks their
                             * ring): stop the others and requeue it, no restart spent */
} store_attempt_verdict_t;

/* ---- checkpoints ----
 * A job's checkpoint of one step: OPEN from its first shard's report,
 * COMMITTED once every shard is in and the committer wrote its manifest,
 * ABORTED on a timeout, a bad shard, a shard its rank could not write (at
 * once, opened ABORTED when that is the first word of it) or the end of
 * its attempt. The files of an aborted one are removed by the coordinator
 * when no attempt of the job runs, or while its attempt runs once every
 * shard of it was reported (removed = 1 then). */
#define STORE_CKPT_STATES(XX) XX(OPEN) XX(COMMITTED) XX(ABORTED)
typedef enum {
#define XX(s) STORE_CKPT_##s,
  STORE_CKPT_STATES(XX)
#undef XX
} store_ckpt_state_t;
const char *store_ckpt_state_name(store_ckpt_state_t s);

typedef struct store_ckpt {
  int64_t job_id, step, epoch;
  store_ckpt_state_t state;
  int shards, reported;         /* shards expected, and reported so far */
  uint64_t bytes;               /* of the shards reported */
  char dir[STORE_PATH_MAX];
  int64_t opened_ms, closed_ms; /* closed: committed or aborted (0: open) */
  char reason[STORE_REASON_MAX];/* why it was aborted */
  int removed;                  /* an aborted one's files are gone */
} store_ckpt_t;

typedef struct store_ckpt_shard {
  int shard, rank;
  uint64_t bytes, sum;          /* sum: the shard header's XXH64 */
} store_ckpt_shard_t;

/* Records shard sh of job's checkpoint of step (written under dir, of
 * shards shards) from attempt epoch, fenced: an older epoch or an ended
 * attempt is FSDP_ESTALE. The first shard opens the checkpoint (replacing an
 * aborted one, or one an older attempt left open). A shard reported again
 * with the same checksum changes nothing; with another, FSDP_EEXIST. A
 * committed or aborted checkpoint takes no shard (FSDP_ESTATE). *out: the
 * checkpoint after it. */
int store_ckpt_report(store_t *st, int64_t job_id, int64_t epoch, int64_t step, int shards,
                      const char *dir, const store_ckpt_shard_t *sh, store_ckpt_t *out);
/* Job's committed checkpoint of step is damaged (the coordinator checked
 * it: coord_ckpt.c): it is ABORTED with reason (starting "damaged:") and a
 * checkpoint.damaged event, so it is not the job's latest, retention and
 * exports pass it by, its files go once no attempt runs, and its step may
 * be written again: a newer attempt's report of that step opens a new row,
 * and this one is kept beside it, reason and all (store_ckpt_list lists
 * both). dir not NULL: where its files are now (set aside). One not
 * committed is left as it is (*changed 0; 1: this call). reason NULL:
 * nothing changes, the checkpoint is only read. epoch not 0: fenced as
 * store_ckpt_report (the attempt whose ranks said so must run). None of
 * that step is FSDP_ENOTFOUND. *out: the checkpoint after it. */
int store_ckpt_damaged(store_t *st, int64_t job_id, int64_t epoch, int64_t step,
                       const char *reason, const char *dir, store_ckpt_t *out, int *changed);
/* A shard of job's checkpoint of step (under dir, of shards shards) that
 * its rank could not write, reported by attempt epoch (fenced as
 * store_ckpt_report): the checkpoint is ABORTED at once with reason and a
 * checkpoint.aborted event, as store_ckpt_close aborts. One this attempt
 * has not opened is opened ABORTED (replacing, as a shard does, what an
 * older attempt left open or aborted); one this attempt aborted already
 * stays as it is, and *aborted is 0 (1: this call aborted it). A committed
 * checkpoint is FSDP_ESTATE. *out: the checkpoint after it. */
int store_ckpt_fail(store_t *st, int64_t job_id, int64_t epoch, int64_t step, int shards,
                    const char *dir, const char *reason, store_ckpt_t *out, int *aborted);
/* Job's checkpoint of step (the latest attempt's, not one found damaged
 * and written again) in *out: 1, or 0 when there is none; < 0 on a store
 * error. */
int store_ckpt_get(store_t *st, int64_t job_id, int64_t step, store_ckpt_t *out);
/* The shards reported for a checkpoint, by shard. */
int store_ckpt_shards(store_t *st, int64_t job_id, int64_t step, store_ckpt_shard_t **shards,
                      int *n);
/* OPEN -> COMMITTED (reason NULL) or ABORTED (with reason), with an event:
 * the checkpoint of step written by attempt epoch. FSDP_ESTATE when it is
 * not open (or a later attempt's row replaced it). */
int store_ckpt_close(store_t *st, int64_t job_id, int64_t step, int64_t epoch,
                     const char *abort_reason);
/* A job's checkpoints by step (job_id 0: every job's), newest first; of
 * one step, the newest attempt's first (before a damaged one it wrote
 * again). */
int store_ckpt_list(store_t *st, int64_t job_id, store_ckpt_t **ckpts, int *n);
/* Checkpoints aborted because their attempt ended first (store_attempt_end,
 * store_attempt_requeue, store_job_cancel: each with a checkpoint.aborted
 * event), since the store was opened. */
uint64_t store_ckpt_aborted_at_end(const store_t *st);
/* How job's attempt epoch ended: its outcome (SUCCEEDED, FAILED or
 * CANCELLED: a cancel or a preemption's requeue) and reason, cut to fit:
 * 1, or 0 when it has not ended (or never was); < 0 on a store error. */
int store_attempt_ended(store_t *st, int64_t job_id, int64_t epoch, char *outcome,
                        size_t outcome_len, char *reason, size_t reason_len);
/* The step of a job's latest committed checkpoint; 0: none; -1: the store failed. */
int64_t store_ckpt_last_committed(store_t *st, int64_t job_id);
/* Checkpoints the coordinator still has work on: OPEN ones (to commit or
 * time out) and ABORTED ones whose files are not removed yet. */
int store_ckpt_pending(store_t *st, store_ckpt_t **ckpts, int *n);
/* An aborted checkpoint's files are gone (removed = 1); or, forget: a
 * committed one retention removed, whose row goes too. Attempt epoch's row
 * only: one a later attempt put there is left alone. */
int store_ckpt_removed(store_t *st, int64_t job_id, int64_t step, int64_t epoch, int forget);

/* What a restore found of the ids the replaced database had handed out.
 * Ids leave the coordinator (users and scripts hold job ids, fsdpd names
 * its work directories jobs/<job id>/<attempt>, fsdpctl events --follow
 * pages by event id), so the restored database hands out none again: its
 * jobs, nodes and events continue above the highest the replaced database
 * had handed out (sqlite_sequence, max(id)), and each job's next attempt
 * above the last the replaced database knew of it. When those cannot be
 * read (no such database, a new or empty file, a damaged one), they are
 * unknown: a gap is left (STORE_RESTORE_GAP ids, STORE_RESTORE_EPOCH_GAP
 * attempts of each job) and known is 0. */
#define STORE_RESTORE_GAP 1000000
#define STORE_RESTORE_EPOCH_GAP 1000
typedef struct store_restore_info {
  int known;            /* 1: the replaced database's ids were read; 0: a gap was left */
  int64_t next_job;     /* the first ids the restored database hands out */
  int64_t next_node;
  int64_t next_event;   /* the event that records the restore (store.restored) */
  int64_t lost_jobs;    /* jobs created after the backup (not in it) */
  int64_t lost_nodes;   /* nodes registered after it */
  int64_t lost_events;  /* events written after it */
  int64_t lost_attempts; /* attempts of the backup's jobs started after it */
  int64_t lost_checkpoints; /* checkpoints of the backup's jobs committed after it */
  char *report;         /* lines for the operator saying what was lost (free()); NULL if none */
} store_restore_info_t;

/* ---- opening ---- */
typedef struct store_opts {
  int busy_timeout_ms;          /* a second writer waits this long; 0: 5000 */
  int sync_normal;              /* 1: synchronous=NORMAL (see store.c); 0: FULL */
  int version;                  /* migrate up to this version only (0: the latest);
                                   tests make an older release's database with it */
} store_opts_t;

/* Operations on the database that failed (a full disk, an I/O error, a
 * damaged file, a lock held by another program), since it was opened; each
 * is logged (at most one line every 10 s). */
uint64_t store_errors(const store_t *st);

/* Opens or creates the database at path and migrates it to
 * STORE_SCHEMA_VERSION, one transaction per step. Refuses (EFORMAT, naming the
 * file) a file that is not a SQLite database, a database of another program,
 * and one from a newer schema, leaving the file as it was. One store per
 * database: the open holds an exclusive flock on PATH-lock (the holder's pid
 * inside) until store_close or the process's end, and a second open while it
 * is held is refused (ESTATE, naming the pid and the lock file). ":memory:"
 * takes none. opts may be NULL. */
int store_open(const char *path, const store_opts_t *opts, store_t **out);
/* Closes; a transaction left open is a bug and aborts naming where it began. */
void store_close(store_t *st);
/* The schema version the file had when opened (0: created by this open). */
int store_schema_from(const store_t *st);
/* An online backup of the database at path into a new file out, while a
 * coordinator may be writing it: SQLite's backup API copies one consistent
 * snapshot (one read transaction; WAL lets the writer go on). The copy is
 * written under a temporary name, checked (PRAGMA quick_check), fsynced and
 * renamed, so out is whole or absent; an existing out is refused, and so is
 * a path that is not an fsdp-coordinator database. *version: its schema. */
int store_backup(const char *path, const char *out, int *version);
/* Replaces the database at path with the backup at backup, for a
 * coordinator to start on: refused (ESTATE) while a store holds path's lock,
 * and (EFORMAT or ENOENT, both files left as they were) for a backup that is
 * not an fsdp-coordinator database, of a newer schema, or damaged, and for a
 * path holding another program's database or no SQLite database. Written
 * through SQLite (the log a killed coordinator left is folded into path,
 * then every page overwritten in one transaction), so path is the backup
 * exactly, with no log left to be replayed over it, or, on any failure, as
 * it was; fsynced with its directory, mode 0600. *version: the backup's
 * schema; *had_wal: 1 when path had a log (FILE-wal) beforehand. The
 * restored database never hands out an id path had handed out (see
 * store_restore_info_t, filled when info is not NULL): it is raised in the
 * same transaction as the copy, and records the restore as an event. */
int store_restore(const char *path, const char *backup, int *version, int *had_wal,
                  store_restore_info_t *info);

/* ---- nodes ---- */
/* Registers a node by name (a known name is updated: address, devices, ALIVE
 * again) with its devices; a device it no longer reports is dropped unless a
 * job holds it. Returns its id in *node_id. */
int store_node_register(store_t *st, const char *name, const char *address,
                        const store_device_t *devices, int n_devices, int64_t *node_id);
/* Sets what device index of a node offers (its memory_bytes: a GPU's free
 * memory, measured again by its fsdpd), with an event when it changes.
 * ENOTFOUND for a device the node did not register. */
int store_device_memory(store_t *st, int64_t node_id, int index, uint64_t bytes);
/* The id of the node named name in *node_id (0 when none is), its address
 * in address (cap bytes, cut to fit). */
int store_node_find(store_t *st, const char *name, int64_t *node_id, char *address, size_t cap);
/* Drains a node (reason: why, non-empty, under STORE_DRAIN_MAX): it gets no
 * new ranks, what runs there runs on, and it stays drained across its
 * re-registrations and the coordinator's restarts; reason NULL or ""
 * undrains it. An event when it changes. ENOTFOUND for an unknown node. */
int store_node_drain(store_t *st, int64_t node_id, const char *reason);
/* How many nodes are drained (-1 when the store cannot say). */
int64_t store_nodes_drained(store_t *st);
/* Marks a node DEAD, heard last at last_seen_ms (stopped: its fsdpd stopped
 * and said so, a planned stop; else it went silent); its ranks still
 * assigned or running become LOST. The distinct jobs they belonged to,
 * every one, in *jobs (store_array_free), their number in *n_jobs. */
int store_node_mark_dead(store_t *st, int64_t node_id, int64_t last_seen_ms, int stopped,
                         int64_t **jobs, int *n_jobs);

/* ---- jobs and attempts ---- */
/* Stores a new job as PENDING; its id in *job_id. */
int store_job_submit(store_t *st, const store_job_spec_t *spec, int64_t *job_id);
/* Stores n new jobs in one transaction, all or none; their ids in job_ids[].
 * Group commit: one sync for the submits of one turn of the coordinator's
 * loop, each answered after it (under synchronous=FULL every commit is an
 * fsync; docs/ARCHITECTURE.md has the rates). */
int store_job_submit_batch(store_t *st, const store_job_spec_t *specs, int n, int64_t *job_ids);
/* Records why each of n jobs waits, in one transaction: reasons[i] for
 * ids[i], written (with a job.pending event) only where it changed and the
 * job is still PENDING (any other is left alone). */
int store_jobs_set_pending_reasons(store_t *st, const int64_t *ids, const char *const *reasons,
                                   int n);
/* Starts the next attempt of a PENDING job: epoch + 1, RUNNING, its
 * world_size ranks ASSIGNED to the given devices, which become held by the
 * job. All or nothing: a device unknown (ENOTFOUND), held, or on a dead node
 * (ESTATE) changes nothing. The new epoch in *epoch. */
int store_attempt_start(store_t *st, int64_t job_id, const store_placement_t *ranks, int n,
                        int64_t *epoch);
/* The ring secret store_attempt_start drew for attempt epoch of a job, for
 * its ranks' assignments; ENOTFOUND when the attempt has none (ended: its
 * secret is cleared then; started before schema version 8) or does not
 * exist. */
int store_attempt_secret(store_t *st, int64_t job_id, int64_t epoch,
                         uint8_t secret[RING_SECRET_BYTES]);
/* A rank's process runs with this pid (ASSIGNED -> RUNNING): ESTALE for an
 * attempt not live, ENOTFOUND for a rank the attempt does not have on
 * node_id. */
int store_rank_running(store_t *st, int64_t job_id, int64_t epoch, int rank, int64_t node_id,
                       int64_t pid);
/* A rank's process ended with exit_status (0: success; a code; -signal),
 * with its memory (store_rank_t.memory; NULL or "": leaves what is stored)
 * and the figures it ended at (NULL: none reported; kept as
 * store_rank_figures keeps them; its job_id, epoch and rank are these).
 * *verdict says whether the attempt is over and how. A report for an older
 * epoch is refused with FSDP_ESTALE. */
int store_rank_exit(store_t *st, int64_t job_id, int64_t epoch, int rank, int exit_status,
                    const char *memory, const store_figures_t *figures,
                    store_attempt_verdict_t *verdict);
/* store_rank_exit for a rank its node stopped at its fence (the coordinator
 * silent past the fence it gave: ReportRankExitRequest.fenced): the rank is
 * STOPPED with exit_status as it ended (-9, or the lease's
 * JOB_EXIT_FENCED), and the verdict is STORE_ATTEMPT_FENCED from then on. */
int store_rank_fenced(store_t *st, int64_t job_id, int64_t epoch, int rank, int exit_status,
                      const char *memory, const store_figures_t *figures,
                      store_attempt_verdict_t *verdict);
/* Keeps the figures ranks last reported, with their rows, in one
 * transaction: the coordinator has them in memory and writes them where
 * they would be lost (as an attempt ends, at a cancel, as it stops), never
 * per report. A figure of an older step than the one kept is passed over,
 * as is one of a rank no attempt has (its job purged). */
int store_rank_figures(store_t *st, const store_figures_t *f, int n);
/* The verdict store_rank_exit gave on the job's current attempt, read again
 * (ENDED when the job does not run), its epoch in *epoch: a coordinator
 * stopped between a rank's exit and the attempt's end finishes it at start. */
int store_attempt_verdict(store_t *st, int64_t job_id, int64_t *epoch,
                          store_attempt_verdict_t *verdict);
/* Ends the running attempt `epoch` of a job. succeeded: the job SUCCEEDED.
 * Otherwise it FAILED for reason, and goes back to PENDING with restarts + 1
 * when restarts < max_restarts. Either way ranks still alive become STOPPED,
 * the job's devices are freed, the attempt's rendezvous data dropped and its
 * open checkpoints still missing a shard ABORTED (one with every shard in is
 * left to its committer). The job's new state in *state (may be NULL).
 * FSDP_ESTALE for an older epoch or an attempt already ended. */
/* Ends a running attempt whose ranks were stopped from outside (a node
 * shutting down: preemption) as CANCELLED with reason, and puts the job back
 * to PENDING without spending a restart: it resumes from its latest
 * committed checkpoint when placed again. */
int store_attempt_requeue(store_t *st, int64_t job_id, int64_t epoch, const char *reason);
int store_attempt_end(store_t *st, int64_t job_id, int64_t epoch, int succeeded,
                      const char *reason, store_job_state_t *state);
/* cancel --checkpoint: a RUNNING job's ranks are to checkpoint and stop
 * (FSDP_ESTATE for a job in another state). Kept with the job (its time,
 * until_ms (unix ms) when the coordinator kills what is left, and reason),
 * so that a coordinator restarted meanwhile does the same: however its
 * attempt ends (store_attempt_requeue, store_attempt_end but for success),
 * the job is CANCELLED, never requeued nor restarted, its reason saying
 * whether the stop's checkpoint was committed. Asked again, the first
 * stands. Its attempt in *epoch (may be NULL). */
int store_job_stop(store_t *st, int64_t job_id, const char *reason, int64_t until_ms,
                   int64_t *epoch);
/* The stop asked of job (store_job_stop): when, and until when (unix ms);
 * both 0 when none is (a resume forgets it); its reason in reason (len
 * bytes; NULL: not wanted). */
int store_job_stopping(store_t *st, int64_t job_id, int64_t *stop_ms, int64_t *until_ms,
                       char *reason, size_t len);
/* The reason a stopped job (store_job_stop) ends with, its attempt epoch
 * over (how: how it ended, for when no checkpoint came of the stop): the
 * step its stop's checkpoint kept, or the latest committed; 0 (why
 * untouched) when no stop was asked. */
int store_job_stop_reason(store_t *st, int64_t job_id, int64_t epoch, const char *how, char *why,
                          size_t len);
/* A FAILED or CANCELLED job back to PENDING with its restarts reset (its
 * next attempt resumes from its latest committed checkpoint); FSDP_ESTATE
 * for a job still pending, running or succeeded. checkpoint_dir: its
 * resolved one, recorded for store_jobs_by_checkpoint_dir (a job that
 * ended before schema 6 has none recorded); NULL: left as it is. */
int store_job_resume(store_t *st, int64_t job_id, const char *checkpoint_dir);
/* Cancels a PENDING or RUNNING job (a running attempt ends CANCELLED as
 * above). The state it had in *was (may be NULL): RUNNING means its ranks
 * must be stopped. An ended job: ESTATE. */
int store_job_cancel(store_t *st, int64_t job_id, const char *reason, store_job_state_t *was);

/* ---- rendezvous, fenced by epoch ---- */
/* Publishes a rank's payload in a group of the job's running attempt (again:
 * replaced). An older epoch or an ended attempt: FSDP_ESTALE (the rank
 * should give up); a rank not in the attempt: ENOTFOUND. */
int store_rendezvous_put(store_t *st, int64_t job_id, int64_t epoch, const char *group, int rank,
                         const void *payload, size_t len);
/* The group's payloads; complete when `expected` ranks have put (the caller
 * knows the group's size from the mesh). An older epoch: FSDP_ESTALE. Free
 * with store_rendezvous_free. */
int store_rendezvous_get(store_t *st, int64_t job_id, int64_t epoch, const char *group,
                         int expected, store_rendezvous_t *out);
void store_rendezvous_free(store_rendezvous_t *r);

/* ---- the audit log ---- */
/* Adds an event (job_id, node_id: 0 for none). The state changes above add
 * their own; this is for what the coordinator sees besides. */
int store_event_add(store_t *st, int64_t job_id, int64_t node_id, const char *kind,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Removes events older than before_ms (Unix ms), the oldest first, at most
 * max of them in this one transaction (a pass stays short; call again while
 * *removed == max). *removed may be NULL. Events dated more than
 * STORE_CLOCK_AHEAD_MS after now (written while the clock was set ahead)
 * that were written before an event older than the cut go with it. */
#define STORE_CLOCK_AHEAD_MS (24 * 3600 * 1000LL)
int store_event_purge(store_t *st, int64_t before_ms, int max, int *removed);
/* Events of one job (job_id > 0) or all, oldest first, at most limit of
 * them (limit <= 0: no bound): those with id > after_id, or with after_id
 * STORE_EVENTS_NEWEST the newest limit. */
#define STORE_EVENTS_NEWEST (-1)
int store_event_list(store_t *st, int64_t job_id, int64_t after_id, int limit,
                     store_event_t **events, int *n);

/* ---- readers ---- */
/* The job submitted with request_id (a client's idempotency key), or
 * ENOTFOUND. */
int store_job_by_request(store_t *st, const char *request_id, int64_t *job_id);
/* ENOTFOUND for an unknown id; free with store_job_free. */
int store_job_get(store_t *st, int64_t job_id, store_job_t *job);
void store_job_free(store_job_t *job);
/* The jobs whose state is in states (a mask of 1 << store_job_state_t; 0:
 * any) and whose id is below before_id (<= 0: any), the newest limit of
 * them (0: all), by id (spec left NULL); free with store_jobs_free. */
#define STORE_JOB_BIT(s) (1u << (s))
int store_job_list(store_t *st, unsigned states, int64_t before_id, int limit, store_job_t **jobs,
                   int *n);
/* Retention of ended jobs. store_job_purgeable: the ids (malloc'd; free
 * them) of at most max jobs that ended (SUCCEEDED, FAILED, CANCELLED)
 * before before_ms, the earliest ended first (ids are AUTOINCREMENT: a
 * removed one is never handed out again). store_job_purge: removes those jobs with
 * everything of theirs (attempts, ranks, rendezvous, checkpoints' rows,
 * events) in one transaction, with one event of no job (jobs.removed)
 * naming them; no file is touched. A job not ended (or still holding a
 * device) is refused (ESTATE) and nothing is removed. */
int store_job_purgeable(store_t *st, int64_t before_ms, int max, int64_t **ids, int *n);
int store_job_purge(store_t *st, const int64_t *ids, int n);
/* How many jobs are in each state (indexed by store_job_state_t). */
int store_job_counts(store_t *st, int64_t counts[STORE_JOB_CANCELLED + 1]);
void store_jobs_free(store_job_t *jobs, int n);
/* A live job that may use a checkpoint directory. */
typedef struct store_job_dir {
  int64_t id;
  store_job_state_t state;
  int dir_unknown; /* stored before schema 6: its spec says (the caller resolves it) */
} store_job_dir_t;
/* The PENDING and RUNNING jobs (any_state: every job the store keeps) whose
 * checkpoint_dir is dir, and the live ones whose directory the store does
 * not know, by id, through the jobs_checkpoint_dir index; free(*jobs). */
int store_jobs_by_checkpoint_dir(store_t *st, const char *dir, int any_state,
                                 store_job_dir_t **jobs, int *n);
/* A job whose checkpoint directory the coordinator sweeps for leftover step
 * directories (coord_ckpt_janitor). */
typedef struct store_job_ckpt_dir {
  int64_t id;
  store_job_state_t state;
  char dir[STORE_PATH_MAX];     /* its resolved checkpoint_dir */
  int64_t ended_ms;             /* its last attempt's end; 0: none ran, or it runs */
} store_job_ckpt_dir_t;
/* The first job after after_id (by id) with a checkpoint_dir recorded;
 * FSDP_ENOENT when there is none. */
int store_job_ckpt_dir_next(store_t *st, int64_t after_id, store_job_ckpt_dir_t *out);
/* The ids of the jobs in state, ascending (placement's walk over the
 * pending ones); free(*ids). */
int store_job_ids(store_t *st, store_job_state_t state, int64_t **ids, int *n);
/* Every node by id with its devices; free with store_nodes_free. */
int store_node_list(store_t *st, store_node_t **nodes, int *n);
/* The nodes of ids that exist, with their devices, by id (as store_node_list
 * gives them); free with store_nodes_free. */
int store_nodes_get(store_t *st, const int64_t *ids, int n_ids, store_node_t **nodes, int *n);
/* The nodes whose row or devices changed since the last call (a node
 * registered, drained, declared dead; a device taken or freed), in *ids
 * (free(); repeats possible), or *all = 1 when too many changed to list:
 * then read every node. What lets the coordinator keep the cluster's
 * picture in memory and read only what changed. */
void store_nodes_touched(store_t *st, int64_t **ids, int *n, int *all);
void store_nodes_free(store_node_t *nodes, int n);
/* Devices no job holds, on ALIVE nodes, by (node, index). */
int store_free_devices(store_t *st, store_device_t **devices, int *n);
/* The node rank `rank` of job's attempt epoch was placed on: its id and
 * name (name_cap bytes at most). ENOTFOUND when the attempt has no such rank. */
int store_rank_node(store_t *st, int64_t job_id, int64_t epoch, int rank, int64_t *node_id,
                    char *name, size_t name_cap);
/* The ranks placed on a node by running jobs' current attempts, still
 * ASSIGNED or RUNNING: what it should be running (reconciling after a
 * coordinator restart, or when the node re-registers). */
int store_ranks_of_node(store_t *st, int64_t node_id, store_rank_t **ranks, int *n);
/* The ranks of one attempt (epoch 0: the job's current one), by rank. */
int store_ranks_of_job(store_t *st, int64_t job_id, int64_t epoch, store_rank_t **ranks, int *n);
/* The figures kept of the ranks of job's attempt epoch that have any, by
 * rank (a lighter read than store_ranks_of_job, for listings). */
int store_rank_figures_of(store_t *st, int64_t job_id, int64_t epoch, store_figures_t **figures,
                          int *n);
/* Frees an array from store_free_devices, store_ranks_of_*, store_rank_figures_of,
 * store_event_list. */
void store_array_free(void *array);

#endif

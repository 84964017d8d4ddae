/* store: the coordinator's state in SQLite (see store.h).
 *
 * It owns the one connection, the schema (the SQL text below, one script per
 * version) and the helpers every state change goes through: a transaction
 * opened by store_begin(), which remembers the file and line that opened it,
 * and closed by store_end(), which commits or rolls back (Fossil's
 * db_begin_transaction / db_end_transaction); statements prepared once from
 * their SQL text and cached; small query helpers (st_int, st_exec, ...). A
 * failure inside a transaction is sticky (st->rc): the first one is kept, the
 * helpers after it do nothing, and store_end rolls back and returns it. */
#include "daemon/coordinator/store.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/log.h"
#include "daemon/job/job.h"

/* PRAGMA application_id: "FSDP". Tells our database from another program's. */
#define STORE_APP_ID 0x46534450
#define STORE_STMT_MAX 128
#define STORE_BUSY_MS 5000

/* ---- the schema ---------------------------------------------------------
 * store_migrations[v] takes a database from version v to v + 1, in one
 * transaction with the user_version it reaches. Never edit a released step:
 * add the next one (and say what it changes in docs/FORMATS.md).
 * States are stored as their names, checked by the table; times are Unix ms. */
static const char store_schema_v1[] =
    "CREATE TABLE nodes(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  name TEXT NOT NULL UNIQUE,\n"
    "  address TEXT NOT NULL,\n"
    "  state TEXT NOT NULL CHECK(state IN ('ALIVE','DEAD')),\n"
    "  registered_ms INTEGER NOT NULL,\n"
    "  last_seen_ms INTEGER NOT NULL\n"
    ");\n"
    /* AUTOINCREMENT: a job id is what users type; never reuse one */
    "CREATE TABLE jobs(\n"
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,\n"
    "  name TEXT NOT NULL,\n"
    "  spec TEXT NOT NULL,\n"
    "  world_size INTEGER NOT NULL CHECK(world_size > 0),\n"
    "  mesh TEXT NOT NULL,\n"
    "  state TEXT NOT NULL\n"
    "    CHECK(state IN ('PENDING','RUNNING','SUCCEEDED','FAILED','CANCELLED')),\n"
    "  reason TEXT NOT NULL DEFAULT '',\n"
    "  max_restarts INTEGER NOT NULL CHECK(max_restarts >= 0),\n"
    "  restarts INTEGER NOT NULL DEFAULT 0,\n"
    "  epoch INTEGER NOT NULL DEFAULT 0,\n"
    "  submitted_ms INTEGER NOT NULL,\n"
    "  started_ms INTEGER,\n"
    "  ended_ms INTEGER\n"
    ");\n"
    "CREATE INDEX jobs_state ON jobs(state);\n"
    "CREATE TABLE devices(\n"
    "  node_id INTEGER NOT NULL REFERENCES nodes(id),\n"
    "  idx INTEGER NOT NULL CHECK(idx >= 0),\n"
    "  kind TEXT NOT NULL CHECK(kind IN ('cpu','cuda')),\n"
    "  name TEXT NOT NULL,\n"
    "  memory_bytes INTEGER NOT NULL CHECK(memory_bytes >= 0),\n"
    "  job_id INTEGER REFERENCES jobs(id),\n"
    "  PRIMARY KEY(node_id, idx)\n"
    ") WITHOUT ROWID;\n"
    "CREATE INDEX devices_job ON devices(job_id) WHERE job_id IS NOT NULL;\n"
    "CREATE TABLE attempts(\n"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),\n"
    "  epoch INTEGER NOT NULL CHECK(epoch > 0),\n"
    "  started_ms INTEGER NOT NULL,\n"
    "  ended_ms INTEGER,\n"
    "  outcome TEXT CHECK(outcome IN ('SUCCEEDED','FAILED','CANCELLED')),\n"
    "  reason TEXT NOT NULL DEFAULT '',\n"
    "  PRIMARY KEY(job_id, epoch)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE ranks(\n"
    "  job_id INTEGER NOT NULL,\n"
    "  epoch INTEGER NOT NULL,\n"
    "  rank INTEGER NOT NULL CHECK(rank >= 0),\n"
    "  node_id INTEGER NOT NULL REFERENCES nodes(id),\n"
    "  device_idx INTEGER NOT NULL,\n"
    "  shard_group INTEGER NOT NULL,\n"
    "  replica_group INTEGER NOT NULL,\n"
    "  state TEXT NOT NULL\n"
    "    CHECK(state IN ('ASSIGNED','RUNNING','SUCCEEDED','FAILED','STOPPED','LOST')),\n"
    "  exit_status INTEGER,\n"
    "  pid INTEGER,\n"
    "  PRIMARY KEY(job_id, epoch, rank),\n"
    "  FOREIGN KEY(job_id, epoch) REFERENCES attempts(job_id, epoch)\n"
    ") WITHOUT ROWID;\n"
    "CREATE INDEX ranks_node ON ranks(node_id, state);\n"
    "CREATE TABLE rendezvous(\n"
    "  job_id INTEGER NOT NULL,\n"
    "  epoch INTEGER NOT NULL,\n"
    "  group_name TEXT NOT NULL,\n"
    "  rank INTEGER NOT NULL,\n"
    "  payload BLOB NOT NULL,\n"
    "  PRIMARY KEY(job_id, epoch, group_name, rank),\n"
    "  FOREIGN KEY(job_id, epoch, rank) REFERENCES ranks(job_id, epoch, rank)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE events(\n"
    "  id INTEGER PRIMARY KEY,\n"
    "  time_ms INTEGER NOT NULL,\n"
    "  job_id INTEGER REFERENCES jobs(id),\n"
    "  node_id INTEGER REFERENCES nodes(id),\n"
    "  kind TEXT NOT NULL,\n"
    "  text TEXT NOT NULL\n"
    ");\n"
    "CREATE INDEX events_job ON events(job_id) WHERE job_id IS NOT NULL;\n";

/* Version 2: a submit's idempotency key is stored with its job, so a
 * client retrying after a coordinator restart finds the job it made. */
static const char store_schema_v2[] =
    "ALTER TABLE jobs ADD COLUMN request_id TEXT;\n"
    "CREATE UNIQUE INDEX jobs_request_id ON jobs(request_id) WHERE request_id IS NOT NULL;\n";

/* Version 3: checkpoints, and the shards each rank reported. */
static const char store_schema_v3[] =
    "CREATE TABLE checkpoints(\n"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),\n"
    "  step INTEGER NOT NULL,\n"
    "  epoch INTEGER NOT NULL,\n"
    "  state TEXT NOT NULL CHECK(state IN ('OPEN', 'COMMITTED', 'ABORTED')),\n"
    "  shards INTEGER NOT NULL,\n"
    "  dir TEXT NOT NULL,\n"
    "  opened_ms INTEGER NOT NULL,\n"
    "  closed_ms INTEGER NOT NULL DEFAULT 0,\n"
    "  reason TEXT NOT NULL DEFAULT '',\n"
    "  removed INTEGER NOT NULL DEFAULT 0,\n"
    "  PRIMARY KEY(job_id, step)\n"
    ") WITHOUT ROWID;\n"
    "CREATE INDEX checkpoints_open ON checkpoints(state) WHERE state = 'OPEN';\n"
    "CREATE TABLE checkpoint_shards(\n"
    "  job_id INTEGER NOT NULL,\n"
    "  step INTEGER NOT NULL,\n"
    "  shard INTEGER NOT NULL,\n"
    "  rank INTEGER NOT NULL,\n"
    "  bytes INTEGER NOT NULL,\n"
    "  sum INTEGER NOT NULL,\n"
    "  PRIMARY KEY(job_id, step, shard),\n"
    "  FOREIGN KEY(job_id, step) REFERENCES checkpoints(job_id, step)\n"
    ") WITHOUT ROWID;\n";

/* Version 4: ended jobs by end time, for their retention (store_job_purge). */
static const char store_schema_v4[] =
    "CREATE INDEX jobs_ended ON jobs(ended_ms) WHERE ended_ms IS NOT NULL;\n";

/* Version 5: a node drained by an operator gets no new ranks (its reason). */
static const char store_schema_v5[] =
    "ALTER TABLE nodes ADD COLUMN drain_reason TEXT NOT NULL DEFAULT '';\n";

/* Version 6: each job's checkpoint directory, indexed, so that a submit finds
 * the live job that already uses one without reading every live job
 * (store_jobs_by_checkpoint_dir). Jobs stored before it: '' once ended (no
 * longer in the way), NULL while live (the coordinator reads their spec). */
static const char store_schema_v6[] =
    "ALTER TABLE jobs ADD COLUMN checkpoint_dir TEXT;\n"
    "UPDATE jobs SET checkpoint_dir = '' WHERE state NOT IN ('PENDING', 'RUNNING');\n"
    "CREATE INDEX jobs_checkpoint_dir ON jobs(checkpoint_dir);\n";

/* Version 7: a rank's memory as its exit report gave it (the run's peaks),
 * for fsdpctl memory once its attempt has ended. */
static const char store_schema_v7[] =
    "ALTER TABLE ranks ADD COLUMN memory TEXT NOT NULL DEFAULT '';\n";

/* Version 8: each attempt's ring secret (RING_SECRET_BYTES drawn at its
 * start; NULL for one started before), which its ranks prove to each other. */
static const char store_schema_v8[] = "ALTER TABLE attempts ADD COLUMN ring_secret BLOB;\n";

/* Version 9: a checkpoint found damaged (ABORTED, its reason "damaged: ...")
 * whose step a newer attempt writes again leaves checkpoints, which holds one
 * row per step, for here: kept with its reason, its shards' count and bytes,
 * and its directory (set aside) until the janitor removes that. */
static const char store_schema_v9[] =
    "CREATE TABLE checkpoints_damaged(\n"
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),\n"
    "  step INTEGER NOT NULL,\n"
    "  epoch INTEGER NOT NULL,\n"
    "  shards INTEGER NOT NULL,\n"
    "  dir TEXT NOT NULL,\n"
    "  opened_ms INTEGER NOT NULL,\n"
    "  closed_ms INTEGER NOT NULL,\n"
    "  reason TEXT NOT NULL,\n"
    "  removed INTEGER NOT NULL DEFAULT 0,\n"
    "  reported INTEGER NOT NULL,\n"
    "  bytes INTEGER NOT NULL,\n"
    "  PRIMARY KEY(job_id, step, epoch)\n"
    ") WITHOUT ROWID;\n";

/* Version 10: a DEAD node whose fsdpd stopped and said so (a planned stop:
 * systemctl stop, a reboot, the end of a Slurm allocation), told apart from
 * one that went silent. Registration clears it. */
static const char store_schema_v10[] =
    "ALTER TABLE nodes ADD COLUMN stopped INTEGER NOT NULL DEFAULT 0;\n";

/* Version 11: the figures a rank last reported (one report's step, loss and
 * tokens/s), kept at its exit report and as its attempt ends, so that they
 * outlive the coordinator's memory (a restart, an attempt ended by a node's
 * death). NULL step: none reported (every row of before); a NULL loss or
 * tokens/s beside a step is a NaN (SQLite stores NaN as NULL). */
static const char store_schema_v11[] =
    "ALTER TABLE ranks ADD COLUMN step INTEGER;\n"
    "ALTER TABLE ranks ADD COLUMN loss REAL;\n"
    "ALTER TABLE ranks ADD COLUMN tokens_per_s REAL;\n";

/* Version 12: a stop asked with cancel --checkpoint (store_job_stop): when,
 * until when its ranks may take to checkpoint, and the cancel's reason. A
 * coordinator restarted during the stop ends the job CANCELLED as asked,
 * never requeued (NULL: none asked; every row of before). */
static const char store_schema_v12[] =
    "ALTER TABLE jobs ADD COLUMN stop_ms INTEGER;\n"
    "ALTER TABLE jobs ADD COLUMN stop_until_ms INTEGER;\n"
    "ALTER TABLE jobs ADD COLUMN stop_reason TEXT;\n";

static const char *const store_migrations[] = {store_schema_v1, store_schema_v2, store_schema_v3,
                                               store_schema_v4, store_schema_v5, store_schema_v6,
                                               store_schema_v7, store_schema_v8, store_schema_v9,
                                               store_schema_v10, store_schema_v11, store_schema_v12};
_Static_assert(sizeof store_migrations / sizeof store_migrations[0] == STORE_SCHEMA_VERSION,
               "one migration per schema version");

struct store {
  sqlite3 *db;
  char path[1024];
  int lock_fd;          /* PATH-lock, flock'ed while open (-1: an in-memory store) */
  int busy_ms;
  int from_version;
  const char *txn_file; /* where the open transaction began; NULL: none open */
  int txn_line;
  int committing;       /* store_end is committing (the commit hook's permission) */
  int rc;               /* the first failure inside the open transaction */
  int txn_ckpt_aborts;  /* checkpoints the open transaction aborted as their attempt ended */
  uint64_t ckpt_aborts_at_end; /* ... and those committed, since the store was opened */
  uint64_t errors;      /* failures of the database (store_sqlite_err), since it was opened */
  int64_t err_logged_ms; /* when the last of them was logged */
  int open;             /* store_open returned it: its failures are logged (opening's are the caller's) */
  int64_t *touched;     /* nodes whose row or devices changed since store_nodes_touched */
  int n_touched, cap_touched;
  int touched_all;      /* more than STORE_TOUCHED_MAX (or no memory): every node counts */
  int64_t event_sane_id; /* store_event_purge: the first event dated sensibly after future-dated ones */
  struct {
    const char *sql;    /* the statement's text, by address: SQL here is literals */
    sqlite3_stmt *stmt;
  } cache[STORE_STMT_MAX];
  int n_cache;
};

/* ---- enum names ---- */
#define STORE_STR(x) #x,
#define STORE_NAMES(fn, type, LIST)                                           \
  static const char *const fn##_tab[] = {LIST(STORE_STR)};                    \
  const char *fn(type v) {                                                    \
    return (unsigned)v < sizeof fn##_tab / sizeof fn##_tab[0] ? fn##_tab[v] : "?"; \
  }
STORE_NAMES(store_node_state_name, store_node_state_t, STORE_NODE_STATES)
STORE_NAMES(store_dev_kind_name, store_dev_kind_t, STORE_DEV_KINDS)
STORE_NAMES(store_job_state_name, store_job_state_t, STORE_JOB_STATES)
STORE_NAMES(store_rank_state_name, store_rank_state_t, STORE_RANK_STATES)

/* A stored name back to its enum; the tables' CHECKs keep them known. */
static int st_enum(const char *const *tab, int n, const unsigned char *text) {
  for (int i = 0; text && i < n; i++)
    if (strcmp(tab[i], (const char *)text) == 0) return i;
  return 0;
}
#define ST_ENUM(fn, text) st_enum(fn##_tab, (int)(sizeof fn##_tab / sizeof fn##_tab[0]), (text))

static int64_t store_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- SQLite's codes, mapped at the boundary ---- */
#define STORE_ERR_LOG_MS 10000 /* a failing database is logged at most this often */
static int store_sqlite_err(store_t *st, int rc, const char *sql) {
  const char *msg = st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc);
  int code;
  switch (rc & 0xff) {
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    code = err_set(FSDP_ETIMEDOUT,
                   "state database %s: locked by another connection for over %d ms (%s): "
                   "is another fsdp-coordinator using this file?",
                   st->path, st->busy_ms, msg);
    break;
  case SQLITE_FULL:
    code = err_set(FSDP_ENOSPC, "state database %s: the disk is full (%s): free space there",
                   st->path, msg);
    break;
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB:
    code = err_set(FSDP_EFORMAT,
                   "state database %s is damaged or not a database (%s): restore it from a "
                   "backup, or start on a new file",
                   st->path, msg);
    break;
  case SQLITE_NOMEM:
    code = err_set(FSDP_ENOMEM, "state database %s: out of memory", st->path);
    break;
  case SQLITE_IOERR:
  case SQLITE_CANTOPEN:
  case SQLITE_READONLY:
  case SQLITE_PERM:
  case SQLITE_PROTOCOL:
    code = err_set(FSDP_EIO, "state database %s: %s (check the file and its directory)",
                   st->path, msg);
    break;
  default: /* a constraint the store failed to check first, or bad SQL: a bug here */
    code = err_set(FSDP_EINTERNAL, "state database %s: %s (in: %.200s)", st->path, msg,
                   sql ? sql : "?");
    break;
  }
  /* a full disk or a damaged file is the operator's to fix: said in the
   * coordinator's own log, not only to the caller (a node, a user), at most
   * every STORE_ERR_LOG_MS, and counted (fsdp_store_errors_total) */
  st->errors++;
  const int64_t now = store_now_ms();
  if (st->open && now - st->err_logged_ms >= STORE_ERR_LOG_MS) {
    LOG_ERROR("store", "%s (%llu failure(s) of the database since it was opened)", err_msg(),
              (unsigned long long)st->errors);
    st->err_logged_ms = now;
  }
  return code;
}

uint64_t store_errors(const store_t *st) { return st->errors; }

/* Records the first failure of the open transaction; returns it. */
static int st_fail(store_t *st, int code) {
  if (!st->rc) st->rc = code;
  return st->rc;
}

/* ---- transactions ---- */

/* SQLite calls this before any commit: only store_end may commit, so a COMMIT
 * run any other way becomes a rollback (and a bug to find). */
static int store_commit_hook(void *arg) {
  store_t *st = arg;
  if (st->committing) return 0;
  LOG_ERROR("store", "a commit outside store_end (transaction opened at %s:%d): rolled back",
            st->txn_file ? st->txn_file : "?", st->txn_line);
  return 1;
}

/* Opens a transaction (write: BEGIN IMMEDIATE, which takes the write lock now,
 * so a second writer waits busy_timeout here rather than failing mid-way). A
 * transaction still open is a forgotten store_end: a bug, named by where it
 * began. */
#define store_begin(st, write) store_begin_at((st), (write), __FILE__, __LINE__)
static int store_begin_at(store_t *st, int write, const char *file, int line) {
  if (st->txn_file) {
    LOG_ERROR("store", "the transaction opened at %s:%d was never ended (next begin at %s:%d)",
              st->txn_file, st->txn_line, file, line);
    FSDP_ASSERT(st->txn_file == NULL);
  }
  st->rc = 0;
  const char *sql = write ? "BEGIN IMMEDIATE" : "BEGIN";
  int rc = sqlite3_exec(st->db, sql, NULL, NULL, NULL);
  if (rc != SQLITE_OK) return store_sqlite_err(st, rc, sql);
  st->txn_file = file;
  st->txn_line = line;
  return 0;
}

/* Ends the open transaction: commits when rc and the sticky failure are 0,
 * else rolls back. Returns the failure (rc first), or the commit's. */
static int store_end(store_t *st, int rc) {
  FSDP_ASSERT(st->txn_file != NULL);
  if (rc == 0) rc = st->rc;
  /* no statement may keep reading past the transaction */
  for (int i = 0; i < st->n_cache; i++) sqlite3_reset(st->cache[i].stmt);
  if (rc == 0) {
    st->committing = 1;
    int src = sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL);
    st->committing = 0;
    if (src != SQLITE_OK) rc = store_sqlite_err(st, src, "COMMIT");
  }
  if (rc == 0) st->ckpt_aborts_at_end += (uint64_t)st->txn_ckpt_aborts;
  st->txn_ckpt_aborts = 0;
  if (rc != 0 && !sqlite3_get_autocommit(st->db))
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL); /* keeps err_msg(): no err_set here */
  st->txn_file = NULL;
  st->rc = 0;
  return rc;
}

/* ---- statements ----
 * Values are bound, never printed into SQL: A_I(int), A_D(double),
 * A_T(text or NULL), A_B(pointer, bytes). ST_ARGS counts them at compile time. */
typedef struct {
  char type;
  int64_t i;
  double d;
  const void *p;
  size_t n;
} st_arg_t;
#define A_I(x) ((st_arg_t){'i', (int64_t)(x), 0, NULL, 0})
#define A_D(x) ((st_arg_t){'d', 0, (double)(x), NULL, 0}) /* NaN is stored as NULL */
#define A_T(s) ((st_arg_t){'t', 0, 0, (s), 0})
#define A_B(ptr, len) ((st_arg_t){'b', 0, 0, (ptr), (len)})
#define ST_ARGS(...) \
  (st_arg_t[]){__VA_ARGS__}, (int)(sizeof((st_arg_t[]){__VA_ARGS__}) / sizeof(st_arg_t))

/* The statement for sql (prepared once, then reused), reset and bound; NULL
 * after a failure (sticky) or when one happens here. */
static sqlite3_stmt *st_prep(store_t *st, const char *sql, const st_arg_t *a, int n) {
  if (st->rc) return NULL;
  sqlite3_stmt *s = NULL;
  for (int i = 0; i < st->n_cache && !s; i++)
    if (st->cache[i].sql == sql) s = st->cache[i].stmt;
  if (!s) {
    FSDP_ASSERT(st->n_cache < STORE_STMT_MAX); /* more statements than slots: raise it */
    int rc = sqlite3_prepare_v3(st->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, NULL);
    if (rc != SQLITE_OK) {
      st_fail(st, store_sqlite_err(st, rc, sql));
      return NULL;
    }
    st->cache[st->n_cache].sql = sql;
    st->cache[st->n_cache++].stmt = s;
  }
  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  for (int i = 0; i < n; i++) {
    int rc;
    if (a[i].type == 'i') rc = sqlite3_bind_int64(s, i + 1, a[i].i);
    else if (a[i].type == 'd') rc = sqlite3_bind_double(s, i + 1, a[i].d);
    else if (a[i].type == 't') rc = sqlite3_bind_text(s, i + 1, a[i].p, -1, SQLITE_STATIC);
    else rc = sqlite3_bind_blob64(s, i + 1, a[i].p ? a[i].p : "", a[i].n, SQLITE_STATIC);
    if (rc != SQLITE_OK) {
      st_fail(st, store_sqlite_err(st, rc, sql));
      return NULL;
    }
  }
  return s;
}
#define st_query(st, sql, ...) st_prep((st), (sql), ST_ARGS(__VA_ARGS__))

/* 1: a row; 0: done (the statement is reset); < 0: failed (sticky). */
static int st_step(store_t *st, sqlite3_stmt *s) {
  if (!s) return st->rc ? st->rc : FSDP_EINTERNAL;
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) return 1;
  sqlite3_reset(s);
  if (rc == SQLITE_DONE) return 0;
  return st_fail(st, store_sqlite_err(st, rc, sqlite3_sql(s)));
}

/* Runs a statement to its end: the rows it changed, or < 0. */
static int st_exec_(store_t *st, const char *sql, const st_arg_t *a, int n) {
  sqlite3_stmt *s = st_prep(st, sql, a, n);
  int rc;
  while ((rc = st_step(st, s)) == 1) {}
  return rc < 0 ? rc : sqlite3_changes(st->db);
}
#define st_exec(st, sql, ...) st_exec_((st), (sql), ST_ARGS(__VA_ARGS__))

/* The first column of the first row as an integer; dflt when there is no row
 * (or NULL there, or a failure, which is sticky). */
static int64_t st_int_(store_t *st, int64_t dflt, const char *sql, const st_arg_t *a, int n) {
  sqlite3_stmt *s = st_prep(st, sql, a, n);
  int64_t v = dflt;
  if (st_step(st, s) == 1) {
    if (sqlite3_column_type(s, 0) != SQLITE_NULL) v = sqlite3_column_int64(s, 0);
    sqlite3_reset(s);
  }
  return v;
}
#define st_int(st, dflt, sql, ...) st_int_((st), (dflt), (sql), ST_ARGS(__VA_ARGS__))

/* Copies text column col into buf (cut to fit; "" for NULL). */
static void st_col_text(sqlite3_stmt *s, int col, char *buf, size_t cap) {
  const unsigned char *t = sqlite3_column_text(s, col);
  snprintf(buf, cap, "%s", t ? (const char *)t : "");
}

/* A REAL column: NULL is a NaN stored (A_D). */
static double st_col_real(sqlite3_stmt *s, int col) {
  return sqlite3_column_type(s, col) == SQLITE_NULL ? NAN : sqlite3_column_double(s, col);
}

/* Node id's row or devices changed (store_nodes_touched hands the ids over).
 * A transaction rolled back leaves its ids: a node read again for nothing. */
#define STORE_TOUCHED_MAX 65536
static void st_touch(store_t *st, int64_t id) {
  if (st->touched_all) return;
  if (st->n_touched == st->cap_touched) {
    const int cap = st->cap_touched ? 2 * st->cap_touched : 64;
    int64_t *p = cap <= STORE_TOUCHED_MAX ? realloc(st->touched, (size_t)cap * sizeof *p) : NULL;
    if (!p) {
      st->touched_all = 1, st->n_touched = 0;
      return;
    }
    st->touched = p, st->cap_touched = cap;
  }
  st->touched[st->n_touched++] = id;
}

/* Rows of a query into a growing array of elem-sized items, each filled by
 * row(); the array in *out (free()), its length in *n. */
typedef void (*st_row_fn)(sqlite3_stmt *s, void *item);
static int st_collect_(store_t *st, size_t elem, st_row_fn row, void **out, int *n,
                       const char *sql, const st_arg_t *a, int na) {
  sqlite3_stmt *s = st_prep(st, sql, a, na);
  char *arr = NULL;
  int len = 0, cap = 0, rc;
  while ((rc = st_step(st, s)) == 1) {
    if (len == cap) {
      cap = cap ? 2 * cap : 16;
      char *grown = realloc(arr, (size_t)cap * elem);
      if (!grown) {
        sqlite3_reset(s);
        rc = st_fail(st, err_set(FSDP_ENOMEM, "state database %s: out of memory reading %d rows",
                                 st->path, len));
        break;
      }
      arr = grown;
    }
    memset(arr + (size_t)len * elem, 0, elem);
    row(s, arr + (size_t)len * elem);
    len++;
  }
  if (rc < 0) {
    free(arr);
    arr = NULL;
    len = 0;
  }
  *out = arr;
  *n = len;
  return rc < 0 ? rc : 0;
}
#define st_collect(st, type, row, out, n, sql, ...) \
  st_collect_((st), sizeof(type), (row), (void **)(out), (n), (sql), ST_ARGS(__VA_ARGS__))

/* An event in the open transaction (the state changes' audit lines). */
static void st_event(store_t *st, int64_t job_id, int64_t node_id, const char *kind,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void st_eventv(store_t *st, int64_t job_id, int64_t node_id, const char *kind,
                      const char *fmt, va_list ap) {
  char text[STORE_REASON_MAX];
  vsnprintf(text, sizeof text, fmt, ap);
  st_exec(st,
          "INSERT INTO events(time_ms, job_id, node_id, kind, text) "
          "VALUES(?, nullif(?, 0), nullif(?, 0), ?, ?)",
          A_I(store_now_ms()), A_I(job_id), A_I(node_id), A_T(kind), A_T(text));
}
static void st_event(store_t *st, int64_t job_id, int64_t node_id, const char *kind,
                     const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st_eventv(st, job_id, node_id, kind, fmt, ap);
  va_end(ap);
}

/* Text arguments: present, and short enough to read back whole. */
static int check_text(const char *what, const char *s, size_t cap, int may_be_empty) {
  if (!s) return err_set(FSDP_EINVAL, "%s: missing", what);
  size_t len = strlen(s);
  if (!may_be_empty && len == 0) return err_set(FSDP_EINVAL, "%s: empty", what);
  if (len >= cap)
    return err_set(FSDP_EINVAL, "%s: %zu bytes, at most %zu: shorten it", what, len, cap - 1);
  return 0;
}

/* ---- opening and migrating ---- */

/* Refuses what is not ours before anything is written: SQLite's first read
 * of a file that is not a database fails with SQLITE_NOTADB, and nothing so far
 * (opening, these reads) writes the file. */
static int store_check_file(store_t *st, int *version) {
  int64_t tables = st_int(st, 0, "SELECT count(*) FROM sqlite_schema");
  int64_t app = st_int(st, 0, "PRAGMA application_id");
  int64_t ver = st_int(st, 0, "PRAGMA user_version");
  if (st->rc) {
    int rc = st->rc;
    st->rc = 0;
    /* a damaged database keeps store_sqlite_err's message (restore it) */
    if ((sqlite3_errcode(st->db) & 0xff) == SQLITE_NOTADB)
      return err_set(FSDP_EFORMAT,
                     "%s is not a SQLite database: refusing to use it as the coordinator's "
                     "state, and it was left as it was; give a new path, or move the file away",
                     st->path);
    return rc;
  }
  if (app != STORE_APP_ID && (app != 0 || tables > 0))
    return err_set(FSDP_EFORMAT,
                   "%s is a SQLite database of another program (application_id %lld, %lld "
                   "tables), not an fsdp-coordinator state file: left as it was; give a new path",
                   st->path, (long long)app, (long long)tables);
  if (ver > STORE_SCHEMA_VERSION)
    return err_set(FSDP_EFORMAT,
                   "%s has schema version %lld, newer than this fsdp-coordinator's %d: it was "
                   "written by a newer release; run that release (or newer) on it, or start "
                   "this one on a new file",
                   st->path, (long long)ver, STORE_SCHEMA_VERSION);
  *version = (int)ver;
  return 0;
}

/* One transaction per step, each re-reading the version under the write
 * lock, so two processes opening one new file cannot both migrate it. */
static int store_migrate(store_t *st, int from, int to) {
  for (int v = from; v < to; v++) {
    int rc = store_begin(st, 1);
    if (rc) return rc;
    int64_t now = st_int(st, -1, "PRAGMA user_version");
    if (now == v) {
      int src = sqlite3_exec(st->db, store_migrations[v], NULL, NULL, NULL);
      if (src != SQLITE_OK) st_fail(st, store_sqlite_err(st, src, store_migrations[v]));
      char sql[96]; /* PRAGMAs take no bound values */
      snprintf(sql, sizeof sql, "PRAGMA user_version = %d; PRAGMA application_id = %d", v + 1,
               STORE_APP_ID);
      if (!st->rc && (src = sqlite3_exec(st->db, sql, NULL, NULL, NULL)) != SQLITE_OK)
        st_fail(st, store_sqlite_err(st, src, sql));
    }
    rc = store_end(st, 0);
    if (rc) return err_wrap(rc, "migrating %s from schema version %d to %d", st->path, v, v + 1);
    if (now == v) LOG_INFO("store", "%s: schema version %d -> %d", st->path, v, v + 1);
  }
  return 0;
}

/* One writer per database: PATH-lock, flock'ed for as long as the store is
 * open, holding the owner's pid for the message. Two coordinators on one
 * database would both schedule (SQLite would serialise their transactions,
 * not their decisions). The kernel drops the lock with its process, so a
 * coordinator killed with -9 never leaves it behind; the file stays, empty
 * of meaning. A readonly copy (store_backup, the sqlite3 shell) takes no lock. */
static int store_lock(store_t *st) {
  st->lock_fd = -1;
  if (!strcmp(st->path, ":memory:")) return 0;
  /* one name per database, however it is reached (SQLite follows links) */
  char real[PATH_MAX], lp[PATH_MAX + 8];
  if (!realpath(st->path, real)) {
    char dir[sizeof st->path], base[sizeof st->path];
    snprintf(dir, sizeof dir, "%s", st->path);
    snprintf(base, sizeof base, "%s", st->path);
    if (!realpath(dirname(dir), real)) snprintf(real, sizeof real, "%s", st->path);
    else if (strlen(real) + strlen(basename(base)) + 2 <= sizeof real)
      strcat(strcat(real, "/"), basename(base));
  }
  snprintf(lp, sizeof lp, "%s-lock", real);
  int rw = 1, fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EACCES) /* another user's: a read-only descriptor locks as well */
    rw = 0, fd = open(lp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return err_set_errno(errno == EACCES ? FSDP_EPERM : FSDP_EIO, errno,
                         "state database %s: cannot open its lock file %s", st->path, lp);
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    const int e = errno;
    char pid[32] = "";
    ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = 0;
    pid[strcspn(pid, "\n")] = 0;
    close(fd);
    if (e == EWOULDBLOCK)
      return err_set(FSDP_ESTATE, "state database %s is in use by another coordinator (pid %s, "
                     "holding %s): stop that one first, or give this one a database of its own",
                     st->path, pid[0] ? pid : "unknown", lp);
    if (e == ENOLCK || e == EOPNOTSUPP) { /* a file system without locks: as before */
      LOG_WARN("store", "%s: this file system takes no lock (%s): nothing stops a second "
               "coordinator on this database", lp, strerror(e));
      return 0;
    }
    return err_set_errno(FSDP_EIO, e, "state database %s: locking %s", st->path, lp);
  }
  struct stat sb;
  char pid[32];
  int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  /* the pid, for the next one's message: only into a file of ours alone */
  if (rw && !fstat(fd, &sb) && S_ISREG(sb.st_mode) && sb.st_nlink == 1 &&
      (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n))
    LOG_WARN("store", "%s: cannot write this pid into it: %s", lp, strerror(errno));
  st->lock_fd = fd;
  return 0;
}

/* Makes path a file only its owner reads (it holds each running attempt's
 * ring secret; SQLite gives its -wal and -shm files the same mode): created
 * 0600 when absent (create), else tightened (with a warning) when it is
 * ours and group or others may read it: only once store_check_file found it
 * a database of ours, so another program's file (a mistyped --db) is left
 * as it was. The tightening goes by path (stat, chmod), never through a
 * descriptor opened and closed here: closing any descriptor of a file drops
 * every POSIX lock the process holds on it, SQLite's included. A
 * coordinator that did so ran on its database unlocked from its second
 * start on, and a sqlite3 shell closing on the file took itself for the
 * last connection and deleted the log the coordinator was still writing,
 * so a crash then lost every change since (found by an outside tester).
 * (create runs before SQLite has opened the file.) 0, or a code and a
 * message. */
static int store_private_file(const char *path, int create) {
  if (create) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST) /* SQLite would say only "unable to open" */
      return err_set_errno(err_from_errno(errno), errno, "%s cannot be created (its directory "
                           "must exist and be writable)", path);
    if (fd >= 0) close(fd);
    return 0; /* made, or there already */
  }
  struct stat sb;
  if (stat(path, &sb) || !S_ISREG(sb.st_mode) || !(sb.st_mode & 077) || sb.st_uid != geteuid())
    return 0; /* SQLite says why it cannot open one that is not there */
  if (chmod(path, sb.st_mode & 0700))
    return err_set_errno(FSDP_EIO, errno, "state database %s: cannot make it private (chmod "
                         "0600): it holds the running attempts' ring secrets", path);
  LOG_WARN("store", "%s: was readable by group or others (mode %03o); now %03o: it holds the "
           "running attempts' ring secrets", path, (unsigned)(sb.st_mode & 0777),
           (unsigned)(sb.st_mode & 0700));
  return 0;
}

int store_open(const char *path, const store_opts_t *opts, store_t **out) {
  *out = NULL;
  int rc = check_text("state database path", path, sizeof ((store_t *)0)->path, 0);
  if (rc) return rc;
  store_t *st = calloc(1, sizeof *st);
  if (!st) return err_set(FSDP_ENOMEM, "opening state database %s: out of memory", path);
  snprintf(st->path, sizeof st->path, "%s", path);
  st->busy_ms = opts && opts->busy_timeout_ms > 0 ? opts->busy_timeout_ms : STORE_BUSY_MS;
  if ((rc = store_lock(st))) {
    free(st);
    return rc;
  }
  const int file = strcmp(path, ":memory:") != 0;
  if (file && (rc = store_private_file(path, 1))) goto fail;
  int src = sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  if (src != SQLITE_OK) {
    rc = store_sqlite_err(st, src, NULL);
    goto fail;
  }
  sqlite3_extended_result_codes(st->db, 1);
  sqlite3_busy_timeout(st->db, st->busy_ms);
  rc = store_check_file(st, &st->from_version);
  if (!rc && file) rc = store_private_file(path, 0);
  if (rc) goto fail;
  /* WAL: readers (the sqlite3 shell, a backup) never block the coordinator.
   * synchronous=FULL syncs the log at every commit, so a change the
   * coordinator acted on (an answer sent, ranks assigned to nodes) survives
   * a power loss too; NORMAL survives a crash of the process or kill -9 but
   * may lose the last commits on power loss, for fewer fsyncs. */
  char sql[160];
  snprintf(sql, sizeof sql,
           "PRAGMA journal_mode = WAL; PRAGMA synchronous = %s; PRAGMA foreign_keys = ON",
           opts && opts->sync_normal ? "NORMAL" : "FULL");
  src = sqlite3_exec(st->db, sql, NULL, NULL, NULL);
  if (src != SQLITE_OK) {
    rc = store_sqlite_err(st, src, sql);
    goto fail;
  }
  sqlite3_commit_hook(st->db, store_commit_hook, st);
  const int to = opts && opts->version > 0 && opts->version < STORE_SCHEMA_VERSION
                     ? opts->version : STORE_SCHEMA_VERSION;
  rc = store_migrate(st, st->from_version, to);
  if (rc) goto fail;
  st->open = 1;
  *out = st;
  return 0;
fail:
  store_close(st);
  return rc;
}

void store_close(store_t *st) {
  if (!st) return;
  if (st->txn_file) {
    LOG_ERROR("store", "closing %s with the transaction opened at %s:%d never ended", st->path,
              st->txn_file, st->txn_line);
    FSDP_ASSERT(st->txn_file == NULL);
  }
  for (int i = 0; i < st->n_cache; i++) sqlite3_finalize(st->cache[i].stmt);
  free(st->touched);
  sqlite3_close(st->db);
  if (st->lock_fd >= 0) close(st->lock_fd); /* the lock goes with its descriptor */
  free(st);
}

int store_schema_from(const store_t *st) { return st->from_version; }

int store_backup(const char *path, const char *out, int *version) {
  if (!access(out, F_OK))
    return err_set(FSDP_EEXIST, "backup: %s exists; name a new file (a backup never replaces one)",
                   out);
  store_t src = {0}; /* only what store_check_file and the errors use */
  snprintf(src.path, sizeof src.path, "%s", path);
  int rc = FSDP_OK, s = sqlite3_open_v2(path, &src.db, SQLITE_OPEN_READONLY, NULL);
  if (s != SQLITE_OK) rc = store_sqlite_err(&src, s, NULL);
  if (!rc) {
    sqlite3_busy_timeout(src.db, STORE_BUSY_MS);
    rc = store_check_file(&src, version);
  }
  if (!rc && *version == 0)
    rc = err_set(FSDP_ENOENT, "backup: %s holds no fsdp-coordinator state (no schema)", path);
  /* a temporary of its own (file_temp_create: O_EXCL, so never a link
   * planted at its name, which SQLite would have written through), private
   * from the start as the database is (it holds the ring secrets) */
  char tmp[sizeof src.path + 32] = "";
  sqlite3 *dst = NULL;
  int tfd = -1;
  if (!rc && (rc = file_temp_create(out, tmp, sizeof tmp, &tfd))) {
    tmp[0] = 0; /* not ours: nothing to remove */
    rc = err_wrap(rc, "backup");
  }
  if (tfd >= 0 && fchmod(tfd, 0600))
    rc = err_set_errno(FSDP_EIO, errno, "backup: chmod 0600 %s", tmp);
  if (tfd >= 0) close(tfd);
  if (!rc && (s = sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOFOLLOW, NULL)))
    rc = err_set(FSDP_EIO, "backup: cannot open %s: %s", tmp, sqlite3_errstr(s));
  if (!rc) {
    sqlite3_backup *b = sqlite3_backup_init(dst, "main", src.db, "main");
    if (!b) {
      rc = err_set(FSDP_EIO, "backup of %s: %s", path, sqlite3_errmsg(dst));
    } else {
      /* all pages in one step: one read transaction, so one snapshot */
      for (int tries = 0; (s = sqlite3_backup_step(b, -1)) == SQLITE_BUSY || s == SQLITE_LOCKED;
           tries++) {
        if (tries * 10 > STORE_BUSY_MS) break;
        sqlite3_sleep(10);
      }
      const int f = sqlite3_backup_finish(b);
      if (s != SQLITE_DONE || f != SQLITE_OK)
        rc = err_set(FSDP_EIO, "backup of %s into %s: %s", path, tmp,
                     sqlite3_errstr(s != SQLITE_DONE ? s : f));
    }
  }
  if (!rc) {
    sqlite3_stmt *q = NULL;
    s = sqlite3_prepare_v2(dst, "PRAGMA quick_check", -1, &q, NULL);
    const char *ok = s == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW
                         ? (const char *)sqlite3_column_text(q, 0) : NULL;
    if (!ok || strcmp(ok, "ok"))
      rc = err_set(FSDP_EIO, "backup: the copy %s does not check: %s", tmp, ok ? ok : "no answer");
    sqlite3_finalize(q);
  }
  if (dst && sqlite3_close(dst) != SQLITE_OK && !rc)
    rc = err_set(FSDP_EIO, "backup: closing %s", tmp);
  for (int i = 0; i < src.n_cache; i++) sqlite3_finalize(src.cache[i].stmt);
  sqlite3_close(src.db);
  if (!rc) { /* durable, then under its name */
    int fd = open(tmp, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd)) rc = err_set_errno(FSDP_EIO, errno, "backup: fsync %s", tmp);
    if (fd >= 0) close(fd);
  }
  if (!rc && rename(tmp, out))
    rc = err_set_errno(err_from_errno(errno), errno, "backup: rename %s to %s", tmp, out);
  if (!rc) {
    char dir[sizeof src.path];
    snprintf(dir, sizeof dir, "%s", out);
    int fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd)) rc = err_set_errno(FSDP_EIO, errno, "backup: fsync of %s's directory", out);
    if (fd >= 0) close(fd);
  }
  if (rc && tmp[0]) unlink(tmp);
  return rc;
}

/* ---- restoring a backup ---- */

/* PRAGMA quick_check of db, named path in the message: 0 or EFORMAT. */
static int store_quick_check(sqlite3 *db, const char *what, const char *path) {
  sqlite3_stmt *q = NULL;
  int s = sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &q, NULL);
  const char *ok = s == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW
                       ? (const char *)sqlite3_column_text(q, 0) : NULL;
  int rc = 0;
  if (!ok || strcmp(ok, "ok"))
    rc = err_set(FSDP_EFORMAT, "%s %s does not check (PRAGMA quick_check: %s)", what, path,
                 ok ? ok : sqlite3_errmsg(db));
  sqlite3_finalize(q);
  return rc;
}

/* fsync of path, and of its directory when dir (a name made or removed). */
static int store_sync_path(const char *path, int dir) {
  char d[PATH_MAX];
  snprintf(d, sizeof d, "%s", path);
  const char *p = dir ? dirname(d) : path;
  int fd = open(p, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
  int rc = fd < 0 || fsync(fd) ? err_set_errno(FSDP_EIO, errno, "fsync of %s", p) : 0;
  if (fd >= 0) close(fd);
  return rc;
}

/* Answers one PRAGMA that returns text (journal_mode) into out. */
static int store_pragma_text(store_t *st, const char *sql, char *out, size_t cap) {
  sqlite3_stmt *q = NULL;
  int s = sqlite3_prepare_v2(st->db, sql, -1, &q, NULL);
  if (s == SQLITE_OK && (s = sqlite3_step(q)) == SQLITE_ROW) s = SQLITE_OK;
  if (s == SQLITE_OK) st_col_text(q, 0, out, cap);
  sqlite3_finalize(q);
  return s == SQLITE_OK ? 0 : store_sqlite_err(st, s, sql);
}

/* ---- a restore hands out no id again ----
 * The ids the replaced database had handed out are read through "old" (it
 * attached to the in-memory copy of the backup, "main"), and main is raised
 * above them before it is written over the database: jobs by their
 * AUTOINCREMENT counter (sqlite_sequence 'jobs'); nodes and each job's
 * attempts by floors kept in the same table (rows 'nodes' and
 * 'attempts:<job id>', which SQLite itself ignores: store_node_register and
 * store_attempt_start read them); events by the event that records the
 * restore, given the next id (store_event_purge never removes the newest).
 * A floor is only ever raised. What was lost goes into the report. */

/* max(x's highest id, its sqlite_sequence row) in schema db ("main", "old"). */
static const char *const sql_hi_job[2] = {
    "SELECT max(coalesce((SELECT seq FROM main.sqlite_sequence WHERE name = 'jobs'), 0), "
    "coalesce((SELECT max(id) FROM main.jobs), 0))",
    "SELECT max(coalesce((SELECT seq FROM old.sqlite_sequence WHERE name = 'jobs'), 0), "
    "coalesce((SELECT max(id) FROM old.jobs), 0))"};
static const char *const sql_hi_node[2] = {
    "SELECT max(coalesce((SELECT seq FROM main.sqlite_sequence WHERE name = 'nodes'), 0), "
    "coalesce((SELECT max(id) FROM main.nodes), 0))",
    "SELECT max(coalesce((SELECT seq FROM old.sqlite_sequence WHERE name = 'nodes'), 0), "
    "coalesce((SELECT max(id) FROM old.nodes), 0))"};
static const char *const sql_hi_event[2] = {"SELECT coalesce(max(id), 0) FROM main.events",
                                            "SELECT coalesce(max(id), 0) FROM old.events"};

/* sqlite_sequence's row name := max(its value, v) in main. */
static void st_seq_raise(store_t *t, const char *name, int64_t v) {
  if (st_exec(t, "UPDATE main.sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", A_I(v),
              A_T(name)) == 0)
    st_exec(t, "INSERT INTO main.sqlite_sequence(name, seq) VALUES(?, ?)", A_T(name), A_I(v));
}

/* "j-5..j-9, j-12": the ids of q (ascending; column 0) with prefix, into
 * out (n bytes, cut to fit); their count. */
static int64_t st_ranges(store_t *t, sqlite3_stmt *q, const char *prefix, char *out, size_t n) {
  int64_t count = 0, first = 0, last = 0;
  size_t w = 0;
  out[0] = 0;
  for (int more = 1; more;) {
    more = st_step(t, q) == 1;
    const int64_t id = more ? sqlite3_column_int64(q, 0) : 0;
    if (more && count++ && id == last + 1) {
      last = id;
      continue;
    }
    if (count > (more ? 1 : 0) && w < n) {
      w += (size_t)(first == last
                        ? snprintf(out + w, n - w, "%s%s%lld", w ? ", " : "", prefix,
                                   (long long)first)
                        : snprintf(out + w, n - w, "%s%s%lld..%s%lld", w ? ", " : "", prefix,
                                   (long long)first, prefix, (long long)last));
    }
    first = last = id;
  }
  return count;
}

/* Raises t (the backup's copy, "main") above the database at path, whose
 * schema had `tables` tables (0: new or empty), and says what was lost. 0, or
 * a failure of the copy (the restore then stops); the replaced database
 * unreadable is no failure: a gap is left instead. */
static int store_restore_raise(store_t *t, const char *path, const char *backup, int64_t tables,
                               store_restore_info_t *in) {
  char *text = NULL, *summary = NULL;
  size_t tlen = 0, slen = 0;
  FILE *f = open_memstream(&text, &tlen), *sf = open_memstream(&summary, &slen);
  if (!f || !sf) {
    if (f) fclose(f), free(text);
    if (sf) fclose(sf), free(summary);
    return err_set(FSDP_ENOMEM, "restore: out of memory");
  }
  const int64_t bk_job = st_int(t, 0, sql_hi_job[0]), bk_node = st_int(t, 0, sql_hi_node[0]),
                bk_event = st_int(t, 0, sql_hi_event[0]);
  if (t->rc) goto out; /* the backup's copy: checked, so a failure here is real */
  /* the replaced database's, through a second connection of this process
   * (the folded file; the restore's lock is held) */
  char why[600] = "";
  int64_t old_job = 0, old_node = 0, old_event = 0;
  if (tables == 0) {
    snprintf(why, sizeof why, "%s was new or empty", path);
  } else {
    st_exec(t, "ATTACH DATABASE ? AS old", A_T(path));
    old_job = st_int(t, 0, sql_hi_job[1]);
    old_node = st_int(t, 0, sql_hi_node[1]);
    old_event = st_int(t, 0, sql_hi_event[1]);
    if (t->rc) {
      snprintf(why, sizeof why, "%s could not be read (%s)", path, err_msg());
      t->rc = 0;
    }
  }
  const int known = !why[0];
  in->known = known;
  const int64_t job = known ? (old_job > bk_job ? old_job : bk_job) : bk_job + STORE_RESTORE_GAP;
  const int64_t node = known ? (old_node > bk_node ? old_node : bk_node)
                             : bk_node + STORE_RESTORE_GAP;
  const int64_t event = (known ? (old_event > bk_event ? old_event : bk_event)
                               : bk_event + STORE_RESTORE_GAP) + 1;
  in->next_job = job + 1, in->next_node = node + 1, in->next_event = event;
  st_seq_raise(t, "jobs", job);
  if (node > bk_node) st_seq_raise(t, "nodes", node);
  if (!known) {
    /* each live job's next attempt well above its last */
    sqlite3_stmt *q = st_query(t, "SELECT id, epoch FROM main.jobs WHERE state IN "
                               "('PENDING', 'RUNNING') ORDER BY id");
    int64_t n = 0;
    while (st_step(t, q) == 1) {
      char name[40];
      snprintf(name, sizeof name, "attempts:%lld", (long long)sqlite3_column_int64(q, 0));
      st_seq_raise(t, name, sqlite3_column_int64(q, 1) + STORE_RESTORE_EPOCH_GAP);
      n++;
    }
    fprintf(sf, "restored from the backup %s; the ids handed out after it are unknown (%s): a "
            "gap was left", backup, why);
    fprintf(f, "The ids %s handed out after this backup are unknown: %s.\n"
            "A gap was left so that none is handed out again: the next job is j-%lld, the next "
            "node n-%lld, the next event %lld, and the next attempt of each of the %lld live "
            "job(s) is %d above its last.\n"
            "Jobs created, attempts started and checkpoints committed after this backup are not "
            "in it: their files stay in the fsdpd work directories (jobs/<job id>/<attempt>) and "
            "on the checkpoint roots; see docs/OPERATIONS.md, \"Backups and upgrades\".\n",
            path, why, (long long)in->next_job, (long long)in->next_node, (long long)event,
            (long long)n, STORE_RESTORE_EPOCH_GAP);
    goto event;
  }
  fprintf(sf, "restored from the backup %s", backup);
  /* jobs created after the backup */
  sqlite3_stmt *q = st_query(t, "SELECT id FROM old.jobs WHERE id > ? ORDER BY id", A_I(bk_job));
  char ids[4096];
  if ((in->lost_jobs = st_ranges(t, q, "j-", ids, sizeof ids))) {
    fprintf(f, "jobs %s (%lld) were created after this backup and are not in it: their ids are "
            "not handed out again (the next job is j-%lld); their checkpoints, and their logs in "
            "the fsdpd work directories (jobs/<job id>/), stay on disk, unknown to the "
            "coordinator:\n", ids, (long long)in->lost_jobs, (long long)in->next_job);
    fprintf(sf, "; lost: %lld job(s) created after it (%s)", (long long)in->lost_jobs,
            strlen(ids) < 200 ? ids : "see the restore's output");
    const int v6 = st_int(t, 0, "PRAGMA old.user_version") >= 6;
    q = st_query(t, v6 ? "SELECT id, name, state, coalesce(checkpoint_dir, '') FROM old.jobs "
                         "WHERE id > ? ORDER BY id"
                       : "SELECT id, name, state, '' FROM old.jobs WHERE id > ? ORDER BY id",
                 A_I(bk_job));
    while (st_step(t, q) == 1) {
      const char *dir = (const char *)sqlite3_column_text(q, 3);
      fprintf(f, "  j-%lld %s (%s)%s%s\n", (long long)sqlite3_column_int64(q, 0),
              (const char *)sqlite3_column_text(q, 1), (const char *)sqlite3_column_text(q, 2),
              dir && dir[0] ? ": checkpoints under " : "", dir ? dir : "");
    }
  }
  /* nodes registered after it */
  q = st_query(t, "SELECT id FROM old.nodes WHERE id > ? ORDER BY id", A_I(bk_node));
  if ((in->lost_nodes = st_ranges(t, q, "n-", ids, sizeof ids))) {
    fprintf(f, "nodes %s were registered after this backup: they register again with new ids "
            "(from n-%lld)\n", ids, (long long)in->next_node);
    fprintf(sf, "; %lld node(s) registered after it", (long long)in->lost_nodes);
  }
  /* attempts of the backup's jobs started after it: their next is above */
  q = st_query(t, "SELECT id, epoch, hi FROM (SELECT m.id AS id, m.epoch AS epoch, max(o.epoch, "
               "coalesce((SELECT max(a.epoch) FROM old.attempts a WHERE a.job_id = o.id), 0), "
               "coalesce((SELECT seq FROM old.sqlite_sequence s WHERE s.name = 'attempts:' || "
               "o.id), 0)) AS hi FROM main.jobs m JOIN old.jobs o ON o.id = m.id) "
               "WHERE hi > epoch ORDER BY id");
  while (st_step(t, q) == 1) {
    const int64_t id = sqlite3_column_int64(q, 0), ep = sqlite3_column_int64(q, 1),
                  hi = sqlite3_column_int64(q, 2);
    char name[40];
    snprintf(name, sizeof name, "attempts:%lld", (long long)id);
    st_seq_raise(t, name, hi);
    in->lost_attempts += hi - ep;
    if (hi - ep > 1)
      snprintf(ids, sizeof ids, "attempts %lld..%lld", (long long)ep + 1, (long long)hi);
    else
      snprintf(ids, sizeof ids, "attempt %lld", (long long)hi);
    fprintf(f, "job j-%lld: %s ran after this backup (which has it at attempt %lld): its next "
            "attempt is %lld\n", (long long)id, ids, (long long)ep, (long long)hi + 1);
  }
  if (in->lost_attempts)
    fprintf(sf, "; %lld attempt(s) of its jobs started after it", (long long)in->lost_attempts);
  /* checkpoints of the backup's jobs committed after it (both schemas 3+) */
  if (st_int(t, 0, "PRAGMA old.user_version") >= 3 && st_int(t, 0, "PRAGMA main.user_version") >= 3) {
    q = st_query(t, "SELECT o.job_id, o.step, o.dir FROM old.checkpoints o JOIN main.jobs m ON "
                 "m.id = o.job_id WHERE o.state = 'COMMITTED' AND o.removed = 0 AND NOT EXISTS "
                 "(SELECT 1 FROM main.checkpoints c WHERE c.job_id = o.job_id AND c.step = "
                 "o.step AND c.state = 'COMMITTED') ORDER BY o.job_id, o.step");
    while (st_step(t, q) == 1) {
      if (!in->lost_checkpoints++)
        fprintf(f, "checkpoints committed after this backup, which it does not list (a restarted "
                "attempt still resumes from them; keep_checkpoints does not remove them):\n");
      fprintf(f, "  j-%lld step %lld: %s\n", (long long)sqlite3_column_int64(q, 0),
              (long long)sqlite3_column_int64(q, 1), (const char *)sqlite3_column_text(q, 2));
    }
  }
  if (in->lost_checkpoints)
    fprintf(sf, "; %lld checkpoint(s) committed after it", (long long)in->lost_checkpoints);
  /* events written after it */
  if ((in->lost_events = old_event > bk_event ? old_event - bk_event : 0)) {
    fprintf(f, "events %lld..%lld were written after this backup and are lost; the next is "
            "%lld (a follower, fsdpctl events --follow, goes on from its place)\n",
            (long long)bk_event + 1, (long long)old_event, (long long)event);
    fprintf(sf, "; %lld event(s) written after it", (long long)in->lost_events);
  }
  if (t->rc) { /* the replaced database failed midway: keep the floors, say so */
    fprintf(f, "(%s could not be read to the end: %s)\n", path, err_msg());
    t->rc = 0;
  }
event:
  fflush(sf);
  if (!t->rc) {
    char ev[STORE_REASON_MAX];
    snprintf(ev, sizeof ev, "%s", summary ? summary : "restored");
    st_exec(t, "INSERT INTO main.events(id, time_ms, job_id, node_id, kind, text) "
            "VALUES(?, ?, NULL, NULL, 'store.restored', ?)", A_I(event), A_I(store_now_ms()),
            A_T(ev));
  }
out:
  if (tables) {
    const int rc = t->rc;
    t->rc = 0;
    for (int i = 0; i < t->n_cache; i++) sqlite3_finalize(t->cache[i].stmt);
    t->n_cache = 0; /* statements on old go before it does */
    sqlite3_exec(t->db, "DETACH DATABASE old", NULL, NULL, NULL);
    t->rc = rc;
  }
  fclose(sf);
  free(summary);
  fclose(f);
  if (t->rc || !tlen) free(text), text = NULL;
  in->report = text;
  return t->rc;
}

/* The backup is read (checked, then copied) as store_backup reads its
 * source; the database is written only through SQLite on a connection
 * opened as the coordinator opens it, under its lock: SQLite first recovers
 * a log a killed coordinator left (FILE-wal, those commits belong to FILE),
 * journal_mode=DELETE folds that log into FILE and removes it, and the
 * backup API then overwrites every page in one rollback-journal transaction
 * (a crash in it is rolled back at the next open, to FILE as it was), so
 * nothing of the old log can be replayed over the result. A plain file copy
 * would leave FILE-wal to be replayed over the backup at the next start. */
int store_restore(const char *path, const char *backup, int *version, int *had_wal,
                  store_restore_info_t *info) {
  store_t src = {0}, dst = {.lock_fd = -1}, mem = {.lock_fd = -1};
  store_restore_info_t none, *in = info ? info : &none;
  memset(in, 0, sizeof *in);
  int rc = check_text("state database path", path, sizeof dst.path, 0), s;
  *version = 0, *had_wal = 0;
  snprintf(src.path, sizeof src.path, "%s", backup);
  snprintf(dst.path, sizeof dst.path, "%s", path);
  snprintf(mem.path, sizeof mem.path, "%s (its copy in memory)", backup);
  src.busy_ms = dst.busy_ms = mem.busy_ms = STORE_BUSY_MS;
  struct stat sa, sb;
  if (!rc && !stat(path, &sa) && !stat(backup, &sb) && sa.st_dev == sb.st_dev &&
      sa.st_ino == sb.st_ino)
    rc = err_set(FSDP_EINVAL, "restore: %s and %s are one file: name the backup to restore", path,
                 backup);
  /* the backup: ours, of a schema this build reads, whole */
  if (!rc && (s = sqlite3_open_v2(backup, &src.db, SQLITE_OPEN_READONLY, NULL)) != SQLITE_OK)
    rc = store_sqlite_err(&src, s, NULL);
  if (!rc) {
    sqlite3_busy_timeout(src.db, STORE_BUSY_MS);
    rc = store_check_file(&src, version);
  }
  if (!rc && *version == 0)
    rc = err_set(FSDP_ENOENT, "%s holds no fsdp-coordinator state (no schema)", backup);
  if (!rc) rc = store_quick_check(src.db, "the backup", backup);
  if (rc) {
    err_wrap(rc, "restore: the backup was not restored, and %s was left as it was", path);
    goto out;
  }
  /* the database: ours or new (checked before its lock and mode are
   * touched), and no coordinator on it */
  char wal[sizeof dst.path + 8];
  snprintf(wal, sizeof wal, "%s-wal", path);
  if (!stat(wal, &sa) && sa.st_size > 0) *had_wal = 1;
  if ((rc = store_private_file(path, 1))) goto out; /* new: 0600 */
  if ((s = sqlite3_open_v2(path, &dst.db, SQLITE_OPEN_READWRITE, NULL)) != SQLITE_OK) {
    rc = store_sqlite_err(&dst, s, NULL);
    goto out;
  }
  sqlite3_extended_result_codes(dst.db, 1);
  sqlite3_busy_timeout(dst.db, STORE_BUSY_MS);
  /* the first read recovers a log left by a killed coordinator (into the
   * shared memory only: the file is not written yet) */
  const int64_t tables = st_int(&dst, 0, "SELECT count(*) FROM sqlite_schema");
  const int64_t app = st_int(&dst, 0, "PRAGMA application_id");
  if (dst.rc) {
    rc = err_set(FSDP_EFORMAT, "restore: %s is damaged or not a SQLite database (%s), so the "
                 "backup cannot be written into it through SQLite; it was left as it was: move "
                 "it and its -wal and -shm files away, then restore onto the path again",
                 path, sqlite3_errmsg(dst.db));
    goto out;
  }
  if (app != STORE_APP_ID && (app != 0 || tables > 0)) {
    rc = err_set(FSDP_EFORMAT, "restore: %s is a SQLite database of another program "
                 "(application_id %lld, %lld tables), not an fsdp-coordinator state file: left as "
                 "it was; check --db", path, (long long)app, (long long)tables);
    goto out;
  }
  if ((rc = store_lock(&dst))) {
    err_wrap(rc, "restore: nothing was restored");
    goto out;
  }
  if ((rc = store_private_file(path, 0))) goto out;
  /* the old log folded into FILE and removed; synchronous=EXTRA also
   * syncs the directory as the transaction's journal goes */
  char mode[16] = "";
  if ((rc = store_pragma_text(&dst, "PRAGMA journal_mode = DELETE", mode, sizeof mode))) goto out;
  if (strcmp(mode, "delete")) {
    rc = err_set(FSDP_ETIMEDOUT, "restore: %s is open elsewhere (a --backup, the sqlite3 shell?) "
                 "and its log cannot be folded in now (journal mode stays %s): nothing was "
                 "restored; try again once it is closed", path, mode);
    goto out;
  }
  if ((s = sqlite3_exec(dst.db, "PRAGMA synchronous = EXTRA", NULL, NULL, NULL)) != SQLITE_OK) {
    rc = store_sqlite_err(&dst, s, NULL);
    goto out;
  }
  /* the backup into memory, raised there above every id path handed out
   * (store_restore_raise), so that the copy and the raise are one
   * transaction on path */
  const int64_t page = st_int(&src, 4096, "PRAGMA page_size");
  if ((s = sqlite3_open_v2(":memory:", &mem.db, SQLITE_OPEN_READWRITE, NULL)) != SQLITE_OK) {
    rc = err_set(FSDP_ENOMEM, "restore: cannot open a database in memory: %s", sqlite3_errstr(s));
    goto out;
  }
  sqlite3_extended_result_codes(mem.db, 1);
  sqlite3_busy_timeout(mem.db, STORE_BUSY_MS);
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA page_size = %lld", (long long)page);
  sqlite3_exec(mem.db, sql, NULL, NULL, NULL);
  sqlite3_backup *b = sqlite3_backup_init(mem.db, "main", src.db, "main");
  if (b) {
    s = sqlite3_backup_step(b, -1);
    const int f = sqlite3_backup_finish(b);
    if (s == SQLITE_DONE && f == SQLITE_OK) b = (sqlite3_backup *)1;
    else b = NULL, s = s != SQLITE_DONE ? s : f;
  } else {
    s = sqlite3_errcode(mem.db);
  }
  if (!b) {
    rc = err_set(FSDP_EIO, "restore: reading the backup %s: %s: nothing was restored, %s is as "
                 "it was", backup, sqlite3_errstr(s), path);
    goto out;
  }
  if ((rc = store_restore_raise(&mem, path, backup, tables, in))) {
    err_wrap(rc, "restore: raising the backup's ids above those %s handed out: nothing was "
             "restored, %s is as it was", path, path);
    goto out;
  }
  b = sqlite3_backup_init(dst.db, "main", mem.db, "main");
  if (!b) {
    rc = err_set(FSDP_EIO, "restore of %s into %s: %s", backup, path, sqlite3_errmsg(dst.db));
    goto out;
  }
  /* all pages in one step: one transaction, all or nothing */
  for (int tries = 0; (s = sqlite3_backup_step(b, -1)) == SQLITE_BUSY || s == SQLITE_LOCKED;
       tries++) {
    if (tries * 10 > STORE_BUSY_MS) break;
    sqlite3_sleep(10);
  }
  const int f = sqlite3_backup_finish(b);
  if (s != SQLITE_DONE || f != SQLITE_OK) {
    rc = err_set(FSDP_EIO, "restore of %s into %s: %s: nothing was restored, %s is as it was",
                 backup, path, sqlite3_errstr(s != SQLITE_DONE ? s : f), path);
    goto out;
  }
  if ((rc = store_quick_check(dst.db, "restore: the restored", path))) goto out;
out:
  for (int i = 0; i < src.n_cache; i++) sqlite3_finalize(src.cache[i].stmt);
  for (int i = 0; i < dst.n_cache; i++) sqlite3_finalize(dst.cache[i].stmt);
  for (int i = 0; i < mem.n_cache; i++) sqlite3_finalize(mem.cache[i].stmt);
  sqlite3_close(src.db);
  sqlite3_close(mem.db);
  if (dst.db && sqlite3_close(dst.db) != SQLITE_OK && !rc)
    rc = err_set(FSDP_EIO, "restore: closing %s", path);
  if (!rc) rc = store_sync_path(path, 0);
  if (!rc) rc = store_sync_path(path, 1);
  if (dst.lock_fd >= 0) close(dst.lock_fd);
  if (rc || !info) free(in->report), in->report = NULL;
  return rc;
}


/* ---- rows ---- */
static void device_row(sqlite3_stmt *s, void *item) {
  store_device_t *d = item;
  d->node_id = sqlite3_column_int64(s, 0);
  d->index = sqlite3_column_int(s, 1);
  d->kind = ST_ENUM(store_dev_kind_name, sqlite3_column_text(s, 2));
  st_col_text(s, 3, d->name, sizeof d->name);
  d->memory_bytes = (uint64_t)sqlite3_column_int64(s, 4);
  d->job_id = sqlite3_column_int64(s, 5); /* NULL reads as 0: free */
}
#define DEVICE_COLS "node_id, idx, kind, name, memory_bytes, job_id"

static void node_row(sqlite3_stmt *s, void *item) {
  store_node_t *n = item;
  n->id = sqlite3_column_int64(s, 0);
  st_col_text(s, 1, n->name, sizeof n->name);
  st_col_text(s, 2, n->address, sizeof n->address);
  n->state = ST_ENUM(store_node_state_name, sqlite3_column_text(s, 3));
  n->registered_ms = sqlite3_column_int64(s, 4);
  n->last_seen_ms = sqlite3_column_int64(s, 5);
  st_col_text(s, 6, n->drain_reason, sizeof n->drain_reason);
  n->stopped = sqlite3_column_int(s, 7) != 0;
}

static void job_row(sqlite3_stmt *s, void *item) {
  store_job_t *j = item;
  j->id = sqlite3_column_int64(s, 0);
  st_col_text(s, 1, j->name, sizeof j->name);
  j->world_size = sqlite3_column_int(s, 2);
  st_col_text(s, 3, j->mesh, sizeof j->mesh);
  j->state = ST_ENUM(store_job_state_name, sqlite3_column_text(s, 4));
  st_col_text(s, 5, j->reason, sizeof j->reason);
  j->max_restarts = sqlite3_column_int(s, 6);
  j->restarts = sqlite3_column_int(s, 7);
  j->epoch = sqlite3_column_int64(s, 8);
  j->submitted_ms = sqlite3_column_int64(s, 9);
  j->started_ms = sqlite3_column_int64(s, 10);
  j->ended_ms = sqlite3_column_int64(s, 11);
}
#define JOB_COLS                                                                      \
  "id, name, world_size, mesh, state, reason, max_restarts, restarts, epoch, submitted_ms, " \
  "started_ms, ended_ms"

static void rank_row(sqlite3_stmt *s, void *item) {
  store_rank_t *r = item;
  r->job_id = sqlite3_column_int64(s, 0);
  r->epoch = sqlite3_column_int64(s, 1);
  r->rank = sqlite3_column_int(s, 2);
  r->node_id = sqlite3_column_int64(s, 3);
  r->device_index = sqlite3_column_int(s, 4);
  r->shard_group = sqlite3_column_int(s, 5);
  r->replica_group = sqlite3_column_int(s, 6);
  r->state = ST_ENUM(store_rank_state_name, sqlite3_column_text(s, 7));
  r->has_exit = sqlite3_column_type(s, 8) != SQLITE_NULL;
  r->exit_status = sqlite3_column_int(s, 8);
  r->pid = sqlite3_column_int64(s, 9);
  st_col_text(s, 10, r->memory, sizeof r->memory);
  r->reported = sqlite3_column_type(s, 11) != SQLITE_NULL;
  r->step = sqlite3_column_int64(s, 11);
  r->loss = st_col_real(s, 12), r->tokens_per_s = st_col_real(s, 13);
}
#define RANK_COLS                                                                             \
  "job_id, epoch, rank, node_id, device_idx, shard_group, replica_group, state, exit_status, " \
  "pid, memory, step, loss, tokens_per_s"

static void event_row(sqlite3_stmt *s, void *item) {
  store_event_t *e = item;
  e->id = sqlite3_column_int64(s, 0);
  e->time_ms = sqlite3_column_int64(s, 1);
  e->job_id = sqlite3_column_int64(s, 2);
  e->node_id = sqlite3_column_int64(s, 3);
  st_col_text(s, 4, e->kind, sizeof e->kind);
  st_col_text(s, 5, e->text, sizeof e->text);
}

static void id_row(sqlite3_stmt *s, void *item) { *(int64_t *)item = sqlite3_column_int64(s, 0); }

/* ---- nodes ---- */

int store_node_register(store_t *st, const char *name, const char *address,
                        const store_device_t *devices, int n_devices, int64_t *node_id) {
  int rc = check_text("node name", name, STORE_NAME_MAX, 0);
  if (!rc) rc = check_text("node address", address, STORE_ADDR_MAX, 0);
  if (!rc && (n_devices < 0 || (n_devices > 0 && !devices)))
    rc = err_set(FSDP_EINVAL, "node %s: %d devices given", name, n_devices);
  for (int i = 0; !rc && i < n_devices; i++) {
    const store_device_t *d = &devices[i];
    rc = check_text("device name", d->name, STORE_NAME_MAX, 0);
    if (!rc && d->index < 0)
      rc = err_set(FSDP_EINVAL, "node %s: device index %d: negative", name, d->index);
    if (!rc && (unsigned)d->kind > STORE_DEV_cuda)
      rc = err_set(FSDP_EINVAL, "node %s: device %d: kind %u: neither cpu nor cuda", name,
                   d->index, (unsigned)d->kind);
    if (!rc && d->memory_bytes > INT64_MAX)
      rc = err_set(FSDP_EINVAL, "node %s: device %d (%s): memory %llu bytes: at most %lld", name,
                   d->index, store_dev_kind_name(d->kind), (unsigned long long)d->memory_bytes,
                   (long long)INT64_MAX);
    for (int k = 0; !rc && k < i; k++)
      if (devices[k].index == d->index)
        rc = err_set(FSDP_EINVAL, "node %s: device index %d given twice", name, d->index);
  }
  if (rc) return rc;
  if ((rc = store_begin(st, 1))) return rc;
  int64_t now = store_now_ms();
  int64_t id = st_int(st, 0, "SELECT id FROM nodes WHERE name = ?", A_T(name));
  if (id == 0) {
    /* above the highest id handed out, and above the floor a restore left
     * (sqlite_sequence 'nodes': the ids the replaced database had handed
     * out, which nodes, events and logs still name) */
    st_exec(st,
            "INSERT INTO nodes(id, name, address, state, registered_ms, last_seen_ms) "
            "VALUES(max(coalesce((SELECT max(id) FROM nodes), 0), coalesce((SELECT seq FROM "
            "sqlite_sequence WHERE name = 'nodes'), 0)) + 1, ?, ?, 'ALIVE', ?, ?)",
            A_T(name), A_T(address), A_I(now), A_I(now));
    id = sqlite3_last_insert_rowid(st->db);
  } else {
    st_exec(st, "UPDATE nodes SET address = ?, state = 'ALIVE', stopped = 0, last_seen_ms = ? "
            "WHERE id = ?",
            A_T(address), A_I(now), A_I(id));
  }
  /* a device it no longer has goes, unless a job still holds it (that job's
   * attempt ends first and frees it) */
  store_device_t *old = NULL;
  int n_old = 0;
  st_collect(st, store_device_t, device_row, &old, &n_old,
             "SELECT " DEVICE_COLS " FROM devices WHERE node_id = ? AND job_id IS NULL", A_I(id));
  for (int k = 0; k < n_old; k++) {
    int kept = 0;
    for (int i = 0; i < n_devices && !kept; i++) kept = devices[i].index == old[k].index;
    if (!kept)
      st_exec(st, "DELETE FROM devices WHERE node_id = ? AND idx = ?", A_I(id), A_I(old[k].index));
  }
  free(old);
  for (int i = 0; i < n_devices; i++) {
    const store_device_t *d = &devices[i];
    st_exec(st,
            "INSERT INTO devices(node_id, idx, kind, name, memory_bytes) VALUES(?, ?, ?, ?, ?) "
            "ON CONFLICT(node_id, idx) DO UPDATE SET kind = excluded.kind, "
            "name = excluded.name, memory_bytes = excluded.memory_bytes",
            A_I(id), A_I(d->index), A_T(store_dev_kind_name(d->kind)), A_T(d->name),
            A_I(d->memory_bytes));
  }
  st_touch(st, id);
  st_event(st, 0, id, "node.registered", "node %s at %s registered with %d devices", name,
           address, n_devices);
  rc = store_end(st, 0);
  if (!rc && node_id) *node_id = id;
  return rc;
}

int store_node_drain(store_t *st, int64_t node_id, const char *reason) {
  int rc = check_text("reason", reason ? reason : "", STORE_DRAIN_MAX, 1);
  if (rc) return rc;
  if ((rc = store_begin(st, 1))) return rc;
  char name[STORE_NAME_MAX] = "", was[STORE_DRAIN_MAX] = "";
  sqlite3_stmt *s = st_query(st, "SELECT name, drain_reason FROM nodes WHERE id = ?", A_I(node_id));
  if (st_step(st, s) == 1) {
    st_col_text(s, 0, name, sizeof name);
    st_col_text(s, 1, was, sizeof was);
    sqlite3_reset(s);
  } else if (!st->rc) {
    return store_end(st, err_set(FSDP_ENOTFOUND, "node n-%lld: no such node (fsdpctl nodes lists "
                                 "them)", (long long)node_id));
  }
  const int drain = reason && reason[0];
  if (drain ? strcmp(was, reason) != 0 : was[0] != 0) { /* a change: one event */
    st_exec(st, "UPDATE nodes SET drain_reason = ? WHERE id = ?", A_T(drain ? reason : ""),
            A_I(node_id));
    st_touch(st, node_id);
    if (drain) st_event(st, 0, node_id, "node.drained", "node %s drained: %s", name, reason);
    else st_event(st, 0, node_id, "node.undrained", "node %s takes ranks again", name);
  }
  return store_end(st, 0);
}

int store_device_memory(store_t *st, int64_t node_id, int index, uint64_t bytes) {
  if (bytes > INT64_MAX)
    return err_set(FSDP_EINVAL, "node n-%lld device %d: memory %llu bytes", (long long)node_id,
                   index, (unsigned long long)bytes);
  int rc = store_begin(st, 1);
  if (rc) return rc;
  char name[STORE_NAME_MAX] = "";
  int64_t was = -1;
  sqlite3_stmt *s = st_query(st, "SELECT n.name, d.memory_bytes FROM devices d JOIN nodes n ON "
                             "n.id = d.node_id WHERE d.node_id = ? AND d.idx = ?", A_I(node_id),
                             A_I(index));
  if (st_step(st, s) == 1) {
    st_col_text(s, 0, name, sizeof name);
    was = sqlite3_column_int64(s, 1);
    sqlite3_reset(s);
  } else if (!st->rc) {
    return store_end(st, err_set(FSDP_ENOTFOUND, "node n-%lld has no device %d", (long long)node_id,
                                 index));
  }
  if (was >= 0 && (uint64_t)was != bytes) {
    st_exec(st, "UPDATE devices SET memory_bytes = ? WHERE node_id = ? AND idx = ?", A_I(bytes),
            A_I(node_id), A_I(index));
    st_touch(st, node_id);
    st_event(st, 0, node_id, "node.device_memory", "node %s device %d offers %.0f MiB now (was "
             "%.0f MiB)", name, index, (double)bytes / (1 << 20), (double)was / (1 << 20));
  }
  return store_end(st, 0);
}

int store_node_find(store_t *st, const char *name, int64_t *node_id, char *address, size_t cap) {
  *node_id = 0;
  if (cap) address[0] = 0;
  int rc = store_begin(st, 0);
  if (rc) return rc;
  sqlite3_stmt *s = st_query(st, "SELECT id, address FROM nodes WHERE name = ?", A_T(name));
  if (st_step(st, s) == 1) {
    *node_id = sqlite3_column_int64(s, 0);
    if (cap) st_col_text(s, 1, address, cap);
    sqlite3_reset(s);
  }
  return store_end(st, 0);
}

int64_t store_nodes_drained(store_t *st) {
  if (store_begin(st, 0)) return -1;
  const int64_t n = st_int(st, -1, "SELECT count(*) FROM nodes WHERE drain_reason != ''");
  return store_end(st, 0) ? -1 : n;
}

int store_node_mark_dead(store_t *st, int64_t node_id, int64_t last_seen_ms, int stopped,
                         int64_t **jobs, int *n_jobs) {
  *jobs = NULL, *n_jobs = 0;
  int rc = store_begin(st, 1);
  if (rc) return rc;
  char name[STORE_NAME_MAX] = "";
  sqlite3_stmt *s = st_query(st, "SELECT name FROM nodes WHERE id = ?", A_I(node_id));
  if (st_step(st, s) == 1) {
    st_col_text(s, 0, name, sizeof name);
    sqlite3_reset(s);
  } else if (!st->rc) {
    return store_end(st, err_set(FSDP_ENOTFOUND, "node n-%lld: no such node", (long long)node_id));
  }
  st_exec(st, "UPDATE nodes SET state = 'DEAD', stopped = ?, last_seen_ms = ? WHERE id = ?",
          A_I(stopped != 0), A_I(last_seen_ms), A_I(node_id));
  st_touch(st, node_id);
  int64_t *ids = NULL;
  int n = 0;
  st_collect(st, int64_t, id_row, &ids, &n,
             "SELECT DISTINCT job_id FROM ranks WHERE node_id = ? "
             "AND state IN ('ASSIGNED', 'RUNNING') ORDER BY job_id",
             A_I(node_id));
  int lost = st_exec(st,
                     "UPDATE ranks SET state = 'LOST' WHERE node_id = ? "
                     "AND state IN ('ASSIGNED', 'RUNNING')",
                     A_I(node_id));
  if (stopped)
    st_event(st, 0, node_id, "node.stopped", "node %s stopped (its fsdpd said so): %d ranks of %d "
             "jobs lost", name, lost, n);
  else
    st_event(st, 0, node_id, "node.dead", "node %s is dead (last heard %lld ms ago): %d ranks of "
             "%d jobs lost", name, (long long)(store_now_ms() - last_seen_ms), lost, n);
  rc = store_end(st, 0);
  if (rc) free(ids);
  else *jobs = ids, *n_jobs = n;
  return rc;
}

/* ---- jobs and attempts ---- */

static int check_job_spec(const store_job_spec_t *js) {
  int rc = check_text("job name", js->name, STORE_NAME_MAX, 0);
  if (!rc) rc = check_text("job mesh", js->mesh, STORE_MESH_MAX, 0);
  if (!rc) rc = check_text("job spec", js->spec, (size_t)1 << 30, 1);
  if (!rc && js->reason) rc = check_text("job reason", js->reason, STORE_REASON_MAX, 1);
  if (!rc && js->request_id) rc = check_text("request id", js->request_id, STORE_NAME_MAX, 1);
  if (!rc && (js->world_size <= 0 || js->max_restarts < 0))
    rc = err_set(FSDP_EINVAL, "job %s: world_size %d and max_restarts %d: need > 0 and >= 0",
                 js->name, js->world_size, js->max_restarts);
  return rc;
}

int store_job_submit_batch(store_t *st, const store_job_spec_t *specs, int n, int64_t *job_ids) {
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) rc = check_job_spec(&specs[i]);
  if (rc || n <= 0) return rc;
  if ((rc = store_begin(st, 1))) return rc;
  int64_t now = store_now_ms();
  for (int i = 0; i < n && !st->rc; i++) {
    const store_job_spec_t *js = &specs[i];
    st_exec(st,
            "INSERT INTO jobs(name, spec, world_size, mesh, state, reason, max_restarts, "
            "submitted_ms, request_id, checkpoint_dir) VALUES(?, ?, ?, ?, 'PENDING', ?, ?, ?, ?, ?)",
            A_T(js->name), A_T(js->spec), A_I(js->world_size), A_T(js->mesh),
            A_T(js->reason ? js->reason : ""), A_I(js->max_restarts), A_I(now),
            A_T(js->request_id && js->request_id[0] ? js->request_id : NULL),
            A_T(js->checkpoint_dir ? js->checkpoint_dir : ""));
    int64_t id = sqlite3_last_insert_rowid(st->db);
    st_event(st, id, 0, "job.submitted", "job %s submitted: %d ranks, mesh %s, max_restarts %d",
             js->name, js->world_size, js->mesh, js->max_restarts);
    if (job_ids) job_ids[i] = id;
  }
  return store_end(st, 0);
}

int store_job_submit(store_t *st, const store_job_spec_t *js, int64_t *job_id) {
  return store_job_submit_batch(st, js, 1, job_id);
}

/* The job's state and epoch; ENOTFOUND when there is no such job. */
typedef struct {
  store_job_state_t state;
  int64_t epoch;
  int restarts, max_restarts, world_size;
} job_brief_t;
static int job_brief(store_t *st, int64_t job_id, job_brief_t *b) {
  sqlite3_stmt *s = st_query(
      st, "SELECT state, epoch, restarts, max_restarts, world_size FROM jobs WHERE id = ?",
      A_I(job_id));
  int rc = st_step(st, s);
  if (rc < 0) return rc;
  if (rc == 0) return err_set(FSDP_ENOTFOUND, "job j-%lld: no such job", (long long)job_id);
  b->state = ST_ENUM(store_job_state_name, sqlite3_column_text(s, 0));
  b->epoch = sqlite3_column_int64(s, 1);
  b->restarts = sqlite3_column_int(s, 2);
  b->max_restarts = sqlite3_column_int(s, 3);
  b->world_size = sqlite3_column_int(s, 4);
  sqlite3_reset(s);
  return 0;
}

/* The fence: anything naming an attempt is checked against the job's
 * current epoch. An older one is FSDP_ESTALE, so nothing of a previous
 * attempt reaches the current one. running: the attempt must still run
 * (else FSDP_ESTALE too). */
static int job_fence(store_t *st, int64_t job_id, int64_t epoch, const char *what, int running,
                     job_brief_t *b) {
  int rc = job_brief(st, job_id, b);
  if (rc) return rc;
  if (epoch < b->epoch)
    return err_set(FSDP_ESTALE,
                   "job j-%lld: %s for epoch %lld, but the job is at epoch %lld: refused (it "
                   "belongs to an earlier attempt)",
                   (long long)job_id, what, (long long)epoch, (long long)b->epoch);
  if (epoch > b->epoch || epoch <= 0)
    return err_set(FSDP_ENOTFOUND, "job j-%lld: %s for epoch %lld, which never started",
                   (long long)job_id, what, (long long)epoch);
  /* an ended attempt is as stale as an older one: its ranks must give up */
  if (running && b->state != STORE_JOB_RUNNING)
    return err_set(FSDP_ESTALE, "job j-%lld: %s for epoch %lld, an attempt that has ended (job %s)",
                   (long long)job_id, what, (long long)epoch, store_job_state_name(b->state));
  return 0;
}

int store_jobs_set_pending_reasons(store_t *st, const int64_t *ids, const char *const *reasons,
                                   int n) {
  if (n <= 0) return 0;
  int rc = store_begin(st, 1);
  if (rc) return rc;
  for (int i = 0; i < n; i++) {
    const char *r = reasons[i] ? reasons[i] : "";
    int changed = st_exec(st, "UPDATE jobs SET reason = ? WHERE id = ? AND state = 'PENDING' AND "
                          "reason IS NOT ?", A_T(r), A_I(ids[i]), A_T(r));
    if (changed < 0) return store_end(st, changed);
    if (changed) st_event(st, ids[i], 0, "job.pending", "%s", r);
  }
  return store_end(st, 0);
}

/* Why placing a rank on (node, device) failed: the device is unknown, held,
 * or on a dead node. */
static int placement_err(store_t *st, int64_t job_id, const store_placement_t *p) {
  char node[STORE_NAME_MAX] = "?", state[16] = "";
  int64_t holder = -1;
  sqlite3_stmt *s = st_query(st,
                             "SELECT n.name, n.state, d.job_id FROM nodes n LEFT JOIN devices d "
                             "ON d.node_id = n.id AND d.idx = ? WHERE n.id = ?",
                             A_I(p->device_index), A_I(p->node_id));
  if (st_step(st, s) == 1) {
    st_col_text(s, 0, node, sizeof node);
    st_col_text(s, 1, state, sizeof state);
    holder = sqlite3_column_type(s, 2) == SQLITE_NULL ? 0 : sqlite3_column_int64(s, 2);
    sqlite3_reset(s);
  }
  if (st->rc) return st->rc;
  if (strcmp(state, "DEAD") == 0)
    return err_set(FSDP_ESTATE, "job j-%lld rank %d: node %s is dead", (long long)job_id,
                   p->rank, node);
  if (holder > 0)
    return err_set(FSDP_ESTATE, "job j-%lld rank %d: device %s:%d is held by job j-%lld",
                   (long long)job_id, p->rank, node, p->device_index, (long long)holder);
  return err_set(FSDP_ENOTFOUND, "job j-%lld rank %d: no device %d on node n-%lld (%s)",
                 (long long)job_id, p->rank, p->device_index, (long long)p->node_id, node);
}

int store_attempt_start(store_t *st, int64_t job_id, const store_placement_t *ranks, int n,
                        int64_t *epoch) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  char *seen = NULL;
  job_brief_t b;
  if ((rc = job_brief(st, job_id, &b))) goto out;
  if (b.state != STORE_JOB_PENDING) {
    rc = err_set(FSDP_ESTATE, "job j-%lld is %s: only a PENDING job starts an attempt",
                 (long long)job_id, store_job_state_name(b.state));
    goto out;
  }
  if (n != b.world_size || !ranks) {
    rc = err_set(FSDP_EINVAL, "job j-%lld: %d ranks placed, its world size is %d", (long long)job_id,
                 n, b.world_size);
    goto out;
  }
  if (!(seen = calloc((size_t)n, 1))) {
    rc = err_set(FSDP_ENOMEM, "job j-%lld: out of memory placing %d ranks", (long long)job_id, n);
    goto out;
  }
  /* above the last attempt, and above the floor a restore left for this job
   * (sqlite_sequence 'attempts:<id>': attempts the backup missed, whose
   * fsdpd work directories jobs/<id>/<attempt> exist), used up here */
  char floor_name[40];
  snprintf(floor_name, sizeof floor_name, "attempts:%lld", (long long)job_id);
  const int64_t floor = st_int(st, 0, "SELECT seq FROM sqlite_sequence WHERE name = ?",
                               A_T(floor_name));
  if (floor > 0) st_exec(st, "DELETE FROM sqlite_sequence WHERE name = ?", A_T(floor_name));
  int64_t ep = (floor > b.epoch ? floor : b.epoch) + 1, now = store_now_ms();
  uint8_t secret[RING_SECRET_BYTES];
  if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret) {
    rc = err_set_errno(FSDP_EIO, errno, "job j-%lld: getrandom (the attempt's ring secret)",
                       (long long)job_id);
    goto out;
  }
  st_exec(st, "INSERT INTO attempts(job_id, epoch, started_ms, ring_secret) VALUES(?, ?, ?, ?)",
          A_I(job_id), A_I(ep), A_I(now), A_B(secret, sizeof secret));
  explicit_bzero(secret, sizeof secret);
  for (int i = 0; i < n && !rc && !st->rc; i++) {
    const store_placement_t *p = &ranks[i];
    if (p->rank < 0 || p->rank >= n || seen[p->rank]) {
      rc = err_set(FSDP_EINVAL, "job j-%lld: rank %d placed twice or outside 0..%d",
                   (long long)job_id, p->rank, n - 1);
      break;
    }
    seen[p->rank] = 1;
    /* taking the device and checking it was free is one statement */
    if (st_exec(st,
                "UPDATE devices SET job_id = ? WHERE node_id = ? AND idx = ? AND job_id IS NULL "
                "AND (SELECT state FROM nodes WHERE nodes.id = devices.node_id) = 'ALIVE'",
                A_I(job_id), A_I(p->node_id), A_I(p->device_index)) == 0) {
      rc = placement_err(st, job_id, p);
      break;
    }
    st_touch(st, p->node_id);
    st_exec(st,
            "INSERT INTO ranks(job_id, epoch, rank, node_id, device_idx, shard_group, "
            "replica_group, state) VALUES(?, ?, ?, ?, ?, ?, ?, 'ASSIGNED')",
            A_I(job_id), A_I(ep), A_I(p->rank), A_I(p->node_id), A_I(p->device_index),
            A_I(p->shard_group), A_I(p->replica_group));
  }
  if (rc) goto out;
  st_exec(st,
          "UPDATE jobs SET state = 'RUNNING', epoch = ?, reason = '', "
          "started_ms = coalesce(started_ms, ?) WHERE id = ?",
          A_I(ep), A_I(now), A_I(job_id));
  st_event(st, job_id, 0, "attempt.started", "attempt %lld started: %d ranks placed",
           (long long)ep, n);
  if (epoch) *epoch = ep;
out:
  free(seen);
  return store_end(st, rc);
}

int store_attempt_secret(store_t *st, int64_t job_id, int64_t epoch,
                         uint8_t secret[RING_SECRET_BYTES]) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  sqlite3_stmt *s = st_query(st, "SELECT ring_secret FROM attempts WHERE job_id = ? AND epoch = ?",
                             A_I(job_id), A_I(epoch));
  rc = st_step(st, s);
  if (rc == 1) {
    int ok = sqlite3_column_bytes(s, 0) == RING_SECRET_BYTES;
    if (ok) memcpy(secret, sqlite3_column_blob(s, 0), RING_SECRET_BYTES);
    sqlite3_reset(s);
    rc = ok ? 0 : FSDP_ENOTFOUND;
  } else if (rc == 0) {
    rc = FSDP_ENOTFOUND;
  }
  if (rc == FSDP_ENOTFOUND)
    err_set(rc, "job j-%lld attempt %lld has no ring secret (it ended, or started before schema "
            "version 8, or there is no such attempt)", (long long)job_id, (long long)epoch);
  return store_end(st, rc);
}

int store_rank_running(store_t *st, int64_t job_id, int64_t epoch, int rank, int64_t node_id,
                       int64_t pid) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  job_brief_t b;
  if ((rc = job_fence(st, job_id, epoch, "rank start", 1, &b))) return store_end(st, rc);
  if (st_exec(st,
              "UPDATE ranks SET state = CASE state WHEN 'ASSIGNED' THEN 'RUNNING' ELSE state END, "
              "pid = ? WHERE job_id = ? AND epoch = ? AND rank = ? AND node_id = ?",
              A_I(pid), A_I(job_id), A_I(epoch), A_I(rank), A_I(node_id)) == 0 &&
      !st->rc)
    rc = err_set(FSDP_ENOTFOUND, "job j-%lld epoch %lld: no rank %d on node n-%lld", (long long)job_id,
                 (long long)epoch, rank, (long long)node_id);
  return store_end(st, rc);
}

/* What a running attempt's ranks say of it (in the caller's transaction). */
static store_attempt_verdict_t attempt_verdict(store_t *st, int64_t job_id, int64_t epoch) {
  int64_t bad = st_int(st, 0,
                       "SELECT count(*) FROM ranks WHERE job_id = ? AND epoch = ? "
                       "AND state IN ('FAILED', 'LOST')",
                       A_I(job_id), A_I(epoch));
  int64_t live = st_int(st, 0,
                        "SELECT count(*) FROM ranks WHERE job_id = ? AND epoch = ? "
                        "AND state IN ('ASSIGNED', 'RUNNING')",
                        A_I(job_id), A_I(epoch));
  int64_t stopped = st_int(st, 0,
                           "SELECT count(*) FROM ranks WHERE job_id = ? AND epoch = ? "
                           "AND state = 'STOPPED' AND exit_status = ?",
                           A_I(job_id), A_I(epoch), A_I(JOB_EXIT_PREEMPTED));
  /* a running attempt's rank is STOPPED with another status only by its
   * node's fence (store_rank_fenced; attempt_close leaves exit_status NULL):
   * it outranks a failure, which a peer's fence causes (its ring broke) */
  int64_t fenced = st_int(st, 0,
                          "SELECT count(*) FROM ranks WHERE job_id = ? AND epoch = ? "
                          "AND state = 'STOPPED' AND exit_status IS NOT NULL AND exit_status != ?",
                          A_I(job_id), A_I(epoch), A_I(JOB_EXIT_PREEMPTED));
  return fenced ? STORE_ATTEMPT_FENCED : bad ? STORE_ATTEMPT_FAILED : live ? STORE_ATTEMPT_GOING
         : stopped ? STORE_ATTEMPT_PREEMPTED : STORE_ATTEMPT_SUCCEEDED;
}

/* Keeps a rank's figures in the open transaction (never an older step over
 * a newer: a same step's later report replaces it, as in memory). */
static void rank_figures_set(store_t *st, const store_figures_t *f) {
  st_exec(st,
          "UPDATE ranks SET step = ?, loss = ?, tokens_per_s = ? WHERE job_id = ? AND epoch = ? "
          "AND rank = ? AND (step IS NULL OR step <= ?)",
          A_I(f->step), A_D(f->loss), A_D(f->tokens_per_s), A_I(f->job_id), A_I(f->epoch),
          A_I(f->rank), A_I(f->step));
}

int store_rank_figures(store_t *st, const store_figures_t *f, int n) {
  if (n <= 0) return 0;
  int rc = store_begin(st, 1);
  if (rc) return rc;
  for (int i = 0; i < n; i++) rank_figures_set(st, &f[i]);
  return store_end(st, 0);
}

static int rank_exit(store_t *st, int64_t job_id, int64_t epoch, int rank, int exit_status,
                     int fenced, const char *memory, const store_figures_t *figures,
                     store_attempt_verdict_t *verdict) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  job_brief_t b;
  if ((rc = job_fence(st, job_id, epoch, "rank exit report", 0, &b))) return store_end(st, rc);
  if (!st_int(st, 0, "SELECT 1 FROM ranks WHERE job_id = ? AND epoch = ? AND rank = ?",
              A_I(job_id), A_I(epoch), A_I(rank)) &&
      !st->rc)
    return store_end(st, err_set(FSDP_ENOTFOUND, "job j-%lld epoch %lld: no rank %d",
                                 (long long)job_id, (long long)epoch, rank));
  /* the first report counts; a rank already stopped or lost keeps its state.
   * A fenced one is STOPPED, unless it had succeeded as the fence came */
  if (!exit_status) fenced = 0;
  if (st_exec(st,
              "UPDATE ranks SET exit_status = ?, state = CASE WHEN state IN ('ASSIGNED', "
              "'RUNNING') THEN (CASE WHEN ? THEN 'STOPPED' WHEN ? = 0 THEN 'SUCCEEDED' "
              "WHEN ? = ? THEN 'STOPPED' ELSE 'FAILED' END) ELSE state END "
              "WHERE job_id = ? AND epoch = ? AND rank = ? AND exit_status IS NULL",
              A_I(exit_status), A_I(fenced != 0), A_I(exit_status), A_I(exit_status),
              A_I(JOB_EXIT_PREEMPTED), A_I(job_id), A_I(epoch), A_I(rank)) > 0)
    st_event(st, job_id,
             st_int(st, 0, "SELECT node_id FROM ranks WHERE job_id = ? AND epoch = ? AND rank = ?",
                    A_I(job_id), A_I(epoch), A_I(rank)),
             "rank.exited", fenced ? "rank %d of attempt %lld was stopped by its node's fence "
             "(status %d)" : "rank %d of attempt %lld exited with status %d", rank,
             (long long)epoch, exit_status);
  if (memory && *memory)
    st_exec(st, "UPDATE ranks SET memory = ? WHERE job_id = ? AND epoch = ? AND rank = ?",
            A_T(memory), A_I(job_id), A_I(epoch), A_I(rank));
  if (figures) {
    store_figures_t f = *figures;
    f.job_id = job_id, f.epoch = epoch, f.rank = rank;
    rank_figures_set(st, &f);
  }
  store_attempt_verdict_t v =
      b.state == STORE_JOB_RUNNING ? attempt_verdict(st, job_id, epoch) : STORE_ATTEMPT_ENDED;
  rc = store_end(st, 0);
  if (!rc && verdict) *verdict = v;
  return rc;
}

int store_rank_exit(store_t *st, int64_t job_id, int64_t epoch, int rank, int exit_status,
                    const char *memory, const store_figures_t *figures,
                    store_attempt_verdict_t *verdict) {
  return rank_exit(st, job_id, epoch, rank, exit_status, 0, memory, figures, verdict);
}

int store_rank_fenced(store_t *st, int64_t job_id, int64_t epoch, int rank, int exit_status,
                      const char *memory, const store_figures_t *figures,
                      store_attempt_verdict_t *verdict) {
  return rank_exit(st, job_id, epoch, rank, exit_status, 1, memory, figures, verdict);
}

int store_attempt_verdict(store_t *st, int64_t job_id, int64_t *epoch,
                          store_attempt_verdict_t *verdict) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  job_brief_t b;
  if ((rc = job_brief(st, job_id, &b))) return store_end(st, rc);
  store_attempt_verdict_t v =
      b.state == STORE_JOB_RUNNING ? attempt_verdict(st, job_id, b.epoch) : STORE_ATTEMPT_ENDED;
  rc = store_end(st, 0);
  if (!rc) *epoch = b.epoch, *verdict = v;
  return rc;
}

/* Closes a running attempt: its outcome, ranks still alive STOPPED, the
 * job's devices freed, its rendezvous data dropped (the fence refuses the
 * epoch from now on anyway; this keeps the table small). */
static void attempt_close(store_t *st, int64_t job_id, int64_t epoch, const char *outcome,
                          const char *reason, int64_t now) {
  /* its ring secret goes with it: the database (and its backups) keep only
   * the running attempts' */
  st_exec(st, "UPDATE attempts SET ended_ms = ?, outcome = ?, reason = ?, ring_secret = NULL "
          "WHERE job_id = ? AND epoch = ?",
          A_I(now), A_T(outcome), A_T(reason), A_I(job_id), A_I(epoch));
  st_exec(st,
          "UPDATE ranks SET state = 'STOPPED' WHERE job_id = ? AND epoch = ? "
          "AND state IN ('ASSIGNED', 'RUNNING')",
          A_I(job_id), A_I(epoch));
  sqlite3_stmt *held = st_query(st, "SELECT DISTINCT node_id FROM devices WHERE job_id = ?",
                                A_I(job_id));
  while (st_step(st, held) == 1) st_touch(st, sqlite3_column_int64(held, 0));
  st_exec(st, "UPDATE devices SET job_id = NULL WHERE job_id = ?", A_I(job_id));
  st_exec(st, "DELETE FROM rendezvous WHERE job_id = ? AND epoch = ?", A_I(job_id), A_I(epoch));
  /* its open checkpoints still missing a shard cannot complete: no rank of
   * it will report again; one with every shard in is the committer's */
  const int aborted =
      st_exec(st,
              "UPDATE checkpoints SET state = 'ABORTED', closed_ms = ?, reason = ? "
              "WHERE job_id = ? AND epoch = ? AND state = 'OPEN' AND shards > "
              "(SELECT count(*) FROM checkpoint_shards s WHERE s.job_id = checkpoints.job_id "
              "AND s.step = checkpoints.step)",
              A_I(now), A_T("its attempt ended before every shard was reported"), A_I(job_id),
              A_I(epoch));
  if (aborted > 0) {
    st->txn_ckpt_aborts += aborted;
    st_event(st, job_id, 0, "checkpoint.aborted", "attempt %lld ended with a checkpoint open",
             (long long)epoch);
  }
}

uint64_t store_ckpt_aborted_at_end(const store_t *st) { return st->ckpt_aborts_at_end; }

/* A job whose stop was asked (store_job_stop) and whose attempt `epoch`
 * has just been closed, for how (reason): CANCELLED with the stop's reason
 * and whether the stop's checkpoint was committed (one of this attempt,
 * committed since the stop was asked), never restarted or requeued. 1 when
 * it was such a job, 0 when no stop was asked. */
/* The reason of a stopped job (cancel --checkpoint) whose attempt epoch ended
 * (how: how it ended when no checkpoint came of the stop): the step kept, or
 * the latest committed; 0 when no stop was asked. */
static int job_stop_why(store_t *st, int64_t job_id, int64_t epoch, const char *how, char *why,
                        size_t len) {
  char asked[STORE_REASON_MAX] = "";
  int64_t stop_ms = -1;
  sqlite3_stmt *s = st_query(st, "SELECT stop_ms, stop_reason FROM jobs WHERE id = ? AND "
                             "stop_ms IS NOT NULL", A_I(job_id));
  if (st_step(st, s) == 1) {
    stop_ms = sqlite3_column_int64(s, 0);
    st_col_text(s, 1, asked, sizeof asked);
    sqlite3_reset(s);
  }
  if (stop_ms < 0) return 0;
  const int64_t kept = st_int(st, -1, "SELECT max(step) FROM checkpoints WHERE job_id = ? AND "
                              "epoch = ? AND state = 'COMMITTED' AND closed_ms >= ?",
                              A_I(job_id), A_I(epoch), A_I(stop_ms));
  const int64_t last = st_int(st, -1, "SELECT max(step) FROM checkpoints WHERE job_id = ? AND "
                              "state = 'COMMITTED'", A_I(job_id));
  if (kept > 0)
    snprintf(why, len, "%.150s; its ranks stopped at a step boundary and its checkpoint of "
             "step %lld was committed: fsdpctl resume goes on from it", asked, (long long)kept);
  else if (last > 0)
    snprintf(why, len, "%.150s; no checkpoint was written as it stopped (%.200s); the "
             "latest committed is step %lld, where fsdpctl resume goes on", asked, how,
             (long long)last);
  else
    snprintf(why, len, "%.150s; no checkpoint was written as it stopped (%.200s), and "
             "none was committed before", asked, how);
  return 1;
}

int store_job_stop_reason(store_t *st, int64_t job_id, int64_t epoch, const char *how, char *why,
                          size_t len) {
  return job_stop_why(st, job_id, epoch, how, why, len);
}

static int job_stop_end(store_t *st, int64_t job_id, int64_t epoch, const char *how, int64_t now) {
  char why[STORE_REASON_MAX];
  if (!job_stop_why(st, job_id, epoch, how, why, sizeof why)) return 0;
  st_exec(st, "UPDATE jobs SET state = 'CANCELLED', reason = ?, ended_ms = ? WHERE id = ?",
          A_T(why), A_I(now), A_I(job_id));
  st_event(st, job_id, 0, "job.cancelled", "attempt %lld stopped as asked: %s", (long long)epoch,
           why);
  return 1;
}

int store_attempt_requeue(store_t *st, int64_t job_id, int64_t epoch, const char *reason) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  job_brief_t b;
  if ((rc = job_fence(st, job_id, epoch, "requeue", 1, &b))) return store_end(st, rc);
  reason = reason ? reason : "";
  attempt_close(st, job_id, epoch, "CANCELLED", reason, store_now_ms());
  if (job_stop_end(st, job_id, epoch, reason, store_now_ms())) return store_end(st, 0);
  char why[STORE_REASON_MAX];
  snprintf(why, sizeof why, "attempt %lld stopped: %s; requeued, it resumes from its latest "
           "committed checkpoint", (long long)epoch, reason);
  st_exec(st, "UPDATE jobs SET state = 'PENDING', reason = ? WHERE id = ?", A_T(why), A_I(job_id));
  st_event(st, job_id, 0, "attempt.requeued", "attempt %lld: %s", (long long)epoch, reason);
  return store_end(st, 0);
}

int store_attempt_end(store_t *st, int64_t job_id, int64_t epoch, int succeeded,
                      const char *reason, store_job_state_t *state) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  job_brief_t b;
  if ((rc = job_fence(st, job_id, epoch, "attempt end", 1, &b))) return store_end(st, rc);
  reason = reason ? reason : "";
  int64_t now = store_now_ms();
  attempt_close(st, job_id, epoch, succeeded ? "SUCCEEDED" : "FAILED", reason, now);
  store_job_state_t next;
  char why[STORE_REASON_MAX];
  if (!succeeded && job_stop_end(st, job_id, epoch, reason, now)) {
    rc = store_end(st, 0);
    if (!rc && state) *state = STORE_JOB_CANCELLED;
    return rc;
  }
  if (succeeded) {
    next = STORE_JOB_SUCCEEDED;
    why[0] = 0;
  } else if (b.restarts < b.max_restarts) {
    next = STORE_JOB_PENDING;
    snprintf(why, sizeof why, "attempt %lld failed: %s; restart %d of %d", (long long)epoch,
             reason, b.restarts + 1, b.max_restarts);
  } else {
    next = STORE_JOB_FAILED;
    snprintf(why, sizeof why, "attempt %lld failed: %s; no restarts left (max_restarts %d)",
             (long long)epoch, reason, b.max_restarts);
  }
  st_exec(st,
          "UPDATE jobs SET state = ?, reason = ?, restarts = restarts + ?, "
          "ended_ms = CASE WHEN ? = 'PENDING' THEN NULL ELSE ? END WHERE id = ?",
          A_T(store_job_state_name(next)), A_T(why), A_I(next == STORE_JOB_PENDING),
          A_T(store_job_state_name(next)), A_I(now), A_I(job_id));
  st_event(st, job_id, 0, "attempt.ended", "attempt %lld %s%s%s: job %s", (long long)epoch,
           succeeded ? "succeeded" : "failed", *reason ? ": " : "", reason,
           store_job_state_name(next));
  rc = store_end(st, 0);
  if (!rc && state) *state = next;
  return rc;
}

int store_job_cancel(store_t *st, int64_t job_id, const char *reason, store_job_state_t *was) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  job_brief_t b;
  if ((rc = job_brief(st, job_id, &b))) return store_end(st, rc);
  if (b.state != STORE_JOB_PENDING && b.state != STORE_JOB_RUNNING)
    return store_end(st, err_set(FSDP_ESTATE, "job j-%lld already %s: nothing to cancel",
                                 (long long)job_id, store_job_state_name(b.state)));
  reason = reason && *reason ? reason : "cancelled";
  int64_t now = store_now_ms();
  if (b.state == STORE_JOB_RUNNING) attempt_close(st, job_id, b.epoch, "CANCELLED", reason, now);
  st_exec(st, "UPDATE jobs SET state = 'CANCELLED', reason = ?, ended_ms = ? WHERE id = ?",
          A_T(reason), A_I(now), A_I(job_id));
  st_event(st, job_id, 0, "job.cancelled", "job cancelled while %s: %s",
           store_job_state_name(b.state), reason);
  rc = store_end(st, 0);
  if (!rc && was) *was = b.state;
  return rc;
}

int store_job_stop(store_t *st, int64_t job_id, const char *reason, int64_t until_ms,
                   int64_t *epoch) {
  int rc = check_text("stop reason", reason, STORE_REASON_MAX, 1);
  if (rc || (rc = store_begin(st, 1))) return rc;
  job_brief_t b;
  if ((rc = job_brief(st, job_id, &b))) return store_end(st, rc);
  if (b.state != STORE_JOB_RUNNING)
    return store_end(st, err_set(FSDP_ESTATE, "job j-%lld is %s: only a running job is stopped "
                                 "with a checkpoint", (long long)job_id,
                                 store_job_state_name(b.state)));
  /* asked again: the first stop stands (its time and grace) */
  if (!st_int(st, 0, "SELECT 1 FROM jobs WHERE id = ? AND stop_ms IS NOT NULL", A_I(job_id))) {
    char why[STORE_REASON_MAX];
    snprintf(why, sizeof why, "stopping: its ranks checkpoint at their next step boundary, then it "
             "ends CANCELLED (%.400s)", reason);
    st_exec(st, "UPDATE jobs SET stop_ms = ?, stop_until_ms = ?, stop_reason = ?, reason = ? "
            "WHERE id = ?", A_I(store_now_ms()), A_I(until_ms), A_T(reason), A_T(why),
            A_I(job_id));
    st_event(st, job_id, 0, "job.stopping", "stop asked for attempt %lld: %s", (long long)b.epoch,
             reason);
  }
  rc = store_end(st, 0);
  if (!rc && epoch) *epoch = b.epoch;
  return rc;
}

int store_job_stopping(store_t *st, int64_t job_id, int64_t *stop_ms, int64_t *until_ms,
                       char *reason, size_t len) {
  *stop_ms = *until_ms = 0;
  int rc = store_begin(st, 0);
  if (rc) return rc;
  sqlite3_stmt *s = st_query(st, "SELECT stop_ms, coalesce(stop_until_ms, 0), stop_reason FROM "
                             "jobs WHERE id = ? AND stop_ms IS NOT NULL", A_I(job_id));
  if (st_step(st, s) == 1) {
    *stop_ms = sqlite3_column_int64(s, 0);
    *until_ms = sqlite3_column_int64(s, 1);
    if (reason) st_col_text(s, 2, reason, len);
    sqlite3_reset(s);
  }
  return store_end(st, 0);
}

int store_job_resume(store_t *st, int64_t job_id, const char *checkpoint_dir) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  job_brief_t b;
  if ((rc = job_brief(st, job_id, &b))) return store_end(st, rc);
  if (b.state != STORE_JOB_FAILED && b.state != STORE_JOB_CANCELLED)
    return store_end(st, err_set(FSDP_ESTATE, "job j-%lld is %s: only a FAILED or CANCELLED job "
                                 "can be resumed", (long long)job_id,
                                 store_job_state_name(b.state)));
  st_exec(st, "UPDATE jobs SET state = 'PENDING', restarts = 0, ended_ms = NULL, reason = ?, "
          "checkpoint_dir = coalesce(?, checkpoint_dir), stop_ms = NULL, stop_until_ms = NULL, "
          "stop_reason = NULL WHERE id = ?",
          A_T("resumed: waiting for its devices"), A_T(checkpoint_dir), A_I(job_id));
  st_event(st, job_id, 0, "job.resumed", "resumed after it was %s", store_job_state_name(b.state));
  return store_end(st, 0);
}

/* ---- rendezvous ---- */

int store_rendezvous_put(store_t *st, int64_t job_id, int64_t epoch, const char *group, int rank,
                         const void *payload, size_t len) {
  int rc = check_text("rendezvous group", group, STORE_NAME_MAX, 0);
  if (!rc && len > STORE_PAYLOAD_MAX)
    rc = err_set(FSDP_EINVAL, "rendezvous %s: payload of %zu bytes, at most %d", group, len,
                 STORE_PAYLOAD_MAX);
  if (!rc && len > 0 && !payload) rc = err_set(FSDP_EINVAL, "rendezvous %s: no payload", group);
  if (rc) return rc;
  if ((rc = store_begin(st, 1))) return rc;
  job_brief_t b;
  if ((rc = job_fence(st, job_id, epoch, "rendezvous put", 1, &b))) return store_end(st, rc);
  if (!st_int(st, 0, "SELECT 1 FROM ranks WHERE job_id = ? AND epoch = ? AND rank = ?",
              A_I(job_id), A_I(epoch), A_I(rank)) &&
      !st->rc)
    return store_end(st, err_set(FSDP_ENOTFOUND, "job j-%lld epoch %lld: no rank %d in rendezvous %s",
                                 (long long)job_id, (long long)epoch, rank, group));
  st_exec(st,
          "INSERT OR REPLACE INTO rendezvous(job_id, epoch, group_name, rank, payload) "
          "VALUES(?, ?, ?, ?, ?)",
          A_I(job_id), A_I(epoch), A_T(group), A_I(rank), A_B(payload, len));
  return store_end(st, 0);
}

int store_rendezvous_get(store_t *st, int64_t job_id, int64_t epoch, const char *group,
                         int expected, store_rendezvous_t *out) {
  memset(out, 0, sizeof *out);
  int rc = check_text("rendezvous group", group, STORE_NAME_MAX, 0);
  if (rc) return rc;
  if ((rc = store_begin(st, 0))) return rc;
  job_brief_t b;
  if ((rc = job_fence(st, job_id, epoch, "rendezvous get", 1, &b))) return store_end(st, rc);
  sqlite3_stmt *s = st_query(st,
                             "SELECT rank, payload FROM rendezvous WHERE job_id = ? AND epoch = ? "
                             "AND group_name = ? ORDER BY rank",
                             A_I(job_id), A_I(epoch), A_T(group));
  int cap = 0;
  while ((rc = st_step(st, s)) == 1) {
    if (out->n == cap) {
      cap = cap ? 2 * cap : 8;
      store_rendezvous_entry_t *grown = realloc(out->entry, (size_t)cap * sizeof *grown);
      if (!grown) break;
      out->entry = grown;
    }
    store_rendezvous_entry_t *e = &out->entry[out->n];
    e->rank = sqlite3_column_int(s, 0);
    e->len = (size_t)sqlite3_column_bytes(s, 1);
    e->data = malloc(e->len ? e->len : 1);
    if (!e->data) break;
    if (e->len) memcpy(e->data, sqlite3_column_blob(s, 1), e->len);
    out->n++;
  }
  if (rc == 1) { /* left the loop for memory */
    sqlite3_reset(s);
    rc = err_set(FSDP_ENOMEM, "rendezvous %s: out of memory", group);
  }
  rc = store_end(st, rc < 0 ? rc : 0);
  if (rc) store_rendezvous_free(out);
  else out->complete = out->n >= expected;
  return rc;
}

void store_rendezvous_free(store_rendezvous_t *r) {
  if (!r) return;
  for (int i = 0; i < r->n; i++) free(r->entry[i].data);
  free(r->entry);
  memset(r, 0, sizeof *r);
}

/* ---- events ---- */

int store_event_add(store_t *st, int64_t job_id, int64_t node_id, const char *kind,
                    const char *fmt, ...) {
  int rc = check_text("event kind", kind, STORE_KIND_MAX, 0);
  if (rc) return rc;
  if ((rc = store_begin(st, 1))) return rc;
  va_list ap;
  va_start(ap, fmt);
  st_eventv(st, job_id, node_id, kind, fmt, ap);
  va_end(ap);
  return store_end(st, 0);
}

int store_event_purge(store_t *st, int64_t before_ms, int max, int *removed) {
  if (removed) *removed = 0;
  int rc = store_begin(st, 1);
  if (rc) return rc;
  const int64_t oldest = st_int(st, INT64_MAX, "SELECT time_ms FROM events ORDER BY id LIMIT 1");
  const int64_t ahead = store_now_ms() + STORE_CLOCK_AHEAD_MS;
  if (oldest != INT64_MAX && oldest > ahead) {
    /* The oldest rows are dated in the future: the clock was set ahead when
     * they were written and then back. Waiting for their date would keep
     * every row after them, for years if the clock was years ahead. But ids
     * follow the order of writing: rows before one that is older than the
     * cut were written before it, so they are older too, whatever they say.
     * The first row dated sensibly is found from where the last pass found
     * it (the rows before it are skipped once, not at every pass). */
    const int64_t id = st_int(st, 0, "SELECT id FROM events WHERE id >= ? AND time_ms <= ? ORDER "
                              "BY id LIMIT 1", A_I(st->event_sane_id), A_I(ahead));
    if (!id || st_int(st, 0, "SELECT time_ms FROM events WHERE id = ?", A_I(id)) >= before_ms) {
      /* none yet, or it is recent enough: they wait */
      if (id) st->event_sane_id = id;
      return store_end(st, 0);
    }
    const int64_t n = st_exec(st, "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE "
                              "id < ? ORDER BY id LIMIT ?)", A_I(id), A_I(max > 0 ? max : 1));
    if (removed && n > 0) *removed = (int)n;
    return store_end(st, 0);
  }
  /* the oldest is recent enough: nothing to read through (the usual pass) */
  if (oldest >= before_ms) return store_end(st, 0);
  /* ids grow with time: the oldest max rows, of which those before the cut;
   * never the newest, whose id SQLite would hand out again (a follower
   * paging after it would miss the next ones) */
  const int64_t n = st_exec(st,
                            "DELETE FROM events WHERE id IN (SELECT id FROM events ORDER BY id "
                            "LIMIT ?) AND time_ms < ? AND id < (SELECT max(id) FROM events)",
                            A_I(max > 0 ? max : 1), A_I(before_ms));
  if (removed && n > 0) *removed = (int)n;
  return store_end(st, 0);
}

int store_job_purgeable(store_t *st, int64_t before_ms, int max, int64_t **ids, int *n) {
  *ids = NULL, *n = 0;
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, int64_t, id_row, ids, n,
                  "SELECT id FROM jobs WHERE ended_ms < ? AND state IN ('SUCCEEDED', 'FAILED', "
                  "'CANCELLED') AND NOT EXISTS (SELECT 1 FROM devices WHERE job_id = jobs.id) "
                  "ORDER BY ended_ms LIMIT ?",
                  A_I(before_ms), A_I(max > 0 ? max : 1));
  return store_end(st, rc);
}

int store_job_purge(store_t *st, const int64_t *ids, int n) {
  if (n <= 0) return FSDP_OK;
  int rc = store_begin(st, 1);
  if (rc) return rc;
  /* the audit line first: it is then the newest event, so the removed jobs'
   * events never include the newest, whose id SQLite would hand out again */
  char list[STORE_REASON_MAX - 64];
  size_t k = 0;
  for (int i = 0; i < n && k < sizeof list; i++)
    k += (size_t)snprintf(list + k, sizeof list - k, "%sj-%lld", i ? ", " : "", (long long)ids[i]);
  if (k >= sizeof list) snprintf(list + sizeof list - 5, 5, "...");
  st_event(st, 0, 0, "jobs.removed", "%d ended job(s) removed from the store (retention): %s", n,
           list);
  for (int i = 0; i < n && !st->rc; i++) {
    const int64_t id = ids[i];
    /* only an ended job (what held its devices went with its end) */
    if (!st_int(st, 0, "SELECT 1 FROM jobs WHERE id = ? AND state IN ('SUCCEEDED', 'FAILED', "
                "'CANCELLED') AND NOT EXISTS (SELECT 1 FROM devices WHERE job_id = ?)",
                A_I(id), A_I(id))) {
      if (!st->rc) rc = err_set(FSDP_ESTATE, "job j-%lld: not an ended job; not removed", (long long)id);
      break;
    }
    /* children first: the foreign keys */
    st_exec(st, "DELETE FROM rendezvous WHERE job_id = ?", A_I(id));
    st_exec(st, "DELETE FROM ranks WHERE job_id = ?", A_I(id));
    st_exec(st, "DELETE FROM attempts WHERE job_id = ?", A_I(id));
    st_exec(st, "DELETE FROM checkpoint_shards WHERE job_id = ?", A_I(id));
    st_exec(st, "DELETE FROM checkpoints WHERE job_id = ?", A_I(id));
    st_exec(st, "DELETE FROM checkpoints_damaged WHERE job_id = ?", A_I(id));
    st_exec(st, "DELETE FROM events WHERE job_id = ?", A_I(id));
    st_exec(st, "DELETE FROM jobs WHERE id = ?", A_I(id));
    st_exec(st, "DELETE FROM sqlite_sequence WHERE name = 'attempts:' || ?", A_I(id));
  }
  return store_end(st, rc);
}

int store_event_list(store_t *st, int64_t job_id, int64_t after_id, int limit,
                     store_event_t **events, int *n) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  const int64_t lim = limit > 0 ? limit : -1; /* SQLite: a negative LIMIT is none */
  /* one statement each, so a job's events come through events_job; the
   * newest are read backwards from the end of the index, then turned */
#define EVENT_SELECT "SELECT id, time_ms, job_id, node_id, kind, text FROM events "
  if (after_id == STORE_EVENTS_NEWEST && job_id > 0)
    rc = st_collect(st, store_event_t, event_row, events, n,
                    "SELECT * FROM (" EVENT_SELECT "WHERE job_id = ? ORDER BY id DESC LIMIT ?) "
                    "ORDER BY id", A_I(job_id), A_I(lim));
  else if (after_id == STORE_EVENTS_NEWEST)
    rc = st_collect(st, store_event_t, event_row, events, n,
                    "SELECT * FROM (" EVENT_SELECT "ORDER BY id DESC LIMIT ?) ORDER BY id", A_I(lim));
  else if (job_id > 0)
    rc = st_collect(st, store_event_t, event_row, events, n,
                    EVENT_SELECT "WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?", A_I(job_id),
                    A_I(after_id), A_I(lim));
  else
    rc = st_collect(st, store_event_t, event_row, events, n,
                    EVENT_SELECT "WHERE id > ? ORDER BY id LIMIT ?", A_I(after_id), A_I(lim));
#undef EVENT_SELECT
  return store_end(st, rc);
}

/* ---- readers ---- */

int store_job_by_request(store_t *st, const char *request_id, int64_t *job_id) {
  *job_id = 0;
  int rc = store_begin(st, 0);
  if (rc) return rc;
  *job_id = st_int(st, 0, "SELECT id FROM jobs WHERE request_id = ?", A_T(request_id));
  if (!*job_id && !st->rc)
    rc = err_set(FSDP_ENOTFOUND, "no job was submitted with request id %.64s", request_id);
  return store_end(st, rc);
}

int store_job_get(store_t *st, int64_t job_id, store_job_t *job) {
  memset(job, 0, sizeof *job);
  int rc = store_begin(st, 0);
  if (rc) return rc;
  sqlite3_stmt *s = st_query(st, "SELECT " JOB_COLS ", spec FROM jobs WHERE id = ?", A_I(job_id));
  rc = st_step(st, s);
  if (rc == 0) rc = err_set(FSDP_ENOTFOUND, "job j-%lld: no such job", (long long)job_id);
  if (rc == 1) {
    job_row(s, job);
    const unsigned char *spec = sqlite3_column_text(s, 12);
    job->spec = strdup(spec ? (const char *)spec : "");
    rc = job->spec ? 0 : err_set(FSDP_ENOMEM, "job j-%lld: out of memory", (long long)job_id);
  }
  return store_end(st, rc);
}

void store_job_free(store_job_t *job) {
  if (!job) return;
  free(job->spec);
  job->spec = NULL;
}

int store_job_list(store_t *st, unsigned states, int64_t before_id, int limit, store_job_t **jobs,
                   int *n) {
  const char *name[STORE_JOB_CANCELLED + 1]; /* the states asked for; NULL matches none */
  for (int i = 0; i <= STORE_JOB_CANCELLED; i++)
    name[i] = !states || (states & STORE_JOB_BIT(i)) ? store_job_state_name((store_job_state_t)i) : NULL;
  _Static_assert(STORE_JOB_CANCELLED == 4, "one parameter per state below");
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_job_t, job_row, jobs, n,
                  "SELECT * FROM (SELECT " JOB_COLS " FROM jobs WHERE state IN (?, ?, ?, ?, ?) "
                  "AND id < ? ORDER BY id DESC LIMIT ?) ORDER BY id",
                  A_T(name[0]), A_T(name[1]), A_T(name[2]), A_T(name[3]), A_T(name[4]),
                  A_I(before_id > 0 ? before_id : INT64_MAX), A_I(limit > 0 ? limit : -1));
  return store_end(st, rc);
}

static void job_dir_row(sqlite3_stmt *s, void *item) {
  store_job_dir_t *j = item;
  j->id = sqlite3_column_int64(s, 0);
  j->state = ST_ENUM(store_job_state_name, sqlite3_column_text(s, 1));
  j->dir_unknown = sqlite3_column_type(s, 2) == SQLITE_NULL;
}

int store_jobs_by_checkpoint_dir(store_t *st, const char *dir, int any_state,
                                 store_job_dir_t **jobs, int *n) {
  *jobs = NULL, *n = 0;
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_job_dir_t, job_dir_row, jobs, n,
                  /* +state: the planner would walk every live job through
                   * jobs_state instead of the few rows of this directory
                   * (NULL: live jobs only, stored before schema 6) */
                  "SELECT id, state, checkpoint_dir FROM jobs WHERE (checkpoint_dir = ? OR "
                  "checkpoint_dir IS NULL) AND (? OR +state IN ('PENDING', 'RUNNING')) ORDER BY id",
                  A_T(dir), A_I(any_state != 0));
  return store_end(st, rc);
}

int store_job_ckpt_dir_next(store_t *st, int64_t after_id, store_job_ckpt_dir_t *out) {
  memset(out, 0, sizeof *out);
  int rc = store_begin(st, 0);
  if (rc) return rc;
  /* '' (none) and NULL (not known) both sort before any path */
  sqlite3_stmt *s = st_query(st, "SELECT j.id, j.state, j.checkpoint_dir, (SELECT a.ended_ms FROM "
                             "attempts a WHERE a.job_id = j.id AND a.epoch = j.epoch) FROM jobs j "
                             "WHERE j.id > ? AND j.checkpoint_dir > '' ORDER BY j.id LIMIT 1",
                             A_I(after_id));
  rc = st_step(st, s);
  if (rc == 0) rc = err_set(FSDP_ENOENT, "no job after j-%lld has a checkpoint_dir",
                            (long long)after_id);
  if (rc == 1) {
    out->id = sqlite3_column_int64(s, 0);
    out->state = ST_ENUM(store_job_state_name, sqlite3_column_text(s, 1));
    snprintf(out->dir, sizeof out->dir, "%s", (const char *)sqlite3_column_text(s, 2));
    out->ended_ms = sqlite3_column_int64(s, 3); /* NULL (none, or running): 0 */
    rc = FSDP_OK;
  }
  return store_end(st, rc);
}

int store_job_ids(store_t *st, store_job_state_t state, int64_t **ids, int *n) {
  *ids = NULL, *n = 0;
  int rc = store_begin(st, 0);
  if (rc) return rc;
  /* the state index holds the ids in order: no table row is read, nothing sorted */
  rc = st_collect(st, int64_t, id_row, ids, n, "SELECT id FROM jobs WHERE state = ? ORDER BY id",
                  A_T(store_job_state_name(state)));
  return store_end(st, rc);
}

typedef struct {
  int state;
  int64_t n;
} store_count_t;

static void count_row(sqlite3_stmt *s, void *item) {
  store_count_t *c = item;
  c->state = ST_ENUM(store_job_state_name, sqlite3_column_text(s, 0));
  c->n = sqlite3_column_int64(s, 1);
}

int store_job_counts(store_t *st, int64_t counts[STORE_JOB_CANCELLED + 1]) {
  memset(counts, 0, sizeof(int64_t) * (STORE_JOB_CANCELLED + 1));
  store_count_t *v = NULL;
  int n = 0, rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_count_t, count_row, &v, &n,
                  "SELECT state, count(*) FROM jobs GROUP BY state");
  rc = store_end(st, rc);
  for (int i = 0; !rc && i < n; i++)
    if (v[i].state >= 0 && v[i].state <= STORE_JOB_CANCELLED) counts[v[i].state] += v[i].n;
  free(v);
  return rc;
}

void store_jobs_free(store_job_t *jobs, int n) {
  for (int i = 0; jobs && i < n; i++) store_job_free(&jobs[i]);
  free(jobs);
}

/* Hands each of nodes (by id) its run of devs (by node, index); frees devs.
 * On failure frees the nodes too. */
static int nodes_attach(int rc, store_node_t **nodes, int *n, store_device_t *devs, int nd) {
  for (int i = 0, d = 0; !rc && i < *n; i++) {
    store_node_t *node = &(*nodes)[i];
    while (d < nd && devs[d].node_id < node->id) d++;
    int first = d;
    while (d < nd && devs[d].node_id == node->id) d++;
    if (d == first) continue;
    node->devices = malloc((size_t)(d - first) * sizeof *devs);
    if (!node->devices) {
      rc = err_set(FSDP_ENOMEM, "listing nodes: out of memory");
      break;
    }
    memcpy(node->devices, devs + first, (size_t)(d - first) * sizeof *devs);
    node->n_devices = d - first;
  }
  free(devs);
  if (rc) {
    store_nodes_free(*nodes, *n);
    *nodes = NULL;
    *n = 0;
  }
  return rc;
}

int store_node_list(store_t *st, store_node_t **nodes, int *n) {
  *nodes = NULL;
  *n = 0;
  int rc = store_begin(st, 0);
  if (rc) return rc;
  store_device_t *devs = NULL;
  int nd = 0;
  rc = st_collect(st, store_node_t, node_row, nodes, n,
                  "SELECT id, name, address, state, registered_ms, last_seen_ms, drain_reason, stopped "
                  "FROM nodes ORDER BY id");
  if (!rc)
    rc = st_collect(st, store_device_t, device_row, &devs, &nd,
                    "SELECT " DEVICE_COLS " FROM devices ORDER BY node_id, idx");
  return nodes_attach(store_end(st, rc), nodes, n, devs, nd);
}

int store_nodes_get(store_t *st, const int64_t *ids, int n_ids, store_node_t **nodes, int *n) {
  *nodes = NULL;
  *n = 0;
  if (n_ids <= 0) return 0;
  /* the ids as a JSON array, read back by json_each: one statement for any number */
  char *list = malloc((size_t)n_ids * 21 + 3);
  if (!list) return err_set(FSDP_ENOMEM, "reading nodes: out of memory");
  size_t at = 0;
  list[at++] = '[';
  for (int i = 0; i < n_ids; i++) at += (size_t)sprintf(list + at, "%s%lld", i ? "," : "", (long long)ids[i]);
  list[at++] = ']', list[at] = 0;
  int rc = store_begin(st, 0);
  if (rc) return free(list), rc;
  store_device_t *devs = NULL;
  int nd = 0;
  rc = st_collect(st, store_node_t, node_row, nodes, n,
                  "SELECT id, name, address, state, registered_ms, last_seen_ms, drain_reason, stopped "
                  "FROM nodes WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id", A_T(list));
  if (!rc)
    rc = st_collect(st, store_device_t, device_row, &devs, &nd,
                    "SELECT " DEVICE_COLS " FROM devices WHERE node_id IN (SELECT value FROM "
                    "json_each(?)) ORDER BY node_id, idx", A_T(list));
  free(list);
  return nodes_attach(store_end(st, rc), nodes, n, devs, nd);
}

void store_nodes_touched(store_t *st, int64_t **ids, int *n, int *all) {
  *all = st->touched_all;
  *ids = st->touched_all ? NULL : st->touched;
  *n = st->touched_all ? 0 : st->n_touched;
  if (st->touched_all) free(st->touched);
  st->touched = NULL, st->n_touched = st->cap_touched = 0, st->touched_all = 0;
}

void store_nodes_free(store_node_t *nodes, int n) {
  for (int i = 0; nodes && i < n; i++) free(nodes[i].devices);
  free(nodes);
}

int store_free_devices(store_t *st, store_device_t **devices, int *n) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_device_t, device_row, devices, n,
                  "SELECT " DEVICE_COLS " FROM devices WHERE job_id IS NULL "
                  "AND node_id IN (SELECT id FROM nodes WHERE state = 'ALIVE') "
                  "ORDER BY node_id, idx");
  return store_end(st, rc);
}

int store_rank_node(store_t *st, int64_t job_id, int64_t epoch, int rank, int64_t *node_id,
                    char *name, size_t name_cap) {
  *node_id = 0;
  if (name_cap) name[0] = 0;
  int rc = store_begin(st, 0);
  if (rc) return rc;
  sqlite3_stmt *s = st_query(st,
                             "SELECT nodes.id, nodes.name FROM ranks JOIN nodes ON nodes.id = "
                             "ranks.node_id WHERE ranks.job_id = ? AND ranks.epoch = ? AND "
                             "ranks.rank = ?",
                             A_I(job_id), A_I(epoch), A_I(rank));
  if (st_step(st, s) == 1) {
    *node_id = sqlite3_column_int64(s, 0);
    st_col_text(s, 1, name, name_cap);
    sqlite3_reset(s);
  } else if (!st->rc) {
    rc = err_set(FSDP_ENOTFOUND, "job j-%lld attempt %lld has no rank %d", (long long)job_id,
                 (long long)epoch, rank);
  }
  return store_end(st, rc);
}

int store_ranks_of_node(store_t *st, int64_t node_id, store_rank_t **ranks, int *n) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  /* attempt_close stops every live rank of an ended attempt, so the live
   * ones are the running jobs' current attempts */
  rc = st_collect(st, store_rank_t, rank_row, ranks, n,
                  "SELECT " RANK_COLS " FROM ranks WHERE node_id = ? "
                  "AND state IN ('ASSIGNED', 'RUNNING') ORDER BY job_id, rank",
                  A_I(node_id));
  return store_end(st, rc);
}

int store_ranks_of_job(store_t *st, int64_t job_id, int64_t epoch, store_rank_t **ranks, int *n) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_rank_t, rank_row, ranks, n,
                  "SELECT " RANK_COLS " FROM ranks WHERE job_id = ? "
                  "AND epoch = (CASE WHEN ? > 0 THEN ? ELSE "
                  "(SELECT epoch FROM jobs WHERE id = ?) END) ORDER BY rank",
                  A_I(job_id), A_I(epoch), A_I(epoch), A_I(job_id));
  return store_end(st, rc);
}

static void figures_row(sqlite3_stmt *s, void *item) {
  store_figures_t *f = item;
  f->job_id = sqlite3_column_int64(s, 0);
  f->epoch = sqlite3_column_int64(s, 1);
  f->rank = sqlite3_column_int(s, 2);
  f->step = sqlite3_column_int64(s, 3);
  f->loss = st_col_real(s, 4), f->tokens_per_s = st_col_real(s, 5);
}

int store_rank_figures_of(store_t *st, int64_t job_id, int64_t epoch, store_figures_t **figures,
                          int *n) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_figures_t, figures_row, figures, n,
                  "SELECT job_id, epoch, rank, step, loss, tokens_per_s FROM ranks "
                  "WHERE job_id = ? AND epoch = ? AND step IS NOT NULL ORDER BY rank",
                  A_I(job_id), A_I(epoch));
  return store_end(st, rc);
}

void store_array_free(void *array) { free(array); }

/* ---- checkpoints ---------------------------------------------------------------- */

static const char *const store_ckpt_names[] = {
#define XX(s) #s,
    STORE_CKPT_STATES(XX)
#undef XX
};

const char *store_ckpt_state_name(store_ckpt_state_t s) {
  return (unsigned)s < sizeof store_ckpt_names / sizeof *store_ckpt_names ? store_ckpt_names[s] : "?";
}

#define CKPT_COLS                                                                           \
  "c.job_id, c.step, c.epoch, c.state, c.shards, c.dir, c.opened_ms, c.closed_ms, c.reason, " \
  "c.removed, (SELECT count(*) FROM checkpoint_shards s WHERE s.job_id = c.job_id AND "        \
  "s.step = c.step), (SELECT coalesce(sum(bytes), 0) FROM checkpoint_shards s WHERE "         \
  "s.job_id = c.job_id AND s.step = c.step)"

/* The same columns of a damaged checkpoint a newer attempt wrote again. */
#define CKPT_DAMAGED_COLS                                                                   \
  "d.job_id, d.step, d.epoch, 'ABORTED', d.shards, d.dir, d.opened_ms, d.closed_ms, "       \
  "d.reason, d.removed, d.reported, d.bytes"

static void ckpt_row(sqlite3_stmt *s, void *item) {
  store_ckpt_t *c = item;
  c->job_id = sqlite3_column_int64(s, 0);
  c->step = sqlite3_column_int64(s, 1);
  c->epoch = sqlite3_column_int64(s, 2);
  c->state = (store_ckpt_state_t)st_enum(store_ckpt_names, 3, sqlite3_column_text(s, 3));
  c->shards = sqlite3_column_int(s, 4);
  st_col_text(s, 5, c->dir, sizeof c->dir);
  c->opened_ms = sqlite3_column_int64(s, 6);
  c->closed_ms = sqlite3_column_int64(s, 7);
  st_col_text(s, 8, c->reason, sizeof c->reason);
  c->removed = sqlite3_column_int(s, 9);
  c->reported = sqlite3_column_int(s, 10);
  c->bytes = (uint64_t)sqlite3_column_int64(s, 11);
}

static void ckpt_shard_row(sqlite3_stmt *s, void *item) {
  store_ckpt_shard_t *x = item;
  x->shard = sqlite3_column_int(s, 0);
  x->rank = sqlite3_column_int(s, 1);
  x->bytes = (uint64_t)sqlite3_column_int64(s, 2);
  x->sum = (uint64_t)sqlite3_column_int64(s, 3);
}

/* The checkpoint (job, step) in *out; 0 when there is none. */
static int ckpt_get(store_t *st, int64_t job_id, int64_t step, store_ckpt_t *out) {
  store_ckpt_t *v = NULL;
  int n = 0;
  int rc = st_collect(st, store_ckpt_t, ckpt_row, &v, &n,
                      "SELECT " CKPT_COLS " FROM checkpoints c WHERE c.job_id = ? AND c.step = ?",
                      A_I(job_id), A_I(step));
  if (!rc && n) *out = v[0];
  free(v);
  return rc < 0 ? rc : n;
}

/* The checkpoint (job, step) as attempt epoch finds it, in *c: 1, or 0
 * when there is none for it; in a write transaction. The attempt is fenced
 * (job_fence: an older or ended one is FSDP_ESTALE). An older attempt's
 * checkpoint that did not commit is forgotten (its row and shards: the one
 * this attempt writes replaces it); a committed one is FSDP_ESTATE. */
static int ckpt_for_epoch(store_t *st, int64_t job_id, int64_t step, int64_t epoch,
                          store_ckpt_t *c) {
  job_brief_t b;
  int have = job_fence(st, job_id, epoch, "checkpoint report", 1, &b);
  if (have) return have;
  have = ckpt_get(st, job_id, step, c);
  if (have <= 0) return have;
  if (c->state == STORE_CKPT_COMMITTED)
    return err_set(FSDP_ESTATE, "job j-%lld: the checkpoint of step %lld is already committed",
                   (long long)job_id, (long long)step);
  if (c->epoch >= epoch) return 1;
  /* one found damaged is kept, its reason and its files' place with it */
  if (c->state == STORE_CKPT_ABORTED && !strncmp(c->reason, "damaged:", 8))
    st_exec(st, "INSERT OR REPLACE INTO checkpoints_damaged(job_id, step, epoch, shards, dir, "
            "opened_ms, closed_ms, reason, removed, reported, bytes) VALUES(?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?, ?)", A_I(job_id), A_I(step), A_I(c->epoch), A_I(c->shards), A_T(c->dir),
            A_I(c->opened_ms), A_I(c->closed_ms), A_T(c->reason), A_I(c->removed),
            A_I(c->reported), A_I((int64_t)c->bytes));
  st_exec(st, "DELETE FROM checkpoint_shards WHERE job_id = ? AND step = ?", A_I(job_id), A_I(step));
  st_exec(st, "DELETE FROM checkpoints WHERE job_id = ? AND step = ?", A_I(job_id), A_I(step));
  return st->rc ? st->rc : 0;
}

int store_ckpt_report(store_t *st, int64_t job_id, int64_t epoch, int64_t step, int shards,
                      const char *dir, const store_ckpt_shard_t *sh, store_ckpt_t *out) {
  int rc = check_text("checkpoint directory", dir, STORE_PATH_MAX, 0);
  if (!rc && (step < 0 || shards < 1 || sh->shard < 0 || sh->shard >= shards))
    rc = err_set(FSDP_EINVAL, "checkpoint: step %lld, shard %d of %d: out of range",
                 (long long)step, sh->shard, shards);
  if (rc || (rc = store_begin(st, 1))) return rc;
  store_ckpt_t c;
  int have = ckpt_for_epoch(st, job_id, step, epoch, &c);
  if (have < 0) return store_end(st, have);
  const int64_t now = store_now_ms();
  if (have && c.state == STORE_CKPT_ABORTED) {
    /* a late shard of its own attempt: the checkpoint stays aborted */
    return store_end(st, err_set(FSDP_ESTATE, "job j-%lld: the checkpoint of step %lld was aborted "
                                 "(%s); this shard comes too late", (long long)job_id,
                                 (long long)step, c.reason));
  }
  if (!have) {
    st_exec(st,
            "INSERT INTO checkpoints(job_id, step, epoch, state, shards, dir, opened_ms) "
            "VALUES(?, ?, ?, 'OPEN', ?, ?, ?)",
            A_I(job_id), A_I(step), A_I(epoch), A_I(shards), A_T(dir), A_I(now));
    st_event(st, job_id, 0, "checkpoint.opened", "step %lld: %d shards into %s", (long long)step,
             shards, dir);
  } else if (c.shards != shards || strcmp(c.dir, dir)) {
    return store_end(st, err_set(FSDP_EINVAL, "job j-%lld: checkpoint of step %lld has %d shards "
                                 "in %s; this report says %d in %s", (long long)job_id,
                                 (long long)step, c.shards, c.dir, shards, dir));
  }
  int64_t prev = st_int(st, -1, "SELECT sum FROM checkpoint_shards WHERE job_id = ? AND step = ? "
                        "AND shard = ?", A_I(job_id), A_I(step), A_I(sh->shard));
  if (prev == -1 && !st->rc &&
      !st_int(st, 0, "SELECT 1 FROM checkpoint_shards WHERE job_id = ? AND step = ? AND shard = ?",
              A_I(job_id), A_I(step), A_I(sh->shard))) {
    st_exec(st, "INSERT INTO checkpoint_shards(job_id, step, shard, rank, bytes, sum) "
            "VALUES(?, ?, ?, ?, ?, ?)", A_I(job_id), A_I(step), A_I(sh->shard), A_I(sh->rank),
            A_I((int64_t)sh->bytes), A_I((int64_t)sh->sum));
  } else if ((uint64_t)prev != sh->sum) {
    return store_end(st, err_set(FSDP_EEXIST, "job j-%lld: shard %d of the checkpoint of step %lld "
                                 "was reported with another checksum", (long long)job_id,
                                 sh->shard, (long long)step));
  }
  if ((rc = ckpt_get(st, job_id, step, out)) < 0) return store_end(st, rc);
  return store_end(st, 0);
}

int store_ckpt_damaged(store_t *st, int64_t job_id, int64_t epoch, int64_t step,
                       const char *reason, const char *dir, store_ckpt_t *out, int *changed) {
  *changed = 0;
  int rc = reason ? check_text("damage reason", reason, STORE_REASON_MAX, 0) : 0;
  if (!rc && dir) rc = check_text("checkpoint directory", dir, STORE_PATH_MAX, 0);
  if (rc || (rc = store_begin(st, reason != NULL))) return rc;
  job_brief_t b;
  store_ckpt_t c;
  int have = epoch ? job_fence(st, job_id, epoch, "damaged checkpoint report", 1, &b) : 0;
  if (!have) have = ckpt_get(st, job_id, step, &c);
  if (have < 0) return store_end(st, have);
  if (!have)
    return store_end(st, err_set(FSDP_ENOTFOUND, "job j-%lld has no checkpoint of step %lld",
                                 (long long)job_id, (long long)step));
  if (reason && c.state == STORE_CKPT_COMMITTED &&
      st_exec(st, "UPDATE checkpoints SET state = 'ABORTED', closed_ms = ?, reason = ?, "
              "dir = coalesce(?, dir) WHERE job_id = ? AND step = ? AND state = 'COMMITTED'",
              A_I(store_now_ms()), A_T(reason), A_T(dir), A_I(job_id),
              A_I(step)) > 0) {
    *changed = 1;
    st_event(st, job_id, 0, "checkpoint.damaged", "step %lld: %s", (long long)step, reason);
  }
  if (!st->rc && (rc = ckpt_get(st, job_id, step, out)) < 0) return store_end(st, rc);
  rc = store_end(st, 0);
  if (rc) *changed = 0;
  return rc;
}

int store_ckpt_fail(store_t *st, int64_t job_id, int64_t epoch, int64_t step, int shards,
                    const char *dir, const char *reason, store_ckpt_t *out, int *aborted) {
  *aborted = 0;
  int rc = check_text("checkpoint directory", dir, STORE_PATH_MAX, 0);
  if (!rc) rc = check_text("abort reason", reason, STORE_REASON_MAX, 0);
  if (!rc && (step < 0 || shards < 1))
    rc = err_set(FSDP_EINVAL, "checkpoint: step %lld of %d shards: out of range", (long long)step,
                 shards);
  if (rc || (rc = store_begin(st, 1))) return rc;
  store_ckpt_t c;
  int have = ckpt_for_epoch(st, job_id, step, epoch, &c);
  if (have < 0) return store_end(st, have);
  const int64_t now = store_now_ms();
  if (!have) {
    st_exec(st,
            "INSERT INTO checkpoints(job_id, step, epoch, state, shards, dir, opened_ms, closed_ms, "
            "reason) VALUES(?, ?, ?, 'ABORTED', ?, ?, ?, ?, ?)",
            A_I(job_id), A_I(step), A_I(epoch), A_I(shards), A_T(dir), A_I(now), A_I(now),
            A_T(reason));
    *aborted = 1;
  } else if (c.state == STORE_CKPT_OPEN) {
    *aborted = st_exec(st, "UPDATE checkpoints SET state = 'ABORTED', closed_ms = ?, reason = ? "
                       "WHERE job_id = ? AND step = ? AND state = 'OPEN'",
                       A_I(now), A_T(reason), A_I(job_id), A_I(step)) > 0;
  } /* aborted already (another shard, or a timeout): it stays as it is */
  if (*aborted)
    st_event(st, job_id, 0, "checkpoint.aborted", "step %lld: %s", (long long)step, reason);
  if (!st->rc && (rc = ckpt_get(st, job_id, step, out)) < 0) return store_end(st, rc);
  rc = store_end(st, 0);
  if (rc) *aborted = 0;
  return rc;
}

int store_ckpt_get(store_t *st, int64_t job_id, int64_t step, store_ckpt_t *out) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  const int have = ckpt_get(st, job_id, step, out);
  rc = store_end(st, have < 0 ? have : 0);
  return rc ? rc : have;
}

int store_ckpt_shards(store_t *st, int64_t job_id, int64_t step, store_ckpt_shard_t **shards,
                      int *n) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_ckpt_shard_t, ckpt_shard_row, shards, n,
                  "SELECT shard, rank, bytes, sum FROM checkpoint_shards WHERE job_id = ? AND "
                  "step = ? ORDER BY shard", A_I(job_id), A_I(step));
  return store_end(st, rc);
}

int store_ckpt_close(store_t *st, int64_t job_id, int64_t step, int64_t epoch,
                     const char *abort_reason) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  const int64_t now = store_now_ms();
  const int commit = abort_reason == NULL;
  if (st_exec(st,
              "UPDATE checkpoints SET state = ?, closed_ms = ?, reason = ? WHERE job_id = ? AND "
              "step = ? AND epoch = ? AND state = 'OPEN'",
              A_T(commit ? "COMMITTED" : "ABORTED"), A_I(now), A_T(commit ? "" : abort_reason),
              A_I(job_id), A_I(step), A_I(epoch)) <= 0) {
    if (!st->rc)
      rc = err_set(FSDP_ESTATE, "job j-%lld: no open checkpoint of step %lld from attempt %lld",
                   (long long)job_id, (long long)step, (long long)epoch);
    return store_end(st, rc);
  }
  if (commit) st_event(st, job_id, 0, "checkpoint.committed", "step %lld", (long long)step);
  else st_event(st, job_id, 0, "checkpoint.aborted", "step %lld: %s", (long long)step, abort_reason);
  return store_end(st, 0);
}

int store_attempt_ended(store_t *st, int64_t job_id, int64_t epoch, char *outcome,
                        size_t outcome_len, char *reason, size_t reason_len) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  int found = 0;
  sqlite3_stmt *s = st_query(st, "SELECT coalesce(outcome, ''), reason FROM attempts "
                             "WHERE job_id = ? AND epoch = ? AND ended_ms IS NOT NULL",
                             A_I(job_id), A_I(epoch));
  if (st_step(st, s) == 1) {
    st_col_text(s, 0, outcome, outcome_len);
    st_col_text(s, 1, reason, reason_len);
    sqlite3_reset(s);
    found = 1;
  }
  rc = store_end(st, 0);
  return rc ? rc : found;
}

int64_t store_ckpt_last_committed(store_t *st, int64_t job_id) {
  if (store_begin(st, 0)) return -1;
  const int64_t step = st_int(st, -1, "SELECT coalesce(max(step), 0) FROM checkpoints "
                              "WHERE job_id = ? AND state = 'COMMITTED'", A_I(job_id));
  return store_end(st, 0) ? -1 : step;
}

int store_ckpt_list(store_t *st, int64_t job_id, store_ckpt_t **ckpts, int *n) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_ckpt_t, ckpt_row, ckpts, n,
                  "SELECT " CKPT_COLS " FROM checkpoints c WHERE ? = 0 OR c.job_id = ? "
                  "UNION ALL SELECT " CKPT_DAMAGED_COLS " FROM checkpoints_damaged d "
                  "WHERE ? = 0 OR d.job_id = ? ORDER BY 1, 2 DESC, 3 DESC", A_I(job_id),
                  A_I(job_id), A_I(job_id), A_I(job_id));
  return store_end(st, rc);
}

int store_ckpt_pending(store_t *st, store_ckpt_t **ckpts, int *n) {
  int rc = store_begin(st, 0);
  if (rc) return rc;
  rc = st_collect(st, store_ckpt_t, ckpt_row, ckpts, n,
                  "SELECT " CKPT_COLS " FROM checkpoints c WHERE c.state = 'OPEN' OR "
                  "(c.state = 'ABORTED' AND c.removed = 0) UNION ALL SELECT " CKPT_DAMAGED_COLS
                  " FROM checkpoints_damaged d WHERE d.removed = 0 ORDER BY 1, 2, 3");
  return store_end(st, rc);
}

int store_ckpt_removed(store_t *st, int64_t job_id, int64_t step, int64_t epoch, int forget) {
  int rc = store_begin(st, 1);
  if (rc) return rc;
  if (st_exec(st, "UPDATE checkpoints_damaged SET removed = 1 WHERE job_id = ? AND step = ? AND "
              "epoch = ?", A_I(job_id), A_I(step), A_I(epoch)) > 0)
    return store_end(st, 0); /* a damaged one written again since: kept, listed removed */
  if (!st_int(st, 0, "SELECT 1 FROM checkpoints WHERE job_id = ? AND step = ? AND epoch = ?",
              A_I(job_id), A_I(step), A_I(epoch)))
    return store_end(st, 0); /* a later attempt's row: not the one removed */
  if (forget) {
    st_exec(st, "DELETE FROM checkpoint_shards WHERE job_id = ? AND step = ?", A_I(job_id), A_I(step));
    st_exec(st, "DELETE FROM checkpoints WHERE job_id = ? AND step = ?", A_I(job_id), A_I(step));
    st_event(st, job_id, 0, "checkpoint.removed", "step %lld (retention)", (long long)step);
  } else {
    st_exec(st, "UPDATE checkpoints SET removed = 1 WHERE job_id = ? AND step = ?", A_I(job_id),
            A_I(step));
  }
  return store_end(st, 0);
}

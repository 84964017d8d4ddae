/* White-box tests of the store's transaction helpers, which are static: this
 * file includes store.c itself (and links without store.o). What they prove:
 * a transaction left open is named by the file and line that opened it, only
 * store_end commits, and a failure inside a transaction undoes all of it.
 * The databases are in memory: nothing here is about files. */
#include "daemon/coordinator/store.c"

#include <criterion/criterion.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(store_txn, .timeout = 30);

static store_t *open_mem(void) {
  store_t *st = NULL;
  cr_assert_eq(store_open(":memory:", NULL, &st), 0, "%s", err_msg());
  return st;
}

static int64_t n_events(store_t *st) {
  int64_t n = -1;
  sqlite3_stmt *s = NULL;
  sqlite3_prepare_v2(st->db, "SELECT count(*) FROM events", -1, &s, NULL);
  if (sqlite3_step(s) == SQLITE_ROW) n = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return n;
}

Test(store_txn, a_forgotten_end_aborts_naming_where_the_transaction_began) {
  int fd[2];
  cr_assert_eq(pipe(fd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 2);
    store_t *st = open_mem();
    int line = __LINE__; store_begin(st, 1);
    fprintf(stderr, "begun at line %d\n", line);
    store_begin(st, 1); /* the first was never ended */
    _exit(0);
  }
  close(fd[1]);
  char out[4096] = "";
  size_t n = 0;
  ssize_t got;
  while (n < sizeof out - 1 && (got = read(fd[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)got;
  out[n] = 0;
  close(fd[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "aborted (status %d)", status);
  int line = 0;
  const char *said = strstr(out, "begun at line ");
  cr_assert(said && sscanf(said, "begun at line %d", &line) == 1, "%s", out);
  char where[64];
  snprintf(where, sizeof where, "test_store_txn.c:%d", line);
  cr_assert(strstr(out, where) && strstr(out, "never ended"), "names %s: %s", where, out);
}

Test(store_txn, only_store_end_commits) {
  store_t *st = open_mem();
  cr_assert_eq(store_begin(st, 1), 0);
  st_event(st, 0, 0, "test", "written inside");
  /* a COMMIT not made by store_end: the hook turns it into a rollback */
  cr_assert_neq(sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
  cr_assert(sqlite3_get_autocommit(st->db), "the transaction is gone");
  st->txn_file = NULL; /* it ended, though not through store_end */
  cr_assert_eq(n_events(st), 0, "and nothing of it was kept");
  cr_assert_eq(store_begin(st, 1), 0);
  st_event(st, 0, 0, "test", "written inside");
  cr_assert_eq(store_end(st, 0), 0);
  cr_assert_eq(n_events(st), 1);
  store_close(st);
}

Test(store_txn, a_failure_inside_undoes_the_whole_transaction_and_is_kept) {
  store_t *st = open_mem();
  cr_assert_eq(store_begin(st, 1), 0);
  st_event(st, 0, 0, "test", "first");
  /* bad SQL: the first failure is kept, the statements after it do nothing */
  cr_assert_lt(st_exec(st, "INSERT INTO no_such_table VALUES(1)"), 0);
  st_event(st, 0, 0, "test", "after the failure");
  cr_assert_eq(st_int(st, 7, "SELECT 1"), 7, "a helper after a failure returns its default");
  int rc = store_end(st, 0);
  cr_assert_eq(rc, FSDP_EINTERNAL, "%s", err_name(rc));
  cr_assert(strstr(err_msg(), "no_such_table"), "the first failure's message: %s", err_msg());
  cr_assert_eq(n_events(st), 0, "rolled back");
  /* and the connection is usable again */
  cr_assert_eq(store_event_add(st, 0, 0, "test", "after"), 0, "%s", err_msg());
  cr_assert_eq(n_events(st), 1);
  store_close(st);
}

/* A database of schema version 1 (made here with version 1's own script, as
 * an older coordinator left it) is migrated to the current version at open,
 * in place, its jobs kept; and the request ids version 2 adds work on it. */
Test(store_txn, a_version_1_database_is_migrated_keeping_its_jobs) {
  char path[] = "/tmp/fsdp-store-v1-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  unlink(path);
  sqlite3 *h;
  cr_assert_eq(sqlite3_open(path, &h), SQLITE_OK);
  char sql[256];
  snprintf(sql, sizeof sql, "PRAGMA user_version = 1; PRAGMA application_id = %d", STORE_APP_ID);
  cr_assert_eq(sqlite3_exec(h, store_schema_v1, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(h));
  cr_assert_eq(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_exec(h, "INSERT INTO jobs(name, spec, world_size, mesh, state, max_restarts, "
                               "submitted_ms) VALUES('old', '[train]\nsteps = 5\n', 2, '1x2', "
                               "'PENDING', 0, 1)", NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(h));
  sqlite3_close(h);
  store_t *st = NULL;
  cr_assert_eq(store_open(path, NULL, &st), 0, "%s", err_msg());
  cr_expect_eq(store_schema_from(st), 1);
  store_job_t j;
  cr_assert_eq(store_job_get(st, 1, &j), 0, "%s", err_msg());
  cr_expect_str_eq(j.name, "old");
  cr_expect_str_eq(j.spec, "[train]\nsteps = 5\n");
  store_job_free(&j);
  store_job_spec_t js = {"new", "[train]\nsteps = 1\n", 2, "1x2", 0, NULL, "req-42", NULL};
  int64_t id = 0, found = 0;
  cr_assert_eq(store_job_submit(st, &js, &id), 0, "%s", err_msg());
  cr_expect_eq(store_job_by_request(st, "req-42", &found), 0, "%s", err_msg());
  cr_expect_eq(found, id);
  cr_expect_eq(store_job_by_request(st, "req-43", &found), FSDP_ENOTFOUND);
  /* the key is unique: a second job with it is refused, nothing stored */
  cr_expect_neq(store_job_submit(st, &js, &found), 0);
  store_close(st);
  cr_assert_eq(sqlite3_open(path, &h), SQLITE_OK);
  sqlite3_stmt *s;
  cr_assert_eq(sqlite3_prepare_v2(h, "SELECT (SELECT count(*) FROM jobs), user_version FROM "
                                     "pragma_user_version", -1, &s, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
  cr_expect_eq(sqlite3_column_int(s, 0), 2);
  cr_expect_eq(sqlite3_column_int(s, 1), STORE_SCHEMA_VERSION);
  sqlite3_finalize(s);
  sqlite3_close(h);
  unlink(path);
}

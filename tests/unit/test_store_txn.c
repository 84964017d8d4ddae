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

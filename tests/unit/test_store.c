/* Unit tests of the coordinator's store: the schema and its versions, what it
 * refuses to open, each state change (all or nothing), the epoch fence, and
 * crash safety (a writer killed with SIGKILL leaves exactly what it
 * committed). It links what the coordinator links (COORD_OBJS), so it has its
 * own temporary directory instead of testutil's. Files live in a mkdtemp
 * directory removed after each test. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/coordinator/store.h"
#include "daemon/job/job.h"

static char dir[256];

static void setup(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/fsdp-store.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert_not_null(mkdtemp(dir));
}

/* The directory holds only files the test made (the database, its -wal and
 * -shm, crafted files). */
static void teardown(void) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  rmdir(dir);
}

TestSuite(store, .init = setup, .fini = teardown, .timeout = 30);

/* path of name in the test's directory (one static buffer per slot) */
static const char *tpath(const char *name) {
  static char buf[4][512];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 512, "%s/%s", dir, name);
  return p;
}

static store_t *open_db(const char *name) {
  store_t *st = NULL;
  int rc = store_open(tpath(name), NULL, &st);
  cr_assert_eq(rc, 0, "store_open: %s", err_msg());
  return st;
}

/* A raw connection, to look at the file as the sqlite3 shell would. */
static sqlite3 *raw_open(const char *name) {
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(tpath(name), &db), SQLITE_OK);
  return db;
}
static int64_t raw_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *s = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK, "%s: %s", sql,
               sqlite3_errmsg(db));
  int64_t v = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
  sqlite3_finalize(s);
  return v;
}

static int64_t add_node(store_t *st, const char *name, int n_dev) {
  store_device_t dev[8];
  memset(dev, 0, sizeof dev);
  for (int i = 0; i < n_dev; i++) {
    dev[i].index = i;
    dev[i].kind = STORE_DEV_cpu;
    snprintf(dev[i].name, sizeof dev[i].name, "cpu");
    dev[i].memory_bytes = (uint64_t)(i + 1) << 30;
  }
  int64_t id = 0;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", 7000 + n_dev);
  cr_assert_eq(store_node_register(st, name, addr, dev, n_dev, &id), 0, "%s", err_msg());
  return id;
}

static int64_t submit(store_t *st, const char *name, int world, int max_restarts) {
  store_job_spec_t js = {.name = name, .spec = "steps = 10\nbatch = 4\n", .world_size = world,
                         .mesh = "1x2", .max_restarts = max_restarts};
  int64_t id = 0;
  cr_assert_eq(store_job_submit(st, &js, &id), 0, "%s", err_msg());
  return id;
}

/* Places rank r on (node[r], dev[r]). */
static int start(store_t *st, int64_t job, int n, const int64_t *node, const int *dev,
                 int64_t *epoch) {
  store_placement_t p[8];
  for (int r = 0; r < n; r++)
    p[r] = (store_placement_t){.rank = r, .node_id = node[r], .device_index = dev[r],
                               .shard_group = 0, .replica_group = r};
  return store_attempt_start(st, job, p, n, epoch);
}

/* Places rank r on device r of one node. */
static int start_on(store_t *st, int64_t job, int64_t node, int n, int64_t *epoch) {
  int64_t nodes[8];
  int dev[8];
  for (int r = 0; r < n; r++) nodes[r] = node, dev[r] = r;
  return start(st, job, n, nodes, dev, epoch);
}

/* The one text value a query (a PRAGMA) answers. */
static void raw_text_eq(sqlite3 *db, const char *sql, const char *want) {
  sqlite3_stmt *s = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
  cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), want, "%s", sql);
  sqlite3_finalize(s);
}

static store_job_t get_job(store_t *st, int64_t id) {
  store_job_t j;
  cr_assert_eq(store_job_get(st, id, &j), 0, "%s", err_msg());
  return j;
}

static int n_free(store_t *st) {
  store_device_t *d = NULL;
  int n = -1;
  cr_assert_eq(store_free_devices(st, &d, &n), 0, "%s", err_msg());
  store_array_free(d);
  return n;
}

Test(store, a_new_file_gets_the_schema_and_its_version) {
  store_t *st = open_db("state.db");
  cr_assert_eq(store_schema_from(st), 0);
  store_close(st);
  sqlite3 *db = raw_open("state.db");
  cr_assert_eq(raw_int(db, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
  cr_assert_eq(raw_int(db, "PRAGMA application_id"), 0x46534450);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN "
                           "('nodes','devices','jobs','attempts','ranks','rendezvous','events')"),
               7);
  raw_text_eq(db, "PRAGMA journal_mode", "wal");
  sqlite3_close(db);
}

Test(store, reopening_keeps_the_data_and_does_not_migrate_again) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "keep-me", 2, 3);
  store_close(st);

  st = open_db("state.db");
  cr_assert_eq(store_schema_from(st), STORE_SCHEMA_VERSION, "the file was already at the current version");
  store_job_t j = get_job(st, job);
  cr_assert_str_eq(j.name, "keep-me");
  cr_assert_str_eq(j.spec, "steps = 10\nbatch = 4\n");
  cr_assert_eq(j.state, STORE_JOB_PENDING);
  cr_assert_eq(j.max_restarts, 3);
  store_job_free(&j);
  store_node_t *nodes;
  int n;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert_eq(n, 1);
  cr_assert_eq(nodes[0].id, node);
  cr_assert_eq(nodes[0].n_devices, 2);
  cr_assert_eq(nodes[0].devices[1].memory_bytes, (uint64_t)2 << 30);
  store_nodes_free(nodes, n);
  /* ids continue after the kept rows */
  cr_assert_gt(submit(st, "next", 1, 0), job);
  store_close(st);
}

Test(store, a_database_from_a_newer_schema_is_refused_naming_both_versions) {
  sqlite3 *db = raw_open("new.db");
  char sql[200], newer[32];
  const int v = STORE_SCHEMA_VERSION + 1;
  snprintf(sql, sizeof sql, "PRAGMA application_id = 1179862096; /* 0x46534450 */ "
           "PRAGMA user_version = %d; CREATE TABLE future(x)", v);
  snprintf(newer, sizeof newer, "version %d", v);
  cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  store_t *st = NULL;
  int rc = store_open(tpath("new.db"), NULL, &st);
  cr_assert_eq(rc, FSDP_EFORMAT, "%s", err_name(rc));
  cr_assert_null(st);
  const char *m = err_msg();
  char ours[16];
  snprintf(ours, sizeof ours, "'s %d", STORE_SCHEMA_VERSION);
  cr_assert(strstr(m, tpath("new.db")) && strstr(m, newer) && strstr(m, ours), "message: %s", m);
  db = raw_open("new.db");
  cr_assert_eq(raw_int(db, "PRAGMA user_version"), v, "left at its version");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM sqlite_schema"), 1, "and its tables");
  sqlite3_close(db);
}

static char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  static char buf[8192];
  *n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  return buf;
}

Test(store, a_file_that_is_not_a_database_is_refused_and_left_untouched) {
  char text[4096];
  for (size_t i = 0; i < sizeof text; i++) text[i] = (char)('a' + i % 26);
  memcpy(text, "[job]\nsteps = 10\n", 17);
  FILE *f = fopen(tpath("job.conf"), "wb");
  fwrite(text, 1, sizeof text, f);
  fclose(f);
  store_t *st = NULL;
  int rc = store_open(tpath("job.conf"), NULL, &st);
  cr_assert_eq(rc, FSDP_EFORMAT, "%s", err_name(rc));
  cr_assert(strstr(err_msg(), tpath("job.conf")) && strstr(err_msg(), "not a SQLite database"),
            "message: %s", err_msg());
  size_t n;
  char *back = read_all(tpath("job.conf"), &n);
  cr_assert_eq(n, sizeof text);
  cr_assert(memcmp(back, text, n) == 0, "the file is byte for byte as it was");
  struct stat sb;
  cr_assert_neq(stat(tpath("job.conf-wal"), &sb), 0, "no log was made beside it");
  cr_assert_neq(stat(tpath("job.conf-shm"), &sb), 0);
}

Test(store, a_damaged_database_is_refused_as_damaged) {
  store_t *st = open_db("state.db");
  submit(st, "lost", 1, 0);
  store_close(st); /* the last close moves the log into the file */
  /* page 1's b-tree header (after the 100-byte file header) says a page
   * type no b-tree has */
  FILE *f = fopen(tpath("state.db"), "r+b");
  cr_assert_not_null(f);
  fseek(f, 100, SEEK_SET);
  fputc(0x77, f);
  fclose(f);
  int rc = store_open(tpath("state.db"), NULL, &st);
  cr_assert_eq(rc, FSDP_EFORMAT, "%s: %s", err_name(rc), err_msg());
  cr_assert(strstr(err_msg(), "damaged") && strstr(err_msg(), tpath("state.db")), "%s",
            err_msg());
}

/* Refused untouched: nothing added, and its mode as it was (a readable
 * database of ours is made private, but only once it is found ours: a
 * mistyped --db naming a system file must not make it 0600). A file that
 * is no database at all is left so too. */
Test(store, another_programs_database_is_refused) {
  sqlite3 *db = raw_open("other.db");
  cr_assert_eq(sqlite3_exec(db, "CREATE TABLE photos(id, path)", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  FILE *tf = fopen(tpath("text.db"), "w");
  cr_assert_not_null(tf);
  fputs("hello\n", tf);
  fclose(tf);
  const char *names[] = {"other.db", "text.db"};
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(chmod(tpath(names[i]), 0644), 0);
    store_t *st = NULL;
    cr_assert_eq(store_open(tpath(names[i]), NULL, &st), FSDP_EFORMAT, "%s", names[i]);
    cr_assert(strstr(err_msg(), i ? "not" : "another program"), "%s", err_msg());
    struct stat f;
    cr_assert_eq(stat(tpath(names[i]), &f), 0);
    cr_expect_eq(f.st_mode & 0777, 0644, "%s was made mode %03o", names[i],
                 (unsigned)(f.st_mode & 0777));
  }
  db = raw_open("other.db");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM sqlite_schema"), 1, "nothing added");
  sqlite3_close(db);
}

Test(store, a_batch_of_submits_is_stored_all_or_none) {
  store_t *st = open_db("state.db");
  store_job_spec_t js[3] = {
      {.name = "b0", .spec = "", .world_size = 1, .mesh = "1x1"},
      {.name = "b1", .spec = "steps = 2\n", .world_size = 2, .mesh = "1x2", .max_restarts = 1},
      {.name = "b2", .spec = "", .world_size = 4, .mesh = "2x2"}};
  int64_t ids[3];
  cr_assert_eq(store_job_submit_batch(st, js, 3, ids), 0, "%s", err_msg());
  cr_assert(ids[1] == ids[0] + 1 && ids[2] == ids[1] + 1);
  store_job_t j = get_job(st, ids[1]);
  cr_assert(j.state == STORE_JOB_PENDING && j.world_size == 2 && j.max_restarts == 1);
  cr_assert_str_eq(j.spec, "steps = 2\n");
  store_job_free(&j);
  js[2].world_size = 0;
  cr_assert_eq(store_job_submit_batch(st, js, 3, ids), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "b2"), "names the job: %s", err_msg());
  store_job_t *all;
  int n;
  cr_assert_eq(store_job_list(st, 0, 0, 0, &all, &n), 0);
  cr_assert_eq(n, 3, "none of the refused batch was stored");
  cr_assert(all[2].spec == NULL && all[2].world_size == 4);
  store_jobs_free(all, n);
  store_close(st);
}

/* Lists by state and limit: the matching jobs, the newest `limit`, oldest first. */
Test(store, jobs_are_listed_by_state_newest_limit_first) {
  store_t *st = open_db("state.db");
  int64_t id[6];
  for (int i = 0; i < 6; i++) id[i] = submit(st, "j", 2, 0);
  store_job_state_t was;
  cr_assert_eq(store_job_cancel(st, id[1], "test", &was), 0, "%s", err_msg());
  cr_assert_eq(store_job_cancel(st, id[4], "test", &was), 0, "%s", err_msg());
  struct {
    unsigned states;
    int64_t before;
    int limit, n;
    int64_t want[6];
  } cases[] = {
      {0, 0, 0, 6, {id[0], id[1], id[2], id[3], id[4], id[5]}},
      {STORE_JOB_BIT(STORE_JOB_PENDING), 0, 0, 4, {id[0], id[2], id[3], id[5]}},
      {STORE_JOB_BIT(STORE_JOB_PENDING), 0, 2, 2, {id[3], id[5]}},
      {STORE_JOB_BIT(STORE_JOB_CANCELLED), 0, 0, 2, {id[1], id[4]}},
      {STORE_JOB_BIT(STORE_JOB_CANCELLED) | STORE_JOB_BIT(STORE_JOB_PENDING), 0, 3, 3, {id[3], id[4], id[5]}},
      {STORE_JOB_BIT(STORE_JOB_RUNNING), 0, 0, 0, {0}},
      /* the next page: below an id */
      {STORE_JOB_BIT(STORE_JOB_PENDING), id[3], 2, 2, {id[0], id[2]}},
      {0, id[2], 0, 2, {id[0], id[1]}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    store_job_t *v;
    int n;
    cr_assert_eq(store_job_list(st, cases[c].states, cases[c].before, cases[c].limit, &v, &n), 0,
                 "%s", err_msg());
    cr_expect_eq(n, cases[c].n, "case %zu: %d jobs", c, n);
    for (int i = 0; i < n && i < cases[c].n; i++)
      cr_expect_eq(v[i].id, cases[c].want[i], "case %zu, job %d: j-%lld", c, i, (long long)v[i].id);
    store_jobs_free(v, n);
  }
  store_close(st);
}

Test(store, a_job_runs_to_success_and_frees_its_devices) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "ok", 2, 0);
  cr_assert_eq(n_free(st), 2);
  int64_t epoch = 0;
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0, "%s",
               err_msg());
  cr_assert_eq(epoch, 1);
  store_job_t j = get_job(st, job);
  cr_assert_eq(j.state, STORE_JOB_RUNNING);
  cr_assert_eq(j.epoch, 1);
  cr_assert_gt(j.started_ms, 0);
  store_job_free(&j);
  cr_assert_eq(n_free(st), 0, "both devices held");

  store_rank_t *r;
  int n;
  cr_assert_eq(store_ranks_of_node(st, node, &r, &n), 0);
  cr_assert_eq(n, 2);
  cr_assert_eq(r[1].state, STORE_RANK_ASSIGNED);
  cr_assert_eq(r[1].device_index, 1);
  cr_assert_eq(r[1].replica_group, 1);
  store_array_free(r);

  cr_assert_eq(store_rank_running(st, job, 1, 0, node + 1, 4242), FSDP_ENOTFOUND,
               "another node's rank");
  cr_assert_eq(store_rank_running(st, job, 1, 5, node, 4242), FSDP_ENOTFOUND, "no rank 5");
  cr_assert_eq(store_rank_running(st, job + 100, 1, 0, node, 4242), FSDP_ENOTFOUND, "no such job");
  cr_assert_eq(store_rank_running(st, job, 1, 0, node, 4242), 0, "%s", err_msg());
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, job, 1, 0, 0, NULL, NULL, &v), 0, "%s", err_msg());
  cr_assert_eq(v, STORE_ATTEMPT_GOING);
  cr_assert_eq(store_rank_exit(st, job, 1, 1, 0, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_SUCCEEDED);
  store_job_state_t next;
  cr_assert_eq(store_attempt_end(st, job, 1, 1, "", &next), 0, "%s", err_msg());
  cr_assert_eq(next, STORE_JOB_SUCCEEDED);

  j = get_job(st, job);
  cr_assert_eq(j.state, STORE_JOB_SUCCEEDED);
  cr_assert_geq(j.ended_ms, j.started_ms);
  store_job_free(&j);
  cr_assert_eq(n_free(st), 2, "devices freed");
  cr_assert_eq(store_ranks_of_job(st, job, 0, &r, &n), 0);
  cr_assert_eq(n, 2);
  cr_assert(r[0].state == STORE_RANK_SUCCEEDED && r[0].has_exit && r[0].exit_status == 0);
  cr_assert_eq(r[0].pid, 4242);
  store_array_free(r);
  cr_assert_eq(store_ranks_of_node(st, node, &r, &n), 0);
  cr_assert_eq(n, 0, "nothing left for the node to run");
  store_array_free(r);
  store_close(st);
}

Test(store, a_failed_rank_restarts_the_job_at_a_new_epoch_and_the_old_one_is_fenced) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "flaky", 2, 1);
  int64_t epoch;
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(store_rendezvous_put(st, job, 1, "world", 0, "addr-a", 6), 0, "%s", err_msg());
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, job, 1, 0, 1, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_FAILED, "one failed rank fails the attempt");
  store_job_state_t next;
  cr_assert_eq(store_attempt_end(st, job, 1, 0, "rank 0 exited with 1", &next), 0, "%s",
               err_msg());
  cr_assert_eq(next, STORE_JOB_PENDING);
  store_job_t j = get_job(st, job);
  cr_assert_eq(j.state, STORE_JOB_PENDING);
  cr_assert_eq(j.restarts, 1);
  cr_assert(strstr(j.reason, "rank 0 exited with 1") && strstr(j.reason, "restart 1 of 1"), "%s",
            j.reason);
  store_job_free(&j);
  cr_assert_eq(n_free(st), 2);
  cr_assert_eq(store_rendezvous_put(st, job, 1, "world", 1, "late", 4), FSDP_ESTALE,
               "the ended attempt, before the next one starts");
  store_rank_t *r;
  int n;
  cr_assert_eq(store_ranks_of_job(st, job, 1, &r, &n), 0);
  cr_assert_eq(r[1].state, STORE_RANK_STOPPED, "the other rank of the ended attempt");
  store_array_free(r);

  cr_assert_eq(start(st, job, 2, (int64_t[]){node, node}, (int[]){1, 0}, &epoch), 0);
  cr_assert_eq(epoch, 2);
  cr_assert_eq(store_rendezvous_put(st, job, 1, "world", 1, "late", 4), FSDP_ESTALE);
  cr_assert(strstr(err_msg(), "epoch 1") && strstr(err_msg(), "epoch 2"), "%s", err_msg());
  store_rendezvous_t rv;
  cr_assert_eq(store_rendezvous_get(st, job, 1, "world", 2, &rv), FSDP_ESTALE);
  cr_assert_eq(store_rank_exit(st, job, 1, 1, 0, NULL, NULL, &v), FSDP_ESTALE);
  cr_assert_eq(store_attempt_end(st, job, 1, 1, "", NULL), FSDP_ESTALE);
  cr_assert_eq(store_rendezvous_get(st, job, 2, "world", 2, &rv), 0);
  cr_assert(!rv.complete && rv.n == 0, "nothing of epoch 1 reaches epoch 2");
  store_rendezvous_free(&rv);
  cr_assert_eq(store_rendezvous_put(st, job, 3, "world", 0, "x", 1), FSDP_ENOTFOUND,
               "an epoch that never started");

  cr_assert_eq(store_rank_exit(st, job, 2, 1, -9, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_FAILED);
  cr_assert_eq(store_attempt_end(st, job, 2, 0, "rank 1 killed by signal 9", &next), 0);
  cr_assert_eq(next, STORE_JOB_FAILED, "no restarts left");
  j = get_job(st, job);
  cr_assert_eq(j.state, STORE_JOB_FAILED);
  cr_assert_eq(j.restarts, 1);
  cr_assert(strstr(j.reason, "no restarts left"), "%s", j.reason);
  cr_assert_gt(j.ended_ms, 0);
  store_job_free(&j);
  store_close(st);
}

Test(store, attempt_start_is_all_or_nothing) {
  store_t *st = open_db("state.db");
  int64_t a = add_node(st, "a", 2), b = add_node(st, "b", 1);
  int64_t j1 = submit(st, "first", 1, 0), j2 = submit(st, "second", 2, 0);
  int64_t epoch;
  cr_assert_eq(start_on(st, j1, a, 1, &epoch), 0);
  /* rank 0 lands on a free device, rank 1 on the one j1 holds */
  int rc = start(st, j2, 2, (int64_t[]){a, a}, (int[]){1, 0}, &epoch);
  cr_assert_eq(rc, FSDP_ESTATE, "%s", err_name(rc));
  cr_assert(strstr(err_msg(), "a:0 is held by job"), "%s", err_msg());
  rc = start(st, j2, 2, (int64_t[]){b, b}, (int[]){0, 5}, &epoch);
  cr_assert_eq(rc, FSDP_ENOTFOUND, "no device 5: %s", err_msg());
  cr_assert_eq(start(st, j2, 1, (int64_t[]){a}, (int[]){1}, &epoch), FSDP_EINVAL, "world size 2");
  rc = start(st, j2, 2, (int64_t[]){a, b}, (int[]){1, 0}, &epoch);
  cr_assert_eq(rc, 0, "a good placement still works after the failed ones: %s", err_msg());
  cr_assert_eq(epoch, 1, "the failed tries used no epoch");
  store_close(st);

  /* the failed tries left nothing: one attempt row each, ranks only of epoch 1 */
  sqlite3 *db = raw_open("state.db");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM attempts"), 2);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM ranks"), 3);
  sqlite3_close(db);
}

Test(store, a_failed_placement_changes_nothing) {
  store_t *st = open_db("state.db");
  int64_t a = add_node(st, "a", 3);
  int64_t j1 = submit(st, "holder", 1, 0), j2 = submit(st, "victim", 3, 0);
  int64_t epoch;
  cr_assert_eq(start(st, j1, 1, (int64_t[]){a}, (int[]){2}, &epoch), 0);
  cr_assert_eq(n_free(st), 2);
  /* two devices taken before the third is found held */
  cr_assert_eq(start_on(st, j2, a, 3, &epoch), FSDP_ESTATE);
  cr_assert_eq(n_free(st), 2, "the two it took are free again");
  store_job_t j = get_job(st, j2);
  cr_assert_eq(j.state, STORE_JOB_PENDING);
  cr_assert_eq(j.epoch, 0);
  cr_assert_eq(j.started_ms, 0);
  store_job_free(&j);
  store_rank_t *r;
  int n;
  cr_assert_eq(store_ranks_of_job(st, j2, 1, &r, &n), 0);
  cr_assert_eq(n, 0);
  store_array_free(r);
  /* a rank given twice, and a dead node, are refused the same way */
  cr_assert_eq(start(st, j2, 3, (int64_t[]){a, a, a}, (int[]){0, 1, 0}, &epoch), FSDP_ESTATE);
  store_placement_t dup[3] = {{.rank = 0, .node_id = a, .device_index = 0},
                              {.rank = 0, .node_id = a, .device_index = 1},
                              {.rank = 2, .node_id = a, .device_index = 2}};
  cr_assert_eq(store_attempt_start(st, j2, dup, 3, &epoch), FSDP_EINVAL);
  int n_jobs;
  int64_t *jobs;
  cr_assert_eq(store_node_mark_dead(st, a, 0, 0, &jobs, &n_jobs), 0);
  store_array_free(jobs);
  cr_assert_eq(start(st, j2, 3, (int64_t[]){a, a, a}, (int[]){0, 1, 1}, &epoch), FSDP_ESTATE);
  cr_assert(strstr(err_msg(), "dead"), "%s", err_msg());
  cr_assert_eq(n_free(st), 0, "a dead node's devices are not free");
  store_close(st);
}

Test(store, cancel_ends_a_pending_or_running_job_once) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t waiting = submit(st, "waiting", 2, 0), running = submit(st, "running", 2, 3);
  store_job_state_t was;
  cr_assert_eq(store_job_cancel(st, waiting, "by user", &was), 0);
  cr_assert_eq(was, STORE_JOB_PENDING);
  int64_t epoch;
  cr_assert_eq(start_on(st, running, node, 2, &epoch), 0);
  cr_assert_eq(store_rendezvous_put(st, running, epoch, "world", 0, "x", 1), 0);
  cr_assert_eq(store_job_cancel(st, running, "fsdpctl cancel", &was), 0, "%s", err_msg());
  cr_assert_eq(was, STORE_JOB_RUNNING, "the caller must stop its ranks");
  store_job_t j = get_job(st, running);
  cr_assert_eq(j.state, STORE_JOB_CANCELLED);
  cr_assert_str_eq(j.reason, "fsdpctl cancel");
  cr_assert_eq(j.restarts, 0, "a cancel is not a restart");
  store_job_free(&j);
  cr_assert_eq(n_free(st), 2);
  store_rank_t *r;
  int n;
  cr_assert_eq(store_ranks_of_job(st, running, 0, &r, &n), 0);
  cr_assert(n == 2 && r[0].state == STORE_RANK_STOPPED && r[1].state == STORE_RANK_STOPPED);
  store_array_free(r);
  cr_assert_eq(store_rendezvous_put(st, running, epoch, "world", 1, "y", 1), FSDP_ESTALE);
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, running, epoch, 0, -15, NULL, NULL, &v), 0, "a late exit is recorded");
  cr_assert_eq(v, STORE_ATTEMPT_ENDED);
  cr_assert_eq(store_job_cancel(st, running, "again", &was), FSDP_ESTATE);
  cr_assert_eq(start_on(st, waiting, node, 2, &epoch), FSDP_ESTATE);
  cr_assert_eq(store_job_cancel(st, 999, "", &was), FSDP_ENOTFOUND);
  store_close(st);
}

Test(store, a_rendezvous_completes_only_when_every_rank_has_put) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 3);
  int64_t job = submit(st, "three", 3, 0);
  int64_t ep;
  cr_assert_eq(start_on(st, job, node, 3, &ep), 0);
  cr_assert_eq(store_rendezvous_put(st, job, ep, "world", 2, "c:2", 3), 0);
  cr_assert_eq(store_rendezvous_put(st, job, ep, "world", 0, "a:0", 3), 0);
  cr_assert_eq(store_rendezvous_put(st, job, ep, "shard.0", 1, "other", 5), 0);
  store_rendezvous_t rv;
  cr_assert_eq(store_rendezvous_get(st, job, ep, "world", 3, &rv), 0);
  cr_assert(!rv.complete && rv.n == 2, "2 of 3: n %d", rv.n);
  store_rendezvous_free(&rv);
  cr_assert_eq(store_rendezvous_put(st, job, ep, "world", 1, "wrong", 5), 0);
  cr_assert_eq(store_rendezvous_put(st, job, ep, "world", 1, "b:1", 3), 0, "a rank may put again");
  cr_assert_eq(store_rendezvous_get(st, job, ep, "world", 3, &rv), 0);
  cr_assert(rv.complete && rv.n == 3);
  const char *want[] = {"a:0", "b:1", "c:2"};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(rv.entry[i].rank, i);
    cr_assert(rv.entry[i].len == 3 && memcmp(rv.entry[i].data, want[i], 3) == 0);
  }
  store_rendezvous_free(&rv);
  cr_assert_eq(store_rendezvous_put(st, job, ep, "world", 3, "x", 1), FSDP_ENOTFOUND,
               "rank 3 is not in the job");
  static char big[STORE_PAYLOAD_MAX + 1];
  cr_assert_eq(store_rendezvous_put(st, job, ep, "world", 0, big, sizeof big), FSDP_EINVAL);
  /* binary payloads (an NCCL unique id) come back whole */
  unsigned char id[128];
  for (int i = 0; i < 128; i++) id[i] = (unsigned char)(i * 37);
  cr_assert_eq(store_rendezvous_put(st, job, ep, "nccl", 0, id, sizeof id), 0);
  cr_assert_eq(store_rendezvous_get(st, job, ep, "nccl", 1, &rv), 0);
  cr_assert(rv.complete && rv.entry[0].len == 128 && memcmp(rv.entry[0].data, id, 128) == 0);
  store_rendezvous_free(&rv);
  store_close(st);
}

Test(store, state_changes_leave_events_in_order) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 1);
  int64_t job = submit(st, "audited", 1, 0);
  const char *why = "waiting for 1 device";
  cr_assert_eq(store_jobs_set_pending_reasons(st, &job, &why, 1), 0);
  cr_assert_eq(store_jobs_set_pending_reasons(st, &job, &why, 1), 0);
  int64_t ep;
  cr_assert_eq(start_on(st, job, node, 1, &ep), 0);
  cr_assert_eq(store_event_add(st, job, node, "rank.progress", "step %d of %d", 5, 10), 0);
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, job, ep, 0, 0, NULL, NULL, &v), 0);
  cr_assert_eq(store_attempt_end(st, job, ep, 1, NULL, NULL), 0);
  store_event_t *e;
  int n;
  cr_assert_eq(store_event_list(st, job, 0, 0, &e, &n), 0);
  const char *kinds[] = {"job.submitted", "job.pending",  "attempt.started",
                         "rank.progress", "rank.exited", "attempt.ended"};
  cr_assert_eq(n, 6, "the unchanged reason is not written twice: %d events", n);
  for (int i = 0; i < n; i++) {
    cr_assert_str_eq(e[i].kind, kinds[i]);
    cr_assert_eq(e[i].job_id, job);
    cr_assert(i == 0 || e[i].id > e[i - 1].id);
  }
  cr_assert_str_eq(e[1].text, "waiting for 1 device");
  cr_assert_str_eq(e[3].text, "step 5 of 10");
  cr_assert_eq(e[3].node_id, node);
  int64_t third = e[2].id;
  store_array_free(e);
  cr_assert_eq(store_event_list(st, job, third, 0, &e, &n), 0);
  cr_assert_eq(n, 3, "resumes after an id");
  store_array_free(e);
  cr_assert_eq(store_event_list(st, job, third, 2, &e, &n), 0);
  cr_assert(n == 2 && !strcmp(e[0].kind, "rank.progress") && !strcmp(e[1].kind, "rank.exited"),
            "a page of 2 after an id: %d", n);
  store_array_free(e);
  cr_assert_eq(store_event_list(st, job, STORE_EVENTS_NEWEST, 2, &e, &n), 0);
  cr_assert(n == 2 && !strcmp(e[0].kind, "rank.exited") && !strcmp(e[1].kind, "attempt.ended"),
            "the newest 2, oldest first: %d", n);
  store_array_free(e);
  cr_assert_eq(store_event_list(st, 0, 0, 0, &e, &n), 0);
  cr_assert_str_eq(e[0].kind, "node.registered");
  cr_assert_eq(e[0].job_id, 0);
  const int all = n;
  store_array_free(e);
  cr_assert_eq(store_event_list(st, 0, STORE_EVENTS_NEWEST, 3, &e, &n), 0);
  cr_assert(n == 3 && !strcmp(e[2].kind, "attempt.ended") && e[0].id < e[1].id,
            "the cluster's newest 3 of %d: %d", all, n);
  store_array_free(e);
  store_close(st);
}

/* Retention: events before a time go, oldest first, a bounded batch at a
 * time; newer ones stay. (The rows are aged by hand: the store's clock is
 * the wall clock.) */
Test(store, old_events_are_purged_in_bounded_batches) {
  store_t *st = open_db("state.db");
  for (int i = 0; i < 5; i++) cr_assert_eq(store_event_add(st, 0, 0, "test.old", "old %d", i), 0);
  cr_assert_eq(store_event_add(st, 0, 0, "test.new", "new"), 0);
  sqlite3 *db = raw_open("state.db");
  cr_assert_eq(sqlite3_exec(db, "UPDATE events SET time_ms = 1000 WHERE kind = 'test.old'", NULL,
                            NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  int removed = -1;
  cr_assert_eq(store_event_purge(st, 2000, 3, &removed), 0, "%s", err_msg());
  cr_assert_eq(removed, 3, "a batch of 3");
  cr_assert_eq(store_event_purge(st, 2000, 3, &removed), 0);
  cr_assert_eq(removed, 2, "the rest");
  cr_assert_eq(store_event_purge(st, 2000, 3, &removed), 0);
  cr_assert_eq(removed, 0);
  store_event_t *e;
  int n;
  cr_assert_eq(store_event_list(st, 0, 0, 0, &e, &n), 0);
  cr_assert(n == 1 && !strcmp(e[0].kind, "test.new"), "%d left", n);
  store_array_free(e);
  cr_assert_eq(store_event_purge(st, INT64_MAX, 3, &removed), 0);
  cr_assert_eq(removed, 0, "the newest event stays (SQLite would hand its id out again)");
  store_close(st);
}

/* Events written while the clock was set years ahead (then set back) do not
 * hold up retention for years: those written before an event older than
 * the cut go with it; while the first event after them is recent, they
 * stay. */
Test(store, events_dated_in_the_future_do_not_block_retention) {
  store_t *st = open_db("state.db");
  for (int i = 0; i < 4; i++) cr_assert_eq(store_event_add(st, 0, 0, "test.ahead", "ahead %d", i), 0);
  for (int i = 0; i < 3; i++) cr_assert_eq(store_event_add(st, 0, 0, "test.recent", "recent %d", i), 0);
  sqlite3 *db = raw_open("state.db");
  /* ten years ahead of now */
  cr_assert_eq(sqlite3_exec(db, "UPDATE events SET time_ms = time_ms + 315360000000 WHERE kind = "
                            "'test.ahead'", NULL, NULL, NULL), SQLITE_OK);
  const int64_t cut = raw_int(db, "SELECT min(time_ms) FROM events WHERE kind = 'test.recent'");
  int removed = -1;
  cr_assert_eq(store_event_purge(st, cut, 100, &removed), 0, "%s", err_msg());
  cr_assert_eq(removed, 0, "the first event after them is not older than the cut");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM events"), 7);
  /* that event ages past the cut: they go first, then it (in batches of 3) */
  cr_assert_eq(sqlite3_exec(db, "UPDATE events SET time_ms = 1000 WHERE text = 'recent 0'", NULL,
                            NULL, NULL), SQLITE_OK);
  cr_assert_eq(store_event_purge(st, cut, 3, &removed), 0, "%s", err_msg());
  cr_assert_eq(removed, 3);
  cr_assert_eq(store_event_purge(st, cut, 3, &removed), 0, "%s", err_msg());
  cr_assert_eq(removed, 1, "the last one dated ahead");
  cr_assert_eq(store_event_purge(st, cut, 3, &removed), 0, "%s", err_msg());
  cr_assert_eq(removed, 1, "the one older than the cut");
  cr_assert_eq(store_event_purge(st, cut, 3, &removed), 0, "%s", err_msg());
  cr_assert_eq(removed, 0);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM events WHERE kind = 'test.recent'"), 2);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM events"), 2);
  sqlite3_close(db);
  store_close(st);
}

/* Jobs' retention: ended jobs older than the cut go with every row of their
 * own, the earliest ended first; a running job and a recent one stay; a job
 * not ended is refused, nothing removed; a removed id is never reused. */
Test(store, ended_jobs_are_purged_with_their_rows) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2), ep;
  int64_t old = submit(st, "old", 1, 0);
  cr_assert_eq(start_on(st, old, node, 1, &ep), 0);
  store_ckpt_t k;
  store_ckpt_shard_t s0 = {0, 0, 100, 5};
  cr_assert_eq(store_ckpt_report(st, old, ep, 10, 1, "/ck/step-00000010", &s0, &k), 0, "%s", err_msg());
  cr_assert_eq(store_ckpt_close(st, old, 10, ep, NULL), 0, "%s", err_msg());
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, old, ep, 0, 0, NULL, NULL, &v), 0);
  cr_assert_eq(store_attempt_end(st, old, ep, 1, NULL, NULL), 0);
  int64_t recent = submit(st, "recent", 1, 0);
  cr_assert_eq(store_job_cancel(st, recent, "test", NULL), 0);
  int64_t running = submit(st, "running", 1, 0);
  cr_assert_eq(start_on(st, running, node, 1, &ep), 0);
  int64_t newest = submit(st, "newest", 1, 0);
  cr_assert_eq(store_job_cancel(st, newest, "test", NULL), 0);
  sqlite3 *db = raw_open("state.db");
  char sql[200];
  snprintf(sql, sizeof sql, "UPDATE jobs SET ended_ms = CASE id WHEN %lld THEN 1000 ELSE 900 END "
           "WHERE id IN (%lld, %lld)", (long long)old, (long long)old, (long long)newest);
  cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  int64_t *ids;
  int n;
  cr_assert_eq(store_job_purgeable(st, 2000, 1, &ids, &n), 0, "%s", err_msg());
  cr_assert(n == 1 && ids[0] == newest, "the earliest ended first: %d, %lld", n, n ? (long long)ids[0] : 0ll);
  free(ids);
  const int64_t top = raw_int(db, "SELECT max(id) FROM events");
  snprintf(sql, sizeof sql, "SELECT max(id) FROM events WHERE job_id = %lld", (long long)newest);
  cr_assert_eq(raw_int(db, sql), top, "the newest event is the removed job's");
  cr_assert_eq(store_job_purge(st, &newest, 1), 0, "%s", err_msg());
  const int64_t after = submit(st, "after", 1, 0);
  cr_assert_gt(after, newest, "a removed job's id came back");
  snprintf(sql, sizeof sql, "SELECT min(id) FROM events WHERE job_id = %lld", (long long)after);
  cr_assert_gt(raw_int(db, sql), top, "an event id came back: a follower after %lld misses it",
               (long long)top);
  raw_text_eq(db, "SELECT kind FROM events WHERE job_id IS NULL ORDER BY id DESC LIMIT 1",
              "jobs.removed");
  cr_assert_eq(store_job_purgeable(st, 2000, 10, &ids, &n), 0, "%s", err_msg());
  cr_assert(n == 1 && ids[0] == old, "%d purgeable, the first %lld", n, n ? (long long)ids[0] : 0ll);
  free(ids);
  const int64_t not_ended[] = {old, running};
  cr_assert_eq(store_job_purge(st, not_ended, 2), FSDP_ESTATE, "a running job is never removed");
  cr_assert(strstr(err_msg(), "not an ended job"), "%s", err_msg());
  store_job_t j = get_job(st, old);
  store_job_free(&j); /* the whole transaction rolled back: the first is still there */
  cr_assert_eq(store_job_purge(st, &old, 1), 0, "%s", err_msg());
  static const char *const tables[] = {"jobs", "attempts", "ranks", "rendezvous", "checkpoints",
                                       "checkpoint_shards", "events"};
  for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE %s = %lld", tables[i],
             i ? "job_id" : "id", (long long)old);
    cr_assert_eq(raw_int(db, sql), 0, "%s keeps rows of the removed job", tables[i]);
  }
  snprintf(sql, sizeof sql, "SELECT count(*) FROM events WHERE job_id = %lld", (long long)recent);
  cr_assert_gt(raw_int(db, sql), 0, "another job's events went");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM jobs"), 3, "recent, running, after");
  sqlite3_close(db);
  store_job_t g;
  cr_assert_eq(store_job_get(st, old, &g), FSDP_ENOTFOUND);
  cr_assert_eq(store_job_purgeable(st, 2000, 10, &ids, &n), 0);
  cr_assert_eq(n, 0, "nothing else ended before the cut");
  free(ids);
  /* an ended job still holding a device (a database edited by hand) is left
   * out, so it never rolls back the batch of the others */
  db = raw_open("state.db");
  snprintf(sql, sizeof sql, "UPDATE jobs SET ended_ms = 1000 WHERE id = %lld; UPDATE devices SET "
           "job_id = %lld WHERE job_id IS NULL", (long long)recent, (long long)recent);
  cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
  sqlite3_close(db);
  cr_assert_eq(store_job_purgeable(st, 2000, 10, &ids, &n), 0);
  cr_assert_eq(n, 0, "a job holding a device is purgeable");
  free(ids);
  store_close(st);
}

Test(store, a_dead_node_loses_its_ranks_and_re_registers) {
  store_t *st = open_db("state.db");
  int64_t a = add_node(st, "a", 1), b = add_node(st, "b", 1);
  int64_t job = submit(st, "spread", 2, 1);
  int64_t ep;
  cr_assert_eq(start(st, job, 2, (int64_t[]){a, b}, (int[]){0, 0}, &ep), 0);
  int64_t *jobs;
  int n_jobs = 0;
  cr_assert_eq(store_node_mark_dead(st, b, 1000, 0, &jobs, &n_jobs), 0, "%s", err_msg());
  cr_assert(n_jobs == 1 && jobs[0] == job);
  store_array_free(jobs);
  store_rank_t *r;
  int n;
  cr_assert_eq(store_ranks_of_job(st, job, ep, &r, &n), 0);
  cr_assert(r[0].state == STORE_RANK_ASSIGNED && r[1].state == STORE_RANK_LOST);
  store_array_free(r);
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, job, ep, 0, -15, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_FAILED, "a lost rank fails the attempt");
  cr_assert_eq(store_attempt_end(st, job, ep, 0, "node b died", NULL), 0);
  store_node_t *nodes;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert(nodes[1].state == STORE_NODE_DEAD && nodes[1].last_seen_ms == 1000);
  cr_assert_eq(nodes[1].devices[0].job_id, 0, "its device was freed with the attempt");
  store_nodes_free(nodes, n);
  cr_assert_eq(n_free(st), 1, "only a's device: b is dead");

  /* b comes back with two devices; the same name keeps its id */
  cr_assert_eq(add_node(st, "b", 2), b);
  cr_assert_eq(n_free(st), 3);
  cr_assert_eq(store_node_mark_dead(st, 12345, 0, 0, &jobs, &n_jobs), FSDP_ENOTFOUND);
  store_close(st);
}

/* A database opened a second time is locked as SQLite locks it, so a
 * sqlite3 shell of another process that opens it, reads and closes does
 * not take itself for the last connection and remove the log the store
 * still writes into (its changes since would go with a crash). Before,
 * making the file private opened and closed a descriptor of it after
 * SQLite had, which dropped SQLite's locks. */
Test(store, a_shell_closing_on_a_reopened_database_leaves_its_log) {
  store_t *st = open_db("state.db");
  add_node(st, "a", 1);
  store_close(st);
  chmod(tpath("state.db"), 0644); /* tightened at the next open, with a warning */
  st = open_db("state.db");
  struct stat sb;
  cr_assert_eq(stat(tpath("state.db"), &sb), 0);
  cr_assert_eq(sb.st_mode & 0777, 0600);
  add_node(st, "b", 1);
  /* a process of its own image (a fork would share this one's SQLite
   * lock bookkeeping): Python's sqlite3, on the same library */
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
           "c.execute(\"SELECT count(*) FROM nodes\").fetchall(); c.close()' '%s'",
           tpath("state.db"));
  cr_assert_eq(system(cmd), 0, "%s: the shell's read failed", cmd);
  cr_assert_eq(access(tpath("state.db-wal"), F_OK), 0, "the log was removed under the open store");
  add_node(st, "c", 1); /* and the store goes on writing where it is read */
  store_node_t *nodes;
  int n;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert_eq(n, 3);
  store_nodes_free(nodes, n);
  store_close(st);
}

/* A node whose fsdpd stopped and said so is DEAD and stopped, with a
 * node.stopped event, not node.dead; kept across a reopen; its next
 * registration clears it. */
Test(store, a_node_that_stopped_is_told_apart_from_a_dead_one_until_it_registers) {
  store_t *st = open_db("state.db");
  int64_t a = add_node(st, "a", 1), b = add_node(st, "b", 1);
  int64_t *jobs;
  int n_jobs = 0, n;
  cr_assert_eq(store_node_mark_dead(st, a, 1000, 1, &jobs, &n_jobs), 0, "%s", err_msg());
  cr_assert_eq(n_jobs, 0);
  store_array_free(jobs);
  cr_assert_eq(store_node_mark_dead(st, b, 1000, 0, &jobs, &n_jobs), 0, "%s", err_msg());
  store_array_free(jobs);
  store_close(st);
  st = open_db("state.db");
  store_node_t *nodes;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert(n == 2 && nodes[0].state == STORE_NODE_DEAD && nodes[0].stopped);
  cr_assert(nodes[1].state == STORE_NODE_DEAD && !nodes[1].stopped, "b went silent");
  store_nodes_free(nodes, n);
  store_event_t *e;
  cr_assert_eq(store_event_list(st, 0, 0, 0, &e, &n), 0);
  int stopped = 0, dead = 0;
  for (int i = 0; i < n; i++) {
    stopped += !strcmp(e[i].kind, "node.stopped") && e[i].node_id == a && strstr(e[i].text, "stopped");
    dead += !strcmp(e[i].kind, "node.dead") && e[i].node_id == b;
  }
  store_array_free(e);
  cr_assert(stopped == 1 && dead == 1, "events: %d node.stopped of a, %d node.dead of b", stopped, dead);
  cr_assert_eq(add_node(st, "a", 1), a);
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert(nodes[0].state == STORE_NODE_ALIVE && !nodes[0].stopped, "registered again");
  store_nodes_free(nodes, n);
  store_close(st);
}

/* A drain is kept with its reason across the node's re-registration and
 * the store's reopening; each change is one event; undrain clears it. */
Test(store, a_drained_node_stays_drained_until_undrained) {
  store_t *st = open_db("state.db");
  int64_t a = add_node(st, "a", 2);
  cr_assert_eq(store_node_drain(st, a, "disk swap"), 0, "%s", err_msg());
  cr_assert_eq(store_node_drain(st, a, "disk swap"), 0, "the same drain again: no change");
  cr_assert_eq(add_node(st, "a", 2), a);
  store_close(st);
  st = open_db("state.db");
  store_node_t *nodes;
  int n;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert_str_eq(nodes[0].drain_reason, "disk swap", "re-registered and reopened");
  store_nodes_free(nodes, n);
  cr_assert_eq(store_node_drain(st, a, NULL), 0, "%s", err_msg());
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert_str_empty(nodes[0].drain_reason);
  store_nodes_free(nodes, n);
  sqlite3 *db = raw_open("state.db");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM events WHERE kind = 'node.drained'"), 1);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM events WHERE kind = 'node.undrained'"), 1);
  sqlite3_close(db);
  cr_assert_eq(store_node_drain(st, a + 100, "x"), FSDP_ENOTFOUND);
  store_close(st);
}

/* What a device offers changes as its fsdpd measures it again: stored
 * (across a reopening), one event a change, none for the same figure; a
 * device or node the store does not have is ENOTFOUND. */
Test(store, a_devices_memory_changes_as_measured_again) {
  store_t *st = open_db("state.db");
  int64_t a = add_node(st, "a", 2);
  cr_assert_eq(store_device_memory(st, a, 1, 10ull << 30), 0, "%s", err_msg());
  cr_assert_eq(store_device_memory(st, a, 1, 10ull << 30), 0, "the same again: no change");
  store_close(st);
  st = open_db("state.db");
  store_node_t *nodes;
  int n;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert_eq(nodes[0].devices[1].memory_bytes, 10ull << 30);
  cr_assert_neq(nodes[0].devices[0].memory_bytes, 10ull << 30, "device 0 as registered");
  store_nodes_free(nodes, n);
  sqlite3 *db = raw_open("state.db");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM events WHERE kind = 'node.device_memory'"), 1);
  sqlite3_close(db);
  cr_assert_eq(store_device_memory(st, a, 2, 1), FSDP_ENOTFOUND);
  cr_assert(strstr(err_msg(), "no device 2"), "%s", err_msg());
  cr_assert_eq(store_device_memory(st, a + 100, 0, 1), FSDP_ENOTFOUND);
  cr_assert_eq(store_device_memory(st, a, 0, (uint64_t)INT64_MAX + 1), FSDP_EINVAL);
  store_close(st);
}

Test(store, re_registering_keeps_held_devices_and_drops_free_ones_it_lost) {
  store_t *st = open_db("state.db");
  int64_t a = add_node(st, "a", 3);
  int64_t job = submit(st, "holds-2", 1, 0);
  int64_t ep;
  cr_assert_eq(start(st, job, 1, (int64_t[]){a}, (int[]){2}, &ep), 0);
  store_device_t one = {.index = 0, .kind = STORE_DEV_cuda, .name = "H100", .memory_bytes = 80};
  int64_t id;
  cr_assert_eq(store_node_register(st, "a", "10.0.0.1:9", &one, 1, &id), 0, "%s", err_msg());
  cr_assert_eq(id, a);
  store_node_t *nodes;
  int n;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert_str_eq(nodes[0].address, "10.0.0.1:9");
  cr_assert_eq(nodes[0].n_devices, 2, "device 1 dropped, device 2 kept: its job holds it");
  cr_assert(nodes[0].devices[0].kind == STORE_DEV_cuda && nodes[0].devices[0].memory_bytes == 80);
  cr_assert(nodes[0].devices[1].index == 2 && nodes[0].devices[1].job_id == job);
  store_nodes_free(nodes, n);
  store_device_t twice[2] = {one, one};
  cr_assert_eq(store_node_register(st, "a", "x", twice, 2, &id), FSDP_EINVAL);
  /* a device refused says which of its fields is wrong */
  store_device_t bad = one;
  bad.index = -1;
  cr_assert_eq(store_node_register(st, "a", "x", &bad, 1, &id), FSDP_EINVAL);
  cr_expect(strstr(err_msg(), "device index -1: negative"), "%s", err_msg());
  bad = one, bad.kind = (store_dev_kind_t)7;
  cr_assert_eq(store_node_register(st, "a", "x", &bad, 1, &id), FSDP_EINVAL);
  cr_expect(strstr(err_msg(), "kind 7: neither cpu nor cuda"), "%s", err_msg());
  bad = one, bad.memory_bytes = UINT64_MAX;
  cr_assert_eq(store_node_register(st, "a", "x", &bad, 1, &id), FSDP_EINVAL);
  cr_expect(strstr(err_msg(), "(cuda): memory 18446744073709551615 bytes"), "%s", err_msg());
  char longname[STORE_NAME_MAX + 1];
  memset(longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  cr_assert_eq(store_node_register(st, longname, "x", NULL, 0, &id), FSDP_EINVAL);
  store_close(st);
}

Test(store, a_second_writer_waits_then_times_out_with_a_message) {
  store_t *st = NULL;
  store_opts_t o = {.busy_timeout_ms = 100};
  cr_assert_eq(store_open(tpath("state.db"), &o, &st), 0);
  sqlite3 *db = raw_open("state.db");
  cr_assert_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  store_job_spec_t js = {.name = "x", .spec = "", .world_size = 1, .mesh = "1x1"};
  int64_t id;
  cr_assert_eq(store_job_submit(st, &js, &id), FSDP_ETIMEDOUT);
  cr_assert(strstr(err_msg(), "locked") && strstr(err_msg(), "100 ms"), "%s", err_msg());
  /* readers are not blocked by the writer (WAL) */
  store_job_t *jobs;
  int n;
  cr_assert_eq(store_job_list(st, 0, 0, 0, &jobs, &n), 0, "%s", err_msg());
  store_jobs_free(jobs, n);
  sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(db);
  cr_assert_eq(store_job_submit(st, &js, &id), 0, "and it works once the lock is gone");
  store_close(st);
}

/* One coordinator per database: a second store on the same file is refused
 * while the first is open, naming the holder, in this process or another;
 * a holder killed with -9 leaves nothing that stops the next. */
Test(store, a_second_store_on_one_database_is_refused_until_the_first_is_gone) {
  store_t *st = NULL, *st2 = NULL;
  cr_assert_eq(store_open(tpath("state.db"), NULL, &st), 0, "%s", err_msg());
  cr_assert_eq(store_open(tpath("state.db"), NULL, &st2), FSDP_ESTATE);
  cr_assert_null(st2);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld,", (long)getpid());
  cr_expect(strstr(err_msg(), "in use by another coordinator") && strstr(err_msg(), pid) &&
                strstr(err_msg(), "state.db-lock"), "%s", err_msg());
  /* the same database by another name (SQLite follows the link) */
  cr_assert_eq(symlink(tpath("state.db"), tpath("alias.db")), 0);
  cr_assert_eq(store_open(tpath("alias.db"), NULL, &st2), FSDP_ESTATE, "through a link: %s",
               err_msg());
  store_close(st);
  cr_assert_eq(store_open(tpath("state.db"), NULL, &st), 0, "free once closed: %s", err_msg());
  store_close(st);

  int go[2];
  cr_assert_eq(pipe(go), 0);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    if (store_open(tpath("state.db"), NULL, &st)) _exit(2);
    (void)!write(go[1], "x", 1);
    pause(); /* killed */
    _exit(0);
  }
  char b;
  cr_assert_eq(read(go[0], &b, 1), 1, "the child opened the store");
  cr_assert_eq(store_open(tpath("state.db"), NULL, &st), FSDP_ESTATE);
  snprintf(pid, sizeof pid, "pid %ld,", (long)child);
  cr_expect(strstr(err_msg(), pid), "names the other process: %s", err_msg());
  kill(child, SIGKILL);
  int status;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert_eq(store_open(tpath("state.db"), NULL, &st), 0, "after kill -9: %s", err_msg());
  store_close(st);
  close(go[0]), close(go[1]);
}

/* ---- crash safety ----
 * A child runs a fixed sequence of transactions (step i below), reporting
 * each commit on a pipe, and is killed with SIGKILL mid-way. The file must
 * then pass integrity_check and hold exactly the steps it committed: the same
 * state as a reference database that ran steps 0..k, where k is the last step
 * reported or the one after (committed, killed before it could say so). */
static void crash_step(store_t *st, int i) {
  int rc = 0;
  if (i == 0) {
    store_device_t d[2] = {{.index = 0, .name = "cpu", .memory_bytes = 1},
                           {.index = 1, .name = "cpu", .memory_bytes = 1}};
    rc = store_node_register(st, "crash-node", "127.0.0.1:1", d, 2, NULL);
  } else {
    int64_t job = (i - 1) / 4 + 1; /* ids from 1 in a new file */
    int64_t ep;
    char name[32];
    store_job_spec_t js = {.name = name, .spec = "steps = 1\n", .world_size = 2, .mesh = "1x2"};
    switch ((i - 1) % 4) {
    case 0:
      snprintf(name, sizeof name, "crash-%lld", (long long)job);
      rc = store_job_submit(st, &js, NULL);
      break;
    case 1: rc = start_on(st, job, 1, 2, &ep); break;
    case 2: rc = store_rendezvous_put(st, job, 1, "world", 0, "addr:0:x", 8); break;
    default: rc = store_attempt_end(st, job, 1, job % 2, "ended by the test", NULL); break;
    }
  }
  if (rc) {
    fprintf(stderr, "crash step %d: %s\n", i, err_msg());
    _exit(2);
  }
}

/* FNV-1a over every table's rows, times left out (the clock differs). */
static uint64_t digest(const char *name) {
  static const char *const q[] = {
      "SELECT id, name, address, state FROM nodes ORDER BY id",
      "SELECT * FROM devices ORDER BY node_id, idx",
      "SELECT id, name, spec, world_size, mesh, state, reason, max_restarts, restarts, epoch, "
      "started_ms IS NULL, ended_ms IS NULL FROM jobs ORDER BY id",
      "SELECT job_id, epoch, ended_ms IS NULL, outcome, reason FROM attempts ORDER BY 1, 2",
      "SELECT * FROM ranks ORDER BY 1, 2, 3",
      "SELECT * FROM rendezvous ORDER BY 1, 2, 3, 4",
      /* but the event a restore adds, above every id handed out before it */
      "SELECT id, job_id, node_id, kind, text FROM events WHERE kind != 'store.restored' "
      "ORDER BY id"};
  sqlite3 *db = raw_open(name);
  uint64_t h = 1469598103934665603ull;
  for (size_t k = 0; k < sizeof q / sizeof q[0]; k++) {
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(db, q[k], -1, &s, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    while (sqlite3_step(s) == SQLITE_ROW)
      for (int c = 0; c < sqlite3_column_count(s); c++) {
        const unsigned char *t = sqlite3_column_text(s, c);
        for (const unsigned char *p = t ? t : (const unsigned char *)"\x01NULL"; *p; p++)
          h = (h ^ *p) * 1099511628211ull;
        h = (h ^ '|') * 1099511628211ull;
      }
    sqlite3_finalize(s);
    h = (h ^ '\n') * 1099511628211ull;
  }
  sqlite3_close(db);
  return h;
}

#define CRASH_STEPS 100000 /* bounded; the child is killed long before */
#define CRASH_KILL_AFTER 240

Test(store, a_writer_killed_mid_way_leaves_exactly_what_it_committed, .timeout = 120) {
  int fd[2];
  cr_assert_eq(pipe(fd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(fd[0]);
    store_t *st = NULL;
    if (store_open(tpath("crash.db"), NULL, &st)) _exit(3);
    for (int i = 0; i < CRASH_STEPS; i++) {
      crash_step(st, i);
      if (write(fd[1], &i, sizeof i) != sizeof i) _exit(4);
    }
    _exit(0);
  }
  close(fd[1]);
  int last = -1, i;
  while (last < CRASH_KILL_AFTER && read(fd[0], &i, sizeof i) == sizeof i) last = i;
  cr_assert_eq(last, CRASH_KILL_AFTER, "the child reported its commits up to the kill");
  kill(pid, SIGKILL);
  while (read(fd[0], &i, sizeof i) == sizeof i) last = i; /* what it said before dying */
  close(fd[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "killed mid-way, status %d",
            status);

  store_t *st = open_db("crash.db"); /* recovers the log */
  cr_assert_eq(store_schema_from(st), STORE_SCHEMA_VERSION);
  store_close(st);
  sqlite3 *db = raw_open("crash.db");
  raw_text_eq(db, "PRAGMA integrity_check", "ok");
  cr_assert_eq(raw_int(db, "PRAGMA foreign_key_check"), -1, "no dangling reference");
  sqlite3_close(db);
  uint64_t got = digest("crash.db");

  /* the same steps on a reference file, opened with fewer syncs (it is not
   * the one under test) */
  store_opts_t fast = {.sync_normal = 1};
  cr_assert_eq(store_open(tpath("ref.db"), &fast, &st), 0);
  for (i = 0; i <= last; i++) crash_step(st, i);
  store_close(st);
  uint64_t upto_last = digest("ref.db");
  cr_assert_eq(store_open(tpath("ref.db"), &fast, &st), 0);
  crash_step(st, last + 1);
  store_close(st);
  uint64_t one_more = digest("ref.db");
  cr_assert_neq(upto_last, one_more, "every step changes the state");
  cr_assert(got == upto_last || got == one_more,
            "the crashed file holds steps 0..%d (or %d): exactly its commits", last, last + 1);
}

/* A checkpoint opens at its first shard, takes a shard again only with the
 * same checksum, commits once, is aborted by its attempt's end while open,
 * and is replaced when a later attempt writes the same step; reports of an
 * ended attempt are stale. */
Test(store, checkpoints_open_commit_abort_and_are_fenced) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "ck", 2, 1), epoch;
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  store_ckpt_t k;
  store_ckpt_shard_t s0 = {0, 0, 100, 0xabcdef0123456789ull}, s1 = {1, 1, 100, 7};
  cr_assert_eq(store_ckpt_report(st, job, 1, 10, 2, "/ck/step-00000010", &s0, &k), 0, "%s", err_msg());
  cr_assert(k.state == STORE_CKPT_OPEN && k.reported == 1 && k.shards == 2 && k.bytes == 100);
  cr_assert_eq(store_ckpt_report(st, job, 1, 10, 2, "/ck/step-00000010", &s0, &k), 0, "again: a no-op");
  cr_assert_eq(k.reported, 1);
  store_ckpt_shard_t other = s0;
  other.sum = 1;
  cr_assert_eq(store_ckpt_report(st, job, 1, 10, 2, "/ck/step-00000010", &other, &k), FSDP_EEXIST);
  cr_assert_eq(store_ckpt_report(st, job, 1, 10, 3, "/ck/step-00000010", &s1, &k), FSDP_EINVAL,
               "another shard count for the same checkpoint");
  cr_assert_eq(store_ckpt_report(st, job, 1, 10, 2, "/ck/step-00000010", &s1, &k), 0);
  cr_assert_eq(k.reported, 2);
  store_ckpt_shard_t *sh;
  int n;
  cr_assert_eq(store_ckpt_shards(st, job, 10, &sh, &n), 0);
  cr_assert(n == 2 && sh[0].sum == 0xabcdef0123456789ull && sh[1].rank == 1, "64-bit sums kept");
  store_array_free(sh);
  cr_assert_eq(store_ckpt_close(st, job, 10, 1, NULL), 0);
  cr_assert_eq(store_ckpt_close(st, job, 10, 1, NULL), FSDP_ESTATE, "committed once");
  cr_assert_eq(store_ckpt_report(st, job, 1, 10, 2, "/ck/step-00000010", &s0, &k), FSDP_ESTATE);
  /* step 20 open when the attempt fails: aborted with it, pending removal;
   * step 15, every shard in and its commit still running, stays open for it */
  cr_assert_eq(store_ckpt_report(st, job, 1, 20, 2, "/ck/step-00000020", &s0, &k), 0);
  cr_assert_eq(store_ckpt_report(st, job, 1, 15, 2, "/ck/step-00000015", &s0, &k), 0);
  cr_assert_eq(store_ckpt_report(st, job, 1, 15, 2, "/ck/step-00000015", &s1, &k), 0);
  store_job_state_t next;
  cr_assert_eq(store_attempt_end(st, job, 1, 0, "rank 1 died", &next), 0);
  cr_assert_eq(store_ckpt_report(st, job, 1, 20, 2, "/ck/step-00000020", &s1, &k), FSDP_ESTALE);
  store_ckpt_t *v;
  cr_assert_eq(store_ckpt_pending(st, &v, &n), 0);
  cr_assert(n == 2 && v[0].step == 15 && v[0].state == STORE_CKPT_OPEN && v[1].step == 20 &&
            v[1].state == STORE_CKPT_ABORTED, "%d", n);
  store_array_free(v);
  cr_assert_eq(store_ckpt_close(st, job, 15, 1, NULL), 0, "the commit lands after the attempt's end");
  cr_assert_eq(store_ckpt_removed(st, job, 15, 1, 1), 0);
  /* attempt 2 writes step 20 again: the aborted one is replaced */
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(epoch, 2);
  cr_assert_eq(store_ckpt_report(st, job, 2, 20, 2, "/ck/step-00000020", &s1, &k), 0, "%s", err_msg());
  cr_assert(k.state == STORE_CKPT_OPEN && k.epoch == 2 && k.reported == 1);
  /* attempt 1's late word on step 20 touches attempt 2's row in nothing */
  cr_assert_eq(store_ckpt_close(st, job, 20, 1, NULL), FSDP_ESTATE, "attempt 1 cannot commit it");
  cr_assert_eq(store_ckpt_removed(st, job, 20, 1, 0), 0);
  cr_assert_eq(store_ckpt_pending(st, &v, &n), 0);
  cr_assert(n == 1 && v[0].step == 20 && v[0].epoch == 2 && v[0].state == STORE_CKPT_OPEN &&
            !v[0].removed, "attempt 2's step 20 is as it was");
  store_array_free(v);
  cr_assert_eq(store_ckpt_list(st, job, &v, &n), 0);
  cr_assert(n == 2 && v[0].step == 20 && v[1].step == 10 && v[1].state == STORE_CKPT_COMMITTED);
  store_array_free(v);
  cr_assert_eq(store_ckpt_removed(st, job, 10, 1, 1), 0);
  cr_assert_eq(store_ckpt_list(st, job, &v, &n), 0);
  cr_assert_eq(n, 1, "retention forgets the row");
  store_array_free(v);
  store_close(st);
}

/* Job "ck" of 2 ranks (max_restarts) running its first attempt on node n0. */
static void ckpt_job_running(store_t *st, int max_restarts, int64_t *node, int64_t *job,
                             int64_t *epoch) {
  *node = add_node(st, "n0", 2);
  *job = submit(st, "ck", 2, max_restarts);
  cr_assert_eq(start_on(st, *job, *node, 2, epoch), 0);
}

/* A committed checkpoint found damaged is ABORTED with its "damaged:"
 * reason and the place its files were set aside; a later attempt that
 * writes its step again (a shard, or the word that one was not written)
 * gets a row of its own, and the damaged one is kept beside it, listed
 * after it with its reason, pending removal from where it went; once
 * removed it is listed so, and the attempt's row is left as it is. */
Test(store, a_damaged_checkpoint_written_again_keeps_its_reason) {
  store_t *st = open_db("state.db");
  int64_t node, job, epoch;
  ckpt_job_running(st, 3, &node, &job, &epoch);
  store_ckpt_t k;
  store_ckpt_shard_t s0 = {0, 0, 100, 5}, s1 = {1, 1, 100, 7};
  const char *d40 = "/ck/step-00000040", *aside = "/ck/step-00000040.damaged";
  cr_assert_eq(store_ckpt_report(st, job, 1, 40, 2, d40, &s0, &k), 0, "%s", err_msg());
  cr_assert_eq(store_ckpt_report(st, job, 1, 40, 2, d40, &s1, &k), 0, "%s", err_msg());
  cr_assert_eq(store_ckpt_close(st, job, 40, 1, NULL), 0);
  store_job_state_t next;
  cr_assert_eq(store_attempt_end(st, job, 1, 0, "preempted", &next), 0);
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(epoch, 2);
  int changed = 0;
  cr_assert_eq(store_ckpt_damaged(st, job, 0, 40, "damaged: shard 1 cut", aside, &k, &changed), 0,
               "%s", err_msg());
  cr_assert(changed && k.state == STORE_CKPT_ABORTED && !strcmp(k.dir, aside), "%s", k.dir);
  /* attempt 2's save of step 40 could not be written, then is written */
  int aborted;
  cr_assert_eq(store_ckpt_fail(st, job, 2, 40, 2, d40, "rank 0: disk full", &k, &aborted), 0, "%s",
               err_msg());
  cr_assert(aborted && k.epoch == 2 && !strcmp(k.dir, d40), "%s", k.dir);
  store_ckpt_t *v;
  int n;
  cr_assert_eq(store_ckpt_list(st, job, &v, &n), 0);
  cr_assert_eq(n, 2);
  cr_assert(v[0].step == 40 && v[0].epoch == 2 && !strcmp(v[0].reason, "rank 0: disk full"));
  cr_assert(v[1].step == 40 && v[1].epoch == 1 && v[1].state == STORE_CKPT_ABORTED &&
            !strcmp(v[1].reason, "damaged: shard 1 cut") && !strcmp(v[1].dir, aside) &&
            v[1].reported == 2 && v[1].bytes == 200, "%s %s", v[1].reason, v[1].dir);
  store_array_free(v);
  store_ckpt_removed(st, job, 40, 2, 0); /* attempt 2's failed one removed */
  cr_assert_eq(store_attempt_end(st, job, 2, 0, "rank 1 died", &next), 0);
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(store_ckpt_report(st, job, 3, 40, 2, d40, &s0, &k), 0, "%s", err_msg());
  cr_assert(k.state == STORE_CKPT_OPEN && k.epoch == 3 && k.reported == 1);
  cr_assert_eq(store_ckpt_pending(st, &v, &n), 0);
  cr_assert(n == 2 && v[0].epoch == 1 && !strcmp(v[0].dir, aside) && v[1].epoch == 3,
            "the damaged one is pending removal from where it went (%d)", n);
  store_array_free(v);
  cr_assert_eq(store_ckpt_removed(st, job, 40, 1, 0), 0);
  cr_assert_eq(store_ckpt_list(st, job, &v, &n), 0);
  cr_assert(n == 2 && v[0].epoch == 3 && v[0].state == STORE_CKPT_OPEN && !v[0].removed &&
            v[1].epoch == 1 && v[1].removed && strstr(v[1].reason, "damaged:"));
  store_array_free(v);
  store_close(st);
}

/* A shard its rank could not write aborts its checkpoint at once, once
 * (the same word again changes nothing); a failure that is the first word
 * of a checkpoint opens it aborted, pending the removal of its files; a
 * committed one is left alone; an older attempt's word is stale, and a
 * later attempt's failure replaces what an older one left. */
Test(store, a_shard_not_written_aborts_its_checkpoint_and_is_fenced) {
  store_t *st = open_db("state.db");
  int64_t node, job, epoch;
  ckpt_job_running(st, 1, &node, &job, &epoch);
  store_ckpt_t k;
  store_ckpt_shard_t s0 = {0, 0, 100, 5}, s1 = {1, 1, 100, 7};
  int aborted = -1;
  const char *d10 = "/ck/step-00000010", *d20 = "/ck/step-00000020";
  cr_assert_eq(store_ckpt_report(st, job, 1, 10, 2, d10, &s0, &k), 0, "%s", err_msg());
  cr_assert_eq(store_ckpt_fail(st, job, 1, 10, 2, d10, "rank 1: disk full", &k, &aborted), 0, "%s",
               err_msg());
  cr_assert(aborted == 1 && k.state == STORE_CKPT_ABORTED && k.reported == 1 && k.closed_ms > 0 &&
            !strcmp(k.reason, "rank 1: disk full"), "%d %s", aborted, k.reason);
  cr_assert_eq(store_ckpt_fail(st, job, 1, 10, 2, d10, "rank 1: again", &k, &aborted), 0);
  cr_assert(aborted == 0 && !strcmp(k.reason, "rank 1: disk full"), "aborted twice: %s", k.reason);
  cr_assert_eq(store_ckpt_report(st, job, 1, 10, 2, d10, &s1, &k), FSDP_ESTATE, "a late shard");
  /* the first word of step 20: opened aborted */
  cr_assert_eq(store_ckpt_fail(st, job, 1, 20, 2, d20, "rank 0: NaN", &k, &aborted), 0, "%s",
               err_msg());
  cr_assert(aborted == 1 && k.state == STORE_CKPT_ABORTED && k.epoch == 1 && k.reported == 0 &&
            k.shards == 2 && !strcmp(k.dir, d20) && k.opened_ms > 0 && k.closed_ms > 0);
  store_ckpt_t *v;
  int n;
  cr_assert_eq(store_ckpt_pending(st, &v, &n), 0);
  cr_assert(n == 2 && v[1].step == 20 && v[1].state == STORE_CKPT_ABORTED && !v[1].removed, "%d", n);
  store_array_free(v);
  /* committed: left alone */
  cr_assert_eq(store_ckpt_report(st, job, 1, 30, 2, "/ck/step-00000030", &s0, &k), 0);
  cr_assert_eq(store_ckpt_report(st, job, 1, 30, 2, "/ck/step-00000030", &s1, &k), 0);
  cr_assert_eq(store_ckpt_close(st, job, 30, 1, NULL), 0);
  cr_assert_eq(store_ckpt_fail(st, job, 1, 30, 2, "/ck/step-00000030", "late", &k, &aborted),
               FSDP_ESTATE);
  cr_assert_eq(aborted, 0);
  /* attempt 2: attempt 1's word is stale; attempt 2's failure of step 20
   * replaces attempt 1's row */
  store_job_state_t next;
  cr_assert_eq(store_attempt_end(st, job, 1, 0, "rank 1 died", &next), 0);
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(epoch, 2);
  cr_assert_eq(store_ckpt_report(st, job, 2, 40, 2, "/ck/step-00000040", &s0, &k), 0);
  cr_assert_eq(store_ckpt_fail(st, job, 1, 40, 2, "/ck/step-00000040", "old", &k, &aborted),
               FSDP_ESTALE, "%s", err_msg());
  cr_assert_eq(aborted, 0);
  cr_assert_eq(store_ckpt_list(st, job, &v, &n), 0);
  cr_assert(n >= 1 && v[0].step == 40 && v[0].state == STORE_CKPT_OPEN, "attempt 1 aborted it");
  store_array_free(v);
  cr_assert_eq(store_ckpt_fail(st, job, 2, 20, 2, d20, "rank 0: NaN again", &k, &aborted), 0, "%s",
               err_msg());
  cr_assert(aborted == 1 && k.epoch == 2 && !strcmp(k.reason, "rank 0: NaN again"), "%s", k.reason);
  store_close(st);
}

/* Ranks that stopped on SIGTERM (JOB_EXIT_PREEMPTED) end their attempt as
 * preempted once every rank is gone: the job goes back to PENDING without
 * spending a restart; a failed rank among them still fails it. */
Test(store, a_preempted_attempt_is_requeued_without_a_restart) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "pre", 2, 0), epoch;
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, job, 1, 0, JOB_EXIT_PREEMPTED, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_GOING, "the other rank still writes its checkpoint");
  cr_assert_eq(store_rank_exit(st, job, 1, 1, JOB_EXIT_PREEMPTED, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_PREEMPTED);
  cr_assert_eq(store_attempt_requeue(st, job, 1, "node n-1 stopping"), 0, "%s", err_msg());
  store_job_t j = get_job(st, job);
  cr_assert(j.state == STORE_JOB_PENDING && j.restarts == 0, "state %d restarts %d", j.state,
            j.restarts);
  cr_assert(strstr(j.reason, "requeued") && strstr(j.reason, "node n-1 stopping"), "%s", j.reason);
  store_job_free(&j);
  cr_assert_eq(n_free(st), 2, "its devices are free");
  /* attempt 2: one preempted, one failed: that fails it */
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(store_rank_exit(st, job, 2, 0, JOB_EXIT_PREEMPTED, NULL, NULL, &v), 0);
  cr_assert_eq(store_rank_exit(st, job, 2, 1, 1, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_FAILED);
  store_close(st);
}

/* A rank its node fenced (store_rank_fenced) outranks a failure: a peer's
 * fence breaks the other ranks' ring, and their failures may be reported
 * first or after. Its verdict says so whichever came first; a fenced rank
 * that had exited 0 is a success. */
Test(store, a_fenced_rank_makes_its_attempt_fenced_whatever_the_others_did) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "fen", 2, 0), epoch;
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_fenced(st, job, 1, 1, -9, NULL, NULL, &v), 0, "%s", err_msg());
  cr_assert_eq(v, STORE_ATTEMPT_FENCED, "the other rank cannot go on without it");
  cr_assert_eq(store_rank_exit(st, job, 1, 0, 1, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_FENCED, "its ring broke: the fence's doing");
  int64_t e = 0;
  cr_assert_eq(store_attempt_verdict(st, job, &e, &v), 0);
  cr_assert(e == 1 && v == STORE_ATTEMPT_FENCED, "read again: %d", v);
  cr_assert_eq(store_attempt_requeue(st, job, 1, "fenced"), 0, "%s", err_msg());
  store_job_t j = get_job(st, job);
  cr_assert(j.state == STORE_JOB_PENDING && j.restarts == 0, "state %d restarts %d", j.state,
            j.restarts);
  store_job_free(&j);
  /* failure first, then the fence */
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(store_rank_exit(st, job, 2, 0, 1, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_FAILED);
  cr_assert_eq(store_rank_fenced(st, job, 2, 1, JOB_EXIT_FENCED, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_FENCED);
  cr_assert_eq(store_attempt_requeue(st, job, 2, "fenced"), 0, "%s", err_msg());
  /* one that had succeeded as the fence came */
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(store_rank_fenced(st, job, 3, 0, 0, NULL, NULL, &v), 0);
  cr_assert_eq(store_rank_exit(st, job, 3, 1, 0, NULL, NULL, &v), 0);
  cr_assert_eq(v, STORE_ATTEMPT_SUCCEEDED);
  store_close(st);
}

/* Only a FAILED or CANCELLED job resumes: PENDING again, restarts from zero. */
Test(store, a_failed_or_cancelled_job_resumes_with_its_restarts_reset) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "again", 2, 0), epoch;
  cr_assert_eq(store_job_resume(st, job, NULL), FSDP_ESTATE, "a pending job");
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(store_job_resume(st, job, NULL), FSDP_ESTATE, "a running job");
  store_job_state_t next;
  cr_assert_eq(store_attempt_end(st, job, 1, 0, "rank 0 died", &next), 0);
  cr_assert_eq(next, STORE_JOB_FAILED);
  cr_assert_eq(store_job_resume(st, job, NULL), 0, "%s", err_msg());
  store_job_t j = get_job(st, job);
  cr_assert(j.state == STORE_JOB_PENDING && j.restarts == 0, "state %d restarts %d", j.state, j.restarts);
  store_job_free(&j);
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(epoch, 2, "a new attempt");
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, job, 2, 0, 0, NULL, NULL, &v), 0);
  cr_assert_eq(store_rank_exit(st, job, 2, 1, 0, NULL, NULL, &v), 0);
  cr_assert_eq(store_attempt_end(st, job, 2, 1, "", &next), 0);
  cr_assert_eq(store_job_resume(st, job, NULL), FSDP_ESTATE, "a succeeded job");
  store_close(st);
}

/* A database the previous release made (schema version STORE_SCHEMA_VERSION
 * - 1, by its own migration steps, which are never edited) opens migrated to
 * the current version, every row kept, and the new tables usable. */
Test(store, a_database_of_the_previous_schema_is_migrated_and_its_data_kept) {
  store_t *st = NULL;
  store_opts_t old = {.version = STORE_SCHEMA_VERSION - 1};
  cr_assert_eq(store_open(tpath("old.db"), &old, &st), 0, "%s", err_msg());
  int64_t node = add_node(st, "n0", 2);
  store_close(st);
  /* jobs as the previous release wrote them: one pending (its checkpoint
   * directory unknown, as version 6 left a live job), one ended */
  sqlite3 *db = raw_open("old.db");
  cr_assert_eq(raw_int(db, "PRAGMA user_version"), STORE_SCHEMA_VERSION - 1);
  cr_assert_eq(sqlite3_exec(db, "INSERT INTO jobs(name, spec, world_size, mesh, state, max_restarts, "
                            "submitted_ms, checkpoint_dir) VALUES('from-before', 'steps = 10', 2, "
                            "'1x2', 'PENDING', 1, 1, NULL), ('ended-before', 'steps = 10', 1, '1x1', "
                            "'FAILED', 0, 1, '')",
                            NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
  const int64_t job = 1, ended = 2;
  sqlite3_close(db);
  st = open_db("old.db");
  cr_assert_eq(store_schema_from(st), STORE_SCHEMA_VERSION - 1);
  store_job_t j = get_job(st, job);
  cr_assert_str_eq(j.name, "from-before");
  cr_assert_eq(j.max_restarts, 1);
  store_job_free(&j);
  store_node_t *nodes;
  int n;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert(n == 1 && nodes[0].id == node && nodes[0].n_devices == 2);
  store_nodes_free(nodes, n);
  store_ckpt_t *k;
  cr_assert_eq(store_ckpt_list(st, job, &k, &n), 0, "%s", err_msg());
  cr_assert_eq(n, 0);
  free(k);
  store_close(st);
  db = raw_open("old.db");
  cr_assert_eq(raw_int(db, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'jobs_ended'"), 1,
               "version 4's index of ended jobs");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM jobs WHERE checkpoint_dir IS NULL AND id = 1"), 1);
  /* version 7: a rank's memory from its exit report, none for rows of before */
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM pragma_table_info('ranks') WHERE name = 'memory' "
                       "AND dflt_value IS NOT NULL"), 1);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM pragma_table_info('attempts') WHERE name = "
                       "'ring_secret'"), 1, "version 8's ring secrets");
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM nodes WHERE stopped = 0"), 1,
               "version 10: a node of before did not stop");
  sqlite3_close(db);
  st = open_db("old.db");
  store_job_dir_t *v;
  cr_assert_eq(store_jobs_by_checkpoint_dir(st, "/ck/a", 0, &v, &n), 0, "%s", err_msg());
  cr_assert(n == 1 && v[0].id == job && v[0].dir_unknown, "the live job of before is asked about");
  free(v);
  /* resumed, the ended one records the directory its spec resolved to */
  cr_assert_eq(store_job_resume(st, ended, "/ck/b"), 0, "%s", err_msg());
  cr_assert_eq(store_jobs_by_checkpoint_dir(st, "/ck/b", 0, &v, &n), 0, "%s", err_msg());
  cr_assert(n == 2 && v[1].id == ended && !v[1].dir_unknown && v[1].state == STORE_JOB_PENDING,
            "%d rows", n);
  free(v);
  store_close(st);
}

/* The figures a rank last reported (step, loss, tokens/s) are kept with its
 * row: by its exit report and by store_rank_figures (the coordinator's
 * memory as an attempt ends), never an older step over a newer, a NaN loss
 * read back as one; they outlive the store's close and stay with an ended
 * attempt once the next one runs. A rank with none reads as unreported. */
Test(store, a_ranks_last_figures_are_kept_never_an_older_step) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "fig", 2, 1), epoch;
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  store_rank_t *r;
  int n;
  cr_assert_eq(store_ranks_of_job(st, job, 1, &r, &n), 0);
  cr_assert(n == 2 && !r[0].reported && !r[1].reported, "none reported at the start");
  store_array_free(r);
  store_figures_t f[3] = {
      {.job_id = job, .epoch = 1, .rank = 0, .step = 1867, .loss = 2.75, .tokens_per_s = 1200},
      {.job_id = job, .epoch = 1, .rank = 1, .step = 1866, .loss = NAN, .tokens_per_s = 1100},
      {.job_id = job, .epoch = 1, .rank = 7, .step = 5}, /* no such rank: passed over */
  };
  cr_assert_eq(store_rank_figures(st, f, 3), 0, "%s", err_msg());
  store_figures_t older = {.step = 1800, .loss = 3.5, .tokens_per_s = 1};
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, job, 1, 0, -9, NULL, &older, &v), 0, "%s", err_msg());
  cr_assert_eq(v, STORE_ATTEMPT_FAILED);
  f[0].step = 1700;
  cr_assert_eq(store_rank_figures(st, f, 1), 0, "%s", err_msg());
  store_job_state_t next;
  cr_assert_eq(store_attempt_end(st, job, 1, 0, "rank 0 killed", &next), 0, "%s", err_msg());
  cr_assert_eq(next, STORE_JOB_PENDING);
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0);
  cr_assert_eq(epoch, 2);
  store_figures_t later = {.step = 1900, .loss = 2.5, .tokens_per_s = 1300};
  cr_assert_eq(store_rank_exit(st, job, 2, 1, 1, NULL, &later, &v), 0, "%s", err_msg());
  store_close(st);

  st = open_db("state.db");
  cr_assert_eq(store_ranks_of_job(st, job, 1, &r, &n), 0, "%s", err_msg());
  cr_assert_eq(n, 2);
  cr_assert(r[0].reported && r[0].step == 1867 && r[0].loss == 2.75 && r[0].tokens_per_s == 1200,
            "rank 0: step %lld loss %g: an older step replaced a newer", (long long)r[0].step,
            r[0].loss);
  cr_assert(r[1].reported && r[1].step == 1866 && isnan(r[1].loss) && r[1].tokens_per_s == 1100,
            "rank 1: step %lld loss %g", (long long)r[1].step, r[1].loss);
  store_array_free(r);
  store_figures_t *k;
  cr_assert_eq(store_rank_figures_of(st, job, 2, &k, &n), 0, "%s", err_msg());
  cr_assert(n == 1 && k[0].rank == 1 && k[0].epoch == 2 && k[0].step == 1900 && k[0].loss == 2.5,
            "attempt 2: %d ranks with figures", n);
  store_array_free(k);
  cr_assert_eq(store_rank_figures_of(st, job, 1, &k, &n), 0);
  cr_assert(n == 2 && k[0].step == 1867 && k[1].step == 1866, "attempt 1 keeps its own");
  store_array_free(k);
  store_close(st);
}

/* A database of schema 11 (before a stop could be asked) migrates to 12
 * with its running job kept and no stop asked; a stop asked then is kept
 * (when, until when, why) and ends the job CANCELLED whichever way its
 * attempt ends (a requeue, a failure with restarts left), never PENDING;
 * a resume forgets it. */
Test(store, a_database_of_schema_11_migrates_and_a_stop_asked_is_kept) {
  store_t *st = NULL;
  store_opts_t old = {.version = 11};
  cr_assert_eq(store_open(tpath("v11.db"), &old, &st), 0, "%s", err_msg());
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "before", 2, 3), epoch;
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0, "%s", err_msg());
  store_close(st);
  sqlite3 *db = raw_open("v11.db");
  cr_assert_eq(raw_int(db, "PRAGMA user_version"), 11);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM pragma_table_info('jobs') WHERE name = 'stop_ms'"), 0);
  sqlite3_close(db);
  st = open_db("v11.db");
  cr_assert_eq(store_schema_from(st), 11);
  int64_t asked = -1, until = -1;
  cr_assert_eq(store_job_stopping(st, job, &asked, &until, NULL, 0), 0, "%s", err_msg());
  cr_assert(asked == 0 && until == 0, "a stop read from before: %lld", (long long)asked);
  store_job_t j = get_job(st, job);
  cr_assert_eq(j.state, STORE_JOB_RUNNING);
  store_job_free(&j);
  cr_assert_eq(store_job_stop(st, job, "cancelled: keep it", 12345, &epoch), 0, "%s", err_msg());
  cr_assert_eq(epoch, 1);
  cr_assert_eq(store_job_stop(st, job, "again", 99999, NULL), 0, "asked again: the first stands");
  char why[64] = "";
  cr_assert_eq(store_job_stopping(st, job, &asked, &until, why, sizeof why), 0);
  cr_assert(asked > 0 && until == 12345 && !strcmp(why, "cancelled: keep it"), "%lld %s",
            (long long)until, why);
  store_job_state_t next;
  cr_assert_eq(store_attempt_end(st, job, 1, 0, "rank 0 killed by signal 9", &next), 0,
               "%s", err_msg());
  cr_assert_eq(next, STORE_JOB_CANCELLED, "a failure with 3 restarts left restarted it");
  j = get_job(st, job);
  cr_assert(j.state == STORE_JOB_CANCELLED && j.restarts == 0 && strstr(j.reason, "keep it") &&
            strstr(j.reason, "no checkpoint was written") && strstr(j.reason, "signal 9"),
            "%d: %s", j.state, j.reason);
  store_job_free(&j);
  cr_assert_eq(store_job_resume(st, job, NULL), 0, "%s", err_msg());
  cr_assert_eq(store_job_stopping(st, job, &asked, &until, NULL, 0), 0);
  cr_assert_eq(asked, 0, "a resume forgets the stop");
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0, "%s", err_msg());
  cr_assert_eq(store_job_stop(st, job, "cancelled: again", 1, NULL), 0, "%s", err_msg());
  cr_assert_eq(store_attempt_requeue(st, job, epoch, "its ranks were stopped"), 0, "%s", err_msg());
  j = get_job(st, job);
  cr_assert_eq(j.state, STORE_JOB_CANCELLED, "requeued: %s", j.reason);
  store_job_free(&j);
  store_close(st);
}

/* A database of schema 10 (before ranks kept their figures) opens migrated:
 * its jobs, attempts and ranks read as they were (memory from the exit
 * reports kept), every rank of before unreported, never step 0; a rank's
 * figures are kept from then on. */
Test(store, a_database_of_schema_10_keeps_its_jobs_and_ranks_without_figures) {
  store_t *st = NULL;
  store_opts_t old = {.version = 10};
  cr_assert_eq(store_open(tpath("v10.db"), &old, &st), 0, "%s", err_msg());
  cr_assert_eq(store_schema_from(st), 0);
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "before", 2, 0), epoch;
  cr_assert_eq(start_on(st, job, node, 2, &epoch), 0, "%s", err_msg());
  store_attempt_verdict_t v;
  cr_assert_eq(store_rank_exit(st, job, 1, 0, 0, "activations=1/2", NULL, &v), 0, "%s", err_msg());
  cr_assert_eq(store_rank_exit(st, job, 1, 1, 0, NULL, NULL, &v), 0, "%s", err_msg());
  cr_assert_eq(store_attempt_end(st, job, 1, 1, "", NULL), 0, "%s", err_msg());
  store_close(st);
  sqlite3 *db = raw_open("v10.db");
  cr_assert_eq(raw_int(db, "PRAGMA user_version"), 10);
  cr_assert_eq(raw_int(db, "SELECT count(*) FROM pragma_table_info('ranks') WHERE name = 'step'"),
               0, "schema 10 has no figures");
  sqlite3_close(db);

  st = open_db("v10.db");
  cr_assert_eq(store_schema_from(st), 10);
  store_job_t j = get_job(st, job);
  cr_assert(j.state == STORE_JOB_SUCCEEDED && j.epoch == 1 && !strcmp(j.name, "before"));
  store_job_free(&j);
  store_rank_t *r;
  int n;
  cr_assert_eq(store_ranks_of_job(st, job, 0, &r, &n), 0, "%s", err_msg());
  cr_assert_eq(n, 2);
  for (int i = 0; i < 2; i++)
    cr_assert(r[i].state == STORE_RANK_SUCCEEDED && !r[i].reported && r[i].step == 0,
              "rank %d of before: state %d reported %d", i, r[i].state, r[i].reported);
  cr_assert_str_eq(r[0].memory, "activations=1/2");
  store_array_free(r);
  store_figures_t *k;
  cr_assert_eq(store_rank_figures_of(st, job, 1, &k, &n), 0, "%s", err_msg());
  cr_assert_eq(n, 0, "no figures of before");
  store_array_free(k);
  store_figures_t f = {.job_id = job, .epoch = 1, .rank = 1, .step = 10, .loss = 4.5};
  cr_assert_eq(store_rank_figures(st, &f, 1), 0, "%s", err_msg());
  cr_assert_eq(store_rank_figures_of(st, job, 1, &k, &n), 0);
  cr_assert(n == 1 && k[0].rank == 1 && k[0].step == 10 && k[0].loss == 4.5);
  store_array_free(k);
  store_close(st);
  db = raw_open("v10.db");
  cr_assert_eq(raw_int(db, "PRAGMA user_version"), STORE_SCHEMA_VERSION);
  sqlite3_close(db);
}

/* Each attempt draws its own ring secret, kept with it while it runs (a
 * reopened store gives the same bytes) and cleared when it ends; an attempt
 * that does not exist has none; the database file is its owner's alone. */
Test(store, each_attempt_draws_its_own_ring_secret) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 4);
  int64_t a = submit(st, "a", 2, 0), b = submit(st, "b", 2, 0), ea, eb;
  cr_assert_eq(start_on(st, a, node, 2, &ea), 0, "%s", err_msg());
  int64_t nodes[2] = {node, node};
  int dev[2] = {2, 3};
  cr_assert_eq(start(st, b, 2, nodes, dev, &eb), 0, "%s", err_msg());
  uint8_t sa[RING_SECRET_BYTES], sb[RING_SECRET_BYTES], again[RING_SECRET_BYTES];
  cr_assert_eq(store_attempt_secret(st, a, ea, sa), 0, "%s", err_msg());
  cr_assert_eq(store_attempt_secret(st, b, eb, sb), 0, "%s", err_msg());
  cr_expect(memcmp(sa, sb, sizeof sa), "two attempts drew the same secret");
  cr_assert_eq(store_attempt_secret(st, a, ea + 1, again), FSDP_ENOTFOUND);
  cr_assert(strstr(err_msg(), "no ring secret"), "%s", err_msg());
  store_close(st);
  st = open_db("state.db");
  cr_assert_eq(store_attempt_secret(st, a, ea, again), 0, "%s", err_msg());
  cr_expect_arr_eq(again, sa, sizeof sa, "the secret changed across a reopen");
  /* an attempt that ended keeps no secret */
  store_job_state_t js;
  cr_assert_eq(store_attempt_end(st, a, ea, 1, "", &js), 0, "%s", err_msg());
  cr_expect_eq(store_attempt_secret(st, a, ea, again), FSDP_ENOTFOUND, "an ended attempt's secret");
  cr_expect_eq(store_attempt_secret(st, b, eb, again), 0, "%s", err_msg());
  store_close(st);
  sqlite3 *db = raw_open("state.db");
  cr_expect_eq(raw_int(db, "SELECT count(*) FROM attempts WHERE ring_secret IS NOT NULL"), 1,
               "only the running attempt's secret is stored");
  sqlite3_close(db);
  struct stat f;
  cr_assert_eq(stat(tpath("state.db"), &f), 0);
  cr_expect_eq(f.st_mode & 077, 0, "state.db is mode %03o", (unsigned)(f.st_mode & 0777));
}

/* A database readable by others (made before version 8, or by hand) is made
 * its owner's alone when opened. */
Test(store, a_database_readable_by_others_is_made_private) {
  store_t *st = open_db("open.db");
  store_close(st);
  cr_assert_eq(chmod(tpath("open.db"), 0644), 0);
  st = open_db("open.db");
  store_close(st);
  struct stat f;
  cr_assert_eq(stat(tpath("open.db"), &f), 0);
  cr_expect_eq(f.st_mode & 0777, 0600, "open.db is mode %03o", (unsigned)(f.st_mode & 0777));
}

/* A submit finds the live jobs of a checkpoint directory through its index:
 * only PENDING and RUNNING ones, only of that directory. */
Test(store, live_jobs_are_found_by_checkpoint_directory) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 1);
  store_job_spec_t js[4] = {
      {.name = "a", .spec = "s", .world_size = 1, .mesh = "1x1", .checkpoint_dir = "/ck/a"},
      {.name = "b", .spec = "s", .world_size = 1, .mesh = "1x1", .checkpoint_dir = "/ck/b"},
      {.name = "c", .spec = "s", .world_size = 1, .mesh = "1x1", .checkpoint_dir = "/ck/a"},
      {.name = "d", .spec = "s", .world_size = 1, .mesh = "1x1"},
  };
  int64_t id[4];
  cr_assert_eq(store_job_submit_batch(st, js, 4, id), 0, "%s", err_msg());
  store_job_dir_t *v;
  int n;
  cr_assert_eq(store_jobs_by_checkpoint_dir(st, "/ck/a", 0, &v, &n), 0, "%s", err_msg());
  cr_assert(n == 2 && v[0].id == id[0] && v[1].id == id[2] && !v[0].dir_unknown, "%d rows", n);
  free(v);
  int64_t ep;
  cr_assert_eq(start_on(st, id[0], node, 1, &ep), 0);
  cr_assert_eq(store_job_cancel(st, id[2], "gone", NULL), 0, "%s", err_msg());
  cr_assert_eq(store_jobs_by_checkpoint_dir(st, "/ck/a", 0, &v, &n), 0, "%s", err_msg());
  cr_assert(n == 1 && v[0].id == id[0] && v[0].state == STORE_JOB_RUNNING,
            "the running one only, not the cancelled one: %d rows", n);
  free(v);
  cr_assert_eq(store_jobs_by_checkpoint_dir(st, "/ck/none", 0, &v, &n), 0, "%s", err_msg());
  cr_assert_eq(n, 0);
  free(v);
  /* every job of a directory, ended ones too (the janitor's leftover sweep) */
  cr_assert_eq(store_jobs_by_checkpoint_dir(st, "/ck/a", 1, &v, &n), 0, "%s", err_msg());
  cr_assert(n == 2 && v[0].id == id[0] && v[1].id == id[2] && v[1].state == STORE_JOB_CANCELLED,
            "the cancelled one too: %d rows", n);
  free(v);
  /* the jobs with a directory, one at a time by id: d has none; a's
   * attempt ended, and when */
  store_job_state_t was;
  cr_assert_eq(store_attempt_end(st, id[0], ep, 0, "failed", &was), 0, "%s", err_msg());
  store_job_ckpt_dir_t o;
  int64_t seen[4], after = 0;
  int k = 0;
  for (int rc; k < 4 && !(rc = store_job_ckpt_dir_next(st, after, &o)); after = o.id) {
    seen[k++] = o.id;
    cr_expect_str_eq(o.dir, o.id == id[1] ? "/ck/b" : "/ck/a");
    cr_expect_eq(o.ended_ms > 0, o.id == id[0], "j-%lld ended at %lld", (long long)o.id,
                 (long long)o.ended_ms);
  }
  cr_assert(k == 3 && seen[0] == id[0] && seen[1] == id[1] && seen[2] == id[2], "%d jobs", k);
  cr_expect_eq(store_job_ckpt_dir_next(st, after, &o), FSDP_ENOENT, "%s", err_msg());
  /* the pending ones' ids, in order, through the state index */
  int64_t *ids;
  cr_assert_eq(store_job_ids(st, STORE_JOB_PENDING, &ids, &n), 0, "%s", err_msg());
  cr_assert(n == 2 && ids[0] == id[1] && ids[1] == id[3], "%d pending", n);
  free(ids);
  store_close(st);
}

/* The ids store_nodes_touched hands over, sorted, repeats dropped. */
static int touched(store_t *st, int64_t *out, int cap, int *all) {
  int64_t *ids;
  int n;
  store_nodes_touched(st, &ids, &n, all);
  int k = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int j = 0; j < k; j++) seen |= out[j] == ids[i];
    if (!seen && k < cap) out[k++] = ids[i];
  }
  free(ids);
  for (int i = 1; i < k; i++)
    for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
      int64_t t = out[j];
      out[j] = out[j - 1], out[j - 1] = t;
    }
  return k;
}

/* Every change of a node's row or of who holds its devices names the node
 * to store_nodes_touched (the coordinator's picture is read again only
 * there), and store_nodes_get reads those nodes as store_node_list does. */
Test(store, every_change_of_a_node_or_its_devices_is_told) {
  store_t *st = open_db("state.db");
  int64_t t[8];
  int all;
  const int64_t a = add_node(st, "a", 2), b = add_node(st, "b", 2);
  cr_assert(touched(st, t, 8, &all) == 2 && t[0] == a && t[1] == b && !all, "registrations");
  cr_assert_eq(touched(st, t, 8, &all), 0, "the list starts again empty");
  int64_t job = submit(st, "j", 2, 0), ep;
  cr_assert_eq(touched(st, t, 8, &all), 0, "a submit changes no node");
  cr_assert_eq(start_on(st, job, b, 2, &ep), 0);
  cr_assert(touched(st, t, 8, &all) == 1 && t[0] == b, "the devices taken");
  cr_assert_eq(store_job_cancel(st, job, "test", NULL), 0, "%s", err_msg());
  cr_assert(touched(st, t, 8, &all) == 1 && t[0] == b, "the devices freed");
  cr_assert_eq(store_node_drain(st, a, "disk"), 0, "%s", err_msg());
  cr_assert(touched(st, t, 8, &all) == 1 && t[0] == a, "drained");
  cr_assert_eq(store_node_drain(st, a, "disk"), 0, "%s", err_msg());
  cr_assert_eq(touched(st, t, 8, &all), 0, "the same drain again changes nothing");
  int64_t *jobs;
  int nj;
  cr_assert_eq(store_node_mark_dead(st, a, 1, 0, &jobs, &nj), 0, "%s", err_msg());
  store_array_free(jobs);
  cr_assert(touched(st, t, 8, &all) == 1 && t[0] == a, "dead");
  /* read again, they are what the whole list says */
  store_node_t *got, *list;
  int ng, nl;
  const int64_t ids[3] = {b, a, 999};
  cr_assert_eq(store_nodes_get(st, ids, 3, &got, &ng), 0, "%s", err_msg());
  cr_assert_eq(store_node_list(st, &list, &nl), 0, "%s", err_msg());
  cr_assert(ng == 2 && nl == 2, "%d nodes read, %d listed (999 does not exist)", ng, nl);
  for (int i = 0; i < 2; i++) {
    cr_assert(got[i].id == list[i].id && got[i].state == list[i].state &&
              !strcmp(got[i].drain_reason, list[i].drain_reason) &&
              got[i].n_devices == list[i].n_devices, "node %lld differs", (long long)list[i].id);
    for (int k = 0; k < got[i].n_devices; k++)
      cr_assert(got[i].devices[k].index == list[i].devices[k].index &&
                got[i].devices[k].job_id == list[i].devices[k].job_id);
  }
  cr_assert(got[0].id == a && got[0].state == STORE_NODE_DEAD, "by id: a first, dead");
  cr_assert(got[1].id == b && got[1].state == STORE_NODE_ALIVE);
  store_nodes_free(got, ng);
  store_nodes_free(list, nl);
  store_close(st);
}

/* Pending reasons of many jobs in one transaction: each written (with its
 * event) only where it changed, and never on a job that is no longer pending. */
Test(store, pending_reasons_are_written_together_where_they_changed) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 1);
  int64_t a = submit(st, "a", 1, 0), b = submit(st, "b", 1, 0), ep;
  cr_assert_eq(start_on(st, b, node, 1, &ep), 0);
  const int64_t ids[3] = {a, b, a};
  const char *why[3] = {"first", "not pending", "second"};
  cr_assert_eq(store_jobs_set_pending_reasons(st, ids, why, 3), 0, "%s", err_msg());
  store_job_t j = get_job(st, a);
  cr_assert_str_eq(j.reason, "second");
  store_job_free(&j);
  j = get_job(st, b);
  cr_assert(strcmp(j.reason, "not pending"), "a running job's reason was overwritten");
  store_job_free(&j);
  cr_assert_eq(store_jobs_set_pending_reasons(st, &a, &why[2], 1), 0);
  store_event_t *e;
  int n, pend = 0;
  cr_assert_eq(store_event_list(st, a, 0, 0, &e, &n), 0);
  for (int i = 0; i < n; i++) pend += !strcmp(e[i].kind, "job.pending");
  store_array_free(e);
  cr_assert_eq(pend, 2, "two changes, two events (the repeat wrote none)");
  store_close(st);
}

/* A backup taken while another connection holds a write transaction open
 * (a coordinator mid-change) is the database as last committed, whole and
 * checked; it never replaces a file, and a file of another program is not
 * backed up. */
Test(store, a_backup_is_the_last_committed_state_and_never_replaces_a_file) {
  store_t *st = open_db("state.db");
  int64_t node = add_node(st, "n0", 2);
  int64_t job = submit(st, "backed-up", 2, 0);
  sqlite3 *w = raw_open("state.db");
  cr_assert_eq(sqlite3_exec(w, "BEGIN IMMEDIATE; UPDATE jobs SET name = 'uncommitted'", NULL, NULL,
                            NULL), SQLITE_OK);
  int version;
  cr_assert_eq(store_backup(tpath("state.db"), tpath("backup.db"), &version), 0, "%s", err_msg());
  cr_assert_eq(version, STORE_SCHEMA_VERSION);
  sqlite3_exec(w, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(w);
  cr_assert_eq(store_backup(tpath("state.db"), tpath("backup.db"), &version), FSDP_EEXIST);
  cr_assert(strstr(err_msg(), "backup.db"), "%s", err_msg());
  store_close(st);
  st = open_db("backup.db");
  cr_assert_eq(store_schema_from(st), STORE_SCHEMA_VERSION);
  store_job_t j = get_job(st, job);
  cr_assert_str_eq(j.name, "backed-up");
  store_job_free(&j);
  store_node_t *nodes;
  int n;
  cr_assert_eq(store_node_list(st, &nodes, &n), 0);
  cr_assert(n == 1 && nodes[0].id == node);
  store_nodes_free(nodes, n);
  store_close(st);
  /* nothing of ours: refused, and no file made */
  sqlite3 *other = raw_open("other.db");
  sqlite3_exec(other, "CREATE TABLE t (x)", NULL, NULL, NULL);
  sqlite3_close(other);
  cr_assert_eq(store_backup(tpath("other.db"), tpath("other-backup.db"), &version), FSDP_EFORMAT);
  cr_assert_neq(access(tpath("other-backup.db"), F_OK), 0);
}

/* The backup's temporary is its own (created O_EXCL): links planted at
 * the names it might take (<out>.tmp.<pid>, and the <out>.tmp-<pid> it
 * took before) are not written through; the file they point at keeps its
 * bytes and the backup lands whole at its name. */
Test(store, a_backup_never_writes_through_a_link_at_its_temporary_name) {
  store_t *st = open_db("state.db");
  submit(st, "backed-up", 1, 0);
  store_close(st);
  char victim[4200], planted[2][4200];
  snprintf(victim, sizeof victim, "%s", tpath("victim.txt"));
  FILE *f = fopen(victim, "w");
  cr_assert_not_null(f);
  fputs("precious", f);
  fclose(f);
  snprintf(planted[0], sizeof planted[0], "%s.tmp.%d", tpath("backup.db"), (int)getpid());
  snprintf(planted[1], sizeof planted[1], "%s.tmp-%d", tpath("backup.db"), (int)getpid());
  for (int i = 0; i < 2; i++) cr_assert_eq(symlink(victim, planted[i]), 0);
  int version;
  cr_assert_eq(store_backup(tpath("state.db"), tpath("backup.db"), &version), 0, "%s", err_msg());
  char got[64] = "";
  f = fopen(victim, "r");
  cr_assert_not_null(f);
  size_t n = fread(got, 1, sizeof got - 1, f);
  fclose(f);
  cr_assert(n == 8 && !memcmp(got, "precious", 8), "the backup was written through a link");
  struct stat sb;
  cr_assert(!lstat(tpath("backup.db"), &sb) && S_ISREG(sb.st_mode) && (sb.st_mode & 077) == 0,
            "the backup is a private regular file");
  for (int i = 0; i < 2; i++)
    cr_assert(!lstat(planted[i], &sb) && S_ISLNK(sb.st_mode), "%s is left alone", planted[i]);
  st = open_db("backup.db");
  cr_assert_eq(store_schema_from(st), STORE_SCHEMA_VERSION);
  store_close(st);
}

/* ---- restoring a backup ---- */

/* FNV-1a of a file's bytes; 0 when it is absent. */
static uint64_t file_hash(const char *name) {
  FILE *f = fopen(tpath(name), "rb");
  if (!f) return 0;
  uint64_t h = 1469598103934665603ull;
  for (int c; (c = fgetc(f)) != EOF;) h = (h ^ (unsigned)c) * 1099511628211ull;
  fclose(f);
  return h;
}

static void copy_file(const char *from, const char *to) {
  FILE *a = fopen(tpath(from), "rb"), *b = fopen(tpath(to), "wb");
  cr_assert(a && b, "copy %s to %s", from, to);
  char buf[8192];
  for (size_t n; (n = fread(buf, 1, sizeof buf, a)) > 0;) cr_assert_eq(fwrite(buf, 1, n, b), n);
  fclose(a), fclose(b);
}

static off_t file_size(const char *name) {
  struct stat sb;
  return stat(tpath(name), &sb) ? -1 : sb.st_size;
}

#define RESTORE_MORE_JOBS 200 /* after the backup: the database grows (its page 1 in the log) */

/* A coordinator (a child) opens the database name, commits jobs jobs and is
 * killed with SIGKILL, leaving its log (name-wal). */
static void killed_writer(const char *name, int jobs) {
  int go[2];
  cr_assert_eq(pipe(go), 0);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    store_t *st;
    if (store_open(tpath(name), NULL, &st)) _exit(2);
    store_job_spec_t js = {.name = "after-the-backup", .spec = "steps = 10\n", .world_size = 2,
                           .mesh = "1x2"};
    for (int i = 0; i < jobs; i++)
      if (store_job_submit(st, &js, NULL)) _exit(3);
    (void)!write(go[1], "x", 1);
    pause(); /* killed */
    _exit(0);
  }
  char b;
  cr_assert_eq(read(go[0], &b, 1), 1, "the child committed its jobs");
  kill(child, SIGKILL);
  int status;
  cr_assert_eq(waitpid(child, &status, 0), child);
  close(go[0]), close(go[1]);
  char wal[64];
  snprintf(wal, sizeof wal, "%s-wal", name);
  cr_assert_gt(file_size(wal), 0, "the killed coordinator left its log");
}

/* state.db with one job and node, its backup backup.db, then a coordinator
 * (a child) that commits RESTORE_MORE_JOBS more and is killed with SIGKILL,
 * leaving state.db-wal. */
static void crashed_after_a_backup(void) {
  store_t *st = open_db("state.db");
  add_node(st, "n0", 2);
  submit(st, "before-the-backup", 2, 0);
  store_close(st);
  int version;
  cr_assert_eq(store_backup(tpath("state.db"), tpath("backup.db"), &version), 0, "%s", err_msg());
  killed_writer("state.db", RESTORE_MORE_JOBS);
}

/* The tester's case: a backup restored after a crash is the backup, row for
 * row, not the backup with the dead coordinator's log replayed over it
 * (which a plain copy over state.db gives), and leaves no log behind; the
 * restored file is private and opens as any. */
Test(store, a_restore_after_a_crash_is_exactly_the_backup) {
  crashed_after_a_backup();
  const uint64_t want = digest("backup.db");

  int version, had_wal;
  cr_assert_eq(chmod(tpath("state.db"), 0644), 0);
  cr_assert_eq(store_restore(tpath("state.db"), tpath("backup.db"), &version, &had_wal, NULL), 0, "%s",
               err_msg());
  cr_assert_eq(version, STORE_SCHEMA_VERSION);
  cr_assert_eq(had_wal, 1);
  cr_assert_leq(file_size("state.db-wal"), 0, "no log left to replay");
  struct stat sb;
  cr_assert_eq(stat(tpath("state.db"), &sb), 0);
  cr_assert_eq(sb.st_mode & 0777, 0600);
  store_t *st = open_db("state.db");
  store_job_t *jobs;
  int n;
  cr_assert_eq(store_job_list(st, 0, 0, 0, &jobs, &n), 0, "%s", err_msg());
  cr_assert_eq(n, 1, "the backup's one job, not %d", n);
  cr_assert_str_eq(jobs[0].name, "before-the-backup");
  store_jobs_free(jobs, n);
  store_close(st);
  cr_assert(digest("state.db") == want, "the restored database holds the backup's rows");
  sqlite3 *db = raw_open("state.db");
  raw_text_eq(db, "PRAGMA integrity_check", "ok");
  sqlite3_close(db);
  /* onto a path with no file: made, private */
  cr_assert_eq(store_restore(tpath("new.db"), tpath("backup.db"), &version, &had_wal, NULL), 0, "%s",
               err_msg());
  cr_assert_eq(had_wal, 0);
  cr_assert_eq(stat(tpath("new.db"), &sb), 0);
  cr_assert_eq(sb.st_mode & 0777, 0600);
  cr_assert(digest("new.db") == want);
}

/* The newest event's id in db (what a follower last saw). */
static int64_t newest_event(store_t *st) {
  store_event_t *ev;
  int n;
  cr_assert_eq(store_event_list(st, 0, STORE_EVENTS_NEWEST, 1, &ev, &n), 0, "%s", err_msg());
  cr_assert_eq(n, 1);
  const int64_t id = ev[0].id;
  free(ev);
  return id;
}

/* The tester's case: a restore gives back the backup's rows, but never an id
 * the replaced database had handed out after the backup (users, scripts,
 * fsdpd's work directories jobs/<id>/<attempt> and fsdpctl events --follow
 * still hold them): jobs, nodes, events and each job's attempts go on above
 * them, and the restore says what the backup lacks (the jobs made after it,
 * their checkpoints, attempts and checkpoints of its jobs, nodes, events).
 * Onto a database it cannot read (here: none), a gap is left, and said. */
Test(store, a_restore_hands_out_no_id_the_replaced_database_had) {
  store_t *st = open_db("state.db");
  const int64_t node = add_node(st, "n0", 2);
  int64_t a = submit(st, "a", 1, 0), ep;
  cr_assert_eq(start_on(st, a, node, 1, &ep), 0);
  cr_assert_eq(ep, 1);
  store_ckpt_t k;
  store_ckpt_shard_t s0 = {0, 0, 100, 5};
  cr_assert_eq(store_ckpt_report(st, a, 1, 10, 1, "/ck/step-00000010", &s0, &k), 0, "%s", err_msg());
  cr_assert_eq(store_ckpt_close(st, a, 10, 1, NULL), 0, "%s", err_msg());
  store_close(st);
  int version, had_wal;
  cr_assert_eq(store_backup(tpath("state.db"), tpath("backup.db"), &version), 0, "%s", err_msg());
  /* after the backup: a's attempt 2 and its checkpoint, a node, three jobs */
  st = open_db("state.db");
  cr_assert_eq(store_attempt_requeue(st, a, 1, "preempted"), 0, "%s", err_msg());
  cr_assert_eq(start_on(st, a, node, 1, &ep), 0);
  cr_assert_eq(ep, 2);
  cr_assert_eq(store_ckpt_report(st, a, 2, 20, 1, "/ck/step-00000020", &s0, &k), 0, "%s", err_msg());
  cr_assert_eq(store_ckpt_close(st, a, 20, 2, NULL), 0, "%s", err_msg());
  cr_assert_eq(add_node(st, "late", 1), 2);
  for (int i = 0; i < 3; i++) cr_assert_eq(submit(st, "lost", 1, 0), 2 + i);
  const int64_t seen = newest_event(st); /* a follower's cursor */
  store_close(st);

  store_restore_info_t info;
  cr_assert_eq(store_restore(tpath("state.db"), tpath("backup.db"), &version, &had_wal, &info), 0,
               "%s", err_msg());
  cr_assert(info.report, "the restore says what was lost");
  cr_expect_eq(info.known, 1);
  cr_expect_eq(info.lost_jobs, 3);
  cr_expect_eq(info.next_job, 5);
  cr_expect_eq(info.lost_nodes, 1);
  cr_expect_eq(info.next_node, 3);
  cr_expect_eq(info.lost_attempts, 1);
  cr_expect_eq(info.lost_checkpoints, 1);
  cr_expect_gt(info.lost_events, 0);
  cr_expect_eq(info.next_event, seen + 1);
  cr_expect(strstr(info.report, "jobs j-2..j-4 (3) were created after this backup"), "%s",
            info.report);
  cr_expect(strstr(info.report, "nodes n-2 were registered after this backup"), "%s", info.report);
  cr_expect(strstr(info.report, "job j-1: attempt 2 ran after this backup"), "%s", info.report);
  cr_expect(strstr(info.report, "j-1 step 20: /ck/step-00000020"), "%s", info.report);
  free(info.report);

  st = open_db("state.db");
  store_job_t *jobs;
  int n;
  cr_assert_eq(store_job_list(st, 0, 0, 0, &jobs, &n), 0, "%s", err_msg());
  cr_assert_eq(n, 1, "the backup's one job, not %d", n);
  store_jobs_free(jobs, n);
  cr_assert_eq(submit(st, "next", 1, 0), 5, "job ids go on above j-4");
  cr_assert_eq(add_node(st, "newer", 1), 3, "node ids go on above n-2");
  store_event_t *ev;
  cr_assert_eq(store_event_list(st, 0, seen, 0, &ev, &n), 0, "%s", err_msg());
  cr_assert_geq(n, 3, "the follower reads on: the restore's event, the submit, the node");
  cr_assert_str_eq(ev[0].kind, "store.restored");
  cr_assert_eq(ev[0].id, seen + 1);
  free(ev);
  /* a's next attempt comes after the one the backup missed */
  cr_assert_eq(store_attempt_requeue(st, a, 1, "restored"), 0, "%s", err_msg());
  cr_assert_eq(start_on(st, a, node, 1, &ep), 0);
  cr_assert_eq(ep, 3, "attempt %lld: jobs/j-1/2 holds the attempt the backup missed",
               (long long)ep);
  store_close(st);

  /* onto a path that holds nothing to read: a gap, said */
  cr_assert_eq(store_restore(tpath("fresh.db"), tpath("backup.db"), &version, &had_wal, &info), 0,
               "%s", err_msg());
  cr_expect_eq(info.known, 0);
  cr_expect_eq(info.next_job, 2 + STORE_RESTORE_GAP);
  cr_assert(info.report && strstr(info.report, "A gap was left"), "%s", info.report);
  free(info.report);
  st = open_db("fresh.db");
  cr_assert_eq(submit(st, "next", 1, 0), 2 + STORE_RESTORE_GAP);
  cr_assert_eq(store_attempt_requeue(st, a, 1, "restored"), 0, "%s", err_msg());
  cr_assert_eq(start_on(st, a, node, 1, &ep), 0);
  cr_assert_eq(ep, 2 + STORE_RESTORE_EPOCH_GAP);
  store_close(st);
}

/* A restore is refused while a store (a coordinator) holds the database,
 * and for a backup that is not one of ours, of a newer schema, damaged or
 * empty, and onto another program's database: each leaves both files
 * byte for byte as they were. */
Test(store, a_restore_refused_leaves_both_files_as_they_were) {
  store_t *st = open_db("state.db");
  submit(st, "kept", 2, 0);
  int version, had_wal;
  cr_assert_eq(store_backup(tpath("state.db"), tpath("backup.db"), &version), 0, "%s", err_msg());
  submit(st, "after", 2, 0);
  const uint64_t live = digest("state.db");
  cr_assert_eq(store_restore(tpath("state.db"), tpath("backup.db"), &version, &had_wal, NULL),
               FSDP_ESTATE, "while the store is open");
  cr_expect(strstr(err_msg(), "in use by another coordinator"), "%s", err_msg());
  cr_assert(digest("state.db") == live);
  store_close(st);

  sqlite3 *db = raw_open("other.db");
  cr_assert_eq(sqlite3_exec(db, "CREATE TABLE t (x); INSERT INTO t VALUES (1)", NULL, NULL, NULL),
               SQLITE_OK);
  sqlite3_close(db);
  copy_file("backup.db", "newer.db");
  db = raw_open("newer.db");
  cr_assert_eq(sqlite3_exec(db, "PRAGMA user_version = 1000", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  FILE *f = fopen(tpath("junk.db"), "wb");
  cr_assert_not_null(f);
  for (int i = 0; i < 8192; i++) fputc(i * 7 & 0xff, f);
  fclose(f);
  f = fopen(tpath("empty.db"), "wb");
  fclose(f);
  struct {
    const char *db, *backup;
    int code;
    const char *says;
  } no[] = {
      {"state.db", "other.db", FSDP_EFORMAT, "another program"},
      {"state.db", "newer.db", FSDP_EFORMAT, "newer"},
      {"state.db", "junk.db", FSDP_EFORMAT, "not a SQLite database"},
      {"state.db", "empty.db", FSDP_ENOENT, "no schema"},
      {"state.db", "state.db", FSDP_EINVAL, "one file"},
      {"other.db", "backup.db", FSDP_EFORMAT, "another program"},
      {"junk.db", "backup.db", FSDP_EFORMAT, "move it"},
  };
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
    const uint64_t d = file_hash(no[i].db), b = file_hash(no[i].backup);
    struct stat was;
    cr_assert_eq(chmod(tpath(no[i].db), 0640), 0);
    cr_assert_eq(stat(tpath(no[i].db), &was), 0);
    cr_assert_eq(store_restore(tpath(no[i].db), tpath(no[i].backup), &version, &had_wal, NULL),
                 no[i].code, "%s onto %s: %s", no[i].backup, no[i].db, err_msg());
    cr_expect(strstr(err_msg(), no[i].says), "%s onto %s: %s", no[i].backup, no[i].db, err_msg());
    cr_assert(file_hash(no[i].db) == d && file_hash(no[i].backup) == b,
              "%s onto %s changed a file", no[i].backup, no[i].db);
    struct stat now;
    cr_assert_eq(stat(tpath(no[i].db), &now), 0);
    cr_assert_eq(now.st_mode, was.st_mode, "%s onto %s: its mode changed", no[i].backup, no[i].db);
  }
  cr_assert(digest("state.db") == live);
}

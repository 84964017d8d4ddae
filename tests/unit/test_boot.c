/* Tests of a rank's bootstrap (daemon/comm/boot.c): what it reads from the
 * launcher's environment, the errors that name the variable at fault, the
 * groups of a mesh it connects (forked ranks on 127.0.0.1), and a world made
 * from an id rank 0 draws and the ring carries (NCCL's way, with a stand-in
 * backend: a second ring whose create checks the id it was handed). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/comm/boot.h"
#include "daemon/comm/ring.h"
#include "daemon/common/err.h"
#include "tests/unit/testutil.h"

static void env_clear(void) {
  unsetenv("FSDP_WORLD_SIZE");
  unsetenv("FSDP_RANK");
  unsetenv("FSDP_ADDRS");
  unsetenv("FSDP_LISTEN_FD");
  unsetenv("FSDP_JOB_ID");
  unsetenv("FSDP_ATTEMPT");
  unsetenv("FSDP_RING_SECRET");
}

Test(boot, no_launcher_is_a_one_rank_job) {
  env_clear();
  comm_boot_t b;
  cr_assert_eq(comm_boot_from_env(&b), 0, "%s", err_msg());
  cr_assert_eq(b.world, 1);
  cr_assert_eq(b.rank, 0);
  cr_assert_null(b.addrs);
  comm_groups_t g;
  cr_assert_eq(comm_boot_connect(&b, 1, 1, &g), 0, "%s", err_msg());
  cr_assert(!g.world && !g.shard && !g.replica, "one rank has nothing to connect");
  comm_boot_free(&b);
}

/* Each bad environment is refused naming the variable (and nothing leaks:
 * the sanitizer build checks). */
Test(boot, a_bad_environment_names_the_variable) {
  static const struct {
    const char *world, *rank, *addrs, *fd, *names;
  } cases[] = {
      {"0", "0", NULL, NULL, "FSDP_WORLD_SIZE"},
      {"two", "0", NULL, NULL, "FSDP_WORLD_SIZE"},
      {"2", NULL, "a:1,b:2", "3", "FSDP_RANK"},
      {"2", "2", "a:1,b:2", "3", "FSDP_RANK"},
      {"2", "1", NULL, "3", "FSDP_ADDRS"},
      {"2", "1", "a:1,b:2", NULL, "FSDP_LISTEN_FD"},
      {"3", "1", "a:1,b:2", "3", "FSDP_ADDRS: 2 addresses for a world of 3"},
      {"2", "1", "a:1,b:2,c:3", "3", "FSDP_ADDRS: 3 addresses for a world of 2"},
      {"2", "1", "a:1,,b:2", "3", "FSDP_ADDRS: address 1 is empty"},
      {"2", "1", "a:1,", "3", "FSDP_ADDRS: address 1 is empty"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    env_clear();
    setenv("FSDP_WORLD_SIZE", cases[i].world, 1);
    if (cases[i].rank) setenv("FSDP_RANK", cases[i].rank, 1);
    if (cases[i].addrs) setenv("FSDP_ADDRS", cases[i].addrs, 1);
    if (cases[i].fd) setenv("FSDP_LISTEN_FD", cases[i].fd, 1);
    comm_boot_t b;
    cr_assert_eq(comm_boot_from_env(&b), FSDP_EINVAL, "case %zu was accepted", i);
    cr_assert(strstr(err_msg(), cases[i].names), "case %zu: %s", i, err_msg());
    comm_boot_free(&b);
  }
  env_clear();
}

Test(boot, the_launcher_environment_is_read_whole) {
  env_clear();
  setenv("FSDP_WORLD_SIZE", "3", 1);
  setenv("FSDP_RANK", "2", 1);
  setenv("FSDP_ADDRS", "127.0.0.1:5001,[::1]:5002,host-c:5003", 1);
  setenv("FSDP_LISTEN_FD", "7", 1);
  comm_boot_t b;
  cr_assert_eq(comm_boot_from_env(&b), 0, "%s", err_msg());
  cr_assert_eq(b.world, 3);
  cr_assert_eq(b.rank, 2);
  cr_assert_str_eq(b.addrs[0], "127.0.0.1:5001");
  cr_assert_str_eq(b.addrs[1], "[::1]:5002");
  cr_assert_str_eq(b.addrs[2], "host-c:5003");
  cr_assert_eq(b.listen_fd, 7);
  cr_assert_str_eq(b.job, "", "no FSDP_JOB_ID: no job");
  cr_assert_eq(b.attempt, 0);
  b.listen_fd = -1; /* not ours to close */
  comm_boot_free(&b);
  /* fsdpd's: whose run the ring's hello says it is */
  setenv("FSDP_JOB_ID", "job-42_x", 1);
  setenv("FSDP_ATTEMPT", "3", 1);
  cr_assert_eq(comm_boot_from_env(&b), 0, "%s", err_msg());
  cr_assert_str_eq(b.job, "job-42_x");
  cr_assert_eq(b.attempt, 3);
  cr_assert(!b.has_secret, "no FSDP_RING_SECRET: no secret");
  b.listen_fd = -1;
  comm_boot_free(&b);
  /* the attempt's ring secret, byte by byte (either case of hex digits) */
  setenv("FSDP_RING_SECRET", "00ff10A0b0c0d0e0f00102030405060708090a0b0c0d0e0f10111213141516FE", 1);
  cr_assert_eq(comm_boot_from_env(&b), 0, "%s", err_msg());
  static const uint8_t want[COMM_RING_SECRET_BYTES] = {
      0x00, 0xff, 0x10, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
      0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0xfe};
  cr_assert(b.has_secret);
  cr_assert_arr_eq(b.secret, want, sizeof want);
  cr_assert_null(getenv("FSDP_RING_SECRET"), "read, it leaves the environment");
  b.listen_fd = -1;
  comm_boot_free(&b);
  cr_assert(!b.has_secret, "freed: the secret is wiped");
  env_clear();
}

/* A ring secret that is not 64 hex digits is refused naming the variable
 * (and never taken in part). */
Test(boot, a_bad_ring_secret_names_the_variable) {
  static const char *const bad[] = {
      "", "00", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde",
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0",
      "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeg",
      " 123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
      "0x23456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    env_clear();
    setenv("FSDP_WORLD_SIZE", "2", 1);
    setenv("FSDP_RANK", "0", 1);
    setenv("FSDP_ADDRS", "a:1,b:2", 1);
    setenv("FSDP_LISTEN_FD", "3", 1);
    setenv("FSDP_RING_SECRET", bad[i], 1);
    comm_boot_t b;
    cr_assert_eq(comm_boot_from_env(&b), FSDP_EINVAL, "case %zu (\"%s\") was accepted", i, bad[i]);
    cr_assert(strstr(err_msg(), "FSDP_RING_SECRET") && strstr(err_msg(), "64 hex digits"),
              "case %zu: %s", i, err_msg());
    cr_assert(!b.has_secret, "case %zu", i);
    comm_boot_free(&b);
  }
  env_clear();
}

/* A job id the hello cannot carry, or an attempt that is not a number, is
 * refused naming the variable. */
Test(boot, a_bad_job_id_or_attempt_names_the_variable) {
  char longid[COMM_RING_JOB_MAX + 2];
  memset(longid, 'j', sizeof longid - 1);
  longid[sizeof longid - 1] = 0;
  static const struct {
    const char *job, *attempt;
  } cases[] = {{"", NULL}, {"a b", NULL}, {"a,b", NULL}, {NULL, "x"}, {NULL, "-1"}, {"j", ""}};
  for (size_t i = 0; i <= sizeof cases / sizeof *cases; i++) {
    env_clear();
    setenv("FSDP_WORLD_SIZE", "2", 1);
    setenv("FSDP_RANK", "0", 1);
    setenv("FSDP_ADDRS", "a:1,b:2", 1);
    setenv("FSDP_LISTEN_FD", "3", 1);
    const char *job = i < sizeof cases / sizeof *cases ? cases[i].job : longid;
    const char *attempt = i < sizeof cases / sizeof *cases ? cases[i].attempt : NULL;
    if (job) setenv("FSDP_JOB_ID", job, 1);
    if (attempt) setenv("FSDP_ATTEMPT", attempt, 1);
    comm_boot_t b;
    cr_assert_eq(comm_boot_from_env(&b), FSDP_EINVAL, "case %zu was accepted", i);
    cr_assert(strstr(err_msg(), attempt ? "FSDP_ATTEMPT" : "FSDP_JOB_ID"), "case %zu: %s", i,
              err_msg());
    comm_boot_free(&b);
  }
  env_clear();
}

/* Four ranks connect a 2x2 mesh: each rank's shard group holds the ranks of
 * its replica, in shard order, and its replica group the ranks holding the
 * same shard; an all-reduce on each group sums exactly its members. */
/* The stand-in for an id-made backend: rank 0 draws ID_BYTES of noise (or
 * fails to, when ids_fail), and create makes a ring world on a second set of
 * addresses after recording the id it was handed in the shared page, for
 * the parent to compare across ranks. */
#define ID_BYTES 128
static struct {
  char addrs[4][32];
  int fds[4];
  int fail;
  int replicas;  /* the mesh run: R x (4 / R) ranks (0: 2 x 2) */
  uint8_t *seen; /* shared: ID_BYTES per rank, then rank 0's drawn id */
} ids_env;

static int ids_make(uint8_t *id) {
  if (ids_env.fail) return err_set(FSDP_EIO, "the stand-in could not draw an id");
  srand((unsigned)getpid());
  for (int i = 0; i < ID_BYTES; i++) id[i] = (uint8_t)rand();
  memcpy(ids_env.seen + 4 * ID_BYTES, id, ID_BYTES);
  return FSDP_OK;
}

static int ids_create(void *arg, int rank, int world, const uint8_t *id, const char *name,
                      comm_t **out) {
  (void)arg;
  memcpy(ids_env.seen + rank * ID_BYTES, id, ID_BYTES);
  const char *a[4] = {ids_env.addrs[0], ids_env.addrs[1], ids_env.addrs[2], ids_env.addrs[3]};
  comm_ring_opts_t o = {.rank = rank, .size = world, .addrs = a, .name = name,
                        .listen_fd = ids_env.fds[rank]};
  ids_env.fds[rank] = -1;
  return comm_ring_create(&o, out);
}

static const comm_boot_ids_t ids_backend = {ID_BYTES, ids_make, ids_create, NULL};

#define MESH_SECRET "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void mesh_rank(char addrs[4][32], int fds[4], int rank, int by_id) {
  for (int r = 0; r < 4; r++) {
    if (r != rank) close(fds[r]);
    if (by_id && r != rank) close(ids_env.fds[r]);
  }
  const char *a[4] = {addrs[0], addrs[1], addrs[2], addrs[3]};
  comm_boot_t b;
  comm_groups_t g;
  if (comm_boot_from_addrs(&b, rank, 4, a)) _exit(2);
  snprintf(b.job, sizeof b.job, "mesh-job"); /* as fsdpd's FSDP_JOB_ID, FSDP_ATTEMPT */
  b.attempt = 2;
  if (comm_boot_set_secret(&b, MESH_SECRET, "test")) _exit(2); /* and FSDP_RING_SECRET */
  b.listen_fd = fds[rank];
  if (by_id) b.ids = &ids_backend;
  const int R = ids_env.replicas ? ids_env.replicas : 2, S = 4 / R;
  if (comm_boot_connect(&b, R, S, &g)) {
    if (ids_env.fail && rank && strstr(err_msg(), "rank 0 could not make the world's id")) _exit(4);
    if (ids_env.fail && !rank && strstr(err_msg(), "could not draw an id")) _exit(4);
    fprintf(stderr, "rank %d: %s\n", rank, err_msg());
    _exit(3);
  }
  const int shard = rank % S, replica = rank / S;
  /* a group of every rank is the world itself, not a second communicator;
   * a group of one rank is none */
  int ok = comm_size(g.world) == 4 && comm_rank(g.world) == rank &&
           (S == 1 ? !g.shard : R == 1 ? g.shard == g.world : g.shard != g.world) &&
           (R == 1 ? !g.replica : S == 1 ? g.replica == g.world : g.replica != g.world);
  ok = ok && (!g.shard || (comm_size(g.shard) == S && comm_rank(g.shard) == shard)) &&
       (!g.replica || (comm_size(g.replica) == R && comm_rank(g.replica) == replica));
  ok = ok && (R == 1 || S == 1 ||
              (!strcmp(comm_name(g.shard), "shard") && !strcmp(comm_name(g.replica), "replica")));
  /* the ring's groups are of the world's run: their hellos say so, and
   * prove the world's secret */
  for (int i = 0; ok && !by_id && i < 2; i++) {
    comm_t *grp = i ? g.replica : g.shard;
    if (!grp) continue;
    comm_ring_opts_t o = {0};
    comm_ring_run(grp, &o);
    ok = !strcmp(o.job, "mesh-job") && o.attempt == 2 && o.secret &&
         !memcmp(o.secret, b.secret, COMM_RING_SECRET_BYTES) && o.secret[0] == 0x01 &&
         o.secret[31] == 0xef;
  }
  float s = (float)(1 << rank), r = s;
  ok = ok && (!g.shard || !comm_all_reduce(g.shard, &s, &s, 1, COMM_F32, COMM_SUM)) &&
       (!g.replica || !comm_all_reduce(g.replica, &r, &r, 1, COMM_F32, COMM_SUM));
  /* shard group {replica * S + j}; replica group {i * S + shard} */
  float want_s = 0, want_r = 0;
  for (int j = 0; j < S; j++) want_s += (float)(1 << (replica * S + j));
  for (int i = 0; i < R; i++) want_r += (float)(1 << (i * S + shard));
  ok = ok && s == want_s && r == want_r;
  if (!ok) fprintf(stderr, "rank %d: groups wrong (shard sum %g, replica sum %g)\n", rank, s, r);
  comm_groups_destroy(&g);
  comm_boot_free(&b);
  _exit(ok ? 0 : 1);
}

/* Runs the 2x2 mesh in four forked ranks; each must exit with want. */
static void mesh_run(int by_id, int want) {
  char addrs[4][32];
  int fds[4];
  for (int r = 0; r < 4; r++) {
    fds[r] = tu_listen_loopback(addrs[r], sizeof addrs[r]);
    if (by_id) ids_env.fds[r] = tu_listen_loopback(ids_env.addrs[r], sizeof ids_env.addrs[r]);
  }
  ids_env.seen = mmap(NULL, 5 * ID_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(ids_env.seen, MAP_FAILED);
  pid_t pid[4];
  for (int r = 0; r < 4; r++) {
    pid[r] = fork();
    cr_assert_neq(pid[r], -1);
    if (pid[r] == 0) mesh_rank(addrs, fds, r, by_id);
  }
  for (int r = 0; r < 4; r++) {
    close(fds[r]);
    if (by_id) close(ids_env.fds[r]);
  }
  for (int r = 0; r < 4; r++) {
    int status;
    cr_assert_eq(waitpid(pid[r], &status, 0), pid[r]);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == want, "rank %d (%d)", r, status);
  }
}

Test(boot, a_mesh_connects_its_groups, .timeout = 30) { mesh_run(0, 0); }

/* FULL_SHARD's 1 x 4 and NO_SHARD's 4 x 1: the group of every rank is the
 * world, not a split of it (one communicator: NCCL's buffers once). */
Test(boot, a_group_of_every_rank_is_the_world_itself, .timeout = 30) {
  ids_env.replicas = 1;
  mesh_run(0, 0);
  ids_env.replicas = 4;
  mesh_run(0, 0);
  mesh_run(1, 0);
}

/* Every rank is handed the id rank 0 drew, and the world made from it (not
 * the ring that carried it) splits into the mesh's groups. */
Test(boot, a_world_made_from_rank_0s_id_connects_its_groups, .timeout = 30) {
  mesh_run(1, 0);
  static const uint8_t zero[ID_BYTES];
  const uint8_t *drawn = ids_env.seen + 4 * ID_BYTES;
  cr_assert_neq(memcmp(drawn, zero, ID_BYTES), 0, "rank 0 drew no id");
  for (int r = 0; r < 4; r++)
    cr_assert_eq(memcmp(ids_env.seen + r * ID_BYTES, drawn, ID_BYTES), 0,
                 "rank %d was handed another id than rank 0 drew", r);
}

/* Rank 0 cannot draw the id: it fails with its own error and every other
 * rank learns it from the ring at once (no wait for a world never made). */
Test(boot, rank_0_failing_to_draw_the_id_fails_every_rank_by_name, .timeout = 30) {
  ids_env.fail = 1;
  mesh_run(1, 4);
}

Test(boot, a_mesh_that_is_not_the_world_is_refused) {
  const char *a[4] = {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"};
  comm_boot_t b;
  comm_groups_t g;
  cr_assert_eq(comm_boot_from_addrs(&b, 0, 4, a), 0);
  cr_assert_eq(comm_boot_connect(&b, 3, 2, &g), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "3 x 2") && strstr(err_msg(), "4 ranks"), "%s", err_msg());
  comm_boot_free(&b);
}

/* Tests of a rank's bootstrap (daemon/comm/boot.c): what it reads from the
 * launcher's environment, the errors that name the variable at fault, and the
 * groups of a mesh it connects (forked ranks on 127.0.0.1). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/comm/boot.h"
#include "daemon/common/err.h"
#include "tests/unit/testutil.h"

static void env_clear(void) {
  unsetenv("FSDP_WORLD_SIZE");
  unsetenv("FSDP_RANK");
  unsetenv("FSDP_ADDRS");
  unsetenv("FSDP_LISTEN_FD");
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
  b.listen_fd = -1; /* not ours to close */
  comm_boot_free(&b);
  env_clear();
}

/* Four ranks connect a 2x2 mesh: each rank's shard group holds the ranks of
 * its replica, in shard order, and its replica group the ranks holding the
 * same shard; an all-reduce on each group sums exactly its members. */
static void mesh_rank(char addrs[4][32], int fds[4], int rank) {
  for (int r = 0; r < 4; r++)
    if (r != rank) close(fds[r]);
  const char *a[4] = {addrs[0], addrs[1], addrs[2], addrs[3]};
  comm_boot_t b;
  comm_groups_t g;
  if (comm_boot_from_addrs(&b, rank, 4, a)) _exit(2);
  b.listen_fd = fds[rank];
  if (comm_boot_connect(&b, 2, 2, &g)) {
    fprintf(stderr, "rank %d: %s\n", rank, err_msg());
    _exit(3);
  }
  const int shard = rank % 2, replica = rank / 2;
  int ok = comm_size(g.world) == 4 && comm_rank(g.world) == rank && comm_size(g.shard) == 2 &&
           comm_rank(g.shard) == shard && comm_size(g.replica) == 2 &&
           comm_rank(g.replica) == replica && !strcmp(comm_name(g.shard), "shard") &&
           !strcmp(comm_name(g.replica), "replica");
  float s = (float)(1 << rank), r = s;
  ok = ok && !comm_all_reduce(g.shard, &s, &s, 1, COMM_F32, COMM_SUM) &&
       !comm_all_reduce(g.replica, &r, &r, 1, COMM_F32, COMM_SUM);
  /* shard group {2i, 2i+1}; replica group {j, j+2} */
  ok = ok && s == (float)(3 << (2 * replica)) && r == (float)(5 << shard);
  if (!ok) fprintf(stderr, "rank %d: groups wrong (shard sum %g, replica sum %g)\n", rank, s, r);
  comm_groups_destroy(&g);
  comm_boot_free(&b);
  _exit(ok ? 0 : 1);
}

Test(boot, a_mesh_connects_its_groups, .timeout = 30) {
  char addrs[4][32];
  int fds[4];
  for (int r = 0; r < 4; r++) fds[r] = tu_listen_loopback(addrs[r], sizeof addrs[r]);
  pid_t pid[4];
  for (int r = 0; r < 4; r++) {
    pid[r] = fork();
    cr_assert_neq(pid[r], -1);
    if (pid[r] == 0) mesh_rank(addrs, fds, r);
  }
  for (int r = 0; r < 4; r++) close(fds[r]);
  for (int r = 0; r < 4; r++) {
    int status;
    cr_assert_eq(waitpid(pid[r], &status, 0), pid[r]);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d (%d)", r, status);
  }
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

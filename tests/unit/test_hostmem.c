/* test_hostmem: the memory a control group gives a process
 * (daemon/common/hostmem.c), on control group trees written here as the
 * kernel shows them: v2's memory.max/current, v1's limit_in_bytes, the
 * tightest level winning, page cache that can be dropped counted as room. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/hostmem.h"
#include "tests/unit/testutil.h"

#define MIB (1ull << 20)

/* root/dir/name holding text (dir made as needed). */
static void put(const char *root, const char *dir, const char *name, const char *text) {
  char path[8300], d[4096];
  snprintf(d, sizeof d, "%s%s", root, dir);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", d);
  cr_assert_eq(system(cmd), 0);
  snprintf(path, sizeof path, "%s/%s", d, name);
  tu_write_file(path, text, strlen(text));
}

static char *num(uint64_t v, char *buf) {
  sprintf(buf, "%llu\n", (unsigned long long)v);
  return buf;
}

/* cgroup v2: the pod's group limits 1 GiB and holds 600 MiB, 100 MiB of it
 * cache it can drop; its parent limits 512 MiB and holds 100 MiB: the
 * tightest limit is the parent's, and so is the least room. */
Test(hostmem, the_tightest_v2_group_above_the_process_wins) {
  char *root = tu_path("cg"), b[32];
  put(root, "/kubepods/pod1", "memory.max", num(1024 * MIB, b));
  put(root, "/kubepods/pod1", "memory.current", num(600 * MIB, b));
  put(root, "/kubepods/pod1", "memory.stat", "anon 500\ninactive_file 104857600\nactive_file 3\n");
  put(root, "/kubepods", "memory.max", num(512 * MIB, b));
  put(root, "/kubepods", "memory.current", num(100 * MIB, b));
  uint64_t limit = 0, room = 0;
  cr_assert_eq(hostmem_cgroup("0::/kubepods/pod1\n", root, &limit, &room), 1);
  cr_expect_eq(limit, 512 * MIB);
  cr_expect_eq(room, 412 * MIB, "room %llu MiB", (unsigned long long)(room / MIB));
  /* the pod's own room is the tighter once the parent has more */
  put(root, "/kubepods", "memory.max", "max\n");
  cr_assert_eq(hostmem_cgroup("0::/kubepods/pod1\n", root, &limit, &room), 1);
  cr_expect_eq(limit, 1024 * MIB);
  cr_expect_eq(room, 524 * MIB, "room %llu MiB", (unsigned long long)(room / MIB));
  /* a group past its limit (cache counted in) has no room, never a wrap */
  put(root, "/kubepods/pod1", "memory.current", num(2048 * MIB, b));
  cr_assert_eq(hostmem_cgroup("0::/kubepods/pod1\n", root, &limit, &room), 1);
  cr_expect_eq(room, 0);
  free(root);
}

/* No level sets a limit ("max" everywhere, the root having none): none. */
Test(hostmem, no_limit_is_none) {
  char *root = tu_path("cg");
  put(root, "/user.slice", "memory.max", "max\n");
  uint64_t limit = 7, room = 7;
  cr_expect_eq(hostmem_cgroup("0::/user.slice\n", root, &limit, &room), 0);
  cr_expect_eq(hostmem_cgroup("0::/not/there\n", root, &limit, &room), 0);
  cr_expect_eq(hostmem_cgroup("garbage", root, &limit, &room), 0);
  cr_expect_eq(hostmem_cgroup("", root, &limit, &room), 0);
  free(root);
}

/* cgroup v1 (and the hybrid layout, v2's line beside it): the memory
 * controller's group under root/memory, v1's "no limit" (2^63 less a page)
 * none, its total_inactive_file dropped from the usage. */
Test(hostmem, a_v1_memory_group_is_read_under_its_controller) {
  char *root = tu_path("cg"), b[32];
  put(root, "/memory/slurm/job_7", "memory.limit_in_bytes", num(256 * MIB, b));
  put(root, "/memory/slurm/job_7", "memory.usage_in_bytes", num(200 * MIB, b));
  put(root, "/memory/slurm/job_7", "memory.stat", "cache 5\ntotal_inactive_file 52428800\n");
  put(root, "/memory/slurm", "memory.limit_in_bytes", "9223372036854771712\n");
  put(root, "/memory", "memory.limit_in_bytes", "9223372036854771712\n");
  uint64_t limit = 0, room = 0;
  const char *self = "12:pids:/slurm/job_7\n4:memory:/slurm/job_7\n0::/\n";
  cr_assert_eq(hostmem_cgroup(self, root, &limit, &room), 1);
  cr_expect_eq(limit, 256 * MIB);
  cr_expect_eq(room, 106 * MIB, "room %llu MiB", (unsigned long long)(room / MIB));
  /* the order of the lines does not matter */
  cr_assert_eq(hostmem_cgroup("0::/\n4:memory:/slurm/job_7\n", root, &limit, &room), 1);
  cr_expect_eq(limit, 256 * MIB);
  free(root);
}

/* This process: what the plan and fsdpd's inventory read is never more
 * than the machine has. */
Test(hostmem, this_process_sees_at_most_the_machines_memory) {
  const uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  const uint64_t total = hostmem_total(), avail = hostmem_available();
  cr_expect(total > 0 && total <= phys, "total %llu of %llu", (unsigned long long)total,
            (unsigned long long)phys);
  cr_expect(avail > 0 && avail <= total, "available %llu of %llu", (unsigned long long)avail,
            (unsigned long long)total);
}

/* test_inventory: fsdpd's device discovery (daemon/node/inventory.c). CPU devices
 * split the host's memory; GPUs are found through the driver library, here a
 * fake one (fake_libcuda.c) put on the library path of inventory_probe, so the
 * GPU path runs on a machine without a GPU; and without any driver, a GPU
 * spec is a clear error while "auto" falls back to one CPU device. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/node/inventory.h"
#include "tests/unit/testutil.h"

/* MemTotal from /proc/meminfo, in bytes: the host's memory, read apart from
 * the code under test (which asks sysconf). */
static uint64_t host_memory(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  cr_assert_not_null(f);
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) break;
  fclose(f);
  cr_assert_gt(kb, 0);
  return (uint64_t)kb * 1024;
}

static int have_driver(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h) dlclose(h);
  return h != NULL;
}

/* Runs inventory_probe SPEC (its words: the spec, and "host" for the host's
 * share) with the fake driver (gpus of them; -1: no fake
 * driver on the path), env (more VAR=value words, or ""), and returns its
 * output (static). */
static const char *probe_env(const char *spec, int gpus, const char *env) {
  static char out[4096];
  char self[1024] = {0}, cmd[3072];
  cr_assert_gt(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  const char *dir = dirname(self);
  if (gpus >= 0)
    snprintf(cmd, sizeof cmd, "LD_LIBRARY_PATH='%s/fake-cuda' FAKE_CUDA_GPUS=%d %s '%s/inventory_probe' %s",
             dir, gpus, env, dir, spec);
  else
    snprintf(cmd, sizeof cmd, "'%s/inventory_probe' %s", dir, spec);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  pclose(p);
  return out;
}

static const char *probe(const char *spec, int gpus) { return probe_env(spec, gpus, ""); }

Test(inventory, cpu_devices_split_the_host_memory) {
  inventory_t d;
  cr_assert_eq(inventory_find("cpu:3", &d), FSDP_OK, "%s", err_msg());
  cr_assert_eq(d.count, 3);
  for (int i = 0; i < 3; i++) {
    cr_assert_str_eq(d.dev[i].kind, "cpu");
    cr_assert_eq(d.dev[i].index, i);
    cr_assert_eq(d.dev[i].memory, host_memory() / 3);
    cr_assert_eq(d.dev[i].total, d.dev[i].memory);
  }
  cr_assert_str_eq(d.dev[1].name, "CPU device 1 of 3");
  cr_assert_eq(d.host_share, host_memory() / 3, "a device's share of the host is its memory");
}

Test(inventory, bad_specs_name_the_spec_and_the_fix) {
  static const char *bad[] = {"cpu:0", "cpu:", "cpu:x", "cpu:65", "cpu:-1", "gpu", "cpu",
                              "cuda:", "cuda:0,,1", "cuda:a", "cuda:1,1", "cuda:0,"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    inventory_t d;
    cr_assert_eq(inventory_find(bad[i], &d), FSDP_EINVAL, "'%s' was accepted", bad[i]);
    char quoted[64];
    snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
    cr_assert(strstr(err_msg(), quoted), "'%s': %s", bad[i], err_msg());
    cr_assert(strstr(err_msg(), "e.g.") || strstr(err_msg(), "use cpu:N") ||
                  strstr(err_msg(), "named twice"), "'%s': no fix in: %s", bad[i], err_msg());
  }
}

Test(inventory, gpus_come_from_the_driver) {
  cr_assert_str_eq(probe("cuda", 2), "cuda 0 85899345920 85899345920 0 Fake GPU 0\n"
                                     "cuda 1 42949672960 42949672960 0 Fake GPU 1\n");
  cr_assert_str_eq(probe("cuda:1", 2), "cuda 1 42949672960 42949672960 0 Fake GPU 1\n");
  /* a GPU's rank may keep its share of the host's memory apart from it
   * (FSDP_HOST_MEMORY_BYTES: its checkpoint snapshot): the node's devices
   * split it, as CPU devices do */
  char want[256];
  snprintf(want, sizeof want, "cuda 0 85899345920 85899345920 0 Fake GPU 0\n"
           "cuda 1 42949672960 42949672960 0 Fake GPU 1\nhost %llu\n",
           (unsigned long long)(host_memory() / 2));
  cr_assert_str_eq(probe("cuda host", 2), want);
  cr_assert_str_eq(probe("auto", 1), "cuda 0 85899345920 85899345920 0 Fake GPU 0\n");
  const char *o = probe("cuda:0,2", 2);
  cr_assert(strstr(o, "error ERANGE devices: cuda:2: this node has 2 GPUs (ordinals 0-1)"), "%s", o);
  o = probe("cuda", 0);
  cr_assert(strstr(o, "error EUNSUPPORTED") && strstr(o, "no usable GPU") &&
                strstr(o, "--devices cpu:N"), "%s", o);
}

/* A GPU offers what is free with a CUDA context on it (a rank's own takes
 * about as much, and other processes' memory is not the job's): 600 MiB held
 * leaves each fake GPU its total less 600 MiB; where no context can be had
 * (exclusive-process mode, another process on it), its total, with the
 * driver's error kept for fsdpd to say. */
Test(inventory, a_gpu_offers_its_free_memory_with_a_context_on_it) {
  cr_assert_str_eq(probe_env("cuda", 2, "FAKE_CUDA_HELD_MIB=600"),
                   "cuda 0 85270200320 85899345920 0 Fake GPU 0\n"
                   "cuda 1 42320527360 42949672960 0 Fake GPU 1\n");
  cr_assert_str_eq(probe_env("cuda:1", 2, "FAKE_CUDA_HELD_MIB=600 FAKE_CUDA_CTX_ERROR=46"),
                   "cuda 1 42949672960 42949672960 46 Fake GPU 1\n");
}

/* More held than a context takes (4 GiB here) is measured again, a second
 * apart: memory a process gives back meanwhile (ranks of a previous fsdpd
 * going) is offered; memory still held after 5 reads is left out. */
Test(inventory, memory_others_hold_is_measured_again_before_it_is_left_out) {
  double t0 = tu_now_s();
  cr_assert_str_eq(probe_env("cuda:0", 1, "FAKE_CUDA_HELD_MIB=4096 FAKE_CUDA_HELD_CALLS=2"),
                   "cuda 0 85899345920 85899345920 0 Fake GPU 0\n");
  cr_expect_gt(tu_now_s() - t0, 1.9, "given back at the third read, two waits of 1 s");
  cr_assert_str_eq(probe_env("cuda:0", 1, "FAKE_CUDA_HELD_MIB=4096"),
                   "cuda 0 81604378624 85899345920 0 Fake GPU 0\n");
  /* 2 GiB is what a context may take: not measured again */
  cr_assert_str_eq(probe_env("cuda:0", 1, "FAKE_CUDA_HELD_MIB=2048"),
                   "cuda 0 83751862272 85899345920 0 Fake GPU 0\n");
}

Test(inventory, without_a_driver_cuda_is_an_error_and_auto_is_one_cpu_device) {
  if (have_driver()) cr_skip_test("this machine has an NVIDIA driver");
  inventory_t d;
  cr_assert_eq(inventory_find("cuda", &d), FSDP_EUNSUPPORTED);
  cr_assert(strstr(err_msg(), "no NVIDIA driver") && strstr(err_msg(), "--devices cpu:N"), "%s",
            err_msg());
  cr_assert_eq(inventory_find("auto", &d), FSDP_OK, "%s", err_msg());
  cr_assert_eq(d.count, 1);
  cr_assert_str_eq(d.dev[0].kind, "cpu");
  cr_assert_eq(d.dev[0].memory, host_memory());
  const char *o = probe("cuda:0", -1);
  cr_assert(strstr(o, "error EUNSUPPORTED"), "%s", o);
}

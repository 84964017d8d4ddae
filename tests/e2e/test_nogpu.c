/* The programs on a machine without a GPU or CUDA libraries (issue 12's third
 * point): no program links a CUDA library (only the CUDA plugin does, and it
 * is loaded with dlopen for device = cuda); with the CUDA toolkit hidden from
 * the loader, every program starts and a sharded job trains on CPU devices;
 * and a cuda job is refused with an error that says what is missing and how
 * to run instead, never a crash: the plugin absent, a file that is not our
 * plugin, the plugin's libraries absent, and no GPU.
 *
 * The toolkit is hidden in a private mount namespace (unshare -m, as root):
 * an empty directory is bind-mounted over it, so the loader's cache points at
 * files that are gone, as on a machine without them. Where no namespace can
 * be made, the tests that need one skip, saying so. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/unit/testutil.h"

static const char *const programs[] = {"fsdp-train", "fsdp-tokenize", "fsdp-launch",
                                       "fsdp-coordinator", "fsdpd", "fsdpctl"};
#define NPROG (sizeof programs / sizeof programs[0])

static char out[1 << 16];

/* Runs CMD (from the project root) in a mount namespace where every CUDA
 * toolkit under /usr/local is an empty directory, after checking that no
 * CUDA library the loader's cache lists is left (exit 99 if one is); -2
 * when no namespace can be made here. */
static int run_hidden(const char *cmd) {
  char c[8192];
  if (tu_sh("unshare -m true", out, sizeof out) != 0) return -2;
  snprintf(c, sizeof c,
           "cd '%s' && unshare -m sh -c 'mkdir -p /tmp/fsdp-empty-cuda && "
           "for d in /usr/local/cuda /usr/local/cuda-*; do [ -d \"$d\" ] && "
           "{ mount --bind /tmp/fsdp-empty-cuda \"$(readlink -f \"$d\")\" || exit 98; }; done; "
           "for f in $(ldconfig -p | grep -E \"libcublas|libnccl|libcudart|libcuda[.]\" | "
           "sed \"s/.*=> //\"); do [ -e \"$f\" ] && { echo STILL-THERE $f; exit 99; }; done; "
           "%s'", tu_root(), cmd);
  return tu_sh(c, out, sizeof out);
}

static int plugin_built(void) {
  char c[1200], o[256];
  snprintf(c, sizeof c, "test -f '%s/lib/fsdpd/libfsdp-cuda.so'", tu_root());
  return tu_sh(c, o, sizeof o) == 0;
}

Test(nogpu, no_program_links_a_cuda_library) {
  for (size_t i = 0; i < NPROG; i++) {
    char c[1200];
    snprintf(c, sizeof c, "readelf -d '%s/bin/%s' | grep NEEDED", tu_root(), programs[i]);
    cr_assert_eq(tu_sh(c, out, sizeof out), 0, "%s: %s", programs[i], out);
    cr_assert(strstr(out, "libc.so"), "%s: no NEEDED entries read: %s", programs[i], out);
    cr_assert(!strstr(out, "cuda") && !strstr(out, "cublas") && !strstr(out, "nccl") &&
              !strstr(out, "cudnn"), "%s links a CUDA library:\n%s", programs[i], out);
  }
}

Test(nogpu, every_program_starts_and_a_sharded_job_trains_with_cuda_hidden, .timeout = 120 * TU_SLOW) {
  char *data = tu_token_file("tokens.bin", 1 << 15, 7, 256);
  char cmd[4096];
  int n = 0;
  for (size_t i = 0; i < NPROG; i++)
    n += snprintf(cmd + n, sizeof cmd - (size_t)n, "bin/%s --help >/dev/null 2>&1 || "
                  "{ echo START-FAILED %s; exit 1; }; ", programs[i], programs[i]);
  snprintf(cmd + n, sizeof cmd - (size_t)n,
           "bin/fsdp-launch -n 2 -- bin/fsdp-train " TU_TINY_TRAIN " --steps 3 --data %s", data);
  int rc = run_hidden(cmd);
  if (rc == -2) cr_skip_test("no mount namespace here (unshare -m needs root): %s", out);
  cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
  cr_assert(strstr(out, "[rank 1] train: done: 3 steps"), "the job did not train 3 steps:\n%s", out);
  free(data);
}

/* With the toolkit hidden, the plugin itself cannot load: the error names the
 * library the loader missed and the way to run without it. */
Test(nogpu, a_cuda_job_with_cuda_hidden_names_the_missing_library, .timeout = 60 * TU_SLOW) {
  if (!plugin_built()) cr_skip_test("the CUDA plugin is not built here (no nvcc)");
  char *data = tu_token_file("tokens.bin", 1 << 15, 7, 256);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "bin/fsdp-train " TU_TINY_TRAIN " --steps 3 --data %s --device cuda",
           data);
  int rc = run_hidden(cmd);
  if (rc == -2) cr_skip_test("no mount namespace here (unshare -m needs root): %s", out);
  cr_assert(rc > 0 && rc < 98, "exit %d (a crash is -1; 98, 99: CUDA not hidden):\n%s", rc, out);
  cr_assert(strstr(out, "cannot load the CUDA plugin") && strstr(out, "cannot open shared object") &&
            (strstr(out, "libcublasLt") || strstr(out, "libnccl")) && strstr(out, "device = cpu"),
            "%s", out);
  cr_assert(!strstr(out, "step 1/"), "it trained:\n%s", out);
  free(data);
}

/* The plugin loads (its libraries are here) and finds no GPU. */
Test(nogpu, a_cuda_job_without_a_gpu_says_so, .timeout = 60 * TU_SLOW) {
  if (!plugin_built()) cr_skip_test("the CUDA plugin is not built here (no nvcc)");
  char *data = tu_token_file("tokens.bin", 1 << 15, 7, 256);
  char args[1024];
  snprintf(args, sizeof args, TU_TINY_TRAIN " --steps 3 --data %s --device cuda", data);
  int rc = tu_run_bin("fsdp-train", args, out, sizeof out);
  if (strstr(out, "cuda device 0:")) cr_skip_test("this machine has a GPU: %s", out);
  cr_assert(rc > 0, "exit %d (a crash is -1):\n%s", rc, out);
  cr_assert(strstr(out, "device cuda: no GPU") && strstr(out, "device = cpu"), "%s", out);
  free(data);
}

/* FSDP_CUDA_GEMM_ALGO out of its range (0 to 15) is refused by name before
 * anything loads, where the kernels once clamped it without a word. */
Test(nogpu, a_gemm_algorithm_out_of_range_is_refused_by_name, .timeout = 60 * TU_SLOW) {
  char *data = tu_token_file("tokens.bin", 1 << 15, 7, 256);
  char args[1024];
  snprintf(args, sizeof args, TU_TINY_TRAIN " --steps 3 --data %s --device cuda", data);
  static const char *const bad[] = {"16", "-1"};
  for (int i = 0; i < 2; i++) {
    setenv("FSDP_CUDA_GEMM_ALGO", bad[i], 1);
    const int rc = tu_run_bin("fsdp-train", args, out, sizeof out);
    char want[64];
    snprintf(want, sizeof want, "FSDP_CUDA_GEMM_ALGO: %s; give 0", bad[i]);
    cr_expect(rc > 0 && strstr(out, want) && strstr(out, "to 15"), "exit %d:\n%s", rc, out);
  }
  unsetenv("FSDP_CUDA_GEMM_ALGO");
  free(data);
}

/* FSDP_CUDA_PLUGIN names a file that is missing, or a library that is not
 * our plugin (the fake driver test_inventory uses): both are refused by name. */
Test(nogpu, a_plugin_path_that_is_not_the_plugin_is_refused, .timeout = 60 * TU_SLOW) {
  char *data = tu_token_file("tokens.bin", 1 << 15, 7, 256);
  char fake[256];
  snprintf(fake, sizeof fake, "%s/tests/fake-cuda/libcuda.so.1", tu_build());
  const char *files[] = {"/nonexistent/libfsdp-cuda.so", fake};
  const char *want[] = {"cannot load the CUDA plugin", "is not this build's CUDA plugin"};
  for (int i = 0; i < 2; i++) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd '%s' && FSDP_CUDA_PLUGIN=%s bin/fsdp-train " TU_TINY_TRAIN
             " --steps 3 --data %s --device cuda", tu_root(), files[i], data);
    int rc = tu_sh(cmd, out, sizeof out);
    cr_assert(rc > 0, "%s: exit %d:\n%s", files[i], rc, out);
    cr_assert(strstr(out, want[i]) && strstr(out, files[i][0] == '/' ? files[i] : "libcuda.so.1"),
              "%s:\n%s", files[i], out);
  }
  free(data);
}

/* A node whose driver lists GPUs its ranks cannot use (the fake driver lists
 * two; the plugin is missing) does not offer them: fsdpd asks the rank
 * program first (--probe-device cuda, as the ranks' user). With --devices
 * cuda it refuses to start, saying why; with auto it offers a CPU device. */
Test(nogpu, a_node_does_not_offer_gpus_its_ranks_cannot_use, .timeout = 60 * TU_SLOW) {
  char cmd[2048], env[512];
  snprintf(env, sizeof env, "LD_LIBRARY_PATH=%s/tests/fake-cuda "
           "FSDP_CUDA_PLUGIN=/nonexistent/libfsdp-cuda.so", tu_build());
  const char *as = geteuid() == 0 ? "--run-as nobody" : "";
  snprintf(cmd, sizeof cmd, "cd '%s' && %s bin/fsdpd --devices cuda --coordinator 127.0.0.1:1 "
           "--work-dir '%s/node' %s", tu_root(), env, tu_tmpdir(), as);
  int rc = tu_sh(cmd, out, sizeof out);
  cr_expect_eq(rc, 2, "--devices cuda: exit %d:\n%s", rc, out);
  cr_expect(strstr(out, "--devices cuda") && strstr(out, "cannot be used by ranks") &&
            strstr(out, "cannot load the CUDA plugin"), "%s", out);
  /* auto: a CPU device instead; it then runs (no coordinator): stopped after 3 s */
  snprintf(cmd, sizeof cmd, "cd '%s' && %s timeout 3 bin/fsdpd --coordinator 127.0.0.1:1 "
           "--work-dir '%s/node' %s", tu_root(), env, tu_tmpdir(), as);
  tu_sh(cmd, out, sizeof out);
  cr_expect(strstr(out, "--devices auto") && strstr(out, "offering one CPU device instead") &&
            strstr(out, "1 device(s) (auto)"), "%s", out);
}

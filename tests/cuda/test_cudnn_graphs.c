/* test_cudnn_graphs: asks cuDNN whether its engines take the attention
 * graphs kernels/cuda/cudnn.cu builds (FSDP_CUDA_ATTN_CUDNN=1), with no GPU:
 * cuDNN (9.8 on) chooses engines for a GPU described by its device
 * properties' JSON, here an H200's (tests/cuda/cudnn-h200.json: the
 * machine's figures from the device library's KINDS.md and NVIDIA's
 * datasheet, in cuDNN's keys; `--device` on a GPU prints the device's own).
 * Each shape's forward and backward must find an engine whose workspace fits
 * the scratch's room (size.h); shapes cuDNN cannot run must say why, and
 * never crash. cuDNN's runtime-compiled engines check that the driver
 * library loads before they say they are supported: CUDA's stub libcuda
 * (libcuda.so.1 by its name, every call an error) stands in for it, loaded
 * first, as nothing here runs.
 *
 * Run by `make test` where CUDA and cuDNN are installed (it says it skips
 * where cuDNN is not); `--device` builds the plans on GPU 0 (the engines'
 * kernels compiled) and prints the device's JSON. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cudnn.h"
#include "kernels/cuda/size.h"
#include "tests/cuda/check.h"

#ifndef FSDP_CUDA_STUBS
#define FSDP_CUDA_STUBS "/usr/local/cuda/lib64/stubs"
#endif

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  static char buf[8192];
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return buf;
}

/* One shape: forward and backward both planned, each workspace within the
 * room. */
static void plans(const char *what, int B, int T, int C, int NH) {
  static const char *const name[] = {"forward", "backward", "backward, bf16 gradients"};
  for (int bwd = KERN_CUDNN_FWD; bwd <= KERN_CUDNN_BWD16; bwd++) {
    size_t ws = (size_t)-1;
    long engine = -1;
    int out16 = -1;
    char why[512] = "";
    const int ok = kern_cudnn_sdpa_plan(bwd, B, T, C, NH, &ws, &engine, &out16, why, sizeof why);
    check(ok && ws <= KERN_CUDA_SIZE_CUDNN_WS && out16 == (bwd == KERN_CUDNN_BWD16),
          "%s (B=%d T=%d C=%d NH=%d) %s: cuDNN engine %ld, workspace %zu bytes, gradients in "
          "%s%s%s", what, B, T, C, NH, name[bwd], engine, ok ? ws : 0, out16 ? "bf16" : "fp32",
          ok ? "" : ": ", why);
  }
}

/* A shape with no plan says why, naming what is wrong, and the ops decline
 * it (the kernels run it) rather than crash. */
static void refused(const char *what, int bwd, int B, int T, int C, int NH, const char *named) {
  char why[512] = "";
  const int ok = kern_cudnn_sdpa_plan(bwd, B, T, C, NH, NULL, NULL, NULL, why, sizeof why);
  check(!ok && strstr(why, named), "%s (C=%d NH=%d) %s: refused (%s), naming \"%s\"", what, C, NH,
        bwd ? "backward" : "forward", why, named);
}

int main(int argc, char **argv) {
  const int device = argc > 1 && !strcmp(argv[1], "--device");
  char msg[512];
  if (device) {
    if (!kern_cudnn_open(NULL, msg, sizeof msg)) {
      printf("FAIL cuDNN on GPU 0: %s\n", msg);
      return 1;
    }
    static char json[8192];
    if (kern_cudnn_device_json(json, sizeof json)) printf("device JSON: %s\n", json);
  } else {
    void *probe = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!probe) {
      printf("test_cudnn_graphs: skipped: no libcudnn.so.9 here (%s)\n", dlerror());
      return 0;
    }
    dlclose(probe);
    if (!dlopen(FSDP_CUDA_STUBS "/libcuda.so", RTLD_NOW | RTLD_GLOBAL)) {
      printf("test_cudnn_graphs: skipped: no CUDA stub driver library (%s)\n", dlerror());
      return 0;
    }
    const char *json = read_file("tests/cuda/cudnn-h200.json");
    if (!check(json != NULL, "read tests/cuda/cudnn-h200.json (run from the repository)"))
      return 1;
    if (!check(kern_cudnn_open_deviceless(json, msg, sizeof msg), "cuDNN with an H200's "
               "properties and no device%s%s", msg[0] ? ": " : "", msg))
      return 1;
    /* no device: nothing runs, the ops decline */
    check(!kern_cudnn_sdpa_fwd(NULL, NULL, NULL, NULL, 2, 64, 64, 4),
          "forward declines with no device");
  }
  plans("gpt2-124m", 16, 1024, 768, 12);
  plans("gpt2-774m", 8, 1024, 1280, 20);
  plans("head size 16", 2, 64, 64, 4);
  plans("head size 32", 3, 96, 128, 4);
  plans("T not a multiple of 64", 2, 200, 256, 4);
  refused("heads that do not divide C", 0, 2, 64, 100, 3, "multiple of NH");
  refused("head size 512", 1, 2, 128, 2048, 4, "cuDNN");
  kern_cudnn_close();
  printf("test_cudnn_graphs: %d checks, %d failed\n", n_checks, n_fails);
  return n_fails != 0;
}

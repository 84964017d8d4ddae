/* test_cuda_emu: the emulator's own checks fire where a GPU would stop a
 * kernel, and stay quiet where it would not. The kernels' wide accesses
 * (cuda_impl.h's 16-byte and 8-byte loads and stores) on a GPU need their
 * address aligned to their size (else a misaligned-address error), and a
 * CPU would read on; cuda_emu.h's wide_access stops the run instead, and,
 * with synchronous streams, stops an access whose bytes leave the device
 * buffer. Each case launches one thread's access in a child process: a
 * case that must fail must end the child by abort() with the emulator's
 * message naming the access; one that must pass must exit 0. And a block
 * read after its free reads NaN, or faults (read_after_free). Built by
 * emu-cu.pl and g++ like kernels/cuda (Makefile), run by `make test` on
 * synchronous streams (run.sh's forward). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/cuda_impl.h"
#include "tests/cuda/check.h"

/* The accesses, one thread each: at byte offset off of p. */
__global__ static void load16_kernel(float *out, const char *p, size_t off) {
  out[0] = kern_cuda_load_f32x4((const float *)(p + off)).x;
}
__global__ static void store16_kernel(char *p, size_t off) {
  kern_cuda_store_u16x8((uint16_t *)(p + off), make_uint4(1, 2, 3, 4));
}
__global__ static void load8_kernel(float *out, const char *p, size_t off) {
  out[0] = (float)kern_cuda_load_u16x4((const uint16_t *)(p + off)).x;
}
__global__ static void store8_kernel(char *p, size_t off) {
  kern_cuda_store_u16x4((uint16_t *)(p + off), make_uint2(1, 2));
}

enum { LOAD16, STORE16, LOAD8, STORE8 };
static const char *const access_name[] = {"16-byte load", "16-byte store", "8-byte load",
                                          "8-byte store"};

#define BUF_BYTES 48 /* the device buffer the accesses are made in */

/* The child: one access of kind at byte offset off of a fresh buffer. */
static void access_once(int kind, size_t off) {
  char *buf = NULL;
  float *out = NULL;
  if (cudaMalloc((void **)&buf, BUF_BYTES) != cudaSuccess ||
      cudaMalloc((void **)&out, sizeof(float)) != cudaSuccess)
    _exit(3);
  static const char zeros[BUF_BYTES] = {0};
  cudaMemcpy(buf, zeros, BUF_BYTES, cudaMemcpyHostToDevice);
  switch (kind) {
  case LOAD16: load16_kernel<<<1, 1>>>(out, buf, off); break;
  case STORE16: store16_kernel<<<1, 1>>>(buf, off); break;
  case LOAD8: load8_kernel<<<1, 1>>>(out, buf, off); break;
  default: store8_kernel<<<1, 1>>>(buf, off); break;
  }
  _exit(cudaDeviceSynchronize() == cudaSuccess ? 0 : 4);
}

/* Runs fn(arg) in a child whose stderr goes to a file: its wait status in
 * *st and the first line it wrote to stderr in msg; 0, or -1 (the check
 * failed, saying why) where the child could not be made. */
static int in_child(void (*fn)(const void *), const void *arg, int *st, char *msg, size_t n) {
  char path[] = "/tmp/test_cuda_emu.XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) {
    check(0, "mkstemp: %s", strerror(errno));
    return -1;
  }
  unlink(path);
  fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    check(0, "fork: %s", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    dup2(fd, 2);
    fn(arg);
    _exit(0);
  }
  *st = 0;
  waitpid(pid, st, 0);
  const ssize_t got = pread(fd, msg, n - 1, 0);
  msg[got > 0 ? got : 0] = 0;
  close(fd);
  char *nl = strchr(msg, '\n');
  if (nl) *nl = 0;
  return 0;
}

typedef struct {
  int kind;
  size_t off;
} access_t;

static void access_child(const void *a) {
  access_once(((const access_t *)a)->kind, ((const access_t *)a)->off);
}

/* Runs the access in a child; it must abort with a message holding want
 * (want NULL: it must exit 0). */
static void expect(int kind, size_t off, const char *want, const char *why) {
  const access_t a = {kind, off};
  char msg[2048];
  int st;
  if (in_child(access_child, &a, &st, msg, sizeof msg)) return;
  if (!want)
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s at +%zu of a %d-byte buffer runs (%s)%s%s",
          access_name[kind], off, BUF_BYTES, why, *msg ? ": " : "", msg);
  else
    check(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(msg, want),
          "%s at +%zu of a %d-byte buffer stops the run (%s): %s", access_name[kind], off,
          BUF_BYTES, why, *msg ? msg : "(no message)");
}

/* A kernel's read of one float, for the reads after a free below. */
__global__ static void read_kernel(float *out, const float *p) { out[0] = p[0]; }

/* A block of bytes set to 0, freed, another of the same size allocated,
 * and the first read by a kernel: 0 and the float read (*got), whether
 * the second took the first's address (*reused); else not 0. */
static int read_freed(size_t bytes, float *got, int *reused) {
  float *buf = NULL, *out = NULL, *again = NULL;
  if (cudaMalloc((void **)&buf, bytes) != cudaSuccess ||
      cudaMalloc((void **)&out, sizeof(float)) != cudaSuccess ||
      cudaMemsetAsync(buf, 0, bytes, 0) != cudaSuccess || cudaFree(buf) != cudaSuccess ||
      cudaMalloc((void **)&again, bytes) != cudaSuccess)
    return 1;
  read_kernel<<<1, 1>>>(out, buf);
  const int rc = cudaMemcpy(got, out, sizeof *got, cudaMemcpyDeviceToHost) != cudaSuccess;
  *reused = again == buf;
  cudaFree(out), cudaFree(again);
  return rc;
}

static void read_freed_child(const void *bytes) {
  float got;
  int reused;
  _exit(read_freed(*(const size_t *)bytes, &got, &reused) ? 4 : 0);
}

/* A block read by a kernel after its cudaFree: the emulator keeps its host
 * memory a while (cuda_emu.cc's emu_quarantine), NaN, and from 64 KiB on
 * inaccessible, so such a read computes NaN or stops the run, and never
 * finds the next allocation's data there: the freed address is not handed
 * out again at once. bytes: the block's; fault: the read must stop the
 * process (run in a child) by abort() with the emulator's message naming
 * the kernel, else it must read NaN. */
static void read_after_free(size_t bytes, int fault) {
  if (!fault) {
    float got = 0;
    int reused = 1;
    const int rc = read_freed(bytes, &got, &reused);
    uint32_t bits;
    memcpy(&bits, &got, sizeof bits);
    check(!rc && !reused && bits == 0xffffffffu,
          "a %zu-byte block read after its free: NaN (bits %08x), its address not reused",
          bytes, bits);
    return;
  }
  char msg[2048];
  int st;
  if (in_child(read_freed_child, &bytes, &st, msg, sizeof msg)) return;
  check(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(msg, "use after free") &&
            strstr(msg, "read_kernel"),
        "a %zu-byte block read after its free stops the run: %s", bytes, *msg ? msg : "(none)");
}

int main(void) {
  read_after_free(48, 0);
  read_after_free(1 << 20, 1);
  expect(LOAD16, 16, NULL, "aligned, inside");
  expect(STORE16, 32, NULL, "aligned, its last 16 bytes");
  expect(LOAD8, 8, NULL, "8-byte aligned, not 16");
  expect(STORE8, 40, NULL, "8-byte aligned, its last 8 bytes");
  expect(LOAD16, 4, "not 16-byte aligned", "4 bytes off");
  expect(STORE16, 8, "not 16-byte aligned", "8 bytes off");
  expect(LOAD8, 2, "not 8-byte aligned", "2 bytes off");
  expect(STORE8, 12, "not 8-byte aligned", "4 bytes off");
  expect(LOAD16, 48, "not inside one device buffer", "past the end");
  expect(LOAD8, 48, "not inside one device buffer", "past the end");
  printf("test_cuda_emu: %d checks, %d failed\n", n_checks, n_fails);
  return n_fails ? 1 : 0;
}

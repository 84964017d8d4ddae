/* fuzz: see fuzz.h. */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/kern.h"

int fuzz_file(const uint8_t *data, size_t size, char *path) {
  int fd = memfd_create("fuzz", 0);
  if (fd < 0) abort();
  for (size_t done = 0; done < size;) {
    ssize_t w = write(fd, data + done, size - done);
    if (w <= 0) abort();
    done += (size_t)w;
  }
  snprintf(path, 64, "/proc/self/fd/%d", fd);
  return fd;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  setenv("FSDP_LOG_LEVEL", "0", 1); /* a log line per input is noise */
  setenv("FSDP_THREADS", "1", 1);
  /* the targets run kernels through kern_cpu(), which FSDP_THREADS does not
   * reach: one thread for them too, since make test runs the targets side
   * by side and an input is a few tiny ops */
  kern_cpu()->set_threads(1);
  return 0;
}

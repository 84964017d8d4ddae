/* fuzz_jobfile: job files (config_load_file, then config_finish). */
#include <stdlib.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/job/config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[64];
  int fd = fuzz_file(data, size, path);
  config_t c;
  config_default(&c);
  int rc = config_load_file(&c, path);
  if (rc && !err_msg()[0]) abort();
  if (!rc) {
    rc = config_finish(&c);
    if (rc && !err_msg()[0]) abort();
  }
  close(fd);
  return 0;
}

/* fuzz_weights: weights files (gpt_load). A file it accepts must hold a model
 * that runs a forward pass; anything else is an error with a message. */
#include <stdlib.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/train/gpt.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[64];
  int fd = fuzz_file(data, size, path);
  gpt_t *g = NULL;
  int rc = gpt_load(&g, path, kern_cpu());
  if (rc) {
    if (!err_msg()[0] || g) abort();
  } else {
    const gpt_config_t *c = gpt_get_config(g);
    int32_t in[4] = {0, 1 % c->vocab, 0, 1 % c->vocab};
    int T = c->context < 2 ? c->context : 2;
    float loss;
    if (gpt_forward(g, in, in, 1, T, &loss)) abort();
    gpt_destroy(g);
  }
  close(fd);
  return 0;
}

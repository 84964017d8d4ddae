/* fuzz_tokens: token files (data_open and the batches drawn from what it
 * accepts). Any input must give either a usable file or an error with a
 * message: never a crash, a hang or an out-of-bounds read. */
#include <stdlib.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[64];
  int fd = fuzz_file(data, size, path);
  enum { V = 256, B = 2, T = 8 };
  data_t *d = NULL;
  int rc = data_open(&d, path, V, 0.1, T);
  if (rc) {
    if (!err_msg()[0]) abort(); /* every refusal says why */
  } else {
    int32_t in[B * T], tg[B * T];
    data_pos_t pos = {0, 0};
    for (int k = 0; k < 3; k++)
      if (data_next_batch(d, &pos, 7, B, T, in, tg) == 0)
        for (int i = 0; i < B * T; i++)
          if (in[i] < 0 || in[i] >= V || tg[i] < 0 || tg[i] >= V) abort();
    size_t nb = data_eval_num_batches(d, B, T);
    if (nb && data_eval_batch(d, nb - 1, B, T, in, tg) != 0) abort();
    data_close(d);
  }
  close(fd);
  return 0;
}

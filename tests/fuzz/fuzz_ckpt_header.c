/* fuzz_ckpt_header: checkpoint shard headers (ckpt_header_decode). Any input
 * must decode into a header whose tables are consistent, re-encoding to the
 * same bytes, or be refused with a message: never a crash, a hang, an
 * out-of-bounds read or an allocation the input's length does not pay for. */
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/job/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ckpt_header_t h;
  if (ckpt_header_decode(data, size, "fuzz", &h)) {
    if (!err_msg()[0]) abort(); /* every refusal says why */
    return 0;
  }
  /* what decoded encodes back to the same bytes: nothing was read loosely */
  uint8_t *p = NULL;
  const uint64_t sum = h.sum;
  if (ckpt_header_encode(&h, &p) || h.sum != sum || memcmp(p, data, h.header_bytes)) abort();
  if (ckpt_file_bytes(&h) < h.header_bytes) abort();
  free(p);
  ckpt_header_free(&h);
  return 0;
}

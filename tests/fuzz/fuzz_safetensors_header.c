/* fuzz_safetensors_header: safetensors files (safetensors_parse) against a
 * small GPT-2 (layers 1, channels 4, heads 1, vocab 4, context 4). Any input
 * must give an error with a message, or places that all lie inside the file,
 * after the header, each tensor whole. */
#include <stdlib.h>

#include "daemon/common/err.h"
#include "daemon/job/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const gpt_config_t model = {1, 4, 1, 4, 4};
  safetensors_t st;
  if (safetensors_parse(data, size, size, "fuzz", &model, &st)) {
    if (!err_msg()[0]) abort();
    return 0;
  }
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--) len = len << 8 | data[i];
  for (int k = 0; k < st.num_tensors; k++) {
    const safetensors_place_t *p = &st.place[k];
    const uint64_t es = p->dtype == SAFETENSORS_F32 ? 4 : 2;
    if (!safetensors_dtype_name(p->dtype) || p->at < 8 + len ||
        p->at + st.tensor[k].numel * es > size)
      abort();
  }
  safetensors_free(&st);
  return 0;
}

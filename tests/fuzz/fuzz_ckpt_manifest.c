/* fuzz_ckpt_manifest: checkpoint manifests (ckpt_manifest_parse). Any input
 * must give a manifest whose shard names are the format's own (so a manifest
 * can never point a load outside its directory) and whose model is one a job
 * could have and its shards can hold (an export sizes its header and buffers
 * from it), or an error with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/job/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ckpt_manifest_t m;
  if (ckpt_manifest_parse((const char *)data, size, "fuzz", &m)) {
    if (!err_msg()[0]) abort();
    return 0;
  }
  if (m.shards < 1 || !m.shard) abort();
  if (gpt_config_validate(&m.model) ||
      gpt_config_num_params(&m.model) > m.shard_total * (uint64_t)m.shards)
    abort();
  for (int j = 0; j < m.shards; j++) {
    char want[CKPT_NAME_MAX];
    ckpt_shard_name(want, sizeof want, j, m.shards);
    if (strcmp(m.shard[j].name, want) || strchr(m.shard[j].name, '/')) abort();
  }
  ckpt_manifest_free(&m);
  return 0;
}

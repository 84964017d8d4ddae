/* precision: the named precision policies (see precision.h). */
#include "daemon/job/precision.h"

#include <string.h>

#include "daemon/common/err.h"

const char *precision_describe(precision_t p) {
  switch (p) {
  case PRECISION_BF16_MIXED:
    return "bf16-mixed: parameters gathered and computed with in bf16, gradients reduced in "
           "fp32, fp32 master weights and AdamW state on the shard";
  case PRECISION_BF16_TRUE:
    return "bf16-true: parameter and gradient shards stored in bf16, gathered and reduced in "
           "bf16, computed with in fp32 on the bf16 values, AdamW m and v in bf16 (8 bytes "
           "per parameter against fp32's 16); an update below half a bf16 ulp of its weight "
           "(about 2^-9 of it) is lost";
  default:
    return "fp32: storage, compute, reduce and optimizer all fp32";
  }
}

int precision_parse(const char *s, precision_t *out) {
  if (!strcmp(s, "fp32")) *out = PRECISION_FP32;
  else if (!strcmp(s, "bf16-mixed")) *out = PRECISION_BF16_MIXED;
  else if (!strcmp(s, "bf16-true")) *out = PRECISION_BF16_TRUE;
  else
    return err_set(FSDP_EINVAL, "precision: \"%s\" is not a policy; choose fp32, bf16-mixed or "
                   "bf16-true", s);
  return FSDP_OK;
}

const char *precision_name(precision_t p) {
  switch (p) {
  case PRECISION_BF16_MIXED: return "bf16-mixed";
  case PRECISION_BF16_TRUE: return "bf16-true";
  default: return "fp32";
  }
}

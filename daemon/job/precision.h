/* precision: the named precision policies of a job (param dtype / reduce
 * dtype / master weights and optimizer state). The sharded runtime
 * (daemon/train/fsdp.c) implements them; the job's checks and the memory plan
 * only need their names and what each stores, so they live here. */
#ifndef FSDP_PRECISION_H
#define FSDP_PRECISION_H

typedef enum { PRECISION_FP32, PRECISION_BF16_MIXED, PRECISION_BF16_TRUE } precision_t;

/* fp32, bf16-mixed or bf16-true; the error names the field and the choices. */
int precision_parse(const char *s, precision_t *out);
/* "fp32", "bf16-mixed", "bf16-true": what precision_parse reads. */
const char *precision_name(precision_t p);
/* One sentence: storage, compute, reduce and optimizer dtypes. */
const char *precision_describe(precision_t p);

#endif

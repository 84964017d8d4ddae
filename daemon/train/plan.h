/* plan: the memory a job will need, predicted before anything is allocated,
 * so a job that cannot fit is refused at start with the knob that fixes it,
 * not killed by the OOM killer an hour in. The prediction is exact for what
 * the runtime allocates (every byte goes through the accounting allocator, so
 * a run can print its measured peak beside the plan and a test holds them
 * equal); it does not count the process's code and libraries. */
#ifndef FSDP_PLAN_H
#define FSDP_PLAN_H

#include <stddef.h>

#include "config.h"
#include "mem.h"

typedef struct plan {
  size_t bytes[MEM__COUNT]; /* by accounting category */
  size_t total;
} plan_t;

/* Predicts a single-rank run of c (after config_finish). */
void plan_single(const config_t *c, plan_t *p);
/* Memory the host can give now (MemAvailable), in bytes; 0 if unknown. */
size_t plan_host_available(void);
/* FSDP_OK when p fits in limit bytes (0: nothing to check); otherwise an error
 * that states both numbers, what takes the most, and what to change. */
int plan_check(const plan_t *p, const config_t *c, size_t limit);
/* One line: "plan: total X MiB (params ..., activations ...)". */
void plan_print(const plan_t *p, FILE *out);

#endif

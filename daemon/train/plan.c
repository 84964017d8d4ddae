/* plan: memory prediction and the fit check (see plan.h). */
#include "plan.h"

#include <stdio.h>
#include <string.h>

#include "daemon/common/err.h"

void plan_single(const config_t *c, plan_t *p) {
  memset(p, 0, sizeof *p);
  const size_t P = gpt_config_num_params(&c->gpt), f = sizeof(float);
  const size_t N = (size_t)c->batch * (size_t)c->seq_len;
  p->bytes[MEM_PARAMS] = P * f;
  p->bytes[MEM_GRADS] = P * f;
  p->bytes[MEM_OPTIM] = 2 * P * f; /* AdamW m and v */
  /* activations and their gradients (gpt.c); the attention scratch is
   * workspace, as are the training loop's input and target batches */
  const size_t scratch =
      kern_cpu()->attention_scratch(c->batch, c->seq_len, c->gpt.channels, c->gpt.heads) * f;
  p->bytes[MEM_ACTS] = gpt_activation_bytes(&c->gpt, c->batch, c->seq_len,
                                            c->activation_checkpointing) - scratch;
  p->bytes[MEM_WORKSPACE] = scratch + 2 * N * sizeof(int32_t);
  for (int k = 0; k < MEM__COUNT; k++) p->total += p->bytes[k];
}

size_t plan_host_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

#define MIB(x) ((double)(x) / 1048576.0)

int plan_check(const plan_t *p, const config_t *c, size_t limit) {
  if (!limit || p->total <= limit) return FSDP_OK;
  const size_t acts = p->bytes[MEM_ACTS];
  const size_t state = p->bytes[MEM_PARAMS] + p->bytes[MEM_GRADS] + p->bytes[MEM_OPTIM];
  char advice[512];
  if (acts >= state) {
    config_t ck = *c;
    ck.activation_checkpointing = 1;
    plan_t q;
    plan_single(&ck, &q);
    if (!c->activation_checkpointing && q.total <= limit)
      snprintf(advice, sizeof advice, "activations take the most (%.0f MiB): set "
               "activation_checkpointing = 1 (the plan is then %.0f MiB)", MIB(acts), MIB(q.total));
    else
      snprintf(advice, sizeof advice, "activations take the most (%.0f MiB, batch %d x seq_len "
               "%d): lower batch and raise grad_accum to keep the tokens per step", MIB(acts),
               c->batch, c->seq_len);
  } else {
    snprintf(advice, sizeof advice, "parameters, gradients and AdamW state take %.0f MiB (16 bytes "
             "per parameter): choose a smaller model, or shard it over more ranks", MIB(state));
  }
  return err_set(FSDP_ENOMEM, "memory: the job needs %.0f MiB but %.0f MiB is available "
                 "(memory_limit_mib, or the host's available memory); %s", MIB(p->total),
                 MIB(limit), advice);
}

void plan_print(const plan_t *p, FILE *out) {
  fprintf(out, "plan (MiB):");
  for (int k = 0; k < MEM__COUNT; k++)
    if (p->bytes[k]) fprintf(out, " %s=%.1f", mem_cat_name((mem_cat_t)k), MIB(p->bytes[k]));
  fprintf(out, " total=%.1f\n", MIB(p->total));
}

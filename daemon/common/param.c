/* param: getters for the tunables listed in param.h. */
#include "param.h"

#include "err.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>


/* The value of env as this process has it: def where it is unset or empty;
 * def, said once, where it is not a decimal integer or (bad PARAM_WARN) lies
 * outside lo..hi. */
static int64_t param_read(const char *env, int64_t def, int64_t lo, int64_t hi, int bad) {
  const char *s = getenv(env);
  if (!s || !*s) return def;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10); /* decimal, as param_plan_env_ok wants it */
  /* Not through the logger: the log level is itself a tunable read here. */
  if (errno || *end) {
    fprintf(stderr, "fsdp WARN param: %s=\"%s\" is not a decimal integer; using the default %lld\n",
            env, s, (long long)def);
    return def;
  }
  if ((v < lo || v > hi) && bad == PARAM_WARN) {
    fprintf(stderr, "fsdp WARN param: %s=%lld is outside its range, %lld to %lld; using the "
            "default %lld\n", env, v, (long long)lo, (long long)hi, (long long)def);
    return def;
  }
  return (int64_t)v;
}

#define XX(name, env, def, lo, hi, bad, help)                                      \
  static int64_t param_val_##name;                                                 \
  static pthread_once_t param_once_##name = PTHREAD_ONCE_INIT;                     \
  static void param_init_##name(void) {                                            \
    param_val_##name = param_read(env, def, lo, hi, bad);                          \
  }                                                                                \
  int64_t param_##name(void) {                                                     \
    pthread_once(&param_once_##name, param_init_##name);                           \
    return param_val_##name;                                                       \
  }
FSDP_PARAM_LIST(XX)
#undef XX

void param_dump(FILE *out) {
#define XX(name, env, def, lo, hi, bad, help)                                      \
  fprintf(out, "  %-22s default %-6lld now %-6lld (%lld to %lld) %s\n", env,        \
          (long long)(def), (long long)param_##name(), (long long)(lo), (long long)(hi), help);
  FSDP_PARAM_LIST(XX)
#undef XX
}

int param_check(void) {
#define XX(name, env, def, lo, hi, bad, help)                                      \
  if (bad == PARAM_REFUSE && (param_##name() < (lo) || param_##name() > (hi)))     \
    return err_set(FSDP_EINVAL, "%s: %lld; give %lld to %lld, or unset it (its default, %lld)", \
                   env, (long long)param_##name(), (long long)(lo), (long long)(hi),        \
                   (long long)(def));
  FSDP_PARAM_LIST(XX)
#undef XX
  return FSDP_OK;
}

static const struct {
  const char *env;
  int64_t (*get)(void);
} param_plan[PARAM_PLAN_ENV_N] = {
    {"FSDP_COMM_STAGING_BYTES", param_comm_staging_bytes},
    {"FSDP_COMM_SHM", param_comm_shm},
    {"FSDP_COMM_SHM_BYTES", param_comm_shm_bytes},
    {"FSDP_ATTN_BLOCK", param_attn_block},
    {"FSDP_CUDA_ATTN_GEMM", param_cuda_attn_gemm},
    {"FSDP_CUDA_ATTN_FP32", param_cuda_attn_fp32}, /* bf16 jobs' attention scratch */
    /* bf16 jobs' activations and gathered units (plan.c's plan_cuda) */
    {"FSDP_CUDA_GEMM_FAST16BF", param_cuda_gemm_fast16bf},
    {"FSDP_CUDA_ACTS_FP32", param_cuda_acts_fp32},
    {"FSDP_CUDA_WEIGHTS_PACK", param_cuda_weights_pack},
    {"FSDP_GATHER_ROUND", param_gather_round}, /* bf16-mixed's image (params, gathered) */
    /* PARAM_PLAN_ENV_BASE: the ones after it are sent only where set (param.h) */
    {"FSDP_CUDA_ATTN_CUDNN", param_cuda_attn_cudnn}, /* bf16 jobs' attention scratch */
};

/* A tunable's default, by its variable (FSDP_PARAM_LIST's). */
static int64_t param_default(const char *env) {
#define XX(name, var, def, lo, hi, bad, help) \
  if (!strcmp(env, var)) return (def);
  FSDP_PARAM_LIST(XX)
#undef XX
  return 0;
}

void param_plan_env(int i, char out[PARAM_PLAN_ENV_LEN]) {
  snprintf(out, PARAM_PLAN_ENV_LEN, "%s=%lld", param_plan[i].env, (long long)param_plan[i].get());
}

void param_plan_env_default(int i, char out[PARAM_PLAN_ENV_LEN]) {
  snprintf(out, PARAM_PLAN_ENV_LEN, "%s=%lld", param_plan[i].env,
           (long long)param_default(param_plan[i].env));
}

int param_plan_env_sent(int i) {
  return i < PARAM_PLAN_ENV_BASE || param_plan[i].get() != param_default(param_plan[i].env);
}

int param_plan_env_index(const char *e) {
  for (int i = 0; i < PARAM_PLAN_ENV_N; i++) {
    const size_t n = strlen(param_plan[i].env);
    if (!strncmp(e, param_plan[i].env, n) && e[n] == '=') return i;
  }
  return -1;
}

int param_plan_env_ok(const char *e) {
  const int i = param_plan_env_index(e);
  if (i < 0) return 0;
  const char *v = e + strlen(param_plan[i].env) + 1;
  size_t k = *v == '-' ? 1 : 0, digits = strspn(v + k, "0123456789");
  return digits > 0 && digits <= 19 && !v[k + digits];
}

/* backend: the CPU backend's table (kern_cpu_init, kern_cpu), its tunables
 * and thread control, and the small helpers the op files share. The ops
 * themselves live one per file. */
#include <omp.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

int kern_cpu_attn_rows = 64;

/* Every op of the table is implemented here. */
static int cpu_supports_op(kern_op_t op) { return op >= 0 && op < KERN_OP__COUNT; }

/* oneDNN is built on the same OpenMP runtime (libgomp), so this one setting
 * sizes both our loops and its sgemm. */
static void cpu_set_threads(int n) {
  if (n <= 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    n = cores > 0 ? (int)cores : 1;
  }
  omp_set_num_threads(n);
}

static int cpu_get_threads(void) { return omp_get_max_threads(); }

void kern_cpu_channel_range(int C, int *c0, int *c1) {
  int nb = (C + KERN_CPU_CBLOCK - 1) / KERN_CPU_CBLOCK;
  int nt = omp_get_num_threads(), id = omp_get_thread_num();
  int b0 = (int)((int64_t)nb * id / nt), b1 = (int)((int64_t)nb * (id + 1) / nt);
  *c0 = b0 * KERN_CPU_CBLOCK;
  *c1 = b1 * KERN_CPU_CBLOCK < C ? b1 * KERN_CPU_CBLOCK : C;
}

static const kern_backend_t cpu_backend = {
    .name = "cpu",
    .supports_op = cpu_supports_op,
    .set_threads = cpu_set_threads,
    .get_threads = cpu_get_threads,
    .host_memory = 1,
    .dev_alloc = NULL,
    .dev_free = NULL,
    .dev_set = kern_cpu_dev_set,
    .copy_h2d = kern_cpu_copy,
    .copy_d2h = kern_cpu_copy,
    .copy_d2d = kern_cpu_copy,
    .sync = kern_cpu_sync,
    .vec_add = kern_cpu_vec_add,
    .vec_scale = kern_cpu_vec_scale,
    .vec_sum = kern_cpu_vec_sum,
    .reduce_f32 = kern_cpu_reduce_f32,
    .reduce_bf16 = kern_cpu_reduce_bf16,
    .copy_stream = kern_cpu_copy_stream,
    .encoder_fwd = kern_cpu_encoder_fwd,
    .encoder_bwd = kern_cpu_encoder_bwd,
    .layernorm_fwd = kern_cpu_layernorm_fwd,
    .layernorm_bwd = kern_cpu_layernorm_bwd,
    .matmul_fwd = kern_cpu_matmul_fwd,
    .matmul_bwd = kern_cpu_matmul_bwd,
    .attention_fwd = kern_cpu_attention_fwd,
    .attention_bwd = kern_cpu_attention_bwd,
    .attention_scratch = kern_cpu_attention_scratch,
    .gelu_fwd = kern_cpu_gelu_fwd,
    .gelu_bwd = kern_cpu_gelu_bwd,
    .residual_fwd = kern_cpu_residual_fwd,
    .residual_bwd = kern_cpu_residual_bwd,
    .crossentropy_fwd = kern_cpu_crossentropy_fwd,
    .crossentropy_bwd = kern_cpu_crossentropy_bwd,
    .adamw = kern_cpu_adamw,
    .f32_to_bf16 = kern_cpu_f32_to_bf16,
    .bf16_to_f32 = kern_cpu_bf16_to_f32,
    .sumsq = kern_cpu_sumsq,
};

const kern_backend_t *kern_cpu_init(const kern_cpu_opts_t *o) {
  kern_cpu_opts_t d = {0, 0};
  if (!o) o = &d;
  kern_cpu_attn_rows = o->attn_block > 0 ? o->attn_block : 64;
  cpu_set_threads(o->threads);
  return &cpu_backend;
}

const kern_backend_t *kern_cpu(void) { return &cpu_backend; }

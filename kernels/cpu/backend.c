/* backend: the CPU backend's entry points (kern_cpu_init, kern_cpu), the
 * choice of ISA level at run time, its tunables and thread control, and the
 * small helpers the op files share. The ops themselves live one per file,
 * compiled once per level (cpu.h); this file is compiled once, for baseline
 * x86-64, and must run on any x86-64 processor. */
#include <omp.h>
#include <stdatomic.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/size.h"

int kern_cpu_attn_rows = 64;

/* The table kern_cpu() returns; NULL until kern_cpu_init or the first
 * kern_cpu() (which takes the best level). Atomic: the collectives' threads
 * ask for it while the main thread may be configuring it. */
static _Atomic(const kern_backend_t *) cpu_current;

/* Every op of the table is implemented here. */
int kern_cpu_supports_op(kern_op_t op) { return op >= 0 && op < KERN_OP__COUNT; }

/* oneDNN is built on the same OpenMP runtime (libgomp), so this one setting
 * sizes both our loops and its sgemm. At most KERN_CPU_THREADS_MAX, the
 * range of --threads and FSDP_THREADS that callers check: libgomp crashes
 * creating a team of 100000. */
void kern_cpu_set_threads(int n) {
  if (n <= 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    n = cores > 0 ? (int)cores : 1;
  }
  omp_set_num_threads(n < KERN_CPU_THREADS_MAX ? n : KERN_CPU_THREADS_MAX);
}

int kern_cpu_get_threads(void) { return omp_get_max_threads(); }

void kern_cpu_channel_range(int C, int *c0, int *c1) {
  int nb = (C + KERN_CPU_CBLOCK - 1) / KERN_CPU_CBLOCK;
  int nt = omp_get_num_threads(), id = omp_get_thread_num();
  int b0 = (int)((int64_t)nb * id / nt), b1 = (int)((int64_t)nb * (id + 1) / nt);
  *c0 = b0 * KERN_CPU_CBLOCK;
  *c1 = b1 * KERN_CPU_CBLOCK < C ? b1 * KERN_CPU_CBLOCK : C;
}

/* ---- the processor's level ------------------------------------------------
 * What gcc may emit under -march=x86-64-v3 / -v4, checked the way the psABI
 * defines the levels: the CPUID feature bits, and XCR0 (the OS saves the YMM
 * state, and for v4 the opmask and ZMM state; a processor with AVX-512 under
 * an OS that does not save it must not run it). */
#if defined(__x86_64__) || defined(__i386__)
static kern_cpu_isa_t cpu_detect(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return KERN_CPU_ISA_GENERIC;
  const unsigned c1 = c;
  /* leaf 1 ECX: v2's SSE3 0, SSSE3 9, CX16 13, SSE4.1 19, SSE4.2 20, POPCNT 23;
   * v3's FMA 12, MOVBE 22, AVX 28, F16C 29; OSXSAVE 27 (XGETBV works) */
  const unsigned v3_c1 = 1u << 0 | 1u << 9 | 1u << 13 | 1u << 19 | 1u << 20 | 1u << 23 |
                         1u << 12 | 1u << 22 | 1u << 28 | 1u << 29 | 1u << 27;
  if ((c1 & v3_c1) != v3_c1) return KERN_CPU_ISA_GENERIC;
  unsigned xlo, xhi;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  (void)xhi;
  if ((xlo & 0x6) != 0x6) return KERN_CPU_ISA_GENERIC; /* XMM and YMM state */
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return KERN_CPU_ISA_GENERIC;
  const unsigned b7 = b;
  /* leaf 7 EBX: BMI1 3, AVX2 5, BMI2 8 */
  const unsigned v3_b7 = 1u << 3 | 1u << 5 | 1u << 8;
  if ((b7 & v3_b7) != v3_b7) return KERN_CPU_ISA_GENERIC;
  /* leaf 0x80000001 ECX: v2's LAHF-SAHF 0, v3's LZCNT (ABM) 5 */
  if (!__get_cpuid(0x80000001, &a, &b, &c, &d) || (c & 0x21) != 0x21) return KERN_CPU_ISA_GENERIC;
  /* leaf 7 EBX: AVX512F 16, DQ 17, CD 28, BW 30, VL 31; XCR0: opmask 5, ZMM 6-7 */
  const unsigned v4_b7 = 1u << 16 | 1u << 17 | 1u << 28 | 1u << 30 | 1u << 31;
  if ((b7 & v4_b7) != v4_b7 || (xlo & 0xe0) != 0xe0) return KERN_CPU_ISA_AVX2;
  return KERN_CPU_ISA_AVX512;
}
#else
static kern_cpu_isa_t cpu_detect(void) { return KERN_CPU_ISA_GENERIC; }
#endif

kern_cpu_isa_t kern_cpu_isa_best(void) {
  static _Atomic int best; /* 0 until detected: cpuid may trap to a hypervisor */
  int v = atomic_load(&best);
  if (!v) atomic_store(&best, v = (int)cpu_detect());
  return (kern_cpu_isa_t)v;
}

const char *kern_cpu_isa_name(kern_cpu_isa_t isa) {
  switch (isa) {
  case KERN_CPU_ISA_AUTO: return "auto";
  case KERN_CPU_ISA_GENERIC: return "generic";
  case KERN_CPU_ISA_AVX2: return "avx2";
  case KERN_CPU_ISA_AVX512: return "avx512";
  }
  return NULL;
}

const kern_backend_t *kern_cpu_isa_table(kern_cpu_isa_t isa) {
  const kern_cpu_isa_t best = kern_cpu_isa_best();
  if (isa == KERN_CPU_ISA_AUTO) isa = best;
  if (isa > best) return NULL;
  switch (isa) {
  case KERN_CPU_ISA_GENERIC: return &kern_cpu_table_generic;
  case KERN_CPU_ISA_AVX2: return &kern_cpu_table_avx2;
  case KERN_CPU_ISA_AVX512: return &kern_cpu_table_avx512;
  default: return NULL;
  }
}

kern_cpu_isa_t kern_cpu_isa(void) {
  const kern_backend_t *t = kern_cpu();
  return t == &kern_cpu_table_avx512 ? KERN_CPU_ISA_AVX512
         : t == &kern_cpu_table_avx2 ? KERN_CPU_ISA_AVX2
                                     : KERN_CPU_ISA_GENERIC;
}

const kern_backend_t *kern_cpu_init(const kern_cpu_opts_t *o) {
  kern_cpu_opts_t d = {0, 0, KERN_CPU_ISA_AUTO};
  if (!o) o = &d;
  kern_cpu_attn_rows = kern_cpu_size_attn_rows(o->attn_block);
  kern_cpu_set_threads(o->threads);
  /* a level this processor lacks (or no level at all) runs at the best it has */
  const kern_cpu_isa_t best = kern_cpu_isa_best();
  kern_cpu_isa_t isa = o->isa;
  if (!kern_cpu_isa_name(isa) || isa > best) isa = KERN_CPU_ISA_AUTO;
  const kern_backend_t *t = kern_cpu_isa_table(isa);
  atomic_store(&cpu_current, t);
  return t;
}

const kern_backend_t *kern_cpu(void) {
  const kern_backend_t *t = atomic_load(&cpu_current);
  if (!t) { /* never configured: the best level, unless kern_cpu_init got there first */
    const kern_backend_t *none = NULL;
    t = kern_cpu_isa_table(KERN_CPU_ISA_AUTO);
    if (!atomic_compare_exchange_strong(&cpu_current, &none, t)) t = none;
  }
  return t;
}

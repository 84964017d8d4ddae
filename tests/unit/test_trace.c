/* test_trace: bench_cuda's trace summary (tests/bench/trace.c) on records
 * made up here: the GPU's busy time against a nanosecond-by-nanosecond
 * count, each idle gap put down to what the host did, and kernels' names
 * read out of their mangled form. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/bench/trace.h"

static const char *names[] = {"k_a", "k_b", "k_c", "k_d", "cudaLaunchKernel", "cudaEventQuery",
                              "cudaStreamSynchronize", "cuLaunchKernel"};
enum { KA, KB, KC, KD, LAUNCH, QUERY, SYNC, CULAUNCH };

static const trace_total_t *find(const trace_total_t *t, int n, int name) {
  for (int i = 0; i < n; i++)
    if (t[i].name == name) return &t[i];
  return NULL;
}

/* Random records on three streams, some crossing the window's edges: busy
 * and idle time and the number of gaps against a count of every ns. */
Test(trace, busy_time_is_the_union_of_every_stream_inside_the_window) {
  enum { SPAN = 4000 };
  static uint8_t busy[SPAN];
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int round = 0; round < 50; round++) {
    trace_gpu_t gpu[40];
    const size_t n = 1 + round % 40;
    for (size_t i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const uint64_t s = x % (SPAN - 200), len = 1 + (x >> 20) % 199; /* ends inside busy[] */
      gpu[i] = (trace_gpu_t){.start = s, .end = s + len, .corr = (uint32_t)i, .stream = i % 3,
                             .name = (int)(i % 4)};
    }
    const uint64_t t0 = 100 + round, t1 = SPAN - 150 - round;
    memset(busy, 0, sizeof busy);
    for (size_t i = 0; i < n; i++)
      for (uint64_t ns = gpu[i].start; ns < gpu[i].end; ns++) busy[ns] = 1;
    uint64_t want_busy = 0;
    size_t want_gaps = 0;
    for (uint64_t ns = t0; ns < t1; ns++) {
      want_busy += busy[ns];
      want_gaps += !busy[ns] && (ns == t0 || busy[ns - 1]);
    }
    double want_gpu_ms = 0;
    for (size_t i = 0; i < n; i++) want_gpu_ms += (double)(gpu[i].end - gpu[i].start) / 1e6;
    trace_t t = {.gpu = gpu, .ngpu = n, .names = names, .nnames = 8, .t0 = t0, .t1 = t1};
    trace_summary_t s;
    cr_assert_eq(trace_summarize(&t, &s), 0);
    cr_assert_float_eq(s.window_ms, (double)(t1 - t0) / 1e6, 1e-12);
    cr_assert_float_eq(s.busy_ms, (double)want_busy / 1e6, 1e-12, "round %d: busy %g, counted %g",
                       round, s.busy_ms * 1e6, (double)want_busy);
    cr_assert_float_eq(s.idle_ms, (double)(t1 - t0 - want_busy) / 1e6, 1e-12);
    cr_assert_eq(s.gaps, want_gaps, "round %d: %zu gaps, counted %zu", round, s.gaps, want_gaps);
    double idle = 0, gpu_ms = 0;
    for (int i = 0; i < s.nidle; i++) idle += s.idle[i].ms;
    for (int i = 0; i < s.ngpu; i++) gpu_ms += s.gpu[i].ms;
    cr_assert_float_eq(idle, s.idle_ms, 1e-12, "the causes add up to the idle time");
    cr_assert_float_eq(gpu_ms, want_gpu_ms, 1e-12, "every record is in its name's total");
    for (int i = 1; i < s.nlargest; i++) cr_assert_geq(s.largest[i - 1].ms, s.largest[i].ms);
  }
}

/* One made-up step (times in ns, window 0 to 1000):
 *   kernel A  corr 1, launched [0, 10],     runs [20, 100]
 *   the host polls (cudaEventQuery [100, 105], [150, 155])
 *   kernel B  corr 2, launched [200, 210],  runs [215, 300]  gap [100, 215): polling
 *   kernel C  corr 3, launched [220, 230],  runs [350, 400]  gap [300, 350): queued in time
 *   the host drains (cudaStreamSynchronize [400, 480])
 *   kernel D  corr 4, launched by the driver [490, 500], runs [505, 600]  gap [400, 505): the sync
 *   a copy    corr 9, no call recorded,     runs [700, 750]  gap [600, 700): unknown
 *   the tail [750, 1000): the end */
Test(trace, each_gap_is_put_down_to_what_the_host_did_before_the_launch_that_ended_it) {
  trace_gpu_t gpu[] = {{300 + 50, 400, 3, 2, KC}, {20, 100, 1, 1, KA}, {505, 600, 4, 1, KD},
                       {215, 300, 2, 1, KB}, {700, 750, 9, 1, KA}};
  trace_api_t api[] = {{0, 10, 1, 7, LAUNCH},       {100, 105, 11, 7, QUERY},
                       {150, 155, 12, 7, QUERY},    {200, 210, 2, 7, LAUNCH},
                       {220, 230, 3, 7, LAUNCH},    {400, 480, 13, 7, SYNC},
                       {490, 500, 4, 7, CULAUNCH},  {482, 488, 14, 8, QUERY}};
  trace_t t = {.gpu = gpu, .ngpu = 5, .api = api, .napi = 8, .names = names, .nnames = 8,
               .t0 = 0, .t1 = 1000};
  trace_summary_t s;
  cr_assert_eq(trace_summarize(&t, &s), 0);
  cr_assert_float_eq(s.busy_ms, (80 + 85 + 50 + 95 + 50) / 1e6, 1e-12);
  cr_assert_eq(s.gaps, 6); /* [0, 20) too: A launched at 0, so the host's call before is none */
  const struct { int cause; double ns; } want[] = {
      {QUERY, 115}, {TRACE_CAUSE_QUEUED, 50}, {SYNC, 105},
      {TRACE_CAUSE_UNKNOWN, 100 + 20}, {TRACE_CAUSE_END, 250}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const trace_total_t *c = find(s.idle, s.nidle, want[i].cause);
    cr_assert_not_null(c, "cause %s", trace_cause_name(&t, want[i].cause));
    cr_assert_float_eq(c->ms, want[i].ns / 1e6, 1e-12, "cause %s: %g ns, want %g",
                       trace_cause_name(&t, want[i].cause), c->ms * 1e6, want[i].ns);
  }
  /* the longest gap first, with the records around it and its launch */
  cr_assert_float_eq(s.largest[0].ms, 250 / 1e6, 1e-12);
  cr_assert_eq(s.largest[0].cause, TRACE_CAUSE_END);
  cr_assert_eq(s.largest[0].before, KA);
  cr_assert_eq(s.largest[0].after, -1);
  cr_assert_float_eq(s.largest[1].ms, 115 / 1e6, 1e-12);
  cr_assert_float_eq(s.largest[1].at_ms, 100 / 1e6, 1e-12);
  cr_assert_eq(s.largest[1].before, KA);
  cr_assert_eq(s.largest[1].after, KB);
  cr_assert_eq(s.largest[1].launch, LAUNCH);
  cr_assert_eq(s.largest[2].launch, CULAUNCH, "the sync's gap ends with D, the driver's launch");
  cr_assert_eq(s.largest[2].cause, SYNC, "another thread's call does not count");
  /* the host's time in calls */
  const trace_total_t *q = find(s.host, s.nhost, QUERY), *y = find(s.host, s.nhost, SYNC);
  cr_assert(q && q->count == 3 && fabs(q->ms - 16 / 1e6) < 1e-12);
  cr_assert(y && y->count == 1 && fabs(y->ms - 80 / 1e6) < 1e-12);
  cr_assert_eq(s.gpu[0].name, KA, "A's two records (130 ns) lead");
  cr_assert_eq(s.gpu[0].count, 2);
}

Test(trace, a_traced_step_with_no_gpu_work_is_one_idle_gap) {
  trace_t t = {.names = names, .nnames = 8, .t0 = 5, .t1 = 2005};
  trace_summary_t s;
  cr_assert_eq(trace_summarize(&t, &s), 0);
  cr_assert_float_eq(s.busy_ms, 0.0, 1e-15);
  cr_assert_float_eq(s.idle_ms, 2000 / 1e6, 1e-12);
  cr_assert_eq(s.gaps, 1);
  cr_assert_eq(s.idle[0].name, TRACE_CAUSE_END);
}

Test(trace, kernel_names_are_read_out_of_their_mangled_form) {
  const struct { const char *in, *out; } cases[] = {
      {"_ZL15bias_add_kernelPfPKfiil", "bias_add_kernel"},
      {"_Z18attn_tc_fwd_kernelILi64ELi128EEvPfPKf", "attn_tc_fwd_kernel<64,128>"},
      {"_Z6kernelILb1ELin5EEvv", "kernel<1,-5>"},
      {"_ZN4cute6detail3fooIiEEvv", "cute::detail::foo<.>"},
      {"_ZN5ncclx6kernelEv", "ncclx::kernel"},
      {"sm90_xmma_gemm_bf16bf16_bf16f32", "sm90_xmma_gemm_bf16bf16_bf16f32"},
      {"_Z999short", "_Z999short"},
      {"_Zx", "_Zx"},
      {"memcpy DtoD", "memcpy DtoD"},
  };
  char out[64];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    trace_short_name(cases[i].in, out, sizeof out);
    cr_assert_str_eq(out, cases[i].out, "%s: %s", cases[i].in, out);
  }
  trace_short_name("_ZL15bias_add_kernelPfPKfiil", out, 9);
  cr_assert_str_eq(out, "bias_add", "cut to its room, terminated");
  trace_short_name(NULL, out, sizeof out);
  cr_assert_str_eq(out, "?");
}

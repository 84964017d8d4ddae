/* trace: where one traced training step's time went, from the GPU's
 * activity records and the host's CUDA calls (trace_cupti.c gathers them
 * with CUPTI; this file only reads them, so tests/unit/test_trace.c checks
 * it without a GPU).
 *
 * The window is the step on the host's clock (CUPTI gives the GPU's records
 * on it too). The GPU is busy where any of its records (kernels, copies,
 * memsets, on any stream) runs; the rest of the window is idle, in gaps.
 * Each gap is put down to a cause, found from the record that ends it:
 *  - the host queued that record only after the GPU had gone idle (its
 *    launching call ended after the gap began): the GPU waited for the
 *    host, and the cause is the host's last CUDA call on that thread before
 *    the launch (cudaEventQuery: it was polling a wait; cudaStreamSynchronize:
 *    it had drained the stream; a launch: it was busy between launches);
 *  - it was queued before: it waited on something else (another stream's
 *    event, a dependency): TRACE_CAUSE_QUEUED;
 *  - no call launched it in the records: TRACE_CAUSE_UNKNOWN;
 *  - the window's tail after the last record (the host reading results
 *    back and finishing the step): TRACE_CAUSE_END. */
#ifndef FSDP_TRACE_H
#define FSDP_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Something the GPU ran: [start, end) in ns, queued by the call with
 * correlation id corr; name indexes trace_t.names. */
typedef struct {
  uint64_t start, end;
  uint32_t corr, stream;
  int name;
} trace_gpu_t;

/* A CUDA runtime or driver call on a host thread. */
typedef struct {
  uint64_t start, end;
  uint32_t corr, thread;
  int name;
} trace_api_t;

typedef struct {
  trace_gpu_t *gpu;
  size_t ngpu;
  trace_api_t *api;
  size_t napi;
  const char *const *names;
  size_t nnames;
  uint64_t t0, t1; /* the window */
} trace_t;

#define TRACE_TOP 16
#define TRACE_CAUSE_QUEUED (-2)
#define TRACE_CAUSE_UNKNOWN (-3)
#define TRACE_CAUSE_END (-4)

/* A total by name (or cause): ms over count records. */
typedef struct {
  int name;
  int count;
  double ms;
} trace_total_t;

typedef struct {
  double ms, at_ms; /* its length, and its start from the window's */
  int before, after; /* the GPU records around it (-1: none) */
  int launch;        /* the call that queued `after` (-1: none) */
  int cause;         /* a TRACE_CAUSE_*, or the host's last call before that launch */
} trace_gap_t;

typedef struct {
  double window_ms, busy_ms, idle_ms;
  size_t gaps;                 /* idle gaps in the window */
  trace_total_t gpu[TRACE_TOP]; /* GPU time by record name, largest first */
  int ngpu;
  trace_total_t idle[TRACE_TOP]; /* idle time by cause, largest first */
  int nidle;
  trace_total_t host[TRACE_TOP]; /* host time in CUDA calls by name, largest first */
  int nhost;
  trace_gap_t largest[TRACE_TOP]; /* the longest gaps, longest first */
  int nlargest;
} trace_summary_t;

/* Sums t up (t's arrays are reordered). 0, or -1 when out of memory. */
int trace_summarize(trace_t *t, trace_summary_t *s);

/* The readable part of a kernel's name: the identifier of an Itanium-mangled
 * name (nested names joined by ::, integer template arguments kept:
 * "attn_fwd<64>"), or the name itself when it is not mangled; cut to fit. */
void trace_short_name(const char *name, char *out, size_t cap);

/* A cause's words: a name, or what the TRACE_CAUSE_* mean. */
const char *trace_cause_name(const trace_t *t, int cause);

/* The summary as `bench: cuda_trace...` lines (label: the run's words). */
void trace_print(FILE *f, const trace_t *t, const trace_summary_t *s, const char *label);

#endif

/* trace_cupti: one stretch of a program traced with CUPTI's activity API
 * (the GPU's kernels, copies and memsets, and the host's CUDA runtime and
 * driver calls), for trace.c to sum up. libcupti is opened with dlopen
 * (libcupti.so.13, then libcupti.so), so the bench starts on machines
 * without it; it is built only where CUDA's headers are (else start says
 * so). Tracing slows the traced stretch: a few microseconds a call. */
#ifndef FSDP_TRACE_CUPTI_H
#define FSDP_TRACE_CUPTI_H

#include <stddef.h>

#include "tests/bench/trace.h"

/* Starts tracing: 0, or -1 with the reason in msg. */
int trace_cupti_start(char *msg, size_t cap);

/* Stops tracing and hands the records over in *t (the window: from start to
 * now), to be freed by trace_cupti_free. 0, or -1 with the reason in msg. */
int trace_cupti_stop(trace_t *t, char *msg, size_t cap);

void trace_cupti_free(trace_t *t);

#endif

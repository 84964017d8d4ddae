/* trace: one traced step summed up (trace.h says what each figure means). */
#include "tests/bench/trace.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static double ms_of(uint64_t ns) { return (double)ns / 1e6; }

static int cmp_gpu_start(const void *a, const void *b) {
  const trace_gpu_t *x = a, *y = b;
  return (x->start > y->start) - (x->start < y->start);
}

/* calls by correlation id; should two records share one, the earlier
 * (an enclosing call) first */
static int cmp_api_corr(const void *a, const void *b) {
  const trace_api_t *x = a, *y = b;
  if (x->corr != y->corr) return (x->corr > y->corr) - (x->corr < y->corr);
  return (x->start > y->start) - (x->start < y->start);
}

static int cmp_api_thread_end(const void *a, const void *b) {
  const trace_api_t *x = *(const trace_api_t *const *)a, *y = *(const trace_api_t *const *)b;
  if (x->thread != y->thread) return (x->thread > y->thread) - (x->thread < y->thread);
  return (x->end > y->end) - (x->end < y->end);
}

static int cmp_total_ms(const void *a, const void *b) {
  const trace_total_t *x = a, *y = b;
  return (x->ms < y->ms) - (x->ms > y->ms);
}

static int cmp_gap_ms(const void *a, const void *b) {
  const trace_gap_t *x = a, *y = b;
  return (x->ms < y->ms) - (x->ms > y->ms);
}

/* The call with correlation id corr (api sorted by cmp_api_corr), or NULL. */
static const trace_api_t *api_by_corr(const trace_t *t, uint32_t corr) {
  size_t lo = 0, hi = t->napi;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (t->api[mid].corr < corr) lo = mid + 1;
    else hi = mid;
  }
  return lo < t->napi && t->api[lo].corr == corr ? &t->api[lo] : NULL;
}

/* The last call on thread that ended by `by` (by_thread sorted by
 * cmp_api_thread_end), or NULL. */
static const trace_api_t *api_before(const trace_api_t *const *by_thread, size_t n,
                                     uint32_t thread, uint64_t by) {
  size_t lo = 0, hi = n; /* first (thread, end) > (thread, by) */
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const trace_api_t *m = by_thread[mid];
    if (m->thread < thread || (m->thread == thread && m->end <= by)) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 && by_thread[lo - 1]->thread == thread ? by_thread[lo - 1] : NULL;
}

/* Adds ms to the total named name in tot (n of them, room for cap). */
static void total_add(trace_total_t *tot, size_t *n, int name, double ms) {
  for (size_t i = 0; i < *n; i++)
    if (tot[i].name == name) {
      tot[i].ms += ms, tot[i].count++;
      return;
    }
  tot[(*n)++] = (trace_total_t){.name = name, .count = 1, .ms = ms};
}

/* The largest TRACE_TOP of tot (n), into out. */
static int total_top(trace_total_t *tot, size_t n, trace_total_t *out) {
  if (n) qsort(tot, n, sizeof *tot, cmp_total_ms);
  const int k = n < TRACE_TOP ? (int)n : TRACE_TOP;
  memcpy(out, tot, (size_t)k * sizeof *tot);
  return k;
}

/* The gap [g0, g1) before next (NULL: the window's tail), its cause. */
static trace_gap_t gap_make(const trace_t *t, const trace_api_t *const *by_thread, uint64_t g0,
                            uint64_t g1, const trace_gpu_t *prev, const trace_gpu_t *next) {
  trace_gap_t g = {.ms = ms_of(g1 - g0), .at_ms = ms_of(g0 - t->t0),
                   .before = prev ? prev->name : -1, .after = next ? next->name : -1,
                   .launch = -1, .cause = TRACE_CAUSE_END};
  if (!next) return g;
  const trace_api_t *l = api_by_corr(t, next->corr);
  if (!l) {
    g.cause = TRACE_CAUSE_UNKNOWN;
    return g;
  }
  g.launch = l->name;
  if (l->end <= g0) { /* queued in time: it waited on something else */
    g.cause = TRACE_CAUSE_QUEUED;
    return g;
  }
  const trace_api_t *h = api_before(by_thread, t->napi, l->thread, l->start);
  g.cause = h ? h->name : TRACE_CAUSE_UNKNOWN;
  return g;
}

int trace_summarize(trace_t *t, trace_summary_t *s) {
  memset(s, 0, sizeof *s);
  s->window_ms = ms_of(t->t1 > t->t0 ? t->t1 - t->t0 : 0);
  const size_t nn = t->nnames + 8; /* names, and the causes that are not names */
  trace_total_t *gpu = calloc(nn, sizeof *gpu), *idle = calloc(nn, sizeof *idle),
                *host = calloc(nn, sizeof *host);
  trace_gap_t *gaps = calloc(t->ngpu + 2, sizeof *gaps);
  const trace_api_t **by_thread = calloc(t->napi + 1, sizeof *by_thread);
  int rc = -1;
  if (!gpu || !idle || !host || !gaps || !by_thread) goto out;
  if (t->ngpu) qsort(t->gpu, t->ngpu, sizeof *t->gpu, cmp_gpu_start);
  if (t->napi) { /* (qsort's array may not be NULL, even when empty) */
    qsort(t->api, t->napi, sizeof *t->api, cmp_api_corr);
    for (size_t i = 0; i < t->napi; i++) by_thread[i] = &t->api[i];
    qsort(by_thread, t->napi, sizeof *by_thread, cmp_api_thread_end);
  }

  size_t ngpu = 0, nidle = 0, nhost = 0, ngaps = 0;
  uint64_t busy = 0, cover = t->t0; /* the union's end so far */
  const trace_gpu_t *prev = NULL;   /* the record that ends latest so far */
  for (size_t i = 0; i < t->ngpu; i++) {
    const trace_gpu_t *r = &t->gpu[i];
    total_add(gpu, &ngpu, r->name, ms_of(r->end - r->start));
    const uint64_t a = r->start < t->t0 ? t->t0 : r->start, b = r->end > t->t1 ? t->t1 : r->end;
    if (a >= b) continue; /* outside the window */
    if (a > cover) gaps[ngaps++] = gap_make(t, by_thread, cover, a, prev, r);
    if (b > cover) busy += b - (a > cover ? a : cover), cover = b;
    if (!prev || r->end > prev->end) prev = r;
  }
  if (t->t1 > cover) gaps[ngaps++] = gap_make(t, by_thread, cover, t->t1, prev, NULL);
  s->busy_ms = ms_of(busy);
  s->idle_ms = s->window_ms - s->busy_ms;
  s->gaps = ngaps;
  for (size_t i = 0; i < ngaps; i++) total_add(idle, &nidle, gaps[i].cause, gaps[i].ms);
  for (size_t i = 0; i < t->napi; i++)
    if (t->api[i].end > t->t0 && t->api[i].start < t->t1)
      total_add(host, &nhost, t->api[i].name, ms_of(t->api[i].end - t->api[i].start));
  s->ngpu = total_top(gpu, ngpu, s->gpu);
  s->nidle = total_top(idle, nidle, s->idle);
  s->nhost = total_top(host, nhost, s->host);
  if (ngaps) qsort(gaps, ngaps, sizeof *gaps, cmp_gap_ms);
  s->nlargest = ngaps < TRACE_TOP ? (int)ngaps : TRACE_TOP;
  memcpy(s->largest, gaps, (size_t)s->nlargest * sizeof *gaps);
  rc = 0;
out:
  free(gpu), free(idle), free(host), free(gaps), free(by_thread);
  return rc;
}

/* Reads a <length><identifier> of a mangled name at *p into out (appending
 * at *o), moving both on; 0, or -1 when *p holds none. */
static int mangled_ident(const char **p, char *out, size_t cap, size_t *o) {
  if (!isdigit((unsigned char)**p)) return -1;
  char *end;
  const long len = strtol(*p, &end, 10);
  if (len <= 0 || (long)strnlen(end, (size_t)len) < len) return -1;
  for (long i = 0; i < len && *o + 1 < cap; i++) out[(*o)++] = end[i];
  out[*o] = 0;
  *p = end + len;
  return 0;
}

static void out_puts(char *out, size_t cap, size_t *o, const char *s) {
  for (; *s && *o + 1 < cap; s++) out[(*o)++] = *s;
  out[*o] = 0;
}

void trace_short_name(const char *name, char *out, size_t cap) {
  if (!cap) return;
  out[0] = 0;
  size_t o = 0;
  const char *p = name ? name : "?";
  if (strncmp(p, "_Z", 2) != 0) {
    out_puts(out, cap, &o, p);
    return;
  }
  p += 2;
  if (*p == 'L') p++; /* internal linkage */
  int ok = 0;
  if (*p == 'N') { /* nested: A::B::f */
    p++;
    while (*p == 'K' || *p == 'V' || *p == 'r') p++;
    for (int first = 1; isdigit((unsigned char)*p); first = 0) {
      if (!first) out_puts(out, cap, &o, "::");
      if (mangled_ident(&p, out, cap, &o)) break;
      ok = 1;
    }
  } else {
    ok = !mangled_ident(&p, out, cap, &o);
  }
  if (!ok) { /* not a form read here: the name as it is */
    o = 0;
    out_puts(out, cap, &o, name);
    return;
  }
  if (*p != 'I') return;
  /* integer template arguments (Li64E, Lj8E, Lb1E), others as "." */
  p++;
  out_puts(out, cap, &o, "<");
  for (int first = 1; *p && *p != 'E'; first = 0) {
    if (!first) out_puts(out, cap, &o, ",");
    if (p[0] == 'L' && p[1] && isalpha((unsigned char)p[1])) {
      const char *e = strchr(p + 2, 'E');
      if (!e) break;
      char num[32];
      snprintf(num, sizeof num, "%.*s", (int)(e - p - 2 < 31 ? e - p - 2 : 31), p + 2);
      if (num[0] == 'n') num[0] = '-'; /* a negative literal */
      out_puts(out, cap, &o, num);
      p = e + 1;
    } else { /* a type: not read, the list ends here */
      out_puts(out, cap, &o, ".");
      break;
    }
  }
  out_puts(out, cap, &o, ">");
}

const char *trace_cause_name(const trace_t *t, int cause) {
  switch (cause) {
  case TRACE_CAUSE_QUEUED: return "queued in time, waited on another stream or event";
  case TRACE_CAUSE_UNKNOWN: return "no call recorded";
  case TRACE_CAUSE_END: return "after the last GPU work, until the step returned";
  default: return cause >= 0 && (size_t)cause < t->nnames ? t->names[cause] : "?";
  }
}

static const char *gpu_name(const trace_t *t, int name, char *buf, size_t cap) {
  trace_short_name(name >= 0 && (size_t)name < t->nnames ? t->names[name] : "-", buf, cap);
  return buf;
}

void trace_print(FILE *f, const trace_t *t, const trace_summary_t *s, const char *label) {
  char a[96], b[96];
  fprintf(f, "bench: cuda_trace %s window_ms=%.2f gpu_busy_ms=%.2f gpu_idle_ms=%.2f gaps=%zu "
          "gpu_records=%zu host_calls=%zu\n", label, s->window_ms, s->busy_ms, s->idle_ms,
          s->gaps, t->ngpu, t->napi);
  for (int i = 0; i < s->ngpu; i++)
    fprintf(f, "bench: cuda_trace_gpu name=\"%s\" count=%d ms=%.3f share_of_window=%.3f\n",
            gpu_name(t, s->gpu[i].name, a, sizeof a), s->gpu[i].count, s->gpu[i].ms,
            s->window_ms > 0 ? s->gpu[i].ms / s->window_ms : 0.0);
  for (int i = 0; i < s->nidle; i++) {
    const int host = s->idle[i].name >= 0;
    fprintf(f, "bench: cuda_trace_idle cause=\"%s%s\" gaps=%d ms=%.3f\n",
            host ? "the host launched late; its call before: " : "",
            trace_cause_name(t, s->idle[i].name), s->idle[i].count, s->idle[i].ms);
  }
  for (int i = 0; i < s->nlargest; i++) {
    const trace_gap_t *g = &s->largest[i];
    fprintf(f, "bench: cuda_trace_gap ms=%.3f at_ms=%.3f before=\"%s\" after=\"%s\" "
            "launched_by=\"%s\" cause=\"%s\"\n", g->ms, g->at_ms,
            gpu_name(t, g->before, a, sizeof a), gpu_name(t, g->after, b, sizeof b),
            g->launch >= 0 ? t->names[g->launch] : "-", trace_cause_name(t, g->cause));
  }
  for (int i = 0; i < s->nhost; i++)
    fprintf(f, "bench: cuda_trace_host call=\"%s\" count=%d ms=%.3f\n",
            trace_cause_name(t, s->host[i].name), s->host[i].count, s->host[i].ms);
}

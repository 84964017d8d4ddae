/* metrics: `/metrics` in Prometheus' text exposition format (version 0.0.4)
 * for the coordinator and fsdpd: a text builder that writes families and
 * samples with their labels escaped, and an HTTP endpoint served by
 * GNU libmicrohttpd on a thread of its own.
 *
 * Threading: the program's state belongs to its libuv loop, so a scrape
 * never reads it from the HTTP thread. A scrape asks the loop (uv_async) to
 * render, and waits for that rendering (METRICS_WAIT_MS at most: a loop
 * that busy gets a 503 saying so); the render callback runs on the loop's
 * thread like every other handler. Only GET /metrics is served (404
 * otherwise). */
#ifndef FSDP_METRICS_H
#define FSDP_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define METRICS_WAIT_MS 2000

typedef struct metrics_buf {
  char *p;
  size_t len, cap;
  int failed; /* out of memory: the scrape gets a 500 */
} metrics_buf_t;

/* "# HELP name help" and "# TYPE name type" (gauge, counter, histogram). */
void metrics_family(metrics_buf_t *b, const char *name, const char *type, const char *help);
/* One sample: name{k1="v1",...} value. labels: NULL-terminated key, value
 * pairs (values escaped here: backslash, double quote, newline), or NULL. */
void metrics_sample(metrics_buf_t *b, const char *name, const char *const *labels, double value);

/* A histogram with fixed upper bounds (seconds), observed on the loop. */
#define METRICS_BUCKETS 12
typedef struct metrics_hist {
  double le[METRICS_BUCKETS]; /* ascending; unused ones 0 */
  int n;
  uint64_t count[METRICS_BUCKETS], total;
  double sum;
} metrics_hist_t;
/* METRICS_BUCKETS bounds from first seconds, each factor times the last
 * (then +Inf): what is measured decides its range (milliseconds for a
 * heartbeat's lateness, up to hours for a job's wait for placement). */
void metrics_hist_init(metrics_hist_t *h, double first, double factor);
/* n (at most METRICS_BUCKETS) bounds as given, ascending: where an alert's
 * threshold must be a bound (a quantile is interpolated inside a bucket). */
void metrics_hist_init_bounds(metrics_hist_t *h, const double *le, int n);
void metrics_hist_observe(metrics_hist_t *h, double seconds);
/* Its family and samples: name_bucket{le=...}, name_sum, name_count. */
void metrics_hist_write(metrics_buf_t *b, const char *name, const char *help,
                        const metrics_hist_t *h);

/* A rank's latest report, as the coordinator and fsdpd both show it. */
typedef struct metrics_rank {
  char job[32];
  int rank;
  double step, loss, tokens_per_s;
  int unreported; /* no step reported yet: no step, loss or tokens/s series (memory only) */
  int ncat;
  const char *const *cat;           /* memory categories ... */
  const uint64_t *cur, *peak;       /* ... and their bytes now and at peak */
} metrics_rank_t;
/* fsdp_rank_step, _loss, _tokens_per_second, _memory_bytes and
 * _memory_peak_bytes (by category), labelled job and rank. */
void metrics_ranks_write(metrics_buf_t *b, const metrics_rank_t *r, int n);

typedef void (*metrics_render_cb)(metrics_buf_t *b, void *arg);
typedef struct metrics_server metrics_server_t;
/* What metrics_server_start would refuse in addr (its form, not whether
 * the port is free), naming --metrics-listen: a bad option, checked before
 * a program starts serving. */
int metrics_listen_check(const char *addr);
/* Serves GET /metrics on addr ("127.0.0.1:9100", "0.0.0.0:0": any port),
 * rendering with cb(arg) on loop's thread. */
int metrics_server_start(metrics_server_t **out, uv_loop_t *loop, const char *addr,
                         metrics_render_cb cb, void *arg);
/* The bound port. */
int metrics_server_port(const metrics_server_t *m);
/* Stops serving (waits for the HTTP thread) and frees; on the loop's
 * thread. Its async handle closes on the loop. NULL is fine. */
void metrics_server_stop(metrics_server_t *m);

#endif

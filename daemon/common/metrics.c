/* metrics: Prometheus' text format and its HTTP endpoint (see metrics.h). */
#include "daemon/common/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "daemon/common/netaddr.h"

/* Connections: a client that sends a header line every few seconds keeps
 * one for as long as it likes (the timeout, 10 s, is of silence, and
 * libmicrohttpd 0.9.75 bounds no request's whole time), so one peer may hold
 * METRICS_PER_PEER and all of them METRICS_CONNECTIONS. Before, 16 in all
 * and none a peer: 16 slow connections from one address left every scrape
 * unanswered, and FsdpTargetDown fired (found by an outside tester).
 * Prometheus scrapes over one connection; a few more are a person's curl. */
#define METRICS_CONNECTIONS 64
#define METRICS_PER_PEER 4

/* ---- text ---------------------------------------------------------------------- */

static void mb_put(metrics_buf_t *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void mb_puts(metrics_buf_t *b, const char *s) { mb_put(b, s, strlen(s)); }

void metrics_family(metrics_buf_t *b, const char *name, const char *type, const char *help) {
  mb_puts(b, "# HELP "), mb_puts(b, name), mb_puts(b, " "), mb_puts(b, help);
  mb_puts(b, "\n# TYPE "), mb_puts(b, name), mb_puts(b, " "), mb_puts(b, type), mb_puts(b, "\n");
}

void metrics_sample(metrics_buf_t *b, const char *name, const char *const *labels, double value) {
  mb_puts(b, name);
  for (int i = 0; labels && labels[i]; i += 2) {
    mb_puts(b, i ? "," : "{"), mb_puts(b, labels[i]), mb_puts(b, "=\"");
    for (const char *v = labels[i + 1]; *v; v++) {
      if (*v == '\\') mb_puts(b, "\\\\");
      else if (*v == '"') mb_puts(b, "\\\"");
      else if (*v == '\n') mb_puts(b, "\\n");
      else mb_put(b, v, 1);
    }
    mb_puts(b, "\"");
  }
  if (labels && labels[0]) mb_puts(b, "}");
  char num[64];
  if (isnan(value)) snprintf(num, sizeof num, " NaN\n");
  else if (isinf(value)) snprintf(num, sizeof num, " %s\n", value > 0 ? "+Inf" : "-Inf");
  else snprintf(num, sizeof num, " %.17g\n", value);
  mb_puts(b, num);
}

void metrics_hist_init(metrics_hist_t *h, double first, double factor) {
  memset(h, 0, sizeof *h);
  h->n = METRICS_BUCKETS;
  double at = first;
  for (int i = 0; i < h->n; i++, at *= factor) {
    /* the bound is the one its label shows (six digits, "%g"): an
     * observation is counted by the le a reader sees */
    char text[32];
    snprintf(text, sizeof text, "%g", at);
    h->le[i] = strtod(text, NULL);
  }
}

void metrics_hist_init_bounds(metrics_hist_t *h, const double *le, int n) {
  memset(h, 0, sizeof *h);
  h->n = n < METRICS_BUCKETS ? n : METRICS_BUCKETS;
  for (int i = 0; i < h->n; i++) h->le[i] = le[i];
}

void metrics_hist_observe(metrics_hist_t *h, double seconds) {
  for (int i = 0; i < h->n; i++)
    if (seconds <= h->le[i]) h->count[i]++;
  h->total++;
  h->sum += seconds;
}

void metrics_hist_write(metrics_buf_t *b, const char *name, const char *help,
                        const metrics_hist_t *h) {
  char n[128], le[32];
  metrics_family(b, name, "histogram", help);
  snprintf(n, sizeof n, "%s_bucket", name);
  for (int i = 0; i < h->n; i++) {
    snprintf(le, sizeof le, "%g", h->le[i]);
    metrics_sample(b, n, (const char *[]){"le", le, NULL}, (double)h->count[i]);
  }
  metrics_sample(b, n, (const char *[]){"le", "+Inf", NULL}, (double)h->total);
  snprintf(n, sizeof n, "%s_sum", name);
  metrics_sample(b, n, NULL, h->sum);
  snprintf(n, sizeof n, "%s_count", name);
  metrics_sample(b, n, NULL, (double)h->total);
}

void metrics_ranks_write(metrics_buf_t *b, const metrics_rank_t *r, int n) {
  static const struct {
    const char *name, *help;
  } fam[] = {
      {"fsdp_rank_step", "Optimizer steps a rank has done, from its latest report."},
      {"fsdp_rank_loss", "A rank's training loss at its latest step."},
      {"fsdp_rank_tokens_per_second", "A rank's training throughput, tokens per second."},
      {"fsdp_rank_memory_bytes", "A rank's memory by category, now."},
      {"fsdp_rank_memory_peak_bytes", "A rank's memory by category, at its peak."},
  };
  for (int f = 0; f < 5; f++) {
    metrics_family(b, fam[f].name, "gauge", fam[f].help);
    for (int i = 0; i < n; i++) {
      char rank[16];
      snprintf(rank, sizeof rank, "%d", r[i].rank);
      if (f < 3) {
        if (r[i].unreported) continue; /* a start's zeros would read as step 0, a perfect loss */
        const double v = f == 0 ? r[i].step : f == 1 ? r[i].loss : r[i].tokens_per_s;
        metrics_sample(b, fam[f].name, (const char *[]){"job", r[i].job, "rank", rank, NULL}, v);
        continue;
      }
      for (int k = 0; k < r[i].ncat; k++)
        metrics_sample(b, fam[f].name, (const char *[]){"job", r[i].job, "rank", rank, "category",
                                                        r[i].cat[k], NULL},
                       (double)(f == 3 ? r[i].cur[k] : r[i].peak[k]));
    }
  }
}

/* ---- the endpoint ---------------------------------------------------------------- */

struct metrics_server {
  struct MHD_Daemon *d;
  uv_async_t async;
  metrics_render_cb cb;
  void *arg;
  int port;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t want, done; /* renderings asked for, and the last one made */
  char *text;          /* that rendering (NULL: it failed) */
  size_t len;
  int stopping;
};

/* On the loop: one rendering for every scrape waiting. */
static void metrics_async_cb(uv_async_t *a) {
  metrics_server_t *m = a->data;
  pthread_mutex_lock(&m->mu);
  const uint64_t target = m->want;
  pthread_mutex_unlock(&m->mu);
  metrics_buf_t b = {0};
  m->cb(&b, m->arg);
  pthread_mutex_lock(&m->mu);
  free(m->text);
  m->text = b.failed ? (free(b.p), NULL) : b.p;
  m->len = b.failed ? 0 : b.len;
  m->done = target;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

static enum MHD_Result metrics_reply(struct MHD_Connection *conn, unsigned status, char *body,
                                     size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) return free(body), MHD_NO;
  MHD_add_response_header(r, "Content-Type", status == MHD_HTTP_OK
                                                 ? "text/plain; version=0.0.4; charset=utf-8"
                                                 : "text/plain; charset=utf-8");
  enum MHD_Result ok = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result metrics_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version,
                                       const char *upload, size_t *upload_len, void **state) {
  (void)version, (void)upload, (void)upload_len, (void)state;
  metrics_server_t *m = cls;
  if (strcmp(method, "GET") && strcmp(method, "HEAD"))
    return metrics_reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, strdup("only GET\n"), 9);
  if (strcmp(url, "/metrics"))
    return metrics_reply(conn, MHD_HTTP_NOT_FOUND, strdup("not found: the metrics are at /metrics\n"), 39);
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += METRICS_WAIT_MS / 1000;
  until.tv_nsec += (long)(METRICS_WAIT_MS % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&m->mu);
  const uint64_t mine = ++m->want;
  uv_async_send(&m->async);
  while (m->done < mine && !m->stopping)
    if (pthread_cond_timedwait(&m->cv, &m->mu, &until) == ETIMEDOUT) break;
  char *body = NULL;
  size_t len = 0;
  unsigned status = MHD_HTTP_OK;
  if (m->done >= mine && m->text) {
    body = malloc(m->len + 1);
    if (body) memcpy(body, m->text, m->len), len = m->len;
  }
  pthread_mutex_unlock(&m->mu);
  if (!body) {
    status = MHD_HTTP_SERVICE_UNAVAILABLE;
    body = strdup("the process did not render its metrics in time (busy or stopping)\n");
    len = body ? strlen(body) : 0;
  }
  return body ? metrics_reply(conn, status, body, len) : MHD_NO;
}

int metrics_listen_check(const char *addr) {
  struct sockaddr_storage sa;
  socklen_t sl;
  return netaddr_parse("--metrics-listen", addr, 1, &sa, &sl);
}

int metrics_server_start(metrics_server_t **out, uv_loop_t *loop, const char *addr,
                         metrics_render_cb cb, void *arg) {
  *out = NULL;
  struct sockaddr_storage sa;
  socklen_t sl;
  int rc = netaddr_parse("--metrics-listen", addr, 1, &sa, &sl);
  if (rc) return rc;
  const int port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                  : ((struct sockaddr_in *)&sa)->sin_port);
  metrics_server_t *m = calloc(1, sizeof *m);
  if (!m) return err_set(FSDP_ENOMEM, "metrics: out of memory");
  m->cb = cb, m->arg = arg;
  pthread_mutex_init(&m->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cv, &ca);
  pthread_condattr_destroy(&ca);
  uv_async_init(loop, &m->async, metrics_async_cb);
  m->async.data = m;
  /* [::] takes IPv4 too, as Linux users expect of it; another IPv6 address only itself */
  const int v6 = sa.ss_family == AF_INET6,
            any6 = v6 && IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&sa)->sin6_addr);
  m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD |
                              (any6 ? MHD_USE_DUAL_STACK : v6 ? MHD_USE_IPv6 : 0),
                          0, NULL, NULL, metrics_handler, m,
                          MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_CONNECTIONS,
                          MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)METRICS_PER_PEER,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
  if (!m->d) {
    int e = errno;
    metrics_server_stop(m);
    return err_set_errno(FSDP_EUNAVAILABLE, e, "metrics: cannot serve on %s", addr);
  }
  const union MHD_DaemonInfo *i = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
  m->port = i ? i->port : port;
  *out = m;
  return FSDP_OK;
}

int metrics_server_port(const metrics_server_t *m) { return m->port; }

static void metrics_close_cb(uv_handle_t *h) {
  metrics_server_t *m = h->data;
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m->text);
  free(m);
}

void metrics_server_stop(metrics_server_t *m) {
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  m->stopping = 1; /* a scrape waiting for this loop returns now */
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  if (m->d) MHD_stop_daemon(m->d);
  uv_close((uv_handle_t *)&m->async, metrics_close_cb);
}

/* table: aligned human tables and their cell formats (see table.h). */
#include "client/table.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include <unistr.h>
#include <uniwidth.h>

#include "daemon/common/err.h"
#include "daemon/common/text.h"

struct table {
  int ncols;
  unsigned right;
  const char *headers[TABLE_MAX_COLS];
  char **cells; /* row-major, ncols per row */
  size_t n, cap;
  size_t *keep; /* NULL, or the widths kept from page to page (table_keep_widths) */
};

table_t *table_create(unsigned right, const char *const *headers) {
  table_t *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  while (headers[t->ncols] && t->ncols < TABLE_MAX_COLS) {
    t->headers[t->ncols] = headers[t->ncols];
    t->ncols++;
  }
  t->right = right;
  return t;
}

void table_destroy(table_t *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) free(t->cells[i]);
  free(t->cells);
  free(t);
}

int table_cell(table_t *t, const char *fmt, ...) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 64;
    char **c = realloc(t->cells, cap * sizeof *c);
    if (!c) return err_set(FSDP_ENOMEM, "table: out of memory");
    t->cells = c;
    t->cap = cap;
  }
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int rc = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (rc < 0) return err_set(FSDP_ENOMEM, "table: out of memory");
  /* a cell is one line: a server's sentence with a newline would break the
   * rows; any other control character shows escaped (text_escape): the
   * server's strings (a node's hostname, a job's reason) are not trusted
   * with the terminal */
  for (char *p = s; *p; p++)
    if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
  char *safe = malloc(TEXT_ESCAPED_MAX((size_t)rc));
  if (safe) text_escape(safe, s, (size_t)rc, 0, NULL);
  free(s);
  if (!safe) return err_set(FSDP_ENOMEM, "table: out of memory");
  t->cells[t->n++] = safe;
  return 0;
}

void table_keep_widths(table_t *t, size_t *widths) { t->keep = widths; }

/* Widths are columns of a terminal, not bytes: a name in UTF-8 ("café",
 * "日本語") takes fewer columns than bytes, a wide (CJK) character two, a
 * combining accent none; a byte that is not UTF-8 counts one (libunistring
 * reads it as U+FFFD). The server's strings are UTF-8 (proto3 strings). */
static size_t table_width(const char *s) {
  int w = u8_strwidth((const uint8_t *)s, "UTF-8");
  return w > 0 ? (size_t)w : 0;
}

/* How many bytes of s fit in cols columns, ending at a character's end, so
 * that a cut never splits a character's bytes (invalid UTF-8 on screen). */
static size_t table_fit(const char *s, size_t cols) {
  const uint8_t *p = (const uint8_t *)s;
  const size_t n = strlen(s);
  size_t i = 0, w = 0;
  while (i < n) {
    ucs4_t uc;
    const int len = u8_mbtouc(&uc, p + i, n - i); /* >= 1: an invalid byte is one */
    const int cw = uc_width(uc, "UTF-8");
    if (cw > 0 && w + (size_t)cw > cols) break;
    if (cw > 0) w += (size_t)cw;
    i += (size_t)len;
  }
  return i;
}

static void table_spaces(FILE *out, size_t n) {
  for (size_t k = 0; k < n; k++) fputc(' ', out);
}

void table_print(const table_t *t, FILE *out, int width) {
  size_t w[TABLE_MAX_COLS];
  for (int c = 0; c < t->ncols; c++) w[c] = table_width(t->headers[c]);
  for (size_t i = 0; i < t->n; i++) {
    size_t l = table_width(t->cells[i]);
    if (l > w[i % t->ncols]) w[i % t->ncols] = l;
  }
  for (int c = 0; t->keep && c < t->ncols; c++) {
    if (t->keep[c] > w[c]) w[c] = t->keep[c];
    t->keep[c] = w[c];
  }
  size_t rows = (t->n + (size_t)t->ncols - 1) / (size_t)t->ncols;
  int headers = 0;
  for (int c = 0; c < t->ncols; c++) headers |= t->headers[c][0] != 0;
  char *line = NULL;
  size_t cap = 0;
  for (size_t r = !headers; r <= rows; r++) { /* row 0: the headers */
    free(line), line = NULL;
    FILE *f = open_memstream(&line, &cap);
    if (!f) break; /* out of memory: the table is cut short */
    for (int c = 0; c < t->ncols; c++) {
      size_t i = (r - 1) * (size_t)t->ncols + (size_t)c;
      const char *s = !r ? t->headers[c] : i < t->n ? t->cells[i] : "";
      int last = c == t->ncols - 1;
      size_t l = table_width(s);
      if (c) fputs("  ", f);
      if (t->right >> c & 1) table_spaces(f, w[c] - l);
      fputs(s, f);
      if (!last && !(t->right >> c & 1)) table_spaces(f, w[c] - l);
    }
    if (fclose(f)) break;
    /* a line runs no further than the terminal (a reason can run on, and a
     * wide listing's columns, nodes', add up past it), cut at a
     * character's end and marked; a pipe gets it whole */
    if (width > 0 && table_width(line) > (size_t)width) {
      size_t keep = (size_t)width > 3 ? (size_t)width - 3 : 0;
      fprintf(out, "%.*s...\n", (int)table_fit(line, keep), line);
    } else {
      fprintf(out, "%s\n", line);
    }
  }
  free(line);
}

int table_term_width(void) {
  struct winsize ws;
  if (!isatty(STDOUT_FILENO)) return 0;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

void table_secs(char *buf, size_t n, double s) {
  if (!(s > 0)) snprintf(buf, n, "-");
  else if (s < 60) snprintf(buf, n, "%.0fs", s);
  else if (s < 3600) snprintf(buf, n, "%.0fm", s / 60);
  else if (s < 48 * 3600) snprintf(buf, n, "%.0fh", s / 3600);
  else snprintf(buf, n, "%.0fd", s / 86400);
}

void table_age(char *buf, size_t n, int64_t now_ms, int64_t then_ms) {
  if (!then_ms) {
    snprintf(buf, n, "-");
    return;
  }
  /* clocks of two machines disagree a little: a time just ahead of ours is "now" */
  double s = now_ms > then_ms ? (double)(now_ms - then_ms) / 1000.0 : 0;
  if (s < 1) snprintf(buf, n, "0s");
  else table_secs(buf, n, s);
}

void table_bytes(char *buf, size_t n, uint64_t b) {
  const double mib = 1024.0 * 1024.0;
  if (b < (1ull << 30)) snprintf(buf, n, "%.1f MiB", (double)b / mib);
  else snprintf(buf, n, "%.1f GiB", (double)b / (mib * 1024.0));
}

int64_t table_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

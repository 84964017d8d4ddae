/* ini_line: job files read and written so that values survive (see ini_line.h). */
#include "daemon/common/ini_line.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"

/* One source of lines for ini_parse_stream: a file or a string. */
typedef struct ini_line_src {
  FILE *f;
  const char *text;
  char *buf; /* getline's */
  size_t cap;
  int line;  /* lines handed out */
  int stop;  /* the line that ended the parse (0: none) */
  int long_; /* ... because it was too long (else: a NUL byte in it) */
  int num;   /* the size of inih's line buffer */
} ini_line_src_t;

/* inih's reader: hands out whole lines, or ends the parse at one that would
 * be cut (inih, like fgets, would read the rest as a line of its own). */
static char *ini_line_read(char *str, int num, void *stream) {
  ini_line_src_t *s = stream;
  s->num = num;
  if (s->stop || num < 2) return NULL;
  const char *p;
  size_t len;
  if (s->f) {
    ssize_t n = getline(&s->buf, &s->cap, s->f);
    if (n < 0) return NULL;
    p = s->buf, len = (size_t)n;
  } else {
    if (!s->text || !*s->text) return NULL;
    const char *nl = strchr(s->text, '\n');
    p = s->text, len = nl ? (size_t)(nl - s->text) + 1 : strlen(s->text);
    s->text += len;
  }
  s->line++;
  const size_t whole = len;
  if (len && p[len - 1] == '\n') len--;
  if (memchr(p, 0, whole)) return s->stop = s->line, NULL; /* a file's NUL byte: the rest would be lost */
  /* an indented line is a line of its own: inih would take it for the
   * continuation of the previous key's value (`save = a.bin` then
   * `  sample_tokens = 40` saved to "a.bin sample_tokens = 40"), and no job
   * file value spans lines */
  while (len && (*p == ' ' || *p == '\t')) p++, len--;
  if (len > (size_t)num - 1) return s->stop = s->line, s->long_ = 1, NULL;
  memcpy(str, p, len);
  str[len] = 0;
  return str;
}

static char *ini_line_probe(char *str, int num, void *stream) {
  (void)str;
  *(int *)stream = num;
  return NULL;
}

int ini_line_max(void) {
  static int max; /* the library's, the same for every caller */
  if (!max) {
    int num = 0;
    (void)ini_parse_stream(ini_line_probe, &num, NULL, NULL);
    max = num > 1 ? num - 1 : 1;
  }
  return max;
}

int ini_line_parse(FILE *f, const char *text, ini_handler h, void *user, int *too_long) {
  ini_line_src_t s = {.f = f, .text = text};
  *too_long = 0;
  int rc = ini_parse_stream(ini_line_read, &s, h, user);
  free(s.buf);
  if (s.stop && rc == 0) { /* (a line refused before it is the first problem) */
    *too_long = s.long_;
    return s.stop;
  }
  return rc;
}

const char *ini_line_unquote(const char *value, char *buf, size_t cap) {
  const size_t n = strlen(value);
  if (n < 2 || value[0] != '"' || value[n - 1] != '"') return value;
  if (n - 2 >= cap) return NULL;
  memcpy(buf, value + 1, n - 2);
  buf[n - 2] = 0;
  return buf;
}

/* Whether the value must be quoted to read back as itself: inih trims spaces
 * at either end, and readers take one pair of enclosing quotes off. */
static int ini_line_quoted(const char *v) {
  const size_t n = strlen(v);
  return n && (isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1]) ||
               (n >= 2 && v[0] == '"' && v[n - 1] == '"'));
}

/* A section or key: what inih reads back as itself on its line. */
static int ini_line_word(const char *w) {
  if (!*w) return 0;
  for (const char *p = w; *p; p++)
    if (!isalnum((unsigned char)*p) && !strchr("_.-", *p)) return 0;
  return 1;
}

int ini_line_check(const char *section, const char *key, const char *value) {
  const char *sec = section && *section ? section : "";
  if (*sec && !ini_line_word(sec))
    return err_set(FSDP_EINVAL, "section [%.64s]: a section is a word (letters, digits, _ . -)", sec);
  if (!ini_line_word(key))
    return err_set(FSDP_EINVAL, "option '%.64s': a key is a word (letters, digits, _ . -)", key);
  const int q = ini_line_quoted(value);
  const size_t n = strlen(key) + 3 + strlen(value) + (q ? 2 : 0);
  if (n > (size_t)ini_line_max())
    return err_set(FSDP_EINVAL, "[%s] %s: the line `%s = ...` is %zu characters; a job file line "
                   "holds at most %d (Debian's libinih reads no more, and would cut it in "
                   "two): shorten the value (a path: a shorter directory under the root)",
                   sec, key, key, n, ini_line_max());
  for (const char *p = value; *p; p++) {
    if ((unsigned char)*p < 0x20 && *p != '\t')
      return err_set(FSDP_EINVAL, "[%s] %s: a control character at byte %zu; use plain text", sec,
                     key, (size_t)(p - value));
    /* inih ends a value at a ';' after a space (an inline comment), the
     * space after '=' too; an opening quote before it protects it */
    if (*p == ';' && (p > value ? isspace((unsigned char)p[-1]) : !q))
      return err_set(FSDP_EINVAL, "[%s] %s: a ';' at byte %zu, after a space or first, would start a "
                     "comment in the job file and end the value there; write it without the "
                     "space",
                     sec, key, (size_t)(p - value));
  }
  return FSDP_OK;
}

int ini_line_write(FILE *f, const char *section, const char *key, const char *value) {
  int rc = ini_line_check(section, key, value);
  if (rc) return rc;
  fprintf(f, ini_line_quoted(value) ? "%s = \"%s\"\n" : "%s = %s\n", key, value);
  return FSDP_OK;
}

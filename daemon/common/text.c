/* text: control characters shown as text (text.h). */
#include "daemon/common/text.h"

#include <stdio.h>
#include <string.h>
#include <unistr.h>

#include "daemon/common/err.h"

int text_control(uint32_t u) {
  return (u < 0x20 && u != '\t') || (u >= 0x7f && u < 0xa0) || u == 0x61c || u == 0x200e ||
         u == 0x200f || (u >= 0x202a && u <= 0x202e) || (u >= 0x2066 && u <= 0x2069);
}

size_t text_escape(char *out, const char *s, size_t n, unsigned flags, size_t *used) {
  const uint8_t *p = (const uint8_t *)s;
  size_t i = 0, w = 0;
  while (i < n) {
    ucs4_t u;
    const int len = u8_mbtoucr(&u, p + i, n - i); /* -1 invalid, -2 cut at the end */
    if (len == -2 && used) break;
    if (len < 0) {
      w += (size_t)sprintf(out + w, "\\x%02x", p[i++]);
    } else if (u == '\r' && (flags & TEXT_KEEP_NL)) {
      if (i + 1 == n && used) break; /* a CRLF may be cut here: left for the next piece */
      if (i + 1 == n || p[i + 1] != '\n') out[w++] = '\n'; /* a return alone: a line end */
      i++;
    } else if (text_control(u) && !(u == '\n' && (flags & TEXT_KEEP_NL))) {
      w += (size_t)sprintf(out + w, u < 0x80 ? "\\x%02x" : "\\u%04x", (unsigned)u);
      i += (size_t)len;
    } else {
      for (int k = 0; k < len; k++) out[w++] = (char)p[i++];
    }
  }
  out[w] = 0;
  if (used) *used = i;
  return w;
}

int text_plain(const char *what, const char *s, size_t max) {
  const size_t n = strlen(s);
  if (n > max) return err_set(FSDP_EINVAL, "%s: %zu bytes; at most %zu", what, n, max);
  const uint8_t *bad = u8_check((const uint8_t *)s, n);
  if (bad)
    return err_set(FSDP_EINVAL, "%s: not UTF-8 at byte %zu; send text in UTF-8", what,
                   (size_t)(bad - (const uint8_t *)s));
  ucs4_t u;
  for (const uint8_t *p = (const uint8_t *)s, *next; (next = u8_next(&u, p)) != NULL; p = next)
    if (text_control(u))
      return err_set(FSDP_EINVAL, "%s: a control character (U+%04X) at byte %zu; use plain text",
                     what, (unsigned)u, (size_t)(p - (const uint8_t *)s));
  return FSDP_OK;
}

char *text_clip(char *out, size_t n, const char *s, size_t max) {
  if (!n) return out;
  size_t len = strlen(s), cut = len;
  if (len > max) {
    cut = max;
    while (cut && ((unsigned char)s[cut] & 0xc0) == 0x80) cut--; /* not inside a sequence */
    size_t sp = cut;
    while (sp > max / 2 && s[sp - 1] != ' ') sp--;
    if (sp > max / 2) cut = sp - 1; /* before the space */
  }
  snprintf(out, n, "%.*s%s", (int)cut, s, cut < len ? "..." : "");
  return out;
}

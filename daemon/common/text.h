/* text: what of text from elsewhere (a server's reply, a node's report) may
 * reach a terminal as it is. One definition of a control character, which
 * the coordinator refuses in what users send and mends in what nodes
 * report, and fsdpctl escapes in everything it prints from a reply, for it
 * trusts no server: a node's hostname or a job's reason could otherwise
 * carry escape sequences that retitle, clear or rewrite the user's terminal.
 * In the wire library (libfsdp_rpc): what links it and calls these links
 * libunistring too. */
#ifndef FSDP_TEXT_H
#define FSDP_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* text_escape: '\n' passes (text of several lines, a log), and so does '\r'
 * as a line end: "\r\n" becomes "\n", a '\r' alone (a progress bar's
 * return, which could otherwise overwrite what a line showed) "\n" too. */
#define TEXT_KEEP_NL 1u
/* The most bytes text_escape writes for n bytes, its NUL included. */
#define TEXT_ESCAPED_MAX(n) (4 * (n) + 1)

/* 1 when a terminal may act on code point u rather than show it: a C0
 * control but tab, DEL, a C1 control (0x9b is an 8-bit CSI, an escape
 * sequence's start), or a bidirectional override, embedding, isolate or
 * mark (U+202E makes a line read backwards). */
int text_control(uint32_t u);

/* The n bytes at s into out (TEXT_ESCAPED_MAX(n) bytes), NUL-terminated,
 * as plain text: a control character (text_control, and '\n' and '\r'
 * unless flags has TEXT_KEEP_NL) becomes "\xHH" below U+0080, "\uHHHH" from
 * there, and a byte that is not part of valid UTF-8 "\xHH"; the rest is
 * copied. With used, a UTF-8 sequence cut at the end of s (or a '\r' there,
 * with TEXT_KEEP_NL) is left for the caller to
 * prepend to what comes next (a stream's next chunk) and *used says how
 * many bytes were taken; without, it is escaped like an invalid byte.
 * Returns the length written. */
size_t text_escape(char *out, const char *s, size_t n, unsigned flags, size_t *used);

/* FSDP_OK when s is plain text of at most max bytes: UTF-8 with no control
 * character (text_control); else FSDP_EINVAL naming what, the byte and the
 * fix. What the coordinator takes from a request (text that could break
 * the stored INI, a log line or a client; strings on the wire are UTF-8:
 * protobuf's Python and Go runtimes refuse a message holding anything else,
 * so one job named in Latin-1 would break every such client's job
 * listing), and what fsdpd checks of its own name before it sends it. */
int text_plain(const char *what, const char *s, size_t max);

/* s into out (n bytes, NUL-terminated), cut to at most max bytes of it:
 * when it is longer, at the last space within them (mid-word only when a
 * word alone is longer than half of max), never inside a UTF-8 sequence,
 * and "..." after the cut. Returns out. For long text quoted in a line (a
 * rank's last log line inside a job's reason). */
char *text_clip(char *out, size_t n, const char *s, size_t max);

/* The most bytes of a node's name and of its address the coordinator takes
 * (store.h's STORE_NAME_MAX and STORE_ADDR_MAX less their NUL). */
#define TEXT_NODE_NAME_MAX 127
#define TEXT_NODE_ADDR_MAX 255

#endif

/* ini_line: job files (INI) read and written so that a value means the same
 * thing at every hop. A job's options travel as `key = value` lines: from
 * fsdpctl's job file, through the coordinator's store, to fsdpd's rank job
 * file that fsdp-train reads. Debian's libinih reads each line into a fixed
 * buffer (INI_MAX_LINE, 200 bytes) and cuts a longer one in two, the rest
 * read as a line of its own: a value of 250 characters ending in
 * "save = /elsewhere" would become a second option nobody validated. It also
 * trims spaces around a value and takes " ;" as the start of a comment.
 *
 * So every reader here refuses a line longer than libinih takes, and every
 * writer writes a value so that it reads back as itself (quoted where spaces
 * at either end or quotes would be lost) or refuses it, naming the option
 * and the fix. Readers unquote one pair of double quotes. */
#ifndef FSDP_INI_LINE_H
#define FSDP_INI_LINE_H

#include <ini.h>
#include <stddef.h>
#include <stdio.h>

/* The longest line libinih takes whole (characters, without the newline). */
int ini_line_max(void);

/* ini_parse_file (f) or ini_parse_string (text, f NULL), but a line longer
 * than ini_line_max() ends the parse: it returns that line's number with
 * *too_long set (else inih's result: 0, the first bad line, or < 0). */
int ini_line_parse(FILE *f, const char *text, ini_handler h, void *user, int *too_long);

/* value without one pair of enclosing double quotes: value itself, or a
 * copy in buf (cap bytes; NULL when it does not fit). */
const char *ini_line_unquote(const char *value, char *buf, size_t cap);

/* Whether `key = value` (value quoted as ini_line_write would) reads back as
 * key and value: FSDP_OK, or FSDP_EINVAL naming [section] key and the fix
 * (too long, a control character, " ;" starting a comment). */
int ini_line_check(const char *section, const char *key, const char *value);

/* Writes `key = value\n`, the value quoted where it must be; the check
 * above first (nothing is written when it fails). */
int ini_line_write(FILE *f, const char *section, const char *key, const char *value);

#endif

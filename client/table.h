/* table: fsdpctl's one printer of human tables, and the formats its cells
 * share (ages, sizes). Every command that lists things builds a table_t and
 * prints it here, so columns line up the same way everywhere.
 *
 * A table owns copies of its cells. Columns are as wide as their widest
 * cell, in a terminal's columns, not bytes (UTF-8 through libunistring: a
 * CJK character takes two, a combining accent none); numbers can be
 * right-aligned; a line is cut to the terminal's width when stdout is a
 * terminal (a reason or a path can be long, a wide listing's columns add
 * up), at a character's end so the line stays valid UTF-8, never when it is
 * a pipe: scripts get every byte. */
#ifndef FSDP_CLIENT_TABLE_H
#define FSDP_CLIENT_TABLE_H

#include <stdint.h>
#include <stdio.h>

#define TABLE_MAX_COLS 12

typedef struct table table_t;

/* A table with the given column headers (NULL-terminated, at most
 * TABLE_MAX_COLS; all "" : a table without a header line, for key-value
 * blocks). right: bit i set right-aligns column i. NULL when out of memory. */
table_t *table_create(unsigned right, const char *const *headers);
void table_destroy(table_t *t);
/* Appends a cell to the current row (a new row after the last column):
 * newlines and tabs made spaces, other control characters escaped
 * (text_escape), for cells hold a server's strings. Returns 0 or
 * FSDP_ENOMEM. */
int table_cell(table_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Columns at least widths[i] wide; table_print writes back the widths it
 * used, so a table printed a page at a time (events --follow) keeps its
 * columns where they were. widths: TABLE_MAX_COLS of them, zeros at first;
 * it must outlive t. */
void table_keep_widths(table_t *t, size_t *widths);
/* Prints the headers and the rows. width: the terminal's columns (0: no cut). */
void table_print(const table_t *t, FILE *out, int width);

/* Columns of the terminal stdout is, or 0 when stdout is not a terminal. */
int table_term_width(void);
/* An age in whole units ("12s", "3m", "5h", "2d"); "-" when ms_then is 0
 * (never happened). now_ms: the current Unix time in ms. */
void table_age(char *buf, size_t n, int64_t now_ms, int64_t ms_then);
/* A duration in seconds the same way (for ETAs); "-" when secs <= 0. */
void table_secs(char *buf, size_t n, double secs);
/* Bytes as "512.0 MiB" below a GiB, "12.5 GiB" from there on. */
void table_bytes(char *buf, size_t n, uint64_t bytes);
/* The current Unix time in ms. */
int64_t table_now_ms(void);

#endif

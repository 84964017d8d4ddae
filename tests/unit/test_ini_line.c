/* test_ini_line: job file lines (daemon/common/ini_line.h) against the
 * libinih Debian ships: every value a writer accepts reads back as itself,
 * through the same parser the coordinator, fsdpd's ranks and fsdpctl use;
 * what cannot is refused naming the option; and a line too long for
 * libinih's buffer ends the parse instead of being cut into two options. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/common/ini_line.h"

typedef struct got {
  int n;
  char section[8][64], key[8][64], value[8][1024];
} got_t;

static int got_cb(void *user, const char *section, const char *key, const char *value) {
  got_t *g = user;
  if (g->n == 8) return 0;
  char unq[1024];
  const char *v = ini_line_unquote(value, unq, sizeof unq);
  cr_assert_not_null(v);
  snprintf(g->section[g->n], sizeof g->section[0], "%s", section);
  snprintf(g->key[g->n], sizeof g->key[0], "%s", key);
  snprintf(g->value[g->n], sizeof g->value[0], "%s", v);
  g->n++;
  return 1;
}

/* text parsed through a FILE (as job files are) and as a string (as the
 * coordinator's store is): both the same, *too_long as they say */
static int parse_both(const char *text, got_t *g, int *too_long) {
  FILE *f = fmemopen((void *)text, strlen(text), "r");
  cr_assert_not_null(f);
  got_t gf = {0};
  int tf, rf = ini_line_parse(f, NULL, got_cb, &gf, &tf);
  fclose(f);
  memset(g, 0, sizeof *g);
  int rs = ini_line_parse(NULL, text, got_cb, g, too_long);
  cr_assert_eq(rf, rs, "file %d, string %d", rf, rs);
  cr_assert_eq(tf, *too_long);
  cr_assert_eq(gf.n, g->n);
  return rs;
}

Test(ini_line, the_longest_line_is_debians_libinih_buffer_less_its_nul) {
  cr_assert_eq(ini_line_max(), 199, "Debian's libinih 55 reads lines of 200 bytes: %d", ini_line_max());
}

Test(ini_line, values_read_back_as_written) {
  char at_limit[256];
  const int room = ini_line_max() - (int)strlen("k = ");
  memset(at_limit, 'v', (size_t)room);
  at_limit[room] = 0;
  const char *vals[] = {"plain", "", "  two spaces before", "after  ", "\"quoted\"", "\"",
                        "\"half", "a;b", "x=y:z", "tab\tinside", "# not a comment",
                        "\xc3\xa9t\xc3\xa9", at_limit};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fprintf(f, "[output]\n");
    cr_assert_eq(ini_line_write(f, "output", "k", vals[i]), FSDP_OK, "'%s': %s", vals[i], err_msg());
    fclose(f);
    got_t g;
    int too_long;
    cr_assert_eq(parse_both(text, &g, &too_long), 0, "'%s' as %s", vals[i], text);
    cr_assert_eq(g.n, 1);
    cr_assert_str_eq(g.section[0], "output");
    cr_assert_str_eq(g.key[0], "k");
    cr_assert_str_eq(g.value[0], vals[i], "written as %s", text);
    free(text);
  }
}

Test(ini_line, what_would_not_read_back_is_refused_naming_it) {
  char big[256];
  const int room = ini_line_max() - (int)strlen("sample_prompt = ");
  memset(big, 'A', (size_t)room + 1);
  big[room + 1] = 0;
  cr_assert_eq(ini_line_check("output", "sample_prompt", big), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "[output] sample_prompt") && strstr(err_msg(), "at most 199"),
            "%s", err_msg());
  big[room] = 0;
  cr_assert_eq(ini_line_check("output", "sample_prompt", big), FSDP_OK, "%s", err_msg());
  /* the quotes a value needs count: one space more is two characters more */
  big[room - 1] = ' ';
  cr_assert_eq(ini_line_check("output", "sample_prompt", big), FSDP_EINVAL);
  const char *comments[] = {"a ;b", "a\t;b", ";b", " ;b"};
  for (size_t i = 0; i < 4; i++) {
    cr_assert_eq(ini_line_check("output", "k", comments[i]), FSDP_EINVAL, "'%s'", comments[i]);
    cr_assert(strstr(err_msg(), "comment"), "%s", err_msg());
  }
  cr_assert_eq(ini_line_check("", "k", "a\nsave = /x"), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "control character at byte 1"), "%s", err_msg());
  cr_assert_eq(ini_line_check("", "k=v", "x"), FSDP_EINVAL);
  cr_assert_eq(ini_line_check("a]b", "k", "x"), FSDP_EINVAL);
  /* nothing is written for a refused value */
  char buf[64] = "";
  FILE *f = fmemopen(buf, sizeof buf, "w");
  cr_assert_eq(ini_line_write(f, "", "k", "a ;b"), FSDP_EINVAL);
  fclose(f);
  cr_assert_str_eq(buf, "");
}

/* The attack the limit stops: a value of 183 characters followed by an
 * option of its own. libinih alone reads two options; here the parse ends
 * at that line and the second never reaches the handler. */
Test(ini_line, a_line_too_long_ends_the_parse_instead_of_becoming_two) {
  char text[512];
  snprintf(text, sizeof text, "[output]\nsteps = 3\nsample_prompt = %.183s%s\nmore = 1\n",
           "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
           "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
           "AAAAAAAAAAA",
           "save = /elsewhere/pwned.bin");
  got_t plain = {0};
  cr_assert_eq(ini_parse_string(text, got_cb, &plain), 0);
  int split = 0;
  for (int i = 0; i < plain.n; i++) split |= !strcmp(plain.key[i], "save");
  cr_assert(split, "libinih no longer cuts long lines: the reason for ini_line is gone");
  got_t g;
  int too_long;
  cr_assert_eq(parse_both(text, &g, &too_long), 3);
  cr_assert(too_long);
  cr_assert_eq(g.n, 1, "only the line before it was read");
  cr_assert_str_eq(g.key[0], "steps");
  /* a NUL byte in a file's line ends it too (the rest of the line would be lost) */
  const char nul[] = "a = 1\nb = x\0y\nc = 2\n";
  FILE *f = fmemopen((void *)nul, sizeof nul - 1, "r");
  memset(&g, 0, sizeof g);
  cr_assert_eq(ini_line_parse(f, NULL, got_cb, &g, &too_long), 2);
  fclose(f);
  cr_assert(!too_long);
  cr_assert_eq(g.n, 1);
}

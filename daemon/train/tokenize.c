/* fsdp-tokenize: turns text files into a token file for fsdp-train.
 *
 * The tokenizer is byte-level: every byte of the (UTF-8) input is one token id
 * in 0..255, so a model trained on the result needs vocab >= 256 and no outside
 * tokenizer or vocabulary file. The inputs are concatenated in the order given,
 * with an optional separator between files; the file format and its atomic
 * write belong to daemon/train/data.c (data_write). The tokens are held in
 * memory (2 bytes per input byte) because the file's header carries the count
 * and data_write writes a whole file at once; the demo corpora are a few MB. */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/train/data.h"

#define TOK_MAX_TOKENS ((size_t)INT32_MAX) /* the header's count is an int32 */

typedef struct tok_buf {
  uint16_t *ids; /* (cap) */
  size_t n, cap;
} tok_buf_t;

#define TOK_USAGE "usage: fsdp-tokenize -o OUT.bin [--separator TEXT] FILE...\n"

/* Bad usage: the synopsis and where the rest is, not the whole help. */
static int tok_bad_usage(void) {
  fputs(TOK_USAGE "Try 'fsdp-tokenize --help' for more.\n", stderr);
  return 2;
}

static void tok_usage(FILE *f) {
  fprintf(f,
          TOK_USAGE
          "\n"
          "Writes the bytes of the FILEs (concatenated in order; '-' reads stdin) as a\n"
          "token file for fsdp-train, one token per byte (vocab 256).\n"
          "\n"
          "  -o, --output OUT.bin     token file to write (replaced atomically)\n"
          "  -s, --separator TEXT     bytes put between consecutive files\n"
          "                           (e.g. --separator $'\\n\\n' in bash)\n"
          "  -h, --help               print this help and exit\n");
}

/* Appends n bytes as token ids; refuses to grow past what the header can count. */
static int tok_append(tok_buf_t *b, const unsigned char *p, size_t n, const char *what) {
  if (n > TOK_MAX_TOKENS - b->n)
    return err_set(FSDP_ERANGE,
                   "%s: the input passes %zu tokens, the most one token file holds; split it "
                   "into several files",
                   what, TOK_MAX_TOKENS);
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->n + n) cap *= 2;
    uint16_t *ids = realloc(b->ids, cap * sizeof *ids);
    if (!ids) return err_set(FSDP_ENOMEM, "%s: out of memory after %zu tokens", what, b->n);
    b->ids = ids;
    b->cap = cap;
  }
  for (size_t i = 0; i < n; i++) b->ids[b->n + i] = p[i];
  b->n += n;
  return FSDP_OK;
}

static int tok_read_file(tok_buf_t *b, const char *path) {
  int is_stdin = strcmp(path, "-") == 0;
  const char *name = is_stdin ? "stdin" : path;
  FILE *f = is_stdin ? stdin : fopen(path, "rb");
  if (!f) {
    int e = errno;
    return err_set(err_from_errno(e), "%s: cannot open: %s", name, strerror(e));
  }
  unsigned char buf[1 << 16];
  int rc = FSDP_OK;
  size_t r;
  while ((r = fread(buf, 1, sizeof buf, f)) > 0)
    if ((rc = tok_append(b, buf, r, name)) != FSDP_OK) break;
  if (rc == FSDP_OK && ferror(f)) {
    int e = errno;
    rc = err_set(err_from_errno(e), "%s: read failed: %s", name, strerror(e));
  }
  if (!is_stdin) fclose(f);
  return rc;
}

/* The output checked before any input is read: a directory, a device or a
 * FIFO (which the final rename would replace, or fail on, only after
 * reading everything: file_output_check), or one of the inputs (the same
 * file by device and inode: it would be replaced by its own tokens). */
static int tok_check_output(const char *out, char **inputs, int n) {
  int rc = file_output_check("-o", out, "tokens.bin");
  if (rc || access(out, F_OK)) return rc; /* a new file: data_write says if it cannot be made */
  for (int i = 0; i < n; i++)
    if (strcmp(inputs[i], "-") && file_same(out, inputs[i]))
      return err_set(FSDP_EINVAL, "-o %s is the input %s: it would be replaced by its tokens; "
                     "give another output path", out, inputs[i]);
  return FSDP_OK;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"output", required_argument, NULL, 'o'},
      {"separator", required_argument, NULL, 's'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *out = NULL, *sep = NULL;
  int c;
  while ((c = getopt_long(argc, argv, "o:s:h", opts, NULL)) != -1) {
    switch (c) {
    case 'o': out = optarg; break;
    case 's': sep = optarg; break;
    case 'h': tok_usage(stdout); return 0;
    default: return tok_bad_usage(); /* getopt has printed what was wrong */
    }
  }
  if (!out || !*out) {
    fprintf(stderr, "fsdp-tokenize: no output file: give -o OUT.bin\n");
    return tok_bad_usage();
  }
  if (optind >= argc) {
    fprintf(stderr, "fsdp-tokenize: no input files: give one or more FILEs ('-' for stdin)\n");
    return tok_bad_usage();
  }

  tok_buf_t b = {0};
  int nfiles = argc - optind;
  int rc = tok_check_output(out, argv + optind, nfiles);
  for (int i = optind; i < argc && rc == FSDP_OK; i++) {
    if (i > optind && sep && *sep)
      rc = tok_append(&b, (const unsigned char *)sep, strlen(sep), "--separator");
    if (rc == FSDP_OK) rc = tok_read_file(&b, argv[i]);
  }
  if (rc == FSDP_OK && b.n == 0)
    rc = err_set(FSDP_EINVAL,
                 "the input (%d file%s) holds no bytes: nothing to train on; %s not written",
                 nfiles, nfiles == 1 ? "" : "s", out);
  if (rc == FSDP_OK) rc = data_write_for(out, b.ids, b.n, 256); /* bytes */
  free(b.ids);
  if (rc != FSDP_OK) {
    fprintf(stderr, "fsdp-tokenize: %s\n", err_msg());
    return 1;
  }
  printf("tokenize: %zu tokens from %d files -> %s\n", b.n, nfiles, out);
  return 0;
}

/* test_data: token files (every way a file is refused, and what the message
 * says) and batches (determinism, resume, epoch coverage, the held-out split),
 * and the atomic write under a missing directory and a full disk. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/train/data.h"
#include "tests/unit/testutil.h"

#define HDR_BYTES (DATA_HEADER_INTS * 4)

#define assert_msg_has(s)                                                                 \
  cr_assert(strstr(err_msg(), (s)) != NULL, "message lacks \"%s\": %s", (s), err_msg())

/* A file of n tokens whose id is the token's position (unique below 65536),
 * through data_write. Returns the path (caller frees). */
static char *make_seq_file(const char *name, size_t n) {
  uint16_t *t = malloc(n * sizeof *t + 1);
  cr_assert_not_null(t);
  for (size_t i = 0; i < n; i++) t[i] = (uint16_t)i;
  char *p = tu_path(name);
  cr_assert_eq(data_write(p, t, n), FSDP_OK, "%s", err_msg());
  free(t);
  return p;
}

/* Crafts a file byte by byte: header {magic, version, count}, then ntok ids from ids. */
static char *make_raw_file(const char *name, int32_t magic, int32_t version, int32_t count,
                           const uint16_t *ids, size_t ntok, size_t total_bytes) {
  size_t full = HDR_BYTES + 2 * ntok;
  unsigned char *buf = calloc(1, full > total_bytes ? full : total_bytes);
  cr_assert_not_null(buf);
  int32_t h[3] = {magic, version, count};
  memcpy(buf, h, sizeof h); /* the test machines are little-endian like the format */
  if (ntok) memcpy(buf + HDR_BYTES, ids, 2 * ntok);
  char *p = tu_path(name);
  tu_write_file(p, buf, total_bytes);
  free(buf);
  return p;
}

static int exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* Whether a directory holds an entry whose name contains s. */
static int dir_has(const char *dir, const char *s) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "opendir %s", dir);
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strstr(e->d_name, s)) found = 1;
  closedir(d);
  return found;
}

/* ---- refused files: one test per way ---- */

Test(data, missing_file) {
  char *p = tu_path("nope.bin");
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_ENOENT);
  cr_assert_null(d);
  assert_msg_has(p);
  assert_msg_has("No such file");
  assert_msg_has("fsdp-tokenize");
  free(p);
}

Test(data, truncated_header) {
  char *p = make_raw_file("short.bin", DATA_MAGIC, DATA_VERSION, 0, NULL, 0, 100);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_EFORMAT);
  cr_assert_null(d);
  assert_msg_has(p);
  assert_msg_has("truncated");
  assert_msg_has("100 bytes");
  assert_msg_has("1024-byte header");
  free(p);
}

Test(data, truncated_body) {
  uint16_t ids[50] = {0};
  /* header says 100 tokens (1224 bytes), 50 are there (1124 bytes) */
  char *p = make_raw_file("cut.bin", DATA_MAGIC, DATA_VERSION, 100, ids, 50, HDR_BYTES + 100);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_EFORMAT);
  assert_msg_has(p);
  assert_msg_has("truncated");
  assert_msg_has("1224 bytes expected");
  assert_msg_has("has 1124");
  free(p);
}

Test(data, trailing_garbage) {
  uint16_t ids[12] = {0};
  /* header says 10 tokens (1044 bytes), 12 are there (1048 bytes) */
  char *p = make_raw_file("long.bin", DATA_MAGIC, DATA_VERSION, 10, ids, 12, HDR_BYTES + 24);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_EFORMAT);
  assert_msg_has(p);
  assert_msg_has("trailing garbage");
  assert_msg_has("1044 bytes expected");
  assert_msg_has("has 1048");
  free(p);
}

Test(data, bad_magic) {
  uint16_t ids[20] = {0};
  char *p = make_raw_file("magic.bin", 20240326, DATA_VERSION, 20, ids, 20, HDR_BYTES + 40);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_EFORMAT);
  assert_msg_has(p);
  assert_msg_has("not a token file");
  assert_msg_has("20240326");
  assert_msg_has("fsdp-tokenize");
  free(p);
}

Test(data, bad_version) {
  uint16_t ids[20] = {0};
  char *p = make_raw_file("ver.bin", DATA_MAGIC, 2, 20, ids, 20, HDR_BYTES + 40);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_EFORMAT);
  assert_msg_has(p);
  assert_msg_has("version 2");
  assert_msg_has("reads version 1");
  free(p);
}

Test(data, negative_count) {
  char *p = make_raw_file("neg.bin", DATA_MAGIC, DATA_VERSION, -5, NULL, 0, HDR_BYTES);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_EFORMAT);
  assert_msg_has(p);
  assert_msg_has("-5");
  assert_msg_has("negative");
  free(p);
}

Test(data, not_a_regular_file) {
  data_t *d = NULL;
  const char *dir = tu_tmpdir();
  cr_assert_eq(data_open(&d, dir, 256, 0, 8), FSDP_EINVAL);
  assert_msg_has(dir);
  assert_msg_has("not a regular file");
}

Test(data, token_id_at_or_above_vocab) {
  uint16_t ids[100];
  for (int i = 0; i < 100; i++) ids[i] = (uint16_t)(i % 200);
  ids[37] = 300; /* the first bad one */
  ids[60] = 256;
  ids[80] = 999; /* the largest */
  char *p = make_raw_file("vocab.bin", DATA_MAGIC, DATA_VERSION, 100, ids, 100, HDR_BYTES + 200);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_ERANGE);
  cr_assert_null(d);
  assert_msg_has(p);
  assert_msg_has("token id 300 at position 37");
  assert_msg_has("byte 1098");
  assert_msg_has("vocab 256");
  assert_msg_has("at least 1000");
  /* the same file is fine for a model with a large enough vocabulary */
  cr_assert_eq(data_open(&d, p, 1000, 0, 8), FSDP_OK, "%s", err_msg());
  data_close(d);
  free(p);
}

/* Ids are checked in 1 MiB pieces at open: a bad one far into a file is
 * found at its exact position, and one in the file's last token too. */
Test(data, a_bad_id_past_the_first_piece_is_found_where_it_is) {
  const size_t n = 1300000; /* 2.6 MB of ids: three pieces */
  uint16_t *t = calloc(n, sizeof *t);
  cr_assert_not_null(t);
  for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(i % 251);
  const size_t at[2] = {1048577 / 2 + 3, n - 1}; /* in the second piece; the last token */
  for (int k = 0; k < 2; k++) {
    t[at[k]] = 4000;
    char *p = tu_path(k ? "last.bin" : "far.bin");
    cr_assert_eq(data_write(p, t, n), FSDP_OK, "%s", err_msg());
    data_t *d = NULL;
    cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_ERANGE, "token %zu = 4000 passed", at[k]);
    char want[64];
    snprintf(want, sizeof want, "token id 4000 at position %zu ", at[k]);
    assert_msg_has(want);
    t[at[k]] = 7;
    free(p);
  }
  free(t);
}

/* The tokens stay in the file: opening a 16 MB corpus takes a bounded
 * amount of memory (the 1 MiB checking buffer, then one window), not a
 * copy of it. */
Test(data, a_corpus_is_read_from_its_file_not_copied_into_memory) {
  char *p = make_seq_file("big.bin", 8u << 20);
  struct mallinfo2 m0 = mallinfo2();
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0.1, 64), FSDP_OK, "%s", err_msg());
  int32_t in[4 * 64], tg[4 * 64];
  data_pos_t pos = {0, 0};
  cr_assert_eq(data_next_batch(d, &pos, 5, 4, 64, in, tg), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_eval_batch(d, 0, 4, 64, in, tg), FSDP_OK, "%s", err_msg());
  struct mallinfo2 m1 = mallinfo2();
  const size_t held = (m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd);
  /* the permutation of 117,964 training windows is 4 bytes each */
  cr_assert_lt(held, 1u << 20, "open and two batches hold %zu bytes of heap", held);
  data_close(d);
  free(p);
}

/* A run keeps the file it opened: one replaced by a rename (as data_write
 * and fsdp-tokenize do) changes nothing; one cut short or rewritten in
 * place is an error at the next batch, naming the file, never a crash. */
Test(data, a_file_changed_under_a_run_never_crashes_it) {
  const int B = 2, T = 16;
  char *p = make_seq_file("live.bin", 4000); /* id == position */
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 4000, 0.1, T), FSDP_OK, "%s", err_msg());
  int32_t in[2 * 16], tg[2 * 16];
  data_pos_t pos = {0, 0};
  /* replaced by a rename: the batches still come from the old file */
  uint16_t *z = calloc(4000, sizeof *z);
  cr_assert_not_null(z);
  cr_assert_eq(data_write(p, z, 4000), FSDP_OK, "%s", err_msg());
  free(z);
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(data_next_batch(d, &pos, 9, B, T, in, tg), FSDP_OK, "%s", err_msg());
    for (int i = 0; i < B * T; i++) cr_assert_eq(tg[i], in[i] + 1, "the renamed-over file was read");
  }
  data_close(d);
  /* rewritten in place with an id past the vocabulary */
  cr_assert_eq(data_open(&d, p, 4000, 0.1, T), FSDP_OK, "%s", err_msg());
  FILE *f = fopen(p, "r+b");
  cr_assert_not_null(f);
  uint16_t big[4000];
  for (int i = 0; i < 4000; i++) big[i] = 65000;
  cr_assert_eq(fseek(f, HDR_BYTES, SEEK_SET), 0);
  cr_assert_eq(fwrite(big, 2, 4000, f), 4000);
  fclose(f);
  pos = (data_pos_t){0, 0};
  cr_assert_eq(data_next_batch(d, &pos, 9, B, T, in, tg), FSDP_EFORMAT);
  assert_msg_has(p);
  assert_msg_has("token id 65000");
  assert_msg_has("rewritten in place");
  cr_assert_eq(data_eval_batch(d, 0, B, T, in, tg), FSDP_EFORMAT);
  data_close(d);
  /* rewritten in place with other ids all below the vocabulary (cp over it):
   * read ids alone cannot tell, the modification time does (the file's is
   * set an hour back first, so a clock's coarse tick cannot hide the write) */
  const struct timespec old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
  cr_assert_eq(utimensat(AT_FDCWD, p, old, 0), 0);
  cr_assert_eq(data_open(&d, p, 65536, 0.1, T), FSDP_OK, "%s", err_msg());
  pos = (data_pos_t){0, 0};
  cr_assert_eq(data_next_batch(d, &pos, 9, B, T, in, tg), FSDP_OK, "%s", err_msg());
  f = fopen(p, "r+b");
  cr_assert_not_null(f);
  for (int i = 0; i < 4000; i++) big[i] = (uint16_t)(i % 7);
  cr_assert_eq(fseek(f, HDR_BYTES, SEEK_SET), 0);
  cr_assert_eq(fwrite(big, 2, 4000, f), 4000);
  fclose(f);
  cr_assert_eq(data_next_batch(d, &pos, 9, B, T, in, tg), FSDP_EFORMAT);
  assert_msg_has(p);
  assert_msg_has("written since the run opened it");
  cr_assert_eq(data_eval_batch(d, 0, B, T, in, tg), FSDP_EFORMAT);
  /* cut short in place */
  cr_assert_eq(truncate(p, HDR_BYTES + 2 * 100), 0);
  cr_assert_eq(data_eval_batch(d, 0, B, T, in, tg), FSDP_EIO);
  assert_msg_has(p);
  assert_msg_has("cut short since the run opened it");
  data_close(d);
  free(p);
}

Test(data, eval_fraction_out_of_range) {
  char *p = make_seq_file("evalfrac.bin", 1000);
  const double bad[] = {0.6, -0.1, NAN, INFINITY};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    data_t *d = NULL;
    cr_assert_eq(data_open(&d, p, 65536, bad[i], 8), FSDP_ERANGE, "eval_fraction %g", bad[i]);
    cr_assert_null(d);
    assert_msg_has("eval_fraction");
    assert_msg_has("[0, 0.5]");
  }
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0.5, 8), FSDP_OK, "%s", err_msg());
  data_close(d);
  free(p);
}

Test(data, too_few_tokens_for_one_window) {
  char *p = make_seq_file("tiny.bin", 64);
  data_t *d = NULL;
  /* 64 tokens, T = 64: a window needs 65 */
  cr_assert_eq(data_open(&d, p, 65536, 0, 64), FSDP_EINVAL);
  cr_assert_null(d);
  assert_msg_has(p);
  assert_msg_has("64 tokens");
  assert_msg_has("seq_len 64 needs 65 tokens");
  /* one token more is exactly one window */
  free(p);
  p = make_seq_file("tiny65.bin", 65);
  cr_assert_eq(data_open(&d, p, 65536, 0, 64), FSDP_OK, "%s", err_msg());
  data_close(d);
  free(p);
}

Test(data, eval_split_too_small) {
  char *p = make_seq_file("smalleval.bin", 200);
  data_t *d = NULL;
  /* 10% of 200 = 20 tokens held out, a window at T = 32 needs 33 */
  cr_assert_eq(data_open(&d, p, 65536, 0.1, 32), FSDP_EINVAL);
  assert_msg_has(p);
  assert_msg_has("eval_fraction 0.1");
  assert_msg_has("needs 33 tokens");
  assert_msg_has("at least 640 tokens");
  /* the bound the message gives is enough */
  free(p);
  p = make_seq_file("enougheval.bin", 640);
  cr_assert_eq(data_open(&d, p, 65536, 0.1, 32), FSDP_OK, "%s", err_msg());
  cr_assert_geq(data_eval_num_batches(d, 1, 32), 1);
  data_close(d);
  free(p);
}

Test(data, too_few_windows_for_batch) {
  char *p = make_seq_file("fewwin.bin", 25); /* T = 8: windows [0,8] [8,16] [16,24] */
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0, 8), FSDP_OK, "%s", err_msg());
  int32_t in[4 * 8], tg[4 * 8];
  data_pos_t pos = {0, 0};
  cr_assert_eq(data_next_batch(d, &pos, 1, 4, 8, in, tg), FSDP_EINVAL);
  assert_msg_has(p);
  assert_msg_has("global batch of 4 (batch x ranks)");
  assert_msg_has("holds 3");
  cr_assert_eq(data_next_batch(d, &pos, 1, 3, 8, in, tg), FSDP_OK, "%s", err_msg());
  data_close(d);
  free(p);
}

/* ---- behaviour ---- */

Test(data, write_read_round_trip) {
  size_t n = 5000;
  uint16_t *t = malloc(n * sizeof *t);
  uint64_t s = 7;
  for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(tu_rand_u64(&s) & 0xffff);
  t[0] = 0xffff; /* the largest id survives */
  char *p = tu_path("rt.bin");
  cr_assert_eq(data_write(p, t, n), FSDP_OK, "%s", err_msg());
  cr_assert_not(dir_has(tu_tmpdir(), ".tmp."), "temporary file left behind");

  /* the bytes are the llm.c layout */
  FILE *f = fopen(p, "rb");
  cr_assert_not_null(f);
  int32_t h[DATA_HEADER_INTS];
  cr_assert_eq(fread(h, 4, DATA_HEADER_INTS, f), DATA_HEADER_INTS);
  cr_assert_eq(h[0], DATA_MAGIC);
  cr_assert_eq(h[1], DATA_VERSION);
  cr_assert_eq(h[2], (int32_t)n);
  for (int i = 3; i < DATA_HEADER_INTS; i++) cr_assert_eq(h[i], 0);
  uint16_t *back = malloc(n * sizeof *back);
  cr_assert_eq(fread(back, 2, n, f), n);
  cr_assert_eq(fgetc(f), EOF);
  fclose(f);
  cr_assert_eq(memcmp(back, t, n * 2), 0);

  /* and data_open reads back the same tokens, window by window */
  data_t *d = NULL;
  int T = 10;
  cr_assert_eq(data_open(&d, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_num_tokens(d), n);
  cr_assert_eq(data_num_train_tokens(d), n);
  cr_assert_eq(data_num_eval_tokens(d), 0);
  cr_assert_eq(data_eval_num_batches(d, 1, T), 0);
  size_t nw = (n - 1) / (size_t)T;
  int32_t in[10], tg[10];
  data_pos_t pos = {0, 0};
  unsigned char *seen = calloc(nw, 1);
  for (size_t b = 0; b < nw; b++) {
    cr_assert_eq(data_next_batch(d, &pos, 3, 1, T, in, tg), FSDP_OK, "%s", err_msg());
    /* find the window by content: inputs must equal t[w*T .. w*T+T-1] for some w */
    size_t w = nw;
    for (size_t c = 0; c < nw && w == nw; c++)
      if (!seen[c]) {
        int ok = 1;
        for (int i = 0; i < T && ok; i++) ok = in[i] == t[c * T + i] && tg[i] == t[c * T + i + 1];
        if (ok) w = c;
      }
    cr_assert_lt(w, nw, "batch %zu matches no unused window of the file", b);
    seen[w] = 1;
  }
  free(seen);
  data_close(d);
  free(back);
  free(t);
  free(p);
}

Test(data, empty_write_is_refused_at_open) {
  char *p = tu_path("empty.bin");
  cr_assert_eq(data_write(p, NULL, 0), FSDP_OK, "%s", err_msg());
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 256, 0, 4), FSDP_EINVAL);
  assert_msg_has("0 tokens");
  free(p);
}

Test(data, inputs_and_targets_shift_by_one) {
  int B = 4, T = 16;
  char *p = make_seq_file("shift.bin", 1000); /* id == position */
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  int32_t in[4 * 16], tg[4 * 16];
  data_pos_t pos = {0, 0};
  for (int k = 0; k < 5; k++) {
    cr_assert_eq(data_next_batch(d, &pos, 11, B, T, in, tg), FSDP_OK, "%s", err_msg());
    for (int b = 0; b < B; b++) {
      const int32_t *x = in + b * T, *y = tg + b * T;
      cr_assert_eq(x[0] % T, 0, "window starts at %d, not a multiple of T", x[0]);
      for (int t = 0; t < T; t++) {
        cr_assert_eq(x[t], x[0] + t);
        cr_assert_eq(y[t], x[t] + 1);
      }
    }
  }
  data_close(d);
  free(p);
}

/* Runs nb batches from *pos, storing them in in/tg (nb * B * T each). */
static void run_batches(data_t *d, data_pos_t *pos, uint64_t seed, int B, int T, int nb,
                        int32_t *in, int32_t *tg) {
  for (int k = 0; k < nb; k++)
    cr_assert_eq(data_next_batch(d, pos, seed, B, T, in + (size_t)k * B * T,
                                 tg + (size_t)k * B * T),
                 FSDP_OK, "%s", err_msg());
}

/* A rank's rows of the global batch are those rows of the whole batch, for
 * training (the position advancing the same) and evaluation; rows outside
 * the batch are refused. */
Test(data, a_ranks_rows_are_its_rows_of_the_global_batch) {
  enum { B = 6, T = 8 };
  char *p = make_seq_file("rows.bin", 2000);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0.2, T), FSDP_OK, "%s", err_msg());
  int32_t in[B * T], tg[B * T], rin[2 * T], rtg[2 * T];
  data_pos_t whole = {0, 0}, rows = {0, 0};
  for (int k = 0; k < 40; k++) { /* past an epoch's end (24 batches) */
    cr_assert_eq(data_next_batch(d, &whole, 3, B, T, in, tg), FSDP_OK, "%s", err_msg());
    const int first = k % 5;
    cr_assert_eq(data_next_rows(d, &rows, 3, B, T, first, 2, rin, rtg), FSDP_OK, "%s", err_msg());
    cr_assert(whole.epoch == rows.epoch && whole.window == rows.window, "batch %d", k);
    cr_assert_eq(memcmp(rin, in + first * T, sizeof rin), 0, "batch %d rows %d..", k, first);
    cr_assert_eq(memcmp(rtg, tg + first * T, sizeof rtg), 0, "batch %d rows %d..", k, first);
  }
  cr_assert_eq(data_eval_batch(d, 1, B, T, in, tg), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_eval_rows(d, 1, B, T, 4, 2, rin, rtg), FSDP_OK, "%s", err_msg());
  cr_assert_eq(memcmp(rin, in + 4 * T, sizeof rin), 0);
  cr_assert_eq(memcmp(rtg, tg + 4 * T, sizeof rtg), 0);
  cr_assert_eq(data_next_rows(d, &rows, 3, B, T, 5, 2, rin, rtg), FSDP_EINVAL);
  assert_msg_has("rows 5..6 are not rows of a batch of 6");
  cr_assert_eq(data_eval_rows(d, 1, B, T, -1, 1, rin, rtg), FSDP_EINVAL);
  data_close(d);
  free(p);
}

Test(data, batches_deterministic_per_seed) {
  int B = 2, T = 8, nb = 20;
  char *p = make_seq_file("det.bin", 801); /* 100 windows, 50 batches an epoch */
  data_t *d1 = NULL, *d2 = NULL;
  cr_assert_eq(data_open(&d1, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_open(&d2, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  size_t sz = (size_t)nb * B * T;
  int32_t *a = malloc(sz * 4), *at = malloc(sz * 4), *b = malloc(sz * 4), *bt = malloc(sz * 4);
  data_pos_t pa = {3, 7}, pb = {3, 7};
  run_batches(d1, &pa, 1234, B, T, nb, a, at);
  run_batches(d2, &pb, 1234, B, T, nb, b, bt);
  cr_assert_eq(memcmp(a, b, sz * 4), 0, "same seed and position, different batches");
  cr_assert_eq(memcmp(at, bt, sz * 4), 0);
  cr_assert_eq(pa.epoch, pb.epoch);
  cr_assert_eq(pa.window, pb.window);
  /* another seed gives another order */
  data_pos_t pc = {3, 7};
  run_batches(d2, &pc, 1235, B, T, nb, b, bt);
  cr_assert_neq(memcmp(a, b, sz * 4), 0, "seeds 1234 and 1235 give the same batches");
  /* and so does another epoch under the same seed */
  data_pos_t pd = {4, 7};
  run_batches(d2, &pd, 1234, B, T, nb, b, bt);
  cr_assert_neq(memcmp(a, b, sz * 4), 0, "epochs 3 and 4 give the same batches");
  free(a), free(at), free(b), free(bt);
  data_close(d1);
  data_close(d2);
  free(p);
}

Test(data, resume_equals_continuous_run) {
  int B = 3, T = 8, nb = 40, k = 17;
  char *p = make_seq_file("resume.bin", 8 * 31 + 1); /* 31 windows: 10 batches an epoch */
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  size_t bsz = (size_t)B * T, sz = (size_t)nb * bsz;
  int32_t *a = malloc(sz * 4), *at = malloc(sz * 4), *b = malloc(sz * 4), *bt = malloc(sz * 4);
  data_pos_t pos = {0, 0}, saved = {0, 0};
  for (int i = 0; i < nb; i++) {
    if (i == k) saved = pos;
    run_batches(d, &pos, 99, B, T, 1, a + i * bsz, at + i * bsz);
  }
  data_close(d);
  cr_assert_eq(saved.epoch, 1); /* 17 = 10 + 7: the resume lands mid-epoch and */
  cr_assert_eq(saved.window, 7 * 3); /* the run after it crosses two epoch boundaries */
  /* a new process: fresh handle, only the saved position */
  cr_assert_eq(data_open(&d, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  run_batches(d, &saved, 99, B, T, nb - k, b, bt);
  cr_assert_eq(memcmp(a + k * bsz, b, (size_t)(nb - k) * bsz * 4), 0);
  cr_assert_eq(memcmp(at + k * bsz, bt, (size_t)(nb - k) * bsz * 4), 0);
  cr_assert_eq(saved.epoch, pos.epoch);
  cr_assert_eq(saved.window, pos.window);
  free(a), free(at), free(b), free(bt);
  data_close(d);
  free(p);
}

/* Over several epochs, the windows (identified by their first token / T) one
 * epoch uses: each at most once, and every one when B divides the count. */
static void check_epochs(int B, int nwin) {
  int T = 4;
  char name[64];
  snprintf(name, sizeof name, "epochs%d_%d.bin", B, nwin);
  char *p = make_seq_file(name, (size_t)nwin * T + 1);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  int per_epoch = nwin / B;
  int32_t *in = malloc((size_t)B * T * 4), *tg = malloc((size_t)B * T * 4);
  int *count = malloc((size_t)nwin * sizeof *count);
  int *first = malloc((size_t)nwin * sizeof *first), differs = 0;
  data_pos_t pos = {0, 0};
  for (uint64_t e = 0; e < 4; e++) {
    memset(count, 0, (size_t)nwin * sizeof *count);
    for (int k = 0; k < per_epoch; k++) {
      cr_assert_eq(pos.epoch, e);
      cr_assert_eq(pos.window, (uint64_t)k * B, "the position counts windows");
      cr_assert_eq(data_next_batch(d, &pos, 5, B, T, in, tg), FSDP_OK, "%s", err_msg());
      for (int b = 0; b < B; b++) {
        int w = in[b * T] / T;
        cr_assert(w >= 0 && w < nwin);
        count[w]++;
        if (e == 0) first[k * B + b] = w;
        else if (first[k * B + b] != w) differs = 1;
      }
    }
    /* the epoch is used up: the position moved to the next one */
    cr_assert_eq(pos.epoch, e + 1);
    cr_assert_eq(pos.window, 0);
    int used = 0;
    for (int w = 0; w < nwin; w++) {
      cr_assert_leq(count[w], 1, "window %d used %d times in epoch %llu", w, count[w],
                    (unsigned long long)e);
      used += count[w];
    }
    cr_assert_eq(used, per_epoch * B);
  }
  cr_assert(differs, "every epoch has the same order");
  free(in), free(tg), free(count), free(first);
  data_close(d);
  free(p);
}

Test(data, epoch_covers_every_window_once) { check_epochs(1, 37); }
Test(data, epoch_covers_whole_batches_once) { check_epochs(4, 37); }
Test(data, epoch_batch_divides_windows) { check_epochs(5, 40); }

/* The windows (their first token / T) of nb batches of B from *pos, rows
 * [first, first + count) of each, appended to w at *n. */
static void batch_windows(data_t *d, data_pos_t *pos, int B, int first, int count, int nb,
                          int *w, int *n) {
  enum { T = 8 };
  int32_t in[8 * T], tg[8 * T];
  cr_assert_leq(count, 8);
  for (int k = 0; k < nb; k++) {
    cr_assert_eq(data_next_rows(d, pos, 21, B, T, first, count, in, tg), FSDP_OK, "%s", err_msg());
    for (int b = 0; b < count; b++) w[(*n)++] = in[b * T] / T;
  }
}

/* A run of 4 ranks x batch 2 (global batch 8) that stops after 3 batches
 * goes on under 2 ranks x batch 4 (8), 3 x 2 (6) and 2 x 2 (4), each rank
 * reading its rows: the windows read from the saved position on are the
 * next unread windows of the order, the ones reading one window at a time
 * from a fresh position gives, with no repeat and no gap, through the
 * epoch's end and on into the next epoch (48 windows: every batch size
 * here divides it, so no epoch leaves windows unread). */
Test(data, a_resume_under_another_global_batch_reads_the_next_unread_windows) {
  enum { T = 8, NW = 48, K = 3, AFTER = 2 * NW - K * 8 };
  char *p = make_seq_file("regrid.bin", (size_t)NW * T + 1);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  int order[2 * NW], n = 0;
  data_pos_t one = {0, 0};
  batch_windows(d, &one, 1, 0, 1, 2 * NW, order, &n); /* two epochs, a window at a time */
  data_pos_t saved = {0, 0};
  int before[K * 8];
  n = 0;
  for (int k = 0; k < K; k++) { /* the first run: rank r reads rows 2r, 2r + 1 */
    data_pos_t at = saved;
    for (int r = 0; r < 4; r++) {
      at = saved;
      batch_windows(d, &at, 8, 2 * r, 2, 1, before, &n);
    }
    saved = at;
  }
  cr_assert_eq(memcmp(before, order, sizeof before), 0, "the first run reads the order");
  const struct { int ranks, batch; } then[] = {{2, 4}, {3, 2}, {2, 2}};
  for (size_t i = 0; i < sizeof then / sizeof *then; i++) {
    const int B = then[i].ranks * then[i].batch;
    int after[AFTER];
    data_pos_t pos = saved;
    n = 0;
    for (int k = 0; k < AFTER / B; k++) {
      data_pos_t at = pos;
      for (int r = 0; r < then[i].ranks; r++) {
        at = pos;
        batch_windows(d, &at, B, r * then[i].batch, then[i].batch, 1, after, &n);
      }
      pos = at;
    }
    cr_assert_eq(n, AFTER);
    for (int w = 0; w < AFTER; w++)
      cr_assert_eq(after[w], order[K * 8 + w], "%d ranks x batch %d: window %d read after the "
                   "resume is %d, the order's next unread one is %d", then[i].ranks,
                   then[i].batch, w, after[w], order[K * 8 + w]);
    cr_assert(pos.epoch == 2 && pos.window == 0, "%d ranks x batch %d: ends at (%llu, %llu)",
              then[i].ranks, then[i].batch, (unsigned long long)pos.epoch,
              (unsigned long long)pos.window);
  }
  data_close(d);
  free(p);
}

/* An epoch ends when fewer windows than a batch are left: a position saved
 * under a smaller batch, with fewer left than the new batch takes, starts
 * the next epoch, the same way as a run of that batch all along would. */
Test(data, an_epochs_last_windows_short_of_a_batch_are_not_read) {
  enum { T = 4, NW = 10 };
  char *p = make_seq_file("short.bin", (size_t)NW * T + 1);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  int32_t a[4 * T], at[4 * T], b[4 * T], bt[4 * T];
  data_pos_t pos = {0, 0};
  for (int k = 0; k < 2; k++) /* 8 of 10 windows read by batches of 4: 2 left */
    cr_assert_eq(data_next_batch(d, &pos, 8, 4, T, a, at), FSDP_OK, "%s", err_msg());
  cr_assert(pos.epoch == 1 && pos.window == 0, "2 windows left, fewer than a batch of 4");
  data_pos_t mid = {0, 7}, next = {1, 0}; /* 3 left under batches of 1; a batch of 4 needs 4 */
  cr_assert_eq(data_next_batch(d, &mid, 8, 4, T, a, at), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_next_batch(d, &next, 8, 4, T, b, bt), FSDP_OK, "%s", err_msg());
  cr_assert_eq(memcmp(a, b, sizeof a), 0);
  cr_assert(mid.epoch == 1 && mid.window == 4);
  data_close(d);
  free(p);
}

Test(data, position_past_epoch_end_starts_next_epoch) {
  int B = 2, T = 4;
  char *p = make_seq_file("past.bin", 41); /* 10 windows, 5 batches an epoch */
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0, T), FSDP_OK, "%s", err_msg());
  int32_t a[8], at[8], b[8], bt[8];
  data_pos_t late = {2, 9}, next = {3, 0};
  cr_assert_eq(data_next_batch(d, &late, 8, B, T, a, at), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_next_batch(d, &next, 8, B, T, b, bt), FSDP_OK, "%s", err_msg());
  cr_assert_eq(memcmp(a, b, sizeof a), 0);
  cr_assert_eq(late.epoch, 3);
  cr_assert_eq(late.window, 2);
  data_close(d);
  free(p);
}

Test(data, eval_windows_never_overlap_training) {
  int B = 2, T = 8;
  size_t n = 1003;
  char *p = make_seq_file("eval.bin", n); /* id == position */
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0.25, T), FSDP_OK, "%s", err_msg());
  size_t ntrain = data_num_train_tokens(d), neval = data_num_eval_tokens(d);
  cr_assert_eq(ntrain + neval, n);
  cr_assert_eq(ntrain % (size_t)T, 0, "held-out part starts off the window grid: %zu", ntrain);
  cr_assert_geq(neval, (size_t)(0.25 * n) - (T - 1));
  cr_assert_leq(neval, (size_t)(0.25 * n));

  /* every token a training epoch reads lies below ntrain */
  size_t nw = (ntrain - 1) / T;
  int32_t in[16], tg[16];
  data_pos_t pos = {0, 0};
  int32_t train_max = -1;
  for (size_t k = 0; k < nw / B; k++) {
    cr_assert_eq(data_next_batch(d, &pos, 2, B, T, in, tg), FSDP_OK, "%s", err_msg());
    for (int i = 0; i < B * T; i++) train_max = tg[i] > train_max ? tg[i] : train_max;
  }
  cr_assert_lt((size_t)train_max, ntrain);

  /* eval batches: sequential windows from ntrain on, all above every training token */
  size_t ne = data_eval_num_batches(d, B, T);
  cr_assert_eq(ne, (neval - 1) / T / B);
  cr_assert_gt(ne, 0);
  for (size_t k = 0; k < ne; k++) {
    cr_assert_eq(data_eval_batch(d, k, B, T, in, tg), FSDP_OK, "%s", err_msg());
    for (int b = 0; b < B; b++) {
      size_t start = ntrain + (k * B + b) * T;
      for (int t = 0; t < T; t++) {
        cr_assert_eq((size_t)in[b * T + t], start + t);
        cr_assert_eq((size_t)tg[b * T + t], start + t + 1);
        cr_assert_gt(in[b * T + t], train_max, "eval token %d also used in training",
                     in[b * T + t]);
      }
    }
  }
  /* the same every time, and the end is an error */
  int32_t in2[16], tg2[16];
  cr_assert_eq(data_eval_batch(d, 0, B, T, in2, tg2), FSDP_OK);
  cr_assert_eq(data_eval_batch(d, 0, B, T, in, tg), FSDP_OK);
  cr_assert_eq(memcmp(in, in2, sizeof in), 0);
  cr_assert_eq(data_eval_batch(d, ne, B, T, in, tg), FSDP_ERANGE);
  assert_msg_has("evaluation batch");
  data_close(d);
  free(p);
}

/* ---- writes that fail ---- */

Test(data, write_to_missing_directory) {
  char *dir = tu_path("no-such-dir");
  size_t len = strlen(dir) + 16;
  char *p = malloc(len);
  snprintf(p, len, "%s/x.bin", dir);
  uint16_t t[10] = {1, 2, 3};
  cr_assert_eq(data_write(p, t, 10), FSDP_ENOENT);
  assert_msg_has(p);
  assert_msg_has("directory exists");
  cr_assert_not(exists(p));
  cr_assert_not(exists(dir));
  cr_assert_not(dir_has(tu_tmpdir(), ".tmp."));
  free(p);
  free(dir);
}

/* A FIFO, or a device (a link to /dev/null: renaming over the link would
 * leave /dev/null alone), at the path is refused, not renamed over: it was
 * replaced by a regular file (fsdp-tokenize -o mynull). */
Test(data, write_over_a_fifo_or_a_device_is_refused) {
  char *fifo = tu_path("t.fifo"), *null = tu_path("t.null");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(symlink("/dev/null", null), 0);
  uint16_t t[10] = {1, 2, 3};
  cr_assert_eq(data_write(fifo, t, 10), FSDP_EINVAL);
  assert_msg_has(fifo);
  assert_msg_has("is a FIFO, not a file");
  cr_assert_eq(data_write(null, t, 10), FSDP_EINVAL);
  assert_msg_has("is a character device, not a file");
  struct stat st;
  cr_assert(!stat(fifo, &st) && S_ISFIFO(st.st_mode), "the FIFO was replaced");
  cr_assert(!lstat(null, &st) && S_ISLNK(st.st_mode), "the link was replaced");
  cr_assert_not(dir_has(tu_tmpdir(), ".tmp."), "temporary file left behind");
  free(fifo), free(null);
}

/* The temporary is the writer's own, created O_EXCL | O_NOFOLLOW: a link
 * planted at <path>.tmp.<pid> is not written through (it truncated its
 * target and was then renamed to the path). */
Test(data, write_never_goes_through_a_link_at_its_temporary_name) {
  char *p = tu_path("tok.bin"), *victim = tu_path("victim.txt"), planted[4200];
  tu_write_file(victim, "precious", 8);
  snprintf(planted, sizeof planted, "%s.tmp.%d", p, (int)getpid());
  cr_assert_eq(symlink(victim, planted), 0);
  uint16_t t[10] = {1, 2, 3};
  cr_assert_eq(data_write(p, t, 10), FSDP_OK, "%s", err_msg());
  size_t n;
  char *v = tu_slurp(victim, &n);
  cr_assert(n == 8 && !memcmp(v, "precious", 8), "the tokens were written through the link");
  struct stat st;
  cr_assert(!lstat(p, &st) && S_ISREG(st.st_mode) && st.st_size == 1024 + 20);
  cr_assert(!lstat(planted, &st) && S_ISLNK(st.st_mode), "the planted link is left alone");
  free(v), free(p), free(victim);
}

/* In a child limited to a 4 KiB file size, writes 100000 tokens to path and
 * sends back "rc message". Returns rc; the message goes to msg. */
static int write_limited(const char *path, char *msg, size_t msgsz) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    signal(SIGXFSZ, SIG_IGN); /* writes past the limit fail with EFBIG instead of killing */
    struct rlimit rl = {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
    size_t n = 100000;
    uint16_t *t = calloc(n, sizeof *t);
    int rc = data_write(path, t, n);
    dprintf(fds[1], "%d %s", rc, err_msg());
    _exit(0);
  }
  close(fds[1]);
  char buf[1200] = {0};
  size_t got = 0;
  ssize_t r;
  while (got < sizeof buf - 1 && (r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
    got += (size_t)r;
  close(fds[0]);
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed (status %d)", st);
  int rc = 0, off = 0;
  cr_assert_eq(sscanf(buf, "%d %n", &rc, &off), 1, "child said: %s", buf);
  snprintf(msg, msgsz, "%s", buf + off);
  return rc;
}

Test(data, write_past_file_size_limit_leaves_no_file) {
  char *p = tu_path("full.bin");
  char msg[1200];
  int rc = write_limited(p, msg, sizeof msg);
  cr_assert(rc == FSDP_ENOSPC || rc == FSDP_EIO, "rc %s: %s", err_name(rc), msg);
  cr_assert(strstr(msg, p) != NULL, "message lacks the path: %s", msg);
  cr_assert(strstr(msg, "write failed") != NULL, "message: %s", msg);
  cr_assert_not(exists(p), "a half-written file is at the final path");
  cr_assert_not(dir_has(tu_tmpdir(), ".tmp."), "temporary file left behind");
  free(p);
}

Test(data, failed_write_keeps_the_old_file) {
  char *p = make_seq_file("keep.bin", 300);
  char msg[1200];
  int rc = write_limited(p, msg, sizeof msg);
  cr_assert(rc == FSDP_ENOSPC || rc == FSDP_EIO, "rc %s: %s", err_name(rc), msg);
  data_t *d = NULL;
  cr_assert_eq(data_open(&d, p, 65536, 0, 8), FSDP_OK, "old file damaged: %s", err_msg());
  cr_assert_eq(data_num_tokens(d), 300);
  data_close(d);
  cr_assert_not(dir_has(tu_tmpdir(), ".tmp."), "temporary file left behind");
  free(p);
}

/* header[3] says what vocabulary the ids were made for: fsdp-tokenize's
 * bytes are 256; data_write (and llm.c) leave 0, not said; a value no
 * vocabulary has is refused, naming the field (it was taken as not said). */
Test(data, a_token_file_says_the_vocabulary_its_ids_were_made_for) {
  uint16_t tok[64];
  for (int i = 0; i < 64; i++) tok[i] = (uint16_t)(i * 3 % 200);
  char *p = tu_path("made.bin");
  data_t *d = NULL;
  cr_assert_eq(data_write_for(p, tok, 64, 256), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_open(&d, p, 512, 0, 8), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_made_vocab(d), 256);
  data_close(d);
  cr_assert_eq(data_write(p, tok, 64), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_open(&d, p, 512, 0, 8), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_made_vocab(d), 0);
  data_close(d);
  static const int32_t absurd[] = {INT32_MAX, -5, 1000000, 65537};
  for (size_t i = 0; i < sizeof absurd / sizeof *absurd; i++) {
    FILE *f = fopen(p, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, 12, SEEK_SET), 0);
    cr_assert_eq(fwrite(&absurd[i], 4, 1, f), 1); /* little-endian, as the format */
    fclose(f);
    cr_expect_eq(data_open(&d, p, 512, 0, 8), FSDP_EFORMAT, "header vocab %d", absurd[i]);
    char want[64];
    snprintf(want, sizeof want, "header vocab %d (header[3]", absurd[i]);
    cr_expect(strstr(err_msg(), p) && strstr(err_msg(), want) && strstr(err_msg(), "fsdp-tokenize"),
              "%s", err_msg());
  }
  /* fsdp-tokenize records bytes */
  char *txt = tu_path("made.txt"), args[8300], out[4096];
  tu_write_file(txt, "hello, token file\n", 18);
  snprintf(args, sizeof args, "-o %s %s", p, txt);
  cr_assert_eq(tu_run_bin("fsdp-tokenize", args, out, sizeof out), 0, "%s", out);
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_made_vocab(d), 256);
  data_close(d);
  free(p), free(txt);
}

/* A header vocab not above the file's ids (100, with ids up to 189) is
 * refused: the run's note said the ids past it never occur. One above them
 * all (190) is taken. */
Test(data, a_header_vocab_below_the_ids_is_refused) {
  uint16_t tok[64];
  for (int i = 0; i < 64; i++) tok[i] = (uint16_t)(i * 3 % 200);
  char *p = tu_path("below.bin");
  data_t *d = NULL;
  cr_assert_eq(data_write_for(p, tok, 64, 100), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_EFORMAT);
  cr_assert(strstr(err_msg(), p) && strstr(err_msg(), "header vocab 100") &&
            strstr(err_msg(), "ids up to 189") && strstr(err_msg(), "position 34"), "%s", err_msg());
  cr_assert_null(d);
  cr_assert_eq(data_write_for(p, tok, 64, 189), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_EFORMAT, "189 is an id: the vocabulary is above it");
  cr_assert_eq(data_write_for(p, tok, 64, 190), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_open(&d, p, 256, 0, 8), FSDP_OK, "%s", err_msg());
  cr_assert_eq(data_made_vocab(d), 190);
  data_close(d);
  free(p);
}

/* fsdp-tokenize checks its output before reading: one of its inputs (even
 * by another name) is refused, and stays the text it was; a directory, a
 * FIFO or a device is refused naming it, not after reading everything at
 * the rename (which replaced the FIFO or the device). */
Test(data, tokenize_refuses_an_output_that_is_an_input_a_directory_or_a_fifo) {
  char *txt = tu_path("in.txt"), args[8300], out[4096];
  tu_write_file(txt, "ab", 2);
  snprintf(args, sizeof args, "-o %s/./in.txt %s", tu_tmpdir(), txt);
  cr_assert_eq(tu_run_bin("fsdp-tokenize", args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "is the input") && strstr(out, txt), "%s", out);
  size_t n;
  char *kept = tu_slurp(txt, &n);
  cr_expect(n == 2 && !memcmp(kept, "ab", 2), "the input was replaced");
  snprintf(args, sizeof args, "-o %s %s", tu_tmpdir(), txt);
  cr_assert_eq(tu_run_bin("fsdp-tokenize", args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "is a directory"), "%s", out);
  /* a FIFO, and a device (a link to /dev/null), named and left as they are */
  char *fifo = tu_path("out.fifo"), *null = tu_path("out.null");
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  cr_assert_eq(symlink("/dev/null", null), 0);
  snprintf(args, sizeof args, "-o %s %s", fifo, txt);
  cr_assert_eq(tu_run_bin("fsdp-tokenize", args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "-o: ") && strstr(out, fifo) && strstr(out, "is a FIFO, not a file"), "%s",
            out);
  snprintf(args, sizeof args, "-o %s %s", null, txt);
  cr_assert_eq(tu_run_bin("fsdp-tokenize", args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "is a character device, not a file: give a file path"), "%s", out);
  struct stat st;
  cr_expect(!stat(fifo, &st) && S_ISFIFO(st.st_mode), "the FIFO was replaced");
  cr_expect(!lstat(null, &st) && S_ISLNK(st.st_mode), "the link was replaced");
  free(kept), free(txt), free(fifo), free(null);
}

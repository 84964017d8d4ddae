/* data: reads and checks token files, cuts them into windows, and hands out
 * training and evaluation batches (see data.h); writes token files atomically.
 *
 * It holds one file open and reads each window of a batch from it when the
 * batch is made (pread of 2 (T + 1) bytes): a corpus may be far larger than
 * memory, and the ranks of a node share one copy of it, the page cache's,
 * instead of each holding its own (a private copy per rank made 8 ranks of a
 * 10 GB corpus take 80 GB the memory plan never saw). Open reads the whole
 * file once, in 1 MiB pieces, to check every id. The descriptor keeps the
 * file the run opened: one replaced by a rename (how data_write and
 * fsdp-tokenize write) leaves it unchanged; one cut short or rewritten in
 * place is an error at the batch that sees it (a short read, or an id no
 * longer below the vocabulary), never a crash. It does not own
 * tokenization (client/tokenize.c) or where a run's position is saved (the
 * training loop).
 *
 * Layout of the tokens, for a sequence length T:
 *   training part  [0, eval_start)   windows w = 0.. cover tokens [w*T, w*T+T]
 *   held-out part  [eval_start, n)   windows k = 0.. cover [eval_start+k*T, ..+T]
 * eval_start is the first multiple of T (the T given to data_open) at or after
 * n - floor(n * eval_fraction): it lies on the training windows' grid, past the
 * last token any training window reads (windows of T+1 tokens at stride T end
 * one token short of the next boundary), so no token is both trained on and
 * evaluated on.
 *
 * Epoch order: the training windows are shuffled with Fisher-Yates, whose step i
 * draws from splitmix64 applied to a counter (key(seed, epoch) + i), so the
 * order of any epoch is computed from (seed, epoch) alone, without replaying
 * earlier epochs: a run resumed at (epoch, window) sees the windows it would
 * have seen. A batch of B takes the next B windows of the order; the order
 * does not depend on B, so the position (windows read) means the same under
 * any batch size, and a batch of B after B' windows reads exactly the
 * windows a run of batches of B' would read next. An epoch ends when fewer
 * than B windows are left (nw mod B of them under one B all along): they
 * are not read that epoch. Under the same B this is the batch-counting rule
 * it replaced (batch k of an epoch at window k B, nw / B batches an epoch),
 * window for window. The permutation of the current epoch is kept (4 bytes a window)
 * and rebuilt only when the epoch, seed or window count changes. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/log.h"
#include "daemon/common/rng.h"

#define DATA_HEADER_BYTES ((size_t)DATA_HEADER_INTS * 4)

#define DATA_ENDED_AT_OPEN                                                                      \
  "the file changed while being opened; wait for whatever writes it to finish and retry"
#define DATA_CHECK_BYTES ((size_t)1 << 20) /* open checks the ids this many bytes at a time */

struct data {
  char *path;          /* for messages */
  int fd;              /* the file, open for the run (-1: none) */
  int vocab;           /* ids must be below it */
  unsigned char *win;  /* one window's bytes, 2 (win_cap) */
  size_t win_cap;      /* tokens win holds */
  size_t n;            /* tokens in the file */
  size_t eval_start;   /* first token of the held-out part (n when there is none) */
  int made_vocab;      /* header[3]: the vocabulary the ids were made for (0: not said) */
  uint64_t sum;        /* XXH64 (seed 0) of the token bytes, as open read them */
  struct timespec mtime; /* the file's modification time at open: a write since changes it */
  /* permutation of the training windows for (perm_seed, perm_epoch, perm_n) */
  uint32_t *perm;      /* (perm_n) */
  size_t perm_n;
  uint64_t perm_seed, perm_epoch;
  int perm_valid;
};

/* ---- small helpers ---- */

static uint32_t data__le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void data__put_le32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}

/* Number of windows of T+1 tokens at stride T in a run of len tokens. */
static size_t data__windows(size_t len, int T) {
  return len >= (size_t)T + 1 ? (len - 1) / (size_t)T : 0;
}

/* Reads exactly n bytes at offset off (pread: no shared file position);
 * ended: what an early end of the file means, and its fix. */
static int data__read_all(int fd, void *buf, size_t n, off_t off, const char *path,
                          const char *ended) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, n, off);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      return err_set(err_from_errno(e), "token file %s: read at byte %lld failed: %s", path,
                     (long long)off, strerror(e));
    }
    if (r == 0)
      return err_set(FSDP_EIO,
                     "token file %s: ended at byte %lld while reading: %s", path, (long long)off,
                     ended);
    p += r;
    n -= (size_t)r;
    off += r;
  }
  return FSDP_OK;
}

/* ---- open ---- */

/* Decides where the held-out part starts and checks both parts hold a window. */
static int data__split(data_t *d, double eval_fraction, int T) {
  size_t n = d->n;
  size_t ntrain_windows;
  size_t hold = (size_t)floor((double)n * eval_fraction);
  if (hold == 0 && eval_fraction > 0 && n > 0) hold = 1; /* asked for one: report it too small */
  if (hold == 0) {
    d->eval_start = n;
  } else {
    size_t cut = n - hold;
    size_t start = (cut + (size_t)T - 1) / (size_t)T * (size_t)T;
    d->eval_start = start < n ? start : n;
  }
  ntrain_windows = data__windows(d->eval_start, T);
  if (ntrain_windows == 0)
    return err_set(FSDP_EINVAL,
                   "token file %s: %zu tokens, of which the training split holds %zu; one "
                   "window at seq_len %d needs %d tokens (seq_len + 1): use a longer file or a "
                   "smaller seq_len%s",
                   d->path, n, d->eval_start, T, T + 1,
                   eval_fraction > 0 ? ", or a smaller eval_fraction" : "");
  if (hold > 0 && data__windows(n - d->eval_start, T) == 0) {
    /* floor(n*f) >= 2T leaves at least T+1 tokens after rounding up to the grid */
    double need = ceil(2.0 * T / eval_fraction);
    return err_set(FSDP_EINVAL,
                   "token file %s: eval_fraction %g of %zu tokens leaves %zu held-out tokens "
                   "after aligning to a window boundary; one evaluation window at seq_len %d "
                   "needs %d tokens: use a file of at least %.0f tokens, a larger "
                   "eval_fraction, or eval_fraction 0 (no evaluation)",
                   d->path, eval_fraction, n, n - d->eval_start, T, T + 1, need);
  }
  return FSDP_OK;
}

int data_open(data_t **out, const char *path, int vocab, double eval_fraction, int T) {
  FSDP_ASSERT(out && path);
  *out = NULL;
  if (vocab <= 0)
    return err_set(FSDP_EINVAL, "token file %s: vocab %d must be positive (model vocabulary size)",
                   path, vocab);
  if (T <= 0)
    return err_set(FSDP_EINVAL, "token file %s: seq_len %d must be positive", path, T);
  if (!(eval_fraction >= 0.0 && eval_fraction <= 0.5)) /* also refuses NaN */
    return err_set(FSDP_ERANGE,
                   "token file %s: eval_fraction %g is out of range: use a value in [0, 0.5] "
                   "(0: no evaluation split)",
                   path, eval_fraction);

  int rc = FSDP_OK;
  int fd = -1;
  unsigned char *raw = NULL;
  XXH64_state_t *sum = NULL;
  data_t *d = calloc(1, sizeof *d);
  if (!d) return err_set(FSDP_ENOMEM, "token file %s: out of memory", path);
  d->fd = -1;
  d->path = strdup(path);
  if (!d->path) {
    rc = err_set(FSDP_ENOMEM, "token file %s: out of memory", path);
    goto out;
  }

  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    rc = err_set(err_from_errno(e),
                 "token file %s: cannot open: %s; check the `data` path (fsdp-tokenize makes "
                 "token files from text)",
                 path, strerror(e));
    goto out;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    rc = err_set(err_from_errno(e), "token file %s: cannot stat: %s", path, strerror(e));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = err_set(FSDP_EINVAL, "token file %s: not a regular file; give the path of a .bin "
                 "made by fsdp-tokenize", path);
    goto out;
  }
  size_t size = (size_t)st.st_size;
  if (size < DATA_HEADER_BYTES) {
    rc = err_set(FSDP_EFORMAT,
                 "token file %s: truncated: %zu bytes, shorter than the %zu-byte header; "
                 "re-create it with fsdp-tokenize (if this is text, tokenize it first: "
                 "`fsdp-tokenize -o FILE.bin TEXT...`)",
                 path, size, DATA_HEADER_BYTES);
    goto out;
  }

  unsigned char hdr[DATA_HEADER_BYTES];
  if ((rc = data__read_all(fd, hdr, sizeof hdr, 0, path, DATA_ENDED_AT_OPEN)) != FSDP_OK) goto out;
  int32_t magic = (int32_t)data__le32(hdr), version = (int32_t)data__le32(hdr + 4);
  int32_t count = (int32_t)data__le32(hdr + 8);
  /* header[3]: the vocabulary the ids were made for (llm.c's files hold 0
   * there: not said); checked below, against the range and the ids;
   * header[4..255] are reserved: not checked, as llm.c does not check them */
  const int32_t made = (int32_t)data__le32(hdr + 12);
  if (magic != DATA_MAGIC) {
    rc = err_set(FSDP_EFORMAT,
                 "token file %s: not a token file (magic number %d at byte 0, expected %d); "
                 "make one from text with `fsdp-tokenize -o FILE.bin TEXT...`",
                 path, magic, DATA_MAGIC);
    goto out;
  }
  if (version != DATA_VERSION) {
    rc = err_set(FSDP_EFORMAT,
                 "token file %s: version %d (at byte 4), this build reads version %d; "
                 "re-create it with this build's fsdp-tokenize",
                 path, version, DATA_VERSION);
    goto out;
  }
  if (made < 0 || made > DATA_VOCAB_MAX) { /* once taken as "not said", without a word */
    rc = err_set(FSDP_EFORMAT,
                 "token file %s: header vocab %d (header[3], at byte 12) is no vocabulary: it "
                 "is 1 to %d, or 0 for not said; the header is corrupt: re-create the file "
                 "with fsdp-tokenize",
                 path, made, DATA_VOCAB_MAX);
    goto out;
  }
  d->made_vocab = made;
  if (count < 0) {
    rc = err_set(FSDP_EFORMAT,
                 "token file %s: header token count %d (at byte 8) is negative: the header is "
                 "corrupt; re-create it with fsdp-tokenize",
                 path, count);
    goto out;
  }
  size_t expect = DATA_HEADER_BYTES + 2 * (size_t)count;
  if (size < expect) {
    rc = err_set(FSDP_EFORMAT,
                 "token file %s: truncated: the header says %d tokens, so %zu bytes expected, "
                 "but the file has %zu (%zu missing); it was probably cut short while being "
                 "written or copied: re-create or re-copy it",
                 path, count, expect, size, expect - size);
    goto out;
  }
  if (size > expect) {
    rc = err_set(FSDP_EFORMAT,
                 "token file %s: trailing garbage: the header says %d tokens, so %zu bytes "
                 "expected, but the file has %zu (%zu extra); the header and the data disagree: "
                 "re-create it with fsdp-tokenize",
                 path, count, expect, size, size - expect);
    goto out;
  }

  d->n = (size_t)count;
  d->vocab = vocab;
  d->mtime = st.st_mtim;
  raw = malloc(DATA_CHECK_BYTES);
  sum = XXH64_createState();
  if (!raw || !sum || XXH64_reset(sum, 0) != XXH_OK) {
    rc = err_set(FSDP_ENOMEM, "token file %s: out of memory", path);
    goto out;
  }
  /* check every id now: a bad one is found at start, not at step 40000 */
  size_t bad = SIZE_MAX, past_made = SIZE_MAX; /* the first id >= vocab, >= made */
  unsigned maxid = 0, badid = 0;
  for (size_t at = 0; at < d->n;) {
    const size_t k = d->n - at < DATA_CHECK_BYTES / 2 ? d->n - at : DATA_CHECK_BYTES / 2;
    if ((rc = data__read_all(fd, raw, 2 * k, (off_t)(DATA_HEADER_BYTES + 2 * at), path,
                              DATA_ENDED_AT_OPEN)))
      goto out;
    XXH64_update(sum, raw, 2 * k);
    for (size_t i = 0; i < k; i++) {
      const unsigned id = (unsigned)raw[2 * i] | (unsigned)raw[2 * i + 1] << 8;
      if (id > maxid) maxid = id;
      if (id >= (unsigned)vocab && bad == SIZE_MAX) bad = at + i, badid = id;
      if (made && id >= (unsigned)made && past_made == SIZE_MAX) past_made = at + i;
    }
    at += k;
  }
  if (bad != SIZE_MAX) {
    rc = err_set(FSDP_ERANGE,
                 "token file %s: token id %u at position %zu (byte %zu) is not below the model's "
                 "vocab %d (largest id in the file: %u); the file was made for a larger "
                 "vocabulary: set the model's vocab to at least %u, or re-tokenize the text "
                 "for this model",
                 path, badid, bad, DATA_HEADER_BYTES + 2 * bad, vocab, maxid, maxid + 1);
    goto out;
  }

  if (past_made != SIZE_MAX) { /* the note on it (train.c) would say these ids never occur */
    rc = err_set(FSDP_EFORMAT,
                 "token file %s: header vocab %d (header[3], at byte 12), but it holds ids up to "
                 "%u, the first at position %zu: the header and the ids disagree; re-create the "
                 "file with fsdp-tokenize (or write 0 there, for not said)",
                 path, made, maxid, past_made);
    goto out;
  }
  d->sum = XXH64_digest(sum);
  if ((rc = data__split(d, eval_fraction, T)) != FSDP_OK) goto out;

  LOG_INFO("data", "%s: %zu tokens (XXH64 %016llx); train %zu tokens, eval %zu tokens; windows "
           "of %d tokens: train %zu, eval %zu", path, d->n, (unsigned long long)d->sum,
           d->eval_start, d->n - d->eval_start, T + 1, data__windows(d->eval_start, T),
           data__windows(d->n - d->eval_start, T));
  d->fd = fd, fd = -1;
  *out = d;
  d = NULL;
out:
  XXH64_freeState(sum);
  free(raw);
  if (fd >= 0) close(fd);
  data_close(d);
  return rc;
}

void data_close(data_t *d) {
  if (!d) return;
  if (d->fd >= 0) close(d->fd);
  free(d->perm);
  free(d->win);
  free(d->path);
  free(d);
}

size_t data_num_tokens(const data_t *d) { return d->n; }
size_t data_num_train_tokens(const data_t *d) { return d->eval_start; }
size_t data_num_eval_tokens(const data_t *d) { return d->n - d->eval_start; }
uint64_t data_sum(const data_t *d) { return d->sum; }
int data_made_vocab(const data_t *d) { return d->made_vocab; }

/* ---- batches ---- */

/* Builds the window order of (seed, epoch) over nw windows into d->perm. */
static int data__permute(data_t *d, uint64_t seed, uint64_t epoch, size_t nw) {
  if (d->perm_valid && d->perm_seed == seed && d->perm_epoch == epoch && d->perm_n == nw)
    return FSDP_OK;
  if (d->perm_n != nw || !d->perm) {
    uint32_t *p = realloc(d->perm, sizeof *p * nw);
    if (!p) return err_set(FSDP_ENOMEM, "token file %s: out of memory for %zu windows", d->path, nw);
    d->perm = p;
  }
  d->perm_valid = 0;
  d->perm_n = nw;
  /* two mixes so that nearby (seed, epoch) pairs give unrelated keys */
  uint64_t key = rng_mix(rng_mix(seed) ^ (epoch * 0xd1b54a32d192ed03ull));
  for (size_t i = 0; i < nw; i++) d->perm[i] = (uint32_t)i;
  for (size_t i = nw; i > 1; i--) {
    /* modulo bias is at most i / 2^64: immaterial for any window count */
    size_t j = (size_t)(rng_mix(key + i) % i);
    uint32_t t = d->perm[i - 1];
    d->perm[i - 1] = d->perm[j];
    d->perm[j] = t;
  }
  d->perm_seed = seed;
  d->perm_epoch = epoch;
  d->perm_valid = 1;
  return FSDP_OK;
}

/* One window: tokens [start, start + T] of the file into in (the first T)
 * and tg (the last T). The file was checked at open; what it holds now is
 * checked again, for a file changed in place since (cut short: a short read;
 * rewritten: an id past the vocabulary, which would index past the
 * embedding table). */
static int data__fill(data_t *d, size_t start, int T, int32_t *in, int32_t *tg) {
  const size_t len = (size_t)T + 1;
  if (d->win_cap < len) {
    unsigned char *p = realloc(d->win, 2 * len);
    if (!p) return err_set(FSDP_ENOMEM, "token file %s: out of memory for a window of %zu tokens",
                           d->path, len);
    d->win = p, d->win_cap = len;
  }
  int rc = data__read_all(d->fd, d->win, 2 * len, (off_t)(DATA_HEADER_BYTES + 2 * start), d->path,
                          "the file was cut short since the run opened it; replace a token file "
                          "by a rename (as fsdp-tokenize does), never in place, and resume the job");
  if (rc) return rc;
  for (int t = 0; t <= T; t++) {
    const unsigned id = (unsigned)d->win[2 * t] | (unsigned)d->win[2 * t + 1] << 8;
    if (id >= (unsigned)d->vocab)
      return err_set(FSDP_EFORMAT,
                     "token file %s: token id %u at position %zu is not below the vocab %d, "
                     "though every id was when the run opened it: the file was rewritten in "
                     "place; replace a token file by a rename (as fsdp-tokenize does) and "
                     "resume the job", d->path, id, start + (size_t)t, d->vocab);
    if (t < T) in[t] = (int32_t)id;
    if (t) tg[t - 1] = (int32_t)id;
  }
  return FSDP_OK;
}

/* After a batch's reads: the file is as the run opened it. A write in
 * place (cp over it, an editor saving in place) leaves ids that are all
 * below the vocabulary as often as not (always, for bytes at vocab 256), so
 * data__fill alone would train on the new text under the old split and
 * checksum; its modification time says so. A replacement by rename leaves
 * the open file as it was. */
static int data__unchanged(const data_t *d) {
  struct stat st;
  if (fstat(d->fd, &st))
    return err_set_errno(err_from_errno(errno), errno, "token file %s: stat", d->path);
  if (st.st_mtim.tv_sec != d->mtime.tv_sec || st.st_mtim.tv_nsec != d->mtime.tv_nsec ||
      (size_t)st.st_size != DATA_HEADER_BYTES + 2 * d->n)
    return err_set(FSDP_EFORMAT, "token file %s: written since the run opened it (its size or "
                   "modification time changed): the batches would mix two texts; replace a "
                   "token file by a rename (as fsdp-tokenize does), never in place, and resume "
                   "the job", d->path);
  return FSDP_OK;
}

static int data__check_rows(const data_t *d, int B, int T, int first, int count) {
  if (B <= 0 || T <= 0)
    return err_set(FSDP_EINVAL, "token file %s: batch %d and seq_len %d must be positive", d->path,
                   B, T);
  if (first < 0 || count < 0 || count > B - first)
    return err_set(FSDP_EINVAL, "token file %s: rows %d..%d are not rows of a batch of %d",
                   d->path, first, first + count - 1, B);
  return FSDP_OK;
}

int data_check_batch(const data_t *d, int B, int T, int eval) {
  int rc = data__check_rows(d, B, T, 0, B);
  if (rc) return rc;
  const size_t nw = data__windows(d->eval_start, T);
  if (nw < (size_t)B)
    return err_set(FSDP_EINVAL,
                   "token file %s: a global batch of %d (batch x ranks) needs %d windows of "
                   "seq_len+1 = %d tokens, but the training split (%zu tokens) holds %zu; lower "
                   "batch, the ranks or seq_len, or use more data",
                   d->path, B, B, T + 1, d->eval_start, nw);
  if (eval && d->eval_start < d->n && data_eval_num_batches(d, B, T) == 0)
    return err_set(FSDP_EINVAL,
                   "token file %s: the held-out split (%zu tokens) holds %zu windows of "
                   "seq_len+1 = %d tokens, fewer than one evaluation batch of %d (batch x ranks); "
                   "raise eval_fraction, lower batch or seq_len, or set eval_fraction 0",
                   d->path, d->n - d->eval_start, data__windows(d->n - d->eval_start, T), T + 1, B);
  return FSDP_OK;
}

int data_next_batch(data_t *d, data_pos_t *pos, uint64_t seed, int B, int T, int32_t *inputs,
                    int32_t *targets) {
  return data_next_rows(d, pos, seed, B, T, 0, B, inputs, targets);
}

int data_eval_batch(data_t *d, size_t k, int B, int T, int32_t *inputs, int32_t *targets) {
  return data_eval_rows(d, k, B, T, 0, B, inputs, targets);
}

int data_next_rows(data_t *d, data_pos_t *pos, uint64_t seed, int B, int T, int first, int count,
                   int32_t *inputs, int32_t *targets) {
  FSDP_ASSERT(d && pos && inputs && targets);
  int rc = data__check_rows(d, B, T, first, count);
  if (!rc) rc = data_check_batch(d, B, T, 0);
  if (rc) return rc;
  const size_t nw = data__windows(d->eval_start, T);
  /* fewer than B windows left (a position saved under a larger batch, or
   * under another seq_len): they are not read this epoch, the next starts */
  if (pos->window > nw - (size_t)B) {
    pos->epoch++;
    pos->window = 0;
  }
  if ((rc = data__permute(d, seed, pos->epoch, nw)) != FSDP_OK) return rc;
  const uint32_t *win = d->perm + pos->window + (size_t)first;
  for (int b = 0; b < count; b++)
    if ((rc = data__fill(d, (size_t)win[b] * (size_t)T, T, inputs + (size_t)b * T,
                         targets + (size_t)b * T)))
      return rc;
  if ((rc = data__unchanged(d))) return rc;
  pos->window += (uint64_t)B;
  if (pos->window > nw - (size_t)B) { /* the same rule, so a saved position is never past it */
    pos->epoch++;
    pos->window = 0;
  }
  return FSDP_OK;
}

size_t data_eval_num_batches(const data_t *d, int B, int T) {
  if (B <= 0 || T <= 0) return 0;
  return data__windows(d->n - d->eval_start, T) / (size_t)B;
}

int data_eval_rows(data_t *d, size_t k, int B, int T, int first, int count, int32_t *inputs,
                   int32_t *targets) {
  FSDP_ASSERT(d && inputs && targets);
  int rc = data__check_rows(d, B, T, first, count);
  if (rc) return rc;
  size_t nb = data_eval_num_batches(d, B, T);
  if (k >= nb)
    return err_set(FSDP_ERANGE,
                   "token file %s: evaluation batch %zu does not exist: the held-out split "
                   "(%zu tokens) holds %zu batches of %d x %d",
                   d->path, k, d->n - d->eval_start, nb, B, T);
  for (int b = 0; b < count; b++) {
    size_t w = k * (size_t)B + (size_t)(first + b);
    if ((rc = data__fill(d, d->eval_start + w * (size_t)T, T, inputs + (size_t)b * T,
                         targets + (size_t)b * T)))
      return rc;
  }
  return data__unchanged(d);
}

/* ---- write ---- */

static int data__write_all(int fd, const void *buf, size_t n, const char *tmp) {
  const unsigned char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      return err_set(err_from_errno(e),
                     "token file %s: write failed: %s; free space (or raise the file-size "
                     "limit) and retry",
                     tmp, strerror(e));
    }
    p += w;
    n -= (size_t)w;
  }
  return FSDP_OK;
}

/* Makes the rename itself durable; filesystems that cannot sync a directory are let be. */
static int data__sync_dir(const char *path) {
  char *dir = strdup(path);
  if (!dir) return err_set(FSDP_ENOMEM, "token file %s: out of memory", path);
  char *slash = strrchr(dir, '/');
  const char *name = ".";
  if (slash == dir) name = "/";
  else if (slash) {
    *slash = 0;
    name = dir;
  }
  int rc = FSDP_OK;
  int fd = open(name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
      int e = errno;
      rc = err_set(err_from_errno(e),
                   "token file %s: written, but syncing its directory failed: %s; the file may "
                   "be lost on a crash: check the disk",
                   path, strerror(e));
    }
    close(fd);
  }
  free(dir);
  return rc;
}

int data_write(const char *path, const uint16_t *tokens, size_t n) {
  return data_write_for(path, tokens, n, 0);
}

int data_write_for(const char *path, const uint16_t *tokens, size_t n, int vocab) {
  FSDP_ASSERT(path && (tokens || n == 0) && vocab >= 0 && vocab <= DATA_VOCAB_MAX);
  if (n > (size_t)INT32_MAX)
    return err_set(FSDP_ERANGE,
                   "token file %s: %zu tokens do not fit the header's int32 count (at most %d): "
                   "split the text into several files",
                   path, n, INT32_MAX);
  int rc = FSDP_OK;
  int fd = -1;
  size_t len = strlen(path) + 32;
  char *tmp = malloc(len);
  unsigned char *buf = malloc(1 << 16);
  if (!tmp || !buf) {
    rc = err_set(FSDP_ENOMEM, "token file %s: out of memory", path);
    goto out;
  }
  /* a device or a FIFO at path is refused, not renamed over; the temporary
   * is this process's own (never a link followed) */
  rc = file_output_check("token file", path, "tokens.bin");
  if (!rc && (rc = file_temp_create(path, tmp, len, &fd)))
    rc = err_wrap(rc, "token file %s", path);
  if (rc) {
    free(tmp); /* nothing was created: nothing to remove */
    tmp = NULL;
    goto out;
  }

  memset(buf, 0, DATA_HEADER_BYTES);
  data__put_le32(buf, DATA_MAGIC);
  data__put_le32(buf + 4, DATA_VERSION);
  data__put_le32(buf + 8, (uint32_t)n);
  data__put_le32(buf + 12, (uint32_t)vocab);
  if ((rc = data__write_all(fd, buf, DATA_HEADER_BYTES, tmp)) != FSDP_OK) goto out;
  /* little-endian whatever the host, through one 64 KiB buffer */
  for (size_t i = 0; i < n;) {
    size_t m = n - i < (1 << 15) ? n - i : (1 << 15);
    for (size_t j = 0; j < m; j++) {
      buf[2 * j] = (unsigned char)tokens[i + j];
      buf[2 * j + 1] = (unsigned char)(tokens[i + j] >> 8);
    }
    if ((rc = data__write_all(fd, buf, 2 * m, tmp)) != FSDP_OK) goto out;
    i += m;
  }
  if (fsync(fd) != 0) {
    int e = errno;
    rc = err_set(err_from_errno(e), "token file %s: fsync of %s failed: %s; check the disk", path,
                 tmp, strerror(e));
    goto out;
  }
  int cfd = fd;
  fd = -1;
  if (close(cfd) != 0) { /* NFS reports some write errors only here */
    int e = errno;
    rc = err_set(err_from_errno(e), "token file %s: closing %s failed: %s; check the disk", path,
                 tmp, strerror(e));
    goto out;
  }
  if ((rc = file_temp_place("token file", tmp, path)) != FSDP_OK) goto out;
  free(tmp); /* renamed: no temporary left to remove */
  tmp = NULL;
  rc = data__sync_dir(path);
out:
  if (fd >= 0) close(fd);
  if (tmp) {
    if (rc != FSDP_OK) unlink(tmp);
    free(tmp);
  }
  free(buf);
  return rc;
}

/* data: token files and the batches drawn from them.
 *
 * A token file has the llm.c layout: int32 header[256] = { DATA_MAGIC, DATA_VERSION,
 * token count, 0... }, then that many little-endian uint16 token ids. Opening one
 * checks the header, the size and every token id against the model's vocabulary,
 * so a bad file is refused at start with a message that names the file, the
 * position and the fix, never mid-run. The tokens stay in the file (read a
 * window at a time, through the page cache the node's ranks share), so a
 * corpus may be larger than memory; a file changed in place under a run is
 * an error at the batch that reads it, never a crash.
 *
 * The file is split into a training part and a held-out evaluation part (the
 * last eval_fraction of the tokens). Training batches are windows of T+1
 * tokens, taken in an order shuffled per epoch from a seed (the order depends
 * on (file, seed, T, epoch), never on the batch size B): a batch of B windows
 * at a position (epoch, window) is the B windows of that order from window on,
 * so a run resumes exactly where it stopped, under any B. An epoch ends when
 * fewer than B windows of its order are left unread: those few are not read
 * in that epoch (the next epoch's order is a new one, in which they may come
 * anywhere). */
#ifndef FSDP_DATA_H
#define FSDP_DATA_H

#include <stddef.h>
#include <stdint.h>

#define DATA_MAGIC 20240520
#define DATA_VERSION 1
#define DATA_HEADER_INTS 256

typedef struct data data_t;

/* Where the next training batch starts: resumable. It counts windows, not
 * batches, so a run resumed with another batch size B goes on at the first
 * window it has not read. */
typedef struct data_pos {
  uint64_t epoch;  /* passes over the training split so far */
  uint64_t window; /* windows of the epoch's order read so far: the next batch starts there */
} data_pos_t;

/* Opens and validates path. vocab: token ids must be below it. The header's
 * own vocabulary (header[3]) must be 0 (not said) or 1 to DATA_VOCAB_MAX and
 * above every id the file holds: else the file is refused, naming the field.
 * eval_fraction in
 * [0, 0.5]: share of tokens held out (0: no evaluation split). T: the sequence
 * length batches will use (the training split must hold at least one window). */
int data_open(data_t **out, const char *path, int vocab, double eval_fraction, int T);
void data_close(data_t *d);

size_t data_num_tokens(const data_t *d);
size_t data_num_train_tokens(const data_t *d);
size_t data_num_eval_tokens(const data_t *d);
/* XXH64 (seed 0) of the file's token bytes (the header not included), read
 * at open: which tokens a run trained on, so a resume knows the file that
 * wrote its checkpoint's data position from another one. */
uint64_t data_sum(const data_t *d);
/* The vocabulary the file says its ids were made for (fsdp-tokenize: 256,
 * bytes); 0 when it does not say. */
int data_made_vocab(const data_t *d);

/* Whether batches of B windows of T tokens can be drawn: the training
 * split holds B windows, and (eval set) the held-out split one evaluation
 * batch; else an error naming the file and the fix. Open checks one
 * window; the run checks its global batch this way before its first step. */
int data_check_batch(const data_t *d, int B, int T, int eval);
/* Fills inputs and targets (B,T each) with the training batch at *pos (the
 * B windows of the epoch's order from pos->window on; a position with fewer
 * than B windows left starts the next epoch) and advances *pos by B windows
 * (to the next epoch when fewer than B are left). */
int data_next_batch(data_t *d, data_pos_t *pos, uint64_t seed, int B, int T, int32_t *inputs,
                    int32_t *targets);
/* The same for rows [first, first + count) of that batch only (count,T
 * each): a rank reads its own rows of the global batch, not all of them. */
int data_next_rows(data_t *d, data_pos_t *pos, uint64_t seed, int B, int T, int first, int count,
                   int32_t *inputs, int32_t *targets);
/* Number of whole evaluation batches of (B,T), and the k-th of them (sequential
 * windows of the held-out split, the same every time), or its rows
 * [first, first + count). */
size_t data_eval_num_batches(const data_t *d, int B, int T);
int data_eval_batch(data_t *d, size_t k, int B, int T, int32_t *inputs, int32_t *targets);
int data_eval_rows(data_t *d, size_t k, int B, int T, int first, int count, int32_t *inputs,
                   int32_t *targets);

/* Writes a token file: temporary name, fsync, rename. Ids must fit in uint16.
 * data_write_for also records the vocabulary the ids were made for (header[3];
 * 0: not said, as data_write and llm.c's files). */
#define DATA_VOCAB_MAX 65536
int data_write(const char *path, const uint16_t *tokens, size_t n);
int data_write_for(const char *path, const uint16_t *tokens, size_t n, int vocab);

#endif

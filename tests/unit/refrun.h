/* refrun: running tests/reference/gpt2_ref.py and exchanging record files
 * with it (shared by test_reference.c and test_adamw.c).
 *
 * A record file (little-endian) is a sequence of { int32 name_len, name bytes,
 * int64 numel, float64 data[numel] } ending with a record named "end" of numel
 * 0, so a truncated file is caught. */
#ifndef FSDP_REFRUN_H
#define FSDP_REFRUN_H

#include <stddef.h>
#include <stdio.h>

typedef struct ref_rec {
  char name[64];
  size_t numel;
  double *data;
} ref_rec_t;

typedef struct ref_file {
  int n;
  ref_rec_t *recs;
} ref_file_t;

void rec_write(FILE *f, const char *name, const double *x, size_t n);
void rec_write_f32(FILE *f, const char *name, const float *x, size_t n);
/* Reads a whole record file; a short or malformed file fails the test. */
ref_file_t ref_read(const char *path);
/* The data of record name, which must hold numel values (else the test fails). */
const double *ref_get(const ref_file_t *rf, const char *name, size_t numel);
void ref_free(ref_file_t *rf);
/* Runs the reference script with args; a failure carries the script's stderr.
 * A missing python3, torch or numpy fails the test with the install command. */
void ref_run(const char *args);

#endif

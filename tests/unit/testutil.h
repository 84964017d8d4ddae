/* testutil: small helpers shared by the unit tests (random fill, errors
 * against a float64 reference, temporary directories). */
#ifndef FSDP_TESTUTIL_H
#define FSDP_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64 step: a deterministic stream for test inputs. */
uint64_t tu_rand_u64(uint64_t *state);
/* uniform in [lo, hi) */
double tu_rand_uniform(uint64_t *state, double lo, double hi);
void tu_fill_f32(float *x, size_t n, uint64_t *state, double lo, double hi);
void tu_fill_f64(double *x, size_t n, uint64_t *state, double lo, double hi);
/* ||a - ref|| / ||ref|| (0 when both are zero). */
double tu_rel_err_f32(const float *a, const double *ref, size_t n);
double tu_rel_err_f32f32(const float *a, const float *ref, size_t n);
/* A fresh directory under $TMPDIR (or /tmp), removed at exit. Never NULL. */
const char *tu_tmpdir(void);
/* path inside tu_tmpdir(); returns a static-per-call malloc'd string the caller frees. */
char *tu_path(const char *name);
/* Writes n bytes to path (for crafting bad files). */
void tu_write_file(const char *path, const void *data, size_t n);
/* A TCP socket bound (and listening) on 127.0.0.1 at a port the kernel picks,
 * its "127.0.0.1:PORT" in addr (n bytes). For rank processes forked by tests. */
int tu_listen_loopback(char *addr, size_t n);
/* Runs bin/PROGRAM ARGS (from tu_root()) through the shell with stderr joined
 * to stdout, which lands in out (len bytes, NUL-terminated); returns the exit
 * status (-1 if killed by a signal). */
int tu_run_bin(const char *program, const char *args, char *out, size_t len);
/* Project root (where the Makefile is): FSDP_ROOT, else the current directory. */
const char *tu_root(void);

#endif

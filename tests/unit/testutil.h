/* testutil: small helpers shared by the unit and end-to-end tests (random
 * fill, errors against a float64 reference, temporary directories, rank
 * processes). Linking it makes a test process compute on one thread unless
 * the environment or the test says otherwise (testutil.c says why). */
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
/* A server's port while it is away (127.0.0.1:port, for secs): a listener
 * that takes each connection and closes it at once, so every try to
 * connect fails as a server not yet serving fails it. The longest wait
 * between tries (or from the start to the first, or from the last to the
 * end), in seconds; how many tries in *tries. */
double tu_connect_gaps(int port, double secs, int *tries);
/* Runs bin/PROGRAM ARGS (from tu_root()) through the shell with stderr joined
 * to stdout, which lands in out (len bytes, NUL-terminated); returns the exit
 * status (-1 if killed by a signal). */
int tu_run_bin(const char *program, const char *args, char *out, size_t len);
/* Runs `sh -c CMD` with stderr joined to stdout, which lands in out (len
 * bytes, NUL-terminated); its exit status (-1 if killed by a signal). */
int tu_sh(const char *cmd, char *out, size_t len);
/* Project root (where the Makefile is): FSDP_ROOT, else the current directory. */
const char *tu_root(void);
/* The build directory the tests' helpers are in, under tu_root():
 * FSDP_TEST_BUILD (the Makefile's B: build-san under `make test-san`), else
 * "build". */
const char *tu_build(void);
/* The LD_PRELOAD value that puts tests/e2e/fs_shim.c (built beside the
 * tests: tu_build()/tests/fs_shim.so, which must be there) in front of a
 * program of this build; under AddressSanitizer (make test-san, whose
 * programs are sanitized too) its runtime first, as it must be. */
const char *tu_fs_shim(void);
/* The whole file at path, NUL-terminated (its length in *n when n is not
 * NULL); "" when it cannot be read. Free it. */
char *tu_slurp(const char *path, size_t *n);
/* A throwaway PKI in dir, made with openssl: CAs ca.pem and otherca.pem
 * (and their .key), and srv.pem / srv.key, a server certificate ca signed
 * for 127.0.0.1 and localhost. */
void tu_tls_make(const char *dir);
/* Monotonic clock, in seconds. */
double tu_now_s(void);
/* How many times longer a test may take than its plain limits say: make
 * test-san builds the tests and the programs they run with AddressSanitizer
 * and UBSan at -O1 and passes -DTU_SLOW=4 (a checkpoint/resume test's
 * programs take 108.6 s there against 14.5 s plain). The end-to-end tests'
 * Criterion timeouts and their waits for a program's progress are multiplied
 * by it; a wait that proves something is prompt (a heartbeat timeout, a
 * process gone after a signal) is not. */
#ifndef TU_SLOW
#define TU_SLOW 1
#endif

/* ---- a world of rank processes, started without fsdp-launch ---------------
 * The way fsdp-launch starts a job: rank r runs `bin/PROGRAM ARGS` (shell
 * words, from tu_root()) with FSDP_RANK, FSDP_WORLD_SIZE, FSDP_ADDRS and its
 * own bound listening socket as fd 3 (FSDP_LISTEN_FD=3), plus the caller's
 * environment additions. Its stdout and stderr go to a file (a pipe nobody
 * drains would stall a chatty rank), so the test reads them whenever it likes.
 * A rank dies with the test process (PR_SET_PDEATHSIG), and tu_world_kill
 * ends and reaps whatever is left: call it from a test's .fini. */
#define TU_WORLD_MAX 8
typedef struct tu_world {
  int n;
  int pid[TU_WORLD_MAX];       /* 0 once reaped */
  int status[TU_WORLD_MAX];    /* waitpid status, once reaped */
  double exit_s[TU_WORLD_MAX]; /* tu_now_s() when seen exited (0 while running) */
  char log[TU_WORLD_MAX][512]; /* the file holding rank r's stdout and stderr */
} tu_world_t;
/* env: "NAME=value" strings ending with NULL (or NULL); rank_env[r]: one
 * more "NAME=value" for rank r only, ahead of env's (or NULL); rank_args[r]:
 * more words for rank r only (or NULL). */
void tu_world_start(tu_world_t *w, int n, const char *program, const char *args,
                    const char *const *env, const char *const *rank_env,
                    const char *const *rank_args);
/* Rank r's output so far (malloc'd, NUL-terminated). */
char *tu_world_output(const tu_world_t *w, int r);
/* Waits up to timeout_s until rank r's output holds `count` lines starting
 * with prefix; 0 when it does, -1 on the deadline or when r exited first. */
int tu_world_wait_lines(tu_world_t *w, int r, const char *prefix, int count, double timeout_s);
/* Waits up to timeout_s until every rank but `except` (-1: none) has exited,
 * noting when each did (exit_s); returns how many are still running. */
int tu_world_wait_exits(tu_world_t *w, int except, double timeout_s);
/* A token file of n random ids below vocab (a stream seeded by seed), named
 * name in the test's directory; returns its path (free it). In
 * testutil_train.c, which links the engine. */
char *tu_token_file(const char *name, size_t n, uint64_t seed, int vocab);
/* The tiny model's options the checkpoint tests train with (a few steps of
 * 32 tokens, no eval, no sample). */
#define TU_TINY_TRAIN "--model tiny --warmup_steps 2 --seq_len 32 --lr 3e-3 --eval_batches 2 " \
                      "--sample_tokens 0 --eval_every 0"
/* fsdp-launch -n N -- bin/fsdp-train TU_TINY_TRAIN --data DATA ARGS, its
 * output in out; fails the test unless it exits with want (testutil.c). */
void tu_launch_tiny(int n, const char *data, const char *args, int want, char *out, size_t len);

/* SIGKILLs and reaps every rank not reaped yet (stopped ones included). */
void tu_world_kill(tu_world_t *w);

#endif

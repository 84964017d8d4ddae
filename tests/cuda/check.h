/* check: the one-line verdicts of the GPU tests that print their checks
 * (test_nccl, test_nccl_ranks): "PASS what" or "FAIL what", counted; the
 * test's exit status comes from n_fails. Header-only, one test a program. */
#ifndef FSDP_TESTS_CUDA_CHECK_H
#define FSDP_TESTS_CUDA_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int n_checks, n_fails;

static int check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  n_checks++;
  n_fails += !ok;
  return ok;
}

#endif

/* refrun: see refrun.h. */
#include "refrun.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

void rec_write(FILE *f, const char *name, const double *x, size_t n) {
  int32_t len = (int32_t)strlen(name);
  int64_t numel = (int64_t)n;
  cr_assert_eq(fwrite(&len, 4, 1, f), 1);
  cr_assert_eq(fwrite(name, 1, (size_t)len, f), (size_t)len);
  cr_assert_eq(fwrite(&numel, 8, 1, f), 1);
  if (n) cr_assert_eq(fwrite(x, sizeof(double), n, f), n);
}

void rec_write_f32(FILE *f, const char *name, const float *x, size_t n) {
  double *d = malloc((n ? n : 1) * sizeof *d);
  cr_assert_not_null(d);
  for (size_t i = 0; i < n; i++) d[i] = x[i];
  rec_write(f, name, d, n);
  free(d);
}

ref_file_t ref_read(const char *path) {
  ref_file_t rf = {0, NULL};
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "reference output %s missing", path);
  for (;;) {
    int32_t len;
    int64_t numel;
    char name[64];
    cr_assert_eq(fread(&len, 4, 1, f), 1, "%s: truncated (no end record)", path);
    cr_assert(len > 0 && len < (int32_t)sizeof name, "%s: bad name length %d", path, len);
    cr_assert_eq(fread(name, 1, (size_t)len, f), (size_t)len, "%s: truncated name", path);
    name[len] = 0;
    cr_assert_eq(fread(&numel, 8, 1, f), 1, "%s: truncated after %s", path, name);
    if (!strcmp(name, "end")) break;
    cr_assert(numel >= 0, "%s: record %s has numel %lld", path, name, (long long)numel);
    rf.recs = realloc(rf.recs, (size_t)(rf.n + 1) * sizeof *rf.recs);
    cr_assert_not_null(rf.recs);
    ref_rec_t *r = &rf.recs[rf.n++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->numel = (size_t)numel;
    r->data = malloc((r->numel ? r->numel : 1) * sizeof(double));
    cr_assert_not_null(r->data);
    cr_assert_eq(fread(r->data, sizeof(double), r->numel, f), r->numel,
                 "%s: record %s truncated", path, name);
  }
  fclose(f);
  return rf;
}

const double *ref_get(const ref_file_t *rf, const char *name, size_t numel) {
  for (int i = 0; i < rf->n; i++)
    if (!strcmp(rf->recs[i].name, name)) {
      cr_assert_eq(rf->recs[i].numel, numel, "reference record %s has %zu values, ours %zu",
                   name, rf->recs[i].numel, numel);
      return rf->recs[i].data;
    }
  cr_assert_fail("reference output has no record %s", name);
  return NULL;
}

void ref_free(ref_file_t *rf) {
  for (int i = 0; i < rf->n; i++) free(rf->recs[i].data);
  free(rf->recs);
}

/* Runs the reference script with args; a failure carries the script's stderr,
 * or, when torch or numpy is what is missing, the command that installs them
 * (asked only after a failure: importing torch takes seconds, once is enough). */
void ref_run(const char *args) {
  char script[1024];
  snprintf(script, sizeof script, "%s/tests/reference/gpt2_ref.py", tu_root());
  cr_assert(access(script, R_OK) == 0,
            "reference script %s not found; run from the project root or set FSDP_ROOT", script);
  char *errpath = tu_path("ref.stderr");
  size_t n = strlen(script) + strlen(args) + strlen(errpath) + 64;
  char *cmd = malloc(n);
  cr_assert_not_null(cmd);
  snprintf(cmd, n, "/usr/bin/python3 '%s' %s 2>'%s'", script, args, errpath);
  int rc = system(cmd);
  if (rc != 0) {
    int imp = system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1");
    cr_assert(imp == 0,
              "the PyTorch reference needs /usr/bin/python3 with torch and numpy, and "
              "`/usr/bin/python3 -c \"import torch, numpy\"` failed (status %d); install them "
              "with `apt-get install python3-torch python3-numpy` (or `make deps-test`)", imp);
    /* the tail of stderr: a Python traceback ends with its reason */
    char msg[2048] = "";
    FILE *f = fopen(errpath, "r");
    if (f) {
      fseek(f, 0, SEEK_END);
      long len = ftell(f);
      fseek(f, len > (long)sizeof msg - 1 ? len - (long)sizeof msg + 1 : 0, SEEK_SET);
      size_t k = fread(msg, 1, sizeof msg - 1, f);
      msg[k] = 0;
      fclose(f);
    }
    cr_assert_fail("reference failed (%s %d): %s\n%s",
                   WIFEXITED(rc) ? "exit status" : "signal",
                   WIFEXITED(rc) ? WEXITSTATUS(rc) : WIFSIGNALED(rc) ? WTERMSIG(rc) : rc, cmd, msg);
  }
  free(cmd);
  free(errpath);
}


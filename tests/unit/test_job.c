/* Unit tests of a job's admission (daemon/job/job.h): invalid specs refused
 * with the error code and a message naming the field, every problem of a
 * spec listed, valid specs resolved as fsdp-train resolves them, the memory
 * plan against a device's memory with the change that fits, and paths kept
 * inside the operator's roots (in a mkdtemp tree).
 *
 * This binary links only the job library and daemon/common (Makefile): that
 * it links at all is the proof that the coordinator can admit jobs without
 * the engine. So it uses no testutil helper. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/job/job.h"

#define MAX_OPTS 8
typedef struct {
  const char *name;
  job_opt_t opts[MAX_OPTS]; /* ends at the first NULL key */
  int world;
  int code;
  const char *field; /* the message names it */
} bad_spec_t;

static int count_opts(const job_opt_t *o) {
  int n = 0;
  while (n < MAX_OPTS && o[n].key) n++;
  return n;
}

/* Every spec has its data file named, so each refusal is its own problem. */
#define DATA {NULL, "data", "x.bin"}
static const bad_spec_t bad_specs[] = {
    {"mesh 2x3 on 4 ranks", {DATA, {"shard", "strategy", "HYBRID_SHARD"}, {NULL, "mesh", "2x3"}},
     4, FSDP_EINVAL, "mesh"},
    {"heads 5 with channels 64", {DATA, {"model", "channels", "64"}, {"model", "heads", "5"}}, 1,
     FSDP_EINVAL, "heads"},
    {"preset gpt5", {DATA, {NULL, "model", "gpt5"}}, 1, FSDP_EINVAL, "model"},
    {"steps 0", {DATA, {"train", "steps", "0"}}, 1, FSDP_EINVAL, "steps"},
    {"batch -1", {DATA, {NULL, "batch", "-1"}}, 1, FSDP_EINVAL, "batch"},
    {"seq_len above context", {DATA, {NULL, "model", "tiny"}, {NULL, "seq_len", "65"}}, 1,
     FSDP_EINVAL, "seq_len"},
    {"strategy SOMETHING", {DATA, {NULL, "strategy", "SOMETHING"}}, 2, FSDP_EINVAL, "strategy"},
    {"precision fp16", {DATA, {NULL, "precision", "fp16"}}, 1, FSDP_EINVAL, "precision"},
    {"unknown key", {DATA, {NULL, "learning_rate", "1e-3"}}, 1, FSDP_EINVAL, "learning_rate"},
    {"key under another section", {DATA, {"optim", "steps", "10"}}, 1, FSDP_EINVAL, "steps"},
    {"no data file", {{NULL, "steps", "10"}}, 1, FSDP_EINVAL, "data"},
    {"warmup above steps", {DATA, {NULL, "steps", "5"}, {NULL, "warmup_steps", "6"}}, 1,
     FSDP_EINVAL, "warmup_steps"},
    {"no ranks", {DATA}, 0, FSDP_EINVAL, "world"},
    {"a key set twice", {DATA, {"train", "steps", "5"}, {"train", "steps", "7"}}, 1, FSDP_EINVAL,
     "steps is set twice"},
    {"NO_SHARD on a 1x2 mesh", {DATA, {NULL, "strategy", "NO_SHARD"}, {NULL, "mesh", "1x2"}}, 2,
     FSDP_EINVAL, "mesh"},
};

Test(job, invalid_specs_name_the_field) {
  for (size_t i = 0; i < sizeof bad_specs / sizeof *bad_specs; i++) {
    const bad_spec_t *s = &bad_specs[i];
    config_t c;
    plan_t p;
    int rc = job_validate(s->opts, count_opts(s->opts), s->world, 0, &c, &p);
    cr_assert_eq(rc, s->code, "%s: code %d (%s), want %d", s->name, rc, err_msg(), s->code);
    cr_assert(strstr(err_msg(), s->field), "%s: the message does not name %s: %s", s->name,
              s->field, err_msg());
    cr_assert_null(strchr(err_msg(), '\n'), "%s: one problem, one line: %s", s->name, err_msg());
  }
}

Test(job, every_problem_is_listed_one_per_line) {
  const job_opt_t o[] = {{NULL, "steps", "0"}, {NULL, "strategy", "SOMETHING"},
                         {NULL, "colour", "blue"}, {NULL, "model", "gpt5"}};
  config_t c;
  plan_t p;
  cr_assert_eq(job_validate(o, 4, 1, 0, &c, &p), FSDP_EINVAL);
  const char *m = err_msg();
  const char *fields[] = {"steps", "strategy", "colour", "model", "data"};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
    cr_assert(strstr(m, fields[i]), "%s is not named: %s", fields[i], m);
  int lines = 1;
  for (const char *q = m; *q; q++) lines += *q == '\n';
  cr_assert_eq(lines, 5, "one line per problem: %s", m);
}

/* A job file with the options of o, one `key = value` line each under its
 * section (when it has one), as fsdp-train would read it. */
static void write_job_file(const char *path, const job_opt_t *o, int n) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  for (int i = 0; i < n; i++) {
    if (o[i].section) fprintf(f, "[%s]\n", o[i].section);
    fprintf(f, "%s = %s\n", o[i].key, o[i].value);
  }
  fclose(f);
}

static char *config_text(const config_t *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  config_write(c, f);
  fclose(f);
  return buf;
}

Test(job, valid_specs_resolve_as_fsdp_train_does) {
  const job_opt_t specs[][MAX_OPTS] = {
      {DATA, {"model", "model", "tiny"}, {"train", "steps", "5"}}, /* seq_len, warmup fitted */
      {DATA, {"shard", "strategy", "HYBRID_SHARD"}, {"shard", "mesh", "2x2"},
       {"shard", "precision", "bf16-mixed"}, {"train", "grad_accum", "2"}},
      {DATA, {NULL, "model", ""}, {NULL, "layers", "3"}, {NULL, "channels", "96"},
       {NULL, "heads", "3"}, {NULL, "vocab", "300"}, {NULL, "context", "32"}},
  };
  const int worlds[] = {1, 4, 2};
  char dir[] = "/tmp/test_job_XXXXXX", path[PATH_MAX];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/job.conf", dir);
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
    const int n = count_opts(specs[i]);
    config_t c, f;
    plan_t p, pf;
    cr_assert_eq(job_validate(specs[i], n, worlds[i], 64ull << 30, &c, &p), FSDP_OK,
                 "spec %zu: %s", i, err_msg());
    write_job_file(path, specs[i], n);
    config_default(&f);
    cr_assert_eq(config_load_file(&f, path), FSDP_OK, "%s", err_msg());
    cr_assert_eq(config_finish(&f), FSDP_OK, "%s", err_msg());
    char *a = config_text(&c), *b = config_text(&f);
    cr_assert_str_eq(a, b, "spec %zu resolves otherwise than the job file", i);
    free(a);
    free(b);
    cr_assert_eq(plan_job(&f, worlds[i], &pf), FSDP_OK);
    cr_assert_eq(p.total, pf.total, "spec %zu: the plan is fsdp-train's", i);
    cr_assert(p.total > 0);
  }
  cr_assert_eq(unlink(path), 0);
  cr_assert_eq(rmdir(dir), 0);
  /* the fitted defaults are said, as fsdp-train says them */
  config_t c;
  plan_t p;
  cr_assert_eq(job_validate(specs[0], count_opts(specs[0]), 1, 0, &c, &p), FSDP_OK);
  cr_assert_eq(c.seq_len, 64);
  cr_assert_eq(c.warmup_steps, 5);
  cr_assert(strstr(config_adjusted(&c), "seq_len"), "%s", config_adjusted(&c));
}

Test(job, memory_too_small_is_refused_with_the_fix) {
  const job_opt_t o[] = {DATA, {NULL, "model", "small"}, {NULL, "batch", "8"}};
  config_t c;
  plan_t p, q;
  cr_assert_eq(job_validate(o, 3, 1, 64ull << 30, &c, &p), FSDP_OK, "%s", err_msg());
  config_t ck = c;
  ck.activation_checkpointing = 1;
  cr_assert_eq(plan_job(&ck, 1, &q), FSDP_OK);
  cr_assert(q.total < p.total);
  /* between the two plans: checkpointing is the single change that fits */
  const size_t dev = (p.total + q.total) / 2;
  cr_assert_eq(job_validate(o, 3, 1, dev, &c, &p), FSDP_ENOMEM);
  const char *m = err_msg();
  cr_assert(strstr(m, "memory") && strstr(m, "largest devices of its kind"), "%s", m);
  cr_assert(strstr(m, "activation_checkpointing = 1"), "the fix is named: %s", m);
  char need[64];
  snprintf(need, sizeof need, "%.0f MiB", (double)p.total / 1048576.0);
  cr_assert(strstr(m, need), "the plan's number (%s) is given: %s", need, m);
  /* the job's own, smaller limit is the one checked, and named */
  const job_opt_t lim[] = {DATA, {NULL, "model", "small"}, {NULL, "batch", "8"},
                           {NULL, "memory_limit_mib", "1"}};
  cr_assert_eq(job_validate(lim, 4, 1, 64ull << 30, &c, &p), FSDP_ENOMEM);
  cr_assert(strstr(err_msg(), "memory_limit_mib"), "%s", err_msg());
  /* a device that holds the plan exactly is enough */
  cr_assert_eq(job_validate(o, 3, 1, p.total, &c, &p), FSDP_OK, "%s", err_msg());
}

/* A cuda job left to its device's recompute (0 there) is admitted on a
 * smaller device recomputing what makes it fit (plan_fit_recompute), and
 * *out says the level it is admitted at; a level the spec sets is kept,
 * and refused where it does not fit. */
Test(job, a_cuda_jobs_default_recompute_is_raised_to_fit_the_smallest_device) {
  const job_opt_t o[] = {DATA, {NULL, "model", "small"}, {NULL, "batch", "8"},
                         {NULL, "device", "cuda"}, {NULL, "recompute", "0"}};
  config_t c;
  plan_t p0, p2, q;
  cr_assert_eq(job_validate(o, 5, 1, 64ull << 30, &c, &p0), FSDP_OK, "%s", err_msg());
  config_t k = c;
  k.recompute = 2;
  cr_assert_eq(plan_job(&k, 1, &p2), FSDP_OK);
  cr_assert(p2.total < p0.total);
  cr_assert_eq(job_validate(o, 4, 1, p2.total, &c, &q), FSDP_OK, "%s", err_msg());
  cr_assert_eq(c.recompute, 2, "the default raised to fit");
  cr_assert_eq(q.total, p2.total, "the plan at the level admitted");
  cr_assert_eq(job_validate(o, 4, 1, 64ull << 30, &c, &q), FSDP_OK, "%s", err_msg());
  cr_assert_eq(c.recompute, -1, "left to the device where it fits");
  cr_assert_eq(q.total, p0.total);
  cr_assert_eq(job_validate(o, 5, 1, p2.total, &c, &q), FSDP_ENOMEM, "the spec's own 0");
  cr_assert(strstr(err_msg(), "recompute = 2"), "the fix is named: %s", err_msg());
}

/* ---- paths ---------------------------------------------------------------- */

typedef struct {
  char top[64];        /* the mkdtemp tree */
  char root[128];      /* top/root: the operator's roots */
  char root2[128];
} tree_t;

static void touch(const char *dir, const char *name) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f, "%s", p);
  fputs("tokens", f);
  fclose(f);
}

/* top/root/{data.bin, out/, link -> top/outside.bin, dangling -> top/nowhere,
 * sub/ -> top (a directory link out)}, top/root2/other.bin, top/outside.bin */
static void tree_make(tree_t *t) {
  snprintf(t->top, sizeof t->top, "/tmp/test_job_XXXXXX");
  cr_assert_not_null(mkdtemp(t->top));
  char p[PATH_MAX], q[PATH_MAX];
  snprintf(t->root, sizeof t->root, "%s/root", t->top);
  snprintf(t->root2, sizeof t->root2, "%s/root2", t->top);
  cr_assert_eq(mkdir(t->root, 0700), 0);
  cr_assert_eq(mkdir(t->root2, 0700), 0);
  snprintf(p, sizeof p, "%s/out", t->root);
  cr_assert_eq(mkdir(p, 0700), 0);
  touch(t->root, "data.bin");
  touch(t->root2, "other.bin");
  touch(t->top, "outside.bin");
  snprintf(p, sizeof p, "%s/link", t->root);
  snprintf(q, sizeof q, "%s/outside.bin", t->top);
  cr_assert_eq(symlink(q, p), 0);
  snprintf(p, sizeof p, "%s/dangling", t->root);
  snprintf(q, sizeof q, "%s/nowhere.bin", t->top);
  cr_assert_eq(symlink(q, p), 0);
  snprintf(p, sizeof p, "%s/sub", t->root);
  cr_assert_eq(symlink(t->top, p), 0);
}

static void tree_remove(const tree_t *t) {
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->top);
  cr_assert_eq(system(cmd), 0);
}

/* A job's config with one path field set (data always set, so a check of
 * another field runs with a valid data path). */
static int check_path(const tree_t *t, const char *key, const char *value, config_t *c) {
  config_default(c);
  cr_assert_eq(config_set(c, "data", "data.bin"), 0);
  cr_assert_eq(config_set(c, key, value), 0, "%s", err_msg());
  const char *roots[] = {t->root, t->root2};
  return job_paths_check(c, roots, 2);
}

Test(job, paths_outside_the_roots_are_refused) {
  tree_t t;
  tree_make(&t);
  char abs_out[PATH_MAX];
  snprintf(abs_out, sizeof abs_out, "%s/outside.bin", t.top);
  const struct {
    const char *key, *value;
    int code;
    const char *says; /* besides the field */
  } cases[] = {
      {"data", "../outside.bin", FSDP_EINVAL, "outside the allowed roots"},
      {"data", abs_out, FSDP_EINVAL, "outside the allowed roots"},
      {"data", "link", FSDP_EINVAL, "outside the allowed roots"},
      {"data", "sub/outside.bin", FSDP_EINVAL, "outside the allowed roots"},
      {"data", "missing.bin", FSDP_ENOENT, "does not exist"},
      {"data", "out", FSDP_EINVAL, "not a regular file"},
      {"init_from", "../../etc/passwd", FSDP_EINVAL, "outside the allowed roots"},
      {"save", "../escape.bin", FSDP_EINVAL, "outside the allowed roots"},
      {"save", "sub/escape.bin", FSDP_EINVAL, "outside the allowed roots"},
      {"save", "missing/model.bin", FSDP_ENOENT, "directory"},
      {"save", "dangling", FSDP_EINVAL, "symlink"},
      {"save", "missing/../model.bin", FSDP_EINVAL, ".."},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    config_t c;
    int rc = check_path(&t, cases[i].key, cases[i].value, &c);
    cr_assert_eq(rc, cases[i].code, "%s = %s: code %d (%s)", cases[i].key, cases[i].value, rc,
                 err_msg());
    const char *m = err_msg();
    cr_assert(!strncmp(m, cases[i].key, strlen(cases[i].key)) && strstr(m, cases[i].says),
              "%s = %s: %s", cases[i].key, cases[i].value, m);
    if (!strcmp(cases[i].says, "outside the allowed roots"))
      cr_assert(strstr(m, cases[i].value) && strstr(m, t.root) && strstr(m, t.root2),
                "the path and the roots are named: %s", m);
  }
  tree_remove(&t);
}

Test(job, paths_inside_the_roots_resolve) {
  tree_t t;
  tree_make(&t);
  char rroot[PATH_MAX], want[PATH_MAX + 32];
  cr_assert_not_null(realpath(t.root, rroot));
  config_t c;
  /* a relative input, against the first root */
  cr_assert_eq(check_path(&t, "init_from", "./out/../data.bin", &c), FSDP_OK, "%s", err_msg());
  snprintf(want, sizeof want, "%s/data.bin", rroot);
  cr_assert_str_eq(c.data, want);
  cr_assert_str_eq(c.init_from, want);
  /* a new output in an existing directory */
  cr_assert_eq(check_path(&t, "save", "out/model.bin", &c), FSDP_OK, "%s", err_msg());
  snprintf(want, sizeof want, "%s/out/model.bin", rroot);
  cr_assert_str_eq(c.save, want);
  /* an absolute path in the second root */
  char abs[PATH_MAX], rabs[PATH_MAX];
  snprintf(abs, sizeof abs, "%s/other.bin", t.root2);
  cr_assert_not_null(realpath(abs, rabs));
  cr_assert_eq(check_path(&t, "init_from", abs, &c), FSDP_OK, "%s", err_msg());
  cr_assert_str_eq(c.init_from, rabs);
  /* an existing output is overwritten: fine inside a root */
  touch(t.root, "out/old.bin");
  cr_assert_eq(check_path(&t, "save", "out/old.bin", &c), FSDP_OK, "%s", err_msg());
  tree_remove(&t);
}

/* save naming a file the run reads is refused at submit, naming both
 * options: the data (submit's --data and --save to one file destroyed the
 * token file), by any spelling or a hard link, and init_from. */
Test(job, a_save_that_is_the_data_or_init_from_is_refused) {
  tree_t t;
  tree_make(&t);
  char p[PATH_MAX], q[PATH_MAX];
  snprintf(p, sizeof p, "%s/data.bin", t.root);
  snprintf(q, sizeof q, "%s/hard.bin", t.root);
  cr_assert_eq(link(p, q), 0);
  const char *same[] = {"data.bin", "./out/../data.bin", p, "hard.bin"};
  for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
    config_t c;
    cr_assert_eq(check_path(&t, "save", same[i], &c), FSDP_EINVAL, "save = %s: %s", same[i],
                 err_msg());
    const char *m = err_msg();
    cr_assert(!strncmp(m, "save: ", 6) && strstr(m, "is the data file") &&
              strstr(m, "give save a path of its own"), "%s", m);
  }
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", "data.bin"), 0);
  cr_assert_eq(config_set(&c, "init_from", "out/w.bin"), 0);
  cr_assert_eq(config_set(&c, "save", "out/w.bin"), 0);
  touch(t.root, "out/w.bin");
  const char *roots[] = {t.root, t.root2};
  cr_assert_eq(job_paths_check(&c, roots, 2), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "is the init_from file"), "%s", err_msg());
  tree_remove(&t);
}

Test(job, roots_are_the_operators_to_get_right) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", "x.bin"), 0);
  cr_assert_eq(job_paths_check(&c, NULL, 0), FSDP_EINVAL);
  cr_assert(!strncmp(err_msg(), "roots", 5), "%s", err_msg());
  const char *roots[] = {"/nonexistent/test_job_root"};
  cr_assert_eq(job_paths_check(&c, roots, 1), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "roots") && strstr(err_msg(), roots[0]), "%s", err_msg());
}

Test(job, unreadable_data_is_refused) {
  if (geteuid() == 0) return; /* root reads any file: nothing to see */
  tree_t t;
  tree_make(&t);
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/data.bin", t.root);
  cr_assert_eq(chmod(p, 0), 0);
  config_t c;
  cr_assert_neq(check_path(&t, "save", "out/m.bin", &c), FSDP_OK);
  cr_assert(!strncmp(err_msg(), "data", 4) && strstr(err_msg(), "cannot be read"), "%s",
            err_msg());
  tree_remove(&t);
}

/* path holds a JSON value of exactly len bytes: {"k0":[[1]],"k1":...}
 * (slow to parse: each key a nested array), padded with spaces, after an
 * 8-byte length when st is set (a safetensors header). */
static void write_json(const char *path, uint64_t len, int st) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "%s", path);
  if (st)
    for (int i = 0; i < 8; i++) fputc((int)(len >> (8 * i) & 0xff), f);
  uint64_t n = 1;
  fputc('{', f);
  for (int k = 0; n + 32 < len; k++) n += (uint64_t)fprintf(f, "%s\"k%d\":[[1]]", k ? "," : "", k);
  for (; n + 1 < len; n++) fputc(' ', f);
  fputc('}', f);
  fclose(f);
}

/* What a submit parses is bounded by the model: an init_from whose
 * safetensors header, or a resume_from whose manifest (the directory's own
 * or its latest step's), is larger than the model could need is refused
 * unread, naming the field, the file, its size and the limit; one at the
 * limit is read (and refused for what it holds). Before, the coordinator
 * parsed up to 100 MiB (a header) or 64 MiB (a manifest): 29 s and 2.6 GB
 * on its loop for a 99 MiB header (found by an outside tester). */
Test(job, a_header_or_manifest_larger_than_the_model_needs_is_refused_unread) {
  tree_t t;
  tree_make(&t);
  char p[PATH_MAX], want[256];
  config_t c;
  cr_assert_eq(check_path(&t, "save", "out/m.bin", &c), FSDP_OK, "%s", err_msg());
  const uint64_t hmax = job_header_max(&c.gpt), mmax = job_manifest_max(&c.gpt);
  cr_assert(hmax < (2u << 20) && mmax < (3u << 20), "limits %llu, %llu", (unsigned long long)hmax,
            (unsigned long long)mmax);
  snprintf(p, sizeof p, "%s/big.safetensors", t.root);
  write_json(p, hmax + 1, 1);
  cr_assert_eq(check_path(&t, "init_from", "big.safetensors", &c), FSDP_OK, "%s", err_msg());
  cr_assert_eq(job_init_from_check(&c), FSDP_EINVAL);
  snprintf(want, sizeof want, "header of %llu bytes, over the limit of %llu bytes",
           (unsigned long long)hmax + 1, (unsigned long long)hmax);
  cr_expect(!strncmp(err_msg(), "init_from: ", 11) && strstr(err_msg(), "big.safetensors") &&
            strstr(err_msg(), want), "%s", err_msg());
  write_json(p, hmax, 1); /* at the limit: read, and refused for its tensors */
  cr_assert_eq(check_path(&t, "init_from", "big.safetensors", &c), FSDP_OK, "%s", err_msg());
  cr_assert_neq(job_init_from_check(&c), FSDP_OK);
  cr_expect(!strstr(err_msg(), "over the limit"), "%s", err_msg());
  /* a manifest: the latest step's, then the directory's own */
  snprintf(p, sizeof p, "%s/ck", t.root);
  cr_assert_eq(mkdir(p, 0700), 0);
  snprintf(p, sizeof p, "%s/ck/step-00000004", t.root);
  cr_assert_eq(mkdir(p, 0700), 0);
  snprintf(p, sizeof p, "%s/ck/step-00000004/manifest.json", t.root);
  write_json(p, mmax + 1, 0);
  snprintf(want, sizeof want, "%llu bytes, over the limit of %llu bytes",
           (unsigned long long)mmax + 1, (unsigned long long)mmax);
  const char *dirs[] = {"ck", "ck/step-00000004"};
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(check_path(&t, "resume_from", dirs[i], &c), FSDP_OK, "%s", err_msg());
    cr_assert_eq(job_resume_check(&c), FSDP_EINVAL, "%s", dirs[i]);
    cr_expect(!strncmp(err_msg(), "resume_from: ", 13) && strstr(err_msg(), "manifest.json") &&
              strstr(err_msg(), want), "%s: %s", dirs[i], err_msg());
  }
  /* at the limit: read, and damaged, with no checkpoint before it to fall
   * back to: refused as the ranks would refuse it, not for its size */
  write_json(p, mmax, 0);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(check_path(&t, "resume_from", dirs[i], &c), FSDP_OK, "%s", err_msg());
    cr_expect_eq(job_resume_check(&c), FSDP_EINVAL, "%s", dirs[i]);
    cr_expect(strstr(err_msg(), "not an fsdpd checkpoint manifest") &&
              strstr(err_msg(), "name another checkpoint") && !strstr(err_msg(), "over the limit"),
              "%s: %s", dirs[i], err_msg());
  }
  tree_remove(&t);
}

/* ---- what a resume must match, checked at submit --------------------------- */

static const gpt_config_t model_a = {2, 32, 2, 64, 32}, model_b = {1, 16, 2, 64, 32};

/* root/dir/step-<step>/manifest.json of model m, by a run of seed (NULL:
 * none recorded, as before it was), of 2 shards of a 2x2 HYBRID_SHARD mesh
 * in bf16-true: what job_resume_check reads (no shard is there: it never
 * opens one). damaged: not JSON. */
static void manifest_at(const char *root, const char *dir, long long step, gpt_config_t m,
                        const char *seed, int damaged) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", root, dir);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/%s/step-%08lld", root, dir, step);
  cr_assert_eq(mkdir(p, 0700), 0, "%s", p);
  snprintf(p, sizeof p, "%s/%s/step-%08lld/manifest.json", root, dir, step);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f, "%s", p);
  const unsigned long long total = (gpt_config_num_params(&m) + 1) / 2;
  if (damaged) fputs("{\"format\": ", f);
  else
    fprintf(f, "{\"format\": \"fsdpd-checkpoint\", \"version\": 1, \"step\": %lld, \"shards\": 2, "
            "\"replicas\": 2, \"strategy\": \"HYBRID_SHARD\", \"precision\": \"bf16-true\", "
            "\"min_params\": 0, \"shard_total\": %llu,%s%s%s \"model\": {\"layers\": %d, "
            "\"channels\": %d, \"heads\": %d, \"vocab\": %d, \"context\": %d}, \"units\": [], "
            "\"files\": [{\"shard\": 0, \"name\": \"shard-00000-of-00002.fsdp\", \"bytes\": 1, "
            "\"xxh64\": \"0000000000000000\"}, {\"shard\": 1, \"name\": "
            "\"shard-00001-of-00002.fsdp\", \"bytes\": 1, \"xxh64\": \"0000000000000000\"}]}\n",
            step, total, seed ? " \"seed\": \"" : "", seed ? seed : "", seed ? "\"," : "",
            m.layers, m.channels, m.heads, m.vocab, m.context);
  fclose(f);
}

/* The job of model_a and the options kv ("key", "value", ..., NULL) under
 * the tree's roots, its paths checked, then job_resume_check's verdict. */
static int resume_verdict(const tree_t *t, const char *const *kv) {
  config_t c;
  config_default(&c);
  cr_assert_eq(config_set(&c, "data", "data.bin"), 0);
  for (int i = 0; kv[i]; i += 2) cr_assert_eq(config_set(&c, kv[i], kv[i + 1]), 0, "%s", err_msg());
  c.gpt = model_a;
  const char *roots[] = {t->root, t->root2};
  int rc = job_paths_check(&c, roots, 2);
  return rc ? rc : job_resume_check(&c);
}

/* Everything the ranks would refuse as they load the checkpoint they
 * resume from (resume_from's, or with auto_resume checkpoint_dir's latest)
 * that its manifest says is refused at submit, in the ranks' words after
 * the field, with the fix; before, only resume_from's model was checked,
 * and each of these was admitted and failed at its ranks (an attempt and a
 * restart each, found by an outside tester). What a resume allows passes:
 * another mesh, strategy and precision than the checkpoint's, a
 * checkpoint_dir with no checkpoint yet, steps equal to the checkpoint's,
 * a manifest that does not record the seed (the ranks check the shards'). */
Test(job, a_resume_its_ranks_would_refuse_is_refused_at_submit_in_their_words) {
  tree_t t;
  tree_make(&t);
  manifest_at(t.root, "ck", 20, model_a, "1337", 0);
  manifest_at(t.root, "ck", 40, model_a, "1337", 0);
  manifest_at(t.root, "tiny", 10, model_b, "1337", 0);
  manifest_at(t.root, "old", 5, model_a, NULL, 0);
  manifest_at(t.root, "dmg", 10, model_a, "1337", 0);
  manifest_at(t.root, "dmg", 20, model_a, "1337", 1);
  manifest_at(t.root, "dmg1", 20, model_a, "1337", 1);
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/live", t.root); /* a running job's: no checkpoint committed yet */
  cr_assert_eq(mkdir(p, 0700), 0);
  snprintf(p, sizeof p, "%s/live/step-00000005", t.root);
  cr_assert_eq(mkdir(p, 0700), 0);
  struct {
    const char *kv[9];
    int rc;
    const char *want[3]; /* in the message, in order */
  } cases[] = {
      {{"resume_from", "ck/step-00000040", "steps", "20", NULL}, FSDP_EINVAL,
       {"resume_from: ", "step-00000040 is at step 40, past this job's steps 20; raise steps"}},
      {{"resume_from", "ck", "seed", "7", "steps", "45", NULL}, FSDP_EINVAL,
       {"resume_from: ", "step-00000040 was trained with seed 1337, this job has 7", "set seed = 1337"}},
      {{"checkpoint_dir", "tiny", "checkpoint_every", "5", "steps", "50", NULL}, FSDP_EINVAL,
       {"checkpoint_dir (auto_resume): ", "holds a model of layers 1, channels 16",
        "give this job a checkpoint_dir of its own"}},
      {{"checkpoint_dir", "ck", "steps", "20", NULL}, FSDP_EINVAL,
       {"checkpoint_dir (auto_resume): ", "is at step 40, past this job's steps 20; raise steps",
        "checkpoint_dir of its own"}},
      {{"checkpoint_dir", "ck", "seed", "7", NULL}, FSDP_EINVAL,
       {"checkpoint_dir (auto_resume): ", "trained with seed 1337, this job has 7"}},
      {{"checkpoint_dir", "ck", "auto_resume", "0", NULL}, FSDP_EINVAL,
       {"checkpoint_dir: ", "holds step 40, committed by an earlier run", "of its own"}},
      {{"resume_from", "live", NULL}, FSDP_EINVAL,
       {"resume_from: ", "holds no committed checkpoint", "name a committed checkpoint"}},
      {{"resume_from", "ck/step-00000025", NULL}, FSDP_ENOENT,
       {"resume_from: ", "does not exist; ", "checkpoints of steps 20, 40: name one, such as "}},
      {{"resume_from", "dmg1", NULL}, FSDP_EINVAL,
       {"resume_from: ", "is damaged", "no committed checkpoint is before it"}},
      /* allowed */
      {{"resume_from", "ck", "steps", "45", NULL}, FSDP_OK, {NULL}},
      {{"resume_from", "ck/step-00000020", "steps", "20", NULL}, FSDP_OK, {NULL}},
      {{"checkpoint_dir", "ck", "steps", "40", NULL}, FSDP_OK, {NULL}},
      {{"checkpoint_dir", "live", "checkpoint_every", "5", NULL}, FSDP_OK, {NULL}},
      {{"checkpoint_dir", "out", NULL}, FSDP_OK, {NULL}},
      {{"resume_from", "old", "seed", "7", NULL}, FSDP_OK, {NULL}},
      {{"resume_from", "dmg", NULL}, FSDP_OK, {NULL}},
      {{"resume_from", "tiny", "checkpoint_dir", "ck", NULL}, FSDP_OK, {NULL}}, /* ck's 40 is later */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const int rc = resume_verdict(&t, cases[i].kv);
    cr_expect_eq(rc, cases[i].rc, "case %zu (%s %s): %d %s", i, cases[i].kv[0], cases[i].kv[1],
                 rc, rc ? err_msg() : "");
    const char *at = err_msg();
    for (int k = 0; rc && k < 3 && cases[i].want[k]; k++) {
      const char *hit = strstr(at, cases[i].want[k]);
      cr_expect(hit && (k || hit == at), "case %zu: \"%s\" not in: %s", i, cases[i].want[k],
                err_msg());
      if (hit) at = hit;
    }
  }
  /* the one suggested for a missing step is the one before it, then the latest */
  const char *missing[] = {"resume_from", "ck/step-00000025", NULL};
  cr_assert_eq(resume_verdict(&t, missing), FSDP_ENOENT);
  cr_expect(strstr(err_msg(), "ck/step-00000020 (the latest before step 25)") &&
            strstr(err_msg(), "ck itself for its latest (step 40)") &&
            !strstr(err_msg(), "create the directory"), "%s", err_msg());
  const char *after[] = {"resume_from", "ck/step-00000090", NULL};
  cr_assert_eq(resume_verdict(&t, after), FSDP_ENOENT);
  cr_expect(strstr(err_msg(), "ck/step-00000040 (the latest)"), "%s", err_msg());
  tree_remove(&t);
}

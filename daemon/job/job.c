/* job: a job's admission: its options, its memory and its paths (see job.h). */
#include "daemon/job/job.h"

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/job/ckpt.h"
#include "daemon/job/safetensors.h"
#include "daemon/job/shard.h"

/* ---- validation ------------------------------------------------------------ */

/* The problems found so far, one line each. err.c keeps at most 1 KiB of a
 * message, so lines that would not fit are counted instead, and the last
 * line says how many. */
#define JOB_MSG_MAX 1000
typedef struct job_problems {
  int first;   /* code of the first problem (FSDP_OK: none) */
  int omitted; /* problems that did not fit */
  size_t len;
  char text[JOB_MSG_MAX];
} job_problems_t;

static void job_problem(void *ctx, int code) {
  job_problems_t *p = ctx;
  if (!p->first) p->first = code;
  const char *m = err_msg();
  /* room is kept for the closing "(and N more)" line */
  if (p->omitted || p->len + strlen(m) + 2 > sizeof p->text - 32) {
    p->omitted++;
    return;
  }
  p->len += (size_t)snprintf(p->text + p->len, sizeof p->text - p->len, "%s%s",
                             p->len ? "\n" : "", m);
}

static int job_problems_end(job_problems_t *p) {
  if (!p->first) return FSDP_OK;
  if (p->omitted)
    snprintf(p->text + p->len, sizeof p->text - p->len, "\n(and %d more)", p->omitted);
  return err_set(p->first, "%s", p->text);
}

int job_validate(const job_opt_t *opts, int n, int world, size_t device_bytes, config_t *out,
                 plan_t *plan) {
  job_problems_t pr = {0};
  config_default(out);
  memset(plan, 0, sizeof *plan);
  for (int i = 0; i < n; i++) {
    const job_opt_t *o = &opts[i];
    if (!o->key || !o->value)
      job_problem(&pr, err_set(FSDP_EINVAL, "option %d: no %s given; every option is key = "
                               "value", i, o->key ? "value" : "key"));
    else {
      int twice = 0; /* as fsdp-train refuses it in the rank's job file: say it at submit */
      for (int k = 0; k < i && !twice; k++) twice = opts[k].key && !strcmp(opts[k].key, o->key);
      int rc = twice ? err_set(FSDP_EINVAL, "%s is set twice; keep one line for it (a flag "
                               "replaces the job file's)", o->key)
                     : config_set_in(out, o->section, o->key, o->value);
      if (rc) job_problem(&pr, rc);
    }
  }
  if (world < 1)
    job_problem(&pr, err_set(FSDP_EINVAL, "world: %d ranks; a job needs at least 1", world));
  else
    config_check(out, world, job_problem, &pr);
  if (pr.first || !device_bytes) return job_problems_end(&pr);
  /* the memory plan needs a job that holds: only then is it worth stating */
  int rc = plan_job(out, world, plan);
  if (rc) return rc;
  const size_t own = (size_t)out->memory_limit_mib << 20;
  plan_fit_recompute(out, world, plan, own && own < device_bytes ? own : device_bytes);
  plan_fit_snapshot(out, world, plan, own && own < device_bytes ? own : device_bytes);
  if (own && own < device_bytes)
    return plan_fits(plan, out, own, "memory_limit_mib, set by the job");
  return plan_fits(plan, out, device_bytes, "the smallest of the cluster's largest devices of "
                   "its kind, one for each rank");
}

/* ---- paths ------------------------------------------------------------------ */

/* The paths of a job: whether each is a file read (it must exist), a file
 * written (its directory must exist) or a directory (it must exist: the
 * checkpoints' root, written; a checkpoint to resume from, read). */
typedef enum { JOB_PATH_IN, JOB_PATH_OUT, JOB_PATH_DIR } job_path_kind_t;
#define JOB_FIELD(f) offsetof(config_t, f), sizeof(((config_t *)0)->f)
static const struct {
  const char *key;
  size_t offset, size;
  job_path_kind_t kind;
} job_paths[] = {
    {"data", JOB_FIELD(data), JOB_PATH_IN},
    {"init_from", JOB_FIELD(init_from), JOB_PATH_IN},
    {"save", JOB_FIELD(save), JOB_PATH_OUT},
    {"checkpoint_dir", JOB_FIELD(checkpoint_dir), JOB_PATH_DIR},
    {"resume_from", JOB_FIELD(resume_from), JOB_PATH_DIR},
};
#undef JOB_FIELD

const char *job_path_value(const config_t *c, const char *key) {
  for (size_t k = 0; k < sizeof job_paths / sizeof *job_paths; k++)
    if (!strcmp(key, job_paths[k].key)) return (const char *)c + job_paths[k].offset;
  return NULL;
}

/* The roots, resolved, for messages: "/a, /b". */
static void job_roots_list(char (*roots)[PATH_MAX], int n, char *buf, size_t len) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < n && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%s", i ? ", " : "", roots[i]);
}

/* 1 when the resolved path p is root or below it. */
static int job_path_inside(const char *p, const char *root) {
  size_t n = strlen(root);
  if (n == 1) return 1; /* "/" */
  return !strncmp(p, root, n) && (p[n] == '/' || p[n] == 0);
}

/* Resolves the absolute path full as far as it exists: res gets the realpath
 * of its longest existing prefix with the rest appended, and *missing how
 * many components of full do not exist (0: all of it does). The rest is
 * taken as written, so "." or ".." in it (whose meaning would depend on
 * directories not there yet) is refused; so is a first missing component
 * that is there as a link to nowhere, which a write would follow. */
static int job_path_resolve(const char *key, const char *full, char res[PATH_MAX], int *missing) {
  char pre[PATH_MAX];
  snprintf(pre, sizeof pre, "%s", full);
  size_t cut = strlen(pre); /* full[cut..] does not exist */
  *missing = 0;
  while (!realpath(pre, res)) {
    if (errno != ENOENT)
      return err_set_errno(FSDP_EINVAL, errno, "%s: %s cannot be resolved", key, full);
    char *s = strrchr(pre, '/');
    cut = (size_t)(s - pre);
    if (s == pre) s[1] = 0; /* "/" itself always resolves */
    else *s = 0;
    (*missing)++;
  }
  if (!*missing) return FSDP_OK;
  const char *rest = full + cut; /* "/a/b": the components that are not there */
  struct stat lst;
  char first[PATH_MAX];
  const char *end = strchr(rest + 1, '/');
  snprintf(first, sizeof first, "%.*s", (int)(end ? (size_t)(end - full) : strlen(full)), full);
  if (!lstat(first, &lst))
    return err_set(FSDP_EINVAL, "%s: %s is a symlink that points nowhere; name the file itself",
                   key, first);
  for (const char *p = rest; p; p = strchr(p + 1, '/')) {
    size_t n = strcspn(p + 1, "/");
    if ((n == 1 && p[1] == '.') || (n == 2 && p[1] == '.' && p[2] == '.'))
      return err_set(FSDP_EINVAL, "%s: %s goes through \"%.*s\" in a directory that does not "
                     "exist; name the path without it", key, full, (int)n, p + 1);
  }
  if (strlen(res) + strlen(rest) >= PATH_MAX)
    return err_set(FSDP_EINVAL, "%s: %s is too long", key, full);
  strcat(res, strcmp(res, "/") ? rest : rest + 1);
  return FSDP_OK;
}

/* resume_from names nothing: what its directory holds, and one to name
 * (res, resolved, and missing as job_path_resolve gave them). Creating the
 * directory, the advice for a checkpoint_dir, makes no checkpoint. */
static int job_resume_missing(const char *full, const char *res, int missing) {
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", res);
  char *slash = strrchr(parent, '/');
  if (slash) slash == parent ? (void)(slash[1] = 0) : (void)(*slash = 0);
  enum { SHOWN = 8 };
  int64_t steps[SHOWN];
  int total = 0;
  if (missing > 1 || ckpt_steps(parent, steps, SHOWN, &total) || !total)
    return err_set(FSDP_ENOENT, "resume_from: %s does not exist; name a committed checkpoint (a "
                   "step-N directory holding %s) or a checkpoint_dir holding one (its latest)",
                   full, CKPT_MANIFEST);
  const int n = total < SHOWN ? total : SHOWN;
  char list[256], more[48] = "", what[64] = "the latest", pick[PATH_MAX + 32];
  size_t k = 0;
  list[0] = 0;
  for (int i = 0; i < n && k < sizeof list; i++)
    k += (size_t)snprintf(list + k, sizeof list - k, "%s%lld", i ? ", " : "", (long long)steps[i]);
  if (total > n) snprintf(more, sizeof more, " (and %d earlier)", total - n);
  /* a step directory asked for: the one before it, else the latest */
  int best = n - 1;
  int64_t asked;
  if (ckpt_dir_step(res, &asked))
    for (int i = n - 1; i >= 0; i--)
      if (steps[i] < asked) {
        best = i;
        if (i < n - 1) snprintf(what, sizeof what, "the latest before step %lld", (long long)asked);
        break;
      }
  ckpt_step_dir(pick, sizeof pick, parent, steps[best]);
  return err_set(FSDP_ENOENT, "resume_from: %s does not exist; %s holds the committed "
                 "checkpoints of step%s %s%s: name one, such as %s (%s), or %s itself for its "
                 "latest (step %lld)", full, parent, total > 1 ? "s" : "", list, more, pick, what,
                 parent, (long long)steps[n - 1]);
}

/* After the root check: what a path must be to be used. */
static int job_path_usable(const char *key, const char *full, const char *res,
                           job_path_kind_t kind, int missing) {
  if (missing) {
    if (kind == JOB_PATH_DIR && !strcmp(key, "resume_from"))
      return job_resume_missing(full, res, missing);
    if (kind == JOB_PATH_DIR)
      return err_set(FSDP_ENOENT, "%s: %s does not exist; create the directory first", key, full);
    if (kind == JOB_PATH_IN)
      return err_set(FSDP_ENOENT, "%s: %s does not exist; name an existing file", key, full);
    if (missing > 1 || res[strlen(res) - 1] == '/')
      return err_set(FSDP_ENOENT, "%s: the directory of %s does not exist; create it, or name a "
                     "file in an existing directory", key, full);
    return FSDP_OK; /* a new file in an existing directory */
  }
  struct stat st;
  if (kind == JOB_PATH_DIR) {
    if (stat(res, &st) || !S_ISDIR(st.st_mode))
      return err_set(FSDP_EINVAL, "%s: %s is not a directory; name one", key, full);
    return FSDP_OK;
  }
  const int seen = !stat(res, &st);
  if (!seen || !S_ISREG(st.st_mode))
    return err_set(FSDP_EINVAL, "%s: %s is not a regular file; name a file%s", key, full,
                   seen && S_ISDIR(st.st_mode) && !strcmp(key, "init_from")
                       ? " (weights: fsdp-train --save, or a .safetensors from fsdpctl export; "
                         "to go on from a checkpoint, give its directory as resume_from)" : "");
  if (kind == JOB_PATH_OUT) return FSDP_OK;
  int fd = open(res, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return err_set_errno(err_from_errno(errno), errno, "%s: %s cannot be read; make it readable",
                         key, full);
  close(fd);
  return FSDP_OK;
}

/* The roots, each resolved (realpath), in a malloc'd array: the one place
 * they are resolved. */
static int job_roots_resolve(const char *const *roots, int nroots, char (**out)[PATH_MAX]) {
  *out = NULL;
  if (nroots < 1)
    return err_set(FSDP_EINVAL, "roots: no directory is configured for jobs' files, so no path "
                   "can be allowed; configure at least one root");
  char (*rr)[PATH_MAX] = malloc(sizeof *rr * (size_t)nroots);
  if (!rr) return err_set(FSDP_ENOMEM, "roots: out of memory");
  for (int i = 0; i < nroots; i++)
    if (!realpath(roots[i], rr[i])) {
      free(rr);
      return err_set_errno(FSDP_EINVAL, errno, "roots: %s cannot be resolved; configure an "
                           "existing directory", roots[i]);
    }
  *out = rr;
  return FSDP_OK;
}

/* The root check: res, what path resolved to, inside one of the n resolved
 * roots rr, else refused naming key, path, res and the roots, then fix. */
static int job_path_within(const char *key, const char *path, const char *res,
                           char (*rr)[PATH_MAX], int n, const char *fix) {
  for (int i = 0; i < n; i++)
    if (job_path_inside(res, rr[i])) return FSDP_OK;
  char list[1024];
  job_roots_list(rr, n, list, sizeof list);
  return err_set(FSDP_EINVAL, "%s: %s resolves to %s, outside the allowed roots (%s); %s", key,
                 path, res, list, fix);
}

int job_path_in_roots(const char *key, const char *path, const char *const *roots, int nroots,
                      const char *fix, char *res) {
  char (*rr)[PATH_MAX];
  int missing = 0, rc = job_roots_resolve(roots, nroots, &rr);
  if (!rc && path[0] != '/')
    rc = err_set(FSDP_EINVAL, "%s: %s is not an absolute path", key, path);
  if (!rc) rc = job_path_resolve(key, path, res, &missing);
  if (!rc && missing) rc = err_set(FSDP_ENOENT, "%s: %s does not exist", key, path);
  if (!rc) rc = job_path_within(key, path, res, rr, nroots, fix);
  free(rr);
  return rc;
}

int job_paths_check(config_t *c, const char *const *roots, int nroots) {
  char (*rr)[PATH_MAX];
  int rc = job_roots_resolve(roots, nroots, &rr);
  for (size_t k = 0; !rc && k < sizeof job_paths / sizeof *job_paths; k++) {
    char *field = (char *)c + job_paths[k].offset;
    const char *key = job_paths[k].key;
    if (!field[0]) continue;
    char full[PATH_MAX], res[PATH_MAX];
    if (snprintf(full, sizeof full, "%s%s%s", field[0] == '/' ? "" : rr[0],
                 field[0] == '/' ? "" : "/", field) >= (int)sizeof full) {
      rc = err_set(FSDP_EINVAL, "%s: %s is too long", key, field);
      break;
    }
    int missing;
    if ((rc = job_path_resolve(key, full, res, &missing))) break;
    if ((rc = job_path_within(key, field, res, rr, nroots, "name a path inside one of them")))
      break;
    if ((rc = job_path_usable(key, full, res, job_paths[k].kind, missing))) break;
    if (strlen(res) >= job_paths[k].size) {
      rc = err_set(FSDP_EINVAL, "%s: %s resolves to %zu characters; the limit is %zu", key,
                   field, strlen(res), job_paths[k].size - 1);
      break;
    }
    memcpy(field, res, strlen(res) + 1);
  }
  free(rr);
  return rc ? rc : job_save_apart(c);
}

int job_save_apart(const config_t *c) {
  static const struct {
    const char *key, *lost;
  } reads[] = {
      {"data", "the token file"},
      {"init_from", "the weights the run starts from (a restart would start from trained ones)"},
  };
  for (size_t i = 0; c->save[0] && i < sizeof reads / sizeof *reads; i++) {
    const char *p = job_path_value(c, reads[i].key);
    if (p[0] && file_same(c->save, p))
      return err_set(FSDP_EINVAL, "save: %s is the %s file (%s = %s): the weights written at the "
                     "end would replace %s; give save a path of its own", c->save, reads[i].key,
                     reads[i].key, p, reads[i].lost);
  }
  return FSDP_OK;
}

uint64_t job_header_max(const gpt_config_t *model) {
  const uint64_t entries = (uint64_t)gpt_config_tensors(model, NULL, 0) + 2 * (uint64_t)model->layers;
  return JOB_HEADER_BASE + JOB_HEADER_ENTRY * entries;
}

uint64_t job_manifest_max(const gpt_config_t *model) {
  const uint64_t entries = JOB_SHARDS_MAX + (uint64_t)model->layers + 1;
  return JOB_MANIFEST_BASE + JOB_MANIFEST_ENTRY * entries;
}

/* A manifest over the limit (FSDP_ELIMIT from ckpt_manifest_read_max; the
 * message names the field, the file, its size and the limit) is refused. */
static int job_manifest_over(const config_t *c, const char *key) {
  char was[1024]; /* err_set writes where err_msg() points */
  snprintf(was, sizeof was, "%s", err_msg());
  return err_set(FSDP_EINVAL, "%s, the most a checkpoint of this model (layers %d) of up to %d "
                 "shards could need; %s", was, c->gpt.layers, JOB_SHARDS_MAX,
                 strcmp(key, "resume_from") ? "give this job a checkpoint_dir of its own"
                                            : "name the directory of a checkpoint this service "
                                              "wrote");
}

int job_resume_check(const config_t *c) {
  if (!c->resume_from[0] && !c->checkpoint_dir[0]) return FSDP_OK;
  const uint64_t max = job_manifest_max(&c->gpt);
  ckpt_from_t from;
  int64_t step;
  /* where the ranks' rank 0 will start, by its own rule (every manifest
   * read under the limit) */
  int rc = ckpt_resume_choose(c->resume_from, c->checkpoint_dir, c->auto_resume, max, &from, &step);
  if (rc == FSDP_ELIMIT)
    return job_manifest_over(c, c->resume_from[0] ? "resume_from" : "checkpoint_dir");
  char was[1024]; /* err_set writes where err_msg() points */
  snprintf(was, sizeof was, "%s", err_msg());
  if (rc == FSDP_ENOENT) /* resume_from holds none (yet): its ranks would fail at once */
    return err_set(FSDP_EINVAL, "%s; name a committed checkpoint (a step-N directory holding %s) "
                   "or a directory holding one (a running job's checkpoint_dir holds its first "
                   "once every shard of it is written: fsdpctl checkpoints JOB lists them; submit "
                   "this job then)", was, CKPT_MANIFEST);
  if (rc == FSDP_EFORMAT) /* resume_from's own manifest, damaged: the ranks fall back to none */
    return err_set(FSDP_EINVAL, "%s; name another checkpoint", was);
  if (rc == FSDP_EEXIST) /* a rewind into checkpoint_dir's steps (it names the fix) */
    return err_set(FSDP_EINVAL, "%s", was);
  if (rc || from == CKPT_FROM_NONE) return FSDP_OK; /* unreadable here: the ranks say (their
                                                       permissions, not the coordinator's) */
  const char *key = from == CKPT_FROM_UNDER_OWN ? "checkpoint_dir (auto_resume)" : "resume_from";
  const char *root = from == CKPT_FROM_UNDER_OWN ? c->checkpoint_dir : c->resume_from;
  char dir[CONFIG_PATH_MAX + 32];
  if (from == CKPT_FROM_GIVEN) snprintf(dir, sizeof dir, "%s", c->resume_from);
  else ckpt_step_dir(dir, sizeof dir, root, step);
  ckpt_manifest_t m;
  rc = ckpt_manifest_read_max(dir, max, &m);
  if (rc == FSDP_ELIMIT) {
    job_manifest_over(c, key);
    return err_wrap(FSDP_EINVAL, "%s", key);
  }
  if (rc == FSDP_EFORMAT || rc == FSDP_ENOENT) {
    /* damaged: the ranks go back to the committed checkpoint before it, and
     * check that one (whatever it is, it is theirs to say); with none
     * before it, or named itself, they fail */
    char why[600], older[CONFIG_PATH_MAX + 32];
    snprintf(why, sizeof why, "%s", err_msg()); /* err_set writes where err_msg() points */
    if (from != CKPT_FROM_GIVEN && !ckpt_latest_below(root, step, older, sizeof older))
      return FSDP_OK;
    return err_set(FSDP_EINVAL, "%s: %s is damaged (%s)%s; name another checkpoint", key, dir,
                   why, from != CKPT_FROM_GIVEN ? ", and no committed checkpoint is before it" : "");
  }
  if (rc) return FSDP_OK;
  const ckpt_want_t want = {c->gpt, c->seed, c->steps, from == CKPT_FROM_UNDER_OWN};
  rc = ckpt_resume_check(&m, dir, &want);
  ckpt_manifest_free(&m);
  return rc ? err_wrap(rc, "%s", key) : FSDP_OK;
}

int job_init_from_check(const config_t *c) {
  if (!c->init_from[0]) return FSDP_OK;
  /* one descriptor for the look at the length and the read: the file
   * swapped for another in between would be parsed unbounded */
  int fd = open(c->init_from, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return FSDP_OK; /* job_paths_check says why */
  uint8_t first[9], *buf = NULL;
  struct stat st;
  const ssize_t got = pread(fd, first, sizeof first, 0);
  int rc = FSDP_OK;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || got <= 0 ||
      !safetensors_sniff(first, (size_t)got))
    goto out; /* not safetensors: the ranks check a weights file's header */
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--) len = len << 8 | first[i];
  const uint64_t max = job_header_max(&c->gpt);
  if (len > max) {
    rc = err_set(FSDP_EINVAL, "init_from: %s has a safetensors header of %" PRIu64 " bytes, over "
                 "the limit of %" PRIu64 " bytes, the most a GPT-2 of %d layers could need; name "
                 "a weights file of this model (fsdpctl export writes one)", c->init_from, len,
                 max, c->gpt.layers);
    goto out;
  }
  safetensors_t sf;
  if (len > (uint64_t)st.st_size - 8) { /* safetensors_parse names the fault */
    rc = safetensors_parse(first, 8, (uint64_t)st.st_size, c->init_from, &c->gpt, &sf);
  } else if (!(buf = malloc(8 + len))) {
    rc = err_set(FSDP_ENOMEM, "init_from: out of memory for a %" PRIu64 "-byte header", len);
  } else if (!(rc = shard_file_io(fd, buf, 8 + len, 0, 0, 0, c->init_from))) {
    rc = safetensors_parse(buf, 8 + len, (uint64_t)st.st_size, c->init_from, &c->gpt, &sf);
    if (!rc) safetensors_free(&sf);
  }
  if (rc) rc = err_wrap(rc, "init_from");
out:
  free(buf);
  close(fd);
  return rc;
}

/* spec: a job's options from a job file and flags (see spec.h). */
#include "client/spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/common/err.h"
#include "daemon/common/ini_line.h"

static int spec_append(spec_t *s, const char *section, const char *key, const char *value) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 16;
    spec_opt_t *o = realloc(s->opts, cap * sizeof *o);
    if (!o) return err_set(FSDP_ENOMEM, "job options: out of memory");
    s->opts = o;
    s->cap = cap;
  }
  spec_opt_t *o = &s->opts[s->n];
  o->section = strdup(section);
  o->key = strdup(key);
  o->value = strdup(value);
  if (!o->section || !o->key || !o->value) {
    free(o->section), free(o->key), free(o->value);
    return err_set(FSDP_ENOMEM, "job options: out of memory");
  }
  s->n++;
  return 0;
}

typedef struct spec_ini {
  spec_t *s;
  int rc;
} spec_ini_t;

static int spec_ini_cb(void *user, const char *section, const char *key, const char *value) {
  spec_ini_t *x = user;
  if (x->rc) return 0;
  /* inih trims the spaces around a value; a quoted one keeps them, and the
   * quotes are not part of it (daemon/job/config.c reads files so too) */
  char unq[1024]; /* a line holds less (ini_line_max) */
  const char *v = ini_line_unquote(value, unq, sizeof unq);
  x->rc = spec_append(x->s, section, key, v ? v : value);
  return !x->rc;
}

int spec_load_file(spec_t *s, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return err_set_errno(err_from_errno(errno), errno, "job file %s", path);
  struct stat st;
  if (!fstat(fileno(f), &st) && S_ISDIR(st.st_mode)) { /* fopen takes one; it reads as empty */
    fclose(f);
    return err_set(FSDP_EINVAL, "job file %s: is a directory; give the job's INI file", path);
  }
  spec_ini_t x = {s, 0};
  int too_long;
  int line = ini_line_parse(f, NULL, spec_ini_cb, &x, &too_long);
  fclose(f);
  if (x.rc) return err_wrap(x.rc, "job file %s", path);
  if (too_long)
    return err_set(FSDP_EINVAL, "job file %s:%d: longer than %d characters, the most a job file "
                   "line may hold (Debian's libinih): shorten the value", path, line, ini_line_max());
  if (line > 0)
    return err_set(FSDP_EINVAL, "job file %s:%d: not a `key = value` line or a [section] header",
                   path, line);
  if (line < 0) return err_set(FSDP_EIO, "job file %s: could not be read", path);
  return 0;
}

int spec_set(spec_t *s, const char *section, const char *key, const char *value) {
  if (!*key) return err_set(FSDP_EINVAL, "an option needs a key (--KEY VALUE)");
  size_t k = 0;
  for (size_t i = 0; i < s->n; i++) {
    spec_opt_t *o = &s->opts[i];
    if (!strcmp(o->key, key)) {
      free(o->section), free(o->key), free(o->value);
      continue;
    }
    s->opts[k++] = *o;
  }
  s->n = k;
  return spec_append(s, section, key, value);
}

int spec_set_arg(spec_t *s, const char *arg) {
  const char *eq = strchr(arg, '=');
  if (!eq)
    return err_set(FSDP_EINVAL, "--set %s: write it as section.key=value (or key=value)", arg);
  const char *dot = memchr(arg, '.', (size_t)(eq - arg));
  char section[64] = "", key[128];
  if (dot) {
    if ((size_t)(dot - arg) >= sizeof section)
      return err_set(FSDP_EINVAL, "--set %s: the section name is too long", arg);
    memcpy(section, arg, (size_t)(dot - arg));
    section[dot - arg] = 0;
  }
  const char *k0 = dot ? dot + 1 : arg;
  if ((size_t)(eq - k0) >= sizeof key)
    return err_set(FSDP_EINVAL, "--set %s: the key is too long", arg);
  memcpy(key, k0, (size_t)(eq - k0));
  key[eq - k0] = 0;
  if (!*key || (dot && !*section))
    return err_set(FSDP_EINVAL, "--set %s: write it as section.key=value (or key=value)", arg);
  return spec_set(s, section, key, eq + 1);
}

int spec_world_from_mesh(const spec_t *s, uint32_t *world) {
  *world = 0;
  const char *mesh = NULL;
  for (size_t i = 0; i < s->n; i++)
    if (!strcmp(s->opts[i].key, "mesh")) mesh = s->opts[i].value;
  if (!mesh || !*mesh) return 0;
  char *end;
  errno = 0;
  unsigned long a = strtoul(mesh, &end, 10), b = 1;
  if (end != mesh && (*end == 'x' || *end == 'X')) {
    const char *p = end + 1;
    b = strtoul(p, &end, 10);
    if (end == p) b = 0;
  }
  if (errno || *end || !a || !b || a > 1u << 20 || b > 1u << 20 || a * b > UINT32_MAX)
    return err_set(FSDP_EINVAL, "mesh \"%s\" is not R x S (e.g. 2x2) nor a number of ranks; "
                   "fix it or give --ranks N", mesh);
  *world = (uint32_t)(a * b);
  return 0;
}

void spec_free(spec_t *s) {
  for (size_t i = 0; i < s->n; i++) free(s->opts[i].section), free(s->opts[i].key), free(s->opts[i].value);
  free(s->opts);
  memset(s, 0, sizeof *s);
}

/* workdir: fsdpd's paths (see workdir.h). */
#include "daemon/node/workdir.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/common/err.h"

int workdir_id_check(const char *what, const char *s) {
  size_t n = strlen(s);
  int ok = n >= 1 && n <= WORKDIR_ID_MAX;
  for (size_t i = 0; ok && i < n; i++)
    ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
         (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-';
  if (ok) return FSDP_OK;
  return err_set(FSDP_EINVAL, "%s \"%.*s%s\" is not an id (1 to %d of A-Z a-z 0-9 _ -); refused "
                 "before it could name a file", what, 64, s, n > 64 ? "..." : "", WORKDIR_ID_MAX);
}

int workdir_attempt_dir(const char *root, const char *job, uint32_t attempt, char *out, size_t n) {
  int w = snprintf(out, n, "%s/jobs/%s/%" PRIu32, root, job, attempt);
  if (w < 0 || (size_t)w >= n)
    return err_set(FSDP_ELIMIT, "work dir %s: the path of job %s is too long", root, job);
  return FSDP_OK;
}

int workdir_mkdirs(const char *dir, unsigned mode) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
    return err_set(FSDP_ELIMIT, "%s: path too long", dir);
  for (char *s = p + 1;; s++) {
    int end = *s == 0;
    if (*s == '/' || end) {
      *s = 0;
      if (mkdir(p, mode) && errno != EEXIST)
        return err_set_errno(err_from_errno(errno), errno, "cannot create %s; check the work "
                             "directory's owner and mode", p);
      if (end) break;
      *s = '/';
    }
  }
  return FSDP_OK;
}

int workdir_make_attempt(const char *root, const char *job, uint32_t attempt, int as_user,
                         unsigned uid, unsigned gid, char *out, size_t n) {
  char jobdir[PATH_MAX];
  int rc;
  if (snprintf(jobdir, sizeof jobdir, "%s/jobs/%s", root, job) >= (int)sizeof jobdir)
    return err_set(FSDP_ELIMIT, "work dir %s: the path of job %s is too long", root, job);
  if ((rc = workdir_mkdirs(jobdir, 0755)) || (rc = workdir_attempt_dir(root, job, attempt, out, n)))
    return rc;
  if (mkdir(out, 0700) && errno != EEXIST)
    return err_set_errno(err_from_errno(errno), errno, "cannot create %s", out);
  struct stat sb;
  /* lstat: a link planted there would hand the rank someone else's directory */
  if (lstat(out, &sb) || !S_ISDIR(sb.st_mode))
    return err_set(FSDP_EEXIST, "%s exists and is not a directory; remove it", out);
  if (as_user && chown(out, uid, gid))
    return err_set_errno(err_from_errno(errno), errno, "cannot give %s to uid %u", out, uid);
  return FSDP_OK;
}

int workdir_latest_attempt(const char *root, const char *job, uint32_t *attempt) {
  char jobdir[PATH_MAX];
  if (snprintf(jobdir, sizeof jobdir, "%s/jobs/%s", root, job) >= (int)sizeof jobdir)
    return err_set(FSDP_ELIMIT, "work dir %s: the path of job %s is too long", root, job);
  DIR *d = opendir(jobdir);
  if (!d) return err_set(FSDP_ENOTFOUND, "job %s has no files on this node", job);
  uint32_t best = 0;
  for (struct dirent *e; (e = readdir(d));) {
    char *end;
    unsigned long a = strtoul(e->d_name, &end, 10);
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && !*end && a <= UINT32_MAX && a > best)
      best = (uint32_t)a;
  }
  closedir(d);
  if (!best) return err_set(FSDP_ENOTFOUND, "job %s has no attempt on this node", job);
  *attempt = best;
  return FSDP_OK;
}

int workdir_lock(const char *root, int *fd) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s/fsdpd.lock", root) >= (int)sizeof path)
    return err_set(FSDP_EINVAL, "--work-dir: %s is too long", root);
  const int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (f < 0)
    return err_set_errno(err_from_errno(errno), errno, "--work-dir: cannot open %s", path);
  if (flock(f, LOCK_EX | LOCK_NB)) {
    const int e = errno;
    char pid[32] = "";
    const ssize_t n = pread(f, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = 0;
    pid[strcspn(pid, "\n")] = 0;
    close(f);
    if (e == EWOULDBLOCK)
      return err_set(FSDP_EEXIST, "--work-dir: %s is another fsdpd's (pid %s), which runs: give "
                     "each fsdpd a work directory of its own", root, pid[0] ? pid : "unknown");
    return err_set_errno(err_from_errno(e), e, "--work-dir: cannot lock %s", path);
  }
  char pid[32];
  const int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
  /* the pid is only said to the next one; the lock is what counts */
  const int said = !ftruncate(f, 0) && pwrite(f, pid, (size_t)n, 0) == n;
  (void)said;
  *fd = f;
  return FSDP_OK;
}

/* workdir: fsdpd's files under its work directory, and the only place that
 * turns a request's strings into paths. Layout:
 *
 *   <work-dir>/jobs/<job_id>/<attempt>/rank-R.conf  each rank's job file
 *   <work-dir>/jobs/<job_id>/<attempt>/rank-<r>.log its stdout and stderr
 *
 * A job id reaches a path only after workdir_id_check ([A-Za-z0-9_-], 1 to
 * WORKDIR_ID_MAX characters: no '/', no "..", nothing a shell or a path
 * would read twice); attempts and ranks are numbers. The attempt directory
 * belongs to the user the ranks run as (mode 0700) and is their working
 * directory, entered before the rank drops privileges: a rank reads its
 * job file and writes relative outputs there, whatever the modes of the
 * directories above it. */
#ifndef FSDP_WORKDIR_H
#define FSDP_WORKDIR_H

#include <stddef.h>
#include <stdint.h>

#define WORKDIR_ID_MAX 128

/* FSDP_EINVAL, naming `what` ("job_id") and the value, unless s is an id. */
int workdir_id_check(const char *what, const char *s);
/* "<root>/jobs/<job>/<attempt>" into out (n bytes); job must be checked. */
int workdir_attempt_dir(const char *root, const char *job, uint32_t attempt, char *out, size_t n);
/* Creates root/jobs/<job>/<attempt> (parents 0755, owned by us; the attempt
 * 0700, chowned to uid/gid when as_user) and writes its path into out. An
 * existing attempt directory is reused (a rank of the same attempt). */
int workdir_make_attempt(const char *root, const char *job, uint32_t attempt, int as_user,
                         unsigned uid, unsigned gid, char *out, size_t n);
/* The highest attempt of job that has a directory; FSDP_ENOTFOUND if none. */
int workdir_latest_attempt(const char *root, const char *job, uint32_t *attempt);
/* mkdir -p of dir with mode for what it creates. */
int workdir_mkdirs(const char *dir, unsigned mode);
/* Takes the work directory for this process: an exclusive lock on
 * <root>/fsdpd.lock (flock, held while *fd stays open, so until the
 * process ends; the file holds its pid). Another fsdpd holding it is
 * FSDP_EEXIST naming its pid: two daemons in one work directory would run
 * ranks into each other's attempt directories and serve each other's logs. */
int workdir_lock(const char *root, int *fd);

#endif

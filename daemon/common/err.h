/* err: the project's one error table, and the message that travels with an error.
 *
 * Every failing function returns a negative FSDP_E* code. The code says what kind
 * of failure it was (callers branch on it); the message says what failed, where,
 * and what to do (the user reads it). err_set() records the message for the
 * calling thread and returns the code, so a failure site is one line:
 *
 *     return err_set(FSDP_EINVAL, "model.heads: %d does not divide channels %d; ...", ...);
 *
 * Codes from errno, SQLite, gRPC, NCCL and CUDA are mapped into this table at the
 * boundary where they are met, never passed on raw (gRPC statuses: rpc.h). New
 * codes go at the end: the values of the others stay put. */
#ifndef FSDP_ERR_H
#define FSDP_ERR_H

#include <stddef.h>

/* XX(name, description) */
#define FSDP_ERR_MAP(XX)                                                     \
  XX(EINVAL, "invalid argument")                                             \
  XX(ENOMEM, "out of memory")                                                \
  XX(EIO, "input/output error")                                              \
  XX(ENOENT, "no such file")                                                 \
  XX(EFORMAT, "malformed file")                                              \
  XX(ERANGE, "value out of range")                                           \
  XX(ENOSPC, "no space left on device")                                      \
  XX(EUNSUPPORTED, "operation not supported by this backend")                \
  XX(ETIMEDOUT, "timed out")                                                 \
  XX(EPEER, "peer failed")                                                   \
  XX(ECANCELED, "canceled")                                                  \
  XX(EINTERNAL, "internal error")                                            \
  XX(EAUTH, "not authenticated")                                             \
  XX(EPERM, "permission denied")                                             \
  XX(ENOTFOUND, "not found")                                                 \
  XX(EEXIST, "already exists")                                               \
  XX(EUNAVAILABLE, "service unavailable")                                    \
  XX(ESTATE, "not allowed in the current state")                             \
  XX(ELIMIT, "over a size or rate limit")                                    \
  XX(ESTALE, "from an older epoch")                                         \
  XX(EPREEMPTED, "stopped by a signal at a step boundary")

typedef enum {
  FSDP_OK = 0,
#define XX(name, _) FSDP_##name,
  FSDP__ERR_FIRST = -1000,
  FSDP_ERR_MAP(XX)
#undef XX
  FSDP__ERR_LAST
} fsdp_err_t;

/* Short name ("EINVAL") and description of a code; "unknown error" for others. */
const char *err_name(int code);
const char *err_str(int code);

/* Records a message for this thread and returns code (printf-style). */
int err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like err_set, with ": <strerror(errnum)>" appended: for failures of the C library. */
int err_set_errno(int code, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefixes the current message with more context ("loading weights: ...").
 * Returns code unchanged so that `return err_wrap(rc, "...")` reads naturally. */
int err_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last message recorded on this thread ("" when none). */
const char *err_msg(void);
/* Maps an errno value to the table (ENOSPC stays ENOSPC, ENOENT stays ENOENT, ...). */
int err_from_errno(int errnum);

#endif

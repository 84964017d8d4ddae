/* rpc: what the server and the client share (see rpc.h): the status
 * mapping between gRPC and err.h, and reading token and PEM files. */
#include "rpc_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"

/* err.h -> gRPC. Several codes share a status; the reverse map below picks
 * one code per status. ERANGE is a bad value in a request (INVALID_ARGUMENT),
 * not OUT_OF_RANGE, which gRPC keeps for reading past an end. */
grpc_status_code rpc_status_from_err(int rc) {
  switch (rc) {
  case FSDP_OK: return GRPC_STATUS_OK;
  case FSDP_EINVAL: case FSDP_EFORMAT: case FSDP_ERANGE: return GRPC_STATUS_INVALID_ARGUMENT;
  case FSDP_ENOMEM: case FSDP_ENOSPC: case FSDP_ELIMIT: return GRPC_STATUS_RESOURCE_EXHAUSTED;
  case FSDP_ENOENT: case FSDP_ENOTFOUND: return GRPC_STATUS_NOT_FOUND;
  case FSDP_EUNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
  case FSDP_ETIMEDOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
  case FSDP_EPEER: case FSDP_EUNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
  case FSDP_ECANCELED: return GRPC_STATUS_CANCELLED;
  case FSDP_EAUTH: return GRPC_STATUS_UNAUTHENTICATED;
  case FSDP_EPERM: return GRPC_STATUS_PERMISSION_DENIED;
  case FSDP_EEXIST: return GRPC_STATUS_ALREADY_EXISTS;
  case FSDP_ESTATE: return GRPC_STATUS_FAILED_PRECONDITION;
  case FSDP_ESTALE: return GRPC_STATUS_ABORTED; /* an older attempt's epoch: give up */
  default: return GRPC_STATUS_INTERNAL; /* EIO, EINTERNAL, anything unknown */
  }
}

int rpc_err_from_status(grpc_status_code st) {
  switch (st) {
  case GRPC_STATUS_OK: return FSDP_OK;
  case GRPC_STATUS_CANCELLED: return FSDP_ECANCELED;
  case GRPC_STATUS_INVALID_ARGUMENT: return FSDP_EINVAL;
  case GRPC_STATUS_DEADLINE_EXCEEDED: return FSDP_ETIMEDOUT;
  case GRPC_STATUS_NOT_FOUND: return FSDP_ENOTFOUND;
  case GRPC_STATUS_ALREADY_EXISTS: return FSDP_EEXIST;
  case GRPC_STATUS_PERMISSION_DENIED: return FSDP_EPERM;
  case GRPC_STATUS_RESOURCE_EXHAUSTED: return FSDP_ELIMIT;
  case GRPC_STATUS_FAILED_PRECONDITION: return FSDP_ESTATE;
  case GRPC_STATUS_ABORTED: return FSDP_ESTALE;
  case GRPC_STATUS_OUT_OF_RANGE: return FSDP_ERANGE;
  case GRPC_STATUS_UNIMPLEMENTED: return FSDP_EUNSUPPORTED;
  case GRPC_STATUS_UNAVAILABLE: return FSDP_EUNAVAILABLE;
  case GRPC_STATUS_DATA_LOSS: return FSDP_EIO;
  case GRPC_STATUS_UNAUTHENTICATED: return FSDP_EAUTH;
  default: return FSDP_EINTERNAL; /* UNKNOWN, INTERNAL */
  }
}

const char *rpc_status_name(grpc_status_code st) {
  static const char *const names[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  if ((unsigned)st < sizeof names / sizeof names[0]) return names[st];
  return "UNKNOWN_STATUS";
}

/* A secret (a token, a TLS key) any user of the host may read or write:
 * said once a file (its device and inode), with the fix. */
static void rpc_secret_mode_check(FILE *f, const char *path, const char *what) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static struct { dev_t dev; ino_t ino; } said[32];
  static int n_said;
  struct stat st;
  if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode) || !(st.st_mode & 0007)) return;
  pthread_mutex_lock(&mu);
  int seen = 0;
  for (int i = 0; i < n_said && !seen; i++) seen = said[i].dev == st.st_dev && said[i].ino == st.st_ino;
  if (!seen && n_said < 32) said[n_said].dev = st.st_dev, said[n_said++].ino = st.st_ino;
  pthread_mutex_unlock(&mu);
  if (!seen)
    LOG_WARN("rpc", "%s %s: every user of this host may %s it (mode %04o); chmod o-rwx %s (a "
             "token or key belongs to its owner alone: 0600, or 0640 for a group)", what, path,
             st.st_mode & 0002 ? "write" : "read", (unsigned)(st.st_mode & 07777), path);
}

int rpc__read_file(const char *path, const char *what, size_t max, char **out, size_t *len) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return err_set_errno(err_from_errno(errno), errno, "%s %s: cannot open", what, path);
  /* a directory opens, then fails at the first read (EISDIR): said for
   * what it is, as a usage error, like a file that is missing. A pipe or a
   * terminal is read (--token-file <(pass show fsdp)); a socket never opens */
  struct stat st;
  if (!fstat(fileno(f), &st) && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) &&
      !S_ISCHR(st.st_mode)) {
    fclose(f);
    return err_set(FSDP_EINVAL, "%s %s: %s, not a file; give the path of the file itself", what,
                   path, S_ISDIR(st.st_mode) ? "a directory" : "a block device or another special file");
  }
  if (strstr(what, "token") || strstr(what, "key")) rpc_secret_mode_check(f, path, what);
  char *buf = malloc(max + 1);
  if (!buf) {
    fclose(f);
    return err_set(FSDP_ENOMEM, "%s %s: out of memory", what, path);
  }
  errno = 0;
  size_t n = fread(buf, 1, max + 1, f);
  const int bad = ferror(f), e = errno ? errno : EIO;
  fclose(f);
  if (bad) {
    free(buf);
    return err_set_errno(err_from_errno(e), e, "%s %s: cannot read it", what, path);
  }
  if (n > max) {
    free(buf);
    return err_set(FSDP_ELIMIT, "%s %s: longer than %zu bytes; is it the right file?", what,
                   path, max);
  }
  buf[n] = 0;
  *out = buf;
  if (len) *len = n;
  return 0;
}

const char *rpc__token_flaw(const char *t, size_t n) {
  if (!n) return "is empty";
  for (size_t i = 0; i < n; i++) /* it travels in an HTTP/2 header value */
    if (t[i] < 0x21 || t[i] > 0x7e) return "holds a space or a byte that is not printable ASCII";
  return NULL;
}

int rpc__read_token(const char *path, char **token) {
  size_t n;
  int rc = rpc__read_file(path, "token file", RPC_TOKEN_MAX, token, &n);
  if (rc) return rc;
  char *t = *token;
  while (n && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t'))
    t[--n] = 0;
  const char *why = rpc__token_flaw(t, n);
  const int digest = !why && n >= 7 && !strncmp(t, "sha256:", 7);
  if (why || digest) {
    free(t);
    *token = NULL;
    if (digest)
      return err_set(FSDP_EINVAL, "token file %s holds a token's digest (sha256:...), which only a "
                     "server takes: a client sends the token itself, so put the token the "
                     "digest was made of in it",
                     path);
    return err_set(FSDP_EINVAL, "token file %s %s: put one token (printable ASCII, no spaces) in it",
                   path, why);
  }
  return 0;
}

void rpc__free_secret(char *p) {
  if (!p) return;
  /* volatile: the stores must happen though the buffer dies right after */
  for (volatile char *v = p; *v; v++) *v = 0;
  free(p);
}

grpc_byte_buffer *rpc__pack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

grpc_slice rpc__flatten(grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return grpc_empty_slice();
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  return s;
}

gpr_timespec rpc__deadline(double timeout_s) {
  if (timeout_s < 0) timeout_s = 0;
  if (timeout_s > 1e9) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_micros((int64_t)(timeout_s * 1e6), GPR_TIMESPAN));
}

/* gRPC's own log lines join ours, under the subsystem "grpc". Its errors
 * are mostly a peer's failure (a handshake, a reset connection) that the
 * call concerned also reports as its status: a warning here, not an error. */
static void rpc_gpr_log(gpr_log_func_args *a) {
  int level = a->severity == GPR_LOG_SEVERITY_ERROR ? LOG_LEVEL_WARN : LOG_LEVEL_DEBUG;
  if (log_enabled(level)) log_write(level, "grpc", a->file, a->line, "%s", a->message);
}

static void rpc_init_once(void) { gpr_set_log_function(rpc_gpr_log); }

void rpc__init(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, rpc_init_once);
  grpc_init();
}

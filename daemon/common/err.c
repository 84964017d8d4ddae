/* err: the error table's names and the per-thread message (see err.h). */
#include "err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ERR_MSG_MAX 1024
static _Thread_local char err_buf[ERR_MSG_MAX];

const char *err_name(int code) {
  switch (code) {
  case FSDP_OK: return "OK";
#define XX(name, _) case FSDP_##name: return #name;
  FSDP_ERR_MAP(XX)
#undef XX
  default: return "EUNKNOWN";
  }
}

const char *err_str(int code) {
  switch (code) {
  case FSDP_OK: return "success";
#define XX(name, desc) case FSDP_##name: return desc;
  FSDP_ERR_MAP(XX)
#undef XX
  default: return "unknown error";
  }
}

int err_set(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_buf, sizeof err_buf, fmt, ap);
  va_end(ap);
  return code;
}

int err_set_errno(int code, int errnum, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err_buf, sizeof err_buf, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof err_buf)
    snprintf(err_buf + n, sizeof err_buf - (size_t)n, ": %s", strerror(errnum));
  return code;
}

int err_wrap(int code, const char *fmt, ...) {
  char old[ERR_MSG_MAX];
  memcpy(old, err_buf, sizeof old);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err_buf, sizeof err_buf, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof err_buf) {
    const char *rest = old[0] ? old : err_str(code);
    size_t room = sizeof err_buf - (size_t)n;
    /* truncation is fine: the start of a message says the most */
    if (room > 2) {
      err_buf[n] = ':';
      err_buf[n + 1] = ' ';
      size_t len = strlen(rest);
      if (len > room - 3) len = room - 3;
      memcpy(err_buf + n + 2, rest, len);
      err_buf[(size_t)n + 2 + len] = 0;
    }
  }
  return code;
}

const char *err_msg(void) { return err_buf; }

int err_from_errno(int errnum) {
  switch (errnum) {
  case ENOENT: return FSDP_ENOENT;
  case ENOMEM: return FSDP_ENOMEM;
  case ENOSPC: case EDQUOT: case EFBIG: return FSDP_ENOSPC;
  case EINVAL: return FSDP_EINVAL;
  case ERANGE: return FSDP_ERANGE;
  case ETIMEDOUT: return FSDP_ETIMEDOUT;
  case ECANCELED: return FSDP_ECANCELED;
  default: return FSDP_EIO;
  }
}

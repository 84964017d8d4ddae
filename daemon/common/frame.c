/* frame: length-prefixed messages (see frame.h). */
#include "daemon/common/frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/common/err.h"

static uint32_t frame_len(const uint8_t *h) {
  return (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
}

/* send with MSG_NOSIGNAL on a socket (a closed reader is EPIPE, not a
 * signal that would kill the rank); write on anything else, whose EPIPE
 * needs SIGPIPE ignored by the caller. */
static ssize_t frame_out(int fd, const void *p, size_t n, int *sock) {
  if (*sock) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w >= 0 || errno != ENOTSOCK) return w;
    *sock = 0;
  }
  return write(fd, p, n);
}

void frame_header(uint8_t h[FRAME_HEADER], size_t n) {
  for (int i = 0; i < FRAME_HEADER; i++) h[i] = (uint8_t)(n >> (8 * i));
}

int frame_write(int fd, const void *data, size_t n) {
  if (n > UINT32_MAX) return err_set(FSDP_ELIMIT, "frame: %zu bytes do not fit a frame", n);
  uint8_t h[FRAME_HEADER];
  frame_header(h, n);
  int sock = 1;
  const uint8_t *parts[2] = {h, data};
  size_t lens[2] = {FRAME_HEADER, n};
  for (int i = 0; i < 2; i++)
    for (size_t off = 0; off < lens[i];) {
      ssize_t w = frame_out(fd, parts[i] + off, lens[i] - off, &sock);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
        return err_set(FSDP_EPEER, "frame: the reader of fd %d has gone", fd);
      if (w <= 0) return err_set_errno(FSDP_EIO, errno, "frame: writing to fd %d", fd);
      off += (size_t)w;
    }
  return FSDP_OK;
}

void frame_reader_init(frame_reader_t *r, size_t max) { *r = (frame_reader_t){.max = max}; }

void frame_reader_free(frame_reader_t *r) {
  free(r->buf);
  *r = (frame_reader_t){.max = r->max};
}

/* Appends n bytes to the partial frame. */
static int frame_keep(frame_reader_t *r, const uint8_t *p, size_t n) {
  if (r->len + n > r->cap) {
    size_t cap = r->cap ? r->cap : 256;
    while (cap < r->len + n) cap *= 2;
    uint8_t *b = realloc(r->buf, cap);
    if (!b) return err_set(FSDP_ENOMEM, "frame: out of memory for a %zu-byte frame", r->len + n);
    r->buf = b, r->cap = cap;
  }
  memcpy(r->buf + r->len, p, n);
  r->len += n;
  return FSDP_OK;
}

static int frame_too_long(const frame_reader_t *r, uint32_t len) {
  return err_set(FSDP_ELIMIT, "frame: a frame of %u bytes, over the %zu accepted", len, r->max);
}

int frame_reader_feed(frame_reader_t *r, const void *data, size_t n, frame_cb cb, void *arg) {
  const uint8_t *p = data;
  while (n) {
    /* the header first, then exactly the frame's bytes: never more than one frame kept */
    size_t want = FRAME_HEADER + (r->len >= FRAME_HEADER ? frame_len(r->buf) : 0);
    size_t take = want - r->len < n ? want - r->len : n;
    int rc = frame_keep(r, p, take);
    if (rc) return rc;
    p += take, n -= take;
    if (r->len < FRAME_HEADER) continue;
    uint32_t len = frame_len(r->buf);
    if (len > r->max) return frame_too_long(r, len); /* before any of its bytes are kept */
    if (r->len == FRAME_HEADER + (size_t)len) {
      r->len = 0; /* the bytes stay in buf for the callback */
      if ((rc = cb(arg, r->buf + FRAME_HEADER, len))) return rc;
    }
  }
  return FSDP_OK;
}

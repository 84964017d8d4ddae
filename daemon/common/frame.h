/* frame: length-prefixed messages on a byte stream, the one framing of a
 * rank's report channel (fsdp-train writes, fsdpd reads): each frame is a
 * 4-byte little-endian length, then that many bytes. Both sides use this
 * file, so the format lives in one place.
 *
 * Writing blocks until the frame is out (the writer is a rank between two
 * steps, and its reader drains at once); a reader that went away is
 * FSDP_EPEER, never a SIGPIPE. Reading is incremental: bytes are fed as they
 * arrive in any slicing, and each complete frame is handed to a callback; a
 * length over the reader's bound is refused (FSDP_ELIMIT) before any of its
 * bytes are kept. */
#ifndef FSDP_FRAME_H
#define FSDP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_HEADER 4

/* The header of a frame of n bytes (n <= UINT32_MAX), for a writer that
 * sends the frame itself (fsdpd's loop, which never blocks). */
void frame_header(uint8_t h[FRAME_HEADER], size_t n);

/* Writes one frame of n bytes to fd (a socket, pipe or file). FSDP_EPEER
 * when the other end is closed, FSDP_EIO for other failures; a partial
 * frame may then have been written. */
int frame_write(int fd, const void *data, size_t n);

/* One complete frame (valid during the call). A non-zero return stops
 * frame_reader_feed, which returns it. */
typedef int (*frame_cb)(void *arg, const uint8_t *data, size_t n);

typedef struct frame_reader {
  size_t max;      /* largest frame accepted */
  uint8_t *buf;    /* a partial frame (header included) */
  size_t len, cap;
} frame_reader_t;

void frame_reader_init(frame_reader_t *r, size_t max);
void frame_reader_free(frame_reader_t *r);
/* Feeds n bytes; calls cb for each frame they complete. FSDP_ELIMIT (with a
 * message naming both sizes) for a frame over max, FSDP_ENOMEM, or cb's code.
 * After an error the reader is unusable (the stream's framing is lost). */
int frame_reader_feed(frame_reader_t *r, const void *data, size_t n, frame_cb cb, void *arg);

#endif

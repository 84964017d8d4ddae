/* Tests of frame.c, the report channel's framing: frames split at every
 * byte boundary arrive whole, an empty frame is a frame, a length over the
 * bound is refused from its header alone, and a writer whose reader has
 * gone gets FSDP_EPEER instead of a SIGPIPE. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/frame.h"

typedef struct got {
  int n;
  size_t len[8];
  uint8_t data[8][64];
} got_t;

static int keep(void *arg, const uint8_t *d, size_t n) {
  got_t *g = arg;
  cr_assert_lt(g->n, 8);
  g->len[g->n] = n;
  memcpy(g->data[g->n++], d, n);
  return 0;
}

/* Three frames ("hello", "", "world!") as written by frame_write, read back. */
Test(frame, frames_split_anywhere_arrive_whole) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  cr_assert_eq(frame_write(sv[0], "hello", 5), 0);
  cr_assert_eq(frame_write(sv[0], "", 0), 0);
  cr_assert_eq(frame_write(sv[0], "world!", 6), 0);
  uint8_t buf[64];
  ssize_t n = read(sv[1], buf, sizeof buf);
  cr_assert_eq(n, 3 * FRAME_HEADER + 11);
  for (size_t cut = 0; cut <= (size_t)n; cut++) { /* two feeds, split at every byte */
    frame_reader_t r;
    got_t g = {0};
    frame_reader_init(&r, 64);
    cr_assert_eq(frame_reader_feed(&r, buf, cut, keep, &g), 0);
    cr_assert_eq(frame_reader_feed(&r, buf + cut, (size_t)n - cut, keep, &g), 0);
    cr_assert_eq(g.n, 3, "cut at %zu", cut);
    cr_assert(g.len[0] == 5 && !memcmp(g.data[0], "hello", 5));
    cr_assert_eq(g.len[1], 0);
    cr_assert(g.len[2] == 6 && !memcmp(g.data[2], "world!", 6));
    frame_reader_free(&r);
  }
  close(sv[0]);
  close(sv[1]);
}

Test(frame, an_oversized_frame_is_refused_from_its_header) {
  frame_reader_t r;
  got_t g = {0};
  frame_reader_init(&r, 1024);
  const uint8_t h[4] = {0x01, 0x04, 0, 0}; /* 1025 bytes, and none of them sent */
  cr_assert_eq(frame_reader_feed(&r, h, 4, keep, &g), FSDP_ELIMIT);
  cr_assert(strstr(err_msg(), "1025") && strstr(err_msg(), "1024"), "%s", err_msg());
  cr_assert_eq(g.n, 0);
  frame_reader_free(&r);
}

Test(frame, a_gone_reader_is_an_error_not_a_signal) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  close(sv[1]);
  cr_assert_eq(frame_write(sv[0], "x", 1), FSDP_EPEER, "%s", err_msg());
  close(sv[0]);
}

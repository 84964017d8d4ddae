/* ring_split: sub-group rings from a world ring, the way ncclCommSplit makes
 * sub-communicators. Every rank opens a listening socket on its own host (the
 * host of its world address), the world all-gathers (color, key, address), and
 * the ranks of one color form a ring ordered by key. So a job needs one
 * address per rank (the launcher's or the control plane's) for every group
 * the mesh makes: shard groups and replica groups. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/comm/ring.h"
#include "daemon/common/err.h"

#define RING_SPLIT_ADDR 128 /* "host:port": as long as a world ring's (RING_ADDR) */

/* What each rank tells the world: 136 bytes, moved as 34 opaque fp32 words
 * (all_gather copies bytes; no arithmetic touches them). */
typedef struct ring_split_rec {
  int32_t color, key;
  char addr[RING_SPLIT_ADDR];
} ring_split_rec_t;
_Static_assert(sizeof(ring_split_rec_t) % sizeof(float) == 0, "moved as whole fp32 words");

/* Binds a listening socket on host (any port); writes "host:port" to addr. */
static int ring_split_listen(const char *host, char *addr, size_t n) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE}, *ai;
  int g = getaddrinfo(host, "0", &hints, &ai);
  if (g) return err_set(FSDP_EINVAL, "split: host \"%s\": %s", host, gai_strerror(g));
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char port[16];
  if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 64) ||
      getsockname(fd, (struct sockaddr *)&ss, &sl) ||
      getnameinfo((struct sockaddr *)&ss, sl, NULL, 0, port, sizeof port, NI_NUMERICSERV)) {
    int rc = err_set_errno(FSDP_EIO, errno, "split: cannot listen on %s", host);
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return rc;
  }
  int v6 = ai->ai_family == AF_INET6;
  freeaddrinfo(ai);
  if ((size_t)snprintf(addr, n, v6 ? "[%s]:%s" : "%s:%s", host, port) >= n) {
    close(fd);
    return err_set(FSDP_EINVAL, "split: the address \"%s:%s\" is longer than %zu bytes; give "
                   "the rank a shorter host (a numeric address)", host, port, n - 1);
  }
  return fd;
}

int comm_ring_split(comm_t *world, int color, int key, const char *name, int64_t timeout_ms,
                    comm_t **out) {
  *out = NULL;
  const char *self_addr = comm_ring_self_addr(world);
  char host[RING_SPLIT_ADDR];
  const char *colon = strrchr(self_addr, ':');
  size_t hl = colon ? (size_t)(colon - self_addr) : 0;
  if (!colon || hl == 0 || hl >= sizeof host)
    return err_set(FSDP_EINVAL, "split: own address \"%s\" is not host:port", self_addr);
  memcpy(host, self_addr, hl);
  host[hl] = 0;
  if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = 0;
  }
  ring_split_rec_t me = {color, key, ""};
  int lfd = -1;
  if (color >= 0 && (lfd = ring_split_listen(host, me.addr, sizeof me.addr)) < 0) return lfd;
  const int W = world->size;
  ring_split_rec_t *all = malloc((size_t)W * sizeof *all);
  if (!all) {
    if (lfd >= 0) close(lfd);
    return err_set(FSDP_ENOMEM, "split: out of memory");
  }
  int rc = comm_all_gather(world, &me, all, sizeof me / sizeof(float), COMM_F32);
  if (rc) {
    rc = err_wrap(rc, "split of %s into %s", world->name, name);
    goto out;
  }
  if (color < 0) goto out;
  /* members of my color, by (key, world rank) */
  int n = 0, mine = -1;
  const char **addrs = malloc((size_t)W * sizeof *addrs);
  int *order = malloc((size_t)W * sizeof *order);
  if (!addrs || !order) {
    free(addrs);
    free(order);
    rc = err_set(FSDP_ENOMEM, "split: out of memory");
    goto out;
  }
  for (int w = 0; w < W; w++)
    if (all[w].color == color) {
      int i = n++;
      while (i > 0 && all[order[i - 1]].key > all[w].key) order[i] = order[i - 1], i--;
      order[i] = w;
    }
  for (int i = 0; i < n; i++) {
    all[order[i]].addr[sizeof all->addr - 1] = 0;
    addrs[i] = all[order[i]].addr;
    if (order[i] == world->rank) mine = i;
  }
  comm_ring_opts_t o = {.rank = mine, .size = n, .addrs = addrs, .name = name,
                        .listen_fd = lfd, .timeout_ms = timeout_ms};
  comm_ring_run(world, &o); /* the world's run, proved and checked by each hello */
  lfd = -1; /* the ring owns it now, whatever happens */
  rc = comm_ring_create(&o, out);
  free(addrs);
  free(order);
out:
  if (lfd >= 0) close(lfd);
  free(all);
  return rc;
}

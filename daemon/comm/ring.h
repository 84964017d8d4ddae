/* ring: the collectives of CPU devices behind comm_backend_t: a ring over TCP
 * between hosts, over shared memory between the ranks of one host (the
 * algorithms NCCL and Gloo use). docs/RING.md describes the wire protocol,
 * the transports and the failure model; comm.h states the contract every
 * backend keeps.
 *
 * A world ring is made from every member's listening address (boot.c reads
 * them from the launcher); groups are split from it with comm_split, which
 * listens on the host of the rank's world address. */
#ifndef FSDP_COMM_RING_H
#define FSDP_COMM_RING_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/comm/comm.h"
#include "daemon/common/ring_secret.h"

#define COMM_RING_JOB_MAX 128 /* bytes of a job id in the hello (fsdpd's ids fit) */
#define COMM_RING_SECRET_BYTES RING_SECRET_BYTES /* the run's secret (ring_secret.h) */

/* Rank r listens at addrs[r], connects to rank r+1 and accepts rank r-1; a
 * handshake checks whose ring each side is of (job id and attempt, group
 * name and size) and both ranks, so mis-wired address lists are an error
 * naming both sides and what differs, on both sides at once (docs/RING.md,
 * "Bootstrap"). */
typedef struct {
  int rank, size;
  const char *const *addrs; /* size entries, "host:port" ("[v6]:port" too) */
  const char *name;         /* group name, up to 63 bytes; both sides must agree */
  /* The run this rank is of: the job's id (up to COMM_RING_JOB_MAX bytes;
   * NULL or "": none) and attempt; both sides must agree. A connection from
   * a rank of an earlier attempt of the same job is turned away, never
   * fatal: a stale rank, not a mis-wired one. */
  const char *job;
  uint32_t attempt;
  /* The secret every rank of the run was given (COMM_RING_SECRET_BYTES), or
   * NULL: none. Each side proves it holds it, bound to the other's fresh
   * nonce (docs/RING.md, "Authentication"): a connection that cannot, or a
   * replayed hello, is turned away whatever it claims to be. Without one the
   * ring is open to whoever reaches its ports, as before. */
  const uint8_t *secret;
  int listen_fd;            /* -1: bind addrs[rank]; else a bound socket, owned from now on */
  int64_t timeout_ms;       /* bootstrap deadline and default op timeout; 0: FSDP_COMM_TIMEOUT_MS */
  size_t chunk_bytes;       /* 0: FSDP_COMM_CHUNK_BYTES */
  size_t staging_bytes;     /* 0: FSDP_COMM_STAGING_BYTES */
} comm_ring_opts_t;

extern const comm_backend_t comm_ring_backend;

/* Connects the ring (blocking, bounded by timeout_ms); 0 and *out, or a code. */
int comm_ring_create(const comm_ring_opts_t *o, comm_t **out);

/* For tests: how many of a ring communicator's links (out, in) carry records
 * for every op (CMA); how many map the other end's registered segments; how
 * many ops this rank sent as records. */
int comm_ring_cma_links(const comm_t *c);
int comm_ring_reg_links(const comm_t *c);
uint64_t comm_ring_record_ops(const comm_t *c);
/* For tests: every turn of an op's wait loop first sleeps this long (0: no
 * sleep), standing in for a descheduled communication thread, so tests can
 * make the races of a loaded machine happen on purpose. */
extern int64_t comm_ring_test_stall_ns;

/* Internal to the ring's files (ring_split.c): this rank's listening address
 * in c (its host is where a split group listens), and the comm_split of the
 * table. */
const char *comm_ring_self_addr(const comm_t *c);
/* The run c is of (o's job, never NULL, attempt and secret, pointing into
 * c), which its split groups share. */
void comm_ring_run(const comm_t *c, comm_ring_opts_t *o);
int comm_ring_split(comm_t *c, int color, int key, const char *name, int64_t timeout_ms,
                    comm_t **out);

#endif

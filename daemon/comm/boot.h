/* boot: how a rank finds its peers and connects the groups of its mesh; the
 * one place a rank's communicators are made.
 *
 * What a rank is told (comm_boot_t) depends on who started it and on the
 * backend: today an address list and a bound listening socket for the ring
 * (fsdp-launch sets FSDP_RANK, FSDP_WORLD_SIZE, FSDP_ADDRS and FSDP_LISTEN_FD;
 * the node daemon sets the same; FSDP_JOB_ID and FSDP_ATTEMPT, optional, name
 * the run, which the ring's hello carries so that ranks of two runs never
 * take each other for peers, and FSDP_RING_SECRET, the secret both launchers
 * draw for each attempt, which every rank proves to its neighbours); for NCCL, a unique id rank 0 draws, which
 * the ring's bootstrap carries to the others (comm_boot_ids_t). comm_boot_connect turns it into the world
 * communicator and splits the mesh's shard and replica groups from it. */
#ifndef FSDP_COMM_BOOT_H
#define FSDP_COMM_BOOT_H

#include "daemon/comm/comm.h"
#include "daemon/comm/ring.h"

/* Collectives whose world is made from an id drawn by rank 0 (NCCL's unique
 * id) instead of from addresses. The ring's bootstrap carries the id: the
 * ranks connect a ring world from the same addresses and sockets, rank 0
 * broadcasts the id (or that it could not draw one) over it, the ring
 * closes, and every rank makes the world with create. */
#define COMM_BOOT_ID_MAX 256
typedef struct comm_boot_ids {
  size_t id_bytes;                /* at most COMM_BOOT_ID_MAX */
  int (*make_id)(uint8_t *id);    /* rank 0: a fresh id; 0 or a negative code */
  /* joins the world the ranks with this id make; 0 and *out, or a negative code */
  int (*create)(void *arg, int rank, int world, const uint8_t *id, const char *name,
                comm_t **out);
  void *arg;
} comm_boot_ids_t;

typedef struct comm_boot {
  int rank, world; /* this rank and the job's size; world 1: a one-rank job, no peers */
  /* the ring: every rank's listening address ("host:port"), and this rank's
   * socket, already bound to addrs[rank] (-1: none; comm_boot_connect binds) */
  char **addrs; /* world entries, or NULL for one rank */
  int listen_fd;
  /* whose run: the job's id ("": none given) and attempt (0: none given) */
  char job[COMM_RING_JOB_MAX + 1];
  uint32_t attempt;
  /* the run's secret, which every rank proves to its neighbours
   * (FSDP_RING_SECRET, 64 hex digits; has_secret 0: none given) */
  int has_secret;
  uint8_t secret[COMM_RING_SECRET_BYTES];
  /* NULL: the ring is the world's backend. Else the world is made by ids
   * (above); the caller sets it before comm_boot_connect. */
  const comm_boot_ids_t *ids;
} comm_boot_t;

/* The communicators of one rank in a mesh of replicas x shards ranks, rank =
 * replica * shards + shard: world (NULL for one rank), its shard group (NULL
 * when shards == 1; the world itself when replicas == 1) and its replica
 * group (NULL when replicas == 1; the world itself when shards == 1). Only
 * a mesh of both (HYBRID) splits the world. */
typedef struct comm_groups {
  comm_t *world, *shard, *replica;
} comm_groups_t;

/* This process's place in its job, from the environment its launcher set
 * (FSDP_WORLD_SIZE unset: a one-rank job; FSDP_JOB_ID, FSDP_ATTEMPT and
 * FSDP_RING_SECRET are optional). A value that is missing or out of range is an error naming the
 * variable. Free with comm_boot_free. */
int comm_boot_from_env(comm_boot_t *b);
/* A boot for tests and tools: world addresses given, no bound socket. */
int comm_boot_from_addrs(comm_boot_t *b, int rank, int world, const char *const *addrs);
/* Sets b's secret from 64 hex digits (what names the value: "FSDP_RING_SECRET"). */
int comm_boot_set_secret(comm_boot_t *b, const char *hex, const char *what);
void comm_boot_free(comm_boot_t *b);

/* Connects the world (every rank of the job calls it) and splits the mesh's
 * groups; replicas * shards must equal world. On failure nothing is left
 * open. The bound socket is the world's from now on. */
int comm_boot_connect(comm_boot_t *b, int replicas, int shards, comm_groups_t *g);
/* Destroys the groups (shard and replica first, then the world); NULLs ok. */
void comm_groups_destroy(comm_groups_t *g);

#endif

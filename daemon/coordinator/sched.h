/* sched: where a job's ranks go. Gang placement: all of a job's ranks at once
 * or none, and each shard group (the S consecutive ranks that all-gather and
 * reduce-scatter every unit, the heavy traffic) inside one node whenever the
 * free devices allow; replica groups (one reduction per step) may span nodes.
 *
 * A pure function of the cluster's picture the coordinator passes in: no
 * SQLite, no RPC, no clock. The coordinator holds the picture (store.c), calls
 * sched_place for each PENDING job in submission order, and records what it
 * returns (the slots, or the reason to show while the job waits). */
#ifndef FSDP_SCHED_H
#define FSDP_SCHED_H

#include <stddef.h>
#include <stdint.h>

typedef struct sched_node {
  int64_t id;
  const char *name; /* for the reasons and notes */
  int alive;        /* a dead node's devices are never used */
  int drained;      /* nor a drained one's (an operator's word; fsdpctl drain) */
  int stopped;      /* not alive because its fsdpd is stopping or stopped (and said so), for
                       the reasons: not a death */
} sched_node_t;

typedef struct sched_device {
  int64_t id;
  int node;           /* index into the nodes array */
  int index;          /* the device's index on its node */
  const char *kind;   /* "cpu", "cuda" */
  uint64_t memory;    /* bytes */
  int held;           /* 1: a job holds it */
} sched_device_t;

typedef struct sched_job {
  int replicas, shards; /* the mesh R x S: world = R * S, rank = group * S + shard */
  const char *kind;     /* the device kind every rank needs */
  uint64_t need;        /* bytes per rank (the memory plan's total) */
  /* per node index, nonzero: a node where its last attempts failed, used only
   * where no other node will do (the same whole groups fit either way), the
   * lowest (the oldest failure) first; NULL: none */
  const char *avoid;
} sched_job_t;

typedef struct sched_slot {
  int device;           /* index into the devices array */
} sched_slot_t;

enum { SCHED_PLACED = 0, SCHED_WAIT = 1 };

/* Places the job: SCHED_PLACED with slot[r] for every rank r (R * S slots),
 * and in note a sentence when a shard group had to span nodes ("" when none
 * did); or SCHED_WAIT with the reason in note (how many devices it needs, of
 * what kind and memory, how many are free where). Negative (err.h) for a job
 * that makes no sense (R or S below 1). note holds len bytes. */
int sched_place(const sched_node_t *nodes, int num_nodes, const sched_device_t *devices,
                int num_devices, const sched_job_t *job, sched_slot_t *slot, char *note,
                size_t len);

#endif

/* shard: the geometry of fully sharded training, before any byte moves: the
 * strategy and the mesh R x S (R replicas of S-way shard groups), which ranks
 * form each communicator group, and how each unit's flat buffer is padded and
 * split into S equal shards.
 *
 * The layout depends only on the model, the wrap policy and S (never on R or
 * the rank), so a checkpoint written under one S can be re-sharded to another.
 * Rank r of a shard group owns shard r of every unit.
 *
 * Pure geometry (daemon/job), and moving a shard's bytes to and from a file
 * (shard_file_io): what a rank does with its shards' bytes
 * (initial values, weights files, AdamW segments) is daemon/train/shard_rank.h. */
#ifndef FSDP_SHARD_H
#define FSDP_SHARD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/job/gpt_config.h"

/* XX(enum suffix, name, shards params, keeps params gathered after forward, hybrid) */
#define SHARD_STRATEGY_LIST(XX)                               \
  XX(FULL_SHARD, "FULL_SHARD", 1, 0, 0)                       \
  XX(SHARD_GRAD_OP, "SHARD_GRAD_OP", 1, 1, 0)                 \
  XX(NO_SHARD, "NO_SHARD", 0, 1, 0)                           \
  XX(HYBRID_SHARD, "HYBRID_SHARD", 1, 0, 1)                   \
  XX(HYBRID_SHARD_ZERO2, "HYBRID_SHARD_ZERO2", 1, 1, 1)

typedef enum {
#define XX(e, name, sh, keep, hy) SHARD_##e,
  SHARD_STRATEGY_LIST(XX)
#undef XX
  SHARD__COUNT
} shard_strategy_t;

const char *shard_strategy_name(shard_strategy_t s);
/* Case-insensitive name; error lists the names. */
int shard_strategy_parse(const char *s, shard_strategy_t *out);
/* 1 when forward leaves units gathered for backward (SHARD_GRAD_OP, ZERO2, NO_SHARD). */
int shard_strategy_keeps_params(shard_strategy_t s);

typedef struct shard_mesh {
  int replicas; /* R: copies of the sharded model */
  int shards;   /* S: ranks that split each unit */
  shard_strategy_t strategy;
} shard_mesh_t;

/* "RxS" (e.g. "2x4") or "N" for 1xN (NO_SHARD: Nx1). */
int shard_mesh_parse(const char *text, shard_strategy_t strategy, shard_mesh_t *out);
/* Checks the mesh against the world size and the strategy, and writes a
 * sentence naming the groups that result into desc ("4 ranks: 2 shard groups
 * of 2 ({0,1} {2,3}), replicated across {0,2} {1,3}"). The error says which
 * mesh would fit. */
int shard_mesh_validate(const shard_mesh_t *m, int world, char *desc, size_t len);

/* The mesh of a job from its strategy and mesh options on world ranks (mesh
 * "" : 1xWORLD, or WORLDx1 under NO_SHARD): parsed and validated, with the
 * groups' sentence in desc (shard_mesh_validate). */
int shard_mesh_resolve(const char *strategy, const char *mesh, int world, shard_mesh_t *out,
                       char *desc, size_t len);

/* Where a world rank sits: its shard group (S ranks) and replica group (R ranks). */
typedef struct shard_place {
  int shard_rank;   /* index in its shard group: the shard it owns */
  int replica;      /* index of its shard group: its position in the replica group */
  int first_of_group; /* world rank of shard rank 0 of its group */
} shard_place_t;
shard_place_t shard_place(const shard_mesh_t *m, int world_rank);
/* World ranks of the shard group (S entries) and replica group (R entries) of world_rank. */
void shard_group_ranks(const shard_mesh_t *m, int world_rank, int *shard_group, int *replica_group);

/* One FSDP unit: a run of consecutive model units gathered and freed as one. */
typedef struct shard_unit {
  int first, last;    /* model units first..last (inclusive) */
  size_t offset;      /* in the model's flat buffer */
  size_t numel;       /* real elements */
  size_t shard_numel; /* elements per shard: padded numel / S */
} shard_unit_t;

typedef struct shard_layout {
  int S;
  int num_units;
  shard_unit_t *units;
  int *unit_of;       /* model unit -> FSDP unit */
  size_t shard_total; /* sum of shard_numel: what one rank holds of the model */
} shard_layout_t;

/* Elements every shard is a multiple of (64-byte aligned fp32 shards). */
#define SHARD_ALIGN 16

/* Default wrap policy (min_params 0): one FSDP unit per model unit (embeddings
 * and final norm; each block). min_params > 0 merges neighbours until each unit
 * holds at least that many parameters (the last may hold fewer). */
int shard_layout_create(shard_layout_t **out, const gpt_config_t *cfg, int S, size_t min_params);
void shard_layout_destroy(shard_layout_t *l);
/* Rank r's shard of unit k: how many of its shard_numel elements are real
 * (the rest is padding), and in *begin the global index (in the model's flat
 * order) of its first element. */
size_t shard_unit_real(const shard_layout_t *l, int r, int k, size_t *begin);

/* Moves len bytes between buf and fd at offset at, whole (pread when writing
 * is 0, pwrite otherwise; short transfers are continued); the error names
 * rank r's shard and path. */
int shard_file_io(int fd, void *buf, size_t len, off_t at, int writing, int r, const char *path);
#endif

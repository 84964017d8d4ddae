/* boot: a rank's peers and its communicators (see boot.h). */
#include "daemon/comm/boot.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/comm/ring.h"
#include "daemon/common/err.h"

static int comm_boot_env_int(const char *name, int lo, int hi, int *out) {
  const char *v = getenv(name);
  char *end;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || !*v || *end || x < lo || x > hi)
    return err_set(FSDP_EINVAL, "%s: \"%s\" is not a number from %d to %d; it is set by "
                   "fsdp-launch (or the node daemon) for each rank of a sharded job", name,
                   v ? v : "(unset)", lo, hi);
  *out = (int)x;
  return FSDP_OK;
}

/* Copies n comma-separated addresses of list into b->addrs (one block). */
static int comm_boot_split_list(comm_boot_t *b, const char *list, const char *what) {
  size_t len = strlen(list);
  char **a = calloc((size_t)b->world, sizeof *a);
  char *copy = malloc(len + 1);
  if (!a || !copy) {
    free(a);
    free(copy);
    return err_set(FSDP_ENOMEM, "%s: out of memory", what);
  }
  memcpy(copy, list, len + 1);
  int n = 0;
  /* every field counts, an empty one too (strtok would skip it and take
   * "a,,b" for two addresses) */
  for (char *t = copy, *next; t; t = next, n++) {
    next = strchr(t, ',');
    if (next) *next++ = 0;
    if (!*t) {
      free(a);
      free(copy);
      return err_set(FSDP_EINVAL, "%s: address %d is empty (\"%.200s\"); give one host:port "
                     "per rank, separated by single commas", what, n, list);
    }
    if (n < b->world) a[n] = t;
  }
  if (n != b->world) {
    free(a);
    free(copy);
    return err_set(FSDP_EINVAL, "%s: %d addresses for a world of %d ranks", what, n, b->world);
  }
  b->addrs = a; /* a[0] is the start of copy: comm_boot_free frees both */
  return FSDP_OK;
}

/* FSDP_JOB_ID (optional): printable, no spaces or commas, up to
 * COMM_RING_JOB_MAX bytes (an fsdpd job id always is). */
static int comm_boot_env_job(comm_boot_t *b) {
  const char *v = getenv("FSDP_JOB_ID");
  if (!v) return FSDP_OK;
  size_t n = strlen(v);
  int ok = n > 0 && n <= COMM_RING_JOB_MAX;
  for (size_t i = 0; ok && i < n; i++) ok = v[i] > ' ' && v[i] < 127 && v[i] != ',';
  if (!ok)
    return err_set(FSDP_EINVAL, "FSDP_JOB_ID: \"%.64s%s\" is not a job id (1 to %d printable "
                   "characters, no spaces or commas); it is set by the node daemon for each rank",
                   v, n > 64 ? "..." : "", COMM_RING_JOB_MAX);
  memcpy(b->job, v, n + 1);
  return FSDP_OK;
}

int comm_boot_set_secret(comm_boot_t *b, const char *hex, const char *what) {
  size_t n = strlen(hex);
  int ok = n == 2 * COMM_RING_SECRET_BYTES;
  for (size_t i = 0; ok && i < COMM_RING_SECRET_BYTES; i++) {
    unsigned v = 0;
    ok = isxdigit((unsigned char)hex[2 * i]) && isxdigit((unsigned char)hex[2 * i + 1]) &&
         sscanf(hex + 2 * i, "%2x", &v) == 1;
    b->secret[i] = (uint8_t)v;
  }
  if (!ok) {
    explicit_bzero(b->secret, sizeof b->secret);
    return err_set(FSDP_EINVAL, "%s: not %d hex digits (%zu characters); it is the run's ring "
                   "secret, which fsdp-launch and fsdpd draw for each attempt and give every rank",
                   what, 2 * COMM_RING_SECRET_BYTES, n);
  }
  b->has_secret = 1;
  return FSDP_OK;
}

int comm_boot_from_env(comm_boot_t *b) {
  memset(b, 0, sizeof *b);
  b->world = 1;
  b->listen_fd = -1;
  if (!getenv("FSDP_WORLD_SIZE")) return FSDP_OK;
  int rc, fd = -1;
  if ((rc = comm_boot_env_int("FSDP_WORLD_SIZE", 1, 4096, &b->world)) ||
      (rc = comm_boot_env_int("FSDP_RANK", 0, b->world - 1, &b->rank)))
    return rc;
  if (b->world == 1) return FSDP_OK;
  int attempt = 0;
  if ((rc = comm_boot_env_job(b)) ||
      (getenv("FSDP_ATTEMPT") &&
       (rc = comm_boot_env_int("FSDP_ATTEMPT", 0, INT32_MAX, &attempt))))
    return rc;
  b->attempt = (uint32_t)attempt;
  const char *sec = getenv(RING_SECRET_VAR);
  if (sec && (rc = comm_boot_set_secret(b, sec, RING_SECRET_VAR))) return rc;
  if (sec) unsetenv(RING_SECRET_VAR); /* held here now: nothing this rank starts inherits it */
  const char *env = getenv("FSDP_ADDRS");
  if (!env) return err_set(FSDP_EINVAL, "FSDP_ADDRS: unset; it is set by fsdp-launch");
  if ((rc = comm_boot_env_int("FSDP_LISTEN_FD", 0, 1 << 20, &fd))) return rc;
  if ((rc = comm_boot_split_list(b, env, "FSDP_ADDRS"))) return rc;
  b->listen_fd = fd;
  return FSDP_OK;
}

int comm_boot_from_addrs(comm_boot_t *b, int rank, int world, const char *const *addrs) {
  memset(b, 0, sizeof *b);
  b->listen_fd = -1;
  if (world < 1 || rank < 0 || rank >= world)
    return err_set(FSDP_EINVAL, "boot: rank %d of a world of %d", rank, world);
  b->rank = rank;
  b->world = world;
  if (world == 1) return FSDP_OK;
  size_t len = 0;
  for (int r = 0; r < world; r++) len += strlen(addrs[r]) + 1;
  char *list = malloc(len);
  if (!list) return err_set(FSDP_ENOMEM, "boot: out of memory");
  list[0] = 0;
  for (int r = 0; r < world; r++) strcat(strcat(list, r ? "," : ""), addrs[r]);
  int rc = comm_boot_split_list(b, list, "boot");
  free(list);
  return rc;
}

void comm_boot_free(comm_boot_t *b) {
  if (b->addrs) free(b->addrs[0]);
  free(b->addrs);
  b->addrs = NULL;
  if (b->listen_fd >= 0) close(b->listen_fd);
  b->listen_fd = -1;
  explicit_bzero(b->secret, sizeof b->secret);
  b->has_secret = 0;
}

/* Replaces the ring world *world by the world b->ids makes, from the id rank
 * 0 draws and broadcasts over the ring (a status word first: the others
 * learn that rank 0 failed instead of waiting for a world it never joins). */
static int comm_boot_world_by_id(comm_boot_t *b, comm_t **world) {
  const comm_boot_ids_t *x = b->ids;
  if (x->id_bytes > COMM_BOOT_ID_MAX)
    return err_set(FSDP_EINVAL, "boot: an id of %zu bytes (at most %d)", x->id_bytes,
                   COMM_BOOT_ID_MAX);
  /* float storage: a broadcast moves the bytes, it never computes on them */
  float msg[1 + COMM_BOOT_ID_MAX / sizeof(float)];
  memset(msg, 0, sizeof msg);
  int32_t status = 0;
  int rc = FSDP_OK;
  if (b->rank == 0 && (rc = x->make_id((uint8_t *)(msg + 1)))) status = rc;
  memcpy(msg, &status, sizeof status);
  const size_t count = 1 + (x->id_bytes + sizeof(float) - 1) / sizeof(float);
  int brc = comm_broadcast(*world, msg, count, COMM_F32, 0);
  comm_destroy(*world); /* the ring has carried the id: its work is done */
  *world = NULL;
  if (rc) return rc; /* rank 0's own error, as make_id set it */
  if (brc) return brc;
  memcpy(&status, msg, sizeof status);
  if (status)
    return err_set(status, "boot: rank 0 could not make the world's id (%s); see rank 0's log",
                   err_name(status));
  return x->create(x->arg, b->rank, b->world, (const uint8_t *)(msg + 1), "world", world);
}

int comm_boot_connect(comm_boot_t *b, int replicas, int shards, comm_groups_t *g) {
  memset(g, 0, sizeof *g);
  if (replicas < 1 || shards < 1 || replicas * shards != b->world)
    return err_set(FSDP_EINVAL, "mesh: %d x %d is not a mesh of the job's %d ranks", replicas,
                   shards, b->world);
  if (b->world == 1) return FSDP_OK;
  comm_ring_opts_t o = {.rank = b->rank, .size = b->world,
                        .addrs = (const char *const *)b->addrs, .name = "world",
                        .listen_fd = b->listen_fd, .job = b->job, .attempt = b->attempt,
                        .secret = b->has_secret ? b->secret : NULL};
  b->listen_fd = -1; /* the ring owns it, whatever happens */
  int rc = comm_ring_create(&o, &g->world);
  if (!rc && b->ids) rc = comm_boot_world_by_id(b, &g->world);
  /* A group of every rank is the world itself (FULL_SHARD's shard group,
   * NO_SHARD's replica group): one communicator less, and with it NCCL's
   * buffers (comm_nccl_size_bytes) or a ring's sockets, thread and staging.
   * Sharing is safe: one thread issues every op, in the same order on
   * every rank, and a communicator runs its ops in issue order. */
  const int shard = b->rank % shards, replica = b->rank / shards;
  if (!rc && shards > 1)
    rc = replicas == 1 ? (g->shard = g->world, 0)
                       : comm_split(g->world, replica, shard, "shard", 0, &g->shard);
  if (!rc && replicas > 1)
    rc = shards == 1 ? (g->replica = g->world, 0)
                     : comm_split(g->world, shard, replica, "replica", 0, &g->replica);
  if (rc) comm_groups_destroy(g);
  return rc;
}

void comm_groups_destroy(comm_groups_t *g) {
  if (g->shard != g->world) comm_destroy(g->shard);
  if (g->replica != g->world) comm_destroy(g->replica);
  comm_destroy(g->world);
  memset(g, 0, sizeof *g);
}

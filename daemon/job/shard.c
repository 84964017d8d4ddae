/* shard: strategies, meshes, groups and the padded shard layout (see shard.h). */
#include "daemon/job/shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "daemon/common/err.h"

static const struct {
  const char *name;
  int keeps;
} shard_strategies[] = {
#define XX(e, name, sh, keep, hy) {name, keep},
    SHARD_STRATEGY_LIST(XX)
#undef XX
};

const char *shard_strategy_name(shard_strategy_t s) {
  return (unsigned)s < SHARD__COUNT ? shard_strategies[s].name : "?";
}

int shard_strategy_keeps_params(shard_strategy_t s) { return shard_strategies[s].keeps; }

int shard_strategy_parse(const char *s, shard_strategy_t *out) {
  for (int i = 0; i < SHARD__COUNT; i++)
    if (!strcasecmp(s, shard_strategies[i].name)) {
      *out = (shard_strategy_t)i;
      return FSDP_OK;
    }
  return err_set(FSDP_EINVAL, "strategy: unknown \"%s\"; choose FULL_SHARD, SHARD_GRAD_OP, "
                 "NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2", s);
}

static int shard_is_hybrid(shard_strategy_t s) {
  return s == SHARD_HYBRID_SHARD || s == SHARD_HYBRID_SHARD_ZERO2;
}

int shard_mesh_parse(const char *text, shard_strategy_t strategy, shard_mesh_t *out) {
  char *end;
  long a = strtol(text, &end, 10), b = 0;
  if (end == text || a <= 0 || a > 1 << 20) goto bad;
  if (*end == 'x' || *end == 'X') {
    const char *p = end + 1;
    b = strtol(p, &end, 10);
    if (end == p || b <= 0 || b > 1 << 20 || *end) goto bad;
  } else if (*end) {
    goto bad;
  }
  out->strategy = strategy;
  if (b) {
    out->replicas = (int)a;
    out->shards = (int)b;
  } else if (strategy == SHARD_NO_SHARD) {
    out->replicas = (int)a; /* N ranks, each with the whole model */
    out->shards = 1;
  } else {
    out->replicas = 1;
    out->shards = (int)a;
  }
  return FSDP_OK;
bad:
  return err_set(FSDP_EINVAL, "mesh: \"%s\" is not R x S; write it as replicas x shards, e.g. "
                 "\"1x4\" (one 4-way shard group) or \"2x2\" (HYBRID_SHARD: 2 replicas of 2-way "
                 "shard groups), or a single number of ranks", text);
}

int shard_mesh_resolve(const char *strategy, const char *mesh, int world, shard_mesh_t *out,
                       char *desc, size_t len) {
  shard_strategy_t st = SHARD_FULL_SHARD;
  char text[32];
  int rc = shard_strategy_parse(strategy, &st);
  if (rc) return rc;
  if (mesh && mesh[0]) snprintf(text, sizeof text, "%s", mesh);
  else snprintf(text, sizeof text, "%d", world);
  if ((rc = shard_mesh_parse(text, st, out))) return rc;
  return shard_mesh_validate(out, world, desc, len);
}

/* Appends "{a,b,c}" for the ranks first, first+stride, ... (n of them). */
static size_t shard_fmt_group(char *buf, size_t len, int first, int stride, int n) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, k < len ? len - k : 0, " {");
  for (int i = 0; i < n && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%d", i ? "," : "", first + i * stride);
  if (k < len) k += (size_t)snprintf(buf + k, len - k, "}");
  return k;
}

int shard_mesh_validate(const shard_mesh_t *m, int world, char *desc, size_t len) {
  const int R = m->replicas, S = m->shards;
  const char *name = shard_strategy_name(m->strategy);
  if ((long)R * S != world)
    return err_set(FSDP_EINVAL, "mesh: %dx%d is %ld ranks but the job has %d; the product of "
                   "replicas and shards must equal the world size (for %d ranks: 1x%d, or "
                   "R x S with R*S = %d under HYBRID_SHARD)", R, S, (long)R * S, world, world,
                   world, world);
  if (m->strategy == SHARD_NO_SHARD && S != 1)
    return err_set(FSDP_EINVAL, "mesh: NO_SHARD keeps the whole model on every rank, so the mesh "
                   "must be %dx1, not %dx%d", world, R, S);
  if ((m->strategy == SHARD_FULL_SHARD || m->strategy == SHARD_SHARD_GRAD_OP) && R != 1)
    return err_set(FSDP_EINVAL, "mesh: %s shards across all ranks, so the mesh must be 1x%d, "
                   "not %dx%d; for %d replicas of %d-way shard groups use HYBRID_SHARD", name,
                   world, R, S, R, S);
  if (desc && len) {
    size_t k = (size_t)snprintf(desc, len, "%s on %d rank%s: ", name, world, world == 1 ? "" : "s");
    if (k < len && S > 1) {
      k += (size_t)snprintf(desc + k, len - k, "%d shard group%s of %d:", R, R == 1 ? "" : "s", S);
      for (int i = 0; i < R && k < len; i++) k += shard_fmt_group(desc + k, len - k, i * S, 1, S);
    } else if (k < len) {
      k += (size_t)snprintf(desc + k, len - k, "no sharding, every rank holds the whole model");
    }
    if (k < len && R > 1) {
      k += (size_t)snprintf(desc + k, len - k, "; gradients all-reduced across replica group%s",
                            S == 1 ? "" : "s");
      for (int j = 0; j < S && k < len; j++) k += shard_fmt_group(desc + k, len - k, j, S, R);
    }
    if (k < len && shard_is_hybrid(m->strategy) && R == 1)
      snprintf(desc + k, len - k, " (one replica: the same as %s)",
               m->strategy == SHARD_HYBRID_SHARD ? "FULL_SHARD" : "SHARD_GRAD_OP");
  }
  return FSDP_OK;
}

shard_place_t shard_place(const shard_mesh_t *m, int w) {
  shard_place_t p = {w % m->shards, w / m->shards, (w / m->shards) * m->shards};
  return p;
}

void shard_group_ranks(const shard_mesh_t *m, int w, int *shard_group, int *replica_group) {
  shard_place_t p = shard_place(m, w);
  for (int j = 0; j < m->shards; j++) shard_group[j] = p.first_of_group + j;
  for (int i = 0; i < m->replicas; i++) replica_group[i] = i * m->shards + p.shard_rank;
}

int shard_layout_create(shard_layout_t **out, const gpt_config_t *cfg, int S, size_t min_params) {
  *out = NULL;
  if (S <= 0) return err_set(FSDP_EINVAL, "mesh: shards must be at least 1, not %d", S);
  int rc = gpt_config_validate(cfg);
  if (rc) return rc;
  const int nu = cfg->layers + 1;
  shard_layout_t *l = calloc(1, sizeof *l);
  if (!l) return err_set(FSDP_ENOMEM, "shard layout: out of memory");
  l->S = S;
  l->units = calloc((size_t)nu, sizeof *l->units);
  l->unit_of = calloc((size_t)nu, sizeof *l->unit_of);
  if (!l->units || !l->unit_of) {
    rc = err_set(FSDP_ENOMEM, "shard layout: out of memory");
    goto out;
  }
  for (int u = 0; u < nu; u++) {
    gpt_unit_t mu = gpt_config_unit(cfg, u);
    shard_unit_t *cur = l->num_units ? &l->units[l->num_units - 1] : NULL;
    if (cur && min_params && cur->numel < min_params) {
      cur->last = u; /* merge into the previous unit: it is still too small */
      cur->numel += mu.numel;
    } else {
      l->units[l->num_units++] = (shard_unit_t){u, u, mu.offset, mu.numel, 0};
    }
    l->unit_of[u] = l->num_units - 1;
  }
  const size_t quantum = (size_t)S * SHARD_ALIGN;
  for (int k = 0; k < l->num_units; k++) {
    shard_unit_t *x = &l->units[k];
    size_t padded = (x->numel + quantum - 1) / quantum * quantum;
    x->shard_numel = padded / (size_t)S;
    l->shard_total += x->shard_numel;
  }
  *out = l;
  l = NULL;
out:
  shard_layout_destroy(l);
  return rc;
}

void shard_layout_destroy(shard_layout_t *l) {
  if (!l) return;
  free(l->units);
  free(l->unit_of);
  free(l);
}

size_t shard_unit_real(const shard_layout_t *l, int r, int k, size_t *begin) {
  const shard_unit_t *x = &l->units[k];
  const size_t lo = (size_t)r * x->shard_numel; /* unit-local */
  *begin = x->offset + lo;
  size_t real = lo < x->numel ? x->numel - lo : 0;
  return real < x->shard_numel ? real : x->shard_numel;
}

int shard_file_io(int fd, void *buf, size_t len, off_t at, int writing, int r, const char *path) {
  char *p = buf;
  for (size_t done = 0; done < len;) {
    ssize_t n = writing ? pwrite(fd, p + done, len - done, at + (off_t)done)
                        : pread(fd, p + done, len - done, at + (off_t)done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : (writing ? ENOSPC : EIO);
      return err_set_errno(err_from_errno(e), e, "%s shard %d of %s", writing ? "writing" :
                           "reading", r, path);
    }
    done += (size_t)n;
  }
  return FSDP_OK;
}

/* ckpt: the checkpoint format (see ckpt.h and docs/FORMATS.md). */
#include "daemon/job/ckpt.h"

#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/log.h"
#include "daemon/job/precision.h"
#include "kernels/kern_math.h"

#define CKPT_FIXED 192u    /* bytes of the header before its unit table */
#define CKPT_FIXED_V3 168u /* the same in version 3 (no token file) */
#define CKPT_FIXED_V2 144u /* in version 2 (no schedule) */
#define CKPT_FIXED_V1 136u /* and in version 1 (no run) */
#define CKPT_UNIT_BYTES 32u
#define CKPT_SEC_BYTES 24u
#define CKPT_UNITS_MAX (1u << 20)
#define CKPT_TOTAL_MAX (UINT64_C(1) << 40) /* elements per shard: far above any model */

size_t ckpt_dtype_bytes(uint32_t dtype) {
  return dtype == CKPT_DTYPE_F32 ? 4 : dtype == CKPT_DTYPE_BF16 ? 2 : 0;
}

const char *ckpt_section_name(uint32_t kind) {
  switch (kind) {
  case CKPT_SEC_PARAMS: return "params";
  case CKPT_SEC_ADAM_M: return "adam_m";
  case CKPT_SEC_ADAM_V: return "adam_v";
  default: return "unknown";
  }
}

uint64_t ckpt_blocks(uint64_t bytes) { return (bytes + CKPT_BLOCK - 1) / CKPT_BLOCK; }

static uint64_t ckpt_align(uint64_t x) { return (x + CKPT_ALIGN - 1) / CKPT_ALIGN * CKPT_ALIGN; }

/* Bytes of a header of that version before its unit table. */
static uint64_t ckpt_fixed(uint32_t version) {
  return version == 1   ? CKPT_FIXED_V1
         : version == 2 ? CKPT_FIXED_V2
         : version == 3 ? CKPT_FIXED_V3
                        : CKPT_FIXED;
}

static uint32_t ckpt_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float ckpt_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Encoded length of a header of that version with these tables. */
static uint64_t ckpt_header_len(uint32_t version, uint32_t units, const ckpt_section_t *sec,
                                uint32_t nsec) {
  uint64_t n = ckpt_fixed(version) + (uint64_t)units * CKPT_UNIT_BYTES +
               (uint64_t)nsec * CKPT_SEC_BYTES;
  for (uint32_t i = 0; i < nsec; i++) n += 8 * ckpt_blocks(sec[i].bytes);
  return n + 8;
}

uint64_t ckpt_file_bytes(const ckpt_header_t *h) {
  const ckpt_section_t *last = &h->sec[h->num_sections - 1];
  return last->offset + last->bytes;
}

int ckpt_header_layout(ckpt_header_t *h) {
  h->version = CKPT_VERSION;
  h->header_bytes = ckpt_header_len(h->version, h->num_units, h->sec, h->num_sections);
  uint64_t at = ckpt_align(h->header_bytes);
  for (uint32_t i = 0; i < h->num_sections; i++) {
    ckpt_section_t *s = &h->sec[i];
    s->offset = at;
    at = ckpt_align(at + s->bytes);
    free(s->sums);
    s->sums = calloc(ckpt_blocks(s->bytes) + 1, sizeof *s->sums);
    if (!s->sums) return err_set(FSDP_ENOMEM, "checkpoint: out of memory for block checksums");
  }
  return FSDP_OK;
}

void ckpt_header_free(ckpt_header_t *h) {
  free(h->units);
  for (int i = 0; i < CKPT_SECTIONS; i++) free(h->sec[i].sums);
  memset(h, 0, sizeof *h);
}

/* ---- little-endian fields ------------------------------------------------- */

typedef struct ckpt_buf {
  uint8_t *p;
  size_t at, n;
} ckpt_buf_t;

static void put(ckpt_buf_t *b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) b->p[b->at++] = (uint8_t)(v >> (8 * i));
}
static uint64_t get(ckpt_buf_t *b, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)b->p[b->at++] << (8 * i);
  return v;
}

int ckpt_header_encode(ckpt_header_t *h, uint8_t **out) {
  uint8_t *p = calloc(1, h->header_bytes);
  if (!p) return err_set(FSDP_ENOMEM, "checkpoint: out of memory for a header");
  ckpt_buf_t b = {p, 8, h->header_bytes};
  memcpy(p, CKPT_MAGIC, 8);
  put(&b, h->version, 4), put(&b, h->num_units, 4), put(&b, h->num_sections, 4), put(&b, 0, 4);
  put(&b, h->header_bytes, 8);
  put(&b, (uint32_t)h->shard_rank, 4), put(&b, (uint32_t)h->shards, 4);
  put(&b, (uint32_t)h->replicas, 4), put(&b, (uint32_t)h->strategy, 4);
  put(&b, (uint32_t)h->precision, 4), put(&b, 0, 4);
  put(&b, (uint32_t)h->model.layers, 4), put(&b, (uint32_t)h->model.channels, 4);
  put(&b, (uint32_t)h->model.heads, 4), put(&b, (uint32_t)h->model.vocab, 4);
  put(&b, (uint32_t)h->model.context, 4), put(&b, 0, 4);
  put(&b, h->min_params, 8), put(&b, h->shard_total, 8), put(&b, (uint64_t)h->step, 8);
  put(&b, h->data_epoch, 8), put(&b, h->data_window, 8), put(&b, (uint64_t)h->adam_steps, 8);
  put(&b, h->seed, 8);
  if (h->version >= 2) put(&b, h->run, 8);
  if (h->version >= 3) {
    const ckpt_sched_t *s = &h->sched;
    put(&b, (uint32_t)s->batch, 4), put(&b, (uint32_t)s->seq_len, 4);
    put(&b, (uint32_t)s->steps, 4), put(&b, (uint32_t)s->warmup_steps, 4);
    put(&b, ckpt_f32_bits(s->lr), 4), put(&b, ckpt_f32_bits(s->min_lr_frac), 4);
  }
  if (h->version >= 4)
    put(&b, h->sched.data_tokens, 8), put(&b, h->sched.data_train_tokens, 8),
        put(&b, h->sched.data_sum, 8);
  FSDP_ASSERT(b.at == ckpt_fixed(h->version));
  for (uint32_t k = 0; k < h->num_units; k++) {
    const shard_unit_t *u = &h->units[k];
    put(&b, (uint32_t)u->first, 4), put(&b, (uint32_t)u->last, 4);
    put(&b, u->offset, 8), put(&b, u->numel, 8), put(&b, u->shard_numel, 8);
  }
  for (uint32_t i = 0; i < h->num_sections; i++) {
    const ckpt_section_t *s = &h->sec[i];
    put(&b, s->kind, 4), put(&b, s->dtype, 4), put(&b, s->offset, 8), put(&b, s->bytes, 8);
  }
  for (uint32_t i = 0; i < h->num_sections; i++)
    for (uint64_t k = 0; k < ckpt_blocks(h->sec[i].bytes); k++) put(&b, h->sec[i].sums[k], 8);
  h->sum = XXH64(p, b.at, 0);
  put(&b, h->sum, 8);
  FSDP_ASSERT(b.at == h->header_bytes);
  *out = p;
  return FSDP_OK;
}

/* The layout's arithmetic: units tile the model's flat buffer in order, each
 * split into S aligned shards that cover it, and the shards add up. */
static int ckpt_check_units(const ckpt_header_t *h, const char *what) {
  uint64_t at = 0, total = 0;
  for (uint32_t k = 0; k < h->num_units; k++) {
    const shard_unit_t *u = &h->units[k];
    if (u->offset != at || !u->numel || u->numel > CKPT_TOTAL_MAX ||
        u->shard_numel % SHARD_ALIGN || u->shard_numel > CKPT_TOTAL_MAX ||
        u->shard_numel * (uint64_t)h->shards < u->numel ||
        (u->shard_numel - SHARD_ALIGN) * (uint64_t)h->shards >= u->numel || /* shard.c's padding */
        u->first < 0 || u->last < u->first)
      return err_set(FSDP_EFORMAT, "%s: header: unit %u (offset %zu, %zu elements, shards of "
                     "%zu) does not fit the layout of %d shards; the file is damaged or not a "
                     "checkpoint shard", what, k, u->offset, u->numel, u->shard_numel, h->shards);
    at += u->numel;
    total += u->shard_numel;
  }
  if (at != gpt_config_num_params(&h->model) || total != h->shard_total)
    return err_set(FSDP_EFORMAT, "%s: header: the units hold %" PRIu64 " parameters in shards "
                   "of %" PRIu64 " elements, the model has %zu and the header says %" PRIu64
                   "; the file is damaged", what, at, total, gpt_config_num_params(&h->model),
                   h->shard_total);
  return FSDP_OK;
}

static int ckpt_check_sections(const ckpt_header_t *h, const char *what) {
  uint64_t at = ckpt_align(h->header_bytes);
  unsigned seen = 0;
  for (uint32_t i = 0; i < h->num_sections; i++) {
    const ckpt_section_t *s = &h->sec[i];
    const size_t e = ckpt_dtype_bytes(s->dtype);
    if (s->kind < CKPT_SEC_PARAMS || s->kind > CKPT_SEC_ADAM_V || (seen & (1u << s->kind)))
      return err_set(FSDP_EFORMAT, "%s: header: section %u has kind %u (expected each of "
                     "params, adam_m, adam_v once); the file is damaged", what, i, s->kind);
    seen |= 1u << s->kind;
    if (!e || s->bytes != h->shard_total * e)
      return err_set(FSDP_EFORMAT, "%s: header: section %s has dtype %u and %" PRIu64 " bytes, "
                     "not %" PRIu64 " elements of fp32 or bf16; the file is damaged", what,
                     ckpt_section_name(s->kind), s->dtype, s->bytes, h->shard_total);
    if (s->offset % CKPT_ALIGN || s->offset < at)
      return err_set(FSDP_EFORMAT, "%s: header: section %s starts at %" PRIu64 ", inside the "
                     "header or the section before, or unaligned; the file is damaged", what,
                     ckpt_section_name(s->kind), s->offset);
    at = s->offset + s->bytes;
  }
  return FSDP_OK;
}

int ckpt_header_decode(const uint8_t *p, size_t n, const char *what, ckpt_header_t *h) {
  memset(h, 0, sizeof *h);
  if (n < CKPT_FIXED_V1 + 8 || memcmp(p, CKPT_MAGIC, 8))
    return err_set(FSDP_EFORMAT, "%s: not a checkpoint shard (no %s header); name a shard file "
                   "of a committed checkpoint", what, CKPT_MAGIC);
  ckpt_buf_t b = {(uint8_t *)p, 8, n};
  h->version = (uint32_t)get(&b, 4);
  h->num_units = (uint32_t)get(&b, 4);
  h->num_sections = (uint32_t)get(&b, 4);
  get(&b, 4);
  h->header_bytes = get(&b, 8);
  if (h->version < 1 || h->version > CKPT_VERSION)
    return err_set(FSDP_EFORMAT, "%s: header: version %u; this build reads versions 1 to %d (a "
                   "newer fsdpd wrote it?)", what, h->version, CKPT_VERSION);
  const uint64_t fixed = ckpt_fixed(h->version);
  if (h->header_bytes > n || h->header_bytes > CKPT_HEADER_MAX || h->header_bytes < fixed + 8 ||
      n < fixed + 8)
    return err_set(FSDP_EFORMAT, "%s: header: length %" PRIu64 " but the file has %zu bytes "
                   "there; the file is truncated or damaged", what, h->header_bytes, n);
  if (h->num_units < 1 || h->num_units > CKPT_UNITS_MAX || h->num_sections != CKPT_SECTIONS)
    return err_set(FSDP_EFORMAT, "%s: header: %u units and %u sections (expected 1..%u and %d)",
                   what, h->num_units, h->num_sections, CKPT_UNITS_MAX, CKPT_SECTIONS);
  h->shard_rank = (int32_t)get(&b, 4), h->shards = (int32_t)get(&b, 4);
  h->replicas = (int32_t)get(&b, 4), h->strategy = (int32_t)get(&b, 4);
  h->precision = (int32_t)get(&b, 4), get(&b, 4);
  h->model.layers = (int)get(&b, 4), h->model.channels = (int)get(&b, 4);
  h->model.heads = (int)get(&b, 4), h->model.vocab = (int)get(&b, 4);
  h->model.context = (int)get(&b, 4), get(&b, 4);
  h->min_params = get(&b, 8), h->shard_total = get(&b, 8), h->step = (int64_t)get(&b, 8);
  h->data_epoch = get(&b, 8), h->data_window = get(&b, 8), h->adam_steps = (int64_t)get(&b, 8);
  h->seed = get(&b, 8);
  h->run = h->version >= 2 ? get(&b, 8) : 0;
  if (h->version >= 3) {
    ckpt_sched_t *s = &h->sched;
    s->batch = (int32_t)get(&b, 4), s->seq_len = (int32_t)get(&b, 4);
    s->steps = (int32_t)get(&b, 4), s->warmup_steps = (int32_t)get(&b, 4);
    s->lr = ckpt_bits_f32((uint32_t)get(&b, 4)), s->min_lr_frac = ckpt_bits_f32((uint32_t)get(&b, 4));
    if (s->batch < 1 || s->seq_len < 1 || s->steps < 0 || s->warmup_steps < 0 ||
        !isfinite(s->lr) || !isfinite(s->min_lr_frac))
      return err_set(FSDP_EFORMAT, "%s: header: global batch %d, seq_len %d, steps %d, "
                     "warmup_steps %d, lr %g, min_lr_frac %g: out of range; the file is damaged",
                     what, s->batch, s->seq_len, s->steps, s->warmup_steps, (double)s->lr,
                     (double)s->min_lr_frac);
  }
  if (h->version >= 4) {
    ckpt_sched_t *s = &h->sched;
    s->data_tokens = get(&b, 8), s->data_train_tokens = get(&b, 8), s->data_sum = get(&b, 8);
    if (s->data_train_tokens > s->data_tokens)
      return err_set(FSDP_EFORMAT, "%s: header: a training split of %" PRIu64 " tokens in a "
                     "token file of %" PRIu64 ": out of range; the file is damaged", what,
                     s->data_train_tokens, s->data_tokens);
  }
  int rc;
  if (h->shards < 1 || h->shard_rank < 0 || h->shard_rank >= h->shards || h->replicas < 1 ||
      h->strategy < 0 || h->strategy >= SHARD__COUNT || h->precision < PRECISION_FP32 ||
      h->precision > PRECISION_BF16_TRUE || h->step < 0 || h->adam_steps < 0 ||
      h->shard_total > CKPT_TOTAL_MAX)
    return err_set(FSDP_EFORMAT, "%s: header: shard %d of %d (x%d), strategy %d, precision %d, "
                   "step %" PRId64 ": out of range; the file is damaged", what, h->shard_rank,
                   h->shards, h->replicas, h->strategy, h->precision, h->step);
  if ((rc = gpt_config_validate(&h->model)))
    return err_wrap(FSDP_EFORMAT, "%s: header: model", what);
  /* the tables must fit in the header before anything is allocated for them */
  const uint64_t tables = (uint64_t)h->num_units * CKPT_UNIT_BYTES + CKPT_SECTIONS * CKPT_SEC_BYTES;
  if (fixed + tables + 8 > h->header_bytes)
    return err_set(FSDP_EFORMAT, "%s: header: %u units do not fit in its %" PRIu64 " bytes",
                   what, h->num_units, h->header_bytes);
  h->units = calloc(h->num_units, sizeof *h->units);
  if (!h->units) return err_set(FSDP_ENOMEM, "%s: out of memory", what);
  for (uint32_t k = 0; k < h->num_units; k++) {
    shard_unit_t *u = &h->units[k];
    u->first = (int)(uint32_t)get(&b, 4), u->last = (int)(uint32_t)get(&b, 4);
    u->offset = get(&b, 8), u->numel = get(&b, 8), u->shard_numel = get(&b, 8);
  }
  for (uint32_t i = 0; i < CKPT_SECTIONS; i++) {
    ckpt_section_t *s = &h->sec[i];
    s->kind = (uint32_t)get(&b, 4), s->dtype = (uint32_t)get(&b, 4);
    s->offset = get(&b, 8), s->bytes = get(&b, 8);
  }
  if ((rc = ckpt_check_units(h, what)) || (rc = ckpt_check_sections(h, what))) goto fail;
  if (ckpt_header_len(h->version, h->num_units, h->sec, h->num_sections) != h->header_bytes) {
    rc = err_set(FSDP_EFORMAT, "%s: header: its length %" PRIu64 " does not match its tables; "
                 "the file is damaged", what, h->header_bytes);
    goto fail;
  }
  for (uint32_t i = 0; i < CKPT_SECTIONS; i++) {
    ckpt_section_t *s = &h->sec[i];
    const uint64_t nb = ckpt_blocks(s->bytes);
    if (!(s->sums = calloc(nb + 1, sizeof *s->sums))) {
      rc = err_set(FSDP_ENOMEM, "%s: out of memory", what);
      goto fail;
    }
    for (uint64_t k = 0; k < nb; k++) s->sums[k] = get(&b, 8);
  }
  /* last, so that every check above meets any bytes (the fuzz target's) */
  h->sum = get(&b, 8);
  if (XXH64(p, h->header_bytes - 8, 0) != h->sum) {
    rc = err_set(FSDP_EFORMAT, "%s: header: checksum mismatch; the file is damaged", what);
    goto fail;
  }
  return FSDP_OK;
fail:
  ckpt_header_free(h);
  return rc;
}

int ckpt_header_read(int fd, const char *path, ckpt_header_t *h) {
  uint8_t fixed[CKPT_FIXED + 8];
  ssize_t got = pread(fd, fixed, sizeof fixed, 0);
  if (got < 0) return err_set_errno(FSDP_EIO, errno, "%s: reading the header", path);
  if ((size_t)got < sizeof fixed || memcmp(fixed, CKPT_MAGIC, 8))
    return ckpt_header_decode(fixed, (size_t)got, path, h); /* its error says what is wrong */
  uint64_t len = 0;
  for (int i = 0; i < 8; i++) len |= (uint64_t)fixed[24 + i] << (8 * i);
  if (len > CKPT_HEADER_MAX || len < sizeof fixed)
    return err_set(FSDP_EFORMAT, "%s: header: length %" PRIu64 " is out of range; the file is "
                   "damaged", path, len);
  uint8_t *p = malloc(len);
  if (!p) return err_set(FSDP_ENOMEM, "%s: out of memory for its header", path);
  size_t have = 0;
  while (have < len) {
    ssize_t r = pread(fd, p + have, len - have, (off_t)have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    have += (size_t)r;
  }
  int rc = ckpt_header_decode(p, have, path, h);
  free(p);
  return rc;
}

/* ---- names ---------------------------------------------------------------- */

void ckpt_step_dir(char *buf, size_t len, const char *root, int64_t step) {
  snprintf(buf, len, "%s/step-%08" PRId64, root, step);
}

void ckpt_shard_name(char *buf, size_t len, int shard_rank, int shards) {
  snprintf(buf, len, "shard-%05d-of-%05d.fsdp", shard_rank, shards);
}

/* 1 when name, in a checkpoint root, is exactly the format's name of a
 * step directory (step-<N, 8 digits>, ckpt_step_dir), its step in *step;
 * 0 for any other name. */
static int ckpt_step_name(const char *name, long long *step) {
  char tail, own[32];
  if (sscanf(name, "step-%lld%c", step, &tail) != 1 || *step < 0) return 0;
  snprintf(own, sizeof own, "step-%08lld", *step);
  return !strcmp(own, name);
}

int ckpt_dir_step(const char *dir, int64_t *step) {
  const char *base = strrchr(dir, '/');
  long long s;
  if (!ckpt_step_name(base ? base + 1 : dir, &s)) return 0;
  *step = s;
  return 1;
}

/* ---- opening files others write -------------------------------------------------- */

int ckpt_open_file(const char *path, int *out) {
  /* no link is followed and a FIFO cannot hold the open: the directory is
   * writable by the job's user, and the coordinator opens these too */
  int rc = file_open_regular(path, O_RDONLY, 0, out);
  if (rc == FSDP_EFORMAT)
    return err_set(FSDP_EFORMAT, "%s is not a regular file (a link, a FIFO or a directory); a "
                   "checkpoint holds only the files its ranks wrote", path);
  return rc;
}

/* 0 when path is a directory itself (not a link to one). */
static int ckpt_real_dir(const char *path) {
  struct stat st;
  if (lstat(path, &st)) return err_set_errno(err_from_errno(errno), errno, "checkpoint %s", path);
  if (!S_ISDIR(st.st_mode))
    return err_set(FSDP_EFORMAT, "checkpoint %s is not a directory (a link?); it is left alone",
                   path);
  return FSDP_OK;
}

/* ---- the manifest ----------------------------------------------------------- */

int ckpt_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return err_set_errno(err_from_errno(errno), errno, "checkpoint: open %s", dir);
  int rc = fsync(fd) ? err_set_errno(FSDP_EIO, errno, "checkpoint: fsync %s", dir) : FSDP_OK;
  close(fd);
  return rc;
}

int ckpt_header_same_layout(const ckpt_header_t *a, const ckpt_header_t *b) {
  if (a->step != b->step || a->shards != b->shards || a->shard_total != b->shard_total ||
      a->num_units != b->num_units || memcmp(&a->model, &b->model, sizeof a->model) ||
      a->precision != b->precision || a->data_epoch != b->data_epoch ||
      a->data_window != b->data_window || a->adam_steps != b->adam_steps ||
      a->seed != b->seed || memcmp(&a->sched, &b->sched, sizeof a->sched))
    return 0;
  for (uint32_t k = 0; k < a->num_units; k++)
    if (memcmp(&a->units[k], &b->units[k], sizeof a->units[k])) return 0;
  for (int i = 0; i < CKPT_SECTIONS; i++)
    if (a->sec[i].kind != b->sec[i].kind || a->sec[i].dtype != b->sec[i].dtype) return 0;
  return 1;
}

static json_t *ckpt_manifest_json(const ckpt_header_t *h, const ckpt_shard_report_t *r) {
  json_t *units = json_array(), *files = json_array();
  for (uint32_t k = 0; k < h->num_units; k++) {
    const shard_unit_t *u = &h->units[k];
    json_array_append_new(units, json_pack("{s:i,s:i,s:I,s:I,s:I}", "first", u->first, "last",
                                           u->last, "offset", (json_int_t)u->offset, "numel",
                                           (json_int_t)u->numel, "shard_numel",
                                           (json_int_t)u->shard_numel));
  }
  for (int j = 0; j < h->shards; j++) {
    char sum[17];
    snprintf(sum, sizeof sum, "%016" PRIx64, r[j].sum);
    json_array_append_new(files, json_pack("{s:i,s:s,s:I,s:s}", "shard", j, "name", r[j].name,
                                           "bytes", (json_int_t)r[j].bytes, "xxh64", sum));
  }
  precision_t p = (precision_t)h->precision;
  /* the seed as decimal text: it is any u64, more than a JSON integer
   * (jansson's, signed) holds */
  char seed[24];
  snprintf(seed, sizeof seed, "%" PRIu64, h->seed);
  return json_pack("{s:s,s:i,s:I,s:i,s:i,s:s,s:s,s:{s:i,s:i,s:i,s:i,s:i},s:I,s:I,s:s,s:o,s:o}",
                   "format", "fsdpd-checkpoint", "version", CKPT_MANIFEST_VERSION, "step",
                   (json_int_t)h->step, "shards", h->shards, "replicas", h->replicas,
                   "strategy", shard_strategy_name((shard_strategy_t)h->strategy), "precision",
                   precision_name(p), "model", "layers", h->model.layers, "channels",
                   h->model.channels, "heads", h->model.heads, "vocab", h->model.vocab,
                   "context", h->model.context, "min_params", (json_int_t)h->min_params,
                   "shard_total", (json_int_t)h->shard_total, "seed", seed, "units", units,
                   "files", files);
}

/* 1 when path is a regular file holding exactly text and a newline (how a
 * manifest is written). */
static int ckpt_file_holds(const char *path, const char *text) {
  int fd;
  if (ckpt_open_file(path, &fd)) return 0;
  const size_t n = strlen(text);
  struct stat st;
  char *buf = NULL;
  int same = !fstat(fd, &st) && (uint64_t)st.st_size == n + 1 && (buf = malloc(n + 1)) &&
             pread(fd, buf, n + 1, 0) == (ssize_t)(n + 1) && !memcmp(buf, text, n) &&
             buf[n] == '\n';
  free(buf);
  close(fd);
  return same;
}

int ckpt_commit(const char *dir, int shards, const ckpt_shard_report_t *reports, uint64_t run) {
  if (shards < 1) return err_set(FSDP_EINVAL, "checkpoint %s: %d shards", dir, shards);
  ckpt_shard_report_t *r = calloc((size_t)shards, sizeof *r);
  ckpt_header_t first = {0};
  int rc = r ? ckpt_real_dir(dir) : err_set(FSDP_ENOMEM, "checkpoint: out of memory");
  for (int j = 0; !rc && j < shards; j++) {
    char name[CKPT_NAME_MAX], path[4096];
    ckpt_shard_name(name, sizeof name, j, shards);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd;
    if ((rc = ckpt_open_file(path, &fd))) {
      if (rc == FSDP_ENOENT)
        rc = err_set(FSDP_ENOENT, "checkpoint %s: shard %d of %d (%s) is missing; it cannot be "
                     "committed", dir, j, shards, name);
      break;
    }
    ckpt_header_t h;
    struct stat st;
    rc = ckpt_header_read(fd, path, &h);
    if (!rc && fstat(fd, &st)) rc = err_set_errno(FSDP_EIO, errno, "checkpoint: stat %s", path);
    close(fd);
    if (rc) break;
    if (h.shard_rank != j || h.shards != shards || (uint64_t)st.st_size != ckpt_file_bytes(&h))
      rc = err_set(FSDP_EFORMAT, "checkpoint %s: %s holds shard %d of %d in %lld bytes (its "
                   "header implies %" PRIu64 "); expected shard %d of %d, whole", dir, name,
                   h.shard_rank, h.shards, (long long)st.st_size, ckpt_file_bytes(&h), j, shards);
    else if (!reports && h.run != run)
      /* no report vouches for it: only this run's own shards commit. One of
       * another run (a run that stopped mid-save, or an older build's) is
       * as good as missing: its rank replaces it when it writes this run's */
      rc = err_set(FSDP_ENOENT, "checkpoint %s: %s was written by another run (%016" PRIx64
                   ", not this run's %016" PRIx64 "); it is not committed until its rank writes "
                   "it in this run", dir, name, h.run, run);
    else if (j && !ckpt_header_same_layout(&first, &h))
      rc = err_set(FSDP_EFORMAT, "checkpoint %s: %s is of another step, model or layout than "
                   "shard 0; it cannot be committed", dir, name);
    else if (reports && (reports[j].sum != h.sum || reports[j].bytes != (uint64_t)st.st_size))
      rc = err_set(FSDP_EFORMAT, "checkpoint %s: %s is not the file its rank reported (checksum "
                   "%016" PRIx64 ", %lld bytes; reported %016" PRIx64 ", %" PRIu64 "); it cannot "
                   "be committed", dir, name, h.sum, (long long)st.st_size, reports[j].sum,
                   reports[j].bytes);
    r[j] = (ckpt_shard_report_t){j, "", (uint64_t)st.st_size, h.sum};
    snprintf(r[j].name, sizeof r[j].name, "%s", name);
    if (j == 0) first = h;
    else ckpt_header_free(&h);
  }
  char tmp[4096], path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST);
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%d", dir, CKPT_MANIFEST, (int)getpid());
  json_t *m = rc ? NULL : ckpt_manifest_json(&first, r);
  char *text = m ? json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
  if (!rc && !text) rc = err_set(FSDP_ENOMEM, "checkpoint %s: out of memory for its manifest", dir);
  /* committed already with this very manifest (a re-commit: the janitor's
   * after a crash, or a second rank finishing with the first): nothing is
   * written, and a failure below leaves that manifest, which this call did
   * not write, where it is */
  const int had = !rc && ckpt_file_holds(path, text);
  if (!rc && !had) {
    unlink(tmp); /* a stale one (or a link planted there) goes; the new one is ours alone */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    const size_t n = strlen(text);
    if (fd < 0 || write(fd, text, n) != (ssize_t)n || write(fd, "\n", 1) != 1 || fsync(fd))
      rc = err_set_errno(err_from_errno(errno), errno, "checkpoint %s: writing %s", dir, tmp);
    if (fd >= 0) close(fd);
    if (!rc && rename(tmp, path))
      rc = err_set_errno(err_from_errno(errno), errno, "checkpoint %s: rename %s", dir, tmp);
    if (rc) unlink(tmp);
  }
  if (!rc && (rc = ckpt_fsync_dir(dir))) {
    if (!had)
      unlink(path); /* not durable: not committed (a loader trusts a manifest) */
    else
      rc = err_wrap(rc, "checkpoint %s: its %s was there already and is left as it was", dir,
                    CKPT_MANIFEST);
  }
  free(text);
  json_decref(m);
  ckpt_header_free(&first);
  free(r);
  return rc;
}

/* ---- reading it back ---------------------------------------------------------- */

static int ckpt_json_int(json_t *o, const char *key, const char *path, int64_t lo, int64_t hi,
                         int64_t *out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return err_set(FSDP_EFORMAT, "%s: \"%s\" is missing or not an integer in [%" PRId64 ", %"
                   PRId64 "]; the manifest is damaged", path, key, lo, hi);
  *out = json_integer_value(v);
  return FSDP_OK;
}

int ckpt_manifest_read(const char *dir, ckpt_manifest_t *m) {
  return ckpt_manifest_read_max(dir, CKPT_HEADER_MAX, m);
}

int ckpt_manifest_read_max(const char *dir, uint64_t max, ckpt_manifest_t *m) {
  memset(m, 0, sizeof *m);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST);
  int fd, rc = ckpt_open_file(path, &fd);
  if (rc == FSDP_ENOENT)
    return err_set(FSDP_ENOENT, "%s: not a committed checkpoint (no %s); only committed "
                   "checkpoints load", dir, CKPT_MANIFEST);
  if (rc) return rc;
  struct stat st;
  char *text = NULL;
  if (fstat(fd, &st) || st.st_size > (off_t)CKPT_HEADER_MAX)
    rc = err_set(FSDP_EFORMAT, "%s: larger than %u bytes or unreadable; the manifest is damaged",
                 path, CKPT_HEADER_MAX);
  else if ((uint64_t)st.st_size > max)
    rc = err_set(FSDP_ELIMIT, "%s: %lld bytes, over the limit of %" PRIu64 " bytes", path,
                 (long long)st.st_size, max);
  else if (!(text = malloc((size_t)st.st_size + 1)))
    rc = err_set(FSDP_ENOMEM, "%s: out of memory", path);
  size_t n = 0;
  while (!rc && n < (size_t)st.st_size) {
    ssize_t r = read(fd, text + n, (size_t)st.st_size - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) rc = err_set_errno(FSDP_EIO, errno, "%s: short read", path);
    else n += (size_t)r;
  }
  close(fd);
  if (!rc) rc = ckpt_manifest_parse(text, n, path, m);
  free(text);
  int64_t named;
  if (!rc && ckpt_dir_step(dir, &named) && m->step != named) {
    rc = err_set(FSDP_EFORMAT, "%s: \"step\" is %" PRId64 " in the directory of step %" PRId64
                 "; the manifest is damaged", path, m->step, named);
    ckpt_manifest_free(m);
  }
  return rc;
}

int ckpt_manifest_parse(const char *text, size_t len, const char *path, ckpt_manifest_t *m) {
  memset(m, 0, sizeof *m);
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return err_set(FSDP_EFORMAT, "%s: line %d: %s; the manifest is damaged", path, je.line,
                   je.text);
  int rc = FSDP_OK;
  int64_t v[12];
  json_t *model = json_object_get(root, "model"), *files = json_object_get(root, "files");
  const char *fmt = json_string_value(json_object_get(root, "format"));
  const char *strategy = json_string_value(json_object_get(root, "strategy"));
  const char *precision = json_string_value(json_object_get(root, "precision"));
  if (!fmt || strcmp(fmt, "fsdpd-checkpoint") || !json_is_object(model) || !json_is_array(files) ||
      !strategy || !precision) {
    rc = err_set(FSDP_EFORMAT, "%s: not an fsdpd checkpoint manifest (format, model, files, "
                 "strategy, precision)", path);
    goto out;
  }
  if ((rc = ckpt_json_int(root, "version", path, CKPT_MANIFEST_VERSION, CKPT_MANIFEST_VERSION,
                                &v[0])) ||
      (rc = ckpt_json_int(root, "step", path, 0, INT64_MAX, &v[1])) ||
      (rc = ckpt_json_int(root, "shards", path, 1, 1 << 20, &v[2])) ||
      (rc = ckpt_json_int(root, "replicas", path, 1, 1 << 20, &v[3])) ||
      (rc = ckpt_json_int(root, "min_params", path, 0, INT64_MAX, &v[4])) ||
      (rc = ckpt_json_int(root, "shard_total", path, 1, (int64_t)CKPT_TOTAL_MAX, &v[5])) ||
      (rc = ckpt_json_int(model, "layers", path, 1, INT32_MAX, &v[6])) ||
      (rc = ckpt_json_int(model, "channels", path, 1, INT32_MAX, &v[7])) ||
      (rc = ckpt_json_int(model, "heads", path, 1, INT32_MAX, &v[8])) ||
      (rc = ckpt_json_int(model, "vocab", path, 1, INT32_MAX, &v[9])) ||
      (rc = ckpt_json_int(model, "context", path, 1, INT32_MAX, &v[10])))
    goto out;
  shard_strategy_t st;
  precision_t pr;
  if (shard_strategy_parse(strategy, &st) || precision_parse(precision, &pr)) {
    rc = err_wrap(FSDP_EFORMAT, "%s", path);
    goto out;
  }
  m->step = v[1], m->shards = (int)v[2], m->replicas = (int)v[3], m->strategy = (int)st;
  m->precision = (int)pr, m->min_params = (uint64_t)v[4], m->shard_total = (uint64_t)v[5];
  m->model = (gpt_config_t){(int)v[6], (int)v[7], (int)v[8], (int)v[9], (int)v[10]};
  /* the seed: absent in a manifest written before it was recorded (then
   * unknown, and only the shards' headers say it); present, decimal digits
   * of a u64 */
  json_t *seed = json_object_get(root, "seed");
  if (seed) {
    const char *t = json_string_value(seed);
    char *end = NULL;
    errno = 0;
    m->seed = t && t[0] >= '0' && t[0] <= '9' ? strtoull(t, &end, 10) : 0;
    if (!t || !end || *end || errno) {
      rc = err_set(FSDP_EFORMAT, "%s: \"seed\" is not the decimal text of a 64-bit number; the "
                   "manifest is damaged", path);
      goto out;
    }
    m->has_seed = 1;
  }
  /* the model sizes what its readers allocate (tensor tables by layers) and
   * every byte count an export writes: it must be one a job could have
   * (gpt_config_validate: heads dividing channels, each dimension within
   * bounds that keep a model under 2^48 elements, so no size overflows), and
   * one its shards can hold (shard_total x shards <= 2^60 elements) */
  if ((rc = gpt_config_validate(&m->model))) {
    rc = err_wrap(FSDP_EFORMAT, "%s: model (the manifest is damaged)", path);
    goto out;
  }
  const uint64_t params = gpt_config_num_params(&m->model);
  if (params > m->shard_total * (uint64_t)m->shards) {
    rc = err_set(FSDP_EFORMAT, "%s: model: %" PRIu64 " parameters do not fit in %d shards of "
                 "%" PRIu64 " (shard_total); the manifest is damaged", path, params, m->shards,
                 m->shard_total);
    goto out;
  }
  if (json_array_size(files) != (size_t)m->shards) {
    rc = err_set(FSDP_EFORMAT, "%s: %zu files for %d shards; the manifest is damaged", path,
                 json_array_size(files), m->shards);
    goto out;
  }
  if (!(m->shard = calloc((size_t)m->shards, sizeof *m->shard))) {
    rc = err_set(FSDP_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  for (int j = 0; !rc && j < m->shards; j++) {
    json_t *f = json_array_get(files, (size_t)j);
    const char *name = json_string_value(json_object_get(f, "name"));
    const char *sum = json_string_value(json_object_get(f, "xxh64"));
    char want[CKPT_NAME_MAX], *end = NULL;
    ckpt_shard_name(want, sizeof want, j, m->shards);
    if ((rc = ckpt_json_int(f, "shard", path, j, j, &v[0])) ||
        (rc = ckpt_json_int(f, "bytes", path, 1, INT64_MAX, &v[1])))
      break;
    /* the name is the one the format gives shard j: nothing else in the
     * directory (or outside it) can be named by a manifest */
    if (!name || strcmp(name, want) || !sum || strlen(sum) != 16) {
      rc = err_set(FSDP_EFORMAT, "%s: file %d: name must be %s with a 16-digit xxh64; the "
                   "manifest is damaged", path, j, want);
      break;
    }
    m->shard[j].shard_rank = j;
    snprintf(m->shard[j].name, sizeof m->shard[j].name, "%s", name);
    m->shard[j].bytes = (uint64_t)v[1];
    m->shard[j].sum = strtoull(sum, &end, 16);
    if (*end) rc = err_set(FSDP_EFORMAT, "%s: file %d: xxh64 \"%s\" is not hex", path, j, sum);
  }
out:
  json_decref(root);
  if (rc) ckpt_manifest_free(m);
  return rc;
}

void ckpt_manifest_free(ckpt_manifest_t *m) {
  free(m->shard);
  memset(m, 0, sizeof *m);
}

int ckpt_resume_check(const ckpt_manifest_t *m, const char *dir, const ckpt_want_t *want) {
  const gpt_config_t *h = &m->model, *w = &want->model;
  /* a checkpoint_dir's latest is gone on from unasked (auto_resume): the
   * directory may be another run's, whose fix is one of the job's own */
  const char *own = want->own ? " (or give this job a checkpoint_dir of its own: with auto_resume "
                                "it goes on from the latest checkpoint there)" : "";
  if (h->layers != w->layers || h->channels != w->channels || h->heads != w->heads ||
      h->vocab != w->vocab || h->context != w->context)
    return err_set(FSDP_EINVAL, "%s holds a model of layers %d, channels %d, heads %d, vocab %d, "
                   "context %d; this job's has %d, %d, %d, %d, %d: resume with the model it was "
                   "saved with%s", dir, h->layers, h->channels, h->heads, h->vocab, h->context,
                   w->layers, w->channels, w->heads, w->vocab, w->context, own);
  if (m->has_seed && m->seed != want->seed)
    return err_set(FSDP_EINVAL, "%s was trained with seed %llu, this job has %llu; the data "
                   "order would differ: set seed = %llu%s", dir, (unsigned long long)m->seed,
                   (unsigned long long)want->seed, (unsigned long long)m->seed, own);
  if (m->step > want->steps)
    return err_set(FSDP_EINVAL, "%s is at step %lld, past this job's steps %d; raise steps%s",
                   dir, (long long)m->step, want->steps, own);
  return FSDP_OK;
}

int ckpt_resume_choose(const char *resume_from, const char *checkpoint_dir, int auto_resume,
                       uint64_t max, ckpt_from_t *from, int64_t *step) {
  char dir[4096];
  ckpt_manifest_t a;
  *from = CKPT_FROM_NONE, *step = 0;
  if (resume_from[0] || auto_resume) {
    const char *key = resume_from[0] ? "resume_from" : "checkpoint_dir";
    int rc = ckpt_latest_max(resume_from[0] ? resume_from : checkpoint_dir, max, dir, sizeof dir);
    if (rc == FSDP_ENOENT && !resume_from[0]) return FSDP_OK;
    if (rc) return err_wrap(rc, "%s", key);
    *from = !resume_from[0]              ? CKPT_FROM_UNDER_OWN
            : strcmp(dir, resume_from) ? CKPT_FROM_UNDER_GIVEN
                                       : CKPT_FROM_GIVEN;
    /* a step directory of a root goes by its name: a manifest there that
     * does not read is found damaged at the load, as a damaged shard is */
    if (*from != CKPT_FROM_GIVEN) {
      ckpt_dir_step(dir, step);
    } else {
      if ((rc = ckpt_manifest_read_max(dir, max, &a))) return err_wrap(rc, "%s", key);
      *step = a.step;
      ckpt_manifest_free(&a);
    }
  }
  int64_t later;
  if (*from == CKPT_FROM_UNDER_OWN || !checkpoint_dir[0] ||
      ckpt_latest_max(checkpoint_dir, max, dir, sizeof dir) || !ckpt_dir_step(dir, &later) ||
      later <= *step)
    return FSDP_OK;
  /* a job started from resume_from that checkpointed since (a restart, a
   * requeue) goes on from its own latest, not back to where it began */
  if (auto_resume) {
    *from = CKPT_FROM_UNDER_OWN, *step = later;
    return FSDP_OK;
  }
  /* a run that would write steps checkpoint_dir holds another run's of:
   * those steps are never written again (ckpt_rank_write), and a restart
   * would take that run's latest for this one's */
  return err_set(FSDP_EEXIST, "checkpoint_dir: %s holds step %lld, committed by an earlier run, "
                 "and this run starts at step %lld (auto_resume = 0%s%s): its checkpoints up to "
                 "that step would not be written and a restart would go on from the other run; "
                 "give this run a checkpoint_dir of its own", checkpoint_dir, (long long)later,
                 (long long)*step, resume_from[0] ? ", resume_from " : "", resume_from);
}

int ckpt_manifest_check(const ckpt_manifest_t *m, const char *dir, int64_t step, int shards,
                        const ckpt_shard_report_t *reports) {
  if (m->step != step)
    return err_set(FSDP_EFORMAT, "checkpoint %s: step: its manifest says %" PRId64 ", committed "
                   "as %" PRId64, dir, m->step, step);
  if (m->shards != shards)
    return err_set(FSDP_EFORMAT, "checkpoint %s: shards: its manifest says %d, committed with %d",
                   dir, m->shards, shards);
  for (int j = 0; j < shards; j++)
    if (m->shard[j].bytes != reports[j].bytes || m->shard[j].sum != reports[j].sum)
      return err_set(FSDP_EFORMAT, "checkpoint %s: %s: its manifest says %" PRIu64 " bytes, "
                     "checksum %016" PRIx64 "; committed as %" PRIu64 " bytes, checksum %016"
                     PRIx64, dir, m->shard[j].name, m->shard[j].bytes, m->shard[j].sum,
                     reports[j].bytes, reports[j].sum);
  return FSDP_OK;
}

int ckpt_latest(const char *root, char *buf, size_t len) {
  return ckpt_latest_max(root, CKPT_HEADER_MAX, buf, len);
}

int ckpt_latest_max(const char *root, uint64_t max, char *buf, size_t len) {
  ckpt_manifest_t m;
  const int rc = ckpt_manifest_read_max(root, max, &m);
  if (!rc) {
    ckpt_manifest_free(&m);
    snprintf(buf, len, "%s", root);
    return FSDP_OK;
  }
  /* root's own manifest, damaged or too large: its error is the answer */
  if (rc == FSDP_EFORMAT || rc == FSDP_ELIMIT) return rc;
  return ckpt_latest_below(root, LLONG_MAX, buf, len);
}

int ckpt_latest_below(const char *root, long long below, char *buf, size_t len) {
  DIR *d = opendir(root);
  if (!d) return err_set_errno(err_from_errno(errno), errno, "checkpoints: cannot list %s", root);
  long long best = -1;
  int shards = 0; /* root holds shard files: a step directory itself */
  for (struct dirent *e; (e = readdir(d));) {
    long long step;
    shards |= !strncmp(e->d_name, "shard-", 6);
    if (!ckpt_step_name(e->d_name, &step) || step <= best || step >= below) continue;
    /* a manifest there, whole or not: one that does not read is found
     * damaged when it is loaded, as a damaged shard is, not passed over */
    char man[4096];
    struct stat st;
    snprintf(man, sizeof man, "%s/%s/%s", root, e->d_name, CKPT_MANIFEST);
    if (!lstat(man, &st)) best = step;
  }
  closedir(d);
  if (best < 0 && shards)
    return err_set(FSDP_ENOENT, "%s: not a committed checkpoint (no %s: its ranks did not all "
                   "finish, or it was aborted); only committed checkpoints load", root, CKPT_MANIFEST);
  if (best < 0)
    return err_set(FSDP_ENOENT, "checkpoints: %s holds no committed checkpoint", root);
  ckpt_step_dir(buf, len, root, best);
  return FSDP_OK;
}

int ckpt_steps(const char *root, int64_t *steps, int cap, int *total) {
  *total = 0;
  DIR *d = opendir(root);
  if (!d) return err_set_errno(err_from_errno(errno), errno, "checkpoints: cannot list %s", root);
  int n = 0; /* steps[0..n) ascending: the highest seen */
  for (struct dirent *e; (e = readdir(d));) {
    long long step;
    char man[4096];
    struct stat st;
    if (!ckpt_step_name(e->d_name, &step)) continue;
    snprintf(man, sizeof man, "%s/%s/%s", root, e->d_name, CKPT_MANIFEST);
    if (lstat(man, &st)) continue; /* as ckpt_latest_below counts them */
    (*total)++;
    if (cap < 1 || (n == cap && step <= steps[0])) continue;
    if (n == cap) memmove(steps, steps + 1, (size_t)--n * sizeof *steps); /* the lowest goes */
    int i = n++;
    for (; i > 0 && steps[i - 1] > step; i--) steps[i] = steps[i - 1];
    steps[i] = step;
  }
  closedir(d);
  return FSDP_OK;
}

/* ---- removal ------------------------------------------------------------------ */

/* 1 for the names a checkpoint directory may hold: its shards, their
 * temporary names and the manifest's (nothing else is ever deleted). */
static int ckpt_own_name(const char *n) {
  unsigned j, S;
  int end = 0;
  if (!strcmp(n, CKPT_MANIFEST)) return 1;
  if (n[0] == '.') n++; /* a temporary name: .<name>.tmp.<pid> */
  if (sscanf(n, "shard-%5u-of-%5u.fsdp%n", &j, &S, &end) == 2 && end && (!n[end] || !strncmp(n + end, ".tmp.", 5)))
    return 1;
  return !strncmp(n, CKPT_MANIFEST ".tmp.", sizeof CKPT_MANIFEST + 4);
}

/* ckpt_remove, and ckpt_remove_aborted (committed 0: a manifest there
 * keeps everything). */
static int ckpt_remove_dir(const char *dir, int committed) {
  char path[4096];
  int rc = ckpt_real_dir(dir); /* a link to elsewhere is not followed */
  if (rc == FSDP_ENOENT) return FSDP_OK;
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST);
  struct stat st;
  if (!committed && !lstat(path, &st))
    return err_set(FSDP_EEXIST, "checkpoint %s is committed (it holds %s); not removed", dir,
                   CKPT_MANIFEST);
  /* uncommitted first, and durably so before a shard goes: a reader never
   * finds a manifest over missing shards, not even after a power loss (the
   * unlinks are not ordered on disk without the fsync between). A failed
   * fsync leaves the shards: a manifest that comes back still has them */
  if (committed && unlink(path) && errno != ENOENT)
    return err_set_errno(err_from_errno(errno), errno, "checkpoint: cannot remove %s", path);
  if (committed && (rc = ckpt_fsync_dir(dir)))
    return err_wrap(rc, "checkpoint %s: its manifest's removal is not durable, so its shards "
                    "are kept; removing it again retries", dir);
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return FSDP_OK;
    return err_set_errno(err_from_errno(errno), errno, "checkpoint: cannot list %s", dir);
  }
  for (struct dirent *e; (e = readdir(d));) {
    if (!ckpt_own_name(e->d_name)) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) && errno != ENOENT && !rc)
      rc = err_set_errno(err_from_errno(errno), errno, "checkpoint: cannot remove %s", path);
  }
  closedir(d);
  if (!rc && rmdir(dir) && errno != ENOENT)
    rc = err_set_errno(err_from_errno(errno), errno, "checkpoint: %s is not empty after its files "
                       "were removed (something else was put there); left in place", dir);
  return rc;
}

int ckpt_remove(const char *dir) { return ckpt_remove_dir(dir, 1); }

int ckpt_remove_aborted(const char *dir) { return ckpt_remove_dir(dir, 0); }

int ckpt_set_aside(const char *dir, char *to, size_t len) {
  int rc = ckpt_real_dir(dir); /* a link is not followed, nor moved */
  if (rc) return rc;
  char parent[4096];
  const char *slash = strrchr(dir, '/');
  snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - dir) : 1, slash ? dir : ".");
  for (int i = 1; i <= 100; i++) {
    if (i == 1) snprintf(to, len, "%s.damaged", dir);
    else snprintf(to, len, "%s.damaged-%d", dir, i);
    /* never over anything: an earlier one set aside of the same step stays */
    if (!renameat2(AT_FDCWD, dir, AT_FDCWD, to, RENAME_NOREPLACE))
      return ckpt_fsync_dir(parent[0] ? parent : "/");
    if (errno != EEXIST && errno != ENOTEMPTY)
      return err_set_errno(err_from_errno(errno), errno, "checkpoint %s: cannot set it aside as "
                           "%s", dir, to);
  }
  return err_set(FSDP_EEXIST, "checkpoint %s: 100 damaged ones of its step are set aside already "
                 "(%s.damaged*); remove them", dir, dir);
}

/* 1 when every shard file the manifest m of dir names is there at the size
 * it committed: a cheap look (no byte read) that catches a cut or missing
 * shard. */
static int ckpt_sizes_whole(const char *dir, const ckpt_manifest_t *m) {
  for (int j = 0; j < m->shards; j++) {
    char path[4096 + CKPT_NAME_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, m->shard[j].name);
    if (lstat(path, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != m->shard[j].bytes)
      return 0;
  }
  return 1;
}

int ckpt_retain(const char *root, int keep) {
  if (keep <= 0) return FSDP_OK;
  DIR *d = opendir(root);
  if (!d) return err_set_errno(err_from_errno(errno), errno, "checkpoints: cannot list %s", root);
  long long *steps = NULL; /* committed ones, a cut one's step negated: -1 - step */
  size_t n = 0, cap = 0;
  int rc = FSDP_OK;
  for (struct dirent *e; (e = readdir(d)) && !rc;) {
    long long step;
    char dir[4096];
    if (!ckpt_step_name(e->d_name, &step)) continue;
    ckpt_step_dir(dir, sizeof dir, root, step);
    ckpt_manifest_t m;
    if (ckpt_manifest_read(dir, &m)) continue; /* only committed ones count, and go */
    const int whole = ckpt_sizes_whole(dir, &m);
    ckpt_manifest_free(&m);
    if (n == cap) {
      long long *p = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
      if (!p) rc = err_set(FSDP_ENOMEM, "checkpoints: out of memory");
      else steps = p;
    }
    if (!rc) steps[n++] = whole ? step : -1 - step;
  }
  closedir(d);
  for (size_t i = 0; !rc && i < n; i++) /* newest first, cut or not */
    for (size_t k = i + 1; k < n; k++)
      if ((steps[k] < 0 ? -1 - steps[k] : steps[k]) > (steps[i] < 0 ? -1 - steps[i] : steps[i])) {
        const long long t = steps[i];
        steps[i] = steps[k], steps[k] = t;
      }
  /* the newest `keep` whole ones stay, and a cut one newer than the last
   * of them (a resume finds it damaged and sets it aside): a damaged
   * checkpoint never takes the place of a whole one */
  int kept = 0;
  for (size_t i = 0; !rc && i < n; i++) {
    if (kept < keep) {
      kept += steps[i] >= 0;
      continue;
    }
    char dir[4096];
    ckpt_step_dir(dir, sizeof dir, root, steps[i] < 0 ? -1 - steps[i] : steps[i]);
    rc = ckpt_remove(dir);
  }
  free(steps);
  return rc;
}

/* ---- leftovers ---------------------------------------------------------------- */

static int64_t ckpt_mtime_ms(const struct stat *st) {
  return (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
}

/* l is left, saying why: 1 (reported). */
static int ckpt_left(ckpt_leftover_t *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int ckpt_left(ckpt_leftover_t *l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(l->why, sizeof l->why, fmt, ap);
  va_end(ap);
  return 1;
}

/* Looks into step directory name of root (rfd) and removes it when it is a
 * leftover (ckpt_sweep): 1 when l says what became of it (removed, or left
 * for something unexpected), 0 when it is left silently (committed, still
 * fresh, gone meanwhile). */
static int ckpt_leftover_take(int rfd, const char *name, int64_t now_ms, int64_t quiet_ms,
                              ckpt_leftover_t *l) {
  struct stat st;
  if (fstatat(rfd, name, &st, AT_SYMLINK_NOFOLLOW))
    return errno == ENOENT ? 0 : ckpt_left(l, "%s: %s", name, strerror(errno));
  if (!S_ISDIR(st.st_mode)) return ckpt_left(l, "%s is not a directory (a link?)", name);
  int64_t newest = ckpt_mtime_ms(&st);
  const int sfd = openat(rfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sfd < 0) return errno == ENOENT ? 0 : ckpt_left(l, "%s: %s", name, strerror(errno));
  DIR *d = fdopendir(sfd);
  if (!d) {
    close(sfd);
    return ckpt_left(l, "%s: %s", name, strerror(errno));
  }
  int committed = 0;
  for (struct dirent *e; !committed && !l->why[0] && (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (!strcmp(e->d_name, CKPT_MANIFEST)) committed = 1; /* never a committed one */
    else if (!ckpt_own_name(e->d_name))
      ckpt_left(l, "%s holds %.64s, which is no name of the checkpoint format", name, e->d_name);
    else if (fstatat(sfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW)) {
      if (errno != ENOENT) ckpt_left(l, "%s/%.64s: %s", name, e->d_name, strerror(errno));
    } else if (!S_ISREG(st.st_mode))
      ckpt_left(l, "%s holds %.64s, which is not a regular file (a link?)", name, e->d_name);
    else {
      if (ckpt_mtime_ms(&st) > newest) newest = ckpt_mtime_ms(&st);
      l->files++, l->bytes += (uint64_t)st.st_size;
    }
  }
  l->age_ms = now_ms - newest;
  if (committed || l->why[0] || l->age_ms < quiet_ms) { /* a clock behind the files: fresh */
    closedir(d);
    return l->why[0] != 0;
  }
  rewinddir(d);
  for (struct dirent *e; !l->why[0] && (e = readdir(d));)
    if (ckpt_own_name(e->d_name) && strcmp(e->d_name, CKPT_MANIFEST) &&
        unlinkat(sfd, e->d_name, 0) && errno != ENOENT)
      ckpt_left(l, "cannot remove %s/%.64s: %s", name, e->d_name, strerror(errno));
  closedir(d);
  if (!l->why[0] && unlinkat(rfd, name, AT_REMOVEDIR) && errno != ENOENT)
    ckpt_left(l, "%s is not empty after its files were removed (something was put there "
              "meanwhile): %s", name, strerror(errno));
  l->removed = !l->why[0];
  return 1;
}

int ckpt_sweep(const char *root, const int64_t *skip, int nskip, int64_t now_ms, int64_t quiet_ms,
               ckpt_leftover_t *out, int max, int *n) {
  *n = 0;
  const int rfd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (rfd < 0 && errno == ENOENT) return FSDP_OK;
  if (rfd < 0)
    return err_set_errno(err_from_errno(errno), errno, "checkpoints: %s cannot be opened as a "
                         "directory (a link is not followed); its leftovers are left", root);
  DIR *d = fdopendir(rfd);
  if (!d) {
    close(rfd);
    return err_set_errno(err_from_errno(errno), errno, "checkpoints: cannot list %s", root);
  }
  int left = 0;
  for (struct dirent *e; *n < max && (e = readdir(d));) {
    long long step;
    int skipped = 0;
    if (!ckpt_step_name(e->d_name, &step)) continue; /* not the format's: not looked at */
    for (int i = 0; i < nskip && !skipped; i++) skipped = skip[i] == step;
    ckpt_leftover_t l = {.step = step};
    if (skipped || !ckpt_leftover_take(rfd, e->d_name, now_ms, quiet_ms, &l)) continue;
    if (!l.removed && left >= max / 2) continue; /* said enough: removals keep their room */
    left += !l.removed;
    out[(*n)++] = l;
  }
  closedir(d);
  return FSDP_OK;
}

/* ---- reading by flat index ---------------------------------------------------- */

#define CKPT_READ_STAGE 65536u /* elements converted at a time */

/* Shard j of a manifest that committed checksum sum and `want` bytes, found
 * with header h in a file of `bytes`: says only what differs. */
static int ckpt_not_committed(const char *path, const ckpt_header_t *h, uint64_t sum,
                              uint64_t bytes, uint64_t want, int j) {
  char what[256] = "";
  size_t n = 0;
  if (h->sum != sum)
    n += (size_t)snprintf(what, sizeof what, "checksum %016" PRIx64 ", committed %016" PRIx64,
                          h->sum, sum);
  if (h->shard_rank != j && n < sizeof what)
    n += (size_t)snprintf(what + n, sizeof what - n, "%sshard %d in the place of shard %d",
                          n ? "; " : "", h->shard_rank, j);
  if (bytes != want && n < sizeof what)
    n += (size_t)snprintf(what + n, sizeof what - n, "%s%" PRIu64 " bytes, committed %" PRIu64,
                          n ? "; " : "", bytes, want);
  else if (bytes != ckpt_file_bytes(h) && n < sizeof what)
    snprintf(what + n, sizeof what - n, "%s%" PRIu64 " bytes, its header implies %" PRIu64,
             n ? "; " : "", bytes, ckpt_file_bytes(h));
  return err_set(FSDP_EFORMAT, "%s: not the shard the manifest committed (%s); the file was "
                 "replaced, truncated or damaged", path, what);
}

static int ckpt_reader_shard(ckpt_reader_t *rd, int j) {
  if (rd->fd[j] >= 0) return FSDP_OK;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", rd->dir, rd->m.shard[j].name);
  int fd, rc = ckpt_open_file(path, &fd);
  if (rc)
    return err_wrap(rc, "checkpoint %s: shard %d; the checkpoint is damaged", rd->dir, j);
  ckpt_header_t *h = &rd->h[j];
  struct stat st;
  rc = ckpt_header_read(fd, path, h);
  if (!rc && fstat(fd, &st)) rc = err_set_errno(FSDP_EIO, errno, "checkpoint: stat %s", path);
  if (!rc && (h->sum != rd->m.shard[j].sum || h->shard_rank != j ||
              (uint64_t)st.st_size != rd->m.shard[j].bytes ||
              (uint64_t)st.st_size != ckpt_file_bytes(h)))
    rc = ckpt_not_committed(path, h, rd->m.shard[j].sum, (uint64_t)st.st_size,
                            rd->m.shard[j].bytes, j);
  /* every index the reader computes comes from these: they must agree with
   * the manifest and with shard 0, whatever the files say */
  if (!rc && (h->shards != rd->m.shards || h->shard_total != rd->m.shard_total ||
              memcmp(&h->model, &rd->m.model, sizeof h->model) || h->step != rd->m.step ||
              h->replicas != rd->m.replicas || h->strategy != rd->m.strategy ||
              h->precision != rd->m.precision || h->min_params != rd->m.min_params ||
              (rd->m.has_seed && h->seed != rd->m.seed) ||
              (j > 0 && !ckpt_header_same_layout(&rd->h[0], h))))
    rc = err_set(FSDP_EFORMAT, "%s: header: its shards, model, step, mesh, precision, wrap policy, "
                 "seed or layout differ from the manifest's or shard 0's; the checkpoint is damaged",
                 path);
  if (rc) {
    ckpt_header_free(h);
    close(fd);
    return rc;
  }
  rd->fd[j] = fd;
  return FSDP_OK;
}

int ckpt_reader_open(ckpt_reader_t *rd, const char *dir) {
  memset(rd, 0, sizeof *rd);
  rd->dir = dir, rd->b_shard = -1;
  int rc = ckpt_manifest_read(dir, &rd->m);
  if (rc) return rc;
  rd->fd = malloc((size_t)rd->m.shards * sizeof *rd->fd);
  rd->h = calloc((size_t)rd->m.shards, sizeof *rd->h);
  rd->block = malloc(CKPT_BLOCK);
  rd->stage = malloc(CKPT_READ_STAGE * sizeof(float));
  if (!rd->fd || !rd->h || !rd->block || !rd->stage) {
    ckpt_reader_close(rd);
    return err_set(FSDP_ENOMEM, "checkpoint: out of memory");
  }
  for (int j = 0; j < rd->m.shards; j++) rd->fd[j] = -1;
  return FSDP_OK;
}

int ckpt_reader_header(ckpt_reader_t *rd, int j) {
  if (j < 0 || j >= rd->m.shards)
    return err_set(FSDP_EINVAL, "checkpoint %s: no shard %d of %d", rd->dir, j, rd->m.shards);
  return ckpt_reader_shard(rd, j);
}

/* Shard 0's header, which holds the layout, and each unit's place in a shard. */
static int ckpt_reader_layout(ckpt_reader_t *rd) {
  int rc = ckpt_reader_shard(rd, 0);
  if (rc) return rc;
  const ckpt_header_t *h0 = &rd->h[0];
  if (!(rd->start = calloc(h0->num_units + 1, sizeof *rd->start)))
    return err_set(FSDP_ENOMEM, "checkpoint: out of memory");
  for (uint32_t k = 0; k < h0->num_units; k++)
    rd->start[k + 1] = rd->start[k] + h0->units[k].shard_numel;
  return FSDP_OK;
}

void ckpt_reader_close(ckpt_reader_t *rd) {
  for (int j = 0; rd->fd && rd->h && j < rd->m.shards; j++)
    if (rd->fd[j] >= 0) close(rd->fd[j]), ckpt_header_free(&rd->h[j]);
  free(rd->fd), free(rd->h), free(rd->block), free(rd->stage), free(rd->start);
  ckpt_manifest_free(&rd->m);
  memset(rd, 0, sizeof *rd);
}

/* n bytes of section sec of shard j from byte off of the section, each block
 * they touch read whole and checked. */
static int ckpt_reader_bytes(ckpt_reader_t *rd, int j, int sec, uint64_t off, size_t n,
                             uint8_t *out) {
  const ckpt_section_t *s = &rd->h[j].sec[sec];
  char path[4096];
  while (n) {
    const uint64_t bi = off / CKPT_BLOCK, bo = off % CKPT_BLOCK;
    if (rd->b_shard != j || rd->b_sec != sec || rd->b_index != bi) {
      const uint64_t at = bi * CKPT_BLOCK;
      const uint64_t len = s->bytes - at < CKPT_BLOCK ? s->bytes - at : CKPT_BLOCK;
      snprintf(path, sizeof path, "%s/%s", rd->dir, rd->m.shard[j].name);
      rd->b_shard = -1;
      int rc = shard_file_io(rd->fd[j], rd->block, len, (off_t)(s->offset + at), 0, j, path);
      if (rc) return err_wrap(rc, "checkpoint: section %s", ckpt_section_name(s->kind));
      if (XXH64(rd->block, len, 0) != s->sums[bi])
        return err_set(FSDP_EFORMAT, "%s: section %s, block %" PRIu64 " (bytes %" PRIu64 "..%"
                       PRIu64 " of the file): checksum mismatch; the shard is damaged and will "
                       "not load", path, ckpt_section_name(s->kind), bi, s->offset + at,
                       s->offset + at + len);
      rd->b_shard = j, rd->b_sec = sec, rd->b_index = bi, rd->b_len = len;
    }
    const size_t c = rd->b_len - bo < n ? (size_t)(rd->b_len - bo) : n;
    memcpy(out, rd->block + bo, c);
    out += c, off += c, n -= c;
  }
  return FSDP_OK;
}

int ckpt_verify(const char *dir) {
  ckpt_reader_t rd;
  int rc = ckpt_reader_open(&rd, dir);
  if (rc) return rc;
  uint8_t *buf = malloc(CKPT_BLOCK);
  if (!buf) rc = err_set(FSDP_ENOMEM, "checkpoint: out of memory");
  for (int j = 0; !rc && j < rd.m.shards; j++) {
    if ((rc = ckpt_reader_shard(&rd, j))) break;
    const ckpt_header_t *h = &rd.h[j];
    for (uint32_t sec = 0; !rc && sec < h->num_sections; sec++)
      for (uint64_t off = 0; !rc && off < h->sec[sec].bytes; off += CKPT_BLOCK) {
        const uint64_t left = h->sec[sec].bytes - off;
        rc = ckpt_reader_bytes(&rd, j, (int)sec, off, left < CKPT_BLOCK ? (size_t)left : CKPT_BLOCK,
                               buf);
      }
  }
  free(buf);
  ckpt_reader_close(&rd);
  return rc;
}

/* n elements of dtype from into dtype to (fp32 <-> bf16 nearest-even). */
static void ckpt_convert(void *dst, uint32_t to, const void *src, uint32_t from, size_t n) {
  if (to == from) {
    memcpy(dst, src, n * ckpt_dtype_bytes(to));
  } else if (to == CKPT_DTYPE_F32) {
    const uint16_t *s = src;
    float *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = kern_bf16_to_f32(s[i]);
  } else {
    const float *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = kern_f32_to_bf16(s[i]);
  }
}

int ckpt_reader_read(ckpt_reader_t *rd, uint32_t kind, uint64_t g, size_t n, void *dst,
                     uint32_t to) {
  int rc = rd->start ? FSDP_OK : ckpt_reader_layout(rd);
  if (rc) return rc;
  const ckpt_header_t *o = &rd->h[0];
  const shard_unit_t *last = &o->units[o->num_units - 1];
  if (g + n > last->offset + last->numel)
    return err_set(FSDP_EINVAL, "checkpoint %s: elements %" PRIu64 "..%" PRIu64 " lie beyond "
                   "its model's %zu", rd->dir, g, g + n, (size_t)(last->offset + last->numel));
  const size_t te = ckpt_dtype_bytes(to);
  if (rd->unit >= o->num_units || o->units[rd->unit].offset > g) rd->unit = 0;
  for (uint64_t end = g + n; g < end;) {
    while (o->units[rd->unit].offset + o->units[rd->unit].numel <= g) rd->unit++; /* they tile */
    const shard_unit_t *u = &o->units[rd->unit];
    const uint64_t within = g - u->offset, e = within % u->shard_numel;
    const int j = (int)(within / u->shard_numel);
    uint64_t c = end - g;
    if (c > u->shard_numel - e) c = u->shard_numel - e;
    if (c > u->offset + u->numel - g) c = u->offset + u->numel - g;
    if (c > CKPT_READ_STAGE) c = CKPT_READ_STAGE;
    if ((rc = ckpt_reader_shard(rd, j))) return rc;
    int sec = 0;
    while (sec < (int)rd->h[j].num_sections && rd->h[j].sec[sec].kind != kind) sec++;
    if (sec == (int)rd->h[j].num_sections)
      return err_set(FSDP_EFORMAT, "checkpoint %s: shard %d has no %s section", rd->dir, j,
                     ckpt_section_name(kind));
    const uint32_t from = rd->h[j].sec[sec].dtype;
    const size_t fe = ckpt_dtype_bytes(from);
    if ((rc = ckpt_reader_bytes(rd, j, sec, (rd->start[rd->unit] + e) * fe, c * fe, rd->stage)))
      return rc;
    ckpt_convert(dst, to, rd->stage, from, c);
    dst = (uint8_t *)dst + c * te;
    g += c;
  }
  return FSDP_OK;
}

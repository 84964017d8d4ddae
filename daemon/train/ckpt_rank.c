/* ckpt_rank: a rank's side of a checkpoint (see ckpt_rank.h). */
#include "ckpt_rank.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "daemon/common/err.h"
#include "daemon/common/log.h"
#include "kernels/kern_math.h"
#include "shard_rank.h"

#define CKPT_WRITE (8u * CKPT_BLOCK) /* bytes per write: large and sequential */
#define CKPT_STAGE 65536u            /* elements converted at a time on load */

/* The device buffer and dtype of each section of this rank's state. */
typedef struct ckpt_bufs {
  uint32_t kind[CKPT_SECTIONS], dtype[CKPT_SECTIONS];
  void *ptr[CKPT_SECTIONS];
} ckpt_bufs_t;

static void ckpt_rank_bufs(const fsdp_state_t *st, ckpt_bufs_t *b) {
  const int bf16_opt = adamw_m(st->opt) == NULL;
  b->kind[0] = CKPT_SEC_PARAMS, b->kind[1] = CKPT_SEC_ADAM_M, b->kind[2] = CKPT_SEC_ADAM_V;
  b->dtype[0] = st->elem_bytes == 2 ? CKPT_DTYPE_BF16 : CKPT_DTYPE_F32;
  b->dtype[1] = b->dtype[2] = bf16_opt ? CKPT_DTYPE_BF16 : CKPT_DTYPE_F32;
  b->ptr[0] = st->params;
  b->ptr[1] = bf16_opt ? (void *)adamw_m_bf16(st->opt) : (void *)adamw_m(st->opt);
  b->ptr[2] = bf16_opt ? (void *)adamw_v_bf16(st->opt) : (void *)adamw_v(st->opt);
}

/* ---- save ------------------------------------------------------------------ */

/* Writes section s from the device buffer src, block checksums on the way. */
static int ckpt_write_section(const kern_backend_t *be, int fd, const char *path, int r,
                              ckpt_section_t *s, const uint8_t *src, uint8_t *stage) {
  for (uint64_t off = 0; off < s->bytes; off += CKPT_WRITE) {
    const size_t n = s->bytes - off < CKPT_WRITE ? (size_t)(s->bytes - off) : CKPT_WRITE;
    const uint8_t *p = src + off;
    if (stage && be) { /* the device's memory is not the host's: one chunk through the stage */
      be->copy_d2h(stage, p, n);
      be->sync();
      p = stage;
    }
    for (size_t b = 0; b < n; b += CKPT_BLOCK)
      s->sums[(off + b) / CKPT_BLOCK] = XXH64(p + b, n - b < CKPT_BLOCK ? n - b : CKPT_BLOCK, 0);
    int rc = shard_file_io(fd, (void *)p, n, (off_t)(s->offset + off), 1, r, path);
    if (rc) return err_wrap(rc, "checkpoint: section %s", ckpt_section_name(s->kind));
  }
  return FSDP_OK;
}

/* img's header for this rank's state, and its sections' device buffers. */
static int ckpt_rank_prepare(fsdp_t *f, const ckpt_rank_meta_t *meta, ckpt_rank_image_t *img) {
  fsdp_state_t st;
  fsdp_state(f, &st);
  const shard_layout_t *l = st.layout;
  memset(img, 0, sizeof *img);
  img->be = st.be;
  ckpt_header_t *h = &img->h;
  h->shard_rank = st.shard_rank, h->shards = l->S, h->replicas = meta->mesh.replicas;
  h->strategy = (int32_t)meta->mesh.strategy, h->precision = (int32_t)meta->precision;
  h->model = *gpt_get_config(fsdp_model(f));
  h->min_params = meta->min_params, h->shard_total = l->shard_total, h->step = meta->step;
  h->data_epoch = meta->data_epoch, h->data_index = meta->data_index;
  h->adam_steps = adamw_step_count(st.opt), h->seed = meta->seed;
  h->num_units = (uint32_t)l->num_units;
  h->num_sections = CKPT_SECTIONS;
  ckpt_bufs_t b;
  ckpt_rank_bufs(&st, &b);
  for (int i = 0; i < CKPT_SECTIONS; i++) {
    h->sec[i] = (ckpt_section_t){b.kind[i], b.dtype[i], 0,
                                 l->shard_total * ckpt_dtype_bytes(b.dtype[i]), NULL};
    img->src[i] = b.ptr[i];
  }
  if (!(h->units = malloc((size_t)l->num_units * sizeof *h->units)))
    return err_set(FSDP_ENOMEM, "checkpoint: out of memory");
  memcpy(h->units, l->units, (size_t)l->num_units * sizeof *h->units);
  return ckpt_header_layout(h);
}

void ckpt_rank_image_free(ckpt_rank_image_t *img) { ckpt_header_free(&img->h); }

void ckpt_rank_writer_priority(void) {
  struct sched_param sp = {0};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp))
    LOG_DEBUG("ckpt", "the checkpoint writer keeps its priority (SCHED_IDLE refused)");
}

size_t ckpt_rank_snapshot_bytes(fsdp_t *f) {
  fsdp_state_t st;
  fsdp_state(f, &st);
  ckpt_bufs_t b;
  ckpt_rank_bufs(&st, &b);
  size_t n = 0;
  for (int i = 0; i < CKPT_SECTIONS; i++) n += st.layout->shard_total * ckpt_dtype_bytes(b.dtype[i]);
  return n;
}

int ckpt_rank_snapshot(fsdp_t *f, const ckpt_rank_meta_t *meta, void *snap, ckpt_rank_image_t *img) {
  int rc = ckpt_rank_prepare(f, meta, img);
  if (rc) {
    ckpt_rank_image_free(img);
    return rc;
  }
  uint8_t *p = snap;
  for (int i = 0; i < CKPT_SECTIONS; i++) { /* one copy per section, device to host */
    img->be->copy_d2h(p, img->src[i], img->h.sec[i].bytes);
    img->src[i] = p;
    p += img->h.sec[i].bytes;
  }
  img->be->sync();
  img->be = NULL; /* the sections are host memory now */
  return FSDP_OK;
}

int ckpt_rank_write(ckpt_rank_image_t *img, const char *root, ckpt_shard_report_t *rep, char *dir,
                    size_t len) {
  ckpt_header_t *h = &img->h;
  ckpt_step_dir(dir, len, root, h->step);
  if (!mkdir(dir, 0755)) {
    int rc = ckpt_fsync_dir(root); /* the new directory survives a crash with what goes in it */
    if (rc) return rc;
  } else if (errno != EEXIST) {
    return err_set_errno(err_from_errno(errno), errno, "checkpoint_dir: cannot create %s; the "
                         "checkpoint directory must exist and be writable", dir);
  }
  char name[CKPT_NAME_MAX], path[4096], tmp[4096];
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST);
  if (!access(path, F_OK)) /* never a file under a manifest that vouches for another */
    return err_set(FSDP_EEXIST, "step %lld is committed already in %s; not written again",
                   (long long)h->step, dir);
  ckpt_shard_name(name, sizeof name, h->shard_rank, h->shards);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%d", dir, name, (int)getpid());
  uint8_t *stage = NULL, *hdr = NULL;
  int fd = -1, rc = FSDP_OK;
  if (img->be && !img->be->host_memory && !(stage = malloc(CKPT_WRITE))) {
    rc = err_set(FSDP_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    rc = err_set_errno(err_from_errno(errno), errno, "checkpoint: cannot create %s", tmp);
    goto out;
  }
  for (int i = 0; !rc && i < CKPT_SECTIONS; i++)
    rc = ckpt_write_section(img->be, fd, tmp, h->shard_rank, &h->sec[i], img->src[i], stage);
  if (!rc && !(rc = ckpt_header_encode(h, &hdr)))
    rc = shard_file_io(fd, hdr, h->header_bytes, 0, 1, h->shard_rank, tmp);
  if (!rc && fsync(fd)) rc = err_set_errno(err_from_errno(errno), errno, "checkpoint: fsync %s", tmp);
  if (close(fd) && !rc) rc = err_set_errno(err_from_errno(errno), errno, "checkpoint: close %s", tmp);
  fd = -1;
  if (!rc && rename(tmp, path))
    rc = err_set_errno(err_from_errno(errno), errno, "checkpoint: rename %s", tmp);
  if (!rc) rc = ckpt_fsync_dir(dir);
  if (!rc) {
    *rep = (ckpt_shard_report_t){h->shard_rank, "", ckpt_file_bytes(h), h->sum};
    snprintf(rep->name, sizeof rep->name, "%s", name);
  }
out:
  if (rc && fd >= 0) close(fd);
  if (rc) unlink(tmp); /* nothing half-written stays, under any name */
  free(hdr);
  free(stage);
  return rc;
}

int ckpt_rank_save(fsdp_t *f, const ckpt_rank_meta_t *meta, const char *root,
                   ckpt_shard_report_t *rep, char *dir, size_t len) {
  ckpt_rank_image_t img;
  int rc = ckpt_rank_prepare(f, meta, &img);
  if (!rc) rc = ckpt_rank_write(&img, root, rep, dir, len);
  ckpt_rank_image_free(&img);
  return rc;
}

/* ---- load ------------------------------------------------------------------- */

/* The old shard files, opened as they are needed, and one block of them
 * read and checked at a time. */
typedef struct ckpt_reader {
  const char *dir;
  ckpt_manifest_t m;
  int *fd;                 /* per old shard; -1 until opened */
  ckpt_header_t *h;        /* per old shard, once opened */
  uint8_t *block;          /* the block read last ... */
  int b_shard, b_sec;      /* ... of this shard and section ... */
  uint64_t b_index, b_len; /* ... and its index and length */
} ckpt_reader_t;

static int ckpt_reader_open(ckpt_reader_t *rd, int j) {
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
    rc = err_set(FSDP_EFORMAT, "%s: not the shard the manifest committed (checksum %016" PRIx64
                 " for %016" PRIx64 ", %lld bytes for %" PRIu64 "); the file was replaced, "
                 "truncated or damaged", path, h->sum, rd->m.shard[j].sum, (long long)st.st_size,
                 rd->m.shard[j].bytes);
  /* every index the loader computes comes from these: they must agree with
   * the manifest and with shard 0, whatever the files say */
  if (!rc && (h->shards != rd->m.shards || h->shard_total != rd->m.shard_total ||
              memcmp(&h->model, &rd->m.model, sizeof h->model) || h->step != rd->m.step ||
              (j > 0 && !ckpt_header_same_layout(&rd->h[0], h))))
    rc = err_set(FSDP_EFORMAT, "%s: header: its shards, model, step or layout differ from the "
                 "manifest's or shard 0's; the checkpoint is damaged", path);
  if (rc) {
    ckpt_header_free(h);
    close(fd);
    return rc;
  }
  rd->fd[j] = fd;
  return FSDP_OK;
}

/* n bytes of section sec of old shard j from byte off of the section, each
 * block they touch read whole and checked. */
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

/* Fills section kind of this rank's shards (dst, of dtype to) from the old
 * shards: every real element it owns under the new layout, by its place in
 * the model's flat buffer. */
static int ckpt_load_section(ckpt_reader_t *rd, const fsdp_state_t *st, int kind, void *dst,
                             uint32_t to, uint8_t *sbuf, uint8_t *dbuf) {
  const shard_layout_t *l = st->layout;
  const ckpt_header_t *o = &rd->h[0];
  const size_t te = ckpt_dtype_bytes(to);
  uint64_t *old_start = calloc(o->num_units + 1, sizeof *old_start); /* unit's place in a shard */
  if (!old_start) return err_set(FSDP_ENOMEM, "checkpoint: out of memory");
  for (uint32_t k = 0; k < o->num_units; k++)
    old_start[k + 1] = old_start[k] + o->units[k].shard_numel;
  int rc = FSDP_OK;
  uint32_t ko = 0;
  size_t new_off = 0;
  for (int k = 0; !rc && k < l->num_units; new_off += l->units[k].shard_numel, k++) {
    size_t begin, real = shard_unit_real(l, st->shard_rank, k, &begin);
    for (uint64_t g = begin, end = begin + real; !rc && g < end;) {
      while (o->units[ko].offset + o->units[ko].numel <= g) ko++; /* the units tile the model */
      const shard_unit_t *u = &o->units[ko];
      const uint64_t within = g - u->offset, e = within % u->shard_numel;
      const int j = (int)(within / u->shard_numel);
      uint64_t n = end - g;
      if (n > u->shard_numel - e) n = u->shard_numel - e;
      if (n > u->offset + u->numel - g) n = u->offset + u->numel - g;
      if (n > CKPT_STAGE) n = CKPT_STAGE;
      int sec = 0;
      if (!(rc = ckpt_reader_open(rd, j))) {
        while (rd->h[j].sec[sec].kind != (uint32_t)kind) sec++;
        const uint32_t from = rd->h[j].sec[sec].dtype;
        const size_t fe = ckpt_dtype_bytes(from);
        rc = ckpt_reader_bytes(rd, j, sec, (old_start[ko] + e) * fe, n * fe, sbuf);
        if (!rc) {
          ckpt_convert(dbuf, to, sbuf, from, n);
          st->be->copy_h2d((uint8_t *)dst + (new_off + (g - begin)) * te, dbuf, n * te);
        }
      }
      g += n;
    }
  }
  free(old_start);
  return rc;
}

int ckpt_rank_load(fsdp_t *f, const char *dir, ckpt_rank_meta_t *meta) {
  ckpt_reader_t rd = {.dir = dir, .b_shard = -1};
  int rc = ckpt_manifest_read(dir, &rd.m);
  if (rc) return rc;
  fsdp_state_t st;
  fsdp_state(f, &st);
  const gpt_config_t *cfg = gpt_get_config(fsdp_model(f));
  uint8_t *sbuf = NULL, *dbuf = NULL;
  if (memcmp(&rd.m.model, cfg, sizeof *cfg)) {
    rc = err_set(FSDP_EINVAL, "resume_from: %s holds a model of layers %d, channels %d, heads %d, "
                 "vocab %d, context %d; this job's has %d, %d, %d, %d, %d: resume with the model "
                 "it was saved with", dir, rd.m.model.layers, rd.m.model.channels,
                 rd.m.model.heads, rd.m.model.vocab, rd.m.model.context, cfg->layers,
                 cfg->channels, cfg->heads, cfg->vocab, cfg->context);
    goto out;
  }
  rd.fd = malloc((size_t)rd.m.shards * sizeof *rd.fd);
  rd.h = calloc((size_t)rd.m.shards, sizeof *rd.h);
  rd.block = malloc(CKPT_BLOCK);
  sbuf = malloc(CKPT_STAGE * 4), dbuf = malloc(CKPT_STAGE * 4);
  if (!rd.fd || !rd.h || !rd.block || !sbuf || !dbuf) {
    rc = err_set(FSDP_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  for (int j = 0; j < rd.m.shards; j++) rd.fd[j] = -1;
  if ((rc = ckpt_reader_open(&rd, 0))) goto out; /* its header holds the old layout */
  if (rd.h[0].step != rd.m.step || rd.h[0].shard_total != rd.m.shard_total) {
    rc = err_set(FSDP_EFORMAT, "checkpoint %s: shard 0 is of step %" PRId64 ", the manifest of %"
                 PRId64 "; the checkpoint is damaged", dir, rd.h[0].step, rd.m.step);
    goto out;
  }
  ckpt_bufs_t b;
  ckpt_rank_bufs(&st, &b);
  for (int i = 0; !rc && i < CKPT_SECTIONS; i++)
    rc = ckpt_load_section(&rd, &st, (int)b.kind[i], b.ptr[i], b.dtype[i], sbuf, dbuf);
  st.be->sync();
  if (rc) goto out;
  const ckpt_header_t *h = &rd.h[0];
  adamw_set_step_count(st.opt, (int)h->adam_steps);
  meta->step = h->step, meta->data_epoch = h->data_epoch, meta->data_index = h->data_index;
  meta->seed = h->seed, meta->min_params = h->min_params, meta->precision = (precision_t)h->precision;
  meta->mesh = (shard_mesh_t){h->replicas, h->shards, (shard_strategy_t)h->strategy};
out:
  for (int j = 0; rd.fd && rd.h && j < rd.m.shards; j++)
    if (rd.fd[j] >= 0) close(rd.fd[j]), ckpt_header_free(&rd.h[j]);
  free(rd.fd), free(rd.h), free(rd.block), free(sbuf), free(dbuf);
  ckpt_manifest_free(&rd.m);
  return rc;
}

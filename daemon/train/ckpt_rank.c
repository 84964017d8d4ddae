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
/* The first of n bytes of dtype at p that is NaN or Inf (its exponent all
 * ones), as an element index, or -1. One pass over what is being hashed
 * anyway, on the writer's thread: a diverged model is never written. */
static int64_t ckpt_first_nonfinite(uint32_t dtype, const uint8_t *p, size_t n) {
  if (dtype == CKPT_DTYPE_F32) {
    const size_t k = n / 4;
    uint32_t w;
    for (size_t i = 0; i < k; i++) {
      memcpy(&w, p + 4 * i, 4);
      if ((w & 0x7f800000u) == 0x7f800000u) return (int64_t)i;
    }
  } else if (dtype == CKPT_DTYPE_BF16) {
    const size_t k = n / 2;
    uint16_t w;
    for (size_t i = 0; i < k; i++) {
      memcpy(&w, p + 2 * i, 2);
      if ((w & 0x7f80u) == 0x7f80u) return (int64_t)i;
    }
  }
  return -1;
}

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
    const int64_t bad = ckpt_first_nonfinite(s->dtype, p, n);
    if (bad >= 0)
      return err_set(FSDP_ERANGE, "checkpoint: section %s holds NaN or Inf (element %lld of this "
                     "rank's shard): training diverged; a diverged model is not written",
                     ckpt_section_name(s->kind),
                     (long long)(off / ckpt_dtype_bytes(s->dtype)) + (long long)bad);
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
  FSDP_ASSERT(meta->sched.batch >= 1 && meta->sched.seq_len >= 1); /* a reader refuses less */
  h->data_epoch = meta->data_epoch, h->data_window = meta->data_window, h->sched = meta->sched;
  h->adam_steps = adamw_step_count(st.opt), h->seed = meta->seed, h->run = meta->run;
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

void *ckpt_rank_snapshot_alloc(fsdp_t *f) {
  const size_t n = ckpt_rank_snapshot_bytes(f);
  void *snap = mem_alloc(MEM_SNAPSHOT, n, "checkpoint snapshot");
  if (!snap) return NULL;
  memset(snap, 0, n);
  fsdp_state_t st;
  fsdp_state(f, &st);
  if (st.be->host_pin && st.be->host_pin(snap, n))
    LOG_WARN("ckpt", "the checkpoint snapshot (%.1f MiB) could not be page-locked: its copy from "
             "the device goes through a staging buffer, slower (the driver refused: is much of "
             "this host's memory locked already?)", (double)n / (1 << 20));
  return snap;
}

void ckpt_rank_snapshot_free(fsdp_t *f, void *snap) {
  if (!snap) return;
  fsdp_state_t st;
  fsdp_state(f, &st);
  if (st.be->host_unpin) st.be->host_unpin(snap);
  mem_free(snap);
}

int ckpt_rank_snapshot(fsdp_t *f, const ckpt_rank_meta_t *meta, void *snap, ckpt_rank_image_t *img) {
  int rc = ckpt_rank_prepare(f, meta, img);
  if (rc) {
    ckpt_rank_image_free(img);
    return rc;
  }
  uint8_t *p = snap;
  const kern_backend_t *be = img->be;
  for (int i = 0; i < CKPT_SECTIONS; i++) { /* one copy per section, device to host */
    const size_t n = img->h.sec[i].bytes;
    if (be->host_memory) {
      /* the step waits for this copy: the rank's threads make it, with
       * non-temporal stores (the writer reads the snapshot later, from memory) */
      const int th = be->get_threads() > 0 ? be->get_threads() : 1;
      const size_t part = (n / (size_t)th + 63) / 64 * 64;
#pragma omp parallel for num_threads(th) schedule(static, 1)
      for (int t = 0; t < th; t++) {
        const size_t at = (size_t)t * part;
        if (at < n)
          be->copy_stream(p + at, (const uint8_t *)img->src[i] + at, n - at < part ? n - at : part);
      }
    } else {
      be->copy_d2h(p, img->src[i], n);
    }
    img->src[i] = p;
    p += n;
  }
  img->be->sync();
  img->be = NULL; /* the sections are host memory now */
  return FSDP_OK;
}

int ckpt_rank_write(ckpt_rank_image_t *img, const char *root, ckpt_shard_report_t *rep, char *dir,
                    size_t len) {
  ckpt_header_t *h = &img->h;
  char name[CKPT_NAME_MAX], path[4096], tmp[4096] = "";
  uint8_t *stage = NULL, *hdr = NULL;
  int fd = -1, rc = FSDP_OK, made = 0;
  ckpt_step_dir(dir, len, root, h->step);
  if (!mkdir(dir, 0755)) {
    made = 1;
    if ((rc = ckpt_fsync_dir(root))) /* the new directory survives a crash with what goes in it */
      goto out;
  } else if (errno != EEXIST) {
    return err_set_errno(err_from_errno(errno), errno, "checkpoint_dir: cannot create %s; the "
                         "checkpoint directory must exist and be writable", dir);
  }
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_MANIFEST);
  if (!access(path, F_OK)) /* never a file under a manifest that vouches for another */
    return err_set(FSDP_EEXIST, "step %lld is committed already in %s; not written again",
                   (long long)h->step, dir);
  ckpt_shard_name(name, sizeof name, h->shard_rank, h->shards);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%d", dir, name, (int)getpid());
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
  if (rc && tmp[0]) unlink(tmp); /* nothing half-written stays, under any name */
  /* nor the step directory this rank made, when nothing else is in it (a
   * peer's shard keeps it: rmdir removes only an empty one) */
  if (rc && made) rmdir(dir);
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

/* Fills section kind of this rank's shards (dst, of dtype to) from the
 * checkpoint: every real element it owns under the new layout, by its place
 * in the model's flat buffer, through one host stage of CKPT_STAGE elements. */
static int ckpt_load_section(ckpt_reader_t *rd, const fsdp_state_t *st, uint32_t kind, void *dst,
                             uint32_t to, uint8_t *stage) {
  const shard_layout_t *l = st->layout;
  const size_t te = ckpt_dtype_bytes(to);
  int rc = FSDP_OK;
  size_t new_off = 0;
  for (int k = 0; !rc && k < l->num_units; new_off += l->units[k].shard_numel, k++) {
    size_t begin, real = shard_unit_real(l, st->shard_rank, k, &begin);
    for (size_t i = 0, n; !rc && i < real; i += n) {
      n = real - i < CKPT_STAGE ? real - i : CKPT_STAGE;
      rc = ckpt_reader_read(rd, kind, begin + i, n, stage, to);
      if (!rc) st->be->copy_h2d((uint8_t *)dst + (new_off + i) * te, stage, n * te);
    }
  }
  return rc;
}

int ckpt_rank_load(fsdp_t *f, const char *dir, const ckpt_want_t *want, ckpt_rank_meta_t *meta) {
  ckpt_reader_t rd;
  int rc = ckpt_reader_open(&rd, dir);
  if (rc) return rc;
  fsdp_state_t st;
  fsdp_state(f, &st);
  uint8_t *stage = NULL;
  /* the manifest against shard 0's header before against the job: a
   * manifest damaged there is damaged (a resume falls back past it), not a
   * checkpoint of another model (a refusal). The seed is the header's, which
   * an older manifest does not record (and a newer one's agrees with) */
  if ((rc = ckpt_reader_header(&rd, 0))) goto out;
  rd.m.seed = rd.h[0].seed, rd.m.has_seed = 1;
  if ((rc = ckpt_resume_check(&rd.m, dir, want))) goto out;
  if (!(stage = malloc(CKPT_STAGE * sizeof(float)))) {
    rc = err_set(FSDP_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  ckpt_bufs_t b;
  ckpt_rank_bufs(&st, &b);
  for (int i = 0; !rc && i < CKPT_SECTIONS; i++)
    rc = ckpt_load_section(&rd, &st, b.kind[i], b.ptr[i], b.dtype[i], stage);
  st.be->sync();
  if (rc) goto out;
  const ckpt_header_t *h = &rd.h[0];
  adamw_set_step_count(st.opt, (int)h->adam_steps);
  meta->step = h->step, meta->data_epoch = h->data_epoch, meta->data_window = h->data_window;
  meta->sched = h->sched;
  meta->seed = h->seed, meta->min_params = h->min_params, meta->precision = (precision_t)h->precision;
  meta->mesh = (shard_mesh_t){h->replicas, h->shards, (shard_strategy_t)h->strategy};
out:
  free(stage);
  ckpt_reader_close(&rd);
  return rc;
}

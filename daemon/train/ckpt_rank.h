/* ckpt_rank: a rank's side of a checkpoint (the format is daemon/job/ckpt.h).
 *
 * Save: the rank writes its shard file (parameters, AdamW m and v as they are
 * stored, the step, the data position) under a temporary name with large
 * sequential writes straight from its shard buffers (a device whose memory the
 * host cannot address goes through one block of host stage), fsyncs it,
 * renames it and fsyncs the directory. No collective is involved: a rank that
 * never arrives makes nobody wait. What it reports (path, bytes, checksum)
 * is what a committer checks.
 *
 * Load: from a committed checkpoint under any mesh, strategy and precision
 * policy: for each unit, the rank reads from the old shard files only the
 * blocks holding its own elements, checks each block's checksum, converts
 * fp32 <-> bf16 as its policy stores them, and restores the step, the data
 * position and AdamW's step count. */
#ifndef FSDP_CKPT_RANK_H
#define FSDP_CKPT_RANK_H

#include <stdint.h>

#include "daemon/job/ckpt.h"
#include "daemon/job/precision.h"
#include "daemon/job/shard.h"
#include "fsdp.h"

/* The run's state that goes with the shards. */
typedef struct ckpt_rank_meta {
  int64_t step;
  uint64_t data_epoch, data_window, seed; /* data_window as ckpt_header_t's */
  ckpt_sched_t sched;                      /* load: 0s from a version 1 or 2 checkpoint */
  shard_mesh_t mesh;
  precision_t precision;
  uint64_t min_params;
  uint64_t run;      /* the run whose ranks write (train.c: drawn by rank 0 at open) */
} ckpt_rank_meta_t;

/* Writes this rank's shard of the checkpoint of meta->step under root (the
 * step directory is made when missing), from its buffers: the caller waits.
 * *rep gets what to report; dir (len bytes) the step directory. A shard not
 * written leaves nothing: no file under any name, nor the step directory
 * when this call made it and nothing else is in it (rmdir). */
int ckpt_rank_save(fsdp_t *f, const ckpt_rank_meta_t *meta, const char *root,
                   ckpt_shard_report_t *rep, char *dir, size_t len);

/* A shard ready to be written: its header and where each section's bytes
 * are (a device's buffers, or a host snapshot). */
typedef struct ckpt_rank_image {
  ckpt_header_t h;
  const void *src[CKPT_SECTIONS];
  const kern_backend_t *be; /* the device the sections are on; NULL: host memory */
} ckpt_rank_image_t;
/* Host bytes a snapshot of this rank's shard takes (parameters, m and v). */
size_t ckpt_rank_snapshot_bytes(fsdp_t *f);
/* The host memory (MEM_SNAPSHOT) an asynchronous checkpoint is written
 * from, of ckpt_rank_snapshot_bytes: touched now (the first checkpoint does
 * not pay its page faults mid-run) and, on a device that copies to the host
 * by DMA, page-locked (kern_backend_t.host_pin), so the step's copy runs at
 * the bus's speed. NULL when memory is short. Free with
 * ckpt_rank_snapshot_free, on the same runtime. */
void *ckpt_rank_snapshot_alloc(fsdp_t *f);
void ckpt_rank_snapshot_free(fsdp_t *f, void *snap);
/* Asynchronous checkpoints: copies this rank's state into snap (of
 * ckpt_rank_snapshot_bytes) and prepares img to be written from it; the
 * runtime may train on at once. */
int ckpt_rank_snapshot(fsdp_t *f, const ckpt_rank_meta_t *meta, void *snap, ckpt_rank_image_t *img);
/* Writes img under root as ckpt_rank_save does; it touches nothing of the
 * runtime, so a thread of its own may run it. */
int ckpt_rank_write(ckpt_rank_image_t *img, const char *root, ckpt_shard_report_t *rep, char *dir,
                    size_t len);
void ckpt_rank_image_free(ckpt_rank_image_t *img);
/* Called first on a writer thread: it runs only on CPU time training leaves
 * (SCHED_IDLE), so the write never slows the steps by taking a core. */
void ckpt_rank_writer_priority(void);
/* Loads the committed checkpoint in dir into f's shards and optimizer; meta
 * gets its step, data position and seed. First, before a byte of data is
 * read, the checkpoint must be one the job want can resume
 * (ckpt_resume_check: its model, seed and steps; FSDP_EINVAL naming them),
 * the rules the coordinator checks a submit by too. */
int ckpt_rank_load(fsdp_t *f, const char *dir, const ckpt_want_t *want, ckpt_rank_meta_t *meta);

#endif

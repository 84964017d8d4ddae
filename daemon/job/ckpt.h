/* ckpt: the checkpoint format, what every side of a checkpoint agrees on
 * without the engine: a shard file's header (encoded, decoded, checked), the
 * names inside a checkpoint directory, the manifest that commits one, and
 * finding the latest committed checkpoint. docs/FORMATS.md is the format's
 * reference; this file is its one implementation.
 *
 * A checkpoint of step N is a directory ROOT/step-<N, 8 digits> holding one
 * shard file per shard rank of the first replica (shard-<j>-of-<S>.fsdp) and,
 * once committed, manifest.json. Only a directory whose manifest exists and
 * checks is committed; nothing else is ever loaded. A shard file is a header
 * (magic, version, the model, the unit layout, the training state, the
 * section table and a checksum of every block of every section, then a
 * checksum of the header itself) followed by its sections (parameters, AdamW
 * m, AdamW v), each starting on a CKPT_ALIGN boundary. Checksums are XXH64
 * (libxxhash): a block's covers CKPT_BLOCK bytes of its section (the last
 * block fewer), so a rank that reads only its byte ranges still checks every
 * byte it reads; the header's covers the block checksums, so it stands for
 * the whole file and is what the manifest records per shard.
 *
 * Pure: it links daemon/common, libxxhash and jansson (the manifest), and
 * the coordinator commits with it. The rank side (writing a shard from the
 * runtime's buffers, loading one under any mesh) is daemon/train/ckpt_rank.h. */
#ifndef FSDP_CKPT_H
#define FSDP_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/job/gpt_config.h"
#include "daemon/job/shard.h"

#define CKPT_MAGIC "FSDPSHRD"
#define CKPT_VERSION 4 /* of the shard header (versions 1, without run, 2, without the
                          schedule, whose data position counts batches, and 3, without the
                          token file, are read too) */
#define CKPT_MANIFEST_VERSION 1
#define CKPT_ALIGN 4096u             /* sections start on this boundary */
#define CKPT_BLOCK (1u << 20)        /* bytes per block checksum */
#define CKPT_HEADER_MAX (64u << 20)  /* a larger header is refused as damaged */
#define CKPT_MANIFEST "manifest.json"
/* The file in a checkpoint_dir whose flock the run writing there holds
 * (daemon/train/train.c, train_lock_dir): one run per directory. */
#define CKPT_LOCK ".fsdp-train.lock"
#define CKPT_NAME_MAX 64

typedef enum { CKPT_DTYPE_F32 = 1, CKPT_DTYPE_BF16 = 2 } ckpt_dtype_t;
typedef enum { CKPT_SEC_PARAMS = 1, CKPT_SEC_ADAM_M = 2, CKPT_SEC_ADAM_V = 3 } ckpt_sec_kind_t;
#define CKPT_SECTIONS 3

/* Bytes per element of a dtype (0: not a dtype). */
size_t ckpt_dtype_bytes(uint32_t dtype);
/* "params", "adam_m", "adam_v": for messages. */
const char *ckpt_section_name(uint32_t kind);

typedef struct ckpt_section {
  uint32_t kind, dtype;
  uint64_t offset;  /* in the file; a multiple of CKPT_ALIGN */
  uint64_t bytes;   /* shard_total elements of dtype */
  uint64_t *sums;   /* XXH64 of each CKPT_BLOCK of the section (ckpt_blocks(bytes) of them) */
} ckpt_section_t;

/* What the data position and the learning rate depend on besides the step:
 * the run's options that wrote the checkpoint (version 3; all 0 in a version
 * 1 or 2 shard: unknown) and the token file it read (version 4; 0s before).
 * A resume under other values says what changed. */
typedef struct ckpt_sched {
  int32_t batch;                /* global batch B: windows a data batch takes (batch x ranks) */
  int32_t seq_len;              /* T: tokens a window's order is over */
  int32_t steps, warmup_steps;  /* the LR schedule (train_lr) */
  float lr, min_lr_frac;
  uint64_t data_tokens;         /* the token file's tokens (data_num_tokens); 0: unknown */
  uint64_t data_train_tokens;   /* those of its training split (the rest held out) */
  uint64_t data_sum;            /* XXH64 of its token bytes (data_sum) */
} ckpt_sched_t;

/* What a shard file says about itself. */
typedef struct ckpt_header {
  uint32_t version;
  int32_t shard_rank, shards, replicas; /* j of S; R of the mesh that wrote it */
  int32_t strategy, precision;          /* shard_strategy_t, precision_t of the writer */
  gpt_config_t model;
  uint64_t min_params;                  /* the wrap policy */
  uint64_t shard_total;                 /* elements per section */
  int64_t step;                         /* optimizer steps done */
  uint64_t data_epoch;                  /* where the next batch starts (data.h's data_pos_t): */
  uint64_t data_window;                 /* windows of the epoch's order read (version 3);
                                           batches of an unknown global batch (versions 1, 2) */
  int64_t adam_steps;                   /* AdamW's step count (its bias correction) */
  uint64_t seed;
  uint64_t run;                         /* the run (launch, attempt) whose ranks wrote it, all
                                           alike; 0: unknown (version 1) */
  ckpt_sched_t sched;                   /* version 3; 0s before */
  uint32_t num_units;
  shard_unit_t *units;                  /* the layout (shard.h), in order */
  uint32_t num_sections;
  ckpt_section_t sec[CKPT_SECTIONS];
  uint64_t header_bytes;                /* encoded length, the checksum included */
  uint64_t sum;                         /* XXH64 of the header: the file's checksum */
} ckpt_header_t;

/* Blocks of a section of that many bytes. */
uint64_t ckpt_blocks(uint64_t bytes);
/* Lays out h's sections after its header (offsets, aligned) and allocates
 * their checksum arrays; h->units and every other field set. */
int ckpt_header_layout(ckpt_header_t *h);
/* Encodes h (its sums filled) into a malloc'd buffer of h->header_bytes,
 * setting h->sum. */
int ckpt_header_encode(ckpt_header_t *h, uint8_t **out);
/* Decodes and checks n bytes that begin with a header (at least the whole
 * header): magic, version, lengths, the layout's arithmetic, the section
 * table and the header checksum. The error names what (path) and the field.
 * Free with ckpt_header_free. */
int ckpt_header_decode(const uint8_t *p, size_t n, const char *what, ckpt_header_t *h);
/* Reads and decodes the header of the shard file fd (path for messages). */
int ckpt_header_read(int fd, const char *path, ckpt_header_t *h);
void ckpt_header_free(ckpt_header_t *h);
/* The file size a header implies (its last section's end). */
uint64_t ckpt_file_bytes(const ckpt_header_t *h);

/* fsync of a directory: a rename in it made durable. */
int ckpt_fsync_dir(const char *dir);

/* Opens a file of a checkpoint for reading: a regular file only (no link
 * followed, no FIFO waited on); the error names path. */
int ckpt_open_file(const char *path, int *fd);
/* 1 when two shards' headers belong to one checkpoint: step, shards, model,
 * precision, data position, schedule, AdamW steps, seed, units and section dtypes. */
int ckpt_header_same_layout(const ckpt_header_t *a, const ckpt_header_t *b);

/* Names inside a checkpoint root. */
void ckpt_step_dir(char *buf, size_t len, const char *root, int64_t step);
void ckpt_shard_name(char *buf, size_t len, int shard_rank, int shards);

/* One shard as committed: what its rank reported. */
typedef struct ckpt_shard_report {
  int shard_rank;
  char name[CKPT_NAME_MAX]; /* within the step directory */
  uint64_t bytes;
  uint64_t sum;             /* the header checksum */
} ckpt_shard_report_t;

/* A committed checkpoint, as its manifest says. */
typedef struct ckpt_manifest {
  int64_t step;
  int shards, replicas, strategy, precision;
  gpt_config_t model;
  uint64_t min_params, shard_total;
  uint64_t seed;              /* the run's seed, as its shards' headers have it ... */
  int has_seed;               /* ... when the manifest records it (0: one written before) */
  ckpt_shard_report_t *shard; /* shards of them, by shard rank */
} ckpt_manifest_t;

/* Commits the checkpoint in dir: checks that shards shard files are there,
 * each with the header its report gives (when reports is NULL, the headers
 * read are taken as the reports, and each must be of run, the committing
 * rank's own: a shard of another run is FSDP_ENOENT, as if missing), all of
 * one step and layout, then writes
 * the manifest (temporary name, fsync, rename, fsync of dir). Idempotent:
 * committing a committed directory again finds the same manifest there and
 * writes nothing. A failure removes only a manifest this call wrote: one
 * that was there already (an earlier commit's) is left as it was. */
int ckpt_commit(const char *dir, int shards, const ckpt_shard_report_t *reports, uint64_t run);
/* Reads and checks dir's manifest (absent: FSDP_ENOENT, "not committed"). */
int ckpt_manifest_read(const char *dir, ckpt_manifest_t *m);
/* The same, refusing unread a manifest over max bytes (FSDP_ELIMIT, naming
 * its size and max): what the coordinator parses at a submit is bounded by
 * what the job's model could need (job_manifest_max). */
int ckpt_manifest_read_max(const char *dir, uint64_t max, ckpt_manifest_t *m);
/* The same from a manifest's text (len bytes; path for messages). */
int ckpt_manifest_parse(const char *text, size_t len, const char *path, ckpt_manifest_t *m);
void ckpt_manifest_free(ckpt_manifest_t *m);
/* What a job that resumes from a checkpoint must share with it: the
 * rules a resume is refused by, in one place, which the ranks apply as they
 * load (daemon/train: ckpt_rank_load, the seed taken from shard 0's header)
 * and the coordinator at submit from the manifest alone (job_resume_check),
 * in the same words. */
typedef struct ckpt_want {
  gpt_config_t model; /* the job's */
  uint64_t seed;
  int steps;
  int own;            /* 1: the checkpoint is the latest of the job's own checkpoint_dir, which
                         auto_resume goes on from (the fix may be a directory of its own) */
} ckpt_want_t;
/* FSDP_OK when the checkpoint committed in dir (its manifest m) can be
 * resumed by the job want: of its model, trained with its seed (where m
 * records one: has_seed) and at a step not past its steps. Else
 * FSDP_EINVAL naming dir, both values and the fix; the caller puts the
 * field in front (err_wrap: "resume_from", "checkpoint_dir (auto_resume)"). */
int ckpt_resume_check(const ckpt_manifest_t *m, const char *dir, const ckpt_want_t *want);

/* Where a job starts, which the ranks' rank 0 decides (daemon/train) and the
 * coordinator checks at submit (job_resume_check): one rule for both. */
typedef enum {
  CKPT_FROM_NONE,        /* from scratch (init_from, or a seed) */
  CKPT_FROM_GIVEN,       /* resume_from itself, a committed checkpoint */
  CKPT_FROM_UNDER_GIVEN, /* the latest committed step below resume_from */
  CKPT_FROM_UNDER_OWN,   /* the latest committed step of checkpoint_dir (auto_resume) */
} ckpt_from_t;
/* The checkpoint a job of resume_from, checkpoint_dir and auto_resume (""
 * and 0: not set) starts from: *from and its *step (0 for none). resume_from
 * must hold a committed checkpoint (FSDP_ENOENT, "resume_from: ... holds no
 * committed checkpoint" when not); checkpoint_dir with auto_resume may hold
 * none (a fresh start). A checkpoint_dir holding a later step than that
 * one is gone on from with auto_resume (a restarted or requeued job), and
 * refused without it (FSDP_EEXIST: those steps would not be written, and a
 * restart would go on from the other run). Manifests read are bounded by
 * max bytes (FSDP_ELIMIT over it: the coordinator's job_manifest_max; the
 * ranks pass CKPT_HEADER_MAX). Errors name the field first. */
int ckpt_resume_choose(const char *resume_from, const char *checkpoint_dir, int auto_resume,
                       uint64_t max, ckpt_from_t *from, int64_t *step);
/* Checks m, read from dir, against what committed it: its step, its shard
 * count and each shard's size and checksum (reports, shards of them, by
 * shard rank: the commit's). FSDP_EFORMAT naming dir and the field, with
 * both values, when one differs: the directory holds other files than
 * those committed (replaced, or copied from another checkpoint). */
int ckpt_manifest_check(const ckpt_manifest_t *m, const char *dir, int64_t step, int shards,
                        const ckpt_shard_report_t *reports);
/* The committed checkpoint of root with the highest step: its directory in
 * buf. FSDP_ENOENT when there is none. When root itself is a committed
 * checkpoint, that is it; when root's own manifest is damaged, that error
 * (FSDP_EFORMAT, naming manifest.json and the field). */
int ckpt_latest(const char *root, char *buf, size_t len);
/* The same, root's own manifest read only up to max bytes (FSDP_ELIMIT). */
int ckpt_latest_max(const char *root, uint64_t max, char *buf, size_t len);
/* The same among root's steps below `below` (root's own manifest aside):
 * the one to fall back to when a later one is damaged. A step directory
 * counts when a manifest is there, whole or not: one that does not read
 * fails its load as a damaged shard does (ckpt_reader_open), rather than
 * being passed over unsaid; root's own manifest damaged is that error. */
int ckpt_latest_below(const char *root, long long below, char *buf, size_t len);
/* The committed steps of root (step directories holding a manifest, as
 * ckpt_latest_below counts them): the highest cap of them, ascending, in
 * steps (as many as there are, when fewer), and in *total how many there
 * are; for a message that names what there is. */
int ckpt_steps(const char *root, int64_t *steps, int cap, int *total);
/* 1 when dir's last name is a step directory's (step-<N, 8 digits>), N in
 * *step; 0 otherwise. A manifest in such a directory must be of step N. */
int ckpt_dir_step(const char *dir, int64_t *step);

/* Reading a committed checkpoint by the model's flat indices, whatever mesh
 * wrote it: the shard files are opened as they are needed, each checked
 * against the manifest and shard 0 (checksum, size, model, step, layout), and
 * every byte comes from a block read whole and checked against its XXH64, so
 * a damaged byte is refused naming the file, the section and the block. Any
 * range can be read: a loading rank reads only its own elements, an export
 * reads a whole unit. Pure (no engine): the coordinator exports with it. */
typedef struct ckpt_reader {
  const char *dir;          /* the caller's: kept while the reader is open */
  ckpt_manifest_t m;
  int *fd;                  /* per shard; -1 until opened */
  ckpt_header_t *h;         /* per shard, once opened */
  uint64_t *start;          /* unit k's first element within a shard */
  uint32_t unit;            /* the unit the last read ended in (a cursor) */
  uint8_t *block;           /* the block read last ... */
  int b_shard, b_sec;       /* ... of this shard and section ... */
  uint64_t b_index, b_len;  /* ... and its index and length */
  uint8_t *stage;           /* stored bytes being converted */
} ckpt_reader_t;
/* Opens the committed checkpoint in dir: reads its manifest (rd->m), and
 * nothing else until the first read. */
int ckpt_reader_open(ckpt_reader_t *rd, const char *dir);
/* n elements of section kind (CKPT_SEC_*), from the model's flat index g on,
 * into dst as dtype to (fp32 <-> bf16 round to nearest even). */
int ckpt_reader_read(ckpt_reader_t *rd, uint32_t kind, uint64_t g, size_t n, void *dst,
                     uint32_t to);
void ckpt_reader_close(ckpt_reader_t *rd);
/* Opens shard j of the checkpoint and checks its header (rd->h[j]) against
 * the manifest and shard 0, as its first read would: a manifest whose
 * fields its shards contradict is damaged (FSDP_EFORMAT), whatever a caller
 * would compare those fields with next. */
int ckpt_reader_header(ckpt_reader_t *rd, int j);
/* Checks the committed checkpoint in dir whole, as a load would: its
 * manifest, every shard's header against it and shard 0, and every block of
 * every section against its XXH64. FSDP_EFORMAT or FSDP_ENOENT name what is
 * damaged or missing; other codes are the reader's (EIO, EACCES). */
int ckpt_verify(const char *dir);

/* Removes the checkpoint in dir: its manifest first (so it is no longer
 * committed), an fsync of dir (so that stays true after a power loss; when
 * it fails the shards are kept and the error says so), then its shard
 * files and temporary ones, then dir. Only the
 * format's own names are deleted; a directory holding anything else is left
 * with that, and said. */
int ckpt_remove(const char *dir);
/* ckpt_remove of a checkpoint that did not commit (a shard not written):
 * one holding a manifest is committed after all (a shard whose rank failed
 * past its rename) and is left whole, FSDP_EEXIST. */
int ckpt_remove_aborted(const char *dir);
/* Keeps the newest keep committed checkpoints of root and removes the older
 * committed ones (keep <= 0: keeps all). The latest committed is never
 * removed; uncommitted directories are not touched. One whose shard is
 * missing or not of the size its manifest says (a cheap look, no byte
 * read) is not counted among those kept. */
int ckpt_retain(const char *root, int keep);

/* Moves the checkpoint in dir, found damaged, out of its step's name to
 * dir.damaged (dir.damaged-2, ... when that is taken; never over anything),
 * then fsyncs its parent: nothing of it is lost, and its step can be
 * written and committed again, since a name the format does not give is
 * never loaded, retained, swept or written into. The new name in to.
 * Whoever found it damaged calls this once: a second mover finds dir gone
 * (FSDP_ENOENT). A link is not moved. */
int ckpt_set_aside(const char *dir, char *to, size_t len);

/* A step directory ckpt_sweep removed, or left saying why. */
typedef struct ckpt_leftover {
  int64_t step;
  int removed;    /* 1: gone; 0: left (why) */
  int files;      /* removed: the files it held ... */
  uint64_t bytes; /* ... and their bytes */
  int64_t age_ms; /* since it or a file in it last changed (mtime) */
  char why[320];
} ckpt_leftover_t;

/* Removes root's leftover step directories, those no checkpoint will come
 * of (a save cut short, a shard never reported): a name the format gives
 * (step-<N, 8 digits>), a step not in skip (the caller's: the checkpoints it
 * knows committed or still to be), no manifest, nothing in it but regular
 * files of the format's names (shards and temporary names), and neither it
 * nor any of them modified within quiet_ms before now_ms (unix ms). Its
 * files go, then the directory. No link is followed: root must be a
 * directory itself, and everything is opened and removed relative to it.
 * Other names in root are not the format's and are not looked at; a step
 * directory that is committed or still fresh is left silently. Each one
 * removed, and each one left for something unexpected in it (a step name
 * that is not a directory, a name or a file of another kind inside, an
 * error), goes to out: at most max of them, and the sweep stops there,
 * of which at most max / 2 left ones (those past it are passed over
 * unsaid, so that a few odd directories never keep leftovers from going);
 * *n says how many. A root that is gone is swept (nothing there). */
int ckpt_sweep(const char *root, const int64_t *skip, int nskip, int64_t now_ms, int64_t quiet_ms,
               ckpt_leftover_t *out, int max, int *n);

#endif

/* mem: the accounting allocator. Every byte the training path allocates goes
 * through here with a category, so the peak a run reports is measured, not
 * estimated, and a planner's estimate can be checked against it. It serves
 * host memory itself and counts device memory that a kernel backend
 * allocates (mem_dev_alloc); the communication layer counts its own mappings
 * (mem_account).
 *
 * Blocks are 64-byte aligned. Counters are process-wide and atomic. */
#ifndef FSDP_MEM_H
#define FSDP_MEM_H

#include <stddef.h>
#include <stdio.h>

/* XX(enum suffix, printed name). host_offload is state kept in host memory
 * off the device (offloaded master weights, gradients and AdamW state); on
 * CPU devices it is the same memory, counted apart so a plan for a GPU can
 * tell device bytes from host bytes. ckpt_snapshot is the host copy of the
 * shard an asynchronous checkpoint is written from while training goes on. */
#define MEM_CATEGORY_LIST(XX)          \
  XX(PARAMS, "params")                 \
  XX(PARAMS_GATHERED, "params_gathered") \
  XX(GRADS, "grads")                   \
  XX(OPTIM, "optimizer")               \
  XX(ACTS, "activations")              \
  XX(COMM, "comm")                     \
  XX(WORKSPACE, "workspace")            \
  XX(OFFLOAD, "host_offload")          \
  XX(SNAPSHOT, "ckpt_snapshot")

typedef enum {
#define XX(e, s) MEM_##e,
  MEM_CATEGORY_LIST(XX)
#undef XX
  MEM__COUNT
} mem_cat_t;

/* Returns NULL (with err_set(FSDP_ENOMEM, ...) naming what and how much) on failure.
 * what names the allocation in that message ("activations for B=4 T=256"). */
void *mem_alloc(mem_cat_t cat, size_t bytes, const char *what);
/* Same, zero-filled. */
void *mem_calloc(mem_cat_t cat, size_t bytes, const char *what);
void mem_free(void *p);

/* Memory on the device of a kernel backend (kernels/kern.h), counted in cat
 * like host memory: host memory itself when the backend computes on host
 * memory (be->host_memory: mem_alloc), else the backend's dev_alloc. NULL with
 * err_set(FSDP_ENOMEM, ...) on failure. Free with mem_dev_free on the same
 * backend. mem_dev_calloc zeroes through the backend (dev_set). */
struct kern_backend;
void *mem_dev_alloc(const struct kern_backend *be, mem_cat_t cat, size_t bytes, const char *what);
void *mem_dev_calloc(const struct kern_backend *be, mem_cat_t cat, size_t bytes, const char *what);
/* The same for a buffer that lives within one training step (the backend's
 * dev_alloc_step: see kernels/kern.h); mem_dev_free frees either kind. */
void *mem_dev_alloc_step(const struct kern_backend *be, mem_cat_t cat, size_t bytes,
                         const char *what);
void mem_dev_free(const struct kern_backend *be, void *p);
/* Counts memory held outside this allocator (a shared-memory mapping) in cat:
 * held 1 when it is mapped, 0 with the same bytes when it is released. */
void mem_account(mem_cat_t cat, size_t bytes, int held);

size_t mem_current(mem_cat_t cat);
size_t mem_peak(mem_cat_t cat);
size_t mem_total_current(void);
size_t mem_total_peak(void);
const char *mem_cat_name(mem_cat_t cat);
/* Starts a step: its peaks restart from what is held now. */
void mem_step_begin(void);
/* Starts a run: the run's peaks (and the step's) restart from what is held
 * now; for a rank forked from a process that already allocated, whose
 * counters it inherits. */
void mem_run_begin(void);

/* What is held now and the peaks, per category and in total. */
typedef struct mem_snapshot {
  size_t cur[MEM__COUNT], peak[MEM__COUNT];
  size_t total_cur, total_peak;
} mem_snapshot_t;
/* The peaks since mem_step_begin (step 1), or over the run (step 0). */
void mem_snapshot(mem_snapshot_t *s, int step);
/* One line: "<prefix> params=cur/peak grads=cur/peak ... total=cur/peak MiB
 * (current/peak)": every category whose peak is not zero. */
void mem_snapshot_print(FILE *out, const char *prefix, const mem_snapshot_t *s);
/* Peak resident set of this process (VmHWM), in bytes; 0 if unknown. It
 * includes the file-backed pages of the program and its libraries' code. */
size_t mem_process_peak_rss(void);
/* Resident anonymous memory now (RssAnon: heap, mmaps, stacks; the process's
 * own data, without library code), in bytes; 0 if unknown. */
size_t mem_process_anon_rss(void);

#endif

/* job: admission of a training job, what the coordinator runs at submit
 * before anything is stored or scheduled. It owns no state: it checks a job
 * given as key/value options (the keys of the INI job file and of
 * fsdp-train's flags) on a world size, resolves it exactly as fsdp-train
 * does (config_finish), plans its memory against the smallest device it
 * could land on, and puts every path it names inside the roots the operator
 * allows. It links daemon/job and daemon/common only, as the coordinator
 * does (test_job's link line proves it).
 *
 * Errors are FSDP_EINVAL (a field that is wrong), FSDP_ENOMEM (the plan does
 * not fit) or FSDP_ENOENT (a file or directory that is not there), each
 * with a message naming the field and the fix. */
#ifndef FSDP_JOB_H
#define FSDP_JOB_H

#include <stddef.h>

#include "daemon/job/config.h"
#include "daemon/job/plan.h"

/* One option of a job: key = value, optionally under its section. */
typedef struct job_opt {
  const char *section; /* NULL or "": any; else the key's own section ([model], [shard], ...) */
  const char *key;
  const char *value;
} job_opt_t;

/* Checks and resolves the job of n options on world ranks. Every problem is
 * collected, one line each in err_msg() (as many as fit in a message; the
 * last line then says how many more): unknown keys, keys under another
 * section, bad values, the model (unknown preset, heads not dividing
 * channels...), a missing data file name, seq_len above the context,
 * warmup_steps above steps, strategy, mesh against world, precision. When
 * those hold and device_bytes is not 0, the memory plan must fit in
 * device_bytes (or in memory_limit_mib when the job sets less): the refusal
 * gives the plan's numbers and the single change that makes it fit; a
 * recompute left to the device is raised, and an asynchronous checkpoint
 * turned off, where that makes it fit (plan_fit_recompute,
 * plan_fit_snapshot: *out says so).
 * FSDP_OK: *out is the resolved job (what fsdp-train would run) and *plan
 * its plan per rank (zeroed when device_bytes is 0); else the first
 * problem's code. */
int job_validate(const job_opt_t *opts, int n, int world, size_t device_bytes, config_t *out,
                 plan_t *plan);

/* Puts every path of c (data, init_from, save) inside one of nroots
 * directories, rewriting each to the absolute path it resolves to, with no
 * symlink, "." or ".." left in it: the path the ranks are given is exactly
 * the one checked. A relative path is taken against roots[0]. Refused,
 * naming the field, the path and the roots: a path that resolves (through
 * "..", or a symlink anywhere in it) outside every root; an input (data,
 * init_from) that does not exist, is not a regular file or cannot be opened
 * for reading by this process; an output (save) whose directory does not
 * exist, or that is a symlink or not a regular file. A root that does not
 * exist, or no root at all, is the operator's error (FSDP_EINVAL, "roots").
 * Then save must be a file apart from the ones the run reads
 * (job_save_apart).
 *
 * Assumptions: the nodes see the same file system paths as the caller (a
 * shared file system), and this process's permissions stand for the ranks';
 * fsdpd runs the same check as the ranks' user before it starts them.
 * What remains after the check (TOCTOU): someone who can write inside a
 * root can replace a checked directory or file with a symlink between the
 * check and the rank's open. Only the opens themselves can close that
 * (openat2 with RESOLVE_BENEATH from a descriptor of the root, or
 * O_NOFOLLOW on each component); the ranks do not do that yet. */
int job_paths_check(config_t *c, const char *const *roots, int nroots);
/* The same check for one absolute path that must exist (a directory or
 * file the coordinator reads, such as a checkpoint's step directory): res
 * (PATH_MAX) gets what it resolves to, no symlink left in it. A path that
 * does not exist is FSDP_ENOENT; one that resolves outside every root is
 * FSDP_EINVAL naming key, the path, what it resolves to and the roots, then
 * fix (what to do). */
int job_path_in_roots(const char *key, const char *path, const char *const *roots, int nroots,
                      const char *fix, char *res);
/* save is not a file the run reads: not data (the weights written at the
 * end would replace the token file), not init_from (nor the weights it
 * starts from, which a restarted run would then start from trained). The
 * same file by device and inode where both exist (a hard link too), else by
 * name (file_same). FSDP_EINVAL naming both options and the fix. The ranks
 * check at their start (fsdp-train, fsdp-launch), the coordinator at submit
 * (job_paths_check). */
int job_save_apart(const config_t *c);

/* What a submit parses is bounded by what the job's model could need, so
 * a file named at submit costs the coordinator a fraction of a second and
 * tens of MB at most (a 99 MiB safetensors header of nested arrays took
 * 29 s and 2.6 GB to parse; the format allows 100 MiB, a manifest 64 MiB).
 * A safetensors header: an entry per tensor of the model and per buffer
 * Hugging Face's files add (two a layer), JOB_HEADER_ENTRY bytes each
 * (GPT-2's longest, pretty-printed, is under 300), and JOB_HEADER_BASE for
 * __metadata__ and padding: 342 KiB for GPT-2 (the header of its file on
 * the Hub is about 15 KB).
 * A manifest: an entry per shard of the largest job (JOB_SHARDS_MAX, the
 * wire's world_size bound) and per model unit (layers + 1), at most
 * JOB_MANIFEST_ENTRY bytes each as ckpt_commit writes them with every
 * number at 20 digits (about 190), and JOB_MANIFEST_BASE for the rest
 * (under 1 KiB): 1.0 MiB for GPT-2, 2.0 MiB at the 4096 layers a model may
 * have. */
#define JOB_HEADER_BASE (256u << 10)
#define JOB_HEADER_ENTRY 512u
#define JOB_MANIFEST_BASE (16u << 10)
#define JOB_MANIFEST_ENTRY 256u
#define JOB_SHARDS_MAX 4096
uint64_t job_header_max(const gpt_config_t *model);
uint64_t job_manifest_max(const gpt_config_t *model);

/* A safetensors init_from (after job_paths_check and the model's
 * resolution): its header checked against the job's model, so a file of
 * another model, or one whose header lies, is refused at submit naming the
 * tensor, never at launch; a header over job_header_max is refused unread,
 * naming its size and the limit. Any other file passes (the ranks check a
 * weights file's header). */
int job_init_from_check(const config_t *c);
/* The checkpoint the job's ranks would resume from (after job_paths_check
 * and the model's resolution): resume_from's, or with auto_resume
 * checkpoint_dir's latest (ckpt_resume_choose, the ranks' own rule), is
 * checked against the job from its manifest alone, by the rules its ranks
 * check it by as they load (ckpt_resume_check: the model, the seed where
 * the manifest records it, a step not past steps), so a job that could
 * only fail at its ranks' start is refused at submit, in their words after
 * the field ("resume_from", "checkpoint_dir (auto_resume)"). Refused too, as
 * the ranks would: a resume_from holding no committed checkpoint (yet), or
 * whose own manifest is damaged; a checkpoint_dir holding later steps than
 * the job starts at with auto_resume = 0; a damaged latest step with none
 * committed before it to fall back to. A manifest over job_manifest_max is
 * refused unread, naming its size and the limit. Passes: no checkpoint in
 * checkpoint_dir (a fresh start), a damaged latest step with one before it
 * (the ranks fall back and check that one), what this process cannot read
 * (the ranks' permissions are theirs to say), and every difference a
 * resume takes (world size, strategy, precision, batch, schedule). Every
 * refusal is FSDP_EINVAL. */
int job_resume_check(const config_t *c);
/* The value in c of the path option key (data, init_from, save,
 * checkpoint_dir, resume_from: what job_paths_check resolved), NULL for a
 * key that is no path: one list of a job's paths. */
const char *job_path_value(const config_t *c, const char *key);

/* fsdp-train's exit status when it stopped on SIGTERM at a step boundary
 * (after trying a checkpoint of that step when the job has a
 * checkpoint_dir): the coordinator requeues the job instead of counting a
 * failure (EX_TEMPFAIL). It does not say the checkpoint committed (a full
 * disk): the rank's last line says which step a resume goes on from. */
#define JOB_EXIT_PREEMPTED 75
/* fsdp-train's exit status when its node's lease ended (the coordinator
 * silent past the fence it gave fsdpd: daemon/train/report.c): fsdpd reports
 * such an exit as fenced (ReportRankExitRequest.fenced), not as a failure. */
#define JOB_EXIT_FENCED 3
/* The environment variable a rank's supervisor (fsdp-launch, fsdpd: their
 * daemon/node/supervise.c) sets to its pid; fsdp-train then ends with it
 * (PR_SET_PDEATHSIG). */
#define JOB_SUPERVISOR_PID_ENV "FSDP_SUPERVISOR_PID"

#endif

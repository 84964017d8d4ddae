/* report: a rank's report channel to its node daemon. When fsdpd starts a
 * rank it hands it one end of a socket as FSDP_REPORT_FD; after every step
 * the rank writes there one fsdp.v1.RankStatus (proto/fsdp.proto: rank,
 * state RUNNING, step, loss, tokens/s, memory by mem.h's categories: what
 * is held now and the run's peaks),
 * framed by daemon/common/frame.h. fsdpd relays the latest in its
 * heartbeats. The job fields (job id, attempt, device, node) are fsdpd's to
 * fill: the rank does not know them.
 *
 * Reports never stop training: a daemon that closed its end (or refused a
 * frame) ends the reports with one line on stderr, and the run goes on.
 * This is the one file of fsdp-train that knows the wire's messages; it
 * links the generated proto code and protobuf-c, never gRPC. */
#ifndef FSDP_REPORT_H
#define FSDP_REPORT_H

#include "daemon/job/job.h"
#include "daemon/train/train.h"

/* The exit status of a rank that ended itself at the end of its node's
 * lease (fsdpd sends RankLease frames on the channel; a thread reads them). */
#define REPORT_EXIT_FENCED JOB_EXIT_FENCED

typedef struct report report_t;

/* The channel FSDP_REPORT_FD names, or *out = NULL when it is unset. A value
 * that is not an open descriptor is an error naming the variable. On a
 * socket, a thread then reads the node's leases from it: once the clock
 * passes the latest, the process ends at once (REPORT_EXIT_FENCED). */
int report_open_from_env(report_t **out);
/* train_metrics_cb: one frame per step, and the final one after the run
 * (train_hooks_t.finished) (ctx is the report_t). */
void report_metrics(void *ctx, const train_metrics_t *m);
/* train_ckpt_cb: a frame saying which shard was written (path, bytes, its
 * header checksum as "xxh64:<hex>"), or that it was not and why (`failed`,
 * at most 400 bytes of UTF-8), for fsdpd to relay to the coordinator, which
 * commits, or aborts the checkpoint of a shard not written. */
int report_checkpoint(void *ctx, const train_ckpt_t *k);
/* Closes the descriptor; NULL is a no-op. */
void report_close(report_t *r);

#endif

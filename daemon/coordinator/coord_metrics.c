/* coord_metrics: what the coordinator's /metrics shows (daemon/common/metrics.h
 * serves it; this renders on the loop's thread). Names are fsdp_*, in base
 * units (seconds, bytes), counters ending in _total; docs/OPERATIONS.md
 * lists them.
 *   - jobs by state (the store), nodes alive and dead (this coordinator's
 *     view: a node not heard since it started is neither);
 *   - per rank of a running attempt, its latest report: step, loss,
 *     tokens/s, memory by category (current and peak bytes);
 *   - heartbeat lateness (a held heartbeat answered after its interval) and
 *     scheduling latency (submit to the first attempt's placement) as
 *     histograms; checkpoint commits and aborts and restarts as counters. */
#include <inttypes.h>
#include <stdio.h>

#include "daemon/coordinator/coord_impl.h"

void coord_metrics_render(metrics_buf_t *b, void *arg) {
  coord_t *c = arg;
  int64_t jobs[STORE_JOB_CANCELLED + 1];
  if (!store_job_counts(c->st, jobs)) {
    metrics_family(b, "fsdp_jobs", "gauge", "Jobs by state.");
    for (int s = 0; s <= STORE_JOB_CANCELLED; s++)
      metrics_sample(b, "fsdp_jobs", (const char *[]){"state", store_job_state_name(s), NULL},
                     (double)jobs[s]);
  }
  int alive = 0, dead = 0;
  for (int64_t i = 0; i < c->cap_node; i++) {
    const coord_node_t *n = c->node[i];
    if (!n || !n->session) continue;
    if (n->dead) dead++;
    else alive++;
  }
  metrics_family(b, "fsdp_nodes", "gauge", "Nodes registered since this coordinator started, "
                 "by state.");
  metrics_sample(b, "fsdp_nodes", (const char *[]){"state", "alive", NULL}, alive);
  metrics_sample(b, "fsdp_nodes", (const char *[]){"state", "dead", NULL}, dead);

  static const struct {
    const char *name, *help;
  } per_rank[] = {
      {"fsdp_rank_step", "Optimizer steps a rank has done, from its latest report."},
      {"fsdp_rank_loss", "A rank's training loss at its latest step."},
      {"fsdp_rank_tokens_per_second", "A rank's training throughput, tokens per second."},
  };
  for (int f = 0; f < 3; f++) {
    metrics_family(b, per_rank[f].name, "gauge", per_rank[f].help);
    for (int i = 0; i < c->n_rank; i++) {
      const coord_rank_t *r = &c->rank[i];
      char job[32], rank[16];
      coord_id_str(job, sizeof job, 'j', r->job);
      snprintf(rank, sizeof rank, "%d", r->rank);
      const double v = f == 0 ? (double)r->step : f == 1 ? r->loss : r->tokens_per_s;
      metrics_sample(b, per_rank[f].name, (const char *[]){"job", job, "rank", rank, NULL}, v);
    }
  }
  static const char *const mem[2][2] = {
      {"fsdp_rank_memory_bytes", "A rank's memory by category, now."},
      {"fsdp_rank_memory_peak_bytes", "A rank's memory by category, at its peak."}};
  for (int f = 0; f < 2; f++) {
    metrics_family(b, mem[f][0], "gauge", mem[f][1]);
    for (int i = 0; i < c->n_rank; i++) {
      const coord_rank_t *r = &c->rank[i];
      char job[32], rank[16];
      coord_id_str(job, sizeof job, 'j', r->job);
      snprintf(rank, sizeof rank, "%d", r->rank);
      for (int k = 0; k < r->ncat; k++)
        metrics_sample(b, mem[f][0],
                       (const char *[]){"job", job, "rank", rank, "category", r->cat[k], NULL},
                       (double)(f ? r->peak[k] : r->cur[k]));
    }
  }
  metrics_hist_write(b, "fsdp_heartbeat_lateness_seconds",
                     "How late held heartbeats were answered after their interval.", &c->hb_late);
  metrics_hist_write(b, "fsdp_scheduling_latency_seconds",
                     "From a job's submit to its first attempt's placement.", &c->sched);
  static const struct {
    const char *name, *help;
  } counters[] = {
      {"fsdp_checkpoint_commits_total", "Checkpoints committed."},
      {"fsdp_checkpoint_aborts_total", "Checkpoints aborted (a shard missing or bad)."},
      {"fsdp_job_restarts_total", "Attempts started after a job's first."},
  };
  const uint64_t v[] = {c->ckpt_commits, c->ckpt_aborts, c->restarts};
  for (int f = 0; f < 3; f++) {
    metrics_family(b, counters[f].name, "counter", counters[f].help);
    metrics_sample(b, counters[f].name, NULL, (double)v[f]);
  }
}

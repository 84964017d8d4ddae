/* coord_metrics: what the coordinator's /metrics shows (daemon/common/metrics.h
 * serves it; this renders on the loop's thread). Names are fsdp_*, in base
 * units (seconds, bytes), counters ending in _total; docs/OPERATIONS.md
 * lists them.
 *   - jobs by state (the store), nodes alive and dead (this coordinator's
 *     view: a node not heard since it started is neither), nodes drained
 *     (the store); jobs whose facts are kept in memory;
 *   - per rank of a running attempt (the store's), its latest report: step, loss,
 *     tokens/s, memory by category (current and peak bytes);
 *   - heartbeat lateness (a held heartbeat answered after its interval),
 *     scheduling latency (submit to the first attempt's placement) and
 *     checkpoint commit latency (last shard report to commit) as histograms;
 *     attempts ended by outcome, checkpoint commits and aborts, leftover
 *     step directories removed, restarts,
 *     failures of the database, calls refused for their token and the
 *     time the loop was held up (coord_tick_cb) as counters. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/coordinator/coord_impl.h"

/* Whether attempt epoch of job runs: run holds the running jobs, by id. */
static int coord_metrics_running(const store_job_t *run, int n, int64_t job, int64_t epoch) {
  for (int lo = 0, hi = n; lo < hi;) {
    const int mid = lo + (hi - lo) / 2;
    if (run[mid].id == job) return run[mid].epoch == epoch;
    if (run[mid].id < job) lo = mid + 1;
    else hi = mid;
  }
  return 0;
}

void coord_metrics_render(metrics_buf_t *b, void *arg) {
  coord_t *c = arg;
  int64_t jobs[STORE_JOB_CANCELLED + 1];
  if (!store_job_counts(c->st, jobs)) {
    metrics_family(b, "fsdp_jobs", "gauge", "Jobs by state.");
    for (int s = 0; s <= STORE_JOB_CANCELLED; s++)
      metrics_sample(b, "fsdp_jobs", (const char *[]){"state", store_job_state_name(s), NULL},
                     (double)jobs[s]);
  }
  metrics_family(b, "fsdp_jobs_in_memory", "gauge", "Jobs whose facts the coordinator keeps in "
                 "memory: every pending and running one, and at most " COORD_STR(COORD_JOBS_KEPT) " others.");
  metrics_sample(b, "fsdp_jobs_in_memory", NULL, (double)HASH_COUNT(c->jobs));
  int alive = 0, stopping = 0, stopped = 0, dead = 0;
  for (int64_t i = 0; i < c->cap_node; i++) {
    const coord_node_t *n = c->node[i];
    if (!n) continue;
    if (n->dead) n->stopped ? stopped++ : dead++; /* either cleared its session */
    else if (n->session) n->stopping ? stopping++ : alive++;
  }
  metrics_family(b, "fsdp_nodes", "gauge", "Nodes registered since this coordinator started, "
                 "by state: alive, stopping (its fsdpd is shutting down), stopped (its fsdpd "
                 "stopped and said so), dead (silent past the heartbeat timeout).");
  metrics_sample(b, "fsdp_nodes", (const char *[]){"state", "alive", NULL}, alive);
  metrics_sample(b, "fsdp_nodes", (const char *[]){"state", "stopping", NULL}, stopping);
  metrics_sample(b, "fsdp_nodes", (const char *[]){"state", "stopped", NULL}, stopped);
  metrics_sample(b, "fsdp_nodes", (const char *[]){"state", "dead", NULL}, dead);
  const int64_t drained = store_nodes_drained(c->st);
  if (drained >= 0) {
    metrics_family(b, "fsdp_nodes_drained", "gauge", "Nodes drained by an operator (fsdpctl "
                   "drain): no new ranks go there.");
    metrics_sample(b, "fsdp_nodes_drained", NULL, (double)drained);
  }

  /* the ranks of running attempts only: a report stays in memory after its
   * job ended (fsdpctl status shows it), but a series of an ended job would
   * repeat its last value for ever, one more set with every job (a store
   * that cannot say which run shows none: the rest of the page still helps) */
  store_job_t *run = NULL;
  int nrun = 0;
  if (store_job_list(c->st, STORE_JOB_BIT(STORE_JOB_RUNNING), 0, 0, &run, &nrun)) run = NULL, nrun = 0;
  const int nr = (int)HASH_COUNT(c->ranks);
  metrics_rank_t *r = calloc((size_t)nr + 1, sizeof *r);
  const char **cats = calloc((size_t)nr * COORD_CATS + 1, sizeof *cats);
  if (!r || !cats) {
    b->failed = 1;
  } else {
    int i = 0;
    for (const coord_rank_t *x = c->ranks; x; x = x->hh.next) {
      if (!coord_metrics_running(run, nrun, x->job, x->epoch)) continue;
      coord_id_str(r[i].job, sizeof r[i].job, 'j', x->job);
      r[i].rank = x->rank, r[i].step = (double)x->step, r[i].loss = x->loss;
      r[i].unreported = !x->reported;
      r[i].tokens_per_s = x->tokens_per_s, r[i].ncat = x->ncat;
      for (int k = 0; k < x->ncat; k++) cats[i * COORD_CATS + k] = x->cat[k];
      r[i].cat = &cats[i * COORD_CATS], r[i].cur = x->cur, r[i].peak = x->peak;
      i++;
    }
    metrics_ranks_write(b, r, i);
  }
  free(r), free(cats);
  store_jobs_free(run, nrun);
  metrics_hist_write(b, "fsdp_heartbeat_lateness_seconds",
                     "How late held heartbeats were answered after their interval.", &c->hb_late);
  metrics_hist_write(b, "fsdp_scheduling_latency_seconds",
                     "From a job's submit to its first attempt's placement.", &c->sched);
  metrics_hist_write(b, "fsdp_placement_pass_seconds",
                     "A placement pass over the pending jobs (the coordinator answers nothing "
                     "meanwhile).", &c->pass);
  metrics_hist_write(b, "fsdp_checkpoint_commit_seconds",
                     "From a checkpoint's last shard report to its commit (shard headers "
                     "checked, manifest written and synced, the database's transaction).",
                     &c->commit);
  metrics_family(b, "fsdp_coordinator_stalled_seconds_total", "counter",
                 "Time the coordinator's loop was held up (a database write waiting on its "
                 "disk or a lock): no call was read meanwhile, and it counts toward no node's "
                 "heartbeat timeout.");
  metrics_sample(b, "fsdp_coordinator_stalled_seconds_total", NULL, (double)c->deaf_ms / 1000);
  static const char *const ended[COORD_ENDED_N] = {"succeeded", "failed", "preempted", "cancelled"};
  uint64_t unauth, denied;
  rpc_server_refusals(c->srv, &unauth, &denied);
  metrics_family(b, "fsdp_rpc_refused_total", "counter",
                 "Calls refused for their token: unauthenticated (none, or one this coordinator "
                 "does not take, an expired service account token among them) and "
                 "permission_denied (a role's token on a method not its own).");
  metrics_sample(b, "fsdp_rpc_refused_total", (const char *[]){"reason", "unauthenticated", NULL},
                 (double)unauth);
  metrics_sample(b, "fsdp_rpc_refused_total", (const char *[]){"reason", "permission_denied", NULL},
                 (double)denied);
  metrics_family(b, "fsdp_attempts_ended_total", "counter",
                 "Attempts ended, by outcome: succeeded, failed (a rank failed or was lost; the "
                 "job restarts or fails by its max_restarts), preempted (requeued), cancelled.");
  for (int k = 0; k < COORD_ENDED_N; k++)
    metrics_sample(b, "fsdp_attempts_ended_total", (const char *[]){"outcome", ended[k], NULL},
                   (double)c->ended[k]);
  static const struct {
    const char *name, *help;
  } counters[] = {
      {"fsdp_checkpoint_commits_total", "Checkpoints committed."},
      {"fsdp_checkpoint_aborts_total", "Checkpoints aborted (a shard bad, or missing at the timeout or at its attempt's end)."},
      {"fsdp_checkpoint_leftovers_removed_total", "Leftover step directories removed (not "
       "committed, no checkpoint of the store's, left alone for the quiet period)."},
      {"fsdp_checkpoint_aborted_removed_total", "Aborted checkpoints whose files were removed: "
       "while their attempt ran, once each of their shards was reported written or not, or once "
       "no attempt of the job ran."},
      {"fsdp_job_restarts_total", "Attempts started after a job's first."},
      {"fsdp_nodes_declared_dead_total", "Nodes declared dead (silent past the heartbeat "
       "timeout, or not back within the restart grace; not a node whose fsdpd stopped and said "
       "so); fsdp_nodes{state=\"dead\"} falls as one registers again, this does not."},
      {"fsdp_store_errors_total", "Operations on the state database that failed (a full disk, "
       "an I/O error, a damaged file, a lock held elsewhere); the log says which."},
  };
  const uint64_t v[] = {c->ckpt_commits, c->ckpt_aborts, c->ckpt_leftovers,
                        c->ckpt_aborted_removed, c->restarts, c->nodes_died,
                        store_errors(c->st)};
  for (size_t f = 0; f < sizeof v / sizeof *v; f++) {
    metrics_family(b, counters[f].name, "counter", counters[f].help);
    metrics_sample(b, counters[f].name, NULL, (double)v[f]);
  }
}

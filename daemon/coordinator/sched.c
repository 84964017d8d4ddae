/* sched: gang placement with shard groups kept inside nodes (see sched.h).
 *
 * All shard groups have S ranks, so placing them whole is bin packing with
 * equal items: at most sum over nodes of floor(free / S) groups fit whole, and
 * best fit (the node with the fewest free devices that still holds a group)
 * reaches that count while leaving the larger holes to larger jobs. A group
 * that cannot be whole spans two nodes where a pair holds it (the pair
 * leaving the least over), else takes the devices left from the nodes with
 * the most free first. Nodes the job avoids
 * (where it failed) come after every other in both orders: with equal items
 * the count of whole groups does not depend on which node takes each. */
#include "sched.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"

/* Appends to a bounded sentence; what does not fit is cut, never overflows. */
static void sched_say(char *s, size_t len, const char *fmt, ...) {
  size_t at = strnlen(s, len);
  if (at + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s + at, len - at, fmt, ap);
  va_end(ap);
}

static int sched_usable(const sched_node_t *nodes, const sched_device_t *d, const sched_job_t *job) {
  return !d->held && nodes[d->node].alive && !nodes[d->node].drained &&
         strcmp(d->kind, job->kind) == 0 &&
         d->memory >= job->need;
}

/* Why the job waits: what it needs, and where the devices are. */
static void sched_why(const sched_node_t *nodes, int num_nodes, const sched_device_t *devices,
                      int num_devices, const sched_job_t *job, const int *avail, int total,
                      char *note, size_t len) {
  int held = 0, small = 0, dead = 0, stopped = 0, drained = 0, other = 0;
  for (int i = 0; i < num_devices; i++) {
    const sched_device_t *d = &devices[i];
    if (strcmp(d->kind, job->kind) != 0) other++;
    else if (!nodes[d->node].alive) nodes[d->node].stopped ? stopped++ : dead++;
    else if (nodes[d->node].drained) drained++;
    else if (d->memory < job->need) small++;
    else if (d->held) held++;
  }
  note[0] = '\0';
  sched_say(note, len, "waiting for %d free %s devices with at least %.0f MiB each: %d free",
            job->replicas * job->shards, job->kind, (double)job->need / (1 << 20), total);
  if (total) {
    const char *sep = " (";
    for (int n = 0; n < num_nodes; n++)
      if (avail[n]) sched_say(note, len, "%s%s %d", sep, nodes[n].name, avail[n]), sep = ", ";
    sched_say(note, len, ")");
  }
  if (held) sched_say(note, len, "; %d held by running jobs", held);
  if (small) sched_say(note, len, "; %d with too little memory", small);
  if (dead) sched_say(note, len, "; %d on dead nodes", dead);
  if (stopped) sched_say(note, len, "; %d on nodes stopping or stopped", stopped);
  if (drained) sched_say(note, len, "; %d on drained nodes", drained);
  if (other) sched_say(note, len, "; %d of another kind", other);
  /* devices it could ever have, were every running job done and every
   * drained node back: fewer than it needs, and it waits for new nodes */
  const int ever = total + held + drained, need = job->replicas * job->shards;
  if (ever >= need)
    return;
  if (ever + stopped >= need) /* a planned stop: not a reason to resubmit smaller */
    sched_say(note, len, "; it starts once the nodes stopping or stopped come back (or nodes "
              "are added)");
  else if (!ever)
    sched_say(note, len, "; no live node has such devices: it starts once nodes with them "
              "register (or come back)");
  else
    sched_say(note, len, "; the cluster has %d such devices in all, on its live nodes: it starts "
              "only once nodes are added (or cancel it and submit at most %d ranks)", ever, ever);
}

/* Whether node a comes before node b: one the job does not avoid first, then
 * the one it failed on longest ago, then fewer free devices (best fit), or
 * more (spanning: most_first). */
static int sched_before(const sched_job_t *job, const int *avail, int a, int b, int most_first) {
  const int va = job->avoid ? job->avoid[a] : 0, vb = job->avoid ? job->avoid[b] : 0;
  if (va != vb) return va < vb;
  return most_first ? avail[a] > avail[b] : avail[a] < avail[b];
}

/* The two nodes a group of S that fits no node whole spans, as few as it
 * can: a pair holding S between them, the pair the job avoids least, then
 * the one leaving the least over (the larger holes stay for whole groups
 * of later jobs); 0 when no pair holds S, when the only pairs take a node
 * the job avoids while the others hold S between them (more nodes, but
 * none it failed on), or on a cluster past SCHED_PAIR_NODES (the search is
 * quadratic, and runs on the coordinator's loop). Found by an outside
 * tester: most free first spread a group over three nodes where two held it. */
#define SCHED_PAIR_NODES 512
static int sched_pair(const sched_job_t *job, const int *avail, int num_nodes, int S, int *a, int *b) {
  if (num_nodes > SCHED_PAIR_NODES) return 0;
  int best_av = -1, best_waste = 0;
  for (int i = 0; i < num_nodes; i++)
    for (int j = i + 1; j < num_nodes; j++) {
      if (!avail[i] || !avail[j] || avail[i] + avail[j] < S) continue;
      const int vi = job->avoid ? job->avoid[i] : 0, vj = job->avoid ? job->avoid[j] : 0;
      const int av = vi > vj ? vi : vj, waste = avail[i] + avail[j] - S;
      if (best_av < 0 || av < best_av || (av == best_av && waste < best_waste))
        best_av = av, best_waste = waste, *a = avail[i] >= avail[j] ? i : j, *b = *a == i ? j : i;
    }
  if (best_av > 0) { /* the nodes it does not avoid, all together */
    int clean = 0;
    for (int n = 0; n < num_nodes; n++) clean += job->avoid[n] ? 0 : avail[n];
    if (clean >= S) return 0;
  }
  return best_av >= 0;
}

/* Takes k usable devices of node n for ranks first.., lowest device index first. */
static void sched_take(const sched_node_t *nodes, const sched_device_t *devices, int num_devices,
                       const sched_job_t *job, char *taken, int n, int k, sched_slot_t *slot) {
  for (int r = 0; r < k; r++) {
    int best = -1;
    for (int i = 0; i < num_devices; i++)
      if (devices[i].node == n && !taken[i] && sched_usable(nodes, &devices[i], job) &&
          (best < 0 || devices[i].index < devices[best].index))
        best = i;
    taken[best] = 1; /* the caller counted k usable devices there */
    slot[r].device = best;
  }
}

int sched_place(const sched_node_t *nodes, int num_nodes, const sched_device_t *devices,
                int num_devices, const sched_job_t *job, sched_slot_t *slot, char *note,
                size_t len) {
  const int R = job->replicas, S = job->shards;
  if (R < 1 || S < 1)
    return err_set(FSDP_EINVAL, "sched: mesh %dx%d: both sides must be at least 1", R, S);
  note[0] = '\0';
  int *avail = calloc((size_t)num_nodes + 1, sizeof *avail);
  char *taken = calloc((size_t)num_devices + 1, 1);
  if (!avail || !taken) {
    free(avail), free(taken);
    return err_set(FSDP_ENOMEM, "sched: out of memory placing %d ranks", R * S);
  }
  int total = 0;
  for (int i = 0; i < num_devices; i++)
    if (sched_usable(nodes, &devices[i], job)) avail[devices[i].node]++, total++;
  if (total < R * S) {
    sched_why(nodes, num_nodes, devices, num_devices, job, avail, total, note, len);
    free(avail), free(taken);
    return SCHED_WAIT;
  }
  for (int g = 0; g < R; g++) {
    sched_slot_t *group = slot + (size_t)g * S;
    int best = -1;
    for (int n = 0; n < num_nodes; n++)
      if (avail[n] >= S && (best < 0 || sched_before(job, avail, n, best, 0))) best = n;
    if (best >= 0) {
      sched_take(nodes, devices, num_devices, job, taken, best, S, group);
      avail[best] -= S;
      continue;
    }
    sched_say(note, len, "%sshard group %d (ranks %d-%d) spans nodes", *note ? "; " : "", g,
              g * S, g * S + S - 1);
    int pa = -1, pb = -1;
    const int paired = sched_pair(job, avail, num_nodes, S, &pa, &pb);
    for (int got = 0; got < S;) { /* the count above leaves enough usable devices */
      int most = -1;
      if (paired) most = got ? pb : pa; /* the larger first */
      for (int n = 0; !paired && n < num_nodes; n++)
        if (avail[n] && (most < 0 || sched_before(job, avail, n, most, 1))) most = n;
      int k = avail[most] < S - got ? avail[most] : S - got;
      sched_take(nodes, devices, num_devices, job, taken, most, k, group + got);
      avail[most] -= k, got += k;
      sched_say(note, len, "%s%s", got == k ? " " : ", ", nodes[most].name);
    }
    sched_say(note, len, ": no node has %d free devices", S);
  }
  free(avail), free(taken);
  return SCHED_PLACED;
}

/* test_sched: gang placement (daemon/coordinator/sched.c). Small clusters
 * written out by hand for the rules a user sees (groups inside nodes, the
 * reason a job waits), and random clusters checked against the rules
 * themselves: every slot a distinct usable device, and as many shard groups
 * whole as the free devices allow (sum of floor(free / S)), counted here
 * independently of the placement. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/coordinator/sched.h"
#include "tests/unit/testutil.h"

#define MIB ((uint64_t)1 << 20)
enum { MAXN = 8, MAXD = 64 };

typedef struct {
  sched_node_t node[MAXN];
  sched_device_t dev[MAXD];
  char name[MAXN][16];
  int nn, nd;
} cluster_t;

/* Node n with k devices of kind and memory (MiB), none held. */
static void add_node(cluster_t *c, int k, const char *kind, uint64_t mib) {
  int n = c->nn++;
  snprintf(c->name[n], sizeof c->name[n], "node%d", n);
  c->node[n] = (sched_node_t){100 + n, c->name[n], 1, 0, 0};
  for (int i = 0; i < k; i++)
    c->dev[c->nd] = (sched_device_t){1000 + c->nd, n, i, kind, mib * MIB, 0}, c->nd++;
}

/* avoid: per node, or NULL */
static int place_avoiding(cluster_t *c, int R, int S, const char *kind, uint64_t need_mib,
                          const char *avoid, sched_slot_t *slot, char *note, size_t len) {
  sched_job_t j = {R, S, kind, need_mib * MIB, avoid};
  return sched_place(c->node, c->nn, c->dev, c->nd, &j, slot, note, len);
}

static int place(cluster_t *c, int R, int S, const char *kind, uint64_t need_mib,
                 sched_slot_t *slot, char *note, size_t len) {
  return place_avoiding(c, R, S, kind, need_mib, NULL, slot, note, len);
}

static void hold(cluster_t *c, const sched_slot_t *slot, int n) {
  for (int r = 0; r < n; r++) c->dev[slot[r].device].held = 1;
}

/* The node of each rank's device. */
static int node_of(const cluster_t *c, const sched_slot_t *slot, int r) {
  return c->dev[slot[r].device].node;
}

Test(sched, hybrid_2x2_on_two_nodes_keeps_each_shard_group_on_one_node) {
  cluster_t c = {0};
  add_node(&c, 2, "cpu", 1024);
  add_node(&c, 2, "cpu", 1024);
  sched_slot_t s[4];
  char note[256];
  cr_assert_eq(place(&c, 2, 2, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  cr_assert_str_empty(note);
  cr_assert_eq(node_of(&c, s, 0), node_of(&c, s, 1));
  cr_assert_eq(node_of(&c, s, 2), node_of(&c, s, 3));
  cr_assert_neq(node_of(&c, s, 0), node_of(&c, s, 2));
  /* within a node, ranks take the devices in index order */
  cr_assert_lt(c.dev[s[0].device].index, c.dev[s[1].device].index);
}

/* A drained node's devices are never given, and the reason says they are
 * what the job waits for; undrained, they are used again. */
Test(sched, a_drained_node_gets_no_ranks_and_the_reason_says_so) {
  cluster_t c = {0};
  add_node(&c, 2, "cpu", 1024);
  add_node(&c, 2, "cpu", 1024);
  c.node[0].drained = 1;
  sched_slot_t s[4];
  char note[256];
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  cr_assert(node_of(&c, s, 0) == 1 && node_of(&c, s, 1) == 1, "a rank on the drained node");
  cr_assert_eq(place(&c, 2, 2, "cpu", 100, s, note, sizeof note), SCHED_WAIT);
  cr_assert(strstr(note, "2 on drained nodes") && !strstr(note, "dead"), "%s", note);
  c.node[0].drained = 0;
  cr_assert_eq(place(&c, 2, 2, "cpu", 100, s, note, sizeof note), SCHED_PLACED, "%s", note);
}

Test(sched, third_job_waits_with_the_reason_then_runs_when_devices_free) {
  cluster_t c = {0};
  add_node(&c, 2, "cpu", 1024);
  add_node(&c, 2, "cpu", 1024);
  sched_slot_t a[2], b[2], x[2];
  char note[256];
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, a, note, sizeof note), SCHED_PLACED);
  hold(&c, a, 2);
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, b, note, sizeof note), SCHED_PLACED);
  hold(&c, b, 2);
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, x, note, sizeof note), SCHED_WAIT);
  cr_assert(strstr(note, "waiting for 2 free cpu devices"), "%s", note);
  cr_assert(strstr(note, ": 0 free"), "%s", note);
  cr_assert(strstr(note, "4 held by running jobs"), "%s", note);
  cr_assert_null(strstr(note, "in all"), "it will run once devices free: %s", note);
  /* more ranks than the cluster has: it says so, and what to do */
  sched_slot_t big[6];
  char bn[512];
  cr_assert_eq(place(&c, 1, 6, "cpu", 100, big, bn, sizeof bn), SCHED_WAIT);
  cr_assert(strstr(bn, "the cluster has 4 such devices in all") && strstr(bn, "at most 4 ranks"),
            "%s", bn);
  for (int r = 0; r < 2; r++) c.dev[a[r].device].held = 0; /* the first job ends */
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, x, note, sizeof note), SCHED_PLACED);
  cr_assert_eq(x[0].device, a[0].device);
  cr_assert_eq(x[1].device, a[1].device);
}

Test(sched, best_fit_leaves_the_larger_hole) {
  cluster_t c = {0};
  add_node(&c, 4, "cpu", 1024);
  add_node(&c, 2, "cpu", 1024);
  sched_slot_t s[4];
  char note[256];
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  cr_assert_eq(node_of(&c, s, 0), 1);
  hold(&c, s, 2);
  /* so a 4-way shard group still fits whole */
  cr_assert_eq(place(&c, 1, 4, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  cr_assert_str_empty(note);
  for (int r = 0; r < 4; r++) cr_assert_eq(node_of(&c, s, r), 0);
}

Test(sched, a_group_that_fits_no_node_spans_and_says_so) {
  cluster_t c = {0};
  add_node(&c, 1, "cpu", 1024);
  add_node(&c, 3, "cpu", 1024);
  add_node(&c, 2, "cpu", 1024);
  sched_slot_t s[4];
  char note[256];
  cr_assert_eq(place(&c, 1, 4, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  cr_assert(strstr(note, "shard group 0 (ranks 0-3) spans nodes node1, node"), "%s", note);
  cr_assert(strstr(note, "no node has 4 free devices"), "%s", note);
  /* as few nodes as it can: the three of node1, then one more */
  int on1 = 0;
  for (int r = 0; r < 4; r++) on1 += node_of(&c, s, r) == 1;
  cr_assert_eq(on1, 3);
}

/* A job that failed on a node goes elsewhere when another node will do,
 * even where best fit would pick the node it failed on; and back there only
 * when nothing else fits, or to keep a shard group whole. */
Test(sched, a_node_the_job_failed_on_is_used_only_when_no_other_will_do) {
  cluster_t c = {0};
  add_node(&c, 2, "cpu", 1024);
  add_node(&c, 4, "cpu", 1024);
  add_node(&c, 2, "cpu", 1024);
  char avoid[3] = {1, 0, 0};
  sched_slot_t s[8];
  char note[256];
  /* best fit alone: node0 (2 free, the fewest that hold the group) */
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  cr_assert_eq(node_of(&c, s, 0), 0);
  /* avoiding node0: node2, the best fit of the others */
  cr_assert_eq(place_avoiding(&c, 1, 2, "cpu", 100, avoid, s, note, sizeof note), SCHED_PLACED);
  cr_assert_eq(node_of(&c, s, 0), 2);
  cr_assert_eq(node_of(&c, s, 1), 2);
  /* 4 groups of 2 fill node1 and node2 first, then node0 */
  cr_assert_eq(place_avoiding(&c, 4, 2, "cpu", 100, avoid, s, note, sizeof note), SCHED_PLACED);
  cr_assert_eq(node_of(&c, s, 6), 0, "the last group on the avoided node: nothing else left");
  for (int r = 0; r < 6; r++) cr_assert_neq(node_of(&c, s, r), 0, "rank %d", r);
  /* whole beats avoided: a group of 4 fits whole only on node1 */
  avoid[0] = 0, avoid[1] = 1;
  cr_assert_eq(place_avoiding(&c, 1, 4, "cpu", 100, avoid, s, note, sizeof note), SCHED_PLACED);
  cr_assert_str_empty(note);
  for (int r = 0; r < 4; r++) cr_assert_eq(node_of(&c, s, r), 1);
}

/* A group that fits no node spans two where two hold it, the pair leaving
 * the least over, rather than the nodes with the most free first (an
 * outside tester: 2x4 on free {3, 2, 2, 1} put its second group on three
 * nodes, where {3+1} and {2+2} held both); a pair with a node the job
 * avoids only when no other pair will do. */
Test(sched, a_spanning_group_takes_the_pair_of_nodes_that_holds_it) {
  cluster_t c = {0};
  add_node(&c, 3, "cpu", 1024);
  add_node(&c, 2, "cpu", 1024);
  add_node(&c, 2, "cpu", 1024);
  add_node(&c, 1, "cpu", 1024);
  sched_slot_t s[8];
  char note[512];
  cr_assert_eq(place(&c, 2, 4, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  for (int g = 0; g < 2; g++) {
    int used[4] = {0}, n = 0;
    for (int r = g * 4; r < g * 4 + 4; r++) n += !used[node_of(&c, s, r)]++;
    cr_expect_eq(n, 2, "group %d spans %d nodes: %s", g, n, note);
  }
  cluster_t d = {0};
  add_node(&d, 2, "cpu", 1024);
  add_node(&d, 2, "cpu", 1024);
  add_node(&d, 3, "cpu", 1024);
  char avoid[3] = {1, 0, 0};
  /* {0, 1} hold 4 with nothing over, but the job avoids node0: {1, 2} */
  cr_assert_eq(place(&d, 1, 4, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  for (int r = 0; r < 4; r++) cr_expect_neq(node_of(&d, s, r), 2, "best fit pair: %s", note);
  cr_assert_eq(place_avoiding(&d, 1, 4, "cpu", 100, avoid, s, note, sizeof note), SCHED_PLACED);
  for (int r = 0; r < 4; r++) cr_expect_neq(node_of(&d, s, r), 0, "rank %d on the avoided node", r);
  /* every pair takes the avoided node, but the three others hold the group:
   * three nodes it did not fail on, not two with one it did */
  cluster_t e = {0};
  add_node(&e, 3, "cpu", 1024);
  add_node(&e, 1, "cpu", 1024);
  add_node(&e, 1, "cpu", 1024);
  add_node(&e, 2, "cpu", 1024);
  char avoid0[4] = {1, 0, 0, 0};
  cr_assert_eq(place_avoiding(&e, 1, 4, "cpu", 100, avoid0, s, note, sizeof note), SCHED_PLACED);
  for (int r = 0; r < 4; r++) cr_expect_neq(node_of(&e, s, r), 0, "rank %d on the avoided node", r);
}

Test(sched, dead_nodes_small_devices_and_other_kinds_are_not_used) {
  cluster_t c = {0};
  add_node(&c, 2, "cpu", 1024); /* dead */
  add_node(&c, 2, "cpu", 64);   /* too small */
  add_node(&c, 2, "cuda", 81920);
  add_node(&c, 1, "cpu", 1024);
  c.node[0].alive = 0;
  sched_slot_t s[2];
  char note[256];
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, s, note, sizeof note), SCHED_WAIT);
  cr_assert(strstr(note, "at least 100 MiB each: 1 free (node3 1)"), "%s", note);
  cr_assert(strstr(note, "2 with too little memory"), "%s", note);
  cr_assert(strstr(note, "2 on dead nodes"), "%s", note);
  cr_assert(strstr(note, "2 of another kind"), "%s", note);
  /* dead nodes' devices are not counted among those it could ever have */
  cr_assert(strstr(note, "the cluster has 1 such devices in all"), "%s", note);
  c.node[0].alive = 1;
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, s, note, sizeof note), SCHED_PLACED);
  cr_assert_eq(node_of(&c, s, 0), 0);
  cr_assert_eq(place(&c, 2, 1, "cuda", 40000, s, note, sizeof note), SCHED_PLACED);
  cr_assert_eq(node_of(&c, s, 0), 2);
}

/* A node whose fsdpd is stopping or stopped (said so) is not a dead one in
 * the reason; with no live device of the kind at all the reason says the
 * job waits for nodes to register, not to submit 0 ranks. */
Test(sched, a_stopped_node_is_not_called_dead_and_no_live_device_says_so) {
  cluster_t c = {0};
  add_node(&c, 2, "cpu", 1024);
  add_node(&c, 1, "cpu", 1024);
  c.node[0].alive = 0, c.node[0].stopped = 1;
  c.node[1].alive = 0;
  sched_slot_t s[2];
  char note[512];
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, s, note, sizeof note), SCHED_WAIT);
  cr_assert(strstr(note, "2 on nodes stopping or stopped"), "%s", note);
  cr_assert(strstr(note, "1 on dead nodes"), "%s", note);
  cr_assert(strstr(note, "it starts once the nodes stopping or stopped come back"), "%s", note);
  /* none of them there to come back: it waits for nodes to register */
  c.node[0].stopped = 0;
  cr_assert_eq(place(&c, 1, 2, "cpu", 100, s, note, sizeof note), SCHED_WAIT);
  cr_assert(strstr(note, "no live node has such devices: it starts once nodes with them "
                    "register"), "%s", note);
  cr_assert_null(strstr(note, "at most 0"), "%s", note);
  /* three live devices and a stopped one, for four ranks: it waits for the
   * stopped node, not for a smaller resubmit (helper-110) */
  cluster_t d = {0};
  add_node(&d, 3, "cpu", 1024);
  add_node(&d, 1, "cpu", 1024);
  d.node[1].alive = 0, d.node[1].stopped = 1;
  sched_slot_t s4[4];
  cr_assert_eq(place(&d, 1, 4, "cpu", 100, s4, note, sizeof note), SCHED_WAIT);
  cr_assert(strstr(note, "come back") && !strstr(note, "at most 3"), "%s", note);
}

Test(sched, a_bad_mesh_is_an_error_and_a_short_note_is_cut_not_overrun) {
  cluster_t c = {0};
  add_node(&c, 2, "cpu", 1024);
  sched_slot_t s[4];
  char note[32];
  cr_assert_eq(place(&c, 0, 2, "cpu", 1, s, note, sizeof note), FSDP_EINVAL);
  cr_assert(strstr(err_msg(), "mesh 0x2"), "%s", err_msg());
  char small[24];
  memset(small, 'x', sizeof small);
  cr_assert_eq(place(&c, 2, 2, "cpu", 1, s, small, 20), SCHED_WAIT);
  cr_assert_eq(strlen(small), 19);
  cr_assert_eq(small[20], 'x');
}

/* Random clusters and jobs: the slots are distinct usable devices; groups are
 * whole as often as the free devices allow; a job waits only when there are
 * too few usable devices. */
Test(sched, random_clusters_keep_the_rules) {
  uint64_t seed = 7;
  for (int trial = 0; trial < 3000; trial++) {
    cluster_t c = {0};
    int nn = 1 + (int)(tu_rand_u64(&seed) % 5);
    for (int n = 0; n < nn; n++)
      add_node(&c, (int)(tu_rand_u64(&seed) % 6), tu_rand_u64(&seed) % 5 ? "cpu" : "cuda",
               tu_rand_u64(&seed) % 4 ? 1024 : 50);
    for (int n = 0; n < nn; n++) c.node[n].alive = tu_rand_u64(&seed) % 6 != 0;
    for (int i = 0; i < c.nd; i++) c.dev[i].held = tu_rand_u64(&seed) % 4 == 0;
    int R = 1 + (int)(tu_rand_u64(&seed) % 3), S = 1 + (int)(tu_rand_u64(&seed) % 4);
    char avoid[MAXN] = {0};
    for (int n = 0; n < nn; n++) avoid[n] = tu_rand_u64(&seed) % 3 == 0;
    int avail[MAXN] = {0}, usable = 0;
    for (int i = 0; i < c.nd; i++) {
      const sched_device_t *d = &c.dev[i];
      if (!d->held && c.node[d->node].alive && !strcmp(d->kind, "cpu") && d->memory >= 100 * MIB)
        avail[d->node]++, usable++;
    }
    sched_slot_t s[12];
    char note[512];
    int rc = place_avoiding(&c, R, S, "cpu", 100, trial % 2 ? avoid : NULL, s, note, sizeof note);
    if (usable < R * S) {
      cr_assert_eq(rc, SCHED_WAIT, "trial %d", trial);
      continue;
    }
    cr_assert_eq(rc, SCHED_PLACED, "trial %d", trial);
    int used[MAXD] = {0};
    for (int r = 0; r < R * S; r++) {
      const sched_device_t *d = &c.dev[s[r].device];
      cr_assert(!used[s[r].device]++, "trial %d: device %d given twice", trial, s[r].device);
      cr_assert(!d->held && c.node[d->node].alive && !strcmp(d->kind, "cpu") &&
                    d->memory >= 100 * MIB, "trial %d: rank %d on an unusable device", trial, r);
    }
    int can_whole = 0, whole = 0;
    for (int n = 0; n < c.nn; n++) can_whole += avail[n] / S;
    if (can_whole > R) can_whole = R;
    for (int g = 0; g < R; g++) {
      int same = 1;
      for (int k = 1; k < S; k++) same &= node_of(&c, s, g * S + k) == node_of(&c, s, g * S);
      whole += same;
    }
    cr_assert_geq(whole, can_whole, "trial %d: %d groups whole, %d could be", trial, whole,
                  can_whole);
    cr_assert_eq(note[0] == '\0', whole == R, "trial %d: note '%s'", trial, note);
    /* where the other nodes hold every group whole, none goes to an avoided one */
    int elsewhere = 0;
    for (int n = 0; n < c.nn; n++) elsewhere += avoid[n] ? 0 : avail[n] / S;
    for (int r = 0; trial % 2 && elsewhere >= R && r < R * S; r++)
      cr_assert(!avoid[node_of(&c, s, r)], "trial %d: rank %d on an avoided node", trial, r);
  }
}

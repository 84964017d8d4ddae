/* Tests of /metrics (daemon/common/metrics.h) on a real coordinator and a
 * real fsdpd running a 2-rank job on 127.0.0.1:
 *   - Debian's `promtool check metrics` accepts both endpoints' output with
 *     no finding at all, and the values are the cluster's: one job running,
 *     one node alive, two running ranks with their steps, tokens/s and
 *     memory by category;
 *   - Debian's prometheus server, started on loopback, scrapes both and a
 *     rank's tokens/s comes back through its query API;
 *   - anything but GET /metrics gets its HTTP error;
 *   - with tokens, the coordinator counts the calls it refused, and fsdpd
 *     whether the coordinator answers it and the refusals of its token;
 *   - slow connections from one address leave a scrape answered. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/e2e/cluster.h"
#include "tests/unit/testutil.h"

#pragma GCC diagnostic ignored "-Wformat-truncation"

static cluster_proc_t coord, node;

static void teardown(void) {
  cluster_stop(&node, SIGTERM);
  cluster_stop(&coord, SIGTERM);
}

TestSuite(metrics, .fini = teardown, .timeout = 120 * TU_SLOW);

/* GET http://HOST:port/path into out (host: "127.0.0.1" or "[::1]"); the HTTP status. */
static int http_get_at(const char *host, int port, const char *path, char *out, size_t len) {
  char cmd[512], buf[1 << 16];
  snprintf(cmd, sizeof cmd, "curl -g -s -m 5 -w '\\n%%{http_code}' 'http://%s:%d%s'", host, port,
           path);
  cr_assert_eq(tu_sh(cmd, buf, sizeof buf), 0, "%s: %s", cmd, buf);
  char *nl = strrchr(buf, '\n');
  cr_assert_not_null(nl);
  *nl = 0;
  snprintf(out, len, "%s", buf);
  return atoi(nl + 1);
}
static int http_get(int port, const char *path, char *out, size_t len) {
  return http_get_at("127.0.0.1", port, path, out, len);
}

/* The value of the sample whose line starts with prefix (name{labels}), or NAN. */
static double sample(const char *text, const char *prefix) {
  for (const char *p = text; (p = strstr(p, prefix)); p++)
    if (p == text || p[-1] == '\n') return strtod(p + strlen(prefix), NULL);
  return NAN;
}

/* The port in "metrics on port N" of a log file (fsdpd's), waiting for it. */
static int log_port(const char *path) {
  char buf[1 << 14];
  const double t0 = tu_now_s();
  while (tu_now_s() - t0 < 10) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    char *m = strstr(buf, "metrics on port ");
    if (m) return atoi(m + 16);
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
  cr_assert_fail("no \"metrics on port\" in %s", path);
  return 0;
}

/* The alerting rules (deploy/prometheus/fsdp-alerts.yml), read whole. */
static char *alert_rules(void) {
  char path[4096];
  snprintf(path, sizeof path, "%s/deploy/prometheus/fsdp-alerts.yml", tu_root());
  char *text = tu_slurp(path, NULL);
  cr_assert_not_null(text, "%s cannot be read", path);
  return text;
}

/* Every metric the alerting rules read (fsdp_*; a histogram's _bucket,
 * _sum and _count by its family) is a family one of the two endpoints'
 * outputs declares: a misspelled or renamed metric would make its alert
 * silently never fire. How many names were checked. */
static int alert_metrics_exported(const char *coord_text, const char *node_text) {
  char *rules = alert_rules();
  int checked = 0;
  for (const char *p = rules; (p = strstr(p, "fsdp_"));) {
    if (p > rules && (isalnum((unsigned char)p[-1]) || p[-1] == '_')) {
      p++;
      continue;
    }
    char name[128];
    size_t n = 0;
    while (n < sizeof name - 1 && (isalnum((unsigned char)p[n]) || p[n] == '_')) name[n] = p[n], n++;
    name[n] = 0;
    p += n;
    for (const char *suffix = "_bucket\0_count\0_sum\0"; *suffix; suffix += strlen(suffix) + 1) {
      const size_t k = strlen(suffix);
      if (n > k && !strcmp(name + n - k, suffix)) {
        name[n - k] = 0;
        break;
      }
    }
    char decl[160];
    snprintf(decl, sizeof decl, "# TYPE %s ", name);
    cr_expect(strstr(coord_text, decl) || strstr(node_text, decl),
              "deploy/prometheus/fsdp-alerts.yml reads %s, which neither the coordinator nor "
              "fsdpd exports", name);
    checked++;
  }
  free(rules);
  return checked;
}

/* promtool finds the alerting rules well formed, and their unit tests
 * (tests/prometheus/fsdp-alerts.test.yml: each alert fires on what should
 * fire it, with its annotations rendered, and not on the near misses)
 * pass. */
Test(metrics, the_alerting_rules_pass_promtool_and_their_unit_tests) {
  char cmd[4096], out[1 << 14];
  snprintf(cmd, sizeof cmd, "cd '%s' && promtool check rules deploy/prometheus/fsdp-alerts.yml",
           tu_root());
  int rc = tu_sh(cmd, out, sizeof out);
  cr_assert(rc == 0 && strstr(out, "SUCCESS"), "%s: exit %d:\n%s", cmd, rc, out);
  snprintf(cmd, sizeof cmd, "cd '%s' && promtool test rules tests/prometheus/fsdp-alerts.test.yml",
           tu_root());
  rc = tu_sh(cmd, out, sizeof out);
  cr_assert(rc == 0 && strstr(out, "SUCCESS"), "%s: exit %d:\n%s", cmd, rc, out);
}

Test(metrics, both_endpoints_pass_promtool_and_prometheus_scrapes_a_running_job) {
  chmod(tu_tmpdir(), 0755);
  char *db = tu_path("state.db");
  cluster_coord_start(&coord, db, "127.0.0.1:0", "--metrics-listen 127.0.0.1:0");
  cr_assert_gt(coord.metrics_port, 0, "the coordinator did not say its metrics port");
  cluster_fsdpd_start(&node, coord.addr, "solo", 2, "--metrics-listen 127.0.0.1:0");
  const int node_port = log_port(node.log);
  char *data = tu_token_file("tok.bin", 40000, 5, 256), conf[800], text[4096], out[1 << 16];
  chmod(data, 0644);
  snprintf(conf, sizeof conf, "%s/job.conf", tu_tmpdir());
  char *ck = tu_path("ck");
  cr_assert_eq(mkdir(ck, 0777), 0);
  chmod(ck, 0777); /* the ranks' user writes there */
  snprintf(text, sizeof text, "[model]\nmodel = tiny\n[data]\ndata = %s\n[train]\nbatch = 2\n"
           "seq_len = 32\nsteps = 1000000\neval_every = 0\n[output]\ncheckpoint_dir = %s\n"
           "checkpoint_every = 200\n", data, ck);
  tu_write_file(conf, text, strlen(text));
  char a[1024];
  snprintf(a, sizeof a, "submit '%s' --ranks 2", conf);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  char job[32], step0[96], tok0[96];
  snprintf(job, sizeof job, "%.*s", (int)strcspn(out, "\n"), out);
  snprintf(step0, sizeof step0, "fsdp_rank_step{job=\"%s\",rank=\"0\"}", job);
  snprintf(tok0, sizeof tok0, "fsdp_rank_tokens_per_second{job=\"%s\",rank=\"0\"}", job);
  /* both see the ranks' reports */
  const int ports[2] = {coord.metrics_port, node_port};
  static char got[2][1 << 16];
  const double t0 = tu_now_s();
  for (int i = 0; i < 2; i++)
    for (;;) {
      cr_assert_eq(http_get(ports[i], "/metrics", got[i], sizeof got[i]), 200);
      if (sample(got[i], step0) > 0 && sample(got[i], tok0) > 0) break;
      cr_assert_lt(tu_now_s() - t0, 30, "no report of rank 0 on port %d:\n%s", ports[i], got[i]);
      nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
  /* promtool: no finding at all */
  for (int i = 0; i < 2; i++) {
    char *f = tu_path(i ? "node.prom" : "coord.prom"), cmd[1024];
    tu_write_file(f, got[i], strlen(got[i]));
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s'", f);
    int rc = tu_sh(cmd, out, sizeof out);
    cr_assert(rc == 0 && !out[0], "%s: exit %d:\n%s", cmd, rc, out);
    free(f);
  }
  cr_assert_gt(alert_metrics_exported(got[0], got[1]), 10);
  cr_assert_eq(sample(got[0], "fsdp_jobs{state=\"RUNNING\"}"), 1, "%s", got[0]);
  cr_assert_eq(sample(got[0], "fsdp_nodes{state=\"alive\"}"), 1, "%s", got[0]);
  cr_assert_eq(sample(got[1], "fsdp_node_ranks{state=\"running\"}"), 2, "%s", got[1]);
  /* each CPU device offers its share of the host's memory (the node has 2) */
  const double half = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / 2;
  for (int d = 0; d < 2; d++) {
    char dev[96];
    snprintf(dev, sizeof dev, "fsdp_node_device_memory_offered_bytes{device=\"cpu:%d\"}", d);
    cr_assert(fabs(sample(got[1], dev) - half) <= 1e-6 * half, "%s, not %.0f:\n%s", dev, half,
              got[1]);
  }
  char mem[160];
  snprintf(mem, sizeof mem, "fsdp_rank_memory_bytes{job=\"%s\",rank=\"1\",category=\"params\"}", job);
  for (int i = 0; i < 2; i++) cr_assert_gt(sample(got[i], mem), 0, "%s", got[i]);
  /* fsdpctl nodes shows what each busy device's rank uses, as its
   * heartbeats say (it showed 0 B, the coordinator not passing it on) */
  int busy = 0;
  for (const double t3 = tu_now_s(); busy < 2 && tu_now_s() - t3 < 10;) {
    cr_assert_eq(cluster_ctl(coord.addr, "--output json nodes", out, sizeof out), 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    json_t *devs = json_object_get(json_array_get(j, 0), "devices");
    busy = 0;
    for (size_t d = 0; d < json_array_size(devs); d++) {
      json_t *u = json_object_get(json_array_get(devs, d), "used_bytes");
      busy += (json_is_string(u) ? atof(json_string_value(u)) : json_number_value(u)) > 1e5;
    }
    json_decref(j);
    if (busy < 2) nanosleep(&(struct timespec){0, 200000000}, NULL);
  }
  cr_assert_eq(busy, 2, "fsdpctl nodes does not show the ranks' memory:\n%s", out);
  cr_assert_geq(sample(got[0], "fsdp_scheduling_latency_seconds_count"), 1, "%s", got[0]);
  /* each histogram spans what it measures: a job's wait for placement up to
   * hours (it stopped at 2.048 s), a heartbeat's lateness from
   * milliseconds to a stall's tens of seconds (it stopped at 2.048 s, so a
   * 30 s stall read as 2 s late) */
  cr_assert_eq(sample(got[0], "fsdp_scheduling_latency_seconds_bucket{le=\"17714.7\"}"), 1, "%s", got[0]);
  cr_assert(!isnan(sample(got[0], "fsdp_heartbeat_lateness_seconds_bucket{le=\"0.001\"}")), "%s",
            got[0]);
  cr_assert(!isnan(sample(got[0], "fsdp_heartbeat_lateness_seconds_bucket{le=\"1\"}")), "%s",
            got[0]);
  cr_assert(!isnan(sample(got[0], "fsdp_heartbeat_lateness_seconds_bucket{le=\"30\"}")), "%s",
            got[0]);
  /* every commit's latency, from its last shard's report, is in the histogram */
  for (const double t2 = tu_now_s(); sample(got[0], "fsdp_checkpoint_commits_total") < 1;) {
    cr_assert_lt(tu_now_s() - t2, 30, "no checkpoint committed within 30 s:\n%s", got[0]);
    nanosleep(&(struct timespec){0, 200000000}, NULL);
    cr_assert_eq(http_get(coord.metrics_port, "/metrics", got[0], sizeof got[0]), 200);
  }
  const double commits = sample(got[0], "fsdp_checkpoint_commits_total");
  cr_assert_eq(sample(got[0], "fsdp_checkpoint_commit_seconds_count"), commits, "%s", got[0]);
  const double csum = sample(got[0], "fsdp_checkpoint_commit_seconds_sum");
  cr_assert(csum > 0 && csum < 10 * commits, "%g s for %g commits", csum, commits);
  cr_assert_eq(sample(got[0], "fsdp_attempts_ended_total{outcome=\"failed\"}"), 0, "%s", got[0]);
  cr_assert_geq(sample(got[0], "fsdp_placement_pass_seconds_count"), 1, "%s", got[0]);
  cr_assert_lt(sample(got[0], "fsdp_placement_pass_seconds_sum"), 60, "%s", got[0]);
  /* a drained node counts as drained */
  cr_assert_eq(sample(got[0], "fsdp_nodes_drained"), 0, "%s", got[0]);
  cr_assert_eq(cluster_ctl(coord.addr, "drain n-1 --reason maintenance", out, sizeof out), 0, "%s", out);
  cr_assert_eq(http_get(coord.metrics_port, "/metrics", got[0], sizeof got[0]), 200);
  cr_assert_eq(sample(got[0], "fsdp_nodes_drained"), 1, "%s", got[0]);
  /* errors */
  cr_assert_eq(http_get(coord.metrics_port, "/", out, sizeof out), 404);
  /* Prometheus scrapes both, every second; rank 0's tokens/s comes back */
  char addr[64], prom_cfg[800], prom_dir[800], q[512];
  int fd = tu_listen_loopback(addr, sizeof addr);
  close(fd); /* its port, free again for prometheus */
  snprintf(prom_cfg, sizeof prom_cfg, "%s/prometheus.yml", tu_tmpdir());
  snprintf(prom_dir, sizeof prom_dir, "%s/prometheus-data", tu_tmpdir());
  char root[4096]; /* absolute: Prometheus reads rule_files from its config's directory */
  cr_assert_not_null(realpath(tu_root(), root));
  snprintf(text, sizeof text, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
           "rule_files:\n  - '%s/deploy/prometheus/fsdp-alerts.yml'\nscrape_configs:\n"
           "  - job_name: fsdp\n    honor_labels: true\n    static_configs:\n      - targets: ['127.0.0.1:%d', "
           "'127.0.0.1:%d']\n", root, coord.metrics_port, node_port);
  tu_write_file(prom_cfg, text, strlen(text));
  snprintf(a, sizeof a, "exec prometheus --config.file='%s' --storage.tsdb.path='%s' "
           "--web.listen-address=%s >'%s/prometheus.log' 2>&1", prom_cfg, prom_dir, addr,
           tu_tmpdir());
  pid_t prom = cluster_run(a);
  double value = 0;
  int series = 0;
  snprintf(q, sizeof q, "/api/v1/query?query=fsdp_rank_tokens_per_second%%7Bjob%%3D%%22%s%%22%%2Crank%%3D%%220%%22%%7D", job);
  const double t1 = tu_now_s();
  while (tu_now_s() - t1 < 40) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "curl -s -m 2 'http://%s%s'", addr, q);
    if (tu_sh(cmd, out, sizeof out) == 0) {
      json_t *j = json_loads(out, 0, NULL);
      json_t *res = json_object_get(json_object_get(j, "data"), "result");
      series = (int)json_array_size(res);
      if (series > 0) {
        json_t *v = json_array_get(json_object_get(json_array_get(res, 0), "value"), 1);
        value = v ? atof(json_string_value(v)) : 0;
      }
      json_decref(j);
      if (value > 0) break;
    }
    nanosleep(&(struct timespec){0, 250000000}, NULL);
  }
  /* and evaluates every alerting rule against the cluster's series, with
   * no error (a rule promtool takes can still fail on real series: two
   * series of one label set on a side of a comparison, say) */
  char *rules = alert_rules();
  int want = 0, evaluated = 0, healthy = 0;
  for (const char *p = rules; (p = strstr(p, "- alert: ")); p++) want++;
  free(rules);
  char bad[1024] = "", cmd[1024];
  /* after both targets' series are in: a rule evaluated before has none */
  int up = 0;
  snprintf(cmd, sizeof cmd, "curl -s -m 2 'http://%s/api/v1/query?query=count(up%%3D%%3D1)'", addr);
  for (const double t2 = tu_now_s(); up < 2 && tu_now_s() - t2 < 20;) {
    if (tu_sh(cmd, out, sizeof out) == 0) {
      json_t *j = json_loads(out, 0, NULL);
      json_t *v = json_array_get(json_object_get(json_array_get(json_object_get(
                                     json_object_get(j, "data"), "result"), 0), "value"), 1);
      up = v ? atoi(json_string_value(v)) : 0;
      json_decref(j);
    }
    if (up < 2) nanosleep(&(struct timespec){0, 250000000}, NULL);
  }
  cr_expect_eq(up, 2, "Prometheus did not scrape both targets:\n%s", out);
  nanosleep(&(struct timespec){2, 500000000}, NULL); /* two evaluations more (1 s apart) */
  for (const double t2 = tu_now_s(); evaluated < want && tu_now_s() - t2 < 20;) {
    snprintf(cmd, sizeof cmd, "curl -s -m 2 'http://%s/api/v1/rules?type=alert'", addr);
    evaluated = healthy = 0;
    if (tu_sh(cmd, out, sizeof out) == 0) {
      json_t *j = json_loads(out, 0, NULL), *groups = json_object_get(json_object_get(j, "data"), "groups");
      for (size_t g = 0; g < json_array_size(groups); g++) {
        json_t *rl = json_object_get(json_array_get(groups, g), "rules");
        for (size_t r = 0; r < json_array_size(rl); r++) {
          json_t *rule = json_array_get(rl, r);
          const char *last = json_string_value(json_object_get(rule, "lastEvaluation"));
          const char *health = json_string_value(json_object_get(rule, "health"));
          if (!last || !strncmp(last, "0001-", 5)) continue; /* not evaluated yet */
          evaluated++;
          if (health && !strcmp(health, "ok")) healthy++;
          else
            snprintf(bad, sizeof bad, "%s: %s (%s)", json_string_value(json_object_get(rule, "name")),
                     health ? health : "?", json_string_value(json_object_get(rule, "lastError")));
        }
      }
      json_decref(j);
    }
    if (evaluated < want) nanosleep(&(struct timespec){0, 250000000}, NULL);
  }
  cr_expect_eq(evaluated, want, "Prometheus evaluated %d of the %d alerting rules:\n%s", evaluated,
               want, out);
  cr_expect_eq(healthy, evaluated, "an alerting rule failed on the cluster's series: %s", bad);
  kill(prom, SIGTERM);
  int st;
  for (int i = 0; i < 500 && waitpid(prom, &st, WNOHANG) == 0; i++)
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  if (waitpid(prom, &st, WNOHANG) == 0) kill(prom, SIGKILL), waitpid(prom, &st, 0);
  cr_assert_gt(value, 0, "Prometheus has no tokens/s of %s rank 0 (%d series):\n%s", job, series, out);
  cr_log_info("Prometheus read %s rank 0 at %.0f tokens/s", job, value);
  snprintf(a, sizeof a, "cancel %s", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  /* the attempt ended cancelled, and nothing else ended */
  cr_assert_eq(http_get(coord.metrics_port, "/metrics", got[0], sizeof got[0]), 200);
  cr_assert_eq(sample(got[0], "fsdp_attempts_ended_total{outcome=\"cancelled\"}"), 1, "%s", got[0]);
  cr_assert_eq(sample(got[0], "fsdp_attempts_ended_total{outcome=\"succeeded\"}"), 0, "%s", got[0]);
  cr_assert_eq(sample(got[0], "fsdp_attempts_ended_total{outcome=\"failed\"}"), 0, "%s", got[0]);
  cr_assert_eq(sample(got[0], "fsdp_attempts_ended_total{outcome=\"preempted\"}"), 0, "%s", got[0]);
  free(db), free(data), free(ck);
}

/* IPv6: fsdpd serves its Node service on [::1] and /metrics on [::] (IPv6
 * and IPv4), its ranks
 * listen there for their ring ("[::1]:PORT" in the rendezvous), and a job
 * trains to the end; its log is read from the node's IPv6 address. Skipped
 * where this machine has no IPv6 loopback. */
Test(metrics, a_node_on_ipv6_trains_a_job_and_serves_its_metrics) {
  int s6 = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 lo = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  const int v6 = s6 >= 0 && !bind(s6, (struct sockaddr *)&lo, sizeof lo);
  if (s6 >= 0) close(s6);
  if (!v6) cr_skip_test("no IPv6 loopback here (::1 cannot be bound)");
  chmod(tu_tmpdir(), 0755);
  char *db = tu_path("state.db");
  cluster_coord_start(&coord, db, "127.0.0.1:0", NULL);
  free(db);
  cluster_fsdpd_start(&node, coord.addr, "six", 2,
                      "--listen [::1]:0 --rank-host ::1 --metrics-listen [::]:0");
  const int port = log_port(node.log);
  char *data = tu_token_file("tok.bin", 40000, 5, 256), conf[800], text[1024], out[1 << 16], a[1024];
  chmod(data, 0644);
  snprintf(conf, sizeof conf, "%s/job.conf", tu_tmpdir());
  snprintf(text, sizeof text, "[model]\nmodel = tiny\n[data]\ndata = %s\n[train]\nbatch = 2\n"
           "seq_len = 32\nsteps = 4\neval_every = 0\n", data);
  tu_write_file(conf, text, strlen(text));
  free(data);
  snprintf(a, sizeof a, "submit '%s' --ranks 2 --watch", conf);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "the job over an IPv6 ring: %s", out);
  char job[32];
  snprintf(job, sizeof job, "%.*s", (int)strcspn(out, "\n"), out);
  cr_assert_eq(cluster_ctl(coord.addr, "nodes", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "[::1]:"), "the node registered its IPv6 address: %s", out);
  snprintf(a, sizeof a, "logs %s --rank 1", job);
  cr_assert_eq(cluster_ctl(coord.addr, a, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "done: 4 steps"), "rank 1's log, from [::1]: %s", out);
  static char got[1 << 16];
  cr_assert_eq(http_get_at("[::1]", port, "/metrics", got, sizeof got), 200);
  cr_assert(strstr(got, "fsdp_node_ranks"), "%s", got);
  /* [::] takes IPv4 as well (a Prometheus on IPv4 still scrapes it) */
  cr_assert_eq(http_get_at("127.0.0.1", port, "/metrics", got, sizeof got), 200);
  cr_assert(strstr(got, "fsdp_node_ranks"), "%s", got);
}

/* Scrapes port's /metrics until the sample of prefix equals want (at most
 * secs); the last text in out. */
static int wait_sample(int port, const char *prefix, double want, double secs, char *out, size_t len) {
  for (const double t0 = tu_now_s();;) {
    cr_assert_eq(http_get(port, "/metrics", out, len), 200);
    if (sample(out, prefix) == want) return 1;
    if (tu_now_s() - t0 > secs) return 0;
    nanosleep(&(struct timespec){0, 100000000}, NULL);
  }
}

/* Authentication shows: the coordinator counts the calls it refused for
 * their token (none or unknown: unauthenticated; a node's on a user method:
 * permission_denied), and fsdpd says whether the coordinator answers it
 * and counts the refusals of its own token. Its token taken out of the
 * coordinator's node token file (SIGHUP) makes the node go down and count,
 * and put back, come up again; promtool takes both endpoints throughout. */
Test(metrics, refused_calls_and_a_nodes_standing_with_the_coordinator_are_counted) {
  chmod(tu_tmpdir(), 0755);
  char *db = tu_path("auth.db"), *ut = tu_path("user.token"), *nt = tu_path("nodes.tokens");
  char *mine = tu_path("solo.token");
  tu_write_file(ut, "user-secret-1234567890\n", 23);
  const char *table = "solo solo-secret-0001\n", *other = "solo solo-secret-0002\n";
  tu_write_file(nt, table, strlen(table));
  tu_write_file(mine, "solo-secret-0001\n", 17);
  char extra[2000], out[1 << 16], opt[800];
  snprintf(extra, sizeof extra, "--metrics-listen 127.0.0.1:0 --user-token-file '%s' "
           "--node-token-file '%s'", ut, nt);
  cluster_coord_start(&coord, db, "127.0.0.1:0", extra);
  setenv("FSDP_TOKEN_FILE", ut, 1);
  snprintf(opt, sizeof opt, "--metrics-listen 127.0.0.1:0 --token-file '%s'", mine);
  cluster_fsdpd_start(&node, coord.addr, "solo", 1, opt);
  const int node_port = log_port(node.log);
  static char got[2][1 << 16];
  cr_assert(wait_sample(node_port, "fsdp_node_coordinator_up", 1, 10, got[1], sizeof got[1]),
            "%s", got[1]);
  cr_expect_eq(sample(got[1], "fsdp_node_coordinator_refusals_total"), 0, "%s", got[1]);
  cr_assert_eq(http_get(coord.metrics_port, "/metrics", got[0], sizeof got[0]), 200);
  const char *unauth = "fsdp_rpc_refused_total{reason=\"unauthenticated\"}";
  const char *denied = "fsdp_rpc_refused_total{reason=\"permission_denied\"}";
  const double u0 = sample(got[0], unauth), d0 = sample(got[0], denied);
  cr_assert(u0 == 0 && d0 == 0, "%s", got[0]);
  /* fsdpctl with no token, then with the node's */
  unsetenv("FSDP_TOKEN_FILE");
  cr_expect_neq(cluster_ctl(coord.addr, "jobs", out, sizeof out), 0, "%s", out);
  setenv("FSDP_TOKEN_FILE", mine, 1);
  cr_expect_neq(cluster_ctl(coord.addr, "jobs", out, sizeof out), 0, "%s", out);
  setenv("FSDP_TOKEN_FILE", ut, 1);
  cr_assert_eq(http_get(coord.metrics_port, "/metrics", got[0], sizeof got[0]), 200);
  cr_expect_eq(sample(got[0], unauth), 1, "%s", got[0]);
  cr_expect_eq(sample(got[0], denied), 1, "%s", got[0]);
  /* the node's token taken out: it goes down, counting refusals */
  tu_write_file(nt, other, strlen(other));
  kill(coord.pid, SIGHUP);
  cr_assert(wait_sample(node_port, "fsdp_node_coordinator_up", 0, 15, got[1], sizeof got[1]),
            "%s", got[1]);
  cr_expect_geq(sample(got[1], "fsdp_node_coordinator_refusals_total"), 1, "%s", got[1]);
  cr_assert_eq(http_get(coord.metrics_port, "/metrics", got[0], sizeof got[0]), 200);
  cr_expect_geq(sample(got[0], unauth), 2, "%s", got[0]);
  for (int i = 0; i < 2; i++) {
    char *f = tu_path(i ? "node-auth.prom" : "coord-auth.prom"), cmd[1024];
    tu_write_file(f, got[i], strlen(got[i]));
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s'", f);
    int rc = tu_sh(cmd, out, sizeof out);
    cr_expect(rc == 0 && !out[0], "%s: exit %d:\n%s", cmd, rc, out);
    free(f);
  }
  /* and put back: up again (a refused node asks every 5 s) */
  tu_write_file(nt, table, strlen(table));
  kill(coord.pid, SIGHUP);
  cr_expect(wait_sample(node_port, "fsdp_node_coordinator_up", 1, 15, got[1], sizeof got[1]),
            "%s", got[1]);
  unsetenv("FSDP_TOKEN_FILE");
  free(db), free(ut), free(nt), free(mine);
}

/* One peer cannot take every /metrics connection: 24 connections from
 * 127.0.0.2 that send a request line and a header and never end their
 * request (one header line every few seconds would keep each past the 10 s
 * timeout of silence; these stay well within it) leave a scrape from
 * 127.0.0.1 answered at once. Before, 16 such connections took all there
 * were, and the scrape got nothing: FsdpTargetDown (an outside tester). */
Test(metrics, slow_connections_from_one_peer_leave_the_scrape_answered) {
  char *db = tu_path("slow.db");
  cluster_coord_start(&coord, db, "127.0.0.1:0", "--metrics-listen 127.0.0.1:0");
  free(db);
  enum { N = 24 };
  int fd[N];
  struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.2", &from.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  to.sin_port = htons((uint16_t)coord.metrics_port);
  const char *part = "GET /metrics HTTP/1.1\r\nHost: slow\r\n";
  for (int i = 0; i < N; i++) {
    fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd[i], 0);
    cr_assert_eq(bind(fd[i], (struct sockaddr *)&from, sizeof from), 0, "bind 127.0.0.2");
    cr_assert_eq(connect(fd[i], (struct sockaddr *)&to, sizeof to), 0, "connect");
    (void)!send(fd[i], part, strlen(part), MSG_NOSIGNAL); /* one refused may be closed already */
  }
  usleep(300 * 1000); /* each held by the server, or closed */
  static char got[1 << 16];
  const double t0 = tu_now_s();
  cr_assert_eq(http_get(coord.metrics_port, "/metrics", got, sizeof got), 200);
  cr_expect_lt(tu_now_s() - t0, 1.0 * TU_SLOW, "the scrape took %.2f s", tu_now_s() - t0);
  cr_expect(strstr(got, "fsdp_nodes"), "%s", got);
  for (int i = 0; i < N; i++) close(fd[i]);
}

/* cluster: the service's programs as processes on 127.0.0.1 for end-to-end
 * tests: a coordinator on a database, node daemons with CPU devices, and
 * fsdpctl. Every process dies with the test (PR_SET_PDEATHSIG) and every
 * wait is bounded. */
#ifndef FSDP_TESTS_CLUSTER_H
#define FSDP_TESTS_CLUSTER_H

#include <sys/types.h>

typedef struct cluster_proc {
  pid_t pid;
  char addr[64]; /* the coordinator's "127.0.0.1:PORT" */
  int metrics_port; /* its /metrics port, when it serves them (--metrics-listen) */
  char log[600]; /* its stderr (and stdout, for fsdpd) */
} cluster_proc_t;

/* bin/fsdp-coordinator on db, the test's directory as its root, listening
 * on listen ("127.0.0.1:0": any port), options extra (shell words); waits
 * for it to serve. */
void cluster_coord_start(cluster_proc_t *p, const char *db, const char *listen, const char *extra);
/* The same for a whole command line (shell words), p->log set: its stderr
 * goes there; waits for it to serve and sets p->addr. */
void cluster_coord_run(cluster_proc_t *p, const char *command);
/* `sh -c cmd`, dying with the test; its pid. */
pid_t cluster_run(const char *cmd);
/* Waits (bounded) until the coordinator at coord lists node name ALIVE. */
void cluster_wait_alive(const char *coord, const char *name);
/* bin/fsdpd named name with `--devices cpu:ndev` for the coordinator at
 * coord, its work directory beside the database (ranks as nobody when the
 * test runs as root); waits until the coordinator lists it ALIVE. */
void cluster_fsdpd_start(cluster_proc_t *p, const char *coord, const char *name, int ndev,
                         const char *extra);
/* cluster_fsdpd_start without the wait. */
void cluster_fsdpd_spawn(cluster_proc_t *p, const char *coord, const char *name, int ndev,
                         const char *extra);
/* The same with a --devices spec ("cuda") and environment entries for
 * fsdpd and its ranks (shell words, "A=1 B=2"; NULL: none). */
void cluster_fsdpd_spawn_on(cluster_proc_t *p, const char *coord, const char *name,
                            const char *devices, const char *env, const char *extra);
/* Waits up to timeout_s for it to exit and reaps it: its wait status, or -1
 * (it still runs, or there was no process). */
int cluster_wait_exit(cluster_proc_t *p, double timeout_s);
/* Sends sig and reaps it (bounded: SIGKILL after 15 s): its wait status
 * (-1: there was no process). */
int cluster_stop(cluster_proc_t *p, int sig);
/* Runs bin/fsdpctl ARGS (shell words) against coord, output (stderr joined)
 * into out; its exit status. */
int cluster_ctl(const char *coord, const char *args, char *out, size_t len);
/* Waits for path to exist (a checkpoint's manifest: committed), up to
 * timeout_s times TU_SLOW; fails the test naming it when it does not. */
void cluster_wait_file(const char *path, double timeout_s);
/* Asserts that the SQLite database at path passes PRAGMA integrity_check. */
void cluster_db_check(const char *path);
/* A process whose working directory lies under dir (a rank runs in its
 * attempt's directory), 0 when there is none. */
pid_t cluster_pid_under(const char *dir);
/* Seconds until no process whose working directory lies under dir is left
 * (a rank runs in its attempt's directory), or -1 after timeout_s. */
double cluster_wait_gone(const char *dir, double timeout_s);

/* A cluster's service account signing key (an RSA key, PEM, at key) and
 * its JWKS (kid "k", at jwks), as --node-jwks-file takes it. */
void cluster_sa_keys(const char *key, const char *jwks);
/* A token minted by tests/unit/jwt_mint.py, signed by key: a projected
 * service account token of fsdpd's pod (system:serviceaccount:fsdp:fsdpd,
 * audience fsdp-coordinator) on node `node`, expiring at exp
 * ("@NOW+3600"), written to path by a rename over it, as the kubelet
 * renews the file. */
void cluster_sa_token(const char *path, const char *key, const char *node, const char *exp);

#endif

/* supervise: a set of child processes on one libuv loop, and what keeps them
 * from outliving their job. fsdp-launch runs a job's ranks through it; the node
 * daemon (fsdpd) will run each job's rank workers through one set per job.
 *
 * A child runs in its own session, so its process group holds it and whatever
 * it starts. Its stdin is /dev/null; its stdout and stderr are pipes that the
 * set reads and relays line by line to the set's out and err, each line
 * preceded by the child's prefix (a line longer than SUPERVISE_LINE_MAX bytes
 * is relayed in pieces of that size, and a last line with no newline is
 * relayed with one). Descriptors the caller hands down become the child's
 * fd 3, 4, ...
 *
 * When a child exits, its process group is SIGKILLed (what it started goes
 * with it), the output still in its pipes is relayed, the ring links it
 * created and no peer mapped (/dev/shm/fsdpd-ring-<its pid>-*, shm_name.h:
 * a rank killed mid-bootstrap leaves them) are removed, and only then does
 * its exit callback run: by then its last line is out and nothing of it runs.
 * supervise_stop sends SIGTERM to the group of every running child and
 * SIGKILL to the groups still running when the grace period ends; after it,
 * the set starts nothing more. What to do when a child fails (stop the rest,
 * restart it, report it) is the caller's policy, decided in its exit
 * callback.
 *
 * The loop's contract (libuv's): every function here is called on the loop's
 * thread and returns at once, never waiting for a child; callbacks run on
 * that thread and must not block. The relay writes with stdio to out and err:
 * the caller gives files, or a terminal or pipe that is read, since a write
 * that blocks stalls the loop. The caller ignores SIGPIPE: a destination
 * whose reader is gone (EPIPE) is said once on stderr and gets no more
 * lines, and the children run on.
 *
 * Not covered: a descendant that leaves the child's session (setsid, a daemon
 * forking twice) escapes the group's SIGKILL; the node daemon will need a
 * cgroup per job to catch those. */
#ifndef FSDP_SUPERVISE_H
#define FSDP_SUPERVISE_H

#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#define SUPERVISE_LINE_MAX 4096 /* longest line relayed whole */

typedef struct supervise supervise_t;

/* A child ended: term_signal is the signal that killed it (0 if it exited),
 * status its exit status (0 when killed). arg: the child's. */
typedef void (*supervise_exit_cb)(supervise_t *s, void *arg, int64_t status, int term_signal);
/* The grace period ended with `running` children left, about to be
 * SIGKILLed (a caller says so where its user looks). arg: the set's. */
typedef void (*supervise_kill_cb)(supervise_t *s, void *arg, int running);

typedef struct supervise_opts {
  FILE *out, *err;           /* where the children's stdout and stderr lines go (NULL: ours) */
  supervise_kill_cb kill_cb; /* NULL: none */
  void *arg;
} supervise_opts_t;

typedef struct supervise_child_opts {
  char *const *argv;         /* NULL-terminated; argv[0] a path or a name found in PATH */
  char *const *env;          /* "NAME=value" entries (NULL-terminated, or NULL) added to this
                                process's environment, each replacing an inherited NAME */
  const int *fds;            /* handed down as fd 3, 4, ...; the caller still owns and closes */
  int nfds;                  /*   its own copies */
  const char *prefix;        /* put before every relayed line (copied), e.g. "[rank 3] " */
  FILE *out, *err;           /* where this child's lines go (NULL: the set's), e.g. the
                                rank's log file; the caller closes them after its exit_cb */
  const char *cwd;           /* its working directory (NULL: ours), entered before it drops
                                to uid/gid: fsdpd gives a rank its attempt's directory */
  int as_user;               /* 1: run it as uid/gid, supplementary groups dropped, so a daemon
                                started as root runs ranks unprivileged; 0: as we run */
  unsigned uid, gid;
  supervise_exit_cb exit_cb; /* NULL: none */
  void *arg;
} supervise_child_opts_t;

/* A set with no children, on loop. */
int supervise_create(supervise_t **s, uv_loop_t *loop, const supervise_opts_t *o);
/* Starts a child (its pid in *pid when pid is not NULL). A program that cannot
 * be started fails here with a message naming it, and no callback follows;
 * so does any spawn after supervise_stop (FSDP_ECANCELED). */
int supervise_spawn(supervise_t *s, const supervise_child_opts_t *o, int *pid);
/* SIGTERM to every running child's group; SIGKILL to those still running
 * grace_s seconds later (kill_cb first). grace_s <= 0: SIGKILL now, no
 * SIGTERM, no kill_cb. Once per set: later calls change nothing. */
void supervise_stop(supervise_t *s, double grace_s);
/* 1 once supervise_stop was called. */
int supervise_stopping(const supervise_t *s);
/* Children whose exit callback has not run yet. */
int supervise_running(const supervise_t *s);
/* Frees the set, which must have no running child (a broken invariant
 * otherwise). Its timer closes on the loop: run the loop once more before
 * uv_loop_close. */
void supervise_destroy(supervise_t *s);

#endif

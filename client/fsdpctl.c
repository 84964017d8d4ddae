/* fsdpctl: the command-line client of fsdp-coordinator (and of each fsdpd's
 * Node service, for rank logs). It owns the commands, their options and
 * output, and the one map from a failure to an exit code; it speaks only
 * the wire (proto/fsdp.proto through daemon/common/rpc.h) and links nothing
 * of the engine. What a job's options mean is the coordinator's business:
 * fsdpctl carries them as written (client/spec.c).
 *
 * Output: human tables (client/table.c) by default, one JSON document per
 * command with --output json (client/pbjson.c). Errors are one line on
 * stderr: "fsdpctl: <what failed>: <the server's or our message>", with the
 * fix where the client knows it. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/pbjson.h"
#include "client/spec.h"
#include "client/table.h"
#include "daemon/common/err.h"
#include "daemon/common/file.h"
#include "daemon/common/param.h"
#include "daemon/common/rpc.h"
#include "daemon/common/text.h"
#include "proto/fsdp.pb-c.h"

#define FSDPCTL_VERSION "0.1.0"
#define CTL_DEFAULT_COORDINATOR "127.0.0.1:7070"
#define CTL_DEFAULT_TIMEOUT_S 10.0
#define CTL_TIMEOUT_MAX_S 1e6 /* --timeout: at most (11.6 days) */
#define CTL_PLAINTEXT "plaintext" /* --node-tls-ca: no TLS to the nodes */
#define CTL_EXPORT_IDLE_S 300.0 /* export: the least wait for its next piece */
#define CTL_FOREVER_S 2e9 /* a stream that lasts as long as the job (rpc.h: no deadline) */
#define CTL_SVC "/fsdp.v1.Coordinator/"

/* Exit codes: documented in `fsdpctl --help` and the README; scripts rely on them. */
enum {
  CTL_EXIT_OK = 0,
  CTL_EXIT_JOB_FAILED = 1, /* watch: the job FAILED or was CANCELLED */
  CTL_EXIT_INVALID = 2,    /* usage, or the server's INVALID_ARGUMENT / FAILED_PRECONDITION */
  CTL_EXIT_NOT_FOUND = 3,
  CTL_EXIT_UNREACHABLE = 4, /* UNAVAILABLE, DEADLINE_EXCEEDED */
  CTL_EXIT_AUTH = 5,        /* UNAUTHENTICATED, PERMISSION_DENIED */
  CTL_EXIT_SERVER = 6,      /* any other failure */
};

typedef struct ctl {
  const char *coordinator;
  const char *coordinator_from; /* where it came from, for messages: an option or variable */
  const char *token_file;
  const char *tls_ca;
  const char *node_tls_ca; /* the nodes' (logs): NULL as tls_ca, CTL_PLAINTEXT none */
  double timeout_s;
  int timeout_given;      /* --timeout was on the command line */
  int json;
  const char *cmd;        /* the command running, for messages */
  rpc_client_t *client;   /* to the coordinator, made at the first call */
} ctl_t;

/* ---- failures and exit codes ------------------------------------------------- */

/* The one map from an err.h code to an exit code. */
static int ctl_exit_code(int rc) {
  switch (rc) {
  case FSDP_OK: return CTL_EXIT_OK;
  case FSDP_EINVAL: case FSDP_EFORMAT: case FSDP_ERANGE: case FSDP_ESTATE: case FSDP_ENOENT:
    return CTL_EXIT_INVALID;
  case FSDP_ENOTFOUND: return CTL_EXIT_NOT_FOUND;
  case FSDP_EUNAVAILABLE: case FSDP_ETIMEDOUT: case FSDP_EPEER: return CTL_EXIT_UNREACHABLE;
  case FSDP_EAUTH: case FSDP_EPERM: return CTL_EXIT_AUTH;
  default: return CTL_EXIT_SERVER;
  }
}

/* Writes one line to f: fmt's text, every control character in it shown
 * escaped (text_escape, '\n' too), then a newline. Each line fsdpctl
 * prints with a server's words in it (a name, a reason, an error) goes
 * through here: fsdpctl trusts no server, and a string with a terminal's
 * escape sequences in it must show as text. fsdpctl's own formats hold no
 * control character. */
static void ctl_line(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ctl_line(FILE *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  const int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  char *safe = n < 0 ? NULL : malloc(TEXT_ESCAPED_MAX((size_t)n));
  if (safe) text_escape(safe, s, (size_t)n, 0, NULL);
  fprintf(f, "%s\n", safe ? safe : "(fsdpctl: out of memory for a line of output)");
  free(safe);
  if (n >= 0) free(s);
}

/* Prints the one error line for rc (what: what failed) and returns the
 * exit code. target: the address a failed call went to (NULL: the
 * coordinator's), so the fix names where that address comes from. */
static int ctl_fail_at(const ctl_t *c, int rc, const char *target, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int ctl_fail_at(const ctl_t *c, int rc, const char *target, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  char msg[2048];
  /* one line, whatever the server wrote: its lines (one problem each, as
   * a refused job's, whose own words may hold "; ") numbered "(1) ... (2) ..." */
  const char *from = *err_msg() ? err_msg() : err_str(rc);
  int lines = 1, k = 1;
  for (const char *p = from; *p; p++) lines += (*p == '\n' || *p == '\r') && p[1] && p[1] != '\n';
  size_t m = lines > 1 ? (size_t)snprintf(msg, sizeof msg, "(1) ") : 0;
  for (const char *p = from; *p && m + 8 < sizeof msg; p++) {
    if (*p != '\n' && *p != '\r') msg[m++] = *p;
    else if (p[1] && p[1] != '\n') m += (size_t)snprintf(msg + m, sizeof msg - m, " (%d) ", ++k);
  }
  msg[m] = 0;
  const char *fix = "";
  char buf[512];
  int code = ctl_exit_code(rc);
  /* the CA the call was checked against: NULL, it spoke plaintext */
  const char *ca = !target ? c->tls_ca : c->node_tls_ca ? c->node_tls_ca : c->tls_ca;
  if (ca && !strcmp(ca, CTL_PLAINTEXT)) ca = NULL;
  /* a TLS server closes a plaintext client's connection as it opens, which
   * gRPC reports as "Socket closed": the fix is TLS, not another address */
  const int tls_wanted = code == CTL_EXIT_UNREACHABLE && !ca && strstr(msg, "Socket closed");
  /* a DEADLINE_EXCEEDED the server sent (its words in msg) is no address's fault */
  const int answered = rc == FSDP_ETIMEDOUT && !rpc_client_deadline_passed();
  if (answered) {
    fix = "";
  } else if (tls_wanted) {
    snprintf(buf, sizeof buf, "; fsdpctl spoke plaintext to %s and the connection closed as it "
             "opened: the %s may require TLS: %s", target ? target : c->coordinator,
             target ? "node" : "server",
             !target ? "pass --tls-ca FILE (the PEM file of the CA that signed its certificate)"
             : c->node_tls_ca ? "drop --node-tls-ca " CTL_PLAINTEXT " (and FSDP_NODE_TLS_CA), or "
                                "give the CA of the nodes' certificates with --node-tls-ca FILE"
                              : "pass --tls-ca FILE, or --node-tls-ca FILE for the nodes' CA");
    fix = buf;
  } else if (code == CTL_EXIT_UNREACHABLE && !target) {
    snprintf(buf, sizeof buf, "; fsdpctl used %s: check --coordinator or FSDP_COORDINATOR",
             c->coordinator);
    fix = buf;
  } else if (code == CTL_EXIT_UNREACHABLE) {
    snprintf(buf, sizeof buf, "; %s is the node's address as ListNodes gives it (fsdpctl nodes)%s",
             target, ca ? "; fsdpctl spoke TLS to it: a node whose fsdpd serves without "
                          "--tls-cert needs --node-tls-ca " CTL_PLAINTEXT
                        : "");
    fix = buf;
  } else if (rc == FSDP_EAUTH && target) { /* a node: it takes a log ticket, never a token */
    fix = "; the node refused the coordinator's log ticket: run the command again for a fresh one";
  } else if (rc == FSDP_EAUTH) {
    fix = c->token_file ? "; is --token-file (or FSDP_TOKEN_FILE) this cluster's user token?"
                        : "; give the cluster's user token with --token-file FILE or FSDP_TOKEN_FILE";
  }
  ctl_line(stderr, "fsdpctl: %s: %s%s", what, msg, fix);
  return code;
}
#define ctl_fail(c, rc, ...) ctl_fail_at(c, rc, NULL, __VA_ARGS__)

/* A usage error: names the option and where help is. */
static int ctl_usage(const ctl_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ctl_usage(const ctl_t *c, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (c->cmd)
    fprintf(stderr, "fsdpctl %s: %s; see fsdpctl %s --help\n", c->cmd, what, c->cmd);
  else
    fprintf(stderr, "fsdpctl: %s; see fsdpctl --help\n", what);
  return CTL_EXIT_INVALID;
}

/* ---- options ------------------------------------------------------------------ */

/* Matches argv[*i] against --name (its value the next word) or --name=VALUE.
 * 1: matched, *val set, *i on the last word used; 0: another option; -1: the
 * value is missing (a usage error was printed). */
static int ctl_opt(const ctl_t *c, int argc, char **argv, int *i, const char *name,
                   const char **val) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n)) return 0;
  if (a[n] == '=') {
    *val = a + n + 1;
    return 1;
  }
  if (a[n]) return 0;
  if (*i + 1 >= argc) {
    ctl_usage(c, "%s needs a value", name);
    return -1;
  }
  *val = argv[++*i];
  return 1;
}

/* A whole number from min to max (the range the message states). */
static int ctl_uint(const ctl_t *c, const char *opt, const char *s, unsigned long min,
                    unsigned long max, unsigned long *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (!*s || *end || errno || v < min || v > max || *s == '-')
    return ctl_usage(c, "%s %s: not a whole number from %lu to %lu", opt, s, min, max), -1;
  *out = v;
  return 0;
}

/* The options every command takes (before or after its name). 1: consumed,
 * 0: not one of them, -1: bad (printed). */
static int ctl_global_opt(ctl_t *c, int argc, char **argv, int *i) {
  const char *v;
  int r;
  if ((r = ctl_opt(c, argc, argv, i, "--coordinator", &v)))
    return r < 0 ? -1 : (c->coordinator = v, c->coordinator_from = "--coordinator", 1);
  if ((r = ctl_opt(c, argc, argv, i, "--token-file", &v))) return r < 0 ? -1 : (c->token_file = v, 1);
  if ((r = ctl_opt(c, argc, argv, i, "--tls-ca", &v))) return r < 0 ? -1 : (c->tls_ca = v, 1);
  if ((r = ctl_opt(c, argc, argv, i, "--node-tls-ca", &v)))
    return r < 0 ? -1 : (c->node_tls_ca = v, 1);
  if ((r = ctl_opt(c, argc, argv, i, "--timeout", &v))) {
    if (r < 0) return -1;
    char *end;
    double t = strtod(v, &end);
    if (!*v || *end || !(t > 0) || t > CTL_TIMEOUT_MAX_S)
      return ctl_usage(c, "--timeout %s: give seconds, more than 0 and at most %.0f", v,
                       CTL_TIMEOUT_MAX_S), -1;
    c->timeout_s = t, c->timeout_given = 1;
    return 1;
  }
  if ((r = ctl_opt(c, argc, argv, i, "--output", &v)) || (r = ctl_opt(c, argc, argv, i, "-o", &v))) {
    if (r < 0) return -1;
    if (!strcmp(v, "json")) c->json = 1;
    else if (!strcmp(v, "table")) c->json = 0;
    else return ctl_usage(c, "--output %s: give table or json", v), -1;
    return 1;
  }
  if (!strncmp(argv[*i], "--token", 7) && strncmp(argv[*i], "--token-file", 12))
    return ctl_usage(c, "%s: there is no such option: a token is read from a file (--token-file "
                     "FILE or FSDP_TOKEN_FILE), never given on the command line, where ps shows it",
                     argv[*i]), -1;
  return 0;
}

static int ctl_unknown(const ctl_t *c, const char *arg) {
  if (arg[0] == '-' && arg[1]) return ctl_usage(c, "unknown option %s", arg);
  return ctl_usage(c, "unexpected argument \"%s\"", arg);
}

/* ---- calls ---------------------------------------------------------------------- */

#define CTL_CA_MAX (1u << 20) /* the longest CA file the RPC layer reads */

/* --tls-ca (or --node-tls-ca: opt), checked before connecting: gRPC takes a file that holds no CA
 * certificate (empty, DER, a key) without a word, then fails every
 * handshake, which reads as UNAVAILABLE ("check --coordinator"). The check
 * is a sanity check, not a parse: readable, not empty, a PEM certificate
 * block in it. FSDP_EINVAL (a usage error, exit 2) naming the file. */
static int ctl_check_ca(const char *path, const char *opt) {
  const char *fix = strcmp(opt, "--tls-ca")
                        ? "give the PEM file of the CA that signed the nodes' certificates, or "
                          CTL_PLAINTEXT
                        : "give the PEM file of the CA that signed the coordinator's certificate";
  static const char begin[] = "-----BEGIN CERTIFICATE-----", end[] = "-----END CERTIFICATE-----";
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return err_set(FSDP_EINVAL, "%s %s: cannot open it (%s); %s", opt, path, strerror(errno), fix);
  struct stat st = {0};
  if (fstat(fd, &st)) st.st_mode = S_IFIFO; /* never so: then refused as below */
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISDIR(st.st_mode)) {
    close(fd); /* a pipe read here would be empty when gRPC reads it again */
    return err_set(FSDP_EINVAL, "%s %s: not a regular file (%s); %s", opt, path,
                   S_ISDIR(st.st_mode) ? "a directory" : "a pipe or socket", fix);
  }
  char *buf = malloc(CTL_CA_MAX + 1);
  size_t n = 0;
  ssize_t r = 1;
  while (buf && n <= CTL_CA_MAX && (r = read(fd, buf + n, CTL_CA_MAX + 1 - n)) != 0) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    n += (size_t)r;
  }
  const int e = errno;
  close(fd);
  int rc = 0;
  const char *b;
  if (!buf) rc = err_set(FSDP_ENOMEM, "%s %s: out of memory", opt, path);
  else if (r < 0) rc = err_set(FSDP_EINVAL, "%s %s: cannot read it (%s); %s", opt, path, strerror(e), fix);
  else if (n > CTL_CA_MAX)
    rc = err_set(FSDP_EINVAL, "%s %s: longer than %u bytes, too long for a CA file; %s", opt, path,
                 CTL_CA_MAX, fix);
  else if (!n) rc = err_set(FSDP_EINVAL, "%s %s: the file is empty; %s", opt, path, fix);
  else if (!(b = memmem(buf, n, begin, sizeof begin - 1)))
    rc = err_set(FSDP_EINVAL, "%s %s: no PEM certificate in it (no \"%s\" line: a key, a DER "
                 "file or another file?); %s", opt, path, begin, fix);
  else if (!memmem(b, n - (size_t)(b - buf), end, sizeof end - 1))
    rc = err_set(FSDP_EINVAL, "%s %s: a certificate without its \"%s\" line (cut short?); %s",
                 opt, path, end, fix);
  free(buf);
  return rc;
}

static int ctl_connect(ctl_t *c) {
  if (c->client) return 0;
  /* a port out of range is the user's to fix (gRPC would dial 99999 - 65536) */
  int rc = rpc_target_check(c->coordinator);
  if (rc) return err_wrap(rc, "%s", c->coordinator_from);
  if ((rc = c->tls_ca ? ctl_check_ca(c->tls_ca, "--tls-ca") : 0)) return rc;
  /* A coordinator that stops answering under a stream (frozen, its host
   * gone) is noticed only by the keepalive ping going unanswered
   * (rpc_client.c): pinged every --timeout/2 at most, a watch finds it
   * gone within --timeout, not FSDP_RPC_KEEPALIVE_S twice over (60 s), and
   * gives up --timeout later (ctl_follow_again). The servers take pings a
   * second apart. */
  const double half = c->timeout_s / 2;
  const int64_t ka = param_rpc_keepalive_s();
  rpc_client_opts_t o = {.target = c->coordinator, .token_file = c->token_file, .tls_ca_file = c->tls_ca,
                         .keepalive_s = half < 1 ? 1 : half < (double)ka ? (int)(half + 0.999) : 0};
  return rpc_client_create(&c->client, &o);
}

/* A unary call to the coordinator; method: its name after the service. */
static int ctl_call(ctl_t *c, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *reply_desc, void *reply) {
  int rc = ctl_connect(c);
  if (rc) return rc;
  char path[128];
  snprintf(path, sizeof path, CTL_SVC "%s", method);
  return rpc_client_call(c->client, path, req, reply_desc, (ProtobufCMessage **)reply, c->timeout_s);
}

static void ctl_free(void *m) {
  if (m) protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- a server that went away ------------------------------------------------------ */

/* The commands that last as long as a job (watch, events --follow, logs
 * --follow) outlive a restart of the server they follow: a call that finds
 * it unreachable is tried again after ctl_retry_wait, 0.2 s doubling to
 * 1.6 s by tries (0: the first), on new channels (the coordinator's, and
 * other: the node's, or NULL): one that failed to connect sits in gRPC's
 * reconnect backoff (1 s, growing to 2 min), failing every call without
 * trying, and a watch went on failing for 8 s after the coordinator was
 * back (rpc_client_reconnect). */
static void ctl_retry_wait(ctl_t *c, rpc_client_t *other, int tries) {
  rpc_client_reconnect(c->client); /* failing, it keeps the channel it has */
  rpc_client_reconnect(other);
  const long ms = 200L << (tries < 3 ? tries : 3);
  nanosleep(&(struct timespec){ms / 1000, ms % 1000 * 1000000L}, NULL);
}

static double ctl_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

#define CTL_AWAY_SAY_S 30.0 /* a follower waiting on a server says so again this often */

/* How long a server has been away from a follower: since (0: it is not),
 * the tries since, and when that was last said. What it follows: the
 * coordinator, or a node through other, given up on after limit_s of one
 * outage (0: never). A follower calls ctl_away_back whenever a call
 * succeeds. */
typedef struct ctl_away {
  const char *server;  /* for messages: NULL, the coordinator */
  rpc_client_t *other; /* the node's channel, made again at each try too */
  double limit_s;
  double since, said;
  int tries;
} ctl_away_t;

static void ctl_away_back(ctl_away_t *a) { a->since = a->said = 0, a->tries = 0; }

/* After a follower's call failed with *rc: 1 when it should try again (the
 * server unreachable or the call cancelled by it, not yet for limit_s
 * since the first failure of this
 * outage), said on stderr ("fsdpctl: <what> broke (<why>); <then>") at the
 * first try and every CTL_AWAY_SAY_S after, and waited for; else 0, *rc
 * the failure to report. */
static int ctl_follow_again(ctl_t *c, ctl_away_t *a, int *rc, const char *what, const char *then) {
  /* a server stopping cancels the calls in flight (CANCELLED): fsdpctl
   * cancels none of its own, so that is the server going away too */
  if (ctl_exit_code(*rc) != CTL_EXIT_UNREACHABLE && *rc != FSDP_ECANCELED) return 0;
  const double now = ctl_now_s();
  if (!a->since) {
    a->since = now, a->tries = 0;
  } else if (a->limit_s && now - a->since >= a->limit_s) {
    /* err_wrap: err_msg() is the buffer err_set would write */
    *rc = err_wrap(*rc, "%s stayed unreachable for %.0f s", a->server ? a->server
                   : "the coordinator", a->limit_s);
    return 0;
  }
  if (!a->tries || now - a->said >= CTL_AWAY_SAY_S) {
    if (a->tries)
      ctl_line(stderr, "fsdpctl: %s broke %.0f s ago, still (%s); %s", what, now - a->since,
               err_msg(), then);
    else
      ctl_line(stderr, "fsdpctl: %s broke (%s); %s", what, err_msg(), then);
    a->said = now;
  }
  ctl_retry_wait(c, a->other, a->tries++);
  return 1;
}

/* Whether everything written to stdout so far got there: a full disk or a
 * broken pipe must not pass for a whole listing (exit 0). The first failure
 * is printed, once; later checks only return its exit code. */
static int ctl_stdout_failed;
static int ctl_stdout_check(const ctl_t *c) {
  if (ctl_stdout_failed) return CTL_EXIT_SERVER;
  errno = 0;
  if (!fflush(stdout) && !ferror(stdout)) return CTL_EXIT_OK;
  ctl_stdout_failed = 1;
  const int e = errno ? errno : EIO; /* ferror without a failing flush: errno is gone */
  fprintf(stderr, "fsdpctl%s%s: writing to stdout: %s; the output is incomplete: check where "
          "stdout goes (a full disk, a closed pipe)\n", c->cmd ? " " : "", c->cmd ? c->cmd : "",
          strerror(e));
  return CTL_EXIT_SERVER;
}

/* One JSON document on stdout (indent: 0 for one line). Returns an exit code.
 * In ASCII alone, as a terminal may show it: jansson escapes C0 controls
 * and, with JSON_ENSURE_ASCII, every other code point (C1, bidi) as \uXXXX,
 * and DEL, which it leaves, is escaped here (the same string to a parser). */
static int ctl_json(const ctl_t *c, json_t *j, int indent) {
  if (!j) return ctl_fail(c, FSDP_ENOMEM, "%s: JSON output", c->cmd);
  char *s = json_dumps(j, JSON_INDENT(indent) | JSON_REAL_PRECISION(10) |
                              JSON_COMPACT * !indent | JSON_ENSURE_ASCII);
  json_decref(j);
  if (!s) return ctl_fail(c, FSDP_ENOMEM, "%s: JSON output", c->cmd);
  for (const char *p = s; *p; p++)
    if (*p == 0x7f) fputs("\\u007f", stdout);
    else putchar(*p);
  putchar('\n');
  free(s);
  return ctl_stdout_check(c);
}

/* A rank's step, loss and tokens/s (a job's progress: the last two) as
 * JSON says a figure none reported (unreported, proto/fsdp.proto): null, as
 * tables say "-". Returns o. */
static const char *const ctl_figures[] = {"step", "loss", "tokens_per_s", NULL};
static json_t *ctl_json_none(json_t *o, int none, const char *const *fields) {
  for (; o && none && *fields; fields++) json_object_set_new(o, *fields, json_null());
  return o;
}

/* A repeated message field as one JSON array. */
static int ctl_json_list(const ctl_t *c, void *const *items, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < n; i++)
    if (json_array_append_new(a, pbjson_message(items[i]))) json_decref(a), a = NULL;
  return ctl_json(c, a, 2);
}

static int ctl_table_out(const ctl_t *c, table_t *t) {
  if (!t) return ctl_fail(c, FSDP_ENOMEM, "%s: table", c->cmd);
  table_print(t, stdout, table_term_width());
  table_destroy(t);
  return ctl_stdout_check(c);
}

#define ENUM_NAME(d, v) (pbjson_enum_name(&(d), (v)) ? pbjson_enum_name(&(d), (v)) : "?")
#define JOB_STATE(v) ENUM_NAME(fsdp__v1__job_state__descriptor, v)

static int ctl_job_ended(int state) {
  return state == FSDP__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
         state == FSDP__V1__JOB_STATE__JOB_STATE_FAILED ||
         state == FSDP__V1__JOB_STATE__JOB_STATE_CANCELLED;
}

static void ctl_steps(char *buf, size_t n, int64_t step, int64_t total) {
  if (total > 0) snprintf(buf, n, "%lld/%lld", (long long)step, (long long)total);
  else snprintf(buf, n, "%lld", (long long)step);
}

/* The one positional JOB argument (and the options common to all). */
static int ctl_job_arg(ctl_t *c, int argc, char **argv, const char **job) {
  *job = NULL;
  for (int i = 0; i < argc; i++) {
    int r = ctl_global_opt(c, argc, argv, &i);
    if (r < 0) return CTL_EXIT_INVALID;
    if (r) continue;
    if (argv[i][0] == '-' || *job) return ctl_unknown(c, argv[i]);
    *job = argv[i];
  }
  if (!*job) return ctl_usage(c, "which job? give its id (fsdpctl jobs lists them)");
  return CTL_EXIT_OK;
}

/* The words of a command that takes one JOB and --follow (logs, events):
 * sets *job or *follow; a usage error's exit code for anything else. */
static int ctl_job_or_follow(ctl_t *c, const char *arg, const char **job, int *follow) {
  if (!strcmp(arg, "--follow") || !strcmp(arg, "-f")) *follow = 1;
  else if (arg[0] == '-' || *job) return ctl_unknown(c, arg);
  else *job = arg;
  return CTL_EXIT_OK;
}

/* ---- nodes ------------------------------------------------------------------------ */

/* "2x cpu (1 free)", one group per kind, in the order they come. */
static void ctl_devices(char *buf, size_t n, const Fsdp__V1__NodeInfo *node) {
  size_t k = 0;
  buf[0] = 0;
  for (size_t i = 0; i < node->n_devices; i++) {
    const char *kind = node->devices[i]->kind;
    int seen = 0, count = 0, free_ = 0;
    for (size_t j = 0; j < i && !seen; j++) seen = !strcmp(node->devices[j]->kind, kind);
    if (seen) continue;
    for (size_t j = i; j < node->n_devices; j++)
      if (!strcmp(node->devices[j]->kind, kind))
        count++, free_ += !*node->devices[j]->job_id && node->state == FSDP__V1__NODE_STATE__NODE_STATE_ALIVE;
    if (k < n)
      k += (size_t)snprintf(buf + k, n - k, "%s%dx %s (%d free)", k ? ", " : "", count,
                            *kind ? kind : "?", free_);
  }
  if (!node->n_devices) snprintf(buf, n, "none");
}

#define CTL_NODES_PAGES 4096 /* nodes: pages asked for at most (each under 4 MiB) */
static int ctl_nodes_table(ctl_t *c, const Fsdp__V1__NodeInfo *const *nodes, size_t nn);

static int cmd_nodes(ctl_t *c, int argc, char **argv) {
  for (int i = 0; i < argc; i++) {
    int r = ctl_global_opt(c, argc, argv, &i);
    if (r < 0) return CTL_EXIT_INVALID;
    if (!r) return ctl_unknown(c, argv[i]);
  }
  /* a page at a time: a reply holds what fits in one message */
  Fsdp__V1__ListNodesReply *page[CTL_NODES_PAGES];
  int np = 0, rc = 0;
  size_t total = 0;
  for (int64_t after = 0; np < CTL_NODES_PAGES;) {
    Fsdp__V1__ListNodesRequest req = FSDP__V1__LIST_NODES_REQUEST__INIT;
    req.after_id = after;
    Fsdp__V1__ListNodesReply *rep = NULL;
    if ((rc = ctl_call(c, "ListNodes", &req.base, &fsdp__v1__list_nodes_reply__descriptor, &rep))) break;
    page[np++] = rep;
    total += rep->n_nodes;
    if (!rep->next_after_id || !rep->n_nodes) break;
    after = rep->next_after_id;
  }
  const Fsdp__V1__NodeInfo **nodes = rc ? NULL : calloc(total + 1, sizeof *nodes);
  size_t nn = 0;
  for (int p = 0; nodes && p < np; p++)
    for (size_t i = 0; i < page[p]->n_nodes; i++) nodes[nn++] = page[p]->nodes[i];
  if (rc || !nodes) {
    rc = ctl_fail(c, rc ? rc : FSDP_ENOMEM, "listing nodes");
  } else if (c->json) {
    rc = ctl_json_list(c, (void *const *)nodes, nn);
  } else {
    rc = ctl_nodes_table(c, nodes, nn);
  }
  free(nodes);
  for (int p = 0; p < np; p++) ctl_free(page[p]);
  return rc;
}

/* fsdpctl nodes' table. */
static int ctl_nodes_table(ctl_t *c, const Fsdp__V1__NodeInfo *const *nodes, size_t nn) {
  static const char *const h[] = {"NODE", "HOST", "STATE", "ADDRESS", "HEARTBEAT", "DEVICES",
                                  "MEMORY (USED / USABLE)", "DRAINED", NULL};
  table_t *t = table_create(0, h);
  int64_t now = table_now_ms();
  for (size_t i = 0; t && i < nn; i++) {
    const Fsdp__V1__NodeInfo *n = nodes[i];
    char age[32], dev[256], used[32], total[32];
    uint64_t u = 0, tot = 0;
    for (size_t j = 0; j < n->n_devices; j++) u += n->devices[j]->used_bytes, tot += n->devices[j]->total_bytes;
    table_age(age, sizeof age, now, n->last_heartbeat_unix_ms);
    ctl_devices(dev, sizeof dev, n);
    table_bytes(used, sizeof used, u);
    table_bytes(total, sizeof total, tot);
    table_cell(t, "%s", n->node_id);
    table_cell(t, "%s", n->hostname);
    table_cell(t, "%s", ENUM_NAME(fsdp__v1__node_state__descriptor, n->state));
    table_cell(t, "%s", n->address);
    table_cell(t, "%s%s", age, n->last_heartbeat_unix_ms ? " ago" : "");
    table_cell(t, "%s", dev);
    table_cell(t, "%s / %s", used, total);
    table_cell(t, "%s", *n->drain_reason ? n->drain_reason : "-");
  }
  return ctl_table_out(c, t);
}

/* drain NODE --reason TEXT, undrain NODE: one call, the node as it is now. */
static int ctl_drain(ctl_t *c, int argc, char **argv, int undrain) {
  const char *node = NULL, *reason = "", *v;
  for (int i = 0; i < argc; i++) {
    int r = ctl_global_opt(c, argc, argv, &i);
    if (r < 0) return CTL_EXIT_INVALID;
    if (r) continue;
    if (!undrain && (r = ctl_opt(c, argc, argv, &i, "--reason", &v))) {
      if (r < 0) return CTL_EXIT_INVALID;
      reason = v;
    } else if (argv[i][0] == '-' || node) {
      return ctl_unknown(c, argv[i]);
    } else {
      node = argv[i];
    }
  }
  if (!node) return ctl_usage(c, "which node? give its id (fsdpctl nodes lists them)");
  if (!undrain && !*reason)
    return ctl_usage(c, "--reason TEXT is required: say why (it shows in fsdpctl nodes and events)");
  Fsdp__V1__DrainNodeRequest req = FSDP__V1__DRAIN_NODE_REQUEST__INIT;
  req.node_id = (char *)node;
  req.reason = (char *)reason;
  req.undrain = undrain;
  Fsdp__V1__DrainNodeReply *rep = NULL;
  int rc = ctl_call(c, "DrainNode", &req.base, &fsdp__v1__drain_node_reply__descriptor, &rep);
  if (rc) return ctl_fail(c, rc, "%s node %s", undrain ? "undraining" : "draining", node);
  if (c->json) {
    rc = rep->node ? ctl_json(c, pbjson_message(&rep->node->base), 2) : CTL_EXIT_OK;
  } else if (rep->node && *rep->node->drain_reason) {
    int jobs = 0;
    for (size_t i = 0; i < rep->node->n_devices; i++) jobs += *rep->node->devices[i]->job_id != 0;
    ctl_line(stdout, "node %s drained: %s (%d device(s) still running a job)", rep->node->node_id,
             rep->node->drain_reason, jobs);
  } else if (rep->node) {
    ctl_line(stdout, "node %s takes ranks again", rep->node->node_id);
  }
  ctl_free(rep);
  return rc;
}

static int cmd_drain(ctl_t *c, int argc, char **argv) { return ctl_drain(c, argc, argv, 0); }
static int cmd_undrain(ctl_t *c, int argc, char **argv) { return ctl_drain(c, argc, argv, 1); }

/* ---- watch ------------------------------------------------------------------------- */

/* A progress's ETA in seconds, or 0 when there is none: unknown (the
 * proto's 0), or the job has ended (a coordinator sent one for a cancelled
 * job). */
static double ctl_eta(const Fsdp__V1__JobProgress *p) {
  return ctl_job_ended(p->state) || !(p->eta_s > 0) || !isfinite(p->eta_s) ? 0 : p->eta_s;
}

static void ctl_bar(const Fsdp__V1__JobProgress *p, char *buf, size_t n) {
  enum { W = 24 };
  char steps[48], eta[32], bar[W + 3] = "";
  ctl_steps(steps, sizeof steps, p->step, p->total_steps);
  table_secs(eta, sizeof eta, ctl_eta(p)); /* "-" for none */
  if (p->total_steps > 0) {
    int64_t s = p->step < 0 ? 0 : p->step > p->total_steps ? p->total_steps : p->step;
    int fill = (int)(W * s / p->total_steps);
    bar[0] = '[';
    for (int i = 0; i < W; i++) bar[1 + i] = i < fill ? '#' : '.';
    bar[W + 1] = ']';
    bar[W + 2] = 0;
  }
  char loss[32] = "-", speed[32] = "-"; /* none reported of that step */
  if (!p->unreported)
    snprintf(loss, sizeof loss, "%.4f", p->loss), snprintf(speed, sizeof speed, "%.0f", p->tokens_per_s);
  snprintf(buf, n, "%s %-10s %s%sstep %s | loss %s | %s tok/s | ETA %s", p->job_id,
           JOB_STATE(p->state), bar, *bar ? " " : "", steps, loss, speed, eta);
}

/* Watches job to its end: 0 SUCCEEDED, 1 FAILED or CANCELLED, else the
 * failure's code. On a terminal one line redrawn in place; otherwise (or
 * with --output json) a line per message. A stream that breaks after it
 * gave a message (the coordinator restarting) is opened again, its first
 * message the job's state then, until the coordinator has stayed
 * unreachable for --timeout (ctl_follow_again); one never reached fails at
 * once. */
static int ctl_watch(ctl_t *c, const char *job) {
  int rc = ctl_connect(c);
  if (rc) return ctl_fail(c, rc, "watching job %s", job);
  Fsdp__V1__WatchJobRequest req = FSDP__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = (char *)job;
  int tty = !c->json && isatty(STDOUT_FILENO), drawn = 0, last = 0, got = 0, code = CTL_EXIT_OK;
  char line[512], safe[TEXT_ESCAPED_MAX(sizeof line)], what[128];
  snprintf(what, sizeof what, "the watch of job %s", job);
  ctl_away_t away = {.limit_s = c->timeout_s};
  for (;;) {
    rpc_stream_t *st = NULL;
    /* the stream lasts as long as the job: no deadline; a coordinator that
     * goes away ends it with UNAVAILABLE */
    /* but it is sent, and its first message (the job's state then, sent
     * at once) comes, within --timeout: a server that never answers (a port
     * that takes connections and speaks no HTTP/2, a coordinator frozen) is
     * no coordinator, however long gRPC's connect timeout (20 s) */
    rc = rpc_stream_open_idle(c->client, &st, CTL_SVC "WatchJob", &req.base, CTL_FOREVER_S,
                              c->timeout_s);
    const int opened = rc == 0;
    Fsdp__V1__JobProgress *p;
    while (opened && !code &&
           (rc = rpc_stream_next(st, &fsdp__v1__job_progress__descriptor, (ProtobufCMessage **)&p)) == 1) {
      rc = 0;
      rpc_stream_set_idle(st, 0); /* then as long as the job: a step may take an hour */
      last = p->state;
      got++, ctl_away_back(&away);
      if (c->json) {
        json_t *o = ctl_json_none(pbjson_message(&p->base), p->unreported, ctl_figures + 1);
        if (o && !ctl_eta(p)) json_object_set_new(o, "eta_s", json_null()); /* none, as "-" */
        code = ctl_json(c, o, 0); /* printed its failure: stop there */
      } else if (tty) {
        if (*p->message) fputs("\r\033[K", stdout), ctl_line(stdout, "%s", p->message);
        ctl_bar(p, line, sizeof line);
        text_escape(safe, line, strlen(line), 0, NULL); /* the job id is the server's */
        printf("\r\033[K%s", safe);
        drawn = 1;
      } else {
        ctl_bar(p, line, sizeof line);
        ctl_line(stdout, "%s%s%s", line, *p->message ? " | " : "", p->message);
      }
      if (!c->json) code = ctl_stdout_check(c);
      ctl_free(p);
    }
    if (opened) rpc_stream_close(st);
    /* a coordinator never reached is the user's to fix at once (--coordinator) */
    if (code || !rc || !got || ctl_job_ended(last)) break;
    if (drawn) putchar('\n'), drawn = 0;
    if (!ctl_follow_again(c, &away, &rc, what, "watching again")) break;
  }
  if (drawn) putchar('\n');
  if (code) return code;
  if (rc) return ctl_fail(c, rc, "watching job %s", job);
  if (!ctl_job_ended(last))
    return ctl_fail(c, err_set(FSDP_EINTERNAL, "the stream ended with the job %s, not ended; "
                               "fsdpctl status %s says where it is", JOB_STATE(last), job),
                    "watching job %s", job);
  if (!c->json && tty) printf("job %s %s\n", job, JOB_STATE(last));
  return last == FSDP__V1__JOB_STATE__JOB_STATE_SUCCEEDED ? CTL_EXIT_OK : CTL_EXIT_JOB_FAILED;
}

static int cmd_watch(ctl_t *c, int argc, char **argv) {
  const char *job;
  int rc = ctl_job_arg(c, argc, argv, &job);
  return rc ? rc : ctl_watch(c, job);
}

/* ---- submit ----------------------------------------------------------------------- */

/* The most bytes of a request id the coordinator takes (coord_impl.h's
 * coord_submit_t.request_id less its NUL). */
#define CTL_REQUEST_ID_MAX 63

/* A random idempotency key: a retried submit with it returns the first job. */
static int ctl_request_id(char *buf, size_t n) {
  unsigned char r[16];
  if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
    return err_set_errno(FSDP_EIO, errno, "getrandom (for the submit's request id)");
  for (size_t i = 0; i < sizeof r && 2 * i + 2 < n; i++) snprintf(buf + 2 * i, 3, "%02x", r[i]);
  return 0;
}

static int cmd_submit(ctl_t *c, int argc, char **argv) {
  spec_t spec = {0}, flags = {0};
  const char *file = NULL, *name = "", *given_id = NULL, *v;
  unsigned long ranks = 0, restarts = 0;
  int watch = 0, rc = 0, code = CTL_EXIT_OK, r;
  for (int i = 0; i < argc && !code; i++) {
    const char *a = argv[i];
    if ((r = ctl_global_opt(c, argc, argv, &i))) {
      if (r < 0) code = CTL_EXIT_INVALID;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--ranks", &v))) {
      if (r < 0 || ctl_uint(c, "--ranks", v, 1, RPC_SPEC_WORLD_MAX, &ranks)) code = CTL_EXIT_INVALID;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--name", &v))) {
      if (r < 0) code = CTL_EXIT_INVALID;
      else name = v;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--max-restarts", &v))) {
      if (r < 0 || ctl_uint(c, "--max-restarts", v, 0, RPC_SPEC_RESTARTS_MAX, &restarts))
        code = CTL_EXIT_INVALID;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--set", &v))) {
      if (r < 0) code = CTL_EXIT_INVALID;
      else if ((rc = spec_set_arg(&flags, v))) code = ctl_usage(c, "%s", err_msg());
    } else if ((r = ctl_opt(c, argc, argv, &i, "--request-id", &v))) {
      /* refused here as the coordinator would refuse it (text_plain), and
       * never empty: an empty id is no id, and a retry would make a second job */
      if (r < 0) code = CTL_EXIT_INVALID;
      else if (!*v)
        code = ctl_usage(c, "--request-id: empty; give the same id to every retry of one "
                         "submit (under Kubernetes, the Job's uid)");
      else if (text_plain("--request-id", v, CTL_REQUEST_ID_MAX))
        code = ctl_usage(c, "%s", err_msg());
      else given_id = v;
    } else if (!strcmp(a, "--watch")) {
      watch = 1;
    } else if (!strncmp(a, "--", 2) && a[2]) {
      /* --KEY VALUE or --KEY=VALUE: a job option, whatever its section */
      const char *eq = strchr(a, '=');
      char key[128];
      size_t kn = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
      if (kn >= sizeof key) { code = ctl_usage(c, "%s: the option name is too long", a); break; }
      memcpy(key, a + 2, kn);
      key[kn] = 0;
      if (!eq && i + 1 >= argc) { code = ctl_usage(c, "%s needs a value (--KEY VALUE)", a); break; }
      if ((rc = spec_set(&flags, "", key, eq ? eq + 1 : argv[++i]))) code = ctl_usage(c, "%s", err_msg());
    } else if (a[0] == '-' || file) {
      code = ctl_unknown(c, a);
    } else {
      file = a;
    }
  }
  if (!code && file && (rc = spec_load_file(&spec, file)))
    code = ctl_fail(c, rc, "submit");
  /* flags after the file, whatever their order on the line: they override it */
  for (size_t i = 0; !code && i < flags.n; i++)
    if ((rc = spec_set(&spec, flags.opts[i].section, flags.opts[i].key, flags.opts[i].value)))
      code = ctl_fail(c, rc, "submit");
  uint32_t world = (uint32_t)ranks;
  if (!code && !world) {
    if ((rc = spec_world_from_mesh(&spec, &world))) code = ctl_usage(c, "%s", err_msg());
    else if (!world)
      code = ctl_usage(c, "how many ranks? give --ranks N, or a mesh RxS (in the job file or --mesh)");
  }
  char request_id[CTL_REQUEST_ID_MAX + 1] = "";
  if (given_id) snprintf(request_id, sizeof request_id, "%s", given_id);
  else if (!code && (rc = ctl_request_id(request_id, sizeof request_id))) code = ctl_fail(c, rc, "submit");
  if (code) goto out;

  Fsdp__V1__Option *opts = calloc(spec.n ? spec.n : 1, sizeof *opts);
  Fsdp__V1__Option **optp = calloc(spec.n ? spec.n : 1, sizeof *optp);
  if (!opts || !optp) {
    free(opts), free(optp);
    code = ctl_fail(c, err_set(FSDP_ENOMEM, "out of memory"), "submit");
    goto out;
  }
  for (size_t i = 0; i < spec.n; i++) {
    fsdp__v1__option__init(&opts[i]);
    opts[i].section = spec.opts[i].section;
    opts[i].key = spec.opts[i].key;
    opts[i].value = spec.opts[i].value;
    optp[i] = &opts[i];
  }
  Fsdp__V1__JobSpec js = FSDP__V1__JOB_SPEC__INIT;
  js.name = (char *)name;
  js.world_size = world;
  js.n_options = spec.n;
  js.options = optp;
  js.max_restarts = (uint32_t)restarts;
  Fsdp__V1__SubmitJobRequest req = FSDP__V1__SUBMIT_JOB_REQUEST__INIT;
  req.spec = &js;
  req.request_id = request_id;
  Fsdp__V1__SubmitJobReply *rep = NULL;
  rc = ctl_call(c, "SubmitJob", &req.base, &fsdp__v1__submit_job_reply__descriptor, &rep);
  free(opts);
  free(optp);
  if (rc) {
    code = file ? ctl_fail(c, rc, "submitting the job of %s (and the command line's options)", file)
                : ctl_fail(c, rc, "submitting the job");
    goto out;
  }
  if (c->json) {
    code = ctl_json(c, pbjson_message(&rep->base), 2);
  } else {
    /* the id alone on stdout (id=$(fsdpctl submit job.conf)); the notes are for people */
    ctl_line(stdout, "%s", rep->job_id);
    /* the job exists all the same: its id must not be lost with stdout */
    if ((code = ctl_stdout_check(c))) ctl_line(stderr, "fsdpctl submit: the job is %s", rep->job_id);
    for (size_t i = 0; i < rep->n_notes; i++) ctl_line(stderr, "note: %s", rep->notes[i]);
  }
  if (watch && !code) code = ctl_watch(c, rep->job_id);
  ctl_free(rep);
out:
  spec_free(&spec);
  spec_free(&flags);
  return code;
}

/* ---- events: what status and events print ---------------------------------------------- */

#define CTL_EVENTS_POLL_MS 1000 /* events --follow: how often it asks for new ones */
#define CTL_LOGS_RESUMES 5      /* logs --follow: reopenings in a row of a node never reached */
#define CTL_JOBS_DEFAULT 1000   /* jobs: the newest this many unless --limit says */
#define CTL_JOBS_PAGES 4096     /* jobs: pages asked for at most (each under 4 MiB) */
#define CTL_STATUS_EVENTS 5     /* status: the job's latest events shown */

/* One page of events: the newest limit (after_id < 0), or those after
 * after_id (0: from the first); *rep on success. */
static int ctl_events_page(ctl_t *c, const char *job, int64_t after_id, uint32_t limit,
                           Fsdp__V1__ListEventsReply **rep) {
  Fsdp__V1__ListEventsRequest req = FSDP__V1__LIST_EVENTS_REQUEST__INIT;
  req.job_id = (char *)(job ? job : "");
  req.after_id = after_id < 0 ? 0 : after_id;
  req.follow = after_id >= 0;
  req.limit = limit;
  *rep = NULL;
  return ctl_call(c, "ListEvents", &req.base, &fsdp__v1__list_events_reply__descriptor, rep);
}

/* Prints a page (a table; header: with its header line) and moves *last to
 * its last id. JSON: one object per line when following, else one array.
 * widths: NULL, or the columns' widths kept from page to page. */
static int ctl_events_print(ctl_t *c, const Fsdp__V1__ListEventsReply *rep, int header,
                            int follow, int64_t *last, size_t *widths) {
  if (rep->n_events) *last = rep->events[rep->n_events - 1]->id;
  if (c->json && !follow) return ctl_json_list(c, (void *const *)rep->events, rep->n_events);
  if (c->json) {
    int code = CTL_EXIT_OK;
    for (size_t i = 0; i < rep->n_events && !code; i++)
      code = ctl_json(c, pbjson_message(&rep->events[i]->base), 0);
    return code;
  }
  if (!rep->n_events && !header) return CTL_EXIT_OK;
  static const char *const h[] = {"TIME", "JOB", "NODE", "KIND", "EVENT", NULL};
  static const char *const none[] = {"", "", "", "", "", NULL};
  table_t *t = table_create(0, header ? h : none);
  if (t && widths) table_keep_widths(t, widths);
  for (size_t i = 0; t && i < rep->n_events; i++) {
    const Fsdp__V1__Event *e = rep->events[i];
    char when[32] = "-";
    const time_t secs = (time_t)(e->unix_ms / 1000);
    struct tm tm;
    if (localtime_r(&secs, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    table_cell(t, "%s", when);
    table_cell(t, "%s", *e->job_id ? e->job_id : "-");
    table_cell(t, "%s", *e->node_id ? e->node_id : "-");
    table_cell(t, "%s", e->kind);
    table_cell(t, "%s", e->text);
  }
  return ctl_table_out(c, t);
}

/* *ended: whether job has ended, in the coordinator's word. Returns an
 * err.h code. */
static int ctl_job_has_ended(ctl_t *c, const char *job, int *ended) {
  Fsdp__V1__GetJobRequest req = FSDP__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)job;
  Fsdp__V1__GetJobReply *rep = NULL;
  int rc = ctl_call(c, "GetJob", &req.base, &fsdp__v1__get_job_reply__descriptor, &rep);
  if (rc) return rc;
  *ended = rep->job && ctl_job_ended(rep->job->state);
  ctl_free(rep);
  return 0;
}

/* ---- jobs, status, cancel ----------------------------------------------------------- */

static int cmd_jobs(ctl_t *c, int argc, char **argv) {
  Fsdp__V1__JobState states[16];
  size_t ns = 0;
  unsigned long limit = 0;
  int has_limit = 0;
  const char *v;
  for (int i = 0; i < argc; i++) {
    int r = ctl_global_opt(c, argc, argv, &i);
    if (r < 0) return CTL_EXIT_INVALID;
    if (r) continue;
    if ((r = ctl_opt(c, argc, argv, &i, "--state", &v))) {
      if (r < 0) return CTL_EXIT_INVALID;
      int s = pbjson_enum_value(&fsdp__v1__job_state__descriptor, v);
      if (s == FSDP__V1__JOB_STATE__JOB_STATE_RESTARTING)
        return ctl_usage(c, "--state %s: no job is ever in it: a job waiting to restart is PENDING, "
                         "its reason \"restarting after attempt failed (...)\"", v);
      if (s <= 0)
        return ctl_usage(c, "--state %s: give PENDING, RUNNING, SUCCEEDED, FAILED or CANCELLED", v);
      if (ns == sizeof states / sizeof states[0]) return ctl_usage(c, "--state: too many");
      states[ns++] = (Fsdp__V1__JobState)s;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--limit", &v))) {
      if (r < 0 || ctl_uint(c, "--limit", v, 0, UINT32_MAX, &limit)) return CTL_EXIT_INVALID;
      has_limit = 1;
    } else {
      return ctl_unknown(c, argv[i]);
    }
  }
  /* pages, newest first, until the limit is reached or none is left: a
   * reply holds what fits in one message; --limit 0: every job */
  if (!has_limit) limit = CTL_JOBS_DEFAULT;
  else if (!limit) limit = UINT32_MAX;
  Fsdp__V1__ListJobsReply *page[CTL_JOBS_PAGES];
  int np = 0, rc = 0;
  size_t got = 0;
  for (int64_t before = 0; np < CTL_JOBS_PAGES && got < limit;) {
    Fsdp__V1__ListJobsRequest req = FSDP__V1__LIST_JOBS_REQUEST__INIT;
    req.states = states;
    req.n_states = ns;
    req.limit = (uint32_t)(limit - got);
    req.before_id = before;
    Fsdp__V1__ListJobsReply *rep = NULL;
    if ((rc = ctl_call(c, "ListJobs", &req.base, &fsdp__v1__list_jobs_reply__descriptor, &rep))) break;
    page[np++] = rep;
    got += rep->n_jobs;
    if (!rep->next_before_id || !rep->n_jobs) break;
    before = rep->next_before_id;
  }
  /* oldest first: the last page's jobs, then the one before's, ... */
  const Fsdp__V1__Job **jobs = rc ? NULL : calloc(got + 1, sizeof *jobs);
  size_t n = 0;
  for (int p = np - 1; jobs && p >= 0; p--)
    for (size_t i = 0; i < page[p]->n_jobs; i++) jobs[n++] = page[p]->jobs[i];
  int code = CTL_EXIT_OK;
  if (rc) {
    code = ctl_fail(c, rc, "listing jobs");
  } else if (!jobs) {
    code = ctl_fail(c, FSDP_ENOMEM, "listing jobs");
  } else if (c->json) {
    /* ListJobs leaves each spec's options out (pages stay small): an empty
     * "options" would read as a job without options, so the listing has
     * none; fsdpctl status JOB -o json has them */
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) {
      json_t *o = pbjson_message(&jobs[i]->base);
      json_object_del(json_object_get(o, "spec"), "options");
      if (json_array_append_new(a, o)) json_decref(a), a = NULL;
    }
    code = ctl_json(c, a, 2);
  } else {
    static const char *const h[] = {"JOB", "NAME", "STATE", "STEP", "RESTARTS", "AGE", "REASON", NULL};
    table_t *t = table_create(1u << 4, h);
    int64_t now = table_now_ms();
    for (size_t i = 0; t && i < n; i++) {
      const Fsdp__V1__Job *j = jobs[i];
      char steps[48], age[32];
      ctl_steps(steps, sizeof steps, j->step, j->total_steps);
      table_age(age, sizeof age, now, j->submitted_unix_ms);
      table_cell(t, "%s", j->job_id);
      table_cell(t, "%s", j->spec && *j->spec->name ? j->spec->name : "-");
      table_cell(t, "%s", JOB_STATE(j->state));
      table_cell(t, "%s", steps);
      table_cell(t, "%u", j->restarts);
      table_cell(t, "%s", age);
      table_cell(t, "%s", *j->reason ? j->reason : "-");
    }
    code = ctl_table_out(c, t);
  }
  free(jobs);
  for (int p = 0; p < np; p++) ctl_free(page[p]);
  return code;
}

/* A job's own fields as a two-column table without headers. */
static table_t *ctl_job_table(const Fsdp__V1__Job *j) {
  static const char *const h[] = {"", "", NULL};
  table_t *t = table_create(0, h);
  if (!t) return NULL;
  int64_t now = table_now_ms();
  char buf[64];
  table_cell(t, "job"), table_cell(t, "%s", j->job_id);
  table_cell(t, "name"), table_cell(t, "%s", j->spec && *j->spec->name ? j->spec->name : "-");
  table_cell(t, "state"), table_cell(t, "%s", JOB_STATE(j->state));
  table_cell(t, "reason"), table_cell(t, "%s", *j->reason ? j->reason : "-");
  ctl_steps(buf, sizeof buf, j->step, j->total_steps);
  table_cell(t, "step"), table_cell(t, "%s", buf);
  table_cell(t, "ranks"), table_cell(t, "%u", j->spec ? j->spec->world_size : 0);
  table_cell(t, "attempt"), table_cell(t, "%u (restarts %u of %u)", j->attempt, j->restarts,
                                      j->spec ? j->spec->max_restarts : 0);
  if (*j->previous_attempt) table_cell(t, "before"), table_cell(t, "%s", j->previous_attempt);
  table_age(buf, sizeof buf, now, j->submitted_unix_ms);
  table_cell(t, "submitted"), table_cell(t, "%s%s", buf, j->submitted_unix_ms ? " ago" : "");
  table_age(buf, sizeof buf, now, j->started_unix_ms);
  table_cell(t, "started"), table_cell(t, "%s%s", buf, j->started_unix_ms ? " ago" : "");
  table_age(buf, sizeof buf, now, j->ended_unix_ms);
  table_cell(t, "ended"), table_cell(t, "%s%s", buf, j->ended_unix_ms ? " ago" : "");
  table_cell(t, "checkpoint");
  if (j->last_checkpoint_step) table_cell(t, "step %lld", (long long)j->last_checkpoint_step);
  else table_cell(t, "none");
  return t;
}

static int cmd_status(ctl_t *c, int argc, char **argv) {
  const char *job;
  int rc = ctl_job_arg(c, argc, argv, &job);
  if (rc) return rc;
  Fsdp__V1__GetJobRequest req = FSDP__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)job;
  Fsdp__V1__GetJobReply *rep = NULL;
  if ((rc = ctl_call(c, "GetJob", &req.base, &fsdp__v1__get_job_reply__descriptor, &rep)))
    return ctl_fail(c, rc, "job %s", job);
  if (!rep->job) {
    ctl_free(rep);
    return ctl_fail(c, err_set(FSDP_EINTERNAL, "the coordinator answered without a job"), "job %s", job);
  }
  const Fsdp__V1__Job *j = rep->job;
  if (c->json) {
    json_t *o = pbjson_message(&j->base), *ranks = json_object_get(o, "ranks");
    for (size_t i = 0; i < j->n_ranks; i++)
      ctl_json_none(json_array_get(ranks, i), j->ranks[i]->unreported, ctl_figures);
    rc = ctl_json(c, o, 2);
    ctl_free(rep);
    return rc;
  }
  rc = ctl_table_out(c, ctl_job_table(j));
  if (!rc && j->n_ranks) {
    static const char *const h[] = {"RANK", "NODE", "DEVICE", "STATE", "STEP", "LOSS", "TOKENS/S", NULL};
    table_t *t = table_create(1u << 0 | 1u << 2 | 1u << 4 | 1u << 5 | 1u << 6, h);
    for (size_t i = 0; t && i < j->n_ranks; i++) {
      const Fsdp__V1__RankStatus *r = j->ranks[i];
      table_cell(t, "%u", r->rank);
      table_cell(t, "%s", r->node_id);
      table_cell(t, "%u", r->device);
      table_cell(t, "%s", ENUM_NAME(fsdp__v1__rank_state__descriptor, r->state));
      if (r->unreported) { /* no step of this attempt reported yet */
        for (int k = 0; k < 3; k++) table_cell(t, "-");
      } else {
        table_cell(t, "%lld", (long long)r->step);
        table_cell(t, "%.4f", r->loss);
        table_cell(t, "%.0f", r->tokens_per_s);
      }
    }
    putchar('\n');
    rc = ctl_table_out(c, t);
  }
  ctl_free(rep);
  /* its latest events, as `kubectl describe` ends (a coordinator without
   * ListEvents: none, and status is still whole) */
  Fsdp__V1__ListEventsReply *ev = NULL;
  int64_t last = 0;
  if (!rc && !ctl_events_page(c, job, -1, CTL_STATUS_EVENTS, &ev) && ev->n_events) {
    putchar('\n');
    rc = ctl_events_print(c, ev, 1, 0, &last, NULL);
  }
  ctl_free(ev);
  return rc;
}

static int cmd_cancel(ctl_t *c, int argc, char **argv) {
  const char *job = NULL, *reason = "", *v;
  int keep = 0;
  double grace = 0;
  for (int i = 0; i < argc; i++) {
    int r = ctl_global_opt(c, argc, argv, &i);
    if (r < 0) return CTL_EXIT_INVALID;
    if (r) continue;
    if ((r = ctl_opt(c, argc, argv, &i, "--reason", &v))) {
      if (r < 0) return CTL_EXIT_INVALID;
      reason = v;
    } else if (!strcmp(argv[i], "--checkpoint")) {
      keep = 1;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--grace", &v))) {
      if (r < 0) return CTL_EXIT_INVALID;
      char *end;
      grace = strtod(v, &end);
      if (end == v || *end || !(grace > 0 && grace <= 3600))
        return ctl_usage(c, "--grace %s: give seconds, more than 0 and at most 3600", v);
    } else if (argv[i][0] == '-' || job) {
      return ctl_unknown(c, argv[i]);
    } else {
      job = argv[i];
    }
  }
  if (!job) return ctl_usage(c, "which job? give its id (fsdpctl jobs lists them)");
  if (grace && !keep) return ctl_usage(c, "--grace goes with --checkpoint");
  Fsdp__V1__CancelJobRequest req = FSDP__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = (char *)job;
  req.reason = (char *)reason;
  req.checkpoint = keep;
  /* a grace asked is never 0 ms, which the coordinator takes as its default */
  req.grace_ms = grace > 0 && grace * 1000 < 1 ? 1 : (uint32_t)(grace * 1000 + 0.5);
  Fsdp__V1__CancelJobReply *rep = NULL;
  int rc = ctl_call(c, "CancelJob", &req.base, &fsdp__v1__cancel_job_reply__descriptor, &rep);
  if (rc) return ctl_fail(c, rc, "cancelling job %s", job);
  if (c->json) rc = ctl_json(c, pbjson_message(rep->job ? &rep->job->base : NULL), 2);
  else if (rep->job && keep && rep->job->state == FSDP__V1__JOB_STATE__JOB_STATE_RUNNING)
    ctl_line(stdout, "%s %s: %s (fsdpctl watch %s follows it)", rep->job->job_id,
             JOB_STATE(rep->job->state), rep->job->reason, rep->job->job_id);
  else if (rep->job && keep)
    ctl_line(stdout, "%s %s: %s", rep->job->job_id, JOB_STATE(rep->job->state), rep->job->reason);
  else if (rep->job) ctl_line(stdout, "%s %s", rep->job->job_id, JOB_STATE(rep->job->state));
  else printf("%s cancelled\n", job);
  ctl_free(rep);
  return rc;
}

static int cmd_resume(ctl_t *c, int argc, char **argv) {
  const char *job;
  int rc = ctl_job_arg(c, argc, argv, &job);
  if (rc) return rc;
  Fsdp__V1__ResumeJobRequest req = FSDP__V1__RESUME_JOB_REQUEST__INIT;
  req.job_id = (char *)job;
  Fsdp__V1__ResumeJobReply *rep = NULL;
  if ((rc = ctl_call(c, "ResumeJob", &req.base, &fsdp__v1__resume_job_reply__descriptor, &rep)))
    return ctl_fail(c, rc, "resuming job %s", job);
  if (c->json) rc = ctl_json(c, pbjson_message(rep->job ? &rep->job->base : NULL), 2);
  else if (rep->job) ctl_line(stdout, "%s %s", rep->job->job_id, JOB_STATE(rep->job->state));
  else printf("%s resumed\n", job);
  ctl_free(rep);
  return rc;
}

/* ---- memory, checkpoints ------------------------------------------------------------ */

static int cmd_memory(ctl_t *c, int argc, char **argv) {
  const char *job;
  int rc = ctl_job_arg(c, argc, argv, &job);
  if (rc) return rc;
  Fsdp__V1__GetMemoryStatsRequest req = FSDP__V1__GET_MEMORY_STATS_REQUEST__INIT;
  req.job_id = (char *)job;
  Fsdp__V1__GetMemoryStatsReply *rep = NULL;
  if ((rc = ctl_call(c, "GetMemoryStats", &req.base, &fsdp__v1__get_memory_stats_reply__descriptor, &rep)))
    return ctl_fail(c, rc, "memory of job %s", job);
  if (c->json) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < rep->n_ranks; i++)
      if (json_array_append_new(a, ctl_json_none(pbjson_message(&rep->ranks[i]->base),
                                                 rep->ranks[i]->unreported, ctl_figures)))
        json_decref(a), a = NULL;
    rc = ctl_json(c, a, 2);
    ctl_free(rep);
    return rc;
  }
  static const char *const h[] = {"RANK", "NODE", "CATEGORY", "PLANNED MiB", "CURRENT MiB",
                                  "PEAK MiB", NULL};
  table_t *t = table_create(1u << 0 | 1u << 3 | 1u << 4 | 1u << 5, h);
  const double mib = 1024.0 * 1024.0;
  /* no ranks (a job waiting to be placed): what each will hold, as planned */
  if (!rep->n_ranks && rep->n_plan)
    ctl_line(stderr, "fsdpctl: job %s has no ranks now; its plan, per rank:", job);
  for (size_t k = 0; t && !rep->n_ranks && k < rep->n_plan; k++) {
    table_cell(t, "-");
    table_cell(t, "-");
    table_cell(t, "%s", rep->plan[k]->name);
    table_cell(t, "%.1f", (double)rep->plan[k]->planned_bytes / mib);
    table_cell(t, "-");
    table_cell(t, "-");
  }
  for (size_t i = 0; t && i < rep->n_ranks; i++) {
    const Fsdp__V1__RankStatus *r = rep->ranks[i];
    for (size_t k = 0; k < r->n_memory; k++) {
      const Fsdp__V1__MemoryCategory *m = r->memory[k];
      table_cell(t, "%u", r->rank);
      table_cell(t, "%s", r->node_id);
      table_cell(t, "%s", m->name);
      if (m->planned_bytes) table_cell(t, "%.1f", (double)m->planned_bytes / mib);
      else table_cell(t, "-"); /* not planned */
      table_cell(t, "%.1f", (double)m->current_bytes / mib);
      table_cell(t, "%.1f", (double)m->peak_bytes / mib);
    }
  }
  ctl_free(rep);
  return ctl_table_out(c, t);
}

static int cmd_checkpoints(ctl_t *c, int argc, char **argv) {
  const char *job;
  int rc = ctl_job_arg(c, argc, argv, &job);
  if (rc) return rc;
  Fsdp__V1__ListCheckpointsRequest req = FSDP__V1__LIST_CHECKPOINTS_REQUEST__INIT;
  req.job_id = (char *)job;
  Fsdp__V1__ListCheckpointsReply *rep = NULL;
  if ((rc = ctl_call(c, "ListCheckpoints", &req.base, &fsdp__v1__list_checkpoints_reply__descriptor, &rep)))
    return ctl_fail(c, rc, "checkpoints of job %s", job);
  if (c->json) {
    rc = ctl_json_list(c, (void *const *)rep->checkpoints, rep->n_checkpoints);
    ctl_free(rep);
    return rc;
  }
  static const char *const h[] = {"STEP", "ATTEMPT", "STATE", "SHARDS", "SIZE", "OPENED", "DIR",
                                  NULL};
  table_t *t = table_create(1u << 0 | 1u << 1 | 1u << 4, h);
  int64_t now = table_now_ms();
  for (size_t i = 0; t && i < rep->n_checkpoints; i++) {
    const Fsdp__V1__Checkpoint *k = rep->checkpoints[i];
    char age[32];
    table_age(age, sizeof age, now, k->opened_unix_ms);
    table_cell(t, "%lld", (long long)k->step);
    table_cell(t, "%u", k->attempt);
    table_cell(t, "%s", ENUM_NAME(fsdp__v1__checkpoint_state__descriptor, k->state));
    table_cell(t, "%u/%u", k->shards_reported, k->shards_total);
    table_cell(t, "%.1f MiB", (double)k->bytes / (1 << 20));
    table_cell(t, "%s%s", age, k->opened_unix_ms ? " ago" : "");
    if (k->reason && k->reason[0]) table_cell(t, "%s (%s)", k->dir, k->reason);
    else table_cell(t, "%s", k->dir);
  }
  ctl_free(rep);
  return ctl_table_out(c, t);
}

/* ---- events ---------------------------------------------------------------------------- */

static int cmd_events(ctl_t *c, int argc, char **argv) {
  const char *job = NULL, *v;
  unsigned long limit = 0;
  int follow = 0;
  for (int i = 0; i < argc; i++) {
    int r = ctl_global_opt(c, argc, argv, &i);
    if (r < 0) return CTL_EXIT_INVALID;
    if (r) continue;
    if ((r = ctl_opt(c, argc, argv, &i, "--limit", &v))) {
      if (r < 0 || ctl_uint(c, "--limit", v, 1, 5000, &limit)) return CTL_EXIT_INVALID;
    } else if ((r = ctl_job_or_follow(c, argv[i], &job, &follow))) {
      return r;
    }
  }
  const char *what = job ? job : "the cluster";
  Fsdp__V1__ListEventsReply *rep = NULL;
  int64_t last = 0;
  int rc = ctl_events_page(c, job, -1, (uint32_t)(limit ? limit : 20 + 80 * !follow), &rep);
  if (rc) return ctl_fail(c, rc, "events of %s", what);
  size_t widths[TABLE_MAX_COLS] = {0};
  int code = ctl_events_print(c, rep, 1, follow, &last, widths);
  ctl_free(rep);
  /* --follow: new events as they come, a page at a time, until the job has
   * ended and nothing came after (without JOB: until interrupted); through a
   * coordinator restart (ctl_follow_again), asking again after the last
   * event printed, so none is printed twice or skipped */
  ctl_away_t away = {.limit_s = c->timeout_s};
  char broke[128];
  snprintf(broke, sizeof broke, "following the events of %s", what);
  for (int quiet = 0; follow && code == CTL_EXIT_OK;) {
    size_t got = 0;
    int ended = 0;
    if (!(rc = ctl_events_page(c, job, last, 1000, &rep))) {
      got = rep->n_events;
      code = ctl_events_print(c, rep, 0, 1, &last, widths);
      ctl_free(rep);
      if (!got && job && !quiet && !code) rc = ctl_job_has_ended(c, job, &ended);
    }
    if (rc) {
      char then[64];
      snprintf(then, sizeof then, "asking again after event %lld", (long long)last);
      if (ctl_follow_again(c, &away, &rc, broke, then)) continue;
      return ctl_fail(c, rc, "events of %s", what);
    }
    ctl_away_back(&away);
    if (got == 1000) continue; /* more are waiting */
    if (quiet) break;          /* the job had ended, and the last ask found nothing more */
    if (ended) {
      quiet = 1; /* once more: its last events were committed with its end */
      continue;
    }
    nanosleep(&(struct timespec){CTL_EVENTS_POLL_MS / 1000, CTL_EVENTS_POLL_MS % 1000 * 1000000L},
              NULL);
  }
  return code;
}

/* ---- export ---------------------------------------------------------------------------- */

/* Writes n bytes at off of fd, whole; errno's message on failure. */
static int ctl_pwrite_all(int fd, const uint8_t *p, size_t n, off_t off) {
  while (n) {
    ssize_t w = pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return err_set_errno(err_from_errno(w < 0 ? errno : ENOSPC), w < 0 ? errno : ENOSPC,
                                     "writing");
    p += w, n -= (size_t)w, off += w;
  }
  return 0;
}

/* The stream of ExportChunks into fd; the file's size in *total, the
 * checkpoint's step in *step. Every piece must land where the last ended
 * and the stream must end at the size it announced. */
static int ctl_export_stream(ctl_t *c, const Fsdp__V1__ExportCheckpointRequest *req, int fd,
                             uint64_t *total, int64_t *step) {
  rpc_stream_t *st = NULL;
  int rc = ctl_connect(c);
  if (!rc) rc = rpc_stream_open(c->client, &st, CTL_SVC "ExportCheckpoint", &req->base, CTL_FOREVER_S);
  /* however long the file, no piece takes longer; a piece is a whole model
   * unit read, checked and converted (gpt2-1558m's embedding: 322 MB from
   * its shards), so never less than CTL_EXPORT_IDLE_S on slow storage */
  if (!rc) rpc_stream_set_idle(st, c->timeout_s > CTL_EXPORT_IDLE_S ? c->timeout_s : CTL_EXPORT_IDLE_S);
  uint64_t got = 0;
  *total = 0;
  Fsdp__V1__ExportChunk *m;
  while (!rc && (rc = rpc_stream_next(st, &fsdp__v1__export_chunk__descriptor, (ProtobufCMessage **)&m)) == 1) {
    rc = 0;
    if (m->offset != got || (got && m->total_bytes != *total) || got + m->data.len > m->total_bytes)
      rc = err_set(FSDP_EFORMAT, "the coordinator sent bytes %llu..%llu of %llu after %llu: a broken "
                   "stream", (unsigned long long)m->offset,
                   (unsigned long long)(m->offset + m->data.len), (unsigned long long)m->total_bytes,
                   (unsigned long long)got);
    *total = m->total_bytes, *step = m->step;
    if (!rc) rc = ctl_pwrite_all(fd, m->data.data, m->data.len, (off_t)got);
    got += m->data.len;
    ctl_free(m);
  }
  if (!rc && (!*total || got != *total))
    rc = err_set(FSDP_EFORMAT, "the stream ended after %llu bytes of %llu",
                 (unsigned long long)got, (unsigned long long)*total);
  rpc_stream_close(st);
  return rc;
}

/* export's temporary file, removed by ctl_export_signal when SIGINT, SIGTERM
 * or SIGHUP ends fsdpctl mid-export (a static buffer and a flag: all a
 * signal handler may read). */
static char ctl_export_tmp[4096];
static volatile sig_atomic_t ctl_export_armed;

static void ctl_export_signal(int sig) {
  if (ctl_export_armed) unlink(ctl_export_tmp); /* async-signal-safe */
  raise(sig); /* SA_RESETHAND put the default back: dies of sig when this returns */
}

/* Removes the temporary on the signals that end a process (those not
 * ignored: a background job's SIGINT stays ignored). */
static void ctl_export_catch(void) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old, sa = {0};
    if (sigaction(sigs[i], NULL, &old) || old.sa_handler == SIG_IGN) continue;
    sa.sa_handler = ctl_export_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
}

/* Puts the whole temporary tmp at out. With force, rename (a file there is
 * replaced). Without, a file that appeared at out while the export ran
 * (the check before it is only advice) stays as it is, and the check is
 * atomic: renameat2's RENAME_NOREPLACE, or where the file system lacks it a
 * hard link (which never replaces) and then tmp's removal. A file system
 * with neither (vfat, some FUSE and SMB mounts) gets a check just before a
 * plain rename: not atomic, but a whole export is not thrown away. */
static int ctl_export_place(const char *tmp, const char *out, int force) {
  if (force) return file_temp_place("-o", tmp, out); /* a file is replaced; a device or FIFO not */
  if (!renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_NOREPLACE)) return 0;
  int e = errno;
  if (e == EINVAL || e == ENOSYS || e == ENOTSUP) { /* no RENAME_NOREPLACE here */
    if (!link(tmp, out)) {
      unlink(tmp);
      return 0;
    }
    e = errno;
    if (e == EPERM || e == ENOSYS || e == ENOTSUP || e == EOPNOTSUPP) { /* no hard links either */
      struct stat st;
      if (lstat(out, &st) && errno == ENOENT) {
        if (!rename(tmp, out)) return 0;
        e = errno;
      } else {
        e = EEXIST;
      }
    }
  }
  if (e == EEXIST)
    return err_set(FSDP_ESTATE, "-o %s: the file was created while the export ran and is left as it "
                   "was; remove it or choose another name and export again, or pass --force to "
                   "replace it", out);
  return err_set_errno(err_from_errno(e), e, "cannot put the export at %s (--force replaces by rename)",
                       out);
}

static int cmd_export(ctl_t *c, int argc, char **argv) {
  const char *job = NULL, *out = NULL, *v;
  Fsdp__V1__ExportCheckpointRequest req = FSDP__V1__EXPORT_CHECKPOINT_REQUEST__INIT;
  unsigned long step = 0;
  int force = 0;
  for (int i = 0; i < argc; i++) {
    int r;
    /* -o is the file here (fsdpctl's -o json is --output json) */
    if ((r = ctl_opt(c, argc, argv, &i, "-o", &v))) {
      if (r < 0) return CTL_EXIT_INVALID;
      /* fsdpctl's help calls -o --output: a format's name here is a user who
       * meant the format, not a weights file named "json" */
      if (!strcmp(v, "json") || !strcmp(v, "table"))
        return ctl_usage(c, "-o %s: after export, -o names the file to write, not the output "
                         "format: give ./%s for a file of that name, or --output %s (or -o %s "
                         "before the command) for the format", v, v, v, v);
      out = v;
      continue;
    }
    if ((r = ctl_global_opt(c, argc, argv, &i)) < 0) return CTL_EXIT_INVALID;
    if (r) continue;
    if ((r = ctl_opt(c, argc, argv, &i, "--step", &v))) {
      if (r < 0 || ctl_uint(c, "--step", v, 0, INT64_MAX, &step)) return CTL_EXIT_INVALID;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--format", &v))) {
      if (r < 0) return CTL_EXIT_INVALID;
      req.format = (char *)v;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--dtype", &v))) {
      if (r < 0) return CTL_EXIT_INVALID;
      req.dtype = (char *)v;
    } else if (!strcmp(argv[i], "--force")) {
      force = 1;
    } else if (argv[i][0] == '-' || job) {
      return ctl_unknown(c, argv[i]);
    } else {
      job = argv[i];
    }
  }
  if (!job) return ctl_usage(c, "which job? give its id (fsdpctl jobs lists them)");
  if (!out || !*out) return ctl_usage(c, "-o FILE: where to write the exported weights");
  if (!force && access(out, F_OK) == 0)
    return ctl_usage(c, "-o %s: the file exists; remove it, choose another name or pass --force", out);
  /* --force replaces a file, never a device, a FIFO or a directory (a
   * rename over /dev/null replaces the device) */
  if (force && file_output_check("-o", out, "model.safetensors"))
    return ctl_usage(c, "%s", err_msg());
  req.job_id = (char *)job;
  req.step = (int64_t)step;
  /* a temporary name beside the file, renamed once whole: an interrupted
   * export never leaves a file under the name that looks complete */
  char *tmp = ctl_export_tmp;
  if ((size_t)snprintf(tmp, sizeof ctl_export_tmp, "%s.partial-%d-XXXXXX", out, (int)getpid()) >=
      sizeof ctl_export_tmp)
    return ctl_usage(c, "-o %s: the path is too long", out);
  ctl_export_catch();
  /* a name of its own even beside one a SIGKILLed export left under this
   * PID (a container's fsdpctl always gets the same one); armed only once
   * the name is ours: a signal before that unlinks nothing */
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  int fd = mkostemp(tmp, O_CLOEXEC);
  ctl_export_armed = fd >= 0;
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (fd < 0) {
    int rc = err_set_errno(err_from_errno(errno), errno, "cannot create %s", tmp);
    return ctl_fail(c, rc, "export of job %s", job);
  }
  const mode_t mask = umask(0); /* mkostemp makes it 0600; the export is an ordinary file */
  umask(mask);
  if (fchmod(fd, 0666 & ~mask)) {
    int rc = err_set_errno(err_from_errno(errno), errno, "chmod %s", tmp);
    close(fd), unlink(tmp), ctl_export_armed = 0;
    return ctl_fail(c, rc, "export of job %s", job);
  }
  uint64_t total = 0;
  int64_t got_step = 0;
  int rc = ctl_export_stream(c, &req, fd, &total, &got_step);
  if (!rc && fsync(fd)) rc = err_set_errno(FSDP_EIO, errno, "fsync %s", tmp);
  if (close(fd) && !rc) rc = err_set_errno(FSDP_EIO, errno, "close %s", tmp);
  if (!rc) rc = ctl_export_place(tmp, out, force);
  if (rc) unlink(tmp); /* every failure: no partial file stays behind */
  ctl_export_armed = 0;
  if (rc) return ctl_fail(c, rc, "export of job %s", job);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", out);
  int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) fsync(dfd), close(dfd); /* the rename, durable */
  if (c->json) {
    json_t *j = json_pack("{s:s, s:I, s:s, s:s, s:I}", "job_id", job, "step", (json_int_t)got_step,
                          "dtype", req.dtype[0] ? req.dtype : "fp32", "file", out, "bytes",
                          (json_int_t)total);
    return ctl_json(c, j, 2);
  }
  printf("%s: step %lld of job %s, %.1f MiB (%s)\n", out, (long long)got_step, job,
         (double)total / (1 << 20), req.dtype[0] ? req.dtype : "fp32");
  return CTL_EXIT_OK;
}

/* ---- logs ------------------------------------------------------------------------------ */

/* The address of the node that runs (or ran) rank of job in attempt (0:
 * the current or last): GetJob's ranks of that attempt name the node,
 * ListNodes its address. *addr is malloc'd. */
static int ctl_rank_node(ctl_t *c, const char *job, unsigned rank, unsigned attempt, char **addr,
                         char *node, size_t n, unsigned *job_attempt) {
  *addr = NULL;
  *job_attempt = 0;
  Fsdp__V1__GetJobRequest gq = FSDP__V1__GET_JOB_REQUEST__INIT;
  gq.job_id = (char *)job;
  gq.attempt = attempt;
  Fsdp__V1__GetJobReply *gr = NULL;
  int rc = ctl_call(c, "GetJob", &gq.base, &fsdp__v1__get_job_reply__descriptor, &gr);
  if (rc) return rc;
  node[0] = 0;
  /* a coordinator older than GetJobRequest.attempt answers with the
   * current attempt's ranks: that node may hold the attempt asked for too */
  for (size_t i = 0; gr->job && i < gr->job->n_ranks; i++)
    if (gr->job->ranks[i]->rank == rank) snprintf(node, n, "%s", gr->job->ranks[i]->node_id);
  const char *state = gr->job ? JOB_STATE(gr->job->state) : "?";
  if (gr->job) *job_attempt = gr->job->attempt;
  if (!node[0]) {
    char in[32] = "";
    if (attempt) snprintf(in, sizeof in, " in attempt %u", attempt);
    rc = err_set(FSDP_ENOTFOUND, "job %s (%s) has no rank %u placed on a node%s", job, state, rank, in);
    ctl_free(gr);
    return rc;
  }
  ctl_free(gr);
  Fsdp__V1__ListNodesRequest nq = FSDP__V1__LIST_NODES_REQUEST__INIT;
  nq.node_id = node; /* that node only */
  Fsdp__V1__ListNodesReply *nr = NULL;
  if ((rc = ctl_call(c, "ListNodes", &nq.base, &fsdp__v1__list_nodes_reply__descriptor, &nr))) return rc;
  for (size_t i = 0; i < nr->n_nodes && !*addr; i++)
    if (!strcmp(nr->nodes[i]->node_id, node) && *nr->nodes[i]->address)
      *addr = strdup(nr->nodes[i]->address);
  ctl_free(nr);
  if (!*addr)
    return err_set(FSDP_ENOTFOUND, "rank %u of job %s ran on node %s, which ListNodes does not "
                   "list with an address", rank, job, node);
  return 0;
}

/* Log bytes for a terminal. A log is the job's own bytes, and piped it goes
 * out byte for byte; but what a rank prints (a sample of a byte-level
 * model, a hostile node's chunk) may hold escape sequences, so a terminal
 * is shown them as text (text_escape), tabs and newlines as they are. A
 * UTF-8 sequence cut at a chunk's end waits in held (*nheld bytes, 3 at
 * most) for the next chunk; n 0 shows what still waits. */
static void ctl_log_text(const uint8_t *d, size_t n, char held[4], size_t *nheld) {
  enum { SLICE = 4096 };
  char in[SLICE + 4], out[TEXT_ESCAPED_MAX(SLICE + 4)];
  do {
    const size_t take = n < SLICE ? n : SLICE, len = *nheld + take;
    memcpy(in, held, *nheld);
    if (take) memcpy(in + *nheld, d, take);
    size_t used = len;
    fwrite(out, 1, text_escape(out, in, len, TEXT_KEEP_NL, take ? &used : NULL), stdout);
    *nheld = len - used;
    memcpy(held, in + used, *nheld);
    d += take, n -= take;
  } while (n);
}

/* A followed log's node was unreachable: asks the coordinator where rank's
 * node is now (the attempt's ranks name the node, ListNodes its address
 * as it registered last) and, when that moved (an fsdpd restarted on
 * --listen's port 0), puts the stream's client there (*nc, and the
 * away's). The coordinator away, or the address the same: as it was. */
static void ctl_logs_renode(ctl_t *c, const char *job, unsigned rank, unsigned attempt,
                            const char *node, const char *ca, char **addr, rpc_client_t **nc,
                            ctl_away_t *away, int64_t offset) {
  char *now = NULL, id[128];
  unsigned ignored;
  if (ctl_rank_node(c, job, rank, attempt, &now, id, sizeof id, &ignored) || strcmp(id, node) ||
      !strcmp(now, *addr)) {
    free(now);
    return;
  }
  rpc_client_opts_t o = {.target = now, .tls_ca_file = ca};
  rpc_client_t *moved = NULL;
  if (rpc_client_create(&moved, &o)) {
    free(now);
    return;
  }
  ctl_line(stderr, "fsdpctl: node %s is at %s now (was %s); resuming there at byte %lld", node,
           now, *addr, offset < 0 || offset == INT64_MAX ? 0 : (long long)offset);
  rpc_client_destroy(*nc);
  *nc = away->other = moved;
  free(*addr);
  *addr = now;
}

static int cmd_logs(ctl_t *c, int argc, char **argv) {
  const char *job = NULL, *v;
  unsigned long rank = 0, attempt = 0, tail = 0;
  int follow = 0, has_tail = 0;
  for (int i = 0; i < argc; i++) {
    int r = ctl_global_opt(c, argc, argv, &i);
    if (r < 0) return CTL_EXIT_INVALID;
    if (r) continue;
    if ((r = ctl_opt(c, argc, argv, &i, "--rank", &v))) {
      if (r < 0 || ctl_uint(c, "--rank", v, 0, UINT32_MAX, &rank)) return CTL_EXIT_INVALID;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--attempt", &v))) {
      if (r < 0 || ctl_uint(c, "--attempt", v, 0, UINT32_MAX, &attempt)) return CTL_EXIT_INVALID;
    } else if ((r = ctl_opt(c, argc, argv, &i, "--tail", &v))) {
      if (r < 0 || ctl_uint(c, "--tail", v, 0, 1ul << 40, &tail)) return CTL_EXIT_INVALID;
      has_tail = 1;
    } else if ((r = ctl_job_or_follow(c, argv[i], &job, &follow))) {
      return r;
    }
  }
  if (!job) return ctl_usage(c, "which job? give its id (fsdpctl jobs lists them)");
  /* a log is the rank's bytes, not a document: JSON of it would be a
   * chunk list nobody asked for, and raw text under -o json misleads a
   * script that parses what it asked for */
  if (c->json)
    return ctl_usage(c, "--output json: a log is printed as the rank wrote it, never as JSON; "
                     "drop -o json (fsdpctl status %s -o json has the ranks' state)", job);
  char *addr, node[128];
  unsigned now_attempt;
  int rc = ctl_rank_node(c, job, (unsigned)rank, (unsigned)attempt, &addr, node, sizeof node,
                         &now_attempt);
  if (rc) return ctl_fail(c, rc, "logs of job %s rank %lu", job, rank);
  /* the nodes' CA: the coordinator's unless --node-tls-ca says */
  const char *ca = c->node_tls_ca ? c->node_tls_ca : c->tls_ca;
  if (ca && !strcmp(ca, CTL_PLAINTEXT)) ca = NULL;
  if (ca && (rc = ctl_check_ca(ca, c->node_tls_ca ? "--node-tls-ca" : "--tls-ca"))) {
    free(addr);
    return ctl_fail(c, rc, "logs of job %s rank %lu", job, rank);
  }
  /* never the user's token: the node's operator could use it at the
   * coordinator; a ticket for this rank's log there instead */
  Fsdp__V1__GetLogTicketRequest tq = FSDP__V1__GET_LOG_TICKET_REQUEST__INIT;
  tq.node_id = node, tq.job_id = (char *)job, tq.rank = (uint32_t)rank;
  Fsdp__V1__GetLogTicketReply *tr = NULL;
  if ((rc = ctl_call(c, "GetLogTicket", &tq.base, &fsdp__v1__get_log_ticket_reply__descriptor, &tr))) {
    free(addr);
    return ctl_fail(c, rc, "logs of job %s rank %lu: a ticket for node %s", job, rank, node);
  }
  rpc_client_opts_t o = {.target = addr, .tls_ca_file = ca};
  rpc_client_t *nc = NULL;
  rpc_stream_t *st = NULL;
  Fsdp__V1__GetRankLogsRequest req = FSDP__V1__GET_RANK_LOGS_REQUEST__INIT;
  req.job_id = (char *)job;
  req.rank = (uint32_t)rank;
  /* the job's attempt now, where none was asked for: a follow stays in it
   * across the node's restart, also with an fsdpd older than
   * LogChunk.attempt, which says 0 (found by helper-110: the old "latest"
   * ran on into the next attempt's log from the old byte) */
  req.attempt = (uint32_t)(attempt ? attempt : now_attempt);
  req.follow = follow;
  /* --tail 0: none of what is there (-0 would be the start): an offset
   * past the end, which fsdpd takes as the end; --follow then prints only
   * what comes */
  req.offset = !has_tail ? 0 : tail ? -(int64_t)tail : INT64_MAX;
  req.ticket = tr->ticket;
  int code = CTL_EXIT_OK;
  const int tty = isatty(STDOUT_FILENO);
  char held[4];
  size_t nheld = 0;
  /* --follow lasts until the rank's log is complete (fsdpd ends the stream
   * OK once the rank has exited and every byte is sent) or the user stops
   * it; a plain read is bounded by --timeout. A followed stream that breaks
   * with the node unreachable (its fsdpd restarting, or the connection
   * dropped while stdout was not read: a paused pager) is opened again
   * where it stopped, in the attempt it was reading (LogChunk.attempt: a
   * restarted fsdpd may run a newer one by then): once the node has
   * answered with a byte, for as long as it stays away (ctl_follow_again:
   * 0.2 s doubling to 1.6 s between tries), or until the user's --timeout
   * of one outage; a node never reached (a wrong address), a few times in
   * a row at most. One whose ticket lapsed, followed or not (fsdpd ends it
   * ABORTED past the ticket's hour, or when the node registered again with
   * a new key), is routine: opened again there with a fresh ticket, saying
   * nothing. A followed stream whose ticket the node refuses while the
   * coordinator cannot give a fresh one (it restarts) waits for the
   * coordinator, saying so once. */
  char server[160], broke[200];
  snprintf(server, sizeof server, "node %s", node);
  snprintf(broke, sizeof broke, "the log stream from node %s", node);
  if ((rc = rpc_client_create(&nc, &o))) {
    code = ctl_fail_at(c, rc, addr, "logs of job %s rank %lu from node %s", job, rank, node);
  } else {
    ctl_away_t away = {.server = server, .other = nc, .limit_s = c->timeout_given ? c->timeout_s : 0};
    int reached = 0, renode = 0;
    for (int again = 0, reopened = 0, waited = 0;; again++, reopened = 1) {
      int got = 0, trc = 0;
      /* the node was unreachable: where is it now? an fsdpd restarted on
       * --listen's port 0 registered a new address */
      if (renode) ctl_logs_renode(c, job, (unsigned)rank, req.attempt, node, ca, &addr, &nc, &away,
                                  req.offset);
      /* a stream opened again (it broke, maybe past the ticket's hour) takes
       * a fresh ticket; the coordinator away keeps the one it has */
      Fsdp__V1__GetLogTicketReply *fresh = NULL;
      if (reopened && !(trc = ctl_call(c, "GetLogTicket", &tq.base,
                                       &fsdp__v1__get_log_ticket_reply__descriptor, &fresh))) {
        ctl_free(tr);
        tr = fresh;
        req.ticket = tr->ticket;
      }
      char coord_away[512] = "";
      if (trc) snprintf(coord_away, sizeof coord_away, "%s", err_msg());
      if (!(rc = rpc_stream_open(nc, &st, "/fsdp.v1.Node/GetRankLogs", &req.base,
                                 follow ? CTL_FOREVER_S : c->timeout_s))) {
        Fsdp__V1__LogChunk *ch;
        while ((rc = rpc_stream_next(st, &fsdp__v1__log_chunk__descriptor, (ProtobufCMessage **)&ch)) == 1) {
          /* an empty chunk (where a stream from the end starts) says only where */
          if (ch->data.len && tty) ctl_log_text(ch->data.data, ch->data.len, held, &nheld);
          else if (ch->data.len) fwrite(ch->data.data, 1, ch->data.len, stdout);
          req.offset = ch->offset + (int64_t)ch->data.len, got = reached = 1;
          if (!req.attempt) req.attempt = ch->attempt; /* 0 from an older fsdpd: the latest still */
          ctl_free(ch);
          if ((code = ctl_stdout_check(c))) break;
        }
        rpc_stream_close(st);
        st = NULL;
      }
      const int lapsed = rc == FSDP_ESTALE;
      /* the node refuses the old ticket and the coordinator gave no new one */
      const int stale = follow && rc == FSDP_EAUTH && trc == FSDP_EUNAVAILABLE;
      const int gone = follow && !lapsed && !stale && ctl_exit_code(rc) == CTL_EXIT_UNREACHABLE;
      renode = gone;
      if (got || lapsed || stale) again = 0; /* it moved on, or waits on its ticket: a fresh allowance */
      if (got || !gone) ctl_away_back(&away); /* the node answered */
      if (code || (!reached && again >= CTL_LOGS_RESUMES) || (!lapsed && !stale && !gone)) break;
      const long long at = req.offset < 0 || req.offset == INT64_MAX ? 0 : req.offset;
      if (gone && reached) {
        char then[64];
        snprintf(then, sizeof then, "resuming at byte %lld", at);
        if (!ctl_follow_again(c, &away, &rc, broke, then)) break;
        continue;
      }
      if (stale && !waited++)
        ctl_line(stderr, "fsdpctl: the log ticket for node %s expired and the coordinator cannot "
                 "give a new one (%s); waiting for it, to resume at byte %lld", node, coord_away, at);
      if (got) waited = 0;
      if (lapsed && got) continue; /* at once: it was reading */
      if (gone) ctl_line(stderr, "fsdpctl: %s broke (%s); resuming at byte %lld", broke, err_msg(), at);
      ctl_retry_wait(c, nc, stale ? waited : again); /* waiting for the coordinator: its own count */
    }
    if (nheld) ctl_log_text(NULL, 0, held, &nheld); /* a character the log ended inside of */
    if (code) rc = 0; /* the failure is stdout's, printed */
    else if (rc && follow && req.offset > 0 && ctl_exit_code(rc) == CTL_EXIT_UNREACHABLE) {
      char in[32] = "";
      if (req.attempt) snprintf(in, sizeof in, " --attempt %u", req.attempt);
      code = ctl_fail_at(c, rc, addr, "logs of job %s rank %lu from node %s, followed to byte %lld "
                         "(fsdpctl logs %s --rank %lu%s reads it whole once the node is back)",
                         job, rank, node, (long long)req.offset, job, rank, in);
    } else if (rc) {
      code = ctl_fail_at(c, rc, addr, "logs of job %s rank %lu from node %s", job, rank, node);
    }
  }
  rpc_client_destroy(nc);
  ctl_free(tr);
  free(addr);
  return code;
}

/* ---- commands and help ----------------------------------------------------------------- */

typedef struct ctl_cmd {
  const char *name;
  int (*run)(ctl_t *c, int argc, char **argv);
  const char *usage;
  const char *help;
} ctl_cmd_t;

static const ctl_cmd_t ctl_cmds[] = {
    {"nodes", cmd_nodes, "nodes",
     "The cluster's nodes: state, address, age of the last heartbeat, devices by kind\n"
     "(how many, how many free), device memory used and total, why it is drained.\n"},
    {"drain", cmd_drain, "drain NODE --reason TEXT",
     "Drains a node for maintenance: no new ranks go there; jobs running there run on\n"
     "(cancel them, or wait). It stays drained, across restarts of its fsdpd and of the\n"
     "coordinator, until `fsdpctl undrain NODE`. Pending jobs say when drained nodes\n"
     "are what keeps them waiting. A coordinator given an operator token takes a drain\n"
     "only with that token (--token-file).\n"
     "  --reason TEXT   why (required; shown by fsdpctl nodes and in the events)\n"},
    {"undrain", cmd_undrain, "undrain NODE", "Lets a drained node take ranks again.\n"},
    {"submit", cmd_submit,
     "submit [JOB.conf] [--ranks N] [--name NAME] [--max-restarts N]\n"
     "              [--set section.key=value]... [--KEY VALUE]... [--request-id ID] [--watch]",
     "Submits a job: every `[section] key = value` of the job file (the INI file\n"
     "fsdp-train reads), then the flags, which override the file's key in any section.\n"
     "--KEY VALUE (or --KEY=VALUE) is any job option (fsdp-train --help lists them);\n"
     "--set section.key=value names its section. The coordinator checks every option.\n"
     "  --ranks N          ranks (world size); default: R*S of the mesh option\n"
     "  --name NAME        a name for people\n"
     "  --max-restarts N   restarts after a failure before the job fails (default 0)\n"
     "  --request-id ID    the submit's idempotency key (default: a random one): a\n"
     "                     submit with the id of one the coordinator already took\n"
     "                     gets that job, whatever its state, and makes none; give\n"
     "                     every retry of one submit the same id (a Kubernetes Job:\n"
     "                     its uid), so a retry gets the first one's job (and, with\n"
     "                     --watch, watches it). Plain UTF-8 text, 1 to 63 bytes\n"
     "  --watch            then watch it to its end (exit code as `watch`)\n"
     "Prints the job id on stdout (--output json: the whole reply), the coordinator's\n"
     "notes on stderr. Each submit carries a request id (random unless --request-id\n"
     "gives it), so the coordinator never makes two jobs of one submit.\n"},
    {"jobs", cmd_jobs, "jobs [--state S]... [--limit N]",
     "Jobs: id, name, state, step of total, restarts, age, reason (cut to the terminal).\n"
     "  --state S   only jobs in state S (PENDING, RUNNING, SUCCEEDED, FAILED,\n"
     "              CANCELLED); repeat for several. A job waiting to restart is PENDING\n"
     "  --limit N   the newest N jobs (default 1000; 0: every job); more than one\n"
     "              reply holds are asked for a page at a time\n"
     "--output json leaves out each job's spec.options (ListJobs does not carry them;\n"
     "fsdpctl status JOB -o json has them).\n"},
    {"status", cmd_status, "status JOB",
     "One job: its state and why, steps, attempts and times, then its ranks (node,\n"
     "device, state, step, loss, tokens/s), then its latest 5 events (fsdpctl events\n"
     "JOB for more).\n"},
    {"watch", cmd_watch, "watch JOB",
     "Follows a job to its end: on a terminal a progress bar redrawn in place (step of\n"
     "total, loss, tokens/s, ETA), otherwise a line per progress message (--output\n"
     "json: one JSON object per line). A stream that breaks (the coordinator restarting)\n"
     "is watched again until the coordinator has been unreachable for --timeout.\n"
     "Exits 0 when the job SUCCEEDED, 1 when it FAILED or was CANCELLED, 4 when the\n"
     "coordinator cannot be reached.\n"},
    {"memory", cmd_memory, "memory JOB",
     "Memory of each rank by category (params, grads, optimizer, activations, ...):\n"
     "the memory plan's figure, the current and the peak bytes side by side, in MiB.\n"},
    {"logs", cmd_logs, "logs JOB [--rank R] [--attempt N] [--tail BYTES] [--follow]",
     "A rank's log, read from the node that runs it (its address from ListNodes), in\n"
     "TLS as to the coordinator unless --node-tls-ca (global options) says otherwise.\n"
     "  --rank R       which rank (default 0)\n"
     "  --attempt N    which attempt, from the node that ran the rank in it (default:\n"
     "                 the latest on the node that runs or last ran it)\n"
     "  --tail BYTES   only the last BYTES bytes (0: none; with --follow, only what\n"
     "                 is written from now on)\n"
     "  --follow, -f   keep printing as the log grows, until the rank's log is complete\n"
     "                 (the rank exited) or interrupted; a stream that breaks (the\n"
     "                 node's fsdpd restarting) is opened again where it stopped, in\n"
     "                 the same attempt, at the node's address then (asked of the\n"
     "                 coordinator: a restarted fsdpd may listen on another port),\n"
     "                 however long the node is away; with a\n"
     "                 --timeout you give, until it has been unreachable that long\n"
     "                 (then exit 4)\n"
     "Piped, the log's bytes as written; on a terminal, its control characters (an\n"
     "escape sequence) shown escaped, as \\x1b, newlines and tabs as they are. Never\n"
     "JSON: --output json is refused (exit 2).\n"},
    {"cancel", cmd_cancel, "cancel JOB [--reason TEXT] [--checkpoint [--grace SECONDS]]",
     "Cancels a job: its ranks are stopped (SIGKILL: the work since its last committed\n"
     "checkpoint is lost) and its devices freed.\n"
     "  --checkpoint     keep that work: the ranks stop at their next step boundary and\n"
     "                   write a checkpoint of it, the coordinator commits it, then the\n"
     "                   job is CANCELLED, its reason naming the step kept (fsdpctl\n"
     "                   resume goes on from it). It returns at once, the job RUNNING\n"
     "                   and \"stopping\" until then (fsdpctl watch follows it). A pending\n"
     "                   job, or one without a checkpoint_dir (nothing to keep: the\n"
     "                   reason says so), is cancelled at once. A plain cancel during\n"
     "                   the stop kills the ranks at once.\n"
     "  --grace SECONDS  how long the ranks get (default 60, at most 3600): those not\n"
     "                   done by then are killed and the job CANCELLED all the same,\n"
     "                   saying no checkpoint was written\n"},
    {"resume", cmd_resume, "resume JOB",
     "Puts a FAILED or CANCELLED job back in the queue with its restarts counted from zero;\n"
     "its next attempt continues from its latest committed checkpoint.\n"},
    {"checkpoints", cmd_checkpoints, "checkpoints JOB",
     "A job's checkpoints: step, attempt, state (OPEN, COMMITTED, ABORTED), shards reported,\n"
     "size, when opened, directory (and why an aborted one was).\n"},
    {"events", cmd_events, "events [JOB] [--limit N] [--follow]",
     "The coordinator's audit log, oldest first: what happened to a job (submitted,\n"
     "placed, pending and why, attempts started and ended, ranks' exits, restarts,\n"
     "checkpoints opened, committed, aborted and removed), or without JOB to every job\n"
     "and node (registered, dead). Kept --event-retention-days (default 90).\n"
     "  --limit N      the newest N events (default 100; with --follow 20), at most 5000\n"
     "  --follow, -f   then keep printing new events as they come (every second) until\n"
     "                 the job has ended (without JOB: until interrupted), through a\n"
     "                 coordinator restart (each event once) until it has been\n"
     "                 unreachable for --timeout; --output json prints one JSON\n"
     "                 object per line\n"},
    {"export", cmd_export,
     "export JOB [--step N] [--format safetensors] [--dtype fp32|bf16] -o FILE [--force]",
     "Writes a committed checkpoint's weights as one file, streamed from the coordinator:\n"
     "safetensors with the tensor names of Hugging Face's GPT-2 (transformers loads it\n"
     "into GPT2LMHeadModel; a job starts from it with init_from). A checkpoint that is\n"
     "not as committed (its directory outside the coordinator's roots, other files than\n"
     "those committed, a damaged shard) is refused (exit 2), and marked damaged when\n"
     "its files were read.\n"
     "  --step N     which committed step (default: the latest; fsdpctl checkpoints)\n"
     "  --dtype D    fp32 (default) or bf16 (rounded to nearest even)\n"
     "  -o FILE      where to write it; written under a temporary name\n"
     "               (FILE.partial-PID-XXXXXX, removed on a failure, SIGINT or SIGTERM)\n"
     "               and renamed once whole, so FILE is never a partial file (--output\n"
     "               json still picks the output format)\n"
     "  --force      replace FILE when it exists; without it an existing FILE, even one\n"
     "               made while the export ran, is left as it is (exit 2)\n"},
};
#define CTL_NCMDS (sizeof ctl_cmds / sizeof ctl_cmds[0])

static const char ctl_globals_help[] =
    "Options of every command (before or after its name):\n"
    "  --coordinator ADDR  the coordinator (host:port or unix:PATH); default\n"
    "                      FSDP_COORDINATOR, else " CTL_DEFAULT_COORDINATOR "\n"
    "  --token-file FILE   the cluster's user token, or the operator's (drain needs\n"
    "                      it when the cluster has one; default FSDP_TOKEN_FILE);\n"
    "                      tokens are never given on the command line, where ps\n"
    "                      shows them\n"
    "  --tls-ca FILE       speak TLS, checking the coordinator against this CA (PEM;\n"
    "                      a file with no certificate in it is refused: exit 2)\n"
    "  --node-tls-ca FILE|plaintext\n"
    "                      how logs reaches the nodes' fsdpd: TLS checked against\n"
    "                      FILE, or plaintext (an fsdpd without --tls-cert, as in\n"
    "                      deploy/k8s: the log ticket, never a token, then crosses\n"
    "                      the network in the clear); default FSDP_NODE_TLS_CA,\n"
    "                      else as --tls-ca\n"
    "  --timeout SECONDS   bound on each call (default 10, at most 1000000); watch,\n"
    "                      events --follow and logs --follow last until the job ends\n"
    "                      or you stop them (watch and events --follow: until the\n"
    "                      coordinator has been unreachable this long; logs --follow:\n"
    "                      the node, only when given); export takes as long as the\n"
    "                      file needs, but gives up when no piece comes for this\n"
    "                      long (at least 300 s)\n"
    "  --output table|json human tables (default) or one JSON document (-o json;\n"
    "                      after export, -o is the file to write)\n";

static const char ctl_exit_help[] =
    "Exit codes:\n"
    "  0  success (watch, submit --watch: the job SUCCEEDED)\n"
    "  1  the job FAILED or was CANCELLED (watch, submit --watch)\n"
    "  2  invalid: a usage error, or the coordinator refused the request\n"
    "     (INVALID_ARGUMENT, FAILED_PRECONDITION: export of a checkpoint that is\n"
    "     damaged, or not the one committed, among them)\n"
    "  3  not found (no such job, rank or node)\n"
    "  4  unreachable: UNAVAILABLE or DEADLINE_EXCEEDED (check --coordinator, or\n"
    "     --tls-ca where the server requires TLS)\n"
    "  5  unauthenticated or permission denied (check --token-file)\n"
    "  6  any other failure of the server or the client (stdout that cannot be\n"
    "     written, such as a full disk: the output is not whole)\n";

static void ctl_help(FILE *out) {
  fprintf(out, "usage: fsdpctl [OPTIONS] COMMAND [ARGS]\n\n"
               "The client of fsdp-coordinator: submits, watches and stops training jobs.\n\n"
               "Commands:\n");
  for (size_t i = 0; i < CTL_NCMDS; i++) fprintf(out, "  %s\n", ctl_cmds[i].usage);
  fprintf(out, "  fsdpctl COMMAND --help   more on one command\n\n%s\n%s", ctl_globals_help,
          ctl_exit_help);
  fprintf(out, "\nEnvironment: FSDP_COORDINATOR, FSDP_TOKEN_FILE, FSDP_NODE_TLS_CA (as the\n"
               "options above),\n"
               "FSDP_LOG_LEVEL (gRPC's own log lines; fsdpctl prints only errors by default).\n");
}

/* The command line's exit code, before stdout is closed. */
static int ctl_main(ctl_t *c, int argc, char **argv) {
  c->coordinator = getenv("FSDP_COORDINATOR");
  c->coordinator_from = "FSDP_COORDINATOR";
  if (!c->coordinator || !*c->coordinator) c->coordinator = CTL_DEFAULT_COORDINATOR;
  c->token_file = getenv("FSDP_TOKEN_FILE");
  if (c->token_file && !*c->token_file) c->token_file = NULL;
  c->node_tls_ca = getenv("FSDP_NODE_TLS_CA");
  if (c->node_tls_ca && !*c->node_tls_ca) c->node_tls_ca = NULL;
  c->timeout_s = CTL_DEFAULT_TIMEOUT_S;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ctl_help(stdout);
      return CTL_EXIT_OK;
    }
    if (!strcmp(argv[i], "--version")) {
      printf("fsdpctl %s (API fsdp.v1)\n", FSDPCTL_VERSION);
      return CTL_EXIT_OK;
    }
    int r = ctl_global_opt(c, argc, argv, &i);
    if (r < 0) return CTL_EXIT_INVALID;
    if (!r) return ctl_unknown(c, argv[i]);
  }
  if (i == argc) {
    ctl_help(stderr);
    return CTL_EXIT_INVALID;
  }
  if (!strcmp(argv[i], "help")) {
    ctl_help(stdout);
    return CTL_EXIT_OK;
  }
  const ctl_cmd_t *cmd = NULL;
  for (size_t k = 0; k < CTL_NCMDS; k++)
    if (!strcmp(argv[i], ctl_cmds[k].name)) cmd = &ctl_cmds[k];
  if (!cmd) return ctl_usage(c, "unknown command \"%s\"", argv[i]);
  c->cmd = cmd->name;
  for (int k = i + 1; k < argc; k++)
    if (!strcmp(argv[k], "--help") || !strcmp(argv[k], "-h")) {
      printf("usage: fsdpctl [OPTIONS] %s\n\n%s\n%s", cmd->usage, cmd->help, ctl_globals_help);
      return CTL_EXIT_OK;
    }
  int code = cmd->run(c, argc - i - 1, argv + i + 1);
  rpc_client_destroy(c->client);
  return code;
}

int main(int argc, char **argv) {
  /* gRPC's warnings repeat what the failed call's one error line says */
  setenv("FSDP_LOG_LEVEL", "0", 0);
  ctl_t c = {0};
  int code = ctl_main(&c, argc, argv);
  /* what is still buffered, and the close itself (NFS reports there), can
   * fail: then the output is not whole, whatever the command did */
  int out = ctl_stdout_check(&c);
  if (fclose(stdout) && !out) {
    fprintf(stderr, "fsdpctl%s%s: closing stdout: %s; the output may be incomplete\n",
            c.cmd ? " " : "", c.cmd ? c.cmd : "", strerror(errno));
    out = CTL_EXIT_SERVER;
  }
  return code ? code : out;
}

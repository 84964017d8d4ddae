/* fsdp-train: trains a GPT model from a job file and/or flags, as one device,
 * or as one rank of a sharded job when fsdp-launch starts it (the launcher's
 * environment says which; daemon/comm/boot.c reads it).
 *
 *   fsdp-train [--config JOB.conf] [--KEY VALUE]...
 *
 * Started by fsdpd, it also reports every step to it (FSDP_REPORT_FD,
 * report.h). Flags override the job file whatever their order.
 *
 * SIGTERM (how fsdpd, fsdp-launch, Slurm and Kubernetes stop a process),
 * SIGINT (Ctrl-C) and SIGHUP (a closed terminal) stop the run at the next
 * step boundary, every rank after the same step, writing a checkpoint of it
 * when the job has a checkpoint_dir (SIGKILL is what ends a rank at once; a
 * second Ctrl-C too). Exit status: 0 done, 1 the run failed, 2 bad usage or
 * a bad option (the message names it), 3 its node's lease ended
 * (REPORT_EXIT_FENCED, report.h), 75 stopped when asked, before its last
 * step (JOB_EXIT_PREEMPTED: the coordinator requeues the job; the last line
 * says which step a resume goes on from). */
#include <getopt.h>
#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/crash.h"
#include "daemon/common/err.h"
#include "daemon/common/param.h"
#include "daemon/job/config.h"
#include "daemon/job/job.h"
#include "device.h"
#include "report.h"
#include "train.h"

enum { OPT_HELP = 1, OPT_CONFIG, OPT_PRINT, OPT_PARAMS, OPT_PROBE, OPT_KEY0 = 1000 };

static volatile sig_atomic_t stop_asked;

/* SIGTERM, SIGINT or SIGHUP asks the loop to stop at the step boundary.
 * Only that for SIGTERM: a job is often sent it twice (Slurm signals the
 * whole step, and the launcher passes it on), and a rank stuck in a step is
 * its supervisor's to SIGKILL after the grace. A second SIGINT is a person
 * at a terminal who does not want to wait: it ends the process at once. */
static void on_stop_signal(int sig) {
  if (sig == SIGINT && stop_asked) {
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
  }
  stop_asked = 1;
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: fsdp-train [--config JOB.conf] [--KEY VALUE]...\n"
          "Trains a GPT model on one device, or as one rank of a sharded job when started by\n"
          "fsdp-launch (fsdp-launch -n N -- fsdp-train ...). What the model and its training\n"
          "compute (GELU, LayerNorm, loss, learning-rate schedule, initialisation, data\n"
          "windows, weight decay) is written in docs/MODEL.md.\n"
          "Options (also the keys of a job file, an INI file of `key = value` lines under\n"
          "optional [section] headers):\n");
  config_print_help(out);
  fprintf(out, "  other flags:\n"
               "    --config FILE     read options from a job file, one (flags override it)\n"
               "    --print-config    check the options as a run would (but for data) and print\n"
               "                      the effective job file (the values that follow the others,\n"
               "                      the model's dimensions and fitted defaults, as `; ` comments)\n"
               "                      and exit\n"
               "    --help-params     list the FSDP_* environment tunables\n"
               "    --probe-device K  whether a rank can use devices of kind K (cpu, cuda) here:\n"
               "                      for cuda, the plugin loads and sees a GPU; exit 0 or 1\n"
               "    --help            this text\n");
}

/* Started by fsdp-launch or fsdpd (their pid in FSDP_SUPERVISOR_PID): the
 * rank gets SIGTERM when its parent dies, killed outright or crashed, and
 * stops at the next step boundary (its peers, which get it too, agree to
 * stop with it) instead of training on with no one to report to. Started
 * through a wrapper that did not exec (a shell script), the parent is the
 * wrapper: it ends with that. A supervisor already gone before the request
 * took effect (the parent is no longer the one named): nothing starts. */
static int die_with_supervisor(void) {
  const char *v = getenv(JOB_SUPERVISOR_PID_ENV);
  if (!v || !*v) return 0;
  char *end;
  const long pid = strtol(v, &end, 10);
  if (*end || pid <= 1) return 0; /* not one we set */
  const long parent = (long)getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
    fprintf(stderr, "fsdp-train: cannot ask to end with its supervisor (pid %ld): %s\n", pid,
            strerror(errno));
    return 1;
  }
  if (parent == pid && (long)getppid() != pid) {
    fprintf(stderr, "fsdp-train: its supervisor (pid %ld) is gone; not starting\n", pid);
    return 1;
  }
  return 0;
}

/* Reads the job file (--config) and the flags into c; -1 to go on, else
 * the exit status (--help and the other answers done, or a bad option). */
static int main_parse(int argc, char **argv, config_t *c, int *print) {
  int n = config_num_opts(), rc = -1, ch;
  struct option *opts = calloc((size_t)n + 6, sizeof *opts);
  if (!opts) return 1;
  for (int i = 0; i < n; i++) opts[i] = (struct option){config_opt_key(i), required_argument, NULL, OPT_KEY0 + i};
  opts[n] = (struct option){"help", no_argument, NULL, OPT_HELP};
  opts[n + 1] = (struct option){"config", required_argument, NULL, OPT_CONFIG};
  opts[n + 2] = (struct option){"print-config", no_argument, NULL, OPT_PRINT};
  opts[n + 3] = (struct option){"help-params", no_argument, NULL, OPT_PARAMS};
  opts[n + 4] = (struct option){"probe-device", required_argument, NULL, OPT_PROBE};
  const char *job = NULL;
  /* first pass: find the job file, so flags can override it in the second;
   * one only: a second one silently replaced the first */
  opterr = 0;
  while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (ch != OPT_CONFIG) continue;
    if (job) {
      fprintf(stderr, "fsdp-train: --config given twice (%s, then %s); give one job file, and "
              "its changes as flags\n", job, optarg);
      rc = 2;
      goto out;
    }
    job = optarg;
  }
  if (job && config_load_file(c, job)) {
    fprintf(stderr, "fsdp-train: %s\n", err_msg());
    rc = 2;
    goto out;
  }
  optind = 1;
  opterr = 1;
  while (rc < 0 && (ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (ch >= OPT_KEY0) {
      if (config_set(c, config_opt_key(ch - OPT_KEY0), optarg)) {
        fprintf(stderr, "fsdp-train: %s\n", err_msg());
        rc = 2;
      }
    } else if (ch == OPT_HELP) {
      usage(stdout);
      rc = 0;
    } else if (ch == OPT_PARAMS) {
      param_dump(stdout);
      rc = 0;
    } else if (ch == OPT_PROBE) { /* fsdpd asks before it offers a node's GPUs */
      char what[128];
      if (device_probe(optarg, what, sizeof what)) {
        fprintf(stderr, "fsdp-train: --probe-device %s: %s\n", optarg, err_msg());
        rc = 1;
      } else {
        printf("fsdp-train: --probe-device %s: %s\n", optarg, what);
        rc = 0;
      }
    } else if (ch == OPT_PRINT) {
      *print = 1;
    } else if (ch != OPT_CONFIG) {
      fprintf(stderr, "fsdp-train: see --help for the options\n");
      rc = 2;
    }
  }
  if (rc < 0 && optind < argc) {
    fprintf(stderr, "fsdp-train: unexpected argument \"%s\"; options are --KEY VALUE (see --help)\n",
            argv[optind]);
    rc = 2;
  }
out:
  free(opts);
  return rc;
}

int main(int argc, char **argv) {
  crash_install("fsdp-train");
  /* a gone reader of the output (a launcher killed outright, whose pipe
   * the rank's stdout is) is no reason to die: the stop it brings
   * (die_with_supervisor) still writes and commits its checkpoint, and a
   * line that finds no reader is lost (EPIPE, which nothing here treats as
   * fatal) */
  signal(SIGPIPE, SIG_IGN);
  /* a line at a time, as on a terminal: a rank's stdout and stderr go to
   * one log (fsdpd's, fsdp-launch's pipe), whose last line fsdpd reports as
   * the job's reason; fully buffered, the plan and precision lines landed
   * after the error a run failed with, and were reported instead of it */
  setvbuf(stdout, NULL, _IOLBF, 0);
  config_t c;
  config_default(&c);
  int print = 0, rc = main_parse(argc, argv, &c, &print);
  if (rc >= 0) return rc;
  /* the mesh against the world the launcher gives (one rank without one): a
   * bad option, said before planning and connecting */
  const char *ws = getenv("FSDP_WORLD_SIZE"); /* a bad one is the boot's to say (train_open) */
  const long world = ws ? strtol(ws, NULL, 10) : 1;
  const int world_ok = world >= 1 && world <= 4096;
  if (print) {
    /* checked as a run is, with its errors and exit status, but for two
     * things a job file may leave to the command that runs it: the data
     * file (--data), and, outside a launcher, the mesh's fit to a world */
    const int no_data = !c.data[0];
    if (no_data) snprintf(c.data, sizeof c.data, "-");
    rc = config_check(&c, ws && world_ok ? (int)world : 0, NULL, NULL);
    if (no_data) c.data[0] = 0;
  } else {
    rc = config_finish(&c);
    if (!rc && world_ok) rc = config_check(&c, (int)world, NULL, NULL);
  }
  if (rc) {
    fprintf(stderr, "fsdp-train: %s\n", err_msg());
    return 2;
  }
  if (print) { /* on stderr, so the output stays a job file (training prints it itself) */
    if (config_adjusted(&c)[0])
      fprintf(stderr, "fsdp-train: note: %s; set an option explicitly to choose its value\n",
              config_adjusted(&c));
    if (config_write(&c, stdout)) {
      fprintf(stderr, "fsdp-train: --print-config: %s\n", err_msg());
      return 2;
    }
    return 0;
  }
  report_t *rep; /* the node daemon's report channel, when it started us */
  if (report_open_from_env(&rep)) {
    fprintf(stderr, "fsdp-train: %s\n", err_msg());
    return 2;
  }
  struct sigaction sa = {.sa_handler = on_stop_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  if (die_with_supervisor()) {
    report_close(rep);
    return 1;
  }
  /* every step's status, each shard, and the final status after the run */
  train_hooks_t hooks = {rep ? report_metrics : NULL, rep ? report_checkpoint : NULL, rep,
                         &stop_asked, rep ? report_metrics : NULL};
  train_result_t res;
  rc = train_run_with(&c, stdout, &hooks, &res);
  report_close(rep);
  if (rc == FSDP_EPREEMPTED) {
    fprintf(stderr, "fsdp-train: %s\n", err_msg());
    return JOB_EXIT_PREEMPTED;
  }
  if (rc) {
    fprintf(stderr, "fsdp-train: %s (%s)\n", err_msg(), err_name(rc));
    return 1;
  }
  if (!res.steps_run) { /* resumed at the last step: nothing was trained or evaluated */
    printf("train: done: nothing to train: the checkpoint resumed is at step %d of %d\n",
           res.steps_done, c.steps);
    return 0;
  }
  char eval[32] = "none";
  if (!isnan(res.eval_loss)) snprintf(eval, sizeof eval, "%.4f", res.eval_loss);
  else if (c.eval_fraction == 0) snprintf(eval, sizeof eval, "none (eval_fraction 0)");
  printf("train: done: %d steps, loss %.4f -> %.4f, eval %s, %.0f tokens/s, %.1f s\n",
         res.steps_done, res.first_loss, res.last_loss, eval, res.tokens_per_s, res.seconds);
  return 0;
}

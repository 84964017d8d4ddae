/* log: formatting and filtering of log lines (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "param.h"

static const char *const log_level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

int log_enabled(int level) { return level <= param_log_level(); }

/* Writes s as the inside of a JSON string. */
static void log_json_str(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
}

/* 1 when stderr is systemd's journal (JOURNAL_STREAM names its device and
 * inode, as systemd.exec(5) says to check), which stamps each line itself;
 * elsewhere (a file, a terminal, a pipe to fsdp-launch or a batch system)
 * a plain line starts with the time, UTC to the millisecond. Decided once:
 * stderr is not replaced while a program runs. */
static int log_to_journal(void) {
  static int journal = -1; /* a benign race: every thread finds the same */
  if (journal < 0) {
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    journal = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && !fstat(2, &st) &&
              (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
  }
  return journal;
}

void log_write(int level, const char *subsys, const char *file, int line, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *lvl = log_level_names[level < 0 ? 0 : level > 3 ? 3 : level];
  if (param_log_json()) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    flockfile(stderr);
    fprintf(stderr, "{\"ts\":%lld.%03ld,\"level\":\"%s\",\"subsys\":\"", (long long)ts.tv_sec,
            ts.tv_nsec / 1000000, lvl);
    log_json_str(stderr, subsys);
    fprintf(stderr, "\",\"src\":\"%s:%d\",\"msg\":\"", file, line);
    log_json_str(stderr, msg);
    fputs("\"}\n", stderr);
    funlockfile(stderr);
  } else if (!log_to_journal()) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ldZ fsdp %s %s: %s\n", when, ts.tv_nsec / 1000000, lvl, subsys, msg);
  } else {
    fprintf(stderr, "fsdp %s %s: %s\n", lvl, subsys, msg);
  }
}

void log_assert_fail(const char *cond, const char *file, int line) {
  fprintf(stderr, "fsdp ASSERT %s:%d: %s\n", file, line, cond);
  abort();
}

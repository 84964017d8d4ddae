/* Unit tests of log lines (daemon/common/log.h): a plain line starts with
 * its time (UTC, to the millisecond) unless stderr is systemd's journal,
 * which stamps lines itself. Criterion runs each test in a process of its
 * own, so each decides afresh where its stderr goes. */
#include <criterion/criterion.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/common/log.h"
#include "tests/unit/testutil.h"

/* stderr into a file of the test's; JOURNAL_STREAM as given (NULL: unset,
 * "self": the file's own device and inode); one line logged; the file's
 * text in out. */
static void log_one(const char *journal, char *out, size_t len) {
  char *path = tu_path("stderr.log");
  cr_assert_not_null(freopen(path, "w", stderr));
  struct stat st;
  cr_assert_eq(fstat(2, &st), 0);
  char js[64];
  snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
  if (!journal) unsetenv("JOURNAL_STREAM");
  else setenv("JOURNAL_STREAM", strcmp(journal, "self") ? journal : js, 1);
  LOG_WARN("test", "hello %d", 42);
  fflush(stderr);
  char *text = tu_slurp(path, NULL);
  snprintf(out, len, "%s", text);
  free(text), free(path);
}

/* The line's time, from its "YYYY-MM-DDTHH:MM:SS.mmmZ " prefix. */
static double stamped(const char *line) {
  regex_t re;
  cr_assert_eq(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                       "fsdp WARN test: hello 42\n$", REG_EXTENDED | REG_NOSUB), 0);
  const int ok = !regexec(&re, line, 0, NULL, 0);
  regfree(&re);
  cr_assert(ok, "not a stamped line: \"%s\"", line);
  struct tm tm = {0};
  cr_assert_not_null(strptime(line, "%Y-%m-%dT%H:%M:%S", &tm));
  return (double)timegm(&tm) + atoi(line + 20) / 1000.0;
}

Test(log, a_plain_line_starts_with_its_time_in_utc) {
  char out[4096];
  const double before = (double)time(NULL);
  log_one(NULL, out, sizeof out);
  const double t = stamped(out);
  cr_expect(t >= before - 1 && t <= (double)time(NULL) + 1, "stamped %.3f, now %.0f", t, before);
}

Test(log, a_line_to_the_journal_is_left_for_it_to_stamp) {
  char out[4096];
  log_one("self", out, sizeof out);
  cr_expect_str_eq(out, "fsdp WARN test: hello 42\n");
}

Test(log, a_journal_stream_that_is_not_stderr_stamps_as_elsewhere) {
  char out[4096];
  log_one("1:2", out, sizeof out); /* fsdpd's ranks inherit its JOURNAL_STREAM, not its stderr */
  stamped(out);
}

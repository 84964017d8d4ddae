/* log: one line per event, with a level and a subsystem (after NCCL's INFO(subsys, ...)).
 *
 * Lines go to stderr as `fsdp <LEVEL> <subsys>: message`, or as one JSON object
 * per line with FSDP_LOG_JSON=1 (for log collectors). FSDP_LOG_LEVEL picks the
 * most verbose level printed. Progress lines of a training run are not log lines:
 * they go to stdout, where a user or a script reads them. */
#ifndef FSDP_LOG_H
#define FSDP_LOG_H

enum { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN = 1, LOG_LEVEL_INFO = 2, LOG_LEVEL_DEBUG = 3 };

void log_write(int level, const char *subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int log_enabled(int level);

#define LOG_AT(level, subsys, ...)                                                  \
  do {                                                                              \
    if (log_enabled(level)) log_write(level, subsys, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define LOG_ERROR(subsys, ...) LOG_AT(LOG_LEVEL_ERROR, subsys, __VA_ARGS__)
#define LOG_WARN(subsys, ...) LOG_AT(LOG_LEVEL_WARN, subsys, __VA_ARGS__)
#define LOG_INFO(subsys, ...) LOG_AT(LOG_LEVEL_INFO, subsys, __VA_ARGS__)
#define LOG_DEBUG(subsys, ...) LOG_AT(LOG_LEVEL_DEBUG, subsys, __VA_ARGS__)

/* Broken invariants: a programmer error stops with file and line (redis serverAssert). */
#define FSDP_ASSERT(cond)                                                           \
  do {                                                                              \
    if (!(cond)) log_assert_fail(#cond, __FILE__, __LINE__);                        \
  } while (0)
_Noreturn void log_assert_fail(const char *cond, const char *file, int line);

#endif

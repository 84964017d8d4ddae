/* crash: a backtrace on a fatal signal (see crash.h).
 *
 * The handler only makes async-signal-safe calls, plus glibc's backtrace
 * and backtrace_symbols_fd, which are safe once libgcc's unwinder is loaded:
 * crash_install calls backtrace once, so the handler never loads it (a
 * dlopen and a malloc inside a handler, perhaps inside a broken heap). It
 * runs on an alternate stack, so a stack overflow still reports. */
#include "daemon/common/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CRASH_FRAMES 64

static const char *crash_who = "process";

static void crash_write(const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= (size_t)w;
  }
}

static void crash_handler(int sig) {
  crash_write("fsdp: ");
  crash_write(crash_who);
  crash_write(" died of ");
  crash_write(sigabbrev_np(sig) ? sigabbrev_np(sig) : "a signal");
  crash_write(" (");
  crash_write(sigdescr_np(sig) ? sigdescr_np(sig) : "?");
  crash_write("); its stack, innermost first:\n");
  void *frames[CRASH_FRAMES];
  int n = backtrace(frames, CRASH_FRAMES);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  /* SA_RESETHAND put the default action back: die of the same signal */
  raise(sig);
}

void crash_install(const char *who) {
  if (who) crash_who = who;
  void *warm[2];
  (void)backtrace(warm, 2); /* loads the unwinder now, not inside the handler */
  static uint8_t alt[1 << 16];
  stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = crash_handler;
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &sa, NULL);
}

/* crash: what a process says when it dies of a fault (SIGSEGV, SIGBUS,
 * SIGFPE, SIGILL) or an abort (SIGABRT: a failed assertion, glibc's heap
 * checks): the signal and a backtrace on stderr, which a rank's supervisor
 * keeps in its log, then the default action (the process dies of the same
 * signal, a core is dumped where the system allows). The frames are
 * "binary(function+offset) [address]"; addr2line -e BINARY on the offsets
 * names the lines of the functions that are not exported. */
#ifndef FSDP_CRASH_H
#define FSDP_CRASH_H

/* Installs the handlers for this process, naming it `who` in the report
 * (a string that lives as long as the process). Call once, early. */
void crash_install(const char *who);

#endif

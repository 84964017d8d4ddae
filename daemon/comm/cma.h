/* cma: Linux cross-memory attach (process_vm_readv(2); Open MPI's vader BTL
 * calls it CMA): one process reading another's memory by address. Internal
 * to daemon/comm: rec.c reads address records with it, and the ring's
 * bootstrap first checks that it works at all between two ranks
 * (FSDP_COMM_CMA=1; off by default, docs/RING.md says why). */
#ifndef FSDP_COMM_CMA_H
#define FSDP_COMM_CMA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Lets any process of this user read this one (PR_SET_PTRACER_ANY, for
 * kernels with Yama's ptrace_scope 1; ignored where there is no Yama). Once
 * per process; harmless to repeat. */
void comm_cma_allow(void);
/* Reads 8 bytes at addr in process pid; 0 when they equal want, else a
 * negative errno (-EPERM, -ENOSYS, -ESRCH, ...; -EIO: other bytes). */
int comm_cma_probe(pid_t pid, uint64_t addr, uint64_t want);
/* Copies up to n bytes at addr in process pid into p: the bytes copied
 * (fewer when a fault ends the range, 0 when it starts there), or a negative
 * errno. */
ssize_t comm_cma_read(pid_t pid, void *p, uint64_t addr, size_t n);

#endif

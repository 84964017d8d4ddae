/* hostmem: how much memory this host gives this process: the machine's,
 * or less where a control group limits it (a container's memory limit, a
 * systemd unit's MemoryMax, a Slurm job's). The memory plan and fsdpd's
 * inventory read these: a pod on a 2 TB node with a 64 GiB limit must
 * plan for 64 GiB, or its ranks plan for memory the kernel will OOM-kill
 * them for using. cgroup v2 (memory.max, memory.current) and v1
 * (memory.limit_in_bytes, memory.usage_in_bytes), every level from this
 * process's group up to the hierarchy's root: the tightest wins. A
 * group's page cache it can drop (inactive_file) counts as room, as
 * MemAvailable counts it. */
#ifndef FSDP_HOSTMEM_H
#define FSDP_HOSTMEM_H

#include <stdint.h>

/* The machine's memory, or the tightest group limit above this process
 * when lower; 0 when neither can be read. */
uint64_t hostmem_total(void);

/* MemAvailable, or the tightest group's room (its limit less what it uses
 * but could drop) when lower; 0 when neither can be read. */
uint64_t hostmem_available(void);

/* The tightest limit and room of the groups that self_cgroup (the text of
 * /proc/self/cgroup) names under the hierarchies mounted at root
 * (/sys/fs/cgroup; v1's memory controller under root/memory): 1 with
 * *limit and *room when a level sets a limit, else 0. For tests. */
int hostmem_cgroup(const char *self_cgroup, const char *root, uint64_t *limit, uint64_t *room);

#endif

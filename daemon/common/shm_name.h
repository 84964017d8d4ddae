/* shm_name: the one spelling of the names a ring's shared-memory links take
 * in /dev/shm, shared by the comm layer that creates them (daemon/comm/shm.c)
 * and the supervisor that removes what a killed rank left (daemon/node/
 * supervise.c), which may not include daemon/comm.
 *
 * A link is "/fsdpd-ring-<pid>-<serial>-<token>", <pid> the creating
 * process's: the name lives from its creation until the consumer maps it,
 * and a rank killed in between leaves it, which only its supervisor, seeing
 * <pid> exit, can know is garbage. */
#ifndef FSDP_SHM_NAME_H
#define FSDP_SHM_NAME_H

#define SHM_NAME_RING_PREFIX "fsdpd-ring-" /* then "<pid>-" */
#define SHM_NAME_DIR "/dev/shm"

#endif

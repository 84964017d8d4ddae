/* ring_secret: the one spelling of the secret a ring's ranks prove to each
 * other (daemon/comm/ring_boot.c), as the launchers hand it to each rank:
 * FSDP_RING_SECRET, RING_SECRET_BYTES random bytes in hex. fsdp-launch draws
 * one per run; the coordinator one per attempt, stored with the attempt and
 * given to each fsdpd in the rank's assignment. Header-only: fsdp-launch and
 * fsdpd may not include daemon/comm (which reads it: boot.c). */
#ifndef FSDP_RING_SECRET_H
#define FSDP_RING_SECRET_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define RING_SECRET_BYTES 32
#define RING_SECRET_VAR "FSDP_RING_SECRET"
/* "FSDP_RING_SECRET=" and the hex digits, terminated */
#define RING_SECRET_ENV_LEN (sizeof RING_SECRET_VAR + 2 * RING_SECRET_BYTES + 1)

/* out = "FSDP_RING_SECRET=<hex of s>", an environment entry. */
static inline void ring_secret_env(char out[RING_SECRET_ENV_LEN],
                                   const uint8_t s[RING_SECRET_BYTES]) {
  size_t k = (size_t)snprintf(out, RING_SECRET_ENV_LEN, "%s=", RING_SECRET_VAR);
  for (int i = 0; i < RING_SECRET_BYTES; i++, k += 2)
    snprintf(out + k, RING_SECRET_ENV_LEN - k, "%02x", s[i]);
}

#endif

/* ticket: log tickets. The coordinator gives each node a key at its
 * registration (RegisterNodeReply.log_key, random, new each time) and a user
 * a ticket for one rank's log on one node (GetLogTicket); the node checks
 * the ticket with its key (GetRankLogs). So fsdpctl never hands a node the
 * user's token, which the node's operator could use at the coordinator, and
 * a ticket a node keeps reads only that rank's log there, for an hour.
 *
 * A ticket is "v1.EXPIRY.MAC": EXPIRY in seconds since the epoch, MAC the
 * hex HMAC-SHA256, under the node's key, of the job id, the rank, the node
 * id and EXPIRY (each NUL-terminated), so it is good for those alone. */
#ifndef FSDP_TICKET_H
#define FSDP_TICKET_H

#include <stddef.h>
#include <stdint.h>

#define TICKET_KEY_BYTES 32
#define TICKET_MAX 96       /* a ticket's length, its NUL included, at most */
#define TICKET_LIFE_S 3600  /* how long a ticket is good for */

/* The ticket for (job, rank, node) until expiry into out[TICKET_MAX]. */
void ticket_make(char out[TICKET_MAX], const uint8_t *key, size_t key_len, const char *job,
                 uint32_t rank, const char *node, int64_t expiry);
/* 0 when t is good for (job, rank, node) at now; else FSDP_EAUTH, saying
 * why (malformed, expired, or not for this rank on this node: made with
 * another key, as after either side restarted). */
int ticket_check(const char *t, const uint8_t *key, size_t key_len, const char *job,
                 uint32_t rank, const char *node, int64_t now);
/* The expiry t names (seconds since the epoch), unchecked: ask ticket_check
 * first. -1 when t is malformed. */
int64_t ticket_expiry(const char *t);

#endif

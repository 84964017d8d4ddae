/* logs: fsdpd's Node service, GetRankLogs: a rank's log file streamed as
 * LogChunks from where it lies, so logs never travel through the
 * coordinator. The request's job id is checked (workdir_id_check) before it
 * names a file; attempt 0 means the latest attempt with files here.
 *
 * Streams run on the loop: a timer per stream (LOGS_TICK_MS) reads the file
 * from where the stream is, sending chunks of up to LOGS_CHUNK bytes while
 * the call's backlog is small (a slow client is never sent more than a few
 * chunks ahead). Without follow the stream ends at the end of the file;
 * with follow it ends once the rank has exited and everything is sent, or
 * when the client goes away.
 *
 * Each stream holds its log's descriptor, so at most FSDP_LOG_STREAMS_MAX
 * (param.h, 64) are open at once: one more is refused at once with
 * RESOURCE_EXHAUSTED, saying how many are open. A stream whose client has
 * accepted nothing (its backlog full) for FSDP_STREAM_STALL_S (60 s) is ended
 * with CANCELLED (rpc_call_abort), freeing its slot. A stream opened with a
 * log ticket lives no longer than the ticket: once it expires, or the node
 * registers again and gets a new key (which the ticket no longer passes),
 * the stream ends ABORTED (FSDP_ESTALE), naming the byte to resume at; a
 * client opens it again there with a fresh ticket. The log is opened with
 * file_open_regular: the attempt directory is the ranks' user's, and a FIFO
 * put in the log's place must not hold the loop. */
#ifndef FSDP_LOGS_H
#define FSDP_LOGS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/common/rpc.h"
#include "daemon/node/ranks.h"

#define LOGS_TICK_MS 100
#define LOGS_CHUNK (32u << 10)

typedef struct logs logs_t;

int logs_create(logs_t **out, uv_loop_t *loop, const char *work_dir, const ranks_t *ranks);
/* Registers GetRankLogs on srv, before rpc_server_start: open at the RPC
 * layer, the handler checks the caller (a log ticket, ticket.h, where the
 * coordinator issues them; else the user token, when fsdpd has one). */
int logs_register(logs_t *L, rpc_server_t *srv);
/* This node's id and log ticket key, from its registration (key_len 0: the
 * coordinator issues no tickets). On the loop. */
void logs_set_identity(logs_t *L, const char *node_id, const uint8_t *key, size_t key_len);
/* fsdpd sends the coordinator a token, so the coordinator likely checks
 * tokens and will give a key: until fsdpd has registered, GetRankLogs is
 * refused (UNAVAILABLE), not open; registered without a key, the user token
 * rule applies (--user-token-file, or open). */
void logs_expect_tickets(logs_t *L);
/* After rpc_server_destroy (which ends the streams). */
void logs_destroy(logs_t *L);

#endif

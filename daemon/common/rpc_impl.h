/* rpc_impl: what rpc.c, rpc_server.c and rpc_client.c share and nothing
 * else includes. */
#ifndef FSDP_RPC_IMPL_H
#define FSDP_RPC_IMPL_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "rpc.h"

#define RPC_PEM_MAX (1u << 20) /* longest certificate, key or CA file accepted */

/* Reads a whole file of at most max bytes into a NUL-terminated buffer; what
 * names the file in messages ("token file", "TLS key"). */
int rpc__read_file(const char *path, const char *what, size_t max, char **out, size_t *len);
/* Reads a token file: trailing whitespace dropped; empty, over RPC_TOKEN_MAX
 * or holding bytes that cannot go in a header: refused. */
int rpc__read_token(const char *path, char **token);
/* Why n bytes at t cannot be a token ("is empty", ...), or NULL when they can. */
const char *rpc__token_flaw(const char *t, size_t n);
/* The tokens a server accepts, as SHA-256 digests (rpc_keys.c). */
#define RPC_DIGEST_LEN 32
#define RPC_NODE_NAME_MAX 128 /* a node's name in a token file, with the NUL */
typedef struct rpc_key {
  unsigned role;                /* RPC_ROLE_* */
  char *name;                   /* a node's, from a per-node token file; else NULL */
  uint8_t sha[RPC_DIGEST_LEN];
} rpc_key_t;
typedef struct rpc_keys {
  rpc_key_t *k;
  int n, cap;
  int has_operator;             /* an operator token was given */
} rpc_keys_t;
/* Reads the user, node and (optional) operator token files into ks: each
 * holds a token or its digest ("sha256:<hex>"); the node file may hold
 * "NAME TOKEN" lines instead. user NULL: no keys (auth off). Two roles, or
 * two nodes, with one token are refused. */
int rpc__keys_load(rpc_keys_t *ks, const char *user, const char *node, const char *op);
/* The key the n bytes of tok are the token of, or NULL. */
const rpc_key_t *rpc__keys_match(const rpc_keys_t *ks, const uint8_t *tok, size_t n);
void rpc__keys_free(rpc_keys_t *ks);
/* SHA-256 of n bytes at p. */
int rpc__digest(const void *p, size_t n, uint8_t out[RPC_DIGEST_LEN]);
/* Frees a buffer that held a secret, after overwriting it. */
void rpc__free_secret(char *p);
/* A message packed into a new byte buffer (NULL when out of memory). */
grpc_byte_buffer *rpc__pack(const ProtobufCMessage *m);
/* A byte buffer's bytes as one slice (the caller unrefs it). */
grpc_slice rpc__flatten(grpc_byte_buffer *bb);
/* grpc_init, with gRPC's log lines sent to log.h's (once per process). */
void rpc__init(void);
/* gpr deadline timeout_s seconds from now. */
gpr_timespec rpc__deadline(double timeout_s);

#endif

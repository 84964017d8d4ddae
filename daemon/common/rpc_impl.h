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
/* Nodes' Kubernetes service account tokens (rpc_jwt.c). */
#define RPC_JWT_AUDIENCE "fsdp-coordinator" /* the audience when none is given */
#define RPC_JWT_SEEN 4096                   /* verified tokens remembered */
typedef struct rpc_jwt_opts {
  const char *jwks_file, *audience, *subject, *issuer; /* rpc_server_opts_t's node_jwt_* */
} rpc_jwt_opts_t;
typedef struct rpc_jwks rpc_jwks_t;
/* Reads the JWKS file's RSA keys and the claims a token must hold. */
int rpc__jwks_load(rpc_jwks_t **j, const rpc_jwt_opts_t *o);
void rpc__jwks_free(rpc_jwks_t *j);
/* 1 when the n bytes at tok have a JWT's form (three base64url parts). */
int rpc__jwt_like(const uint8_t *tok, size_t n);
/* Checks a JWT (its SHA-256 in sha) at time now (Unix seconds): 0 and the
 * name of the node it is bound to in node, or FSDP_EAUTH saying why not
 * (FSDP_ENOTFOUND: no key of the set verifies it, which a newer set might).
 * On the server's loop only (it remembers tokens it verified). */
int rpc__jwt_node(rpc_jwks_t *j, const uint8_t *tok, size_t n, const uint8_t sha[RPC_DIGEST_LEN],
                  int64_t now, char *node, size_t cap);
typedef struct rpc_keys {
  rpc_key_t *k;
  int n, cap;
  int has_operator;             /* an operator token was given */
  rpc_jwks_t *jwks;             /* nodes may show a service account token (NULL: no) */
} rpc_keys_t;
/* Reads the user, node and (optional) operator token files into ks: each
 * holds a token or its digest ("sha256:<hex>"); the node file may hold
 * "NAME TOKEN" lines instead. user NULL: no keys (auth off). Two roles, or
 * two nodes, with one token are refused, and so is a token under 16 bytes. With jwt->jwks_file, nodes may
 * also show Kubernetes service account tokens. node NULL: no node file
 * (rpc_server_create has checked that this server may go without). */
int rpc__keys_load(rpc_keys_t *ks, const char *user, const char *node, const char *op,
                   const rpc_jwt_opts_t *jwt);
/* The key the n bytes of tok are the token of, or NULL; the token's
 * SHA-256 in sha. */
const rpc_key_t *rpc__keys_match(const rpc_keys_t *ks, const uint8_t *tok, size_t n,
                                 uint8_t sha[RPC_DIGEST_LEN]);
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

/* rpc_guard.c: the listener's defence against running out of descriptors. */
/* The descriptor number at and above which an accepted connection is
 * ended at once: RLIMIT_NOFILE less a quarter of it (256 at least). */
int rpc__guard_cap(void);
/* The socket mutator argument for a server's channel args (static: no
 * reference to drop). */
grpc_arg rpc__guard_arg(void);
/* Whether gRPC called the mutator on a listening socket (its layout is right). */
int rpc__guard_saw_listener(void);
/* The gRPC core version (grpc_version_string) whose private socket mutator
 * rpc_guard.c mirrors, and whether core is it: the mutator goes into a
 * server's args only then. */
#define RPC_GUARD_GRPC_CORE "29.0.0"
int rpc__guard_fits(const char *core);
/* Around grpc_server_add_http2_port: the listening sockets it made get a
 * backlog of half the descriptors above the cap (4096 at most); returns how
 * many it set. */
void rpc__guard_listen_begin(void);
int rpc__guard_listen_end(void);
/* Connections ended at the cap, in this process. */
uint64_t rpc__guard_shed(void);
/* Soft RLIMIT_NOFILE up to the hard limit. */
void rpc__guard_raise_nofile(void);
/* gpr deadline timeout_s seconds from now. */
gpr_timespec rpc__deadline(double timeout_s);

#endif

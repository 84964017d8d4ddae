/* fuzz_node_jwt: what a caller without a token the server knows can make a
 * server parse (rpc_jwt.c): any bearer token of a JWT's form, checked
 * against a fixed key set at a fixed time. Every input must be refused with
 * a message, never crash, and only the corpus' token signed by that key
 * (tests/fuzz/corpus/node_jwt/k8s-token, made with tests/unit/jwt_mint.py,
 * valid from 1900000000 to 2000000000) may pass, naming its node. An input
 * starting with '{' is a JWKS file instead: loaded or refused with a
 * message. */
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/common/err.h"
#include "daemon/common/rpc_impl.h"
#include "tests/fuzz/fuzz.h"

/* the public key that signed the corpus' token */
static const char jwks[] =
    "{\"keys\": [{\"use\": \"sig\", \"kty\": \"RSA\", \"alg\": \"RS256\", \"n\": \"2NjqTDdv9v"
    "Yjrf8ZOdjSlgLozHaTEmMPzBq86cbDw7qtC4M_sr-03ZKu92WSgSugRHU1MOqv2ntxD-Q0f0acgm1tmEVS_B2YXD"
    "8s8WtJwzAhthveHT6sJ8BKAywyWh3AWe59u3VWfXZWdOepBkaci6dGPDnE66-gcFo1HRZSh0xf3fIriNhAAESRhQ"
    "BuqdsvpsX9YHkSfN4YRLk23zADpdPQpI1F8O5ht0v2LLGA7JgCMbvPfc2DTDjA-ZE8RQFXo0xC8lGKZaUNprE7yF"
    "J516FjoqgiPQYSNBcSh6defh2Ub7_80mrTgTZe00z9Z9YVCyghcKEq1XWI6WhR3eO9rw\", \"e\": \"AQAB\","
    " \"kid\": \"fuzz-1\"}]}";

static rpc_jwks_t *keys;

static rpc_jwks_t *load(const uint8_t *data, size_t size) {
  char path[64];
  int fd = fuzz_file(data, size, path);
  rpc_jwks_t *j = NULL;
  const rpc_jwt_opts_t o = {path, "fsdp-coordinator", "system:serviceaccount:fsdp:fsdpd", NULL};
  int rc = rpc__jwks_load(&j, &o);
  close(fd);
  if (rc && !err_msg()[0]) abort(); /* every refusal says why */
  if (!rc && !j) abort();
  return j;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!keys && !(keys = load((const uint8_t *)jwks, strlen(jwks)))) abort();
  if (size && data[0] == '{') {
    rpc__jwks_free(load(data, size));
    return 0;
  }
  if (size > RPC_TOKEN_MAX || !rpc__jwt_like(data, size)) return 0;
  uint8_t sha[RPC_DIGEST_LEN];
  unsigned len = 0;
  if (!EVP_Digest(data, size, sha, &len, EVP_sha256(), NULL)) abort();
  char node[RPC_NODE_NAME_MAX];
  int rc = rpc__jwt_node(keys, data, size, sha, 1900000100, node, sizeof node);
  if (rc && !err_msg()[0]) abort();
  if (!rc && strcmp(node, "gpu-7")) abort(); /* only the corpus' token is signed */
  return 0;
}

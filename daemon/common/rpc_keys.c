/* rpc_keys: the tokens a server accepts (rpc.h, Auth), held as SHA-256
 * digests. A token file may hold the token itself, or only its digest,
 * "sha256:<64 hex digits>": a server that checks callers needs no more, so
 * a host that must check user tokens (fsdpd's Node service) never holds one
 * it could use. A presented token is hashed once per call and its digest
 * compared with every key's (OpenSSL's CRYPTO_memcmp), whichever matches,
 * so the time says nothing of which key, or which byte, it met. */
#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "rpc_impl.h"

#define RPC_NODE_TOKENS_MAX 65536            /* nodes in one token file */
#define RPC_NODE_TOKENS_FILE_MAX (16u << 20) /* the longest node token file accepted */
#define RPC_DIGEST_PREFIX "sha256:"

static const char *rpc_role_word(unsigned role) {
  return role == RPC_ROLE_USER ? "user" : role == RPC_ROLE_NODE ? "node" : "operator";
}

int rpc__digest(const void *p, size_t n, uint8_t out[RPC_DIGEST_LEN]) {
  unsigned len = 0;
  if (!EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) || len != RPC_DIGEST_LEN)
    return err_set(FSDP_EINTERNAL, "SHA-256 failed (OpenSSL's EVP_Digest)");
  return 0;
}

static const char rpc_key_short[] =
    "holds a token shorter than 16 bytes, which could be guessed: put a random one in it, "
    "`openssl rand -hex 32`, and the same in its clients' token files";

static const char rpc_key_plain[] =
    "holds a token of fewer than 5 different characters (a pattern such as aaaa... or "
    "abab..., not a secret), which could be guessed: put a random one in it, "
    "`openssl rand -hex 32`, and the same in its clients' token files";

/* The different bytes among n at t, up to 5 (all a check needs: a random
 * token of 16 hex digits has fewer than 5 about once in ten million). */
static int rpc_key_variety(const char *t, size_t n) {
  unsigned char seen[5];
  int k = 0;
  for (size_t i = 0; i < n && k < 5; i++)
    if (!memchr(seen, t[i], (size_t)k)) seen[k++] = (unsigned char)t[i];
  return k;
}

/* n bytes at t, a token or "sha256:<hex>", as a digest; why it cannot be,
 * else NULL. */
static const char *rpc_key_parse(const char *t, size_t n, uint8_t sha[RPC_DIGEST_LEN]) {
  const size_t np = strlen(RPC_DIGEST_PREFIX);
  if (n >= np && !strncmp(t, RPC_DIGEST_PREFIX, np)) {
    if (n != np + 2 * RPC_DIGEST_LEN) return "starts with sha256: but has not 64 hex digits after it";
    for (size_t i = 0; i < RPC_DIGEST_LEN; i++) {
      unsigned v;
      if (!isxdigit((unsigned char)t[np + 2 * i]) || !isxdigit((unsigned char)t[np + 2 * i + 1]) ||
          sscanf(t + np + 2 * i, "%2x", &v) != 1)
        return "starts with sha256: but has not 64 hex digits after it";
      sha[i] = (uint8_t)v;
    }
    return NULL;
  }
  if (n > RPC_TOKEN_MAX) return "holds a token longer than 4096 bytes";
  const char *why = rpc__token_flaw(t, n);
  /* a digest's token cannot be measured: whoever made the digest checks it */
  if (!why && n < RPC_TOKEN_MIN) why = rpc_key_short;
  if (!why && rpc_key_variety(t, n) < 5) why = rpc_key_plain;
  if (!why && rpc__digest(t, n, sha)) why = "could not be hashed";
  return why;
}

/* Adds a key; its digest must be new (else the error names both owners). */
static int rpc_key_add(rpc_keys_t *ks, unsigned role, const char *name, const uint8_t *sha,
                       const char *path, int lineno) {
  for (int i = 0; i < ks->n; i++) {
    const rpc_key_t *o = &ks->k[i];
    if (memcmp(o->sha, sha, RPC_DIGEST_LEN)) continue;
    if (role == RPC_ROLE_NODE && o->role == RPC_ROLE_NODE)
      return err_set(FSDP_EINVAL, "node token file %s: line %d gives node %s the token of an "
                     "earlier line: give each node one line and a token of its own", path, lineno,
                     name);
    if (role == RPC_ROLE_OPERATOR)
      return err_set(FSDP_EINVAL, "rpc server: the operator token file %s holds the %s token; "
                     "give the operator a token of its own", path, rpc_role_word(o->role));
    return err_set(FSDP_EINVAL, "rpc server: the %s and %s token files hold the same token (%s); "
                   "a %s could then act as a %s: give each role its own", rpc_role_word(o->role),
                   rpc_role_word(role), path, rpc_role_word(o->role), rpc_role_word(role));
  }
  for (int i = 0; name && i < ks->n; i++)
    if (ks->k[i].name && !strcmp(ks->k[i].name, name))
      return err_set(FSDP_EINVAL, "node token file %s: line %d gives node %s the name of an "
                     "earlier line: give each node one line and a token of its own", path, lineno,
                     name);
  if (ks->n == ks->cap) {
    int cap = ks->cap ? 2 * ks->cap : 8;
    rpc_key_t *grown = realloc(ks->k, (size_t)cap * sizeof *grown);
    if (!grown) return err_set(FSDP_ENOMEM, "rpc server: out of memory for tokens");
    ks->k = grown, ks->cap = cap;
  }
  rpc_key_t *k = &ks->k[ks->n];
  memset(k, 0, sizeof *k);
  if (name && !(k->name = strdup(name))) return err_set(FSDP_ENOMEM, "rpc server: out of memory");
  k->role = role;
  memcpy(k->sha, sha, RPC_DIGEST_LEN);
  ks->n++;
  return 0;
}

/* A file of one token (or digest), for role. */
static int rpc_keys_one(rpc_keys_t *ks, unsigned role, const char *path) {
  char *t;
  size_t n;
  int rc = rpc__read_file(path, "token file", RPC_TOKEN_MAX + 64, &t, &n);
  if (rc) return rc;
  while (n && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t')) t[--n] = 0;
  uint8_t sha[RPC_DIGEST_LEN];
  const char *why = rpc_key_parse(t, n, sha);
  rpc__free_secret(t);
  /* these two carry their own fix: a digest or another format would not help */
  if (why == rpc_key_short || why == rpc_key_plain)
    return err_set(FSDP_EINVAL, "token file %s %s", path, why);
  if (why)
    return err_set(FSDP_EINVAL, "token file %s %s: put one token (printable ASCII, no spaces) in "
                   "it, or its digest, sha256:<64 hex digits>%s", path, why,
                   role == RPC_ROLE_NODE ? ", or lines NAME TOKEN, one per node" : "");
  return rpc_key_add(ks, role, NULL, sha, path, 0);
}

/* One line of a per-node token file, "NAME TOKEN" (lineno for messages). */
static int rpc_keys_node_line(rpc_keys_t *ks, const char *path, int lineno, char *line) {
  char *name = line, *end = name + strcspn(name, " \t");
  char *tok = end + strspn(end, " \t");
  char *tend = tok + strcspn(tok, " \t");
  uint8_t sha[RPC_DIGEST_LEN];
  const char *why = NULL;
  if (!*tok || *(tend + strspn(tend, " \t")))
    why = "is not NAME TOKEN (a node's name as fsdpd --name gives it, its token)";
  else if (end - name >= RPC_NODE_NAME_MAX)
    why = "names a node with a name over 127 bytes";
  for (const char *p = name; !why && p < end; p++)
    if (*p < 0x21 || *p > 0x7e) why = "names a node with a byte that is not printable ASCII";
  if (!why) why = rpc_key_parse(tok, (size_t)(tend - tok), sha);
  if (why) return err_set(FSDP_EINVAL, "node token file %s: line %d %s", path, lineno, why);
  *end = 0;
  return rpc_key_add(ks, RPC_ROLE_NODE, name, sha, path, lineno);
}

/* The node token file: one word (a token every node sends), or lines. */
static int rpc_keys_nodes(rpc_keys_t *ks, const char *path) {
  char *buf;
  size_t len;
  int rc = rpc__read_file(path, "node token file", RPC_NODE_TOKENS_FILE_MAX, &buf, &len);
  if (rc) return rc;
  const char *ws = " \t\r\n";
  char *word = buf + strspn(buf, ws);
  const size_t wlen = strcspn(word, ws);
  const int table = *word == '#' || word[wlen + strspn(word + wlen, ws)];
  rpc__free_secret(buf);
  if (!table) return rpc_keys_one(ks, RPC_ROLE_NODE, path);
  if ((rc = rpc__read_file(path, "node token file", RPC_NODE_TOKENS_FILE_MAX, &buf, &len))) return rc;
  int lineno = 0, nodes = 0;
  for (char *line = buf, *next; !rc && line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    lineno++;
    size_t l = strlen(line);
    while (l && (line[l - 1] == '\r' || line[l - 1] == ' ' || line[l - 1] == '\t')) line[--l] = 0;
    line += strspn(line, " \t");
    if (!*line || *line == '#') continue;
    if (++nodes > RPC_NODE_TOKENS_MAX)
      rc = err_set(FSDP_ELIMIT, "node token file %s: more than %d nodes", path, RPC_NODE_TOKENS_MAX);
    else
      rc = rpc_keys_node_line(ks, path, lineno, line);
  }
  rpc__free_secret(buf);
  if (!rc && !nodes) rc = err_set(FSDP_EINVAL, "node token file %s: no node in it", path);
  return rc;
}

int rpc__keys_load(rpc_keys_t *ks, const char *user, const char *node, const char *op,
                   const rpc_jwt_opts_t *jwt) {
  memset(ks, 0, sizeof *ks);
  int rc = 0;
  if (!user && jwt && jwt->jwks_file)
    return err_set(FSDP_EINVAL, "rpc server: a node JWKS file needs the user token file too");
  if (user) {
    rc = rpc_keys_one(ks, RPC_ROLE_USER, user);
    /* no node file: nodes show JWTs only, or the server has no node method (rpc.h) */
    if (!rc && node) rc = rpc_keys_nodes(ks, node);
    if (!rc && op) rc = rpc_keys_one(ks, RPC_ROLE_OPERATOR, op), ks->has_operator = 1;
  }
  if (!rc && jwt && jwt->jwks_file) rc = rpc__jwks_load(&ks->jwks, jwt);
  if (rc) rpc__keys_free(ks);
  return rc;
}

const rpc_key_t *rpc__keys_match(const rpc_keys_t *ks, const uint8_t *tok, size_t n,
                                 uint8_t sha[RPC_DIGEST_LEN]) {
  if (rpc__digest(tok, n, sha)) return NULL;
  const rpc_key_t *hit = NULL;
  for (int i = 0; i < ks->n; i++) /* every key, whichever matches */
    if (!CRYPTO_memcmp(ks->k[i].sha, sha, RPC_DIGEST_LEN)) hit = &ks->k[i];
  return hit;
}

void rpc__keys_free(rpc_keys_t *ks) {
  rpc__jwks_free(ks->jwks);
  for (int i = 0; i < ks->n; i++) free(ks->k[i].name);
  if (ks->k) OPENSSL_cleanse(ks->k, (size_t)ks->cap * sizeof *ks->k);
  free(ks->k);
  memset(ks, 0, sizeof *ks);
}

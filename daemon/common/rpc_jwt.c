/* rpc_jwt: nodes that prove who they are with a Kubernetes projected
 * service account token (rpc.h, "Kubernetes nodes").
 *
 * The token is a JWT (RFC 7519) the API server signed with RS256; the
 * server holds the cluster's public keys as a JWKS file (RFC 7517, what
 * `kubectl get --raw /openid/v1/jwks` prints), each made an OpenSSL key
 * once, at load. libjwt decodes the token (without a key: it checks no
 * signature); the header must say RS256 (a token saying HS256 would have a
 * verifier that trusts its header take the public key for an HMAC secret,
 * which anyone holds). OpenSSL then checks the signature, RSASSA-PKCS1-v1_5
 * over SHA-256 of the token's first two parts, against the key the header's
 * kid names: about 35 us, where libjwt's own check parsed a PEM key each
 * time (0.5 ms, a price any caller could make the server's one loop pay).
 * Then the claims: exp and nbf (60 s of
 * leeway for clocks), iss when the operator gave one, sub (the service
 * account fsdpd runs as: any pod may get a token for any audience from its
 * own account, so the audience alone proves nothing), aud, and the node the
 * kubelet bound the token to, kubernetes.io.node.name (Kubernetes 1.30 and
 * later). That name is the caller's, as a per-node token file's would be.
 *
 * A token verified once is remembered by its SHA-256 until it expires (a
 * heartbeat a second per node must not cost an RSA verification each). */
#include <errno.h>
#include <jansson.h>
#include <jwt.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"
#include "rpc_impl.h"

#define RPC_JWKS_FILE_MAX (1u << 20)
#define RPC_JWKS_KEYS_MAX 64
#define RPC_JWT_LEEWAY_S 60
#define RPC_JWT_TRIES 2 /* keys a token's signature is checked against, at most */

struct rpc_jwks {
  struct rpc_jwk {
    char *kid;    /* NULL: none given */
    EVP_PKEY *key; /* RSA, 2048 bits or more */
  } *k;
  int n;
  char *audience, *subject, *issuer;
  /* verified tokens by digest (slot: the digest's first bytes) */
  struct rpc_jwt_seen {
    uint8_t sha[RPC_DIGEST_LEN];
    int64_t until; /* 0: empty */
    char node[RPC_NODE_NAME_MAX];
  } seen[RPC_JWT_SEEN];
};

/* The bytes of base64url text s (n characters, no padding; some writers add
 * '=', which is taken off; base64's '+' and '/' pass too) into a malloc'd
 * *out, *len of them; 0, or -1 when s is empty, longer than max characters
 * or not base64. */
static int rpc_b64url(const char *s, size_t n, size_t max, unsigned char **out, size_t *len) {
  while (n && s[n - 1] == '=') n--;
  *out = NULL;
  if (!n || n > max || n % 4 == 1) return -1;
  /* the last character's bits past the last byte are 0 in the one encoding
   * of the bytes (EVP_DecodeBlock ignores them: 4 or 16 texts would decode
   * alike, each a token of its own to the cache) */
  static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const char c = s[n - 1];
  const char *d = strchr(digits, c);
  const unsigned v = c && d ? (unsigned)(d - digits) : c == '-' || c == '+' ? 62u : 63u;
  if (v & (n % 4 == 2 ? 0xfu : n % 4 == 3 ? 0x3u : 0u)) return -1;
  char *b = malloc(n + 4);
  unsigned char *raw = malloc(n + 4);
  int rc = -1;
  if (b && raw) {
    for (size_t i = 0; i < n; i++) b[i] = s[i] == '-' ? '+' : s[i] == '_' ? '/' : s[i];
    size_t m = n;
    while (m % 4) b[m++] = '=';
    b[m] = 0;
    const int got = EVP_DecodeBlock(raw, (const unsigned char *)b, (int)m);
    const int pad = (int)(m - n);
    if (got > pad) *len = (size_t)(got - pad), *out = raw, raw = NULL, rc = 0;
  }
  free(b), free(raw);
  return rc;
}

/* base64url of s as a big-endian number. */
static BIGNUM *rpc_jwk_bn(const char *s) {
  unsigned char *raw;
  size_t len;
  if (rpc_b64url(s, strlen(s), 2048, &raw, &len)) return NULL;
  BIGNUM *bn = BN_bin2bn(raw, (int)len, NULL);
  free(raw);
  return bn;
}

/* An RSA JWK's n and e as a public key of 2048 bits or more, or NULL. */
static EVP_PKEY *rpc_jwk_key(const char *n64, const char *e64) {
  BIGNUM *n = rpc_jwk_bn(n64), *e = rpc_jwk_bn(e64);
  OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
  OSSL_PARAM *params = NULL;
  EVP_PKEY_CTX *ctx = NULL;
  EVP_PKEY *key = NULL;
  if (!(n && e && bld && OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, n) &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, e) &&
        (params = OSSL_PARAM_BLD_to_param(bld)) &&
        (ctx = EVP_PKEY_CTX_new_from_name(NULL, "RSA", NULL)) && EVP_PKEY_fromdata_init(ctx) > 0 &&
        EVP_PKEY_fromdata(ctx, &key, EVP_PKEY_PUBLIC_KEY, params) > 0 &&
        EVP_PKEY_get_bits(key) >= 2048))
    EVP_PKEY_free(key), key = NULL;
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  OSSL_PARAM_BLD_free(bld);
  BN_free(n), BN_free(e);
  return key;
}

/* Whether sig (base64url, n characters) is key's RS256 signature of msg. */
static int rpc_jwt_signed(EVP_PKEY *key, const char *msg, size_t mlen, const char *sig, size_t n) {
  unsigned char *raw;
  size_t len;
  if (rpc_b64url(sig, n, 2048, &raw, &len)) return 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  /* the PKCS #1 v1.5 padding is RSA's default */
  const int ok = ctx && (size_t)EVP_PKEY_get_size(key) == len &&
                 EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, key) == 1 &&
                 EVP_DigestVerify(ctx, raw, len, (const unsigned char *)msg, mlen) == 1;
  if (!ok) ERR_clear_error(); /* the loop thread's queue: TLS calls read it after theirs */
  EVP_MD_CTX_free(ctx);
  free(raw);
  return ok;
}

void rpc__jwks_free(rpc_jwks_t *j) {
  if (!j) return;
  for (int i = 0; i < j->n; i++) free(j->k[i].kid), EVP_PKEY_free(j->k[i].key);
  free(j->k), free(j->audience), free(j->subject), free(j->issuer);
  OPENSSL_cleanse(j->seen, sizeof j->seen);
  free(j);
}

int rpc__jwks_load(rpc_jwks_t **out, const rpc_jwt_opts_t *o) {
  *out = NULL;
  if (!o->subject || !*o->subject)
    return err_set(FSDP_EINVAL, "node JWKS file %s: give the service account fsdpd runs as, "
                   "system:serviceaccount:NAMESPACE:NAME (--node-jwt-subject): any pod can get a "
                   "token for any audience from its own account", o->jwks_file);
  char *text;
  size_t len;
  int rc = rpc__read_file(o->jwks_file, "node JWKS file", RPC_JWKS_FILE_MAX, &text, &len);
  if (rc) return rc;
  json_error_t jerr;
  json_t *doc = json_loadb(text, len, 0, &jerr);
  free(text);
  json_t *keys = doc ? json_object_get(doc, "keys") : NULL;
  if (!json_is_array(keys)) {
    rc = err_set(FSDP_EINVAL, "node JWKS file %s: %s%s; it should hold what `kubectl get --raw "
                 "/openid/v1/jwks` prints, {\"keys\": [...]}", o->jwks_file,
                 doc ? "no \"keys\" array" : "not JSON: ", doc ? "" : jerr.text);
    json_decref(doc);
    return rc;
  }
  rpc_jwks_t *j = calloc(1, sizeof *j);
  const size_t nk = json_array_size(keys);
  if (!j || !(j->k = calloc(nk + 1, sizeof *j->k)) ||
      !(j->audience = strdup(o->audience && *o->audience ? o->audience : RPC_JWT_AUDIENCE)) ||
      !(j->subject = strdup(o->subject)) ||
      (o->issuer && *o->issuer && !(j->issuer = strdup(o->issuer)))) {
    rc = err_set(FSDP_ENOMEM, "rpc server: out of memory for the node JWKS");
    goto out;
  }
  for (size_t i = 0; i < nk && !rc; i++) {
    json_t *k = json_array_get(keys, i);
    const char *kty = json_string_value(json_object_get(k, "kty"));
    const char *kid = json_string_value(json_object_get(k, "kid"));
    const char *use = json_string_value(json_object_get(k, "use"));
    const char *alg = json_string_value(json_object_get(k, "alg"));
    /* a cluster signing with EC keys lists them too: only RS256 keys serve */
    if (!kty || strcmp(kty, "RSA") || (use && strcmp(use, "sig")) ||
        (alg && strcmp(alg, "RS256")))
      continue;
    if (j->n == RPC_JWKS_KEYS_MAX) {
      rc = err_set(FSDP_ELIMIT, "node JWKS file %s: more than %d RSA keys", o->jwks_file,
                   RPC_JWKS_KEYS_MAX);
      break;
    }
    const char *n64 = json_string_value(json_object_get(k, "n"));
    const char *e64 = json_string_value(json_object_get(k, "e"));
    EVP_PKEY *key = n64 && e64 ? rpc_jwk_key(n64, e64) : NULL;
    if (!key) {
      rc = err_set(FSDP_EINVAL, "node JWKS file %s: key %zu (kid %s) is not an RSA public key of "
                   "2048 bits or more (its n and e, base64url)", o->jwks_file, i,
                   kid ? kid : "none");
      break;
    }
    j->k[j->n].key = key;
    if (kid && !(j->k[j->n].kid = strdup(kid))) rc = err_set(FSDP_ENOMEM, "out of memory");
    j->n++;
  }
  if (!rc && !j->n)
    rc = err_set(FSDP_EINVAL, "node JWKS file %s: no RSA signing key (kty RSA, RS256) in it; "
                 "fsdpd's tokens are checked with RS256 only", o->jwks_file);
out:
  json_decref(doc);
  if (rc) rpc__jwks_free(j);
  else *out = j;
  return rc;
}

int rpc__jwt_like(const uint8_t *tok, size_t n) {
  int dots = 0;
  for (size_t i = 0; i < n; i++) {
    const uint8_t c = tok[i];
    if (c == '.') dots++;
    else if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
               c == '-' || c == '_'))
      return 0;
  }
  return dots == 2;
}

/* Whether the JSON text of a grant, a string or an array of them, holds s. */
static int rpc_jwt_aud_has(jwt_t *v, const char *s) {
  const char *one = jwt_get_grant(v, "aud");
  if (one) return !strcmp(one, s);
  char *txt = jwt_get_grants_json(v, "aud");
  json_t *a = txt ? json_loads(txt, JSON_DECODE_ANY, NULL) : NULL;
  free(txt);
  int has = 0;
  for (size_t i = 0; json_is_array(a) && i < json_array_size(a) && !has; i++) {
    const char *e = json_string_value(json_array_get(a, i));
    has = e && !strcmp(e, s);
  }
  json_decref(a);
  return has;
}

/* The claims of a verified token: NULL and the node's name in node, or why not. */
static const char *rpc_jwt_claims(const rpc_jwks_t *j, jwt_t *v, int64_t now, char *node,
                                  size_t cap, int64_t *exp_out) {
  errno = 0;
  const long exp = jwt_get_grant_int(v, "exp");
  if (errno == ENOENT) return "it has no expiry (exp): a projected token has one";
  if (now - RPC_JWT_LEEWAY_S > exp)
    return "it has expired (the kubelet renews the file: is fsdpd reading an old copy?)";
  errno = 0;
  const long nbf = jwt_get_grant_int(v, "nbf");
  if (errno != ENOENT && nbf - RPC_JWT_LEEWAY_S > now)
    return "it is not valid yet (nbf): are the clocks apart?";
  const char *iss = jwt_get_grant(v, "iss");
  if (j->issuer && (!iss || strcmp(iss, j->issuer)))
    return "its issuer (iss) is not this cluster's";
  const char *sub = jwt_get_grant(v, "sub");
  if (!sub || strcmp(sub, j->subject)) return "its service account (sub) is not fsdpd's";
  if (!rpc_jwt_aud_has(v, j->audience)) return "its audience (aud) is not this coordinator's";
  char *txt = jwt_get_grants_json(v, "kubernetes.io");
  json_t *k8s = txt ? json_loads(txt, 0, NULL) : NULL;
  free(txt);
  const char *name = json_string_value(json_object_get(json_object_get(k8s, "node"), "name"));
  const char *why = NULL;
  if (!name)
    why = "it names no node (kubernetes.io.node.name: Kubernetes 1.30 or later binds it to the "
          "pod's node)";
  else if (!*name || strlen(name) >= cap) why = "its node name is empty or too long";
  for (const char *p = name; !why && *p; p++)
    if (*p < 0x21 || *p > 0x7e) why = "its node name is not printable ASCII";
  if (!why) snprintf(node, cap, "%s", name), *exp_out = exp;
  json_decref(k8s);
  return why;
}

int rpc__jwt_node(rpc_jwks_t *j, const uint8_t *tok, size_t n, const uint8_t sha[RPC_DIGEST_LEN],
                  int64_t now, char *node, size_t cap) {
  struct rpc_jwt_seen *seen = &j->seen[(sha[0] | (unsigned)sha[1] << 8) % RPC_JWT_SEEN];
  if (seen->until && now <= seen->until && !CRYPTO_memcmp(seen->sha, sha, RPC_DIGEST_LEN)) {
    snprintf(node, cap, "%s", seen->node);
    return 0;
  }
  char *buf = malloc(n + 1);
  if (!buf) return err_set(FSDP_ENOMEM, "rpc server: out of memory checking a token");
  memcpy(buf, tok, n), buf[n] = 0;
  const char *why = NULL;
  jwt_t *v = NULL;
  /* decoded without a key: nothing in it is believed until the signature
   * over its first two parts is checked. Exactly two dots and base64url
   * alone (rpc__jwt_like, the server's test too), so the bytes signed are
   * the ones libjwt decoded (it splits at the first two dots, this at the
   * last). */
  const char *alg = NULL;
  if (!rpc__jwt_like(tok, n)) why = "it is not a JWT (three base64url parts)";
  else if (jwt_decode(&v, buf, NULL, 0) || !v) why = "it does not decode as a JWT";
  else if (!(alg = jwt_get_header(v, "alg")) || strcmp(alg, "RS256"))
    why = "it is not signed with RS256"; /* keyless, jwt_get_alg says none: the header's word */
  const char *sig = strrchr(buf, '.');
  if (!why && !sig) why = "it does not decode as a JWT";
  /* the key its kid names (Kubernetes always gives one); keys without a kid
   * too; at most RPC_JWT_TRIES of them, so that a forged token costs a
   * caller no more than that many RSA checks of the server's one loop */
  const char *kid = !why ? jwt_get_header(v, "kid") : NULL;
  int tries = 0, good = 0;
  for (int i = 0; !why && !good && i < j->n && tries < RPC_JWT_TRIES; i++)
    if (!j->k[i].kid || (kid && !strcmp(kid, j->k[i].kid))) {
      tries++;
      good = rpc_jwt_signed(j->k[i].key, buf, (size_t)(sig - buf), sig + 1, strlen(sig + 1));
    }
  int rc = FSDP_EAUTH;
  if (!why && !good)
    why = "no key of the JWKS file verifies its signature (was the cluster's key rotated?)",
    rc = FSDP_ENOTFOUND;
  int64_t exp = 0;
  if (!why) why = rpc_jwt_claims(j, v, now, node, cap, &exp);
  jwt_free(v);
  rpc__free_secret(buf);
  if (why) return err_set(rc, "the token is a service account token this server does not "
                          "take: %s", why);
  memcpy(seen->sha, sha, RPC_DIGEST_LEN);
  seen->until = exp > INT64_MAX - RPC_JWT_LEEWAY_S ? INT64_MAX : exp + RPC_JWT_LEEWAY_S;
  snprintf(seen->node, sizeof seen->node, "%s", node);
  return 0;
}

/* ticket: log tickets (ticket.h). */
#include "daemon/common/ticket.h"

#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"

/* The hex MAC of (job, rank, node, expiry) into hex[65]. */
static void ticket_mac(char hex[65], const uint8_t *key, size_t key_len, const char *job,
                       uint32_t rank, const char *node, int64_t expiry) {
  char msg[512];
  int n = snprintf(msg, sizeof msg, "fsdp-log-ticket%c%s%c%" PRIu32 "%c%s%c%" PRId64, 0, job, 0,
                   rank, 0, node, 0, expiry);
  if (n < 0 || (size_t)n >= sizeof msg) n = 0; /* ids are short: a MAC of nothing matches none */
  uint8_t mac[32];
  unsigned len = 0;
  HMAC(EVP_sha256(), key, (int)key_len, (const uint8_t *)msg, (size_t)n, mac, &len);
  for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", i < len ? mac[i] : 0);
}

void ticket_make(char out[TICKET_MAX], const uint8_t *key, size_t key_len, const char *job,
                 uint32_t rank, const char *node, int64_t expiry) {
  char hex[65];
  ticket_mac(hex, key, key_len, job, rank, node, expiry);
  snprintf(out, TICKET_MAX, "v1.%" PRId64 ".%s", expiry, hex);
}

/* EXPIRY of "v1.EXPIRY.MAC", its MAC in *mac; -1 when t is not that shape. */
static long long ticket_parse(const char *t, const char **mac) {
  char *end;
  if (strncmp(t, "v1.", 3)) return -1;
  const long long expiry = strtoll(t + 3, &end, 10);
  if (end == t + 3 || *end != '.' || strlen(end + 1) != 64 || expiry < 0) return -1;
  *mac = end + 1;
  return expiry;
}

int64_t ticket_expiry(const char *t) {
  const char *mac;
  return ticket_parse(t, &mac);
}

int ticket_check(const char *t, const uint8_t *key, size_t key_len, const char *job,
                 uint32_t rank, const char *node, int64_t now) {
  const char *fix = "ask the coordinator for another (fsdpctl logs does)", *mac = NULL;
  if (strncmp(t, "v1.", 3))
    return err_set(FSDP_EAUTH, "the log ticket is not one this node reads; %s", fix);
  const long long expiry = ticket_parse(t, &mac);
  if (expiry < 0) return err_set(FSDP_EAUTH, "the log ticket is malformed; %s", fix);
  char hex[65];
  ticket_mac(hex, key, key_len, job, rank, node, expiry);
  if (CRYPTO_memcmp(hex, mac, 64))
    return err_set(FSDP_EAUTH, "the log ticket is not for rank %" PRIu32 " of job %s on node %s "
                   "(or it was made before this node or the coordinator restarted); %s", rank,
                   job, node, fix);
  if (expiry <= now)
    return err_set(FSDP_EAUTH, "the log ticket expired %lld s ago; %s", (long long)(now - expiry),
                   fix);
  return 0;
}

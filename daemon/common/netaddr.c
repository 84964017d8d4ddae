/* netaddr.c: numeric IPv4 and IPv6 socket addresses from and to text. */
#include "daemon/common/netaddr.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/common/err.h"

int netaddr_parse(const char *what, const char *text, int with_port, struct sockaddr_storage *ss,
                  socklen_t *len) {
  memset(ss, 0, sizeof *ss);
  char host[INET6_ADDRSTRLEN];
  long port = 0;
  size_t hl = strlen(text);
  if (with_port) {
    const char *colon = strrchr(text, ':');
    char *end = NULL;
    if (!colon || colon[1] < '0' || colon[1] > '9') goto bad; /* no sign, no space */
    port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) goto bad;
    hl = (size_t)(colon - text);
  }
  /* "[IPV6]": required before a port (its colons), allowed without */
  const int br = hl >= 2 && text[0] == '[' && text[hl - 1] == ']';
  const char *h = text + br;
  hl -= 2 * (size_t)br;
  if (!hl || hl >= sizeof host) goto bad;
  memcpy(host, h, hl);
  host[hl] = 0;
  struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
  if (!br && inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET, a4->sin_port = htons((uint16_t)port), *len = sizeof *a4;
    return FSDP_OK;
  }
  if ((br || !with_port) && inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6, a6->sin6_port = htons((uint16_t)port), *len = sizeof *a6;
    return FSDP_OK;
  }
bad:
  return err_set(FSDP_EINVAL, "%s '%s' is not a numeric address; give %s", what, text,
                 with_port ? "IPV4:PORT or [IPV6]:PORT, e.g. 0.0.0.0:9100 or [::]:9100 (port 0: any)"
                           : "an IPv4 or IPv6 address, e.g. 10.0.0.5 or fd00::5");
}

void netaddr_format(const struct sockaddr *sa, char *buf, size_t n) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof host);
    snprintf(buf, n, "[%s]:%u", host, ntohs(a6->sin6_port));
  } else {
    const struct sockaddr_in *a4 = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &a4->sin_addr, host, sizeof host);
    snprintf(buf, n, "%s:%u", host, ntohs(a4->sin_port));
  }
}

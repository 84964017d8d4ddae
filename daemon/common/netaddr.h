/* netaddr: the one parser of the numeric addresses operators give (fsdpd's
 * --rank-host, the --metrics-listen of fsdpd and the coordinator), IPv4 or
 * IPv6 alike, and their one printed form. IPv6 is written in brackets when
 * a port follows ("[fd00::2]:9100"), as gRPC and URLs write it. Numeric
 * only: a name is refused (what a rank binds must not depend on DNS). */
#ifndef FSDP_NETADDR_H
#define FSDP_NETADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* text as a socket address. with_port: "IPV4:PORT" or "[IPV6]:PORT" (PORT
 * 0 to 65535); else a bare "IPV4" or "IPV6" (port 0). what names the option
 * in the error (FSDP_EINVAL, with the accepted forms). */
int netaddr_parse(const char *what, const char *text, int with_port, struct sockaddr_storage *ss,
                  socklen_t *len);
/* "IPV4:PORT" or "[IPV6]:PORT" of sa into buf (n bytes). */
void netaddr_format(const struct sockaddr *sa, char *buf, size_t n);

#endif

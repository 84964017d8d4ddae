/* Tests of netaddr.c, the parser of the numeric addresses operators give
 * (--rank-host, --metrics-listen): IPv4 and bracketed IPv6 with a port,
 * bare hosts without, refusals that name the option and the accepted forms,
 * and the printed form read back to the same address. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/common/netaddr.h"

static void parses(const char *text, int with_port, int family, const char *host, int port) {
  struct sockaddr_storage ss;
  socklen_t len = 0;
  cr_assert_eq(netaddr_parse("--x", text, with_port, &ss, &len), 0, "%s: %s", text, err_msg());
  cr_assert_eq(ss.ss_family, family, "%s", text);
  char got[INET6_ADDRSTRLEN];
  const void *a = family == AF_INET ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
                                    : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
  inet_ntop(family, a, got, sizeof got);
  cr_assert_str_eq(got, host, "%s", text);
  const int p = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                        : ((struct sockaddr_in6 *)&ss)->sin6_port);
  cr_assert_eq(p, port, "%s", text);
  cr_assert_eq(len, family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
  /* printed and parsed again: the same address */
  char back[80];
  netaddr_format((struct sockaddr *)&ss, back, sizeof back);
  struct sockaddr_storage again;
  cr_assert_eq(netaddr_parse("--x", back, 1, &again, &len), 0, "%s -> %s: %s", text, back, err_msg());
  cr_assert_eq(memcmp(&again, &ss, len), 0, "%s -> %s", text, back);
}

Test(netaddr, ipv4_and_ipv6_with_and_without_a_port) {
  parses("0.0.0.0:9100", 1, AF_INET, "0.0.0.0", 9100);
  parses("127.0.0.1:0", 1, AF_INET, "127.0.0.1", 0);
  parses("[::]:9101", 1, AF_INET6, "::", 9101);
  parses("[fd00::2]:65535", 1, AF_INET6, "fd00::2", 65535);
  parses("10.1.2.3", 0, AF_INET, "10.1.2.3", 0);
  parses("::1", 0, AF_INET6, "::1", 0);
  parses("[fe80::1]", 0, AF_INET6, "fe80::1", 0);
}

Test(netaddr, what_is_not_a_numeric_address_is_refused_naming_the_option) {
  static const struct {
    const char *text;
    int with_port;
  } bad[] = {{"localhost:80", 1}, {"::1:80", 1},        {"[::1]", 1},       {"1.2.3.4", 1},
             {"1.2.3.4:", 1},     {"1.2.3.4:65536", 1}, {"1.2.3.4:-1", 1},  {"1.2.3.4:8x", 1}, {"1.2.3.4:+80", 1}, {"1.2.3.4: 80", 1},
             {"[1.2.3.4]:80", 1}, {"", 0},              {"1.2.3.4:80", 0},  {"node-a", 0},
             {"[]", 0},           {"1.2.3", 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct sockaddr_storage ss;
    socklen_t len;
    cr_assert_eq(netaddr_parse("--metrics-listen", bad[i].text, bad[i].with_port, &ss, &len),
                 FSDP_EINVAL, "'%s' (port %d) was taken", bad[i].text, bad[i].with_port);
    cr_assert(strstr(err_msg(), "--metrics-listen") && strstr(err_msg(), bad[i].text) &&
              strstr(err_msg(), bad[i].with_port ? "[IPV6]:PORT" : "IPv6"), "%s", err_msg());
  }
}

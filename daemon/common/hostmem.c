/* hostmem: see hostmem.h. */
#include "daemon/common/hostmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A limit at or past this is none (v1 writes 2^63 less a page for none). */
#define HOSTMEM_NONE (1ull << 62)

/* The first number of file dir/name, or of its line starting with key
 * (memory.stat's "key N"); 0 when missing; "max" is none. */
static int hostmem_read(const char *dir, const char *name, const char *key, uint64_t *v) {
  char path[8500], line[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int got = 0;
  const size_t kl = key ? strlen(key) : 0;
  while (!got && fgets(line, sizeof line, f)) {
    if (key && (strncmp(line, key, kl) || line[kl] != ' ')) continue;
    const char *s = line + kl + (key ? 1 : 0);
    if (!strncmp(s, "max", 3)) *v = UINT64_MAX, got = 1;
    else got = sscanf(s, "%lu", (unsigned long *)v) == 1;
  }
  fclose(f);
  return got;
}

int hostmem_cgroup(const char *self_cgroup, const char *root, uint64_t *limit, uint64_t *room) {
  /* v1's memory controller where one is mounted, else the unified tree */
  char path[4096] = "", base[4200];
  int v1 = 0;
  for (const char *l = self_cgroup; l && *l;) {
    const char *end = strchr(l, '\n'), *c1 = strchr(l, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    const size_t len = end ? (size_t)(end - l) : strlen(l);
    if (c2 && c2 < l + len) {
      const size_t cl = (size_t)(c2 - c1 - 1), pl = len - (size_t)(c2 + 1 - l);
      const int mem = cl == 6 && !strncmp(c1 + 1, "memory", 6);
      if ((mem || (!cl && !v1)) && pl < sizeof path) {
        memcpy(path, c2 + 1, pl);
        path[pl] = 0;
        v1 = mem;
      }
    }
    l = end ? end + 1 : NULL;
  }
  if (path[0] != '/') return 0;
  snprintf(base, sizeof base, "%s%s", root, v1 ? "/memory" : "");
  const char *lim_name = v1 ? "memory.limit_in_bytes" : "memory.max";
  const char *use_name = v1 ? "memory.usage_in_bytes" : "memory.current";
  const char *inactive = v1 ? "total_inactive_file" : "inactive_file";
  int found = 0;
  /* this group, then each one above it, to the root */
  for (size_t n = strlen(path);;) {
    char dir[8400];
    snprintf(dir, sizeof dir, "%s%.*s", base, (int)n, path);
    uint64_t lim, use = 0, drop = 0;
    if (hostmem_read(dir, lim_name, NULL, &lim) && lim < HOSTMEM_NONE) {
      hostmem_read(dir, use_name, NULL, &use);
      hostmem_read(dir, "memory.stat", inactive, &drop);
      const uint64_t held = use > drop ? use - drop : 0;
      const uint64_t r = lim > held ? lim - held : 0;
      if (!found || lim < *limit) *limit = lim;
      if (!found || r < *room) *room = r;
      found = 1;
    }
    if (n <= 1) break;
    while (n > 1 && path[n - 1] != '/') n--; /* up a level: "/a/b" -> "/a" */
    if (n > 1) n--;
  }
  return found;
}

/* hostmem_cgroup of this process (0 when none limits it). */
static int hostmem_self(uint64_t *limit, uint64_t *room) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return 0;
  char text[8192];
  const size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  return hostmem_cgroup(text, "/sys/fs/cgroup", limit, room);
}

uint64_t hostmem_total(void) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t total = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0, limit, room;
  if (hostmem_self(&limit, &room) && (!total || limit < total)) total = limit;
  return total;
}

uint64_t hostmem_available(void) {
  uint64_t avail = 0, limit, room;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    unsigned long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lu kB", &kb) == 1) {
        avail = (uint64_t)kb * 1024;
        break;
      }
    fclose(f);
  }
  if (hostmem_self(&limit, &room) && (!avail || room < avail)) avail = room;
  return avail;
}

/* inventory_probe: prints what inventory_find (and inventory_measure) make of a spec, one device per
 * line ("kind index memory total free_error name"), then "host SHARE" when
 * a second argument is "host", or "error CODE MESSAGE";
 * test_inventory runs it with the fake driver on its library path. */
#include <stdio.h>
#include <string.h>

#include "daemon/common/err.h"
#include "daemon/node/inventory.h"

int main(int argc, char **argv) {
  inventory_t d;
  int rc = inventory_find(argc > 1 ? argv[1] : NULL, &d);
  if (!rc) inventory_measure(&d);
  if (rc) {
    printf("error %s %s\n", err_name(rc), err_msg());
    return 1;
  }
  for (int i = 0; i < d.count; i++)
    printf("%s %d %llu %llu %d %s\n", d.dev[i].kind, d.dev[i].index,
           (unsigned long long)d.dev[i].memory, (unsigned long long)d.dev[i].total,
           d.dev[i].free_error, d.dev[i].name);
  if (argc > 2 && !strcmp(argv[2], "host")) printf("host %llu\n", (unsigned long long)d.host_share);
  return 0;
}

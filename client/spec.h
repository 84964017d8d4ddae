/* spec: the options of a job as fsdpctl submits them: `[section] key = value`
 * triples from a job file, then flags on top.
 *
 * fsdpctl knows no option's meaning: it carries what the user wrote, and the
 * coordinator validates it with the engine's own option table (so there is
 * one list of options and one set of checks). The one key read here is
 * `mesh`, to derive the world size when --ranks is not given. */
#ifndef FSDP_CLIENT_SPEC_H
#define FSDP_CLIENT_SPEC_H

#include <stddef.h>
#include <stdint.h>

typedef struct spec_opt {
  char *section; /* "" : any section (a flag) */
  char *key;
  char *value;
} spec_opt_t;

typedef struct spec {
  spec_opt_t *opts;
  size_t n, cap;
} spec_t; /* zero-initialised is empty */

/* Appends every `[section] key = value` of the INI file at path, in file
 * order (a value in double quotes loses them, as fsdp-train reads it).
 * A line that is not INI fails naming the file and the line. */
int spec_load_file(spec_t *s, const char *path);
/* A flag: drops every earlier option with this key, in any section, then
 * appends (section, key, value). */
int spec_set(spec_t *s, const char *section, const char *key, const char *value);
/* "section.key=value" (or "key=value") as --set gives it. */
int spec_set_arg(spec_t *s, const char *arg);
/* The world size the last `mesh` option implies ("RxS": R*S, "N": N) in
 * *world, or 0 when no mesh is given. A mesh that does not parse fails
 * naming it. */
int spec_world_from_mesh(const spec_t *s, uint32_t *world);
void spec_free(spec_t *s);

#endif

/* pbjson: any protobuf-c message as a jansson value, for `fsdpctl --output
 * json`, walked through the generated descriptors so that a field added to
 * proto/fsdp.proto shows up with no change here.
 *
 * The mapping (documented in the README for scripts): field names as in the
 * .proto (snake_case), every field present (zeros included: a script need
 * not know proto3's defaults), enums as their value's name without the
 * enum's prefix ("RUNNING", not "JOB_STATE_RUNNING"; a number the client
 * does not know stays a number), 64-bit integers as JSON numbers, bytes as
 * base64, repeated fields as arrays, an absent message as null, a float or
 * double that is NaN or infinite (a diverged run's loss) as null: JSON has no
 * such numbers. */
#ifndef FSDP_CLIENT_PBJSON_H
#define FSDP_CLIENT_PBJSON_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

/* A new reference, or NULL when out of memory. m may be NULL (json null). */
json_t *pbjson_message(const ProtobufCMessage *m);
/* The short name of an enum value ("RUNNING"), or NULL for a value the
 * descriptor does not know. */
const char *pbjson_enum_name(const ProtobufCEnumDescriptor *d, int value);
/* The value of a short or full name, case-insensitive ("running",
 * "JOB_STATE_RUNNING"); -1 when none matches. */
int pbjson_enum_value(const ProtobufCEnumDescriptor *d, const char *name);

#endif

/* pbjson: protobuf-c messages as JSON through their descriptors (see pbjson.h). */
#include "client/pbjson.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The enum's prefix is its UNSPECIFIED zero value's name less "UNSPECIFIED"
 * (proto/fsdp.proto's rule for every enum); 0 when an enum breaks it. */
static size_t pbjson_enum_prefix(const ProtobufCEnumDescriptor *d) {
  static const char unspec[] = "UNSPECIFIED";
  const ProtobufCEnumValue *z = protobuf_c_enum_descriptor_get_value(d, 0);
  if (!z) return 0;
  size_t n = strlen(z->name), u = sizeof unspec - 1;
  if (n <= u || strcmp(z->name + n - u, unspec)) return 0;
  return n - u;
}

const char *pbjson_enum_name(const ProtobufCEnumDescriptor *d, int value) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
  if (!v) return NULL;
  size_t p = pbjson_enum_prefix(d);
  const ProtobufCEnumValue *z = protobuf_c_enum_descriptor_get_value(d, 0);
  return p && !strncmp(v->name, z->name, p) ? v->name + p : v->name;
}

int pbjson_enum_value(const ProtobufCEnumDescriptor *d, const char *name) {
  for (unsigned i = 0; i < d->n_values; i++) {
    const ProtobufCEnumValue *v = &d->values[i];
    if (!strcasecmp(v->name, name) || !strcasecmp(pbjson_enum_name(d, v->value), name))
      return v->value;
  }
  return -1;
}

static json_t *pbjson_base64(const ProtobufCBinaryData *b) {
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *s = malloc(4 * ((b->len + 2) / 3) + 1);
  if (!s) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < b->len; i += 3) {
    uint32_t x = (uint32_t)b->data[i] << 16;
    if (i + 1 < b->len) x |= (uint32_t)b->data[i + 1] << 8;
    if (i + 2 < b->len) x |= b->data[i + 2];
    s[k++] = abc[x >> 18 & 63];
    s[k++] = abc[x >> 12 & 63];
    s[k++] = i + 1 < b->len ? abc[x >> 6 & 63] : '=';
    s[k++] = i + 2 < b->len ? abc[x & 63] : '=';
  }
  s[k] = 0;
  json_t *j = json_string(s);
  free(s);
  return j;
}

/* Bytes one element of a field's type takes in a message (or its array). */
static size_t pbjson_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_ENUM:
    return 4;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: return 8;
  case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
  case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
  }
  return 0;
}

static json_t *pbjson_real(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* One value of field f stored at p. */
static json_t *pbjson_value(const ProtobufCFieldDescriptor *f, const void *p) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    return json_integer(*(const int32_t *)p);
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    return json_integer(*(const uint32_t *)p);
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    return json_integer(*(const int64_t *)p);
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: /* bytes and counts: far below 2^63 */
    return json_integer((json_int_t)*(const uint64_t *)p);
  /* JSON has no NaN or infinity (jansson refuses them): null, so that a
   * diverged run's loss still prints with the rest of its job */
  case PROTOBUF_C_TYPE_FLOAT: return pbjson_real(*(const float *)p);
  case PROTOBUF_C_TYPE_DOUBLE: return pbjson_real(*(const double *)p);
  case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
  case PROTOBUF_C_TYPE_ENUM: {
    int v = *(const int *)p;
    const char *name = pbjson_enum_name(f->descriptor, v);
    return name ? json_string(name) : json_integer(v);
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)p;
    return json_string(s ? s : "");
  }
  case PROTOBUF_C_TYPE_BYTES: return pbjson_base64(p);
  case PROTOBUF_C_TYPE_MESSAGE: return pbjson_message(*(ProtobufCMessage *const *)p);
  }
  return json_null();
}

json_t *pbjson_message(const ProtobufCMessage *m) {
  if (!m) return json_null();
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  json_t *o = json_object();
  if (!o) return NULL;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const void *p = base + f->offset;
    json_t *v;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      const char *arr = *(char *const *)p;
      v = json_array();
      for (size_t k = 0; v && k < n; k++)
        if (json_array_append_new(v, pbjson_value(f, arr + k * pbjson_size(f->type)))) {
          json_decref(v);
          v = NULL;
        }
    } else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      if (*(const uint32_t *)(base + f->quantifier_offset) != f->id) continue; /* another member */
      v = pbjson_value(f, p);
    } else {
      v = pbjson_value(f, p);
    }
    if (!v || json_object_set_new(o, f->name, v)) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

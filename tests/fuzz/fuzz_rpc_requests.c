/* fuzz_rpc_requests: every request decoder of proto/fsdp.proto (and the
 * health check's), as the RPC layer runs them on bytes from the network.
 * The first byte picks the method (the services' descriptors list them, so a
 * method added to the proto is fuzzed with no change here), the rest is the
 * request: unpack, pack again (the size it said), free. Packed bytes need
 * not decode again: protobuf-c keeps an unknown field whose tag was
 * over-long-encoded as field 0 ("80 00"), packs it canonically ("00") and
 * then refuses that. Harmless to us (unknown fields are ignored), so not
 * asserted. */
#include <stdlib.h>

#include "proto/fsdp.pb-c.h"
#include "proto/health.pb-c.h"

static const ProtobufCServiceDescriptor *const services[] = {
    &fsdp__v1__coordinator__descriptor, &fsdp__v1__node__descriptor,
    &grpc__health__v1__health__descriptor};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!size) return 0;
  unsigned total = 0, pick = data[0];
  for (size_t s = 0; s < sizeof services / sizeof services[0]; s++) total += services[s]->n_methods;
  pick %= total;
  const ProtobufCMessageDescriptor *d = NULL;
  for (size_t s = 0; !d; s++) {
    if (pick < services[s]->n_methods) d = services[s]->methods[pick].input;
    else pick -= services[s]->n_methods;
  }
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
  if (!m) return 0;
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) abort();
  if (protobuf_c_message_pack(m, buf) != n) abort();
  protobuf_c_message_free_unpacked(m, NULL);
  free(buf);
  return 0;
}

/* fuzz: what the libFuzzer targets share: the input as a file (the decoders
 * under test read paths), and quiet logs. */
#ifndef FSDP_FUZZ_H
#define FSDP_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Writes data to an anonymous in-memory file and puts a path that opens it in
 * path (64 bytes). Returns the descriptor to close after the decoder ran. */
int fuzz_file(const uint8_t *data, size_t size, char *path);

#endif

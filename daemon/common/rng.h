/* rng: the project's one counter-based random function (splitmix64).
 *
 * rng_mix is a bijective mix of a 64-bit value: hashing a counter gives values
 * that depend only on (seed, counter), which is what makes initial weights and
 * data order the same for any world size or resume point. rng_next steps a
 * state for a plain stream. Not for cryptography. */
#ifndef FSDP_RNG_H
#define FSDP_RNG_H

#include <stdint.h>

static inline uint64_t rng_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The next value of the stream whose state is *s (splitmix64). */
static inline uint64_t rng_next(uint64_t *s) {
  uint64_t z = *s;
  *s += 0x9e3779b97f4a7c15ull;
  return rng_mix(z);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double rng_unit(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

#endif

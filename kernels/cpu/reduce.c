/* reduce: the element-wise work of the CPU collectives (the ring in
 * daemon/comm): a + b into a destination, fp32 or bf16, optionally divided
 * (an average), optionally streamed out with non-temporal stores when the
 * destination outsizes the caches; and a copy that streams the same way.
 * Memory-bound loops: what matters is one pass over memory, and not reading
 * a destination line only to overwrite it. */
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu.h"
#include "kernels/kern_math.h"

/* Loads of the first operand, which may be unaligned (it can lie in a
 * shared-memory link, whose stream positions follow earlier ops' sizes):
 * memcpy compiles to plain (vector) loads. */
static inline float reduce_ld_f32(const uint8_t *p) {
  float v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline uint16_t reduce_ld_u16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, sizeof v);
  return v;
}

static void reduce_f32(float *d, const uint8_t *x, const float *y, size_t n, float div) {
  if (div == 1.0f)
    for (size_t i = 0; i < n; i++) d[i] = reduce_ld_f32(x + 4 * i) + y[i];
  else
    for (size_t i = 0; i < n; i++) d[i] = (reduce_ld_f32(x + 4 * i) + y[i]) / div;
}

static void reduce_bf16(uint16_t *d, const uint8_t *x, const uint16_t *y, size_t n, float div) {
  for (size_t i = 0; i < n; i++) {
    float s = kern_bf16_to_f32(reduce_ld_u16(x + 2 * i)) + kern_bf16_to_f32(y[i]);
    d[i] = kern_f32_to_bf16(div == 1.0f ? s : s / div);
  }
}

#if defined(__SSE2__) /* every x86-64 processor: no run-time choice needed */
void kern_cpu_copy_stream(void *dst, const void *src, size_t n) {
  if (n < 4096) {
    memcpy(dst, src, n);
    return;
  }
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = (size_t)(-(uintptr_t)d & 63); /* whole cache lines from here */
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
#if defined(__AVX__) /* the avx2 and avx512 levels: two 32-byte stores a line */
    __m256i lo = _mm256_loadu_si256((const __m256i *)s);
    __m256i hi = _mm256_loadu_si256((const __m256i *)(s + 32));
    _mm256_stream_si256((__m256i *)d, lo);
    _mm256_stream_si256((__m256i *)(d + 32), hi);
#else
    for (int i = 0; i < 64; i += 16)
      _mm_stream_si128((__m128i *)(d + i), _mm_loadu_si128((const __m128i *)(s + i)));
#endif
  }
  memcpy(d, s, n);
  _mm_sfence(); /* the streamed lines are visible before whatever this thread publishes next */
}

/* fp32 sums straight from the registers with non-temporal stores (whole
 * aligned vectors, 32 bytes at the avx2 and avx512 levels, 16 below; the ends
 * plainly), then a store fence. */
#if defined(__AVX__)
#define REDUCE_W 8
#define REDUCE_PS __m256
#define REDUCE_SET1 _mm256_set1_ps
#define REDUCE_LOADU _mm256_loadu_ps
#define REDUCE_ADD _mm256_add_ps
#define REDUCE_DIV _mm256_div_ps
#define REDUCE_STREAM _mm256_stream_ps
#else
#define REDUCE_W 4
#define REDUCE_PS __m128
#define REDUCE_SET1 _mm_set1_ps
#define REDUCE_LOADU _mm_loadu_ps
#define REDUCE_ADD _mm_add_ps
#define REDUCE_DIV _mm_div_ps
#define REDUCE_STREAM _mm_stream_ps
#endif
static void reduce_f32_stream(float *d, const uint8_t *x, const float *y, size_t n, float div) {
  size_t i = 0;
  for (; i < n && ((uintptr_t)(d + i) & (4 * REDUCE_W - 1)); i++)
    d[i] = (reduce_ld_f32(x + 4 * i) + y[i]) / div;
  const REDUCE_PS vd = REDUCE_SET1(div);
  if (div == 1.0f)
    for (; i + REDUCE_W <= n; i += REDUCE_W)
      REDUCE_STREAM(d + i, REDUCE_ADD(REDUCE_LOADU((const float *)(x + 4 * i)), REDUCE_LOADU(y + i)));
  else
    for (; i + REDUCE_W <= n; i += REDUCE_W)
      REDUCE_STREAM(d + i, REDUCE_DIV(REDUCE_ADD(REDUCE_LOADU((const float *)(x + 4 * i)),
                                                 REDUCE_LOADU(y + i)), vd));
  for (; i < n; i++) d[i] = (reduce_ld_f32(x + 4 * i) + y[i]) / div;
  _mm_sfence();
}

#else
void kern_cpu_copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static void reduce_f32_stream(float *d, const uint8_t *x, const float *y, size_t n, float div) {
  reduce_f32(d, x, y, n, div);
}
#endif

void kern_cpu_reduce_f32(float *dst, const void *a, const float *b, size_t n, float div,
                         int stream) {
  if (stream) reduce_f32_stream(dst, a, b, n, div);
  else reduce_f32(dst, a, b, n, div);
}

void kern_cpu_reduce_bf16(uint16_t *dst, const void *a, const uint16_t *b, size_t n, float div,
                          int stream) {
  if (!stream) {
    reduce_bf16(dst, a, b, n, div);
    return;
  }
  /* through a block in L1, then streamed out */
  _Alignas(64) uint16_t tmp[4096];
  const size_t step = sizeof tmp / sizeof *tmp;
  for (size_t i = 0; i < n; i += step) {
    size_t k = n - i < step ? n - i : step;
    reduce_bf16(tmp, (const uint8_t *)a + 2 * i, b + i, k, div);
    kern_cpu_copy_stream(dst + i, tmp, 2 * k);
  }
}

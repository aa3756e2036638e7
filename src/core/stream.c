/* Copies with streaming (non-temporal) stores, for memory another core reads next: the store does not first take
 * each line from that core's cache (the read for ownership an ordinary store of a shared line waits for); the
 * lines go out of this core's cache instead. */
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "core/impl.h"

void dt_stream_store(float *dst, const float *src, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  for (; i < n && ((uintptr_t)(dst + i) & 63) != 0; i++) dst[i] = src[i]; /* up to the first whole line */
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#elif defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#else
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
#endif
  _mm_sfence(); /* ordered before whatever tells the other core the memory is ready (a plain release store is not) */
#endif
  if (i < n) memcpy(dst + i, src + i, (n - i) * sizeof *dst);
}

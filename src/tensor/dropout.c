/* Dropout kernels with a Philox mask: element i uses word i%4 of block i/4, so any thread count gives the same mask. */
#include "tensor/kernels.h"

#include "dtrain/core.h"

/* Kept when the 24-bit uniform u = word >> 8 (in units of 2^-24) is >= p: probability 1 - p. */
static inline uint8_t keep(uint32_t word, uint32_t threshold) { return (word >> 8) >= threshold; }

static uint32_t threshold_of(float p) {
  double t = (double)p * 16777216.0; /* p in [0, 1) -> [0, 2^24) */
  return (uint32_t)(t + 0.5);
}

void dt_dropout_forward(float *out, uint8_t *mask, const float *inp, size_t n, float p, uint64_t seed,
                        uint64_t stream) {
  dt_rng r;
  dt_rng_init(&r, seed, stream);
  const uint64_t key = r.key;
  const uint32_t th = threshold_of(p);
  const float scale = 1.0f / (1.0f - p);
  const size_t blocks = (n + 3) / 4;
#pragma omp parallel for if (n >= 16384) schedule(static)
  for (size_t b = 0; b < blocks; b++) {
    uint32_t w[4];
    dt_philox4x32(key, (uint64_t)b, w);
    const size_t i0 = b * 4, end = i0 + 4 < n ? i0 + 4 : n;
    for (size_t i = i0; i < end; i++) {
      const uint8_t k = keep(w[i - i0], th);
      mask[i] = k;
      out[i] = k ? inp[i] * scale : 0.0f;
    }
  }
}

void dt_dropout_range(float *out, const float *inp, size_t first, size_t n, float p, uint64_t seed, uint64_t stream) {
  dt_rng r;
  dt_rng_init(&r, seed, stream);
  const uint32_t th = threshold_of(p);
  const float scale = 1.0f / (1.0f - p);
  uint32_t w[4];
  for (size_t i = 0; i < n; i++) {
    const size_t e = first + i;
    if (i == 0 || e % 4 == 0) dt_philox4x32(r.key, (uint64_t)(e / 4), w);
    out[i] = keep(w[e % 4], th) ? inp[i] * scale : 0.0f;
  }
}

void dt_dropout_backward(float *dinp, const float *dout, const uint8_t *mask, size_t n, float p) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for simd if (parallel: n >= 65536) schedule(static)
  for (size_t i = 0; i < n; i++) dinp[i] = mask[i] ? dout[i] * scale : 0.0f;
}

/* Dropout kernels with a Philox mask: element i uses word i%4 of block i/4, so any thread count gives the same mask. */
#include "tensor/kernels.h"

#include "core/philox.h"
#include "dtrain/core.h"

/* Kept when the 24-bit uniform u = word >> 8 (in units of 2^-24) is >= p: probability 1 - p. */
static inline uint8_t keep(uint32_t word, uint32_t threshold) { return (word >> 8) >= threshold; }

static uint32_t threshold_of(float p) {
  double t = (double)p * 16777216.0; /* p in [0, 1) -> [0, 2^24) */
  return (uint32_t)(t + 0.5);
}

/* Elements DT_PHILOX_LANES blocks (64 elements) at a time, the words drawn in vectors (core/philox.h). */
#define RUN (4 * DT_PHILOX_LANES)

void dt_dropout_forward(float *out, uint8_t *mask, const float *inp, size_t n, float p, uint64_t seed,
                        uint64_t stream) {
  dt_rng r;
  dt_rng_init(&r, seed, stream);
  const uint64_t key = r.key;
  const uint32_t th = threshold_of(p);
  const float scale = 1.0f / (1.0f - p);
  const size_t runs = (n + RUN - 1) / RUN;
#pragma omp parallel for if (n >= 16384) schedule(static)
  for (size_t k = 0; k < runs; k++) {
    uint32_t w[RUN];
    dt_philox_lanes(key, (uint64_t)k * DT_PHILOX_LANES, w);
    const size_t i0 = k * RUN, m = n - i0 < RUN ? n - i0 : RUN;
    for (size_t i = 0; i < m; i++) {
      const uint8_t kept = keep(w[i], th);
      mask[i0 + i] = kept;
      out[i0 + i] = kept ? inp[i0 + i] * scale : 0.0f;
    }
  }
}

void dt_dropout_range(float *out, const float *inp, size_t first, size_t n, float p, uint64_t seed, uint64_t stream) {
  dt_rng r;
  dt_rng_init(&r, seed, stream);
  const uint32_t th = threshold_of(p);
  const float scale = 1.0f / (1.0f - p);
  uint32_t w[RUN];
  for (size_t i = 0; i < n;) {
    const size_t e = first + i, k = e / RUN, at = e - k * RUN, m = n - i < RUN - at ? n - i : RUN - at;
    dt_philox_lanes(r.key, (uint64_t)k * DT_PHILOX_LANES, w);
    for (size_t j = 0; j < m; j++) out[i + j] = keep(w[at + j], th) ? inp[i + j] * scale : 0.0f;
    i += m;
  }
}

void dt_dropout_backward(float *dinp, const float *dout, const uint8_t *mask, size_t n, float p) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for simd if (parallel: n >= 65536) schedule(static)
  for (size_t i = 0; i < n; i++) dinp[i] = mask[i] ? dout[i] * scale : 0.0f;
}

/* Philox4x32-10 counter-based RNG (Salmon et al., SC'11): same key and counter, same numbers. */
#include <math.h>

#include "core/impl.h"
#include "core/philox.h"

void dt_philox4x32(uint64_t key, uint64_t counter, uint32_t out[4]) { dt_philox_block(key, counter, out); }

/* SplitMix64 finaliser: spreads (seed, stream) over the whole key space. */
static uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void dt_rng_init(dt_rng *r, uint64_t seed, uint64_t stream) {
  r->key = mix64(seed ^ mix64(stream));
  r->counter = 0;
  r->used = 4;
}

uint32_t dt_rng_u32(dt_rng *r) {
  if (r->used == 4) {
    dt_philox4x32(r->key, r->counter++, r->buf);
    r->used = 0;
  }
  return r->buf[r->used++];
}

float dt_rng_uniform(dt_rng *r) { return (float)(dt_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

float dt_rng_uniform_range(dt_rng *r, float lo, float hi) { return lo + (hi - lo) * dt_rng_uniform(r); }

float dt_rng_normal(dt_rng *r) {
  /* u1 in (0, 1] so log never sees 0. */
  double u1 = ((double)dt_rng_u32(r) + 1.0) / 4294967296.0;
  double u2 = (double)dt_rng_u32(r) / 4294967296.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint32_t dt_rng_below(dt_rng *r, uint32_t n) {
  /* Lemire's multiply-shift with rejection: exactly uniform. */
  uint64_t m = (uint64_t)dt_rng_u32(r) * n;
  uint32_t low = (uint32_t)m;
  if (low < n) {
    uint32_t threshold = (uint32_t)(-n) % n;
    while (low < threshold) {
      m = (uint64_t)dt_rng_u32(r) * n;
      low = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

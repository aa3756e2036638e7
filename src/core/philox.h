/* Philox4x32-10 (Salmon et al., SC'11) inline: dt_philox_block is dt_philox4x32's (rng.c) one block; for kernels
 * that draw many, dt_philox_lanes draws DT_PHILOX_LANES consecutive blocks at once, each lane's ten rounds
 * unrolled, so the compiler runs the lanes in vectors (the 32x32->64-bit products as vpmuludq or vpmullq). */
#ifndef DT_CORE_PHILOX_H
#define DT_CORE_PHILOX_H

#include <stdint.h>

#define DT_PHILOX_M0 0xD2511F53u
#define DT_PHILOX_M1 0xCD9E8D57u
#define DT_PHILOX_W0 0x9E3779B9u
#define DT_PHILOX_W1 0xBB67AE85u
#define DT_PHILOX_LANES 16

/* One block: the words of (key, counter). */
static inline void dt_philox_block(uint64_t key, uint64_t counter, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < 10; round++) {
    const uint64_t p0 = (uint64_t)DT_PHILOX_M0 * c0, p1 = (uint64_t)DT_PHILOX_M1 * c2;
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
    k0 += DT_PHILOX_W0;
    k1 += DT_PHILOX_W1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* Blocks first .. first + DT_PHILOX_LANES - 1 of key: word q of block first + j in out[4 * j + q]. */
static inline void dt_philox_lanes(uint64_t key, uint64_t first, uint32_t out[4 * DT_PHILOX_LANES]) {
  for (int j = 0; j < DT_PHILOX_LANES; j++) dt_philox_block(key, first + (uint64_t)j, out + 4 * j);
}

#endif

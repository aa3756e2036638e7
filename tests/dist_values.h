/* Element access by dtype and the block partition, shared by the
 * multi-process tests (group level and backend level). */
#ifndef DT_TESTS_DIST_VALUES_H
#define DT_TESTS_DIST_VALUES_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/dist.h"
#include "dtrain/tensor.h"

/* buf[i] = v in dtype t (bf16/f16 rounded to nearest even). */
static inline void dv_put(void *buf, dt_dtype t, size_t i, double v) {
  switch (t) {
  case DT_F32: ((float *)buf)[i] = (float)v; break;
  case DT_F64: ((double *)buf)[i] = v; break;
  case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
  case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
  case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
  default: break;
  }
}

static inline double dv_get(const void *buf, dt_dtype t, size_t i) {
  switch (t) {
  case DT_F32: return ((const float *)buf)[i];
  case DT_F64: return ((const double *)buf)[i];
  case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
  case DT_F16: return dt_f16_to_f32(((const uint16_t *)buf)[i]);
  case DT_I32: return ((const int32_t *)buf)[i];
  case DT_I64: return (double)((const int64_t *)buf)[i];
  default: return 0;
  }
}

/* Backend-level test inputs: element i of rank r, an integer in -11..11, so
 * every sum over up to 5 ranks is exact in bf16 and f16. */
static inline double dv_input(int rank, size_t i) { return (double)((int)((i * 7 + (size_t)rank * 13) % 23) - 11); }

/* The reduction of dv_input over ranks 0..size-1 (AVG as SUM, as backends do). */
static inline double dv_reference(dt_redop op, int size, size_t i) {
  double acc = dv_input(0, i);
  for (int r = 1; r < size; r++) {
    double v = dv_input(r, i);
    acc = op == DT_MIN ? (v < acc ? v : acc) : op == DT_MAX ? (v > acc ? v : acc) : acc + v;
  }
  return acc;
}

#endif

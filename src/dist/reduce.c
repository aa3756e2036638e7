/* Reduction kernels of the collectives: op(dst, src) over every dtype and op.
 * f32/f64/i32/i64 reduce natively (vectorised loops); bf16/f16 are widened to
 * f32 in blocks, reduced, and rounded back once per call. DT_AVG reduces as a
 * sum; dt_reduce_scale divides it (the group at the end, or shm as it reduces). */
#include <string.h>

#include "dist/dist-impl.h"

#define BLOCK 512 /* f32 temporaries for bf16/f16 blocks: 2 KiB on the stack each */

/* One loop per (type, op); `restrict`-free because dst may alias a source. */
#define DEFINE_PAIR(T, name)                                                               \
  static void name##_sum(T *d, const T *a, const T *b, size_t n) {                         \
    for (size_t i = 0; i < n; i++) d[i] = a[i] + b[i];                                     \
  }                                                                                        \
  static void name##_min(T *d, const T *a, const T *b, size_t n) {                         \
    for (size_t i = 0; i < n; i++) d[i] = b[i] < a[i] ? b[i] : a[i];                       \
  }                                                                                        \
  static void name##_max(T *d, const T *a, const T *b, size_t n) {                         \
    for (size_t i = 0; i < n; i++) d[i] = b[i] > a[i] ? b[i] : a[i];                       \
  }                                                                                        \
  static void name##_pair(T *d, const T *a, const T *b, size_t n, dt_redop op) {           \
    switch (op) {                                                                          \
    case DT_MIN: name##_min(d, a, b, n); break;                                            \
    case DT_MAX: name##_max(d, a, b, n); break;                                            \
    default: name##_sum(d, a, b, n); break;                                                \
    }                                                                                      \
  }

DEFINE_PAIR(float, f32)
DEFINE_PAIR(double, f64)
DEFINE_PAIR(int32_t, i32)
DEFINE_PAIR(int64_t, i64)

/* Integer sums wrap like two's complement (as MPI and NCCL do) instead of being UB. */
static void i32_sum_wrap(int32_t *d, const int32_t *a, const int32_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = (int32_t)((uint32_t)a[i] + (uint32_t)b[i]);
}
static void i64_sum_wrap(int64_t *d, const int64_t *a, const int64_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]);
}

static void widen(float *out, const uint16_t *in, size_t n, dt_dtype t) {
  (t == DT_BF16 ? dt_bf16_to_f32_n : dt_f16_to_f32_n)(out, in, n);
}

static void narrow(uint16_t *out, const float *in, size_t n, dt_dtype t) {
  (t == DT_BF16 ? dt_f32_to_bf16_n : dt_f32_to_f16_n)(out, in, n, 1.0f);
}

void dt_reduce_many(void *dst, const void *const *srcs, int k, size_t n, dt_dtype t, dt_redop op) {
  if (k <= 0 || n == 0) return;
  if (t == DT_BF16 || t == DT_F16) {
    float acc[BLOCK], tmp[BLOCK];
    for (size_t at = 0; at < n; at += BLOCK) {
      size_t m = n - at < BLOCK ? n - at : BLOCK;
      widen(acc, (const uint16_t *)srcs[0] + at, m, t);
      for (int j = 1; j < k; j++) {
        widen(tmp, (const uint16_t *)srcs[j] + at, m, t);
        f32_pair(acc, acc, tmp, m, op);
      }
      narrow((uint16_t *)dst + at, acc, m, t);
    }
    return;
  }
  if (k == 1) {
    if (dst != srcs[0]) memmove(dst, srcs[0], n * dt_dtype_size(t));
    return;
  }
  /* Pairwise into dst: dst = op(src0, src1), then dst = op(dst, srcj). Done in
   * cache-sized blocks so dst stays in L1/L2 across the k passes. */
  size_t es = dt_dtype_size(t), blk = 8192 / es;
  for (size_t at = 0; at < n; at += blk) {
    size_t m = n - at < blk ? n - at : blk;
    char *d = (char *)dst + at * es;
    for (int j = 1; j < k; j++) {
      const char *a = j == 1 ? (const char *)srcs[0] + at * es : d;
      const char *b = (const char *)srcs[j] + at * es;
      switch (t) {
      case DT_F32: f32_pair((float *)d, (const float *)a, (const float *)b, m, op); break;
      case DT_F64: f64_pair((double *)d, (const double *)a, (const double *)b, m, op); break;
      case DT_I32:
        if (op == DT_SUM || op == DT_AVG)
          i32_sum_wrap((int32_t *)d, (const int32_t *)a, (const int32_t *)b, m);
        else
          i32_pair((int32_t *)d, (const int32_t *)a, (const int32_t *)b, m, op);
        break;
      case DT_I64:
        if (op == DT_SUM || op == DT_AVG)
          i64_sum_wrap((int64_t *)d, (const int64_t *)a, (const int64_t *)b, m);
        else
          i64_pair((int64_t *)d, (const int64_t *)a, (const int64_t *)b, m, op);
        break;
      default: break;
      }
    }
  }
}

void dt_reduce_pair(void *dst, const void *a, const void *b, size_t n, dt_dtype t, dt_redop op) {
  const void *srcs[2] = {a, b};
  dt_reduce_many(dst, srcs, 2, n, t, op);
}

void dt_reduce_into(void *dst, const void *src, size_t n, dt_dtype t, dt_redop op) {
  dt_reduce_pair(dst, dst, src, n, t, op);
}

void dt_reduce_scale(void *dst, size_t n, dt_dtype t, int divisor) {
  if (divisor <= 1 || n == 0) return;
  const int pow2 = (divisor & (divisor - 1)) == 0;
  switch (t) {
  case DT_F32: {
    float *d = dst;
    /* Division, as PyTorch's average (sum / world), for its bits; by a power of two the reciprocal is exact and
     * the product is the same real number rounded the same way, at a fraction of a division's cost. */
    if (pow2) {
      const float r = 1.0f / (float)divisor;
      for (size_t i = 0; i < n; i++) d[i] *= r;
    } else {
      for (size_t i = 0; i < n; i++) d[i] /= (float)divisor;
    }
    break;
  }
  case DT_F64: {
    double *d = dst;
    if (pow2) {
      const double r = 1.0 / (double)divisor;
      for (size_t i = 0; i < n; i++) d[i] *= r;
    } else {
      for (size_t i = 0; i < n; i++) d[i] /= (double)divisor;
    }
    break;
  }
  case DT_I32: {
    int32_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] /= divisor;
    break;
  }
  case DT_I64: {
    int64_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] /= divisor;
    break;
  }
  case DT_BF16:
  case DT_F16: {
    float tmp[BLOCK];
    for (size_t at = 0; at < n; at += BLOCK) {
      size_t m = n - at < BLOCK ? n - at : BLOCK;
      widen(tmp, (uint16_t *)dst + at, m, t);
      for (size_t i = 0; i < m; i++) tmp[i] /= (float)divisor;
      narrow((uint16_t *)dst + at, tmp, m, t);
    }
    break;
  }
  default: break;
  }
}

/* dt_tensor: a shape, dtype and device over a buffer (f32 on CPU today). */
#ifndef DTRAIN_TENSOR_H
#define DTRAIN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MAX_DIMS 5

/* X(enum suffix, name, element bytes) */
#define DT_DTYPE_MAP(X) \
  X(F32, "f32", 4)      \
  X(BF16, "bf16", 2)    \
  X(F16, "f16", 2)      \
  X(I32, "i32", 4)      \
  X(I64, "i64", 8)      \
  X(F64, "f64", 8)

typedef enum dt_dtype {
#define DT_DTYPE_ENUM_(e, name, size) DT_##e,
  DT_DTYPE_MAP(DT_DTYPE_ENUM_)
#undef DT_DTYPE_ENUM_
  DT_DTYPE_COUNT
} dt_dtype;

typedef enum dt_device { DT_CPU = 0, DT_CUDA = 1 } dt_device;

/* A tensor is a plain descriptor, like DLPack's DLTensor: it may own its
 * buffer (made by dt_tensor_new, released by dt_tensor_free) or view someone
 * else's (dt_tensor_view; then free releases nothing). Contiguous, row-major. */
typedef struct dt_tensor {
  void *data;
  dt_dtype dtype;
  dt_device device;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int owns; /* 1 if dt_tensor_free releases data */
} dt_tensor;

const char *dt_dtype_name(dt_dtype t);
size_t dt_dtype_size(dt_dtype t);
/* Parses "f32", "bf16", ...; DT_INVALID_ARGUMENT otherwise. */
dt_status dt_dtype_parse(const char *s, dt_dtype *out);

/* Allocates a zeroed, 64-byte aligned tensor. ndim in 0..DT_MAX_DIMS, dims >= 0. */
dt_status dt_tensor_new(dt_tensor *t, dt_dtype dtype, int ndim, const int64_t *shape);
/* Describes an existing buffer; the caller keeps ownership. */
dt_status dt_tensor_view(dt_tensor *t, void *data, dt_dtype dtype, int ndim, const int64_t *shape);
/* Releases an owned buffer; accepts a zeroed or already-freed tensor. */
void dt_tensor_free(dt_tensor *t);
int64_t dt_tensor_numel(const dt_tensor *t);
size_t dt_tensor_bytes(const dt_tensor *t);
/* "(64, 1, 28, 28)" into buf. */
const char *dt_tensor_shape_str(const dt_tensor *t, char *buf, size_t len);

/* bf16 / f16 conversions (round to nearest even), for storage and comm hooks. */
uint16_t dt_f32_to_bf16(float x);
float dt_bf16_to_f32(uint16_t x);
uint16_t dt_f32_to_f16(float x);
float dt_f16_to_f32(uint16_t x);
/* The same over n values (dst and src do not overlap); to 16 bits, each value times scale first (1: as it is). */
void dt_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n, float scale);
void dt_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void dt_f32_to_f16_n(uint16_t *dst, const float *src, size_t n, float scale);
void dt_f16_to_f32_n(float *dst, const uint16_t *src, size_t n);

#ifdef __cplusplus
}
#endif
#endif

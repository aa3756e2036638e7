/* dt_tensor descriptors, dtype table and bf16/f16 conversions. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/tensor.h"

static const struct {
  const char *name;
  size_t size;
} dtypes[] = {
#define DT_DTYPE_ROW_(e, name, size) {name, size},
    DT_DTYPE_MAP(DT_DTYPE_ROW_)
#undef DT_DTYPE_ROW_
};

const char *dt_dtype_name(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtypes[t].name : "?"; }

size_t dt_dtype_size(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtypes[t].size : 0; }

dt_status dt_dtype_parse(const char *s, dt_dtype *out) {
  for (int i = 0; i < DT_DTYPE_COUNT; i++)
    if (strcmp(s, dtypes[i].name) == 0) {
      *out = (dt_dtype)i;
      return DT_OK;
    }
  return dt_error(DT_INVALID_ARGUMENT, "unknown dtype '%s' (f32, bf16, f16, i32, i64, f64)", s);
}

static dt_status describe(dt_tensor *t, dt_dtype dtype, int ndim, const int64_t *shape, size_t *bytes) {
  if ((unsigned)dtype >= DT_DTYPE_COUNT) return dt_error(DT_INVALID_ARGUMENT, "bad dtype %d", (int)dtype);
  if (ndim < 0 || ndim > DT_MAX_DIMS)
    return dt_error(DT_INVALID_ARGUMENT, "tensor rank %d outside 0..%d", ndim, DT_MAX_DIMS);
  size_t n = dt_dtype_size(dtype);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return dt_error(DT_INVALID_ARGUMENT, "tensor dim %d is negative (%lld)", i, (long long)shape[i]);
    if (dt_mul_overflow(n, (size_t)shape[i], &n)) return dt_error(DT_OUT_OF_MEMORY, "tensor size overflows");
  }
  memset(t, 0, sizeof *t);
  t->dtype = dtype;
  t->device = DT_CPU;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  *bytes = n;
  return DT_OK;
}

dt_status dt_tensor_new(dt_tensor *t, dt_dtype dtype, int ndim, const int64_t *shape) {
  dt_tensor tmp;
  size_t bytes = 0;
  DT_CHECK(describe(&tmp, dtype, ndim, shape, &bytes));
  DT_CHECK(dt_alloc(bytes, &tmp.data));
  tmp.owns = 1;
  *t = tmp;
  return DT_OK;
}

dt_status dt_tensor_view(dt_tensor *t, void *data, dt_dtype dtype, int ndim, const int64_t *shape) {
  dt_tensor tmp;
  size_t bytes = 0;
  DT_CHECK(describe(&tmp, dtype, ndim, shape, &bytes));
  tmp.data = data;
  *t = tmp;
  return DT_OK;
}

void dt_tensor_free(dt_tensor *t) {
  if (!t) return;
  if (t->owns) dt_free(t->data);
  t->data = NULL;
  t->owns = 0;
}

int64_t dt_tensor_numel(const dt_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

size_t dt_tensor_bytes(const dt_tensor *t) { return (size_t)dt_tensor_numel(t) * dt_dtype_size(t->dtype); }

const char *dt_tensor_shape_str(const dt_tensor *t, char *buf, size_t len) {
  size_t off = 0;
  off += (size_t)snprintf(buf + off, len - off, "(");
  for (int i = 0; i < t->ndim && off < len; i++)
    off += (size_t)snprintf(buf + off, len - off, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (off < len) snprintf(buf + off, len - off, ")");
  return buf;
}

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* The conversions inline and branch-free (selects), so that the loops over many values below vectorise. */
static inline uint16_t to_bf16(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t nan = (u >> 16) | 0x40u; /* quiet NaN */
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static inline float from_bf16(uint16_t x) { return bits_f32((uint32_t)x << 16); }

/* fp16 (round to nearest even; from 65520 inf; NaN 0x7e00 with the sign): below 2^-14, adding 0.5 leaves the value
 * on the 2^-24 grid in the low bits (the FPU rounds); above, one add rounds the 13 bits cut, carrying into the
 * exponent where it must. */
static inline uint16_t to_f16(float x) {
  const uint32_t u = f32_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  const uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t subnormal = f32_bits(bits_f32(a) + 0.5f) - 0x3f000000u;
  const uint32_t h = a > 0x7f800000u ? 0x7e00u : a >= 0x477ff000u ? 0x7c00u : a < 0x38800000u ? subnormal : normal;
  return (uint16_t)(sign | h);
}

static inline float from_f16(uint16_t x) {
  const uint32_t sign = (uint32_t)(x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
  const uint32_t subnormal = f32_bits((float)(int32_t)m * (1.0f / 16777216.0f)); /* m * 2^-24, 0 included */
  const uint32_t exponent = e == 31 ? 0x7f800000u : (e + 112) << 23;
  const uint32_t tiny = 0u - (uint32_t)(e == 0); /* all ones where subnormal or zero */
  return bits_f32(sign | (subnormal & tiny) | ((exponent | (m << 13)) & ~tiny));
}

uint16_t dt_f32_to_bf16(float x) { return to_bf16(x); }
float dt_bf16_to_f32(uint16_t x) { return from_bf16(x); }
uint16_t dt_f32_to_f16(float x) { return to_f16(x); }
float dt_f16_to_f32(uint16_t x) { return from_f16(x); }

void dt_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) dst[i] = to_bf16(src[i] * scale);
}

void dt_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = from_bf16(src[i]);
}

void dt_f32_to_f16_n(uint16_t *dst, const float *src, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) dst[i] = to_f16(src[i] * scale);
}

void dt_f16_to_f32_n(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = from_f16(src[i]);
}

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

uint16_t dt_f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float dt_bf16_to_f32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

uint16_t dt_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow to inf (>= 65520) */
  if (absu < 0x38800000u) {                                    /* subnormal or zero in f16 */
    if (absu < 0x33000000u) return (uint16_t)sign;             /* rounds to zero */
    uint32_t e = absu >> 23, m = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t h = ((absu - 0x38000000u) >> 13);
  uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float dt_f16_to_f32(uint16_t x) {
  uint32_t sign = (uint32_t)(x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

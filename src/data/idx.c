/* IDX arrays (MNIST format): validated parsing from memory and loading from raw or gzip files. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/impl.h"
#include "data/data-impl.h"
#include "dtrain/data.h"

/* Bytes per element of an IDX type code; 0 for unknown codes. */
static size_t type_size(uint8_t type) {
  switch (type) {
  case 0x08: /* u8 */
  case 0x09: /* i8 */
    return 1;
  case 0x0B: /* i16 */
    return 2;
  case 0x0C: /* i32 */
  case 0x0D: /* f32 */
    return 4;
  case 0x0E: /* f64 */
    return 8;
  default:
    return 0;
  }
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Big-endian elements of `size` bytes -> host order. */
static void to_host(uint8_t *dst, const uint8_t *src, size_t count, size_t size) {
  if (size == 1) {
    memcpy(dst, src, count);
    return;
  }
  for (size_t i = 0; i < count; i++) {
    const uint8_t *s = src + i * size;
    uint8_t *d = dst + i * size;
    uint64_t v = 0;
    for (size_t b = 0; b < size; b++) v = v << 8 | s[b];
    if (size == 2) {
      uint16_t x = (uint16_t)v;
      memcpy(d, &x, 2);
    } else if (size == 4) {
      uint32_t x = (uint32_t)v;
      memcpy(d, &x, 4);
    } else {
      memcpy(d, &v, 8);
    }
  }
}

dt_status dt_idx_parse(const uint8_t *buf, size_t len, size_t max_bytes, dt_idx *out) {
  if (!buf && len) return dt_error(DT_INVALID_ARGUMENT, "idx: NULL buffer of %zu bytes", len);
  if (len < 4) return dt_error(DT_CORRUPT, "short header: %zu bytes, an IDX header needs at least 4", len);
  uint32_t magic = be32(buf);
  if (buf[0] != 0 || buf[1] != 0)
    return dt_error(DT_CORRUPT, "bad magic 0x%08x: the first two bytes must be zero (0x0000TTDD)", magic);
  uint8_t type = buf[2];
  size_t esize = type_size(type);
  if (esize == 0)
    return dt_error(DT_CORRUPT, "unknown element type 0x%02x in magic 0x%08x (known: 08 09 0B 0C 0D 0E)", type, magic);
  int ndim = buf[3];
  if (ndim < 1 || ndim > 4)
    return dt_error(DT_CORRUPT, "%d dimensions in magic 0x%08x: supported are 1 to 4", ndim, magic);
  size_t hdr = DT_IDX_HEADER_BYTES(ndim);
  if (len < hdr)
    return dt_error(DT_CORRUPT, "short header: %zu bytes, %d dimensions need %zu", len, ndim, hdr);

  uint32_t dims[4] = {0, 0, 0, 0};
  size_t count = 1;
  for (int d = 0; d < ndim; d++) {
    dims[d] = be32(buf + 4 + 4 * d);
    if (dims[d] == 0) return dt_error(DT_CORRUPT, "dimension %d is 0", d);
    if (dt_mul_overflow(count, dims[d], &count))
      return dt_error(DT_CORRUPT, "element count overflows at dimension %d (size %u)", d, dims[d]);
  }
  size_t bytes;
  if (dt_mul_overflow(count, esize, &bytes))
    return dt_error(DT_CORRUPT, "%zu elements of %zu bytes overflow", count, esize);
  if (bytes > max_bytes)
    return dt_error(DT_CORRUPT, "data of %zu bytes (%zu elements of %zu) exceeds the limit of %zu bytes", bytes,
                    count, esize, max_bytes);
  size_t found = len - hdr;
  if (found < bytes)
    return dt_error(DT_CORRUPT, "truncated: expected %zu data bytes after the %zu-byte header, found %zu", bytes,
                    hdr, found);
  if (found > bytes)
    return dt_error(DT_CORRUPT, "%zu trailing bytes: expected %zu data bytes after the %zu-byte header, found %zu",
                    found - bytes, bytes, hdr, found);

  void *data;
  DT_CHECK(dt_alloc_array_huge(count, esize, "idx data", &data));
  to_host(data, buf + hdr, count, esize);
  memset(out, 0, sizeof *out);
  out->type = type;
  out->ndim = ndim;
  memcpy(out->dims, dims, sizeof dims);
  out->count = count;
  out->data = data;
  return DT_OK;
}

/* Reads the whole file; refuses files longer than max_file bytes before reading. */
static dt_status read_file(const char *path, size_t max_file, uint8_t **out, size_t *out_len) {
  FILE *f;
  size_t len;
  DT_CHECK(dt_file_open_regular(path, &f, &len));
  dt_status st = DT_OK;
  uint8_t *buf = NULL;
  if (len > max_file) {
    st = dt_error(DT_CORRUPT, "%s: file of %zu bytes exceeds the limit of %zu bytes", path, len, max_file);
    goto done;
  }
  DT_CHECK_GOTO(dt_alloc_array(len ? len : 1, 1, path, (void **)&buf), st, done);
  DT_CHECK_GOTO(dt_file_read_exact(f, path, buf, len), st, done);
  *out = buf;
  *out_len = len;
  buf = NULL;
done:
  dt_free(buf);
  fclose(f);
  return st;
}

dt_status dt_idx_load_max(const char *path, size_t max_bytes, dt_idx *out) {
  if (!path) return dt_error(DT_INVALID_ARGUMENT, "idx: NULL path");
  /* Largest valid file: the 4-dim header plus max_bytes of data. Gzip adds
   * at most a few bytes per 32 KiB block over stored data, so the same bound
   * with 1/64 slack covers compressed files. */
  size_t max_image = max_bytes > SIZE_MAX - 64 ? SIZE_MAX : max_bytes + DT_IDX_HEADER_BYTES(4);
  size_t max_file = max_image > SIZE_MAX - max_image / 64 - 1024 ? SIZE_MAX : max_image + max_image / 64 + 1024;
  uint8_t *raw = NULL, *plain = NULL;
  size_t raw_len = 0, plain_len = 0;
  dt_status st = read_file(path, max_file, &raw, &raw_len);
  if (st != DT_OK) return st;
  if (dt_is_gzip(raw, raw_len)) {
    st = dt_gunzip(raw, raw_len, max_image, &plain, &plain_len);
    dt_free(raw);
    raw = NULL;
    if (st != DT_OK) return dt_error_prefix(st, "%s", path);
  } else {
    plain = raw;
    plain_len = raw_len;
    raw = NULL;
  }
  dt_idx idx;
  st = dt_idx_parse(plain, plain_len, max_bytes, &idx);
  dt_free(plain);
  if (st != DT_OK) return dt_error_prefix(st, "%s", path);
  *out = idx;
  return DT_OK;
}

dt_status dt_idx_load(const char *path, dt_idx *out) { return dt_idx_load_max(path, DT_IDX_MAX_BYTES, out); }

void dt_idx_free(dt_idx *idx) {
  if (!idx) return;
  dt_free(idx->data);
  memset(idx, 0, sizeof *idx);
}

/* Internal pieces of the data layer shared by idx.c, gzip.c and the fuzz target. */
#ifndef DT_DATA_IMPL_H
#define DT_DATA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

/* 1 when buf starts with the gzip magic 1f 8b. */
static inline int dt_is_gzip(const uint8_t *buf, size_t len) {
  return len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b;
}

/* Inflates the gzip stream(s) in[0..len) (concatenated members are joined, as
 * gzip does) into a new dt_alloc'd buffer of at most max_out bytes: more output
 * than that is DT_CORRUPT ("exceeds"), so a gzip bomb costs at most max_out
 * bytes of memory. Truncated or corrupt streams and bytes after the last member
 * are DT_CORRUPT. The detail names no file: callers prefix it. *out (free with
 * dt_free) and *out_len are written only on success. */
dt_status dt_gunzip(const uint8_t *in, size_t len, size_t max_out, uint8_t **out, size_t *out_len);

/* Bytes of the IDX header for ndim dimensions: magic + 4 per dim. */
#define DT_IDX_HEADER_BYTES(ndim) (4u + 4u * (size_t)(ndim))

#endif

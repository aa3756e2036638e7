/* Bounded in-memory gunzip over zlib (a gzip bomb stops at the bound, not at memory exhaustion). */
#include <limits.h>
#include <string.h>
#include <zlib.h>

#include "core/impl.h"
#include "data/data-impl.h"

/* Deflate cannot expand by more than about 1032:1, so a trailer claiming more
 * than that is not trusted as an allocation hint. */
#define DEFLATE_MAX_RATIO 1032u
#define FIRST_CHUNK ((size_t)64 << 10)

/* First buffer size: the ISIZE trailer of the last member (size mod 2^32),
 * when plausible, else 64 KiB; never above limit. */
static size_t first_capacity(const uint8_t *in, size_t len, size_t limit) {
  size_t cap = FIRST_CHUNK;
  if (len >= 18) {
    const uint8_t *t = in + len - 4;
    size_t isize = (size_t)t[0] | (size_t)t[1] << 8 | (size_t)t[2] << 16 | (size_t)t[3] << 24;
    size_t possible = len > SIZE_MAX / DEFLATE_MAX_RATIO ? SIZE_MAX : len * DEFLATE_MAX_RATIO;
    if (isize < possible && isize + 1 > cap) cap = isize + 1;
  }
  return cap < limit ? cap : limit;
}

/* Moves used bytes of *buf into a new buffer of new_cap bytes. */
static dt_status grow(uint8_t **buf, size_t used, size_t new_cap) {
  void *bigger;
  DT_CHECK(dt_alloc_array(new_cap, 1, "gunzip output", &bigger));
  memcpy(bigger, *buf, used);
  dt_free(*buf);
  *buf = bigger;
  return DT_OK;
}

dt_status dt_gunzip(const uint8_t *in, size_t len, size_t max_out, uint8_t **out, size_t *out_len) {
  if (!dt_is_gzip(in, len)) return dt_error(DT_CORRUPT, "not gzip data (no 1f 8b magic)");
  /* One byte past the bound lets "exactly max_out" and "more" be told apart. */
  size_t limit = max_out < SIZE_MAX ? max_out + 1 : SIZE_MAX;
  size_t cap = first_capacity(in, len, limit), used = 0;
  uint8_t *buf = NULL;
  dt_status st = dt_alloc_array(cap, 1, "gunzip output", (void **)&buf);
  if (st != DT_OK) return st;

  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    dt_free(buf);
    return dt_error(DT_OUT_OF_MEMORY, "gzip: cannot initialise zlib");
  }
  size_t in_left = len; /* bytes not yet given to zlib */
  const uint8_t *in_next = in;
  for (;;) {
    if (zs.avail_in == 0 && in_left > 0) {
      uInt n = in_left > UINT_MAX ? UINT_MAX : (uInt)in_left;
      zs.next_in = (Bytef *)in_next;
      zs.avail_in = n;
      in_next += n;
      in_left -= n;
    }
    if (used == cap) {
      if (cap == limit) {
        st = dt_error(DT_CORRUPT, "gzip: decompressed data exceeds the limit of %zu bytes", max_out);
        goto done;
      }
      size_t next = cap > limit / 2 ? limit : cap * 2;
      DT_CHECK_GOTO(grow(&buf, used, next), st, done);
      cap = next;
    }
    size_t room = cap - used;
    zs.next_out = buf + used;
    zs.avail_out = room > UINT_MAX ? UINT_MAX : (uInt)room;
    uInt before = zs.avail_out;
    int ret = inflate(&zs, Z_NO_FLUSH);
    used += before - zs.avail_out;
    if (ret == Z_STREAM_END) {
      size_t rest = zs.avail_in + in_left;
      if (rest == 0) break;
      const uint8_t *next_member = zs.next_in;
      if (rest >= 2 && zs.avail_in >= 2 && dt_is_gzip(next_member, 2)) {
        inflateReset(&zs);
        continue;
      }
      if (zs.avail_in < 2 && rest >= 2) {
        /* The member boundary straddles an input chunk: only above 4 GiB. */
        st = dt_error(DT_UNSUPPORTED, "gzip: member boundary at a 4 GiB chunk edge");
        goto done;
      }
      st = dt_error(DT_CORRUPT, "gzip: %zu trailing bytes after the compressed stream", rest);
      goto done;
    }
    if (ret == Z_OK) continue;
    if (ret == Z_BUF_ERROR) {
      if (zs.avail_out == 0) continue; /* output full: grow on the next round */
      if (zs.avail_in == 0 && in_left == 0) {
        st = dt_error(DT_CORRUPT, "gzip: stream truncated after %zu compressed bytes (%zu decompressed)", len, used);
        goto done;
      }
      continue;
    }
    if (ret == Z_MEM_ERROR) {
      st = dt_error(DT_OUT_OF_MEMORY, "gzip: zlib out of memory");
      goto done;
    }
    st = dt_error(DT_CORRUPT, "gzip: corrupt data at compressed byte %zu: %s", len - in_left - zs.avail_in,
                  zs.msg ? zs.msg : "invalid stream");
    goto done;
  }
  if (used > max_out) {
    st = dt_error(DT_CORRUPT, "gzip: decompressed data exceeds the limit of %zu bytes", max_out);
    goto done;
  }
  *out = buf;
  *out_len = used;
  buf = NULL;
  st = DT_OK;
done:
  inflateEnd(&zs);
  dt_free(buf);
  return st;
}

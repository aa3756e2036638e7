/* TensorBoard events writer: TFRecord framing with masked CRC-32C around hand-encoded Event protobufs. */
#include "io/tensorboard.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/impl.h"
#include "core/text.h"

#define DT_TB_PATH_MAX 4096
/* Largest Event we encode: the tag plus under 40 bytes of keys, lengths, time, step and value. */
#define DT_TB_RECORD_MAX (DT_TB_TAG_MAX + 64)

struct dt_tb_writer {
  FILE *f;
  char path[DT_TB_PATH_MAX];
  uint8_t record[DT_TB_RECORD_MAX]; /* one encoded Event, reused */
};

/* ---- CRC-32C ------------------------------------------------------------------ */
/* crc_nibble[i] is i run through four steps of the bitwise reflected CRC, so one byte
 * costs two lookups; 16 constants instead of a 256-entry table built at run time. */
static const uint32_t crc_nibble[16] = {
    0x00000000, 0x105ec76f, 0x20bd8ede, 0x30e349b1, 0x417b1dbc, 0x5125dad3, 0x61c69362, 0x7198540d,
    0x82f63b78, 0x92a8fc17, 0xa24bb5a6, 0xb21572c9, 0xc38d26c4, 0xd3d3e1ab, 0xe330a81a, 0xf36e6f75};

uint32_t dt_crc32c(const void *data, size_t n) {
  const uint8_t *p = data;
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    crc = (crc >> 4) ^ crc_nibble[crc & 15];
    crc = (crc >> 4) ^ crc_nibble[crc & 15];
  }
  return ~crc;
}

uint32_t dt_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- protobuf wire format (only what Event needs) ------------------------------ */
enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *put_key(uint8_t *p, unsigned field, unsigned wire) { return put_varint(p, field << 3 | wire); }

static uint8_t *put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) *p++ = (uint8_t)(v >> (8 * i));
  return p;
}

static uint8_t *put_bytes(uint8_t *p, unsigned field, const void *s, size_t n) {
  p = put_varint(put_key(p, field, WIRE_LEN), n);
  memcpy(p, s, n);
  return p + n;
}

/* Event.wall_time (field 1, double): seconds since the epoch. */
static uint8_t *put_wall_time(uint8_t *p, const struct timespec *ts) {
  double t = (double)ts->tv_sec + 1e-9 * (double)ts->tv_nsec;
  uint64_t bits;
  memcpy(&bits, &t, sizeof bits);
  return put_le(put_key(p, 1, WIRE_I64), bits, 8);
}

/* ---- records -------------------------------------------------------------------- */
static dt_status write_failed(const dt_tb_writer *w) {
  return dt_error(DT_IO, "%s: write failed: %s", w->path, strerror(errno ? errno : EIO));
}

/* TFRecord: u64 LE length, masked CRC of those 8 bytes, the data, masked CRC of the data. */
static dt_status write_record(dt_tb_writer *w, const uint8_t *data, size_t n) {
  uint8_t head[12], tail[4];
  put_le(head, n, 8);
  put_le(head + 8, dt_crc32c_mask(dt_crc32c(head, 8)), 4);
  put_le(tail, dt_crc32c_mask(dt_crc32c(data, n)), 4);
  errno = 0;
  if (fwrite(head, 1, sizeof head, w->f) != sizeof head || fwrite(data, 1, n, w->f) != n ||
      fwrite(tail, 1, sizeof tail, w->f) != sizeof tail)
    return write_failed(w);
  return DT_OK;
}

dt_status dt_tb_flush(dt_tb_writer *w) {
  errno = 0;
  if (fflush(w->f) != 0) return write_failed(w);
  return DT_OK;
}

dt_status dt_tb_scalar(dt_tb_writer *w, const char *tag, int64_t step, float value) {
  size_t tag_len = strlen(tag);
  if (tag_len == 0 || tag_len > DT_TB_TAG_MAX)
    return dt_error(DT_INVALID_ARGUMENT, "%s: scalar tag of %zu bytes (1 to %d allowed)", w->path, tag_len,
                    DT_TB_TAG_MAX);
  /* Strict UTF-8: what a proto3 parser (TensorBoard's, Python's) demands of a string field. */
  if (!dt_utf8_valid(tag, tag_len))
    return dt_error(DT_INVALID_ARGUMENT, "%s: scalar tag is not valid UTF-8", w->path);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  uint32_t value_bits;
  memcpy(&value_bits, &value, sizeof value_bits);

  /* Nested messages are length-prefixed, so sizes go inside out:
   * Summary.Value{tag = 1, simple_value = 2} in Summary{value = 1} in Event{summary = 5}. */
  size_t value_len = 1 + varint_len(tag_len) + tag_len + 1 + 4;
  size_t summary_len = 1 + varint_len(value_len) + value_len;
  uint8_t *p = put_wall_time(w->record, &now);
  /* proto3 leaves a zero step out, as TensorFlow's writer does: the bytes stay canonical. A
   * negative step is ten bytes of two's complement. */
  if (step != 0) p = put_varint(put_key(p, 2, WIRE_VARINT), (uint64_t)step);
  p = put_varint(put_key(p, 5, WIRE_LEN), summary_len);
  p = put_varint(put_key(p, 1, WIRE_LEN), value_len);
  p = put_bytes(p, 1, tag, tag_len);
  p = put_le(put_key(p, 2, WIRE_I32), value_bits, 4);
  return write_record(w, w->record, (size_t)(p - w->record));
}

dt_status dt_tb_open(const char *dir, const char *suffix, dt_tb_writer **out) {
  dt_status st = DT_OK;
  dt_tb_writer *w = NULL;
  int created = 0;
  if (!suffix) suffix = "";
  DT_CHECK(dt_mkdir_p(dir, 0777));
  DT_CHECK(dt_alloc_array(1, sizeof *w, "tensorboard writer", (void **)&w));

  char host[256];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = '\0';
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  /* TensorFlow's name: the seconds are zero-padded to 10 digits. */
  int n = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s%s", dir, (long long)now.tv_sec,
                   host, suffix);
  if (n < 0 || (size_t)n >= sizeof w->path) {
    st = dt_error(DT_INVALID_ARGUMENT, "%s: events file path too long", dir);
    goto fail;
  }
  /* "x": never truncate another writer's file (same second, host and suffix). */
  w->f = fopen(w->path, "wbx");
  if (!w->f) {
    st = dt_error(DT_IO, "cannot create %s: %s", w->path, strerror(errno));
    goto fail;
  }
  created = 1;

  static const char version[] = "brain.Event:2";
  uint8_t *p = put_wall_time(w->record, &now);
  p = put_bytes(p, 3, version, sizeof version - 1); /* Event.file_version */
  DT_CHECK_GOTO(write_record(w, w->record, (size_t)(p - w->record)), st, fail);
  DT_CHECK_GOTO(dt_tb_flush(w), st, fail);
  *out = w;
  return DT_OK;

fail:
  if (w->f) fclose(w->f);
  if (created) remove(w->path); /* a file without its version record is not an events file */
  dt_free(w);
  return st;
}

void dt_tb_close(dt_tb_writer *w) {
  if (!w) return;
  errno = 0;
  int bad = fflush(w->f) != 0;
  bad |= fclose(w->f) != 0;
  if (bad) DT_LOG_WARN("tensorboard", "%s: closing failed: %s (the last scalars may be lost)", w->path,
                       strerror(errno ? errno : EIO));
  dt_free(w);
}

const char *dt_tb_path(const dt_tb_writer *w) { return w->path; }

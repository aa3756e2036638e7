/* Tests of the TensorBoard writer: CRC-32C vectors, TFRecord framing and Event bytes re-read with a reader written here. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/impl.h"
#include "harness.h"
#include "io/tensorboard.h"

/* ---- a reader from the formats' definitions, independent of the writer ---- */

static uint64_t get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* A varint at *p (< end); 0 when truncated or longer than 10 bytes. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 70 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 1;
  }
  return 0;
}

/* One field of a message: number, wire type, and its payload (the value of a varint, the
 * bytes of fixed and length-delimited ones). 0 at the end or on malformed input. */
typedef struct field {
  unsigned number, wire;
  uint64_t varint;
  const uint8_t *bytes;
  size_t len;
} field;

static int next_field(const uint8_t **p, const uint8_t *end, field *f) {
  uint64_t key;
  if (*p >= end || !get_varint(p, end, &key)) return 0;
  f->number = (unsigned)(key >> 3);
  f->wire = (unsigned)(key & 7);
  f->bytes = *p;
  f->len = 0;
  switch (f->wire) {
    case 0: return get_varint(p, end, &f->varint);
    case 1: f->len = 8; break;
    case 5: f->len = 4; break;
    case 2:
      if (!get_varint(p, end, &f->varint) || f->varint > (uint64_t)(end - *p)) return 0;
      f->bytes = *p;
      f->len = (size_t)f->varint;
      break;
    default: return 0;
  }
  if ((size_t)(end - *p) < f->len) return 0;
  *p += f->len;
  return 1;
}

typedef struct event {
  double wall_time;
  int64_t step;
  char file_version[64];
  int values;     /* Summary.Value count */
  char tag[DT_TB_TAG_MAX + 1];
  float value;
} event;

/* Decodes Event{wall_time=1, step=2, file_version=3, summary=5{value=1{tag=1, simple_value=2}}}. */
static int decode_event(const uint8_t *data, size_t n, event *e) {
  memset(e, 0, sizeof *e);
  const uint8_t *p = data, *end = data + n;
  field f;
  while (p < end) {
    if (!next_field(&p, end, &f)) return 0;
    if (f.number == 1 && f.wire == 1) {
      uint64_t bits = get_le(f.bytes, 8);
      memcpy(&e->wall_time, &bits, 8);
    } else if (f.number == 2 && f.wire == 0) {
      e->step = (int64_t)f.varint;
    } else if (f.number == 3 && f.wire == 2 && f.len < sizeof e->file_version) {
      memcpy(e->file_version, f.bytes, f.len);
    } else if (f.number == 5 && f.wire == 2) {
      const uint8_t *s = f.bytes, *send = f.bytes + f.len;
      field v;
      while (s < send) {
        if (!next_field(&s, send, &v) || v.number != 1 || v.wire != 2) return 0;
        e->values++;
        const uint8_t *q = v.bytes, *qend = v.bytes + v.len;
        field x;
        while (q < qend) {
          if (!next_field(&q, qend, &x)) return 0;
          if (x.number == 1 && x.wire == 2 && x.len <= DT_TB_TAG_MAX) {
            memcpy(e->tag, x.bytes, x.len);
            e->tag[x.len] = '\0';
          } else if (x.number == 2 && x.wire == 5) {
            uint32_t bits = (uint32_t)get_le(x.bytes, 4);
            memcpy(&e->value, &bits, 4);
          } else {
            return 0;
          }
        }
      }
    } else {
      return 0;
    }
  }
  return 1;
}

typedef struct events_file {
  uint8_t *blob;
  size_t len;
  size_t count;
  const uint8_t *data[16];
  size_t data_len[16];
} events_file;

/* Reads path and splits it into TFRecords, checking both masked CRCs and that the file ends
 * exactly after the last record. 0 with a reason in why on any mismatch. */
static int read_records(const char *path, events_file *ef, const char **why) {
  memset(ef, 0, sizeof *ef);
  FILE *fp = fopen(path, "rb");
  if (!fp) return *why = "cannot open", 0;
  fseek(fp, 0, SEEK_END);
  long size = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  ef->blob = malloc((size_t)size + 1);
  ef->len = fread(ef->blob, 1, (size_t)size, fp);
  fclose(fp);
  size_t pos = 0;
  while (pos < ef->len) {
    if (ef->len - pos < 12) return *why = "truncated header", 0;
    const uint8_t *h = ef->blob + pos;
    uint64_t n = get_le(h, 8);
    if ((uint32_t)get_le(h + 8, 4) != dt_crc32c_mask(dt_crc32c(h, 8))) return *why = "length crc", 0;
    if (n > ef->len - pos - 12 || ef->len - pos - 12 - n < 4) return *why = "truncated record", 0;
    const uint8_t *d = h + 12;
    if ((uint32_t)get_le(d + n, 4) != dt_crc32c_mask(dt_crc32c(d, (size_t)n))) return *why = "data crc", 0;
    if (ef->count == 16) return *why = "too many records for this test", 0;
    ef->data[ef->count] = d;
    ef->data_len[ef->count++] = (size_t)n;
    pos += 12 + (size_t)n + 4;
  }
  return 1;
}

static void make_tmpdir(char *dir, size_t len) {
  snprintf(dir, len, "/tmp/dt_test_tb_XXXXXX");
  if (!mkdtemp(dir)) dir[0] = '\0';
}

static void remove_tree(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", dir);
}

static int contains(const uint8_t *p, size_t n, const char *s) {
  size_t k = strlen(s);
  for (size_t i = 0; i + k <= n; i++)
    if (memcmp(p + i, s, k) == 0) return 1;
  return 0;
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- tests ---- */

TEST(crc32c_known_vectors_and_mask) {
  ASSERT_EQ(dt_crc32c("123456789", 9), 0xE3069283u);
  uint8_t zeros[32] = {0}, ones[32];
  memset(ones, 0xff, sizeof ones);
  ASSERT_EQ(dt_crc32c(zeros, 32), 0x8A9136AAu);
  ASSERT_EQ(dt_crc32c(ones, 32), 0x62A8AB43u); /* RFC 3720 B.4 */
  ASSERT_EQ(dt_crc32c("", 0), 0u);
  uint32_t c = 0xE3069283u;
  ASSERT_EQ(dt_crc32c_mask(c), (uint32_t)(((c >> 15) | (c << 17)) + 0xa282ead8u));
  ASSERT_EQ(dt_crc32c_mask(0), 0xa282ead8u);
  ASSERT_EQ(dt_crc32c_mask(0x12345678u), 0x4f730f40u);
}

TEST(file_name_first_record_and_scalars_decode) {
  char dir[64], sub[128];
  make_tmpdir(dir, sizeof dir);
  ASSERT(dir[0]);
  snprintf(sub, sizeof sub, "%s/a/b", dir); /* created with its parent */
  double t0 = wall_now();
  dt_tb_writer *w = NULL;
  ASSERT_OK(dt_tb_open(sub, ".rank1", &w));
  const char *path = dt_tb_path(w);
  char prefix[160];
  snprintf(prefix, sizeof prefix, "%s/events.out.tfevents.", sub);
  ASSERT_MSG(strncmp(path, prefix, strlen(prefix)) == 0, path);
  ASSERT_MSG(strcmp(path + strlen(path) - 6, ".rank1") == 0, path);
  ASSERT_MSG(strspn(path + strlen(prefix), "0123456789") == 10 && path[strlen(prefix) + 10] == '.', path);

  /* A long tag makes every enclosing length a two-byte varint; a negative step a ten-byte one. */
  static char long_tag[DT_TB_TAG_MAX + 1];
  memset(long_tag, 'x', DT_TB_TAG_MAX);
  long_tag[0] = 'l';
  struct { const char *tag; int64_t step; float value; } want[] = {
      {"loss/train", 0, 2.3025851f},
      {"acc/\xc3\xbc", 1, 0.125f},
      {"neg", -1, -1e-30f},
      {"big", INT64_C(1) << 40, 3.4028235e38f},
      {long_tag, INT64_MAX, -0.0f},
  };
  int nwant = (int)(sizeof want / sizeof want[0]);
  for (int i = 0; i < nwant; i++) ASSERT_OK(dt_tb_scalar(w, want[i].tag, want[i].step, want[i].value));
  ASSERT_OK(dt_tb_flush(w));
  char saved[512];
  snprintf(saved, sizeof saved, "%s", path);
  dt_tb_close(w);
  double t1 = wall_now();

  events_file ef;
  const char *why = "";
  int ok = read_records(saved, &ef, &why);
  event *e = malloc(sizeof *e);
  if (!ok || !e) {
    free(ef.blob);
    free(e);
    FAIL_("%s: %s", saved, why);
  }
  int fail = ef.count != (size_t)nwant + 1;
  fail |= !decode_event(ef.data[0], ef.data_len[0], e);
  fail |= strcmp(e->file_version, "brain.Event:2") != 0 || e->values != 0;
  fail |= !(e->wall_time >= t0 - 1 && e->wall_time <= t1 + 1);
  /* The version string is in the raw bytes too (what tools that sniff the file look for). */
  fail |= !contains(ef.data[0], ef.data_len[0], "brain.Event:2");
  double last = e->wall_time;
  for (int i = 0; i < nwant && !fail; i++) {
    fail |= !decode_event(ef.data[i + 1], ef.data_len[i + 1], e);
    fail |= e->values != 1 || strcmp(e->tag, want[i].tag) != 0 || e->step != want[i].step;
    fail |= memcmp(&e->value, &want[i].value, 4) != 0; /* bit-exact, -0.0 included */
    fail |= e->wall_time < last || e->wall_time > t1 + 1 || e->file_version[0] != '\0';
    last = e->wall_time;
    if (fail) fprintf(stderr, "  record %d: tag %.20s step %lld value %g\n", i + 1, e->tag, (long long)e->step,
                      (double)e->value);
  }
  free(e);
  free(ef.blob);
  remove_tree(dir);
  ASSERT(!fail);
}

TEST(reader_catches_a_flipped_byte) {
  /* The checks above mean something only if read_records rejects damage. */
  char dir[64];
  make_tmpdir(dir, sizeof dir);
  ASSERT(dir[0]);
  dt_tb_writer *w = NULL;
  ASSERT_OK(dt_tb_open(dir, NULL, &w));
  ASSERT_OK(dt_tb_scalar(w, "t", 7, 1.5f));
  char path[512];
  snprintf(path, sizeof path, "%s", dt_tb_path(w));
  dt_tb_close(w);
  events_file ef;
  const char *why = "";
  int ok = read_records(path, &ef, &why);
  size_t len = ef.len;
  free(ef.blob);
  ASSERT_MSG(ok, why);
  int undetected = 0;
  for (size_t at = 0; at < len; at++) {
    FILE *f = fopen(path, "r+b");
    ASSERT(f);
    fseek(f, (long)at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)at, SEEK_SET);
    fputc(c ^ 0x01, f);
    fclose(f);
    if (read_records(path, &ef, &why)) undetected++;
    free(ef.blob);
    f = fopen(path, "r+b");
    ASSERT(f);
    fseek(f, (long)at, SEEK_SET);
    fputc(c, f);
    fclose(f);
  }
  remove_tree(dir);
  ASSERT_EQ(undetected, 0);
}

TEST(bad_tags_are_invalid_arguments) {
  char dir[64];
  make_tmpdir(dir, sizeof dir);
  ASSERT(dir[0]);
  dt_tb_writer *w = NULL;
  ASSERT_OK(dt_tb_open(dir, "", &w));
  static char too_long[DT_TB_TAG_MAX + 2];
  memset(too_long, 'y', DT_TB_TAG_MAX + 1);
  dt_status s_empty = dt_tb_scalar(w, "", 0, 1.0f);
  dt_status s_long = dt_tb_scalar(w, too_long, 0, 1.0f);
  dt_status s_utf8 = dt_tb_scalar(w, "bad\xff", 0, 1.0f);
  dt_status s_surrogate = dt_tb_scalar(w, "\xed\xa0\x80", 0, 1.0f);
  dt_status s_overlong = dt_tb_scalar(w, "\xc0\xaf", 0, 1.0f);
  dt_tb_close(w);
  remove_tree(dir);
  ASSERT_EQ(s_empty, DT_INVALID_ARGUMENT);
  ASSERT_EQ(s_long, DT_INVALID_ARGUMENT);
  ASSERT_EQ(s_utf8, DT_INVALID_ARGUMENT);
  ASSERT_EQ(s_surrogate, DT_INVALID_ARGUMENT);
  ASSERT_EQ(s_overlong, DT_INVALID_ARGUMENT);
}

TEST(unwritable_directory_is_io_error) {
  char dir[64], file[128], under[160];
  make_tmpdir(dir, sizeof dir);
  ASSERT(dir[0]);
  snprintf(file, sizeof file, "%s/plain", dir);
  FILE *f = fopen(file, "w");
  ASSERT(f);
  fclose(f);
  snprintf(under, sizeof under, "%s/logs", file); /* a directory under a regular file */
  dt_tb_writer *w = (dt_tb_writer *)0x1;
  dt_status st = dt_tb_open(under, NULL, &w);
  int named = strstr(dt_last_error(), file) != NULL;
  remove_tree(dir);
  ASSERT_STATUS(st, DT_IO);
  ASSERT(w == (dt_tb_writer *)0x1); /* output untouched on failure */
  ASSERT_MSG(named, dt_last_error());
}

TEST(full_disk_is_io_error_naming_the_file) {
  /* A file size limit makes write(2) fail with EFBIG once the file is past it, as a full
   * disk does with ENOSPC; the limit is lowered only around this test. */
  char dir[64];
  make_tmpdir(dir, sizeof dir);
  ASSERT(dir[0]);
  struct rlimit old;
  ASSERT(getrlimit(RLIMIT_FSIZE, &old) == 0);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  ASSERT(setrlimit(RLIMIT_FSIZE, &small) == 0);
  dt_tb_writer *w = NULL;
  dt_status st = dt_tb_open(dir, NULL, &w), ws = DT_OK;
  char path[512] = "", err[1024] = "";
  if (st == DT_OK) {
    snprintf(path, sizeof path, "%s", dt_tb_path(w));
    for (int i = 0; i < 1000 && ws == DT_OK; i++) {
      ws = dt_tb_scalar(w, "loss", i, (float)i);
      if (ws == DT_OK) ws = dt_tb_flush(w);
    }
    snprintf(err, sizeof err, "%s", dt_last_error());
    dt_tb_close(w);
  }
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  remove_tree(dir);
  ASSERT_OK(st);
  ASSERT_STATUS(ws, DT_IO);
  ASSERT_MSG(path[0] && strstr(err, path) != NULL, err);
}

TEST_MAIN(TEST_ENTRY(crc32c_known_vectors_and_mask), TEST_ENTRY(file_name_first_record_and_scalars_decode),
          TEST_ENTRY(reader_catches_a_flipped_byte), TEST_ENTRY(bad_tags_are_invalid_arguments),
          TEST_ENTRY(unwritable_directory_is_io_error), TEST_ENTRY(full_disk_is_io_error_naming_the_file))

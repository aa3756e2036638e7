/* Tests of the data layer: IDX parsing and loading (raw, gzip), datasets, the prefetching loader. */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/impl.h"
#include "data/data-impl.h"
#include "harness.h"

/* ---- helpers --------------------------------------------------------------- */

/* An IDX image in buf: header for (type, ndim, dims) then `data_len` bytes of data. */
static size_t put_header(uint8_t *buf, uint8_t type, int ndim, const uint32_t *dims) {
  buf[0] = 0;
  buf[1] = 0;
  buf[2] = type;
  buf[3] = (uint8_t)ndim;
  for (int d = 0; d < ndim; d++) {
    buf[4 + 4 * d] = (uint8_t)(dims[d] >> 24);
    buf[5 + 4 * d] = (uint8_t)(dims[d] >> 16);
    buf[6 + 4 * d] = (uint8_t)(dims[d] >> 8);
    buf[7 + 4 * d] = (uint8_t)dims[d];
  }
  return 4 + 4 * (size_t)ndim;
}

static char tmp_root[64];

/* A fresh directory under /tmp for one test. */
static const char *make_tmpdir(void) {
  snprintf(tmp_root, sizeof tmp_root, "/tmp/dt_test_data_XXXXXX");
  return mkdtemp(tmp_root);
}

static int write_raw(const char *path, const uint8_t *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(buf, 1, len, f);
  return fclose(f) == 0 && w == len ? 0 : -1;
}

static int write_gz(const char *path, const uint8_t *buf, size_t len) {
  gzFile g = gzopen(path, "wb");
  if (!g) return -1;
  int w = gzwrite(g, buf, (unsigned)len);
  return gzclose(g) == Z_OK && w == (int)len ? 0 : -1;
}

static void remove_dir(const char *dir, const char *const *names, int n) {
  char p[512];
  for (int i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* ---- IDX parsing ------------------------------------------------------------- */

TEST(idx_parses_u8_3d) {
  uint8_t buf[64];
  uint32_t dims[3] = {2, 3, 4};
  size_t h = put_header(buf, 0x08, 3, dims);
  for (int i = 0; i < 24; i++) buf[h + i] = (uint8_t)(i * 7);
  dt_idx idx;
  ASSERT_OK(dt_idx_parse(buf, h + 24, 1 << 20, &idx));
  ASSERT_EQ(idx.type, 0x08);
  ASSERT_EQ(idx.ndim, 3);
  ASSERT_EQ(idx.dims[0], 2);
  ASSERT_EQ(idx.dims[1], 3);
  ASSERT_EQ(idx.dims[2], 4);
  ASSERT_EQ(idx.count, 24);
  const uint8_t *d = idx.data;
  for (int i = 0; i < 24; i++) ASSERT_EQ(d[i], (uint8_t)(i * 7));
  dt_idx_free(&idx);
  ASSERT(idx.data == NULL);
  dt_idx_free(NULL);
}

TEST(idx_parses_big_endian_types) {
  uint8_t buf[64];
  uint32_t dims[1] = {3};
  /* i32: 1, -2, 0x01020304 */
  size_t h = put_header(buf, 0x0C, 1, dims);
  const uint8_t i32be[12] = {0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe, 1, 2, 3, 4};
  memcpy(buf + h, i32be, 12);
  dt_idx idx;
  ASSERT_OK(dt_idx_parse(buf, h + 12, 1 << 20, &idx));
  ASSERT_EQ(idx.type, 0x0C);
  ASSERT_EQ(idx.ndim, 1);
  ASSERT_EQ(idx.count, 3);
  const int32_t *v = idx.data;
  ASSERT_EQ(v[0], 1);
  ASSERT_EQ(v[1], -2);
  ASSERT_EQ(v[2], 0x01020304);
  dt_idx_free(&idx);

  /* f32 1.5 (0x3FC00000) and f64 -2.25 (0xC002000000000000), i16 -3 */
  uint32_t one[1] = {1};
  h = put_header(buf, 0x0D, 1, one);
  const uint8_t f32be[4] = {0x3f, 0xc0, 0, 0};
  memcpy(buf + h, f32be, 4);
  ASSERT_OK(dt_idx_parse(buf, h + 4, 1 << 20, &idx));
  ASSERT(((const float *)idx.data)[0] == 1.5f);
  dt_idx_free(&idx);
  h = put_header(buf, 0x0E, 1, one);
  const uint8_t f64be[8] = {0xc0, 0x02, 0, 0, 0, 0, 0, 0};
  memcpy(buf + h, f64be, 8);
  ASSERT_OK(dt_idx_parse(buf, h + 8, 1 << 20, &idx));
  ASSERT(((const double *)idx.data)[0] == -2.25);
  dt_idx_free(&idx);
  h = put_header(buf, 0x0B, 1, one);
  buf[h] = 0xff;
  buf[h + 1] = 0xfd;
  ASSERT_OK(dt_idx_parse(buf, h + 2, 1 << 20, &idx));
  ASSERT_EQ(((const int16_t *)idx.data)[0], -3);
  dt_idx_free(&idx);
  h = put_header(buf, 0x09, 1, one);
  buf[h] = 0x80;
  ASSERT_OK(dt_idx_parse(buf, h + 1, 1 << 20, &idx));
  ASSERT_EQ(((const int8_t *)idx.data)[0], -128);
  dt_idx_free(&idx);
}

/* Parse must fail with DT_CORRUPT, leave out untouched, and say `what`. */
#define ASSERT_CORRUPT(buf, len, max, what)                                   \
  do {                                                                        \
    dt_idx o_;                                                                \
    memset(&o_, 0xAB, sizeof o_);                                             \
    ASSERT_STATUS(dt_idx_parse(buf, len, max, &o_), DT_CORRUPT);              \
    if (!strstr(dt_last_error(), what)) FAIL_("detail \"%s\" lacks \"%s\"", dt_last_error(), what); \
    ASSERT_EQ(o_.ndim, (int)0xABABABAB);                                      \
  } while (0)

TEST(idx_rejects_every_corruption) {
  uint8_t buf[128];
  memset(buf, 0, sizeof buf);
  uint32_t dims[3] = {2, 3, 4};
  size_t h = put_header(buf, 0x08, 3, dims);
  ASSERT_CORRUPT(buf, 3, 1 << 20, "short header");
  ASSERT_CORRUPT(buf, 10, 1 << 20, "short header"); /* 3 dims need 16 bytes */
  ASSERT_CORRUPT(buf, h - 1, 1 << 20, "short header");

  buf[0] = 1;
  ASSERT_CORRUPT(buf, h + 24, 1 << 20, "bad magic 0x01000803");
  buf[0] = 0;
  buf[1] = 0x08;
  ASSERT_CORRUPT(buf, h + 24, 1 << 20, "bad magic");
  buf[1] = 0;

  buf[2] = 0x0A;
  ASSERT_CORRUPT(buf, h + 24, 1 << 20, "unknown element type 0x0a");
  buf[2] = 0x08;

  buf[3] = 0;
  ASSERT_CORRUPT(buf, h + 24, 1 << 20, "0 dimensions");
  buf[3] = 5;
  ASSERT_CORRUPT(buf, 128, 1 << 20, "5 dimensions");
  buf[3] = 3;

  uint32_t zero[3] = {2, 0, 4};
  put_header(buf, 0x08, 3, zero);
  ASSERT_CORRUPT(buf, h + 24, 1 << 20, "dimension 1 is 0");

  /* 2^32-1 cubed overflows size_t on 64-bit; four of them overflow anywhere. */
  uint32_t huge[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  size_t h4 = put_header(buf, 0x08, 4, huge);
  ASSERT_CORRUPT(buf, h4 + 8, 1 << 20, "overflows");
  /* element count fits but count * 8 bytes overflows */
  uint32_t big2[2] = {0xffffffffu, 0xffffffffu};
  size_t h2 = put_header(buf, 0x0E, 2, big2);
  if (sizeof(size_t) == 8) ASSERT_CORRUPT(buf, h2 + 8, 1 << 20, "overflow");

  uint32_t fine[3] = {2, 3, 4};
  put_header(buf, 0x08, 3, fine);
  ASSERT_CORRUPT(buf, h + 24, 23, "exceeds the limit of 23 bytes");
  ASSERT_CORRUPT(buf, h + 23, 1 << 20, "truncated: expected 24 data bytes after the 16-byte header, found 23");
  ASSERT_CORRUPT(buf, h + 26, 1 << 20, "2 trailing bytes: expected 24");
  put_header(buf, 0x0C, 3, fine); /* i32: 96 bytes needed */
  ASSERT_CORRUPT(buf, h + 24, 1 << 20, "expected 96 data bytes");
  dt_idx ok;
  ASSERT_OK(dt_idx_parse(buf, h + 96, 96, &ok)); /* exactly at the limit is fine */
  dt_idx_free(&ok);
}

/* ---- IDX files ----------------------------------------------------------- */

TEST(idx_load_raw_and_gzip_identical) {
  const char *dir = make_tmpdir();
  ASSERT(dir != NULL);
  uint8_t buf[16 + 5 * 7 * 3];
  uint32_t dims[3] = {5, 7, 3};
  size_t h = put_header(buf, 0x08, 3, dims);
  for (size_t i = h; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 31 + 5);
  char raw[256], gz[256];
  snprintf(raw, sizeof raw, "%s/a.idx", dir);
  snprintf(gz, sizeof gz, "%s/a.idx.gz", dir);
  ASSERT(write_raw(raw, buf, sizeof buf) == 0);
  ASSERT(write_gz(gz, buf, sizeof buf) == 0);
  dt_idx a, b;
  ASSERT_OK(dt_idx_load(raw, &a));
  ASSERT_OK(dt_idx_load(gz, &b));
  ASSERT_EQ(a.count, 105);
  ASSERT_EQ(b.count, 105);
  ASSERT_EQ(b.ndim, 3);
  ASSERT_EQ(b.dims[1], 7);
  ASSERT(memcmp(a.data, b.data, 105) == 0);
  ASSERT(memcmp(a.data, buf + h, 105) == 0);
  dt_idx_free(&a);
  dt_idx_free(&b);

  /* gzip is detected by magic, not by name */
  char gz_noext[256];
  snprintf(gz_noext, sizeof gz_noext, "%s/b.idx", dir);
  ASSERT(write_gz(gz_noext, buf, sizeof buf) == 0);
  ASSERT_OK(dt_idx_load(gz_noext, &b));
  ASSERT(memcmp(b.data, buf + h, 105) == 0);
  dt_idx_free(&b);

  /* a corrupt file names itself and the problem */
  ASSERT(write_raw(raw, buf, sizeof buf - 1) == 0);
  ASSERT_STATUS(dt_idx_load(raw, &a), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), raw) == dt_last_error());
  ASSERT(strstr(dt_last_error(), "truncated") != NULL);
  const char *names[] = {"a.idx", "a.idx.gz", "b.idx"};
  remove_dir(dir, names, 3);
}

TEST(idx_load_corrupt_gzip_names_file) {
  const char *dir = make_tmpdir();
  ASSERT(dir != NULL);
  uint8_t buf[16 + 4000];
  uint32_t dims[3] = {10, 20, 20};
  put_header(buf, 0x08, 3, dims);
  for (size_t i = 16; i < sizeof buf; i++) buf[i] = (uint8_t)((i * i) >> 3);
  char gz[256];
  snprintf(gz, sizeof gz, "%s/c.gz", dir);
  ASSERT(write_gz(gz, buf, sizeof buf) == 0);
  FILE *f = fopen(gz, "rb");
  ASSERT(f != NULL);
  uint8_t comp[8192];
  size_t n = fread(comp, 1, sizeof comp, f);
  fclose(f);
  ASSERT(n > 40 && n < sizeof comp);

  /* flipped bytes in the deflate data */
  uint8_t bad[8192];
  memcpy(bad, comp, n);
  for (size_t i = 20; i < 30; i++) bad[i] ^= 0x5a;
  ASSERT(write_raw(gz, bad, n) == 0);
  ASSERT_STATUS(dt_idx_load(gz, &(dt_idx){0}), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), gz) == dt_last_error());
  ASSERT(strstr(dt_last_error(), "gzip") != NULL);

  /* truncated stream */
  ASSERT(write_raw(gz, comp, n / 2) == 0);
  ASSERT_STATUS(dt_idx_load(gz, &(dt_idx){0}), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), gz) == dt_last_error());
  ASSERT(strstr(dt_last_error(), "truncated") != NULL);

  /* garbage after the stream */
  memcpy(bad, comp, n);
  memcpy(bad + n, "xyz", 3);
  ASSERT(write_raw(gz, bad, n + 3) == 0);
  ASSERT_STATUS(dt_idx_load(gz, &(dt_idx){0}), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "3 trailing bytes") != NULL);

  /* two members join, as with `cat a.gz b.gz`: here header+half, then the rest */
  char part[256];
  snprintf(part, sizeof part, "%s/part.gz", dir);
  ASSERT(write_gz(part, buf, 2016) == 0);
  f = fopen(part, "rb");
  uint8_t two[16384];
  size_t n1 = fread(two, 1, sizeof two, f);
  fclose(f);
  ASSERT(write_gz(part, buf + 2016, sizeof buf - 2016) == 0);
  f = fopen(part, "rb");
  size_t n2 = fread(two + n1, 1, sizeof two - n1, f);
  fclose(f);
  ASSERT(write_raw(gz, two, n1 + n2) == 0);
  dt_idx idx;
  ASSERT_OK(dt_idx_load(gz, &idx));
  ASSERT(memcmp(idx.data, buf + 16, 4000) == 0);
  dt_idx_free(&idx);
  const char *names[] = {"c.gz", "part.gz"};
  remove_dir(dir, names, 2);
}

TEST(idx_gzip_bomb_is_bounded) {
  const char *dir = make_tmpdir();
  ASSERT(dir != NULL);
  /* 8 MiB of data claiming a valid header, loaded with a 1 MiB bound. */
  size_t len = 16 + ((size_t)8 << 20);
  uint8_t *buf = calloc(len, 1);
  ASSERT(buf != NULL);
  uint32_t dims[3] = {8, 1024, 1024};
  put_header(buf, 0x08, 3, dims);
  char gz[256];
  snprintf(gz, sizeof gz, "%s/bomb.gz", dir);
  int w = write_gz(gz, buf, len);
  free(buf);
  ASSERT(w == 0);
  dt_idx idx;
  ASSERT_STATUS(dt_idx_load_max(gz, (size_t)1 << 20, &idx), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), gz) == dt_last_error());
  ASSERT(strstr(dt_last_error(), "exceeds the limit") != NULL);
  ASSERT_OK(dt_idx_load_max(gz, (size_t)8 << 20, &idx));
  ASSERT_EQ(idx.count, (size_t)8 << 20);
  dt_idx_free(&idx);

  /* the inflater alone: exactly at the bound passes, one byte less fails */
  uint8_t *comp = NULL;
  FILE *f = fopen(gz, "rb");
  ASSERT(f != NULL);
  comp = malloc(1 << 20);
  size_t n = fread(comp, 1, 1 << 20, f);
  fclose(f);
  uint8_t *out = NULL;
  size_t out_len = 0;
  dt_status s1 = dt_gunzip(comp, n, len, &out, &out_len);
  dt_free(out);
  dt_status s2 = dt_gunzip(comp, n, len - 1, &out, &out_len);
  dt_status s3 = dt_gunzip(comp + 1, n - 1, len, &out, &out_len);
  free(comp);
  ASSERT_EQ(s1, DT_OK);
  ASSERT_EQ(out_len, len);
  ASSERT_EQ(s2, DT_CORRUPT);
  ASSERT_EQ(s3, DT_CORRUPT);
  const char *names[] = {"bomb.gz"};
  remove_dir(dir, names, 1);
}

TEST(idx_load_missing_file_names_it) {
  dt_idx idx;
  dt_status s = dt_idx_load("/nonexistent/dir/train-images-idx3-ubyte", &idx);
  ASSERT(s == DT_NOT_FOUND || s == DT_IO);
  ASSERT(strstr(dt_last_error(), "/nonexistent/dir/train-images-idx3-ubyte") != NULL);
  ASSERT_STATUS(dt_idx_load("/", &idx), DT_IO); /* a directory */
  ASSERT(strstr(dt_last_error(), "not a regular file") != NULL);
}

/* ---- datasets -------------------------------------------------------------- */

/* A fake dataset in dir: n images of h x w (pixel = (i * 37 + p) & 255), labels i % 10
 * (or `labels` if given); train files gzip, t10k files raw. */
static int write_fake(const char *dir, const char *prefix, int n, int n_labels, int h, int w, const uint8_t *labels,
                      int gz) {
  size_t ilen = 16 + (size_t)n * h * w, llen = 8 + (size_t)n_labels;
  uint8_t *img = malloc(ilen), *lab = malloc(llen);
  if (!img || !lab) return -1;
  uint32_t idims[3] = {(uint32_t)n, (uint32_t)h, (uint32_t)w}, ldims[1] = {(uint32_t)n_labels};
  put_header(img, 0x08, 3, idims);
  put_header(lab, 0x08, 1, ldims);
  for (int i = 0; i < n; i++)
    for (int p = 0; p < h * w; p++) img[16 + (size_t)i * h * w + p] = (uint8_t)((i * 37 + p) & 255);
  for (int i = 0; i < n_labels; i++) lab[8 + i] = labels ? labels[i] : (uint8_t)(i % 10);
  char ip[512], lp[512];
  snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte%s", dir, prefix, gz ? ".gz" : "");
  snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte%s", dir, prefix, gz ? ".gz" : "");
  int r = gz ? (write_gz(ip, img, ilen) | write_gz(lp, lab, llen)) : (write_raw(ip, img, ilen) | write_raw(lp, lab, llen));
  free(img);
  free(lab);
  return r;
}

static const char *const fake_names[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

TEST(dataset_loads_fake_dir_and_normalises_exactly) {
  const char *dir = make_tmpdir();
  ASSERT(dir != NULL);
  ASSERT(write_fake(dir, "train", 23, 23, 5, 6, NULL, 1) == 0);
  ASSERT(write_fake(dir, "t10k", 7, 7, 5, 6, NULL, 0) == 0);
  dt_dataset *tr = NULL, *te = NULL;
  ASSERT_OK(dt_dataset_load(dir, DT_SPLIT_TRAIN, NULL, &tr));
  dt_normalize norm = {1, 0.2860f, 0.3530f};
  ASSERT_OK(dt_dataset_load(dir, DT_SPLIT_TEST, &norm, &te));
  ASSERT_EQ(dt_dataset_size(tr), 23);
  ASSERT_EQ(dt_dataset_size(te), 7);
  ASSERT_EQ(dt_dataset_classes(tr), 10);
  int64_t shape[3];
  dt_dataset_sample_shape(tr, shape);
  ASSERT_EQ(shape[0], 1);
  ASSERT_EQ(shape[1], 5);
  ASSERT_EQ(shape[2], 6);

  int64_t idx[3] = {22, 0, 13};
  float x[3 * 30];
  int32_t y[3];
  dt_dataset_gather(tr, idx, 3, x, y);
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(y[i], idx[i] % 10);
    for (int p = 0; p < 30; p++) {
      float want = (float)((idx[i] * 37 + p) & 255) / 255.0f;
      ASSERT(x[i * 30 + p] == want);
    }
  }
  ASSERT(x[30 + 0] == 0.0f); /* sample 0, pixel 0 is 0 */
  int64_t j = 6;
  dt_dataset_gather(te, &j, 1, x, y);
  ASSERT_EQ(y[0], 6);
  for (int p = 0; p < 30; p++) {
    float want = ((float)((6 * 37 + p) & 255) / 255.0f - 0.2860f) / 0.3530f;
    ASSERT(x[p] == want);
  }
  ASSERT_NEAR(x[0], ((222.0 / 255.0) - 0.2860) / 0.3530, 1e-6);

  dt_normalize bad = {1, 0.5f, 0.0f};
  ASSERT_STATUS(dt_dataset_load(dir, DT_SPLIT_TEST, &bad, &te), DT_INVALID_ARGUMENT);
  dt_dataset_free(tr);
  dt_dataset_free(te);
  dt_dataset_free(NULL);
  remove_dir(dir, fake_names, 4);
}

TEST(dataset_rejects_bad_files) {
  const char *dir = make_tmpdir();
  ASSERT(dir != NULL);
  dt_dataset *ds = (dt_dataset *)0x1;
  /* missing files: DT_NOT_FOUND naming the file */
  ASSERT_STATUS(dt_dataset_load(dir, DT_SPLIT_TRAIN, NULL, &ds), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "train-images-idx3-ubyte[.gz] not found") != NULL);
  ASSERT(strstr(dt_last_error(), dir) != NULL);

  /* count mismatch */
  ASSERT(write_fake(dir, "train", 12, 11, 4, 4, NULL, 1) == 0);
  ASSERT_STATUS(dt_dataset_load(dir, DT_SPLIT_TRAIN, NULL, &ds), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "12 images but") != NULL);
  ASSERT(strstr(dt_last_error(), "11 labels") != NULL);

  /* label >= 10 names the first bad index */
  uint8_t labels[12] = {0, 1, 2, 3, 4, 10, 6, 7, 8, 9, 255, 0};
  ASSERT(write_fake(dir, "train", 12, 12, 4, 4, labels, 1) == 0);
  ASSERT_STATUS(dt_dataset_load(dir, DT_SPLIT_TRAIN, NULL, &ds), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "label 10 at index 5") != NULL);

  /* images of the wrong rank or type */
  char ip[512];
  snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte.gz", dir);
  uint8_t buf[8 + 12];
  uint32_t d1[1] = {12};
  put_header(buf, 0x08, 1, d1);
  memset(buf + 8, 1, 12);
  ASSERT(write_gz(ip, buf, sizeof buf) == 0);
  ASSERT_STATUS(dt_dataset_load(dir, DT_SPLIT_TRAIN, NULL, &ds), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "3 dims") != NULL);
  ASSERT(ds == (dt_dataset *)0x1);

  /* unknown names list the known ones */
  ASSERT_STATUS(dt_dataset_load("no-such-dataset", DT_SPLIT_TRAIN, NULL, &ds), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "no-such-dataset") != NULL);
  ASSERT(strstr(dt_last_error(), "fashion-mnist, mnist") != NULL);

  /* known names are looked up under DT_DATA_DIR, with the install hint */
  setenv("DT_DATA_DIR", dir, 1);
  ASSERT_STATUS(dt_dataset_load("fashion-mnist", DT_SPLIT_TEST, NULL, &ds), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "/fashion-mnist/t10k-images-idx3-ubyte") != NULL);
  ASSERT(strstr(dt_last_error(), "apt-get install dataset-fashion-mnist") != NULL);
  unsetenv("DT_DATA_DIR");
  const char *names[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"};
  remove_dir(dir, names, 2);
}

TEST(dataset_real_fashion_mnist) {
  const char *dir = "/usr/share/datasets/fashion-mnist";
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    printf("note: %s missing (apt-get install dataset-fashion-mnist); skipping this case\n", dir);
    return;
  }
  unsetenv("DT_DATA_DIR");
  dt_dataset *tr = NULL, *te = NULL;
  ASSERT_OK(dt_dataset_load("fashion-mnist", DT_SPLIT_TRAIN, NULL, &tr));
  ASSERT_OK(dt_dataset_load("fashion-mnist", DT_SPLIT_TEST, NULL, &te));
  ASSERT_EQ(dt_dataset_size(tr), 60000);
  ASSERT_EQ(dt_dataset_size(te), 10000);
  int64_t shape[3];
  dt_dataset_sample_shape(tr, shape);
  ASSERT_EQ(shape[0], 1);
  ASSERT_EQ(shape[1], 28);
  ASSERT_EQ(shape[2], 28);
  int64_t hist[10] = {0};
  float x[784];
  int32_t y;
  int ok = 1;
  for (int64_t i = 0; i < 60000; i++) {
    dt_dataset_gather(tr, &i, 1, x, &y);
    if (y < 0 || y > 9) ok = 0; else hist[y]++;
    if (i == 0) ASSERT_EQ(y, 9);
  }
  ASSERT(ok);
  for (int c = 0; c < 10; c++) ASSERT_EQ(hist[c], 6000);
  dt_dataset_free(te);
  dt_dataset_free(tr);
}

/* ---- loader -------------------------------------------------------------- */

/* A fake dataset of n samples (2 x 3 pixels) in a temp dir, loaded. */
static dt_dataset *fake_dataset(int n, char *dir_out) {
  const char *dir = make_tmpdir();
  if (!dir) return NULL;
  strcpy(dir_out, dir);
  if (write_fake(dir, "train", n, n, 2, 3, NULL, 0) != 0) return NULL;
  dt_dataset *ds = NULL;
  if (dt_dataset_load(dir, DT_SPLIT_TRAIN, NULL, &ds) != DT_OK) return NULL;
  const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"};
  remove_dir(dir, names, 2);
  return ds;
}

/* Reads one whole epoch; order[] gets the sample behind every row (recovered
 * from pixel 0 via the fake pattern is ambiguous, so compare with gather). */
static int run_epoch(dt_loader *l, const dt_dataset *ds, const int64_t *expect, int64_t n_expect, int bs,
                     int64_t *sizes, int64_t *n_batches) {
  float ref[64 * 6];
  int32_t ref_y[64];
  int64_t pos = 0, k = 0;
  for (;;) {
    dt_batch b;
    if (dt_loader_next(l, &b) != DT_OK) return -1;
    if (b.size == 0) break;
    if (b.index != k) return -2;
    if (sizes) sizes[k] = b.size;
    if (pos + b.size > n_expect) return -3;
    dt_dataset_gather(ds, expect + pos, b.size, ref, ref_y);
    if (memcmp(ref, b.x, sizeof(float) * 6 * (size_t)b.size) != 0) return -4;
    if (memcmp(ref_y, b.y, sizeof(int32_t) * (size_t)b.size) != 0) return -5;
    pos += b.size;
    k++;
  }
  (void)bs;
  *n_batches = k;
  return (int)pos;
}

/* The order the loader must produce: Fisher-Yates with Philox(seed, epoch). */
static void expected_order(int64_t n, int shuffle, uint64_t seed, int64_t epoch, int64_t *out) {
  for (int64_t i = 0; i < n; i++) out[i] = i;
  if (!shuffle) return;
  dt_rng r;
  dt_rng_init(&r, seed, (uint64_t)epoch);
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = dt_rng_below(&r, (uint32_t)(i + 1));
    int64_t t = out[i];
    out[i] = out[j];
    out[j] = t;
  }
}

TEST(loader_visits_every_sample_once) {
  char dir[64];
  dt_dataset *ds = fake_dataset(103, dir);
  ASSERT(ds != NULL);
  for (int pf = 1; pf <= 4; pf += 3) {
    dt_loader_config c = {.batch_size = 10, .shuffle = 1, .seed = 42, .prefetch = pf};
    dt_loader *l = NULL;
    ASSERT_OK(dt_loader_new(ds, &c, &l));
    ASSERT_EQ(dt_loader_batches_per_epoch(l), 11);
    ASSERT_EQ(dt_loader_samples_per_epoch(l), 103);
    for (int64_t epoch = 0; epoch < 3; epoch++) {
      int64_t order[103], sizes[16], nb = 0;
      expected_order(103, 1, 42, epoch, order);
      ASSERT_OK(dt_loader_start_epoch(l, epoch));
      ASSERT_EQ(run_epoch(l, ds, order, 103, 10, sizes, &nb), 103);
      ASSERT_EQ(nb, 11);
      for (int k = 0; k < 10; k++) ASSERT_EQ(sizes[k], 10);
      ASSERT_EQ(sizes[10], 3);
      int seen[103] = {0};
      for (int i = 0; i < 103; i++) seen[order[i]]++;
      for (int i = 0; i < 103; i++) ASSERT_EQ(seen[i], 1);
      dt_batch b;
      ASSERT_OK(dt_loader_next(l, &b)); /* stays at the end */
      ASSERT_EQ(b.size, 0);
    }
    ASSERT(dt_loader_wait_seconds(l) >= 0.0);
    dt_loader_free(l);
  }
  dt_dataset_free(ds);
}

/* Half of a batch handed out unfilled, fetched on a thread of its own (as a DataParallel worker fills its slice). */
typedef struct fill_half {
  const dt_loader *l;
  int lo, n;
  dt_status st;
} fill_half;

static void *fill_half_main(void *arg) {
  fill_half *h = arg;
  h->st = dt_loader_fill(h->l, h->lo, h->n);
  return NULL;
}

TEST(inline_loader_makes_the_batches_in_the_callers_threads) {
  char dir[64];
  dt_dataset *ds = fake_dataset(103, dir);
  ASSERT(ds != NULL);
  dt_loader_config c = {.batch_size = 10, .shuffle = 1, .seed = 42, .workers = DT_LOADER_INLINE};
  dt_loader *l = NULL;
  ASSERT_OK(dt_loader_new(ds, &c, &l));
  ASSERT_STATUS(dt_loader_fill(l, 0, 1), DT_INVALID_ARGUMENT); /* no batch handed out yet */
  int64_t order[103], nb = 0;
  for (int64_t epoch = 0; epoch < 2; epoch++) { /* dt_loader_next makes the same batches a thread would */
    expected_order(103, 1, 42, epoch, order);
    ASSERT_OK(dt_loader_start_epoch(l, epoch));
    ASSERT_EQ(run_epoch(l, ds, order, 103, 10, NULL, &nb), 103);
    ASSERT_EQ(nb, 11);
  }
  ASSERT(dt_loader_wait_seconds(l) > 0.0); /* making them is the caller's wait for data */
  /* Unfilled: nothing fetched until dt_loader_fill; two threads each fill half of every batch. */
  expected_order(103, 1, 42, 2, order);
  ASSERT_OK(dt_loader_start_epoch(l, 2));
  float ref[10 * 6];
  int32_t ref_y[10];
  for (int k = 0, pos = 0;; k++) {
    dt_batch b;
    ASSERT_OK(dt_loader_next_unfilled(l, &b));
    if (b.size == 0) break;
    ASSERT_EQ(b.size, k < 10 ? 10 : 3);
    memset((void *)b.x, 0xff, sizeof(float) * 6 * (size_t)b.size); /* NaNs unless fetched */
    fill_half h[2] = {{l, 0, b.size / 2, DT_INTERNAL}, {l, b.size / 2, b.size - b.size / 2, DT_INTERNAL}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_create(&t[i], NULL, fill_half_main, &h[i]), 0);
    for (int i = 0; i < 2; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
    ASSERT_OK(h[0].st);
    ASSERT_OK(h[1].st);
    dt_dataset_gather(ds, order + pos, b.size, ref, ref_y);
    ASSERT(memcmp(ref, b.x, sizeof(float) * 6 * (size_t)b.size) == 0);
    ASSERT(memcmp(ref_y, b.y, sizeof(int32_t) * (size_t)b.size) == 0);
    ASSERT_STATUS(dt_loader_fill(l, 2, b.size - 1), DT_INVALID_ARGUMENT); /* past the batch's end */
    ASSERT_STATUS(dt_loader_fill(l, -1, 1), DT_INVALID_ARGUMENT);
    ASSERT_STATUS(dt_loader_fill(l, 1, INT_MAX), DT_INVALID_ARGUMENT);
    ASSERT(strstr(dt_last_error(), "2147483648") != NULL); /* the range's end, not a wrapped int */
    pos += b.size;
  }
  dt_loader_free(l);
  /* A threaded loader's unfilled batch is made already: dt_loader_fill leaves it as it is. */
  c.workers = 1;
  ASSERT_OK(dt_loader_new(ds, &c, &l));
  ASSERT_OK(dt_loader_start_epoch(l, 0));
  expected_order(103, 1, 42, 0, order);
  dt_batch b;
  ASSERT_OK(dt_loader_next_unfilled(l, &b));
  dt_dataset_gather(ds, order, b.size, ref, ref_y);
  ASSERT(memcmp(ref, b.x, sizeof(float) * 6 * (size_t)b.size) == 0);
  memset((void *)b.x, 0, sizeof(float) * 6 * (size_t)b.size);
  ASSERT_OK(dt_loader_fill(l, 0, b.size));
  ASSERT(((const float *)b.x)[0] == 0.0f && ((const float *)b.x)[6 * b.size - 1] == 0.0f); /* not fetched again */
  dt_loader_free(l);
  c.workers = -2;
  ASSERT_STATUS(dt_loader_new(ds, &c, &l), DT_INVALID_ARGUMENT);
  dt_dataset_free(ds);
}

TEST(loader_order_is_pure_function_of_seed_and_epoch) {
  int64_t a[500], b[500], c[500];
  expected_order(500, 1, 7, 3, a);
  expected_order(500, 1, 7, 3, b);
  expected_order(500, 1, 7, 4, c);
  ASSERT(memcmp(a, b, sizeof a) == 0);
  ASSERT(memcmp(a, c, sizeof a) != 0);
  char dir[64];
  dt_dataset *ds = fake_dataset(500, dir);
  ASSERT(ds != NULL);
  /* two loaders, epochs visited in different orders, give the same batches */
  dt_loader_config cfg = {.batch_size = 64, .shuffle = 1, .seed = 7, .prefetch = 2};
  dt_loader *l1 = NULL, *l2 = NULL;
  ASSERT_OK(dt_loader_new(ds, &cfg, &l1));
  ASSERT_OK(dt_loader_new(ds, &cfg, &l2));
  int64_t nb;
  ASSERT_OK(dt_loader_start_epoch(l1, 3));
  ASSERT_EQ(run_epoch(l1, ds, a, 500, 64, NULL, &nb), 500);
  ASSERT_OK(dt_loader_start_epoch(l2, 4));
  ASSERT_EQ(run_epoch(l2, ds, c, 500, 64, NULL, &nb), 500);
  ASSERT_OK(dt_loader_start_epoch(l2, 3));
  ASSERT_EQ(run_epoch(l2, ds, a, 500, 64, NULL, &nb), 500);
  /* a different epoch's order must not match (the check can fail) */
  ASSERT_OK(dt_loader_start_epoch(l1, 4));
  ASSERT(run_epoch(l1, ds, a, 500, 64, NULL, &nb) < 0);
  dt_loader_free(l1);
  dt_loader_free(l2);
  /* no shuffle: sequential */
  cfg.shuffle = 0;
  ASSERT_OK(dt_loader_new(ds, &cfg, &l1));
  expected_order(500, 0, 0, 0, a);
  ASSERT_OK(dt_loader_start_epoch(l1, 9));
  ASSERT_EQ(run_epoch(l1, ds, a, 500, 64, NULL, &nb), 500);
  dt_loader_free(l1);
  dt_dataset_free(ds);
}

TEST(loader_drop_last) {
  char dir[64];
  dt_dataset *ds = fake_dataset(103, dir);
  ASSERT(ds != NULL);
  dt_loader_config c = {.batch_size = 10, .drop_last = 1, .prefetch = 3};
  dt_loader *l = NULL;
  ASSERT_OK(dt_loader_new(ds, &c, &l));
  ASSERT_EQ(dt_loader_batches_per_epoch(l), 10);
  ASSERT_EQ(dt_loader_samples_per_epoch(l), 100);
  int64_t order[103], sizes[16], nb;
  expected_order(103, 0, 0, 0, order);
  ASSERT_OK(dt_loader_start_epoch(l, 0));
  ASSERT_EQ(run_epoch(l, ds, order, 103, 10, sizes, &nb), 100);
  ASSERT_EQ(nb, 10);
  ASSERT_EQ(sizes[9], 10);
  dt_loader_free(l);
  /* batch larger than the dataset with drop_last: no batches at all */
  c.batch_size = 200;
  ASSERT_OK(dt_loader_new(ds, &c, &l));
  ASSERT_EQ(dt_loader_batches_per_epoch(l), 0);
  ASSERT_OK(dt_loader_start_epoch(l, 0));
  ASSERT_EQ(run_epoch(l, ds, order, 103, 200, NULL, &nb), 0);
  dt_loader_free(l);
  dt_dataset_free(ds);
}

/* Every third sample from `epoch % 3`, backwards. */
typedef struct stride_sampler {
  int64_t n;
  int calls;
} stride_sampler;
static dt_status stride_fn(void *user, int64_t epoch, int64_t *out, int64_t *n) {
  stride_sampler *s = user;
  s->calls++;
  int64_t k = 0;
  for (int64_t i = s->n - 1; i >= 0; i--)
    if (i % 3 == epoch % 3) out[k++] = i;
  *n = k;
  return DT_OK;
}
static dt_status bad_sampler_fn(void *user, int64_t epoch, int64_t *out, int64_t *n) {
  out[0] = (int64_t)(intptr_t)user;
  *n = 1;
  return DT_OK;
}

TEST(loader_sampler_is_honoured) {
  char dir[64];
  dt_dataset *ds = fake_dataset(50, dir);
  ASSERT(ds != NULL);
  stride_sampler s = {50, 0};
  dt_loader_config c = {.batch_size = 4, .shuffle = 1, .prefetch = 1, .sampler = stride_fn, .sampler_user = &s,
                        .sampler_capacity = 20};
  dt_loader *l = NULL;
  ASSERT_OK(dt_loader_new(ds, &c, &l));
  ASSERT_EQ(s.calls, 1);
  ASSERT_EQ(dt_loader_samples_per_epoch(l), 17); /* 0, 3, ..., 48 */
  ASSERT_EQ(dt_loader_batches_per_epoch(l), 5);
  for (int64_t epoch = 0; epoch < 3; epoch++) {
    int64_t order[20], nb;
    int64_t k = 0;
    for (int64_t i = 49; i >= 0; i--)
      if (i % 3 == epoch) order[k++] = i;
    ASSERT_OK(dt_loader_start_epoch(l, epoch));
    ASSERT_EQ(run_epoch(l, ds, order, k, 4, NULL, &nb), k);
    ASSERT_EQ(nb, (k + 3) / 4);
  }
  dt_loader_free(l);

  /* a sampler index outside the dataset is refused, naming it */
  dt_loader_config bad = {.batch_size = 4, .prefetch = 1, .sampler = bad_sampler_fn, .sampler_user = (void *)(intptr_t)50};
  ASSERT_STATUS(dt_loader_new(ds, &bad, &l), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "index 50") != NULL);
  dt_dataset_free(ds);
}

TEST(loader_restart_mid_epoch) {
  char dir[64];
  dt_dataset *ds = fake_dataset(300, dir);
  ASSERT(ds != NULL);
  for (int pf = 1; pf <= 4; pf += 3) {
    dt_loader_config c = {.batch_size = 7, .shuffle = 1, .seed = 5, .prefetch = pf};
    dt_loader *l = NULL;
    ASSERT_OK(dt_loader_new(ds, &c, &l));
    int64_t order[300], nb;
    dt_batch b;
    /* before any epoch: an error, not a hang */
    ASSERT_STATUS(dt_loader_next(l, &b), DT_INVALID_ARGUMENT);
    for (int rep = 0; rep < 20; rep++) {
      ASSERT_OK(dt_loader_start_epoch(l, rep));
      for (int i = 0; i < rep % 5; i++) ASSERT_OK(dt_loader_next(l, &b));
    }
    ASSERT_OK(dt_loader_start_epoch(l, 1));
    ASSERT_OK(dt_loader_start_epoch(l, 2)); /* twice in a row, nothing read */
    expected_order(300, 1, 5, 2, order);
    ASSERT_EQ(run_epoch(l, ds, order, 300, 7, NULL, &nb), 300);
    ASSERT_EQ(nb, 43);
    dt_loader_free(l);
    /* freeing with batches in flight */
    ASSERT_OK(dt_loader_new(ds, &c, &l));
    ASSERT_OK(dt_loader_start_epoch(l, 0));
    ASSERT_OK(dt_loader_next(l, &b));
    dt_loader_free(l);
  }
  dt_loader_free(NULL);
  dt_dataset_free(ds);
}

TEST(loader_validates_config) {
  char dir[64];
  dt_dataset *ds = fake_dataset(10, dir);
  ASSERT(ds != NULL);
  dt_loader *l = (dt_loader *)0x1;
  dt_loader_config c = {.batch_size = 0};
  ASSERT_STATUS(dt_loader_new(ds, &c, &l), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "batch_size") != NULL);
  c.batch_size = 2;
  c.prefetch = -1;
  ASSERT_STATUS(dt_loader_new(ds, &c, &l), DT_INVALID_ARGUMENT);
  c.prefetch = 0; /* DT_PREFETCH (0: sized by the batch) */
  setenv("DT_PREFETCH", "-1", 1);
  ASSERT_STATUS(dt_loader_new(ds, &c, &l), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "DT_PREFETCH") != NULL);
  unsetenv("DT_PREFETCH");
  ASSERT(l == (dt_loader *)0x1);
  ASSERT_OK(dt_loader_new(ds, &c, &l));
  ASSERT_STATUS(dt_loader_start_epoch(l, -1), DT_INVALID_ARGUMENT);
  dt_loader_free(l);
  dt_dataset_free(ds);
}

TEST_MAIN(TEST_ENTRY(idx_parses_u8_3d), TEST_ENTRY(idx_parses_big_endian_types), TEST_ENTRY(idx_rejects_every_corruption),
          TEST_ENTRY(idx_load_raw_and_gzip_identical), TEST_ENTRY(idx_load_corrupt_gzip_names_file),
          TEST_ENTRY(idx_gzip_bomb_is_bounded), TEST_ENTRY(idx_load_missing_file_names_it),
          TEST_ENTRY(dataset_loads_fake_dir_and_normalises_exactly), TEST_ENTRY(dataset_rejects_bad_files),
          TEST_ENTRY(dataset_real_fashion_mnist), TEST_ENTRY(loader_visits_every_sample_once),
          TEST_ENTRY(inline_loader_makes_the_batches_in_the_callers_threads),
          TEST_ENTRY(loader_order_is_pure_function_of_seed_and_epoch), TEST_ENTRY(loader_drop_last),
          TEST_ENTRY(loader_sampler_is_honoured), TEST_ENTRY(loader_restart_mid_epoch),
          TEST_ENTRY(loader_validates_config))

/* Image input: JPEG/PNG decoding to RGB, bad files, the imagefolder and cifar sources, transforms, determinism. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <png.h>

#include "data/image.h"
#include "dtrain/dtrain.h"
#include "harness.h"

static char root[64];

/* root/rel (root made on first use) */
static const char *at(const char *rel) {
  static char buf[4][512];
  static int k;
  if (!root[0]) {
    snprintf(root, sizeof root, "/tmp/dt_images_XXXXXX");
    if (!mkdtemp(root)) abort();
  }
  char *b = buf[k++ & 3];
  snprintf(b, 512, "%s/%s", root, rel);
  return b;
}

/* mkdir -p of rel's parent */
static void parent(const char *path) {
  char p[512];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = '\0';
      mkdir(p, 0777);
      *s = '/';
    }
}

/* A smooth test pattern (h, w, c), distinct per seed. */
static void pattern(uint8_t *px, int h, int w, int c, int seed) {
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int k = 0; k < c; k++) px[((size_t)y * w + x) * c + k] = (uint8_t)((x * 7 + y * 3 + k * 50 + seed * 31) & 255);
}

static void write_jpeg(const char *path, const uint8_t *px, int h, int w, int c, int quality) {
  parent(path);
  FILE *f = fopen(path, "wb");
  struct jpeg_compress_struct j;
  struct jpeg_error_mgr e;
  j.err = jpeg_std_error(&e);
  jpeg_create_compress(&j);
  jpeg_stdio_dest(&j, f);
  j.image_width = (JDIMENSION)w, j.image_height = (JDIMENSION)h, j.input_components = c;
  j.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&j);
  jpeg_set_quality(&j, quality, TRUE);
  jpeg_start_compress(&j, TRUE);
  for (int y = 0; y < h; y++) {
    JSAMPROW row = (JSAMPROW)(px + (size_t)y * w * c);
    jpeg_write_scanlines(&j, &row, 1);
  }
  jpeg_finish_compress(&j);
  jpeg_destroy_compress(&j);
  fclose(f);
}

/* PNG of color type `type` and bit depth 8 or 16 (16: each byte doubled, so the high byte is the 8-bit value). */
static void write_png(const char *path, const uint8_t *px, int h, int w, int type, int depth, const png_color *palette,
                      int n_palette) {
  parent(path);
  FILE *f = fopen(path, "wb");
  png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = png_create_info_struct(p);
  png_init_io(p, f);
  png_set_IHDR(p, info, (png_uint_32)w, (png_uint_32)h, depth, type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (palette) png_set_PLTE(p, info, palette, n_palette);
  png_write_info(p, info);
  const int ch = type == PNG_COLOR_TYPE_RGB ? 3 : type == PNG_COLOR_TYPE_RGBA ? 4 : type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2 : 1;
  uint8_t *row = malloc((size_t)w * ch * 2);
  for (int y = 0; y < h; y++) {
    for (int k = 0; k < w * ch; k++) {
      const uint8_t v = px[(size_t)y * w * ch + k];
      if (depth == 16) row[2 * k] = row[2 * k + 1] = v;
      else row[k] = v;
    }
    png_write_row(p, row);
  }
  free(row);
  png_write_end(p, NULL);
  png_destroy_write_struct(&p, &info);
  fclose(f);
}

static void write_bytes(const char *path, const void *data, size_t n) {
  parent(path);
  FILE *f = fopen(path, "wb");
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(*n + 1);
  if (fread(b, 1, *n, f) != *n) abort();
  fclose(f);
  return b;
}

/* Decodes path with dtrain: status, and pixels into px (caller frees px->p). */
static dt_status decode_file(const char *path, dt_bytes *px, int *w, int *h) {
  size_t n;
  uint8_t *b = slurp(path, &n);
  dt_status st = dt_image_decode(b, n, path, px, w, h);
  free(b);
  return st;
}

/* ---- decoding ---------------------------------------------------------------------------- */

TEST(png_rgb_gray_palette_alpha_16bit) {
  enum { H = 5, W = 7 };
  uint8_t rgb[H * W * 3], gray[H * W], rgba[H * W * 4], ga[H * W * 2], idx[H * W];
  pattern(rgb, H, W, 3, 1);
  pattern(gray, H, W, 1, 2);
  pattern(rgba, H, W, 4, 3);
  pattern(ga, H, W, 2, 4);
  png_color pal[4] = {{10, 20, 30}, {40, 50, 60}, {70, 80, 90}, {200, 210, 220}};
  for (int i = 0; i < H * W; i++) idx[i] = (uint8_t)(i % 4);
  write_png(at("rgb.png"), rgb, H, W, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  write_png(at("gray.png"), gray, H, W, PNG_COLOR_TYPE_GRAY, 8, NULL, 0);
  write_png(at("rgba.png"), rgba, H, W, PNG_COLOR_TYPE_RGBA, 8, NULL, 0);
  write_png(at("ga.png"), ga, H, W, PNG_COLOR_TYPE_GRAY_ALPHA, 8, NULL, 0);
  write_png(at("pal.png"), idx, H, W, PNG_COLOR_TYPE_PALETTE, 8, pal, 4);
  write_png(at("rgb16.png"), rgb, H, W, PNG_COLOR_TYPE_RGB, 16, NULL, 0);
  dt_bytes px = {0};
  int w, h;
  ASSERT_OK(decode_file(at("rgb.png"), &px, &w, &h));
  ASSERT_EQ(w, W);
  ASSERT_EQ(h, H);
  ASSERT(memcmp(px.p, rgb, sizeof rgb) == 0);
  ASSERT_OK(decode_file(at("rgb16.png"), &px, &w, &h));
  ASSERT(memcmp(px.p, rgb, sizeof rgb) == 0);
  ASSERT_OK(decode_file(at("gray.png"), &px, &w, &h));
  for (int i = 0; i < H * W; i++)
    for (int k = 0; k < 3; k++) ASSERT_EQ(px.p[3 * i + k], gray[i]);
  ASSERT_OK(decode_file(at("rgba.png"), &px, &w, &h));
  for (int i = 0; i < H * W; i++)
    for (int k = 0; k < 3; k++) ASSERT_EQ(px.p[3 * i + k], rgba[4 * i + k]);
  ASSERT_OK(decode_file(at("ga.png"), &px, &w, &h));
  for (int i = 0; i < H * W; i++)
    for (int k = 0; k < 3; k++) ASSERT_EQ(px.p[3 * i + k], ga[2 * i]);
  ASSERT_OK(decode_file(at("pal.png"), &px, &w, &h));
  for (int i = 0; i < H * W; i++) {
    ASSERT_EQ(px.p[3 * i], pal[i % 4].red);
    ASSERT_EQ(px.p[3 * i + 1], pal[i % 4].green);
    ASSERT_EQ(px.p[3 * i + 2], pal[i % 4].blue);
  }
  dt_free(px.p);
}

TEST(jpeg_rgb_and_gray) {
  enum { H = 16, W = 24 };
  uint8_t rgb[H * W * 3], gray[H * W];
  for (int y = 0; y < H; y++) /* smooth: JPEG's 4:2:0 chroma keeps it close */
    for (int x = 0; x < W; x++) {
      for (int k = 0; k < 3; k++) rgb[(y * W + x) * 3 + k] = (uint8_t)(40 + 4 * x + 3 * y + 20 * k);
      gray[y * W + x] = (uint8_t)(30 + 5 * x + 2 * y);
    }
  write_jpeg(at("rgb.jpg"), rgb, H, W, 3, 100);
  write_jpeg(at("gray.jpg"), gray, H, W, 1, 100);
  dt_bytes px = {0};
  int w, h;
  ASSERT_OK(decode_file(at("rgb.jpg"), &px, &w, &h));
  ASSERT_EQ(w, W);
  ASSERT_EQ(h, H);
  double err = 0;
  for (int i = 0; i < H * W * 3; i++) err += abs(px.p[i] - rgb[i]);
  ASSERT_MSG(err / (H * W * 3) < 2, "quality-100 JPEG far from its source");
  ASSERT_OK(decode_file(at("gray.jpg"), &px, &w, &h));
  for (int i = 0; i < H * W; i++) {
    ASSERT_EQ(px.p[3 * i], px.p[3 * i + 1]);
    ASSERT_EQ(px.p[3 * i], px.p[3 * i + 2]);
    ASSERT(abs(px.p[3 * i] - gray[i]) <= 2);
  }
  size_t n;
  uint8_t *b = slurp(at("rgb.jpg"), &n);
  ASSERT_OK(dt_image_probe(b, n, "rgb.jpg", &w, &h));
  ASSERT_EQ(w, W);
  free(b);
  dt_free(px.p);
}

TEST(bad_files_name_the_file) {
  enum { H = 16, W = 16 };
  uint8_t rgb[H * W * 3];
  pattern(rgb, H, W, 3, 7);
  write_jpeg(at("full.jpg"), rgb, H, W, 3, 90);
  write_png(at("full.png"), rgb, H, W, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  size_t nj, np;
  uint8_t *j = slurp(at("full.jpg"), &nj), *p = slurp(at("full.png"), &np);
  write_bytes(at("trunc.jpg"), j, nj / 2);
  write_bytes(at("trunc.png"), p, np - 20);
  write_bytes(at("empty.jpg"), "", 0);
  write_bytes(at("text.jpg"), "hello, not an image\n", 20);
  write_bytes(at("real.bmp"), "BM\x36\0\0\0", 6);
  free(j), free(p);
  const char *const bad[] = {"trunc.jpg", "trunc.png", "empty.jpg", "text.jpg"};
  dt_bytes px = {0};
  int w, h;
  for (size_t i = 0; i < 4; i++) {
    ASSERT_STATUS(decode_file(at(bad[i]), &px, &w, &h), DT_CORRUPT);
    ASSERT_MSG(strstr(dt_last_error(), bad[i]) != NULL, bad[i]);
  }
  ASSERT_STATUS(decode_file(at("real.bmp"), &px, &w, &h), DT_UNSUPPORTED);
  ASSERT(strstr(dt_last_error(), "BMP") != NULL);
  dt_free(px.p);
}

/* ---- imagefolder --------------------------------------------------------------------------- */

static dt_status open_folder(const char *dir, dt_split split, dt_augment a, int skip, int cache, dt_dataset **ds) {
  const dt_data_options opt = {.seed = 3, .augment = a, .skip_bad_images = skip, .cache_images = cache};
  return dt_dataset_load_opts(dir, split, &opt, ds);
}

/* A fetch of samples idx into x (n, 3, h, w) and y. */
static dt_status fetch(const dt_dataset *ds, int64_t epoch, const int64_t *idx, int n, float *x, int32_t *y) {
  void *f[2] = {x, y};
  return dt_dataset_fetch_epoch(ds, epoch, idx, n, f);
}

TEST(imagefolder_classes_order_and_extensions) {
  uint8_t rgb[8 * 8 * 3];
  /* classes sort bytewise: "B" < "a" < "c"; c holds a nested folder; .txt files are not images */
  const char *const files[] = {"f1/train/a/2.png", "f1/train/a/1.JPG", "f1/train/B/x.jpeg", "f1/train/c/sub/z.PNG",
                               "f1/train/c/y.png", "f1/test/a/t.png", "f1/test/B/t.png", "f1/test/c/t.png"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    pattern(rgb, 8, 8, 3, (int)i);
    if (strstr(files[i], ".png") || strstr(files[i], ".PNG"))
      write_png(at(files[i]), rgb, 8, 8, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
    else
      write_jpeg(at(files[i]), rgb, 8, 8, 3, 95);
  }
  write_bytes(at("f1/train/a/notes.txt"), "x", 1);
  dt_dataset *ds = NULL;
  ASSERT_OK(open_folder(at("f1"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds));
  const dt_data_info *in = dt_dataset_info(ds);
  ASSERT_EQ(dt_dataset_size(ds), 5);
  ASSERT_EQ(in->outputs, 3);
  ASSERT(in->has_test);
  ASSERT_EQ(in->field[0].shape[0], 3);
  ASSERT_EQ(in->field[0].shape[1], 8);
  /* order: B/x.jpeg; a/1.JPG, a/2.png; c/y.png, c/sub/z.PNG ("c" < "c/sub" as os.walk sorted) */
  float x[5 * 3 * 64];
  int32_t y[5];
  const int64_t idx[5] = {0, 1, 2, 3, 4};
  ASSERT_OK(fetch(ds, 0, idx, 5, x, y));
  const int32_t want[5] = {0, 1, 1, 2, 2};
  for (int i = 0; i < 5; i++) ASSERT_EQ(y[i], want[i]);
  /* sample 2 is a/2.png (pattern seed 0): exact pixels / 255 */
  pattern(rgb, 8, 8, 3, 0);
  ASSERT_EQ(x[2 * 192 + 0], (float)rgb[0] / 255.0f);
  ASSERT_EQ(x[2 * 192 + 64 + 9], (float)rgb[3 * 9 + 1] / 255.0f);
  /* sample 4 is c/sub/z.PNG (seed 3) */
  pattern(rgb, 8, 8, 3, 3);
  ASSERT_EQ(x[4 * 192 + 5], (float)rgb[15] / 255.0f);
  dt_dataset_free(ds);
  ASSERT_OK(open_folder(at("f1"), DT_SPLIT_TEST, DT_AUGMENT_NONE, 0, 0, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 3);
  dt_dataset_free(ds);
  /* a folder of class folders alone: training split only */
  ASSERT_OK(open_folder(at("f1/train"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 5);
  ASSERT(!dt_dataset_info(ds)->has_test);
  dt_dataset_free(ds);
  ASSERT_STATUS(open_folder(at("f1/train"), DT_SPLIT_TEST, DT_AUGMENT_NONE, 0, 0, &ds), DT_NOT_FOUND);
}

TEST(imagefolder_errors) {
  uint8_t rgb[8 * 8 * 3];
  pattern(rgb, 8, 8, 3, 1);
  dt_dataset *ds = NULL;
  /* an empty class folder: torchvision refuses it, naming it */
  write_png(at("f2/a/1.png"), rgb, 8, 8, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  mkdir(at("f2/empty"), 0777);
  write_bytes(at("f2/empty/readme.txt"), "x", 1);
  ASSERT_STATUS(open_folder(at("f2"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "empty") != NULL);
  /* no class folder at all (train/ holds only files) */
  write_png(at("f3/train/loose.png"), rgb, 8, 8, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  ASSERT_STATUS(open_folder(at("f3"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "no class folder") != NULL);
  /* images of two sizes without a resizing transform */
  write_png(at("f4/a/1.png"), rgb, 8, 8, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  write_png(at("f4/b/1.png"), rgb, 4, 8, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  ASSERT_STATUS(open_folder(at("f4"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds), DT_USAGE);
  ASSERT(strstr(dt_last_error(), "--augment") != NULL);
  ASSERT_OK(open_folder(at("f4"), DT_SPLIT_TRAIN, DT_AUGMENT_IMAGENET, 0, 0, &ds));
  ASSERT_EQ(dt_dataset_info(ds)->field[0].shape[2], 224);
  dt_dataset_free(ds);
}

TEST(imagefolder_bad_images_error_or_skip) {
  enum { S = 32 };
  uint8_t rgb[S * S * 3];
  pattern(rgb, S, S, 3, 1);
  write_png(at("f5/a/1.png"), rgb, S, S, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  write_png(at("f5/a/3.png"), rgb, S, S, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  write_png(at("f5/b/1.png"), rgb, S, S, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  write_bytes(at("f5/a/2.jpg"), "not a jpeg", 10);
  write_jpeg(at("f5/b/full.jpg"), rgb, S, S, 3, 90);
  size_t n;
  uint8_t *j = slurp(at("f5/b/full.jpg"), &n);
  write_bytes(at("f5/b/0trunc.jpg"), j, n / 2);
  unlink(at("f5/b/full.jpg"));
  free(j);
  dt_dataset *ds = NULL;
  /* --augment none checks every header at open: the text file fails there */
  ASSERT_STATUS(open_folder(at("f5"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "a/2.jpg") != NULL);
  ASSERT(strstr(dt_last_error(), "--skip-bad-images") != NULL);
  /* with a preset the files are read on fetch: the error names the file */
  ASSERT_OK(open_folder(at("f5"), DT_SPLIT_TRAIN, DT_AUGMENT_CIFAR, 0, 0, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 5);
  float x[5 * 3 * 32 * 32];
  int32_t y[5];
  const int64_t idx[5] = {0, 1, 2, 3, 4};
  ASSERT_STATUS(fetch(ds, 0, idx, 5, x, y), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "a/2.jpg") != NULL);
  dt_dataset_free(ds);
  /* the loader stops the epoch with that error */
  ASSERT_OK(open_folder(at("f5"), DT_SPLIT_TRAIN, DT_AUGMENT_CIFAR, 0, 0, &ds));
  dt_loader *l = NULL;
  const dt_loader_config lc = {.batch_size = 2, .workers = 2};
  ASSERT_OK(dt_loader_new(ds, &lc, &l));
  ASSERT_OK(dt_loader_start_epoch(l, 0));
  dt_batch b;
  dt_status st = DT_OK;
  for (int k = 0; k < 4 && st == DT_OK; k++) st = dt_loader_next(l, &b);
  ASSERT_EQ(st, DT_CORRUPT);
  dt_loader_free(l);
  /* so does one without threads, and every later call says so again; a fill of an unfilled batch fails naming the
   * file, and the epoch goes on (the caller stops) */
  const dt_loader_config li = {.batch_size = 2, .workers = DT_LOADER_INLINE};
  ASSERT_OK(dt_loader_new(ds, &li, &l));
  ASSERT_OK(dt_loader_start_epoch(l, 0));
  int bad = 0; /* the first sample that does not decode */
  while (bad < 5 && fetch(ds, 0, &idx[bad], 1, x, y) == DT_OK) bad++;
  ASSERT(bad < 4);
  st = DT_OK;
  int made = 0;
  for (; made < 4 && st == DT_OK; made++) st = dt_loader_next(l, &b);
  ASSERT_EQ(st, DT_CORRUPT);
  ASSERT_EQ(made, bad / 2 + 1); /* the batch holding it */
  ASSERT(strstr(dt_last_error(), "a/2.jpg") != NULL);
  ASSERT_STATUS(dt_loader_next(l, &b), DT_CORRUPT);
  ASSERT_OK(dt_loader_start_epoch(l, 0));
  for (int k = 0; k < bad / 2; k++) ASSERT_OK(dt_loader_next_unfilled(l, &b));
  ASSERT_OK(dt_loader_next_unfilled(l, &b));
  if (bad % 2) ASSERT_OK(dt_loader_fill(l, 0, 1));
  ASSERT_STATUS(dt_loader_fill(l, bad % 2, 1), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "a/2.jpg") != NULL);
  ASSERT_OK(dt_loader_next_unfilled(l, &b)); /* the epoch goes on */
  ASSERT_EQ(b.index, bad / 2 + 1);
  dt_loader_free(l);
  dt_dataset_free(ds);
  /* skipped: both bad files (the truncated one only a whole decode finds), counted */
  for (int cache = 0; cache < 2; cache++) {
    ASSERT_OK(open_folder(at("f5"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 1, cache, &ds));
    ASSERT_EQ(dt_dataset_size(ds), 3);
    ASSERT_EQ(dt_dataset_info(ds)->skipped, 2);
    ASSERT_OK(fetch(ds, 0, idx, 3, x, y));
    ASSERT_EQ(y[0], 0);
    ASSERT_EQ(y[1], 0);
    ASSERT_EQ(y[2], 1);
    dt_dataset_free(ds);
  }
}

/* The same samples whatever the batch grouping, worker count, cache and epoch restarts: a pure function of
 * (seed, epoch, index), so of no rank count either. */
TEST(augmentation_is_a_function_of_seed_epoch_index) {
  enum { N = 12, S = 20 };
  uint8_t rgb[S * S * 3];
  for (int i = 0; i < N; i++) {
    char name[64];
    snprintf(name, sizeof name, "f6/%c/%02d.png", 'a' + i % 3, i);
    pattern(rgb, S, S, 3, i);
    write_png(at(name), rgb, S, S, PNG_COLOR_TYPE_RGB, 8, NULL, 0);
  }
  const size_t per = 3 * 224 * 224;
  float *all = malloc(N * per * sizeof(float)), *one = malloc(per * sizeof(float)),
        *other = malloc(per * sizeof(float));
  int32_t y[N];
  int64_t idx[N];
  for (int i = 0; i < N; i++) idx[i] = i;
  dt_dataset *ds = NULL, *cached = NULL;
  ASSERT_OK(open_folder(at("f6"), DT_SPLIT_TRAIN, DT_AUGMENT_IMAGENET, 0, 0, &ds));
  ASSERT_OK(open_folder(at("f6"), DT_SPLIT_TRAIN, DT_AUGMENT_IMAGENET, 0, 1, &cached));
  ASSERT_OK(fetch(ds, 2, idx, N, all, y));
  for (int i = 0; i < N; i++) {
    int64_t k = i;
    ASSERT_OK(fetch(cached, 2, &k, 1, one, y));
    ASSERT(memcmp(one, all + i * per, per * sizeof(float)) == 0);
  }
  /* another epoch draws other crops */
  int64_t k = 5;
  ASSERT_OK(fetch(ds, 3, &k, 1, other, y));
  ASSERT(memcmp(other, all + 5 * per, per * sizeof(float)) != 0);
  /* 2 ranks of a DistributedSampler see the samples of one process */
  for (int rank = 0; rank < 2; rank++) {
    dt_dist_sampler *s = NULL;
    ASSERT_OK(dt_dist_sampler_new(N, 2, rank, 0, 1, 0, &s));
    int64_t mine[N];
    ASSERT_OK(dt_dist_sampler_indices(s, 2, mine));
    for (int64_t i = 0; i < dt_dist_sampler_num_samples(s); i++) {
      ASSERT_OK(fetch(ds, 2, &mine[i], 1, one, y));
      ASSERT(memcmp(one, all + mine[i] * per, per * sizeof(float)) == 0);
    }
    dt_dist_sampler_free(s);
  }
  /* the loader with 1 and 3 workers */
  for (int workers = 1; workers <= 3; workers += 2) {
    dt_loader *l = NULL;
    const dt_loader_config lc = {.batch_size = 5, .workers = workers};
    ASSERT_OK(dt_loader_new(ds, &lc, &l));
    ASSERT_OK(dt_loader_start_epoch(l, 2));
    dt_batch b;
    int64_t seen = 0;
    for (;;) {
      ASSERT_OK(dt_loader_next(l, &b));
      if (!b.size) break;
      ASSERT(memcmp(b.x, all + seen * per, (size_t)b.size * per * sizeof(float)) == 0);
      seen += b.size;
    }
    ASSERT_EQ(seen, N);
    dt_loader_free(l);
  }
  dt_dataset_free(ds);
  dt_dataset_free(cached);
  free(all), free(one), free(other);
}

/* ---- transforms ---------------------------------------------------------------------------- */

TEST(random_resized_crop_params) {
  const float scale[2] = {0.08f, 1.0f}, ratio[2] = {3.0f / 4, 4.0f / 3};
  dt_rng r;
  dt_rng_init(&r, 1, 2);
  double area = 0;
  for (int t = 0; t < 2000; t++) {
    int i, j, ch, cw;
    dt_rrc_params(&r, 300, 400, scale, ratio, &i, &j, &ch, &cw);
    ASSERT(ch > 0 && cw > 0 && i >= 0 && j >= 0 && i + ch <= 300 && j + cw <= 400);
    area += (double)ch * cw / (300.0 * 400);
  }
  ASSERT_NEAR(area / 2000, 0.433, 0.02); /* torchvision's loop simulated in Python: 0.433 on 300x400 */
  /* the fallback: no try fits (scale above 1), so the center crop of the nearest ratio */
  const float big[2] = {2.0f, 3.0f};
  int i, j, ch, cw;
  dt_rrc_params(&r, 100, 400, big, ratio, &i, &j, &ch, &cw);
  ASSERT_EQ(ch, 100);
  ASSERT_EQ(cw, 133); /* round(100 * 4/3) */
  ASSERT_EQ(i, 0);
  ASSERT_EQ(j, 133);  /* (400 - 133) // 2 */
  dt_rrc_params(&r, 200, 200, big, ratio, &i, &j, &ch, &cw);
  ASSERT_EQ(ch, 200);
  ASSERT_EQ(cw, 200);
}

TEST(crop_resize_center_shapes) {
  int oh, ow, i, j;
  dt_resize_shorter(375, 500, 256, &oh, &ow);
  ASSERT_EQ(oh, 256);
  ASSERT_EQ(ow, 341); /* int(256 * 500 / 375) */
  dt_center_crop_offset(256, 341, 224, 224, &i, &j);
  ASSERT_EQ(i, 16);
  ASSERT_EQ(j, 58); /* round(58.5) = 58, half to even */
  dt_center_crop_offset(221, 230, 224, 224, &i, &j);
  ASSERT_EQ(i, -1); /* padded: (224 - 221) // 2 rows above */
  ASSERT_EQ(j, 3);
  /* crop with zero padding */
  uint8_t src[2 * 2 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, dst[3 * 3 * 3];
  dt_image_crop(src, 2, 2, -1, 0, 3, 3, dst);
  for (int k = 0; k < 9; k++) ASSERT_EQ(dst[k], 0);
  ASSERT_EQ(dst[9], 1);
  ASSERT_EQ(dst[12], 4);
  ASSERT_EQ(dst[15], 0);
  /* resize of a constant image stays constant; to the same size is a copy */
  uint8_t flat[6 * 4 * 3], out[9 * 5 * 3];
  memset(flat, 77, sizeof flat);
  dt_image_resize(flat, 6, 4, 4 * 3, out, 9, 5);
  for (size_t k = 0; k < sizeof out; k++) ASSERT_EQ(out[k], 77);
  pattern(flat, 6, 4, 3, 9);
  dt_image_resize(flat, 6, 4, 4 * 3, out, 6, 4);
  ASSERT(memcmp(flat, out, sizeof flat) == 0);
}

/* ---- cifar binaries ------------------------------------------------------------------------ */

static void write_cifar(const char *path, int records, int hundred, int first_label, int bad_label) {
  const size_t rec = (size_t)(hundred ? 2 : 1) + 3072;
  uint8_t *b = calloc((size_t)records, rec);
  for (int r = 0; r < records; r++) {
    uint8_t *p = b + r * rec;
    const int label = (first_label + r) % (hundred ? 100 : 10);
    if (hundred) p[0] = (uint8_t)(label / 5), p[1] = (uint8_t)label;
    else p[0] = (uint8_t)label;
    for (int k = 0; k < 3072; k++) p[rec - 3072 + k] = (uint8_t)(k * 3 + r);
  }
  if (bad_label >= 0) b[(records - 1) * rec + (hundred ? 1 : 0)] = (uint8_t)bad_label;
  write_bytes(path, b, records * rec);
  free(b);
}

TEST(cifar_binaries) {
  write_cifar(at("c10/data_batch_1.bin"), 3, 0, 0, -1);
  write_cifar(at("c10/data_batch_2.bin"), 2, 0, 3, -1);
  write_cifar(at("c10/test_batch.bin"), 4, 0, 7, -1);
  dt_dataset *ds = NULL;
  ASSERT_OK(open_folder(at("c10"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds));
  ASSERT_STR_EQ(dt_dataset_info(ds)->name, "cifar");
  ASSERT_EQ(dt_dataset_size(ds), 5);
  ASSERT_EQ(dt_dataset_info(ds)->outputs, 10);
  float x[5 * 3072];
  int32_t y[5];
  const int64_t idx[5] = {0, 1, 2, 3, 4};
  ASSERT_OK(fetch(ds, 0, idx, 5, x, y));
  for (int i = 0; i < 5; i++) ASSERT_EQ(y[i], i);
  /* CHW in the file, CHW in x: record 4 is record 1 of the second file */
  for (int k = 0; k < 3072; k += 97) ASSERT_EQ(x[4 * 3072 + k], (float)(uint8_t)(k * 3 + 1) / 255.0f);
  dt_dataset_free(ds);
  ASSERT_OK(open_folder(at("c10"), DT_SPLIT_TEST, DT_AUGMENT_CIFAR, 0, 0, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 4);
  ASSERT_OK(fetch(ds, 0, idx, 1, x, y));
  ASSERT_EQ(y[0], 7);
  ASSERT_NEAR(x[0], (0.0f - 0.4914f) / 0.2470f, 1e-6);
  dt_dataset_free(ds);
  /* CIFAR-100: fine labels */
  write_cifar(at("c100/train.bin"), 3, 1, 98, -1);
  write_cifar(at("c100/test.bin"), 1, 1, 0, -1);
  ASSERT_OK(open_folder(at("c100"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds));
  ASSERT_EQ(dt_dataset_info(ds)->outputs, 100);
  ASSERT_OK(fetch(ds, 0, idx, 3, x, y));
  ASSERT_EQ(y[0], 98);
  ASSERT_EQ(y[1], 99);
  ASSERT_EQ(y[2], 0);
  dt_dataset_free(ds);
  /* errors: a partial record, a label out of range, a missing batch between two */
  write_cifar(at("c10b/data_batch_1.bin"), 2, 0, 0, -1);
  truncate(at("c10b/data_batch_1.bin"), 3073 + 100);
  ASSERT_STATUS(open_folder(at("c10b"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "data_batch_1.bin") != NULL);
  write_cifar(at("c10c/data_batch_1.bin"), 2, 0, 0, 10);
  ASSERT_STATUS(open_folder(at("c10c"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "label 10") != NULL);
  write_cifar(at("c100b/train.bin"), 2, 1, 0, 100);
  ASSERT_STATUS(open_folder(at("c100b"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds), DT_CORRUPT);
  write_cifar(at("c10d/data_batch_1.bin"), 1, 0, 0, -1);
  write_cifar(at("c10d/data_batch_3.bin"), 1, 0, 0, -1);
  ASSERT_STATUS(open_folder(at("c10d"), DT_SPLIT_TRAIN, DT_AUGMENT_NONE, 0, 0, &ds), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "data_batch_2.bin") != NULL);
}

/* ---- the real data in ../shared/data ---------------------------------------------------------- */

static int shared(const char *rel, char *out, size_t len) {
  const char *src = getenv("DT_SOURCE_DIR");
  snprintf(out, len, "%s/../shared/data/%s", src ? src : ".", rel);
  if (access(out, R_OK) == 0) return 1;
  printf("  (%s missing: skipped)\n", out);
  return 0;
}

TEST(real_cifar10_and_imagenette) {
  char dir[1024];
  dt_dataset *ds = NULL;
  if (shared("cifar10", dir, sizeof dir)) {
    /* the test split: 10 classes in sorted order, 1000 images each; every airplane decodes */
    ASSERT_OK(open_folder(dir, DT_SPLIT_TEST, DT_AUGMENT_CIFAR, 0, 0, &ds));
    ASSERT_EQ(dt_dataset_info(ds)->outputs, 10);
    ASSERT_EQ(dt_dataset_size(ds), 10000);
    ASSERT_EQ(dt_dataset_info(ds)->field[0].shape[1], 32);
    float *x = malloc(1000 * 3072 * sizeof(float));
    int32_t y[1000];
    int64_t idx[1000];
    for (int i = 0; i < 1000; i++) idx[i] = i;
    ASSERT_OK(fetch(ds, 0, idx, 1000, x, y));
    for (int i = 0; i < 1000; i++) ASSERT_EQ(y[i], 0); /* airplane */
    idx[0] = 9999, idx[1] = 1000, idx[2] = 5500;
    ASSERT_OK(fetch(ds, 0, idx, 3, x, y));
    ASSERT_EQ(y[0], 9); /* truck */
    ASSERT_EQ(y[1], 1); /* automobile */
    ASSERT_EQ(y[2], 5); /* dog */
    free(x);
    dt_dataset_free(ds);
  }
  if (shared("imagenette-subset", dir, sizeof dir)) {
    ASSERT_OK(open_folder(dir, DT_SPLIT_TEST, DT_AUGMENT_IMAGENET, 0, 0, &ds));
    ASSERT_EQ(dt_dataset_info(ds)->outputs, 10);
    ASSERT_EQ(dt_dataset_size(ds), 500);
    float *x = malloc(50 * 3 * 224 * 224 * sizeof(float));
    int32_t y[50];
    int64_t idx[50];
    for (int c = 0; c < 10; c += 9) { /* every image of the first and the last class */
      for (int i = 0; i < 50; i++) idx[i] = c * 50 + i;
      ASSERT_OK(fetch(ds, 0, idx, 50, x, y));
      for (int i = 0; i < 50; i++) ASSERT_EQ(y[i], c);
    }
    free(x);
    dt_dataset_free(ds);
  }
}

static void cleanup(int *dt_test_failed_) {
  (void)dt_test_failed_;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (root[0] && system(cmd) != 0) printf("  could not remove %s\n", root);
}

TEST_MAIN(TEST_ENTRY(png_rgb_gray_palette_alpha_16bit), TEST_ENTRY(jpeg_rgb_and_gray),
          TEST_ENTRY(bad_files_name_the_file), TEST_ENTRY(imagefolder_classes_order_and_extensions),
          TEST_ENTRY(imagefolder_errors), TEST_ENTRY(imagefolder_bad_images_error_or_skip),
          TEST_ENTRY(augmentation_is_a_function_of_seed_epoch_index), TEST_ENTRY(random_resized_crop_params),
          TEST_ENTRY(crop_resize_center_shapes), TEST_ENTRY(cifar_binaries), TEST_ENTRY(real_cifar10_and_imagenette),
          {"cleanup", cleanup})

/* Data source "idx": image classification from IDX files (MNIST, Fashion-MNIST), u8 in memory, normalised on fetch. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/impl.h"
#include "data/source.h"

typedef struct idx_source {
  int64_t n;          /* samples */
  int h, w;           /* pixels */
  uint8_t *images;    /* (n, h, w) */
  uint8_t *labels;    /* (n), each < classes */
  int classes;        /* 10 */
  int normalize;      /* 1: (x / 255 - mean) / std, else x / 255 */
  float mean, std;
} idx_source;

/* Datasets known by name: sub-directory of DT_DATA_DIR and how to get it. */
typedef struct known_dataset {
  const char *name;
  const char *hint;
} known_dataset;

static const known_dataset known[] = {
    {"fashion-mnist", "install it with: apt-get install dataset-fashion-mnist (or set DT_DATA_DIR)"},
    {"mnist", "download {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from http://yann.lecun.com/exdb/mnist/ "
              "into that directory (or set DT_DATA_DIR)"},
};
#define N_KNOWN (sizeof known / sizeof known[0])


/* dir/<prefix>-<kind>-ubyte, raw or .gz, into path; DT_NOT_FOUND with the hint. */
static dt_status find_file(const char *dir, const char *prefix, const char *kind, const char *hint, char *path,
                           size_t len) {
  int k = snprintf(path, len, "%s/%s-%s-ubyte", dir, prefix, kind);
  if (k < 0 || (size_t)k + 4 > len) return dt_error(DT_INVALID_ARGUMENT, "dataset path too long: %s", dir);
  if (dt_is_file(path)) return DT_OK;
  strcat(path, ".gz");
  if (dt_is_file(path)) return DT_OK;
  return dt_error(DT_NOT_FOUND, "%s/%s-%s-ubyte[.gz] not found; %s", dir, prefix, kind, hint);
}

/* Resolves `source` to a directory and the hint given when its files are missing. */
static dt_status resolve(const char *source, char *dir, size_t len, const char **hint) {
  for (size_t i = 0; i < N_KNOWN; i++) {
    if (strcmp(source, known[i].name) != 0) continue;
    const char *root;
    DT_CHECK(dt_tunable_str("DT_DATA_DIR", &root));
    int k = snprintf(dir, len, "%s/%s", root, source);
    if (k < 0 || (size_t)k >= len) return dt_error(DT_INVALID_ARGUMENT, "DT_DATA_DIR too long: %s", root);
    *hint = known[i].hint;
    return DT_OK;
  }
  if (!dt_is_dir(source)) {
    char names[256] = "";
    for (size_t i = 0; i < N_KNOWN; i++) {
      if (i) strcat(names, ", ");
      strcat(names, known[i].name);
    }
    return dt_error(DT_NOT_FOUND, "dataset '%s' is neither a directory nor a known name (%s)", source, names);
  }
  int k = snprintf(dir, len, "%s", source);
  if (k < 0 || (size_t)k >= len) return dt_error(DT_INVALID_ARGUMENT, "dataset path too long: %s", source);
  *hint = "the directory must hold {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]";
  return DT_OK;
}

static int claims(const char *spec) {
  (void)spec;
  return 1;
}

static dt_status open_idx(const char *source, dt_split split, const dt_data_options *opt, void **state,
                          dt_data_info *info, int64_t *n_out) {
  const dt_normalize *norm = opt->norm;
  if (opt->holdout != DT_HOLDOUT_DEFAULT)
    return dt_error(DT_USAGE, "%s: IDX data has its own test split; leave-last-out applies to ratings data", source);
  if (norm && norm->enabled && !(norm->std > 0.0f && isfinite(norm->std) && isfinite(norm->mean)))
    return dt_error(DT_INVALID_ARGUMENT, "normalisation needs a finite mean and std > 0 (got mean %g, std %g)",
                    (double)norm->mean, (double)norm->std);

  char dir[2048], img_path[2200], lab_path[2200];
  const char *hint = NULL;
  DT_CHECK(resolve(source, dir, sizeof dir, &hint));
  const char *prefix = split == DT_SPLIT_TRAIN ? "train" : "t10k";
  DT_CHECK(find_file(dir, prefix, "images-idx3", hint, img_path, sizeof img_path));
  DT_CHECK(find_file(dir, prefix, "labels-idx1", hint, lab_path, sizeof lab_path));

  dt_status st;
  dt_idx img = {0}, lab = {0};
  idx_source *ds = NULL;
  DT_CHECK_GOTO(dt_idx_load(img_path, &img), st, done);
  DT_CHECK_GOTO(dt_idx_load(lab_path, &lab), st, done);
  if (img.type != 0x08 || img.ndim != 3) {
    st = dt_error(DT_CORRUPT, "%s: images must be u8 (type 0x08) with 3 dims (N, H, W); found type 0x%02x, %d dims",
                  img_path, img.type, img.ndim);
    goto done;
  }
  if (lab.type != 0x08 || lab.ndim != 1) {
    st = dt_error(DT_CORRUPT, "%s: labels must be u8 (type 0x08) with 1 dim (N); found type 0x%02x, %d dims",
                  lab_path, lab.type, lab.ndim);
    goto done;
  }
  if (img.dims[0] != lab.dims[0]) {
    st = dt_error(DT_CORRUPT, "%s holds %u images but %s holds %u labels", img_path, img.dims[0], lab_path,
                  lab.dims[0]);
    goto done;
  }
  const uint8_t *labels = lab.data;
  const int classes = 10; /* the MNIST family's */
  for (size_t i = 0; i < lab.count; i++) {
    if (labels[i] >= classes) {
      st = dt_error(DT_CORRUPT, "%s: label %u at index %zu is not below %d classes", lab_path, labels[i], i, classes);
      goto done;
    }
  }

  DT_CHECK_GOTO(dt_alloc(sizeof *ds, (void **)&ds), st, done);
  ds->n = img.dims[0];
  ds->h = (int)img.dims[1];
  ds->w = (int)img.dims[2];
  ds->images = img.data;
  ds->labels = lab.data;
  ds->classes = classes;
  img.data = lab.data = NULL;
  ds->normalize = norm && norm->enabled;
  ds->mean = ds->normalize ? norm->mean : 0.0f;
  ds->std = ds->normalize ? norm->std : 1.0f;
  DT_LOG_INFO("data", "%s %s: %lld samples of 1x%dx%d", source, prefix, (long long)ds->n, ds->h, ds->w);
  const int64_t shape[3] = {1, ds->h, ds->w};
  dt_data_add_field(info, "x", DT_F32, 3, shape);
  dt_data_add_field(info, "target", DT_I32, 0, NULL);
  info->task = DT_TASK_CLASSIFICATION;
  info->outputs = classes;
  info->has_test = 1;
  *n_out = ds->n;
  *state = ds;
  st = DT_OK;
done:
  dt_idx_free(&lab);
  dt_idx_free(&img);
  return st;
}

static void free_idx(void *state) {
  idx_source *ds = state;
  if (!ds) return;
  dt_free(ds->labels);
  dt_free(ds->images);
  dt_free(ds);
}

/* The same float expression as any reference (x / 255, then (x - mean) / std), so the values are exact, not
 * merely close; IEEE division rounds alike in every vector lane, and the loops vectorise (a table of the 256
 * values gathered one pixel at a time took twice as long). */
static void normalize_row(const idx_source *ds, const uint8_t *restrict src, float *restrict dst, size_t n) {
  if (!ds->normalize) {
    for (size_t p = 0; p < n; p++) dst[p] = (float)src[p] / 255.0f;
    return;
  }
  const float mean = ds->mean, std = ds->std;
  for (size_t p = 0; p < n; p++) dst[p] = ((float)src[p] / 255.0f - mean) / std;
}

static void fetch_idx(const void *state, const int64_t *idx, int n, void *const *fields) {
  const idx_source *ds = state;
  const size_t pixels = (size_t)ds->h * (size_t)ds->w;
  float *x = fields[0];
  int32_t *y = fields[1];
  for (int i = 0; i < n; i++) {
    int64_t s = idx[i];
    assert(s >= 0 && s < ds->n); /* the loader validates sampler output */
    /* The next sample's pixels are asked for while this one's are normalised: a batch's samples lie anywhere in
     * the set, and waiting for each one's lines in turn took twice as long (21 us a batch of 64, 9 with this). */
    if (i + 1 < n) {
      const uintptr_t next = (uintptr_t)(ds->images + (size_t)idx[i + 1] * pixels);
      for (uintptr_t line = next & ~(uintptr_t)63; line < next + pixels; line += 64) __builtin_prefetch((void *)line);
    }
    normalize_row(ds, ds->images + (size_t)s * pixels, x + (size_t)i * pixels, pixels);
    y[i] = ds->labels[s];
  }
}

const dt_source_ops dt_source_idx = {
    .name = "idx",
    .doc = "fashion-mnist, mnist (under DT_DATA_DIR) or a directory of {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]",
    .claims = claims,
    .open = open_idx,
    .fetch = fetch_idx,
    .free = free_idx,
};

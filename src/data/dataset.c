/* Image-classification datasets from IDX files (MNIST, Fashion-MNIST): u8 in memory, normalised on gather. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/impl.h"
#include "dtrain/data.h"

#define CLASSES 10

struct dt_dataset {
  int64_t n;          /* samples */
  int h, w;           /* pixels */
  uint8_t *images;    /* (n, h, w) */
  uint8_t *labels;    /* (n), each < CLASSES */
  float lut[256];     /* pixel value -> normalised float */
};

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

static int is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* dir/<prefix>-<kind>-ubyte, raw or .gz, into path; DT_NOT_FOUND with the hint. */
static dt_status find_file(const char *dir, const char *prefix, const char *kind, const char *hint, char *path,
                           size_t len) {
  int k = snprintf(path, len, "%s/%s-%s-ubyte", dir, prefix, kind);
  if (k < 0 || (size_t)k + 4 > len) return dt_error(DT_INVALID_ARGUMENT, "dataset path too long: %s", dir);
  if (is_file(path)) return DT_OK;
  strcat(path, ".gz");
  if (is_file(path)) return DT_OK;
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
  if (!is_dir(source)) {
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

dt_status dt_dataset_load(const char *source, dt_split split, const dt_normalize *norm, dt_dataset **out) {
  if (!source || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_dataset_load: NULL source or out");
  if (split != DT_SPLIT_TRAIN && split != DT_SPLIT_TEST)
    return dt_error(DT_INVALID_ARGUMENT, "dt_dataset_load: unknown split %d", (int)split);
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
  dt_dataset *ds = NULL;
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
  for (size_t i = 0; i < lab.count; i++) {
    if (labels[i] >= CLASSES) {
      st = dt_error(DT_CORRUPT, "%s: label %u at index %zu is not below %d classes", lab_path, labels[i], i, CLASSES);
      goto done;
    }
  }

  DT_CHECK_GOTO(dt_alloc(sizeof *ds, (void **)&ds), st, done);
  ds->n = img.dims[0];
  ds->h = (int)img.dims[1];
  ds->w = (int)img.dims[2];
  ds->images = img.data;
  ds->labels = lab.data;
  img.data = lab.data = NULL;
  /* The same float expression as any reference (x / 255, then (x - mean) / std)
   * so gathered values are exact, not merely close. */
  for (int v = 0; v < 256; v++) {
    float x = (float)v / 255.0f;
    if (norm && norm->enabled) x = (x - norm->mean) / norm->std;
    ds->lut[v] = x;
  }
  DT_LOG_INFO("data", "%s %s: %lld samples of 1x%dx%d", source, prefix, (long long)ds->n, ds->h, ds->w);
  *out = ds;
  st = DT_OK;
done:
  dt_idx_free(&lab);
  dt_idx_free(&img);
  return st;
}

void dt_dataset_free(dt_dataset *ds) {
  if (!ds) return;
  dt_free(ds->labels);
  dt_free(ds->images);
  dt_free(ds);
}

int64_t dt_dataset_size(const dt_dataset *ds) { return ds->n; }

void dt_dataset_sample_shape(const dt_dataset *ds, int64_t shape[3]) {
  shape[0] = 1;
  shape[1] = ds->h;
  shape[2] = ds->w;
}

int dt_dataset_classes(const dt_dataset *ds) { return CLASSES; }

void dt_dataset_gather(const dt_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y) {
  const size_t pixels = (size_t)ds->h * (size_t)ds->w;
  const float *lut = ds->lut;
  for (int i = 0; i < n; i++) {
    int64_t s = idx[i];
    assert(s >= 0 && s < ds->n); /* the loader validates sampler output */
    const uint8_t *src = ds->images + (size_t)s * pixels;
    float *dst = x + (size_t)i * pixels;
    for (size_t p = 0; p < pixels; p++) dst[p] = lut[src[p]];
    y[i] = ds->labels[s];
  }
}

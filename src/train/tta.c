/* Test-time augmentation: an evaluation forward of image samples averaged over the image and its mirror. */
#include <string.h>

#include "core/impl.h"
#include "train/train_impl.h"

const char *dt_tta_name(dt_tta t) { return t == DT_TTA_FLIP ? "flip" : "none"; }

dt_status dt_tta_open(dt_tta_forward *t, dt_tta mode, const dt_model *m, dt_forward_fn inner, void *inner_user) {
  memset(t, 0, sizeof *t);
  t->inner = inner;
  t->inner_user = inner_user;
  if (mode == DT_TTA_NONE) return DT_OK;
  if (mode != DT_TTA_FLIP) return dt_error(DT_INVALID_ARGUMENT, "test-time augmentation %d unknown", (int)mode);
  int ndim = 0;
  const int64_t *shape = dt_model_input_shape(m, &ndim);
  if (ndim != 3 || dt_model_input_dtype(m) != DT_F32)
    return dt_error(DT_USAGE, "--tta flip mirrors images (C, H, W); the model's samples have %d dimension(s)%s", ndim,
                    dt_model_input_dtype(m) != DT_F32 ? " of indices" : "");
  t->mode = mode;
  t->rows = shape[0] * shape[1];
  t->w = shape[2];
  t->outputs = dt_model_output_size(m);
  return DT_OK;
}

void dt_tta_close(dt_tta_forward *t) {
  dt_free(t->flipped);
  dt_free(t->mean);
  memset(t, 0, sizeof *t);
}

/* Room for n samples' mirrored inputs and mean outputs. */
static dt_status reserve(dt_tta_forward *t, int n) {
  if (n <= t->cap) return DT_OK;
  dt_free(t->flipped);
  dt_free(t->mean);
  t->flipped = t->mean = NULL;
  t->cap = 0;
  DT_CHECK(dt_alloc_array((size_t)n * (size_t)(t->rows * t->w), sizeof(float), "mirrored images",
                          (void **)&t->flipped));
  DT_CHECK(dt_alloc_array((size_t)n * (size_t)t->outputs, sizeof(float), "test-time mean outputs", (void **)&t->mean));
  t->cap = n;
  return DT_OK;
}

/* Each row of width w reversed: torchvision's hflip of (C, H, W). */
static void mirror(float *restrict dst, const float *restrict src, int64_t rows, int64_t w) {
  for (int64_t r = 0; r < rows; r++, dst += w, src += w)
    for (int64_t j = 0; j < w; j++) dst[j] = src[w - 1 - j];
}

dt_status dt_tta_fn(void *user, const void *x, int n, const float **out) {
  dt_tta_forward *t = user;
  if (t->mode == DT_TTA_NONE) return t->inner(t->inner_user, x, n, out);
  DT_CHECK(reserve(t, n));
  const float *y = NULL;
  DT_CHECK(t->inner(t->inner_user, x, n, &y));
  const size_t no = (size_t)n * (size_t)t->outputs;
  memcpy(t->mean, y, no * sizeof(float));
  mirror(t->flipped, x, (int64_t)n * t->rows, t->w);
  DT_CHECK(t->inner(t->inner_user, t->flipped, n, &y));
  for (size_t i = 0; i < no; i++) t->mean[i] = 0.5f * (t->mean[i] + y[i]);
  *out = t->mean;
  return DT_OK;
}

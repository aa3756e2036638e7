/* torchvision's image transforms on uint8 (H, W, 3): their parameter sampling, crops, bilinear resize, ToTensor + Normalize. */
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "data/image.h"

#define STREAM_AUGMENT 0xA6ull /* top byte of an augmentation stream: (0xA6, epoch, sample index) */

static const float cifar_mean[3] = {0.4914f, 0.4822f, 0.4465f}, cifar_std[3] = {0.2470f, 0.2435f, 0.2616f};
static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f}, imagenet_std[3] = {0.229f, 0.224f, 0.225f};

const char *dt_augment_name(dt_augment a) {
  switch (a) {
  case DT_AUGMENT_CIFAR: return "cifar";
  case DT_AUGMENT_IMAGENET: return "imagenet";
  default: return "none";
  }
}

void dt_transform_preset(dt_augment a, dt_split split, const dt_normalize *norm, dt_transform *t) {
  memset(t, 0, sizeof *t);
  const int train = split == DT_SPLIT_TRAIN;
  const float *mean = NULL, *std = NULL;
  if (a == DT_AUGMENT_CIFAR) {
    mean = cifar_mean, std = cifar_std;
    if (train) *t = (dt_transform){.geom = DT_GEOM_RANDOM_CROP, .size = 32, .padding = 4, .flip = 1};
  } else if (a == DT_AUGMENT_IMAGENET) {
    mean = imagenet_mean, std = imagenet_std;
    if (train)
      *t = (dt_transform){.geom = DT_GEOM_RANDOM_RESIZED_CROP, .size = 224, .scale = {0.08f, 1.0f},
                          .ratio = {3.0f / 4.0f, 4.0f / 3.0f}, .flip = 1};
    else
      *t = (dt_transform){.geom = DT_GEOM_RESIZE_CENTER_CROP, .size = 224, .resize = 256};
  }
  for (int c = 0; c < 3; c++) {
    t->mean[c] = norm && norm->enabled ? norm->mean : mean ? mean[c] : 0.0f;
    t->std[c] = norm && norm->enabled ? norm->std : std ? std[c] : 1.0f;
  }
}

dt_status dt_transform_out_size(const dt_transform *t, int h, int w, int *oh, int *ow) {
  switch (t->geom) {
  case DT_GEOM_NONE: *oh = h, *ow = w; return DT_OK;
  case DT_GEOM_RANDOM_CROP:
    if (h + 2 * t->padding < t->size || w + 2 * t->padding < t->size)
      return dt_error(DT_USAGE, "a %dx%d image is smaller than RandomCrop(%d, padding=%d) takes", w, h, t->size,
                      t->padding);
    break;
  default: break;
  }
  *oh = *ow = t->size;
  return DT_OK;
}

void dt_transform_rng(dt_rng *r, uint64_t seed, int64_t epoch, int64_t index) {
  dt_rng_init(r, seed, STREAM_AUGMENT << 56 | ((uint64_t)epoch & 0xFFFFFF) << 32 | ((uint64_t)index & 0xFFFFFFFFu));
}

/* ---- parameters ----------------------------------------------------------------------------- */

/* Python's round(): half to even, as nearbyint in the default rounding mode. */
static int py_round(double x) { return (int)nearbyint(x); }

/* torch.randint(lo, hi): uniform in [lo, hi). */
static int randint(dt_rng *r, int lo, int hi) { return lo + (int)dt_rng_below(r, (uint32_t)(hi - lo)); }

/* Uniform in [lo, hi) with 53 random bits. */
static double uniform(dt_rng *r, double lo, double hi) {
  const uint64_t bits = ((uint64_t)dt_rng_u32(r) << 21) ^ (dt_rng_u32(r) >> 11);
  return lo + (hi - lo) * ((double)bits * 0x1p-53);
}

void dt_rrc_params(dt_rng *r, int h, int w, const float scale[2], const float ratio[2], int *i, int *j, int *ch,
                   int *cw) {
  const double area = (double)h * w, log_lo = log(ratio[0]), log_hi = log(ratio[1]);
  for (int attempt = 0; attempt < 10; attempt++) {
    const double target = area * uniform(r, scale[0], scale[1]);
    const double aspect = exp(uniform(r, log_lo, log_hi));
    const int tw = py_round(sqrt(target * aspect)), th = py_round(sqrt(target / aspect));
    if (tw > 0 && tw <= w && th > 0 && th <= h) {
      *i = randint(r, 0, h - th + 1);
      *j = randint(r, 0, w - tw + 1);
      *ch = th, *cw = tw;
      return;
    }
  }
  /* the center crop of the ratio nearest the image's */
  const double in_ratio = (double)w / h, lo = fmin(ratio[0], ratio[1]), hi = fmax(ratio[0], ratio[1]);
  int tw = w, th = h;
  if (in_ratio < lo) th = py_round(tw / lo);
  else if (in_ratio > hi) tw = py_round(th * hi);
  *i = (h - th) / 2, *j = (w - tw) / 2;
  *ch = th, *cw = tw;
}

void dt_random_crop_params(dt_rng *r, int h, int w, int th, int tw, int *i, int *j) {
  if (h == th && w == tw) { /* torchvision draws nothing then */
    *i = *j = 0;
    return;
  }
  *i = randint(r, 0, h - th + 1);
  *j = randint(r, 0, w - tw + 1);
}

void dt_resize_shorter(int h, int w, int size, int *oh, int *ow) {
  const int s = w <= h ? w : h, l = w <= h ? h : w;
  const int ns = size, nl = (int)((long long)size * l / s);
  *ow = w <= h ? ns : nl;
  *oh = w <= h ? nl : ns;
}

/* One side of CenterCrop: a crop larger than the image pads it first ((t - d) / 2 before). */
static int center_offset(int d, int t) { return t > d ? -((t - d) / 2) : py_round((d - t) / 2.0); }

void dt_center_crop_offset(int h, int w, int th, int tw, int *i, int *j) {
  *i = center_offset(h, th);
  *j = center_offset(w, tw);
}

/* ---- pixels --------------------------------------------------------------------------------- */

void dt_image_crop(const uint8_t *src, int h, int w, int i, int j, int th, int tw, uint8_t *dst) {
  const int x0 = j < 0 ? 0 : j, x1 = j + tw > w ? w : j + tw; /* image columns inside the crop */
  for (int y = 0; y < th; y++) {
    uint8_t *row = dst + (size_t)y * tw * 3;
    const int sy = i + y;
    if (sy < 0 || sy >= h || x1 <= x0) {
      memset(row, 0, (size_t)tw * 3);
      continue;
    }
    memset(row, 0, (size_t)(x0 - j) * 3);
    memcpy(row + (size_t)(x0 - j) * 3, src + ((size_t)sy * w + x0) * 3, (size_t)(x1 - x0) * 3);
    memset(row + (size_t)(x1 - j) * 3, 0, (size_t)(j + tw - x1) * 3);
  }
}

/* interpolate's source index and weights of output position d (area_pixel_compute_source_index in f32). */
static void linear_index(int in, int out, int d, int *i0, int *i1, float *l0, float *l1) {
  if (in == out) {
    *i0 = *i1 = d, *l0 = 1.0f, *l1 = 0.0f;
    return;
  }
  const float scale = (float)in / (float)out;
  float src = scale * ((float)d + 0.5f) - 0.5f;
  if (src < 0) src = 0;
  *i0 = (int)src;
  *i1 = *i0 + (*i0 < in - 1);
  float l = src - (float)*i0;
  *l1 = l < 0 ? 0 : l > 1 ? 1 : l;
  *l0 = 1.0f - *l1;
}

/* Row y of the source interpolated along x into row (dw, 3). */
static void hrow(const uint8_t *src, const int *x0, const int *x1, const float *w0, const float *w1, int dw,
                 float *row) {
  for (int x = 0; x < dw; x++) {
    const uint8_t *a = src + 3 * (size_t)x0[x], *b = src + 3 * (size_t)x1[x];
    for (int c = 0; c < 3; c++) row[3 * x + c] = (float)a[c] * w0[x] + (float)b[c] * w1[x];
  }
}

#define RESIZE_MAX_SIDE 8192

void dt_image_resize(const uint8_t *src, int sh, int sw, size_t stride, uint8_t *dst, int dh, int dw) {
  /* separable as PyTorch's kernel: each row along x, then (row0 * wy0 + row1 * wy1), rounded half to even */
  int xi0[RESIZE_MAX_SIDE], xi1[RESIZE_MAX_SIDE];
  float xw0[RESIZE_MAX_SIDE], xw1[RESIZE_MAX_SIDE];
  float rows[2][RESIZE_MAX_SIDE * 3];
  int have[2] = {-1, -1};
  for (int x = 0; x < dw; x++) linear_index(sw, dw, x, &xi0[x], &xi1[x], &xw0[x], &xw1[x]);
  for (int y = 0; y < dh; y++) {
    int y0, y1;
    float wy0, wy1;
    linear_index(sh, dh, y, &y0, &y1, &wy0, &wy1);
    /* the two rows in slots y0 & 1 and y1 & 1 (y1 is y0 or y0 + 1); each made once as y grows */
    const int need[2] = {y0, y1};
    for (int k = 0; k < 2; k++)
      if (have[need[k] & 1] != need[k]) {
        hrow(src + (size_t)need[k] * stride, xi0, xi1, xw0, xw1, dw, rows[need[k] & 1]);
        have[need[k] & 1] = need[k];
      }
    const float *r0 = rows[y0 & 1], *r1 = rows[y1 & 1];
    uint8_t *out = dst + (size_t)y * dw * 3;
    for (int k = 0; k < dw * 3; k++) {
      const float v = nearbyintf(r0[k] * wy0 + r1[k] * wy1);
      out[k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  }
}

void dt_image_to_tensor(const uint8_t *src, int h, int w, int flip, const float mean[3], const float std[3],
                        float *out) {
  float lut[3][256];
  for (int c = 0; c < 3; c++)
    for (int v = 0; v < 256; v++) lut[c][v] = ((float)v / 255.0f - mean[c]) / std[c];
  const size_t plane = (size_t)h * w;
  for (int y = 0; y < h; y++) {
    const uint8_t *row = src + (size_t)y * w * 3;
    float *o0 = out + (size_t)y * w, *o1 = o0 + plane, *o2 = o1 + plane;
    for (int x = 0; x < w; x++) {
      const uint8_t *p = row + 3 * (size_t)(flip ? w - 1 - x : x);
      o0[x] = lut[0][p[0]], o1[x] = lut[1][p[1]], o2[x] = lut[2][p[2]];
    }
  }
}

/* ---- the pipeline --------------------------------------------------------------------------- */

dt_status dt_transform_apply(const dt_transform *t, const uint8_t *img, int h, int w, dt_rng *r, dt_bytes *tmp,
                             float *out) {
  int oh, ow;
  DT_CHECK(dt_transform_out_size(t, h, w, &oh, &ow));
  const uint8_t *src = img;
  switch (t->geom) {
  case DT_GEOM_NONE: break;
  case DT_GEOM_RANDOM_CROP: {
    int i, j;
    dt_random_crop_params(r, h + 2 * t->padding, w + 2 * t->padding, t->size, t->size, &i, &j);
    DT_CHECK(dt_bytes_reserve(tmp, (size_t)t->size * t->size * 3));
    dt_image_crop(img, h, w, i - t->padding, j - t->padding, t->size, t->size, tmp->p);
    src = tmp->p;
    break;
  }
  case DT_GEOM_RANDOM_RESIZED_CROP: {
    int i, j, ch, cw;
    dt_rrc_params(r, h, w, t->scale, t->ratio, &i, &j, &ch, &cw);
    if (t->size > RESIZE_MAX_SIDE) return dt_error(DT_UNSUPPORTED, "resize to %d: at most %d", t->size, RESIZE_MAX_SIDE);
    DT_CHECK(dt_bytes_reserve(tmp, (size_t)t->size * t->size * 3));
    dt_image_resize(img + ((size_t)i * w + j) * 3, ch, cw, (size_t)w * 3, tmp->p, t->size, t->size);
    src = tmp->p;
    break;
  }
  case DT_GEOM_RESIZE_CENTER_CROP: {
    int rh, rw, i, j;
    dt_resize_shorter(h, w, t->resize, &rh, &rw);
    if (rw > RESIZE_MAX_SIDE || t->size > RESIZE_MAX_SIDE)
      return dt_error(DT_UNSUPPORTED, "a %dx%d image resizes to %dx%d: at most %d a side", w, h, rw, rh,
                      RESIZE_MAX_SIDE);
    const size_t resized = (size_t)rh * rw * 3;
    DT_CHECK(dt_bytes_reserve(tmp, resized + (size_t)t->size * t->size * 3));
    dt_image_resize(img, h, w, (size_t)w * 3, tmp->p, rh, rw);
    dt_center_crop_offset(rh, rw, t->size, t->size, &i, &j);
    dt_image_crop(tmp->p, rh, rw, i, j, t->size, t->size, tmp->p + resized);
    src = tmp->p + resized;
    break;
  }
  }
  const int flip = t->flip && dt_rng_uniform(r) < 0.5f;
  dt_image_to_tensor(src, oh, ow, flip, t->mean, t->std, out);
  return DT_OK;
}

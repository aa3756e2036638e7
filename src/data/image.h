/* Internal: RGB images as uint8 (H, W, 3), their decoders (JPEG, PNG) and torchvision's transforms over them. */
#ifndef DT_DATA_IMAGE_H
#define DT_DATA_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"
#include "dtrain/data.h"

/* ---- decoding (image_decode.c) --------------------------------------------------------------- */
typedef enum dt_image_format { DT_IMAGE_UNKNOWN, DT_IMAGE_JPEG, DT_IMAGE_PNG } dt_image_format;

/* The format by content (magic bytes), not by name. */
dt_image_format dt_image_sniff(const uint8_t *buf, size_t len);

/* Width and height from the header of the JPEG or PNG in buf[0..len). `name` (the file) is in every
 * error: DT_CORRUPT for bytes that are no JPEG or PNG or a damaged header. */
dt_status dt_image_probe(const uint8_t *buf, size_t len, const char *name, int *w, int *h);

/* A growable byte buffer (a thread's scratch for file bytes and pixels); free with dt_free(b->p). */
typedef struct dt_bytes {
  uint8_t *p;
  size_t cap;
} dt_bytes;
dt_status dt_bytes_reserve(dt_bytes *b, size_t n);

/* Decodes buf[0..len) into px as (h, w, 3) uint8 RGB, as PIL's Image.open(f).convert("RGB"):
 * grayscale is replicated, a palette looked up, alpha dropped, 16-bit samples keep their high byte
 * (PIL clips 16-bit grayscale to 255 instead). A truncated file is DT_CORRUPT (as PIL without
 * LOAD_TRUNCATED_IMAGES), naming `name`. *w and *h are written on success. */
dt_status dt_image_decode(const uint8_t *buf, size_t len, const char *name, dt_bytes *px, int *w, int *h);

/* Reads the whole file into b: *len bytes. DT_NOT_FOUND or DT_IO naming the path. */
dt_status dt_file_slurp(const char *path, dt_bytes *b, size_t *len);

/* ---- transforms (transform.c) ---------------------------------------------------------------- */
/* A torchvision transform pipeline: one geometric step, an optional flip, then ToTensor and
 * Normalize. Every step works on uint8 (H, W, 3) as torchvision's PIL transforms do; the last
 * writes f32 (3, H, W). */
typedef enum dt_geom {
  DT_GEOM_NONE,                /* the image as it is */
  DT_GEOM_RANDOM_CROP,         /* RandomCrop(size, padding): zero padding, a uniform position */
  DT_GEOM_RANDOM_RESIZED_CROP, /* RandomResizedCrop(size, scale, ratio), bilinear */
  DT_GEOM_RESIZE_CENTER_CROP,  /* Resize(resize) of the shorter side, bilinear, then CenterCrop(size) */
} dt_geom;

typedef struct dt_transform {
  dt_geom geom;
  int size;        /* square output side of the crops */
  int padding;     /* RandomCrop */
  int resize;      /* Resize: the shorter side */
  float scale[2];  /* RandomResizedCrop: area fraction */
  float ratio[2];  /* RandomResizedCrop: aspect ratio w / h */
  int flip;        /* RandomHorizontalFlip(p=0.5) */
  float mean[3], std[3]; /* Normalize per channel (after /255); mean 0, std 1 for none */
} dt_transform;

/* The preset's transform of a split, with the preset's mean and std (CIFAR-10's or ImageNet's), or
 * norm's (the same for the 3 channels) when norm is enabled, or none. */
void dt_transform_preset(dt_augment a, dt_split split, const dt_normalize *norm, dt_transform *t);
/* The (h, w) of the output for an input of (h, w) (the input's for DT_GEOM_NONE); DT_USAGE naming
 * the size when the transform cannot take it (RandomCrop larger than the padded image). */
dt_status dt_transform_out_size(const dt_transform *t, int h, int w, int *oh, int *ow);
/* Applies t to img (h, w, 3) into out (3, oh, ow) with random parameters from r (the stream of
 * one sample and epoch). tmp is scratch. */
dt_status dt_transform_apply(const dt_transform *t, const uint8_t *img, int h, int w, dt_rng *r, dt_bytes *tmp,
                             float *out);
/* The stream of sample `index` in `epoch` (the loader limits both well below the fields used). */
void dt_transform_rng(dt_rng *r, uint64_t seed, int64_t epoch, int64_t index);

/* The steps, with torchvision's parameter rules (exposed for tests). */
/* RandomResizedCrop.get_params: 10 tries of a log-uniform ratio and uniform area, then the
 * center-crop fallback; the crop is rows [*i, *i + *ch), columns [*j, *j + *cw). */
void dt_rrc_params(dt_rng *r, int h, int w, const float scale[2], const float ratio[2], int *i, int *j, int *ch,
                   int *cw);
/* RandomCrop.get_params on an (h, w) image (already padded): i = randint(0, h - th + 1), likewise j. */
void dt_random_crop_params(dt_rng *r, int h, int w, int th, int tw, int *i, int *j);
/* Resize(size) of the shorter side: torchvision's output size (the longer side truncated). */
void dt_resize_shorter(int h, int w, int size, int *oh, int *ow);
/* CenterCrop's top-left corner in image coordinates (negative: torchvision's zero padding). */
void dt_center_crop_offset(int h, int w, int th, int tw, int *i, int *j);
/* dst (th, tw, 3) = rows i.., columns j.. of src (h, w, 3); pixels outside src are 0. */
void dt_image_crop(const uint8_t *src, int h, int w, int i, int j, int th, int tw, uint8_t *dst);
/* dst (dh, dw, 3) = the (sh, sw) region at src (row stride `stride` bytes) resized bilinearly as
 * torch.nn.functional.interpolate(mode="bilinear", align_corners=False, antialias=False) on floats,
 * rounded half to even: torchvision's resize of a uint8 tensor with antialias=False. */
void dt_image_resize(const uint8_t *src, int sh, int sw, size_t stride, uint8_t *dst, int dh, int dw);
/* out (3, h, w) = (src / 255 - mean[c]) / std[c] in f32 as ToTensor + Normalize, columns mirrored when flip. */
void dt_image_to_tensor(const uint8_t *src, int h, int w, int flip, const float mean[3], const float std[3],
                        float *out);

#endif

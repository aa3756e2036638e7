/* Decodes an image with dtrain and applies one transform step with given parameters, for test_images_torchvision.py.
 *
 *   dump_image IMG OUT decode                      -> uint8 (h, w, 3)
 *   dump_image IMG OUT crop I J TH TW              -> uint8 (th, tw, 3), zero outside the image
 *   dump_image IMG OUT resize H W                  -> uint8 (h, w, 3), bilinear
 *   dump_image IMG OUT resized_crop I J CH CW SIZE -> uint8 (size, size, 3)
 *   dump_image IMG OUT resize_shorter SIZE         -> uint8; prints the output h w
 *   dump_image IMG OUT center SIZE                 -> uint8 (size, size, 3); prints the offset i j
 *   dump_image IMG OUT tensor FLIP M0 M1 M2 S0 S1 S2 -> f32 (3, h, w)
 * Writes raw bytes; prints h w of the output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/image.h"
#include "dtrain/dtrain.h"

static int die(const char *what) {
  fprintf(stderr, "dump_image: %s\n", what);
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 4) return die("usage: dump_image IMG OUT OP ARGS...");
  dt_bytes file = {0}, px = {0};
  size_t len;
  int w, h;
  if (dt_file_slurp(argv[1], &file, &len) != DT_OK || dt_image_decode(file.p, len, argv[1], &px, &w, &h) != DT_OK)
    return die(dt_last_error());
  const char *op = argv[3];
  int a[8] = {0};
  float f[8] = {0};
  for (int i = 4; i < argc && i < 12; i++) a[i - 4] = atoi(argv[i]), f[i - 4] = strtof(argv[i], NULL);
  uint8_t *out = NULL;
  float *tensor = NULL;
  int oh = h, ow = w;
  if (strcmp(op, "decode") == 0) {
    out = px.p;
  } else if (strcmp(op, "crop") == 0) {
    oh = a[2], ow = a[3];
    out = malloc((size_t)oh * ow * 3);
    dt_image_crop(px.p, h, w, a[0], a[1], oh, ow, out);
  } else if (strcmp(op, "resize") == 0) {
    oh = a[0], ow = a[1];
    out = malloc((size_t)oh * ow * 3);
    dt_image_resize(px.p, h, w, (size_t)w * 3, out, oh, ow);
  } else if (strcmp(op, "resized_crop") == 0) {
    oh = ow = a[4];
    out = malloc((size_t)oh * ow * 3);
    dt_image_resize(px.p + ((size_t)a[0] * w + a[1]) * 3, a[2], a[3], (size_t)w * 3, out, oh, ow);
  } else if (strcmp(op, "resize_shorter") == 0) {
    dt_resize_shorter(h, w, a[0], &oh, &ow);
    out = malloc((size_t)oh * ow * 3);
    dt_image_resize(px.p, h, w, (size_t)w * 3, out, oh, ow);
  } else if (strcmp(op, "center") == 0) {
    int i, j;
    dt_center_crop_offset(h, w, a[0], a[0], &i, &j);
    oh = ow = a[0];
    out = malloc((size_t)oh * ow * 3);
    dt_image_crop(px.p, h, w, i, j, oh, ow, out);
  } else if (strcmp(op, "tensor") == 0) {
    tensor = malloc((size_t)3 * h * w * sizeof(float));
    dt_image_to_tensor(px.p, h, w, a[0], f + 1, f + 4, tensor);
  } else {
    return die("unknown op");
  }
  FILE *o = fopen(argv[2], "wb");
  if (!o) return die("cannot write the output");
  if (tensor) fwrite(tensor, sizeof(float), (size_t)3 * h * w, o);
  else fwrite(out, 1, (size_t)oh * ow * 3, o);
  fclose(o);
  printf("%d %d\n", oh, ow);
  if (out != px.p) free(out);
  free(tensor);
  dt_free(file.p);
  dt_free(px.p);
  return 0;
}

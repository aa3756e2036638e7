/* Image decoding: JPEG through libjpeg(-turbo), PNG through libpng, both to 8-bit RGB as PIL's convert("RGB"). */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "core/impl.h"
#include "data/image.h"

/* Larger images are refused before any pixel is allocated (PIL's decompression-bomb limit is 179 Mpixels). */
#define MAX_PIXELS ((size_t)1 << 28)

dt_status dt_bytes_reserve(dt_bytes *b, size_t n) {
  if (n <= b->cap) return DT_OK;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < n) cap *= 2;
  void *p = NULL;
  DT_CHECK(dt_alloc(cap, &p)); /* scratch is grown rarely: what it held is not kept */
  dt_free(b->p);
  b->p = p;
  b->cap = cap;
  return DT_OK;
}

dt_image_format dt_image_sniff(const uint8_t *buf, size_t len) {
  if (len >= 3 && buf[0] == 0xFF && buf[1] == 0xD8 && buf[2] == 0xFF) return DT_IMAGE_JPEG;
  static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (len >= 8 && memcmp(buf, png_magic, 8) == 0) return DT_IMAGE_PNG;
  return DT_IMAGE_UNKNOWN;
}

static dt_status not_image(const uint8_t *buf, size_t len, const char *name) {
  if (len == 0) return dt_error(DT_CORRUPT, "%s: empty file (0 bytes), not an image", name);
  static const struct { const char *magic; const char *what; } others[] = {
      {"BM", "BMP"}, {"GIF8", "GIF"}, {"II*", "TIFF"}, {"MM\0*", "TIFF"}, {"RIFF", "WebP"}, {"P5", "PGM"}, {"P6", "PPM"}};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    const size_t n = strlen(others[i].magic) + (others[i].magic[0] == 'M');
    if (len >= n && memcmp(buf, others[i].magic, n) == 0)
      return dt_error(DT_UNSUPPORTED, "%s: a %s image; dtrain decodes JPEG and PNG only (convert it, or "
                      "--skip-bad-images to leave such files out)", name, others[i].what);
  }
  return dt_error(DT_CORRUPT, "%s: not a JPEG or PNG image (starts with %02x %02x)", name, buf[0], len > 1 ? buf[1] : 0);
}

/* ---- JPEG ----------------------------------------------------------------------------------- */

typedef struct jpeg_err {
  struct jpeg_error_mgr mgr;
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_fail(j_common_ptr c) {
  jpeg_err *e = (jpeg_err *)c->err;
  c->err->format_message(c, e->msg);
  longjmp(e->jump, 1);
}

/* Warnings are corrupt-data notes libjpeg recovers from, as PIL does; a premature end of the data
 * (a truncated file, which libjpeg pads with grey) is an error, as in PIL. */
static void jpeg_note(j_common_ptr c, int level) {
  if (level == -1 && c->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(c);
}

static dt_status jpeg_decode(const uint8_t *buf, size_t len, const char *name, dt_bytes *px, int header_only, int *w,
                             int *h) {
  struct jpeg_decompress_struct c;
  jpeg_err e;
  JSAMPROW row = NULL;
  c.err = jpeg_std_error(&e.mgr);
  e.mgr.error_exit = jpeg_fail;
  e.mgr.emit_message = jpeg_note;
  volatile int created = 0;
  if (setjmp(e.jump)) {
    if (created) jpeg_destroy_decompress(&c);
    return dt_error(DT_CORRUPT, "%s: damaged JPEG (%s)", name, e.msg);
  }
  jpeg_create_decompress(&c);
  created = 1;
  jpeg_mem_src(&c, buf, (unsigned long)len);
  jpeg_read_header(&c, TRUE);
  const int width = (int)c.image_width, height = (int)c.image_height;
  if ((size_t)width * (size_t)height > MAX_PIXELS) {
    jpeg_destroy_decompress(&c);
    return dt_error(DT_CORRUPT, "%s: %dx%d pixels, more than the %zu dtrain decodes", name, width, height, MAX_PIXELS);
  }
  if (header_only) {
    jpeg_destroy_decompress(&c);
    *w = width, *h = height;
    return DT_OK;
  }
  const int cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
  c.out_color_space = cmyk ? JCS_CMYK : JCS_RGB; /* grayscale is replicated by the library */
  jpeg_start_decompress(&c);
  const size_t stride = (size_t)width * 3;
  dt_status st = dt_bytes_reserve(px, stride * (size_t)height + (cmyk ? (size_t)width * 4 : 0));
  if (st != DT_OK) {
    jpeg_destroy_decompress(&c);
    return st;
  }
  uint8_t *out = px->p;
  while (c.output_scanline < c.output_height) {
    const size_t y = c.output_scanline;
    if (!cmyk) {
      row = out + y * stride;
      jpeg_read_scanlines(&c, &row, 1);
      continue;
    }
    /* Adobe's inverted CMYK, as PIL converts it: R = C * K / 255 (the spare row after the image) */
    row = out + stride * (size_t)height;
    jpeg_read_scanlines(&c, &row, 1);
    for (int x = 0; x < width; x++)
      for (int k = 0; k < 3; k++) out[y * stride + 3 * (size_t)x + k] = (uint8_t)(row[4 * x + k] * row[4 * x + 3] / 255);
  }
  jpeg_finish_decompress(&c);
  jpeg_destroy_decompress(&c);
  *w = width, *h = height;
  return DT_OK;
}

/* ---- PNG ------------------------------------------------------------------------------------ */

typedef struct png_reader {
  const uint8_t *buf;
  size_t len, at;
  char msg[200];
} png_reader;

static void png_read_mem(png_structp p, png_bytep out, png_size_t n) {
  png_reader *r = png_get_io_ptr(p);
  if (n > r->len - r->at) png_error(p, "the file ends inside the image data (truncated)");
  memcpy(out, r->buf + r->at, n);
  r->at += n;
}

static void png_fail(png_structp p, png_const_charp msg) {
  png_reader *r = png_get_error_ptr(p);
  snprintf(r->msg, sizeof r->msg, "%s", msg);
  png_longjmp(p, 1);
}

static void png_note(png_structp p, png_const_charp msg) { (void)p, (void)msg; }

static dt_status png_decode(const uint8_t *buf, size_t len, const char *name, dt_bytes *px, int header_only, int *w,
                            int *h) {
  png_reader r = {.buf = buf, .len = len};
  png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, png_fail, png_note);
  png_infop info = p ? png_create_info_struct(p) : NULL;
  if (!info) {
    png_destroy_read_struct(&p, NULL, NULL);
    return dt_error(DT_OUT_OF_MEMORY, "%s: cannot create a PNG reader", name);
  }
  png_bytep *volatile rows = NULL;
  if (setjmp(png_jmpbuf(p))) {
    png_destroy_read_struct(&p, &info, NULL);
    dt_free((void *)rows);
    return dt_error(DT_CORRUPT, "%s: damaged PNG (%s)", name, r.msg);
  }
  png_set_read_fn(p, &r, png_read_mem);
  png_read_info(p, info);
  const int width = (int)png_get_image_width(p, info), height = (int)png_get_image_height(p, info);
  if ((size_t)width * (size_t)height > MAX_PIXELS) {
    png_destroy_read_struct(&p, &info, NULL);
    return dt_error(DT_CORRUPT, "%s: %dx%d pixels, more than the %zu dtrain decodes", name, width, height, MAX_PIXELS);
  }
  if (header_only) {
    png_destroy_read_struct(&p, &info, NULL);
    *w = width, *h = height;
    return DT_OK;
  }
  /* to 8-bit RGB: palette and low-bit grey expanded, 16 bits to their high byte, grey replicated, alpha dropped */
  png_set_expand(p);
  png_set_strip_16(p);
  png_set_gray_to_rgb(p);
  png_set_strip_alpha(p);
  png_set_interlace_handling(p);
  png_read_update_info(p, info);
  const size_t stride = (size_t)width * 3;
  dt_status st = png_get_rowbytes(p, info) == stride ? DT_OK
                 : dt_error(DT_CORRUPT, "%s: PNG rows of %zu bytes after conversion to RGB; expected %zu", name,
                            (size_t)png_get_rowbytes(p, info), stride);
  png_bytep *row_ptrs = NULL;
  if (st == DT_OK) st = dt_bytes_reserve(px, stride * (size_t)height);
  if (st == DT_OK) st = dt_alloc_array((size_t)height, sizeof *row_ptrs, "PNG rows", (void **)&row_ptrs);
  if (st != DT_OK) {
    png_destroy_read_struct(&p, &info, NULL);
    return st;
  }
  rows = row_ptrs;
  for (int y = 0; y < height; y++) row_ptrs[y] = px->p + (size_t)y * stride;
  png_read_image(p, row_ptrs);
  png_read_end(p, NULL);
  png_destroy_read_struct(&p, &info, NULL);
  dt_free(row_ptrs);
  *w = width, *h = height;
  return DT_OK;
}

/* ---- entry points --------------------------------------------------------------------------- */

static dt_status decode(const uint8_t *buf, size_t len, const char *name, dt_bytes *px, int header_only, int *w, int *h) {
  switch (dt_image_sniff(buf, len)) {
  case DT_IMAGE_JPEG: return jpeg_decode(buf, len, name, px, header_only, w, h);
  case DT_IMAGE_PNG: return png_decode(buf, len, name, px, header_only, w, h);
  default: return not_image(buf, len, name);
  }
}

dt_status dt_image_probe(const uint8_t *buf, size_t len, const char *name, int *w, int *h) {
  return decode(buf, len, name, NULL, 1, w, h);
}

dt_status dt_image_decode(const uint8_t *buf, size_t len, const char *name, dt_bytes *px, int *w, int *h) {
  return decode(buf, len, name, px, 0, w, h);
}

dt_status dt_file_slurp(const char *path, dt_bytes *b, size_t *len) {
  FILE *f = NULL;
  size_t n = 0;
  DT_CHECK(dt_file_open_regular(path, &f, &n));
  dt_status st = dt_bytes_reserve(b, n + 1);
  if (st == DT_OK) st = dt_file_read_exact(f, path, b->p, n);
  fclose(f);
  if (st == DT_OK) *len = n;
  return st;
}

/* A synthetic IDX dataset for trainer tests: 10 classes of 1x8x8 images, class c lights pixels 6c..6c+5. */
#ifndef DT_TEST_SYNTHETIC_DATA_H
#define DT_TEST_SYNTHETIC_DATA_H

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/core.h"

static void put_be32(FILE *f, uint32_t v) {
  unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
  fwrite(b, 1, 4, f);
}

static int write_split(const char *dir, const char *prefix, int n, uint64_t seed) {
  char path[512];
  dt_rng r;
  dt_rng_init(&r, seed, 1);
  snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
  FILE *fi = fopen(path, "wb");
  snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
  FILE *fl = fopen(path, "wb");
  if (!fi || !fl) return -1;
  put_be32(fi, 0x00000803);
  put_be32(fi, (uint32_t)n);
  put_be32(fi, 8);
  put_be32(fi, 8);
  put_be32(fl, 0x00000801);
  put_be32(fl, (uint32_t)n);
  for (int i = 0; i < n; i++) {
    unsigned char label = (unsigned char)(i % 10), img[64];
    for (int k = 0; k < 64; k++) img[k] = (unsigned char)dt_rng_below(&r, 60);
    for (int k = 0; k < 6; k++) img[label * 6 + k] = (unsigned char)(180 + dt_rng_below(&r, 75));
    fwrite(img, 1, 64, fi);
    fwrite(&label, 1, 1, fl);
  }
  fclose(fi);
  fclose(fl);
  return 0;
}

static char data_dir[256];

static const char *synthetic_data(void) {
  if (data_dir[0]) return data_dir;
  snprintf(data_dir, sizeof data_dir, "/tmp/dt_test_%s_%d", DT_TEST_NAME, (int)getpid());
  mkdir(data_dir, 0777);
  if (write_split(data_dir, "train", 200, 1) || write_split(data_dir, "t10k", 100, 2)) return NULL;
  return data_dir;
}

#endif

/* Parity helper: writes a TensorBoard events file into a directory (scalars from the command line or a fixed set) and prints its path. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "io/tensorboard.h"

static int usage(void) {
  fprintf(stderr,
          "usage: dump_tensorboard DIR [--suffix S] [TAG STEP VALUE]...\n"
          "  without TAG STEP VALUE triples, writes the fixed set test_tensorboard_proto.py expects\n");
  return 2;
}

static int failed(const char *what, dt_status st) {
  fprintf(stderr, "dump_tensorboard: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  const char *dir = argv[1], *suffix = NULL;
  int first = 2;
  if (argc > 3 && strcmp(argv[2], "--suffix") == 0) {
    suffix = argv[3];
    first = 4;
  }
  if ((argc - first) % 3 != 0) return usage();

  dt_tb_writer *w = NULL;
  dt_status st = dt_tb_open(dir, suffix, &w);
  if (st != DT_OK) return failed(dir, st);

  if (argc == first) {
    /* The fixed set; test_tensorboard_proto.py lists the same. A 300-byte tag needs two-byte
     * lengths, the 4096-byte one the longest allowed; -3 is a ten-byte varint. */
    static char tag300[301], tag4096[DT_TB_TAG_MAX + 1];
    memset(tag300, 'x', 300);
    memset(tag4096, 'm', DT_TB_TAG_MAX);
    for (int i = 0; i < 5 && st == DT_OK; i++) st = dt_tb_scalar(w, "loss/train", i, 2.5f - 0.25f * (float)i);
    if (st == DT_OK) st = dt_tb_scalar(w, "acc/top1", 4, 0.1f);
    if (st == DT_OK) st = dt_tb_scalar(w, "\xc3\xbc/accuracy", 5, 1e-45f);
    if (st == DT_OK) st = dt_tb_scalar(w, "neg", -3, -INFINITY);
    if (st == DT_OK) st = dt_tb_scalar(w, "nan", 6, NAN);
    if (st == DT_OK) st = dt_tb_scalar(w, tag300, INT64_C(1) << 40, 3.4028235e38f);
    if (st == DT_OK) st = dt_tb_scalar(w, tag4096, INT64_MAX, -0.0f);
  }
  for (int a = first; a + 2 < argc && st == DT_OK; a += 3) {
    char *end1, *end2;
    errno = 0;
    long long step = strtoll(argv[a + 1], &end1, 10);
    int step_range = errno == ERANGE;
    float value = strtof(argv[a + 2], &end2); /* ERANGE here is fine: denormals and infinities */
    if (*end1 || *end2 || end1 == argv[a + 1] || end2 == argv[a + 2] || step_range) {
      dt_tb_close(w);
      return usage();
    }
    st = dt_tb_scalar(w, argv[a], (int64_t)step, value);
  }
  if (st == DT_OK) st = dt_tb_flush(w);
  if (st != DT_OK) {
    int rc = failed(dt_tb_path(w), st);
    dt_tb_close(w);
    return rc;
  }
  printf("%s\n", dt_tb_path(w));
  dt_tb_close(w);
  return 0;
}

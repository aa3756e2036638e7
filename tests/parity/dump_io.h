/* The parity dump format shared by the dump_* tools and their Python tests (parity_dump.py): PREFIX.bin holds raw
 * little-endian tensors, PREFIX.idx one line per tensor: "name f32|i32|f64|i64 offset_bytes ndim d0 d1 ...". */
#ifndef DT_TESTS_DUMP_IO_H
#define DT_TESTS_DUMP_IO_H

#include <stdio.h>

static FILE *dump_bin, *dump_idx;
static long dump_offset;

static void dump_put(const char *name, const char *type, const void *data, size_t elem, int ndim, const int *dims) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)dims[i];
  fprintf(dump_idx, "%s %s %ld %d", name, type, dump_offset, ndim);
  for (int i = 0; i < ndim; i++) fprintf(dump_idx, " %d", dims[i]);
  fprintf(dump_idx, "\n");
  fwrite(data, elem, n, dump_bin);
  dump_offset += (long)(n * elem);
}
#define DUMP_DIMS_(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__}
#define PUTF(name, data, ...) dump_put(name, "f32", data, 4, DUMP_DIMS_(__VA_ARGS__))
#define PUTI(name, data, ...) dump_put(name, "i32", data, 4, DUMP_DIMS_(__VA_ARGS__))
#define PUTD(name, data, ...) dump_put(name, "f64", data, 8, DUMP_DIMS_(__VA_ARGS__))
#define PUTL(name, data, ...) dump_put(name, "i64", data, 8, DUMP_DIMS_(__VA_ARGS__))

/* Opens argv[1].bin and argv[1].idx; 0, or the exit code after saying why. */
static int dump_open(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT_PREFIX\n", argv[0]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s.bin", argv[1]);
  dump_bin = fopen(path, "wb");
  snprintf(path, sizeof path, "%s.idx", argv[1]);
  dump_idx = fopen(path, "w");
  if (!dump_bin || !dump_idx) {
    perror(path);
    return 1;
  }
  return 0;
}

/* Closes both files; 0, or 1 after saying why (a short write). */
static int dump_close(void) {
  int bad = ferror(dump_bin) || ferror(dump_idx);
  bad |= fclose(dump_bin) != 0;
  bad |= fclose(dump_idx) != 0;
  if (bad) perror("dump");
  return bad;
}

#endif

/* Opening regular files for reading, with errors that name the path. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/impl.h"

dt_status dt_file_open_regular(const char *path, FILE **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return dt_error(errno == ENOENT ? DT_NOT_FOUND : DT_IO, "%s: %s", path, strerror(errno));
  struct stat sb;
  dt_status st = DT_OK;
  if (fstat(fileno(f), &sb) != 0)
    st = dt_error(DT_IO, "%s: %s", path, strerror(errno));
  else if (!S_ISREG(sb.st_mode))
    st = dt_error(DT_IO, "%s: not a regular file", path);
  if (st != DT_OK) {
    fclose(f);
    return st;
  }
  *out = f;
  *len = (size_t)sb.st_size;
  return DT_OK;
}

dt_status dt_file_read_exact(FILE *f, const char *path, void *buf, size_t n) {
  if (n == 0 || fread(buf, 1, n, f) == n) return DT_OK;
  return ferror(f) ? dt_error(DT_IO, "%s: read failed: %s", path, strerror(errno))
                   : dt_error(DT_CORRUPT, "%s: file shrank while reading", path);
}

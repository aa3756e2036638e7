/* Files with errors that name the path: opening and reading regular files, writing a whole file atomically, mkdir -p. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

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

/* Atomic: a failed write (a full disk, a file-size limit) leaves the previous file as it was. */
dt_status dt_file_write_text(const char *path, const char *text) {
  dt_atomic_file a;
  DT_CHECK(dt_atomic_open(&a, path));
  dt_atomic_write(&a, text, strlen(text));
  return dt_atomic_commit(&a);
}

dt_status dt_mkdir_p(const char *path, mode_t mode) {
  char buf[4096];
  size_t n = strlen(path);
  if (n == 0) return dt_error(DT_INVALID_ARGUMENT, "empty directory name");
  if (n >= sizeof buf) return dt_error(DT_INVALID_ARGUMENT, "directory name too long (%zu bytes)", n);
  memcpy(buf, path, n + 1);
  /* Create every prefix ending before a '/', then the whole path. */
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, mode) != 0 && errno != EEXIST) {
      int err = errno;
      return dt_error(DT_IO, "cannot create directory %s: %s", buf, strerror(err));
    }
    buf[i] = saved;
  }
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return dt_error(DT_IO, "%s exists and is not a directory", path);
  return DT_OK;
}

int dt_is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int dt_is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

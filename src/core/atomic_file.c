/* Files that appear whole or not at all: a temporary next to the target, fsync, rename, fsync of the directory. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/impl.h"

/* O_TRUNC without O_EXCL: a stale temporary of a dead process with our pid is overwritten. */
dt_status dt_atomic_open(dt_atomic_file *a, const char *path) {
  memset(a, 0, sizeof *a);
  if (snprintf(a->path, sizeof a->path, "%s", path) >= (int)sizeof a->path)
    return dt_error(DT_IO, "%s: path too long", path);
  snprintf(a->tmp, sizeof a->tmp, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return dt_error(DT_IO, "%s: cannot create temporary file %s: %s", path, a->tmp, strerror(errno));
  a->f = fdopen(fd, "wb");
  if (!a->f) {
    dt_status st = dt_error(DT_IO, "%s: opening temporary file %s failed: %s", path, a->tmp, strerror(errno));
    close(fd);
    unlink(a->tmp);
    return st;
  }
  return DT_OK;
}

dt_status dt_atomic_write(dt_atomic_file *a, const void *buf, size_t n) {
  if (a->st != DT_OK || n == 0) return a->st;
  errno = 0;
  if (fwrite(buf, 1, n, a->f) != n)
    a->st = dt_error(DT_IO, "%s: writing %s failed: %s", a->path, a->tmp, strerror(errno ? errno : EIO));
  return a->st;
}

/* fsync of the directory holding path, so the rename itself is durable. */
static dt_status sync_dir(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return dt_error(DT_IO, "%s: written, but opening directory %s to sync it failed: %s", path, dir, strerror(errno));
  int rc = fsync(fd), err = errno;
  close(fd);
  /* Some file systems cannot sync directories (EINVAL); the rename stands. */
  if (rc != 0 && err != EINVAL && err != EROFS)
    return dt_error(DT_IO, "%s: written, but syncing directory %s failed: %s", path, dir, strerror(err));
  return DT_OK;
}

dt_status dt_atomic_commit(dt_atomic_file *a) {
  dt_status st = a->st;
  if (st == DT_OK && fflush(a->f) != 0)
    st = dt_error(DT_IO, "%s: writing %s failed: %s", a->path, a->tmp, strerror(errno));
  if (st == DT_OK && fsync(fileno(a->f)) != 0 && errno != EINVAL)
    st = dt_error(DT_IO, "%s: fsync of %s failed: %s", a->path, a->tmp, strerror(errno));
  if (fclose(a->f) != 0 && st == DT_OK)
    st = dt_error(DT_IO, "%s: closing %s failed: %s", a->path, a->tmp, strerror(errno));
  a->f = NULL;
  if (st == DT_OK && rename(a->tmp, a->path) != 0)
    st = dt_error(DT_IO, "%s: renaming %s over it failed: %s", a->path, a->tmp, strerror(errno));
  if (st != DT_OK) {
    unlink(a->tmp);
    return st;
  }
  a->renamed = 1;
  return sync_dir(a->path);
}

void dt_atomic_abort(dt_atomic_file *a) {
  if (!a->f) return;
  fclose(a->f);
  a->f = NULL;
  unlink(a->tmp);
}

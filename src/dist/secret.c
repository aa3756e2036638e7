/* The job secret: what admits a process to a job's store and mesh (the run id
 * only names the job). Generated from the OS's random source, handed to the
 * workers in DT_JOB_SECRET, or read from a file only its owner can read. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist/dist-impl.h"

dt_status dt_job_secret_check(const char *secret, const char *where) {
  size_t n = secret ? strlen(secret) : 0;
  if (n < DT_SECRET_MIN_CHARS || n > DT_SECRET_MAX_CHARS)
    return dt_error(DT_INVALID_ARGUMENT, "%s: a job secret has %d..%d characters, this one %zu (make one with "
                    "'openssl rand -hex 32')", where, DT_SECRET_MIN_CHARS, DT_SECRET_MAX_CHARS, n);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)secret[i] <= ' ' || (unsigned char)secret[i] == 127)
      return dt_error(DT_INVALID_ARGUMENT, "%s: the job secret has a space or control character at offset %zu",
                      where, i);
  return DT_OK;
}

dt_status dt_random_bytes(void *buf, size_t n) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t k = getrandom(p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return dt_error(DT_IO, "getrandom: %s", k < 0 ? strerror(errno) : "no bytes");
    p += k;
    n -= (size_t)k;
  }
  return DT_OK;
}

dt_status dt_job_secret_generate(char *out, size_t cap) {
  unsigned char raw[DT_SECRET_RANDOM_BYTES];
  if (cap < 2 * sizeof raw + 1) return dt_error(DT_INVALID_ARGUMENT, "job secret buffer of %zu bytes too small", cap);
  DT_CHECK(dt_random_bytes(raw, sizeof raw));
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof raw; i++) {
    out[2 * i] = hex[raw[i] >> 4];
    out[2 * i + 1] = hex[raw[i] & 15];
  }
  out[2 * sizeof raw] = '\0';
  memset(raw, 0, sizeof raw);
  return DT_OK;
}

dt_status dt_job_secret_from_env(char *out, size_t cap) {
  const char *v = NULL;
  out[0] = '\0';
  DT_CHECK(dt_tunable_str("DT_JOB_SECRET", &v));
  if (!v || !*v) return DT_OK;
  DT_CHECK(dt_job_secret_check(v, "DT_JOB_SECRET"));
  if (strlen(v) >= cap) return dt_error(DT_INVALID_ARGUMENT, "DT_JOB_SECRET: longer than %zu characters", cap - 1);
  memcpy(out, v, strlen(v) + 1);
  return DT_OK;
}

/* A trailing newline (as `openssl rand -hex 32 > file` writes) is not part of the secret. */
static void chomp(char *s, size_t *n) {
  while (*n > 0 && (s[*n - 1] == '\n' || s[*n - 1] == '\r')) s[--*n] = '\0';
}

dt_status dt_job_secret_read_file(const char *path, char *out, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return dt_error(DT_IO, "secret file %s: %s", path, strerror(errno));
  struct stat st;
  dt_status rc = DT_OK;
  char buf[DT_SECRET_MAX_CHARS + 4];
  if (fstat(fd, &st) != 0) {
    rc = dt_error(DT_IO, "secret file %s: %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    rc = dt_error(DT_INVALID_ARGUMENT, "secret file %s is not a regular file", path);
  } else if (st.st_uid != geteuid()) {
    rc = dt_error(DT_INVALID_ARGUMENT, "secret file %s belongs to uid %u, not to this user (uid %u)", path,
                  (unsigned)st.st_uid, (unsigned)geteuid());
  } else if ((st.st_mode & 07777) != 0600) {
    rc = dt_error(DT_INVALID_ARGUMENT, "secret file %s has mode %04o; it must be 0600 (chmod 600 %s)", path,
                  (unsigned)(st.st_mode & 07777), path);
  }
  ssize_t k = rc == DT_OK ? read(fd, buf, sizeof buf - 1) : 0;
  int read_errno = errno;
  close(fd);
  if (rc != DT_OK) return rc;
  if (k < 0) return dt_error(DT_IO, "secret file %s: %s", path, strerror(read_errno));
  size_t n = (size_t)k;
  buf[n] = '\0';
  chomp(buf, &n);
  if (strlen(buf) != n) rc = dt_error(DT_INVALID_ARGUMENT, "secret file %s holds a NUL byte", path);
  if (rc == DT_OK) rc = dt_job_secret_check(buf, path);
  if (rc == DT_OK && n >= cap) rc = dt_error(DT_INVALID_ARGUMENT, "secret file %s: secret too long", path);
  if (rc == DT_OK) memcpy(out, buf, n + 1);
  memset(buf, 0, sizeof buf);
  return rc;
}

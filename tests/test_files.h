/* Test helpers for files: a per-process temporary directory, paths in it, its removal, whole-file reads. */
#ifndef DT_TEST_FILES_H
#define DT_TEST_FILES_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char tmpdir[64];

/* tmpdir/name (made on first use); four results stay valid at a time. */
static inline const char *tmp_path(const char *name) {
  static char buf[4][256];
  static int k;
  if (!tmpdir[0]) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_XXXXXX");
    if (!mkdtemp(tmpdir)) {
      perror("mkdtemp");
      exit(1);
    }
  }
  char *b = buf[k++ % 4];
  snprintf(b, 256, "%s/%s", tmpdir, name);
  return b;
}

/* Removes tmpdir and what the tests left in it (files and empty directories). */
static inline void remove_tmpdir(void) {
  if (!tmpdir[0]) return;
  DIR *d = opendir(tmpdir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
    if (unlink(p) != 0) rmdir(p);
  }
  if (d) closedir(d);
  rmdir(tmpdir);
}

/* Whole file as a NUL-terminated malloc'd string; NULL if missing or unreadable. */
static inline char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (s) s[n] = '\0';
  fclose(f);
  return s;
}

#endif

/* The output directory's guard: a run never writes over another run's outputs unless told to (--overwrite, --resume). */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/impl.h"
#include "dtrain/snapshot.h"
#include "train/run.h"

/* What a run writes into its output directory; snapshots/ is looked into apart. */
static const char *const run_files[] = {"config.json",       "metrics.csv", "metrics.jsonl", "summary.json",
                                        "model.safetensors", "report.html"};
#define N_RUN_FILES (sizeof run_files / sizeof run_files[0])

static void append(char *list, size_t len, size_t *o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *list, size_t len, size_t *o, const char *fmt, ...) {
  if (*o >= len) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(list + *o, len - *o, fmt, ap);
  va_end(ap);
  if (k > 0) *o += (size_t)k;
}

static int exists(const char *dir, const char *name) {
  char path[4096];
  struct stat sb;
  return snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path && lstat(path, &sb) == 0;
}

/* Entries of dir/snapshots other than . and .. (0 when there is no such directory). */
static int count_snapshot_entries(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/snapshots", dir);
  DIR *d = opendir(path);
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return n;
}

/* The run outputs in dir as "config.json, metrics.csv, snapshots/ (2 files)" into list; returns how many. */
static int find_outputs(const char *dir, char *list, size_t len) {
  size_t o = 0;
  int found = 0;
  list[0] = '\0';
  for (size_t i = 0; i < N_RUN_FILES; i++)
    if (exists(dir, run_files[i])) append(list, len, &o, "%s%s", found++ ? ", " : "", run_files[i]);
  const int n_snap = count_snapshot_entries(dir);
  if (n_snap) append(list, len, &o, "%ssnapshots/ (%d file%s)", found++ ? ", " : "", n_snap, n_snap == 1 ? "" : "s");
  return found;
}

/* 1 if dir/config.json is this run's own configuration (the same run started again, e.g. by dtrun --max-restarts). */
static int same_config(const dt_run *r) {
  char path[4096], text[sizeof r->config_json + 2];
  snprintf(path, sizeof path, "%s/config.json", r->cfg->out_dir);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  if (n > 0 && text[n - 1] == '\n') text[--n] = '\0';
  return strcmp(text, r->config_json) == 0;
}

/* Rank 0: may this run write into out_dir? *clear: yes, after deleting the outputs there (--overwrite). */
static dt_status decide(const dt_run *r, int *clear) {
  const dt_train_config *c = r->cfg;
  char list[1024], snap[4096];
  int64_t step;
  *clear = 0;
  if (!c->out_dir || find_outputs(c->out_dir, list, sizeof list) == 0) return DT_OK;
  if (c->overwrite) {
    *clear = 1;
    return DT_OK;
  }
  if (!c->resume)
    return dt_error(DT_USAGE,
                    "--out %s holds the outputs of an earlier run (%s): continue it with --resume auto, or start "
                    "afresh with --overwrite (which deletes them, snapshots included), or choose another --out",
                    c->out_dir, list);
  if (strcmp(c->resume, "auto") != 0) return DT_OK; /* a named snapshot: the run it continues writes here */
  dt_status st = dt_snapshot_find(c->out_dir, INT64_MAX, snap, sizeof snap, &step);
  if (st != DT_NOT_FOUND) return st; /* one to resume from (or an error reading the directory) */
  dt_clear_error();
  if (same_config(r)) return DT_OK; /* this very run, stopped before its first snapshot */
  return dt_error(DT_USAGE,
                  "--resume auto: --out %s holds the outputs of another run (%s) but no snapshot to continue from: "
                  "start afresh with --overwrite (which deletes them), or choose another --out",
                  c->out_dir, list);
}

dt_status dt_run_outdir_check(dt_run *r) {
  int clear = 0;
  const dt_status local = r->lead ? decide(r, &clear) : DT_OK;
  /* Logged before the sum: the other ranks fail only after it, so a launcher that stops the job at the first
   * failure cannot cut rank 0's reason short. */
  if (local != DT_OK && r->world > 1) DT_LOG_ERROR("train", "%s", dt_last_error());
  double v[2] = {local != DT_OK, clear}; /* rank 0's answer; the others add zeros */
  DT_CHECK(dt_run_all_sum(r, v, 2));
  if (v[0] != 0)
    return r->lead ? local : dt_error(DT_USAGE, "rank 0 refused the output directory (its error says why)");
  r->clear_out = v[1] != 0;
  return DT_OK;
}

/* Unlinks dir/name; a file already gone is fine. */
static dt_status remove_file(const char *dir, const char *name) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "%s/%s: path too long", dir, name);
  if (unlink(path) != 0 && errno != ENOENT)
    return dt_error(DT_IO, "--overwrite: cannot delete %s: %s", path, strerror(errno));
  return DT_OK;
}

/* Every file in dir/snapshots, then the directory itself. */
static dt_status remove_snapshots(const char *dir) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s/snapshots", dir) >= (int)sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "%s/snapshots: path too long", dir);
  DIR *d = opendir(path);
  if (!d) return DT_OK;
  dt_status st = DT_OK;
  for (struct dirent *e; st == DT_OK && (e = readdir(d));)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) st = remove_file(path, e->d_name);
  closedir(d);
  if (st == DT_OK && rmdir(path) != 0 && errno != ENOENT)
    return dt_error(DT_IO, "--overwrite: cannot delete %s: %s", path, strerror(errno));
  return st;
}

dt_status dt_run_outdir_clear(dt_run *r) {
  const dt_train_config *c = r->cfg;
  if (!r->clear_out || !r->lead) return DT_OK;
  char list[1024];
  find_outputs(c->out_dir, list, sizeof list);
  for (size_t i = 0; i < N_RUN_FILES; i++) DT_CHECK(remove_file(c->out_dir, run_files[i]));
  DT_CHECK(remove_snapshots(c->out_dir));
  if (c->progress) fprintf(c->progress, "overwrite: deleted the earlier run's outputs in %s (%s)\n", c->out_dir, list);
  return DT_OK;
}

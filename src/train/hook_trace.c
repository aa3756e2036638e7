/* Run hook "trace": the --trace file's directory made before training, the merged trace of every rank at the end. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "train/run.h"
#include "io/trace_merge.h"

/* The directory is made now, so a bad path fails before training. */
static dt_status start(dt_run *r) {
  const char *path = r->cfg->trace;
  if (!path || !r->lead) return DT_OK;
  char dir[4096];
  if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir)
    return dt_error(DT_INVALID_ARGUMENT, "--trace: file name too long");
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return DT_OK; /* the working directory, or / */
  *slash = '\0';
  dt_status st = dt_mkdir_p(dir, 0777);
  return st == DT_OK ? DT_OK : dt_error_prefix(st, "--trace %s", path);
}

static dt_status end(dt_run *r, dt_train_result *res, const double *ranks) {
  (void)res, (void)ranks;
  return r->cfg->trace ? dt_trace_write_merged(r->group, r->cfg->trace) : DT_OK;
}

const dt_run_hook dt_hook_trace = {.name = "trace", .start = start, .end = end};

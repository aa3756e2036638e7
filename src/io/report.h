/* The run report: one self-contained HTML page (inline CSS and SVG charts, no network) of a training run. */
#ifndef DT_IO_REPORT_H
#define DT_IO_REPORT_H

#include "dtrain/status.h"
#include "dtrain/train.h"

/* Training throughput at one moment of the run. */
typedef struct dt_report_point {
  double t_s;           /* seconds since the run started */
  double samples_per_s; /* training samples per second around t_s */
} dt_report_point;

/* Where one rank's training time went, in seconds (summed over the epochs). */
typedef struct dt_report_rank {
  double compute_s, data_s, comm_s; /* compute, waiting for data, waiting for communication */
} dt_report_rank;

/* Everything the page shows. All pointers are borrowed for the duration of
 * dt_report_write only. Non-finite numbers (NaN: not measured) are left out of
 * the charts and shown as a dash in tables; negative times count as 0. */
typedef struct dt_report {
  const char *title;       /* page heading, e.g. "fashioncnn on fashion-mnist"; NULL: "dtrain run" */
  const char *config_json; /* the run configuration as one JSON object, shown as key/value rows
                              (an invalid one is shown verbatim); NULL: none */
  const dt_epoch_metrics *epochs; /* n_epochs rows, in order (n_epochs 0: empty charts) */
  int n_epochs;
  const dt_report_point *throughput; /* n_throughput points, in time order (0: empty chart) */
  int n_throughput;
  const dt_report_rank *ranks; /* world rows, rank 0 first (world 0: empty chart) */
  int world;
  const char *summary_lines; /* preformatted end-of-run table; NULL: none */
  const dt_metric_set *metrics; /* the names of the rows' metrics; NULL: classification's */
  const dt_metric_detail *detail; /* the last evaluation per class or label; NULL: none */
} dt_report;

/* Writes the page to path atomically: a temporary next to it (path.tmp.<pid>),
 * fsync, rename over path, fsync of the directory. On failure returns DT_IO
 * naming the path (DT_INVALID_ARGUMENT for a bad report, DT_OUT_OF_MEMORY),
 * removes the temporary and leaves any previous file at path as it was. The
 * output depends only on *r (no clock), so equal reports give equal files. */
dt_status dt_report_write(const char *path, const dt_report *r);

#endif

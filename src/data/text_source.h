/* Internal: the text source's pieces (text_labels.c: targets from label columns; text_source.c: the source). */
#ifndef DT_DATA_TEXT_SOURCE_H
#define DT_DATA_TEXT_SOURCE_H

#include <stdint.h>

#include "data/csv.h"
#include "dtrain/data.h"

/* Labels above this many classes are taken for a mistake (a text column named as the label). */
#define DT_TEXT_MAX_CLASSES 100000
#define DT_TEXT_MAX_LABELS 1024

/* The target of every record of a CSV. Indices are CSV rows (1..n_rows; 0, the header, unused). */
typedef struct dt_text_labels {
  dt_task_kind task; /* DT_TASK_CLASSIFICATION (label_column) or DT_TASK_MULTILABEL (label_columns) */
  int k;             /* classes, or labels */
  int col[DT_TEXT_MAX_LABELS]; /* the label columns (one for classification) */
  int32_t *cls;      /* (n_rows + 1) classification: the class index */
  float *multi;      /* (n_rows + 1, k) multilabel: 0 or 1 */
  uint8_t *bad;      /* (n_rows + 1) 1: a row whose labels are malformed (left out with skip_bad_rows) */
  int64_t n_bad;
  char first_bad[256]; /* "file:line: what" of the first bad row */
  int64_t first_bad_line;
  char *classes;     /* classification: the class names in index order as one CSV record */
  char *columns;     /* the label column names as one CSV record */
} dt_text_labels;

/* Resolves the label columns of opt in c (a missing column is DT_USAGE naming the header's columns) and
 * reads every record's target. Classes: when opt->classes is NULL, integers 0..K-1 if the rows' labels
 * are non-negative integers (K = the largest + 1), else the sorted distinct names; a file mixing both
 * takes the kind most rows have and counts the others as bad rows. A bad row (a value that is not a
 * number, an empty label, a class outside opt->classes) is DT_CORRUPT "path:line: what" unless
 * opt->skip_bad_rows, which marks it in bad. *out is written only on success. */
dt_status dt_text_labels_read(const dt_csv *c, const char *path, const dt_text_options *opt, dt_text_labels *out);
void dt_text_labels_free(dt_text_labels *l);
/* The first column of c named name; else DT_USAGE "FLAG NAME: path has no column ...; its header has: a, b". */
dt_status dt_text_column(const dt_csv *c, const char *path, const char *name, const char *flag, int *col);

/* The fields of a one-record CSV text ("a,b,\"c,d\""): each NUL-terminated into a new array (free with
 * dt_text_list_free). Empty text is no fields. */
dt_status dt_text_list_split(const char *list, const char *what, char ***names, int *n);
void dt_text_list_free(char **names, int n);
/* names[0..n) as one CSV record (quoted where needed) into a new string. */
dt_status dt_text_list_join(char *const *names, const size_t *lens, int n, char **out);

#endif

/* The text source's targets: label columns read as multilabel 0/1 (value >= 0.5) or as classes (integers or names). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "data/text_source.h"

/* ---- comma lists as one CSV record ------------------------------------------------------------------ */

dt_status dt_text_list_split(const char *list, const char *what, char ***names, int *n) {
  *names = NULL;
  *n = 0;
  if (!list || !*list) return DT_OK;
  dt_csv c = {0};
  const dt_csv_options opt = {.delim = ','};
  dt_status st = dt_csv_parse(what, list, strlen(list), &opt, &c);
  if (st != DT_OK) return dt_error_prefix(DT_USAGE, "%s \"%.80s\"", what, list);
  char **out = NULL;
  st = dt_alloc_array((size_t)c.n_cols, sizeof *out, what, (void **)&out);
  for (int k = 0; k < c.n_cols && st == DT_OK; k++) {
    size_t len = 0;
    const char *s = dt_csv_field(&c, 0, k, &len);
    st = dt_alloc_array(len + 1, 1, what, (void **)&out[k]);
    if (st == DT_OK) memcpy(out[k], s, len);
  }
  if (st != DT_OK) {
    dt_text_list_free(out, c.n_cols);
  } else {
    *names = out;
    *n = c.n_cols;
  }
  dt_csv_free(&c);
  return st;
}

void dt_text_list_free(char **names, int n) {
  if (!names) return;
  for (int k = 0; k < n; k++) dt_free(names[k]);
  dt_free(names);
}

/* 1 if s[0..n) must be quoted in a CSV record. */
static int needs_quotes(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] == ',' || s[i] == '"' || s[i] == '\n' || s[i] == '\r') return 1;
  return n == 0;
}

dt_status dt_text_list_join(char *const *names, const size_t *lens, int n, char **out) {
  size_t total = 1;
  for (int k = 0; k < n; k++) total += 2 * lens[k] + 3;
  char *s = NULL;
  DT_CHECK(dt_alloc_array(total, 1, "name list", (void **)&s));
  size_t o = 0;
  for (int k = 0; k < n; k++) {
    if (k) s[o++] = ',';
    const int q = needs_quotes(names[k], lens[k]);
    if (q) s[o++] = '"';
    for (size_t i = 0; i < lens[k]; i++) {
      if (names[k][i] == '"') s[o++] = '"';
      s[o++] = names[k][i];
    }
    if (q) s[o++] = '"';
  }
  *out = s;
  return DT_OK;
}

/* ---- bad rows -------------------------------------------------------------------------------------- */

typedef struct reader {
  const dt_csv *c;
  const char *path;
  dt_text_labels *l;
} reader;

static void bad_row(reader *r, int64_t row, const char *fmt, ...) DT_PRINTF(3, 4);
static void bad_row(reader *r, int64_t row, const char *fmt, ...) {
  dt_text_labels *l = r->l;
  if (l->bad[row]) return;
  l->bad[row] = 1;
  if (l->n_bad++) return;
  l->first_bad_line = r->c->line[row];
  char what[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(l->first_bad, sizeof l->first_bad, "%s:%lld: %s", r->path, (long long)r->c->line[row], what);
}

/* Field col of row without surrounding spaces and tabs. */
static const char *trimmed(const dt_csv *c, int64_t row, int col, size_t *n) {
  const char *s = dt_csv_field(c, row, col, n);
  while (*n && (*s == ' ' || *s == '\t')) s++, (*n)--;
  while (*n && (s[*n - 1] == ' ' || s[*n - 1] == '\t')) (*n)--;
  return s;
}

/* Up to 40 bytes of s for a message. */
static int shown(size_t n) { return n > 40 ? 40 : (int)n; }

/* ---- multilabel ------------------------------------------------------------------------------------ */

/* A finite decimal number (what strtod reads, whole), or -1. */
static int parse_number(const char *s, size_t n, double *v) {
  char buf[64];
  if (n == 0 || n >= sizeof buf) return -1;
  memcpy(buf, s, n);
  buf[n] = '\0';
  char *end = NULL;
  *v = strtod(buf, &end);
  return end == buf + n && isfinite(*v) ? 0 : -1;
}

static void read_multilabel(reader *r, char **names) {
  const dt_csv *c = r->c;
  dt_text_labels *l = r->l;
  for (int64_t row = 1; row <= c->n_rows; row++)
    for (int j = 0; j < l->k; j++) {
      size_t n = 0;
      const char *s = trimmed(c, row, l->col[j], &n);
      double v = 0;
      if (parse_number(s, n, &v) != 0) {
        bad_row(r, row, "label %s is '%.*s', not a number (a label is 1 when its value is >= 0.5)", names[j],
                shown(n), s);
        break;
      }
      l->multi[row * l->k + j] = v >= 0.5 ? 1.0f : 0.0f; /* Jigsaw's toxicity >= 0.5; 0/1 stay 0/1 */
    }
}

/* ---- classes --------------------------------------------------------------------------------------- */

/* A class written as a non-negative integer below 10^9 (leading zeros allowed), or -1. */
static int64_t class_int(const char *s, size_t n) {
  if (n == 0 || n > 9) return -1;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

typedef struct name_ref {
  const char *s;
  size_t n;
  int64_t at; /* a row, or a class index */
} name_ref;

static int cmp_name(const void *a, const void *b) {
  const name_ref *x = a, *y = b;
  const int c = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
  return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* The classes as given (opt->classes): *fixed_int is K when they are "0".."K-1" in order, else 0. */
static void given_kind(char **given, int n_given, int64_t *fixed_int) {
  *fixed_int = n_given;
  for (int k = 0; k < n_given && *fixed_int; k++) {
    char want[16];
    snprintf(want, sizeof want, "%d", k);
    if (strcmp(given[k], want) != 0) *fixed_int = 0;
  }
}

/* Integer classes 0..K-1 (K = the largest + 1, or fixed_k when given). */
static dt_status read_int_classes(reader *r, const char *col, int64_t fixed_k) {
  const dt_csv *c = r->c;
  dt_text_labels *l = r->l;
  int64_t max = -1;
  for (int64_t row = 1; row <= c->n_rows; row++) {
    size_t n = 0;
    const char *s = trimmed(c, row, l->col[0], &n);
    const int64_t v = class_int(s, n);
    if (n == 0) bad_row(r, row, "class (column %s) is empty", col);
    else if (v < 0) bad_row(r, row, "class '%.*s' (column %s) is not an integer like most rows' classes", shown(n), s, col);
    else if (fixed_k && v >= fixed_k)
      bad_row(r, row, "class %lld (column %s) is outside training's %lld classes (0..%lld)", (long long)v,
              col, (long long)fixed_k, (long long)fixed_k - 1);
    else if (v >= DT_TEXT_MAX_CLASSES)
      return dt_error(DT_USAGE, "%s:%lld: class %lld (column %s): at most %d classes (is %s a label column?)", r->path,
                      (long long)c->line[row], (long long)v, col, DT_TEXT_MAX_CLASSES, col);
    else {
      l->cls[row] = (int32_t)v;
      max = v > max ? v : max;
    }
  }
  l->k = fixed_k ? (int)fixed_k : (int)(max + 1);
  char **names = NULL;
  size_t *lens = NULL;
  dt_status st = dt_alloc_array((size_t)l->k + 1, sizeof *names, "class names", (void **)&names);
  if (st == DT_OK) st = dt_alloc_array((size_t)l->k + 1, sizeof *lens, "class names", (void **)&lens);
  char *digits = NULL;
  if (st == DT_OK) st = dt_alloc_array((size_t)l->k + 1, 12, "class names", (void **)&digits);
  for (int k = 0; k < l->k && st == DT_OK; k++) {
    names[k] = digits + 12 * (size_t)k;
    lens[k] = (size_t)snprintf(names[k], 12, "%d", k);
  }
  if (st == DT_OK) st = dt_text_list_join(names, lens, l->k, &l->classes);
  dt_free(digits);
  dt_free(lens);
  dt_free(names);
  return st;
}

/* Named classes from the data: the sorted distinct names, name -> index. */
static dt_status named_from_data(reader *r, const char *col) {
  const dt_csv *c = r->c;
  dt_text_labels *l = r->l;
  name_ref *ref = NULL;
  char **names = NULL;
  size_t *lens = NULL;
  dt_status st;
  DT_CHECK(dt_alloc_array((size_t)c->n_rows + 1, sizeof *ref, "class names", (void **)&ref));
  int64_t m = 0, k = 0;
  for (int64_t row = 1; row <= c->n_rows; row++) {
    size_t n = 0;
    const char *s = trimmed(c, row, l->col[0], &n);
    if (n == 0) bad_row(r, row, "class (column %s) is empty", col);
    else ref[m++] = (name_ref){s, n, row};
  }
  qsort(ref, (size_t)m, sizeof *ref, cmp_name);
  for (int64_t i = 0; i < m; i++) /* ref[0..k) become the distinct names, .at their first row */
    if (!k || cmp_name(&ref[i], &ref[k - 1]) != 0) ref[k++] = ref[i];
  if (k > DT_TEXT_MAX_CLASSES) {
    st = dt_error(DT_USAGE, "%s: column %s has %lld distinct classes; at most %d (is it a label column?)", r->path,
                  col, (long long)k, DT_TEXT_MAX_CLASSES);
    goto done;
  }
  for (int64_t row = 1; row <= c->n_rows; row++) {
    name_ref key = {0};
    key.s = trimmed(c, row, l->col[0], &key.n);
    const name_ref *hit = key.n ? bsearch(&key, ref, (size_t)k, sizeof *ref, cmp_name) : NULL;
    if (hit) l->cls[row] = (int32_t)(hit - ref);
  }
  l->k = (int)k;
  DT_CHECK_GOTO(dt_alloc_array((size_t)k + 1, sizeof *names, "class names", (void **)&names), st, done);
  DT_CHECK_GOTO(dt_alloc_array((size_t)k + 1, sizeof *lens, "class names", (void **)&lens), st, done);
  for (int64_t i = 0; i < k; i++) names[i] = (char *)ref[i].s, lens[i] = ref[i].n;
  st = dt_text_list_join(names, lens, (int)k, &l->classes);
done:
  dt_free(lens);
  dt_free(names);
  dt_free(ref);
  return st;
}

/* Named classes as given (the weights' classes, in index order): a name not among them is a bad row. */
static dt_status named_given(reader *r, const char *col, char **given, int n_given, const char *list) {
  const dt_csv *c = r->c;
  dt_text_labels *l = r->l;
  name_ref *ref = NULL;
  size_t *lens = NULL;
  dt_status st;
  DT_CHECK(dt_alloc_array((size_t)n_given, sizeof *ref, "class names", (void **)&ref));
  DT_CHECK_GOTO(dt_alloc_array((size_t)n_given, sizeof *lens, "class names", (void **)&lens), st, done);
  for (int k = 0; k < n_given; k++) lens[k] = strlen(given[k]), ref[k] = (name_ref){given[k], lens[k], k};
  qsort(ref, (size_t)n_given, sizeof *ref, cmp_name);
  for (int64_t row = 1; row <= c->n_rows; row++) {
    name_ref key = {0};
    key.s = trimmed(c, row, l->col[0], &key.n);
    const name_ref *hit = bsearch(&key, ref, (size_t)n_given, sizeof *ref, cmp_name);
    if (key.n == 0) bad_row(r, row, "class (column %s) is empty", col);
    else if (!hit)
      bad_row(r, row, "class '%.*s' (column %s) is not one of training's %d classes (%.60s)", shown(key.n), key.s,
              col, n_given, list);
    else l->cls[row] = (int32_t)hit->at;
  }
  l->k = n_given;
  st = dt_text_list_join(given, lens, n_given, &l->classes);
done:
  dt_free(lens);
  dt_free(ref);
  return st;
}

static dt_status read_classes(reader *r, const char *col, const char *classes) {
  char **given = NULL;
  int n_given = 0;
  DT_CHECK(dt_text_list_split(classes, "classes", &given, &n_given));
  int64_t fixed_int = 0, ints = 0, named = 0;
  given_kind(given, n_given, &fixed_int);
  if (!n_given)
    for (int64_t row = 1; row <= r->c->n_rows; row++) {
      size_t n = 0;
      const char *s = trimmed(r->c, row, r->l->col[0], &n);
      if (n) *(class_int(s, n) >= 0 ? &ints : &named) += 1;
    }
  const int as_int = n_given ? fixed_int > 0 : ints > named;
  dt_status st = as_int ? read_int_classes(r, col, fixed_int)
                   : n_given ? named_given(r, col, given, n_given, classes) : named_from_data(r, col);
  dt_text_list_free(given, n_given);
  return st;
}

/* ---- the entry points ------------------------------------------------------------------------------ */

dt_status dt_text_column(const dt_csv *c, const char *path, const char *name, const char *flag, int *col) {
  *col = dt_csv_column(c, name);
  if (*col >= 0) return DT_OK;
  char have[512];
  return dt_error(DT_USAGE, "%s %s: %s has no column \"%s\"; its header has: %s", flag, name, path, name,
                  dt_csv_header_list(c, have, sizeof have));
}

void dt_text_labels_free(dt_text_labels *l) {
  if (!l) return;
  dt_free(l->columns);
  dt_free(l->classes);
  dt_free(l->bad);
  dt_free(l->multi);
  dt_free(l->cls);
  memset(l, 0, sizeof *l);
}

/* The label columns of opt: their names (owned by the caller) and indices in l->col. */
static dt_status label_columns(const dt_csv *c, const char *path, const dt_text_options *opt, dt_text_labels *l,
                               char ***names, int *n) {
  if (opt->label_columns && opt->label_column)
    return dt_error(DT_USAGE, "give --label-column (classes) or --label-columns (0/1 labels), not both");
  if (!opt->label_columns && !opt->label_column)
    return dt_error(DT_USAGE, "%s: name the targets: --label-column NAME (one column of classes) or --label-columns "
                    "a,b,c (labels: value >= 0.5 is 1)", path);
  const char *flag = opt->label_column ? "--label-column" : "--label-columns";
  if (opt->label_column) DT_CHECK(dt_text_list_split(opt->label_column, flag, names, n));
  else DT_CHECK(dt_text_list_split(opt->label_columns, flag, names, n));
  if (*n == 0) return dt_error(DT_USAGE, "%s: give at least one column name", flag);
  if (opt->label_column && *n != 1)
    return dt_error(DT_USAGE, "--label-column %s names %d columns: one column of classes (0/1 labels of several "
                    "columns: --label-columns)", opt->label_column, *n);
  if (*n > DT_TEXT_MAX_LABELS) return dt_error(DT_USAGE, "%s: at most %d labels", flag, DT_TEXT_MAX_LABELS);
  for (int j = 0; j < *n; j++) DT_CHECK(dt_text_column(c, path, (*names)[j], flag, &l->col[j]));
  size_t lens[DT_TEXT_MAX_LABELS];
  for (int j = 0; j < *n; j++) lens[j] = strlen((*names)[j]);
  return dt_text_list_join(*names, lens, *n, &l->columns);
}

dt_status dt_text_labels_read(const dt_csv *c, const char *path, const dt_text_options *opt, dt_text_labels *out) {
  dt_text_labels l = {0};
  reader r = {c, path, &l};
  char **names = NULL;
  int n = 0;
  dt_status st;
  const size_t rows = (size_t)c->n_rows + 1;
  DT_CHECK_GOTO(label_columns(c, path, opt, &l, &names, &n), st, done);
  DT_CHECK_GOTO(dt_alloc_array(rows, 1, "text labels", (void **)&l.bad), st, done);
  if (opt->label_column) {
    l.task = DT_TASK_CLASSIFICATION;
    DT_CHECK_GOTO(dt_alloc_array(rows, sizeof *l.cls, "text labels", (void **)&l.cls), st, done);
    DT_CHECK_GOTO(read_classes(&r, names[0], opt->classes), st, done);
  } else {
    l.task = DT_TASK_MULTILABEL;
    l.k = n;
    DT_CHECK_GOTO(dt_alloc_array(rows * (size_t)n, sizeof *l.multi, "text labels", (void **)&l.multi), st, done);
    read_multilabel(&r, names);
  }
  if (l.n_bad && !opt->skip_bad_rows) {
    st = dt_error(DT_CORRUPT, "%s (--skip-bad-rows leaves such rows out)", l.first_bad);
    goto done;
  }
  *out = l;
  memset(&l, 0, sizeof l);
  st = DT_OK;
done:
  dt_text_list_free(names, n);
  dt_text_labels_free(&l);
  return st;
}

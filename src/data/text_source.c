/* Data source "text": rows of a CSV/TSV file (a text, optionally a text pair, labels) tokenised once at open for BERT. */
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/impl.h"
#include "data/source.h"
#include "data/text_source.h"
#include "dtrain/checkpoint.h"
#include "text/wordpiece.h"

#define PREFIX "text:"
#define MAX_LEN_LIMIT 8192 /* positions per row: far past BERT's 512, small enough to catch a typo */

typedef struct text_source {
  int64_t n;
  int max_len;
  int32_t *ids;          /* (n, max_len) token ids, [PAD] after the tokens */
  int32_t *n_tok;        /* (n) positions holding tokens */
  int32_t *n_first;      /* (n) of those, the ones of the first text ([CLS] a [SEP]: token type 0) */
  dt_task_kind task;
  int k;                 /* classes, or labels */
  int32_t *cls;          /* (n) classification */
  float *multi;          /* (n, k) multilabel 0/1 */
  char *classes, *columns; /* CSV records of the class names and label columns, for meta */
  char text_col[256], pair_col[256], vocab[4096], max_len_s[16];
  dt_kv meta[8];
  int n_meta;
} text_source;

static const char *path_of(const char *spec) {
  return strncmp(spec, PREFIX, strlen(PREFIX)) == 0 ? spec + strlen(PREFIX) : spec;
}

static int has_suffix(const char *s, const char *suffix) {
  const size_t n = strlen(s), k = strlen(suffix);
  return n > k && strcasecmp(s + n - k, suffix) == 0;
}

/* "text:PATH" always (open says what is wrong with PATH); a bare path ending in .csv or .tsv (any case). */
static int claims(const char *spec) {
  return strncmp(spec, PREFIX, strlen(PREFIX)) == 0 || has_suffix(spec, ".csv") || has_suffix(spec, ".tsv");
}

static void free_text(void *state) {
  text_source *s = state;
  if (!s) return;
  dt_free(s->columns);
  dt_free(s->classes);
  dt_free(s->multi);
  dt_free(s->cls);
  dt_free(s->n_first);
  dt_free(s->n_tok);
  dt_free(s->ids);
  dt_free(s);
}

/* What the options ask for that cannot work, before the file is read. */
static dt_status check_options(const char *path, const dt_text_options *t, int *max_len) {
  if (!*path) return dt_error(DT_USAGE, "--data text:PATH: name a .csv or .tsv file after 'text:'");
  if (!t->vocab || !*t->vocab)
    return dt_error(DT_USAGE, "%s: text data needs a WordPiece vocabulary: --vocab FILE (bert-base-uncased's "
                    "vocab.txt, for instance)", path);
  *max_len = t->max_len ? t->max_len : DT_TEXT_MAX_LEN_DEFAULT;
  const int least = t->text_pair_column ? 4 : 3;
  if (*max_len < least || *max_len > MAX_LEN_LIMIT)
    return dt_error(DT_USAGE, "--max-len %d: between %d ([CLS] text [SEP]%s) and %d", *max_len, least,
                    t->text_pair_column ? " pair [SEP]" : "", MAX_LEN_LIMIT);
  if (strlen(t->vocab) >= 4096) return dt_error(DT_USAGE, "--vocab: the path is too long");
  return DT_OK;
}

/* The text and text-pair columns (-1: no pair). */
static dt_status text_columns(const dt_csv *c, const char *path, const dt_text_options *t, int *text, int *pair) {
  *pair = -1;
  if (!t->text_column && dt_csv_column(c, "text") < 0) {
    char have[512];
    return dt_error(DT_USAGE, "%s: name the column holding the text with --text-column NAME (there is no column "
                    "\"text\"); its header has: %s", path, dt_csv_header_list(c, have, sizeof have));
  }
  DT_CHECK(dt_text_column(c, path, t->text_column ? t->text_column : "text", "--text-column", text));
  if (t->text_pair_column) DT_CHECK(dt_text_column(c, path, t->text_pair_column, "--text-pair-column", pair));
  return DT_OK;
}

/* Row i of the source is CSV row rows[i]: its tokens, once, on the compute threads. */
static dt_status tokenize_all(text_source *s, const dt_csv *c, const int64_t *rows, int text, int pair,
                              const dt_wordpiece *wp, const char *path) {
  const int L = s->max_len;
  int64_t first_bad = -1;
#pragma omp parallel
  {
    int32_t types[MAX_LEN_LIMIT], mask[MAX_LEN_LIMIT];
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < s->n; i++) {
      size_t alen = 0, blen = 0;
      const char *a = dt_csv_field(c, rows[i], text, &alen), *b = pair >= 0 ? dt_csv_field(c, rows[i], pair, &blen) : NULL;
      int n = 0;
      if (dt_wordpiece_encode_bert(wp, a, alen, b, blen, L, s->ids + i * L, types, mask, &n) != DT_OK) {
#pragma omp critical(dt_text_first_bad)
        if (first_bad < 0 || i < first_bad) first_bad = i;
        continue;
      }
      int first = 0;
      while (first < n && types[first] == 0) first++;
      s->n_tok[i] = n, s->n_first[i] = first;
    }
  }
  if (first_bad < 0) return DT_OK;
  int32_t types[MAX_LEN_LIMIT], mask[MAX_LEN_LIMIT]; /* again on this thread, for its message */
  size_t alen = 0, blen = 0;
  const int64_t r = rows[first_bad];
  const char *a = dt_csv_field(c, r, text, &alen), *b = pair >= 0 ? dt_csv_field(c, r, pair, &blen) : NULL;
  int n = 0;
  const dt_status st = dt_wordpiece_encode_bert(wp, a, alen, b, blen, L, s->ids + first_bad * L, types, mask, &n);
  return dt_error_prefix(st != DT_OK ? st : DT_INTERNAL, "%s:%lld: tokenising the row", path, (long long)c->line[r]);
}

/* The rows kept (every one whose labels read; the malformed ones are already out of c) and their targets. */
static dt_status keep_rows(text_source *s, const dt_csv *c, dt_text_labels *l, int64_t **rows) {
  int64_t n = 0;
  for (int64_t r = 1; r <= c->n_rows; r++) n += !l->bad[r];
  DT_CHECK(dt_alloc_array((size_t)n + 1, sizeof **rows, "text rows", (void **)rows));
  if (l->task == DT_TASK_CLASSIFICATION)
    DT_CHECK(dt_alloc_array((size_t)n + 1, sizeof *s->cls, "text targets", (void **)&s->cls));
  else
    DT_CHECK(dt_alloc_array((size_t)(n + 1) * (size_t)l->k, sizeof *s->multi, "text targets", (void **)&s->multi));
  int64_t i = 0;
  for (int64_t r = 1; r <= c->n_rows; r++) {
    if (l->bad[r]) continue;
    (*rows)[i] = r;
    if (s->cls) s->cls[i] = l->cls[r];
    else memcpy(s->multi + i * l->k, l->multi + r * l->k, (size_t)l->k * sizeof *s->multi);
    i++;
  }
  s->n = n;
  s->task = l->task;
  s->k = l->k;
  s->classes = l->classes, l->classes = NULL;
  s->columns = l->columns, l->columns = NULL;
  return DT_OK;
}

/* What eval needs to read the file as training did: columns, classes, max_len, case, vocabulary. */
static void fill_meta(text_source *s, const dt_text_options *t) {
  snprintf(s->text_col, sizeof s->text_col, "%s", t->text_column ? t->text_column : "text");
  snprintf(s->pair_col, sizeof s->pair_col, "%s", t->text_pair_column ? t->text_pair_column : "");
  snprintf(s->vocab, sizeof s->vocab, "%s", t->vocab);
  snprintf(s->max_len_s, sizeof s->max_len_s, "%d", s->max_len);
  dt_kv *m = s->meta;
  int n = 0;
  m[n++] = (dt_kv){"text_column", s->text_col};
  if (s->pair_col[0]) m[n++] = (dt_kv){"text_pair_column", s->pair_col};
  if (s->task == DT_TASK_CLASSIFICATION) {
    m[n++] = (dt_kv){"label_column", s->columns};
    m[n++] = (dt_kv){"classes", s->classes};
  } else {
    m[n++] = (dt_kv){"label_columns", s->columns};
  }
  m[n++] = (dt_kv){"max_len", s->max_len_s};
  m[n++] = (dt_kv){"lower_case", t->keep_case ? "0" : "1"};
  m[n++] = (dt_kv){"vocab", s->vocab};
  s->n_meta = n;
}

static void describe(const text_source *s, const char *path, int64_t skipped, double ms, dt_data_info *info) {
  const int64_t x_shape[2] = {3, s->max_len}, t_shape[1] = {s->k};
  dt_data_add_field(info, "x", DT_I32, 2, x_shape);
  if (s->task == DT_TASK_CLASSIFICATION) dt_data_add_field(info, "target", DT_I32, 0, NULL);
  else dt_data_add_field(info, "target", DT_F32, 1, t_shape);
  info->task = s->task;
  info->outputs = s->k;
  info->has_test = 0;
  info->val_fraction = 0.1;
  info->skipped = skipped;
  int64_t full = 0;
  for (int64_t i = 0; i < s->n; i++) full += s->n_tok[i] == s->max_len;
  DT_LOG_INFO("data", "%s: %lld rows, %s with %d outputs, tokenised to %d positions in %.0f ms (%lld rows fill "
              "all positions: truncated or exactly full)", path, (long long)s->n, dt_task_kind_name(s->task), s->k,
              s->max_len, ms, (long long)full);
}

static dt_status open_text(const char *spec, dt_split split, const dt_data_options *opt, void **state,
                           dt_data_info *info, int64_t *n_out) {
  const char *path = path_of(spec);
  const dt_text_options *t = &opt->text;
  int max_len = 0;
  DT_CHECK(check_options(path, t, &max_len));
  if (split == DT_SPLIT_TEST)
    return dt_error(DT_NOT_FOUND, "%s: a text file has no test split of its own: hold out a random fraction "
                    "(--val-fraction, 0.1 by default) or give another file (--val-data)", path);
  const double t0 = dt_time_now();
  dt_csv c = {0};
  dt_text_labels l = {0};
  dt_wordpiece *wp = NULL;
  text_source *s = NULL;
  int64_t *rows = NULL;
  int text = -1, pair = -1;
  dt_status st;
  const dt_csv_options copt = {.skip_bad = t->skip_bad_rows};
  DT_CHECK_GOTO(dt_csv_read(path, &copt, &c), st, done);
  DT_CHECK_GOTO(text_columns(&c, path, t, &text, &pair), st, done);
  DT_CHECK_GOTO(dt_text_labels_read(&c, path, t, &l), st, done);
  DT_CHECK_GOTO(dt_alloc(sizeof *s, (void **)&s), st, done);
  s->max_len = max_len;
  DT_CHECK_GOTO(keep_rows(s, &c, &l, &rows), st, done);
  if (s->n == 0) {
    st = dt_error(DT_CORRUPT, "%s: no rows%s", path, c.skipped + l.n_bad ? " left after --skip-bad-rows" : " after the header");
    goto done;
  }
  DT_CHECK_GOTO(dt_wordpiece_load(t->vocab, !t->keep_case, &wp), st, done);
  DT_CHECK_GOTO(dt_alloc_array_huge((size_t)s->n * (size_t)max_len, sizeof *s->ids, "token ids", (void **)&s->ids), st,
                done);
  DT_CHECK_GOTO(dt_alloc_array((size_t)s->n, sizeof *s->n_tok, "token counts", (void **)&s->n_tok), st, done);
  DT_CHECK_GOTO(dt_alloc_array((size_t)s->n, sizeof *s->n_first, "token counts", (void **)&s->n_first), st, done);
  DT_CHECK_GOTO(tokenize_all(s, &c, rows, text, pair, wp, path), st, done);
  if (c.skipped || l.n_bad)
    DT_LOG_WARN("data", "%s: --skip-bad-rows left out %lld malformed rows of %lld; the first: %s", path,
                (long long)(c.skipped + l.n_bad), (long long)(c.n_rows + c.skipped),
                c.skipped && (!l.n_bad || c.first_bad_line < l.first_bad_line) ? c.first_bad : l.first_bad);
  fill_meta(s, t);
  info->n_index = 1;
  info->index_size[0] = dt_wordpiece_vocab_size(wp);
  describe(s, path, c.skipped + l.n_bad, (dt_time_now() - t0) * 1e3, info);
  *n_out = s->n;
  *state = s;
  s = NULL;
  st = DT_OK;
done:
  dt_free(rows);
  dt_wordpiece_free(wp);
  free_text(s);
  dt_text_labels_free(&l);
  dt_csv_free(&c);
  return st;
}

/* Samples as BERT reads them: x (n, 3, max_len) = token ids, token type ids, attention mask. */
static void fetch_text(const void *state, const int64_t *idx, int n, void *const *fields) {
  const text_source *s = state;
  const int L = s->max_len;
  int32_t *x = fields[0];
  for (int i = 0; i < n; i++) {
    const int64_t r = idx[i];
    int32_t *ids = x + (size_t)i * 3 * L, *types = ids + L, *mask = types + L;
    memcpy(ids, s->ids + r * L, (size_t)L * sizeof *ids);
    for (int j = 0; j < L; j++) {
      types[j] = j >= s->n_first[r] && j < s->n_tok[r];
      mask[j] = j < s->n_tok[r];
    }
    if (s->cls) ((int32_t *)fields[1])[i] = s->cls[r];
    else memcpy((float *)fields[1] + (size_t)i * s->k, s->multi + r * s->k, (size_t)s->k * sizeof(float));
  }
}

static int meta(const void *state, const dt_kv **kv) {
  const text_source *s = state;
  *kv = s->meta;
  return s->n_meta;
}

const dt_source_ops dt_source_text = {
    .name = "text",
    .doc = "a .csv or .tsv file (or text:PATH) of texts and labels, tokenised for BERT",
    .claims = claims,
    .open = open_text,
    .fetch = fetch_text,
    .free = free_text,
    .meta = meta,
};

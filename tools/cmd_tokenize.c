/* `dtrain tokenize`: each record of stdin through the WordPiece tokenizer, one line of ids per record. */
#include <stdlib.h>
#include <string.h>

#include "cmd_tokenize.h"
#include "core/impl.h"
#include "text/wordpiece.h"

/* One record's ids: all of them (or the first max_len), or the BERT input truncated to max_len. */
static dt_status ids_of(const tokenize_args *a, const dt_wordpiece *t, const char *rec, size_t len, int32_t *ids,
                        int32_t *scratch, size_t *n) {
  if (!a->special) {
    DT_CHECK(dt_wordpiece_encode(t, rec, len, ids, len + 1, n));
    if (a->max_len && *n > (size_t)a->max_len) *n = (size_t)a->max_len;
    return DT_OK;
  }
  /* the whole [CLS] a [SEP] fits in len + 2 positions: every token takes at least one byte */
  const int max_len = a->max_len ? a->max_len : (int)(len + 2 < 3 ? 3 : len + 2);
  int k = 0;
  DT_CHECK(dt_wordpiece_encode_bert(t, rec, len, NULL, 0, max_len, ids, scratch, scratch + max_len, &k));
  *n = (size_t)k;
  return DT_OK;
}

static int print_ids(FILE *out, const int32_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (fprintf(out, i ? " %d" : "%d", ids[i]) < 0) return -1;
  return fputc('\n', out) == EOF ? -1 : 0;
}

dt_status tokenize_stream(const tokenize_args *a, FILE *in, FILE *out) {
  dt_wordpiece *t = NULL;
  DT_CHECK(dt_wordpiece_load(a->vocab, a->lower, &t));
  char *rec = NULL;
  size_t cap = 0;
  int32_t *ids = NULL, *scratch = NULL;
  size_t ids_cap = 0;
  dt_status st = DT_OK;
  for (long long line = 1; st == DT_OK; line++) {
    ssize_t got = getdelim(&rec, &cap, a->nul ? '\0' : '\n', in);
    if (got < 0) break;
    size_t len = (size_t)got;
    if (len && rec[len - 1] == (a->nul ? '\0' : '\n')) len--;
    const size_t need = 2 * (len + 3) + (size_t)a->max_len;
    if (need > ids_cap) {
      dt_free(ids);
      dt_free(scratch);
      ids = scratch = NULL;
      st = dt_alloc_array(need, sizeof *ids, "token ids", (void **)&ids);
      if (st == DT_OK) st = dt_alloc_array(2 * need, sizeof *scratch, "token ids", (void **)&scratch);
      ids_cap = st == DT_OK ? need : 0;
    }
    size_t n = 0;
    if (st == DT_OK) st = ids_of(a, t, rec, len, ids, scratch, &n);
    if (st != DT_OK) st = dt_error_prefix(st, "record %lld of the input", line);
    else if (print_ids(out, ids, n) != 0) st = dt_error(DT_IO, "writing the ids of record %lld", line);
  }
  if (st == DT_OK && ferror(in)) st = dt_error(DT_IO, "reading the input");
  if (st == DT_OK && fflush(out) != 0) st = dt_error(DT_IO, "writing the ids");
  free(rec);
  dt_free(ids);
  dt_free(scratch);
  dt_wordpiece_free(t);
  return st;
}

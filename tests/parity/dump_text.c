/* Parity helper for test_text_csv.py: what dtrain reads from a CSV/TSV file, as JSON.
 *
 *   dump_text csv FILE [skip]          every record's fields and first line (the CSV reader)
 *   dump_text source FILE VOCAB TEXT_COLUMN (--label-column NAME | --label-columns A,B) [skip]
 *                                      the text source: rows, task, outputs, skipped, meta, every target, every
 *                                      row's ids under the attention mask, and whether the rest is [PAD] with
 *                                      token types 0 (one text per row)
 *
 * JSON on stdout; exit 1 with dtrain's error on stderr when the file is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text.h"
#include "data/csv.h"
#include "dtrain/dtrain.h"

static int die(void) {
  fprintf(stderr, "dump_text: %s\n", dt_last_error());
  return 1;
}

/* s[0..n) as a JSON string on stdout. */
static void put_string(const char *s, size_t n) {
  char *z = malloc(n + 1), *buf = malloc(6 * n + 3);
  memcpy(z, s, n);
  z[n] = '\0';
  size_t pos = 0;
  if (!dt_json_escape(buf, 6 * n + 3, &pos, z)) abort();
  fputs(buf, stdout);
  free(buf);
  free(z);
}

static int dump_csv(const char *path, int skip) {
  const dt_csv_options opt = {.skip_bad = skip};
  dt_csv c = {0};
  if (dt_csv_read(path, &opt, &c) != DT_OK) return die();
  printf("{\"skipped\":%lld,\"rows\":[", (long long)c.skipped);
  for (int64_t r = 0; r <= c.n_rows; r++) {
    printf("%s[", r ? ",\n" : "");
    for (int k = 0; k < c.n_cols; k++) {
      size_t n = 0;
      const char *s = dt_csv_field(&c, r, k, &n);
      if (k) putchar(',');
      put_string(s, n);
    }
    putchar(']');
  }
  printf("],\"lines\":[");
  for (int64_t r = 0; r <= c.n_rows; r++) printf("%s%lld", r ? "," : "", (long long)c.line[r]);
  printf("]}\n");
  dt_csv_free(&c);
  return 0;
}

static int dump_source(int argc, char **argv) {
  dt_data_options opt = {0};
  dt_text_options *t = &opt.text;
  t->vocab = argv[3];
  t->text_column = argv[4];
  if (strcmp(argv[5], "--label-column") == 0) t->label_column = argv[6];
  else t->label_columns = argv[6];
  t->skip_bad_rows = argc > 7 && strcmp(argv[7], "skip") == 0;
  dt_dataset *ds = NULL;
  if (dt_dataset_load_opts(argv[2], DT_SPLIT_TRAIN, &opt, &ds) != DT_OK) return die();
  const dt_data_info *in = dt_dataset_info(ds);
  const int64_t n = dt_dataset_size(ds), L = in->field[0].shape[1];
  const int per = in->task == DT_TASK_MULTILABEL ? in->outputs : 1;
  const dt_kv *kv = NULL;
  const int n_kv = dt_dataset_meta(ds, &kv);
  printf("{\"n\":%lld,\"task\":\"%s\",\"outputs\":%d,\"skipped\":%lld,\"vocab_size\":%lld,\"meta\":{", (long long)n,
         dt_task_kind_name(in->task), in->outputs, (long long)in->skipped, (long long)in->index_size[0]);
  for (int i = 0; i < n_kv; i++) {
    printf("%s\"%s\":", i ? "," : "", kv[i].key);
    put_string(kv[i].value, strlen(kv[i].value));
  }
  printf("},\"targets\":[");
  int32_t *x = malloc(sizeof *x * 3 * (size_t)L);
  float y[1024]; /* up to 1024 labels (DT_TEXT_MAX_LABELS) */
  int32_t cls = 0;
  for (int64_t i = 0; i < n; i++) {
    void *fields[2] = {x, in->task == DT_TASK_CLASSIFICATION ? (void *)&cls : (void *)y};
    dt_dataset_fetch(ds, &i, 1, fields);
    printf("%s", i ? "," : "");
    if (in->task == DT_TASK_CLASSIFICATION) {
      printf("%d", cls);
      continue;
    }
    putchar('[');
    for (int j = 0; j < per; j++) printf("%s%g", j ? "," : "", (double)y[j]);
    putchar(']');
  }
  printf("],\"ids\":[");
  int layout_ok = 1; /* one text: types all 0; mask 1..1 0..0; [PAD] (0) where the mask is 0 */
  for (int64_t i = 0; i < n; i++) {
    void *fields[2] = {x, in->task == DT_TASK_CLASSIFICATION ? (void *)&cls : (void *)y};
    dt_dataset_fetch(ds, &i, 1, fields);
    const int32_t *ids = x, *types = x + L, *mask = x + 2 * L;
    printf("%s[", i ? "," : "");
    for (int64_t j = 0; j < L; j++) {
      if (mask[j]) printf("%s%d", j ? "," : "", ids[j]);
      layout_ok &= types[j] == 0 && (mask[j] == 1 || mask[j] == 0) && (j == 0 || mask[j] <= mask[j - 1]) &&
                   (mask[j] || ids[j] == 0);
    }
    putchar(']');
  }
  printf("],\"layout_ok\":%s}\n", layout_ok ? "true" : "false");
  free(x);
  dt_dataset_free(ds);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "csv") == 0) return dump_csv(argv[2], argc > 3 && strcmp(argv[3], "skip") == 0);
  if (argc >= 7 && strcmp(argv[1], "source") == 0) return dump_source(argc, argv);
  fprintf(stderr, "usage: dump_text csv FILE [skip] | dump_text source FILE VOCAB TEXT_COLUMN "
                  "(--label-column NAME | --label-columns A,B) [skip]\n");
  return 2;
}

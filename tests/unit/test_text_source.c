/* Tests of the text source: token ids, types and masks of a tiny vocabulary, targets (labels >= 0.5, integer and
 * named classes), meta, bad rows with and without skipping, usage errors, and the real toxicity files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test_files.h"

/* ids: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, hello 5, world 6, good 7, bad 8, "," 9, "." 10, "!" 11,
 * the 12, movie 13, is 14 */
static const char *const vocab_text = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\ngood\nbad\n,\n.\n!\nthe\nmovie\nis\n";
enum { PAD = 0, UNK = 1, CLS = 2, SEP = 3, HELLO = 5, WORLD = 6, GOOD = 7, BAD = 8, DOT = 10, BANG = 11, THE = 12,
       MOVIE = 13, IS = 14 };

static const char *write_file(const char *name, const char *text) {
  const char *path = tmp_path(name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  return path;
}

static const char *vocab(void) { return write_file("vocab.txt", vocab_text); }

static dt_status open_text(const char *path, const dt_text_options *t, dt_dataset **ds) {
  const dt_data_options opt = {.text = *t};
  return dt_dataset_load_opts(path, DT_SPLIT_TRAIN, &opt, ds);
}

/* Sample i: x (3, L) into x, the target into t (room for k values). */
static void fetch1(const dt_dataset *ds, int64_t i, int32_t *x, void *t) {
  void *fields[2] = {x, t};
  dt_dataset_fetch(ds, &i, 1, fields);
}

/* 1 if v[0..n) equals want[0..n) */
static int ints_are(const int32_t *v, const int32_t *want, int n) {
  for (int i = 0; i < n; i++)
    if (v[i] != want[i]) return 0;
  return 1;
}

static const char *meta_of(const dt_dataset *ds, const char *key) {
  const dt_kv *kv = NULL;
  const int n = dt_dataset_meta(ds, &kv);
  for (int i = 0; i < n; i++)
    if (strcmp(kv[i].key, key) == 0) return kv[i].value;
  return NULL;
}

TEST(multilabel_ids_types_mask_and_targets) {
  const char *csv = write_file("ml.csv", "id,comment_text,toxic,insult\n"
                                         "1,Hello world!,0.7,0\n"
                                         "2,\"the movie\nis GOOD.\",0.2,1\n"
                                         "3,\"bad, \"\"bad\"\" movie\",0.5,1.0\n");
  const dt_text_options t = {.vocab = vocab(), .text_column = "comment_text", .label_columns = "toxic,insult",
                             .max_len = 8};
  dt_dataset *ds = NULL;
  ASSERT_OK(open_text(csv, &t, &ds));
  const dt_data_info *in = dt_dataset_info(ds);
  ASSERT_STR_EQ(in->name, "text");
  ASSERT_EQ(dt_dataset_size(ds), 3);
  ASSERT_EQ(in->task, DT_TASK_MULTILABEL);
  ASSERT_EQ(in->outputs, 2);
  ASSERT_EQ(in->field[0].dtype, DT_I32);
  ASSERT_EQ(in->field[0].ndim, 2);
  ASSERT_EQ(in->field[0].shape[0], 3);
  ASSERT_EQ(in->field[0].shape[1], 8);
  ASSERT_EQ(in->field[1].dtype, DT_F32);
  ASSERT_EQ(in->field[1].shape[0], 2);
  ASSERT_EQ(in->n_index, 1);
  ASSERT_EQ(in->index_size[0], 15);
  ASSERT_EQ(in->has_test, 0);
  ASSERT_NEAR(in->val_fraction, 0.1, 0);
  int32_t x[24];
  float y[2];
  fetch1(ds, 0, x, y);
  const int32_t ids0[8] = {CLS, HELLO, WORLD, BANG, SEP, PAD, PAD, PAD}, zero[8] = {0};
  const int32_t mask0[8] = {1, 1, 1, 1, 1, 0, 0, 0};
  ASSERT(ints_are(x, ids0, 8));
  ASSERT(ints_are(x + 8, zero, 8));
  ASSERT(ints_are(x + 16, mask0, 8));
  ASSERT(y[0] == 1.0f && y[1] == 0.0f);
  fetch1(ds, 1, x, y);
  const int32_t ids1[8] = {CLS, THE, MOVIE, IS, GOOD, DOT, SEP, PAD}; /* lower-cased, the line break a space */
  ASSERT(ints_are(x, ids1, 8));
  ASSERT(y[0] == 0.0f && y[1] == 1.0f);
  fetch1(ds, 2, x, y);
  const int32_t ids2[8] = {CLS, BAD, 9, UNK, BAD, UNK, MOVIE, SEP}; /* '"' is not in the vocabulary */
  ASSERT(ints_are(x, ids2, 8));
  ASSERT(y[0] == 1.0f && y[1] == 1.0f); /* 0.5 is toxic */
  ASSERT_STR_EQ(meta_of(ds, "text_column"), "comment_text");
  ASSERT_STR_EQ(meta_of(ds, "label_columns"), "toxic,insult");
  ASSERT_STR_EQ(meta_of(ds, "max_len"), "8");
  ASSERT_STR_EQ(meta_of(ds, "lower_case"), "1");
  ASSERT(meta_of(ds, "classes") == NULL);
  dt_dataset_free(ds);
}

TEST(truncation_pairs_and_case) {
  const char *csv = write_file("pair.tsv", "a\tb\tlabel\nthe movie is good\tHello\t1\nhello\tworld\t0\n");
  dt_text_options t = {.vocab = vocab(), .text_column = "a", .text_pair_column = "b", .label_columns = "label",
                       .max_len = 7};
  dt_dataset *ds = NULL;
  ASSERT_OK(open_text(csv, &t, &ds));
  ASSERT_EQ(dt_dataset_info(ds)->outputs, 1); /* one label column: binary */
  int32_t x[21];
  float y[1];
  fetch1(ds, 0, x, y); /* 4 + 1 tokens in 7 - 3 positions: the longer text loses its last */
  const int32_t ids0[7] = {CLS, THE, MOVIE, IS, SEP, HELLO, SEP}, types0[7] = {0, 0, 0, 0, 0, 1, 1};
  ASSERT(ints_are(x, ids0, 7));
  ASSERT(ints_are(x + 7, types0, 7));
  ASSERT(y[0] == 1.0f);
  fetch1(ds, 1, x, y);
  const int32_t ids1[7] = {CLS, HELLO, SEP, WORLD, SEP, PAD, PAD}, types1[7] = {0, 0, 0, 1, 1, 0, 0};
  const int32_t mask1[7] = {1, 1, 1, 1, 1, 0, 0};
  ASSERT(ints_are(x, ids1, 7));
  ASSERT(ints_are(x + 7, types1, 7));
  ASSERT(ints_are(x + 14, mask1, 7));
  ASSERT(y[0] == 0.0f);
  ASSERT_STR_EQ(meta_of(ds, "text_pair_column"), "b");
  dt_dataset_free(ds);
  /* kept case: "Hello" is not in the vocabulary */
  t.keep_case = 1;
  ASSERT_OK(open_text(csv, &t, &ds));
  fetch1(ds, 0, x, y);
  ASSERT_EQ(x[5], UNK);
  ASSERT_STR_EQ(meta_of(ds, "lower_case"), "0");
  dt_dataset_free(ds);
  /* a single text, max_len 3: [CLS] [SEP] and one token */
  t = (dt_text_options){.vocab = vocab(), .text_column = "a", .label_columns = "label", .max_len = 3};
  ASSERT_OK(open_text(csv, &t, &ds));
  fetch1(ds, 0, x, y);
  const int32_t ids3[3] = {CLS, THE, SEP};
  ASSERT(ints_are(x, ids3, 3));
  dt_dataset_free(ds);
}

TEST(integer_and_named_classes) {
  const char *csv = write_file("cls.csv", ",tweet,class,name\n0,hello,2,pos\n1,world,0,neg\n2,good,1, neg \n");
  dt_text_options t = {.vocab = vocab(), .text_column = "tweet", .label_column = "class"};
  dt_dataset *ds = NULL;
  ASSERT_OK(open_text(csv, &t, &ds));
  const dt_data_info *in = dt_dataset_info(ds);
  ASSERT_EQ(in->task, DT_TASK_CLASSIFICATION);
  ASSERT_EQ(in->outputs, 3);
  ASSERT_EQ(in->field[1].dtype, DT_I32);
  ASSERT_EQ(in->field[1].ndim, 0);
  ASSERT_EQ(in->field[0].shape[1], 128); /* the default max_len */
  int32_t x[3 * 128], y = -1;
  fetch1(ds, 0, x, &y);
  ASSERT_EQ(y, 2);
  fetch1(ds, 1, x, &y);
  ASSERT_EQ(y, 0);
  ASSERT_STR_EQ(meta_of(ds, "label_column"), "class");
  ASSERT_STR_EQ(meta_of(ds, "classes"), "0,1,2");
  dt_dataset_free(ds);
  /* names: sorted, trimmed */
  t.label_column = "name";
  ASSERT_OK(open_text(csv, &t, &ds));
  ASSERT_EQ(dt_dataset_info(ds)->outputs, 2);
  fetch1(ds, 0, x, &y);
  ASSERT_EQ(y, 1);
  fetch1(ds, 2, x, &y);
  ASSERT_EQ(y, 0);
  ASSERT_STR_EQ(meta_of(ds, "classes"), "neg,pos");
  dt_dataset_free(ds);
  /* given classes (as eval passes the weights'): their order, a class the weights lack is a bad row */
  t.classes = "pos,neg,\"x,y\"";
  ASSERT_OK(open_text(csv, &t, &ds));
  ASSERT_EQ(dt_dataset_info(ds)->outputs, 3);
  fetch1(ds, 0, x, &y);
  ASSERT_EQ(y, 0);
  fetch1(ds, 1, x, &y);
  ASSERT_EQ(y, 1);
  ASSERT_STR_EQ(meta_of(ds, "classes"), "pos,neg,\"x,y\"");
  dt_dataset_free(ds);
  t.classes = "pos";
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_CORRUPT);
  ASSERT_MSG(strstr(dt_last_error(), "cls.csv:3: class 'neg' (column name) is not one of training's 1 classes (pos)") != NULL,
             dt_last_error());
  /* given integer classes fix K: a split without the last class keeps the weights' width */
  t.label_column = "class";
  t.classes = "0,1,2,3";
  ASSERT_OK(open_text(csv, &t, &ds));
  ASSERT_EQ(dt_dataset_info(ds)->outputs, 4);
  dt_dataset_free(ds);
  t.classes = "0,1";
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_CORRUPT);
  ASSERT_MSG(strstr(dt_last_error(), "cls.csv:2: class 2 (column class) is outside training's 2 classes (0..1)") != NULL,
             dt_last_error());
}

TEST(bad_rows_fail_or_are_skipped) {
  const char *csv = write_file("bad.csv", "text,toxic,class\n"
                                          "hello,0.9,1\n"
                                          "world,n/a,0\n"
                                          "\"good\nmovie\",0.1\n"
                                          "bad,1,x\n"
                                          "the movie,0,0\n");
  dt_text_options t = {.vocab = vocab(), .label_columns = "toxic"};
  dt_dataset *ds = NULL;
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_CORRUPT); /* the field count, found first, while reading */
  ASSERT_MSG(strstr(dt_last_error(), "bad.csv:4: 2 fields; the header has 3") != NULL, dt_last_error());
  t.skip_bad_rows = 1;
  ASSERT_OK(open_text(csv, &t, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 3); /* hello, bad, the movie */
  ASSERT_EQ(dt_dataset_info(ds)->skipped, 2);
  int32_t x[3 * 128];
  float y;
  fetch1(ds, 1, x, &y);
  ASSERT_EQ(x[1], BAD);
  ASSERT(y == 1.0f);
  dt_dataset_free(ds);
  /* a label that is not a number, with the field count fixed */
  const char *csv2 = write_file("bad2.csv", "text,toxic\nhello,0.9\nworld,n/a\ngood,nan\n");
  t.skip_bad_rows = 0;
  ASSERT_STATUS(open_text(csv2, &t, &ds), DT_CORRUPT);
  ASSERT_MSG(strstr(dt_last_error(), "bad2.csv:3: label toxic is 'n/a', not a number") != NULL, dt_last_error());
  ASSERT_MSG(strstr(dt_last_error(), "--skip-bad-rows") != NULL, dt_last_error());
  t.skip_bad_rows = 1;
  ASSERT_OK(open_text(csv2, &t, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 1);
  ASSERT_EQ(dt_dataset_info(ds)->skipped, 2);
  dt_dataset_free(ds);
  /* integer classes: the rare non-integer is the bad row */
  t = (dt_text_options){.vocab = vocab(), .label_column = "class"};
  const char *csv3 = write_file("bad3.csv", "text,class\nhello,1\nworld,0\ngood,x1\nbad,2\n");
  ASSERT_STATUS(open_text(csv3, &t, &ds), DT_CORRUPT);
  ASSERT_MSG(strstr(dt_last_error(), "bad3.csv:4: class 'x1' (column class) is not an integer") != NULL,
             dt_last_error());
  /* nothing left */
  t = (dt_text_options){.vocab = vocab(), .label_columns = "toxic", .skip_bad_rows = 1};
  const char *csv4 = write_file("bad4.csv", "text,toxic\nhello,x\n");
  ASSERT_STATUS(open_text(csv4, &t, &ds), DT_CORRUPT);
  ASSERT_MSG(strstr(dt_last_error(), "no rows left") != NULL, dt_last_error());
}

TEST(usage_errors_name_what_to_give) {
  const char *csv = write_file("u.csv", "comment,toxic,insult\nhello,0,1\n");
  dt_text_options t = {.vocab = vocab(), .text_column = "comment", .label_columns = "toxic,insolt"};
  dt_dataset *ds = NULL;
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_USAGE);
  ASSERT_MSG(strstr(dt_last_error(), "has no column \"insolt\"; its header has: comment, toxic, insult") != NULL,
             dt_last_error());
  t.label_columns = "toxic";
  t.label_column = "insult";
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_USAGE);
  ASSERT_MSG(strstr(dt_last_error(), "not both") != NULL, dt_last_error());
  t.label_columns = t.label_column = NULL;
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_USAGE);
  ASSERT_MSG(strstr(dt_last_error(), "--label-column NAME") != NULL, dt_last_error());
  t.label_column = "toxic,insult";
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_USAGE);
  t = (dt_text_options){.vocab = vocab(), .label_columns = "toxic"};
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_USAGE); /* no "text" column and no --text-column */
  ASSERT_MSG(strstr(dt_last_error(), "--text-column NAME") != NULL, dt_last_error());
  ASSERT_MSG(strstr(dt_last_error(), "comment, toxic, insult") != NULL, dt_last_error());
  t = (dt_text_options){.text_column = "comment", .label_columns = "toxic"};
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_USAGE);
  ASSERT_MSG(strstr(dt_last_error(), "--vocab FILE") != NULL, dt_last_error());
  t.vocab = vocab();
  t.max_len = 2;
  ASSERT_STATUS(open_text(csv, &t, &ds), DT_USAGE);
  ASSERT_MSG(strstr(dt_last_error(), "--max-len 2") != NULL, dt_last_error());
  t.max_len = 0;
  const dt_data_options opt = {.text = t};
  ASSERT_STATUS(dt_dataset_load_opts(csv, DT_SPLIT_TEST, &opt, &ds), DT_NOT_FOUND);
  ASSERT_MSG(strstr(dt_last_error(), "--val-fraction") != NULL, dt_last_error());
  ASSERT_STATUS(open_text(tmp_path("absent.csv"), &t, &ds), DT_NOT_FOUND);
  ASSERT_MSG(strstr(dt_last_error(), "absent.csv") != NULL, dt_last_error());
  ASSERT_STATUS(open_text("text:", &t, &ds), DT_USAGE);
  /* text:PATH takes any name */
  const char *txt = write_file("rows.txt", "comment,toxic\nhello,1\n");
  char spec[300];
  snprintf(spec, sizeof spec, "text:%s", txt);
  ASSERT_OK(open_text(spec, &t, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 1);
  dt_dataset_free(ds);
}

/* ---- the real files in ../shared/data/toxicity ------------------------------------------------------ */

static int shared_path(const char *rel, char *out, size_t len) {
  const char *src = getenv("DT_SOURCE_DIR");
  snprintf(out, len, "%s/../shared/data/%s", src ? src : ".", rel);
  return access(out, R_OK) == 0;
}

/* Rows, the sum of target values (labels or class indices) and the time to open. */
static dt_status open_real(const char *rel, const dt_text_options *t, int64_t *n, double *sum, double *ms) {
  char path[1024];
  shared_path(rel, path, sizeof path);
  dt_dataset *ds = NULL;
  const double t0 = dt_time_now();
  const dt_status st = open_text(path, t, &ds);
  if (st != DT_OK) return st;
  *ms = (dt_time_now() - t0) * 1e3;
  *n = dt_dataset_size(ds);
  const dt_data_info *in = dt_dataset_info(ds);
  const int k = in->task == DT_TASK_MULTILABEL ? in->outputs : 1;
  int32_t *x = malloc(3 * sizeof *x * (size_t)in->field[0].shape[1]);
  float *y = malloc(sizeof *y * (size_t)k);
  *sum = 0;
  for (int64_t i = 0; i < *n; i++) {
    fetch1(ds, i, x, y);
    for (int j = 0; j < k; j++) *sum += in->task == DT_TASK_MULTILABEL ? y[j] : *(int32_t *)y;
  }
  free(x);
  free(y);
  dt_dataset_free(ds);
  return DT_OK;
}

TEST(real_toxicity_files) {
  char vocab_path[1024], probe[1024];
  if (!shared_path("bert/bert-base-uncased-vocab.txt", vocab_path, sizeof vocab_path) ||
      !shared_path("toxicity/davidson-hate-speech.csv", probe, sizeof probe)) {
    printf("  (../shared/data/bert or ../shared/data/toxicity missing: skipped)\n");
    return;
  }
  int64_t n = 0;
  double sum = 0, ms = 0;
  /* counts and label sums as Python's csv module reads them (tests/parity/test_text_csv.py checks more) */
  const dt_text_options dav = {.vocab = vocab_path, .text_column = "tweet", .label_column = "class"};
  ASSERT_OK(open_real("toxicity/davidson-hate-speech.csv", &dav, &n, &sum, &ms));
  printf("  davidson-hate-speech.csv: %lld rows opened and tokenised in %.0f ms\n", (long long)n, ms);
  ASSERT_EQ(n, 24783);
  ASSERT_EQ((int64_t)sum, 1 * 19190 + 2 * 4163);
  const dt_text_options jig = {.vocab = vocab_path, .text_column = "comment_text",
                               .label_columns = "toxic,severe_toxic,obscene,threat,insult,identity_hate"};
  ASSERT_OK(open_real("toxicity/jigsaw-toxic-sample.csv", &jig, &n, &sum, &ms));
  printf("  jigsaw-toxic-sample.csv: %lld rows in %.0f ms\n", (long long)n, ms);
  ASSERT_EQ(n, 3000);
  ASSERT_EQ((int64_t)sum, 722);
  ASSERT_OK(open_real("toxicity/jigsaw-toxic-sample2.csv", &jig, &n, &sum, &ms));
  printf("  jigsaw-toxic-sample2.csv: %lld rows in %.0f ms\n", (long long)n, ms);
  ASSERT_EQ(n, 2000);
  ASSERT_EQ((int64_t)sum, 1151);
}

int main(int argc, char **argv) {
  static const dt_test_case cases[] = {
      TEST_ENTRY(multilabel_ids_types_mask_and_targets), TEST_ENTRY(truncation_pairs_and_case),
      TEST_ENTRY(integer_and_named_classes),            TEST_ENTRY(bad_rows_fail_or_are_skipped),
      TEST_ENTRY(usage_errors_name_what_to_give),        TEST_ENTRY(real_toxicity_files),
  };
  const int rc = dt_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
  remove_tmpdir();
  return rc;
}

/* Tests of the MovieLens source: dense ids, fields, leave-last-out, the sampled ranking, .csv/.dat files, strict errors, the real ml-latest-small. */
#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "test_files.h"

/* ---- helpers --------------------------------------------------------------- */

/* A fresh directory tmpdir/name (removed at exit with what it holds). */
static const char *make_dir(const char *name) {
  static char dirs[8][256];
  static int k;
  char *d = dirs[k++ % 8];
  snprintf(d, 256, "%s", tmp_path(name));
  mkdir(d, 0777);
  return d;
}

/* Writes len bytes (strlen(text) when len < 0) to dir/name. */
static void write_file(const char *dir, const char *name, const char *text, long len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fwrite(text, 1, len < 0 ? strlen(text) : (size_t)len, f);
  fclose(f);
}

/* Removes every directory made by make_dir with its files, then tmpdir. */
static void remove_all(void) {
  DIR *d = tmpdir[0] ? opendir(tmpdir) : NULL;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char sub[512];
    snprintf(sub, sizeof sub, "%s/%s", tmpdir, e->d_name);
    DIR *s = opendir(sub);
    struct dirent *f;
    while (s && (f = readdir(s)) != NULL) {
      if (f->d_name[0] == '.') continue;
      char p[1024];
      snprintf(p, sizeof p, "%s/%s", sub, f->d_name);
      unlink(p);
    }
    if (s) closedir(s);
  }
  if (d) closedir(d);
  remove_tmpdir();
}

/* A growing text (ratings built in code). */
typedef struct text {
  char *s;
  size_t len, cap;
} text;

static void add(text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char line[512];
  const int k = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (t->len + (size_t)k + 1 > t->cap) {
    t->cap = (t->len + (size_t)k + 1) * 2;
    t->s = realloc(t->s, t->cap);
    if (!t->s) exit(1);
  }
  memcpy(t->s + t->len, line, (size_t)k + 1);
  t->len += (size_t)k;
}

static dt_status load(const char *spec, dt_split split, dt_holdout holdout, uint64_t seed, dt_dataset **ds) {
  const dt_data_options opt = {.holdout = holdout, .seed = seed};
  return dt_dataset_load_opts(spec, split, &opt, ds);
}

/* Every sample of ds: x (n, 2) and target (n); malloc'd. */
static void fetch_all(const dt_dataset *ds, int32_t **x, float **t) {
  const int64_t n = dt_dataset_size(ds);
  int64_t *idx = malloc((size_t)(n + 1) * sizeof *idx);
  *x = malloc((size_t)(n + 1) * 2 * sizeof **x);
  *t = malloc((size_t)(n + 1) * sizeof **t);
  for (int64_t i = 0; i < n; i++) idx[i] = i;
  void *fields[2] = {*x, *t};
  dt_dataset_fetch(ds, idx, (int)n, fields);
  free(idx);
}

/* ---- ids, fields, info ------------------------------------------------------ */

TEST(dense_ids_fields_and_info) {
  const char *dir = make_dir("dense");
  /* users 30, 10, 20; movies 500, 7, 42 and a sparse 2000000000 (the sorted lookup rather than a table) */
  write_file(dir, "ratings.csv",
             "userId,movieId,rating,timestamp\n"
             "30,500,4.0,100\n"
             "10,7,0.5,200\n"
             "20,2000000000,5,300\n"
             "10,42,3.5,400\n"
             "30,7,2.25,500\n", -1);
  dt_dataset *ds = NULL;
  ASSERT_OK(load(dir, DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds));
  const dt_data_info *in = dt_dataset_info(ds);
  ASSERT_STR_EQ(in->name, "movielens");
  ASSERT_EQ(in->n_fields, 2);
  ASSERT_STR_EQ(in->field[0].name, "x");
  ASSERT_EQ(in->field[0].dtype, DT_I32);
  ASSERT_EQ(in->field[0].ndim, 1);
  ASSERT_EQ(in->field[0].shape[0], 2);
  ASSERT_STR_EQ(in->field[1].name, "target");
  ASSERT_EQ(in->field[1].dtype, DT_F32);
  ASSERT_EQ(in->field[1].ndim, 1);
  ASSERT_EQ(in->field[1].shape[0], 1);
  ASSERT_EQ(in->input, 0);
  ASSERT_EQ(in->target, 1);
  ASSERT_EQ(in->task, DT_TASK_REGRESSION);
  ASSERT_EQ(in->outputs, 1);
  ASSERT_EQ(in->n_index, 2);
  ASSERT_EQ(in->index_size[0], 3);
  ASSERT_EQ(in->index_size[1], 4);
  ASSERT_EQ(in->has_test, 0);
  ASSERT_NEAR(in->val_fraction, 0.1, 0);
  ASSERT_EQ(dt_dataset_size(ds), 5);

  const int64_t *ids;
  int64_t n;
  ASSERT_OK(dt_dataset_index_ids(ds, 0, &ids, &n));
  ASSERT_EQ(n, 3);
  ASSERT_EQ(ids[0], 10);
  ASSERT_EQ(ids[1], 20);
  ASSERT_EQ(ids[2], 30);
  ASSERT_OK(dt_dataset_index_ids(ds, 1, &ids, &n));
  ASSERT_EQ(n, 4);
  ASSERT_EQ(ids[0], 7);
  ASSERT_EQ(ids[1], 42);
  ASSERT_EQ(ids[2], 500);
  ASSERT_EQ(ids[3], 2000000000);
  ASSERT_STATUS(dt_dataset_index_ids(ds, 2, &ids, &n), DT_INVALID_ARGUMENT);

  /* file order, dense indices, ratings as written */
  int32_t *x;
  float *t;
  fetch_all(ds, &x, &t);
  const int32_t want_x[10] = {2, 2, 0, 0, 1, 3, 0, 1, 2, 0};
  const float want_t[5] = {4.0f, 0.5f, 5.0f, 3.5f, 2.25f};
  int same = 1;
  for (int i = 0; i < 10; i++) same &= x[i] == want_x[i];
  for (int i = 0; i < 5; i++) same &= t[i] == want_t[i];
  free(x), free(t);
  ASSERT(same);

  const dt_kv *kv;
  ASSERT_EQ(dt_dataset_meta(ds, &kv), 2);
  ASSERT_STR_EQ(kv[0].key, "user_ids");
  ASSERT_STR_EQ(kv[0].value, "10,20,30");
  ASSERT_STR_EQ(kv[1].key, "item_ids");
  ASSERT_STR_EQ(kv[1].value, "7,42,500,2000000000");
  ASSERT(dt_dataset_index_text(ds, 1, 0, 0) == NULL); /* no movies file */
  dt_ranking rk;
  ASSERT_STATUS(dt_dataset_ranking(ds, &rk), DT_NOT_FOUND);
  dt_dataset_free(ds);

  /* no test split of its own; the prefix form reads the same directory */
  ds = NULL;
  ASSERT_STATUS(load(dir, DT_SPLIT_TEST, DT_HOLDOUT_DEFAULT, 0, &ds), DT_NOT_FOUND);
  char spec[300];
  snprintf(spec, sizeof spec, "movielens:%s", dir);
  ASSERT_OK(load(spec, DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 5);
  dt_dataset_free(ds);
}

TEST(missing_files_and_bad_specs) {
  const char *empty = make_dir("nothing");
  char spec[300];
  dt_dataset *ds = NULL;
  snprintf(spec, sizeof spec, "movielens:%s", empty);
  ASSERT_STATUS(load(spec, DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds), DT_NOT_FOUND);
  ASSERT_MSG(strstr(dt_last_error(), "ratings.csv"), dt_last_error());
  ASSERT_STATUS(load("movielens:", DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds), DT_USAGE);
  ASSERT_STATUS(load("movielens:/nonexistent/ml", DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds), DT_NOT_FOUND);
  const char *both = make_dir("both");
  write_file(both, "ratings.csv", "userId,movieId,rating,timestamp\n1,1,4,1\n", -1);
  write_file(both, "ratings.dat", "1::1::4::1\n", -1);
  ASSERT_STATUS(load(both, DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds), DT_USAGE);
  ASSERT_MSG(strstr(dt_last_error(), "both"), dt_last_error());
  const dt_data_options odd = {.holdout = (dt_holdout)7};
  snprintf(spec, sizeof spec, "movielens:%s", both);
  ASSERT_STATUS(dt_dataset_load_opts(spec, DT_SPLIT_TRAIN, &odd, &ds), DT_USAGE);
}

/* ---- leave-last-out and the ranking ------------------------------------------ */

/* Ratings for the holdout tests: users 1 (a tie), 2 (a single rating), 3 (latest first in the file) and
 * fillers 100..102 rating 60 movies each of 1000..1179 with rising timestamps: 186 ratings, users dense
 * 1, 2, 3, 100, 101, 102 -> 0..5, movies 10, 11, 12, 20, 30, 31 -> 0..5 and 1000 + k -> 6 + k (186 in all). */
static void write_holdout_data(const char *dir) {
  text t = {0};
  add(&t, "userId,movieId,rating,timestamp\n");
  add(&t, "1,10,3.0,100\n"); /* row 0 */
  add(&t, "3,30,4.0,900\n"); /* row 1: user 3's latest, first of theirs in the file */
  add(&t, "1,11,4.0,300\n"); /* row 2: tied latest of user 1 */
  add(&t, "2,20,5.0,50\n");  /* row 3: user 2's only rating: stays in training */
  add(&t, "1,12,2.0,300\n"); /* row 4: tied latest of user 1, the last in the file: held out */
  add(&t, "3,31,1.0,100\n"); /* row 5 */
  for (int f = 0; f < 3; f++)
    for (int m = 0; m < 60; m++) add(&t, "%d,%d,%.1f,%d\n", 100 + f, 1000 + 60 * f + m, 0.5 * (1 + m % 10), 1000 + m);
  write_file(dir, "ratings.csv", t.s, (long)t.len);
  free(t.s);
}

TEST(leave_last_out_holds_out_each_users_latest) {
  const char *dir = make_dir("holdout");
  write_holdout_data(dir);
  dt_dataset *train = NULL, *test = NULL;
  ASSERT_OK(load(dir, DT_SPLIT_TRAIN, DT_HOLDOUT_LAST, 0, &train));
  ASSERT_OK(load(dir, DT_SPLIT_TEST, DT_HOLDOUT_LAST, 0, &test));
  ASSERT_EQ(dt_dataset_info(train)->has_test, 1);
  ASSERT_EQ(dt_dataset_info(test)->has_test, 1);
  ASSERT_EQ(dt_dataset_size(test), 5); /* users 3, 1 and the three fillers; user 2 has none */
  ASSERT_EQ(dt_dataset_size(train), 186 - 5);
  /* both splits map ids the same way, over all ratings */
  const dt_data_info *a = dt_dataset_info(train), *b = dt_dataset_info(test);
  ASSERT_EQ(a->index_size[0], 6);
  ASSERT_EQ(b->index_size[0], 6);
  ASSERT_EQ(a->index_size[1], 186);
  ASSERT_EQ(b->index_size[1], 186);
  const dt_kv *ka, *kb;
  ASSERT_EQ(dt_dataset_meta(train, &ka), 2);
  ASSERT_EQ(dt_dataset_meta(test, &kb), 2);
  ASSERT_STR_EQ(ka[0].value, "1,2,3,100,101,102");
  ASSERT_STR_EQ(ka[0].value, kb[0].value);
  ASSERT_STR_EQ(ka[1].value, kb[1].value);

  int32_t *x, *xt;
  float *t, *tt;
  fetch_all(test, &xt, &tt);
  fetch_all(train, &x, &t);
  /* test, in file order: user 3's movie 30 (row 1), user 1's movie 12 (row 4, the later of a tie), each
   * filler's last movie */
  int32_t want_xt[10] = {2, 4, 0, 2};
  float want_tt[5] = {4.0f, 2.0f};
  for (int f = 0; f < 3; f++) {
    want_xt[4 + 2 * f] = 3 + f;
    want_xt[5 + 2 * f] = 6 + 60 * f + 59;
    want_tt[2 + f] = 5.0f;
  }
  int test_ok = 1;
  for (int i = 0; i < 10; i++) test_ok &= xt[i] == want_xt[i];
  for (int i = 0; i < 5; i++) test_ok &= tt[i] == want_tt[i];
  /* train, in file order: rows 0, 2, 3 (the single rating), 5, then the fillers' other 59 each */
  const int32_t head_x[8] = {0, 0, 0, 1, 1, 3, 2, 5};
  const float head_t[4] = {3.0f, 4.0f, 5.0f, 1.0f};
  int train_ok = 1;
  for (int i = 0; i < 8; i++) train_ok &= x[i] == head_x[i];
  for (int i = 0; i < 4; i++) train_ok &= t[i] == head_t[i];
  for (int f = 0, i = 4; f < 3; f++)
    for (int m = 0; m < 59; m++, i++) train_ok &= x[2 * i] == 3 + f && x[2 * i + 1] == 6 + 60 * f + m;
  free(x), free(t), free(xt), free(tt);
  ASSERT(test_ok);
  ASSERT(train_ok);
  dt_ranking rk;
  ASSERT_STATUS(dt_dataset_ranking(train, &rk), DT_NOT_FOUND);
  dt_dataset_free(train);
  dt_dataset_free(test);
}

/* rated[u * n_items + i] = 1 when user u rated movie i anywhere in the file (dense ids). */
static uint8_t *rated_matrix(const char *dir, int64_t *n_items) {
  dt_dataset *ds = NULL;
  if (load(dir, DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds) != DT_OK) return NULL;
  const dt_data_info *in = dt_dataset_info(ds);
  *n_items = in->index_size[1];
  uint8_t *m = calloc((size_t)(in->index_size[0] * in->index_size[1]), 1);
  int32_t *x;
  float *t;
  fetch_all(ds, &x, &t);
  for (int64_t i = 0; i < dt_dataset_size(ds); i++) m[x[2 * i] * *n_items + x[2 * i + 1]] = 1;
  free(x), free(t);
  dt_dataset_free(ds);
  return m;
}

/* The ranking of dir's leave-last-out test split for seed is valid: positives first, 100 distinct negatives the
 * user never rated; *cands gets a malloc'd copy of the candidates, *n the queries. */
static int check_ranking(const char *dir, uint64_t seed, int32_t **cands, int64_t *n) {
  int64_t n_items;
  uint8_t *rated = rated_matrix(dir, &n_items);
  dt_dataset *test = NULL;
  if (!rated || load(dir, DT_SPLIT_TEST, DT_HOLDOUT_LAST, seed, &test) != DT_OK) {
    fprintf(stderr, "  %s\n", dt_last_error());
    free(rated);
    return 0;
  }
  dt_ranking rk;
  int ok = dt_dataset_ranking(test, &rk) == DT_OK && rk.per == 101 && rk.n == dt_dataset_size(test);
  int32_t *x;
  float *t;
  fetch_all(test, &x, &t);
  uint8_t *seen = calloc((size_t)n_items, 1);
  for (int64_t q = 0; ok && q < rk.n; q++) {
    const int32_t *c = rk.items + q * rk.per;
    ok &= rk.user[q] == x[2 * q] && c[0] == x[2 * q + 1]; /* query q is test sample q, its positive first */
    memset(seen, 0, (size_t)n_items);
    for (int k = 1; k < rk.per; k++) {
      ok &= c[k] >= 0 && c[k] < n_items && !rated[rk.user[q] * n_items + c[k]] && !seen[c[k]];
      if (c[k] >= 0 && c[k] < n_items) seen[c[k]] = 1;
    }
  }
  if (ok) {
    *n = rk.n;
    *cands = malloc((size_t)(rk.n * rk.per) * sizeof **cands);
    memcpy(*cands, rk.items, (size_t)(rk.n * rk.per) * sizeof **cands);
  }
  free(seen), free(x), free(t), free(rated);
  dt_dataset_free(test);
  return ok;
}

TEST(ranking_samples_unrated_negatives_by_seed) {
  const char *dir = make_dir("ranking");
  write_holdout_data(dir);
  int32_t *c0 = NULL, *c0b = NULL, *c1 = NULL;
  int64_t n0 = 0, n0b = 0, n1 = 0;
  ASSERT(check_ranking(dir, 0, &c0, &n0));
  ASSERT(check_ranking(dir, 0, &c0b, &n0b));
  ASSERT(check_ranking(dir, 1, &c1, &n1));
  ASSERT_EQ(n0, 5);
  const size_t bytes = (size_t)n0 * 101 * sizeof *c0;
  const int same = memcmp(c0, c0b, bytes) == 0, differ = memcmp(c0, c1, bytes) != 0;
  free(c0), free(c0b), free(c1);
  ASSERT(same);   /* deterministic for a seed */
  ASSERT(differ); /* and another seed draws others */

  /* a heavy rater (140 of 250 rated: the shuffle of the unrated) next to a light one (110: draw and reject) */
  const char *heavy = make_dir("heavy");
  text t = {0};
  add(&t, "userId,movieId,rating,timestamp\n");
  for (int m = 1; m <= 250; m++) add(&t, "%d,%d,3.5,%d\n", m <= 140 ? 7 : 8, m, m);
  write_file(heavy, "ratings.csv", t.s, (long)t.len);
  free(t.s);
  ASSERT(check_ranking(heavy, 5, &c0, &n0));
  ASSERT(check_ranking(heavy, 5, &c0b, &n0b));
  ASSERT_EQ(n0, 2);
  const int heavy_same = memcmp(c0, c0b, 2 * 101 * sizeof *c0) == 0;
  free(c0), free(c0b);
  ASSERT(heavy_same);

  /* fewer than 100 unrated movies: no ranking, naming the user; training still opens */
  const char *full = make_dir("full");
  t = (text){0};
  add(&t, "userId,movieId,rating,timestamp\n");
  for (int m = 1; m <= 150; m++) add(&t, "%d,%d,4,%d\n", m <= 120 ? 41 : 42, m, m);
  write_file(full, "ratings.csv", t.s, (long)t.len);
  free(t.s);
  dt_dataset *ds = NULL;
  ASSERT_STATUS(load(full, DT_SPLIT_TEST, DT_HOLDOUT_LAST, 0, &ds), DT_USAGE);
  ASSERT_MSG(strstr(dt_last_error(), "user 41 "), dt_last_error());
  ASSERT_OK(load(full, DT_SPLIT_TRAIN, DT_HOLDOUT_LAST, 0, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 148);
  dt_dataset_free(ds);
}

/* ---- file formats -------------------------------------------------------------- */

TEST(ml1m_dat_files_with_latin1_titles) {
  const char *dir = make_dir("ml1m");
  write_file(dir, "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978298413\n", -1);
  write_file(dir, "movies.dat",
             "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
             "3::Grumpier Old Men (1995)::Comedy|Romance\n"
             "661::Caf\xe9 au lait: Cr\xe8me (1994)::Comedy\r\n", -1);
  dt_dataset *ds = NULL;
  ASSERT_OK(load(dir, DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 3);
  ASSERT_EQ(dt_dataset_info(ds)->index_size[0], 2);
  ASSERT_EQ(dt_dataset_info(ds)->index_size[1], 2);
  int32_t *x;
  float *t;
  fetch_all(ds, &x, &t);
  const int ok = x[0] == 0 && x[1] == 1 && t[0] == 5.0f && x[2] == 0 && x[3] == 0 && t[1] == 3.0f && t[2] == 4.0f;
  free(x), free(t);
  ASSERT(ok);
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 0, 0), "Caf\xc3\xa9 au lait: Cr\xc3\xa8me (1994)");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 0, 1), "Comedy");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 1, 0), "One Flew Over the Cuckoo's Nest (1975)");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 1, 1), "Drama");
  ASSERT(dt_dataset_index_text(ds, 0, 0, 0) == NULL);
  ASSERT(dt_dataset_index_text(ds, 1, 2, 0) == NULL);
  ASSERT(dt_dataset_index_text(ds, 1, 0, 2) == NULL);
  dt_dataset_free(ds);
}

TEST(movies_csv_quoted_titles) {
  const char *dir = make_dir("quoted");
  write_file(dir, "ratings.csv",
             "userId,movieId,rating,timestamp\r\n1,11,4.0,1\r\n1,12,3,2\r\n2,13,1,3\r\n2,14,2,4", -1);
  write_file(dir, "movies.csv",
             "movieId,title,genres\n"
             "11,\"American President, The (1995)\",Comedy|Drama|Romance\n"
             "12,\"Say \"\"Hi\"\", Again (2000)\",\"Comedy\"\r\n"
             "99,Not Rated (1990),Drama\n"
             "13,\"\",(no genres listed)\n"
             "15,\"Two\nLines (2001)\",Drama", -1);
  dt_dataset *ds = NULL;
  ASSERT_OK(load(dir, DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds));
  ASSERT_EQ(dt_dataset_size(ds), 4); /* no newline after the last line is fine */
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 0, 0), "American President, The (1995)");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 0, 1), "Comedy|Drama|Romance");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 1, 0), "Say \"Hi\", Again (2000)");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 1, 1), "Comedy");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 2, 0), "");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 2, 1), "(no genres listed)");
  ASSERT(dt_dataset_index_text(ds, 1, 3, 0) == NULL); /* movie 14 is not in movies.csv */
  dt_dataset_free(ds);
}

/* ---- malformed files ----------------------------------------------------------- */

typedef struct bad_case {
  const char *file; /* ratings.csv, ratings.dat or movies.csv (then with a valid ratings.csv) */
  const char *text;
  long len;         /* -1: strlen */
  const char *want; /* in dt_last_error(), after the directory */
} bad_case;

#define H "userId,movieId,rating,timestamp\n"
#define MH "movieId,title,genres\n"
static const bad_case bad_cases[] = {
    {"ratings.csv", "", -1, "ratings.csv: the file is empty"},
    {"ratings.csv", H, -1, "ratings.csv: holds no ratings"},
    {"ratings.csv", "1,1,4.0,100\n", -1, "ratings.csv:1: missing header"},
    {"ratings.csv", "userId,movieId,rating\n1,1,4\n", -1, "ratings.csv:1: missing header"},
    {"ratings.csv", H "1,1,4.0,100\n1,2,3\n", -1, "ratings.csv:3: expected 4 columns"},
    {"ratings.csv", H "1,1,4.0,100,7\n", -1, "ratings.csv:2: expected 4 columns (userId,movieId,rating,timestamp), found 5"},
    {"ratings.csv", H "a,1,4.0,100\n", -1, "ratings.csv:2: userId 'a' is not a non-negative integer"},
    {"ratings.csv", H "1,-1,4.0,100\n", -1, "ratings.csv:2: movieId '-1' is not"},
    {"ratings.csv", H "1, 1,4.0,100\n", -1, "ratings.csv:2: movieId ' 1' is not"},
    {"ratings.csv", H "1,,4.0,100\n", -1, "ratings.csv:2: movieId '' is not"},
    {"ratings.csv", H "3000000000,1,4.0,100\n", -1, "ratings.csv:2: userId 3000000000 is larger than 2147483647"},
    {"ratings.csv", H "1,1,5.5,100\n", -1, "ratings.csv:2: rating 5.5 is outside [0, 5]"},
    {"ratings.csv", H "1,1,-1,100\n", -1, "ratings.csv:2: rating '-1' is not a decimal"},
    {"ratings.csv", H "1,1,4.,100\n", -1, "ratings.csv:2: rating '4.' is not a decimal"},
    {"ratings.csv", H "1,1,nan,100\n", -1, "ratings.csv:2: rating 'nan' is not a decimal"},
    {"ratings.csv", H "1,1,1e0,100\n", -1, "ratings.csv:2: rating '1e0' is not a decimal"},
    {"ratings.csv", H "1,1,4.0,1.5\n", -1, "ratings.csv:2: timestamp '1.5' is not a non-negative integer"},
    {"ratings.csv", H "1,1,4.0,\n", -1, "ratings.csv:2: timestamp '' is not"},
    {"ratings.csv", H "1,1,4.0,100\n\n1,2,4.0,100\n", -1, "ratings.csv:3: empty line"},
    {"ratings.csv", H "1,1,4.0,100\n2,1", -1, "ratings.csv:3: expected 4 columns"}, /* a half line */
    {"ratings.csv", H "1,1,4.0,100\n2,1,4.0,1\x00\x01", 55, "ratings.csv:3: timestamp '1\\x00\\x01' is not"},
    {"ratings.csv", "\x1f\x8b\x08\x00\xff\xfe\n\x00", 8, "ratings.csv:1: missing header: expected 'userId,movieId,rating,timestamp', found '\\x1f\\x8b\\x08\\x00\\xff\\xfe'"},
    {"ratings.dat", "1::1::4::100\n1::2::4\n", -1, "ratings.dat:2: expected 4 columns (UserID::MovieID::Rating::Timestamp), found 3"},
    {"ratings.dat", "1:1:4:100\n", -1, "ratings.dat:1: expected 4 columns"},
    {"ratings.dat", "1::1::6::100\n", -1, "ratings.dat:1: Rating 6 is outside [0, 5]"},
    {"ratings.dat", "1::1:::4::100\n", -1, "ratings.dat:1: Rating ':4' is not a decimal"},
    {"ratings.dat", "\n", -1, "ratings.dat:1: empty line"},
    {"movies.csv", "", -1, "movies.csv: the file is empty"},
    {"movies.csv", MH, -1, "movies.csv: holds no movies"},
    {"movies.csv", "1,Toy Story (1995),Comedy\n", -1, "movies.csv:1: missing header"},
    {"movies.csv", MH "1,\"Toy Story (1995),Comedy\n2,x,y\n", -1, "movies.csv:2: a quoted field is not closed"},
    {"movies.csv", MH "1,\"Toy Story\" (1995),Comedy\n", -1, "movies.csv:2: text after a closing quote"},
    {"movies.csv", MH "1,Toy \"Story\" (1995),Comedy\n", -1, "movies.csv:2: a quote inside an unquoted field"},
    {"movies.csv", MH "1,Toy Story (1995)\n", -1, "movies.csv:2: expected 3 columns (movieId,title,genres), found 2"},
    {"movies.csv", MH "1,Toy Story, The (1995),Comedy\n", -1, "movies.csv:2: expected 3 columns"},
    {"movies.csv", MH "1,A,B\nx1,Toy Story (1995),Comedy\n", -1, "movies.csv:3: movieId 'x1' is not"},
    {"movies.csv", MH "1,A,B\n\n", -1, "movies.csv:3: empty line"},
    {"movies.csv", MH "1,A,B\n1,C,D\n", -1, "movies.csv:3: movieId 1 is listed twice (first on line 2)"},
    {"movies.csv", MH "1,Caf\xe9,Comedy\n", -1, "movies.csv:2: the title is not UTF-8"},
    {"movies.csv", MH "1,\"A\nB\",C\n2,D,\"E\"x\n", -1, "movies.csv:4: text after a closing quote"},
};
#undef H
#undef MH

TEST(malformed_files_are_corrupt_naming_file_and_line) {
  const int n = (int)(sizeof bad_cases / sizeof bad_cases[0]);
  for (int i = 0; i < n; i++) {
    const bad_case *c = &bad_cases[i];
    char name[32];
    snprintf(name, sizeof name, "bad%02d", i);
    const char *dir = make_dir(name);
    write_file(dir, c->file, c->text, c->len);
    if (strncmp(c->file, "movies", 6) == 0) write_file(dir, "ratings.csv", "userId,movieId,rating,timestamp\n1,1,4,1\n", -1);
    for (int split = 0; split < 2; split++) {
      dt_dataset *ds = NULL;
      const dt_status st = load(dir, split ? DT_SPLIT_TEST : DT_SPLIT_TRAIN, split ? DT_HOLDOUT_LAST : DT_HOLDOUT_DEFAULT,
                                0, &ds);
      char want[512];
      snprintf(want, sizeof want, "%s/%s", dir, c->want);
      if (st != DT_CORRUPT || !strstr(dt_last_error(), want)) {
        dt_dataset_free(ds);
        FAIL_("case %d (%s): %s: %s; want DT_CORRUPT with '%s'", i, c->file, dt_status_name(st), dt_last_error(), c->want);
      }
    }
  }
}

/* ---- the real ml-latest-small --------------------------------------------------- */

TEST(real_ml_latest_small) {
  const char *src = getenv("DT_SOURCE_DIR");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/../shared/data/movielens/ml-latest-small", src ? src : ".");
  char ratings[1100];
  snprintf(ratings, sizeof ratings, "%s/ratings.csv", dir);
  if (access(ratings, R_OK) != 0) {
    printf("  (%s missing: skipped)\n", ratings);
    return;
  }
  dt_dataset *ds = NULL;
  double t0 = dt_time_now();
  ASSERT_OK(load(dir, DT_SPLIT_TRAIN, DT_HOLDOUT_DEFAULT, 0, &ds));
  const double ms = (dt_time_now() - t0) * 1e3;
  printf("  ml-latest-small: opened in %.1f ms\n", ms); /* printed, not asserted: timing is bench's business */
  const dt_data_info *in = dt_dataset_info(ds);
  ASSERT_EQ(dt_dataset_size(ds), 100836);
  ASSERT_EQ(in->index_size[0], 610);
  ASSERT_EQ(in->index_size[1], 9724);
  const int64_t *ids;
  int64_t n;
  ASSERT_OK(dt_dataset_index_ids(ds, 1, &ids, &n));
  ASSERT_EQ(ids[0], 1);
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 0, 0), "Toy Story (1995)");
  ASSERT_STR_EQ(dt_dataset_index_text(ds, 1, 0, 1), "Adventure|Animation|Children|Comedy|Fantasy");
  ASSERT_OK(dt_dataset_index_ids(ds, 0, &ids, &n));
  ASSERT_EQ(ids[0], 1);
  ASSERT_EQ(ids[609], 610);
  dt_dataset_free(ds);

  dt_dataset *train = NULL, *test = NULL;
  t0 = dt_time_now();
  ASSERT_OK(load(dir, DT_SPLIT_TEST, DT_HOLDOUT_LAST, 0, &test));
  printf("  ml-latest-small leave-last-out test split with its ranking: opened in %.1f ms\n",
         (dt_time_now() - t0) * 1e3);
  ASSERT_OK(load(dir, DT_SPLIT_TRAIN, DT_HOLDOUT_LAST, 0, &train));
  ASSERT_EQ(dt_dataset_size(test), 610); /* every user rated at least 20 movies */
  ASSERT_EQ(dt_dataset_size(train), 100836 - 610);
  dt_ranking rk;
  ASSERT_OK(dt_dataset_ranking(test, &rk));
  ASSERT_EQ(rk.n, 610);
  ASSERT_EQ(rk.per, 101);
  dt_dataset_free(train);
  dt_dataset_free(test);
}

int main(int argc, char **argv) {
  static const dt_test_case cases[] = {
      TEST_ENTRY(dense_ids_fields_and_info),
      TEST_ENTRY(missing_files_and_bad_specs),
      TEST_ENTRY(leave_last_out_holds_out_each_users_latest),
      TEST_ENTRY(ranking_samples_unrated_negatives_by_seed),
      TEST_ENTRY(ml1m_dat_files_with_latin1_titles),
      TEST_ENTRY(movies_csv_quoted_titles),
      TEST_ENTRY(malformed_files_are_corrupt_naming_file_and_line),
      TEST_ENTRY(real_ml_latest_small),
  };
  const int rc = dt_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
  remove_all();
  return rc;
}

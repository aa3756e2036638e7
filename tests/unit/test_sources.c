/* Tests of the data sources: synthetic:N specs, determinism and field layout per task, subsets, validation splits, the loader over named fields. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---- helpers --------------------------------------------------------------- */

static dt_dataset *load(const char *spec) {
  dt_dataset *ds = NULL;
  if (dt_dataset_load(spec, DT_SPLIT_TRAIN, NULL, &ds) != DT_OK) {
    fprintf(stderr, "  %s: %s\n", spec, dt_last_error());
    return NULL;
  }
  return ds;
}

/* Samples idx[0..n) of a two-field dataset into x and target (sized by the caller). */
static void fetch2(const dt_dataset *ds, const int64_t *idx, int n, void *x, void *target) {
  void *fields[2] = {x, target};
  dt_dataset_fetch(ds, idx, n, fields);
}

/* Bytes of one sample, x then target, of a two-field dataset. */
static size_t sample_bytes(const dt_dataset *ds) {
  const dt_data_info *in = dt_dataset_info(ds);
  return dt_field_bytes(&in->field[0]) + dt_field_bytes(&in->field[1]);
}

/* Every sample of ds as one row of bytes (x then target), (size, sample_bytes). */
static uint8_t *all_rows(const dt_dataset *ds) {
  const int64_t n = dt_dataset_size(ds);
  const dt_data_info *in = dt_dataset_info(ds);
  const size_t bx = dt_field_bytes(&in->field[0]), bt = dt_field_bytes(&in->field[1]);
  uint8_t *x = malloc((size_t)n * bx), *t = malloc((size_t)n * bt), *rows = malloc((size_t)n * (bx + bt));
  int64_t *idx = malloc((size_t)n * sizeof *idx);
  if (!x || !t || !rows || !idx) {
    free(x), free(t), free(rows), free(idx);
    return NULL;
  }
  for (int64_t i = 0; i < n; i++) idx[i] = i;
  fetch2(ds, idx, (int)n, x, t);
  for (int64_t i = 0; i < n; i++) {
    memcpy(rows + (size_t)i * (bx + bt), x + (size_t)i * bx, bx);
    memcpy(rows + (size_t)i * (bx + bt) + bx, t + (size_t)i * bt, bt);
  }
  free(x), free(t), free(idx);
  return rows;
}

/* The parent index of every sample of view: the parent's sample with the same
 * bytes (synthetic x values are random floats, so they are unique). -1 if none. */
static int64_t *parent_indices(const dt_dataset *parent, const dt_dataset *view) {
  const size_t b = sample_bytes(parent);
  const int64_t np = dt_dataset_size(parent), nv = dt_dataset_size(view);
  uint8_t *rp = all_rows(parent), *rv = all_rows(view);
  int64_t *map = malloc((size_t)(nv ? nv : 1) * sizeof *map);
  if (rp && rv && map)
    for (int64_t i = 0; i < nv; i++) {
      map[i] = -1;
      for (int64_t j = 0; j < np && map[i] < 0; j++)
        if (memcmp(rv + (size_t)i * b, rp + (size_t)j * b, b) == 0) map[i] = j;
    }
  free(rp), free(rv);
  return map;
}

#define ASSERT_HAS(detail, want)                                                          \
  do {                                                                                    \
    const char *d_ = (detail);                                                            \
    if (!strstr(d_, want)) FAIL_("\"%s\" lacks \"%s\"", d_, want);                        \
  } while (0)

/* ---- specs ------------------------------------------------------------------- */

TEST(spec_defaults_and_layout) {
  dt_dataset *ds = load("synthetic:100");
  ASSERT(ds != NULL);
  const dt_data_info *in = dt_dataset_info(ds);
  ASSERT_EQ(dt_dataset_size(ds), 100);
  ASSERT_EQ(in->task, DT_TASK_REGRESSION);
  ASSERT_EQ(in->outputs, 1);
  ASSERT_EQ(in->has_test, 0);
  ASSERT_STR_EQ(in->name, "synthetic");
  ASSERT_EQ(in->n_fields, 2);
  ASSERT_EQ(in->input, 0);
  ASSERT_EQ(in->target, 1);
  ASSERT_STR_EQ(in->field[0].name, "x");
  ASSERT_EQ(in->field[0].dtype, DT_F32);
  ASSERT_EQ(in->field[0].ndim, 1);
  ASSERT_EQ(in->field[0].shape[0], 20);
  ASSERT_STR_EQ(in->field[1].name, "target");
  ASSERT_EQ(in->field[1].dtype, DT_F32);
  ASSERT_EQ(in->field[1].ndim, 1);
  ASSERT_EQ(in->field[1].shape[0], 1);
  ASSERT_EQ(dt_data_field(in, "target"), 1);
  ASSERT_EQ(dt_data_field(in, "y"), -1);
  ASSERT_EQ(dt_dataset_classes(ds), 0);
  int64_t shape[3];
  dt_dataset_sample_shape(ds, shape);
  ASSERT(shape[0] == 1 && shape[1] == 1 && shape[2] == 20);
  dt_dataset_free(ds);
}

TEST(spec_each_task) {
  dt_dataset *ds = load("synthetic:300,in=7,out=4,task=regression,seed=5");
  ASSERT(ds != NULL);
  const dt_data_info *in = dt_dataset_info(ds);
  ASSERT(in->task == DT_TASK_REGRESSION && in->outputs == 4 && in->has_test == 0);
  ASSERT(in->field[0].dtype == DT_F32 && in->field[0].ndim == 1 && in->field[0].shape[0] == 7);
  ASSERT(in->field[1].dtype == DT_F32 && in->field[1].ndim == 1 && in->field[1].shape[0] == 4);
  float *x = malloc(300 * 7 * sizeof(float)), *y = malloc(300 * 4 * sizeof(float));
  int32_t *cls = malloc(300 * sizeof(int32_t));
  int64_t idx[300];
  for (int i = 0; i < 300; i++) idx[i] = i;
  ASSERT(x && y && cls);
  fetch2(ds, idx, 300, x, y);
  for (int i = 0; i < 300 * 7; i++) ASSERT(x[i] >= 0.0f && x[i] < 1.0f);
  for (int i = 0; i < 300 * 4; i++) ASSERT(y[i] >= 0.0f && y[i] < 1.0f);
  dt_dataset_free(ds);

  /* keys in any order */
  ds = load("synthetic:300,task=classification,seed=5,out=3,in=7");
  ASSERT(ds != NULL);
  in = dt_dataset_info(ds);
  ASSERT(in->task == DT_TASK_CLASSIFICATION && in->outputs == 3 && in->has_test == 0);
  ASSERT(in->field[0].dtype == DT_F32 && in->field[0].shape[0] == 7);
  ASSERT(in->field[1].dtype == DT_I32 && in->field[1].ndim == 0);
  ASSERT_EQ(dt_field_bytes(&in->field[1]), 4);
  ASSERT_EQ(dt_dataset_classes(ds), 3);
  fetch2(ds, idx, 300, x, cls);
  int hist[3] = {0};
  for (int i = 0; i < 300; i++) {
    ASSERT(cls[i] >= 0 && cls[i] < 3);
    hist[cls[i]]++;
  }
  for (int c = 0; c < 3; c++) ASSERT_MSG(hist[c] > 0, "a class never occurs"); /* the teacher is not degenerate */
  /* the legacy gather of classification sources reads the same samples */
  int32_t cls2[300];
  float *x2 = malloc(300 * 7 * sizeof(float));
  ASSERT(x2 != NULL);
  dt_dataset_gather(ds, idx, 300, x2, cls2);
  ASSERT(memcmp(cls, cls2, sizeof cls2) == 0 && memcmp(x, x2, 300 * 7 * sizeof(float)) == 0);
  free(x2);
  dt_dataset_free(ds);

  ds = load("synthetic:300,in=7,out=4,task=multilabel");
  ASSERT(ds != NULL);
  in = dt_dataset_info(ds);
  ASSERT(in->task == DT_TASK_MULTILABEL && in->outputs == 4 && in->has_test == 0);
  ASSERT(in->field[1].dtype == DT_F32 && in->field[1].ndim == 1 && in->field[1].shape[0] == 4);
  ASSERT_EQ(dt_dataset_classes(ds), 0);
  fetch2(ds, idx, 300, x, y);
  int ones[4] = {0};
  for (int i = 0; i < 300 * 4; i++) {
    ASSERT(y[i] == 0.0f || y[i] == 1.0f);
    ones[i % 4] += y[i] == 1.0f;
  }
  for (int k = 0; k < 4; k++) ASSERT_MSG(ones[k] > 0 && ones[k] < 300, "a label is constant");
  dt_dataset_free(ds);
  free(x), free(y), free(cls);

  /* the limits of the widths and of the seed */
  ds = load("synthetic:1,in=1048576,seed=18446744073709551615");
  ASSERT(ds != NULL);
  dt_dataset_free(ds);
}

/* The spec must be refused with DT_USAGE, the detail quoting `what`. */
#define ASSERT_BAD_SPEC(spec, what)                                               \
  do {                                                                            \
    dt_dataset *d_ = (dt_dataset *)0x1;                                           \
    ASSERT_STATUS(dt_dataset_load(spec, DT_SPLIT_TRAIN, NULL, &d_), DT_USAGE);    \
    ASSERT_HAS(dt_last_error(), what);                                            \
    ASSERT(d_ == (dt_dataset *)0x1);                                              \
  } while (0)

TEST(spec_errors_name_the_bad_part) {
  ASSERT_BAD_SPEC("synthetic:", "'' is not a sample count");
  ASSERT_BAD_SPEC("synthetic:0", "'0' is not a sample count");
  ASSERT_BAD_SPEC("synthetic:-5", "'-5' is not a sample count");
  ASSERT_BAD_SPEC("synthetic:1e3", "'1e3' is not a sample count");
  ASSERT_BAD_SPEC("synthetic:4294967296", "'4294967296' is not a sample count");
  ASSERT_BAD_SPEC("synthetic:10,in=0", "'0' is not an input width (in)");
  ASSERT_BAD_SPEC("synthetic:10,out=1048577", "'1048577' is not an output width (out)");
  ASSERT_BAD_SPEC("synthetic:10,in=", "'' is not an input width (in)");
  ASSERT_BAD_SPEC("synthetic:10,foo=1", "'foo' is not a key");
  ASSERT_BAD_SPEC("synthetic:10,in", "'in' is not KEY=VALUE");
  ASSERT_BAD_SPEC("synthetic:10,in=3,in=4", "'in' is given twice");
  ASSERT_BAD_SPEC("synthetic:10,task=x", "'x' is not a task");
  ASSERT_BAD_SPEC("synthetic:10,seed=-1", "'-1' is not a seed");
  ASSERT_BAD_SPEC("synthetic:10,seed=18446744073709551616", "is not a seed");
  ASSERT_BAD_SPEC("synthetic:10,", "',' leaves an empty item");
  ASSERT_BAD_SPEC("synthetic:10,,in=2", "',' leaves an empty item");
  ASSERT_BAD_SPEC("synthetic:,10", "',' leaves an empty item");
  ASSERT_BAD_SPEC("synthetic:10,out=1,task=classification", "'out' must be >= 2 classes");
  ASSERT_BAD_SPEC("synthetic:10,task=classification", "'out' must be >= 2 classes"); /* out defaults to 1 */
  ASSERT_BAD_SPEC("synthetic:10,tokens=1", "'1' is not a vocabulary size (tokens)");
  ASSERT_BAD_SPEC("synthetic:10,tokens=9,len=513", "'513' is not a length (len)");
  ASSERT_BAD_SPEC("synthetic:10,len=8", "'len' needs tokens=V");
  ASSERT_BAD_SPEC("synthetic:10,tokens=9,in=4", "'in' is for vectors");
  /* every message shows the spec and its grammar */
  ASSERT_BAD_SPEC("synthetic:10,foo=1", "--data synthetic:10,foo=1:");
  ASSERT_BAD_SPEC("synthetic:10,foo=1", "synthetic:N[,in=20");
}

/* tokens=V: the bert input (3, len): ids in [1, V) then 0 padding, types 0, a mask of 1s then 0s, at least
 * max(2, len/4) tokens; the classes are the teacher's argmax, so both appear; a pure function of (seed, i). */
TEST(text_samples) {
  enum { N = 64, LEN = 12, V = 50 };
  dt_dataset *ds = load("synthetic:64,tokens=50,len=12,task=classification,out=2,seed=3");
  ASSERT(ds);
  const dt_data_info *in = dt_dataset_info(ds);
  ASSERT_EQ(in->field[0].dtype, DT_I32);
  ASSERT_EQ(in->field[0].ndim, 2);
  ASSERT_EQ(in->field[0].shape[0], 3);
  ASSERT_EQ(in->field[0].shape[1], LEN);
  ASSERT_EQ(in->n_index, 1);
  ASSERT_EQ(in->index_size[0], V);
  int32_t x[N * 3 * LEN], y[N], x2[3 * LEN], y2;
  int64_t idx[N];
  for (int i = 0; i < N; i++) idx[i] = i;
  fetch2(ds, idx, N, x, y);
  int classes[2] = {0, 0};
  for (int i = 0; i < N; i++) {
    const int32_t *ids = x + i * 3 * LEN, *types = ids + LEN, *mask = types + LEN;
    int n = 0;
    while (n < LEN && mask[n] == 1) n++;
    ASSERT(n >= 3);
    for (int t = 0; t < LEN; t++) {
      ASSERT(types[t] == 0 && (t < n ? ids[t] >= 1 && ids[t] < V : ids[t] == 0 && mask[t] == 0));
    }
    ASSERT(y[i] == 0 || y[i] == 1);
    classes[y[i]]++;
  }
  ASSERT(classes[0] > 0 && classes[1] > 0);
  const int64_t one = 37;
  fetch2(ds, &one, 1, x2, &y2);
  ASSERT(memcmp(x2, x + 37 * 3 * LEN, sizeof x2) == 0 && y2 == y[37]);
  dt_dataset_free(ds);
}

TEST(test_split_is_not_found) {
  dt_dataset *ds = (dt_dataset *)0x1;
  ASSERT_STATUS(dt_dataset_load("synthetic:10", DT_SPLIT_TEST, NULL, &ds), DT_NOT_FOUND);
  ASSERT_HAS(dt_last_error(), "synthetic:10 has no test split");
  ASSERT_HAS(dt_last_error(), "--val-fraction");
  ASSERT(ds == (dt_dataset *)0x1);
}

static void list_source(const char *name, const char *doc, void *user) {
  char *buf = user;
  size_t len = strlen(buf);
  snprintf(buf + len, 2048 - len, "%s|%s\n", name, doc);
}

TEST(sources_are_listed) {
  char buf[2048] = "";
  dt_dataset_sources(list_source, buf);
  ASSERT_HAS(buf, "synthetic|synthetic:N[,in=20,out=1,task=regression|classification|multilabel,seed=0]");
  ASSERT_HAS(buf, "text|a .csv or .tsv file");
  ASSERT_HAS(buf, "idx|");
}

/* ---- determinism ------------------------------------------------------------------- */

TEST(samples_are_pure_functions_of_seed_and_index) {
  static const char *const specs[] = {"synthetic:64,in=5,out=3", "synthetic:64,in=5,out=3,task=classification",
                                      "synthetic:64,in=5,out=3,task=multilabel"};
  for (int s = 0; s < 3; s++) {
    char spec[128];
    dt_dataset *a = load(specs[s]), *b = load(specs[s]);
    snprintf(spec, sizeof spec, "%s,seed=0", specs[s]);
    dt_dataset *zero = load(spec);
    snprintf(spec, sizeof spec, "%s,seed=1", specs[s]);
    dt_dataset *one = load(spec);
    ASSERT(a && b && zero && one);
    uint8_t *ra = all_rows(a), *rb = all_rows(b), *r0 = all_rows(zero), *r1 = all_rows(one);
    const size_t sb = sample_bytes(a), all = 64 * sb;
    ASSERT(ra && rb && r0 && r1);
    ASSERT(memcmp(ra, rb, all) == 0); /* same spec, same bytes */
    ASSERT(memcmp(ra, r0, all) == 0); /* the default seed is 0 */
    ASSERT(memcmp(ra, r1, sb) != 0);  /* another seed, other samples */

    /* sample i alone, or anywhere in a batch in any order, is the same bytes */
    const dt_data_info *in = dt_dataset_info(a);
    const size_t bx = dt_field_bytes(&in->field[0]), bt = dt_field_bytes(&in->field[1]);
    int64_t order[64];
    for (int i = 0; i < 64; i++) order[i] = (i * 37 + 11) % 64; /* a permutation */
    order[5] = order[9];                                        /* and a repeat */
    uint8_t x[64 * 5 * 4], t[64 * 3 * 4];
    fetch2(a, order, 64, x, t);
    for (int i = 0; i < 64; i++) {
      const uint8_t *row = ra + (size_t)order[i] * sb;
      ASSERT(memcmp(x + (size_t)i * bx, row, bx) == 0);
      ASSERT(memcmp(t + (size_t)i * bt, row + bx, bt) == 0);
    }
    for (int64_t i = 63; i >= 0; i -= 7) {
      fetch2(a, &i, 1, x, t);
      ASSERT(memcmp(x, ra + (size_t)i * sb, bx) == 0 && memcmp(t, ra + (size_t)i * sb + bx, bt) == 0);
    }
    free(ra), free(rb), free(r0), free(r1);
    dt_dataset_free(a), dt_dataset_free(b), dt_dataset_free(zero), dt_dataset_free(one);
  }
  /* the sample count does not change the samples: synthetic:64 is a prefix of synthetic:100 */
  dt_dataset *small = load("synthetic:64,in=3"), *big = load("synthetic:100,in=3");
  ASSERT(small && big);
  uint8_t *rs = all_rows(small), *rl = all_rows(big);
  ASSERT(rs && rl && memcmp(rs, rl, 64 * sample_bytes(small)) == 0);
  free(rs), free(rl);
  dt_dataset_free(small), dt_dataset_free(big);
}

/* ---- subsets and splits ------------------------------------------------------------------ */

TEST(subset_maps_indices) {
  dt_dataset *p = load("synthetic:600,in=2,out=2");
  ASSERT(p != NULL);
  /* a reversed view, fetched in one batch larger than the subset's mapping chunk */
  int64_t rev[600], idx[600];
  for (int i = 0; i < 600; i++) rev[i] = 599 - i, idx[i] = i;
  dt_dataset *s = NULL;
  ASSERT_OK(dt_dataset_subset(p, rev, 600, &s));
  ASSERT_EQ(dt_dataset_size(s), 600);
  const dt_data_info *is = dt_dataset_info(s), *ip = dt_dataset_info(p);
  ASSERT(is->task == ip->task && is->outputs == ip->outputs && is->n_fields == 2 && is->target == 1);
  ASSERT(memcmp(is->field, ip->field, sizeof is->field) == 0);
  float xs[600 * 2], ts[600 * 2], xp[600 * 2], tp[600 * 2];
  fetch2(s, idx, 600, xs, ts);
  fetch2(p, rev, 600, xp, tp);
  ASSERT(memcmp(xs, xp, sizeof xs) == 0 && memcmp(ts, tp, sizeof ts) == 0);

  /* a subset with repeats, and a subset of it */
  const int64_t pick[4] = {5, 0, 5, 599};
  dt_dataset *s2 = NULL, *s3 = NULL;
  ASSERT_OK(dt_dataset_subset(p, pick, 4, &s2));
  const int64_t q[2] = {3, 1}, want[2] = {599, 0};
  fetch2(s2, q, 2, xs, ts);
  fetch2(p, want, 2, xp, tp);
  ASSERT(memcmp(xs, xp, 4 * sizeof(float)) == 0 && memcmp(ts, tp, 4 * sizeof(float)) == 0);
  ASSERT_OK(dt_dataset_subset(s2, q, 2, &s3));
  const int64_t both[2] = {0, 1};
  fetch2(s3, both, 2, xs, ts);
  ASSERT(memcmp(xs, xp, 4 * sizeof(float)) == 0 && memcmp(ts, tp, 4 * sizeof(float)) == 0);

  /* indices outside the parent are refused, naming the first */
  const int64_t bad[4] = {0, 1, 2, 4};
  dt_dataset *out = (dt_dataset *)0x1;
  ASSERT_STATUS(dt_dataset_subset(s2, bad, 4, &out), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "subset index 4 at 3 is outside [0, 4)");
  const int64_t neg[1] = {-1};
  ASSERT_STATUS(dt_dataset_subset(p, neg, 1, &out), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "subset index -1");
  ASSERT(out == (dt_dataset *)0x1);
  /* an empty view is allowed */
  ASSERT_OK(dt_dataset_subset(p, NULL, 0, &out));
  ASSERT_EQ(dt_dataset_size(out), 0);
  dt_dataset_free(out);
  dt_dataset_free(s3);
  dt_dataset_free(s2);
  dt_dataset_free(s);
  dt_dataset_free(p);
}

/* Splits p (size n) and checks sizes, disjointness, coverage and index order; the
 * parent indices of the validation part into val_idx. 0 on success. */
static int check_split(dt_dataset *p, double f, uint64_t seed, int64_t *val_idx, int64_t *n_val) {
  const int64_t n = dt_dataset_size(p);
  dt_dataset *tr = NULL, *va = NULL;
  if (dt_dataset_split(p, f, seed, &tr, &va) != DT_OK) return 1;
  int rc = 0;
  const int64_t nv = llround(f * (double)n);
  if (dt_dataset_size(va) != nv || dt_dataset_size(tr) != n - nv) rc = 2;
  int64_t *mt = parent_indices(p, tr), *mv = parent_indices(p, va);
  int *seen = calloc((size_t)n, sizeof *seen);
  if (!rc && (!mt || !mv || !seen)) rc = 3;
  for (int64_t i = 0; !rc && i < n - nv; i++) {
    if (mt[i] < 0 || (i && mt[i] <= mt[i - 1])) rc = 4; /* a parent sample, in index order */
    else seen[mt[i]]++;
  }
  for (int64_t i = 0; !rc && i < nv; i++) {
    if (mv[i] < 0 || (i && mv[i] <= mv[i - 1])) rc = 5;
    else seen[mv[i]]++;
  }
  for (int64_t i = 0; !rc && i < n; i++)
    if (seen[i] != 1) rc = 6; /* disjoint and covering */
  if (!rc) {
    memcpy(val_idx, mv, (size_t)nv * sizeof *mv);
    *n_val = nv;
  }
  free(mt), free(mv), free(seen);
  dt_dataset_free(tr);
  dt_dataset_free(va);
  return rc;
}

TEST(split_is_a_deterministic_partition) {
  dt_dataset *p = load("synthetic:101,in=2,task=classification,out=3");
  ASSERT(p != NULL);
  int64_t a[101], b[101], c[101], na = 0, nb = 0, nc = 0;
  ASSERT_EQ(check_split(p, 0.2, 7, a, &na), 0);
  ASSERT_EQ(na, 20);
  ASSERT_EQ(check_split(p, 0.2, 7, b, &nb), 0);
  ASSERT(nb == na && memcmp(a, b, (size_t)na * sizeof *a) == 0); /* same seed, same split */
  ASSERT_EQ(check_split(p, 0.2, 8, c, &nc), 0);
  ASSERT(nc == na && memcmp(a, c, (size_t)na * sizeof *a) != 0); /* another seed, another split */
  ASSERT_EQ(check_split(p, 0.5, 7, c, &nc), 0);
  ASSERT_EQ(nc, 51); /* round(50.5) = 51: half away from zero */
  ASSERT_EQ(check_split(p, 0.99, 1, c, &nc), 0);
  ASSERT_EQ(nc, 100);
  ASSERT_EQ(check_split(p, 0.005, 1, c, &nc), 0);
  ASSERT_EQ(nc, 1);

  dt_dataset *tr = (dt_dataset *)0x1, *va = (dt_dataset *)0x1;
  ASSERT_STATUS(dt_dataset_split(p, 0.0, 1, &tr, &va), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "must be in (0, 1)");
  ASSERT_STATUS(dt_dataset_split(p, 1.0, 1, &tr, &va), DT_INVALID_ARGUMENT);
  ASSERT_HAS(dt_last_error(), "must be in (0, 1)");
  ASSERT_STATUS(dt_dataset_split(p, NAN, 1, &tr, &va), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_dataset_split(p, 0.004, 1, &tr, &va), DT_USAGE);
  ASSERT_HAS(dt_last_error(), "leaves 0 of 101 samples for validation");
  ASSERT_STATUS(dt_dataset_split(p, 0.996, 1, &tr, &va), DT_USAGE);
  ASSERT_HAS(dt_last_error(), "leaves 101 of 101");
  ASSERT(tr == (dt_dataset *)0x1 && va == (dt_dataset *)0x1);
  dt_dataset_free(p);
}

/* ---- the loader over named fields --------------------------------------------------------- */

TEST(loader_delivers_regression_targets) {
  dt_dataset *ds = load("synthetic:50,in=3,out=2");
  ASSERT(ds != NULL);
  dt_loader_config c = {.batch_size = 8, .shuffle = 1, .seed = 3, .prefetch = 2};
  dt_loader *l = NULL;
  ASSERT_OK(dt_loader_new(ds, &c, &l));
  ASSERT_OK(dt_loader_start_epoch(l, 1));
  uint8_t *rows = all_rows(ds);
  ASSERT(rows != NULL);
  const size_t sb = sample_bytes(ds);
  int seen[50] = {0}, total = 0;
  for (;;) {
    dt_batch b;
    ASSERT_OK(dt_loader_next(l, &b));
    if (b.size == 0) break;
    ASSERT(b.y == NULL);
    ASSERT(b.x == b.field[0] && b.target == b.field[1]);
    const float *x = b.x, *t = b.target;
    /* each row is a whole sample of the dataset: find it by its inputs */
    for (int i = 0; i < b.size; i++) {
      int found = -1;
      for (int j = 0; j < 50 && found < 0; j++)
        if (memcmp(rows + (size_t)j * sb, x + 3 * i, 3 * sizeof(float)) == 0) found = j;
      ASSERT(found >= 0);
      ASSERT(memcmp(rows + (size_t)found * sb + 3 * sizeof(float), t + 2 * i, 2 * sizeof(float)) == 0);
      seen[found]++;
    }
    total += b.size;
  }
  ASSERT_EQ(total, 50);
  for (int j = 0; j < 50; j++) ASSERT_EQ(seen[j], 1);
  free(rows);
  dt_loader_free(l);
  dt_dataset_free(ds);

  /* classification: y is the target field, as class indices */
  ds = load("synthetic:20,in=3,out=4,task=classification");
  ASSERT(ds != NULL);
  c.shuffle = 0;
  ASSERT_OK(dt_loader_new(ds, &c, &l));
  ASSERT_OK(dt_loader_start_epoch(l, 0));
  dt_batch b;
  ASSERT_OK(dt_loader_next(l, &b));
  ASSERT(b.size == 8 && b.y != NULL && (const void *)b.y == b.target);
  float x[8 * 3];
  int32_t y[8];
  const int64_t first[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  fetch2(ds, first, 8, x, y);
  ASSERT(memcmp(b.y, y, sizeof y) == 0 && memcmp(b.x, x, sizeof x) == 0);
  dt_loader_free(l);
  dt_dataset_free(ds);
}

TEST_MAIN(TEST_ENTRY(spec_defaults_and_layout), TEST_ENTRY(spec_each_task), TEST_ENTRY(spec_errors_name_the_bad_part),
          TEST_ENTRY(text_samples), TEST_ENTRY(test_split_is_not_found), TEST_ENTRY(sources_are_listed),
          TEST_ENTRY(samples_are_pure_functions_of_seed_and_index), TEST_ENTRY(subset_maps_indices),
          TEST_ENTRY(split_is_a_deterministic_partition), TEST_ENTRY(loader_delivers_regression_targets))

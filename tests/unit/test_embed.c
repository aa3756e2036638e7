/* Tests of row tables: finite-difference gradients of the MF and Embeddings layers (with their L2 term), touched-row
 * tracking and zero_grad, out-of-range indices, and dt_optim_step_rows (refused settings, untouched rows and moments). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/model_ctx.h"
#include "harness.h"

#define USERS 7
#define ITEMS 11

static void fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
  dt_rng r;
  dt_rng_init(&r, seed, 5);
  for (size_t i = 0; i < n; i++) x[i] = dt_rng_uniform_range(&r, lo, hi);
}

/* An index model of (user, item) pairs: MF (factors K, l2) alone. */
static dt_status mf_model(int K, float l2, dt_model **out) {
  const int64_t shape[1] = {2};
  dt_model *m = NULL;
  DT_CHECK(dt_model_new(1, shape, &m));
  dt_status st;
  if ((st = dt_model_set_input_dtype(m, DT_I32)) != DT_OK || (st = dt_model_add_mf(m, "", USERS, ITEMS, K, 0.3f, 3.5f, l2)) != DT_OK ||
      (st = dt_model_build(m, 16, 3)) != DT_OK) {
    dt_model_free(m);
    return st;
  }
  *out = m;
  return DT_OK;
}

/* Embeddings of three index columns (tables a, b, c of 5, 4 and 6 rows, width 3) -> Linear(9, 2). */
static const int64_t emb_rows[3] = {5, 4, 6};
static dt_status emb_model(float l2, dt_model **out) {
  static const char *const names[3] = {"a", "b", "c"};
  const int64_t shape[1] = {3};
  dt_model *m = NULL;
  DT_CHECK(dt_model_new(1, shape, &m));
  dt_status st;
  if ((st = dt_model_set_input_dtype(m, DT_I32)) != DT_OK ||
      (st = dt_model_add_embeddings(m, "emb", 3, names, emb_rows, 3, 0.5f, l2)) != DT_OK ||
      (st = dt_model_add_linear(m, "fc", 2, 1)) != DT_OK || (st = dt_model_build(m, 16, 3)) != DT_OK) {
    dt_model_free(m);
    return st;
  }
  *out = m;
  return DT_OK;
}

static float *tensor(dt_model *m, const char *name, dt_tensor_info *ti) {
  int i = -1;
  if (dt_model_find_tensor(m, name, &i) != DT_OK) return NULL;
  if (ti && dt_model_tensor_info(m, i, ti) != DT_OK) return NULL;
  return dt_model_tensor_data(m, i);
}

/* ---- finite differences ----------------------------------------------------------------------------------------
 * Objective L = sum(dout * out) + l2 * w * sum over lookups of |row|^2 (the term an L2 layer differentiates), in
 * double. Every parameter's numeric gradient (L(p+h) - L(p-h)) / 2h must match the analytic one within
 * tol * max(1, max |analytic|). Both models are at most quadratic in each parameter, so central differences are
 * exact but for float rounding. */
typedef struct l2_term {
  const char *table; /* tensor name */
  int col;           /* index column it reads */
} l2_term;

typedef struct fd_model {
  dt_model *m;
  const int32_t *x; /* (B, ncol) */
  int B, ncol, n_out;
  const float *dout; /* (B, n_out) */
  double l2w;        /* l2 * loss weight */
  const l2_term *terms;
  int n_terms;
} fd_model;

static double objective(const fd_model *f) {
  const float *out = NULL;
  if (dt_model_forward(f->m, f->x, f->B, &out) != DT_OK) return NAN;
  double L = 0;
  for (int i = 0; i < f->B * f->n_out; i++) L += (double)f->dout[i] * out[i];
  for (int t = 0; t < f->n_terms; t++) {
    dt_tensor_info ti;
    const float *table = tensor(f->m, f->terms[t].table, &ti);
    if (!table) return NAN;
    for (int b = 0; b < f->B; b++) {
      const float *row = table + (size_t)f->x[b * f->ncol + f->terms[t].col] * (size_t)ti.shape[1];
      for (int64_t j = 0; j < ti.shape[1]; j++) L += f->l2w * (double)row[j] * row[j];
    }
  }
  return L;
}

/* Mismatches between the analytic gradient (one backward with loss weight w) and the numeric one. */
static int fd_check(const fd_model *f, float w, double h, double tol) {
  size_t n = 0;
  float *p = dt_model_params(f->m, &n);
  dt_model_ctx_set_loss_weight(dt_model_default_ctx(f->m), w);
  dt_model_zero_grad(f->m);
  const float *out = NULL;
  if (dt_model_forward(f->m, f->x, f->B, &out) != DT_OK || dt_model_backward(f->m, f->dout) != DT_OK) return -1;
  float *g = malloc(n * sizeof *g);
  if (!g) return -1;
  memcpy(g, dt_model_grads(f->m, NULL), n * sizeof *g);
  double scale = 1;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(g[i]));
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    const float save = p[i];
    p[i] = (float)(save + h);
    const double lp = objective(f);
    p[i] = (float)(save - h);
    const double lm = objective(f);
    p[i] = save;
    const double num = (lp - lm) / ((double)(float)(save + h) - (double)(float)(save - h));
    if (!(fabs(num - g[i]) <= tol * scale)) {
      if (bad < 5) fprintf(stderr, "  param %zu: analytic %.7g numeric %.7g\n", i, g[i], num);
      bad++;
    }
  }
  free(g);
  return bad;
}

/* MF with and without L2, a batch of 10 pairs repeating users and items, an explicit loss weight. */
TEST(mf_gradients_match_finite_differences) {
  static const int32_t x[20] = {0, 2, 3, 7, 3, 2, 5, 10, 1, 4, 3, 7, 0, 7, 6, 0, 5, 9, 3, 7};
  float dout[10];
  fill_uniform(dout, 10, 1, -1, 1);
  static const l2_term terms[2] = {{"user_factors.weight", 0}, {"item_factors.weight", 1}};
  for (int with_l2 = 0; with_l2 < 2; with_l2++) {
    const float l2 = with_l2 ? 0.07f : 0.0f, w = 0.3f;
    dt_model *m = NULL;
    ASSERT_OK(mf_model(4, l2, &m));
    size_t n = 0;
    float *p = dt_model_params(m, &n);
    ASSERT_EQ(n, (size_t)(USERS * 4 + ITEMS * 4 + USERS + ITEMS + 1));
    fill_uniform(p, n, 2, -0.8f, 0.8f);
    const fd_model f = {m, x, 10, 2, 1, dout, (double)l2 * w, terms, 2};
    const int bad = fd_check(&f, w, 1e-2, 2e-4);
    dt_model_free(m);
    ASSERT_EQ(bad, 0);
  }
}

/* Embeddings (three tables, repeated rows) into a Linear, with and without L2, the default loss weight 1/batch. */
TEST(embeddings_gradients_match_finite_differences) {
  static const int32_t x[21] = {0, 1, 5, 4, 3, 0, 0, 1, 2, 2, 0, 5, 4, 3, 1, 0, 1, 5, 1, 2, 3};
  float dout[14];
  fill_uniform(dout, 14, 3, -1, 1);
  static const l2_term terms[3] = {{"emb.a.weight", 0}, {"emb.b.weight", 1}, {"emb.c.weight", 2}};
  for (int with_l2 = 0; with_l2 < 2; with_l2++) {
    const float l2 = with_l2 ? 0.05f : 0.0f;
    dt_model *m = NULL;
    ASSERT_OK(emb_model(l2, &m));
    size_t n = 0;
    float *p = dt_model_params(m, &n);
    ASSERT_EQ(n, (size_t)(15 * 3 + 9 * 2 + 2));
    fill_uniform(p, n, 4, -0.8f, 0.8f);
    const fd_model f = {m, x, 7, 3, 2, dout, (double)l2 / 7, terms, 3};
    const int bad = fd_check(&f, 0.0f, 1e-2, 2e-4); /* loss weight 0: the default, 1 / batch */
    dt_model_free(m);
    ASSERT_EQ(bad, 0);
  }
}

/* ---- touched rows ----------------------------------------------------------------------------------------------- */

/* The index k of the row table that is tensor `name`, or -1. */
static int table_index(const dt_model *m, const char *name) {
  int idx = -1;
  if (dt_model_find_tensor(m, name, &idx) != DT_OK) return -1;
  for (int k = 0; k < dt_model_num_row_tables(m); k++) {
    dt_rows t;
    dt_model_ctx_rows(m, dt_model_default_ctx((dt_model *)m), k, &t);
    if (t.tensor == idx) return k;
  }
  return -1;
}

/* The rows of tensor `name` in c; 0 if it is no row table. */
static int table_of(const dt_model *m, const dt_model_ctx *c, const char *name, dt_rows *out) {
  const int k = table_index(m, name);
  if (k >= 0) dt_model_ctx_rows(m, c, k, out);
  return k >= 0;
}

/* 1 if list[0..n) are distinct and are exactly the rows with want[r] != 0. */
static int same_set(const int32_t *list, int64_t n, const unsigned char *want, int rows) {
  unsigned char seen[64] = {0};
  int64_t expect = 0;
  for (int r = 0; r < rows; r++) expect += want[r] != 0;
  if (n != expect) return 0;
  for (int64_t i = 0; i < n; i++) {
    if (list[i] < 0 || list[i] >= rows || seen[list[i]] || !want[list[i]]) return 0;
    seen[list[i]] = 1;
  }
  return 1;
}

static int all_zero(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (x[i] != 0) return 0;
  return 1;
}

TEST(touched_rows_listed_once_refs_count_lookups_zero_grad_clears) {
  static const int32_t x[18] = {0, 2, 3, 7, 3, 2, 5, 10, 1, 4, 3, 7, 0, 7, 6, 0, 5, 9}; /* users 0 1 3 5 6, items 0 2 4 7 9 10 */
  static const int32_t x2[4] = {2, 1, 3, 1};                                         /* user 2 new, item 1 new */
  unsigned char users[USERS] = {1, 1, 0, 1, 0, 1, 1}, items[ITEMS] = {1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 1};
  static const char *const names[4] = {"user_factors.weight", "item_factors.weight", "user_bias.weight", "item_bias.weight"};
  dt_model *m = NULL;
  ASSERT_OK(mf_model(4, 0.1f, &m));
  dt_model_ctx *c = dt_model_default_ctx(m);
  size_t n = 0;
  fill_uniform(dt_model_params(m, &n), n, 6, -0.5f, 0.5f);
  float *g = dt_model_grads(m, NULL);
  ASSERT_EQ(dt_model_num_row_tables(m), 4);
  float dout[9];
  fill_uniform(dout, 9, 7, 0.1f, 1.0f); /* all non-zero: every looked-up row gets a non-zero gradient */
  const float *out = NULL;
  dt_model_zero_grad(m);
  ASSERT_OK(dt_model_forward(m, x, 9, &out));
  ASSERT_OK(dt_model_backward(m, dout));
  dt_rows t;
  for (int k = 0; k < 4; k++) {
    ASSERT(table_of(m, c, names[k], &t));
    const unsigned char *want = k % 2 ? items : users;
    const int rows = k % 2 ? ITEMS : USERS;
    ASSERT_EQ(t.rows, rows);
    ASSERT_EQ(t.width, k < 2 ? 4 : 1);
    ASSERT_MSG(same_set(t.list, t.n, want, rows), names[k]);
    ASSERT_EQ(t.refs, 9);
    for (int r = 0; r < rows; r++) { /* the gradient is non-zero exactly on the listed rows */
      const float *row = g + t.off + (size_t)r * (size_t)t.width;
      ASSERT_MSG(all_zero(row, (size_t)t.width) == !want[r], names[k]);
    }
  }
  /* a second backward accumulates: the union of rows, lookups of both */
  ASSERT_OK(dt_model_forward(m, x2, 2, &out));
  ASSERT_OK(dt_model_backward(m, dout));
  users[2] = items[1] = 1;
  for (int k = 0; k < 4; k++) {
    ASSERT(table_of(m, c, names[k], &t));
    ASSERT_MSG(same_set(t.list, t.n, k % 2 ? items : users, k % 2 ? ITEMS : USERS), names[k]);
    ASSERT_EQ(t.refs, 11);
  }
  /* rows another replica touched: marked once, not counted as lookups; out-of-range ids ignored */
  const int ku = table_index(m, "user_factors.weight");
  ASSERT(ku >= 0);
  const int32_t more[5] = {4, 4, 0, USERS, -1};
  dt_model_ctx_rows_touch(m, c, ku, more, 5);
  dt_model_ctx_rows(m, c, ku, &t);
  users[4] = 1;
  ASSERT(same_set(t.list, t.n, users, USERS));
  ASSERT_EQ(t.refs, 11);
  /* zero_grad zeroes the touched rows only (a value planted in an untouched row stays) and every dense tensor */
  ASSERT(table_of(m, c, "item_factors.weight", &t));
  float *untouched = g + t.off + 3 * (size_t)t.width; /* item 3: never looked up */
  ASSERT(all_zero(untouched, (size_t)t.width));
  untouched[1] = 42.0f;
  dt_model_zero_grad(m);
  ASSERT(untouched[1] == 42.0f);
  untouched[1] = 0;
  ASSERT(all_zero(g, n));
  for (int k = 0; k < 4; k++) {
    dt_model_ctx_rows(m, c, k, &t);
    ASSERT_EQ(t.n, 0);
    ASSERT_EQ(t.refs, 0);
  }
  /* and the marks are cleared: the next step lists its rows afresh */
  ASSERT_OK(dt_model_forward(m, x2, 2, &out));
  ASSERT_OK(dt_model_backward(m, dout));
  ASSERT(table_of(m, c, "user_bias.weight", &t));
  const unsigned char users23[USERS] = {0, 0, 1, 1, 0, 0, 0};
  ASSERT(same_set(t.list, t.n, users23, USERS));
  ASSERT_EQ(t.refs, 2);
  /* a deferred zero_grad clears the touched rows and their marks at once, as zero_grad does */
  ASSERT(!all_zero(g, n));
  dt_model_zero_grad_deferred(m);
  for (int k = 0; k < 4; k++) {
    dt_model_ctx_rows(m, c, k, &t);
    ASSERT_EQ(t.n, 0);
    ASSERT_EQ(t.refs, 0);
  }
  ASSERT(all_zero(dt_model_grads(m, NULL), n));
  dt_model_free(m);
}

/* A second context keeps its own rows; the model's own context sees none of them. */
TEST(touched_rows_per_context) {
  static const int32_t x[6] = {1, 2, 0, 2, 3, 1}; /* rows {1, 2} of a, {2, 3} of b, {0, 1} of c */
  dt_model *m = NULL;
  ASSERT_OK(emb_model(0.0f, &m));
  dt_model_ctx *c2 = NULL;
  ASSERT_OK(dt_model_ctx_new(m, 4, 0, &c2));
  float dout[4] = {1, -1, 0.5f, 2};
  const float *out = NULL;
  dt_model_ctx_zero_grad(m, c2);
  ASSERT_OK(dt_model_ctx_forward(m, c2, x, 2, &out));
  ASSERT_OK(dt_model_ctx_backward(m, c2, dout));
  ASSERT_EQ(dt_model_num_row_tables(m), 3);
  for (int k = 0; k < 3; k++) {
    dt_rows mine, model;
    dt_model_ctx_rows(m, c2, k, &mine);
    dt_model_ctx_rows(m, dt_model_default_ctx(m), k, &model);
    ASSERT_EQ(mine.refs, 2);
    ASSERT_EQ(mine.n, 2);
    ASSERT_EQ(model.n, 0);
    ASSERT_EQ(model.refs, 0);
  }
  dt_model_ctx_zero_grad(m, c2);
  ASSERT(all_zero(dt_model_ctx_grads(c2), dt_model_num_params(m)));
  dt_model_ctx_free(c2);
  dt_model_free(m);
}

/* ---- index errors ----------------------------------------------------------------------------------------------- */

TEST(out_of_range_index_names_the_sample) {
  dt_model *m = NULL;
  ASSERT_OK(mf_model(3, 0.0f, &m));
  int32_t x[12] = {0, 1, 1, 2, 2, 3, USERS, 4, 4, 5, 5, 6};
  const float *out = NULL;
  ASSERT_STATUS(dt_model_forward(m, x, 6, &out), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "sample 3") && strstr(dt_last_error(), "user"), dt_last_error());
  x[6] = 3;
  x[11] = ITEMS;
  ASSERT_STATUS(dt_model_forward(m, x, 6, &out), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "sample 5") && strstr(dt_last_error(), "item"), dt_last_error());
  x[11] = -1;
  ASSERT_STATUS(dt_model_forward(m, x, 6, &out), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "sample 5"), dt_last_error());
  x[11] = ITEMS - 1;
  ASSERT_OK(dt_model_forward(m, x, 6, &out)); /* the model is fine after a refused batch */
  dt_model_free(m);

  ASSERT_OK(emb_model(0.0f, &m));
  int32_t e[9] = {0, 0, 0, 4, 3, 5, 1, 4, 2}; /* table b has 4 rows */
  ASSERT_STATUS(dt_model_forward(m, e, 3, &out), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "sample 2") && strstr(dt_last_error(), "b index 4"), dt_last_error());
  e[7] = 3;
  ASSERT_OK(dt_model_forward(m, e, 3, &out));
  dt_model_free(m);
}

/* ---- dt_optim_step_rows ------------------------------------------------------------------------------------------ */

/* An arena of 3 dense floats, table A (6 x 4), 2 dense, table B (5 x 2), 3 dense. */
#define ARENA (3 + 24 + 2 + 10 + 3)
static void two_tables(dt_rows t[2]) {
  t[0] = (dt_rows){.tensor = 0, .off = 3, .rows = 6, .width = 4};
  t[1] = (dt_rows){.tensor = 1, .off = 29, .rows = 5, .width = 2};
}

TEST(step_rows_refuses_adamw_weight_decay_momentum) {
  static const struct {
    dt_optim_kind kind;
    float wd, momentum;
    const char *says;
  } bad[] = {{DT_OPTIM_ADAMW, -1, 0, "adamw"},        {DT_OPTIM_ADAMW, 0, 0, "adamw"},
             {DT_OPTIM_ADAM, 0.01f, 0, "weight decay"}, {DT_OPTIM_SGD, 0.01f, 0, "weight decay"},
             {DT_OPTIM_SGD, 0, 0.9f, "momentum"}};
  float p[ARENA], g[ARENA], p0[ARENA];
  fill_uniform(p, ARENA, 8, -1, 1);
  fill_uniform(g, ARENA, 9, -1, 1);
  memcpy(p0, p, sizeof p);
  dt_rows t[2];
  two_tables(t);
  const int32_t rows_a[2] = {1, 4}, rows_b[1] = {2};
  t[0].list = rows_a, t[0].n = 2, t[0].refs = 3;
  t[1].list = rows_b, t[1].n = 1, t[1].refs = 1;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dt_optim_config c;
    dt_optim_config_default(bad[i].kind, &c);
    if (bad[i].wd >= 0) c.weight_decay = bad[i].wd;
    c.momentum = bad[i].momentum;
    ASSERT_STATUS(dt_optim_rows_check(&c), DT_INVALID_ARGUMENT);
    ASSERT_MSG(strstr(dt_last_error(), bad[i].says) != NULL, dt_last_error());
    dt_optim *o = NULL;
    ASSERT_OK(dt_optim_new(&c, ARENA, &o));
    ASSERT_STATUS(dt_optim_step_rows(o, p, g, 0.1f, t, 2), DT_INVALID_ARGUMENT);
    ASSERT_MSG(strstr(dt_last_error(), bad[i].says) != NULL, dt_last_error());
    ASSERT_EQ(dt_optim_step_count(o), 0);
    ASSERT(memcmp(p, p0, sizeof p) == 0);
    dt_optim_free(o);
  }
  /* allowed: plain SGD (dampening alone is harmless without momentum) and Adam */
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_SGD, &c);
  ASSERT_OK(dt_optim_rows_check(&c));
  dt_optim_config_default(DT_OPTIM_ADAM, &c);
  ASSERT_OK(dt_optim_rows_check(&c));
  /* tables that overlap, run past the arena, or a bad learning rate */
  dt_optim *o = NULL;
  ASSERT_OK(dt_optim_new(&c, ARENA, &o));
  dt_rows over[2];
  memcpy(over, t, sizeof over);
  over[1].off = 20;
  ASSERT_STATUS(dt_optim_step_rows(o, p, g, 0.1f, over, 2), DT_INVALID_ARGUMENT);
  over[1].off = ARENA - 8;
  ASSERT_STATUS(dt_optim_step_rows(o, p, g, 0.1f, over, 2), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_optim_step_rows(o, p, g, -1.0f, t, 2), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_optim_step_rows(o, p, g, NAN, t, 2), DT_INVALID_ARGUMENT);
  ASSERT_EQ(dt_optim_step_count(o), 0);
  ASSERT(memcmp(p, p0, sizeof p) == 0);
  dt_optim_free(o);
}

/* Three Adam steps over different touched rows, with non-zero gradients everywhere (so only the row lists keep
 * untouched rows out): untouched rows and their moments keep their bits, touched rows and moments move, the dense
 * spans get exactly dense Adam's update; no tables is exactly dt_optim_step. */
TEST(step_rows_adam_leaves_untouched_rows_and_moments) {
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_ADAM, &c);
  dt_optim *o = NULL, *dense = NULL;
  ASSERT_OK(dt_optim_new(&c, ARENA, &o));
  ASSERT_OK(dt_optim_new(&c, ARENA, &dense));
  float p[ARENA], pd[ARENA], g[ARENA], before[3][ARENA];
  fill_uniform(p, ARENA, 10, -1, 1);
  memcpy(pd, p, sizeof p);
  dt_rows t[2];
  two_tables(t);
  static const int32_t a_rows[3][3] = {{1, 4, 0}, {4, 2, 0}, {5, 0, 0}}, b_rows[3][2] = {{0, 3}, {3, 0}, {1, 0}};
  static const int a_n[3] = {2, 2, 1}, b_n[3] = {2, 1, 1};
  const char *name;
  static const size_t dense_at[3][2] = {{0, 3}, {27, 29}, {39, ARENA}}; /* outside the tables */
  for (int s = 0; s < 3; s++) {
    fill_uniform(g, ARENA, 20 + (uint64_t)s, -1, 1);
    t[0].list = a_rows[s], t[0].n = a_n[s], t[0].refs = a_n[s];
    t[1].list = b_rows[s], t[1].n = b_n[s], t[1].refs = b_n[s];
    memcpy(before[0], p, sizeof p);
    memcpy(before[1], dt_optim_state(o, 0, &name), sizeof p);
    memcpy(before[2], dt_optim_state(o, 1, &name), sizeof p);
    ASSERT_OK(dt_optim_step_rows(o, p, g, 0.01f, t, 2));
    ASSERT_OK(dt_optim_step(dense, pd, g, 0.01f));
    ASSERT_EQ(dt_optim_step_count(o), s + 1);
    const float *now[3] = {p, dt_optim_state(o, 0, &name), dt_optim_state(o, 1, &name)};
    for (int k = 0; k < 2; k++)
      for (int64_t r = 0; r < t[k].rows; r++) {
        int touched = 0;
        for (int64_t i = 0; i < t[k].n; i++) touched |= t[k].list[i] == r;
        const size_t at = t[k].off + (size_t)r * (size_t)t[k].width, w = (size_t)t[k].width;
        for (int v = 0; v < 3; v++) {
          const int same = memcmp(now[v] + at, before[v] + at, w * sizeof(float)) == 0;
          if (same == touched) FAIL_("step %d table %d row %lld (%s) buffer %d: %s", s, k, (long long)r,
                                     touched ? "touched" : "untouched", v, same ? "unchanged" : "changed");
        }
      }
    for (int d = 0; d < 3; d++)
      for (size_t i = dense_at[d][0]; i < dense_at[d][1]; i++) ASSERT(p[i] == pd[i]);
  }
  /* no tables: the dense step, bit for bit (and the shared step count) */
  ASSERT_OK(dt_optim_step_rows(o, p, g, 0.01f, NULL, 0));
  ASSERT_OK(dt_optim_step(dense, pd, g, 0.01f));
  ASSERT_EQ(dt_optim_step_count(o), 4);
  const float *rows_avg = dt_optim_state(o, 0, &name), *dense_avg = dt_optim_state(dense, 0, &name);
  for (int d = 0; d < 3; d++)
    for (size_t i = dense_at[d][0]; i < dense_at[d][1]; i++) ASSERT(p[i] == pd[i] && rows_avg[i] == dense_avg[i]);
  dt_optim *o2 = NULL, *o3 = NULL;
  ASSERT_OK(dt_optim_new(&c, ARENA, &o2));
  ASSERT_OK(dt_optim_new(&c, ARENA, &o3));
  float q[ARENA], q2[ARENA];
  fill_uniform(q, ARENA, 13, -1, 1);
  memcpy(q2, q, sizeof q);
  ASSERT_OK(dt_optim_step_rows(o2, q, g, 0.01f, NULL, 0));
  ASSERT_OK(dt_optim_step(o3, q2, g, 0.01f));
  ASSERT(memcmp(q, q2, sizeof q) == 0);
  dt_optim_free(o3);
  dt_optim_free(o2);
  dt_optim_free(dense);
  dt_optim_free(o);
}

/* Row-wise SGD: touched rows p - lr g, untouched rows keep their bits even where their gradient is not zero. */
TEST(step_rows_sgd_updates_touched_rows_only) {
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_SGD, &c);
  dt_optim *o = NULL;
  ASSERT_OK(dt_optim_new(&c, ARENA, &o));
  float p[ARENA], p0[ARENA], g[ARENA];
  fill_uniform(p, ARENA, 11, -1, 1);
  fill_uniform(g, ARENA, 12, -1, 1);
  memcpy(p0, p, sizeof p);
  dt_rows t[2];
  two_tables(t);
  const int32_t a[2] = {5, 1}, b[1] = {4};
  t[0].list = a, t[0].n = 2, t[0].refs = 7;
  t[1].list = b, t[1].n = 1, t[1].refs = 1;
  ASSERT_OK(dt_optim_step_rows(o, p, g, 0.5f, t, 2));
  for (size_t i = 0; i < ARENA; i++) {
    int touched = i < 3 || (i >= 27 && i < 29) || i >= 39; /* dense spans */
    if (i >= 3 && i < 27) touched = (i - 3) / 4 == 5 || (i - 3) / 4 == 1;
    if (i >= 29 && i < 39) touched = (i - 29) / 2 == 4;
    if (touched) ASSERT(p[i] == fmaf(g[i], -0.5f, p0[i]));
    else ASSERT(p[i] == p0[i]);
  }
  dt_optim_free(o);
}

/* ---- dp over row tables ------------------------------------------------------------------------------------------ */

/* dt_dp with 2 and 3 workers steps mf like one whole-batch step, over batches whose workers touch different rows,
 * dense and row-wise: each step's gradient (within 1e-6) and the parameters after 6 Adam steps (1e-5). */
TEST(dp_workers_step_mf_as_one_batch) {
  const dt_task_config tc = {.kind = DT_TASK_REGRESSION, .outputs = 1, .regression_loss = DT_LOSS_MSE};
  dt_task *task = NULL;
  ASSERT_OK(dt_task_new(&tc, &task));
  int32_t x[6][24];
  float y[6][12];
  dt_rng r;
  dt_rng_init(&r, 31, 0);
  for (int s = 0; s < 6; s++)
    for (int b = 0; b < 12; b++) {
      x[s][2 * b] = (int32_t)dt_rng_below(&r, USERS);
      x[s][2 * b + 1] = (int32_t)dt_rng_below(&r, ITEMS);
      y[s][b] = 1.0f + (float)dt_rng_below(&r, 5);
    }
  for (int rows = 0; rows < 2; rows++)
    for (int workers = 2; workers <= 3; workers++) {
      dt_model *a = NULL, *b = NULL;
      ASSERT_OK(mf_model(3, 0.05f, &a));
      ASSERT_OK(mf_model(3, 0.05f, &b));
      size_t n = 0;
      float *pa = dt_model_params(a, &n), *pb = dt_model_params(b, NULL);
      float *ga = dt_model_grads(a, NULL), *gb = dt_model_grads(b, NULL);
      fill_uniform(pa, n, 32, -0.5f, 0.5f);
      memcpy(pb, pa, n * sizeof *pa);
      dt_dp *dp = NULL;
      dt_optim *oa = NULL, *ob = NULL;
      dt_optim_config oc;
      dt_optim_config_default(DT_OPTIM_ADAM, &oc);
      ASSERT_OK(dt_dp_new(b, workers, 16, &dp));
      ASSERT_OK(dt_optim_new(&oc, n, &oa));
      ASSERT_OK(dt_optim_new(&oc, n, &ob));
      dt_rows ta[4], tb[4];
      for (int s = 0; s < 6; s++) {
        const int B = s == 3 ? 5 : 12; /* one batch of uneven slices */
        float dout[12], loss_a, loss_b;
        const float *out = NULL;
        dt_model_zero_grad(a);
        ASSERT_OK(dt_model_forward(a, x[s], B, &out));
        ASSERT_OK(dt_task_loss(task, out, y[s], B, 1, &loss_a, dout));
        ASSERT_OK(dt_model_backward(a, dout));
        if (s % 2) /* DP's reduce then stores the sum (dense blocks deferred, touched rows cleared), else adds */
          dt_model_zero_grad_deferred(b);
        else
          dt_model_zero_grad(b);
        ASSERT_OK(dt_dp_train_step(dp, task, x[s], y[s], B, &loss_b, NULL));
        ASSERT_NEAR(loss_b, loss_a, 1e-6);
        for (size_t i = 0; i < n; i++)
          if (!(fabsf(ga[i] - gb[i]) <= 1e-6f * fmaxf(1.0f, fabsf(ga[i]))))
            FAIL_("%d workers, %s, step %d: gradient %zu: dp %.9g, one batch %.9g", workers, rows ? "rows" : "dense",
                  s, i, gb[i], ga[i]);
        for (int k = 0; k < 4; k++) {
          dt_model_ctx_rows(a, dt_model_default_ctx(a), k, &ta[k]);
          dt_model_ctx_rows(b, dt_model_default_ctx(b), k, &tb[k]);
          const int rows_k = (int)ta[k].rows;
          ASSERT(rows_k >= USERS && rows_k <= ITEMS);
          unsigned char want[ITEMS] = {0};
          for (int64_t i = 0; i < ta[k].n; i++) want[ta[k].list[i]] = 1;
          ASSERT(same_set(tb[k].list, tb[k].n, want, rows_k)); /* the model's rows: every worker's */
        }
        ASSERT_OK(rows ? dt_optim_step_rows(oa, pa, ga, 0.01f, ta, 4) : dt_optim_step(oa, pa, ga, 0.01f));
        ASSERT_OK(rows ? dt_optim_step_rows(ob, pb, gb, 0.01f, tb, 4) : dt_optim_step(ob, pb, gb, 0.01f));
      }
      for (size_t i = 0; i < n; i++) ASSERT_NEAR(pb[i], pa[i], 1e-5);
      dt_optim_free(ob);
      dt_optim_free(oa);
      dt_dp_free(dp);
      dt_model_free(b);
      dt_model_free(a);
    }
  dt_task_free(task);
}

TEST_MAIN(TEST_ENTRY(mf_gradients_match_finite_differences), TEST_ENTRY(embeddings_gradients_match_finite_differences),
          TEST_ENTRY(touched_rows_listed_once_refs_count_lookups_zero_grad_clears), TEST_ENTRY(touched_rows_per_context),
          TEST_ENTRY(out_of_range_index_names_the_sample), TEST_ENTRY(step_rows_refuses_adamw_weight_decay_momentum),
          TEST_ENTRY(step_rows_adam_leaves_untouched_rows_and_moments), TEST_ENTRY(step_rows_sgd_updates_touched_rows_only),
          TEST_ENTRY(dp_workers_step_mf_as_one_batch))

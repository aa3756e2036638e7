/* DDP for row tables (embeddings): a step's gradient exchanged as the touched rows (all-gather) or the dense table. */
#include <string.h>

#include "core/impl.h"
#include "parallel/parallel-impl.h"

/* Rows a rank may have touched this step: the step's lookups bound them, and the lookups are the same on
 * every rank (DistributedSampler gives each rank the same number of samples), so every rank computes the
 * same payload size and makes the same choice without a message. */
static int64_t capacity(const dt_rows *t) { return t->refs < t->rows ? t->refs : t->rows; }

int dt_ddp_rows_choose(const dt_rows *t, int world, dt_rows_exchange mode) {
  if (mode != DT_ROWS_AUTO) return mode == DT_ROWS_SPARSE;
  /* words each rank receives: the others' payloads, against a ring all-reduce's 2 (world - 1) / world of the
   * table and its touched mask */
  const double sparse = (double)(world - 1) * (double)(1 + capacity(t) * (1 + t->width));
  const double dense = 2.0 * (double)(world - 1) / (double)world * (double)t->rows * (double)(t->width + 1);
  return sparse < dense;
}

/* The table's gradient and a 0/1 mask of its touched rows, side by side in one all-reduce: the mask's mean
 * is > 0 exactly on the rows some rank touched, even where their gradients sum to zero. */
static dt_status launch_dense(dt_ddp_rows *x, dt_group *g, const dt_rows *t, const float *grads, dt_work **w,
                              double *bytes) {
  const size_t n = (size_t)(t->rows * t->width), count = n + (size_t)t->rows;
  if (!x->dense) DT_CHECK(dt_alloc_array(count, sizeof(float), "row exchange", (void **)&x->dense));
  memcpy(x->dense, grads + t->off, n * sizeof(float));
  float *mask = x->dense + n;
  memset(mask, 0, (size_t)t->rows * sizeof(float));
  for (int64_t i = 0; i < t->n; i++) mask[t->list[i]] = 1.0f;
  *bytes = (double)count * sizeof(float);
  return dt_allreduce(g, x->dense, x->dense, count, DT_F32, DT_AVG, w);
}

dt_status dt_ddp_rows_launch(dt_ddp_rows *x, dt_group *g, dt_model *m, float *grads, dt_rows_exchange mode,
                             dt_work **w, double *bytes) {
  dt_rows t;
  dt_model_ctx_rows(m, dt_model_default_ctx(m), x->table, &t);
  const int world = dt_group_size(g), rank = dt_group_rank(g);
  x->sparse = dt_ddp_rows_choose(&t, world, mode);
  if (!x->sparse) return launch_dense(x, g, &t, grads, w, bytes);
  const int64_t cap = capacity(&t);
  x->per = (size_t)(1 + cap * (1 + t.width));
  DT_CHECK(dt_grow_array((void **)&x->payload, &x->cap_words, 0, (int64_t)x->per * world, 4096, sizeof(int32_t),
                         "row exchange"));
  int32_t *mine = x->payload + (size_t)rank * x->per;
  mine[0] = (int32_t)t.n;
  memcpy(mine + 1, t.list, (size_t)t.n * sizeof(int32_t));
  float *vals = (float *)(mine + 1 + cap);
  for (int64_t i = 0; i < t.n; i++)
    memcpy(vals + i * t.width, grads + t.off + (size_t)t.list[i] * (size_t)t.width, (size_t)t.width * sizeof(float));
  *bytes = (double)x->per * sizeof(int32_t);
  return dt_allgather(g, mine, x->payload, x->per * (size_t)world, DT_I32, w);
}

/* After a dense exchange: the averaged table back in place, and the rows any rank touched marked. */
static void finish_dense(dt_ddp_rows *x, dt_model *m, const dt_rows *t, float *grads) {
  const size_t n = (size_t)(t->rows * t->width);
  memcpy(grads + t->off, x->dense, n * sizeof(float));
  const float *mask = x->dense + n;
  dt_model_ctx *c = dt_model_default_ctx(m);
  for (int64_t r = 0; r < t->rows; r++)
    if (mask[r] > 0) {
      const int32_t row = (int32_t)r;
      dt_model_ctx_rows_touch(m, c, x->table, &row, 1);
    }
}

dt_status dt_ddp_rows_finish(dt_ddp_rows *x, dt_model *m, int world, float *grads) {
  dt_model_ctx *c = dt_model_default_ctx(m);
  dt_rows t;
  dt_model_ctx_rows(m, c, x->table, &t);
  if (!x->sparse) {
    finish_dense(x, m, &t, grads);
    return DT_OK;
  }
  const size_t w = (size_t)t.width;
  float *g = grads + t.off;
  for (int64_t i = 0; i < t.n; i++) memset(g + (size_t)t.list[i] * w, 0, w * sizeof(float));
  const int64_t cap = (int64_t)(x->per - 1) / (1 + t.width);
  for (int r = 0; r < world; r++) { /* a peer's payload is checked whole before any of it is used */
    const int32_t *p = x->payload + (size_t)r * x->per;
    int bad = p[0] < 0 || p[0] > cap;
    for (int64_t i = 0; !bad && i < p[0]; i++) bad = p[1 + i] < 0 || p[1 + i] >= t.rows;
    if (bad)
      return dt_error(DT_CORRUPT, "ddp: rank %d sent an embedding-row payload that is not one (%d rows of capacity "
                                  "%lld, or a row outside [0, %lld))", r, p[0], (long long)cap, (long long)t.rows);
  }
  for (int r = 0; r < world; r++) { /* rank order: the sums' bits do not depend on who gathers */
    const int32_t *p = x->payload + (size_t)r * x->per, *ids = p + 1;
    const float *vals = (const float *)(p + 1 + cap);
    const int64_t n = p[0];
    for (int64_t i = 0; i < n; i++) {
      float *row = g + (size_t)ids[i] * w;
      for (size_t j = 0; j < w; j++) row[j] += vals[(size_t)i * w + j];
    }
    dt_model_ctx_rows_touch(m, c, x->table, ids, n);
  }
  dt_model_ctx_rows(m, c, x->table, &t); /* the union */
  const float scale = 1.0f / (float)world;
  for (int64_t i = 0; i < t.n; i++) {
    float *row = g + (size_t)t.list[i] * w;
    for (size_t j = 0; j < w; j++) row[j] *= scale;
  }
  return DT_OK;
}

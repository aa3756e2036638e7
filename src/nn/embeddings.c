/* Embeddings layer: column k of an index input looks up a row of table k (torch.nn.Embedding per column), concatenated. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

#define MAX_TABLES DT_LAYER_MAX_TENSORS
#define TABLE_NAME_MAX 40

typedef struct embeddings_priv {
  int n, dim;
  int64_t rows[MAX_TABLES];
  char names[MAX_TABLES][TABLE_NAME_MAX];
  float std, l2;
} embeddings_priv;

/* The layer reads an index input of n columns; DT_SHAPE_MISMATCH naming the layer otherwise. */
dt_status dt_layer_check_index_input(const dt_layer *l, int n) {
  char s[96];
  if (l->in_dtype != DT_I32)
    return dt_error(DT_SHAPE_MISMATCH, "%s: %s reads index inputs (i32); it must come first in a model of index inputs",
                    l->name[0] ? l->name : "model", l->ops->kind);
  if (l->in_ndim != 1 || l->in_shape[0] != n)
    return dt_error(DT_SHAPE_MISMATCH, "%s: %s reads (%d,) indices per sample, got %s", l->name[0] ? l->name : "model",
                    l->ops->kind, n, dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  return DT_OK;
}

/* Column col of the batch's indices within [0, rows); DT_INVALID_ARGUMENT naming the sample otherwise. */
dt_status dt_layer_check_indices(const dt_layer *l, const int32_t *x, int n, int col, int64_t rows, int batch,
                                 const char *what) {
  int b = dt_index_check(x + col, (size_t)n, batch, rows);
  if (b < 0) return DT_OK;
  return dt_error(DT_INVALID_ARGUMENT, "%s: %s index %d of sample %d is outside [0, %lld) (%s)",
                  l->name[0] ? l->name : "model", what, x[(size_t)b * (size_t)n + (size_t)col], b, (long long)rows,
                  "data with more ids than the model was built for?");
}

/* grads of the looked-up rows += 2 * l2 * w * row: the gradient of l2 * w * |row|^2 per lookup. */
void dt_layer_rows_l2(float *grads, const float *table, int width, const int32_t *idx, size_t stride, int B, float coef) {
  for (int b = 0; b < B; b++) {
    const size_t r = (size_t)idx[(size_t)b * stride] * (size_t)width;
    for (int j = 0; j < width; j++) grads[r + (size_t)j] += coef * table[r + (size_t)j];
  }
}

static dt_status embeddings_infer(dt_layer *l) {
  const embeddings_priv *p = l->priv;
  DT_CHECK(dt_layer_check_index_input(l, p->n));
  l->out_ndim = 1;
  l->out_shape[0] = (int64_t)p->n * p->dim;
  char suffix[TABLE_NAME_MAX + 8];
  for (int k = 0; k < p->n; k++) {
    snprintf(suffix, sizeof suffix, "%s.weight", p->names[k]);
    DT_CHECK(dt_layer_declare_rows(l, suffix, p->rows[k], p->dim, p->std));
  }
  return DT_OK;
}

static dt_status embeddings_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const embeddings_priv *p = l->priv;
  const int32_t *x = (const int32_t *)in;
  for (int k = 0; k < p->n; k++) {
    DT_CHECK(dt_layer_check_indices(l, x, p->n, k, p->rows[k], io->batch, p->names[k]));
    dt_embedding_gather(out + (size_t)k * (size_t)p->dim, (size_t)p->n * (size_t)p->dim, io->params + l->t[k].off,
                        p->dim, x + k, (size_t)p->n, io->batch);
  }
  return DT_OK;
}

static void embeddings_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                                const float *dout, float *dinp) {
  (void)out;
  const embeddings_priv *p = l->priv;
  const int32_t *x = (const int32_t *)in;
  const size_t n = (size_t)p->n;
  for (int k = 0; k < p->n; k++) {
    float *g = io->grads + l->t[k].off;
    dt_embedding_scatter_add(g, p->dim, dout + (size_t)k * (size_t)p->dim, n * (size_t)p->dim, x + k, n, io->batch);
    if (p->l2 > 0) dt_layer_rows_l2(g, io->params + l->t[k].off, p->dim, x + k, n, io->batch, 2 * p->l2 * io->loss_weight);
    for (int b = 0; b < io->batch && io->rows[k]; b++) dt_row_set_touch(io->rows[k], x[(size_t)b * n + (size_t)k]);
  }
  if (dinp) memset(dinp, 0, (size_t)io->batch * n * sizeof(float)); /* indices have no gradient */
}

const dt_layer_ops dt_embeddings_ops = {
    .kind = "Embeddings", .infer = embeddings_infer, .forward = embeddings_forward, .backward = embeddings_backward};

dt_status dt_model_add_embeddings(dt_model *m, const char *name, int n, const char *const *names, const int64_t *rows,
                                  int dim, float std, float l2) {
  if (n < 1 || n > MAX_TABLES || !names || !rows || dim < 1 || !(std >= 0) || !(l2 >= 0))
    return dt_error(DT_INVALID_ARGUMENT,
                    "%s: Embeddings of %d tables (1..%d) of width %d (>= 1), std %g and l2 %g (>= 0)", name ? name : "?",
                    n, MAX_TABLES, dim, (double)std, (double)l2);
  embeddings_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "Embeddings", (void **)&p));
  p->n = n;
  p->dim = dim;
  p->std = std;
  p->l2 = l2;
  for (int k = 0; k < n; k++) {
    if (!names[k] || strlen(names[k]) >= TABLE_NAME_MAX) {
      dt_free(p);
      return dt_error(DT_INVALID_ARGUMENT, "%s: table name %d missing or longer than %d", name ? name : "?", k,
                      TABLE_NAME_MAX - 1);
    }
    snprintf(p->names[k], sizeof p->names[k], "%s", names[k]);
    p->rows[k] = rows[k];
  }
  return dt_model_add_layer(m, &dt_embeddings_ops, name, p);
}

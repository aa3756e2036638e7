/* Cold start: the validation's users and items (index columns) that no training sample has, said once. */
#include <stdio.h>

#include "core/impl.h"
#include "train/run.h"

typedef struct marker {
  const dt_data_info *in;
  unsigned char *const *seen; /* (n_index columns) (index_size[c]) */
} marker;

/* Marks seen[c][index] for every index of column c of a chunk's "x" field. */
static dt_status mark_chunk(void *user, void *const *fields, int n) {
  const marker *m = user;
  const int cols = m->in->n_index;
  const int32_t *x = fields[m->in->input];
  for (int i = 0; i < n; i++)
    for (int c = 0; c < cols; c++) {
      const int32_t v = x[(size_t)i * (size_t)cols + (size_t)c];
      if (v >= 0 && v < m->in->index_size[c]) m->seen[c][v] = 1;
    }
  return DT_OK;
}

static dt_status mark(const dt_dataset *ds, unsigned char *const *seen) {
  marker m = {.in = dt_dataset_info(ds), .seen = seen};
  return dt_dataset_scan(ds, mark_chunk, &m);
}

dt_status dt_run_cold_start(dt_run *r) {
  const dt_data_info *in = dt_dataset_info(r->train);
  const int cols = in->n_index;
  if (!r->val || !cols || !r->lead || !r->cfg->progress || cols > 2) return DT_OK;
  /* one index per column (users, items); token ids (text: x of (3, max_len)) are no ids of users */
  const dt_field *x = &in->field[in->input];
  if (x->ndim != 1 || x->shape[0] != cols) return DT_OK;
  unsigned char *seen[2] = {NULL, NULL}, *val_seen[2] = {NULL, NULL};
  dt_status st = DT_OK;
  for (int c = 0; c < cols && st == DT_OK; c++) {
    st = dt_alloc_array((size_t)in->index_size[c], 1, "cold-start check", (void **)&seen[c]);
    if (st == DT_OK) st = dt_alloc_array((size_t)in->index_size[c], 1, "cold-start check", (void **)&val_seen[c]);
  }
  if (st == DT_OK) st = mark(r->train, seen);
  if (st == DT_OK) st = mark(r->val, val_seen);
  int64_t cold[2] = {0, 0};
  for (int c = 0; c < cols && st == DT_OK; c++)
    for (int64_t i = 0; i < in->index_size[c]; i++) cold[c] += val_seen[c][i] && !seen[c][i];
  if (st == DT_OK && (cold[0] || cold[1]))
    fprintf(r->cfg->progress,
            "cold start: %lld users and %lld items of the validation data have no training sample; their embeddings "
            "get no gradient from the loss (they stay near their N(0, 0.01) start), so they are predicted from the "
            "biases (mf) or near-zero embeddings (ncf)\n",
            (long long)cold[0], (long long)cold[1]);
  for (int c = 0; c < 2; c++) {
    dt_free(seen[c]);
    dt_free(val_seen[c]);
  }
  return st;
}

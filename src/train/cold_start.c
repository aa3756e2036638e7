/* Cold start: the validation's users and items (index columns) that no training sample has, said once. */
#include <stdio.h>

#include "core/impl.h"
#include "train/run.h"

#define CHUNK 4096

/* Marks seen[k][index] for every index of column k of ds's "x" field. */
static dt_status mark(const dt_dataset *ds, unsigned char *const *seen, int cols) {
  const dt_data_info *in = dt_dataset_info(ds);
  void *bufs[DT_MAX_FIELDS] = {0};
  int64_t *idx = NULL;
  dt_status st = dt_alloc_array(CHUNK, sizeof *idx, "cold-start check", (void **)&idx);
  for (int f = 0; f < in->n_fields && st == DT_OK; f++)
    st = dt_alloc_array(CHUNK, dt_field_bytes(&in->field[f]), "cold-start check", &bufs[f]);
  const int64_t n = dt_dataset_size(ds);
  for (int64_t lo = 0; lo < n && st == DT_OK; lo += CHUNK) {
    const int k = n - lo < CHUNK ? (int)(n - lo) : CHUNK;
    for (int i = 0; i < k; i++) idx[i] = lo + i;
    dt_dataset_fetch(ds, idx, k, bufs);
    const int32_t *x = bufs[in->input];
    for (int i = 0; i < k; i++)
      for (int c = 0; c < cols; c++) {
        const int32_t v = x[(size_t)i * (size_t)cols + (size_t)c];
        if (v >= 0 && v < in->index_size[c]) seen[c][v] |= 1;
      }
  }
  for (int f = 0; f < in->n_fields; f++) dt_free(bufs[f]);
  dt_free(idx);
  return st;
}

dt_status dt_run_cold_start(dt_run *r) {
  const dt_data_info *in = dt_dataset_info(r->train);
  const int cols = in->n_index;
  if (!r->val || !cols || !r->lead || !r->cfg->progress || cols > 2) return DT_OK;
  unsigned char *seen[2] = {NULL, NULL}, *val_seen[2] = {NULL, NULL};
  dt_status st = DT_OK;
  for (int c = 0; c < cols && st == DT_OK; c++) {
    st = dt_alloc_array((size_t)in->index_size[c], 1, "cold-start check", (void **)&seen[c]);
    if (st == DT_OK) st = dt_alloc_array((size_t)in->index_size[c], 1, "cold-start check", (void **)&val_seen[c]);
  }
  if (st == DT_OK) st = mark(r->train, seen, cols);
  if (st == DT_OK) st = mark(r->val, val_seen, cols);
  int64_t cold[2] = {0, 0};
  for (int c = 0; c < cols && st == DT_OK; c++)
    for (int64_t i = 0; i < in->index_size[c]; i++) cold[c] += val_seen[c][i] && !seen[c][i];
  if (st == DT_OK && (cold[0] || cold[1]))
    fprintf(r->cfg->progress,
            "cold start: %lld users and %lld items of the validation data have no training sample; their embeddings "
            "keep their initial N(0, 0.01) values, so they are predicted from the biases (mf) or near-zero "
            "embeddings (ncf)\n",
            (long long)cold[0], (long long)cold[1]);
  for (int c = 0; c < 2; c++) {
    dt_free(seen[c]);
    dt_free(val_seen[c]);
  }
  return st;
}

/* Ranking evaluation (HR@K, NDCG@K): the candidates of each query scored by the model, the positive ranked among them. */
#include <string.h>

#include "core/impl.h"
#include "dtrain/model_ctx.h"
#include "train/run.h"

/* Finds the validation split's ranking protocol, if it has one, and the buffers to score it. */
dt_status dt_run_rank_open(dt_run *r) {
  memset(&r->ranking, 0, sizeof r->ranking);
  if (!r->val || dt_dataset_ranking(r->val, &r->ranking) != DT_OK) {
    dt_clear_error();
    memset(&r->ranking, 0, sizeof r->ranking);
    return DT_OK;
  }
  const int batch = r->cfg->batch_size;
  DT_CHECK(dt_alloc_array((size_t)batch * 2, sizeof(int32_t), "ranking pairs", (void **)&r->rank_pairs));
  return dt_alloc_array((size_t)DT_RANK_BLOCK * (size_t)r->ranking.per, sizeof(float), "ranking scores",
                        (void **)&r->rank_scores);
}

int dt_run_rank_k(const dt_run *r) { return r->ranking.n > 0 ? DT_RANK_K : 0; }

dt_status dt_rank_score(const dt_ranking *rk, const int64_t *q, int nq, int batch, dt_forward_fn fwd, void *user,
                        int32_t *pairs, float *scores) {
  const int64_t total = (int64_t)nq * rk->per;
  for (int64_t lo = 0; lo < total; lo += batch) {
    const int n = total - lo < batch ? (int)(total - lo) : batch;
    for (int i = 0; i < n; i++) {
      const int64_t k = lo + i, query = q[k / rk->per];
      pairs[2 * i] = rk->user[query];
      pairs[2 * i + 1] = rk->items[query * rk->per + k % rk->per];
    }
    const float *out = NULL;
    DT_CHECK(fwd(user, pairs, n, &out));
    memcpy(scores + lo, out, (size_t)n * sizeof(float));
  }
  return DT_OK;
}

/* The strategy's forward as a dt_forward_fn. */
static dt_status run_forward(void *user, const void *x, int n, const float **out) {
  dt_run *r = user;
  return r->strategy->forward(r, x, n, out);
}

dt_status dt_run_rank_eval(dt_run *r) {
  if (!r->ranking.n) return DT_OK;
  int64_t q[DT_RANK_BLOCK];
  int nq = 0;
  for (int64_t query = r->rank; query < r->ranking.n; query += r->world) {
    q[nq++] = query;
    if (nq < DT_RANK_BLOCK && query + r->world < r->ranking.n) continue;
    DT_CHECK(dt_rank_score(&r->ranking, q, nq, r->cfg->batch_size, run_forward, r, r->rank_pairs, r->rank_scores));
    DT_CHECK(dt_metric_acc_add_ranking(r->eval_acc, r->rank_scores, nq, r->ranking.per));
    nq = 0;
  }
  return DT_OK;
}

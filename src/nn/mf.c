/* Biased matrix factorisation (Koren/Funk): rating(u, i) = mu + b_u + b_i + <p_u, q_i>, over row tables. */
#include "core/impl.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct mf_priv {
  int64_t users, items;
  int factors;
  float std, mean, l2;
} mf_priv;

enum { USER_FACTORS, ITEM_FACTORS, USER_BIAS, ITEM_BIAS, GLOBAL_BIAS };

static dt_status mf_infer(dt_layer *l) {
  const mf_priv *p = l->priv;
  DT_CHECK(dt_layer_check_index_input(l, 2));
  l->out_ndim = 1;
  l->out_shape[0] = 1;
  const int64_t one = 1;
  DT_CHECK(dt_layer_declare_rows(l, "user_factors.weight", p->users, p->factors, p->std));
  DT_CHECK(dt_layer_declare_rows(l, "item_factors.weight", p->items, p->factors, p->std));
  DT_CHECK(dt_layer_declare_rows(l, "user_bias.weight", p->users, 1, 0.0f));
  DT_CHECK(dt_layer_declare_rows(l, "item_bias.weight", p->items, 1, 0.0f));
  return dt_layer_declare_init(l, "global_bias", DT_PLACE_PARAM, DT_INIT_CONST, p->mean, 1, &one);
}

static dt_status mf_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const mf_priv *p = l->priv;
  const int32_t *x = (const int32_t *)in;
  DT_CHECK(dt_layer_check_indices(l, x, 2, 0, p->users, io->batch, "user"));
  DT_CHECK(dt_layer_check_indices(l, x, 2, 1, p->items, io->batch, "item"));
  const float *P = io->params + l->t[USER_FACTORS].off, *Q = io->params + l->t[ITEM_FACTORS].off;
  const float *bu = io->params + l->t[USER_BIAS].off, *bi = io->params + l->t[ITEM_BIAS].off;
  const float mu = io->params[l->t[GLOBAL_BIAS].off];
  const size_t K = (size_t)p->factors;
  for (int b = 0; b < io->batch; b++) {
    const int32_t u = x[2 * b], i = x[2 * b + 1];
    const float *pu = P + (size_t)u * K, *qi = Q + (size_t)i * K;
    float dot = 0;
    for (size_t k = 0; k < K; k++) dot += pu[k] * qi[k];
    out[b] = mu + bu[u] + bi[i] + dot;
  }
  return DT_OK;
}

static void mf_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out, const float *dout,
                        float *dinp) {
  (void)out;
  const mf_priv *p = l->priv;
  const int32_t *x = (const int32_t *)in;
  const float *P = io->params + l->t[USER_FACTORS].off, *Q = io->params + l->t[ITEM_FACTORS].off;
  float *dP = io->grads + l->t[USER_FACTORS].off, *dQ = io->grads + l->t[ITEM_FACTORS].off;
  float *dbu = io->grads + l->t[USER_BIAS].off, *dbi = io->grads + l->t[ITEM_BIAS].off;
  const size_t K = (size_t)p->factors;
  double dmu = 0;
  for (int b = 0; b < io->batch; b++) {
    const int32_t u = x[2 * b], i = x[2 * b + 1];
    const float g = dout[b];
    const float *pu = P + (size_t)u * K, *qi = Q + (size_t)i * K;
    float *dpu = dP + (size_t)u * K, *dqi = dQ + (size_t)i * K;
    for (size_t k = 0; k < K; k++) {
      dpu[k] += g * qi[k];
      dqi[k] += g * pu[k];
    }
    dbu[u] += g;
    dbi[i] += g;
    dmu += g;
    for (int t = USER_FACTORS; t <= ITEM_BIAS; t++)
      if (io->rows[t]) dt_row_set_touch(io->rows[t], x[2 * b + (t & 1)]);
  }
  io->grads[l->t[GLOBAL_BIAS].off] += (float)dmu;
  if (p->l2 > 0) {
    const float coef = 2 * p->l2 * io->loss_weight;
    dt_layer_rows_l2(dP, P, p->factors, x, 2, io->batch, coef);
    dt_layer_rows_l2(dQ, Q, p->factors, x + 1, 2, io->batch, coef);
  }
  if (dinp) dt_fill(dinp, 0.0f, (size_t)io->batch * 2); /* indices have no gradient */
}

const dt_layer_ops dt_mf_ops = {.kind = "MF", .infer = mf_infer, .forward = mf_forward, .backward = mf_backward};

dt_status dt_model_add_mf(dt_model *m, const char *name, int64_t users, int64_t items, int factors, float std,
                          float mean, float l2) {
  if (users < 1 || items < 1 || factors < 1 || !(std >= 0) || !(l2 >= 0) || !(mean == mean))
    return dt_error(DT_INVALID_ARGUMENT, "%s: MF of %lld users, %lld items, %d factors (all >= 1), std %g, l2 %g (>= 0)",
                    name ? name : "?", (long long)users, (long long)items, factors, (double)std, (double)l2);
  mf_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "MF", (void **)&p));
  *p = (mf_priv){.users = users, .items = items, .factors = factors, .std = std, .mean = mean, .l2 = l2};
  return dt_model_add_layer(m, &dt_mf_ops, name, p);
}

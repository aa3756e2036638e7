/* Row-wise updates of row tables (embeddings): torch's SGD on a sparse gradient and torch.optim.SparseAdam. */
#include <math.h>

#include "core/impl.h"
#include "dtrain/model_ctx.h"
#include "optim/optim-impl.h"

dt_status dt_optim_rows_check(const dt_optim_config *c) {
  if (c->kind == DT_OPTIM_ADAMW)
    return dt_error(DT_INVALID_ARGUMENT, "adamw: sparse embedding updates take sgd or adam (SparseAdam has no decoupled "
                                         "weight decay); use dense updates or --embedding-l2");
  if (c->weight_decay != 0)
    return dt_error(DT_INVALID_ARGUMENT, "%s: weight decay %g with sparse embedding updates: torch refuses it for sparse "
                                         "gradients; use --embedding-l2 or dense updates",
                    dt_optim_kind_name(c->kind), (double)c->weight_decay);
  if (c->kind == DT_OPTIM_SGD && c->momentum != 0)
    return dt_error(DT_INVALID_ARGUMENT, "sgd: momentum %g with sparse embedding updates: use adam (SparseAdam) or "
                                         "dense updates", (double)c->momentum);
  return DT_OK;
}

/* torch.optim.SparseAdam (1.13) on one row, op for op:
 *   m += (g - m) * (1 - b1);  v += (g*g - v) * (1 - b2);
 *   p += -(lr * sqrt(bc2) / bc1) * (m / (sqrt(v) + eps)). */
static void sparse_adam_row(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                            size_t n, float one_b1, float one_b2, float eps, float neg_step) {
  for (size_t j = 0; j < n; j++) {
    const float m_old = m[j], v_old = v[j];
    const float dm = (g[j] - m_old) * one_b1, dv = (g[j] * g[j] - v_old) * one_b2;
    m[j] = m_old + dm;
    v[j] = v_old + dv;
    const float denom = sqrtf(dv + v_old) + eps;
    p[j] = p[j] + neg_step * ((dm + m_old) / denom);
  }
}

static void adam_rows(dt_optim *o, float *params, const float *grads, float lr, const dt_rows *t) {
  const double b1 = o->cfg.beta1, b2 = o->cfg.beta2, step = (double)o->steps;
  const double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
  const float neg_step = (float)(-((double)lr * sqrt(bc2) / bc1));
  const size_t w = (size_t)t->width;
  for (int64_t i = 0; i < t->n; i++) {
    const size_t at = t->off + (size_t)t->list[i] * w;
    sparse_adam_row(params + at, grads + at, o->state[0] + at, o->state[1] + at, w, (float)(1.0 - b1),
                    (float)(1.0 - b2), o->cfg.eps, neg_step);
  }
}

static void sgd_rows(float *params, const float *grads, float lr, const dt_rows *t) {
  const size_t w = (size_t)t->width;
  for (int64_t i = 0; i < t->n; i++) {
    const size_t at = t->off + (size_t)t->list[i] * w;
    for (size_t j = 0; j < w; j++) params[at + j] = fmaf(grads[at + j], -lr, params[at + j]);
  }
}

dt_status dt_optim_step_rows(dt_optim *o, float *params, const float *grads, float lr, const dt_rows *t, int n) {
  if (!o || (n > 0 && !t)) return dt_error(DT_INVALID_ARGUMENT, "dt_optim_step_rows: NULL argument");
  if (n == 0) return dt_optim_step(o, params, grads, lr);
  DT_CHECK(dt_optim_rows_check(&o->cfg));
  if (o->pieces)
    return dt_error(DT_INVALID_ARGUMENT, "%s: row-wise steps take no weight decay, so no no-decay group either",
                    dt_optim_kind_name(o->cfg.kind));
  if (!isfinite(lr) || lr < 0)
    return dt_error(DT_INVALID_ARGUMENT, "%s: invalid learning rate %g at step %lld: must be finite and >= 0",
                    dt_optim_kind_name(o->cfg.kind), (double)lr, (long long)o->steps + 1);
  for (int k = 0; k < n; k++)
    if (t[k].off + (size_t)(t[k].rows * t[k].width) > o->count || (k && t[k].off < t[k - 1].off + (size_t)(t[k - 1].rows * t[k - 1].width)))
      return dt_error(DT_INVALID_ARGUMENT, "dt_optim_step_rows: table %d overlaps another or the arena's end", k);
  o->steps++;
  const int adam = o->cfg.kind != DT_OPTIM_SGD;
  size_t at = 0; /* the dense spans between tables */
  for (int k = 0; k <= n; k++) {
    const size_t end = k < n ? t[k].off : o->count;
    if (end > at) (adam ? dt_adam_update_span : dt_sgd_update_span)(o, params, grads, lr, at, end - at);
    if (k == n) break;
    if (adam) adam_rows(o, params, grads, lr, &t[k]);
    else sgd_rows(params, grads, lr, &t[k]);
    at = t[k].off + (size_t)(t[k].rows * t[k].width);
  }
  return DT_OK;
}

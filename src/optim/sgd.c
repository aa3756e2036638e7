/* SGD with momentum, dampening, Nesterov and L2 weight decay: torch.optim.SGD's update. */
#include <math.h>
#include <stddef.h>

#include "core/impl.h"
#include "optim/optim-impl.h"

/* Per-step scalars, rounded to float as torch rounds its Python-double hyper-parameters. */
typedef struct sgd_coef {
  float wd, mom, damp1, neg_lr; /* damp1 = 1 - dampening */
  int nesterov, first;          /* first: torch's buf = clone(d_p) on the first step */
} sgd_coef;

static sgd_coef step_coef(const dt_optim *o, float lr, float wd) {
  return (sgd_coef){.wd = wd, .mom = o->cfg.momentum, .damp1 = (float)(1.0 - (double)o->cfg.dampening),
                    .neg_lr = -lr, .nesterov = o->cfg.nesterov, .first = o->steps == 1};
}

/* Each line mirrors one tensor op of torch's _single_tensor_sgd. Where torch
 * calls add(x, alpha=a) its vectorised kernel computes fma(x, a, self), so we
 * use fmaf there and get the same bits. buf is NULL without momentum. */
static void sgd_range(const sgd_coef *c, float *restrict params, const float *restrict grads, float *restrict buf,
                      size_t n) {
  const sgd_coef k = *c;
  const int decay = k.wd != 0;
  if (!buf) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
      float d = grads[i];
      if (decay) d = fmaf(params[i], k.wd, d);   /* d_p = d_p.add(param, alpha=wd) */
      params[i] = fmaf(d, k.neg_lr, params[i]);  /* param.add_(d_p, alpha=-lr) */
    }
    return;
  }
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    float d = grads[i];
    if (decay) d = fmaf(params[i], k.wd, d);
    float b = k.first ? d : fmaf(d, k.damp1, buf[i] * k.mom); /* buf.mul_(mom).add_(d_p, alpha=1-damp) */
    buf[i] = b;
    d = k.nesterov ? fmaf(b, k.mom, d) : b;                   /* d_p.add(buf, alpha=mom) or buf */
    params[i] = fmaf(d, k.neg_lr, params[i]);
  }
}

void dt_sgd_update(dt_optim *o, float *params, const float *grads, float lr) {
  dt_sgd_update_span(o, params, grads, lr, 0, o->count);
}

void dt_sgd_update_span(dt_optim *o, float *params, const float *grads, float lr, size_t lo, size_t count) {
  const sgd_coef c = step_coef(o, lr, o->cfg.weight_decay);
  float *buf = o->cfg.momentum != 0 ? o->state[0] + lo : NULL; /* momentum_buffer */
  params += lo;
  grads += lo;
  const ptrdiff_t nchunks = (ptrdiff_t)((count + DT_OPTIM_PIECE - 1) / DT_OPTIM_PIECE);
#pragma omp parallel for schedule(static) if (count >= DT_OPTIM_PAR_MIN)
  for (ptrdiff_t ch = 0; ch < nchunks; ch++) {
    const size_t at = (size_t)ch * DT_OPTIM_PIECE;
    const size_t n = count - at < DT_OPTIM_PIECE ? count - at : DT_OPTIM_PIECE;
    sgd_range(&c, params + at, grads + at, buf ? buf + at : NULL, n);
  }
}

void dt_sgd_update_piece_run(dt_optim *o, float *params, const float *grads, float lr, int64_t a, int64_t b) {
  const sgd_coef c[2] = {step_coef(o, lr, 0.0f), step_coef(o, lr, o->cfg.weight_decay)}; /* by piece.decay */
  float *buf = o->cfg.momentum != 0 ? o->state[0] : NULL;
  for (int64_t i = a; i < b; i++) {
    const dt_optim_piece pc = o->pieces[i];
    sgd_range(&c[pc.decay], params + pc.lo, grads + pc.lo, buf ? buf + pc.lo : NULL, pc.n);
  }
}

void dt_sgd_update_pieces(dt_optim *o, float *params, const float *grads, float lr) {
  const sgd_coef c[2] = {step_coef(o, lr, 0.0f), step_coef(o, lr, o->cfg.weight_decay)}; /* by piece.decay */
  float *buf = o->cfg.momentum != 0 ? o->state[0] : NULL;
  const dt_optim_piece *pieces = o->pieces;
#pragma omp parallel for schedule(static) if (o->count >= DT_OPTIM_PAR_MIN)
  for (int64_t i = 0; i < o->n_pieces; i++) {
    const dt_optim_piece pc = pieces[i];
    sgd_range(&c[pc.decay], params + pc.lo, grads + pc.lo, buf ? buf + pc.lo : NULL, pc.n);
  }
}

void dt_sgd_update_run(dt_optim *o, float *p, const float *g, float lr, size_t lo, size_t n, int decay) {
  const sgd_coef c = step_coef(o, lr, decay ? o->cfg.weight_decay : 0.0f);
  sgd_range(&c, p, g, o->cfg.momentum != 0 ? o->state[0] + lo : NULL, n);
}

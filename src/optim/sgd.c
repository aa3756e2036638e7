/* SGD with momentum, dampening, Nesterov and L2 weight decay: torch.optim.SGD's update. */
#include <math.h>
#include <stddef.h>

#include "core/impl.h"
#include "optim/optim-impl.h"

/* Each line mirrors one tensor op of torch's _single_tensor_sgd. Where torch
 * calls add(x, alpha=a) its vectorised kernel computes fma(x, a, self), so we
 * use fmaf there and get the same bits; scalars are rounded to float the way
 * torch rounds its Python-double hyper-parameters. */
void dt_sgd_update(dt_optim *o, float *params, const float *grads, float lr) {
  dt_sgd_update_span(o, params, grads, lr, 0, o->count);
}

void dt_sgd_update_span(dt_optim *o, float *restrict params, const float *restrict grads, float lr, size_t lo,
                        size_t count) {
  const ptrdiff_t n = (ptrdiff_t)count;
  params += lo;
  grads += lo;
  const float wd = o->cfg.weight_decay;
  const float mom = o->cfg.momentum;
  const float damp1 = (float)(1.0 - (double)o->cfg.dampening); /* 1 - dampening */
  const float neg_lr = -lr;
  const int decay = wd != 0, nesterov = o->cfg.nesterov;

  if (mom == 0) {
#pragma omp parallel for simd schedule(static) if (n >= DT_OPTIM_PAR_MIN)
    for (ptrdiff_t i = 0; i < n; i++) {
      float d = grads[i];
      if (decay) d = fmaf(params[i], wd, d);   /* d_p = d_p.add(param, alpha=wd) */
      params[i] = fmaf(d, neg_lr, params[i]);  /* param.add_(d_p, alpha=-lr) */
    }
    return;
  }

  float *restrict buf = o->state[0] + lo; /* momentum_buffer */
  const int first = o->steps == 1;   /* torch: buf = clone(d_p) on the first step */
#pragma omp parallel for simd schedule(static) if (n >= DT_OPTIM_PAR_MIN)
  for (ptrdiff_t i = 0; i < n; i++) {
    float d = grads[i];
    if (decay) d = fmaf(params[i], wd, d);
    float b = first ? d : fmaf(d, damp1, buf[i] * mom); /* buf.mul_(mom).add_(d_p, alpha=1-damp) */
    buf[i] = b;
    d = nesterov ? fmaf(b, mom, d) : b;                 /* d_p.add(buf, alpha=mom) or buf */
    params[i] = fmaf(d, neg_lr, params[i]);
  }
}

/* Adam (L2 weight decay in the gradient) and AdamW (decoupled weight decay): torch.optim's updates. */
#include <math.h>
#include <stddef.h>

#include "core/impl.h"
#include "optim/optim-impl.h"

/* Elements per parallel work item: a few pages of each of the 4 streams. */
#define ADAM_CHUNK 8192

/* Per-step scalars, rounded to float as torch's kernels round its Python doubles. */
typedef struct adam_coef {
  float decay;          /* AdamW: 1 - lr * wd; Adam: 1 */
  float wd;             /* Adam: L2 coefficient added to the gradient, else 0 */
  float b1, one_b1;     /* beta1, 1 - beta1 */
  float b2, one_b2;     /* beta2, 1 - beta2 */
  float bc2_sqrt;       /* sqrt(1 - beta2^t) */
  float eps;
  float neg_step_size;  /* -lr / (1 - beta1^t) */
} adam_coef;

/* Each line mirrors one tensor op of torch's _single_tensor_adam(w) (1.13,
 * foreach off, amsgrad off); add(alpha) and addcmul are fused multiply-adds in
 * torch's vectorised CPU kernels, hence fmaf: the results match bit for bit.
 * GCC vectorises this loop only under -fno-math-errno (sqrtf's errno path is a
 * call); without it the loop runs scalar, still with inline vsqrtss. */
static void adam_range(const adam_coef *c, float *restrict params, const float *restrict grads,
                       float *restrict exp_avg, float *restrict exp_avg_sq, size_t n) {
  const adam_coef k = *c;
  const int l2 = k.wd != 0;
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    float p = params[i] * k.decay;                          /* AdamW: param.mul_(1 - lr*wd) */
    float g = grads[i];
    if (l2) g = fmaf(p, k.wd, g);                           /* Adam: grad.add(param, alpha=wd) */
    float m = fmaf(g, k.one_b1, exp_avg[i] * k.b1);         /* exp_avg.mul_(b1).add_(g, alpha=1-b1) */
    float v = fmaf(k.one_b2 * g, g, exp_avg_sq[i] * k.b2);  /* exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2) */
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    float denom = sqrtf(v) / k.bc2_sqrt + k.eps;            /* (sqrt(v) / sqrt(bc2)).add_(eps) */
    params[i] = p + k.neg_step_size * m / denom;            /* addcdiv_(m, denom, value=-lr/bc1) */
  }
}

void dt_adam_update(dt_optim *o, float *params, const float *grads, float lr) {
  dt_adam_update_span(o, params, grads, lr, 0, o->count);
}

/* This step's scalars for weight decay wd (the configured one, or 0 for the no-decay group). */
static adam_coef step_coef(const dt_optim *o, float lr, float wd) {
  const double beta1 = o->cfg.beta1, beta2 = o->cfg.beta2, step = (double)o->steps;
  const double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
  const int adamw = o->cfg.kind == DT_OPTIM_ADAMW;
  return (adam_coef){
      .decay = adamw ? (float)(1.0 - (double)lr * (double)wd) : 1.0f,
      .wd = adamw ? 0.0f : wd,
      .b1 = o->cfg.beta1,
      .one_b1 = (float)(1.0 - beta1),
      .b2 = o->cfg.beta2,
      .one_b2 = (float)(1.0 - beta2),
      .bc2_sqrt = (float)sqrt(bc2),
      .eps = o->cfg.eps,
      .neg_step_size = (float)(-((double)lr / bc1)),
  };
}

void dt_adam_update_span(dt_optim *o, float *params, const float *grads, float lr, size_t lo, size_t count) {
  const adam_coef c = step_coef(o, lr, o->cfg.weight_decay);
  params += lo;
  grads += lo;
  float *exp_avg = o->state[0] + lo, *exp_avg_sq = o->state[1] + lo;
  const ptrdiff_t nchunks = (ptrdiff_t)((count + ADAM_CHUNK - 1) / ADAM_CHUNK);
#pragma omp parallel for schedule(static) if (count >= DT_OPTIM_PAR_MIN)
  for (ptrdiff_t ch = 0; ch < nchunks; ch++) {
    const size_t at = (size_t)ch * ADAM_CHUNK;
    const size_t n = count - at < ADAM_CHUNK ? count - at : ADAM_CHUNK;
    adam_range(&c, params + at, grads + at, exp_avg + at, exp_avg_sq + at, n);
  }
}

void dt_adam_update_piece_run(dt_optim *o, float *params, const float *grads, float lr, int64_t a, int64_t b) {
  const adam_coef c[2] = {step_coef(o, lr, 0.0f), step_coef(o, lr, o->cfg.weight_decay)}; /* by piece.decay */
  for (int64_t i = a; i < b; i++) {
    const dt_optim_piece pc = o->pieces[i];
    adam_range(&c[pc.decay], params + pc.lo, grads + pc.lo, o->state[0] + pc.lo, o->state[1] + pc.lo, pc.n);
  }
}

void dt_adam_update_pieces(dt_optim *o, float *params, const float *grads, float lr) {
  const adam_coef c[2] = {step_coef(o, lr, 0.0f), step_coef(o, lr, o->cfg.weight_decay)}; /* by piece.decay */
  const dt_optim_piece *pieces = o->pieces;
  float *exp_avg = o->state[0], *exp_avg_sq = o->state[1];
#pragma omp parallel for schedule(static) if (o->count >= DT_OPTIM_PAR_MIN)
  for (int64_t i = 0; i < o->n_pieces; i++) {
    const dt_optim_piece pc = pieces[i];
    adam_range(&c[pc.decay], params + pc.lo, grads + pc.lo, exp_avg + pc.lo, exp_avg_sq + pc.lo, pc.n);
  }
}

void dt_adam_update_run(dt_optim *o, float *p, const float *g, float lr, size_t lo, size_t n, int decay) {
  const adam_coef c = step_coef(o, lr, decay ? o->cfg.weight_decay : 0.0f);
  adam_range(&c, p, g, o->state[0] + lo, o->state[1] + lo, n);
}

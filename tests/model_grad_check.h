/* Finite-difference check of a built model's parameter and input gradients (shared by the model tests). */
#ifndef DT_TESTS_MODEL_GRAD_CHECK_H
#define DT_TESTS_MODEL_GRAD_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dtrain/model.h"
#include "dtrain/model_ctx.h"

/* The scalar loss of the model on x, and (when dout is not NULL) its gradient w.r.t. the outputs. */
typedef dt_status (*grad_check_loss_fn)(dt_model *m, const float *x, float *loss, float *dout);

typedef struct grad_check {
  float eps;          /* central-difference step */
  int per;            /* entries checked per tensor, evenly spaced from first to last */
  const char *watch;  /* the tensors whose name holds this add their analytic |g|^2 to watch_den (or NULL) */
  /* results */
  int checked;
  double rel_l2;      /* |fd - analytic| / |analytic| over every checked entry */
  double den, watch_den;
  char msg[256];      /* the first entry outside |fd - a| <= 5e-4 + 1e-2 |a|, or "" */
} grad_check;

/* Backward once on x (n_x floats, perturbed in place and restored), then central differences at gc->per
 * entries of every trainable tensor and of the input. DT_OK unless a forward or backward failed. */
static inline dt_status grad_check_run(dt_model *m, float *x, size_t n_x, float *dout, grad_check_loss_fn loss,
                                       grad_check *gc) {
  float loss0, dx_keep[4096];
  if (n_x > sizeof dx_keep / sizeof dx_keep[0]) return DT_INVALID_ARGUMENT;
  dt_model_ctx_want_input_grad(dt_model_default_ctx(m), 1);
  DT_CHECK(loss(m, x, &loss0, dout));
  dt_model_zero_grad(m);
  DT_CHECK(dt_model_backward(m, dout));
  memcpy(dx_keep, dt_model_ctx_input_grad(dt_model_default_ctx(m)), n_x * sizeof(float));
  float *p = dt_model_params(m, NULL);
  const float *g = dt_model_grads(m, NULL);
  double num = 0;
  gc->checked = 0;
  gc->den = gc->watch_den = 0;
  gc->msg[0] = '\0';
  for (int ti = 0; ti <= dt_model_num_tensors(m); ti++) {
    float *v = x;
    const float *an = dx_keep;
    size_t numel = n_x;
    const char *name = "input";
    if (ti < dt_model_num_tensors(m)) {
      dt_tensor_info info;
      DT_CHECK(dt_model_tensor_info(m, ti, &info));
      if (!info.trainable) continue;
      numel = 1;
      for (int d = 0; d < info.ndim; d++) numel *= (size_t)info.shape[d];
      v = p + info.offset;
      an = g + info.offset;
      name = info.name;
    }
    for (int k = 0; k < gc->per; k++) {
      const size_t i = gc->per > 1 ? (numel - 1) * (size_t)k / (size_t)(gc->per - 1) : 0;
      float keep = v[i], lp, lm;
      v[i] = keep + gc->eps;
      DT_CHECK(loss(m, x, &lp, NULL));
      v[i] = keep - gc->eps;
      DT_CHECK(loss(m, x, &lm, NULL));
      v[i] = keep;
      const double fd = ((double)lp - (double)lm) / (2.0 * gc->eps), a = an[i];
      if (fabs(fd - a) > 5e-4 + 1e-2 * fabs(a) && !gc->msg[0])
        snprintf(gc->msg, sizeof gc->msg, "%s[%zu]: finite difference %.6g, backward %.6g", name, i, fd, a);
      num += (fd - a) * (fd - a);
      gc->den += a * a;
      if (gc->watch && strstr(name, gc->watch)) gc->watch_den += a * a;
      gc->checked++;
    }
  }
  gc->rel_l2 = gc->den > 0 ? sqrt(num / gc->den) : INFINITY;
  return DT_OK;
}

#endif

/* A deferred zero_grad against an eager one (shared by the model tests): two fresh contexts of a built model, their
 * arenas poisoned with NaN, one training forward of x each, then zero_grad (eager in one, deferred in the other)
 * and two backwards of dout. The deferred context must hold the eager one's bits after each backward (Linear and
 * attention assign their gradients, the other layers find their blocks cleared; the second backward adds), and,
 * poisoned again and deferred with no backward since, read zero through dt_model_ctx_grads. Row tables are left
 * out of the poison: their untouched rows are zero by contract. */
#ifndef DT_TESTS_DEFERRED_GRADS_H
#define DT_TESTS_DEFERRED_GRADS_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dtrain/model.h"
#include "dtrain/model_ctx.h"

/* NaN in c's arena but for its row tables (whose untouched rows are zero by contract: zero_grad clears the
 * touched ones only). */
static inline void deferred_grads_poison(dt_model *m, dt_model_ctx *c, float *g, size_t n) {
  size_t at = 0;
  for (int k = 0; k < dt_model_num_row_tables(m); k++) {
    dt_rows t;
    dt_model_ctx_rows(m, c, k, &t);
    for (; at < t.off; at++) g[at] = NAN;
    at = t.off + (size_t)t.rows * (size_t)t.width;
  }
  for (; at < n; at++) g[at] = NAN;
}

/* NULL when the deferred gradients equal the eager ones, else what differs (or which call failed). */
static inline const char *deferred_grads_differ(dt_model *m, int batch, const void *x, const float *dout, dt_amp amp) {
  static char why[160];
  dt_model_ctx *c[2] = {NULL, NULL};
  const float *y;
  const char *bad = NULL;
  const size_t n = dt_model_num_params(m);
  for (int k = 0; k < 2 && !bad; k++) {
    if (dt_model_ctx_new(m, batch, 0, &c[k]) != DT_OK || dt_model_ctx_set_amp(m, c[k], amp) != DT_OK) {
      bad = "context";
      break;
    }
    deferred_grads_poison(m, c[k], dt_model_ctx_grads(c[k]), n);
    if (dt_model_ctx_forward(m, c[k], x, batch, &y) != DT_OK) bad = "forward";
  }
  if (!bad) {
    float *ge = dt_model_ctx_grads(c[0]), *gd = dt_model_ctx_grads(c[1]);
    dt_model_ctx_zero_grad(m, c[0]);
    dt_model_ctx_zero_grad_deferred(m, c[1]);
    for (int pass = 0; pass < 2 && !bad; pass++) {
      if (dt_model_ctx_backward(m, c[0], dout) != DT_OK || dt_model_ctx_backward(m, c[1], dout) != DT_OK) {
        bad = "backward";
        break;
      }
      for (size_t i = 0; i < n && !bad; i++)
        if (memcmp(&ge[i], &gd[i], sizeof(float))) {
          snprintf(why, sizeof why, "backward %d: gradient %zu of %zu is %g deferred, %g eager", pass + 1, i, n,
                   (double)gd[i], (double)ge[i]);
          bad = why;
        }
    }
    if (!bad) {
      dt_model_ctx_zero_grad_deferred(m, c[1]); /* clears the touched rows */
      deferred_grads_poison(m, c[1], gd, n);
      dt_model_ctx_zero_grad_deferred(m, c[1]);
    }
    if (!bad && dt_model_ctx_grads(c[1]) != gd) bad = "the arena moved";
    for (size_t i = 0; i < n && !bad; i++)
      if (gd[i] != 0.0f) bad = "a deferred zero_grad read through dt_model_ctx_grads is not zero";
  }
  dt_model_ctx_free(c[0]);
  dt_model_ctx_free(c[1]);
  return bad;
}

#endif

/* One evaluation pass (the task's loss and metrics, through any forward) and the prefix sampler of --limit-*. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "dtrain/core.h"
#include "train/train_impl.h"

dt_status dt_prefix_sampler_fn(void *user, int64_t epoch, int64_t *out, int64_t *n) {
  const dt_prefix_sampler *s = user;
  for (int64_t i = 0; i < s->n; i++) out[i] = i;
  if (s->shuffle) {
    /* Fisher-Yates with a stream of its own per epoch: a pure function of (seed, epoch). */
    dt_rng r;
    dt_rng_init(&r, s->seed, 0x5A4D504C00000000ull + (uint64_t)epoch);
    for (int64_t i = s->n - 1; i > 0; i--) {
      int64_t j = (int64_t)dt_rng_below(&r, (uint32_t)(i + 1));
      int64_t t = out[i];
      out[i] = out[j];
      out[j] = t;
    }
  }
  *n = s->n;
  return DT_OK;
}

dt_status dt_train_evaluate(dt_model *m, dt_forward_fn fwd, void *user, dt_loader *l, const dt_task *t, int64_t count,
                            dt_metric_acc *acc, double *seconds) {
  dt_status st = DT_OK;
  const double t0 = dt_time_now();
  int64_t counted = 0;
  dt_model_set_training(m, 0);
  DT_CHECK_GOTO(dt_loader_start_epoch(l, 0), st, done);
  for (;;) {
    dt_batch b;
    DT_CHECK_GOTO(dt_loader_next(l, &b), st, done);
    if (b.size == 0) break;
    const float *out = NULL;
    DT_CHECK_GOTO(fwd(user, b.x, b.size, &out), st, done);
    int n = b.size;
    if (count >= 0 && counted + n > count) n = (int)(count - counted); /* padding at the end */
    if (n <= 0) continue;
    float loss = 0;
    DT_CHECK_GOTO(dt_task_loss(t, out, b.target, n, 0, &loss, NULL), st, done);
    DT_CHECK_GOTO(dt_metric_acc_add(acc, out, b.target, n, (double)loss), st, done);
    counted += n;
  }
  *seconds = dt_time_now() - t0;
done:
  dt_model_set_training(m, 1);
  return st;
}

/* Learning-rate schedules per optimizer step: constant, StepLR, CosineAnnealingLR, LinearLR warm-up, and
 * transformers' linear schedule with warm-up. */
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/optim.h"

static const char *const sched_names[] = {"constant", "step", "cosine", "linear"};
#define NUM_SCHEDS ((int)(sizeof sched_names / sizeof sched_names[0]))

const char *dt_sched_kind_name(dt_sched_kind k) {
  return (int)k >= 0 && (int)k < NUM_SCHEDS ? sched_names[k] : "unknown";
}

dt_status dt_sched_kind_parse(const char *s, dt_sched_kind *out) {
  if (!s || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_sched_kind_parse: NULL argument");
  for (int k = 0; k < NUM_SCHEDS; k++) {
    if (strcmp(s, sched_names[k]) == 0) {
      *out = (dt_sched_kind)k;
      return DT_OK;
    }
  }
  return dt_error(DT_INVALID_ARGUMENT, "unknown learning-rate schedule \"%s\": choose one of constant, step, cosine, linear", s);
}

/* transformers.get_linear_schedule_with_warmup's lr_lambda, in double as its Python floats: the warm-up
 * starts at 0 and is part of total_steps (num_training_steps), unlike the LinearLR warm-up below. */
static double linear_factor(int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return (double)step / (double)(warmup > 1 ? warmup : 1);
  const double left = (double)(total - step) / (double)(total - warmup > 1 ? total - warmup : 1);
  return left > 0 ? left : 0.0;
}

/* Closed forms of torch's schedulers, in double; torch steps them recursively,
 * which agrees to within a few double ulps. */
float dt_lr_at(const dt_lr_schedule *s, int64_t step) {
  const double base = s->base_lr;
  if (step < 0) step = 0;
  if (s->kind == DT_SCHED_LINEAR) return (float)(base * linear_factor(step, s->warmup_steps, s->total_steps));
  if (s->warmup_steps > 0) {
    if (step < s->warmup_steps) {
      /* LinearLR(start_factor=warmup_start, end_factor=1, total_iters=warmup_steps) */
      const double start = s->warmup_start;
      return (float)(base * (start + (1.0 - start) * (double)step / (double)s->warmup_steps));
    }
    step -= s->warmup_steps; /* SequentialLR restarts the main schedule at 0 */
  }
  switch (s->kind) {
    case DT_SCHED_STEP: {
      const int64_t size = s->step_size > 0 ? s->step_size : 1;
      return (float)(base * pow((double)s->gamma, (double)(step / size)));
    }
    case DT_SCHED_COSINE: {
      const int64_t T = s->total_steps > 0 ? s->total_steps : 1;
      const double t = (double)(step < T ? step : T); /* stays at min_lr after T */
      const double lo = s->min_lr;
      return (float)(lo + (base - lo) * (1.0 + cos(M_PI * t / (double)T)) / 2.0);
    }
    case DT_SCHED_CONSTANT:
    default:
      return s->base_lr;
  }
}

dt_status dt_lr_schedule_check(const dt_lr_schedule *s) {
  if (!s) return dt_error(DT_INVALID_ARGUMENT, "dt_lr_schedule_check: NULL schedule");
  if ((int)s->kind < 0 || (int)s->kind >= NUM_SCHEDS)
    return dt_error(DT_INVALID_ARGUMENT, "unknown schedule kind %d: choose one of constant, step, cosine, linear", (int)s->kind);
  if (!isfinite(s->base_lr) || s->base_lr < 0)
    return dt_error(DT_INVALID_ARGUMENT, "schedule: base_lr %g must be finite and >= 0", (double)s->base_lr);
  if (s->warmup_steps < 0)
    return dt_error(DT_INVALID_ARGUMENT, "schedule: warmup_steps %lld must be >= 0", (long long)s->warmup_steps);
  if (s->warmup_steps > 0 && s->kind != DT_SCHED_LINEAR && !(s->warmup_start > 0 && s->warmup_start <= 1))
    return dt_error(DT_INVALID_ARGUMENT,
                    "schedule: warmup_start %g must be in (0, 1] (the LinearLR start factor; torch's default is 1/3)",
                    (double)s->warmup_start);
  if (s->kind == DT_SCHED_STEP) {
    if (s->step_size < 1)
      return dt_error(DT_INVALID_ARGUMENT, "step schedule: step_size %lld must be >= 1 optimizer step",
                      (long long)s->step_size);
    if (!isfinite(s->gamma) || s->gamma <= 0)
      return dt_error(DT_INVALID_ARGUMENT, "step schedule: gamma %g must be finite and > 0 (0.1 is StepLR's default)",
                      (double)s->gamma);
  } else if (s->kind == DT_SCHED_LINEAR) {
    if (s->total_steps < 1)
      return dt_error(DT_INVALID_ARGUMENT, "linear schedule: total_steps %lld (num_training_steps) must be >= 1",
                      (long long)s->total_steps);
  } else if (s->kind == DT_SCHED_COSINE) {
    if (s->total_steps < 1)
      return dt_error(DT_INVALID_ARGUMENT, "cosine schedule: total_steps %lld (T_max, after warm-up) must be >= 1",
                      (long long)s->total_steps);
    if (!isfinite(s->min_lr) || s->min_lr < 0 || s->min_lr > s->base_lr)
      return dt_error(DT_INVALID_ARGUMENT, "cosine schedule: min_lr %g must be in [0, base_lr %g]", (double)s->min_lr,
                      (double)s->base_lr);
  }
  return DT_OK;
}

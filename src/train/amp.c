/* Mixed precision in the training loop: every context's autocast mode, the fp16 loss scaler's step, the banner. */
#include <math.h>
#include <stdint.h>

#include "core/impl.h"
#include "tensor/kernels.h"
#include "train/run.h"

/* GradScaler's init_scale and growth_interval from their tunables. */
static dt_status scaler_open(dt_scaler *s) {
  long log2_scale, interval;
  DT_CHECK(dt_tunable_int("DT_AMP_INIT_SCALE_LOG2", &log2_scale));
  DT_CHECK(dt_tunable_int("DT_AMP_GROWTH_INTERVAL", &interval));
  if (log2_scale < 0 || log2_scale > 127 || interval < 1 || interval > INT32_MAX)
    return dt_error(DT_INVALID_ARGUMENT, "DT_AMP_INIT_SCALE_LOG2=%ld, DT_AMP_GROWTH_INTERVAL=%ld: expected 0 to 127 "
                    "and >= 1", log2_scale, interval);
  dt_scaler_init(s);
  s->scale = ldexpf(1.0f, (int)log2_scale);
  s->growth_interval = (int32_t)interval;
  return DT_OK;
}

dt_status dt_run_amp_open(dt_run *r) {
  const dt_amp amp = r->cfg->amp;
  DT_CHECK(scaler_open(&r->scaler));
  const dt_snapshot_position *p = &r->resume.pos;
  if (r->resume.active && p->has_scaler && amp == DT_AMP_FP16) { /* resumes bit-exact: the scale is a float */
    r->scaler.scale = p->loss_scale;
    r->scaler.growth_tracker = (int32_t)p->growth_tracker;
    r->scaler.skipped = p->skipped_steps;
    DT_CHECK(dt_scaler_check(&r->scaler, r->resume.path));
  }
  if (amp == DT_AMP_OFF) return DT_OK;
  DT_CHECK(dt_amp_kernels_check());
  if (r->dp)
    DT_CHECK(dt_dp_set_amp(r->dp, amp));
  else
    DT_CHECK(dt_model_ctx_set_amp(r->model, dt_model_default_ctx(r->model), amp));
  if (!r->lead) return DT_OK;
  const char *name = amp == DT_AMP_BF16 ? "bf16" : "fp16";
  DT_LOG_INFO("train", "amp %s: %s", name, dt_amp_path_name(amp));
  if (dt_amp_native_gemm(amp)) return DT_OK;
  if (!dt_amp_cpu_native(amp)) /* said once, at start-up: an emulated run is slower, not wrong */
    DT_LOG_WARN("train", "%s is emulated on this CPU: expect it to be slower than f32", name);
  else
    DT_LOG_WARN("train", "this CPU has native %s but this run emulates it (%s): expect it to be slower than f32",
                name, amp == DT_AMP_FP16 ? "dtrain has no native fp16 kernels yet" : "DT_AMP_KERNELS=emulated");
  return DT_OK;
}

float dt_run_amp_loss_scale(const dt_run *r) { return r->cfg->amp == DT_AMP_FP16 ? r->scaler.scale : 1.0f; }

dt_status dt_run_amp_unscale(dt_run *r, int *skip) {
  *skip = 0;
  if (r->cfg->amp != DT_AMP_FP16) return DT_OK;
  int found = dt_scaler_unscale(&r->scaler, r->grads, r->n_params);
  /* Every rank skips the same steps: the flag is agreed as the stop flag is (a max over ranks). */
  DT_CHECK(r->strategy->agree_stop(r, found, &found));
  dt_scaler_update(&r->scaler, found);
  *skip = found;
  return DT_OK;
}

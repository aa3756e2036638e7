/* Mixed precision in the training loop: every context's autocast mode, the fp16 loss scaler's step, the banner. */
#include "core/impl.h"
#include "train/run.h"

dt_status dt_run_amp_open(dt_run *r) {
  const dt_amp amp = r->cfg->amp;
  if (!r->resume.active) dt_scaler_init(&r->scaler); /* a resumed run has the snapshot's scaler */
  if (amp == DT_AMP_OFF) return DT_OK;
  if (r->dp)
    DT_CHECK(dt_dp_set_amp(r->dp, amp));
  else
    DT_CHECK(dt_model_ctx_set_amp(r->model, dt_model_default_ctx(r->model), amp));
  if (!r->lead) return DT_OK;
  const char *name = amp == DT_AMP_BF16 ? "bf16" : "fp16";
  DT_LOG_INFO("train", "amp %s: %s", name, dt_amp_path_name(amp));
  if (!dt_amp_cpu_native(amp)) /* said once, at start-up: an emulated run is slower, not wrong */
    DT_LOG_WARN("train", "%s is emulated on this CPU: expect it to be slower than f32", name);
  else
    DT_LOG_WARN("train", "this CPU has native %s but dtrain has no native kernels yet: emulated, expect it to be "
                "slower than f32", name);
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

/* Dynamic loss scaling (torch.cuda.amp.GradScaler over _amp_foreach_non_finite_check_and_unscale_ and
 * _amp_update_scale_, CPU kernels of torch 1.13). */
#include <math.h>

#include "core/impl.h"
#include "dtrain/scaler.h"

void dt_scaler_init(dt_scaler *s) {
  *s = (dt_scaler){.scale = 65536.0f, .growth_factor = 2.0f, .backoff_factor = 0.5f, .growth_interval = 2000};
}

int dt_scaler_unscale(const dt_scaler *s, float *grads, size_t n) {
  const float inv = (float)(1.0 / (double)s->scale);
  int found = 0;
  for (size_t i = 0; i < n; i++) {
    found |= !isfinite(grads[i]);
    grads[i] *= inv;
  }
  return found;
}

void dt_scaler_update(dt_scaler *s, int found_inf) {
  if (found_inf) {
    s->scale *= s->backoff_factor;
    s->growth_tracker = 0;
    s->skipped++;
    return;
  }
  const int32_t successful = s->growth_tracker + 1;
  if (successful == s->growth_interval) {
    const float grown = s->scale * s->growth_factor;
    if (isfinite(grown)) s->scale = grown; /* no growth past float's range */
    s->growth_tracker = 0;
  } else {
    s->growth_tracker = successful;
  }
}

dt_status dt_scaler_check(const dt_scaler *s, const char *where) {
  if (!(s->scale > 0.0f) || !isfinite(s->scale) || s->growth_tracker < 0 || s->skipped < 0 ||
      s->growth_interval < 1 || s->growth_tracker >= s->growth_interval || !(s->growth_factor > 1.0f) ||
      !(s->backoff_factor > 0.0f && s->backoff_factor < 1.0f))
    return dt_error(DT_CORRUPT, "%s: loss scaler state (scale %g, growth tracker %d, skipped %lld) is not one "
                    "GradScaler can reach", where, (double)s->scale, (int)s->growth_tracker, (long long)s->skipped);
  return DT_OK;
}

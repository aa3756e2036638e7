/* Dynamic loss scaling for fp16 mixed precision, with torch.cuda.amp.GradScaler's rules and defaults. */
#ifndef DTRAIN_SCALER_H
#define DTRAIN_SCALER_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The scaler's state: a plain value the trainer owns and snapshots (scale and growth tracker resume a run). */
typedef struct dt_scaler {
  float scale;            /* the loss is multiplied by it before backward (init 65536) */
  int32_t growth_tracker; /* consecutive finite steps since the scale last changed */
  int64_t skipped;        /* steps skipped for an inf/NaN gradient */
  float growth_factor;    /* 2 */
  float backoff_factor;   /* 0.5 */
  int32_t growth_interval; /* 2000 */
} dt_scaler;

/* GradScaler's defaults. */
void dt_scaler_init(dt_scaler *s);
/* grads (n) *= 1 / scale (the reciprocal in double, rounded to float, as GradScaler.unscale_); returns 1 when any
 * element was inf or NaN before unscaling (_amp_foreach_non_finite_check_and_unscale_), else 0. */
int dt_scaler_unscale(const dt_scaler *s, float *grads, size_t n);
/* After a step's found-inf flag (agreed by every replica): inf -> scale *= backoff, tracker 0, the step counts as
 * skipped; finite -> tracker + 1, and at growth_interval scale *= growth (kept only when finite), tracker 0
 * (_amp_update_scale_). */
void dt_scaler_update(dt_scaler *s, int found_inf);
/* DT_INVALID_ARGUMENT naming `where` unless the state is one the rules can reach (a snapshot's scaler). */
dt_status dt_scaler_check(const dt_scaler *s, const char *where);

#ifdef __cplusplus
}
#endif
#endif

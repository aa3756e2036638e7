/* Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_). */
#include <math.h>
#include <stddef.h>

#include "core/impl.h"
#include "dtrain/optim.h"

/* The sum of squares is taken over fixed chunks whose size depends only on
 * count, then the partial sums are added in order: the norm has the same bits
 * for any number of threads. */
#define CLIP_MAX_CHUNKS 256
#define CLIP_MIN_CHUNK 16384

dt_status dt_clip_grad_norm(float *grads, size_t count, float max_norm, float *norm) {
  if (count > 0 && !grads) return dt_error(DT_INVALID_ARGUMENT, "dt_clip_grad_norm: NULL gradients");
  if (!(max_norm > 0))
    return dt_error(DT_INVALID_ARGUMENT, "clip_grad_norm: max_norm %g must be > 0", (double)max_norm);

  size_t chunk = (count + CLIP_MAX_CHUNKS - 1) / CLIP_MAX_CHUNKS;
  if (chunk < CLIP_MIN_CHUNK) chunk = CLIP_MIN_CHUNK;
  const ptrdiff_t nchunks = (ptrdiff_t)((count + chunk - 1) / chunk);
  double part[CLIP_MAX_CHUNKS];
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (ptrdiff_t c = 0; c < nchunks; c++) {
    const size_t lo = (size_t)c * chunk, hi = lo + chunk < count ? lo + chunk : count;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t i = lo; i < hi; i++) s += (double)grads[i] * (double)grads[i];
    part[c] = s;
  }
  double sum = 0;
  for (ptrdiff_t c = 0; c < nchunks; c++) sum += part[c];
  const float total = (float)sqrt(sum);

  /* A NaN/inf norm is reported, not applied: torch would multiply every
   * gradient by NaN; the caller sees the norm and decides (skip the step). */
  if (isfinite(total)) {
    const float coef = max_norm / (total + 1e-6f); /* float, as torch's tensor math */
    if (coef < 1.0f) {
      const ptrdiff_t n = (ptrdiff_t)count;
#pragma omp parallel for simd schedule(static) if (parallel: n >= 32768)
      for (ptrdiff_t i = 0; i < n; i++) grads[i] *= coef;
    }
  } else {
    DT_LOG_INFO("optim", "gradient norm is %g: gradients left unscaled", (double)total);
  }
  if (norm) *norm = total;
  return DT_OK;
}

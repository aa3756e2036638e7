/* Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_). */
#include <math.h>
#include <stddef.h>

#include "core/impl.h"
#include "dtrain/optim.h"

/* The sum of squares is taken over fixed chunks whose size depends only on
 * count, then the partial sums are added in order: the norm has the same bits
 * for any number of threads (and dt_dp's workers, which take the chunks in
 * shares). At most CLIP_MAX_CHUNKS (dt_dp keeps that many partial sums). */
#define CLIP_MAX_CHUNKS DT_CLIP_MAX_CHUNKS
#define CLIP_MIN_CHUNK 16384

dt_status dt_clip_check(float max_norm) {
  if (!(max_norm > 0))
    return dt_error(DT_INVALID_ARGUMENT, "clip_grad_norm: max_norm %g must be > 0", (double)max_norm);
  return DT_OK;
}

size_t dt_clip_chunks(size_t count, size_t *chunk) {
  size_t c = (count + CLIP_MAX_CHUNKS - 1) / CLIP_MAX_CHUNKS;
  if (c < CLIP_MIN_CHUNK) c = CLIP_MIN_CHUNK;
  *chunk = c;
  return (count + c - 1) / c;
}

double dt_clip_chunk_sum(const float *grads, size_t lo, size_t hi) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (size_t i = lo; i < hi; i++) s += (double)grads[i] * (double)grads[i];
  return s;
}

float dt_clip_coef(double sum, float max_norm, float *norm) {
  const float total = (float)sqrt(sum);
  if (norm) *norm = total;
  /* A NaN/inf norm is reported, not applied: torch would multiply every
   * gradient by NaN; the caller sees the norm and decides (skip the step). */
  if (!isfinite(total)) {
    DT_LOG_INFO("optim", "gradient norm is %g: gradients left unscaled", (double)total);
    return 1.0f;
  }
  const float coef = max_norm / (total + 1e-6f); /* float, as torch's tensor math */
  return coef < 1.0f ? coef : 1.0f;
}

dt_status dt_clip_grad_norm(float *grads, size_t count, float max_norm, float *norm) {
  if (count > 0 && !grads) return dt_error(DT_INVALID_ARGUMENT, "dt_clip_grad_norm: NULL gradients");
  DT_CHECK(dt_clip_check(max_norm));
  size_t chunk;
  const ptrdiff_t nchunks = (ptrdiff_t)dt_clip_chunks(count, &chunk);
  double part[CLIP_MAX_CHUNKS];
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (ptrdiff_t c = 0; c < nchunks; c++) {
    const size_t lo = (size_t)c * chunk, hi = lo + chunk < count ? lo + chunk : count;
    part[c] = dt_clip_chunk_sum(grads, lo, hi);
  }
  double sum = 0;
  for (ptrdiff_t c = 0; c < nchunks; c++) sum += part[c];
  const float coef = dt_clip_coef(sum, max_norm, norm);
  if (coef < 1.0f) {
    const ptrdiff_t n = (ptrdiff_t)count;
#pragma omp parallel for simd schedule(static) if (parallel: n >= 32768)
    for (ptrdiff_t i = 0; i < n; i++) grads[i] *= coef;
  }
  return DT_OK;
}

/* 2-D max and average pooling kernels (floor mode, zero/-inf padding as PyTorch), one (n, c) plane per task. */
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "tensor/kernels.h"

dt_status dt_pool2d_geom_init(dt_pool2d_geom *g, int N, int C, int H, int W, int K, int stride, int pad) {
  if (N < 1 || C < 1 || H < 1 || W < 1 || K < 1 || stride < 1 || pad < 0)
    return dt_error(DT_INVALID_ARGUMENT,
                    "pool2d: bad geometry N=%d C=%d H=%d W=%d kernel=%d stride=%d pad=%d "
                    "(sizes and stride must be >= 1, pad >= 0)",
                    N, C, H, W, K, stride, pad);
  if (pad > K / 2)
    return dt_error(DT_INVALID_ARGUMENT, "pool2d: pad %d must be at most half the kernel size %d", pad, K);
  if ((int64_t)H + 2 * pad < K || (int64_t)W + 2 * pad < K)
    return dt_error(DT_INVALID_ARGUMENT, "pool2d: kernel %d is larger than the padded input %dx%d (pad %d)", K, H,
                    W, pad);
  g->N = N;
  g->C = C;
  g->H = H;
  g->W = W;
  g->K = K;
  g->stride = stride;
  g->pad = pad;
  g->OH = (int)(((int64_t)H + 2 * pad - K) / stride + 1);
  g->OW = (int)(((int64_t)W + 2 * pad - K) / stride + 1);
  return DT_OK;
}

/* Takes v at index i over (best, at) as PyTorch does: a larger value, or the
 * first NaN (NaN propagates). Written as selects so loops compile branch-free. */
static inline void max_take(float v, int32_t i, float *best, int32_t *at) {
  const int take = (v > *best) | ((v != v) & (*best == *best));
  *best = take ? v : *best;
  *at = take ? i : *at;
}

/* The common 2x2, stride 2, unpadded window over a plane without NaN: plain
 * compares, a vectorisable loop over output columns (first maximum wins). */
static void maxpool_2x2(const dt_pool2d_geom *g, float *y, int32_t *am, const float *x) {
  const int W = g->W;
  for (int oh = 0; oh < g->OH; oh++) {
    const float *r0 = x + (size_t)(2 * oh) * W, *r1 = r0 + W;
    float *yo = y + (size_t)oh * g->OW;
    int32_t *ao = am + (size_t)oh * g->OW;
    const int32_t base = 2 * oh * W;
#pragma omp simd
    for (int ow = 0; ow < g->OW; ow++) {
      const float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
      float m = a;
      int32_t k = 0;
      k = b > m ? 1 : k;
      m = b > m ? b : m;
      k = c > m ? W : k;
      m = c > m ? c : m;
      k = d > m ? W + 1 : k;
      m = d > m ? d : m;
      yo[ow] = m;
      ao[ow] = base + 2 * ow + k;
    }
  }
}

static int has_nan(const float *x, size_t n) {
  int any = 0;
#pragma omp simd reduction(| : any)
  for (size_t i = 0; i < n; i++) any |= x[i] != x[i];
  return any;
}

/* Output (oh, ow) of a plane, its window clipped to the plane (padding is -inf, as PyTorch's). */
static void window_max(const dt_pool2d_geom *g, const float *x, int oh, int ow, float *y, int32_t *am) {
  int h0 = oh * g->stride - g->pad, h1 = h0 + g->K, w0 = ow * g->stride - g->pad, w1 = w0 + g->K;
  if (h0 < 0) h0 = 0;
  if (h1 > g->H) h1 = g->H;
  if (w0 < 0) w0 = 0;
  if (w1 > g->W) w1 = g->W;
  float best = -INFINITY;
  int32_t at = h0 * g->W + w0;
  for (int ih = h0; ih < h1; ih++)
    for (int iw = w0; iw < w1; iw++) max_take(x[ih * g->W + iw], ih * g->W + iw, &best, &at);
  *y = best;
  *am = at;
}

/* Outputs [lo, hi) of a row whose windows lie inside the plane's columns, over input rows h0..h1-1 (clipped)
 * of a plane without NaN: the window's taps in row-major order, each a vector loop over the outputs with a
 * strict compare, so the first maximum wins as in max_take. */
static void interior_run(const dt_pool2d_geom *g, float *restrict y, int32_t *restrict am, const float *restrict x,
                         int h0, int h1, int lo, int hi) {
  const int W = g->W, s = g->stride, pad = g->pad;
  for (int ih = h0; ih < h1; ih++)
    for (int kw = 0; kw < g->K; kw++) {
      const int32_t off = ih * W - pad + kw;
      if (ih == h0 && kw == 0) {
#pragma omp simd
        for (int ow = lo; ow < hi; ow++) {
          y[ow] = x[off + ow * s];
          am[ow] = off + ow * s;
        }
        continue;
      }
#pragma omp simd
      for (int ow = lo; ow < hi; ow++) {
        const float v = x[off + ow * s];
        am[ow] = v > y[ow] ? off + ow * s : am[ow];
        y[ow] = v > y[ow] ? v : y[ow];
      }
    }
}

/* Any window over a plane without NaN: the border outputs one by one, the rest a vector loop per row
 * (the ResNets' 3x3 stride-2 padded max-pool). */
static void maxpool_rows(const dt_pool2d_geom *g, float *y, int32_t *am, const float *x) {
  const int s = g->stride, pad = g->pad, K = g->K;
  int lo = (pad + s - 1) / s, hi = g->W - K + pad >= 0 ? (g->W - K + pad) / s + 1 : 0;
  if (hi > g->OW) hi = g->OW;
  if (lo > hi) lo = hi;
  for (int oh = 0; oh < g->OH; oh++) {
    int h0 = oh * s - pad, h1 = h0 + K;
    if (h0 < 0) h0 = 0;
    if (h1 > g->H) h1 = g->H;
    float *yo = y + (size_t)oh * g->OW;
    int32_t *ao = am + (size_t)oh * g->OW;
    for (int ow = 0; ow < lo; ow++) window_max(g, x, oh, ow, yo + ow, ao + ow);
    interior_run(g, yo, ao, x, h0, h1, lo, hi);
    for (int ow = hi; ow < g->OW; ow++) window_max(g, x, oh, ow, yo + ow, ao + ow);
  }
}

void dt_maxpool2d_forward(const dt_pool2d_geom *g, float *out, int32_t *argmax, const float *inp) {
  const int planes = g->N * g->C, P = g->OH * g->OW;
  const size_t HW = (size_t)g->H * g->W;
  const int two = g->K == 2 && g->stride == 2 && g->pad == 0;
#pragma omp parallel for schedule(static)
  for (int pl = 0; pl < planes; pl++) {
    const float *x = inp + (size_t)pl * HW;
    float *y = out + (size_t)pl * P;
    int32_t *am = argmax + (size_t)pl * P;
    if (!has_nan(x, HW)) {
      if (two)
        maxpool_2x2(g, y, am, x);
      else
        maxpool_rows(g, y, am, x);
      continue;
    }
    for (int oh = 0; oh < g->OH; oh++)
      for (int ow = 0; ow < g->OW; ow++) window_max(g, x, oh, ow, y + (size_t)oh * g->OW + ow, am + (size_t)oh * g->OW + ow);
  }
}

void dt_maxpool2d_backward(const dt_pool2d_geom *g, float *dinp, const float *dout, const int32_t *argmax) {
  const int planes = g->N * g->C, P = g->OH * g->OW;
  const size_t HW = (size_t)g->H * g->W;
#pragma omp parallel for schedule(static)
  for (int pl = 0; pl < planes; pl++) {
    float *dx = dinp + (size_t)pl * HW;
    const float *dy = dout + (size_t)pl * P;
    const int32_t *am = argmax + (size_t)pl * P;
    memset(dx, 0, HW * sizeof(float));
    for (int p = 0; p < P; p++) dx[am[p]] += dy[p];
  }
}

/* Window rows [*a, *b) clipped to the input and its divisor (count_include_pad: the padded extent). */
static int window(int o, int stride, int pad, int K, int size, int *a, int *b) {
  int start = o * stride - pad, end = start + K;
  if (end > size + pad) end = size + pad;
  int extent = end - start;
  *a = start < 0 ? 0 : start;
  *b = end > size ? size : end;
  return extent;
}

void dt_avgpool2d_forward(const dt_pool2d_geom *g, float *out, const float *inp) {
  const int planes = g->N * g->C, P = g->OH * g->OW;
  const size_t HW = (size_t)g->H * g->W;
#pragma omp parallel for schedule(static)
  for (int pl = 0; pl < planes; pl++) {
    const float *x = inp + (size_t)pl * HW;
    float *y = out + (size_t)pl * P;
    for (int oh = 0; oh < g->OH; oh++) {
      int h0, h1, w0, w1;
      const int eh = window(oh, g->stride, g->pad, g->K, g->H, &h0, &h1);
      for (int ow = 0; ow < g->OW; ow++) {
        const int ew = window(ow, g->stride, g->pad, g->K, g->W, &w0, &w1);
        float sum = 0.0f;
        for (int ih = h0; ih < h1; ih++)
          for (int iw = w0; iw < w1; iw++) sum += x[ih * g->W + iw];
        y[oh * g->OW + ow] = sum / (float)(eh * ew);
      }
    }
  }
}

void dt_avgpool2d_backward(const dt_pool2d_geom *g, float *dinp, const float *dout) {
  const int planes = g->N * g->C, P = g->OH * g->OW;
  const size_t HW = (size_t)g->H * g->W;
#pragma omp parallel for schedule(static)
  for (int pl = 0; pl < planes; pl++) {
    float *dx = dinp + (size_t)pl * HW;
    const float *dy = dout + (size_t)pl * P;
    memset(dx, 0, HW * sizeof(float));
    for (int oh = 0; oh < g->OH; oh++) {
      int h0, h1, w0, w1;
      const int eh = window(oh, g->stride, g->pad, g->K, g->H, &h0, &h1);
      for (int ow = 0; ow < g->OW; ow++) {
        const int ew = window(ow, g->stride, g->pad, g->K, g->W, &w0, &w1);
        const float d = dy[oh * g->OW + ow] / (float)(eh * ew);
        for (int ih = h0; ih < h1; ih++)
          for (int iw = w0; iw < w1; iw++) dx[ih * g->W + iw] += d;
      }
    }
  }
}

/* The input range [*a, *b) of adaptive output cell o of `out` cells over `size` inputs. */
static void adaptive_bin(int o, int out, int size, int *a, int *b) {
  *a = (int)(((int64_t)o * size) / out);
  *b = (int)(((int64_t)(o + 1) * size + out - 1) / out);
}

void dt_adaptive_avgpool2d_forward(float *out, const float *inp, int planes, int H, int W, int OH, int OW) {
  const size_t HW = (size_t)H * W, P = (size_t)OH * OW;
#pragma omp parallel for schedule(static)
  for (int pl = 0; pl < planes; pl++) {
    const float *x = inp + (size_t)pl * HW;
    float *y = out + (size_t)pl * P;
    for (int oh = 0; oh < OH; oh++) {
      int h0, h1;
      adaptive_bin(oh, OH, H, &h0, &h1);
      for (int ow = 0; ow < OW; ow++) {
        int w0, w1;
        adaptive_bin(ow, OW, W, &w0, &w1);
        float sum = 0.0f;
        for (int ih = h0; ih < h1; ih++)
          for (int iw = w0; iw < w1; iw++) sum += x[(size_t)ih * W + iw];
        y[oh * OW + ow] = sum / (float)((h1 - h0) * (w1 - w0));
      }
    }
  }
}

void dt_adaptive_avgpool2d_backward(float *dinp, const float *dout, int planes, int H, int W, int OH, int OW) {
  const size_t HW = (size_t)H * W, P = (size_t)OH * OW;
#pragma omp parallel for schedule(static)
  for (int pl = 0; pl < planes; pl++) {
    float *dx = dinp + (size_t)pl * HW;
    const float *dy = dout + (size_t)pl * P;
    memset(dx, 0, HW * sizeof(float));
    for (int oh = 0; oh < OH; oh++) {
      int h0, h1;
      adaptive_bin(oh, OH, H, &h0, &h1);
      for (int ow = 0; ow < OW; ow++) {
        int w0, w1;
        adaptive_bin(ow, OW, W, &w0, &w1);
        const float d = dy[oh * OW + ow] / (float)((h1 - h0) * (w1 - w0));
        for (int ih = h0; ih < h1; ih++)
          for (int iw = w0; iw < w1; iw++) dx[(size_t)ih * W + iw] += d;
      }
    }
  }
}

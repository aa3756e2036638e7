/* Batch normalisation kernels over (N, C, HW): training, evaluation, backward; one channel per task.
 * Also BatchNorm -> ReLU (one pass where two would write full tensors) and BatchNorm -> ReLU -> MaxPool(2,
 * stride 2) fused. */
#include <math.h>
#include <string.h>

#include "tensor/kernels.h"
#include "tensor/v8.h"

/* A channel's planes lie C*HW floats apart, each too short for the hardware prefetcher to get going:
 * ask for the next plane while working on this one. */
static inline void prefetch_plane(const float *p, size_t n) {
  for (size_t i = 0; i < n; i += 16) __builtin_prefetch(p + i);
}

/* Sums run in float over runs of at most RUN values, spread over 32 vector lanes, and the runs' sums are added
 * in double: the float sums vectorise at full width, and no lane takes more than 32 terms, so a plane of any
 * size (resnet18's 112x112) keeps the error of a double sum within f32's rounding of the result. */
#define RUN 1024
static inline int run_at(int i0, int n) { return n - i0 < RUN ? n - i0 : RUN; } /* the run from i0 of n values */

/* The sum of x[0..n) (n <= RUN), and that of (x[i] - m)^2: four vectors of 8 lanes take every 32 values in turn
 * (a single accumulator was bound by the add's latency: 43% of the fused BatchNorm-ReLU-pool forward), then the
 * vectors and their lanes are added in a fixed order, then the tail. v8 has 8 lanes on every build, so the bits
 * do not depend on the vector width the compiler chose (test_kernels' batchnorm_sums_in_their_fixed_order). */
static inline __attribute__((always_inline)) float run_sum(const float *x, int n, float m, int squares) {
  v8 a[4] = {splat8(0.0f), splat8(0.0f), splat8(0.0f), splat8(0.0f)};
  const v8 mv = splat8(m);
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; k++) {
      const v8 v = load8(x + i + 8 * k);
      a[k] += squares ? (v - mv) * (v - mv) : v;
    }
  for (int k = 0; i + 8 <= n; i += 8, k++) {
    const v8 v = load8(x + i);
    a[k] += squares ? (v - mv) * (v - mv) : v;
  }
  float s = lanes_sum8((a[0] + a[1]) + (a[2] + a[3]));
  for (; i < n; i++) s += squares ? (x[i] - m) * (x[i] - m) : x[i];
  return s;
}

/* Statistics of channel c of inp (N, C, HW), two passes: the mean, then the biased variance around it.
 * Writes mean/invstd (may be NULL) and updates the running statistics (may be NULL) as PyTorch does, with
 * the UNBIASED variance. Returns the mean and invstd as floats. */
static void channel_stats(int c, float *m_out, float *is_out, float *mean, float *invstd, float *running_mean,
                          float *running_var, const float *inp, int N, int C, int HW, float momentum, float eps) {
  const size_t M = (size_t)N * HW; /* values per channel */
  double sum = 0.0;
  for (int n = 0; n < N; n++) {
    const float *x = inp + ((size_t)n * C + c) * HW;
    if (n + 1 < N) prefetch_plane(x + (size_t)C * HW, HW);
    for (int i0 = 0; i0 < HW; i0 += RUN) sum += run_sum(x + i0, run_at(i0, HW), 0.0f, 0);
  }
  const float m = (float)(sum / (double)M);
  double sq = 0.0;
  for (int n = 0; n < N; n++) {
    const float *x = inp + ((size_t)n * C + c) * HW;
    for (int i0 = 0; i0 < HW; i0 += RUN) sq += run_sum(x + i0, run_at(i0, HW), m, 1);
  }
  const double var = sq / (double)M;
  const float is = (float)(1.0 / sqrt(var + (double)eps));
  if (mean) mean[c] = m;
  if (invstd) invstd[c] = is;
  if (running_mean) running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
  if (running_var) {
    const double unbiased = M > 1 ? sq / (double)(M - 1) : var;
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
  }
  *m_out = m;
  *is_out = is;
}

/* y = (x - m) * scale + shift over n values, then ReLU when relu (as dt_act_forward: NaN -> 0). */
static inline void normalize_run(float *restrict y, const float *restrict x, size_t n, float m, float scale,
                                 float shift, int relu) {
  if (relu) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
      const float v = (x[i] - m) * scale + shift;
      y[i] = v > 0.0f ? v : 0.0f;
    }
  } else {
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] = (x[i] - m) * scale + shift;
  }
}

/* gamma/beta may be NULL (affine=False): scale 1, shift 0. relu: BatchNorm -> ReLU in one pass. Channels are
 * handed out dynamically (on shared cores one thread may run slower): each is computed whole by one thread, so the
 * bits do not depend on which. */
static void forward_train(float *out, float *mean, float *invstd, float *running_mean, float *running_var,
                          const float *inp, const float *gamma, const float *beta, int N, int C, int HW,
                          float momentum, float eps, int relu) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int c = 0; c < C; c++) {
    float m, is;
    channel_stats(c, &m, &is, mean, invstd, running_mean, running_var, inp, N, C, HW, momentum, eps);
    const float scale = (gamma ? gamma[c] : 1.0f) * is, shift = beta ? beta[c] : 0.0f;
    for (int n = 0; n < N; n++)
      normalize_run(out + ((size_t)n * C + c) * HW, inp + ((size_t)n * C + c) * HW, (size_t)HW, m, scale, shift, relu);
  }
}

static void forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                         const float *running_mean, const float *running_var, int N, int C, int HW, float eps,
                         int relu) {
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)N * C * HW >= 65536)
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) {
      const float is = (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
      const float scale = (gamma ? gamma[c] : 1.0f) * is, shift = beta ? beta[c] : 0.0f;
      normalize_run(out + ((size_t)n * C + c) * HW, inp + ((size_t)n * C + c) * HW, (size_t)HW, running_mean[c],
                    scale, shift, relu);
    }
  }
}

void dt_batchnorm_forward_train(float *out, float *mean, float *invstd, float *running_mean, float *running_var,
                                const float *inp, const float *gamma, const float *beta, int N, int C, int HW,
                                float momentum, float eps) {
  forward_train(out, mean, invstd, running_mean, running_var, inp, gamma, beta, N, C, HW, momentum, eps, 0);
}
void dt_bn_relu_forward_train(float *out, float *mean, float *invstd, float *running_mean, float *running_var,
                              const float *inp, const float *gamma, const float *beta, int N, int C, int HW,
                              float momentum, float eps) {
  forward_train(out, mean, invstd, running_mean, running_var, inp, gamma, beta, N, C, HW, momentum, eps, 1);
}
void dt_batchnorm_forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                               const float *running_mean, const float *running_var, int N, int C, int HW, float eps) {
  forward_eval(out, inp, gamma, beta, running_mean, running_var, N, C, HW, eps, 0);
}
void dt_bn_relu_forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                             const float *running_mean, const float *running_var, int N, int C, int HW, float eps) {
  forward_eval(out, inp, gamma, beta, running_mean, running_var, N, C, HW, eps, 1);
}

/* The gradient reaching the BN output: dout, or after a fused ReLU (relu_out its output) dout where relu_out
 * > 0, else 0, as torch's threshold_backward. relu is a constant in every caller, so each variant is its
 * own vector loop. */
static inline __attribute__((always_inline)) float grad_in(const float *dy, const float *r, int i, int relu) {
  return relu ? (r[i] > 0.0f ? dy[i] : 0.0f) : dy[i];
}

/* Over n values (n <= RUN): s[0] = sum g, s[1] = sum g * xhat, g = grad_in's. As run_sum: four vectors of 8
 * lanes in turn for each sum, added in a fixed order. */
static inline __attribute__((always_inline)) void run_grad_sums(float s[2], const float *dy, const float *r,
                                                                const float *x, int n, float m, float is, int relu) {
  const v8 zero = splat8(0.0f), mv = splat8(m), iv = splat8(is);
  v8 a[4] = {zero, zero, zero, zero}, b[4] = {zero, zero, zero, zero};
  int i = 0;
#define TERMS(k, at)                                              \
  do {                                                            \
    v8 g = load8(dy + (at));                                      \
    if (relu) g = sel8(load8(r + (at)) > zero, g, zero);          \
    a[k] += g;                                                    \
    b[k] += g * ((load8(x + (at)) - mv) * iv);                    \
  } while (0)
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; k++) TERMS(k, i + 8 * k);
  for (int k = 0; i + 8 <= n; i += 8, k++) TERMS(k, i);
#undef TERMS
  s[0] = lanes_sum8((a[0] + a[1]) + (a[2] + a[3]));
  s[1] = lanes_sum8((b[0] + b[1]) + (b[2] + b[3]));
  for (; i < n; i++) {
    const float g = grad_in(dy, r, i, relu);
    s[0] += g;
    s[1] += g * ((x[i] - m) * is);
  }
}

/* With xhat = (x - mean) * invstd and M values per channel:
 * dbeta = sum dy, dgamma = sum dy * xhat,
 * dinp = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M). */
static inline __attribute__((always_inline)) void backward_channel(float *dinp, float *dgamma, float *dbeta,
                                                                   const float *dout, const float *relu_out,
                                                                   const float *inp, float m, float is, float k,
                                                                   int c, int N, int C, int HW, int relu) {
  double sdy = 0.0, sdyx = 0.0;
  for (int n = 0; n < N; n++) {
    const size_t off = ((size_t)n * C + c) * HW;
    const float *restrict x = inp + off, *restrict dy = dout + off, *restrict r = relu ? relu_out + off : NULL;
    for (int i0 = 0; i0 < HW; i0 += RUN) {
      float s[2];
      run_grad_sums(s, dy + i0, relu ? r + i0 : NULL, x + i0, run_at(i0, HW), m, is, relu);
      sdy += s[0];
      sdyx += s[1];
    }
  }
  if (dbeta) dbeta[c] += (float)sdy;
  if (dgamma) dgamma[c] += (float)sdyx;
  if (!dinp) return;
  const size_t M = (size_t)N * HW;
  const float a = (float)(sdy / (double)M), b = (float)(sdyx / (double)M) * is;
  for (int n = 0; n < N; n++) {
    const size_t off = ((size_t)n * C + c) * HW;
    const float *restrict x = inp + off, *restrict dy = dout + off, *restrict r = relu ? relu_out + off : NULL;
    float *restrict dx = dinp + off;
#pragma omp simd
    for (int i = 0; i < HW; i++) dx[i] = k * (grad_in(dy, r, i, relu) - a - (x[i] - m) * b);
  }
}

static void backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *relu_out,
                     const float *inp, const float *mean, const float *invstd, const float *gamma, int N, int C,
                     int HW) {
#pragma omp parallel for schedule(dynamic, 1) /* as forward_train */
  for (int c = 0; c < C; c++) {
    const float k = (gamma ? gamma[c] : 1.0f) * invstd[c];
    if (relu_out)
      backward_channel(dinp, dgamma, dbeta, dout, relu_out, inp, mean[c], invstd[c], k, c, N, C, HW, 1);
    else
      backward_channel(dinp, dgamma, dbeta, dout, NULL, inp, mean[c], invstd[c], k, c, N, C, HW, 0);
  }
}

void dt_batchnorm_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                           const float *mean, const float *invstd, const float *gamma, int N, int C, int HW) {
  backward(dinp, dgamma, dbeta, dout, NULL, inp, mean, invstd, gamma, N, C, HW);
}
void dt_bn_relu_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *out,
                         const float *inp, const float *mean, const float *invstd, const float *gamma, int N, int C,
                         int HW) {
  backward(dinp, dgamma, dbeta, dout, out, inp, mean, invstd, gamma, N, C, HW);
}

/* ---- BatchNorm -> ReLU -> MaxPool(2, stride 2, no padding), fused ------------------------------------ */

/* Pooled rows at least 8 wide (fashioncnn's first, 14) are walked 8 windows at a time: two input rows' 16
 * columns each, loaded whole and split into the windows' even and odd columns (row_windows below; the last 8 of
 * a row overlap the ones before where its width is not a multiple of 8). Narrower ones (fashioncnn's second, 6)
 * as flat runs of up to CHUNK outputs p = oh*OW + ow, each with the offset 2*oh*W + 2*ow of its window in the
 * input plane: full-width vector loops (gathers). */
#define CHUNK 1024
#define ROW_WINDOWS 8

/* 0: the gathers and the scatter even on rows of 8 windows and more (dt_bn_pool_set_rows, for the tests). */
static int row_windows_on = 1;
void dt_bn_pool_set_rows(int on) { row_windows_on = on != 0; }

/* Where the 8-window blocks of a pooled row start: 0, 8, ... and OW - 8 last. */
static inline int next_block(int ow0, int OW) {
  return ow0 + ROW_WINDOWS <= OW - ROW_WINDOWS || ow0 + ROW_WINDOWS >= OW ? ow0 + ROW_WINDOWS : OW - ROW_WINDOWS;
}

/* Windows ow0 .. ow0+7 of pooled row oh, r0 the input row 2*oh at column 2*ow0 (r0 + W the next row): their
 * four values, each as 8 lanes, in the order of bn_relu_pool_run's xa, xb, xc, xd. */
typedef struct row_windows {
  v8 a, b, c, d;
} row_windows;
static inline row_windows load_windows(const float *r0, int W) {
  const v8 l0 = load8(r0), h0 = load8(r0 + 8), l1 = load8(r0 + W), h1 = load8(r0 + W + 8);
  return (row_windows){EVEN8(l0, h0), ODD8(l0, h0), EVEN8(l1, h1), ODD8(l1, h1)};
}
static inline v8 bn_relu8(v8 x, float m, float scale, float shift) {
  const v8 v = (x - splat8(m)) * splat8(scale) + splat8(shift);
  return sel8(v > splat8(0.0f), v, splat8(0.0f));
}

/* bn_relu_pool_run's arithmetic and choices lane for lane, for 8 windows of one row (the same bits): o0 the
 * offset of the first window in the input plane. */
static void bn_relu_pool8(float *y, int32_t *am, float *xs, const float *r0, int32_t o0, float m, float is,
                          float scale, float shift, int W) {
  const row_windows x = load_windows(r0, W);
  const v8 a = bn_relu8(x.a, m, scale, shift), b = bn_relu8(x.b, m, scale, shift);
  const v8 c = bn_relu8(x.c, m, scale, shift), d = bn_relu8(x.d, m, scale, shift);
  v8 v = a, xv = x.a;
  v8i k = {0};
  v8i gt = b > v;
  k = seli8(gt, (v8i){1, 1, 1, 1, 1, 1, 1, 1}, k), xv = sel8(gt, x.b, xv), v = sel8(gt, b, v);
  gt = c > v;
  const v8i kw = {W, W, W, W, W, W, W, W};
  k = seli8(gt, kw, k), xv = sel8(gt, x.c, xv), v = sel8(gt, c, v);
  gt = d > v;
  k = seli8(gt, kw + 1, k), xv = sel8(gt, x.d, xv), v = sel8(gt, d, v);
  const v8i o = (v8i){o0, o0, o0, o0, o0, o0, o0, o0} + (v8i){0, 2, 4, 6, 8, 10, 12, 14} + k;
  store8(y, v);
  memcpy(am, &o, sizeof o);
  if (xs) {
    const v8 sel = (xv - splat8(m)) * splat8(is);
    store8(xs, sel);
  }
}

static void window_offsets(int32_t *off, int p0, int np, int W, int OW) {
  for (int i = 0; i < np; i++) off[i] = 2 * ((p0 + i) / OW) * W + 2 * ((p0 + i) % OW);
}

/* np pooled outputs of one plane: y = relu((x - m) * scale + shift) (ReLU as dt_act_forward: NaN -> 0),
 * then the 2x2 max with the first maximum winning, as dt_maxpool2d_forward (ReLU output holds no NaN);
 * xs (NULL to skip) = (x - m) * is at the argmax, for backward. */
static void bn_relu_pool_run(float *restrict y, int32_t *restrict am, float *restrict xs, const float *restrict x,
                             const int32_t *restrict off, int np, float m, float is, float scale, float shift,
                             int W) {
#pragma omp simd
  for (int i = 0; i < np; i++) {
    const int32_t o = off[i];
    const float xa = x[o], xb = x[o + 1], xc = x[o + W], xd = x[o + W + 1];
    float a = (xa - m) * scale + shift, b = (xb - m) * scale + shift;
    float c = (xc - m) * scale + shift, d = (xd - m) * scale + shift;
    a = a > 0.0f ? a : 0.0f;
    b = b > 0.0f ? b : 0.0f;
    c = c > 0.0f ? c : 0.0f;
    d = d > 0.0f ? d : 0.0f;
    float v = a, xv = xa;
    int32_t k = 0;
    k = b > v ? 1 : k;
    xv = b > v ? xb : xv;
    v = b > v ? b : v;
    k = c > v ? W : k;
    xv = c > v ? xc : xv;
    v = c > v ? c : v;
    k = d > v ? W + 1 : k;
    xv = d > v ? xd : xv;
    v = d > v ? d : v;
    y[i] = v;
    am[i] = o + k;
    if (xs) xs[i] = (xv - m) * is;
  }
}

/* Planes n = 0..N-1 of channel c (N = 1 with the plane pointers for one plane). */
static void bn_relu_pool_planes(float *out, int32_t *argmax, float *xsel, const float *inp, int N, int C, int c,
                                int H, int W, float m, float is, float scale, float shift) {
  const int HW = H * W, OW = W / 2, OH = H / 2, P = OH * OW;
  if (OW >= ROW_WINDOWS && row_windows_on) {
    for (int n = 0; n < N; n++) {
      const size_t pl = (size_t)n * C + c;
      for (int oh = 0; oh < OH; oh++)
        for (int ow0 = 0; ow0 < OW; ow0 = next_block(ow0, OW)) {
          const size_t p = pl * P + (size_t)oh * OW + ow0;
          const int32_t o0 = 2 * oh * W + 2 * ow0;
          bn_relu_pool8(out + p, argmax + p, xsel ? xsel + p : NULL, inp + pl * HW + o0, o0, m, is, scale, shift, W);
        }
    }
    return;
  }
  int32_t off[CHUNK];
  for (int p0 = 0; p0 < P; p0 += CHUNK) {
    const int np = P - p0 < CHUNK ? P - p0 : CHUNK;
    window_offsets(off, p0, np, W, OW);
    for (int n = 0; n < N; n++) {
      const size_t pl = (size_t)n * C + c;
      bn_relu_pool_run(out + pl * P + p0, argmax + pl * P + p0, xsel ? xsel + pl * P + p0 : NULL, inp + pl * HW,
                       off, np, m, is, scale, shift, W);
    }
  }
}

void dt_bn_relu_maxpool2x2_forward_train(float *out, int32_t *argmax, float *xsel, float *mean, float *invstd,
                                         float *running_mean, float *running_var, const float *inp,
                                         const float *gamma, const float *beta, int N, int C, int H, int W,
                                         float momentum, float eps) {
  const int HW = H * W;
  /* One channel per task: its N planes (N*HW floats) stay in L2 across the three passes. */
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; c++) {
    float m, is;
    channel_stats(c, &m, &is, mean, invstd, running_mean, running_var, inp, N, C, HW, momentum, eps);
    const float scale = (gamma ? gamma[c] : 1.0f) * is, shift = beta ? beta[c] : 0.0f;
    bn_relu_pool_planes(out, argmax, xsel, inp, N, C, c, H, W, m, is, scale, shift);
  }
}

void dt_bn_relu_maxpool2x2_forward_eval(float *out, int32_t *argmax, const float *inp, const float *gamma,
                                        const float *beta, const float *running_mean, const float *running_var,
                                        int N, int C, int H, int W, float eps) {
  const int HW = H * W, OH = H / 2, OW = W / 2, P = OH * OW;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)N * C * HW >= 65536)
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) {
      const float is = (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
      const float scale = (gamma ? gamma[c] : 1.0f) * is, shift = beta ? beta[c] : 0.0f;
      const size_t pl = (size_t)n * C + c;
      bn_relu_pool_planes(out + pl * P, argmax + pl * P, NULL, inp + pl * HW, 1, 1, 0, H, W, running_mean[c], is,
                          scale, shift);
    }
  }
}

/* One plane's input gradient in 8-window blocks (OW >= ROW_WINDOWS): each input the dy = 0 formula, the argmax
 * of its window the pooled gradient's (as dt_bn_relu_maxpool2x2_backward's two loops, lane for lane: the same
 * bits) in one pass over the windows' rows; the column and row that no window covers (W, H odd) the dy = 0
 * formula. */
static void bn_pool_dx_rows(float *restrict dx, const float *restrict x, const float *restrict dy,
                            const float *restrict y, const float *restrict xs, const int32_t *restrict am, int H, int W,
                            float m, float is, float k, float a, float b) {
  const int OH = H / 2, OW = W / 2;
  const v8 vm = splat8(m), vis = splat8(is), vk = splat8(k), vb = splat8(b), vna = splat8(0.0f - a);
  for (int oh = 0; oh < OH; oh++) {
    for (int ow0 = 0; ow0 < OW; ow0 = next_block(ow0, OW)) {
      const int p = oh * OW + ow0, o0 = 2 * oh * W + 2 * ow0;
      const row_windows w = load_windows(x + o0, W);
      const v8 yv = load8(y + p), g = sel8(yv > splat8(0.0f), load8(dy + p), splat8(0.0f));
      const v8 at = vk * (g - splat8(a) - load8(xs + p) * vb);
      v8i kk;
      memcpy(&kk, am + p, sizeof kk);
      kk -= (v8i){o0, o0, o0, o0, o0, o0, o0, o0} + (v8i){0, 2, 4, 6, 8, 10, 12, 14};
      const v8i one = {1, 1, 1, 1, 1, 1, 1, 1}, kw = {W, W, W, W, W, W, W, W};
      const v8 da = sel8(kk == (v8i){0}, at, vk * (vna - (w.a - vm) * vis * vb));
      const v8 db = sel8(kk == one, at, vk * (vna - (w.b - vm) * vis * vb));
      const v8 dc = sel8(kk == kw, at, vk * (vna - (w.c - vm) * vis * vb));
      const v8 dd = sel8(kk == kw + 1, at, vk * (vna - (w.d - vm) * vis * vb));
      const v8 r0l = INTERLEAVE_LO8(da, db), r0h = INTERLEAVE_HI8(da, db);
      const v8 r1l = INTERLEAVE_LO8(dc, dd), r1h = INTERLEAVE_HI8(dc, dd);
      store8(dx + o0, r0l), store8(dx + o0 + 8, r0h), store8(dx + o0 + W, r1l), store8(dx + o0 + W + 8, r1h);
    }
    if (W % 2)
      for (int r = 2 * oh; r < 2 * oh + 2; r++) {
        const int i = r * W + W - 1;
        dx[i] = k * ((0.0f - a) - (x[i] - m) * is * b);
      }
  }
  if (H % 2)
#pragma omp simd
    for (int i = (H - 1) * W; i < H * W; i++) dx[i] = k * ((0.0f - a) - (x[i] - m) * is * b);
}

/* The BN gradient dy is the pooled gradient scattered to the argmax where the pooled output is positive
 * (ReLU passes it) and zero elsewhere, so the sums run over the pooled positions only (with xhat at the
 * argmax saved by the forward) and dinp is the dy = 0 formula everywhere, rewritten at the argmax
 * positions. Same per-element arithmetic as the three backward kernels in turn; the sums add the same
 * terms without the zeros. */
void dt_bn_pool_channel_terms(const dt_bn_pool_saved *s, const float *dout, int c, float *dgamma, float *dbeta,
                              float terms[3]) {
  const int C = s->C, P = (s->H / 2) * (s->W / 2);
  const size_t M = (size_t)s->N * s->H * s->W;
  double sdy = 0.0, sdyx = 0.0;
  for (int n = 0; n < s->N; n++) {
    const size_t pl = (size_t)n * C + c;
    const float *restrict dy = dout + pl * P, *restrict y = s->out + pl * P, *restrict xs = s->xsel + pl * P;
    if (n + 1 < s->N) {
      prefetch_plane(dy + (size_t)C * P, P);
      prefetch_plane(y + (size_t)C * P, P);
      prefetch_plane(xs + (size_t)C * P, P);
    }
    /* g = what ReLU passes back to the argmax; xhat there is xs itself ((xs - 0) * 1, exactly) */
    for (int p0 = 0; p0 < P; p0 += RUN) {
      float t[2];
      run_grad_sums(t, dy + p0, y + p0, xs + p0, run_at(p0, P), 0.0f, 1.0f, 1);
      sdy += t[0];
      sdyx += t[1];
    }
  }
  if (dbeta) dbeta[c] += (float)sdy;
  if (dgamma) dgamma[c] += (float)sdyx;
  terms[0] = (s->gamma ? s->gamma[c] : 1.0f) * s->invstd[c];
  terms[1] = (float)(sdy / (double)M);
  terms[2] = (float)(sdyx / (double)M);
}

void dt_bn_pool_plane_grad(const dt_bn_pool_saved *s, const float *dout, int n, int c, const float terms[3],
                           float *dx) {
  const int H = s->H, W = s->W, HW = H * W, P = (H / 2) * (W / 2);
  const size_t pl = (size_t)n * s->C + c;
  const float *restrict x = s->inp + pl * HW, *restrict dy = dout + pl * P, *restrict y = s->out + pl * P;
  const float *restrict xs = s->xsel + pl * P;
  const int32_t *restrict am = s->argmax + pl * P;
  const float m = s->mean[c], is = s->invstd[c], k = terms[0], a = terms[1], b = terms[2], na = 0.0f - a;
  if (W / 2 >= ROW_WINDOWS && row_windows_on) {
    bn_pool_dx_rows(dx, x, dy, y, xs, am, H, W, m, is, k, a, b);
    return;
  }
#pragma omp simd
  for (int i = 0; i < HW; i++) dx[i] = k * (na - (x[i] - m) * is * b);
  /* The argmax positions (distinct: the windows do not overlap) get their gradient. */
#pragma omp simd
  for (int p = 0; p < P; p++) {
    const float g = y[p] > 0.0f ? dy[p] : 0.0f;
    dx[am[p]] = k * (g - a - xs[p] * b);
  }
}

void dt_bn_relu_maxpool2x2_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *out,
                                    const int32_t *argmax, const float *xsel, const float *inp, const float *mean,
                                    const float *invstd, const float *gamma, int N, int C, int H, int W) {
  const dt_bn_pool_saved s = {out, argmax, xsel, inp, mean, invstd, gamma, N, C, H, W};
  const size_t HW = (size_t)H * W;
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; c++) {
    float terms[3];
    dt_bn_pool_channel_terms(&s, dout, c, dgamma, dbeta, terms);
    if (!dinp) continue;
    for (int n = 0; n < N; n++) {
      if (n + 1 < N) prefetch_plane(inp + ((size_t)(n + 1) * C + c) * HW, HW);
      dt_bn_pool_plane_grad(&s, dout, n, c, terms, dinp + ((size_t)n * C + c) * HW);
    }
  }
}

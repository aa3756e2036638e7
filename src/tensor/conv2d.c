/* conv2d kernels: per sample, im2col into a per-thread buffer and GEMMs on NCHW data (col2im for backward);
 * 3x3 stride-1 convolutions (padding 0 to 2) go to Winograd's algorithm (conv_wino.c) when their channels come
 * in 8s and the transformed kernel fits in L2, else to the direct kernels of conv3x3.c where those apply. */
#include <limits.h>
#include <omp.h>
#include <string.h>

#include "core/impl.h"
#include "tensor/conv3x3.h"
#include "tensor/conv_wino.h"
#include "tensor/kernels.h"
#include "tensor/v8.h"

dt_status dt_conv2d_geom_init(dt_conv2d_geom *g, int N, int C, int H, int W, int OC, int KH, int KW, int stride,
                              int pad) {
  if (N < 1 || C < 1 || H < 1 || W < 1 || OC < 1 || KH < 1 || KW < 1 || stride < 1 || pad < 0)
    return dt_error(DT_INVALID_ARGUMENT,
                    "conv2d: bad geometry N=%d C=%d H=%d W=%d OC=%d kernel=%dx%d stride=%d pad=%d "
                    "(sizes and stride must be >= 1, pad >= 0)",
                    N, C, H, W, OC, KH, KW, stride, pad);
  if ((int64_t)H + 2 * (int64_t)pad < KH || (int64_t)W + 2 * (int64_t)pad < KW)
    return dt_error(DT_INVALID_ARGUMENT, "conv2d: kernel %dx%d is larger than the padded input %dx%d (pad %d)", KH,
                    KW, H, W, pad);
  int64_t OH = ((int64_t)H + 2 * pad - KH) / stride + 1, OW = ((int64_t)W + 2 * pad - KW) / stride + 1;
  /* GEMM dimensions are ints: (C*KH*KW) rows by (N*OH*OW) columns. */
  int64_t rows = (int64_t)C * KH * KW, cols = (int64_t)N * OH * OW;
  if (rows > INT_MAX || cols > INT_MAX)
    return dt_error(DT_INVALID_ARGUMENT, "conv2d: geometry N=%d C=%d H=%d W=%d OC=%d is too large for one GEMM", N, C,
                    H, W, OC);
  g->N = N;
  g->C = C;
  g->H = H;
  g->W = W;
  g->OC = OC;
  g->KH = KH;
  g->KW = KW;
  g->stride = stride;
  g->pad = pad;
  g->OH = (int)OH;
  g->OW = (int)OW;
  g->threads = N;
  g->amp = DT_AMP_OFF;
  return DT_OK;
}

/* Samples unfolded together into one column block when an output map has fewer than CONV_GROUP_BELOW pixels,
 * so that each GEMM has about CONV_GROUP_COLS columns (N = G*OH*OW): resnet18's 7x7 layer4 GEMMs, 49 columns a
 * sample, run 13% faster so (bench/conv_kernels); 16x16 maps grouped were 5% slower, 8x8 even.
 * Depends on the geometry only (never on the thread count), so the sums' order is fixed. */
#define CONV_GROUP_BELOW 128
#define CONV_GROUP_COLS 512
static int conv_group(const dt_conv2d_geom *g) {
  const int P = g->OH * g->OW;
  int G = P < CONV_GROUP_BELOW ? (CONV_GROUP_COLS + P - 1) / P : 1;
  if (G > g->N) G = g->N;
  return G > 0 ? G : 1;
}

/* Threads used: one group of samples each at a time, at most the groups and at most g->threads (the scratch's
 * blocks). */
static int conv_threads(const dt_conv2d_geom *g) {
  const int G = conv_group(g), groups = (g->N + G - 1) / G;
  int t = omp_get_max_threads();
  if (t > groups) t = groups;
  if (t > g->threads) t = g->threads;
  return t > 0 ? t : 1;
}

/* Per thread block: a group's col and dcol (C*KH*KW, G*OH*OW), its output or output gradient gathered as
 * (OC, G*OH*OW) when G > 1, and a partial dw (OC, C*KH*KW). */
static size_t block_floats(const dt_conv2d_geom *g) {
  const size_t R = (size_t)g->C * g->KH * g->KW, G = (size_t)conv_group(g), GP = G * g->OH * g->OW;
  return 2 * R * GP + (G > 1 ? (size_t)g->OC * GP : 0) + (size_t)g->OC * R;
}

/* The input gradient of a stride-1 convolution is itself a stride-1 convolution: of dout (N, OC, OH, OW) with
 * the weights flipped and transposed, wt (C, OC, KH, KW), padded by K-1-pad, giving (N, C, H, W). Its GEMMs have
 * K = OC*KH*KW instead of the K = OC of w^T @ dout, and there is no col2im scatter. 0 when it does not apply
 * or does not pay. */
#define CONV_TRANSPOSED_MIN_C 8 /* fewer input channels: the transposed GEMM's M = C is too thin (3: 2x slower) */
static int transposed_geom(const dt_conv2d_geom *g, dt_conv2d_geom *t) {
  if (g->C < CONV_TRANSPOSED_MIN_C || g->stride != 1 || g->pad > g->KH - 1 || g->pad > g->KW - 1 || g->KH != g->KW)
    return 0;
  *t = *g;
  t->C = g->OC, t->H = g->OH, t->W = g->OW, t->OC = g->C, t->OH = g->H, t->OW = g->W;
  t->pad = g->KH - 1 - g->pad;
  /* Padded by K-1-pad, it multiplies by zeros where the input is larger than the output: by GEMMs, with
   * fashioncnn's unpadded 3x3 on 14x14 (36% more products), it was 8% slower for the whole training step than
   * the GEMM and col2im of backward_groups; by Winograd, it is faster. */
  return (int64_t)g->H * g->W <= (int64_t)g->OH * g->OW || dt_wino_applies(t);
}

/* Floats of the forward's scratch for geometry g, by whichever path it takes. Winograd, where it applies, is
 * taken in every amp mode; otherwise both GEMM and direct where the direct kernel applies, as a native
 * low-precision run takes the GEMMs there but for one input channel (the workspace is sized before amp is
 * known, and amp only ever turns the direct kernels off). */
static size_t forward_floats(const dt_conv2d_geom *g) {
  if (dt_wino_applies(g)) return dt_wino_forward_floats(g);
  const size_t blocks = (size_t)(g->threads < g->N ? (g->threads > 0 ? g->threads : 1) : g->N);
  size_t n = blocks * block_floats(g), m;
  if (dt_conv3x3_forward_applies(g) && (m = dt_conv3x3_forward_floats(g)) > n) n = m;
  return n;
}

/* Where Winograd applies it takes the forward, the weight gradient and (the transposed geometry applying too)
 * the input gradient, so its own scratch is all: resnet18's 56x56 layers would otherwise size 14.6 MB of im2col
 * columns per thread where Winograd needs 2.4. */
size_t dt_conv2d_scratch_floats(const dt_conv2d_geom *g) {
  dt_conv2d_geom t;
  const int transposed = transposed_geom(g, &t);
  const size_t wt = (size_t)g->C * g->OC * g->KH * g->KW; /* the transposed input gradient's flipped weights */
  size_t n, m;
  if (dt_wino_applies(g)) {
    n = dt_wino_weights_floats(g);
    if ((m = forward_floats(g)) > n) n = m;
    if (transposed && (m = wt + forward_floats(&t)) > n) n = m;
    return n;
  }
  const size_t blocks = (size_t)(g->threads < g->N ? (g->threads > 0 ? g->threads : 1) : g->N);
  n = blocks * block_floats(g);
  if ((m = forward_floats(g)) > n) n = m;
  if (dt_conv3x3_weights_applies(g) && (m = dt_conv3x3_weights_floats(g)) > n) n = m;
  if (transposed && (m = wt + forward_floats(&t)) > n) n = m;
  return n;
}

/* Output columns ow whose input column ow*stride - pad + kw lies inside [0, W): [*lo, *hi). */
static void valid_cols(const dt_conv2d_geom *g, int kw, int *lo, int *hi) {
  int s = g->stride, a = g->pad - kw, b = g->W - 1 + g->pad - kw;
  int l = a > 0 ? (a + s - 1) / s : 0;
  int h = b < 0 ? 0 : b / s + 1;
  if (h > g->OW) h = g->OW;
  if (l > h) l = h;
  *lo = l;
  *hi = h;
}

/* One output row of the unfolded input: d[ow] = row[ow*s + off] on [lo, hi), zero elsewhere (padding). */
static inline void unfold_row(float *restrict d, const float *restrict row, int OW, int s, int off, int lo, int hi) {
  for (int ow = 0; ow < lo; ow++) d[ow] = 0.0f;
  if (s == 1) {
    for (int ow = lo; ow < hi; ow++) d[ow] = row[ow + off];
  } else {
    for (int ow = lo; ow < hi; ow++) d[ow] = row[ow * s + off];
  }
  for (int ow = hi; ow < OW; ow++) d[ow] = 0.0f;
}

/* row[ow*s + off] += d[ow] on [lo, hi): the adjoint of unfold_row. */
static inline void fold_row(float *restrict row, const float *restrict d, int s, int off, int lo, int hi) {
  if (s == 1) {
    for (int ow = lo; ow < hi; ow++) row[ow + off] += d[ow];
  } else {
    for (int ow = lo; ow < hi; ow++) row[ow * s + off] += d[ow];
  }
}

/* col (C*KH*KW, OH*OW), rows ld floats apart, of one sample from inp_n (C, H, W); zero where the window hits
 * padding. */
static void im2col_sample(const dt_conv2d_geom *g, float *col, size_t ld, const float *inp_n) {
  const int KK = g->KH * g->KW, s = g->stride;
  const size_t HW = (size_t)g->H * g->W;
  for (int c = 0; c < g->C; c++) {
    const float *plane = inp_n + (size_t)c * HW;
    for (int kh = 0; kh < g->KH; kh++) {
      for (int kw = 0; kw < g->KW; kw++) {
        float *dst = col + ((size_t)c * KK + (size_t)kh * g->KW + kw) * ld;
        int lo, hi;
        valid_cols(g, kw, &lo, &hi);
        for (int oh = 0; oh < g->OH; oh++) {
          float *d = dst + (size_t)oh * g->OW;
          const int ih = oh * s - g->pad + kh;
          if (ih < 0 || ih >= g->H)
            memset(d, 0, (size_t)g->OW * sizeof(float));
          else
            unfold_row(d, plane + (size_t)ih * g->W, g->OW, s, kw - g->pad, lo, hi);
        }
      }
    }
  }
}

/* dinp_n (C, H, W) of one sample = sum of its dcol (C*KH*KW, OH*OW), rows ld floats apart, over the windows. */
static void col2im_sample(const dt_conv2d_geom *g, float *dinp_n, const float *dcol, size_t ld) {
  const int KK = g->KH * g->KW, s = g->stride;
  const size_t HW = (size_t)g->H * g->W;
  for (int c = 0; c < g->C; c++) {
    float *plane = dinp_n + (size_t)c * HW;
    memset(plane, 0, HW * sizeof(float));
    for (int kh = 0; kh < g->KH; kh++) {
      for (int kw = 0; kw < g->KW; kw++) {
        const float *src = dcol + ((size_t)c * KK + (size_t)kh * g->KW + kw) * ld;
        int lo, hi;
        valid_cols(g, kw, &lo, &hi);
        for (int oh = 0; oh < g->OH; oh++) {
          const int ih = oh * s - g->pad + kh;
          if (ih < 0 || ih >= g->H) continue;
          fold_row(plane + (size_t)ih * g->W, src + (size_t)oh * g->OW, s, kw - g->pad, lo, hi);
        }
      }
    }
  }
}

/* Per group of G samples (conv_group), the unfolded inputs side by side, col (R, G*P), stay in cache for one
 * GEMM: y (OC, G*P) = w (OC, R) @ col, written straight into the NCHW output when G = 1, else into the block's
 * y and copied out per sample. Groups are spread over the threads, one single-threaded GEMM each. */
static void forward_groups(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                           const float *b) {
  const int R = g->C * g->KH * g->KW, P = g->OH * g->OW, OC = g->OC, G = conv_group(g);
  const int groups = (g->N + G - 1) / G;
  const size_t HW = (size_t)g->H * g->W, GP = (size_t)G * P, block = block_floats(g);
#pragma omp parallel num_threads(conv_threads(g))
  {
    float *col = scratch + (size_t)omp_get_thread_num() * block, *y = col + 2 * R * GP;
    /* Dynamic: no sum crosses groups, so the bits do not depend on which thread took which (see conv_wino.c). */
#pragma omp for schedule(dynamic, 1)
    for (int gi = 0; gi < groups; gi++) {
      const int n0 = gi * G, gn = g->N - n0 < G ? g->N - n0 : G, cols = gn * P;
      for (int j = 0; j < gn; j++) im2col_sample(g, col + (size_t)j * P, (size_t)cols, inp + (size_t)(n0 + j) * g->C * HW);
      if (G == 1) {
        float *o = out + (size_t)n0 * OC * P;
        if (b)
          for (int oc = 0; oc < OC; oc++)
            for (int p = 0; p < P; p++) o[(size_t)oc * P + p] = b[oc];
        dt_lowp_gemm(g->amp, 0, 0, OC, P, R, 1.0f, w, R, col, P, b ? 1.0f : 0.0f, o, P);
        continue;
      }
      dt_lowp_gemm(g->amp, 0, 0, OC, cols, R, 1.0f, w, R, col, cols, 0.0f, y, cols);
      for (int j = 0; j < gn; j++)
        for (int oc = 0; oc < OC; oc++) {
          float *o = out + ((size_t)(n0 + j) * OC + oc) * P;
          const float *src = y + (size_t)oc * cols + (size_t)j * P;
          const float bias = b ? b[oc] : 0.0f;
          for (int p = 0; p < P; p++) o[p] = src[p] + bias;
        }
    }
  }
}

void dt_conv2d_forward(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                       const float *b) {
  if (dt_wino_applies(g))
    dt_wino_forward(g, out, scratch, inp, w, b);
  else if (dt_conv3x3_forward_applies(g))
    dt_conv3x3_forward(g, out, scratch, inp, w, b);
  else
    forward_groups(g, out, scratch, inp, w, b);
}

/* Per group of G samples, from dout in NCHW gathered as dy (OC, G*P) when G > 1: dw += dy @ col^T (col (R, G*P)
 * unfolded again, into cache), dcol (R, G*P) = w^T @ dy and its col2im per sample while dcol is in cache. Groups
 * are spread over the threads; with more than one thread each sums its dw into its own partial, added to dw at
 * the end in thread order. */
static void backward_groups(const dt_conv2d_geom *g, float *dinp, float *dw, float *scratch, const float *dout,
                            const float *inp, const float *w) {
  const int R = g->C * g->KH * g->KW, P = g->OH * g->OW, OC = g->OC, G = conv_group(g);
  const int groups = (g->N + G - 1) / G;
  const size_t HW = (size_t)g->H * g->W, GP = (size_t)G * P, block = block_floats(g);
#pragma omp parallel num_threads(conv_threads(g))
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float *col = scratch + (size_t)t * block, *dcol = col + (size_t)R * GP, *y = dcol + (size_t)R * GP;
    float *part = y + (G > 1 ? (size_t)OC * GP : 0); /* this thread's partial dw (OC, R) */
    float *mydw = nt > 1 ? part : dw;
    if (dw && nt > 1) memset(mydw, 0, (size_t)OC * R * sizeof(float));
#pragma omp for schedule(static)
    for (int gi = 0; gi < groups; gi++) {
      const int n0 = gi * G, gn = g->N - n0 < G ? g->N - n0 : G, cols = gn * P;
      const float *dy = dout + (size_t)n0 * OC * P;
      if (G > 1) {
        for (int j = 0; j < gn; j++)
          for (int oc = 0; oc < OC; oc++)
            memcpy(y + (size_t)oc * cols + (size_t)j * P, dout + ((size_t)(n0 + j) * OC + oc) * P, (size_t)P * sizeof(float));
        dy = y;
      }
      if (dw) {
        for (int j = 0; j < gn; j++)
          im2col_sample(g, col + (size_t)j * P, (size_t)cols, inp + (size_t)(n0 + j) * g->C * HW);
        dt_lowp_gemm(g->amp, 0, 1, OC, R, cols, 1.0f, dy, cols, col, cols, 1.0f, mydw, R);
      }
      if (dinp) {
        dt_lowp_gemm(g->amp, 1, 0, R, cols, OC, 1.0f, w, R, dy, cols, 0.0f, dcol, cols);
        for (int j = 0; j < gn; j++)
          col2im_sample(g, dinp + (size_t)(n0 + j) * g->C * HW, dcol + (size_t)j * P, (size_t)cols);
      }
    }
    if (dw && nt > 1) {
      float *part0 = scratch + 2 * (size_t)R * GP + (G > 1 ? (size_t)OC * GP : 0);
#pragma omp for schedule(static)
      for (int i = 0; i < OC * R; i++) {
        float acc = dw[i];
        for (int k = 0; k < nt; k++) acc += part0[(size_t)k * block + i];
        dw[i] = acc;
      }
    }
  }
}

/* dinp as the forward of the transposed geometry tg: wt[c][oc][kh][kw] = w[oc][c][KH-1-kh][KW-1-kw], at the
 * start of the scratch, the forward's own scratch after it. */
static void transposed_input_grad(const dt_conv2d_geom *g, const dt_conv2d_geom *tg, float *dinp, float *scratch,
                                  const float *dout, const float *w) {
  const int C = g->C, OC = g->OC, KK = g->KH * g->KW;
  float *wt = scratch;
  for (int oc = 0; oc < OC; oc++)
    for (int c = 0; c < C; c++)
      for (int k = 0; k < KK; k++) wt[((size_t)c * OC + oc) * KK + (KK - 1 - k)] = w[((size_t)oc * C + c) * KK + k];
  dt_conv2d_forward(tg, dinp, scratch + (size_t)C * OC * KK, dout, wt, NULL);
}

int dt_conv2d_weights_direct(const dt_conv2d_geom *g) { return !dt_wino_applies(g) && dt_conv3x3_weights_applies(g); }

void dt_conv2d_backward(const dt_conv2d_geom *g, float *dinp, float *dw, float *db, float *scratch,
                        const float *dout, const float *inp, const float *w) {
  const int P = g->OH * g->OW, OC = g->OC;
  if (db) {
#pragma omp parallel for schedule(static)
    for (int oc = 0; oc < OC; oc++) {
      double sum = 0.0;
      for (int n = 0; n < g->N; n++) sum += sum_floats(dout + ((size_t)n * OC + oc) * P, P);
      db[oc] += (float)sum;
    }
  }
  dt_conv2d_geom tg;
  const int wino_dw = dw && dt_wino_applies(g), direct_dw = dw && dt_conv2d_weights_direct(g);
  const int transposed = dinp && transposed_geom(g, &tg);
  if (wino_dw)
    dt_wino_weights(g, dw, scratch, dout, inp);
  else if (direct_dw)
    dt_conv3x3_weights(g, dw, scratch, dout, inp);
  float *gemm_dw = wino_dw || direct_dw ? NULL : dw, *gemm_dinp = transposed ? NULL : dinp;
  if (gemm_dw || gemm_dinp) backward_groups(g, gemm_dinp, gemm_dw, scratch, dout, inp, w);
  if (transposed) transposed_input_grad(g, &tg, dinp, scratch, dout, w);
}

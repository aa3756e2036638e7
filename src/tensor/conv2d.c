/* conv2d kernels: per sample, im2col into a per-thread buffer and GEMMs on NCHW data (col2im for backward). */
#include <limits.h>
#include <omp.h>
#include <string.h>

#include "core/impl.h"
#include "tensor/kernels.h"

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
  return DT_OK;
}

/* Threads used: one sample each at a time, at most N and at most g->threads (the scratch's blocks). */
static int conv_threads(const dt_conv2d_geom *g) {
  int t = omp_get_max_threads();
  if (t > g->N) t = g->N;
  if (t > g->threads) t = g->threads;
  return t > 0 ? t : 1;
}

/* Per thread block: one sample's col and dcol (C*KH*KW, OH*OW) and a partial dw (OC, C*KH*KW). */
size_t dt_conv2d_scratch_floats(const dt_conv2d_geom *g) {
  const size_t R = (size_t)g->C * g->KH * g->KW;
  const size_t blocks = (size_t)(g->threads < g->N ? (g->threads > 0 ? g->threads : 1) : g->N);
  return blocks * (2 * R * g->OH * g->OW + (size_t)g->OC * R);
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

/* col (C*KH*KW, OH*OW) of one sample from inp_n (C, H, W); zero where the window hits padding. */
static void im2col_sample(const dt_conv2d_geom *g, float *col, const float *inp_n) {
  const int KK = g->KH * g->KW, P = g->OH * g->OW, s = g->stride;
  const size_t HW = (size_t)g->H * g->W;
  for (int c = 0; c < g->C; c++) {
    const float *plane = inp_n + (size_t)c * HW;
    for (int kh = 0; kh < g->KH; kh++) {
      for (int kw = 0; kw < g->KW; kw++) {
        float *dst = col + ((size_t)c * KK + (size_t)kh * g->KW + kw) * P;
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

/* dinp_n (C, H, W) of one sample = sum of its dcol (C*KH*KW, OH*OW) over the windows. */
static void col2im_sample(const dt_conv2d_geom *g, float *dinp_n, const float *dcol) {
  const int KK = g->KH * g->KW, P = g->OH * g->OW, s = g->stride;
  const size_t HW = (size_t)g->H * g->W;
  for (int c = 0; c < g->C; c++) {
    float *plane = dinp_n + (size_t)c * HW;
    memset(plane, 0, HW * sizeof(float));
    for (int kh = 0; kh < g->KH; kh++) {
      for (int kw = 0; kw < g->KW; kw++) {
        const float *src = dcol + ((size_t)c * KK + (size_t)kh * g->KW + kw) * P;
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

/* sum of x (n); 8 independent lanes so the compiler vectorises it without reassociating on its own. */
static double sum_floats(const float *x, int n) {
  float lane[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) lane[j] += x[i + j];
  double s = 0.0;
  for (int j = 0; j < 8; j++) s += lane[j];
  for (; i < n; i++) s += x[i];
  return s;
}


/* Per sample, the unfolded input stays in cache for its GEMM, written straight into the NCHW output:
 * out_n (OC, P) = w (OC, R) @ col_n (R, P). Samples are spread over the threads, one GEMM each. */
void dt_conv2d_forward(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                       const float *b) {
  const int R = g->C * g->KH * g->KW, P = g->OH * g->OW;
  const size_t HW = (size_t)g->H * g->W;
#pragma omp parallel num_threads(conv_threads(g))
  {
    float *col = scratch + (size_t)omp_get_thread_num() * R * P;
#pragma omp for schedule(static)
    for (int n = 0; n < g->N; n++) {
      float *o = out + (size_t)n * g->OC * P;
      im2col_sample(g, col, inp + (size_t)n * g->C * HW);
      if (b)
        for (int oc = 0; oc < g->OC; oc++)
          for (int p = 0; p < P; p++) o[(size_t)oc * P + p] = b[oc];
      dt_sgemm(0, 0, g->OC, P, R, 1.0f, w, R, col, P, b ? 1.0f : 0.0f, o, P);
    }
  }
}

/* Per sample, from dout in NCHW: dw += dout_n (OC, P) @ col_n^T (col_n unfolded again, into cache),
 * dcol_n = w^T @ dout_n and its col2im while dcol_n is in cache. Samples are spread over the threads;
 * with more than one thread each sums its dw into its own partial, added to dw at the end. */
void dt_conv2d_backward(const dt_conv2d_geom *g, float *dinp, float *dw, float *db, float *scratch,
                        const float *dout, const float *inp, const float *w) {
  const int R = g->C * g->KH * g->KW, P = g->OH * g->OW, OC = g->OC;
  const size_t HW = (size_t)g->H * g->W;
  if (db) {
#pragma omp parallel for schedule(static)
    for (int oc = 0; oc < OC; oc++) {
      double sum = 0.0;
      for (int n = 0; n < g->N; n++) sum += sum_floats(dout + ((size_t)n * OC + oc) * P, P);
      db[oc] += (float)sum;
    }
  }
  if (!dw && !dinp) return;
  const int T = conv_threads(g);
  float *part = scratch + (size_t)T * 2 * R * P; /* T partial dw (OC, R) */
#pragma omp parallel num_threads(T)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float *col = scratch + (size_t)t * 2 * R * P, *dcol = col + (size_t)R * P;
    float *mydw = nt > 1 ? part + (size_t)t * OC * R : dw;
    if (dw && nt > 1) memset(mydw, 0, (size_t)OC * R * sizeof(float));
#pragma omp for schedule(static)
    for (int n = 0; n < g->N; n++) {
      const float *dy = dout + (size_t)n * OC * P;
      if (dw) {
        im2col_sample(g, col, inp + (size_t)n * g->C * HW);
        dt_sgemm(0, 1, OC, R, P, 1.0f, dy, P, col, P, 1.0f, mydw, R);
      }
      if (dinp) {
        dt_sgemm(1, 0, R, P, OC, 1.0f, w, R, dy, P, 0.0f, dcol, P);
        col2im_sample(g, dinp + (size_t)n * g->C * HW, dcol);
      }
    }
    if (dw && nt > 1) {
#pragma omp for schedule(static)
      for (int i = 0; i < OC * R; i++) {
        float acc = dw[i];
        for (int k = 0; k < nt; k++) acc += part[(size_t)k * OC * R + i];
        dw[i] = acc;
      }
    }
  }
}

/* conv2d kernels: im2col over the whole batch, one GEMM, reorder to NCHW (and the reverse for backward). */
#include <limits.h>
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
  return DT_OK;
}

/* (C*KH*KW, N*OH*OW) */
size_t dt_conv2d_col_floats(const dt_conv2d_geom *g) {
  return (size_t)g->C * g->KH * g->KW * (size_t)g->N * g->OH * g->OW;
}

/* forward: the GEMM result (OC, N*OH*OW); backward: dout as (OC, N*OH*OW) plus dcol (C*KH*KW, N*OH*OW) */
size_t dt_conv2d_scratch_floats(const dt_conv2d_geom *g) {
  return ((size_t)g->OC + (size_t)g->C * g->KH * g->KW) * (size_t)g->N * g->OH * g->OW;
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

/* col (C*KH*KW, N, OH, OW) from inp (N, C, H, W); zero where the window hits padding.
 * Channel-major iteration: each thread streams through the KH*KW rows of col of its channels in order
 * (few, sequential streams), and one (n, c) input plane stays in L1 while its pieces are written. */
static void im2col(const dt_conv2d_geom *g, float *col, const float *inp) {
  const int KK = g->KH * g->KW, P = g->OH * g->OW, s = g->stride;
  const size_t NP = (size_t)g->N * P, HW = (size_t)g->H * g->W;
#pragma omp parallel for collapse(2) schedule(static)
  for (int c = 0; c < g->C; c++) {
    for (int n = 0; n < g->N; n++) {
      const float *plane = inp + ((size_t)n * g->C + c) * HW;
      for (int kh = 0; kh < g->KH; kh++) {
        for (int kw = 0; kw < g->KW; kw++) {
          float *dst = col + ((size_t)c * KK + (size_t)kh * g->KW + kw) * NP + (size_t)n * P;
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
}

/* dinp (N, C, H, W) = sum of dcol (C*KH*KW, N, OH, OW) over the windows; one (n, c) plane per iteration,
 * channel-major like im2col so the reads of dcol are a few sequential streams. */
static void col2im(const dt_conv2d_geom *g, float *dinp, const float *dcol) {
  const int KK = g->KH * g->KW, P = g->OH * g->OW, s = g->stride;
  const size_t NP = (size_t)g->N * P, HW = (size_t)g->H * g->W;
#pragma omp parallel for collapse(2) schedule(static)
  for (int c = 0; c < g->C; c++) {
    for (int n = 0; n < g->N; n++) {
      float *plane = dinp + ((size_t)n * g->C + c) * HW;
      memset(plane, 0, HW * sizeof(float));
      for (int kh = 0; kh < g->KH; kh++) {
        for (int kw = 0; kw < g->KW; kw++) {
          const float *src = dcol + ((size_t)c * KK + (size_t)kh * g->KW + kw) * NP + (size_t)n * P;
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

void dt_conv2d_forward(const dt_conv2d_geom *g, float *out, float *col, float *scratch, const float *inp,
                       const float *w, const float *b) {
  const int R = g->C * g->KH * g->KW, P = g->OH * g->OW, NP = g->N * P;
  im2col(g, col, inp);
  float *omat = scratch; /* (OC, N*P) = w (OC, R) @ col (R, N*P) */
  dt_sgemm(0, 0, g->OC, NP, R, 1.0f, w, R, col, NP, 0.0f, omat, NP);
#pragma omp parallel for collapse(2) schedule(static)
  for (int n = 0; n < g->N; n++) {
    for (int oc = 0; oc < g->OC; oc++) {
      const float *src = omat + (size_t)oc * NP + (size_t)n * P;
      float *dst = out + ((size_t)n * g->OC + oc) * P;
      const float bias = b ? b[oc] : 0.0f;
      for (int p = 0; p < P; p++) dst[p] = src[p] + bias;
    }
  }
}

void dt_conv2d_backward(const dt_conv2d_geom *g, float *dinp, float *dw, float *db, float *scratch,
                        const float *dout, const float *col, const float *w) {
  const int R = g->C * g->KH * g->KW, P = g->OH * g->OW, NP = g->N * P;
  float *dmat = dw || dinp ? scratch : NULL;  /* (OC, N*P) */
  float *dcol = scratch + (size_t)g->OC * NP; /* (R, N*P) */
  /* One pass over dout: reorder it to dmat and sum it into db (while the plane is in L1). */
  if (dmat || db) {
#pragma omp parallel for schedule(static)
    for (int oc = 0; oc < g->OC; oc++) {
      double sum = 0.0;
      for (int n = 0; n < g->N; n++) {
        const float *src = dout + ((size_t)n * g->OC + oc) * P;
        if (dmat) memcpy(dmat + (size_t)oc * NP + (size_t)n * P, src, (size_t)P * sizeof(float));
        if (db) sum += sum_floats(src, P);
      }
      if (db) db[oc] += (float)sum;
    }
  }
  if (!dmat) return;
  if (dw) dt_sgemm(0, 1, g->OC, R, NP, 1.0f, dmat, NP, col, NP, 1.0f, dw, R); /* += (OC, NP) @ (NP, R) */
  if (dinp) {
    dt_sgemm(1, 0, R, NP, g->OC, 1.0f, w, R, dmat, NP, 0.0f, dcol, NP); /* (R, OC) @ (OC, NP) */
    col2im(g, dinp, dcol);
  }
}

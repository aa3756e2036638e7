/* Winograd F(m x m, 3x3), m = 2 or 4, stride 1, padding 0 to 2: forward and weight gradient (conv_wino.h says
 * what it computes).
 *
 * With d an a x a input tile (a = m + 2), w a 3x3 kernel and y the m x m outputs of the tile:
 *   y = A^T [(G w G^T) . (B^T d B)] A  (. element-wise),
 * and, its adjoint for the weights, dw = G^T [(A dy A^T) . (B^T d B)] G summed over tiles. The matrices are
 * Lavin and Gray's (points 0, 1, -1 for m = 2; 0, 1, -1, 2, -2 for m = 4), applied line by line below:
 *   m = 2: B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
 *          A^T = [1 1 1 0; 0 1 -1 -1];
 *   m = 4: B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1],
 *          G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1],
 *          A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1].
 * Tile (i, j) covers outputs (m i, m j) to (m i + m-1, m j + m-1) and inputs from (m i - pad, m j - pad); tiles
 * that pass the bottom or right edge read zeros there and only what lies inside is kept.
 *
 * Layout. Per sample, the input is copied into blocks of 8 channels with a zero border of pad, (C/8, PH, PW, 8), so a
 * tile's a x a positions are vector loads of 8 channels. Tiles are taken TB at a time: the block's transformed
 * inputs V (a*a, TB, C) and the products M (a*a, TB, OC) stay in L2 from the transform through the a*a small
 * GEMMs to the inverse transform, which writes the sample's outputs blocked the same way before they are
 * unpacked into planes (the output gradient is packed the same way for the weight gradient). The input gradient
 * needs nothing here: conv2d.c computes it as this forward of the transposed convolution. */
#include <omp.h>
#include <string.h>

#include "tensor/conv_wino.h"
#include "tensor/v16.h"
#include "tensor/v8.h"

#define AI __attribute__((always_inline))
#define RB 6               /* register block: RB rows (tiles, or input channels for the gradient) x 16 outputs
                            * (8 wide; the 16-wide blocks are RB16 below) */
#define BLOCK_FLOATS 65536 /* a block's V and M together: 256 KiB */
#define TB_MAX 120

/* The a*a GEMMs stream their transformed kernel (C, OC) once per RB tiles: past 256 KiB it leaves L2 (resnet18's
 * 512 channels: 26-51 GFLOP/s against 100-185 for 64 to 256). */
#define MAX_KERNEL_FLOATS 65536
/* Under amp the operands arrive on the low-precision grid and the result, computed in f32, is autocast's
 * (low-precision operands, f32 sums) up to f32 rounding; it stays even where bf16 GEMMs are native, being
 * faster than them on these layers (docs/benchmarks.md). */
int dt_wino_applies(const dt_conv2d_geom *g) {
  return g->KH == 3 && g->KW == 3 && g->stride == 1 && g->pad >= 0 && g->pad <= 2 && g->C % 8 == 0 &&
         g->OC % 8 == 0 &&
         (int64_t)g->C * g->OC <= MAX_KERNEL_FLOATS;
}

/* Outputs a side per tile: F(4x4, 3x3) does 36 products per 16 outputs where F(2x2, 3x3) does 16 per 4 (1.8x
 * fewer), with transforms that cost less per output too, but its blocks of whole tiles suit neither small maps
 * (an 8x8 map is 4 tiles) nor wide kernels (fewer tiles share each streamed transformed kernel). Measured on
 * resnet20's and resnet18's layers (bench/conv_kernels --algos): F(4x4) up to 1.8x faster on 16-32 channels at
 * 16x16 and 32x32 and 64 at 56x56, as fast with 128 at 28x28, slower on 64 at 8x8 and 256 at 14x14. Its f32 error
 * is larger (resnet18's gradients 6.7e-5 from torch's against 2.4e-5, within the 1e-4 of the parity tests). */
static int tile_outputs(const dt_conv2d_geom *g) { return g->OH >= 16 && g->OW >= 16 && g->C + g->OC <= 256 ? 4 : 2; }

/* One convolution's tiling: everything below reads it. */
typedef struct tiling {
  int m, a, xi;   /* outputs a side of a tile, inputs a side, transformed elements (a*a) */
  int th, tw;     /* tiles down and across */
  int ph, pw;     /* the bordered input planes: m*th + 2 by m*tw + 2 (the input from (pad, pad); OH = H + 2 pad - 2
                  * so it fits) */
  int oh, ow;     /* the blocked output (gradient) planes: m*th by m*tw */
  int tb;         /* tiles per block */
} tiling;

static tiling tiling_of(const dt_conv2d_geom *g) {
  tiling t;
  t.m = tile_outputs(g), t.a = t.m + 2, t.xi = t.a * t.a;
  t.th = (g->OH + t.m - 1) / t.m, t.tw = (g->OW + t.m - 1) / t.m;
  t.ph = t.m * t.th + 2, t.pw = t.m * t.tw + 2, t.oh = t.m * t.th, t.ow = t.m * t.tw;
  const int tb = BLOCK_FLOATS / (t.xi * (g->C + g->OC)) / RB * RB, tiles = (t.th * t.tw + RB - 1) / RB * RB;
  t.tb = tb < RB ? RB : tb > TB_MAX ? TB_MAX : tb;
  if (t.tb > tiles) t.tb = tiles; /* no more than a sample has */
  return t;
}

/* Threads: one sample at a time each, at most N and g->threads (the scratch's blocks). */
static int threads_for(const dt_conv2d_geom *g) {
  int t = omp_get_max_threads();
  if (t > g->N) t = g->N;
  if (t > g->threads) t = g->threads;
  return t > 0 ? t : 1;
}
static size_t blocks(const dt_conv2d_geom *g) {
  return (size_t)(g->threads < g->N ? (g->threads > 0 ? g->threads : 1) : g->N);
}

/* Per thread: the bordered input, the blocked output (gradient), a block's V and M (or Z), and for the weight
 * gradient a partial of the transformed sums. */
static size_t input_floats(const dt_conv2d_geom *g, const tiling *t) { return (size_t)g->C * t->ph * t->pw; }
static size_t output_floats(const dt_conv2d_geom *g, const tiling *t) { return (size_t)g->OC * t->oh * t->ow; }
static size_t kernel_floats(const dt_conv2d_geom *g, const tiling *t) { return (size_t)t->xi * g->C * g->OC; }
static size_t forward_block(const dt_conv2d_geom *g, const tiling *t) {
  return input_floats(g, t) + output_floats(g, t) + (size_t)t->xi * t->tb * (g->C + g->OC);
}
static size_t weights_block(const dt_conv2d_geom *g, const tiling *t) {
  return forward_block(g, t) + kernel_floats(g, t);
}
size_t dt_wino_forward_floats(const dt_conv2d_geom *g) {
  const tiling t = tiling_of(g);
  return kernel_floats(g, &t) + blocks(g) * forward_block(g, &t);
}
size_t dt_wino_weights_floats(const dt_conv2d_geom *g) {
  const tiling t = tiling_of(g);
  return kernel_floats(g, &t) + blocks(g) * weights_block(g, &t);
}

/* ---- between planes and blocks of 8 channels ---- */

/* r[k][l] <-> r[l][k]: the AVX sequence (unpack, shuffle, 128-bit permute) in vector-extension shuffles. */
#define SHUF(a, b, ...) __builtin_shufflevector((a), (b), __VA_ARGS__)
static inline void transpose8(v8 r[8]) {
  v8 t[8], s[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = SHUF(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = SHUF(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4)
    for (int h = 0; h < 2; h++) {
      s[k + 2 * h] = SHUF(t[k + h], t[k + 2 + h], 0, 1, 8, 9, 4, 5, 12, 13);
      s[k + 2 * h + 1] = SHUF(t[k + h], t[k + 2 + h], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int k = 0; k < 4; k++) {
    r[k] = SHUF(s[k], s[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[k + 4] = SHUF(s[k], s[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

/* Eight vectors of 8 floats, src + k * ss for k < 8, transposed into dst + k * ds. */
static inline void transpose_copy(const float *src, size_t ss, float *dst, size_t ds) {
  v8 r[8];
  for (int k = 0; k < 8; k++) r[k] = load8(src + k * ss);
  transpose8(r);
  for (int k = 0; k < 8; k++) store8(dst + k * ds, r[k]);
}

/* Between planes (C, H, W) and blocks of 8 channels (C/8, PH, PW, 8) whose interior starts at (off, off):
 * 8 channels x 8 columns at a time through a transpose. Columns past the last multiple of 8 go through one more
 * transpose of the row's last 8 columns (rewriting some with the same values; fashioncnn's rows are 12 and 14
 * wide), or one by one in rows narrower than 8. */
static void pack_blocked(float *X, const float *src, int C, int H, int W, int PH, int PW, int off) {
  const size_t HW = (size_t)H * W;
  for (int cb = 0; cb < C / 8; cb++)
    for (int h = 0; h < H; h++) {
      const float *p = src + (size_t)8 * cb * HW + (size_t)h * W;
      float *x = X + (((size_t)cb * PH + h + off) * PW + off) * 8;
      int w = 0;
      for (; w + 8 <= W; w += 8) transpose_copy(p + w, HW, x + (size_t)w * 8, 8);
      if (w < W && W >= 8) transpose_copy(p + W - 8, HW, x + (size_t)(W - 8) * 8, 8);
      else
        for (; w < W; w++)
          for (int l = 0; l < 8; l++) x[(size_t)w * 8 + l] = p[l * HW + w];
    }
}

static void unpack_blocked(float *dst, const float *Y, int C, int H, int W, int PH, int PW) {
  const size_t HW = (size_t)H * W;
  for (int cb = 0; cb < C / 8; cb++)
    for (int h = 0; h < H; h++) {
      float *p = dst + (size_t)8 * cb * HW + (size_t)h * W;
      const float *y = Y + ((size_t)cb * PH + h) * PW * 8;
      int w = 0;
      for (; w + 8 <= W; w += 8) transpose_copy(y + (size_t)w * 8, 8, p + w, HW);
      if (w < W && W >= 8) transpose_copy(y + (size_t)(W - 8) * 8, 8, p + W - 8, HW);
      else
        for (; w < W; w++)
          for (int l = 0; l < 8; l++) p[l * HW + w] = y[(size_t)w * 8 + l];
    }
}

/* ---- the transforms, one line (row or column) of a tile at a time ---- */

/* o (a) = B^T d (a) */
static inline AI void bt_line(int m, v8 *o, const v8 *d) {
  if (m == 2) {
    o[0] = d[0] - d[2], o[1] = d[1] + d[2], o[2] = d[2] - d[1], o[3] = d[1] - d[3];
    return;
  }
  const v8 a = d[4] - 4.0f * d[2], b = d[3] - 4.0f * d[1], c = d[4] - d[2], e = 2.0f * (d[3] - d[1]);
  o[0] = 4.0f * d[0] - 5.0f * d[2] + d[4], o[1] = a + b, o[2] = a - b, o[3] = c + e, o[4] = c - e;
  o[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
}

/* y (m) = A^T p (a) */
static inline AI void at_line(int m, v8 *y, const v8 *p) {
  if (m == 2) {
    y[0] = p[0] + p[1] + p[2], y[1] = p[1] - p[2] - p[3];
    return;
  }
  const v8 s = p[1] + p[2], d = p[1] - p[2], s2 = p[3] + p[4], d2 = p[3] - p[4];
  y[0] = p[0] + s + s2, y[1] = d + 2.0f * d2, y[2] = s + 4.0f * s2, y[3] = d + 8.0f * d2 + p[5];
}

/* z (a) = A y (m) */
static inline AI void a_line(int m, v8 *z, const v8 *y) {
  if (m == 2) {
    z[0] = y[0], z[1] = y[0] + y[1], z[2] = y[0] - y[1], z[3] = -y[1];
    return;
  }
  const v8 e = y[0] + y[2], o = y[1] + y[3], e4 = y[0] + 4.0f * y[2], o4 = 2.0f * y[1] + 8.0f * y[3];
  z[0] = y[0], z[1] = e + o, z[2] = e - o, z[3] = e4 + o4, z[4] = e4 - o4, z[5] = y[3];
}

/* u (a) = G w (3) */
static void g_line(int m, float *u, const float *w) {
  if (m == 2) {
    u[0] = w[0], u[1] = 0.5f * (w[0] + w[1] + w[2]), u[2] = 0.5f * (w[0] - w[1] + w[2]), u[3] = w[2];
    return;
  }
  u[0] = w[0] / 4, u[1] = -(w[0] + w[1] + w[2]) / 6, u[2] = -(w[0] - w[1] + w[2]) / 6;
  u[3] = w[0] / 24 + w[1] / 12 + w[2] / 6, u[4] = w[0] / 24 - w[1] / 12 + w[2] / 6, u[5] = w[2];
}

/* w (3) = G^T s (a) */
static void gt_line(int m, float *w, const float *s) {
  if (m == 2) {
    w[0] = s[0] + 0.5f * (s[1] + s[2]), w[1] = 0.5f * (s[1] - s[2]), w[2] = 0.5f * (s[1] + s[2]) + s[3];
    return;
  }
  w[0] = s[0] / 4 - (s[1] + s[2]) / 6 + (s[3] + s[4]) / 24;
  w[1] = (s[2] - s[1]) / 6 + (s[3] - s[4]) / 12;
  w[2] = (s[3] + s[4] - s[1] - s[2]) / 6 + s[5];
}

/* U[xi][c][oc] = (G w[oc][c] G^T)[xi] */
static void transform_weights(const tiling *t, float *U, const float *w, int C, int OC) {
  const int a = t->a, m = t->m;
#pragma omp parallel for schedule(static)
  for (int oc = 0; oc < OC; oc++)
    for (int c = 0; c < C; c++) {
      const float *k = w + ((size_t)oc * C + c) * 9;
      float gw[6][3], u[6];
      for (int s = 0; s < 3; s++) {
        const float col[3] = {k[s], k[3 + s], k[6 + s]};
        g_line(m, u, col);
        for (int r = 0; r < a; r++) gw[r][s] = u[r];
      }
      for (int r = 0; r < a; r++) {
        g_line(m, u, gw[r]);
        for (int s = 0; s < a; s++) U[((size_t)(a * r + s) * C + c) * OC + oc] = u[s];
      }
    }
}

/* dw[oc][c] += G^T S[.][c][oc] G */
static void untransform_grads(const tiling *t, float *dw, const float *S, int C, int OC) {
  const int a = t->a, m = t->m;
#pragma omp for schedule(static)
  for (int oc = 0; oc < OC; oc++)
    for (int c = 0; c < C; c++) {
      float h[3][6], col[6], o[3];
      for (int q = 0; q < a; q++) {
        for (int r = 0; r < a; r++) col[r] = S[((size_t)(a * r + q) * C + c) * OC + oc];
        gt_line(m, o, col);
        for (int k = 0; k < 3; k++) h[k][q] = o[k];
      }
      float *d = dw + ((size_t)oc * C + c) * 9;
      for (int k = 0; k < 3; k++) {
        gt_line(m, o, h[k]);
        for (int j = 0; j < 3; j++) d[3 * k + j] += o[j];
      }
    }
}

/* ---- tiles: 8 channels at a time, positions `row` floats apart down and 8 across ---- */

/* v[xi * xs] = (B^T d B)[xi], d the a x a tile at x */
static inline AI void input_tile(int m, float *v, size_t xs, const float *x, size_t row) {
  const int a = m + 2;
  v8 d[6], o[6], t[6][6];
  for (int s = 0; s < a; s++) {
    for (int r = 0; r < a; r++) d[r] = load8(x + r * row + 8 * s);
    bt_line(m, o, d);
    for (int r = 0; r < a; r++) t[r][s] = o[r];
  }
  for (int r = 0; r < a; r++) {
    bt_line(m, o, t[r]);
    for (int s = 0; s < a; s++) store8(v + (size_t)(a * r + s) * xs, o[s]);
  }
}

/* y (m x m at y) = A^T p A + bias, p[xi * xs] a tile's products */
static inline AI void output_tile(int m, float *y, size_t row, const float *p, size_t xs, v8 bias) {
  const int a = m + 2;
  v8 col[6], o[4], q[4][6];
  for (int s = 0; s < a; s++) {
    for (int r = 0; r < a; r++) col[r] = load8(p + (size_t)(a * r + s) * xs);
    at_line(m, o, col);
    for (int k = 0; k < m; k++) q[k][s] = o[k];
  }
  for (int k = 0; k < m; k++) {
    at_line(m, o, q[k]);
    for (int j = 0; j < m; j++) {
      const v8 v = o[j] + bias;
      store8(y + k * row + 8 * j, v);
    }
  }
}

/* z[xi * zs] = (A dy A^T)[xi], dy the m x m output gradients at d */
static inline AI void grad_tile(int m, float *z, size_t zs, const float *d, size_t row) {
  const int a = m + 2;
  v8 y[4], o[6], t[6][4];
  for (int j = 0; j < m; j++) {
    for (int k = 0; k < m; k++) y[k] = load8(d + k * row + 8 * j);
    a_line(m, o, y);
    for (int r = 0; r < a; r++) t[r][j] = o[r];
  }
  for (int r = 0; r < a; r++) {
    a_line(m, o, t[r]);
    for (int s = 0; s < a; s++) store8(z + (size_t)(a * r + s) * zs, o[s]);
  }
}

/* The block's tiles t0 .. t0+nt-1 of a sample (tile t is row t / tw, column t % tw); each function is compiled
 * once per tile size (m a constant in the wrappers below). */
static inline AI void inputs_m(int m, const tiling *tl, float *V, const float *X, int C, int t0, int nt) {
  for (int t = 0; t < nt; t++) {
    const int i = (t0 + t) / tl->tw, j = (t0 + t) % tl->tw;
    for (int cb = 0; cb < C / 8; cb++)
      input_tile(m, V + (size_t)t * C + 8 * cb, (size_t)tl->tb * C,
                 X + (((size_t)cb * tl->ph + m * i) * tl->pw + m * j) * 8, (size_t)tl->pw * 8);
  }
}
static inline AI void grads_m(int m, const tiling *tl, float *Z, const float *D, int OC, int t0, int nt) {
  for (int t = 0; t < nt; t++) {
    const int i = (t0 + t) / tl->tw, j = (t0 + t) % tl->tw;
    for (int ob = 0; ob < OC / 8; ob++)
      grad_tile(m, Z + (size_t)t * OC + 8 * ob, (size_t)tl->tb * OC,
                D + (((size_t)ob * tl->oh + m * i) * tl->ow + m * j) * 8, (size_t)tl->ow * 8);
  }
}
/* Into the sample's blocked output (OC/8, oh, ow, 8): whole vectors, unpacked into planes afterwards. (Stored
 * straight into the planes, 8 scalars to 8 planes a vector, this step took 45% of the forward.) */
static inline AI void outputs_m(int m, const tiling *tl, float *Y, const float *M, const float *bias, int OC, int t0,
                                int nt) {
  for (int t = 0; t < nt; t++) {
    const int i = (t0 + t) / tl->tw, j = (t0 + t) % tl->tw;
    for (int o = 0; o < OC; o += 8)
      output_tile(m, Y + (((size_t)(o / 8) * tl->oh + m * i) * tl->ow + m * j) * 8, (size_t)tl->ow * 8,
                  M + (size_t)t * OC + o, (size_t)tl->tb * OC, bias ? load8(bias + o) : splat8(0.0f));
  }
}
static void transform_inputs(const tiling *tl, float *V, const float *X, int C, int t0, int nt) {
  if (tl->m == 2)
    inputs_m(2, tl, V, X, C, t0, nt);
  else
    inputs_m(4, tl, V, X, C, t0, nt);
}
static void transform_grads(const tiling *tl, float *Z, const float *D, int OC, int t0, int nt) {
  if (tl->m == 2)
    grads_m(2, tl, Z, D, OC, t0, nt);
  else
    grads_m(4, tl, Z, D, OC, t0, nt);
}
static void transform_outputs(const tiling *tl, float *Y, const float *M, const float *bias, int OC, int t0, int nt) {
  if (tl->m == 2)
    outputs_m(2, tl, Y, M, bias, OC, t0, nt);
  else
    outputs_m(4, tl, Y, M, bias, OC, t0, nt);
}

/* ---- the products: per transformed element, sums over input channels (forward) or tiles (weights) ---- */

/* Row blocks: n rows (tiles, or input channels for the weights) go in as few blocks of at most R as they need, of
 * sizes that differ by at most one: 9 tiles in blocks of 6 run as 5 + 4, not as 6 and 3 repeated to 6. No block
 * computes rows it throws away, and each keeps enough accumulators to hide the FMA latency. A row's sums do not
 * depend on its block, so neither do the bits. The rows of the next block, blocks_left of them still to go: */
static inline int block_rows(int left, int blocks_left) { return (left + blocks_left - 1) / blocks_left; }

/* BODY(r) with r = rows as a compile-time constant, up to 6 or 12: a block's accumulators stay in registers only
 * where their count is known. */
#define WITH_ROWS_6(rows, BODY)                                                                                    \
  switch (rows) {                                                                                                  \
  case 1: BODY(1); break;                                                                                          \
  case 2: BODY(2); break;                                                                                          \
  case 3: BODY(3); break;                                                                                          \
  case 4: BODY(4); break;                                                                                          \
  case 5: BODY(5); break;                                                                                          \
  case 6: BODY(6); break;                                                                                          \
  default: __builtin_trap(); /* block_rows gives 1 to R */                                                        \
  }
#define WITH_ROWS_12(rows, BODY)                                                                                   \
  switch (rows) {                                                                                                  \
  case 7: BODY(7); break;                                                                                          \
  case 8: BODY(8); break;                                                                                          \
  case 9: BODY(9); break;                                                                                          \
  case 10: BODY(10); break;                                                                                        \
  case 11: BODY(11); break;                                                                                        \
  case 12: BODY(12); break;                                                                                        \
  default: WITH_ROWS_6(rows, BODY);                                                                                \
  }

/* m (R, 8*nv) = sum over k < K of a[r][k] * b[k][.]: R rows at pointers a[r], b's rows ldb apart, m's ldm. */
static inline AI void product_block(float *m, size_t ldm, const float *const *a, const float *b, size_t ldb, int K,
                                    int R, int nv) {
  v8 acc[RB][2];
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = splat8(0.0f);
  for (int k = 0; k < K; k++) {
    v8 b0 = load8(b + (size_t)k * ldb), b1 = nv > 1 ? load8(b + (size_t)k * ldb + 8) : splat8(0.0f);
    KEEP(b0);
    KEEP(b1);
    for (int r = 0; r < R; r++) {
      const v8 x = splat8(a[r][k]);
      acc[r][0] = fma8(x, b0, acc[r][0]);
      if (nv > 1) acc[r][1] = fma8(x, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int v = 0; v < nv; v++) store8(m + (size_t)r * ldm + 8 * v, acc[r][v]);
}

/* Weight gradient: s (C, OC) += V^T @ Z over nt tiles, R input channels from c0 x 8*nv outputs, V (nt, C) read a
 * tile row at a time. */
static inline AI void gradient_block(float *s, int OC, const float *V, int C, int c0, const float *z, int nt, int R,
                                     int nv) {
  v8 acc[RB][2];
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = splat8(0.0f);
  for (int t = 0; t < nt; t++) {
    const float *vt = V + (size_t)t * C + c0;
    v8 z0 = load8(z + (size_t)t * OC), z1 = nv > 1 ? load8(z + (size_t)t * OC + 8) : splat8(0.0f);
    KEEP(z0);
    KEEP(z1);
    for (int r = 0; r < R; r++) {
      const v8 x = splat8(vt[r]);
      acc[r][0] = fma8(x, z0, acc[r][0]);
      if (nv > 1) acc[r][1] = fma8(x, z1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int v = 0; v < nv; v++) {
      float *dst = s + (size_t)(c0 + r) * OC + 8 * v;
      const v8 sum = acc[r][v] + load8(dst);
      store8(dst, sum);
    }
}

#if DT_V16
/* With AVX-512 the products take 16 outputs a vector and up to 12 accumulators: 6 rows x 32 outputs, or 12 rows x
 * 16 where 16 outputs are left; each sum still runs over k in order, one FMA a term, so the bits are the 8-wide
 * kernels'. (8 wide, the loads of a and b, not the FMAs, bounded them: 8 loads per 12 FMAs of 8 lanes.) */
#define RB16 12 /* rows of a 16-output block; a 32-output block takes RB16 / 2 */

/* m (R, 16*nv) = sum over k < K of a[r][k] * b[k][.], R <= RB16 / nv rows at pointers a[r]. */
static inline AI void product_block16(float *m, size_t ldm, const float *const *a, const float *b, size_t ldb, int K,
                                      int R, int nv) {
  v16 acc[RB16];
  for (int i = 0; i < nv * R; i++) acc[i] = splat16(0.0f);
  for (int k = 0; k < K; k++) {
    v16 b0 = load16(b + (size_t)k * ldb), b1 = nv > 1 ? load16(b + (size_t)k * ldb + 16) : splat16(0.0f);
    KEEP16(b0);
    KEEP16(b1);
    for (int r = 0; r < R; r++) {
      const v16 x = splat16(a[r][k]);
      acc[nv * r] = fma16(x, b0, acc[nv * r]);
      if (nv > 1) acc[nv * r + 1] = fma16(x, b1, acc[nv * r + 1]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int v = 0; v < nv; v++) store16(m + (size_t)r * ldm + 16 * v, acc[nv * r + v]);
}

/* s (C, OC) += V^T @ Z over nt tiles, R <= RB16 / nv input channels from c0 x 16*nv outputs. */
static inline AI void gradient_block16(float *s, int OC, const float *V, int C, int c0, const float *z, int nt, int R,
                                       int nv) {
  v16 acc[RB16];
  for (int i = 0; i < nv * R; i++) acc[i] = splat16(0.0f);
  for (int t = 0; t < nt; t++) {
    const float *vt = V + (size_t)t * C + c0;
    v16 z0 = load16(z + (size_t)t * OC), z1 = nv > 1 ? load16(z + (size_t)t * OC + 16) : splat16(0.0f);
    KEEP16(z0);
    KEEP16(z1);
    for (int r = 0; r < R; r++) {
      const v16 x = splat16(vt[r]);
      acc[nv * r] = fma16(x, z0, acc[nv * r]);
      if (nv > 1) acc[nv * r + 1] = fma16(x, z1, acc[nv * r + 1]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int v = 0; v < nv; v++) {
      float *dst = s + (size_t)(c0 + r) * OC + 16 * v;
      const v16 sum = acc[nv * r + v] + load16(dst);
      store16(dst, sum);
    }
}

/* Columns [o, o + 16*nv) of M (nt, OC) = V (nt, C) @ U (C, OC), tiles in row blocks of at most RB16 / nv. */
static inline AI void multiply16_columns(float *M, const float *V, const float *U, int nt, int C, int OC, int o,
                                         int nv) {
  const int R = RB16 / nv;
  for (int t0 = 0, nb = (nt + R - 1) / R; nb > 0; nb--) {
    const int rows = block_rows(nt - t0, nb);
    const float *a[RB16];
    for (int r = 0; r < rows; r++) a[r] = V + (size_t)(t0 + r) * C;
    float *m = M + (size_t)t0 * OC + o;
#define PRODUCT16(r) product_block16(m, OC, a, U + o, OC, C, r, nv)
    if (nv > 1) WITH_ROWS_6(rows, PRODUCT16) else WITH_ROWS_12(rows, PRODUCT16)
#undef PRODUCT16
    t0 += rows;
  }
}

/* Rows are input channels, a multiple of 8: 16 outputs take them 8 at a time (12 would split a 16-channel layer
 * into blocks of 8 anyway, and 8 keeps the channel loads aligned). */
static inline AI void multiply_grad16_columns(float *S, const float *V, const float *Z, int nt, int C, int OC, int o,
                                              int nv) {
  const int R = nv > 1 ? RB16 / 2 : 8;
  for (int c0 = 0, nb = (C + R - 1) / R; nb > 0; nb--) {
    const int rows = block_rows(C - c0, nb);
#define GRADIENT16(r) gradient_block16(S + o, OC, V, C, c0, Z + o, nt, r, nv)
    if (nv > 1) WITH_ROWS_6(rows, GRADIENT16) else WITH_ROWS_12(rows, GRADIENT16)
#undef GRADIENT16
    c0 += rows;
  }
}
#endif

/* 0: the 8-wide products even where the 16-wide ones apply (dt_wino_set_wide, for the tests). */
static int wide = 1;
void dt_wino_set_wide(int on) { wide = on != 0; }

/* Forward, one xi: M (nt, OC) = V (nt, C) @ U (C, OC). */
static void multiply(float *M, const float *V, const float *U, int nt, int C, int OC) {
#if DT_V16
  if (wide && OC % 16 == 0) {
    int o = 0;
    for (; o + 32 <= OC; o += 32) multiply16_columns(M, V, U, nt, C, OC, o, 2);
    if (o < OC) multiply16_columns(M, V, U, nt, C, OC, o, 1);
    return;
  }
#endif
  for (int t0 = 0, nb = (nt + RB - 1) / RB; nb > 0; nb--) {
    const int rows = block_rows(nt - t0, nb);
    const float *a[RB];
    for (int r = 0; r < rows; r++) a[r] = V + (size_t)(t0 + r) * C;
    float *m = M + (size_t)t0 * OC;
    int o = 0;
#define PRODUCT(r) product_block(m + o, OC, a, U + o, OC, C, r, 2)
    for (; o + 16 <= OC; o += 16) WITH_ROWS_6(rows, PRODUCT)
#undef PRODUCT
#define PRODUCT(r) product_block(m + o, OC, a, U + o, OC, C, r, 1)
    if (o < OC) WITH_ROWS_6(rows, PRODUCT)
#undef PRODUCT
    t0 += rows;
  }
}

/* Weight gradient, one xi: S (C, OC) += V^T @ Z, input channels in row blocks of at most RB. */
static void multiply_grad(float *S, const float *V, const float *Z, int nt, int C, int OC) {
#if DT_V16
  if (wide && OC % 16 == 0) {
    int o = 0;
    for (; o + 32 <= OC; o += 32) multiply_grad16_columns(S, V, Z, nt, C, OC, o, 2);
    if (o < OC) multiply_grad16_columns(S, V, Z, nt, C, OC, o, 1);
    return;
  }
#endif
  for (int c0 = 0, nb = (C + RB - 1) / RB; nb > 0; nb--) {
    const int rows = block_rows(C - c0, nb);
    int o = 0;
#define GRADIENT(r) gradient_block(S + o, OC, V, C, c0, Z + o, nt, r, 2)
    for (; o + 16 <= OC; o += 16) WITH_ROWS_6(rows, GRADIENT)
#undef GRADIENT
#define GRADIENT(r) gradient_block(S + o, OC, V, C, c0, Z + o, nt, r, 1)
    if (o < OC) WITH_ROWS_6(rows, GRADIENT)
#undef GRADIENT
    c0 += rows;
  }
}

void dt_wino_forward(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                     const float *b) {
  const tiling tl = tiling_of(g);
  const int C = g->C, OC = g->OC, TB = tl.tb, TS = tl.th * tl.tw;
  const size_t HW = (size_t)g->H * g->W, P = (size_t)g->OH * g->OW, block = forward_block(g, &tl);
  float *U = scratch, *blocks0 = scratch + kernel_floats(g, &tl);
  transform_weights(&tl, U, w, C, OC);
#pragma omp parallel num_threads(threads_for(g))
  {
    float *X = blocks0 + (size_t)omp_get_thread_num() * block, *Y = X + input_floats(g, &tl);
    float *V = Y + output_floats(g, &tl), *M = V + (size_t)tl.xi * TB * C;
    memset(X, 0, input_floats(g, &tl) * sizeof(float)); /* the border; interiors are rewritten per sample */
    /* Dynamic: on shared cores one thread may run slower than the other, and no sum crosses samples, so the
     * result does not depend on which thread took which sample (the weight gradient's partials below do). */
#pragma omp for schedule(dynamic, 2)
    for (int n = 0; n < g->N; n++) {
      pack_blocked(X, inp + (size_t)n * C * HW, C, g->H, g->W, tl.ph, tl.pw, g->pad);
      for (int t0 = 0; t0 < TS; t0 += TB) {
        const int nt = TS - t0 < TB ? TS - t0 : TB;
        transform_inputs(&tl, V, X, C, t0, nt);
        for (int xi = 0; xi < tl.xi; xi++)
          multiply(M + (size_t)xi * TB * OC, V + (size_t)xi * TB * C, U + (size_t)xi * C * OC, nt, C, OC);
        transform_outputs(&tl, Y, M, b, OC, t0, nt);
      }
      unpack_blocked(out + (size_t)n * OC * P, Y, OC, g->OH, g->OW, tl.oh, tl.ow);
    }
  }
}

/* Each thread sums its samples' products into its own S (a*a, C, OC); the partials are added in thread order
 * (a given thread count always sums in one order) and transformed back into dw. */
void dt_wino_weights(const dt_conv2d_geom *g, float *dw, float *scratch, const float *dout, const float *inp) {
  const tiling tl = tiling_of(g);
  const int C = g->C, OC = g->OC, TB = tl.tb, TS = tl.th * tl.tw;
  const size_t HW = (size_t)g->H * g->W, P = (size_t)g->OH * g->OW, block = weights_block(g, &tl);
  const size_t kn = kernel_floats(g, &tl);
  float *S = scratch, *blocks0 = scratch + kn;
#pragma omp parallel num_threads(threads_for(g))
  {
    const int nt_threads = omp_get_num_threads();
    float *X = blocks0 + (size_t)omp_get_thread_num() * block, *D = X + input_floats(g, &tl);
    float *V = D + output_floats(g, &tl), *Z = V + (size_t)tl.xi * TB * C, *part = Z + (size_t)tl.xi * TB * OC;
    memset(X, 0, (input_floats(g, &tl) + output_floats(g, &tl)) * sizeof(float));
    memset(part, 0, kn * sizeof(float));
#pragma omp for schedule(static)
    for (int n = 0; n < g->N; n++) {
      pack_blocked(X, inp + (size_t)n * C * HW, C, g->H, g->W, tl.ph, tl.pw, g->pad);
      pack_blocked(D, dout + (size_t)n * OC * P, OC, g->OH, g->OW, tl.oh, tl.ow, 0);
      for (int t0 = 0; t0 < TS; t0 += TB) {
        const int nt = TS - t0 < TB ? TS - t0 : TB;
        transform_inputs(&tl, V, X, C, t0, nt);
        transform_grads(&tl, Z, D, OC, t0, nt);
        for (int xi = 0; xi < tl.xi; xi++)
          multiply_grad(part + (size_t)xi * C * OC, V + (size_t)xi * TB * C, Z + (size_t)xi * TB * OC, nt, C, OC);
      }
    }
#pragma omp for schedule(static)
    for (size_t i = 0; i < kn; i++) {
      float acc = 0.0f;
      for (int k = 0; k < nt_threads; k++) acc += blocks0[(size_t)k * block + (block - kn) + i];
      S[i] = acc;
    }
    untransform_grads(&tl, dw, S, C, OC);
  }
}

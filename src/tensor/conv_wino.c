/* Winograd F(2x2, 3x3), stride 1, padding 1: forward and weight gradient (conv_wino.h says what it computes).
 *
 * With d a 4x4 input tile, w a 3x3 kernel and y the 2x2 outputs of the tile (Lavin and Gray's matrices):
 *   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
 *   A^T = [1 1 1 0; 0 1 -1 -1],  y = A^T [(G w G^T) . (B^T d B)] A  (. element-wise),
 * and, its adjoint for the weights, dw = G^T [(A dy A^T) . (B^T d B)] G summed over tiles. Tile (i, j) covers
 * outputs (2i, 2j) to (2i+1, 2j+1) and inputs (2i-1, 2j-1) to (2i+2, 2j+2); tiles that pass the bottom or right
 * edge read zeros there and store only what lies inside.
 *
 * Layout. Per sample, the input is copied into blocks of 8 channels with a zero border, (C/8, PH, PW, 8), so a
 * tile's 16 positions are 16 vector loads of 8 channels. Tiles are taken TB at a time: the block's transformed
 * inputs V (16, TB, C) and the products M (16, TB, OC) stay in L2 from the transform through the 16 small GEMMs
 * to the inverse transform, which writes the sample's outputs blocked the same way before they are unpacked
 * into planes (the output gradient is packed the same way for the weight gradient). The input gradient needs nothing here: conv2d.c computes it as this forward of the
 * transposed convolution. */
#include <omp.h>
#include <string.h>

#include "tensor/conv_wino.h"
#include "tensor/v8.h"

#define XI 16            /* elements of a transformed tile (4x4) */
#define RB 6             /* register block: RB rows (tiles, or input channels for the gradient) x 16 outputs */
#define BLOCK_FLOATS 65536 /* a block's V and M together: 256 KiB */
#define TB_MAX 120

static int tiles_h(const dt_conv2d_geom *g) { return (g->H + 1) / 2; }
static int tiles_w(const dt_conv2d_geom *g) { return (g->W + 1) / 2; }
/* The bordered input planes: one zero row and column before, the tiles' reach after. */
static int padded_h(const dt_conv2d_geom *g) { return 2 * tiles_h(g) + 2; }
static int padded_w(const dt_conv2d_geom *g) { return 2 * tiles_w(g) + 2; }

static int block_tiles(const dt_conv2d_geom *g) {
  int t = BLOCK_FLOATS / (XI * (g->C + g->OC)) / RB * RB;
  return t < RB ? RB : t > TB_MAX ? TB_MAX : t;
}

/* The 16 GEMMs stream their transformed kernel (C, OC) once per RB tiles: past 256 KiB it leaves L2 (resnet18's
 * 512 channels: 26-51 GFLOP/s against 100-185 for 64 to 256). */
#define MAX_KERNEL_FLOATS 65536
int dt_wino_applies(const dt_conv2d_geom *g) {
  return g->KH == 3 && g->KW == 3 && g->stride == 1 && g->pad == 1 && g->C % 8 == 0 && g->OC % 8 == 0 &&
         (int64_t)g->C * g->OC <= MAX_KERNEL_FLOATS && !dt_amp_native_gemm(g->amp);
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

static size_t input_floats(const dt_conv2d_geom *g) { return (size_t)g->C * padded_h(g) * padded_w(g); }
static size_t grad_floats(const dt_conv2d_geom *g) { return (size_t)g->OC * 2 * tiles_h(g) * 2 * tiles_w(g); }
static size_t tile_floats(const dt_conv2d_geom *g) { return (size_t)XI * block_tiles(g) * (g->C + g->OC); }
static size_t kernel_floats(const dt_conv2d_geom *g) { return (size_t)XI * g->C * g->OC; }

static size_t forward_block(const dt_conv2d_geom *g) { return input_floats(g) + grad_floats(g) + tile_floats(g); }
static size_t weights_block(const dt_conv2d_geom *g) {
  return input_floats(g) + grad_floats(g) + tile_floats(g) + kernel_floats(g);
}
size_t dt_wino_forward_floats(const dt_conv2d_geom *g) { return kernel_floats(g) + blocks(g) * forward_block(g); }
size_t dt_wino_weights_floats(const dt_conv2d_geom *g) { return kernel_floats(g) + blocks(g) * weights_block(g); }

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

/* Between planes (C, H, W) and blocks of 8 channels (C/8, PH, PW, 8) whose interior starts at (off, off):
 * pack copies planes into blocks, unpack (pack = 0) blocks into planes. 8 channels x 8 columns at a time through
 * a transpose; the columns past the last multiple of 8 one at a time. */
static void convert_blocked(int pack, float *planes, float *blocked, int C, int H, int W, int PH, int PW, int off) {
  const size_t HW = (size_t)H * W;
  for (int cb = 0; cb < C / 8; cb++)
    for (int h = 0; h < H; h++) {
      float *p = planes + (size_t)8 * cb * HW + (size_t)h * W;
      float *x = blocked + (((size_t)cb * PH + h + off) * PW + off) * 8;
      int w = 0;
      for (; w + 8 <= W; w += 8) {
        v8 r[8];
        for (int k = 0; k < 8; k++) r[k] = pack ? load8(p + k * HW + w) : load8(x + (size_t)(w + k) * 8);
        transpose8(r);
        for (int k = 0; k < 8; k++) {
          if (pack)
            store8(x + (size_t)(w + k) * 8, r[k]);
          else
            store8(p + k * HW + w, r[k]);
        }
      }
      for (; w < W; w++)
        for (int l = 0; l < 8; l++) {
          if (pack)
            x[(size_t)w * 8 + l] = p[l * HW + w];
          else
            p[l * HW + w] = x[(size_t)w * 8 + l];
        }
    }
}

/* planes only read when packing */
static void pack_blocked(float *X, const float *src, int C, int H, int W, int PH, int PW, int off) {
  convert_blocked(1, (float *)src, X, C, H, W, PH, PW, off);
}
static void unpack_blocked(float *dst, const float *Y, int C, int H, int W, int PH, int PW) {
  convert_blocked(0, dst, (float *)Y, C, H, W, PH, PW, 0);
}

/* U[xi][c][oc] = (G w[oc][c] G^T)[xi], rows of G: w0; (w0+w1+w2)/2; (w0-w1+w2)/2; w2. */
static void transform_weights(float *U, const float *w, int C, int OC) {
#pragma omp parallel for schedule(static)
  for (int oc = 0; oc < OC; oc++)
    for (int c = 0; c < C; c++) {
      const float *k = w + ((size_t)oc * C + c) * 9;
      float t[4][3];
      for (int s = 0; s < 3; s++) {
        const float a = k[s], b = k[3 + s], e = k[6 + s];
        t[0][s] = a, t[1][s] = 0.5f * (a + b + e), t[2][s] = 0.5f * (a - b + e), t[3][s] = e;
      }
      for (int r = 0; r < 4; r++) {
        const float a = t[r][0], b = t[r][1], e = t[r][2];
        const float u[4] = {a, 0.5f * (a + b + e), 0.5f * (a - b + e), e};
        for (int s = 0; s < 4; s++) U[((size_t)(4 * r + s) * C + c) * OC + oc] = u[s];
      }
    }
}

/* dw[oc][c] += G^T S[.][c][oc] G, columns of G^T applied as rows: s0 + (s1+s2)/2; (s1-s2)/2; (s1+s2)/2 + s3. */
static void untransform_grads(float *dw, const float *S, int C, int OC) {
#pragma omp for schedule(static)
  for (int oc = 0; oc < OC; oc++)
    for (int c = 0; c < C; c++) {
      float h[3][4];
      for (int q = 0; q < 4; q++) {
        const float *s = S + (size_t)c * OC + oc + (size_t)q * C * OC;
        const size_t row = (size_t)4 * C * OC;
        const float s0 = s[0], s1 = s[row], s2 = s[2 * row], s3 = s[3 * row];
        h[0][q] = s0 + 0.5f * (s1 + s2), h[1][q] = 0.5f * (s1 - s2), h[2][q] = 0.5f * (s1 + s2) + s3;
      }
      float *d = dw + ((size_t)oc * C + c) * 9;
      for (int r = 0; r < 3; r++) {
        const float a = h[r][0], b = h[r][1], e = h[r][2], f = h[r][3];
        d[3 * r] += a + 0.5f * (b + e);
        d[3 * r + 1] += 0.5f * (b - e);
        d[3 * r + 2] += 0.5f * (b + e) + f;
      }
    }
}

/* v[xi * xs] = (B^T d B)[xi] for 8 channels, d the 4x4 tile at x (rows PW * 8 floats apart). */
static inline void input_tile(float *v, size_t xs, const float *x, int PW) {
  const size_t row = (size_t)PW * 8;
  v8 t[4][4];
  for (int s = 0; s < 4; s++) {
    const v8 d0 = load8(x + 8 * s), d1 = load8(x + row + 8 * s), d2 = load8(x + 2 * row + 8 * s),
             d3 = load8(x + 3 * row + 8 * s);
    t[0][s] = d0 - d2, t[1][s] = d1 + d2, t[2][s] = d2 - d1, t[3][s] = d1 - d3;
  }
  for (int r = 0; r < 4; r++) {
    const v8 a = t[r][0] - t[r][2], b = t[r][1] + t[r][2], c = t[r][2] - t[r][1], e = t[r][1] - t[r][3];
    store8(v + (size_t)(4 * r) * xs, a);
    store8(v + (size_t)(4 * r + 1) * xs, b);
    store8(v + (size_t)(4 * r + 2) * xs, c);
    store8(v + (size_t)(4 * r + 3) * xs, e);
  }
}

/* V[xi][t][c] for tiles t0 .. t0+nt-1 of a sample (tile t is row t / TW, column t % TW) from its blocked X. */
static void transform_inputs(const dt_conv2d_geom *g, float *V, const float *X, int t0, int nt, int TB) {
  const int C = g->C, TW = tiles_w(g), PH = padded_h(g), PW = padded_w(g);
  for (int t = 0; t < nt; t++) {
    const int i = (t0 + t) / TW, j = (t0 + t) % TW;
    for (int cb = 0; cb < C / 8; cb++)
      input_tile(V + (size_t)t * C + 8 * cb, (size_t)TB * C, X + (((size_t)cb * PH + 2 * i) * PW + 2 * j) * 8, PW);
  }
}

/* z[xi * zs] = (A dy A^T)[xi] for 8 output channels, dy the 2x2 at d (rows DW * 8 floats apart); rows of A:
 * y0; y0 + y1; y0 - y1; -y1. */
static inline void grad_tile(float *z, size_t zs, const float *d, int DW) {
  const size_t row = (size_t)DW * 8;
  const v8 y00 = load8(d), y01 = load8(d + 8), y10 = load8(d + row), y11 = load8(d + row + 8);
  const v8 p[4][2] = {{y00, y01}, {y00 + y10, y01 + y11}, {y00 - y10, y01 - y11}, {-y10, -y11}};
  for (int r = 0; r < 4; r++) {
    const v8 a = p[r][0], c = p[r][1], b = a + c, e = a - c, f = -c;
    store8(z + (size_t)(4 * r) * zs, a);
    store8(z + (size_t)(4 * r + 1) * zs, b);
    store8(z + (size_t)(4 * r + 2) * zs, e);
    store8(z + (size_t)(4 * r + 3) * zs, f);
  }
}

static void transform_grads(const dt_conv2d_geom *g, float *Z, const float *D, int t0, int nt, int TB) {
  const int OC = g->OC, TW = tiles_w(g), DH = 2 * tiles_h(g), DW = 2 * TW;
  for (int t = 0; t < nt; t++) {
    const int i = (t0 + t) / TW, j = (t0 + t) % TW;
    for (int ob = 0; ob < OC / 8; ob++)
      grad_tile(Z + (size_t)t * OC + 8 * ob, (size_t)TB * OC, D + (((size_t)ob * DH + 2 * i) * DW + 2 * j) * 8, DW);
  }
}

/* Y[oc/8][2i + a][2j + b][oc%8] = (A^T m A)[a][b] + bias for the block's tiles, 8 output channels at a time, into
 * the sample's blocked output (OC/8, 2 TH, 2 TW, 8): whole vectors, which convert_blocked then writes out as
 * planes. (Stored straight into the NCHW planes, 8 scalars to 8 planes a vector, this step took 45% of the
 * forward.) */
static void transform_outputs(const dt_conv2d_geom *g, float *Y, const float *M, const float *bias, int t0, int nt,
                              int TB) {
  const int OC = g->OC, TW = tiles_w(g), DH = 2 * tiles_h(g), DW = 2 * TW;
  const size_t xs = (size_t)TB * OC;
  for (int t = 0; t < nt; t++) {
    const int i = (t0 + t) / TW, j = (t0 + t) % TW;
    for (int o = 0; o < OC; o += 8) {
      const float *m = M + (size_t)t * OC + o;
      v8 q[2][4];
      for (int s = 0; s < 4; s++) {
        const v8 m0 = load8(m + s * xs), m1 = load8(m + (4 + s) * xs), m2 = load8(m + (8 + s) * xs),
                 m3 = load8(m + (12 + s) * xs);
        q[0][s] = m0 + m1 + m2, q[1][s] = m1 - m2 - m3;
      }
      const v8 b = bias ? load8(bias + o) : splat8(0.0f);
      float *y = Y + (((size_t)(o / 8) * DH + 2 * i) * DW + 2 * j) * 8;
      for (int a = 0; a < 2; a++) {
        const v8 y0 = q[a][0] + q[a][1] + q[a][2] + b, y1 = q[a][1] - q[a][2] - q[a][3] + b;
        store8(y + (size_t)a * DW * 8, y0);
        store8(y + (size_t)a * DW * 8 + 8, y1);
      }
    }
  }
}

/* m (rows, 8*nv) = sum over k < K of a[r][k] * b[k][.]: RB rows at pointers a[r], b's rows ldb apart, m's ldm. */
static inline __attribute__((always_inline)) void product_block(float *m, size_t ldm, const float *const *a,
                                                                const float *b, size_t ldb, int K, int rows, int nv,
                                                                int accumulate) {
  v8 acc[RB][2];
  for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = splat8(0.0f);
  for (int k = 0; k < K; k++) {
    v8 b0 = load8(b + (size_t)k * ldb), b1 = nv > 1 ? load8(b + (size_t)k * ldb + 8) : splat8(0.0f);
    KEEP(b0);
    KEEP(b1);
    for (int r = 0; r < RB; r++) {
      const v8 x = splat8(a[r][k]);
      acc[r][0] = fma8(x, b0, acc[r][0]);
      if (nv > 1) acc[r][1] = fma8(x, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < rows; r++)
    for (int v = 0; v < nv; v++) {
      float *dst = m + (size_t)r * ldm + 8 * v;
      v8 s = acc[r][v];
      if (accumulate) s += load8(dst);
      store8(dst, s);
    }
}

/* Forward, one xi: M (nt, OC) = V (nt, C) @ U (C, OC). */
static void multiply(float *M, const float *V, const float *U, int nt, int C, int OC) {
  for (int t0 = 0; t0 < nt; t0 += RB) {
    const float *a[RB];
    for (int r = 0; r < RB; r++) a[r] = V + (size_t)(t0 + r < nt ? t0 + r : nt - 1) * C;
    const int rows = nt - t0 < RB ? nt - t0 : RB;
    int o = 0;
    for (; o + 16 <= OC; o += 16) product_block(M + (size_t)t0 * OC + o, OC, a, U + o, OC, C, rows, 2, 0);
    if (o < OC) product_block(M + (size_t)t0 * OC + o, OC, a, U + o, OC, C, rows, 1, 0);
  }
}

/* Weight gradient, one xi: S (C, OC) += V^T (C, nt) @ Z (nt, OC). V's columns are its rows read with stride C:
 * the block's row pointers start at channel c and step by C (ldb-like) through the tiles. */
static inline __attribute__((always_inline)) void gradient_block(float *s, int OC, const float *V, int C, int c0,
                                                                 const float *z, int nt, int rows, int nv) {
  v8 acc[RB][2];
  for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = splat8(0.0f);
  int cidx[RB];
  for (int r = 0; r < RB; r++) cidx[r] = c0 + r < C ? c0 + r : C - 1;
  for (int t = 0; t < nt; t++) {
    const float *vt = V + (size_t)t * C;
    v8 z0 = load8(z + (size_t)t * OC), z1 = nv > 1 ? load8(z + (size_t)t * OC + 8) : splat8(0.0f);
    KEEP(z0);
    KEEP(z1);
    for (int r = 0; r < RB; r++) {
      const v8 x = splat8(vt[cidx[r]]);
      acc[r][0] = fma8(x, z0, acc[r][0]);
      if (nv > 1) acc[r][1] = fma8(x, z1, acc[r][1]);
    }
  }
  for (int r = 0; r < rows; r++)
    for (int v = 0; v < nv; v++) {
      float *dst = s + (size_t)(c0 + r) * OC + 8 * v;
      v8 sum = acc[r][v] + load8(dst);
      store8(dst, sum);
    }
}

static void multiply_grad(float *S, const float *V, const float *Z, int nt, int C, int OC) {
  for (int c0 = 0; c0 < C; c0 += RB) {
    const int rows = C - c0 < RB ? C - c0 : RB;
    int o = 0;
    for (; o + 16 <= OC; o += 16) gradient_block(S + o, OC, V, C, c0, Z + o, nt, rows, 2);
    if (o < OC) gradient_block(S + o, OC, V, C, c0, Z + o, nt, rows, 1);
  }
}

void dt_wino_forward(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                     const float *b) {
  const int C = g->C, OC = g->OC, TB = block_tiles(g), TS = tiles_h(g) * tiles_w(g);
  const size_t HW = (size_t)g->H * g->W, block = forward_block(g);
  float *U = scratch, *blocks0 = scratch + kernel_floats(g);
  transform_weights(U, w, C, OC);
#pragma omp parallel num_threads(threads_for(g))
  {
    float *X = blocks0 + (size_t)omp_get_thread_num() * block, *Y = X + input_floats(g), *V = Y + grad_floats(g);
    float *M = V + (size_t)XI * TB * C;
    memset(X, 0, input_floats(g) * sizeof(float)); /* the border; interiors are rewritten per sample */
#pragma omp for schedule(static)
    for (int n = 0; n < g->N; n++) {
      pack_blocked(X, inp + (size_t)n * C * HW, C, g->H, g->W, padded_h(g), padded_w(g), 1);
      for (int t0 = 0; t0 < TS; t0 += TB) {
        const int nt = TS - t0 < TB ? TS - t0 : TB;
        transform_inputs(g, V, X, t0, nt, TB);
        for (int xi = 0; xi < XI; xi++)
          multiply(M + (size_t)xi * TB * OC, V + (size_t)xi * TB * C, U + (size_t)xi * C * OC, nt, C, OC);
        transform_outputs(g, Y, M, b, t0, nt, TB);
      }
      unpack_blocked(out + (size_t)n * OC * HW, Y, OC, g->H, g->W, 2 * tiles_h(g), 2 * tiles_w(g));
    }
  }
}

/* Each thread sums its samples' products into its own S (16, C, OC); the partials are added in thread order
 * (a given thread count always sums in one order) and transformed back into dw. */
void dt_wino_weights(const dt_conv2d_geom *g, float *dw, float *scratch, const float *dout, const float *inp) {
  const int C = g->C, OC = g->OC, TB = block_tiles(g), TS = tiles_h(g) * tiles_w(g);
  const size_t HW = (size_t)g->H * g->W, block = weights_block(g), kn = kernel_floats(g);
  float *S = scratch, *blocks0 = scratch + kn;
#pragma omp parallel num_threads(threads_for(g))
  {
    const int nt_threads = omp_get_num_threads();
    float *X = blocks0 + (size_t)omp_get_thread_num() * block, *D = X + input_floats(g), *V = D + grad_floats(g);
    float *Z = V + (size_t)XI * TB * C, *part = Z + (size_t)XI * TB * OC;
    memset(X, 0, (input_floats(g) + grad_floats(g)) * sizeof(float));
    memset(part, 0, kn * sizeof(float));
#pragma omp for schedule(static)
    for (int n = 0; n < g->N; n++) {
      pack_blocked(X, inp + (size_t)n * C * HW, C, g->H, g->W, padded_h(g), padded_w(g), 1);
      pack_blocked(D, dout + (size_t)n * OC * HW, OC, g->H, g->W, 2 * tiles_h(g), 2 * tiles_w(g), 0);
      for (int t0 = 0; t0 < TS; t0 += TB) {
        const int nt = TS - t0 < TB ? TS - t0 : TB;
        transform_inputs(g, V, X, t0, nt, TB);
        transform_grads(g, Z, D, t0, nt, TB);
        for (int xi = 0; xi < XI; xi++)
          multiply_grad(part + (size_t)xi * C * OC, V + (size_t)xi * TB * C, Z + (size_t)xi * TB * OC, nt, C, OC);
      }
    }
#pragma omp for schedule(static)
    for (size_t i = 0; i < kn; i++) {
      float acc = 0.0f;
      for (int k = 0; k < nt_threads; k++) acc += blocks0[(size_t)k * block + (block - kn) + i];
      S[i] = acc;
    }
    untransform_grads(dw, S, C, OC);
  }
}

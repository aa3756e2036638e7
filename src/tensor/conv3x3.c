/* Direct 3x3 convolution, stride 1, padding 1: forward and weight gradient (see conv3x3.h for why).
 *
 * A sample's C input planes are copied into zero-bordered (H+2, W+2) planes, so every tap of every output
 * is an in-bounds read. Outputs are taken as vectors of 8 along a row: vector k of row oh starts at column
 * min(8k, W-8), so a width that is not a multiple of 8 overlaps its last two vectors (the forward computes the
 * overlap twice, identically; the weight gradient masks the last vector's repeated lanes off). With AVX-512 the
 * forward takes rows of 16 and more in vectors of 16 the same way; each output sums the same terms in the same
 * order, so the bits are the 8-wide forward's. The input gradient of such a convolution is again one (flipped,
 * transposed weights), so conv2d.c computes it with this forward. */
#include <omp.h>
#include <string.h>

#include "tensor/conv3x3.h"
#include "tensor/v16.h"
#include "tensor/v8.h"

static inline float sum8(const v8 *p) {
  const v8 v = *p;
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* Register blocks (AVX2 has 16 vector registers). Forward: OB output channels x VB vectors, the OB weights
 * broadcast once per tap and each input vector loaded once for OB FMAs: 12 accumulators + 2 + 1 = 15 registers,
 * 8 loads per 12 FMAs. Weight gradient: DB output channels x 3 taps of a row, the 3 input vectors held and
 * each output-gradient vector loaded once for 3 FMAs: 9 + 3 + 1 = 13 registers. Measured per core on resnet20's
 * shapes (AVX2, 78 GFLOP/s peak): forward 67-74 GFLOP/s, weight gradient 49-68; 4x3 and 3x4 forward blocks and a
 * 4-channel gradient block spill and were slower. With AVX-512VL's 32 registers (for these 8-float vectors too)
 * the forward takes 4 x 6 (24 + 4 + 1 = 29 registers, 10 loads per 24 FMAs): on a Zen 5 core (bench/conv_kernels
 * --algos, one thread, best of six alternated runs) resnet20's stem 62 -> 82 GFLOP/s, fashioncnn's first layer
 * 49 -> 63. An 8-channel gradient block was faster alone there (69 -> 86) but slower fed by conv_bn_pool.c's made
 * planes (fashioncnn's layer1 backward 1,329-1,365 -> 1,435-1,481 us a step, traced): 8 planes of 28x28 and their
 * inputs crowd L1. The 16-wide forward (AVX-512, rows of 16 and more) keeps the 4 x 6 block in zmm registers:
 * resnet20's stem 81-83 -> 110-137 GFLOP/s, fashioncnn's first layer 61-62 -> 79-81 (the same bench, alternated
 * three times). An output's sums run in the same order at any block size and width: the bits do not depend on
 * them. */
#if defined(__AVX512VL__)
#define OB 4
#else
#define OB 2
#endif
#define VB 6
#define DB 3
#define GROUP_VECTORS 64 /* samples are grouped until a group has this many output vectors (small maps) */

/* 0: the forward in vectors of 8 even where 16 apply (dt_conv3x3_set_wide, for the tests). */
static int wide = 1;
void dt_conv3x3_set_wide(int on) { wide = on != 0; }

static int round_up(int x, int m) { return (x + m - 1) / m * m; }
static size_t plane_floats(const dt_conv2d_geom *g) { return (size_t)(g->H + 2) * (g->W + 2); }
static int row_vectors(const dt_conv2d_geom *g) { return (g->W + 7) / 8; }

static int is_3x3_same(const dt_conv2d_geom *g) {
  return g->KH == 3 && g->KW == 3 && g->stride == 1 && g->pad == 1 && g->W >= 8;
}

/* Bytes of input one forward block reads for every output-channel block: C channels x the rows its VB vectors
 * span plus the 2 halo rows x their width. Past L1 the input streams from L2 once per OB output channels and
 * GEMM is faster (resnet18's 56x56 with 64 channels: 43-53 vs 56 GFLOP/s; resnet20's maps fit, 70 vs 45-53;
 * measured with blocks of 2 channels on AVX2; the zoo's layers that take the direct forward have 1 or 3
 * channels, far below the limit). Counted in vectors of 8, so the choice does not depend on the build: the 16-wide
 * blocks read up to twice as much (about 2 KiB for a 3-channel stem). */
#define FORWARD_MAX_BLOCK_BYTES (24 << 10)
static size_t forward_block_bytes(const dt_conv2d_geom *g) {
  const int per_row = row_vectors(g);
  const int rows = per_row >= VB ? 1 : (VB + per_row - 1) / per_row, span = per_row >= VB ? 8 * VB + 2 : g->W + 2;
  return (size_t)g->C * (rows + 2) * span * sizeof(float);
}

/* Under amp with native low-precision GEMMs (3-4x f32's speed) neither direct kernel applies, but for a single
 * input channel: its GEMMs' 9 values of k (forward) or columns (weight gradient) fill 9 of the 32 the bf16 kernel
 * pads them to, which leaves it slower than f32. Direct on operands Conv2d rounded beforehand, it is autocast's
 * result still (exact products of bf16 values summed in f32). */
static int native_gemm_pays(const dt_conv2d_geom *g) { return dt_amp_native_gemm(g->amp) && g->C > 1; }

int dt_conv3x3_forward_applies(const dt_conv2d_geom *g) {
  return is_3x3_same(g) && forward_block_bytes(g) <= FORWARD_MAX_BLOCK_BYTES && !native_gemm_pays(g);
}

/* The weight gradient streams rows of one input channel and 3 output channels: no such limit (resnet18's 56x56
 * with 64 channels: 60-62 against GEMM's 55-56 GFLOP/s). */
int dt_conv3x3_weights_applies(const dt_conv2d_geom *g) {
  return is_3x3_same(g) && !native_gemm_pays(g);
}

/* Samples per group: from the geometry alone, not the thread count (as the GEMM path's groups), so a given
 * thread count always sums the weight gradient in one order. */
static int sample_group(const dt_conv2d_geom *g) {
  const int vectors = g->H * row_vectors(g);
  const int G = (GROUP_VECTORS + vectors - 1) / vectors;
  return G < g->N ? G : g->N;
}

static int threads_for(const dt_conv2d_geom *g, int groups) {
  int t = omp_get_max_threads();
  if (t > groups) t = groups;
  if (t > g->threads) t = g->threads;
  return t > 0 ? t : 1;
}

/* A group's padded planes per thread, the blocks the scratch holds. */
static size_t group_floats(const dt_conv2d_geom *g) { return (size_t)sample_group(g) * g->C * plane_floats(g); }
static size_t blocks(const dt_conv2d_geom *g) {
  const int G = sample_group(g), groups = (g->N + G - 1) / G;
  return (size_t)(g->threads < groups ? (g->threads > 0 ? g->threads : 1) : groups);
}

size_t dt_conv3x3_forward_floats(const dt_conv2d_geom *g) {
  return (size_t)round_up(g->OC, OB) * g->C * 9 + blocks(g) * group_floats(g);
}

size_t dt_conv3x3_weights_floats(const dt_conv2d_geom *g) {
  return blocks(g) * (group_floats(g) + (size_t)g->OC * g->C * 9);
}

/* wp[ob][c][tap][o] = w[ob*OB + o][c][tap], zero for output channels past OC. */
static void pack_weights(float *wp, const float *w, int OC, int C) {
  const int nb = round_up(OC, OB) / OB;
  for (int ob = 0; ob < nb; ob++)
    for (int c = 0; c < C; c++)
      for (int t = 0; t < 9; t++)
        for (int o = 0; o < OB; o++) {
          const int oc = ob * OB + o;
          wp[(((size_t)ob * C + c) * 9 + t) * OB + o] = oc < OC ? w[((size_t)oc * C + c) * 9 + t] : 0.0f;
        }
}

/* The interiors of gn samples' C zero-bordered (H+2, W+2) planes from src (gn, C, H, W); borders stay zero. */
static void pad_group(const dt_conv2d_geom *g, float *dst, const float *src, int gn) {
  const size_t PS = plane_floats(g);
  for (int p = 0; p < gn * g->C; p++)
    for (int h = 0; h < g->H; h++)
      memcpy(dst + p * PS + (size_t)(h + 1) * (g->W + 2) + 1, src + ((size_t)p * g->H + h) * g->W,
             (size_t)g->W * sizeof(float));
}

/* The forward's outputs are vectors of vw floats along a row (16 with AVX-512 on rows at least 16 wide, else 8):
 * vector k of row oh starts at column min(vw k, W - vw). */
static int forward_width(const dt_conv2d_geom *g) { return DT_V16 && wide && g->W >= 16 ? 16 : 8; }

/* Offsets of the VB vectors from j0 of a group's outputs (past the last, the last again): in the group's output
 * (gn, OC, H, W) from channel 0, and in its padded input planes (gn, C, H+2, W+2) from channel 0, top-left tap. */
static void block_offsets(const dt_conv2d_geom *g, int vw, int j0, int vectors, size_t *out_off, size_t *in_off) {
  const int per_row = (g->W + vw - 1) / vw, per_sample = g->H * per_row;
  int s = j0 / per_sample, oh = j0 % per_sample / per_row, k = j0 % per_row;
  for (int v = 0; v < VB; v++) {
    const int ow = vw * k < g->W - vw ? vw * k : g->W - vw;
    out_off[v] = (size_t)s * g->OC * g->H * g->W + (size_t)oh * g->W + ow;
    in_off[v] = (size_t)s * g->C * plane_floats(g) + (size_t)oh * (g->W + 2) + ow;
    if (j0 + v + 1 >= vectors) continue; /* the next is past the last: this one again */
    if (++k == per_row) k = 0, oh++;
    if (oh == g->H) oh = 0, s++;
  }
}

/* OB output channels x VB vectors: acc = bias + sum over c and taps of w * x; stores the first `oc_n` channels. */
static void forward_block(const dt_conv2d_geom *g, float *out, const float *in, const float *wp, const float *bias,
                          int oc_n, const size_t *out_off, const size_t *in_off) {
  const size_t PS = plane_floats(g), P = (size_t)g->H * g->W;
  const int Wp = g->W + 2;
  v8 acc[OB][VB];
  for (int o = 0; o < OB; o++)
    for (int v = 0; v < VB; v++) acc[o][v] = splat8(bias && o < oc_n ? bias[o] : 0.0f);
  for (int c = 0; c < g->C; c++) {
    const float *x = in + (size_t)c * PS, *wc = wp + (size_t)c * 9 * OB;
    for (int t = 0; t < 9; t++) {
      const float *xt = x + (t / 3) * Wp + t % 3;
      v8 wv[OB];
      for (int o = 0; o < OB; o++) wv[o] = splat8(wc[t * OB + o]);
      for (int v = 0; v < VB; v++) {
        v8 xv = load8(xt + in_off[v]);
        KEEP(xv);
        for (int o = 0; o < OB; o++) acc[o][v] = fma8(wv[o], xv, acc[o][v]);
      }
    }
  }
  for (int o = 0; o < oc_n; o++)
    for (int v = 0; v < VB; v++) store8(out + o * P + out_off[v], acc[o][v]);
}

#if DT_V16
/* forward_block in vectors of 16: the same sums in the same order for each output, so the same bits. */
static void forward_block16(const dt_conv2d_geom *g, float *out, const float *in, const float *wp, const float *bias,
                            int oc_n, const size_t *out_off, const size_t *in_off) {
  const size_t PS = plane_floats(g), P = (size_t)g->H * g->W;
  const int Wp = g->W + 2;
  v16 acc[OB][VB];
  for (int o = 0; o < OB; o++)
    for (int v = 0; v < VB; v++) acc[o][v] = splat16(bias && o < oc_n ? bias[o] : 0.0f);
  for (int c = 0; c < g->C; c++) {
    const float *x = in + (size_t)c * PS, *wc = wp + (size_t)c * 9 * OB;
    for (int t = 0; t < 9; t++) {
      const float *xt = x + (t / 3) * Wp + t % 3;
      v16 wv[OB];
      for (int o = 0; o < OB; o++) wv[o] = splat16(wc[t * OB + o]);
      for (int v = 0; v < VB; v++) {
        v16 xv = load16(xt + in_off[v]);
        KEEP16(xv);
        for (int o = 0; o < OB; o++) acc[o][v] = fma16(wv[o], xv, acc[o][v]);
      }
    }
  }
  for (int o = 0; o < oc_n; o++)
    for (int v = 0; v < VB; v++) store16(out + o * P + out_off[v], acc[o][v]);
}
#endif

/* One group of gn samples: out (gn, OC, H, W) from their padded planes. Blocks of VB vectors (the last one
 * repeats its final vector), every output-channel block for each, so a block's inputs stay in cache. */
static void forward_group(const dt_conv2d_geom *g, float *out, const float *in, const float *wp, const float *b,
                          int gn) {
  const int vw = forward_width(g), vectors = gn * g->H * ((g->W + vw - 1) / vw), nb = round_up(g->OC, OB) / OB;
  const size_t P = (size_t)g->H * g->W;
  for (int j0 = 0; j0 < vectors; j0 += VB) {
    size_t out_off[VB], in_off[VB];
    block_offsets(g, vw, j0, vectors, out_off, in_off);
    for (int ob = 0; ob < nb; ob++) {
      const int oc0 = ob * OB, oc_n = g->OC - oc0 < OB ? g->OC - oc0 : OB;
      float *o = out + (size_t)oc0 * P;
      const float *w = wp + (size_t)ob * g->C * 9 * OB, *bias = b ? b + oc0 : NULL;
#if DT_V16
      if (vw == 16) {
        forward_block16(g, o, in, w, bias, oc_n, out_off, in_off);
        continue;
      }
#endif
      forward_block(g, o, in, w, bias, oc_n, out_off, in_off);
    }
  }
}

void dt_conv3x3_forward(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                        const float *b) {
  const int G = sample_group(g), groups = (g->N + G - 1) / G;
  const size_t HW = (size_t)g->H * g->W, block = group_floats(g);
  float *wp = scratch, *planes = scratch + (size_t)round_up(g->OC, OB) * g->C * 9;
  pack_weights(wp, w, g->OC, g->C);
#pragma omp parallel num_threads(threads_for(g, groups))
  {
    float *in = planes + (size_t)omp_get_thread_num() * block;
    memset(in, 0, block * sizeof(float));
    /* Dynamic: no sum crosses groups, so the bits do not depend on which thread took which (see conv_wino.c). */
#pragma omp for schedule(dynamic, 1)
    for (int gi = 0; gi < groups; gi++) {
      const int n0 = gi * G, gn = g->N - n0 < G ? g->N - n0 : G;
      pad_group(g, in, inp + (size_t)n0 * g->C * HW, gn);
      forward_group(g, out + (size_t)n0 * g->OC * HW, in, wp, b, gn);
    }
  }
}

/* acc[o][kw] += the output gradient's vector at column ow of row oh (lanes off in `keep` read as 0) times the
 * tap's input vector, for the first oc_n of DB channels. */
static inline void weights_vector(v8 acc[DB][3], const float *xr, const float *d, size_t P, int oc_n, v8i keep) {
  v8 x0 = load8(xr), x1 = load8(xr + 1), x2 = load8(xr + 2);
  KEEP(x0);
  KEEP(x1);
  KEEP(x2);
  for (int o = 0; o < DB; o++) {
    v8 dv = o < oc_n ? sel8(keep, load8(d + o * P), splat8(0.0f)) : splat8(0.0f);
    KEEP(dv);
    acc[o][0] = fma8(dv, x0, acc[o][0]);
    acc[o][1] = fma8(dv, x1, acc[o][1]);
    acc[o][2] = fma8(dv, x2, acc[o][2]);
  }
}

/* dw[oc0 + o][c][kh][0..2] += sum over the group's samples and outputs of dout * the tap's input, for the first
 * oc_n of DB output channels (the rest read zeros), d the output gradient of the group's first sample at channel
 * oc0 and ds the floats from one sample's to the next. A width that is not a multiple of 8 ends in the forward's
 * overlapping vector at W - 8, its lanes before column 8 * (W / 8) masked off, so no output is counted twice. */
static void weights_block(const dt_conv2d_geom *g, float *dw, const float *in, const float *d, size_t ds, int gn,
                          int oc0, int oc_n, int c, int kh) {
  const size_t PS = plane_floats(g), P = (size_t)g->H * g->W;
  const int Wp = g->W + 2, whole = g->W / 8 * 8, lap = whole < g->W ? 8 - (g->W - whole) : 0;
  const v8i all = {-1, -1, -1, -1, -1, -1, -1, -1};
  v8i tail; /* lanes lap.. of the last vector: the columns from `whole` on */
  for (int i = 0; i < 8; i++) tail[i] = i >= lap ? -1 : 0;
  v8 acc[DB][3];
  for (int o = 0; o < DB; o++) acc[o][0] = acc[o][1] = acc[o][2] = splat8(0.0f);
  for (int s = 0; s < gn; s++, d += ds) {
    const float *x = in + ((size_t)s * g->C + c) * PS + (size_t)kh * Wp;
    for (int oh = 0; oh < g->H; oh++) {
      for (int ow = 0; ow < whole; ow += 8)
        weights_vector(acc, x + (size_t)oh * Wp + ow, d + (size_t)oh * g->W + ow, P, oc_n, all);
      if (lap)
        weights_vector(acc, x + (size_t)oh * Wp + g->W - 8, d + (size_t)oh * g->W + g->W - 8, P, oc_n, tail);
    }
  }
  for (int o = 0; o < oc_n; o++)
    for (int kw = 0; kw < 3; kw++) dw[(((size_t)(oc0 + o)) * g->C + c) * 9 + kh * 3 + kw] += sum8(&acc[o][kw]);
}

/* Where a group's output gradient comes from: dout itself (make NULL), or made DB channels at a time into buf. */
typedef struct dout_source {
  const float *dout;
  dt_conv3x3_make_fn make;
  void *user;
  float *buf;
} dout_source;

static void weights_group(const dt_conv2d_geom *g, float *dw, const float *in, const dout_source *src, int n0,
                          int gn) {
  const size_t P = (size_t)g->H * g->W;
  for (int oc0 = 0; oc0 < g->OC; oc0 += DB) {
    const int oc_n = g->OC - oc0 < DB ? g->OC - oc0 : DB;
    const float *d = src->buf;
    size_t ds = DB * P;
    if (src->make)
      src->make(src->user, src->buf, ds, n0, gn, oc0, oc_n);
    else
      d = src->dout + ((size_t)n0 * g->OC + oc0) * P, ds = (size_t)g->OC * P;
    for (int c = 0; c < g->C; c++)
      for (int kh = 0; kh < 3; kh++) weights_block(g, dw, in, d, ds, gn, oc0, oc_n, c, kh);
  }
}

/* Groups of samples spread over the threads; with more than one thread each sums into its own partial dw,
 * added to dw at the end in thread order (as the im2col path does). */
static void weights(const dt_conv2d_geom *g, float *dw, float *scratch, const float *inp, dout_source src,
                    float *made) {
  const int G = sample_group(g), groups = (g->N + G - 1) / G;
  const size_t HW = (size_t)g->H * g->W, wn = (size_t)g->OC * g->C * 9, planes = group_floats(g);
  const size_t block = planes + wn;
#pragma omp parallel num_threads(threads_for(g, groups)) firstprivate(src)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float *in = scratch + (size_t)t * block, *mydw = nt > 1 ? in + planes : dw;
    if (made) src.buf = made + (size_t)t * G * DB * HW;
    memset(in, 0, planes * sizeof(float));
    if (nt > 1) memset(mydw, 0, wn * sizeof(float));
#pragma omp for schedule(static)
    for (int gi = 0; gi < groups; gi++) {
      const int n0 = gi * G, gn = g->N - n0 < G ? g->N - n0 : G;
      pad_group(g, in, inp + (size_t)n0 * g->C * HW, gn);
      weights_group(g, mydw, in, &src, n0, gn);
    }
    if (nt > 1) {
#pragma omp for schedule(static)
      for (size_t i = 0; i < wn; i++) {
        float acc = dw[i];
        for (int k = 0; k < nt; k++) acc += scratch[(size_t)k * block + planes + i];
        dw[i] = acc;
      }
    }
  }
}

void dt_conv3x3_weights(const dt_conv2d_geom *g, float *dw, float *scratch, const float *dout, const float *inp) {
  weights(g, dw, scratch, inp, (dout_source){.dout = dout}, NULL);
}

size_t dt_conv3x3_made_floats(const dt_conv2d_geom *g) {
  return blocks(g) * (size_t)sample_group(g) * DB * g->H * g->W;
}

void dt_conv3x3_weights_made(const dt_conv2d_geom *g, float *dw, float *scratch, float *made, const float *inp,
                             dt_conv3x3_make_fn make, void *user) {
  weights(g, dw, scratch, inp, (dout_source){.make = make, .user = user}, made);
}

/* Our bf16 GEMM for AVX512_BF16 CPUs: C (M, N) = alpha * op(A) @ op(B) + beta * C with the operands rounded to bf16
 * and the products summed in f32 by vdpbf16ps, which multiplies two bf16 pairs and adds both products to an f32
 * lane: twice an f32 FMA's work per instruction, at the same rate on a Zen 5 EPYC (440 against 220 GFLOP/s a core).
 * Why our own: it needs no library (Debian's OpenBLAS has no sbgemm; oneDNN is optional), it rounds the operands as
 * it packs them and C as it stores it, which spares autocast's layers their rounding passes, and it runs about as
 * fast as oneDNN's bf16 matmul: 0.91-1.28x on dtrain's shapes on two threads (bench/gemm_bf16_shapes), 0.93-1.05x on
 * whole training steps (bench/amp_vs_f32.py; docs/benchmarks.md).
 *
 * The layout, as BLIS and OpenBLAS lay out their GEMMs:
 *  - A is packed in panels of MR rows, B in panels of NR columns, k in pairs (the two values vdpbf16ps takes
 *    together, as one 32-bit unit), padded to blocks of 16 pairs. B's panel holds per pair of k its NR columns side
 *    by side (two 64-byte vectors); A's holds per block of 16 pairs each row's 16 pairs side by side (the unit a
 *    broadcast reads). Padding rows, columns and pairs are zeros.
 *  - The microkernel keeps an MR x NR block of C in 28 vector registers over all of k, with the pair of A's values
 *    broadcast and B's two vectors loaded per pair of k.
 *  - Packing converts f32 to bf16 (round to nearest even) in the same pass. An A stored with k along its rows (as
 *    activations are) packs as it is converted; a B stored so (a weight in the forward) and an A stored with k
 *    across its rows (a weight gradient's dY^T) are transposed 16 x 16 in registers; a B stored with k across its
 *    rows interleaves two rows.
 * Large products run on the thread budget: the threads pack A's panels together, then share C's blocks by ranges of
 * B's panels, each thread packing its own B panels a group at a time just before it multiplies them. */
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "tensor/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <omp.h>

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

enum {
  MR = 14, /* rows of C per microkernel: 2 x 14 accumulators + 2 of B's vectors fill 30 of the 32 registers */
  NR = 32, /* columns of C per microkernel: two vectors of 16 floats */
};
/* B's panels a thread packs and multiplies at a time: what its L2 holds beside A's stream. */
#define B_GROUP_BYTES ((size_t)256 << 10)

/* The operand X (rows, K) to pack, element (x, k) at p[x * ld + k] (along: k along the stored rows) or
 * p[k * ld + x]. */
typedef struct operand {
  const float *p;
  size_t ld;
  int along, rows, K;
} operand;

static operand operand_of(int trans, int rows, int K, const float *p, int ld) {
  return (operand){p, (size_t)ld, !trans, rows, K};
}

static inline int pairs_of(int K) { return (K + 1) / 2; }
/* Pairs of k as packed: rounded up to blocks of 16 (A's layout goes by such blocks), the added pairs zero. */
static inline int packed_pairs(int K) { return (pairs_of(K) + 15) & ~15; }
static inline int panels_of(int rows, int w) { return (rows + w - 1) / w; }
static inline __mmask16 first_lanes(int n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}
static inline int clamp_rows(int n, int span) { return n < 0 ? 0 : n < span ? n : span; }

/* Row `row` of an along operand from k: its 32 floats k..k+31 (zeros past K) as 16 bf16 pairs. */
BF16_TARGET static inline __m512i pairs_along(const operand *x, int row, int k) {
  const float *s = x->p + (size_t)row * x->ld;
  const int n = x->K - k;
  const __m512 lo = n > 0 ? _mm512_maskz_loadu_ps(first_lanes(n), s + k) : _mm512_setzero_ps();
  const __m512 hi = n > 16 ? _mm512_maskz_loadu_ps(first_lanes(n - 16), s + k + 16) : _mm512_setzero_ps();
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* bf16 0..15 from lo, 16..31 from hi: k order, pairs in 32 bits */
}

/* Pair p of k of an across operand's rows r0..r0+w-1 (w <= 16; zeros past w and past K): the stored rows 2p and
 * 2p + 1 interleaved into 16 pairs. */
BF16_TARGET static inline __m512i pairs_across(const operand *x, int p, int r0, int w) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __mmask16 m = first_lanes(w);
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
  if (2 * p < x->K) lo = _mm512_maskz_loadu_ps(m, x->p + (size_t)(2 * p) * x->ld + r0);
  if (2 * p + 1 < x->K) hi = _mm512_maskz_loadu_ps(m, x->p + (size_t)(2 * p + 1) * x->ld + r0);
  return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* Transposes 16 vectors of 16 32-bit lanes in place: r[i] lane j <-> r[j] lane i. */
BF16_TARGET static void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  /* each 128-bit lane q of r[i] now holds rows 4*(i/4)..+3 of columns 4q + (i%4): gather the quarters */
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

/* B's panels: per pair of k a row of NR values (two vectors), packed_pairs(K) rows. */

/* Panel `panel` of an along B (k along the stored rows): 16 rows x 16 pairs at a time, transposed in registers. */
BF16_TARGET static void pack_b_along(uint32_t *dst, const operand *x, int panel) {
  const int kp = packed_pairs(x->K);
  for (int x0 = 0; x0 < NR; x0 += 16) {
    const int r0 = panel * NR + x0, w = clamp_rows(x->rows - r0, 16);
    for (int p0 = 0; p0 < kp; p0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; i++) r[i] = i < w ? pairs_along(x, r0 + i, 2 * p0) : _mm512_setzero_si512();
      transpose16(r);
      for (int q = 0; q < 16; q++) _mm512_store_si512(dst + (size_t)(p0 + q) * NR + x0, r[q]);
    }
  }
}

/* Panels first..first+count-1 of an across B (k across the stored rows), panel after panel: 16 pairs at a time
 * across all the panels, so the 32 stored rows read stay in L2 and each panel receives 16 contiguous rows. */
BF16_TARGET static void pack_b_across(uint32_t *dst, const operand *x, int first, int count) {
  const int kp = packed_pairs(x->K);
  for (int p0 = 0; p0 < kp; p0 += 16)
    for (int j = 0; j < count; j++)
      for (int x0 = 0; x0 < NR; x0 += 16) {
        const int r0 = (first + j) * NR + x0, w = clamp_rows(x->rows - r0, 16);
        for (int p = p0; p < p0 + 16; p++)
          _mm512_store_si512(dst + ((size_t)j * kp + p) * NR + x0, pairs_across(x, p, r0, w));
      }
}

/* A's panels: per block of 16 pairs of k, MR rows of 16 pairs each (a row's pairs side by side, so an A stored with
 * k along its rows packs without a transpose, and the microkernel reads row r's pair q at r * 16 + q). */

/* Panel `panel` of an along A: each row's 32 values of k at a time converted in place. */
BF16_TARGET static void pack_a_along(uint32_t *dst, const operand *x, int panel) {
  const int kp = packed_pairs(x->K);
  for (int r = 0; r < MR; r++) {
    const int row = panel * MR + r;
    for (int p0 = 0; p0 < kp; p0 += 16)
      _mm512_storeu_si512(dst + ((size_t)p0 * MR + (size_t)r * 16),
                          row < x->rows ? pairs_along(x, row, 2 * p0) : _mm512_setzero_si512());
  }
}

/* Panels first..first+count-1 of an across A: per block of 16 pairs, the interleaved pairs of the panel's rows
 * transposed in registers so each row's 16 pairs lie together. */
BF16_TARGET static void pack_a_across(uint32_t *dst, const operand *x, int first, int count) {
  const int kp = packed_pairs(x->K);
  for (int p0 = 0; p0 < kp; p0 += 16)
    for (int j = 0; j < count; j++) {
      const int r0 = (first + j) * MR;
      __m512i v[16];
      for (int q = 0; q < 16; q++) v[q] = pairs_across(x, p0 + q, r0, clamp_rows(x->rows - r0, MR));
      transpose16(v);
      uint32_t *d = dst + (size_t)j * kp * MR + (size_t)p0 * MR;
      for (int r = 0; r < MR; r++) _mm512_storeu_si512(d + (size_t)r * 16, v[r]);
    }
}

/* What becomes of a block's sums: C = alpha * sums + beta * C (C not read when beta is 0), rounded to the bf16 grid
 * when round (autocast's low-precision result, as dt_round_bf16 rounds: to nearest even, NaN kept quiet). */
typedef struct epilogue {
  float alpha, beta;
  int round;
} epilogue;

BF16_TARGET static inline __m512 round_bf16(__m512 y) {
  const __m512i u = _mm512_castps_si512(y), top = _mm512_set1_epi32((int)0xffff0000u);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i even = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), top);
  const __m512i quiet = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), top);
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(even, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), quiet));
}

/* C's block (rows <= R <= MR, cols <= NR) from the products of kp (a multiple of 16) pairs of the first R rows of
 * A's panel a and B's panel b, as e says. Inlined for each R the callers name, its loops unrolled for it. */
__attribute__((always_inline)) BF16_TARGET static inline void kernel_rows(int R, int kp, const uint32_t *a,
                                                                          const uint32_t *b, float *c, size_t ldc,
                                                                          int rows, int cols, const epilogue *e) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 14
  for (int r = 0; r < R; r++) c0[r] = c1[r] = _mm512_setzero_ps();
  /* C's block is read (beta) or written only after all of k: fetched now, it arrives while the block is summed
   * rather than stalling the stores (a weight gradient's C, 16 MiB for a 2048 x 2048 layer, is in memory) */
  for (int r = 0; r < rows; r++) {
    _mm_prefetch((const char *)(c + (size_t)r * ldc), _MM_HINT_T0);
    if (cols > 16) _mm_prefetch((const char *)(c + (size_t)r * ldc + 16), _MM_HINT_T0);
  }
  for (int p0 = 0; p0 < kp; p0 += 16, a += 16 * MR)
    for (int q = 0; q < 16; q++, b += NR) {
      const __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16);
#pragma GCC unroll 14
      for (int r = 0; r < R; r++) {
        const __m512bh ar = (__m512bh)_mm512_set1_epi32((int)a[r * 16 + q]);
        c0[r] = _mm512_dpbf16_ps(c0[r], ar, b0);
        c1[r] = _mm512_dpbf16_ps(c1[r], ar, b1);
      }
    }
  const __mmask16 m0 = first_lanes(cols), m1 = first_lanes(cols - 16 < 0 ? 0 : cols - 16);
  const __m512 va = _mm512_set1_ps(e->alpha), vb = _mm512_set1_ps(e->beta);
  const int read = e->beta != 0.0f;
#pragma GCC unroll 14
  for (int r = 0; r < R; r++) {
    if (r >= rows) break;
    float *cr = c + (size_t)r * ldc;
    __m512 y0 = _mm512_mul_ps(va, c0[r]), y1 = _mm512_mul_ps(va, c1[r]);
    if (read) {
      y0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), y0);
      y1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), y1);
    }
    if (e->round) y0 = round_bf16(y0), y1 = round_bf16(y1);
    _mm512_mask_storeu_ps(cr, m0, y0);
    _mm512_mask_storeu_ps(cr + 16, m1, y1);
  }
}

/* C's block of `rows` rows by the kernel for the even row count at or above it: a last panel of A with fewer rows
 * (a batch of 128 leaves 2 of 14) multiplies no more zero rows than one (8% of a 128-row product otherwise). */
BF16_TARGET static void microkernel(int kp, const uint32_t *a, const uint32_t *b, float *c, size_t ldc, int rows,
                                    int cols, const epilogue *e) {
  switch ((rows + 1) / 2) {
  case 1: kernel_rows(2, kp, a, b, c, ldc, rows, cols, e); break;
  case 2: kernel_rows(4, kp, a, b, c, ldc, rows, cols, e); break;
  case 3: kernel_rows(6, kp, a, b, c, ldc, rows, cols, e); break;
  case 4: kernel_rows(8, kp, a, b, c, ldc, rows, cols, e); break;
  case 5: kernel_rows(10, kp, a, b, c, ldc, rows, cols, e); break;
  case 6: kernel_rows(12, kp, a, b, c, ldc, rows, cols, e); break;
  default: kernel_rows(MR, kp, a, b, c, ldc, rows, cols, e); break;
  }
}

/* The packed operands and C, shared by the threads of one product. */
typedef struct product {
  operand a, b;
  int M, N, kp, mp, np; /* pairs of k as packed (packed_pairs); panels of A and of B */
  int group;            /* B's panels a thread packs at a time, when threads split B (B_GROUP_BYTES of them) */
  uint32_t *pa, *pb;    /* A's mp panels of kp x MR; B's np panels of kp x NR, or a group per thread */
  epilogue e;
  float *c;
  size_t ldc;
} product;

static inline int share(int n, int t, int nt) { return (int)((long)n * t / nt); }

/* How nt threads split C: by ranges of B's panels when there are enough of them (each thread then packs its own
 * panels a group at a time and multiplies them while they are in L2, so packed B never travels to memory), else
 * by ranges of A's panels with B packed by all before. */
static inline int split_by_b(const product *g, int nt) { return g->np >= 4 * nt || g->mp < nt; }

/* A's panels first..first+count-1 into their place in g->pa. */
static void pack_a(const product *g, int first, int count) {
  uint32_t *dst = g->pa + (size_t)first * g->kp * MR;
  if (!g->a.along)
    pack_a_across(dst, &g->a, first, count);
  else
    for (int j = 0; j < count; j++) pack_a_along(dst + (size_t)j * g->kp * MR, &g->a, first + j);
}

/* B's panels first..first+count-1 into dst, one after the other. */
static void pack_b(uint32_t *dst, const product *g, int first, int count) {
  if (!g->b.along)
    pack_b_across(dst, &g->b, first, count);
  else
    for (int j = 0; j < count; j++) pack_b_along(dst + (size_t)j * g->kp * NR, &g->b, first + j);
}

/* Thread t of nt's share of the panels every thread reads: A's, and B's when the threads split A. */
static void pack_shared(const product *g, int t, int nt) {
  int lo = share(g->mp, t, nt), hi = share(g->mp, t + 1, nt);
  pack_a(g, lo, hi - lo);
  if (split_by_b(g, nt)) return;
  lo = share(g->np, t, nt), hi = share(g->np, t + 1, nt);
  pack_b(g->pb + (size_t)lo * g->kp * NR, g, lo, hi - lo);
}

/* C's block (ip, jp) from A's panel ip and B's panel jp (packed at b). */
static void block(const product *g, int ip, int jp, const uint32_t *b) {
  const int r0 = ip * MR, c0 = jp * NR;
  const int rows = g->M - r0 < MR ? g->M - r0 : MR, cols = g->N - c0 < NR ? g->N - c0 : NR;
  microkernel(g->kp, g->pa + (size_t)ip * g->kp * MR, b, g->c + (size_t)r0 * g->ldc + c0, g->ldc, rows, cols, &g->e);
}

/* Thread t of nt's share of C's blocks (after pack_shared and a barrier), B's panel outermost so one stays in L2
 * while the thread walks A's panels. Each block takes all of k at once: blocking k (as BLIS does, to keep B's
 * block in L1) measured 10-20% slower here, C's blocks then travelling to and from L3 once per block of k. */
static void multiply_share(const product *g, int t, int nt) {
  if (split_by_b(g, nt)) {
    uint32_t *mine = g->pb + (size_t)t * g->group * g->kp * NR;
    const int lo = share(g->np, t, nt), hi = share(g->np, t + 1, nt);
    for (int j0 = lo; j0 < hi; j0 += g->group) {
      const int count = hi - j0 < g->group ? hi - j0 : g->group;
      pack_b(mine, g, j0, count);
      for (int j = 0; j < count; j++)
        for (int ip = 0; ip < g->mp; ip++) block(g, ip, j0 + j, mine + (size_t)j * g->kp * NR);
    }
  } else {
    const int lo = share(g->mp, t, nt), hi = share(g->mp, t + 1, nt);
    for (int jp = 0; jp < g->np; jp++)
      for (int ip = lo; ip < hi; ip++) block(g, ip, jp, g->pb + (size_t)jp * g->kp * NR);
  }
}

int dt_gemm_bf16_own_available(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

static int gemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
                int ldc, epilogue e) {
  if (M <= 0 || N <= 0 || K <= 0 || !dt_gemm_bf16_own_available()) return 0;
  product g = {.a = operand_of(ta, M, K, A, lda), .b = operand_of(!tb, N, K, B, ldb), .M = M, .N = N,
               .kp = packed_pairs(K), .mp = panels_of(M, MR), .np = panels_of(N, NR), .e = e, .c = C,
               .ldc = (size_t)ldc};
  const int threads = 2.0 * M * N * K >= 4e6 && !omp_in_parallel() ? omp_get_max_threads() : 1;
  const size_t panel_b = (size_t)g.kp * NR, fit = B_GROUP_BYTES / (panel_b * sizeof(uint32_t));
  const int share_b = (g.np + threads - 1) / threads; /* no thread packs more of B than its share */
  g.group = fit < 1 ? 1 : fit < (size_t)share_b ? (int)fit : share_b;
  /* B: all its panels (threads split A) or a group per thread (threads split B), whichever is larger */
  const size_t na = (size_t)g.mp * g.kp * MR, all_b = g.np * panel_b, group_b = (size_t)threads * g.group * panel_b;
  const size_t nb = all_b > group_b ? all_b : group_b;
  uint32_t *buf = dt_thread_scratch((na + nb) * sizeof(uint32_t));
  if (!buf) return 0;
  g.pb = buf; /* B first: its panels' 128-byte rows stay 64-aligned */
  g.pa = buf + nb;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    pack_shared(&g, t, nt);
#pragma omp barrier
    multiply_share(&g, t, nt);
  }
  return 1;
}

int dt_gemm_bf16_own(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
  return gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, (epilogue){alpha, beta, 0});
}

int dt_gemm_bf16_own_round(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc) {
  return gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, (epilogue){alpha, beta, 1});
}

#else

int dt_gemm_bf16_own_available(void) { return 0; }

int dt_gemm_bf16_own(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta;
  (void)C, (void)ldc;
  return 0;
}

int dt_gemm_bf16_own_round(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc) {
  return dt_gemm_bf16_own(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#endif

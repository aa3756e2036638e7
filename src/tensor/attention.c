/* Multi-head scaled dot-product attention (Hugging Face's BertSelfAttention) over packed (B, L, H) projections:
 * head h of a sample is the column block [h*d, (h+1)*d) of its rows, so every product is a strided GEMM and no
 * head is ever transposed or copied. Packed sequences: sample b is rows [off[b], off[b+1]) and its (n, n)
 * blocks lie back to back; no padding is computed. One (sample, head) pair per task, each GEMM single-threaded. */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "tensor/kernels.h"

/* Softmax of one score row over the keys the mask keeps (masked keys get probability 0, as adding
 * finfo.min before the softmax does); a row with no key kept is uniform over all keys, as it is there. */
static void masked_softmax_row(float *p, const int32_t *keep, int L) {
  float mx = -INFINITY;
  for (int j = 0; j < L; j++)
    if (!keep || keep[j]) mx = p[j] > mx ? p[j] : mx;
  if (mx == -INFINITY) {
    for (int j = 0; j < L; j++) p[j] = 1.0f / (float)L;
    return;
  }
  float s = 0.0f;
  for (int j = 0; j < L; j++) {
    p[j] = (!keep || keep[j]) ? expf(p[j] - mx) : 0.0f;
    s += p[j];
  }
  const float inv = 1.0f / s;
  for (int j = 0; j < L; j++) p[j] *= inv;
}

/* Sample b's rows, count and the start of its probability blocks (head h: + h * n * n). */
static void sample_of(const dt_attention_geom *g, int b, size_t *row0, int *n, size_t *pbase) {
  if (g->off) {
    *row0 = (size_t)g->off[b];
    *n = g->off[b + 1] - g->off[b];
    *pbase = (size_t)g->A * (size_t)g->sq_off[b];
  } else {
    *row0 = (size_t)b * (size_t)g->L;
    *n = g->L;
    *pbase = (size_t)b * (size_t)g->A * (size_t)g->L * (size_t)g->L;
  }
}

size_t dt_attention_prob_floats(const dt_attention_geom *g) {
  return (size_t)g->A * (g->off ? (size_t)g->sq_off[g->B] : (size_t)g->B * (size_t)g->L * (size_t)g->L);
}

/* The (sample, head) pair k of the loops below, its column offset in a row and its P block. */
typedef struct pair {
  size_t q0, p0; /* element offset of the head's first row; of its (n, n) block in P */
  int n;
} pair;

static pair pair_of(const dt_attention_geom *g, int k) {
  const int b = k / g->A, h = k % g->A, d = g->H / g->A;
  size_t row0, pbase;
  int n;
  sample_of(g, b, &row0, &n, &pbase);
  return (pair){.q0 = row0 * (size_t)g->H + (size_t)h * d, .p0 = pbase + (size_t)h * n * n, .n = n};
}

static int threads_for(int threads) {
  const int t = omp_get_max_threads();
  return t < threads ? t : (threads > 0 ? threads : 1);
}

size_t dt_attention_scratch_floats(int L, int threads) {
  return 2 * (size_t)L * L * (size_t)(threads > 0 ? threads : 1);
}

/* What multiplies V: the block itself, or its dropout in `into`. */
static const float *dropped(const float *blk, size_t p0, size_t count, const dt_attention_dropout *drop, float *into) {
  if (!drop || drop->p <= 0.0f) return blk;
  dt_dropout_range(into, blk, p0, count, drop->p, drop->seed, drop->stream);
  return into;
}

void dt_attention_forward(float *ctx, float *P, float *scratch, int threads, const float *Q, const float *K,
                          const float *V, const dt_attention_dropout *drop, const dt_attention_geom *g) {
  const int d = g->H / g->A, H = g->H;
  const float scale = 1.0f / sqrtf((float)d);
#pragma omp parallel for num_threads(threads_for(threads)) schedule(dynamic, 1)
  for (int k = 0; k < g->B * g->A; k++) {
    const pair q = pair_of(g, k);
    float *p = P + q.p0, *pd = scratch + 2 * (size_t)omp_get_thread_num() * g->L * g->L;
    const size_t nn = (size_t)q.n * q.n;
    dt_sgemm(0, 1, q.n, q.n, d, scale, Q + q.q0, H, K + q.q0, H, 0.0f, p, q.n); /* Q_h K_h^T / sqrt(d) */
    dt_lowp_round(g->amp, p, nn);
    const int32_t *keep = g->mask && !g->off ? g->mask + (size_t)(k / g->A) * g->mask_stride : NULL;
    for (int i = 0; i < q.n; i++) masked_softmax_row(p + (size_t)i * q.n, keep, q.n); /* f32, as autocast */
    const float *pv = dropped(p, q.p0, nn, drop, pd);
    if (g->amp != DT_AMP_OFF) { /* the product's operand: a rounded copy, P stays f32 for backward */
      dt_lowp_round_copy(g->amp, pd, pv, nn);
      pv = pd;
    }
    dt_sgemm(0, 0, q.n, d, q.n, 1.0f, pv, q.n, V + q.q0, H, 0.0f, ctx + q.q0, H); /* Pd_h V_h */
    for (int i = 0; i < q.n; i++) dt_lowp_round(g->amp, ctx + q.q0 + (size_t)i * H, (size_t)d);
  }
}

/* Per (sample, head), with G = dctx_h:  dV_h = Pd^T G (under amp the rounded Pd the forward multiplied);  dPd = G V_h^T;  dP = dPd / (1 - p) where kept (Pd != 0:
 * where P itself is 0 the value does not matter, as dS below is P times it);  dS = P * (dP - rowsum(dP * P));
 * dQ_h = dS K_h / sqrt(d);  dK_h = dS^T Q_h / sqrt(d). */
void dt_attention_backward(float *dQ, float *dK, float *dV, float *scratch, int threads, const float *dctx,
                           const float *Q, const float *K, const float *V, const float *P,
                           const dt_attention_dropout *drop, const dt_attention_geom *g) {
  const int d = g->H / g->A, H = g->H, dropping = drop && drop->p > 0.0f;
  const float scale = 1.0f / sqrtf((float)d), inv_keep = dropping ? 1.0f / (1.0f - drop->p) : 1.0f;
#pragma omp parallel for num_threads(threads_for(threads)) schedule(dynamic, 1)
  for (int k = 0; k < g->B * g->A; k++) {
    const pair q = pair_of(g, k);
    const int n = q.n;
    float *dp = scratch + 2 * (size_t)omp_get_thread_num() * g->L * g->L, *pd = dp + (size_t)g->L * g->L;
    const float *pv = dropped(P + q.p0, q.p0, (size_t)n * n, drop, pd), *pm = pv;
    if (g->amp != DT_AMP_OFF) { /* V was multiplied by the rounded copy (autocast saves it): dp's room until below */
      dt_lowp_round_copy(g->amp, dp, pv, (size_t)n * n);
      pm = dp;
    }
    dt_sgemm(1, 0, n, d, n, 1.0f, pm, n, dctx + q.q0, H, 0.0f, dV + q.q0, H);
    dt_sgemm(0, 1, n, n, d, 1.0f, dctx + q.q0, H, V + q.q0, H, 0.0f, dp, n);
    for (int i = 0; i < n; i++) {
      float *gr = dp + (size_t)i * n;
      const float *pr = P + q.p0 + (size_t)i * n, *kept = pv + (size_t)i * n;
      if (dropping)
        for (int j = 0; j < n; j++) gr[j] = kept[j] != 0.0f ? gr[j] * inv_keep : 0.0f;
      float s = 0.0f;
      for (int j = 0; j < n; j++) s += gr[j] * pr[j];
      for (int j = 0; j < n; j++) gr[j] = pr[j] * (gr[j] - s);
    }
    dt_sgemm(0, 0, n, d, n, scale, dp, n, K + q.q0, H, 0.0f, dQ + q.q0, H);
    dt_sgemm(1, 0, n, d, n, scale, dp, n, Q + q.q0, H, 0.0f, dK + q.q0, H);
  }
}

/* Multi-head scaled dot-product attention (Hugging Face's BertSelfAttention) over packed (B, L, H) projections:
 * head h of a sample is the column block [h*d, (h+1)*d) of its (L, H) rows, so every product is a strided GEMM
 * and no head is ever transposed or copied. One (sample, head) pair per task, each GEMM single-threaded. */
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

void dt_attention_probs(float *P, const float *Q, const float *K, const int32_t *mask, size_t mask_stride, int B,
                        int L, int H, int A) {
  const int d = H / A;
  const float scale = 1.0f / sqrtf((float)d);
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * A; bh++) {
    const int b = bh / A, h = bh % A;
    const size_t off = (size_t)b * L * H + (size_t)h * d;
    float *p = P + (size_t)bh * L * L;
    dt_sgemm(0, 1, L, L, d, scale, Q + off, H, K + off, H, 0.0f, p, L); /* Q_h K_h^T / sqrt(d) */
    const int32_t *keep = mask ? mask + (size_t)b * mask_stride : NULL;
    for (int i = 0; i < L; i++) masked_softmax_row(p + (size_t)i * L, keep, L);
  }
}

void dt_attention_context(float *ctx, const float *P, const float *V, int B, int L, int H, int A) {
  const int d = H / A;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * A; bh++) {
    const int b = bh / A, h = bh % A;
    const size_t off = (size_t)b * L * H + (size_t)h * d;
    dt_sgemm(0, 0, L, d, L, 1.0f, P + (size_t)bh * L * L, L, V + off, H, 0.0f, ctx + off, H); /* P_h V_h */
  }
}

size_t dt_attention_scratch_floats(int L, int threads) { return (size_t)L * L * (size_t)(threads > 0 ? threads : 1); }

/* Per (sample, head), with G = dctx_h:  dV_h = Pd^T G;  dPd = G V_h^T;  dP = dPd * keep / (1 - p);
 * dS = P * (dP - rowsum(dP * P));  dQ_h = dS K_h / sqrt(d);  dK_h = dS^T Q_h / sqrt(d). */
void dt_attention_backward(float *dQ, float *dK, float *dV, float *scratch, int threads, const float *dctx,
                           const float *Q, const float *K, const float *V, const float *P, const float *Pd,
                           const uint8_t *keep, float p, int B, int L, int H, int A) {
  const int d = H / A;
  const float scale = 1.0f / sqrtf((float)d), inv_keep = 1.0f / (1.0f - p);
  int T = omp_get_max_threads();
  if (T > threads) T = threads > 0 ? threads : 1;
#pragma omp parallel for num_threads(T) schedule(static)
  for (int bh = 0; bh < B * A; bh++) {
    const int b = bh / A, h = bh % A;
    const size_t off = (size_t)b * L * H + (size_t)h * d, poff = (size_t)bh * L * L;
    float *dp = scratch + (size_t)omp_get_thread_num() * L * L;
    dt_sgemm(1, 0, L, d, L, 1.0f, Pd + poff, L, dctx + off, H, 0.0f, dV + off, H);
    dt_sgemm(0, 1, L, L, d, 1.0f, dctx + off, H, V + off, H, 0.0f, dp, L);
    for (int i = 0; i < L; i++) {
      float *g = dp + (size_t)i * L;
      const float *pr = P + poff + (size_t)i * L;
      if (keep) {
        const uint8_t *k = keep + poff + (size_t)i * L;
        for (int j = 0; j < L; j++) g[j] = k[j] ? g[j] * inv_keep : 0.0f;
      }
      float s = 0.0f;
      for (int j = 0; j < L; j++) s += g[j] * pr[j];
      for (int j = 0; j < L; j++) g[j] = pr[j] * (g[j] - s);
    }
    dt_sgemm(0, 0, L, d, L, scale, dp, L, K + off, H, 0.0f, dQ + off, H);
    dt_sgemm(1, 0, L, d, L, scale, dp, L, Q + off, H, 0.0f, dK + off, H);
  }
}

/* CPU kernels over raw f32 buffers (llm.c style): shapes in comments, row-major.
 *
 * Conventions every kernel follows:
 *  - forward writes its output (=);
 *  - backward writes input gradients (=) and ACCUMULATES parameter gradients
 *    (+=), so gradient accumulation over micro-batches needs no copy;
 *  - any gradient pointer may be NULL to skip that gradient;
 *  - kernels parallelise with OpenMP inside the process thread budget
 *    (dt_set_threads); GEMMs go to OpenBLAS (cblas_sgemm), never loops;
 *  - kernels do not allocate: callers pass workspaces sized by *_floats(). */
#ifndef DT_TENSOR_KERNELS_H
#define DT_TENSOR_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/model_ctx.h"
#include "dtrain/status.h"

/* ---- GEMM / linear -------------------------------------------------------- */
/* C (M, N) = alpha * op(A) @ op(B) + beta * C; op(X) = X^T when trans_X. */
void dt_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

/* dt_sgemm for autocast's low-precision products: bf16 multiplies natively where dt_amp_native_gemm(mode) (lowp.c
 * chooses the kernel), rounding the operands as it packs them, so they may be off the grid there; everything else
 * (and DT_AMP_OFF) is dt_sgemm on operands the caller rounded. */
void dt_lowp_gemm(dt_amp mode, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);
/* dt_lowp_gemm, then C rounded to mode's grid (autocast's low-precision result): in the same pass where the kernel
 * can (our bf16 GEMM rounds as it stores), else a rounding pass over C after it. */
void dt_lowp_gemm_round(dt_amp mode, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                        int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* The native bf16 GEMMs, dt_sgemm's contract with A and B rounded to bf16 (round to nearest even) and f32 sums;
 * each returns 0, C untouched, when it cannot run (empty shapes, no memory, the CPU or build lacks it).
 * _own (gemm_bf16.c): dtrain's vdpbf16ps kernels, where the CPU has AVX512_BF16.
 * _onednn (gemm_lowp.c): oneDNN's bf16 matmul, where the build has oneDNN and the CPU AVX512_BF16. */
int dt_gemm_bf16_own_available(void);
int dt_gemm_bf16_own(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc);
/* dt_gemm_bf16_own with C rounded to the bf16 grid as it is stored. */
int dt_gemm_bf16_own_round(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc);
int dt_gemm_bf16_onednn_available(void);
int dt_gemm_bf16_onednn(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc);

/* out (B, O) = inp (B, I) @ w^T + b;  w (O, I) as torch.nn.Linear;  b (O) or NULL; the GEMM as amp runs it,
 * out rounded to amp's grid (autocast's result) */
void dt_linear_forward(dt_amp amp, float *out, const float *inp, const float *w, const float *b, int B, int I, int O);
/* dinp (B, I) = dout @ w (rounded to amp's grid);  dw (O, I) += dout^T @ inp;  db (O) += sum_b dout; with assign,
 * dw and db are written (=), their contents never read */
void dt_linear_backward(dt_amp amp, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, int B, int I, int O, int assign);
/* Rows [o0, o1) of dt_linear_backward's dw: dw + o0 * I (o1 - o0, I) += dout[:, o0:o1]^T @ inp (= with assign). */
void dt_linear_backward_dw_rows(dt_amp amp, float *dw, const float *dout, const float *inp, int B, int I, int O,
                                int o0, int o1, int assign);

/* ---- conv2d (im2col + GEMM) ---------------------------------------------- */
typedef struct dt_conv2d_geom {
  int N, C, H, W;    /* input (N, C, H, W) */
  int OC, KH, KW;    /* weight (OC, C, KH, KW) */
  int stride, pad;   /* same in both directions; zero padding */
  int OH, OW;        /* output (N, OC, OH, OW) */
  int threads;       /* at most this many threads, each its own block of the scratch (init: N) */
  dt_amp amp;        /* the GEMMs as autocast runs them (dt_lowp_gemm; init: DT_AMP_OFF) */
} dt_conv2d_geom;
/* Fills OH/OW; DT_INVALID_ARGUMENT if any size is < 1 or the output would be empty. */
dt_status dt_conv2d_geom_init(dt_conv2d_geom *g, int N, int C, int H, int W, int OC, int KH, int KW, int stride,
                              int pad);
/* Floats of `scratch`, temporary within one forward or backward call (the backward unfolds the input again):
 * a block per thread, min(N, g->threads) blocks. */
size_t dt_conv2d_scratch_floats(const dt_conv2d_geom *g);
/* out (N, OC, OH, OW) = conv(inp (N, C, H, W), w (OC, C, KH, KW)) + b (OC) [b may be NULL] */
void dt_conv2d_forward(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                       const float *b);
/* dinp (N, C, H, W) =;  dw (OC, C, KH, KW) +=;  db (OC) += ;  inp the forward's input */
void dt_conv2d_backward(const dt_conv2d_geom *g, float *dinp, float *dw, float *db, float *scratch,
                        const float *dout, const float *inp, const float *w);
/* Whether dt_conv2d_backward computes dw by the direct 3x3 kernel (conv3x3.h). */
int dt_conv2d_weights_direct(const dt_conv2d_geom *g);

/* ---- pooling (floor mode, like PyTorch's default ceil_mode=False) -------- */
typedef struct dt_pool2d_geom {
  int N, C, H, W;
  int K, stride, pad;
  int OH, OW;
} dt_pool2d_geom;
/* DT_INVALID_ARGUMENT if pad > K/2 (as PyTorch) or the output would be empty. */
dt_status dt_pool2d_geom_init(dt_pool2d_geom *g, int N, int C, int H, int W, int K, int stride, int pad);
/* out (N, C, OH, OW); argmax (N, C, OH, OW): flat index into the H*W plane of the max */
void dt_maxpool2d_forward(const dt_pool2d_geom *g, float *out, int32_t *argmax, const float *inp);
void dt_maxpool2d_backward(const dt_pool2d_geom *g, float *dinp, const float *dout, const int32_t *argmax);
/* count_include_pad=True, as PyTorch's default */
void dt_avgpool2d_forward(const dt_pool2d_geom *g, float *out, const float *inp);
void dt_avgpool2d_backward(const dt_pool2d_geom *g, float *dinp, const float *dout);
/* AdaptiveAvgPool2d((OH, OW)) over `planes` planes (N*C) of (H, W): output cell (i, j) averages rows
 * [floor(i*H/OH), ceil((i+1)*H/OH)) and the columns alike, as PyTorch. out (planes, OH, OW); backward
 * writes dinp (planes, H, W). */
void dt_adaptive_avgpool2d_forward(float *out, const float *inp, int planes, int H, int W, int OH, int OW);
void dt_adaptive_avgpool2d_backward(float *dinp, const float *dout, int planes, int H, int W, int OH, int OW);

/* ---- batch norm over (N, C, HW) ----------------------------------------- */
/* Training: normalise with the batch mean and biased variance; save mean and
 * invstd (C) for backward; if running_* are non-NULL update them as PyTorch:
 * r = (1 - momentum) * r + momentum * stat, with the UNBIASED variance. */
void dt_batchnorm_forward_train(float *out, float *mean, float *invstd, float *running_mean, float *running_var,
                                const float *inp, const float *gamma, const float *beta, int N, int C, int HW,
                                float momentum, float eps);
/* Evaluation: normalise with the running statistics. */
void dt_batchnorm_forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                               const float *running_mean, const float *running_var, int N, int C, int HW, float eps);
/* Backward of the training forward. dgamma, dbeta (C) +=. */
void dt_batchnorm_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *inp,
                           const float *mean, const float *invstd, const float *gamma, int N, int C, int HW);
/* BatchNorm -> ReLU fused: the forwards write relu(batchnorm(inp)) (statistics as above); the backward takes the
 * gradient of that output and the output itself (out, for ReLU's mask) and gives the BN input's and parameters'
 * gradients, equal to dt_act_backward then dt_batchnorm_backward. No batch-norm kernel works in place (out and
 * dinp must not overlap their inputs). */
void dt_bn_relu_forward_train(float *out, float *mean, float *invstd, float *running_mean, float *running_var,
                              const float *inp, const float *gamma, const float *beta, int N, int C, int HW,
                              float momentum, float eps);
void dt_bn_relu_forward_eval(float *out, const float *inp, const float *gamma, const float *beta,
                             const float *running_mean, const float *running_var, int N, int C, int HW, float eps);
void dt_bn_relu_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *out,
                         const float *inp, const float *mean, const float *invstd, const float *gamma, int N, int C,
                         int HW);

/* BatchNorm2d (gamma/beta may be NULL) -> ReLU -> MaxPool2d(2, stride 2, no padding) in one pass over
 * inp (N, C, H, W): out and argmax (N, C, H/2, W/2) exactly as the three forward kernels in turn would
 * write them (the BN and ReLU outputs are not materialised). Training: batch statistics, mean/invstd
 * saved and running statistics updated as dt_batchnorm_forward_train, and xsel (N, C, H/2, W/2) = the
 * normalised input (x - mean) * invstd at the argmax, for backward; eval: running statistics. */
void dt_bn_relu_maxpool2x2_forward_train(float *out, int32_t *argmax, float *xsel, float *mean, float *invstd,
                                         float *running_mean, float *running_var, const float *inp,
                                         const float *gamma, const float *beta, int N, int C, int H, int W,
                                         float momentum, float eps);
void dt_bn_relu_maxpool2x2_forward_eval(float *out, int32_t *argmax, const float *inp, const float *gamma,
                                        const float *beta, const float *running_mean, const float *running_var,
                                        int N, int C, int H, int W, float eps);
/* Backward of the training composition: dout (N, C, H/2, W/2) and the forward's out/argmax/xsel; dinp (N, C, H, W)
 * = (NULL to skip); dgamma, dbeta (C) +=. Agrees with the three backward kernels in turn up to the order
 * of the (double) channel sums. */
void dt_bn_relu_maxpool2x2_backward(float *dinp, float *dgamma, float *dbeta, const float *dout, const float *out,
                                    const int32_t *argmax, const float *xsel, const float *inp, const float *mean,
                                    const float *invstd, const float *gamma, int N, int C, int H, int W);
/* The same backward a plane at a time, for kernels that consume the input gradient where it is made
 * (conv_bn_pool.c): what the training forward saved, and dinp's terms for channel c (k, a, b: three floats),
 * computed once from the channel's sums (dgamma, dbeta += as above; either may be NULL). The plane's values are
 * dt_bn_relu_maxpool2x2_backward's, bit for bit. */
typedef struct dt_bn_pool_saved {
  const float *out;       /* the pool's output (N, C, H/2, W/2) */
  const int32_t *argmax;  /* (N, C, H/2, W/2), indices into an H*W plane */
  const float *xsel;      /* the normalised input at the argmax */
  const float *inp;       /* the BN input (N, C, H, W) */
  const float *mean, *invstd, *gamma; /* (C); gamma may be NULL */
  int N, C, H, W;
} dt_bn_pool_saved;
void dt_bn_pool_channel_terms(const dt_bn_pool_saved *s, const float *dout, int c, float *dgamma, float *dbeta,
                              float terms[3]);
/* dx (H, W) = dinp of sample n, channel c. */
void dt_bn_pool_plane_grad(const dt_bn_pool_saved *s, const float *dout, int n, int c, const float terms[3],
                           float *dx);
/* Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d(2) backward where the convolution's input gradient is not wanted
 * (conv_bn_pool.c), for g with dt_conv2d_weights_direct and the BN-pool's (H, W) = g's (OH, OW): dw, db (may be
 * NULL), dgamma, dbeta +=, with the bits of dt_bn_relu_maxpool2x2_backward into a buffer then dt_conv2d_backward
 * (at the same thread count), the buffer never written. scratch: dt_conv2d_scratch_floats(g); work:
 * dt_conv_bn_pool_work_floats(g), 64-byte aligned. */
size_t dt_conv_bn_pool_work_floats(const dt_conv2d_geom *g);
void dt_conv_bn_pool_backward(const dt_conv2d_geom *g, const dt_bn_pool_saved *s, const float *dout, float *dw,
                              float *db, float *dgamma, float *dbeta, float *scratch, float *work, const float *inp);
/* Tests: 0 takes pooled rows of 8 windows and more through the gathers and the scatter of narrower rows (the same
 * results), 1 (the default) 8 windows at a time. */
void dt_bn_pool_set_rows(int on);

/* ---- activations -------------------------------------------------------- */
typedef enum dt_act_kind {
  DT_ACT_RELU,
  DT_ACT_GELU,      /* exact: x * Phi(x), torch approximate='none' */
  DT_ACT_GELU_TANH, /* torch approximate='tanh' */
  DT_ACT_TANH,
  DT_ACT_SIGMOID,
} dt_act_kind;
void dt_act_forward(dt_act_kind k, float *out, const float *inp, size_t n);
/* inp and out are the forward's input and output (each kernel uses what it needs). */
void dt_act_backward(dt_act_kind k, float *dinp, const float *dout, const float *inp, const float *out, size_t n);

/* ---- dropout ------------------------------------------------------------ */
/* Element i is kept with probability 1-p, decided by Philox(key(seed, stream), i):
 * the same (seed, stream) gives the same mask on any thread count.
 * out = inp * keep / (1 - p); mask (n) records keep for backward. p in [0, 1). */
void dt_dropout_forward(float *out, uint8_t *mask, const float *inp, size_t n, float p, uint64_t seed,
                        uint64_t stream);
void dt_dropout_backward(float *dinp, const float *dout, const uint8_t *mask, size_t n, float p);
/* out[i] = dropout of inp[i] as element first + i of a dt_dropout_forward with the same (p, seed, stream) would
 * make it (no mask kept; single-threaded: for blocks of a larger array). */
void dt_dropout_range(float *out, const float *inp, size_t first, size_t n, float p, uint64_t seed, uint64_t stream);

/* ---- layer norm (over the last dimension) -------------------------------- */
/* out (N, C) = (inp - mean) * rstd * w + b per row; mean, rstd (N) kept for backward. */
void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                          int N, int C, float eps);
/* dinp (N, C) =;  dw, db (C) += */
void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *mean,
                           const float *rstd, const float *w, int N, int C);

/* ---- multi-head attention, A heads of H/A ---------------------------------- */
/* The batch's rows of H features: sample b is rows [b*L, (b+1)*L), or with packed sequences rows
 * [off[b], off[b+1]) (no padding); P holds per sample and head an (n, n) block, samples back to back. */
typedef struct dt_attention_geom {
  int B, L, H, A;
  const int32_t *off;      /* packed: (B + 1) row offsets; NULL: L rows a sample */
  const int64_t *sq_off;   /* packed: (B + 1) prefix sums of n^2 */
  const int32_t *mask;     /* unpacked: key j of sample b counts where mask[b * mask_stride + j] != 0; NULL: all */
  size_t mask_stride;
  dt_amp amp; /* autocast: the scores, the probabilities multiplying V and the context rounded to the grid */
} dt_attention_geom;
/* Floats of P for the batch: A * sum of n^2. */
size_t dt_attention_prob_floats(const dt_attention_geom *g);
/* Dropout on the probabilities (p = 0: none); element i of P draws as a dt_dropout_forward over P would. */
typedef struct dt_attention_dropout {
  float p;
  uint64_t seed, stream;
} dt_attention_dropout;
/* Floats of the scratch: two (L, L) blocks per thread, at most `threads` used. */
size_t dt_attention_scratch_floats(int L, int threads);
/* P = softmax(Q_h K_h^T / sqrt(H/A)) over the keys that count (masked keys get 0), kept for backward;
 * ctx: head h's columns = dropout(P_h) (n, n) @ V_h (n, d). */
void dt_attention_forward(float *ctx, float *P, float *scratch, int threads, const float *Q, const float *K,
                          const float *V, const dt_attention_dropout *drop, const dt_attention_geom *g);
/* dQ, dK, dV = from dctx, with the forward's P and dropout (its mask is drawn again, not stored). */
void dt_attention_backward(float *dQ, float *dK, float *dV, float *scratch, int threads, const float *dctx,
                           const float *Q, const float *K, const float *V, const float *P,
                           const dt_attention_dropout *drop, const dt_attention_geom *g);

/* ---- softmax family and loss ------------------------------------------- */
/* rows of (B, C) */
void dt_softmax_forward(float *out, const float *inp, int B, int C);
void dt_softmax_backward(float *dinp, const float *dout, const float *out, int B, int C);
void dt_log_softmax_forward(float *out, const float *inp, int B, int C);
void dt_log_softmax_backward(float *dinp, const float *dout, const float *out, int B, int C);
/* Cross entropy of logits (B, C) against labels (B), mean over B, with label
 * smoothing eps as torch.nn.CrossEntropyLoss(label_smoothing=eps):
 * loss_b = (1 - eps) * -logp[y] + eps * mean_c(-logp[c]).
 * dlogits (B, C) = d(mean loss)/d logits, if non-NULL.
 * DT_INVALID_ARGUMENT (naming the sample) if a label is outside [0, C). */
dt_status dt_cross_entropy(float *loss, float *dlogits, const float *logits, const int32_t *labels, int B, int C,
                           float eps);
/* BCEWithLogits of x (n) against 0/1 targets y (n): mean over n of
 * (1 - y) x + (1 + (pw - 1) y) softplus(-x), with pos_weight pw[i % K] (NULL: 1),
 * as torch.nn.BCEWithLogitsLoss(pos_weight). dx (n) = d(mean)/dx if non-NULL. */
void dt_bce_with_logits(float *loss, float *dx, const float *x, const float *y, size_t n, const float *pw, int K);
/* Mean squared error and mean absolute error over n values (torch.nn.MSELoss, L1Loss);
 * dx = d(mean)/dx if non-NULL (L1: sign, 0 at a tie, as PyTorch). */
void dt_mse(float *loss, float *dx, const float *x, const float *y, size_t n);
void dt_l1(float *loss, float *dx, const float *x, const float *y, size_t n);
/* dt_topk_correct (public, dtrain/loss.h) is implemented with these kernels. */

/* ---- embeddings (row lookups) --------------------------------------------- */
/* The first b in [0, B) whose index idx[b * stride] is outside [0, rows), or -1. */
int dt_index_check(const int32_t *idx, size_t stride, int B, int64_t rows);
/* out[b * out_stride + j] = table[idx[b * stride] * width + j] for j < width. */
void dt_embedding_gather(float *out, size_t out_stride, const float *table, int width, const int32_t *idx,
                         size_t stride, int B);
/* dtable[idx[b * stride] * width + j] += dout[b * dout_stride + j] (rows repeat: summed in b order). */
void dt_embedding_scatter_add(float *dtable, int width, const float *dout, size_t dout_stride, const int32_t *idx,
                              size_t stride, int B);

/* ---- low-precision grids (lowp.c) ----------------------------------------- */
/* x rounded to the nearest bf16 / fp16 value (ties to even), as an f32: inf and NaN stay, fp16 overflows to inf
 * from 65520 and keeps subnormals down to 2^-24. */
float dt_round_bf16(float x);
float dt_round_fp16(float x);
/* x (n) rounded in place to mode's grid (DT_AMP_OFF: untouched), through the path chosen for this CPU. */
void dt_lowp_round(dt_amp mode, float *x, size_t n);
/* dst (n) = src rounded to mode's grid (dst may be src). */
void dt_lowp_round_copy(dt_amp mode, float *dst, const float *src, size_t n);

/* ---- elementwise -------------------------------------------------------- */
void dt_add_forward(float *out, const float *a, const float *b, size_t n); /* out = a + b */
void dt_axpy(float *y, float a, const float *x, size_t n);                /* y += a * x */
void dt_fill(float *x, float v, size_t n);

#endif

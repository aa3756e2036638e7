/* GEMM through OpenBLAS and the fully connected (torch.nn.Linear) kernels built on it. */
#include <string.h>

#include "tensor/kernels.h"

#include <cblas.h>
/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I would clash with the shape names below. */
#undef I

void dt_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_linear_forward(dt_amp amp, float *out, const float *inp, const float *w, const float *b, int B, int I, int O) {
  /* out (B, O): start from the bias rows, then out += inp (B, I) @ w^T (I, O) */
  if (b) {
    for (int r = 0; r < B; r++) memcpy(out + (size_t)r * O, b, (size_t)O * sizeof(float));
  }
  dt_lowp_gemm(amp, 0, 1, B, O, I, 1.0f, inp, I, w, I, b ? 1.0f : 0.0f, out, O);
}

void dt_linear_backward(dt_amp amp, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, int B, int I, int O) {
  if (dinp) dt_lowp_gemm(amp, 0, 0, B, I, O, 1.0f, dout, O, w, I, 0.0f, dinp, I); /* (B, O) @ (O, I) */
  if (dw) dt_lowp_gemm(amp, 1, 0, O, I, B, 1.0f, dout, O, inp, I, 1.0f, dw, I);   /* (O, B) @ (B, I), += */
  if (db) {
    for (int r = 0; r < B; r++) {
      const float *row = dout + (size_t)r * O;
      for (int o = 0; o < O; o++) db[o] += row[o];
    }
  }
}

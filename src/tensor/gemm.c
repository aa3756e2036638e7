/* f32 GEMM, by OpenBLAS or oneDNN's sgemm, and the fully connected (torch.nn.Linear) kernels built on it.
 *
 * Which library multiplies: Debian's OpenBLAS 0.3.21 does not recognise AMD's AVX-512 CPUs (Zen 4) and runs its
 * AVX2 "Haswell" kernels there; oneDNN's sgemm uses AVX-512 and, on such a CPU, ran every shape dtrain
 * multiplies at 1.6-2.3x OpenBLAS's speed (one thread: 2048^3 104 -> 197 GFLOP/s, the convolutions' 32x256x144
 * 88 -> 200; docs/benchmarks.md). So where the build has oneDNN and the CPU AVX-512, f32 GEMMs go to oneDNN;
 * elsewhere (AVX2 CPUs, where OpenBLAS's kernels are the right ones) to OpenBLAS. DT_SGEMM=openblas|onednn
 * overrides the choice, to compare the two. Both run inside the callers' OpenMP regions single-threaded and
 * use the OpenMP thread budget outside them. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "tensor/kernels.h"

#include <cblas.h>
/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I would clash with the shape names below. */
#undef I

#ifdef DT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

static int onednn; /* chosen once (pthread_once): GEMMs are called from several threads */

static void choose(void) {
#ifdef DT_HAVE_DNNL
  const char *v = "auto";
  (void)dt_tunable_str("DT_SGEMM", &v);
  __builtin_cpu_init();
  onednn = strcmp(v, "onednn") == 0 || (strcmp(v, "auto") == 0 && __builtin_cpu_supports("avx512f"));
#endif
}

static int use_onednn(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, choose);
  return onednn;
}

dt_status dt_sgemm_check(void) {
  const char *v = "auto";
  DT_CHECK(dt_tunable_str("DT_SGEMM", &v));
  if (strcmp(v, "auto") && strcmp(v, "openblas") && strcmp(v, "onednn"))
    return dt_error(DT_INVALID_ARGUMENT, "DT_SGEMM=%s: expected auto, openblas or onednn", v);
#ifndef DT_HAVE_DNNL
  if (strcmp(v, "onednn") == 0)
    return dt_error(DT_INVALID_ARGUMENT, "DT_SGEMM=onednn: this build has no oneDNN (apt-get install libdnnl-dev)");
#endif
  return DT_OK;
}

const char *dt_sgemm_name(void) {
  static char name[64];
  if (use_onednn()) return "oneDNN sgemm";
  snprintf(name, sizeof name, "OpenBLAS %s", dt_blas_corename());
  return name;
}

void dt_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
#ifdef DT_HAVE_DNNL
  if (use_onednn() && dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                                 ldc) == dnnl_success)
    return;
#endif
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

/* f32 GEMM, by OpenBLAS or oneDNN's sgemm, and the fully connected (torch.nn.Linear) kernels built on it.
 *
 * Which library multiplies: OpenBLAS picks its kernels by CPU when it loads, unless OPENBLAS_CORETYPE forces
 * them, and an OpenBLAS older than the CPU (or the variable, as this project's machines set it to Haswell) leaves
 * an AVX-512 CPU on AVX2 kernels. There oneDNN's sgemm, which uses AVX-512, ran dtrain's shapes at 1.3-2.5x
 * OpenBLAS's speed (the convolutions' small GEMMs, a 2048-wide mlp, 2048^3; bench/sgemm_shapes), and whole
 * training steps faster (resnet20 1.05x, a 2048-wide mlp's GEMMs 1.5x). Against OpenBLAS's own AVX-512 kernels
 * it was 0.8-1.7x shape by shape and within 4% on whole steps, so there OpenBLAS stays. Hence: oneDNN where the
 * build has it, the CPU has AVX-512 and OpenBLAS runs narrower kernels; OpenBLAS everywhere else.
 * DT_SGEMM=openblas|onednn overrides the choice, to compare the two. Both run single-threaded inside the
 * callers' OpenMP regions and use the OpenMP thread budget outside them. */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/impl.h"
#include "tensor/kernels.h"

#include <cblas.h>
/* OpenBLAS's cblas.h pulls in <complex.h>, whose macro I would clash with the shape names below. */
#undef I

#ifdef DT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

static int onednn; /* chosen once (pthread_once): GEMMs are called from several threads */

/* Below this many elements one thread does a bias pass (a parallel region costs more than it saves); the
 * columns of the bias gradient a thread sums at a time. */
#define PAR_MIN 65536
#define DB_COLUMNS 256

#ifdef DT_HAVE_DNNL
/* OpenBLAS's kernel families that use AVX-512 (0.3.21's names). */
static int openblas_avx512(void) {
  static const char *const wide[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  const char *core = dt_blas_corename();
  for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++)
    if (strcasecmp(core, wide[i]) == 0) return 1;
  return 0;
}
#endif

static void choose(void) {
#ifdef DT_HAVE_DNNL
  const char *v = "auto";
  (void)dt_tunable_str("DT_SGEMM", &v);
  __builtin_cpu_init();
  const int narrower = __builtin_cpu_supports("avx512f") && !openblas_avx512();
  onednn = strcmp(v, "onednn") == 0 || (strcmp(v, "auto") == 0 && narrower);
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

/* The warming thread: one product of each transposition the layers use, single-threaded (no OpenMP team of its
 * own beside the caller's). */
static struct {
  pthread_mutex_t mu;
  pthread_t thread;
  int running, done;
} warm = {.mu = PTHREAD_MUTEX_INITIALIZER};

#ifdef DT_HAVE_DNNL
static void *warm_main(void *arg) {
  (void)arg;
  enum { N = 64 };
  static const char trans[3][2] = {{'N', 'T'}, {'N', 'N'}, {'T', 'N'}};
  float *buf = NULL;
  if (dt_alloc_array(3 * N * N, sizeof *buf, "sgemm warm-up", (void **)&buf) != DT_OK) return NULL;
  omp_set_num_threads(1);
  for (int i = 0; i < 3; i++)
    (void)dnnl_sgemm(trans[i][0], trans[i][1], N, N, N, 1.0f, buf, N, buf + N * N, N, 0.0f, buf + 2 * N * N, N);
  dt_free(buf);
  return NULL;
}
#endif

void dt_sgemm_warm_begin(void) {
#ifdef DT_HAVE_DNNL
  if (!use_onednn()) return;
  pthread_mutex_lock(&warm.mu);
  if (!warm.running && !warm.done && pthread_create(&warm.thread, NULL, warm_main, NULL) == 0) warm.running = 1;
  pthread_mutex_unlock(&warm.mu);
#endif
}

void dt_sgemm_warm_end(void) {
  pthread_mutex_lock(&warm.mu);
  if (warm.running) {
    pthread_join(warm.thread, NULL);
    warm.running = 0;
    warm.done = 1;
  }
  pthread_mutex_unlock(&warm.mu);
}

void dt_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
#ifdef DT_HAVE_DNNL
  /* oneDNN refuses before it writes C (bad arguments, no memory for its packing): OpenBLAS then multiplies. */
  if (use_onednn() && dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                                 ldc) == dnnl_success)
    return;
#endif
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_linear_forward(dt_amp amp, float *out, const float *inp, const float *w, const float *b, int B, int I, int O) {
  /* out (B, O): start from the bias rows (autocast's: rounded, here, where the layer passes the master bias to
   * GEMMs that round the weights themselves; rounding is idempotent), then out += inp (B, I) @ w^T (I, O) */
  if (b) {
    dt_lowp_round_copy(amp, out, b, (size_t)O);
#pragma omp parallel for if ((size_t)B * O >= PAR_MIN) schedule(static)
    for (int r = 1; r < B; r++) memcpy(out + (size_t)r * O, out, (size_t)O * sizeof *out);
  }
  dt_lowp_gemm_round(amp, 0, 1, B, O, I, 1.0f, inp, I, w, I, b ? 1.0f : 0.0f, out, O);
}

void dt_linear_backward_dw_rows(dt_amp amp, float *dw, const float *dout, const float *inp, int B, int I, int O,
                                int o0, int o1, int assign) {
  if (o1 <= o0) return;
  dt_lowp_gemm(amp, 1, 0, o1 - o0, I, B, 1.0f, dout + o0, O, inp, I, assign ? 0.0f : 1.0f, dw + (size_t)o0 * I,
               I); /* (o1 - o0, B) @ (B, I) */
}

void dt_linear_backward(dt_amp amp, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, int B, int I, int O, int assign) {
  if (dinp) dt_lowp_gemm_round(amp, 0, 0, B, I, O, 1.0f, dout, O, w, I, 0.0f, dinp, I); /* (B, O) @ (O, I) */
  if (dw) dt_linear_backward_dw_rows(amp, dw, dout, inp, B, I, O, 0, O, assign);
  if (db) {
    if (assign) memset(db, 0, (size_t)O * sizeof *db); /* then the sum in the same order, to the same bits */
    /* threads by blocks of columns, each summed over the rows in order: the bits of one thread's sum */
#pragma omp parallel for if ((size_t)B * O >= PAR_MIN) schedule(static)
    for (int o0 = 0; o0 < O; o0 += DB_COLUMNS) {
      const int o1 = o0 + DB_COLUMNS < O ? o0 + DB_COLUMNS : O;
      for (int r = 0; r < B; r++) {
        const float *row = dout + (size_t)r * O;
        for (int o = o0; o < o1; o++) db[o] += row[o];
      }
    }
  }
}

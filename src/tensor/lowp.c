/* Low-precision grids for mixed precision: f32 buffers rounded in place to bf16 / fp16 (round to nearest even),
 * and the run-time dispatch point that names the path a CPU takes. */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "tensor/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
/* Whether CPUID leaf 7 sets EDX bit `bit` and the OS saves every state of xcr0_mask (XCR0): for AVX512-FP16 (bit 23,
 * the AVX-512 states) and AMX-BF16 (bit 22, the tile states), which clang 14's __builtin_cpu_supports cannot name. */
static int leaf7_edx(int bit, unsigned xcr0_mask) {
  unsigned a, b, c, d, lo, hi;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> bit) & 1u)) return 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return 0; /* OSXSAVE: xgetbv may run */
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  (void)hi;
  return (lo & xcr0_mask) == xcr0_mask;
}
#define XCR0_AVX512 0xe6u  /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
#define XCR0_AMX 0x60000u  /* XTILECFG, XTILEDATA */
#endif

static inline uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
static inline float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* Keeps the top 16 bits, rounding the lower 16 to even; inf stays inf (its low bits are 0), NaN stays a quiet NaN
 * (rounding could carry a NaN's payload into the exponent and make it inf). Branch-free and static so the loops
 * below vectorise (an exported function of a shared library is not inlined). */
static inline uint32_t bf16_bits(uint32_t u) {
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u, quiet = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
}

float dt_round_bf16(float x) { return bits_f32(bf16_bits(f32_bits(x))); }

/* fp16: 10 mantissa bits, normals from 2^-14, subnormals on the 2^-24 grid, largest finite 65504; from 65520 (the
 * tie between 65504 and 2^16, whose even neighbour is 2^16) the value overflows to inf. */
static inline float fp16_value(float x) {
  const uint32_t u = f32_bits(x), sign = u & 0x80000000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return x;                      /* inf, NaN */
  if (a >= 0x477ff000u) return bits_f32(sign | 0x7f800000u); /* >= 65520 */
  if (a < 0x38800000u) {                               /* below 2^-14: adding 0.5 leaves 2^-24 as the last bit */
    const float t = bits_f32(a) + 0.5f; /* exact IEEE arithmetic: no -ffast-math here */
    return bits_f32(sign | f32_bits(t - 0.5f));
  }
  const uint32_t r = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
  return bits_f32(sign | r);
}

static void round_bf16_span(float *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = bits_f32(bf16_bits(f32_bits(src[i])));
}
float dt_round_fp16(float x) { return fp16_value(x); }

static void round_fp16_span(float *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = fp16_value(src[i]);
}

/* Below PAR_MIN elements, or inside a parallel region (attention's heads), the calling thread rounds it all with no
 * region of its own (even one thread's costs a call into the OpenMP runtime, and callers round many short rows: a
 * bias per row of a batch); above, the threads take blocks of ROUND_BLOCK. */
#define PAR_MIN 65536
#define ROUND_BLOCK 16384
static void round_by(void (*span)(float *, const float *, size_t), float *dst, const float *src, size_t n) {
  if (n < PAR_MIN || omp_in_parallel()) {
    span(dst, src, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += ROUND_BLOCK) span(dst + b, src + b, n - b < ROUND_BLOCK ? n - b : ROUND_BLOCK);
}
static void round_bf16_emulated(float *dst, const float *src, size_t n) { round_by(round_bf16_span, dst, src, n); }
static void round_fp16_emulated(float *dst, const float *src, size_t n) { round_by(round_fp16_span, dst, src, n); }

/* The dispatch point: what each mode runs on this CPU, chosen once from its features and DT_AMP_KERNELS. bf16 with
 * AVX512_BF16 multiplies natively: our own GEMM (gemm_bf16.c), or oneDNN's bf16 matmul (gemm_lowp.c) when asked
 * for or where the CPU has AMX (whose tiles only oneDNN uses); every other case is the emulation, f32 GEMMs on
 * values rounded to the grid. Both native GEMMs round their operands as they pack them (layers that rely on it
 * pass them unrounded: dt_layer_ops.gemm_operands); the rounding loop is the same code on every path. */
typedef int (*lowp_gemm_fn)(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc);
typedef struct lowp_path {
  void (*round)(float *dst, const float *src, size_t n); /* dst may be src */
  lowp_gemm_fn gemm;       /* NULL: dt_sgemm (the emulation); 0 returned: declined (see dt_lowp_gemm) */
  lowp_gemm_fn gemm_round; /* the same, rounding C as it stores; NULL: gemm and a rounding pass */
  const char *name;
} lowp_path;

enum { KERNELS_AUTO, KERNELS_OWN, KERNELS_ONEDNN, KERNELS_EMULATED, KERNEL_CHOICES };
static const char *const kernel_choices[KERNEL_CHOICES] = {
    [KERNELS_AUTO] = "auto", [KERNELS_OWN] = "own", [KERNELS_ONEDNN] = "onednn", [KERNELS_EMULATED] = "emulated"};

/* DT_AMP_KERNELS as one of the choices; KERNEL_CHOICES for anything else (*v: the value). */
static int kernels_asked(const char **v) {
  *v = "auto";
  (void)dt_tunable_str("DT_AMP_KERNELS", v);
  int i = 0;
  while (i < KERNEL_CHOICES && strcmp(*v, kernel_choices[i])) i++;
  return i;
}

dt_status dt_amp_kernels_check(void) {
  const char *v;
  DT_CHECK(dt_tunable_str("DT_AMP_KERNELS", &v));
  const int i = kernels_asked(&v);
  if (i == KERNEL_CHOICES)
    return dt_error(DT_INVALID_ARGUMENT, "DT_AMP_KERNELS=%s: expected auto, own, onednn or emulated", v);
  if (i == KERNELS_OWN && !dt_gemm_bf16_own_available())
    return dt_error(DT_INVALID_ARGUMENT, "DT_AMP_KERNELS=own: this CPU has no AVX512_BF16");
  if (i == KERNELS_ONEDNN && !dt_gemm_bf16_onednn_available())
    return dt_error(DT_INVALID_ARGUMENT, "DT_AMP_KERNELS=onednn: needs AVX512_BF16 and a build with oneDNN "
                    "(apt-get install libdnnl-dev)");
  return DT_OK;
}

static const lowp_path *bf16_path; /* chosen once (pthread_once): layers ask from several threads */
static void bf16_choose(void) {
  static const lowp_path emulated = {round_bf16_emulated, NULL, NULL, "bf16 emulated (f32 GEMMs on the bf16 grid)"};
  static const lowp_path own = {round_bf16_emulated, dt_gemm_bf16_own, dt_gemm_bf16_own_round,
                                "bf16 native (dtrain's vdpbf16ps GEMM for Linear, Conv2d's GEMMs and attention's "
                                "projections; the rest f32 on the grid)"};
  static const lowp_path onednn = {round_bf16_emulated, dt_gemm_bf16_onednn, NULL,
                                   "bf16 native (oneDNN bf16 matmul for Linear, Conv2d's GEMMs and attention's "
                                   "projections; the rest f32 on the grid)"};
  const char *v;
  const int k = kernels_asked(&v); /* checked before any run (dt_amp_kernels_check): anything else is auto */
#if defined(__x86_64__) && defined(__GNUC__)
  const int amx = leaf7_edx(22, XCR0_AMX);
#else
  const int amx = 0;
#endif
  if ((k == KERNELS_ONEDNN || (k != KERNELS_OWN && k != KERNELS_EMULATED && amx)) && dt_gemm_bf16_onednn_available())
    bf16_path = &onednn;
  else if (k != KERNELS_EMULATED && dt_gemm_bf16_own_available())
    bf16_path = &own;
  else
    bf16_path = &emulated;
}

static const lowp_path *path_of(dt_amp mode) {
  static const lowp_path fp16 = {round_fp16_emulated, NULL, NULL, "fp16 emulated (f32 GEMMs on the fp16 grid)"};
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (mode == DT_AMP_BF16) {
    pthread_once(&once, bf16_choose);
    return bf16_path;
  }
  return mode == DT_AMP_FP16 ? &fp16 : NULL;
}

int dt_amp_native_gemm(dt_amp mode) {
  const lowp_path *p = path_of(mode);
  return p && p->gemm;
}

/* A stored matrix (rows, cols; row stride ld) rounded into a new packed one (ld = cols); NULL without memory. */
static float *rounded_copy(const lowp_path *p, const float *x, int rows, int cols, int ld) {
  float *y = malloc((size_t)rows * cols * sizeof *y);
  if (y)
    for (int r = 0; r < rows; r++) p->round(y + (size_t)r * cols, x + (size_t)r * ld, (size_t)cols);
  return y;
}

/* Where a native kernel declines (it found no memory for its packing): the emulation, on rounded copies of the
 * operands, since the layers that let the native GEMMs round (dt_layer_ops.gemm_operands) pass them unrounded;
 * without memory for those either, the f32 GEMM on the operands as they are, said once (a forward cannot fail). */
static void emulate_rounded(const lowp_path *p, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                            int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  float *a = rounded_copy(p, A, ar, ac, lda), *b = a ? rounded_copy(p, B, br, bc, ldb) : NULL;
  if (a && b) {
    dt_sgemm(ta, tb, M, N, K, alpha, a, ac, b, bc, beta, C, ldc);
  } else {
    static atomic_int said;
    if (!atomic_exchange(&said, 1))
      DT_LOG_WARN("amp", "out of memory for a %d x %d x %d low-precision GEMM: it (and any like it) ran in f32 on "
                  "unrounded operands", M, N, K);
    dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  free(a);
  free(b);
}

void dt_lowp_gemm(dt_amp mode, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
  const lowp_path *p = path_of(mode);
  if (!p || !p->gemm || M <= 0 || N <= 0 || K <= 0)
    dt_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (!p->gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
    emulate_rounded(p, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_lowp_gemm_round(dt_amp mode, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                        int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  const lowp_path *p = path_of(mode);
  if (p && p->gemm_round && M > 0 && N > 0 && K > 0 &&
      p->gemm_round(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
    return;
  dt_lowp_gemm(mode, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (!p || M <= 0 || N <= 0) return;
  if (ldc == N) /* one pass over C, on the thread budget where it is large (a row at a time would be one thread's) */
    p->round(C, C, (size_t)M * N);
  else
    for (int r = 0; r < M; r++) p->round(C + (size_t)r * ldc, C + (size_t)r * ldc, (size_t)N);
}

void dt_lowp_round(dt_amp mode, float *x, size_t n) { dt_lowp_round_copy(mode, x, x, n); }

void dt_lowp_round_copy(dt_amp mode, float *dst, const float *src, size_t n) {
  const lowp_path *p = path_of(mode);
  if (p)
    p->round(dst, src, n);
  else if (dst != src)
    memcpy(dst, src, n * sizeof *dst);
}

const char *dt_amp_path_name(dt_amp mode) {
  const lowp_path *p = path_of(mode);
  return p ? p->name : "f32";
}

int dt_amp_cpu_native(dt_amp mode) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (mode == DT_AMP_BF16) return __builtin_cpu_supports("avx512bf16");
  if (mode == DT_AMP_FP16) return leaf7_edx(23, XCR0_AVX512);
#endif
  (void)mode;
  return 0;
}

dt_status dt_amp_parse(const char *s, dt_amp *out) {
  static const char *const names[] = {"off", "bf16", "fp16"};
  for (int i = 0; i < 3; i++)
    if (s && strcmp(s, names[i]) == 0) {
      *out = (dt_amp)i;
      return DT_OK;
    }
  return dt_error(DT_INVALID_ARGUMENT, "--amp '%s': expected bf16, fp16 or off", s ? s : "(null)");
}

/* oneDNN's bf16 matmul as a native bf16 GEMM for autocast (DT_AMP_KERNELS=onednn): operands packed to bf16 with
 * AVX512_BF16's conversion and multiplied by oneDNN's brgemm kernels (vdpbf16ps, or AMX tiles where the CPU has
 * them), f32 accumulation. The conversion rounds to nearest even, so operands off the grid are rounded as autocast
 * would (the layers that let the GEMM round them pass them so), and the result equals the emulation's f32 GEMM on
 * the rounded values up to the order of the sums.
 *
 * dtrain's own kernel (gemm_bf16.c) is the default: on a Zen 5 EPYC it matched or passed this one on whole training
 * steps (bench/gemm_bf16_shapes, bench/amp_vs_f32.py). This one stays to compare against, and for CPUs with AMX,
 * whose tiles ours does not use. Where the build has no oneDNN or the CPU no AVX512_BF16,
 * dt_gemm_bf16_onednn_available() is 0. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "tensor/kernels.h"

#if defined(DT_HAVE_DNNL) && defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

/* The convolutions call GEMMs from several threads at once. With oneDNN's own scratchpad, fashioncnn's
 * convolution GEMMs on two threads spoiled each other's results (0.23 of weight difference after 16 steps, 3e-3
 * without), so each primitive asks for a user scratchpad and each thread brings its own, after its operands.
 *
 * One matmul primitive per GEMM shape, made on first use and kept for the process: a model has a handful of
 * shapes (each layer's forward and two backward products, and the last batch's). Entries are never evicted, so
 * a primitive another thread is running stays valid; shapes past the table get a primitive for the one call. */
enum { CACHE_SLOTS = 128 };
typedef struct gemm_key {
  int ta, tb, M, N, K, lda, ldb, ldc;
  float alpha, beta;
} gemm_key;
typedef struct gemm_entry {
  gemm_key key;
  dnnl_memory_desc_t a, b, c, scratch; /* scratch: the primitive's own buffer, the caller's (see below) */
  size_t scratch_bytes;
  dnnl_primitive_t prim;
} gemm_entry;

static struct {
  pthread_mutex_t lock;
  dnnl_engine_t engine;
  int ready; /* 1: engine made; -1: oneDNN refused (the f32 path is taken) */
  int count;
  gemm_entry slot[CACHE_SLOTS];
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int engine_ready(void) {
  pthread_mutex_lock(&cache.lock);
  if (!cache.ready) cache.ready = dnnl_engine_create(&cache.engine, dnnl_cpu, 0) == dnnl_success ? 1 : -1;
  const int ok = cache.ready == 1;
  pthread_mutex_unlock(&cache.lock);
  return ok;
}

static int native;
static void native_init(void) {
  __builtin_cpu_init();
  native = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && engine_ready();
}

int dt_gemm_bf16_onednn_available(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, native_init);
  return native;
}

/* The stored matrix (rows, cols) of an operand, packed: ld becomes cols. */
static void packed_dims(int trans, int rows, int cols, int *sr, int *sc) {
  *sr = trans ? cols : rows;
  *sc = trans ? rows : cols;
}

/* A (M, K) and B (K, N) as packed (ld = the stored matrix's columns), C (M, N) with its own row stride. */
static dnnl_status_t make_entry(const gemm_key *k, gemm_entry *e) {
  const int ac = k->ta ? k->M : k->K, bc = k->tb ? k->K : k->N;
  const dnnl_dims_t ad = {k->M, k->K}, bd = {k->K, k->N}, cd = {k->M, k->N};
  const dnnl_dims_t as = {k->ta ? 1 : ac, k->ta ? ac : 1}, bs = {k->tb ? 1 : bc, k->tb ? bc : 1}, cs = {k->ldc, 1};
  dnnl_status_t s;
  if ((s = dnnl_memory_desc_init_by_strides(&e->a, 2, ad, dnnl_bf16, as)) ||
      (s = dnnl_memory_desc_init_by_strides(&e->b, 2, bd, dnnl_bf16, bs)) ||
      (s = dnnl_memory_desc_init_by_strides(&e->c, 2, cd, dnnl_f32, cs)))
    return s;
  dnnl_matmul_desc_t md;
  if ((s = dnnl_matmul_desc_init(&md, &e->a, &e->b, NULL, &e->c))) return s;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  dnnl_primitive_desc_t pd = NULL;
  if (!(s = dnnl_primitive_attr_create(&attr)) && !(s = dnnl_post_ops_create(&ops)) &&
      !(s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) &&
      (k->alpha == 1.0f || !(s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha))) &&
      (k->beta == 0.0f || !(s = dnnl_post_ops_append_sum(ops, k->beta))) &&
      !(s = dnnl_primitive_attr_set_post_ops(attr, ops)) &&
      !(s = dnnl_primitive_desc_create(&pd, &md, attr, cache.engine, NULL))) {
    e->scratch = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->scratch_bytes = dnnl_memory_desc_get_size(&e->scratch);
    s = dnnl_primitive_create(&e->prim, pd);
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (ops) dnnl_post_ops_destroy(ops);
  if (attr) dnnl_primitive_attr_destroy(attr);
  e->key = *k;
  return s;
}

/* The cached entry for k, made if new; *temp = 1 when the table is full and the caller must destroy it. */
static dnnl_status_t entry_for(const gemm_key *k, gemm_entry *out, int *temp) {
  *temp = 0;
  pthread_mutex_lock(&cache.lock);
  for (int i = 0; i < cache.count; i++)
    if (memcmp(&cache.slot[i].key, k, sizeof *k) == 0) {
      *out = cache.slot[i];
      pthread_mutex_unlock(&cache.lock);
      return dnnl_success;
    }
  dnnl_status_t s = make_entry(k, out);
  if (s == dnnl_success && cache.count < CACHE_SLOTS)
    cache.slot[cache.count++] = *out;
  else
    *temp = s == dnnl_success;
  pthread_mutex_unlock(&cache.lock);
  return s;
}

/* One row of n floats to bf16, round to nearest even (exact on the grid). Compiled for AVX512_BF16 whatever the
 * build's -march; called only where the CPU has it. */
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
BF16_TARGET static void pack_row(uint16_t *d, const float *s, int n) {
  int j = 0;
  for (; j + 16 <= n; j += 16) _mm256_storeu_si256((__m256i *)(d + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + j)));
  if (j < n) {
    const __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
    _mm256_mask_storeu_epi16(d + j, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + j)));
  }
}

/* dst (rows, cols) = src (rows, cols; row stride ld) to bf16; the rows over the threads when there are many
 * (the loop is outside the target function: OpenMP's outlined body would not carry its target). */
static void pack_rows(uint16_t *dst, const float *src, int rows, int cols, int ld) {
  const int big = (size_t)rows * cols >= (1u << 16);
#pragma omp parallel for if (big) schedule(static)
  for (int r = 0; r < rows; r++) pack_row(dst + (size_t)r * cols, src + (size_t)r * ld, cols);
}

/* The packed bytes of a (rows, cols) bf16 operand, rounded up to 64 so what follows stays aligned. */
static size_t packed_bytes(int rows, int cols) { return ((size_t)rows * cols * sizeof(uint16_t) + 63) & ~(size_t)63; }

int dt_gemm_bf16_onednn(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0 || K <= 0 || !dt_gemm_bf16_onednn_available()) return 0;
  const gemm_key key = {ta, tb, M, N, K, 0, 0, ldc, alpha, beta}; /* packed: lda, ldb are the shape's */
  gemm_entry e;
  int temp;
  if (entry_for(&key, &e, &temp) != dnnl_success) return 0;
  int ar, ac, br, bc;
  packed_dims(ta, M, K, &ar, &ac);
  packed_dims(tb, K, N, &br, &bc);
  const size_t na = packed_bytes(ar, ac), nb = packed_bytes(br, bc);
  char *buf = dt_thread_scratch(na + nb + e.scratch_bytes);
  dnnl_memory_t am = NULL, bm = NULL, cm = NULL, sm = NULL;
  dnnl_stream_t st = NULL;
  int ok = buf && !dnnl_memory_create(&am, &e.a, cache.engine, buf) &&
           !dnnl_memory_create(&bm, &e.b, cache.engine, buf + na) && !dnnl_memory_create(&cm, &e.c, cache.engine, C) &&
           !dnnl_memory_create(&sm, &e.scratch, cache.engine, buf + na + nb) &&
           !dnnl_stream_create(&st, cache.engine, dnnl_stream_default_flags);
  if (ok) { /* C is not touched before this point, so a refusal above leaves the f32 GEMM to the caller */
    pack_rows((uint16_t *)(void *)buf, A, ar, ac, lda);
    pack_rows((uint16_t *)(void *)(buf + na), B, br, bc, ldb);
    const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                                     {DNNL_ARG_SCRATCHPAD, sm}};
    if (dnnl_primitive_execute(e.prim, st, 4, args) || dnnl_stream_wait(st)) {
      DT_LOG_ERROR("amp", "oneDNN failed a bf16 matmul (%d x %d x %d) it had accepted", M, N, K);
      abort(); /* C may be half written: no result can be trusted */
    }
  }
  if (st) dnnl_stream_destroy(st);
  if (sm) dnnl_memory_destroy(sm);
  if (cm) dnnl_memory_destroy(cm);
  if (bm) dnnl_memory_destroy(bm);
  if (am) dnnl_memory_destroy(am);
  if (temp) dnnl_primitive_destroy(e.prim);
  return ok;
}

#else

int dt_gemm_bf16_onednn_available(void) { return 0; }

int dt_gemm_bf16_onednn(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc) {
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta;
  (void)C, (void)ldc;
  return 0;
}

#endif

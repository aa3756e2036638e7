/* Vectors of 8 floats for the hand-blocked kernels (conv3x3.c, conv_wino.c, conv2d.c, batchnorm.c; tensor-internal).
 *
 * GCC/Clang vector extensions: with AVX2 + FMA (the -march=native release build) they compile to ymm registers
 * and vfmadd; without (the sanitizer build, other CPUs) to whatever the target has, correct and slower. */
#ifndef DT_TENSOR_V8_H
#define DT_TENSOR_V8_H

#include <string.h>

#if defined(__FMA__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* Without AVX (sanitizer and debug builds) GCC and Clang warn that passing 32-byte vectors changes the ABI: the
 * kernels pass them between static functions only, so no ABI is crossed. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
  v8 v;
  memcpy(&v, p, sizeof v);
  return v;
}
/* The loaded vector stays in a register: GCC would otherwise fold the load into each FMA that uses it, and the
 * repeated loads, not the FMAs, would bound the kernels. */
#if defined(__AVX512VL__) /* any of the 32 vector registers ("x": the first 16 only, and copies into them) */
#define KEEP(v) __asm__("" : "+v"(v))
#elif defined(__AVX__)
#define KEEP(v) __asm__("" : "+x"(v))
#else
#define KEEP(v) ((void)0)
#endif
#define store8(p, v) memcpy((p), &(v), sizeof(v8)) /* v an lvalue */
static inline v8 splat8(float x) { return (v8){x, x, x, x, x, x, x, x}; }
/* Lane masks (all ones or zeros, what a comparison of v8s gives) and selects by them: m ? a : b per lane. */
typedef int v8i __attribute__((vector_size(32)));
static inline v8 sel8(v8i m, v8 a, v8 b) { return (v8)(((v8i)a & m) | ((v8i)b & ~m)); }
static inline v8i seli8(v8i m, v8i a, v8i b) { return (a & m) | (b & ~m); }
/* The even and the odd elements of the 16 floats lo, hi; and back. */
#define EVEN8(lo, hi) __builtin_shufflevector((lo), (hi), 0, 2, 4, 6, 8, 10, 12, 14)
#define ODD8(lo, hi) __builtin_shufflevector((lo), (hi), 1, 3, 5, 7, 9, 11, 13, 15)
#define INTERLEAVE_LO8(e, o) __builtin_shufflevector((e), (o), 0, 8, 1, 9, 2, 10, 3, 11)
#define INTERLEAVE_HI8(e, o) __builtin_shufflevector((e), (o), 4, 12, 5, 13, 6, 14, 7, 15)
/* a * b + c (a macro, as store8: a function taking vectors draws GCC's ABI note in builds without AVX) */
#if defined(__FMA__)
#define fma8(a, b, c) ((v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#else
#define fma8(a, b, c) ((a) * (b) + (c))
#endif

/* The sum of v's 8 lanes in a fixed tree: ((0+4) + (2+6)) + ((1+5) + (3+7)). */
static inline float lanes_sum8(v8 v) {
  const v8 h = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  const v8 q = h + __builtin_shufflevector(h, h, 2, 3, 0, 1, 2, 3, 0, 1);
  return q[0] + q[1];
}

/* The sum of x[0..n): 8 independent float lanes in one vector (an array of 8 lanes was left scalar by GCC, with
 * the lanes moved through memory: 5% of fashioncnn's step), the lanes then added in double in order. */
static inline double sum_floats(const float *x, int n) {
  v8 lane = splat8(0.0f);
  int i = 0;
  for (; i + 8 <= n; i += 8) lane += load8(x + i);
  double s = 0.0;
  for (int j = 0; j < 8; j++) s += lane[j];
  for (; i < n; i++) s += x[i];
  return s;
}

#endif

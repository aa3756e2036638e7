/* Vectors of 16 floats for the AVX-512 paths of the hand-blocked kernels (conv_wino.c, conv3x3.c; tensor-internal), the
 * 16-wide companions of v8.h: defined only where the compiler targets AVX-512F and FMA (the -march=native release
 * build on such a CPU), DT_V16 then 1. FMAs always fused, as v8.h's are with FMA, so a kernel that sums the same
 * terms in the same order gives the same bits at either width. */
#ifndef DT_TENSOR_V16_H
#define DT_TENSOR_V16_H

#if defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#include <string.h>

#define DT_V16 1
typedef float v16 __attribute__((vector_size(64)));
static inline v16 load16(const float *p) {
  v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}
#define store16(p, v) memcpy((p), &(v), sizeof(v16)) /* v an lvalue */
#define splat16(x) ((v16)_mm512_set1_ps(x))
#define fma16(a, b, c) ((v16)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define KEEP16(v) __asm__("" : "+v"(v)) /* as v8.h's KEEP: the loaded vector stays in a register */
#else
#define DT_V16 0
#endif

#endif

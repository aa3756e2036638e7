/* Tests of the core: status table, error detail, tunables, allocation, Philox RNG (uniform, normal), tensors, UTF-8,
 * JSON string literals. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/impl.h"
#include "core/text.h"
#include "harness.h"

TEST(status_names_and_messages) {
  ASSERT_STR_EQ(dt_status_name(DT_OK), "DT_OK");
  ASSERT_STR_EQ(dt_status_name(DT_CORRUPT), "DT_CORRUPT");
  ASSERT_STR_EQ(dt_status_message(DT_IO), "input/output error");
  ASSERT_STR_EQ(dt_status_name((dt_status)999), "DT_UNKNOWN");
}

TEST(error_detail_is_recorded_and_prefixed) {
  dt_clear_error();
  ASSERT_STR_EQ(dt_last_error(), "");
  ASSERT_EQ(dt_error(DT_IO, "file %s", "x.idx"), DT_IO);
  ASSERT_STR_EQ(dt_last_error(), "file x.idx");
  ASSERT_EQ(dt_error_prefix(DT_IO, "loading"), DT_IO);
  ASSERT_STR_EQ(dt_last_error(), "loading: file x.idx");
}

TEST(tunables_read_environment_and_reject_garbage) {
  long v = -1;
  unsetenv("DT_PREFETCH");
  ASSERT_OK(dt_tunable_int("DT_PREFETCH", &v));
  ASSERT_EQ(v, 0); /* the default: sized by the batch */
  setenv("DT_PREFETCH", "5", 1);
  ASSERT_OK(dt_tunable_int("DT_PREFETCH", &v));
  ASSERT_EQ(v, 5);
  setenv("DT_PREFETCH", "5x", 1);
  ASSERT_STATUS(dt_tunable_int("DT_PREFETCH", &v), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "DT_PREFETCH") != NULL);
  unsetenv("DT_PREFETCH");
  ASSERT_STATUS(dt_tunable_int("DT_NO_SUCH", &v), DT_NOT_FOUND);
}

TEST(alloc_is_aligned_zeroed_and_checked) {
  void *p = NULL;
  ASSERT_OK(dt_alloc(100, &p));
  ASSERT(((uintptr_t)p % 64) == 0);
  for (int i = 0; i < 100; i++) ASSERT(((unsigned char *)p)[i] == 0);
  dt_free(p);
  dt_free(NULL);
  void *q = (void *)0x1;
  ASSERT_STATUS(dt_alloc_array(SIZE_MAX / 2, 4, "test", &q), DT_OUT_OF_MEMORY);
  ASSERT(q == (void *)0x1); /* output untouched on failure */
  /* Data sets' arrays: from 4 MiB on 2 MiB boundaries (where the kernel can back them with huge pages), zeroed. */
  const size_t sizes[] = {100, (size_t)5 << 20};
  for (int k = 0; k < 2; k++) {
    unsigned char *h = NULL;
    ASSERT_OK(dt_alloc_array_huge(sizes[k], 1, "test data", (void **)&h));
    ASSERT(((uintptr_t)h % (k ? (uintptr_t)2 << 20 : 64)) == 0);
    for (size_t i = 0; i < sizes[k]; i += 4093) ASSERT(h[i] == 0);
    ASSERT(h[sizes[k] - 1] == 0);
    h[sizes[k] - 1] = 1;
    dt_free(h);
  }
  ASSERT_STATUS(dt_alloc_array_huge(SIZE_MAX / 2, 4, "test", &q), DT_OUT_OF_MEMORY);
  ASSERT(q == (void *)0x1);
}

TEST(philox_known_answer) {
  /* Random123 known-answer test for philox4x32-10: counter 0, key 0. */
  uint32_t out[4];
  dt_philox4x32(0, 0, out);
  ASSERT_EQ(out[0], 0x6627e8d5u);
  ASSERT_EQ(out[1], 0xe169c58du);
  ASSERT_EQ(out[2], 0xbc57ac4cu);
  ASSERT_EQ(out[3], 0x9b00dbd8u);
}

TEST(rng_is_reproducible_and_uniform) {
  dt_rng a, b, c;
  dt_rng_init(&a, 42, 7);
  dt_rng_init(&b, 42, 7);
  dt_rng_init(&c, 42, 8);
  int differ = 0;
  double sum = 0;
  for (int i = 0; i < 100000; i++) {
    float x = dt_rng_uniform(&a), y = dt_rng_uniform(&b);
    ASSERT(x == y);
    ASSERT(x >= 0.0f && x < 1.0f);
    differ |= x != dt_rng_uniform(&c);
    sum += x;
  }
  ASSERT(differ);
  ASSERT_NEAR(sum / 100000, 0.5, 0.01);
  int counts[7] = {0};
  for (int i = 0; i < 70000; i++) counts[dt_rng_below(&a, 7)]++;
  for (int i = 0; i < 7; i++) ASSERT(counts[i] > 9400 && counts[i] < 10600);
}

/* Box-Muller normals: reproducible per (seed, stream), finite, and with the
 * moments of N(0, 1). 200000 draws: the standard error of the mean is 0.0022,
 * of the variance 0.0032, of the fourth moment about 0.02. */
TEST(rng_normal_is_reproducible_with_standard_moments) {
  enum { N = 200000 };
  dt_rng a, b, c;
  dt_rng_init(&a, 42, 7);
  dt_rng_init(&b, 42, 7);
  dt_rng_init(&c, 42, 8);
  double m1 = 0, m2 = 0, m3 = 0, m4 = 0;
  int differ = 0, within1 = 0;
  for (int i = 0; i < N; i++) {
    float x = dt_rng_normal(&a);
    ASSERT(x == dt_rng_normal(&b));
    ASSERT(isfinite(x));
    differ |= x != dt_rng_normal(&c);
    double v = x;
    m1 += v, m2 += v * v, m3 += v * v * v, m4 += v * v * v * v;
    within1 += fabs(v) < 1.0;
  }
  ASSERT(differ);
  m1 /= N, m2 /= N, m3 /= N, m4 /= N;
  ASSERT(fabs(m1) < 0.01);
  ASSERT(fabs(m2 - 1.0) < 0.015);
  ASSERT(fabs(m3) < 0.03);
  ASSERT(fabs(m4 - 3.0) < 0.1);
  ASSERT(fabs((double)within1 / N - 0.682689) < 0.005);
}

TEST(tensor_describe_and_convert) {
  dt_tensor t;
  int64_t shape[3] = {2, 3, 4};
  ASSERT_OK(dt_tensor_new(&t, DT_F32, 3, shape));
  ASSERT_EQ(dt_tensor_numel(&t), 24);
  ASSERT_EQ(dt_tensor_bytes(&t), 96);
  char buf[64];
  ASSERT_STR_EQ(dt_tensor_shape_str(&t, buf, sizeof buf), "(2, 3, 4)");
  dt_tensor_free(&t);
  dt_tensor_free(&t);
  int64_t bad[1] = {-1};
  ASSERT_STATUS(dt_tensor_new(&t, DT_F32, 1, bad), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_tensor_new(&t, DT_F32, 6, shape), DT_INVALID_ARGUMENT);
  ASSERT(dt_bf16_to_f32(dt_f32_to_bf16(1.5f)) == 1.5f);
  ASSERT(dt_f16_to_f32(dt_f32_to_f16(-2.75f)) == -2.75f);
  ASSERT(dt_f16_to_f32(dt_f32_to_f16(1e6f)) == INFINITY);
  ASSERT(dt_f16_to_f32(dt_f32_to_f16(5.9604645e-08f)) == 5.9604645e-08f); /* smallest subnormal */
  ASSERT(dt_f32_to_bf16(1.0f + 1.0f / 256) == dt_f32_to_bf16(1.0f)); /* ties to even */
  dt_dtype d;
  ASSERT_OK(dt_dtype_parse("bf16", &d));
  ASSERT_EQ(d, DT_BF16);
  ASSERT_STATUS(dt_dtype_parse("f8", &d), DT_INVALID_ARGUMENT);
}

/* Reference conversions written the plain way (branches, one case at a time): the library's branch-free ones, and
 * their loops over many values, must give the same bits. */
static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static uint16_t ref_f16(float x) {
  uint32_t u = bits_of(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return (uint16_t)sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}
static float ref_from_f16(uint16_t x) {
  uint32_t sign = (uint32_t)(x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
  if (e == 0) return m == 0 ? float_of(sign) : (sign ? -1.0f : 1.0f) * (float)m / 16777216.0f;
  if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));
  return float_of(sign | ((e + 112) << 23) | (m << 13));
}
static uint16_t ref_bf16(float x) {
  uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f32 patterns: a stride over all 2^32; every pattern within 2048 of each boundary of the formats; and ties, halfway
 * between two fp16 normals, two fp16 subnormals or two bf16 values; all of the last two with both signs. */
#define PROBES (65536 + 5 * 2 * 4096 + 3 * 2 * 4096)
static void f32_probes(float *x) {
  static const uint32_t edges[] = {0x33000000u, 0x38800000u, 0x477ff000u, 0x7f800000u, 0x00800000u};
  size_t n = 0;
  for (uint32_t i = 0; i < 65536; i++) x[n++] = float_of(i * 65521u);
  for (int e = 0; e < 5; e++)
    for (uint32_t sign = 0; sign < 2; sign++)
      for (uint32_t d = 0; d < 4096; d++) x[n++] = float_of(sign << 31 | (edges[e] - 2048 + d));
  for (uint32_t sign = 0; sign < 2; sign++)
    for (uint32_t k = 0; k < 4096; k++) {
      x[n++] = float_of(sign << 31 | (0x38800000u + k * 0x2000u + 0x1000u)); /* fp16 normals' ties */
      x[n++] = (sign ? -1.0f : 1.0f) * (float)(2 * (k % 1024) + 1) / 33554432.0f; /* (2k+1) 2^-25 */
      x[n++] = float_of(sign << 31 | (0x3f800000u + k * 0x10000u + 0x8000u)); /* bf16 ties */
    }
}

TEST(half_conversions_match_the_reference_bit_for_bit) {
  float *x = malloc(PROBES * sizeof *x), *back = malloc(65536 * sizeof *back);
  uint16_t *h = malloc(PROBES * sizeof *h), *all = malloc(65536 * sizeof *all);
  ASSERT(x && back && h && all);
  f32_probes(x);
  int bad = 0;
  dt_f32_to_f16_n(h, x, PROBES, 1.0f);
  for (size_t i = 0; i < PROBES; i++) bad += h[i] != ref_f16(x[i]) || dt_f32_to_f16(x[i]) != h[i];
  ASSERT_EQ(bad, 0);
  dt_f32_to_bf16_n(h, x, PROBES, 1.0f);
  for (size_t i = 0; i < PROBES; i++) bad += h[i] != ref_bf16(x[i]) || dt_f32_to_bf16(x[i]) != h[i];
  ASSERT_EQ(bad, 0);
  dt_f32_to_f16_n(h, x, PROBES, 0.5f); /* the scale multiplies first */
  for (size_t i = 0; i < PROBES; i++) bad += h[i] != ref_f16(x[i] * 0.5f);
  ASSERT_EQ(bad, 0);
  dt_f32_to_bf16_n(h, x, PROBES, 0.5f);
  for (size_t i = 0; i < PROBES; i++) bad += h[i] != ref_bf16(x[i] * 0.5f);
  ASSERT_EQ(bad, 0);
  for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
  dt_f16_to_f32_n(back, all, 65536);
  for (uint32_t i = 0; i < 65536; i++)
    bad += bits_of(back[i]) != bits_of(ref_from_f16(all[i])) || bits_of(dt_f16_to_f32(all[i])) != bits_of(back[i]);
  ASSERT_EQ(bad, 0);
  dt_bf16_to_f32_n(back, all, 65536);
  for (uint32_t i = 0; i < 65536; i++) bad += bits_of(back[i]) != i << 16 || bits_of(dt_bf16_to_f32(all[i])) != i << 16;
  ASSERT_EQ(bad, 0);
  free(x), free(back), free(h), free(all);
}

TEST(thread_budget) {
  ASSERT_OK(dt_set_threads(1));
  ASSERT_EQ(dt_get_threads(), 1);
  ASSERT_OK(dt_set_threads(0));
  ASSERT_EQ(dt_get_threads(), dt_num_cores());
}

/* RFC 3629's table: every boundary of it, one byte either side. */
TEST(utf8_is_rfc3629_strict) {
#define VALID(lit) dt_utf8_valid(lit, sizeof lit - 1)
  ASSERT(VALID(""));
  ASSERT(VALID("plain \x7f ascii"));
  ASSERT(VALID("\xc2\x80 \xdf\xbf \xe0\xa0\x80 \xed\x9f\xbf \xee\x80\x80 \xf0\x90\x80\x80 \xf4\x8f\xbf\xbf"));
  ASSERT(!VALID("\xc0\xaf"));             /* overlong '/' */
  ASSERT(!VALID("\xc1\xbf"));             /* overlong */
  ASSERT(!VALID("\xe0\x9f\xbf"));         /* overlong U+07FF */
  ASSERT(!VALID("\xf0\x8f\xbf\xbf"));     /* overlong U+FFFF */
  ASSERT(!VALID("\xed\xa0\x80"));         /* surrogate U+D800 */
  ASSERT(!VALID("\xed\xbf\xbf"));         /* surrogate U+DFFF */
  ASSERT(!VALID("\xf4\x90\x80\x80"));     /* U+110000 */
  ASSERT(!VALID("\xf5\x80\x80\x80"));
  ASSERT(!VALID("\xff"));
  ASSERT(!VALID("\x80"));                 /* lone continuation byte */
  ASSERT(!VALID("\xe2\x82"));             /* truncated */
  ASSERT(!VALID("\xc3("));                /* bad continuation */
  ASSERT(!dt_utf8_valid("\xe2\x82\xac", 2)); /* cut by the length, not the NUL */
  ASSERT_EQ(dt_utf8_char_len("\xe2\x82\xac", 3), 3);
  ASSERT_EQ(dt_utf8_char_len("a", 1), 1);
#undef VALID
}

TEST(json_escape_quotes_backslashes_and_controls_only) {
  char buf[64];
  size_t pos = 0;
  ASSERT(dt_json_escape(buf, sizeof buf, &pos, "q\" b\\ nl\n ctl\x01\x1f / \x7f \xe2\x82\xac"));
  ASSERT_STR_EQ(buf, "\"q\\\" b\\\\ nl\\u000a ctl\\u0001\\u001f / \x7f \xe2\x82\xac\"");
  ASSERT_EQ(pos, strlen(buf));
  pos = 2; /* appends at *pos */
  ASSERT(dt_json_escape(buf, sizeof buf, &pos, NULL));
  ASSERT_STR_EQ(buf + 2, "\"\"");
  ASSERT_EQ(pos, 4);
  /* "ab" needs 4 bytes and the NUL: 5 fit, 4 do not and leave *pos alone. */
  pos = 0;
  ASSERT(dt_json_escape(buf, 5, &pos, "ab"));
  ASSERT_EQ(pos, 4);
  pos = 0;
  ASSERT(!dt_json_escape(buf, 4, &pos, "ab"));
  ASSERT_EQ(pos, 0);
}

/* Every block the allocators hand out is counted (the tests of warm steps rely on it), huge ones included. */
TEST(allocations_are_counted) {
  const uint64_t before = dt_alloc_count();
  void *a = NULL, *b = NULL;
  ASSERT_OK(dt_alloc(10, &a));
  ASSERT_OK(dt_alloc_array_huge((size_t)5 << 20, 1, "test", &b));
  ASSERT(dt_alloc_count() - before == 2);
  dt_free(b);
  dt_free(a);
}

/* After dt_keep_freed_memory a 24 MiB block comes from the heap, not from a mapping of its own that free would
 * unmap (glibc counts those in hblks; by default it maps every block from 128 KiB up, raising that bound only to
 * the size of a mapped block freed before). The threshold accepted is 256 MiB, or 32 MiB on an older glibc. */
TEST(freed_memory_is_kept) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33) && !defined(__SANITIZE_ADDRESS__) /* ASan brings its own malloc */
  const int threshold = dt_keep_freed_memory_threshold();
  ASSERT(threshold == 256 << 20 || threshold == 32 << 20);
  const size_t mapped = mallinfo2().hblks;
  void *p = malloc((size_t)24 << 20);
  ASSERT(p != NULL);
  ASSERT_EQ(mallinfo2().hblks, mapped);
  free(p);
#endif
}

TEST_MAIN(TEST_ENTRY(status_names_and_messages), TEST_ENTRY(error_detail_is_recorded_and_prefixed),
          TEST_ENTRY(tunables_read_environment_and_reject_garbage), TEST_ENTRY(alloc_is_aligned_zeroed_and_checked),
          TEST_ENTRY(philox_known_answer), TEST_ENTRY(rng_is_reproducible_and_uniform),
          TEST_ENTRY(rng_normal_is_reproducible_with_standard_moments),
          TEST_ENTRY(tensor_describe_and_convert), TEST_ENTRY(half_conversions_match_the_reference_bit_for_bit),
          TEST_ENTRY(thread_budget), TEST_ENTRY(utf8_is_rfc3629_strict),
          TEST_ENTRY(json_escape_quotes_backslashes_and_controls_only), TEST_ENTRY(allocations_are_counted),
          TEST_ENTRY(freed_memory_is_kept))

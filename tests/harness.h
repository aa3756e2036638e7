/* A tiny test harness: TEST(name) functions, ASSERT_* that report file:line and fail the test. */
#ifndef DT_TEST_HARNESS_H
#define DT_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"

typedef struct dt_test_case {
  const char *name;
  void (*fn)(int *failed);
} dt_test_case;

#define TEST(name) static void test_##name(int *dt_test_failed_)
#define TEST_ENTRY(name) {#name, test_##name}

#define FAIL_(...)                                             \
  do {                                                         \
    fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);          \
    fprintf(stderr, __VA_ARGS__);                              \
    fprintf(stderr, "\n");                                     \
    *dt_test_failed_ = 1;                                      \
    return;                                                    \
  } while (0)

#define ASSERT(cond) \
  do {               \
    if (!(cond)) FAIL_("assertion failed: %s", #cond); \
  } while (0)
/* Same, showing msg (e.g. the error detail) on failure. */
#define ASSERT_MSG(cond, msg) \
  do {                        \
    if (!(cond)) FAIL_("assertion failed: %s (%s)", #cond, (msg)); \
  } while (0)
#define ASSERT_EQ(a, b)                                                              \
  do {                                                                               \
    long long a_ = (long long)(a), b_ = (long long)(b);                              \
    if (a_ != b_) FAIL_("%s == %s: %lld != %lld", #a, #b, a_, b_);                   \
  } while (0)
#define ASSERT_STR_EQ(a, b)                                                          \
  do {                                                                               \
    const char *a_ = (a), *b_ = (b);                                                 \
    if (!a_ || !b_ || strcmp(a_, b_) != 0) FAIL_("%s == %s: \"%s\" != \"%s\"", #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); \
  } while (0)
/* |a - b| <= tol * max(1, |b|) */
#define ASSERT_NEAR(a, b, tol)                                                       \
  do {                                                                               \
    double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                   \
    if (!(fabs(a_ - b_) <= t_ * fmax(1.0, fabs(b_))))                                \
      FAIL_("%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b, a_, b_, t_);                  \
  } while (0)
/* A dtrain call must succeed; on failure show the status and detail. */
#define ASSERT_OK(expr)                                                              \
  do {                                                                               \
    dt_status s_ = (expr);                                                           \
    if (s_ != DT_OK) FAIL_("%s -> %s: %s", #expr, dt_status_name(s_), dt_last_error()); \
  } while (0)
/* A dtrain call must fail with this status. */
#define ASSERT_STATUS(expr, want)                                                    \
  do {                                                                               \
    dt_status s_ = (expr);                                                           \
    if (s_ != (want)) FAIL_("%s -> %s, expected %s (%s)", #expr, dt_status_name(s_), dt_status_name(want), dt_last_error()); \
  } while (0)

/* Runs every case (or the ones named on the command line); exit 1 if any failed.
 * Prints "N passed, M failed" as the closing line. */
static inline int dt_test_run(const dt_test_case *cases, int n, int argc, char **argv) {
  int passed = 0, failed = 0;
  for (int i = 0; i < n; i++) {
    if (argc > 1) {
      int want = 0;
      for (int a = 1; a < argc; a++) want |= strcmp(argv[a], cases[i].name) == 0;
      if (!want) continue;
    }
    int f = 0;
    dt_clear_error();
    cases[i].fn(&f);
    printf("%s %s\n", f ? "FAIL" : "ok  ", cases[i].name);
    fflush(stdout);
    if (f) failed++; else passed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
#define TEST_MAIN(...)                                                              \
  int main(int argc, char **argv) {                                                 \
    static const dt_test_case cases_[] = {__VA_ARGS__};                            \
    return dt_test_run(cases_, (int)(sizeof cases_ / sizeof cases_[0]), argc, argv); \
  }

#endif

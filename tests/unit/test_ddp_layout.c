/* DDP's bucket plan (ddp_layout.c): the layout it picks finishes the modelled all-reduces no later than any
 * other (checked against every layout of small random cases), keeps row tables alone, and behaves as the model
 * says on cases worked by hand. */
#include <math.h>

#include "core/impl.h"
#include "harness.h"
#include "parallel/parallel-impl.h"

/* The modelled finish of a given layout (first[0..nb)), as the planner models it. */
static double finish_of(const dt_ddp_plan_tensor *t, int n, const int *first, int nb, double alpha, double pb) {
  double busy = 0;
  for (int k = 0; k < nb; k++) {
    const int end = k + 1 < nb ? first[k + 1] : n;
    double bytes = 0, ready = 0;
    for (int i = first[k]; i < end; i++) bytes += t[i].bytes, ready = fmax(ready, t[i].ready_s);
    busy = fmax(busy, ready) + alpha + bytes * pb;
  }
  return busy;
}

static int valid(const dt_ddp_plan_tensor *t, int n, const int *first, int nb) {
  for (int k = 0; k < nb; k++) {
    const int end = k + 1 < nb ? first[k + 1] : n;
    for (int i = first[k]; i < end; i++)
      if (t[i].alone && end - first[k] != 1) return 0;
  }
  return 1;
}

TEST(plan_is_optimal_over_every_layout) {
  enum { N = 8 };
  dt_rng r;
  dt_rng_init(&r, 42, 0);
  for (int c = 0; c < 300; c++) {
    const int n = 1 + (int)dt_rng_below(&r, N);
    dt_ddp_plan_tensor t[N];
    double at = 0;
    for (int i = 0; i < n; i++) {
      at += dt_rng_uniform(&r) * 1e-3; /* backward makes them ready in arena order */
      t[i] = (dt_ddp_plan_tensor){.bytes = 4.0 * (1 + dt_rng_below(&r, 1 << 20)), .ready_s = at,
                                  .alone = dt_rng_below(&r, 6) == 0};
    }
    const double alpha = dt_rng_uniform(&r) * 2e-4, pb = dt_rng_uniform(&r) * 2e-9;
    int first[N], best_first[N];
    double fin = 0;
    const int nb = dt_ddp_plan_buckets(t, n, alpha, pb, first, &fin);
    ASSERT(nb >= 1 && first[0] == 0 && valid(t, n, first, nb));
    ASSERT_NEAR(finish_of(t, n, first, nb, alpha, pb), fin, 1e-12);
    double best = INFINITY;
    for (unsigned mask = 0; mask < 1u << (n - 1); mask++) { /* bit i: a bucket starts at tensor i + 1 */
      int m = 0;
      best_first[m++] = 0;
      for (int i = 0; i < n - 1; i++)
        if (mask & (1u << i)) best_first[m++] = i + 1;
      if (valid(t, n, best_first, m)) best = fmin(best, finish_of(t, n, best_first, m, alpha, pb));
    }
    if (fin > best * (1 + 1e-12)) FAIL_("case %d: planned finish %.9g s, another layout finishes at %.9g s", c, fin, best);
  }
}

TEST(hand_worked_cases) {
  int first[4];
  double fin;
  /* all ready at once: one bucket (one alpha) */
  dt_ddp_plan_tensor same[4] = {{1e6, 0, 0}, {1e6, 0, 0}, {1e6, 0, 0}, {1e6, 0, 0}};
  ASSERT_EQ(dt_ddp_plan_buckets(same, 4, 1e-3, 1e-9, first, &fin), 1);
  ASSERT_NEAR(fin, 1e-3 + 4e6 * 1e-9, 1e-12);
  /* ready 1 s apart, 0.11 s each: one bucket per tensor, each hidden behind the next tensor's wait */
  dt_ddp_plan_tensor spread[4] = {{1e6, 0, 0}, {1e6, 1, 0}, {1e6, 2, 0}, {1e6, 3, 0}};
  ASSERT_EQ(dt_ddp_plan_buckets(spread, 4, 0.01, 1e-7, first, &fin), 4);
  ASSERT_NEAR(fin, 3.11, 1e-9);
  /* a row table in the middle is alone even where one bucket would do */
  dt_ddp_plan_tensor table[4] = {{8, 0, 0}, {8, 0, 1}, {8, 0, 0}, {8, 0, 0}};
  ASSERT_EQ(dt_ddp_plan_buckets(table, 4, 1.0, 0, first, &fin), 3);
  ASSERT(first[0] == 0 && first[1] == 1 && first[2] == 2);
}

/* The layout where the communication threads share the compute's CPUs: one bucket, but for row tables, alone. */
TEST(fewest_buckets_keep_row_tables_alone) {
  int first[6];
  const dt_ddp_plan_tensor none[4] = {{8, 0, 0}, {8, 1, 0}, {8, 2, 0}, {8, 3, 0}};
  ASSERT_EQ(dt_ddp_plan_fewest(none, 4, first), 1);
  ASSERT_EQ(first[0], 0);
  const dt_ddp_plan_tensor mid[6] = {{8, 0, 0}, {8, 0, 1}, {8, 0, 0}, {8, 0, 0}, {8, 0, 1}, {8, 0, 1}};
  ASSERT_EQ(dt_ddp_plan_fewest(mid, 6, first), 5);
  ASSERT(first[0] == 0 && first[1] == 1 && first[2] == 2 && first[3] == 4 && first[4] == 5);
  const dt_ddp_plan_tensor head[3] = {{8, 0, 1}, {8, 0, 0}, {8, 0, 0}};
  ASSERT_EQ(dt_ddp_plan_fewest(head, 3, first), 2);
  ASSERT(first[0] == 0 && first[1] == 1);
}

TEST_MAIN(TEST_ENTRY(plan_is_optimal_over_every_layout), TEST_ENTRY(hand_worked_cases),
          TEST_ENTRY(fewest_buckets_keep_row_tables_alone))

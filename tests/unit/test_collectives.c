/* The block partition, the average's division and reduction names; every
 * collective x dtype x op x size, in place and out of place, on world sizes 1
 * to 5 (forked processes, oversubscribed) for the shm and tcp backends and
 * auto selection; asynchronous work handles; no /dev/shm leftovers. */
#include <string.h>

#include "dist/dist-impl.h"
#include "dist_check.h"
#include "dist_fork.h"
#include "harness.h"

#define RUN_ID "coll"

static int next_round;

static int check_child(df_job *j, int r, int world, void *arg) {
  int large = *(int *)arg;
  dt_group *g;
  if (df_join(j, r, world, &g) != DT_OK) {
    fprintf(stderr, "rank %d: join: %s\n", r, dt_last_error());
    return 2;
  }
  dc_result res = {0};
  dc_run_all(g, large, &res);
  if (res.failed) fprintf(stderr, "[%s world %d rank %d] %d of %d failed; first: %s\n", j->backend, world, r,
                          res.failed, res.run, res.first_failure);
  int backend_ok = strcmp(j->backend, "auto") != 0 || strcmp(dt_group_backend(g), "shm") == 0;
  if (!backend_ok) fprintf(stderr, "auto picked %s on one host\n", dt_group_backend(g));
  dt_group_destroy(g);
  return res.failed || !backend_ok ? 1 : 0;
}

static int run_backend(const char *backend, int world, int large) {
  df_job j = {.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = backend,
              .timeout_s = 60};
  return df_run(&j, world, check_child, &large);
}

/* Blocks tile [0, count) in rank order; the first count % world ranks hold one more. */
TEST(block_partition_tiles_count_in_rank_order) {
  static const size_t want[][2] = {{0, 3}, {3, 3}, {6, 2}, {8, 2}}; /* 10 over 4 ranks */
  for (int r = 0; r < 4; r++) {
    size_t off, n;
    dt_block_of(10, 4, r, &off, &n);
    ASSERT_EQ(off, want[r][0]);
    ASSERT_EQ(n, want[r][1]);
  }
  for (int world = 1; world <= 7; world++)
    for (size_t count = 0; count <= 23; count++) {
      size_t next = 0;
      for (int r = 0; r < world; r++) {
        size_t off, n;
        dt_block_of(count, world, r, &off, &n);
        ASSERT_EQ(off, next);
        ASSERT_EQ(n, count / (size_t)world + ((size_t)r < count % (size_t)world));
        next = off + n;
      }
      ASSERT_EQ(next, count);
    }
}

/* The average's division gives the bits of sum / world for every f32 and f64, NaN payloads included, whatever
 * the divisor (by a power of two it multiplies instead): the smallest subnormals, the signed zeros, infinities,
 * NaNs with payloads, the extremes, then a stride over all f32 patterns and random f64 ones. */
TEST(average_divides_bit_for_bit) {
  enum { N = 70000 };
  static float f[N], fw[N];
  static double d[N], dw[N];
  static const uint32_t edges32[] = {0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffc12345u, 0x7fa00000u,
                                     0x00800000u, 0x80800000u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000001u};
  static const uint64_t edges64[] = {0x8000000000000000u, 0x7ff0000000000000u, 0x7ff8000000000123u,
                                     0x0010000000000000u, 0x7fefffffffffffffu, 0x0000000000000001u};
  static const int divisors[] = {2, 3, 4, 5, 6, 7, 8, 12, 64, 1024, 1 << 20, 1 << 30};
  const size_t n32 = sizeof edges32 / sizeof edges32[0], n64 = sizeof edges64 / sizeof edges64[0];
  for (size_t k = 0; k < sizeof divisors / sizeof divisors[0]; k++) {
    const int div = divisors[k];
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < N; i++) {
      const uint32_t bits = i < 64 ? (uint32_t)i : i < 64 + n32 ? edges32[i - 64] : (uint32_t)(i * 61363u);
      x = x * 6364136223846793005u + 1442695040888963407u;
      const uint64_t bits64 = i < n64 ? edges64[i] : i < 2 * n64 ? edges64[i - n64] | (uint64_t)1 << 63 : x;
      memcpy(&f[i], &bits, sizeof bits);
      memcpy(&d[i], &bits64, sizeof bits64);
      fw[i] = f[i] / (float)div;
      dw[i] = d[i] / (double)div;
    }
    dt_reduce_scale(f, N, DT_F32, div);
    dt_reduce_scale(d, N, DT_F64, div);
    size_t bad = 0;
    for (size_t i = 0; i < N; i++)
      bad += (memcmp(&f[i], &fw[i], sizeof f[i]) != 0) + (memcmp(&d[i], &dw[i], sizeof d[i]) != 0);
    if (bad) fprintf(stderr, "divisor %d: %zu values differ from the division\n", div, bad);
    ASSERT_EQ(bad, 0);
  }
}

/* Reduction names round-trip through dt_redop_parse; anything else is refused, leaving the output alone. */
TEST(redop_names_parse_back) {
  for (int i = 0; i < DT_REDOP_COUNT; i++) {
    dt_redop op = DT_REDOP_COUNT;
    ASSERT_OK(dt_redop_parse(dt_redop_name((dt_redop)i), &op));
    ASSERT_EQ(op, i);
  }
  ASSERT_STR_EQ(dt_redop_name(DT_AVG), "avg");
  dt_redop op = DT_MAX;
  ASSERT_STATUS(dt_redop_parse("prod", &op), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "'prod'") && strstr(dt_last_error(), "sum, avg, min or max"));
  ASSERT_STATUS(dt_redop_parse("SUM", &op), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_redop_parse("", &op), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_redop_parse(NULL, &op), DT_INVALID_ARGUMENT);
  ASSERT_EQ(op, DT_MAX);
}

TEST(shm_every_collective_world_1_to_5) {
  for (int world = 1; world <= 5; world++) ASSERT_EQ(run_backend("shm", world, world == 2 || world == 5), 0);
}

TEST(tcp_every_collective_world_1_to_5) {
  for (int world = 1; world <= 5; world++) ASSERT_EQ(run_backend("tcp", world, world == 3 || world == 4), 0);
}

TEST(auto_picks_shm_on_one_host) { ASSERT_EQ(run_backend("auto", 3, 0), 0); }

/* Whether the communication thread has a CPU of its own: the ranks (unbound, so all sharing this one's CPUs) times
 * their compute threads and one communication thread each fit in the CPUs; on shm from the ranks' CPU sets, on tcp
 * from the host's rank count. On 2 CPUs: yes for 1 rank of 1 thread, no for 2. */
static int comm_cpu_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_set_threads(1);
  dt_group *g;
  if (df_join(j, r, world, &g) != DT_OK) {
    fprintf(stderr, "rank %d: join: %s\n", r, dt_last_error());
    return 2;
  }
  const int want = world * 2 <= dt_usable_cores(), got = dt_group_comm_has_cpu(g);
  if (got != want)
    fprintf(stderr, "[%s world %d rank %d] comm thread has a CPU: %d, want %d\n", j->backend, world, r, got, want);
  dt_group_destroy(g);
  return got != want;
}

TEST(comm_thread_cpu_counts_ranks_and_threads) {
  static const char *const backends[] = {"shm", "tcp"};
  for (int b = 0; b < 2; b++)
    for (int world = 1; world <= 3; world++) {
      df_job j = {.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = backends[b],
                  .timeout_s = 30};
      ASSERT_EQ(df_run(&j, world, comm_cpu_child, NULL), 0);
    }
}

/* DT_COMM_CPU=0 or 1 says it instead of the CPU sets, on either backend (2 ranks: on 2 CPUs the sets say 0); any
 * other value fails the join with a message naming it. */
static int comm_cpu_env_child(df_job *j, int r, int world, void *arg) {
  const char *v = arg;
  dt_set_threads(1);
  setenv("DT_COMM_CPU", v, 1);
  dt_group *g;
  const dt_status st = df_join(j, r, world, &g);
  if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
    if (st == DT_OK) dt_group_destroy(g);
    const int named = strstr(dt_last_error(), "DT_COMM_CPU=") != NULL;
    if (st != DT_USAGE || !named) fprintf(stderr, "rank %d: DT_COMM_CPU=%s joined: %d (%s)\n", r, v, st, dt_last_error());
    return st != DT_USAGE || !named;
  }
  if (st != DT_OK) {
    fprintf(stderr, "rank %d: join: %s\n", r, dt_last_error());
    return 2;
  }
  const int got = dt_group_comm_has_cpu(g);
  if (got != v[0] - '0') fprintf(stderr, "[%s rank %d] DT_COMM_CPU=%s: has a CPU %d\n", j->backend, r, v, got);
  dt_group_destroy(g);
  return got != v[0] - '0';
}

TEST(comm_cpu_env_overrides_the_cpu_sets) {
  static const char *const backends[] = {"shm", "tcp"};
  static const char *const values[] = {"1", "0", "yes"};
  for (int b = 0; b < 2; b++)
    for (int k = 0; k < 3; k++) {
      df_job j = {.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = backends[b],
                  .timeout_s = 30};
      ASSERT_EQ(df_run(&j, 2, comm_cpu_env_child, (void *)values[k]), 0);
    }
}

/* Twenty all-reduces in flight at once, waited for in reverse order: each
 * completes with its own result, in issue order (sequence numbers 1..20).
 * A one-rank group completes each at submit. */
static int async_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g;
  if (df_join(j, r, world, &g) != DT_OK) return 2;
  enum { N = 20, COUNT = 50000 };
  static float buf[N][COUNT];
  dt_work *w[N];
  int bad = 0;
  for (int k = 0; k < N; k++) {
    for (int i = 0; i < COUNT; i++) buf[k][i] = (float)(k + r);
    if (dt_allreduce(g, buf[k], buf[k], COUNT, DT_F32, DT_SUM, &w[k]) != DT_OK) return 3;
    if (dt_work_seq(w[k]) != (uint64_t)k + 1) bad = 1;
    if (world == 1 && !dt_work_test(w[k])) { /* one rank: run at submit, no communication thread woken */
      fprintf(stderr, "world 1: all-reduce %d not complete when submitted\n", k);
      bad = 1;
    }
  }
  for (int k = N - 1; k >= 0; k--) {
    if (dt_work_wait(w[k], 0) != DT_OK) {
      fprintf(stderr, "rank %d wait %d: %s\n", r, k, dt_last_error());
      return 4;
    }
    if (!dt_work_test(w[k])) bad = 1;
    dt_work_free(w[k]);
    float want = (float)(world * k + world * (world - 1) / 2);
    for (int i = 0; i < COUNT; i++)
      if (buf[k][i] != want) {
        fprintf(stderr, "rank %d op %d: %g != %g\n", r, k, buf[k][i], want);
        return 5;
      }
  }
  dt_group_destroy(g);
  return bad;
}

TEST(async_work_handles_complete_in_issue_order) {
  const char *backends[] = {"shm", "tcp"};
  for (int b = 0; b < 2; b++) {
    df_job j = {.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = backends[b],
                .timeout_s = 60};
    ASSERT_EQ(df_run(&j, 3, async_child, NULL), 0);
    df_job one = {.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = backends[b],
                  .timeout_s = 60};
    ASSERT_EQ(df_run(&one, 1, async_child, NULL), 0);
  }
}

/* A collective with bad arguments fails on the caller with the reason, and
 * does not consume a sequence number (the group stays usable). */
static int args_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g;
  if (df_join(j, r, world, &g) != DT_OK) return 2;
  float x[4] = {1, 2, 3, 4};
  if (dt_broadcast(g, x, 4, DT_F32, world, NULL) != DT_INVALID_ARGUMENT) return 3;
  if (!strstr(dt_last_error(), "root")) return 4;
  if (dt_allreduce(g, NULL, x, 4, DT_F32, DT_SUM, NULL) != DT_INVALID_ARGUMENT) return 5;
  if (dt_allreduce(g, x, x, 4, (dt_dtype)99, DT_SUM, NULL) != DT_INVALID_ARGUMENT) return 6;
  if (dt_allreduce(g, x, x, 4, DT_F32, DT_SUM, NULL) != DT_OK) return 7;
  if (x[3] != 4.0f * (float)world) return 8;
  dt_group_destroy(g);
  return 0;
}

TEST(bad_arguments_fail_locally) {
  df_job j = {.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = "shm",
              .timeout_s = 30};
  ASSERT_EQ(df_run(&j, 2, args_child, NULL), 0);
}

/* Handles may outlive the group: freed after dt_group_destroy they release the
 * group's memory last (ASan catches a use after free of the group here). */
static int late_free_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g;
  if (df_join(j, r, world, &g) != DT_OK) return 2;
  float a[64] = {1}, b[64] = {1};
  dt_work *w1, *w2;
  if (dt_allreduce(g, a, a, 64, DT_F32, DT_SUM, &w1) != DT_OK) return 3;
  if (dt_work_wait(w1, 0) != DT_OK || a[0] != (float)world) return 4;
  if (dt_allreduce(g, b, b, 64, DT_F32, DT_SUM, &w2) != DT_OK) return 5;
  if (dt_work_wait(w2, 0) != DT_OK) return 6;
  dt_group_destroy(g);
  if (!dt_work_test(w1) || dt_work_elapsed(w1) < 0) return 7;
  dt_work_free(w1);
  dt_work_free(w2);
  return 0;
}

TEST(work_handles_freed_after_destroy) {
  df_job j = {.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = "shm",
              .timeout_s = 30};
  ASSERT_EQ(df_run(&j, 2, late_free_child, NULL), 0);
}

TEST(nothing_left_in_dev_shm) { ASSERT_EQ(df_shm_leftovers(RUN_ID), 0); }

TEST_MAIN(TEST_ENTRY(block_partition_tiles_count_in_rank_order), TEST_ENTRY(average_divides_bit_for_bit), TEST_ENTRY(redop_names_parse_back), TEST_ENTRY(shm_every_collective_world_1_to_5), TEST_ENTRY(tcp_every_collective_world_1_to_5), TEST_ENTRY(auto_picks_shm_on_one_host), TEST_ENTRY(comm_thread_cpu_counts_ranks_and_threads), TEST_ENTRY(comm_cpu_env_overrides_the_cpu_sets), TEST_ENTRY(async_work_handles_complete_in_issue_order), TEST_ENTRY(bad_arguments_fail_locally), TEST_ENTRY(work_handles_freed_after_destroy), TEST_ENTRY(nothing_left_in_dev_shm))

/* Tests of the TCP backend: every collective x dtype x op against a reference,
 * in place and out of place, world sizes 1..5 (forked ranks over loopback, one
 * store served by the parent), a several-MiB all-reduce through the pipelined
 * ring, the halving-and-doubling all-reduce of power-of-two worlds; then
 * the rank-order bits of tiny all-reduces (all-to-all at 3 and 5 ranks); then
 * faults: a rank that exits mid all-reduce, a rank that sleeps past the
 * deadline, mismatched collectives, an abort from another thread, and a
 * stranger sending garbage to a listening port during setup. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist-impl.h"
#include "dist_fork.h"
#include "dist_values.h"
#include "harness.h"

/* The store is served by a helper process (dist_fork.h): the test process forks its ranks single-threaded. */
static df_store_proc server;
static int server_port;
static int run_counter;

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* ---- forked worlds ------------------------------------------------------------ */

typedef int (*rank_fn)(dt_backend *b, int rank, int size, void *arg);

typedef struct world_opts {
  int late_rank;      /* this rank starts its setup late_s later; -1: none */
  double late_s;
  int (*stranger)(const char *prefix); /* runs in its own process during setup; its exit code goes to codes[size] */
} world_opts;

static dt_store *child_store; /* in a rank: its store connection */
static char world_prefix[128]; /* the key prefix of the world being run */

static int child_main(int rank, int size, const char *prefix, const world_opts *o, rank_fn fn, void *arg) {
  alarm(60); /* a hung rank dies instead of hanging the test */
  if (o && rank == o->late_rank) sleep_s(o->late_s);
  dt_store *store = NULL;
  dt_status st = dt_store_connect("127.0.0.1", server_port, "t", TEST_SECRET, 10, &store);
  if (st != DT_OK) {
    fprintf(stderr, "rank %d: store connect: %s %s\n", rank, dt_status_name(st), dt_last_error());
    return 90;
  }
  int global[8];
  for (int i = 0; i < size; i++) global[i] = i;
  child_store = store;
  dt_backend_ctx ctx = {.store = store, .prefix = prefix, .job_tag = "tcptest", .rank = rank, .size = size,
                        .global = global, .timeout_s = 20, .host_addr = "127.0.0.1", .secret = TEST_SECRET};
  dt_backend *b = NULL;
  st = dt_backend_tcp_new(&ctx, &b);
  int code;
  if (st != DT_OK) {
    fprintf(stderr, "rank %d: tcp setup: %s %s\n", rank, dt_status_name(st), dt_last_error());
    code = 100 + (int)st;
  } else {
    code = fn(b, rank, size, arg);
    b->ops->destroy(b);
  }
  dt_store_close(store);
  return code;
}

/* Forks size ranks running fn (and the stranger, if any); codes[r] receives
 * each exit code (200 + signal if killed). Kills everything after limit_s. */
static int run_world(int size, rank_fn fn, void *arg, const world_opts *o, double limit_s, int *codes) {
  char prefix[128];
  snprintf(prefix, sizeof prefix, "test/%d/%d/tcp", (int)getpid(), run_counter++);
  snprintf(world_prefix, sizeof world_prefix, "%s", prefix);
  pid_t pids[9] = {0};
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < size; r++) {
    codes[r] = -1;
    pids[r] = fork();
    if (pids[r] < 0) return -1;
    if (pids[r] == 0) _exit(child_main(r, size, prefix, o, fn, arg));
  }
  int total = size;
  if (o && o->stranger) {
    pids[size] = fork();
    if (pids[size] == 0) {
      alarm(30);
      _exit(o->stranger(prefix));
    }
    total++;
  }
  double deadline = dt_time_now() + limit_s;
  int left = total, rc = 0;
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < total; r++)
        if (pids[r] == p) {
          codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
          pids[r] = 0;
          left--;
        }
      continue;
    }
    if (dt_time_now() > deadline) {
      fprintf(stderr, "  world of %d exceeded %.0f s: killed\n", size, limit_s);
      for (int r = 0; r < total; r++)
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          codes[r] = 255;
        }
      rc = -1;
      break;
    }
    sleep_s(0.005);
  }
  return rc;
}

/* ---- data --------------------------------------------------------------------- */

/* ---- one rank of the correctness sweep ------------------------------------------ */

typedef struct ctx_run {
  dt_backend *b;
  uint64_t seq;
  int rank, size;
} ctx_run;

static dt_status run(ctx_run *x, dt_coll_kind kind, const void *send, void *recv, size_t count, dt_dtype t,
                     dt_redop op, int root) {
  dt_coll c = {.kind = kind, .seq = ++x->seq, .send = send, .recv = recv, .count = count, .dtype = t, .op = op,
               .root = root, .deadline = dt_time_now() + 30};
  return dt_backend_run(x->b, &c);
}

#define CHECK_RUN(expr, what)                                                                                 \
  do {                                                                                                        \
    dt_status s_ = (expr);                                                                                    \
    if (s_ != DT_OK) {                                                                                        \
      fprintf(stderr, "rank %d/%d: %s %s count %zu: %s %s\n", x->rank, x->size, what, dt_dtype_name(t), count, \
              dt_status_name(s_), dt_last_error());                                                           \
      return 1;                                                                                               \
    }                                                                                                         \
  } while (0)

static int compare(const ctx_run *x, const char *what, dt_dtype t, int op, int inplace, const void *got, size_t n,
                   size_t first, double (*want)(int size, size_t i, int op, int root), int root) {
  for (size_t i = 0; i < n; i++) {
    double w = want(x->size, first + i, op, root), g = dv_get(got, t, i);
    if (g != w) {
      fprintf(stderr, "rank %d/%d: %s %s op %d %s: element %zu is %g, expected %g\n", x->rank, x->size, what,
              dt_dtype_name(t), op, inplace ? "in place" : "out of place", first + i, g, w);
      return 1;
    }
  }
  return 0;
}

static double want_reduced(int size, size_t i, int op, int root) { return dv_reference((dt_redop)op, size, i); }
static double want_root(int size, size_t i, int op, int root) { return dv_input(root, i); }

/* All-gather: block q of the result must hold rank q's inputs. */
static int check_gathered(const ctx_run *x, dt_dtype t, int inplace, const void *out, size_t count) {
  size_t es = dt_dtype_size(t);
  for (int q = 0; q < x->size; q++) {
    size_t off, len;
    dt_block_of(count, x->size, q, &off, &len);
    if (compare(x, "allgather", t, 0, inplace, (const char *)out + off * es, len, off, want_root, q)) return 1;
  }
  return 0;
}

static int sweep_one(ctx_run *x, dt_dtype t, size_t count, int inplace, void *a, void *c) {
  int r = x->rank, n = x->size;
  size_t es = dt_dtype_size(t), off, len;
  dt_block_of(count, n, r, &off, &len);
  static const dt_redop ops[] = {DT_SUM, DT_MIN, DT_MAX};
  for (int k = 0; k < 3; k++) {
    dt_redop op = ops[k];
    /* all-reduce */
    for (size_t i = 0; i < count; i++) dv_put(a, t, i, dv_input(r, i));
    memset(c, 0x5a, count * es + 16);
    void *out = inplace ? a : c;
    CHECK_RUN(run(x, DT_COLL_ALLREDUCE, a, out, count, t, op, 0), "allreduce");
    if (compare(x, "allreduce", t, op, inplace, out, count, 0, want_reduced, 0)) return 1;
    if (!inplace)
      for (size_t i = 0; i < count; i++)
        if (dv_get(a, t, i) != dv_input(r, i)) {
          fprintf(stderr, "rank %d: allreduce wrote its send buffer\n", r);
          return 1;
        }
    /* reduce-scatter */
    for (size_t i = 0; i < count; i++) dv_put(a, t, i, dv_input(r, i));
    memset(c, 0x5a, count * es + 16);
    out = inplace ? (char *)a + off * es : c;
    CHECK_RUN(run(x, DT_COLL_REDUCE_SCATTER, a, out, count, t, op, 0), "reduce_scatter");
    if (compare(x, "reduce_scatter", t, op, inplace, out, len, off, want_reduced, 0)) return 1;
    if (!inplace && len * es < count * es + 16 && ((unsigned char *)c)[len * es] != 0x5a) {
      fprintf(stderr, "rank %d: reduce_scatter wrote past its block\n", r);
      return 1;
    }
  }
  /* all-gather */
  memset(c, 0x5a, count * es + 16);
  for (size_t i = 0; i < len; i++) dv_put(inplace ? (char *)c + off * es : a, t, i, dv_input(r, off + i));
  CHECK_RUN(run(x, DT_COLL_ALLGATHER, inplace ? (char *)c + off * es : a, c, count, t, DT_SUM, 0), "allgather");
  if (check_gathered(x, t, inplace, c, count)) return 1;
  /* broadcast from the first and the last rank */
  for (int root = 0; root < n; root += (n > 1 ? n - 1 : 1)) {
    if (r == root)
      for (size_t i = 0; i < count; i++) dv_put(a, t, i, dv_input(root, i));
    else
      memset(a, 0x5a, count * es);
    CHECK_RUN(run(x, DT_COLL_BROADCAST, NULL, a, count, t, DT_SUM, root), "broadcast");
    if (compare(x, "broadcast", t, 0, 1, a, count, 0, want_root, root)) return 1;
  }
  return 0;
}

static int rank_sweep(dt_backend *b, int rank, int size, void *arg) {
  ctx_run ctx = {b, 0, rank, size}, *x = &ctx;
  size_t big = ((size_t)3 << 20) / 4 + 5; /* ~3 MiB of f32: several pipeline segments, uneven blocks */
  void *a = NULL, *c = NULL;
  if (dt_alloc(big * 8 + 64, &a) != DT_OK || dt_alloc(big * 8 + 64, &c) != DT_OK) return 2;
  int fail = 0;
  static const dt_dtype types[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64};
  static const size_t counts[] = {0, 1, 7, 1000};
  for (int ti = 0; ti < 6 && !fail; ti++)
    for (int ci = 0; ci < 4 && !fail; ci++)
      for (int ip = 0; ip < 2 && !fail; ip++) fail = sweep_one(x, types[ti], counts[ci], ip, a, c);
  for (int ip = 0; ip < 2 && !fail; ip++) fail = sweep_one(x, DT_F32, big, ip, a, c);
  if (!fail) fail = sweep_one(x, DT_BF16, big + 3, 0, a, c);
  for (int i = 0; i < 3 && !fail; i++) {
    dt_coll bar = {.kind = DT_COLL_BARRIER, .seq = ++x->seq, .send = NULL, .recv = NULL, .count = 0, .dtype = DT_F32,
                   .op = DT_SUM, .root = 0, .deadline = dt_time_now() + 30};
    dt_status st = dt_backend_run(b, &bar);
    if (st != DT_OK) fprintf(stderr, "rank %d: barrier: %s %s\n", rank, dt_status_name(st), dt_last_error()), fail = 1;
  }
  dt_free(a);
  dt_free(c);
  return fail;
}

TEST(collectives_match_reference_for_world_sizes_1_to_5) {
  for (int size = 1; size <= 5; size++) {
    int codes[8];
    double t0 = dt_time_now();
    ASSERT_EQ(run_world(size, rank_sweep, NULL, NULL, 120, codes), 0);
    for (int r = 0; r < size; r++) ASSERT_EQ(codes[r], 0);
    printf("  world %d: %.2f s\n", size, dt_time_now() - t0);
  }
}

/* Power-of-two worlds take Rabenseifner's algorithm above the small-message
 * size: counts just past it, odd ones (uneven halves at every round) and
 * several exchange segments, in place and out of place. */
static int rank_halving(dt_backend *b, int rank, int size, void *arg) {
  ctx_run ctx = {b, 0, rank, size}, *x = &ctx;
  size_t max = ((size_t)5 << 20) / 2 + 9;
  void *a = NULL, *c = NULL;
  if (dt_alloc(max * 8 + 64, &a) != DT_OK || dt_alloc(max * 8 + 64, &c) != DT_OK) return 2;
  static const struct { dt_dtype t; size_t count; } cases[] = {
      {DT_F32, (64 << 10) / 4 + 1}, {DT_F64, (64 << 10) / 8 + 3}, {DT_F32, ((size_t)5 << 20) / 4 + 7},
      {DT_F16, ((size_t)5 << 20) / 2 + 9}, {DT_I64, 100003}, {DT_BF16, (64 << 10) / 2 + 2}};
  static const dt_redop ops[] = {DT_SUM, DT_MAX};
  int fail = 0;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0] && !fail; k++)
    for (int ip = 0; ip < 2 && !fail; ip++)
      for (int oi = 0; oi < 2 && !fail; oi++) {
        dt_dtype t = cases[k].t;
        size_t count = cases[k].count, es = dt_dtype_size(t);
        for (size_t i = 0; i < count; i++) dv_put(a, t, i, dv_input(rank, i));
        memset(c, 0x5a, count * es + 16);
        void *out = ip ? a : c;
        CHECK_RUN(run(x, DT_COLL_ALLREDUCE, a, out, count, t, ops[oi], 0), "allreduce");
        fail = compare(x, "allreduce", t, ops[oi], ip, out, count, 0, want_reduced, 0);
        if (!fail && !ip && ((unsigned char *)c)[count * es] != 0x5a) {
          fprintf(stderr, "rank %d: allreduce wrote past the end\n", rank);
          fail = 1;
        }
        for (size_t i = 0; i < count && !fail && !ip; i++)
          if (dv_get(a, t, i) != dv_input(rank, i)) {
            fprintf(stderr, "rank %d: allreduce wrote its send buffer\n", rank);
            fail = 1;
          }
      }
  dt_free(a);
  dt_free(c);
  return fail;
}

TEST(allreduce_by_halving_and_doubling_in_worlds_of_2_and_4) {
  for (int size = 2; size <= 4; size += 2) {
    int codes[8];
    double t0 = dt_time_now();
    ASSERT_EQ(run_world(size, rank_halving, NULL, NULL, 120, codes), 0);
    for (int r = 0; r < size; r++) ASSERT_EQ(codes[r], 0);
    printf("  world %d: %.2f s\n", size, dt_time_now() - t0);
  }
}

/* A receive raises its socket's SO_RCVLOWAT up to a whole segment; the tiny
 * collectives that follow must lower it again or poll never reports their
 * 32-byte signature. Large and tiny all-reduces alternate, each tiny one
 * with a 2 s deadline, and must finish well within it with the right sum. */
static int rank_lowat(dt_backend *b, int rank, int size, void *arg) {
  ctx_run ctx = {b, 0, rank, size}, *x = &ctx;
  size_t big = ((size_t)3 << 20) / 4 + 5;
  float *a = NULL, one;
  if (dt_alloc(big * 4, (void **)&a) != DT_OK) return 2;
  int fail = 0;
  for (int k = 0; k < 4 && !fail; k++) {
    dt_dtype t = DT_F32;
    size_t count = big;
    for (size_t i = 0; i < big; i++) a[i] = (float)dv_input(rank, i);
    CHECK_RUN(run(x, DT_COLL_ALLREDUCE, a, a, big, t, DT_SUM, 0), "large allreduce");
    fail = compare(x, "allreduce", t, DT_SUM, 1, a, big, 0, want_reduced, 0);
    one = (float)dv_input(rank, 5);
    count = 1;
    dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = ++x->seq, .send = &one, .recv = &one, .count = 1, .dtype = t,
                 .op = DT_SUM, .root = 0, .deadline = dt_time_now() + 2};
    double t0 = dt_time_now();
    CHECK_RUN(dt_backend_run(b, &c), "tiny allreduce after a large one");
    double took = dt_time_now() - t0;
    if (!fail && (one != (float)dv_reference(DT_SUM, size, 5) || took > 1)) {
      fprintf(stderr, "rank %d/%d: tiny allreduce gave %g (want %g) in %.3f s\n", rank, size, one,
              dv_reference(DT_SUM, size, 5), took);
      fail = 1;
    }
  }
  dt_free(a);
  return fail;
}

TEST(tiny_allreduces_after_large_ones_wake_promptly) {
  for (int size = 3; size <= 4; size++) {
    int codes[8];
    ASSERT_EQ(run_world(size, rank_lowat, NULL, NULL, 60, codes), 0);
    for (int r = 0; r < size; r++) ASSERT_EQ(codes[r], 0);
  }
}

/* Tiny all-reduces of 3 and 5 ranks go all-to-all and reduce in rank order: the same bits as shm's
 * ((x0 + x1) + x2) + ..., checked with inputs that round (recursive doubling differs at 5). */
static int rank_tiny_order(dt_backend *b, int rank, int size, void *arg) {
  float v[5], want[5];
  for (int i = 0; i < 5; i++) {
    v[i] = 1.0f / (float)(rank + 3 + i);
    want[i] = 1.0f / (float)(3 + i);
    for (int q = 1; q < size; q++) want[i] += 1.0f / (float)(q + 3 + i);
  }
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = v, .recv = v, .count = 5, .dtype = DT_F32, .op = DT_SUM,
               .root = 0, .deadline = dt_time_now() + 10};
  if (dt_backend_run(b, &c) != DT_OK) return fprintf(stderr, "rank %d: %s\n", rank, dt_last_error()), 1;
  for (int i = 0; i < 5; i++)
    if (memcmp(&v[i], &want[i], sizeof v[i]) != 0) {
      fprintf(stderr, "rank %d/%d: element %d is %.9g, want %.9g (rank order)\n", rank, size, i, v[i], want[i]);
      return 1;
    }
  return 0;
}

TEST(tiny_allreduces_reduce_in_rank_order) {
  for (int size = 3; size <= 5; size += 2) {
    int codes[8];
    ASSERT_EQ(run_world(size, rank_tiny_order, NULL, NULL, 30, codes), 0);
    for (int r = 0; r < size; r++) ASSERT_EQ(codes[r], 0);
  }
}

/* Rank 2 of 5, no ring neighbour of rank 0, brings i32 where the others bring f32, the same bytes: every rank
 * fails promptly and none returns a result. Which check stops a rank varies with timing (the all-to-all's
 * signatures, a neighbour's, or a peer that failed first), so this guards the outcome, not one check. */
static int rank_tiny_mismatch(dt_backend *b, int rank, int size, void *arg) {
  float v[8] = {0};
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = v, .recv = v, .count = 8,
               .dtype = rank == 2 ? DT_I32 : DT_F32, .op = DT_SUM, .root = 0, .deadline = dt_time_now() + 10};
  double t0 = dt_time_now();
  dt_status st = dt_backend_run(b, &c);
  if ((st != DT_MISMATCH && st != DT_PEER_LOST) || dt_time_now() - t0 > 3) {
    fprintf(stderr, "rank %d/%d: expected a mismatch, got %s: %s\n", rank, size, dt_status_name(st), dt_last_error());
    return 1;
  }
  return 0;
}

TEST(a_mismatch_in_a_tiny_allreduce_of_5_fails_every_rank) {
  int codes[8];
  ASSERT_EQ(run_world(5, rank_tiny_mismatch, NULL, NULL, 30, codes), 0);
  for (int r = 0; r < 5; r++) ASSERT_EQ(codes[r], 0);
}

/* Rank 3 of 4 brings a different count to a large all-reduce (one that
 * takes the pairwise exchanges): its neighbours report the mismatch, the
 * others a mismatch or a lost peer, all promptly. */
static int rank_halving_mismatch(dt_backend *b, int rank, int size, void *arg) {
  size_t count = (size_t)1 << 20;
  float *buf = NULL;
  if (dt_alloc(count * 4, (void **)&buf) != DT_OK) return 2;
  memset(buf, 0, count * 4);
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = buf, .recv = buf, .count = rank == 3 ? count / 2 : count,
               .dtype = DT_F32, .op = DT_SUM, .root = 0, .deadline = dt_time_now() + 10};
  double t0 = dt_time_now();
  dt_status st = dt_backend_run(b, &c);
  double took = dt_time_now() - t0;
  dt_free(buf);
  int must_mismatch = rank == 0 || rank == 3;
  if ((must_mismatch ? st != DT_MISMATCH : (st != DT_MISMATCH && st != DT_PEER_LOST)) || took > 3) {
    fprintf(stderr, "rank %d/%d: expected DT_MISMATCH, got %s after %.2f s: %s\n", rank, size, dt_status_name(st),
            took, dt_last_error());
    return 1;
  }
  return 0;
}

TEST(a_mismatch_in_a_large_allreduce_of_4_is_detected) {
  int codes[8];
  ASSERT_EQ(run_world(4, rank_halving_mismatch, NULL, NULL, 30, codes), 0);
  for (int r = 0; r < 4; r++) ASSERT_EQ(codes[r], 0);
}

/* ---- faults --------------------------------------------------------------------- */

#define BIG_COUNT ((size_t)8 << 20) /* 32 MiB of f32: an all-reduce takes long enough to die in */

static void *allreduce_forever(void *arg) {
  dt_backend *b = arg;
  float *buf = NULL;
  if (dt_alloc(BIG_COUNT * 4, (void **)&buf) != DT_OK) return NULL;
  for (uint64_t seq = 1;; seq++) {
    dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = seq, .send = buf, .recv = buf, .count = BIG_COUNT, .dtype = DT_F32,
                 .op = DT_SUM, .root = 0, .deadline = dt_time_now() + 30};
    if (dt_backend_run(b, &c) != DT_OK) break;
  }
  return NULL;
}

static int rank_dies(dt_backend *b, int rank, int size, void *arg) {
  if (rank == 1) { /* dies while an all-reduce runs on another thread */
    pthread_t th;
    pthread_create(&th, NULL, allreduce_forever, b);
    sleep_s(0.3);
    _exit(7);
  }
  float *buf = NULL;
  if (dt_alloc(BIG_COUNT * 4, (void **)&buf) != DT_OK) return 2;
  dt_status st = DT_OK;
  double t_last = dt_time_now();
  for (uint64_t seq = 1; seq < 10000 && st == DT_OK; seq++) {
    dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = seq, .send = buf, .recv = buf, .count = BIG_COUNT, .dtype = DT_F32,
                 .op = DT_SUM, .root = 0, .deadline = dt_time_now() + 30};
    t_last = dt_time_now();
    st = dt_backend_run(b, &c);
  }
  dt_free(buf);
  double waited = dt_time_now() - t_last;
  const char *msg = dt_last_error();
  if (st != DT_PEER_LOST || !strstr(msg, "rank 1 (") || waited > 3) {
    fprintf(stderr, "rank %d: expected DT_PEER_LOST naming rank 1 within 3 s, got %s after %.2f s: %s\n", rank,
            dt_status_name(st), waited, msg);
    return 1;
  }
  return 0;
}

TEST(a_rank_that_exits_mid_allreduce_is_reported_lost) {
  int codes[8];
  ASSERT_EQ(run_world(3, rank_dies, NULL, NULL, 30, codes), 0);
  ASSERT_EQ(codes[0], 0);
  ASSERT_EQ(codes[1], 7);
  ASSERT_EQ(codes[2], 0);
}

static int rank_sleeps(dt_backend *b, int rank, int size, void *arg) {
  float buf[100] = {0};
  if (rank == 1) {
    sleep_s(1.5);
    dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = buf, .recv = buf, .count = 100, .dtype = DT_F32,
                 .op = DT_SUM, .root = 0, .deadline = dt_time_now() + 2};
    double t0 = dt_time_now();
    dt_backend_run(b, &c);
    /* Rank 0 gave up, but its data may already be here: success or failure
     * are both right, as long as this rank does not hang. */
    return dt_time_now() - t0 < 3 ? 0 : 1;
  }
  double t0 = dt_time_now();
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = buf, .recv = buf, .count = 100, .dtype = DT_F32,
               .op = DT_SUM, .root = 0, .deadline = t0 + 0.3};
  dt_status st = dt_backend_run(b, &c);
  double took = dt_time_now() - t0;
  if (st != DT_TIMEOUT || !strstr(dt_last_error(), "rank 1") || took > 1.5) {
    fprintf(stderr, "rank 0: expected DT_TIMEOUT naming rank 1 after 0.3 s, got %s after %.2f s: %s\n",
            dt_status_name(st), took, dt_last_error());
    return 1;
  }
  /* The backend is broken now: the next collective fails at once. */
  c.seq = 2;
  c.deadline = dt_time_now() + 5;
  if (dt_backend_run(b, &c) == DT_OK) return 1;
  return 0;
}

TEST(a_silent_rank_gives_a_timeout_naming_it) {
  int codes[8];
  ASSERT_EQ(run_world(2, rank_sleeps, NULL, NULL, 30, codes), 0);
  ASSERT_EQ(codes[0], 0);
  ASSERT_EQ(codes[1], 0);
}

/* Rank 1 (of 2) or the last rank (of 3) issues a different collective. Of 2, both see the mismatch. Of 3, the
 * all-reduce of 4000 bytes is the tiny all-to-all, every rank a neighbour of every other: which rank reads a
 * signature first and which sees a peer that already failed depends on timing, so a rank may end either way
 * (exit 0: DT_MISMATCH, 10: DT_PEER_LOST), none succeeds or waits out its deadline, and one at least names the
 * mismatch. */
static int rank_mismatch(dt_backend *b, int rank, int size, void *arg) {
  float buf[1000] = {0};
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = buf, .recv = buf, .count = 1000, .dtype = DT_F32,
               .op = DT_SUM, .root = 0, .deadline = dt_time_now() + 10};
  if (size == 2 && rank == 1) c.count = 10;
  if (size == 3 && rank == 2) c.kind = DT_COLL_BROADCAST, c.send = NULL, c.count = 100;
  double t0 = dt_time_now();
  dt_status st = dt_backend_run(b, &c);
  double took = dt_time_now() - t0;
  if ((st != DT_MISMATCH && (size == 2 || st != DT_PEER_LOST)) || took > 3) {
    fprintf(stderr, "rank %d/%d: expected DT_MISMATCH, got %s after %.2f s: %s\n", rank, size, dt_status_name(st),
            took, dt_last_error());
    return 1;
  }
  return st == DT_MISMATCH ? 0 : 10;
}

TEST(a_mismatched_collective_is_detected) {
  for (int size = 2; size <= 3; size++) {
    int codes[8];
    ASSERT_EQ(run_world(size, rank_mismatch, NULL, NULL, 30, codes), 0);
    int named = 0;
    for (int r = 0; r < size; r++) {
      ASSERT(codes[r] == 0 || codes[r] == 10);
      named += codes[r] == 0;
    }
    ASSERT(named >= 1);
  }
}

static void *abort_later(void *arg) {
  sleep_s(0.2);
  dt_backend *b = arg;
  b->ops->abort(b);
  return NULL;
}

static int rank_aborts(dt_backend *b, int rank, int size, void *arg) {
  static float buf[1 << 20];
  if (rank == 1) {
    sleep_s(1.5); /* never joins in time */
    return 0;
  }
  pthread_t th;
  pthread_create(&th, NULL, abort_later, b);
  double t0 = dt_time_now();
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = buf, .recv = buf, .count = 1 << 20, .dtype = DT_F32,
               .op = DT_SUM, .root = 0, .deadline = t0 + 30};
  dt_status st = dt_backend_run(b, &c);
  double took = dt_time_now() - t0;
  pthread_join(th, NULL);
  if (st != DT_INTERRUPTED || took > 0.2 + 0.5) {
    fprintf(stderr, "rank 0: expected DT_INTERRUPTED about 0.2 s in, got %s after %.2f s: %s\n", dt_status_name(st),
            took, dt_last_error());
    return 1;
  }
  return 0;
}

TEST(abort_from_another_thread_interrupts_a_collective) {
  int codes[8];
  ASSERT_EQ(run_world(2, rank_aborts, NULL, NULL, 30, codes), 0);
  ASSERT_EQ(codes[0], 0);
  ASSERT_EQ(codes[1], 0);
}

static uint64_t fnv1a(const char *t) {
  uint64_t h = 1469598103934665603ull;
  for (; *t; t++) h = (h ^ (unsigned char)*t) * 1099511628211ull;
  return h;
}

/* Seconds until the peer closes fd, counting the bytes it sent meanwhile; -1 past limit. */
static double closed_after(int fd, double limit, size_t *got) {
  double t0 = dt_time_now();
  char buf[256];
  *got = 0;
  while (dt_time_now() - t0 < limit) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (k > 0) *got += (size_t)k;
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return dt_time_now() - t0;
  }
  return -1;
}

/* Connects to the listening port of rank 2 while rank 0 is still asleep:
 * one connection sends garbage, one a hello of protocol 1, one a few bytes
 * and then nothing, and one a well-formed hello (right tag, ranks and world:
 * all predictable) whose MAC is made with a wrong secret. Then, once the
 * ranks are connected, the port must be closed. Exit code 0 if all went so. */
static int stranger(const char *prefix) {
  dt_store *s = NULL;
  if (dt_store_connect("127.0.0.1", server_port, "t", TEST_SECRET, 10, &s) != DT_OK) return 3;
  char key[256];
  snprintf(key, sizeof key, "%s/addr/2", prefix);
  void *v = NULL;
  size_t len = 0;
  if (dt_store_get(s, key, &v, &len, 10) != DT_OK) return 4;
  char addr[128] = {0};
  memcpy(addr, v, len < sizeof addr - 1 ? len : sizeof addr - 1);
  dt_free(v);
  char *colon = strrchr(addr, ':');
  int port = atoi(colon + 1);
  int fds[4];
  for (int i = 0; i < 4; i++)
    if (dt_net_connect("127.0.0.1", port, dt_time_now() + 5, NULL, "rank 2", &fds[i]) != DT_OK) return 5;
  const char garbage[] = "GET / HTTP/1.0\r\nHost: example\r\n\r\nmore garbage after the request";
  send(fds[0], garbage, sizeof garbage, MSG_NOSIGNAL);
  struct {
    uint32_t magic, version;
    int32_t from, to, size;
    uint32_t reserved;
    uint64_t tag;
  } hello = {0x50435444u, 1, 0, 2, 3, 0, 12345};
  send(fds[1], &hello, sizeof hello, MSG_NOSIGNAL);
  send(fds[2], "DTC", 3, MSG_NOSIGNAL);
  /* the impostor: protocol 2, everything right but the secret */
  uint8_t first[64], reply[64], mac[32];
  hello.version = 2;
  hello.tag = fnv1a(prefix);
  memcpy(first, &hello, 32);
  memset(first + 32, 0x5a, 32);
  double dl = dt_time_now() + 5;
  if (dt_net_send_all(fds[3], first, 64, dl, NULL, "rank 2") != DT_OK) return 6;
  if (dt_net_recv_all(fds[3], reply, 64, dl, NULL, "rank 2") != DT_OK) return 7; /* its hello and nonce */
  dt_auth_part parts[3] = {{prefix, strlen(prefix)}, {first, 64}, {reply, 64}};
  dt_auth_mac("a-guessed-secret-0123456789abcdef01234567", "dtrain tcp connector", parts, 3, mac);
  if (dt_net_send_all(fds[3], mac, 32, dl, NULL, "rank 2") != DT_OK) return 8;
  size_t got = 0;
  double t = closed_after(fds[3], 3, &got);
  if (t < 0 || got != 0) return 9; /* dropped at once, without a proof of its own */
  sleep_s(2);
  for (int i = 0; i < 4; i++) close(fds[i]);
  /* after setup nobody listens on the data port any more */
  snprintf(key, sizeof key, "%s/allreduced", prefix);
  if (dt_store_get(s, key, &v, &len, 20) != DT_OK) return 10;
  dt_free(v);
  int fd = -1;
  dt_status st = dt_net_connect("127.0.0.1", port, dt_time_now() + 0.5, NULL, "rank 2", &fd);
  dt_net_close(&fd);
  snprintf(key, sizeof key, "%s/checked", prefix);
  dt_store_set(s, key, "1", 1);
  dt_store_close(s);
  return st == DT_OK ? 11 : 0;
}

static int rank_after_stranger(dt_backend *b, int rank, int size, void *arg) {
  int32_t v = rank + 1;
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = &v, .recv = &v, .count = 1, .dtype = DT_I32, .op = DT_SUM,
               .root = 0, .deadline = dt_time_now() + 10};
  dt_status st = dt_backend_run(b, &c);
  if (st != DT_OK || v != 6) {
    fprintf(stderr, "rank %d: allreduce after setup: %s %d %s\n", rank, dt_status_name(st), v, dt_last_error());
    return 1;
  }
  if (rank != 2) return 0;
  /* Stay alive (with the mesh up) until the stranger has looked at our port. */
  char key[200];
  snprintf(key, sizeof key, "%s/allreduced", world_prefix);
  dt_store_set(child_store, key, "1", 1);
  snprintf(key, sizeof key, "%s/checked", world_prefix);
  void *x = NULL;
  size_t n = 0;
  if (dt_store_get(child_store, key, &x, &n, 20) != DT_OK) return 2;
  dt_free(x);
  return 0;
}

TEST(a_stranger_on_the_listening_port_does_not_break_setup) {
  world_opts o = {.late_rank = 0, .late_s = 1.0, .stranger = stranger};
  int codes[8];
  dt_log_level lv = dt_log_get_level();
  dt_log_set_level(DT_LOG_LEVEL_ERROR); /* the refusals are logged as warnings: expected here */
  int rc = run_world(3, rank_after_stranger, NULL, &o, 30, codes);
  dt_log_set_level(lv);
  ASSERT_EQ(rc, 0);
  for (int r = 0; r < 3; r++) ASSERT_EQ(codes[r], 0);
  ASSERT_EQ(codes[3], 0); /* the stranger: refused, and the port closed after setup */
}

static int setup(void) {
  if (df_store_proc_start("t", &server) != 0) return 1;
  server_port = server.port;
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (setup()) return 1;
  static const dt_test_case cases[] = {
      TEST_ENTRY(collectives_match_reference_for_world_sizes_1_to_5),
      TEST_ENTRY(allreduce_by_halving_and_doubling_in_worlds_of_2_and_4),
      TEST_ENTRY(tiny_allreduces_after_large_ones_wake_promptly),
      TEST_ENTRY(tiny_allreduces_reduce_in_rank_order),
      TEST_ENTRY(a_mismatch_in_a_tiny_allreduce_of_5_fails_every_rank),
      TEST_ENTRY(a_mismatch_in_a_large_allreduce_of_4_is_detected),
      TEST_ENTRY(a_rank_that_exits_mid_allreduce_is_reported_lost),
      TEST_ENTRY(a_silent_rank_gives_a_timeout_naming_it),
      TEST_ENTRY(a_mismatched_collective_is_detected),
      TEST_ENTRY(abort_from_another_thread_interrupts_a_collective),
      TEST_ENTRY(a_stranger_on_the_listening_port_does_not_break_setup),
  };
  int rc = dt_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
  df_store_proc_stop(&server);
  return rc;
}

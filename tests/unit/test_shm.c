/* Tests of the shared-memory backend: every collective x dtype x op against a
 * reference, in place and out of place, world sizes 1..5 (forked ranks, one
 * store served by a helper process); then faults: a rank that exits, one that stops,
 * a mismatched collective, an abort from another thread, a setup timeout; a rank
 * that leaves right after setup; and no segment left in /dev/shm afterwards. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist-impl.h"
#include "dist_fork.h"
#include "dist_values.h"
#include "harness.h"

static int server_port; /* the store, served by a helper process (dist_fork.h) */
static char job_tag[64];
static int run_counter;

/* ---- forked worlds ------------------------------------------------------------ */

typedef int (*rank_fn)(dt_backend *b, int rank, int size, void *arg);

typedef struct world_opts {
  double setup_timeout_s;
  int absent_rank; /* this rank never starts (setup timeout test); -1: none */
  int hold_first_ms; /* > 0: rank 1 stops rank 0 this long before its own setup (hold_first) */
} world_opts;

/* Rank 1 stops rank 0 for ms once rank 0 has made the segment (its name is in the store) and 20 ms more, by which
 * rank 0 has counted itself mapped and waits for rank 1 to map it too; a grandchild resumes it. */
static int hold_first(dt_store *store, const char *prefix, pid_t first, int ms) {
  char key[256];
  void *val = NULL;
  size_t len = 0;
  snprintf(key, sizeof key, "%s/shm/segment", prefix);
  if (first <= 0 || dt_store_get(store, key, &val, &len, 20) != DT_OK) return 91;
  dt_free(val);
  nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
  kill(first, SIGSTOP);
  if (fork() == 0) {
    nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000}, NULL);
    kill(first, SIGCONT);
    _exit(0);
  }
  return 0;
}

static int child_main(int rank, int size, const char *prefix, const world_opts *o, pid_t first, rank_fn fn,
                      void *arg) {
  alarm(60); /* a hung rank dies instead of hanging the test */
  dt_store *store = NULL;
  dt_status st = dt_store_connect("127.0.0.1", server_port, "t", TEST_SECRET, 10, &store);
  if (st != DT_OK) {
    fprintf(stderr, "rank %d: store connect: %s %s\n", rank, dt_status_name(st), dt_last_error());
    return 90;
  }
  if (rank == 1 && o->hold_first_ms > 0 && hold_first(store, prefix, first, o->hold_first_ms) != 0) {
    fprintf(stderr, "rank 1: no segment of rank 0's to wait for: %s\n", dt_last_error());
    dt_store_close(store);
    return 91;
  }
  int global[8];
  for (int i = 0; i < size; i++) global[i] = i;
  dt_backend_ctx ctx = {.store = store, .prefix = prefix, .job_tag = job_tag, .rank = rank, .size = size,
                        .global = global, .timeout_s = o->setup_timeout_s, .host_addr = "127.0.0.1"};
  dt_backend *b = NULL;
  st = dt_backend_shm_new(&ctx, &b);
  int code;
  if (st != DT_OK) {
    fprintf(stderr, "rank %d: shm setup: %s %s\n", rank, dt_status_name(st), dt_last_error());
    code = 100 + (int)st;
  } else {
    code = fn(b, rank, size, arg);
    b->ops->destroy(b);
  }
  dt_store_close(store);
  return code;
}

/* Forks size ranks running fn; codes[r] receives each exit code (or 200 +
 * signal). Kills everything if the world takes longer than 60 s. */
static int run_world(int size, rank_fn fn, void *arg, const world_opts *opts, int *codes) {
  world_opts def = {.setup_timeout_s = 20, .absent_rank = -1};
  const world_opts *o = opts ? opts : &def;
  char prefix[128];
  snprintf(prefix, sizeof prefix, "test/%d/%d/shm", (int)getpid(), run_counter++);
  pid_t pids[8] = {0};
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < size; r++) {
    if (r == o->absent_rank) continue;
    pids[r] = fork();
    if (pids[r] < 0) return -1;
    if (pids[r] == 0) _exit(child_main(r, size, prefix, o, pids[0], fn, arg));
  }
  double deadline = dt_time_now() + 60;
  int left = size - (o->absent_rank >= 0);
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < size; r++)
        if (pids[r] == p) {
          codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
          pids[r] = 0;
          left--;
        }
      continue;
    }
    if (dt_time_now() > deadline) {
      for (int r = 0; r < size; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL), waitpid(pids[r], NULL, 0), codes[r] = 255;
      return -1;
    }
    nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
  }
  return 0;
}

/* Number of /dev/shm entries of this test process's segments. */
static int shm_leftovers(void) {
  char want[96];
  snprintf(want, sizeof want, "dt-%s-", job_tag);
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, want, strlen(want)) == 0) n++;
  closedir(d);
  return n;
}

/* ---- data --------------------------------------------------------------------- */

static uint64_t seq_counter;

static dt_status run_coll(dt_backend *b, dt_coll_kind kind, const void *send, void *recv, size_t count,
                          dt_dtype t, dt_redop op, int root, double timeout_s) {
  dt_coll c = {.kind = kind, .seq = ++seq_counter, .send = send, .recv = recv, .count = count, .dtype = t,
               .op = op, .root = root, .deadline = dt_time_now() + timeout_s};
  return dt_backend_run(b, &c);
}

#define CHILD_CHECK(cond, ...)                                                                \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);                          \
      fprintf(stderr, __VA_ARGS__);                                                           \
      fprintf(stderr, "\n");                                                                  \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)
#define CHILD_OK(expr)                                                                        \
  do {                                                                                        \
    dt_status s_ = (expr);                                                                    \
    CHILD_CHECK(s_ == DT_OK, "%s -> %s: %s", #expr, dt_status_name(s_), dt_last_error());     \
  } while (0)

/* One collective of count elements checked against the reference. */
static int check_one(dt_backend *b, int rank, int size, dt_coll_kind kind, dt_dtype t, dt_redop op,
                     size_t count, int in_place, int root) {
  size_t es = dt_dtype_size(t), off, len;
  dt_block_of(count, size, rank, &off, &len);
  char *send = malloc((count + 1) * es), *recv = malloc((count + 1) * es);
  CHILD_CHECK(send && recv, "out of memory");
  for (size_t i = 0; i < count; i++) dv_put(send, t, i, dv_input(rank, i)), dv_put(recv, t, i, -99);
  const void *sp = send;
  void *rp = recv;
  size_t check_off = 0, check_len = count;
  switch (kind) {
  case DT_COLL_ALLREDUCE:
    if (in_place) sp = rp = send;
    break;
  case DT_COLL_BROADCAST:
    sp = NULL;
    rp = rank == root ? send : recv;
    if (rank != root)
      for (size_t i = 0; i < count; i++) dv_put(recv, t, i, -99);
    break;
  case DT_COLL_ALLGATHER:
    if (in_place) {
      for (size_t i = 0; i < len; i++) dv_put(recv, t, off + i, dv_input(rank, off + i));
      sp = recv + off * es;
    } else {
      for (size_t i = 0; i < len; i++) dv_put(send, t, i, dv_input(rank, off + i));
    }
    break;
  case DT_COLL_REDUCE_SCATTER:
    if (in_place) rp = send + off * es;
    check_off = off, check_len = len;
    break;
  default: break;
  }
  dt_status st = run_coll(b, kind, sp, rp, count, t, op, root, 30);
  int bad = 0;
  if (st == DT_OK) {
    const char *out = kind == DT_COLL_ALLREDUCE && in_place ? send : kind == DT_COLL_BROADCAST ? rp : recv;
    if (kind == DT_COLL_REDUCE_SCATTER) out = rp;
    for (size_t i = 0; i < check_len && !bad; i++) {
      size_t g = check_off + i;
      double want = kind == DT_COLL_ALLREDUCE || kind == DT_COLL_REDUCE_SCATTER ? dv_reference(op, size, g)
                    : kind == DT_COLL_BROADCAST                                 ? dv_input(root, g)
                                                                                : 0;
      if (kind == DT_COLL_ALLGATHER) {
        int owner = 0;
        for (int r = 0; r < size; r++) {
          size_t o2, l2;
          dt_block_of(count, size, r, &o2, &l2);
          if (g >= o2 && g < o2 + l2) owner = r;
        }
        want = dv_input(owner, g);
      }
      double got = dv_get(out, t, i);
      if (got != want) {
        fprintf(stderr, "rank %d: %s %s %s count %zu%s root %d: element %zu is %g, expected %g\n", rank,
                dt_coll_name(kind), dt_dtype_name(t), dt_redop_name(op), count, in_place ? " in place" : "", root,
                g, got, want);
        bad = 1;
      }
    }
  }
  free(send);
  free(recv);
  CHILD_CHECK(st == DT_OK, "%s %s count %zu: %s %s", dt_coll_name(kind), dt_dtype_name(t), count,
              dt_status_name(st), dt_last_error());
  return bad;
}

static int rank_matrix(dt_backend *b, int rank, int size, void *arg) {
  static const dt_dtype types[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64};
  static const dt_redop ops[] = {DT_SUM, DT_MIN, DT_MAX};
  static const size_t counts[] = {0, 1, 7, 1000};
  /* Past setup on every rank, rank 0 has unlinked the segment name. */
  CHILD_OK(run_coll(b, DT_COLL_BARRIER, NULL, NULL, 0, DT_F32, DT_SUM, 0, 30));
  CHILD_CHECK(shm_leftovers() == 0, "segment still has a name in /dev/shm after setup");
  int root = 0;
  for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
      for (int ip = 0; ip < 2; ip++) {
        for (size_t oi = 0; oi < sizeof ops / sizeof *ops; oi++) {
          if (check_one(b, rank, size, DT_COLL_ALLREDUCE, types[ti], ops[oi], counts[ci], ip, 0)) return 1;
          if (check_one(b, rank, size, DT_COLL_REDUCE_SCATTER, types[ti], ops[oi], counts[ci], ip, 0)) return 1;
        }
        if (check_one(b, rank, size, DT_COLL_ALLGATHER, types[ti], DT_SUM, counts[ci], ip, 0)) return 1;
        if (check_one(b, rank, size, DT_COLL_BROADCAST, types[ti], DT_SUM, counts[ci], 0, root)) return 1;
        root = (root + 1) % size;
        CHILD_OK(run_coll(b, DT_COLL_BARRIER, NULL, NULL, 0, DT_F32, DT_SUM, 0, 30));
      }
  /* Several MiB, odd count: many pipeline chunks and a ragged last one. */
  size_t big = (size_t)(3u << 20) / 2 + 13; /* f32: ~6 MiB */
  for (int ip = 0; ip < 2; ip++) {
    if (check_one(b, rank, size, DT_COLL_ALLREDUCE, DT_F32, DT_SUM, big, ip, 0)) return 1;
    if (check_one(b, rank, size, DT_COLL_REDUCE_SCATTER, DT_F32, DT_MAX, big, ip, 0)) return 1;
    if (check_one(b, rank, size, DT_COLL_ALLGATHER, DT_F32, DT_SUM, big, ip, 0)) return 1;
  }
  if (check_one(b, rank, size, DT_COLL_BROADCAST, DT_F32, DT_SUM, big, 0, size - 1)) return 1;
  if (check_one(b, rank, size, DT_COLL_ALLREDUCE, DT_BF16, DT_SUM, big + 1, 1, 0)) return 1;
  return 0;
}

static int matrix_for_size(int size, int *failed_rank) {
  int codes[8] = {0};
  if (run_world(size, rank_matrix, NULL, NULL, codes) != 0) return -1;
  for (int r = 0; r < size; r++)
    if (codes[r] != 0) {
      *failed_rank = r;
      return codes[r];
    }
  return 0;
}

TEST(collectives_match_reference_world_1_to_5) {
  for (int size = 1; size <= 5; size++) {
    int failed_rank = -1, code = matrix_for_size(size, &failed_rank);
    if (code != 0) FAIL_("world size %d: rank %d exited with %d", size, failed_rank, code);
  }
  ASSERT_EQ(shm_leftovers(), 0);
}

/* ---- faults ------------------------------------------------------------------- */

/* Rank 2 exits after the first barrier; the others, waiting in an allreduce,
 * must report it within a few seconds (not at the 30 s deadline). */
static int rank_exits(dt_backend *b, int rank, int size, void *arg) {
  float buf[1024] = {0};
  CHILD_OK(run_coll(b, DT_COLL_BARRIER, NULL, NULL, 0, DT_F32, DT_SUM, 0, 30));
  if (rank == 2) _exit(0);
  double t0 = dt_time_now();
  dt_status st = run_coll(b, DT_COLL_ALLREDUCE, buf, buf, 1024, DT_F32, DT_SUM, 0, 30);
  double dt = dt_time_now() - t0;
  CHILD_CHECK(st == DT_PEER_LOST, "got %s (%s)", dt_status_name(st), dt_last_error());
  CHILD_CHECK(strstr(dt_last_error(), "rank 2") != NULL, "detail does not name rank 2: %s", dt_last_error());
  CHILD_CHECK(dt < 3, "took %.2f s to notice", dt);
  /* The backend is broken from now on: no hang, an error at once. */
  st = run_coll(b, DT_COLL_BARRIER, NULL, NULL, 0, DT_F32, DT_SUM, 0, 30);
  CHILD_CHECK(st == DT_PEER_LOST, "after the loss: %s", dt_status_name(st));
  return 0;
}

TEST(exited_rank_is_peer_lost) {
  int codes[8] = {0};
  ASSERT_EQ(run_world(3, rank_exits, NULL, NULL, codes), 0);
  for (int r = 0; r < 3; r++) ASSERT_EQ(codes[r], 0);
  ASSERT_EQ(shm_leftovers(), 0);
}

/* A peer dies while large allreduces are in flight (the others are
 * mid-pipeline): rank 1 runs them in a thread and its main thread exits. */
typedef struct loop_arg {
  dt_backend *b;
  float *buf;
  size_t n;
} loop_arg;

static void *allreduce_forever(void *p) {
  loop_arg *a = p;
  while (run_coll(a->b, DT_COLL_ALLREDUCE, a->buf, a->buf, a->n, DT_F32, DT_SUM, 0, 30) == DT_OK) {
  }
  return NULL;
}

static int rank_exits_mid_pipeline(dt_backend *b, int rank, int size, void *arg) {
  size_t n = 4u << 20; /* 16 MiB: tens of pipeline chunks */
  float *buf = calloc(n, sizeof *buf);
  CHILD_CHECK(buf, "out of memory");
  if (rank == 1) {
    loop_arg a = {b, buf, n};
    pthread_t th;
    CHILD_CHECK(pthread_create(&th, NULL, allreduce_forever, &a) == 0, "pthread_create");
    nanosleep(&(struct timespec){.tv_nsec = 30000000}, NULL);
    _exit(0);
  }
  dt_status st = DT_OK;
  double t0 = dt_time_now();
  for (int i = 0; i < 1000 && st == DT_OK; i++) {
    t0 = dt_time_now();
    st = run_coll(b, DT_COLL_ALLREDUCE, buf, buf, n, DT_F32, DT_SUM, 0, 30);
  }
  double dt = dt_time_now() - t0;
  free(buf);
  CHILD_CHECK(st == DT_PEER_LOST, "got %s (%s)", dt_status_name(st), dt_last_error());
  CHILD_CHECK(strstr(dt_last_error(), "rank 1") != NULL, "detail does not name rank 1: %s", dt_last_error());
  CHILD_CHECK(dt < 3, "took %.2f s to notice", dt);
  return 0;
}

TEST(rank_lost_mid_pipeline_is_peer_lost) {
  int codes[8] = {0};
  ASSERT_EQ(run_world(3, rank_exits_mid_pipeline, NULL, NULL, codes), 0);
  for (int r = 0; r < 3; r++) ASSERT_EQ(codes[r], 0);
}

/* Rank 1 stops answering (sleeps); rank 0 times out naming it. */
static int rank_stops(dt_backend *b, int rank, int size, void *arg) {
  if (rank == 1) {
    sleep(2);
    return 0;
  }
  double t0 = dt_time_now();
  dt_status st = run_coll(b, DT_COLL_ALLREDUCE, (float[4]){0}, (float[4]){0}, 4, DT_F32, DT_SUM, 0, 0.3);
  double dt = dt_time_now() - t0;
  CHILD_CHECK(st == DT_TIMEOUT, "got %s (%s)", dt_status_name(st), dt_last_error());
  CHILD_CHECK(strstr(dt_last_error(), "rank 1 did not arrive at allreduce") != NULL, "detail: %s",
              dt_last_error());
  CHILD_CHECK(dt >= 0.25 && dt < 1.5, "timed out after %.2f s (deadline 0.3 s)", dt);
  return 0;
}

TEST(silent_rank_times_out) {
  int codes[8] = {0};
  ASSERT_EQ(run_world(2, rank_stops, NULL, NULL, codes), 0);
  ASSERT_EQ(codes[0], 0);
  ASSERT_EQ(codes[1], 0);
}

/* Rank 1 issues a broadcast where the others issue an allreduce. */
static int rank_mismatch(dt_backend *b, int rank, int size, void *arg) {
  float buf[1000] = {0};
  dt_status st = rank == 1 ? run_coll(b, DT_COLL_BROADCAST, NULL, buf, 10, DT_F32, DT_SUM, 0, 10)
                           : run_coll(b, DT_COLL_ALLREDUCE, buf, buf, 1000, DT_F32, DT_SUM, 0, 10);
  CHILD_CHECK(st == DT_MISMATCH, "got %s (%s)", dt_status_name(st), dt_last_error());
  CHILD_CHECK(strstr(dt_last_error(), "rank") != NULL, "detail: %s", dt_last_error());
  return 0;
}

TEST(mismatched_collective_is_detected) {
  int codes[8] = {0};
  ASSERT_EQ(run_world(3, rank_mismatch, NULL, NULL, codes), 0);
  for (int r = 0; r < 3; r++) ASSERT_EQ(codes[r], 0);
}

static void *abort_later(void *arg) {
  nanosleep(&(struct timespec){.tv_nsec = 150000000}, NULL);
  dt_backend *b = arg;
  b->ops->abort(b);
  return NULL;
}

/* Rank 0 is blocked (rank 1 is late) when another thread aborts it: it returns
 * DT_INTERRUPTED promptly; rank 1 then learns that rank 0 left. */
static int rank_abort(dt_backend *b, int rank, int size, void *arg) {
  float buf[16] = {0};
  if (rank == 0) {
    pthread_t th;
    CHILD_CHECK(pthread_create(&th, NULL, abort_later, b) == 0, "pthread_create");
    double t0 = dt_time_now();
    dt_status st = run_coll(b, DT_COLL_ALLREDUCE, buf, buf, 16, DT_F32, DT_SUM, 0, 30);
    double dt = dt_time_now() - t0;
    pthread_join(th, NULL);
    CHILD_CHECK(st == DT_INTERRUPTED, "got %s (%s)", dt_status_name(st), dt_last_error());
    CHILD_CHECK(dt < 1, "abort took %.2f s", dt);
    sleep(1); /* stay alive: rank 1 must learn of the abort from the segment */
    return 0;
  }
  nanosleep(&(struct timespec){.tv_nsec = 400000000}, NULL);
  double t0 = dt_time_now();
  /* Rank 0 had published its data before it was aborted, so this one may
   * still complete; the next one cannot. */
  dt_status st = run_coll(b, DT_COLL_ALLREDUCE, buf, buf, 16, DT_F32, DT_SUM, 0, 30);
  if (st == DT_OK) st = run_coll(b, DT_COLL_BARRIER, NULL, NULL, 0, DT_F32, DT_SUM, 0, 30);
  CHILD_CHECK(st == DT_PEER_LOST, "got %s (%s)", dt_status_name(st), dt_last_error());
  CHILD_CHECK(strstr(dt_last_error(), "rank 0") != NULL, "detail: %s", dt_last_error());
  CHILD_CHECK(dt_time_now() - t0 < 0.5, "took %.2f s", dt_time_now() - t0);
  return 0;
}

TEST(abort_from_another_thread_interrupts) {
  int codes[8] = {0};
  ASSERT_EQ(run_world(2, rank_abort, NULL, NULL, codes), 0);
  ASSERT_EQ(codes[0], 0);
  ASSERT_EQ(codes[1], 0);
}

/* Rank 1 never starts: rank 0's setup times out and removes the segment. */
static int rank_never_runs(dt_backend *b, int rank, int size, void *arg) { return 1; }

TEST(setup_timeout_leaves_nothing_behind) {
  int codes[8] = {0};
  world_opts o = {.setup_timeout_s = 0.5, .absent_rank = 1};
  ASSERT_EQ(run_world(2, rank_never_runs, NULL, &o, codes), 0);
  ASSERT_EQ(codes[0], 100 + DT_TIMEOUT);
  ASSERT_EQ(shm_leftovers(), 0);
}

/* A rank may leave the moment its setup returns: its peers' setups still succeed. Rank 0 is stopped for 200 ms
 * while it waits for rank 1 to map the segment; rank 1 maps it, returns and exits, so rank 0 goes on with the rest
 * of its setup only after rank 1 could have gone (before setup ended with a sync, rank 0 then failed: "rank 1
 * exited during setup"). */
static int rank_leaves(dt_backend *b, int rank, int size, void *arg) { return 0; }

TEST(rank_leaving_right_after_setup_is_no_loss) {
  for (int round = 0; round < 2; round++) {
    int codes[8] = {0};
    world_opts o = {.setup_timeout_s = 20, .absent_rank = -1, .hold_first_ms = 200};
    ASSERT_EQ(run_world(2, rank_leaves, NULL, &o, codes), 0);
    ASSERT_EQ(codes[0], 0);
    ASSERT_EQ(codes[1], 0);
  }
  ASSERT_EQ(shm_leftovers(), 0);
}

/* Two jobs on one host with the same job tag and store prefix (two jobs
 * launched without a run id, both "default"): the second job's rank 0 must not
 * take over the first job's segment while the first job is still setting up,
 * and neither job's ranks may end up in the other's segment. */
static int collision_rank(int port, const char *prefix, int rank, float value) {
  alarm(60);
  dt_store *store = NULL;
  if (dt_store_connect("127.0.0.1", port, "t", TEST_SECRET, 10, &store) != DT_OK) return 90;
  int global[2] = {0, 1};
  dt_backend_ctx ctx = {.store = store, .prefix = prefix, .job_tag = job_tag, .rank = rank, .size = 2,
                        .global = global, .timeout_s = 3, .host_addr = "127.0.0.1"};
  dt_backend *b = NULL;
  dt_status st = dt_backend_shm_new(&ctx, &b);
  if (st != DT_OK) {
    fprintf(stderr, "job %g rank %d: shm setup: %s %s\n", value, rank, dt_status_name(st), dt_last_error());
    dt_store_close(store);
    return 100 + (int)st;
  }
  float x[64];
  for (int i = 0; i < 64; i++) x[i] = value;
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .seq = 1, .send = x, .recv = x, .count = 64, .dtype = DT_F32,
               .op = DT_SUM, .deadline = dt_time_now() + 5};
  st = dt_backend_run(b, &c);
  int code = 0;
  if (st != DT_OK) {
    fprintf(stderr, "job %g rank %d: allreduce: %s %s\n", value, rank, dt_status_name(st), dt_last_error());
    code = 100 + (int)st;
  } else {
    for (int i = 0; i < 64 && !code; i++)
      if (x[i] != 2 * value) {
        fprintf(stderr, "job %g rank %d: element %d is %g, expected %g (another job's data)\n", value, rank, i,
                x[i], 2 * value);
        code = 1;
      }
  }
  b->ops->destroy(b);
  dt_store_close(store);
  return code;
}

/* Waits (up to 10 s) until key exists in the store at port. */
static int key_appears(int port, const char *key) {
  dt_store *s = NULL;
  if (dt_store_connect("127.0.0.1", port, "t", TEST_SECRET, 10, &s) != DT_OK) return 0;
  dt_status st = dt_store_wait(s, &key, 1, 10);
  dt_store_close(s);
  return st == DT_OK;
}

TEST(two_jobs_with_the_same_tag_keep_their_own_segments) {
  df_store_proc other;
  ASSERT_EQ(df_store_proc_start("t", &other), 0);
  int ports[2] = {server_port, other.port};
  char prefix[128], key[160];
  snprintf(prefix, sizeof prefix, "test/%d/collide/shm", (int)getpid());
  snprintf(key, sizeof key, "%s/shm/segment", prefix);
  pid_t pids[4]; /* job 0 rank 0, job 1 rank 0, job 0 rank 1, job 1 rank 1 */
  int n = 0, ok = 1;
  fflush(stdout);
  fflush(stderr);
  /* Rank 0 of each job creates its segment (and waits for its rank 1), one after the other. */
  for (int job = 0; job < 2 && ok; job++) {
    pid_t p = fork();
    if (p == 0) _exit(collision_rank(ports[job], prefix, 0, job ? 100.0f : 1.0f));
    pids[n++] = p;
    ok = key_appears(ports[job], key);
  }
  for (int job = 0; job < 2 && ok; job++) {
    pid_t p = fork();
    if (p == 0) _exit(collision_rank(ports[job], prefix, 1, job ? 100.0f : 1.0f));
    pids[n++] = p;
  }
  int codes[4] = {-1, -1, -1, -1};
  for (int i = 0; i < n; i++) {
    int status;
    waitpid(pids[i], &status, 0); /* each child has alarm(60) */
    codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
  }
  df_store_proc_stop(&other);
  ASSERT(ok);
  for (int i = 0; i < 4; i++) ASSERT_EQ(codes[i], 0);
  ASSERT_EQ(shm_leftovers(), 0);
}

/* ---- main ---------------------------------------------------------------------- */

static const dt_test_case cases[] = {
    TEST_ENTRY(collectives_match_reference_world_1_to_5),
    TEST_ENTRY(exited_rank_is_peer_lost),
    TEST_ENTRY(rank_lost_mid_pipeline_is_peer_lost),
    TEST_ENTRY(silent_rank_times_out),
    TEST_ENTRY(mismatched_collective_is_detected),
    TEST_ENTRY(abort_from_another_thread_interrupts),
    TEST_ENTRY(setup_timeout_leaves_nothing_behind),
    TEST_ENTRY(rank_leaving_right_after_setup_is_no_loss),
    TEST_ENTRY(two_jobs_with_the_same_tag_keep_their_own_segments),
};

int main(int argc, char **argv) {
  snprintf(job_tag, sizeof job_tag, "test%d", (int)getpid());
  df_store_proc store;
  if (df_store_proc_start("t", &store) != 0) return 1;
  server_port = store.port;
  int rc = dt_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
  df_store_proc_stop(&store);
  if (shm_leftovers() != 0) {
    fprintf(stderr, "segments of this test remain in /dev/shm\n");
    rc = 1;
  }
  return rc;
}

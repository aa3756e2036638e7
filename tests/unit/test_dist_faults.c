/* Failures of the distributed runtime become errors, never hangs: a rank
 * killed mid all-reduce (DT_PEER_LOST naming it within seconds), a stopped
 * rank (DT_TIMEOUT), mismatched collectives (DT_MISMATCH), abort, a broken
 * group, strangers at the store, a port in use, an unreachable master,
 * disagreeing world sizes and duplicate ranks; no /dev/shm leftovers. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "dist_fork.h"
#include "harness.h"

#define RUN_ID "faults"

typedef struct outcome {
  int status; /* dt_status of the first failure, -1 if none */
  double when; /* CLOCK_MONOTONIC seconds at the failure */
  char msg[512];
} outcome;

static outcome *shared; /* one per rank, shared with the children */
static int next_round;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void record(int r, dt_status s) {
  shared[r].status = (int)s;
  shared[r].when = now_s();
  snprintf(shared[r].msg, sizeof shared[r].msg, "%s", dt_last_error());
}

static df_job job(const char *backend, double timeout_s) {
  for (int r = 0; r < DF_MAX_WORLD; r++) shared[r].status = -1, shared[r].msg[0] = '\0';
  df_job j = {.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = backend,
              .timeout_s = timeout_s};
  return j;
}

/* Large all-reduces until something fails; exits 0 after recording it. */
static int loop_child(df_job *j, int r, int world, void *arg) {
  size_t count = *(size_t *)arg;
  dt_group *g;
  dt_status s = df_join(j, r, world, &g);
  if (s != DT_OK) {
    record(r, s);
    return 2;
  }
  float *buf = calloc(count, sizeof *buf);
  double until = now_s() + 40;
  while (now_s() < until) {
    s = dt_allreduce(g, buf, buf, count, DT_F32, DT_SUM, NULL);
    if (s != DT_OK) break;
  }
  record(r, s);
  /* After a failure the group is broken: the next collective fails at once. */
  if (s != DT_OK) {
    double t0 = now_s();
    dt_status again = dt_allreduce(g, buf, buf, 1, DT_F32, DT_SUM, NULL);
    if (again != s || now_s() - t0 > 1.0 || !strstr(dt_last_error(), "failed earlier")) return 3;
  }
  dt_group_destroy(g);
  free(buf);
  return 0;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static void kill_mid_allreduce(int *dt_test_failed_, const char *backend) {
  df_job j = job(backend, 60);
  size_t count = 4u << 20; /* 16 MiB of f32 */
  df_spawn(&j, 3, loop_child, &count);
  sleep_s(1.5);
  double t_kill = now_s();
  kill(j.pids[2], SIGKILL);
  df_wait(&j, 3, 60);
  for (int r = 0; r < 2; r++) {
    ASSERT_MSG(shared[r].status == (int)DT_PEER_LOST, shared[r].msg);
    ASSERT_MSG(strstr(shared[r].msg, "rank 2") != NULL, shared[r].msg);
    ASSERT_MSG(strstr(shared[r].msg, "allreduce #") != NULL, shared[r].msg);
    ASSERT(shared[r].when - t_kill < 10.0);
    ASSERT(WIFEXITED(j.status[r]) && WEXITSTATUS(j.status[r]) == 0);
  }
}

TEST(shm_rank_killed_mid_allreduce_is_named_within_seconds) { kill_mid_allreduce(dt_test_failed_, "shm"); }
TEST(tcp_rank_killed_mid_allreduce_is_named_within_seconds) { kill_mid_allreduce(dt_test_failed_, "tcp"); }

static void stopped_rank_times_out(int *dt_test_failed_, const char *backend) {
  df_job j = job(backend, 2.0);
  size_t count = 1000;
  df_spawn(&j, 3, loop_child, &count);
  sleep_s(1.0);
  double t_stop = now_s();
  kill(j.pids[1], SIGSTOP);
  /* The others fail; then release the stopped one (it fails too). */
  sleep_s(5.0);
  kill(j.pids[1], SIGKILL);
  kill(j.pids[1], SIGCONT);
  df_wait(&j, 3, 60);
  /* A rank times out; the other does too, or, where the first gave up and closed its connection before the
   * other's own deadline, loses that peer and names the group's first failure (group.c's note_failure). */
  int names_rank1 = 0, timeouts = 0;
  for (int r = 0; r < 3; r += 2) {
    const int lost = shared[r].status == (int)DT_PEER_LOST;
    ASSERT_MSG(shared[r].status == (int)DT_TIMEOUT || lost, shared[r].msg);
    ASSERT_MSG(!lost || strstr(shared[r].msg, "first failure in the group"), shared[r].msg);
    ASSERT(shared[r].when - t_stop < 5.0);
    timeouts += !lost;
    names_rank1 |= strstr(shared[r].msg, "rank 1") != NULL;
  }
  ASSERT(timeouts >= 1);
  ASSERT_MSG(names_rank1, shared[0].msg);
}

TEST(shm_stopped_rank_gives_timeout) { stopped_rank_times_out(dt_test_failed_, "shm"); }
TEST(tcp_stopped_rank_gives_timeout) { stopped_rank_times_out(dt_test_failed_, "tcp"); }

/* Rank 1 issues a different collective than rank 0 at the same point. */
static int mismatch_child(df_job *j, int r, int world, void *arg) {
  int variant = *(int *)arg;
  dt_group *g;
  if (df_join(j, r, world, &g) != DT_OK) return 2;
  float x[16] = {0};
  dt_status s = dt_allreduce(g, x, x, 16, DT_F32, DT_SUM, NULL); /* agree first */
  if (s != DT_OK) return 3;
  if (r == 0 || variant == 0)
    s = dt_allreduce(g, x, x, r == 0 ? 10 : 11, DT_F32, DT_SUM, NULL);
  else
    s = dt_broadcast(g, x, 10, DT_F32, 0, NULL);
  record(r, s);
  dt_group_destroy(g);
  return 0;
}

static void mismatch(int *dt_test_failed_, const char *backend, int variant) {
  df_job j = job(backend, 10);
  ASSERT_EQ(df_run(&j, 2, mismatch_child, &variant), 0);
  for (int r = 0; r < 2; r++) {
    ASSERT_MSG(shared[r].status == (int)DT_MISMATCH, shared[r].msg);
    ASSERT_MSG(strstr(shared[r].msg, "#2") != NULL, shared[r].msg);
  }
}

TEST(shm_mismatched_collectives_are_reported) {
  mismatch(dt_test_failed_, "shm", 0);
  mismatch(dt_test_failed_, "shm", 1);
}
TEST(tcp_mismatched_collectives_are_reported) {
  mismatch(dt_test_failed_, "tcp", 0);
  mismatch(dt_test_failed_, "tcp", 1);
}

/* Rank 0 waits for a rank that sleeps; another thread aborts the group. */
static void *aborter(void *g) {
  sleep_s(0.5);
  dt_group_abort(g);
  return NULL;
}

static int abort_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g;
  if (df_join(j, r, world, &g) != DT_OK) return 2;
  float x[4] = {0};
  if (r == 1) {
    sleep_s(3.0);
    _exit(0);
  }
  pthread_t t;
  pthread_create(&t, NULL, aborter, g);
  double t0 = now_s();
  dt_status s = dt_allreduce(g, x, x, 4, DT_F32, DT_SUM, NULL);
  record(r, s);
  pthread_join(t, NULL);
  if (now_s() - t0 > 2.0) return 3;
  dt_group_destroy(g);
  return 0;
}

TEST(abort_interrupts_a_waiting_collective) {
  const char *backends[] = {"shm", "tcp"};
  for (int b = 0; b < 2; b++) {
    df_job j = job(backends[b], 30);
    ASSERT_EQ(df_run(&j, 2, abort_child, NULL), 0);
    ASSERT_MSG(shared[0].status == (int)DT_INTERRUPTED, shared[0].msg);
  }
}

/* Strangers at the store while a job runs: garbage bytes, a client of another
 * run; both refused, the job finishes. */
static int busy_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g;
  if (df_join(j, r, world, &g) != DT_OK) return 2;
  float x[256];
  for (int k = 0; k < 300; k++) {
    for (int i = 0; i < 256; i++) x[i] = (float)(r + k);
    if (dt_allreduce(g, x, x, 256, DT_F32, DT_SUM, NULL) != DT_OK) return 3;
    if (x[7] != (float)(2 * k + 1)) return 4;
    sleep_s(0.005);
  }
  dt_group_destroy(g);
  return 0;
}

TEST(strangers_at_the_store_do_not_disturb_the_job) {
  df_job j = job("tcp", 30);
  df_spawn(&j, 2, busy_child, NULL);
  sleep_s(0.3);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)j.port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  const char garbage[] = "GET / HTTP/1.0\r\n\r\n\xff\xff\xff\xff\x00\x01";
  ASSERT(send(fd, garbage, sizeof garbage, MSG_NOSIGNAL) > 0);
  dt_store *other;
  ASSERT_EQ(dt_store_connect("127.0.0.1", j.port, "another-job", TEST_SECRET, 2.0, &other), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "another-job") != NULL, dt_last_error());
  ASSERT_EQ(dt_store_connect("127.0.0.1", j.port, j.run_id, "not-the-secret-0123456789abcdef0123", 2.0, &other),
            DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "job secret") != NULL, dt_last_error());
  ASSERT_EQ(df_wait(&j, 2, 60), 0);
  close(fd);
}

TEST(port_in_use_is_a_clear_error) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t al = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &al);
  int port = ntohs(a.sin_port);
  dt_dist_env env;
  char url[64];
  snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
  ASSERT_EQ(dt_dist_env_detect(url, 0, 1, &env), DT_OK);
  dt_group_options o;
  dt_group_options_default(&o);
  o.timeout_s = 5;
  dt_group *g = NULL;
  double t0 = now_s();
  ASSERT_EQ(dt_group_init_env(&env, &o, &g), DT_IO);
  ASSERT(now_s() - t0 < 5.0);
  char p[16];
  snprintf(p, sizeof p, "%d", port);
  ASSERT_MSG(strstr(dt_last_error(), p) && strstr(dt_last_error(), "in use"), dt_last_error());
  close(fd);
}

TEST(unresolvable_master_is_named) {
  /* .invalid never resolves (RFC 6761): a node name of SLURM_JOB_NODELIST that only the cluster's DNS knows.
   * A name may resolve later (a node booting): retried until the deadline, then the resolver's answer. */
  dt_group_options o;
  dt_group_options_default(&o);
  o.init_method = "tcp://n1.invalid:29999";
  o.rank = 1;
  o.world_size = 2;
  o.timeout_s = 1.5;
  dt_group *g = NULL;
  double t0 = now_s();
  ASSERT_EQ(dt_group_init(&o, &g), DT_NOT_FOUND);
  ASSERT(now_s() - t0 < 4.0);
  ASSERT_MSG(strstr(dt_last_error(), "cannot resolve host 'n1.invalid'") && strstr(dt_last_error(), "MASTER_ADDR"),
             dt_last_error());
}

TEST(unreachable_master_times_out) {
  /* A port nobody listens on (bound, never listened). */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t al = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &al);
  char url[64];
  snprintf(url, sizeof url, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
  dt_group_options o;
  dt_group_options_default(&o);
  o.init_method = url;
  o.rank = 1;
  o.world_size = 2;
  o.timeout_s = 1.5;
  dt_group *g = NULL;
  double t0 = now_s();
  ASSERT_EQ(dt_group_init(&o, &g), DT_TIMEOUT);
  ASSERT(now_s() - t0 < 4.0);
  ASSERT_MSG(strstr(dt_last_error(), "127.0.0.1") != NULL, dt_last_error());
  close(fd);
}

/* Rank 1 believes the world has 3 ranks, rank 0 that it has 2. */
static int world_child(df_job *j, int r, int world, void *arg) {
  (void)world;
  const int *worlds = arg;
  dt_group *g = NULL;
  dt_status s = df_join(j, r, worlds[r], &g);
  record(r, s);
  dt_group_destroy(g);
  return 0;
}

TEST(world_size_disagreement_is_reported) {
  df_job j = job("tcp", 5);
  int worlds[2] = {2, 3};
  ASSERT_EQ(df_run(&j, 2, world_child, worlds), 0);
  for (int r = 0; r < 2; r++) {
    ASSERT_MSG(shared[r].status == (int)DT_MISMATCH, shared[r].msg);
    ASSERT_MSG(strstr(shared[r].msg, "WORLD_SIZE") != NULL, shared[r].msg);
  }
}

/* Two processes both say they are rank 0 of 2. */
static int dup_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g = NULL;
  dt_status s = df_join(j, 0, world, &g);
  record(r, s);
  dt_group_destroy(g);
  return 0;
}

TEST(duplicate_rank_is_reported) {
  df_job j = job("tcp", 3);
  ASSERT_EQ(df_run(&j, 2, dup_child, NULL), 0);
  int claimed = 0;
  for (int r = 0; r < 2; r++) claimed += shared[r].status == (int)DT_MISMATCH && strstr(shared[r].msg, "claimed");
  ASSERT_EQ(claimed, 1);
}

TEST(nothing_left_in_dev_shm) { ASSERT_EQ(df_shm_leftovers(RUN_ID), 0); }

int main(int argc, char **argv) {
  static const dt_test_case cases[] = {TEST_ENTRY(shm_rank_killed_mid_allreduce_is_named_within_seconds), TEST_ENTRY(tcp_rank_killed_mid_allreduce_is_named_within_seconds), TEST_ENTRY(shm_stopped_rank_gives_timeout), TEST_ENTRY(tcp_stopped_rank_gives_timeout), TEST_ENTRY(shm_mismatched_collectives_are_reported), TEST_ENTRY(tcp_mismatched_collectives_are_reported), TEST_ENTRY(abort_interrupts_a_waiting_collective), TEST_ENTRY(strangers_at_the_store_do_not_disturb_the_job), TEST_ENTRY(port_in_use_is_a_clear_error), TEST_ENTRY(unresolvable_master_is_named), TEST_ENTRY(unreachable_master_times_out), TEST_ENTRY(world_size_disagreement_is_reported), TEST_ENTRY(duplicate_rank_is_reported), TEST_ENTRY(nothing_left_in_dev_shm)};
  shared = mmap(NULL, sizeof(outcome) * DF_MAX_WORLD, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return 1;
  return dt_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}

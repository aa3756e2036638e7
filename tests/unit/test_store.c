/* The TCP key-value store: request semantics, deadlines, several processes,
 * strangers and malformed clients, a lost server, many clients at once. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist-impl.h"
#include "harness.h"

#define TEST_SECRET "test-secret-0123456789abcdef0123456789abcdef"
#include "dist_fork.h" /* df_store_proc: a store served by a helper process */

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* The client's side of a protocol 2 handshake over a raw socket, as a
 * stranger would write it: hello (magic, version, nonce), then the proof of
 * `secret` over both nonces and the run id. The bytes it sent go to sent
 * (may be NULL: 40 + 4 + strlen(run) + 32 bytes); returns the server's last
 * answer code (0 accepted, 1 wrong proof, 3 other run) or -1. */
static int raw_handshake(int fd, const char *run, const char *secret, uint8_t *sent) {
  uint8_t hello[40], ch[34], proof[4 + 128 + 32], code;
  memcpy(hello, "DST1", 4);
  hello[4] = 2, hello[5] = hello[6] = hello[7] = 0;
  for (int i = 0; i < 32; i++) hello[8 + i] = (uint8_t)(i * 7 + 1);
  double dl = dt_time_now() + 2;
  if (dt_net_send_all(fd, hello, sizeof hello, dl, NULL, "raw") != DT_OK) return -1;
  if (dt_net_recv_all(fd, ch, sizeof ch, dl, NULL, "raw") != DT_OK || ch[0] != 0) return -1;
  size_t n = strlen(run);
  proof[0] = (uint8_t)n, proof[1] = proof[2] = proof[3] = 0;
  memcpy(proof + 4, run, n);
  dt_auth_part parts[3] = {{hello + 8, 32}, {ch + 2, 32}, {run, n}};
  dt_auth_mac(secret, "dtrain store client", parts, 3, proof + 4 + n);
  if (dt_net_send_all(fd, proof, 4 + n + 32, dl, NULL, "raw") != DT_OK) return -1;
  if (sent) {
    memcpy(sent, hello, sizeof hello);
    memcpy(sent + sizeof hello, proof, 4 + n + 32);
  }
  if (dt_net_recv_all(fd, &code, 1, dl, NULL, "raw") != DT_OK) return -1;
  uint8_t mac[32];
  if (code == 0 && dt_net_recv_all(fd, mac, 32, dl, NULL, "raw") != DT_OK) return -1;
  return code;
}

static int raw_connect(int port) {
  int fd = -1;
  if (dt_net_connect("127.0.0.1", port, dt_time_now() + 2, NULL, "raw", &fd) != DT_OK) return -1;
  return fd;
}

/* Seconds until the server closes fd (reading and discarding what it sends), or -1 past limit. */
static double wait_closed(int fd, double limit) {
  double t0 = dt_time_now();
  char buf[256];
  while (dt_time_now() - t0 < limit) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) return dt_time_now() - t0;
    }
  }
  return -1;
}

TEST(set_get_add_check_delete) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job1", TEST_SECRET, &srv));
  int port = dt_store_server_port(srv);
  ASSERT(port > 0);
  ASSERT_OK(dt_store_connect("localhost", port, "job1", TEST_SECRET, 5, &s));
  ASSERT_OK(dt_store_set(s, "a", "hello", 5));
  void *v;
  size_t n;
  ASSERT_OK(dt_store_get(s, "a", &v, &n, 1));
  ASSERT_EQ(n, 5);
  ASSERT(memcmp(v, "hello", 5) == 0);
  dt_free(v);
  /* overwrite, zero-length value */
  ASSERT_OK(dt_store_set(s, "a", "", 0));
  v = NULL;
  ASSERT_OK(dt_store_get(s, "a", &v, &n, 1));
  ASSERT(v != NULL);
  ASSERT_EQ(n, 0);
  dt_free(v);
  int64_t x = 0;
  ASSERT_OK(dt_store_add(s, "ctr", 3, &x));
  ASSERT_EQ(x, 3);
  ASSERT_OK(dt_store_add(s, "ctr", -5, &x));
  ASSERT_EQ(x, -2);
  ASSERT_OK(dt_store_get(s, "ctr", &v, &n, 1));
  ASSERT_EQ(n, 2);
  ASSERT(memcmp(v, "-2", 2) == 0);
  dt_free(v);
  ASSERT_OK(dt_store_set(s, "txt", "abc", 3));
  ASSERT_STATUS(dt_store_add(s, "txt", 1, &x), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "txt") != NULL);
  const char *keys[] = {"a", "ctr", "nope"};
  int present = -1;
  ASSERT_OK(dt_store_check(s, keys, 2, &present));
  ASSERT_EQ(present, 1);
  ASSERT_OK(dt_store_check(s, keys, 3, &present));
  ASSERT_EQ(present, 0);
  int existed = -1;
  ASSERT_OK(dt_store_delete(s, "a", &existed));
  ASSERT_EQ(existed, 1);
  ASSERT_OK(dt_store_delete(s, "a", &existed));
  ASSERT_EQ(existed, 0);
  ASSERT_OK(dt_store_check(s, keys, 1, &present));
  ASSERT_EQ(present, 0);
  ASSERT_OK(dt_store_wait(s, keys + 1, 1, 1));
  /* bounds checked on the client */
  ASSERT_STATUS(dt_store_set(s, "", "x", 1), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_store_set(s, "big", "x", (size_t)DT_STORE_MAX_VALUE + 1), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_store_check(s, keys, 0, &present), DT_INVALID_ARGUMENT);
  /* a large value round trip */
  size_t big = 4u << 20;
  uint8_t *b;
  ASSERT_OK(dt_alloc(big, (void **)&b));
  for (size_t i = 0; i < big; i++) b[i] = (uint8_t)(i * 7 + 1);
  ASSERT_OK(dt_store_set(s, "big", b, big));
  ASSERT_OK(dt_store_get(s, "big", &v, &n, 2));
  ASSERT_EQ(n, big);
  ASSERT(memcmp(v, b, big) == 0);
  dt_free(v);
  dt_free(b);
  dt_store_close(s);
  dt_store_server_stop(srv);
}

typedef struct setter_arg {
  int port;
  double delay_s;
  const char *key;
} setter_arg;

static void *setter(void *p) {
  setter_arg *a = p;
  dt_store *s;
  sleep_s(a->delay_s);
  if (dt_store_connect("127.0.0.1", a->port, "job", TEST_SECRET, 5, &s) != DT_OK) return NULL;
  dt_store_set(s, a->key, "late", 4);
  dt_store_close(s);
  return NULL;
}

TEST(get_and_wait_block_until_set) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start(NULL, 0, "job", TEST_SECRET, &srv));
  ASSERT_OK(dt_store_connect("127.0.0.1", dt_store_server_port(srv), "job", TEST_SECRET, 5, &s));
  setter_arg a = {dt_store_server_port(srv), 0.2, "later"};
  pthread_t t;
  pthread_create(&t, NULL, setter, &a);
  double t0 = dt_time_now();
  void *v;
  size_t n;
  dt_status st = dt_store_get(s, "later", &v, &n, 5);
  double el = dt_time_now() - t0;
  pthread_join(t, NULL);
  ASSERT_OK(st);
  ASSERT(el > 0.15 && el < 2);
  ASSERT_EQ(n, 4);
  ASSERT(memcmp(v, "late", 4) == 0);
  dt_free(v);
  setter_arg b = {dt_store_server_port(srv), 0.2, "w2"};
  pthread_create(&t, NULL, setter, &b);
  const char *keys[] = {"later", "w2"};
  st = dt_store_wait(s, keys, 2, 5);
  pthread_join(t, NULL);
  ASSERT_OK(st);
  dt_store_close(s);
  dt_store_server_stop(srv);
}

TEST(missing_key_times_out_and_client_stays_usable) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &srv));
  ASSERT_OK(dt_store_connect("127.0.0.1", dt_store_server_port(srv), "job", TEST_SECRET, 5, &s));
  double t0 = dt_time_now();
  void *v;
  size_t n;
  ASSERT_STATUS(dt_store_get(s, "never", &v, &n, 0.5), DT_TIMEOUT);
  double el = dt_time_now() - t0;
  ASSERT(el >= 0.45 && el < 1.5);
  ASSERT(strstr(dt_last_error(), "never") != NULL);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", dt_store_server_port(srv));
  ASSERT(strstr(dt_last_error(), addr) != NULL);
  const char *keys[] = {"never", "nor-this"};
  ASSERT_STATUS(dt_store_wait(s, keys, 2, 0.3), DT_TIMEOUT);
  /* the cancelled requests left the connection in sync */
  ASSERT_OK(dt_store_set(s, "k", "1", 1));
  ASSERT_OK(dt_store_get(s, "k", &v, &n, 1));
  ASSERT_EQ(n, 1);
  dt_free(v);
  dt_store_close(s);
  dt_store_server_stop(srv);
}

TEST(connect_times_out_naming_address) {
  /* a port that nothing listens on: take one, then free it */
  int fd, port;
  ASSERT_OK(dt_net_listen("127.0.0.1", 0, 1, &fd, &port));
  dt_net_close(&fd);
  dt_store *s;
  double t0 = dt_time_now();
  ASSERT_STATUS(dt_store_connect("127.0.0.1", port, "job", TEST_SECRET, 0.3, &s), DT_TIMEOUT);
  ASSERT(dt_time_now() - t0 < 1.5);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  ASSERT(strstr(dt_last_error(), addr) != NULL);
}

/* The server runs in a helper process, so this one forks its clients single-threaded. */
TEST(two_processes_share_one_server) {
  df_store_proc srv;
  ASSERT_EQ(df_store_proc_start("job", &srv), 0);
  const int port = srv.port;
  pid_t kids[2];
  for (int r = 0; r < 2; r++) {
    kids[r] = fork();
    ASSERT(kids[r] >= 0);
    if (kids[r] == 0) {
      alarm(10);
      dt_store *s;
      int bad = 0;
      if (dt_store_connect("127.0.0.1", port, "job", TEST_SECRET, 5, &s) != DT_OK) _exit(10);
      char key[32], want[32];
      snprintf(key, sizeof key, "rank/%d", r);
      snprintf(want, sizeof want, "addr-of-%d", r);
      bad |= dt_store_set(s, key, want, strlen(want)) != DT_OK;
      int64_t x;
      bad |= dt_store_add(s, "joined", 1, &x) != DT_OK;
      snprintf(key, sizeof key, "rank/%d", 1 - r);
      snprintf(want, sizeof want, "addr-of-%d", 1 - r);
      void *v;
      size_t n;
      if (dt_store_get(s, key, &v, &n, 5) != DT_OK) _exit(11);
      bad |= n != strlen(want) || memcmp(v, want, n) != 0;
      dt_free(v);
      const char *k[] = {"joined"};
      bad |= dt_store_wait(s, k, 1, 5) != DT_OK;
      dt_store_close(s);
      _exit(bad ? 12 : 0);
    }
  }
  int ok = 1;
  double deadline = dt_time_now() + 15;
  for (int r = 0; r < 2; r++) {
    int status = 0;
    pid_t got;
    while ((got = waitpid(kids[r], &status, WNOHANG)) == 0 && dt_time_now() < deadline) sleep_s(0.01);
    if (got != kids[r]) {
      kill(kids[r], SIGKILL);
      waitpid(kids[r], &status, 0);
      ok = 0;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "  child %d: status 0x%x\n", r, status);
      ok = 0;
    }
  }
  dt_store *s;
  ASSERT_OK(dt_store_connect("127.0.0.1", port, "job", TEST_SECRET, 5, &s));
  int64_t x = 0;
  ASSERT_OK(dt_store_add(s, "joined", 0, &x));
  dt_store_close(s);
  df_store_proc_stop(&srv);
  ASSERT(ok);
  ASSERT_EQ(x, 2);
}

TEST(wrong_run_id_is_refused) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "alpha", TEST_SECRET, &srv));
  int port = dt_store_server_port(srv);
  dt_log_level lv = dt_log_get_level();
  dt_log_set_level(DT_LOG_LEVEL_ERROR); /* the server logs the refusal as a warning: expected here */
  dt_status st = dt_store_connect("127.0.0.1", port, "beta", TEST_SECRET, 2, &s);
  sleep_s(0.1); /* the server logs the drop just after its answer */
  dt_log_set_level(lv);
  ASSERT_STATUS(st, DT_INVALID_ARGUMENT);
  char want[128];
  snprintf(want, sizeof want, "store at 127.0.0.1:%d belongs to run 'alpha', not 'beta'", port);
  ASSERT_STR_EQ(dt_last_error(), want);
  ASSERT_OK(dt_store_connect("127.0.0.1", port, "alpha", TEST_SECRET, 2, &s));
  dt_store_close(s);
  dt_store_server_stop(srv);
}

/* Reads what the server sends until it closes (or limit_s), appending to buf; -1 if it never closed. */
static long read_until_closed(int fd, uint8_t *buf, size_t cap, double limit_s) {
  size_t got = 0;
  double t0 = dt_time_now();
  while (dt_time_now() - t0 < limit_s) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t k = recv(fd, buf + got, cap - got, MSG_DONTWAIT);
    if (k > 0) got += (size_t)k;
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR) || got == cap) return (long)got;
  }
  return -1;
}

static int contains(const uint8_t *buf, size_t n, const char *needle) {
  size_t m = strlen(needle);
  for (size_t i = 0; i + m <= n; i++)
    if (memcmp(buf + i, needle, m) == 0) return 1;
  return 0;
}

/* The attack of issue 17 step by step: a stranger guesses a run id and a
 * secret; all it gets back is the server's nonce and a one-byte refusal. */
TEST(a_wrong_secret_learns_nothing) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "alpha-run", TEST_SECRET, &srv));
  int port = dt_store_server_port(srv);
  dt_log_level lv = dt_log_get_level();
  dt_log_set_level(DT_LOG_LEVEL_ERROR); /* the refusals are logged as warnings: expected here */
  const char *guesses[] = {"beta", "alpha-run"};
  for (int g = 0; g < 2; g++) {
    int fd = raw_connect(port);
    ASSERT(fd >= 0);
    uint8_t sent[256], back[512];
    ASSERT_EQ(raw_handshake(fd, guesses[g], "guessed-secret-0123456789abcdef0123456789", sent), 1);
    long more = read_until_closed(fd, back, sizeof back, 2);
    ASSERT_EQ(more, 0); /* nothing after the refusal: closed */
    dt_net_close(&fd);
  }
  /* the first answer, before any proof: a nonce, nothing about the job */
  int fd = raw_connect(port);
  uint8_t hello[40] = {'D', 'S', 'T', '1', 2, 0, 0, 0}, back[512];
  ASSERT_OK(dt_net_send_all(fd, hello, sizeof hello, dt_time_now() + 1, NULL, "raw"));
  sleep_s(0.2);
  ssize_t k = recv(fd, back, sizeof back, MSG_DONTWAIT);
  ASSERT_EQ(k, 34);
  ASSERT(!contains(back, (size_t)k, "alpha"));
  dt_net_close(&fd);
  /* a client of protocol 1 (which used to be told the run id) is told the version only */
  fd = raw_connect(port);
  uint8_t v1[15] = {'D', 'S', 'T', '1', 1, 0, 0, 0, 3, 0, 0, 0, 'j', 'o', 'b'};
  ASSERT_OK(dt_net_send_all(fd, v1, sizeof v1, dt_time_now() + 1, NULL, "raw"));
  long n = read_until_closed(fd, back, sizeof back, 2);
  ASSERT(n > 5 && back[0] == 2 && !contains(back, (size_t)n, "alpha"));
  dt_net_close(&fd);
  /* the library's client: a clear error that names neither the run nor the secret */
  ASSERT_STATUS(dt_store_connect("127.0.0.1", port, "beta", "guessed-secret-0123456789abcdef0123456789", 2, &s),
                DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "refused this client's job secret") && !strstr(dt_last_error(), "alpha"),
             dt_last_error());
  ASSERT_STATUS(dt_store_connect("127.0.0.1", port, "alpha-run", NULL, 2, &s), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "requires the job secret"), dt_last_error());
  dt_log_set_level(lv);
  /* and the job's own clients are served all along */
  ASSERT_OK(dt_store_connect("127.0.0.1", port, "alpha-run", TEST_SECRET, 2, &s));
  ASSERT_OK(dt_store_set(s, "k", "v", 1));
  dt_store_close(s);
  dt_store_server_stop(srv);
}

/* A captured handshake replayed byte for byte meets a fresh nonce: refused. */
TEST(a_replayed_handshake_is_refused) {
  dt_store_server *srv;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &srv));
  int port = dt_store_server_port(srv);
  int fd = raw_connect(port);
  uint8_t captured[256], back[512];
  ASSERT_EQ(raw_handshake(fd, "job", TEST_SECRET, captured), 0);
  size_t n = 40 + 4 + 3 + 32;
  dt_net_close(&fd);
  dt_log_level lv = dt_log_get_level();
  dt_log_set_level(DT_LOG_LEVEL_ERROR);
  fd = raw_connect(port);
  ASSERT_OK(dt_net_send_all(fd, captured, n, dt_time_now() + 1, NULL, "raw"));
  long got = read_until_closed(fd, back, sizeof back, 2);
  dt_log_set_level(lv);
  ASSERT_EQ(got, 35); /* the challenge (34 bytes), then 1: wrong proof; then closed */
  ASSERT_EQ(back[34], 1);
  dt_net_close(&fd);
  dt_store_server_stop(srv);
}

/* A process holding the secret will not talk to a store without one (an impostor's). */
TEST(a_client_with_a_secret_refuses_an_open_store) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", NULL, &srv));
  int port = dt_store_server_port(srv);
  ASSERT_STATUS(dt_store_connect("127.0.0.1", port, "job", TEST_SECRET, 2, &s), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "has no job secret"), dt_last_error());
  ASSERT_OK(dt_store_connect("127.0.0.1", port, "job", NULL, 2, &s)); /* open: as torchrun's */
  dt_store_close(s);
  /* an open store does not tell a client of another run its run id either */
  dt_log_level lv = dt_log_get_level();
  dt_log_set_level(DT_LOG_LEVEL_ERROR);
  ASSERT_STATUS(dt_store_connect("127.0.0.1", port, "other", NULL, 2, &s), DT_INVALID_ARGUMENT);
  sleep_s(0.1); /* the server logs the drop just after its answer */
  dt_log_set_level(lv);
  ASSERT_MSG(strstr(dt_last_error(), "another run than 'other'"), dt_last_error());
  dt_store_server_stop(srv);
  ASSERT_STATUS(dt_store_server_start("127.0.0.1", 0, "job", "short", &srv), DT_INVALID_ARGUMENT);
}

/* A flood of half-open handshakes: the store keeps the newest 256, drops the
 * oldest, and a client of the job still gets in at once. */
TEST(half_open_handshakes_do_not_crowd_out_the_job) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &srv));
  int port = dt_store_server_port(srv);
  dt_log_level lv = dt_log_get_level();
  dt_log_set_level(DT_LOG_LEVEL_ERROR);
  enum { N = 300 };
  int fds[N];
  uint8_t hello[40] = {'D', 'S', 'T', '1', 2, 0, 0, 0};
  for (int i = 0; i < N; i++) {
    fds[i] = raw_connect(port);
    ASSERT(fds[i] >= 0);
    ASSERT_OK(dt_net_send_all(fds[i], hello, sizeof hello, dt_time_now() + 1, NULL, "raw"));
    if (i % 50 == 49) sleep_s(0.05); /* let the server accept them in order */
  }
  double t0 = dt_time_now();
  ASSERT_OK(dt_store_connect("127.0.0.1", port, "job", TEST_SECRET, 5, &s));
  double took = dt_time_now() - t0;
  ASSERT_OK(dt_store_set(s, "k", "v", 1));
  uint8_t back[64];
  long first = read_until_closed(fds[0], back, sizeof back, 1), last = read_until_closed(fds[N - 1], back, sizeof back, 0.3);
  dt_log_set_level(lv);
  for (int i = 0; i < N; i++) dt_net_close(&fds[i]);
  dt_store_close(s);
  dt_store_server_stop(srv);
  ASSERT_EQ(first, 34); /* the oldest got its challenge, then was dropped */
  ASSERT_EQ(last, -1);  /* the newest is still open, waiting for its proof */
  ASSERT(took < 1.0);
}

/* Strangers are logged once per address and a few lines per 10 s in all,
 * whatever their number (in a child: the limiter's state is per process). */
TEST(refusals_are_logged_once_per_address) {
  char path[] = "/tmp/dt_refusals_XXXXXX";
  int log_fd = mkstemp(path);
  ASSERT(log_fd >= 0);
  fflush(stderr);
  pid_t p = fork();
  if (p == 0) {
    dup2(log_fd, 2);
    dt_log_set_level(DT_LOG_LEVEL_WARN);
    dt_store_server *srv;
    if (dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &srv) != DT_OK) _exit(2);
    int port = dt_store_server_port(srv);
    long before = dt_auth_refusals(); /* inherited from the tests before */
    for (int i = 0; i < 100; i++) {
      int fd = raw_connect(port);
      if (fd < 0 || raw_handshake(fd, "job", "guessed-secret-0123456789abcdef0123456789", NULL) != 1) _exit(3);
      dt_net_close(&fd);
    }
    for (int i = 0; i < 30; i++) {
      char ip[32];
      snprintf(ip, sizeof ip, "10.0.0.%d", i);
      dt_auth_refused("store", ip, "failed authentication");
    }
    sleep_s(0.3); /* the server logs a refusal just after sending it */
    long total = dt_auth_refusals() - before;
    dt_store_server_stop(srv);
    _exit(total == 130 ? 0 : 4);
  }
  int status = 0;
  waitpid(p, &status, 0);
  ASSERT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "grep -c 'refused a connection from' %s", path);
  FILE *f = popen(cmd, "r");
  int lines = -1;
  ASSERT(f && fscanf(f, "%d", &lines) == 1);
  pclose(f);
  snprintf(cmd, sizeof cmd, "grep -c 'refused a connection from 127.0.0.1' %s", path);
  f = popen(cmd, "r");
  int local = -1;
  ASSERT(f && fscanf(f, "%d", &local) == 1);
  pclose(f);
  close(log_fd);
  unlink(path);
  /* 127.0.0.1 at most once (earlier tests of this process may have logged it
   * already), and no more lines than the burst of a 10 s window: 130 refusals, <= 5 lines */
  ASSERT(local <= 1);
  ASSERT(lines >= 1 && lines <= 5);
}

typedef struct worker_arg {
  dt_store *s;
  int id;
  atomic_int *stop;
  int errors, rounds;
} worker_arg;

/* A legitimate client working all the time the strangers are around. */
static void *legit_worker(void *p) {
  worker_arg *a = p;
  while (!atomic_load(a->stop)) {
    char key[32];
    snprintf(key, sizeof key, "w%d/%d", a->id, a->rounds);
    void *v;
    size_t n;
    int64_t x;
    if (dt_store_set(a->s, key, "v", 1) != DT_OK || dt_store_get(a->s, key, &v, &n, 2) != DT_OK) {
      a->errors++;
      break;
    }
    dt_free(v);
    if (dt_store_add(a->s, "legit", 1, &x) != DT_OK) a->errors++;
    a->rounds++;
    sleep_s(0.002);
  }
  return NULL;
}

TEST(strangers_are_dropped_others_unaffected) {
  dt_store_server *srv;
  dt_store *s;
  dt_log_level lv = dt_log_get_level();
  dt_log_set_level(DT_LOG_LEVEL_ERROR); /* the drops are logged as warnings: expected here */
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &srv));
  int port = dt_store_server_port(srv);
  ASSERT_OK(dt_store_connect("127.0.0.1", port, "job", TEST_SECRET, 5, &s));
  atomic_int stop = 0;
  worker_arg wa = {s, 0, &stop, 0, 0};
  pthread_t t;
  pthread_create(&t, NULL, legit_worker, &wa);

  int silent = raw_connect(port);
  int garbage = raw_connect(port);
  int oversize = raw_connect(port);
  int badop = raw_connect(port);
  int parked = raw_connect(port);
  ASSERT(silent >= 0 && garbage >= 0 && oversize >= 0 && badop >= 0 && parked >= 0);
  uint8_t b[64];
  /* garbage instead of a handshake */
  memset(b, 0xA5, sizeof b);
  ASSERT_OK(dt_net_send_all(garbage, b, sizeof b, dt_time_now() + 1, NULL, "raw"));
  /* handshake, then a SET announcing a 4 GiB value */
  ASSERT_EQ(raw_handshake(oversize, "job", TEST_SECRET, NULL), 0);
  b[0] = 1;                                  /* SET */
  b[1] = 1, b[2] = b[3] = b[4] = 0;          /* klen 1 */
  memset(b + 5, 0xff, 4);                    /* vlen 0xffffffff */
  ASSERT_OK(dt_net_send_all(oversize, b, 9, dt_time_now() + 1, NULL, "raw"));
  /* handshake, then an unknown op */
  ASSERT_EQ(raw_handshake(badop, "job", TEST_SECRET, NULL), 0);
  b[0] = 99;
  ASSERT_OK(dt_net_send_all(badop, b, 1, dt_time_now() + 1, NULL, "raw"));
  /* handshake, a GET of a missing key (parked), then the client vanishes */
  ASSERT_EQ(raw_handshake(parked, "job", TEST_SECRET, NULL), 0);
  b[0] = 2;
  b[1] = 3, b[2] = b[3] = b[4] = 0;
  memcpy(b + 5, "zzz", 3);
  ASSERT_OK(dt_net_send_all(parked, b, 8, dt_time_now() + 1, NULL, "raw"));

  double tg = wait_closed(garbage, 2), to = wait_closed(oversize, 2), tb = wait_closed(badop, 2);
  sleep_s(0.2);
  dt_net_close(&parked);
  double ts = wait_closed(silent, 8);
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  dt_net_close(&silent);
  dt_net_close(&garbage);
  dt_net_close(&oversize);
  dt_net_close(&badop);
  dt_log_set_level(lv);

  ASSERT(tg >= 0 && tg < 1);
  ASSERT(to >= 0 && to < 1);
  ASSERT(tb >= 0 && tb < 1);
  ASSERT(ts >= 3 && ts < 7.5); /* handshake deadline of the server: about 5 s */
  ASSERT_EQ(wa.errors, 0);
  ASSERT(wa.rounds > 10);
  int64_t x = 0;
  ASSERT_OK(dt_store_add(s, "legit", 0, &x));
  ASSERT_EQ(x, wa.rounds);
  dt_store_close(s);
  dt_store_server_stop(srv); /* ASan: the parked request of the vanished client was freed */
}

TEST(port_in_use_names_the_port) {
  dt_store_server *a, *b;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &a));
  int port = dt_store_server_port(a);
  ASSERT_STATUS(dt_store_server_start("127.0.0.1", port, "job", TEST_SECRET, &b), DT_IO);
  char want[64];
  snprintf(want, sizeof want, ":%d: address already in use", port);
  ASSERT(strstr(dt_last_error(), want) != NULL);
  dt_store_server_stop(a);
}

typedef struct stopper_arg {
  dt_store_server *srv;
  double delay_s;
} stopper_arg;

static void *stopper(void *p) {
  stopper_arg *a = p;
  sleep_s(a->delay_s);
  dt_store_server_stop(a->srv);
  return NULL;
}

TEST(server_gone_mid_request_is_peer_lost) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &srv));
  int port = dt_store_server_port(srv);
  ASSERT_OK(dt_store_connect("127.0.0.1", port, "job", TEST_SECRET, 10, &s));
  stopper_arg a = {srv, 0.2};
  pthread_t t;
  pthread_create(&t, NULL, stopper, &a);
  double t0 = dt_time_now();
  void *v;
  size_t n;
  dt_status st = dt_store_get(s, "never", &v, &n, 10);
  double el = dt_time_now() - t0;
  pthread_join(t, NULL);
  ASSERT_STATUS(st, DT_PEER_LOST);
  ASSERT(el < 1.5);
  char addr[64];
  snprintf(addr, sizeof addr, "store 127.0.0.1:%d", port);
  ASSERT(strstr(dt_last_error(), addr) != NULL);
  /* later requests fail at once too */
  t0 = dt_time_now();
  ASSERT_STATUS(dt_store_set(s, "k", "v", 1), DT_PEER_LOST);
  ASSERT(dt_time_now() - t0 < 0.5);
  dt_store_close(s);
}

#define NCLIENTS 64
typedef struct many_arg {
  int port, id, ok;
} many_arg;

static void *many_client(void *p) {
  many_arg *a = p;
  dt_store *s;
  if (dt_store_connect("127.0.0.1", a->port, "job", TEST_SECRET, 10, &s) != DT_OK) return NULL;
  char key[32], want[32];
  snprintf(key, sizeof key, "c/%d", a->id);
  snprintf(want, sizeof want, "v%d", a->id);
  int64_t x;
  void *v;
  size_t n;
  int ok = dt_store_set(s, key, want, strlen(want)) == DT_OK && dt_store_add(s, "count", 1, &x) == DT_OK;
  /* each waits for its neighbour's key */
  int nb = (a->id + 1) % NCLIENTS;
  snprintf(key, sizeof key, "c/%d", nb);
  snprintf(want, sizeof want, "v%d", nb);
  if (ok && dt_store_get(s, key, &v, &n, 10) == DT_OK) {
    ok = n == strlen(want) && memcmp(v, want, n) == 0;
    dt_free(v);
  } else {
    ok = 0;
  }
  dt_store_close(s);
  a->ok = ok;
  return NULL;
}

TEST(sixty_four_clients_at_once) {
  dt_store_server *srv;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &srv));
  pthread_t t[NCLIENTS];
  many_arg a[NCLIENTS];
  for (int i = 0; i < NCLIENTS; i++) {
    a[i] = (many_arg){dt_store_server_port(srv), i, 0};
    pthread_create(&t[i], NULL, many_client, &a[i]);
  }
  int ok = 0;
  for (int i = 0; i < NCLIENTS; i++) {
    pthread_join(t[i], NULL);
    ok += a[i].ok;
  }
  dt_store *s;
  ASSERT_OK(dt_store_connect("127.0.0.1", dt_store_server_port(srv), "job", TEST_SECRET, 5, &s));
  int64_t x = 0;
  ASSERT_OK(dt_store_add(s, "count", 0, &x));
  dt_store_close(s);
  dt_store_server_stop(srv);
  ASSERT_EQ(ok, NCLIENTS);
  ASSERT_EQ(x, NCLIENTS);
}

typedef struct shared_arg {
  dt_store *s;
  int errors;
} shared_arg;

static void *shared_adder(void *p) {
  shared_arg *a = p;
  for (int i = 0; i < 200; i++) {
    int64_t x;
    if (dt_store_add(a->s, "n", 1, &x) != DT_OK) a->errors++;
  }
  return NULL;
}

TEST(one_client_many_threads) {
  dt_store_server *srv;
  dt_store *s;
  ASSERT_OK(dt_store_server_start("127.0.0.1", 0, "job", TEST_SECRET, &srv));
  ASSERT_OK(dt_store_connect("127.0.0.1", dt_store_server_port(srv), "job", TEST_SECRET, 5, &s));
  pthread_t t[4];
  shared_arg a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (shared_arg){s, 0};
    pthread_create(&t[i], NULL, shared_adder, &a[i]);
  }
  int errors = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    errors += a[i].errors;
  }
  int64_t x = 0;
  ASSERT_OK(dt_store_add(s, "n", 0, &x));
  dt_store_close(s);
  dt_store_server_stop(srv);
  ASSERT_EQ(errors, 0);
  ASSERT_EQ(x, 800);
}

/* ---- sockets (net.c), which the store stands on ---- */

/* A connected pair over loopback. */
static int tcp_pair(int *a, int *b) {
  int lfd, port;
  if (dt_net_listen("127.0.0.1", 0, 4, &lfd, &port) != DT_OK) return -1;
  int rc = dt_net_connect("localhost", port, dt_time_now() + 2, NULL, "peer", a) == DT_OK &&
                   dt_net_accept(lfd, dt_time_now() + 2, NULL, b) == DT_OK
               ? 0
               : -1;
  dt_net_close(&lfd);
  return rc;
}

typedef struct xchg_arg {
  int fd;
  uint8_t *send, *recv;
  size_t n;
  dt_status st;
} xchg_arg;

static void *xchg(void *p) {
  xchg_arg *a = p;
  a->st = dt_net_sendrecv(a->fd, a->send, a->n, "left", a->fd, a->recv, a->n, "left", dt_time_now() + 10, NULL);
  return NULL;
}

TEST(net_sendrecv_both_ways_at_once) {
  int a, b;
  ASSERT_EQ(tcp_pair(&a, &b), 0);
  size_t n = 8u << 20; /* far beyond the socket buffers: plain send-then-recv would deadlock */
  uint8_t *sa, *sb, *ra, *rb;
  ASSERT_OK(dt_alloc(n, (void **)&sa));
  ASSERT_OK(dt_alloc(n, (void **)&sb));
  ASSERT_OK(dt_alloc(n, (void **)&ra));
  ASSERT_OK(dt_alloc(n, (void **)&rb));
  for (size_t i = 0; i < n; i++) sa[i] = (uint8_t)i, sb[i] = (uint8_t)(i * 3);
  xchg_arg x = {a, sa, ra, n, DT_INTERNAL};
  pthread_t t;
  pthread_create(&t, NULL, xchg, &x);
  dt_status st = dt_net_sendrecv(b, sb, n, "right", b, rb, n, "right", dt_time_now() + 10, NULL);
  pthread_join(t, NULL);
  ASSERT_OK(st);
  ASSERT_OK(x.st);
  ASSERT(memcmp(ra, sb, n) == 0);
  ASSERT(memcmp(rb, sa, n) == 0);
  dt_free(sa), dt_free(sb), dt_free(ra), dt_free(rb);
  dt_net_close(&a);
  dt_net_close(&b);
}

static void *raise_flag(void *p) {
  sleep_s(0.2);
  atomic_store((atomic_int *)p, 1);
  return NULL;
}

TEST(net_timeout_abort_and_peer_lost) {
  int a, b;
  ASSERT_EQ(tcp_pair(&a, &b), 0);
  char c;
  double t0 = dt_time_now();
  ASSERT_STATUS(dt_net_recv_all(a, &c, 1, dt_time_now() + 0.3, NULL, "rank 1"), DT_TIMEOUT);
  ASSERT(dt_time_now() - t0 >= 0.28 && dt_time_now() - t0 < 1);
  ASSERT(strncmp(dt_last_error(), "rank 1: no data for", 19) == 0);
  /* no deadline, abort flag raised after 0.2 s: back within ~100 ms of it */
  atomic_int flag = 0;
  pthread_t t;
  pthread_create(&t, NULL, raise_flag, &flag);
  t0 = dt_time_now();
  dt_status st = dt_net_recv_all(a, &c, 1, 0, &flag, "rank 1");
  double el = dt_time_now() - t0;
  pthread_join(t, NULL);
  ASSERT_STATUS(st, DT_INTERRUPTED);
  ASSERT(el >= 0.19 && el < 0.6);
  dt_net_close(&b);
  ASSERT_STATUS(dt_net_recv_all(a, &c, 1, dt_time_now() + 1, NULL, "rank 2"), DT_PEER_LOST);
  ASSERT_STR_EQ(dt_last_error(), "rank 2: connection closed");
  /* sending into a closed connection: no SIGPIPE, DT_PEER_LOST */
  static char big[1 << 20];
  ASSERT_STATUS(dt_net_send_all(a, big, sizeof big, dt_time_now() + 1, NULL, "rank 2"), DT_PEER_LOST);
  char addr[64];
  ASSERT_OK(dt_net_local_addr(a, addr, sizeof addr));
  ASSERT_STR_EQ(addr, "127.0.0.1");
  dt_net_close(&a);
  ASSERT_EQ(a, -1);
}

TEST_MAIN(TEST_ENTRY(net_sendrecv_both_ways_at_once), TEST_ENTRY(net_timeout_abort_and_peer_lost),
          TEST_ENTRY(set_get_add_check_delete), TEST_ENTRY(get_and_wait_block_until_set),
          TEST_ENTRY(missing_key_times_out_and_client_stays_usable), TEST_ENTRY(connect_times_out_naming_address),
          TEST_ENTRY(two_processes_share_one_server), TEST_ENTRY(wrong_run_id_is_refused),
          TEST_ENTRY(a_wrong_secret_learns_nothing), TEST_ENTRY(a_replayed_handshake_is_refused),
          TEST_ENTRY(a_client_with_a_secret_refuses_an_open_store), TEST_ENTRY(refusals_are_logged_once_per_address),
          TEST_ENTRY(half_open_handshakes_do_not_crowd_out_the_job),
          TEST_ENTRY(strangers_are_dropped_others_unaffected), TEST_ENTRY(port_in_use_names_the_port),
          TEST_ENTRY(server_gone_mid_request_is_peer_lost), TEST_ENTRY(sixty_four_clients_at_once),
          TEST_ENTRY(one_client_many_threads))

/* dtrun: the launcher (torchrun's equivalent). Serves or joins the rendezvous
 * store, starts K workers of any program per node with the torchrun
 * environment, prefixes their output, watches them, stops the whole job on a
 * failure and restarts it on every node within --max-restarts. */
#define _GNU_SOURCE /* sched_getaffinity / CPU_COUNT: the cores this process may use */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/impl.h"
#include "cpu_bind.h"
#include "dtrain/core.h"
#include "dtrain/dist.h"
#include "flags.h"

extern char **environ;

/* Exit codes: 0 every worker succeeded, 1 failure, 2 usage, 128 + signal when interrupted. */
enum { EXIT_FAIL = 1, EXIT_USAGE = 2 };

#define RING_LINES 10   /* last lines kept per rank for the failure summary */
#define RING_WIDTH 512  /* bytes kept of each such line */
#define LINE_CAP 16384  /* a longer line is emitted in pieces of this size */
#define READ_CHUNK 65536
#define MAX_NPROC 1024 /* workers per node; each holds ~38 KiB of line buffers */

/* ---- options ------------------------------------------------------------------ */
typedef struct options {
  int standalone;
  int nnodes, node_rank;
  const char *master_addr;
  int master_port;
  int nproc;
  int max_restarts;
  double monitor_interval; /* s */
  const char *log_dir;
  const char *run_id;
  const char *secret_file;
  int threads; /* 0: cores / nproc */
  int bind;    /* BIND_AUTO, BIND_NONE, BIND_CORE */
  double timeout; /* s */
  double grace;   /* s */
  char **prog;    /* NULL-terminated argv of the program */
} options;

typedef enum flag_id {
  F_STANDALONE, F_NNODES, F_NODE_RANK, F_MASTER_ADDR, F_MASTER_PORT, F_NPROC, F_MAX_RESTARTS,
  F_MONITOR, F_LOG_DIR, F_RUN_ID, F_SECRET_FILE, F_THREADS, F_BIND, F_TIMEOUT, F_GRACE, F_COUNT
} flag_id;

enum { BIND_AUTO, BIND_NONE, BIND_CORE };
static const flag_choice binds[] = {{"auto", BIND_AUTO}, {"none", BIND_NONE}, {"core", BIND_CORE}, {NULL, 0}};

/* --nnodes and --nproc-per-node are text here: their MIN:MAX and auto|cpu forms are read in parse_args. */
static const flag_spec flags[F_COUNT] = {
    [F_STANDALONE] = {"--standalone", NULL, FLAG_BOOL,
                      .help = "single node: serve the store on 127.0.0.1 at a free port (the default when "
                              "--nnodes is 1 and no --master-port is given)"},
    [F_NNODES] = {"--nnodes", "N", FLAG_STR,
                  .help = "number of nodes (agents), each started with its own --node-rank (default 1)"},
    [F_NODE_RANK] = {"--node-rank", "R", FLAG_INT_RANGE, .alias = "--node_rank", .lo = 0, .hi = 65535,
                     .expect = "a node rank (0 .. N-1)", .help = "this node's rank, 0 .. N-1; node 0 serves the store"},
    [F_MASTER_ADDR] = {"--master-addr", "A", FLAG_STR, .alias = "--master_addr",
                       .help = "address of node 0 (where the store is served)"},
    [F_MASTER_PORT] = {"--master-port", "P", FLAG_INT_RANGE, .alias = "--master_port", .lo = 1, .hi = 65535,
                       .expect = "a port (1-65535)", .help = "port of the store on node 0 (1-65535)"},
    [F_NPROC] = {"--nproc-per-node", "K", FLAG_STR, .alias = "--nproc_per_node",
                 .help = "workers per node (default 1; 'auto' or 'cpu': one per core); the same on every node"},
    [F_MAX_RESTARTS] = {"--max-restarts", "M", FLAG_INT_RANGE, .alias = "--max_restarts", .lo = 0, .hi = 1000000,
                        .expect = "a count >= 0",
                        .help = "restart the whole job up to M times after a worker fails (default 0)"},
    [F_MONITOR] = {"--monitor-interval", "S", FLAG_FLOAT_RANGE, .alias = "--monitor_interval", .lo = 0.001,
                   .hi = 3600, .expect = "a number of seconds in [0.001, 3600]",
                   .help = "seconds between checks of the workers and the other nodes (default 0.1)"},
    [F_LOG_DIR] = {"--log-dir", "D", FLAG_STR, .alias = "--log_dir",
                   .help = "write each worker's output to D/<restart>/rank<R>.out and .err instead of "
                           "printing it"},
    [F_RUN_ID] = {"--run-id", "ID", FLAG_STR, .alias = "--rdzv-id",
                  .help = "job identity shared by all nodes (default: random with --standalone, else "
                          "$DT_RUN_ID or 'default')"},
    [F_SECRET_FILE] = {"--secret-file", "PATH", FLAG_STR,
                       .help = "the job secret that admits to the store and the tcp mesh, read from PATH (mode "
                               "0600, yours; the same file on every node; make one with 'openssl rand -hex 32'). "
                               "Default: $DT_JOB_SECRET, else a fresh one with --standalone, else none (the store "
                               "is open to anyone who can reach its port)"},
    [F_THREADS] = {"--threads-per-proc", "T", FLAG_INT_RANGE, .lo = 1, .hi = 65536,
                   .expect = "a positive thread count",
                   .help = "compute threads per worker (OMP_NUM_THREADS, DT_NUM_THREADS); default: "
                           "max(1, cores/K) unless the variables are set"},
    [F_BIND] = {"--bind-to", "WHAT", FLAG_CHOICE, .alias = "--bind_to", .choices = binds,
                .help = "core (as mpirun's --bind-to core, counting logical CPUs): local worker R, with its "
                        "loader and communication threads, may run only on the usable CPUs R*T .. R*T+T-1 in "
                        "order, T its compute threads, wrapping round when the workers need more than there are; "
                        "none (as torchrun): the kernel places every thread; auto (default): core where two or "
                        "more workers' compute threads fill the usable CPUs (K*T <= CPUs < K*T + T, as with "
                        "the default T where K divides the CPUs), else none"},
    [F_TIMEOUT] = {"--timeout", "S", FLAG_FLOAT_RANGE, .lo = 0.001, .hi = 1e7,
                   .expect = "a positive number of seconds",
                   .help = "seconds to wait for the other nodes to join, start a round or finish "
                           "(default $DT_TIMEOUT or 300)"},
    [F_GRACE] = {"--grace", "S", FLAG_FLOAT_RANGE, .lo = 0, .hi = 3600, .expect = "a number of seconds in [0, 3600]",
                 .help = "seconds workers get to exit after SIGTERM before SIGKILL (default 5)"},
};

/* The program to run follows "--" or is the first argument that is not a flag (torchrun style). */
static const flag_set dtrun_flags = {"dtrun", "see 'dtrun --help'", flags, F_COUNT, FLAGS_STOP};

#define USAGE_ERROR(...) flags_usage_error("dtrun", "see 'dtrun --help'", __VA_ARGS__)

static void print_help(FILE *f) {
  fprintf(f,
          "usage: dtrun [--standalone | --nnodes N --node-rank R --master-addr A --master-port P]\n"
          "             [--nproc-per-node K] [--max-restarts M] [--monitor-interval S] [--log-dir D]\n"
          "             [--run-id ID] [--secret-file PATH] [--threads-per-proc T] [--bind-to WHAT]\n"
          "             [--timeout S] [--grace S]\n"
          "             -- PROGRAM [ARGS...]\n"
          "\n"
          "Starts K workers of PROGRAM (looked up in PATH) on this node, the way torchrun does, and\n"
          "watches them. The agent serves the rendezvous store (node 0) or joins it (other nodes).\n"
          "If a worker exits non-zero or is killed, every worker of every node is stopped and, while\n"
          "restarts remain, the whole job is started again with DT_RESTART_COUNT one higher.\n"
          "\n"
          "flags (torchrun's underscore spellings as shown; --flag=VALUE works too):\n");
  flags_print_wrapped(f, &dtrun_flags);
  fprintf(f,
          "\n"
          "each worker's environment:\n"
          "  RANK, LOCAL_RANK, WORLD_SIZE (N*K), LOCAL_WORLD_SIZE (K), GROUP_RANK (node rank),\n"
          "  GROUP_WORLD_SIZE (N), ROLE_RANK (= RANK), ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR and\n"
          "  MASTER_PORT (the agent's store), DT_RUN_ID / TORCHELASTIC_RUN_ID, DT_JOB_SECRET (when the\n"
          "  job has one; never on a command line nor in a log), DT_RESTART_COUNT /\n"
          "  TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, DT_STORE_SERVED=1 and\n"
          "  TORCHELASTIC_USE_AGENT_STORE=True (rank 0 connects to the agent's store),\n"
          "  OMP_NUM_THREADS and DT_NUM_THREADS (--threads-per-proc; else kept if set; else\n"
          "  max(1, cores/K)), OMP_WAIT_POLICY=passive unless set.\n"
          "\n"
          "output: every line a worker writes is printed as '[rank R]: line' on dtrun's stdout or\n"
          "stderr (the stream the worker used); with --log-dir it goes to files instead.\n"
          "\n"
          "signals: SIGINT/SIGTERM are forwarded to every worker's process group; workers still\n"
          "running after --grace seconds get SIGKILL. Other nodes are told to stop too.\n"
          "\n"
          "exit status: 0 every worker succeeded; 1 a worker failed (after a summary naming it, its\n"
          "exit code or signal and its last lines) or the job could not start; 2 usage error;\n"
          "130 / 143 interrupted by SIGINT / SIGTERM.\n"
          "\n"
          "examples:\n"
          "  dtrun --standalone --nproc-per-node 2 -- dtrain train --model fashioncnn\n"
          "  dtrun --nnodes 2 --node-rank 0 --master-addr host0 --master-port 29500 \\\n"
          "        --nproc-per-node 4 --max-restarts 3 -- ./my_program --lr 0.1   (and rank 1 on host1)\n");
}


/* --nnodes N, or torchrun's MIN:MAX when both are N (elastic ranges are not supported). */
static int read_nnodes(const flag_value *v, options *o) {
  o->nnodes = 1;
  if (!v->given) return 0;
  const char *s = v->raw;
  const char *colon = strchr(s, ':');
  char lo[32];
  if (colon) {
    if ((size_t)(colon - s) >= sizeof lo || strcmp(colon + 1, s) == 0)
      return USAGE_ERROR("--nnodes: '%s' is malformed", s);
    memcpy(lo, s, (size_t)(colon - s));
    lo[colon - s] = '\0';
    if (strcmp(lo, colon + 1) != 0)
      return USAGE_ERROR("--nnodes: '%s': elastic node ranges are not supported (give one count, e.g. --nnodes 2)", s);
    s = lo;
  }
  long long n;
  if (flags_int(s, 1, 65536, &n))
    return USAGE_ERROR("--nnodes: '%s' is not a positive node count (e.g. --nnodes 2)", v->raw);
  o->nnodes = (int)n;
  return 0;
}

/* --nproc-per-node K, or auto / cpu: one worker per usable core. */
static int read_nproc(const flag_value *v, options *o) {
  long long n = 1;
  if (v->given && (strcmp(v->raw, "auto") == 0 || strcmp(v->raw, "cpu") == 0))
    n = dt_usable_cores() < MAX_NPROC ? dt_usable_cores() : MAX_NPROC;
  else if (v->given && flags_int(v->raw, 1, MAX_NPROC, &n))
    return USAGE_ERROR("--nproc-per-node: '%s' is not a worker count (1-%d, 'auto' or 'cpu')", v->raw, MAX_NPROC);
  o->nproc = (int)n;
  return 0;
}

static int read_run_id(const flag_value *v, options *o) {
  o->run_id = v->raw;
  if (!o->run_id) return 0;
  if (strlen(o->run_id) > 100) return USAGE_ERROR("--run-id: longer than 100 characters");
  for (const char *p = o->run_id; *p; p++)
    if (*p <= ' ' || *p == 127 || *p == '/')
      return USAGE_ERROR("--run-id: '%s' has a space, control character or '/'", o->run_id);
  return 0;
}

/* The flags that are plain values; --timeout defaults to DT_TIMEOUT. */
static int read_values(const flag_value *v, options *o) {
  if (v[F_NODE_RANK].given && v[F_NODE_RANK].i >= o->nnodes)
    return USAGE_ERROR("--node-rank %lld is out of range for --nnodes %d (0 .. %d)", v[F_NODE_RANK].i, o->nnodes,
                       o->nnodes - 1);
  o->node_rank = (int)v[F_NODE_RANK].i;
  o->master_addr = v[F_MASTER_ADDR].raw;
  o->master_port = (int)v[F_MASTER_PORT].i;
  o->max_restarts = (int)v[F_MAX_RESTARTS].i;
  o->monitor_interval = v[F_MONITOR].given ? v[F_MONITOR].f : 0.1;
  o->log_dir = v[F_LOG_DIR].raw;
  o->secret_file = v[F_SECRET_FILE].raw;
  o->threads = (int)v[F_THREADS].i;
  o->bind = v[F_BIND].given ? v[F_BIND].choice : BIND_AUTO;
  o->grace = v[F_GRACE].given ? v[F_GRACE].f : 5;
  o->timeout = v[F_TIMEOUT].f;
  long t;
  if (!v[F_TIMEOUT].given && (dt_tunable_int("DT_TIMEOUT", &t) != DT_OK || t <= 0)) {
    fprintf(stderr, "dtrun: DT_TIMEOUT=%s is not a positive number of seconds\n", getenv("DT_TIMEOUT"));
    return EXIT_USAGE;
  }
  if (!v[F_TIMEOUT].given) o->timeout = (double)t;
  return 0;
}

/* Flags that need or exclude each other. */
static int check_combinations(const flag_value *v, options *o) {
  if (v[F_STANDALONE].given) {
    if (o->nnodes != 1)
      return USAGE_ERROR("--standalone runs one node; it cannot be combined with --nnodes %d", o->nnodes);
    if (v[F_MASTER_ADDR].given || v[F_MASTER_PORT].given || v[F_NODE_RANK].given)
      return USAGE_ERROR("--standalone picks its own address and port; drop --master-addr/--master-port/--node-rank");
    o->standalone = 1;
  }
  if (o->nnodes > 1) {
    if (!v[F_NODE_RANK].given)
      return USAGE_ERROR("--nnodes %d needs --node-rank (0 .. %d) on every node", o->nnodes, o->nnodes - 1);
    if (!v[F_MASTER_ADDR].given)
      return USAGE_ERROR("--nnodes %d needs --master-addr (the address of node 0)", o->nnodes);
    if (!v[F_MASTER_PORT].given)
      return USAGE_ERROR("--nnodes %d needs --master-port (the store's port on node 0)", o->nnodes);
  } else if (!v[F_MASTER_PORT].given) {
    o->standalone = 1; /* one node, no fixed port: torchrun --standalone */
  }
  if (!o->master_addr) o->master_addr = "127.0.0.1";
  if ((size_t)o->nnodes * (size_t)o->nproc > INT_MAX / 2)
    return USAGE_ERROR("--nnodes * --nproc-per-node is too large");
  return 0;
}

/* Parses argv into o. Returns -1 to go on, else the exit code (help: 0; error: 2). */
static int parse_args(int argc, char **argv, options *o) {
  flag_args a;
  memset(o, 0, sizeof *o);
  int rc = flags_parse(&dtrun_flags, argc - 1, argv + 1, &a);
  if (rc == FLAGS_HELP) {
    print_help(stdout);
    return 0;
  }
  if (rc) return rc;
  if ((rc = read_nnodes(&a.v[F_NNODES], o)) || (rc = read_values(a.v, o)) || (rc = read_nproc(&a.v[F_NPROC], o)))
    return rc;
  if ((rc = read_run_id(&a.v[F_RUN_ID], o)) || (rc = check_combinations(a.v, o))) return rc;
  int i = 1 + a.rest;
  if (i >= argc) return USAGE_ERROR("no program to run (usage: dtrun [flags] -- PROGRAM [ARGS...])");
  if (argv[i][0] == '\0') return USAGE_ERROR("the program name is empty");
  o->prog = &argv[i];
  return -1;
}

/* ---- signals ------------------------------------------------------------------ */
static volatile sig_atomic_t g_signal;       /* first SIGINT/SIGTERM received */
static volatile sig_atomic_t g_signal_count; /* how many */
static int g_wake[2] = {-1, -1};             /* self-pipe: a signal wakes the poll loop */

static void on_signal(int sig) {
  int saved = errno;
  if (sig == SIGINT || sig == SIGTERM) {
    if (!g_signal) g_signal = sig;
    g_signal_count++;
  }
  if (g_wake[1] >= 0) {
    char c = 0;
    ssize_t r = write(g_wake[1], &c, 1);
    (void)r;
  }
  errno = saved;
}

static int setup_signals(void) {
  if (pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

static const char *signal_name(int sig) {
  static const struct { int sig; const char *name; } names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].sig == sig) return names[i].name;
  static char buf[32];
  snprintf(buf, sizeof buf, "signal %d", sig);
  return buf;
}

/* ---- workers and their output --------------------------------------------------- */
typedef struct stream {
  int fd;     /* read end of the worker's pipe; -1 when closed */
  int out_fd; /* 1 or 2: where prefixed lines go */
  int log_fd; /* --log-dir file, or -1 */
  char line[LINE_CAP];
  size_t len; /* bytes of the unfinished line */
} stream;

typedef struct worker {
  int local_rank, rank;
  pid_t pid;   /* also its process group */
  int running; /* started and not yet exited */
  int zombie;  /* exited, left unreaped until its group is swept or dtrun finishes (see observe_exit) */
  int status;  /* wait status once exited */
  stream s[2]; /* stdout, stderr */
  char ring[RING_LINES][RING_WIDTH];
  int ring_next, ring_count;
} worker;

/* Prefixed lines waiting to be written to fd 1 / 2; only whole lines are written. */
typedef struct outbuf {
  char buf[1 << 16];
  size_t len;
} outbuf;

typedef enum outcome { OC_OK, OC_LOCAL_FAIL, OC_REMOTE_FAIL, OC_INTERRUPTED, OC_ABORTED, OC_STORE_LOST, OC_TIMEOUT } outcome;

typedef struct agent {
  options o;
  int world_size;
  char run_id[128];
  char secret[DT_SECRET_MAX_CHARS + 1]; /* "" = none; never printed */
  char store_addr[256]; /* what workers get as MASTER_ADDR */
  int store_port;
  dt_store_server *server;
  dt_store *store; /* NULL on one node: the agents need no agreement */
  int threads_omp, threads_dt;
  int bind_threads; /* cores per worker under --bind-to core */
  int bind;         /* BIND_NONE or BIND_CORE: --bind-to, auto decided */
  const char *omp_user, *dt_threads_user, *wait_policy_user;
  int round;
  worker *w;
  outbuf out[2];
  int failed; /* index of the failed worker (OC_LOCAL_FAIL) */
  char remote[512]; /* text of a failure or abort reported by another node */
} agent;

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t r = write(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        poll(&pf, 1, 100);
        continue;
      }
      return; /* closed stdout: nothing more to do */
    }
    p += r;
    n -= (size_t)r;
  }
}

static void out_flush(agent *a, int i) {
  write_all(i + 1, a->out[i].buf, a->out[i].len);
  a->out[i].len = 0;
}

/* One whole worker line (without its newline): into the ring, and printed with its prefix. */
static void line_done(agent *a, worker *w, stream *s) {
  size_t n = s->len;
  if (n > 0 && s->line[n - 1] == '\n') n--;
  size_t keep = n < RING_WIDTH - 1 ? n : RING_WIDTH - 1;
  memcpy(w->ring[w->ring_next], s->line, keep);
  w->ring[w->ring_next][keep] = '\0';
  w->ring_next = (w->ring_next + 1) % RING_LINES;
  if (w->ring_count < RING_LINES) w->ring_count++;
  if (s->log_fd < 0) {
    int i = s->out_fd - 1;
    char prefix[32];
    int pn = snprintf(prefix, sizeof prefix, "[rank %d]: ", w->rank);
    outbuf *ob = &a->out[i];
    if (ob->len + (size_t)pn + n + 1 > sizeof ob->buf) out_flush(a, i);
    if ((size_t)pn + n + 1 > sizeof ob->buf) { /* cannot happen: LINE_CAP < buffer */
      write_all(s->out_fd, prefix, (size_t)pn);
      write_all(s->out_fd, s->line, n);
      write_all(s->out_fd, "\n", 1);
    } else {
      memcpy(ob->buf + ob->len, prefix, (size_t)pn);
      memcpy(ob->buf + ob->len + pn, s->line, n);
      ob->buf[ob->len + pn + n] = '\n';
      ob->len += (size_t)pn + n + 1;
    }
  }
  s->len = 0;
}

static void stream_feed(agent *a, worker *w, stream *s, const char *p, size_t n) {
  if (s->log_fd >= 0) write_all(s->log_fd, p, n);
  while (n > 0) {
    const char *nl = memchr(p, '\n', n);
    size_t want = nl ? (size_t)(nl - p) + 1 : n;
    size_t room = LINE_CAP - s->len;
    size_t take = want < room ? want : room;
    memcpy(s->line + s->len, p, take);
    s->len += take;
    p += take;
    n -= take;
    if ((nl && take == want) || s->len == LINE_CAP) line_done(a, w, s);
  }
}

static void stream_close(agent *a, worker *w, stream *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  if (s->len > 0) line_done(a, w, s); /* a partial last line */
  if (s->log_fd >= 0) close(s->log_fd);
  s->log_fd = -1;
}

/* Reads what is there; on EOF or error closes the stream. Returns bytes read. */
static ssize_t stream_read(agent *a, worker *w, stream *s) {
  static char buf[READ_CHUNK];
  ssize_t r = read(s->fd, buf, sizeof buf);
  if (r > 0) {
    stream_feed(a, w, s, buf, (size_t)r);
  } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
    stream_close(a, w, s);
  }
  return r;
}

/* Waits up to timeout_s for output or a signal, and handles the output that came. */
static void pump(agent *a, double timeout_s) {
  int n = a->o.nproc;
  static struct pollfd pf[1 + 2 * MAX_NPROC];
  static worker *who[1 + 2 * MAX_NPROC];
  static stream *which[1 + 2 * MAX_NPROC];
  int k = 0;
  pf[k++] = (struct pollfd){.fd = g_wake[0], .events = POLLIN};
  for (int i = 0; i < n; i++)
    for (int j = 0; j < 2; j++)
      if (a->w[i].s[j].fd >= 0) {
        who[k] = &a->w[i];
        which[k] = &a->w[i].s[j];
        pf[k++] = (struct pollfd){.fd = a->w[i].s[j].fd, .events = POLLIN};
      }
  int ms = timeout_s <= 0 ? 0 : (int)ceil(timeout_s * 1000.0);
  if (g_signal) ms = 0;
  int r = poll(pf, (nfds_t)k, ms);
  if (r > 0) {
    if (pf[0].revents) {
      char junk[64];
      while (read(g_wake[0], junk, sizeof junk) > 0) {}
    }
    for (int i = 1; i < k; i++)
      if (pf[i].revents) stream_read(a, who[i], which[i]);
  }
  out_flush(a, 0);
  out_flush(a, 1);
}

/* Whether worker pid has exited (wait status in *status), without reaping it:
 * the zombie keeps its pid, and so its process group id, from being reused
 * until stop_workers has swept the group (or, after a run where every worker
 * exited 0, until finish). Reaped at once, the id of a group left empty could
 * go to an unrelated process group before the sweep's kill(-pid) (a round can
 * last hours). */
static int observe_exit(pid_t pid, int block, int *status) {
  siginfo_t si;
  memset(&si, 0, sizeof si);
  int flags = WEXITED | WNOWAIT | (block ? 0 : WNOHANG);
  while (waitid(P_PID, (id_t)pid, &si, flags) != 0)
    if (errno != EINTR) return 0;
  if (si.si_pid != pid) return 0;
  if (si.si_code == CLD_EXITED)
    *status = W_EXITCODE(si.si_status & 0xff, 0);
  else
    *status = W_EXITCODE(0, si.si_status) | (si.si_code == CLD_DUMPED ? WCOREFLAG : 0);
  return 1;
}

/* Notes exited workers; their remaining output is read and their pipes closed
 * (a grandchild may hold a pipe open: we do not wait for its EOF). */
static void reap(agent *a) {
  for (int i = 0; i < a->o.nproc; i++) {
    worker *w = &a->w[i];
    if (!w->running) continue;
    int st;
    if (!observe_exit(w->pid, 0, &st)) continue;
    w->running = 0;
    w->zombie = 1;
    w->status = st;
    for (int j = 0; j < 2; j++)
      while (w->s[j].fd >= 0 && stream_read(a, w, &w->s[j]) > 0) {}
    for (int j = 0; j < 2; j++) stream_close(a, w, &w->s[j]);
  }
  out_flush(a, 0);
  out_flush(a, 1);
}

static int any_running(const agent *a) {
  for (int i = 0; i < a->o.nproc; i++)
    if (a->w[i].running) return 1;
  return 0;
}

static int worker_failed(const worker *w) {
  return !w->running && w->pid > 0 && !(WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0);
}

/* "rank 1 (local 1, node 0, pid 123) exited with code 3" */
static void describe_exit(const agent *a, const worker *w, char *buf, size_t len) {
  int n = snprintf(buf, len, "rank %d (local %d, node %d, pid %d) ", w->rank, w->local_rank, a->o.node_rank,
                   (int)w->pid);
  if (n < 0 || (size_t)n >= len) return;
  if (WIFEXITED(w->status))
    snprintf(buf + n, len - (size_t)n, "exited with code %d", WEXITSTATUS(w->status));
  else if (WIFSIGNALED(w->status))
    snprintf(buf + n, len - (size_t)n, "was killed by signal %s", signal_name(WTERMSIG(w->status)));
  else
    snprintf(buf + n, len - (size_t)n, "ended with wait status %d", w->status);
}

/* Reaps the workers seen to exit (observe_exit leaves them zombies, so that their pids and process group ids stay
 * ours until the sweep): dtrun's parent may be an init that never reaps what it inherits (a container's). */
static void release_zombies(agent *a) {
  for (int i = 0; i < a->o.nproc; i++)
    if (a->w[i].zombie) {
      while (waitpid(a->w[i].pid, NULL, 0) < 0 && errno == EINTR) {}
      a->w[i].zombie = 0;
    }
}

/* Stops every worker: sig to each process group, SIGKILL after the grace
 * period (or at once on a second interrupt), then reaps them all and kills
 * whatever is left in their groups (no orphans). */
static void stop_workers(agent *a, int sig) {
  int n = a->o.nproc;
  if (!any_running(a)) goto sweep;
  for (int i = 0; i < n; i++)
    if (a->w[i].running) kill(-a->w[i].pid, sig);
  sig_atomic_t seen = g_signal_count;
  double deadline = dt_time_now() + a->o.grace;
  while (any_running(a) && dt_time_now() < deadline && g_signal_count == seen) {
    double left = deadline - dt_time_now();
    pump(a, left < 0.05 ? left : 0.05);
    reap(a);
  }
  if (any_running(a)) {
    fprintf(stderr, "dtrun: %s; sending SIGKILL\n",
            g_signal_count != seen ? "interrupted while stopping the workers" : "workers still running after the grace period");
    for (int i = 0; i < n; i++)
      if (a->w[i].running) kill(-a->w[i].pid, SIGKILL);
    while (any_running(a)) {
      pump(a, 0.02);
      reap(a);
    }
  }
sweep:
  /* Every worker's pid is still held (running or a zombie): its group id
   * cannot belong to anyone else yet. Kill what is left in the groups, then
   * reap. */
  for (int i = 0; i < n; i++)
    if (a->w[i].pid > 0) kill(-a->w[i].pid, SIGKILL);
  release_zombies(a);
}

/* ---- starting workers ---------------------------------------------------------------- */
static const char *const overridden[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "DT_RUN_ID", "TORCHELASTIC_RUN_ID",
    "DT_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "DT_STORE_SERVED",
    "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS", "DT_NUM_THREADS", "OMP_WAIT_POLICY", "DT_JOB_SECRET",
};

static int is_overridden(const char *entry) {
  for (size_t i = 0; i < sizeof overridden / sizeof overridden[0]; i++) {
    size_t n = strlen(overridden[i]);
    if (strncmp(entry, overridden[i], n) == 0 && entry[n] == '=') return 1;
  }
  return 0;
}

static char *xstrdup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xstrdup_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[1024];
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  char *s = strdup(tmp);
  if (!s) {
    fprintf(stderr, "dtrun: out of memory\n");
    exit(EXIT_FAIL);
  }
  return s;
}

/* The environment of worker w: ours, plus everything inherited that we do not set. */
static char **worker_env(const agent *a, const worker *w) {
  size_t n_env = 0;
  while (environ[n_env]) n_env++;
  char **env = calloc(n_env + 32, sizeof *env);
  if (!env) {
    fprintf(stderr, "dtrun: out of memory\n");
    exit(EXIT_FAIL);
  }
  size_t k = 0;
  for (size_t i = 0; i < n_env; i++)
    if (!is_overridden(environ[i])) env[k++] = environ[i];
  const options *o = &a->o;
  env[k++] = xstrdup_printf("RANK=%d", w->rank);
  env[k++] = xstrdup_printf("LOCAL_RANK=%d", w->local_rank);
  env[k++] = xstrdup_printf("WORLD_SIZE=%d", a->world_size);
  env[k++] = xstrdup_printf("LOCAL_WORLD_SIZE=%d", o->nproc);
  env[k++] = xstrdup_printf("GROUP_RANK=%d", o->node_rank);
  env[k++] = xstrdup_printf("GROUP_WORLD_SIZE=%d", o->nnodes);
  env[k++] = xstrdup_printf("ROLE_RANK=%d", w->rank);
  env[k++] = xstrdup_printf("ROLE_WORLD_SIZE=%d", a->world_size);
  env[k++] = xstrdup_printf("ROLE_NAME=default");
  env[k++] = xstrdup_printf("MASTER_ADDR=%s", a->store_addr);
  env[k++] = xstrdup_printf("MASTER_PORT=%d", a->store_port);
  env[k++] = xstrdup_printf("DT_RUN_ID=%s", a->run_id);
  env[k++] = xstrdup_printf("TORCHELASTIC_RUN_ID=%s", a->run_id);
  env[k++] = xstrdup_printf("DT_RESTART_COUNT=%d", a->round);
  env[k++] = xstrdup_printf("TORCHELASTIC_RESTART_COUNT=%d", a->round);
  env[k++] = xstrdup_printf("TORCHELASTIC_MAX_RESTARTS=%d", o->max_restarts);
  env[k++] = xstrdup_printf("DT_STORE_SERVED=1");
  if (a->secret[0]) env[k++] = xstrdup_printf("DT_JOB_SECRET=%s", a->secret);
  env[k++] = xstrdup_printf("TORCHELASTIC_USE_AGENT_STORE=True");
  if (a->omp_user && !o->threads)
    env[k++] = xstrdup_printf("OMP_NUM_THREADS=%s", a->omp_user);
  else
    env[k++] = xstrdup_printf("OMP_NUM_THREADS=%d", a->threads_omp);
  if (a->dt_threads_user && !o->threads)
    env[k++] = xstrdup_printf("DT_NUM_THREADS=%s", a->dt_threads_user);
  else
    env[k++] = xstrdup_printf("DT_NUM_THREADS=%d", a->threads_dt);
  env[k++] = xstrdup_printf("OMP_WAIT_POLICY=%s", a->wait_policy_user ? a->wait_policy_user : "passive");
  env[k] = NULL;
  return env;
}

static void worker_env_free(char **env) {
  /* Inherited entries with our names were left out: those left are ours. */
  for (size_t i = 0; env[i]; i++)
    if (is_overridden(env[i])) free(env[i]);
  free(env);
}

static int open_log(const agent *a, const worker *w, const char *ext) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%d/rank%d.%s", a->o.log_dir, a->round, w->rank, ext);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fprintf(stderr, "dtrun: --log-dir: cannot create %s: %s\n", path, strerror(errno));
  return fd;
}

/* mkdir -p (dt_mkdir_p) of a --log-dir path we may write into; 0 or -1 with a message. */
static int make_dirs(const char *path) {
  if (strlen(path) >= PATH_MAX) {
    fprintf(stderr, "dtrun: --log-dir: path too long\n");
    return -1;
  }
  struct stat st;
  if (dt_mkdir_p(path, 0755) != DT_OK) {
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
      fprintf(stderr, "dtrun: --log-dir: %s is not a directory\n", path);
    else
      fprintf(stderr, "dtrun: --log-dir: %s\n", dt_last_error());
    return -1;
  }
  if (access(path, W_OK | X_OK) != 0) {
    fprintf(stderr, "dtrun: --log-dir: cannot write to %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* --bind-to core: the CPUs of local worker `local` (cpu_bind_worker). 0 under --bind-to none: the worker keeps
 * dtrun's CPUs. */
static int worker_cores(const agent *a, int local, cpu_set_t *out) {
  if (a->bind != BIND_CORE) return 0;
  if (!cpu_bind_worker(local, a->bind_threads, out)) {
    static int said;
    if (!said++)
      fprintf(stderr, "dtrun: --bind-to core: cannot read this process's cores (%s); workers run unbound\n",
              strerror(errno));
    return 0;
  }
  return 1;
}

/* Starts one worker. 0, or -1 with a message (exec failure reported by the child). */
static int start_worker(agent *a, worker *w) {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
  w->s[0].log_fd = w->s[1].log_fd = -1;
  if (a->o.log_dir) {
    if ((w->s[0].log_fd = open_log(a, w, "out")) < 0) return -1;
    if ((w->s[1].log_fd = open_log(a, w, "err")) < 0) {
      close(w->s[0].log_fd);
      w->s[0].log_fd = -1;
      return -1;
    }
  }
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(exec_pipe, O_CLOEXEC)) {
    fprintf(stderr, "dtrun: pipe: %s\n", strerror(errno));
    goto fail;
  }
  char **env = worker_env(a, w);
  cpu_set_t cores;
  const int bind = worker_cores(a, w->local_rank, &cores);
  fflush(stdout);
  fflush(stderr);
  pid_t agent_pid = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "dtrun: fork: %s\n", strerror(errno));
    worker_env_free(env);
    goto fail;
  }
  if (pid == 0) {
    /* Child: only async-signal-safe calls until exec (the store server runs a thread). */
    setpgid(0, 0);
#ifdef PR_SET_PDEATHSIG
    /* An agent killed outright (SIGKILL, OOM) takes its workers with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != agent_pid) _exit(127);
#endif
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL); /* ignored dispositions survive exec */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (bind && sched_setaffinity(0, sizeof cores, &cores) != 0) {
      int e = -errno; /* negative: the binding failed, not exec */
      ssize_t r = write(exec_pipe[1], &e, sizeof e);
      (void)r;
      _exit(127);
    }
    dup2(out[1], 1);
    dup2(err[1], 2);
    environ = env;
    execvp(a->o.prog[0], a->o.prog);
    int e = errno;
    ssize_t r = write(exec_pipe[1], &e, sizeof e);
    (void)r;
    _exit(127);
  }
  setpgid(pid, pid); /* also here: no race with an early kill(-pid) */
  worker_env_free(env);
  close(out[1]);
  close(err[1]);
  close(exec_pipe[1]);
  int e = 0;
  ssize_t r;
  do r = read(exec_pipe[0], &e, sizeof e);
  while (r < 0 && errno == EINTR);
  close(exec_pipe[0]);
  w->pid = pid;
  w->running = 1;
  w->s[0].fd = out[0];
  w->s[1].fd = err[0];
  w->s[0].out_fd = 1;
  w->s[1].out_fd = 2;
  w->s[0].len = w->s[1].len = 0;
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
  if (r == (ssize_t)sizeof e) {
    if (e < 0)
      fprintf(stderr, "dtrun: cannot bind local worker %d to its cores (--bind-to core): %s\n", w->local_rank,
              strerror(-e));
    else
      fprintf(stderr, "dtrun: cannot run '%s': %s\n", a->o.prog[0], strerror(e));
    int st = 0;
    observe_exit(pid, 1, &st); /* reaped by stop_workers after its sweep */
    w->running = 0;
    w->zombie = 1;
    w->status = st;
    for (int j = 0; j < 2; j++) stream_close(a, w, &w->s[j]);
    return -1;
  }
  return 0;
fail:
  for (int j = 0; j < 2; j++) {
    if (out[j] >= 0) close(out[j]);
    if (err[j] >= 0) close(err[j]);
    if (exec_pipe[j] >= 0) close(exec_pipe[j]);
    if (w->s[j].log_fd >= 0) close(w->s[j].log_fd);
    w->s[j].log_fd = -1;
  }
  return -1;
}

static int start_workers(agent *a) {
  if (a->o.log_dir) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%d", a->o.log_dir, a->round);
    if (make_dirs(dir)) return -1;
  }
  for (int i = 0; i < a->o.nproc; i++) {
    worker *w = &a->w[i];
    memset(w, 0, sizeof *w);
    w->local_rank = i;
    w->rank = a->o.node_rank * a->o.nproc + i;
    w->s[0].fd = w->s[1].fd = -1;
    w->s[0].log_fd = w->s[1].log_fd = -1;
  }
  for (int i = 0; i < a->o.nproc; i++)
    if (start_worker(a, &a->w[i])) return -1;
  return 0;
}

/* ---- agreement between nodes through the store ------------------------------------------ */
static void key_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void key_fmt(char *buf, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, len, fmt, ap);
  va_end(ap);
}

static void store_lost(agent *a) {
  snprintf(a->remote, sizeof a->remote, "lost the rendezvous store at %s:%d (%s: %s)", a->o.master_addr,
           a->store_port, dt_status_name(DT_PEER_LOST), dt_last_error());
}

/* 1 present, 0 absent, -1 store error (a->remote says so). */
static int key_present(agent *a, const char *key) {
  int present = 0;
  if (dt_store_check(a->store, &key, 1, &present) != DT_OK) {
    store_lost(a);
    return -1;
  }
  return present;
}

static int key_set(agent *a, const char *key, const char *value) {
  if (dt_store_set(a->store, key, value, strlen(value)) != DT_OK) {
    store_lost(a);
    return -1;
  }
  return 0;
}

/* Copies the text value of key (which exists) into buf. */
static int key_get(agent *a, const char *key, char *buf, size_t len) {
  void *v = NULL;
  size_t n = 0;
  if (dt_store_get(a->store, key, &v, &n, 0) != DT_OK) {
    store_lost(a);
    return -1;
  }
  if (n >= len) n = len - 1;
  memcpy(buf, v, n);
  buf[n] = '\0';
  dt_free(v);
  return 0;
}

/* The job-wide abort key: set by a node that was interrupted or cannot go on. */
static outcome check_abort(agent *a) {
  int p = key_present(a, "dtrun/abort");
  if (p < 0) return OC_STORE_LOST;
  if (p == 0) return OC_OK;
  if (key_get(a, "dtrun/abort", a->remote, sizeof a->remote)) return OC_STORE_LOST;
  return OC_ABORTED;
}

static void set_abort(agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_abort(agent *a, const char *fmt, ...) {
  if (!a->store) return;
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  key_set(a, "dtrun/abort", text);
}

/* Keys "<fmt with node>" for every node. */
static char **node_keys(const agent *a, const char *fmt) __attribute__((format(printf, 2, 0)));
static char **node_keys(const agent *a, const char *fmt) {
  char **keys = calloc((size_t)a->o.nnodes, sizeof *keys);
  if (!keys) exit(EXIT_FAIL);
  for (int n = 0; n < a->o.nnodes; n++) keys[n] = xstrdup_printf(fmt, a->round, n);
  return keys;
}

static void keys_free(const agent *a, char **keys) {
  for (int n = 0; n < a->o.nnodes; n++) free(keys[n]);
  free(keys);
}

/* Comma-separated nodes whose key is missing ("1, 3"). */
static void missing_nodes(agent *a, char **keys, char *buf, size_t len) {
  size_t k = 0;
  buf[0] = '\0';
  for (int n = 0; n < a->o.nnodes && k + 16 < len; n++)
    if (key_present(a, keys[n]) == 0) k += (size_t)snprintf(buf + k, len - k, "%s%d", k ? ", " : "", n);
}

/* Waits until every key exists, polling each monitor interval; watches the
 * abort key and signals. OC_TIMEOUT at the deadline. */
static outcome wait_keys(agent *a, char **keys, double deadline) {
  for (;;) {
    int present = 0;
    if (dt_store_check(a->store, (const char *const *)keys, a->o.nnodes, &present) != DT_OK) {
      store_lost(a);
      return OC_STORE_LOST;
    }
    if (present) return OC_OK;
    outcome oc = check_abort(a);
    if (oc != OC_OK) return oc;
    if (g_signal) return OC_INTERRUPTED;
    if (dt_time_now() >= deadline) return OC_TIMEOUT;
    pump(a, a->o.monitor_interval);
    if (g_signal) return OC_INTERRUPTED;
  }
}

/* Joins the other agents: unique node ranks, same --nnodes, --nproc-per-node
 * and --max-restarts everywhere. 0 or an exit code. */
static int join_nodes(agent *a) {
  const options *o = &a->o;
  char key[128], mine[128], theirs[128];
  snprintf(mine, sizeof mine, "nnodes=%d nproc=%d max_restarts=%d", o->nnodes, o->nproc, o->max_restarts);
  key_fmt(key, sizeof key, "dtrun/node/%d/claim", o->node_rank);
  int64_t claims = 0;
  if (dt_store_add(a->store, key, 1, &claims) != DT_OK) {
    store_lost(a);
    fprintf(stderr, "dtrun: %s\n", a->remote);
    return EXIT_FAIL;
  }
  if (claims != 1) {
    fprintf(stderr, "dtrun: node rank %d is already taken by another agent of run '%s' (give each node its own --node-rank)\n",
            o->node_rank, a->run_id);
    return EXIT_FAIL;
  }
  key_fmt(key, sizeof key, "dtrun/r0/node/%d", o->node_rank);
  if (key_set(a, key, mine)) {
    fprintf(stderr, "dtrun: %s\n", a->remote);
    return EXIT_FAIL;
  }
  char **keys = node_keys(a, "dtrun/r%d/node/%d");
  outcome oc = wait_keys(a, keys, dt_time_now() + o->timeout);
  int rc = 0;
  if (oc == OC_TIMEOUT) {
    char miss[256];
    missing_nodes(a, keys, miss, sizeof miss);
    fprintf(stderr, "dtrun: not every node joined within %g s (missing node %s of --nnodes %d; raise --timeout?)\n",
            o->timeout, miss, o->nnodes);
    set_abort(a, "node %d gave up waiting for node %s to join", o->node_rank, miss);
    rc = EXIT_FAIL;
  } else if (oc == OC_INTERRUPTED) {
    rc = 128 + g_signal;
  } else if (oc != OC_OK) {
    fprintf(stderr, "dtrun: %s\n", a->remote);
    rc = EXIT_FAIL;
  } else {
    for (int n = 0; n < o->nnodes && !rc; n++) {
      if (key_get(a, keys[n], theirs, sizeof theirs)) {
        fprintf(stderr, "dtrun: %s\n", a->remote);
        rc = EXIT_FAIL;
      } else if (strcmp(theirs, mine) != 0) {
        fprintf(stderr, "dtrun: node %d runs with %s, this node (%d) with %s: every node must give the same "
                        "--nnodes, --nproc-per-node and --max-restarts\n",
                n, theirs, o->node_rank, mine);
        rc = EXIT_FAIL;
      }
    }
  }
  keys_free(a, keys);
  return rc;
}

/* ---- watching one round ---------------------------------------------------------------- */
static outcome monitor(agent *a) {
  char key[128];
  int done_set = 0;
  double done_deadline = 0, next_check = 0;
  char **done_keys = a->store ? node_keys(a, "dtrun/r%d/done/%d") : NULL;
  outcome oc = OC_OK;
  for (;;) {
    pump(a, a->o.monitor_interval);
    if (g_signal) {
      oc = OC_INTERRUPTED;
      break;
    }
    reap(a);
    int failed = -1;
    for (int i = 0; i < a->o.nproc && failed < 0; i++)
      if (worker_failed(&a->w[i])) failed = i;
    if (failed >= 0) {
      a->failed = failed;
      oc = OC_LOCAL_FAIL;
      break;
    }
    int all_ok = !any_running(a);
    if (!a->store) {
      if (all_ok) break;
      continue;
    }
    double now = dt_time_now();
    if (now < next_check && !(all_ok && !done_set)) continue;
    next_check = now + a->o.monitor_interval;
    if ((oc = check_abort(a)) != OC_OK) break;
    key_fmt(key, sizeof key, "dtrun/r%d/failed", a->round);
    int p = key_present(a, key);
    if (p < 0) {
      oc = OC_STORE_LOST;
      break;
    }
    if (p > 0) {
      oc = key_get(a, key, a->remote, sizeof a->remote) ? OC_STORE_LOST : OC_REMOTE_FAIL;
      break;
    }
    if (!all_ok) continue;
    if (!done_set) {
      key_fmt(key, sizeof key, "dtrun/r%d/done/%d", a->round, a->o.node_rank);
      if (key_set(a, key, "1")) {
        oc = OC_STORE_LOST;
        break;
      }
      done_set = 1;
      done_deadline = now + a->o.timeout;
    }
    int present = 0;
    if (dt_store_check(a->store, (const char *const *)done_keys, a->o.nnodes, &present) != DT_OK) {
      store_lost(a);
      oc = OC_STORE_LOST;
      break;
    }
    if (present) break;
    if (now >= done_deadline) {
      char miss[256];
      missing_nodes(a, done_keys, miss, sizeof miss);
      snprintf(a->remote, sizeof a->remote, "node %s did not finish within %g s of this node's workers (--timeout)",
               miss, a->o.timeout);
      oc = OC_TIMEOUT;
      break;
    }
  }
  if (done_keys) keys_free(a, done_keys);
  return oc;
}

static void print_summary(agent *a, const worker *w) {
  char what[256];
  describe_exit(a, w, what, sizeof what);
  fprintf(stderr, "dtrun: worker failed: %s\n", what);
  fprintf(stderr, "dtrun: restart count %d (--max-restarts %d), run id %s\n", a->round, a->o.max_restarts,
          a->run_id);
  if (w->ring_count == 0) {
    fprintf(stderr, "dtrun: rank %d wrote no output\n", w->rank);
    return;
  }
  fprintf(stderr, "dtrun: last %d line%s of rank %d:\n", w->ring_count, w->ring_count == 1 ? "" : "s", w->rank);
  int first = (w->ring_next - w->ring_count + RING_LINES) % RING_LINES;
  for (int i = 0; i < w->ring_count; i++)
    fprintf(stderr, "  [rank %d]: %s\n", w->rank, w->ring[(first + i) % RING_LINES]);
}

/* Node 0 keeps the store up until the others have read what they need (bounded). */
static void wait_for_nodes(agent *a, const char *fmt, double limit_s) {
  if (!a->store || a->o.node_rank != 0) return;
  char **keys = node_keys(a, fmt);
  double deadline = dt_time_now() + limit_s;
  for (;;) {
    int present = 0;
    if (dt_store_check(a->store, (const char *const *)keys, a->o.nnodes, &present) != DT_OK || present) break;
    if (dt_time_now() >= deadline || g_signal_count > 1) break;
    pump(a, a->o.monitor_interval);
  }
  keys_free(a, keys);
}

static void mark(agent *a, const char *fmt) {
  if (!a->store) return;
  char key[128];
  key_fmt(key, sizeof key, fmt, a->round, a->o.node_rank);
  key_set(a, key, "1");
}

static void random_run_id(char *buf, size_t len) {
  unsigned char b[6] = {0};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t r = fd >= 0 ? read(fd, b, sizeof b) : -1;
  if (fd >= 0) close(fd);
  if (r != (ssize_t)sizeof b) {
    uint64_t x = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(dt_time_now() * 1e9);
    memcpy(b, &x, sizeof b);
  }
  snprintf(buf, len, "dtrun-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5]);
}

/* The job secret: --secret-file, else DT_JOB_SECRET, else a fresh one on a
 * single node (--standalone), else none with a warning. 0 or an exit code. */
static int setup_secret(agent *a) {
  const options *o = &a->o;
  dt_status st = DT_OK;
  if (o->secret_file)
    st = dt_job_secret_read_file(o->secret_file, a->secret, sizeof a->secret);
  else
    st = dt_job_secret_from_env(a->secret, sizeof a->secret);
  if (st != DT_OK) {
    fprintf(stderr, "dtrun: %s%s\n", o->secret_file ? "--secret-file: " : "", dt_last_error());
    return EXIT_USAGE;
  }
  if (!a->secret[0] && o->standalone && (st = dt_job_secret_generate(a->secret, sizeof a->secret)) != DT_OK) {
    fprintf(stderr, "dtrun: cannot make a job secret: %s\n", dt_last_error());
    return EXIT_FAIL;
  }
  if (!a->secret[0])
    fprintf(stderr,
            "dtrun: warning: no job secret: the store on port %d is open to anyone who can reach it (as "
            "torchrun's is); give every node the same --secret-file PATH (mode 0600) or DT_JOB_SECRET\n",
            o->master_port);
  return 0;
}

/* Serves (node 0 / standalone) and connects to the store. 0 or an exit code. */
static int setup_store(agent *a) {
  const options *o = &a->o;
  dt_status st;
  if (o->standalone || o->node_rank == 0) {
    const char *host = o->standalone ? "127.0.0.1" : NULL; /* multi-node: every interface, as torchrun */
    int port = o->standalone ? 0 : o->master_port;
    if ((st = dt_store_server_start(host, port, a->run_id, a->secret, &a->server)) != DT_OK) {
      fprintf(stderr, "dtrun: cannot serve the store on %s:%d: %s (%s)%s\n", host ? host : "*", port,
              dt_last_error(), dt_status_name(st),
              port ? "; is another job using that port? pick another --master-port" : "");
      return EXIT_FAIL;
    }
    dt_store_server_set_background(a->server); /* beside the workers: strangers must not take their cores */
    a->store_port = dt_store_server_port(a->server);
  } else {
    a->store_port = o->master_port;
  }
  snprintf(a->store_addr, sizeof a->store_addr, "%s", o->standalone ? "127.0.0.1" : o->master_addr);
  if (o->nnodes == 1) return 0; /* one agent: nothing to agree on */

  /* Connect in short attempts so that Ctrl-C is honoured while node 0 is not up yet. */
  const char *host = o->node_rank == 0 ? "127.0.0.1" : o->master_addr;
  double deadline = dt_time_now() + o->timeout;
  for (;;) {
    double left = deadline - dt_time_now();
    if (g_signal) return 128 + g_signal;
    st = dt_store_connect(host, a->store_port, a->run_id, a->secret, left < 1.0 ? (left > 0.01 ? left : 0.01) : 1.0, &a->store);
    if (st == DT_OK) break;
    if (st != DT_TIMEOUT || dt_time_now() >= deadline) {
      fprintf(stderr, "dtrun: cannot reach the store of node 0 at %s:%d: %s (%s)%s\n", host, a->store_port,
              dt_last_error(), dt_status_name(st),
              st == DT_TIMEOUT ? "; is node 0 running? raise --timeout?" : "; do all nodes give the same --run-id?");
      return EXIT_FAIL;
    }
  }
  /* Reconnect with the full timeout as the default deadline of every request. */
  dt_store_close(a->store);
  a->store = NULL;
  if ((st = dt_store_connect(host, a->store_port, a->run_id, a->secret, o->timeout, &a->store)) != DT_OK) {
    fprintf(stderr, "dtrun: cannot reach the store at %s:%d: %s (%s)\n", host, a->store_port, dt_last_error(),
            dt_status_name(st));
    return EXIT_FAIL;
  }
  return join_nodes(a);
}

static int finish(agent *a, int rc) {
  if (a->w) release_zombies(a); /* after a run where every worker exited 0 (the others swept them already) */
  memset(a->secret, 0, sizeof a->secret);
  if (a->store) dt_store_close(a->store);
  if (a->server) dt_store_server_stop(a->server);
  free(a->w);
  return rc;
}

int main(int argc, char **argv) {
  static agent ag;
  agent *a = &ag;
  int rc = parse_args(argc, argv, &a->o);
  if (rc >= 0) return rc;
  const options *o = &a->o;
  signal(SIGXFSZ, SIG_IGN); /* inherited by the workers: an oversized write fails with EFBIG, not the process */
  if (setup_signals()) {
    fprintf(stderr, "dtrun: pipe: %s\n", strerror(errno));
    return EXIT_FAIL;
  }
  a->world_size = o->nnodes * o->nproc;
  if (o->run_id) {
    snprintf(a->run_id, sizeof a->run_id, "%s", o->run_id);
  } else if (o->standalone) {
    random_run_id(a->run_id, sizeof a->run_id);
  } else {
    const char *env_id = NULL;
    if (dt_tunable_str("DT_RUN_ID", &env_id) != DT_OK || !env_id) env_id = "default";
    snprintf(a->run_id, sizeof a->run_id, "%s", env_id);
  }
  int cores = dt_usable_cores();
  int budget = o->threads ? o->threads : (cores / o->nproc > 1 ? cores / o->nproc : 1);
  a->threads_omp = a->threads_dt = budget;
  const char *v = getenv("OMP_NUM_THREADS");
  a->omp_user = v && *v ? v : NULL;
  v = getenv("DT_NUM_THREADS");
  a->dt_threads_user = v && *v ? v : NULL;
  long long t;
  if (!o->threads && !a->dt_threads_user && a->omp_user && flags_int(a->omp_user, 1, 65536, &t) == 0)
    a->threads_dt = (int)t; /* keep the two budgets the same */
  /* --bind-to core: a core per compute thread the worker will run (DT_NUM_THREADS as it receives it) */
  a->bind_threads = a->threads_dt;
  if (!o->threads && a->dt_threads_user && flags_int(a->dt_threads_user, 1, 65536, &t) == 0) a->bind_threads = (int)t;
  /* auto: workers that fill the CPUs run bound, each with its helper threads on its own cores (unbound, the
   * kernel moved them about and a worker's loader or communication thread took the other worker's core:
   * the default mlp's DDP x2 ran 124-177k samples/s unbound, 174-189k bound; docs/benchmarks.md) */
  a->bind = o->bind;
  if (a->bind == BIND_AUTO) a->bind = cpu_bind_auto(o->nproc, a->bind_threads, cores) ? BIND_CORE : BIND_NONE;
  v = getenv("OMP_WAIT_POLICY");
  a->wait_policy_user = v && *v ? v : NULL;
  a->w = calloc((size_t)o->nproc, sizeof *a->w);
  if (!a->w) {
    fprintf(stderr, "dtrun: out of memory for %d workers\n", o->nproc);
    return EXIT_FAIL;
  }
  if (o->log_dir && make_dirs(o->log_dir)) return finish(a, EXIT_FAIL);
  if ((rc = setup_secret(a)) != 0) return finish(a, rc);
  if ((rc = setup_store(a)) != 0) {
    if (g_signal) rc = 128 + g_signal;
    return finish(a, rc);
  }
  if (dt_log_get_level() >= DT_LOG_LEVEL_INFO)
    fprintf(stderr, "dtrun: run %s, node %d of %d, %d workers per node, store %s:%d\n", a->run_id, o->node_rank,
            o->nnodes, o->nproc, a->store_addr, a->store_port);

  for (a->round = 0;; a->round++) {
    outcome oc = OC_OK;
    if (a->store) { /* every node has stopped the previous round and is ready */
      mark(a, "dtrun/r%d/start/%d");
      char **keys = node_keys(a, "dtrun/r%d/start/%d");
      oc = wait_keys(a, keys, dt_time_now() + o->timeout);
      if (oc == OC_TIMEOUT) {
        char miss[256];
        missing_nodes(a, keys, miss, sizeof miss);
        snprintf(a->remote, sizeof a->remote, "node %s did not start restart round %d within %g s", miss, a->round,
                 o->timeout);
        set_abort(a, "node %d: %s", o->node_rank, a->remote);
      }
      keys_free(a, keys);
    }
    if (oc == OC_OK) {
      if (start_workers(a)) {
        stop_workers(a, SIGKILL);
        set_abort(a, "node %d could not start its workers", o->node_rank);
        mark(a, "dtrun/r%d/stopped/%d");
        wait_for_nodes(a, "dtrun/r%d/stopped/%d", o->grace + 2);
        return finish(a, g_signal ? 128 + g_signal : EXIT_FAIL);
      }
      oc = monitor(a);
    }
    switch (oc) {
    case OC_OK:
      mark(a, "dtrun/r%d/exit/%d");
      wait_for_nodes(a, "dtrun/r%d/exit/%d", o->timeout);
      return finish(a, g_signal ? 128 + g_signal : 0);
    case OC_INTERRUPTED:
      fprintf(stderr, "dtrun: received %s; stopping the workers\n", signal_name(g_signal));
      stop_workers(a, g_signal);
      set_abort(a, "node %d was interrupted by %s", o->node_rank, signal_name(g_signal));
      mark(a, "dtrun/r%d/stopped/%d");
      wait_for_nodes(a, "dtrun/r%d/stopped/%d", o->grace + 2);
      return finish(a, 128 + g_signal);
    case OC_ABORTED:
    case OC_STORE_LOST:
    case OC_TIMEOUT:
      fprintf(stderr, "dtrun: %s; stopping the workers\n", a->remote);
      stop_workers(a, SIGTERM);
      if (oc == OC_TIMEOUT) set_abort(a, "node %d: %s", o->node_rank, a->remote);
      if (oc != OC_STORE_LOST) mark(a, "dtrun/r%d/stopped/%d");
      wait_for_nodes(a, "dtrun/r%d/stopped/%d", o->grace + 2);
      return finish(a, g_signal ? 128 + g_signal : EXIT_FAIL);
    case OC_LOCAL_FAIL: {
      char what[256];
      describe_exit(a, &a->w[a->failed], what, sizeof what);
      if (a->store) {
        char key[128];
        int64_t nth = 0;
        key_fmt(key, sizeof key, "dtrun/r%d/nfail", a->round);
        if (dt_store_add(a->store, key, 1, &nth) == DT_OK && nth == 1) {
          key_fmt(key, sizeof key, "dtrun/r%d/failed", a->round);
          key_set(a, key, what);
        }
      }
      if (a->round < o->max_restarts)
        fprintf(stderr, "dtrun: worker failed: %s; stopping the workers\n", what);
      stop_workers(a, SIGTERM);
      break;
    }
    case OC_REMOTE_FAIL:
      fprintf(stderr, "dtrun: a worker on another node failed: %s; stopping the workers\n", a->remote);
      stop_workers(a, SIGTERM);
      break;
    }
    mark(a, "dtrun/r%d/stopped/%d");
    if (g_signal) {
      set_abort(a, "node %d was interrupted by %s", o->node_rank, signal_name(g_signal));
      return finish(a, 128 + g_signal);
    }
    if (a->round < o->max_restarts) {
      fprintf(stderr, "dtrun: restarting the workers (restart %d of %d)\n", a->round + 1, o->max_restarts);
      continue;
    }
    if (oc == OC_LOCAL_FAIL) {
      print_summary(a, &a->w[a->failed]);
    } else {
      fprintf(stderr, "dtrun: worker failed on another node: %s\n", a->remote);
      fprintf(stderr, "dtrun: restart count %d (--max-restarts %d), run id %s\n", a->round, o->max_restarts,
              a->run_id);
    }
    wait_for_nodes(a, "dtrun/r%d/stopped/%d", o->grace + 2);
    return finish(a, EXIT_FAIL);
  }
}

/* `dtrain bench scaling`: runs the same `dtrain train` job as child processes
 * with 1..N workers (DDP processes under dtrun, DataParallel threads), one
 * single-process baseline (run again at the end of each round) and, for
 * 2..N, that many baselines at once, reads
 * each run's summary.json and prints speedup, scaling efficiency and, for
 * DDP, how much of the all-reduce time was hidden behind backward. Every run
 * gets its own --out under one temporary directory, removed at the end. */
#define _GNU_SOURCE /* sched_setaffinity: indep's runs bound as dtrun binds its workers */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd_scaling.h"
#include "dtrain/core.h"
#include "cpu_bind.h"
#include "cpu_line.h"
#include "cpu_speed.h"
#include "run_metrics.h"

#define MAX_ARGS 96 /* the runs' own flags and the extra ones after -- */
#define NUM_LEN 24

/* An argv under construction; numbers are formatted into its own storage. */
typedef struct argv_buf {
  char *v[MAX_ARGS + 1];
  char nums[MAX_ARGS][NUM_LEN];
  int n;
} argv_buf;

static void arg(argv_buf *b, const char *s) {
  if (b->n < MAX_ARGS) b->v[b->n++] = (char *)s;
  b->v[b->n] = NULL;
}

static void arg_ll(argv_buf *b, long long x) {
  if (b->n >= MAX_ARGS) return;
  snprintf(b->nums[b->n], NUM_LEN, "%lld", x);
  arg(b, b->nums[b->n]);
}

/* The command as one line, for error messages (truncated to fit). */
static void argv_text(const argv_buf *b, char *out, size_t cap) {
  size_t pos = 0;
  out[0] = '\0';
  for (int i = 0; i < b->n && pos + 1 < cap; i++) {
    int w = snprintf(out + pos, cap - pos, "%s%s", i ? " " : "", b->v[i]);
    if (w < 0) break;
    pos += (size_t)w;
  }
  if (pos >= cap && cap > 4) memcpy(out + cap - 4, "...", 4);
}

/* One run's figures from summary.json. */
typedef struct run_result {
  double train_sps, infer_sps;       /* samples/s (ddp: all ranks together) */
  double compute_s, data_s, comm_s;  /* rank 0: training time split; comm_s: waited for all-reduces, slower ranks */
  double comm_total_s, comm_hidden;  /* all-reduce time, share hidden behind backward: per step least over ranks */
  double acc1;                       /* test top-1, fraction */
  double rss_bytes;                  /* rank 0's peak RSS */
  double cpu_per_wall;               /* rank 0's CPU seconds / wall seconds: below its threads = the cores were shared */
  double slowest_sps;                /* indep: the slowest run's train samples/s; else train_sps */
} run_result;

static int read_summary(const char *dir, run_result *r, char *why, size_t why_cap) {
  char path[PATH_MAX + 32], text[4096];
  snprintf(path, sizeof path, "%s/summary.json", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(why, why_cap, "cannot read %s: %s", path, strerror(errno));
    return -1;
  }
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  if (!strstr(text, "\"train_samples_per_s\":")) {
    snprintf(why, why_cap, "%s has no train_samples_per_s", path);
    return -1;
  }
  r->train_sps = json_number(text, "train_samples_per_s");
  r->infer_sps = json_number(text, "infer_samples_per_s");
  r->compute_s = json_number(text, "compute_seconds");
  r->data_s = json_number(text, "data_wait_seconds");
  r->comm_s = json_number(text, "comm_seconds");
  r->comm_total_s = json_number(text, "comm_critical_total_seconds");
  r->comm_hidden = json_number(text, "comm_hidden");
  r->acc1 = json_number(text, "test_acc1");
  r->rss_bytes = json_number(text, "peak_rss_bytes");
  double wall = json_number(text, "wall_seconds");
  r->cpu_per_wall =
      wall > 0 ? (json_number(text, "cpu_user_seconds") + json_number(text, "cpu_sys_seconds")) / wall : 0;
  return 0;
}

/* The last non-empty line of a log file (a child's own error line), or "". */
static void last_line(const char *path, char *out, size_t cap) {
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    size_t n = strcspn(line, "\r\n");
    line[n] = '\0';
    if (n && cap) {
      if (n >= cap) n = cap - 1; /* a long line keeps its head */
      memcpy(out, line, n);
      out[n] = '\0';
    }
  }
  fclose(f);
}

/* Starts argv with stdout and stderr into log, on cpus (NULL: wherever this process may run); returns its pid, or -1
 * (errno set). */
static pid_t start_child(const argv_buf *b, const char *log, const cpu_set_t *cpus) {
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  if (pid == 0) {
    signal(SIGINT, SIG_DFL);
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0) dup2(nul, STDIN_FILENO);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    if (cpus && sched_setaffinity(0, sizeof *cpus, cpus) != 0) {
      dprintf(STDERR_FILENO, "cannot bind %s to the CPUs dtrun would give its worker: %s\n", b->v[0], strerror(errno));
      _exit(127);
    }
    execv(b->v[0], b->v);
    dprintf(STDERR_FILENO, "cannot run %s: %s\n", b->v[0], strerror(errno));
    _exit(127);
  }
  close(fd);
  return pid;
}

/* The wait status of pid, or -1 (errno set). */
static int wait_child(pid_t pid) {
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

/* S_INDEP: k single-process runs at once that never communicate, the ceiling of k workers on this machine. */
typedef enum strategy { S_SINGLE, S_DDP, S_DP, S_INDEP } strategy;
static const char *const strategy_names[] = {"single", "ddp", "dp", "indep"};

typedef struct job {
  const bench_scaling_args *a;
  const char *dtrain, *dtrun, *model, *tmp;
  int epochs, batch, threads;
  int round; /* of --reps, from 0: part of every run's --out */
} job;

/* Builds the command of one run; its --out is tmp/<strategy>-<k>-<round> (tmp is short enough: see mkdtemp). */
static void build_cmd(const job *j, strategy s, int k, char *out_dir, size_t out_cap, argv_buf *b) {
  memset(b, 0, sizeof *b);
  if (snprintf(out_dir, out_cap, "%s/%s-%d-%d", j->tmp, strategy_names[s], k, j->round) >= (int)out_cap) return;
  if (s == S_DDP) {
    arg(b, j->dtrun);
    arg(b, "--standalone");
    arg(b, "--nproc-per-node");
    arg_ll(b, k);
    arg(b, "--threads-per-proc");
    arg_ll(b, j->threads);
    arg(b, "--");
  }
  arg(b, j->dtrain);
  arg(b, "train");
  arg(b, "--strategy");
  arg(b, strategy_names[s == S_INDEP ? S_SINGLE : s]);
  arg(b, "--model");
  arg(b, j->model);
  if (j->a->hidden) {
    arg(b, "--hidden");
    arg(b, j->a->hidden);
  }
  if (j->a->data) {
    arg(b, "--data");
    arg(b, j->a->data);
  }
  arg(b, "--epochs");
  arg_ll(b, j->epochs);
  if (j->a->limit_train > 0) {
    arg(b, "--limit-train");
    arg_ll(b, j->a->limit_train);
  }
  /* ddp's batch is per process; dp splits its batch over the workers; so each
   * worker sees batch_size samples per step and every run takes the same number
   * of steps over the same data. */
  arg(b, "--batch-size");
  arg_ll(b, s == S_DP ? (long long)k * j->batch : j->batch);
  if (s == S_DP) {
    arg(b, "--workers");
    arg_ll(b, k);
  }
  arg(b, "--threads");
  arg_ll(b, s == S_DP ? (long long)k * j->threads : j->threads);
  arg(b, "--seed");
  arg(b, "0");
  arg(b, "--quiet");
  for (int i = 0; i < j->a->n_extra; i++) arg(b, j->a->extra[i]);
  arg(b, "--out");
  arg(b, out_dir);
}

/* A started run's command, output directory and log. */
typedef struct child {
  pid_t pid;
  int err; /* errno of a failed start */
  char out_dir[PATH_MAX], log[PATH_MAX + 16], cmd[2048];
  char where[96]; /* " on cpu 0" or " on cpus 4-7" where indep's run is bound, else "" */
  double train_sps; /* once finished */
} child;

/* " on cpu 3", " on cpus 4-7" or " on cpus 0,2,4" (runs of consecutive ids as ranges; "..." where out is full). */
static void describe_cpus(const cpu_set_t *cpus, char *out, size_t cap) {
  size_t at = 0;
  const int many = CPU_COUNT(cpus) > 1;
  out[0] = '\0';
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, cpus)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, cpus)) e++;
    char part[32];
    if (e == c) snprintf(part, sizeof part, "%s%d", at ? "," : many ? " on cpus " : " on cpu ", c);
    else snprintf(part, sizeof part, "%s%d-%d", at ? "," : " on cpus ", c, e);
    if (at + strlen(part) + 4 > cap) {
      snprintf(out + at, cap - at, "...");
      return;
    }
    at += (size_t)snprintf(out + at, cap - at, "%s", part);
    c = e;
  }
}

/* Run i of the k that strategy s starts at once (indep: k, else one). */
static void start_run(const job *j, strategy s, int k, int i, child *c) {
  argv_buf b;
  cpu_set_t cpus;
  /* indep: where dtrun's --bind-to auto binds k workers of t threads, run i on worker i's CPUs, as a ddp rank */
  const int bound = s == S_INDEP && cpu_bind_auto(k, j->threads, dt_usable_cores()) &&
                    cpu_bind_worker(i, j->threads, &cpus);
  build_cmd(j, s, s == S_INDEP ? 100 * k + i : k, c->out_dir, sizeof c->out_dir, &b);
  snprintf(c->log, sizeof c->log, "%s.log", c->out_dir);
  argv_text(&b, c->cmd, sizeof c->cmd);
  c->where[0] = '\0';
  if (bound) describe_cpus(&cpus, c->where, sizeof c->where);
  c->pid = start_child(&b, c->log, bound ? &cpus : NULL);
  c->err = c->pid < 0 ? errno : 0;
}

/* Waits for a started run: 0 and *r filled (train samples/s after skip epochs), or -1 after printing the error
 * line unless quiet. */
static int finish_run(const child *c, int skip, run_result *r, int quiet) {
  char tail[512], why[PATH_MAX + 128];
  int status = c->pid < 0 ? -1 : wait_child(c->pid);
  if (quiet && (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)) return -1;
  if (status == -1) {
    fprintf(stderr, "\ndtrain: bench scaling: cannot run '%s': %s\n", c->cmd, strerror(c->pid < 0 ? c->err : errno));
    return -1;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    last_line(c->log, tail, sizeof tail);
    if (WIFSIGNALED(status))
      fprintf(stderr, "\ndtrain: bench scaling: '%s' was killed by signal %d%s%s\n", c->cmd, WTERMSIG(status),
              *tail ? ": " : "", tail);
    else
      fprintf(stderr, "\ndtrain: bench scaling: '%s' exited with status %d%s%s\n", c->cmd, WEXITSTATUS(status),
              *tail ? ": " : "", tail);
    return -1;
  }
  if (read_summary(c->out_dir, r, why, sizeof why) != 0 ||
      (skip > 0 && read_after_warmup(c->out_dir, skip, &r->train_sps, why, sizeof why) != 0)) {
    if (!quiet) fprintf(stderr, "\ndtrain: bench scaling: '%s': %s\n", c->cmd, why);
    return -1;
  }
  return 0;
}

/* One run (k workers of strategy s), or for S_INDEP k single runs at once: their samples/s summed, the other
 * figures the first one's. 0 and *r filled, or -1 after printing the error line. */
static int run_one(const job *j, strategy s, int k, run_result *r) {
  const int n = s == S_INDEP ? k : 1;
  child *c = calloc((size_t)n, sizeof *c);
  if (!c) {
    fprintf(stderr, "dtrain: bench scaling: out of memory\n");
    return -1;
  }
  fprintf(stderr, "bench scaling: %s x%d ...", strategy_names[s], k);
  fflush(stderr);
  for (int i = 0; i < n; i++) start_run(j, s, k, i, &c[i]);
  int rc = 0;
  double train = 0, infer = 0, slowest = 0;
  for (int i = 0; i < n; i++) { /* every child is waited for, also after a failure; the first one is told */
    run_result ri;
    const int failed = finish_run(&c[i], j->a->skip_epochs, &ri, rc != 0) != 0;
    /* read: its outputs (weights, metrics) would pile up in TMPDIR round after round */
    nftw(c[i].out_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    remove(c[i].log);
    if (failed) {
      rc = -1;
      continue;
    }
    if (i == 0) *r = ri;
    train += ri.train_sps, infer += ri.infer_sps;
    slowest = i == 0 || ri.train_sps < slowest ? ri.train_sps : slowest;
    c[i].train_sps = ri.train_sps;
  }
  if (rc == 0) { /* indep: each run's figure, where it ran */
    for (int i = 0; i < n && n > 1; i++) fprintf(stderr, "%s%.0f%s", i ? " + " : " (", c[i].train_sps, c[i].where);
    r->train_sps = train, r->infer_sps = infer, r->slowest_sps = slowest;
    fprintf(stderr, "%s %.0f samples/s\n", n > 1 ? ") =" : "", r->train_sps);
  }
  free(c);
  return rc;
}

static void print_row(const char *name, int k, int threads, const run_result *r, double base) {
  double speedup = base > 0 ? r->train_sps / base : 0;
  printf("%-8s %7d %7d %13.0f %13.0f %8.2fx %10.0f%% %9.2f %7.2f", name, k, k * threads, r->train_sps, r->infer_sps,
         speedup, 100.0 * speedup / k, r->compute_s, r->data_s);
  if (strcmp(name, "ddp") == 0 && k > 1 && r->comm_total_s > 0)
    printf(" %7.2f %8.2f %7.0f%%", r->comm_s, r->comm_total_s, 100.0 * r->comm_hidden);
  else
    printf(" %7s %8s %8s", "-", "-", "-");
  printf(" %7.2f %8.2f\n", 100.0 * r->acc1, r->cpu_per_wall);
  fflush(stdout);
}

/* The table's rows in run order: single, then for k = 1..max ddp, dp and (k >= 2) indep. */
typedef struct row {
  strategy s;
  int k;
} row;

static int list_rows(int max_workers, row *rows) {
  int n = 0;
  rows[n++] = (row){S_SINGLE, 1};
  for (int k = 1; k <= max_workers; k++) {
    rows[n++] = (row){S_DDP, k};
    rows[n++] = (row){S_DP, k};
    if (k > 1) rows[n++] = (row){S_INDEP, k};
  }
  return n;
}

/* Of a row's reps runs, the one with the median train samples/s; of an even count the lower middle one, or with
 * upper the upper one (single's, the speedups' base: so that the choice never flatters a speedup). */
static const run_result *median_run(const run_result *runs, int reps, int upper) {
  int order[64];
  for (int i = 0; i < reps; i++) order[i] = i;
  for (int i = 1; i < reps; i++) /* insertion sort by samples/s: reps is small */
    for (int m = i; m > 0 && runs[order[m]].train_sps < runs[order[m - 1]].train_sps; m--) {
      const int t = order[m];
      order[m] = order[m - 1];
      order[m - 1] = t;
    }
  return &runs[order[upper ? reps / 2 : (reps - 1) / 2]];
}

/* The lower middle of n values (n <= 64), which it sorts. */
static double lower_median(double *v, int n) {
  for (int i = 1; i < n; i++) /* insertion sort: n is small */
    for (int m = i; m > 0 && v[m] < v[m - 1]; m--) {
      const double t = v[m];
      v[m] = v[m - 1];
      v[m - 1] = t;
    }
  return v[(n - 1) / 2];
}

/* One line for every k >= 2: ddp's and dp's samples/s over a ceiling taken from indep's run of the same round
 * (its summed samples/s, or with lockstep k times its slowest run's), round by round, and their median (the lower
 * middle one of an even count): what k workers reach of the machine while it holds still, where the speedups over
 * the median single move with the drift between rounds. */
static void print_against(const row *rows, int n, const run_result *res, int reps, int done, int lockstep) {
  for (int i = 2; i < n; i++) {
    if (rows[i].s != S_INDEP) continue;
    const int k = rows[i].k;
    if (lockstep)
      printf("# against %d x the slowest of indep x%d's runs in the same round (workers that step together run at "
             "the slowest one's pace):", k, k);
    else
      printf("# against indep x%d in the same round:", k);
    for (int w = i - 2; w < i; w++) { /* the ddp and dp rows of this k */
      double q[64];
      printf("%s %s x%d", w == i - 2 ? "" : ";", strategy_names[rows[w].s], rows[w].k);
      for (int rep = 0; rep < done; rep++) {
        const run_result *in = &res[(size_t)i * (size_t)reps + (size_t)rep];
        const double ceiling = lockstep ? k * in->slowest_sps : in->train_sps;
        q[rep] = ceiling > 0 ? res[(size_t)w * (size_t)reps + (size_t)rep].train_sps / ceiling : 0;
        printf(" %.2f", q[rep]);
      }
      printf(", median %.2f", lower_median(q, done));
    }
    printf("\n");
  }
}

/* The lines against indep: its sum (the ceiling of k workers that never wait for each other), and k times its
 * slowest run (the ceiling of k workers that step together, each on the CPUs of one indep run: a CPU slower than
 * the others, for a while or for good, costs ddp and dp that much whatever they do). */
static void print_vs_indep(const row *rows, int n, const run_result *res, int reps, int done) {
  print_against(rows, n, res, reps, done, 0);
  print_against(rows, n, res, reps, done, 1);
}

/* The line of single's runs at the rounds' ends, and one of every other row's samples/s over single's of the same
 * round, taken as the mean of its runs at the round's start and end (a drift of the machine's speed through the
 * round, steady for minutes, cancels out), round by round, and their median (the lower middle one of an even
 * count): the speedups paired by round, where the table's are over the median single alone. */
static void print_vs_single(const row *rows, int n, const run_result *res, const double *end_sps, int reps,
                            int done) {
  printf("# single at the end of each round:");
  for (int rep = 0; rep < done; rep++) printf(" %.0f", end_sps[rep]);
  printf("\n# against single in the same round (the mean of its runs at the round's start and end):");
  for (int i = 1; i < n; i++) {
    double q[64];
    printf("%s %s x%d", i == 1 ? "" : ";", strategy_names[rows[i].s], rows[i].k);
    for (int rep = 0; rep < done; rep++) {
      const double base = (res[rep].train_sps + end_sps[rep]) / 2;
      q[rep] = base > 0 ? res[(size_t)i * (size_t)reps + (size_t)rep].train_sps / base : 0;
      printf(" %.2f", q[rep]);
    }
    printf(", median %.2f", lower_median(q, done));
  }
  printf("\n");
}

/* Prints each row's median run over the rounds done, then every round's samples/s and the lines against indep and
 * single. */
static void print_medians(const job *j, const row *rows, int n, const run_result *res, const double *end_sps,
                          int reps, int done) {
  const double base = median_run(res, done, 1)->train_sps;
  for (int i = 0; i < n; i++)
    print_row(strategy_names[rows[i].s], rows[i].k, j->threads,
              median_run(&res[(size_t)i * (size_t)reps], done, rows[i].s == S_SINGLE), base);
  printf("# train samples/s round by round:");
  for (int i = 0; i < n; i++) {
    printf("%s %s x%d", i ? ";" : "", strategy_names[rows[i].s], rows[i].k);
    for (int rep = 0; rep < done; rep++) printf(" %.0f", res[(size_t)i * (size_t)reps + (size_t)rep].train_sps);
  }
  printf("\n");
  print_vs_indep(rows, n, res, reps, done);
  print_vs_single(rows, n, res, end_sps, reps, done);
  fflush(stdout);
}

/* Runs every row reps times, round by round, each round closed by a second single run. One round prints each row
 * as it ends, then the lines against indep and single; several print the median rows after the last round (after
 * a failed run: over the rounds completed, if any), then each row's samples/s round by round and the lines against
 * indep and single. 0, or 1 after a failed run. */
static int run_rounds(job *j, int max_workers, int reps) {
  row rows[1 + 3 * 64];
  const int n = list_rows(max_workers, rows);
  run_result *res = calloc((size_t)n * (size_t)reps, sizeof *res);
  double end_sps[64];
  if (!res) {
    fprintf(stderr, "dtrain: bench scaling: out of memory\n");
    return 1;
  }
  int rc = 1, completed = 0, rows_done = 0;
  for (int rep = 0; rep < reps; rep++, completed++) {
    if (reps > 1) fprintf(stderr, "bench scaling: round %d of %d\n", rep + 1, reps);
    j->round = rep;
    for (int i = 0; i < n; i++) {
      run_result *r = &res[(size_t)i * (size_t)reps + (size_t)rep];
      if (run_one(j, rows[i].s, rows[i].k, r) != 0) goto done;
      if (reps == 1) print_row(strategy_names[rows[i].s], rows[i].k, j->threads, r, res[0].train_sps);
    }
    rows_done = 1; /* with one round its rows are printed, and the lines against indep need only them */
    run_result end;
    if (run_one(j, S_SINGLE, 1, &end) != 0) goto done;
    end_sps[rep] = end.train_sps;
  }
  rc = 0;
done:
  if (reps == 1 && rows_done) print_vs_indep(rows, n, res, 1, 1);
  if (reps == 1 && rc == 0) print_vs_single(rows, n, res, end_sps, 1, 1);
  if (reps > 1 && completed > 0) {
    if (rc) fprintf(stderr, "bench scaling: the %d round(s) completed:\n", completed);
    print_medians(j, rows, n, res, end_sps, reps, completed);
  }
  free(res);
  return rc;
}

int bench_scaling_run(const bench_scaling_args *a) {
  job j = {.a = a};
  j.model = a->model ? a->model : "fashioncnn";
  j.epochs = a->epochs > 0 ? a->epochs : 1;
  j.batch = a->batch_size > 0 ? a->batch_size : 64;
  j.threads = a->threads_per_worker > 0 ? a->threads_per_worker : 1;
  int max_workers = a->max_workers;
  if (max_workers <= 0) { /* a machine's worth, up to the 64 the table takes */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    max_workers = cores > j.threads ? (int)(cores / j.threads) : 1;
    if (max_workers > 64) max_workers = 64;
  }
  if (max_workers > 64) {
    fprintf(stderr, "dtrain: bench scaling: --max-workers %d is more than 64\n", max_workers);
    return 1;
  }
  if (a->reps > 64) {
    fprintf(stderr, "dtrain: bench scaling: --reps %d is more than 64\n", a->reps);
    return 1;
  }

  /* This binary and the launcher next to it. */
  char self[PATH_MAX], launcher[PATH_MAX + 8];
  if (a->dtrain) {
    snprintf(self, sizeof self, "%s", a->dtrain);
  } else {
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
      fprintf(stderr, "dtrain: bench scaling: cannot find this program (/proc/self/exe): %s\n", strerror(errno));
      return 1;
    }
    self[n] = '\0';
  }
  if (a->dtrun) {
    snprintf(launcher, sizeof launcher, "%s", a->dtrun);
  } else {
    const char *slash = strrchr(self, '/');
    int dir_len = slash ? (int)(slash - self) : 1;
    snprintf(launcher, sizeof launcher, "%.*s/dtrun", dir_len, slash ? self : ".");
  }
  if (access(self, X_OK) != 0) {
    fprintf(stderr, "dtrain: bench scaling: cannot run %s: %s\n", self, strerror(errno));
    return 1;
  }
  if (access(launcher, X_OK) != 0) { /* ddp x1 runs under it too */
    fprintf(stderr, "dtrain: bench scaling: the launcher %s is missing (%s): build dtrun next to dtrain\n", launcher,
            strerror(errno));
    return 1;
  }
  j.dtrain = self;
  j.dtrun = launcher;

  const char *tmpdir = getenv("TMPDIR");
  char tmp[PATH_MAX];
  /* room left for the runs' directories and their files under it */
  if (snprintf(tmp, sizeof tmp, "%s/dtrain-scaling-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp") >= PATH_MAX - 256) {
    fprintf(stderr, "dtrain: bench scaling: TMPDIR is too long: %s\n", tmpdir);
    return 1;
  }
  if (!mkdtemp(tmp)) {
    fprintf(stderr, "dtrain: bench scaling: cannot create a temporary directory %s: %s\n", tmp, strerror(errno));
    return 1;
  }
  j.tmp = tmp;

  /* Ctrl-C reaches the children (same process group), which stop and exit
   * 130; this process carries on only to report and clean up. */
  struct sigaction ign = {.sa_handler = SIG_IGN}, old_int;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGINT, &ign, &old_int);

  char samples[32] = "all";
  if (a->limit_train > 0) snprintf(samples, sizeof samples, "%lld", a->limit_train);
  printf("# %s%s%s on %s, %d epoch(s), %s train samples, batch %d per worker, %d thread(s) per worker\n", j.model,
         a->hidden ? " " : "", a->hidden ? a->hidden : "", a->data ? a->data : "the default data", j.epochs, samples,
         j.batch, j.threads);
  if (a->skip_epochs > 0)
    printf("# train samples/s over the epochs after the first %d of %d (--skip-epochs: the warm-up left out); the "
           "other columns over the whole run\n", a->skip_epochs, j.epochs);
  print_cpu_line(stdout);
  print_cpu_speeds(stdout, "at the start");
  printf("# speedup: train samples/s over 'single' (one worker); efficiency = speedup / workers; ddp: rank 0's\n"
         "# wait for the all-reduces and for slower ranks (comm s); all-reduce time (allred s) and its share\n"
         "# hidden behind backward, from each step's least wait and all-reduce time over the ranks;\n"
         "# cpu/wall: CPU seconds per wall second of (rank 0's) process, well below its threads when cores were\n"
         "# shared; indep: k single runs at once that never communicate (samples/s summed; bound to the CPUs\n"
         "# dtrun gives its k workers where it binds them), the ceiling of k workers on this machine\n");
  printf("%-8s %7s %7s %13s %13s %9s %11s %9s %7s %7s %8s %8s %7s %8s\n", "strategy", "workers", "threads",
         "train samp/s", "infer samp/s", "speedup", "efficiency", "compute s", "data s", "comm s", "allred s",
         "hidden", "top-1 %", "cpu/wall");
  fflush(stdout);
  int rc = run_rounds(&j, max_workers, a->reps > 0 ? a->reps : 1);
  print_cpu_speeds(stdout, "at the end"); /* a CPU's speed can change in minutes: the table lies between these */
  sigaction(SIGINT, &old_int, NULL);
  nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}

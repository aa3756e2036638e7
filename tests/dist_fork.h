/* Multi-process test scaffolding: a helper process serves a store, the test
 * forks `world` children that each join a group through it, runs fn in every
 * child and collects exit codes (a child that hangs is killed at the deadline). */
#ifndef DT_TESTS_DIST_FORK_H
#define DT_TESTS_DIST_FORK_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/dist.h"

/* The job secret of every test job (the store and the groups prove it). */
#ifndef TEST_SECRET
#define TEST_SECRET "test-secret-0123456789abcdef0123456789abcdef"
#endif

#define DF_MAX_WORLD 8

typedef struct df_job {
  int port;            /* the store (df_start_store's helper) */
  const char *run_id;
  int round;           /* distinct per job: keys never collide */
  const char *backend;
  double timeout_s;    /* the group's deadline */
  pid_t pids[DF_MAX_WORLD];
  int status[DF_MAX_WORLD]; /* waitpid status */
} df_job;

/* A store served by a process of its own: the test process stays single
 * threaded, so forking ranks from it is safe (a thread holding an allocator
 * lock at fork time would deadlock the child, as seen under ASan). The helper
 * serves until the write end `stop` is closed and no forked child holds it
 * any more, or the test process dies; df_store_proc_stop then kills it. */
typedef struct df_store_proc {
  pid_t pid;
  int stop; /* write end of the helper's pipe: closing it stops the server */
  int port;
} df_store_proc;

/* Starts the helper for run_id into *sp; 0 on success, -1 (said on stderr) otherwise. */
static inline int df_store_proc_start(const char *run_id, df_store_proc *sp) {
  int up[2], down[2];
  if (pipe(up) != 0) return -1;
  if (pipe(down) != 0) return close(up[0]), close(up[1]), -1;
  fflush(stdout);
  fflush(stderr);
  const pid_t p = fork();
  if (p == 0) {
    close(up[0]);
    close(down[1]);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
    dt_store_server *srv = NULL;
    int port = dt_store_server_start("127.0.0.1", 0, run_id, TEST_SECRET, &srv) == DT_OK ? dt_store_server_port(srv)
                                                                                           : -1;
    if (port < 0) fprintf(stderr, "cannot start a store: %s\n", dt_last_error());
    if (write(up[1], &port, sizeof port) != (ssize_t)sizeof port || port < 0) _exit(1);
    char c;
    while (read(down[0], &c, 1) < 0 && errno == EINTR) {
    }
    dt_store_server_stop(srv);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  int port = -1;
  const ssize_t n = p < 0 ? 0 : read(up[0], &port, sizeof port);
  close(up[0]);
  if (n == (ssize_t)sizeof port && port > 0) {
    *sp = (df_store_proc){.pid = p, .stop = down[1], .port = port};
    return 0;
  }
  fprintf(stderr, "the store process did not start\n");
  close(down[1]);
  if (p > 0) kill(p, SIGKILL), waitpid(p, NULL, 0);
  return -1;
}

/* Closes the helper's pipe and waits up to 2 s for it to stop the server and exit (children forked since hold the
 * pipe too: one still alive keeps it serving), then kills it. */
static inline void df_store_proc_stop(df_store_proc *sp) {
  if (sp->pid <= 0) return;
  close(sp->stop);
  pid_t done = 0;
  for (int i = 0; i < 200 && (done = waitpid(sp->pid, NULL, WNOHANG)) == 0; i++) usleep(10000);
  if (done == 0) kill(sp->pid, SIGKILL), waitpid(sp->pid, NULL, 0);
  sp->pid = 0;
}

/* The one store of a test program's jobs, started at first use, stopped at exit. */
static df_store_proc df_store;

static inline void df_stop_store(void) { df_store_proc_stop(&df_store); }

static inline int df_start_store(const char *run_id) {
  if (df_store.pid > 0) return df_store.port;
  if (df_store_proc_start(run_id, &df_store) != 0) exit(1);
  atexit(df_stop_store);
  return df_store.port;
}

/* Joins the group of the job as rank r (in a child). */
static inline dt_status df_join(const df_job *j, int r, int world, dt_group **g) {
  dt_dist_env env;
  memset(&env, 0, sizeof env);
  env.rank = r;
  env.world_size = world;
  env.local_rank = env.local_world_size = env.node_rank = -1;
  snprintf(env.master_addr, sizeof env.master_addr, "127.0.0.1");
  env.master_port = j->port;
  snprintf(env.run_id, sizeof env.run_id, "%s", j->run_id);
  env.restart_count = j->round;
  env.store_served = 1;
  snprintf(env.job_secret, sizeof env.job_secret, "%s", TEST_SECRET);
  env.source = "tcp";
  dt_group_options o;
  dt_group_options_default(&o);
  o.backend = j->backend;
  o.timeout_s = j->timeout_s;
  return dt_group_init_env(&env, &o, g);
}

/* Forks world children running fn(job, rank, world) -> exit code; returns at
 * once (see df_wait). */
static inline void df_spawn(df_job *j, int world, int (*fn)(df_job *, int, int, void *), void *arg) {
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < world; r++) {
    pid_t p = fork();
    if (p == 0) {
      alarm(120); /* never outlive a broken test */
      _exit(fn(j, r, world, arg));
    }
    j->pids[r] = p;
  }
}

/* Waits for all children up to timeout_s, killing stragglers; returns how many
 * did not exit 0. */
static inline int df_wait(df_job *j, int world, double timeout_s) {
  int left = world, bad = 0;
  for (int r = 0; r < world; r++) j->status[r] = -1;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (left > 0) {
    int st;
    pid_t p = 0;
    for (int r = 0; r < world && p <= 0; r++)
      if (j->status[r] == -1) p = waitpid(j->pids[r], &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < world; r++)
        if (j->pids[r] == p) {
          j->status[r] = st;
          left--;
          if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
        }
      continue;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) * 1e-9 > timeout_s) {
      for (int r = 0; r < world; r++)
        if (j->status[r] == -1) {
          fprintf(stderr, "rank %d (pid %d) still running after %.0f s: killed\n", r, (int)j->pids[r], timeout_s);
          kill(j->pids[r], SIGKILL);
        }
      timeout_s += 30;
    }
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return bad;
}

static inline int df_run(df_job *j, int world, int (*fn)(df_job *, int, int, void *), void *arg) {
  df_spawn(j, world, fn, arg);
  return df_wait(j, world, 90);
}

/* Entries in /dev/shm of run id (segments are named dt-<run id>-...). */
static inline int df_shm_leftovers(const char *run_id) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "ls /dev/shm 2>/dev/null | grep -c '^dt-%s-'", run_id);
  FILE *p = popen(cmd, "r");
  int n = 0;
  if (p) {
    if (fscanf(p, "%d", &n) != 1) n = 0;
    pclose(p);
  }
  return n;
}

#endif

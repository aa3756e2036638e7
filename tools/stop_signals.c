/* SIGINT and SIGTERM taken by one thread with sigwait (why: stop_signals.h). */
#include "stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "dtrain/dtrain.h"

static const int taken[] = {SIGINT, SIGTERM};
#define N_TAKEN (int)(sizeof taken / sizeof taken[0])

static atomic_int armed, first;
static atomic_int seen[N_TAKEN]; /* how many of each the armed run received */
static int was_ignored[N_TAKEN]; /* inherited SIG_IGN (a background job's SIGINT): unarmed, stays ignored */

static void taken_set(sigset_t *s) {
  sigemptyset(s);
  for (int i = 0; i < N_TAKEN; i++) sigaddset(s, taken[i]);
}

/* The default action, from this thread: unblocked here and raised at it, so the process ends as if untouched. */
static void die(int sig) {
  signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, NULL);
  raise(sig);
  _exit(128 + sig); /* not reached: the default action of both is to terminate */
}

static void take(int sig) {
  int i = 0;
  while (taken[i] != sig) i++;
  if (!atomic_load(&armed)) {
    if (!was_ignored[i]) die(sig);
    return;
  }
  if (atomic_fetch_add(&seen[i], 1) > 0) die(sig);
  int none = 0;
  atomic_compare_exchange_strong(&first, &none, sig);
  dt_train_request_stop();
}

/* Runs only on a thread that existed before stop_signals_start, which none does with the OpenMP build of
 * OpenBLAS that make deps installs (its pthread build starts workers when it loads: they would take a signal
 * here, on their own stacks, which is safe since oneDNN never runs on them). Installing it also makes the
 * disposition "caught", which Linux needs to keep a blocked signal pending where the inherited one was SIG_IGN.
 * Everything take() calls is async-signal-safe. */
static void on_signal(int sig) { take(sig); }

static void *taker(void *arg) {
  (void)arg;
  prctl(PR_SET_NAME, "dt-signals"); /* in ps -L, top -H, /proc/PID/task/TID/comm */
  sigset_t s;
  taken_set(&s);
  for (;;) {
    int sig;
    if (sigwait(&s, &sig) == 0) take(sig);
  }
  return NULL;
}

int stop_signals_start(void) {
  sigset_t s;
  taken_set(&s);
  int e = pthread_sigmask(SIG_BLOCK, &s, NULL); /* first: a signal from here on waits for the taker */
  for (int i = 0; e == 0 && i < N_TAKEN; i++) {
    struct sigaction old, sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(taken[i], &sa, &old);
    was_ignored[i] = old.sa_handler == SIG_IGN;
  }
  pthread_t t;
  if (e == 0) e = pthread_create(&t, NULL, taker, NULL);
  if (e == 0) e = pthread_detach(t);
  if (e != 0) {
    fprintf(stderr, "dtrain: cannot start the signal thread: %s\n", strerror(e));
    return -1;
  }
  return 0;
}

void stop_signals_arm(int on) { atomic_store(&armed, on != 0); }

int stop_signals_first(void) { return atomic_load(&first); }

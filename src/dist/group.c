/* Process groups: rendezvous through the store, backend selection, and the
 * ordered work queue served by one communication thread per group.
 *
 * Collectives are queued in issue order; the communication thread runs them
 * one at a time through the backend. A caller that waits on the work at the
 * head of an idle queue runs it itself (no thread hand-off: small blocking
 * collectives cost what the backend costs). The first failure breaks the
 * group: it names the collective, its sequence number and the rank, and every
 * later collective fails at once with the same detail. */
#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist-impl.h"
#include "dtrain/trace.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

#define ERR_LEN 768

enum { W_QUEUED, W_RUNNING, W_DONE };

struct dt_work {
  dt_group *g;
  dt_coll c;
  int state;
  int refs; /* the caller's handle + the queue */
  int divisor; /* DT_AVG: divide the result by the world size */
  int on_stack; /* a blocking call's work lives in its caller's frame */
  double started, finished; /* dt_time_now() when the backend began and ended it */
  dt_status status;
  char err[ERR_LEN];
  dt_work *next;
};

struct dt_group {
  int rank, size, local_rank, local_size;
  double timeout_s;
  int comm_cpu; /* DT_COMM_CPU: DT_COMM_CPU_AUTO, _SHARED or _OWN (dist-impl.h), handed to the backend */
  char backend_name[32];
  dt_store *store;
  dt_store_server *server;
  dt_backend *backend;
  int *global; /* identity map 0..size-1 for the backend */
  char prefix[256];
  char secret[DT_SECRET_MAX_CHARS + 1]; /* the job secret ("" = none): proven to the store and to tcp peers */

  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv_queue; /* the communication thread waits for work */
  pthread_cond_t cv_done;  /* waiters wait for completions */
  dt_work *head, *tail;
  int running; /* a work is being run (by the thread or a waiter) */
  int stop;
  uint64_t next_seq;
  int handles;   /* work handles given out and not yet freed */
  dt_work *spare; /* finished handles kept for the next ones (a list through next): no allocation per step */
  int destroyed; /* dt_group_destroy ran; the last dt_work_free releases the memory */
  dt_status broken;
  char broken_err[ERR_LEN];
};

void dt_group_options_default(dt_group_options *o) {
  memset(o, 0, sizeof *o);
  o->backend = "auto";
  o->rank = -1;
  o->world_size = -1;
}

int dt_group_rank(const dt_group *g) { return g->rank; }
int dt_group_size(const dt_group *g) { return g->size; }
int dt_group_local_rank(const dt_group *g) { return g->local_rank; }
int dt_group_local_size(const dt_group *g) { return g->local_size; }
const char *dt_group_backend(const dt_group *g) { return g->backend_name; }

void dt_group_block(const dt_group *g, size_t count, int r, size_t *off, size_t *len) {
  dt_block_of(count, g->size, r, off, len);
}

/* ---- the queue ------------------------------------------------------------- */

/* A released handle goes to the group's spares for the next asynchronous call: a DDP step takes one a bucket and
 * frees them together, so the spares never outnumber the handles a step had alive at once. Under ASan a spare is
 * poisoned, so a use after dt_work_free is still caught. */
static void work_release_locked(dt_work *w) {
  if (--w->refs != 0 || w->on_stack) return;
  dt_group *g = w->g;
  w->next = g->spare;
  g->spare = w;
  ASAN_POISON_MEMORY_REGION(w, sizeof *w);
}

/* A zeroed handle: a spare one, else a new one. */
static dt_status work_new(dt_group *g, dt_work **out) {
  pthread_mutex_lock(&g->mu);
  dt_work *w = g->spare;
  if (w) {
    ASAN_UNPOISON_MEMORY_REGION(w, sizeof *w);
    g->spare = w->next;
  }
  pthread_mutex_unlock(&g->mu);
  if (!w) return dt_alloc(sizeof *w, (void **)out);
  memset(w, 0, sizeof *w);
  *out = w;
  return DT_OK;
}

/* The first rank whose collective fails writes why to the store; a rank that
 * then loses a peer (which may only be a neighbour that gave up) adds that
 * first cause to its own error, so every rank names the rank that really
 * failed. Short deadlines: the store may be gone with the failed rank. */
static void note_failure(dt_group *g, char *err, size_t len) {
  if (!g->store) return;
  char key[320];
  int64_t n = 0;
  void *v = NULL;
  size_t vl = 0;
  dt_store_set_timeout(g->store, 1.0);
  snprintf(key, sizeof key, "%s/failed/count", g->prefix);
  if (dt_store_add(g->store, key, 1, &n) == DT_OK) {
    snprintf(key, sizeof key, "%s/failed/first", g->prefix);
    if (n == 1) {
      dt_store_set(g->store, key, err, strlen(err));
    } else if (dt_store_get(g->store, key, &v, &vl, 1.0) == DT_OK) {
      size_t at = strlen(err);
      if (at + 40 < len) snprintf(err + at, len - at, "; first failure in the group: %.*s", (int)vl, (const char *)v);
      dt_free(v);
    }
  }
  dt_store_set_timeout(g->store, g->timeout_s);
}

/* One span per collective on the thread that ran it (the communication
 * thread, or a caller that ran it itself): "allreduce" etc. with its size. */
static void trace_coll(const dt_coll *c, double t0_us, dt_status s) {
  char args[256];
  int n = snprintf(args, sizeof args, "\"seq\":%llu,\"count\":%zu,\"dtype\":\"%s\",\"bytes\":%zu",
                   (unsigned long long)c->seq, c->count, dt_dtype_name(c->dtype), c->count * dt_dtype_size(c->dtype));
  if (dt_coll_is_allreduce(c->kind) || c->kind == DT_COLL_REDUCE_SCATTER)
    n += snprintf(args + n, sizeof args - (size_t)n, ",\"op\":\"%s\"", dt_redop_name(c->op));
  else if (c->kind == DT_COLL_BROADCAST)
    n += snprintf(args + n, sizeof args - (size_t)n, ",\"root\":%d", c->root);
  if (s != DT_OK) snprintf(args + n, sizeof args - (size_t)n, ",\"status\":\"%s\"", dt_status_name(s));
  dt_trace_span("comm", dt_coll_name(c->kind), t0_us, dt_trace_now_us(), args);
}

/* A collective of a one-rank group: its result is its input (the mean of one value, one rank's block, the
 * root's own buffer), so no backend is asked: a copy where send and recv differ. */
static dt_status run_alone(const dt_coll *c) {
  if (c->kind == DT_COLL_BARRIER || c->kind == DT_COLL_BROADCAST || !c->count || c->send == c->recv) return DT_OK;
  memmove(c->recv, c->send, c->count * dt_dtype_size(c->dtype));
  return DT_OK;
}

/* Runs w (state RUNNING, lock not held) and records the result. */
static void work_run(dt_group *g, dt_work *w, int background) {
  dt_coll c = w->c;
  const double trace_t0 = dt_trace_enabled() ? dt_trace_now_us() : 0;
  double t0 = dt_time_now();
  c.deadline = t0 + g->timeout_s;
  int divided = 0, shard_done = 0;
  c.divisor = w->divisor;
  c.divided = dt_coll_is_allreduce(c.kind) && w->divisor > 1 ? &divided : NULL;
  c.shard_done = &shard_done;
  c.background = background;
  dt_status s = g->size == 1 ? run_alone(&c) : dt_backend_run(g->backend, &c);
  if (s == DT_OK && w->divisor > 1 && !divided) {
    if (dt_coll_is_allreduce(c.kind)) {
      dt_reduce_scale(c.recv, c.count, c.dtype, w->divisor);
    } else {
      size_t off, len;
      dt_block_of(c.count, g->size, g->rank, &off, &len);
      dt_reduce_scale(c.recv, len, c.dtype, w->divisor);
    }
  }
  if (s == DT_OK && c.kind == DT_COLL_ALLREDUCE_SHARDS && !shard_done) dt_coll_shard_block(&c, g->size, g->rank);
  if (s == DT_OK && c.kind == DT_COLL_ALLREDUCE_EACH && !shard_done && c.count)
    c.shard(c.shard_user, 0, c.count, c.recv); /* the whole result, where the backend handed over none of it */
  char err[ERR_LEN];
  if (s != DT_OK) {
    char what[160];
    if (c.kind == DT_COLL_BARRIER)
      snprintf(what, sizeof what, "barrier #%llu", (unsigned long long)c.seq);
    else
      snprintf(what, sizeof what, "%s #%llu (%zu %s)", dt_coll_name(c.kind), (unsigned long long)c.seq,
               c.count, dt_dtype_name(c.dtype));
    snprintf(err, sizeof err, "%s on rank %d: %.500s", what, g->rank, dt_last_error());
    if (s != DT_INTERRUPTED) note_failure(g, err, sizeof err);
  }
  if (trace_t0 > 0) trace_coll(&c, trace_t0, s);
  pthread_mutex_lock(&g->mu);
  if (s != DT_OK) {
    memcpy(w->err, err, sizeof err);
    w->status = s;
    if (g->broken == DT_OK) {
      g->broken = s;
      snprintf(g->broken_err, sizeof g->broken_err, "%s", w->err);
      DT_LOG_WARN("dist", "%s", w->err);
    }
  }
  w->started = t0;
  w->finished = dt_time_now();
  w->state = W_DONE;
  g->running = 0;
  work_release_locked(w); /* the queue's reference */
  pthread_cond_broadcast(&g->cv_done);
  /* Wake the communication thread only if it has something to do: a needless
   * wake-up costs a context switch on cores the peers are spinning on. */
  if (g->head || g->stop) pthread_cond_signal(&g->cv_queue);
  pthread_mutex_unlock(&g->mu);
}

/* Pops the head for running, or fails it at once if the group is broken.
 * Lock held. Returns the work to run, or NULL if it was failed. */
static dt_work *pop_head_locked(dt_group *g) {
  dt_work *w = g->head;
  g->head = w->next;
  if (!g->head) g->tail = NULL;
  w->next = NULL;
  if (g->broken != DT_OK) {
    w->status = g->broken;
    snprintf(w->err, sizeof w->err, "not run: the group failed earlier (%.700s)", g->broken_err);
    w->state = W_DONE;
    work_release_locked(w);
    pthread_cond_broadcast(&g->cv_done);
    return NULL;
  }
  w->state = W_RUNNING;
  g->running = 1;
  return w;
}

static void *comm_thread(void *arg) {
  dt_group *g = arg;
  dt_trace_thread_name("comm");
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (g->head && !g->running) {
      dt_work *w = pop_head_locked(g);
      if (!w) continue;
      pthread_mutex_unlock(&g->mu);
      work_run(g, w, 1);
      pthread_mutex_lock(&g->mu);
      continue;
    }
    if (g->stop && !g->head && !g->running) break;
    pthread_cond_wait(&g->cv_queue, &g->mu);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static void deadline_ts(double timeout_s, struct timespec *ts) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  double whole = (double)(time_t)timeout_s;
  ts->tv_sec += (time_t)timeout_s;
  ts->tv_nsec += (long)((timeout_s - whole) * 1e9);
  if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

dt_status dt_work_wait(dt_work *w, double timeout_s) {
  dt_group *g = w->g;
  struct timespec until;
  if (timeout_s > 0) deadline_ts(timeout_s, &until);
  pthread_mutex_lock(&g->mu);
  while (w->state != W_DONE) {
    if (w->state == W_QUEUED && g->head == w && !g->running) {
      dt_work *run = pop_head_locked(g);
      pthread_mutex_unlock(&g->mu);
      if (run) work_run(g, run, 0);
      pthread_mutex_lock(&g->mu);
      continue;
    }
    if (timeout_s > 0) {
      if (pthread_cond_timedwait(&g->cv_done, &g->mu, &until) == ETIMEDOUT && w->state != W_DONE) {
        pthread_mutex_unlock(&g->mu);
        return dt_error(DT_TIMEOUT, "%s #%llu still running after waiting %.3g s", dt_coll_name(w->c.kind),
                        (unsigned long long)w->c.seq, timeout_s);
      }
    } else {
      pthread_cond_wait(&g->cv_done, &g->mu);
    }
  }
  dt_status s = w->status;
  pthread_mutex_unlock(&g->mu);
  if (s != DT_OK) return dt_error(s, "%s", w->err);
  return DT_OK;
}

int dt_work_test(dt_work *w) {
  pthread_mutex_lock(&w->g->mu);
  int done = w->state == W_DONE;
  pthread_mutex_unlock(&w->g->mu);
  return done;
}

uint64_t dt_work_seq(const dt_work *w) { return w->c.seq; }

double dt_work_elapsed(dt_work *w) {
  pthread_mutex_lock(&w->g->mu);
  double t = w->state == W_DONE ? w->finished - w->started : -1;
  pthread_mutex_unlock(&w->g->mu);
  return t;
}

static void group_release_memory(dt_group *g) {
  while (g->spare) {
    dt_work *w = g->spare;
    ASAN_UNPOISON_MEMORY_REGION(w, sizeof *w);
    g->spare = w->next;
    dt_free(w);
  }
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv_queue);
  pthread_cond_destroy(&g->cv_done);
  dt_free(g);
}

void dt_work_free(dt_work *w) {
  if (!w) return;
  dt_group *g = w->g;
  pthread_mutex_lock(&g->mu);
  work_release_locked(w);
  int last = --g->handles == 0 && g->destroyed;
  pthread_mutex_unlock(&g->mu);
  /* A handle freed after dt_group_destroy: the group's memory went with it. */
  if (last) group_release_memory(g);
}

/* Validates, queues, and either hands back the work or waits for it. */
static dt_status submit(dt_group *g, const dt_coll *c, dt_work **out) {
  if (out) *out = NULL;
  if ((unsigned)c->dtype >= DT_DTYPE_COUNT)
    return dt_error(DT_INVALID_ARGUMENT, "%s: unknown dtype %d", dt_coll_name(c->kind), (int)c->dtype);
  if ((unsigned)c->op >= DT_REDOP_COUNT)
    return dt_error(DT_INVALID_ARGUMENT, "%s: unknown reduction %d", dt_coll_name(c->kind), (int)c->op);
  size_t bytes;
  if (dt_mul_overflow(c->count, dt_dtype_size(c->dtype), &bytes) || bytes > (size_t)1 << 46)
    return dt_error(DT_INVALID_ARGUMENT, "%s: %zu elements of %s is too large", dt_coll_name(c->kind), c->count,
                    dt_dtype_name(c->dtype));
  if (c->count > 0 && (!c->recv || (c->kind != DT_COLL_BROADCAST && !c->send)))
    return dt_error(DT_INVALID_ARGUMENT, "%s of %zu elements: NULL buffer", dt_coll_name(c->kind), c->count);
  if (c->kind == DT_COLL_BROADCAST && (c->root < 0 || c->root >= g->size))
    return dt_error(DT_INVALID_ARGUMENT, "broadcast: root %d is not a rank of this group (0..%d)", c->root,
                    g->size - 1);
  /* A blocking call keeps its work on the stack: no allocation on the small-message path. */
  dt_work local, *w = &local;
  if (out)
    DT_CHECK(work_new(g, &w));
  else
    memset(&local, 0, sizeof local), local.on_stack = 1;
  w->g = g;
  w->c = *c;
  w->refs = 2;
  w->state = W_QUEUED;
  w->divisor = (c->op == DT_AVG && (dt_coll_is_allreduce(c->kind) || c->kind == DT_COLL_REDUCE_SCATTER)) ? g->size : 1;
  pthread_mutex_lock(&g->mu);
  if (g->stop) {
    pthread_mutex_unlock(&g->mu);
    if (out) dt_free(w);
    return dt_error(DT_INVALID_ARGUMENT, "%s: the group is being destroyed", dt_coll_name(c->kind));
  }
  w->c.seq = ++g->next_seq;
  if (out) g->handles++;
  if (g->tail)
    g->tail->next = w;
  else
    g->head = w;
  g->tail = w;
  /* A blocking call runs the work itself when the queue is idle; so does every call of a one-rank group, whose
   * collectives are local copies: no communication thread to wake for them. */
  if (out && g->size > 1) pthread_cond_signal(&g->cv_queue);
  pthread_mutex_unlock(&g->mu);
  if (out) {
    *out = w;
    if (g->size == 1) (void)dt_work_wait(w, 0); /* its status stays in w for the caller's own wait */
    return DT_OK;
  }
  dt_status s = dt_work_wait(w, 0);
  pthread_mutex_lock(&g->mu);
  work_release_locked(w); /* the caller's reference; the queue's was released when it finished */
  pthread_mutex_unlock(&g->mu);
  return s;
}

dt_status dt_allreduce(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op,
                       dt_work **w) {
  dt_coll c = {.kind = DT_COLL_ALLREDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op};
  return submit(g, &c, w);
}

dt_status dt_broadcast(dt_group *g, void *buf, size_t count, dt_dtype dtype, int root, dt_work **w) {
  dt_coll c = {.kind = DT_COLL_BROADCAST, .recv = buf, .count = count, .dtype = dtype, .root = root};
  return submit(g, &c, w);
}

dt_status dt_allgather(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype, dt_work **w) {
  dt_coll c = {.kind = DT_COLL_ALLGATHER, .send = send, .recv = recv, .count = count, .dtype = dtype};
  return submit(g, &c, w);
}

dt_status dt_reduce_scatter(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op,
                            dt_work **w) {
  dt_coll c = {.kind = DT_COLL_REDUCE_SCATTER, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op};
  return submit(g, &c, w);
}

dt_status dt_allreduce_shards(dt_group *g, float *buf, size_t count, dt_redop op, dt_shard_fn fn, void *user,
                              dt_work **w) {
  if (!fn) return dt_error(DT_INVALID_ARGUMENT, "allreduce_shards: no function for the shares");
  dt_coll c = {.kind = DT_COLL_ALLREDUCE_SHARDS, .send = buf, .recv = buf, .count = count, .dtype = DT_F32,
               .op = op, .shard = fn, .shard_user = user};
  return submit(g, &c, w);
}

dt_status dt_allreduce_each(dt_group *g, float *buf, size_t count, dt_redop op, dt_shard_fn fn, void *user,
                            dt_work **w) {
  if (!fn) return dt_error(DT_INVALID_ARGUMENT, "allreduce_each: no function for the pieces");
  dt_coll c = {.kind = DT_COLL_ALLREDUCE_EACH, .send = buf, .recv = buf, .count = count, .dtype = DT_F32,
               .op = op, .shard = fn, .shard_user = user};
  return submit(g, &c, w);
}

/* Checks and the barrier both kinds of share start with; then the backend's op (NULL: not offered). */
static dt_status share_with(dt_group *g, const char *what, dt_status (*op)(dt_backend *, size_t, void **),
                            size_t bytes, void **mem) {
  if (!g || !mem) return dt_error(DT_INVALID_ARGUMENT, "%s: NULL argument", what);
  *mem = NULL;
  if (g->size == 1) return dt_error(DT_UNSUPPORTED, "%s: a group of one rank has no one to share with", what);
  if (!op)
    return dt_error(DT_UNSUPPORTED, "%s: the %s backend shares no memory (ranks on several hosts?)", what,
                    g->backend_name);
  /* Every collective issued before has finished on every rank, and the communication thread is idle. */
  DT_CHECK(dt_barrier(g, NULL));
  return op(g->backend, bytes, mem);
}

dt_status dt_group_share(dt_group *g, size_t bytes, void **mem) {
  return share_with(g, "dt_group_share", g && g->backend ? g->backend->ops->share : NULL, bytes, mem);
}

dt_status dt_group_share_common(dt_group *g, size_t bytes, void **mem) {
  return share_with(g, "dt_group_share_common", g && g->backend ? g->backend->ops->share_common : NULL, bytes,
                    mem);
}

void dt_group_unshare(dt_group *g, void *mem) {
  if (g && mem && g->backend && g->backend->ops->unshare) g->backend->ops->unshare(g->backend, mem);
}

uint64_t dt_group_shared_allreduces(const dt_group *g) {
  return g ? dt_backend_shm_shared_allreduces(g->backend) : 0;
}

int dt_group_comm_has_cpu(const dt_group *g) {
  if (!g) return 0;
  const int shm = dt_backend_shm_comm_cpu(g->backend);
  if (shm >= 0) return shm; /* from the ranks' CPU sets, or DT_COMM_CPU as the backend was given it */
  if (g->comm_cpu != DT_COMM_CPU_AUTO) return g->comm_cpu == DT_COMM_CPU_OWN;
  return (long)g->local_size * (dt_get_threads() + 1) <= dt_usable_cores();
}

void dt_shared_free(void *mem, size_t bytes) {
  if (mem) munmap(mem, bytes);
}

dt_status dt_barrier(dt_group *g, dt_work **w) {
  dt_coll c = {.kind = DT_COLL_BARRIER, .dtype = DT_F32};
  return submit(g, &c, w);
}

void dt_group_abort(dt_group *g) {
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  if (g->broken == DT_OK) {
    g->broken = DT_INTERRUPTED;
    snprintf(g->broken_err, sizeof g->broken_err, "the group was aborted on rank %d", g->rank);
  }
  pthread_mutex_unlock(&g->mu);
  if (g->backend) g->backend->ops->abort(g->backend);
  /* Queued works fail when popped; wake the thread so it pops them. */
  pthread_mutex_lock(&g->mu);
  pthread_cond_broadcast(&g->cv_queue);
  pthread_cond_broadcast(&g->cv_done);
  pthread_mutex_unlock(&g->mu);
}

/* ---- rendezvous ----------------------------------------------------------------- */

/* This host's identity: DT_HOST_ID, else hostname + network namespace (ranks in
 * different namespaces of one machine behave as different hosts). */
static void host_identity(char *buf, size_t len) {
  const char *id = NULL;
  if (dt_tunable_str("DT_HOST_ID", &id) == DT_OK && id && *id) {
    snprintf(buf, len, "%s", id);
  } else {
    char host[256] = "unknown", ns[128] = "";
    gethostname(host, sizeof host - 1);
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = '\0';
    snprintf(buf, len, "%s/%s", host, ns);
  }
  /* The identity travels as one word of the rendezvous record. */
  for (char *c = buf; *c; c++)
    if (*c <= ' ' || *c == 0x7f) *c = '_';
}

/* The local address other ranks reach us at: the source address the kernel
 * would use towards the master (a UDP connect sends nothing). */
static dt_status route_addr(const char *master, char *buf, size_t len) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
  int rc = getaddrinfo(master, "9", &hints, &ai);
  if (rc != 0) return dt_error(DT_INVALID_ARGUMENT, "MASTER_ADDR %s: %s", master, gai_strerror(rc));
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in me;
  socklen_t ml = sizeof me;
  int ok = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr *)&me, &ml) == 0;
  int err = errno;
  freeaddrinfo(ai);
  if (fd >= 0) close(fd);
  if (!ok) return dt_error(DT_IO, "no route to MASTER_ADDR %s: %s", master, strerror(err));
  inet_ntop(AF_INET, &me.sin_addr, buf, (socklen_t)len);
  return DT_OK;
}

typedef struct peer_info {
  char host[192];
  char addr[64];
} peer_info;

/* Publishes this rank, checks the world size and rank claims, and collects
 * every rank's host and address. */
static dt_status exchange(dt_group *g, const char *my_host, const char *my_addr, peer_info *peers) {
  char key[320], val[400];
  int64_t claims;
  snprintf(key, sizeof key, "%s/claim/%d", g->prefix, g->rank);
  DT_CHECK(dt_store_add(g->store, key, 1, &claims));
  if (claims != 1)
    return dt_error(DT_MISMATCH, "rank %d was claimed by %lld processes: check RANK of every worker", g->rank,
                    (long long)claims);
  snprintf(key, sizeof key, "%s/info/%d", g->prefix, g->rank);
  snprintf(val, sizeof val, "%d %s %s", g->size, my_addr, my_host);
  DT_CHECK(dt_store_set(g->store, key, val, strlen(val)));
  double until = dt_time_now() + g->timeout_s;
  for (int r = 0; r < g->size; r++) {
    snprintf(key, sizeof key, "%s/info/%d", g->prefix, r);
    void *v = NULL;
    size_t vl = 0;
    double left = until - dt_time_now();
    dt_status s = dt_store_get(g->store, key, &v, &vl, left > 0.001 ? left : 0.001);
    if (s == DT_TIMEOUT) {
      /* Name every rank that is missing. */
      char missing[256] = "";
      size_t at = 0;
      for (int q = r; q < g->size && at < sizeof missing - 16; q++) {
        snprintf(key, sizeof key, "%s/info/%d", g->prefix, q);
        const char *k = key;
        int present = 0;
        if (dt_store_check(g->store, &k, 1, &present) == DT_OK && !present)
          at += (size_t)snprintf(missing + at, sizeof missing - at, "%s%d", at ? ", " : "", q);
      }
      return dt_error(DT_TIMEOUT, "rendezvous: ranks [%s] of %d did not arrive within %.0f s (DT_TIMEOUT)", missing,
                      g->size, g->timeout_s);
    }
    if (s != DT_OK) return dt_error_prefix(s, "rendezvous");
    int world = -1, n = 0;
    char text[400];
    size_t tl = vl < sizeof text - 1 ? vl : sizeof text - 1;
    memcpy(text, v, tl);
    text[tl] = '\0';
    dt_free(v);
    if (sscanf(text, "%d %63s %191s%n", &world, peers[r].addr, peers[r].host, &n) != 3)
      return dt_error(DT_CORRUPT, "rendezvous: malformed entry for rank %d: '%s'", r, text);
    if (world != g->size)
      return dt_error(DT_MISMATCH, "world size disagrees: rank %d has WORLD_SIZE=%d, rank %d has %d", g->rank,
                      g->size, r, world);
  }
  return DT_OK;
}

/* ---- backends ------------------------------------------------------------------ */

/* Under mpirun, auto means MPI, when this build has it. */
static int mpi_built(void) {
#ifdef DT_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

/* DT_COMM_CPU: auto, 0 (shared) or 1 (own); anything else refused. */
static dt_status comm_cpu_setting(int *out) {
  const char *v;
  DT_CHECK(dt_tunable_str("DT_COMM_CPU", &v));
  if (strcmp(v, "auto") == 0) *out = DT_COMM_CPU_AUTO;
  else if (strcmp(v, "0") == 0) *out = DT_COMM_CPU_SHARED;
  else if (strcmp(v, "1") == 0) *out = DT_COMM_CPU_OWN;
  else return dt_error(DT_USAGE, "DT_COMM_CPU=%s: auto, 0 or 1", v);
  return DT_OK;
}

static dt_status pick_backend(dt_group *g, const char *want, const int *host_of, int n_hosts, const char *my_addr,
                              const char *job_tag) {
  dt_backend_ctx ctx = {.store = g->store, .job_tag = job_tag, .rank = g->rank, .size = g->size,
                        .global = g->global, .timeout_s = g->timeout_s, .host_addr = my_addr,
                        .secret = g->secret, .comm_cpu = g->comm_cpu};
  char prefix[320];
  const char *kind = want;
  if (strcmp(want, "auto") == 0) {
    if (dt_mpi_launched() && mpi_built())
      kind = "mpi";
    else if (n_hosts == 1)
      kind = "shm";
    else if (n_hosts == g->size)
      kind = "tcp";
    else
      kind = "hier";
  }
  snprintf(prefix, sizeof prefix, "%s/%s", g->prefix, kind);
  ctx.prefix = prefix;
  if (strcmp(kind, "shm") == 0) {
    if (n_hosts != 1)
      return dt_error(DT_INVALID_ARGUMENT, "--backend shm needs every rank on one host, but they are on %d hosts",
                      n_hosts);
    DT_CHECK(dt_backend_shm_new(&ctx, &g->backend));
  } else if (strcmp(kind, "tcp") == 0) {
    DT_CHECK(dt_backend_tcp_new(&ctx, &g->backend));
  } else if (strcmp(kind, "mpi") == 0) {
    DT_CHECK(dt_backend_mpi_new(&ctx, &g->backend));
  } else if (strcmp(kind, "hier") == 0) {
    DT_CHECK(dt_backend_hier_new(&ctx, host_of, &g->backend));
    kind = "shm+tcp";
  } else {
    return dt_error(DT_INVALID_ARGUMENT, "unknown backend '%s' (auto, shm, tcp or mpi)", want);
  }
  snprintf(g->backend_name, sizeof g->backend_name, "%s", kind);
  return DT_OK;
}

/* Rank 0 serves the store on every interface: without a job secret anyone who
 * can reach the port may read and write the job's keys (as with torchrun's).
 * Said once per process. */
static void warn_open_store(const dt_dist_env *env) {
  static atomic_int warned;
  if (env->job_secret[0] || atomic_exchange(&warned, 1)) return;
  DT_LOG_WARN("dist", "the store on port %d has no job secret: anyone who can reach the port can join the job "
              "or change its keys; give every rank DT_JOB_SECRET (e.g. 'export DT_JOB_SECRET=$(openssl rand -hex "
              "32)', mpirun -x DT_JOB_SECRET) or launch with dtrun", env->master_port);
}

/* Groups made by this process, in order: every rank makes them in the same order. */
static atomic_int groups_made;

dt_status dt_group_init_env(const dt_dist_env *env, const dt_group_options *opts, dt_group **out) {
  dt_group_options defaults;
  if (!opts) {
    dt_group_options_default(&defaults);
    opts = &defaults;
  }
  const char *want = opts->backend && *opts->backend ? opts->backend : "auto";
  if (strcmp(want, "auto") && strcmp(want, "shm") && strcmp(want, "tcp") && strcmp(want, "mpi"))
    return dt_error(DT_INVALID_ARGUMENT, "unknown backend '%s' (auto, shm, tcp or mpi)", want);
  if (env->world_size < 1 || env->rank < 0 || env->rank >= env->world_size)
    return dt_error(DT_INVALID_ARGUMENT, "rank %d is outside world size %d", env->rank, env->world_size);
  dt_group *g;
  DT_CHECK(dt_alloc(sizeof *g, (void **)&g));
  dt_status st = DT_OK;
  peer_info *peers = NULL;
  int *host_of = NULL;
  g->rank = env->rank;
  g->size = env->world_size;
  g->timeout_s = opts->timeout_s;
  if (g->timeout_s <= 0) {
    long t = 300;
    DT_CHECK_GOTO(dt_tunable_int("DT_TIMEOUT", &t), st, fail);
    if (t <= 0) {
      st = dt_error(DT_INVALID_ARGUMENT, "DT_TIMEOUT=%ld must be a positive number of seconds", t);
      goto fail;
    }
    g->timeout_s = (double)t;
  }
  DT_CHECK_GOTO(comm_cpu_setting(&g->comm_cpu), st, fail);
  pthread_mutex_init(&g->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv_queue, &ca);
  pthread_cond_init(&g->cv_done, &ca);
  pthread_condattr_destroy(&ca);
  int gid = atomic_fetch_add(&groups_made, 1);
  snprintf(g->prefix, sizeof g->prefix, "dt/r%d/g%d", env->restart_count, gid);

  snprintf(g->secret, sizeof g->secret, "%s", env->job_secret);
  if (g->rank == 0 && !env->store_served) {
    warn_open_store(env);
    st = dt_store_server_start(NULL, env->master_port, env->run_id, g->secret, &g->server);
    if (st != DT_OK) {
      st = dt_error_prefix(st, "rank 0 serving the rendezvous store at MASTER_PORT=%d", env->master_port);
      goto fail;
    }
  }
  st = dt_store_connect(env->master_addr, env->master_port, env->run_id, g->secret, g->timeout_s, &g->store);
  if (st != DT_OK) {
    st = dt_error_prefix(st, "rank %d joining the store at %s:%d", g->rank, env->master_addr, env->master_port);
    goto fail;
  }

  char my_host[192], my_addr[64];
  host_identity(my_host, sizeof my_host);
  DT_CHECK_GOTO(route_addr(env->master_addr, my_addr, sizeof my_addr), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)g->size, sizeof *peers, "rendezvous peers", (void **)&peers), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)g->size, sizeof *host_of, "host map", (void **)&host_of), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)g->size, sizeof *g->global, "rank map", (void **)&g->global), st, fail);
  for (int r = 0; r < g->size; r++) g->global[r] = r;
  DT_CHECK_GOTO(exchange(g, my_host, my_addr, peers), st, fail);

  /* Hosts in order of their lowest rank; local rank = index among the host's ranks. */
  int n_hosts = 0;
  for (int r = 0; r < g->size; r++) {
    host_of[r] = -1;
    for (int q = 0; q < r; q++)
      if (strcmp(peers[q].host, peers[r].host) == 0) {
        host_of[r] = host_of[q];
        break;
      }
    if (host_of[r] < 0) host_of[r] = n_hosts++;
  }
  for (int r = 0; r < g->size; r++) {
    if (host_of[r] != host_of[g->rank]) continue;
    if (r < g->rank) g->local_rank++;
    g->local_size++;
  }
  /* Shared-memory names carry the run id, so leftovers (there should be none)
   * are attributable to a job. */
  char job_tag[160];
  snprintf(job_tag, sizeof job_tag, "%s-%d-%d", env->run_id, env->restart_count, gid);
  DT_CHECK_GOTO(pick_backend(g, want, host_of, n_hosts, my_addr, job_tag), st, fail);

  if (pthread_create(&g->thread, NULL, comm_thread, g) != 0) {
    st = dt_error(DT_INTERNAL, "cannot start the communication thread: %s", strerror(errno));
    goto fail;
  }
  g->thread_started = 1;
  memset(g->secret, 0, sizeof g->secret); /* proven to everyone it had to be */
  DT_LOG_INFO("dist", "rank %d of %d (local %d of %d, %d host(s)), backend %s, run %s", g->rank, g->size,
              g->local_rank, g->local_size, n_hosts, g->backend_name, env->run_id);
  dt_free(peers);
  dt_free(host_of);
  *out = g;
  return DT_OK;
fail:
  dt_free(peers);
  dt_free(host_of);
  dt_group_destroy(g);
  return st;
}

dt_status dt_group_init(const dt_group_options *opts, dt_group **out) {
  dt_group_options defaults;
  if (!opts) {
    dt_group_options_default(&defaults);
    opts = &defaults;
  }
  dt_dist_env env;
  DT_CHECK(dt_dist_env_detect(opts->init_method, opts->rank, opts->world_size, &env));
  return dt_group_init_env(&env, opts, out);
}

/* Rank 0's store must outlive the other ranks' last use of it: every rank
 * checks out, rank 0 waits (briefly) for all before stopping the server. */
static void leave(dt_group *g) {
  if (!g->store || g->broken != DT_OK) return;
  char key[320];
  int64_t n = 0;
  snprintf(key, sizeof key, "%s/left", g->prefix);
  if (dt_store_add(g->store, key, 1, &n) != DT_OK || !g->server) return;
  double until = dt_time_now() + (g->timeout_s < 10 ? g->timeout_s : 10);
  while (n < g->size && dt_time_now() < until) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (dt_store_add(g->store, key, 0, &n) != DT_OK) break;
  }
}

void dt_group_destroy(dt_group *g) {
  if (!g) return;
  memset(g->secret, 0, sizeof g->secret);
  if (g->thread_started) {
    pthread_mutex_lock(&g->mu);
    int pending = g->head != NULL || g->running;
    pthread_mutex_unlock(&g->mu);
    if (pending) dt_group_abort(g);
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_broadcast(&g->cv_queue);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    leave(g);
  }
  if (g->backend) g->backend->ops->destroy(g->backend);
  if (g->store) dt_store_close(g->store);
  if (g->server) dt_store_server_stop(g->server);
  dt_free(g->global);
  if (!g->prefix[0]) { /* failed before the lock existed */
    dt_free(g);
    return;
  }
  pthread_mutex_lock(&g->mu);
  g->destroyed = 1;
  int in_use = g->handles > 0;
  pthread_mutex_unlock(&g->mu);
  if (!in_use) group_release_memory(g);
}

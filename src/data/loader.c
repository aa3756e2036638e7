/* Batch loader: per-epoch order (sampler, Philox shuffle or sequential) and prefetching background threads, or
 * none (DT_LOADER_INLINE: the caller's threads make each batch when they take it). */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/data.h"
#include "dtrain/trace.h"

#define LOADER_STACK_BYTES ((size_t)4 << 20) /* each loader thread's stack */

/* Loader threading. The caller's thread owns the order and the epoch; the
 * worker only reads `order` while an epoch is active and it is busy, and the
 * caller rewrites `order` only after waiting for the worker to go idle with
 * the epoch stopped. Ring: batch k lives in slot k % nslots; the worker may
 * fill batch k when k < released + nslots, where `released` counts batches
 * the caller no longer holds (the last handed-out batch stays held until the
 * next call). All counters below are guarded by mu. */
typedef struct slot {
  void *field[DT_MAX_FIELDS]; /* (batch_size, field shape...) each */
  int64_t done;               /* the batch this slot holds once made (-1: none this epoch) */
} slot;

struct dt_loader {
  const dt_dataset *ds;
  dt_loader_config cfg;
  const dt_data_info *info; /* the dataset's fields */
  int64_t capacity;         /* entries of order */
  int64_t *order;           /* (capacity) sample indices of the current epoch */
  int64_t n_samples;        /* samples the current epoch visits */
  int64_t n_batches;        /* batches of the current epoch */
  int nslots;
  slot *slots;
  int64_t epoch;            /* passed to the fetch (per-sample augmentation) */
  int inline_;              /* DT_LOADER_INLINE: no thread; dt_loader_next fetches in the calling thread */
  int n_threads;
  pthread_t *threads;       /* (n_threads) workers, each making whole batches */
  pthread_mutex_t mu;
  pthread_cond_t work;      /* to the worker: space freed, epoch started, stop */
  pthread_cond_t ready;     /* to the caller: batch produced, worker idle */
  int stop;
  int active;               /* an epoch is running */
  int busy;                 /* workers gathering outside the lock */
  uint64_t gen;             /* bumped by every epoch start: stale batches are dropped */
  int64_t claimed;          /* next batch a worker takes */
  int64_t produced, handed, released; /* produced: batches 0..produced-1 are all made */
  dt_status err;            /* a fetch of this epoch failed: the caller's next dt_loader_next reports it */
  char err_detail[512];
  int holding;              /* caller holds batch handed - 1 */
  int started;              /* dt_loader_start_epoch has been called */

  double wait_s;            /* caller-thread only */
};

/* Batch k of the current epoch: its first sample and size. */
static int batch_size_of(const dt_loader *l, int64_t k) {
  int64_t first = k * l->cfg.batch_size, left = l->n_samples - first;
  return (int)(left < l->cfg.batch_size ? left : l->cfg.batch_size);
}

/* Fetches samples [lo, lo + n) of batch k into slot s, at their places in its buffers. */
static dt_status fetch_into(const dt_loader *l, int64_t k, const slot *s, int lo, int n) {
  void *at[DT_MAX_FIELDS] = {0};
  for (int f = 0; f < l->info->n_fields; f++)
    at[f] = (char *)s->field[f] + (size_t)lo * dt_field_bytes(&l->info->field[f]);
  const double t0 = dt_trace_enabled() ? dt_trace_now_us() : 0;
  dt_status st = dt_dataset_fetch_epoch(l->ds, l->epoch, l->order + k * l->cfg.batch_size + lo, n, at);
  if (t0 > 0) {
    char args[80];
    snprintf(args, sizeof args, "\"batch\":%lld,\"first\":%d,\"samples\":%d", (long long)k, lo, n);
    dt_trace_span("data", "load batch", t0, dt_trace_now_us(), args);
  }
  return st;
}

/* The epoch's first failed fetch, kept for the caller's next dt_loader_next (mu held). */
static void set_err(dt_loader *l, dt_status st) {
  l->err = st;
  snprintf(l->err_detail, sizeof l->err_detail, "%s", dt_last_error());
}

static void *worker(void *arg) {
  dt_loader *l = arg;
  dt_trace_thread_name("loader");
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->stop && !(l->active && !l->err && l->claimed < l->n_batches && l->claimed < l->released + l->nslots))
      pthread_cond_wait(&l->work, &l->mu);
    if (l->stop) break;
    int64_t k = l->claimed++;
    uint64_t gen = l->gen;
    int n = batch_size_of(l, k);
    slot *s = &l->slots[k % l->nslots];
    l->busy++;
    pthread_mutex_unlock(&l->mu);

    dt_status st = fetch_into(l, k, s, 0, n);

    pthread_mutex_lock(&l->mu);
    l->busy--;
    if (gen == l->gen) {
      if (st != DT_OK && !l->err) set_err(l, st);
      s->done = k;
      while (l->produced < l->n_batches && l->slots[l->produced % l->nslots].done == l->produced) l->produced++;
    }
    pthread_cond_broadcast(&l->ready);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* Stops the running epoch and waits until the worker no longer reads order or slots. */
static void quiesce(dt_loader *l) {
  pthread_mutex_lock(&l->mu);
  l->active = 0;
  l->gen++;
  while (l->busy) pthread_cond_wait(&l->ready, &l->mu);
  pthread_mutex_unlock(&l->mu);
}

/* Fills order[0..*n) for `epoch`. */
static dt_status make_order(dt_loader *l, int64_t epoch, int64_t *n_out) {
  int64_t size = dt_dataset_size(l->ds), n = size;
  if (l->cfg.sampler) {
    n = -1;
    DT_CHECK(l->cfg.sampler(l->cfg.sampler_user, epoch, l->order, &n));
    if (n < 0 || n > l->capacity)
      return dt_error(DT_INVALID_ARGUMENT, "sampler returned %lld samples for epoch %lld; capacity is %lld",
                      (long long)n, (long long)epoch, (long long)l->capacity);
    for (int64_t i = 0; i < n; i++)
      if (l->order[i] < 0 || l->order[i] >= size)
        return dt_error(DT_INVALID_ARGUMENT, "sampler returned index %lld at position %lld, outside [0, %lld)",
                        (long long)l->order[i], (long long)i, (long long)size);
  } else {
    for (int64_t i = 0; i < n; i++) l->order[i] = i;
    if (l->cfg.shuffle) {
      /* Fisher-Yates from the back, Philox keyed by (seed, epoch). */
      dt_rng r;
      dt_rng_init(&r, l->cfg.seed, (uint64_t)epoch);
      for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = dt_rng_below(&r, (uint32_t)(i + 1));
        int64_t t = l->order[i];
        l->order[i] = l->order[j];
        l->order[j] = t;
      }
    }
  }
  *n_out = n;
  return DT_OK;
}

static int64_t batches_for(const dt_loader *l, int64_t n) {
  int64_t b = l->cfg.batch_size;
  return l->cfg.drop_last ? n / b : (n + b - 1) / b;
}

static void free_slots(dt_loader *l) {
  for (int i = 0; l->slots && i < l->nslots; i++)
    for (int f = 0; f < DT_MAX_FIELDS; f++) dt_free(l->slots[i].field[f]);
  dt_free(l->slots);
}

/* Worker threads when none are asked: one, or for sources that decode and augment images on fetch
 * one per 8 cores (1 to 4): a core decodes and augments hundreds of ImageNet-sized images or tens
 * of thousands of CIFAR images per second, more than a CPU trains on. */
static int auto_workers(const dt_dataset *ds) {
  if (!dt_dataset_info(ds)->decodes) return 1;
  const int w = dt_num_cores() / 8;
  return w < 1 ? 1 : w > 4 ? 4 : w;
}

/* Batches ahead when nothing is asked: as many as fit in 1 MiB, 2 to 64. Small batches are
 * cheap to hold and quick to make, and a deep ring lets the thread make them in runs instead
 * of being woken for every one (the tutorial's 32 x 21 floats: 64 batches ahead). */
static long auto_prefetch(const dt_dataset *ds, int batch_size) {
  const dt_data_info *info = dt_dataset_info(ds);
  size_t bytes = 0;
  for (int f = 0; f < info->n_fields; f++) bytes += dt_field_bytes(&info->field[f]);
  const size_t budget = (size_t)1 << 20, per_batch = bytes * (size_t)batch_size + 1;
  const size_t n = budget / per_batch;
  return n < 2 ? 2 : n > 64 ? 64 : (long)n;
}

static void stop_threads(dt_loader *l) {
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->mu);
  for (int t = 0; t < l->n_threads; t++) pthread_join(l->threads[t], NULL);
}

dt_status dt_loader_new(const dt_dataset *ds, const dt_loader_config *cfg, dt_loader **out) {
  if (!ds || !cfg || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_loader_new: NULL dataset, config or out");
  if (cfg->batch_size < 1) return dt_error(DT_INVALID_ARGUMENT, "loader: batch_size %d must be >= 1", cfg->batch_size);
  if (cfg->prefetch < 0) return dt_error(DT_INVALID_ARGUMENT, "loader: prefetch %d must be >= 0", cfg->prefetch);
  if (cfg->sampler_capacity < 0)
    return dt_error(DT_INVALID_ARGUMENT, "loader: sampler_capacity %lld must be >= 0", (long long)cfg->sampler_capacity);
  int64_t size = dt_dataset_size(ds);
  if (size > (int64_t)UINT32_MAX)
    return dt_error(DT_UNSUPPORTED, "loader: %lld samples; at most 2^32 - 1 are supported", (long long)size);
  long prefetch = cfg->prefetch;
  if (prefetch == 0) {
    DT_CHECK(dt_tunable_int("DT_PREFETCH", &prefetch));
    if (prefetch < 0 || prefetch > 1024)
      return dt_error(DT_INVALID_ARGUMENT, "DT_PREFETCH=%ld must be between 0 (auto) and 1024", prefetch);
    if (prefetch == 0) prefetch = auto_prefetch(ds, cfg->batch_size);
  }
  if (prefetch > 1024) return dt_error(DT_INVALID_ARGUMENT, "loader: prefetch %ld must be at most 1024", prefetch);
  if ((cfg->workers < 0 && cfg->workers != DT_LOADER_INLINE) || cfg->workers > DT_LOADER_MAX_WORKERS)
    return dt_error(DT_INVALID_ARGUMENT, "loader: %d workers; give 0 (auto) to %d, or DT_LOADER_INLINE (%d)",
                    cfg->workers, DT_LOADER_MAX_WORKERS, DT_LOADER_INLINE);
  const int inline_ = cfg->workers == DT_LOADER_INLINE;
  const int workers = inline_ ? 0 : cfg->workers ? cfg->workers : auto_workers(ds);
  /* every worker a batch in hand and as many ready ahead */
  if (cfg->prefetch == 0 && prefetch < 2 * workers) prefetch = 2 * workers;

  dt_status st;
  dt_loader *l = NULL;
  DT_CHECK(dt_alloc(sizeof *l, (void **)&l));
  int sync_made = 0;
  l->ds = ds;
  l->cfg = *cfg;
  l->cfg.prefetch = (int)prefetch;
  l->info = dt_dataset_info(ds);
  l->capacity = cfg->sampler ? (cfg->sampler_capacity ? cfg->sampler_capacity : size) : size;
  l->inline_ = inline_;
  l->nslots = inline_ ? 1 : (int)prefetch + 1; /* inline: the batch the caller holds, made when it is taken */
  l->n_threads = 0;
  DT_CHECK_GOTO(dt_alloc_array((size_t)(l->capacity ? l->capacity : 1), sizeof *l->order, "loader order", (void **)&l->order),
                st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)l->nslots, sizeof *l->slots, "loader slots", (void **)&l->slots), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)(workers ? workers : 1), sizeof *l->threads, "loader threads",
                               (void **)&l->threads),
                st, fail);
  for (int i = 0; i < l->nslots; i++)
    for (int f = 0; f < l->info->n_fields; f++)
      DT_CHECK_GOTO(dt_alloc_array((size_t)cfg->batch_size, dt_field_bytes(&l->info->field[f]), l->info->field[f].name,
                                   &l->slots[i].field[f]),
                    st, fail);
  /* Size the epoch before any start (a sampler is asked for epoch 0). */
  DT_CHECK_GOTO(make_order(l, 0, &l->n_samples), st, fail);
  l->n_batches = batches_for(l, l->n_samples);

  if (pthread_mutex_init(&l->mu, NULL) != 0) {
    st = dt_error(DT_OUT_OF_MEMORY, "loader: cannot create a mutex");
    goto fail;
  }
  if (pthread_cond_init(&l->work, NULL) != 0) {
    pthread_mutex_destroy(&l->mu);
    st = dt_error(DT_OUT_OF_MEMORY, "loader: cannot create a condition variable");
    goto fail;
  }
  if (pthread_cond_init(&l->ready, NULL) != 0) {
    pthread_cond_destroy(&l->work);
    pthread_mutex_destroy(&l->mu);
    st = dt_error(DT_OUT_OF_MEMORY, "loader: cannot create a condition variable");
    goto fail;
  }
  sync_made = 1;
  /* A known stack, not the platform's default (musl's is 128 KiB): the image transforms keep their
   * resize tables (about 330 KiB) on it. */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, LOADER_STACK_BYTES);
  for (int t = 0; t < workers; t++) {
    int err = pthread_create(&l->threads[t], &attr, worker, l);
    if (err != 0) {
      st = dt_error(DT_OUT_OF_MEMORY, "loader: cannot start prefetch thread %d of %d: %s", t + 1, workers, strerror(err));
      pthread_attr_destroy(&attr);
      goto fail;
    }
    l->n_threads++;
  }
  pthread_attr_destroy(&attr);
  *out = l;
  return DT_OK;
fail:
  if (l->n_threads) stop_threads(l);
  if (sync_made) {
    pthread_cond_destroy(&l->ready);
    pthread_cond_destroy(&l->work);
    pthread_mutex_destroy(&l->mu);
  }
  free_slots(l);
  dt_free(l->threads);
  dt_free(l->order);
  dt_free(l);
  return st;
}

void dt_loader_free(dt_loader *l) {
  if (!l) return;
  stop_threads(l);
  pthread_cond_destroy(&l->ready);
  pthread_cond_destroy(&l->work);
  pthread_mutex_destroy(&l->mu);
  free_slots(l);
  dt_free(l->threads);
  dt_free(l->order);
  dt_free(l);
}

dt_status dt_loader_start_epoch(dt_loader *l, int64_t epoch) {
  if (!l) return dt_error(DT_INVALID_ARGUMENT, "dt_loader_start_epoch: NULL loader");
  if (epoch < 0) return dt_error(DT_INVALID_ARGUMENT, "loader: epoch %lld must be >= 0", (long long)epoch);
  quiesce(l);
  /* The worker is idle and the epoch inactive: order is ours to rewrite. */
  int64_t n = 0;
  dt_status st = make_order(l, epoch, &n);
  pthread_mutex_lock(&l->mu);
  l->produced = l->handed = l->released = l->claimed = 0;
  l->holding = 0;
  l->err = DT_OK;
  l->epoch = epoch;
  for (int i = 0; i < l->nslots; i++) l->slots[i].done = -1;
  if (st == DT_OK) {
    l->n_samples = n;
    l->n_batches = batches_for(l, n);
    l->active = 1;
    l->started = 1;
  } else {
    l->started = 0; /* a failed start leaves no epoch to read from */
  }
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->mu);
  return st;
}

/* Inline: batch k is made in the calling thread now (fill), or left for dt_loader_fill (done stays -1). A failed
 * fetch stops the epoch, as a worker's does. Called with mu held. */
static void make_inline(dt_loader *l, int64_t k, int fill) {
  slot *s = &l->slots[0];
  s->done = -1;
  l->produced = k + 1;
  if (!fill) return;
  const double t0 = dt_time_now();
  dt_status st = fetch_into(l, k, s, 0, batch_size_of(l, k));
  l->wait_s += dt_time_now() - t0;
  if (st != DT_OK) {
    set_err(l, st);
    return;
  }
  s->done = k;
}

static dt_status next_batch(dt_loader *l, dt_batch *b, int fill) {
  if (!l || !b) return dt_error(DT_INVALID_ARGUMENT, "dt_loader_next: NULL loader or batch");
  pthread_mutex_lock(&l->mu);
  if (!l->started) {
    pthread_mutex_unlock(&l->mu);
    return dt_error(DT_INVALID_ARGUMENT, "loader: call dt_loader_start_epoch before dt_loader_next");
  }
  if (l->holding) {
    l->holding = 0;
    l->released++;
    /* The worker is woken once half the ring is free, so it makes batches in runs rather than
     * one per wake-up (each wake-up of a sleeping thread costs more than a small batch). */
    if (l->released + l->nslots - l->produced >= (l->nslots + 1) / 2) pthread_cond_broadcast(&l->work);
  }
  if (l->handed >= l->n_batches) {
    pthread_mutex_unlock(&l->mu);
    memset(b, 0, sizeof *b);
    b->index = l->n_batches;
    return DT_OK;
  }
  if (l->inline_ && !l->err) make_inline(l, l->handed, fill);
  if (l->produced <= l->handed && !l->err) {
    pthread_cond_broadcast(&l->work); /* about to wait: the workers must be making batches */
    double t0 = dt_time_now();
    while (l->produced <= l->handed && !l->err) pthread_cond_wait(&l->ready, &l->mu);
    l->wait_s += dt_time_now() - t0;
  }
  if (l->err) { /* the epoch stops here; dt_loader_start_epoch starts afresh */
    dt_status st = l->err;
    char detail[sizeof l->err_detail];
    memcpy(detail, l->err_detail, sizeof detail);
    pthread_mutex_unlock(&l->mu);
    return dt_error(st, "%s", detail);
  }
  int64_t k = l->handed++;
  l->holding = 1;
  const slot *s = &l->slots[k % l->nslots];
  const dt_data_info *in = l->info;
  for (int f = 0; f < DT_MAX_FIELDS; f++) b->field[f] = s->field[f];
  b->x = in->input >= 0 ? s->field[in->input] : NULL;
  b->target = s->field[in->target];
  b->y = in->task == DT_TASK_CLASSIFICATION ? s->field[in->target] : NULL;
  b->size = batch_size_of(l, k);
  b->index = k;
  pthread_mutex_unlock(&l->mu);
  return DT_OK;
}

dt_status dt_loader_next(dt_loader *l, dt_batch *b) { return next_batch(l, b, 1); }
dt_status dt_loader_next_unfilled(dt_loader *l, dt_batch *b) { return next_batch(l, b, 0); }

/* Reads only what next_batch wrote before the caller handed the batch to the filling threads (holding, handed,
 * the slot, order, epoch): no lock, and disjoint ranges write disjoint bytes. */
dt_status dt_loader_fill(const dt_loader *l, int lo, int n) {
  if (!l) return dt_error(DT_INVALID_ARGUMENT, "dt_loader_fill: NULL loader");
  if (!l->holding) return dt_error(DT_INVALID_ARGUMENT, "dt_loader_fill: no batch handed out");
  const int64_t k = l->handed - 1;
  const slot *s = &l->slots[k % l->nslots];
  const int size = batch_size_of(l, k);
  if (lo < 0 || n < 0 || n > size - lo)
    return dt_error(DT_INVALID_ARGUMENT, "dt_loader_fill: samples [%d, %lld) outside batch %lld of %d samples", lo,
                    (long long)lo + n, (long long)k, size);
  if (s->done == k || n == 0) return DT_OK; /* made by a loader thread or by dt_loader_next */
  return fetch_into(l, k, s, lo, n);
}

int64_t dt_loader_batches_per_epoch(const dt_loader *l) { return l->n_batches; }

int64_t dt_loader_samples_per_epoch(const dt_loader *l) {
  return l->cfg.drop_last ? l->n_batches * l->cfg.batch_size : l->n_samples;
}

double dt_loader_wait_seconds(const dt_loader *l) { return l->wait_s; }

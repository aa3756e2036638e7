/* DataParallel: one process, persistent worker threads each running forward/backward of a slice of the batch
 * in its own execution context over the shared parameters (PyTorch's nn.DataParallel on CPU threads). */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/core.h"
#include "dtrain/model_ctx.h"
#include "dtrain/parallel.h"
#include "dtrain/task.h"
#include "dtrain/trace.h"

/* OpenBLAS's own setter (the OpenMP build); declared here so no cblas.h is needed. */
void openblas_set_num_threads(int n);

#define DP_MAX_WORKERS 1024
#define DP_ERR_LEN 512
/* Gradient reduction block, floats: the workers' blocks stay in L1/L2 while they are summed (16 KiB each). */
#define DP_REDUCE_BLOCK 4096
/* Task counters a worker keeps per slice (dt_task_num_sums). */
#define DP_MAX_SUMS 8
/* Each worker thread's stack: a worker may fetch its slice of the batch (dt_dp_set_fill), and the image transforms
 * keep their resize tables (about 330 KiB) on the stack, as the loader's threads do; musl's default is 128 KiB. */
#define DP_STACK_BYTES ((size_t)4 << 20)
/* Seconds a handshake wait spins before it sleeps, where the workers' threads have a CPU each. */
#define DP_SPIN_S 100e-6

/* DP_JOB_STEP: DP_JOB_REDUCE and DP_JOB_OPTIM in one, block by block (dt_dp_set_fused_step). DP_JOB_CLIP_SUM and
 * DP_JOB_CLIP_SCALE: dt_dp_clip_grad_norm's two passes. The jobs from DP_JOB_REDUCE on are traced. */
typedef enum dp_job {
  DP_JOB_NONE = 0, DP_JOB_TRAIN, DP_JOB_FORWARD, DP_JOB_REDUCE, DP_JOB_OPTIM, DP_JOB_STEP, DP_JOB_CLIP_SUM,
  DP_JOB_CLIP_SCALE
} dp_job;

typedef struct dp_worker {
  struct dt_dp *d;
  int index;
  pthread_t thread; /* a thread for each worker but worker 0 where the calling thread runs it (inline0) */
  dt_model_ctx *ctx;
  float *dlogits; /* (max_slice, outputs) */
  float *sums_block; /* (DP_REDUCE_BLOCK): a fused step's sums of one block, fed to the update, never stored */
  /* this step's slice of the batch: samples [lo, lo + n) */
  int lo, n;
  /* results of the last job */
  dt_status st;
  char err[DP_ERR_LEN];
  float loss; /* mean over the slice */
  double sums[DP_MAX_SUMS]; /* the task's counters of the slice */
} dp_worker;

struct dt_dp {
  dt_model *m;
  int workers, max_batch, max_slice, classes;
  size_t sample_bytes; /* per input sample (f32 values or i32 indices) */
  int omp_threads;  /* OpenMP threads of each worker's own parallel regions */
  int blas_pinned;  /* 1: BLAS runs single-threaded while the workers run (see set_blas_for_workers) */
  int assign;       /* the arena's zero_grad was deferred: a reduce stores the sums, not adds them (a fused step's
                     * update takes them from the workers' blocks and stores nothing) */
  int fused;        /* dt_dp_set_fused_step: a train step leaves its reduce to the optimizer step */
  int unreduced;    /* the last train step's reduce is still to run */
  int first, last;  /* the first and last worker with a slice of this step's batch (set_slices) */
  size_t n_params;
  float loss_scale; /* dlogits *= it before backward (an fp16 loss scaler's scale) */
  dt_dp_fill_fn fill; /* dt_dp_set_fill: each worker fetches its slice of a train step's batch first */
  void *fill_user;
  float *grads;     /* the model's gradient arena (n_params) */
  dp_worker *w;     /* (workers) */
  int inline0;      /* 1: the calling thread runs worker 0's part of each job (see dispatch) */
  int started;      /* threads running: workers inline0 .. inline0 + started - 1 */

  /* The step handshake: the caller bumps generation with a job; every worker thread runs it once and
   * decrements pending; the last one signals done (the caller runs worker 0's part meanwhile where inline0).
   * Waits spin for DP_SPIN_S first where every worker's threads have a CPU (spin), then sleep on condition
   * variables; they have no deadline because they wait on local compute, which always finishes. */
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  _Atomic uint64_t generation;
  _Atomic int pending;
  int quit;
  int spin;
  dp_job job;
  /* the job's arguments */
  const char *x;
  const void *target;
  size_t target_bytes; /* per sample */
  const dt_task *task;
  float *out;
  int batch;
  dt_optim *optim; /* DP_JOB_OPTIM, DP_JOB_STEP: the step each worker takes part of, at learning rate lr */
  float lr;
  size_t clip_chunk, clip_chunks;        /* DP_JOB_CLIP_SUM: dt_clip_chunks of the arena */
  double clip_sums[DT_CLIP_MAX_CHUNKS]; /* each chunk's sum of squares, by the worker whose share it is in */
  float clip_coef;                      /* DP_JOB_CLIP_SCALE: the gradients' factor */
};

/* Slice w of a batch: contiguous, sizes differ by at most one, the larger ones first (7 over 3: 3, 2, 2).
 * torch.chunk (what nn.DataParallel's scatter uses) gives ceil-sized chunks instead (7 over 3: 3, 3, 1;
 * 2 over 4: 1, 1 and two idle devices); the largest slice, which sets the step time, is the same. */
static void slice_of(int batch, int workers, int w, int *lo, int *n) {
  const int base = batch / workers, extra = batch % workers;
  *n = base + (w < extra);
  *lo = w * base + (w < extra ? w : extra);
}

static void record_error(dp_worker *wk, dt_status st) {
  wk->st = st;
  snprintf(wk->err, sizeof wk->err, "%s", dt_last_error());
}

/* Forward, loss and backward of this worker's slice into its own (zeroed) gradient buffer. */
static void run_train(dp_worker *wk) {
  struct dt_dp *d = wk->d;
  dt_model *m = d->m;
  const void *x = d->x + (size_t)wk->lo * d->sample_bytes;
  const void *y = (const char *)d->target + (size_t)wk->lo * d->target_bytes;
  const float *logits = NULL;
  dt_status st;
  dt_model_ctx_zero_grad_deferred(m, wk->ctx); /* the backward below writes them */
  dt_model_ctx_set_loss_weight(wk->ctx, 1.0f / (float)d->batch); /* as the dlogits scaling below */
  if (d->fill && (st = d->fill(d->fill_user, wk->lo, wk->n)) != DT_OK) goto fail;
  if ((st = dt_model_ctx_forward(m, wk->ctx, x, wk->n, &logits)) != DT_OK) goto fail;
  if ((st = dt_task_loss(d->task, logits, y, wk->n, 1, &wk->loss, wk->dlogits)) != DT_OK) goto fail;
  memset(wk->sums, 0, sizeof wk->sums);
  dt_task_count(d->task, logits, y, wk->n, wk->sums);
  /* dlogits is the gradient of this slice's mean loss; scaled by n / batch the workers' gradients sum to
   * the gradient of the whole batch's mean loss. One worker holding the whole batch is left unscaled. */
  if (wk->n != d->batch || d->loss_scale != 1.0f) {
    const float scale = (float)wk->n / (float)d->batch * d->loss_scale;
    const size_t count = (size_t)wk->n * (size_t)d->classes;
    for (size_t i = 0; i < count; i++) wk->dlogits[i] *= scale;
  }
  if ((st = dt_model_ctx_backward(m, wk->ctx, wk->dlogits)) != DT_OK) goto fail;
  return;
fail:
  record_error(wk, st);
}

static void run_forward(dp_worker *wk) {
  struct dt_dp *d = wk->d;
  const float *logits = NULL;
  dt_status st = dt_model_ctx_forward(d->m, wk->ctx, d->x + (size_t)wk->lo * d->sample_bytes, wk->n, &logits);
  if (st != DT_OK) {
    record_error(wk, st);
    return;
  }
  memcpy(d->out + (size_t)wk->lo * d->classes, logits, (size_t)wk->n * (size_t)d->classes * sizeof(float));
}

/* acc[i] += g_w[i] for i in [b, e), w the contributing workers between the first and the last in order: the partial
 * sums that the last worker's gradient completes. */
static void partial_sums(struct dt_dp *d, float *acc, size_t b, size_t e) {
  for (int w = d->first + 1; w < d->last; w++) {
    if (d->w[w].n == 0) continue;
    const float *g = dt_model_ctx_grads(d->w[w].ctx);
    for (size_t i = b; i < e; i++) acc[i] += g[i];
  }
}

/* For i in [b, e): arena[i] (+)= ((g_first[i] + g_1[i]) + ...) + g_last[i], the contributing workers' gradients
 * in worker order, stored under d->assign, else added. acc is the first contributing worker's arena: it holds
 * the partial sums where more than two workers contribute. */
static void reduce_span(struct dt_dp *d, float *acc, size_t b, size_t e) {
  const int first = d->first, last = d->last;
  partial_sums(d, acc, b, e);
  const float *g = last > first ? dt_model_ctx_grads(d->w[last].ctx) : NULL;
  float *out = d->grads;
  if (d->assign && g)
    for (size_t i = b; i < e; i++) out[i] = acc[i] + g[i];
  else if (d->assign)
    memcpy(out + b, acc + b, (e - b) * sizeof(float));
  else if (g)
    for (size_t i = b; i < e; i++) out[i] += acc[i] + g[i];
  else
    for (size_t i = b; i < e; i++) out[i] += acc[i];
}

/* The dense part [b, e) in blocks that stay in cache. */
static void reduce_dense(struct dt_dp *d, float *acc, size_t b, size_t e) {
  for (; b < e; b += DP_REDUCE_BLOCK) reduce_span(d, acc, b, b + DP_REDUCE_BLOCK < e ? b + DP_REDUCE_BLOCK : e);
}

/* Worker w's share [lo, hi) of the arena: equal parts, 16-float aligned. */
static void share_of(const struct dt_dp *d, int w, size_t *lo, size_t *hi) {
  const size_t per = ((d->n_params + (size_t)d->workers - 1) / (size_t)d->workers + 15) & ~(size_t)15;
  *lo = per * (size_t)w;
  *hi = *lo + per < d->n_params ? *lo + per : d->n_params;
}

/* arena[i] (+)= g_0[i] + g_1[i] + ... (workers with a slice, in worker order) for this worker's share
 * [lo, hi) of the arena. Each element is summed in the same order whoever sums it, so the result depends on
 * the worker count only. Partial sums are built in the first contributing worker's buffer. A row table is summed
 * only at the rows some worker touched (the model context's marks, merged before): every worker's gradient
 * is zero elsewhere, and an embedding table can be far larger than the rows a step reads. */
static void run_reduce(dp_worker *wk) {
  struct dt_dp *d = wk->d;
  size_t lo, hi;
  share_of(d, wk->index, &lo, &hi);
  if (lo >= hi) return;
  float *acc = dt_model_ctx_grads(d->w[d->first].ctx);
  const dt_model_ctx *mc = dt_model_default_ctx(d->m);
  size_t at = lo;
  for (int k = 0; k < dt_model_num_row_tables(d->m) && at < hi; k++) {
    dt_rows t;
    dt_model_ctx_rows(d->m, mc, k, &t);
    const size_t t_lo = t.off, t_hi = t.off + (size_t)(t.rows * t.width), w = (size_t)t.width;
    if (t_hi <= at) continue;
    reduce_dense(d, acc, at, t_lo < hi ? (t_lo > at ? t_lo : at) : hi);
    const size_t s_lo = lo > t_lo ? lo : t_lo, s_hi = hi < t_hi ? hi : t_hi;
    for (int64_t i = 0; i < t.n; i++) {
      const size_t r0 = t.off + (size_t)t.list[i] * w, r1 = r0 + w;
      const size_t b = r0 > s_lo ? r0 : s_lo, e = r1 < s_hi ? r1 : s_hi;
      if (b < e) reduce_span(d, acc, b, e);
    }
    at = t_hi;
  }
  if (at < hi) reduce_dense(d, acc, at, hi);
}

/* Block [b, e)'s sums where a deferred zero_grad left the arena to be stored (d->assign): the partial sums built in
 * acc, and the last worker's gradient added into the worker's own block, or acc itself where one worker
 * contributes. The same sums as reduce_span stores, never written to the arena. Returns element b's. */
static const float *block_sums(struct dt_dp *d, dp_worker *wk, float *acc, size_t b, size_t e) {
  partial_sums(d, acc, b, e);
  if (d->last == d->first) return acc + b;
  const float *g = dt_model_ctx_grads(d->w[d->last].ctx);
  float *s = wk->sums_block;
  for (size_t i = b; i < e; i++) s[i - b] = acc[i] + g[i];
  return s;
}

/* run_reduce and the worker's part of the optimizer step, block by block: each block of the sums is updated
 * from while it is in cache, and the arena is read once where the two jobs read it twice. After a deferred
 * zero_grad the sums go from the worker's block straight into the update and the arena is not written at all
 * (dt_dp_optim_step defers its zero again). Dense models only (dt_dp_train_step reduces at once where there are
 * row tables). The update is element by element and the sums are run_reduce's: the bits of the two jobs. */
static void run_step(dp_worker *wk) {
  struct dt_dp *d = wk->d;
  size_t lo, hi;
  share_of(d, wk->index, &lo, &hi);
  float *acc = dt_model_ctx_grads(d->w[d->first].ctx), *params = dt_model_params(d->m, NULL);
  for (size_t b = lo; b < hi; b += DP_REDUCE_BLOCK) {
    const size_t e = b + DP_REDUCE_BLOCK < hi ? b + DP_REDUCE_BLOCK : hi;
    if (d->assign) {
      dt_optim_step_block(d->optim, params, block_sums(d, wk, acc, b, e), d->lr, b, e);
      continue;
    }
    reduce_span(d, acc, b, e);
    dt_optim_step_range(d->optim, params, d->grads, d->lr, b, e);
  }
}

/* Worker w's share of the clip's chunks: their sums of squares (dt_clip_chunk_sum, each chunk's bits whoever sums
 * it). */
static void run_clip_sum(dp_worker *wk) {
  struct dt_dp *d = wk->d;
  const size_t n = d->clip_chunks, w = (size_t)wk->index, workers = (size_t)d->workers;
  for (size_t c = n * w / workers; c < n * (w + 1) / workers; c++) {
    const size_t lo = c * d->clip_chunk, hi = lo + d->clip_chunk < d->n_params ? lo + d->clip_chunk : d->n_params;
    d->clip_sums[c] = dt_clip_chunk_sum(d->grads, lo, hi);
  }
}

static void run_clip_scale(dp_worker *wk) {
  struct dt_dp *d = wk->d;
  size_t lo, hi;
  share_of(d, wk->index, &lo, &hi);
  const float coef = d->clip_coef;
  for (size_t i = lo; i < hi; i++) d->grads[i] *= coef;
}

/* The row-table rows the workers touched are now non-zero in the model's arena too: its zero_grad and a
 * row-wise optimizer step must see them. They may also be non-zero in the first contributing worker's arena,
 * where run_reduce builds partial sums: its next zero_grad must clear them, or they would leak into its next
 * gradients. */
static void touch_rows(dt_dp *d) {
  dt_model_ctx *mc = dt_model_default_ctx(d->m);
  const int first = d->first;
  for (int k = 0; k < dt_model_num_row_tables(d->m); k++)
    for (int w = 0; w < d->workers; w++) {
      if (d->w[w].n == 0) continue;
      dt_rows t;
      dt_model_ctx_rows(d->m, d->w[w].ctx, k, &t);
      dt_model_ctx_rows_touch(d->m, mc, k, t.list, t.n);
      if (w != first) dt_model_ctx_rows_touch(d->m, d->w[first].ctx, k, t.list, t.n);
    }
}

/* This worker's part of job. */
static void run_job(dp_worker *wk, dp_job job) {
  struct dt_dp *d = wk->d;
  wk->st = DT_OK;
  wk->err[0] = '\0';
  const double t0 = job >= DP_JOB_REDUCE && dt_trace_enabled() ? dt_trace_now_us() : 0;
  if (job == DP_JOB_REDUCE)
    run_reduce(wk);
  else if (job == DP_JOB_STEP)
    run_step(wk);
  else if (job == DP_JOB_OPTIM)
    dt_optim_step_part(d->optim, dt_model_params(d->m, NULL), d->grads, d->lr, wk->index, d->workers);
  else if (job == DP_JOB_CLIP_SUM)
    run_clip_sum(wk);
  else if (job == DP_JOB_CLIP_SCALE)
    run_clip_scale(wk);
  else if (wk->n > 0)
    (job == DP_JOB_TRAIN ? run_train : run_forward)(wk);
  /* each worker's share of the reduce and the update, beside its forward and backward spans */
  static const char *const names[] = {[DP_JOB_REDUCE] = "dp reduce", [DP_JOB_OPTIM] = "dp optimizer share",
                                      [DP_JOB_STEP] = "dp reduce + optimizer share",
                                      [DP_JOB_CLIP_SUM] = "dp clip norm share", [DP_JOB_CLIP_SCALE] = "dp clip share"};
  if (t0 > 0) dt_trace_span("dp", names[job], t0, dt_trace_now_us(), NULL);
}

/* Bounded spins before a sleep on the handshake: a small model's jobs are tens of microseconds apart, and a
 * sleeping thread's wake-up (an idle vCPU's, here) cost about as much. */
static void spin_while_equal_u64(_Atomic uint64_t *v, uint64_t old) {
  const double t0 = dt_time_now();
  for (unsigned i = 1; atomic_load_explicit(v, memory_order_acquire) == old; i++) {
    dt_cpu_relax();
    if ((i & 63) == 0 && dt_time_now() - t0 > DP_SPIN_S) return;
  }
}

static void spin_while_positive(_Atomic int *v) {
  const double t0 = dt_time_now();
  for (unsigned i = 1; atomic_load_explicit(v, memory_order_acquire) > 0; i++) {
    dt_cpu_relax();
    if ((i & 63) == 0 && dt_time_now() - t0 > DP_SPIN_S) return;
  }
}

/* A worker with a thread of its own (worker 0 has none where the calling thread runs it: see dispatch). */
static void *worker_main(void *arg) {
  dp_worker *wk = arg;
  struct dt_dp *d = wk->d;
  /* The OpenMP thread count is a per-thread setting: this worker's own parallel regions (conv kernels,
   * element-wise loops) use its share of the compute budget. */
  omp_set_num_threads(d->omp_threads);
  uint64_t seen = 0;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    if (d->spin && d->generation == seen && !d->quit) { /* the next job most likely comes within microseconds */
      pthread_mutex_unlock(&d->mu);
      spin_while_equal_u64(&d->generation, seen);
      pthread_mutex_lock(&d->mu);
    }
    while (d->generation == seen && !d->quit) pthread_cond_wait(&d->wake, &d->mu);
    if (d->quit) break;
    seen = d->generation;
    const dp_job job = d->job;
    pthread_mutex_unlock(&d->mu);
    run_job(wk, job);
    pthread_mutex_lock(&d->mu);
    if (--d->pending == 0) pthread_cond_signal(&d->done);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

/* Runs job on every worker and waits for all of them. Where inline0, the calling thread is worker 0, with the
 * workers' share of OpenMP threads while it is: it would only wait otherwise, and one thread hand-off fewer per
 * job is what a small model's step notices (two or three jobs a step; one worker then runs no thread at all). */
static void dispatch(dt_dp *d, dp_job job) {
  const int threads = d->workers - d->inline0;
  if (threads > 0) {
    pthread_mutex_lock(&d->mu);
    d->job = job;
    d->pending = threads;
    d->generation++;
    pthread_cond_broadcast(&d->wake);
    pthread_mutex_unlock(&d->mu);
  }
  if (d->inline0) {
    const int own = omp_get_max_threads();
    if (own != d->omp_threads) omp_set_num_threads(d->omp_threads);
    run_job(&d->w[0], job);
    if (own != d->omp_threads) omp_set_num_threads(own);
  }
  if (threads > 0) {
    if (d->spin) spin_while_positive(&d->pending);
    pthread_mutex_lock(&d->mu);
    while (d->pending > 0) pthread_cond_wait(&d->done, &d->mu);
    pthread_mutex_unlock(&d->mu);
  }
}

/* BLAS threads. OpenBLAS (OpenMP build, 0.3.21 here) takes its thread count from its own global setting,
 * not from the calling thread's OpenMP setting: measured, a pthread that set omp_set_num_threads(1) still
 * ran a 1024^3 sgemm on 2 threads (CPU/wall 1.94) with the global count at 2. So each worker calling BLAS
 * would use the whole budget, workers x budget threads in all, and concurrent multi-threaded calls from
 * several non-OpenMP threads share OpenBLAS's buffer sets, where a caller finding none free waits in a
 * spinning loop (unless OpenBLAS was built with NUM_PARALLEL). The safe choice: with several workers BLAS
 * is pinned to one thread while they run (each worker's GEMMs run on its own thread, side by side with the
 * others'), and the budget is restored afterwards for the single-process path. One worker changes nothing.
 * The cost: with budget > workers, each worker's BLAS calls use one thread while its own loops use
 * budget / workers. */
static void set_blas_for_workers(const dt_dp *d, int on) {
  if (!d->blas_pinned) return;
  openblas_set_num_threads(on ? 1 : dt_get_threads());
}

static dt_status first_error(const dt_dp *d, const char *what) {
  for (int w = 0; w < d->workers; w++)
    if (d->w[w].st != DT_OK)
      return dt_error(d->w[w].st, "%s: worker %d (samples %d..%d): %s", what, w, d->w[w].lo,
                      d->w[w].lo + d->w[w].n - 1, d->w[w].err);
  return DT_OK;
}

static void stop_threads(dt_dp *d) {
  pthread_mutex_lock(&d->mu);
  d->quit = 1;
  pthread_cond_broadcast(&d->wake);
  pthread_mutex_unlock(&d->mu);
  for (int w = d->inline0; w < d->inline0 + d->started; w++) pthread_join(d->w[w].thread, NULL);
  d->started = 0;
}

void dt_dp_free(dt_dp *d) {
  if (!d) return;
  stop_threads(d);
  for (int w = d->w ? d->workers - 1 : -1; w >= 0; w--) {
    dt_free(d->w[w].dlogits);
    dt_free(d->w[w].sums_block);
    dt_model_ctx_free(d->w[w].ctx);
  }
  dt_free(d->w);
  pthread_cond_destroy(&d->done);
  pthread_cond_destroy(&d->wake);
  pthread_mutex_destroy(&d->mu);
  dt_free(d);
}

int dt_dp_workers(const dt_dp *d) { return d ? d->workers : 0; }
uint64_t dt_dp_rng_step(const dt_dp *d, int w) {
  return d && w >= 0 && w < d->workers ? dt_model_ctx_rng_step(d->w[w].ctx) : 0;
}
void dt_dp_set_rng_step(dt_dp *d, int w, uint64_t step) {
  if (d && w >= 0 && w < d->workers) dt_model_ctx_set_rng_step(d->w[w].ctx, step);
}

dt_status dt_dp_new(dt_model *m, int workers, int max_batch, dt_dp **out) {
  if (!m || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_new: NULL argument");
  if (workers < 1 || workers > DP_MAX_WORKERS)
    return dt_error(DT_INVALID_ARGUMENT, "dt_dp_new: workers %d, expected 1..%d", workers, DP_MAX_WORKERS);
  if (max_batch < 1) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_new: max_batch %d, expected >= 1", max_batch);
  size_t n_params = 0;
  float *grads = dt_model_grads(m, &n_params);
  if (!grads && n_params) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_new: the model has no gradient arena");
  const int classes = dt_model_output_size(m);
  if (classes < 1) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_new: the model has no output; build it first");

  dt_dp *d = NULL;
  dt_status st = dt_alloc_array(1, sizeof *d, "dt_dp", (void **)&d);
  if (st != DT_OK) return st;
  d->m = m;
  d->loss_scale = 1.0f;
  d->workers = workers;
  d->max_batch = max_batch;
  d->max_slice = (max_batch + workers - 1) / workers;
  d->classes = classes;
  int ndim = 0;
  const int64_t *shape = dt_model_input_shape(m, &ndim);
  d->sample_bytes = dt_dtype_size(dt_model_input_dtype(m));
  for (int i = 0; i < ndim; i++) d->sample_bytes *= (size_t)shape[i];
  d->n_params = n_params;
  d->grads = grads;
  const int budget = dt_get_threads();
  d->omp_threads = budget / workers > 1 ? budget / workers : 1;
  d->blas_pinned = workers > 1;
  /* The calling thread runs worker 0 only where that leaves its OpenMP pool as it is: with one worker (its own
   * count) or one thread per worker (a one-thread region does not touch the pool). A share between those would
   * shrink the pool the caller's whole-budget regions (fp16's unscale, a row-wise optimizer step) grow back,
   * every step. */
  d->inline0 = workers == 1 || d->omp_threads == 1;
  d->spin = (long)workers * d->omp_threads <= dt_usable_cores();
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->wake, NULL);
  pthread_cond_init(&d->done, NULL);
  DT_CHECK_GOTO(dt_alloc_array((size_t)workers, sizeof *d->w, "dt_dp workers", (void **)&d->w), st, fail);
  for (int w = 0; w < workers; w++) {
    dp_worker *wk = &d->w[w];
    wk->d = d;
    wk->index = w;
    /* Only worker 0's training forwards update the BN running statistics, from its slice alone: what
     * nn.DataParallel gives, where each replica updates its own copy of the buffers and only the first
     * replica's (device 0's) are the module's afterwards. */
    DT_CHECK_GOTO(dt_model_ctx_new(m, d->max_slice, w == 0, &wk->ctx), st, fail);
    /* Distinct dropout masks per worker; worker 0 draws what the model's own context draws at stream 0. */
    dt_model_ctx_set_rng_stream(wk->ctx, (uint64_t)w);
    DT_CHECK_GOTO(dt_alloc_array((size_t)d->max_slice * (size_t)classes, sizeof(float), "dt_dp dlogits",
                                 (void **)&wk->dlogits),
                  st, fail);
    DT_CHECK_GOTO(dt_alloc_array(DP_REDUCE_BLOCK, sizeof(float), "dt_dp sums block", (void **)&wk->sums_block), st,
                  fail);
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, DP_STACK_BYTES);
  for (int w = d->inline0; w < workers; w++) {
    int rc = pthread_create(&d->w[w].thread, &attr, worker_main, &d->w[w]);
    if (rc != 0) {
      pthread_attr_destroy(&attr);
      st = dt_error(DT_INTERNAL, "dt_dp_new: starting the thread of worker %d (of %d): %s", w, workers,
                    strerror(rc));
      goto fail;
    }
    d->started++;
  }
  pthread_attr_destroy(&attr);
  DT_LOG_INFO("dp", "%d worker(s), slices up to %d of %d, %d OpenMP thread(s) each, BLAS %s", workers,
              d->max_slice, max_batch, d->omp_threads, d->blas_pinned ? "single-threaded per worker" : "as set");
  *out = d;
  return DT_OK;
fail:
  dt_dp_free(d);
  return st;
}

static dt_status check_batch(const dt_dp *d, const char *what, int batch) {
  if (batch < 1 || batch > d->max_batch)
    return dt_error(DT_INVALID_ARGUMENT, "%s: batch %d outside 1..%d (max_batch of dt_dp_new)", what, batch,
                    d->max_batch);
  return DT_OK;
}

/* Every worker's slice, and the first and last with samples (batch >= 1: worker 0 always has some). */
static void set_slices(dt_dp *d, int batch) {
  d->first = 0;
  d->last = 0;
  for (int w = 0; w < d->workers; w++) {
    slice_of(batch, d->workers, w, &d->w[w].lo, &d->w[w].n);
    if (d->w[w].n > 0) d->last = w;
  }
}

/* The last train step's reduce, if it is still to run (the model's gradients change only when every slice ran). */
static void reduce_now(dt_dp *d) {
  if (!d->unreduced) return;
  d->unreduced = 0;
  dispatch(d, DP_JOB_REDUCE);
}

dt_status dt_dp_train_step(dt_dp *d, const dt_task *task, const void *x, const void *target, int batch, float *loss,
                           double *sums) {
  if (!d || !task || !x || !target) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_train_step: NULL argument");
  DT_CHECK(check_batch(d, "dt_dp_train_step", batch));
  const int n_sums = dt_task_num_sums(task);
  if (dt_task_config_of(task)->outputs != d->classes)
    return dt_error(DT_INVALID_ARGUMENT, "dt_dp_train_step: the task has %d outputs, the model %d",
                    dt_task_config_of(task)->outputs, d->classes);
  if (n_sums > DP_MAX_SUMS)
    return dt_error(DT_INTERNAL, "dt_dp_train_step: %d task counters, at most %d", n_sums, DP_MAX_SUMS);
  reduce_now(d); /* a step that did not reach the optimizer (accumulation): its sums first */
  set_slices(d, batch);
  d->x = x;
  d->target = target;
  d->target_bytes = (size_t)dt_task_target_width(task) * dt_dtype_size(dt_task_target_dtype(task));
  d->task = task;
  d->batch = batch;
  set_blas_for_workers(d, 1);
  dispatch(d, DP_JOB_TRAIN);
  dt_status st = first_error(d, "dt_dp_train_step");
  if (st == DT_OK) {
    touch_rows(d); /* the union of touched rows, which the reduce sums */
    /* After a deferred zero_grad the reduce stores the sums, sparing a pass that clears the arena on this thread
     * while the workers wait; else it adds to what the arena holds (accumulation). */
    d->assign = dt_model_ctx_grads_take_deferred(dt_model_default_ctx(d->m));
    d->unreduced = 1;
    if (!d->fused || dt_model_num_row_tables(d->m) > 0) reduce_now(d);
  }
  set_blas_for_workers(d, 0);
  if (st != DT_OK) return st;
  double loss_sum = 0.0; /* sum of slice mean * slice size: the whole batch's mean times batch */
  for (int w = 0; w < d->workers; w++) {
    if (d->w[w].n == 0) continue;
    loss_sum += (double)d->w[w].loss * d->w[w].n;
    for (int k = 0; sums && k < n_sums; k++) sums[k] += d->w[w].sums[k];
  }
  if (loss) *loss = (float)(loss_sum / batch);
  return DT_OK;
}

/* The workers take the step, each a part of the arena: no OpenMP region of the whole budget runs on the calling
 * thread beside them (where it is worker 0, its part runs one thread, or is the only part), so no pool of its
 * threads spins beside the workers (an optimizer step of the whole budget on the calling thread would leave
 * OpenMP's workers spinning into the next step's forward, and the DP workers would share the cores with them;
 * OMP_WAIT_POLICY=passive was the remedy the user had to know). */
dt_status dt_dp_optim_step(dt_dp *d, dt_optim *o, float lr) {
  if (!d || !o) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_optim_step: NULL argument");
  DT_CHECK(dt_optim_begin_step(o, lr));
  d->optim = o;
  d->lr = lr;
  const int stored_nothing = d->unreduced && d->assign;
  /* The plain update reads the arena through d->grads: what a deferred zero_grad (or a fused step before)
   * left unwritten is cleared first, as every reader of the arena sees it (nothing to clear otherwise). */
  if (!d->unreduced) (void)dt_model_grads(d->m, NULL);
  dispatch(d, d->unreduced ? DP_JOB_STEP : DP_JOB_OPTIM);
  d->unreduced = 0;
  /* The sums went into the update without touching the arena, which still holds what it held before the
   * deferred zero_grad: it reads as zeroed again. */
  if (stored_nothing) dt_model_zero_grad_deferred(d->m);
  d->optim = NULL;
  return DT_OK;
}

/* The norm's chunks summed by the workers, a share each, then added in chunk order here; the scaling, where it
 * clips, by the workers, a share of the arena each: dt_clip_grad_norm's bits, with no OpenMP region of the calling
 * thread's (whose idle threads would spin beside the workers into the next step). */
dt_status dt_dp_clip_grad_norm(dt_dp *d, float max_norm, float *norm) {
  if (!d) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_clip_grad_norm: NULL argument");
  DT_CHECK(dt_clip_check(max_norm));
  reduce_now(d);
  (void)dt_model_grads(d->m, NULL); /* what a deferred zero_grad left unwritten is cleared first */
  d->clip_chunks = dt_clip_chunks(d->n_params, &d->clip_chunk);
  dispatch(d, DP_JOB_CLIP_SUM);
  double sum = 0;
  for (size_t c = 0; c < d->clip_chunks; c++) sum += d->clip_sums[c];
  d->clip_coef = dt_clip_coef(sum, max_norm, norm);
  if (d->clip_coef < 1.0f) dispatch(d, DP_JOB_CLIP_SCALE);
  return DT_OK;
}

void dt_dp_set_fill(dt_dp *d, dt_dp_fill_fn fill, void *user) {
  if (!d) return;
  d->fill = fill;
  d->fill_user = user;
}

void dt_dp_set_fused_step(dt_dp *d, int on) {
  if (d) d->fused = on != 0;
}

dt_status dt_dp_reduce(dt_dp *d) {
  if (!d) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_reduce: NULL argument");
  reduce_now(d);
  return DT_OK;
}

dt_status dt_dp_forward(dt_dp *d, const void *x, int batch, float *out) {
  if (!d || !x || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_dp_forward: NULL argument");
  DT_CHECK(check_batch(d, "dt_dp_forward", batch));
  reduce_now(d); /* a pending sum reads the slices of its train step, which set_slices replaces */
  set_slices(d, batch);
  d->x = x;
  d->out = out;
  d->batch = batch;
  set_blas_for_workers(d, 1);
  dispatch(d, DP_JOB_FORWARD);
  set_blas_for_workers(d, 0);
  return first_error(d, "dt_dp_forward");
}

dt_status dt_dp_set_amp(dt_dp *d, dt_amp mode) {
  for (int w = 0; w < d->workers; w++) DT_CHECK(dt_model_ctx_set_amp(d->m, d->w[w].ctx, mode));
  return DT_OK;
}

void dt_dp_set_loss_scale(dt_dp *d, float scale) { d->loss_scale = scale; }

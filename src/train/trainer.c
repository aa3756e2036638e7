/* The training loop: data, zoo model, optimizer, schedule; per-epoch metrics, evaluation, weights. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "dtrain/dtrain.h"
#include "dtrain/snapshot.h"
#include "dtrain/trace.h"
#include "io/report.h"
#include "io/tensorboard.h"
#include "io/trace_merge.h"
#include "train/train_impl.h"

#define TRAIN_PATH_MAX 4096

static volatile sig_atomic_t stop_requested;

void dt_train_request_stop(void) { stop_requested = 1; }
int dt_train_stop_requested(void) { return stop_requested != 0; }
void dt_train_clear_stop(void) { stop_requested = 0; }

/* Everything a run owns, released in reverse by run_free. */
typedef struct run {
  dt_dataset *train, *test;
  dt_loader *train_loader, *test_loader;
  dt_model *model;
  dt_optim *optim;
  float *dlogits; /* (batch, classes) */
  dt_metrics_writer *metrics;
  dt_prefix_sampler train_prefix, test_prefix;
  /* parallel strategies */
  dt_group *group;  /* ddp */
  dt_ddp *ddp;
  dt_dist_sampler *train_shard, *test_shard;
  dt_dp *dp;
  int rank, world;
  /* outputs */
  dt_tb_writer *tb;
  char config_json[8192];
  dt_epoch_metrics *history; /* (history_cap) metrics rows of the completed epochs */
  int n_history, history_cap;
  dt_report_point *throughput; /* (throughput_cap) training samples/s over time, for the report */
  int n_throughput, throughput_cap;
  double t_start;
} run;

static void run_free(run *r) {
  dt_free(r->throughput);
  dt_free(r->history);
  dt_tb_close(r->tb);
  dt_dp_free(r->dp);
  dt_ddp_free(r->ddp);
  dt_dist_sampler_free(r->test_shard);
  dt_dist_sampler_free(r->train_shard);
  dt_group_destroy(r->group);
  dt_metrics_close(r->metrics);
  dt_free(r->dlogits);
  dt_optim_free(r->optim);
  dt_model_free(r->model);
  dt_loader_free(r->test_loader);
  dt_loader_free(r->train_loader);
  dt_dataset_free(r->test);
  dt_dataset_free(r->train);
}

/* A loader over the whole split, or over its first `limit` samples through the prefix sampler. */
static dt_status make_loader(const dt_dataset *ds, int batch, int shuffle, uint64_t seed, int64_t limit,
                             dt_prefix_sampler *prefix, dt_loader **out) {
  dt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = batch;
  lc.shuffle = shuffle;
  lc.seed = seed;
  int64_t size = dt_dataset_size(ds);
  if (limit > 0 && limit < size) {
    prefix->n = limit;
    prefix->shuffle = shuffle;
    prefix->seed = seed;
    lc.sampler = dt_prefix_sampler_fn;
    lc.sampler_user = prefix;
    lc.sampler_capacity = limit;
  }
  return dt_loader_new(ds, &lc, out);
}

/* A loader over this rank's shard of the first n samples (DistributedSampler:
 * PyTorch's index lists, padded so every rank gets the same count). */
static dt_status make_shard_loader(const dt_dataset *ds, int batch, int shuffle, uint64_t seed, int64_t n, run *r,
                                   dt_dist_sampler **shard, dt_loader **out) {
  DT_CHECK(dt_dist_sampler_new(n, r->world, r->rank, seed, shuffle, 0, shard));
  dt_loader_config lc;
  memset(&lc, 0, sizeof lc);
  lc.batch_size = batch;
  lc.seed = seed;
  lc.sampler = dt_dist_sampler_fn;
  lc.sampler_user = *shard;
  lc.sampler_capacity = dt_dist_sampler_num_samples(*shard);
  if (lc.sampler_capacity < 1) lc.sampler_capacity = 1;
  return dt_loader_new(ds, &lc, out);
}

static void join_widths(const int *w, int n, char *buf, size_t len) {
  size_t pos = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && pos < len; i++) {
    int k = snprintf(buf + pos, len - pos, "%s%d", i ? "," : "", w[i]);
    if (k < 0) break;
    pos += (size_t)k;
  }
}

/* The metadata of weights and snapshots: what the model is and how it was trained. */
typedef struct run_meta {
  char hidden[256], epochs[32], seed[32], acc1[32], acc5[32], norm[64], dropout[32];
  dt_kv kv[16];
  int n;
} run_meta;

static void run_meta_fill(run_meta *rm, const dt_train_config *c, const dt_epoch_metrics *last, int epochs_done) {
  join_widths(c->hidden, c->n_hidden, rm->hidden, sizeof rm->hidden);
  snprintf(rm->epochs, sizeof rm->epochs, "%d", epochs_done);
  snprintf(rm->seed, sizeof rm->seed, "%llu", (unsigned long long)c->seed);
  snprintf(rm->acc1, sizeof rm->acc1, "%.6f", last ? last->test_acc1 : 0.0);
  snprintf(rm->acc5, sizeof rm->acc5, "%.6f", last ? last->test_acc5 : 0.0);
  rm->norm[0] = '\0';
  if (c->normalize.enabled)
    snprintf(rm->norm, sizeof rm->norm, "%.9g,%.9g", (double)c->normalize.mean, (double)c->normalize.std);
  rm->dropout[0] = '\0';
  if (c->dropout >= 0) snprintf(rm->dropout, sizeof rm->dropout, "%g", (double)c->dropout);
  const dt_kv kv[] = {
      {"format", "pt"},         {"dtrain_version", DTRAIN_VERSION}, {"model", c->model},     {"hidden", rm->hidden},
      {"dropout", rm->dropout}, {"data", c->data},                  {"normalize", rm->norm}, {"epochs", rm->epochs},
      {"seed", rm->seed},       {"test_acc1", rm->acc1},            {"test_acc5", rm->acc5},
  };
  rm->n = (int)(sizeof kv / sizeof kv[0]);
  memcpy(rm->kv, kv, sizeof kv);
}

static dt_status save_weights(const dt_train_config *c, dt_model *m, const dt_epoch_metrics *last, int epochs_done) {
  char path[TRAIN_PATH_MAX];
  if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", c->out_dir) >= sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
  run_meta rm;
  run_meta_fill(&rm, c, last, epochs_done);
  double t0 = dt_trace_now_us();
  dt_status st = dt_model_save(m, path, rm.kv, rm.n);
  if (dt_trace_enabled()) dt_trace_span("io", "save weights", t0, dt_trace_now_us(), NULL);
  if (st != DT_OK) return dt_error_prefix(st, "saving %s", path);
  return DT_OK;
}

/* Output directory, config.json and the metrics files: before any training, so
 * an unwritable --out fails at once. A resumed run's metrics files start again
 * from the snapshot's rows (the epochs after it are trained again). */
static dt_status open_outputs(const dt_train_config *c, run *r) {
  char path[TRAIN_PATH_MAX];
  dt_status st = dt_mkdir_p(c->out_dir, 0777);
  if (st != DT_OK) return st;
  if (c->save_every || c->save_every_steps || c->save_on_interrupt) {
    if ((size_t)snprintf(path, sizeof path, "%s/snapshots", c->out_dir) >= sizeof path)
      return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
    DT_CHECK(dt_mkdir_p(path, 0777));
  }
  DT_CHECK(dt_metrics_open(c->out_dir, &r->metrics));
  for (int i = 0; i < r->n_history; i++) DT_CHECK(dt_metrics_write(r->metrics, &r->history[i]));
  size_t n = strlen(r->config_json);
  char json[sizeof r->config_json + 2];
  memcpy(json, r->config_json, n);
  memcpy(json + n, "\n", 2);
  if ((size_t)snprintf(path, sizeof path, "%s/config.json", c->out_dir) >= sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
  return dt_file_write_text(path, json);
}

/* Sums over ranks (a no-op without a group): train/eval counters become global. */
static dt_status sum_over_ranks(run *r, double *v, size_t n) {
  if (!r->group) return DT_OK;
  return dt_allreduce(r->group, v, v, n, DT_F64, DT_SUM, NULL);
}

/* Per-rank figures of the end-of-run table, gathered on every rank. */
enum { RK_WALL, RK_USER, RK_SYS, RK_SAMPLES, RK_COMPUTE, RK_DATA, RK_COMM, RK_COMM_TOTAL, RK_TOP1, RK_TOP5, RK_N };

static void print_rank_table(FILE *f, const double *all, int world) {
  fprintf(f, "\n%5s %8s %8s %7s %9s %10s %9s %9s %7s %7s\n", "rank", "wall s", "user s", "sys s", "samples",
          "compute s", "data s", "comm s", "top-1", "top-5");
  for (int q = 0; q < world; q++) {
    const double *v = all + (size_t)q * RK_N;
    fprintf(f, "%5d %8.2f %8.2f %7.2f %9.0f %10.2f %9.2f %9.2f %6.2f%% %6.2f%%\n", q, v[RK_WALL], v[RK_USER],
            v[RK_SYS], v[RK_SAMPLES], v[RK_COMPUTE], v[RK_DATA], v[RK_COMM], 100 * v[RK_TOP1], 100 * v[RK_TOP5]);
  }
  fflush(f);
}

/* Joins the group of the launcher (dtrun, torchrun, mpirun, srun). */
static dt_status join_group(const dt_train_config *c, run *r) {
  dt_group_options o;
  dt_group_options_default(&o);
  o.backend = c->backend ? c->backend : "auto";
  o.timeout_s = c->timeout_s;
  char url[300];
  if (c->master) {
    snprintf(url, sizeof url, "tcp://%s", c->master);
    o.init_method = url;
  }
  DT_CHECK(dt_group_init(&o, &r->group));
  r->rank = dt_group_rank(r->group);
  r->world = dt_group_size(r->group);
  return DT_OK;
}

/* ---- snapshots and resume ------------------------------------------------------ */

/* Where a resumed run starts. */
typedef struct resume_point {
  int active;
  dt_snapshot_position pos;
  char path[TRAIN_PATH_MAX];
} resume_point;

/* Rank 0: loads the snapshot --resume names (auto: the newest loadable one in
 * out_dir, falling back past damaged ones) and checks it fits this run. */
static dt_status resume_load(const dt_train_config *c, run *r, int64_t steps_per_epoch, resume_point *rp) {
  dt_status st = DT_OK;
  if (strcmp(c->resume, "auto") != 0) {
    snprintf(rp->path, sizeof rp->path, "%s", c->resume);
    st = dt_snapshot_load(rp->path, c->model, r->model, r->optim, &rp->pos, &r->history, &r->n_history);
    if (st != DT_OK) return dt_error_prefix(st, "--resume %s", c->resume);
  } else {
    int64_t before = INT64_MAX, found;
    int damaged = 0;
    for (;;) {
      st = dt_snapshot_find(c->out_dir, before, rp->path, sizeof rp->path, &found);
      if (st == DT_NOT_FOUND && damaged == 0) {
        if (c->progress) fprintf(c->progress, "resume auto: no snapshot in %s/snapshots, starting afresh\n", c->out_dir);
        dt_clear_error();
        return DT_OK;
      }
      if (st == DT_NOT_FOUND)
        return dt_error(DT_CORRUPT, "resume auto: none of the %d snapshot(s) in %s/snapshots could be loaded (see the "
                        "warnings above); delete them to start afresh", damaged, c->out_dir);
      DT_CHECK(st);
      st = dt_snapshot_load(rp->path, c->model, r->model, r->optim, &rp->pos, &r->history, &r->n_history);
      if (st == DT_OK) break;
      if (st == DT_SHAPE_MISMATCH || st == DT_INVALID_ARGUMENT) return st; /* another model or optimizer: no fallback */
      DT_LOG_WARN("train", "resume auto: skipping a damaged snapshot: %s", dt_last_error());
      damaged++;
      before = found;
    }
  }
  const dt_snapshot_position *p = &rp->pos;
  int layout_differs = p->world_size != r->world || p->batch_size != c->batch_size || p->accumulate != c->accumulate ||
                       p->steps_per_epoch != steps_per_epoch;
  if (layout_differs && p->epoch_step > 0)
    return dt_error(DT_MISMATCH,
                    "%s was taken in the middle of epoch %lld with %lld rank(s), batch %lld, accumulate %lld; this run "
                    "has %d, %d, %d: resume with the same workers, --batch-size and --accumulate, or from a snapshot "
                    "taken at the end of an epoch",
                    rp->path, (long long)p->epoch + 1, (long long)p->world_size, (long long)p->batch_size,
                    (long long)p->accumulate, r->world, c->batch_size, c->accumulate);
  if (layout_differs || (uint64_t)p->seed != c->seed)
    DT_LOG_WARN("train",
                "%s was written by a run with %lld rank(s), batch %lld, seed %lld; this run differs, so it continues "
                "from the snapshot but not bit for bit as the original run would have",
                rp->path, (long long)p->world_size, (long long)p->batch_size, (long long)p->seed);
  rp->active = 1;
  return DT_OK;
}

/* With ddp, rank 0's resume decision, position and optimizer state go to every
 * rank (the model itself comes with DDP's initial broadcast): only rank 0 needs
 * the file, so hosts need no shared file system. `local` is rank 0's outcome. */
static dt_status resume_share(run *r, dt_status local, resume_point *rp) {
  if (!r->group) return local;
  enum { H_STATE, H_OPTIM_STEP, H_N_RNG, H_POS, H_RNG = H_POS + 8, H_N = H_RNG + DT_SNAPSHOT_MAX_RNG };
  int64_t h[H_N];
  memset(h, 0, sizeof h);
  const dt_snapshot_position *p = &rp->pos;
  h[H_STATE] = local != DT_OK ? -1 : rp->active;
  if (r->rank == 0 && rp->active) {
    h[H_OPTIM_STEP] = dt_optim_step_count(r->optim);
    h[H_N_RNG] = p->n_rng;
    const int64_t v[8] = {p->epoch, p->epoch_step, p->step, p->world_size, p->batch_size, p->accumulate,
                          p->steps_per_epoch, p->seed};
    memcpy(h + H_POS, v, sizeof v);
    for (int i = 0; i < p->n_rng; i++) h[H_RNG + i] = (int64_t)p->rng_step[i];
  }
  DT_CHECK(dt_broadcast(r->group, h, H_N, DT_I64, 0, NULL));
  if (h[H_STATE] < 0)
    return r->rank == 0 ? local : dt_error(DT_MISMATCH, "rank 0 could not resume from a snapshot (its error says why)");
  if (r->rank == 0 || h[H_STATE] == 0) return DT_OK;
  dt_snapshot_position q;
  memset(&q, 0, sizeof q);
  q.epoch = h[H_POS];
  q.epoch_step = h[H_POS + 1];
  q.step = h[H_POS + 2];
  q.world_size = h[H_POS + 3];
  q.batch_size = h[H_POS + 4];
  q.accumulate = h[H_POS + 5];
  q.steps_per_epoch = h[H_POS + 6];
  q.seed = h[H_POS + 7];
  q.n_rng = (int)h[H_N_RNG];
  for (int i = 0; i < q.n_rng && i < DT_SNAPSHOT_MAX_RNG; i++) q.rng_step[i] = (uint64_t)h[H_RNG + i];
  rp->pos = q; /* the unfinished epoch's sums stay on rank 0: they are summed over ranks at its end */
  rp->active = 1;
  dt_optim_set_step_count(r->optim, h[H_OPTIM_STEP]);
  return DT_OK;
}

/* The optimizer state of rank 0 to every rank (after resume_share). */
static dt_status resume_share_optim(run *r, const resume_point *rp, size_t n_params) {
  if (!r->group || !rp->active) return DT_OK;
  for (int i = 0; i < dt_optim_num_states(r->optim); i++)
    DT_CHECK(dt_broadcast(r->group, dt_optim_state(r->optim, i, NULL), n_params, DT_F32, 0, NULL));
  return DT_OK;
}

/* Dropout steps of the model or of every dp worker, into or out of a position. */
static void rng_get(run *r, dt_snapshot_position *p) {
  if (r->dp) {
    p->n_rng = dt_dp_workers(r->dp);
    for (int w = 0; w < p->n_rng; w++) p->rng_step[w] = dt_dp_rng_step(r->dp, w);
  } else {
    p->n_rng = 1;
    p->rng_step[0] = dt_model_rng_step(r->model);
  }
}

static void rng_set(run *r, const dt_snapshot_position *p) {
  if (r->dp) {
    for (int w = 0; w < dt_dp_workers(r->dp); w++) dt_dp_set_rng_step(r->dp, w, p->rng_step[w < p->n_rng ? w : 0]);
  } else {
    dt_model_set_rng_step(r->model, p->rng_step[0]);
  }
}

/* A metrics row into the history the snapshots and the report carry. */
static dt_status history_add(run *r, const dt_epoch_metrics *m) {
  if (r->n_history == r->history_cap) {
    int cap = r->history_cap ? 2 * r->history_cap : 16;
    dt_epoch_metrics *grown = NULL;
    DT_CHECK(dt_alloc_array((size_t)cap, sizeof *grown, "metrics history", (void **)&grown));
    if (r->n_history) memcpy(grown, r->history, (size_t)r->n_history * sizeof *grown);
    dt_free(r->history);
    r->history = grown;
    r->history_cap = cap;
  }
  r->history[r->n_history++] = *m;
  return DT_OK;
}

/* Writes a snapshot of the run at `pos` (rank 0) and deletes the oldest beyond --keep. */
static dt_status take_snapshot(const dt_train_config *c, run *r, dt_snapshot_position *pos) {
  rng_get(r, pos);
  if (r->rank != 0) return DT_OK;
  char path[TRAIN_PATH_MAX], world[16], step[32];
  if ((size_t)snprintf(path, sizeof path, "%s/snapshots/step-%09lld.safetensors", c->out_dir, (long long)pos->step) >=
      sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
  run_meta rm;
  run_meta_fill(&rm, c, r->n_history ? &r->history[r->n_history - 1] : NULL, (int)pos->epoch);
  snprintf(world, sizeof world, "%d", r->world);
  snprintf(step, sizeof step, "%lld", (long long)pos->step);
  const dt_kv extra[] = {{"dtrain.snapshot", "1"}, {"step", step}, {"world_size", world}, {"config", r->config_json}};
  memcpy(rm.kv + rm.n, extra, sizeof extra);
  int n_meta = rm.n + (int)(sizeof extra / sizeof extra[0]);
  double t0 = dt_trace_now_us();
  dt_status st = dt_snapshot_save(path, r->model, r->optim, pos, r->history, r->n_history, rm.kv, n_meta);
  if (dt_trace_enabled()) dt_trace_span("io", "snapshot", t0, dt_trace_now_us(), NULL);
  if (st != DT_OK) return dt_error_prefix(st, "snapshot %s (the previous snapshots are intact)", path);
  DT_CHECK(dt_snapshot_prune(c->out_dir, c->keep));
  DT_LOG_INFO("train", "snapshot %s (epoch %lld, step %lld)", path, (long long)pos->epoch, (long long)pos->step);
  return DT_OK;
}

/* ---- TensorBoard, throughput, report -------------------------------------------------- */

/* Scalars of one window of training steps (rank-local sums). */
typedef struct tb_window {
  double loss_sum, top1, top5, samples, t0;
  int steps;
} tb_window;

static dt_status tb_scalar(run *r, const char *tag, int64_t step, double v) {
  return r->tb ? dt_tb_scalar(r->tb, tag, step, (float)v) : DT_OK;
}

/* The end of a window: TensorBoard scalars (this rank's; throughput of the job) and a report point. */
static dt_status window_close(run *r, tb_window *w, int64_t step, float lr) {
  double now = dt_time_now(), dt = now - w->t0;
  double sps = dt > 0 ? w->samples * r->world / dt : 0;
  if (w->samples > 0) {
    DT_CHECK(tb_scalar(r, "Loss/train", step, w->loss_sum / w->samples));
    DT_CHECK(tb_scalar(r, "acc1/train", step, w->top1 / w->samples));
    DT_CHECK(tb_scalar(r, "acc5/train", step, w->top5 / w->samples));
    DT_CHECK(tb_scalar(r, "lr", step, lr));
    DT_CHECK(tb_scalar(r, "throughput/samples_per_s", step, sps));
    if (r->tb) DT_CHECK(dt_tb_flush(r->tb));
    if (r->rank == 0 && dt > 0) {
      if (r->n_throughput == r->throughput_cap) {
        int cap = r->throughput_cap ? 2 * r->throughput_cap : 256;
        dt_report_point *grown = NULL;
        DT_CHECK(dt_alloc_array((size_t)cap, sizeof *grown, "throughput points", (void **)&grown));
        if (r->n_throughput) memcpy(grown, r->throughput, (size_t)r->n_throughput * sizeof *grown);
        dt_free(r->throughput);
        r->throughput = grown;
        r->throughput_cap = cap;
      }
      r->throughput[r->n_throughput++] = (dt_report_point){.t_s = now - r->t_start, .samples_per_s = sps};
    }
  }
  memset(w, 0, sizeof *w);
  w->t0 = now;
  return DT_OK;
}

/* out_dir/report.html from the history so far; ranks: (world, RK_N) figures or NULL (rank 0's own split). */
static dt_status write_report(const dt_train_config *c, run *r, const dt_train_result *res, const double *ranks) {
  char path[TRAIN_PATH_MAX], title[256];
  if ((size_t)snprintf(path, sizeof path, "%s/report.html", c->out_dir) >= sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
  snprintf(title, sizeof title, "%s on %s (%s, %d rank%s)", c->model, c->data, dt_strategy_name(c->strategy), r->world,
           r->world == 1 ? "" : "s");
  int world = ranks ? r->world : 1;
  dt_report_rank *split = NULL;
  DT_CHECK(dt_alloc_array((size_t)world, sizeof *split, "report", (void **)&split));
  if (ranks) {
    for (int q = 0; q < world; q++) {
      const double *v = ranks + (size_t)q * RK_N;
      split[q] = (dt_report_rank){.compute_s = v[RK_COMPUTE], .data_s = v[RK_DATA], .comm_s = v[RK_COMM]};
    }
  } else {
    split[0] = (dt_report_rank){res->compute_seconds, res->data_wait_seconds, res->comm_seconds};
  }
  dt_report rep = {.title = title,
                   .config_json = r->config_json,
                   .epochs = r->history,
                   .n_epochs = r->n_history,
                   .throughput = r->throughput,
                   .n_throughput = r->n_throughput,
                   .ranks = split,
                   .world = world,
                   .summary_lines = NULL};
  dt_status st = dt_report_write(path, &rep);
  dt_free(split);
  return st;
}

/* Rank 0's train/val scalars of an epoch and the report so far. */
static dt_status epoch_outputs(const dt_train_config *c, run *r, const dt_epoch_metrics *m, const dt_train_result *so_far) {
  DT_CHECK(tb_scalar(r, "Loss/val", m->step, m->test_loss));
  DT_CHECK(tb_scalar(r, "acc1/val", m->step, m->test_acc1));
  DT_CHECK(tb_scalar(r, "acc5/val", m->step, m->test_acc5));
  if (r->tb) DT_CHECK(dt_tb_flush(r->tb));
  if (c->out_dir && r->rank == 0) DT_CHECK(write_report(c, r, so_far, NULL));
  return DT_OK;
}

/* --trace FILE is written at the end: its directory is made now, so a bad path fails before training. */
static dt_status make_trace_dir(const char *path) {
  char dir[TRAIN_PATH_MAX];
  if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir)
    return dt_error(DT_INVALID_ARGUMENT, "--trace: file name too long");
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return DT_OK; /* the working directory, or / */
  *slash = '\0';
  dt_status st = dt_mkdir_p(dir, 0777);
  return st == DT_OK ? DT_OK : dt_error_prefix(st, "--trace %s", path);
}

/* TensorBoard writers: rank 0 into DIR, every other rank into DIR/rank<R> with --tensorboard-all-ranks. */
static dt_status open_tensorboard(const dt_train_config *c, run *r) {
  if (!c->tensorboard || (r->rank != 0 && !c->tensorboard_all_ranks)) return DT_OK;
  char dir[TRAIN_PATH_MAX];
  if (r->rank == 0)
    snprintf(dir, sizeof dir, "%s", c->tensorboard);
  else if ((size_t)snprintf(dir, sizeof dir, "%s/rank%d", c->tensorboard, r->rank) >= sizeof dir)
    return dt_error(DT_INVALID_ARGUMENT, "tensorboard directory name too long");
  /* The pid in the name keeps the file of a quick restart (same second) apart, as PyTorch's writer does. */
  char suffix[32];
  snprintf(suffix, sizeof suffix, ".%ld", (long)getpid());
  return dt_tb_open(dir, suffix, &r->tb);
}

dt_status dt_train_run(const dt_train_config *c, dt_train_result *res) {
  DT_CHECK(dt_train_config_check(c));
  double t_start = dt_time_now(), cpu_u0, cpu_s0;
  dt_cpu_time(&cpu_u0, &cpu_s0);
  run r;
  memset(&r, 0, sizeof r);
  r.world = 1;
  r.t_start = t_start;
  dt_train_result out;
  memset(&out, 0, sizeof out);
  out.resumed_epoch = -1;
  dt_status st = DT_OK;
  const int ddp = c->strategy == DT_STRATEGY_DDP;
  resume_point rp;
  memset(&rp, 0, sizeof rp);

  DT_CHECK_GOTO(dt_set_threads(c->threads), st, done);
  if (ddp) DT_CHECK_GOTO(join_group(c, &r), st, done);
  const int lead = r.rank == 0; /* writes files, prints progress */
  if (c->trace) {
    if (lead) DT_CHECK_GOTO(make_trace_dir(c->trace), st, done);
    DT_CHECK_GOTO(dt_trace_enable(r.rank), st, done);
    dt_trace_thread_name("main");
  }
  DT_CHECK_GOTO(dt_train_config_json(c, r.config_json, sizeof r.config_json), st, done);
  DT_CHECK_GOTO(dt_dataset_load(c->data, DT_SPLIT_TRAIN, &c->normalize, &r.train), st, done);
  DT_CHECK_GOTO(dt_dataset_load(c->data, DT_SPLIT_TEST, &c->normalize, &r.test), st, done);

  dt_zoo_config zc;
  memset(&zc, 0, sizeof zc);
  dt_dataset_sample_shape(r.train, zc.sample_shape);
  zc.classes = dt_dataset_classes(r.train);
  zc.hidden = c->n_hidden ? c->hidden : NULL;
  zc.n_hidden = c->n_hidden;
  zc.dropout = c->dropout;
  int classes = zc.classes;
  DT_CHECK_GOTO(dt_model_zoo_new(c->model, &zc, &r.model), st, done);
  DT_CHECK_GOTO(dt_model_build(r.model, c->batch_size, c->seed), st, done);
  dt_model_set_rng_stream(r.model, (uint64_t)r.rank); /* each rank its own dropout masks */
  dt_model_set_training(r.model, 1);
  size_t n_params = 0, n_grads = 0;
  float *params = dt_model_params(r.model, &n_params);
  float *grads = dt_model_grads(r.model, &n_grads);
  if (n_params != n_grads) {
    st = dt_error(DT_INTERNAL, "parameter arena %zu floats, gradient arena %zu", n_params, n_grads);
    goto done;
  }
  DT_CHECK_GOTO(dt_optim_new(&c->optim, n_params, &r.optim), st, done);
  DT_CHECK_GOTO(dt_alloc_array((size_t)c->batch_size * (size_t)classes, sizeof(float), "logit gradients",
                               (void **)&r.dlogits),
                st, done);

  int64_t n_train = dt_dataset_size(r.train), n_test = dt_dataset_size(r.test);
  if (c->limit_train > 0 && c->limit_train < n_train) n_train = c->limit_train;
  if (c->limit_test > 0 && c->limit_test < n_test) n_test = c->limit_test;
  int64_t my_train = n_train, my_test = n_test; /* samples this rank visits per epoch / counts in eval */
  if (ddp) {
    DT_CHECK_GOTO(make_shard_loader(r.train, c->batch_size, 1, c->seed, n_train, &r, &r.train_shard, &r.train_loader),
                  st, done);
    DT_CHECK_GOTO(make_shard_loader(r.test, c->batch_size, 0, 0, n_test, &r, &r.test_shard, &r.test_loader), st, done);
    my_train = dt_dist_sampler_num_samples(r.train_shard);
    my_test = dt_dist_sampler_num_real(r.test_shard);
  } else {
    DT_CHECK_GOTO(make_loader(r.train, c->batch_size, 1, c->seed, c->limit_train, &r.train_prefix, &r.train_loader),
                  st, done);
    DT_CHECK_GOTO(make_loader(r.test, c->batch_size, 0, 0, c->limit_test, &r.test_prefix, &r.test_loader), st, done);
  }

  /* The schedule in optimizer steps (a last partial batch, or accumulation group, is a step too). */
  int64_t batches_per_epoch = (my_train + c->batch_size - 1) / c->batch_size;
  int64_t steps_per_epoch = (batches_per_epoch + c->accumulate - 1) / c->accumulate;
  int64_t total_steps = steps_per_epoch * c->epochs;
  dt_lr_schedule sched;
  memset(&sched, 0, sizeof sched);
  sched.kind = c->schedule;
  sched.base_lr = c->lr;
  sched.warmup_steps = c->warmup_steps > 0 ? c->warmup_steps : (int64_t)c->warmup_epochs * steps_per_epoch;
  sched.warmup_start = 1.0f / 3.0f; /* torch LinearLR's default start_factor */
  sched.step_size = (int64_t)c->step_size_epochs * steps_per_epoch;
  if (sched.step_size < 1) sched.step_size = 1;
  sched.gamma = c->gamma;
  sched.total_steps = total_steps - sched.warmup_steps;
  if (sched.total_steps < 1) sched.total_steps = 1;
  sched.min_lr = c->min_lr;
  DT_CHECK_GOTO(dt_lr_schedule_check(&sched), st, done);

  /* Resume: rank 0 loads the snapshot before DDP broadcasts its model to the others. */
  if (c->resume) {
    dt_status local = lead ? resume_load(c, &r, steps_per_epoch, &rp) : DT_OK;
    DT_CHECK_GOTO(resume_share(&r, local, &rp), st, done);
  }
  if (ddp) DT_CHECK_GOTO(dt_ddp_new(r.model, r.group, &c->ddp, &r.ddp), st, done);
  DT_CHECK_GOTO(resume_share_optim(&r, &rp, n_params), st, done);
  if (c->strategy == DT_STRATEGY_DP) {
    int workers = c->workers > 0 ? c->workers : dt_get_threads();
    DT_CHECK_GOTO(dt_dp_new(r.model, workers, c->batch_size, &r.dp), st, done);
  }
  r.history_cap = r.n_history; /* the rows a snapshot brought */
  if (rp.active) {
    rng_set(&r, &rp.pos);
    out.resumed_epoch = (int)rp.pos.epoch;
    out.resumed_step = rp.pos.step;
    snprintf(out.resumed_from, sizeof out.resumed_from, "%.511s", rp.path);
    out.epochs_done = (int)rp.pos.epoch;
    if (lead && c->progress)
      fprintf(c->progress, "resumed from %s: epoch %lld, step %lld\n", rp.path, (long long)rp.pos.epoch + 1,
              (long long)rp.pos.step);
  }

  if (c->out_dir && lead) DT_CHECK_GOTO(open_outputs(c, &r), st, done);
  DT_CHECK_GOTO(open_tensorboard(c, &r), st, done);
  DT_LOG_INFO("train", "%s (%s, rank %d of %d): %zu parameters, %lld samples, %lld steps/epoch", c->model,
              dt_strategy_name(c->strategy), r.rank, r.world, n_params, (long long)n_train,
              (long long)steps_per_epoch);

  dt_progress prog;
  dt_progress_init(&prog, lead ? c->progress : NULL, c->progress_mode, c->epochs);
  int64_t step = rp.active ? rp.pos.step : 0, all_samples = 0;
  double train_time = 0, comm_wait_total = 0;
  int have_row = 0;
  const float micro_scale = 1.0f / (float)c->accumulate;
  dt_snapshot_position at; /* where the run is, for snapshots */
  memset(&at, 0, sizeof at);
  at.world_size = r.world;
  at.batch_size = c->batch_size;
  at.accumulate = c->accumulate;
  at.steps_per_epoch = steps_per_epoch;
  at.seed = (int64_t)c->seed;
  tb_window win;
  memset(&win, 0, sizeof win);
  win.t0 = dt_time_now();
  int first = rp.active ? (int)rp.pos.epoch : 0;
  int64_t stop_epoch_step = 0; /* the step of the epoch a stop request ended it at */
  int stop_epoch = -1;
  double stop_sums[3] = {0, 0, 0};
  for (int e = first; e < c->epochs && !out.interrupted; e++) {
    DT_CHECK_GOTO(dt_loader_start_epoch(r.train_loader, e), st, done);
    dt_progress_epoch_start(&prog, e + 1, steps_per_epoch);
    dt_ddp_stats ds0 = {0};
    if (r.ddp) dt_ddp_get_stats(r.ddp, &ds0);
    double t0 = dt_time_now(), wait0 = dt_loader_wait_seconds(r.train_loader);
    double loss_sum = 0, counted = 0; /* metrics of the epoch (a resumed one starts from the snapshot's) */
    int64_t correct = 0, seen = 0, skipped = 0, epoch_step = 0, micro = 0;
    if (rp.active && e == first && rp.pos.epoch_step > 0) {
      /* Resuming inside the epoch: its order is a function of (seed, epoch), so skip the batches already trained. */
      for (int64_t k = 0; k < rp.pos.epoch_step * c->accumulate; k++) {
        dt_batch b;
        DT_CHECK_GOTO(dt_loader_next(r.train_loader, &b), st, done);
        if (b.size == 0) break;
        seen += b.size;
      }
      skipped = seen;
      epoch_step = rp.pos.epoch_step;
      if (lead) {
        loss_sum = rp.pos.epoch_sums[0];
        correct = (int64_t)rp.pos.epoch_sums[1];
        counted = rp.pos.epoch_sums[2];
      }
    }
    float lr = c->lr;
    for (;;) {
      /* A stop request ends the epoch at a step boundary; with ddp every rank
       * must stop at the same step, so rank 0's request is shared. */
      if (micro == 0) {
        int stop = stop_requested != 0;
        if (r.group) {
          int32_t s32 = stop;
          DT_CHECK_GOTO(dt_allreduce(r.group, &s32, &s32, 1, DT_I32, DT_MAX, NULL), st, done);
          stop = s32 != 0;
        }
        if (stop) {
          out.interrupted = 1;
          break;
        }
      }
      dt_batch b;
      double tw = dt_trace_now_us();
      DT_CHECK_GOTO(dt_loader_next(r.train_loader, &b), st, done);
      if (dt_trace_enabled()) dt_trace_span("train", "wait for data", tw, dt_trace_now_us(), NULL);
      if (b.size == 0) break;
      float loss = 0;
      int64_t top1 = 0, top5 = 0;
      int last_micro = micro == c->accumulate - 1 || seen + b.size >= my_train;
      if (micro == 0) dt_model_zero_grad(r.model);
      if (r.dp) {
        /* dp adds the whole batch's gradient; accumulation is scaled before the step. */
        DT_CHECK_GOTO(dt_dp_train_step(r.dp, b.x, b.y, b.size, c->label_smoothing, &loss, &top1, &top5), st, done);
      } else {
        const float *logits = NULL;
        if (r.ddp) {
          dt_ddp_set_sync(r.ddp, last_micro);
          DT_CHECK_GOTO(dt_ddp_before_forward(r.ddp), st, done);
        }
        DT_CHECK_GOTO(dt_model_forward(r.model, b.x, b.size, &logits), st, done);
        DT_CHECK_GOTO(dt_loss_cross_entropy(logits, b.y, b.size, classes, c->label_smoothing, &loss, r.dlogits), st,
                      done);
        dt_topk_correct(logits, b.y, b.size, classes, 1, &top1, &top5);
        if (c->accumulate > 1)
          for (size_t i = 0; i < (size_t)b.size * (size_t)classes; i++) r.dlogits[i] *= micro_scale;
        DT_CHECK_GOTO(dt_model_backward(r.model, r.dlogits), st, done);
      }
      if (!isfinite(loss)) {
        st = dt_error(DT_INVALID_ARGUMENT, "loss is %f at epoch %d step %lld: lower the learning rate (--lr %g now)",
                      (double)loss, e + 1, (long long)step + 1, (double)c->lr);
        goto done;
      }
      seen += b.size;
      counted += b.size;
      loss_sum += (double)loss * b.size;
      correct += top1;
      win.loss_sum += (double)loss * b.size;
      win.top1 += (double)top1;
      win.top5 += (double)top5;
      win.samples += b.size;
      if (!last_micro) {
        micro++;
        continue;
      }
      micro = 0;
      double to = dt_trace_now_us();
      if (r.ddp) DT_CHECK_GOTO(dt_ddp_finish(r.ddp), st, done);
      if (r.dp && c->accumulate > 1)
        for (size_t i = 0; i < n_grads; i++) grads[i] *= micro_scale;
      if (c->clip_grad_norm > 0) {
        float norm = 0;
        DT_CHECK_GOTO(dt_clip_grad_norm(grads, n_grads, c->clip_grad_norm, &norm), st, done);
      }
      lr = dt_lr_at(&sched, step);
      DT_CHECK_GOTO(dt_optim_step(r.optim, params, grads, lr), st, done);
      if (dt_trace_enabled()) dt_trace_span("train", r.ddp ? "wait for all-reduce + optimizer" : "optimizer", to,
                                            dt_trace_now_us(), NULL);
      step++;
      epoch_step++;
      dt_progress_step(&prog, epoch_step, counted > 0 ? loss_sum / counted : 0, seen * r.world);
      if (step % c->log_every == 0) DT_CHECK_GOTO(window_close(&r, &win, step, lr), st, done);
      /* A step snapshot; one that falls on the epoch's last step waits for its evaluation. */
      if (c->save_every_steps > 0 && step % c->save_every_steps == 0 && epoch_step < steps_per_epoch) {
        double ps[3] = {loss_sum, (double)correct, counted};
        DT_CHECK_GOTO(sum_over_ranks(&r, ps, 3), st, done);
        at.epoch = e;
        at.epoch_step = epoch_step;
        at.step = step;
        memcpy(at.epoch_sums, ps, sizeof ps);
        DT_CHECK_GOTO(take_snapshot(c, &r, &at), st, done);
      }
    }
    double t1 = dt_time_now();
    /* Every rank agrees whether anything was trained (ranks see equal shards). */
    double sums[3] = {loss_sum, (double)correct, counted};
    DT_CHECK_GOTO(sum_over_ranks(&r, sums, 3), st, done);
    if (out.interrupted) {
      stop_epoch = e;
      stop_epoch_step = epoch_step;
      memcpy(stop_sums, sums, sizeof sums);
    }
    if (sums[2] == 0) break; /* stopped before the epoch's first step: nothing new to report */

    dt_epoch_metrics m;
    memset(&m, 0, sizeof m);
    m.epoch = e + 1;
    m.step = step;
    m.lr = lr;
    m.train_samples = (int64_t)sums[2];
    m.train_loss = sums[0] / sums[2];
    m.train_acc1 = sums[1] / sums[2];
    m.epoch_seconds = t1 - t0;
    m.train_samples_per_s = m.epoch_seconds > 0 ? (double)((seen - skipped) * r.world) / m.epoch_seconds : 0;
    m.data_wait_seconds = dt_loader_wait_seconds(r.train_loader) - wait0;
    if (r.ddp) {
      dt_ddp_stats ds1;
      dt_ddp_get_stats(r.ddp, &ds1);
      m.comm_seconds = ds1.wait_s - ds0.wait_s; /* what backward did not hide */
    }
    m.compute_seconds = m.epoch_seconds - m.data_wait_seconds - m.comm_seconds;
    dt_eval_sums ev;
    double te = dt_trace_now_us();
    if (r.ddp) DT_CHECK_GOTO(dt_ddp_before_forward(r.ddp), st, done); /* every rank evaluates rank 0's statistics */
    DT_CHECK_GOTO(dt_train_evaluate(r.model, r.dp, r.test_loader, classes, ddp ? my_test : -1, &ev), st, done);
    if (dt_trace_enabled()) dt_trace_span("eval", "evaluate", te, dt_trace_now_us(), NULL);
    double es[4] = {(double)ev.samples, ev.loss_sum, (double)ev.top1, (double)ev.top5};
    out.test_acc1 = ev.samples ? (double)ev.top1 / (double)ev.samples : NAN; /* this rank's shard, for its row */
    out.test_acc5 = ev.samples ? (double)ev.top5 / (double)ev.samples : NAN;
    DT_CHECK_GOTO(sum_over_ranks(&r, es, 4), st, done);
    double nt = es[0] > 0 ? es[0] : NAN;
    m.test_loss = es[1] / nt;
    m.test_acc1 = es[2] / nt;
    m.test_acc5 = es[3] / nt;
    m.eval_seconds = ev.seconds;
    m.infer_samples_per_s = ev.seconds > 0 ? es[0] / ev.seconds : 0;
    if (r.metrics) DT_CHECK_GOTO(dt_metrics_write(r.metrics, &m), st, done);
    dt_progress_epoch_end(&prog, &m);

    out.last = m;
    have_row = 1;
    train_time += m.epoch_seconds;
    all_samples += seen - skipped;
    out.compute_seconds += m.compute_seconds;
    out.data_wait_seconds += m.data_wait_seconds;
    out.comm_seconds += m.comm_seconds;
    comm_wait_total += m.comm_seconds;
    if (out.interrupted) break; /* a partial epoch: reported, not part of the history */
    out.epochs_done++;
    DT_CHECK_GOTO(history_add(&r, &m), st, done);
    DT_CHECK_GOTO(epoch_outputs(c, &r, &m, &out), st, done);
    int at_epoch = c->save_every > 0 && (e + 1) % c->save_every == 0;
    int at_step = c->save_every_steps > 0 && step % c->save_every_steps == 0;
    if (at_epoch || at_step) {
      memset(at.epoch_sums, 0, sizeof at.epoch_sums);
      at.epoch = e + 1;
      at.epoch_step = 0;
      at.step = step;
      DT_CHECK_GOTO(take_snapshot(c, &r, &at), st, done);
    }
  }
  if (stop_requested) out.interrupted = 1;
  if (out.interrupted && c->save_on_interrupt && stop_epoch >= 0) {
    /* Where the stop request ended the run: the next run resumes at this very step. */
    at.epoch = stop_epoch;
    at.epoch_step = stop_epoch_step;
    at.step = step;
    memcpy(at.epoch_sums, stop_sums, sizeof stop_sums);
    if (at.epoch_step == 0) memset(at.epoch_sums, 0, sizeof at.epoch_sums);
    DT_CHECK_GOTO(take_snapshot(c, &r, &at), st, done);
  }
  if (c->out_dir && lead)
    DT_CHECK_GOTO(save_weights(c, r.model, have_row ? &out.last : NULL, out.epochs_done), st, done);

  out.steps = step;
  out.params = n_params;
  out.rank = r.rank;
  out.world_size = r.world;
  if (r.group) snprintf(out.backend, sizeof out.backend, "%s", dt_group_backend(r.group));
  /* Throughput of the whole job: every rank's samples over the training time. */
  out.train_samples_per_s = train_time > 0 ? (double)all_samples * r.world / train_time : 0;
  out.infer_samples_per_s = out.last.infer_samples_per_s;
  double my_acc1 = out.test_acc1, my_acc5 = out.test_acc5;
  out.test_loss = have_row ? out.last.test_loss : NAN;
  out.test_acc1 = have_row ? out.last.test_acc1 : NAN;
  out.test_acc5 = have_row ? out.last.test_acc5 : NAN;
  if (r.ddp) {
    dt_ddp_stats ds;
    dt_ddp_get_stats(r.ddp, &ds);
    out.comm_total_seconds = ds.comm_s;
    out.comm_hidden = ds.comm_s > 0 ? 1.0 - comm_wait_total / ds.comm_s : 0;
    if (out.comm_hidden < 0) out.comm_hidden = 0;
  }
  double cpu_u1, cpu_s1;
  dt_cpu_time(&cpu_u1, &cpu_s1);
  out.cpu_user_seconds = cpu_u1 - cpu_u0;
  out.cpu_sys_seconds = cpu_s1 - cpu_s0;
  out.peak_rss_bytes = dt_peak_rss();
  out.wall_seconds = dt_time_now() - t_start;
  double *all = NULL; /* (world, RK_N): the table users make by hand, every rank's time split and accuracy */
  {
    double mine[RK_N] = {out.wall_seconds, out.cpu_user_seconds, out.cpu_sys_seconds, (double)all_samples,
                         out.compute_seconds, out.data_wait_seconds, out.comm_seconds, out.comm_total_seconds,
                         my_acc1, my_acc5};
    DT_CHECK_GOTO(dt_alloc_array((size_t)r.world * RK_N, sizeof(double), "rank table", (void **)&all), st, done);
    if (r.group)
      st = dt_allgather(r.group, mine, all, (size_t)r.world * RK_N, DT_F64, NULL);
    else
      memcpy(all, mine, sizeof mine);
    if (st == DT_OK && r.group && lead && c->progress) print_rank_table(c->progress, all, r.world);
  }
  if (st == DT_OK && c->out_dir && lead) st = dt_train_write_summary(c->out_dir, c->model, &out);
  if (st == DT_OK && c->out_dir && lead) st = write_report(c, &r, &out, all);
  dt_free(all);
  if (st != DT_OK) goto done;
  if (c->trace) DT_CHECK_GOTO(dt_trace_write_merged(r.group, c->trace), st, done);
  *res = out;
done:
  run_free(&r); /* loader threads stop here: then the recorded events can go */
  if (c->trace) dt_trace_reset();
  return st;
}

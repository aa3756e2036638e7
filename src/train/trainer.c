/* The training loop: data, zoo model, optimizer, schedule; per-epoch metrics, evaluation, weights. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "dtrain/dtrain.h"
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
} run;

static void run_free(run *r) {
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

static dt_status save_weights(const dt_train_config *c, dt_model *m, const dt_epoch_metrics *last, int epochs_done) {
  char path[TRAIN_PATH_MAX], hidden[256], epochs[32], seed[32], acc1[32], acc5[32], norm[64], dropout[32];
  if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", c->out_dir) >= sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
  join_widths(c->hidden, c->n_hidden, hidden, sizeof hidden);
  snprintf(epochs, sizeof epochs, "%d", epochs_done);
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->seed);
  snprintf(acc1, sizeof acc1, "%.6f", last ? last->test_acc1 : 0.0);
  snprintf(acc5, sizeof acc5, "%.6f", last ? last->test_acc5 : 0.0);
  norm[0] = '\0';
  if (c->normalize.enabled) snprintf(norm, sizeof norm, "%.9g,%.9g", (double)c->normalize.mean, (double)c->normalize.std);
  dropout[0] = '\0';
  if (c->dropout >= 0) snprintf(dropout, sizeof dropout, "%g", (double)c->dropout);
  const dt_kv meta[] = {
      {"format", "pt"},     {"dtrain_version", DTRAIN_VERSION}, {"model", c->model},   {"hidden", hidden},
      {"dropout", dropout}, {"data", c->data},                  {"normalize", norm},   {"epochs", epochs},
      {"seed", seed},       {"test_acc1", acc1},                {"test_acc5", acc5},
  };
  dt_status st = dt_model_save(m, path, meta, (int)(sizeof meta / sizeof meta[0]));
  if (st != DT_OK) return dt_error_prefix(st, "saving %s", path);
  return DT_OK;
}

/* Output directory, config.json and the metrics files: before any training, so
 * an unwritable --out fails at once. */
static dt_status open_outputs(const dt_train_config *c, run *r) {
  char path[TRAIN_PATH_MAX], json[8192];
  dt_status st = dt_train_mkdir_p(c->out_dir);
  if (st != DT_OK) return st;
  DT_CHECK(dt_metrics_open(c->out_dir, &r->metrics));
  DT_CHECK(dt_train_config_json(c, json, sizeof json - 1));
  strcat(json, "\n");
  if ((size_t)snprintf(path, sizeof path, "%s/config.json", c->out_dir) >= sizeof path)
    return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
  return dt_train_write_file(path, json);
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

dt_status dt_train_run(const dt_train_config *c, dt_train_result *res) {
  DT_CHECK(dt_train_config_check(c));
  double t_start = dt_time_now(), cpu_u0, cpu_s0;
  dt_cpu_time(&cpu_u0, &cpu_s0);
  run r;
  memset(&r, 0, sizeof r);
  r.world = 1;
  dt_train_result out;
  memset(&out, 0, sizeof out);
  dt_status st = DT_OK;
  const int ddp = c->strategy == DT_STRATEGY_DDP;

  DT_CHECK_GOTO(dt_set_threads(c->threads), st, done);
  if (ddp) DT_CHECK_GOTO(join_group(c, &r), st, done);
  const int lead = r.rank == 0; /* writes files, prints progress */
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
  if (ddp) DT_CHECK_GOTO(dt_ddp_new(r.model, r.group, &c->ddp, &r.ddp), st, done);
  if (c->strategy == DT_STRATEGY_DP) {
    int workers = c->workers > 0 ? c->workers : dt_get_threads();
    DT_CHECK_GOTO(dt_dp_new(r.model, workers, c->batch_size, &r.dp), st, done);
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

  if (c->out_dir && lead) DT_CHECK_GOTO(open_outputs(c, &r), st, done);
  DT_LOG_INFO("train", "%s (%s, rank %d of %d): %zu parameters, %lld samples, %lld steps/epoch", c->model,
              dt_strategy_name(c->strategy), r.rank, r.world, n_params, (long long)n_train,
              (long long)steps_per_epoch);

  dt_progress prog;
  dt_progress_init(&prog, lead ? c->progress : NULL, c->progress_mode, c->epochs);
  int64_t step = 0, all_samples = 0;
  double train_time = 0, comm_wait_total = 0;
  int have_row = 0;
  const float micro_scale = 1.0f / (float)c->accumulate;
  for (int e = 0; e < c->epochs && !out.interrupted; e++) {
    DT_CHECK_GOTO(dt_loader_start_epoch(r.train_loader, e), st, done);
    dt_progress_epoch_start(&prog, e + 1, steps_per_epoch);
    dt_ddp_stats ds0 = {0};
    if (r.ddp) dt_ddp_get_stats(r.ddp, &ds0);
    double t0 = dt_time_now(), wait0 = dt_loader_wait_seconds(r.train_loader);
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, epoch_step = 0, micro = 0;
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
      DT_CHECK_GOTO(dt_loader_next(r.train_loader, &b), st, done);
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
      loss_sum += (double)loss * b.size;
      correct += top1;
      if (!last_micro) {
        micro++;
        continue;
      }
      micro = 0;
      if (r.ddp) DT_CHECK_GOTO(dt_ddp_finish(r.ddp), st, done);
      if (r.dp && c->accumulate > 1)
        for (size_t i = 0; i < n_grads; i++) grads[i] *= micro_scale;
      if (c->clip_grad_norm > 0) {
        float norm = 0;
        DT_CHECK_GOTO(dt_clip_grad_norm(grads, n_grads, c->clip_grad_norm, &norm), st, done);
      }
      lr = dt_lr_at(&sched, step);
      DT_CHECK_GOTO(dt_optim_step(r.optim, params, grads, lr), st, done);
      step++;
      epoch_step++;
      dt_progress_step(&prog, epoch_step, loss_sum / (double)seen, seen * r.world);
    }
    double t1 = dt_time_now();
    /* Every rank agrees whether anything was trained (ranks see equal shards). */
    double sums[3] = {loss_sum, (double)correct, (double)seen};
    DT_CHECK_GOTO(sum_over_ranks(&r, sums, 3), st, done);
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
    m.train_samples_per_s = m.epoch_seconds > 0 ? sums[2] / m.epoch_seconds : 0;
    m.data_wait_seconds = dt_loader_wait_seconds(r.train_loader) - wait0;
    if (r.ddp) {
      dt_ddp_stats ds1;
      dt_ddp_get_stats(r.ddp, &ds1);
      m.comm_seconds = ds1.wait_s - ds0.wait_s; /* what backward did not hide */
    }
    m.compute_seconds = m.epoch_seconds - m.data_wait_seconds - m.comm_seconds;
    dt_eval_sums ev;
    if (r.ddp) DT_CHECK_GOTO(dt_ddp_before_forward(r.ddp), st, done); /* every rank evaluates rank 0's statistics */
    DT_CHECK_GOTO(dt_train_evaluate(r.model, r.dp, r.test_loader, classes, ddp ? my_test : -1, &ev), st, done);
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
    if (!out.interrupted) out.epochs_done++;
    train_time += m.epoch_seconds;
    all_samples += seen;
    out.compute_seconds += m.compute_seconds;
    out.data_wait_seconds += m.data_wait_seconds;
    out.comm_seconds += m.comm_seconds;
    comm_wait_total += m.comm_seconds;
  }
  if (stop_requested) out.interrupted = 1;
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
  if (r.group) {
    /* The table users make by hand: every rank's time split and accuracy. */
    double mine[RK_N] = {out.wall_seconds, out.cpu_user_seconds, out.cpu_sys_seconds, (double)all_samples,
                         out.compute_seconds, out.data_wait_seconds, out.comm_seconds, out.comm_total_seconds,
                         my_acc1, my_acc5};
    double *all = NULL;
    DT_CHECK_GOTO(dt_alloc_array((size_t)r.world * RK_N, sizeof(double), "rank table", (void **)&all), st, done);
    st = dt_allgather(r.group, mine, all, (size_t)r.world * RK_N, DT_F64, NULL);
    if (st == DT_OK && lead && c->progress) print_rank_table(c->progress, all, r.world);
    dt_free(all);
    if (st != DT_OK) goto done;
  }
  if (c->out_dir && lead) DT_CHECK_GOTO(dt_train_write_summary(c->out_dir, c->model, &out), st, done);
  *res = out;
done:
  run_free(&r);
  return st;
}

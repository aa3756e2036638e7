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
} run;

static void run_free(run *r) {
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

dt_status dt_train_run(const dt_train_config *c, dt_train_result *res) {
  DT_CHECK(dt_train_config_check(c));
  double t_start = dt_time_now(), cpu_u0, cpu_s0;
  dt_cpu_time(&cpu_u0, &cpu_s0);
  run r;
  memset(&r, 0, sizeof r);
  dt_train_result out;
  memset(&out, 0, sizeof out);
  dt_status st = DT_OK;

  DT_CHECK_GOTO(dt_set_threads(c->threads), st, done);
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
  dt_model_set_rng_stream(r.model, 0);
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
  DT_CHECK_GOTO(make_loader(r.train, c->batch_size, 1, c->seed, c->limit_train, &r.train_prefix, &r.train_loader), st,
                done);
  DT_CHECK_GOTO(make_loader(r.test, c->batch_size, 0, 0, c->limit_test, &r.test_prefix, &r.test_loader), st, done);

  /* The schedule in optimizer steps (a last partial batch is a step too). */
  int64_t n_train = dt_dataset_size(r.train);
  if (c->limit_train > 0 && c->limit_train < n_train) n_train = c->limit_train;
  int64_t steps_per_epoch = (n_train + c->batch_size - 1) / c->batch_size;
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

  if (c->out_dir) DT_CHECK_GOTO(open_outputs(c, &r), st, done);
  DT_LOG_INFO("train", "%s: %zu parameters, %lld samples, %lld steps/epoch", c->model, n_params, (long long)n_train,
              (long long)steps_per_epoch);

  dt_progress prog;
  dt_progress_init(&prog, c->progress, c->progress_mode, c->epochs);
  int64_t step = 0, all_samples = 0;
  double train_time = 0;
  int have_row = 0;
  for (int e = 0; e < c->epochs && !out.interrupted; e++) {
    DT_CHECK_GOTO(dt_loader_start_epoch(r.train_loader, e), st, done);
    dt_progress_epoch_start(&prog, e + 1, steps_per_epoch);
    double t0 = dt_time_now(), wait0 = dt_loader_wait_seconds(r.train_loader);
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, epoch_step = 0;
    float lr = c->lr;
    for (;;) {
      if (stop_requested) {
        out.interrupted = 1;
        break;
      }
      dt_batch b;
      DT_CHECK_GOTO(dt_loader_next(r.train_loader, &b), st, done);
      if (b.size == 0) break;
      const float *logits = NULL;
      float loss = 0;
      int64_t top1 = 0, top1_again = 0;
      dt_model_zero_grad(r.model);
      DT_CHECK_GOTO(dt_model_forward(r.model, b.x, b.size, &logits), st, done);
      DT_CHECK_GOTO(dt_loss_cross_entropy(logits, b.y, b.size, classes, c->label_smoothing, &loss, r.dlogits), st,
                    done);
      if (!isfinite(loss)) {
        st = dt_error(DT_INVALID_ARGUMENT, "loss is %f at epoch %d step %lld: lower the learning rate (--lr %g now)",
                      (double)loss, e + 1, (long long)step + 1, (double)c->lr);
        goto done;
      }
      dt_topk_correct(logits, b.y, b.size, classes, 1, &top1, &top1_again);
      DT_CHECK_GOTO(dt_model_backward(r.model, r.dlogits), st, done);
      if (c->clip_grad_norm > 0) {
        float norm = 0;
        DT_CHECK_GOTO(dt_clip_grad_norm(grads, n_grads, c->clip_grad_norm, &norm), st, done);
      }
      lr = dt_lr_at(&sched, step);
      DT_CHECK_GOTO(dt_optim_step(r.optim, params, grads, lr), st, done);
      step++;
      epoch_step++;
      seen += b.size;
      loss_sum += (double)loss * b.size;
      correct += top1;
      dt_progress_step(&prog, epoch_step, loss_sum / (double)seen, seen);
    }
    double t1 = dt_time_now();
    if (seen == 0) break; /* stopped before the epoch's first step: nothing new to report */

    dt_epoch_metrics m;
    memset(&m, 0, sizeof m);
    m.epoch = e + 1;
    m.step = step;
    m.lr = lr;
    m.train_samples = seen;
    m.train_loss = loss_sum / (double)seen;
    m.train_acc1 = (double)correct / (double)seen;
    m.epoch_seconds = t1 - t0;
    m.train_samples_per_s = m.epoch_seconds > 0 ? (double)seen / m.epoch_seconds : 0;
    m.data_wait_seconds = dt_loader_wait_seconds(r.train_loader) - wait0;
    m.comm_seconds = 0; /* single process: no communication yet */
    m.compute_seconds = m.epoch_seconds - m.data_wait_seconds - m.comm_seconds;
    dt_eval_sums ev;
    DT_CHECK_GOTO(dt_train_evaluate(r.model, r.test_loader, classes, &ev), st, done);
    double nt = ev.samples > 0 ? (double)ev.samples : NAN;
    m.test_loss = ev.loss_sum / nt;
    m.test_acc1 = (double)ev.top1 / nt;
    m.test_acc5 = (double)ev.top5 / nt;
    m.eval_seconds = ev.seconds;
    m.infer_samples_per_s = ev.seconds > 0 ? (double)ev.samples / ev.seconds : 0;
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
  }
  if (stop_requested) out.interrupted = 1;
  if (c->out_dir) DT_CHECK_GOTO(save_weights(c, r.model, have_row ? &out.last : NULL, out.epochs_done), st, done);

  out.steps = step;
  out.params = n_params;
  out.train_samples_per_s = train_time > 0 ? (double)all_samples / train_time : 0;
  out.infer_samples_per_s = out.last.infer_samples_per_s;
  out.test_loss = have_row ? out.last.test_loss : NAN;
  out.test_acc1 = have_row ? out.last.test_acc1 : NAN;
  out.test_acc5 = have_row ? out.last.test_acc5 : NAN;
  double cpu_u1, cpu_s1;
  dt_cpu_time(&cpu_u1, &cpu_s1);
  out.cpu_user_seconds = cpu_u1 - cpu_u0;
  out.cpu_sys_seconds = cpu_s1 - cpu_s0;
  out.peak_rss_bytes = dt_peak_rss();
  out.wall_seconds = dt_time_now() - t_start;
  if (c->out_dir) DT_CHECK_GOTO(dt_train_write_summary(c->out_dir, c->model, &out), st, done);
  *res = out;
done:
  run_free(&r);
  return st;
}

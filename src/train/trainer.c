/* The training loop: open the run, epochs of steps through a strategy, evaluation, hooks on every event. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/dtrain.h"
#include "dtrain/trace.h"
#include "train/run.h"

static atomic_int stop_requested; /* lock-free: set from a signal handler or another thread */

void dt_train_request_stop(void) { atomic_store(&stop_requested, 1); }
int dt_train_stop_requested(void) { return atomic_load(&stop_requested) != 0; }
void dt_train_clear_stop(void) { atomic_store(&stop_requested, 0); }

/* In the order they see every event. */
static const dt_run_hook *const hooks[] = {&dt_hook_progress, &dt_hook_metrics, &dt_hook_tensorboard,
                                           &dt_hook_snapshot, &dt_hook_report,  &dt_hook_trace};
#define N_HOOKS (sizeof hooks / sizeof hooks[0])
#define EACH_HOOK(call, ...)                                                     \
  for (size_t h_ = 0; h_ < N_HOOKS; h_++)                                        \
    if (hooks[h_]->call) DT_CHECK(hooks[h_]->call(__VA_ARGS__))

static const dt_strategy_ops *strategy_of(dt_strategy s) {
  static const dt_strategy_ops *const ops[] = {&dt_strategy_single_ops, &dt_strategy_dp_ops, &dt_strategy_ddp_ops};
  return ops[s];
}

static void run_free(dt_run *r) {
  for (size_t h = N_HOOKS; h-- > 0;)
    if (hooks[h]->free) hooks[h]->free(r);
  r->strategy->free(r);
  dt_free(r->history);
  dt_metric_acc_free(r->eval_acc);
  dt_tta_close(&r->tta);
  dt_metric_acc_free(r->epoch_acc);
  dt_free(r->dout);
  dt_free(r->rows);
  dt_free(r->rank_scores);
  dt_free(r->rank_pairs);
  dt_optim_free(r->optim);
  dt_model_free(r->model);
  dt_task_free(r->task);
  dt_loader_free(r->val_loader);
  dt_loader_free(r->train_loader);
  if (r->val != r->val_src) dt_dataset_free(r->val);
  if (r->train != r->train_src) dt_dataset_free(r->train);
  if (r->val_unpicked != r->val_src) dt_dataset_free(r->val_unpicked);
  if (r->train_unpicked != r->train_src) dt_dataset_free(r->train_unpicked);
  dt_dataset_free(r->val_src);
  dt_dataset_free(r->train_src);
}

/* ---- opening the run: data, task, model, optimizer, schedule --------------------------------- */

/* Same type and number of values per sample: (1, 28, 28) images fit a model built for (784). */
static int same_field(const dt_field *a, const dt_field *b) {
  return a->dtype == b->dtype && dt_field_numel(a) == dt_field_numel(b);
}

/* "(20)", "(1, 28, 28)", "()" for one value per sample. */
static const char *field_shape(const dt_field *f, char *buf, size_t len) {
  size_t o = (size_t)snprintf(buf, len, "(");
  for (int d = 0; d < f->ndim && o < len; d++)
    o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "", (long long)f->shape[d]);
  if (o < len) snprintf(buf + o, len - o, ")");
  return buf;
}

/* Index data from two sources (--val-data) must map ids to indices alike: MovieLens remaps each file's own. */
static dt_status same_ids(const dt_dataset *train, const dt_dataset *val, const char *tname, const char *vname) {
  const dt_kv *tk = NULL, *vk = NULL;
  const int nt = dt_dataset_meta(train, &tk), nv = dt_dataset_meta(val, &vk);
  for (int i = 0; i < nt; i++) {
    const char *v = NULL;
    for (int j = 0; j < nv; j++)
      if (strcmp(vk[j].key, tk[i].key) == 0) v = vk[j].value;
    if (!v || strcmp(v, tk[i].value) != 0)
      return dt_error(DT_USAGE, "validation data %s numbers its %s differently from the training data %s (ids are "
                      "indexed per file): hold out part of %s instead (--split, --val-fraction)",
                      vname, tk[i].key, tname, tname);
  }
  return DT_OK;
}

/* The value of the training source's meta key, or NULL. */
static const char *meta_value(const dt_dataset *ds, const char *key) {
  const dt_kv *kv = NULL;
  const int n = dt_dataset_meta(ds, &kv);
  for (int i = 0; i < n; i++)
    if (strcmp(kv[i].key, key) == 0) return kv[i].value;
  return NULL;
}

/* Training and validation data: the source's train split; validation from --val-data, a
 * --val-fraction of the training data, or the source's test split, if any (else none). */
static dt_status open_data(dt_run *r) {
  const dt_train_config *c = r->cfg;
  const dt_data_options opt = {.norm = &c->normalize, .holdout = c->holdout, .seed = c->seed, .augment = c->augment,
                               .skip_bad_images = c->skip_bad_images, .cache_images = c->cache_images,
                               .text = c->text};
  DT_CHECK(dt_dataset_load_opts(c->data, DT_SPLIT_TRAIN, &opt, &r->train_src));
  r->train = r->train_src;
  const dt_data_info *ti = dt_dataset_info(r->train_src);
  /* a source without a test split may name its own default fraction (MovieLens: 10%) */
  const double fraction = c->val_fraction > 0 ? c->val_fraction : !c->val_data && !ti->has_test ? ti->val_fraction : 0;
  if (fraction > 0) {
    DT_CHECK(dt_dataset_split(r->train_src, fraction, c->seed, &r->train, &r->val));
    r->val_fraction = fraction;
  } else if (c->val_data || ti->has_test) {
    const char *spec = c->val_data ? c->val_data : c->data;
    /* --val-data: that source's test split, or its only split when it has none */
    dt_data_options vopt = {.norm = &c->normalize, .holdout = c->val_data ? DT_HOLDOUT_DEFAULT : c->holdout,
                            .seed = c->seed, .augment = c->augment, .skip_bad_images = c->skip_bad_images,
                            .cache_images = c->cache_images, .text = c->text};
    /* text: validation rows name their classes as training numbered them */
    vopt.text.classes = meta_value(r->train_src, "classes");
    dt_status st = dt_dataset_load_opts(spec, DT_SPLIT_TEST, &vopt, &r->val_src);
    if (st == DT_NOT_FOUND && c->val_data) st = dt_dataset_load_opts(spec, DT_SPLIT_TRAIN, &vopt, &r->val_src);
    if (st != DT_OK) return c->val_data ? dt_error_prefix(st, "--val-data %s", spec) : st;
    r->val = r->val_src;
  }
  if (!r->val) return DT_OK;
  if (c->val_data) DT_CHECK(same_ids(r->train_src, r->val_src, c->data, c->val_data));
  const dt_data_info *vi = dt_dataset_info(r->val);
  /* Fewer classes is a subset of the task; fewer regression targets or labels is another task. */
  const int outputs_fit = ti->task == DT_TASK_CLASSIFICATION ? vi->outputs <= ti->outputs : vi->outputs == ti->outputs;
  const char *val_name = c->val_data ? c->val_data : c->data;
  if (vi->task != ti->task || !outputs_fit || vi->n_fields != ti->n_fields)
    return dt_error(DT_USAGE, "validation data %s is a %s task with %d outputs; the training data %s is a %s task with %d",
                    val_name, dt_task_kind_name(vi->task), vi->outputs, c->data, dt_task_kind_name(ti->task),
                    ti->outputs);
  /* The model is built for the training samples: validation samples of another size would be misread. */
  for (int f = 0; f < ti->n_fields; f++)
    if (!same_field(&vi->field[f], &ti->field[f])) {
      char vs[64], ts[64];
      return dt_error(DT_USAGE, "validation data %s has field \"%s\" of shape %s; the training data %s has %s", val_name,
                      vi->field[f].name, field_shape(&vi->field[f], vs, sizeof vs), c->data,
                      field_shape(&ti->field[f], ts, sizeof ts));
    }
  return DT_OK;
}

static dt_status open_task(dt_run *r) {
  const dt_train_config *c = r->cfg;
  const dt_data_info *info = dt_dataset_info(r->train);
  dt_task_config tc = {.kind = info->task, .outputs = info->outputs, .regression_loss = c->regression_loss,
                       .ranking_k = dt_run_rank_k(r)};
  float pw[DT_TRAIN_MAX_POS_WEIGHT];
  if (info->task == DT_TASK_CLASSIFICATION) tc.label_smoothing = c->label_smoothing;
  else if (c->label_smoothing > 0)
    return dt_error(DT_USAGE, "--label-smoothing applies to classification; %s is a %s task", c->data,
                    dt_task_kind_name(info->task));
  if (c->n_pos_weight) {
    if (info->task != DT_TASK_MULTILABEL)
      return dt_error(DT_USAGE, "--pos-weight applies to multilabel tasks; %s is a %s task", c->data,
                      dt_task_kind_name(info->task));
    if (c->n_pos_weight != 1 && c->n_pos_weight != info->outputs)
      return dt_error(DT_USAGE, "--pos-weight has %d values; %s has %d labels (give one, or one per label)",
                      c->n_pos_weight, c->data, info->outputs);
    if (info->outputs > DT_TRAIN_MAX_POS_WEIGHT)
      return dt_error(DT_USAGE, "--pos-weight: at most %d labels", DT_TRAIN_MAX_POS_WEIGHT);
    for (int i = 0; i < info->outputs; i++) pw[i] = c->pos_weight[c->n_pos_weight == 1 ? 0 : i];
    tc.pos_weight = pw;
  }
  if (c->regression_loss != DT_LOSS_MSE && info->task != DT_TASK_REGRESSION)
    return dt_error(DT_USAGE, "--loss l1 applies to regression; %s is a %s task", c->data, dt_task_kind_name(info->task));
  DT_CHECK(dt_task_new(&tc, &r->task));
  r->metrics = dt_task_metrics(r->task);
  DT_CHECK(dt_metric_acc_new(r->task, 0, &r->epoch_acc));
  return dt_metric_acc_new(r->task, 1, &r->eval_acc);
}

static dt_status open_model(dt_run *r) {
  const dt_train_config *c = r->cfg;
  const dt_data_info *info = dt_dataset_info(r->train);
  if (info->input < 0 || (info->field[info->input].dtype != DT_F32 && !info->n_index))
    return dt_error(DT_USAGE, "model %s reads an input field \"x\"; %s has none", c->model, c->data);
  const dt_field *x = &info->field[info->input];
  dt_zoo_config zc = {.ndim = x->ndim, .outputs = info->outputs, .task = info->task, .dropout = c->dropout,
                      .hidden = c->n_hidden ? c->hidden : NULL, .n_hidden = c->n_hidden, .n_index = info->n_index,
                      .index_size = info->index_size, .factors = c->factors, .l2 = c->embedding_l2,
                      .zero_init_residual = c->zero_init_residual, .width = c->width, .layers = c->bert_dims[0],
                      .hidden_size = c->bert_dims[1], .heads = c->bert_dims[2], .intermediate_size = c->bert_dims[3]};
  for (int d = 0; d < x->ndim; d++) zc.input_shape[d] = x->shape[d];
  if (info->n_index && info->task == DT_TASK_REGRESSION) { /* mf's global bias starts at the training mean */
    double mean = 0;
    DT_CHECK(dt_dataset_target_mean(r->train, &mean));
    zc.target_mean = (float)mean;
  }
  DT_CHECK(dt_model_zoo_new(c->model, &zc, &r->model));
  DT_CHECK(dt_model_build(r->model, c->batch_size, c->seed));
  if (dt_model_output_size(r->model) != info->outputs)
    return dt_error(DT_USAGE, "model %s has %d outputs; %s's target has %d", c->model, dt_model_output_size(r->model),
                    c->data, info->outputs);
  dt_model_set_rng_stream(r->model, (uint64_t)r->rank); /* each rank its own dropout masks */
  dt_model_set_training(r->model, 1);
  size_t n_grads = 0;
  r->params = dt_model_params(r->model, &r->n_params);
  r->grads = dt_model_grads(r->model, &n_grads);
  if (r->n_params != n_grads)
    return dt_error(DT_INTERNAL, "parameter arena %zu floats, gradient arena %zu", r->n_params, n_grads);
  DT_CHECK(dt_optim_new(&c->optim, r->n_params, &r->optim));
  r->n_rows = c->sparse_embeddings ? dt_model_num_row_tables(r->model) : 0;
  if (r->n_rows) DT_CHECK(dt_alloc_array((size_t)r->n_rows, sizeof(dt_rows), "row tables", (void **)&r->rows));
  return dt_alloc_array((size_t)c->batch_size * (size_t)info->outputs, sizeof(float), "output gradients",
                        (void **)&r->dout);
}

/* The schedule in optimizer steps (a last partial batch, or accumulation group, is a step too). */
static dt_status open_schedule(dt_run *r) {
  const dt_train_config *c = r->cfg;
  const int64_t my_train = dt_loader_samples_per_epoch(r->train_loader);
  const int64_t batches_per_epoch = (my_train + c->batch_size - 1) / c->batch_size;
  r->steps_per_epoch = (batches_per_epoch + c->accumulate - 1) / c->accumulate;
  dt_lr_schedule *s = &r->sched;
  memset(s, 0, sizeof *s);
  s->kind = c->schedule;
  s->base_lr = c->lr;
  s->warmup_steps = c->warmup_steps > 0 ? c->warmup_steps : (int64_t)c->warmup_epochs * r->steps_per_epoch;
  s->warmup_start = 1.0f / 3.0f; /* torch LinearLR's default start_factor */
  s->step_size = (int64_t)c->step_size_epochs * r->steps_per_epoch;
  if (s->step_size < 1) s->step_size = 1;
  s->gamma = c->gamma;
  /* cosine's period follows the warm-up (SequentialLR); linear's num_training_steps includes it (transformers) */
  s->total_steps = r->steps_per_epoch * c->epochs - (c->schedule == DT_SCHED_LINEAR ? 0 : s->warmup_steps);
  if (s->total_steps < 1) s->total_steps = 1;
  s->min_lr = c->min_lr;
  return dt_lr_schedule_check(s);
}

/* The strategy's evaluation forward as a dt_forward_fn. */
static dt_status run_forward(void *user, const void *x, int n, const float **out) {
  dt_run *r = user;
  return r->strategy->forward(r, x, n, out);
}

static dt_status open_run(dt_run *r, dt_train_result *out) {
  const dt_train_config *c = r->cfg;
  DT_CHECK(dt_set_threads(c->threads));
  dt_keep_freed_memory(); /* oneDNN's per-call buffers: see dtrain/core.h */
  DT_CHECK(r->strategy->join(r));
  r->lead = r->rank == 0;
  if (c->trace) {
    DT_CHECK(dt_trace_enable(r->rank));
    dt_trace_thread_name("main");
  }
  DT_CHECK(dt_train_config_json(c, r->config_json, sizeof r->config_json));
  DT_CHECK(dt_run_outdir_check(r)); /* before resume decides and before any file is written */
  DT_CHECK(open_data(r));
  DT_CHECK(dt_run_pick_limits(r));
  const int64_t skipped = dt_dataset_info(r->train_src)->skipped + (r->val_src ? dt_dataset_info(r->val_src)->skipped : 0);
  if (strcmp(dt_dataset_info(r->train_src)->name, "text") == 0) out->skipped_rows = skipped; /* rows, not files */
  else out->skipped_images = skipped;
  DT_CHECK(dt_run_cold_start(r));
  DT_CHECK(dt_run_rank_open(r));
  DT_CHECK(open_task(r));
  DT_CHECK(open_model(r));
  DT_CHECK(dt_tta_open(&r->tta, c->tta, r->model, run_forward, r));
  if (c->init_from) DT_CHECK(dt_run_init_from(r)); /* before DDP broadcasts rank 0's model */
  if (c->no_decay) DT_CHECK(dt_run_no_decay(r));
  DT_CHECK(r->strategy->make_loaders(r));
  DT_CHECK(open_schedule(r));
  if (c->resume) DT_CHECK(dt_run_resume(r)); /* rank 0 loads before DDP broadcasts its model */
  DT_CHECK(r->strategy->wrap(r)); /* ddp: after its model check, rank 0's optimizer state (dt_run_resume_optim) */
  r->params = dt_model_params(r->model, NULL); /* DDP may have moved the arenas into shared memory */
  r->grads = dt_model_grads(r->model, NULL);
  DT_CHECK(dt_run_amp_open(r));
  r->history_cap = r->n_history; /* the rows a snapshot brought */
  r->at = (dt_snapshot_position){.world_size = r->world, .batch_size = c->batch_size, .accumulate = c->accumulate,
                                 .steps_per_epoch = r->steps_per_epoch, .seed = (int64_t)c->seed};
  if (r->resume.active) {
    r->strategy->rng_set(r, &r->resume.pos);
    out->resumed_epoch = (int)r->resume.pos.epoch;
    out->resumed_step = r->resume.pos.step;
    snprintf(out->resumed_from, sizeof out->resumed_from, "%.511s", r->resume.path);
    out->epochs_done = (int)r->resume.pos.epoch;
  }
  DT_CHECK(dt_run_outdir_clear(r));
  EACH_HOOK(start, r);
  DT_LOG_INFO("train", "%s (%s, %s, rank %d of %d): %zu parameters, %lld samples, %lld steps/epoch", c->model,
              dt_task_kind_name(dt_task_config_of(r->task)->kind), r->strategy->name, r->rank, r->world, r->n_params,
              (long long)dt_dataset_size(r->train), (long long)r->steps_per_epoch);
  return DT_OK;
}

/* ---- the loop ------------------------------------------------------------------------------ */

/* One evaluation pass over this rank's part of the validation data into r->eval_acc (reduced by the caller). */
static dt_status evaluate(dt_run *r, double *seconds) {
  dt_metric_acc_reset(r->eval_acc);
  if (!r->val) return DT_OK;
  double te = dt_trace_now_us();
  if (r->strategy->eval_start) DT_CHECK(r->strategy->eval_start(r));
  DT_CHECK(dt_train_evaluate(r->model, dt_tta_fn, &r->tta, r->val_loader, r->task, r->my_val, r->eval_acc, seconds));
  if (r->ranking.n) { /* not in *seconds: the inference figure is the evaluation's samples over their time */
    dt_model_set_training(r->model, 0);
    dt_status st = dt_run_rank_eval(r);
    dt_model_set_training(r->model, 1);
    DT_CHECK(st);
  }
  if (dt_trace_enabled()) dt_trace_span("eval", "evaluate", te, dt_trace_now_us(), NULL);
  return DT_OK;
}

/* Skips the batches of an epoch a mid-epoch snapshot had trained (its order is a function of seed and epoch). */
static dt_status skip_trained(dt_run *r, int64_t *seen) {
  const dt_snapshot_position *p = &r->resume.pos;
  for (int64_t k = 0; k < p->epoch_step * r->cfg->accumulate; k++) {
    dt_batch b;
    DT_CHECK(dt_loader_next_unfilled(r->train_loader, &b)); /* nothing reads its samples */
    if (b.size == 0) break;
    *seen += b.size;
  }
  /* The epoch's sums so far were all-reduced into the snapshot: rank 0 alone restores them. */
  size_t n;
  double *state = dt_metric_acc_sums(r->epoch_acc, &n);
  if (!r->lead) return DT_OK;
  if ((size_t)p->n_sums != n)
    return dt_error(DT_USAGE, "%s holds %d metric sums of its unfinished epoch; a %s task keeps %zu: it was written by "
                    "a run of another task",
                    r->resume.path, p->n_sums, dt_task_kind_name(dt_task_config_of(r->task)->kind), n);
  memcpy(state, p->epoch_sums, n * sizeof *state);
  return DT_OK;
}

/* The optimizer's update: with --sparse-embeddings, the row tables only at the rows this step touched. */
static dt_status optimizer_step(dt_run *r, float lr) {
  if (!r->n_rows && r->strategy->optim_step) return r->strategy->optim_step(r, lr);
  if (!r->n_rows) return dt_optim_step(r->optim, r->params, r->grads, lr);
  dt_model_ctx *c = dt_model_default_ctx(r->model);
  for (int k = 0; k < r->n_rows; k++) dt_model_ctx_rows(r->model, c, k, &r->rows[k]);
  return dt_optim_step_rows(r->optim, r->params, r->grads, lr, r->rows, r->n_rows);
}

/* The training part of one epoch: steps until the loader is done or a stop is agreed. */
typedef struct epoch_state {
  int e;
  int64_t seen, skipped, epoch_step;
  float lr;
  int interrupted;
} epoch_state;

static dt_status train_epoch(dt_run *r, epoch_state *es, int64_t *step) {
  const dt_train_config *c = r->cfg;
  const int64_t my_train = dt_loader_samples_per_epoch(r->train_loader);
  int micro = 0;
  for (;;) {
    /* A stop ends the epoch at a step boundary, on every rank alike (equal shards: the same step counts), but
     * not after its last step: the epoch ends whole (its evaluation, its hooks) and the stop comes at the next
     * epoch's first step, so a snapshot never holds a position past an epoch's end. */
    if (micro == 0 && es->epoch_step < r->steps_per_epoch) {
      int stop;
      DT_CHECK(r->strategy->agree_stop(r, dt_train_stop_requested(), &stop));
      if (stop) {
        es->interrupted = 1;
        return DT_OK;
      }
    }
    dt_batch b;
    double tw = dt_trace_now_us();
    DT_CHECK((r->strategy->fills_batches ? dt_loader_next_unfilled : dt_loader_next)(r->train_loader, &b));
    if (dt_trace_enabled()) dt_trace_span("train", "wait for data", tw, dt_trace_now_us(), NULL);
    if (b.size == 0) return DT_OK;
    const int last = micro == c->accumulate - 1 || es->seen + b.size >= my_train;
    if (micro == 0) {
      dt_model_zero_grad_deferred(r->model); /* the step's first backward writes the gradients */
      r->step_lr = dt_lr_at(&r->sched, *step); /* ddp's sharded or fused update steps during backward */
    }
    float loss = 0;
    double sums[DT_TASK_MAX_SUMS] = {0};
    DT_CHECK(r->strategy->train_batch(r, &b, last, &loss, sums));
    if (!isfinite(loss))
      return dt_error(DT_INVALID_ARGUMENT, "loss is %f at epoch %d step %lld: lower the learning rate (--lr %g now)",
                      (double)loss, es->e + 1, (long long)*step + 1, (double)c->lr);
    es->seen += b.size;
    dt_metric_acc_add_sums(r->epoch_acc, b.size, (double)loss * b.size, sums);
    EACH_HOOK(batch, r, b.size, (double)loss * b.size, sums);
    if (!last) {
      micro++;
      continue;
    }
    micro = 0;
    double to = dt_trace_now_us();
    DT_CHECK(r->strategy->finish_step(r));
    int skip = 0; /* fp16: an inf/NaN gradient skips the update; the schedule still advances, as PyTorch's */
    DT_CHECK(dt_run_amp_unscale(r, &skip));
    if (c->clip_grad_norm > 0 && !skip) {
      float norm = 0;
      if (r->strategy->clip_grad_norm)
        DT_CHECK(r->strategy->clip_grad_norm(r, c->clip_grad_norm, &norm));
      else
        DT_CHECK(dt_clip_grad_norm(r->grads, r->n_params, c->clip_grad_norm, &norm));
    }
    es->lr = r->step_lr;
    if (!skip) DT_CHECK(optimizer_step(r, es->lr));
    if (dt_trace_enabled()) dt_trace_span("train", "finish step + optimizer", to, dt_trace_now_us(), NULL);
    ++*step;
    es->epoch_step++;
    dt_step_event ev = {.epoch = es->e, .epoch_step = es->epoch_step, .step = *step, .lr = es->lr, .loss = loss,
                        .seen = es->seen};
    EACH_HOOK(step, r, &ev);
  }
}

/* The epoch's row: training sums over ranks, then the evaluation pass. */
static dt_status epoch_row(dt_run *r, const epoch_state *es, double t0, double t1, double wait0, double comm0,
                           dt_epoch_metrics *m) {
  memset(m, 0, sizeof *m);
  m->epoch = es->e + 1;
  m->step = r->at.step;
  m->lr = es->lr;
  m->train_samples = dt_metric_acc_samples(r->epoch_acc);
  m->train_loss = dt_metric_acc_loss(r->epoch_acc);
  dt_metric_acc_values(r->epoch_acc, 1, m->train_metric);
  for (int i = r->metrics->n_train_row; i < DT_MAX_METRICS; i++) m->train_metric[i] = NAN;
  m->epoch_seconds = t1 - t0;
  m->train_samples_per_s = m->epoch_seconds > 0 ? (double)((es->seen - es->skipped) * r->world) / m->epoch_seconds : 0;
  m->data_wait_seconds = dt_loader_wait_seconds(r->train_loader) - wait0;
  dt_comm_times ct;
  r->strategy->comm_seconds(r, &ct);
  m->comm_seconds = ct.waited - comm0; /* what backward did not hide, and waits for slower ranks */
  m->compute_seconds = m->epoch_seconds - m->data_wait_seconds - m->comm_seconds;
  double seconds = 0;
  DT_CHECK(evaluate(r, &seconds));
  m->test_loss = dt_metric_acc_loss(r->eval_acc);
  dt_metric_acc_values(r->eval_acc, 0, m->test_metric);
  for (int i = r->metrics->n_eval; i < DT_MAX_METRICS; i++) m->test_metric[i] = NAN;
  m->eval_seconds = seconds;
  return DT_OK;
}

/* Epochs from the resume point (or 0) until done or stopped; the last row and totals into *out. */
static dt_status run_epochs(dt_run *r, dt_train_result *out, double *train_time, int64_t *all_samples,
                            double *local_metric) {
  const dt_train_config *c = r->cfg;
  const int first = r->resume.active ? (int)r->resume.pos.epoch : 0;
  r->at.step = r->resume.active ? r->resume.pos.step : 0;
  for (int e = first; e < c->epochs && !out->interrupted; e++) {
    DT_CHECK(dt_loader_start_epoch(r->train_loader, e));
    EACH_HOOK(epoch_start, r, e);
    dt_metric_acc_reset(r->epoch_acc);
    epoch_state es = {.e = e, .lr = c->lr};
    dt_comm_times ct0;
    r->strategy->comm_seconds(r, &ct0);
    const double t0 = dt_time_now(), wait0 = dt_loader_wait_seconds(r->train_loader);
    if (r->resume.active && e == first && r->resume.pos.epoch_step > 0) {
      DT_CHECK(skip_trained(r, &es.seen));
      es.skipped = es.seen;
      es.epoch_step = r->resume.pos.epoch_step;
    }
    r->at.epoch = e;
    DT_CHECK(train_epoch(r, &es, &r->at.step));
    const double t1 = dt_time_now();
    r->at.epoch_step = es.epoch_step;
    out->interrupted = es.interrupted;
    if (es.interrupted) r->stopped_in_epoch = 1;
    /* Every rank agrees whether anything was trained (ranks see equal shards). */
    size_t n_state;
    double *state = dt_metric_acc_sums(r->epoch_acc, &n_state);
    DT_CHECK(dt_run_all_sum(r, state, n_state));
    if (state[0] == 0) break; /* stopped before the epoch's first step: nothing new to report */
    dt_epoch_metrics m;
    DT_CHECK(epoch_row(r, &es, t0, t1, wait0, ct0.waited, &m));
    local_metric[0] = m.test_metric[0], local_metric[1] = m.test_metric[1];
    DT_CHECK(r->strategy->reduce_metrics(r, r->eval_acc));
    m.test_loss = dt_metric_acc_loss(r->eval_acc);
    dt_metric_acc_values(r->eval_acc, 0, m.test_metric);
    m.infer_samples_per_s = m.eval_seconds > 0 ? (double)dt_metric_acc_samples(r->eval_acc) / m.eval_seconds : 0;
    out->last = m;
    *train_time += m.epoch_seconds;
    *all_samples += es.seen - es.skipped;
    out->compute_seconds += m.compute_seconds;
    out->data_wait_seconds += m.data_wait_seconds;
    out->comm_seconds += m.comm_seconds;
    const int complete = !out->interrupted; /* a partial epoch is reported, not part of the history */
    if (complete) {
      out->epochs_done++;
      DT_CHECK(dt_run_history_add(r, &m));
    }
    EACH_HOOK(epoch_end, r, &m, complete);
  }
  if (dt_train_stop_requested()) out->interrupted = 1;
  return DT_OK;
}

/* The critical figures (dt_comm_times), this rank's own where no step was carried (one step, no fp16), and the
 * share of the all-reduce time not waited for, step by step the least over the ranks: a faster rank's wait
 * for a slower one is load imbalance, not communication. */
static void comm_result(const dt_comm_times *ct, dt_train_result *out) {
  out->comm_total_seconds = ct->total;
  const int carried = ct->critical_total > 0;
  out->comm_critical_seconds = carried ? ct->critical_waited : out->comm_seconds;
  out->comm_critical_total_seconds = carried ? ct->critical_total : ct->total;
  const double total = out->comm_critical_total_seconds;
  const double hidden = total > 0 ? 1.0 - out->comm_critical_seconds / total : 0;
  out->comm_hidden = hidden < 0 ? 0 : hidden;
}

/* The result's totals, and every rank's figures for the per-rank table. */
static dt_status finish_result(dt_run *r, dt_train_result *out, double train_time, int64_t all_samples,
                               const double *local_metric, double cpu_u0, double cpu_s0, double **ranks) {
  out->steps = r->at.step;
  out->amp = r->cfg->amp;
  out->loss_scale = r->cfg->amp == DT_AMP_FP16 ? r->scaler.scale : 1.0f;
  out->amp_skipped_steps = r->scaler.skipped;
  out->params = r->n_params;
  out->rank = r->rank;
  out->world_size = r->world;
  out->metrics = *r->metrics;
  out->task = dt_task_config_of(r->task)->kind;
  if (r->group) snprintf(out->backend, sizeof out->backend, "%s", dt_group_backend(r->group));
  /* Throughput of the whole job: every rank's samples over the training time. */
  out->train_samples_per_s = train_time > 0 ? (double)all_samples * r->world / train_time : 0;
  out->infer_samples_per_s = out->last.infer_samples_per_s;
  const int have_row = out->last.epoch > 0;
  out->test_loss = have_row ? out->last.test_loss : NAN;
  for (int i = 0; i < DT_MAX_METRICS; i++) out->test_metric[i] = have_row ? out->last.test_metric[i] : NAN;
  dt_comm_times ct;
  r->strategy->comm_seconds(r, &ct);
  comm_result(&ct, out);
  dt_ddp_get_stats(r->ddp, &out->ddp); /* zeros without ddp */
  double cpu_u1, cpu_s1;
  dt_cpu_time(&cpu_u1, &cpu_s1);
  out->cpu_user_seconds = cpu_u1 - cpu_u0;
  out->cpu_sys_seconds = cpu_s1 - cpu_s0;
  out->peak_rss_bytes = dt_peak_rss();
  out->wall_seconds = dt_time_now() - r->t_start;
  const double mine[RK_N] = {out->wall_seconds,   out->cpu_user_seconds,  out->cpu_sys_seconds, (double)all_samples,
                             out->compute_seconds, out->data_wait_seconds, out->comm_seconds,    out->comm_total_seconds,
                             local_metric[0],      local_metric[1]};
  DT_CHECK(dt_alloc_array((size_t)r->world * RK_N, sizeof(double), "rank table", (void **)ranks));
  return r->strategy->gather(r, mine, *ranks, RK_N);
}

dt_status dt_train_run(const dt_train_config *c, dt_train_result *res) {
  DT_CHECK(dt_train_config_check(c));
  double cpu_u0, cpu_s0;
  dt_cpu_time(&cpu_u0, &cpu_s0);
  dt_run r;
  memset(&r, 0, sizeof r);
  r.cfg = c;
  r.strategy = strategy_of(c->strategy);
  r.world = 1;
  r.t_start = dt_time_now();
  dt_train_result out;
  memset(&out, 0, sizeof out);
  out.resumed_epoch = -1;
  double train_time = 0, local_metric[2] = {NAN, NAN}, *ranks = NULL;
  int64_t all_samples = 0;
  dt_sgemm_warm_begin(); /* beside reading the data: the first forward then runs on built kernels */
  dt_status st = open_run(&r, &out);
  dt_sgemm_warm_end();
  if (st == DT_OK) st = run_epochs(&r, &out, &train_time, &all_samples, local_metric);
  if (st == DT_OK) st = finish_result(&r, &out, train_time, all_samples, local_metric, cpu_u0, cpu_s0, &ranks);
  for (size_t h = 0; st == DT_OK && h < N_HOOKS; h++)
    if (hooks[h]->end) st = hooks[h]->end(&r, &out, ranks);
  dt_free(ranks);
  if (st == DT_OK) *res = out;
  run_free(&r); /* loader threads stop here: then the recorded events can go */
  if (c->trace) dt_trace_reset();
  return st;
}

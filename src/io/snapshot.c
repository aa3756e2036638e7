/* Training snapshots: model, optimizer state, trainer position and metrics history in one safetensors file. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/impl.h"
#include "dtrain/snapshot.h"
#include "io/io-impl.h"

#define SNAP_NAME_MAX 256
#define SNAP_POS_LEN 8

/* The parameter tensors of a model, the ones optimizer state is kept for. */
static int is_param(const dt_model *m, int i, dt_tensor_info *info) {
  return dt_model_tensor_info(m, i, info) == DT_OK && info->trainable && info->dtype == DT_F32;
}

/* "optimizer.state.<param>.<state>" into buf; 0 if it does not fit. */
static int state_name(char *buf, size_t len, const char *param, const char *state) {
  return (size_t)snprintf(buf, len, "optimizer.state.%s.%s", param, state) < len;
}

/* A metrics row as DT_SNAPSHOT_HISTORY_COLS doubles, and back. */
enum { H_EPOCH, H_STEP, H_LR, H_TRAIN_LOSS, H_TRAIN_M, H_TEST_LOSS = H_TRAIN_M + DT_MAX_METRICS, H_TEST_M,
       H_TIMES = H_TEST_M + DT_MAX_METRICS, H_COLS = H_TIMES + 8 };
_Static_assert(H_COLS == DT_SNAPSHOT_HISTORY_COLS, "history columns");

static void row_pack(const dt_epoch_metrics *m, double *r) {
  r[H_EPOCH] = m->epoch, r[H_STEP] = (double)m->step, r[H_LR] = m->lr;
  r[H_TRAIN_LOSS] = m->train_loss, r[H_TEST_LOSS] = m->test_loss;
  memcpy(r + H_TRAIN_M, m->train_metric, sizeof m->train_metric);
  memcpy(r + H_TEST_M, m->test_metric, sizeof m->test_metric);
  const double t[8] = {m->epoch_seconds,   m->train_samples_per_s, (double)m->train_samples, m->compute_seconds,
                       m->data_wait_seconds, m->comm_seconds,       m->eval_seconds,          m->infer_samples_per_s};
  memcpy(r + H_TIMES, t, sizeof t);
}

static void row_times(const double *t, dt_epoch_metrics *m) {
  m->epoch_seconds = t[0];
  m->train_samples_per_s = t[1];
  m->train_samples = (int64_t)t[2];
  m->compute_seconds = t[3];
  m->data_wait_seconds = t[4];
  m->comm_seconds = t[5];
  m->eval_seconds = t[6];
  m->infer_samples_per_s = t[7];
}

/* cols: DT_SNAPSHOT_HISTORY_COLS, or 16 (epoch, step, lr, train loss, train acc1, test loss, acc1, acc5, times). */
static void row_unpack(const double *r, int cols, dt_epoch_metrics *m) {
  memset(m, 0, sizeof *m);
  m->epoch = (int)r[H_EPOCH];
  m->step = (int64_t)r[H_STEP];
  m->lr = (float)r[H_LR];
  m->train_loss = r[H_TRAIN_LOSS];
  if (cols == 16) {
    m->train_metric[0] = r[4], m->test_loss = r[5], m->test_metric[0] = r[6], m->test_metric[1] = r[7];
    row_times(r + 8, m);
    return;
  }
  m->test_loss = r[H_TEST_LOSS];
  memcpy(m->train_metric, r + H_TRAIN_M, sizeof m->train_metric);
  memcpy(m->test_metric, r + H_TEST_M, sizeof m->test_metric);
  row_times(r + H_TIMES, m);
}

dt_status dt_snapshot_save(const char *path, dt_model *m, dt_optim *o, const dt_snapshot_position *pos,
                           const dt_epoch_metrics *history, int n_history, const dt_kv *meta, int n_meta) {
  if (!path || !m || !o || !pos || pos->n_rng < 1 || pos->n_rng > DT_SNAPSHOT_MAX_RNG || n_history < 0 ||
      pos->n_sums < 0 || pos->n_sums > DT_SNAPSHOT_MAX_SUMS)
    return dt_error(DT_INVALID_ARGUMENT, "snapshot save: bad arguments");
  const int n_model = dt_model_num_tensors(m), n_states = dt_optim_num_states(o);
  int n_params = 0;
  for (int i = 0; i < n_model; i++) {
    dt_tensor_info info;
    n_params += is_param(m, i, &info);
  }
  const int cap = n_model + n_params * n_states + 6;
  dt_named_tensor *list = NULL;
  char *names = NULL; /* (n_params * n_states, SNAP_NAME_MAX) optimizer state names */
  double *hist = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_alloc_array((size_t)cap, sizeof *list, "snapshot", (void **)&list));
  if (n_params * n_states > 0)
    DT_CHECK_GOTO(dt_alloc_array((size_t)(n_params * n_states), SNAP_NAME_MAX, "snapshot", (void **)&names), st, out);
  if (n_history > 0)
    DT_CHECK_GOTO(dt_alloc_array((size_t)n_history * DT_SNAPSHOT_HISTORY_COLS, sizeof(double), "snapshot",
                                 (void **)&hist),
                  st, out);

  int n = 0, k = 0;
  float *arena = dt_model_params(m, NULL);
  for (int i = 0; i < n_model; i++) {
    dt_tensor_info info;
    DT_CHECK_GOTO(dt_model_tensor_info(m, i, &info), st, out);
    list[n].name = info.name;
    DT_CHECK_GOTO(dt_tensor_view(&list[n].tensor, dt_model_tensor_data(m, i), info.dtype, info.ndim, info.shape), st,
                  out);
    n++;
  }
  for (int i = 0; i < n_model; i++) {
    dt_tensor_info info;
    if (!is_param(m, i, &info)) continue;
    const size_t off = (size_t)((float *)dt_model_tensor_data(m, i) - arena);
    for (int s = 0; s < n_states; s++, k++) {
      const char *sname;
      float *state = dt_optim_state(o, s, &sname);
      char *name = names + (size_t)k * SNAP_NAME_MAX;
      if (!state_name(name, SNAP_NAME_MAX, info.name, sname)) {
        st = dt_error(DT_INVALID_ARGUMENT, "snapshot: tensor name %s too long", info.name);
        goto out;
      }
      list[n].name = name;
      DT_CHECK_GOTO(dt_tensor_view(&list[n].tensor, state + off, DT_F32, info.ndim, info.shape), st, out);
      n++;
    }
  }
  int64_t optim_step = dt_optim_step_count(o);
  int64_t position[SNAP_POS_LEN] = {pos->epoch,      pos->epoch_step, pos->step,           pos->world_size,
                                    pos->batch_size, pos->accumulate, pos->steps_per_epoch, pos->seed};
  int64_t rng[DT_SNAPSHOT_MAX_RNG];
  for (int i = 0; i < pos->n_rng; i++) rng[i] = (int64_t)pos->rng_step[i];
  const int64_t one = 1, len_pos = SNAP_POS_LEN, len_rng = pos->n_rng, n_sums = pos->n_sums;
  const int64_t hist_shape[2] = {n_history, DT_SNAPSHOT_HISTORY_COLS};
  list[n].name = "optimizer.step";
  DT_CHECK_GOTO(dt_tensor_view(&list[n++].tensor, &optim_step, DT_I64, 1, &one), st, out);
  list[n].name = "trainer.position";
  DT_CHECK_GOTO(dt_tensor_view(&list[n++].tensor, position, DT_I64, 1, &len_pos), st, out);
  list[n].name = "trainer.rng_step";
  DT_CHECK_GOTO(dt_tensor_view(&list[n++].tensor, rng, DT_I64, 1, &len_rng), st, out);
  list[n].name = "trainer.epoch_sums";
  double sums[DT_SNAPSHOT_MAX_SUMS];
  memcpy(sums, pos->epoch_sums, sizeof sums);
  DT_CHECK_GOTO(dt_tensor_view(&list[n++].tensor, sums, DT_F64, 1, &n_sums), st, out);
  const int64_t len_scaler = 3;
  double scaler[3] = {pos->loss_scale, (double)pos->growth_tracker, (double)pos->skipped_steps}; /* exact in f64 */
  if (pos->has_scaler) {
    list[n].name = "trainer.loss_scaler";
    DT_CHECK_GOTO(dt_tensor_view(&list[n++].tensor, scaler, DT_F64, 1, &len_scaler), st, out);
  }
  if (n_history > 0) {
    for (int r = 0; r < n_history; r++) row_pack(&history[r], hist + (size_t)r * DT_SNAPSHOT_HISTORY_COLS);
    list[n].name = "trainer.history";
    DT_CHECK_GOTO(dt_tensor_view(&list[n++].tensor, hist, DT_F64, 2, hist_shape), st, out);
  }
  st = dt_safetensors_save(path, list, n, meta, n_meta);
out:
  dt_free(hist);
  dt_free(names);
  dt_free(list);
  return st;
}

/* Tensor `name` of dtype and (1-D) length, or the error that says what is wrong. */
static dt_status find_vector(const dt_safetensors *f, const char *path, const char *name, dt_dtype dtype, int64_t len,
                             dt_named_tensor *t) {
  if (dt_safetensors_find(f, name, t) != DT_OK)
    return dt_error(DT_CORRUPT, "%s: snapshot tensor %s is missing", path, name);
  if (t->tensor.dtype != dtype || t->tensor.ndim != 1 || (len >= 0 && t->tensor.shape[0] != len))
    return dt_error(DT_CORRUPT, "%s: snapshot tensor %s has the wrong dtype or shape", path, name);
  return DT_OK;
}

dt_status dt_snapshot_load(const char *path, const char *model_name, dt_model *m, dt_optim *o,
                           dt_snapshot_position *pos, dt_epoch_metrics **history, int *n_history, char *config,
                           size_t config_len) {
  if (!path || !m || !o || !pos || !history || !n_history || (config && config_len == 0))
    return dt_error(DT_INVALID_ARGUMENT, "snapshot load: NULL argument");
  dt_safetensors *f = NULL;
  DT_CHECK(dt_safetensors_load(path, &f));
  dt_status st = DT_OK;
  int *src = NULL;
  int *state_src = NULL; /* (n_model, n_states) file index of each optimizer state, -1 for non-parameters */
  dt_epoch_metrics *rows = NULL;
  const int n_model = dt_model_num_tensors(m), n_states = dt_optim_num_states(o);

  const char *snap = dt_safetensors_meta(f, "dtrain.snapshot");
  if (!snap || strcmp(snap, "1") != 0) {
    st = dt_error(DT_INVALID_ARGUMENT,
                  "%s is not a dtrain snapshot (weights only?): resume from DIR/snapshots/step-*.safetensors", path);
    goto out;
  }
  const char *stored = dt_safetensors_meta(f, "config");
  if (!stored) stored = "";
  if (config && strlen(stored) >= config_len) {
    st = dt_error(DT_CORRUPT, "%s: its stored configuration is longer than %zu bytes", path, config_len - 1);
    goto out;
  }
  const char *their_model = dt_safetensors_meta(f, "model");
  if (model_name && (!their_model || strcmp(their_model, model_name) != 0)) {
    st = dt_error(DT_SHAPE_MISMATCH, "%s is a snapshot of model %s, this run trains %s", path,
                  their_model ? their_model : "(unnamed)", model_name);
    goto out;
  }
  if (n_model > 0) DT_CHECK_GOTO(dt_alloc_array((size_t)n_model, sizeof *src, "snapshot", (void **)&src), st, out);
  DT_CHECK_GOTO(dt_model_match_file(m, f, path, src), st, out);

  /* Optimizer state: exactly the states this run's optimizer keeps, for every parameter. */
  if (n_model > 0 && n_states > 0)
    DT_CHECK_GOTO(dt_alloc_array((size_t)n_model * (size_t)n_states, sizeof *state_src, "snapshot",
                                 (void **)&state_src),
                  st, out);
  int n_state_tensors = 0;
  for (int j = 0; j < dt_safetensors_count(f); j++) {
    dt_named_tensor t;
    DT_CHECK_GOTO(dt_safetensors_get(f, j, &t), st, out);
    n_state_tensors += strncmp(t.name, "optimizer.state.", 16) == 0;
  }
  int n_expected = 0;
  for (int i = 0; i < n_model; i++) {
    dt_tensor_info info;
    if (!is_param(m, i, &info)) continue;
    for (int s = 0; s < n_states; s++) {
      const char *sname;
      dt_optim_state(o, s, &sname);
      char name[SNAP_NAME_MAX];
      dt_named_tensor t;
      if (!state_name(name, sizeof name, info.name, sname) || dt_safetensors_find(f, name, &t) != DT_OK) {
        st = dt_error(DT_SHAPE_MISMATCH,
                      "%s: optimizer state %s.%s is missing: the snapshot was written with another optimizer "
                      "(resume with the same --optimizer and --momentum)",
                      path, info.name, sname);
        goto out;
      }
      int64_t numel = 1;
      for (int d = 0; d < info.ndim; d++) numel *= info.shape[d];
      if (t.tensor.dtype != DT_F32 || dt_tensor_numel(&t.tensor) != numel) {
        st = dt_error(DT_SHAPE_MISMATCH, "%s: optimizer state %s does not match parameter %s", path, name, info.name);
        goto out;
      }
      for (int j = 0; j < dt_safetensors_count(f); j++) {
        dt_named_tensor u;
        if (dt_safetensors_get(f, j, &u) == DT_OK && strcmp(u.name, name) == 0) state_src[i * n_states + s] = j;
      }
      n_expected++;
    }
  }
  if (n_state_tensors != n_expected) {
    st = dt_error(DT_SHAPE_MISMATCH,
                  "%s: the snapshot holds %d optimizer state tensors, this run's optimizer keeps %d: it was written "
                  "with another optimizer (resume with the same --optimizer and --momentum)",
                  path, n_state_tensors, n_expected);
    goto out;
  }

  dt_named_tensor t_step, t_pos, t_rng, t_sums, t_hist;
  DT_CHECK_GOTO(find_vector(f, path, "optimizer.step", DT_I64, 1, &t_step), st, out);
  DT_CHECK_GOTO(find_vector(f, path, "trainer.position", DT_I64, SNAP_POS_LEN, &t_pos), st, out);
  DT_CHECK_GOTO(find_vector(f, path, "trainer.rng_step", DT_I64, -1, &t_rng), st, out);
  DT_CHECK_GOTO(find_vector(f, path, "trainer.epoch_sums", DT_F64, -1, &t_sums), st, out);
  dt_snapshot_position p;
  memset(&p, 0, sizeof p);
  const int64_t *pv = t_pos.tensor.data;
  p.epoch = pv[0];
  p.epoch_step = pv[1];
  p.step = pv[2];
  p.world_size = pv[3];
  p.batch_size = pv[4];
  p.accumulate = pv[5];
  p.steps_per_epoch = pv[6];
  p.seed = pv[7];
  if (p.epoch < 0 || p.epoch_step < 0 || p.step < 0 || p.world_size < 1 || p.batch_size < 1 || p.accumulate < 1 ||
      p.steps_per_epoch < 0 || (p.steps_per_epoch > 0 && p.epoch_step >= p.steps_per_epoch)) {
    st = dt_error(DT_CORRUPT, "%s: trainer position out of range (epoch %" PRId64 ", step %" PRId64 ")", path, p.epoch,
                  p.step);
    goto out;
  }
  int64_t n_rng = t_rng.tensor.shape[0];
  if (n_rng < 1 || n_rng > DT_SNAPSHOT_MAX_RNG) {
    st = dt_error(DT_CORRUPT, "%s: trainer.rng_step has %" PRId64 " entries", path, n_rng);
    goto out;
  }
  p.n_rng = (int)n_rng;
  for (int i = 0; i < p.n_rng; i++) p.rng_step[i] = (uint64_t)((const int64_t *)t_rng.tensor.data)[i];
  const int64_t n_sums = t_sums.tensor.shape[0];
  const double *sv = t_sums.tensor.data;
  if (n_sums < 2 || n_sums > DT_SNAPSHOT_MAX_SUMS) {
    st = dt_error(DT_CORRUPT, "%s: trainer.epoch_sums has %" PRId64 " entries", path, n_sums);
    goto out;
  }
  p.n_sums = (int)n_sums;
  memcpy(p.epoch_sums, sv, (size_t)n_sums * sizeof *sv);
  if (n_sums == 3) { /* loss sum, correct, samples -> samples, loss sum, correct, top-5 (not kept) */
    const double v[4] = {sv[2], sv[0], sv[1], 0};
    memcpy(p.epoch_sums, v, sizeof v);
    p.n_sums = 4;
  }

  dt_named_tensor t_scaler;
  if (dt_safetensors_find(f, "trainer.loss_scaler", &t_scaler) == DT_OK) {
    DT_CHECK_GOTO(find_vector(f, path, "trainer.loss_scaler", DT_F64, 3, &t_scaler), st, out);
    const double *s = t_scaler.tensor.data;
    p.has_scaler = 1;
    p.loss_scale = (float)s[0];
    p.growth_tracker = (int64_t)s[1];
    p.skipped_steps = (int64_t)s[2];
    if (!(s[0] > 0 && s[0] <= 3.5e38) || s[1] < 0 || s[1] > INT32_MAX || s[2] < 0 || s[2] > (double)p.step) {
      st = dt_error(DT_CORRUPT, "%s: trainer.loss_scaler (scale %g, growth tracker %g, skipped %g) is out of range",
                    path, s[0], s[1], s[2]);
      goto out;
    }
  }

  int n_rows = 0;
  if (dt_safetensors_find(f, "trainer.history", &t_hist) == DT_OK) {
    if (t_hist.tensor.dtype != DT_F64 || t_hist.tensor.ndim != 2 ||
        (t_hist.tensor.shape[1] != DT_SNAPSHOT_HISTORY_COLS && t_hist.tensor.shape[1] != 16) ||
        t_hist.tensor.shape[0] > p.epoch) {
      st = dt_error(DT_CORRUPT, "%s: trainer.history has the wrong dtype or shape", path);
      goto out;
    }
    n_rows = (int)t_hist.tensor.shape[0];
    if (n_rows > 0) {
      DT_CHECK_GOTO(dt_alloc_array((size_t)n_rows, sizeof *rows, "snapshot history", (void **)&rows), st, out);
      for (int r = 0; r < n_rows; r++)
        row_unpack((const double *)t_hist.tensor.data + (size_t)r * t_hist.tensor.shape[1],
                   (int)t_hist.tensor.shape[1], &rows[r]);
    }
  }

  /* Everything checked: now change the model and the optimizer. */
  dt_model_copy_from_file(m, f, src);
  float *arena = dt_model_params(m, NULL);
  for (int i = 0; i < n_model && n_states > 0; i++) {
    dt_tensor_info info;
    if (!is_param(m, i, &info)) continue;
    const size_t off = (size_t)((float *)dt_model_tensor_data(m, i) - arena);
    for (int s = 0; s < n_states; s++) {
      dt_named_tensor t;
      DT_CHECK_GOTO(dt_safetensors_get(f, state_src[i * n_states + s], &t), st, out);
      memcpy(dt_optim_state(o, s, NULL) + off, t.tensor.data, dt_tensor_bytes(&t.tensor));
    }
  }
  dt_optim_set_step_count(o, *(const int64_t *)t_step.tensor.data);
  if (config) memcpy(config, stored, strlen(stored) + 1);
  *pos = p;
  *history = rows;
  *n_history = n_rows;
  rows = NULL;
out:
  dt_free(rows);
  dt_free(state_src);
  dt_free(src);
  dt_safetensors_free(f);
  return st;
}

/* ---- the snapshots of a run directory ------------------------------------------ */

/* The step of a name "step-<digits>.safetensors", or -1. */
static int64_t step_of(const char *name) {
  static const char prefix[] = "step-", suffix[] = ".safetensors";
  size_t n = strlen(name), p = sizeof prefix - 1, s = sizeof suffix - 1;
  if (n <= p + s || strncmp(name, prefix, p) != 0 || strcmp(name + n - s, suffix) != 0) return -1;
  int64_t v = 0;
  for (size_t i = p; i < n - s; i++) {
    if (name[i] < '0' || name[i] > '9' || v > INT64_MAX / 10 - 9) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

/* Steps of every snapshot in out_dir/snapshots, ascending, into a dt_alloc'ed array. */
static dt_status list_steps(const char *out_dir, int64_t **steps, int *count) {
  char dir[4096];
  if ((size_t)snprintf(dir, sizeof dir, "%s/snapshots", out_dir) >= sizeof dir)
    return dt_error(DT_INVALID_ARGUMENT, "output directory name too long");
  *steps = NULL;
  *count = 0;
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return DT_OK;
    return dt_error(DT_IO, "cannot read directory %s: %s", dir, strerror(errno));
  }
  int64_t *v = NULL;
  int n = 0, cap = 0;
  dt_status st = DT_OK;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    int64_t s = step_of(e->d_name);
    if (s < 0) continue;
    if (n == cap) {
      int64_t *grown = NULL;
      cap = cap ? cap * 2 : 16;
      DT_CHECK_GOTO(dt_alloc_array((size_t)cap, sizeof *grown, "snapshot list", (void **)&grown), st, fail);
      if (n) memcpy(grown, v, (size_t)n * sizeof *v);
      dt_free(v);
      v = grown;
    }
    v[n++] = s;
  }
  closedir(d);
  for (int i = 1; i < n; i++) /* insertion sort: a run keeps few snapshots */
    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
      int64_t t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  *steps = v;
  *count = n;
  return DT_OK;
fail:
  closedir(d);
  dt_free(v);
  return st;
}

static void snapshot_path(const char *out_dir, int64_t step, char *buf, size_t len) {
  snprintf(buf, len, "%s/snapshots/step-%09" PRId64 ".safetensors", out_dir, step);
}

dt_status dt_snapshot_find(const char *out_dir, int64_t before, char *buf, size_t len, int64_t *step) {
  if (!out_dir || !buf || len == 0) return dt_error(DT_INVALID_ARGUMENT, "snapshot find: NULL argument");
  int64_t *steps = NULL;
  int n = 0;
  DT_CHECK(list_steps(out_dir, &steps, &n));
  int i = n - 1;
  while (i >= 0 && steps[i] >= before) i--;
  dt_status st = DT_OK;
  if (i < 0) {
    st = dt_error(DT_NOT_FOUND, "no snapshot in %s/snapshots", out_dir);
  } else {
    snapshot_path(out_dir, steps[i], buf, len);
    if (step) *step = steps[i];
  }
  dt_free(steps);
  return st;
}

dt_status dt_snapshot_prune(const char *out_dir, int keep) {
  if (keep < 1) return DT_OK;
  int64_t *steps = NULL;
  int n = 0;
  DT_CHECK(list_steps(out_dir, &steps, &n));
  dt_status st = DT_OK;
  for (int i = 0; i < n - keep; i++) {
    char path[4096];
    snapshot_path(out_dir, steps[i], path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT) {
      st = dt_error(DT_IO, "cannot delete old snapshot %s: %s", path, strerror(errno));
      break;
    }
  }
  dt_free(steps);
  return st;
}

dt_status dt_snapshot_export(const char *src, const char *dst) {
  if (!src || !dst) return dt_error(DT_INVALID_ARGUMENT, "export: NULL path");
  dt_safetensors *f = NULL;
  DT_CHECK(dt_safetensors_load(src, &f));
  dt_status st = DT_OK;
  int n = dt_safetensors_count(f), nm = dt_safetensors_meta_count(f), k = 0, km = 0;
  dt_named_tensor *list = NULL;
  dt_kv *meta = NULL;
  if (n > 0) DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof *list, "export", (void **)&list), st, out);
  if (nm > 0) DT_CHECK_GOTO(dt_alloc_array((size_t)nm, sizeof *meta, "export", (void **)&meta), st, out);
  for (int i = 0; i < n; i++) {
    DT_CHECK_GOTO(dt_safetensors_get(f, i, &list[k]), st, out);
    if (strncmp(list[k].name, "optimizer.", 10) != 0 && strncmp(list[k].name, "trainer.", 8) != 0) k++;
  }
  /* Weights keep what describes them; the snapshot's own keys and the old checksum go. */
  for (int i = 0; i < nm; i++) {
    dt_kv kv = dt_safetensors_meta_at(f, i);
    if (strncmp(kv.key, "dtrain.", 7) == 0 || strcmp(kv.key, "config") == 0 || strcmp(kv.key, "step") == 0 ||
        strcmp(kv.key, "world_size") == 0)
      continue;
    meta[km++] = kv;
  }
  if (k == 0) {
    st = dt_error(DT_INVALID_ARGUMENT, "%s holds no model tensors to export", src);
    goto out;
  }
  st = dt_safetensors_save(dst, list, k, meta, km);
  if (st != DT_OK) st = dt_error_prefix(st, "exporting to %s", dst);
out:
  dt_free(meta);
  dt_free(list);
  dt_safetensors_free(f);
  return st;
}

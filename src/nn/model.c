/* dt_model: the layer list, flat arenas (params, grads, buffers), named tensors, execution contexts, summary. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/trace.h"
#include "nn/fusion.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

#define MAX_RESIDUAL_DEPTH 16

typedef struct tensor_ref {
  int layer, k; /* layers[layer].t[k] */
} tensor_ref;

/* A row table (embedding) of the parameter arena. */
typedef struct row_table {
  int tensor;   /* index in state_dict order */
  size_t off;   /* arena offset */
  int64_t rows, width;
} row_table;

struct dt_model {
  int sample_ndim;
  int64_t sample_shape[DT_SAMPLE_MAX_DIMS];
  size_t sample_numel;
  dt_dtype in_dtype; /* f32 samples, or i32 indices */

  dt_layer *layers;
  int n_layers, cap_layers;
  tensor_ref *tensors; /* state_dict order */
  int n_tensors, cap_tensors;
  int open[MAX_RESIDUAL_DEPTH]; /* indices of residual begins not yet ended */
  int open_shortcut[MAX_RESIDUAL_DEPTH]; /* their shortcut layers, -1 if none */
  int n_open;

  int built, max_batch, training;
  int seq_rows, seq_mask_row; /* packed sequences: rows of the i32 input per sample and its mask row; 0: off */
  uint64_t seed;
  float *params;    /* (n_params): the last layer's block first */
  void (*params_release)(void *mem, size_t bytes); /* who frees params: NULL for dt_free */
  size_t n_params;
  float *buffers;   /* (n_buffers): BN running statistics, layer order */
  size_t n_buffers;
  int64_t *counters; /* (n_counters): num_batches_tracked */
  size_t n_counters;
  const dt_fusion **fusion; /* (n_layers): the fused group starting at each layer, or NULL (dt_fusion_plan) */
  int *fusion_first;        /* (n_layers): the first layer of the group ending at each layer */
  row_table *tables; /* (n_tables) row tables, arena order */
  int n_tables;
  dt_model_ctx *ctx; /* the model's own execution context */
};

struct dt_model_ctx {
  int max_batch, n_layers;
  int update_buffers;
  float **act;      /* act[i] (max_batch, in_numel of layer i); act[n] is the output */
  void *act_block;
  size_t act_bytes; /* of act_block */
  void **ws;        /* per-layer workspace, NULL if the layer needs none */
  void *ws_block;
  float *gbuf[2];   /* backward ping-pong (max_batch, largest activation) */
  float *grads;     /* gradient arena, the layout of the parameter arena */
  void (*grads_release)(void *mem, size_t bytes); /* who frees grads: NULL for dt_free */
  int batch, have_forward, forward_training;
  uint64_t rng_stream, step; /* dropout stream inputs; step counts training forwards */
  dt_grad_ready_fn on_ready;
  void *on_ready_user;
  int ready_late;    /* 1: a layer's gradients are announced only once its backward reads its parameters no more
                        (dt_model_set_ready_late) */
  int want_input_grad;
  const float *input_grad;
  int no_fusion;     /* 1: run every layer on its own */
  int fused_forward; /* the last forward ran the fusions (backward must match it) */
  float loss_weight; /* > 0: each sample's weight in the loss (else 1/batch) */
  dt_row_set *rows;  /* (n_tables) rows touched since zero_grad */
  void *rows_block;
  const dt_model *model;  /* the model it runs (dt_model_ctx_grads clears deferred blocks by its layers) */
  unsigned char *unset;   /* (n_layers): 1 while layer i's dense gradients are deferred zeros (zero_grad_deferred) */
  int any_unset;
  dt_seq_layout seq; /* packed sequences: the last forward's layout (off, sq_off: max_batch + 1 each) */
  int has_seq;
  dt_amp amp;         /* mixed precision of the forwards and backwards (dt_model_ctx_set_amp) */
  float *lowp_params; /* amp: the parameters rounded to the grid, refreshed by each forward (autocast's cast cache) */
  float *amp_scratch; /* amp: two blocks of amp_floats, the layers' rounded operands */
  size_t amp_floats;
};

/* ---- helpers ------------------------------------------------------------------ */

const char *dt_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t o = 0;
  if (len == 0) return buf;
  buf[0] = '\0';
  o += (size_t)snprintf(buf + o, len - o, "(");
  for (int i = 0; i < ndim && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, i ? ", %" PRId64 : "%" PRId64, shape[i]);
  if (o < len) snprintf(buf + o, len - o, ndim == 1 ? ",)" : ")");
  return buf;
}

static uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static size_t numel_of(int ndim, const int64_t *shape) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  return n;
}

static dt_status grow(void **arr, int *cap, int need, size_t elem, const char *what) {
  if (need <= *cap) return DT_OK;
  int ncap = *cap ? *cap * 2 : 16;
  while (ncap < need) ncap *= 2;
  void *p = NULL;
  DT_CHECK(dt_alloc_array((size_t)ncap, elem, what, &p));
  if (*arr) memcpy(p, *arr, (size_t)*cap * elem);
  dt_free(*arr);
  *arr = p;
  *cap = ncap;
  return DT_OK;
}

dt_status dt_layer_priv_new(size_t bytes, const char *kind, void **out) {
  return dt_alloc_array(1, bytes, kind, out);
}

dt_status dt_layer_declare_init(dt_layer *l, const char *suffix, dt_tensor_place place, dt_init_kind init, float value,
                                int ndim, const int64_t *shape) {
  DT_CHECK(dt_layer_declare(l, suffix, place, init, 0, ndim, shape));
  l->t[l->n_tensors - 1].init_value = value;
  return DT_OK;
}

dt_status dt_layer_declare_rows(dt_layer *l, const char *suffix, int64_t rows, int64_t width, float std) {
  if (rows < 1 || rows > INT32_MAX || width < 1)
    return dt_error(DT_INVALID_ARGUMENT, "%s.%s: a table of %lld rows of %lld, expected 1..2^31-1 rows of >= 1", l->name,
                    suffix, (long long)rows, (long long)width);
  const int64_t shape[2] = {rows, width};
  DT_CHECK(dt_layer_declare_init(l, suffix, DT_PLACE_PARAM, DT_INIT_NORMAL, std, 2, shape));
  l->t[l->n_tensors - 1].row_table = 1;
  return DT_OK;
}

dt_status dt_layer_declare(dt_layer *l, const char *suffix, dt_tensor_place place, dt_init_kind init, int fan_in,
                           int ndim, const int64_t *shape) {
  if (l->n_tensors >= DT_LAYER_MAX_TENSORS || ndim < 0 || ndim > DT_MAX_DIMS)
    return dt_error(DT_INTERNAL, "%s: too many tensors or dims declared", l->name);
  dt_layer_tensor *t = &l->t[l->n_tensors];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s%s%s", l->name, l->name[0] ? "." : "", suffix);
  t->place = place;
  t->init = init;
  t->fan_in = fan_in;
  t->rows_id = -1;
  t->zero_row = -1;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  t->numel = numel_of(ndim, shape);
  switch (place) {
  case DT_PLACE_PARAM: t->off = l->n_params; l->n_params += t->numel; break;
  case DT_PLACE_BUFFER: t->off = l->n_buffers; l->n_buffers += t->numel; break;
  case DT_PLACE_COUNTER: t->off = l->n_counters; l->n_counters += t->numel; break;
  }
  l->n_tensors++;
  return DT_OK;
}

/* ---- building ------------------------------------------------------------------ */

dt_status dt_model_new(int ndim, const int64_t *sample_shape, dt_model **out) {
  if (!out || (ndim > 0 && !sample_shape)) return dt_error(DT_INVALID_ARGUMENT, "dt_model_new: NULL argument");
  if (ndim < 1 || ndim > DT_SAMPLE_MAX_DIMS)
    return dt_error(DT_INVALID_ARGUMENT, "dt_model_new: sample shape has %d dims, expected 1..%d", ndim,
                    DT_SAMPLE_MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    if (sample_shape[i] < 1)
      return dt_error(DT_INVALID_ARGUMENT, "dt_model_new: sample dim %d is %" PRId64 ", expected >= 1", i,
                      sample_shape[i]);
  dt_model *m = NULL;
  DT_CHECK(dt_alloc_array(1, sizeof *m, "model", (void **)&m));
  m->sample_ndim = ndim;
  for (int i = 0; i < ndim; i++) m->sample_shape[i] = sample_shape[i];
  m->sample_numel = numel_of(ndim, sample_shape);
  m->in_dtype = DT_F32;
  m->training = 1;
  *out = m;
  return DT_OK;
}

dt_status dt_model_set_input_dtype(dt_model *m, dt_dtype dtype) {
  if (!m) return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_input_dtype: NULL model");
  if (dtype != DT_F32 && dtype != DT_I32)
    return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_input_dtype: inputs are f32 or i32 (got dtype %d)", (int)dtype);
  if (m->n_layers) return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_input_dtype: set it before adding layers");
  m->in_dtype = dtype;
  return DT_OK;
}

dt_dtype dt_model_input_dtype(const dt_model *m) { return m ? m->in_dtype : DT_F32; }

dt_status dt_model_set_sequence_input(dt_model *m, int rows, int mask_row) {
  if (!m) return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_sequence_input: NULL model");
  if (m->built) return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_sequence_input: the model is built already");
  if (m->in_dtype != DT_I32 || m->sample_ndim != 2 || m->sample_shape[0] != rows || mask_row < 0 || mask_row >= rows)
    return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_sequence_input: needs i32 samples of (%d, L) with the mask in "
                    "row %d of them", rows, mask_row);
  m->seq_rows = rows;
  m->seq_mask_row = mask_row;
  return DT_OK;
}

static void release_params(dt_model *m) {
  if (m->params_release) m->params_release(m->params, (m->n_params ? m->n_params : 1) * sizeof(float));
  else dt_free(m->params);
  m->params = NULL;
  m->params_release = NULL;
}

void dt_model_free(dt_model *m) {
  if (!m) return;
  dt_model_ctx_free(m->ctx);
  for (int i = 0; i < m->n_layers; i++) dt_free(m->layers[i].priv);
  dt_free(m->layers);
  dt_free(m->tensors);
  release_params(m);
  dt_free(m->buffers);
  dt_free(m->counters);
  dt_free(m->fusion_first);
  dt_free(m->fusion);
  dt_free(m->tables);
  dt_free(m);
}

static dt_status add_layer(dt_model *m, const dt_layer_ops *ops, const char *name, void *priv, int partner) {
  dt_status st = DT_OK;
  if (!m || !ops) {
    st = dt_error(DT_INVALID_ARGUMENT, "add layer: NULL model");
    goto fail;
  }
  if (m->built) {
    st = dt_error(DT_INVALID_ARGUMENT, "%s: cannot add a layer after dt_model_build", name ? name : "?");
    goto fail;
  }
  /* "" is the model itself, as a bare torch.nn.Linear used as the model: tensors "weight", "bias". */
  if (!name || strlen(name) >= DT_LAYER_NAME_MAX) {
    st = dt_error(DT_INVALID_ARGUMENT, "add %s: layer name must have at most %d characters", ops->kind,
                  DT_LAYER_NAME_MAX - 1);
    goto fail;
  }
  if (partner < 0) /* a residual end and shortcut reuse their begin's name */
    for (int i = 0; i < m->n_layers; i++)
      if (m->layers[i].ops != &dt_residual_end_ops && m->layers[i].ops != &dt_residual_shortcut_ops &&
          strcmp(m->layers[i].name, name) == 0) {
        st = dt_error(DT_INVALID_ARGUMENT, "add %s: a layer named \"%s\" exists already", ops->kind, name);
        goto fail;
      }
  DT_CHECK_GOTO(grow((void **)&m->layers, &m->cap_layers, m->n_layers + 1, sizeof(dt_layer), "layers"), st, fail);
  dt_layer *l = &m->layers[m->n_layers];
  memset(l, 0, sizeof *l);
  l->ops = ops;
  l->priv = priv;
  l->index = m->n_layers;
  l->partner = partner;
  snprintf(l->name, sizeof l->name, "%s", name);
  l->in_dtype = m->n_layers == 0 ? m->in_dtype : DT_F32;
  if (m->n_layers == 0) {
    l->in_ndim = m->sample_ndim;
    memcpy(l->in_shape, m->sample_shape, sizeof l->in_shape);
  } else {
    const dt_layer *p = &m->layers[m->n_layers - 1];
    l->in_ndim = p->out_ndim;
    memcpy(l->in_shape, p->out_shape, sizeof l->in_shape);
  }
  l->in_numel = numel_of(l->in_ndim, l->in_shape);
  st = ops->infer(l);
  if (st != DT_OK) {
    memset(l, 0, sizeof *l);
    goto fail;
  }
  l->out_numel = numel_of(l->out_ndim, l->out_shape);
  DT_CHECK_GOTO(grow((void **)&m->tensors, &m->cap_tensors, m->n_tensors + l->n_tensors, sizeof(tensor_ref),
                     "tensor table"),
                st, fail);
  for (int k = 0; k < l->n_tensors; k++) m->tensors[m->n_tensors++] = (tensor_ref){m->n_layers, k};
  m->n_layers++;
  return DT_OK;
fail:
  dt_free(priv);
  return st;
}

dt_status dt_model_add_layer(dt_model *m, const dt_layer_ops *ops, const char *name, void *priv) {
  return add_layer(m, ops, name, priv, -1);
}

dt_status dt_model_begin_residual(dt_model *m, const char *name) {
  if (!m) return dt_error(DT_INVALID_ARGUMENT, "dt_model_begin_residual: NULL model");
  if (m->n_open >= MAX_RESIDUAL_DEPTH)
    return dt_error(DT_INVALID_ARGUMENT, "%s: residual branches nest deeper than %d", name ? name : "?",
                    MAX_RESIDUAL_DEPTH);
  DT_CHECK(add_layer(m, &dt_residual_begin_ops, name, NULL, -1));
  m->open_shortcut[m->n_open] = -1;
  m->open[m->n_open++] = m->n_layers - 1;
  return DT_OK;
}

dt_status dt_model_residual_shortcut(dt_model *m) {
  if (!m) return dt_error(DT_INVALID_ARGUMENT, "dt_model_residual_shortcut: NULL model");
  if (m->n_open == 0) return dt_error(DT_INVALID_ARGUMENT, "dt_model_residual_shortcut: no residual branch is open");
  const int b = m->open[m->n_open - 1];
  if (m->open_shortcut[m->n_open - 1] >= 0)
    return dt_error(DT_INVALID_ARGUMENT, "%s: the residual has a shortcut already", m->layers[b].name);
  residual_end_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "residual", (void **)&p));
  p->ndim = m->layers[b].in_ndim;
  memcpy(p->shape, m->layers[b].in_shape, sizeof p->shape);
  char name[DT_LAYER_NAME_MAX];
  snprintf(name, sizeof name, "%s", m->layers[b].name);
  DT_CHECK(add_layer(m, &dt_residual_shortcut_ops, name, p, b));
  m->open_shortcut[m->n_open - 1] = m->n_layers - 1;
  return DT_OK;
}

dt_status dt_model_end_residual(dt_model *m) {
  if (!m) return dt_error(DT_INVALID_ARGUMENT, "dt_model_end_residual: NULL model");
  if (m->n_open == 0) return dt_error(DT_INVALID_ARGUMENT, "dt_model_end_residual: no residual branch is open");
  const int b = m->open[m->n_open - 1], s = m->open_shortcut[m->n_open - 1];
  /* The end adds the begin's input, or after a skip path the branch output: the shortcut's input. */
  const int other = s >= 0 ? s : b;
  residual_end_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "residual", (void **)&p));
  p->ndim = m->layers[other].in_ndim;
  memcpy(p->shape, m->layers[other].in_shape, sizeof p->shape);
  p->after_shortcut = s >= 0;
  char name[DT_LAYER_NAME_MAX];
  snprintf(name, sizeof name, "%s", m->layers[b].name);
  DT_CHECK(add_layer(m, &dt_residual_end_ops, name, p, other));
  m->layers[b].partner = m->n_layers - 1;
  m->n_open--;
  return DT_OK;
}

dt_status dt_model_set_init(dt_model *m, const char *name, dt_init_kind init, float value) {
  if (!m || !name) return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_init: NULL argument");
  if (m->built) return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_init(%s): the model is built already", name);
  for (int i = 0; i < m->n_tensors; i++) {
    dt_layer_tensor *t = &m->layers[m->tensors[i].layer].t[m->tensors[i].k];
    if (strcmp(t->name, name) != 0) continue;
    t->init = init;
    t->init_value = value;
    return DT_OK;
  }
  return dt_error(DT_NOT_FOUND, "dt_model_set_init: no tensor named \"%s\" in the model", name);
}

static void init_params(dt_model *m) {
  for (int ti = 0; ti < m->n_tensors; ti++) {
    const dt_layer *l = &m->layers[m->tensors[ti].layer];
    const dt_layer_tensor *t = &l->t[m->tensors[ti].k];
    if (t->place == DT_PLACE_COUNTER) {
      for (size_t i = 0; i < t->numel; i++) m->counters[l->counter_off + t->off + i] = 0;
      continue;
    }
    float *p = t->place == DT_PLACE_PARAM ? m->params + l->param_off + t->off : m->buffers + l->buffer_off + t->off;
    dt_rng r;
    dt_rng_init(&r, m->seed, (uint64_t)ti); /* one stream per tensor: adding layers elsewhere keeps others */
    if (t->init == DT_INIT_FAN_IN) {
      /* kaiming_uniform(a=sqrt(5)): gain sqrt(2/(1+5)), bound gain*sqrt(3/fan_in) = 1/sqrt(fan_in) */
      float bound = 1.0f / sqrtf((float)t->fan_in);
      for (size_t i = 0; i < t->numel; i++) p[i] = dt_rng_uniform_range(&r, -bound, bound);
    } else if (t->init == DT_INIT_NORMAL) {
      for (size_t i = 0; i < t->numel; i++) p[i] = t->init_value * dt_rng_normal(&r);
    } else if (t->init == DT_INIT_KAIMING_NORMAL_FAN_OUT) {
      size_t fan_out = t->ndim ? (size_t)t->shape[0] : 1;
      for (int d = 2; d < t->ndim; d++) fan_out *= (size_t)t->shape[d];
      const float std = sqrtf(2.0f / (float)fan_out); /* gain sqrt(2) (ReLU) / sqrt(fan_out) */
      for (size_t i = 0; i < t->numel; i++) p[i] = std * dt_rng_normal(&r);
    } else if (t->init == DT_INIT_CONST) {
      for (size_t i = 0; i < t->numel; i++) p[i] = t->init_value;
    } else {
      float v = t->init == DT_INIT_ONES ? 1.0f : 0.0f;
      for (size_t i = 0; i < t->numel; i++) p[i] = v;
    }
    if (t->zero_row >= 0 && t->ndim == 2 && t->zero_row < t->shape[0])
      memset(p + (size_t)t->zero_row * (size_t)t->shape[1], 0, (size_t)t->shape[1] * sizeof(float));
  }
}

/* The row tables in arena order, each numbered in its tensor (rows_id). */
static dt_status list_row_tables(dt_model *m) {
  int n = 0;
  for (int i = 0; i < m->n_tensors; i++) n += m->layers[m->tensors[i].layer].t[m->tensors[i].k].row_table;
  if (!n) return DT_OK;
  DT_CHECK(dt_alloc_array((size_t)n, sizeof(row_table), "row tables", (void **)&m->tables));
  for (int i = 0; i < m->n_tensors; i++) {
    const dt_layer *l = &m->layers[m->tensors[i].layer];
    const dt_layer_tensor *t = &l->t[m->tensors[i].k];
    if (t->row_table)
      m->tables[m->n_tables++] = (row_table){.tensor = i, .off = l->param_off + t->off, .rows = t->shape[0],
                                             .width = t->shape[1]};
  }
  for (int a = 1; a < n; a++) /* insertion sort by offset: a handful of tables */
    for (int b = a; b > 0 && m->tables[b].off < m->tables[b - 1].off; b--) {
      row_table tmp = m->tables[b];
      m->tables[b] = m->tables[b - 1];
      m->tables[b - 1] = tmp;
    }
  for (int k = 0; k < n; k++) {
    const tensor_ref *r = &m->tensors[m->tables[k].tensor];
    m->layers[r->layer].t[r->k].rows_id = k;
  }
  return DT_OK;
}

dt_status dt_model_build(dt_model *m, int max_batch, uint64_t seed) {
  dt_status st = DT_OK;
  if (!m) return dt_error(DT_INVALID_ARGUMENT, "dt_model_build: NULL model");
  if (m->built) return dt_error(DT_INVALID_ARGUMENT, "dt_model_build: the model is built already");
  if (m->n_layers == 0) return dt_error(DT_INVALID_ARGUMENT, "dt_model_build: the model has no layers");
  if (m->n_open)
    return dt_error(DT_INVALID_ARGUMENT, "dt_model_build: residual branch \"%s\" was not ended (dt_model_end_residual)",
                    m->layers[m->open[m->n_open - 1]].name);
  if (max_batch < 1) return dt_error(DT_INVALID_ARGUMENT, "dt_model_build: max_batch %d, expected >= 1", max_batch);
  /* Parameters in reverse layer order: backward finishes the last layer first,
   * so its gradients (offset 0) are ready first and readiness sweeps forward. */
  size_t np = 0, nb = 0, nc = 0;
  for (int i = m->n_layers - 1; i >= 0; i--) {
    m->layers[i].param_off = np;
    np += m->layers[i].n_params;
  }
  for (int i = 0; i < m->n_layers; i++) {
    m->layers[i].buffer_off = nb;
    nb += m->layers[i].n_buffers;
    m->layers[i].counter_off = nc;
    nc += m->layers[i].n_counters;
  }
  DT_CHECK_GOTO(dt_alloc_array(np ? np : 1, sizeof(float), "parameter arena", (void **)&m->params), st, fail);
  DT_CHECK_GOTO(dt_alloc_array(nb ? nb : 1, sizeof(float), "buffer arena", (void **)&m->buffers), st, fail);
  DT_CHECK_GOTO(dt_alloc_array(nc ? nc : 1, sizeof(int64_t), "counters", (void **)&m->counters), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)m->n_layers, sizeof *m->fusion, "fusion plan", (void **)&m->fusion), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)m->n_layers, sizeof(int), "fusion plan", (void **)&m->fusion_first), st, fail);
  dt_fusion_plan(m->layers, m->n_layers, m->fusion, m->fusion_first);
  DT_CHECK_GOTO(list_row_tables(m), st, fail);
  m->n_params = np;
  m->n_buffers = nb;
  m->n_counters = nc;
  m->seed = seed;
  m->max_batch = max_batch;
  init_params(m);
  m->built = 1;
  DT_CHECK_GOTO(dt_model_ctx_new(m, max_batch, 1, &m->ctx), st, fail);
  return DT_OK;
fail:
  m->built = 0;
  dt_free(m->fusion_first);
  dt_free(m->fusion);
  dt_free(m->counters);
  dt_free(m->buffers);
  dt_free(m->params);
  dt_free(m->tables);
  m->tables = NULL;
  m->n_tables = 0;
  m->fusion_first = NULL;
  m->fusion = NULL;
  m->counters = NULL;
  m->buffers = NULL;
  m->params = NULL;
  m->n_params = m->n_buffers = m->n_counters = 0;
  return st;
}

/* ---- execution contexts ----------------------------------------------------------- */

/* The row sets of a context: a mark byte and a list entry per row of every table. */
static dt_status rows_new(const dt_model *m, dt_model_ctx *c) {
  if (!m->n_tables) return DT_OK;
  size_t bytes = 0;
  for (int k = 0; k < m->n_tables; k++) bytes += DT_ALIGN_UP((size_t)m->tables[k].rows * (1 + sizeof(int32_t)));
  DT_CHECK(dt_alloc_array((size_t)m->n_tables, sizeof(dt_row_set), "row sets", (void **)&c->rows));
  DT_CHECK(dt_alloc_array(bytes, 1, "row sets", &c->rows_block));
  char *p = c->rows_block;
  for (int k = 0; k < m->n_tables; k++) {
    const size_t rows = (size_t)m->tables[k].rows;
    c->rows[k].list = (int32_t *)p;
    c->rows[k].mark = (unsigned char *)(p + rows * sizeof(int32_t));
    p += DT_ALIGN_UP(rows * (1 + sizeof(int32_t)));
  }
  return DT_OK;
}

/* A layer whose output is its input's floats: no activation of its own, no forward to run. */
static int aliases_input(const dt_layer *l) { return l->ops->is_view || l->ops->forward_view; }

dt_status dt_model_ctx_new(dt_model *m, int max_batch, int update_buffers, dt_model_ctx **out) {
  dt_status st = DT_OK;
  if (!m || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_model_ctx_new: NULL argument");
  if (!m->built) return dt_error(DT_INVALID_ARGUMENT, "dt_model_ctx_new: the model is not built");
  if (max_batch < 1) return dt_error(DT_INVALID_ARGUMENT, "dt_model_ctx_new: max_batch %d, expected >= 1", max_batch);
  dt_model_ctx *c = NULL;
  DT_CHECK(dt_alloc_array(1, sizeof *c, "model context", (void **)&c));
  c->max_batch = max_batch;
  c->n_layers = m->n_layers;
  c->update_buffers = update_buffers;
  int n = m->n_layers;
  DT_CHECK_GOTO(dt_alloc_array((size_t)n + 1, sizeof(float *), "activation table", (void **)&c->act), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)n, sizeof(void *), "workspace table", (void **)&c->ws), st, fail);
  /* activations: one block, each slice 64-byte aligned */
  size_t biggest = m->sample_numel, bytes = DT_ALIGN_UP(m->sample_numel * (size_t)max_batch * sizeof(float));
  for (int i = 0; i < n; i++) {
    size_t e = m->layers[i].out_numel;
    if (e > biggest) biggest = e;
    if (!aliases_input(&m->layers[i])) bytes += DT_ALIGN_UP(e * (size_t)max_batch * sizeof(float));
  }
  DT_CHECK_GOTO(dt_alloc_array_unset(bytes, 1, "activations", &c->act_block), st, fail);
  c->act_bytes = bytes;
  char *p = c->act_block;
  c->act[0] = (float *)p;
  p += DT_ALIGN_UP(m->sample_numel * (size_t)max_batch * sizeof(float));
  for (int i = 0; i < n; i++) {
    if (aliases_input(&m->layers[i])) { /* the same floats as its input */
      c->act[i + 1] = c->act[i];
      continue;
    }
    c->act[i + 1] = (float *)p;
    p += DT_ALIGN_UP(m->layers[i].out_numel * (size_t)max_batch * sizeof(float));
  }
  size_t wbytes = 0;
  for (int i = 0; i < n; i++)
    if (m->layers[i].ops->ws_bytes) wbytes += DT_ALIGN_UP(m->layers[i].ops->ws_bytes(&m->layers[i], max_batch));
  if (wbytes) {
    DT_CHECK_GOTO(dt_alloc_array_unset(wbytes, 1, "layer workspaces", &c->ws_block), st, fail);
    char *w = c->ws_block;
    for (int i = 0; i < n; i++) {
      size_t b = m->layers[i].ops->ws_bytes ? m->layers[i].ops->ws_bytes(&m->layers[i], max_batch) : 0;
      c->ws[i] = b ? w : NULL;
      w += DT_ALIGN_UP(b);
    }
  }
  for (int k = 0; k < 2; k++)
    DT_CHECK_GOTO(dt_alloc_array_unset(biggest * (size_t)max_batch, sizeof(float), "backward buffers",
                                 (void **)&c->gbuf[k]),
                  st, fail);
  DT_CHECK_GOTO(dt_alloc_array(m->n_params ? m->n_params : 1, sizeof(float), "gradient arena", (void **)&c->grads),
                st, fail);
  DT_CHECK_GOTO(rows_new(m, c), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)n + 1, 1, "deferred gradients", (void **)&c->unset), st, fail);
  c->model = m;
  if (m->seq_rows) {
    DT_CHECK_GOTO(dt_alloc_array((size_t)max_batch + 1, sizeof(int32_t), "sequence offsets", (void **)&c->seq.off),
                  st, fail);
    DT_CHECK_GOTO(dt_alloc_array((size_t)max_batch + 1, sizeof(int64_t), "sequence offsets", (void **)&c->seq.sq_off),
                  st, fail);
  }
  *out = c;
  return DT_OK;
fail:
  dt_model_ctx_free(c);
  return st;
}

static void release_grads(dt_model_ctx *c) {
  if (c->grads_release)
    c->grads_release(c->grads, (c->model->n_params ? c->model->n_params : 1) * sizeof(float));
  else
    dt_free(c->grads);
}

void dt_model_ctx_free(dt_model_ctx *c) {
  if (!c) return;
  dt_free(c->amp_scratch);
  dt_free(c->lowp_params);
  dt_free(c->seq.off);
  dt_free(c->seq.sq_off);
  dt_free(c->rows_block);
  dt_free(c->rows);
  dt_free(c->unset);
  release_grads(c);
  dt_free(c->gbuf[1]);
  dt_free(c->gbuf[0]);
  dt_free(c->ws_block);
  dt_free(c->act_block);
  dt_free(c->ws);
  dt_free(c->act);
  dt_free(c);
}

dt_model_ctx *dt_model_default_ctx(dt_model *m) { return m ? m->ctx : NULL; }
void dt_model_ctx_set_rng_stream(dt_model_ctx *c, uint64_t stream) {
  if (c) c->rng_stream = stream;
}
uint64_t dt_model_ctx_rng_step(const dt_model_ctx *c) { return c ? c->step : 0; }
void dt_model_ctx_set_rng_step(dt_model_ctx *c, uint64_t step) {
  if (c) c->step = step;
}
void dt_model_ctx_on_grad_ready(dt_model_ctx *c, dt_grad_ready_fn fn, void *user) {
  if (!c) return;
  c->on_ready = fn;
  c->on_ready_user = user;
}
void dt_model_ctx_want_input_grad(dt_model_ctx *c, int on) {
  if (c) c->want_input_grad = on != 0;
}
void dt_model_ctx_set_fusion(dt_model_ctx *c, int on) {
  if (c) c->no_fusion = on == 0;
}
const float *dt_model_ctx_input_grad(const dt_model_ctx *c) { return c ? c->input_grad : NULL; }
void dt_model_ctx_set_loss_weight(dt_model_ctx *c, float w) {
  if (c) c->loss_weight = w;
}

/* Under amp: whether layer l's GEMMs round its weights and input themselves (native kernels that round as they pack). */
static int gemm_rounds(const dt_layer *l, dt_amp amp) {
  return amp != DT_AMP_OFF && l->ops->gemm_operands && dt_amp_native_gemm(amp);
}

/* Zeroes the arena: row tables only at their touched rows, the rest whole (dense: also what lies between). */
static void zero_grad(const dt_model *m, dt_model_ctx *c, int dense) {
  size_t at = 0;
  for (int k = 0; k < m->n_tables; k++) {
    const row_table *t = &m->tables[k];
    dt_row_set *s = &c->rows[k];
    if (dense) memset(c->grads + at, 0, (t->off - at) * sizeof(float));
    for (int64_t i = 0; i < s->n; i++) {
      memset(c->grads + t->off + (size_t)s->list[i] * (size_t)t->width, 0, (size_t)t->width * sizeof(float));
      s->mark[s->list[i]] = 0;
    }
    s->n = s->refs = 0;
    at = t->off + (size_t)(t->rows * t->width);
  }
  if (dense) memset(c->grads + at, 0, (m->n_params - at) * sizeof(float));
}

void dt_model_ctx_zero_grad(const dt_model *m, dt_model_ctx *c) {
  if (!m || !c || !m->n_params) return;
  zero_grad(m, c, 1);
  memset(c->unset, 0, (size_t)m->n_layers);
  c->any_unset = 0;
}

/* Layer i's gradients but its row tables' (the dense part of its block) set to zero; no longer deferred. */
static void clear_deferred(const dt_model *m, dt_model_ctx *c, int i) {
  const dt_layer *l = &m->layers[i];
  for (int k = 0; k < l->n_tensors; k++)
    if (l->t[k].place == DT_PLACE_PARAM && !l->t[k].row_table)
      memset(c->grads + l->param_off + l->t[k].off, 0, l->t[k].numel * sizeof(float));
  c->unset[i] = 0;
}

/* Every deferred block cleared: the arena as an eager zero_grad and the backwards since would have left it. */
static void settle_grads(const dt_model *m, dt_model_ctx *c) {
  if (!c->any_unset) return;
  for (int i = 0; i < m->n_layers; i++)
    if (c->unset[i]) clear_deferred(m, c, i);
  c->any_unset = 0;
}

/* Row tables as zero_grad clears them; every other gradient deferred (the layers' dense blocks; what lies between
 * them is never written, so stays zero). */
void dt_model_ctx_zero_grad_deferred(const dt_model *m, dt_model_ctx *c) {
  if (!m || !c || !m->n_params) return;
  zero_grad(m, c, 0);
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].n_params) c->unset[i] = 1, c->any_unset = 1;
}

int dt_model_ctx_grads_take_deferred(dt_model_ctx *c) {
  if (!c || !c->any_unset) return 0;
  const dt_model *m = c->model;
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].n_params && !c->unset[i]) {
      settle_grads(m, c);
      return 0;
    }
  memset(c->unset, 0, (size_t)m->n_layers);
  c->any_unset = 0;
  return 1;
}

float *dt_model_ctx_grads(dt_model_ctx *c) {
  if (!c) return NULL;
  settle_grads(c->model, c);
  return c->grads;
}

int dt_model_num_row_tables(const dt_model *m) { return m ? m->n_tables : 0; }

void dt_model_ctx_rows(const dt_model *m, const dt_model_ctx *c, int k, dt_rows *out) {
  const row_table *t = &m->tables[k];
  const dt_row_set *s = &c->rows[k];
  *out = (dt_rows){.tensor = t->tensor, .off = t->off, .rows = t->rows, .width = t->width, .n = s->n,
                   .list = s->list, .refs = s->refs};
}

void dt_model_ctx_rows_touch(const dt_model *m, dt_model_ctx *c, int k, const int32_t *rows, int64_t n) {
  dt_row_set *s = &c->rows[k];
  const int64_t refs = s->refs;
  for (int64_t i = 0; i < n; i++)
    if (rows[i] >= 0 && rows[i] < m->tables[k].rows) dt_row_set_touch(s, rows[i]);
  s->refs = refs; /* rows another replica looked up: not lookups of this context */
}

static void fill_io(dt_model *m, dt_model_ctx *c, int i, dt_layer_io *io) {
  const dt_layer *l = &m->layers[i];
  memset(io, 0, sizeof *io);
  io->params = m->params + l->param_off;
  io->grads = c->grads + l->param_off;
  io->buffers = m->buffers + l->buffer_off;
  io->counters = m->counters + l->counter_off;
  io->update_buffers = c->update_buffers;
  io->ws = c->ws[i];
  if (l->partner >= 0) {
    io->partner_ws = c->ws[l->partner];
    io->partner_in = c->act[l->partner];
  }
  io->model_in = c->act[0];
  io->seq = c->has_seq ? &c->seq : NULL;
  io->batch = c->batch;
  io->training = c->forward_training;
  io->seed = m->seed;
  io->stream = mix64(mix64(mix64(c->rng_stream) ^ (uint64_t)i) ^ c->step);
  io->amp = c->amp;
  io->gemm_rounds = gemm_rounds(l, c->amp);
  if (c->amp != DT_AMP_OFF) {
    io->lowp_params = (io->gemm_rounds ? m->params : c->lowp_params) + l->param_off;
    io->amp_scratch[0] = c->amp_scratch;
    io->amp_scratch[1] = c->amp_scratch + c->amp_floats;
  }
  io->loss_weight = c->loss_weight > 0 ? c->loss_weight : 1.0f / (float)c->batch;
  for (int k = 0; k < l->n_tensors; k++)
    if (l->t[k].rows_id >= 0) io->rows[k] = &c->rows[l->t[k].rows_id];
}

/* Autocast's cast of the parameters, once per forward: each layer's block rounded into the context's copy, but for
 * the layers whose GEMMs round their weights as they read them. */
static void round_params(const dt_model *m, dt_model_ctx *c) {
  for (int i = 0; i < m->n_layers; i++) {
    const dt_layer *l = &m->layers[i];
    if (l->n_params && !gemm_rounds(l, c->amp))
      dt_lowp_round_copy(c->amp, c->lowp_params + l->param_off, m->params + l->param_off, l->n_params);
  }
}

/* The amp buffers: the rounded parameters and two blocks the size of the largest activation at max_batch. */
dt_status dt_model_ctx_set_amp(dt_model *m, dt_model_ctx *c, dt_amp mode) {
  if (!m || !c) return dt_error(DT_INVALID_ARGUMENT, "dt_model_ctx_set_amp: NULL argument");
  if (mode != DT_AMP_OFF) DT_CHECK(dt_amp_kernels_check());
  if (mode != c->amp) c->have_forward = 0; /* a backward needs a forward of its own mode (its rounded copies) */
  if (mode != DT_AMP_OFF && !c->lowp_params) {
    size_t biggest = m->sample_numel;
    for (int i = 0; i < m->n_layers; i++)
      if (m->layers[i].out_numel > biggest) biggest = m->layers[i].out_numel;
    const size_t floats = biggest * (size_t)c->max_batch;
    float *params = NULL, *scratch = NULL;
    /* not zeroed: each forward writes the blocks it reads (and a layer its operands before it reads them), and the
     * blocks of the layers whose GEMMs round their own weights (gemm_rounds) are never written, so never resident */
    DT_CHECK(dt_alloc_array_unset(m->n_params ? m->n_params : 1, sizeof(float), "amp parameters", (void **)&params));
    dt_status st = dt_alloc_array_unset(2 * floats, sizeof(float), "amp operands", (void **)&scratch);
    if (st != DT_OK) {
      dt_free(params);
      return st;
    }
    c->lowp_params = params;
    c->amp_scratch = scratch;
    c->amp_floats = floats;
  }
  c->amp = mode;
  return DT_OK;
}

/* Runs layer i's forward, or that of the fused group f starting at layer i. */
static dt_status forward_unit(dt_model *m, dt_model_ctx *c, int i, const dt_fusion *f) {
  dt_layer_io io[DT_FUSION_MAX_LAYERS];
  for (int k = 0; k < (f ? f->n_layers : 1); k++) fill_io(m, c, i + k, &io[k]);
  if (f) return f->forward(&m->layers[i], io, c->act + i);
  return m->layers[i].ops->forward(&m->layers[i], io, c->act[i], c->act[i + 1]);
}

/* The span of one layer's forward or backward (or a fused group's, layers first..last); a backward's
 * ends before the executor's gradient-ready event so it measures the layer alone (a layer that announces its
 * own, as Linear does, includes that call: a bucket's hand-off, microseconds, more where a compression hook
 * converts the bucket on this thread). */
static void trace_layer(const dt_model *m, const char *pass, int first, int last, double t0_us) {
  char name[3 * DT_LAYER_NAME_MAX + 16], args[96];
  int n = snprintf(name, sizeof name, "%s %s", pass, m->layers[first].name);
  for (int k = first + 1; k <= last && n > 0 && (size_t)n < sizeof name; k++)
    n += snprintf(name + n, sizeof name - (size_t)n, "+%s", m->layers[k].name);
  snprintf(args, sizeof args, "\"kind\":\"%s\",\"params\":%zu", m->layers[first].ops->kind,
           m->layers[first].n_params);
  dt_trace_span("nn", name, t0_us, dt_trace_now_us(), args);
}

dt_status dt_model_ctx_forward(dt_model *m, dt_model_ctx *c, const void *x, int batch, const float **out) {
  if (!m || !c || !x || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_model_forward: NULL argument");
  if (!m->built) return dt_error(DT_INVALID_ARGUMENT, "dt_model_forward: call dt_model_build first");
  if (batch < 1 || batch > c->max_batch)
    return dt_error(DT_INVALID_ARGUMENT, "dt_model_forward: batch %d outside 1..%d (max_batch of the build)", batch,
                    c->max_batch);
  c->have_forward = 0;
  c->batch = batch;
  c->forward_training = m->training;
  memcpy(c->act[0], x, (size_t)batch * m->sample_numel * dt_dtype_size(m->in_dtype));
  c->has_seq = m->seq_rows > 0;
  if (c->has_seq)
    DT_CHECK(dt_seq_layout_fill(&c->seq, x, batch, m->seq_rows, (int)m->sample_shape[1], m->seq_mask_row));
  c->fused_forward = !c->no_fusion;
  if (c->amp != DT_AMP_OFF) round_params(m, c);
  const double trace_t0 = dt_trace_enabled() ? dt_trace_now_us() : 0;
  for (int i = 0; i < m->n_layers; i++) {
    if (aliases_input(&m->layers[i])) continue;
    const dt_fusion *f = c->fused_forward ? m->fusion[i] : NULL;
    const double layer_t0 = trace_t0 > 0 ? dt_trace_now_us() : 0;
    dt_status st = forward_unit(m, c, i, f);
    if (st != DT_OK) return dt_error_prefix(st, "forward of %s (%s)", m->layers[i].name, m->layers[i].ops->kind);
    if (layer_t0 > 0) trace_layer(m, "forward", i, f ? i + f->n_layers - 1 : i, layer_t0);
    if (f) i += f->n_layers - 1;
  }
  if (m->training) c->step++;
  c->have_forward = 1;
  *out = c->act[m->n_layers];
  if (trace_t0 > 0) {
    char args[64];
    snprintf(args, sizeof args, "\"batch\":%d,\"training\":%d", batch, c->forward_training);
    dt_trace_span("nn", "forward", trace_t0, dt_trace_now_us(), args);
  }
  return DT_OK;
}

/* Runs the backward of layer first (first == last) or of the fused group first..last. A layer whose gradients are
 * deferred zeros writes them where its kind can (ops->assigns_grads, run alone), else finds them cleared. A layer
 * run alone may announce its gradients itself (dt_layer_grads_final); *final says whether it did. */
static void backward_unit(dt_model *m, dt_model_ctx *c, int first, int last, const float *dout, float *dinp,
                          dt_grads_final *final) {
  const dt_layer *l = &m->layers[first];
  dt_layer_io io[DT_FUSION_MAX_LAYERS];
  for (int k = 0; k <= last - first; k++) {
    fill_io(m, c, first + k, &io[k]);
    if (!c->unset[first + k]) continue;
    if (first == last && l->ops->assigns_grads)
      io[k].grads_unset = 1, c->unset[first] = 0;
    else
      clear_deferred(m, c, first + k);
  }
  if (first < last) {
    m->fusion[first]->backward(l, io, c->act + first, dout, dinp);
    return;
  }
  /* pieces only where someone listens: a split GEMM is the same work, announced in parts */
  *final = (dt_grads_final){.fn = c->on_ready, .user = c->on_ready_user, .offset = l->param_off,
                            .count = l->n_params, .done = !l->n_params, .late = c->ready_late,
                            .piece = c->on_ready && c == m->ctx ? l->grad_piece : 0};
  /* a kind that announces early learns of late announcements; any other is announced by the caller */
  io[0].final = !c->ready_late || l->ops->grads_in_rows ? final : NULL;
  l->ops->backward(l, io, c->act[first], c->act[first + 1], dout, dinp);
}

dt_status dt_model_ctx_backward(dt_model *m, dt_model_ctx *c, const float *dout) {
  if (!m || !c || !dout) return dt_error(DT_INVALID_ARGUMENT, "dt_model_backward: NULL argument");
  if (!c->have_forward)
    return dt_error(DT_INVALID_ARGUMENT, "dt_model_backward: no forward to back-propagate; call dt_model_forward first");
  if (!c->forward_training)
    for (int i = 0; i < m->n_layers; i++)
      if (m->layers[i].ops->backward_needs_train_forward)
        return dt_error(DT_INVALID_ARGUMENT,
                        "dt_model_backward: %s (%s) needs a training-mode forward, but the last forward ran in "
                        "evaluation mode (dt_model_set_training(m, 1))",
                        m->layers[i].name, m->layers[i].ops->kind);
  /* Layers before the first one with parameters need no backward unless the
   * input gradient is wanted. */
  int first = m->n_layers;
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].n_params) {
      first = i;
      break;
    }
  int lowest = c->want_input_grad ? 0 : first;
  const float *cur = dout;
  int which = 0;
  c->input_grad = NULL;
  /* Spans per layer only: the caller (the trainer) spans the whole backward. */
  const int tracing = dt_trace_enabled();
  for (int i = m->n_layers - 1; i >= lowest; i--) {
    const dt_layer *l = &m->layers[i];
    if (l->ops->is_view && i > lowest) continue; /* the gradient passes as it is */
    const double layer_t0 = tracing ? dt_trace_now_us() : 0;
    const int last = i;
    if (c->fused_forward) i = m->fusion_first[i]; /* a fused group ends at layer last: run it whole */
    float *dinp = (i > lowest || c->want_input_grad) ? c->gbuf[which] : NULL;
    dt_grads_final final = {.done = 1};
    backward_unit(m, c, i, last, cur, dinp, &final);
    if (tracing) trace_layer(m, "backward", i, last, layer_t0);
    for (int k = last; k >= i && c->on_ready; k--) /* arena order: the last layer's block first */
      if (m->layers[k].n_params && (i < last || !final.done)) {
        const size_t sent = i < last ? 0 : final.announced; /* pieces the layer announced itself */
        c->on_ready(c->on_ready_user, m->layers[k].param_off + sent, m->layers[k].n_params - sent);
      }
    cur = dinp;
    which ^= 1;
  }
  if (c->want_input_grad) c->input_grad = cur;
  settle_grads(m, c); /* layers the backward did not reach */
  return DT_OK;
}

/* ---- the model's own context ---------------------------------------------------------- */

void dt_model_set_training(dt_model *m, int training) {
  if (m) m->training = training != 0;
}
void dt_model_set_rng_stream(dt_model *m, uint64_t stream) {
  if (m) dt_model_ctx_set_rng_stream(m->ctx, stream);
}
uint64_t dt_model_rng_step(const dt_model *m) { return m ? dt_model_ctx_rng_step(m->ctx) : 0; }
void dt_model_set_rng_step(dt_model *m, uint64_t step) {
  if (m) dt_model_ctx_set_rng_step(m->ctx, step);
}
dt_status dt_model_forward(dt_model *m, const void *x, int batch, const float **out) {
  if (m && !m->built) return dt_error(DT_INVALID_ARGUMENT, "dt_model_forward: call dt_model_build first");
  return dt_model_ctx_forward(m, m ? m->ctx : NULL, x, batch, out);
}
dt_status dt_model_backward(dt_model *m, const float *dout) {
  if (m && !m->built) return dt_error(DT_INVALID_ARGUMENT, "dt_model_backward: call dt_model_build first");
  return dt_model_ctx_backward(m, m ? m->ctx : NULL, dout);
}
void dt_model_zero_grad(dt_model *m) {
  if (m) dt_model_ctx_zero_grad(m, m->ctx);
}
void dt_model_zero_grad_deferred(dt_model *m) {
  if (m) dt_model_ctx_zero_grad_deferred(m, m->ctx);
}
void dt_model_on_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *user) {
  if (m) dt_model_ctx_on_grad_ready(m->ctx, fn, user);
}

/* ---- arenas and named tensors ----------------------------------------------------------- */

float *dt_model_params(dt_model *m, size_t *count) {
  if (count) *count = m && m->built ? m->n_params : 0;
  return m && m->built ? m->params : NULL;
}
float *dt_model_grads(dt_model *m, size_t *count) {
  if (count) *count = m && m->built ? m->n_params : 0;
  return m && m->built ? dt_model_ctx_grads(m->ctx) : NULL;
}
dt_status dt_model_set_grad_memory(dt_model *m, float *mem, void (*release)(void *mem, size_t bytes)) {
  if (!m || !m->built || !mem || !release || ((uintptr_t)mem & 63))
    return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_grad_memory: %s",
                    !m || !m->built ? "the model is not built" : "NULL or unaligned memory, or no release");
  dt_model_ctx *c = m->ctx;
  if (mem == c->grads) return DT_OK;
  memcpy(mem, c->grads, (m->n_params ? m->n_params : 1) * sizeof(float));
  release_grads(c);
  c->grads = mem;
  c->grads_release = release;
  return DT_OK;
}

dt_status dt_model_set_param_memory(dt_model *m, float *mem, int copy, void (*release)(void *mem, size_t bytes)) {
  if (!m || !m->built || !mem || !release || ((uintptr_t)mem & 63))
    return dt_error(DT_INVALID_ARGUMENT, "dt_model_set_param_memory: %s",
                    !m || !m->built ? "the model is not built" : "NULL or unaligned memory, or no release");
  if (mem == m->params) return DT_OK;
  if (copy) memcpy(mem, m->params, (m->n_params ? m->n_params : 1) * sizeof(float));
  release_params(m);
  m->params = mem;
  m->params_release = release;
  return DT_OK;
}

void dt_model_set_ready_late(dt_model *m, int late) {
  if (m && m->ctx) m->ctx->ready_late = late != 0;
}

size_t dt_model_set_grad_pieces(dt_model *m, int tensor, size_t max_elems) {
  if (!m || tensor < 0 || tensor >= m->n_tensors) return 0;
  dt_layer *l = &m->layers[m->tensors[tensor].layer];
  const dt_layer_tensor *t = &l->t[m->tensors[tensor].k];
  if (!l->ops->grads_in_rows || m->tensors[tensor].k != 0 || t->off != 0 || t->place != DT_PLACE_PARAM ||
      t->ndim < 2 || t->row_table)
    return 0;
  const size_t row = numel_of(t->ndim - 1, t->shape + 1), rows = (size_t)t->shape[0];
  l->grad_piece = 0;
  if (max_elems < row) return 0;
  /* as many pieces as max_elems asks, of rows as even as whole rows allow (no sliver of a row at the end) */
  const size_t n = (t->numel + max_elems - 1) / max_elems, per = (rows + n - 1) / n;
  if (n > 1 && per < rows) l->grad_piece = per * row;
  return l->grad_piece;
}

float *dt_model_buffers(dt_model *m, size_t *count) {
  if (count) *count = m && m->built ? m->n_buffers : 0;
  return m && m->built ? m->buffers : NULL;
}
size_t dt_model_num_params(const dt_model *m) {
  size_t n = 0;
  if (m)
    for (int i = 0; i < m->n_layers; i++) n += m->layers[i].n_params;
  return n;
}

size_t dt_model_activation_bytes(const dt_model *m) { return m && m->ctx ? m->ctx->act_bytes : 0; }

int dt_model_output_size(const dt_model *m) {
  if (!m) return 0;
  return m->n_layers ? (int)m->layers[m->n_layers - 1].out_numel : (int)m->sample_numel;
}
const int64_t *dt_model_input_shape(const dt_model *m, int *ndim) {
  if (ndim) *ndim = m ? m->sample_ndim : 0;
  return m ? m->sample_shape : NULL;
}
int dt_model_num_layers(const dt_model *m) { return m ? m->n_layers : 0; }
const dt_layer *dt_model_layer(const dt_model *m, int i) {
  return m && i >= 0 && i < m->n_layers ? &m->layers[i] : NULL;
}

int dt_model_num_tensors(const dt_model *m) { return m ? m->n_tensors : 0; }

dt_status dt_model_tensor_info(const dt_model *m, int i, dt_tensor_info *out) {
  if (!m || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_model_tensor_info: NULL argument");
  if (i < 0 || i >= m->n_tensors)
    return dt_error(DT_NOT_FOUND, "dt_model_tensor_info: index %d outside 0..%d", i, m->n_tensors - 1);
  const dt_layer *l = &m->layers[m->tensors[i].layer];
  const dt_layer_tensor *t = &l->t[m->tensors[i].k];
  dt_tensor_info info;
  memset(&info, 0, sizeof info);
  info.name = t->name;
  info.dtype = t->place == DT_PLACE_COUNTER ? DT_I64 : DT_F32;
  info.ndim = t->ndim;
  for (int d = 0; d < t->ndim; d++) info.shape[d] = t->shape[d];
  info.trainable = t->place == DT_PLACE_PARAM;
  info.offset = t->place == DT_PLACE_PARAM ? l->param_off + t->off
                : t->place == DT_PLACE_BUFFER ? l->buffer_off + t->off
                                              : 0;
  *out = info;
  return DT_OK;
}

void *dt_model_tensor_data(dt_model *m, int i) {
  if (!m || !m->built || i < 0 || i >= m->n_tensors) return NULL;
  const dt_layer *l = &m->layers[m->tensors[i].layer];
  const dt_layer_tensor *t = &l->t[m->tensors[i].k];
  switch (t->place) {
  case DT_PLACE_PARAM: return m->params + l->param_off + t->off;
  case DT_PLACE_BUFFER: return m->buffers + l->buffer_off + t->off;
  case DT_PLACE_COUNTER: return m->counters + l->counter_off + t->off;
  }
  return NULL;
}

dt_status dt_model_find_tensor(const dt_model *m, const char *name, int *index) {
  if (!m || !name || !index) return dt_error(DT_INVALID_ARGUMENT, "dt_model_find_tensor: NULL argument");
  for (int i = 0; i < m->n_tensors; i++)
    if (strcmp(m->layers[m->tensors[i].layer].t[m->tensors[i].k].name, name) == 0) {
      *index = i;
      return DT_OK;
    }
  return dt_error(DT_NOT_FOUND, "no tensor named \"%s\" in the model", name);
}

/* ---- summary ---------------------------------------------------------------------------- */

static const char *with_commas(size_t v, char *buf, size_t len) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%zu", v), o = 0;
  for (int i = 0; i < n && (size_t)o + 2 < len; i++) {
    if (i && (n - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = tmp[i];
  }
  buf[o] = '\0';
  return buf;
}

void dt_model_print_summary(const dt_model *m, FILE *f) {
  if (!m || !f) return;
  char shape[96], num[32];
  const char *rule = "--------------------------------------------------------------------------------";
  fprintf(f, "%s\n%-28s %-14s %-24s %12s\n", rule, "Layer (name)", "Kind", "Output Shape", "Param #");
  fprintf(f, "================================================================================\n");
  dt_shape_str(m->sample_ndim, m->sample_shape, shape, sizeof shape);
  fprintf(f, "%-28s %-14s %-24s %12s\n", "input", "Input", shape, "0");
  size_t trainable = 0, buffers = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const dt_layer *l = &m->layers[i];
    const char *name = l->name;
    dt_shape_str(l->out_ndim, l->out_shape, shape, sizeof shape);
    fprintf(f, "%-28s %-14s %-24s %12s\n", name, l->ops->label ? l->ops->label(l) : l->ops->kind, shape, with_commas(l->n_params, num, sizeof num));
    trainable += l->n_params;
    buffers += l->n_buffers + l->n_counters;
  }
  fprintf(f, "================================================================================\n");
  fprintf(f, "Total params: %s\n", with_commas(trainable, num, sizeof num));
  fprintf(f, "Trainable params: %s\n", with_commas(trainable, num, sizeof num));
  fprintf(f, "Buffers (not trained): %s\n", with_commas(buffers, num, sizeof num));
  fprintf(f, "Parameter arena: %.2f MiB\n%s\n", (double)trainable * 4.0 / (1024.0 * 1024.0), rule);
}

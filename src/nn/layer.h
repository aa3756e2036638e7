/* Internal layer contract: a layer kind is an ops table; the model owns structure and arenas, a context owns one execution. */
#ifndef DT_NN_LAYER_H
#define DT_NN_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/model.h"
#include "dtrain/model_ctx.h"
#include "dtrain/status.h"

#define DT_LAYER_NAME_MAX 64
#define DT_LAYER_MAX_TENSORS 8
#define DT_SAMPLE_MAX_DIMS (DT_MAX_DIMS - 1) /* the batch takes one dim */

typedef struct dt_layer dt_layer;

/* How build initialises a declared tensor (PyTorch's defaults). */
typedef enum dt_init_kind {
  DT_INIT_FAN_IN,  /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)): kaiming_uniform(a=sqrt(5)) and the bias rule */
  DT_INIT_ONES,
  DT_INIT_ZEROS,
  DT_INIT_NORMAL,  /* N(0, value^2): torch.nn.init.normal_(std=value) */
  DT_INIT_CONST,   /* every element = value */
  DT_INIT_KAIMING_NORMAL_FAN_OUT, /* N(0, 2/fan_out), fan_out = shape[0] * prod(shape[2:]): torch's
                                   * kaiming_normal_(mode='fan_out', nonlinearity='relu') (torchvision's ResNet convs) */
} dt_init_kind;

/* Where a declared tensor lives. */
typedef enum dt_tensor_place {
  DT_PLACE_PARAM,   /* parameter arena (trainable, has a gradient) */
  DT_PLACE_BUFFER,  /* f32 buffer arena (BN running statistics) */
  DT_PLACE_COUNTER, /* one int64 (num_batches_tracked) */
} dt_tensor_place;

typedef struct dt_layer_tensor {
  char name[DT_LAYER_NAME_MAX + 24]; /* full state_dict name, "layer1.1.running_mean" */
  dt_tensor_place place;
  dt_init_kind init;
  int fan_in;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  size_t numel;
  size_t off; /* element offset inside the layer's block of its arena (counters: index) */
  float init_value; /* DT_INIT_NORMAL: the std; DT_INIT_CONST: the value */
  int row_table;    /* a (rows, width) parameter read by row (an embedding): backward marks the rows it touches */
  int rows_id;      /* row tables: the index among the model's row tables (set by build); else -1 */
  int64_t zero_row; /* >= 0: build leaves this row zero (an embedding's padding_idx); else -1 */
} dt_layer_tensor;

/* The rows of one row table whose gradient may be non-zero since the last
 * zero_grad, in a context: mark[r] != 0 for the n rows of list. */
typedef struct dt_row_set {
  unsigned char *mark; /* (rows) */
  int32_t *list;       /* (rows) */
  int64_t n;
  int64_t refs;        /* lookups into the table since zero_grad (>= n) */
} dt_row_set;
/* Marks row r of s as touched (one lookup). */
static inline void dt_row_set_touch(dt_row_set *s, int32_t r) {
  s->refs++;
  if (s->mark[r]) return;
  s->mark[r] = 1;
  s->list[s->n++] = r;
}

/* Packed sequences (dt_model_set_sequence_input): sample b's live positions (its attention mask's 1s, which
 * come first) are rows [off[b], off[b+1]) of every (L, X) activation, one (tokens, X) matrix with no padding. */
typedef struct dt_seq_layout {
  int batch, L;
  int64_t tokens;    /* off[batch] */
  int32_t *off;      /* (batch + 1) */
  int64_t *sq_off;   /* (batch + 1): sum over earlier samples of length^2 (the attention blocks' offsets) */
} dt_seq_layout;

/* The gradient-ready announcement of one layer's parameter gradients (dt_model_ctx_on_grad_ready): made by the
 * layer itself where its kind can finish them before computing dinp (dt_layer_grads_final), else by the executor
 * after its backward. */
typedef struct dt_grads_final {
  void (*fn)(void *user, size_t offset, size_t count);
  void *user;
  size_t offset, count; /* the layer's block of the gradient arena */
  int done;
  int late;             /* the hook may change the parameters (dt_model_set_ready_late): announce nothing while the
                           backward still reads them */
  size_t piece;         /* > 0: the layer may announce its first tensor's gradient in pieces of this many elements,
                           front to back (dt_layer_grads_piece; ops->grads_in_rows), before the rest */
  size_t announced;     /* elements of the block announced so far, from offset */
} dt_grads_final;

/* Everything a layer's forward/backward may touch for one call. */
typedef struct dt_layer_io {
  const float *params; /* this layer's block of the parameter arena */
  float *grads;        /* the same block of the context's gradient arena */
  float *buffers;      /* this layer's block of the buffer arena (BN running statistics) */
  int64_t *counters;   /* this layer's int64 counters (num_batches_tracked) */
  int update_buffers;  /* training forward: 1 updates buffers and counters (one replica does) */
  void *ws;            /* this layer's workspace in the context (ws_bytes at max_batch) */
  void *partner_ws;    /* residual: the workspace of the partner layer (end -> begin or shortcut, shortcut -> begin) */
  const float *partner_in; /* residual: the partner's input (end: the skip or the branch output; shortcut: the block's input) */
  const void *model_in; /* the model's input batch (attention reads its padding mask there) */
  const dt_seq_layout *seq; /* packed sequences: the batch's layout; NULL otherwise */
  int batch;
  int training;        /* mode of the forward (backward sees the forward's mode) */
  uint64_t seed;       /* the build seed */
  uint64_t stream;     /* dropout stream: mix(rng stream, layer index, step) */
  dt_amp amp;          /* mixed precision: the autocast layers round their operands and results (nn/amp.h) */
  const float *lowp_params; /* amp: this layer's block of the context's parameters rounded to the grid (the master
                             * block where gemm_rounds) */
  float *amp_scratch[2];    /* amp: the rounded copies of an input and an incoming gradient (the largest layer's) */
  int gemm_rounds;          /* amp: the native GEMMs round this layer's weights and input as they pack them, so
                             * neither is rounded beforehand (ops->gemm_operands, dt_amp_native_gemm) */
  float loss_weight;   /* each sample's weight in the loss being differentiated (1/batch for a mean) */
  int grads_unset;     /* backward: the layer's gradients are deferred zeros (dt_model_ctx_zero_grad_deferred) holding
                        * stale values, to be written, not added to (set only for kinds with ops->assigns_grads) */
  dt_row_set *rows[DT_LAYER_MAX_TENSORS]; /* row tables: the touched rows of tensor k; else NULL */
  dt_grads_final *final; /* backward, a layer run alone: where it announces its parameter gradients early, or NULL */
} dt_layer_io;

/* In backward: the layer's parameter gradients (those not announced as pieces) are final and will not be touched
 * again in this backward. A kind that computes them before dinp (Linear) says so then, so data-parallel training
 * starts reducing them while dinp is computed (with io->final->late it computes dinp first); the executor
 * announces every other layer's after its backward. */
static inline void dt_layer_grads_final(const dt_layer_io *io) {
  dt_grads_final *f = io->final;
  if (!f || f->done) return;
  f->done = 1;
  if (f->fn) f->fn(f->user, f->offset + f->announced, f->count - f->announced);
}
/* In backward: the next n elements of the layer's gradient block (a piece of io->final->piece elements, the last
 * maybe shorter) are final; dt_layer_grads_final then announces the rest. */
static inline void dt_layer_grads_piece(const dt_layer_io *io, size_t n) {
  dt_grads_final *f = io->final;
  if (!f || f->done || !n) return;
  if (f->fn) f->fn(f->user, f->offset + f->announced, n);
  f->announced += n;
}

/* A layer kind. infer runs at add time: reads l->in_*, sets l->out_*, declares
 * tensors (dt_layer_declare); a bad input shape is DT_SHAPE_MISMATCH naming
 * the layer and the shapes. forward writes out (batch, out_numel) from in;
 * backward writes dinp (= ; NULL to skip) and ACCUMULATES parameter gradients (or writes them: assigns_grads). */
typedef struct dt_layer_ops {
  const char *kind; /* "Conv2d", as torchsummary prints it */
  dt_status (*infer)(dt_layer *l);
  size_t (*ws_bytes)(const dt_layer *l, int max_batch);
  dt_status (*forward)(const dt_layer *l, const dt_layer_io *io, const float *in, float *out);
  void (*backward)(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out, const float *dout,
                   float *dinp);
  int backward_needs_train_forward; /* 1: backward is defined only after a training-mode forward */
  int is_view; /* 1: the output is the input's floats as they are (Flatten): the executor aliases the two
                * activations and skips forward, and backward unless it is the lowest layer run */
  int forward_view; /* 1: the output is the input's floats as they are (a residual begin), but backward does
                     * work of its own: the executor aliases the two activations and skips forward only */
  const char *(*label)(const dt_layer *l); /* optional: the kind as the summary prints it ("ReLU") */
  int gemm_operands; /* 1: under amp the weights and the input reach only dt_lowp_gemm, and biases only through
                      * dt_linear_forward (which rounds them): where the GEMMs are native and round as they pack,
                      * the executor rounds neither beforehand (a pass over each saved; the same bits, but for f32
                      * subnormals, which the hardware conversion flushes to zero where rounding makes the largest
                      * of them 2^-126) */
  int assigns_grads; /* 1: backward writes every parameter gradient of the layer when io->grads_unset (as PyTorch's
                      * first backward after zero_grad(set_to_none=True) assigns .grad): the executor then skips
                      * clearing the block first, and its GEMMs skip reading it; else it clears it */
  int grads_in_rows; /* 1: backward can announce its first tensor's gradient in pieces of whole rows (its first
                      * dimension), front to back, as each is final (io->final->piece, dt_layer_grads_piece) */
} dt_layer_ops;

struct dt_layer {
  const dt_layer_ops *ops;
  void *priv; /* kind-specific hyper-parameters (a flat struct, freed with dt_free) */
  char name[DT_LAYER_NAME_MAX];
  int index;   /* position in the model */
  int partner; /* residual: begin -> end, end -> begin (or its shortcut), shortcut -> begin; -1 otherwise */
  dt_dtype in_dtype;     /* f32, or i32 for the first layer of a model over index inputs */
  int in_ndim, out_ndim; /* per sample */
  int64_t in_shape[DT_SAMPLE_MAX_DIMS], out_shape[DT_SAMPLE_MAX_DIMS];
  size_t in_numel, out_numel;
  int n_tensors;
  dt_layer_tensor t[DT_LAYER_MAX_TENSORS];
  size_t n_params, n_buffers, n_counters; /* elements per arena */
  size_t param_off, buffer_off, counter_off; /* the layer's block in each arena (set by build) */
  size_t grad_piece; /* > 0: announce the first tensor's gradient in pieces of this many elements (whole rows) where
                      * a gradient-ready hook listens (dt_model_set_grad_pieces) */
};

/* Fills s (off and sq_off: batch + 1 each) from the mask row of the i32 input x (rows x L per sample);
 * DT_INVALID_ARGUMENT naming the sample when a mask is not 1s then 0s, or has no 1. (seq_layout.c) */
dt_status dt_seq_layout_fill(dt_seq_layout *s, const int32_t *x, int batch, int rows, int L, int mask_row);

/* Elements of a layer's input or output activation in this call: a per-sample (L, X) activation of packed
 * sequences holds tokens * X; anything else batch * numel. */
static inline size_t dt_layer_act_elems(int ndim, const int64_t *shape, size_t numel, const dt_layer_io *io) {
  if (io->seq && ndim == 2) return (size_t)io->seq->tokens * (size_t)shape[1];
  return (size_t)io->batch * numel;
}
static inline size_t dt_layer_in_elems(const dt_layer *l, const dt_layer_io *io) {
  return dt_layer_act_elems(l->in_ndim, l->in_shape, l->in_numel, io);
}
static inline size_t dt_layer_out_elems(const dt_layer *l, const dt_layer_io *io) {
  return dt_layer_act_elems(l->out_ndim, l->out_shape, l->out_numel, io);
}
/* Rows of a (.., X) activation: its elements / X. */
static inline int dt_layer_rows(const dt_layer *l, const dt_layer_io *io) {
  return (int)(dt_layer_in_elems(l, io) / (size_t)l->in_shape[l->in_ndim - 1]);
}

/* Declares a tensor "<layer name>.<suffix>" of the layer (state_dict order = call order). */
dt_status dt_layer_declare(dt_layer *l, const char *suffix, dt_tensor_place place, dt_init_kind init, int fan_in,
                           int ndim, const int64_t *shape);
/* The same with an init value (DT_INIT_NORMAL's std, DT_INIT_CONST's value). */
dt_status dt_layer_declare_init(dt_layer *l, const char *suffix, dt_tensor_place place, dt_init_kind init, float value,
                                int ndim, const int64_t *shape);
/* A (rows, width) parameter read by row (an embedding table), initialised N(0, std^2). */
dt_status dt_layer_declare_rows(dt_layer *l, const char *suffix, int64_t rows, int64_t width, float std);
/* Changes how build initialises the declared tensor `name` (before dt_model_build): a zoo model's own
 * scheme (torchvision's ResNet). DT_NOT_FOUND for an unknown name. */
dt_status dt_model_set_init(dt_model *m, const char *name, dt_init_kind init, float value);
/* "(32, 28, 28)" of a per-sample shape into buf. */
const char *dt_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);
/* Appends a layer of kind ops (taking ownership of priv, a dt_alloc'd struct or NULL). */
dt_status dt_model_add_layer(dt_model *m, const dt_layer_ops *ops, const char *name, void *priv);
/* A dt_alloc'd zeroed block of `bytes` for a layer's hyper-parameters. */
dt_status dt_layer_priv_new(size_t bytes, const char *kind, void **out);

/* The priv of a residual end: the shape its input must have (the begin's input, or after a shortcut the
 * branch output); of a residual shortcut: the begin's input shape, its output. */
typedef struct residual_end_priv {
  int ndim;
  int64_t shape[DT_SAMPLE_MAX_DIMS];
  int after_shortcut; /* end: 1 when a skip path precedes it */
} residual_end_priv;

/* The layer kinds (one file each). */
extern const dt_layer_ops dt_linear_ops;
extern const dt_layer_ops dt_conv2d_ops;
extern const dt_layer_ops dt_batchnorm2d_ops;
extern const dt_layer_ops dt_maxpool2d_ops;
extern const dt_layer_ops dt_avgpool2d_ops;
extern const dt_layer_ops dt_adaptive_avgpool2d_ops;
extern const dt_layer_ops dt_activation_ops;
extern const dt_layer_ops dt_dropout_ops;
extern const dt_layer_ops dt_flatten_ops;
extern const dt_layer_ops dt_scale_ops;
extern const dt_layer_ops dt_residual_begin_ops;
extern const dt_layer_ops dt_residual_end_ops;
extern const dt_layer_ops dt_residual_shortcut_ops;
extern const dt_layer_ops dt_embeddings_ops;
extern const dt_layer_ops dt_mf_ops;
extern const dt_layer_ops dt_layernorm_ops;
extern const dt_layer_ops dt_self_attention_ops;
extern const dt_layer_ops dt_bert_embeddings_ops;
extern const dt_layer_ops dt_first_token_ops;

/* Index-reading layers (embeddings.c): the input is (n,) i32 indices; column
 * col of a batch lies in [0, rows) (DT_INVALID_ARGUMENT naming the sample and
 * `what`); grads of the looked-up rows += coef * row (an L2 term's gradient). */
dt_status dt_layer_check_index_input(const dt_layer *l, int n);
dt_status dt_layer_check_indices(const dt_layer *l, const int32_t *x, int n, int col, int64_t rows, int batch,
                                 const char *what);
void dt_layer_rows_l2(float *grads, const float *table, int width, const int32_t *idx, size_t stride, int B, float coef);

/* Layers of a model, for tools and tests. */
int dt_model_num_layers(const dt_model *m);
const dt_layer *dt_model_layer(const dt_model *m, int i);

#endif

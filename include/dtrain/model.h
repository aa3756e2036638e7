/* dt_model: layers built one by one over a flat parameter arena, explicit forward/backward. */
#ifndef DTRAIN_MODEL_H
#define DTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain/status.h"
#include "dtrain/task.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_model dt_model;

typedef enum dt_activation {
  DT_RELU,
  DT_GELU,      /* exact erf form */
  DT_GELU_TANH, /* tanh approximation */
  DT_TANH,
  DT_SIGMOID,
} dt_activation;

/* ---- building ------------------------------------------------------------ */
/* A new, empty model whose input samples have shape sample_shape (e.g. {1, 28, 28}
 * for images as (C, H, W), or {784} for vectors). The caller owns *out. */
dt_status dt_model_new(int ndim, const int64_t *sample_shape, dt_model **out);
void dt_model_free(dt_model *m); /* accepts NULL */
/* Samples of index inputs (DT_I32: user and item ids, tokens) instead of f32;
 * call before adding layers (the first one must read indices: an embedding). */
dt_status dt_model_set_input_dtype(dt_model *m, dt_dtype dtype);
dt_dtype dt_model_input_dtype(const dt_model *m);

/* Each add appends a layer after the current last one. `name` is the module path
 * of the layer as in PyTorch ("layer1.0", "fc1"); its tensors are "<name>.weight",
 * "<name>.bias", ... Shapes are checked against the previous layer's output. */
dt_status dt_model_add_linear(dt_model *m, const char *name, int out_features, int bias);
dt_status dt_model_add_conv2d(dt_model *m, const char *name, int out_channels, int kernel, int stride, int padding,
                              int bias);
/* PyTorch defaults: eps 1e-5, momentum 0.1; buffers running_mean, running_var, num_batches_tracked. */
dt_status dt_model_add_batchnorm2d(dt_model *m, const char *name, float eps, float momentum);
dt_status dt_model_add_maxpool2d(dt_model *m, const char *name, int kernel, int stride, int padding);
dt_status dt_model_add_avgpool2d(dt_model *m, const char *name, int kernel, int stride, int padding);
/* AdaptiveAvgPool2d((size, size)): any (C, H, W) -> (C, size, size); size 1 is a global average pool. */
dt_status dt_model_add_adaptive_avgpool2d(dt_model *m, const char *name, int output_size);
dt_status dt_model_add_activation(dt_model *m, const char *name, dt_activation act);
dt_status dt_model_add_dropout(dt_model *m, const char *name, float p);
dt_status dt_model_add_flatten(dt_model *m, const char *name);
/* y = factor * x, a fixed non-zero factor (no parameter). */
dt_status dt_model_add_scale(dt_model *m, const char *name, float factor);
/* Embeddings of an index input (n,): column k looks up row x[k] of table k
 * (rows[k], dim), "<names[k]>.weight" (torch.nn.Embedding, initialised
 * N(0, std^2)); the output (n * dim,) is the n rows side by side. l2 > 0 adds
 * l2 * (the sample's loss weight) * |row|^2 per lookup to the loss (its
 * gradient only: the reported loss is the task's). */
dt_status dt_model_add_embeddings(dt_model *m, const char *name, int n, const char *const *names, const int64_t *rows,
                                  int dim, float std, float l2);
/* Biased matrix factorisation of an index input (user, item): out =
 * global_bias + user_bias[u] + item_bias[i] + <user_factors[u], item_factors[i]>,
 * tensors "user_factors.weight" (users, factors), "item_factors.weight",
 * "user_bias.weight" (users, 1), "item_bias.weight" (items, 1), "global_bias" (1)
 * initialised to `mean`; factors N(0, std^2), biases 0; l2 as for embeddings
 * on the factor rows. */
dt_status dt_model_add_mf(dt_model *m, const char *name, int64_t users, int64_t items, int factors, float std,
                          float mean, float l2);
/* Sequences (L, H) per sample (the text models). Linear applies to the last dimension as torch's does. */
/* Packs sequences (call before adding layers, after dt_model_set_input_dtype(DT_I32)): the input is (rows, L)
 * per sample and row mask_row its attention mask, 1s for the tokens then 0s for the padding. Every (L, X)
 * activation then holds only the batch's tokens, back to back, so no layer computes on padding; a model's
 * outputs and gradients are those of the padded computation with the padding masked out of attention. */
dt_status dt_model_set_sequence_input(dt_model *m, int rows, int mask_row);
/* LayerNorm over the last dimension: tensors "weight" (ones) and "bias" (zeros), as torch.nn.LayerNorm. */
dt_status dt_model_add_layernorm(dt_model *m, const char *name, float eps);
/* Hugging Face's BertSelfAttention on (L, H): "query", "key", "value" Linear(H, H) (weight and bias each), `heads`
 * heads, dropout p on the probabilities. The padding mask is row mask_row of the model's i32 input, which has
 * input_rows rows of L per sample (the bert input: 3 rows, mask row 2); mask_row -1: every key counts. */
dt_status dt_model_add_self_attention(dt_model *m, const char *name, int heads, float p, int input_rows,
                                      int mask_row);
/* The first position of a sequence: (L, H) -> (H) (BertPooler's hidden_states[:, 0]). */
dt_status dt_model_add_first_token(dt_model *m, const char *name);
/* BertEmbeddings' sum of word, position and token-type embeddings of the bert input (3, L) -> (L, hidden):
 * "word_embeddings.weight" (vocab, hidden; a row table whose pad_id row starts and stays zero, as
 * nn.Embedding(padding_idx)), "position_embeddings.weight" (max_pos, hidden), "token_type_embeddings.weight"
 * (type_vocab, hidden), all N(0, std^2). */
dt_status dt_model_add_bert_embeddings(dt_model *m, const char *name, int64_t vocab, int hidden, int64_t max_pos,
                                       int64_t type_vocab, int pad_id, float std);

/* Layers added between begin and end form a residual branch:
 * out = in + branch(in); the branch must keep the shape. Branches may nest.
 * With dt_model_residual_shortcut between them, the layers after it form a
 * skip path that reads the block's input: out = branch(in) + skip(in), the
 * two of one shape (torchvision's downsample: a 1x1 strided Conv2d + BN). */
dt_status dt_model_begin_residual(dt_model *m, const char *name);
dt_status dt_model_residual_shortcut(dt_model *m);
dt_status dt_model_end_residual(dt_model *m);

/* Finishes building: lays out the arenas, allocates activations for batches of up
 * to max_batch samples, and initialises parameters like PyTorch's defaults
 * (kaiming_uniform a=sqrt(5) weights, uniform(+-1/sqrt(fan_in)) biases, BN weight 1,
 * bias 0, running_var 1) from a Philox stream of `seed`. */
dt_status dt_model_build(dt_model *m, int max_batch, uint64_t seed);

/* ---- running --------------------------------------------------------------- */
/* Training mode (batch statistics, dropout on) or evaluation mode. Default: training. */
void dt_model_set_training(dt_model *m, int training);
/* Dropout masks come from Philox(seed, stream, step): set the stream (e.g. the
 * rank) so workers draw different masks; the step advances with every training forward. */
void dt_model_set_rng_stream(dt_model *m, uint64_t stream);
/* The dropout step (training forwards so far); a snapshot saves it and a
 * resumed run sets it back, so masks continue where they stopped. */
uint64_t dt_model_rng_step(const dt_model *m);
void dt_model_set_rng_step(dt_model *m, uint64_t step);

/* x (batch, sample_shape...) of the model's input dtype (f32, or i32 indices) -> *out (batch, dt_model_output_size), owned by the
 * model, valid until the next forward. batch in 1..max_batch. */
dt_status dt_model_forward(dt_model *m, const void *x, int batch, const float **out);
/* Back-propagates dout (batch, output_size) through the last training forward;
 * ACCUMULATES parameter gradients into the gradient arena (see dt_model_zero_grad). */
dt_status dt_model_backward(dt_model *m, const float *dout);
void dt_model_zero_grad(dt_model *m);
/* dt_model_ctx_zero_grad_deferred on the model's own context: the next backward writes the gradients. */
void dt_model_zero_grad_deferred(dt_model *m);

/* Gradient-ready events: during backward, as soon as a layer's parameter gradients
 * are final, fn(user, offset, count) is called (on the thread running backward)
 * with the range of the gradient arena they occupy. The arena is laid out in
 * reverse layer order, so ranges arrive front to back: [0, a), [a, b), ... */
typedef void (*dt_grad_ready_fn)(void *user, size_t offset, size_t count);
void dt_model_on_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *user);
/* 1: a layer's gradients are announced only once its backward reads its parameters no more (a Linear layer then
 * computes its input gradient from W first, and announces dW after, in pieces too; otherwise dW comes first): for a
 * hook that changes the parameters, such as DDP's sharded update. 0 (the default): as early as they are final. */
void dt_model_set_ready_late(dt_model *m, int late);
/* Asks the layer holding trainable tensor `tensor` to announce its gradient (to the model's own hook) in pieces,
 * front to back, each as soon as it is final, before the rest of the layer's block: as many as pieces of
 * max_elems elements would make, of whole rows (its first dimension) as even as rows allow, the last maybe
 * shorter. A Linear weight computes its gradient a block of output rows at a time: the same sums, but a GEMM
 * library may order a cut product's sums otherwise (OpenBLAS's Haswell kernels do), so the last bits may change.
 * Returns the piece chosen (elements), or 0 where the tensor's kind cannot (it is then announced whole), where one
 * piece would hold it all, or for max_elems 0 (pieces off). */
size_t dt_model_set_grad_pieces(dt_model *m, int tensor, size_t max_elems);

/* ---- arenas and named tensors ------------------------------------------------ */
/* The flat arenas (valid after build): parameters and their gradients share one
 * layout; buffers (BN running statistics) are f32 and not trained. */
float *dt_model_params(dt_model *m, size_t *count);
float *dt_model_grads(dt_model *m, size_t *count);
float *dt_model_buffers(dt_model *m, size_t *count);
/* Moves the gradient arena of the model's own context into mem (n_params
 * floats, 64-byte aligned, e.g. dt_group_share's memory), the gradients and
 * deferred zeros as they are. The model uses mem from then on and hands it to
 * release(mem, bytes) when it is freed or given other memory; what
 * dt_model_grads returned before is invalid. */
dt_status dt_model_set_grad_memory(dt_model *m, float *mem, void (*release)(void *mem, size_t bytes));
/* The same for the parameter arena (e.g. into dt_group_share_common's memory, one copy for the ranks of a host),
 * the values copied into mem (copy 1) or found there (copy 0: another process wrote them); what dt_model_params
 * and dt_model_tensor_data returned before is invalid. */
dt_status dt_model_set_param_memory(dt_model *m, float *mem, int copy, void (*release)(void *mem, size_t bytes));
size_t dt_model_num_params(const dt_model *m);
/* Bytes of the activations of the model's own context: the input and every layer's own output (a view shares its
 * input's) for the batch it was built for (0 before build), what a training step writes and reads besides the
 * parameters. */
size_t dt_model_activation_bytes(const dt_model *m);
int dt_model_output_size(const dt_model *m);
const int64_t *dt_model_input_shape(const dt_model *m, int *ndim);

/* Named tensors in PyTorch state_dict order (per module: parameters, then buffers). */
typedef struct dt_tensor_info {
  const char *name;   /* "layer1.1.running_mean" */
  dt_dtype dtype;     /* f32, or i64 for num_batches_tracked */
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int trainable;      /* 1: in the parameter arena (has a gradient); 0: a buffer */
  size_t offset;      /* element offset in its arena (params or buffers); 0 for i64 */
} dt_tensor_info;
int dt_model_num_tensors(const dt_model *m);
dt_status dt_model_tensor_info(const dt_model *m, int i, dt_tensor_info *out);
/* Pointer to tensor i's data (float* for f32, int64_t* for i64); NULL if i is out of range. */
void *dt_model_tensor_data(dt_model *m, int i);
/* DT_NOT_FOUND if no tensor has that name. */
dt_status dt_model_find_tensor(const dt_model *m, const char *name, int *index);

/* A layer table like torchsummary (name, kind, output shape, parameters). */
void dt_model_print_summary(const dt_model *m, FILE *f);

/* ---- model zoo ---------------------------------------------------------------- */
typedef struct dt_zoo_config {
  int ndim;                 /* dimensions of one input sample: 3 for images (C, H, W), 1 for vectors */
  int64_t input_shape[4];   /* e.g. {1, 28, 28} or {20} */
  int outputs;              /* from the data: classes, labels or regression targets */
  dt_task_kind task;        /* the data's task: the model must support it */
  const int *hidden;        /* mlp: hidden widths (NULL: the model's default) */
  int n_hidden;
  float dropout;            /* < 0: the model's default; 0 disables dropout */
  /* Index inputs (dtype i32): the vocabulary of each column (users, items); 0 columns for f32 inputs. */
  int n_index;
  const int64_t *index_size;
  int factors;              /* mf, ncf: embedding width (0: the model's default) */
  float target_mean;        /* mf: the global bias's starting value (the training ratings' mean) */
  float l2;                 /* mf, ncf: L2 on the looked-up embedding rows (0: none) */
  int zero_init_residual;   /* resnets: each block's last BatchNorm starts with weight 0 (torchvision's flag) */
  int width;                /* resnet9 and the CIFAR resnets: channels of the first stage, doubled by each later
                             * stage (0: the model's own, 64 and 16) */
  /* bert: encoder layers, hidden size, heads, feed-forward size (0: the preset's); the input (3, L) and the
   * vocabulary size index_size[0] come from the data */
  int layers, hidden_size, heads, intermediate_size;
} dt_zoo_config;
/* Builds the layers of a registered model (not yet dt_model_build-ed).
 * DT_NOT_FOUND naming the known models for an unknown name; DT_USAGE naming
 * both sides when the model does not support the task or the input's rank. */
dt_status dt_model_zoo_new(const char *name, const dt_zoo_config *cfg, dt_model **out);
/* Calls fn for every registered model, with a one-line description. */
void dt_model_zoo_each(void (*fn)(const char *name, const char *doc, void *user), void *user);
/* 1 when the model has a width to choose (dt_zoo_config.width); 0 otherwise or for an unknown name. */
int dt_model_zoo_takes_width(const char *name);
/* The tasks a model supports, as "classification, regression" into buf; DT_NOT_FOUND for an unknown name. */
dt_status dt_model_zoo_tasks(const char *name, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif

/* SelfAttention: Hugging Face's BertSelfAttention. query/key/value Linear(H, H) on each position, A heads of
 * H/A, softmax(QK^T / sqrt(H/A)) over the keys the padding mask keeps, dropout on the probabilities, times V.
 * The mask is a row of the model's index input (the bert input (3, L): ids, token types, mask). */
#include "core/impl.h"
#include "nn/amp.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct attn_priv {
  int heads;
  float p;             /* dropout on the attention probabilities */
  int input_rows;      /* rows of the model's i32 input per sample */
  int mask_row;        /* the row holding the attention mask (1 keep, 0 padding); -1: no mask */
  int scratch_threads; /* backward scratch blocks of every context's workspace (the fewest sized) */
} attn_priv;

enum { Q_W, Q_B, K_W, K_B, V_W, V_B };

static dt_status attn_infer(dt_layer *l) {
  const attn_priv *p = l->priv;
  char s[96];
  if (l->in_ndim != 2 || l->in_shape[1] % p->heads != 0)
    return dt_error(DT_SHAPE_MISMATCH, "%s: SelfAttention expects (tokens, features) with features a multiple of %d "
                    "heads, got %s", l->name, p->heads, dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  l->out_ndim = 2;
  l->out_shape[0] = l->in_shape[0];
  l->out_shape[1] = l->in_shape[1];
  const int64_t H = l->in_shape[1], w[2] = {H, H};
  static const char *const names[] = {"query", "key", "value"};
  char suffix[32];
  for (int k = 0; k < 3; k++) {
    snprintf(suffix, sizeof suffix, "%s.weight", names[k]);
    DT_CHECK(dt_layer_declare(l, suffix, DT_PLACE_PARAM, DT_INIT_FAN_IN, (int)H, 2, w));
    snprintf(suffix, sizeof suffix, "%s.bias", names[k]);
    DT_CHECK(dt_layer_declare(l, suffix, DT_PLACE_PARAM, DT_INIT_FAN_IN, (int)H, 1, &H));
  }
  return DT_OK;
}

/* The workspace's parts at batch B: Q K V and their gradients (B, L, H) each, the probabilities P
 * (B, A, L, L at most) and the per-thread scratch (last: its size follows the thread count), after a header
 * holding the forward's dropout: its mask on P is drawn again in backward rather than kept, and backward's own
 * io->stream is the next step's. */
#define HEADER_FLOATS 16 /* 64 bytes: the forward's dt_attention_dropout */
_Static_assert(sizeof(dt_attention_dropout) <= HEADER_FLOATS * sizeof(float), "the header holds the dropout");
typedef struct attn_ws {
  dt_attention_dropout *drop;
  float *q, *k, *v, *dq, *dk, *dv, *prob, *scratch;
} attn_ws;

static size_t seq_floats(const dt_layer *l, int B) { return (size_t)B * l->in_numel; }
static size_t prob_floats(const dt_layer *l, int B) {
  const size_t L = (size_t)l->in_shape[0];
  return (size_t)B * (size_t)((const attn_priv *)l->priv)->heads * L * L;
}

static attn_ws ws_parts(const dt_layer *l, void *ws, int B) {
  attn_ws w;
  const size_t s = seq_floats(l, B);
  w.drop = ws;
  float *f = (float *)ws + HEADER_FLOATS;
  w.q = f, w.k = f + s, w.v = f + 2 * s, w.dq = f + 3 * s, w.dk = f + 4 * s, w.dv = f + 5 * s;
  w.prob = f + 6 * s;
  w.scratch = w.prob + prob_floats(l, B);
  return w;
}

static size_t attn_ws_bytes(const dt_layer *l, int max_batch) {
  attn_priv *p = l->priv;
  const int t = dt_get_threads();
  if (p->scratch_threads == 0 || t < p->scratch_threads) p->scratch_threads = t;
  return (HEADER_FLOATS + 6 * seq_floats(l, max_batch) + prob_floats(l, max_batch) +
          dt_attention_scratch_floats((int)l->in_shape[0], t)) * sizeof(float);
}

static const float *tensor(const dt_layer *l, const float *block, int k) { return block + l->t[k].off; }

/* The batch's geometry: packed sequences, or L rows a sample with the mask row of the model's input. */
static dt_attention_geom geom_of(const dt_layer *l, const dt_layer_io *io) {
  const attn_priv *p = l->priv;
  const int L = (int)l->in_shape[0];
  dt_attention_geom g = {.B = io->batch, .L = L, .H = (int)l->in_shape[1], .A = p->heads, .amp = io->amp};
  if (io->seq) {
    g.off = io->seq->off;
    g.sq_off = io->seq->sq_off;
  } else if (p->mask_row >= 0) {
    g.mask = (const int32_t *)io->model_in + (size_t)p->mask_row * L;
    g.mask_stride = (size_t)p->input_rows * L;
  }
  return g;
}

/* The dropout of a forward: the layer's p in training, none in evaluation; the stream is the call's. */
static dt_attention_dropout dropout_of(const dt_layer *l, const dt_layer_io *io) {
  const float p = ((const attn_priv *)l->priv)->p;
  return (dt_attention_dropout){.p = io->training ? p : 0.0f, .seed = io->seed, .stream = io->stream};
}


static dt_status attn_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const attn_priv *p = l->priv;
  const int H = (int)l->in_shape[1], N = dt_layer_rows(l, io);
  const size_t n = (size_t)N * H;
  const dt_attention_geom g = geom_of(l, io);
  attn_ws w = ws_parts(l, io->ws, io->batch);
  const float *x = dt_amp_operand(io, 0, in, n), *pw = dt_amp_weights(io);
  dt_linear_forward(io->amp, w.q, x, tensor(l, pw, Q_W), tensor(l, pw, Q_B), N, H, H);
  dt_linear_forward(io->amp, w.k, x, tensor(l, pw, K_W), tensor(l, pw, K_B), N, H, H);
  dt_linear_forward(io->amp, w.v, x, tensor(l, pw, V_W), tensor(l, pw, V_B), N, H, H); /* each rounded there */
  *w.drop = dropout_of(l, io);
  dt_attention_forward(out, w.prob, w.scratch, p->scratch_threads, w.q, w.k, w.v, w.drop, &g);
  return DT_OK;
}

/* One projection's share: dinp (+)= dY W, dW += dY^T in, db += sum dY (W and in as the forward read them; = for
 * both where the gradients are deferred zeros). */
static void proj_backward(const dt_layer *l, const dt_layer_io *io, int wk, const float *dy, const float *in,
                          float *dinp, int accumulate, int N, int H) {
  const float *w = tensor(l, dt_amp_weights(io), wk);
  if (dinp) dt_lowp_gemm(io->amp, 0, 0, N, H, H, 1.0f, dy, H, w, H, accumulate ? 1.0f : 0.0f, dinp, H);
  dt_linear_backward(io->amp, NULL, io->grads + l->t[wk].off, io->grads + l->t[wk + 1].off, dy, in, NULL, N, H, H,
                     io->grads_unset);
}

static void attn_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                          const float *dout, float *dinp) {
  const attn_priv *p = l->priv;
  const int H = (int)l->in_shape[1], N = dt_layer_rows(l, io);
  const size_t n = (size_t)N * H;
  const dt_attention_geom g = geom_of(l, io);
  attn_ws w = ws_parts(l, io->ws, io->batch);
  const float *dctx = dt_amp_operand(io, 1, dout, n);
  dt_attention_backward(w.dq, w.dk, w.dv, w.scratch, p->scratch_threads, dctx, w.q, w.k, w.v, w.prob, w.drop, &g);
  dt_amp_result(io, w.dq, n);
  dt_amp_result(io, w.dk, n);
  dt_amp_result(io, w.dv, n);
  const float *x = dt_amp_operand(io, 0, in, n);
  proj_backward(l, io, Q_W, w.dq, x, dinp, 0, N, H);
  proj_backward(l, io, K_W, w.dk, x, dinp, 1, N, H);
  proj_backward(l, io, V_W, w.dv, x, dinp, 1, N, H);
  dt_amp_result(io, dinp, n);
}

const dt_layer_ops dt_self_attention_ops = {.kind = "SelfAttention",
                                            .infer = attn_infer,
                                            .ws_bytes = attn_ws_bytes,
                                            .forward = attn_forward,
                                            .backward = attn_backward,
                                            .gemm_operands = 1,
                                            .assigns_grads = 1, /* each projection's dW and db: proj_backward */
                                            .backward_needs_train_forward = 0};

dt_status dt_model_add_self_attention(dt_model *m, const char *name, int heads, float p, int input_rows,
                                      int mask_row) {
  if (heads < 1 || !(p >= 0.0f && p < 1.0f) || mask_row >= input_rows)
    return dt_error(DT_INVALID_ARGUMENT, "%s: SelfAttention with %d heads, dropout %g, mask row %d of %d: expected "
                    ">= 1 heads, dropout in [0, 1), a mask row inside the input", name ? name : "?", heads, (double)p,
                    mask_row, input_rows);
  attn_priv *a = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *a, "SelfAttention", (void **)&a));
  a->heads = heads;
  a->p = p;
  a->input_rows = input_rows;
  a->mask_row = mask_row;
  return dt_model_add_layer(m, &dt_self_attention_ops, name, a);
}

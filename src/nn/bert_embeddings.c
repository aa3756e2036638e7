/* BertEmbeddings' lookups: word + position + token type embeddings of an i32 input (3, L) per sample (row 0 the
 * token ids, row 1 the token type ids, row 2 the attention mask, which this layer does not read), out (L, H).
 * Hugging Face's LayerNorm and dropout after the sum are the next two layers. The word table is a row table
 * whose padding row (padding_idx) starts at zero and never gets a gradient, as nn.Embedding(padding_idx). */
#include <string.h>

#include "core/impl.h"
#include "nn/layer.h"

#define ROWS 3 /* ids, token types, mask */
#define COLS 16 /* columns of a backward block: one cache line of each table row */

typedef struct bert_emb_priv {
  int64_t vocab, max_pos, type_vocab;
  int hidden, pad_id;
  float std;
} bert_emb_priv;

enum { WORD, POS, TYPE };

static dt_status bert_emb_infer(dt_layer *l) {
  const bert_emb_priv *p = l->priv;
  char s[96];
  if (l->in_dtype != DT_I32 || l->in_ndim != 2 || l->in_shape[0] != ROWS || l->in_shape[1] > p->max_pos)
    return dt_error(DT_SHAPE_MISMATCH, "%s: BertEmbeddings reads i32 (3, L) per sample (ids, token types, mask) with "
                    "L <= %lld positions, got %s %s", l->name, (long long)p->max_pos,
                    l->in_dtype == DT_I32 ? "i32" : "f32", dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  l->out_ndim = 2;
  l->out_shape[0] = l->in_shape[1];
  l->out_shape[1] = p->hidden;
  DT_CHECK(dt_layer_declare_rows(l, "word_embeddings.weight", p->vocab, p->hidden, p->std));
  l->t[WORD].zero_row = p->pad_id;
  const int64_t pos[2] = {p->max_pos, p->hidden}, type[2] = {p->type_vocab, p->hidden};
  DT_CHECK(dt_layer_declare_init(l, "position_embeddings.weight", DT_PLACE_PARAM, DT_INIT_NORMAL, p->std, 2, pos));
  return dt_layer_declare_init(l, "token_type_embeddings.weight", DT_PLACE_PARAM, DT_INIT_NORMAL, p->std, 2, type);
}

/* Every id in [0, vocab) and type in [0, type_vocab); DT_INVALID_ARGUMENT naming sample and position. */
static dt_status check_inputs(const dt_layer *l, const int32_t *x, int B, int L) {
  const bert_emb_priv *p = l->priv;
  for (int b = 0; b < B; b++) {
    const int32_t *ids = x + (size_t)b * ROWS * L, *types = ids + L;
    for (int t = 0; t < L; t++) {
      if (ids[t] < 0 || ids[t] >= p->vocab)
        return dt_error(DT_INVALID_ARGUMENT, "%s: token id %d at position %d of sample %d is outside the vocabulary "
                        "[0, %lld)", l->name, ids[t], t, b, (long long)p->vocab);
      if (types[t] < 0 || types[t] >= p->type_vocab)
        return dt_error(DT_INVALID_ARGUMENT, "%s: token type %d at position %d of sample %d is outside [0, %lld)",
                        l->name, types[t], t, b, (long long)p->type_vocab);
    }
  }
  return DT_OK;
}

/* The output row of position t of sample b; -1 for padding that packed sequences leave out. */
static int64_t out_row(const dt_layer_io *io, int b, int t, int L) {
  if (!io->seq) return (int64_t)b * L + t;
  return t < io->seq->off[b + 1] - io->seq->off[b] ? (int64_t)io->seq->off[b] + t : -1;
}

static dt_status bert_emb_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const bert_emb_priv *p = l->priv;
  const int B = io->batch, L = (int)l->in_shape[1], H = p->hidden;
  const int32_t *x = (const int32_t *)in;
  DT_CHECK(check_inputs(l, x, B, L));
  const float *word = io->params + l->t[WORD].off, *pos = io->params + l->t[POS].off,
              *type = io->params + l->t[TYPE].off;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * L; bt++) {
    const int b = bt / L, t = bt % L;
    const int64_t r = out_row(io, b, t, L);
    if (r < 0) continue;
    const int32_t *ids = x + (size_t)b * ROWS * L;
    const float *w = word + (size_t)ids[t] * H, *ps = pos + (size_t)t * H, *ty = type + (size_t)ids[L + t] * H;
    float *o = out + (size_t)r * H;
    for (int j = 0; j < H; j++) o[j] = w[j] + ps[j] + ty[j];
  }
  return DT_OK;
}

/* Scatter-adds of the output gradient into the three tables. Each thread owns blocks of columns and walks
 * every position in order, so the sums' order (and bits) do not depend on the thread count. */
static void bert_emb_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                              const float *dout, float *dinp) {
  const bert_emb_priv *p = l->priv;
  const int B = io->batch, L = (int)l->in_shape[1], H = p->hidden;
  const int32_t *x = (const int32_t *)in;
  float *word = io->grads + l->t[WORD].off, *pos = io->grads + l->t[POS].off, *type = io->grads + l->t[TYPE].off;
  dt_row_set *rows = io->rows[WORD];
  for (int b = 0; b < B && rows; b++)
    for (int t = 0; t < L; t++) {
      const int32_t id = x[(size_t)b * ROWS * L + (size_t)t];
      if (id != p->pad_id) dt_row_set_touch(rows, id);
      else rows->refs++; /* a lookup all the same: every rank counts B * L (the DDP exchange's bound) */
    }
  const int nblk = (H + COLS - 1) / COLS;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblk; blk++) {
    const int j0 = blk * COLS, j1 = j0 + COLS < H ? j0 + COLS : H;
    for (int bt = 0; bt < B * L; bt++) {
      const int b = bt / L, t = bt % L;
      const int64_t r = out_row(io, b, t, L);
      if (r < 0) continue;
      const int32_t *ids = x + (size_t)b * ROWS * L;
      const float *g = dout + (size_t)r * H;
      float *w = ids[t] != p->pad_id ? word + (size_t)ids[t] * H : NULL;
      float *ps = pos + (size_t)t * H, *ty = type + (size_t)ids[L + t] * H;
      for (int j = j0; j < j1; j++) {
        if (w) w[j] += g[j];
        ps[j] += g[j];
        ty[j] += g[j];
      }
    }
  }
  if (dinp) memset(dinp, 0, (size_t)B * l->in_numel * sizeof(float)); /* indices have no gradient: zeros */
}

const dt_layer_ops dt_bert_embeddings_ops = {
    .kind = "BertEmbeddings", .infer = bert_emb_infer, .forward = bert_emb_forward, .backward = bert_emb_backward};

dt_status dt_model_add_bert_embeddings(dt_model *m, const char *name, int64_t vocab, int hidden, int64_t max_pos,
                                       int64_t type_vocab, int pad_id, float std) {
  if (vocab < 1 || vocab > INT32_MAX || hidden < 1 || max_pos < 1 || type_vocab < 1 || pad_id < 0 || pad_id >= vocab)
    return dt_error(DT_INVALID_ARGUMENT, "%s: BertEmbeddings vocab %lld, hidden %d, positions %lld, types %lld, "
                    "padding id %d: expected sizes >= 1 and the padding id inside the vocabulary", name ? name : "?",
                    (long long)vocab, hidden, (long long)max_pos, (long long)type_vocab, pad_id);
  bert_emb_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "BertEmbeddings", (void **)&p));
  p->vocab = vocab, p->hidden = hidden, p->max_pos = max_pos, p->type_vocab = type_vocab;
  p->pad_id = pad_id, p->std = std;
  return dt_model_add_layer(m, &dt_bert_embeddings_ops, name, p);
}

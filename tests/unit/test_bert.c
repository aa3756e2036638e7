/* The bert layers and model: parameter counts as Hugging Face's, finite differences through LayerNorm,
 * self-attention, Linear on sequences and FirstToken, padding that changes nothing, and clear errors. */
#include <string.h>

#include "core/impl.h"
#include "dtrain/loss.h"
#include "deferred_grads.h"
#include "harness.h"
#include "model_grad_check.h"

static dt_status bert(const char *name, int64_t vocab, int L, int outputs, int hidden, int heads, dt_model **out) {
  dt_zoo_config cfg = {.ndim = 2, .input_shape = {3, L}, .outputs = outputs, .dropout = -1.0f,
                       .task = DT_TASK_CLASSIFICATION, .n_index = 1, .index_size = &vocab, .hidden_size = hidden,
                       .heads = heads};
  return dt_model_zoo_new(name, &cfg, out);
}

/* sum(p.numel() for p in BertForSequenceClassification(BertConfig(vocab_size=30522, ...), num_labels=2)):
 * embeddings V*H + 512*H + 2*H + 2H, per layer 4(H^2 + H) + 2 * 2H + 2 * 4H^2 + 5H, pooler H^2 + H, classifier
 * 2H + 2. bert-base: 109,483,778 (the figure transformers prints for bert-base-uncased with 2 labels). */
TEST(parameter_counts_equal_hugging_face) {
  static const struct {
    const char *name;
    size_t params;
  } want[] = {{"bert", 109483778}, {"bert-mini", 11171074}, {"bert-tiny", 4386178}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    dt_model *m = NULL;
    ASSERT_OK(bert(want[i].name, 30522, 128, 2, 0, 0, &m));
    ASSERT_OK(dt_model_build(m, 1, 1));
    if (dt_model_num_params(m) != want[i].params)
      FAIL_("%s: %zu parameters, want %zu", want[i].name, dt_model_num_params(m), want[i].params);
    int idx;
    ASSERT_OK(dt_model_find_tensor(m, "bert.encoder.layer.1.attention.self.query.weight", &idx));
    ASSERT_OK(dt_model_find_tensor(m, "bert.encoder.layer.0.output.LayerNorm.bias", &idx));
    ASSERT_OK(dt_model_find_tensor(m, "classifier.weight", &idx));
    dt_model_free(m);
  }
}

enum { FD_B = 2, FD_L = 5, FD_H = 8, FD_CLASSES = 3 };
static const int32_t fd_labels[FD_B] = {2, 0};

/* An encoder layer on f32 input (L, H) (attention without a mask), then the pooler's path; attention dropout p. */
static dt_status fd_model(float p, dt_model **out) {
  dt_model *m = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_model_new(2, (int64_t[]){FD_L, FD_H}, &m));
  DT_CHECK_GOTO(dt_model_add_layernorm(m, "ln0", 1e-12f), st, fail);
  DT_CHECK_GOTO(dt_model_begin_residual(m, "res1"), st, fail);
  DT_CHECK_GOTO(dt_model_add_self_attention(m, "attn", 2, p, 0, -1), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "out", FD_H, 1), st, fail);
  DT_CHECK_GOTO(dt_model_end_residual(m), st, fail);
  DT_CHECK_GOTO(dt_model_add_layernorm(m, "ln1", 1e-5f), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "ff", 12, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "gelu", DT_GELU), st, fail);
  DT_CHECK_GOTO(dt_model_add_first_token(m, "first"), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "tanh", DT_TANH), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "classifier", FD_CLASSES, 1), st, fail);
  DT_CHECK_GOTO(dt_model_build(m, FD_B, 5), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}

/* Every forward draws the same dropout masks (step 0), so the loss is a function of the parameters. */
static dt_status fd_loss(dt_model *m, const float *x, float *loss, float *dlogits) {
  const float *y;
  dt_model_set_training(m, 1);
  dt_model_set_rng_step(m, 0);
  DT_CHECK(dt_model_forward(m, x, FD_B, &y));
  return dt_loss_cross_entropy(y, fd_labels, FD_B, FD_CLASSES, 0.0f, loss, dlogits);
}

/* Central differences at 8 entries of every tensor and of the input (test_model's tolerances). LayerNorm's
 * weights start at 1/0: they are moved off so their gradients are not a special case. */
static void fd_check(float drop, int *dt_test_failed_) {
  dt_model *m = NULL;
  ASSERT_OK(fd_model(drop, &m));
  float *p = dt_model_params(m, NULL);
  dt_rng r;
  dt_rng_init(&r, 3, 4);
  for (size_t i = 0; i < dt_model_num_params(m); i++) p[i] += dt_rng_uniform_range(&r, -0.3f, 0.3f);
  float x[FD_B * FD_L * FD_H], dlogits[FD_B * FD_CLASSES];
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = dt_rng_uniform_range(&r, -1, 1);
  grad_check gc = {.eps = 1e-3f, .per = 8, .watch = "attn.key.weight"};
  ASSERT_OK(grad_check_run(m, x, sizeof x / sizeof x[0], dlogits, fd_loss, &gc));
  if (gc.msg[0]) FAIL_("%s", gc.msg);
  ASSERT_EQ(gc.checked, 8 * (2 + 6 + 2 + 2 + 2 + 2 + 1)); /* ln0, attn q/k/v, out, ln1, ff, classifier; input */
  ASSERT(gc.watch_den > 1e-10);                           /* the keys do get a gradient */
  if (gc.rel_l2 > 5e-3) FAIL_("relative L2 error %.3g over %d entries", gc.rel_l2, gc.checked);
  dt_model_free(m);
}

TEST(encoder_layer_matches_finite_differences) { fd_check(0.0f, dt_test_failed_); }
/* The dropout mask on the probabilities is drawn again in backward, not stored: it must be the forward's. */
TEST(attention_dropout_matches_finite_differences) { fd_check(0.3f, dt_test_failed_); }

/* x (B, 3, L) of zeros: ids and a mask of 1s at sample 0's every position and the first `later` of the others. */
static void fill_ids(int32_t *x, int B, int L, int later) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < L; t++) {
      const int live = b == 0 || t < later;
      x[b * 3 * L + t] = live ? 2 + 3 * t + b : 0;
      x[b * 3 * L + 2 * L + t] = live;
    }
}

/* Sample 1 has 4 tokens of 8: whatever the padded positions hold, its logits stay the same (packed sequences
 * leave them out; test_bert_torch checks that this equals masking them in a padded computation). */
TEST(padding_changes_nothing) {
  enum { L = 8, B = 2 };
  dt_model *m = NULL;
  ASSERT_OK(bert("bert-tiny", 50, L, 2, 16, 2, &m));
  ASSERT_OK(dt_model_build(m, B, 9));
  dt_model_set_training(m, 0);
  int32_t x[B * 3 * L] = {0};
  fill_ids(x, B, L, 4);
  const float *y;
  float before[B * 2];
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  memcpy(before, y, sizeof before);
  for (int t = 4; t < L; t++) x[3 * L + t] = 40 + t, x[3 * L + L + t] = 1; /* other ids and types at the pads */
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  for (int k = 0; k < 2; k++) ASSERT(fabsf(y[2 + k] - before[2 + k]) <= 1e-6f * (1 + fabsf(before[2 + k])));
  x[3 * L + 2 * L + 5] = 1; /* a hole in the mask: padding must come last */
  ASSERT_STATUS(dt_model_forward(m, x, B, &y), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "sample 1: attention mask value 1 at position 5"), dt_last_error());
  x[3 * L + 2 * L + 4] = 1; /* one more token does change the logits */
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  ASSERT(fabsf(y[2] - before[2]) + fabsf(y[3] - before[3]) > 1e-6f);
  dt_model_free(m);
}

/* A deferred zero_grad gives an eager one's gradients (tests/deferred_grads.h) through attention (which assigns its
 * projections' gradients), LayerNorm, the embeddings' row tables and dense tensors, FirstToken and Linear, with
 * dropout in training mode; in f32 and bf16. */
TEST(deferred_zero_grad_gives_the_eager_gradients) {
  enum { L = 8, B = 2 };
  dt_model *m = NULL;
  ASSERT_OK(bert("bert-tiny", 50, L, 2, 16, 2, &m));
  ASSERT_OK(dt_model_build(m, B, 9));
  int32_t x[B * 3 * L] = {0};
  fill_ids(x, B, L, 5);
  const float dout[B * 2] = {0.3f, -0.3f, -0.2f, 0.2f};
  for (int k = 0; k < 2; k++) {
    const char *why = deferred_grads_differ(m, B, x, dout, k ? DT_AMP_BF16 : DT_AMP_OFF);
    ASSERT_MSG(why == NULL, why);
  }
  dt_model_free(m);
}

TEST(bad_shapes_and_ids_are_clear_errors) {
  dt_model *m = NULL;
  ASSERT_STATUS(bert("bert-mini", 100, 16, 2, 250, 4, &m), DT_USAGE); /* 250 is not a multiple of 4 heads */
  ASSERT(strstr(dt_last_error(), "--hidden-size 250") && strstr(dt_last_error(), "--heads 4"));
  ASSERT_STATUS(bert("bert-mini", 100, 513, 2, 0, 0, &m), DT_USAGE);
  ASSERT(strstr(dt_last_error(), "512"));
  dt_zoo_config f32 = {.ndim = 1, .input_shape = {20}, .outputs = 2, .dropout = -1.0f, .task = DT_TASK_CLASSIFICATION};
  ASSERT_STATUS(dt_model_zoo_new("bert-tiny", &f32, &m), DT_USAGE);
  ASSERT_OK(bert("bert-tiny", 100, 4, 2, 0, 0, &m));
  ASSERT_OK(dt_model_build(m, 1, 1));
  const int32_t x[12] = {1, 2, 100, 0, 0, 0, 0, 0, 1, 1, 1, 0};
  const float *y;
  ASSERT_STATUS(dt_model_forward(m, x, 1, &y), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "token id 100 at position 2 of sample 0"), dt_last_error());
  const int32_t t[12] = {1, 2, 3, 0, 0, 2, 0, 0, 1, 1, 1, 0};
  ASSERT_STATUS(dt_model_forward(m, t, 1, &y), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "token type 2 at position 1"), dt_last_error());
  dt_model_free(m);
  ASSERT_STATUS(dt_model_new(2, (int64_t[]){4, 6}, &m), DT_OK);
  ASSERT_STATUS(dt_model_add_self_attention(m, "a", 4, 0.0f, 0, -1), DT_SHAPE_MISMATCH); /* 6 features, 4 heads */
  dt_model_free(m);
}

TEST_MAIN(TEST_ENTRY(parameter_counts_equal_hugging_face), TEST_ENTRY(encoder_layer_matches_finite_differences),
          TEST_ENTRY(deferred_zero_grad_gives_the_eager_gradients),
          TEST_ENTRY(attention_dropout_matches_finite_differences),
          TEST_ENTRY(padding_changes_nothing), TEST_ENTRY(bad_shapes_and_ids_are_clear_errors))

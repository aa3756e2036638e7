/* Tests of dt_model: fashioncnn names and layout, arenas, grad-ready events, init, gradient check, BN, dropout, errors, AvgPool2d, fusions. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/loss.h"
#include "deferred_grads.h"
#include "harness.h"
#include "model_grad_check.h"
#include "nn/fusion.h"
#include "nn/layer.h"

static void fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi) {
  dt_rng r;
  dt_rng_init(&r, seed, 99);
  for (size_t i = 0; i < n; i++) x[i] = dt_rng_uniform_range(&r, lo, hi);
}

static dt_status fashioncnn(float dropout, dt_model **out) {
  dt_zoo_config cfg = {.ndim = 3, .input_shape = {1, 28, 28}, .outputs = 10, .dropout = dropout};
  return dt_model_zoo_new("fashioncnn", &cfg, out);
}

TEST(fashioncnn_tensor_names_order_shapes_and_count) {
  dt_model *m = NULL;
  ASSERT_OK(fashioncnn(-1, &m));
  static const struct {
    const char *name;
    int ndim;
    int64_t shape[4];
    int trainable;
    dt_dtype dtype;
  } want[] = {
      {"layer1.0.weight", 4, {32, 1, 3, 3}, 1, DT_F32},  {"layer1.0.bias", 1, {32}, 1, DT_F32},
      {"layer1.1.weight", 1, {32}, 1, DT_F32},           {"layer1.1.bias", 1, {32}, 1, DT_F32},
      {"layer1.1.running_mean", 1, {32}, 0, DT_F32},     {"layer1.1.running_var", 1, {32}, 0, DT_F32},
      {"layer1.1.num_batches_tracked", 0, {0}, 0, DT_I64}, {"layer2.0.weight", 4, {64, 32, 3, 3}, 1, DT_F32},
      {"layer2.0.bias", 1, {64}, 1, DT_F32},             {"layer2.1.weight", 1, {64}, 1, DT_F32},
      {"layer2.1.bias", 1, {64}, 1, DT_F32},             {"layer2.1.running_mean", 1, {64}, 0, DT_F32},
      {"layer2.1.running_var", 1, {64}, 0, DT_F32},      {"layer2.1.num_batches_tracked", 0, {0}, 0, DT_I64},
      {"fc1.weight", 2, {600, 2304}, 1, DT_F32},         {"fc1.bias", 1, {600}, 1, DT_F32},
      {"fc2.weight", 2, {120, 600}, 1, DT_F32},          {"fc2.bias", 1, {120}, 1, DT_F32},
      {"fc3.weight", 2, {10, 120}, 1, DT_F32},           {"fc3.bias", 1, {10}, 1, DT_F32},
  };
  int n = (int)(sizeof want / sizeof want[0]);
  ASSERT_EQ(dt_model_num_tensors(m), n);
  for (int i = 0; i < n; i++) {
    dt_tensor_info ti;
    ASSERT_OK(dt_model_tensor_info(m, i, &ti));
    ASSERT_STR_EQ(ti.name, want[i].name);
    ASSERT_EQ(ti.ndim, want[i].ndim);
    for (int d = 0; d < ti.ndim; d++) ASSERT_EQ(ti.shape[d], want[i].shape[d]);
    ASSERT_EQ(ti.trainable, want[i].trainable);
    ASSERT_EQ(ti.dtype, want[i].dtype);
  }
  /* conv1 32*1*9+32, bn1 2*32, conv2 64*32*9+64, bn2 2*64, fc1 2304*600+600, fc2 600*120+120, fc3 120*10+10 */
  size_t expect = (32 * 9 + 32) + 64 + (64 * 32 * 9 + 64) + 128 + (2304 * 600 + 600) + (600 * 120 + 120) + (1200 + 10);
  ASSERT_EQ(expect, 1475338);
  ASSERT_EQ(dt_model_num_params(m), expect);
  ASSERT_EQ(dt_model_output_size(m), 10);
  int idx = -1;
  ASSERT_OK(dt_model_find_tensor(m, "fc2.bias", &idx));
  ASSERT_EQ(idx, 17);
  ASSERT_STATUS(dt_model_find_tensor(m, "fc4.bias", &idx), DT_NOT_FOUND);
  ASSERT_EQ(dt_model_tensor_data(m, 0), NULL); /* not built yet */
  dt_model_free(m);
}

TEST(arena_is_in_reverse_layer_order) {
  dt_model *m = NULL;
  ASSERT_OK(fashioncnn(-1, &m));
  ASSERT_OK(dt_model_build(m, 2, 1));
  size_t total = 0, nb = 0;
  float *p = dt_model_params(m, &total);
  ASSERT(p != NULL);
  ASSERT_EQ(total, 1475338);
  ASSERT(dt_model_buffers(m, &nb) != NULL);
  ASSERT_EQ(nb, 2 * 32 + 2 * 64);
  static const struct {
    const char *name;
    size_t off;
  } want[] = {
      {"fc3.weight", 0},
      {"fc3.bias", 1200},
      {"fc2.weight", 1210},
      {"fc2.bias", 1210 + 72000},
      {"fc1.weight", 1210 + 72120},
      {"layer2.1.weight", 1210 + 72120 + 1383000},
      {"layer2.1.bias", 1210 + 72120 + 1383000 + 64},
      {"layer2.0.weight", 1210 + 72120 + 1383000 + 128},
      {"layer1.1.weight", 1475338 - 320 - 64},
      {"layer1.0.weight", 1475338 - 320},
      {"layer1.0.bias", 1475338 - 32},
      {"layer1.1.running_mean", 0}, /* buffers: layer order */
      {"layer1.1.running_var", 32},
      {"layer2.1.running_mean", 64},
      {"layer2.1.running_var", 128},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int idx;
    dt_tensor_info ti;
    ASSERT_OK(dt_model_find_tensor(m, want[i].name, &idx));
    ASSERT_OK(dt_model_tensor_info(m, idx, &ti));
    if (ti.offset != want[i].off) FAIL_("%s at %zu, expected %zu", want[i].name, ti.offset, want[i].off);
    float *data = dt_model_tensor_data(m, idx);
    ASSERT(data == (ti.trainable ? p : dt_model_buffers(m, NULL)) + want[i].off);
  }
  int idx;
  ASSERT_OK(dt_model_find_tensor(m, "layer2.1.num_batches_tracked", &idx));
  ASSERT_EQ(*(int64_t *)dt_model_tensor_data(m, idx), 0);
  dt_model_free(m);
}

typedef struct ranges {
  size_t off[64], cnt[64];
  int n;
} ranges;

static void record_range(void *user, size_t offset, size_t count) {
  ranges *r = user;
  if (r->n < 64) {
    r->off[r->n] = offset;
    r->cnt[r->n] = count;
  }
  r->n++;
}

TEST(grad_ready_ranges_increase_and_tile_the_arena) {
  dt_model *m = NULL;
  ASSERT_OK(fashioncnn(0.25f, &m));
  ASSERT_OK(dt_model_build(m, 3, 7));
  ranges r = {.n = 0};
  dt_model_on_grad_ready(m, record_range, &r);
  float x[3 * 784], dout[3 * 10];
  fill_uniform(x, 3 * 784, 1, 0, 1);
  fill_uniform(dout, 3 * 10, 2, -1, 1);
  const float *y;
  ASSERT_OK(dt_model_forward(m, x, 3, &y));
  dt_model_zero_grad(m);
  ASSERT_OK(dt_model_backward(m, dout));
  ASSERT_EQ(r.n, 7); /* conv, bn, conv, bn, fc1, fc2, fc3 */
  size_t next = 0;
  for (int i = 0; i < r.n; i++) {
    ASSERT_EQ(r.off[i], next);
    ASSERT(r.cnt[i] > 0);
    next += r.cnt[i];
  }
  ASSERT_EQ(next, dt_model_num_params(m));
  ASSERT_EQ(r.cnt[0], 1210);       /* fc3 first */
  ASSERT_EQ(r.cnt[r.n - 1], 320); /* layer1.0 last */
  /* every gradient range was written: no tensor's gradient is all zero */
  float *g = dt_model_grads(m, NULL);
  for (int i = 0; i < r.n; i++) {
    double s = 0;
    for (size_t k = 0; k < r.cnt[i]; k++) s += fabs(g[r.off[i] + k]);
    ASSERT(s > 0);
  }
  dt_model_free(m);
}

/* A Linear(I, O) with a bias over (B, I) inputs that computes its input gradient, after one forward and backward of
 * x and dout (filled here): want (O * I + O) holds its gradients. NULL on a failure. */
static dt_model *linear_reference(int B, int I, int O, float *x, float *dout, float *want) {
  dt_model *m = NULL;
  const float *y;
  fill_uniform(x, B * I, 4, -1, 1);
  fill_uniform(dout, B * O, 5, -1, 1);
  if (dt_model_new(1, (int64_t[]){I}, &m) != DT_OK || dt_model_add_linear(m, "fc", O, 1) != DT_OK ||
      dt_model_build(m, B, 3) != DT_OK) {
    dt_model_free(m);
    return NULL;
  }
  dt_model_ctx_want_input_grad(dt_model_default_ctx(m), 1);
  dt_model_zero_grad(m);
  if (dt_model_forward(m, x, B, &y) != DT_OK || dt_model_backward(m, dout) != DT_OK) {
    dt_model_free(m);
    return NULL;
  }
  memcpy(want, dt_model_grads(m, NULL), (size_t)(O * I + O) * sizeof *want);
  return m;
}

/* What a gradient-ready event finds: the layer's gradients as they will end, and the layer's input gradient (NaN
 * before the backward) not yet written. */
typedef struct early_probe {
  const float *grads, *want, *dinp;
  size_t n, n_in;
  int events, grads_final, dinp_unwritten;
} early_probe;

static void probe_ready(void *user, size_t offset, size_t count) {
  early_probe *p = user;
  p->events++;
  p->grads_final = offset == 0 && count == p->n && memcmp(p->grads, p->want, p->n * sizeof(float)) == 0;
  p->dinp_unwritten = 1;
  for (size_t i = 0; i < p->n_in; i++) p->dinp_unwritten &= isnan(p->dinp[i]);
}

/* Linear announces its gradients before computing its input gradient (which reads W, not them), so data-parallel
 * training reduces them meanwhile: at the event dW and db are final and dinp is not written yet; after
 * dt_model_set_ready_late, only once dinp is. */
TEST(linear_announces_its_gradients_before_its_input_gradient) {
  enum { B = 3, I = 5, O = 4 };
  float x[B * I], dout[B * O], want[O * I + O];
  dt_model *m = linear_reference(B, I, O, x, dout, want);
  ASSERT(m != NULL);
  dt_model_ctx *c = dt_model_default_ctx(m);
  const float *y;
  float *dinp = (float *)dt_model_ctx_input_grad(c); /* the backward's buffer for the layer's dinp */
  ASSERT(dinp != NULL);
  for (int i = 0; i < B * I; i++) dinp[i] = NAN;
  float *grads = dt_model_grads(m, NULL);
  early_probe p = {.grads = grads, .want = want, .dinp = dinp, .n = O * I + O, .n_in = B * I};
  dt_model_on_grad_ready(m, probe_ready, &p);
  dt_model_zero_grad_deferred(m);
  for (int i = 0; i < O * I + O; i++) grads[i] = NAN; /* stale: an announcement before dW and db would find these */
  ASSERT_OK(dt_model_backward(m, dout));
  ASSERT_EQ(p.events, 1);
  ASSERT(p.grads_final);
  ASSERT(p.dinp_unwritten);
  ASSERT(dt_model_ctx_input_grad(c) == dinp && !isnan(dinp[0]));
  /* late announcements (for hooks that change the parameters, DDP's sharded update): after dinp, which reads W */
  dt_model_set_ready_late(m, 1);
  for (int i = 0; i < B * I; i++) dinp[i] = NAN;
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  dt_model_zero_grad(m);
  ASSERT_OK(dt_model_backward(m, dout));
  ASSERT_EQ(p.events, 2);
  ASSERT(p.grads_final);
  ASSERT(!p.dinp_unwritten);
  dt_model_free(m);
}

/* What each gradient-ready event of a Linear announcing its weight in row pieces finds: its range final, every
 * later range of the block still stale (NaN: announced as soon as computed, not at the end), and the input
 * gradient written or not as the order asks. */
typedef struct piece_probe {
  const float *grads, *want, *dinp;
  size_t n, n_in, off[16], cnt[16];
  int events, ok, dinp_written;
} piece_probe;

static void probe_piece(void *user, size_t offset, size_t count) {
  piece_probe *p = user;
  if (p->events < 16) p->off[p->events] = offset, p->cnt[p->events] = count;
  p->events++;
  if (offset + count > p->n || memcmp(p->grads + offset, p->want + offset, count * sizeof(float)) != 0) p->ok = 0;
  for (size_t i = offset + count; i < p->n && i < offset + count + 40; i++) p->ok &= isnan(p->grads[i]);
  int written = 1;
  for (size_t i = 0; i < p->n_in; i++) written &= !isnan(p->dinp[i]);
  p->dinp_written = written;
}

/* DDP's pieces: a Linear asked (dt_model_set_grad_pieces) announces its weight's gradient a block of whole output
 * rows at a time, each once final, then the rest of its block with the bias (here, with oneDNN or OpenBLAS at
 * this size, to the bits of one GEMM); before its input gradient, or after it where announcements are late (the
 * sharded update steps W). Only a layer's first tensor of 2 or more dimensions of a kind that can splits. */
TEST(linear_announces_its_weight_in_row_pieces) {
  enum { B = 6, I = 40, O = 24, N = O * I + O };
  static float x[B * I], dout[B * O], want[N], want_dinp[B * I];
  dt_model *m = linear_reference(B, I, O, x, dout, want);
  ASSERT(m != NULL);
  dt_model_ctx *c = dt_model_default_ctx(m);
  const float *y;
  float *dinp = (float *)dt_model_ctx_input_grad(c);
  memcpy(want_dinp, dinp, sizeof want_dinp);
  int w = -1, b = -1;
  ASSERT_OK(dt_model_find_tensor(m, "fc.weight", &w));
  ASSERT_OK(dt_model_find_tensor(m, "fc.bias", &b));
  ASSERT_EQ(dt_model_set_grad_pieces(m, b, 8), 0); /* not the first tensor */
  ASSERT_EQ(dt_model_set_grad_pieces(m, w, I - 1), 0); /* less than a row */
  ASSERT_EQ(dt_model_set_grad_pieces(m, w, O * I), 0); /* one piece: whole */
  ASSERT_EQ(dt_model_set_grad_pieces(m, w, 23 * I), 12 * I);   /* 2 pieces: even, not 23 rows and 1 */
  ASSERT_EQ(dt_model_set_grad_pieces(m, w, 5 * I + 7), 5 * I); /* 5 pieces of whole rows, the last 4 */
  float *grads = dt_model_grads(m, NULL);
  piece_probe p = {.grads = grads, .want = want, .dinp = dinp, .n = N, .n_in = B * I};
  dt_model_on_grad_ready(m, probe_piece, &p);
  for (int late = 0; late <= 1; late++) {
    dt_model_set_ready_late(m, late);
    p.events = 0, p.ok = 1;
    ASSERT_OK(dt_model_forward(m, x, B, &y));
    dt_model_zero_grad_deferred(m);
    for (int i = 0; i < N; i++) grads[i] = NAN;
    for (int i = 0; i < B * I; i++) dinp[i] = NAN;
    ASSERT_OK(dt_model_backward(m, dout));
    ASSERT_EQ(p.events, 5); /* rows 0-4, 5-9, 10-14, 15-19, then rows 20-23 and the bias */
    for (int k = 0; k < 4; k++) ASSERT(p.off[k] == (size_t)k * 5 * I && p.cnt[k] == 5 * I);
    ASSERT(p.off[4] == 20 * I && p.cnt[4] == 4 * I + O);
    ASSERT(p.ok);
    ASSERT_EQ(p.dinp_written, late);
    ASSERT(memcmp(grads, want, sizeof want) == 0 && memcmp(dinp, want_dinp, sizeof want_dinp) == 0);
  }
  /* a backward adding to the gradients (accumulation) announces the same pieces */
  p.events = 0;
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  ASSERT_OK(dt_model_backward(m, dout));
  ASSERT_EQ(p.events, 5);
  ASSERT_EQ(dt_model_set_grad_pieces(m, w, 0), 0); /* off: one event again */
  p.events = 0;
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  dt_model_zero_grad_deferred(m);
  ASSERT_OK(dt_model_backward(m, dout));
  ASSERT_EQ(p.events, 1);
  dt_model_free(m);
  /* a convolution's weight cannot split */
  ASSERT_OK(dt_model_new(3, (int64_t[]){1, 6, 6}, &m));
  ASSERT_OK(dt_model_add_conv2d(m, "conv", 8, 3, 1, 1, 1));
  ASSERT_OK(dt_model_build(m, 2, 3));
  ASSERT_OK(dt_model_find_tensor(m, "conv.weight", &w));
  ASSERT_EQ(dt_model_set_grad_pieces(m, w, 9), 0);
  dt_model_free(m);
}

TEST(init_is_seeded_and_bounded_like_pytorch) {
  dt_model *a = NULL, *b = NULL, *c = NULL;
  ASSERT_OK(fashioncnn(-1, &a));
  ASSERT_OK(fashioncnn(-1, &b));
  ASSERT_OK(fashioncnn(-1, &c));
  ASSERT_OK(dt_model_build(a, 1, 42));
  ASSERT_OK(dt_model_build(b, 1, 42));
  ASSERT_OK(dt_model_build(c, 1, 43));
  size_t n;
  float *pa = dt_model_params(a, &n), *pb = dt_model_params(b, NULL), *pc = dt_model_params(c, NULL);
  ASSERT(memcmp(pa, pb, n * sizeof(float)) == 0);
  size_t differ = 0;
  for (size_t i = 0; i < n; i++) differ += pa[i] != pc[i];
  ASSERT(differ > n * 9 / 10); /* BN weights/biases (192) are constants */
  static const struct {
    const char *name;
    double fan_in;
  } fan[] = {{"layer1.0.weight", 9},   {"layer1.0.bias", 9},   {"layer2.0.weight", 288}, {"layer2.0.bias", 288},
             {"fc1.weight", 2304},     {"fc1.bias", 2304},     {"fc2.weight", 600},      {"fc3.bias", 120}};
  for (size_t k = 0; k < sizeof fan / sizeof fan[0]; k++) {
    int idx;
    dt_tensor_info ti;
    ASSERT_OK(dt_model_find_tensor(a, fan[k].name, &idx));
    ASSERT_OK(dt_model_tensor_info(a, idx, &ti));
    size_t numel = 1;
    for (int d = 0; d < ti.ndim; d++) numel *= (size_t)ti.shape[d];
    const float *w = dt_model_tensor_data(a, idx);
    double bound = 1.0 / sqrt(fan[k].fan_in), mx = 0, mean = 0;
    for (size_t i = 0; i < numel; i++) {
      if (fabs(w[i]) > bound) FAIL_("%s[%zu] = %g exceeds 1/sqrt(%g)", fan[k].name, i, w[i], fan[k].fan_in);
      mx = fmax(mx, fabs(w[i]));
      mean += w[i];
    }
    mean /= (double)numel;
    ASSERT(mx > 0.8 * bound);                                  /* the full range is used */
    ASSERT(fabs(mean) < 4 * bound / sqrt(3.0 * (double)numel)); /* centred: 4 sigma of the mean */
  }
  static const struct {
    const char *name;
    float v;
  } consts[] = {{"layer1.1.weight", 1}, {"layer1.1.bias", 0}, {"layer2.1.running_mean", 0}, {"layer2.1.running_var", 1}};
  for (size_t k = 0; k < sizeof consts / sizeof consts[0]; k++) {
    int idx;
    ASSERT_OK(dt_model_find_tensor(a, consts[k].name, &idx));
    const float *w = dt_model_tensor_data(a, idx);
    for (int i = 0; i < 32; i++) ASSERT(w[i] == consts[k].v);
  }
  dt_model_free(a);
  dt_model_free(b);
  dt_model_free(c);
}

/* ---- model-level finite-difference gradient check ---- */

enum { GC_B = 3, GC_CLASSES = 4 };
static const int32_t gc_labels[GC_B] = {1, 3, 0};

static dt_status gc_model(dt_model **out) {
  int64_t shape[3] = {2, 6, 6};
  dt_model *m = NULL;
  dt_status st = DT_OK;
  DT_CHECK(dt_model_new(3, shape, &m));
  DT_CHECK_GOTO(dt_model_add_conv2d(m, "conv", 3, 3, 2, 1, 1), st, fail); /* (3, 3, 3) */
  DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, "bn", 1e-5f, 0.1f), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "relu", DT_RELU), st, fail);
  DT_CHECK_GOTO(dt_model_add_maxpool2d(m, "pool", 2, 1, 0), st, fail); /* (3, 2, 2) */
  DT_CHECK_GOTO(dt_model_add_flatten(m, "flat"), st, fail);            /* (12,) */
  DT_CHECK_GOTO(dt_model_add_linear(m, "fc1", 8, 1), st, fail);
  DT_CHECK_GOTO(dt_model_begin_residual(m, "res"), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "res.fc", 8, 1), st, fail);
  DT_CHECK_GOTO(dt_model_add_activation(m, "res.act", DT_TANH), st, fail);
  DT_CHECK_GOTO(dt_model_end_residual(m), st, fail);
  DT_CHECK_GOTO(dt_model_add_linear(m, "head", GC_CLASSES, 1), st, fail);
  DT_CHECK_GOTO(dt_model_build(m, GC_B, 5), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}

static dt_status gc_loss(dt_model *m, const float *x, float *loss, float *dlogits) {
  const float *y;
  DT_CHECK(dt_model_forward(m, x, GC_B, &y));
  return dt_loss_cross_entropy(y, gc_labels, GC_B, GC_CLASSES, 0.0f, loss, dlogits);
}

/* Central differences in f32 with eps 1e-3: one ulp of the loss (~1.4) is
 * 1.2e-7, which the quotient turns into 1.2e-7 / 2e-3 = 6e-5; the forward's
 * sums leave a few ulp, and O(eps^2) truncation adds ~1e-6. We allow
 * |fd - analytic| <= 5e-4 + 1e-2 |analytic| (about 8 ulp of the loss; the
 * observed worst case is 6e-5), and the checked entries together must agree
 * to 5e-3 in relative L2 norm (observed 2e-4). A wrong backward (e.g. a
 * residual that drops the skip gradient) is off by 0.1..0.3. */
TEST(model_gradient_matches_finite_differences) {
  dt_model *m = NULL;
  ASSERT_OK(gc_model(&m));
  float x[GC_B * 72], dlogits[GC_B * GC_CLASSES];
  fill_uniform(x, GC_B * 72, 11, -1, 1);
  grad_check gc = {.eps = 1e-3f, .per = 4};
  ASSERT_OK(grad_check_run(m, x, GC_B * 72, dlogits, gc_loss, &gc));
  if (gc.msg[0]) FAIL_("%s", gc.msg);
  ASSERT_EQ(gc.checked, 4 * (10 + 1)); /* 10 parameter tensors and the input */
  ASSERT(gc.den > 1e-4);               /* the gradients are not trivially zero */
  if (gc.rel_l2 > 5e-3) FAIL_("relative L2 error %.3g over %d entries", gc.rel_l2, gc.checked);
  dt_model_free(m);
}

TEST(batchnorm_train_and_eval) {
  int64_t shape[3] = {2, 1, 2}; /* C = 2, HW = 2 */
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_batchnorm2d(m, "bn", 1e-5f, 0.1f));
  ASSERT_OK(dt_model_add_flatten(m, "flat"));
  ASSERT_OK(dt_model_build(m, 2, 0));
  /* x (N=2, C=2, HW=2): channel 0 values {1, 3, 5, 7}, channel 1 {2, 2, 4, 4} */
  const float x[8] = {1, 3, 2, 2, 5, 7, 4, 4};
  const float *y;
  ASSERT_OK(dt_model_forward(m, x, 2, &y));
  /* channel 0: mean 4, biased var 5; channel 1: mean 3, var 1 */
  const float want[8] = {-3 / sqrtf(5 + 1e-5f), -1 / sqrtf(5 + 1e-5f), -1 / sqrtf(1 + 1e-5f), -1 / sqrtf(1 + 1e-5f),
                         1 / sqrtf(5 + 1e-5f),  3 / sqrtf(5 + 1e-5f),  1 / sqrtf(1 + 1e-5f),  1 / sqrtf(1 + 1e-5f)};
  for (int i = 0; i < 8; i++) ASSERT_NEAR(y[i], want[i], 1e-5);
  int irm, irv, inb;
  ASSERT_OK(dt_model_find_tensor(m, "bn.running_mean", &irm));
  ASSERT_OK(dt_model_find_tensor(m, "bn.running_var", &irv));
  ASSERT_OK(dt_model_find_tensor(m, "bn.num_batches_tracked", &inb));
  const float *rm = dt_model_tensor_data(m, irm), *rv = dt_model_tensor_data(m, irv);
  const int64_t *nbt = dt_model_tensor_data(m, inb);
  /* running = 0.9 * old + 0.1 * stat, with the unbiased variance (20/3 and 4/3) */
  ASSERT_NEAR(rm[0], 0.4, 1e-6);
  ASSERT_NEAR(rm[1], 0.3, 1e-6);
  ASSERT_NEAR(rv[0], 0.9 + 0.1 * 20.0 / 3.0, 1e-6);
  ASSERT_NEAR(rv[1], 0.9 + 0.1 * 4.0 / 3.0, 1e-6);
  ASSERT_EQ(*nbt, 1);
  ASSERT_OK(dt_model_forward(m, x, 2, &y));
  ASSERT_EQ(*nbt, 2);
  float rm0 = rm[0], rv0 = rv[0];
  dt_model_set_training(m, 0);
  ASSERT_OK(dt_model_forward(m, x, 1, &y)); /* eval: batch 1 is fine, statistics untouched */
  ASSERT_EQ(*nbt, 2);
  ASSERT(rm[0] == rm0 && rv[0] == rv0);
  ASSERT_NEAR(y[0], (1 - rm[0]) / sqrt(rv[0] + 1e-5), 1e-5);
  ASSERT_NEAR(y[3], (2 - rm[1]) / sqrt(rv[1] + 1e-5), 1e-5);
  /* backward needs the training forward's batch statistics */
  float dout[8] = {0};
  ASSERT_STATUS(dt_model_backward(m, dout), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "bn") && strstr(dt_last_error(), "evaluation"));
  dt_model_free(m);
  /* training statistics of a single value per channel are undefined (torch raises too) */
  int64_t one[3] = {2, 1, 1};
  ASSERT_OK(dt_model_new(3, one, &m));
  ASSERT_OK(dt_model_add_batchnorm2d(m, "bn1x1", 1e-5f, 0.1f));
  ASSERT_OK(dt_model_build(m, 2, 0));
  ASSERT_STATUS(dt_model_forward(m, x, 1, &y), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "bn1x1"));
  ASSERT_OK(dt_model_forward(m, x, 2, &y));
  dt_model_free(m);
}

TEST(dropout_masks_follow_seed_stream_and_step) {
  int64_t shape[1] = {1000};
  dt_model *a = NULL, *b = NULL;
  ASSERT_OK(dt_model_new(1, shape, &a));
  ASSERT_OK(dt_model_new(1, shape, &b));
  ASSERT_OK(dt_model_add_dropout(a, "drop", 0.5f));
  ASSERT_OK(dt_model_add_dropout(b, "drop", 0.5f));
  ASSERT_OK(dt_model_build(a, 1, 9));
  ASSERT_OK(dt_model_build(b, 1, 9));
  static float x[1000], ya[1000], yb[1000];
  for (int i = 0; i < 1000; i++) x[i] = 1.0f;
  const float *y;
  ASSERT_OK(dt_model_forward(a, x, 1, &y));
  memcpy(ya, y, sizeof ya);
  int kept = 0;
  for (int i = 0; i < 1000; i++) {
    ASSERT(ya[i] == 0.0f || ya[i] == 2.0f);
    kept += ya[i] != 0.0f;
  }
  ASSERT(kept > 420 && kept < 580); /* Binomial(1000, 0.5): > 5 sigma */
  ASSERT_OK(dt_model_forward(b, x, 1, &y));
  ASSERT(memcmp(y, ya, sizeof ya) == 0); /* same seed, stream and step */
  ASSERT_OK(dt_model_forward(b, x, 1, &y));
  ASSERT(memcmp(y, ya, sizeof ya) != 0); /* the step advanced */
  dt_model_set_rng_stream(a, 1);
  ASSERT_OK(dt_model_forward(a, x, 1, &y));
  memcpy(yb, y, sizeof yb);
  ASSERT(memcmp(yb, ya, sizeof ya) != 0);
  /* backward routes the gradient through the same mask */
  float ones[1000];
  for (int i = 0; i < 1000; i++) ones[i] = 1.0f;
  dt_model_ctx_want_input_grad(dt_model_default_ctx(a), 1);
  ASSERT_OK(dt_model_backward(a, ones));
  const float *dx = dt_model_ctx_input_grad(dt_model_default_ctx(a));
  for (int i = 0; i < 1000; i++) ASSERT(dx[i] == yb[i]);
  dt_model_set_training(a, 0);
  ASSERT_OK(dt_model_forward(a, x, 1, &y));
  for (int i = 0; i < 1000; i++) ASSERT(y[i] == 1.0f);
  dt_model_free(a);
  dt_model_free(b);
}

TEST(error_cases_name_layers_and_numbers) {
  int64_t flat[1] = {784};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(1, flat, &m));
  ASSERT_STATUS(dt_model_add_conv2d(m, "c1", 8, 3, 1, 0, 1), DT_SHAPE_MISMATCH);
  ASSERT(strstr(dt_last_error(), "c1") && strstr(dt_last_error(), "(784,)"));
  ASSERT_STATUS(dt_model_add_batchnorm2d(m, "bn", 1e-5f, 0.1f), DT_SHAPE_MISMATCH);
  ASSERT_OK(dt_model_add_linear(m, "fc1", 16, 1));
  ASSERT_STATUS(dt_model_add_linear(m, "fc1", 16, 1), DT_INVALID_ARGUMENT); /* duplicate name */
  ASSERT_STATUS(dt_model_add_linear(m, "fc2", 0, 1), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_model_add_dropout(m, "d", 1.0f), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_model_end_residual(m), DT_INVALID_ARGUMENT);
  ASSERT_OK(dt_model_begin_residual(m, "res"));
  ASSERT_OK(dt_model_add_linear(m, "res.fc", 8, 1));
  ASSERT_STATUS(dt_model_end_residual(m), DT_SHAPE_MISMATCH);
  ASSERT(strstr(dt_last_error(), "(8,)") && strstr(dt_last_error(), "(16,)"));
  ASSERT_STATUS(dt_model_build(m, 4, 0), DT_INVALID_ARGUMENT); /* branch still open */
  ASSERT_OK(dt_model_add_linear(m, "res.fc2", 16, 1));
  ASSERT_OK(dt_model_end_residual(m));
  ASSERT_STATUS(dt_model_backward(m, NULL), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_model_build(m, 0, 0), DT_INVALID_ARGUMENT);
  ASSERT_OK(dt_model_build(m, 4, 0));
  ASSERT_STATUS(dt_model_build(m, 4, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_model_add_linear(m, "late", 2, 1), DT_INVALID_ARGUMENT);
  static float x[5 * 784];
  float dout[16] = {0};
  const float *y;
  ASSERT_STATUS(dt_model_backward(m, dout), DT_INVALID_ARGUMENT); /* before any forward */
  ASSERT(strstr(dt_last_error(), "forward"));
  ASSERT_STATUS(dt_model_forward(m, x, 5, &y), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "5") && strstr(dt_last_error(), "4"));
  ASSERT_STATUS(dt_model_forward(m, x, 0, &y), DT_INVALID_ARGUMENT);
  ASSERT_OK(dt_model_forward(m, x, 4, &y));
  dt_model_free(m);

  int64_t img[3] = {1, 4, 4};
  ASSERT_OK(dt_model_new(3, img, &m));
  ASSERT_STATUS(dt_model_add_linear(m, "fc", 3, 1), DT_SHAPE_MISMATCH);
  ASSERT(strstr(dt_last_error(), "(1, 4, 4)"));
  ASSERT_STATUS(dt_model_add_conv2d(m, "big", 2, 7, 1, 0, 1), DT_SHAPE_MISMATCH);
  ASSERT_STATUS(dt_model_add_maxpool2d(m, "pool", 2, 2, 2), DT_INVALID_ARGUMENT); /* pad > kernel/2 */
  dt_model_free(m);

  dt_zoo_config cfg = {.ndim = 3, .input_shape = {1, 28, 28}, .outputs = 10, .dropout = -1};
  ASSERT_STATUS(dt_model_zoo_new("resnet999", &cfg, &m), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "resnet999") && strstr(dt_last_error(), "mlp") &&
         strstr(dt_last_error(), "fashioncnn"));
}

TEST(mlp_zoo_model_and_summary) {
  dt_zoo_config cfg = {.ndim = 3, .input_shape = {1, 28, 28}, .outputs = 10, .dropout = -1};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_zoo_new("mlp", &cfg, &m));
  ASSERT_EQ(dt_model_num_params(m), (784 * 256 + 256) + (256 * 128 + 128) + (128 * 10 + 10));
  dt_tensor_info ti;
  ASSERT_OK(dt_model_tensor_info(m, 0, &ti));
  ASSERT_STR_EQ(ti.name, "fc1.weight");
  ASSERT_OK(dt_model_tensor_info(m, 5, &ti));
  ASSERT_STR_EQ(ti.name, "fc3.bias");
  ASSERT_EQ(dt_model_num_tensors(m), 6);
  dt_model_free(m);
  int hidden[1] = {32};
  cfg.hidden = hidden;
  cfg.n_hidden = 1;
  ASSERT_OK(dt_model_zoo_new("mlp", &cfg, &m));
  ASSERT_EQ(dt_model_num_params(m), 784 * 32 + 32 + 32 * 10 + 10);
  dt_model_free(m);

  ASSERT_OK(fashioncnn(-1, &m));
  char buf[8192] = {0};
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  ASSERT(f != NULL);
  dt_model_print_summary(m, f);
  fclose(f);
  ASSERT(strstr(buf, "Total params: 1,475,338"));
  ASSERT(strstr(buf, "layer2.0") && strstr(buf, "Conv2d") && strstr(buf, "(64, 12, 12)"));
  ASSERT(strstr(buf, "(64, 6, 6)") && strstr(buf, "(2304,)") && strstr(buf, "MaxPool2d") && strstr(buf, "ReLU"));
  dt_model_free(m);
}

/* One training step (forward, zero_grad, backward) of the same batch in contexts a and b; their outputs in
 * *ya and *yb, their gradients in their arenas. */
static dt_status step_both(dt_model *m, dt_model_ctx *a, dt_model_ctx *b, const float *x, int batch,
                           const float *dout, const float **ya, const float **yb) {
  dt_status st = dt_model_ctx_forward(m, a, x, batch, ya);
  if (st == DT_OK) st = dt_model_ctx_forward(m, b, x, batch, yb);
  if (st != DT_OK) return st;
  dt_model_ctx_zero_grad(m, a);
  dt_model_ctx_zero_grad(m, b);
  st = dt_model_ctx_backward(m, a, dout);
  return st == DT_OK ? dt_model_ctx_backward(m, b, dout) : st;
}

/* A second context over the same parameters (what data-parallel workers use)
 * computes the same outputs and gradients, into its own arenas. */
TEST(second_context_shares_parameters) {
  dt_model *m = NULL;
  ASSERT_OK(gc_model(&m));
  dt_model_ctx *c2 = NULL;
  ASSERT_OK(dt_model_ctx_new(m, GC_B, 0, &c2));
  float x[GC_B * 72], dout[GC_B * GC_CLASSES];
  fill_uniform(x, GC_B * 72, 3, -1, 1);
  fill_uniform(dout, GC_B * GC_CLASSES, 4, -1, 1);
  const float *y1, *y2;
  ASSERT_OK(step_both(m, dt_model_default_ctx(m), c2, x, GC_B, dout, &y1, &y2));
  ASSERT(y1 != y2);
  ASSERT(memcmp(y1, y2, sizeof(float) * GC_B * GC_CLASSES) == 0);
  size_t n;
  const float *g1 = dt_model_grads(m, &n), *g2 = dt_model_ctx_grads(c2);
  ASSERT(g1 != g2);
  ASSERT(memcmp(g1, g2, n * sizeof(float)) == 0);
  int inb;
  ASSERT_OK(dt_model_find_tensor(m, "bn.num_batches_tracked", &inb));
  ASSERT_EQ(*(int64_t *)dt_model_tensor_data(m, inb), 1); /* only the updating context counted */
  dt_model_ctx_free(c2);
  dt_model_free(m);
}

/* fashioncnn runs Conv2d -> BatchNorm -> ReLU -> MaxPool(2) fused, and BatchNorm -> ReLU -> MaxPool(2); a
 * context with fusion off runs the layers one by one. Outputs (training and eval), running statistics and the
 * gradients, with and without the input's, agree (forward exactly, gradients up to the order of the BN channel
 * sums). */
TEST(fused_bn_relu_pool_matches_layer_by_layer) {
  enum { B = 4 };
  dt_model *m = NULL;
  ASSERT_OK(fashioncnn(0.0f, &m));
  ASSERT_OK(dt_model_build(m, B, 5));
  dt_model_ctx *c1 = NULL, *c2 = NULL;
  ASSERT_OK(dt_model_ctx_new(m, B, 0, &c1));
  ASSERT_OK(dt_model_ctx_new(m, B, 0, &c2));
  dt_model_ctx_set_fusion(c2, 0);
  dt_model_ctx_want_input_grad(c1, 1);
  dt_model_ctx_want_input_grad(c2, 1);
  static float x[B * 784], dout[B * 10];
  fill_uniform(x, B * 784, 8, -1, 1);
  fill_uniform(dout, B * 10, 9, -1, 1);
  x[100] = NAN; /* one NaN pixel: ReLU and pooling keep their semantics on both paths */
  for (int mode = 1; mode >= 0; mode--) {
    dt_model_set_training(m, mode);
    const float *y1, *y2;
    ASSERT_OK(dt_model_ctx_forward(m, c1, x, B, &y1));
    ASSERT_OK(dt_model_ctx_forward(m, c2, x, B, &y2));
    ASSERT(memcmp(y1, y2, sizeof(float) * B * 10) == 0);
    x[100] = 0.5f;
  }
  /* training step with finite inputs: parameter and input gradients */
  dt_model_set_training(m, 1);
  const float *y1, *y2;
  ASSERT_OK(step_both(m, c1, c2, x, B, dout, &y1, &y2));
  ASSERT(memcmp(y1, y2, sizeof(float) * B * 10) == 0);
  size_t n = dt_model_num_params(m);
  const float *g1 = dt_model_ctx_grads(c1), *g2 = dt_model_ctx_grads(c2);
  double scale = 0.0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(g2[i]));
  ASSERT(scale > 0.0);
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad += !(fabs(g1[i] - g2[i]) <= 1e-5 * scale);
  ASSERT_EQ(bad, 0);
  const float *d1 = dt_model_ctx_input_grad(c1), *d2 = dt_model_ctx_input_grad(c2);
  ASSERT(d1 && d2);
  for (int i = 0; i < B * 784; i++) bad += !(fabs(d1[i] - d2[i]) <= 1e-5 * (1.0 + fabs(d2[i])));
  ASSERT_EQ(bad, 0);
  /* no input gradient: layer1's four layers make the convolution's output gradient where they consume it, with
   * the bits of their backwards in turn (the step above) */
  float *with_dinp = malloc(n * sizeof(float));
  ASSERT(with_dinp);
  memcpy(with_dinp, g1, n * sizeof(float));
  dt_model_ctx_want_input_grad(c1, 0);
  ASSERT_OK(step_both(m, c1, c2, x, B, dout, &y1, &y2));
  ASSERT(memcmp(with_dinp, g1, n * sizeof(float)) == 0);
  free(with_dinp);
  /* fusion switched off between forward and backward: backward follows the forward's path */
  ASSERT_OK(dt_model_ctx_forward(m, c1, x, B, &y1));
  dt_model_ctx_set_fusion(c1, 0);
  dt_model_ctx_zero_grad(m, c1);
  ASSERT_OK(dt_model_ctx_backward(m, c1, dout));
  for (size_t i = 0; i < n; i++) bad += !(fabs(g1[i] - g2[i]) <= 1e-5 * scale);
  ASSERT_EQ(bad, 0);
  dt_model_ctx_free(c1);
  dt_model_ctx_free(c2);
  dt_model_free(m);
}

/* A deferred zero_grad gives an eager one's gradients (tests/deferred_grads.h): Linear assigns its gradients,
 * BatchNorm (in fused groups) and Conv2d find their blocks cleared first; in f32 and under both amp modes (bf16:
 * the native GEMM where the CPU has one, beta 0 against 1). */
TEST(deferred_zero_grad_gives_the_eager_gradients) {
  enum { B = 4 };
  dt_model *m = NULL;
  ASSERT_OK(fashioncnn(0.0f, &m));
  ASSERT_OK(dt_model_build(m, B, 5));
  static float x[B * 784], dout[B * 10];
  fill_uniform(x, B * 784, 10, -1, 1);
  fill_uniform(dout, B * 10, 11, -1, 1);
  const dt_amp modes[3] = {DT_AMP_OFF, DT_AMP_BF16, DT_AMP_FP16};
  for (int k = 0; k < 3; k++) {
    const char *why = deferred_grads_differ(m, B, x, dout, modes[k]);
    ASSERT_MSG(why == NULL, why);
  }
  dt_model_free(m);
}

/* Flatten is a view: its output aliases its input (no copy); gradients pass through it unchanged, and as
 * the lowest layer it still hands back an input gradient of its own. */
TEST(flatten_is_a_zero_copy_view) {
  const int64_t shape[3] = {2, 1, 3};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_flatten(m, "flat"));
  ASSERT_OK(dt_model_add_linear(m, "fc", 2, 0));
  ASSERT_OK(dt_model_build(m, 2, 3));
  dt_model_ctx *c = dt_model_default_ctx(m);
  dt_model_ctx_want_input_grad(c, 1);
  const float x[12] = {1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6}, dout[4] = {1, 0, 0, 2};
  const float *y;
  ASSERT_OK(dt_model_forward(m, x, 2, &y));
  size_t np;
  const float *w = dt_model_params(m, &np); /* fc.weight (2, 6) */
  ASSERT_EQ(np, 12);
  for (int b = 0; b < 2; b++)
    for (int o = 0; o < 2; o++) {
      double acc = 0.0;
      for (int i = 0; i < 6; i++) acc += (double)x[b * 6 + i] * w[o * 6 + i];
      ASSERT_NEAR(y[b * 2 + o], acc, 1e-5);
    }
  dt_model_zero_grad(m);
  ASSERT_OK(dt_model_backward(m, dout));
  const float *dx = dt_model_ctx_input_grad(c);
  ASSERT(dx != NULL);
  for (int i = 0; i < 6; i++) { /* dx = dout @ w */
    ASSERT_NEAR(dx[i], w[i], 1e-6);
    ASSERT_NEAR(dx[6 + i], 2 * w[6 + i], 1e-6);
  }
  dt_model_free(m);
  /* Flatten alone: output = input; the input gradient is dout, in the context's own buffer */
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_flatten(m, "flat"));
  ASSERT_OK(dt_model_build(m, 2, 3));
  c = dt_model_default_ctx(m);
  dt_model_ctx_want_input_grad(c, 1);
  ASSERT_OK(dt_model_forward(m, x, 2, &y));
  ASSERT(memcmp(y, x, sizeof x) == 0);
  ASSERT_OK(dt_model_backward(m, x));
  dx = dt_model_ctx_input_grad(c);
  ASSERT(dx != NULL && dx != x);
  ASSERT(memcmp(dx, x, sizeof x) == 0);
  dt_model_free(m);
}

/* dt_model_activation_bytes: the input and each layer's own output for the built batch, each 64-byte aligned; a
 * view (Flatten) adds nothing; 0 before build. */
TEST(activation_bytes_count_the_input_and_each_own_output) {
  const int64_t shape[3] = {1, 4, 8};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_flatten(m, "flat"));
  ASSERT_OK(dt_model_add_linear(m, "fc1", 16, 1));
  ASSERT_OK(dt_model_add_linear(m, "fc2", 3, 1));
  ASSERT_EQ(dt_model_activation_bytes(m), 0);
  ASSERT_OK(dt_model_build(m, 4, 1));
  /* input 32 x 4 floats (512 bytes), fc1 16 x 4 (256), fc2 3 x 4 (48, aligned to 64) */
  ASSERT_EQ(dt_model_activation_bytes(m), 512 + 256 + 64);
  dt_model_free(m);
  ASSERT_EQ(dt_model_activation_bytes(NULL), 0);
}

/* The torch.nn.AvgPool2d reference: the mean over the k x k window with the zero padding counted
 * (count_include_pad), floor mode; x (C, H, W) of one sample, out (C, OH, OW). */
static void avgpool_reference(const float *x, int C, int H, int W, int k, int st, int pad, float *out) {
  int OH = (H + 2 * pad - k) / st + 1, OW = (W + 2 * pad - k) / st + 1;
  for (int c = 0; c < C; c++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        double acc = 0.0;
        for (int i = oh * st - pad; i < oh * st - pad + k; i++)
          for (int j = ow * st - pad; j < ow * st - pad + k; j++)
            if (i >= 0 && i < H && j >= 0 && j < W) acc += x[(c * H + i) * W + j];
        out[(c * OH + oh) * OW + ow] = (float)(acc / (k * k));
      }
}

/* AvgPool2d(3, stride 2, padding 1) as a layer: shape, forward against the reference, backward as the
 * reference's transpose (each output's gradient spread over its window / 9), summary; bad arguments. */
TEST(avgpool2d_layer_matches_reference) {
  enum { B = 2, C = 2, H = 4, W = 5, OH = 2, OW = 3 };
  const int64_t shape[3] = {C, H, W};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_avgpool2d(m, "pool", 3, 2, 1));
  ASSERT_EQ(dt_model_output_size(m), C * OH * OW);
  ASSERT_EQ(dt_model_num_tensors(m), 0);
  ASSERT_OK(dt_model_build(m, B, 1));
  dt_model_ctx_want_input_grad(dt_model_default_ctx(m), 1);
  static float x[B * C * H * W], dout[B * C * OH * OW], want[B * C * OH * OW];
  fill_uniform(x, B * C * H * W, 11, -1, 1);
  fill_uniform(dout, B * C * OH * OW, 12, -1, 1);
  const float *y;
  ASSERT_OK(dt_model_forward(m, x, B, &y));
  for (int b = 0; b < B; b++) avgpool_reference(x + b * C * H * W, C, H, W, 3, 2, 1, want + b * C * OH * OW);
  for (int i = 0; i < B * C * OH * OW; i++) ASSERT_NEAR(y[i], want[i], 1e-6);
  ASSERT_OK(dt_model_backward(m, dout));
  const float *dx = dt_model_ctx_input_grad(dt_model_default_ctx(m));
  ASSERT(dx != NULL);
  /* <dx, e_i> = <dout, pool(e_i)>: the backward is the forward's transpose */
  static float e[C * H * W], pe[C * OH * OW];
  for (int b = 0; b < B; b++)
    for (int i = 0; i < C * H * W; i++) {
      memset(e, 0, sizeof e);
      e[i] = 1.0f;
      avgpool_reference(e, C, H, W, 3, 2, 1, pe);
      double acc = 0.0;
      for (int o = 0; o < C * OH * OW; o++) acc += (double)pe[o] * dout[b * C * OH * OW + o];
      ASSERT_NEAR(dx[b * C * H * W + i], acc, 1e-6);
    }
  char buf[4096] = {0};
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  ASSERT(f != NULL);
  dt_model_print_summary(m, f);
  fclose(f);
  ASSERT(strstr(buf, "pool") && strstr(buf, "AvgPool2d") && strstr(buf, "(2, 2, 3)"));
  dt_model_free(m);

  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_avgpool2d(m, "p2", 2, 0, 0)); /* stride 0: the kernel, as torch */
  ASSERT_EQ(dt_model_output_size(m), C * 2 * 2);
  ASSERT_STATUS(dt_model_add_avgpool2d(m, "p3", 0, 1, 0), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_model_add_avgpool2d(m, "p3", 2, 1, 2), DT_INVALID_ARGUMENT); /* pad > kernel/2 */
  ASSERT(strstr(dt_last_error(), "p3") && strstr(dt_last_error(), "AvgPool2d"));
  ASSERT_STATUS(dt_model_add_avgpool2d(m, "p3", 3, 1, 0), DT_SHAPE_MISMATCH); /* 3 > the (2, 2) input */
  dt_model_free(m);
  const int64_t flat[1] = {20};
  ASSERT_OK(dt_model_new(1, flat, &m));
  ASSERT_STATUS(dt_model_add_avgpool2d(m, "p", 2, 2, 0), DT_SHAPE_MISMATCH);
  dt_model_free(m);
}

/* The fusion table matches a 3x3 Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d(2), else BatchNorm2d -> ReLU ->
 * MaxPool2d(2), else BatchNorm2d -> ReLU, and a residual end -> ReLU, and nothing near them (another pool leaves
 * BN -> ReLU, another activation nothing); a model with four groups runs fused as it runs layer by layer, in
 * training (outputs, parameter gradients: the first group's made without its input gradient; the fused end still
 * hands the skip its gradient) and in evaluation (outputs, a NaN input included). */
TEST(fusion_plan_matches_only_the_pattern) {
  enum { B = 2 };
  const int64_t shape[3] = {2, 8, 8};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_conv2d(m, "c", 4, 3, 1, 1, 1)); /* 0..3: fused */
  ASSERT_OK(dt_model_add_batchnorm2d(m, "bn1", 1e-5f, 0.1f));
  ASSERT_OK(dt_model_add_activation(m, "r1", DT_RELU));
  ASSERT_OK(dt_model_add_maxpool2d(m, "p1", 2, 2, 0));
  ASSERT_OK(dt_model_add_batchnorm2d(m, "bn2", 1e-5f, 0.1f)); /* 4..5: fused; 6: a 3x3 pool */
  ASSERT_OK(dt_model_add_activation(m, "r2", DT_RELU));
  ASSERT_OK(dt_model_add_maxpool2d(m, "p2", 3, 1, 1));
  ASSERT_OK(dt_model_add_batchnorm2d(m, "bn3", 1e-5f, 0.1f)); /* 7..9: GELU */
  ASSERT_OK(dt_model_add_activation(m, "g3", DT_GELU));
  ASSERT_OK(dt_model_add_maxpool2d(m, "p3", 2, 2, 0));
  ASSERT_OK(dt_model_add_batchnorm2d(m, "bn4", 1e-5f, 0.1f)); /* 10..12: fused (stride 0 is 2) */
  ASSERT_OK(dt_model_add_activation(m, "r4", DT_RELU));
  ASSERT_OK(dt_model_add_maxpool2d(m, "p4", 2, 0, 0));
  ASSERT_OK(dt_model_begin_residual(m, "res")); /* 13..16: the end and the ReLU after it fused */
  ASSERT_OK(dt_model_add_conv2d(m, "rc", 4, 3, 1, 1, 1));
  ASSERT_OK(dt_model_end_residual(m));
  ASSERT_OK(dt_model_add_activation(m, "r5", DT_RELU));
  enum { N = 17 };
  ASSERT_EQ(dt_model_num_layers(m), N);
  ASSERT_EQ(dt_model_num_layers(NULL), 0);
  ASSERT_STR_EQ(dt_model_layer(m, 3)->name, "p1");
  ASSERT(dt_model_layer(m, N) == NULL && dt_model_layer(m, -1) == NULL);
  const dt_fusion *group[N];
  int first[N];
  dt_fusion_plan(dt_model_layer(m, 0), N, group, first);
  for (int i = 0; i < N; i++) {
    ASSERT((group[i] != NULL) == (i == 0 || i == 4 || i == 10 || i == 15));
    ASSERT_EQ(first[i], i == 3 ? 0 : i == 5 ? 4 : i == 12 ? 10 : i == 16 ? 15 : i);
  }
  ASSERT_STR_EQ(group[0]->name, "Conv2d(3x3)+BatchNorm2d+ReLU+MaxPool2d(2)");
  ASSERT_STR_EQ(group[10]->name, "BatchNorm2d+ReLU+MaxPool2d(2)");
  { /* after a layer with parameters (the first group's too), a convolution stays on its own: its input gradient is
     * always wanted */
    dt_model *m2 = NULL;
    ASSERT_OK(dt_model_new(3, shape, &m2));
    for (int k = 0; k < 2; k++) {
      ASSERT_OK(dt_model_add_conv2d(m2, k ? "c1" : "c0", 4, 3, 1, 1, 1));
      ASSERT_OK(dt_model_add_batchnorm2d(m2, k ? "bn1" : "bn0", 1e-5f, 0.1f));
      ASSERT_OK(dt_model_add_activation(m2, k ? "r1" : "r0", DT_RELU));
      ASSERT_OK(dt_model_add_maxpool2d(m2, k ? "p1" : "p0", 2, 2, 0));
    }
    ASSERT_OK(dt_model_build(m2, B, 3));
    const dt_fusion *g2[8];
    int f2[8];
    dt_fusion_plan(dt_model_layer(m2, 0), 8, g2, f2);
    ASSERT(g2[0] == group[0] && f2[3] == 0 && !g2[4] && g2[5] == group[10] && f2[7] == 5);
    dt_model_free(m2);
  }
  ASSERT_STR_EQ(group[4]->name, "BatchNorm2d+ReLU");
  ASSERT_STR_EQ(group[15]->name, "Residual(+)+ReLU");
  ASSERT_EQ(group[10]->n_layers, 3);

  ASSERT_OK(dt_model_build(m, B, 3));
  dt_model_ctx *plain = NULL;
  ASSERT_OK(dt_model_ctx_new(m, B, 0, &plain));
  dt_model_ctx_set_fusion(plain, 0);
  static float x[B * 128], dout[B * 4];
  fill_uniform(x, B * 128, 13, -1, 1);
  fill_uniform(dout, B * 4, 14, -1, 1);
  const float *y1, *y2;
  ASSERT_OK(step_both(m, dt_model_default_ctx(m), plain, x, B, dout, &y1, &y2));
  ASSERT(memcmp(y1, y2, sizeof(float) * B * 4) == 0);
  size_t n;
  const float *g1 = dt_model_grads(m, &n), *g2 = dt_model_ctx_grads(plain);
  for (size_t i = 0; i < n; i++) ASSERT_NEAR(g1[i], g2[i], 1e-5);
  dt_model_set_training(m, 0);
  x[5] = NAN;
  ASSERT_OK(dt_model_ctx_forward(m, dt_model_default_ctx(m), x, B, &y1));
  ASSERT_OK(dt_model_ctx_forward(m, plain, x, B, &y2));
  ASSERT(memcmp(y1, y2, sizeof(float) * B * 4) == 0);
  dt_model_ctx_free(plain);
  dt_model_free(m);
}

/* The first layer's Conv2d+BatchNorm2d+ReLU+MaxPool2d(2) group where its ReLU slot cannot hold the planes it would
 * make (one output channel, a batch of 1: 64 floats against 3 planes of 64) runs the two backwards in turn, with
 * the gradients of the layers one by one; at a batch of 3 and 4 channels it makes them. Both in contexts of 4. */
TEST(conv_bn_pool_group_falls_back_where_its_slot_is_short) {
  const int64_t shape[3] = {1, 8, 8};
  for (int oc = 1; oc <= 4; oc += 3) {
    const int B = oc == 1 ? 1 : 3;
    dt_model *m = NULL;
    ASSERT_OK(dt_model_new(3, shape, &m));
    ASSERT_OK(dt_model_add_conv2d(m, "c", oc, 3, 1, 1, 1));
    ASSERT_OK(dt_model_add_batchnorm2d(m, "bn", 1e-5f, 0.1f));
    ASSERT_OK(dt_model_add_activation(m, "r", DT_RELU));
    ASSERT_OK(dt_model_add_maxpool2d(m, "p", 2, 2, 0));
    ASSERT_OK(dt_model_add_flatten(m, "f"));
    ASSERT_OK(dt_model_add_linear(m, "fc", 3, 1));
    ASSERT_OK(dt_model_build(m, 4, 7));
    dt_model_ctx *plain = NULL;
    ASSERT_OK(dt_model_ctx_new(m, 4, 0, &plain));
    dt_model_ctx_set_fusion(plain, 0);
    float x[3 * 64], dout[3 * 3];
    fill_uniform(x, (size_t)B * 64, 15, -1, 1);
    fill_uniform(dout, (size_t)B * 3, 16, -1, 1);
    const float *y1, *y2;
    ASSERT_OK(step_both(m, dt_model_default_ctx(m), plain, x, B, dout, &y1, &y2));
    ASSERT(memcmp(y1, y2, sizeof(float) * (size_t)B * 3) == 0);
    size_t n;
    const float *g1 = dt_model_grads(m, &n), *g2 = dt_model_ctx_grads(plain);
    for (size_t i = 0; i < n; i++) ASSERT_NEAR(g1[i], g2[i], 1e-5 * (1 + fabs(g2[i])));
    dt_model_ctx_free(plain);
    dt_model_free(m);
  }
}

/* A NaN reaching the BatchNorm2d+ReLU and Residual(+)+ReLU rows: both rectify it to 0, as the layers one by one
 * do, in training and in evaluation. */
TEST(fused_relu_rows_keep_nan_semantics) {
  enum { B = 2 };
  const int64_t shape[3] = {2, 4, 4};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_begin_residual(m, "res"));
  ASSERT_OK(dt_model_add_conv2d(m, "c", 2, 3, 1, 1, 1));
  ASSERT_OK(dt_model_end_residual(m));
  ASSERT_OK(dt_model_add_activation(m, "r1", DT_RELU));
  ASSERT_OK(dt_model_add_conv2d(m, "c2", 2, 3, 1, 1, 1));
  ASSERT_OK(dt_model_add_batchnorm2d(m, "bn", 1e-5f, 0.1f));
  ASSERT_OK(dt_model_add_activation(m, "r2", DT_RELU));
  ASSERT_OK(dt_model_build(m, B, 3));
  dt_model_ctx *plain = NULL;
  ASSERT_OK(dt_model_ctx_new(m, B, 0, &plain));
  dt_model_ctx_set_fusion(plain, 0);
  static float x[B * 32];
  fill_uniform(x, B * 32, 15, -1, 1);
  x[3] = NAN; /* the residual's sum NaN around it; a NaN bias then takes c2 and bn to NaN */
  int ti;
  ASSERT_OK(dt_model_find_tensor(m, "c2.bias", &ti));
  ((float *)dt_model_tensor_data(m, ti))[0] = NAN; /* channel 0 of c2, then of bn: NaN throughout */
  for (int mode = 1; mode >= 0; mode--) {
    dt_model_set_training(m, mode);
    const float *y1, *y2;
    ASSERT_OK(dt_model_ctx_forward(m, dt_model_default_ctx(m), x, B, &y1));
    ASSERT_OK(dt_model_ctx_forward(m, plain, x, B, &y2));
    ASSERT(memcmp(y1, y2, sizeof(float) * B * 32) == 0);
    int zeros = 0;
    for (int i = 0; i < B * 32; i++) zeros += y1[i] == 0.0f;
    ASSERT(zeros > 0);
  }
  dt_model_ctx_free(plain);
  dt_model_free(m);
}

TEST_MAIN(TEST_ENTRY(fashioncnn_tensor_names_order_shapes_and_count), TEST_ENTRY(arena_is_in_reverse_layer_order),
          TEST_ENTRY(grad_ready_ranges_increase_and_tile_the_arena),
          TEST_ENTRY(linear_announces_its_weight_in_row_pieces),
          TEST_ENTRY(linear_announces_its_gradients_before_its_input_gradient), TEST_ENTRY(init_is_seeded_and_bounded_like_pytorch),
          TEST_ENTRY(model_gradient_matches_finite_differences), TEST_ENTRY(batchnorm_train_and_eval),
          TEST_ENTRY(dropout_masks_follow_seed_stream_and_step), TEST_ENTRY(error_cases_name_layers_and_numbers),
          TEST_ENTRY(mlp_zoo_model_and_summary), TEST_ENTRY(second_context_shares_parameters),
          TEST_ENTRY(fused_bn_relu_pool_matches_layer_by_layer),
          TEST_ENTRY(deferred_zero_grad_gives_the_eager_gradients), TEST_ENTRY(flatten_is_a_zero_copy_view),
          TEST_ENTRY(avgpool2d_layer_matches_reference),
          TEST_ENTRY(fusion_plan_matches_only_the_pattern), TEST_ENTRY(fused_relu_rows_keep_nan_semantics),
          TEST_ENTRY(conv_bn_pool_group_falls_back_where_its_slot_is_short),
          TEST_ENTRY(activation_bytes_count_the_input_and_each_own_output))

/* A model context's activations, layer workspaces and backward buffers are not zeroed when made (a page nobody
 * writes then takes no memory: BERT's packed sequences leave much of them unused), so no layer may read any of them
 * before writing them. Every zoo model (but resnet34: resnet18's blocks over again), in f32 and bf16, runs a
 * training forward and backward and an evaluation forward (f32 on 3 samples of a context of 4; bf16 on 4, the
 * evaluation first) in a fresh context whose unset blocks (the amp copies too) are zeroed, as when they were zeroed
 * at allocation, then in one where they hold NaN and 3.4e38 in turn (a read that a NaN slips past, as in fmaxf,
 * shows through the other): logits, gradients and the input's gradient must be finite and have the same bits
 * both times. Not covered: several threads, fusion off, fp16. */
#include <string.h>

#include "core/impl.h"
#include "dtrain/model_ctx.h"
#include "harness.h"

enum { MAX_BATCH = 4, BATCH = 3, L = 8, VOCAB = 50 };
#define MAX_VALUES ((size_t)24 << 20) /* the values of one run: resnet50's 23.5 M gradients fit */

static const int64_t index_sizes[2] = {7, 9};
static const int64_t vocab = VOCAB;

/* The inputs a model can take, tried in turn: images, (user, item) indices, token ids (3, L). */
static int config_for(int which, dt_task_kind task, dt_zoo_config *cfg) {
  const dt_zoo_config image = {.ndim = 3, .input_shape = {3, 32, 32}, .outputs = 5, .task = task, .dropout = -1};
  const dt_zoo_config pairs = {.ndim = 1, .input_shape = {2}, .outputs = 1, .task = task, .dropout = -1,
                               .n_index = 2, .index_size = index_sizes, .factors = 4};
  const dt_zoo_config text = {.ndim = 2, .input_shape = {3, L}, .outputs = 3, .task = task, .dropout = -1,
                              .n_index = 1, .index_size = &vocab, .layers = 1, .hidden_size = 16, .heads = 2,
                              .intermediate_size = 24};
  const dt_zoo_config *all[3] = {&image, &pairs, &text};
  if (which >= 3) return 0;
  *cfg = *all[which];
  return 1;
}

/* x for the model's input, MAX_BATCH samples: normal floats; indices below each column's size; token ids with a
 * mask that keeps 8, 5, 3 and 6 tokens (packed sequences of several lengths). */
static void make_input(const dt_zoo_config *cfg, float *xf, int32_t *xi) {
  dt_rng r;
  dt_rng_init(&r, 7, 0);
  if (cfg->n_index == 0) {
    for (int i = 0; i < MAX_BATCH * 3 * 32 * 32; i++) xf[i] = dt_rng_normal(&r);
  } else if (cfg->n_index == 2) {
    for (int b = 0; b < MAX_BATCH; b++)
      for (int k = 0; k < 2; k++) xi[b * 2 + k] = (int32_t)dt_rng_below(&r, (uint32_t)index_sizes[k]);
  } else {
    static const int live[MAX_BATCH] = {L, 5, 3, 6};
    for (int b = 0; b < MAX_BATCH; b++)
      for (int t = 0; t < L; t++) {
        int32_t *s = xi + b * 3 * L;
        s[t] = t < live[b] ? 1 + (int32_t)dt_rng_below(&r, VOCAB - 1) : 0;
        s[L + t] = t < live[b] && t >= live[b] / 2;
        s[2 * L + t] = t < live[b];
      }
  }
}

/* One pass of a run: how many samples, and whether the evaluation forward comes before the training step. */
typedef struct pass {
  dt_amp amp;
  int batch, eval_first;
} pass;

static void append(float *out, size_t *k, const float *v, size_t n) {
  memcpy(out + *k, v, n * sizeof(float));
  *k += n;
}

/* Elements of one input sample. */
static size_t sample_numel(const dt_model *m) {
  int nd = 0;
  const int64_t *shape = dt_model_input_shape(m, &nd);
  size_t n = 1;
  for (int d = 0; d < nd; d++) n *= (size_t)shape[d];
  return n;
}

/* A training forward and backward of x in c: logits, gradients and the input's gradient appended to out. */
static const char *train_step(dt_model *m, dt_model_ctx *c, const void *x, int batch, float *out, size_t *k) {
  const int classes = dt_model_output_size(m);
  float dout[MAX_BATCH * 8];
  for (int i = 0; i < batch * classes; i++) dout[i] = 0.25f * (float)(i % 5) - 0.5f;
  const float *y = NULL;
  dt_model_set_training(m, 1);
  if (dt_model_ctx_forward(m, c, x, batch, &y) != DT_OK) return "training forward";
  append(out, k, y, (size_t)(batch * classes));
  dt_model_ctx_zero_grad(m, c);
  if (dt_model_ctx_backward(m, c, dout) != DT_OK) return "backward";
  append(out, k, dt_model_ctx_grads(c), dt_model_num_params(m));
  const float *dx = dt_model_ctx_input_grad(c);
  const size_t nx = (size_t)batch * sample_numel(m);
  if (!dx) return "no input gradient";
  for (size_t i = 0; dt_model_input_dtype(m) == DT_I32 && i < nx; i++)
    if (dx[i] != 0.0f) return "an input gradient of indices that is not zero";
  append(out, k, dx, nx);
  return NULL;
}

/* An evaluation forward of x in c: logits appended to out. */
static const char *eval_step(dt_model *m, dt_model_ctx *c, const void *x, int batch, float *out, size_t *k) {
  const float *y = NULL;
  dt_model_set_training(m, 0);
  if (dt_model_ctx_forward(m, c, x, batch, &y) != DT_OK) return "evaluation forward";
  append(out, k, y, (size_t)(batch * dt_model_output_size(m)));
  return NULL;
}

/* Pass p in a fresh context of m whose unset blocks are poisoned (1) or zeroed (2): its logits, gradients and input
 * gradient into out[0..*k). NULL, or what failed. */
static const char *run_pass(dt_model *m, const void *x, const pass *p, int poison, float *out, size_t *k) {
  *k = 0;
  if (dt_model_output_size(m) > 8) return "more outputs than the test's gradient holds";
  if (dt_model_num_params(m) + MAX_BATCH * (2 * 8 + sample_numel(m)) > MAX_VALUES)
    return "more values than the test's buffers hold";
  dt_model_ctx *c = NULL;
  dt_alloc_poison_unset(poison);
  /* no running statistics updated: every context's evaluation sees the same */
  const dt_status made = dt_model_ctx_new(m, MAX_BATCH, 0, &c);
  const char *bad = made != DT_OK ? "context" : dt_model_ctx_set_amp(m, c, p->amp) != DT_OK ? "amp" : NULL;
  dt_alloc_poison_unset(0); /* after the amp copies of the parameters and operands: unset blocks too */
  if (!bad) dt_model_ctx_want_input_grad(c, 1); /* every layer's input gradient computed, the first one's too */
  if (!bad && p->eval_first) bad = eval_step(m, c, x, p->batch, out, k);
  if (!bad) bad = train_step(m, c, x, p->batch, out, k);
  if (!bad && !p->eval_first) bad = eval_step(m, c, x, p->batch, out, k);
  dt_model_ctx_free(c);
  return bad;
}

/* The first of the test's inputs the model takes (with a task it supports); 0 if none. */
static int fitting_config(const char *name, dt_zoo_config *cfg) {
  for (int which = 0; config_for(which, DT_TASK_CLASSIFICATION, cfg); which++)
    for (int t = 0; t < 2; t++) {
      cfg->task = t ? DT_TASK_REGRESSION : DT_TASK_CLASSIFICATION;
      dt_model *m = NULL;
      const int ok = dt_model_zoo_new(name, cfg, &m) == DT_OK;
      dt_model_free(m);
      if (ok) return 1;
    }
  return 0;
}

typedef struct each_ctx {
  int *failed;
  int models;
  float *a, *b;
} each_ctx;

static void check_model(const char *name, const char *doc, void *user) {
  (void)doc;
  each_ctx *e = user;
  dt_zoo_config cfg;
  if (!strcmp(name, "resnet34")) return; /* resnet18's blocks, more of them: 8 s here for nothing new */
#if defined(__SANITIZE_ADDRESS__)
  /* the unoptimised sanitizer build spends most of this test's time on them; the optimised build's run covers them */
  if (!strcmp(name, "resnet18") || !strcmp(name, "resnet50")) return;
#endif
  if (!fitting_config(name, &cfg)) {
    fprintf(stderr, "  %s: no input of this test fits it (%s)\n", name, dt_last_error());
    *e->failed = 1;
    return;
  }
  e->models++;
  static float xf[MAX_BATCH * 3 * 32 * 32];
  static int32_t xi[MAX_BATCH * 3 * L];
  make_input(&cfg, xf, xi);
  const void *x = cfg.n_index ? (const void *)xi : (const void *)xf;
  dt_model *m = NULL;
  const char *bad = dt_model_zoo_new(name, &cfg, &m) != DT_OK || dt_model_build(m, MAX_BATCH, 1) != DT_OK ? "build"
                                                                                                        : NULL;
  /* f32 on part of the context's batch, trained first; bf16 on all of it, evaluated first */
  static const pass passes[2] = {{DT_AMP_OFF, BATCH, 0}, {DT_AMP_BF16, MAX_BATCH, 1}};
  for (int i = 0; i < 2 && !bad; i++) {
    const char *mode = passes[i].amp ? "bf16" : "f32";
    size_t na = 0, nb = 0;
    dt_clear_error(); /* what follows a failure then names only its own */
    bad = run_pass(m, x, &passes[i], 2, e->a, &na);
    if (!bad) bad = run_pass(m, x, &passes[i], 1, e->b, &nb);
    if (bad) fprintf(stderr, "  %s (%s): %s: %s\n", name, mode, bad, dt_last_error());
    for (size_t k = 0; !bad && k < na; k++)
      if (na != nb || memcmp(&e->a[k], &e->b[k], sizeof(float)) || !isfinite(e->a[k])) {
        fprintf(stderr, "  %s (%s): value %zu of %zu is %g with unset memory poisoned, %g with it zeroed\n", name,
                mode, k, na, (double)e->b[k], (double)e->a[k]);
        bad = "differs";
      }
  }
  dt_model_free(m);
  if (bad) *e->failed = 1;
}

TEST(no_layer_reads_unset_memory_before_writing_it) {
  each_ctx e = {.failed = dt_test_failed_};
  dt_set_threads(1); /* both runs of a pass alike; one thread spares the oversubscribed CI cores */
  ASSERT_OK(dt_alloc_array_unset(MAX_VALUES, sizeof(float), "values", (void **)&e.a));
  ASSERT_OK(dt_alloc_array_unset(MAX_VALUES, sizeof(float), "values", (void **)&e.b));
  dt_model_zoo_each(check_model, &e);
  dt_free(e.a);
  dt_free(e.b);
  ASSERT(e.models >= 10);
}

/* The switch the test above stands on: poisoned, a block holds NaN and 3.4e38 in turn; zeroed, zeros. */
TEST(poison_fills_unset_blocks) {
  uint32_t *p = NULL;
  dt_alloc_poison_unset(1);
  ASSERT_OK(dt_alloc_array_unset(100, sizeof *p, "poisoned", (void **)&p));
  dt_alloc_poison_unset(0);
  for (int i = 0; i < 100; i++) ASSERT(p[i] == (i & 1 ? 0x7f7f7f7fu : 0xffffffffu));
  float f;
  memcpy(&f, &p[0], sizeof f);
  ASSERT(isnan(f));
  memcpy(&f, &p[1], sizeof f);
  ASSERT(f > 3e38f);
  dt_free(p);
  dt_alloc_poison_unset(2);
  ASSERT_OK(dt_alloc_array_unset(100, sizeof *p, "zeroed", (void **)&p));
  dt_alloc_poison_unset(0);
  for (int i = 0; i < 100; i++) ASSERT(p[i] == 0);
  dt_free(p);
}

TEST_MAIN(TEST_ENTRY(poison_fills_unset_blocks), TEST_ENTRY(no_layer_reads_unset_memory_before_writing_it))

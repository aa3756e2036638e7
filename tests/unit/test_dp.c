/* Tests of DataParallel (dt_dp): equivalence with whole-batch training, slicing, inference, BN buffers, errors, threads. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/impl.h"
#include "dtrain/parallel.h"
#include "dtrain/loss.h"
#include "harness.h"

#define CLASSES 10
#define MAX_BATCH 8
static const int64_t SAMPLE[3] = {1, 8, 8}; /* (C, H, W) */
#define SAMPLE_NUMEL 64

/* A classification step with label smoothing eps through dt_dp_train_step; top-1/top-5 counts as before. */
static dt_status dp_step(dt_dp *dp, const float *x, const int32_t *y, int batch, float eps, float *loss, int64_t *top1,
                         int64_t *top5) {
  dt_task_config tc = {.kind = DT_TASK_CLASSIFICATION, .outputs = CLASSES, .label_smoothing = eps};
  dt_task *t = NULL;
  DT_CHECK(dt_task_new(&tc, &t));
  double sums[DT_TASK_MAX_SUMS] = {0};
  dt_status st = dt_dp_train_step(dp, t, x, y, batch, loss, sums);
  dt_task_free(t);
  if (top1) *top1 = (int64_t)sums[0];
  if (top5) *top5 = (int64_t)sums[1];
  return st;
}

typedef enum model_kind { MLP, MLP_DROPOUT, CONV, CONV_BN, MLP_WIDE } model_kind;

static dt_status build_model(model_kind kind, int max_batch, dt_model **out) {
  dt_model *m = NULL;
  dt_status st = DT_OK;
  if (kind == MLP || kind == MLP_DROPOUT || kind == MLP_WIDE) {
    static const int hidden[] = {32, 16}, wide[] = {512, 64}; /* wide: 67k parameters, many 4096-float blocks */
    dt_zoo_config cfg = {.ndim = 3, .input_shape = {1, 8, 8}, .outputs = CLASSES,
                         .hidden = kind == MLP_WIDE ? wide : hidden, .n_hidden = 2,
                         .dropout = kind == MLP_DROPOUT ? 0.3f : 0.0f};
    DT_CHECK_GOTO(dt_model_zoo_new("mlp", &cfg, &m), st, fail);
  } else {
    DT_CHECK_GOTO(dt_model_new(3, SAMPLE, &m), st, fail);
    DT_CHECK_GOTO(dt_model_add_conv2d(m, "conv", 4, 3, 1, 1, 1), st, fail); /* (4, 8, 8) */
    if (kind == CONV_BN) DT_CHECK_GOTO(dt_model_add_batchnorm2d(m, "bn", 1e-5f, 0.1f), st, fail);
    DT_CHECK_GOTO(dt_model_add_activation(m, "relu", DT_RELU), st, fail);
    DT_CHECK_GOTO(dt_model_add_maxpool2d(m, "pool", 2, 2, 0), st, fail); /* (4, 4, 4) */
    DT_CHECK_GOTO(dt_model_add_flatten(m, "flat"), st, fail);
    DT_CHECK_GOTO(dt_model_add_linear(m, "fc", CLASSES, 1), st, fail);
  }
  DT_CHECK_GOTO(dt_model_build(m, max_batch, 1234), st, fail);
  *out = m;
  return DT_OK;
fail:
  dt_model_free(m);
  return st;
}

/* x (n, 64) uniform in [-1, 1), labels below CLASSES; a different draw for each seed. */
static void make_batch(float *x, int32_t *y, int n, uint64_t seed) {
  dt_rng r;
  dt_rng_init(&r, seed, 7);
  for (int i = 0; i < n * SAMPLE_NUMEL; i++) x[i] = dt_rng_uniform_range(&r, -1, 1);
  for (int i = 0; i < n; i++) y[i] = (int32_t)dt_rng_below(&r, CLASSES);
}

/* One plain step on the model's own context: zero, forward, loss, backward. */
static dt_status plain_step(dt_model *m, const float *x, const int32_t *y, int batch, float *loss, int64_t *top1) {
  float dlogits[MAX_BATCH * CLASSES];
  const float *logits = NULL;
  dt_model_zero_grad(m);
  DT_CHECK(dt_model_forward(m, x, batch, &logits));
  DT_CHECK(dt_loss_cross_entropy(logits, y, batch, CLASSES, 0.1f, loss, dlogits));
  dt_topk_correct(logits, y, batch, CLASSES, 1, top1, NULL);
  return dt_model_backward(m, dlogits);
}

/* max |a - b| over max |b|: the error relative to the tensor's scale. */
static double rel_diff(const float *a, const float *b, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    err = fmax(err, fabs((double)a[i] - b[i]));
    scale = fmax(scale, fabs((double)b[i]));
  }
  return err / fmax(scale, 1e-30);
}

/* Trains two copies of the model 5 SGD (momentum) steps, one plainly and one with `workers` DP workers, on
 * batches of `batch`; returns the largest relative parameter difference (or -1 on a failed call). With
 * bitwise set, every loss must match exactly too. */
static double train_both(int *dt_test_failed_, model_kind kind, int workers, int batch, int bitwise) {
  dt_model *a = NULL, *b = NULL;
  dt_dp *dp = NULL;
  dt_optim *oa = NULL, *ob = NULL;
  double worst = -1;
  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_SGD, &oc);
  oc.momentum = 0.9f;
  if (build_model(kind, MAX_BATCH, &a) != DT_OK || build_model(kind, MAX_BATCH, &b) != DT_OK ||
      dt_dp_new(b, workers, MAX_BATCH, &dp) != DT_OK || dt_optim_new(&oc, dt_model_num_params(a), &oa) != DT_OK ||
      dt_optim_new(&oc, dt_model_num_params(b), &ob) != DT_OK) {
    fprintf(stderr, "  setup failed: %s\n", dt_last_error());
    *dt_test_failed_ = 1;
    goto done;
  }
  size_t n = 0;
  float *pa = dt_model_params(a, &n), *pb = dt_model_params(b, NULL);
  float *ga = dt_model_grads(a, NULL), *gb = dt_model_grads(b, NULL);
  worst = 0;
  for (int step = 0; step < 5; step++) {
    float x[MAX_BATCH * SAMPLE_NUMEL];
    int32_t y[MAX_BATCH];
    make_batch(x, y, batch, 100 + (uint64_t)step);
    float la = 0, lb = 0;
    int64_t t1a = -1, t1b = -1, t5b = -1;
    dt_status sa = plain_step(a, x, y, batch, &la, &t1a);
    for (size_t i = 0; i < n; i++) gb[i] = NAN; /* stale floats a deferred zero_grad leaves: the reduce clears them */
    dt_model_zero_grad_deferred(b);
    dt_status sb = dp_step(dp, x, y, batch, 0.1f, &lb, &t1b, &t5b);
    if (sa != DT_OK || sb != DT_OK) {
      fprintf(stderr, "  step %d: %s / %s: %s\n", step, dt_status_name(sa), dt_status_name(sb), dt_last_error());
      *dt_test_failed_ = 1;
      worst = -1;
      goto done;
    }
    if (bitwise ? la != lb : fabs(la - lb) > 1e-5 * fabs(la)) {
      fprintf(stderr, "  step %d: loss %.9g plain vs %.9g dp (workers %d)\n", step, la, lb, workers);
      *dt_test_failed_ = 1;
    }
    if (t1a != t1b || t5b < t1b || t5b > batch) {
      fprintf(stderr, "  step %d: top-1 %lld plain vs %lld dp, top-5 %lld\n", step, (long long)t1a,
              (long long)t1b, (long long)t5b);
      *dt_test_failed_ = 1;
    }
    if (dt_optim_step(oa, pa, ga, 0.1f) != DT_OK || dt_optim_step(ob, pb, gb, 0.1f) != DT_OK) {
      *dt_test_failed_ = 1;
      goto done;
    }
  }
  worst = bitwise ? (memcmp(pa, pb, n * sizeof(float)) == 0 ? 0 : 1) : rel_diff(pb, pa, n);
done:
  dt_optim_free(ob);
  dt_optim_free(oa);
  dt_dp_free(dp);
  dt_model_free(b);
  dt_model_free(a);
  return worst;
}

TEST(equivalent_to_whole_batch_mlp_and_conv) {
  const model_kind kinds[] = {MLP, CONV};
  const int workers[] = {2, 3};
  for (int k = 0; k < 2; k++)
    for (int w = 0; w < 2; w++) {
      double rel = train_both(dt_test_failed_, kinds[k], workers[w], MAX_BATCH, 0);
      if (*dt_test_failed_) FAIL_("model %d, workers %d: a step differed (above)", (int)kinds[k], workers[w]);
      if (!(rel >= 0 && rel <= 1e-5)) FAIL_("model %d, workers %d: parameters differ by rel %.3g", (int)kinds[k],
                                            workers[w], rel);
    }
}

TEST(one_worker_is_plain_training_bit_for_bit) {
  /* dropout too: worker 0 draws the masks of the model's own context (stream 0, same step count) */
  const model_kind kinds[] = {MLP, CONV, MLP_DROPOUT, CONV_BN};
  for (int k = 0; k < 4; k++) {
    double diff = train_both(dt_test_failed_, kinds[k], 1, MAX_BATCH, 1);
    if (*dt_test_failed_) FAIL_("model %d: a step differed (above)", (int)kinds[k]);
    if (diff != 0) FAIL_("model %d: parameters are not bit-identical", (int)kinds[k]);
  }
}

TEST(uneven_and_tiny_batches) {
  const struct {
    model_kind kind;
    int workers, batch;
  } cases[] = {{MLP, 3, 7}, {CONV, 3, 7}, {MLP, 4, 2}, {CONV, 4, 2}, {MLP, 5, 1}};
  for (int c = 0; c < 5; c++) {
    double rel = train_both(dt_test_failed_, cases[c].kind, cases[c].workers, cases[c].batch, 0);
    if (*dt_test_failed_) FAIL_("case %d: a step differed (above)", c);
    if (!(rel >= 0 && rel <= 1e-5)) FAIL_("case %d: parameters differ by rel %.3g", c, rel);
  }
}

TEST(gradients_accumulate_into_the_arena) {
  dt_model *m = NULL;
  dt_dp *dp = NULL;
  ASSERT_OK(build_model(MLP, MAX_BATCH, &m));
  ASSERT_OK(dt_dp_new(m, 3, MAX_BATCH, &dp));
  float x[MAX_BATCH * SAMPLE_NUMEL];
  int32_t y[MAX_BATCH];
  make_batch(x, y, MAX_BATCH, 5);
  size_t n = 0;
  float *g = dt_model_grads(m, &n);
  dt_model_zero_grad(m);
  ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL));
  float *once = malloc(n * sizeof(float));
  ASSERT(once);
  memcpy(once, g, n * sizeof(float));
  ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL)); /* no zero_grad: adds */
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    err = fmax(err, fabs(g[i] - 2.0 * once[i]));
    scale = fmax(scale, fabs(once[i]));
  }
  free(once);
  dt_dp_free(dp);
  dt_model_free(m);
  ASSERT(scale > 0);
  ASSERT(err <= 1e-6 * scale);
}

/* After a deferred zero_grad the reduce stores the workers' sum over the stale arena (the bits an eager zero_grad
 * and an add give); a second step without zero_grad adds to it; with nothing deferred (the arena read, hence
 * cleared) it adds to the zeros. Two workers (no partial sums) and three (one partial sum), mlp and conv. */
TEST(a_deferred_zero_grad_is_overwritten_then_added_to) {
  const model_kind kinds[] = {MLP, CONV};
  for (int k = 0; k < 2; k++)
    for (int workers = 2; workers <= 3; workers++) {
      dt_model *m = NULL;
      dt_dp *dp = NULL;
      ASSERT_OK(build_model(kinds[k], MAX_BATCH, &m));
      ASSERT_OK(dt_dp_new(m, workers, MAX_BATCH, &dp));
      float x[MAX_BATCH * SAMPLE_NUMEL];
      int32_t y[MAX_BATCH];
      make_batch(x, y, MAX_BATCH, 9);
      size_t n = 0;
      float *g = dt_model_grads(m, &n), *once = malloc(n * sizeof(float));
      ASSERT(once);
      dt_model_zero_grad(m);
      ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL));
      memcpy(once, g, n * sizeof(float));
      size_t stored = 0, added = 0, onto_zeros = 0, nonzero = 0;
      for (size_t i = 0; i < n; i++) g[i] = NAN;
      dt_model_zero_grad_deferred(m);
      ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL));
      for (size_t i = 0; i < n; i++) stored += g[i] == once[i], nonzero += once[i] != 0;
      ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL)); /* no zero_grad: adds */
      for (size_t i = 0; i < n; i++) added += g[i] == 2.0f * once[i];
      for (size_t i = 0; i < n; i++) g[i] = NAN;
      dt_model_zero_grad_deferred(m);
      (void)dt_model_grads(m, NULL); /* read: cleared, nothing deferred any more */
      ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL));
      for (size_t i = 0; i < n; i++) onto_zeros += g[i] == once[i];
      free(once);
      dt_dp_free(dp);
      dt_model_free(m);
      if (stored != n || added != n || onto_zeros != n || nonzero < n / 2)
        FAIL_("model %d, workers %d: %zu stored, %zu added, %zu onto zeros of %zu (%zu non-zero)", (int)kinds[k],
              workers, stored, added, onto_zeros, n, nonzero);
    }
}

/* One DP step of each copy: fused (the reduce left to the optimizer step) and not; `micro` train steps each
 * (accumulation: a fused copy's second train step sums the first's gradients first), of `batch` samples and one
 * fewer. Before the optimizer step the fused copy's arena must not hold the sums yet (*pending counts the steps
 * where it did not: the fused path was taken). Where the sums go straight into the update (one batch, no inference
 * between), the fused copy's arena is filled with NaN first and must come out of the step unwritten (*untouched
 * counts those steps). */
static dt_status fused_pair_step(dt_dp *const dp[2], dt_optim *const o[2], dt_model *const m[2], int step, int micro,
                                 int batch, int *pending, int *untouched) {
  size_t n = 0;
  float *g0 = dt_model_grads(m[0], &n);
  const float *g1 = dt_model_grads(m[1], NULL);
  const int direct = micro == 1 && step != 2;
  for (int c = 0; c < 2; c++) {
    dt_model_zero_grad_deferred(m[c]);
    if (c == 0 && direct)
      for (size_t i = 0; i < n; i++) g0[i] = NAN; /* the raw arena, behind the deferred zero */
    for (int k = 0; k < micro; k++) {
      float x[MAX_BATCH * SAMPLE_NUMEL];
      int32_t y[MAX_BATCH];
      make_batch(x, y, batch - k, 300 + 10 * (uint64_t)step + (uint64_t)k);
      DT_CHECK(dp_step(dp[c], x, y, batch - k, 0.0f, NULL, NULL, NULL));
    }
  }
  *pending += memcmp(g0, g1, n * sizeof *g0) != 0;
  if (step == 2) { /* an inference of another batch size between the two: the pending sum keeps its slices */
    float x[SAMPLE_NUMEL], out[CLASSES];
    int32_t y[1];
    make_batch(x, y, 1, 999);
    for (int c = 0; c < 2; c++) DT_CHECK(dt_dp_forward(dp[c], x, 1, out));
  }
  for (int c = 0; c < 2; c++) DT_CHECK(dt_dp_optim_step(dp[c], o[c], 0.05f));
  if (direct) {
    int nan = 1;
    for (size_t i = 0; i < n; i++) nan &= isnan(g0[i]);
    *untouched += nan;
  }
  return DT_OK;
}

/* Fused steps give the unfused bits (the parameters; the gradients where accumulation stored them, and after one
 * batch an arena that reads as zeroed, its sums never stored): a 67k-parameter mlp (many blocks a worker),
 * one with dropout and a conv with batch norm, 2 and 3 workers (a partial sum), SGD with momentum and weight
 * decay, Adam with weight decay and a no-decay table whose pieces cross the workers' shares, steps of one and of
 * two accumulated batches, an inference between a train step and its update; dt_dp_reduce leaves the sums in the
 * arena. */
TEST(fused_steps_give_the_unfused_bits) {
  const model_kind kinds[] = {MLP_WIDE, MLP_DROPOUT, CONV_BN};
  for (int k = 0; k < 3; k++)
    for (int workers = 1; workers <= 4; workers++)
      for (int kind = 0; kind < 2; kind++) {
        dt_model *m[2] = {NULL, NULL};
        dt_dp *dp[2] = {NULL, NULL};
        dt_optim *o[2] = {NULL, NULL};
        dt_optim_config oc;
        dt_optim_config_default(kind ? DT_OPTIM_ADAM : DT_OPTIM_SGD, &oc);
        oc.momentum = kind ? oc.momentum : 0.9f;
        oc.weight_decay = 0.01f;
        for (int c = 0; c < 2; c++) {
          ASSERT_OK(build_model(kinds[k], MAX_BATCH, &m[c]));
          ASSERT_OK(dt_dp_new(m[c], workers, MAX_BATCH, &dp[c]));
          ASSERT_OK(dt_optim_new(&oc, dt_model_num_params(m[c]), &o[c]));
          const size_t n = dt_model_num_params(m[c]);
          const dt_optim_range nd[2] = {{.lo = 3, .n = n / 3}, {.lo = n / 2, .n = n / 4}};
          if (kind) ASSERT_OK(dt_optim_set_no_decay(o[c], nd, 2));
        }
        dt_dp_set_fused_step(dp[0], 1);
        size_t n = 0;
        const float *p0 = dt_model_params(m[0], &n), *p1 = dt_model_params(m[1], NULL);
        const float *g0 = dt_model_grads(m[0], NULL), *g1 = dt_model_grads(m[1], NULL);
        int same = 1, pending = 0, zeroed = 1, untouched = 0;
        for (int step = 0; step < 5; step++) { /* step 4 after step 3's stored sums: the arena held them */
          const int micro = 1 + step % 2;
          /* step 4: 3 samples, fewer than 4 workers (the last without a slice), else 1 (only worker 0's) */
          ASSERT_OK(fused_pair_step(dp, o, m, step, micro, step == 4 ? (workers > 3 ? 3 : 1) : MAX_BATCH, &pending,
                                    &untouched));
          same &= memcmp(p0, p1, n * sizeof *p0) == 0;
          /* A step of one batch summed into the update and stored nothing: the arena reads as zeroed. Accumulated
           * batches were stored on the way, and so was step 2's, summed before its inference: as unfused. */
          const float *g = dt_model_grads(m[0], NULL);
          if (micro == 1 && step != 2)
            for (size_t i = 0; i < n; i++) zeroed &= g[i] == 0.0f;
          else
            same &= memcmp(g, g1, n * sizeof *g) == 0;
        }
        float x[MAX_BATCH * SAMPLE_NUMEL];
        int32_t y[MAX_BATCH];
        make_batch(x, y, MAX_BATCH, 77);
        for (int c = 0; c < 2; c++) {
          dt_model_zero_grad(m[c]);
          ASSERT_OK(dp_step(dp[c], x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL));
        }
        ASSERT_OK(dt_dp_reduce(dp[0]));
        const int reduced = memcmp(g0, g1, n * sizeof *g0) == 0;
        for (int c = 0; c < 2; c++) {
          dt_optim_free(o[c]);
          dt_dp_free(dp[c]);
          dt_model_free(m[c]);
        }
        if (!same || !reduced || pending != 5 || !zeroed || untouched != 2)
          FAIL_("model %d, %d workers, %s: %s", (int)kinds[k], workers, kind ? "adam" : "sgd",
                !same          ? "fused steps differ from unfused ones"
                : !reduced     ? "dt_dp_reduce left other sums"
                : !zeroed      ? "a fused step left the arena other than zeroed"
                : untouched != 2 ? "a fused step of one batch stored its sums in the arena"
                               : "a fused step summed before the optimizer step");
      }
}

/* After a fused step the arena reads as zeroed, to the plain optimizer step too: a second dt_dp_optim_step of SGD
 * without momentum or decay moves nothing (it took an earlier batch's sums from the unwritten arena before). */
TEST(an_update_after_a_fused_step_sees_zeroed_gradients) {
  dt_model *m = NULL;
  dt_dp *dp = NULL;
  dt_optim *o = NULL;
  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_SGD, &oc);
  oc.momentum = 0.0f, oc.weight_decay = 0.0f;
  ASSERT_OK(build_model(MLP, MAX_BATCH, &m));
  ASSERT_OK(dt_dp_new(m, 2, MAX_BATCH, &dp));
  ASSERT_OK(dt_optim_new(&oc, dt_model_num_params(m), &o));
  dt_dp_set_fused_step(dp, 1);
  float x[MAX_BATCH * SAMPLE_NUMEL];
  int32_t y[MAX_BATCH];
  for (int step = 0; step < 2; step++) { /* the first step's sums stored (dt_dp_reduce), the second's not */
    make_batch(x, y, MAX_BATCH, 1 + (uint64_t)step);
    dt_model_zero_grad_deferred(m);
    ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL));
    if (step == 0) ASSERT_OK(dt_dp_reduce(dp));
    ASSERT_OK(dt_dp_optim_step(dp, o, 0.1f));
  }
  size_t n = 0;
  const float *p = dt_model_params(m, &n);
  float *before = malloc(n * sizeof *before);
  ASSERT(before != NULL);
  memcpy(before, p, n * sizeof *before);
  ASSERT_OK(dt_dp_optim_step(dp, o, 0.1f));
  const int moved = memcmp(before, p, n * sizeof *p) != 0;
  free(before);
  dt_optim_free(o);
  dt_dp_free(dp);
  dt_model_free(m);
  ASSERT_EQ(moved, 0);
}

/* The batch's summed gradients of a fresh 67k-parameter mlp after one DP step with `workers` workers (fused or not),
 * clipped at max_norm by dt_dp_clip_grad_norm (by_workers) or by dt_clip_grad_norm on the arena; the norm in
 * *norm. A copy in out (n floats), or a failed call. */
static dt_status clipped_grads(int workers, int fused, int by_workers, float max_norm, float *out, size_t n,
                               float *norm) {
  float x[MAX_BATCH * SAMPLE_NUMEL];
  int32_t y[MAX_BATCH];
  make_batch(x, y, MAX_BATCH, 42);
  dt_model *m = NULL;
  dt_dp *dp = NULL;
  dt_status st = build_model(MLP_WIDE, MAX_BATCH, &m);
  if (st == DT_OK) st = dt_dp_new(m, workers, MAX_BATCH, &dp);
  if (st == DT_OK) {
    dt_dp_set_fused_step(dp, fused);
    dt_model_zero_grad_deferred(m);
    st = dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL);
  }
  if (st == DT_OK && by_workers) st = dt_dp_clip_grad_norm(dp, max_norm, norm);
  if (st == DT_OK && !by_workers) st = dt_dp_reduce(dp);
  size_t count = 0;
  float *g = st == DT_OK ? dt_model_grads(m, &count) : NULL;
  if (st == DT_OK && count != n) st = dt_error(DT_INTERNAL, "%zu gradients, expected %zu", count, n);
  if (st == DT_OK && !by_workers) st = dt_clip_grad_norm(g, count, max_norm, norm);
  if (st == DT_OK) memcpy(out, g, n * sizeof *out);
  dt_dp_free(dp);
  dt_model_free(m);
  return st;
}

/* dt_dp_clip_grad_norm gives dt_clip_grad_norm's norm and gradients bit for bit: 2 and 3 workers (the norm's 5
 * chunks shared unevenly), after a fused step's deferred sums and after an unfused one, where it clips and where it
 * does not; a max_norm of 0 is refused. */
TEST(clipping_by_the_workers_gives_the_bits) {
  dt_model *m = NULL;
  ASSERT_OK(build_model(MLP_WIDE, MAX_BATCH, &m));
  const size_t n = dt_model_num_params(m);
  dt_model_free(m);
  float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got), *raw = malloc(n * sizeof *raw);
  ASSERT(want && got && raw);
  for (int workers = 2; workers <= 3; workers++) {
    float norm_raw = 0;
    ASSERT_OK(clipped_grads(workers, 0, 0, INFINITY, raw, n, &norm_raw)); /* +inf only measures */
    for (int fused = 0; fused <= 1; fused++)
      for (int binds = 0; binds <= 1; binds++) {
        const float max_norm = binds ? norm_raw / 4 : norm_raw * 4;
        float norm_want = 0, norm_got = 0;
        ASSERT_OK(clipped_grads(workers, fused, 0, max_norm, want, n, &norm_want));
        ASSERT_OK(clipped_grads(workers, fused, 1, max_norm, got, n, &norm_got));
        ASSERT(memcmp(&norm_want, &norm_got, sizeof norm_got) == 0);
        ASSERT(memcmp(want, got, n * sizeof *got) == 0);
        ASSERT_EQ(memcmp(raw, got, n * sizeof *got) != 0, binds); /* it scaled where, and only where, it clips */
      }
  }
  dt_dp *dp = NULL;
  ASSERT_OK(build_model(MLP_WIDE, MAX_BATCH, &m));
  ASSERT_OK(dt_dp_new(m, 2, MAX_BATCH, &dp));
  ASSERT_EQ(dt_dp_clip_grad_norm(dp, 0.0f, NULL), DT_INVALID_ARGUMENT);
  dt_dp_free(dp);
  dt_model_free(m);
  free(want);
  free(got);
  free(raw);
}

/* Once warm, a DP step allocates nothing in dtrain: the train jobs, the fused reduce and update (Adam, a no-decay
 * table), an inference between steps, 2 and 3 workers, an mlp and a conv with batch norm. */
TEST(warm_steps_allocate_nothing) {
  const model_kind kinds[] = {MLP_WIDE, CONV_BN};
  for (int k = 0; k < 2; k++)
    for (int workers = 2; workers <= 3; workers++) {
      dt_model *m = NULL;
      dt_dp *dp = NULL;
      dt_optim *o = NULL;
      dt_task *t = NULL;
      dt_optim_config oc;
      dt_optim_config_default(DT_OPTIM_ADAM, &oc);
      const dt_task_config tc = {.kind = DT_TASK_CLASSIFICATION, .outputs = CLASSES};
      ASSERT_OK(build_model(kinds[k], MAX_BATCH, &m));
      ASSERT_OK(dt_dp_new(m, workers, MAX_BATCH, &dp));
      ASSERT_OK(dt_optim_new(&oc, dt_model_num_params(m), &o));
      const dt_optim_range nd = {.lo = 3, .n = dt_model_num_params(m) / 3};
      ASSERT_OK(dt_optim_set_no_decay(o, &nd, 1));
      ASSERT_OK(dt_task_new(&tc, &t));
      dt_dp_set_fused_step(dp, 1);
      uint64_t before = 0;
      for (int step = 0; step < 10; step++) {
        if (step == 4) before = dt_alloc_count();
        float x[MAX_BATCH * SAMPLE_NUMEL], out[MAX_BATCH * CLASSES], loss;
        int32_t y[MAX_BATCH];
        double sums[DT_TASK_MAX_SUMS] = {0};
        make_batch(x, y, MAX_BATCH, 500 + (uint64_t)step);
        dt_model_zero_grad_deferred(m);
        ASSERT_OK(dt_dp_train_step(dp, t, x, y, MAX_BATCH, &loss, sums));
        ASSERT_OK(dt_dp_optim_step(dp, o, 0.01f));
        ASSERT_OK(dt_dp_forward(dp, x, MAX_BATCH - 1, out));
      }
      const uint64_t allocs = dt_alloc_count() - before;
      dt_task_free(t);
      dt_optim_free(o);
      dt_dp_free(dp);
      dt_model_free(m);
      if (allocs) FAIL_("model %d, %d workers: %llu blocks allocated in steps 5-10", (int)kinds[k], workers,
                        (unsigned long long)allocs);
    }
}

/* The calling thread runs worker 0's part with the workers' share of OpenMP threads, and has its own setting back
 * after every job (its regions outside DP, the evaluation's, use the whole budget). Checked after an optimizer
 * step: after a train step OpenBLAS's thread reset (set_blas_for_workers) would set it back whatever DP did. */
TEST(the_calling_thread_keeps_its_openmp_threads) {
  const int budget = dt_get_threads();
  ASSERT_OK(dt_set_threads(4));
  const int own = omp_get_max_threads();
  dt_model *m = NULL;
  dt_dp *dp = NULL;
  ASSERT_OK(build_model(CONV, MAX_BATCH, &m));
  ASSERT_OK(dt_dp_new(m, 3, MAX_BATCH, &dp)); /* 4 / 3: one thread each */
  float x[MAX_BATCH * SAMPLE_NUMEL];
  int32_t y[MAX_BATCH];
  make_batch(x, y, MAX_BATCH, 11);
  ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL)); /* (its BLAS reset sets them back anyway) */
  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_SGD, &oc);
  dt_optim *o = NULL;
  ASSERT_OK(dt_optim_new(&oc, dt_model_num_params(m), &o));
  ASSERT_OK(dt_dp_optim_step(dp, o, 0.01f)); /* no BLAS call resets it behind us here */
  const int after = omp_get_max_threads();
  dt_optim_free(o);
  dt_dp_free(dp);
  dt_model_free(m);
  ASSERT_OK(dt_set_threads(budget));
  ASSERT(own == 4);
  ASSERT(after == own);
}

TEST(forward_equals_whole_batch_forward) {
  const model_kind kinds[] = {MLP, CONV, CONV_BN};
  for (int k = 0; k < 3; k++) {
    for (int workers = 2; workers <= 3; workers++) {
      dt_model *m = NULL;
      dt_dp *dp = NULL;
      ASSERT_OK(build_model(kinds[k], MAX_BATCH, &m));
      ASSERT_OK(dt_dp_new(m, workers, MAX_BATCH, &dp));
      dt_model_set_training(m, 0);
      float x[MAX_BATCH * SAMPLE_NUMEL], out[MAX_BATCH * CLASSES];
      int32_t y[MAX_BATCH];
      const float *want = NULL;
      for (int batch = 7; batch <= MAX_BATCH; batch++) {
        make_batch(x, y, batch, 40 + (uint64_t)batch);
        memset(out, 0xff, sizeof out); /* NaN: a row left unwritten fails */
        ASSERT_OK(dt_dp_forward(dp, x, batch, out));
        ASSERT_OK(dt_model_forward(m, x, batch, &want));
        double rel = rel_diff(out, want, (size_t)batch * CLASSES);
        if (!(rel <= 1e-6)) FAIL_("model %d, workers %d, batch %d: rel %.3g", (int)kinds[k], workers, batch, rel);
      }
      dt_dp_free(dp);
      dt_model_free(m);
    }
  }
}

TEST(batchnorm_statistics_come_from_worker_0) {
  dt_model *m = NULL, *ref = NULL, *whole = NULL;
  dt_dp *dp = NULL;
  ASSERT_OK(build_model(CONV_BN, MAX_BATCH, &m));
  ASSERT_OK(build_model(CONV_BN, MAX_BATCH, &ref));
  ASSERT_OK(build_model(CONV_BN, MAX_BATCH, &whole));
  ASSERT_OK(dt_dp_new(m, 2, MAX_BATCH, &dp));
  float x[MAX_BATCH * SAMPLE_NUMEL];
  int32_t y[MAX_BATCH];
  const float *logits;
  for (int step = 0; step < 2; step++) {
    make_batch(x, y, 7, 60 + (uint64_t)step); /* slices 4 and 3 */
    ASSERT_OK(dp_step(dp, x, y, 7, 0.0f, NULL, NULL, NULL));
    ASSERT_OK(dt_model_forward(ref, x, 4, &logits)); /* worker 0's slice alone */
    ASSERT_OK(dt_model_forward(whole, x, 7, &logits));
  }
  int irm, irv, inb;
  ASSERT_OK(dt_model_find_tensor(m, "bn.running_mean", &irm));
  ASSERT_OK(dt_model_find_tensor(m, "bn.running_var", &irv));
  ASSERT_OK(dt_model_find_tensor(m, "bn.num_batches_tracked", &inb));
  ASSERT_EQ(*(int64_t *)dt_model_tensor_data(m, inb), 2);
  for (int t = 0; t < 2; t++) {
    const int i = t ? irv : irm;
    const float *got = dt_model_tensor_data(m, i), *want = dt_model_tensor_data(ref, i),
                *all = dt_model_tensor_data(whole, i);
    ASSERT(rel_diff(got, want, 4) <= 1e-6);
    ASSERT(rel_diff(got, all, 4) > 1e-4); /* the whole batch's statistics would differ */
  }
  dt_dp_free(dp);
  dt_model_free(whole);
  dt_model_free(ref);
  dt_model_free(m);
}

/* A fill callback's source: the batch it copies slices from, which samples were asked for, and a slice that fails. */
typedef struct fill_src {
  const float *x;
  const int32_t *y;
  float *step_x;
  int32_t *step_y;
  int asked[MAX_BATCH]; /* times each sample was filled */
  int fail_from;        /* a slice starting here fails (-1: none) */
} fill_src;

static dt_status copy_slice(void *user, int lo, int n) {
  fill_src *f = user;
  if (lo == f->fail_from) return dt_error(DT_CORRUPT, "images/%d.png: not a PNG", lo);
  const size_t at = (size_t)lo * SAMPLE_NUMEL;
  memcpy(f->step_x + at, f->x + at, sizeof(float) * SAMPLE_NUMEL * (size_t)n);
  memcpy(f->step_y + lo, f->y + lo, sizeof(int32_t) * (size_t)n);
  for (int i = lo; i < lo + n; i++) __atomic_fetch_add(&f->asked[i], 1, __ATOMIC_RELAXED);
  return DT_OK;
}

/* Workers that fetch their own slices (dt_dp_set_fill) train on what a made batch gives, bit for bit; each sample is
 * fetched once, by the worker whose slice holds it; a failed fetch fails the step naming the worker and the file. */
TEST(workers_fill_their_own_slices) {
  dt_model *a = NULL, *b = NULL;
  dt_dp *da = NULL, *db = NULL;
  ASSERT_OK(build_model(MLP, MAX_BATCH, &a));
  ASSERT_OK(build_model(MLP, MAX_BATCH, &b));
  ASSERT_OK(dt_dp_new(a, 3, MAX_BATCH, &da));
  ASSERT_OK(dt_dp_new(b, 3, MAX_BATCH, &db));
  float x[MAX_BATCH * SAMPLE_NUMEL], step_x[MAX_BATCH * SAMPLE_NUMEL];
  int32_t y[MAX_BATCH], step_y[MAX_BATCH];
  fill_src f = {.x = x, .y = y, .step_x = step_x, .step_y = step_y, .fail_from = -1};
  dt_dp_set_fill(db, copy_slice, &f);
  const int batches[] = {MAX_BATCH, 7, 2};
  for (int k = 0; k < 3; k++) {
    const int batch = batches[k];
    make_batch(x, y, batch, 40 + (uint64_t)k);
    memset(step_x, 0xff, sizeof step_x); /* NaN until filled */
    memset(step_y, 0, sizeof step_y);
    memset(f.asked, 0, sizeof f.asked);
    float la = 0, lb = 0;
    int64_t ta = 0, tb = 0;
    dt_model_zero_grad(a);
    dt_model_zero_grad(b);
    ASSERT_OK(dp_step(da, x, y, batch, 0.0f, &la, &ta, NULL));
    ASSERT_OK(dp_step(db, step_x, step_y, batch, 0.0f, &lb, &tb, NULL));
    ASSERT(la == lb && ta == tb);
    size_t n = 0;
    const float *ga = dt_model_grads(a, &n), *gb = dt_model_grads(b, NULL);
    ASSERT(memcmp(ga, gb, n * sizeof(float)) == 0);
    for (int i = 0; i < MAX_BATCH; i++) ASSERT_EQ(f.asked[i], i < batch ? 1 : 0);
  }
  f.fail_from = 3; /* worker 1's slice of 8 over 3 workers: samples 3..5 */
  ASSERT_STATUS(dp_step(db, step_x, step_y, MAX_BATCH, 0.0f, NULL, NULL, NULL), DT_CORRUPT);
  ASSERT_MSG(strstr(dt_last_error(), "worker 1") && strstr(dt_last_error(), "images/3.png"), dt_last_error());
  dt_dp_set_fill(db, NULL, NULL); /* off again: the buffers are read as they are */
  f.fail_from = 0;
  ASSERT_OK(dp_step(db, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL));
  dt_dp_free(db);
  dt_dp_free(da);
  dt_model_free(b);
  dt_model_free(a);
}

TEST(argument_errors) {
  dt_model *m = NULL;
  dt_dp *dp = NULL;
  ASSERT_OK(build_model(MLP, MAX_BATCH, &m));
  ASSERT_STATUS(dt_dp_new(m, 0, MAX_BATCH, &dp), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "workers 0"));
  ASSERT_STATUS(dt_dp_new(m, -3, MAX_BATCH, &dp), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_dp_new(m, 2, 0, &dp), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "max_batch"));
  ASSERT_STATUS(dt_dp_new(NULL, 2, MAX_BATCH, &dp), DT_INVALID_ARGUMENT);
  ASSERT(dp == NULL);
  ASSERT_OK(dt_dp_new(m, 3, MAX_BATCH, &dp));
  float x[(MAX_BATCH + 1) * SAMPLE_NUMEL], out[(MAX_BATCH + 1) * CLASSES];
  int32_t y[MAX_BATCH + 1];
  make_batch(x, y, MAX_BATCH + 1, 9);
  ASSERT_STATUS(dp_step(dp, x, y, MAX_BATCH + 1, 0.0f, NULL, NULL, NULL), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "batch 9"));
  ASSERT_STATUS(dp_step(dp, x, y, 0, 0.0f, NULL, NULL, NULL), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_dp_forward(dp, x, MAX_BATCH + 1, out), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dp_step(dp, NULL, y, 4, 0.0f, NULL, NULL, NULL), DT_INVALID_ARGUMENT);
  /* A bad label in worker 2's slice: the error names the worker, and the gradients are left alone. */
  size_t n = 0;
  float *g = dt_model_grads(m, &n);
  dt_model_zero_grad(m);
  y[7] = CLASSES;
  ASSERT_STATUS(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL), DT_INVALID_ARGUMENT);
  ASSERT_MSG(strstr(dt_last_error(), "worker 2"), dt_last_error());
  for (size_t i = 0; i < n; i++) ASSERT(g[i] == 0.0f);
  y[7] = 0;
  ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL)); /* and it recovers */
  dt_dp_free(dp);
  dt_dp_free(NULL);
  dt_model_free(m);
}

static int thread_count(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  fclose(f);
  return n;
}

/* A budget of 4 on any machine: 2 workers get 2 OpenMP threads each, a share that, run on the calling thread,
 * would shrink its pool (3 threads after a whole-budget region) and show here as threads gone. */
TEST(no_thread_leak) {
  const int budget = dt_get_threads();
  ASSERT_OK(dt_set_threads(4));
  dt_model *m = NULL;
  ASSERT_OK(build_model(CONV, MAX_BATCH, &m));
  float x[MAX_BATCH * SAMPLE_NUMEL];
  int32_t y[MAX_BATCH];
  make_batch(x, y, MAX_BATCH, 3);
  /* a first round starts the OpenMP pool of this thread, which stays */
  dt_model_zero_grad(m);
  float loss;
  int64_t t1;
  ASSERT_OK(plain_step(m, x, y, MAX_BATCH, &loss, &t1));
  const int before = thread_count();
  ASSERT(before >= 1);
  for (int i = 0; i < 50; i++) {
    dt_dp *dp = NULL;
    ASSERT_OK(dt_dp_new(m, 1 + i % 4, MAX_BATCH, &dp));
    if (i % 5 == 0) ASSERT_OK(dp_step(dp, x, y, MAX_BATCH, 0.0f, NULL, NULL, NULL));
    dt_dp_free(dp);
  }
  /* OpenMP pools of finished worker threads wind down on their own: allow them a moment */
  int after = thread_count();
  for (int t = 0; t < 100 && after > before; t++) {
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    after = thread_count();
  }
  dt_model_free(m);
  ASSERT_OK(dt_set_threads(budget));
  ASSERT_EQ(after, before);
}

TEST_MAIN(TEST_ENTRY(equivalent_to_whole_batch_mlp_and_conv), TEST_ENTRY(one_worker_is_plain_training_bit_for_bit),
          TEST_ENTRY(uneven_and_tiny_batches), TEST_ENTRY(gradients_accumulate_into_the_arena),
          TEST_ENTRY(a_deferred_zero_grad_is_overwritten_then_added_to),
          TEST_ENTRY(the_calling_thread_keeps_its_openmp_threads),
          TEST_ENTRY(forward_equals_whole_batch_forward), TEST_ENTRY(batchnorm_statistics_come_from_worker_0),
          TEST_ENTRY(argument_errors), TEST_ENTRY(workers_fill_their_own_slices), TEST_ENTRY(no_thread_leak),
          TEST_ENTRY(fused_steps_give_the_unfused_bits),
          TEST_ENTRY(an_update_after_a_fused_step_sees_zeroed_gradients), TEST_ENTRY(warm_steps_allocate_nothing),
          TEST_ENTRY(clipping_by_the_workers_gives_the_bits))

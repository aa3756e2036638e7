/* Tests of src/optim: SGD/Adam/AdamW updates against hand-computed values, config checks, schedules, clipping. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/impl.h"
#include "harness.h"

/* Runs `steps` updates of a fresh optimizer on params (n) with grads[t] (n
 * each) at learning rate lr; leaves the optimizer in *out if out != NULL. */
static dt_status run_steps(const dt_optim_config *cfg, float *params, const float *grads, size_t n, int steps,
                           float lr, dt_optim **out) {
  dt_optim *o = NULL;
  dt_status st = dt_optim_new(cfg, n, &o);
  if (st != DT_OK) return st;
  for (int t = 0; t < steps && st == DT_OK; t++) st = dt_optim_step(o, params, grads + (size_t)t * n, lr);
  if (out && st == DT_OK)
    *out = o;
  else
    dt_optim_free(o);
  return st;
}

static dt_optim_config sgd(float momentum, float dampening, int nesterov, float wd) {
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_SGD, &c);
  c.momentum = momentum;
  c.dampening = dampening;
  c.nesterov = nesterov;
  c.weight_decay = wd;
  return c;
}

/* All SGD cases use powers of two, so every value below is exact in float. */
TEST(sgd_plain) {
  dt_optim_config c = sgd(0, 0, 0, 0);
  float p[2] = {1, -2};
  const float g[2 * 2] = {0.5f, 0.25f, 1, 1};
  dt_optim *o = NULL;
  ASSERT_OK(run_steps(&c, p, g, 2, 2, 0.5f, &o));
  /* step 1: p - 0.5 g = {0.75, -2.125}; step 2: {0.25, -2.625} */
  ASSERT(p[0] == 0.25f && p[1] == -2.625f);
  ASSERT_EQ(dt_optim_step_count(o), 2);
  ASSERT_EQ(dt_optim_num_states(o), 0); /* no buffer without momentum, as torch */
  dt_optim_free(o);
}

TEST(sgd_weight_decay) {
  dt_optim_config c = sgd(0, 0, 0, 0.5f);
  float p[2] = {1, -2};
  const float g[2 * 2] = {0.5f, 0.25f, 0, 0};
  ASSERT_OK(run_steps(&c, p, g, 2, 1, 0.5f, NULL));
  /* d = g + 0.5 p = {1, -0.75}; p -= 0.5 d */
  ASSERT(p[0] == 0.5f && p[1] == -1.625f);
  ASSERT_OK(run_steps(&c, p, g + 2, 2, 1, 0.5f, NULL));
  /* d = 0.5 p = {0.25, -0.8125} */
  ASSERT(p[0] == 0.375f && p[1] == -1.21875f);
}

TEST(sgd_momentum) {
  dt_optim_config c = sgd(0.5f, 0, 0, 0);
  float p[1] = {1};
  const float g[3] = {0.5f, 1, 0};
  dt_optim *o = NULL;
  ASSERT_OK(run_steps(&c, p, g, 1, 3, 0.5f, &o));
  /* buf 0.5 -> p 0.75; buf 0.25 + 1 = 1.25 -> p 0.125; buf 0.625 -> p -0.1875 */
  ASSERT(p[0] == -0.1875f);
  const char *name = NULL;
  ASSERT_EQ(dt_optim_num_states(o), 1);
  const float *buf = dt_optim_state(o, 0, &name);
  ASSERT_STR_EQ(name, "momentum_buffer");
  ASSERT(buf && buf[0] == 0.625f);
  ASSERT(dt_optim_state(o, 1, &name) == NULL && name == NULL);
  dt_optim_free(o);
}

TEST(sgd_dampening) {
  dt_optim_config c = sgd(0.5f, 0.5f, 0, 0);
  float p[1] = {1};
  const float g[3] = {0.5f, 1, 0};
  ASSERT_OK(run_steps(&c, p, g, 1, 3, 0.5f, NULL));
  /* first step takes g undamped: buf 0.5 -> p 0.75; buf 0.25 + 0.5 = 0.75 -> p 0.375;
   * buf 0.375 -> p 0.1875 */
  ASSERT(p[0] == 0.1875f);
}

TEST(sgd_nesterov) {
  dt_optim_config c = sgd(0.5f, 0, 1, 0);
  float p[1] = {1};
  const float g[2] = {0.5f, 1};
  ASSERT_OK(run_steps(&c, p, g, 1, 2, 0.5f, NULL));
  /* buf 0.5, d = 0.5 + 0.25 -> p 0.625; buf 1.25, d = 1 + 0.625 -> p -0.1875 */
  ASSERT(p[0] == -0.1875f);
}

/* Adam references: the update rule evaluated in double on paper (and checked
 * in Python), p0 = 1, grads 0.5, -1, 0.25, lr 0.1, betas (0.9, 0.999), eps 1e-8.
 * Step 1 is the classic lr-sized step: m_hat = g, v_hat = g^2. */
TEST(adam_three_steps) {
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_ADAM, &c);
  ASSERT(c.beta1 == 0.9f && c.beta2 == 0.999f && c.eps == 1e-8f && c.weight_decay == 0);
  const float g[3] = {0.5f, -1, 0.25f};
  const double want[3] = {0.900000002, 0.936610354, 0.950279420};
  float p[1] = {1};
  dt_optim *o = NULL;
  ASSERT_OK(dt_optim_new(&c, 1, &o));
  for (int t = 0; t < 3; t++) {
    ASSERT_OK(dt_optim_step(o, p, &g[t], 0.1f));
    ASSERT_NEAR(p[0], want[t], 1e-6);
  }
  const char *n0 = NULL, *n1 = NULL;
  ASSERT_EQ(dt_optim_num_states(o), 2);
  const float *m = dt_optim_state(o, 0, &n0), *v = dt_optim_state(o, 1, &n1);
  ASSERT_STR_EQ(n0, "exp_avg");
  ASSERT_STR_EQ(n1, "exp_avg_sq");
  ASSERT_NEAR(m[0], -0.0245, 1e-6);       /* 0.9 (0.9 * 0.05 - 0.1) + 0.025 */
  ASSERT_NEAR(v[0], 0.00131100025, 1e-7); /* 0.999 (0.999 * 0.00025 + 0.001) + 0.0000625 */
  ASSERT_EQ(dt_optim_step_count(o), 3);
  dt_optim_free(o);
}

TEST(adam_l2_weight_decay) {
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_ADAM, &c);
  c.weight_decay = 0.1f;
  const float g[3] = {0.5f, -1, 0.25f};
  const double want[3] = {0.900000002, 0.925263519, 0.924730574};
  float p[1] = {1};
  dt_optim *o = NULL;
  ASSERT_OK(dt_optim_new(&c, 1, &o));
  for (int t = 0; t < 3; t++) {
    ASSERT_OK(dt_optim_step(o, p, &g[t], 0.1f));
    ASSERT_NEAR(p[0], want[t], 1e-6);
  }
  dt_optim_free(o);
}

TEST(adamw_decoupled_weight_decay) {
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_ADAMW, &c);
  ASSERT(c.weight_decay == 0.01f);
  c.weight_decay = 0.1f;
  const float g[3] = {0.5f, -1, 0.25f};
  /* step 1: p (1 - 0.01) - 0.1 = 0.89; moments as for Adam without decay */
  const double want[3] = {0.890000002, 0.917710354, 0.922202317};
  float p[1] = {1};
  dt_optim *o = NULL;
  ASSERT_OK(dt_optim_new(&c, 1, &o));
  for (int t = 0; t < 3; t++) {
    ASSERT_OK(dt_optim_step(o, p, &g[t], 0.1f));
    ASSERT_NEAR(p[0], want[t], 1e-6);
  }
  dt_optim_free(o);
}

/* A long vector takes the parallel path (several threads, chunk edges); each
 * element must equal the same update done on a one-element vector. */
TEST(parallel_path_matches_elementwise) {
  const size_t n = 100003, period = 7;
  const dt_optim_kind kinds[3] = {DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW};
  float *p = NULL, *g = NULL;
  ASSERT_OK(dt_alloc_array(n, sizeof(float), "p", (void **)&p));
  ASSERT_OK(dt_alloc_array(n, sizeof(float), "g", (void **)&g));
  int bad = 0;
  for (int k = 0; k < 3; k++) {
    dt_optim_config c;
    dt_optim_config_default(kinds[k], &c);
    if (kinds[k] == DT_OPTIM_SGD) c = sgd(0.9f, 0, 1, 1e-3f);
    float ps[7], gs[7];
    for (size_t i = 0; i < period; i++) {
      ps[i] = 0.25f * (float)i - 0.75f;
      gs[i] = 0.1f * (float)i - 0.3f;
    }
    for (size_t i = 0; i < n; i++) p[i] = ps[i % period];
    dt_optim *big = NULL, *small[7] = {0};
    ASSERT_OK(dt_optim_new(&c, n, &big));
    for (size_t i = 0; i < period; i++) ASSERT_OK(dt_optim_new(&c, 1, &small[i]));
    for (int t = 0; t < 3; t++) {
      for (size_t i = 0; i < n; i++) g[i] = gs[i % period] * (float)(t + 1);
      ASSERT_OK(dt_optim_step(big, p, g, 0.01f));
      for (size_t i = 0; i < period; i++) {
        float gi = gs[i] * (float)(t + 1);
        ASSERT_OK(dt_optim_step(small[i], &ps[i], &gi, 0.01f));
      }
    }
    for (size_t i = 0; i < n; i++) bad += memcmp(&p[i], &ps[i % period], sizeof(float)) != 0;
    dt_optim_free(big);
    for (size_t i = 0; i < period; i++) dt_optim_free(small[i]);
  }
  dt_free(g);
  dt_free(p);
  ASSERT_EQ(bad, 0);
}

/* Resuming from saved state and step count continues bit for bit. */
TEST(resume_from_state_is_exact) {
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_ADAMW, &c);
  const float g[3 * 3] = {0.5f, -1, 0.25f, 0.1f, 0.2f, -0.3f, 2, -2, 0.5f};
  float a[3] = {1, 2, 3}, b[3] = {1, 2, 3};
  ASSERT_OK(run_steps(&c, a, g, 3, 3, 0.05f, NULL));
  dt_optim *first = NULL, *second = NULL;
  ASSERT_OK(run_steps(&c, b, g, 3, 2, 0.05f, &first));
  ASSERT_OK(dt_optim_new(&c, 3, &second));
  for (int i = 0; i < dt_optim_num_states(first); i++)
    memcpy(dt_optim_state(second, i, NULL), dt_optim_state(first, i, NULL), 3 * sizeof(float));
  dt_optim_set_step_count(second, dt_optim_step_count(first));
  ASSERT_OK(dt_optim_step(second, b, g + 6, 0.05f));
  ASSERT(memcmp(a, b, sizeof a) == 0);
  ASSERT_EQ(dt_optim_step_count(second), 3);
  dt_optim_free(first);
  dt_optim_free(second);
}

TEST(invalid_configs_are_rejected) {
  dt_optim *o = (dt_optim *)0x1;
  dt_optim_config c = sgd(0, 0, 1, 0);
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "nesterov") != NULL);
  c = sgd(0.9f, 0.1f, 1, 0);
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "dampening") != NULL);
  c = sgd(-0.1f, 0, 0, 0);
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "momentum") != NULL);
  c = sgd(0, 0, 0, -1e-4f);
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "weight_decay") != NULL);
  c = sgd(NAN, 0, 0, 0);
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);

  dt_optim_config_default(DT_OPTIM_ADAM, &c);
  c.beta1 = 1.0f;
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "beta1") != NULL);
  dt_optim_config_default(DT_OPTIM_ADAMW, &c);
  c.beta2 = -0.1f;
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "beta2") != NULL);
  dt_optim_config_default(DT_OPTIM_ADAM, &c);
  c.eps = -1e-8f;
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "eps") != NULL);
  c.eps = 1e-8f;
  c.kind = (dt_optim_kind)7;
  ASSERT_STATUS(dt_optim_new(&c, 4, &o), DT_INVALID_ARGUMENT);
  ASSERT(o == (dt_optim *)0x1); /* output untouched on failure */

  /* the learning rate is checked per step; a rejected step changes nothing */
  dt_optim_config_default(DT_OPTIM_ADAM, &c);
  ASSERT_OK(dt_optim_new(&c, 1, &o));
  float p = 1, g = 1;
  ASSERT_STATUS(dt_optim_step(o, &p, &g, -0.1f), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "learning rate") != NULL);
  ASSERT_STATUS(dt_optim_step(o, &p, &g, NAN), DT_INVALID_ARGUMENT);
  ASSERT(p == 1 && dt_optim_step_count(o) == 0);
  dt_optim_free(o);
  dt_optim_free(NULL);
}

TEST(kind_names_parse_and_print) {
  dt_optim_kind k = DT_OPTIM_SGD;
  ASSERT_OK(dt_optim_kind_parse("adamw", &k));
  ASSERT_EQ(k, DT_OPTIM_ADAMW);
  ASSERT_OK(dt_optim_kind_parse("adam", &k));
  ASSERT_EQ(k, DT_OPTIM_ADAM);
  ASSERT_OK(dt_optim_kind_parse("sgd", &k));
  ASSERT_EQ(k, DT_OPTIM_SGD);
  ASSERT_STATUS(dt_optim_kind_parse("Adam ", &k), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "sgd, adam, adamw") != NULL);
  ASSERT_EQ(k, DT_OPTIM_SGD);
  ASSERT_STR_EQ(dt_optim_kind_name(DT_OPTIM_ADAM), "adam");
  ASSERT_STR_EQ(dt_optim_kind_name((dt_optim_kind)9), "unknown");
  dt_sched_kind s = DT_SCHED_CONSTANT;
  ASSERT_OK(dt_sched_kind_parse("cosine", &s));
  ASSERT_EQ(s, DT_SCHED_COSINE);
  ASSERT_OK(dt_sched_kind_parse("linear", &s));
  ASSERT_EQ(s, DT_SCHED_LINEAR);
  ASSERT_STATUS(dt_sched_kind_parse("Linear", &s), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "cosine, linear") != NULL);
  ASSERT_STR_EQ(dt_sched_kind_name(DT_SCHED_STEP), "step");
}

static dt_lr_schedule sched(dt_sched_kind kind, float base) {
  dt_lr_schedule s;
  memset(&s, 0, sizeof s);
  s.kind = kind;
  s.base_lr = base;
  s.warmup_start = 1.0f / 3.0f;
  return s;
}

TEST(schedule_constant_and_step) {
  dt_lr_schedule s = sched(DT_SCHED_CONSTANT, 0.1f);
  ASSERT_OK(dt_lr_schedule_check(&s));
  ASSERT(dt_lr_at(&s, 0) == 0.1f && dt_lr_at(&s, 1000000) == 0.1f);
  s = sched(DT_SCHED_STEP, 1.0f);
  s.step_size = 3;
  s.gamma = 0.5f;
  ASSERT_OK(dt_lr_schedule_check(&s));
  const int64_t at[] = {0, 2, 3, 5, 6, 9, 31};
  const float want[] = {1, 1, 0.5f, 0.5f, 0.25f, 0.125f, 1.0f / 1024};
  for (int i = 0; i < 7; i++) ASSERT(dt_lr_at(&s, at[i]) == want[i]);
}

TEST(schedule_cosine_and_warmup) {
  dt_lr_schedule s = sched(DT_SCHED_COSINE, 1.0f);
  s.total_steps = 4;
  ASSERT_OK(dt_lr_schedule_check(&s));
  ASSERT(dt_lr_at(&s, 0) == 1.0f);
  ASSERT(dt_lr_at(&s, 1) == (float)((1 + cos(M_PI / 4)) / 2)); /* 0.8535534 */
  ASSERT(dt_lr_at(&s, 2) == 0.5f);
  ASSERT(dt_lr_at(&s, 4) == 0.0f);
  ASSERT(dt_lr_at(&s, 10) == 0.0f); /* stays at min_lr after T */

  s = sched(DT_SCHED_CONSTANT, 1.0f);
  s.warmup_steps = 4;
  s.warmup_start = 0.25f;
  ASSERT_OK(dt_lr_schedule_check(&s));
  const float lin[] = {0.25f, 0.4375f, 0.625f, 0.8125f, 1, 1};
  for (int t = 0; t < 6; t++) ASSERT(dt_lr_at(&s, t) == lin[t]);

  /* warm-up, then cosine from its own step 0 down to min_lr */
  s = sched(DT_SCHED_COSINE, 1.0f);
  s.warmup_steps = 2;
  s.warmup_start = 0.5f;
  s.total_steps = 4;
  s.min_lr = 0.2f;
  ASSERT_OK(dt_lr_schedule_check(&s));
  ASSERT(dt_lr_at(&s, 0) == 0.5f);
  ASSERT(dt_lr_at(&s, 1) == 0.75f);
  ASSERT(dt_lr_at(&s, 2) == 1.0f);
  ASSERT(dt_lr_at(&s, 4) == (float)(0.2 + 0.8 * 0.5));
  ASSERT(dt_lr_at(&s, 6) == 0.2f);
  ASSERT(dt_lr_at(&s, 1000) == 0.2f);
}

TEST(schedule_check_names_the_field) {
  struct {
    dt_lr_schedule s;
    const char *field;
  } bad[8];
  for (int i = 0; i < 8; i++) bad[i].s = sched(DT_SCHED_STEP, 0.1f), bad[i].s.step_size = 1, bad[i].s.gamma = 0.5f;
  bad[0].s.base_lr = -1, bad[0].field = "base_lr";
  bad[1].s.step_size = 0, bad[1].field = "step_size";
  bad[2].s.gamma = 0, bad[2].field = "gamma";
  bad[3].s.warmup_steps = -1, bad[3].field = "warmup_steps";
  bad[4].s.warmup_steps = 5, bad[4].s.warmup_start = 0, bad[4].field = "warmup_start";
  bad[5].s.kind = DT_SCHED_COSINE, bad[5].field = "total_steps";
  bad[6].s.kind = DT_SCHED_COSINE, bad[6].s.total_steps = 10, bad[6].s.min_lr = 0.5f, bad[6].field = "min_lr";
  bad[7].s.kind = (dt_sched_kind)5, bad[7].field = "constant, step, cosine";
  for (int i = 0; i < 8; i++) {
    ASSERT_STATUS(dt_lr_schedule_check(&bad[i].s), DT_INVALID_ARGUMENT);
    if (!strstr(dt_last_error(), bad[i].field)) FAIL_("case %d: \"%s\" lacks %s", i, dt_last_error(), bad[i].field);
  }
  ASSERT_STATUS(dt_lr_schedule_check(NULL), DT_INVALID_ARGUMENT);
}

/* transformers' get_linear_schedule_with_warmup: from 0 over the warm-up, to 0 at total_steps, warm-up included. */
TEST(schedule_linear_as_transformers) {
  dt_lr_schedule s = sched(DT_SCHED_LINEAR, 1.0f);
  s.warmup_steps = 2;
  s.total_steps = 6;
  s.warmup_start = 0; /* unused by linear: not checked */
  ASSERT_OK(dt_lr_schedule_check(&s));
  const float want[] = {0, 0.5f, 1, 0.75f, 0.5f, 0.25f, 0, 0};
  for (int t = 0; t < 8; t++)
    if (dt_lr_at(&s, t) != want[t]) FAIL_("step %d: lr %g, want %g", t, (double)dt_lr_at(&s, t), (double)want[t]);
  s.warmup_steps = 0;
  s.total_steps = 4;
  const float decay[] = {1, 0.75f, 0.5f, 0.25f, 0};
  for (int t = 0; t < 5; t++) ASSERT(dt_lr_at(&s, t) == decay[t]);
  /* a warm-up as long as the run: transformers' max(1, total - warmup) keeps it finite */
  s.warmup_steps = 4;
  ASSERT(dt_lr_at(&s, 2) == 0.5f && dt_lr_at(&s, 4) == 0.0f && dt_lr_at(&s, 5) == 0.0f);
  s.total_steps = 0;
  ASSERT_STATUS(dt_lr_schedule_check(&s), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "num_training_steps") != NULL);
}

/* A step in parts (DataParallel's workers take one each), or in ranges of any length (dt_optim_step_range, odd
 * tiles taken from the end; with shared parameters too, stepped in copies and streamed back from unaligned starts),
 * is dt_optim_step's update bit for bit: every kind, with and without a no-decay table, 1 to 5 parts, over 3 steps
 * (the step count advances once a step). */
TEST(step_in_parts_equals_one_step) {
  const size_t n = 50021;
  const dt_optim_range nd[2] = {{3, 5}, {8190, 9000}};
  float *p[4] = {NULL, NULL, NULL, NULL}, *g = NULL;
  for (int s = 0; s < 4; s++) ASSERT_OK(dt_alloc_array(n, sizeof(float), "p", (void **)&p[s]));
  ASSERT_OK(dt_alloc_array(n, sizeof(float), "g", (void **)&g));
  const dt_optim_kind kinds[3] = {DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW};
  for (int k = 0; k < 3; k++)
    for (int table = 0; table < 2; table++)
      for (int parts = 1; parts <= 5; parts++) {
        dt_optim_config c;
        dt_optim_config_default(kinds[k], &c);
        if (kinds[k] == DT_OPTIM_SGD) c = sgd(0.9f, 0, 0, 0);
        c.weight_decay = 0.05f;
        dt_optim *o[4] = {NULL, NULL, NULL, NULL};
        for (int s = 0; s < 4; s++) {
          ASSERT_OK(dt_optim_new(&c, n, &o[s]));
          if (table) ASSERT_OK(dt_optim_set_no_decay(o[s], nd, 2));
          for (size_t i = 0; i < n; i++) p[s][i] = 0.5f - (float)(i % 97) / 97.0f;
        }
        dt_optim_set_shared_params(o[3], 1);
        for (int step = 0; step < 3; step++) {
          for (size_t i = 0; i < n; i++) g[i] = (float)((i * 31 + (size_t)step * 7) % 101) / 50.0f - 1.0f;
          ASSERT_OK(dt_optim_step(o[0], p[0], g, 0.01f));
          ASSERT_OK(dt_optim_begin_step(o[1], 0.01f));
          for (int part = parts - 1; part >= 0; part--) dt_optim_step_part(o[1], p[1], g, 0.01f, part, parts);
          ASSERT_OK(dt_optim_begin_step(o[2], 0.01f));
          const size_t tile = 997 * (size_t)parts;
          for (size_t hi = n; hi > 0; hi = hi > tile ? hi - tile : 0)
            dt_optim_step_range(o[2], p[2], g, 0.01f, hi > tile ? hi - tile : 0, hi);
          ASSERT_OK(dt_optim_begin_step(o[3], 0.01f));
          const size_t big = 4999 * (size_t)parts; /* more than one copy's block, starting anywhere in a line */
          for (size_t lo = 0; lo < n; lo += big) dt_optim_step_range(o[3], p[3], g, 0.01f, lo, lo + big);
        }
        if (memcmp(p[0], p[1], n * sizeof(float)) != 0)
          FAIL_("kind %d, table %d, %d parts: the parts' update differs", k, table, parts);
        if (memcmp(p[0], p[2], n * sizeof(float)) != 0)
          FAIL_("kind %d, table %d, tiles of %d: the ranges' update differs", k, table, 997 * parts);
        if (memcmp(p[0], p[3], n * sizeof(float)) != 0)
          FAIL_("kind %d, table %d, tiles of %d: the shared parameters' update differs", k, table, 4999 * parts);
        ASSERT_EQ(dt_optim_step_count(o[1]), 3);
        for (int s = 0; s < 4; s++) dt_optim_free(o[s]);
      }
  for (int s = 0; s < 4; s++) dt_free(p[s]);
  dt_free(g);
}

/* With a no-decay table every element gets the update of a one-element optimizer with the configured weight
 * decay, or with none inside the ranges: bit for bit, across pieces, chunk edges and threads. */
TEST(no_decay_ranges_match_two_groups) {
  const size_t n = 50021;
  const dt_optim_range ranges[3] = {{40000, 10021}, {3, 5}, {8190, 9000}}; /* unsorted, touching the end */
  float *p = NULL, *g = NULL, *want = NULL;
  ASSERT_OK(dt_alloc_array(n, sizeof(float), "p", (void **)&p));
  ASSERT_OK(dt_alloc_array(n, sizeof(float), "g", (void **)&g));
  ASSERT_OK(dt_alloc_array(n, sizeof(float), "want", (void **)&want));
  const dt_optim_kind kinds[3] = {DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW};
  int bad = 0;
  for (int k = 0; k < 3; k++) {
    dt_optim_config c[2]; /* [0] no decay, [1] decay */
    dt_optim_config_default(kinds[k], &c[1]);
    if (kinds[k] == DT_OPTIM_SGD) c[1] = sgd(0.9f, 0, 0, 0);
    c[1].weight_decay = 0.1f;
    c[0] = c[1];
    c[0].weight_decay = 0;
    dt_optim *big = NULL, *one[2] = {NULL, NULL};
    ASSERT_OK(dt_optim_new(&c[1], n, &big));
    ASSERT_OK(dt_optim_set_no_decay(big, ranges, 3));
    ASSERT_EQ(dt_optim_no_decay_count(big), (size_t)(10021 + 5 + 9000));
    for (size_t i = 0; i < n; i++) p[i] = want[i] = 0.001f * (float)(i % 97) - 0.05f;
    for (int t = 0; t < 3; t++) {
      for (size_t i = 0; i < n; i++) g[i] = 0.01f * (float)((i * 7 + (size_t)t) % 13) - 0.06f;
      ASSERT_OK(dt_optim_step(big, p, g, 0.01f));
    }
    for (size_t i = 0; i < n; i++) { /* the same element alone, in the group its range says */
      const int decay = !((i >= 3 && i < 8) || (i >= 8190 && i < 17190) || i >= 40000);
      for (int d = 0; d < 2; d++) {
        dt_optim_free(one[d]);
        one[d] = NULL;
        ASSERT_OK(dt_optim_new(&c[d], 1, &one[d]));
      }
      for (int t = 0; t < 3; t++) {
        float gi = 0.01f * (float)((i * 7 + (size_t)t) % 13) - 0.06f;
        ASSERT_OK(dt_optim_step(one[decay], &want[i], &gi, 0.01f));
      }
      bad += memcmp(&p[i], &want[i], sizeof(float)) != 0;
    }
    for (int d = 0; d < 2; d++) dt_optim_free(one[d]);
    dt_optim_free(big);
  }
  dt_free(want);
  dt_free(g);
  dt_free(p);
  ASSERT_EQ(bad, 0);
}

TEST(no_decay_ranges_are_checked) {
  dt_optim_config c;
  dt_optim_config_default(DT_OPTIM_ADAMW, &c);
  dt_optim *o = NULL;
  ASSERT_OK(dt_optim_new(&c, 100, &o));
  const dt_optim_range outside[1] = {{90, 11}}, overlap[2] = {{10, 10}, {19, 2}};
  ASSERT_STATUS(dt_optim_set_no_decay(o, outside, 1), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "[90, +11)") != NULL && strstr(dt_last_error(), "100-element") != NULL);
  ASSERT_STATUS(dt_optim_set_no_decay(o, overlap, 2), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "overlap") != NULL);
  ASSERT_EQ(dt_optim_no_decay_count(o), (size_t)0); /* unchanged by the failures */
  ASSERT_OK(dt_optim_set_no_decay(o, overlap, 1));
  ASSERT_EQ(dt_optim_no_decay_count(o), (size_t)10);
  ASSERT_OK(dt_optim_set_no_decay(o, NULL, 0));
  ASSERT_EQ(dt_optim_no_decay_count(o), (size_t)0);
  dt_optim_free(o);
}

TEST(clip_scales_only_above_max_norm) {
  float g[2] = {3, 4}, norm = 0;
  ASSERT_OK(dt_clip_grad_norm(g, 2, 10.0f, &norm));
  ASSERT(norm == 5.0f && g[0] == 3.0f && g[1] == 4.0f);
  ASSERT_OK(dt_clip_grad_norm(g, 2, 5.0f, &norm)); /* coef 5 / (5 + 1e-6) < 1: scaled, barely */
  const float coef5 = 5.0f / (5.0f + 1e-6f);
  ASSERT(g[0] == 3.0f * coef5 && g[1] == 4.0f * coef5);
  g[0] = 3, g[1] = 4;
  ASSERT_OK(dt_clip_grad_norm(g, 2, 1.0f, &norm));
  const float coef = 1.0f / (5.0f + 1e-6f);
  ASSERT(norm == 5.0f);
  ASSERT(g[0] == 3.0f * coef && g[1] == 4.0f * coef);
  ASSERT_NEAR(g[0], 0.6, 1e-6);
  ASSERT_OK(dt_clip_grad_norm(g, 0, 1.0f, &norm));
  ASSERT(norm == 0.0f);
}

TEST(clip_rejects_bad_max_norm_and_reports_nonfinite) {
  float g[3] = {1, NAN, 2}, norm = 7;
  ASSERT_STATUS(dt_clip_grad_norm(g, 3, 0.0f, &norm), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "max_norm") != NULL);
  ASSERT_STATUS(dt_clip_grad_norm(g, 3, NAN, &norm), DT_INVALID_ARGUMENT);
  ASSERT(norm == 7);
  ASSERT_OK(dt_clip_grad_norm(g, 3, 1.0f, &norm));
  ASSERT(isnan(norm) && g[0] == 1 && g[2] == 2); /* reported, not applied */
  g[1] = INFINITY;
  ASSERT_OK(dt_clip_grad_norm(g, 3, 1.0f, &norm));
  ASSERT(isinf(norm) && g[0] == 1 && g[2] == 2);
}

/* The norm has the same bits for any thread count (fixed chunked reduction). */
TEST(clip_norm_is_thread_count_independent) {
  const size_t n = 300001;
  float *g = NULL;
  ASSERT_OK(dt_alloc_array(n, sizeof(float), "g", (void **)&g));
  double ref = 0;
  for (size_t i = 0; i < n; i++) {
    g[i] = (float)((double)(i % 1000) / 1000.0 - 0.5);
    ref += (double)g[i] * g[i];
  }
  float n1 = 0, n2 = 0;
  int threads = dt_get_threads();
  ASSERT_OK(dt_set_threads(1));
  ASSERT_OK(dt_clip_grad_norm(g, n, INFINITY, &n1));
  ASSERT_OK(dt_set_threads(2));
  ASSERT_OK(dt_clip_grad_norm(g, n, INFINITY, &n2));
  ASSERT_OK(dt_set_threads(threads));
  dt_free(g);
  ASSERT(memcmp(&n1, &n2, sizeof n1) == 0);
  ASSERT_NEAR(n1, sqrt(ref), 1e-6);
}

TEST_MAIN(TEST_ENTRY(step_in_parts_equals_one_step), TEST_ENTRY(sgd_plain), TEST_ENTRY(sgd_weight_decay), TEST_ENTRY(sgd_momentum), TEST_ENTRY(sgd_dampening),
          TEST_ENTRY(sgd_nesterov), TEST_ENTRY(adam_three_steps), TEST_ENTRY(adam_l2_weight_decay),
          TEST_ENTRY(adamw_decoupled_weight_decay), TEST_ENTRY(parallel_path_matches_elementwise),
          TEST_ENTRY(resume_from_state_is_exact), TEST_ENTRY(invalid_configs_are_rejected),
          TEST_ENTRY(kind_names_parse_and_print), TEST_ENTRY(schedule_constant_and_step),
          TEST_ENTRY(schedule_cosine_and_warmup), TEST_ENTRY(schedule_check_names_the_field),
          TEST_ENTRY(schedule_linear_as_transformers), TEST_ENTRY(no_decay_ranges_match_two_groups),
          TEST_ENTRY(no_decay_ranges_are_checked),
          TEST_ENTRY(clip_scales_only_above_max_norm), TEST_ENTRY(clip_rejects_bad_max_norm_and_reports_nonfinite),
          TEST_ENTRY(clip_norm_is_thread_count_independent))

/* Data source "synthetic": deterministic random samples, e.g. the PyTorch DDP tutorial's rand(20) -> rand(1). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "data/source.h"

#define PREFIX "synthetic:"
#define MAX_WIDTH (1 << 20)
#define STREAM_SAMPLE 0x53594e0000000000ull /* + sample index */
#define STREAM_TEACHER 0x5445414348000000ull

/* x: `in` uniform [0, 1) values per sample; the target by task: regression `out`
 * uniform [0, 1) values (no relation to x, as in the tutorial); classification
 * the argmax and multilabel the signs of a fixed random linear teacher
 * W (out, in) applied to x - 0.5, so those can be learned. */
typedef struct synthetic {
  int64_t n;
  int in, out;
  dt_task_kind task;
  uint64_t seed;
  float *teacher; /* (out, in), classification and multilabel */
} synthetic;

static int claims(const char *spec) { return strncmp(spec, PREFIX, strlen(PREFIX)) == 0; }

/* A decimal integer in [lo, hi] filling the whole text. */
static int parse_int(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  if (!*s || *s == '-' || *s == '+' || *s == ' ') return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < (unsigned long long)lo || v > (unsigned long long)hi) return -1;
  *out = (long long)v;
  return 0;
}

static dt_status bad(const char *spec, const char *part, const char *want) {
  return dt_error(DT_USAGE, "--data %s: '%s' %s (spec: synthetic:N[,in=20,out=1,task=regression,seed=0])", spec, part,
                  want);
}

/* One "key=value" item of the spec into s. */
static dt_status parse_item(const char *spec, char *item, synthetic *s, unsigned *seen) {
  static const char *const keys[] = {"in", "out", "task", "seed"};
  char *eq = strchr(item, '=');
  if (!eq) return bad(spec, item, "is not KEY=VALUE");
  *eq = '\0';
  const char *val = eq + 1;
  int k = -1;
  for (int i = 0; i < 4; i++)
    if (strcmp(item, keys[i]) == 0) k = i;
  if (k < 0) return bad(spec, item, "is not a key (in, out, task, seed)");
  if (*seen & (1u << k)) return bad(spec, item, "is given twice");
  *seen |= 1u << k;
  long long v;
  if (k == 0 || k == 1) {
    if (parse_int(val, 1, MAX_WIDTH, &v)) return bad(spec, val, k == 0 ? "is not an input width (in) in 1..1048576"
                                                                 : "is not an output width (out) in 1..1048576");
    *(k == 0 ? &s->in : &s->out) = (int)v;
  } else if (k == 2) {
    if (strcmp(val, "regression") == 0) s->task = DT_TASK_REGRESSION;
    else if (strcmp(val, "classification") == 0) s->task = DT_TASK_CLASSIFICATION;
    else if (strcmp(val, "multilabel") == 0) s->task = DT_TASK_MULTILABEL;
    else return bad(spec, val, "is not a task (regression, classification, multilabel)");
  } else {
    char *end;
    errno = 0;
    if (!*val || *val == '-' || *val == '+' || (s->seed = strtoull(val, &end, 10), errno) || *end)
      return bad(spec, val, "is not a seed (a non-negative integer)");
  }
  return DT_OK;
}

static dt_status parse_spec(const char *spec, synthetic *s) {
  char buf[256];
  if (strlen(spec) >= sizeof buf) return bad(spec, spec, "is too long");
  strcpy(buf, spec + strlen(PREFIX));
  *s = (synthetic){.in = 20, .out = 1, .task = DT_TASK_REGRESSION};
  char *save = NULL, *first = strtok_r(buf, ",", &save);
  long long n;
  if (!first || parse_int(first, 1, UINT32_MAX, &n)) return bad(spec, first ? first : "", "is not a sample count N >= 1");
  s->n = n;
  unsigned seen = 0;
  for (char *it = strtok_r(NULL, ",", &save); it; it = strtok_r(NULL, ",", &save))
    DT_CHECK(parse_item(spec, it, s, &seen));
  if (strstr(spec, ",,") || spec[strlen(PREFIX)] == ',' || spec[strlen(spec) - 1] == ',')
    return bad(spec, ",", "leaves an empty item");
  if (s->task == DT_TASK_CLASSIFICATION && s->out < 2) return bad(spec, "out", "must be >= 2 classes for classification");
  return DT_OK;
}

static dt_status open_synthetic(const char *spec, dt_split split, const dt_data_options *opt, void **state,
                                dt_data_info *info, int64_t *n) {
  if (opt->holdout != DT_HOLDOUT_DEFAULT)
    return dt_error(DT_USAGE, "%s: leave-last-out applies to ratings data; use --val-fraction", spec);
  synthetic cfg;
  DT_CHECK(parse_spec(spec, &cfg));
  if (split != DT_SPLIT_TRAIN)
    return dt_error(DT_NOT_FOUND,
                    "%s has no test split: train with --val-fraction F or --val-data synthetic:N,seed=S, and "
                    "evaluate with --split train",
                    spec);
  synthetic *s = NULL;
  DT_CHECK(dt_alloc(sizeof *s, (void **)&s));
  *s = cfg;
  if (s->task != DT_TASK_REGRESSION) {
    dt_status st = dt_alloc_array((size_t)s->out * (size_t)s->in, sizeof(float), "synthetic teacher", (void **)&s->teacher);
    if (st != DT_OK) {
      dt_free(s);
      return st;
    }
    dt_rng r;
    dt_rng_init(&r, s->seed, STREAM_TEACHER);
    for (size_t i = 0; i < (size_t)s->out * (size_t)s->in; i++) s->teacher[i] = dt_rng_uniform_range(&r, -1.0f, 1.0f);
  }
  const int64_t in_shape[1] = {s->in}, out_shape[1] = {s->out};
  dt_data_add_field(info, "x", DT_F32, 1, in_shape);
  if (s->task == DT_TASK_CLASSIFICATION)
    dt_data_add_field(info, "target", DT_I32, 0, NULL);
  else
    dt_data_add_field(info, "target", DT_F32, 1, out_shape);
  info->task = s->task;
  info->outputs = s->out;
  info->has_test = 0;
  *n = s->n;
  *state = s;
  return DT_OK;
}

/* The teacher's score of output k for x: W[k] . (x - 0.5). */
static float teach(const synthetic *s, const float *x, int k) {
  const float *w = s->teacher + (size_t)k * s->in;
  float acc = 0;
  for (int j = 0; j < s->in; j++) acc += w[j] * (x[j] - 0.5f);
  return acc;
}

static void target_of(const synthetic *s, dt_rng *r, const float *x, void *target, int i) {
  float *y = (float *)target + (size_t)i * s->out;
  if (s->task == DT_TASK_REGRESSION) {
    for (int k = 0; k < s->out; k++) y[k] = dt_rng_uniform(r);
  } else if (s->task == DT_TASK_MULTILABEL) {
    for (int k = 0; k < s->out; k++) y[k] = teach(s, x, k) > 0 ? 1.0f : 0.0f;
  } else {
    int best = 0;
    float top = teach(s, x, 0);
    for (int k = 1; k < s->out; k++) {
      const float v = teach(s, x, k);
      if (v > top) top = v, best = k;
    }
    ((int32_t *)target)[i] = best;
  }
}

static void fetch_synthetic(const void *state, const int64_t *idx, int n, void *const *fields) {
  const synthetic *s = state;
  for (int i = 0; i < n; i++) {
    dt_rng r;
    dt_rng_init(&r, s->seed, STREAM_SAMPLE + (uint64_t)idx[i]);
    float *x = (float *)fields[0] + (size_t)i * s->in;
    for (int j = 0; j < s->in; j++) x[j] = dt_rng_uniform(&r);
    target_of(s, &r, x, fields[1], i);
  }
}

static void free_synthetic(void *state) {
  synthetic *s = state;
  if (!s) return;
  dt_free(s->teacher);
  dt_free(s);
}

const dt_source_ops dt_source_synthetic = {
    .name = "synthetic",
    .doc = "synthetic:N[,in=20,out=1,task=regression|classification|multilabel,seed=0]: generated samples, no test split",
    .claims = claims,
    .open = open_synthetic,
    .fetch = fetch_synthetic,
    .free = free_synthetic,
};

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
 * W (out, in) applied to x - 0.5, so those can be learned.
 * With tokens=V (text, for the bert models): x is the bert input (3, len): ids uniform in [1, V) for a length
 * uniform in [max(2, len/4), len], then padding (id 0, mask 0), token types 0; the teacher W (out, V) scores
 * the mean of its columns at the sample's ids. */
typedef struct synthetic {
  int64_t n;
  int in, out;
  int tokens, len; /* text: vocabulary and positions; tokens 0: f32 vectors */
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
  return dt_error(DT_USAGE, "--data %s: '%s' %s (spec: synthetic:N[,in=20,out=1,task=regression,seed=0] or, text, "
                  "synthetic:N,tokens=V[,len=128,...])", spec, part, want);
}

/* One "key=value" item of the spec into s. */
static dt_status parse_item(const char *spec, char *item, synthetic *s, unsigned *seen) {
  static const char *const keys[] = {"in", "out", "task", "seed", "tokens", "len"};
  char *eq = strchr(item, '=');
  if (!eq) return bad(spec, item, "is not KEY=VALUE");
  *eq = '\0';
  const char *val = eq + 1;
  int k = -1;
  for (int i = 0; i < 6; i++)
    if (strcmp(item, keys[i]) == 0) k = i;
  if (k < 0) return bad(spec, item, "is not a key (in, out, task, seed, tokens, len)");
  if (*seen & (1u << k)) return bad(spec, item, "is given twice");
  *seen |= 1u << k;
  long long v;
  if (k == 0 || k == 1) {
    if (parse_int(val, 1, MAX_WIDTH, &v)) return bad(spec, val, k == 0 ? "is not an input width (in) in 1..1048576"
                                                                 : "is not an output width (out) in 1..1048576");
    *(k == 0 ? &s->in : &s->out) = (int)v;
  } else if (k == 4 || k == 5) {
    if (parse_int(val, k == 4 ? 2 : 2, k == 4 ? INT32_MAX : 512, &v))
      return bad(spec, val, k == 4 ? "is not a vocabulary size (tokens) in 2..2^31-1" : "is not a length (len) in 2..512");
    *(k == 4 ? &s->tokens : &s->len) = (int)v;
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
  if ((seen & (1u << 5)) && !s->tokens) return bad(spec, "len", "needs tokens=V (text samples)");
  if ((seen & (1u << 0)) && s->tokens) return bad(spec, "in", "is for vectors; text samples take len");
  if (s->tokens && !s->len) s->len = 128;
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
  const int width = s->tokens ? s->tokens : s->in; /* the teacher's columns */
  if (s->task != DT_TASK_REGRESSION) {
    dt_status st = dt_alloc_array((size_t)s->out * (size_t)width, sizeof(float), "synthetic teacher", (void **)&s->teacher);
    if (st != DT_OK) {
      dt_free(s);
      return st;
    }
    dt_rng r;
    dt_rng_init(&r, s->seed, STREAM_TEACHER);
    for (size_t i = 0; i < (size_t)s->out * (size_t)width; i++) s->teacher[i] = dt_rng_uniform_range(&r, -1.0f, 1.0f);
  }
  const int64_t in_shape[1] = {s->in}, out_shape[1] = {s->out}, text_shape[2] = {3, s->len};
  if (s->tokens) {
    dt_data_add_field(info, "x", DT_I32, 2, text_shape);
    info->n_index = 1;
    info->index_size[0] = s->tokens;
  } else {
    dt_data_add_field(info, "x", DT_F32, 1, in_shape);
  }
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

/* The teacher's score of output k for x: W[k] . (x - 0.5); text: the mean of W[k, id] over the tokens. */
static float teach(const synthetic *s, const void *x, int k) {
  if (s->tokens) {
    const float *w = s->teacher + (size_t)k * s->tokens;
    const int32_t *ids = x, *mask = ids + 2 * s->len;
    float acc = 0;
    int n = 0;
    for (int t = 0; t < s->len && mask[t]; t++, n++) acc += w[ids[t]];
    return acc / (float)n;
  }
  const float *w = s->teacher + (size_t)k * s->in, *v = x;
  float acc = 0;
  for (int j = 0; j < s->in; j++) acc += w[j] * (v[j] - 0.5f);
  return acc;
}

/* Sample i's text x (3, len): ids, types 0, mask. */
static void text_of(const synthetic *s, dt_rng *r, int32_t *x) {
  const int lo = s->len / 4 > 2 ? s->len / 4 : 2;
  const int n = lo + (int)dt_rng_below(r, (uint64_t)(s->len - lo + 1));
  for (int t = 0; t < s->len; t++) {
    x[t] = t < n ? 1 + (int32_t)dt_rng_below(r, (uint64_t)s->tokens - 1) : 0;
    x[s->len + t] = 0;
    x[2 * s->len + t] = t < n;
  }
}

static void target_of(const synthetic *s, dt_rng *r, const void *x, void *target, int i) {
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
    void *x;
    if (s->tokens) {
      x = (int32_t *)fields[0] + (size_t)i * 3 * (size_t)s->len;
      text_of(s, &r, x);
    } else {
      float *v = (float *)fields[0] + (size_t)i * s->in;
      for (int j = 0; j < s->in; j++) v[j] = dt_rng_uniform(&r);
      x = v;
    }
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
    .doc = "synthetic:N[,in=20,out=1,task=regression|classification|multilabel,seed=0]: generated samples, no test "
           "split; with tokens=V[,len=128]: token sequences for the bert models",
    .claims = claims,
    .open = open_synthetic,
    .fetch = fetch_synthetic,
    .free = free_synthetic,
};

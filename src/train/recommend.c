/* dt_recommend: the top K unrated items for one user of a recommender (mf, ncf) trained on ratings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/checkpoint.h"
#include "dtrain/core.h"
#include "train/train_impl.h"

#define FETCH_CHUNK 4096 /* ratings read per dt_dataset_fetch while looking for the user's */

void dt_recommend_config_default(dt_recommend_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->top = 10;
}

void dt_recommend_result_free(dt_recommend_result *r) {
  if (!r) return;
  dt_free(r->text);
  dt_free(r->top);
  dt_free(r);
}

/* An item that may be recommended. */
typedef struct candidate {
  float score;
  int64_t id;    /* original */
  int64_t index; /* the weights' row */
} candidate;

/* What a recommendation holds, released by rec_free. */
typedef struct rec_state {
  dt_safetensors *file;
  int64_t *user_ids, *item_ids; /* (n_users), (n_items): the weights' rows, ascending original ids */
  int64_t n_users, n_items;
  dt_model *m;
  int32_t *pairs;               /* (n_items, 2): (user, item) for every item */
  uint8_t *rated;               /* (n_items): 1 where the user rated the weights' item in the data */
  struct candidate *cand;       /* (n_items): the unrated items, best first */
  const float *scores;          /* (n_items): the model's output, owned by it */
  dt_dataset *ds;
  void *fields[DT_MAX_FIELDS];  /* (FETCH_CHUNK, field...) each */
  int64_t *idx;                 /* (FETCH_CHUNK) */
} rec_state;

static void rec_free(rec_state *s) {
  dt_free(s->idx);
  for (int f = 0; f < DT_MAX_FIELDS; f++) dt_free(s->fields[f]);
  dt_dataset_free(s->ds);
  dt_free(s->cand);
  dt_free(s->rated);
  dt_free(s->pairs);
  dt_model_free(s->m);
  dt_free(s->item_ids);
  dt_free(s->user_ids);
  dt_safetensors_free(s->file);
}

/* The comma list of metadata `key` ("10,20,30": ascending ids, as the ratings source writes them). */
static dt_status parse_ids(const char *path, const char *key, const char *list, int64_t **ids, int64_t *n) {
  int64_t count = *list ? 1 : 0;
  for (const char *c = list; *c; c++) count += *c == ',';
  if (count == 0) return dt_error(DT_CORRUPT, "%s: metadata %s is empty", path, key);
  int64_t *v = NULL;
  DT_CHECK(dt_alloc_array((size_t)count, sizeof *v, key, (void **)&v));
  const char *c = list;
  for (int64_t i = 0; i < count; i++) {
    char *end;
    v[i] = strtoll(c, &end, 10);
    if (end == c || *c == '-' || (*end && *end != ',') || (i && v[i] <= v[i - 1])) {
      dt_free(v);
      return dt_error(DT_CORRUPT, "%s: metadata %s is not a list of ascending ids (at entry %lld)", path, key,
                      (long long)i + 1);
    }
    c = *end ? end + 1 : end;
  }
  *ids = v;
  *n = count;
  return DT_OK;
}

/* Index of id in the ascending ids[0..n), or -1. */
static int64_t find_id(const int64_t *ids, int64_t n, int64_t id) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && ids[lo] == id ? lo : -1;
}

/* The weights' ids and the user's row; weights without ids are no recommender trained on ratings. */
static dt_status open_ids(const dt_recommend_config *cfg, rec_state *s, dt_recommend_result *r, int64_t *user) {
  const char *model = dt_safetensors_meta(s->file, "model");
  const char *users = dt_safetensors_meta(s->file, "user_ids"), *items = dt_safetensors_meta(s->file, "item_ids");
  if (!model || !*model) return dt_error(DT_USAGE, "%s has no \"model\" metadata: not weights written by dtrain train", cfg->weights);
  snprintf(r->model, sizeof r->model, "%s", model);
  if (!users || !items)
    return dt_error(DT_USAGE, "%s holds model %s without user and item ids: recommend needs mf or ncf weights trained "
                    "on ratings (a MovieLens directory)", cfg->weights, model);
  DT_CHECK(parse_ids(cfg->weights, "user_ids", users, &s->user_ids, &s->n_users));
  DT_CHECK(parse_ids(cfg->weights, "item_ids", items, &s->item_ids, &s->n_items));
  if (s->n_users > INT32_MAX || s->n_items > INT32_MAX)
    return dt_error(DT_CORRUPT, "%s: %lld users and %lld items do not fit i32 indices", cfg->weights,
                    (long long)s->n_users, (long long)s->n_items);
  *user = find_id(s->user_ids, s->n_users, cfg->user);
  if (*user < 0)
    return dt_error(DT_NOT_FOUND, "user %lld is not among the %lld users %s was trained on (ids %lld to %lld)",
                    (long long)cfg->user, (long long)s->n_users, cfg->weights, (long long)s->user_ids[0],
                    (long long)s->user_ids[s->n_users - 1]);
  return DT_OK;
}

/* The model the file holds, over the weights' tables, scoring every item for the user in one forward. */
static dt_status score_items(const dt_recommend_config *cfg, rec_state *s, int64_t user) {
  dt_weights_arch a;
  DT_CHECK(dt_weights_arch_read(cfg->weights, s->file, &a));
  const int64_t sizes[2] = {s->n_users, s->n_items};
  dt_zoo_config zc = {.ndim = 1, .input_shape = {2}, .outputs = 1, .task = DT_TASK_REGRESSION, .dropout = a.dropout,
                      .hidden = a.n_hidden ? a.hidden : NULL, .n_hidden = a.n_hidden, .n_index = 2,
                      .index_size = sizes, .factors = a.factors};
  dt_status st = dt_model_zoo_new(dt_safetensors_meta(s->file, "model"), &zc, &s->m);
  if (st == DT_USAGE) {
    char why[256];
    snprintf(why, sizeof why, "%s", dt_last_error());
    return dt_error(DT_USAGE, "%s holds model %s: recommend needs mf or ncf weights (%s)", cfg->weights,
                    dt_safetensors_meta(s->file, "model"), why);
  }
  DT_CHECK(st);
  DT_CHECK(dt_model_build(s->m, (int)s->n_items, 0));
  DT_CHECK(dt_model_load(s->m, cfg->weights));
  DT_CHECK(dt_alloc_array((size_t)s->n_items * 2, sizeof(int32_t), "recommendation pairs", (void **)&s->pairs));
  for (int64_t i = 0; i < s->n_items; i++) {
    s->pairs[2 * i] = (int32_t)user;
    s->pairs[2 * i + 1] = (int32_t)i;
  }
  dt_model_set_training(s->m, 0);
  return dt_model_forward(s->m, s->pairs, (int)s->n_items, &s->scores);
}

/* Marks the weights' items the user rated anywhere in the data (matched by original ids). */
static dt_status mark_rated(const dt_recommend_config *cfg, rec_state *s, dt_recommend_result *r) {
  const char *data = cfg->data && *cfg->data ? cfg->data : dt_safetensors_meta(s->file, "data");
  if (!data || !*data) return dt_error(DT_USAGE, "%s records no \"data\": give the ratings with --data", cfg->weights);
  snprintf(r->data, sizeof r->data, "%s", data);
  DT_CHECK(dt_dataset_load(data, DT_SPLIT_TRAIN, NULL, &s->ds)); /* the whole of the ratings */
  const dt_data_info *info = dt_dataset_info(s->ds);
  const int64_t *users = NULL, *items = NULL;
  int64_t n_users = 0, n_items = 0;
  if (info->n_index != 2 || info->input < 0 || dt_dataset_index_ids(s->ds, 0, &users, &n_users) != DT_OK ||
      dt_dataset_index_ids(s->ds, 1, &items, &n_items) != DT_OK)
    return dt_error(DT_USAGE, "%s is not ratings data with user and item ids (a MovieLens directory)", data);
  DT_CHECK(dt_alloc_array((size_t)s->n_items, 1, "rated items", (void **)&s->rated));
  const int64_t user = find_id(users, n_users, cfg->user);
  if (user < 0) {
    DT_LOG_WARN("recommend", "user %lld has no ratings in %s: nothing is left out", (long long)cfg->user, data);
    return DT_OK;
  }
  for (int f = 0; f < info->n_fields; f++)
    DT_CHECK(dt_alloc_array(FETCH_CHUNK, dt_field_bytes(&info->field[f]), "ratings", &s->fields[f]));
  DT_CHECK(dt_alloc_array(FETCH_CHUNK, sizeof(int64_t), "ratings", (void **)&s->idx));
  const int64_t n = dt_dataset_size(s->ds);
  const int32_t *x = s->fields[info->input]; /* (FETCH_CHUNK, 2): user, item */
  for (int64_t lo = 0; lo < n; lo += FETCH_CHUNK) {
    const int k = n - lo < FETCH_CHUNK ? (int)(n - lo) : FETCH_CHUNK;
    for (int i = 0; i < k; i++) s->idx[i] = lo + i;
    dt_dataset_fetch(s->ds, s->idx, k, s->fields);
    for (int i = 0; i < k; i++) {
      if (x[2 * i] != user || x[2 * i + 1] < 0 || x[2 * i + 1] >= n_items) continue;
      const int64_t mine = find_id(s->item_ids, s->n_items, items[x[2 * i + 1]]);
      if (mine >= 0 && !s->rated[mine]) s->rated[mine] = 1, r->rated++;
    }
  }
  return DT_OK;
}

/* Higher score first (NaN last), then the lower original id. */
static int by_score(const void *a, const void *b) {
  const candidate *x = a, *y = b;
  if (isnan(x->score) != isnan(y->score)) return isnan(x->score) ? 1 : -1;
  if (x->score != y->score && !isnan(x->score)) return x->score > y->score ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* The best cfg->top unrated items, with their titles and genres copied out of the data. */
static dt_status pick_top(const dt_recommend_config *cfg, rec_state *s, dt_recommend_result *r) {
  DT_CHECK(dt_alloc_array((size_t)s->n_items, sizeof *s->cand, "candidates", (void **)&s->cand));
  int64_t n = 0;
  for (int64_t i = 0; i < s->n_items; i++)
    if (!s->rated[i]) s->cand[n++] = (candidate){.score = s->scores[i], .id = s->item_ids[i], .index = i};
  qsort(s->cand, (size_t)n, sizeof *s->cand, by_score);
  r->n = n < cfg->top ? (int)n : cfg->top;
  const int64_t *items = NULL;
  int64_t n_data_items = 0;
  DT_CHECK(dt_dataset_index_ids(s->ds, 1, &items, &n_data_items));
  size_t bytes = 1;
  for (int k = 0; k < r->n; k++) {
    const int64_t at = find_id(items, n_data_items, s->cand[k].id);
    for (int part = 0; part < 2; part++) {
      const char *t = at >= 0 ? dt_dataset_index_text(s->ds, 1, at, part) : NULL;
      bytes += (t ? strlen(t) : 0) + 1;
    }
  }
  DT_CHECK(dt_alloc_array((size_t)(r->n ? r->n : 1), sizeof *r->top, "recommendations", (void **)&r->top));
  DT_CHECK(dt_alloc(bytes, (void **)&r->text));
  size_t pos = 1; /* text[0] is the "" of items without text */
  for (int k = 0; k < r->n; k++) {
    const int64_t at = find_id(items, n_data_items, s->cand[k].id);
    dt_recommendation *rec = &r->top[k];
    rec->item = s->cand[k].id;
    rec->score = s->cand[k].score;
    const char **dst[2] = {&rec->title, &rec->genres};
    for (int part = 0; part < 2; part++) {
      const char *t = at >= 0 ? dt_dataset_index_text(s->ds, 1, at, part) : NULL;
      *dst[part] = r->text;
      if (!t) continue;
      *dst[part] = r->text + pos;
      memcpy(r->text + pos, t, strlen(t) + 1);
      pos += strlen(t) + 1;
    }
  }
  return DT_OK;
}

dt_status dt_recommend(const dt_recommend_config *cfg, dt_recommend_result **out) {
  if (!cfg || !cfg->weights) return dt_error(DT_INVALID_ARGUMENT, "no weights file to recommend with");
  if (cfg->top < 1) return dt_error(DT_INVALID_ARGUMENT, "top = %d must be >= 1", cfg->top);
  DT_CHECK(dt_set_threads(cfg->threads));
  rec_state s;
  memset(&s, 0, sizeof s);
  dt_recommend_result *r = NULL;
  int64_t user = -1;
  dt_status st = dt_alloc(sizeof *r, (void **)&r);
  if (st == DT_OK) r->user = cfg->user;
  if (st == DT_OK) st = dt_safetensors_load(cfg->weights, &s.file);
  if (st == DT_OK) st = open_ids(cfg, &s, r, &user);
  if (st == DT_OK) st = score_items(cfg, &s, user);
  if (st == DT_OK) st = mark_rated(cfg, &s, r);
  if (st == DT_OK) st = pick_top(cfg, &s, r);
  if (st == DT_OK) {
    r->items = s.n_items;
    *out = r;
    r = NULL;
  }
  dt_recommend_result_free(r);
  rec_free(&s);
  return st;
}

/* Datasets: the registry of data sources, the handle over an open source, subsets and validation splits. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "data/source.h"

/* In claiming order: the IDX source last, since it takes any name or directory. */
static const dt_source_ops *const sources[] = {&dt_source_synthetic, &dt_source_text, &dt_source_movielens,
                                               &dt_source_cifar, &dt_source_imagefolder, &dt_source_idx};
#define N_SOURCES (sizeof sources / sizeof sources[0])

struct dt_dataset {
  const dt_source_ops *ops; /* NULL for a subset */
  void *state;
  dt_data_info info;
  int64_t n;
  const dt_dataset *parent; /* subset: samples map[i] of parent */
  int64_t *map;
};

size_t dt_field_numel(const dt_field *f) {
  size_t n = 1;
  for (int d = 0; d < f->ndim; d++) n *= (size_t)f->shape[d];
  return n;
}

size_t dt_field_bytes(const dt_field *f) { return dt_field_numel(f) * dt_dtype_size(f->dtype); }

int dt_data_field(const dt_data_info *info, const char *name) {
  for (int i = 0; i < info->n_fields; i++)
    if (strcmp(info->field[i].name, name) == 0) return i;
  return -1;
}

int dt_data_add_field(dt_data_info *info, const char *name, dt_dtype dtype, int ndim, const int64_t *shape) {
  assert(info->n_fields < DT_MAX_FIELDS && ndim <= DT_FIELD_MAX_DIMS);
  dt_field *f = &info->field[info->n_fields];
  memset(f, 0, sizeof *f);
  snprintf(f->name, sizeof f->name, "%s", name);
  f->dtype = dtype;
  f->ndim = ndim;
  for (int d = 0; d < ndim; d++) f->shape[d] = shape[d];
  return info->n_fields++;
}

void dt_dataset_sources(void (*fn)(const char *name, const char *doc, void *user), void *user) {
  for (size_t i = 0; i < N_SOURCES; i++) fn(sources[i]->name, sources[i]->doc, user);
}

dt_status dt_dataset_load(const char *source, dt_split split, const dt_normalize *norm, dt_dataset **out) {
  const dt_data_options opt = {.norm = norm};
  return dt_dataset_load_opts(source, split, &opt, out);
}

dt_status dt_dataset_load_opts(const char *source, dt_split split, const dt_data_options *opt, dt_dataset **out) {
  const dt_data_options defaults = {0};
  if (!opt) opt = &defaults;
  if (!source || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_dataset_load: NULL source or out");
  if (split != DT_SPLIT_TRAIN && split != DT_SPLIT_TEST)
    return dt_error(DT_INVALID_ARGUMENT, "dt_dataset_load: unknown split %d", (int)split);
  const dt_source_ops *ops = NULL;
  for (size_t i = 0; i < N_SOURCES && !ops; i++)
    if (sources[i]->claims(source)) ops = sources[i];
  if (!ops) return dt_error(DT_NOT_FOUND, "no data source reads '%s'", source);
  dt_dataset *ds = NULL;
  DT_CHECK(dt_alloc(sizeof *ds, (void **)&ds));
  ds->ops = ops;
  ds->info.input = ds->info.target = -1;
  dt_status st = ops->open(source, split, opt, &ds->state, &ds->info, &ds->n);
  if (st != DT_OK) {
    dt_free(ds);
    return st;
  }
  snprintf(ds->info.name, sizeof ds->info.name, "%s", ops->name);
  ds->info.input = dt_data_field(&ds->info, "x");
  ds->info.target = dt_data_field(&ds->info, "target");
  assert(ds->info.target >= 0);
  *out = ds;
  return DT_OK;
}

void dt_dataset_free(dt_dataset *ds) {
  if (!ds) return;
  if (ds->ops) ds->ops->free(ds->state);
  dt_free(ds->map);
  dt_free(ds);
}

int64_t dt_dataset_size(const dt_dataset *ds) { return ds->n; }

/* The dataset whose source holds ds's samples (a subset's root). */
static const dt_dataset *root_of(const dt_dataset *ds) {
  while (!ds->ops) ds = ds->parent;
  return ds;
}

dt_status dt_dataset_index_ids(const dt_dataset *ds, int col, const int64_t **ids, int64_t *n) {
  const dt_dataset *r = root_of(ds);
  if (!r->ops->index_ids) return dt_error(DT_NOT_FOUND, "data source %s keeps no ids", r->ops->name);
  return r->ops->index_ids(r->state, col, ids, n);
}

const char *dt_dataset_index_text(const dt_dataset *ds, int col, int64_t i, int part) {
  const dt_dataset *r = root_of(ds);
  return r->ops->index_text ? r->ops->index_text(r->state, col, i, part) : NULL;
}

int dt_dataset_meta(const dt_dataset *ds, const dt_kv **kv) {
  const dt_dataset *r = root_of(ds);
  *kv = NULL;
  return r->ops->meta ? r->ops->meta(r->state, kv) : 0;
}

#define SCAN_CHUNK 4096

dt_status dt_dataset_scan(const dt_dataset *ds, dt_scan_fn fn, void *user) {
  const dt_data_info *in = &ds->info;
  void *bufs[DT_MAX_FIELDS] = {0};
  int64_t *idx = NULL;
  dt_status st = dt_alloc_array(SCAN_CHUNK, sizeof *idx, "dataset scan", (void **)&idx);
  for (int f = 0; f < in->n_fields && st == DT_OK; f++)
    st = dt_alloc_array(SCAN_CHUNK, dt_field_bytes(&in->field[f]), "dataset scan", &bufs[f]);
  for (int64_t lo = 0; lo < ds->n && st == DT_OK; lo += SCAN_CHUNK) {
    const int n = ds->n - lo < SCAN_CHUNK ? (int)(ds->n - lo) : SCAN_CHUNK;
    for (int i = 0; i < n; i++) idx[i] = lo + i;
    st = dt_dataset_fetch_epoch(ds, 0, idx, n, bufs);
    if (st == DT_OK) st = fn(user, bufs, n);
  }
  for (int f = 0; f < in->n_fields; f++) dt_free(bufs[f]);
  dt_free(idx);
  return st;
}

typedef struct target_sum {
  int field;
  size_t per;
  double sum;
} target_sum;

static dt_status add_targets(void *user, void *const *fields, int n) {
  target_sum *t = user;
  const float *y = fields[t->field];
  for (size_t i = 0; i < (size_t)n * t->per; i++) t->sum += y[i];
  return DT_OK;
}

dt_status dt_dataset_target_mean(const dt_dataset *ds, double *mean) {
  if (ds->info.target < 0) return dt_error(DT_INVALID_ARGUMENT, "%s data has no target field", ds->info.name);
  const dt_field *f = &ds->info.field[ds->info.target];
  if (f->dtype != DT_F32) return dt_error(DT_INVALID_ARGUMENT, "dt_dataset_target_mean: the target is not f32");
  target_sum t = {.field = ds->info.target, .per = dt_field_numel(f)};
  DT_CHECK(dt_dataset_scan(ds, add_targets, &t));
  *mean = ds->n ? t.sum / ((double)ds->n * (double)t.per) : 0;
  return DT_OK;
}

/* A subset's samples are not its root's: its ranking would not describe them. */
dt_status dt_dataset_ranking(const dt_dataset *ds, dt_ranking *out) {
  if (!ds->ops || !ds->ops->ranking)
    return dt_error(DT_NOT_FOUND, "%s data has no ranking protocol (MovieLens with leave-last-out has)", ds->info.name);
  return ds->ops->ranking(ds->state, out);
}
const dt_data_info *dt_dataset_info(const dt_dataset *ds) { return &ds->info; }

/* A subset maps its indices in chunks, so the parent's fetch still sees whole runs. */
#define MAP_CHUNK 256

dt_status dt_dataset_fetch_epoch(const dt_dataset *ds, int64_t epoch, const int64_t *idx, int n, void *const *fields) {
  if (ds->ops) {
    if (ds->ops->fetch_epoch) return ds->ops->fetch_epoch(ds->state, epoch, idx, n, fields);
    ds->ops->fetch(ds->state, idx, n, fields);
    return DT_OK;
  }
  int64_t mapped[MAP_CHUNK];
  void *at[DT_MAX_FIELDS];
  for (int lo = 0; lo < n; lo += MAP_CHUNK) {
    const int k = n - lo < MAP_CHUNK ? n - lo : MAP_CHUNK;
    for (int i = 0; i < k; i++) {
      assert(idx[lo + i] >= 0 && idx[lo + i] < ds->n);
      mapped[i] = ds->map[idx[lo + i]];
    }
    for (int f = 0; f < ds->info.n_fields; f++)
      at[f] = (char *)fields[f] + (size_t)lo * dt_field_bytes(&ds->info.field[f]);
    DT_CHECK(dt_dataset_fetch_epoch(ds->parent, epoch, mapped, k, at));
  }
  return DT_OK;
}

void dt_dataset_fetch(const dt_dataset *ds, const int64_t *idx, int n, void *const *fields) {
  if (dt_dataset_fetch_epoch(ds, 0, idx, n, fields) != DT_OK) DT_LOG_ERROR("data", "%s", dt_last_error());
}

dt_status dt_dataset_subset(dt_dataset *parent, const int64_t *idx, int64_t n, dt_dataset **out) {
  if (!parent || (!idx && n > 0) || n < 0 || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_dataset_subset: bad argument");
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= parent->n)
      return dt_error(DT_INVALID_ARGUMENT, "subset index %lld at %lld is outside [0, %lld)", (long long)idx[i],
                      (long long)i, (long long)parent->n);
  dt_dataset *ds = NULL;
  DT_CHECK(dt_alloc(sizeof *ds, (void **)&ds));
  dt_status st = dt_alloc_array((size_t)(n ? n : 1), sizeof *ds->map, "subset indices", (void **)&ds->map);
  if (st != DT_OK) {
    dt_free(ds);
    return st;
  }
  if (n) memcpy(ds->map, idx, (size_t)n * sizeof *idx);
  ds->info = parent->info;
  ds->n = n;
  ds->parent = parent;
  *out = ds;
  return DT_OK;
}

dt_status dt_dataset_split(dt_dataset *ds, double fraction, uint64_t seed, dt_dataset **train, dt_dataset **val) {
  if (!(fraction > 0 && fraction < 1))
    return dt_error(DT_INVALID_ARGUMENT, "validation fraction %g must be in (0, 1)", fraction);
  const int64_t n = ds->n, n_val = (int64_t)llround(fraction * (double)n);
  if (n_val < 1 || n_val >= n)
    return dt_error(DT_USAGE, "a validation fraction of %g leaves %lld of %lld samples for validation; "
                    "both parts need at least one", fraction, (long long)n_val, (long long)n);
  int64_t *perm = NULL;
  uint8_t *is_val = NULL;
  dt_status st = dt_alloc_array((size_t)n, sizeof *perm, "split", (void **)&perm);
  if (st == DT_OK) st = dt_alloc_array((size_t)n, 1, "split", (void **)&is_val);
  if (st != DT_OK) goto done;
  /* The validation samples: the first n_val of a Fisher-Yates permutation of Philox(seed, "split");
   * both parts keep index order, so the split is a pure function of (n, fraction, seed). */
  dt_rng r;
  dt_rng_init(&r, seed, 0x53504c4954000000ull);
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)dt_rng_below(&r, (uint32_t)(i + 1)), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (int64_t i = 0; i < n_val; i++) is_val[perm[i]] = 1;
  int64_t a = 0, b = n - n_val; /* train first, then validation, each in index order */
  for (int64_t i = 0; i < n; i++) perm[is_val[i] ? b++ : a++] = i;
  st = dt_dataset_subset(ds, perm, n - n_val, train);
  if (st == DT_OK && (st = dt_dataset_subset(ds, perm + n - n_val, n_val, val)) != DT_OK) {
    dt_dataset_free(*train);
    *train = NULL;
  }
done:
  dt_free(is_val);
  dt_free(perm);
  return st;
}

void dt_dataset_sample_shape(const dt_dataset *ds, int64_t shape[3]) {
  shape[0] = shape[1] = shape[2] = 1;
  if (ds->info.input < 0) return;
  const dt_field *f = &ds->info.field[ds->info.input];
  const int nd = f->ndim < 3 ? f->ndim : 3; /* right-aligned: a vector (20) is (1, 1, 20) */
  for (int d = 0; d < nd; d++) shape[3 - nd + d] = f->shape[f->ndim - nd + d];
}

int dt_dataset_classes(const dt_dataset *ds) {
  return ds->info.task == DT_TASK_CLASSIFICATION ? ds->info.outputs : 0;
}

void dt_dataset_gather(const dt_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y) {
  assert(ds->info.n_fields == 2 && ds->info.input == 0 && ds->info.target == 1);
  void *fields[2] = {x, y};
  dt_dataset_fetch(ds, idx, n, fields);
}

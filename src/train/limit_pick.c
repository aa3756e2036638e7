/* --limit-pick random: N samples drawn by the seed instead of the first N (see dt_run_pick_limits). */
#include <stdio.h>

#include "core/impl.h"
#include "train/run.h"

#define STREAM_TRAIN 0x4c494d5452000000ull /* "LIMTR": independent of the shuffles' and the split's streams */
#define STREAM_TEST 0x4c494d5445000000ull  /* "LIMTE" */

/* The first n of a Fisher-Yates permutation of [0, size) by Philox(seed, stream), in ascending order (a mask
 * read in order), so reading stays sequential and the subset is a pure function of (size, n, seed). */
static dt_status random_subset(dt_dataset *ds, int64_t n, uint64_t seed, uint64_t stream, dt_dataset **out) {
  const int64_t size = dt_dataset_size(ds);
  int64_t *perm = NULL;
  uint8_t *keep = NULL;
  dt_status st = dt_alloc_array((size_t)size, sizeof *perm, "limit pick", (void **)&perm);
  if (st == DT_OK) st = dt_alloc_array((size_t)size, 1, "limit pick", (void **)&keep);
  if (st == DT_OK) {
    dt_rng rng;
    dt_rng_init(&rng, seed, stream);
    for (int64_t i = 0; i < size; i++) perm[i] = i, keep[i] = 0;
    for (int64_t i = 0; i < n; i++) { /* a partial shuffle: positions [0, n) are the draw */
      const int64_t j = i + (int64_t)dt_rng_below(&rng, (uint32_t)(size - i)), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
      keep[perm[i]] = 1;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < size; i++)
      if (keep[i]) perm[k++] = i;
    st = dt_dataset_subset(ds, perm, n, out);
  }
  dt_free(keep);
  dt_free(perm);
  return st;
}

static int picks_random(dt_limit_pick pick, const dt_dataset *ds) {
  return pick == DT_LIMIT_PICK_RANDOM || (pick == DT_LIMIT_PICK_AUTO && dt_dataset_info(ds)->class_ordered);
}

/* *ds becomes its random subset of limit samples, the old view kept in *unpicked to be freed with the run; the
 * lead rank says so once ("--limit-train 8: a random 8 of 24 samples ..."). */
static dt_status pick(const dt_run *r, const char *flag, dt_dataset **ds, dt_dataset **unpicked, int64_t limit,
                      uint64_t stream) {
  const dt_train_config *c = r->cfg;
  if (!*ds || limit <= 0 || limit >= dt_dataset_size(*ds) || !picks_random(c->limit_pick, *ds)) return DT_OK;
  if (dt_dataset_size(*ds) > UINT32_MAX)
    return dt_error(DT_USAGE, "--limit-pick random: %lld samples are more than it draws from (2^32)",
                    (long long)dt_dataset_size(*ds));
  dt_dataset *sub = NULL;
  DT_CHECK(random_subset(*ds, limit, c->seed, stream, &sub));
  if (r->lead && c->progress)
    fprintf(c->progress, "%s %lld: a random %lld of %lld samples (--limit-pick %s, seed %llu)\n", flag,
            (long long)limit, (long long)limit, (long long)dt_dataset_size(*ds), dt_limit_pick_name(c->limit_pick),
            (unsigned long long)c->seed);
  *unpicked = *ds;
  *ds = sub;
  return DT_OK;
}

dt_status dt_run_pick_limits(dt_run *r) {
  const dt_train_config *c = r->cfg;
  DT_CHECK(pick(r, "--limit-train", &r->train, &r->train_unpicked, c->limit_train, STREAM_TRAIN));
  return pick(r, "--limit-test", &r->val, &r->val_unpicked, c->limit_test, STREAM_TEST);
}

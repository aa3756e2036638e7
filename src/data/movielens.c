/* Data source "movielens": MovieLens ratings as (user, item) -> rating samples, dense ids, leave-last-out and its ranking protocol. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/impl.h"
#include "data/movielens.h"
#include "data/source.h"
#include "dtrain/checkpoint.h"

#define PREFIX "movielens:"
#define NEGATIVES 100                       /* sampled per held-out rating: the NCF paper's protocol */
#define STREAM_NEGATIVES 0x4e45474154000000ull /* "NEGAT" + user index */

typedef struct movielens {
  int64_t n;                /* samples of the split */
  int32_t *user, *item;     /* (n) dense indices */
  float *rating;            /* (n) */
  int64_t n_users, n_items;
  int64_t *user_ids, *item_ids; /* (n_users), (n_items): the original id of each dense index, ascending */
  dt_ml_movies movies;          /* empty without a movies file */
  int32_t *movie_of;            /* (n_items): record in movies, -1 when absent; NULL without a movies file */
  char *user_list, *item_list;  /* the ids as comma lists, for meta */
  dt_kv meta[2];
  int64_t n_queries;            /* ranking: the test split of leave-last-out, else 0 */
  int32_t *query_user;          /* (n_queries) */
  int32_t *candidates;          /* (n_queries, 1 + NEGATIVES) */
} movielens;


/* dir/name into out (4096 bytes); 0 when it does not fit. */
static int join(char *out, const char *dir, const char *name) {
  const int k = snprintf(out, 4096, "%s/%s", dir, name);
  return k > 0 && k < 4096;
}

static const char *dir_of(const char *spec) {
  return strncmp(spec, PREFIX, strlen(PREFIX)) == 0 ? spec + strlen(PREFIX) : spec;
}

/* "movielens:DIR" always (open says what is wrong with DIR); a bare DIR when it holds a ratings file. */
static int claims(const char *spec) {
  if (strncmp(spec, PREFIX, strlen(PREFIX)) == 0) return 1;
  char path[4096];
  return (join(path, spec, "ratings.csv") && dt_is_file(path)) || (join(path, spec, "ratings.dat") && dt_is_file(path));
}

/* Of DIR/<stem>.csv and DIR/<stem>.dat, the one present into path: 1, 0 when neither; both is DT_USAGE. */
static dt_status find_file(const char *dir, const char *stem, char *path, dt_ml_format *fmt, int *found) {
  char csv[4096], dat[4096];
  char name_csv[32], name_dat[32];
  snprintf(name_csv, sizeof name_csv, "%s.csv", stem);
  snprintf(name_dat, sizeof name_dat, "%s.dat", stem);
  if (!join(csv, dir, name_csv) || !join(dat, dir, name_dat))
    return dt_error(DT_USAGE, "--data %s: the directory name is too long", dir);
  const int c = dt_is_file(csv), d = dt_is_file(dat);
  if (c && d)
    return dt_error(DT_USAGE, "%s holds both %s and %s: keep the one to read (ml-latest and ml-25m: .csv, ml-1m: .dat)",
                    dir, name_csv, name_dat);
  *found = c || d;
  if (*found) {
    memcpy(path, c ? csv : dat, 4096);
    *fmt = c ? DT_ML_CSV : DT_ML_DAT;
  }
  return DT_OK;
}

/* Replaces ids[0..n) by their dense index, the rank among the distinct ids in ascending order; *sorted (owned by
 * the caller) gets the distinct ids, *count of them. Ids up to a few times n go through a direct table (every
 * MovieLens release); sparser ids are sorted and looked up. */
static int cmp_i32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static dt_status densify(int32_t *ids, int64_t n, const char *what, int64_t **sorted, int64_t *count) {
  int32_t max = 0;
  for (int64_t i = 0; i < n; i++) max = ids[i] > max ? ids[i] : max;
  int32_t *table = NULL;
  int64_t *out = NULL, k = 0;
  dt_status st;
  if ((int64_t)max < 4 * n + (1 << 20)) {
    /* table[id] = dense index + 1, 0 for an id that does not occur */
    DT_CHECK(dt_alloc_array((size_t)max + 1, sizeof *table, what, (void **)&table));
    for (int64_t i = 0; i < n; i++) table[ids[i]] = 1;
    for (int64_t v = 0; v <= max; v++) k += table[v] != 0;
    DT_CHECK_GOTO(dt_alloc_array((size_t)k, sizeof *out, what, (void **)&out), st, done);
    k = 0;
    for (int64_t v = 0; v <= max; v++)
      if (table[v]) out[k] = v, table[v] = (int32_t)++k;
    for (int64_t i = 0; i < n; i++) ids[i] = table[ids[i]] - 1;
  } else {
    DT_CHECK(dt_alloc_array((size_t)n, sizeof *table, what, (void **)&table));
    memcpy(table, ids, (size_t)n * sizeof *ids);
    qsort(table, (size_t)n, sizeof *table, cmp_i32);
    for (int64_t i = 0; i < n; i++)
      if (i == 0 || table[i] != table[i - 1]) table[k++] = table[i];
    DT_CHECK_GOTO(dt_alloc_array((size_t)k, sizeof *out, what, (void **)&out), st, done);
    for (int64_t j = 0; j < k; j++) out[j] = table[j];
    for (int64_t i = 0; i < n; i++) {
      const int32_t *at = bsearch(&ids[i], table, (size_t)k, sizeof *table, cmp_i32);
      ids[i] = (int32_t)(at - table);
    }
  }
  *sorted = out;
  *count = k;
  st = DT_OK;
done:
  dt_free(table);
  return st;
}

/* The dense index of original movie id, or -1. */
static int64_t item_index(const movielens *s, int64_t id) {
  int64_t lo = 0, hi = s->n_items;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (s->item_ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < s->n_items && s->item_ids[lo] == id ? lo : -1;
}

/* Titles and genres of the rated movies; movies nobody rated are left out, a movie listed twice is corrupt. */
static dt_status read_movies(movielens *s, const char *path, dt_ml_format fmt) {
  DT_CHECK(dt_ml_read_movies(path, fmt, &s->movies));
  DT_CHECK(dt_alloc_array((size_t)s->n_items, sizeof *s->movie_of, "MovieLens titles", (void **)&s->movie_of));
  for (int64_t i = 0; i < s->n_items; i++) s->movie_of[i] = -1;
  for (int64_t m = 0; m < s->movies.n; m++) {
    const int64_t i = item_index(s, s->movies.id[m]);
    if (i < 0) continue;
    if (s->movie_of[i] >= 0)
      return dt_error(DT_CORRUPT, "%s:%lld: movieId %d is listed twice (first on line %lld)", path,
                      (long long)s->movies.line[m], s->movies.id[m], (long long)s->movies.line[s->movie_of[i]]);
    s->movie_of[i] = (int32_t)m;
  }
  return DT_OK;
}

/* ids[0..n) as "1,2,3" into a new string. */
static dt_status id_list(const int64_t *ids, int64_t n, char **out) {
  char *s = NULL;
  DT_CHECK(dt_alloc_array((size_t)n * 21 + 1, 1, "MovieLens id list", (void **)&s));
  size_t k = 0;
  for (int64_t i = 0; i < n; i++) k += (size_t)sprintf(s + k, i ? ",%" PRId64 : "%" PRId64, ids[i]);
  *out = s;
  return DT_OK;
}

/* Leave-last-out: is_test[r] = 1 for each user's latest rating (by timestamp; of equal ones the last in the
 * file), unless it is the user's only rating: that one stays in training and the user has no test row. */
static dt_status hold_out_last(const dt_ml_ratings *r, int64_t n_users, uint8_t *is_test, int64_t *singles) {
  int64_t *latest = NULL, *count = NULL;
  dt_status st;
  DT_CHECK(dt_alloc_array((size_t)n_users, sizeof *latest, "leave-last-out", (void **)&latest));
  DT_CHECK_GOTO(dt_alloc_array((size_t)n_users, sizeof *count, "leave-last-out", (void **)&count), st, done);
  for (int64_t u = 0; u < n_users; u++) latest[u] = -1;
  for (int64_t i = 0; i < r->n; i++) {
    const int32_t u = r->user[i];
    if (latest[u] < 0 || r->time[i] >= r->time[latest[u]]) latest[u] = i;
    count[u]++;
  }
  *singles = 0;
  for (int64_t u = 0; u < n_users; u++) {
    if (count[u] >= 2) is_test[latest[u]] = 1;
    else *singles += 1;
  }
  st = DT_OK;
done:
  dt_free(count);
  dt_free(latest);
  return st;
}

/* The ranking protocol of He et al., "Neural Collaborative Filtering" (WWW 2017), used for HR@10 and NDCG@10:
 * each test row (a user's held-out latest rating) is a query whose candidates are the held-out item first,
 * then NEGATIVES items the user never rated anywhere in the file (training or test), drawn uniformly without
 * replacement from Philox(seed, STREAM_NEGATIVES + user index), so a seed fixes them whatever the thread
 * count; a model ranks the 101 candidates and a hit is the positive in its top 10. Query q is test sample q.
 * A user with fewer than NEGATIVES unrated items cannot be ranked this way: DT_USAGE naming them.
 * r holds every rating (dense ids) and is_test the held-out ones. */
static dt_status sample_ranking(movielens *s, const dt_ml_ratings *r, const uint8_t *is_test, uint64_t seed,
                                const char *dir) {
  const int per = 1 + NEGATIVES;
  int64_t *start = NULL;
  int32_t *rated = NULL, *stamp = NULL, *pool = NULL;
  dt_status st;
  for (int64_t i = 0; i < r->n; i++) s->n_queries += is_test[i];
  DT_CHECK_GOTO(dt_alloc_array((size_t)s->n_queries + 1, sizeof *s->query_user, "ranking", (void **)&s->query_user),
                st, done);
  DT_CHECK_GOTO(dt_alloc_array((size_t)s->n_queries * per + 1, sizeof *s->candidates, "ranking", (void **)&s->candidates),
                st, done);
  /* Every user's rated items (counting sort by user). */
  DT_CHECK_GOTO(dt_alloc_array((size_t)s->n_users + 1, sizeof *start, "ranking", (void **)&start), st, done);
  DT_CHECK_GOTO(dt_alloc_array((size_t)r->n, sizeof *rated, "ranking", (void **)&rated), st, done);
  DT_CHECK_GOTO(dt_alloc_array((size_t)s->n_items, sizeof *stamp, "ranking", (void **)&stamp), st, done);
  DT_CHECK_GOTO(dt_alloc_array((size_t)s->n_items, sizeof *pool, "ranking", (void **)&pool), st, done);
  for (int64_t i = 0; i < r->n; i++) start[r->user[i] + 1]++;
  for (int64_t u = 0; u < s->n_users; u++) start[u + 1] += start[u];
  for (int64_t i = 0; i < r->n; i++) rated[start[r->user[i]]++] = r->item[i];
  for (int64_t u = s->n_users; u > 0; u--) start[u] = start[u - 1];
  start[0] = 0;
  for (int64_t j = 0; j < s->n_items; j++) stamp[j] = -1;
  int64_t q = 0;
  for (int64_t i = 0; i < r->n; i++) {
    if (!is_test[i]) continue;
    const int32_t u = r->user[i];
    int32_t *cand = s->candidates + (size_t)q * per;
    /* stamp[j] == q: item j is rated by u or already drawn */
    int64_t n_rated = 0;
    for (int64_t k = start[u]; k < start[u + 1]; k++)
      if (stamp[rated[k]] != (int32_t)q) stamp[rated[k]] = (int32_t)q, n_rated++;
    const int64_t unrated = s->n_items - n_rated;
    if (unrated < NEGATIVES) {
      st = dt_error(DT_USAGE, "%s: user %" PRId64 " has rated %" PRId64 " of the %" PRId64 " movies, leaving %" PRId64
                    " unrated; the leave-last-out ranking samples %d unrated movies per user",
                    dir, s->user_ids[u], n_rated, s->n_items, unrated, NEGATIVES);
      goto done;
    }
    dt_rng rng;
    dt_rng_init(&rng, seed, STREAM_NEGATIVES + (uint64_t)u);
    cand[0] = r->item[i];
    if (2 * unrated >= s->n_items) {
      /* most items are unrated: draw and reject (under 2 draws per negative on average) */
      for (int k = 1; k < per;) {
        const int32_t j = (int32_t)dt_rng_below(&rng, (uint32_t)s->n_items);
        if (stamp[j] == (int32_t)q) continue;
        stamp[j] = (int32_t)q;
        cand[k++] = j;
      }
    } else {
      /* a heavy rater: a partial Fisher-Yates shuffle of the unrated items */
      int64_t m = 0;
      for (int64_t j = 0; j < s->n_items; j++)
        if (stamp[j] != (int32_t)q) pool[m++] = (int32_t)j;
      for (int k = 0; k < NEGATIVES; k++) {
        const int64_t j = k + dt_rng_below(&rng, (uint32_t)(m - k));
        const int32_t t = pool[j];
        pool[j] = pool[k], pool[k] = t;
        cand[1 + k] = t;
      }
    }
    s->query_user[q++] = u;
  }
  st = DT_OK;
done:
  dt_free(pool);
  dt_free(stamp);
  dt_free(rated);
  dt_free(start);
  return st;
}

static void free_movielens(void *state) {
  movielens *s = state;
  if (!s) return;
  dt_free(s->candidates);
  dt_free(s->query_user);
  dt_free(s->item_list);
  dt_free(s->user_list);
  dt_free(s->movie_of);
  dt_ml_movies_free(&s->movies);
  dt_free(s->item_ids);
  dt_free(s->user_ids);
  dt_free(s->rating);
  dt_free(s->item);
  dt_free(s->user);
  dt_free(s);
}

static dt_status open_movielens(const char *spec, dt_split split, const dt_data_options *opt, void **state,
                                dt_data_info *info, int64_t *n_out) {
  const char *dir = dir_of(spec);
  if (!*dir) return dt_error(DT_USAGE, "--data %s: name a directory after '%s' (e.g. movielens:ml-latest-small)", spec, PREFIX);
  if (opt->holdout != DT_HOLDOUT_DEFAULT && opt->holdout != DT_HOLDOUT_LAST)
    return dt_error(DT_USAGE, "%s: unknown holdout %d", spec, (int)opt->holdout);
  const int last = opt->holdout == DT_HOLDOUT_LAST;
  if (!dt_is_dir(dir)) return dt_error(DT_NOT_FOUND, "%s: not a directory (MovieLens: a directory holding ratings.csv)", dir);
  char ratings_path[4096], movies_path[4096];
  dt_ml_format ratings_fmt = DT_ML_CSV, movies_fmt = DT_ML_CSV;
  int have_ratings = 0, have_movies = 0;
  DT_CHECK(find_file(dir, "ratings", ratings_path, &ratings_fmt, &have_ratings));
  DT_CHECK(find_file(dir, "movies", movies_path, &movies_fmt, &have_movies));
  if (!have_ratings)
    return dt_error(DT_NOT_FOUND, "%s/ratings.csv not found (nor ratings.dat); MovieLens releases are at "
                    "https://grouplens.org/datasets/movielens/", dir);
  if (split == DT_SPLIT_TEST && !last)
    return dt_error(DT_NOT_FOUND, "%s: MovieLens has no test split of its own: hold out a random fraction "
                    "(--val-fraction) or each user's latest rating (leave-last-out)", dir);

  dt_status st;
  dt_ml_ratings r = {0};
  uint8_t *is_test = NULL;
  movielens *s = NULL;
  const double t0 = dt_time_now();
  DT_CHECK_GOTO(dt_ml_read_ratings(ratings_path, ratings_fmt, last, &r), st, done);
  DT_CHECK_GOTO(dt_alloc(sizeof *s, (void **)&s), st, done);
  DT_CHECK_GOTO(densify(r.user, r.n, "MovieLens users", &s->user_ids, &s->n_users), st, done);
  DT_CHECK_GOTO(densify(r.item, r.n, "MovieLens movies", &s->item_ids, &s->n_items), st, done);
  if (have_movies) DT_CHECK_GOTO(read_movies(s, movies_path, movies_fmt), st, done);

  DT_CHECK_GOTO(dt_alloc_array((size_t)r.n, 1, "leave-last-out", (void **)&is_test), st, done);
  if (last) {
    int64_t singles = 0;
    DT_CHECK_GOTO(hold_out_last(&r, s->n_users, is_test, &singles), st, done);
    if (singles)
      DT_LOG_INFO("data", "%s: %lld users with a single rating keep it in training and have no test row", dir,
                  (long long)singles);
    if (split == DT_SPLIT_TEST) DT_CHECK_GOTO(sample_ranking(s, &r, is_test, opt->seed, dir), st, done);
  }
  /* The split's rows, in file order, compacted in place. */
  const uint8_t want = split == DT_SPLIT_TEST;
  int64_t n = 0;
  for (int64_t i = 0; i < r.n; i++)
    if (is_test[i] == want) r.user[n] = r.user[i], r.item[n] = r.item[i], r.rating[n] = r.rating[i], n++;
  s->n = n;
  s->user = r.user, s->item = r.item, s->rating = r.rating;
  r.user = r.item = NULL, r.rating = NULL;

  DT_CHECK_GOTO(id_list(s->user_ids, s->n_users, &s->user_list), st, done);
  DT_CHECK_GOTO(id_list(s->item_ids, s->n_items, &s->item_list), st, done);
  s->meta[0] = (dt_kv){"user_ids", s->user_list};
  s->meta[1] = (dt_kv){"item_ids", s->item_list};

  const int64_t x_shape[1] = {2}, t_shape[1] = {1};
  dt_data_add_field(info, "x", DT_I32, 1, x_shape);
  dt_data_add_field(info, "target", DT_F32, 1, t_shape);
  info->task = DT_TASK_REGRESSION;
  info->outputs = 1;
  info->n_index = 2;
  info->index_size[0] = s->n_users;
  info->index_size[1] = s->n_items;
  info->has_test = last;
  info->val_fraction = last ? 0 : 0.1;
  DT_LOG_INFO("data", "%s %s: %lld of %lld ratings, %lld users, %lld movies%s (%.0f ms)", ratings_path,
              last ? (split == DT_SPLIT_TEST ? "leave-last-out test" : "leave-last-out train") : "all",
              (long long)n, (long long)r.n, (long long)s->n_users, (long long)s->n_items,
              have_movies ? ", titles" : "", (dt_time_now() - t0) * 1e3);
  *n_out = n;
  *state = s;
  s = NULL;
  st = DT_OK;
done:
  free_movielens(s);
  dt_free(is_test);
  dt_ml_ratings_free(&r);
  return st;
}

static void fetch_movielens(const void *state, const int64_t *idx, int n, void *const *fields) {
  const movielens *s = state;
  int32_t *x = fields[0]; /* (n, 2): user, item */
  float *target = fields[1]; /* (n, 1) */
  for (int i = 0; i < n; i++) {
    const int64_t k = idx[i];
    x[2 * i] = s->user[k];
    x[2 * i + 1] = s->item[k];
    target[i] = s->rating[k];
  }
}

static dt_status index_ids(const void *state, int col, const int64_t **ids, int64_t *n) {
  const movielens *s = state;
  if (col != 0 && col != 1)
    return dt_error(DT_INVALID_ARGUMENT, "MovieLens index column %d: there are 0 (users) and 1 (movies)", col);
  *ids = col == 0 ? s->user_ids : s->item_ids;
  *n = col == 0 ? s->n_users : s->n_items;
  return DT_OK;
}

static const char *index_text(const void *state, int col, int64_t i, int part) {
  const movielens *s = state;
  if (col != 1 || i < 0 || i >= s->n_items || (part != 0 && part != 1) || !s->movie_of || s->movie_of[i] < 0)
    return NULL;
  const int32_t m = s->movie_of[i];
  return s->movies.text + (part == 0 ? s->movies.title[m] : s->movies.genres[m]);
}

static int meta(const void *state, const dt_kv **kv) {
  const movielens *s = state;
  *kv = s->meta;
  return 2;
}

static dt_status ranking(const void *state, dt_ranking *out) {
  const movielens *s = state;
  if (!s->candidates)
    return dt_error(DT_NOT_FOUND, "MovieLens has a ranking only on the test split of leave-last-out");
  *out = (dt_ranking){.n = s->n_queries, .per = 1 + NEGATIVES, .user = s->query_user, .items = s->candidates};
  return DT_OK;
}

const dt_source_ops dt_source_movielens = {
    .name = "movielens",
    .doc = "a directory (or movielens:DIR) holding MovieLens ratings.csv or ratings.dat, optionally movies.csv/.dat",
    .claims = claims,
    .open = open_movielens,
    .fetch = fetch_movielens,
    .free = free_movielens,
    .index_ids = index_ids,
    .index_text = index_text,
    .meta = meta,
    .ranking = ranking,
};

/* Tests of the distributed sampler: PyTorch's known orders, coverage across ranks, padding accounting, errors, the loader adapter. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* Every rank's indices for one configuration: all[rank * m + i]; returns m or -1. */
static int64_t all_ranks(int64_t n, int R, uint64_t seed, int64_t epoch, int shuffle, int drop_last, int64_t *all,
                         int64_t *real) {
  int64_t m = -1;
  for (int r = 0; r < R; r++) {
    dt_dist_sampler *s = NULL;
    if (dt_dist_sampler_new(n, R, r, seed, shuffle, drop_last, &s) != DT_OK) return -1;
    int64_t mr = dt_dist_sampler_num_samples(s);
    if (m >= 0 && mr != m) m = -2;
    if (m != -2) m = mr;
    real[r] = dt_dist_sampler_num_real(s);
    dt_status st = m >= 0 ? dt_dist_sampler_indices(s, epoch, all + (int64_t)r * mr) : DT_OK;
    dt_dist_sampler_free(s);
    if (st != DT_OK || m < 0) return -1;
  }
  return m;
}

/* One rank's list. */
static dt_status one_rank(int64_t n, int R, int rank, uint64_t seed, int64_t epoch, int shuffle, int drop_last,
                          int64_t *out, int64_t *m) {
  dt_dist_sampler *s = NULL;
  dt_status st = dt_dist_sampler_new(n, R, rank, seed, shuffle, drop_last, &s);
  if (st != DT_OK) return st;
  *m = dt_dist_sampler_num_samples(s);
  st = dt_dist_sampler_indices(s, epoch, out);
  dt_dist_sampler_free(s);
  return st;
}

/* Values printed by torch 1.13.1: torch.randperm(n, generator=g) after
 * g.manual_seed(seed), and DistributedSampler lists after set_epoch. If the
 * MT19937 or the shuffle breaks, these fail without needing Python. */
TEST(matches_torch_known_values) {
  int64_t out[1000], m;
  static const int64_t seed0[10] = {4, 1, 7, 5, 3, 9, 0, 8, 6, 2};
  ASSERT_OK(one_rank(10, 1, 0, 0, 0, 1, 0, out, &m));
  ASSERT_EQ(m, 10);
  for (int i = 0; i < 10; i++) ASSERT_EQ(out[i], seed0[i]);
  /* the generator keeps the low 32 bits of the seed: 2^40 + 3 is 3 */
  static const int64_t seed3[10] = {6, 0, 3, 7, 8, 5, 1, 9, 2, 4};
  ASSERT_OK(one_rank(10, 1, 0, ((uint64_t)1 << 40) + 3, 0, 1, 0, out, &m));
  for (int i = 0; i < 10; i++) ASSERT_EQ(out[i], seed3[i]);
  /* the epoch adds to the seed */
  ASSERT_OK(one_rank(10, 1, 0, 1, 2, 1, 0, out, &m));
  for (int i = 0; i < 10; i++) ASSERT_EQ(out[i], seed3[i]);
  /* beyond the first 624 draws (the state is regenerated) */
  static const int64_t tail42[10] = {219, 318, 894, 2, 770, 335, 284, 638, 96, 455};
  ASSERT_OK(one_rank(1000, 1, 0, 42, 0, 1, 0, out, &m));
  for (int i = 0; i < 10; i++) ASSERT_EQ(out[990 + i], tail42[i]);
  /* DistributedSampler(range(10), 4, rank 3, seed=7), set_epoch(2): padded */
  static const int64_t r3[3] = {7, 1, 5};
  ASSERT_OK(one_rank(10, 4, 3, 7, 2, 1, 0, out, &m));
  ASSERT_EQ(m, 3);
  for (int i = 0; i < 3; i++) ASSERT_EQ(out[i], r3[i]);
  /* same with drop_last, rank 1 */
  ASSERT_OK(one_rank(10, 4, 1, 7, 2, 1, 1, out, &m));
  ASSERT_EQ(m, 2);
  ASSERT_EQ(out[0], 5);
  ASSERT_EQ(out[1], 2);
}

TEST(sequential_is_strided_and_padded_from_the_head) {
  int64_t out[8], m;
  /* n 10, 4 replicas: padded list 0..9, 0, 1; rank 2 takes 2, 6, 0 */
  ASSERT_OK(one_rank(10, 4, 2, 99, 3, 0, 0, out, &m));
  ASSERT_EQ(m, 3);
  ASSERT_EQ(out[0], 2);
  ASSERT_EQ(out[1], 6);
  ASSERT_EQ(out[2], 0);
  /* padding longer than the list repeats it: n 2, 7 replicas -> 0 1 0 1 0 1 0 */
  ASSERT_OK(one_rank(2, 7, 5, 0, 0, 0, 0, out, &m));
  ASSERT_EQ(m, 1);
  ASSERT_EQ(out[0], 1);
  /* drop_last with fewer samples than replicas: nothing */
  ASSERT_OK(one_rank(2, 7, 0, 0, 0, 0, 1, out, &m));
  ASSERT_EQ(m, 0);
}

/* The union over ranks: each sample once plus the padding (every rank the same
 * count), or each at most once with drop_last; num_real counts each once. */
TEST(ranks_cover_the_dataset_exactly) {
  static const int64_t ns[] = {0, 1, 3, 7, 10, 100, 1001};
  int64_t *all = malloc(sizeof *all * 1100 * 2), real[8];
  int *count = malloc(sizeof *count * 1001);
  ASSERT(all && count);
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    const int64_t n = ns[k];
    for (int R = 1; R <= 8; R++)
      for (int shuffle = 0; shuffle <= 1; shuffle++)
        for (int dl = 0; dl <= 1; dl++) {
          int64_t m = all_ranks(n, R, 5, 3, shuffle, dl, all, real);
          ASSERT_MSG(m >= 0, dt_last_error());
          ASSERT_EQ(m, dl ? n / R : (n + R - 1) / R);
          memset(count, 0, sizeof *count * 1001);
          int64_t real_sum = 0;
          for (int r = 0; r < R; r++) {
            ASSERT(real[r] >= 0 && real[r] <= m);
            if (dl) ASSERT_EQ(real[r], m);
            real_sum += real[r];
            for (int64_t i = 0; i < m; i++) {
              int64_t v = all[r * m + i];
              ASSERT(v >= 0 && v < n);
              if (i < real[r]) count[v]++;
            }
          }
          if (dl) {
            ASSERT_EQ(real_sum, (n / R) * R);
            for (int64_t v = 0; v < n; v++) ASSERT(count[v] <= 1); /* no duplicates */
          } else {
            ASSERT_EQ(real_sum, n);
            for (int64_t v = 0; v < n; v++) ASSERT_EQ(count[v], 1);
            /* the padding: under one per rank, each the rank's last entry, a
             * repeat of the order from its head (position p holds position p % n) */
            int64_t pad = m * R - n;
            ASSERT(pad >= 0 && pad < R);
            for (int r = 0; r < R; r++)
              for (int64_t i = real[r]; i < m; i++) {
                ASSERT_EQ(i, m - 1);
                int64_t q = (r + i * R) % n;
                ASSERT_EQ(all[r * m + i], all[(q % R) * m + q / R]);
              }
          }
        }
  }
  free(count);
  free(all);
}

TEST(epochs_differ_and_repeat) {
  int64_t a[100], b[100], c[100], m;
  ASSERT_OK(one_rank(300, 3, 1, 11, 4, 1, 0, a, &m));
  ASSERT_OK(one_rank(300, 3, 1, 11, 4, 1, 0, b, &m));
  ASSERT_OK(one_rank(300, 3, 1, 11, 5, 1, 0, c, &m));
  ASSERT(memcmp(a, b, sizeof a) == 0);
  ASSERT(memcmp(a, c, sizeof a) != 0);
  /* one object, several epochs, back again */
  dt_dist_sampler *s = NULL;
  ASSERT_OK(dt_dist_sampler_new(300, 3, 1, 11, 1, 0, &s));
  ASSERT_OK(dt_dist_sampler_indices(s, 5, b));
  ASSERT(memcmp(b, c, sizeof b) == 0);
  ASSERT_OK(dt_dist_sampler_indices(s, 4, b));
  ASSERT(memcmp(a, b, sizeof a) == 0);
  dt_dist_sampler_free(s);
}

TEST(argument_errors_name_the_value) {
  dt_dist_sampler *s = (dt_dist_sampler *)(intptr_t)1;
  ASSERT_STATUS(dt_dist_sampler_new(10, 4, 4, 0, 1, 0, &s), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "rank 4") != NULL);
  ASSERT_STATUS(dt_dist_sampler_new(10, 4, -1, 0, 1, 0, &s), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "rank -1") != NULL);
  ASSERT_STATUS(dt_dist_sampler_new(10, 0, 0, 0, 1, 0, &s), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "replicas 0") != NULL);
  ASSERT_STATUS(dt_dist_sampler_new(-3, 2, 0, 0, 1, 0, &s), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "-3") != NULL);
  ASSERT_STATUS(dt_dist_sampler_new(10, 2, 0, 0, 1, 0, NULL), DT_INVALID_ARGUMENT);
  ASSERT(s == (dt_dist_sampler *)(intptr_t)1); /* untouched on failure */
  ASSERT_OK(dt_dist_sampler_new(10, 2, 0, 0, 1, 0, &s));
  ASSERT_STATUS(dt_dist_sampler_indices(s, 0, NULL), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_dist_sampler_fn(s, 0, NULL, NULL), DT_INVALID_ARGUMENT);
  dt_dist_sampler_free(s);
  dt_dist_sampler_free(NULL);
  /* an empty dataset is valid: no samples */
  ASSERT_OK(dt_dist_sampler_new(0, 3, 2, 0, 1, 0, &s));
  ASSERT_EQ(dt_dist_sampler_num_samples(s), 0);
  ASSERT_EQ(dt_dist_sampler_num_real(s), 0);
  ASSERT_OK(dt_dist_sampler_indices(s, 7, NULL));
  dt_dist_sampler_free(s);
}

/* ---- with dt_loader ------------------------------------------------------------ */

/* A dataset of n 2x3 images whose first two pixels spell the sample number. */
static dt_dataset *numbered_dataset(int n) {
  char dir[64], ip[128], lp[128];
  snprintf(dir, sizeof dir, "/tmp/dt_test_sampler_XXXXXX");
  if (!mkdtemp(dir)) return NULL;
  snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte", dir);
  snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte", dir);
  size_t ilen = 16 + (size_t)n * 6, llen = 8 + (size_t)n;
  uint8_t *img = calloc(ilen, 1), *lab = calloc(llen, 1);
  int ok = img && lab;
  if (ok) {
    const uint8_t ih[16] = {0, 0, 8, 3, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n, 0, 0, 0, 2, 0, 0, 0, 3};
    const uint8_t lh[8] = {0, 0, 8, 1, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    memcpy(img, ih, 16);
    memcpy(lab, lh, 8);
    for (int i = 0; i < n; i++) {
      img[16 + 6 * i] = (uint8_t)(i & 255);
      img[16 + 6 * i + 1] = (uint8_t)(i >> 8);
      lab[8 + i] = (uint8_t)(i % 10);
    }
    FILE *fi = fopen(ip, "wb"), *fl = fopen(lp, "wb");
    ok = fi && fl && fwrite(img, 1, ilen, fi) == ilen && fwrite(lab, 1, llen, fl) == llen;
    if (fi) ok = (fclose(fi) == 0) && ok;
    if (fl) ok = (fclose(fl) == 0) && ok;
  }
  free(img);
  free(lab);
  dt_dataset *ds = NULL;
  if (ok && dt_dataset_load(dir, DT_SPLIT_TRAIN, NULL, &ds) != DT_OK) ds = NULL;
  unlink(ip);
  unlink(lp);
  rmdir(dir);
  return ds;
}

static int64_t sample_of(const float *x) {
  return lroundf(x[0] * 255.0f) + 256 * lroundf(x[1] * 255.0f);
}

TEST(loader_visits_the_sampler_order) {
  const int n = 103, R = 3, bs = 8;
  dt_dataset *ds = numbered_dataset(n);
  ASSERT(ds != NULL);
  int seen[103] = {0};
  for (int rank = 0; rank < R; rank++) {
    dt_dist_sampler *s = NULL;
    ASSERT_OK(dt_dist_sampler_new(n, R, rank, 42, 1, 0, &s));
    const int64_t m = dt_dist_sampler_num_samples(s), real = dt_dist_sampler_num_real(s);
    dt_loader_config c = {.batch_size = bs, .prefetch = 2, .sampler = dt_dist_sampler_fn, .sampler_user = s,
                          .sampler_capacity = m};
    dt_loader *l = NULL;
    ASSERT_OK(dt_loader_new(ds, &c, &l));
    ASSERT_EQ(dt_loader_samples_per_epoch(l), m);
    ASSERT_EQ(dt_loader_batches_per_epoch(l), (m + bs - 1) / bs);
    int64_t want[40];
    for (int64_t epoch = 0; epoch < 3; epoch++) {
      ASSERT_OK(dt_dist_sampler_indices(s, epoch, want));
      ASSERT_OK(dt_loader_start_epoch(l, epoch));
      int64_t pos = 0;
      for (;;) {
        dt_batch b;
        ASSERT_OK(dt_loader_next(l, &b));
        if (b.size == 0) break;
        for (int i = 0; i < b.size; i++, pos++) {
          ASSERT(pos < m);
          ASSERT_EQ(sample_of((const float *)b.x + 6 * i), want[pos]);
          ASSERT_EQ(b.y[i], want[pos] % 10);
          if (epoch == 1 && pos < real) seen[want[pos]]++;
        }
      }
      ASSERT_EQ(pos, m);
    }
    dt_loader_free(l);
    dt_dist_sampler_free(s);
  }
  for (int i = 0; i < n; i++) ASSERT_EQ(seen[i], 1);
  dt_dataset_free(ds);
}

TEST_MAIN(TEST_ENTRY(matches_torch_known_values), TEST_ENTRY(sequential_is_strided_and_padded_from_the_head),
          TEST_ENTRY(ranks_cover_the_dataset_exactly), TEST_ENTRY(epochs_differ_and_repeat),
          TEST_ENTRY(argument_errors_name_the_value), TEST_ENTRY(loader_visits_the_sampler_order))

/* DistributedSampler: PyTorch's per-rank epoch order (torch.randperm on a seeded MT19937, head padding, rank striding). */
#include <stdint.h>

#include "core/impl.h"
#include "dtrain/data.h"

/* ---- MT19937, as torch's CPU generator (at::mt19937) ------------------------ */
/* torch.Generator().manual_seed(s) builds mt19937(s), whose init keeps the low
 * 32 bits of the 64-bit seed; random() is one 32-bit draw. Same sequence as
 * std::mt19937. */
enum { MT_N = 624, MT_M = 397 };

typedef struct mt19937 {
  uint32_t state[MT_N];
  int next; /* index of the next word to temper; MT_N: regenerate first */
} mt19937;

static void mt_seed(mt19937 *mt, uint64_t seed) {
  mt->state[0] = (uint32_t)seed;
  for (uint32_t j = 1; j < MT_N; j++)
    mt->state[j] = 1812433253u * (mt->state[j - 1] ^ (mt->state[j - 1] >> 30)) + j;
  mt->next = MT_N;
}

static void mt_regenerate(mt19937 *mt) {
  uint32_t *s = mt->state;
  for (int j = 0; j < MT_N; j++) {
    uint32_t y = (s[j] & 0x80000000u) | (s[(j + 1) % MT_N] & 0x7fffffffu);
    s[j] = s[(j + MT_M) % MT_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
  }
  mt->next = 0;
}

static inline uint32_t mt_next32(mt19937 *mt) {
  if (mt->next == MT_N) mt_regenerate(mt);
  uint32_t y = mt->state[mt->next++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

/* torch.randperm(n, generator=g) on the CPU (aten randperm_cpu, 1.13): a
 * forward Fisher-Yates swapping i with i + random() % (n - i), one 32-bit draw
 * per step, for every n (checked against torch 1.13 at n = 214748364). Later
 * PyTorch releases switched n >= UINT32_MAX / 20 to an inside-out shuffle on
 * 64-bit draws; below that bound their order is this one. */
static void randperm(int64_t n, uint64_t seed, int64_t *perm) {
  /* 2.5 KiB of state: on the stack, so a sampler holds nothing but the scratch array. */
  mt19937 mt;
  mt_seed(&mt, seed);
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = 0; i < n - 1; i++) {
    int64_t z = (int64_t)(mt_next32(&mt) % (uint64_t)(n - i));
    int64_t t = perm[i];
    perm[i] = perm[z + i];
    perm[z + i] = t;
  }
}

/* ---- the sampler --------------------------------------------------------------- */
struct dt_dist_sampler {
  int64_t n;
  int replicas, rank;
  uint64_t seed;
  int shuffle, drop_last;
  int64_t num_samples; /* per rank */
  int64_t *perm;       /* (n) scratch for the epoch's permutation; NULL without shuffle */
};

dt_status dt_dist_sampler_new(int64_t n, int replicas, int rank, uint64_t seed, int shuffle, int drop_last,
                              dt_dist_sampler **out) {
  if (!out) return dt_error(DT_INVALID_ARGUMENT, "dt_dist_sampler_new: NULL out");
  if (n < 0) return dt_error(DT_INVALID_ARGUMENT, "distributed sampler: dataset size %lld must be >= 0", (long long)n);
  if (replicas < 1)
    return dt_error(DT_INVALID_ARGUMENT, "distributed sampler: replicas %d must be >= 1", replicas);
  if (rank < 0 || rank >= replicas)
    return dt_error(DT_INVALID_ARGUMENT, "distributed sampler: rank %d must be in [0, %d]", rank, replicas - 1);
  dt_dist_sampler *s = NULL;
  DT_CHECK(dt_alloc(sizeof *s, (void **)&s));
  s->n = n;
  s->replicas = replicas;
  s->rank = rank;
  s->seed = seed;
  s->shuffle = shuffle != 0;
  s->drop_last = drop_last != 0;
  /* PyTorch: drop_last and n % replicas != 0 gives ceil((n - replicas) / replicas),
   * which is floor(n / replicas) (0 when n < replicas); otherwise ceil(n / replicas). */
  s->num_samples = s->drop_last ? n / replicas : (n + replicas - 1) / replicas;
  if (s->shuffle && n > 0) {
    dt_status st = dt_alloc_array((size_t)n, sizeof *s->perm, "sampler permutation", (void **)&s->perm);
    if (st != DT_OK) {
      dt_free(s);
      return st;
    }
  }
  *out = s;
  return DT_OK;
}

void dt_dist_sampler_free(dt_dist_sampler *s) {
  if (!s) return;
  dt_free(s->perm);
  dt_free(s);
}

int64_t dt_dist_sampler_num_samples(const dt_dist_sampler *s) { return s->num_samples; }

int64_t dt_dist_sampler_num_real(const dt_dist_sampler *s) {
  if (s->drop_last) return s->num_samples;
  /* positions rank, rank + R, ... below n */
  return s->rank < s->n ? (s->n - s->rank + s->replicas - 1) / s->replicas : 0;
}

dt_status dt_dist_sampler_indices(dt_dist_sampler *s, int64_t epoch, int64_t *out) {
  if (!s || (!out && s->num_samples > 0))
    return dt_error(DT_INVALID_ARGUMENT, "dt_dist_sampler_indices: NULL sampler or out");
  const int64_t n = s->n, R = s->replicas, m = s->num_samples;
  if (m == 0) return DT_OK;
  /* Rank r's i-th sample is position r + i R of the (padded or cut) list, and
   * the padded list is the order repeated: position p holds order[p % n].
   * With drop_last every position is < n. */
  if (!s->shuffle) {
    for (int64_t i = 0, p = s->rank; i < m; i++, p += R) out[i] = p < n ? p : p % n;
    return DT_OK;
  }
  /* Python adds seed + epoch as integers; the generator keeps 64 bits of it. */
  randperm(n, s->seed + (uint64_t)epoch, s->perm);
  for (int64_t i = 0, p = s->rank; i < m; i++, p += R) out[i] = s->perm[p < n ? p : p % n];
  return DT_OK;
}

dt_status dt_dist_sampler_fn(void *user, int64_t epoch, int64_t *out, int64_t *n) {
  dt_dist_sampler *s = user;
  if (!s || !n) return dt_error(DT_INVALID_ARGUMENT, "dt_dist_sampler_fn: NULL sampler or count");
  DT_CHECK(dt_dist_sampler_indices(s, epoch, out));
  *n = s->num_samples;
  return DT_OK;
}

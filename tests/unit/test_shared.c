/* Memory the ranks of a group share (dt_group_share) and the all-reduce that
 * reads it in place: the same bits as the slot path on world sizes 2 to 4 over
 * dtypes, ops, sizes and offsets; a rank whose buffer is elsewhere falls back;
 * a share that fails on one rank fails on all of them and leaves the group
 * usable; tcp and one-rank groups share nothing; a rank that dies is
 * DT_PEER_LOST, not a hang; nothing is left in /dev/shm. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>
#include <stdatomic.h>

#include "dist/dist-impl.h"
#include "dist_fork.h"
#include "dist_values.h"
#include "harness.h"

#define RUN_ID "shared"
#define SHARED_BYTES (3u << 20)

static int next_round;

static df_job job(const char *backend) {
  return (df_job){.port = df_start_store(RUN_ID), .run_id = RUN_ID, .round = next_round++, .backend = backend,
                  .timeout_s = 30};
}

static dt_group *join(df_job *j, int r, int world) {
  dt_group *g = NULL;
  if (df_join(j, r, world, &g) != DT_OK) {
    fprintf(stderr, "rank %d: join: %s\n", r, dt_last_error());
    return NULL;
  }
  return g;
}

/* How many 4 KiB pages of [p, p + bytes) this process has no page-table entry for yet (/proc/self/pagemap: bit 63
 * of a page's entry says present); -1 where pagemap cannot be read. A share maps every page at once, so a step
 * pays no fault at its first read of a page another rank wrote. */
static long pages_not_mapped(const void *p, size_t bytes) {
  const int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) return -1;
  long missing = 0;
  for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095; a < (uintptr_t)p + bytes; a += 4096) {
    uint64_t e = 0;
    if (pread(fd, &e, sizeof e, (off_t)(a / 4096 * sizeof e)) != (ssize_t)sizeof e) {
      missing = -1;
      break;
    }
    missing += !(e >> 63);
  }
  close(fd);
  return missing;
}

/* Joins as rank r and shares SHARED_BYTES into *mem, every page mapped; NULL (said on stderr) if not. */
static dt_group *join_shared(df_job *j, int r, int world, void **mem) {
  dt_group *g = join(j, r, world);
  if (g && dt_group_share(g, SHARED_BYTES, mem) != DT_OK) {
    fprintf(stderr, "rank %d: share: %s\n", r, dt_last_error());
    return NULL;
  }
  const long unmapped = g ? pages_not_mapped(*mem, SHARED_BYTES) : 0;
  if (unmapped < 0) fprintf(stderr, "rank %d: /proc/self/pagemap unreadable: mapping not checked\n", r);
  if (unmapped > 0) {
    fprintf(stderr, "rank %d: %ld pages of the shared memory not mapped yet\n", r, unmapped);
    return NULL;
  }
  return g;
}

static uint64_t shared_runs(dt_group *g) { return dt_group_shared_allreduces(g); }

/* Element i of rank r: fractional for floats, so a sum in another order gives other bits. */
static double value(int r, size_t i, dt_dtype t) {
  const double v = (double)((int)((i * 7 + (size_t)r * 13) % 23) - 11);
  return t == DT_I32 || t == DT_I64 ? v : v / 3.0 + (double)r * 0.37;
}

typedef struct shared_case {
  dt_dtype t;
  dt_redop op;
  size_t count, at; /* elements, and the byte offset into the shared memory */
} shared_case;

static const shared_case cases[] = {
    {DT_F32, DT_SUM, 262144, 0},       {DT_F32, DT_AVG, 100003, 4096},   {DT_F32, DT_SUM, 8193, 12},
    {DT_F64, DT_MAX, 70001, 8},        {DT_BF16, DT_SUM, 300001, 2},     {DT_F16, DT_MIN, 16411, 6},
    {DT_I32, DT_SUM, 40000, 64},       {DT_I64, DT_MIN, 9000, 256},      {DT_F32, DT_SUM, 786432, 0},
    {DT_F32, DT_AVG, 400003, 128},     {DT_BF16, DT_AVG, 600001, 0},     {DT_I32, DT_AVG, 300000, 4},
};

/* f32: the sum in rank order (and the division of DT_AVG), as the backend must compute it, bit for bit. */
static int f32_matches_reference(const float *got, const shared_case *k, int world) {
  for (size_t i = 0; i < k->count; i++) {
    float want = (float)value(0, i, DT_F32);
    for (int q = 1; q < world; q++) want += (float)value(q, i, DT_F32);
    if (k->op == DT_AVG) want /= (float)world;
    if (got[i] != want) {
      fprintf(stderr, "element %zu of %zu: %.9g, want %.9g\n", i, k->count, got[i], want);
      return 0;
    }
  }
  return 1;
}

/* Every case in place on the shared memory and on a private copy (the slot path): identical bytes; and each
 * shared one counted as run from shared memory. */
static int same_bits_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  void *mem = NULL;
  dt_group *g = join_shared(j, r, world, &mem);
  if (!g) return 2;
  int bad = 0;
  char *priv = malloc(SHARED_BYTES);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0] && !bad; c++) {
    const shared_case *k = &cases[c];
    const size_t es = dt_dtype_size(k->t);
    char *a = (char *)mem + k->at, *b = priv + k->at;
    for (size_t i = 0; i < k->count; i++) dv_put(a, k->t, i, value(r, i, k->t));
    memcpy(b, a, k->count * es);
    const uint64_t before = shared_runs(g);
    if (dt_allreduce(g, a, a, k->count, k->t, k->op, NULL) != DT_OK ||
        dt_allreduce(g, b, b, k->count, k->t, k->op, NULL) != DT_OK) {
      fprintf(stderr, "rank %d case %zu: %s\n", r, c, dt_last_error());
      bad = 1;
    } else if (memcmp(a, b, k->count * es) != 0) {
      fprintf(stderr, "rank %d case %zu (%s %s %zu at %zu): shared and slot results differ\n", r, c,
              dt_dtype_name(k->t), dt_redop_name(k->op), k->count, k->at);
      bad = 1;
    } else if (shared_runs(g) != before + 1) {
      fprintf(stderr, "rank %d case %zu: %llu all-reduces from shared memory, want 1\n", r, c,
              (unsigned long long)(shared_runs(g) - before));
      bad = 1;
    }
    /* against the reference too: both paths divide DT_AVG as they reduce, and must be right, not just alike */
    if (!bad && k->t == DT_F32 && (k->op == DT_SUM || k->op == DT_AVG) && !f32_matches_reference((float *)a, k, world))
      bad = 1;
    if (!bad && k->t == DT_I32 && k->op == DT_SUM && dv_get(a, k->t, 5) != dv_reference(k->op, world, 5)) bad = 1;
  }
  free(priv);
  dt_group_unshare(g, mem);
  dt_group_destroy(g);
  dt_shared_free(mem, SHARED_BYTES);
  return bad;
}

TEST(shared_allreduce_gives_the_slot_paths_bits_world_2_to_4) {
  for (int world = 2; world <= 4; world++) {
    df_job j = job("shm");
    ASSERT_MSG(df_run(&j, world, same_bits_child, NULL) == 0,
               world == 2 ? "world 2" : world == 3 ? "world 3" : "world 4");
  }
}

/* Sums n floats of value(rank, i) at buf in place and checks the result; 0 if right. */
static int sum_checked(dt_group *g, float *buf, size_t n, int r, int world) {
  for (size_t i = 0; i < n; i++) buf[i] = (float)value(r, i, DT_F32);
  if (dt_allreduce(g, buf, buf, n, DT_F32, DT_SUM, NULL) != DT_OK) {
    fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    float want = 0;
    for (int q = 0; q < world; q++) want += (float)value(q, i, DT_F32);
    if (buf[i] != want) {
      fprintf(stderr, "rank %d element %zu: %g, want %g\n", r, i, buf[i], want);
      return 1;
    }
  }
  return 0;
}

/* Back-to-back all-reduces of 2.3 MiB (5 chunks) on the shared memory, each rank writing its next input as soon as
 * its call returns: the last sync must hold every rank in the collective until nobody reads its memory any more. */
static int back_to_back_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  void *mem = NULL;
  dt_group *g = join_shared(j, r, world, &mem);
  if (!g) return 2;
  float *buf = mem;
  const size_t n = 600000;
  int bad = 0;
  for (size_t it = 0; it < 30 && !bad; it++) {
    for (size_t i = 0; i < n; i++) buf[i] = (float)((i * 7 + (size_t)r * 13 + it * 5) % 23);
    if (dt_allreduce(g, buf, buf, n, DT_F32, DT_SUM, NULL) != DT_OK) {
      fprintf(stderr, "rank %d all-reduce %zu: %s\n", r, it, dt_last_error());
      bad = 1;
    }
    for (size_t i = 0; i < n && !bad; i++) {
      float want = 0;
      for (int q = 0; q < world; q++) want += (float)((i * 7 + (size_t)q * 13 + it * 5) % 23);
      if (buf[i] != want) {
        fprintf(stderr, "rank %d all-reduce %zu element %zu: %g, want %g\n", r, it, i, buf[i], want);
        bad = 1;
      }
    }
  }
  if (!bad && shared_runs(g) != 30) bad = 1, fprintf(stderr, "rank %d: %llu of 30 run from shared memory\n", r,
                                                     (unsigned long long)shared_runs(g));
  dt_group_unshare(g, mem);
  dt_group_destroy(g);
  dt_shared_free(mem, SHARED_BYTES);
  return bad;
}

TEST(back_to_back_allreduces_on_shared_memory_world_2_and_3) {
  for (int world = 2; world <= 3; world++) {
    df_job j = job("shm");
    ASSERT_MSG(df_run(&j, world, back_to_back_child, NULL) == 0, world == 2 ? "world 2" : "world 3");
  }
}

/* Rank 1's buffer is private (or at another offset): every rank falls back to the slots, with the right sum. */
static int fallback_child(df_job *j, int r, int world, void *arg) {
  const int other_offset = *(int *)arg;
  void *mem = NULL;
  dt_group *g = join_shared(j, r, world, &mem);
  if (!g) return 2;
  const size_t n = 200000;
  float *priv = malloc(n * sizeof(float));
  int bad = sum_checked(g, r != 1 ? (float *)mem : other_offset ? (float *)mem + 16 : priv, n, r, world);
  if (shared_runs(g) != 0) bad = 1, fprintf(stderr, "rank %d ran from shared memory\n", r);
  free(priv);
  dt_group_unshare(g, mem);
  dt_group_destroy(g);
  dt_shared_free(mem, SHARED_BYTES);
  return bad;
}

TEST(a_buffer_elsewhere_on_one_rank_goes_through_the_slots) {
  for (int other_offset = 0; other_offset <= 1; other_offset++) {
    df_job j = job("shm");
    ASSERT_MSG(df_run(&j, 3, fallback_child, &other_offset) == 0,
               other_offset ? "rank 1 at another offset" : "rank 1 private");
  }
}

/* After dt_group_unshare the memory is the caller's and all-reduces on it go through the slots. */
static int unshare_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  void *mem = NULL;
  dt_group *g = join_shared(j, r, world, &mem);
  if (!g) return 2;
  float *f = mem;
  const size_t n = 100000;
  for (size_t i = 0; i < n; i++) f[i] = 1.0f;
  int bad = dt_allreduce(g, f, f, n, DT_F32, DT_SUM, NULL) != DT_OK || shared_runs(g) != 1;
  dt_group_unshare(g, mem);
  bad |= dt_allreduce(g, f, f, n, DT_F32, DT_SUM, NULL) != DT_OK || shared_runs(g) != 1;
  bad |= f[0] != (float)(world * world) || f[n - 1] != (float)(world * world);
  dt_group_destroy(g);
  dt_shared_free(mem, SHARED_BYTES);
  return bad;
}

TEST(unshared_memory_goes_through_the_slots) {
  df_job j = job("shm");
  ASSERT_EQ(df_run(&j, 2, unshare_child, NULL), 0);
}

/* Rank 1 asks for another size, then all for none: each share fails on every rank, naming why; the group
 * still works, large all-reduces included, and a later share succeeds. */
static int failed_share_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g = join(j, r, world);
  if (!g) return 2;
  void *mem = (void *)1;
  const dt_status st = dt_group_share(g, r == 1 ? 8192 : 4096, &mem);
  int bad = st != DT_UNSUPPORTED || mem != NULL || !strstr(dt_last_error(), "shares 8192 bytes");
  if (bad) fprintf(stderr, "rank %d: share gave %d: %s\n", r, (int)st, dt_last_error());
  const dt_status none = dt_group_share(g, 0, &mem); /* a bad size, refused alike on every rank */
  if (none != DT_UNSUPPORTED || mem != NULL || !strstr(dt_last_error(), "nothing to share")) {
    fprintf(stderr, "rank %d: a share of 0 bytes gave %d: %s\n", r, (int)none, dt_last_error());
    bad = 1;
  }
  double x = 1;
  bad |= dt_allreduce(g, &x, &x, 1, DT_F64, DT_SUM, NULL) != DT_OK || x != world;
  const size_t n = 100000;
  float *priv = malloc(n * sizeof(float));
  bad |= sum_checked(g, priv, n, r, world);
  free(priv);
  if (dt_group_share(g, n * sizeof(float), &mem) != DT_OK) {
    fprintf(stderr, "rank %d: the second share: %s\n", r, dt_last_error());
    bad = 1;
  } else {
    bad |= sum_checked(g, mem, n, r, world) || shared_runs(g) != 1;
    dt_group_unshare(g, mem);
    dt_shared_free(mem, n * sizeof(float));
  }
  dt_group_destroy(g);
  return bad;
}

TEST(a_share_failing_on_one_rank_fails_on_all_and_the_group_goes_on) {
  df_job j = job("shm");
  ASSERT_EQ(df_run(&j, 3, failed_share_child, NULL), 0);
}

/* Rank 0 unshares the first region, then both share a second: rank 0 sums on the second, rank 1 on the first
 * (the same offset). The shares differ, so the slots carry it, with the right sum. */
static int one_sided_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  void *a = NULL, *b = NULL;
  dt_group *g = join_shared(j, r, world, &a);
  if (!g) return 2;
  if (r == 0) dt_group_unshare(g, a);
  if (dt_group_share(g, SHARED_BYTES, &b) != DT_OK) return 4;
  int bad = sum_checked(g, r == 0 ? b : a, 200000, r, world);
  if (shared_runs(g) != 0) bad = 1, fprintf(stderr, "rank %d read another share's memory\n", r);
  dt_group_destroy(g);
  dt_shared_free(a, SHARED_BYTES);
  dt_shared_free(b, SHARED_BYTES);
  return bad;
}

TEST(different_shares_at_the_same_offset_go_through_the_slots) {
  df_job j = job("shm");
  ASSERT_EQ(df_run(&j, 2, one_sided_child, NULL), 0);
}

/* tcp groups and groups of one rank share nothing, common memory neither: DT_UNSUPPORTED on every rank. */
static int unsupported_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g = join(j, r, world);
  if (!g) return 2;
  void *mem = NULL, *common = NULL;
  const int bad = dt_group_share(g, 4096, &mem) != DT_UNSUPPORTED || mem != NULL ||
                  dt_group_share_common(g, 4096, &common) != DT_UNSUPPORTED || common != NULL;
  if (bad) fprintf(stderr, "%s world %d: share did not say DT_UNSUPPORTED\n", j->backend, world);
  dt_group_destroy(g);
  return bad;
}

TEST(tcp_and_one_rank_groups_share_nothing) {
  df_job t = job("tcp");
  ASSERT_EQ(df_run(&t, 2, unsupported_child, NULL), 0);
  df_job one = job("shm");
  ASSERT_EQ(df_run(&one, 1, unsupported_child, NULL), 0);
}

/* ---- memory common to the ranks, and the sharded all-reduce ---------------------------------- */

/* dt_group_share_common: one memory, zeroed; what each rank writes every rank reads after a barrier. */
static int common_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g = join(j, r, world);
  if (!g) return 2;
  unsigned char *mem = NULL;
  int bad = dt_group_share_common(g, SHARED_BYTES, (void **)&mem) != DT_OK || !mem;
  const long unmapped = bad ? 0 : pages_not_mapped(mem, SHARED_BYTES);
  if (unmapped < 0) fprintf(stderr, "rank %d: /proc/self/pagemap unreadable: mapping not checked\n", r);
  if (unmapped > 0) fprintf(stderr, "rank %d: %ld pages of the common memory not mapped yet\n", r, unmapped), bad = 1;
  for (size_t i = 0; !bad && i < SHARED_BYTES; i += 4093) bad |= mem[i] != 0;
  if (!bad) bad = dt_barrier(g, NULL) != DT_OK; /* every rank has seen the zeros before any writes */
  if (!bad) memset(mem + (size_t)r * 4096, 'a' + r, 4096);
  if (!bad) bad = dt_barrier(g, NULL) != DT_OK;
  for (int q = 0; !bad && q < world; q++) bad |= mem[(size_t)q * 4096 + 4095] != 'a' + q;
  if (bad) fprintf(stderr, "rank %d: common memory: %s\n", r, dt_last_error());
  dt_group_destroy(g);
  dt_shared_free(mem, SHARED_BYTES);
  return bad;
}

TEST(common_memory_is_the_same_on_every_rank) { /* tcp and one-rank groups: tcp_and_one_rank_groups_share_nothing */
  for (int world = 2; world <= 3; world++) {
    df_job j = job("shm");
    ASSERT_EQ(df_run(&j, world, common_child, NULL), 0);
  }
}

/* What a sharded all-reduce's function is given: it copies each piece into memory common to the ranks and counts
 * the elements there, so every rank sees every rank's calls. */
typedef struct shards_seen {
  float *result;          /* (count) common */
  _Atomic size_t *total;  /* common: elements handed to the functions of all ranks */
  size_t next;            /* this rank: where its next piece must start at the earliest (increasing order) */
  int order_bad;
} shards_seen;

static void shards_record(void *user, size_t off, size_t n, const float *avg) {
  shards_seen *s = user;
  if (off < s->next) s->order_bad = 1;
  s->next = off + n;
  memcpy(s->result + off, avg, n * sizeof(float));
  atomic_fetch_add(s->total, n);
}

/* One sharded all-reduce of k on buf; 0 if every rank's pieces, in order, tile the count with the reference's bits,
 * all handed over (shm: by every rank) when this rank's collective returns. */
static int shards_case(dt_group *g, int r, int world, float *buf, const shared_case *k, shards_seen *s) {
  for (size_t i = 0; i < k->count; i++) buf[i] = (float)value(r, i, DT_F32);
  s->next = 0;
  s->order_bad = 0;
  const size_t before = atomic_load(s->total);
  if (dt_barrier(g, NULL) != DT_OK || dt_allreduce_shards(g, buf, k->count, k->op, shards_record, s, NULL) != DT_OK) {
    fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
    return 1;
  }
  const size_t seen = atomic_load(s->total) - before;
  const int in_order = strcmp(dt_group_backend(g), "shm") == 0; /* elsewhere the others' calls may come later */
  if (s->order_bad || (in_order && seen != k->count)) {
    fprintf(stderr, "rank %d, %zu elements: pieces out of order (%d) or %zu handed over\n", r, k->count,
            s->order_bad, seen);
    return 1;
  }
  if (!in_order) { /* the pieces of all ranks add up to the count; the others' are not here: their reference */
    uint64_t all = seen;
    size_t off, len;
    dt_group_block(g, k->count, r, &off, &len);
    if (dt_allreduce(g, &all, &all, 1, DT_I64, DT_SUM, NULL) != DT_OK || all != k->count || seen != len) return 1;
    for (size_t i = 0; i < k->count; i++) {
      if (i >= off && i < off + len) continue;
      float want = (float)value(0, i, DT_F32);
      for (int q = 1; q < world; q++) want += (float)value(q, i, DT_F32);
      s->result[i] = k->op == DT_AVG ? want / (float)world : want;
    }
  }
  return !f32_matches_reference(s->result, k, world);
}

static int shards_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g = join(j, r, world);
  if (!g) return 2;
  const int shm = strcmp(j->backend, "shm") == 0 && world > 1; /* memory to share */
  void *mem = NULL, *common = NULL;
  float *priv = malloc(SHARED_BYTES), *result = NULL;
  _Atomic size_t local_total = 0;
  int bad = !priv || (shm && dt_group_share(g, SHARED_BYTES, &mem) != DT_OK) ||
            (shm && dt_group_share_common(g, SHARED_BYTES + 64, &common) != DT_OK);
  if (bad) fprintf(stderr, "rank %d: setup: %s\n", r, dt_last_error());
  if (!shm) result = malloc(SHARED_BYTES);
  shards_seen s = {.result = shm ? common : result, .total = &local_total};
  if (shm && common) s.total = (_Atomic size_t *)((char *)common + SHARED_BYTES);
  /* below 32 KiB (the slot path's one sync), through the slots, and in place from shared memory */
  static const shared_case k[] = {{DT_F32, DT_AVG, 5, 0},       {DT_F32, DT_SUM, 7001, 0},
                                  {DT_F32, DT_AVG, 300001, 64}, {DT_F32, DT_SUM, 786432, 0}};
  for (size_t c = 0; c < sizeof k / sizeof k[0] && !bad; c++) {
    const uint64_t runs = shared_runs(g);
    bad |= shards_case(g, r, world, priv, &k[c], &s); /* private memory: through the slots */
    if (shm && !bad) bad |= shards_case(g, r, world, (float *)((char *)mem + k[c].at), &k[c], &s);
    /* in place from shared memory above 32 KiB, and then nothing written to the buffer */
    if (shm && !bad && (shared_runs(g) - runs == 1) != (k[c].count * 4 > (32u << 10))) {
      fprintf(stderr, "rank %d, %zu elements: %llu run from shared memory\n", r, k[c].count,
              (unsigned long long)(shared_runs(g) - runs));
      bad = 1;
    }
    for (size_t i = 0; shm && !bad && shared_runs(g) > runs && i < k[c].count; i++)
      if (((float *)((char *)mem + k[c].at))[i] != (float)value(r, i, DT_F32)) {
        fprintf(stderr, "rank %d: the sharded all-reduce wrote element %zu of its buffer\n", r, i);
        bad = 1;
      }
  }
  if (mem) dt_group_unshare(g, mem);
  dt_group_destroy(g);
  dt_shared_free(mem, SHARED_BYTES);
  dt_shared_free(common, SHARED_BYTES + 64);
  free(result);
  free(priv);
  return bad;
}

TEST(sharded_allreduce_hands_each_rank_its_share) {
  for (int world = 2; world <= 3; world++) {
    df_job j = job("shm");
    ASSERT_EQ(df_run(&j, world, shards_child, NULL), 0);
  }
  df_job t = job("tcp");
  ASSERT_EQ(df_run(&t, 2, shards_child, NULL), 0);
  df_job one = job("shm");
  ASSERT_EQ(df_run(&one, 1, shards_child, NULL), 0);
}

/* What dt_allreduce_each's function is given on this rank: every element's value and how often it came. */
typedef struct each_seen {
  float *result;          /* (count) */
  unsigned char *times;   /* (count) */
} each_seen;

static void each_record(void *user, size_t off, size_t n, const float *avg) {
  each_seen *s = user;
  memcpy(s->result + off, avg, n * sizeof(float));
  for (size_t i = off; i < off + n; i++) s->times[i]++;
}

/* One dt_allreduce_each of k on buf: 0 if this rank was handed every element once, with the reference's bits. */
static int each_case(dt_group *g, int r, int world, float *buf, const shared_case *k, each_seen *s) {
  for (size_t i = 0; i < k->count; i++) buf[i] = (float)value(r, i, DT_F32);
  memset(s->times, 0, k->count);
  if (dt_allreduce_each(g, buf, k->count, k->op, each_record, s, NULL) != DT_OK) {
    fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
    return 1;
  }
  for (size_t i = 0; i < k->count; i++)
    if (s->times[i] != 1) {
      fprintf(stderr, "rank %d, %zu elements: element %zu handed over %d times\n", r, k->count, i, s->times[i]);
      return 1;
    }
  return !f32_matches_reference(s->result, k, world);
}

static int each_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  dt_group *g = join(j, r, world);
  if (!g) return 2;
  const int shm = strcmp(j->backend, "shm") == 0 && world > 1; /* memory to share */
  void *mem = NULL;
  float *priv = malloc(SHARED_BYTES), *result = malloc(SHARED_BYTES);
  unsigned char *times = malloc(SHARED_BYTES / sizeof(float));
  int bad = !priv || !result || !times || (shm && dt_group_share(g, SHARED_BYTES, &mem) != DT_OK);
  if (bad) fprintf(stderr, "rank %d: setup: %s\n", r, dt_last_error());
  each_seen s = {.result = result, .times = times};
  /* below 32 KiB (the slot path's one sync), through the slots, and in place from shared memory */
  static const shared_case k[] = {{DT_F32, DT_AVG, 5, 0},       {DT_F32, DT_SUM, 7001, 0},
                                  {DT_F32, DT_AVG, 300001, 64}, {DT_F32, DT_SUM, 786432, 0}};
  for (size_t c = 0; c < sizeof k / sizeof k[0] && !bad; c++) {
    const uint64_t runs = shared_runs(g);
    bad |= each_case(g, r, world, priv, &k[c], &s); /* private memory: through the slots */
    if (shm && !bad) bad |= each_case(g, r, world, (float *)((char *)mem + k[c].at), &k[c], &s);
    if (shm && !bad && (shared_runs(g) - runs == 1) != (k[c].count * 4 > (32u << 10))) {
      fprintf(stderr, "rank %d, %zu elements: %llu run from shared memory\n", r, k[c].count,
              (unsigned long long)(shared_runs(g) - runs));
      bad = 1;
    }
  }
  if (mem) dt_group_unshare(g, mem);
  dt_group_destroy(g);
  dt_shared_free(mem, SHARED_BYTES);
  free(times);
  free(result);
  free(priv);
  return bad;
}

/* dt_allreduce_each hands every element of the result to the function once, with dt_allreduce's bits: in place
 * from shared memory (the others' shares where they lie), through the slots, over tcp and in a one-rank group. */
TEST(allreduce_each_hands_every_piece_once) {
  for (int world = 2; world <= 3; world++) {
    df_job j = job("shm");
    ASSERT_EQ(df_run(&j, world, each_child, NULL), 0);
  }
  df_job t = job("tcp");
  ASSERT_EQ(df_run(&t, 2, each_child, NULL), 0);
  df_job one = job("shm");
  ASSERT_EQ(df_run(&one, 1, each_child, NULL), 0);
}

/* Rank 1 exits after the share: rank 0's all-reduce on shared memory is DT_PEER_LOST within the deadline. */
static int peer_dies_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  void *mem = NULL;
  dt_group *g = join_shared(j, r, world, &mem);
  if (!g) return 2;
  if (r == 1) _exit(0);
  const dt_status st = dt_allreduce(g, mem, mem, 200000, DT_F32, DT_SUM, NULL);
  const int bad = st != DT_PEER_LOST || !strstr(dt_last_error(), "rank 1");
  if (bad) fprintf(stderr, "rank 0: all-reduce gave %d: %s\n", (int)st, dt_last_error());
  dt_group_destroy(g);
  dt_shared_free(mem, SHARED_BYTES);
  return bad;
}

TEST(a_rank_that_dies_is_peer_lost) {
  df_job j = job("shm");
  ASSERT_EQ(df_run(&j, 2, peer_dies_child, NULL), 0);
}

typedef struct forever_arg {
  dt_group *g;
  void *mem;
  _Atomic int done; /* all-reduces completed */
} forever_arg;

static void *sum_forever(void *p) {
  forever_arg *f = p;
  while (dt_allreduce(f->g, f->mem, f->mem, SHARED_BYTES / 4, DT_F32, DT_SUM, NULL) == DT_OK)
    atomic_fetch_add(&f->done, 1);
  return NULL;
}

/* Rank 1 exits while its all-reduces on shared memory run (in the middle of one, most likely), once it has
 * completed two (so rank 0 has completed one, however slowly the machine runs): rank 0's fail with
 * DT_PEER_LOST naming it, within the deadline. */
static int dies_mid_pipeline_child(df_job *j, int r, int world, void *arg) {
  (void)arg;
  forever_arg f = {0};
  dt_group *g = join_shared(j, r, world, &f.mem);
  if (!g) return 2;
  f.g = g;
  if (r == 1) {
    pthread_t t;
    pthread_create(&t, NULL, sum_forever, &f);
    for (int waited = 0; atomic_load(&f.done) < 2 && waited < 20000; waited++) usleep(1000);
    usleep(20 * 1000);
    _exit(0);
  }
  dt_status st;
  while ((st = dt_allreduce(g, f.mem, f.mem, SHARED_BYTES / 4, DT_F32, DT_SUM, NULL)) == DT_OK) {
  }
  const int bad = st != DT_PEER_LOST || !strstr(dt_last_error(), "rank 1") || shared_runs(g) == 0;
  if (bad) fprintf(stderr, "rank 0: gave %d after %llu shared all-reduces: %s\n", (int)st,
                   (unsigned long long)shared_runs(g), dt_last_error());
  dt_group_destroy(g);
  dt_shared_free(f.mem, SHARED_BYTES);
  return bad;
}

TEST(a_rank_that_dies_mid_pipeline_is_peer_lost) {
  df_job j = job("shm");
  ASSERT_EQ(df_run(&j, 2, dies_mid_pipeline_child, NULL), 0);
}

TEST(nothing_left_in_dev_shm) { ASSERT_EQ(df_shm_leftovers(RUN_ID), 0); }

TEST_MAIN(TEST_ENTRY(shared_allreduce_gives_the_slot_paths_bits_world_2_to_4),
          TEST_ENTRY(back_to_back_allreduces_on_shared_memory_world_2_and_3),
          TEST_ENTRY(a_buffer_elsewhere_on_one_rank_goes_through_the_slots),
          TEST_ENTRY(unshared_memory_goes_through_the_slots),
          TEST_ENTRY(a_share_failing_on_one_rank_fails_on_all_and_the_group_goes_on),
          TEST_ENTRY(different_shares_at_the_same_offset_go_through_the_slots),
          TEST_ENTRY(tcp_and_one_rank_groups_share_nothing), TEST_ENTRY(common_memory_is_the_same_on_every_rank),
          TEST_ENTRY(sharded_allreduce_hands_each_rank_its_share),
          TEST_ENTRY(allreduce_each_hands_every_piece_once), TEST_ENTRY(a_rank_that_dies_is_peer_lost),
          TEST_ENTRY(a_rank_that_dies_mid_pipeline_is_peer_lost),
          TEST_ENTRY(nothing_left_in_dev_shm))

/* Memory the ranks of a shm group map from each other (dt_group_share), and
 * the all-reduce that reads it where it lies; memory common to the ranks
 * (dt_group_share_common: rank 0's segment, every rank's mapping writable, in
 * the same two rounds), and the sharded all-reduce that reads shared memory in
 * place and hands each rank its share (dt_allreduce_shards, shards_shared).
 *
 * A share is a collective in two rounds through the store: every rank creates
 * a segment of the asked size and publishes its name (or why it could not);
 * then every rank maps every peer's segment read-only and publishes whether
 * that worked. Every rank reads every answer, so all of them conclude alike:
 * the share succeeds everywhere or fails everywhere (DT_UNSUPPORTED naming the
 * first rank that said why), and the caller then goes on with memory of its
 * own. Each rank unlinks its name once every rank has answered: the mappings
 * keep the memory, and nothing is left in /dev/shm.
 *
 * The all-reduce in place at the same place of one region on every rank
 * needs no slots. At its first sync every rank's input is final; then, in
 * chunks of the slot size, rank r sums its share of each chunk from every
 * rank's memory into its own (in rank order, as the slot path does: the same
 * bits; divided there for DT_AVG) and posts that it did (a sync's arrival
 * without its wait), and copies the other shares of a chunk from their owners
 * once every rank has posted it. After the last sync nobody reads r's memory any
 * more, so the caller may change it. Per rank and byte, with 2 ranks, that is
 * 2.5 passes over memory against the slot pipeline's 5.5 (copy in, reduce,
 * copy out), and no rank waits for another before its own reductions are done.
 * dt_allreduce_each skips the copies: the caller's function reads the other
 * shares where they lie. dt_allreduce_shards reduces only r's share, into a
 * buffer of its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist/shm-impl.h"

#define PLACE_SHIFT 48
#define PLACE_OFFSET(p) ((size_t)((p) & ((UINT64_C(1) << PLACE_SHIFT) - 1)))
#define WHY_LEN 320

static void region_free(shm_backend *b, shm_region *r) {
  if (r->peer)
    for (int j = 0; j < b->base.size; j++)
      if (r->peer[j] && j != b->base.rank) munmap(r->peer[j], r->bytes);
  dt_free(r->peer);
  memset(r, 0, sizeof *r);
}

void dt_shm_regions_free(shm_backend *b) {
  for (int k = 0; k < SHM_MAX_REGIONS; k++) region_free(b, &b->region[k]);
}

void dt_shm_unshare(dt_backend *base, void *mem) {
  shm_backend *b = (shm_backend *)base;
  for (int k = 0; mem && k < SHM_MAX_REGIONS; k++)
    if (b->region[k].mine == mem) region_free(b, &b->region[k]);
}

/* The store key of rank j's answer `what` in share k. */
static void answer_key(const shm_backend *b, int k, const char *what, int j, char *key, size_t cap) {
  snprintf(key, cap, "%s/shm/share%d/%s%d", b->prefix, k, what, j);
}

static dt_status answer(shm_backend *b, int k, const char *what, const char *value) {
  char key[DT_STORE_MAX_KEY];
  answer_key(b, k, what, b->base.rank, key, sizeof key);
  return dt_store_set(b->store, key, value, strlen(value));
}

/* Rank j's answer `what` of share k, as text in buf. */
static dt_status answer_of(shm_backend *b, int k, const char *what, int j, char *buf, size_t cap) {
  char key[DT_STORE_MAX_KEY];
  answer_key(b, k, what, j, key, sizeof key);
  void *val = NULL;
  size_t len = 0;
  DT_CHECK(dt_store_get(b->store, key, &val, &len, b->timeout_s));
  if (len >= cap) {
    dt_free(val);
    return dt_error(DT_CORRUPT, "shm: rank %d's answer under %s has %zu bytes", b->global[j], key, len);
  }
  memcpy(buf, val, len);
  buf[len] = 0;
  dt_free(val);
  return DT_OK;
}

/* Maps rank j's segment from its answer "<bytes> <name>" (or takes its "! why"), read only or writable; a failure
 * is said in why. */
static void map_peer(shm_backend *b, int j, const char *seg, size_t bytes, int writable, char **out, char *why) {
  if (seg[0] == '!') {
    snprintf(why, WHY_LEN, "%s", seg + (seg[1] == ' ' ? 2 : 1));
    return;
  }
  char *end = NULL;
  errno = 0;
  const unsigned long long n = strtoull(seg, &end, 10);
  if (errno || end == seg || *end != ' ' || end[1] != '/') {
    snprintf(why, WHY_LEN, "rank %d: malformed answer '%.64s'", b->global[j], seg);
    return;
  }
  if (n != bytes) {
    snprintf(why, WHY_LEN, "rank %d shares %llu bytes, rank %d %zu", b->global[j], n, b->global[b->base.rank], bytes);
    return;
  }
  const char *name = end + 1;
  const int fd = shm_open(name, writable ? O_RDWR : O_RDONLY, 0);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size != bytes) {
    snprintf(why, WHY_LEN, "rank %d: open rank %d's %s: %s", b->global[b->base.rank], b->global[j], name,
             fd < 0 ? strerror(errno) : "not of the size it said");
    if (fd >= 0) close(fd);
    return;
  }
  void *p = mmap(NULL, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    snprintf(why, WHY_LEN, "rank %d: map rank %d's %s: %s", b->global[b->base.rank], b->global[j], name,
             strerror(errno));
    return;
  }
  *out = p;
}

/* Round one: this rank's segment (r->mine, named name), or why not (why may say so already); then every peer's
 * mapped into r. */
static dt_status round_one(shm_backend *b, int k, shm_region *r, char *name, size_t name_cap, char *why) {
  const int me = b->base.rank;
  char value[WHY_LEN + 16];
  void *map = NULL;
  if (!why[0] &&
      (dt_alloc_array((size_t)b->base.size, sizeof *r->peer, "shm shared region", (void **)&r->peer) != DT_OK ||
       dt_shm_create_mapped(name, name_cap, r->bytes, &map) != DT_OK))
    snprintf(why, WHY_LEN, "rank %d: %s", b->global[me], dt_last_error());
  r->mine = map;
  if (why[0])
    snprintf(value, sizeof value, "! %s", why);
  else
    snprintf(value, sizeof value, "%zu %s", r->bytes, name);
  DT_CHECK(answer(b, k, "seg", value));
  if (why[0]) return DT_OK;
  r->peer[me] = r->mine;
  for (int j = 0; j < b->base.size && !why[0]; j++) {
    if (j == me) continue;
    DT_CHECK(answer_of(b, k, "seg", j, value, sizeof value));
    map_peer(b, j, value, r->bytes, 0, &r->peer[j], why);
  }
  return DT_OK;
}

/* Round two: whether every rank mapped every segment; why holds the first rank's reason if not. */
static dt_status round_two(shm_backend *b, int k, char *why) {
  char value[WHY_LEN + 16];
  if (why[0])
    snprintf(value, sizeof value, "0 %s", why);
  else
    snprintf(value, sizeof value, "1");
  DT_CHECK(answer(b, k, "ok", value));
  why[0] = 0;
  for (int j = 0; j < b->base.size; j++) {
    DT_CHECK(answer_of(b, k, "ok", j, value, sizeof value));
    if (value[0] != '1' && !why[0]) snprintf(why, WHY_LEN, "%.300s", value[0] == '0' && value[1] ? value + 2 : value);
  }
  return DT_OK;
}

dt_status dt_shm_share(dt_backend *base, size_t bytes, void **mem) {
  shm_backend *b = (shm_backend *)base;
  *mem = NULL;
  if (b->broken) return dt_error(b->broken, "shm: the group failed earlier and is unusable (%s)", b->broken_msg);
  const int k = b->shares++;
  int slot = -1;
  for (int i = 0; i < SHM_MAX_REGIONS && slot < 0; i++)
    if (!b->region[i].mine) slot = i;
  shm_region r = {.bytes = bytes};
  char name[160], why[WHY_LEN] = "";
  snprintf(name, sizeof name, "%s-s%d", b->stem, k);
  if (slot < 0)
    snprintf(why, sizeof why, "rank %d shares %d regions already", b->global[b->base.rank], SHM_MAX_REGIONS);
  else if (!bytes)
    snprintf(why, sizeof why, "nothing to share (0 bytes)");
  dt_status st = round_one(b, k, &r, name, sizeof name, why);
  if (st == DT_OK) st = round_two(b, k, why);
  if (r.mine) shm_unlink(name); /* every rank has answered: mapped, or given up */
  if (st == DT_OK && why[0]) st = dt_error(DT_UNSUPPORTED, "shm: cannot share %zu bytes: %s", bytes, why);
  if (st != DT_OK) {
    if (r.mine) munmap(r.mine, bytes);
    region_free(b, &r);
    return st;
  }
  r.id = k;
  b->region[slot] = r;
  /* Every page read once now, so this process maps it here and not at its first use in a step (about 5 us a page on
   * the 2-vCPU machines measured: the 2048-wide mlp's rank 1 took 39 ms for its first forward over rank 0's
   * parameters in the common segment, 7 ms for later ones). A page nobody wrote yet is allocated zeroed, as its
   * first write would. */
  for (int j = 0; j < b->base.size; j++) dt_touch_pages(r.peer[j], bytes);
  *mem = r.mine;
  DT_LOG_INFO("shm", "rank %d: sharing %zu bytes with %d ranks (region %d)", b->global[b->base.rank], bytes,
              b->base.size, slot);
  return DT_OK;
}

/* One segment for the host: rank 0 creates it and says its name, every other rank maps it writable; then round
 * two, as for dt_shm_share, so the share succeeds on every rank or on none. */
dt_status dt_shm_share_common(dt_backend *base, size_t bytes, void **mem) {
  shm_backend *b = (shm_backend *)base;
  *mem = NULL;
  if (b->broken) return dt_error(b->broken, "shm: the group failed earlier and is unusable (%s)", b->broken_msg);
  const int k = b->shares++, me = b->base.rank;
  char name[160], why[WHY_LEN] = "", value[WHY_LEN + 16];
  char *map = NULL;
  snprintf(name, sizeof name, "%s-c%d", b->stem, k);
  if (!bytes) snprintf(why, sizeof why, "nothing to share (0 bytes)");
  dt_status st;
  if (me == 0) {
    if (!why[0] && dt_shm_create_mapped(name, sizeof name, bytes, (void **)&map) != DT_OK)
      snprintf(why, sizeof why, "rank %d: %s", b->global[0], dt_last_error());
    if (why[0])
      snprintf(value, sizeof value, "! %s", why);
    else
      snprintf(value, sizeof value, "%zu %s", bytes, name);
    st = answer(b, k, "seg", value);
  } else {
    st = answer_of(b, k, "seg", 0, value, sizeof value);
    if (st == DT_OK && !why[0]) map_peer(b, 0, value, bytes, 1, &map, why);
  }
  if (st == DT_OK) st = round_two(b, k, why);
  if (me == 0 && map) shm_unlink(name); /* every rank has answered: mapped, or given up */
  if (st == DT_OK && why[0]) st = dt_error(DT_UNSUPPORTED, "shm: cannot share %zu bytes: %s", bytes, why);
  if (st != DT_OK) {
    if (map) munmap(map, bytes);
    return st;
  }
  dt_touch_pages(map, bytes); /* mapped here, not in the first step: as in dt_shm_share */
  *mem = map;
  DT_LOG_INFO("shm", "rank %d: %zu bytes common to %d ranks", b->global[me], bytes, b->base.size);
  return DT_OK;
}

uint64_t dt_shm_place(const shm_backend *b, const dt_coll *c, size_t bytes) {
  if (c->send != c->recv || !bytes) return 0;
  const uintptr_t p = (uintptr_t)c->recv;
  for (int k = 0; k < SHM_MAX_REGIONS; k++) {
    const shm_region *r = &b->region[k];
    const uintptr_t lo = (uintptr_t)r->mine;
    if (!r->mine || p < lo || p - lo >= r->bytes || bytes > r->bytes - (p - lo)) continue;
    return ((uint64_t)(r->id + 1) << PLACE_SHIFT) | (uint64_t)(p - lo);
  }
  return 0;
}

/* dst = the reduction of b->srcs[0..n) over len elements, dst being this rank's source (srcs[rank]), divided
 * as the group would (dt_shm_divide), block by block while each is in L1. dt_reduce_many reads srcs[0] and
 * srcs[1] before it writes dst and srcs[j >= 2] after: with this rank at 2 or above, each block is reduced aside
 * and then copied in. */
static void reduce_own(shm_backend *b, char *dst, size_t len, const dt_coll *c, size_t es) {
  const int n = b->base.size;
  alignas(64) char tmp[8192];
  const size_t blk = sizeof tmp / es;
  for (size_t at = 0; at < len; at += blk) {
    const size_t m = len - at < blk ? len - at : blk;
    char *out = dst + at * es;
    if (b->base.rank <= 1) {
      dt_reduce_many(out, b->srcs, n, m, c->dtype, c->op);
    } else {
      dt_reduce_many(tmp, b->srcs, n, m, c->dtype, c->op);
      memcpy(out, tmp, m * es);
    }
    dt_shm_divide(c, out, m);
    for (int j = 0; j < n; j++) b->srcs[j] = (const char *)b->srcs[j] + m * es;
  }
}

/* Chunk [c0, c0 + m) of the all-reduce: this rank's share reduced from every rank's memory into its own. */
static void reduce_mine(shm_backend *b, const shm_region *r, size_t at, const dt_coll *c, size_t es, size_t c0,
                        size_t m) {
  size_t off, len;
  dt_shm_share_of(m, es, b->base.size, b->base.rank, &off, &len);
  if (!len) return;
  const size_t from = at + (c0 + off) * es;
  for (int j = 0; j < b->base.size; j++) b->srcs[j] = r->peer[j] + from;
  reduce_own(b, (char *)c->recv + (c0 + off) * es, len, c, es);
}

/* Chunk [c0, c0 + m): the other ranks' reduced shares copied from their memory into this rank's. */
static void copy_theirs(const shm_backend *b, const shm_region *r, size_t at, const dt_coll *c, size_t es, size_t c0,
                        size_t m) {
  for (int j = 0; j < b->base.size; j++) {
    size_t off, len;
    dt_shm_share_of(m, es, b->base.size, j, &off, &len);
    if (j != b->base.rank && len)
      memcpy((char *)c->recv + (c0 + off) * es, r->peer[j] + at + (c0 + off) * es, len * es);
  }
}

/* Elements in chunk s of count elements cut in chunks of per. */
static size_t chunk_len(size_t count, size_t per, size_t s) { return count - s * per < per ? count - s * per : per; }

/* Elements of a sharded all-reduce reduced at a time: the block, and the parameters and state the caller updates
 * from it, stay in L1. */
#define SHARD_BLOCK 4096

/* The sharded all-reduce (dt_allreduce_shards): this rank's share, one contiguous range, reduced block by block from
 * every rank's memory into a buffer of its own and handed to the caller's function while in cache. Nothing is
 * written to the gradients and no share is copied back, so one sync at the end, after which nobody reads this
 * rank's memory any more (nor, every rank's updates being done, the memory they wrote). */
static dt_status shards_shared(shm_backend *b, const shm_region *r, size_t at, const dt_coll *c,
                               const dt_coll_sig *sig, size_t es) {
  alignas(64) float blk[SHARD_BLOCK];
  size_t off, len;
  dt_shm_share_of(c->count, es, b->base.size, b->base.rank, &off, &len);
  for (size_t k = 0; k < len; k += SHARD_BLOCK) {
    const size_t q = len - k < SHARD_BLOCK ? len - k : SHARD_BLOCK;
    for (int j = 0; j < b->base.size; j++) b->srcs[j] = r->peer[j] + at + (off + k) * es;
    dt_reduce_many(blk, b->srcs, b->base.size, q, c->dtype, c->op);
    dt_shm_divide(c, blk, q);
    c->shard(c->shard_user, off + k, q, blk);
  }
  *c->shard_done = 1;
  DT_CHECK(dt_shm_sync(b, c, sig, 0));
  b->shared_allreduces++;
  return DT_OK;
}

/* Chunk [c0, c0 + m): the other ranks' reduced shares handed to the caller's function where they lie
 * (dt_allreduce_each), instead of copied in. */
static void hand_theirs(const shm_backend *b, const shm_region *r, size_t at, const dt_coll *c, size_t c0,
                        size_t m) {
  for (int j = 0; j < b->base.size; j++) {
    size_t off, len;
    dt_shm_share_of(m, sizeof(float), b->base.size, j, &off, &len);
    if (j != b->base.rank && len)
      c->shard(c->shard_user, c0 + off, len, (const float *)(r->peer[j] + at + (c0 + off) * sizeof(float)));
  }
}

/* Chunk [c0, c0 + m) of the others' shares, once they have reduced them: handed over (each) or copied in. */
static void take_theirs(const shm_backend *b, const shm_region *r, size_t at, const dt_coll *c, int each, size_t c0,
                        size_t m) {
  if (each)
    hand_theirs(b, r, at, c, c0, m);
  else
    copy_theirs(b, r, at, c, dt_dtype_size(c->dtype), c0, m);
}

/* Chunk [c0, c0 + m): this rank's share, just reduced into its memory, handed to the caller's function in cache. */
static void hand_mine(const shm_backend *b, const dt_coll *c, size_t c0, size_t m) {
  size_t off, len;
  dt_shm_share_of(m, sizeof(float), b->base.size, b->base.rank, &off, &len);
  if (len) c->shard(c->shard_user, c0 + off, len, (const float *)c->recv + c0 + off);
}

dt_status dt_shm_allreduce_shared(shm_backend *b, const dt_coll *c, const dt_coll_sig *sig, uint64_t place) {
  const shm_region *r = b->region; /* this rank published place: it holds that share */
  while (!r->mine || (uint64_t)r->id + 1 != place >> PLACE_SHIFT) r++;
  const size_t at = PLACE_OFFSET(place), es = dt_dtype_size(c->dtype);
  if (c->kind == DT_COLL_ALLREDUCE_SHARDS && c->dtype == DT_F32 && c->shard_done)
    return shards_shared(b, r, at, c, sig, es);
  const size_t per = b->half / es, chunks = (c->count + per - 1) / per;
  /* In chunks of the slot size: this rank reduces its share of each chunk and says so (a post, no wait), then
   * copies the others' shares of every chunk all ranks have said they reduced; once its own are done, it waits for
   * the rest. Each rank goes at its own pace: one whose communication thread shares a CPU with backward does its
   * reductions whenever it runs, not in step with the others (a sync per chunk made every chunk wait for every
   * rank's thread to be scheduled), while ranks that run at once copy each chunk soon after its owners wrote it.
   * Nobody writes what another reads before it is read: rank j's share of chunk s is copied into this rank's memory
   * after j has reduced it, reading its input there. The last wait is for every rank's last post, so the full sync
   * after it may write its signature (dt_shm_post); after that sync nobody reads this rank's memory.
   * dt_allreduce_each hands this rank's share of each chunk to the caller's function once reduced, and the others'
   * shares where they lie instead of copying them in. */
  const uint64_t v0 = b->syncs;
  const int each = c->kind == DT_COLL_ALLREDUCE_EACH && c->dtype == DT_F32 && c->shard_done;
  size_t copied = 0;
  for (size_t s = 0; s < chunks; s++) {
    reduce_mine(b, r, at, c, es, s * per, chunk_len(c->count, per, s));
    dt_shm_post(b);
    if (each) hand_mine(b, c, s * per, chunk_len(c->count, per, s));
    for (; copied <= s && dt_shm_arrived(b, v0 + copied + 1); copied++)
      take_theirs(b, r, at, c, each, copied * per, chunk_len(c->count, per, copied));
  }
  for (; copied < chunks; copied++) {
    DT_CHECK(dt_shm_wait(b, c, v0 + copied + 1));
    take_theirs(b, r, at, c, each, copied * per, chunk_len(c->count, per, copied));
  }
  if (each) *c->shard_done = 1;
  DT_CHECK(dt_shm_sync(b, c, sig, 0));
  b->shared_allreduces++;
  return DT_OK;
}

/* Shared-memory backend: ranks on one host exchange data through one POSIX
 * shared-memory segment (per-rank slots, a result area, per-rank arrival
 * counters) and synchronise with C11 atomics plus a futex for sleeping.
 *
 * Every collective is a sequence of "syncs": a rank publishes its arrival
 * counter (and the collective's signature) and waits until every rank has
 * arrived. Between sync c and sync c+1 (phase c) a rank reads only half c%2 of
 * the double-buffered slots and result area and writes only half (c+1)%2, so
 * one sync per step is enough: a half written in phase c is read in phase c+1,
 * and nobody writes it again before everyone has passed sync c+2 — i.e. before
 * everyone has finished reading it. Large messages are pipelined in chunks
 * (copy chunk s in, reduce this rank's share of chunk s-1 from every slot,
 * copy chunk s-2 of the result out, all in one phase). An all-reduce whose
 * buffer lies at the same place of memory the ranks share is read where it
 * lies instead (shm_shared.c); the pipeline's first sync decides which. */
#define _GNU_SOURCE /* sched_getaffinity / CPU_COUNT: the cores this process may use */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dist/shm-impl.h"

static long futex_op(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  /* Shared (not FUTEX_PRIVATE): waiters and wakers are different processes. */
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void wake_all(shm_backend *b) {
  atomic_fetch_add(&b->hdr->epoch, 1);
  futex_op(&b->hdr->epoch, FUTEX_WAKE, INT_MAX, NULL);
}

static inline char *slot(const shm_backend *b, int rank, uint64_t half) {
  return b->slots + ((size_t)rank * 2 + (size_t)(half & 1)) * b->half;
}
static inline char *result(const shm_backend *b, uint64_t half) {
  return b->result + (size_t)(half & 1) * b->half;
}

static inline int all_arrived(const shm_backend *b, uint64_t v) {
  for (int j = 0; j < b->base.size; j++)
    if (atomic_load_explicit(&b->ctrl[j].arrive, memory_order_acquire) < v) return 0;
  return 1;
}

static int pid_exited(const shm_backend *b, int j) {
  pid_t pid = b->ctrl[j].pid;
  if (b->pidfd[j] >= 0) {
    struct pollfd p = {.fd = b->pidfd[j], .events = POLLIN};
    return poll(&p, 1, 0) > 0;
  }
  if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
  /* A zombie still answers kill(); its state in /proc says it has exited. */
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* DT_PEER_LOST if a rank that has not arrived at sync v left or exited. */
static dt_status check_peers(const shm_backend *b, uint64_t v) {
  for (int j = 0; j < b->base.size; j++) {
    if (j == b->base.rank || atomic_load_explicit(&b->ctrl[j].arrive, memory_order_acquire) >= v) continue;
    if (atomic_load(&b->ctrl[j].gone))
      return dt_error(DT_PEER_LOST, "rank %d (pid %d) left the group (aborted or shut down)", b->global[j],
                      (int)b->ctrl[j].pid);
    if (!b->nowatch[j] && pid_exited(b, j))
      return dt_error(DT_PEER_LOST, "rank %d (pid %d) exited", b->global[j], (int)b->ctrl[j].pid);
  }
  return DT_OK;
}

static dt_status timeout_error(const shm_backend *b, const dt_coll *c, uint64_t v) {
  char who[256] = "";
  size_t at = 0;
  int behind = 0;
  for (int j = 0; j < b->base.size && at < sizeof who - 16; j++) {
    if (atomic_load_explicit(&b->ctrl[j].arrive, memory_order_acquire) >= v) continue;
    at += (size_t)snprintf(who + at, sizeof who - at, "%s%d", behind ? ", " : "", b->global[j]);
    behind++;
  }
  return dt_error(DT_TIMEOUT, "%s %s did not arrive at %s #%llu within %.3g s", behind > 1 ? "ranks" : "rank",
                  who, dt_coll_name(c->kind), (unsigned long long)c->seq, c->deadline - b->t0);
}

/* Waits until every rank has reached sync v, giving the CPU away quickly when
 * ranks share cores; checks abort, liveness and the deadline while waiting. */
static dt_status wait_all(shm_backend *b, const dt_coll *c, uint64_t v) {
  if (all_arrived(b, v)) return DT_OK;
  double t0 = dt_time_now(), next_check = t0 + SHM_HEALTH_S;
  const int spin = c->background ? b->spin_background : b->spin;
  if (spin) {
    for (unsigned i = 1;; i++) {
      dt_cpu_relax();
      if (all_arrived(b, v)) return DT_OK;
      if ((i & 63) == 0 && dt_time_now() - t0 > SHM_SPIN_S) break;
    }
  }
  double yield_s = spin ? SHM_YIELD_S : SHM_YIELD_OVERSUB_S;
  for (;;) {
    if (all_arrived(b, v)) return DT_OK;
    if (atomic_load(&b->base.aborted))
      return dt_error(DT_INTERRUPTED, "shm: aborted while waiting at %s #%llu", dt_coll_name(c->kind),
                      (unsigned long long)c->seq);
    double now = dt_time_now();
    if (now >= next_check) {
      DT_CHECK(check_peers(b, v));
      next_check = now + SHM_HEALTH_S;
    }
    if (c->deadline > 0 && now >= c->deadline) {
      if (all_arrived(b, v)) return DT_OK;
      return timeout_error(b, c, v);
    }
    if (now - t0 < yield_s) {
      sched_yield();
      continue;
    }
    double slice = SHM_SLICE_S;
    if (c->deadline > 0 && c->deadline - now < slice) slice = c->deadline - now;
    if (next_check - now < slice) slice = next_check - now;
    if (slice < 1e-6) slice = 1e-6;
    struct timespec ts = {.tv_sec = (time_t)slice, .tv_nsec = (long)((slice - (double)(time_t)slice) * 1e9)};
    /* Announce the sleeper before re-checking, so a poster that missed it
     * (seq_cst on both sides) bumps the epoch and wakes us. */
    atomic_fetch_add(&b->hdr->sleepers, 1);
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t e = atomic_load(&b->hdr->epoch);
    if (!all_arrived(b, v) && !atomic_load(&b->base.aborted)) futex_op(&b->hdr->epoch, FUTEX_WAIT, e, &ts);
    atomic_fetch_sub(&b->hdr->sleepers, 1);
  }
}

uint64_t dt_shm_post(shm_backend *b) {
  uint64_t v = b->syncs + 1;
  atomic_store_explicit(&b->ctrl[b->base.rank].arrive, v, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&b->hdr->sleepers, memory_order_relaxed) > 0) wake_all(b);
  b->syncs = v;
  return v;
}

dt_status dt_shm_wait(shm_backend *b, const dt_coll *c, uint64_t v) { return wait_all(b, c, v); }

int dt_shm_arrived(const shm_backend *b, uint64_t v) { return all_arrived(b, v); }

dt_status dt_shm_sync(shm_backend *b, const dt_coll *c, const dt_coll_sig *sig, uint64_t place) {
  shm_ctrl *me = &b->ctrl[b->base.rank];
  me->sig[(b->syncs + 1) & 1] = *sig;
  me->place[(b->syncs + 1) & 1] = place;
  const uint64_t v = dt_shm_post(b);
  DT_CHECK(wait_all(b, c, v));
  /* sig[v%2] of a peer that reached v stays intact until we reach v+1 (a post writes none; dt_shm_post). */
  for (int j = 0; j < b->base.size; j++)
    if (j != b->base.rank) DT_CHECK(dt_coll_sig_check(sig, &b->ctrl[j].sig[v & 1], b->global[j]));
  return DT_OK;
}

static dt_status sync_all(shm_backend *b, const dt_coll *c, const dt_coll_sig *sig) {
  return dt_shm_sync(b, c, sig, 0);
}

static dt_status begin(shm_backend *b, const dt_coll *c, dt_coll_sig *sig) {
  if (b->broken)
    return dt_error(b->broken, "shm: the group failed earlier and is unusable (%s)", b->broken_msg);
  if (atomic_load(&b->base.aborted)) return dt_error(DT_INTERRUPTED, "shm: the group was aborted");
  if (c->kind != DT_COLL_BARRIER) {
    size_t bytes;
    if ((unsigned)c->dtype >= DT_DTYPE_COUNT || dt_mul_overflow(c->count, dt_dtype_size(c->dtype), &bytes))
      return dt_error(DT_INVALID_ARGUMENT, "shm: %s of %zu elements of dtype %d", dt_coll_name(c->kind),
                      c->count, (int)c->dtype);
  }
  dt_coll_sig_make(c, sig);
  b->t0 = dt_time_now();
  return DT_OK;
}

/* After a failure the ranks' sync counters no longer line up: the backend
 * refuses further collectives. */
static dt_status finish(shm_backend *b, dt_status st) {
  if (st != DT_OK && !b->broken) {
    b->broken = st;
    snprintf(b->broken_msg, sizeof b->broken_msg, "%s", dt_last_error());
  }
  return st;
}

/* In whole 64-byte units: aligned vector loops, and no two ranks write one cache line. */
void dt_shm_share_of(size_t m, size_t es, int n, int r, size_t *off, size_t *len) {
  size_t unit = es >= 64 ? 1 : 64 / es, units = (m + unit - 1) / unit, lo, cnt;
  dt_block_of(units, n, r, &lo, &cnt);
  size_t a = lo * unit, e = (lo + cnt) * unit;
  if (a > m) a = m;
  if (e > m) e = m;
  *off = a;
  *len = e - a;
}

/* Rounds of `piece` elements that carry the largest block (rank 0's); at least one. */
static size_t rounds_of(size_t count, int n, size_t piece) {
  size_t off, maxlen;
  dt_block_of(count, n, 0, &off, &maxlen);
  return maxlen ? (maxlen + piece - 1) / piece : 1;
}

static dt_status allreduce_small(shm_backend *b, const dt_coll *c, const dt_coll_sig *sig, size_t es) {
  uint64_t h = b->syncs + 1; /* written now, read after the next sync */
  int n = b->base.size;
  if (c->count) memcpy(slot(b, b->base.rank, h), c->send, c->count * es);
  DT_CHECK(sync_all(b, c, sig));
  /* Every rank reduces the slots in rank order: identical bits everywhere. */
  for (int j = 0; j < n; j++) b->srcs[j] = slot(b, j, h);
  dt_reduce_many(c->recv, b->srcs, n, c->count, c->dtype, c->op);
  dt_shm_divide(c, c->recv, c->count);
  return DT_OK;
}

/* Chunk s of the all-reduce into this rank's slot half written in this phase. */
static void copy_in(shm_backend *b, const dt_coll *c, size_t es, size_t s) {
  const size_t per = b->half / es, at = s * per, m = c->count - at < per ? c->count - at : per;
  memcpy(slot(b, b->base.rank, b->syncs + 1), (const char *)c->send + at * es, m * es);
}

/* The pipeline from step `first` on (step 0, chunk 0 in and a sync, is the caller's). */
static dt_status allreduce_chunked(shm_backend *b, const dt_coll *c, const dt_coll_sig *sig, size_t es,
                                  size_t first) {
  int n = b->base.size, me = b->base.rank;
  size_t per = b->half / es, chunks = (c->count + per - 1) / per;
  char *recv = c->recv;
  for (size_t s = first; s <= chunks + 1; s++) {
    uint64_t rd = b->syncs, wr = rd + 1;
    if (s >= 2) { /* chunk s-2 is reduced: copy it out */
      size_t at = (s - 2) * per, m = c->count - at < per ? c->count - at : per;
      memcpy(recv + at * es, result(b, rd), m * es);
    }
    if (s >= 1 && s - 1 < chunks) { /* reduce this rank's share of chunk s-1 */
      size_t at = (s - 1) * per, m = c->count - at < per ? c->count - at : per, off, len;
      dt_shm_share_of(m, es, n, me, &off, &len);
      for (int j = 0; j < n; j++) b->srcs[j] = slot(b, j, rd) + off * es;
      dt_reduce_many(result(b, wr) + off * es, b->srcs, n, len, c->dtype, c->op);
      dt_shm_divide(c, result(b, wr) + off * es, len);
    }
    if (s < chunks) copy_in(b, c, es, s);
    if (s <= chunks) DT_CHECK(sync_all(b, c, sig));
  }
  return DT_OK;
}

/* A sharded all-reduce (dt_allreduce_shards) that went through the slots: this rank's block of the whole result
 * handed to the caller's function, then a sync, so that, as where it reads shared memory, every rank's updates are
 * made before any rank's collective completes. */
static dt_status shards_after(shm_backend *b, const dt_coll *c, const dt_coll_sig *sig, dt_status st) {
  if (st != DT_OK || c->kind != DT_COLL_ALLREDUCE_SHARDS || !c->shard_done) return st;
  dt_coll_shard_block(c, b->base.size, b->base.rank);
  return dt_shm_sync(b, c, sig, 0);
}

static dt_status shm_allreduce(dt_backend *base, const dt_coll *c) {
  shm_backend *b = (shm_backend *)base;
  dt_coll_sig sig;
  DT_CHECK(begin(b, c, &sig));
  size_t es = dt_dtype_size(c->dtype);
  if (c->divided) *c->divided = 1; /* every path below divides as it reduces (the group ignores it on failure) */
  if (c->count * es <= SHM_SMALL_MAX) return finish(b, shards_after(b, c, &sig, allreduce_small(b, c, &sig, es)));
  /* Step 0: chunk 0 into this rank's slot, and a sync at which every rank also says where its buffer lies in
   * shared memory (0: nowhere; a rank whose buffer is shared skips the copy). If every rank has it at the same
   * place of one region, the sum is read from there. Else, if any rank skipped its copy, step 0 is done again
   * by all, and the slots carry the rest. Every rank decides from the same published places. */
  const uint64_t place = dt_shm_place(b, c, c->count * es);
  if (!place) copy_in(b, c, es, 0);
  dt_status st = dt_shm_sync(b, c, &sig, place);
  int same = place != 0, skipped = 0;
  for (int j = 0; st == DT_OK && j < b->base.size; j++) {
    const uint64_t p = b->ctrl[j].place[b->syncs & 1];
    same &= p == place;
    skipped |= p != 0;
  }
  if (st == DT_OK && same) return finish(b, dt_shm_allreduce_shared(b, c, &sig, place));
  if (st == DT_OK && skipped) {
    copy_in(b, c, es, 0);
    st = sync_all(b, c, &sig);
  }
  if (st == DT_OK) st = allreduce_chunked(b, c, &sig, es, 1);
  return finish(b, shards_after(b, c, &sig, st));
}

/* Rounds of P elements per destination: in round s every rank copies piece s
 * of every rank's block into its slot, then (next phase) each rank reduces
 * piece s of its own block from all slots straight into recv. */
static dt_status shm_reduce_scatter(dt_backend *base, const dt_coll *c) {
  shm_backend *b = (shm_backend *)base;
  dt_coll_sig sig;
  DT_CHECK(begin(b, c, &sig));
  int n = b->base.size, me = b->base.rank;
  size_t es = dt_dtype_size(c->dtype), piece = b->half / (size_t)n / es;
  size_t rounds = rounds_of(c->count, n, piece);
  size_t my_len, my_off;
  dt_block_of(c->count, n, me, &my_off, &my_len);
  const char *send = c->send;
  char *recv = c->recv;
  dt_status st = DT_OK;
  for (size_t s = 0; s <= rounds && st == DT_OK; s++) {
    uint64_t rd = b->syncs, wr = rd + 1;
    if (s >= 1 && (s - 1) * piece < my_len) {
      size_t at = (s - 1) * piece, m = my_len - at < piece ? my_len - at : piece;
      for (int j = 0; j < n; j++) b->srcs[j] = slot(b, j, rd) + (size_t)me * piece * es;
      dt_reduce_many(recv + at * es, b->srcs, n, m, c->dtype, c->op);
    }
    if (s < rounds) {
      for (int d = 0; d < n; d++) {
        size_t off, len;
        dt_block_of(c->count, n, d, &off, &len);
        size_t at = s * piece;
        if (at >= len) continue;
        size_t m = len - at < piece ? len - at : piece;
        memcpy(slot(b, me, wr) + (size_t)d * piece * es, send + (off + at) * es, m * es);
      }
      st = sync_all(b, c, &sig);
    }
  }
  return finish(b, st);
}

static dt_status shm_allgather(dt_backend *base, const dt_coll *c) {
  shm_backend *b = (shm_backend *)base;
  dt_coll_sig sig;
  DT_CHECK(begin(b, c, &sig));
  int n = b->base.size, me = b->base.rank;
  size_t es = dt_dtype_size(c->dtype), piece = b->half / es;
  size_t rounds = rounds_of(c->count, n, piece);
  size_t my_off, my_len;
  dt_block_of(c->count, n, me, &my_off, &my_len);
  const char *send = c->send;
  char *recv = c->recv;
  if (my_len && send != recv + my_off * es) memcpy(recv + my_off * es, send, my_len * es);
  dt_status st = DT_OK;
  for (size_t s = 0; s <= rounds && st == DT_OK; s++) {
    uint64_t rd = b->syncs, wr = rd + 1;
    if (s >= 1)
      for (int j = 0; j < n; j++) {
        size_t off, len, at = (s - 1) * piece;
        dt_block_of(c->count, n, j, &off, &len);
        if (j == me || at >= len) continue;
        size_t m = len - at < piece ? len - at : piece;
        memcpy(recv + (off + at) * es, slot(b, j, rd), m * es);
      }
    if (s < rounds) {
      size_t at = s * piece;
      if (at < my_len) memcpy(slot(b, me, wr), send + at * es, (my_len - at < piece ? my_len - at : piece) * es);
      st = sync_all(b, c, &sig);
    }
  }
  return finish(b, st);
}

static dt_status shm_broadcast(dt_backend *base, const dt_coll *c) {
  shm_backend *b = (shm_backend *)base;
  dt_coll_sig sig;
  DT_CHECK(begin(b, c, &sig));
  int n = b->base.size, me = b->base.rank, root = c->root;
  if (root < 0 || root >= n)
    return dt_error(DT_INVALID_ARGUMENT, "shm: broadcast root %d outside 0..%d", root, n - 1);
  size_t es = dt_dtype_size(c->dtype), piece = b->half / es;
  size_t rounds = c->count ? (c->count + piece - 1) / piece : 1;
  char *buf = c->recv;
  dt_status st = DT_OK;
  for (size_t s = 0; s <= rounds && st == DT_OK; s++) {
    uint64_t rd = b->syncs, wr = rd + 1;
    if (s >= 1 && me != root && (s - 1) * piece < c->count) {
      size_t at = (s - 1) * piece, m = c->count - at < piece ? c->count - at : piece;
      memcpy(buf + at * es, slot(b, root, rd), m * es);
    }
    if (s < rounds) {
      if (me == root && s * piece < c->count) {
        size_t at = s * piece, m = c->count - at < piece ? c->count - at : piece;
        memcpy(slot(b, root, wr), buf + at * es, m * es);
      }
      st = sync_all(b, c, &sig);
    }
  }
  return finish(b, st);
}

static dt_status shm_barrier(dt_backend *base, const dt_coll *c) {
  shm_backend *b = (shm_backend *)base;
  dt_coll_sig sig;
  DT_CHECK(begin(b, c, &sig));
  return finish(b, sync_all(b, c, &sig));
}

static void shm_abort(dt_backend *base) {
  shm_backend *b = (shm_backend *)base;
  atomic_store(&b->base.aborted, 1);
  if (b->ctrl) {
    /* Peers waiting for this rank fail at once instead of timing out. */
    atomic_store(&b->ctrl[b->base.rank].gone, 1);
    wake_all(b);
  }
}

static void shm_destroy(dt_backend *base) {
  shm_backend *b = (shm_backend *)base;
  if (!b) return;
  if (b->ctrl) {
    atomic_store(&b->ctrl[b->base.rank].gone, 1);
    wake_all(b);
  }
  if (b->pidfd)
    for (int j = 0; j < b->base.size; j++)
      if (b->pidfd[j] >= 0) close(b->pidfd[j]);
  dt_shm_regions_free(b);
  if (b->seg) munmap(b->seg, b->seg_bytes);
  dt_free(b->prefix);
  dt_free(b->pidfd);
  dt_free(b->nowatch);
  dt_free(b->srcs);
  dt_free(b->global);
  dt_free(b);
}

static const dt_backend_ops shm_ops = {
    .name = "shm",
    .allreduce = shm_allreduce,
    .broadcast = shm_broadcast,
    .allgather = shm_allgather,
    .reduce_scatter = shm_reduce_scatter,
    .barrier = shm_barrier,
    .abort = shm_abort,
    .destroy = shm_destroy,
    .share = dt_shm_share,
    .unshare = dt_shm_unshare,
    .share_common = dt_shm_share_common,
};

uint64_t dt_backend_shm_shared_allreduces(const dt_backend *b) {
  return b && b->ops == &shm_ops ? ((const shm_backend *)b)->shared_allreduces : 0;
}

int dt_backend_shm_comm_cpu(const dt_backend *b) {
  return b && b->ops == &shm_ops ? ((const shm_backend *)b)->spin_background : -1;
}

/* ---- setup ------------------------------------------------------------------ */
static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static size_t page_up(size_t n) { return (n + SHM_PAGE - 1) & ~(size_t)(SHM_PAGE - 1); }

static void layout(shm_backend *b, int size) {
  size_t hdr = page_up(sizeof(shm_header)), ctrl = page_up((size_t)size * sizeof(shm_ctrl));
  char *base = b->seg;
  b->hdr = (shm_header *)base;
  b->ctrl = (shm_ctrl *)(base + hdr);
  b->slots = base + hdr + ctrl;
  b->result = b->slots + (size_t)size * 2 * b->half;
}

static size_t seg_size(int size, size_t half) {
  return page_up(sizeof(shm_header)) + page_up((size_t)size * sizeof(shm_ctrl)) + ((size_t)size * 2 + 2) * half;
}

/* Maps the segment rank 0 created (name from the store) and checks its header. */
static dt_status open_segment(shm_backend *b, const dt_backend_ctx *ctx, const char *key) {
  void *val = NULL;
  size_t len = 0;
  DT_CHECK(dt_store_get(ctx->store, key, &val, &len, ctx->timeout_s));
  if (len == 0 || len >= sizeof b->name) {
    dt_free(val);
    return dt_error(DT_CORRUPT, "shm: segment name under %s has %zu bytes", key, len);
  }
  memcpy(b->name, val, len);
  b->name[len] = 0;
  dt_free(val);
  int fd = shm_open(b->name, O_RDWR, 0);
  if (fd < 0) return dt_error(DT_IO, "shm: open %s: %s", b->name, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size != b->seg_bytes) {
    close(fd);
    return dt_error(DT_MISMATCH, "shm: segment %s has %lld bytes, expected %zu (ranks disagree on the world size?)",
                    b->name, (long long)st.st_size, b->seg_bytes);
  }
  void *p = mmap(NULL, b->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return dt_error(DT_IO, "shm: map %s (%zu bytes): %s", b->name, b->seg_bytes, strerror(errno));
  b->seg = p;
  layout(b, ctx->size);
  if (b->hdr->magic != SHM_MAGIC || b->hdr->version != SHM_VERSION || b->hdr->size != (uint32_t)ctx->size ||
      b->hdr->seg_bytes != b->seg_bytes || b->hdr->half_bytes != b->half)
    return dt_error(DT_MISMATCH, "shm: segment %s was made for another layout (%u ranks, %llu bytes)", b->name,
                    b->hdr->size, (unsigned long long)b->hdr->seg_bytes);
  return DT_OK;
}

dt_status dt_shm_create_mapped(char *name, size_t cap, size_t bytes, void **map) {
  /* The name only travels through this job's store, so it can be unique to
   * this creation: the creator's pid and a nonce follow the stem. Two jobs
   * with the same stem (e.g. both without a run id) then never meet in one
   * segment, and nothing of another job's is ever unlinked. A name that
   * exists anyway is left alone and another is tried. */
  size_t stem = strlen(name);
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
    uint64_t nonce = fnv1a(name) ^ (uint64_t)(dt_time_now() * 1e9) ^ ((uint64_t)attempt << 40);
    snprintf(name + stem, cap - stem, "-%d-%08x", (int)getpid(), (unsigned)(nonce ^ (nonce >> 32)));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return dt_error(DT_IO, "shm: create %s: %s", name, strerror(errno));
  dt_status st = DT_OK;
  int err = 0;
  if (ftruncate(fd, (off_t)bytes) != 0) err = errno;
  /* Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS
   * at the first touch. */
  if (!err) err = posix_fallocate(fd, 0, (off_t)bytes);
  if (err == EOPNOTSUPP || err == EINVAL) err = 0; /* no fallocate on this filesystem: lazily allocated */
  if (err) {
    st = dt_error(DT_IO, "shm: size %s to %zu bytes: %s (is /dev/shm large enough?)", name, bytes, strerror(err));
  } else {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      st = dt_error(DT_IO, "shm: map %s (%zu bytes): %s", name, bytes, strerror(errno));
    else
      *map = p;
  }
  close(fd);
  if (st != DT_OK) shm_unlink(name);
  return st;
}

static dt_status create_segment(shm_backend *b, const dt_backend_ctx *ctx, const char *key) {
  DT_CHECK(dt_shm_create_mapped(b->name, sizeof b->name, b->seg_bytes, &b->seg));
  layout(b, ctx->size);
  b->hdr->magic = SHM_MAGIC;
  b->hdr->version = SHM_VERSION;
  b->hdr->size = (uint32_t)ctx->size;
  b->hdr->seg_bytes = b->seg_bytes;
  b->hdr->half_bytes = b->half;
  dt_status st = dt_store_set(ctx->store, key, b->name, strlen(b->name));
  if (st != DT_OK) shm_unlink(b->name);
  return st;
}

static dt_status wait_mapped(shm_backend *b, const dt_backend_ctx *ctx, double deadline) {
  for (unsigned i = 0;; i++) {
    uint32_t m = atomic_load(&b->hdr->mapped);
    if (m >= (uint32_t)ctx->size) return DT_OK;
    if (atomic_load(&b->base.aborted)) return dt_error(DT_INTERRUPTED, "shm: aborted during setup");
    if (dt_time_now() >= deadline)
      return dt_error(DT_TIMEOUT, "shm: only %u of %d ranks mapped segment %s within %.3g s", m, ctx->size,
                      b->name, ctx->timeout_s);
    if (i < 100)
      sched_yield();
    else
      nanosleep(&(struct timespec){.tv_nsec = 500000}, NULL);
  }
}

/* This process's CPUs (its affinity) into its control block, for the others' choice of how to wait. */
static void publish_cpus(shm_backend *b) {
  cpu_set_t set;
  shm_ctrl *me = &b->ctrl[b->base.rank];
  memset(me->cpus, 0, sizeof me->cpus);
  if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) == 0) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    CPU_ZERO(&set);
    for (long c = 0; c < (n > 0 ? n : 1) && c < CPU_SETSIZE; c++) CPU_SET((int)c, &set);
  }
  for (int c = 0; c < CPU_SETSIZE && c < SHM_CPU_BITS; c++)
    if (CPU_ISSET(c, &set)) me->cpus[c / 64] |= (uint64_t)1 << (c % 64);
}

/* How waits spin, once every rank has published its CPUs. The ranks that may run where this one may (all of
 * them unbound; itself alone where a launcher bound each to cores of its own) share its CPUs. A caller waiting in
 * a blocking collective (its compute idle) spins where each of those has a CPU: sleeping there, every sync of a
 * pipelined all-reduce waited for a wake-up of an idle vCPU (the default mlp's DDP x2 bound, 2 ranks on 2
 * vCPUs: +5% spinning). The communication thread waits beside the caller's compute: it spins only where every
 * such rank's compute threads and itself each have a CPU, or it takes the CPU of a rank still computing, the very
 * one it waits for (2 ranks of one thread on 2 cores: the default mlp's DDP x2 +8-23% in three of four
 * alternated pairs without its spinning, fashioncnn -0.5 to +4%). */
static void choose_spin(shm_backend *b) {
  const uint64_t *mine = b->ctrl[b->base.rank].cpus;
  long cpus = 0, sharing = 0;
  for (int w = 0; w < SHM_CPU_BITS / 64; w++) cpus += __builtin_popcountll(mine[w]);
  for (int j = 0; j < b->base.size; j++) {
    int overlap = 0;
    for (int w = 0; w < SHM_CPU_BITS / 64 && !overlap; w++) overlap = (b->ctrl[j].cpus[w] & mine[w]) != 0;
    sharing += overlap;
  }
  b->spin = sharing <= cpus;
  b->spin_background = b->comm_cpu == DT_COMM_CPU_AUTO ? sharing * (dt_get_threads() + 1) <= cpus
                                                       : b->comm_cpu == DT_COMM_CPU_OWN;
  DT_LOG_INFO("shm", "rank %d: %ld rank(s) on its %ld CPU(s): a waiting caller %s, the communication thread %s",
              b->global[b->base.rank], sharing, cpus, b->spin ? "spins" : "sleeps",
              b->spin_background ? "spins" : "sleeps");
}

static uint64_t pid_namespace(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static dt_status open_pidfds(shm_backend *b) {
  for (int j = 0; j < b->base.size; j++) {
    if (j == b->base.rank) continue;
    pid_t pid = b->ctrl[j].pid;
    if (b->ctrl[j].pidns != b->ctrl[b->base.rank].pidns) {
      /* Another container: its pid is not ours to watch; loss of that rank
       * shows as a timeout (or its gone flag) instead. */
      b->nowatch[j] = 1;
      DT_LOG_INFO("shm", "rank %d is in another PID namespace: not watching its process", b->global[j]);
      continue;
    }
#ifdef SYS_pidfd_open
    long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) {
      b->pidfd[j] = (int)fd;
      continue;
    }
    if (errno == ESRCH) return dt_error(DT_PEER_LOST, "rank %d (pid %d) exited during setup", b->global[j], (int)pid);
#endif
    if (kill(pid, 0) != 0 && errno == ESRCH)
      return dt_error(DT_PEER_LOST, "rank %d (pid %d) exited during setup", b->global[j], (int)pid);
  }
  return DT_OK;
}

/* Setup's last sync: no rank returns before every rank watches its peers' processes. A rank free to leave at once
 * would otherwise read as "exited during setup" to a peer still in open_pidfds. */
static dt_status setup_done(shm_backend *b, double deadline) {
  const dt_coll c = {.kind = DT_COLL_BARRIER, .deadline = deadline};
  b->t0 = deadline - b->timeout_s; /* the timeout message's "within": setup's whole time */
  const dt_status st = wait_all(b, &c, dt_shm_post(b));
  return st == DT_OK ? st : dt_error_prefix(st, "shm: setup's last sync");
}

dt_status dt_backend_shm_new(const dt_backend_ctx *ctx, dt_backend **out) {
  if (!ctx || !out || !ctx->store || !ctx->prefix || !ctx->global || ctx->size < 1 ||
      ctx->size > SHM_MAX_RANKS || ctx->rank < 0 || ctx->rank >= ctx->size)
    return dt_error(DT_INVALID_ARGUMENT, "shm: bad backend context (rank %d of %d)", ctx ? ctx->rank : -1,
                    ctx ? ctx->size : -1);
  shm_backend *b = NULL;
  dt_status st;
  DT_CHECK(dt_alloc(sizeof *b, (void **)&b));
  b->base.ops = &shm_ops;
  b->base.rank = ctx->rank;
  b->base.size = ctx->size;
  atomic_init(&b->base.aborted, 0);
  /* Many local ranks: smaller slots keep the segment near 64 MiB (container
   * /dev/shm is often small); never below SHM_SMALL_MAX. */
  b->half = SHM_HALF;
  while (b->half > SHM_SMALL_MAX && ((size_t)ctx->size * 2 + 2) * b->half > (64u << 20)) b->half /= 2;
  b->seg_bytes = seg_size(ctx->size, b->half);
  int created = 0, unlinked = 0, counted = 0;
  char key[DT_STORE_MAX_KEY];
  DT_CHECK_GOTO(dt_alloc_array((size_t)ctx->size, sizeof(int), "shm ranks", (void **)&b->global), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)ctx->size, sizeof(int), "shm pidfds", (void **)&b->pidfd), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)ctx->size, sizeof(void *), "shm sources", (void **)&b->srcs), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)ctx->size, 1, "shm watch flags", (void **)&b->nowatch), st, fail);
  b->base.global = b->global;
  for (int j = 0; j < ctx->size; j++) b->global[j] = ctx->global[j], b->pidfd[j] = -1;

  /* "/dt-<tag>-<hash of prefix>" (rank 0 appends its pid and a nonce): the
   * tag makes a segment attributable to a job, the hash separates groups and
   * restarts. */
  char tag[41];
  const char *t = ctx->job_tag ? ctx->job_tag : "job";
  size_t tl = 0;
  for (; t[tl] && tl < sizeof tag - 1; tl++) {
    char ch = t[tl];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
             ch == '_' || ch == '.';
    tag[tl] = ok ? ch : '_';
  }
  tag[tl] = 0;
  snprintf(b->name, sizeof b->name, "/dt-%s-%016llx", tag, (unsigned long long)fnv1a(ctx->prefix));
  snprintf(b->stem, sizeof b->stem, "%s", b->name);
  b->store = ctx->store;
  b->timeout_s = ctx->timeout_s > 0 ? ctx->timeout_s : 300;
  const size_t prefix_len = strlen(ctx->prefix) + 1;
  DT_CHECK_GOTO(dt_alloc(prefix_len, (void **)&b->prefix), st, fail);
  memcpy(b->prefix, ctx->prefix, prefix_len);
  b->comm_cpu = ctx->comm_cpu;
  if (snprintf(key, sizeof key, "%s/shm/segment", ctx->prefix) >= (int)sizeof key) {
    st = dt_error(DT_INVALID_ARGUMENT, "shm: store prefix too long (%zu bytes)", strlen(ctx->prefix));
    goto fail;
  }
  double deadline = dt_time_now() + (ctx->timeout_s > 0 ? ctx->timeout_s : 300);

  if (ctx->rank == 0) {
    DT_CHECK_GOTO(create_segment(b, ctx, key), st, fail);
    created = 1;
  } else {
    DT_CHECK_GOTO(open_segment(b, ctx, key), st, fail);
  }
  b->ctrl[ctx->rank].pid = (int32_t)getpid();
  b->ctrl[ctx->rank].pidns = pid_namespace();
  publish_cpus(b);
  atomic_fetch_add(&b->hdr->mapped, 1);
  counted = 1;
  DT_CHECK_GOTO(wait_mapped(b, ctx, deadline), st, fail);
  choose_spin(b);
  /* Every rank holds a mapping: the name is no longer needed, and without it
   * nothing is left in /dev/shm whatever happens to the processes later. */
  if (ctx->rank == 0) {
    shm_unlink(b->name);
    unlinked = 1;
  }
  DT_CHECK_GOTO(open_pidfds(b), st, fail);
  DT_CHECK_GOTO(setup_done(b, deadline), st, fail);
  DT_LOG_INFO("shm", "rank %d of %d: segment %s, %zu bytes", ctx->rank, ctx->size, b->name, b->seg_bytes);
  *out = &b->base;
  return DT_OK;

fail:
  if (created && !unlinked) shm_unlink(b->name);
  if (counted) { /* peers waiting for this rank in setup fail at once (before, the segment may be another's) */
    atomic_store(&b->ctrl[ctx->rank].gone, 1);
    wake_all(b);
  }
  if (b->seg) {
    munmap(b->seg, b->seg_bytes);
    b->seg = NULL;
    b->ctrl = NULL;
  }
  shm_destroy(&b->base);
  return st;
}

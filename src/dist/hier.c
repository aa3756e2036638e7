/* The hierarchical backend for ranks on several hosts with several ranks per
 * host: all-reduce inside each host over shared memory, across hosts between
 * one leader per host over tcp, then a broadcast inside each host; broadcast
 * and barrier the same way; all-gather and reduce-scatter over a tcp mesh of
 * every rank. Hosts are numbered by their lowest rank, so leader h is host h. */
#include <string.h>

#include <stdio.h>

#include "dist/dist-impl.h"

typedef struct hier_backend {
  dt_backend base;
  dt_backend *local;   /* shm among this host's ranks */
  dt_backend *leaders; /* tcp among the first rank of every host (NULL if not a leader) */
  dt_backend *all;     /* tcp among every rank */
  int *host_of;        /* host of every rank */
  int *local_index;    /* index of every rank within its host */
} hier_backend;

static dt_coll sub(const dt_coll *c, dt_coll_kind kind, const void *send, void *recv, int root) {
  dt_coll s = *c;
  s.kind = kind;
  s.divisor = 1; /* the parts are sums: the group divides the whole */
  s.divided = NULL;
  s.send = send;
  s.recv = recv;
  s.root = root;
  return s;
}

static dt_status hier_allreduce(dt_backend *base, const dt_coll *c) {
  hier_backend *b = (hier_backend *)base;
  dt_coll s = sub(c, DT_COLL_ALLREDUCE, c->send, c->recv, 0);
  DT_CHECK(dt_backend_run(b->local, &s));
  if (b->leaders) {
    s = sub(c, DT_COLL_ALLREDUCE, c->recv, c->recv, 0);
    DT_CHECK(dt_backend_run(b->leaders, &s));
  }
  s = sub(c, DT_COLL_BROADCAST, NULL, c->recv, 0);
  return dt_backend_run(b->local, &s);
}

static dt_status hier_broadcast(dt_backend *base, const dt_coll *c) {
  hier_backend *b = (hier_backend *)base;
  int root_host = b->host_of[c->root], my_host = b->host_of[base->rank];
  dt_coll s;
  if (my_host == root_host) {
    s = sub(c, DT_COLL_BROADCAST, NULL, c->recv, b->local_index[c->root]);
    DT_CHECK(dt_backend_run(b->local, &s));
  }
  if (b->leaders) {
    s = sub(c, DT_COLL_BROADCAST, NULL, c->recv, root_host);
    DT_CHECK(dt_backend_run(b->leaders, &s));
  }
  if (my_host != root_host) {
    s = sub(c, DT_COLL_BROADCAST, NULL, c->recv, 0);
    DT_CHECK(dt_backend_run(b->local, &s));
  }
  return DT_OK;
}

static dt_status hier_barrier(dt_backend *base, const dt_coll *c) {
  hier_backend *b = (hier_backend *)base;
  DT_CHECK(dt_backend_run(b->local, c));
  if (b->leaders) DT_CHECK(dt_backend_run(b->leaders, c));
  return dt_backend_run(b->local, c);
}

static dt_status hier_all(dt_backend *base, const dt_coll *c) {
  return dt_backend_run(((hier_backend *)base)->all, c);
}

static void hier_abort(dt_backend *base) {
  hier_backend *b = (hier_backend *)base;
  atomic_store(&base->aborted, 1);
  if (b->local) b->local->ops->abort(b->local);
  if (b->leaders) b->leaders->ops->abort(b->leaders);
  if (b->all) b->all->ops->abort(b->all);
}

static void hier_destroy(dt_backend *base) {
  hier_backend *b = (hier_backend *)base;
  if (!b) return;
  if (b->local) b->local->ops->destroy(b->local);
  if (b->leaders) b->leaders->ops->destroy(b->leaders);
  if (b->all) b->all->ops->destroy(b->all);
  dt_free(b->host_of);
  dt_free(b->local_index);
  dt_free(b);
}

static const dt_backend_ops hier_ops = {.name = "shm+tcp", .allreduce = hier_allreduce, .broadcast = hier_broadcast,
                                        .allgather = hier_all, .reduce_scatter = hier_all, .barrier = hier_barrier,
                                        .abort = hier_abort, .destroy = hier_destroy};

/* host_of[r] for every rank of ctx (hosts numbered by lowest rank). */
dt_status dt_backend_hier_new(const dt_backend_ctx *ctx, const int *host_of, dt_backend **out) {
  hier_backend *b;
  DT_CHECK(dt_alloc(sizeof *b, (void **)&b));
  b->base.ops = &hier_ops;
  b->base.rank = ctx->rank;
  b->base.size = ctx->size;
  b->base.global = ctx->global;
  dt_status st;
  int *members = NULL, n_hosts = 0, n_local = 0, my_local = 0;
  char prefix[320];
  DT_CHECK_GOTO(dt_alloc_array((size_t)ctx->size, sizeof(int), "host map", (void **)&b->host_of), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)ctx->size, sizeof(int), "host ranks", (void **)&b->local_index), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)ctx->size, sizeof(int), "members", (void **)&members), st, fail);
  memcpy(b->host_of, host_of, (size_t)ctx->size * sizeof(int));
  int *seen;
  DT_CHECK_GOTO(dt_alloc_array((size_t)ctx->size, sizeof(int), "host counts", (void **)&seen), st, fail);
  for (int r = 0; r < ctx->size; r++) {
    b->local_index[r] = seen[host_of[r]]++;
    if (host_of[r] + 1 > n_hosts) n_hosts = host_of[r] + 1;
  }
  dt_free(seen);

  /* This host's ranks over shared memory. */
  int me = host_of[ctx->rank];
  for (int r = 0; r < ctx->size; r++)
    if (host_of[r] == me) {
      if (r == ctx->rank) my_local = n_local;
      members[n_local++] = ctx->global[r];
    }
  dt_backend_ctx sub = *ctx;
  snprintf(prefix, sizeof prefix, "%s/host%d", ctx->prefix, me);
  sub.prefix = prefix;
  sub.rank = my_local;
  sub.size = n_local;
  sub.global = members;
  DT_CHECK_GOTO(dt_backend_shm_new(&sub, &b->local), st, fail);

  /* One leader per host over tcp. */
  if (my_local == 0) {
    int n = 0;
    for (int r = 0; r < ctx->size; r++)
      if (b->local_index[r] == 0) members[n++] = ctx->global[r];
    snprintf(prefix, sizeof prefix, "%s/leaders", ctx->prefix);
    sub.rank = me;
    sub.size = n;
    DT_CHECK_GOTO(dt_backend_tcp_new(&sub, &b->leaders), st, fail);
  }

  /* Every rank over tcp, for all-gather and reduce-scatter. */
  snprintf(prefix, sizeof prefix, "%s/all", ctx->prefix);
  sub = *ctx;
  sub.prefix = prefix;
  DT_CHECK_GOTO(dt_backend_tcp_new(&sub, &b->all), st, fail);
  dt_free(members);
  *out = &b->base;
  return DT_OK;
fail:
  dt_free(members);
  hier_destroy(&b->base);
  return st;
}

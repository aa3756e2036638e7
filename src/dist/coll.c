/* Collective descriptors: names, reduction-op names, the signature ranks
 * compare to detect a mismatched collective, and dispatch through a backend's
 * ops table. */
#include <string.h>

#include "dist/dist-impl.h"

static const char *const coll_names[DT_COLL_KIND_COUNT] = {"allreduce", "broadcast", "allgather",
                                                           "reduce_scatter", "barrier",
                                                           "allreduce_shards", "allreduce_each"};
static const char *const redop_names[DT_REDOP_COUNT] = {"sum", "avg", "min", "max"};

const char *dt_coll_name(dt_coll_kind k) {
  return (unsigned)k < DT_COLL_KIND_COUNT ? coll_names[k] : "unknown collective";
}

const char *dt_redop_name(dt_redop op) {
  return (unsigned)op < DT_REDOP_COUNT ? redop_names[op] : "unknown";
}

dt_status dt_redop_parse(const char *s, dt_redop *out) {
  for (int i = 0; i < DT_REDOP_COUNT; i++)
    if (s && strcmp(s, redop_names[i]) == 0) {
      *out = (dt_redop)i;
      return DT_OK;
    }
  return dt_error(DT_INVALID_ARGUMENT, "unknown reduction '%s' (sum, avg, min or max)", s ? s : "");
}

void dt_coll_sig_make(const dt_coll *c, dt_coll_sig *s) {
  memset(s, 0, sizeof *s);
  s->seq = c->seq;
  s->count = c->count;
  s->kind = (uint32_t)c->kind;
  s->dtype = (uint32_t)c->dtype;
  /* Only what the kind uses takes part in the comparison. */
  s->op = (dt_coll_is_allreduce(c->kind) || c->kind == DT_COLL_REDUCE_SCATTER) ? (uint32_t)c->op : 0;
  s->root = c->kind == DT_COLL_BROADCAST ? c->root : 0;
  if (c->kind == DT_COLL_BARRIER) s->count = 0, s->dtype = 0;
}

/* "allreduce of 1000 f32 (sum)" */
static void describe(const dt_coll_sig *s, char *buf, size_t len) {
  dt_coll_kind k = (dt_coll_kind)s->kind;
  const char *dt = s->dtype < DT_DTYPE_COUNT ? dt_dtype_name((dt_dtype)s->dtype) : "?";
  if (k == DT_COLL_BARRIER)
    snprintf(buf, len, "barrier");
  else if (k == DT_COLL_BROADCAST)
    snprintf(buf, len, "broadcast of %llu %s from rank %d", (unsigned long long)s->count, dt, s->root);
  else if (k == DT_COLL_ALLGATHER)
    snprintf(buf, len, "allgather of %llu %s", (unsigned long long)s->count, dt);
  else
    snprintf(buf, len, "%s of %llu %s (%s)", dt_coll_name(k), (unsigned long long)s->count, dt,
             dt_redop_name((dt_redop)s->op));
}

dt_status dt_coll_sig_check(const dt_coll_sig *mine, const dt_coll_sig *theirs, int their_rank) {
  if (memcmp(mine, theirs, sizeof *mine) == 0) return DT_OK;
  char a[128], b[128];
  describe(mine, a, sizeof a);
  describe(theirs, b, sizeof b);
  if (mine->seq != theirs->seq)
    return dt_error(DT_MISMATCH, "collective #%llu here (%s) met #%llu of rank %d (%s)",
                    (unsigned long long)mine->seq, a, (unsigned long long)theirs->seq, their_rank, b);
  return dt_error(DT_MISMATCH, "collective #%llu: this rank issued %s, rank %d issued %s",
                  (unsigned long long)mine->seq, a, their_rank, b);
}

void dt_coll_shard_block(const dt_coll *c, int size, int rank) {
  size_t off, len;
  dt_block_of(c->count, size, rank, &off, &len);
  if (len) c->shard(c->shard_user, off, len, (const float *)c->recv + off);
  *c->shard_done = 1;
}

dt_status dt_backend_run(dt_backend *b, const dt_coll *c) {
  switch (c->kind) {
  case DT_COLL_ALLREDUCE:
  case DT_COLL_ALLREDUCE_SHARDS:
  case DT_COLL_ALLREDUCE_EACH: return b->ops->allreduce(b, c);
  case DT_COLL_BROADCAST: return b->ops->broadcast(b, c);
  case DT_COLL_ALLGATHER: return b->ops->allgather(b, c);
  case DT_COLL_REDUCE_SCATTER: return b->ops->reduce_scatter(b, c);
  case DT_COLL_BARRIER: return b->ops->barrier(b, c);
  default: return dt_error(DT_INTERNAL, "unknown collective kind %d", (int)c->kind);
  }
}

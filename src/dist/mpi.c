/* The mpi backend: collectives through MPI (Open MPI from Debian) when the job
 * was started by mpirun. Nonblocking MPI collectives polled against the
 * deadline and the abort flag, so no wait is unbounded; bf16/f16 reduce with
 * our own MPI operations. Without MPI at build time this file only says so. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/dist-impl.h"

int dt_mpi_launched(void) {
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  const char *n = getenv("OMPI_COMM_WORLD_SIZE");
  return r && *r && n && *n;
}

#ifndef DT_HAVE_MPI

dt_status dt_backend_mpi_new(const dt_backend_ctx *ctx, dt_backend **out) {
  (void)ctx;
  (void)out;
  return dt_error(DT_UNSUPPORTED, "the mpi backend is not built in: install libopenmpi-dev and rebuild dtrain");
}

#else

#include <mpi.h>
#include <pthread.h>

typedef struct mpi_backend {
  dt_backend base;
  MPI_Comm comm;
  int *counts, *displs; /* per-rank block sizes for allgatherv / reduce_scatter */
  /* Signature exchange buffers. They live here, not on the stack: a request
   * abandoned at a deadline may still be written by MPI later, so after such
   * a failure (mpi_dirty) the backend is never freed. */
  int64_t sig_v[12], sig_r[12];
  dt_coll_sig sig_mine;
  dt_coll_sig *sig_all; /* size entries: every rank's signature, gathered on a mismatch */
} mpi_backend;

/* Process-wide MPI state: initialised once by us (or by the program), finalised
 * at exit only when no collective was left unfinished (MPI_Finalize would hang). */
static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;
static int mpi_we_initialised, mpi_dirty;
static MPI_Datatype type_bf16 = MPI_DATATYPE_NULL, type_f16 = MPI_DATATYPE_NULL;
static MPI_Op op_half[3]; /* sum, min, max over bf16/f16 */

static void half_op(void *in, void *inout, int *len, MPI_Datatype *dt, dt_redop op) {
  dt_dtype t = *dt == type_bf16 ? DT_BF16 : DT_F16;
  dt_reduce_into(inout, in, (size_t)*len, t, op);
}
static void half_sum(void *in, void *io, int *len, MPI_Datatype *dt) { half_op(in, io, len, dt, DT_SUM); }
static void half_min(void *in, void *io, int *len, MPI_Datatype *dt) { half_op(in, io, len, dt, DT_MIN); }
static void half_max(void *in, void *io, int *len, MPI_Datatype *dt) { half_op(in, io, len, dt, DT_MAX); }

static void mpi_at_exit(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && !mpi_dirty) MPI_Finalize();
}

static dt_status mpi_setup(void) {
  pthread_mutex_lock(&mpi_mu);
  dt_status st = DT_OK;
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    /* One thread at a time calls MPI (the group's queue guarantees it). */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      st = dt_error(DT_IO, "MPI_Init_thread failed");
      goto out;
    }
    mpi_we_initialised = 1;
    atexit(mpi_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    st = dt_error(DT_UNSUPPORTED, "MPI provides thread level %d; the mpi backend needs MPI_THREAD_SERIALIZED", provided);
    goto out;
  }
  if (type_bf16 == MPI_DATATYPE_NULL) {
    MPI_Type_contiguous(1, MPI_UINT16_T, &type_bf16);
    MPI_Type_commit(&type_bf16);
    MPI_Type_contiguous(1, MPI_UINT16_T, &type_f16);
    MPI_Type_commit(&type_f16);
    MPI_Op_create(half_sum, 1, &op_half[0]);
    MPI_Op_create(half_min, 1, &op_half[1]);
    MPI_Op_create(half_max, 1, &op_half[2]);
  }
out:
  pthread_mutex_unlock(&mpi_mu);
  return st;
}

static MPI_Datatype mpi_type(dt_dtype t) {
  switch (t) {
  case DT_F32: return MPI_FLOAT;
  case DT_F64: return MPI_DOUBLE;
  case DT_I32: return MPI_INT32_T;
  case DT_I64: return MPI_INT64_T;
  case DT_BF16: return type_bf16;
  default: return type_f16;
  }
}

static MPI_Op mpi_op(dt_dtype t, dt_redop op) {
  int k = op == DT_MIN ? 1 : op == DT_MAX ? 2 : 0; /* AVG reduces as SUM */
  if (t == DT_BF16 || t == DT_F16) return op_half[k];
  return k == 1 ? MPI_MIN : k == 2 ? MPI_MAX : MPI_SUM;
}

/* Polls req until done, the deadline or an abort: yields at first, then
 * sleeps 50 µs between tests so waiting ranks leave the cores to others. */
static dt_status mpi_wait(mpi_backend *b, MPI_Request *req, const dt_coll *c) {
  int done = 0;
  for (long spins = 0;; spins++) {
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      mpi_dirty = 1;
      return dt_error(DT_IO, "MPI_Test failed");
    }
    if (done) return DT_OK;
    if (atomic_load(&b->base.aborted)) {
      mpi_dirty = 1;
      return dt_error(DT_INTERRUPTED, "aborted");
    }
    if ((spins & 63) == 0 && c->deadline > 0 && dt_time_now() > c->deadline) {
      mpi_dirty = 1;
      return dt_error(DT_TIMEOUT, "MPI peers did not complete it in time (DT_TIMEOUT)");
    }
    if (spins > 2000) {
      struct timespec ts = {0, 50 * 1000};
      nanosleep(&ts, NULL);
    }
  }
}

/* Every rank's signature must be the same: one small all-reduce of
 * (sig, -sig) with MAX gives the largest and the smallest of each field. All
 * ranks see the same result, so on a mismatch all of them gather every
 * signature and name the first rank whose collective differs from theirs. */
static dt_status check_sig(mpi_backend *b, const dt_coll *c) {
  dt_coll_sig *s = &b->sig_mine;
  dt_coll_sig_make(c, s);
  int64_t *v = b->sig_v, *r = b->sig_r;
  v[0] = (int64_t)s->seq, v[1] = (int64_t)s->count, v[2] = s->kind, v[3] = s->dtype, v[4] = s->op, v[5] = s->root;
  for (int i = 0; i < 6; i++) v[6 + i] = -v[i];
  MPI_Request req;
  MPI_Iallreduce(v, r, 12, MPI_INT64_T, MPI_MAX, b->comm, &req);
  DT_CHECK(mpi_wait(b, &req, c));
  int same = 1;
  for (int i = 0; i < 6; i++) same &= r[i] == -r[6 + i];
  if (same) return DT_OK;
  MPI_Iallgather(s, (int)sizeof *s, MPI_BYTE, b->sig_all, (int)sizeof *s, MPI_BYTE, b->comm, &req);
  DT_CHECK(mpi_wait(b, &req, c));
  for (int j = 0; j < b->base.size; j++)
    if (j != b->base.rank && memcmp(&b->sig_all[j], s, sizeof *s) != 0)
      return dt_coll_sig_check(s, &b->sig_all[j], b->base.global[j]);
  return dt_error(DT_MISMATCH, "collective #%llu: ranks issued different collectives", (unsigned long long)s->seq);
}

/* counts and displacements of every rank's block (callers bound count by 2^31-1). */
static void blocks(mpi_backend *b, size_t count) {
  for (int r = 0; r < b->base.size; r++) {
    size_t off, len;
    dt_block_of(count, b->base.size, r, &off, &len);
    b->counts[r] = (int)len;
    b->displs[r] = (int)off;
  }
}

static dt_status too_big(const dt_coll *c) {
  if (c->count > (size_t)2147483647)
    return dt_error(DT_UNSUPPORTED, "%s of %zu elements: MPI counts are limited to 2^31-1", dt_coll_name(c->kind), c->count);
  return DT_OK;
}

static dt_status mpi_allreduce(dt_backend *base, const dt_coll *c) {
  mpi_backend *b = (mpi_backend *)base;
  DT_CHECK(too_big(c));
  DT_CHECK(check_sig(b, c));
  if (c->count == 0) return DT_OK;
  MPI_Request req;
  const void *send = c->send == c->recv ? MPI_IN_PLACE : c->send;
  MPI_Iallreduce(send, c->recv, (int)c->count, mpi_type(c->dtype), mpi_op(c->dtype, c->op), b->comm, &req);
  return mpi_wait(b, &req, c);
}

static dt_status mpi_broadcast(dt_backend *base, const dt_coll *c) {
  mpi_backend *b = (mpi_backend *)base;
  DT_CHECK(too_big(c));
  DT_CHECK(check_sig(b, c));
  if (c->count == 0) return DT_OK;
  MPI_Request req;
  MPI_Ibcast(c->recv, (int)c->count, mpi_type(c->dtype), c->root, b->comm, &req);
  return mpi_wait(b, &req, c);
}

static dt_status mpi_allgather(dt_backend *base, const dt_coll *c) {
  mpi_backend *b = (mpi_backend *)base;
  DT_CHECK(too_big(c));
  DT_CHECK(check_sig(b, c));
  if (c->count == 0) return DT_OK;
  blocks(b, c->count);
  size_t es = dt_dtype_size(c->dtype), off = (size_t)b->displs[b->base.rank];
  const void *send = (const char *)c->send == (const char *)c->recv + off * es ? MPI_IN_PLACE : c->send;
  MPI_Request req;
  MPI_Iallgatherv(send, b->counts[b->base.rank], mpi_type(c->dtype), c->recv, b->counts, b->displs,
                  mpi_type(c->dtype), b->comm, &req);
  return mpi_wait(b, &req, c);
}

static dt_status mpi_reduce_scatter(dt_backend *base, const dt_coll *c) {
  mpi_backend *b = (mpi_backend *)base;
  DT_CHECK(too_big(c));
  DT_CHECK(check_sig(b, c));
  if (c->count == 0) return DT_OK;
  blocks(b, c->count);
  size_t es = dt_dtype_size(c->dtype), len = (size_t)b->counts[b->base.rank];
  /* In place (recv inside send) MPI would read what it writes: reduce into a copy. */
  const char *s0 = c->send, *s1 = s0 + c->count * es, *r0 = c->recv;
  void *out = c->recv, *tmp = NULL;
  if (r0 + len * es > s0 && r0 < s1) {
    DT_CHECK(dt_alloc(len * es + 1, &tmp));
    out = tmp;
  }
  MPI_Request req;
  MPI_Ireduce_scatter(c->send, out, b->counts, mpi_type(c->dtype), mpi_op(c->dtype, c->op), b->comm, &req);
  dt_status st = mpi_wait(b, &req, c);
  if (st != DT_OK) return st; /* tmp stays allocated: the abandoned request may still write it */
  if (tmp) memcpy(c->recv, tmp, len * es);
  dt_free(tmp);
  return DT_OK;
}

static dt_status mpi_barrier(dt_backend *base, const dt_coll *c) {
  mpi_backend *b = (mpi_backend *)base;
  DT_CHECK(check_sig(b, c));
  MPI_Request req;
  MPI_Ibarrier(b->comm, &req);
  return mpi_wait(b, &req, c);
}

static void mpi_abort_op(dt_backend *base) { atomic_store(&base->aborted, 1); }

static void mpi_destroy(dt_backend *base) {
  mpi_backend *b = (mpi_backend *)base;
  if (!b) return;
  /* A request left behind at a deadline or abort may still read counts and
   * write the signature buffers: leave all of it allocated. */
  if (mpi_dirty) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && b->comm != MPI_COMM_NULL) MPI_Comm_free(&b->comm);
  dt_free(b->sig_all);
  dt_free(b->counts);
  dt_free(b->displs);
  dt_free((void *)b->base.global);
  dt_free(b);
}

static const dt_backend_ops mpi_ops = {.name = "mpi", .allreduce = mpi_allreduce, .broadcast = mpi_broadcast,
                                       .allgather = mpi_allgather, .reduce_scatter = mpi_reduce_scatter,
                                       .barrier = mpi_barrier, .abort = mpi_abort_op, .destroy = mpi_destroy};

dt_status dt_backend_mpi_new(const dt_backend_ctx *ctx, dt_backend **out) {
  if (!dt_mpi_launched())
    return dt_error(DT_UNSUPPORTED, "the mpi backend needs the job to be started by mpirun (no OMPI_COMM_WORLD_RANK)");
  DT_CHECK(mpi_setup());
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != ctx->rank || size != ctx->size)
    return dt_error(DT_MISMATCH, "mpi backend: MPI says rank %d of %d, the group says rank %d of %d", rank, size,
                    ctx->rank, ctx->size);
  mpi_backend *b;
  DT_CHECK(dt_alloc(sizeof *b, (void **)&b));
  b->comm = MPI_COMM_NULL;
  b->base.ops = &mpi_ops;
  b->base.rank = rank;
  b->base.size = size;
  dt_status st;
  int *global;
  DT_CHECK_GOTO(dt_alloc_array((size_t)size, sizeof(int), "mpi rank map", (void **)&global), st, fail);
  memcpy(global, ctx->global, (size_t)size * sizeof(int));
  b->base.global = global;
  DT_CHECK_GOTO(dt_alloc_array((size_t)size, sizeof(int), "mpi counts", (void **)&b->counts), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)size, sizeof(int), "mpi displacements", (void **)&b->displs), st, fail);
  DT_CHECK_GOTO(dt_alloc_array((size_t)size, sizeof *b->sig_all, "mpi signatures", (void **)&b->sig_all), st, fail);
  if (MPI_Comm_dup(MPI_COMM_WORLD, &b->comm) != MPI_SUCCESS) {
    st = dt_error(DT_IO, "MPI_Comm_dup failed");
    goto fail;
  }
  *out = &b->base;
  return DT_OK;
fail:
  mpi_destroy(&b->base);
  return st;
}

#endif

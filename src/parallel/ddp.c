/* DDP: one process per worker; gradients all-reduced in buckets while backward still runs (PyTorch's reducer). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/core.h"
#include "dtrain/parallel.h"
#include "dtrain/trace.h"
#include "parallel/parallel-impl.h"

/* A trainable tensor, or a piece of one its layer announces by itself (split_pieces), in arena order (the arena
 * holds the last layer first). */
typedef struct ddp_tensor {
  size_t off, numel; /* elements of the gradient arena */
  int index;         /* dt_model_tensor_info index (for its name) */
  int bucket;
  int table;         /* the model's row table it is, or -1 */
} ddp_tensor;

/* A contiguous slice of the gradient arena, made of whole entries of the tensor table. */
typedef struct ddp_bucket {
  size_t off, count; /* elements */
  int first, n;      /* its tensors: tensors[first .. first + n) */
  size_t ready;      /* elements whose gradient is final this step */
  int launched;
  dt_work *work;     /* NULL before launch, or if the launch itself failed */
  uint16_t *stage;   /* (count) bf16/f16 copy for a compression hook, else NULL */
  double trace_t0;   /* dt_trace_now_us() at launch; 0 when not tracing */
  dt_ddp_rows *rows; /* a row table alone in its bucket: its own exchange; else NULL */
  dt_ddp_shard_at at; /* the sharded update's view of it */
  double bytes;      /* this step's payload */
} ddp_bucket;

struct dt_ddp {
  dt_model *m;
  dt_group *g;
  dt_ddp_config cfg;
  int rank, world;
  float *grads;      /* (n_params) the model's gradient arena */
  size_t n_params;
  int shared;        /* 1: the arena is memory shared with the other ranks (dt_group_share) */
  double piece_mb;   /* the pieces' size in effect (grad_piece_mb, auto decided); 0: whole tensors */
  dt_ddp_shards shards; /* the sharded or fused update; shards.optim NULL: the caller's optimizer */
  int fused;            /* 1: the fused update (dt_ddp_fuse_optim), each rank on its own parameters */
  int begun;            /* this step's dt_optim_begin_step: 0 not yet, 1 made, -1 failed */

  ddp_tensor *tensors; /* (n_tensors) trainable tensors sorted by offset */
  int n_tensors;
  unsigned char *ready; /* (n_tensors) gradient final this step */
  ddp_bucket *buckets;
  int n_buckets;
  uint16_t *stage;    /* (n_params) staging arena of the compression hooks */
  int stage_shared;   /* 1: the staging arena is memory shared with the other ranks (dt_group_share) */

  int sync;           /* 0: no_sync (gradients accumulate locally) */
  int next_launch;    /* buckets launch strictly in index order: the same order on every rank */
  int first_pending;  /* launched buckets before this one were seen complete */
  dt_status late;     /* first failure met inside a gradient-ready event, reported by finish */
  char late_msg[512];

  /* trace of the current / last step (dt_ddp_get_trace) */
  double *launch_s, *done_s, *event_s; /* (n_buckets), (n_buckets), (n_tensors) */
  double step_comm; /* seconds the backend ran this step's all-reduces (dt_work_elapsed) */
  size_t *event_off;
  int n_events, done_at_last_event;
  int fresh; /* the next gradient-ready event starts a step: restart the trace */
  int hooked; /* our callback is the model's gradient-ready hook */

  dt_ddp_stats stats;

  /* auto layout: this step's ready times (from its first gradient-ready event), sums over the measured steps */
  double step_t0, *t_ready, *ready_sum;
  double comm_sum, bytes_sum, launches_sum;
  int measured, planned;
  int comm_own; /* agree_comm_cpu: every rank's communication thread has a CPU of its own; 0 where not agreed (one
                 * rank: nothing to overlap, so the measured layout is one bucket) */
};

/* Synchronised steps measured before the layout is planned; the first step (allocations, cold caches) is not. */
#define LAYOUT_SKIP_STEPS 1
#define LAYOUT_MEASURE_STEPS 2

void dt_ddp_config_default(dt_ddp_config *c) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  c->bucket_cap_mb = 25;
  c->first_bucket_mb = 1;
  c->broadcast_buffers = 1;
  c->find_unused_parameters = 0;
  c->comm_hook = DT_COMM_HOOK_NONE;
  c->shared_grads = 0; /* it moves the arena: a caller's earlier dt_model_grads pointer would dangle */
  c->grad_piece_mb = -1; /* auto */
  c->comm_cpu = -1;      /* auto */
}

/* ---- model identity ------------------------------------------------------------------ */

#define FNV_OFFSET 1469598103934665603ull
#define FNV_PRIME 1099511628211ull

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * FNV_PRIME;
  return h;
}

/* Hash of what must agree across ranks for tensor i: name, dtype, role, shape. */
static uint64_t tensor_hash(const dt_tensor_info *t) {
  uint64_t h = fnv(FNV_OFFSET, t->name, strlen(t->name) + 1);
  int64_t meta[3 + DT_MAX_DIMS] = {(int64_t)t->dtype, t->trainable, t->ndim};
  for (int k = 0; k < t->ndim && k < DT_MAX_DIMS; k++) meta[3 + k] = t->shape[k];
  h = fnv(h, meta, sizeof meta);
  return h ? h : 1; /* 0 marks "no such tensor" in the exchange below */
}

/* A tensor as exchanged when ranks differ: fixed size, i64 words. */
#define DESC_NAME_WORDS 16 /* 128 bytes of name */
enum { DESC_PRESENT, DESC_DTYPE, DESC_TRAINABLE, DESC_NDIM, DESC_SHAPE, DESC_NAME = DESC_SHAPE + DT_MAX_DIMS,
       DESC_WORDS = DESC_NAME + DESC_NAME_WORDS };

static void desc_fill(const dt_model *m, int i, int64_t *w) {
  memset(w, 0, DESC_WORDS * sizeof *w);
  dt_tensor_info t;
  if (i >= dt_model_num_tensors(m) || dt_model_tensor_info(m, i, &t) != DT_OK) return;
  w[DESC_PRESENT] = 1;
  w[DESC_DTYPE] = t.dtype;
  w[DESC_TRAINABLE] = t.trainable;
  w[DESC_NDIM] = t.ndim;
  for (int k = 0; k < t.ndim && k < DT_MAX_DIMS; k++) w[DESC_SHAPE + k] = t.shape[k];
  snprintf((char *)&w[DESC_NAME], DESC_NAME_WORDS * 8, "%s", t.name);
}

static const char *desc_name(const int64_t *w) { return (const char *)&w[DESC_NAME]; }

static void desc_shape(const int64_t *w, char *buf, size_t len) {
  int n = snprintf(buf, len, "(");
  for (int k = 0; k < w[DESC_NDIM] && k < DT_MAX_DIMS && n > 0 && (size_t)n < len; k++)
    n += snprintf(buf + n, len - (size_t)n, k ? ", %" PRId64 : "%" PRId64, w[DESC_SHAPE + k]);
  if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, ")");
}

/* "'fc1.weight' (f32 parameter, shape (128, 784))" */
static void desc_text(const int64_t *w, char *buf, size_t len) {
  char shape[128];
  desc_shape(w, shape, sizeof shape);
  dt_dtype t = (dt_dtype)w[DESC_DTYPE];
  snprintf(buf, len, "'%s' (%s %s, shape %s)", desc_name(w), t == DT_I64 ? "i64" : t == DT_F32 ? "f32" : "?",
           w[DESC_TRAINABLE] ? "parameter" : "buffer", shape);
}

/* Every rank gathers (count, hash) of every rank; if any differs from rank
 * 0's, the ranks exchange per-tensor hashes to find the first differing tensor
 * and then its description, so every rank reports the same DT_MISMATCH. */
static dt_status check_same_model(dt_group *g, const dt_model *m) {
  const int world = dt_group_size(g), rank = dt_group_rank(g), n = dt_model_num_tensors(m);
  int64_t *all = NULL, *mine = NULL, *descs = NULL, *hashes = NULL;
  int bad = -1, first = 0;
  int64_t max_n = 0;
  size_t per = 0;
  dt_status st = DT_OK;
  uint64_t h = FNV_OFFSET;
  dt_tensor_info t;
  for (int i = 0; i < n; i++) {
    DT_CHECK(dt_model_tensor_info(m, i, &t));
    uint64_t th = tensor_hash(&t);
    h = fnv(h, &th, sizeof th);
  }
  DT_CHECK(dt_alloc_array((size_t)world * 2, sizeof(int64_t), "model digests", (void **)&all));
  all[2 * rank] = n;
  all[2 * rank + 1] = (int64_t)h;
  DT_CHECK_GOTO(dt_allgather(g, all + 2 * rank, all, (size_t)world * 2, DT_I64, NULL), st, done);
  for (int r = 0; r < world; r++) {
    if (bad < 0 && (all[2 * r] != all[0] || all[2 * r + 1] != all[1])) bad = r;
    if (all[2 * r] > max_n) max_n = all[2 * r];
  }
  if (bad < 0) goto done;

  /* Per-tensor hashes, max_n per rank (0 past a rank's own count). */
  per = (size_t)max_n;
  DT_CHECK_GOTO(dt_alloc_array(per * (size_t)world, sizeof(int64_t), "tensor hashes", (void **)&hashes), st, done);
  for (int i = 0; i < n; i++) {
    if (dt_model_tensor_info(m, i, &t) == DT_OK) hashes[per * (size_t)rank + (size_t)i] = (int64_t)tensor_hash(&t);
  }
  st = dt_allgather(g, hashes + per * (size_t)rank, hashes, per * (size_t)world, DT_I64, NULL);
  first = (int)max_n; /* the first index where rank `bad` differs from rank 0 */
  for (size_t i = 0; st == DT_OK && i < per; i++)
    if (hashes[i] != hashes[per * (size_t)bad + i]) {
      first = (int)i;
      break;
    }
  if (st != DT_OK) goto done;

  DT_CHECK_GOTO(dt_alloc_array((size_t)world * DESC_WORDS, sizeof(int64_t), "tensor descriptions", (void **)&descs),
                st, done);
  mine = descs + (size_t)rank * DESC_WORDS;
  desc_fill(m, first, mine);
  DT_CHECK_GOTO(dt_allgather(g, mine, descs, (size_t)world * DESC_WORDS, DT_I64, NULL), st, done);
  const int64_t *a = descs, *b = descs + (size_t)bad * DESC_WORDS;
  char ta[256], tb[256];
  desc_text(a, ta, sizeof ta);
  desc_text(b, tb, sizeof tb);
  if (!a[DESC_PRESENT] || !b[DESC_PRESENT]) {
    const int has = a[DESC_PRESENT] ? 0 : bad, lacks = a[DESC_PRESENT] ? bad : 0;
    st = dt_error(DT_MISMATCH,
                  "rank %d's model differs from rank 0's: %" PRId64 " tensors on rank 0 and %" PRId64
                  " on rank %d; rank %d has tensor %d %s that rank %d lacks",
                  bad, all[0], all[2 * bad], bad, has, first, a[DESC_PRESENT] ? ta : tb, lacks);
  } else if (strcmp(desc_name(a), desc_name(b)) == 0 && a[DESC_DTYPE] == b[DESC_DTYPE] &&
             a[DESC_TRAINABLE] == b[DESC_TRAINABLE]) {
    char sa[128], sb[128];
    desc_shape(a, sa, sizeof sa);
    desc_shape(b, sb, sizeof sb);
    st = dt_error(DT_MISMATCH, "rank %d's model differs from rank 0's: tensor '%s' has shape %s on rank 0 and %s on rank %d",
                  bad, desc_name(a), sa, sb, bad);
  } else {
    st = dt_error(DT_MISMATCH, "rank %d's model differs from rank 0's: tensor %d is %s on rank 0 and %s on rank %d", bad,
                  first, ta, tb, bad);
  }
done:
  dt_free(descs);
  dt_free(hashes);
  dt_free(all);
  return st;
}

/* Parameters, f32 buffers and i64 counters from rank 0 (blocking). */
static dt_status broadcast_state(dt_ddp *d, int params) {
  size_t n = 0;
  if (params) {
    float *p = dt_model_params(d->m, &n);
    if (n) DT_CHECK(dt_broadcast(d->g, p, n, DT_F32, 0, NULL));
  }
  float *b = dt_model_buffers(d->m, &n);
  if (n) DT_CHECK(dt_broadcast(d->g, b, n, DT_F32, 0, NULL));
  const int nt = dt_model_num_tensors(d->m);
  for (int i = 0; i < nt; i++) {
    dt_tensor_info t;
    DT_CHECK(dt_model_tensor_info(d->m, i, &t));
    if (t.dtype != DT_I64) continue;
    size_t numel = 1;
    for (int k = 0; k < t.ndim; k++) numel *= (size_t)t.shape[k];
    DT_CHECK(dt_broadcast(d->g, dt_model_tensor_data(d->m, i), numel, DT_I64, 0, NULL));
  }
  return DT_OK;
}

static int has_buffers(dt_model *m) {
  size_t n = 0;
  dt_model_buffers(m, &n);
  if (n) return 1;
  dt_tensor_info t;
  for (int i = 0; i < dt_model_num_tensors(m); i++)
    if (dt_model_tensor_info(m, i, &t) == DT_OK && !t.trainable) return 1;
  return 0;
}

/* Moves the model's gradient arena into memory the other ranks map, so the all-reduces read their gradients
 * where backward wrote them (dt_group_share); where the group cannot share memory the arena stays as it is. */
static dt_status share_grads(dt_ddp *d) {
  const size_t bytes = d->n_params * sizeof(float);
  void *mem = NULL;
  dt_status st = dt_group_share(d->g, bytes, &mem);
  if (st == DT_UNSUPPORTED) {
    const int shm = strcmp(dt_group_backend(d->g), "shm") == 0;
    if (shm) DT_LOG_WARN("ddp", "rank %d: gradients go through the backend's buffers: %s", d->rank, dt_last_error());
    else DT_LOG_INFO("ddp", "rank %d: gradients go through the backend's buffers: %s", d->rank, dt_last_error());
    return DT_OK;
  }
  DT_CHECK(st);
  st = dt_model_set_grad_memory(d->m, mem, dt_shared_free);
  if (st != DT_OK) {
    dt_group_unshare(d->g, mem);
    dt_shared_free(mem, bytes);
    return st;
  }
  d->grads = mem;
  d->shared = d->stats.shared_grads = 1;
  return DT_OK;
}

/* A compression hook's staging arena in memory the other ranks map, so the all-reduces read the compressed
 * gradients where they were converted; where the group cannot share memory it is allocated as usual. */
static dt_status share_stage(dt_ddp *d) {
  void *mem = NULL;
  const dt_status st = dt_group_share(d->g, d->n_params * sizeof(uint16_t), &mem);
  if (st == DT_UNSUPPORTED) {
    DT_LOG_INFO("ddp", "rank %d: compressed gradients go through the backend's buffers: %s", d->rank, dt_last_error());
    return DT_OK;
  }
  DT_CHECK(st);
  d->stage = mem;
  d->stage_shared = d->stats.shared_grads = 1;
  return DT_OK;
}

/* ---- buckets ------------------------------------------------------------------------- */

static int by_offset(const void *a, const void *b) {
  const ddp_tensor *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Trainable tensors in arena order; DT_INTERNAL unless they tile [0, n_params). */
static dt_status collect_tensors(dt_ddp *d) {
  const int nt = dt_model_num_tensors(d->m);
  int n = 0;
  dt_tensor_info t;
  for (int i = 0; i < nt; i++) {
    DT_CHECK(dt_model_tensor_info(d->m, i, &t));
    n += t.trainable != 0;
  }
  if (n) {
    DT_CHECK(dt_alloc_array((size_t)n, sizeof(ddp_tensor), "DDP tensor table", (void **)&d->tensors));
    DT_CHECK(dt_alloc_array((size_t)n, 1, "DDP ready flags", (void **)&d->ready));
  }
  n = 0;
  for (int i = 0; i < nt; i++) {
    DT_CHECK(dt_model_tensor_info(d->m, i, &t));
    if (!t.trainable) continue;
    size_t numel = 1;
    for (int k = 0; k < t.ndim; k++) numel *= (size_t)t.shape[k];
    d->tensors[n++] = (ddp_tensor){.off = t.offset, .numel = numel, .index = i};
  }
  qsort(d->tensors, (size_t)n, sizeof *d->tensors, by_offset);
  d->n_tensors = n;
  for (int i = 0; i < n; i++) d->tensors[i].table = -1;
  for (int k = 0; k < dt_model_num_row_tables(d->m); k++) {
    dt_rows t;
    dt_model_ctx_rows(d->m, dt_model_default_ctx(d->m), k, &t);
    for (int i = 0; i < n; i++)
      if (d->tensors[i].index == t.tensor) d->tensors[i].table = k;
  }
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    if (d->tensors[i].off != at)
      return dt_error(DT_INTERNAL, "dt_ddp_new: trainable tensors do not tile the gradient arena (gap at element %zu)", at);
    at += d->tensors[i].numel;
  }
  if (at != d->n_params)
    return dt_error(DT_INTERNAL, "dt_ddp_new: trainable tensors cover %zu of %zu arena elements", at, d->n_params);
  return DT_OK;
}

/* Pieces (dt_model_set_grad_pieces) of tensor t: as many as make pieces of about mb MiB, at most
 * DT_DDP_MAX_PIECES; 0 elements where it stays whole. */
static size_t piece_elems(double mb, const ddp_tensor *t) {
  const double want = mb * (1024.0 * 1024.0) / sizeof(float);
  if (t->table >= 0 || !(want >= 1) || (double)t->numel < 2 * want) return 0;
  const double n = (double)t->numel / want;
  const size_t pieces = n > DT_DDP_MAX_PIECES ? DT_DDP_MAX_PIECES : (size_t)n;
  return (t->numel + pieces - 1) / pieces;
}

/* Whether every rank's communication thread has a CPU of its own (comm_cpu, or dt_group_comm_has_cpu for auto),
 * agreed over the ranks (the least): the pieces and the measured layout must match. A collective, at setup, with
 * the measured layout and 2 or more ranks only (elsewhere comm_own stays 0). */
static dt_status agree_comm_cpu(dt_ddp *d) {
  int32_t own = d->cfg.comm_cpu >= 0 ? d->cfg.comm_cpu != 0 : dt_group_comm_has_cpu(d->g);
  DT_CHECK(dt_allreduce(d->g, &own, &own, 1, DT_I32, DT_MIN, NULL));
  d->comm_own = own;
  DT_LOG_INFO("ddp", "rank %d: %s%s", d->rank,
              own ? "every rank's communication thread has a CPU of its own: the layout planned from the measured "
                    "steps"
                  : "communication threads share CPUs with compute: one bucket after the measured steps",
              d->cfg.grad_piece_mb >= 0 ? ""
              : own                     ? ", weights in pieces (grad_piece_mb auto)"
                                        : ", whole weights (grad_piece_mb auto)");
  return DT_OK;
}

/* The piece size: grad_piece_mb, or for auto (< 0) DT_DDP_AUTO_PIECE_MB where every rank's communication thread
 * has a CPU of its own, else 0: sharing the compute threads' CPUs, the layout is one bucket after backward, in
 * which pieces start nothing early (and the cut GEMMs cost a few percent). */
static double piece_mb(const dt_ddp *d) {
  if (d->cfg.grad_piece_mb >= 0) return d->cfg.grad_piece_mb;
  return d->comm_own ? DT_DDP_AUTO_PIECE_MB : 0;
}

static void unsplit(dt_ddp *d);
/* With the measured layout, a large weight becomes one entry per piece its layer announces (the layer decides, in
 * whole rows), so the plan may start its all-reduce before its whole gradient is computed. */
static dt_status split_pieces(dt_ddp *d) {
  const double mb = d->cfg.auto_buckets && d->world > 1 ? piece_mb(d) : 0;
  d->piece_mb = mb;
  if (!(mb > 0)) {
    unsplit(d); /* whole tensors, whatever the model was asked before */
    return DT_OK;
  }
  size_t *piece = NULL;
  DT_CHECK(dt_alloc_array((size_t)d->n_tensors, sizeof *piece, "DDP pieces", (void **)&piece));
  size_t total = 0;
  for (int i = 0; i < d->n_tensors; i++) {
    const ddp_tensor *t = &d->tensors[i];
    piece[i] = dt_model_set_grad_pieces(d->m, t->index, piece_elems(mb, t));
    total += piece[i] ? (t->numel + piece[i] - 1) / piece[i] : 1;
    d->stats.pieced_tensors += piece[i] > 0;
  }
  dt_status st = DT_OK;
  ddp_tensor *pieces = NULL;
  unsigned char *ready = NULL;
  if (total > (size_t)d->n_tensors) {
    st = dt_alloc_array(total, sizeof *pieces, "DDP tensor table", (void **)&pieces);
    if (st == DT_OK) st = dt_alloc_array(total, 1, "DDP ready flags", (void **)&ready);
  }
  if (st == DT_OK && pieces) {
    size_t n = 0;
    for (int i = 0; i < d->n_tensors; i++) {
      const ddp_tensor *t = &d->tensors[i];
      for (size_t at = 0; at < t->numel; at += piece[i] ? piece[i] : t->numel) {
        pieces[n] = *t;
        pieces[n].off = t->off + at;
        pieces[n++].numel = piece[i] && t->numel - at > piece[i] ? piece[i] : t->numel - at;
      }
    }
    dt_free(d->tensors);
    dt_free(d->ready);
    d->tensors = pieces, d->ready = ready;
    d->n_tensors = (int)total;
    pieces = NULL, ready = NULL;
  }
  dt_free(ready);
  dt_free(pieces);
  dt_free(piece);
  return st;
}

/* Whole tensors again: the model's layers stop announcing pieces. */
static void unsplit(dt_ddp *d) {
  for (int i = 0; i < d->n_tensors; i++)
    if (i == 0 || d->tensors[i].index != d->tensors[i - 1].index)
      (void)dt_model_set_grad_pieces(d->m, d->tensors[i].index, 0);
}

static void free_bucket_rows(dt_ddp *d) {
  for (int i = 0; i < d->n_buckets; i++)
    if (d->buckets[i].rows) {
      dt_free(d->buckets[i].rows->payload);
      dt_free(d->buckets[i].rows->dense);
      dt_free(d->buckets[i].rows);
      d->buckets[i].rows = NULL;
    }
}

/* Buckets from their first tensors (first[0] = 0, increasing), replacing any layout before; the buckets array
 * holds n_tensors entries, the most there can be. A row table must be a bucket by itself. */
static dt_status set_layout(dt_ddp *d, const int *first, int nb) {
  free_bucket_rows(d);
  memset(d->buckets, 0, (size_t)d->n_tensors * sizeof *d->buckets);
  d->n_buckets = 0;
  for (int k = 0; k < nb; k++) {
    ddp_bucket *b = &d->buckets[k];
    const int end = k + 1 < nb ? first[k + 1] : d->n_tensors;
    b->off = d->tensors[first[k]].off;
    b->first = first[k];
    for (int i = first[k]; i < end; i++) {
      d->tensors[i].bucket = k;
      b->count += d->tensors[i].numel;
      b->n++;
    }
    if (d->stage) b->stage = d->stage + b->off;
    b->at = (dt_ddp_shard_at){&d->shards, b->off};
    d->n_buckets = k + 1; /* so far: dt_ddp_free releases them if a later one fails */
    const int table = d->tensors[first[k]].table;
    if (table < 0) continue;
    if (b->n != 1) return dt_error(DT_INTERNAL, "dt_ddp: a row table shares bucket %d", k);
    /* a row table: a bucket of its own, exchanged as rows when that is smaller */
    DT_CHECK(dt_alloc_array(1, sizeof *b->rows, "DDP row exchange", (void **)&b->rows));
    b->rows->table = table;
  }
  d->stats.buckets = d->n_buckets;
  return DT_OK;
}

/* PyTorch's layout: whole tensors in arena order, the first bucket up to first_bucket_mb, later ones up to
 * bucket_cap_mb; a tensor larger than the cap is a bucket alone (the first steps of the measured layout: a piece
 * counts as a tensor). A pure function of the model and the config, so identical on every rank. */
static dt_status lay_buckets(dt_ddp *d) {
  const double mib = 1024.0 * 1024.0;
  if (!d->n_tensors) return DT_OK;
  DT_CHECK(dt_alloc_array((size_t)d->n_tensors, sizeof(ddp_bucket), "DDP buckets", (void **)&d->buckets));
  int *first = NULL, nb = 0;
  DT_CHECK(dt_alloc_array((size_t)d->n_tensors, sizeof *first, "DDP buckets", (void **)&first));
  double count = 0;
  for (int i = 0; i < d->n_tensors; i++) {
    const double cap = (nb <= 1 ? d->cfg.first_bucket_mb : d->cfg.bucket_cap_mb) * mib;
    const int alone = d->tensors[i].table >= 0 || (i > 0 && d->tensors[i - 1].table >= 0);
    if (nb == 0 || alone || (count + (double)d->tensors[i].numel) * sizeof(float) > cap) {
      first[nb++] = i;
      count = 0;
    }
    count += (double)d->tensors[i].numel;
  }
  dt_status st = set_layout(d, first, nb);
  dt_free(first);
  return st;
}

/* ---- overlap: gradient-ready events (on the thread running backward) ------------------ */

static void set_late(dt_ddp *d, dt_status s, const char *msg) {
  if (d->late != DT_OK) return;
  d->late = s;
  snprintf(d->late_msg, sizeof d->late_msg, "%s", msg);
}

/* The sharded or fused update's step count, once a step before its first bucket (a failure, the same on every
 * rank as the learning rate is, launches none of the step's buckets). */
static dt_status begin_update(dt_ddp *d) {
  if (!d->begun) {
    const dt_status st = isnan(d->shards.lr)
                             ? dt_error(DT_INVALID_ARGUMENT, "dt_ddp: no learning rate for the update's step "
                                        "(dt_ddp_set_lr before the backward)")
                             : dt_optim_begin_step(d->shards.optim, d->shards.lr);
    d->begun = st == DT_OK ? 1 : -1;
    if (st != DT_OK) return st;
    d->shards.step_lr = d->shards.lr; /* before the first bucket is queued: the queue's lock publishes it */
  }
  return d->begun > 0 ? DT_OK : dt_error(DT_INVALID_ARGUMENT, "dt_ddp: the step's update could not begin");
}

/* What the buckets all-reduce: f32, or a compression hook's 16-bit type. */
static dt_dtype wire_dtype(const dt_ddp *d) {
  return d->cfg.comm_hook == DT_COMM_HOOK_NONE ? DT_F32 : d->cfg.comm_hook == DT_COMM_HOOK_BF16 ? DT_BF16 : DT_F16;
}

static void launch(dt_ddp *d, int i) {
  ddp_bucket *b = &d->buckets[i];
  float *g = d->grads + b->off;
  dt_status st;
  b->launched = 1;
  d->launch_s[i] = dt_time_now();
  b->trace_t0 = dt_trace_enabled() ? dt_trace_now_us() : 0;
  b->bytes = (double)b->count * (double)dt_dtype_size(wire_dtype(d));
  if (b->rows) {
    st = dt_ddp_rows_launch(b->rows, d->g, d->m, d->grads, d->cfg.rows_exchange, &b->work, &b->bytes);
  } else if (d->shards.optim) {
    st = begin_update(d);
    if (st == DT_OK)
      st = (d->fused ? dt_allreduce_each : dt_allreduce_shards)(d->g, g, b->count, DT_AVG, dt_ddp_shards_update,
                                                                 &b->at, &b->work);
  } else if (d->cfg.comm_hook == DT_COMM_HOOK_NONE) {
    st = dt_allreduce(d->g, g, g, b->count, DT_F32, DT_AVG, &b->work);
  } else {
    /* Divided before the cast, so a sum of world values near the f16 limit
     * cannot overflow (the result, the mean, is what has to fit). */
    const float scale = 1.0f / (float)d->world;
    uint16_t *s = b->stage;
    if (d->cfg.comm_hook == DT_COMM_HOOK_BF16)
      dt_f32_to_bf16_n(s, g, b->count, scale);
    else
      dt_f32_to_f16_n(s, g, b->count, scale);
    st = dt_allreduce(d->g, s, s, b->count, wire_dtype(d), DT_SUM, &b->work);
  }
  if (st != DT_OK) {
    b->work = NULL;
    set_late(d, st, dt_last_error());
  }
}

/* Bucket i's all-reduce from launch until DDP saw it complete, as an async
 * span: buckets overlap each other and backward's layer spans. */
static void trace_bucket(const dt_ddp *d, int i) {
  const ddp_bucket *b = &d->buckets[i];
  if (!(b->trace_t0 > 0)) return;
  char name[32], args[192];
  snprintf(name, sizeof name, "bucket %d", i);
  snprintf(args, sizeof args, "\"bytes\":%.0f,\"count\":%zu,\"tensors\":%d,\"seq\":%llu%s", b->bytes, b->count,
           b->n, b->work ? (unsigned long long)dt_work_seq(b->work) : 0ull,
           b->rows ? (b->rows->sparse ? ",\"exchange\":\"rows\"" : ",\"exchange\":\"dense\"") : "");
  dt_trace_async("ddp", name, b->trace_t0, dt_trace_now_us(), args);
}

/* Notes the launched buckets already complete (for the trace and comm time). */
static void poll_done(dt_ddp *d) {
  while (d->first_pending < d->next_launch) {
    ddp_bucket *b = &d->buckets[d->first_pending];
    if (b->work && !dt_work_test(b->work)) break;
    trace_bucket(d, d->first_pending);
    d->done_s[d->first_pending++] = dt_time_now();
  }
}

static void on_grad_ready(void *user, size_t offset, size_t count) {
  dt_ddp *d = user;
  if (!d->sync || !count) return;
  const double now = dt_time_now();
  if (d->fresh) {
    d->fresh = 0;
    d->n_events = d->done_at_last_event = 0;
    d->step_t0 = now;
  }
  if (d->n_events < d->n_tensors) {
    d->event_s[d->n_events] = dt_time_now();
    d->event_off[d->n_events] = offset;
    d->n_events++;
  }
  /* the first tensor starting at offset (binary search over arena order) */
  int lo = 0, hi = d->n_tensors;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (d->tensors[mid].off < offset) lo = mid + 1;
    else hi = mid;
  }
  char msg[256];
  if (lo == d->n_tensors || d->tensors[lo].off != offset) {
    snprintf(msg, sizeof msg, "dt_ddp: a gradient-ready event at element %zu does not start a tensor", offset);
    set_late(d, DT_INTERNAL, msg);
    return;
  }
  for (int i = lo; i < d->n_tensors && d->tensors[i].off < offset + count; i++) {
    const ddp_tensor *t = &d->tensors[i];
    if (d->ready[i]) {
      dt_tensor_info info;
      snprintf(msg, sizeof msg,
               "dt_ddp_finish: the gradient of '%s' became ready twice in one step (two backward passes without "
               "dt_ddp_finish between them? use dt_ddp_set_sync(d, 0) to accumulate)",
               dt_model_tensor_info(d->m, t->index, &info) == DT_OK ? info.name : "?");
      set_late(d, DT_INVALID_ARGUMENT, msg);
      continue;
    }
    d->ready[i] = 1;
    d->t_ready[i] = now - d->step_t0;
    d->buckets[t->bucket].ready += t->numel;
  }
  while (d->next_launch < d->n_buckets && d->buckets[d->next_launch].ready == d->buckets[d->next_launch].count)
    launch(d, d->next_launch++);
  poll_done(d);
  if (d->next_launch == d->n_buckets) d->done_at_last_event = d->first_pending;
}

/* ---- public API ----------------------------------------------------------------------- */

dt_status dt_ddp_new(dt_model *m, dt_group *g, const dt_ddp_config *cfg, dt_ddp **out) {
  if (!m || !g || !out) return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_new: NULL argument");
  dt_ddp_config c;
  if (cfg) c = *cfg;
  else dt_ddp_config_default(&c);
  if (!(c.bucket_cap_mb > 0) || !(c.first_bucket_mb > 0))
    return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_new: bucket_cap_mb %g and first_bucket_mb %g must be > 0",
                    c.bucket_cap_mb, c.first_bucket_mb);
  if (c.comm_hook != DT_COMM_HOOK_NONE && c.comm_hook != DT_COMM_HOOK_BF16 && c.comm_hook != DT_COMM_HOOK_FP16)
    return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_new: unknown comm_hook %d", (int)c.comm_hook);
  if (isnan(c.grad_piece_mb))
    return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_new: grad_piece_mb is NaN (< 0: auto, 0: whole tensors)");
  size_t n_params = 0;
  float *grads = dt_model_grads(m, &n_params);
  if (!grads) return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_new: the model is not built (call dt_model_build first)");

  dt_ddp *d = NULL;
  dt_status st;
  DT_CHECK(dt_alloc(sizeof *d, (void **)&d));
  d->m = m;
  d->g = g;
  d->cfg = c;
  d->rank = dt_group_rank(g);
  d->world = dt_group_size(g);
  d->grads = grads;
  d->n_params = n_params;
  d->sync = 1;
  d->fresh = 1;
  DT_CHECK_GOTO(check_same_model(g, m), st, fail);
  DT_CHECK_GOTO(broadcast_state(d, 1), st, fail);
  /* a compression hook all-reduces its staging arena, shared below instead of the gradients */
  if (c.shared_grads && c.comm_hook == DT_COMM_HOOK_NONE && d->world > 1 && n_params)
    DT_CHECK_GOTO(share_grads(d), st, fail);
  DT_CHECK_GOTO(collect_tensors(d), st, fail);
  if (c.auto_buckets && d->world > 1) DT_CHECK_GOTO(agree_comm_cpu(d), st, fail);
  DT_CHECK_GOTO(split_pieces(d), st, fail);
  DT_CHECK_GOTO(lay_buckets(d), st, fail);
  /* as many buckets as tensors at most (a measured layout may have more buckets than the first) */
  const size_t nt = d->n_tensors ? (size_t)d->n_tensors : 1;
  DT_CHECK_GOTO(dt_alloc_array(nt, sizeof(double), "DDP trace", (void **)&d->launch_s), st, fail);
  DT_CHECK_GOTO(dt_alloc_array(nt, sizeof(double), "DDP trace", (void **)&d->done_s), st, fail);
  DT_CHECK_GOTO(dt_alloc_array(nt, sizeof(double), "DDP layout", (void **)&d->t_ready), st, fail);
  DT_CHECK_GOTO(dt_alloc_array(nt, sizeof(double), "DDP layout", (void **)&d->ready_sum), st, fail);
  DT_CHECK_GOTO(dt_alloc_array(nt, sizeof(double), "DDP trace", (void **)&d->event_s), st, fail);
  DT_CHECK_GOTO(dt_alloc_array(nt, sizeof(size_t), "DDP trace", (void **)&d->event_off), st, fail);
  if (c.comm_hook != DT_COMM_HOOK_NONE && n_params) {
    if (c.shared_grads && d->world > 1) DT_CHECK_GOTO(share_stage(d), st, fail);
    if (!d->stage)
      DT_CHECK_GOTO(dt_alloc_array(n_params, sizeof(uint16_t), "DDP compression staging", (void **)&d->stage), st,
                    fail);
    for (int i = 0; i < d->n_buckets; i++) d->buckets[i].stage = d->stage + d->buckets[i].off;
  }
  d->stats.buckets = d->n_buckets;
  dt_model_on_grad_ready(m, on_grad_ready, d);
  d->hooked = 1;
  DT_LOG_INFO("ddp", "rank %d: %zu parameters in %d buckets (first %.3g MiB, cap %.3g MiB%s), hook %d%s", d->rank,
              n_params, d->n_buckets, c.first_bucket_mb, c.bucket_cap_mb,
              c.auto_buckets ? "; measured layout after the first steps" : "", (int)c.comm_hook,
              d->shared ? ", gradients in shared memory" : d->stage_shared ? ", 16-bit copies in shared memory" : "");
  if (d->stats.pieced_tensors)
    DT_LOG_INFO("ddp", "rank %d: %d weights announced in pieces of about %.3g MiB (%d entries for the layout)",
                d->rank, d->stats.pieced_tensors, d->piece_mb, d->n_tensors);
  *out = d;
  return DT_OK;
fail:
  dt_ddp_free(d);
  return st;
}

/* Waits for every launched bucket; the first failure is returned (with its detail). */
static dt_status wait_launched(dt_ddp *d) {
  dt_status first = DT_OK;
  char msg[512] = "";
  for (int i = 0; i < d->next_launch; i++) {
    ddp_bucket *b = &d->buckets[i];
    if (!b->work) continue;
    dt_status s = dt_work_wait(b->work, 0);
    if (i >= d->first_pending) {
      d->done_s[i] = dt_time_now();
      trace_bucket(d, i);
    }
    double ran = dt_work_elapsed(b->work);
    if (ran > 0) d->step_comm += ran;
    if (s != DT_OK && first == DT_OK) {
      first = s;
      snprintf(msg, sizeof msg, "%s", dt_last_error());
    }
    dt_work_free(b->work);
    b->work = NULL;
  }
  d->first_pending = d->next_launch;
  if (first != DT_OK) return dt_error(first, "%s", msg);
  return DT_OK;
}

static void reset_step(dt_ddp *d) {
  for (int i = 0; i < d->n_buckets; i++) {
    d->buckets[i].ready = 0;
    d->buckets[i].launched = 0;
  }
  if (d->n_tensors) memset(d->ready, 0, (size_t)d->n_tensors);
  d->next_launch = d->first_pending = 0;
  d->late = DT_OK;
  d->late_msg[0] = 0;
  d->fresh = 1;
  d->step_comm = 0;
  d->begun = 0;
}

void dt_ddp_free(dt_ddp *d) {
  if (!d) return;
  /* The communication thread may still use the arena and staging: wait (bounded by the group's deadline). */
  if (d->buckets) (void)wait_launched(d);
  if (d->hooked) dt_model_on_grad_ready(d->m, NULL, NULL);
  if (d->tensors) unsplit(d);
  if (d->shared) dt_group_unshare(d->g, d->grads); /* the model keeps the memory */
  dt_free(d->event_off);
  dt_free(d->event_s);
  dt_free(d->done_s);
  dt_free(d->launch_s);
  if (d->stage_shared) {
    dt_group_unshare(d->g, d->stage);
    dt_shared_free(d->stage, d->n_params * sizeof(uint16_t));
  } else {
    dt_free(d->stage);
  }
  if (d->buckets) free_bucket_rows(d);
  dt_free(d->buckets);
  dt_free(d->t_ready);
  dt_free(d->ready_sum);
  dt_free(d->ready);
  dt_free(d->tensors);
  dt_free(d);
}

dt_status dt_ddp_before_forward(dt_ddp *d) {
  if (!d) return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_before_forward: NULL argument");
  if (!d->cfg.broadcast_buffers || !has_buffers(d->m)) return DT_OK;
  /* Every rank starts the step with rank 0's running statistics, as PyTorch does. */
  dt_status st = broadcast_state(d, 0);
  if (st != DT_OK) return dt_error_prefix(st, "dt_ddp_before_forward: broadcasting buffers");
  return DT_OK;
}

void dt_ddp_set_sync(dt_ddp *d, int sync) {
  if (d) d->sync = sync != 0;
}

/* Whether DDP may step o inside the all-reduces: between steps, o the model's size, the gradients read in place,
 * no row tables and no hook (nobody may need every averaged gradient). 0 with *on = 0 where it may not (logged). */
static dt_status may_step(dt_ddp *d, const dt_optim *o, const char *fn, int *on) {
  *on = 0;
  if (d->shards.optim)
    return dt_error(DT_INVALID_ARGUMENT, "%s: the update is DDP's already (call one of them, once)", fn);
  if (!d->fresh || d->next_launch)
    return dt_error(DT_INVALID_ARGUMENT, "%s: a step is under way (call it between steps)", fn);
  if (dt_optim_size(o) != d->n_params)
    return dt_error(DT_INVALID_ARGUMENT, "%s: the optimizer steps %zu parameters, the model has %zu", fn,
                    dt_optim_size(o), d->n_params);
  int rows = 0;
  for (int i = 0; i < d->n_tensors; i++) rows |= d->tensors[i].table >= 0;
  if (!d->shared || rows || d->cfg.comm_hook != DT_COMM_HOOK_NONE) {
    DT_LOG_INFO("ddp", "rank %d: every rank steps the whole model after the all-reduces: %s", d->rank,
                d->cfg.comm_hook != DT_COMM_HOOK_NONE ? "a compression hook"
                : !d->shared                          ? "no shared gradients"
                                                      : "row tables");
    return DT_OK;
  }
  *on = 1;
  return DT_OK;
}

dt_status dt_ddp_set_optim(dt_ddp *d, dt_optim *o, int *on) {
  if (!d || !o || !on) return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_set_optim: NULL argument");
  if (d->shards.optim == o && !d->fused) return *on = 1, DT_OK;
  DT_CHECK(may_step(d, o, "dt_ddp_set_optim", on));
  if (!*on) return DT_OK;
  DT_CHECK(dt_ddp_shards_open(&d->shards, d->g, d->m, o));
  *on = d->stats.sharded_update = d->shards.optim != NULL;
  dt_optim_set_shared_params(o, *on); /* the other ranks read every share in their forward */
  DT_LOG_INFO("ddp", "rank %d: %s", d->rank,
              *on ? "parameters and optimizer state in memory common to the host; each rank updates its share"
                  : "every rank steps the whole model: the group cannot share memory");
  return DT_OK;
}

dt_status dt_ddp_fuse_optim(dt_ddp *d, dt_optim *o, int *on) {
  if (!d || !o || !on) return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_fuse_optim: NULL argument");
  if (d->shards.optim == o && d->fused) return *on = 1, DT_OK;
  DT_CHECK(may_step(d, o, "dt_ddp_fuse_optim", on));
  if (!*on) return DT_OK;
  dt_ddp_shards_fuse(&d->shards, d->m, o);
  d->fused = d->stats.fused_update = 1;
  DT_LOG_INFO("ddp", "rank %d: the optimizer steps each piece of the averaged gradients inside the all-reduces",
              d->rank);
  return DT_OK;
}

void dt_ddp_set_lr(dt_ddp *d, float lr) {
  if (d) d->shards.lr = lr;
}

/* Names of the tensors that got no gradient this step: "'a', 'b', ..." (as many as fit). */
static void unused_names(const dt_ddp *d, char *buf, size_t len, int *count) {
  size_t at = 0;
  int n = 0, full = 0;
  buf[0] = 0;
  for (int i = 0; i < d->n_tensors; i++) {
    if (d->ready[i] || (i > 0 && d->tensors[i - 1].index == d->tensors[i].index && !d->ready[i - 1]))
      continue; /* a tensor's later pieces: named once */
    n++;
    dt_tensor_info t;
    if (full || dt_model_tensor_info(d->m, d->tensors[i].index, &t) != DT_OK) continue;
    const size_t need = strlen(t.name) + 4 + 5; /* ", 'x'" and room for ", ..." */
    if (at + need >= len) {
      snprintf(buf + at, len - at, ", ...");
      full = 1;
      continue;
    }
    at += (size_t)snprintf(buf + at, len - at, "%s'%s'", at ? ", " : "", t.name);
  }
  *count = n;
}

/* ---- the measured layout ------------------------------------------------------------------ */

/* Adds this step's ready times and communication to the sums, after the skipped first steps. */
static void measure_step(dt_ddp *d) {
  if (d->stats.steps <= LAYOUT_SKIP_STEPS) return;
  for (int i = 0; i < d->n_tensors; i++) d->ready_sum[i] += d->t_ready[i];
  d->comm_sum += d->step_comm;
  for (int i = 0; i < d->n_buckets; i++) d->bytes_sum += d->buckets[i].bytes;
  d->launches_sum += d->n_buckets;
  d->measured++;
}

/* Seconds of one blocking all-reduce of n elements of type t at buf: the median of reps. */
static dt_status time_allreduce(dt_ddp *d, void *buf, size_t n, dt_dtype t, int reps, double *out) {
  double sec[8];
  for (int r = 0; r < reps && r < 8; r++) {
    const double t0 = dt_time_now();
    DT_CHECK(dt_allreduce(d->g, buf, buf, n, t, DT_SUM, NULL));
    sec[r] = dt_time_now() - t0;
  }
  for (int i = 1; i < reps; i++) /* insertion sort of a handful */
    for (int j = i; j > 0 && sec[j] < sec[j - 1]; j--) {
      const double x = sec[j];
      sec[j] = sec[j - 1], sec[j - 1] = x;
    }
  *out = sec[reps / 2];
  return DT_OK;
}

/* The cost of an all-reduce, alpha + bytes * per_byte: alpha from 1-element all-reduces, per_byte from one of up
 * to 1 Mi elements of the buckets' type, both between steps; per_byte no less than what the measured steps'
 * all-reduces took while backward ran beside them (the comm thread's own time, less alpha per launch). A
 * collective: every rank calls it. Shared gradients (or a hook's shared 16-bit staging arena) are probed where they
 * lie, so the cost is the one the buckets pay: what the arena holds is kept aside meanwhile and put back (a segment
 * of the probe's own had cost a share's two store rounds and its pages' first faults: the default mlp's planning
 * step took 7.5 ms, 4.9 of them in the first all-reduce). */
static dt_status measure_cost(dt_ddp *d, double *alpha, double *per_byte) {
  const size_t n = d->n_params < ((size_t)1 << 20) ? (d->n_params ? d->n_params : 1) : (size_t)1 << 20;
  const dt_dtype t = wire_dtype(d);
  const size_t bytes = n * dt_dtype_size(t);
  void *arena = d->shared ? (void *)d->grads : d->stage_shared ? (void *)d->stage : NULL, *buf = arena, *kept = NULL;
  if (arena) {
    DT_CHECK(dt_alloc_array_unset(n, dt_dtype_size(t), "DDP layout probe", &kept));
    memcpy(kept, arena, bytes);
  } else {
    DT_CHECK(dt_alloc_array(n, dt_dtype_size(t), "DDP layout probe", &buf));
  }
  double big = 0;
  dt_status st = time_allreduce(d, buf, 1, t, 7, alpha);
  if (st == DT_OK) st = time_allreduce(d, buf, n, t, 3, &big);
  if (kept) {
    memcpy(arena, kept, bytes);
    dt_free(kept);
  } else {
    dt_free(buf);
  }
  DT_CHECK(st);
  *per_byte = big > *alpha ? (big - *alpha) / (double)bytes : 0.0;
  if (d->bytes_sum > 0) {
    const double seen = (d->comm_sum - *alpha * d->launches_sum) / d->bytes_sum;
    if (seen > *per_byte) *per_byte = seen;
  }
  return DT_OK;
}

/* "0.96+3.1+..." MiB sizes of the buckets, for the log and the trace. */
static void layout_text(const dt_ddp *d, char *buf, size_t len) {
  size_t at = 0;
  buf[0] = 0;
  for (int i = 0; i < d->n_buckets && at + 16 < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%.3g", i ? "+" : "", d->buckets[i].count * 4.0 / (1024 * 1024));
}

/* After the measured layout: a weight whose pieces all fell in one bucket is announced whole again, as nothing
 * launches before its last piece (a cut GEMM costs a few percent more: 17% for 2048 x 784 in 8 pieces). */
static void keep_used_pieces(dt_ddp *d) {
  for (int i = 0; i < d->n_tensors;) {
    int j = i + 1;
    while (j < d->n_tensors && d->tensors[j].index == d->tensors[i].index) j++;
    if (j - i > 1 && d->tensors[i].bucket == d->tensors[j - 1].bucket) {
      (void)dt_model_set_grad_pieces(d->m, d->tensors[i].index, 0);
      d->stats.pieced_tensors--;
    }
    i = j;
  }
}

/* Rank 0 plans the layout from its measurements (the mean ready times of the measured steps) and every rank
 * takes it: a broadcast at the same step on every rank, so the buckets stay identical across ranks. Where the
 * communication threads share the compute threads' CPUs (comm_own 0), an all-reduce launched during backward
 * takes its work from backward's time slices and each launch costs a hand-off besides, so starting early gains
 * nothing: the layout is the fewest buckets (row tables alone), after backward, and no probe runs (the figures:
 * docs/benchmarks.md, "One bucket where the communication threads share the CPUs"). */
static dt_status replan(dt_ddp *d) {
  d->planned = 1;
  double alpha = 0, per_byte = 0, finish = 0;
  if (d->comm_own) DT_CHECK(measure_cost(d, &alpha, &per_byte));
  const size_t nt = (size_t)d->n_tensors;
  int64_t *msg = NULL;
  dt_ddp_plan_tensor *t = NULL;
  int *first = NULL;
  dt_status st = dt_alloc_array(nt + 1, sizeof *msg, "DDP layout", (void **)&msg);
  if (st == DT_OK) st = dt_alloc_array(nt, sizeof *t, "DDP layout", (void **)&t);
  if (st == DT_OK) st = dt_alloc_array(nt, sizeof *first, "DDP layout", (void **)&first);
  if (msg)
    msg[0] = 0; /* rank 0 sends 0 buckets when it could not plan: every rank fails alike */
  else
    dt_group_abort(d->g); /* the others' broadcast fails at once instead of waiting for this rank's */
  if (st == DT_OK && d->rank == 0) {
    const double bytes_per = (double)dt_dtype_size(wire_dtype(d));
    for (size_t i = 0; i < nt; i++)
      t[i] = (dt_ddp_plan_tensor){.bytes = (double)d->tensors[i].numel * bytes_per,
                                  .ready_s = d->ready_sum[i] / d->measured, .alone = d->tensors[i].table >= 0};
    const int nb = d->comm_own ? dt_ddp_plan_buckets(t, (int)nt, alpha, per_byte, first, &finish)
                               : dt_ddp_plan_fewest(t, (int)nt, first);
    msg[0] = nb > 0 ? nb : 0;
    for (int k = 0; k < nb; k++) msg[k + 1] = first[k];
  }
  if (msg) { /* every rank that got this far takes part */
    const dt_status bst = dt_broadcast(d->g, msg, nt + 1, DT_I64, 0, NULL);
    if (st == DT_OK) st = bst;
  }
  int ok = st == DT_OK && msg && msg[0] >= 1 && msg[0] <= (int64_t)nt && msg[1] == 0;
  for (int64_t k = 2; ok && k <= msg[0]; k++) ok = msg[k] > msg[k - 1] && msg[k] < (int64_t)nt;
  if (st == DT_OK && !ok)
    st = dt_error(DT_INTERNAL, "rank 0 sent no valid layout (%lld buckets for %zu tensors)", (long long)msg[0], nt);
  if (st == DT_OK) {
    for (int64_t k = 0; k < msg[0]; k++) first[k] = (int)msg[k + 1];
    st = set_layout(d, first, (int)msg[0]);
    if (st == DT_OK) keep_used_pieces(d);
  }
  if (st == DT_OK) {
    char sizes[512], args[640];
    layout_text(d, sizes, sizeof sizes);
    if (d->comm_own)
      DT_LOG_INFO("ddp", "rank %d: measured layout: %d buckets of %s MiB (all-reduce %.0f us + %.3g ns/byte%s); %d "
                  "weights in pieces", d->rank, d->n_buckets, sizes, alpha * 1e6, per_byte * 1e9,
                  d->rank == 0 ? "" : "; rank 0's plan", d->stats.pieced_tensors);
    else
      DT_LOG_INFO("ddp", "rank %d: measured layout: %d bucket(s) of %s MiB after backward (%s)", d->rank, d->n_buckets,
                  sizes, d->world > 1 ? "communication threads share CPUs with compute" : "one rank");
    if (d->comm_own)
      snprintf(args, sizeof args, "\"buckets\":%d,\"mib\":\"%s\",\"alpha_us\":%.1f,\"ns_per_byte\":%.4g",
               d->n_buckets, sizes, alpha * 1e6, per_byte * 1e9);
    else
      snprintf(args, sizeof args, "\"buckets\":%d,\"mib\":\"%s\",\"fewest\":1", d->n_buckets, sizes);
    if (dt_trace_enabled()) dt_trace_instant("ddp", "bucket layout", dt_trace_now_us(), args);
  }
  dt_free(first);
  dt_free(t);
  dt_free(msg);
  return st == DT_OK ? DT_OK : dt_error_prefix(st, "dt_ddp: choosing the measured bucket layout");
}

dt_status dt_ddp_finish(dt_ddp *d) {
  if (!d) return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_finish: NULL argument");
  /* no_sync: the gradients stay local and keep accumulating (a synchronised
   * backward already under way is completed whatever the flag says now) */
  if (!d->sync && d->fresh) return DT_OK;
  const double t0 = dt_time_now();
  dt_status st = DT_OK;
  if (d->next_launch < d->n_buckets && !d->cfg.find_unused_parameters) {
    /* Every rank whose backward took the same path fails here alike, before
     * launching anything more, so none waits for a collective the others will
     * not issue and the group stays usable. Ranks whose sets of unused
     * parameters differ (data-dependent control flow) have launched different
     * buckets and fall out of step (a timeout or mismatch later): such models
     * need find_unused_parameters, as in PyTorch. */
    char names[768];
    int n = 0;
    unused_names(d, names, sizeof names, &n);
    (void)wait_launched(d);
    reset_step(d);
    return dt_error(DT_INVALID_ARGUMENT,
                    "dt_ddp_finish: %d parameter tensors received no gradient this step: %s (no backward since the "
                    "last dt_ddp_finish, or layers unused by forward; set find_unused_parameters to reduce them as "
                    "they are)",
                    n, names);
  }
  while (d->next_launch < d->n_buckets) launch(d, d->next_launch++); /* unused: reduced as they are */
  st = wait_launched(d);
  const double t1 = dt_time_now();
  if (st == DT_OK && d->late != DT_OK) st = dt_error(d->late, "%s", d->late_msg);
  for (int i = 0; st == DT_OK && i < d->n_buckets; i++) {
    const ddp_bucket *b = &d->buckets[i];
    if (!b->rows) continue;
    st = dt_ddp_rows_finish(b->rows, d->m, d->world, d->grads);
    *(b->rows->sparse ? &d->stats.rows_sparse : &d->stats.rows_dense) += 1;
    *(b->rows->sparse ? &d->stats.rows_sparse_bytes : &d->stats.rows_dense_bytes) += b->bytes;
  }
  if (st == DT_OK && d->cfg.comm_hook != DT_COMM_HOOK_NONE) {
    for (int i = 0; i < d->n_buckets; i++) {
      const ddp_bucket *b = &d->buckets[i];
      if (b->rows) continue;
      float *g = d->grads + b->off;
      if (d->cfg.comm_hook == DT_COMM_HOOK_BF16)
        dt_bf16_to_f32_n(g, b->stage, b->count);
      else
        dt_f16_to_f32_n(g, b->stage, b->count);
    }
  }
  /* Comm time: what the communication thread spent running this step's all-reduces. */
  double comm = d->step_comm;
  for (int i = 0; i < d->n_buckets; i++) d->stats.bytes += d->buckets[i].bytes;
  d->stats.comm_s += comm;
  d->stats.wait_s += t1 - t0;
  if (st == DT_OK) d->stats.steps++;
  if (st == DT_OK && d->cfg.auto_buckets && !d->planned) measure_step(d);
  reset_step(d);
  if (st == DT_OK && d->cfg.auto_buckets && !d->planned && d->measured == LAYOUT_MEASURE_STEPS) st = replan(d);
  return st;
}

void dt_ddp_get_stats(const dt_ddp *d, dt_ddp_stats *s) {
  if (!s) return;
  if (!d) {
    memset(s, 0, sizeof *s);
    return;
  }
  *s = d->stats;
  s->shared_allreduces = dt_group_shared_allreduces(d->g);
}

dt_status dt_ddp_bucket(const dt_ddp *d, int i, size_t *offset, size_t *count) {
  if (!d) return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_bucket: NULL argument");
  if (i < 0 || i >= d->n_buckets)
    return dt_error(DT_INVALID_ARGUMENT, "dt_ddp_bucket: bucket %d outside 0..%d", i, d->n_buckets - 1);
  if (offset) *offset = d->buckets[i].off;
  if (count) *count = d->buckets[i].count;
  return DT_OK;
}

void dt_ddp_get_trace(const dt_ddp *d, dt_ddp_trace *t) {
  memset(t, 0, sizeof *t);
  if (!d) return;
  t->buckets = d->n_buckets;
  t->launch_s = d->launch_s;
  t->done_s = d->done_s;
  t->events = d->n_events;
  t->event_s = d->event_s;
  t->event_off = d->event_off;
  t->done_at_last_event = d->done_at_last_event;
}

/* Internals of the data-parallel strategies shared with the tests: a trace of DDP's last synchronised step. */
#ifndef DT_PARALLEL_IMPL_H
#define DT_PARALLEL_IMPL_H

#include <stddef.h>

#include "dtrain/dist.h"
#include "dtrain/model_ctx.h"
#include "dtrain/parallel.h"

/* What happened during the last synchronised backward + dt_ddp_finish, on the
 * dt_time_now() clock (seconds). The arrays belong to the dt_ddp and are valid
 * until the next step or dt_ddp_free. */
typedef struct dt_ddp_trace {
  int buckets;
  const double *launch_s;   /* (buckets): when bucket i's all-reduce was queued */
  const double *done_s;     /* (buckets): when it was first seen complete (an estimate from above) */
  int events;               /* gradient-ready events of the step */
  const double *event_s;    /* (events): when each arrived */
  const size_t *event_off;  /* (events): the arena offset each covered */
  int done_at_last_event;   /* buckets whose all-reduce had completed when the last gradient became ready:
                               > 0 means communication ran while backward did */
} dt_ddp_trace;
void dt_ddp_get_trace(const dt_ddp *d, dt_ddp_trace *t);

/* One tensor of the arena for the bucket plan (ddp_layout.c), in arena order. */
typedef struct dt_ddp_plan_tensor {
  double bytes;   /* its payload */
  double ready_s; /* when its gradient becomes ready, from the step's first gradient-ready event */
  int alone;      /* 1: a bucket by itself (a row table) */
} dt_ddp_plan_tensor;
/* Bucket boundaries over the n tensors that let the step's all-reduces finish earliest when each bucket
 * costs alpha_s + bytes * per_byte_s and launches once ready, in order: first[k] = bucket k's first tensor;
 * returns the bucket count (-1: out of memory); *finish_s (may be NULL): the modelled finish. */
int dt_ddp_plan_buckets(const dt_ddp_plan_tensor *t, int n, double alpha_s, double per_byte_s, int *first,
                        double *finish_s);
/* The fewest buckets over the n tensors: one, but for each tensor marked alone, which is a bucket by itself;
 * first[] and the count as dt_ddp_plan_buckets gives them. */
int dt_ddp_plan_fewest(const dt_ddp_plan_tensor *t, int n, int *first);

/* DDP's exchange of one row table's gradient (ddp_rows.c): each step either
 * the dense all-reduce (averaged) or an all-gather of every rank's touched
 * rows, summed into the rows and averaged; afterwards the context's touched
 * rows are the union over ranks, as zero_grad and row-wise optimizer steps need. */
typedef struct dt_ddp_rows {
  int table;        /* the model's row table */
  int sparse;       /* this step's choice */
  int32_t *payload; /* (world, per) words: [n, ids (cap), values (cap, width) as f32 bits] per rank */
  size_t per;       /* words per rank this step */
  int64_t cap_words;
  float *dense;     /* (rows * width + rows): the table's gradient and a touched mask, all-reduced together */
} dt_ddp_rows;
/* 1: exchange the touched rows; 0: the dense table. The same on every rank (the lookups are). */
int dt_ddp_rows_choose(const dt_rows *t, int world, dt_rows_exchange mode);
/* Launches this step's exchange of table x->table; *bytes: this rank's payload. */
dt_status dt_ddp_rows_launch(dt_ddp_rows *x, dt_group *g, dt_model *m, float *grads, dt_rows_exchange mode,
                             dt_work **w, double *bytes);
/* After the exchange completed: the gathered rows summed and averaged (sparse), the union of touched rows marked
 * (exactly: a dense exchange carries every rank's touched mask with the table). */
dt_status dt_ddp_rows_finish(dt_ddp_rows *x, dt_model *m, int world, float *grads);

/* DDP's sharded and fused updates (ddp_shards.c): the optimizer's step made by each bucket's all-reduce, on the
 * rank's share of parameters common to the host (sharded) or on every piece of its own (fused). */
typedef struct dt_ddp_shards {
  dt_optim *optim; /* NULL: off (the caller steps the optimizer) */
  float *params;   /* the model's parameter arena: one for the host's ranks, or (fused) the rank's own */
  float lr;        /* the next step's learning rate (dt_ddp_set_lr; NaN: none given) */
  float step_lr;   /* the step under way's, checked by dt_optim_begin_step: what the updates use */
} dt_ddp_shards;
/* A bucket's place for the update: dt_ddp_shards_update's user. */
typedef struct dt_ddp_shard_at {
  const dt_ddp_shards *shards;
  size_t off; /* the bucket's first element in the arenas */
} dt_ddp_shard_at;
/* Moves the model's parameters and o's states into memory common to the group's ranks (rank 0's values) and has
 * the model announce gradients late (dt_model_set_ready_late); s->optim stays NULL where the group cannot share. */
dt_status dt_ddp_shards_open(dt_ddp_shards *s, dt_group *g, dt_model *m, dt_optim *o);
/* The fused update: o steps the model's own parameters inside each bucket's dt_allreduce_each, every rank every
 * piece, and the model announces gradients late. */
void dt_ddp_shards_fuse(dt_ddp_shards *s, dt_model *m, dt_optim *o);
/* The dt_shard_fn of a bucket's dt_allreduce_shards or dt_allreduce_each (user: its dt_ddp_shard_at). */
void dt_ddp_shards_update(void *user, size_t off, size_t n, const float *avg);

#endif

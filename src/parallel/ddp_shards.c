/* DDP's sharded update (ZeRO stage 1 within a host): the ranks of a host keep one copy of the parameters and of
 * the optimizer's state, in memory every rank maps writable (dt_group_share_common). Each bucket's all-reduce
 * (dt_allreduce_shards) reduces the rank's share of the gradients from the other ranks' shared gradient arenas and
 * steps that share of the parameters while it is in cache; nobody copies the averaged gradients back, and no rank
 * repeats the others' updates. Per rank and step, against the all-reduce followed by a whole optimizer step:
 * 1/world of the optimizer's work, and no pass to copy the other ranks' shares of the gradients.
 *
 * Why it is safe: a bucket's all-reduce starts only once every rank has announced its gradients, which a model
 * with dt_model_set_ready_late does once a layer's backward reads its parameters no more (after its input
 * gradient; a Linear's weight pieces after that too), so no rank reads those parameters again this step; the
 * collective ends with a sync after every rank's update, and dt_ddp_finish waits for it, so the next forward
 * everywhere sees the stepped parameters.
 *
 * The fused update (dt_ddp_shards_fuse) is the same step with the parameters each rank's own: every rank steps
 * every piece of the average as its bucket's dt_allreduce_each hands it over, its own share after reducing it,
 * the other ranks' shares where they lie in their memory, instead of copying those into its gradients first and
 * stepping the whole model after (the default mlp's DDP x2: that copy's writes went into lines the other core had
 * just read). */
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/parallel.h"
#include "parallel/parallel-impl.h"

void dt_ddp_shards_update(void *user, size_t off, size_t n, const float *avg) {
  const dt_ddp_shard_at *at = user;
  const dt_ddp_shards *s = at->shards;
  dt_optim_step_block(s->optim, s->params, avg, s->step_lr, at->off + off, at->off + off + n);
}

void dt_ddp_shards_fuse(dt_ddp_shards *s, dt_model *m, dt_optim *o) {
  dt_model_set_ready_late(m, 1);
  *s = (dt_ddp_shards){.optim = o, .params = dt_model_params(m, NULL), .lr = NAN, .step_lr = NAN};
}

/* One memory of `bytes` for the host; *mem NULL where the group cannot share (on every rank alike). */
static dt_status common(dt_group *g, size_t bytes, float **mem) {
  void *p = NULL;
  dt_status st = dt_group_share_common(g, bytes, &p);
  if (st == DT_UNSUPPORTED) return DT_OK;
  *mem = p;
  return st;
}

dt_status dt_ddp_shards_open(dt_ddp_shards *s, dt_group *g, dt_model *m, dt_optim *o) {
  memset(s, 0, sizeof *s);
  size_t n = 0;
  const float *params = dt_model_params(m, &n);
  const size_t pbytes = n * sizeof(float), sbytes = dt_optim_state_bytes(o);
  float *pmem = NULL, *smem = NULL;
  dt_status st = common(g, pbytes, &pmem);
  if (st == DT_OK && pmem && sbytes) st = common(g, sbytes, &smem);
  if (st != DT_OK || !pmem || (sbytes && !smem)) {
    dt_shared_free(pmem, pbytes);
    return st;
  }
  if (dt_group_rank(g) == 0) { /* rank 0's values (every rank holds the same), the states as the optimizer lays them */
    memcpy(pmem, params, pbytes);
    for (int i = 0; i < dt_optim_num_states(o); i++) memcpy(smem + (size_t)i * n, dt_optim_state(o, i, NULL), pbytes);
  }
  st = dt_barrier(g, NULL); /* then every rank adopts the memory as it is: nobody writes it twice */
  /* neither can fail on these arguments (aligned, given a release): no rank is left half moved */
  if (st == DT_OK && (st = dt_model_set_param_memory(m, pmem, 0, dt_shared_free)) == DT_OK) pmem = NULL;
  if (st == DT_OK && smem && (st = dt_optim_set_state_memory(o, smem, 0, dt_shared_free)) == DT_OK)
    smem = NULL; /* the optimizer's now */
  dt_shared_free(smem, sbytes);
  dt_shared_free(pmem, pbytes);
  DT_CHECK(st);
  dt_model_set_ready_late(m, 1);
  *s = (dt_ddp_shards){.optim = o, .params = dt_model_params(m, NULL), .lr = NAN, .step_lr = NAN};
  return DT_OK;
}

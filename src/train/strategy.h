/* Internal: the pieces strategies share (single's behaviour, reused by dp and ddp where they agree). */
#ifndef DT_TRAIN_STRATEGY_H
#define DT_TRAIN_STRATEGY_H

#include "train/run.h"

dt_status dt_strategy_join_alone(dt_run *r);
dt_status dt_strategy_prefix_loaders(dt_run *r);
dt_status dt_strategy_model_batch(dt_run *r, const dt_batch *b, float *loss, double *sums);
dt_status dt_strategy_model_forward(dt_run *r, const void *x, int n, const float **out);
dt_status dt_strategy_local_sum(dt_run *r, double *v, size_t n);
dt_status dt_strategy_local_metrics(dt_run *r, dt_metric_acc *acc);
dt_status dt_strategy_local_stop(dt_run *r, int local, int *stop);
void dt_strategy_no_comm(dt_run *r, dt_comm_times *t);
dt_status dt_strategy_local_gather(dt_run *r, const double *mine, double *all, size_t n);
void dt_strategy_model_rng_get(dt_run *r, dt_snapshot_position *p);
void dt_strategy_model_rng_set(dt_run *r, const dt_snapshot_position *p);

#endif

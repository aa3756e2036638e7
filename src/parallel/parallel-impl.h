/* Internals of the data-parallel strategies shared with the tests: a trace of DDP's last synchronised step. */
#ifndef DT_PARALLEL_IMPL_H
#define DT_PARALLEL_IMPL_H

#include <stddef.h>

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

#endif

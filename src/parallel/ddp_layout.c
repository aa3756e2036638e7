/* DDP's measured bucket layout: the boundaries over the gradient arena that let the all-reduces of a step finish
 * earliest, given when each tensor's gradient becomes ready during backward and what an all-reduce costs. */
#include <math.h>

#include "core/impl.h"
#include "parallel/parallel-impl.h"

/* The model of a step: buckets launch in arena order, each once its last tensor is ready and the previous
 * all-reduce is done (one communication channel), and take alpha + bytes * per_byte. f[i] is the earliest
 * finish of tensors [0, i) in whole buckets; a bucket [j, i) costs max(f[j], ready[j..i)) + alpha + bytes.
 * Exact over every layout by dynamic programming, O(n^2). A tensor marked alone (a row table, which has an
 * exchange of its own) is always a bucket by itself. Ties go to the larger last bucket (fewer launches). */
int dt_ddp_plan_buckets(const dt_ddp_plan_tensor *t, int n, double alpha_s, double per_byte_s, int *first,
                        double *finish_s) {
  if (n <= 0) return 0;
  double *f = NULL;
  int *prev = NULL;
  if (dt_alloc_array((size_t)n + 1, sizeof *f, "bucket plan", (void **)&f) != DT_OK ||
      dt_alloc_array((size_t)n + 1, sizeof *prev, "bucket plan", (void **)&prev) != DT_OK) {
    dt_free(f);
    return -1;
  }
  f[0] = 0.0;
  for (int i = 1; i <= n; i++) {
    f[i] = INFINITY;
    double bytes = 0.0, ready = 0.0;
    for (int j = i - 1; j >= 0; j--) {
      if ((t[j].alone || t[i - 1].alone) && j != i - 1) break; /* an alone tensor is a bucket by itself */
      bytes += t[j].bytes;
      ready = t[j].ready_s > ready ? t[j].ready_s : ready;
      const double start = f[j] > ready ? f[j] : ready, done = start + alpha_s + bytes * per_byte_s;
      if (done <= f[i] + 1e-12 * (1.0 + fabs(done))) { /* ties: the smaller j, a larger bucket */
        f[i] = done;
        prev[i] = j;
      }
    }
  }
  int nb = 0;
  for (int i = n; i > 0; i = prev[i]) nb++;
  int k = nb;
  for (int i = n; i > 0; i = prev[i]) first[--k] = prev[i];
  if (finish_s) *finish_s = f[n];
  dt_free(prev);
  dt_free(f);
  return nb;
}

int dt_ddp_plan_fewest(const dt_ddp_plan_tensor *t, int n, int *first) {
  int nb = 0;
  for (int i = 0; i < n; i++)
    if (i == 0 || t[i].alone || t[i - 1].alone) first[nb++] = i;
  return nb;
}

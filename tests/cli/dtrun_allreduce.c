/* A dtrun test worker that forms a real process group from the launcher's
 * environment (the agent serves the store) and all-reduces: prints
 * "rank R of W: sum S backend B restart C served 1", exits 0; any failure exits 1
 * with the status. `dtrun_allreduce R N`: rank R then exits 3 while the restart
 * count is below N (a restarted round must form a fresh group on the same store). */
#include <stdio.h>
#include <stdlib.h>

#include "dtrain/dist.h"

int main(int argc, char **argv) {
  int fail_rank = argc > 2 ? atoi(argv[1]) : -1, fail_until = argc > 2 ? atoi(argv[2]) : 0;
  dt_dist_env env;
  dt_status st = dt_dist_env_detect(NULL, 0, 0, &env);
  if (st != DT_OK) {
    fprintf(stderr, "detect: %s: %s\n", dt_status_name(st), dt_last_error());
    return 1;
  }
  dt_group_options o;
  dt_group_options_default(&o);
  o.timeout_s = 20;
  dt_group *g = NULL;
  if ((st = dt_group_init_env(&env, &o, &g)) != DT_OK) {
    fprintf(stderr, "group init: %s: %s\n", dt_status_name(st), dt_last_error());
    return 1;
  }
  float x[4];
  for (int i = 0; i < 4; i++) x[i] = (float)(dt_group_rank(g) + 1);
  if ((st = dt_allreduce(g, x, x, 4, DT_F32, DT_SUM, NULL)) != DT_OK) {
    fprintf(stderr, "allreduce: %s: %s\n", dt_status_name(st), dt_last_error());
    dt_group_destroy(g);
    return 1;
  }
  printf("rank %d of %d: sum %g backend %s restart %d served %d\n", dt_group_rank(g), dt_group_size(g),
         (double)x[0], dt_group_backend(g), env.restart_count, env.store_served);
  fflush(stdout);
  /* Every rank has printed before the failing one exits (dtrun then stops the
   * others, which must not lose their line to that race). */
  if ((st = dt_barrier(g, NULL)) != DT_OK) {
    fprintf(stderr, "barrier: %s: %s\n", dt_status_name(st), dt_last_error());
    dt_group_destroy(g);
    return 1;
  }
  int fail = dt_group_rank(g) == fail_rank && env.restart_count < fail_until;
  dt_group_destroy(g);
  return fail ? 3 : 0;
}

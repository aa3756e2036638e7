/* A rank of a multi-process test launched by mpirun, dtrun or a script in
 * network namespaces: joins the group from the environment, runs every
 * collective against the reference (tests/dist_check.h), prints one line and
 * exits 0 only if every result matched.
 *
 *   dist_worker [--backend auto|shm|tcp|mpi] [--master HOST:PORT] [--large] [--expect-backend NAME] */
#include <stdio.h>
#include <string.h>

#include "dist_check.h"

int main(int argc, char **argv) {
  dt_group_options o;
  dt_group_options_default(&o);
  char url[300];
  const char *expect = NULL;
  int large = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--backend") && i + 1 < argc) o.backend = argv[++i];
    else if (!strcmp(argv[i], "--master") && i + 1 < argc) snprintf(url, sizeof url, "tcp://%s", argv[++i]), o.init_method = url;
    else if (!strcmp(argv[i], "--expect-backend") && i + 1 < argc) expect = argv[++i];
    else if (!strcmp(argv[i], "--large")) large = 1;
    else {
      fprintf(stderr, "dist_worker: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  dt_group *g;
  if (dt_group_init(&o, &g) != DT_OK) {
    fprintf(stderr, "dist_worker: %s\n", dt_last_error());
    return 1;
  }
  dc_result res = {0};
  dc_run_all(g, large, &res);
  int rank = dt_group_rank(g);
  const char *backend = dt_group_backend(g);
  int bad = res.failed || (expect && strcmp(expect, backend) != 0);
  printf("rank %d of %d (local %d of %d) backend %s: %d collectives, %d failed%s%s\n", rank, dt_group_size(g),
         dt_group_local_rank(g), dt_group_local_size(g), backend, res.run, res.failed, res.failed ? ": " : "",
         res.failed ? res.first_failure : "");
  if (expect && strcmp(expect, backend) != 0) printf("rank %d: expected backend %s\n", rank, expect);
  dt_group_destroy(g);
  return bad ? 1 : 0;
}

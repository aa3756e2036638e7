/* Evaluates weights on a split as `dtrain eval` does and prints the figures at full precision (eval rounds them). */
#include <stdio.h>
#include <string.h>

#include "dtrain/dtrain.h"

/* Prints "samples N", "loss X" and "<metric> X" for every metric of the task (the names of summary.json's
 * test_<metric> keys), one per line, %.9g. */
int main(int argc, char **argv) {
  if (argc != 4 || (strcmp(argv[3], "train") != 0 && strcmp(argv[3], "test") != 0)) {
    fprintf(stderr, "usage: %s WEIGHTS DATA train|test\n", argv[0]);
    return 2;
  }
  dt_eval_config cfg;
  dt_eval_config_default(&cfg);
  cfg.weights = argv[1];
  cfg.data = argv[2];
  cfg.split = strcmp(argv[3], "train") == 0 ? DT_SPLIT_TRAIN : DT_SPLIT_TEST;
  cfg.threads = 1;
  dt_eval_result r;
  if (dt_eval_run(&cfg, &r) != DT_OK) {
    fprintf(stderr, "eval_metrics: %s\n", dt_last_error());
    return 1;
  }
  printf("samples %lld\nloss %.9g\n", (long long)r.samples, r.loss);
  for (int i = 0; i < r.metrics.n_eval; i++) printf("%s %.9g\n", r.metrics.eval[i].name, r.metric[i]);
  return 0;
}

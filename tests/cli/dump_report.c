/* Writes a run report with realistic synthetic figures (10 epochs, 4 ranks) to a path, for the browser test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtrain/dtrain.h"
#include "io/report.h"

#define EPOCHS 10
#define WORLD 4
#define POINTS 120

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s REPORT.html\n", argv[0]);
    return 2;
  }
  dt_train_config cfg;
  dt_train_config_default(&cfg);
  cfg.epochs = EPOCHS;
  cfg.strategy = DT_STRATEGY_DDP;
  cfg.lr = 0.05f;
  cfg.optim.momentum = 0.9f;
  char config[4096];
  if (dt_train_config_json(&cfg, config, sizeof config) != DT_OK) {
    fprintf(stderr, "dump_report: %s\n", dt_last_error());
    return 1;
  }

  /* Curves shaped like fashioncnn's: loss falls fast then flattens, val lags train. */
  dt_epoch_metrics ep[EPOCHS] = {0};
  for (int e = 0; e < EPOCHS; e++) {
    double t = e + 1;
    dt_epoch_metrics *m = &ep[e];
    m->epoch = e + 1;
    m->step = (int64_t)(e + 1) * 235;
    m->lr = 0.05f * (float)(0.5 * (1 + cos(M_PI * e / EPOCHS)));
    m->train_loss = 0.22 + 0.45 / t;
    m->test_loss = 0.27 + 0.33 / t + 0.004 * t;
    m->train_metric[0] = 0.93 - 0.12 / t;
    m->test_metric[0] = 0.91 - 0.10 / t;
    m->test_metric[1] = 0.998 - 0.01 / t;
    m->epoch_seconds = 11.5 + 0.3 * sin(t);
    m->train_samples = 60000;
    m->train_samples_per_s = m->train_samples / m->epoch_seconds;
    m->data_wait_seconds = 0.4;
    m->comm_seconds = 1.1;
    m->compute_seconds = m->epoch_seconds - 1.5;
    m->eval_seconds = 0.9;
    m->infer_samples_per_s = 10000 / 0.9;
  }

  /* A sample every second of training, with a slow start (warm-up) and jitter. */
  dt_report_point tp[POINTS];
  for (int i = 0; i < POINTS; i++) {
    double t = i + 1.0;
    tp[i].t_s = t;
    tp[i].samples_per_s = 5200 * (1 - exp(-t / 3)) + 180 * sin(1.7 * t) + 90 * cos(0.31 * t);
  }

  dt_report_rank ranks[WORLD];
  for (int r = 0; r < WORLD; r++) {
    ranks[r].compute_s = 98.0 + 2.5 * r;
    ranks[r].data_s = 3.0 + 1.5 * (r % 2);
    ranks[r].comm_s = 14.0 - 2.5 * r;
  }

  const char *summary =
      "fashioncnn  10 epochs  ddp x4 (shm)\n"
      "  test loss 0.3370   top-1 90.00%   top-5 99.70%\n"
      "  train 5217 samples/s   infer 11111 samples/s   wall 121.4 s\n"
      "  time: compute 84.1%   data wait 3.2%   comm 9.4% (61% hidden)\n";

  dt_report rep = {"fashioncnn on fashion-mnist", config, ep, EPOCHS, tp, POINTS, ranks, WORLD, summary, NULL, NULL};
  if (dt_report_write(argv[1], &rep) != DT_OK) {
    fprintf(stderr, "dump_report: %s\n", dt_last_error());
    return 1;
  }
  return 0;
}

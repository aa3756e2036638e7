/* The training loop: epochs over a dataset with metrics, progress and a summary. */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/status.h"

/* (filled by the trainer work: dt_train_config, dt_train_run, dt_eval_run) */

#endif

/* dtrain: data-parallel neural-network training in C. One include for the whole API. */
#ifndef DTRAIN_DTRAIN_H
#define DTRAIN_DTRAIN_H

#include "dtrain/checkpoint.h"
#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/dist.h"
#include "dtrain/loss.h"
#include "dtrain/model.h"
#include "dtrain/model_ctx.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/snapshot.h"
#include "dtrain/status.h"
#include "dtrain/task.h"
#include "dtrain/tensor.h"
#include "dtrain/trace.h"
#include "dtrain/train.h"

#define DTRAIN_VERSION "0.1.0"

#endif

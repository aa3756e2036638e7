/* Loss functions and accuracy counts over raw f32 outputs (the tensor kernels' public face). */
#ifndef DTRAIN_LOSS_H
#define DTRAIN_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mean cross entropy of logits (batch, classes) against labels, with label
 * smoothing eps (torch.nn.CrossEntropyLoss semantics). dlogits (batch, classes)
 * receives the gradient of the mean loss if non-NULL. A label outside
 * [0, classes) is DT_INVALID_ARGUMENT naming the sample. */
dt_status dt_loss_cross_entropy(const float *logits, const int32_t *labels, int batch, int classes, float eps,
                                float *loss, float *dlogits);
/* Counts samples whose label is the top-1 logit and among the top-k. */
void dt_topk_correct(const float *logits, const int32_t *labels, int batch, int classes, int k, int64_t *top1,
                     int64_t *topk);

/* torch.nn.BCEWithLogitsLoss(pos_weight) over logits (batch, k) against 0/1
 * targets (batch, k), mean over every element; pos_weight (k) or NULL. */
dt_status dt_loss_bce_with_logits(const float *logits, const float *targets, int batch, int k, const float *pos_weight,
                                  float *loss, float *dlogits);
/* torch.nn.MSELoss / L1Loss over (batch, k), mean over every element. */
dt_status dt_loss_mse(const float *out, const float *targets, int batch, int k, float *loss, float *dout);
dt_status dt_loss_l1(const float *out, const float *targets, int batch, int k, float *loss, float *dout);

#ifdef __cplusplus
}
#endif
#endif

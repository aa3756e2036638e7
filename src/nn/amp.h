/* Autocast for the layers that run in low precision (Linear, Conv2d, attention): their operands rounded to the
 * bf16/fp16 grid, their results rounded, the f32 accumulation between; a no-op when the io's amp is off. */
#ifndef DT_NN_AMP_H
#define DT_NN_AMP_H

#include "nn/layer.h"
#include "tensor/kernels.h"

/* The layer's weights as the GEMMs read them: rounded under amp (the context's copy; the master block where the
 * native GEMMs round them, io->gemm_rounds), else the master f32. */
static inline const float *dt_amp_weights(const dt_layer_io *io) {
  return io->amp != DT_AMP_OFF ? io->lowp_params : io->params;
}
/* x (n) as an operand: rounded into scratch block `slot` (0: the input, 1: the incoming gradient) under amp; the
 * input as it is where the native GEMMs round it (io->gemm_rounds). */
static inline const float *dt_amp_operand(const dt_layer_io *io, int slot, const float *x, size_t n) {
  if (io->amp == DT_AMP_OFF || !x || (slot == 0 && io->gemm_rounds)) return x;
  dt_lowp_round_copy(io->amp, io->amp_scratch[slot], x, n);
  return io->amp_scratch[slot];
}
/* A result y (n) the layer wrote, rounded in place (autocast's low-precision output). */
static inline void dt_amp_result(const dt_layer_io *io, float *y, size_t n) {
  if (io->amp != DT_AMP_OFF && y) dt_lowp_round(io->amp, y, n);
}

#endif

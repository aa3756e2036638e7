/* Direct 3x3 convolution, stride 1, padding 1 (tensor-internal; conv2d.c dispatches to it).
 *
 * The CIFAR ResNets' convolutions have 16 to 64 channels: as im2col + GEMM their GEMMs have M = 16..64 rows,
 * which OpenBLAS runs at a fraction of its speed on large shapes. Here each sample's input is copied once into
 * zero-bordered planes and a register block of 2 output channels x 48 outputs (6 vectors of 8 along the rows)
 * is accumulated over every input channel and tap, so nothing is unfolded and the weights are read as broadcasts. */
#ifndef DT_TENSOR_CONV3X3_H
#define DT_TENSOR_CONV3X3_H

#include <stddef.h>

#include "tensor/kernels.h"

/* Whether the direct forward applies: a 3x3 kernel, stride 1, padding 1, at least 8 columns, and few enough
 * input channels that a block's input stays in L1 (conv3x3.c says why). */
int dt_conv3x3_forward_applies(const dt_conv2d_geom *g);
/* Whether the direct weight gradient applies: 3x3, stride 1, padding 1, a width of 8 or more. */
int dt_conv3x3_weights_applies(const dt_conv2d_geom *g);

/* Floats of scratch the forward needs (packed weights + a padded sample per thread). */
size_t dt_conv3x3_forward_floats(const dt_conv2d_geom *g);
/* Floats of scratch the weight gradient needs (padded samples + a partial dw per thread). */
size_t dt_conv3x3_weights_floats(const dt_conv2d_geom *g);

/* out (N, OC, H, W) = conv(inp (N, C, H, W), w (OC, C, 3, 3)) + b (OC) [b may be NULL] */
void dt_conv3x3_forward(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                        const float *b);
/* dw (OC, C, 3, 3) += the weight gradient from dout (N, OC, H, W) and the forward's inp (N, C, H, W). */
void dt_conv3x3_weights(const dt_conv2d_geom *g, float *dw, float *scratch, const float *dout, const float *inp);

#endif

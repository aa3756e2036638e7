/* Winograd convolution, F(2x2, 3x3) or F(4x4, 3x3), stride 1, padding 0, 1 or 2 (tensor-internal; conv2d.c
 * dispatches to it).
 *
 * Each m x m block of outputs comes from an (m+2) x (m+2) input tile: transformed (B^T d B), multiplied
 * element-wise by the transformed 3x3 kernel (G w G^T) and summed over input channels, transformed back
 * (A^T p A). That is 16 products per 4 outputs and input channel (m = 2) or 36 per 16 (m = 4) where the direct
 * kernel does 9 per output, the sums over channels being (m+2)^2 small GEMMs. The weight gradient is the adjoint
 * of the same algorithm: the transformed inputs times the transformed output gradients (A dy A^T), summed over
 * tiles, back through G^T . G. The products run on vectors of 8 channels, so both channel counts must be
 * multiples of 8. (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016.) */
#ifndef DT_TENSOR_CONV_WINO_H
#define DT_TENSOR_CONV_WINO_H

#include <stddef.h>

#include "tensor/kernels.h"

/* Whether it applies: a 3x3 kernel, stride 1, padding 0 to 2, input and output channels multiples of 8, one
 * transformed kernel matrix (C x OC floats) within 256 KiB; in every amp mode (its f32 arithmetic on operands
 * already rounded is autocast's contract up to f32 rounding). */
int dt_wino_applies(const dt_conv2d_geom *g);

/* Floats of scratch the forward and the weight gradient need. */
size_t dt_wino_forward_floats(const dt_conv2d_geom *g);
size_t dt_wino_weights_floats(const dt_conv2d_geom *g);

/* out (N, OC, OH, OW) = conv(inp (N, C, H, W), w (OC, C, 3, 3)) + b (OC) [b may be NULL] */
void dt_wino_forward(const dt_conv2d_geom *g, float *out, float *scratch, const float *inp, const float *w,
                     const float *b);
/* dw (OC, C, 3, 3) += the weight gradient from dout (N, OC, OH, OW) and the forward's inp (N, C, H, W). */
void dt_wino_weights(const dt_conv2d_geom *g, float *dw, float *scratch, const float *dout, const float *inp);
/* Tests: 0 runs the 8-wide products where AVX-512 would take 16-wide ones (the same bits), 1 (the default) not. */
void dt_wino_set_wide(int on);

#endif

/* Direct 3x3 convolution, stride 1, padding 1 (tensor-internal; conv2d.c dispatches to it).
 *
 * The CIFAR ResNets' convolutions have 16 to 64 channels: as im2col + GEMM their GEMMs have M = 16..64 rows,
 * which OpenBLAS runs at a fraction of its speed on large shapes. Here each sample's input is copied once into
 * zero-bordered planes and a register block of 2 output channels (4 with AVX-512VL's 32 vector registers) x 6
 * vectors along the rows (of 8; of 16 with AVX-512 on rows of 16 and more) is accumulated over every input channel
 * and tap, so nothing is unfolded and the weights are read as broadcasts. */
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

/* The weight gradient from an output gradient made where it is consumed, never whole in memory (conv_bn_pool.c):
 * make(user, dst, ds, n0, gn, oc0, oc_n) writes the (H, W) planes of channels oc0 .. oc0+oc_n-1 of samples
 * n0 .. n0+gn-1, sample s's first at dst + s * ds; it runs on the weights' threads, a call per group of samples and
 * block of channels, every (sample, channel) once. `made` holds dt_conv3x3_made_floats(g) floats for them. The
 * same sums in the same order as dt_conv3x3_weights on the made values. */
typedef void (*dt_conv3x3_make_fn)(void *user, float *dst, size_t ds, int n0, int gn, int oc0, int oc_n);
size_t dt_conv3x3_made_floats(const dt_conv2d_geom *g);
void dt_conv3x3_weights_made(const dt_conv2d_geom *g, float *dw, float *scratch, float *made, const float *inp,
                             dt_conv3x3_make_fn make, void *user);

/* 0: the forward in vectors of 8 even where AVX-512 would take 16 (for the tests: both give the same bits). */
void dt_conv3x3_set_wide(int on);

#endif

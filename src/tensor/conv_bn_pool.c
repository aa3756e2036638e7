/* Conv2d(3x3, stride 1, padding 1) -> BatchNorm2d -> ReLU -> MaxPool2d(2) backward where nobody wants the
 * convolution's input gradient: a network's first layer (fashioncnn's layer1).
 *
 * Layer by layer, the BN-pool backward writes the BN's input gradient, which is the convolution's output gradient
 * (fashioncnn: 6.4 MB a batch of 64), and the convolution reads it back twice, for the bias and for the weights.
 * Here it is made a block of planes at a time (dt_bn_pool_plane_grad, DB channels of a group of samples) into a
 * buffer that stays in cache, where the direct weight gradient (dt_conv3x3_weights_made) and the bias gradient's
 * plane sums consume it. The values, and the order they are summed in, are those of the layers one by one. */
#include "tensor/conv3x3.h"
#include "tensor/kernels.h"
#include "tensor/v8.h"

typedef struct made_grad {
  const dt_bn_pool_saved *s;
  const float *dout;  /* the pool's output gradient */
  const float *terms; /* (C, 3): dt_bn_pool_channel_terms */
  double *sums;       /* (N, C): each plane's sum for the bias gradient, or NULL */
} made_grad;

static void make_planes(void *user, float *dst, size_t ds, int n0, int gn, int oc0, int oc_n) {
  const made_grad *m = user;
  const size_t P = (size_t)m->s->H * m->s->W;
  for (int s = 0; s < gn; s++)
    for (int o = 0; o < oc_n; o++) {
      const int n = n0 + s, c = oc0 + o;
      float *dx = dst + s * ds + o * P;
      dt_bn_pool_plane_grad(m->s, m->dout, n, c, m->terms + 3 * c, dx);
      if (m->sums) m->sums[(size_t)n * m->s->C + c] = sum_floats(dx, (int)P);
    }
}

/* The work's parts, each a whole number of cache lines: terms (C x 3 floats), sums (N x C doubles), made. */
static size_t lines(size_t floats) { return (floats + 15) / 16 * 16; }

size_t dt_conv_bn_pool_work_floats(const dt_conv2d_geom *g) {
  return lines((size_t)g->OC * 3) + lines((size_t)g->N * g->OC * 2) + dt_conv3x3_made_floats(g);
}

void dt_conv_bn_pool_backward(const dt_conv2d_geom *g, const dt_bn_pool_saved *s, const float *dout, float *dw,
                              float *db, float *dgamma, float *dbeta, float *scratch, float *work, const float *inp) {
  float *terms = work;
  double *sums = (double *)(work + lines((size_t)g->OC * 3));
  float *made = work + lines((size_t)g->OC * 3) + lines((size_t)g->N * g->OC * 2);
#pragma omp parallel for schedule(static)
  for (int c = 0; c < s->C; c++) dt_bn_pool_channel_terms(s, dout, c, dgamma, dbeta, terms + 3 * c);
  made_grad m = {s, dout, terms, db ? sums : NULL};
  dt_conv3x3_weights_made(g, dw, scratch, made, inp, make_planes, &m);
  if (!db) return;
  for (int oc = 0; oc < g->OC; oc++) { /* in sample order, as dt_conv2d_backward sums the planes */
    double sum = 0.0;
    for (int n = 0; n < g->N; n++) sum += sums[(size_t)n * g->OC + oc];
    db[oc] += (float)sum;
  }
}

/* Pooling layers: MaxPool2d (argmax kept for backward), AvgPool2d (count_include_pad), floor mode as torch;
 * AdaptiveAvgPool2d (output size given, any input). */
#include "core/impl.h"
#include "nn/fusion.h"
#include "nn/layer.h"
#include "tensor/kernels.h"

typedef struct pool_priv {
  int kernel, stride, padding;
} pool_priv;

/* Shared by max and avg pooling: (C, H, W) -> (C, OH, OW). */
static dt_status pool_infer_shape(dt_layer *l, const char *kind) {
  const pool_priv *p = l->priv;
  char s[96];
  if (l->in_ndim != 3)
    return dt_error(DT_SHAPE_MISMATCH, "%s: %s expects an input of shape (C, H, W), got %s", l->name, kind,
                    dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  if (p->padding > p->kernel / 2)
    return dt_error(DT_INVALID_ARGUMENT, "%s: %s padding %d exceeds half the kernel %d", l->name, kind, p->padding,
                    p->kernel);
  int64_t H = l->in_shape[1], W = l->in_shape[2];
  if (H + 2 * p->padding < p->kernel || W + 2 * p->padding < p->kernel)
    return dt_error(DT_SHAPE_MISMATCH, "%s: %s kernel %d does not fit the input %s", l->name, kind, p->kernel,
                    dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  l->out_ndim = 3;
  l->out_shape[0] = l->in_shape[0];
  l->out_shape[1] = (H + 2 * p->padding - p->kernel) / p->stride + 1;
  l->out_shape[2] = (W + 2 * p->padding - p->kernel) / p->stride + 1;
  return DT_OK;
}

static dt_status pool_geom(const dt_layer *l, int N, dt_pool2d_geom *g) {
  const pool_priv *p = l->priv;
  return dt_pool2d_geom_init(g, N, (int)l->in_shape[0], (int)l->in_shape[1], (int)l->in_shape[2], p->kernel,
                             p->stride, p->padding);
}

static dt_status maxpool_infer(dt_layer *l) { return pool_infer_shape(l, "MaxPool2d"); }

/* Workspace: argmax (batch, C, OH, OW) as int32. */
static size_t maxpool_ws_bytes(const dt_layer *l, int max_batch) {
  return l->out_numel * (size_t)max_batch * sizeof(int32_t);
}

static dt_status maxpool_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  dt_pool2d_geom g;
  DT_CHECK(pool_geom(l, io->batch, &g));
  dt_maxpool2d_forward(&g, out, io->ws, in);
  return DT_OK;
}

static void maxpool_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                             const float *dout, float *dinp) {
  dt_pool2d_geom g;
  if (!dinp || pool_geom(l, io->batch, &g) != DT_OK) return;
  dt_maxpool2d_backward(&g, dinp, dout, io->ws);
}

const dt_layer_ops dt_maxpool2d_ops = {.kind = "MaxPool2d",
                                       .infer = maxpool_infer,
                                       .ws_bytes = maxpool_ws_bytes,
                                       .forward = maxpool_forward,
                                       .backward = maxpool_backward};

int dt_maxpool2d_is_2x2(const dt_layer *l) {
  const pool_priv *p = l->priv;
  return l->ops == &dt_maxpool2d_ops && p->kernel == 2 && p->stride == 2 && p->padding == 0;
}

dt_status dt_model_add_maxpool2d(dt_model *m, const char *name, int kernel, int stride, int padding) {
  if (kernel < 1 || stride < 0 || padding < 0)
    return dt_error(DT_INVALID_ARGUMENT, "%s: MaxPool2d kernel %d, stride %d, padding %d: expected >= 1, >= 0, >= 0",
                    name ? name : "?", kernel, stride, padding);
  pool_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "MaxPool2d", (void **)&p));
  *p = (pool_priv){kernel, stride ? stride : kernel, padding}; /* stride 0: torch's default, the kernel */
  return dt_model_add_layer(m, &dt_maxpool2d_ops, name, p);
}

static dt_status avgpool_infer(dt_layer *l) { return pool_infer_shape(l, "AvgPool2d"); }

static dt_status avgpool_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  dt_pool2d_geom g;
  DT_CHECK(pool_geom(l, io->batch, &g));
  dt_avgpool2d_forward(&g, out, in);
  return DT_OK;
}

static void avgpool_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                             const float *dout, float *dinp) {
  dt_pool2d_geom g;
  if (!dinp || pool_geom(l, io->batch, &g) != DT_OK) return;
  dt_avgpool2d_backward(&g, dinp, dout);
}

const dt_layer_ops dt_avgpool2d_ops = {
    .kind = "AvgPool2d", .infer = avgpool_infer, .forward = avgpool_forward, .backward = avgpool_backward};

dt_status dt_model_add_avgpool2d(dt_model *m, const char *name, int kernel, int stride, int padding) {
  if (kernel < 1 || stride < 0 || padding < 0)
    return dt_error(DT_INVALID_ARGUMENT, "%s: AvgPool2d kernel %d, stride %d, padding %d: expected >= 1, >= 0, >= 0",
                    name ? name : "?", kernel, stride, padding);
  pool_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "AvgPool2d", (void **)&p));
  *p = (pool_priv){kernel, stride ? stride : kernel, padding};
  return dt_model_add_layer(m, &dt_avgpool2d_ops, name, p);
}

/* ---- AdaptiveAvgPool2d((size, size)): (C, H, W) -> (C, size, size), any H, W >= 1 ---- */

typedef struct adaptive_priv {
  int size;
} adaptive_priv;

static dt_status adaptive_infer(dt_layer *l) {
  const adaptive_priv *p = l->priv;
  char s[96];
  if (l->in_ndim != 3)
    return dt_error(DT_SHAPE_MISMATCH, "%s: AdaptiveAvgPool2d expects an input of shape (C, H, W), got %s", l->name,
                    dt_shape_str(l->in_ndim, l->in_shape, s, sizeof s));
  l->out_ndim = 3;
  l->out_shape[0] = l->in_shape[0];
  l->out_shape[1] = l->out_shape[2] = p->size;
  return DT_OK;
}

static dt_status adaptive_forward(const dt_layer *l, const dt_layer_io *io, const float *in, float *out) {
  const adaptive_priv *p = l->priv;
  dt_adaptive_avgpool2d_forward(out, in, io->batch * (int)l->in_shape[0], (int)l->in_shape[1], (int)l->in_shape[2],
                                p->size, p->size);
  return DT_OK;
}

static void adaptive_backward(const dt_layer *l, const dt_layer_io *io, const float *in, const float *out,
                              const float *dout, float *dinp) {
  const adaptive_priv *p = l->priv;
  if (dinp)
    dt_adaptive_avgpool2d_backward(dinp, dout, io->batch * (int)l->in_shape[0], (int)l->in_shape[1],
                                   (int)l->in_shape[2], p->size, p->size);
}

const dt_layer_ops dt_adaptive_avgpool2d_ops = {.kind = "AdaptiveAvgPool2d",
                                                .infer = adaptive_infer,
                                                .forward = adaptive_forward,
                                                .backward = adaptive_backward};

dt_status dt_model_add_adaptive_avgpool2d(dt_model *m, const char *name, int output_size) {
  if (output_size < 1)
    return dt_error(DT_INVALID_ARGUMENT, "%s: AdaptiveAvgPool2d output size %d: expected >= 1", name ? name : "?",
                    output_size);
  adaptive_priv *p = NULL;
  DT_CHECK(dt_layer_priv_new(sizeof *p, "AdaptiveAvgPool2d", (void **)&p));
  p->size = output_size;
  return dt_model_add_layer(m, &dt_adaptive_avgpool2d_ops, name, p);
}

/* Training steps of a zoo model on random images (no data pipeline): images/s, and with a trace file the
 * per-layer spans that bench/resnet_profile.py sorts by layer kind.
 *
 *   resnet_steps [--amp bf16|fp16] [--width W] MODEL BATCH SIDE STEPS [TRACE.json]
 *
 * A step is what the trainer does: forward, cross-entropy, zero_grad, backward, SGD (momentum 0.9) update.
 * One warm-up step is not counted. Prints one line per conv/linear layer with its forward FLOPs
 * ("flops <layer> <kind> <forward FLOPs> <backward FLOPs>"; 2 per multiply-add; backward computes the
 * weight gradient, and the input gradient except for the first layer), then "step_s" of every step and
 * "images_per_s" over all of them. Threads: DT_NUM_THREADS or all cores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/dtrain.h"
#include "dtrain/trace.h"
#include "nn/layer.h"

#define TOOL_NAME "resnet_steps"
#include "tool_try.h"

/* Multiply-adds x 2 of each Conv2d and Linear for a batch. */
static void print_flops(const dt_model *m, int batch) {
  int first = 1;
  for (int i = 0; i < dt_model_num_layers(m); i++) {
    const dt_layer *l = dt_model_layer(m, i);
    double fwd;
    if (strcmp(l->ops->kind, "Conv2d") == 0) /* OC*OH*OW outputs, each C*K*K multiply-adds */
      fwd = 2.0 * batch * (double)l->out_numel * (double)(l->t[0].numel / (size_t)l->t[0].shape[0]);
    else if (strcmp(l->ops->kind, "Linear") == 0)
      fwd = 2.0 * batch * (double)l->t[0].numel;
    else
      continue;
    printf("flops %s %s %.0f %.0f\n", l->name, l->ops->kind, fwd, first ? fwd : 2 * fwd);
    first = 0;
  }
}

int main(int argc, char **argv) {
  dt_amp amp = DT_AMP_OFF;
  if (argc > 2 && strcmp(argv[1], "--amp") == 0) { /* autocast as --amp (DT_AMP_KERNELS picks the path) */
    TRY("--amp", dt_amp_parse(argv[2], &amp));
    argv += 2, argc -= 2;
  }
  int width = 0;
  if (argc > 2 && strcmp(argv[1], "--width") == 0) { /* as dtrain train --width */
    width = atoi(argv[2]);
    argv += 2, argc -= 2;
  }
  if (argc < 5 || argc > 6 || (argc == 6 && argv[5][0] == '-')) { /* flags first: a trailing one is misplaced */
    fprintf(stderr, "usage: resnet_steps [--amp bf16|fp16] [--width W] MODEL BATCH SIDE STEPS [TRACE.json]\n");
    return 2;
  }
  const char *model = argv[1];
  const int batch = atoi(argv[2]), side = atoi(argv[3]), steps = atoi(argv[4]), classes = 10;
  const char *trace = argc > 5 ? argv[5] : NULL;
  if (batch < 1 || side < 1 || steps < 1) return fprintf(stderr, "resnet_steps: BATCH, SIDE, STEPS >= 1\n"), 2;
  const dt_zoo_config cfg = {.ndim = 3, .input_shape = {3, side, side}, .outputs = classes, .dropout = -1.0f,
                             .width = width};
  dt_model *m = NULL;
  TRY("zoo", dt_model_zoo_new(model, &cfg, &m));
  TRY("build", dt_model_build(m, batch, 1));
  if (amp != DT_AMP_OFF) TRY("amp", dt_model_ctx_set_amp(m, dt_model_default_ctx(m), amp));
  const size_t n = (size_t)batch * 3 * side * side;
  float *x = malloc(n * sizeof(float)), *dlogits = malloc((size_t)batch * classes * sizeof(float));
  int32_t *labels = malloc((size_t)batch * sizeof(int32_t));
  if (!x || !dlogits || !labels) return fprintf(stderr, "resnet_steps: out of memory\n"), 1;
  dt_rng r;
  dt_rng_init(&r, 1, 2);
  for (size_t i = 0; i < n; i++) x[i] = dt_rng_normal(&r);
  for (int i = 0; i < batch; i++) labels[i] = (int32_t)dt_rng_below(&r, classes);
  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_SGD, &oc);
  oc.momentum = 0.9f;
  size_t np;
  float *params = dt_model_params(m, &np);
  dt_optim *opt = NULL;
  TRY("optimizer", dt_optim_new(&oc, np, &opt));
  print_flops(m, batch);
  double total = 0;
  for (int s = 0; s <= steps; s++) {
    if (s == 1 && trace) TRY("trace", dt_trace_enable(0)); /* the warm-up step is not traced */
    const double t0 = dt_time_now();
    const float *y;
    float loss;
    TRY("forward", dt_model_forward(m, x, batch, &y));
    TRY("loss", dt_loss_cross_entropy(y, labels, batch, classes, 0.0f, &loss, dlogits));
    dt_model_zero_grad_deferred(m); /* as the trainer */
    TRY("backward", dt_model_backward(m, dlogits));
    TRY("step", dt_optim_step(opt, params, dt_model_grads(m, NULL), 0.01f));
    const double dt = dt_time_now() - t0;
    if (s > 0) {
      printf("step_s %.4f loss %.4f\n", dt, loss);
      total += dt;
    }
  }
  printf("images_per_s %.1f (%s, batch %d, 3x%dx%d, %d steps)\n", steps * batch / total, model, batch, side, side,
         steps);
  if (trace) {
    char *json = NULL;
    size_t len = 0;
    TRY("trace", dt_trace_serialize(&json, &len));
    FILE *f = fopen(trace, "w");
    if (!f || fprintf(f, "[\n%s\n]\n", json) < 0 || fclose(f) != 0) return fprintf(stderr, "cannot write %s\n", trace), 1;
    dt_free(json);
  }
  dt_optim_free(opt);
  dt_model_free(m);
  free(x);
  free(dlogits);
  free(labels);
  return 0;
}

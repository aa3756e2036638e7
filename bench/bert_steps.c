/* Training or inference steps of a bert preset on random token batches (no tokenizer, no data pipeline):
 * sequences/s, and with a trace file the per-layer spans (bench/bert_vs_torch.py reads both).
 *
 *   bert_steps MODEL BATCH SEQ_LEN STEPS train|infer [TRACE.json]
 *
 * Sample lengths are uniform in [SEQ_LEN/4, SEQ_LEN] (padding masked), vocabulary 30522, 2 classes, dropout 0.1.
 * A training step: forward, cross-entropy, zero_grad, backward, AdamW update. One warm-up step is not counted.
 * Prints "tokens" (the batch's, padding excluded), "gemm_flops" (a forward's multiply-adds x 2 in Linear layers
 * and attention: projections and both batched products; a backward does twice as many), "step_s" of every step
 * and "seq_per_s" over all. Threads: DT_NUM_THREADS or all cores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/dtrain.h"
#include "dtrain/trace.h"
#include "nn/layer.h"

#define TOOL_NAME "bert_steps"
#include "tool_try.h"

enum { VOCAB = 30522, CLASSES = 2 };

static void make_batch(int32_t *x, int32_t *labels, int B, int L) {
  dt_rng r;
  dt_rng_init(&r, 1, 2);
  for (int b = 0; b < B; b++) {
    const int len = L / 4 + (int)dt_rng_below(&r, (uint64_t)(L - L / 4 + 1));
    int32_t *ids = x + (size_t)b * 3 * L;
    for (int t = 0; t < L; t++) {
      ids[t] = t < len ? 1000 + (int32_t)dt_rng_below(&r, VOCAB - 1000) : 0;
      ids[L + t] = 0;
      ids[2 * L + t] = t < len;
    }
    labels[b] = (int32_t)dt_rng_below(&r, CLASSES);
  }
}

/* Forward GEMM FLOPs: Linear weights and the attention projections per token, and QK^T, PV per head over
 * each sample's n^2 pairs. */
static double gemm_flops(const dt_model *m, const int32_t *x, int B, int L, int64_t *tokens) {
  double sq = 0, weights = 0;
  *tokens = 0;
  for (int b = 0; b < B; b++) {
    int n = 0;
    while (n < L && x[(size_t)b * 3 * L + 2 * (size_t)L + (size_t)n]) n++;
    *tokens += n;
    sq += (double)n * n;
  }
  double attn = 0;
  for (int i = 0; i < dt_model_num_layers(m); i++) {
    const dt_layer *l = dt_model_layer(m, i);
    if (strcmp(l->ops->kind, "Linear") == 0 && l->in_ndim == 2) weights += (double)l->t[0].numel;
    if (strcmp(l->ops->kind, "SelfAttention") == 0) {
      weights += 3.0 * (double)l->t[0].numel;
      attn += 2.0 * (double)l->in_shape[1] * sq; /* QK^T and PV: H per pair each */
    }
  }
  return 2.0 * ((double)*tokens * weights + attn);
}

static int write_trace(const char *path) {
  char *json = NULL;
  size_t len = 0;
  TRY("trace", dt_trace_serialize(&json, &len));
  FILE *f = fopen(path, "w");
  if (!f || fprintf(f, "[\n%s\n]\n", json) < 0 || fclose(f) != 0) return fprintf(stderr, "cannot write %s\n", path), 1;
  dt_free(json);
  return 0;
}

int main(int argc, char **argv) {
  dt_amp amp = DT_AMP_OFF;
  if (argc > 2 && strcmp(argv[1], "--amp") == 0) { /* autocast as --amp (DT_AMP_KERNELS picks the path) */
    TRY("--amp", dt_amp_parse(argv[2], &amp));
    argv += 2, argc -= 2;
  }
  /* --amp goes first; a trace path that looks like a flag is a misplaced one, not a file to write */
  if (argc < 6 || argc > 7 || (argc == 7 && argv[6][0] == '-') || (strcmp(argv[5], "train") && strcmp(argv[5], "infer")))
    return fprintf(stderr, "usage: bert_steps [--amp bf16|fp16] MODEL BATCH SEQ_LEN STEPS train|infer [TRACE.json]\n"), 2;
  const int B = atoi(argv[2]), L = atoi(argv[3]), steps = atoi(argv[4]), train = strcmp(argv[5], "train") == 0;
  const char *trace = argc > 6 ? argv[6] : NULL;
  if (B < 1 || B > 4096 || L < 4 || steps < 1)
    return fprintf(stderr, "bert_steps: BATCH in 1..4096, SEQ_LEN >= 4, STEPS >= 1\n"), 2;
  const int64_t vocab = VOCAB;
  const dt_zoo_config cfg = {.ndim = 2, .input_shape = {3, L}, .outputs = CLASSES, .dropout = -1.0f,
                             .task = DT_TASK_CLASSIFICATION, .n_index = 1, .index_size = &vocab};
  dt_model *m = NULL;
  TRY("zoo", dt_model_zoo_new(argv[1], &cfg, &m));
  TRY("build", dt_model_build(m, B, 1));
  if (amp != DT_AMP_OFF) TRY("amp", dt_model_ctx_set_amp(m, dt_model_default_ctx(m), amp));
  int32_t *x = malloc((size_t)B * 3 * L * sizeof(int32_t)), labels[4096];
  float *dlogits = malloc((size_t)B * CLASSES * sizeof(float));
  if (!x || !dlogits) return fprintf(stderr, "bert_steps: out of memory\n"), 1;
  make_batch(x, labels, B, L);
  int64_t tokens;
  const double flops = gemm_flops(m, x, B, L, &tokens);
  printf("tokens %lld\ngemm_flops %.0f\n", (long long)tokens, flops);
  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_ADAMW, &oc);
  size_t np;
  float *params = dt_model_params(m, &np);
  dt_optim *opt = NULL;
  TRY("optimizer", dt_optim_new(&oc, np, &opt));
  dt_model_set_training(m, train);
  double total = 0;
  for (int s = 0; s <= steps; s++) {
    if (s == 1 && trace) TRY("trace", dt_trace_enable(0));
    const double t0 = dt_time_now();
    const float *y;
    float loss;
    TRY("forward", dt_model_forward(m, x, B, &y));
    TRY("loss", dt_loss_cross_entropy(y, labels, B, CLASSES, 0.0f, &loss, dlogits));
    if (train) {
      dt_model_zero_grad_deferred(m); /* as the trainer */
      TRY("backward", dt_model_backward(m, dlogits));
      TRY("step", dt_optim_step(opt, params, dt_model_grads(m, NULL), 2e-5f));
    }
    const double dt = dt_time_now() - t0;
    if (s > 0) printf("step_s %.4f loss %.4f\n", dt, loss), total += dt;
  }
  printf("seq_per_s %.2f (%s, %s, batch %d, length %d, %d steps)\n", steps * B / total, argv[1], argv[5], B, L, steps);
  if (trace && write_trace(trace)) return 1;
  dt_optim_free(opt);
  dt_model_free(m);
  free(x);
  free(dlogits);
  return 0;
}

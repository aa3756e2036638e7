/* Example: build a small model layer by layer and train it on Fashion-MNIST through libdtrain.
 *
 *   cc train_mlp.c $(pkg-config --cflags --libs dtrain) -o train_mlp && ./train_mlp
 */
#include <stdio.h>

#include <dtrain/dtrain.h>

/* Prints the failing call's status and detail; returns 1 for main. */
static int fail(const char *what, dt_status s) {
  fprintf(stderr, "train_mlp: %s: %s: %s\n", what, dt_status_message(s), dt_last_error());
  return 1;
}

#define TRY(what, call)                   \
  do {                                    \
    dt_status s_ = (call);                \
    if (s_ != DT_OK) return fail(what, s_); \
  } while (0)

int main(void) {
  enum { BATCH = 128, EPOCHS = 2, CLASSES = 10 };
  dt_dataset *train, *test;
  TRY("load train split", dt_dataset_load("fashion-mnist", DT_SPLIT_TRAIN, NULL, &train));
  TRY("load test split", dt_dataset_load("fashion-mnist", DT_SPLIT_TEST, NULL, &test));
  TRY("thread budget", dt_set_threads(0)); /* all cores */
  dt_keep_freed_memory(); /* oneDNN allocates its packing buffer on every GEMM: keep freed blocks for the next */

  /* (1, 28, 28) images -> flatten -> 784-256-10 with GELU and dropout */
  int64_t sample[3];
  dt_dataset_sample_shape(train, sample);
  dt_model *m;
  TRY("new model", dt_model_new(3, sample, &m));
  TRY("flatten", dt_model_add_flatten(m, "flatten"));
  TRY("fc1", dt_model_add_linear(m, "fc1", 256, 1));
  TRY("act", dt_model_add_activation(m, "act1", DT_GELU));
  TRY("dropout", dt_model_add_dropout(m, "drop", 0.1f));
  TRY("fc2", dt_model_add_linear(m, "fc2", CLASSES, 1));
  TRY("build", dt_model_build(m, BATCH, /*seed=*/1));
  dt_model_print_summary(m, stdout);

  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_ADAMW, &oc);
  dt_optim *opt;
  size_t n_params;
  float *params = dt_model_params(m, &n_params);
  float *grads = dt_model_grads(m, NULL);
  TRY("optimizer", dt_optim_new(&oc, n_params, &opt));

  dt_loader *loader;
  dt_loader_config lc = {.batch_size = BATCH, .shuffle = 1, .seed = 1};
  TRY("loader", dt_loader_new(train, &lc, &loader));
  dt_lr_schedule sched = {.kind = DT_SCHED_COSINE, .base_lr = 1e-3f,
                          .total_steps = EPOCHS * dt_loader_batches_per_epoch(loader)};
  TRY("schedule", dt_lr_schedule_check(&sched));

  static float dlogits[BATCH * CLASSES];
  int64_t step = 0;
  for (int epoch = 0; epoch < EPOCHS; epoch++) {
    dt_model_set_training(m, 1);
    TRY("start epoch", dt_loader_start_epoch(loader, epoch));
    double loss_sum = 0;
    int64_t seen = 0;
    for (;;) {
      dt_batch b;
      TRY("next batch", dt_loader_next(loader, &b));
      if (b.size == 0) break;
      const float *logits;
      float loss;
      dt_model_zero_grad(m);
      TRY("forward", dt_model_forward(m, b.x, b.size, &logits));
      TRY("loss", dt_loss_cross_entropy(logits, b.y, b.size, CLASSES, 0.0f, &loss, dlogits));
      TRY("backward", dt_model_backward(m, dlogits));
      TRY("step", dt_optim_step(opt, params, grads, dt_lr_at(&sched, step++)));
      loss_sum += (double)loss * b.size;
      seen += b.size;
    }

    /* Test accuracy in evaluation mode (dropout off), in batches. */
    dt_model_set_training(m, 0);
    int64_t correct = 0, top5 = 0, n_test = dt_dataset_size(test);
    static float x[BATCH * 28 * 28];
    static int32_t y[BATCH];
    int64_t idx[BATCH];
    for (int64_t i = 0; i < n_test; i += BATCH) {
      int n = (int)(n_test - i < BATCH ? n_test - i : BATCH);
      for (int j = 0; j < n; j++) idx[j] = i + j;
      dt_dataset_gather(test, idx, n, x, y);
      const float *logits;
      TRY("eval forward", dt_model_forward(m, x, n, &logits));
      int64_t c1 = 0, c5 = 0;
      dt_topk_correct(logits, y, n, CLASSES, 5, &c1, &c5);
      correct += c1;
      top5 += c5;
    }
    printf("epoch %d: train loss %.4f  test top-1 %.2f%%  top-5 %.2f%%\n", epoch + 1, loss_sum / (double)seen,
           100.0 * (double)correct / (double)n_test, 100.0 * (double)top5 / (double)n_test);
  }
  TRY("save", dt_model_save(m, "train_mlp.safetensors", NULL, 0));
  printf("weights written to train_mlp.safetensors\n");

  dt_loader_free(loader);
  dt_optim_free(opt);
  dt_model_free(m);
  dt_dataset_free(test);
  dt_dataset_free(train);
  return 0;
}

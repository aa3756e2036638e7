/* Parity helper: a small bert (2 layers, hidden 32, 4 heads, feed-forward 48, vocabulary 60, 12 positions,
 * 3 classes, no dropout) on a padded batch of 3 (a pair with token types 1, lengths 12, 7, 3), for
 * test_bert_torch.py: the built weights, the input, the training logits and loss, every gradient, and the
 * evaluation logits.
 *
 *   dump_bert OUT_PREFIX [CHECKPOINT]
 *   dump_bert OUT_PREFIX --amp bf16|fp16|off
 *
 * With CHECKPOINT (a Hugging Face directory or safetensors file), the same model is built, takes the
 * checkpoint's weights with --init-from's loader, and dumps only input and hf/logits (evaluation mode).
 * With --amp, the default dump runs under that autocast (test_amp_bert_torch.py).
 * Keys: init/<state_dict name>, input (3, 3, L: ids, token types, mask), labels, train/logits, train/loss,
 * grad/<parameter>, eval/logits. */
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "parity/dump_io.h"

#define TOOL_NAME "dump_bert"
#include "tool_try.h"

enum { BATCH = 3, L = 12, VOCAB = 60, CLASSES = 3 };

static void put_tensors(dt_model *m, const char *prefix, const float *base_or_null) {
  const float *g = base_or_null;
  for (int i = 0; i < dt_model_num_tensors(m); i++) {
    dt_tensor_info ti;
    if (dt_model_tensor_info(m, i, &ti) != DT_OK || !ti.trainable) continue;
    char key[256];
    int dims[DT_MAX_DIMS];
    for (int d = 0; d < ti.ndim; d++) dims[d] = (int)ti.shape[d];
    snprintf(key, sizeof key, "%s/%s", prefix, ti.name);
    dump_put(key, "f32", g ? g + ti.offset : dt_model_tensor_data(m, i), 4, ti.ndim, dims);
  }
}

/* ids in [1, VOCAB) on the first len[b] positions ([PAD] = 0 after), the second half of sample 0 of type 1. */
static void make_batch(int32_t *x, int32_t *labels) {
  static const int len[BATCH] = {L, 7, 3};
  dt_rng r;
  dt_rng_init(&r, 7, 1);
  for (int b = 0; b < BATCH; b++) {
    int32_t *ids = x + b * 3 * L, *types = ids + L, *mask = types + L;
    for (int t = 0; t < L; t++) {
      mask[t] = t < len[b];
      ids[t] = mask[t] ? 1 + (int32_t)dt_rng_below(&r, VOCAB - 1) : 0;
      types[t] = b == 0 && t >= L / 2;
    }
    labels[b] = (int32_t)dt_rng_below(&r, CLASSES);
  }
}

/* The checkpoint's weights through dt_model_init_from, then the evaluation logits of the batch. */
static int from_checkpoint(dt_model *m, const char *path) {
  int32_t x[BATCH * 3 * L], labels[BATCH];
  make_batch(x, labels);
  dt_init_report rep;
  TRY("init from", dt_model_init_from(m, path, &rep));
  if (rep.missing || rep.unexpected) {
    fprintf(stderr, "dump_bert: %d tensors missing (%s), %d unexpected (%s)\n", rep.missing, rep.missing_names,
            rep.unexpected, rep.unexpected_names);
    return 1;
  }
  const float *y;
  dt_model_set_training(m, 0);
  TRY("forward", dt_model_forward(m, x, BATCH, &y));
  PUTI("input", x, BATCH, 3, L);
  PUTF("hf/logits", y, BATCH, CLASSES);
  return 0;
}

int main(int argc, char **argv) {
  const int amp_arg = argc == 4 && strcmp(argv[2], "--amp") == 0;
  int rc = dump_open(argc == 3 || amp_arg ? 2 : argc, argv);
  if (rc) return rc;
  const int64_t vocab = VOCAB;
  const dt_zoo_config cfg = {.ndim = 2, .input_shape = {3, L}, .outputs = CLASSES, .dropout = 0.0f,
                             .task = DT_TASK_CLASSIFICATION, .n_index = 1, .index_size = &vocab, .layers = 2,
                             .hidden_size = 32, .heads = 4, .intermediate_size = 48};
  dt_model *m = NULL;
  TRY("zoo", dt_model_zoo_new("bert", &cfg, &m));
  TRY("build", dt_model_build(m, BATCH, 11));
  if (amp_arg) {
    dt_amp amp;
    TRY("amp", dt_amp_parse(argv[3], &amp));
    TRY("amp", dt_model_ctx_set_amp(m, dt_model_default_ctx(m), amp));
  }
  if (argc == 3) {
    rc = from_checkpoint(m, argv[2]);
    dt_model_free(m);
    return dump_close() || rc;
  }
  int32_t x[BATCH * 3 * L], labels[BATCH];
  float dlogits[BATCH * CLASSES], loss;
  make_batch(x, labels);
  put_tensors(m, "init", NULL);
  PUTI("input", x, BATCH, 3, L);
  PUTI("labels", labels, BATCH);
  const float *y;
  dt_model_set_training(m, 1);
  TRY("forward", dt_model_forward(m, x, BATCH, &y));
  TRY("loss", dt_loss_cross_entropy(y, labels, BATCH, CLASSES, 0.0f, &loss, dlogits));
  PUTF("train/logits", y, BATCH, CLASSES);
  PUTF("train/loss", &loss, 1);
  dt_model_zero_grad(m);
  TRY("backward", dt_model_backward(m, dlogits));
  put_tensors(m, "grad", dt_model_grads(m, NULL));
  dt_model_set_training(m, 0);
  TRY("eval forward", dt_model_forward(m, x, BATCH, &y));
  PUTF("eval/logits", y, BATCH, CLASSES);
  dt_model_free(m);
  return dump_close();
}

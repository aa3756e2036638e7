/* The packed layout of a batch of sequences: each sample's live positions (its attention mask's leading 1s) as
 * consecutive rows, so per-position layers compute on tokens only, never on padding. */
#include "core/impl.h"
#include "nn/layer.h"

dt_status dt_seq_layout_fill(dt_seq_layout *s, const int32_t *x, int batch, int rows, int L, int mask_row) {
  s->batch = batch;
  s->L = L;
  s->off[0] = 0;
  s->sq_off[0] = 0;
  for (int b = 0; b < batch; b++) {
    const int32_t *mask = x + ((size_t)b * (size_t)rows + (size_t)mask_row) * (size_t)L;
    int n = 0;
    while (n < L && mask[n] == 1) n++;
    for (int t = n; t < L; t++)
      if (mask[t] != 0)
        return dt_error(DT_INVALID_ARGUMENT, "sample %d: attention mask value %d at position %d after %d leading 1s: "
                        "expected 1s for the tokens, then 0s for the padding", b, mask[t], t, n);
    if (n == 0) return dt_error(DT_INVALID_ARGUMENT, "sample %d: its attention mask has no token (a 1 first)", b);
    s->off[b + 1] = s->off[b] + n;
    s->sq_off[b + 1] = s->sq_off[b] + (int64_t)n * n;
  }
  s->tokens = s->off[batch];
  return DT_OK;
}

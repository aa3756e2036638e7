/* Embedding kernels: row gathers and their scatter-add backward (torch.nn.Embedding's forward and dense backward). */
#include <string.h>

#include "tensor/kernels.h"

int dt_index_check(const int32_t *idx, size_t stride, int B, int64_t rows) {
  for (int b = 0; b < B; b++)
    if (idx[(size_t)b * stride] < 0 || idx[(size_t)b * stride] >= rows) return b;
  return -1;
}

void dt_embedding_gather(float *out, size_t out_stride, const float *table, int width, const int32_t *idx,
                         size_t stride, int B) {
  for (int b = 0; b < B; b++)
    memcpy(out + (size_t)b * out_stride, table + (size_t)idx[(size_t)b * stride] * (size_t)width,
           (size_t)width * sizeof(float));
}

/* Serial: a batch's rows repeat (popular items), and a fixed order keeps the sums' bits. */
void dt_embedding_scatter_add(float *dtable, int width, const float *dout, size_t dout_stride, const int32_t *idx,
                              size_t stride, int B) {
  for (int b = 0; b < B; b++) {
    float *restrict d = dtable + (size_t)idx[(size_t)b * stride] * (size_t)width;
    const float *restrict g = dout + (size_t)b * dout_stride;
#pragma omp simd
    for (int j = 0; j < width; j++) d[j] += g[j];
  }
}

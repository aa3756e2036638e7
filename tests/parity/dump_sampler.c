/* Parity helper: every rank's dt_dist_sampler indices for one configuration, for test_sampler_torch.py.
 *
 *   dump_sampler N REPLICAS SEED EPOCH SHUFFLE DROP_LAST OUT
 *
 * OUT (int64 little-endian): for rank 0..REPLICAS-1: num_samples, num_real,
 * then num_samples indices. SEED is an unsigned 64-bit decimal. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtrain/dtrain.h"

static int die(const char *what) {
  fprintf(stderr, "dump_sampler: %s%s%s\n", what, *dt_last_error() ? ": " : "", dt_last_error());
  return 1;
}

static int parse_i64(const char *s, long long *v) {
  char *end;
  errno = 0;
  *v = strtoll(s, &end, 10);
  return errno == 0 && end != s && *end == '\0';
}

int main(int argc, char **argv) {
  if (argc != 8) {
    fprintf(stderr, "usage: dump_sampler N REPLICAS SEED EPOCH SHUFFLE DROP_LAST OUT\n");
    return 2;
  }
  long long n, replicas, epoch, shuffle, drop_last;
  char *end;
  errno = 0;
  unsigned long long seed = strtoull(argv[3], &end, 10);
  if (errno || *end || !parse_i64(argv[1], &n) || !parse_i64(argv[2], &replicas) || !parse_i64(argv[4], &epoch) ||
      !parse_i64(argv[5], &shuffle) || !parse_i64(argv[6], &drop_last))
    return die("bad number");
  FILE *f = fopen(argv[7], "wb");
  if (!f) return die("cannot open output");
  int64_t *idx = NULL;
  int ok = 1;
  for (int rank = 0; ok && rank < (int)replicas; rank++) {
    dt_dist_sampler *s = NULL;
    if (dt_dist_sampler_new(n, (int)replicas, rank, seed, (int)shuffle, (int)drop_last, &s) != DT_OK) {
      fclose(f);
      return die("dt_dist_sampler_new");
    }
    int64_t head[2] = {dt_dist_sampler_num_samples(s), dt_dist_sampler_num_real(s)};
    idx = realloc(idx, sizeof *idx * (size_t)(head[0] ? head[0] : 1));
    ok = idx && dt_dist_sampler_indices(s, epoch, idx) == DT_OK;
    ok = ok && fwrite(head, sizeof *head, 2, f) == 2 && fwrite(idx, sizeof *idx, (size_t)head[0], f) == (size_t)head[0];
    dt_dist_sampler_free(s);
  }
  free(idx);
  ok = (fclose(f) == 0) && ok;
  return ok ? 0 : die("cannot write output");
}

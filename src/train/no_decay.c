/* --no-decay: the parameters named by the patterns form the group without weight decay (transformers' recipe). */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "train/run.h"

#define MAX_PATTERNS 16

/* Splits "bias,LayerNorm.weight" into pat (copies in buf); DT_USAGE on an empty item or too many. */
static dt_status split_patterns(const char *list, char *buf, size_t len, const char **pat, int *n) {
  if (snprintf(buf, len, "%s", list) >= (int)len) return dt_error(DT_USAGE, "--no-decay: pattern list too long");
  *n = 0;
  for (char *s = buf, *end; s; s = end) {
    end = strchr(s, ',');
    if (end) *end++ = '\0';
    if (!*s) return dt_error(DT_USAGE, "--no-decay %s: an empty pattern (e.g. --no-decay bias,LayerNorm.weight)", list);
    if (*n == MAX_PATTERNS) return dt_error(DT_USAGE, "--no-decay: more than %d patterns", MAX_PATTERNS);
    pat[(*n)++] = s;
  }
  return DT_OK;
}

/* Index of the first pattern the name contains, or -1. */
static int match(const char *name, const char *const *pat, int n) {
  for (int k = 0; k < n; k++)
    if (strstr(name, pat[k])) return k;
  return -1;
}

dt_status dt_run_no_decay(dt_run *r) {
  char buf[1024];
  const char *pat[MAX_PATTERNS];
  int n_pat = 0, used[MAX_PATTERNS] = {0};
  DT_CHECK(split_patterns(r->cfg->no_decay, buf, sizeof buf, pat, &n_pat));
  const int n = dt_model_num_tensors(r->model);
  dt_optim_range *ranges = NULL;
  int n_ranges = 0, n_decay = 0;
  size_t decay_params = 0;
  if (n > 0) DT_CHECK(dt_alloc_array((size_t)n, sizeof *ranges, "no-decay ranges", (void **)&ranges));
  dt_status st = DT_OK;
  for (int i = 0; i < n; i++) {
    dt_tensor_info info;
    DT_CHECK_GOTO(dt_model_tensor_info(r->model, i, &info), st, out);
    if (!info.trainable) continue; /* buffers take no optimizer step */
    size_t numel = 1;
    for (int d = 0; d < info.ndim; d++) numel *= (size_t)info.shape[d];
    const int k = match(info.name, pat, n_pat);
    if (k < 0) {
      n_decay++;
      decay_params += numel;
      continue;
    }
    used[k] = 1;
    ranges[n_ranges++] = (dt_optim_range){info.offset, numel};
  }
  DT_CHECK_GOTO(dt_optim_set_no_decay(r->optim, ranges, n_ranges), st, out);
  FILE *o = r->lead ? r->cfg->progress : NULL;
  if (o) {
    fprintf(o, "parameter groups: weight decay %g on %d tensor(s), %zu parameters; none on %d tensor(s), %zu "
            "parameters (--no-decay %s)\n", (double)r->cfg->optim.weight_decay, n_decay, decay_params, n_ranges,
            dt_optim_no_decay_count(r->optim), r->cfg->no_decay);
    for (int k = 0; k < n_pat; k++)
      if (!used[k]) fprintf(o, "  --no-decay pattern \"%s\" matches no parameter of %s\n", pat[k], r->cfg->model);
  }
out:
  dt_free(ranges);
  return st;
}

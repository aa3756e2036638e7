/* The no-decay parameter group: arena ranges without weight decay, cut once into work items of one decay each. */
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "optim/optim-impl.h"

static int range_order(const void *a, const void *b) {
  const dt_optim_range *x = a, *y = b;
  return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Appends [lo, lo + n) with one decay as pieces of at most DT_OPTIM_PIECE elements (counting when out is NULL). */
static int64_t add_pieces(dt_optim_piece *out, int64_t at, size_t lo, size_t n, int decay) {
  for (size_t done = 0; done < n; done += DT_OPTIM_PIECE, at++) {
    const size_t k = n - done < DT_OPTIM_PIECE ? n - done : DT_OPTIM_PIECE;
    if (out) out[at] = (dt_optim_piece){lo + done, k, decay};
  }
  return at;
}

/* Tiles [0, count) by the sorted, checked ranges (no decay) and the gaps between them (decay). */
static int64_t tile(dt_optim_piece *out, const dt_optim_range *r, int n, size_t count) {
  int64_t at = 0;
  size_t pos = 0;
  for (int i = 0; i < n; i++) {
    at = add_pieces(out, at, pos, r[i].lo - pos, 1);
    at = add_pieces(out, at, r[i].lo, r[i].n, 0);
    pos = r[i].lo + r[i].n;
  }
  return add_pieces(out, at, pos, count - pos, 1);
}

static dt_status check_ranges(const dt_optim *o, const dt_optim_range *r, int n) {
  for (int i = 0; i < n; i++) {
    if (r[i].lo > o->count || r[i].n > o->count - r[i].lo)
      return dt_error(DT_INVALID_ARGUMENT, "no-decay range %d [%zu, +%zu) is outside the %zu-element arena", i, r[i].lo,
                      r[i].n, o->count);
    if (i && r[i].lo < r[i - 1].lo + r[i - 1].n)
      return dt_error(DT_INVALID_ARGUMENT, "no-decay ranges [%zu, +%zu) and [%zu, +%zu) overlap", r[i - 1].lo,
                      r[i - 1].n, r[i].lo, r[i].n);
  }
  return DT_OK;
}

dt_status dt_optim_set_no_decay(dt_optim *o, const dt_optim_range *r, int n) {
  if (!o || n < 0 || (n && !r)) return dt_error(DT_INVALID_ARGUMENT, "dt_optim_set_no_decay: bad argument");
  dt_optim_range *sorted = NULL;
  dt_optim_piece *pieces = NULL;
  dt_status st = DT_OK;
  size_t none = 0;
  int64_t np = 0;
  if (n) {
    DT_CHECK(dt_alloc_array((size_t)n, sizeof *sorted, "no-decay ranges", (void **)&sorted));
    memcpy(sorted, r, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, range_order);
    DT_CHECK_GOTO(check_ranges(o, sorted, n), st, out);
    np = tile(NULL, sorted, n, o->count);
    DT_CHECK_GOTO(dt_alloc_array((size_t)np, sizeof *pieces, "no-decay work items", (void **)&pieces), st, out);
    tile(pieces, sorted, n, o->count);
    for (int i = 0; i < n; i++) none += sorted[i].n;
  }
  dt_free(o->pieces);
  o->pieces = pieces;
  o->n_pieces = np;
  o->no_decay = none;
  pieces = NULL;
out:
  dt_free(pieces);
  dt_free(sorted);
  return st;
}

size_t dt_optim_no_decay_count(const dt_optim *o) { return o ? o->no_decay : 0; }

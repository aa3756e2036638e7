/* Shared by the multi-process tests: runs every collective x dtype x op x size,
 * in place and out of place, on a group and compares with a reference each
 * rank computes itself from the same deterministic inputs. Integer-valued
 * inputs keep bf16/f16 sums exact, so every comparison is bitwise. */
#ifndef DT_TESTS_DIST_CHECK_H
#define DT_TESTS_DIST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_values.h"
#include "dtrain/dist.h"

/* Input element i of rank r: a small integer in [-8, 8]. */
static inline int dc_value(int r, size_t i, int salt) {
  return (int)(((size_t)(r + 1) * 7 + i * 3 + (size_t)salt * 5) % 17) - 8;
}

static inline void dc_store(void *buf, size_t i, dt_dtype t, double v) { dv_put(buf, t, i, v); }

/* The expected element for rank-reduced values (exact: small integers). */
static inline double dc_reduce(int world, size_t i, int salt, dt_redop op, dt_dtype t) {
  double acc = dc_value(0, i, salt);
  for (int r = 1; r < world; r++) {
    double v = dc_value(r, i, salt);
    if (op == DT_MIN) acc = v < acc ? v : acc;
    else if (op == DT_MAX) acc = v > acc ? v : acc;
    else acc += v;
  }
  if (op == DT_AVG) {
    if (t == DT_I32 || t == DT_I64) acc = (double)((long long)acc / world);
    else if (t == DT_F32 || t == DT_BF16 || t == DT_F16) acc = (double)((float)acc / (float)world);
    else acc = acc / world;
  }
  return acc;
}

typedef struct dc_result {
  int run, failed;
  char first_failure[1024];
} dc_result;

static inline void dc_fail(dc_result *res, const char *fmt, const char *a, size_t count, int inplace, const char *detail) {
  if (res->failed++ == 0)
    snprintf(res->first_failure, sizeof res->first_failure, fmt, a, count, inplace, detail);
}

enum { DC_ALLREDUCE, DC_BROADCAST, DC_ALLGATHER, DC_REDUCE_SCATTER };
static const char *const dc_names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter"};

/* One collective, checked; 0 on a match. */
static inline int dc_run_one(dt_group *g, int kind, dt_dtype t, dt_redop op, size_t count, int inplace, int salt,
                             int use_handle, dc_result *res) {
  int rank = dt_group_rank(g), world = dt_group_size(g);
  size_t es = dt_dtype_size(t);
  char label[160];
  snprintf(label, sizeof label, "%s %s %s", dc_names[kind], dt_dtype_name(t), dt_redop_name(op));
  unsigned char *in = calloc(count + 1, es), *out = calloc(count + 1, es), *want = calloc(count + 1, es);
  if (!in || !out || !want) {
    free(in), free(out), free(want);
    dc_fail(res, "%s count %zu inplace %d: %s", label, count, inplace, "out of memory");
    return -1;
  }
  size_t off, len;
  dt_group_block(g, count, rank, &off, &len);
  int root = (salt + 1) % world;
  for (size_t i = 0; i < count; i++) {
    dc_store(in, i, t, dc_value(rank, i, salt));
    dc_store(out, i, t, -99);
  }
  dt_status s = DT_OK;
  dt_work *w = NULL, **wp = use_handle ? &w : NULL;
  switch (kind) {
  case DC_ALLREDUCE:
    for (size_t i = 0; i < count; i++) dc_store(want, i, t, dc_reduce(world, i, salt, op, t));
    if (inplace) memcpy(out, in, count * es);
    s = dt_allreduce(g, inplace ? out : in, out, count, t, op, wp);
    break;
  case DC_BROADCAST:
    for (size_t i = 0; i < count; i++) dc_store(want, i, t, dc_value(root, i, salt));
    memcpy(out, in, count * es);
    s = dt_broadcast(g, out, count, t, root, wp);
    break;
  case DC_ALLGATHER:
    /* rank q's block holds q's values. */
    for (int q = 0; q < world; q++) {
      size_t qo, ql;
      dt_group_block(g, count, q, &qo, &ql);
      for (size_t i = qo; i < qo + ql; i++) dc_store(want, i, t, dc_value(q, i, salt));
    }
    if (inplace) memcpy(out + off * es, in + off * es, len * es);
    s = dt_allgather(g, inplace ? out + off * es : in + off * es, out, count, t, wp);
    break;
  case DC_REDUCE_SCATTER:
    for (size_t i = 0; i < len; i++) dc_store(want, i, t, dc_reduce(world, off + i, salt, op, t));
    if (inplace) {
      memcpy(out, in, count * es);
      s = dt_reduce_scatter(g, out, out + off * es, count, t, op, wp);
    } else {
      s = dt_reduce_scatter(g, in, out, count, t, op, wp);
    }
    break;
  }
  if (s == DT_OK && w) s = dt_work_wait(w, 0);
  dt_work_free(w);
  res->run++;
  int bad = 0;
  if (s != DT_OK) {
    char d[400];
    snprintf(d, sizeof d, "%s: %s", dt_status_name(s), dt_last_error());
    dc_fail(res, "%s count %zu inplace %d: %s", label, count, inplace, d);
    bad = 1;
  } else {
    size_t n = count;
    const unsigned char *got = out;
    if (kind == DC_REDUCE_SCATTER) {
      n = len;
      got = inplace ? out + off * es : out;
    }
    for (size_t i = 0; i < n && !bad; i++)
      if (memcmp(got + i * es, want + i * es, es) != 0) {
        char d[200];
        snprintf(d, sizeof d, "rank %d: element %zu differs", rank, i);
        dc_fail(res, "%s count %zu inplace %d: %s", label, count, inplace, d);
        bad = 1;
      }
  }
  free(in), free(out), free(want);
  return bad ? -1 : 0;
}

/* Every kind x dtype x op x count x placement; large = also one multi-MiB f32
 * all-reduce, reduce-scatter and all-gather. Returns the number of failures. */
static inline int dc_run_all(dt_group *g, int large, dc_result *res) {
  static const dt_dtype types[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64};
  static const size_t counts[] = {0, 1, 7, 1000};
  int salt = 0;
  for (int kind = 0; kind < 4; kind++)
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
      for (int op = 0; op < DT_REDOP_COUNT; op++) {
        if ((kind == DC_BROADCAST || kind == DC_ALLGATHER) && op > 0) continue;
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
          for (int inplace = 0; inplace < 2; inplace++, salt++)
            dc_run_one(g, kind, types[ti], (dt_redop)op, counts[ci], inplace, salt, salt & 1, res);
      }
  if (large) {
    size_t big = (size_t)3 * 1024 * 1024 + 3; /* 12 MiB of f32, odd */
    dc_run_one(g, DC_ALLREDUCE, DT_F32, DT_SUM, big, 0, 1, 1, res);
    dc_run_one(g, DC_ALLREDUCE, DT_F32, DT_AVG, big, 1, 2, 0, res);
    dc_run_one(g, DC_REDUCE_SCATTER, DT_F32, DT_MAX, big, 0, 3, 0, res);
    dc_run_one(g, DC_ALLGATHER, DT_F32, DT_SUM, big, 1, 4, 1, res);
    dc_run_one(g, DC_BROADCAST, DT_F32, DT_SUM, big, 0, 5, 0, res);
  }
  if (dt_barrier(g, NULL) != DT_OK) {
    dc_fail(res, "%s count %zu inplace %d: %s", "barrier", 0, 0, dt_last_error());
  }
  res->run++;
  return res->failed;
}

#endif

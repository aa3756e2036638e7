/* dt_trace_write_merged: every rank's trace events streamed to rank 0, written there as one Chrome trace, atomically. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/dtrain.h"
#include "io/trace_merge.h"

/* How the events travel: the collectives have no byte type, so each rank's
 * text is packed into i64 words (zero padding at the end). First one
 * all-gather of a few words per rank (text length, events kept and dropped,
 * and rank 0's "file opened" flag), then one broadcast per rank with text,
 * rooted there: rank 0 writes each rank's text as it arrives, so no rank
 * ever holds more than its own text and the largest other one. The others
 * receive the broadcasts too (there is no gather), which costs bandwidth at
 * the end of a run but no memory beyond that one buffer. A last broadcast
 * from rank 0 tells every rank whether the file was written. */
enum { INFO_LEN, INFO_KEPT, INFO_DROPPED, INFO_OPENED, INFO_WORDS };

/* The closing part of the file: otherData with totals and per-rank counts. */
static void write_footer(dt_atomic_file *o, int world, const int64_t *info) {
  char buf[512];
  int64_t kept = 0, lost = 0;
  for (int r = 0; r < world; r++) {
    kept += info[r * INFO_WORDS + INFO_KEPT];
    lost += info[r * INFO_WORDS + INFO_DROPPED];
  }
  int n = snprintf(buf, sizeof buf,
                   "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"producer\":\"dtrain " DTRAIN_VERSION
                   "\",\"clock\":\"CLOCK_REALTIME, microseconds since 2020-01-01T00:00:00Z (Unix %d)\","
                   "\"ranks\":%d,\"events\":%" PRId64 ",\"dropped_events\":%" PRId64 ",\"events_per_rank\":[",
                   DT_TRACE_EPOCH_S, world, kept, lost);
  dt_atomic_write(o, buf, (size_t)n);
  for (int k = INFO_KEPT; k <= INFO_DROPPED; k++) {
    if (k == INFO_DROPPED) dt_atomic_write(o, "],\"dropped_per_rank\":[", 22);
    for (int r = 0; r < world; r++) {
      n = snprintf(buf, sizeof buf, "%s%" PRId64, r ? "," : "", info[r * INFO_WORDS + k]);
      dt_atomic_write(o, buf, (size_t)n);
    }
  }
  dt_atomic_write(o, "]}}\n", 4);
}

dt_status dt_trace_write_merged(dt_group *g, const char *path) {
  if (!path || !path[0]) return dt_error(DT_INVALID_ARGUMENT, "dt_trace_write_merged: no path");
  const int rank = g ? dt_group_rank(g) : 0, world = g ? dt_group_size(g) : 1;
  char *text = NULL;
  size_t len = 0, max_words = 0;
  int64_t *info = NULL, *words = NULL, *scratch = NULL, result = 0;
  dt_atomic_file o = {0};
  dt_status st = DT_OK, local = DT_OK, opened = DT_OK;

  /* A local failure (no memory for the text) still takes part in every
   * collective, contributing nothing, so the other ranks are not left waiting. */
  uint64_t kept = 0, lost = 0;
  dt_trace_stats(&kept, &lost);
  if (dt_trace_enabled() || kept || lost) {
    if (dt_trace_rank() != rank)
      DT_LOG_WARN("trace", "rank %d recorded its events as pid %d (dt_trace_enable with the group rank)", rank,
                  dt_trace_rank());
    local = dt_trace_serialize(&text, &len);
    if (local != DT_OK) len = 0;
  }
  if (rank == 0) opened = dt_atomic_open(&o, path);

  DT_CHECK_GOTO(dt_alloc_array((size_t)world * INFO_WORDS, sizeof(int64_t), "trace merge table", (void **)&info), st,
                done);
  int64_t *mine = info + (size_t)rank * INFO_WORDS;
  mine[INFO_LEN] = (int64_t)len;
  mine[INFO_KEPT] = (int64_t)kept;
  mine[INFO_DROPPED] = (int64_t)lost;
  mine[INFO_OPENED] = opened == DT_OK;
  if (g) DT_CHECK_GOTO(dt_allgather(g, mine, info, (size_t)world * INFO_WORDS, DT_I64, NULL), st, done);
  if (!info[INFO_OPENED]) {
    st = rank == 0 ? opened : dt_error(DT_IO, "%s: rank 0 could not create the merged trace file", path);
    goto done;
  }

  for (int r = 0; r < world; r++) {
    size_t w = ((size_t)info[r * INFO_WORDS + INFO_LEN] + 7) / 8;
    if (r != rank && w > max_words) max_words = w;
  }
  if (len) {
    DT_CHECK_GOTO(dt_alloc_array((len + 7) / 8, sizeof(int64_t), "trace merge words", (void **)&words), st, done);
    memcpy(words, text, len);
  }
  /* Only rank 0 consumes the others' text, but every rank receives it. */
  if (g && max_words)
    DT_CHECK_GOTO(dt_alloc_array(max_words, sizeof(int64_t), "trace merge buffer", (void **)&scratch), st, done);

  if (rank == 0) dt_atomic_write(&o, "{\"traceEvents\":[\n", 17);
  int written = 0;
  for (int r = 0; r < world; r++) {
    const size_t rl = (size_t)info[r * INFO_WORDS + INFO_LEN], rw = (rl + 7) / 8;
    if (!rl) continue;
    int64_t *buf = r == rank ? words : scratch;
    if (g && world > 1) DT_CHECK_GOTO(dt_broadcast(g, buf, rw, DT_I64, r, NULL), st, done);
    if (rank != 0) continue;
    if (written++) dt_atomic_write(&o, ",\n", 2);
    dt_atomic_write(&o, buf, rl);
  }
  if (rank == 0) {
    write_footer(&o, world, info);
    result = dt_atomic_commit(&o);
  }
  /* Every rank learns whether the file is there. */
  if (g && world > 1) DT_CHECK_GOTO(dt_broadcast(g, &result, 1, DT_I64, 0, NULL), st, done);
  if (result != DT_OK)
    st = rank == 0 ? (dt_status)result : dt_error((dt_status)result, "%s: rank 0 could not write the merged trace", path);
  else
    st = local;

done:
  dt_atomic_abort(&o); /* no-op after commit, or where it was never opened */
  dt_free(scratch);
  dt_free(words);
  dt_free(info);
  dt_free(text);
  return st;
}

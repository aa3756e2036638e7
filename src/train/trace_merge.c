/* dt_trace_write_merged: every rank's trace events streamed to rank 0, written there as one Chrome trace, atomically. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/impl.h"
#include "dtrain/dtrain.h"
#include "train/trace_merge.h"

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

typedef struct out_file {
  const char *path;
  char tmp[4096];
  FILE *f;
  dt_status st; /* the first write failure (later writes are skipped) */
} out_file;

static void out_write(out_file *o, const void *p, size_t n) {
  if (o->st != DT_OK || !n) return;
  errno = 0;
  if (fwrite(p, 1, n, o->f) != n)
    o->st = dt_error(DT_IO, "%s: writing the trace to %s failed: %s", o->path, o->tmp, strerror(errno ? errno : EIO));
}

/* The temporary lives next to path (same file system, so rename is atomic).
 * O_TRUNC without O_EXCL: a stale temporary of a dead process with our pid is overwritten. */
static dt_status out_open(out_file *o, const char *path) {
  memset(o, 0, sizeof *o);
  o->path = path;
  if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof o->tmp)
    return dt_error(DT_IO, "%s: path too long", path);
  int fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0)
    return dt_error(DT_IO, "%s: cannot create the trace file (temporary %s): %s", path, o->tmp, strerror(errno));
  o->f = fdopen(fd, "wb");
  if (!o->f) {
    dt_status st = dt_error(DT_IO, "%s: %s", o->tmp, strerror(errno));
    close(fd);
    unlink(o->tmp);
    return st;
  }
  return DT_OK;
}

/* fsync of the directory holding path, so the rename itself is durable. */
static dt_status sync_dir(const char *path) {
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return dt_error(DT_IO, "%s: written, but opening directory %s to sync it failed: %s", path, dir, strerror(errno));
  int rc = fsync(fd), err = errno;
  close(fd);
  /* Some file systems cannot sync directories (EINVAL); the rename stands. */
  if (rc != 0 && err != EINVAL && err != EROFS)
    return dt_error(DT_IO, "%s: written, but syncing directory %s failed: %s", path, dir, strerror(err));
  return DT_OK;
}

/* Flush, fsync, close, rename over path; on any failure the temporary is removed. */
static dt_status out_commit(out_file *o) {
  dt_status st = o->st;
  if (st == DT_OK && fflush(o->f) != 0)
    st = dt_error(DT_IO, "%s: writing %s failed: %s", o->path, o->tmp, strerror(errno));
  if (st == DT_OK && fsync(fileno(o->f)) != 0 && errno != EINVAL)
    st = dt_error(DT_IO, "%s: fsync of %s failed: %s", o->path, o->tmp, strerror(errno));
  if (fclose(o->f) != 0 && st == DT_OK)
    st = dt_error(DT_IO, "%s: closing %s failed: %s", o->path, o->tmp, strerror(errno));
  o->f = NULL;
  if (st == DT_OK && rename(o->tmp, o->path) != 0)
    st = dt_error(DT_IO, "%s: renaming %s over it failed: %s", o->path, o->tmp, strerror(errno));
  if (st != DT_OK) {
    unlink(o->tmp);
    return st;
  }
  return sync_dir(o->path);
}

static void out_abandon(out_file *o) {
  if (!o->f) return;
  fclose(o->f);
  o->f = NULL;
  unlink(o->tmp);
}

/* The closing part of the file: otherData with totals and per-rank counts. */
static void write_footer(out_file *o, int world, const int64_t *info) {
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
  out_write(o, buf, (size_t)n);
  for (int k = INFO_KEPT; k <= INFO_DROPPED; k++) {
    if (k == INFO_DROPPED) out_write(o, "],\"dropped_per_rank\":[", 22);
    for (int r = 0; r < world; r++) {
      n = snprintf(buf, sizeof buf, "%s%" PRId64, r ? "," : "", info[r * INFO_WORDS + k]);
      out_write(o, buf, (size_t)n);
    }
  }
  out_write(o, "]}}\n", 4);
}

dt_status dt_trace_write_merged(dt_group *g, const char *path) {
  if (!path || !path[0]) return dt_error(DT_INVALID_ARGUMENT, "dt_trace_write_merged: no path");
  const int rank = g ? dt_group_rank(g) : 0, world = g ? dt_group_size(g) : 1;
  char *text = NULL;
  size_t len = 0, max_words = 0;
  int64_t *info = NULL, *words = NULL, *scratch = NULL, result = 0;
  out_file o;
  memset(&o, 0, sizeof o);
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
  if (rank == 0) opened = out_open(&o, path);

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

  if (rank == 0) out_write(&o, "{\"traceEvents\":[\n", 17);
  int written = 0;
  for (int r = 0; r < world; r++) {
    const size_t rl = (size_t)info[r * INFO_WORDS + INFO_LEN], rw = (rl + 7) / 8;
    if (!rl) continue;
    int64_t *buf = r == rank ? words : scratch;
    if (g && world > 1) DT_CHECK_GOTO(dt_broadcast(g, buf, rw, DT_I64, r, NULL), st, done);
    if (rank != 0) continue;
    if (written++) out_write(&o, ",\n", 2);
    out_write(&o, buf, rl);
  }
  if (rank == 0) {
    write_footer(&o, world, info);
    result = out_commit(&o);
  }
  /* Every rank learns whether the file is there. */
  if (g && world > 1) DT_CHECK_GOTO(dt_broadcast(g, &result, 1, DT_I64, 0, NULL), st, done);
  if (result != DT_OK)
    st = rank == 0 ? (dt_status)result : dt_error((dt_status)result, "%s: rank 0 could not write the merged trace", path);
  else
    st = local;

done:
  if (rank == 0) out_abandon(&o); /* no-op after commit */
  dt_free(scratch);
  dt_free(words);
  dt_free(info);
  dt_free(text);
  return st;
}

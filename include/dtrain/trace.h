/* dtrain timeline: Chrome trace-event spans per rank and thread, for Perfetto / chrome://tracing.
 *
 *   dt_trace_enable(rank);                         // once, before training
 *   dt_trace_thread_name("loader");                // at the start of a thread
 *   double t0 = dt_trace_enabled() ? dt_trace_now_us() : 0;
 *   ... work ...
 *   if (t0 > 0) dt_trace_span("nn", "forward", t0, dt_trace_now_us(), NULL);
 *
 * Recording is process-wide and off until dt_trace_enable: every call before
 * then is a no-op behind one read of a global int (dt_trace_enabled), so
 * instrumented code costs nothing measurable when no trace is asked for.
 * Events are complete events ("ph":"X", ts and dur in microseconds) kept in
 * per-thread buffers: one track per thread, tid 1, 2, ... in the order
 * threads first record (the enabling thread first), pid = rank. At most
 * DT_TRACE_MAX_EVENTS are kept; later ones are counted as dropped and the
 * count goes into the output's metadata.
 * Recording never fails the caller and never touches dt_last_error.
 * dt_trace_write_merged (src/io/trace_merge.h) gathers every rank's events
 * into one file on rank 0. */
#ifndef DTRAIN_TRACE_H
#define DTRAIN_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nonzero while recording. Read through dt_trace_enabled only. */
extern int dt_trace_on_;
/* The one branch instrumented code pays when tracing is off (a relaxed load:
 * a plain move, yet no data race when another thread enables it). */
static inline int dt_trace_enabled(void) { return __atomic_load_n(&dt_trace_on_, __ATOMIC_RELAXED); }

/* Starts recording for this process as pid `rank` (>= 0). Reads the cap from
 * DT_TRACE_MAX_EVENTS (DT_INVALID_ARGUMENT if malformed or < 1). Names the
 * calling thread "main" unless it already has a name, and gives it the first
 * track. Enabling again changes the rank and keeps the events recorded so far. */
dt_status dt_trace_enable(int rank);
/* Stops recording; the events recorded so far stay for dt_trace_serialize. */
void dt_trace_disable(void);
/* The rank given to dt_trace_enable (0 before). */
int dt_trace_rank(void);

/* Names the calling thread's track ("main", "loader", "comm"); copied (up to
 * 63 bytes). Cheap and valid at any time, also while recording is off: the
 * name is kept for when the thread first records. Unnamed threads show as
 * "thread <tid>". */
void dt_trace_thread_name(const char *name);

/* Origin of trace timestamps: 2020-01-01T00:00:00Z in Unix seconds. Counting
 * from here rather than 1970 keeps a double's resolution near 30 ns (and in
 * the viewers, which read ts as doubles) instead of 250 ns. */
#define DT_TRACE_EPOCH_S 1577836800

/* The timestamp source: CLOCK_REALTIME in microseconds since DT_TRACE_EPOCH_S,
 * so ranks on several hosts line up as well as their clocks agree (NTP:
 * typically well under a millisecond). */
double dt_trace_now_us(void);

/* Records a complete event on the calling thread's track from t0_us to t1_us
 * (dt_trace_now_us clock). cat and name are copied and JSON-escaped (UTF-8).
 * args_json is NULL or the members of the args object, inserted verbatim, so
 * it must be valid JSON members: "\"bytes\":4096,\"dtype\":\"f32\"". No-op
 * while recording is off, or if t0_us <= 0 (a span whose start was not
 * measured because recording was off then); t1_us < t0_us records dur 0. */
void dt_trace_span(const char *cat, const char *name, double t0_us, double t1_us, const char *args_json);
/* A span that may overlap others on the same thread without nesting (a DDP
 * bucket from launch to completion while backward goes on): recorded as a
 * nestable async pair ("ph":"b" / "e", a fresh id), which viewers lay out on
 * rows of their own under the process. Same rules; one event for the cap. */
void dt_trace_async(const char *cat, const char *name, double t0_us, double t1_us, const char *args_json);
/* An instant event ("ph":"i", thread scope) at t_us; same rules. */
void dt_trace_instant(const char *cat, const char *name, double t_us, const char *args_json);

/* Events kept and events dropped (over the cap, or a buffer that could not
 * grow) since the last dt_trace_reset. Either pointer may be NULL. */
void dt_trace_stats(uint64_t *kept, uint64_t *dropped);

/* This process's events as JSON objects separated by ",\n" (no brackets, no
 * trailing comma), led by metadata events: process_name "rank R",
 * process_sort_index, dtrain_trace_stats {events, dropped_events,
 * max_events}, process_labels when events were dropped, and thread_name /
 * thread_sort_index per track. *json is NUL-terminated, owned by the caller
 * (dt_free); *len excludes the NUL. A snapshot: threads that record while
 * it copies wait for it (meant for the end of a run), and their events land
 * after it. */
dt_status dt_trace_serialize(char **json, size_t *len);

/* Disables recording and forgets every event, track and count (threads keep
 * the names they gave themselves). For tests; not while other threads record. */
void dt_trace_reset(void);

#ifdef __cplusplus
}
#endif
#endif

/* Trace-event recorder: per-thread buffers of pre-formatted JSON events, a global cap, and their serialisation. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/impl.h"
#include "core/text.h"
#include "dtrain/trace.h"

/* Each event is formatted when recorded, as the members of its JSON object
 * without pid and tid ("ph":"X","ts":...,"dur":...,"cat":...,"name":...),
 * NUL-terminated, appended to the recording thread's chunk list. Formatting
 * at once copies and escapes the strings (callers pass stack buffers) and
 * leaves serialisation a copy; pid and tid are added then, so enabling again
 * with another rank relabels everything consistently. */

int dt_trace_on_;

#define TRACK_NAME_MAX 64
#define CHUNK_BYTES ((size_t)256 << 10)
/* Longer cat + name + args than this is a caller's mistake: dropped, not stored. */
#define EVENT_TEXT_MAX ((size_t)1 << 20)
/* Bytes a record needs beyond 6 x (cat + name) + args: keys, two numbers, quotes, NUL. */
#define EVENT_FIXED 160
/* What serialisation adds around a record: {"pid":P,"tid":T, ... },\n */
#define RECORD_WRAP 48

typedef struct chunk {
  struct chunk *next;
  size_t used, cap;
  char data[];
} chunk;

/* One thread's track. Owned by the registry (it outlives its thread); the
 * thread appends under mu, dt_trace_serialize reads under mu. */
typedef struct track {
  struct track *next;
  pthread_mutex_t mu;
  int tid;
  char name[TRACK_NAME_MAX];
  chunk *head, *tail;
  size_t records, bytes; /* JSON objects and the bytes of their records (NULs included) */
} track;

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static track *tracks_head, *tracks_tail; /* in tid order */
static int n_tracks;
static atomic_uint generation = 1; /* bumped by reset: threads' cached tracks are stale */
static atomic_int trace_rank;
static atomic_uint_fast64_t max_events = 2000000;
static atomic_uint_fast64_t claimed, dropped; /* kept = claimed - dropped */
static atomic_uint_fast64_t next_async_id;

static _Thread_local track *my_track;
static _Thread_local unsigned my_generation;
static _Thread_local char my_name[TRACK_NAME_MAX];

/* ---- formatting ------------------------------------------------------------ */

static char *put(char *p, const char *s) {
  size_t n = strlen(s);
  memcpy(p, s, n);
  return p + n;
}

static char *put_u64(char *p, uint64_t v) {
  char tmp[24];
  int n = 0;
  do tmp[n++] = (char)('0' + v % 10), v /= 10;
  while (v);
  while (n) *p++ = tmp[--n];
  return p;
}

/* ns as microseconds with three decimals ("1234.567"). */
static char *put_us(char *p, uint64_t ns) {
  p = put_u64(p, ns / 1000);
  unsigned f = (unsigned)(ns % 1000);
  *p++ = '.';
  *p++ = (char)('0' + f / 100);
  *p++ = (char)('0' + f / 10 % 10);
  *p++ = (char)('0' + f % 10);
  return p;
}

/* Microseconds to whole nanoseconds. Rounding is monotonic, so a span inside
 * another stays inside it (viewers nest same-thread spans by their ends). */
static uint64_t to_ns(double us) {
  if (!(us > 0)) return 0; /* also NaN */
  if (us > 1e16) us = 1e16; /* far beyond any clock; keeps the cast defined */
  return (uint64_t)(us * 1000.0 + 0.5);
}

/* s as a JSON string literal: at most 6 bytes per input byte plus 2, and a
 * NUL after them that the next write covers; callers reserve that room. */
static char *put_json_str(char *p, const char *s) {
  size_t n = 0;
  dt_json_escape(p, SIZE_MAX, &n, s);
  return p + n;
}

/* ---- tracks ----------------------------------------------------------------- */

/* Plain malloc/free here, not dt_alloc: a failed allocation must not
 * overwrite the thread's error detail (recording never fails the caller). */
static track *self_track(void) {
  unsigned gen = atomic_load_explicit(&generation, memory_order_acquire);
  if (my_track && my_generation == gen) return my_track;
  track *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  pthread_mutex_init(&t->mu, NULL);
  memcpy(t->name, my_name, sizeof t->name);
  pthread_mutex_lock(&registry_mu);
  t->tid = ++n_tracks;
  if (tracks_tail) tracks_tail->next = t;
  else tracks_head = t;
  tracks_tail = t;
  my_generation = atomic_load_explicit(&generation, memory_order_relaxed);
  pthread_mutex_unlock(&registry_mu);
  my_track = t;
  return t;
}

/* Room for need bytes at the end of t's chunk list, or NULL. Lock held. */
static char *reserve(track *t, size_t need) {
  chunk *c = t->tail;
  if (!c || c->cap - c->used < need) {
    size_t cap = need > CHUNK_BYTES ? need : CHUNK_BYTES;
    chunk *n = malloc(sizeof *n + cap);
    if (!n) return NULL;
    n->next = NULL;
    n->used = 0;
    n->cap = cap;
    if (c) c->next = n;
    else t->head = n;
    t->tail = n;
    c = n;
  }
  return c->data + c->used;
}

static void commit(track *t, char *start, char *end) {
  size_t n = (size_t)(end - start);
  t->tail->used += n;
  t->bytes += n;
  t->records++;
}

/* The members of one event after "ph": ts, [dur,] cat, name, [args]; NUL-terminated. */
static char *put_body(char *p, uint64_t ts, const uint64_t *dur, const char *cat, const char *name,
                      const char *args) {
  p = put(p, ",\"ts\":");
  p = put_us(p, ts);
  if (dur) {
    p = put(p, ",\"dur\":");
    p = put_us(p, *dur);
  }
  p = put(p, ",\"cat\":");
  p = put_json_str(p, cat);
  p = put(p, ",\"name\":");
  p = put_json_str(p, name);
  if (args && *args) {
    p = put(p, ",\"args\":{");
    p = put(p, args);
    *p++ = '}';
  }
  *p++ = '\0';
  return p;
}

enum { EV_SPAN, EV_ASYNC, EV_INSTANT };

static void record(int kind, const char *cat, const char *name, double t0_us, double t1_us, const char *args) {
  if (!(t0_us > 0)) return; /* its start was not measured */
  if (atomic_fetch_add_explicit(&claimed, 1, memory_order_relaxed) >=
      atomic_load_explicit(&max_events, memory_order_relaxed))
    goto drop;
  if (!cat) cat = "";
  if (!name) name = "";
  const size_t text = strlen(cat) + strlen(name) + (args ? strlen(args) : 0);
  if (text > EVENT_TEXT_MAX) goto drop;
  const size_t one = EVENT_FIXED + 6 * text, need = kind == EV_ASYNC ? 2 * one : one;
  track *t = self_track();
  if (!t) goto drop;
  const uint64_t ts = to_ns(t0_us), end = to_ns(t1_us), dur = end > ts ? end - ts : 0;
  pthread_mutex_lock(&t->mu);
  char *p = reserve(t, need);
  if (!p) {
    pthread_mutex_unlock(&t->mu);
    goto drop;
  }
  char *start = p;
  if (kind == EV_SPAN) {
    p = put(p, "\"ph\":\"X\"");
    p = put_body(p, ts, &dur, cat, name, args);
    commit(t, start, p);
  } else if (kind == EV_INSTANT) {
    p = put(p, "\"ph\":\"i\",\"s\":\"t\"");
    p = put_body(p, ts, NULL, cat, name, args);
    commit(t, start, p);
  } else {
    /* Begin and end share cat, name and id: that is how viewers pair them. */
    char id[40];
    char *q = put(id, ",\"id\":\"0x");
    uint64_t v = atomic_fetch_add_explicit(&next_async_id, 1, memory_order_relaxed) + 1;
    char hex[17];
    int n = 0;
    do hex[n++] = "0123456789abcdef"[v & 15], v >>= 4;
    while (v);
    while (n) *q++ = hex[--n];
    *q++ = '"';
    *q = '\0';
    p = put(p, "\"ph\":\"b\"");
    p = put(p, id);
    p = put_body(p, ts, NULL, cat, name, args);
    commit(t, start, p);
    start = p;
    p = put(p, "\"ph\":\"e\"");
    p = put(p, id);
    p = put_body(p, ts + dur, NULL, cat, name, NULL);
    commit(t, start, p);
  }
  pthread_mutex_unlock(&t->mu);
  return;
drop:
  atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
}

/* ---- public API ---------------------------------------------------------------- */

double dt_trace_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)(ts.tv_sec - DT_TRACE_EPOCH_S) * 1e6 + (double)ts.tv_nsec * 1e-3;
}

dt_status dt_trace_enable(int rank) {
  if (rank < 0) return dt_error(DT_INVALID_ARGUMENT, "dt_trace_enable: rank %d must be >= 0", rank);
  long cap = 0;
  DT_CHECK(dt_tunable_int("DT_TRACE_MAX_EVENTS", &cap));
  if (cap < 1) return dt_error(DT_INVALID_ARGUMENT, "DT_TRACE_MAX_EVENTS=%ld must be at least 1", cap);
  atomic_store(&max_events, (uint_fast64_t)cap);
  atomic_store(&trace_rank, rank);
  if (!my_name[0]) dt_trace_thread_name("main");
  (void)self_track(); /* the enabling thread's track comes first (tid 1 after a reset) */
  __atomic_store_n(&dt_trace_on_, 1, __ATOMIC_RELEASE);
  return DT_OK;
}

void dt_trace_disable(void) { __atomic_store_n(&dt_trace_on_, 0, __ATOMIC_RELEASE); }

int dt_trace_rank(void) { return atomic_load(&trace_rank); }

void dt_trace_thread_name(const char *name) {
  snprintf(my_name, sizeof my_name, "%s", name ? name : "");
  if (my_track && my_generation == atomic_load(&generation)) {
    pthread_mutex_lock(&my_track->mu);
    memcpy(my_track->name, my_name, sizeof my_name);
    pthread_mutex_unlock(&my_track->mu);
  }
}

void dt_trace_span(const char *cat, const char *name, double t0_us, double t1_us, const char *args_json) {
  if (dt_trace_enabled()) record(EV_SPAN, cat, name, t0_us, t1_us, args_json);
}

void dt_trace_async(const char *cat, const char *name, double t0_us, double t1_us, const char *args_json) {
  if (dt_trace_enabled()) record(EV_ASYNC, cat, name, t0_us, t1_us, args_json);
}

void dt_trace_instant(const char *cat, const char *name, double t_us, const char *args_json) {
  if (dt_trace_enabled()) record(EV_INSTANT, cat, name, t_us, t_us, args_json);
}

void dt_trace_stats(uint64_t *kept, uint64_t *dropped_out) {
  uint64_t c = atomic_load(&claimed), d = atomic_load(&dropped);
  if (kept) *kept = c > d ? c - d : 0;
  if (dropped_out) *dropped_out = d;
}

/* Appends one metadata event: {"ph":"M","pid":P,"tid":T,"name":what,"args":{args}}. */
static char *put_meta(char *p, int pid, int tid, const char *what, const char *args) {
  p += sprintf(p, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{%s}},\n", pid, tid, what, args);
  return p;
}

dt_status dt_trace_serialize(char **json, size_t *len) {
  if (!json || !len) return dt_error(DT_INVALID_ARGUMENT, "dt_trace_serialize: NULL argument");
  const int pid = atomic_load(&trace_rank);
  dt_status st = DT_OK;
  char *out = NULL;
  /* Every track is locked for the copy: one consistent snapshot, sized exactly
   * before it is written. Lock order registry -> tracks; recording threads
   * take a track lock alone, or the registry lock alone. */
  pthread_mutex_lock(&registry_mu);
  size_t bound = 1024;
  for (track *t = tracks_head; t; t = t->next) {
    pthread_mutex_lock(&t->mu);
    bound += 256 + 6 * TRACK_NAME_MAX + t->bytes + t->records * RECORD_WRAP;
  }
  uint64_t kept, lost;
  dt_trace_stats(&kept, &lost);
  st = dt_alloc(bound, (void **)&out);
  if (st != DT_OK) goto unlock;
  char *p = out, args[256];
  snprintf(args, sizeof args, "\"name\":\"rank %d\"", pid);
  p = put_meta(p, pid, 0, "process_name", args);
  snprintf(args, sizeof args, "\"sort_index\":%d", pid);
  p = put_meta(p, pid, 0, "process_sort_index", args);
  const uint64_t cap = atomic_load(&max_events);
  snprintf(args, sizeof args, "\"events\":%llu,\"dropped_events\":%llu,\"max_events\":%llu",
           (unsigned long long)kept, (unsigned long long)lost, (unsigned long long)cap);
  p = put_meta(p, pid, 0, "dtrain_trace_stats", args);
  if (lost) {
    snprintf(args, sizeof args, "\"labels\":\"dropped %llu events (over DT_TRACE_MAX_EVENTS=%llu)\"",
             (unsigned long long)lost, (unsigned long long)cap);
    p = put_meta(p, pid, 0, "process_labels", args);
  }
  for (track *t = tracks_head; t; t = t->next) {
    char name[TRACK_NAME_MAX + 16];
    if (t->name[0]) snprintf(name, sizeof name, "%s", t->name);
    else snprintf(name, sizeof name, "thread %d", t->tid);
    p += sprintf(p, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", pid, t->tid);
    p = put_json_str(p, name);
    p = put(p, "}},\n");
    snprintf(args, sizeof args, "\"sort_index\":%d", t->tid);
    p = put_meta(p, pid, t->tid, "thread_sort_index", args);
  }
  for (track *t = tracks_head; t; t = t->next) {
    char wrap[RECORD_WRAP];
    const int wl = snprintf(wrap, sizeof wrap, "{\"pid\":%d,\"tid\":%d,", pid, t->tid);
    for (const chunk *c = t->head; c; c = c->next) {
      for (size_t at = 0; at < c->used;) {
        const size_t n = strlen(c->data + at);
        memcpy(p, wrap, (size_t)wl);
        p += wl;
        memcpy(p, c->data + at, n);
        p += n;
        p = put(p, "},\n");
        at += n + 1;
      }
    }
  }
  p -= 2; /* the last ",\n" (there is always at least the metadata) */
  *p = '\0';
  *json = out;
  *len = (size_t)(p - out);
unlock:
  for (track *t = tracks_head; t; t = t->next) pthread_mutex_unlock(&t->mu);
  pthread_mutex_unlock(&registry_mu);
  return st;
}

void dt_trace_reset(void) {
  dt_trace_disable();
  pthread_mutex_lock(&registry_mu);
  track *t = tracks_head;
  tracks_head = tracks_tail = NULL;
  n_tracks = 0;
  atomic_fetch_add_explicit(&generation, 1, memory_order_release);
  atomic_store(&claimed, 0);
  atomic_store(&dropped, 0);
  atomic_store(&next_async_id, 0);
  atomic_store(&trace_rank, 0);
  pthread_mutex_unlock(&registry_mu);
  while (t) {
    track *next = t->next;
    for (chunk *c = t->head; c;) {
      chunk *cn = c->next;
      free(c);
      c = cn;
    }
    pthread_mutex_destroy(&t->mu);
    free(t);
    t = next;
  }
  my_track = NULL;
}

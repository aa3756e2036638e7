/* Tests of the trace recorder (dt_trace_*) and the merged timeline (dt_trace_write_merged): tracks per
 * thread, the disabled path, the event cap, JSON validity, the instrumented model / loader / group / DDP,
 * a merge over forked ranks, and failed writes that leave nothing behind. */
#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>

#include "dist_fork.h"
#include "dtrain/trace.h"
#include "dtrain/loss.h"
#include "dtrain/parallel.h"
#include "harness.h"
#include "test_files.h"
#include "io/trace_merge.h"

static const char *run_id(void) {
  static char id[32];
  if (!id[0]) snprintf(id, sizeof id, "trace-%d", (int)getpid()); /* in the parent, before any fork */
  return id;
}

/* ---- a small JSON validator (RFC 8259 grammar; no tree) ------------------------------- */

static const char *jv_value(const char *p, int depth);

static const char *jv_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

static const char *jv_string(const char *p) {
  if (*p++ != '"') return NULL;
  for (;;) {
    unsigned char c = (unsigned char)*p++;
    if (c == '"') return p;
    if (c < 0x20) return NULL; /* also the end of the text */
    if (c != '\\') continue;
    c = (unsigned char)*p++;
    if (c == 'u') {
      for (int k = 0; k < 4; k++, p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F'))) return NULL;
    } else if (!strchr("\"\\/bfnrt", c) || !c) {
      return NULL;
    }
  }
}

static const char *jv_number(const char *p) {
  if (*p == '-') p++;
  if (*p == '0') p++;
  else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
  else return NULL;
  if (*p == '.') {
    p++;
    if (!(*p >= '0' && *p <= '9')) return NULL;
    while (*p >= '0' && *p <= '9') p++;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!(*p >= '0' && *p <= '9')) return NULL;
    while (*p >= '0' && *p <= '9') p++;
  }
  return p;
}

static const char *jv_value(const char *p, int depth) {
  if (depth > 64) return NULL;
  p = jv_ws(p);
  if (*p == '{' || *p == '[') {
    const char close = *p == '{' ? '}' : ']';
    const int object = *p == '{';
    p = jv_ws(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
      if (object) {
        p = jv_string(jv_ws(p));
        if (!p) return NULL;
        p = jv_ws(p);
        if (*p++ != ':') return NULL;
      }
      p = jv_value(p, depth + 1);
      if (!p) return NULL;
      p = jv_ws(p);
      if (*p == close) return p + 1;
      if (*p++ != ',') return NULL;
    }
  }
  if (*p == '"') return jv_string(p);
  if (!strncmp(p, "true", 4)) return p + 4;
  if (!strncmp(p, "false", 5)) return p + 5;
  if (!strncmp(p, "null", 4)) return p + 4;
  return jv_number(p);
}

/* 1 if text is exactly one JSON value (surrounded by whitespace at most). */
static int json_valid(const char *text) {
  const char *end = jv_value(text, 0);
  return end && *jv_ws(end) == '\0';
}

/* ---- helpers ------------------------------------------------------------------------- */

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* The serialised events of this process wrapped in brackets (a JSON array); free(). */
static char *serialize_array(void) {
  char *json = NULL;
  size_t len = 0;
  if (dt_trace_serialize(&json, &len) != DT_OK) return NULL;
  char *arr = malloc(len + 3);
  if (arr) {
    arr[0] = '[';
    memcpy(arr + 1, json, len);
    arr[len + 1] = ']';
    arr[len + 2] = '\0';
  }
  dt_free(json);
  return arr;
}

/* The start of the object (event or metadata) that contains `at`. */
static const char *object_of(const char *start, const char *at) {
  while (at > start && strncmp(at, "{\"pid\":", 7) != 0 && strncmp(at, "{\"ph\":", 6) != 0) at--;
  return at;
}

/* The pid (which = "pid") or tid of the object containing `at`. */
static int field_before(const char *start, const char *at, const char *which) {
  char key[16];
  snprintf(key, sizeof key, "\"%s\":", which);
  const char *f = strstr(object_of(start, at), key);
  return f ? atoi(f + strlen(key)) : -1;
}

/* The tid of the track named name ("thread_name" metadata), -1 if none; the first if several. */
static int tid_named(const char *json, int pid, const char *name) {
  char needle[160];
  snprintf(needle, sizeof needle, "\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}", name);
  for (const char *p = json; (p = strstr(p, needle)); p += strlen(needle))
    if (field_before(json, p, "pid") == pid) return field_before(json, p, "tid");
  return -1;
}

/* Events named name (exact) on track (pid, tid); tid < 0: any track of pid. */
static int events_on(const char *json, int pid, int tid, const char *name) {
  char needle[160];
  snprintf(needle, sizeof needle, "\"name\":\"%s\"", name);
  int n = 0;
  for (const char *p = json; (p = strstr(p, needle)); p += strlen(needle))
    if (!strncmp(object_of(json, p), "{\"pid\":", 7) /* an event, not metadata */ &&
        field_before(json, p, "pid") == pid && (tid < 0 || field_before(json, p, "tid") == tid))
      n++;
  return n;
}

static int have_python(void) { return access("/usr/bin/python3", X_OK) == 0; }

/* Runs python code on file with extra arguments; its exit status (0: the checks held). */
static int python_check(const char *code, const char *file, const char *extra) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c '%s' '%s' %s", code, file, extra ? extra : "");
  return system(cmd);
}

static char tmp_dir[64];
static const char *make_tmpdir(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/dt_test_trace_XXXXXX");
  return mkdtemp(tmp_dir);
}

/* Entries of dir other than . and .. */
static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void remove_tree(const char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* ---- recorder ------------------------------------------------------------------------- */

TEST(disabled_records_nothing) {
  dt_trace_reset();
  ASSERT(!dt_trace_enabled());
  const double t = dt_trace_now_us();
  dt_trace_span("t", "off", t, t + 1, NULL);
  dt_trace_async("t", "off", t, t + 1, NULL);
  dt_trace_instant("t", "off", t, NULL);
  uint64_t kept = 9, dropped = 9;
  dt_trace_stats(&kept, &dropped);
  ASSERT_EQ(kept, 0);
  ASSERT_EQ(dropped, 0);
  char *arr = serialize_array();
  ASSERT(arr);
  ASSERT_EQ(count_of(arr, "\"off\""), 0);
  ASSERT_EQ(count_of(arr, "thread_name"), 0); /* no track was made */
  ASSERT(json_valid(arr));
  free(arr);
  /* after disable, again nothing */
  ASSERT_OK(dt_trace_enable(0));
  dt_trace_span("t", "on", t, t + 1, NULL);
  dt_trace_disable();
  dt_trace_span("t", "off", t, t + 1, NULL);
  dt_trace_stats(&kept, NULL);
  ASSERT_EQ(kept, 1);
  /* a span whose start was not measured (0) is ignored */
  ASSERT_OK(dt_trace_enable(0));
  dt_trace_span("t", "unmeasured", 0, t, NULL);
  dt_trace_stats(&kept, NULL);
  ASSERT_EQ(kept, 1);
  dt_trace_reset();
  ASSERT(!dt_trace_enabled());
  ASSERT_STATUS(dt_trace_enable(-1), DT_INVALID_ARGUMENT);
}

enum { THREAD_SPANS = 50 };

static void *named_thread(void *arg) {
  const char *name = arg;
  dt_trace_thread_name(name);
  char span[64];
  snprintf(span, sizeof span, "%s work", name);
  for (int i = 0; i < THREAD_SPANS; i++) {
    const double t0 = dt_trace_now_us();
    dt_trace_span("t", span, t0, dt_trace_now_us(), "\"i\":1");
  }
  return NULL;
}

TEST(threads_land_on_separate_named_tracks) {
  dt_trace_reset();
  ASSERT_OK(dt_trace_enable(3));
  const double t0 = dt_trace_now_us();
  dt_trace_span("t", "main work", t0, dt_trace_now_us(), NULL);
  pthread_t th[3];
  char *names[3] = {"loader", "comm", "worker"};
  for (int i = 0; i < 3; i++) ASSERT_EQ(pthread_create(&th[i], NULL, named_thread, names[i]), 0);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  uint64_t kept = 0;
  dt_trace_stats(&kept, NULL);
  ASSERT_EQ(kept, 1 + 3 * THREAD_SPANS);
  char *arr = serialize_array();
  ASSERT(arr);
  ASSERT(json_valid(arr));
  ASSERT(strstr(arr, "\"name\":\"process_name\",\"args\":{\"name\":\"rank 3\"}"));
  int tids[4] = {tid_named(arr, 3, "main"), tid_named(arr, 3, "loader"), tid_named(arr, 3, "comm"),
                 tid_named(arr, 3, "worker")};
  for (int i = 0; i < 4; i++) {
    ASSERT_MSG(tids[i] > 0, arr);
    for (int j = 0; j < i; j++) ASSERT(tids[i] != tids[j]);
  }
  ASSERT_EQ(tid_named(arr, 3, "main"), 1); /* the enabling thread has the first track */
  ASSERT_EQ(events_on(arr, 3, tids[0], "main work"), 1);
  for (int i = 0; i < 3; i++) {
    char span[64];
    snprintf(span, sizeof span, "%s work", names[i]);
    ASSERT_EQ(events_on(arr, 3, tids[i + 1], span), THREAD_SPANS);
    ASSERT_EQ(events_on(arr, 3, -1, span), THREAD_SPANS);
  }
  free(arr);
  dt_trace_reset();
}

TEST(renaming_a_recording_thread_renames_its_track) {
  dt_trace_reset();
  ASSERT_OK(dt_trace_enable(0));
  const double t = dt_trace_now_us();
  dt_trace_span("t", "x", t, t + 1, NULL);
  dt_trace_thread_name("trainer");
  char *arr = serialize_array();
  ASSERT(arr);
  ASSERT_EQ(tid_named(arr, 0, "trainer"), 1);
  ASSERT_EQ(tid_named(arr, 0, "main"), -1);
  free(arr);
  dt_trace_reset();
  dt_trace_thread_name("main");
}

TEST(cap_counts_dropped_events) {
  dt_trace_reset();
  setenv("DT_TRACE_MAX_EVENTS", "10", 1);
  dt_status st = dt_trace_enable(0);
  unsetenv("DT_TRACE_MAX_EVENTS");
  ASSERT_OK(st);
  const double t = dt_trace_now_us();
  for (int i = 0; i < 25; i++) dt_trace_span("t", "capped", t + i, t + i + 0.5, NULL);
  uint64_t kept = 0, dropped = 0;
  dt_trace_stats(&kept, &dropped);
  ASSERT_EQ(kept, 10);
  ASSERT_EQ(dropped, 15);
  char *arr = serialize_array();
  ASSERT(arr);
  ASSERT(json_valid(arr));
  ASSERT_EQ(count_of(arr, "\"name\":\"capped\""), 10);
  ASSERT(strstr(arr, "\"events\":10,\"dropped_events\":15,\"max_events\":10"));
  ASSERT(strstr(arr, "\"name\":\"process_labels\",\"args\":{\"labels\":\"dropped 15 events"));
  free(arr);
  /* malformed caps are refused */
  dt_trace_reset();
  setenv("DT_TRACE_MAX_EVENTS", "0", 1);
  ASSERT_STATUS(dt_trace_enable(0), DT_INVALID_ARGUMENT);
  setenv("DT_TRACE_MAX_EVENTS", "lots", 1);
  ASSERT_STATUS(dt_trace_enable(0), DT_INVALID_ARGUMENT);
  unsetenv("DT_TRACE_MAX_EVENTS");
  ASSERT(!dt_trace_enabled());
}

/* Escapes, async pairs, instants, nesting preserved by rounding. */
TEST(serialized_output_is_valid_json) {
  dt_trace_reset();
  ASSERT_OK(dt_trace_enable(1));
  dt_trace_thread_name("odd \"name\"\\\n\t\x01");
  const double t = dt_trace_now_us();
  dt_trace_span("cat \"q\"", "back\\slash \"quoted\" \n newline \x1f ctl caf\xc3\xa9", t, t + 10.3333,
                "\"bytes\":4096,\"dtype\":\"f32\"");
  dt_trace_span("nn", "outer", t + 100.0001, t + 200.9999, NULL);
  dt_trace_span("nn", "inner", t + 100.0001, t + 200.9999, "");
  dt_trace_span("nn", "backwards clock", t + 300, t + 299, NULL);
  dt_trace_async("ddp", "bucket 0", t + 5, t + 50, "\"bytes\":8");
  dt_trace_async("ddp", "bucket 1", t + 6, t + 60, NULL);
  dt_trace_instant("train", "epoch", t + 7, "\"epoch\":1");
  uint64_t kept = 0;
  dt_trace_stats(&kept, NULL);
  ASSERT_EQ(kept, 7);
  char *arr = serialize_array();
  ASSERT(arr);
  ASSERT_MSG(json_valid(arr), arr);
  ASSERT(strstr(arr, "\\\"quoted\\\""));
  ASSERT(strstr(arr, "\\u001f"));
  ASSERT(strstr(arr, "\"args\":{\"bytes\":4096,\"dtype\":\"f32\"}"));
  ASSERT(strstr(arr, "\"dur\":0.000,\"cat\":\"nn\",\"name\":\"backwards clock\""));
  ASSERT_EQ(count_of(arr, "\"ph\":\"b\""), 2);
  ASSERT_EQ(count_of(arr, "\"ph\":\"e\""), 2);
  ASSERT_EQ(count_of(arr, "\"ph\":\"i\",\"s\":\"t\""), 1);
  ASSERT_EQ(count_of(arr, "\"id\":\"0x1\""), 2);
  ASSERT_EQ(count_of(arr, "\"id\":\"0x2\""), 2);
  /* the C validator must reject what it should */
  ASSERT(!json_valid("[{\"a\":1,}]"));
  ASSERT(!json_valid("[\"a\nb\"]"));
  ASSERT(!json_valid("[1.]"));
  ASSERT(!json_valid("[{\"a\":1}"));
  ASSERT(json_valid("[{\"a\":-1.5e3,\"b\":[true,false,null],\"c\":\"\\u00e9\"}]"));
  if (have_python()) {
    char dir[64], path[128];
    snprintf(dir, sizeof dir, "%s", make_tmpdir());
    snprintf(path, sizeof path, "%s/events.json", dir);
    FILE *f = fopen(path, "wb");
    ASSERT(f);
    fputs(arr, f);
    fclose(f);
    const char *code =
        "import json,sys\n"
        "ev=json.load(open(sys.argv[1],encoding=\"utf-8\"))\n"
        "x={e[\"name\"]:e for e in ev if e[\"ph\"]==\"X\"}\n"
        "o,i=x[\"outer\"],x[\"inner\"]\n"
        "assert o[\"ts\"]==i[\"ts\"] and o[\"dur\"]==i[\"dur\"]\n"
        "assert abs(x[\"back\\\\slash \\\"quoted\\\" \\n newline \\x1f ctl caf\\u00e9\"][\"dur\"]-10.333)<0.05\n"
        "assert all(e[\"pid\"]==1 for e in ev)\n"
        "b=sorted((e[\"id\"],e[\"name\"]) for e in ev if e[\"ph\"]==\"b\")\n"
        "assert b==sorted((e[\"id\"],e[\"name\"]) for e in ev if e[\"ph\"]==\"e\"), b\n"
        "names=[e[\"args\"][\"name\"] for e in ev if e[\"ph\"]==\"M\" and e[\"name\"]==\"thread_name\"]\n"
        "assert names==[\"odd \\\"name\\\"\\\\\\n\\t\\x01\"], names\n";
    int rc = python_check(code, path, NULL);
    remove_tree(dir);
    ASSERT_EQ(rc, 0);
  }
  free(arr);
  dt_trace_reset();
  dt_trace_thread_name("main");
}

/* ---- instrumented library code --------------------------------------------------------- */

/* An IDX file: header for (ndim, dims), then data bytes. */
static int write_idx(const char *path, int ndim, const uint32_t *dims, const uint8_t *data, size_t n) {
  uint8_t head[16] = {0, 0, 0x08, (uint8_t)ndim};
  for (int d = 0; d < ndim; d++)
    for (int k = 0; k < 4; k++) head[4 + 4 * d + k] = (uint8_t)(dims[d] >> (24 - 8 * k));
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(head, 1, 4 + 4 * (size_t)ndim, f) == 4 + 4 * (size_t)ndim && fwrite(data, 1, n, f) == n;
  return fclose(f) == 0 && ok ? 0 : -1;
}

TEST(model_and_loader_record_spans) {
  dt_trace_reset();
  ASSERT_OK(dt_trace_enable(0));
  /* conv -> bn -> relu -> pool (one fused group) -> flatten -> linear */
  static const int64_t shape[3] = {1, 8, 8};
  dt_model *m = NULL;
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_conv2d(m, "conv", 4, 3, 1, 1, 1));
  ASSERT_OK(dt_model_add_batchnorm2d(m, "bn", 1e-5f, 0.1f));
  ASSERT_OK(dt_model_add_activation(m, "relu", DT_RELU));
  ASSERT_OK(dt_model_add_maxpool2d(m, "pool", 2, 2, 0));
  ASSERT_OK(dt_model_add_flatten(m, "flat"));
  ASSERT_OK(dt_model_add_linear(m, "fc", 10, 1));
  ASSERT_OK(dt_model_build(m, 4, 1));
  dt_model_set_training(m, 1);
  float x[4 * 64], dl[4 * 10];
  for (int i = 0; i < 4 * 64; i++) x[i] = (float)(i % 7) - 3;
  for (int i = 0; i < 4 * 10; i++) dl[i] = 0.01f * (float)(i % 5);
  const float *out;
  ASSERT_OK(dt_model_forward(m, x, 4, &out));
  ASSERT_OK(dt_model_backward(m, dl));
  dt_model_free(m);

  /* 10 samples of 2 x 3 in batches of 4: 3 batches on the loader thread */
  char dir[64], path[128];
  snprintf(dir, sizeof dir, "%s", make_tmpdir());
  uint8_t img[10 * 6], lab[10];
  for (int i = 0; i < 60; i++) img[i] = (uint8_t)(i * 7);
  for (int i = 0; i < 10; i++) lab[i] = (uint8_t)(i % 10);
  const uint32_t idims[3] = {10, 2, 3}, ldims[1] = {10};
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", dir);
  ASSERT_EQ(write_idx(path, 3, idims, img, sizeof img), 0);
  snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte", dir);
  ASSERT_EQ(write_idx(path, 1, ldims, lab, sizeof lab), 0);
  dt_dataset *ds = NULL;
  dt_status st = dt_dataset_load(dir, DT_SPLIT_TRAIN, NULL, &ds);
  remove_tree(dir);
  ASSERT_OK(st);
  dt_loader_config lc = {.batch_size = 4, .prefetch = 1};
  dt_loader *l = NULL;
  ASSERT_OK(dt_loader_new(ds, &lc, &l));
  ASSERT_OK(dt_loader_start_epoch(l, 0));
  dt_batch b;
  int batches = 0;
  for (;;) {
    ASSERT_OK(dt_loader_next(l, &b));
    if (!b.size) break;
    batches++;
  }
  dt_loader_free(l);
  dt_dataset_free(ds);
  ASSERT_EQ(batches, 3);

  char *arr = serialize_array();
  ASSERT(arr);
  ASSERT(json_valid(arr));
  const int main_tid = tid_named(arr, 0, "main"), loader_tid = tid_named(arr, 0, "loader");
  ASSERT(main_tid > 0 && loader_tid > 0 && main_tid != loader_tid);
  ASSERT_EQ(events_on(arr, 0, main_tid, "forward"), 1);
  ASSERT_EQ(events_on(arr, 0, main_tid, "backward fc"), 1);
  ASSERT_EQ(events_on(arr, 0, main_tid, "backward conv+bn+relu+pool"), 1); /* a fused group: one span */
  ASSERT_EQ(events_on(arr, 0, main_tid, "forward conv+bn+relu+pool"), 1);
  ASSERT_EQ(events_on(arr, 0, loader_tid, "load batch"), 3);
  ASSERT(strstr(arr, "\"name\":\"load batch\",\"args\":{\"batch\":2,\"first\":0,\"samples\":2}"));
  ASSERT(strstr(arr, "\"name\":\"backward conv+bn+relu+pool\",\"args\":{\"kind\":\"Conv2d\""));
  free(arr);
  dt_trace_reset();
}

/* DataParallel: each worker's share of the gradients' sum and of the update is a span on its own thread; a fused step
 * records one span a worker, an unfused one a reduce and an update a worker. A budget of one thread a worker: the
 * calling thread is worker 0 (dt_dp's inline0). */
TEST(dp_workers_record_their_shares) {
  const int budget = dt_get_threads();
  ASSERT_OK(dt_set_threads(2));
  dt_trace_reset();
  ASSERT_OK(dt_trace_enable(0));
  static const int64_t shape[3] = {1, 4, 4};
  dt_model *m = NULL;
  dt_dp *dp = NULL;
  dt_optim *o = NULL;
  dt_task *t = NULL;
  dt_optim_config oc;
  dt_optim_config_default(DT_OPTIM_SGD, &oc);
  const dt_task_config tc = {.kind = DT_TASK_CLASSIFICATION, .outputs = 10};
  ASSERT_OK(dt_model_new(3, shape, &m));
  ASSERT_OK(dt_model_add_flatten(m, "flat"));
  ASSERT_OK(dt_model_add_linear(m, "fc", 10, 1));
  ASSERT_OK(dt_model_build(m, 4, 1));
  dt_model_set_training(m, 1);
  ASSERT_OK(dt_dp_new(m, 2, 4, &dp));
  ASSERT_OK(dt_optim_new(&oc, dt_model_num_params(m), &o));
  ASSERT_OK(dt_task_new(&tc, &t));
  float x[4 * 16];
  int32_t y[4] = {1, 2, 3, 4};
  for (int i = 0; i < 4 * 16; i++) x[i] = (float)(i % 5) - 2;
  for (int fused = 1; fused >= 0; fused--) {
    dt_dp_set_fused_step(dp, fused);
    dt_model_zero_grad_deferred(m);
    ASSERT_OK(dt_dp_train_step(dp, t, x, y, 4, NULL, NULL));
    ASSERT_OK(dt_dp_optim_step(dp, o, 0.1f));
  }
  dt_task_free(t);
  dt_optim_free(o);
  dt_dp_free(dp);
  dt_model_free(m);
  ASSERT_OK(dt_set_threads(budget));

  char *arr = serialize_array();
  ASSERT(arr);
  ASSERT(json_valid(arr));
  const int main_tid = tid_named(arr, 0, "main");
  static const char *const names[] = {"dp reduce + optimizer share", "dp reduce", "dp optimizer share"};
  for (int k = 0; k < 3; k++) {
    ASSERT_EQ(events_on(arr, 0, -1, names[k]), 2);
    ASSERT_EQ(events_on(arr, 0, main_tid, names[k]), 1); /* the calling thread is worker 0 */
  }
  free(arr);
  dt_trace_reset();
}

/* ---- merging ---------------------------------------------------------------------------- */

TEST(merge_alone_writes_one_valid_file) {
  dt_trace_reset();
  ASSERT_OK(dt_trace_enable(0));
  const double t = dt_trace_now_us();
  for (int i = 0; i < 5; i++) dt_trace_span("t", "alone", t + i, t + i + 0.5, NULL);
  char dir[64], path[128];
  snprintf(dir, sizeof dir, "%s", make_tmpdir());
  snprintf(path, sizeof path, "%s/trace.json", dir);
  ASSERT_OK(dt_trace_write_merged(NULL, path));
  ASSERT_EQ(dir_entries(dir), 1); /* no temporary left */
  char *text = read_text(path);
  ASSERT(text);
  ASSERT(json_valid(text));
  ASSERT(!strncmp(text, "{\"traceEvents\":[\n", 17));
  ASSERT_EQ(count_of(text, "\"name\":\"alone\""), 5);
  ASSERT(strstr(text, "\"displayTimeUnit\":\"ms\""));
  ASSERT(strstr(text, "\"ranks\":1,\"events\":5,\"dropped_events\":0,\"events_per_rank\":[5],\"dropped_per_rank\":[0]"));
  free(text);
  /* written again over the old file, still one entry */
  ASSERT_OK(dt_trace_write_merged(NULL, path));
  ASSERT_EQ(dir_entries(dir), 1);
  remove_tree(dir);
  dt_trace_reset();
}

TEST(merge_to_unwritable_path_fails_and_leaves_nothing) {
  dt_trace_reset();
  ASSERT_OK(dt_trace_enable(0));
  const double t = dt_trace_now_us();
  dt_trace_span("t", "x", t, t + 1, NULL);
  char dir[64], path[160];
  snprintf(dir, sizeof dir, "%s", make_tmpdir());
  /* a missing directory */
  snprintf(path, sizeof path, "%s/missing/trace.json", dir);
  ASSERT_STATUS(dt_trace_write_merged(NULL, path), DT_IO);
  ASSERT_MSG(strstr(dt_last_error(), path) != NULL, dt_last_error());
  ASSERT_EQ(dir_entries(dir), 0);
  /* path is a directory: the temporary is written, the rename fails, the temporary goes */
  snprintf(path, sizeof path, "%s/taken", dir);
  ASSERT_EQ(mkdir(path, 0777), 0);
  ASSERT_STATUS(dt_trace_write_merged(NULL, path), DT_IO);
  ASSERT_MSG(strstr(dt_last_error(), path) != NULL, dt_last_error());
  ASSERT_EQ(dir_entries(dir), 1);
  ASSERT_EQ(dir_entries(path), 0);
  /* an existing good file is left as it was */
  char good[160];
  snprintf(good, sizeof good, "%s/good.json", dir);
  FILE *f = fopen(good, "wb");
  ASSERT(f);
  fputs("old", f);
  fclose(f);
  snprintf(path, sizeof path, "%s/good.json/sub", dir); /* ENOTDIR */
  ASSERT_STATUS(dt_trace_write_merged(NULL, path), DT_IO);
  char *text = read_text(good);
  ASSERT(text && !strcmp(text, "old"));
  free(text);
  ASSERT_EQ(dir_entries(dir), 2);
  ASSERT_STATUS(dt_trace_write_merged(NULL, ""), DT_INVALID_ARGUMENT);
  remove_tree(dir);
  dt_trace_reset();
}

typedef struct merge_arg {
  const char *path, *bad_path;
} merge_arg;

#define CLASSES 10

/* One rank: DDP steps on a small MLP (model, DDP and group spans), a collective
 * left to the communication thread, a few spans of its own, then the merge. */
static int merge_child(df_job *j, int r, int world, void *user) {
  const merge_arg *a = user;
  dt_trace_reset(); /* what the parent recorded is not ours */
  if (dt_trace_enable(r) != DT_OK) return 2;
  dt_group *g = NULL;
  if (df_join(j, r, world, &g) != DT_OK) {
    fprintf(stderr, "rank %d: join: %s\n", r, dt_last_error());
    return 3;
  }
  static const int hidden[] = {32, 16};
  dt_zoo_config zc = {.ndim = 3, .input_shape = {1, 8, 8}, .outputs = CLASSES, .hidden = hidden, .n_hidden = 2, .dropout = 0};
  dt_model *m = NULL;
  dt_ddp *d = NULL;
  dt_ddp_config dc;
  dt_ddp_config_default(&dc);
  dc.first_bucket_mb = 0.001; /* several buckets on a small model */
  dc.bucket_cap_mb = 0.004;
  int rc = 0;
  if (dt_model_zoo_new("mlp", &zc, &m) != DT_OK || dt_model_build(m, 4, 7) != DT_OK || dt_ddp_new(m, g, &dc, &d) != DT_OK) {
    fprintf(stderr, "rank %d: model/ddp: %s\n", r, dt_last_error());
    rc = 4;
    goto out;
  }
  float x[4 * 64], dl[4 * CLASSES], loss;
  int32_t y[4] = {1, 2, 3, 4};
  for (int i = 0; i < 4 * 64; i++) x[i] = (float)((i * 13 + r) % 11) / 11.0f;
  for (int s = 0; s < 2 && !rc; s++) {
    const float *logits;
    dt_model_zero_grad(m);
    if (dt_ddp_before_forward(d) != DT_OK || dt_model_forward(m, x, 4, &logits) != DT_OK ||
        dt_loss_cross_entropy(logits, y, 4, CLASSES, 0.0f, &loss, dl) != DT_OK || dt_model_backward(m, dl) != DT_OK ||
        dt_ddp_finish(d) != DT_OK) {
      fprintf(stderr, "rank %d step %d: %s\n", r, s, dt_last_error());
      rc = 5;
    }
  }
  /* A collective the communication thread runs (polled, never waited on, so this thread cannot run it). */
  float v[16] = {0};
  dt_work *w = NULL;
  if (!rc && dt_allreduce(g, v, v, 16, DT_F32, DT_SUM, &w) == DT_OK) {
    const double until = dt_time_now() + 30;
    while (!dt_work_test(w) && dt_time_now() < until) {
      struct timespec ts = {0, 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    if (dt_work_wait(w, 0) != DT_OK) rc = 6;
    dt_work_free(w);
  }
  const double t = dt_trace_now_us();
  for (int i = 0; i < 5 + r; i++) dt_trace_span("test", "rank work", t + i, t + i + 0.5, "\"i\":0");
  if (!rc && dt_trace_write_merged(g, a->path) != DT_OK) {
    fprintf(stderr, "rank %d: merge: %s\n", r, dt_last_error());
    rc = 7;
  }
  /* Every rank learns that rank 0 could not write. */
  if (!rc) {
    dt_status st = dt_trace_write_merged(g, a->bad_path);
    if (st != DT_IO) {
      fprintf(stderr, "rank %d: merge to %s gave %s (%s), expected DT_IO\n", r, a->bad_path, dt_status_name(st),
              dt_last_error());
      rc = 8;
    }
  }
out:
  dt_ddp_free(d);
  dt_model_free(m);
  dt_group_destroy(g);
  return rc;
}

TEST(merge_across_three_ranks) {
  enum { WORLD = 3 };
  char dir[64], path[128], bad[160];
  snprintf(dir, sizeof dir, "%s", make_tmpdir());
  snprintf(path, sizeof path, "%s/trace.json", dir);
  snprintf(bad, sizeof bad, "%s/missing/trace.json", dir);
  merge_arg a = {.path = path, .bad_path = bad};
  dt_trace_reset();
  df_job j = {.port = df_start_store(run_id()), .run_id = run_id(), .round = 0, .backend = "shm", .timeout_s = 60};
  ASSERT_EQ(df_run(&j, WORLD, merge_child, &a), 0);
  ASSERT_EQ(dir_entries(dir), 1); /* the trace and nothing else: no temporaries, nothing from the failed write */
  char *text = read_text(path);
  ASSERT(text);
  ASSERT(json_valid(text));
  ASSERT(strstr(text, "\"ranks\":3,"));
  for (int r = 0; r < WORLD; r++) {
    char want[96];
    snprintf(want, sizeof want, "\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}", r, r);
    ASSERT_MSG(strstr(text, want), want);
    ASSERT_EQ(events_on(text, r, -1, "rank work"), 5 + r);
    const int main_tid = tid_named(text, r, "main"), comm_tid = tid_named(text, r, "comm");
    ASSERT(main_tid > 0 && comm_tid > 0 && main_tid != comm_tid);
    ASSERT(events_on(text, r, comm_tid, "allreduce") >= 1);
    ASSERT_EQ(events_on(text, r, main_tid, "forward"), 2);
    ASSERT_EQ(events_on(text, r, main_tid, "backward fc1"), 2);
    ASSERT_EQ(events_on(text, r, main_tid, "backward fc3"), 2);
    ASSERT(events_on(text, r, -1, "bucket 0") == 4); /* two steps, a begin and an end each */
  }
  ASSERT(!strstr(text, "\"pid\":3"));
  if (have_python()) {
    const char *code =
        "import json,sys,collections\n"
        "d=json.load(open(sys.argv[1]))\n"
        "n=int(sys.argv[2]); ev=d[\"traceEvents\"]; o=d[\"otherData\"]\n"
        "assert d[\"displayTimeUnit\"]==\"ms\" and o[\"ranks\"]==n\n"
        "assert {e[\"pid\"] for e in ev}==set(range(n))\n"
        "assert sorted(e[\"pid\"] for e in ev if e[\"ph\"]==\"M\" and e[\"name\"]==\"process_name\")==list(range(n))\n"
        "kept=collections.Counter(e[\"pid\"] for e in ev if e[\"ph\"] in \"Xbi\")\n"
        "assert [kept[r] for r in range(n)]==o[\"events_per_rank\"], (kept,o)\n"
        "assert o[\"events\"]==sum(o[\"events_per_rank\"]) and o[\"dropped_events\"]==0\n"
        "assert all(e[\"dur\"]>=0 and e[\"ts\"]>0 for e in ev if e[\"ph\"]==\"X\")\n"
        "b=sorted((e[\"pid\"],e[\"id\"],e[\"name\"]) for e in ev if e[\"ph\"]==\"b\")\n"
        "assert b and b==sorted((e[\"pid\"],e[\"id\"],e[\"name\"]) for e in ev if e[\"ph\"]==\"e\")\n"
        "ar=[e for e in ev if e.get(\"name\")==\"allreduce\"]\n"
        "assert ar and all(e[\"args\"][\"bytes\"]==4*e[\"args\"][\"count\"] and e[\"args\"][\"dtype\"]==\"f32\" for e in ar)\n"
        "w=collections.Counter(e[\"pid\"] for e in ev if e.get(\"name\")==\"rank work\")\n"
        "assert [w[r] for r in range(n)]==[5+r for r in range(n)], w\n";
    ASSERT_EQ(python_check(code, path, "3"), 0);
    ASSERT(python_check(code, path, "4 2>/dev/null") != 0); /* the checks do check */
  }
  free(text);
  remove_tree(dir);
}

TEST_MAIN(TEST_ENTRY(disabled_records_nothing), TEST_ENTRY(threads_land_on_separate_named_tracks),
          TEST_ENTRY(renaming_a_recording_thread_renames_its_track), TEST_ENTRY(cap_counts_dropped_events),
          TEST_ENTRY(serialized_output_is_valid_json), TEST_ENTRY(model_and_loader_record_spans),
          TEST_ENTRY(dp_workers_record_their_shares),
          TEST_ENTRY(merge_alone_writes_one_valid_file), TEST_ENTRY(merge_to_unwritable_path_fails_and_leaves_nothing),
          TEST_ENTRY(merge_across_three_ranks))

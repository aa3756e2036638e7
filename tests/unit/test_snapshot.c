/* Tests of snapshots and resume: bit-exact continuation (epoch and mid-epoch, single and dp), fallback past damaged files, clear errors. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "train/train_impl.h"

#define DT_TEST_NAME "snapshot"
#include "synthetic_data.h"

/* mlp 64 -> 32 -> 10 with dropout, Adam: every piece of state a resume must restore matters. */
static void config(dt_train_config *c, const char *out) {
  dt_train_config_default(c);
  c->model = "mlp";
  c->hidden[0] = 32;
  c->n_hidden = 1;
  c->dropout = 0.3f;
  c->data = synthetic_data();
  c->epochs = 4;
  c->batch_size = 20; /* 200 samples: 10 steps per epoch */
  c->optim.kind = DT_OPTIM_ADAM;
  dt_optim_config_default(DT_OPTIM_ADAM, &c->optim);
  c->lr = 0.01f;
  c->threads = 1;
  c->seed = 11;
  c->out_dir = out;
  c->keep = 100;
}

static char *dir_of(const char *name) {
  static char buf[8][400];
  static int next;
  char *b = buf[next++ % 8];
  snprintf(b, 400, "%s/%s", synthetic_data(), name);
  return b;
}

static char *file_in(const char *dir, const char *name) {
  static char buf[8][600];
  static int next;
  char *b = buf[next++ % 8];
  snprintf(b, 600, "%s/%s", dir, name);
  return b;
}

static char *snap_in(const char *dir, int step) {
  static char buf[8][600];
  static int next;
  char *b = buf[next++ % 8];
  snprintf(b, 600, "%s/snapshots/step-%09d.safetensors", dir, step);
  return b;
}

static int run(const dt_train_config *c) {
  dt_train_result r;
  dt_status st = dt_train_run(c, &r);
  if (st != DT_OK) fprintf(stderr, "  dt_train_run: %s: %s\n", dt_status_name(st), dt_last_error());
  return st == DT_OK ? 0 : -1;
}

/* 1 when every tensor of a's model.safetensors has the same bytes in b's. */
static int same_weights(const char *dir_a, const char *dir_b) {
  dt_safetensors *a = NULL, *b = NULL;
  int same = 0;
  if (dt_safetensors_load(file_in(dir_a, "model.safetensors"), &a) != DT_OK ||
      dt_safetensors_load(file_in(dir_b, "model.safetensors"), &b) != DT_OK)
    goto out;
  if (dt_safetensors_count(a) != dt_safetensors_count(b)) goto out;
  for (int i = 0; i < dt_safetensors_count(a); i++) {
    dt_named_tensor ta, tb;
    if (dt_safetensors_get(a, i, &ta) != DT_OK || dt_safetensors_find(b, ta.name, &tb) != DT_OK) goto out;
    size_t n = dt_tensor_bytes(&ta.tensor);
    if (n != dt_tensor_bytes(&tb.tensor) || memcmp(ta.tensor.data, tb.tensor.data, n) != 0) {
      fprintf(stderr, "  %s differs\n", ta.name);
      goto out;
    }
  }
  same = 1;
out:
  dt_safetensors_free(a);
  dt_safetensors_free(b);
  return same;
}

/* The first n comma-separated fields of every line of a file (the metrics without timings). */
static int read_fields(const char *path, int n, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t pos = 0;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    int commas = 0;
    for (char *c = line; *c && *c != '\n'; c++) {
      if (*c == ',' && ++commas == n) break;
      if (pos + 2 < len) buf[pos++] = *c;
    }
    if (pos + 2 < len) buf[pos++] = '\n';
  }
  buf[pos] = '\0';
  fclose(f);
  return 0;
}

static int copy_file(const char *from, const char *to) {
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
  return system(cmd);
}

static void fresh_dir(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/snapshots'", dir, dir);
  if (system(cmd) != 0) fprintf(stderr, "  cannot make %s\n", dir);
}

static int count_snapshots(const char *dir, int *tmp) {
  DIR *d = opendir(file_in(dir, "snapshots"));
  int n = 0;
  *tmp = 0;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    n += strncmp(e->d_name, "step-", 5) == 0 && strstr(e->d_name, ".tmp") == NULL;
    *tmp += strstr(e->d_name, ".tmp") != NULL;
  }
  closedir(d);
  return n;
}

/* The reference: 4 epochs straight, a snapshot after every epoch and every 7 steps. */
static const char *reference(void) {
  static int done;
  const char *dir = dir_of("straight");
  if (!done) {
    dt_train_config c;
    config(&c, dir);
    c.save_every = 1;
    c.save_every_steps = 7;
    done = run(&c) == 0;
  }
  return dir;
}

TEST(straight_run_writes_snapshots_on_schedule) {
  const char *a = reference();
  int tmp;
  /* epochs end at steps 10, 20, 30, 40; multiples of 7: 7, 14, 21, 28, 35 */
  ASSERT_EQ(count_snapshots(a, &tmp), 9);
  ASSERT_EQ(tmp, 0);
  char path[600];
  int64_t step;
  ASSERT_OK(dt_snapshot_find(a, INT64_MAX, path, sizeof path, &step));
  ASSERT_EQ(step, 40);
  ASSERT_OK(dt_snapshot_find(a, 40, path, sizeof path, &step));
  ASSERT_EQ(step, 35);
  ASSERT_STATUS(dt_snapshot_find(a, 7, path, sizeof path, &step), DT_NOT_FOUND);
  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_load(snap_in(a, 14), &f));
  ASSERT_STR_EQ(dt_safetensors_meta(f, "dtrain.snapshot"), "1");
  ASSERT_STR_EQ(dt_safetensors_meta(f, "model"), "mlp");
  ASSERT_STR_EQ(dt_safetensors_meta(f, "step"), "14");
  ASSERT(dt_safetensors_meta(f, "config") && strstr(dt_safetensors_meta(f, "config"), "\"optimizer\":\"adam\""));
  dt_named_tensor t;
  ASSERT_OK(dt_safetensors_find(f, "optimizer.state.fc1.weight.exp_avg_sq", &t));
  ASSERT_EQ(t.tensor.ndim, 2);
  ASSERT_EQ(t.tensor.shape[0], 32);
  ASSERT_OK(dt_safetensors_find(f, "trainer.position", &t));
  const int64_t *pos = t.tensor.data;
  ASSERT_EQ(pos[0], 1); /* epoch 2 ... */
  ASSERT_EQ(pos[1], 4); /* ... after 4 of its steps */
  ASSERT_EQ(pos[2], 14);
  ASSERT_OK(dt_safetensors_find(f, "optimizer.step", &t));
  ASSERT_EQ(*(const int64_t *)t.tensor.data, 14);
  ASSERT_OK(dt_safetensors_find(f, "trainer.history", &t));
  ASSERT_EQ(t.tensor.shape[0], 1);
  dt_safetensors_free(f);
}

TEST(half_then_resume_equals_straight) {
  const char *a = reference(), *b = dir_of("halves");
  dt_train_config c;
  config(&c, b);
  c.epochs = 2;
  c.save_every = 1;
  ASSERT_EQ(run(&c), 0);
  config(&c, b);
  c.resume = "auto";
  c.save_every = 1;
  dt_train_result r;
  ASSERT_OK(dt_train_run(&c, &r));
  ASSERT_EQ(r.resumed_epoch, 2);
  ASSERT_EQ(r.resumed_step, 20);
  ASSERT_EQ(r.epochs_done, 4);
  ASSERT_EQ(r.steps, 40);
  ASSERT(same_weights(a, b));
  /* The metrics files hold the same four rows (timings aside). */
  char ma[4096], mb[4096];
  ASSERT_EQ(read_fields(file_in(a, "metrics.csv"), 8, ma, sizeof ma), 0);
  ASSERT_EQ(read_fields(file_in(b, "metrics.csv"), 8, mb, sizeof mb), 0);
  ASSERT_STR_EQ(ma, mb);
}

TEST(resume_mid_epoch_equals_straight) {
  const char *a = reference();
  static const int steps[] = {7, 21, 35};
  for (int i = 0; i < 3; i++) {
    const char *b = dir_of("mid");
    fresh_dir(b);
    ASSERT_EQ(copy_file(snap_in(a, steps[i]), file_in(b, "from.safetensors")), 0);
    dt_train_config c;
    config(&c, b);
    c.resume = file_in(b, "from.safetensors");
    dt_train_result r;
    ASSERT_OK(dt_train_run(&c, &r));
    ASSERT_EQ(r.resumed_step, steps[i]);
    ASSERT_MSG(same_weights(a, b), "resumed at a step snapshot");
    char ma[4096], mb[4096];
    ASSERT_EQ(read_fields(file_in(a, "metrics.csv"), 8, ma, sizeof ma), 0);
    ASSERT_EQ(read_fields(file_in(b, "metrics.csv"), 8, mb, sizeof mb), 0);
    ASSERT_STR_EQ(ma, mb);
  }
}

TEST(dp_and_cosine_schedule_resume_exactly) {
  const char *a = dir_of("dp_straight"), *b = dir_of("dp_resumed");
  dt_train_config c;
  config(&c, a);
  c.strategy = DT_STRATEGY_DP;
  c.workers = 3;
  c.schedule = DT_SCHED_COSINE;
  c.optim.kind = DT_OPTIM_SGD;
  dt_optim_config_default(DT_OPTIM_SGD, &c.optim);
  c.optim.momentum = 0.9f;
  c.save_every_steps = 13;
  ASSERT_EQ(run(&c), 0);
  fresh_dir(b);
  ASSERT_EQ(copy_file(snap_in(a, 26), snap_in(b, 26)), 0);
  c.out_dir = b;
  c.resume = "auto";
  ASSERT_EQ(run(&c), 0);
  ASSERT(same_weights(a, b));
}

TEST(auto_falls_back_past_damaged_snapshots) {
  const char *a = reference(), *b = dir_of("damaged");
  fresh_dir(b);
  ASSERT_EQ(copy_file(snap_in(a, 28), snap_in(b, 28)), 0);
  ASSERT_EQ(copy_file(snap_in(a, 30), snap_in(b, 30)), 0);
  ASSERT_EQ(copy_file(snap_in(a, 35), snap_in(b, 35)), 0);
  /* step 35 cut short (a crash mid-copy), step 30 with one flipped data byte (a bad disk) */
  ASSERT_EQ(truncate(snap_in(b, 35), 5000), 0);
  FILE *f = fopen(snap_in(b, 30), "r+b");
  ASSERT(f != NULL);
  fseek(f, -100, SEEK_END);
  int ch = fgetc(f);
  fseek(f, -100, SEEK_END);
  fputc(ch ^ 0x40, f);
  fclose(f);
  dt_train_config c;
  config(&c, b);
  c.resume = "auto";
  dt_train_result r;
  ASSERT_OK(dt_train_run(&c, &r));
  ASSERT_EQ(r.resumed_step, 28);
  ASSERT(same_weights(a, b));
  /* Given by path, a damaged snapshot is an error naming it, not a fallback. */
  c.resume = snap_in(b, 30);
  ASSERT_STATUS(dt_train_run(&c, &r), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "step-000000030") != NULL);
  /* None loadable: an error, never a silent fresh start. */
  ASSERT_EQ(unlink(snap_in(b, 28)), 0);
  c.resume = "auto";
  ASSERT_STATUS(dt_train_run(&c, &r), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "none of the 2 snapshot") != NULL);
  /* An empty directory: auto starts afresh. */
  const char *e = dir_of("empty");
  fresh_dir(e);
  config(&c, e);
  c.resume = "auto";
  ASSERT_OK(dt_train_run(&c, &r));
  ASSERT_EQ(r.resumed_epoch, -1);
  ASSERT(same_weights(a, e));
}

TEST(snapshot_of_another_run_is_a_clear_error) {
  const char *a = reference(), *b = dir_of("other");
  fresh_dir(b);
  dt_train_config c;
  dt_train_result r;
  config(&c, b);
  c.hidden[0] = 48;
  c.resume = snap_in(a, 20);
  ASSERT_STATUS(dt_train_run(&c, &r), DT_SHAPE_MISMATCH);
  ASSERT(strstr(dt_last_error(), "fc1.weight") != NULL);
  ASSERT(strstr(dt_last_error(), "step-000000020") != NULL);
  config(&c, b);
  c.optim.kind = DT_OPTIM_SGD;
  dt_optim_config_default(DT_OPTIM_SGD, &c.optim);
  c.optim.momentum = 0.9f;
  c.resume = snap_in(a, 20);
  ASSERT_STATUS(dt_train_run(&c, &r), DT_SHAPE_MISMATCH);
  ASSERT(strstr(dt_last_error(), "optimizer") != NULL);
  config(&c, b);
  c.resume = file_in(a, "model.safetensors");
  ASSERT_STATUS(dt_train_run(&c, &r), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "not a dtrain snapshot") != NULL);
  /* A mid-epoch snapshot cannot continue with another batch size (the epoch is cut differently). */
  config(&c, b);
  c.batch_size = 25;
  c.resume = snap_in(a, 14);
  ASSERT_STATUS(dt_train_run(&c, &r), DT_MISMATCH);
  ASSERT(strstr(dt_last_error(), "--batch-size") != NULL);
  config(&c, b);
  c.resume = file_in(b, "no-such.safetensors");
  ASSERT(dt_train_run(&c, &r) != DT_OK);
  ASSERT(strstr(dt_last_error(), "no-such.safetensors") != NULL);
}

TEST(keep_deletes_the_oldest) {
  const char *b = dir_of("keep");
  fresh_dir(b);
  dt_train_config c;
  config(&c, b);
  c.save_every = 1;
  c.keep = 2;
  ASSERT_EQ(run(&c), 0);
  int tmp;
  ASSERT_EQ(count_snapshots(b, &tmp), 2);
  ASSERT_EQ(access(snap_in(b, 40), F_OK), 0);
  ASSERT_EQ(access(snap_in(b, 30), F_OK), 0);
}

TEST(export_keeps_weights_only_and_snapshots_evaluate) {
  const char *a = reference();
  const char *out = file_in(dir_of("straight"), "exported.safetensors");
  ASSERT_OK(dt_snapshot_export(snap_in(a, 40), out));
  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_load(out, &f));
  ASSERT_EQ(dt_safetensors_count(f), 4); /* fc1, fc2 weight and bias */
  for (int i = 0; i < dt_safetensors_count(f); i++) {
    dt_named_tensor t;
    ASSERT_OK(dt_safetensors_get(f, i, &t));
    ASSERT(strncmp(t.name, "fc", 2) == 0);
  }
  ASSERT(dt_safetensors_meta(f, "dtrain.snapshot") == NULL);
  ASSERT_STR_EQ(dt_safetensors_meta(f, "model"), "mlp");
  dt_safetensors_free(f);
  /* The final snapshot holds the final weights; both evaluate like model.safetensors. */
  dt_eval_config ec;
  dt_eval_result r1, r2, r3;
  dt_eval_config_default(&ec);
  ec.data = synthetic_data();
  ec.threads = 1;
  ec.weights = file_in(a, "model.safetensors");
  ASSERT_OK(dt_eval_run(&ec, &r1));
  ec.weights = out;
  ASSERT_OK(dt_eval_run(&ec, &r2));
  ec.weights = snap_in(a, 40);
  ASSERT_OK(dt_eval_run(&ec, &r3));
  ASSERT_EQ(r1.loss, r2.loss);
  ASSERT_EQ(r1.loss, r3.loss);
  ASSERT(dt_snapshot_export(file_in(a, "no-such"), out) != DT_OK);
}

TEST(failed_snapshot_write_keeps_the_previous_one) {
  const char *b = dir_of("full");
  fresh_dir(b);
  dt_train_config c;
  config(&c, b);
  c.epochs = 1;
  c.save_every = 1;
  ASSERT_EQ(run(&c), 0);
  /* A disk that fills up: writes past 20 KB fail (EFBIG, as ENOSPC would). */
  struct rlimit old, small = {20000, 20000};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, SIG_IGN);
  small.rlim_max = old.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  config(&c, b);
  c.epochs = 2;
  c.save_every = 1;
  c.resume = "auto";
  dt_train_result r;
  dt_status st = dt_train_run(&c, &r);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, SIG_DFL);
  ASSERT_STATUS(st, DT_IO);
  ASSERT(strstr(dt_last_error(), b) != NULL);
  int tmp;
  ASSERT_EQ(count_snapshots(b, &tmp), 1);
  ASSERT_EQ(tmp, 0);
  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_load(snap_in(b, 10), &f));
  dt_safetensors_free(f);
}

TEST(cleanup_synthetic_data) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", synthetic_data());
  ASSERT_EQ(system(cmd), 0);
}

TEST_MAIN(TEST_ENTRY(straight_run_writes_snapshots_on_schedule), TEST_ENTRY(half_then_resume_equals_straight),
          TEST_ENTRY(resume_mid_epoch_equals_straight), TEST_ENTRY(dp_and_cosine_schedule_resume_exactly),
          TEST_ENTRY(auto_falls_back_past_damaged_snapshots), TEST_ENTRY(snapshot_of_another_run_is_a_clear_error),
          TEST_ENTRY(keep_deletes_the_oldest), TEST_ENTRY(export_keeps_weights_only_and_snapshots_evaluate),
          TEST_ENTRY(failed_snapshot_write_keeps_the_previous_one), TEST_ENTRY(cleanup_synthetic_data))

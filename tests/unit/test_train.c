/* Tests of the trainer: configuration checks, progress lines, and tiny runs on a synthetic IDX dataset. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "train/train_impl.h"

#define DT_TEST_NAME "train"
#include "synthetic_data.h"

#define ASSERT_HAS(s, sub)                                                   \
  do {                                                                       \
    if (!strstr((s), (sub))) FAIL_("\"%s\" lacks \"%s\"", (s), (sub));       \
  } while (0)

static void tiny_config(dt_train_config *c, const char *out) {
  dt_train_config_default(c);
  c->model = "mlp";
  c->hidden[0] = 32;
  c->n_hidden = 1;
  c->data = synthetic_data();
  c->epochs = 3;
  c->batch_size = 20;
  c->lr = 0.1f;
  c->optim.momentum = 0.9f;
  c->threads = 1;
  c->seed = 7;
  c->out_dir = out;
}

static int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int n = 0, ch;
  while ((ch = fgetc(f)) != EOF) n += ch == '\n';
  fclose(f);
  return n;
}

static int read_line(const char *path, int which, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int ok = -1;
  for (int i = 0; i <= which && fgets(buf, (int)len, f); i++)
    if (i == which) ok = 0;
  fclose(f);
  return ok;
}

/* ---- tests ------------------------------------------------------------------- */
TEST(config_default_is_valid) {
  dt_train_config c;
  dt_train_config_default(&c);
  ASSERT_OK(dt_train_config_check(&c));
  ASSERT_STR_EQ(c.model, "fashioncnn");
  ASSERT_STR_EQ(c.data, "fashion-mnist");
  ASSERT_EQ(c.epochs, 1);
  ASSERT_EQ(c.batch_size, 64);
  ASSERT_NEAR(c.lr, 0.01, 1e-7);
  ASSERT_EQ(c.optim.kind, DT_OPTIM_SGD);
  ASSERT(c.dropout < 0);
}

TEST(config_check_names_the_bad_field) {
  dt_train_config c;
  dt_train_config_default(&c);
  c.epochs = 0;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "epochs") != NULL);
  dt_train_config_default(&c);
  c.batch_size = -3;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "batch size") != NULL);
  dt_train_config_default(&c);
  c.lr = -1;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "learning rate") != NULL);
  dt_train_config_default(&c);
  c.label_smoothing = 1.0f;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "label smoothing") != NULL);
  dt_train_config_default(&c);
  c.dropout = 1.5f;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "dropout") != NULL);
  dt_train_config_default(&c);
  c.warmup_epochs = 1;
  c.warmup_steps = 10;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "warm-up") != NULL);
  dt_train_config_default(&c);
  c.n_hidden = 2;
  c.hidden[0] = 16;
  c.hidden[1] = 0;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "hidden width 2") != NULL);
  dt_train_config_default(&c);
  c.model = NULL;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  dt_train_config_default(&c);
  c.schedule = DT_SCHED_COSINE;
  c.warmup_epochs = 1;
  ASSERT_STATUS(dt_train_config_check(&c), DT_INVALID_ARGUMENT);
  ASSERT(strstr(dt_last_error(), "cosine") != NULL);
  /* dt_train_run checks first: nothing is loaded or written. */
  dt_train_result r;
  dt_train_config_default(&c);
  c.epochs = 0;
  c.out_dir = "/tmp/dt_test_train_never_created";
  ASSERT_STATUS(dt_train_run(&c, &r), DT_INVALID_ARGUMENT);
  struct stat st;
  ASSERT(stat(c.out_dir, &st) != 0);
}

TEST(config_json_holds_every_setting) {
  dt_train_config c;
  dt_train_config_default(&c);
  c.model = "mlp";
  c.hidden[0] = 64;
  c.hidden[1] = 32;
  c.n_hidden = 2;
  c.data = "dir/with \"quote\"";
  c.optim.momentum = 0.9f;
  char buf[4096];
  ASSERT_OK(dt_train_config_json(&c, buf, sizeof buf));
  ASSERT(strstr(buf, "\"model\":\"mlp\"") != NULL);
  ASSERT(strstr(buf, "\"hidden\":[64,32]") != NULL);
  ASSERT(strstr(buf, "\"data\":\"dir/with \\\"quote\\\"\"") != NULL);
  ASSERT(strstr(buf, "\"optimizer\":\"sgd\"") != NULL);
  ASSERT(strstr(buf, "\"momentum\":0.9") != NULL);
  ASSERT(strstr(buf, "\"epochs\":1,\"batch_size\":64,\"seed\":0") != NULL);
  ASSERT(buf[0] == '{' && buf[strlen(buf) - 1] == '}');
  ASSERT_STATUS(dt_train_config_json(&c, buf, 40), DT_INVALID_ARGUMENT);
}

TEST(epoch_line_format) {
  dt_epoch_metrics m;
  memset(&m, 0, sizeof m);
  m.epoch = 1;
  m.train_loss = 0.43214;
  m.train_metric[0] = 0.84121;
  m.test_loss = 0.34561;
  m.test_metric[0] = 0.87654;
  m.test_metric[1] = 0.997;
  m.epoch_seconds = 12.34;
  m.train_samples_per_s = 4870.2;
  char line[256];
  dt_progress_format_epoch(&m, NULL, 3, line, sizeof line);
  ASSERT_STR_EQ(line, "epoch 1/3  train loss 0.4321 acc 84.12%  test loss 0.3456 top1 87.65% top5 99.70%  12.3s  "
                      "4870 samples/s");
}

/* The line under the per-rank table: a rank 10% or more slower than another is named with both figures; closer
 * ranks, one rank, or a rank that computed nothing give none. Compute seconds sit every 3 doubles here. */
TEST(rank_balance_names_the_slow_rank) {
  char line[512];
  const double three[9] = {8.95, 0, 0, 11.48, 0, 0, 9.20, 0, 0};
  dt_progress_rank_balance(three, 3, 3, line, sizeof line);
  const char *want = "rank 1 computed 11.48 s, rank 0 8.95 s (+28%): every step waits for the slowest rank";
  ASSERT_MSG(strncmp(line, want, strlen(want)) == 0, line);
  const double close[6] = {10.0, 0, 0, 10.9, 0, 0};
  dt_progress_rank_balance(close, 3, 2, line, sizeof line);
  ASSERT_STR_EQ(line, "");
  dt_progress_rank_balance(three, 3, 1, line, sizeof line);
  ASSERT_STR_EQ(line, "");
  const double idle[6] = {0, 0, 0, 5.0, 0, 0};
  dt_progress_rank_balance(idle, 3, 2, line, sizeof line);
  ASSERT_STR_EQ(line, "");
}

TEST(plain_progress_prints_at_most_one_line_per_tenth) {
  FILE *f = tmpfile();
  ASSERT(f != NULL);
  dt_progress p;
  dt_progress_init(&p, f, DT_PROGRESS_PLAIN, 2);
  ASSERT_EQ(p.bar, 0);
  dt_progress_epoch_start(&p, 1, 100);
  for (int s = 1; s <= 100; s++) dt_progress_step(&p, s, 0.5, s * 10);
  dt_epoch_metrics m;
  memset(&m, 0, sizeof m);
  m.epoch = 1;
  dt_progress_epoch_end(&p, &m);
  rewind(f);
  int lines = 0, ch;
  char first[128] = "";
  while ((ch = fgetc(f)) != EOF) lines += ch == '\n';
  rewind(f);
  ASSERT(fgets(first, sizeof first, f) != NULL);
  fclose(f);
  ASSERT_EQ(lines, 10); /* 10%, 20%, ..., 90%, then the epoch line */
  ASSERT(strncmp(first, "epoch 1/2  step 10/100  loss 0.5000", 35) == 0);
  /* none: only the epoch line */
  f = tmpfile();
  dt_progress_init(&p, f, DT_PROGRESS_NONE, 2);
  dt_progress_epoch_start(&p, 1, 100);
  for (int s = 1; s <= 100; s++) dt_progress_step(&p, s, 0.5, s * 10);
  dt_progress_epoch_end(&p, &m);
  ASSERT_EQ(ftell(f) > 0, 1);
  rewind(f);
  lines = 0;
  while ((ch = fgetc(f)) != EOF) lines += ch == '\n';
  fclose(f);
  ASSERT_EQ(lines, 1);
}

TEST(prefix_sampler_is_a_seeded_permutation) {
  dt_prefix_sampler s = {.n = 50, .shuffle = 1, .seed = 3};
  int64_t a[50], b[50], c[50], n = 0;
  ASSERT_OK(dt_prefix_sampler_fn(&s, 0, a, &n));
  ASSERT_EQ(n, 50);
  ASSERT_OK(dt_prefix_sampler_fn(&s, 0, b, &n));
  ASSERT_OK(dt_prefix_sampler_fn(&s, 1, c, &n));
  int seen[50] = {0}, same = 1, differ = 0;
  for (int i = 0; i < 50; i++) {
    ASSERT(a[i] >= 0 && a[i] < 50);
    seen[a[i]]++;
    same &= a[i] == b[i];
    differ |= a[i] != c[i];
  }
  for (int i = 0; i < 50; i++) ASSERT_EQ(seen[i], 1);
  ASSERT(same);
  ASSERT(differ);
  s.shuffle = 0;
  ASSERT_OK(dt_prefix_sampler_fn(&s, 5, a, &n));
  for (int i = 0; i < 50; i++) ASSERT_EQ(a[i], i);
}

TEST(tiny_run_learns_and_writes_outputs) {
  const char *data = synthetic_data();
  ASSERT(data != NULL);
  char out[300], path[400], line[512];
  snprintf(out, sizeof out, "%s/run1/nested", data);
  dt_train_config c;
  tiny_config(&c, out);
  dt_train_result r;
  ASSERT_OK(dt_train_run(&c, &r));
  ASSERT_EQ(r.epochs_done, 3);
  ASSERT_EQ(r.interrupted, 0);
  ASSERT_EQ(r.steps, 30); /* 200 samples / 20 per batch x 3 epochs */
  ASSERT_EQ(r.params, 64 * 32 + 32 + 32 * 10 + 10);
  ASSERT_EQ(r.last.epoch, 3);
  ASSERT_EQ(r.last.step, 30);
  ASSERT_EQ(r.last.train_samples, 200);
  ASSERT(r.test_metric[0] >= 0.9);
  ASSERT(r.test_metric[1] >= r.test_metric[0]);
  ASSERT(r.last.train_loss < 1.0);
  ASSERT(r.wall_seconds > 0 && r.train_samples_per_s > 0 && r.infer_samples_per_s > 0);
  ASSERT(r.peak_rss_bytes > 0);
  ASSERT_NEAR(r.compute_seconds + r.data_wait_seconds + r.comm_seconds, r.last.epoch_seconds, 10.0);

  snprintf(path, sizeof path, "%s/metrics.csv", out);
  ASSERT_EQ(count_lines(path), 4);
  ASSERT_EQ(read_line(path, 0, line, sizeof line), 0);
  ASSERT_STR_EQ(line, "epoch,step,lr,train_loss,train_acc1,test_loss,test_acc1,test_acc5,epoch_seconds,"
                      "train_samples_per_s\n");
  ASSERT_EQ(read_line(path, 3, line, sizeof line), 0);
  ASSERT(strncmp(line, "3,30,0.1,", 9) == 0);
  char acc[32];
  snprintf(acc, sizeof acc, ",%.6f,", r.test_metric[0]);
  ASSERT(strstr(line, acc) != NULL);
  snprintf(path, sizeof path, "%s/metrics.jsonl", out);
  ASSERT_EQ(count_lines(path), 3);
  ASSERT_EQ(read_line(path, 0, line, sizeof line), 0);
  ASSERT(strncmp(line, "{\"epoch\":1,\"step\":10,\"lr\":0.1,", 30) == 0);
  snprintf(path, sizeof path, "%s/config.json", out);
  ASSERT_EQ(read_line(path, 0, line, sizeof line), 0);
  ASSERT(strstr(line, "\"hidden\":[32]") != NULL);

  /* The saved weights evaluate to the same test accuracy, model from the metadata. */
  dt_eval_config ec;
  dt_eval_config_default(&ec);
  snprintf(path, sizeof path, "%s/model.safetensors", out);
  ec.weights = path;
  ec.data = data;
  ec.threads = 1;
  ec.batch_size = 33;
  dt_eval_result er;
  ASSERT_OK(dt_eval_run(&ec, &er));
  ASSERT_STR_EQ(er.model, "mlp");
  ASSERT_EQ(er.samples, 100);
  ASSERT_NEAR(er.metric[0], r.test_metric[0], 1e-12);
  ASSERT_NEAR(er.loss, r.test_loss, 1e-5);
  ec.model = "mlp"; /* named explicitly: the widths still come from the file */
  ec.limit = 40;
  ASSERT_OK(dt_eval_run(&ec, &er));
  ASSERT_EQ(er.samples, 40);
  ec.model = "fashioncnn"; /* another model: its tensors are not in the file */
  ASSERT(dt_eval_run(&ec, &er) != DT_OK);
  ASSERT(strstr(dt_last_error(), "layer1.0.weight") != NULL);
  dt_safetensors *f = NULL;
  ASSERT_OK(dt_safetensors_load(path, &f));
  ASSERT_STR_EQ(dt_safetensors_meta(f, "model"), "mlp");
  ASSERT_STR_EQ(dt_safetensors_meta(f, "hidden"), "32");
  ASSERT_STR_EQ(dt_safetensors_meta(f, "epochs"), "3");
  ASSERT_STR_EQ(dt_safetensors_meta(f, "seed"), "7");
  dt_safetensors_free(f);
}

TEST(same_seed_same_numbers_and_limits) {
  char out[300];
  snprintf(out, sizeof out, "%s/run2", synthetic_data());
  dt_train_config c;
  tiny_config(&c, NULL);
  c.epochs = 2;
  c.limit_train = 50;
  c.limit_test = 30;
  c.optim.kind = DT_OPTIM_ADAM;
  dt_optim_config_default(DT_OPTIM_ADAM, &c.optim);
  c.lr = 0.01f;
  c.schedule = DT_SCHED_COSINE;
  c.warmup_steps = 2;
  c.label_smoothing = 0.1f;
  c.clip_grad_norm = 1.0f;
  dt_train_result a, b;
  ASSERT_OK(dt_train_run(&c, &a));
  ASSERT_OK(dt_train_run(&c, &b));
  ASSERT_EQ(a.steps, 6); /* ceil(50 / 20) x 2 */
  ASSERT_EQ(a.last.train_samples, 50);
  ASSERT(a.last.train_loss == b.last.train_loss);
  ASSERT(a.last.test_loss == b.last.test_loss);
  ASSERT(a.last.lr == b.last.lr);
  c.seed = 8;
  ASSERT_OK(dt_train_run(&c, &b));
  ASSERT(a.last.train_loss != b.last.train_loss);
}

TEST(stop_request_still_writes_metrics_and_weights) {
  char out[300], path[400];
  snprintf(out, sizeof out, "%s/run3", synthetic_data());
  dt_train_config c;
  tiny_config(&c, out);
  dt_train_request_stop();
  ASSERT(dt_train_stop_requested());
  dt_train_result r;
  dt_status st = dt_train_run(&c, &r);
  dt_train_clear_stop();
  ASSERT_OK(st);
  ASSERT_EQ(r.interrupted, 1);
  ASSERT_EQ(r.epochs_done, 0);
  ASSERT_EQ(r.steps, 0);
  snprintf(path, sizeof path, "%s/metrics.csv", out);
  ASSERT_EQ(count_lines(path), 1);
  snprintf(path, sizeof path, "%s/model.safetensors", out);
  struct stat sb;
  ASSERT(stat(path, &sb) == 0 && sb.st_size > 0);
}

/* A used out_dir is refused before anything is touched; overwrite deletes the old outputs; a resume on other data is refused. */
TEST(used_out_dir_is_refused_unless_overwrite_or_resume) {
  char out[300], path[400];
  snprintf(out, sizeof out, "%s/run4", synthetic_data());
  dt_train_config c;
  tiny_config(&c, out);
  c.epochs = 1;
  c.save_every = 1;
  dt_train_result r;
  ASSERT_OK(dt_train_run(&c, &r));
  c.save_every = 0;
  ASSERT_STATUS(dt_train_run(&c, &r), DT_USAGE);
  ASSERT_HAS(dt_last_error(), "holds the outputs of an earlier run");
  ASSERT_HAS(dt_last_error(), "snapshots/ (1 file)");
  c.resume = "auto";
  c.limit_train = 40;
  ASSERT_STATUS(dt_train_run(&c, &r), DT_USAGE);
  ASSERT_HAS(dt_last_error(), "limit_train 0 -> 40");
  c.allow_data_change = 1;
  c.epochs = 2;
  ASSERT_OK(dt_train_run(&c, &r));
  ASSERT_EQ(r.resumed_epoch, 1);
  c.resume = NULL;
  c.allow_data_change = 0;
  c.overwrite = 1;
  ASSERT_STATUS(dt_train_config_check(&(dt_train_config){.overwrite = 1}), DT_INVALID_ARGUMENT);
  ASSERT_OK(dt_train_run(&c, &r));
  ASSERT_EQ(r.resumed_epoch, -1);
  snprintf(path, sizeof path, "%s/snapshots", out);
  struct stat sb;
  ASSERT(stat(path, &sb) != 0);
  snprintf(path, sizeof path, "%s/metrics.csv", out);
  ASSERT_EQ(count_lines(path), 3);
}

TEST(runtime_failures_name_what_is_wrong) {
  dt_train_config c;
  dt_train_result r;
  tiny_config(&c, NULL);
  c.model = "no-such-model";
  ASSERT_STATUS(dt_train_run(&c, &r), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "no-such-model") != NULL);
  tiny_config(&c, NULL);
  c.data = "/tmp/dt_test_train_no_such_dir";
  ASSERT(dt_train_run(&c, &r) != DT_OK);
  ASSERT(strstr(dt_last_error(), "dt_test_train_no_such_dir") != NULL);
  /* A regular file where a directory should be: unwritable output. */
  char file[300], out[400];
  snprintf(file, sizeof file, "%s/plainfile", synthetic_data());
  FILE *f = fopen(file, "w");
  ASSERT(f != NULL);
  fclose(f);
  snprintf(out, sizeof out, "%s/sub", file);
  tiny_config(&c, out);
  ASSERT_STATUS(dt_train_run(&c, &r), DT_IO);
  ASSERT(strstr(dt_last_error(), "plainfile") != NULL);
  dt_eval_config ec;
  dt_eval_config_default(&ec);
  ec.weights = "/tmp/dt_test_train_no_such.safetensors";
  ec.data = synthetic_data();
  dt_eval_result er;
  ASSERT(dt_eval_run(&ec, &er) != DT_OK);
  ASSERT(strstr(dt_last_error(), "dt_test_train_no_such.safetensors") != NULL);
}

TEST(cleanup_synthetic_data) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", synthetic_data());
  ASSERT_EQ(system(cmd), 0);
}

TEST_MAIN(TEST_ENTRY(config_default_is_valid), TEST_ENTRY(config_check_names_the_bad_field),
          TEST_ENTRY(config_json_holds_every_setting), TEST_ENTRY(epoch_line_format),
          TEST_ENTRY(rank_balance_names_the_slow_rank),
          TEST_ENTRY(plain_progress_prints_at_most_one_line_per_tenth), TEST_ENTRY(prefix_sampler_is_a_seeded_permutation),
          TEST_ENTRY(tiny_run_learns_and_writes_outputs), TEST_ENTRY(same_seed_same_numbers_and_limits),
          TEST_ENTRY(stop_request_still_writes_metrics_and_weights),
          TEST_ENTRY(used_out_dir_is_refused_unless_overwrite_or_resume), TEST_ENTRY(runtime_failures_name_what_is_wrong),
          TEST_ENTRY(cleanup_synthetic_data))

/* How bench scaling reads a run's --out (tools/run_metrics.c): train samples/s over the epochs after the warm-up,
 * the later epochs' rates combined harmonically (each epoch takes the same samples), and the errors that name the
 * file or the epoch. */
#define _XOPEN_SOURCE 700
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "run_metrics.h"

/* A fresh directory under $TMPDIR (or /tmp) holding metrics.jsonl with text; its path in dir (256 bytes). */
static void write_metrics(char *dir, const char *text) {
  const char *tmp = getenv("TMPDIR");
  if (snprintf(dir, 256, "%s/dt-run-metrics-XXXXXX", tmp && *tmp && strlen(tmp) < 200 ? tmp : "/tmp") >= 256 ||
      !mkdtemp(dir))
    abort();
  char path[320];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *f = fopen(path, "w");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) abort();
}

static void remove_dir(const char *dir) {
  char path[320];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  unlink(path);
  rmdir(dir);
}

/* Three epochs of 100, 200 and 400 samples/s (epoch_seconds written to three decimals, 0.000 for the last). */
static const char three_epochs[] =
    "{\"epoch\":1,\"step\":10,\"epoch_seconds\":6.400,\"train_samples_per_s\":100.0,\"compute_seconds\":6.1}\n"
    "{\"epoch\":2,\"step\":20,\"epoch_seconds\":3.200,\"train_samples_per_s\":200.0,\"compute_seconds\":3.0}\n"
    "{\"epoch\":3,\"step\":30,\"epoch_seconds\":0.000,\"train_samples_per_s\":400.0,\"compute_seconds\":1.5}\n";

TEST(later_epochs_combine_harmonically) {
  char dir[256], why[512] = "";
  double sps = 0;
  write_metrics(dir, three_epochs);
  ASSERT_MSG(read_after_warmup(dir, 1, &sps, why, sizeof why) == 0, why);
  ASSERT_NEAR(sps, 2.0 / (1.0 / 200 + 1.0 / 400), 1e-9); /* 266.67, not the mean 300 */
  ASSERT_MSG(read_after_warmup(dir, 2, &sps, why, sizeof why) == 0, why);
  ASSERT_NEAR(sps, 400.0, 1e-9);
  remove_dir(dir);
}

TEST(no_epoch_after_the_warmup_is_an_error) {
  char dir[256], why[512] = "";
  double sps = -1;
  write_metrics(dir, three_epochs);
  ASSERT(read_after_warmup(dir, 3, &sps, why, sizeof why) == -1);
  ASSERT_MSG(strstr(why, "metrics.jsonl has 3 epoch(s): none after the 3 --skip-epochs leaves out"), why);
  ASSERT(sps == -1);
  remove_dir(dir);
}

TEST(a_rate_that_is_not_positive_names_its_epoch) {
  char dir[256], why[512] = "";
  double sps = -1;
  write_metrics(dir, "{\"epoch\":1,\"train_samples_per_s\":100.0}\n{\"epoch\":2,\"train_samples_per_s\":0}\n");
  ASSERT(read_after_warmup(dir, 1, &sps, why, sizeof why) == -1);
  ASSERT_MSG(strstr(why, "metrics.jsonl: epoch 2 has train_samples_per_s 0"), why);
  ASSERT(sps == -1);
  remove_dir(dir);
}

TEST(a_missing_file_is_named) {
  char why[512] = "";
  double sps = -1;
  ASSERT(read_after_warmup("/nonexistent/run", 1, &sps, why, sizeof why) == -1);
  ASSERT_MSG(strstr(why, "cannot read /nonexistent/run/metrics.jsonl: "), why);
}

TEST(json_numbers_by_key) {
  const char *text = "{\"epoch\":2,\"train_samples_per_s\":5103.6,\"test_acc1\":0.8788}";
  ASSERT_NEAR(json_number(text, "train_samples_per_s"), 5103.6, 1e-9);
  ASSERT_NEAR(json_number(text, "test_acc1"), 0.8788, 1e-12);
  ASSERT(json_number(text, "comm_seconds") == 0);
}

TEST_MAIN(TEST_ENTRY(later_epochs_combine_harmonically), TEST_ENTRY(no_epoch_after_the_warmup_is_an_error),
          TEST_ENTRY(a_rate_that_is_not_positive_names_its_epoch), TEST_ENTRY(a_missing_file_is_named),
          TEST_ENTRY(json_numbers_by_key))

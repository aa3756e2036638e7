/* Tests of the HTML run report: pieces, escaping, no external references, odd data, atomic write. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "test_files.h"
#include "io/report.h"

/* ---- helpers ------------------------------------------------------------------- */

/* Entries of tmpdir whose name contains ".tmp." */
static int count_temporaries(void) {
  int n = 0;
  DIR *d = opendir(tmpdir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) n += strstr(e->d_name, ".tmp.") != NULL;
  if (d) closedir(d);
  return n;
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

#define ASSERT_HAS(hay, needle) \
  do {                          \
    if (!strstr((hay), (needle))) FAIL_("missing: %s", (needle)); \
  } while (0)
#define ASSERT_LACKS(hay, needle) \
  do {                            \
    if (strstr((hay), (needle))) FAIL_("unexpected: %s", (needle)); \
  } while (0)

static void fill_epoch(dt_epoch_metrics *m, int epoch, double loss) {
  memset(m, 0, sizeof *m);
  m->epoch = epoch;
  m->step = 100 * epoch;
  m->lr = 0.01f;
  m->train_loss = loss;
  m->test_loss = loss * 1.1;
  m->train_metric[0] = 0.7 + 0.05 * epoch;
  m->test_metric[0] = 0.68 + 0.05 * epoch;
  m->test_metric[1] = 0.95 + 0.01 * epoch;
  m->epoch_seconds = 10;
  m->train_samples_per_s = 6000;
  m->train_samples = 60000;
  m->compute_seconds = 8, m->data_wait_seconds = 0.5, m->comm_seconds = 1.5;
  m->eval_seconds = 1;
}

/* What every page must be, whatever the data: one document, the four charts,
 * balanced elements, no reference to anything outside the file, no NaN or
 * infinity leaking into coordinates or labels. */
#define ASSERT_WELL_FORMED(html)                                                   \
  do {                                                                             \
    ASSERT(strncmp((html), "<!DOCTYPE html>\n", 16) == 0);                         \
    ASSERT(strcmp((html) + strlen(html) - 8, "</html>\n") == 0);                   \
    ASSERT_EQ(count((html), "<svg"), 4);                                           \
    ASSERT_EQ(count((html), "</svg>"), 4);                                         \
    ASSERT_EQ(count((html), "<figure"), count((html), "</figure>"));               \
    ASSERT_EQ(count((html), "<text"), count((html), "</text>"));                   \
    ASSERT_EQ(count((html), "<table"), count((html), "</table>"));                 \
    ASSERT_EQ(count((html), "<tr>"), count((html), "</tr>"));                      \
    ASSERT_HAS((html), "Loss per epoch");                                          \
    ASSERT_HAS((html), "Accuracy per epoch");                                      \
    ASSERT_HAS((html), "Training throughput over time");                           \
    ASSERT_HAS((html), "Time split per rank");                                     \
    ASSERT_LACKS((html), "http:");                                                 \
    ASSERT_LACKS((html), "https:");                                                \
    ASSERT_LACKS((html), "xmlns");                                                 \
    ASSERT_LACKS((html), "href");                                                  \
    ASSERT_LACKS((html), "src=");                                                  \
    ASSERT_LACKS((html), "url(");                                                  \
    ASSERT_LACKS((html), "@import");                                               \
    ASSERT_LACKS((html), "<script");                                               \
    ASSERT_LACKS((html), "nan");                                                   \
    ASSERT_LACKS((html), "inf");                                                   \
  } while (0)

/* ---- tests ----------------------------------------------------------------------- */

TEST(three_epochs_two_ranks_has_every_piece_escaped) {
  dt_epoch_metrics ep[3];
  for (int e = 0; e < 3; e++) fill_epoch(&ep[e], e + 1, 0.9 / (e + 1));
  dt_report_point tp[5] = {{1, 3000}, {2, 5500}, {3, 6000}, {4, 6100}, {5, 5900}};
  dt_report_rank ranks[2] = {{25, 1.5, 4}, {24, 2, 4.5}};
  const char *config =
      "{\"model\":\"fashioncnn\",\"lr\":0.05,\"betas\":[0.9,0.999],"
      "\"note\":\"<script>alert('x')</script> & \\\"q\\\"\",\"normalize\":{\"mean\":0.286,\"std\":0.353}}";
  dt_report r = {"cnn <b>&</b> \"mnist\"", config, ep, 3, tp, 5, ranks, 2, "final  <i>0.9</i>\n", NULL, NULL};
  const char *path = tmp_path("report.html");
  ASSERT_OK(dt_report_write(path, &r));
  char *html = read_text(path);
  ASSERT(html);
  ASSERT_WELL_FORMED(html);

  /* every user string escaped, in the page title, the heading, the config, the summary */
  ASSERT_HAS(html, "<title>cnn &lt;b&gt;&amp;&lt;/b&gt; &quot;mnist&quot;");
  ASSERT_HAS(html, "<h1>cnn &lt;b&gt;&amp;&lt;/b&gt; &quot;mnist&quot;</h1>");
  ASSERT_HAS(html, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;");
  ASSERT_HAS(html, "final  &lt;i&gt;0.9&lt;/i&gt;");
  ASSERT_LACKS(html, "<b>");
  ASSERT_LACKS(html, "<i>");

  /* config rows: strings decoded, numbers and nested values as written */
  ASSERT_HAS(html, "<td class=\"k\">model</td><td class=\"v\">fashioncnn</td>");
  ASSERT_HAS(html, "<td class=\"k\">lr</td><td class=\"v\">0.05</td>");
  ASSERT_HAS(html, "<td class=\"k\">betas</td><td class=\"v\">[0.9,0.999]</td>");
  ASSERT_HAS(html, "<td class=\"k\">normalize</td><td class=\"v\">{&quot;mean&quot;:0.286,&quot;std&quot;:0.353}</td>");
  ASSERT_EQ(count(html, "<td class=\"k\">"), 5);

  /* legends, one line per series, one row per epoch, one bar row per rank */
  ASSERT_HAS(html, ">train top-1<");
  ASSERT_HAS(html, ">val top-5<");
  ASSERT_HAS(html, ">data wait<");
  ASSERT_HAS(html, ">communication<");
  ASSERT_EQ(count(html, "<path"), 2 + 3 + 1);
  ASSERT_EQ(count(html, "<tr><td>"), 3);
  ASSERT_HAS(html, ">rank 1<");
  ASSERT_LACKS(html, ">rank 2<");
  ASSERT_EQ(count(html, "<rect"), 3 * 2 + 3); /* 3 parts per rank, 3 legend swatches */
  ASSERT_HAS(html, "<h2>Summary</h2>");
  ASSERT_LACKS(html, "no data");

  /* deterministic: the same report gives the same bytes */
  const char *again = tmp_path("again.html");
  ASSERT_OK(dt_report_write(again, &r));
  char *html2 = read_text(again);
  ASSERT(html2);
  ASSERT_STR_EQ(html, html2);
  free(html);
  free(html2);
  ASSERT_EQ(count_temporaries(), 0);
}

/* The last evaluation per class: a table of samples and accuracy, and the confusion matrix shaded by row;
 * per label (no samples, no matrix) only the table; a metric set of another task names its metrics. */
TEST(evaluation_detail_per_class_and_per_label) {
  dt_epoch_metrics ep;
  fill_epoch(&ep, 1, 0.5);
  dt_report_rank rank = {10, 1, 0};
  double samples[3] = {4, 2, 0}, acc[3] = {0.75, 0.5, NAN}, confusion[9] = {3, 1, 0, 0, 1, 1, 0, 0, 0};
  dt_metric_detail d = {.k = 3, .samples = samples, .value = acc, .value_label = "accuracy", .percent = 1,
                        .confusion = confusion};
  dt_report r = {"detail", NULL, &ep, 1, NULL, 0, &rank, 1, NULL, NULL, &d};
  const char *path = tmp_path("detail.html");
  ASSERT_OK(dt_report_write(path, &r));
  char *html = read_text(path);
  ASSERT(html);
  ASSERT_WELL_FORMED(html);
  ASSERT_HAS(html, "<h2>Last evaluation per class</h2>");
  ASSERT_HAS(html, "<td>0</td><td>4</td><td>75.00%</td>");
  ASSERT_HAS(html, "<td>2</td><td>0</td><td>&#8211;</td>");
  ASSERT_HAS(html, "Confusion matrix");
  ASSERT_HAS(html, "font-weight:600\">3</td>"); /* the diagonal stands out */
  free(html);
  double auc[2] = {0.9, 0.61};
  dt_metric_detail l = {.k = 2, .value = auc, .value_label = "ROC-AUC", .percent = 0};
  dt_metric_set ms = {.n_train = 1, .n_train_row = 1, .n_eval = 2, .loss_label = "BCE loss",
                      .train = {{"acc", "accuracy", "acc", 1}}, .eval = {{"auc", "ROC-AUC", "auc", 0}, {"acc", "accuracy", "acc", 1}}};
  dt_report r2 = {"labels", NULL, &ep, 1, NULL, 0, &rank, 1, NULL, &ms, &l};
  ASSERT_OK(dt_report_write(path, &r2));
  html = read_text(path);
  ASSERT(html);
  ASSERT_HAS(html, "<h2>Last evaluation per label</h2>");
  ASSERT_HAS(html, "<td>1</td><td>0.6100</td>");
  ASSERT_HAS(html, "<th>val ROC-AUC</th>");
  ASSERT_HAS(html, "BCE loss");
  ASSERT_LACKS(html, "Confusion matrix");
  free(html);
}

TEST(one_epoch_no_throughput_and_no_config_draw_markers) {
  dt_epoch_metrics ep;
  fill_epoch(&ep, 1, 0.5);
  dt_report_rank rank = {10, 1, 0};
  dt_report r = {NULL, NULL, &ep, 1, NULL, 0, &rank, 1, NULL, NULL, NULL};
  const char *path = tmp_path("one.html");
  ASSERT_OK(dt_report_write(path, &r));
  char *html = read_text(path);
  ASSERT(html);
  ASSERT_WELL_FORMED(html);
  /* a single point has no line; its marker is what shows it */
  ASSERT_EQ(count(html, "<path"), 0);
  ASSERT_EQ(count(html, "<circle"), 2 + 3);
  ASSERT_EQ(count(html, "no data"), 1); /* the throughput chart */
  ASSERT_HAS(html, "<h1>dtrain run</h1>");
  ASSERT_HAS(html, "Not recorded.");
  ASSERT_LACKS(html, "<h2>Summary</h2>");
  ASSERT_EQ(count(html, "<rect"), 2 + 3); /* compute and data wait; a zero part has no rect */
  free(html);
}

TEST(nan_values_are_gaps_and_dashes) {
  dt_epoch_metrics ep[4];
  for (int e = 0; e < 4; e++) fill_epoch(&ep[e], e + 1, 1.0 / (e + 1));
  ep[1].test_loss = ep[1].test_metric[0] = ep[1].test_metric[1] = NAN; /* no evaluation that epoch */
  for (int e = 0; e < 4; e++) ep[e].train_metric[0] = NAN;           /* never measured */
  ep[3].train_loss = INFINITY;
  ep[2].lr = NAN;
  dt_report_point tp[4] = {{1, 100}, {NAN, 200}, {3, NAN}, {4, 300}};
  dt_report_rank ranks[3] = {{NAN, 1, 2}, {-5, 1, 2}, {INFINITY, NAN, -1}};
  dt_report r = {"gaps", "{}", ep, 4, tp, 4, ranks, 3, "", NULL, NULL};
  const char *path = tmp_path("nan.html");
  ASSERT_OK(dt_report_write(path, &r));
  char *html = read_text(path);
  ASSERT(html);
  ASSERT_WELL_FORMED(html);
  /* lines: train loss over epochs 1-3 (4 is infinite); val loss, top-1 and top-5
   * over 3-4 (epoch 1 is alone: a marker only); none for train top-1 (all NaN)
   * nor throughput (no two finite neighbours) */
  ASSERT_EQ(count(html, "<path"), 4);
  ASSERT_EQ(count(html, "<circle"), 3 + 3 * 3 + 2);
  ASSERT_HAS(html, "<td>3</td><td>300</td><td>&#8211;</td>"); /* the NaN lr */
  ASSERT_EQ(count(html, "no data"), 0);
  ASSERT_EQ(count(html, "<td class=\"k\">"), 0);
  free(html);
}

TEST(flat_and_zero_ranges_do_not_divide_by_zero) {
  dt_epoch_metrics ep[3];
  for (int e = 0; e < 3; e++) {
    fill_epoch(&ep[e], e + 1, 0);
    ep[e].test_loss = 0;
    ep[e].train_metric[0] = ep[e].test_metric[0] = ep[e].test_metric[1] = 1;
  }
  dt_report_point tp[3] = {{0, 0}, {0, 0}, {0, 0}};
  dt_report_rank ranks[2] = {{0, 0, 0}, {0, 0, 0}};
  dt_report r = {"flat", NULL, ep, 3, tp, 3, ranks, 2, NULL, NULL, NULL};
  const char *path = tmp_path("flat.html");
  ASSERT_OK(dt_report_write(path, &r));
  char *html = read_text(path);
  ASSERT(html);
  ASSERT_WELL_FORMED(html);
  ASSERT_EQ(count(html, "<rect"), 3); /* legend only */
  free(html);

  /* a range too wide for a double: falls back to a plain axis, still no NaN */
  ep[0].train_loss = 1e308, ep[1].train_loss = -1e308;
  ASSERT_OK(dt_report_write(path, &r));
  html = read_text(path);
  ASSERT(html);
  ASSERT_WELL_FORMED(html);
  free(html);

  /* nothing at all: empty charts that say so */
  dt_report empty = {"empty", NULL, NULL, 0, NULL, 0, NULL, 0, NULL, NULL, NULL};
  ASSERT_OK(dt_report_write(path, &empty));
  html = read_text(path);
  ASSERT(html);
  ASSERT_WELL_FORMED(html);
  ASSERT_EQ(count(html, "no data"), 4);
  ASSERT_HAS(html, "No epoch finished.");
  free(html);
}

TEST(config_that_is_not_an_object_is_shown_verbatim_escaped) {
  dt_epoch_metrics ep;
  fill_epoch(&ep, 1, 0.5);
  dt_report_rank rank = {1, 0, 0};
  const char *bad[] = {"{\"a\":<script>}", "[1,2]", "not json & <b>"};
  const char *want[] = {"<pre>{&quot;a&quot;:&lt;script&gt;}</pre>", "<pre>[1,2]</pre>", "<pre>not json &amp; &lt;b&gt;</pre>"};
  for (int i = 0; i < 3; i++) {
    dt_report r = {"cfg", bad[i], &ep, 1, NULL, 0, &rank, 1, NULL, NULL, NULL};
    const char *path = tmp_path("cfg.html");
    ASSERT_OK(dt_report_write(path, &r));
    char *html = read_text(path);
    ASSERT(html);
    ASSERT_WELL_FORMED(html);
    ASSERT_HAS(html, want[i]);
    free(html);
  }
}

TEST(bad_arguments_are_invalid) {
  dt_report ok = {"t", NULL, NULL, 0, NULL, 0, NULL, 0, NULL, NULL, NULL};
  ASSERT_STATUS(dt_report_write(NULL, &ok), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_report_write("", &ok), DT_INVALID_ARGUMENT);
  ASSERT_STATUS(dt_report_write(tmp_path("x.html"), NULL), DT_INVALID_ARGUMENT);
  dt_report bad = ok;
  bad.n_epochs = 2;
  ASSERT_STATUS(dt_report_write(tmp_path("x.html"), &bad), DT_INVALID_ARGUMENT);
  bad = ok, bad.n_throughput = -1;
  ASSERT_STATUS(dt_report_write(tmp_path("x.html"), &bad), DT_INVALID_ARGUMENT);
  bad = ok, bad.world = 3;
  ASSERT_STATUS(dt_report_write(tmp_path("x.html"), &bad), DT_INVALID_ARGUMENT);
  ASSERT(access(tmp_path("x.html"), F_OK) != 0);
}

TEST(unwritable_paths_fail_with_io_and_leave_no_temporaries) {
  dt_report r = {"t", NULL, NULL, 0, NULL, 0, NULL, 0, NULL, NULL, NULL};
  /* a directory that does not exist */
  char missing[300];
  snprintf(missing, sizeof missing, "%s/no/such/dir/report.html", tmp_path(""));
  ASSERT_STATUS(dt_report_write(missing, &r), DT_IO);
  ASSERT_HAS(dt_last_error(), missing);
  /* the path is a directory: the temporary is written, the rename fails, the temporary goes */
  const char *dir = tmp_path("is_a_dir.html");
  ASSERT(mkdir(dir, 0777) == 0);
  ASSERT_STATUS(dt_report_write(dir, &r), DT_IO);
  ASSERT_HAS(dt_last_error(), dir);
  ASSERT_EQ(count_temporaries(), 0);
  ASSERT(rmdir(dir) == 0);
}

TEST(failed_write_keeps_previous_report) {
  if (access("/dev/full", W_OK) != 0) {
    printf("  (no /dev/full: fault injection skipped)\n");
    return;
  }
  dt_epoch_metrics ep;
  fill_epoch(&ep, 1, 0.5);
  dt_report_rank rank = {1, 0, 0};
  dt_report r = {"previous", NULL, &ep, 1, NULL, 0, &rank, 1, NULL, NULL, NULL};
  const char *path = tmp_path("keep.html");
  ASSERT_OK(dt_report_write(path, &r));
  char *before = read_text(path);
  ASSERT(before);
  /* The temporary is a link to a full device: the write fails with ENOSPC. */
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  ASSERT(symlink("/dev/full", tmp) == 0);
  r.title = "next";
  dt_status st = dt_report_write(path, &r);
  ASSERT_EQ(st, DT_IO);
  ASSERT_HAS(dt_last_error(), path);
  ASSERT_HAS(dt_last_error(), strerror(ENOSPC));
  struct stat sb;
  ASSERT(lstat(tmp, &sb) != 0); /* temporary removed */
  char *after = read_text(path);
  ASSERT(after);
  ASSERT_STR_EQ(after, before);
  free(before);
  free(after);
  ASSERT_EQ(count_temporaries(), 0);
}

int main(int argc, char **argv) {
  static const dt_test_case cases[] = {
      TEST_ENTRY(three_epochs_two_ranks_has_every_piece_escaped),
      TEST_ENTRY(one_epoch_no_throughput_and_no_config_draw_markers),
      TEST_ENTRY(nan_values_are_gaps_and_dashes),
      TEST_ENTRY(flat_and_zero_ranges_do_not_divide_by_zero),
      TEST_ENTRY(config_that_is_not_an_object_is_shown_verbatim_escaped),
      TEST_ENTRY(bad_arguments_are_invalid),
      TEST_ENTRY(unwritable_paths_fail_with_io_and_leave_no_temporaries),
      TEST_ENTRY(failed_write_keeps_previous_report),
          TEST_ENTRY(evaluation_detail_per_class_and_per_label),
  };
  int rc = dt_test_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
  remove_tmpdir();
  return rc;
}

/* How bench scaling describes its CPUs' speeds (tools/cpu_speed.c): every CPU's figure, or the slowest, median and
 * fastest of many; and a remark exactly where the slowest is under 90% of the fastest. The probe itself runs on
 * every CPU this test may use and must find a speed on each. */
#include <string.h>

#include "cpu_speed.h"
#include "harness.h"

static int starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

TEST(equal_cpus_get_no_remark) {
  const int cpus[2] = {0, 1};
  const double gflops[2] = {96.4, 90.0};
  char out[512];
  describe_cpu_speeds(cpus, gflops, 2, out, sizeof out);
  ASSERT_MSG(strcmp(out, "cpu0 96, cpu1 90") == 0, out);
}

TEST(a_slow_cpu_is_named) {
  const int cpus[3] = {0, 2, 5};
  const double gflops[3] = {67.0, 38.0, 66.0};
  char out[512];
  describe_cpu_speeds(cpus, gflops, 3, out, sizeof out);
  ASSERT_MSG(starts_with(out, "cpu0 67, cpu2 38, cpu5 66; the slowest (cpu2) is 57% of the fastest (cpu0): "), out);
  ASSERT_MSG(strstr(out, "run at the slowest one's pace"), out);
}

TEST(many_cpus_are_summed_up) {
  int cpus[40];
  double gflops[40];
  for (int i = 0; i < 40; i++) cpus[i] = i + 8, gflops[i] = 100.0 - (i == 7 ? 50 : i % 3);
  char out[512];
  describe_cpu_speeds(cpus, gflops, 40, out, sizeof out);
  ASSERT_MSG(starts_with(out, "40 CPUs: slowest cpu15 50, median 99, fastest cpu8 100; the slowest (cpu15) is 50%"),
             out);
}

TEST(a_short_buffer_is_cut_not_overrun) {
  const int cpus[2] = {0, 1};
  const double gflops[2] = {67.0, 38.0};
  char out[24];
  memset(out, 'x', sizeof out);
  describe_cpu_speeds(cpus, gflops, 2, out, 20);
  ASSERT(strlen(out) == 19);
  ASSERT(out[20] == 'x');
}

TEST(the_probe_measures_every_cpu) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ASSERT(f);
  print_cpu_speeds(f, "now");
  fclose(f);
  ASSERT_MSG(starts_with(text, "# CPU speed now (f32 GEMM 256x256x256 by "), text);
  ASSERT_MSG(strstr(text, "GFLOP/s): ") && strstr(text, "cpu"), text);
  ASSERT_MSG(text[strlen(text) - 1] == '\n', text);
  free(text);
}

TEST_MAIN(TEST_ENTRY(equal_cpus_get_no_remark), TEST_ENTRY(a_slow_cpu_is_named), TEST_ENTRY(many_cpus_are_summed_up),
          TEST_ENTRY(a_short_buffer_is_cut_not_overrun), TEST_ENTRY(the_probe_measures_every_cpu))

/* Tests of the flag parser of tools/flags.c: every kind, aliases, =value, error lines word for word, help. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "flags.h"
#include "harness.h"

typedef enum test_flag {
  T_QUIET, T_NAME, T_EPOCHS, T_LIMIT, T_SEED, T_PORT, T_LR, T_DECAY, T_P, T_GRACE, T_BETAS, T_NORM, T_WIDTHS, T_SIZE,
  T_COLOR, T_N
} test_flag;

/* Values far from their positions: the parser must return the value, not the index. */
enum color { RED = 7, GREEN = 42 };
static const flag_choice colors[] = {{"red", RED}, {"green", GREEN}, {NULL, 0}};

static const flag_spec table[T_N] = {
    [T_QUIET] = {"--quiet", NULL, FLAG_BOOL, "off", NULL, .help = "say nothing"},
    [T_NAME] = {"--name", "NAME", FLAG_STR, NULL, "x", .help = "a name", .alias = "--the_name"},
    [T_EPOCHS] = {"--epochs", "N", FLAG_POS_INT, "1", "3", .help = "passes"},
    [T_LIMIT] = {"--limit", "N", FLAG_POS_I64, "all", "500", .help = "a limit"},
    [T_SEED] = {"--seed", "N", FLAG_U64, "0", "42", .help = "a seed"},
    [T_PORT] = {"--port", "P", FLAG_INT_RANGE, NULL, NULL,
                .help = "a port", .lo = 1, .hi = 65535,
                .expect = "a port (1-65535)"},
    [T_LR] = {"--lr", "X", FLAG_POS_FLOAT, "0.01", "0.01", .help = "a rate"},
    [T_DECAY] = {"--decay", "X", FLAG_NONNEG_FLOAT, "0", "0", .help = "a decay"},
    [T_P] = {"--p", "P", FLAG_UNIT_FLOAT, "0", "0.2", .help = "a probability"},
    [T_GRACE] = {"--grace", "S", FLAG_FLOAT_RANGE, NULL, NULL, .help = "seconds", .lo = 0, .hi = 10},
    [T_BETAS] = {"--betas", "B1,B2", FLAG_BETAS, NULL, "0.9,0.999", .help = "betas"},
    [T_NORM] = {"--norm", "MEAN,STD", FLAG_MEAN_STD, NULL, "0.5,0.5", .help = "normalisation"},
    [T_WIDTHS] = {"--widths", "W1,...", FLAG_WIDTHS, NULL, "32,16", .help = "widths"},
    [T_SIZE] = {"--size", "BYTES", FLAG_SIZE, "8", "8", .help = "a size"},
    [T_COLOR] = {"--color", "NAME", FLAG_CHOICE, "red", "green", .help = "a colour", .choices = colors},
};

static const flag_set set = {"prog cmd", "see 'prog cmd --help'", table, T_N, 2};
static const flag_set stop_set = {"prog", "see 'prog --help'", table, T_N, FLAGS_STOP};

/* Parses a NULL-terminated argv list against s; the error line (without "\n"), if any, into err. */
static int parse(const flag_set *s, flag_args *a, char *err, size_t n, const char **words) {
  char *argv[32];
  int argc = 0;
  while (words[argc]) argv[argc] = (char *)words[argc], argc++;
  fflush(stderr);
  FILE *tmp = tmpfile();
  int saved = dup(2);
  dup2(fileno(tmp), 2);
  int rc = flags_parse(s, argc, argv, a);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(tmp);
  err[0] = '\0';
  if (!fgets(err, (int)n, tmp)) err[0] = '\0';
  err[strcspn(err, "\n")] = '\0';
  fclose(tmp);
  return rc;
}

#define ARGS(...) ((const char *[]){__VA_ARGS__, NULL})

TEST(every_kind_stores_its_value) {
  flag_args a;
  char err[512];
  int rc = parse(&set, &a, err, sizeof err,
                 ARGS("--quiet", "--name", "n", "--epochs=3", "--limit", "9000000000", "--seed", "18446744073709551615",
                      "--port", "65535", "--lr", "1e-3", "--decay=0", "--p", "0.5", "--grace", "10", "--betas",
                      "0.9,0.999", "--norm", "0.25,2", "--widths", "32,16,8", "--size", "64K", "--color", "green"));
  ASSERT_MSG(rc == 0, err);
  ASSERT(a.v[T_QUIET].given);
  ASSERT_STR_EQ(a.v[T_NAME].raw, "n");
  ASSERT_EQ(a.v[T_EPOCHS].i, 3);
  ASSERT_EQ(a.v[T_LIMIT].i, 9000000000LL);
  ASSERT(a.v[T_SEED].u == 18446744073709551615ULL);
  ASSERT_EQ(a.v[T_PORT].i, 65535);
  ASSERT_NEAR(a.v[T_LR].f, 1e-3, 0);
  ASSERT_NEAR(a.v[T_P].f, 0.5, 0);
  ASSERT_NEAR(a.v[T_GRACE].f, 10, 0);
  ASSERT_NEAR(a.v[T_BETAS].pair[1], 0.999, 0);
  ASSERT_NEAR(a.v[T_NORM].pair[0], 0.25, 0);
  ASSERT_EQ(a.v[T_WIDTHS].n_list, 3);
  ASSERT_EQ(a.v[T_WIDTHS].list[2], 8);
  ASSERT(a.v[T_SIZE].u == 65536);
  ASSERT_EQ(a.v[T_COLOR].choice, GREEN);
  ASSERT_STR_EQ(a.v[T_COLOR].raw, "green");
  ASSERT(a.v[T_DECAY].given && a.v[T_DECAY].f == 0);
}

TEST(aliases_positionals_and_absent_flags) {
  flag_args a;
  char err[512];
  ASSERT_EQ(parse(&set, &a, err, sizeof err, ARGS("one", "--the_name=x", "two")), 0);
  ASSERT_STR_EQ(a.v[T_NAME].raw, "x");
  ASSERT_EQ(a.n_pos, 2);
  ASSERT_STR_EQ(a.pos[1], "two");
  ASSERT(!a.v[T_EPOCHS].given && a.v[T_EPOCHS].i == 0 && a.v[T_NAME].given);
  ASSERT_EQ(parse(&set, &a, err, sizeof err, ARGS("one", "two", "three")), FLAGS_EXIT_USAGE);
  ASSERT_STR_EQ(err, "prog cmd: unexpected argument 'three' (see 'prog cmd --help')");
}

TEST(bad_values_are_one_line_naming_flag_value_and_fix) {
  static const struct {
    const char *args[4];
    const char *want;
  } cases[] = {
      {{"--epochs", "0"}, "prog cmd: --epochs: '0' is not a positive integer (e.g. --epochs 3)"},
      {{"--epochs", "x"}, "prog cmd: --epochs: 'x' is not a positive integer (e.g. --epochs 3)"},
      {{"--seed", "-5"}, "prog cmd: --seed: '-5' is not a non-negative integer (e.g. --seed 42)"},
      {{"--port", "70000"}, "prog cmd: --port: '70000' is not a port (1-65535) (see 'prog cmd --help')"},
      {{"--grace", "11"}, "prog cmd: --grace: '11' is not a number in [0, 10] (see 'prog cmd --help')"},
      {{"--lr", "1e999"}, "prog cmd: --lr: '1e999' is not a positive number (e.g. --lr 0.01)"},
      {{"--p", "1"}, "prog cmd: --p: '1' is not a number in [0, 1) (e.g. --p 0.2)"},
      {{"--betas", "0.9"}, "prog cmd: --betas: '0.9' is not two numbers B1,B2 (e.g. --betas 0.9,0.999)"},
      {{"--betas", "0.9,1.5"}, "prog cmd: --betas: '0.9,1.5': both betas must be in [0, 1) (e.g. --betas 0.9,0.999)"},
      {{"--norm", "0.5,0"}, "prog cmd: --norm: '0.5,0': STD must be positive (e.g. --norm 0.5,0.5)"},
      {{"--widths", "32,,16"}, "prog cmd: --widths: '32,,16' is not a list of positive widths (e.g. --widths 32,16)"},
      {{"--size", "12X"}, "prog cmd: --size: '12X' is not a size (bytes, optionally with K, M or G) (e.g. --size 8)"},
      {{"--color", "blue"}, "prog cmd: --color: 'blue' is not one of red/green (e.g. --color green)"},
      {{"--name", ""}, "prog cmd: --name: the value is empty (e.g. --name x)"},
      {{"--epochs"}, "prog cmd: --epochs needs a value (e.g. --epochs 3)"},
      {{"--quiet=yes"}, "prog cmd: --quiet takes no value (see 'prog cmd --help')"},
      {{"--epochs", "1", "--epochs", "2"}, "prog cmd: --epochs given twice (give each flag once)"},
      {{"--the_name", "a", "--name", "b"}, "prog cmd: --name given twice (give each flag once)"},
      {{"--frobnicate=3"}, "prog cmd: unknown flag '--frobnicate' (see 'prog cmd --help')"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    flag_args a;
    char err[512];
    const char *argv[5] = {0};
    memcpy(argv, cases[i].args, sizeof cases[i].args);
    ASSERT_EQ(parse(&set, &a, err, sizeof err, argv), FLAGS_EXIT_USAGE);
    ASSERT_STR_EQ(err, cases[i].want);
  }
}

TEST(help_wins_and_stop_sets_end_at_the_program) {
  flag_args a;
  char err[512];
  ASSERT_EQ(parse(&set, &a, err, sizeof err, ARGS("--epochs", "3", "-h", "--frobnicate")), FLAGS_HELP);
  ASSERT_EQ(parse(&set, &a, err, sizeof err, ARGS("--help")), FLAGS_HELP);
  ASSERT_EQ(parse(&stop_set, &a, err, sizeof err, ARGS("--epochs", "2", "--", "prog", "--epochs", "9")), 0);
  ASSERT_EQ(a.rest, 3);
  ASSERT_EQ(a.v[T_EPOCHS].i, 2);
  ASSERT_EQ(parse(&stop_set, &a, err, sizeof err, ARGS("--quiet", "prog", "--help")), 0);
  ASSERT_EQ(a.rest, 1);
  ASSERT_EQ(a.n_pos, 0);
  ASSERT_EQ(parse(&stop_set, &a, err, sizeof err, ARGS("--quiet")), 0);
  ASSERT_EQ(a.rest, 1);
}

TEST(help_lists_every_row_from_the_table) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  flags_print(f, &set);
  fclose(f);
  ASSERT(strstr(text, "  --epochs N                 passes (default: 1)\n") != NULL);
  ASSERT(strstr(text, "  --name NAME, --the_name    a name\n") != NULL);
  ASSERT(strstr(text, "  --help, -h                 show this help and exit\n") != NULL);
  free(text);
  f = open_memstream(&text, &len);
  flags_print_wrapped(f, &set);
  fclose(f);
  ASSERT(strncmp(text, "  --help\n      show this help and exit\n", 38) == 0);
  ASSERT(strstr(text, "  --quiet\n      say nothing (default: off)\n") != NULL);
  free(text);
}

TEST_MAIN(TEST_ENTRY(every_kind_stores_its_value), TEST_ENTRY(aliases_positionals_and_absent_flags),
          TEST_ENTRY(bad_values_are_one_line_naming_flag_value_and_fix),
          TEST_ENTRY(help_wins_and_stop_sets_end_at_the_program), TEST_ENTRY(help_lists_every_row_from_the_table))

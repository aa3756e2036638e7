/* Command-line flag parsing: each value checked against its row's kind and stored by flag id; help from the table. */
#include "flags.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------ */
int flags_usage_error(const char *prog, const char *fix, const char *fmt, ...) {
  char what[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s (%s)\n", prog, what, fix);
  return FLAGS_EXIT_USAGE;
}

/* ---- values ------------------------------------------------------------------ */
int flags_int(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  if (!*s || isspace((unsigned char)*s)) return -1;
  long long x = strtoll(s, &end, 10);
  if (errno || *end || x < lo || x > hi) return -1;
  *out = x;
  return 0;
}

static int parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  if (!*s || isspace((unsigned char)*s)) return -1;
  double x = strtod(s, &end);
  if (errno || *end || !isfinite(x)) return -1;
  *out = x;
  return 0;
}

/* "a,b" -> two doubles. */
static int parse_pair(const char *s, double out[2]) {
  const char *comma = strchr(s, ',');
  char first[64];
  if (!comma || (size_t)(comma - s) >= sizeof first) return -1;
  memcpy(first, s, (size_t)(comma - s));
  first[comma - s] = '\0';
  return parse_double(first, &out[0]) || parse_double(comma + 1, &out[1]) ? -1 : 0;
}

/* A value parser: 0, or -1 with why saying what is wrong (left empty: "'x' is not <the kind's words>"). */
typedef int (*parse_fn)(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n);

static int parse_text(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) { return 0; }

static int parse_integer(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  long long lo = 1, hi = INT_MAX;
  if (f->kind == FLAG_NONNEG_INT) lo = 0;
  if (f->kind == FLAG_POS_I64) hi = LLONG_MAX;
  if (f->kind == FLAG_INT_RANGE) lo = (long long)f->lo, hi = (long long)f->hi;
  return flags_int(s, lo, hi, &v->i);
}

static int parse_u64(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  char *end;
  errno = 0;
  if (*s == '-' || *s == '+' || isspace((unsigned char)*s)) return -1;
  v->u = strtoull(s, &end, 10);
  return errno || *end ? -1 : 0;
}

static int parse_number(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  if (parse_double(s, &v->f)) return -1;
  double x = v->f;
  switch (f->kind) {
  case FLAG_POS_FLOAT: return x > 0 ? 0 : -1;
  case FLAG_NONNEG_FLOAT: return x >= 0 ? 0 : -1;
  case FLAG_UNIT_FLOAT: return x >= 0 && x < 1 ? 0 : -1;
  default: return x >= f->lo && x <= f->hi ? 0 : -1;
  }
}

static int parse_betas(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  if (parse_pair(s, v->pair)) return -1;
  if (v->pair[0] >= 0 && v->pair[0] < 1 && v->pair[1] >= 0 && v->pair[1] < 1) return 0;
  snprintf(why, n, "'%s': both betas must be in [0, 1)", s);
  return -1;
}

static int parse_mean_std(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  if (parse_pair(s, v->pair)) return -1;
  if (v->pair[1] > 0) return 0;
  snprintf(why, n, "'%s': STD must be positive", s);
  return -1;
}

/* Calls item(tok, v) for each comma-separated item of s; -1 on an empty item or a failing one. */
static int each_item(const char *s, flag_value *v, char *why, size_t n, int (*item)(const char *, flag_value *, char *, size_t)) {
  char buf[1024];
  if (strlen(s) >= sizeof buf) return snprintf(why, n, "the list is too long"), -1;
  if (!*s || *s == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,")) return -1;
  strcpy(buf, s);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    if (item(tok, v, why, n)) return -1;
  return 0;
}

static int width_item(const char *tok, flag_value *v, char *why, size_t n) {
  long long w;
  if (flags_int(tok, 1, 1 << 24, &w)) return -1;
  if (v->n_list == FLAGS_MAX_LIST) return snprintf(why, n, "more than %d widths", FLAGS_MAX_LIST), -1;
  v->list[v->n_list++] = (int)w;
  return 0;
}

static int parse_widths(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  (void)f;
  v->n_list = 0;
  return each_item(s, v, why, n, width_item);
}

static int number_item(const char *tok, flag_value *v, char *why, size_t n) {
  double x;
  if (parse_double(tok, &x) || !(x >= 0)) return -1;
  if (v->n_nums == FLAGS_MAX_NUMS) return snprintf(why, n, "more than %d numbers", FLAGS_MAX_NUMS), -1;
  v->nums[v->n_nums++] = x;
  return 0;
}

static int parse_numbers(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  (void)f;
  v->n_nums = 0;
  return each_item(s, v, why, n, number_item);
}

static int parse_size(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  char *end;
  errno = 0;
  double x = strtod(s, &end), mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1024, end++;
  else if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, end++;
  if (errno || end == s || *end || !(x >= 0) || x * mult > 64.0 * 1024 * 1024 * 1024) return -1;
  v->u = (unsigned long long)(x * mult);
  return 0;
}

static int parse_choice(const flag_spec *f, const char *s, flag_value *v, char *why, size_t n) {
  size_t k = (size_t)snprintf(why, n, "'%s' is not one of ", s);
  for (const flag_choice *c = f->choices; c->name; c++) {
    if (strcmp(c->name, s) == 0) return v->choice = c->value, 0;
    if (k < n) k += (size_t)snprintf(why + k, n - k, "%s%s", c == f->choices ? "" : "/", c->name);
  }
  return -1;
}

/* Each kind's parser and what a value that fails it "is not" (NULL: the parser says). */
static const struct {
  parse_fn parse;
  const char *expect;
} kinds[] = {
    [FLAG_BOOL] = {parse_text, NULL},
    [FLAG_STR] = {parse_text, NULL},
    [FLAG_POS_INT] = {parse_integer, "a positive integer"},
    [FLAG_NONNEG_INT] = {parse_integer, "a non-negative integer"},
    [FLAG_INT_RANGE] = {parse_integer, "an integer"},
    [FLAG_POS_I64] = {parse_integer, "a positive integer"},
    [FLAG_U64] = {parse_u64, "a non-negative integer"},
    [FLAG_POS_FLOAT] = {parse_number, "a positive number"},
    [FLAG_NONNEG_FLOAT] = {parse_number, "a non-negative number"},
    [FLAG_UNIT_FLOAT] = {parse_number, "a number in [0, 1)"},
    [FLAG_FLOAT_RANGE] = {parse_number, "a number"},
    [FLAG_BETAS] = {parse_betas, "two numbers B1,B2"},
    [FLAG_MEAN_STD] = {parse_mean_std, "two numbers MEAN,STD"},
    [FLAG_WIDTHS] = {parse_widths, "a list of positive widths"},
    [FLAG_NUMBERS] = {parse_numbers, "a list of non-negative numbers"},
    [FLAG_SIZE] = {parse_size, "a size (bytes, optionally with K, M or G)"},
    [FLAG_CHOICE] = {parse_choice, NULL},
};

/* ---- parsing ------------------------------------------------------------------ */
/* The fix an error about flag f suggests: its example, else the set's hint. */
static const char *fix_for(const flag_set *set, const flag_spec *f, char *buf, size_t n) {
  if (!f->example) return set->hint;
  snprintf(buf, n, "e.g. %s %s", f->name, f->example);
  return buf;
}

/* What a bad value of f "is not": the row's words, else its kind's (and the row's range). */
static void expect_of(const flag_spec *f, char *buf, size_t n) {
  if (f->expect)
    snprintf(buf, n, "%s", f->expect);
  else if (f->kind == FLAG_INT_RANGE || f->kind == FLAG_FLOAT_RANGE)
    snprintf(buf, n, "%s in [%g, %g]", kinds[f->kind].expect, f->lo, f->hi);
  else
    snprintf(buf, n, "%s", kinds[f->kind].expect);
}

/* Checks and stores one value; prints the error line and returns FLAGS_EXIT_USAGE if it is malformed. */
static int parse_value(const flag_set *set, const flag_spec *f, const char *s, flag_value *v) {
  char why[768] = "", eg[128];
  v->raw = s;
  if (!*s) {
    snprintf(why, sizeof why, "the value is empty");
  } else if (kinds[f->kind].parse(f, s, v, why, sizeof why) == 0) {
    return 0;
  } else if (!why[0]) {
    char expect[128];
    expect_of(f, expect, sizeof expect);
    snprintf(why, sizeof why, "'%s' is not %s", s, expect);
  }
  return flags_usage_error(set->prog, fix_for(set, f, eg, sizeof eg), "%s: %s", f->name, why);
}

static int find_flag(const flag_set *set, const char *a, size_t len) {
  for (int id = 0; id < set->n_flags; id++) {
    const char *name = set->flags[id].name, *alias = set->flags[id].alias;
    if (strlen(name) == len && strncmp(name, a, len) == 0) return id;
    if (alias && strlen(alias) == len && strncmp(alias, a, len) == 0) return id;
  }
  return -1;
}

/* Parses the flag at argv[*i] (and its value, which may be argv[*i + 1]). */
static int parse_flag(const flag_set *set, int argc, char **argv, int *i, flag_args *out) {
  const char *a = argv[*i], *eq = strchr(a, '=');
  size_t len = eq ? (size_t)(eq - a) : strlen(a);
  int id = find_flag(set, a, len);
  if (id < 0) return flags_usage_error(set->prog, set->hint, "unknown flag '%.*s'", (int)len, a);
  const flag_spec *f = &set->flags[id];
  flag_value *v = &out->v[id];
  if (v->given) return flags_usage_error(set->prog, "give each flag once", "%s given twice", f->name);
  v->given = 1;
  if (f->kind == FLAG_BOOL) return eq ? flags_usage_error(set->prog, set->hint, "%s takes no value", f->name) : 0;
  const char *s = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
  char eg[128];
  if (!s) return flags_usage_error(set->prog, fix_for(set, f, eg, sizeof eg), "%s needs a value", f->name);
  return parse_value(set, f, s, v);
}

/* A table with a missing row (a flag id without its designated initialiser) is our bug: stop at once. */
static void check_table(const flag_set *set) {
  int bad = set->n_flags > FLAGS_MAX ? set->n_flags : -1;
  for (int id = 0; id < set->n_flags && bad < 0; id++) {
    const flag_spec *f = &set->flags[id];
    if (!f->name || !f->help || (f->kind == FLAG_BOOL) != !f->metavar || (f->kind == FLAG_CHOICE && !f->choices))
      bad = id;
  }
  if (bad < 0) return;
  fprintf(stderr, "%s: internal error: the flag table has no complete row for id %d\n", set->prog, bad);
  abort();
}

int flags_parse(const flag_set *set, int argc, char **argv, flag_args *out) {
  check_table(set);
  memset(out, 0, sizeof *out);
  out->prog = set->prog;
  int stop = set->n_pos_max == FLAGS_STOP, i = 0;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return FLAGS_HELP;
    if (stop && strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] == '-' && a[1] != '\0') {
      int rc = parse_flag(set, argc, argv, &i, out);
      if (rc) return rc;
    } else if (stop) {
      break;
    } else if (out->n_pos == set->n_pos_max || out->n_pos == FLAGS_MAX_POS) {
      return flags_usage_error(set->prog, set->hint, "unexpected argument '%s'", a);
    } else {
      out->pos[out->n_pos++] = a;
    }
  }
  out->rest = i;
  out->argc = argc;
  out->argv = argv;
  return 0;
}

/* ---- help --------------------------------------------------------------------- */
/* "--name METAVAR" and ", --alias" when there is one. */
static void flag_head(const flag_spec *s, char *buf, size_t n) {
  snprintf(buf, n, "%s%s%s%s%s", s->name, s->metavar ? " " : "", s->metavar ? s->metavar : "",
           s->alias ? ", " : "", s->alias ? s->alias : "");
}

void flags_print(FILE *f, const flag_set *set) {
  for (int id = 0; id < set->n_flags; id++) {
    const flag_spec *s = &set->flags[id];
    char head[96];
    flag_head(s, head, sizeof head);
    fprintf(f, "  %-26s %s", head, s->help);
    if (s->def) fprintf(f, " (default: %s)", s->def);
    fputc('\n', f);
  }
  fprintf(f, "  %-26s %s\n", "--help, -h", "show this help and exit");
}

/* The head on its own line, then text wrapped at 92 columns under a 6-column indent. */
static void print_wrapped_row(FILE *f, const char *head, const char *text) {
  fprintf(f, "  %s\n", head);
  while (*text) {
    size_t len = strlen(text), cut = len;
    if (len > 86) {
      cut = 86;
      while (cut > 0 && text[cut] != ' ') cut--;
      if (cut == 0) cut = 86;
    }
    fprintf(f, "      %.*s\n", (int)cut, text);
    text += cut;
    while (*text == ' ') text++;
  }
}

void flags_print_wrapped(FILE *f, const flag_set *set) {
  print_wrapped_row(f, "--help", "show this help and exit");
  for (int id = 0; id < set->n_flags; id++) {
    const flag_spec *s = &set->flags[id];
    char head[96], text[1024];
    flag_head(s, head, sizeof head);
    snprintf(text, sizeof text, "%s%s%s%s", s->help, s->def ? " (default: " : "", s->def ? s->def : "",
             s->def ? ")" : "");
    print_wrapped_row(f, head, text);
  }
}

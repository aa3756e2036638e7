/* Command-line flag tables (a row per flag, indexed by the command's enum of flag ids) and their parser. */
#ifndef DT_TOOLS_FLAGS_H
#define DT_TOOLS_FLAGS_H

#include <stdio.h>

#define FLAGS_MAX 96      /* rows of one table */
#define FLAGS_MAX_POS 4   /* positional arguments kept */
#define FLAGS_MAX_LIST 16 /* numbers of a FLAG_WIDTHS list */
#define FLAGS_MAX_NUMS 64 /* numbers of a FLAG_NUMBERS list */
#define FLAGS_STOP (-1)   /* flag_set.n_pos_max: stop at "--" or at the first positional argument */
#define FLAGS_HELP (-1)   /* flags_parse: --help or -h was given */
#define FLAGS_EXIT_USAGE 2

/* What a flag's value must look like; the error says what it "is not". */
typedef enum flag_kind {
  FLAG_BOOL,         /* no value */
  FLAG_STR,          /* non-empty text */
  FLAG_POS_INT,      /* 1 .. INT_MAX */
  FLAG_NONNEG_INT,   /* 0 .. INT_MAX */
  FLAG_INT_RANGE,    /* integer in the row's [lo, hi] */
  FLAG_POS_I64,      /* 1 .. INT64_MAX */
  FLAG_U64,          /* 0 .. UINT64_MAX */
  FLAG_POS_FLOAT,    /* > 0 */
  FLAG_NONNEG_FLOAT, /* >= 0 */
  FLAG_UNIT_FLOAT,   /* [0, 1) */
  FLAG_FLOAT_RANGE,  /* number in the row's [lo, hi] */
  FLAG_BETAS,        /* B1,B2 each in [0, 1) */
  FLAG_MEAN_STD,     /* MEAN,STD with STD > 0 */
  FLAG_WIDTHS,       /* W1,W2,... positive integers */
  FLAG_NUMBERS,      /* X1,X2,... non-negative numbers */
  FLAG_SIZE,         /* bytes: 8, 64K, 1M, 2G (powers of 1024), at most 64G */
  FLAG_CHOICE,       /* one of the row's choices */
} flag_kind;

/* One accepted word of a FLAG_CHOICE flag and the value it stands for (an enum value). */
typedef struct flag_choice {
  const char *name;
  int value;
} flag_choice;

/* One row of a table. The first six fields are positional in most tables. */
typedef struct flag_spec {
  const char *name;           /* "--batch-size" */
  const char *metavar;        /* "N"; NULL for FLAG_BOOL */
  flag_kind kind;
  const char *def;            /* the default as help shows it; NULL: not shown */
  const char *example;        /* a good value: errors end "(e.g. --batch-size 64)"; NULL: the set's hint */
  const char *help;
  const flag_choice *choices; /* FLAG_CHOICE: rows ending with {NULL} */
  const char *alias;          /* another spelling ("--nproc_per_node"), or NULL */
  double lo, hi;              /* FLAG_INT_RANGE, FLAG_FLOAT_RANGE: the closed range */
  const char *expect;         /* what a bad value is not ("a port (1-65535)"); NULL: the kind's words */
} flag_spec;

/* The parsed value of one flag; the field its kind fills. */
typedef struct flag_value {
  int given;                  /* on the command line */
  const char *raw;            /* the text given (argv storage); FLAG_CHOICE: the word itself */
  long long i;                /* integer kinds */
  unsigned long long u;       /* FLAG_U64; FLAG_SIZE in bytes */
  double f;                   /* number kinds */
  double pair[2];             /* FLAG_BETAS, FLAG_MEAN_STD */
  int list[FLAGS_MAX_LIST];   /* FLAG_WIDTHS */
  int n_list;
  double nums[FLAGS_MAX_NUMS]; /* FLAG_NUMBERS */
  int n_nums;
  int choice;                 /* FLAG_CHOICE: the matched choice's value */
} flag_value;

/* One command's flags and how its errors read. */
typedef struct flag_set {
  const char *prog;        /* "dtrain train", "dtrun": starts every error line */
  const char *hint;        /* the fix of errors no example fits: "see 'dtrun --help'" */
  const flag_spec *flags;  /* flags[id], id from the command's enum; every id has a row */
  int n_flags;
  int n_pos_max;           /* positional arguments kept, or FLAGS_STOP */
} flag_set;

/* What flags_parse found: v[id] is the value of flag id. */
typedef struct flag_args {
  const char *prog;              /* the set's prog, for flags_usage_error */
  flag_value v[FLAGS_MAX];
  const char *pos[FLAGS_MAX_POS];
  int n_pos;
  int rest;                      /* index in argv of the first argument not parsed (FLAGS_STOP: the program) */
  int argc;                      /* what flags_parse read */
  char **argv;
} flag_args;

/* Parses argv (without the program and command words) against set into out.
 * "--flag value" and "--flag=value" both work; a flag given twice is an error.
 * Returns 0, FLAGS_HELP (nothing printed: the caller prints its help) or
 * FLAGS_EXIT_USAGE after printing the one error line. */
int flags_parse(const flag_set *set, int argc, char **argv, flag_args *out);

/* The one usage-error path: prints "<prog>: <what> (<fix>)" on stderr and returns FLAGS_EXIT_USAGE. */
int flags_usage_error(const char *prog, const char *fix, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Help in columns: "  --name METAVAR   help (default: def)", one line a flag, then --help, -h. */
void flags_print(FILE *f, const flag_set *set);

/* Help wrapped: "  --name METAVAR, --alias" with the help text wrapped below it; --help first. */
void flags_print_wrapped(FILE *f, const flag_set *set);

/* A decimal integer in [lo, hi] (no leading space): 0, or -1 leaving *out alone. */
int flags_int(const char *s, long long lo, long long hi, long long *out);

#endif

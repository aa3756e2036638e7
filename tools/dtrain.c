/* dtrain command-line tool: a registry of commands (train, eval, models, inspect, version, help) over flag tables. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd_bench.h"
#include "cmd_scaling.h"
#include "dtrain/dtrain.h"

/* Exit codes: 0 success, 1 runtime failure, 2 usage error, 130 interrupted (128 + SIGINT). */
enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2, EXIT_INTERRUPTED = 130 };

/* ---- flag tables ------------------------------------------------------------ */
/* What a flag's value must look like; each kind is checked by parse_value. */
typedef enum flag_kind {
  K_BOOL,      /* no value */
  K_STR,       /* non-empty text */
  K_POS_INT,   /* 1 .. INT_MAX */
  K_NONNEG_INT, /* 0 .. INT_MAX */
  K_POS_I64,   /* 1 .. INT64_MAX */
  K_U64,       /* 0 .. UINT64_MAX */
  K_POS_FLOAT, /* > 0 */
  K_NONNEG_FLOAT, /* >= 0 */
  K_UNIT_FLOAT, /* [0, 1) */
  K_BETAS,     /* B1,B2 each in [0, 1) */
  K_MEAN_STD,  /* MEAN,STD with STD > 0 */
  K_WIDTHS,    /* W1,W2,... positive integers */
  K_WEIGHTS,   /* W1,W2,... non-negative numbers */
  K_CHOICE,    /* one of choices ("a|b|c") */
  K_SIZE,      /* bytes: 8, 64K, 1M, 2G (powers of 1024) */
} flag_kind;

typedef struct flag_spec {
  const char *name;    /* "--batch-size" */
  const char *metavar; /* "N" (NULL for K_BOOL) */
  flag_kind kind;
  const char *def;     /* default, as shown in help */
  const char *example; /* a good value, for hints */
  const char *help;
  const char *choices; /* K_CHOICE: "sgd|adam|adamw" */
} flag_spec;

typedef struct flag_value {
  int given;
  const char *raw;
  long long i;
  unsigned long long u;
  double f, pair[2];
  int list[DT_TRAIN_MAX_HIDDEN], n_list;
  double weights[DT_TRAIN_MAX_POS_WEIGHT];
  int n_weights;
  int choice;
} flag_value;

#define MAX_FLAGS 64
#define MAX_POSITIONAL 4

typedef struct parsed {
  const struct command *cmd;
  flag_value v[MAX_FLAGS];
  const char *pos[MAX_POSITIONAL];
  int n_pos;
} parsed;

typedef struct command {
  const char *name;
  const char *summary;
  const char *synopsis;    /* after "dtrain <name>" */
  const char *description; /* a paragraph for help */
  const flag_spec *flags;
  int n_flags;
  int n_pos_min, n_pos_max; /* positional arguments */
  int (*run)(const parsed *p);
} command;

static const command *find_command(const char *name);
static void print_usage(const command *c, FILE *f);

/* One line on stderr: "dtrain <cmd>: <what> (<fix>)". Returns the usage exit code. */
static int usage_error(const command *c, const char *fix, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (c)
    fprintf(stderr, "dtrain %s: %s (%s)\n", c->name, what, fix);
  else
    fprintf(stderr, "dtrain: %s (%s)\n", what, fix);
  return EXIT_USAGE;
}

/* Hints for runtime failures, one row per status. */
static const struct {
  dt_status status;
  const char *hint;
} status_hints[] = {
    {DT_INVALID_ARGUMENT, "check the flags against 'dtrain help'"},
    {DT_OUT_OF_MEMORY, "use a smaller --batch-size or model"},
    {DT_IO, "check the path, its permissions and the free disk space"},
    {DT_NOT_FOUND, "check the name or path; named datasets are looked up under DT_DATA_DIR"},
    {DT_CORRUPT, "the file is damaged or not in the expected format: fetch or write it again"},
    {DT_SHAPE_MISMATCH, "the weights come from another model: give the --model and --hidden used in training"},
    {DT_UNSUPPORTED, "this build of dtrain does not support it"},
    {DT_TIMEOUT, "a rank did not answer in time: check that every rank started and reaches MASTER_ADDR, or raise DT_TIMEOUT"},
    {DT_PEER_LOST, "another rank exited or lost its connection: its own output says why"},
    {DT_MISMATCH, "every rank must run the same program with the same flags and WORLD_SIZE"},
    {DT_USAGE, "see 'dtrain models' for the tasks each model supports, and --data in 'dtrain train --help'"},
};

/* One line on stderr: "dtrain: <detail> (<hint>)"; file_hint replaces the
 * generic hint for a missing or unreadable file. Returns the runtime exit code. */
static int runtime_error(dt_status s, const char *file_hint) {
  char detail[1024];
  const char *d = dt_last_error();
  snprintf(detail, sizeof detail, "%s", (d && *d) ? d : dt_status_message(s));
  for (char *c = detail; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
  const char *hint = "run with DT_DEBUG=info for more detail";
  for (size_t i = 0; i < sizeof status_hints / sizeof status_hints[0]; i++)
    if (status_hints[i].status == s) hint = status_hints[i].hint;
  if (file_hint && (s == DT_NOT_FOUND || s == DT_IO)) hint = file_hint;
  fprintf(stderr, "dtrain: %s (%s)\n", detail, hint);
  return s == DT_USAGE ? EXIT_USAGE : EXIT_RUNTIME;
}

static int parse_ll(const char *s, long long *out) {
  char *end;
  errno = 0;
  if (!*s || *s == ' ') return -1;
  long long x = strtoll(s, &end, 10);
  if (errno || *end) return -1;
  *out = x;
  return 0;
}

static int parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  if (!*s || *s == ' ') return -1;
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

static int choice_index(const char *choices, const char *s) {
  size_t n = strlen(s);
  int idx = 0;
  for (const char *c = choices; *c; idx++) {
    const char *bar = strchr(c, '|');
    size_t len = bar ? (size_t)(bar - c) : strlen(c);
    if (len == n && strncmp(c, s, n) == 0) return idx;
    if (!bar) break;
    c = bar + 1;
  }
  return -1;
}

/* Checks and stores one value; prints the error line and returns EXIT_USAGE if it is malformed. */
static int parse_value(const command *c, const flag_spec *f, const char *s, flag_value *v) {
  char eg[128];
  snprintf(eg, sizeof eg, "e.g. %s %s", f->name, f->example ? f->example : "");
  v->raw = s;
  switch (f->kind) {
  case K_BOOL:
    return 0;
  case K_STR:
    if (!*s) return usage_error(c, eg, "%s: the value is empty", f->name);
    return 0;
  case K_POS_INT:
  case K_NONNEG_INT:
  case K_POS_I64: {
    long long lo = f->kind == K_NONNEG_INT ? 0 : 1;
    long long hi = f->kind == K_POS_I64 ? LLONG_MAX : INT_MAX;
    if (parse_ll(s, &v->i) || v->i < lo || v->i > hi)
      return usage_error(c, eg, "%s: '%s' is not a %s integer", f->name, s, lo ? "positive" : "non-negative");
    return 0;
  }
  case K_U64: {
    char *end;
    errno = 0;
    if (!*s || *s == '-' || *s == '+' || *s == ' ' || (v->u = strtoull(s, &end, 10), errno) || *end)
      return usage_error(c, eg, "%s: '%s' is not a non-negative integer", f->name, s);
    return 0;
  }
  case K_POS_FLOAT:
    if (parse_double(s, &v->f) || !(v->f > 0)) return usage_error(c, eg, "%s: '%s' is not a positive number", f->name, s);
    return 0;
  case K_NONNEG_FLOAT:
    if (parse_double(s, &v->f) || !(v->f >= 0))
      return usage_error(c, eg, "%s: '%s' is not a non-negative number", f->name, s);
    return 0;
  case K_UNIT_FLOAT:
    if (parse_double(s, &v->f) || !(v->f >= 0 && v->f < 1))
      return usage_error(c, eg, "%s: '%s' is not a number in [0, 1)", f->name, s);
    return 0;
  case K_BETAS:
    if (parse_pair(s, v->pair)) return usage_error(c, eg, "%s: '%s' is not two numbers B1,B2", f->name, s);
    if (!(v->pair[0] >= 0 && v->pair[0] < 1 && v->pair[1] >= 0 && v->pair[1] < 1))
      return usage_error(c, eg, "%s: '%s': both betas must be in [0, 1)", f->name, s);
    return 0;
  case K_MEAN_STD:
    if (parse_pair(s, v->pair)) return usage_error(c, eg, "%s: '%s' is not two numbers MEAN,STD", f->name, s);
    if (!(v->pair[1] > 0)) return usage_error(c, eg, "%s: '%s': STD must be positive", f->name, s);
    return 0;
  case K_WIDTHS: {
    char buf[512];
    if (strlen(s) >= sizeof buf) return usage_error(c, eg, "%s: the list is too long", f->name);
    strcpy(buf, s);
    v->n_list = 0;
    char *save = NULL;
    int empty = *s == '\0' || s[strlen(s) - 1] == ',' || *s == ',' || strstr(s, ",,") != NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && !empty; tok = strtok_r(NULL, ",", &save)) {
      long long w;
      if (parse_ll(tok, &w) || w < 1 || w > (1 << 24))
        return usage_error(c, eg, "%s: '%s' is not a list of positive widths", f->name, s);
      if (v->n_list == DT_TRAIN_MAX_HIDDEN)
        return usage_error(c, eg, "%s: '%s' has more than %d widths", f->name, s, DT_TRAIN_MAX_HIDDEN);
      v->list[v->n_list++] = (int)w;
    }
    if (empty || v->n_list == 0) return usage_error(c, eg, "%s: '%s' is not a list of positive widths", f->name, s);
    return 0;
  }
  case K_WEIGHTS: {
    char buf[1024];
    if (strlen(s) >= sizeof buf) return usage_error(c, eg, "%s: the list is too long", f->name);
    strcpy(buf, s);
    v->n_weights = 0;
    char *save = NULL;
    int empty = *s == '\0' || s[strlen(s) - 1] == ',' || *s == ',' || strstr(s, ",,") != NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && !empty; tok = strtok_r(NULL, ",", &save)) {
      if (v->n_weights == DT_TRAIN_MAX_POS_WEIGHT)
        return usage_error(c, eg, "%s: more than %d values", f->name, DT_TRAIN_MAX_POS_WEIGHT);
      if (parse_double(tok, &v->weights[v->n_weights]) || v->weights[v->n_weights] < 0)
        return usage_error(c, eg, "%s: '%s' is not a list of non-negative numbers", f->name, s);
      v->n_weights++;
    }
    if (empty) return usage_error(c, eg, "%s: '%s' is not a list of non-negative numbers", f->name, s);
    return 0;
  }
  case K_SIZE: {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    double mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, end++;
    if (errno || end == s || *end || !(x >= 0) || x * mult > 64.0 * 1024 * 1024 * 1024)
      return usage_error(c, eg, "%s: '%s' is not a size (bytes, optionally with K, M or G)", f->name, s);
    v->u = (unsigned long long)(x * mult);
    return 0;
  }
  case K_CHOICE: {
    v->choice = choice_index(f->choices, s);
    if (v->choice < 0) {
      char list[128];
      snprintf(list, sizeof list, "%s", f->choices);
      for (char *p = list; *p; p++)
        if (*p == '|') *p = '/';
      return usage_error(c, eg, "%s: '%s' is not one of %s", f->name, s, list);
    }
    return 0;
  }
  }
  return 0;
}

/* Parses argv (after the command name) against c's flag table. Returns 0, an
 * exit code, or -1 when --help was printed. "--flag value" and "--flag=value"
 * both work; a flag given twice is an error, not "last wins". */
static int parse_args(const command *c, int argc, char **argv, parsed *p) {
  memset(p, 0, sizeof *p);
  p->cmd = c;
  char hint[96];
  snprintf(hint, sizeof hint, "see 'dtrain %s --help'", c->name);
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      print_usage(c, stdout);
      return -1;
    }
    if (a[0] != '-' || a[1] == '\0') {
      if (p->n_pos == c->n_pos_max || p->n_pos == MAX_POSITIONAL)
        return usage_error(c, hint, "unexpected argument '%s'", a);
      p->pos[p->n_pos++] = a;
      continue;
    }
    char name[64];
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    if (len >= sizeof name) len = sizeof name - 1;
    memcpy(name, a, len);
    name[len] = '\0';
    int k = -1;
    for (int j = 0; j < c->n_flags; j++)
      if (strcmp(c->flags[j].name, name) == 0) k = j;
    if (k < 0) return usage_error(c, hint, "unknown flag '%s'", name);
    const flag_spec *f = &c->flags[k];
    flag_value *v = &p->v[k];
    if (v->given) return usage_error(c, "give each flag once", "%s given twice", f->name);
    v->given = 1;
    if (f->kind == K_BOOL) {
      if (eq) return usage_error(c, hint, "%s takes no value", f->name);
      continue;
    }
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!val) {
      char eg[128];
      snprintf(eg, sizeof eg, "e.g. %s %s", f->name, f->example ? f->example : "");
      return usage_error(c, eg, "%s needs a value", f->name);
    }
    int rc = parse_value(c, f, val, v);
    if (rc) return rc;
  }
  if (p->n_pos < c->n_pos_min) return usage_error(c, hint, "missing argument: %s", c->synopsis);
  return 0;
}

/* The value of flag `name` (which must be in the command's table). */
static const flag_value *flag(const parsed *p, const char *name) {
  for (int j = 0; j < p->cmd->n_flags; j++)
    if (strcmp(p->cmd->flags[j].name, name) == 0) return &p->v[j];
  fprintf(stderr, "dtrain: internal error: flag %s is not in the table of '%s'\n", name, p->cmd->name);
  abort();
}

static void print_tunable(const char *name, const char *def, const char *doc, void *user) {
  fprintf((FILE *)user, "  %-22s %s (default: %s)\n", name, doc, def);
}

static void print_usage(const command *c, FILE *f) {
  fprintf(f, "usage: dtrain %s %s\n\n%s\n", c->name, c->synopsis, c->description);
  fprintf(f, "\nflags:\n");
  for (int i = 0; i < c->n_flags; i++) {
    const flag_spec *s = &c->flags[i];
    char left[64];
    snprintf(left, sizeof left, "%s%s%s", s->name, s->metavar ? " " : "", s->metavar ? s->metavar : "");
    fprintf(f, "  %-26s %s", left, s->help);
    if (s->def) fprintf(f, " (default: %s)", s->def);
    fputc('\n', f);
  }
  fprintf(f, "  %-26s %s\n", "--help, -h", "show this help and exit");
  fprintf(f, "\nenvironment:\n");
  dt_tunables_each(print_tunable, f);
  fprintf(f, "\nA flag takes its value as '--flag VALUE' or '--flag=VALUE'; giving a flag twice is an error.\n");
  fprintf(f, "exit status: 0 success, 1 runtime failure, 2 usage error, 130 interrupted\n");
}

/* ---- shared helpers --------------------------------------------------------- */
typedef struct zoo_lookup {
  const char *want;
  int found;
  char names[256];
} zoo_lookup;

static void zoo_visit(const char *name, const char *doc, void *user) {
  zoo_lookup *z = user;
  if (z->want && strcmp(z->want, name) == 0) z->found = 1;
  size_t n = strlen(z->names);
  snprintf(z->names + n, sizeof z->names - n, "%s%s", n ? ", " : "", name);
}

/* An unknown model is a usage error: say which ones exist. */
static int check_model(const command *c, const char *name) {
  zoo_lookup z = {.want = name};
  dt_model_zoo_each(zoo_visit, &z);
  if (z.found) return 0;
  return usage_error(c, "see 'dtrain models'", "--model: unknown model '%s' (known: %s)", name,
                     z.names[0] ? z.names : "none");
}

static void format_bytes(size_t b, char *buf, size_t len) {
  if (b >= (size_t)1 << 30)
    snprintf(buf, len, "%.2f GiB", (double)b / (1 << 30));
  else
    snprintf(buf, len, "%.1f MiB", (double)b / (1 << 20));
}

/* ---- train ------------------------------------------------------------------- */
static const flag_spec train_flags[] = {
    {"--model", "NAME", K_STR, "fashioncnn", "mlp", "model from the zoo (see 'dtrain models')", NULL},
    {"--hidden", "W1,W2,...", K_WIDTHS, "the model's own", "256,128", "hidden layer widths of mlp", NULL},
    {"--dropout", "P", K_UNIT_FLOAT, "the model's own", "0.2", "dropout probability, overriding the model's", NULL},
    {"--data", "SOURCE", K_STR, "fashion-mnist", "fashion-mnist",
     "dataset name (fashion-mnist, mnist; under DT_DATA_DIR) or a directory of IDX files", NULL},
    {"--normalize", "MEAN,STD", K_MEAN_STD, "none: x/255", "0.2860,0.3530", "also normalise inputs as (x/255 - MEAN)/STD",
     NULL},
    {"--limit-train", "N", K_POS_I64, "all", "2000",
     "train on the first N training samples only (shuffled among themselves each epoch)", NULL},
    {"--limit-test", "N", K_POS_I64, "all", "500", "evaluate on the first N test samples only", NULL},
    {"--epochs", "N", K_POS_INT, "1", "3", "passes over the training data", NULL},
    {"--batch-size", "N", K_POS_INT, "64", "64", "samples per optimizer step", NULL},
    {"--optimizer", "NAME", K_CHOICE, "sgd", "adam", "sgd, adam or adamw (PyTorch's update rules)", "sgd|adam|adamw"},
    {"--lr", "X", K_POS_FLOAT, "0.01 for sgd, 0.001 for adam/adamw", "0.01", "base learning rate", NULL},
    {"--momentum", "X", K_NONNEG_FLOAT, "0", "0.9", "SGD momentum (as torch.optim.SGD)", NULL},
    {"--dampening", "X", K_NONNEG_FLOAT, "0", "0", "SGD momentum dampening", NULL},
    {"--nesterov", NULL, K_BOOL, "off", NULL, "Nesterov momentum (needs --momentum > 0 and no dampening)", NULL},
    {"--weight-decay", "X", K_NONNEG_FLOAT, "0; 0.01 for adamw", "0.0005",
     "L2 penalty (sgd, adam) or decoupled weight decay (adamw)", NULL},
    {"--betas", "B1,B2", K_BETAS, "0.9,0.999", "0.9,0.999", "Adam/AdamW moment decay rates", NULL},
    {"--eps", "X", K_POS_FLOAT, "1e-8", "1e-8", "Adam/AdamW denominator epsilon", NULL},
    {"--schedule", "NAME", K_CHOICE, "constant", "cosine", "learning-rate schedule: constant, step or cosine",
     "constant|step|cosine"},
    {"--step-size", "EPOCHS", K_POS_INT, "1", "10", "step schedule: multiply the lr by --gamma every EPOCHS epochs",
     NULL},
    {"--gamma", "X", K_POS_FLOAT, "0.1", "0.1", "step schedule: decay factor", NULL},
    {"--min-lr", "X", K_NONNEG_FLOAT, "0", "0.0001", "cosine schedule: final learning rate (eta_min)", NULL},
    {"--warmup-epochs", "N", K_NONNEG_INT, "0", "1",
     "linear warm-up over the first N epochs, from lr/3 (torch LinearLR)", NULL},
    {"--warmup-steps", "N", K_NONNEG_INT, "0", "500", "linear warm-up over the first N optimizer steps instead", NULL},
    {"--clip-grad-norm", "X", K_POS_FLOAT, "off", "1.0", "clip the global gradient L2 norm to X", NULL},
    {"--label-smoothing", "X", K_UNIT_FLOAT, "0", "0.1", "classification: cross-entropy label smoothing in [0, 1)", NULL},
    {"--loss", "NAME", K_CHOICE, "mse", "l1", "regression: mse (torch.nn.MSELoss) or l1 (L1Loss)", "mse|l1"},
    {"--pos-weight", "W[,W...]", K_WEIGHTS, "none", "3.0",
     "multilabel: BCEWithLogitsLoss pos_weight, one value for every label or one per label", NULL},
    {"--val-fraction", "F", K_UNIT_FLOAT, "off", "0.1",
     "hold out this fraction of the training data for validation (a split by --seed); for sources without a test "
     "split", NULL},
    {"--val-data", "SOURCE", K_STR, "the source's test split", "synthetic:512,seed=1",
     "validate on this source instead (its test split, or its only split)", NULL},
    {"--threads", "N", K_NONNEG_INT, "DT_NUM_THREADS, OMP_NUM_THREADS or all cores", "4", "compute threads", NULL},
    {"--seed", "N", K_U64, "0", "42", "seed of initialisation, shuffling and dropout", NULL},
    {"--out", "DIR", K_STR, "runs/<model>-<yyyymmdd-hhmmss>", "runs/exp1",
     "output directory: metrics.csv, metrics.jsonl, config.json, summary.json, model.safetensors", NULL},
    {"--progress", "MODE", K_CHOICE, "auto", "plain",
     "auto (a bar on a terminal, else plain), bar, plain (a line per ~10% of an epoch) or none (epoch lines only)",
     "auto|bar|plain|none"},
    {"--quiet", NULL, K_BOOL, "off", NULL, "print nothing but errors", NULL},
    {"--strategy", "NAME", K_CHOICE, "single", "ddp",
     "single (one process), dp (worker threads on slices of each batch, like nn.DataParallel) or ddp (one process "
     "per worker under dtrun/torchrun/mpirun/srun, like DistributedDataParallel)",
     "single|dp|ddp"},
    {"--workers", "N", K_POS_INT, "the thread budget", "2", "dp: worker threads", NULL},
    {"--accumulate", "K", K_POS_INT, "1", "4",
     "batches per optimizer step (gradient accumulation; ddp all-reduces on the last one only)", NULL},
    {"--backend", "NAME", K_CHOICE, "auto", "shm",
     "ddp: auto (shm on one host, tcp across hosts, shm+tcp when both, mpi under mpirun), shm, tcp or mpi",
     "auto|shm|tcp|mpi"},
    {"--master", "HOST:PORT", K_STR, "MASTER_ADDR:MASTER_PORT", "10.0.0.1:29500",
     "ddp: where rank 0 (or dtrun) serves the rendezvous store, e.g. under mpirun", NULL},
    {"--bucket-cap-mb", "MB", K_POS_FLOAT, "25", "25", "ddp: gradient bucket size cap in MiB", NULL},
    {"--first-bucket-mb", "MB", K_POS_FLOAT, "1", "1", "ddp: size of the first bucket (the last layers) in MiB", NULL},
    {"--broadcast-buffers", "on|off", K_CHOICE, "on", "off",
     "ddp: broadcast batch-norm statistics from rank 0 before every forward, as PyTorch does", "on|off"},
    {"--find-unused-parameters", NULL, K_BOOL, "off", NULL,
     "ddp: reduce parameters that got no gradient as zeros instead of failing", NULL},
    {"--comm-hook", "NAME", K_CHOICE, "none", "bf16",
     "ddp: compress gradients for the all-reduce: none, bf16 or fp16 (divided by the world size first)",
     "none|bf16|fp16"},
    {"--timeout", "SECONDS", K_POS_FLOAT, "DT_TIMEOUT (300)", "60",
     "ddp: how long the rendezvous and each all-reduce may wait for the other ranks", NULL},
    {"--save-every", "EPOCHS", K_POS_INT, "off", "1",
     "write a snapshot (weights, optimizer state, position) to DIR/snapshots after every EPOCHS epochs", NULL},
    {"--save-every-steps", "N", K_POS_I64, "off", "500", "write a snapshot every N optimizer steps", NULL},
    {"--keep", "K", K_POS_INT, "3", "2", "keep the newest K snapshots, delete older ones", NULL},
    {"--save-on-interrupt", NULL, K_BOOL, "off", NULL,
     "Ctrl-C (SIGINT) writes a snapshot where the run stopped, to resume from that step", NULL},
    {"--resume", "auto|PATH", K_STR, "off", "auto",
     "continue from a snapshot: auto = the newest loadable one in --out DIR (none: start afresh), or a file", NULL},
    {"--tensorboard", "DIR", K_STR, "off", "runs/tb",
     "write TensorBoard event files (loss, accuracy, lr, throughput per step) to DIR", NULL},
    {"--tensorboard-all-ranks", NULL, K_BOOL, "off", NULL,
     "ddp: every rank writes its own events (rank R > 0 into DIR/rank<R>), not only rank 0", NULL},
    {"--log-every", "N", K_POS_INT, "10", "50", "TensorBoard training scalars: means over every N optimizer steps",
     NULL},
    {"--trace", "FILE", K_STR, "off", "runs/exp1/trace.json",
     "write a Chrome trace (Perfetto, chrome://tracing) of every rank and thread to FILE at the end", NULL},
};

static void on_sigint(int sig) {
  (void)sig;
  dt_train_request_stop(); /* SA_RESETHAND: a second Ctrl-C ends the process at once */
}

static void install_sigint(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

static void print_train_summary(const dt_train_config *cfg, const dt_train_result *r, FILE *f) {
  char rss[32];
  format_bytes(r->peak_rss_bytes, rss, sizeof rss);
  fprintf(f, "\nsummary (%s, %zu parameters, %d epoch(s)%s)\n", cfg->model, r->params, r->epochs_done,
          r->interrupted ? ", interrupted" : "");
  fprintf(f, "  %-22s %.2f s\n", "wall time", r->wall_seconds);
  fprintf(f, "  %-22s %.2f s user, %.2f s sys\n", "CPU time", r->cpu_user_seconds, r->cpu_sys_seconds);
  fprintf(f, "  %-22s %.2f s compute, %.2f s waiting for data, %.2f s communication\n", "training time",
          r->compute_seconds, r->data_wait_seconds, r->comm_seconds);
  if (cfg->strategy == DT_STRATEGY_DDP)
    fprintf(f, "  %-22s %d ranks over %s, all-reduce %.2f s of which %.0f%% hidden behind backward\n", "ddp",
            r->world_size, r->backend, r->comm_total_seconds, 100 * r->comm_hidden);
  fprintf(f, "  %-22s %.0f samples/s\n", "train throughput", r->train_samples_per_s);
  fprintf(f, "  %-22s %.0f samples/s\n", "inference throughput", r->infer_samples_per_s);
  if (r->test_loss != r->test_loss)
    fprintf(f, "  %-22s %s\n", "test", "none: no validation data (give --val-fraction or --val-data)");
  for (int i = 0; i < r->metrics.n_eval && r->test_loss == r->test_loss; i++) {
    const dt_metric_desc *d = &r->metrics.eval[i];
    char name[64];
    snprintf(name, sizeof name, "test %s", d->label);
    if (d->percent) fprintf(f, "  %-22s %.2f%%\n", name, 100 * r->test_metric[i]);
    else fprintf(f, "  %-22s %.4f\n", name, r->test_metric[i]);
  }
  fprintf(f, "  %-22s %s\n", "peak RSS", rss);
  if (cfg->out_dir) fprintf(f, "  %-22s %s\n", "outputs", cfg->out_dir);
}

static int cmd_train(const parsed *p) {
  const command *c = p->cmd;
  dt_train_config cfg;
  dt_train_config_default(&cfg);
  const flag_value *v;
  if ((v = flag(p, "--model"))->given) cfg.model = v->raw;
  int rc = check_model(c, cfg.model);
  if (rc) return rc;
  if ((v = flag(p, "--hidden"))->given) {
    /* Only mlp has widths to choose; the zoo would silently ignore them elsewhere. */
    if (strcmp(cfg.model, "mlp") != 0)
      return usage_error(c, "add --model mlp, or drop --hidden", "--hidden applies only to --model mlp, not %s",
                         cfg.model);
    cfg.n_hidden = v->n_list;
    memcpy(cfg.hidden, v->list, sizeof v->list);
  }
  if ((v = flag(p, "--dropout"))->given) cfg.dropout = (float)v->f;
  if ((v = flag(p, "--data"))->given) cfg.data = v->raw;
  if ((v = flag(p, "--normalize"))->given) {
    cfg.normalize.enabled = 1;
    cfg.normalize.mean = (float)v->pair[0];
    cfg.normalize.std = (float)v->pair[1];
  }
  if ((v = flag(p, "--limit-train"))->given) cfg.limit_train = v->i;
  if ((v = flag(p, "--limit-test"))->given) cfg.limit_test = v->i;
  if ((v = flag(p, "--epochs"))->given) cfg.epochs = (int)v->i;
  if ((v = flag(p, "--batch-size"))->given) cfg.batch_size = (int)v->i;

  /* Optimizer: its own defaults first, then the flags that apply to it. */
  dt_optim_kind kind = DT_OPTIM_SGD;
  if ((v = flag(p, "--optimizer"))->given) {
    static const dt_optim_kind kinds[] = {DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW};
    kind = kinds[v->choice];
  }
  dt_optim_config_default(kind, &cfg.optim);
  cfg.lr = kind == DT_OPTIM_SGD ? 0.01f : 0.001f;
  const char *sgd_only[] = {"--momentum", "--dampening", "--nesterov"};
  const char *adam_only[] = {"--betas", "--eps"};
  for (size_t i = 0; i < 3; i++)
    if (kind != DT_OPTIM_SGD && flag(p, sgd_only[i])->given)
      return usage_error(c, "use it with --optimizer sgd", "%s does not apply to --optimizer %s", sgd_only[i],
                         dt_optim_kind_name(kind));
  for (size_t i = 0; i < 2; i++)
    if (kind == DT_OPTIM_SGD && flag(p, adam_only[i])->given)
      return usage_error(c, "use it with --optimizer adam or adamw", "%s does not apply to --optimizer sgd",
                         adam_only[i]);
  if ((v = flag(p, "--lr"))->given) cfg.lr = (float)v->f;
  if ((v = flag(p, "--momentum"))->given) cfg.optim.momentum = (float)v->f;
  if ((v = flag(p, "--dampening"))->given) cfg.optim.dampening = (float)v->f;
  if (flag(p, "--nesterov")->given) {
    if (!(cfg.optim.momentum > 0) || cfg.optim.dampening != 0)
      return usage_error(c, "e.g. --momentum 0.9 --nesterov", "--nesterov needs --momentum > 0 and zero --dampening");
    cfg.optim.nesterov = 1;
  }
  if ((v = flag(p, "--weight-decay"))->given) cfg.optim.weight_decay = (float)v->f;
  if ((v = flag(p, "--betas"))->given) {
    cfg.optim.beta1 = (float)v->pair[0];
    cfg.optim.beta2 = (float)v->pair[1];
  }
  if ((v = flag(p, "--eps"))->given) cfg.optim.eps = (float)v->f;

  /* Schedule: flags of one schedule are errors under another. */
  if ((v = flag(p, "--schedule"))->given) {
    static const dt_sched_kind kinds[] = {DT_SCHED_CONSTANT, DT_SCHED_STEP, DT_SCHED_COSINE};
    cfg.schedule = kinds[v->choice];
  }
  if (cfg.schedule != DT_SCHED_STEP && (flag(p, "--step-size")->given || flag(p, "--gamma")->given))
    return usage_error(c, "add --schedule step", "--step-size and --gamma apply only to --schedule step");
  if (cfg.schedule != DT_SCHED_COSINE && flag(p, "--min-lr")->given)
    return usage_error(c, "add --schedule cosine", "--min-lr applies only to --schedule cosine");
  if ((v = flag(p, "--step-size"))->given) cfg.step_size_epochs = (int)v->i;
  if ((v = flag(p, "--gamma"))->given) cfg.gamma = (float)v->f;
  if ((v = flag(p, "--min-lr"))->given) cfg.min_lr = (float)v->f;
  if (flag(p, "--warmup-epochs")->given && flag(p, "--warmup-steps")->given)
    return usage_error(c, "give one of them", "--warmup-epochs and --warmup-steps conflict");
  if ((v = flag(p, "--warmup-epochs"))->given) cfg.warmup_epochs = (int)v->i;
  if ((v = flag(p, "--warmup-steps"))->given) cfg.warmup_steps = v->i;
  if ((v = flag(p, "--clip-grad-norm"))->given) cfg.clip_grad_norm = (float)v->f;
  if ((v = flag(p, "--label-smoothing"))->given) cfg.label_smoothing = (float)v->f;
  if ((v = flag(p, "--loss"))->given) cfg.regression_loss = v->choice == 1 ? DT_LOSS_L1 : DT_LOSS_MSE;
  if ((v = flag(p, "--pos-weight"))->given) {
    cfg.n_pos_weight = v->n_weights;
    for (int i = 0; i < v->n_weights; i++) cfg.pos_weight[i] = (float)v->weights[i];
  }
  if ((v = flag(p, "--val-fraction"))->given) {
    if (v->f <= 0) return usage_error(c, "e.g. --val-fraction 0.1", "--val-fraction: '%s' must be in (0, 1)", v->raw);
    cfg.val_fraction = v->f;
  }
  if ((v = flag(p, "--val-data"))->given) cfg.val_data = v->raw;
  if (cfg.val_data && cfg.val_fraction > 0)
    return usage_error(c, "drop one of them", "--val-fraction and --val-data both choose the validation data");
  if ((v = flag(p, "--threads"))->given) cfg.threads = (int)v->i;
  if ((v = flag(p, "--seed"))->given) cfg.seed = v->u;
  if (dt_set_threads(cfg.threads) != DT_OK) return usage_error(c, "e.g. --threads 4", "%s", dt_last_error());

  /* Strategy: the flags of one strategy are errors under another. */
  if ((v = flag(p, "--strategy"))->given) cfg.strategy = (dt_strategy)v->choice;
  if ((v = flag(p, "--workers"))->given) {
    if (cfg.strategy != DT_STRATEGY_DP) return usage_error(c, "add --strategy dp", "--workers applies only to --strategy dp");
    cfg.workers = (int)v->i;
  }
  const char *ddp_only[] = {"--backend", "--master", "--bucket-cap-mb", "--first-bucket-mb", "--broadcast-buffers",
                            "--find-unused-parameters", "--comm-hook", "--timeout"};
  for (size_t i = 0; i < sizeof ddp_only / sizeof ddp_only[0]; i++)
    if (cfg.strategy != DT_STRATEGY_DDP && flag(p, ddp_only[i])->given)
      return usage_error(c, "add --strategy ddp", "%s applies only to --strategy ddp", ddp_only[i]);
  if ((v = flag(p, "--accumulate"))->given) cfg.accumulate = (int)v->i;
  static const char *const backends[] = {"auto", "shm", "tcp", "mpi"};
  if ((v = flag(p, "--backend"))->given) cfg.backend = backends[v->choice];
  if ((v = flag(p, "--master"))->given) cfg.master = v->raw;
  if ((v = flag(p, "--bucket-cap-mb"))->given) cfg.ddp.bucket_cap_mb = v->f;
  if ((v = flag(p, "--first-bucket-mb"))->given) cfg.ddp.first_bucket_mb = v->f;
  if ((v = flag(p, "--broadcast-buffers"))->given) cfg.ddp.broadcast_buffers = v->choice == 0;
  if (flag(p, "--find-unused-parameters")->given) cfg.ddp.find_unused_parameters = 1;
  if ((v = flag(p, "--comm-hook"))->given) cfg.ddp.comm_hook = (dt_comm_hook)v->choice;
  if ((v = flag(p, "--timeout"))->given) cfg.timeout_s = v->f;
  /* Under a launcher only rank 0 speaks; the others print nothing but errors. */
  int rank = 0;
  if (cfg.strategy == DT_STRATEGY_DDP) {
    char url[300];
    if (cfg.master) snprintf(url, sizeof url, "tcp://%s", cfg.master);
    dt_dist_env env;
    if (dt_dist_env_detect(cfg.master ? url : NULL, -1, -1, &env) != DT_OK) {
      fprintf(stderr, "dtrain: %s (e.g. dtrun --standalone --nproc-per-node 2 -- dtrain train --strategy ddp ...)\n",
              dt_last_error());
      return EXIT_RUNTIME;
    }
    rank = env.rank;
  }

  if ((v = flag(p, "--save-every"))->given) cfg.save_every = (int)v->i;
  if ((v = flag(p, "--save-every-steps"))->given) cfg.save_every_steps = v->i;
  if ((v = flag(p, "--keep"))->given) {
    if (!cfg.save_every && !cfg.save_every_steps && !flag(p, "--save-on-interrupt")->given)
      return usage_error(c, "add --save-every N", "--keep applies only when snapshots are written");
    cfg.keep = (int)v->i;
  }
  if (flag(p, "--save-on-interrupt")->given) cfg.save_on_interrupt = 1;
  if ((v = flag(p, "--resume"))->given) {
    if (strcmp(v->raw, "auto") == 0 && !flag(p, "--out")->given)
      return usage_error(c, "e.g. --out runs/exp1 --resume auto",
                         "--resume auto looks for snapshots in --out DIR: give --out");
    cfg.resume = v->raw;
  }
  if ((v = flag(p, "--tensorboard"))->given) cfg.tensorboard = v->raw;
  if (flag(p, "--tensorboard-all-ranks")->given) {
    if (!cfg.tensorboard || cfg.strategy != DT_STRATEGY_DDP)
      return usage_error(c, "add --strategy ddp --tensorboard DIR",
                         "--tensorboard-all-ranks needs --tensorboard DIR and --strategy ddp");
    cfg.tensorboard_all_ranks = 1;
  }
  if ((v = flag(p, "--log-every"))->given) {
    if (!cfg.tensorboard) return usage_error(c, "add --tensorboard DIR", "--log-every applies only with --tensorboard");
    cfg.log_every = (int)v->i;
  }
  if ((v = flag(p, "--trace"))->given) cfg.trace = v->raw;

  char out_dir[256];
  if ((v = flag(p, "--out"))->given) {
    cfg.out_dir = v->raw;
  } else {
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32];
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(out_dir, sizeof out_dir, "runs/%.200s-%s", cfg.model, stamp);
    cfg.out_dir = out_dir;
  }

  int quiet = flag(p, "--quiet")->given;
  if (quiet && flag(p, "--progress")->given)
    return usage_error(c, "give one of them", "--quiet and --progress conflict");
  if ((v = flag(p, "--progress"))->given) {
    static const dt_progress_mode modes[] = {DT_PROGRESS_AUTO, DT_PROGRESS_BAR, DT_PROGRESS_PLAIN, DT_PROGRESS_NONE};
    cfg.progress_mode = modes[v->choice];
  }
  if (rank != 0) quiet = 1;
  cfg.progress = quiet ? NULL : stdout;

  /* What the library rejects about the combination is still a usage error. */
  dt_status st = dt_train_config_check(&cfg);
  if (st != DT_OK) return usage_error(c, "see 'dtrain train --help'", "%s", dt_last_error());

  if (!quiet) {
    printf("training %s on %s: %d epoch(s), batch %d, %s lr %g, %d thread(s) (OpenBLAS %s), strategy %s, out %s\n",
           cfg.model, cfg.data, cfg.epochs, cfg.batch_size, dt_optim_kind_name(kind), (double)cfg.lr,
           dt_get_threads(), dt_blas_corename(), dt_strategy_name(cfg.strategy), cfg.out_dir);
    fflush(stdout);
  }
  install_sigint();
  dt_train_result res;
  st = dt_train_run(&cfg, &res);
  signal(SIGINT, SIG_DFL);
  if (st != DT_OK) return runtime_error(st, NULL);
  if (!quiet) print_train_summary(&cfg, &res, stdout);
  if (res.interrupted) {
    fprintf(stderr, "dtrain: interrupted after %lld step(s); metrics and weights are in %s%s\n", (long long)res.steps,
            cfg.out_dir, cfg.save_on_interrupt ? " (continue with --resume auto)" : "");
    return EXIT_INTERRUPTED;
  }
  return 0;
}

/* ---- eval -------------------------------------------------------------------- */
static const flag_spec eval_flags[] = {
    {"--weights", "FILE", K_STR, "required", "runs/exp1/model.safetensors", "safetensors weights to evaluate", NULL},
    {"--model", "NAME", K_STR, "from the file's metadata", "mlp", "model from the zoo the weights belong to", NULL},
    {"--hidden", "W1,W2,...", K_WIDTHS, "from the file's metadata", "256,128", "hidden layer widths of mlp", NULL},
    {"--data", "SOURCE", K_STR, "from the file's metadata, else fashion-mnist", "fashion-mnist",
     "dataset name or a directory of IDX files", NULL},
    {"--split", "NAME", K_CHOICE, "test", "train", "which split to evaluate: test or train", "test|train"},
    {"--normalize", "MEAN,STD", K_MEAN_STD, "from the file's metadata", "0.2860,0.3530",
     "input normalisation used in training", NULL},
    {"--batch-size", "N", K_POS_INT, "256", "256", "samples per forward pass", NULL},
    {"--threads", "N", K_NONNEG_INT, "DT_NUM_THREADS, OMP_NUM_THREADS or all cores", "4", "compute threads", NULL},
    {"--limit", "N", K_POS_I64, "all", "500", "evaluate the first N samples only", NULL},
    {"--strategy", "NAME", K_CHOICE, "single", "dp", "single, or dp: worker threads on slices of each batch",
     "single|dp"},
    {"--workers", "N", K_POS_INT, "the thread budget", "2", "dp: worker threads", NULL},
};

static int cmd_eval(const parsed *p) {
  const command *c = p->cmd;
  dt_eval_config cfg;
  dt_eval_config_default(&cfg);
  const flag_value *v;
  if (!(v = flag(p, "--weights"))->given)
    return usage_error(c, "e.g. --weights runs/exp1/model.safetensors", "--weights FILE is required");
  cfg.weights = v->raw;
  if ((v = flag(p, "--model"))->given) {
    int rc = check_model(c, v->raw);
    if (rc) return rc;
    cfg.model = v->raw;
  }
  if ((v = flag(p, "--hidden"))->given) {
    cfg.n_hidden = v->n_list;
    memcpy(cfg.hidden, v->list, sizeof v->list);
  }
  if ((v = flag(p, "--data"))->given) cfg.data = v->raw;
  if ((v = flag(p, "--split"))->given) cfg.split = v->choice == 0 ? DT_SPLIT_TEST : DT_SPLIT_TRAIN;
  if ((v = flag(p, "--normalize"))->given) {
    cfg.normalize_set = 1;
    cfg.normalize.enabled = 1;
    cfg.normalize.mean = (float)v->pair[0];
    cfg.normalize.std = (float)v->pair[1];
  }
  if ((v = flag(p, "--batch-size"))->given) cfg.batch_size = (int)v->i;
  if ((v = flag(p, "--threads"))->given) cfg.threads = (int)v->i;
  if ((v = flag(p, "--limit"))->given) cfg.limit = v->i;
  if (dt_set_threads(cfg.threads) != DT_OK) return usage_error(c, "e.g. --threads 4", "%s", dt_last_error());
  int dp = flag(p, "--strategy")->given && flag(p, "--strategy")->choice == 1;
  if ((v = flag(p, "--workers"))->given && !dp)
    return usage_error(c, "add --strategy dp", "--workers applies only to --strategy dp");
  if (dp) cfg.workers = v->given ? (int)v->i : dt_get_threads();
  dt_eval_result r;
  dt_status st = dt_eval_run(&cfg, &r);
  if (st != DT_OK)
    return runtime_error(st, "check --weights and --data; --model and --hidden must match the training run");
  printf("eval %s on %s %s (%lld samples): loss %.4f", r.model, r.data, cfg.split == DT_SPLIT_TEST ? "test" : "train",
         (long long)r.samples, r.loss);
  for (int i = 0; i < r.metrics.n_eval; i++) {
    const dt_metric_desc *d = &r.metrics.eval[i];
    if (d->percent) printf("  %s %.2f%%", d->brief, 100 * r.metric[i]);
    else printf("  %s %.4f", d->brief, r.metric[i]);
  }
  printf("  %.2f s  %.0f samples/s\n", r.seconds, r.samples_per_s);
  return 0;
}

/* ---- models ------------------------------------------------------------------ */
static void print_model(const char *name, const char *doc, void *user) {
  (void)user;
  dt_zoo_config zc = {.ndim = 3, .input_shape = {1, 28, 28}, .outputs = 10, .hidden = NULL, .n_hidden = 0, .dropout = -1.0f};
  dt_model *m = NULL;
  char params[32] = "?";
  if (dt_model_zoo_new(name, &zc, &m) == DT_OK && dt_model_build(m, 1, 0) == DT_OK)
    snprintf(params, sizeof params, "%zu", dt_model_num_params(m));
  dt_model_free(m);
  printf("  %-14s %10s  %s\n", name, params, doc);
}

static int cmd_models(const parsed *p) {
  (void)p;
  printf("  %-14s %10s  %s\n", "model", "parameters", "description (parameters for 1x28x28 inputs, 10 classes)");
  dt_model_zoo_each(print_model, NULL);
  return 0;
}

/* ---- inspect ------------------------------------------------------------------ */
static int cmd_inspect(const parsed *p) {
  const char *path = p->pos[0];
  dt_safetensors *f = NULL;
  dt_status st = dt_safetensors_load(path, &f);
  if (st != DT_OK) return runtime_error(st, "check the file name");
  printf("%s\n", path);
  int nm = dt_safetensors_meta_count(f);
  printf("metadata (%d):\n", nm);
  for (int i = 0; i < nm; i++) {
    dt_kv kv = dt_safetensors_meta_at(f, i);
    printf("  %s = %s\n", kv.key, kv.value);
  }
  int n = dt_safetensors_count(f);
  int64_t total = 0;
  printf("tensors (%d):\n", n);
  for (int i = 0; i < n; i++) {
    dt_named_tensor t;
    st = dt_safetensors_get(f, i, &t);
    if (st != DT_OK) {
      dt_safetensors_free(f);
      return runtime_error(st, NULL);
    }
    char shape[96];
    int64_t numel = dt_tensor_numel(&t.tensor);
    total += numel;
    printf("  %-32s %-4s %-18s", t.name, dt_dtype_name(t.tensor.dtype), dt_tensor_shape_str(&t.tensor, shape, sizeof shape));
    if (t.tensor.dtype == DT_F32 && numel > 0) {
      const float *x = t.tensor.data;
      double lo = x[0], hi = x[0], sum = 0;
      for (int64_t k = 0; k < numel; k++) {
        lo = fmin(lo, x[k]);
        hi = fmax(hi, x[k]);
        sum += x[k];
      }
      printf("  min %-+11.5g max %-+11.5g mean %+.5g", lo, hi, sum / (double)numel);
    }
    putchar('\n');
  }
  printf("total: %lld elements\n", (long long)total);
  dt_safetensors_free(f);
  return 0;
}

/* ---- export ------------------------------------------------------------------- */
static const flag_spec export_flags[] = {
    {"--format", "NAME", K_CHOICE, "safetensors", "safetensors", "output format (safetensors: weights only)",
     "safetensors"},
};

static int cmd_export(const parsed *p) {
  if (strcmp(p->pos[0], p->pos[1]) == 0)
    return usage_error(p->cmd, "write to another file", "the output %s is the input", p->pos[1]);
  dt_status st = dt_snapshot_export(p->pos[0], p->pos[1]);
  if (st != DT_OK) return runtime_error(st, "check the input file name and that the output directory is writable");
  printf("exported the weights of %s to %s\n", p->pos[0], p->pos[1]);
  return 0;
}

/* ---- bench ------------------------------------------------------------------ */
static const flag_spec bench_flags[] = {
    {"-b", "BYTES", K_SIZE, "8", "8", "smallest message (K, M, G suffixes are powers of 1024)", NULL},
    {"-e", "BYTES", K_SIZE, "64M", "64M", "largest message", NULL},
    {"-f", "FACTOR", K_POS_FLOAT, "2", "2", "size multiplier from one row to the next (> 1)", NULL},
    {"-n", "ITERS", K_POS_INT, "100", "100", "timed calls per size (fewer for large sizes: about 64 MiB moved)", NULL},
    {"-w", "ITERS", K_NONNEG_INT, "5", "5", "untimed warm-up calls per size", NULL},
    {"-d", "TYPE", K_CHOICE, "f32", "f32", "element type", "f32|f64|bf16|f16|i32|i64"},
    {"-o", "OP", K_CHOICE, "sum", "sum", "reduction", "sum|avg|min|max"},
    {"--check", NULL, K_BOOL, NULL, NULL, "verify every result and count wrong elements (#wrong); exit 1 if any", NULL},
    {"--backend", "NAME", K_CHOICE, "auto", "shm", "auto (shm on one host, tcp across hosts, mpi under mpirun), shm, tcp or mpi", "auto|shm|tcp|mpi"},
    {"--master", "HOST:PORT", K_STR, NULL, "10.0.0.1:29500", "rendezvous address (instead of MASTER_ADDR/MASTER_PORT, e.g. under mpirun)", NULL},
    {"--timeout", "SECONDS", K_POS_FLOAT, "DT_TIMEOUT", "60", "deadline of the rendezvous and of each collective", NULL},
};

static int cmd_bench_allreduce(const parsed *p) {
  static const dt_dtype types[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64};
  static const char *const backends[] = {"auto", "shm", "tcp", "mpi"};
  const flag_value *d = flag(p, "-d"), *o = flag(p, "-o"), *be = flag(p, "--backend");
  bench_allreduce_args a = {
      .min_bytes = flag(p, "-b")->given ? flag(p, "-b")->u : 8,
      .max_bytes = flag(p, "-e")->given ? flag(p, "-e")->u : (size_t)64 << 20,
      .factor = flag(p, "-f")->given ? flag(p, "-f")->f : 2,
      .iters = flag(p, "-n")->given ? (int)flag(p, "-n")->i : 100,
      .warmup = flag(p, "-w")->given ? (int)flag(p, "-w")->i : 5,
      .check = flag(p, "--check")->given,
      .dtype = d->given ? types[d->choice] : DT_F32,
      .op = o->given ? (dt_redop)o->choice : DT_SUM,
      .backend = be->given ? backends[be->choice] : "auto",
      .master = flag(p, "--master")->given ? flag(p, "--master")->raw : NULL,
      .timeout_s = flag(p, "--timeout")->given ? flag(p, "--timeout")->f : 0,
  };
  if (a.min_bytes > a.max_bytes)
    return usage_error(p->cmd, "e.g. -b 8 -e 64M", "-b %zu is larger than -e %zu", a.min_bytes, a.max_bytes);
  if (!(a.factor > 1) && a.min_bytes != a.max_bytes)
    return usage_error(p->cmd, "e.g. -f 2", "-f must be greater than 1");
  dt_status s = bench_allreduce_run(&a);
  return s == DT_OK ? 0 : runtime_error(s, NULL);
}

static const flag_spec scaling_flags[] = {
    {"--model", "NAME", K_STR, "fashioncnn", "mlp", "model from the zoo", NULL},
    {"--hidden", "W1,W2,...", K_WIDTHS, "the model's own", "2048,2048", "hidden layer widths of mlp", NULL},
    {"--data", "SOURCE", K_STR, "fashion-mnist", "fashion-mnist", "dataset name or a directory of IDX files", NULL},
    {"--max-workers", "N", K_POS_INT, "cores / --threads-per-worker", "2", "largest worker count", NULL},
    {"--epochs", "N", K_POS_INT, "1", "1", "epochs of every run", NULL},
    {"--limit-train", "N", K_POS_I64, "all", "12800", "training samples of every run", NULL},
    {"--batch-size", "N", K_POS_INT, "64", "64", "samples per worker per step (dp: workers x this per step)", NULL},
    {"--threads-per-worker", "N", K_POS_INT, "1", "1", "compute threads of each worker", NULL},
};

static int cmd_bench_scaling(const parsed *p) {
  const flag_value *v;
  bench_scaling_args a;
  memset(&a, 0, sizeof a);
  if ((v = flag(p, "--model"))->given) {
    int rc = check_model(p->cmd, v->raw);
    if (rc) return rc;
    a.model = v->raw;
  }
  if ((v = flag(p, "--hidden"))->given) {
    if (!a.model || strcmp(a.model, "mlp") != 0)
      return usage_error(p->cmd, "add --model mlp, or drop --hidden", "--hidden applies only to --model mlp");
    a.hidden = v->raw;
  }
  if ((v = flag(p, "--data"))->given) a.data = v->raw;
  if ((v = flag(p, "--max-workers"))->given) a.max_workers = (int)v->i;
  if ((v = flag(p, "--epochs"))->given) a.epochs = (int)v->i;
  if ((v = flag(p, "--limit-train"))->given) a.limit_train = v->i;
  if ((v = flag(p, "--batch-size"))->given) a.batch_size = (int)v->i;
  if ((v = flag(p, "--threads-per-worker"))->given) a.threads_per_worker = (int)v->i;
  return bench_scaling_run(&a);
}

/* ---- version, help --------------------------------------------------------------- */
static int cmd_version(const parsed *p) {
  (void)p;
  printf("dtrain %s\n", DTRAIN_VERSION);
  return 0;
}

static void print_command_list(FILE *f);

static void print_main_usage(FILE *f) {
  fprintf(f, "usage: dtrain COMMAND [flags]\n\ndata-parallel neural-network training in C (version %s)\n\ncommands:\n",
          DTRAIN_VERSION);
  print_command_list(f);
  fprintf(f, "\n'dtrain help COMMAND' or 'dtrain COMMAND --help' lists the flags of a command.\n");
  fprintf(f, "\nenvironment:\n");
  dt_tunables_each(print_tunable, f);
  fprintf(f, "\nexit status: 0 success, 1 runtime failure, 2 usage error, 130 interrupted\n");
}

static int cmd_help(const parsed *p) {
  if (p->n_pos == 0) {
    print_main_usage(stdout);
    return 0;
  }
  char name[64];
  snprintf(name, sizeof name, "%s%s%s", p->pos[0], p->n_pos > 1 ? " " : "", p->n_pos > 1 ? p->pos[1] : "");
  const command *c = find_command(name);
  if (!c && p->n_pos == 1 && strcmp(name, "bench") == 0) c = find_command("bench allreduce");
  if (!c) return usage_error(p->cmd, "run 'dtrain help' for the list", "unknown command '%s'", name);
  print_usage(c, stdout);
  return 0;
}

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const command commands[] = {
    {"train", "train a model from the zoo and write metrics and weights", "[flags]",
     "Trains a zoo model on a dataset, evaluating on the test split after every epoch.\n"
     "Writes DIR/metrics.csv and DIR/metrics.jsonl (one row per epoch, flushed at once),\n"
     "DIR/config.json, DIR/report.html (after every epoch), and at the end DIR/summary.json\n"
     "and DIR/model.safetensors; with --save-every, snapshots in DIR/snapshots that\n"
     "--resume continues from bit for bit. Ctrl-C stops at the next step, still writes\n"
     "metrics and weights (and a snapshot with --save-on-interrupt), and exits with 130; a\n"
     "second Ctrl-C ends at once.",
     train_flags, COUNT(train_flags), 0, 0, cmd_train},
    {"eval", "evaluate saved weights on a dataset split", "--weights FILE [flags]",
     "Loads weights written by 'dtrain train' and reports loss, top-1 and top-5 accuracy.\n"
     "Model, hidden widths, dataset and normalisation default to what the file's metadata records.",
     eval_flags, COUNT(eval_flags), 0, 0, cmd_eval},
    {"export", "write the weights of a snapshot (or weights file) alone, e.g. to share or evaluate", "SNAPSHOT OUT",
     "Reads a snapshot written by 'dtrain train --save-every' (or any weights file) and writes\n"
     "its model tensors only, under PyTorch state_dict names with the model's metadata, to OUT\n"
     "(atomically). Optimizer and trainer state are left out. Example:\n"
     "  dtrain export runs/exp1/snapshots/step-000001876.safetensors model.safetensors",
     export_flags, COUNT(export_flags), 2, 2, cmd_export},
    {"models", "list the model zoo with parameter counts", "", "Lists the registered models.", NULL, 0, 0, 0,
     cmd_models},
    {"inspect", "show a safetensors file: metadata, tensors, statistics", "FILE",
     "Prints the metadata, then one line per tensor: name, dtype, shape and, for f32, min/max/mean.", NULL, 0, 1, 1,
     cmd_inspect},
    {"bench allreduce", "all-reduce benchmark, nccl-tests table (under dtrun, torchrun, mpirun or srun)", "[flags]",
     "Times all-reduce from -b to -e bytes (x -f per row), out of place and in place, on every\n"
     "rank of the job, and rank 0 prints the nccl-tests table: size, count, type, redop, root,\n"
     "time per call (the slowest rank's), algbw = bytes / time, busbw = algbw * 2(n-1)/n, and\n"
     "#wrong with --check; then '# Avg bus bandwidth'. Example:\n"
     "  dtrun --standalone --nproc-per-node 2 -- dtrain bench allreduce -b 8 -e 64M -f 2 --check",
     bench_flags, COUNT(bench_flags), 0, 0, cmd_bench_allreduce},
    {"bench scaling", "the same training with 1..N workers (ddp and dp): speedup and efficiency", "[flags]",
     "Trains the same job once with one worker (the baseline), then for 1..--max-workers workers\n"
     "as DDP processes under dtrun and as DataParallel threads, and prints for each: train and\n"
     "inference samples/s, speedup over one worker, scaling efficiency (speedup / workers) and,\n"
     "for ddp, the all-reduce time and the share of it hidden behind backward. Example:\n"
     "  dtrain bench scaling --model fashioncnn --max-workers 2",
     scaling_flags, COUNT(scaling_flags), 0, 0, cmd_bench_scaling},
    {"version", "print the version", "", "Prints the dtrain version.", NULL, 0, 0, 0, cmd_version},
    {"help", "show help for dtrain or one command", "[COMMAND]", "Shows the commands, or every flag of one command.",
     NULL, 0, 0, 2, cmd_help},
};
static const int n_commands = COUNT(commands);

static void print_command_list(FILE *f) {
  for (int i = 0; i < n_commands; i++) fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].summary);
}

static const command *find_command(const char *name) {
  for (int i = 0; i < n_commands; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_main_usage(stderr);
    return EXIT_USAGE;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) name = "help";
  if (strcmp(name, "--version") == 0) name = "version";
  int used = 2; /* argv words naming the command */
  char two[64];
  if (strcmp(name, "bench") == 0) {
    /* Benchmarks are two-word commands: bench allreduce, bench scaling. */
    if (argc < 3 || argv[2][0] == '-')
      return usage_error(NULL, "e.g. 'dtrain bench allreduce' or 'dtrain bench scaling'",
                         "bench needs a benchmark: allreduce or scaling");
    snprintf(two, sizeof two, "bench %.40s", argv[2]);
    name = two;
    used = 3;
    if (!find_command(name))
      return usage_error(NULL, "the benchmarks are: allreduce, scaling", "unknown benchmark '%s'", argv[2]);
  }
  const command *c = find_command(name);
  if (!c) return usage_error(NULL, "run 'dtrain help' for the list of commands", "unknown command '%s'", name);
  parsed p;
  int rc = parse_args(c, argc - used, argv + used, &p);
  if (rc < 0) return 0; /* --help */
  if (rc) return rc;
  return c->run(&p);
}

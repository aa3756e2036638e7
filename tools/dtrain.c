/* dtrain command-line tool: a registry of commands (train, eval, recommend, models, inspect, version, help) over flag tables. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cmd_bench.h"
#include "cmd_recommend.h"
#include "cmd_scaling.h"
#include "cmd_tokenize.h"
#include "dtrain/dtrain.h"
#include "flags.h"
#include "stop_signals.h"

/* Exit codes: 0 success, 1 runtime failure, 2 usage error, 128 + signal interrupted (130 SIGINT, 143 SIGTERM). */
enum { EXIT_RUNTIME = 1, EXIT_USAGE = FLAGS_EXIT_USAGE, EXIT_INTERRUPTED = 128 };

_Static_assert(FLAGS_MAX_LIST == DT_TRAIN_MAX_HIDDEN, "a --hidden list fills dt_train_config.hidden");

/* ---- commands ---------------------------------------------------------------- */
typedef struct command {
  const char *name;
  const char *summary;
  const char *synopsis;    /* after "dtrain <name>" */
  const char *description; /* a paragraph for help */
  const flag_spec *flags;  /* flags[id], id from the command's enum */
  int n_flags;
  int n_pos_min, n_pos_max; /* positional arguments */
  int (*run)(const flag_args *p); /* p->prog is "dtrain <name>" */
} command;

static const command *find_command(const char *name);
static void print_usage(const command *c, FILE *f);

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
    {DT_USAGE, "see 'dtrain train --help' for the flags and data sources, 'dtrain models' for the tasks of each model"},
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

static void print_tunable(const char *name, const char *def, const char *doc, void *user) {
  fprintf((FILE *)user, "  %-22s %s (default: %s)\n", name, doc, def);
}

static void print_usage(const command *c, FILE *f) {
  flag_set set = {.flags = c->flags, .n_flags = c->n_flags};
  fprintf(f, "usage: dtrain %s %s\n\n%s\n", c->name, c->synopsis, c->description);
  fprintf(f, "\nflags:\n");
  flags_print(f, &set);
  fprintf(f, "\nenvironment:\n");
  dt_tunables_each(print_tunable, f);
  fprintf(f, "\nA flag takes its value as '--flag VALUE' or '--flag=VALUE'; giving a flag twice is an error.\n");
  fprintf(f, "exit status: 0 success, 1 runtime failure, 2 usage error, 130/143 interrupted by SIGINT/SIGTERM\n");
}

/* Parses the command's flags and runs it; argv holds what follows the command's name. */
static int run_command(const command *c, int argc, char **argv) {
  char prog[64], hint[96];
  snprintf(prog, sizeof prog, "dtrain %s", c->name);
  snprintf(hint, sizeof hint, "see '%s --help'", prog);
  flag_set set = {prog, hint, c->flags, c->n_flags, c->n_pos_max};
  flag_args p;
  int rc = flags_parse(&set, argc, argv, &p);
  if (rc == FLAGS_HELP) print_usage(c, stdout);
  if (rc) return rc == FLAGS_HELP ? 0 : rc;
  if (p.n_pos < c->n_pos_min) return flags_usage_error(prog, hint, "missing argument: %s", c->synopsis);
  return c->run(&p);
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
static int check_model(const char *prog, const char *name) {
  zoo_lookup z = {.want = name};
  dt_model_zoo_each(zoo_visit, &z);
  if (z.found) return 0;
  return flags_usage_error(prog, "see 'dtrain models'", "--model: unknown model '%s' (known: %s)", name,
                           z.names[0] ? z.names : "none");
}

static void format_bytes(size_t b, char *buf, size_t len) {
  if (b >= (size_t)1 << 30)
    snprintf(buf, len, "%.2f GiB", (double)b / (1 << 30));
  else
    snprintf(buf, len, "%.1f MiB", (double)b / (1 << 20));
}

/* The backend names are what the configurations take (flag_value.raw); the values are unused. */
static const flag_choice backends[] = {{"auto", 0}, {"shm", 0}, {"tcp", 0}, {"mpi", 0}, {NULL, 0}};
static const flag_choice strategies[] = {
    {"single", DT_STRATEGY_SINGLE}, {"dp", DT_STRATEGY_DP}, {"ddp", DT_STRATEGY_DDP}, {NULL, 0}};

/* ---- text data: the same rows in train and eval ---------------------------------- */
/* Offsets of the text flags from the first (TRAIN_VOCAB, EVAL_VOCAB): both tables list them in this order. */
typedef enum text_flag {
  TEXT_VOCAB, TEXT_COLUMN, TEXT_PAIR_COLUMN, TEXT_LABEL_COLUMNS, TEXT_LABEL_COLUMN, TEXT_MAX_LEN, TEXT_NO_LOWER_CASE,
  TEXT_SKIP_BAD_ROWS, TEXT_FLAG_COUNT
} text_flag;
#define VOCAB_EXAMPLE "../shared/data/bert/bert-base-uncased-vocab.txt"
#define HELP_VOCAB "text data (.csv, .tsv): the WordPiece vocabulary, one token per line (BERT's vocab.txt)"
#define HELP_TEXT_COLUMN "text data: the column holding the text"
#define HELP_TEXT_PAIR_COLUMN "text data: a second text per row, read as BERT's sentence pair (token type 1)"
#define HELP_LABEL_COLUMNS "text data: 0/1 labels (multilabel; one column: binary), each a number, 1 when >= 0.5"
#define HELP_LABEL_COLUMN "text data: one column of classes, integers 0..K-1 or names (sorted, numbered from 0)"
#define HELP_MAX_LEN "text data: token positions per row, [CLS] and [SEP] included (longer texts are cut)"
#define HELP_NO_LOWER_CASE "text data: keep the case (cased vocabularies); by default text is lower-cased and " \
  "accents stripped, as bert-base-uncased"
#define HELP_SKIP_BAD_ROWS "text data: leave out malformed rows (counted, the first named) instead of stopping at one"

/* 1 if spec names text data (as the text source claims it). */
static int is_text_data(const char *spec) {
  const size_t n = strlen(spec);
  return strncmp(spec, "text:", 5) == 0 ||
         (n > 4 && (strcasecmp(spec + n - 4, ".csv") == 0 || strcasecmp(spec + n - 4, ".tsv") == 0));
}

/* The text flags from v[first..first + TEXT_FLAG_COUNT) of table rows into t; data (NULL: not known yet) must be
 * text data when one is given. */
static int read_text_flags(const flag_args *p, const flag_spec *rows, int first, const char *data,
                           dt_text_options *t) {
  const flag_value *v = p->v + first;
  if (v[TEXT_LABEL_COLUMNS].given && v[TEXT_LABEL_COLUMN].given)
    return flags_usage_error(p->prog, "e.g. --label-column class, or --label-columns toxic,insult",
                             "--label-column (one column of classes) and --label-columns (0/1 labels): give one");
  for (int k = 0; k < TEXT_FLAG_COUNT && data && !is_text_data(data); k++)
    if (v[k].given)
      return flags_usage_error(p->prog, "e.g. --data comments.csv", "%s applies to text data (a .csv or .tsv file, "
                               "or text:PATH), not %s", rows[first + k].name, data);
  if (v[TEXT_VOCAB].given) t->vocab = v[TEXT_VOCAB].raw;
  if (v[TEXT_COLUMN].given) t->text_column = v[TEXT_COLUMN].raw;
  if (v[TEXT_PAIR_COLUMN].given) t->text_pair_column = v[TEXT_PAIR_COLUMN].raw;
  if (v[TEXT_LABEL_COLUMNS].given) t->label_columns = v[TEXT_LABEL_COLUMNS].raw;
  if (v[TEXT_LABEL_COLUMN].given) t->label_column = v[TEXT_LABEL_COLUMN].raw;
  if (v[TEXT_MAX_LEN].given) t->max_len = (int)v[TEXT_MAX_LEN].i;
  t->keep_case = v[TEXT_NO_LOWER_CASE].given;
  t->skip_bad_rows = v[TEXT_SKIP_BAD_ROWS].given;
  return 0;
}

/* ---- train ------------------------------------------------------------------- */
typedef enum train_flag {
  TRAIN_MODEL, TRAIN_HIDDEN, TRAIN_DROPOUT, TRAIN_FACTORS, TRAIN_EMBEDDING_L2, TRAIN_SPARSE_EMBEDDINGS,
  TRAIN_ZERO_INIT_RESIDUAL, TRAIN_WIDTH, TRAIN_LAYERS, TRAIN_HIDDEN_SIZE, TRAIN_HEADS, TRAIN_INTERMEDIATE_SIZE, TRAIN_INIT_FROM,
  TRAIN_DATA, TRAIN_SPLIT, TRAIN_NORMALIZE, TRAIN_AUGMENT, TRAIN_TTA, TRAIN_DATA_WORKERS,
  TRAIN_CACHE_IMAGES, TRAIN_SKIP_BAD_IMAGES, TRAIN_VOCAB, TRAIN_TEXT_COLUMN, TRAIN_TEXT_PAIR_COLUMN,
  TRAIN_LABEL_COLUMNS, TRAIN_LABEL_COLUMN, TRAIN_MAX_LEN, TRAIN_NO_LOWER_CASE, TRAIN_SKIP_BAD_ROWS,
  TRAIN_LIMIT_TRAIN, TRAIN_LIMIT_TEST, TRAIN_LIMIT_PICK,
  TRAIN_EPOCHS, TRAIN_BATCH_SIZE,
  TRAIN_OPTIMIZER, TRAIN_LR, TRAIN_MOMENTUM, TRAIN_DAMPENING, TRAIN_NESTEROV, TRAIN_WEIGHT_DECAY, TRAIN_NO_DECAY, TRAIN_BETAS,
  TRAIN_EPS, TRAIN_SCHEDULE, TRAIN_STEP_SIZE, TRAIN_GAMMA, TRAIN_MIN_LR, TRAIN_WARMUP_EPOCHS, TRAIN_WARMUP_STEPS,
  TRAIN_CLIP_GRAD_NORM, TRAIN_AMP, TRAIN_LABEL_SMOOTHING, TRAIN_LOSS, TRAIN_POS_WEIGHT, TRAIN_VAL_FRACTION, TRAIN_VAL_DATA,
  TRAIN_THREADS, TRAIN_SEED,
  TRAIN_OUT, TRAIN_PROGRESS, TRAIN_QUIET,
  TRAIN_STRATEGY, TRAIN_WORKERS, TRAIN_ACCUMULATE, TRAIN_BACKEND, TRAIN_MASTER, TRAIN_BUCKET_CAP_MB,
  TRAIN_FIRST_BUCKET_MB, TRAIN_GRAD_PIECE_MB, TRAIN_BROADCAST_BUFFERS, TRAIN_SHARED_GRADS, TRAIN_SHARDED_UPDATE,
  TRAIN_FIND_UNUSED_PARAMETERS, TRAIN_COMM_HOOK, TRAIN_EMBEDDING_EXCHANGE,
  TRAIN_TIMEOUT, TRAIN_SAVE_EVERY, TRAIN_SAVE_EVERY_STEPS, TRAIN_KEEP, TRAIN_SAVE_ON_INTERRUPT, TRAIN_RESUME,
  TRAIN_ALLOW_DATA_CHANGE, TRAIN_OVERWRITE, TRAIN_TENSORBOARD, TRAIN_TENSORBOARD_ALL_RANKS, TRAIN_LOG_EVERY, TRAIN_TRACE,
  TRAIN_COUNT
} train_flag;
_Static_assert(TRAIN_SKIP_BAD_ROWS - TRAIN_VOCAB == TEXT_SKIP_BAD_ROWS, "train's text flags in text_flag order");

static const flag_choice regression_losses[] = {{"mse", DT_LOSS_MSE}, {"l1", DT_LOSS_L1}, {NULL, 0}};
static const flag_choice optimizers[] = {
    {"sgd", DT_OPTIM_SGD}, {"adam", DT_OPTIM_ADAM}, {"adamw", DT_OPTIM_ADAMW}, {NULL, 0}};
static const flag_choice schedules[] = {
    {"constant", DT_SCHED_CONSTANT}, {"step", DT_SCHED_STEP}, {"cosine", DT_SCHED_COSINE}, {"linear", DT_SCHED_LINEAR},
    {NULL, 0}};
static const flag_choice progress_modes[] = {{"auto", DT_PROGRESS_AUTO}, {"bar", DT_PROGRESS_BAR},
                                             {"plain", DT_PROGRESS_PLAIN}, {"none", DT_PROGRESS_NONE}, {NULL, 0}};
static const flag_choice amp_modes[] = {{"off", DT_AMP_OFF}, {"bf16", DT_AMP_BF16}, {"fp16", DT_AMP_FP16}, {NULL, 0}};
static const flag_choice on_off[] = {{"on", 1}, {"off", 0}, {NULL, 0}};
static const flag_choice auto_on_off[] = {{"auto", -1}, {"on", 1}, {"off", 0}, {NULL, 0}};
static const flag_choice exchanges[] = {
    {"auto", DT_ROWS_AUTO}, {"dense", DT_ROWS_DENSE}, {"sparse", DT_ROWS_SPARSE}, {NULL, 0}};
static const flag_choice augments[] = {
    {"none", DT_AUGMENT_NONE}, {"cifar", DT_AUGMENT_CIFAR}, {"imagenet", DT_AUGMENT_IMAGENET}, {NULL, 0}};
static const flag_choice ttas[] = {{"none", DT_TTA_NONE}, {"flip", DT_TTA_FLIP}, {NULL, 0}};
#define HELP_TTA                                                                                                      \
  "images: test-time augmentation; flip scores each image by the mean of its logits and its mirror's (torchvision's " \
  "hflip), two forwards per image"
static const flag_choice limit_picks[] = {
    {"auto", DT_LIMIT_PICK_AUTO}, {"first", DT_LIMIT_PICK_FIRST}, {"random", DT_LIMIT_PICK_RANDOM}, {NULL, 0}};
static const flag_choice holdouts[] = {{"random", DT_HOLDOUT_DEFAULT}, {"leave-last-out", DT_HOLDOUT_LAST}, {NULL, 0}};
static const flag_choice comm_hooks[] = {
    {"none", DT_COMM_HOOK_NONE}, {"bf16", DT_COMM_HOOK_BF16}, {"fp16", DT_COMM_HOOK_FP16}, {NULL, 0}};

/* A row: name, metavar, kind, default (as help shows it), example (errors say "e.g. --name EXAMPLE"), .help and,
 * for a choice, .choices; help lists the rows in this order. Adding a flag: an id above, a row here, and reading
 * p->v[TRAIN_ID] where it applies. */
static const flag_spec train_flags[TRAIN_COUNT] = {
    [TRAIN_MODEL] = {"--model", "NAME", FLAG_STR, "fashioncnn", "mlp",
                     .help = "model from the zoo (see 'dtrain models')"},
    [TRAIN_HIDDEN] = {"--hidden", "W1,W2,...", FLAG_WIDTHS, "the model's own", "256,128",
                      .help = "hidden layer widths of mlp and ncf"},
    [TRAIN_DROPOUT] = {"--dropout", "P", FLAG_UNIT_FLOAT, "the model's own", "0.2",
                       .help = "dropout probability, overriding the model's"},
    [TRAIN_FACTORS] = {"--factors", "K", FLAG_POS_INT, "64 for mf, 32 for ncf", "64",
                       .help = "mf, ncf: embedding width (latent factors per user and item)"},
    [TRAIN_EMBEDDING_L2] = {"--embedding-l2", "X", FLAG_NONNEG_FLOAT, "0", "0.05",
                            .help = "mf, ncf: add X * the batch mean of |user row|^2 + |item row|^2 to the loss (L2 on "
                            "the looked-up rows; works with --sparse-embeddings)"},
    [TRAIN_SPARSE_EMBEDDINGS] = {"--sparse-embeddings", NULL, FLAG_BOOL, "off: dense updates", NULL,
                                 .help = "mf, ncf: update only the embedding rows a step touched, as PyTorch's "
                                 "sparse=True with SGD (no momentum, no weight decay) or SparseAdam (--optimizer adam)"},
    [TRAIN_ZERO_INIT_RESIDUAL] = {"--zero-init-residual", NULL, FLAG_BOOL, "off: BN weights 1", NULL,
                                  .help = "resnets: start each residual block's last BatchNorm weight at 0, as "
                                  "torchvision's zero_init_residual=True (each block starts as the identity)"},
    [TRAIN_WIDTH] = {"--width", "W", FLAG_INT_RANGE, "the model's own: 64 for resnet9, 16 for resnet20/32/56", "32",
                     .help = "resnet9, resnet20, resnet32, resnet56: channels of the first stage; each later stage "
                     "doubles them (resnet9 --width 32 is a quarter of its multiply-adds)", .lo = 1, .hi = 4096},
    [TRAIN_LAYERS] = {"--layers", "N", FLAG_POS_INT, "the preset's", "4",
                      .help = "bert models: encoder layers (num_hidden_layers)"},
    [TRAIN_HIDDEN_SIZE] = {"--hidden-size", "H", FLAG_POS_INT, "the preset's", "256",
                           .help = "bert models: hidden size (a multiple of --heads)"},
    [TRAIN_HEADS] = {"--heads", "A", FLAG_POS_INT, "the preset's", "4",
                     .help = "bert models: attention heads (num_attention_heads)"},
    [TRAIN_INTERMEDIATE_SIZE] = {"--intermediate-size", "I", FLAG_POS_INT, "4 x the hidden size", "1024",
                                 .help = "bert models: feed-forward size (intermediate_size)"},
    [TRAIN_INIT_FROM] = {"--init-from", "PATH", FLAG_STR, "off: the model's own initialisation", "bert-base/",
                         .help = "fine-tune from pretrained weights, taken by name: a Hugging Face checkpoint directory "
                         "(model.safetensors, config.json), or a safetensors file (transformers', PyTorch's, dtrain's "
                         "weights or snapshot); f32, f16 or bf16. Tensors of the model missing from the file keep their "
                         "initialisation and are listed, as are the file's tensors the model lacks; a tensor of another "
                         "shape is an error. The optimizer starts fresh at step 0 (not with --resume)"},
    [TRAIN_DATA] = {"--data", "SOURCE", FLAG_STR, "fashion-mnist", "fashion-mnist",
                    .help = "data source: fashion-mnist or mnist (IDX under DT_DATA_DIR), a directory of IDX files, a "
                            "MovieLens directory (ratings.csv or ratings.dat, with movies.csv/.dat), an image folder "
                            "(DIR/<class>/*.jpg|png as torchvision's ImageFolder, or DIR with train/ and test/ or val/), "
                            "a CIFAR-10/100 binary directory (data_batch_*.bin, test_batch.bin; train.bin, test.bin), a .csv or "
                            ".tsv file of texts and labels (or text:PATH; see --vocab and --label-column(s)), or "
                            "synthetic:N[,in=20,out=1,task=regression|classification|multilabel,seed=S] (generated)"},
    [TRAIN_SPLIT] = {"--split", "NAME", FLAG_CHOICE, "random", "leave-last-out",
                     .help = "ratings data: random (a --val-fraction, default 0.1, held out by --seed) or "
                     "leave-last-out (each user's latest rating; adds HR@10 and NDCG@10 over 100 sampled negatives)",
                     .choices = holdouts},
    [TRAIN_NORMALIZE] = {"--normalize", "MEAN,STD", FLAG_MEAN_STD, "none: x/255", "0.2860,0.3530",
                         .help = "also normalise inputs as (x/255 - MEAN)/STD (with --augment: instead of the preset's)"},
    [TRAIN_AUGMENT] = {"--augment", "PRESET", FLAG_CHOICE, "none", "cifar",
                       .help = "RGB images: cifar (train RandomCrop(32, padding=4) + RandomHorizontalFlip; test as is), "
                       "imagenet (train RandomResizedCrop(224) + RandomHorizontalFlip; test Resize(256) + "
                       "CenterCrop(224)), each normalised by default with its data set's per-channel mean and std; or "
                       "none (ToTensor only: every image must have one size)", .choices = augments},
    [TRAIN_TTA] = {"--tta", "MODE", FLAG_CHOICE, "none", "flip", .help = HELP_TTA " (every evaluation of the run)",
                   .choices = ttas},
    [TRAIN_DATA_WORKERS] = {"--data-workers", "N", FLAG_NONNEG_INT,
                            "dp: 0 where the data needs no decoding and the workers fill the cores; else 1; "
                            "image folders: one per 8 cores, 1 to 4", "2",
                            .help = "loader threads that read, decode and augment batches ahead of training (as "
                            "DataLoader(num_workers=N)); 0: none, the training threads make each batch as they take "
                            "it (dp: each worker its own slice)"},
    [TRAIN_CACHE_IMAGES] = {"--cache-images", NULL, FLAG_BOOL, "off: decode on every fetch", NULL,
                            .help = "image folders: decode every image once into memory (uint8) at start, when it "
                            "fits under DT_IMAGE_CACHE_MB (default half the memory)"},
    [TRAIN_SKIP_BAD_IMAGES] = {"--skip-bad-images", NULL, FLAG_BOOL, "off: such a file is an error", NULL,
                               .help = "image folders: decode every image at start and leave out those that fail "
                               "(counted; the count is in summary.json)"},
    [TRAIN_VOCAB] = {"--vocab", "FILE", FLAG_STR, "none: text data needs one", VOCAB_EXAMPLE, .help = HELP_VOCAB},
    [TRAIN_TEXT_COLUMN] = {"--text-column", "NAME", FLAG_STR, "text", "comment_text", .help = HELP_TEXT_COLUMN},
    [TRAIN_TEXT_PAIR_COLUMN] = {"--text-pair-column", "NAME", FLAG_STR, "none", "hypothesis",
                                .help = HELP_TEXT_PAIR_COLUMN},
    [TRAIN_LABEL_COLUMNS] = {"--label-columns", "A,B,...", FLAG_STR, "none", "toxic,severe_toxic,insult",
                             .help = HELP_LABEL_COLUMNS},
    [TRAIN_LABEL_COLUMN] = {"--label-column", "NAME", FLAG_STR, "none", "class", .help = HELP_LABEL_COLUMN},
    [TRAIN_MAX_LEN] = {"--max-len", "N", FLAG_INT_RANGE, "128", "128", .help = HELP_MAX_LEN, .lo = 3, .hi = 8192},
    [TRAIN_NO_LOWER_CASE] = {"--no-lower-case", NULL, FLAG_BOOL, "off: lower-case", NULL, .help = HELP_NO_LOWER_CASE},
    [TRAIN_SKIP_BAD_ROWS] = {"--skip-bad-rows", NULL, FLAG_BOOL, "off: such a row is an error", NULL,
                             .help = HELP_SKIP_BAD_ROWS},
    [TRAIN_LIMIT_TRAIN] = {"--limit-train", "N", FLAG_POS_I64, "all", "2000",
                           .help = "train on N training samples only (shuffled among themselves each epoch); which N: "
                                   "--limit-pick"},
    [TRAIN_LIMIT_TEST] = {"--limit-test", "N", FLAG_POS_I64, "all", "500",
                          .help = "evaluate on N test samples only; which N: --limit-pick"},
    [TRAIN_LIMIT_PICK] = {"--limit-pick", "HOW", FLAG_CHOICE, "auto", "random",
                          .help = "which samples --limit-train and --limit-test keep: first (the first N), random (N "
                                  "drawn by --seed, the same for every rank count, kept in order) or auto (random on "
                                  "data ordered class by class, as image folders are, where the first N would be the "
                                  "first classes only; else first)",
                          .choices = limit_picks},
    [TRAIN_EPOCHS] = {"--epochs", "N", FLAG_POS_INT, "1", "3", .help = "passes over the training data"},
    [TRAIN_BATCH_SIZE] = {"--batch-size", "N", FLAG_POS_INT, "64", "64", .help = "samples per optimizer step"},
    [TRAIN_OPTIMIZER] = {"--optimizer", "NAME", FLAG_CHOICE, "sgd", "adam",
                         .help = "sgd, adam or adamw (PyTorch's update rules)", .choices = optimizers},
    [TRAIN_LR] = {"--lr", "X", FLAG_POS_FLOAT, "0.01 for sgd, 0.001 for adam/adamw", "0.01",
                  .help = "base learning rate"},
    [TRAIN_MOMENTUM] = {"--momentum", "X", FLAG_NONNEG_FLOAT, "0", "0.9", .help = "SGD momentum (as torch.optim.SGD)"},
    [TRAIN_DAMPENING] = {"--dampening", "X", FLAG_NONNEG_FLOAT, "0", "0", .help = "SGD momentum dampening"},
    [TRAIN_NESTEROV] = {"--nesterov", NULL, FLAG_BOOL, "off", NULL,
                        .help = "Nesterov momentum (needs --momentum > 0 and no dampening)"},
    [TRAIN_WEIGHT_DECAY] = {"--weight-decay", "X", FLAG_NONNEG_FLOAT, "0; 0.01 for adamw", "0.0005",
                            .help = "L2 penalty (sgd, adam) or decoupled weight decay (adamw)"},
    [TRAIN_NO_DECAY] = {"--no-decay", "P1,P2,...", FLAG_STR, "off: every parameter decays", "bias,LayerNorm.weight",
                        .help = "parameters whose names contain any of these patterns take no weight decay (the "
                        "BERT recipe's second parameter group); needs --weight-decay > 0 (adamw: the default 0.01). "
                        "The groups' sizes are printed at start"},
    [TRAIN_BETAS] = {"--betas", "B1,B2", FLAG_BETAS, "0.9,0.999", "0.9,0.999", .help = "Adam/AdamW moment decay rates"},
    [TRAIN_EPS] = {"--eps", "X", FLAG_POS_FLOAT, "1e-8", "1e-8", .help = "Adam/AdamW denominator epsilon"},
    [TRAIN_SCHEDULE] = {"--schedule", "NAME", FLAG_CHOICE, "constant", "cosine",
                        .help = "learning-rate schedule: constant, step, cosine or linear (transformers' "
                        "get_linear_schedule_with_warmup: to 0 at the last step, the warm-up from 0 and part of it)",
                        .choices = schedules},
    [TRAIN_STEP_SIZE] = {"--step-size", "EPOCHS", FLAG_POS_INT, "1", "10",
                         .help = "step schedule: multiply the lr by --gamma every EPOCHS epochs"},
    [TRAIN_GAMMA] = {"--gamma", "X", FLAG_POS_FLOAT, "0.1", "0.1", .help = "step schedule: decay factor"},
    [TRAIN_MIN_LR] = {"--min-lr", "X", FLAG_NONNEG_FLOAT, "0", "0.0001",
                      .help = "cosine schedule: final learning rate (eta_min)"},
    [TRAIN_WARMUP_EPOCHS] = {"--warmup-epochs", "N", FLAG_NONNEG_INT, "0", "1",
                             .help = "linear warm-up over the first N epochs, from lr/3 (torch LinearLR); with --schedule "
                             "linear from 0, as transformers"},
    [TRAIN_WARMUP_STEPS] = {"--warmup-steps", "N", FLAG_NONNEG_INT, "0", "500",
                            .help = "linear warm-up over the first N optimizer steps instead"},
    [TRAIN_CLIP_GRAD_NORM] = {"--clip-grad-norm", "X", FLAG_POS_FLOAT, "off", "1.0",
                              .help = "clip the global gradient L2 norm to X"},
    [TRAIN_AMP] = {"--amp", "MODE", FLAG_CHOICE, "off", "bf16",
                   .help = "mixed precision as torch.autocast: Linear, Conv2d and attention products in bf16 or fp16 "
                   "with f32 accumulation and f32 master weights; fp16 adds GradScaler's dynamic loss scaling; bf16 "
                   "multiplies natively where the CPU has AVX512_BF16, else emulated (slower than f32)",
                   .choices = amp_modes},
    [TRAIN_LABEL_SMOOTHING] = {"--label-smoothing", "X", FLAG_UNIT_FLOAT, "0", "0.1",
                               .help = "classification: cross-entropy label smoothing in [0, 1)"},
    [TRAIN_LOSS] = {"--loss", "NAME", FLAG_CHOICE, "mse", "l1",
                    .help = "regression: mse (torch.nn.MSELoss) or l1 (L1Loss)", .choices = regression_losses},
    [TRAIN_POS_WEIGHT] = {"--pos-weight", "W[,W...]", FLAG_NUMBERS, "none", "3.0",
                          .help = "multilabel: BCEWithLogitsLoss pos_weight, one value for every label or one per label"},
    [TRAIN_VAL_FRACTION] = {"--val-fraction", "F", FLAG_UNIT_FLOAT, "off", "0.1",
                            .help = "hold out this fraction of the training data for validation (split by --seed), "
                                    "for sources without a test split",
                            .expect = "a fraction in (0, 1)"},
    [TRAIN_VAL_DATA] = {"--val-data", "SOURCE", FLAG_STR, "the source's test split", "synthetic:512,seed=1",
                        .help = "validate on this source instead (its test split, or its only split)"},
    [TRAIN_THREADS] = {"--threads", "N", FLAG_NONNEG_INT, "DT_NUM_THREADS, OMP_NUM_THREADS or all cores", "4",
                       .help = "compute threads"},
    [TRAIN_SEED] = {"--seed", "N", FLAG_U64, "0", "42", .help = "seed of initialisation, shuffling and dropout"},
    [TRAIN_OUT] = {"--out", "DIR", FLAG_STR, "runs/<model>-<yyyymmdd-hhmmss>", "runs/exp1",
                   .help = "output directory: metrics.csv, metrics.jsonl, config.json, summary.json, "
                   "model.safetensors"},
    [TRAIN_PROGRESS] = {"--progress", "MODE", FLAG_CHOICE, "auto", "plain",
                        .help = "auto (a bar on a terminal, else plain), bar, plain (a line per ~10% of an epoch) or "
                        "none (epoch lines only)", .choices = progress_modes},
    [TRAIN_QUIET] = {"--quiet", NULL, FLAG_BOOL, "off", NULL, .help = "print nothing but errors"},
    [TRAIN_STRATEGY] = {"--strategy", "NAME", FLAG_CHOICE, "single", "ddp",
                        .help = "single (one process), dp (worker threads on slices of each batch, like "
                        "nn.DataParallel) or ddp (one process per worker under dtrun/torchrun/mpirun/srun, like "
                        "DistributedDataParallel); an error to leave out where a launcher started several copies "
                        "(WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_STEP_NUM_TASKS above 1)", .choices = strategies},
    [TRAIN_WORKERS] = {"--workers", "N", FLAG_POS_INT, "the thread budget", "2", .help = "dp: worker threads"},
    [TRAIN_ACCUMULATE] = {"--accumulate", "K", FLAG_POS_INT, "1", "4",
                          .help = "batches per optimizer step (gradient accumulation; ddp all-reduces on the last one "
                          "only)"},
    [TRAIN_BACKEND] = {"--backend", "NAME", FLAG_CHOICE, "auto", "shm",
                       .help = "ddp: auto (shm on one host, tcp across hosts, shm+tcp when both, mpi under mpirun), "
                       "shm, tcp or mpi", .choices = backends},
    [TRAIN_MASTER] = {"--master", "HOST:PORT", FLAG_STR, "MASTER_ADDR:MASTER_PORT", "10.0.0.1:29500",
                      .help = "ddp: where rank 0 (or dtrun) serves the rendezvous store, e.g. under mpirun"},
    [TRAIN_BUCKET_CAP_MB] = {"--bucket-cap-mb", "MB", FLAG_POS_FLOAT, "measured (25 for the first steps)", "25",
                             .help = "ddp: gradient bucket size cap in MiB; giving it (or --first-bucket-mb) keeps "
                             "PyTorch's fixed layout instead of the one measured after the first steps (one bucket "
                             "after backward where the communication threads share the compute's CPUs)"},
    [TRAIN_FIRST_BUCKET_MB] = {"--first-bucket-mb", "MB", FLAG_POS_FLOAT, "measured (1 for the first steps)", "1",
                               .help = "ddp: size of the first bucket (the last layers) in MiB; fixes the layout as "
                               "--bucket-cap-mb does"},
    [TRAIN_GRAD_PIECE_MB] = {"--grad-piece-mb", "MB", FLAG_NONNEG_FLOAT,
                             "auto: 0.25 where every rank's communication thread has a CPU of its own, else 0", "1",
                             .help = "ddp, measured layout: a weight whose gradient is larger (a Linear's) is computed "
                             "and announced in up to 8 pieces of whole rows of about this size, so the measured "
                             "layout can start its all-reduce before all of it is computed (0: whole tensors)"},
    [TRAIN_BROADCAST_BUFFERS] = {"--broadcast-buffers", "on|off", FLAG_CHOICE, "on", "off",
                                 .help = "ddp: broadcast batch-norm statistics from rank 0 before every forward, as "
                                 "PyTorch does", .choices = on_off},
    [TRAIN_SHARED_GRADS] = {"--shared-grads", "on|off", FLAG_CHOICE, "on", "off",
                            .help = "ddp: ranks on one host (shm backend) keep their gradients in memory they map "
                            "from each other (with --comm-hook, their 16-bit copies), and the all-reduces read them "
                            "there (off: copied through the backend's buffers)", .choices = on_off},
    [TRAIN_SHARDED_UPDATE] = {"--sharded-update", "auto|on|off", FLAG_CHOICE, "auto", "on",
                              .help = "ddp: ranks on one host keep one copy of the parameters and optimizer state, "
                              "and each bucket's all-reduce steps this rank's share of it (ZeRO-1 within a host). "
                              "on with --clip-grad-norm, --amp fp16, --sparse-embeddings, --comm-hook or "
                              "--shared-grads off is an error; models with row tables, or ranks that cannot share "
                              "memory, step the whole model on every rank; auto: on where the parameters and "
                              "optimizer state take 5 MiB or more, or 1 MiB or more and less than a step's "
                              "activations, and nothing rules it out; where it is off, every rank steps its own whole "
                              "model inside the all-reduces (the fused update; DT_FUSED_UPDATE=0: after them)",
                              .choices = auto_on_off},
    [TRAIN_FIND_UNUSED_PARAMETERS] = {"--find-unused-parameters", NULL, FLAG_BOOL, "off", NULL,
                                      .help = "ddp: reduce parameters that got no gradient as zeros instead of "
                                      "failing"},
    [TRAIN_COMM_HOOK] = {"--comm-hook", "NAME", FLAG_CHOICE, "none", "bf16",
                         .help = "ddp: compress gradients for the all-reduce: none, bf16 or fp16 (divided by the world "
                         "size first)", .choices = comm_hooks},
    [TRAIN_EMBEDDING_EXCHANGE] = {"--embedding-exchange", "NAME", FLAG_CHOICE, "auto", "sparse",
                                  .help = "ddp: exchange an embedding table's gradient as the touched rows "
                                  "(all-gather of ids and values: sparse), as the whole table (all-reduce: dense), or "
                                  "whichever moves fewer bytes, decided every step (auto)", .choices = exchanges},
    [TRAIN_TIMEOUT] = {"--timeout", "SECONDS", FLAG_POS_FLOAT, "DT_TIMEOUT (300)", "60",
                       .help = "ddp: how long the rendezvous and each all-reduce may wait for the other ranks"},
    [TRAIN_SAVE_EVERY] = {"--save-every", "EPOCHS", FLAG_POS_INT, "off", "1",
                          .help = "write a snapshot (weights, optimizer state, position) to DIR/snapshots after every "
                          "EPOCHS epochs"},
    [TRAIN_SAVE_EVERY_STEPS] = {"--save-every-steps", "N", FLAG_POS_I64, "off", "500",
                                .help = "write a snapshot every N optimizer steps"},
    [TRAIN_KEEP] = {"--keep", "K", FLAG_POS_INT, "3", "2", .help = "keep the newest K snapshots, delete older ones"},
    [TRAIN_SAVE_ON_INTERRUPT] = {"--save-on-interrupt", NULL, FLAG_BOOL, "off", NULL,
                                 .help = "Ctrl-C (SIGINT) or SIGTERM writes a snapshot where the run stopped, to resume "
                                 "from that step"},
    [TRAIN_RESUME] = {"--resume", "auto|PATH", FLAG_STR, "off", "auto",
                      .help = "continue from a snapshot: auto = the newest loadable one in --out DIR (none: start "
                      "afresh), or a file; prints what the new flags change"},
    [TRAIN_ALLOW_DATA_CHANGE] = {"--allow-data-change", NULL, FLAG_BOOL, "off", NULL,
                                 .help = "--resume on other data (--data, --val-data, --val-fraction, --limit-train, "
                                 "--limit-test, --limit-pick, --normalize, --augment, the text data flags differ from the snapshot's), refused otherwise"},
    [TRAIN_OVERWRITE] = {"--overwrite", NULL, FLAG_BOOL, "off", NULL,
                         .help = "--out DIR holds an earlier run's outputs: delete them (snapshots included) and start "
                         "afresh; without it such a DIR is refused"},
    [TRAIN_TENSORBOARD] = {"--tensorboard", "DIR", FLAG_STR, "off", "runs/tb",
                           .help = "write TensorBoard event files (loss, accuracy, lr, throughput per step) to DIR"},
    [TRAIN_TENSORBOARD_ALL_RANKS] = {"--tensorboard-all-ranks", NULL, FLAG_BOOL, "off", NULL,
                                     .help = "ddp: every rank writes its own events (rank R > 0 into DIR/rank<R>), not "
                                     "only rank 0"},
    [TRAIN_LOG_EVERY] = {"--log-every", "N", FLAG_POS_INT, "10", "50",
                         .help = "TensorBoard training scalars: means over every N optimizer steps"},
    [TRAIN_TRACE] = {"--trace", "FILE", FLAG_STR, "off", "runs/exp1/trace.json",
                     .help = "write a Chrome trace (Perfetto, chrome://tracing) of every rank and thread to FILE at "
                     "the end"},
};

/* Flags that only some optimizers or one strategy take. */
static const train_flag sgd_only[] = {TRAIN_MOMENTUM, TRAIN_DAMPENING, TRAIN_NESTEROV};
static const train_flag adam_only[] = {TRAIN_BETAS, TRAIN_EPS};
static const train_flag ddp_only[] = {TRAIN_BACKEND, TRAIN_MASTER, TRAIN_BUCKET_CAP_MB, TRAIN_FIRST_BUCKET_MB,
                                      TRAIN_GRAD_PIECE_MB,
                                      TRAIN_BROADCAST_BUFFERS, TRAIN_SHARED_GRADS, TRAIN_SHARDED_UPDATE,
                                      TRAIN_FIND_UNUSED_PARAMETERS, TRAIN_COMM_HOOK,
                                      TRAIN_EMBEDDING_EXCHANGE, TRAIN_TIMEOUT};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The first of ids that was given, or -1. */
static int first_given(const flag_args *p, const train_flag *ids, int n) {
  for (int i = 0; i < n; i++)
    if (p->v[ids[i]].given) return (int)ids[i];
  return -1;
}

/* The thread budget; a count the library refuses (too large, a bad DT_NUM_THREADS) is a usage error. */
static int set_threads(const char *prog, int threads) {
  if (dt_set_threads(threads) == DT_OK) return 0;
  return flags_usage_error(prog, "e.g. --threads 4", "%s", dt_last_error());
}

/* --hidden W1,W2,... into a config's widths. */
static void read_hidden(const flag_value *v, int hidden[FLAGS_MAX_LIST], int *n_hidden) {
  *n_hidden = v->n_list;
  memcpy(hidden, v->list, sizeof v->list);
}

/* --normalize MEAN,STD into n (enabled). */
static void read_normalize(const flag_value *v, dt_normalize *n) {
  n->enabled = 1;
  n->mean = (float)v->pair[0];
  n->std = (float)v->pair[1];
}

/* The embedding models' flags: --factors, --embedding-l2, --sparse-embeddings (mf and ncf only). */
static int train_embedding_flags(const flag_args *p, dt_train_config *cfg) {
  static const train_flag ids[] = {TRAIN_FACTORS, TRAIN_EMBEDDING_L2, TRAIN_SPARSE_EMBEDDINGS};
  const flag_value *v = p->v;
  const int id = first_given(p, ids, COUNT(ids));
  if (id >= 0 && strcmp(cfg->model, "mf") != 0 && strcmp(cfg->model, "ncf") != 0)
    return flags_usage_error(p->prog, "use it with --model mf or ncf", "%s applies only to the embedding models mf "
                             "and ncf, not %s", train_flags[id].name, cfg->model);
  if (v[TRAIN_FACTORS].given) cfg->factors = (int)v[TRAIN_FACTORS].i;
  if (v[TRAIN_EMBEDDING_L2].given) cfg->embedding_l2 = (float)v[TRAIN_EMBEDDING_L2].f;
  cfg->sparse_embeddings = v[TRAIN_SPARSE_EMBEDDINGS].given;
  return 0;
}

/* The bert models' sizes: --layers, --hidden-size, --heads, --intermediate-size. */
static int train_bert_flags(const flag_args *p, dt_train_config *cfg) {
  static const train_flag ids[] = {TRAIN_LAYERS, TRAIN_HIDDEN_SIZE, TRAIN_HEADS, TRAIN_INTERMEDIATE_SIZE};
  const int id = first_given(p, ids, COUNT(ids));
  if (id >= 0 && strncmp(cfg->model, "bert", 4) != 0)
    return flags_usage_error(p->prog, "use it with --model bert or a bert preset (dtrain models)",
                             "%s applies only to the bert models, not %s", train_flags[id].name, cfg->model);
  for (size_t k = 0; k < COUNT(ids); k++)
    if (p->v[ids[k]].given) cfg->bert_dims[k] = (int)p->v[ids[k]].i;
  return 0;
}

/* Model and data: --model, --hidden, --dropout, --data, --normalize, the limits, --epochs, --batch-size. */
static int train_model_flags(const flag_args *p, dt_train_config *cfg) {
  const flag_value *v = p->v;
  if (v[TRAIN_MODEL].given) cfg->model = v[TRAIN_MODEL].raw;
  int rc = check_model(p->prog, cfg->model);
  if (rc) return rc;
  if (v[TRAIN_HIDDEN].given) {
    /* Only mlp and ncf have widths to choose; the zoo would silently ignore them elsewhere. */
    if (strcmp(cfg->model, "mlp") != 0 && strcmp(cfg->model, "ncf") != 0)
      return flags_usage_error(p->prog, "add --model mlp, or drop --hidden",
                               "--hidden applies only to --model mlp or ncf, not %s", cfg->model);
    read_hidden(&v[TRAIN_HIDDEN], cfg->hidden, &cfg->n_hidden);
  }
  if (v[TRAIN_DROPOUT].given) cfg->dropout = (float)v[TRAIN_DROPOUT].f;
  if (v[TRAIN_ZERO_INIT_RESIDUAL].given) {
    if (strncmp(cfg->model, "resnet", 6) != 0)
      return flags_usage_error(p->prog, "use it with a resnet model (dtrain models)",
                               "--zero-init-residual applies only to the resnets, not %s", cfg->model);
    cfg->zero_init_residual = 1;
  }
  if (v[TRAIN_WIDTH].given) {
    if (!dt_model_zoo_takes_width(cfg->model))
      return flags_usage_error(p->prog, "use it with resnet9, resnet20, resnet32 or resnet56",
                               "--width applies only to the models with a width to choose, not %s", cfg->model);
    cfg->width = (int)v[TRAIN_WIDTH].i;
  }
  rc = train_embedding_flags(p, cfg);
  if (rc) return rc;
  rc = train_bert_flags(p, cfg);
  if (rc) return rc;
  if (v[TRAIN_INIT_FROM].given) cfg->init_from = v[TRAIN_INIT_FROM].raw;
  if (v[TRAIN_DATA].given) cfg->data = v[TRAIN_DATA].raw;
  if (v[TRAIN_SPLIT].given) cfg->holdout = (dt_holdout)v[TRAIN_SPLIT].choice;
  if (v[TRAIN_NORMALIZE].given) read_normalize(&v[TRAIN_NORMALIZE], &cfg->normalize);
  if (v[TRAIN_AUGMENT].given) cfg->augment = (dt_augment)v[TRAIN_AUGMENT].choice;
  if (v[TRAIN_TTA].given) cfg->tta = (dt_tta)v[TRAIN_TTA].choice;
  if (v[TRAIN_DATA_WORKERS].given) /* 0: none, as DataLoader(num_workers=0) */
    cfg->data_workers = v[TRAIN_DATA_WORKERS].i ? (int)v[TRAIN_DATA_WORKERS].i : DT_LOADER_INLINE;
  cfg->cache_images = v[TRAIN_CACHE_IMAGES].given;
  cfg->skip_bad_images = v[TRAIN_SKIP_BAD_IMAGES].given;
  if ((rc = read_text_flags(p, train_flags, TRAIN_VOCAB, cfg->data, &cfg->text))) return rc;
  if (v[TRAIN_LIMIT_TRAIN].given) cfg->limit_train = v[TRAIN_LIMIT_TRAIN].i;
  if (v[TRAIN_LIMIT_TEST].given) cfg->limit_test = v[TRAIN_LIMIT_TEST].i;
  if (v[TRAIN_LIMIT_PICK].given && !v[TRAIN_LIMIT_TRAIN].given && !v[TRAIN_LIMIT_TEST].given)
    return flags_usage_error(p->prog, "e.g. --limit-train 5000 --limit-pick random",
                             "--limit-pick chooses which samples --limit-train or --limit-test keep: give one of them");
  if (v[TRAIN_LIMIT_PICK].given) cfg->limit_pick = (dt_limit_pick)v[TRAIN_LIMIT_PICK].choice;
  if (v[TRAIN_EPOCHS].given) cfg->epochs = (int)v[TRAIN_EPOCHS].i;
  if (v[TRAIN_BATCH_SIZE].given) cfg->batch_size = (int)v[TRAIN_BATCH_SIZE].i;
  return 0;
}

/* The task's loss and the validation data: --loss, --pos-weight, --val-fraction, --val-data. */
static int train_task_flags(const flag_args *p, dt_train_config *cfg) {
  const flag_value *v = p->v;
  if (v[TRAIN_LOSS].given) cfg->regression_loss = v[TRAIN_LOSS].choice;
  if (v[TRAIN_POS_WEIGHT].given) {
    if (v[TRAIN_POS_WEIGHT].n_nums > DT_TRAIN_MAX_POS_WEIGHT)
      return flags_usage_error(p->prog, "e.g. --pos-weight 3.0", "--pos-weight: more than %d values",
                               DT_TRAIN_MAX_POS_WEIGHT);
    cfg->n_pos_weight = v[TRAIN_POS_WEIGHT].n_nums;
    for (int i = 0; i < cfg->n_pos_weight; i++) cfg->pos_weight[i] = (float)v[TRAIN_POS_WEIGHT].nums[i];
  }
  if (v[TRAIN_VAL_FRACTION].given) {
    if (!(v[TRAIN_VAL_FRACTION].f > 0))
      return flags_usage_error(p->prog, "e.g. --val-fraction 0.1", "--val-fraction: '%s' is not a fraction in (0, 1)",
                               v[TRAIN_VAL_FRACTION].raw);
    cfg->val_fraction = v[TRAIN_VAL_FRACTION].f;
  }
  if (v[TRAIN_VAL_DATA].given) cfg->val_data = v[TRAIN_VAL_DATA].raw;
  if (cfg->val_data && cfg->val_fraction > 0)
    return flags_usage_error(p->prog, "drop one of them", "--val-fraction and --val-data both choose the validation data");
  return 0;
}

/* Optimizer: its own defaults first, then the flags that apply to it. */
static int train_optimizer_flags(const flag_args *p, dt_train_config *cfg) {
  const flag_value *v = p->v;
  dt_optim_kind kind = v[TRAIN_OPTIMIZER].given ? v[TRAIN_OPTIMIZER].choice : DT_OPTIM_SGD;
  dt_optim_config_default(kind, &cfg->optim);
  cfg->lr = kind == DT_OPTIM_SGD ? 0.01f : 0.001f;
  int id = first_given(p, sgd_only, COUNT(sgd_only));
  if (kind != DT_OPTIM_SGD && id >= 0)
    return flags_usage_error(p->prog, "use it with --optimizer sgd", "%s does not apply to --optimizer %s",
                             train_flags[id].name, dt_optim_kind_name(kind));
  if (kind == DT_OPTIM_SGD && (id = first_given(p, adam_only, COUNT(adam_only))) >= 0)
    return flags_usage_error(p->prog, "use it with --optimizer adam or adamw", "%s does not apply to --optimizer sgd",
                             train_flags[id].name);
  if (v[TRAIN_LR].given) cfg->lr = (float)v[TRAIN_LR].f;
  if (v[TRAIN_MOMENTUM].given) cfg->optim.momentum = (float)v[TRAIN_MOMENTUM].f;
  if (v[TRAIN_DAMPENING].given) cfg->optim.dampening = (float)v[TRAIN_DAMPENING].f;
  if (v[TRAIN_NESTEROV].given) {
    if (!(cfg->optim.momentum > 0) || cfg->optim.dampening != 0)
      return flags_usage_error(p->prog, "e.g. --momentum 0.9 --nesterov",
                               "--nesterov needs --momentum > 0 and zero --dampening");
    cfg->optim.nesterov = 1;
  }
  if (v[TRAIN_WEIGHT_DECAY].given) cfg->optim.weight_decay = (float)v[TRAIN_WEIGHT_DECAY].f;
  if (v[TRAIN_NO_DECAY].given) {
    if (!(cfg->optim.weight_decay > 0))
      return flags_usage_error(p->prog, "e.g. --weight-decay 0.01 --no-decay bias,LayerNorm.weight",
                               "--no-decay exempts parameters from weight decay, but --optimizer %s has none: give "
                               "--weight-decay", dt_optim_kind_name(kind));
    cfg->no_decay = v[TRAIN_NO_DECAY].raw;
  }
  if (v[TRAIN_BETAS].given) {
    cfg->optim.beta1 = (float)v[TRAIN_BETAS].pair[0];
    cfg->optim.beta2 = (float)v[TRAIN_BETAS].pair[1];
  }
  if (v[TRAIN_EPS].given) cfg->optim.eps = (float)v[TRAIN_EPS].f;
  return 0;
}

/* Schedule (flags of one schedule are errors under another), regularisation, threads and seed. */
static int train_schedule_flags(const flag_args *p, dt_train_config *cfg) {
  const flag_value *v = p->v;
  if (v[TRAIN_SCHEDULE].given) cfg->schedule = v[TRAIN_SCHEDULE].choice;
  if (cfg->schedule != DT_SCHED_STEP && (v[TRAIN_STEP_SIZE].given || v[TRAIN_GAMMA].given))
    return flags_usage_error(p->prog, "add --schedule step", "--step-size and --gamma apply only to --schedule step");
  if (cfg->schedule != DT_SCHED_COSINE && v[TRAIN_MIN_LR].given)
    return flags_usage_error(p->prog, "add --schedule cosine", "--min-lr applies only to --schedule cosine");
  if (v[TRAIN_STEP_SIZE].given) cfg->step_size_epochs = (int)v[TRAIN_STEP_SIZE].i;
  if (v[TRAIN_GAMMA].given) cfg->gamma = (float)v[TRAIN_GAMMA].f;
  if (v[TRAIN_MIN_LR].given) cfg->min_lr = (float)v[TRAIN_MIN_LR].f;
  if (v[TRAIN_WARMUP_EPOCHS].given && v[TRAIN_WARMUP_STEPS].given)
    return flags_usage_error(p->prog, "give one of them", "--warmup-epochs and --warmup-steps conflict");
  if (v[TRAIN_WARMUP_EPOCHS].given) cfg->warmup_epochs = (int)v[TRAIN_WARMUP_EPOCHS].i;
  if (v[TRAIN_WARMUP_STEPS].given) cfg->warmup_steps = v[TRAIN_WARMUP_STEPS].i;
  if (v[TRAIN_CLIP_GRAD_NORM].given) cfg->clip_grad_norm = (float)v[TRAIN_CLIP_GRAD_NORM].f;
  if (v[TRAIN_AMP].given) cfg->amp = (dt_amp)v[TRAIN_AMP].choice;
  if (v[TRAIN_LABEL_SMOOTHING].given) cfg->label_smoothing = (float)v[TRAIN_LABEL_SMOOTHING].f;
  if (v[TRAIN_THREADS].given) cfg->threads = (int)v[TRAIN_THREADS].i;
  if (v[TRAIN_SEED].given) cfg->seed = v[TRAIN_SEED].u;
  return set_threads(p->prog, cfg->threads);
}

/* With no --strategy, a launcher's copy of the run (one of several: the user meant ddp, or forgot the launcher) would
 * train a model of its own into the outputs the other copies write too: a usage error, said by every copy. An
 * explicit --strategy single or dp runs the copies on purpose (a sweep, each copy with its own --out). 0 or
 * EXIT_USAGE. */
static int launcher_copies_refused(void) {
  const char *var = NULL;
  const int world = dt_dist_launched_world(&var);
  if (world <= 1) return 0;
  fprintf(stderr,
          "dtrain train: this process is one of %d a launcher started (%s=%s) and no --strategy was given: each "
          "would train a model of its own into the same outputs; add --strategy ddp to train one model across "
          "the %d processes, or --strategy single to run the copies on purpose (each with its own --out)\n",
          world, var, getenv(var), world);
  return EXIT_USAGE;
}

/* Strategy: the flags of one strategy are errors under another. */
static int train_strategy_flags(const flag_args *p, dt_train_config *cfg) {
  const flag_value *v = p->v;
  if (v[TRAIN_STRATEGY].given) cfg->strategy = v[TRAIN_STRATEGY].choice;
  else if (launcher_copies_refused()) return EXIT_USAGE;
  if (v[TRAIN_WORKERS].given) {
    if (cfg->strategy != DT_STRATEGY_DP)
      return flags_usage_error(p->prog, "add --strategy dp", "--workers applies only to --strategy dp");
    cfg->workers = (int)v[TRAIN_WORKERS].i;
  }
  int id = first_given(p, ddp_only, COUNT(ddp_only));
  if (cfg->strategy != DT_STRATEGY_DDP && id >= 0)
    return flags_usage_error(p->prog, "add --strategy ddp", "%s applies only to --strategy ddp", train_flags[id].name);
  if (v[TRAIN_ACCUMULATE].given) cfg->accumulate = (int)v[TRAIN_ACCUMULATE].i;
  if (v[TRAIN_BACKEND].given) cfg->backend = v[TRAIN_BACKEND].raw;
  if (v[TRAIN_MASTER].given) cfg->master = v[TRAIN_MASTER].raw;
  if (v[TRAIN_BUCKET_CAP_MB].given) cfg->ddp.bucket_cap_mb = v[TRAIN_BUCKET_CAP_MB].f;
  if (v[TRAIN_FIRST_BUCKET_MB].given) cfg->ddp.first_bucket_mb = v[TRAIN_FIRST_BUCKET_MB].f;
  if (v[TRAIN_BUCKET_CAP_MB].given || v[TRAIN_FIRST_BUCKET_MB].given) cfg->ddp.auto_buckets = 0;
  if (v[TRAIN_GRAD_PIECE_MB].given && !cfg->ddp.auto_buckets)
    return flags_usage_error(p->prog, "leave out --bucket-cap-mb and --first-bucket-mb",
                             "--grad-piece-mb applies to the measured bucket layout, and %s fixes the layout",
                             v[TRAIN_BUCKET_CAP_MB].given ? "--bucket-cap-mb" : "--first-bucket-mb");
  if (v[TRAIN_GRAD_PIECE_MB].given) cfg->ddp.grad_piece_mb = v[TRAIN_GRAD_PIECE_MB].f;
  if (v[TRAIN_BROADCAST_BUFFERS].given) cfg->ddp.broadcast_buffers = v[TRAIN_BROADCAST_BUFFERS].choice;
  if (v[TRAIN_SHARED_GRADS].given) cfg->ddp.shared_grads = v[TRAIN_SHARED_GRADS].choice;
  if (v[TRAIN_SHARDED_UPDATE].given) cfg->sharded_update = v[TRAIN_SHARDED_UPDATE].choice;
  if (v[TRAIN_FIND_UNUSED_PARAMETERS].given) cfg->ddp.find_unused_parameters = 1;
  if (v[TRAIN_COMM_HOOK].given) cfg->ddp.comm_hook = v[TRAIN_COMM_HOOK].choice;
  if (v[TRAIN_EMBEDDING_EXCHANGE].given) cfg->ddp.rows_exchange = (dt_rows_exchange)v[TRAIN_EMBEDDING_EXCHANGE].choice;
  if (v[TRAIN_TIMEOUT].given) cfg->timeout_s = v[TRAIN_TIMEOUT].f;
  return 0;
}

/* Under a launcher only rank 0 speaks; the others print nothing but errors. 0 or the runtime exit code. */
static int train_rank(const dt_train_config *cfg, int *rank) {
  *rank = 0;
  if (cfg->strategy != DT_STRATEGY_DDP) return 0;
  char url[300];
  if (cfg->master) snprintf(url, sizeof url, "tcp://%s", cfg->master);
  dt_dist_env env;
  if (dt_dist_env_detect(cfg->master ? url : NULL, -1, -1, &env) != DT_OK) {
    fprintf(stderr, "dtrain: %s (e.g. dtrun --standalone --nproc-per-node 2 -- dtrain train --strategy ddp ...)\n",
            dt_last_error());
    return EXIT_RUNTIME;
  }
  *rank = env.rank;
  return 0;
}

/* Snapshots, resume, TensorBoard and trace. */
static int train_snapshot_flags(const flag_args *p, dt_train_config *cfg) {
  const flag_value *v = p->v;
  if (v[TRAIN_SAVE_EVERY].given) cfg->save_every = (int)v[TRAIN_SAVE_EVERY].i;
  if (v[TRAIN_SAVE_EVERY_STEPS].given) cfg->save_every_steps = v[TRAIN_SAVE_EVERY_STEPS].i;
  if (v[TRAIN_KEEP].given) {
    if (!cfg->save_every && !cfg->save_every_steps && !v[TRAIN_SAVE_ON_INTERRUPT].given)
      return flags_usage_error(p->prog, "add --save-every N", "--keep applies only when snapshots are written");
    cfg->keep = (int)v[TRAIN_KEEP].i;
  }
  if (v[TRAIN_SAVE_ON_INTERRUPT].given) cfg->save_on_interrupt = 1;
  if (v[TRAIN_RESUME].given) {
    if (strcmp(v[TRAIN_RESUME].raw, "auto") == 0 && !v[TRAIN_OUT].given)
      return flags_usage_error(p->prog, "e.g. --out runs/exp1 --resume auto",
                               "--resume auto looks for snapshots in --out DIR: give --out");
    cfg->resume = v[TRAIN_RESUME].raw;
  }
  if (cfg->init_from && cfg->resume)
    return flags_usage_error(p->prog, "give one of them", "--init-from starts a new run from pretrained weights (fresh "
                             "optimizer, step 0); --resume continues a snapshot with its optimizer state and "
                             "position: they conflict");
  if (v[TRAIN_OVERWRITE].given && cfg->resume)
    return flags_usage_error(p->prog, "give one of them", "--overwrite starts afresh, --resume continues: they conflict");
  if (v[TRAIN_ALLOW_DATA_CHANGE].given && !cfg->resume)
    return flags_usage_error(p->prog, "add --resume auto", "--allow-data-change applies only with --resume");
  cfg->overwrite = v[TRAIN_OVERWRITE].given;
  cfg->allow_data_change = v[TRAIN_ALLOW_DATA_CHANGE].given;
  if (v[TRAIN_TENSORBOARD].given) cfg->tensorboard = v[TRAIN_TENSORBOARD].raw;
  if (v[TRAIN_TENSORBOARD_ALL_RANKS].given) {
    if (!cfg->tensorboard || cfg->strategy != DT_STRATEGY_DDP)
      return flags_usage_error(p->prog, "add --strategy ddp --tensorboard DIR",
                               "--tensorboard-all-ranks needs --tensorboard DIR and --strategy ddp");
    cfg->tensorboard_all_ranks = 1;
  }
  if (v[TRAIN_LOG_EVERY].given) {
    if (!cfg->tensorboard)
      return flags_usage_error(p->prog, "add --tensorboard DIR", "--log-every applies only with --tensorboard");
    cfg->log_every = (int)v[TRAIN_LOG_EVERY].i;
  }
  if (v[TRAIN_TRACE].given) cfg->trace = v[TRAIN_TRACE].raw;
  return 0;
}

/* --out (default runs/<model>-<yyyymmdd-hhmmss>, written into out_dir), --quiet and --progress. */
static int train_output_flags(const flag_args *p, int rank, dt_train_config *cfg, char *out_dir, size_t n) {
  const flag_value *v = p->v;
  if (v[TRAIN_OUT].given) {
    cfg->out_dir = v[TRAIN_OUT].raw;
  } else {
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32];
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(out_dir, n, "runs/%.200s-%s", cfg->model, stamp);
    cfg->out_dir = out_dir;
  }
  if (v[TRAIN_QUIET].given && v[TRAIN_PROGRESS].given)
    return flags_usage_error(p->prog, "give one of them", "--quiet and --progress conflict");
  if (v[TRAIN_PROGRESS].given) cfg->progress_mode = v[TRAIN_PROGRESS].choice;
  cfg->progress = v[TRAIN_QUIET].given || rank != 0 ? NULL : stdout;
  return 0;
}

/* "test <metric>" lines, or why there are none. */
static void print_test_metrics(FILE *f, const dt_train_result *r) {
  if (isnan(r->test_loss)) {
    fprintf(f, "  %-22s %s\n", "test", "none: no validation data (give --val-fraction or --val-data)");
    return;
  }
  for (int i = 0; i < r->metrics.n_eval; i++) {
    const dt_metric_desc *d = &r->metrics.eval[i];
    char name[64];
    snprintf(name, sizeof name, "test %s", d->label);
    if (d->percent)
      fprintf(f, "  %-22s %.2f%%\n", name, 100 * r->test_metric[i]);
    else
      fprintf(f, "  %-22s %.4f\n", name, r->test_metric[i]);
  }
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
    fprintf(f, "  %-22s %d ranks over %s%s%s, all-reduce %.2f s of which %.0f%% hidden behind backward (step by "
            "step, the least over the ranks)\n", "ddp", r->world_size, r->backend,
            r->ddp.shared_grads ? " with shared gradients" : "",
            r->ddp.sharded_update ? " and a sharded update" : r->ddp.fused_update ? " and a fused update" : "",
            r->comm_critical_total_seconds, 100 * r->comm_hidden);
  fprintf(f, "  %-22s %.0f samples/s\n", "train throughput", r->train_samples_per_s);
  if (!isnan(r->test_loss)) fprintf(f, "  %-22s %.0f samples/s\n", "inference throughput", r->infer_samples_per_s);
  print_test_metrics(f, r);
  fprintf(f, "  %-22s %s\n", "peak RSS", rss);
  if (cfg->out_dir) fprintf(f, "  %-22s %s\n", "outputs", cfg->out_dir);
}

/* Runs the checked configuration: banner, training with Ctrl-C handling, summary. */
static int train_run(dt_train_config *cfg) {
  FILE *out = cfg->progress;
  if (out) {
    fprintf(out,
            "training %s on %s: %d epoch(s), batch %d, %s lr %g, %d thread(s) (%s), strategy %s, amp %s%s, out %s\n",
            cfg->model, cfg->data, cfg->epochs, cfg->batch_size, dt_optim_kind_name(cfg->optim.kind), (double)cfg->lr,
            dt_get_threads(), dt_sgemm_name(), dt_strategy_name(cfg->strategy), dt_amp_path_name(cfg->amp),
            cfg->tta == DT_TTA_FLIP ? ", test-time flip" : "", cfg->out_dir);
    fflush(out);
  }
  /* SIGTERM counts as Ctrl-C: schedulers (Slurm's --signal, scancel, preemption) and launchers send it before
   * they kill, so the run stops at a step boundary and can save a snapshot. */
  stop_signals_arm(1);
  dt_train_result res;
  dt_status st = dt_train_run(cfg, &res);
  stop_signals_arm(0);
  if (st != DT_OK) return runtime_error(st, NULL);
  if (out) print_train_summary(cfg, &res, out);
  if (res.interrupted) {
    const int sig = stop_signals_first() ? stop_signals_first() : SIGINT;
    fprintf(stderr, "dtrain: interrupted after %lld step(s) by %s; metrics and weights are in %s%s\n",
            (long long)res.steps, sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg->out_dir,
            cfg->save_on_interrupt ? " (continue with --resume auto)" : "");
    return EXIT_INTERRUPTED + sig;
  }
  return 0;
}

static int cmd_train(const flag_args *p) {
  dt_train_config cfg;
  dt_train_config_default(&cfg);
  char out_dir[256];
  int rank = 0, rc;
  if (stop_signals_start() != 0) return EXIT_RUNTIME; /* first: no other thread may exist yet */
  if ((rc = train_model_flags(p, &cfg)) || (rc = train_task_flags(p, &cfg)) || (rc = train_optimizer_flags(p, &cfg)) ||
      (rc = train_schedule_flags(p, &cfg)) || (rc = train_strategy_flags(p, &cfg)) || (rc = train_rank(&cfg, &rank)) ||
      (rc = train_snapshot_flags(p, &cfg)) || (rc = train_output_flags(p, rank, &cfg, out_dir, sizeof out_dir)))
    return rc;
  /* What the library rejects about the combination is still a usage error. */
  if (dt_train_config_check(&cfg) != DT_OK)
    return flags_usage_error(p->prog, "see 'dtrain train --help'", "%s", dt_last_error());
  return train_run(&cfg);
}

/* ---- eval -------------------------------------------------------------------- */
typedef enum eval_flag {
  EVAL_WEIGHTS, EVAL_MODEL, EVAL_HIDDEN, EVAL_WIDTH, EVAL_DATA, EVAL_SPLIT, EVAL_NORMALIZE, EVAL_AUGMENT, EVAL_TTA, EVAL_VOCAB,
  EVAL_TEXT_COLUMN, EVAL_TEXT_PAIR_COLUMN, EVAL_LABEL_COLUMNS, EVAL_LABEL_COLUMN, EVAL_MAX_LEN, EVAL_NO_LOWER_CASE,
  EVAL_SKIP_BAD_ROWS, EVAL_BATCH_SIZE, EVAL_THREADS, EVAL_LIMIT, EVAL_STRATEGY, EVAL_WORKERS, EVAL_COUNT
} eval_flag;
_Static_assert(EVAL_SKIP_BAD_ROWS - EVAL_VOCAB == TEXT_SKIP_BAD_ROWS, "eval's text flags in text_flag order");

static const flag_choice splits[] = {{"test", DT_SPLIT_TEST}, {"train", DT_SPLIT_TRAIN}, {NULL, 0}};
static const flag_choice eval_strategies[] = {{"single", DT_STRATEGY_SINGLE}, {"dp", DT_STRATEGY_DP}, {NULL, 0}};

static const flag_spec eval_flags[EVAL_COUNT] = {
    [EVAL_WEIGHTS] = {"--weights", "FILE", FLAG_STR, "required", "runs/exp1/model.safetensors",
                      .help = "safetensors weights to evaluate"},
    [EVAL_MODEL] = {"--model", "NAME", FLAG_STR, "from the file's metadata", "mlp",
                    .help = "model from the zoo the weights belong to"},
    [EVAL_HIDDEN] = {"--hidden", "W1,W2,...", FLAG_WIDTHS, "from the file's metadata", "256,128",
                     .help = "hidden layer widths of mlp"},
    [EVAL_WIDTH] = {"--width", "W", FLAG_INT_RANGE, "from the file's metadata, else the model's own", "32",
                    .help = "resnet9, resnet20, resnet32, resnet56: the training's --width", .lo = 1, .hi = 4096},
    [EVAL_DATA] = {"--data", "SOURCE", FLAG_STR, "from the file's metadata, else fashion-mnist", "fashion-mnist",
                   .help = "dataset name or a directory of IDX files"},
    [EVAL_SPLIT] = {"--split", "NAME", FLAG_CHOICE, "test", "train",
                    .help = "which split to evaluate: test or train", .choices = splits},
    [EVAL_NORMALIZE] = {"--normalize", "MEAN,STD", FLAG_MEAN_STD, "from the file's metadata", "0.2860,0.3530",
                        .help = "input normalisation used in training"},
    [EVAL_AUGMENT] = {"--augment", "PRESET", FLAG_CHOICE, "from the file's metadata, else none", "cifar",
                      .help = "RGB images: the training's transform preset, whose test transforms (and mean and "
                              "std, unless --normalize) apply: cifar, imagenet or none",
                      .choices = augments},
    [EVAL_TTA] = {"--tta", "MODE", FLAG_CHOICE, "from the file's metadata, else none", "flip",
                  .help = HELP_TTA " (none overrides a run's flip)", .choices = ttas},
    [EVAL_VOCAB] = {"--vocab", "FILE", FLAG_STR, "from the file's metadata", VOCAB_EXAMPLE, .help = HELP_VOCAB},
    [EVAL_TEXT_COLUMN] = {"--text-column", "NAME", FLAG_STR, "from the file's metadata", "comment_text",
                          .help = HELP_TEXT_COLUMN},
    [EVAL_TEXT_PAIR_COLUMN] = {"--text-pair-column", "NAME", FLAG_STR, "from the file's metadata", "hypothesis",
                               .help = HELP_TEXT_PAIR_COLUMN},
    [EVAL_LABEL_COLUMNS] = {"--label-columns", "A,B,...", FLAG_STR, "from the file's metadata",
                            "toxic,severe_toxic,insult", .help = HELP_LABEL_COLUMNS},
    [EVAL_LABEL_COLUMN] = {"--label-column", "NAME", FLAG_STR, "from the file's metadata", "class",
                           .help = HELP_LABEL_COLUMN " (its classes numbered as in training)"},
    [EVAL_MAX_LEN] = {"--max-len", "N", FLAG_INT_RANGE, "from the file's metadata", "128", .help = HELP_MAX_LEN,
                      .lo = 3, .hi = 8192},
    [EVAL_NO_LOWER_CASE] = {"--no-lower-case", NULL, FLAG_BOOL, "from the file's metadata", NULL,
                            .help = HELP_NO_LOWER_CASE},
    [EVAL_SKIP_BAD_ROWS] = {"--skip-bad-rows", NULL, FLAG_BOOL, "off: such a row is an error", NULL,
                            .help = HELP_SKIP_BAD_ROWS},
    [EVAL_BATCH_SIZE] = {"--batch-size", "N", FLAG_POS_INT, "256", "256", .help = "samples per forward pass"},
    [EVAL_THREADS] = {"--threads", "N", FLAG_NONNEG_INT, "DT_NUM_THREADS, OMP_NUM_THREADS or all cores", "4",
                      .help = "compute threads"},
    [EVAL_LIMIT] = {"--limit", "N", FLAG_POS_I64, "all", "500", .help = "evaluate the first N samples only"},
    [EVAL_STRATEGY] = {"--strategy", "NAME", FLAG_CHOICE, "single", "dp",
                       .help = "single, or dp: worker threads on slices of each batch", .choices = eval_strategies},
    [EVAL_WORKERS] = {"--workers", "N", FLAG_POS_INT, "the thread budget", "2", .help = "dp: worker threads"},
};

static int eval_flags_read(const flag_args *p, dt_eval_config *cfg) {
  const flag_value *v = p->v;
  if (!v[EVAL_WEIGHTS].given)
    return flags_usage_error(p->prog, "e.g. --weights runs/exp1/model.safetensors", "--weights FILE is required");
  cfg->weights = v[EVAL_WEIGHTS].raw;
  int rc = v[EVAL_MODEL].given ? check_model(p->prog, v[EVAL_MODEL].raw) : 0;
  if (rc) return rc;
  if (v[EVAL_MODEL].given) cfg->model = v[EVAL_MODEL].raw;
  if (v[EVAL_HIDDEN].given) read_hidden(&v[EVAL_HIDDEN], cfg->hidden, &cfg->n_hidden);
  if (v[EVAL_DATA].given) cfg->data = v[EVAL_DATA].raw;
  if (v[EVAL_SPLIT].given) cfg->split = v[EVAL_SPLIT].choice;
  if (v[EVAL_NORMALIZE].given) read_normalize(&v[EVAL_NORMALIZE], &cfg->normalize);
  cfg->normalize_set = v[EVAL_NORMALIZE].given;
  if (v[EVAL_AUGMENT].given) cfg->augment = (dt_augment)v[EVAL_AUGMENT].choice;
  cfg->augment_set = v[EVAL_AUGMENT].given;
  if (v[EVAL_TTA].given) cfg->tta = (dt_tta)v[EVAL_TTA].choice;
  cfg->tta_set = v[EVAL_TTA].given;
  if (v[EVAL_WIDTH].given) cfg->width = (int)v[EVAL_WIDTH].i;
  if ((rc = read_text_flags(p, eval_flags, EVAL_VOCAB, cfg->data, &cfg->text))) return rc;
  if (v[EVAL_BATCH_SIZE].given) cfg->batch_size = (int)v[EVAL_BATCH_SIZE].i;
  if (v[EVAL_THREADS].given) cfg->threads = (int)v[EVAL_THREADS].i;
  if (v[EVAL_LIMIT].given) cfg->limit = v[EVAL_LIMIT].i;
  if ((rc = set_threads(p->prog, cfg->threads))) return rc;
  int dp = v[EVAL_STRATEGY].given && v[EVAL_STRATEGY].choice == DT_STRATEGY_DP;
  if (v[EVAL_WORKERS].given && !dp)
    return flags_usage_error(p->prog, "add --strategy dp", "--workers applies only to --strategy dp");
  if (dp) cfg->workers = v[EVAL_WORKERS].given ? (int)v[EVAL_WORKERS].i : dt_get_threads();
  return 0;
}

static int cmd_eval(const flag_args *p) {
  dt_eval_config cfg;
  dt_eval_config_default(&cfg);
  int rc = eval_flags_read(p, &cfg);
  if (rc) return rc;
  dt_eval_result r;
  dt_status st = dt_eval_run(&cfg, &r);
  if (st == DT_USAGE) return flags_usage_error(p->prog, "see 'dtrain eval --help'", "%s", dt_last_error());
  if (st != DT_OK)
    return runtime_error(st, "check --weights and --data; --model and --hidden must match the training run");
  printf("eval %s on %s %s (%lld samples%s): loss %.4f", r.model, r.data,
         cfg.split == DT_SPLIT_TEST ? "test" : "train", (long long)r.samples,
         r.tta == DT_TTA_FLIP ? ", each with its mirror" : "", r.loss);
  for (int i = 0; i < r.metrics.n_eval; i++) {
    const dt_metric_desc *d = &r.metrics.eval[i];
    if (d->percent)
      printf("  %s %.2f%%", d->brief, 100 * r.metric[i]);
    else
      printf("  %s %.4f", d->brief, r.metric[i]);
  }
  printf("  %.2f s  %.0f samples/s\n", r.seconds, r.samples_per_s);
  return 0;
}

/* ---- recommend ----------------------------------------------------------------- */
typedef enum recommend_flag {
  REC_WEIGHTS, REC_USER, REC_TOP, REC_DATA, REC_JSON, REC_THREADS, REC_COUNT
} recommend_flag;

static const flag_spec recommend_flags[REC_COUNT] = {
    [REC_WEIGHTS] = {"--weights", "FILE", FLAG_STR, "required", "runs/mf/model.safetensors",
                     .help = "mf or ncf weights trained on ratings"},
    [REC_USER] = {"--user", "ID", FLAG_INT_RANGE, "required", "1", .help = "the user, by the userId of ratings.csv",
                  .lo = 0, .hi = 2147483647, .expect = "a userId (an integer in [0, 2147483647])"},
    [REC_TOP] = {"--top", "K", FLAG_POS_INT, "10", "10", .help = "movies to recommend"},
    [REC_DATA] = {"--data", "DIR", FLAG_STR, "from the file's metadata", "../shared/data/movielens/ml-latest-small",
                  .help = "the ratings: the user's rated movies are left out; titles and genres from movies.csv"},
    [REC_JSON] = {"--json", NULL, FLAG_BOOL, NULL, NULL,
                  .help = "one JSON object {user, items: [{movie_id, score, title, genres}]} instead of the table"},
    [REC_THREADS] = {"--threads", "N", FLAG_NONNEG_INT, "DT_NUM_THREADS, OMP_NUM_THREADS or all cores", "4",
                     .help = "compute threads"},
};

static int cmd_recommend(const flag_args *p) {
  const flag_value *v = p->v;
  if (!v[REC_WEIGHTS].given)
    return flags_usage_error(p->prog, "e.g. --weights runs/mf/model.safetensors", "--weights FILE is required");
  if (!v[REC_USER].given) return flags_usage_error(p->prog, "e.g. --user 1", "--user ID is required");
  dt_recommend_config cfg;
  dt_recommend_config_default(&cfg);
  cfg.weights = v[REC_WEIGHTS].raw;
  cfg.user = v[REC_USER].i;
  if (v[REC_TOP].given) cfg.top = (int)v[REC_TOP].i;
  cfg.data = v[REC_DATA].raw;
  if (v[REC_THREADS].given) cfg.threads = (int)v[REC_THREADS].i;
  int rc = set_threads(p->prog, cfg.threads);
  if (rc) return rc;
  dt_recommend_result *r = NULL;
  dt_status st = dt_recommend(&cfg, &r);
  if (st == DT_OK) st = recommend_print(stdout, &cfg, r, v[REC_JSON].given);
  dt_recommend_result_free(r);
  if (st == DT_USAGE) return flags_usage_error(p->prog, "see 'dtrain recommend --help'", "%s", dt_last_error());
  if (st != DT_OK)
    return runtime_error(st, "check --weights and --data, and that --user is a userId of the ratings trained on");
  return 0;
}

/* ---- models ------------------------------------------------------------------ */
/* The parameters of a zoo model built for zc, or 0 when it does not fit zc. */
static size_t zoo_params(const char *name, const dt_zoo_config *zc) {
  dt_model *m = NULL;
  size_t n = 0;
  if (dt_model_zoo_new(name, zc, &m) == DT_OK && dt_model_build(m, 1, 0) == DT_OK) n = dt_model_num_params(m);
  dt_model_free(m);
  dt_clear_error();
  return n;
}

static void print_model(const char *name, const char *doc, void *user) {
  (void)user;
  static const int64_t ml_small[2] = {610, 9724}; /* MovieLens ml-latest-small's users and movies */
  const dt_zoo_config images = {.ndim = 3, .input_shape = {1, 28, 28}, .outputs = 10, .dropout = -1.0f};
  const dt_zoo_config ratings = {.ndim = 1, .input_shape = {2}, .outputs = 1, .task = DT_TASK_REGRESSION,
                                 .dropout = -1.0f, .n_index = 2, .index_size = ml_small};
  /* The ImageNet resnets need images of at least 32x32: counted at ImageNet's 3x224x224, 1000 classes */
  const dt_zoo_config imagenet = {.ndim = 3, .input_shape = {3, 224, 224}, .outputs = 1000, .dropout = -1.0f};
  static const int64_t bert_vocab = 30522; /* bert-base-uncased's vocabulary */
  const dt_zoo_config text = {.ndim = 2, .input_shape = {3, 128}, .outputs = 2, .dropout = -1.0f, .n_index = 1,
                              .index_size = &bert_vocab};
  char params[32] = "?";
  size_t n = zoo_params(name, &images);
  if (n) snprintf(params, sizeof params, "%zu", n);
  else if ((n = zoo_params(name, &ratings))) snprintf(params, sizeof params, "%zu*", n);
  else if ((n = zoo_params(name, &imagenet))) snprintf(params, sizeof params, "%zu+", n);
  else if ((n = zoo_params(name, &text))) snprintf(params, sizeof params, "%zu#", n);
  char tasks[96] = "?";
  (void)dt_model_zoo_tasks(name, tasks, sizeof tasks);
  printf("  %-14s %10s  %-42s %s\n", name, params, tasks, doc);
}

static int cmd_models(const flag_args *p) {
  (void)p;
  printf("  %-14s %10s  %-42s %s\n", "model", "parameters", "tasks",
         "description (parameters for 1x28x28 inputs, 10 outputs)");
  dt_model_zoo_each(print_model, NULL);
  printf("  * for MovieLens ml-latest-small: 610 users, 9,724 movies, one rating\n");
  printf("  + for ImageNet's 3x224x224 images and 1000 classes (the model needs inputs larger than 28x28)\n");
  printf("  # for bert-base-uncased's vocabulary of 30,522 tokens and 2 classes\n");
  return 0;
}

/* ---- inspect ------------------------------------------------------------------ */
/* A snapshot of an --amp fp16 run: its loss scaler's state in words. */
static void print_loss_scaler(const dt_safetensors *f) {
  dt_named_tensor t;
  if (dt_safetensors_find(f, "trainer.loss_scaler", &t) != DT_OK || t.tensor.dtype != DT_F64 ||
      dt_tensor_numel(&t.tensor) != 3)
    return;
  const double *s = t.tensor.data;
  printf("loss scaler (--amp fp16): scale %.9g, growth tracker %.0f, skipped steps %.0f\n", s[0], s[1], s[2]);
}

static int cmd_inspect(const flag_args *p) {
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
  print_loss_scaler(f);
  dt_safetensors_free(f);
  return 0;
}


/* ---- export ------------------------------------------------------------------- */
typedef enum export_flag { EXPORT_FORMAT, EXPORT_OVERWRITE, EXPORT_COUNT } export_flag;
typedef enum export_format { EXPORT_SAFETENSORS, EXPORT_HF } export_format;

static const flag_choice export_formats[] = {{"safetensors", EXPORT_SAFETENSORS}, {"hf", EXPORT_HF}, {NULL, 0}};

static const flag_spec export_flags[EXPORT_COUNT] = {
    [EXPORT_FORMAT] = {"--format", "NAME", FLAG_CHOICE, "safetensors", "safetensors",
                       .help = "output format: safetensors (OUT is a file: the weights with dtrain's metadata) or hf "
                       "(OUT is a directory: model.safetensors as transformers writes it, f32 with {\"format\": \"pt\"}, "
                       "and config.json: the model's own HF config where it has one, else torch_dtype and the training's "
                       "metadata under \"dtrain\")", .choices = export_formats},
    [EXPORT_OVERWRITE] = {"--overwrite", NULL, FLAG_BOOL, "off: an OUT directory holding them is refused", NULL,
                          .help = "--format hf: replace OUT/model.safetensors and OUT/config.json if they exist"},
};

static int cmd_export(const flag_args *p) {
  if (strcmp(p->pos[0], p->pos[1]) == 0)
    return flags_usage_error(p->prog, "write to another file", "the output %s is the input", p->pos[1]);
  const int hf = p->v[EXPORT_FORMAT].given && p->v[EXPORT_FORMAT].choice == EXPORT_HF;
  if (p->v[EXPORT_OVERWRITE].given && !hf)
    return flags_usage_error(p->prog, "add --format hf", "--overwrite applies to --format hf (a file OUT is replaced)");
  dt_status st = hf ? dt_hf_export(p->pos[0], p->pos[1], p->v[EXPORT_OVERWRITE].given)
                    : dt_snapshot_export(p->pos[0], p->pos[1]);
  if (st == DT_USAGE) return flags_usage_error(p->prog, "add --overwrite", "%s", dt_last_error());
  if (st != DT_OK) return runtime_error(st, "check the input file name and that the output directory is writable");
  printf("exported the weights of %s to %s%s\n", p->pos[0], p->pos[1], hf ? " (model.safetensors, config.json)" : "");
  return 0;
}

/* ---- bench ------------------------------------------------------------------ */
typedef enum bench_flag {
  BENCH_MIN_BYTES, BENCH_MAX_BYTES, BENCH_FACTOR, BENCH_ITERS, BENCH_WARMUP, BENCH_DTYPE, BENCH_OP, BENCH_CHECK,
  BENCH_BACKEND, BENCH_MASTER, BENCH_TIMEOUT, BENCH_SHARED, BENCH_COUNT
} bench_flag;

static const flag_choice dtypes[] = {{"f32", DT_F32}, {"f64", DT_F64}, {"bf16", DT_BF16}, {"f16", DT_F16},
                                     {"i32", DT_I32}, {"i64", DT_I64}, {NULL, 0}};
static const flag_choice redops[] = {{"sum", DT_SUM}, {"avg", DT_AVG}, {"min", DT_MIN}, {"max", DT_MAX}, {NULL, 0}};

static const flag_spec bench_flags[BENCH_COUNT] = {
    [BENCH_MIN_BYTES] = {"-b", "BYTES", FLAG_SIZE, "8", "8",
                         .help = "smallest message (K, M, G suffixes are powers of 1024)"},
    [BENCH_MAX_BYTES] = {"-e", "BYTES", FLAG_SIZE, "64M", "64M", .help = "largest message"},
    [BENCH_FACTOR] = {"-f", "FACTOR", FLAG_POS_FLOAT, "2", "2",
                      .help = "size multiplier from one row to the next (> 1)"},
    [BENCH_ITERS] = {"-n", "ITERS", FLAG_POS_INT, "100", "100",
                     .help = "timed calls per size (fewer for large sizes: about 64 MiB moved)"},
    [BENCH_WARMUP] = {"-w", "ITERS", FLAG_NONNEG_INT, "5", "5", .help = "untimed warm-up calls per size"},
    [BENCH_DTYPE] = {"-d", "TYPE", FLAG_CHOICE, "f32", "f32", .help = "element type", .choices = dtypes},
    [BENCH_OP] = {"-o", "OP", FLAG_CHOICE, "sum", "sum", .help = "reduction", .choices = redops},
    [BENCH_CHECK] = {"--check", NULL, FLAG_BOOL, NULL, NULL,
                     .help = "verify every result and count wrong elements (#wrong); exit 1 if any"},
    [BENCH_BACKEND] = {"--backend", "NAME", FLAG_CHOICE, "auto", "shm",
                       .help = "auto (shm on one host, tcp across hosts, mpi under mpirun), shm, tcp or mpi",
                       .choices = backends},
    [BENCH_MASTER] = {"--master", "HOST:PORT", FLAG_STR, NULL, "10.0.0.1:29500",
                      .help = "rendezvous address (instead of MASTER_ADDR/MASTER_PORT, e.g. under mpirun)"},
    [BENCH_TIMEOUT] = {"--timeout", "SECONDS", FLAG_POS_FLOAT, "DT_TIMEOUT", "60",
                       .help = "deadline of the rendezvous and of each collective"},
    [BENCH_SHARED] = {"--shared", NULL, FLAG_BOOL, NULL, NULL,
                      .help = "run the in-place half on memory the ranks share (shm backend), as DDP's gradients are "
                              "by default"},
};

static int cmd_bench_allreduce(const flag_args *p) {
  const flag_value *v = p->v;
  bench_allreduce_args a = {
      .min_bytes = v[BENCH_MIN_BYTES].given ? v[BENCH_MIN_BYTES].u : 8,
      .max_bytes = v[BENCH_MAX_BYTES].given ? v[BENCH_MAX_BYTES].u : (size_t)64 << 20,
      .factor = v[BENCH_FACTOR].given ? v[BENCH_FACTOR].f : 2,
      .iters = v[BENCH_ITERS].given ? (int)v[BENCH_ITERS].i : 100,
      .warmup = v[BENCH_WARMUP].given ? (int)v[BENCH_WARMUP].i : 5,
      .check = v[BENCH_CHECK].given,
      .dtype = v[BENCH_DTYPE].given ? v[BENCH_DTYPE].choice : DT_F32,
      .op = v[BENCH_OP].given ? v[BENCH_OP].choice : DT_SUM,
      .backend = v[BENCH_BACKEND].given ? v[BENCH_BACKEND].raw : "auto",
      .master = v[BENCH_MASTER].raw,
      .timeout_s = v[BENCH_TIMEOUT].given ? v[BENCH_TIMEOUT].f : 0,
      .shared = v[BENCH_SHARED].given,
  };
  if (a.min_bytes > a.max_bytes)
    return flags_usage_error(p->prog, "e.g. -b 8 -e 64M", "-b %zu is larger than -e %zu", a.min_bytes, a.max_bytes);
  if (!(a.factor > 1) && a.min_bytes != a.max_bytes)
    return flags_usage_error(p->prog, "e.g. -f 2", "-f must be greater than 1");
  dt_status s = bench_allreduce_run(&a);
  return s == DT_OK ? 0 : runtime_error(s, NULL);
}

typedef enum scaling_flag {
  SCALING_MODEL, SCALING_HIDDEN, SCALING_DATA, SCALING_MAX_WORKERS, SCALING_EPOCHS, SCALING_SKIP_EPOCHS,
  SCALING_LIMIT_TRAIN, SCALING_BATCH_SIZE, SCALING_THREADS_PER_WORKER, SCALING_REPS, SCALING_COUNT
} scaling_flag;

static const flag_spec scaling_flags[SCALING_COUNT] = {
    [SCALING_MODEL] = {"--model", "NAME", FLAG_STR, "fashioncnn", "mlp", .help = "model from the zoo"},
    [SCALING_HIDDEN] = {"--hidden", "W1,W2,...", FLAG_WIDTHS, "the model's own", "2048,2048",
                        .help = "hidden layer widths of mlp and ncf"},
    [SCALING_DATA] = {"--data", "SOURCE", FLAG_STR, "fashion-mnist", "fashion-mnist",
                      .help = "dataset name or a directory of IDX files"},
    [SCALING_MAX_WORKERS] = {"--max-workers", "N", FLAG_POS_INT, "cores / --threads-per-worker, at most 64", "2",
                             .help = "largest worker count (at most 64)"},
    [SCALING_EPOCHS] = {"--epochs", "N", FLAG_POS_INT, "1", "1", .help = "epochs of every run"},
    [SCALING_SKIP_EPOCHS] = {"--skip-epochs", "N", FLAG_NONNEG_INT, "0: every epoch counts", "1",
                             .help = "train samples/s over the epochs after the first N only (less than --epochs): "
                                     "the first steps' one-time costs (kernels' set-up, first touches of memory, "
                                     "files read cold) weigh more in a run whose workers take fewer steps"},
    [SCALING_LIMIT_TRAIN] = {"--limit-train", "N", FLAG_POS_I64, "all", "12800",
                             .help = "training samples of every run"},
    [SCALING_BATCH_SIZE] = {"--batch-size", "N", FLAG_POS_INT, "64", "64",
                            .help = "samples per worker per step (dp: workers x this per step)"},
    [SCALING_THREADS_PER_WORKER] = {"--threads-per-worker", "N", FLAG_POS_INT, "1", "1",
                                    .help = "compute threads of each worker"},
    [SCALING_REPS] = {"--reps", "N", FLAG_POS_INT, "1", "3",
                      .help = "rounds of every run, alternated (at most 64); each row is then the round with the median "
                              "train samples/s (of an even count the lower middle one, single's the upper one: the "
                              "speedups' base never flatters them)"},
};

static int cmd_bench_scaling(const flag_args *p) {
  const flag_value *v = p->v;
  bench_scaling_args a;
  memset(&a, 0, sizeof a);
  if (v[SCALING_MODEL].given) {
    int rc = check_model(p->prog, v[SCALING_MODEL].raw);
    if (rc) return rc;
    a.model = v[SCALING_MODEL].raw;
  }
  if (v[SCALING_HIDDEN].given) {
    if (!a.model || (strcmp(a.model, "mlp") != 0 && strcmp(a.model, "ncf") != 0))
      return flags_usage_error(p->prog, "add --model mlp, or drop --hidden",
                               "--hidden applies only to --model mlp or ncf");
    a.hidden = v[SCALING_HIDDEN].raw;
  }
  /* An absent flag reads NULL or 0: bench_scaling_args' own defaults. */
  a.data = v[SCALING_DATA].raw;
  a.max_workers = (int)v[SCALING_MAX_WORKERS].i;
  a.epochs = (int)v[SCALING_EPOCHS].i;
  a.skip_epochs = (int)v[SCALING_SKIP_EPOCHS].i;
  if (a.skip_epochs > 0 && a.skip_epochs >= (a.epochs > 0 ? a.epochs : 1))
    return flags_usage_error(p->prog, "e.g. --epochs 2 --skip-epochs 1", "--skip-epochs %d leaves no epoch of %d",
                             a.skip_epochs, a.epochs > 0 ? a.epochs : 1);
  a.limit_train = v[SCALING_LIMIT_TRAIN].i;
  a.batch_size = (int)v[SCALING_BATCH_SIZE].i;
  a.threads_per_worker = (int)v[SCALING_THREADS_PER_WORKER].i;
  a.reps = (int)v[SCALING_REPS].i;
  if (a.reps > 64) return flags_usage_error(p->prog, "e.g. --reps 5", "--reps %d: at most 64 rounds", a.reps);
  /* what follows "--" goes to every run's `dtrain train`; anything else unparsed is a stray argument */
  if (p->rest < p->argc && (p->rest == 0 || strcmp(p->argv[p->rest - 1], "--") != 0))
    return flags_usage_error(p->prog, "put flags for dtrain train after --", "unexpected argument '%s'",
                             p->argv[p->rest]);
  a.extra = p->argv + p->rest;
  a.n_extra = p->argc - p->rest;
  return bench_scaling_run(&a);
}

/* ---- tokenize ---------------------------------------------------------------------- */
typedef enum tok_flag { TOK_VOCAB, TOK_MAX_LEN, TOK_SPECIAL, TOK_NO_LOWER_CASE, TOK_NULL, TOK_COUNT } tok_flag;

static const flag_spec tokenize_flags[TOK_COUNT] = {
    [TOK_VOCAB] = {"--vocab", "FILE", FLAG_STR, "required", "bert-base-uncased-vocab.txt",
                   .help = "the WordPiece vocabulary (vocab.txt: one token per line, id = line number)"},
    [TOK_MAX_LEN] = {"--max-len", "N", FLAG_POS_INT, "no limit", "128",
                     .help = "at most N ids a record (with --special: the whole [CLS] ... [SEP], truncated as BERT's "
                             "inputs are)"},
    [TOK_SPECIAL] = {"--special", NULL, FLAG_BOOL, "off: the text's ids only", NULL,
                     .help = "print [CLS] ids [SEP], the model's input without its padding"},
    [TOK_NO_LOWER_CASE] = {"--no-lower-case", NULL, FLAG_BOOL, "off: uncased", NULL,
                           .help = "a cased vocabulary: no lower-casing, no accent stripping"},
    [TOK_NULL] = {"--null", NULL, FLAG_BOOL, "off: one record a line", NULL,
                  .help = "records end at NUL bytes (texts with line breaks, as find -print0 and xargs -0)"},
};

static int cmd_tokenize(const flag_args *p) {
  const flag_value *v = p->v;
  if (!v[TOK_VOCAB].given)
    return flags_usage_error(p->prog, "e.g. --vocab ../shared/data/bert/bert-base-uncased-vocab.txt",
                             "--vocab FILE is required");
  tokenize_args a = {.vocab = v[TOK_VOCAB].raw, .lower = !v[TOK_NO_LOWER_CASE].given,
                     .max_len = v[TOK_MAX_LEN].given ? (int)v[TOK_MAX_LEN].i : 0, .special = v[TOK_SPECIAL].given,
                     .nul = v[TOK_NULL].given};
  if (a.special && a.max_len && a.max_len < 3)
    return flags_usage_error(p->prog, "e.g. --max-len 128", "--max-len %d leaves no room for [CLS] and [SEP]",
                             a.max_len);
  dt_status st = tokenize_stream(&a, stdin, stdout);
  if (st != DT_OK) return runtime_error(st, "check --vocab and that the input is UTF-8 text");
  return 0;
}

/* ---- version, help --------------------------------------------------------------- */
static int cmd_version(const flag_args *p) {
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
  fprintf(f, "\nexit status: 0 success, 1 runtime failure, 2 usage error, 130/143 interrupted by SIGINT/SIGTERM\n");
}

static int cmd_help(const flag_args *p) {
  if (p->n_pos == 0) {
    print_main_usage(stdout);
    return 0;
  }
  char name[64];
  snprintf(name, sizeof name, "%s%s%s", p->pos[0], p->n_pos > 1 ? " " : "", p->n_pos > 1 ? p->pos[1] : "");
  const command *c = find_command(name);
  if (!c && p->n_pos == 1 && strcmp(name, "bench") == 0) c = find_command("bench allreduce");
  if (!c) return flags_usage_error(p->prog, "run 'dtrain help' for the list", "unknown command '%s'", name);
  print_usage(c, stdout);
  return 0;
}

static const command commands[] = {
    {"train", "train a model from the zoo and write metrics and weights", "[flags]",
     "Trains a zoo model on a data source for the task its targets imply (classification,\n"
     "multilabel or regression), evaluating on the validation data after every epoch: --val-data,\n"
     "a --val-fraction of the training data, or the source's test split (none: no evaluation).\n"
     "Writes DIR/metrics.csv and DIR/metrics.jsonl (one row per epoch, flushed at once),\n"
     "DIR/config.json, DIR/report.html (after every epoch), and at the end DIR/summary.json\n"
     "and DIR/model.safetensors; with --save-every, snapshots in DIR/snapshots that\n"
     "--resume continues from bit for bit. Ctrl-C (or SIGTERM) stops at the next step, still\n"
     "writes metrics and weights (and a snapshot with --save-on-interrupt), and exits with 130\n"
     "(143); a second one ends at once.",
     train_flags, TRAIN_COUNT, 0, 0, cmd_train},
    {"eval", "evaluate saved weights on a dataset split", "--weights FILE [flags]",
     "Loads weights written by 'dtrain train' and reports the loss and the metrics of the data's\n"
     "task (top-1 and top-5 accuracy; ROC-AUC and accuracy; RMSE and MAE). Model, hidden widths,\n"
     "dataset, normalisation, image transform preset and the task's loss default to what the file's\n"
     "metadata records.",
     eval_flags, EVAL_COUNT, 0, 0, cmd_eval},
    {"recommend", "the top K movies a user has not rated, by mf or ncf weights trained on ratings",
     "--weights FILE --user ID [flags]",
     "Loads mf or ncf weights written by 'dtrain train' on MovieLens ratings, scores every movie they\n"
     "know for the user (the userId of ratings.csv, mapped through the weights' user_ids), leaves out\n"
     "the movies the user rated in the data (all of its ratings, whatever split training held out)\n"
     "and prints the best K: rank, movieId, predicted rating, title and genres (from movies.csv),\n"
     "equal ratings by lower movieId; --json prints one JSON object instead. The data directory\n"
     "defaults to the one the weights were trained on. Example:\n"
     "  dtrain recommend --weights runs/mf/model.safetensors --user 1 --top 10",
     recommend_flags, REC_COUNT, 0, 0, cmd_recommend},
    {"export", "write the weights of a snapshot (or weights file) alone, e.g. to share or evaluate", "SNAPSHOT OUT",
     "Reads a snapshot written by 'dtrain train --save-every' (or any weights file) and writes\n"
     "its model tensors only, under PyTorch state_dict names with the model's metadata, to OUT\n"
     "(atomically). Optimizer and trainer state are left out. With --format hf, OUT is a Hugging\n"
     "Face checkpoint directory (model.safetensors, config.json) that --init-from reads back.\n"
     "Examples:\n"
     "  dtrain export runs/exp1/snapshots/step-000001876.safetensors model.safetensors\n"
     "  dtrain export runs/exp1/model.safetensors runs/exp1/hf --format hf",
     export_flags, EXPORT_COUNT, 2, 2, cmd_export},
    {"models", "list the model zoo with parameter counts", "", "Lists the registered models.", NULL, 0, 0, 0,
     cmd_models},
    {"inspect", "show a safetensors file: metadata, tensors, statistics", "FILE",
     "Prints the metadata, then one line per tensor: name, dtype, shape and, for f32, min/max/mean.", NULL, 0, 1, 1,
     cmd_inspect},
    {"bench allreduce", "all-reduce benchmark, nccl-tests table (under dtrun, torchrun, mpirun or srun)", "[flags]",
     "Times all-reduce from -b to -e bytes (x -f per row), out of place and in place, on every\n"
     "rank of the job, and rank 0 prints the nccl-tests table: size, count, type, redop, root,\n"
     "time per call (the slowest rank's), algbw = bytes / time, busbw = algbw * 2(n-1)/n, and\n"
     "#wrong with --check, and last columns 'cpu' and 'cpu-in': the CPU seconds a rank's process\n"
     "spent per GB all-reduced out of place and in place (the mean over ranks; a spinning wait\n"
     "counts); then '# Avg bus bandwidth'. Example:\n"
     "  dtrun --standalone --nproc-per-node 2 -- dtrain bench allreduce -b 8 -e 64M -f 2 --check",
     bench_flags, BENCH_COUNT, 0, 0, cmd_bench_allreduce},
    {"bench scaling", "the same training with 1..N workers (ddp and dp): speedup and efficiency",
     "[flags] [-- TRAIN FLAGS]",
     "Trains the same job once with one worker (the baseline), then for 1..--max-workers workers\n"
     "as DDP processes under dtrun and as DataParallel threads, and prints for each: train and\n"
     "inference samples/s, speedup over one worker, scaling efficiency (speedup / workers) and,\n"
     "for ddp, the all-reduce time and the share of it hidden behind backward (from each step's least\n"
     "wait and all-reduce time over the ranks: a wait for a slower rank is not communication). For 2..N it also\n"
     "runs N single-worker jobs at once that never communicate (row 'indep', samples/s summed; each\n"
     "bound to the CPUs dtrun gives its N workers where it binds them, its figure on the progress line):\n"
     "what N workers can reach on this machine, the ceiling to read ddp's and dp's speedups against;\n"
     "a line '# against indep xN in the same round' gives ddp's and dp's samples/s over it, and a\n"
     "second line over N times the slowest of those jobs: workers that step together run at the\n"
     "slowest one's pace, so what that line lacks of 1 is dtrain's own cost, give or take the\n"
     "drift between the runs (a round whose indep ran slow reads above 1).\n"
     "Every round ends with a second single run: a line '# against single in the same round' gives\n"
     "each other row's samples/s over the mean of the round's two single runs, so that a drift of the\n"
     "machine's speed through the round cancels out of these speedups.\n"
     "With --reps N every run is repeated in N rounds (each round single, then ddp, dp and indep for\n"
     "each worker count, then single again), so a machine's drift hits every row alike; each row shows\n"
     "its median round, and the lines against indep and single each round's ratio and their median.\n"
     "Lines '# CPU speed' before and after the table give each CPU's f32 GEMM GFLOP/s (one thread\n"
     "pinned to each in turn; beyond 16 CPUs the slowest, median and fastest): where a CPU is\n"
     "slower, for a while or for good, 'single' depends on where it ran and workers that step\n"
     "together run at the slowest CPU's pace; the line says so.\n"
     "Flags after -- go to every run's 'dtrain train' (text data, a validation split, an optimizer).\n"
     "Examples:\n"
     "  dtrain bench scaling --model fashioncnn --max-workers 2 --reps 3\n"
     "  dtrain bench scaling --model bert-mini --data tweets.csv -- --vocab vocab.txt \\\n"
     "      --text-column tweet --label-column class --max-len 64",
     scaling_flags, SCALING_COUNT, 0, FLAGS_STOP, cmd_bench_scaling},
    {"tokenize", "BERT WordPiece ids of each line of stdin", "--vocab FILE [flags]",
     "Reads text on stdin and prints, for every line (or NUL-separated record with --null), its\n"
     "token ids, space-separated: Hugging Face's BertTokenizer (uncased unless --no-lower-case:\n"
     "text cleanup, CJK split, lower-casing and accent stripping, punctuation split, greedy\n"
     "longest-match WordPiece with ## continuations, [UNK] for words over 100 characters).\n"
     "--special adds [CLS] and [SEP] as the models' inputs have them. Example:\n"
     "  echo 'Hello, world!' | dtrain tokenize --vocab bert-base-uncased-vocab.txt --special",
     tokenize_flags, TOK_COUNT, 0, 0, cmd_tokenize},
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
  /* A write past a file-size limit (ulimit -f) then fails with EFBIG through the error path a full disk takes
   * (temporary removed, previous file intact) instead of killing the process; dtrun's workers inherit it. */
  signal(SIGXFSZ, SIG_IGN);
  dt_keep_freed_memory(); /* for every command: evaluation and the benchmarks allocate as training does */
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
      return flags_usage_error("dtrain", "e.g. 'dtrain bench allreduce' or 'dtrain bench scaling'",
                               "bench needs a benchmark: allreduce or scaling");
    snprintf(two, sizeof two, "bench %.40s", argv[2]);
    name = two;
    used = 3;
    if (!find_command(name))
      return flags_usage_error("dtrain", "the benchmarks are: allreduce, scaling", "unknown benchmark '%s'", argv[2]);
  }
  const command *c = find_command(name);
  if (!c)
    return flags_usage_error("dtrain", "run 'dtrain help' for the list of commands", "unknown command '%s'", name);
  /* Every command that multiplies (eval, recommend, bench scaling as well as train) reads DT_SGEMM and, under
   * --amp, DT_AMP_KERNELS: a bad value is refused up front, never taken as the default. */
  dt_status st = DT_OK;
  if (strcmp(name, "help") && strcmp(name, "version") && (st = dt_sgemm_check()) == DT_OK) st = dt_amp_kernels_check();
  if (st != DT_OK) return runtime_error(st, NULL);
  return run_command(c, argc - used, argv + used);
}

/* Datasets (a registry of sources: IDX, synthetic, ...; samples as named fields) and a prefetching batch loader. */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"
#include "dtrain/task.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX ----------------------------------------------------------------- */
/* A parsed IDX array (http://yann.lecun.com/exdb/mnist/ format): big-endian
 * header, element type code, up to 4 dims (more is corrupt here). */
typedef struct dt_idx {
  uint8_t type;        /* 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64 */
  int ndim;
  uint32_t dims[4];
  size_t count;        /* elements */
  void *data;          /* count elements, converted to host byte order; owned */
} dt_idx;
/* Parses an in-memory IDX image (already decompressed). Validates magic, type,
 * rank, every dimension (> 0, product without overflow, at most `max_bytes` of
 * data) and that the length matches exactly. DT_CORRUPT naming what is wrong. */
dt_status dt_idx_parse(const uint8_t *buf, size_t len, size_t max_bytes, dt_idx *out);
/* Reads `path`, gunzipping when it is gzip data (by magic, not by name), with
 * at most DT_IDX_MAX_BYTES of array data. Every error names the file. */
dt_status dt_idx_load(const char *path, dt_idx *out);
/* Same with an explicit bound on the array data: larger files, and gzip data
 * that inflates beyond header + max_bytes (a gzip bomb), are DT_CORRUPT before
 * more than that much memory is used. */
dt_status dt_idx_load_max(const char *path, size_t max_bytes, dt_idx *out);
/* The bound dt_idx_load uses (1 GiB: Fashion-MNIST's largest file is 47 MB). */
#define DT_IDX_MAX_BYTES ((size_t)1 << 30)
void dt_idx_free(dt_idx *idx);

/* ---- datasets ------------------------------------------------------------ */
typedef enum dt_split { DT_SPLIT_TRAIN, DT_SPLIT_TEST } dt_split;

typedef struct dt_normalize {
  int enabled;   /* 0: x / 255 in [0, 1]; 1: also (x - mean) / std */
  float mean, std;
} dt_normalize;

typedef struct dt_kv dt_kv; /* dtrain/checkpoint.h */

/* ---- samples: named fields ------------------------------------------------- */
/* A sample is a few named fields: f32 tensors of any shape ("x": an image
 * (C, H, W) or a feature vector), integer index fields (i32/i64: token ids,
 * an attention mask, user and item ids) and the target ("target": one i32
 * class index, or K f32 values or 0/1 labels). A batch holds each field as
 * (batch, shape...) contiguous. */
#define DT_MAX_FIELDS 8
#define DT_FIELD_MAX_DIMS 4
typedef struct dt_field {
  char name[24];
  dt_dtype dtype;  /* DT_F32, DT_I32 or DT_I64 */
  int ndim;        /* per-sample dimensions; 0: one value */
  int64_t shape[DT_FIELD_MAX_DIMS];
} dt_field;
size_t dt_field_numel(const dt_field *f); /* elements per sample */
size_t dt_field_bytes(const dt_field *f); /* bytes per sample */

/* What a dataset holds: its fields (inputs first, "target" last) and the task
 * its target implies (class indices: classification over `outputs` classes;
 * K 0/1 labels: multilabel; K values: regression). */
typedef struct dt_data_info {
  dt_task_kind task;
  int outputs;       /* classes, labels or regression targets */
  int n_fields;
  dt_field field[DT_MAX_FIELDS];
  int input, target; /* indices of the "x" field (-1: none) and of the target */
  int has_test;      /* the source has an official test split */
  int class_ordered; /* samples are numbered class by class (image folders): a first-N subset is a few classes */
  double val_fraction; /* > 0: without a test split, hold out this fraction by default (MovieLens: 0.1) */
  /* An integer "x" (i32, shape (K,)): column k holds indices in [0, index_size[k]) (users, items, tokens). */
  int n_index;
  int64_t index_size[DT_MAX_FIELDS];
  char name[64];     /* "idx", "synthetic", "movielens", ... */
  int decodes;       /* fetch decodes or augments images (CPU work per sample: the loader's auto worker count) */
  int64_t skipped;   /* image sources with skip_bad_images: unreadable files left out; text with skip_bad_rows: rows */
} dt_data_info;
/* The index of the field called name, or -1. */
int dt_data_field(const dt_data_info *info, const char *name);

typedef struct dt_dataset dt_dataset;
/* `source` picks a data source from the registry (see dt_dataset_sources):
 * "synthetic:N[,in=20,out=1,task=regression,seed=S]" (generated), a known
 * name ("fashion-mnist", "mnist": IDX files under DT_DATA_DIR, default
 * /usr/share/datasets) or a directory of {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
 * DT_NOT_FOUND names the missing file and how to get it; DT_USAGE
 * names the malformed part of a spec; a source without the split asked for is
 * DT_NOT_FOUND saying so. `norm` applies to image sources (may be NULL). */
dt_status dt_dataset_load(const char *source, dt_split split, const dt_normalize *norm, dt_dataset **out);
/* How a source holds data out for testing, where it can (MovieLens). */
typedef enum dt_holdout {
  DT_HOLDOUT_DEFAULT,   /* the source's own test split, if any (none for MovieLens: the trainer's random split) */
  DT_HOLDOUT_LAST,      /* leave-last-out: each user's latest rating (by timestamp) is the test split */
} dt_holdout;
/* Augmentation presets of RGB image sources (torchvision's transforms; see dt_transform in src/data/transform.h).
 * NONE: ToTensor only (every image of the source must have one size). CIFAR: train RandomCrop(32, padding=4)
 * + RandomHorizontalFlip, test nothing; IMAGENET: train RandomResizedCrop(224) + RandomHorizontalFlip, test
 * Resize(256) + CenterCrop(224). A preset normalises with its data set's mean and std unless norm is enabled. */
typedef enum dt_augment { DT_AUGMENT_NONE, DT_AUGMENT_CIFAR, DT_AUGMENT_IMAGENET } dt_augment;
const char *dt_augment_name(dt_augment a);
/* The text source (rows of a CSV/TSV file tokenised for BERT; see docs/architecture.md): which columns hold
 * the text and the labels, and how to tokenise. Strings are borrowed. Give label_columns or label_column. */
typedef struct dt_text_options {
  const char *vocab;            /* WordPiece vocab.txt (required) */
  const char *text_column;      /* NULL: the column named "text" */
  const char *text_pair_column; /* NULL: one text per row; else BERT's sentence pair (token types 0 and 1) */
  const char *label_columns;    /* "a,b,c": multilabel, each a number, label = value >= 0.5 (one column: binary) */
  const char *label_column;     /* one column of classes: integers 0..K-1, or names (sorted, name -> index) */
  const char *classes;          /* label_column's classes in index order as one CSV record; NULL: from the data */
  int max_len;                  /* token positions per row, [CLS] and [SEP] included; 0: 128 */
  int keep_case;                /* 0: lower-case and strip accents (uncased BERT); 1: keep (cased vocabularies) */
  int skip_bad_rows;            /* leave out malformed rows (counted in info.skipped) instead of failing */
} dt_text_options;
#define DT_TEXT_MAX_LEN_DEFAULT 128
typedef struct dt_data_options {
  const dt_normalize *norm; /* image sources (may be NULL) */
  dt_holdout holdout;
  uint64_t seed;            /* seeded choices of the source (the sampled negatives of a ranking, augmentation) */
  dt_augment augment;       /* RGB image sources */
  int skip_bad_images;      /* image folders: leave out files that do not decode (counted in info.skipped) */
  int cache_images;         /* image folders: decode every image once into memory (uint8 HWC) at open */
  dt_text_options text;     /* the text source */
} dt_data_options;
/* dt_dataset_load with options (NULL: defaults). A source that cannot hold out
 * as asked is DT_USAGE naming it. */
dt_status dt_dataset_load_opts(const char *source, dt_split split, const dt_data_options *opt, dt_dataset **out);
/* Calls fn(name, doc) for every registered source. */
void dt_dataset_sources(void (*fn)(const char *name, const char *doc, void *user), void *user);
void dt_dataset_free(dt_dataset *ds);
int64_t dt_dataset_size(const dt_dataset *ds);
const dt_data_info *dt_dataset_info(const dt_dataset *ds);
/* Writes samples idx[0..n) into the batch buffers, one per field in info
 * order, each (n, field shape...). Thread-safe for distinct buffers. Epoch 0;
 * a source whose fetch can fail (an image that does not decode) logs the error
 * and leaves zeros: use dt_dataset_fetch_epoch to see it. */
void dt_dataset_fetch(const dt_dataset *ds, const int64_t *idx, int n, void *const *fields);
/* The same for epoch `epoch`: random augmentation of sample i comes from Philox
 * (seed, epoch, i), so it is the same on every run, rank count and thread.
 * DT_CORRUPT naming the file when an image does not decode. */
dt_status dt_dataset_fetch_epoch(const dt_dataset *ds, int64_t epoch, const int64_t *idx, int n, void *const *fields);
/* A view of samples idx[0..n) of parent (copied; parent must outlive it). */
dt_status dt_dataset_subset(dt_dataset *parent, const int64_t *idx, int64_t n, dt_dataset **out);
/* Splits ds into a training and a validation view: a permutation of Philox(seed)
 * puts round(fraction * n) samples in *val, the rest (in index order) in *train.
 * fraction in (0, 1); both parts non-empty, else DT_INVALID_ARGUMENT. */
dt_status dt_dataset_split(dt_dataset *ds, double fraction, uint64_t seed, dt_dataset **train, dt_dataset **val);

/* Original ids of index column col (MovieLens: userId for 0, movieId for 1):
 * (*ids)[i] is the id of dense index i, n = index_size[col]. DT_NOT_FOUND when
 * the source keeps none. Subsets answer for their parent. */
dt_status dt_dataset_index_ids(const dt_dataset *ds, int col, const int64_t **ids, int64_t *n);
/* Text about dense index i of column col (MovieLens items: part 0 the title,
 * part 1 the genres "Adventure|Comedy"), or NULL when the source has none. */
const char *dt_dataset_index_text(const dt_dataset *ds, int col, int64_t i, int part);
/* Key/value pairs the source wants saved with trained weights (MovieLens:
 * "user_ids", "item_ids" as comma lists, so predictions speak original ids).
 * Returns the count; *kv points into the dataset. */
int dt_dataset_meta(const dt_dataset *ds, const dt_kv **kv);
/* A ranking protocol over a test split (MovieLens leave-last-out): for each of
 * n queries (users), `per` candidate items, the held-out item first and then
 * per - 1 sampled items the user never rated (uniform without replacement,
 * Philox(seed, user)), all as indices of column 1; user[q] is the query's
 * column-0 index. DT_NOT_FOUND when the split has none. */
typedef struct dt_ranking {
  int64_t n;
  int per;
  const int32_t *user;  /* (n) */
  const int32_t *items; /* (n, per): the positive first */
} dt_ranking;
dt_status dt_dataset_ranking(const dt_dataset *ds, dt_ranking *out);

/* Every sample of ds in index order, fetched in chunks: fn(user, fields, n)
 * gets n samples' fields (info order); a status other than DT_OK stops the scan
 * and is returned. */
typedef dt_status (*dt_scan_fn)(void *user, void *const *fields, int n);
dt_status dt_dataset_scan(const dt_dataset *ds, dt_scan_fn fn, void *user);
/* The mean of an f32 target over every sample and value (0 for no samples);
 * DT_INVALID_ARGUMENT for class-index targets. */
dt_status dt_dataset_target_mean(const dt_dataset *ds, double *mean);

/* Image sources: (C, H, W) of the "x" field (1 for missing dims). */
void dt_dataset_sample_shape(const dt_dataset *ds, int64_t shape[3]);
/* Classes of a classification dataset (0 for other tasks). */
int dt_dataset_classes(const dt_dataset *ds);
/* Classification sources: samples idx[0..n) as floats into x (n, C, H, W) and labels into y (n). */
void dt_dataset_gather(const dt_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y);

/* ---- loader --------------------------------------------------------------- */
/* Which samples an epoch visits, in order: fills out[0..*n) (out has room for
 * dataset size entries, or as the sampler documents). Lets distributed
 * samplers plug in without touching the loader. */
typedef dt_status (*dt_sampler_fn)(void *user, int64_t epoch, int64_t *out, int64_t *n);

typedef struct dt_loader_config {
  int batch_size;      /* >= 1 */
  int shuffle;         /* permute per epoch with Philox(seed, epoch) */
  int drop_last;       /* drop a last partial batch */
  uint64_t seed;
  int prefetch;        /* batches prepared ahead on the background thread (>= 1; 0: DT_PREFETCH) */
  dt_sampler_fn sampler; /* optional: overrides shuffle */
  void *sampler_user;
  int64_t sampler_capacity; /* entries the sampler may write; 0: dataset size */
  int workers;         /* threads making batches (0: one, or for image decoding one per 8 cores, 1 to 4;
                        * DT_LOADER_INLINE: none, see dt_loader_next_unfilled) */
} dt_loader_config;
#define DT_LOADER_MAX_WORKERS 64
#define DT_LOADER_INLINE (-1)

typedef struct dt_batch {
  const void *field[DT_MAX_FIELDS]; /* each (size, field shape...), in dt_data_info order */
  const void *x;       /* the input field "x" (size, shape...): f32 values or i32 indices; or NULL */
  const void *target;  /* the target field */
  const int32_t *y;    /* the target as class indices (classification), else NULL */
  int size;            /* 0 at the end of the epoch */
  int64_t index;       /* batch number within the epoch */
} dt_batch;

/* `workers` background threads per loader (one by default) make whole batches
 * into a ring of prefetch + 1 buffers (one held by the caller, up to `prefetch`
 * ready ahead; at least 2 per worker when prefetch is automatic), handed out in
 * order. They are outside the compute thread budget (dt_set_threads) but sleep
 * once the ring is full, so they cost cores only while making batches. A fetch
 * that fails (a corrupt image) stops the epoch: dt_loader_next returns its
 * error. With a sampler, it is
 * called on the caller's thread: once by dt_loader_new (epoch 0, to size the
 * epoch) and once by every dt_loader_start_epoch. */
typedef struct dt_loader dt_loader;
dt_status dt_loader_new(const dt_dataset *ds, const dt_loader_config *cfg, dt_loader **out);
void dt_loader_free(dt_loader *l);
/* Starts epoch `epoch` (its order is a pure function of seed and epoch); the
 * background thread begins preparing batches at once. May be called at any
 * time: batches of an unfinished epoch are discarded. */
dt_status dt_loader_start_epoch(dt_loader *l, int64_t epoch);
/* The next batch of the epoch; b->size == 0 once the epoch is done. The
 * buffers stay valid until the next call (of dt_loader_next,
 * dt_loader_start_epoch or dt_loader_free). DT_INVALID_ARGUMENT before the
 * first dt_loader_start_epoch. */
dt_status dt_loader_next(dt_loader *l, dt_batch *b);
/* A loader with workers = DT_LOADER_INLINE runs no thread: dt_loader_next makes each batch in the calling thread
 * (PyTorch's DataLoader with num_workers=0), where a machine's cores are all training and a loader thread would
 * only take turns with them. dt_loader_next_unfilled hands the next batch out with its samples not yet fetched
 * (a threaded loader's ready-made one as dt_loader_next): the caller fetches them with dt_loader_fill, samples
 * [lo, lo + n) of that batch at their places in its buffers, from any threads on disjoint ranges (a DataParallel
 * worker its own slice: the fetch is parallel and the samples land in the cache of the core that trains on them),
 * before anything reads them and before the loader's next call. dt_loader_fill of a batch already made is DT_OK
 * and does nothing; a failed fetch returns the source's error (the file that did not decode) and leaves the loader
 * as it was: the caller stops (the trainer fails the run), the epoch does not. */
dt_status dt_loader_next_unfilled(dt_loader *l, dt_batch *b);
dt_status dt_loader_fill(const dt_loader *l, int lo, int n);
int64_t dt_loader_batches_per_epoch(const dt_loader *l);
int64_t dt_loader_samples_per_epoch(const dt_loader *l);
/* Seconds the caller has spent blocked in dt_loader_next waiting for data (inline: making it; not the time of
 * dt_loader_fill). */
double dt_loader_wait_seconds(const dt_loader *l);


/* ---- distributed sampler -------------------------------------------------- */
/* PyTorch's torch.utils.data.DistributedSampler (1.13), index for index: for
 * the same (n, replicas, rank, seed, epoch, shuffle, drop_last) this yields
 * exactly the list `DistributedSampler(ds, replicas, rank, shuffle, seed,
 * drop_last)` yields after set_epoch(epoch), so a dtrain run and a PyTorch run
 * visit the same samples on every rank.
 *
 * The epoch order: shuffle ? torch.randperm(n) from a torch.Generator seeded
 * with seed + epoch (mod 2^64; PyTorch's mt19937 keeps the low 32 bits only)
 * : 0, 1, ..., n-1. Then, without drop_last, it is padded to
 * total_size = ceil(n / replicas) * replicas by repeating it from the head
 * (padded[p] = order[p % n]); with drop_last it is cut to
 * floor(n / replicas) * replicas. Rank r takes positions r, r + replicas,
 * r + 2 replicas, ... of that list: num_samples = total_size / replicas each.
 *
 * Padding (exact distributed evaluation): positions >= n are repeats. Position
 * p goes to rank p % replicas, so the padding is at most one sample per rank,
 * always the rank's LAST one, on the ranks r >= n % replicas when n % replicas
 * != 0 (so on every rank r >= n when 0 < n < replicas), whatever the epoch or
 * shuffle. dt_dist_sampler_num_real(s) is how many of a rank's samples come
 * first and are real: ceil((n - rank) / replicas) (0 when rank >= n), all of
 * them with drop_last. Counting only the first num_real samples of every rank
 * counts each of the n samples exactly once; the num_real sum to n over ranks
 * (to floor(n / replicas) * replicas with drop_last). */
typedef struct dt_dist_sampler dt_dist_sampler;
/* n >= 0 samples, replicas >= 1, 0 <= rank < replicas, else
 * DT_INVALID_ARGUMENT naming the value. Holds an n-entry scratch permutation
 * (8n bytes) when shuffling. One sampler object is not thread-safe. */
dt_status dt_dist_sampler_new(int64_t n, int replicas, int rank, uint64_t seed, int shuffle, int drop_last,
                              dt_dist_sampler **out);
void dt_dist_sampler_free(dt_dist_sampler *s);
/* Samples per rank per epoch (len(sampler) in PyTorch). */
int64_t dt_dist_sampler_num_samples(const dt_dist_sampler *s);
/* Of those, how many are real (not padding repeats): they are the first ones. */
int64_t dt_dist_sampler_num_real(const dt_dist_sampler *s);
/* This rank's indices for `epoch` (set_epoch(epoch) then iter): writes
 * out[0..num_samples). A pure function of the arguments and epoch. */
dt_status dt_dist_sampler_indices(dt_dist_sampler *s, int64_t epoch, int64_t *out);
/* dt_sampler_fn adapter for dt_loader: user is the dt_dist_sampler; writes
 * num_samples indices. Set sampler_capacity to dt_dist_sampler_num_samples(s)
 * (the dataset size, the default, is also enough: num_samples <= n). */
dt_status dt_dist_sampler_fn(void *user, int64_t epoch, int64_t *out, int64_t *n);

#ifdef __cplusplus
}
#endif
#endif

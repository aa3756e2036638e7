/* Data source "imagefolder": torchvision's ImageFolder (DIR/<class>/.../<image>), decoded on fetch or cached in memory. */
#include <assert.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/impl.h"
#include "data/image.h"
#include "data/source.h"

#define MAX_DEPTH 32          /* directory levels below a class (os.walk follows links; a loop stops here) */
#define MAX_CLASSES 100000
#define MAX_NAMED_BAD 5       /* skipped files named in the log */

/* torchvision.datasets.folder.IMG_EXTENSIONS, compared case-insensitively */
static const char *const extensions[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};

typedef struct folder {
  int64_t n;
  char *paths;          /* every image path, NUL-terminated, back to back */
  int64_t *path_at;     /* (n) offsets into paths */
  int32_t *labels;      /* (n) class indices */
  int n_classes;
  dt_transform tf;
  uint64_t seed;
  int oh, ow;           /* the x field's (H, W) */
  int same_size;        /* no geometric transform: every image is oh x ow (checked at open) */
  /* --cache-images: every image decoded, (h, w, 3) at cache + cache_at[i] */
  uint8_t *cache;
  int64_t *cache_at;
  int32_t *cache_hw;    /* (n, 2) */
} folder;

/* ---- the file list ------------------------------------------------------------------------ */

typedef struct list {
  char *buf;
  int64_t len, cap;
  int64_t *at;
  int32_t *label;
  int64_t n, at_cap, label_cap;
} list;

static dt_status list_add(list *l, const char *path, int32_t label) {
  const int64_t k = (int64_t)strlen(path) + 1;
  DT_CHECK(dt_grow_array((void **)&l->buf, &l->cap, l->len, l->len + k, 1 << 16, 1, "image paths"));
  DT_CHECK(dt_grow_array((void **)&l->at, &l->at_cap, l->n, l->n + 1, 1024, sizeof *l->at, "image list"));
  DT_CHECK(dt_grow_array((void **)&l->label, &l->label_cap, l->n, l->n + 1, 1024, sizeof *l->label, "image list"));
  memcpy(l->buf + l->len, path, (size_t)k);
  l->at[l->n] = l->len;
  l->label[l->n++] = label;
  l->len += k;
  return DT_OK;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_image_name(const char *name) {
  const size_t n = strlen(name);
  for (size_t e = 0; e < sizeof extensions / sizeof extensions[0]; e++) {
    const size_t k = strlen(extensions[e]);
    if (n >= k && strcasecmp(name + n - k, extensions[e]) == 0) return 1;
  }
  return 0;
}

/* Entries of dir (no . and ..), sorted, split into directories (following links) and files. The caller frees
 * every name and both arrays. */
static dt_status read_dir(const char *dir, char ***dirs, int *n_dirs, char ***files, int *n_files) {
  DIR *d = opendir(dir);
  if (!d) return dt_error(DT_NOT_FOUND, "%s: cannot read the directory", dir);
  dt_status st = DT_OK;
  int64_t cap_d = 0, cap_f = 0;
  *dirs = *files = NULL;
  *n_dirs = *n_files = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL && st == DT_OK;) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[4096];
    struct stat sb;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) {
      st = dt_error(DT_INVALID_ARGUMENT, "%s/%s: path too long", dir, e->d_name);
      break;
    }
    if (stat(path, &sb) != 0) continue; /* a dangling link: os.walk lists it as a file, which then fails to open */
    const int is_d = S_ISDIR(sb.st_mode);
    char ***arr = is_d ? dirs : files;
    int *cnt = is_d ? n_dirs : n_files;
    int64_t *cap = is_d ? &cap_d : &cap_f;
    char *name = strdup(e->d_name);
    if (!name || (st = dt_grow_array((void **)arr, cap, *cnt, *cnt + 1, 64, sizeof(char *), "directory")) != DT_OK) {
      free(name);
      if (st == DT_OK) st = dt_error(DT_OUT_OF_MEMORY, "reading %s", dir);
      break;
    }
    (*arr)[(*cnt)++] = name;
  }
  closedir(d);
  if (*dirs) qsort(*dirs, (size_t)*n_dirs, sizeof(char *), by_name);
  if (*files) qsort(*files, (size_t)*n_files, sizeof(char *), by_name);
  return st;
}

static void free_names(char **names, int n) {
  for (int i = 0; i < n; i++) free(names[i]);
  dt_free(names);
}

/* Every directory under root (root first, recursively, following links), as os.walk lists them. */
static dt_status walk_dirs(const char *root, int depth, char ***out, int64_t *n, int64_t *cap) {
  if (depth > MAX_DEPTH) return dt_error(DT_UNSUPPORTED, "%s: more than %d directory levels (a link loop?)", root, MAX_DEPTH);
  DT_CHECK(dt_grow_array((void **)out, cap, *n, *n + 1, 16, sizeof(char *), "directories"));
  if (!((*out)[*n] = strdup(root))) return dt_error(DT_OUT_OF_MEMORY, "walking %s", root);
  (*n)++;
  char **dirs, **files;
  int nd, nf;
  DT_CHECK(read_dir(root, &dirs, &nd, &files, &nf));
  dt_status st = DT_OK;
  for (int i = 0; i < nd && st == DT_OK; i++) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", root, dirs[i]) >= sizeof path)
      st = dt_error(DT_INVALID_ARGUMENT, "%s/%s: path too long", root, dirs[i]);
    else
      st = walk_dirs(path, depth + 1, out, n, cap);
  }
  free_names(dirs, nd);
  free_names(files, nf);
  return st;
}

/* make_dataset: for every class in index order, the images of sorted(os.walk(class dir)) with sorted names. */
static dt_status scan(const char *root, list *l, int *n_classes) {
  char **classes, **files;
  int nc, nf;
  DT_CHECK(read_dir(root, &classes, &nc, &files, &nf));
  free_names(files, nf);
  dt_status st = DT_OK;
  if (nc == 0) {
    st = dt_error(DT_NOT_FOUND, "%s: no class folder (an image folder holds one subdirectory per class, as "
                  "torchvision's ImageFolder reads)", root);
    goto done;
  }
  if (nc > MAX_CLASSES) {
    st = dt_error(DT_UNSUPPORTED, "%s: %d class folders; at most %d", root, nc, MAX_CLASSES);
    goto done;
  }
  char empty[512] = "";
  int n_empty = 0;
  for (int c = 0; c < nc && st == DT_OK; c++) {
    char cdir[4096];
    if ((size_t)snprintf(cdir, sizeof cdir, "%s/%s", root, classes[c]) >= sizeof cdir) {
      st = dt_error(DT_INVALID_ARGUMENT, "%s/%s: path too long", root, classes[c]);
      break;
    }
    char **walked = NULL;
    int64_t nw = 0, cap = 0;
    st = walk_dirs(cdir, 0, &walked, &nw, &cap);
    if (walked) qsort(walked, (size_t)nw, sizeof(char *), by_name);
    const int64_t before = l->n;
    for (int64_t w = 0; w < nw && st == DT_OK; w++) {
      char **sub, **names;
      int ns, nn;
      if ((st = read_dir(walked[w], &sub, &ns, &names, &nn)) != DT_OK) break;
      for (int k = 0; k < nn && st == DT_OK; k++) {
        if (!is_image_name(names[k])) continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", walked[w], names[k]) >= sizeof path)
          st = dt_error(DT_INVALID_ARGUMENT, "%s/%s: path too long", walked[w], names[k]);
        else
          st = list_add(l, path, c);
      }
      free_names(sub, ns);
      free_names(names, nn);
    }
    for (int64_t w = 0; w < nw; w++) free(walked[w]);
    dt_free(walked);
    if (st == DT_OK && l->n == before) {
      if (n_empty < 8) {
        size_t at = strlen(empty);
        snprintf(empty + at, sizeof empty - at, "%s%s", n_empty ? ", " : "", classes[c]);
      }
      n_empty++;
    }
  }
  if (st == DT_OK && n_empty)
    st = dt_error(DT_NOT_FOUND, "%s: %d of %d class folders hold no image (%s%s); images end in .jpg, .jpeg, .png "
                  "(also .ppm .bmp .pgm .tif .tiff .webp, which dtrain does not decode), any case", root, n_empty, nc,
                  empty, n_empty > 8 ? ", ..." : "");
  *n_classes = nc;
done:
  free_names(classes, nc);
  return st;
}

/* ---- checks and the cache at open ----------------------------------------------------------- */

static const char *path_of(const folder *f, int64_t i) { return f->paths + f->path_at[i]; }

/* Reads image i: its size, and with px its pixels. */
static dt_status load(const folder *f, int64_t i, dt_bytes *file, dt_bytes *px, int *w, int *h) {
  size_t len = 0;
  DT_CHECK(dt_file_slurp(path_of(f, i), file, &len));
  return px ? dt_image_decode(file->p, len, path_of(f, i), px, w, h) : dt_image_probe(file->p, len, path_of(f, i), w, h);
}

/* One pass over every image on the compute threads: sizes (hw, (n, 2)) from headers, or from whole decodes when
 * full (which finds truncated files too). bad[i] = 1 for an image that failed. */
static void check_all(const folder *f, int full, int32_t *hw, uint8_t *bad) {
#pragma omp parallel
  {
    dt_bytes file = {0}, px = {0};
#pragma omp for schedule(dynamic, 32)
    for (int64_t i = 0; i < f->n; i++) {
      int w = 0, h = 0;
      bad[i] = load(f, i, &file, full ? &px : NULL, &w, &h) != DT_OK;
      hw[2 * i] = h, hw[2 * i + 1] = w;
    }
    dt_free(file.p);
    dt_free(px.p);
  }
}

/* Drops the images marked bad (keeping order), naming the first few in one warning. */
static void drop_bad(folder *f, const char *root, uint8_t *bad, int32_t *hw, int64_t *skipped) {
  int64_t k = 0, nb = 0;
  char named[1024] = "";
  for (int64_t i = 0; i < f->n; i++) {
    if (bad[i]) {
      if (nb < MAX_NAMED_BAD) {
        size_t at = strlen(named);
        snprintf(named + at, sizeof named - at, "%s%s", nb ? ", " : "", path_of(f, i));
      }
      nb++;
      continue;
    }
    f->path_at[k] = f->path_at[i], f->labels[k] = f->labels[i];
    hw[2 * k] = hw[2 * i], hw[2 * k + 1] = hw[2 * i + 1];
    k++;
  }
  if (nb)
    DT_LOG_WARN("data", "%s: --skip-bad-images left out %lld of %lld files that do not decode: %s%s", root,
                (long long)nb, (long long)f->n, named, nb > MAX_NAMED_BAD ? ", ..." : "");
  f->n = k;
  *skipped = nb;
}

/* The cache bound: DT_IMAGE_CACHE_MB, or half of this machine's memory. */
static dt_status cache_bound(size_t *bytes) {
  long mb = 0;
  DT_CHECK(dt_tunable_int("DT_IMAGE_CACHE_MB", &mb));
  if (mb < 0) return dt_error(DT_INVALID_ARGUMENT, "DT_IMAGE_CACHE_MB=%ld must be >= 0 (0: half the memory)", mb);
  if (mb > 0) *bytes = (size_t)mb << 20;
  else *bytes = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE) / 2;
  return DT_OK;
}

static dt_status fill_cache(folder *f, const char *root, const int32_t *hw) {
  size_t total = 0, bound = 0;
  for (int64_t i = 0; i < f->n; i++) total += (size_t)hw[2 * i] * (size_t)hw[2 * i + 1] * 3;
  DT_CHECK(cache_bound(&bound));
  if (total > bound)
    return dt_error(DT_UNSUPPORTED, "%s: --cache-images needs %.1f MB for %lld decoded images; the bound is %.1f MB "
                    "(DT_IMAGE_CACHE_MB, default half the memory): drop --cache-images to decode on every fetch",
                    root, total / 1e6, (long long)f->n, bound / 1e6);
  DT_CHECK(dt_alloc_array_huge(total ? total : 1, 1, "image cache", (void **)&f->cache));
  DT_CHECK(dt_alloc_array((size_t)f->n, sizeof *f->cache_at, "image cache", (void **)&f->cache_at));
  DT_CHECK(dt_alloc_array((size_t)f->n, 2 * sizeof *f->cache_hw, "image cache", (void **)&f->cache_hw));
  size_t at = 0;
  for (int64_t i = 0; i < f->n; i++) {
    f->cache_at[i] = (int64_t)at;
    f->cache_hw[2 * i] = hw[2 * i], f->cache_hw[2 * i + 1] = hw[2 * i + 1];
    at += (size_t)hw[2 * i] * (size_t)hw[2 * i + 1] * 3;
  }
  int64_t first_bad = -1;
#pragma omp parallel
  {
    dt_bytes file = {0}, px = {0};
#pragma omp for schedule(dynamic, 32)
    for (int64_t i = 0; i < f->n; i++) {
      int w = 0, h = 0;
      const size_t bytes = (size_t)hw[2 * i] * (size_t)hw[2 * i + 1] * 3;
      if (load(f, i, &file, &px, &w, &h) != DT_OK || h != hw[2 * i] || w != hw[2 * i + 1]) {
#pragma omp critical
        if (first_bad < 0 || i < first_bad) first_bad = i;
        continue;
      }
      memcpy(f->cache + f->cache_at[i], px.p, bytes);
    }
    dt_free(file.p);
    dt_free(px.p);
  }
  if (first_bad >= 0) { /* again on this thread, for its message */
    dt_bytes file = {0}, px = {0};
    int w = 0, h = 0;
    dt_status st = load(f, first_bad, &file, &px, &w, &h);
    dt_free(file.p), dt_free(px.p);
    return st != DT_OK ? st : dt_error(DT_CORRUPT, "%s changed while it was read (%dx%d, then %dx%d)",
                                       path_of(f, first_bad), hw[2 * first_bad + 1], hw[2 * first_bad], w, h);
  }
  DT_LOG_WARN("data", "%s: --cache-images holds %lld decoded images in %.1f MB", root, (long long)f->n, total / 1e6);
  return DT_OK;
}

/* ---- the source ----------------------------------------------------------------------------- */

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A directory with train/, or one with subdirectories and no IDX files. */
static int claims(const char *spec) {
  char p[4096];
  if (!is_dir(spec)) return 0;
  if ((size_t)snprintf(p, sizeof p, "%s/train", spec) < sizeof p && is_dir(p)) return 1;
  DIR *d = opendir(spec);
  if (!d) return 0;
  int subdirs = 0, idx = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    if (strstr(e->d_name, "-ubyte")) idx = 1;
    if ((size_t)snprintf(p, sizeof p, "%s/%s", spec, e->d_name) < sizeof p && is_dir(p)) subdirs = 1;
  }
  closedir(d);
  return subdirs && !idx;
}

/* The folder of the split: DIR/train and DIR/test (or DIR/val), or DIR itself as the only (training) split. */
static dt_status split_dir(const char *spec, dt_split split, char *dir, size_t len, int *has_test) {
  char p[4096];
  snprintf(p, sizeof p, "%s/train", spec);
  const int layout = is_dir(p);
  char test[4096] = "";
  if (layout) {
    snprintf(test, sizeof test, "%s/test", spec);
    if (!is_dir(test)) snprintf(test, sizeof test, "%s/val", spec);
    if (!is_dir(test)) test[0] = '\0';
  }
  *has_test = test[0] != '\0';
  if (split == DT_SPLIT_TRAIN) {
    snprintf(dir, len, "%s", layout ? p : spec);
    return DT_OK;
  }
  if (!*has_test)
    return dt_error(DT_NOT_FOUND, layout ? "%s: no test/ or val/ folder beside train/ (or give --val-data DIR or "
                    "--val-fraction F)" : "%s: a folder of classes has no test split (give --val-data DIR or "
                    "--val-fraction F)", spec);
  snprintf(dir, len, "%s", test);
  return DT_OK;
}

static void free_folder(void *state) {
  folder *f = state;
  if (!f) return;
  dt_free(f->paths);
  dt_free(f->path_at);
  dt_free(f->labels);
  dt_free(f->cache);
  dt_free(f->cache_at);
  dt_free(f->cache_hw);
  dt_free(f);
}

static dt_status open_folder(const char *spec, dt_split split, const dt_data_options *opt, void **state,
                             dt_data_info *info, int64_t *n_out) {
  char root[4096];
  int has_test = 0;
  DT_CHECK(split_dir(spec, split, root, sizeof root, &has_test));
  folder *f = NULL;
  list l = {0};
  int32_t *hw = NULL;
  uint8_t *bad = NULL;
  int64_t skipped = 0;
  DT_CHECK(dt_alloc(sizeof *f, (void **)&f));
  dt_status st = scan(root, &l, &f->n_classes);
  f->paths = l.buf, f->path_at = l.at, f->labels = l.label, f->n = l.n;
  if (st != DT_OK) goto fail;
  dt_transform_preset(opt->augment, split, opt->norm, &f->tf);
  f->seed = opt->seed;
  f->same_size = f->tf.geom == DT_GEOM_NONE;
  const double t0 = dt_time_now();
  if (f->same_size || opt->skip_bad_images || opt->cache_images) {
    DT_CHECK_GOTO(dt_alloc_array((size_t)f->n, 2 * sizeof *hw, "image sizes", (void **)&hw), st, fail);
    DT_CHECK_GOTO(dt_alloc_array((size_t)f->n, 1, "image checks", (void **)&bad), st, fail);
    check_all(f, opt->skip_bad_images, hw, bad);
    if (opt->skip_bad_images) {
      drop_bad(f, root, bad, hw, &skipped);
      if (f->n == 0) {
        st = dt_error(DT_CORRUPT, "%s: no image decodes (all %lld skipped)", root, (long long)skipped);
        goto fail;
      }
    } else {
      for (int64_t i = 0; i < f->n; i++)
        if (bad[i]) { /* again on this thread, for its message */
          dt_bytes file = {0};
          int w, h;
          st = load(f, i, &file, NULL, &w, &h);
          dt_free(file.p);
          if (st == DT_OK) st = dt_error(DT_CORRUPT, "%s: changed while it was read", path_of(f, i));
          char detail[1024];
          snprintf(detail, sizeof detail, "%s", dt_last_error());
          st = dt_error(st, "%s (--skip-bad-images leaves such files out)", detail);
          goto fail;
        }
    }
  }
  if (f->same_size) {
    for (int64_t i = 1; i < f->n; i++)
      if (hw[2 * i] != hw[0] || hw[2 * i + 1] != hw[1]) {
        st = dt_error(DT_USAGE, "%s: images of different sizes (%s is %dx%d, %s is %dx%d) need a transform to one "
                      "size: give --augment imagenet (or cifar), or resize the images", root, path_of(f, 0), hw[1],
                      hw[0], path_of(f, i), hw[2 * i + 1], hw[2 * i]);
        goto fail;
      }
    f->oh = hw[0], f->ow = hw[1];
  } else {
    f->oh = f->ow = f->tf.size;
  }
  if (opt->cache_images) DT_CHECK_GOTO(fill_cache(f, root, hw), st, fail);
  DT_LOG_INFO("data", "%s: %lld images in %d classes, x (3, %d, %d), --augment %s (checked in %.2f s)", root,
              (long long)f->n, f->n_classes, f->oh, f->ow, dt_augment_name(opt->augment), dt_time_now() - t0);
  const int64_t shape[3] = {3, f->oh, f->ow};
  dt_data_add_field(info, "x", DT_F32, 3, shape);
  dt_data_add_field(info, "target", DT_I32, 0, NULL);
  info->task = DT_TASK_CLASSIFICATION;
  info->outputs = f->n_classes;
  info->has_test = has_test;
  info->class_ordered = 1; /* ImageFolder's order: class by class */
  info->decodes = 1;
  info->skipped = skipped;
  *n_out = f->n;
  *state = f;
  dt_free(hw);
  dt_free(bad);
  return DT_OK;
fail:
  dt_free(hw);
  dt_free(bad);
  free_folder(f);
  return st;
}

static dt_status fetch_folder(const void *state, int64_t epoch, const int64_t *idx, int n, void *const *fields) {
  const folder *f = state;
  float *x = fields[0];
  int32_t *y = fields[1];
  const size_t per = (size_t)3 * f->oh * f->ow;
  dt_bytes file = {0}, px = {0}, tmp = {0};
  dt_status st = DT_OK;
  for (int i = 0; i < n && st == DT_OK; i++) {
    const int64_t s = idx[i];
    assert(s >= 0 && s < f->n);
    const uint8_t *img;
    int w, h;
    if (f->cache) {
      img = f->cache + f->cache_at[s], h = f->cache_hw[2 * s], w = f->cache_hw[2 * s + 1];
    } else {
      if ((st = load(f, s, &file, &px, &w, &h)) != DT_OK) break;
      img = px.p;
      if (f->same_size && (h != f->oh || w != f->ow)) {
        st = dt_error(DT_CORRUPT, "%s: %dx%d now; it was %dx%d when the data was opened", path_of(f, s), w, h, f->ow,
                      f->oh);
        break;
      }
    }
    dt_rng r;
    dt_transform_rng(&r, f->seed, epoch, s);
    if ((st = dt_transform_apply(&f->tf, img, h, w, &r, &tmp, x + (size_t)i * per)) != DT_OK)
      dt_error_prefix(st, "%s", path_of(f, s));
    y[i] = f->labels[s];
  }
  dt_free(file.p);
  dt_free(px.p);
  dt_free(tmp.p);
  return st;
}

const dt_source_ops dt_source_imagefolder = {
    .name = "imagefolder",
    .doc = "a directory of class folders of JPEG/PNG images (torchvision's ImageFolder), or one holding train/ and "
           "test/ (or val/) such folders",
    .claims = claims,
    .open = open_folder,
    .fetch_epoch = fetch_folder,
    .free = free_folder,
};

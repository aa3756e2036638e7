/* Data source "cifar": the CIFAR-10 and CIFAR-100 binary releases, images in memory as uint8 HWC, transformed on fetch. */
#include <assert.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/impl.h"
#include "data/image.h"
#include "data/source.h"

#define SIDE 32
#define PIXELS (SIDE * SIDE)
#define MAX_BATCHES 5
#define MAX_BYTES ((size_t)1 << 31) /* per split: CIFAR's training set is 150 MB */

typedef struct cifar {
  int64_t n;
  uint8_t *images; /* (n, 32, 32, 3) */
  int32_t *labels; /* (n) */
  dt_transform tf;
  uint64_t seed;
  int oh, ow;
} cifar;

static int is_file(const char *dir, const char *name) {
  char p[4096];
  struct stat st;
  return (size_t)snprintf(p, sizeof p, "%s/%s", dir, name) < sizeof p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The directory holding the .bin files: spec itself, or its cifar-10-batches-bin/ or cifar-100-binary/. */
static int find_dir(const char *spec, char *dir, size_t len, int *hundred) {
  static const char *const subs[] = {"", "/cifar-10-batches-bin", "/cifar-100-binary"};
  for (size_t k = 0; k < 3; k++) {
    if ((size_t)snprintf(dir, len, "%s%s", spec, subs[k]) >= len || !is_dir(dir)) continue;
    if (is_file(dir, "data_batch_1.bin") || is_file(dir, "test_batch.bin")) {
      *hundred = 0;
      return 1;
    }
    if (is_file(dir, "train.bin") || is_file(dir, "test.bin")) {
      *hundred = 1;
      return 1;
    }
  }
  return 0;
}

static int claims(const char *spec) {
  char dir[4096];
  int hundred;
  return find_dir(spec, dir, sizeof dir, &hundred);
}

/* Appends the records of one file to c: CIFAR-10 (label, 3072 pixels CHW), CIFAR-100 (coarse, fine, pixels). */
static dt_status read_file(const char *dir, const char *name, int hundred, cifar *c, size_t *cap) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = NULL;
  size_t len = 0;
  DT_CHECK(dt_file_open_regular(path, &f, &len));
  const size_t rec = (size_t)(hundred ? 2 : 1) + 3 * PIXELS, classes = hundred ? 100 : 10;
  dt_status st = DT_OK;
  uint8_t *buf = NULL;
  if (len == 0 || len % rec) {
    st = dt_error(DT_CORRUPT, "%s: %zu bytes is not a whole number of %zu-byte CIFAR-%d records", path, len, rec,
                  hundred ? 100 : 10);
    goto done;
  }
  const size_t n = len / rec, have = (size_t)c->n;
  if ((have + n) * 3 * PIXELS > MAX_BYTES) {
    st = dt_error(DT_CORRUPT, "%s: more than %zu bytes of CIFAR images in one split", path, MAX_BYTES);
    goto done;
  }
  if (have + n > *cap) { /* grow both arrays */
    size_t ncap = *cap ? *cap : 10000;
    while (ncap < have + n) ncap *= 2;
    uint8_t *img = NULL;
    int32_t *lab = NULL;
    DT_CHECK_GOTO(dt_alloc_array_huge(ncap, 3 * PIXELS, "CIFAR images", (void **)&img), st, done);
    if ((st = dt_alloc_array(ncap, sizeof *lab, "CIFAR labels", (void **)&lab)) != DT_OK) {
      dt_free(img);
      goto done;
    }
    if (have) memcpy(img, c->images, have * 3 * PIXELS), memcpy(lab, c->labels, have * sizeof *lab);
    dt_free(c->images), dt_free(c->labels);
    c->images = img, c->labels = lab, *cap = ncap;
  }
  DT_CHECK_GOTO(dt_alloc(len, (void **)&buf), st, done);
  DT_CHECK_GOTO(dt_file_read_exact(f, path, buf, len), st, done);
  for (size_t r = 0; r < n; r++) {
    const uint8_t *p = buf + r * rec;
    const uint8_t label = p[hundred ? 1 : 0], coarse = p[0];
    if (label >= classes || (hundred && coarse >= 20)) {
      st = dt_error(DT_CORRUPT, "%s: record %zu has %s label %d; CIFAR-%d's are 0..%zu", path, r,
                    hundred && coarse >= 20 ? "coarse" : hundred ? "fine" : "a", hundred && coarse >= 20 ? coarse : label,
                    hundred ? 100 : 10, hundred && coarse >= 20 ? (size_t)19 : classes - 1);
      goto done;
    }
    c->labels[have + r] = label;
    const uint8_t *chw = p + rec - 3 * PIXELS;
    uint8_t *hwc = c->images + (have + r) * 3 * PIXELS;
    for (int k = 0; k < PIXELS; k++)
      hwc[3 * k] = chw[k], hwc[3 * k + 1] = chw[PIXELS + k], hwc[3 * k + 2] = chw[2 * PIXELS + k];
  }
  c->n += (int64_t)n;
done:
  dt_free(buf);
  fclose(f);
  return st;
}

static void free_cifar(void *state) {
  cifar *c = state;
  if (!c) return;
  dt_free(c->images);
  dt_free(c->labels);
  dt_free(c);
}

static dt_status open_cifar(const char *spec, dt_split split, const dt_data_options *opt, void **state,
                            dt_data_info *info, int64_t *n_out) {
  char dir[4096];
  int hundred = 0;
  if (!find_dir(spec, dir, sizeof dir, &hundred)) return dt_error(DT_NOT_FOUND, "%s: no CIFAR binary files", spec);
  if (opt->skip_bad_images || opt->cache_images)
    DT_LOG_INFO("data", "%s: CIFAR binaries are held in memory whole; --skip-bad-images and --cache-images do nothing",
                spec);
  cifar *c = NULL;
  DT_CHECK(dt_alloc(sizeof *c, (void **)&c));
  size_t cap = 0;
  dt_status st = DT_OK;
  int files = 0;
  if (hundred) {
    const char *name = split == DT_SPLIT_TRAIN ? "train.bin" : "test.bin";
    if (!is_file(dir, name)) {
      st = dt_error(DT_NOT_FOUND, "%s: no %s (CIFAR-100 has train.bin and test.bin)", dir, name);
      goto fail;
    }
    DT_CHECK_GOTO(read_file(dir, name, 1, c, &cap), st, fail);
    files = 1;
  } else if (split == DT_SPLIT_TEST) {
    if (!is_file(dir, "test_batch.bin")) {
      st = dt_error(DT_NOT_FOUND, "%s: no test_batch.bin (CIFAR-10's test split)", dir);
      goto fail;
    }
    DT_CHECK_GOTO(read_file(dir, "test_batch.bin", 0, c, &cap), st, fail);
    files = 1;
  } else {
    /* data_batch_1.bin .. data_batch_5.bin: those present from 1 on, none missing in between */
    for (int b = 1; b <= MAX_BATCHES; b++) {
      char name[32];
      snprintf(name, sizeof name, "data_batch_%d.bin", b);
      if (!is_file(dir, name)) {
        for (int later = b + 1; later <= MAX_BATCHES; later++) {
          char next[32];
          snprintf(next, sizeof next, "data_batch_%d.bin", later);
          if (is_file(dir, next)) {
            st = dt_error(DT_NOT_FOUND, "%s: %s is missing but %s is there", dir, name, next);
            goto fail;
          }
        }
        break;
      }
      DT_CHECK_GOTO(read_file(dir, name, 0, c, &cap), st, fail);
      files++;
    }
    if (!files) {
      st = dt_error(DT_NOT_FOUND, "%s: no data_batch_1.bin (CIFAR-10's training split)", dir);
      goto fail;
    }
  }
  dt_transform_preset(opt->augment, split, opt->norm, &c->tf);
  c->seed = opt->seed;
  DT_CHECK_GOTO(dt_transform_out_size(&c->tf, SIDE, SIDE, &c->oh, &c->ow), st, fail);
  DT_LOG_INFO("data", "%s %s: %lld CIFAR-%d images from %d file%s, --augment %s", dir,
              split == DT_SPLIT_TRAIN ? "train" : "test", (long long)c->n, hundred ? 100 : 10, files,
              files == 1 ? "" : "s", dt_augment_name(opt->augment));
  const int64_t shape[3] = {3, c->oh, c->ow};
  dt_data_add_field(info, "x", DT_F32, 3, shape);
  dt_data_add_field(info, "target", DT_I32, 0, NULL);
  info->task = DT_TASK_CLASSIFICATION;
  info->outputs = hundred ? 100 : 10;
  info->has_test = hundred ? is_file(dir, "test.bin") : is_file(dir, "test_batch.bin");
  info->decodes = c->tf.geom != DT_GEOM_NONE;
  *n_out = c->n;
  *state = c;
  return DT_OK;
fail:
  free_cifar(c);
  return st;
}

static dt_status fetch_cifar(const void *state, int64_t epoch, const int64_t *idx, int n, void *const *fields) {
  const cifar *c = state;
  float *x = fields[0];
  int32_t *y = fields[1];
  const size_t per = (size_t)3 * c->oh * c->ow;
  dt_bytes tmp = {0};
  dt_status st = DT_OK;
  for (int i = 0; i < n && st == DT_OK; i++) {
    const int64_t s = idx[i];
    assert(s >= 0 && s < c->n);
    dt_rng r;
    dt_transform_rng(&r, c->seed, epoch, s);
    st = dt_transform_apply(&c->tf, c->images + (size_t)s * 3 * PIXELS, SIDE, SIDE, &r, &tmp, x + (size_t)i * per);
    y[i] = c->labels[s];
  }
  dt_free(tmp.p);
  return st;
}

const dt_source_ops dt_source_cifar = {
    .name = "cifar",
    .doc = "a directory of CIFAR-10 (data_batch_1..5.bin, test_batch.bin) or CIFAR-100 (train.bin, test.bin) binaries",
    .claims = claims,
    .open = open_cifar,
    .fetch_epoch = fetch_cifar,
    .free = free_cifar,
};

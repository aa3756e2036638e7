/* The image input pipeline alone: read + decode + augment + ToTensor/Normalize through the loader, images/s and CPU time.
 *
 *   images_pipeline DIR AUGMENT SPLIT WORKERS BATCH [MAX_IMAGES]
 *
 * Prints one line: images, seconds, images/s, CPU seconds (user + sys, loader threads included), and images per
 * CPU second (what one core sustains). bench/images_vs_torchvision.py drives it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "dtrain/dtrain.h"

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

static dt_status limit_prefix(void *user, int64_t epoch, int64_t *out, int64_t *n) {
  const int64_t *max = user;
  (void)epoch;
  for (int64_t i = 0; i < *max; i++) out[i] = i;
  *n = *max;
  return DT_OK;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s DIR none|cifar|imagenet train|test WORKERS BATCH [MAX_IMAGES]\n", argv[0]);
    return 2;
  }
  dt_data_options opt = {.seed = 0};
  opt.augment = strcmp(argv[2], "cifar") == 0 ? DT_AUGMENT_CIFAR
                : strcmp(argv[2], "imagenet") == 0 ? DT_AUGMENT_IMAGENET : DT_AUGMENT_NONE;
  const dt_split split = strcmp(argv[3], "test") == 0 ? DT_SPLIT_TEST : DT_SPLIT_TRAIN;
  dt_dataset *ds = NULL;
  dt_loader *l = NULL;
  const double c0 = cpu_seconds(), t0 = dt_time_now();
  if (dt_dataset_load_opts(argv[1], split, &opt, &ds) != DT_OK) {
    fprintf(stderr, "%s\n", dt_last_error());
    return 1;
  }
  const double open_s = dt_time_now() - t0, open_cpu = cpu_seconds() - c0;
  int64_t max = argc > 6 ? atoll(argv[6]) : dt_dataset_size(ds);
  if (max > dt_dataset_size(ds)) max = dt_dataset_size(ds);
  dt_loader_config lc = {.batch_size = atoi(argv[5]), .shuffle = 0, .workers = atoi(argv[4]),
                         .sampler = limit_prefix, .sampler_user = &max, .sampler_capacity = max};
  if (dt_loader_new(ds, &lc, &l) != DT_OK || dt_loader_start_epoch(l, 0) != DT_OK) {
    fprintf(stderr, "%s\n", dt_last_error());
    return 1;
  }
  const double c1 = cpu_seconds(), t1 = dt_time_now();
  int64_t images = 0;
  double checksum = 0;
  for (;;) {
    dt_batch b;
    if (dt_loader_next(l, &b) != DT_OK) {
      fprintf(stderr, "%s\n", dt_last_error());
      return 1;
    }
    if (!b.size) break;
    images += b.size;
    checksum += ((const float *)b.x)[0];
  }
  const double secs = dt_time_now() - t1, cpu = cpu_seconds() - c1;
  printf("images %lld seconds %.3f images_per_s %.1f cpu_seconds %.3f images_per_cpu_s %.1f open_s %.3f "
         "open_cpu_s %.3f checksum %.3f\n",
         (long long)images, secs, images / secs, cpu, images / cpu, open_s, open_cpu, checksum);
  dt_loader_free(l);
  dt_dataset_free(ds);
  return 0;
}

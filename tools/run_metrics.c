/* What a bench scaling run left in its --out (run_metrics.h). */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_metrics.h"

double json_number(const char *text, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(text, pat);
  if (!p) return 0;
  return strtod(p + strlen(pat), NULL);
}

int read_after_warmup(const char *dir, int skip, double *train_sps, char *why, size_t why_cap) {
  char path[PATH_MAX + 32], line[16384]; /* an epoch's line: about 400 bytes, more with many metrics */
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(why, why_cap, "cannot read %s: %s", path, strerror(errno));
    return -1;
  }
  double inverse = 0;
  int epochs = 0, counted = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "\"train_samples_per_s\":")) continue;
    epochs++;
    if (json_number(line, "epoch") <= skip) continue;
    const double sps = json_number(line, "train_samples_per_s");
    if (!(sps > 0)) {
      snprintf(why, why_cap, "%s: epoch %.0f has train_samples_per_s %g", path, json_number(line, "epoch"), sps);
      fclose(f);
      return -1;
    }
    inverse += 1.0 / sps;
    counted++;
  }
  fclose(f);
  if (!counted) {
    snprintf(why, why_cap, "%s has %d epoch(s): none after the %d --skip-epochs leaves out", path, epochs, skip);
    return -1;
  }
  *train_sps = counted / inverse;
  return 0;
}

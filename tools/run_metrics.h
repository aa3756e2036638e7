/* Reading what one `dtrain train` run of bench scaling left in its --out: numbers from its flat JSON files, and
 * train samples/s over the epochs after a warm-up (metrics.jsonl). */
#ifndef DT_TOOLS_RUN_METRICS_H
#define DT_TOOLS_RUN_METRICS_H

#include <stddef.h>

/* The number after "key": in a flat JSON object; 0 when absent. */
double json_number(const char *text, const char *key);
/* Train samples/s over the epochs after the first skip (>= 1) of dir/metrics.jsonl, one line per epoch. Every epoch
 * of a run takes the same samples, so the epochs' rates combine harmonically: their count over the sum of 1 / rate
 * (not weighted by epoch_seconds, whose three decimals read 0 for an epoch of a small model). 0 and *train_sps, or
 * -1 with why: the file unreadable, no epoch after skip, or a later epoch's rate not positive (named). */
int read_after_warmup(const char *dir, int skip, double *train_sps, char *why, size_t why_cap);

#endif

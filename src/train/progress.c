/* Progress display: an updating bar on terminals, a few plain lines otherwise, and the epoch line. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/impl.h"
#include "train/train_impl.h"

#define BAR_WIDTH 24
#define BAR_REDRAW_S 0.1 /* at most ten redraws a second */

void dt_progress_init(dt_progress *p, FILE *f, dt_progress_mode mode, int epochs) {
  memset(p, 0, sizeof *p);
  p->epochs = epochs;
  if (!f) return;
  p->f = f;
  p->steps_off = mode == DT_PROGRESS_NONE;
  p->bar = mode == DT_PROGRESS_BAR || (mode == DT_PROGRESS_AUTO && isatty(fileno(f)));
}

void dt_progress_epoch_start(dt_progress *p, int epoch, int64_t steps) {
  p->epoch = epoch;
  p->steps = steps;
  p->next_tenth = 1;
  p->t0 = dt_time_now();
  p->last_draw = 0;
}

static void fmt_eta(double s, char *buf, size_t len) {
  if (s < 0 || s > 1e7) s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

void dt_progress_step(dt_progress *p, int64_t step, double loss, int64_t samples) {
  if (!p->f || p->steps_off || p->steps <= 0) return;
  double now = dt_time_now(), el = now - p->t0;
  double rate = el > 0 ? (double)samples / el : 0;
  double eta = step > 0 ? el / (double)step * (double)(p->steps - step) : 0;
  char etas[32];
  fmt_eta(eta, etas, sizeof etas);
  if (p->bar) {
    if (step < p->steps && now - p->last_draw < BAR_REDRAW_S) return;
    p->last_draw = now;
    char bar[BAR_WIDTH + 1];
    int fill = (int)((double)BAR_WIDTH * (double)step / (double)p->steps);
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    fprintf(p->f, "\repoch %d/%d [%s] %lld/%lld  loss %.4f  %.0f samples/s  ETA %s\033[K", p->epoch, p->epochs, bar,
            (long long)step, (long long)p->steps, loss, rate, etas);
    fflush(p->f);
    return;
  }
  /* Plain: one line per 10% of the epoch at most (none for the last 10%: the epoch line follows). */
  int tenth = (int)(10 * step / p->steps);
  if (tenth < p->next_tenth || tenth >= 10) return;
  p->next_tenth = tenth + 1;
  fprintf(p->f, "epoch %d/%d  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s\n", p->epoch, p->epochs,
          (long long)step, (long long)p->steps, loss, rate, etas);
  fflush(p->f);
}

/* " <brief> <value>" for each metric: fractions in %, others with 4 decimals. */
static size_t put_metrics(char *buf, size_t len, const dt_metric_desc *d, const double *v, int n) {
  size_t o = 0;
  for (int i = 0; i < n && o < len; i++) {
    int k = d[i].percent ? snprintf(buf + o, len - o, " %s %.2f%%", d[i].brief, 100 * v[i])
                         : snprintf(buf + o, len - o, " %s %.4f", d[i].brief, v[i]);
    if (k < 0) break;
    o += (size_t)k;
  }
  return o < len ? o : len - 1;
}

void dt_progress_format_epoch(const dt_epoch_metrics *m, const dt_metric_set *ms, int epochs, char *buf, size_t len) {
  if (!ms) ms = dt_metric_set_classification();
  size_t o = (size_t)snprintf(buf, len, "epoch %d/%d  train loss %.4f", m->epoch, epochs, m->train_loss);
  if (o < len) o += put_metrics(buf + o, len - o, ms->train, m->train_metric, ms->n_train_row);
  if (o < len && m->test_loss == m->test_loss) { /* no validation data: no test figures */
    o += (size_t)snprintf(buf + o, len - o, "  test loss %.4f", m->test_loss);
    if (o < len) o += put_metrics(buf + o, len - o, ms->eval, m->test_metric, ms->n_eval);
  }
  if (o < len) snprintf(buf + o, len - o, "  %.1fs  %.0f samples/s", m->epoch_seconds, m->train_samples_per_s);
}

void dt_progress_epoch_end(dt_progress *p, const dt_epoch_metrics *m) {
  if (!p->f) return;
  char line[512];
  dt_progress_format_epoch(m, p->metrics, p->epochs, line, sizeof line);
  fprintf(p->f, "%s%s\n", p->bar && !p->steps_off ? "\r\033[K" : "", line);
  fflush(p->f);
}

/* A rank this much slower than another is named: the noise of equal ranks on a quiet machine stays under it. */
#define UNEQUAL_RANKS 1.10

void dt_progress_rank_balance(const double *compute_s, size_t stride, int world, char *buf, size_t len) {
  if (len) buf[0] = '\0';
  if (world < 2) return;
  int slow = 0, fast = 0;
  for (int q = 1; q < world; q++) {
    if (compute_s[(size_t)q * stride] > compute_s[(size_t)slow * stride]) slow = q;
    if (compute_s[(size_t)q * stride] < compute_s[(size_t)fast * stride]) fast = q;
  }
  const double hi = compute_s[(size_t)slow * stride], lo = compute_s[(size_t)fast * stride];
  if (!(lo > 0) || hi < UNEQUAL_RANKS * lo) return;
  snprintf(buf, len,
           "rank %d computed %.2f s, rank %d %.2f s (+%.0f%%): every step waits for the slowest rank, the others "
           "count it as comm s; a slower or busier CPU (see 'dtrain bench scaling', its CPU speed lines) or more "
           "work on that rank (rank 0 also writes snapshots, metrics and the report within the epoch)",
           slow, hi, fast, lo, 100.0 * (hi / lo - 1.0));
}

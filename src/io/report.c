/* The run report: a self-contained HTML page with SVG charts drawn here, written atomically. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "dtrain/dtrain.h"
#include "io/json.h"
#include "io/report.h"

/* ---- text --------------------------------------------------------------- */

/* s[0..n) with the five characters that matter in HTML text and attribute
 * values replaced by entities; NUL bytes (possible in decoded JSON) dropped. */
static void put_escaped_n(dt_buf *b, const char *s, size_t n) {
  size_t run = 0; /* bytes copied verbatim in one append */
  for (size_t i = 0; i < n; i++) {
    const char *ent = NULL;
    switch (s[i]) {
      case '&': ent = "&amp;"; break;
      case '<': ent = "&lt;"; break;
      case '>': ent = "&gt;"; break;
      case '"': ent = "&quot;"; break;
      case '\'': ent = "&#39;"; break;
      case '\0': ent = ""; break;
      default: run++; continue;
    }
    dt_buf_append(b, s + i - run, run);
    run = 0;
    dt_buf_append(b, ent, strlen(ent));
  }
  dt_buf_append(b, s + n - run, run);
}

static void put_escaped(dt_buf *b, const char *s) { put_escaped_n(b, s, strlen(s)); }

static void put(dt_buf *b, const char *s) { dt_buf_append(b, s, strlen(s)); }

/* Unmeasured values (NaN, inf) read as a dash in tables. */
#define DASH "&#8211;"

static void put_num(dt_buf *b, double v, int decimals) {
  if (isfinite(v))
    dt_buf_printf(b, "%.*f", decimals, v);
  else
    put(b, DASH);
}

static void put_pct(dt_buf *b, double fraction) {
  if (isfinite(fraction))
    dt_buf_printf(b, "%.2f%%", 100.0 * fraction);
  else
    put(b, DASH);
}

/* A metric's value: a fraction in %, anything else with 4 decimals. */
static void put_metric(dt_buf *b, const dt_metric_desc *d, double v) {
  if (d->percent)
    put_pct(b, v);
  else
    put_num(b, v, 4);
}

/* Times are durations: a negative one is a clock glitch and counts as nothing. */
static double seconds_or_zero(double s) { return isfinite(s) && s > 0 ? s : 0.0; }

/* ---- axes --------------------------------------------------------------- */

/* A linear axis from lo to hi (hi > lo) with n_ticks ticks, at first,
 * first + step, ... (all within [lo, hi]). */
typedef struct axis {
  double lo, hi, step, first;
  int n_ticks;
} axis;

/* A "nice" step (1, 2 or 5 times a power of ten) near span / intervals. */
static double nice_step(double span, int intervals) {
  double raw = span / intervals, mag = pow(10, floor(log10(raw))), f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

/* An axis over [lo, hi]. A range that is empty, a single value or not finite
 * is widened first, so the mapping never divides by zero. Continuous axes are
 * rounded out to about five nice steps, so both ends carry labels; integer
 * axes (epochs) span exactly the data, with whole-number ticks inside. */
static axis nice_axis(double lo, double hi, int integer, int from_zero) {
  if (!isfinite(lo) || !isfinite(hi) || !isfinite(hi - lo) || lo > hi) lo = 0, hi = 1;
  if (from_zero && lo > 0) lo = 0;
  if (from_zero && hi < 0) hi = 0;
  double size = fmax(fabs(lo), fabs(hi));
  if (!(hi - lo > 1e-9 * size) || hi == lo) {
    double pad = integer ? 0.5 : (size > 0 ? 0.1 * size : 1.0);
    lo = (from_zero && lo >= 0) ? 0 : lo - pad;
    hi += pad;
  }
  axis a = {lo, hi, 0, 0, 0};
  if (integer) {
    a.step = fmax(1.0, nice_step(hi - lo, 10));
    a.first = ceil(lo / a.step) * a.step;
  } else {
    a.step = nice_step(hi - lo, 5);
    a.lo = a.first = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
  }
  a.n_ticks = (int)floor((a.hi - a.first) / a.step + 1e-9) + 1;
  return a;
}

static double axis_tick(const axis *a, int i) { return a->first + i * a->step; }

/* Tick i as a label: as many decimals as the step needs, large values in
 * thousands ("12k") so labels stay short. */
static void put_tick_label(dt_buf *b, const axis *a, int i) {
  double v = axis_tick(a, i), step = a->step;
  const char *suffix = "";
  if (fmax(fabs(a->lo), fabs(a->hi)) >= 1e4) v /= 1e3, step /= 1e3, suffix = "k";
  int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
  if (fabs(v) < 1e-9 * step) v = 0; /* no "-0" */
  dt_buf_printf(b, "%.*f%s", decimals, v, suffix);
}

/* ---- SVG pieces ------------------------------------------------------- */

/* Every chart is drawn in this viewBox (CSS scales it to the column). */
enum { CHART_W = 560, CHART_H = 320, MARGIN_L = 64, MARGIN_R = 24, MARGIN_T = 58, MARGIN_B = 48 };
/* Above this many points a series is a plain line; markers only on isolated points. */
enum { MAX_MARKED_POINTS = 60 };

static void svg_begin(dt_buf *b, int w, int h, const char *title) {
  dt_buf_printf(b, "<figure class=\"chart\"><svg viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"", w, h);
  put_escaped(b, title);
  dt_buf_printf(b, "\"><text class=\"title\" x=\"%d\" y=\"22\" text-anchor=\"middle\">", w / 2);
  put_escaped(b, title);
  put(b, "</text>\n");
}

static void svg_end(dt_buf *b) { put(b, "</svg></figure>\n"); }

static void svg_text(dt_buf *b, double x, double y, const char *anchor, const char *cls, const char *s) {
  dt_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s%s%s>", x, y, anchor, cls ? " class=\"" : "",
                cls ? cls : "", cls ? "\"" : "");
  put_escaped(b, s);
  put(b, "</text>\n");
}

/* Legend entries in one row under the title: a swatch then the name. Text
 * width is estimated (7 px a character at 12 px) since SVG cannot measure here. */
typedef struct legend_entry {
  const char *name, *color;
  int dashed, bar; /* bar: a filled square instead of a line sample */
} legend_entry;

static void svg_legend(dt_buf *b, const legend_entry *e, int n, double x, double y) {
  for (int i = 0; i < n; i++) {
    if (e[i].bar)
      dt_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>", x, y - 10, e[i].color);
    else
      dt_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>", x,
                    y - 4, x + 18, y - 4, e[i].color, e[i].dashed ? " stroke-dasharray=\"5 3\"" : "");
    double tx = x + (e[i].bar ? 16 : 22);
    svg_text(b, tx, y, "start", NULL, e[i].name);
    x = tx + 7.0 * (double)strlen(e[i].name) + 16;
  }
}

/* The plot frame: horizontal grid lines with y labels, x ticks with labels, axis titles. */
typedef struct frame {
  double x0, y0, w, h; /* plot area in viewBox units; y0 is its top */
  axis x, y;
} frame;

/* Where v lies on the axis, 0 at lo and 1 at hi. Values far outside (only
 * possible when the data's range overflowed and the axis fell back to [0, 1])
 * stop a little outside the plot instead of becoming infinite coordinates. */
static double axis_pos(const axis *a, double v) {
  double t = (v - a->lo) / (a->hi - a->lo);
  return !(t >= -0.1) ? -0.1 : !(t <= 1.1) ? 1.1 : t;
}

static double frame_px(const frame *f, double x) { return f->x0 + axis_pos(&f->x, x) * f->w; }
static double frame_py(const frame *f, double y) { return f->y0 + f->h - axis_pos(&f->y, y) * f->h; }

static void svg_frame(dt_buf *b, const frame *f, const char *x_label, const char *y_label, int y_grid) {
  double bottom = f->y0 + f->h;
  if (y_grid) {
    for (int i = 0; i < f->y.n_ticks; i++) {
      double py = frame_py(f, axis_tick(&f->y, i));
      dt_buf_printf(b, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", f->x0, py, f->x0 + f->w, py);
      dt_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", f->x0 - 6, py + 4);
      put_tick_label(b, &f->y, i);
      put(b, "</text>\n");
    }
    dt_buf_printf(b, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", f->x0, f->y0, f->x0, bottom);
  }
  for (int i = 0; i < f->x.n_ticks; i++) {
    double px = frame_px(f, axis_tick(&f->x, i));
    dt_buf_printf(b, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", px, bottom, px, bottom + 5);
    dt_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", px, bottom + 18);
    put_tick_label(b, &f->x, i);
    put(b, "</text>\n");
  }
  dt_buf_printf(b, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f->x0, bottom, f->x0 + f->w,
                bottom);
  svg_text(b, f->x0 + f->w / 2, bottom + 38, "middle", "label", x_label);
  if (y_label) {
    double cy = f->y0 + f->h / 2;
    dt_buf_printf(b, "<text class=\"label\" x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">",
                  cy, cy);
    put_escaped(b, y_label);
    put(b, "</text>\n");
  }
}

/* ---- line chart ---------------------------------------------------------- */

typedef struct series {
  const char *name, *color;
  int dashed;
  const double *x, *y; /* n points, x ascending; non-finite points are gaps */
  int n;
} series;

typedef struct line_chart_spec {
  const char *title, *x_label, *y_label;
  int x_integer;   /* whole-number x ticks (epochs) */
  int y_from_zero; /* the y axis starts at 0 (rates), instead of near the data (losses) */
} line_chart_spec;

static int point_ok(const series *s, int i) { return isfinite(s->x[i]) && isfinite(s->y[i]); }

static void line_chart(dt_buf *b, const line_chart_spec *spec, const series *s, int n_series) {
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  int any = 0;
  for (int k = 0; k < n_series; k++)
    for (int i = 0; i < s[k].n; i++) {
      if (isfinite(s[k].x[i])) xlo = fmin(xlo, s[k].x[i]), xhi = fmax(xhi, s[k].x[i]);
      if (!point_ok(&s[k], i)) continue;
      ylo = fmin(ylo, s[k].y[i]), yhi = fmax(yhi, s[k].y[i]);
      any = 1;
    }
  frame f = {MARGIN_L, MARGIN_T, CHART_W - MARGIN_L - MARGIN_R, CHART_H - MARGIN_T - MARGIN_B,
             nice_axis(xlo, xhi, spec->x_integer, 0), nice_axis(ylo, yhi, 0, spec->y_from_zero)};

  svg_begin(b, CHART_W, CHART_H, spec->title);
  legend_entry legend[8];
  int n_legend = n_series < 8 ? n_series : 8;
  for (int k = 0; k < n_legend; k++) legend[k] = (legend_entry){s[k].name, s[k].color, s[k].dashed, 0};
  svg_legend(b, legend, n_legend, MARGIN_L, 44);
  svg_frame(b, &f, spec->x_label, spec->y_label, 1);
  if (!any) svg_text(b, f.x0 + f.w / 2, f.y0 + f.h / 2, "middle", "label", "no data");

  for (int k = 0; k < n_series; k++) {
    const series *sk = &s[k];
    /* One path; a gap (non-finite point) starts a new subpath with M. A point
     * with no finite neighbour draws no line (it gets a marker below). */
    int started = 0;
    for (int i = 0; i < sk->n; i++) {
      int prev = i > 0 && point_ok(sk, i - 1), next = i + 1 < sk->n && point_ok(sk, i + 1);
      if (!point_ok(sk, i) || (!prev && !next)) continue;
      if (!started)
        dt_buf_printf(b, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s d=\"", sk->color,
                      sk->dashed ? " stroke-dasharray=\"6 4\"" : "");
      dt_buf_printf(b, "%s%c%.1f %.1f", started ? " " : "", prev ? 'L' : 'M', frame_px(&f, sk->x[i]), frame_py(&f, sk->y[i]));
      started = 1;
    }
    if (started) put(b, "\"/>\n");
    /* Markers show where the measurements are, and are the only trace of a
     * point with no finite neighbour (a single epoch). */
    for (int i = 0; i < sk->n; i++) {
      if (!point_ok(sk, i)) continue;
      int isolated = (i == 0 || !point_ok(sk, i - 1)) && (i == sk->n - 1 || !point_ok(sk, i + 1));
      if (sk->n > MAX_MARKED_POINTS && !isolated) continue;
      dt_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>", frame_px(&f, sk->x[i]),
                    frame_py(&f, sk->y[i]), sk->color);
      put_escaped(b, sk->name);
      dt_buf_printf(b, ": %.4g at %.4g</title></circle>\n", sk->y[i], sk->x[i]);
    }
  }
  svg_end(b);
}

/* ---- per-rank time split ------------------------------------------------- */

static const legend_entry rank_parts[3] = {
    {"compute", "#4e79a7", 0, 1}, {"data wait", "#f28e2b", 0, 1}, {"communication", "#59a14f", 0, 1}};

static void rank_chart(dt_buf *b, const dt_report_rank *ranks, int world) {
  /* Rows shrink for large worlds so the chart stays a reasonable height. */
  int row = world <= 16 ? 28 : 14, bar = row - (world <= 16 ? 10 : 4);
  int rows_h = world > 0 ? world * row : 40;
  int height = MARGIN_T + rows_h + MARGIN_B;
  double max_total = 0;
  for (int r = 0; r < world; r++)
    max_total = fmax(max_total, seconds_or_zero(ranks[r].compute_s) + seconds_or_zero(ranks[r].data_s) +
                                    seconds_or_zero(ranks[r].comm_s));
  /* The right margin holds each bar's total ("123.4 s"). */
  frame f = {MARGIN_L, MARGIN_T, CHART_W - MARGIN_L - 72, rows_h, nice_axis(0, max_total, 0, 1), {0, 1, 1, 0, 0}};

  svg_begin(b, CHART_W, height, "Time split per rank");
  svg_legend(b, rank_parts, 3, MARGIN_L, 44);
  for (int i = 0; i < f.x.n_ticks; i++) {
    double px = frame_px(&f, axis_tick(&f.x, i));
    dt_buf_printf(b, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", px, f.y0, px, f.y0 + f.h);
  }
  svg_frame(b, &f, "seconds of training", NULL, 0);
  if (world == 0) svg_text(b, f.x0 + f.w / 2, f.y0 + f.h / 2 + 4, "middle", "label", "no data");

  for (int r = 0; r < world; r++) {
    double part[3] = {seconds_or_zero(ranks[r].compute_s), seconds_or_zero(ranks[r].data_s),
                      seconds_or_zero(ranks[r].comm_s)};
    double total = part[0] + part[1] + part[2], x = 0, y = f.y0 + r * row + (row - bar) / 2.0;
    char label[32];
    snprintf(label, sizeof label, "rank %d", r);
    svg_text(b, f.x0 - 6, y + bar / 2.0 + 4, "end", NULL, label);
    for (int p = 0; p < 3; p++) {
      if (part[p] <= 0) continue;
      double px0 = frame_px(&f, x), px1 = frame_px(&f, x + part[p]);
      dt_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\">", px0, y, px1 - px0, bar,
                    rank_parts[p].color);
      dt_buf_printf(b, "<title>rank %d %s: %.3f s (%.1f%%)</title></rect>\n", r, rank_parts[p].name, part[p],
                    100 * part[p] / total);
      x += part[p];
    }
    dt_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%.1f s</text>\n", frame_px(&f, total) + 6, y + bar / 2.0 + 4, total);
  }
  svg_end(b);
}

/* ---- the charts from the report ------------------------------------------- */

static const char *const color_train = "#1f77b4", *const color_val = "#ff7f0e";

static const char *const colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};

static const dt_metric_set *metric_set_of(const dt_report *r) {
  return r->metrics ? r->metrics : dt_metric_set_classification();
}

/* One series per train-row and evaluation metric (fractions in %). */
static int metric_series(const dt_report *r, const double *ep, double *v, series *out, char labels[][48]) {
  const dt_metric_set *ms = metric_set_of(r);
  const int n = r->n_epochs;
  int k = 0, all_percent = 1;
  for (int split = 0; split < 2; split++) {
    const dt_metric_desc *d = split ? ms->eval : ms->train;
    for (int i = 0; i < (split ? ms->n_eval : ms->n_train_row); i++, k++) {
      double *y = v + (size_t)k * n;
      for (int e = 0; e < n; e++) {
        const dt_epoch_metrics *m = &r->epochs[e];
        const double x = split ? m->test_metric[i] : m->train_metric[i];
        y[e] = d[i].percent ? 100 * x : x;
      }
      all_percent &= d[i].percent;
      snprintf(labels[k], 48, "%s %s", split ? "val" : "train", d[i].label);
      out[k] = (series){labels[k], colors[k % 6], split && i > 0, ep, y, n};
    }
  }
  return all_percent ? k : -k;
}

/* Whether a rate (drawn in %) shares the metrics chart: regression's RMSE and MAE are not rates. */
static int any_percent(const dt_metric_set *ms) {
  for (int i = 0; i < ms->n_train_row; i++)
    if (ms->train[i].percent) return 1;
  for (int i = 0; i < ms->n_eval; i++)
    if (ms->eval[i].percent) return 1;
  return 0;
}

static dt_status epoch_charts(dt_buf *b, const dt_report *r) {
  int n = r->n_epochs;
  const int rows = 3 + 2 * DT_MAX_METRICS;
  double *v = NULL; /* (rows, n): epoch, train loss, val loss, the metrics */
  DT_CHECK(dt_alloc_array((size_t)(n > 0 ? n : 1) * rows, sizeof *v, "report epoch series", (void **)&v));
  double *ep = v, *tl = v + n, *vl = v + 2 * n;
  for (int i = 0; i < n; i++) {
    const dt_epoch_metrics *m = &r->epochs[i];
    ep[i] = m->epoch;
    tl[i] = m->train_loss, vl[i] = m->test_loss;
  }
  series loss[2] = {{"train", color_train, 0, ep, tl, n}, {"val", color_val, 0, ep, vl, n}};
  line_chart(b, &(line_chart_spec){"Loss per epoch", "epoch", metric_set_of(r)->loss_label, 1, 0}, loss, 2);
  series ms[2 * DT_MAX_METRICS];
  char labels[2 * DT_MAX_METRICS][48];
  int k = metric_series(r, ep, v + 3 * (size_t)n, ms, labels);
  const char *y_mixed = "value (accuracy in %)";
  if (k > 0)
    line_chart(b, &(line_chart_spec){"Accuracy per epoch", "epoch", "accuracy (%)", 1, 0}, ms, k);
  else
    line_chart(b, &(line_chart_spec){"Metrics per epoch", "epoch", any_percent(metric_set_of(r)) ? y_mixed : "value", 1, 0},
               ms, -k);
  dt_free(v);
  return DT_OK;
}

static dt_status throughput_chart(dt_buf *b, const dt_report *r) {
  int n = r->n_throughput;
  double *v = NULL; /* (2, n): seconds, samples/s */
  DT_CHECK(dt_alloc_array((size_t)(n > 0 ? n : 1) * 2, sizeof *v, "report throughput series", (void **)&v));
  for (int i = 0; i < n; i++) v[i] = r->throughput[i].t_s, v[n + i] = r->throughput[i].samples_per_s;
  series s = {"training samples/s", color_train, 0, v, v + n, n};
  line_chart(b, &(line_chart_spec){"Training throughput over time", "seconds since start", "samples/s", 0, 1}, &s, 1);
  dt_free(v);
  return DT_OK;
}

/* ---- tables --------------------------------------------------------------- */

static void epoch_table(dt_buf *b, const dt_report *r) {
  put(b, "<h2>Epochs</h2>\n");
  if (r->n_epochs == 0) {
    put(b, "<p>No epoch finished.</p>\n");
    return;
  }
  const dt_metric_set *ms = metric_set_of(r);
  put(b, "<table class=\"num\"><thead><tr><th>epoch</th><th>step</th><th>lr</th><th>train loss</th>");
  for (int i = 0; i < ms->n_train_row; i++) put(b, "<th>train "), put_escaped(b, ms->train[i].label), put(b, "</th>");
  put(b, "<th>val loss</th>");
  for (int i = 0; i < ms->n_eval; i++) put(b, "<th>val "), put_escaped(b, ms->eval[i].label), put(b, "</th>");
  put(b, "<th>train s</th><th>samples/s</th><th>compute s</th><th>data wait s</th><th>comm s</th><th>eval s</th>"
         "</tr></thead><tbody>\n");
  for (int i = 0; i < r->n_epochs; i++) {
    const dt_epoch_metrics *m = &r->epochs[i];
    dt_buf_printf(b, "<tr><td>%d</td><td>%lld</td><td>", m->epoch, (long long)m->step);
    if (isfinite(m->lr))
      dt_buf_printf(b, "%.4g", (double)m->lr);
    else
      put(b, DASH);
    put(b, "</td><td>"), put_num(b, m->train_loss, 4);
    for (int k = 0; k < ms->n_train_row; k++) put(b, "</td><td>"), put_metric(b, &ms->train[k], m->train_metric[k]);
    put(b, "</td><td>"), put_num(b, m->test_loss, 4);
    for (int k = 0; k < ms->n_eval; k++) put(b, "</td><td>"), put_metric(b, &ms->eval[k], m->test_metric[k]);
    put(b, "</td><td>"), put_num(b, m->epoch_seconds, 2);
    put(b, "</td><td>"), put_num(b, m->train_samples_per_s, 0);
    put(b, "</td><td>"), put_num(b, m->compute_seconds, 2);
    put(b, "</td><td>"), put_num(b, m->data_wait_seconds, 2);
    put(b, "</td><td>"), put_num(b, m->comm_seconds, 2);
    put(b, "</td><td>"), put_num(b, m->eval_seconds, 2);
    put(b, "</td></tr>\n");
  }
  put(b, "</tbody></table>\n");
}

/* Scanning helpers over JSON that dt_json_parse has already accepted, so they
 * need not check the grammar: they only find where each value's text ends. */
static size_t json_skip_ws(const char *s, size_t i, size_t n) {
  while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
  return i;
}

static size_t json_skip_string(const char *s, size_t i, size_t n) {
  for (i++; i < n && s[i] != '"'; i++)
    if (s[i] == '\\') i++;
  return i + 1;
}

static size_t json_skip_value(const char *s, size_t i, size_t n) {
  if (s[i] == '"') return json_skip_string(s, i, n);
  int depth = 0;
  while (i < n) {
    char c = s[i];
    if (c == '"') {
      i = json_skip_string(s, i, n);
      continue;
    }
    if (c == '[' || c == '{') {
      depth++;
    } else if (c == ']' || c == '}') {
      if (depth == 0) break;
      if (--depth == 0) return i + 1;
    } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
      break;
    }
    i++;
  }
  return i;
}

/* One row per top-level member: the key, and the value as text (strings
 * decoded, numbers and nested values as written, since the parser keeps no
 * text for fractional numbers). Anything that is not a JSON object is shown as given. */
static void config_table(dt_buf *b, const char *text) {
  put(b, "<h2>Configuration</h2>\n");
  if (!text) {
    put(b, "<p>Not recorded.</p>\n");
    return;
  }
  size_t n = strlen(text);
  dt_json doc = {0};
  if (dt_json_parse(text, n, &doc) != DT_OK || doc.nodes[0].type != DT_JSON_OBJECT) {
    dt_clear_error(); /* not a failure of the report: the text is shown as it is */
    put(b, "<pre>");
    put_escaped(b, text);
    put(b, "</pre>\n");
    dt_json_free(&doc);
    return;
  }
  put(b, "<table class=\"config\"><thead><tr><th>key</th><th>value</th></tr></thead><tbody>\n");
  size_t i = json_skip_ws(text, 0, n) + 1; /* past '{' */
  for (int k = 1; k < doc.n; k = doc.nodes[k].end) {
    const dt_json_node *v = &doc.nodes[k];
    i = json_skip_ws(text, i, n);
    i = json_skip_string(text, i, n);           /* the key: shown decoded from the node */
    i = json_skip_ws(text, i, n) + 1;           /* ':' */
    size_t start = json_skip_ws(text, i, n), end = json_skip_value(text, start, n);
    i = json_skip_ws(text, end, n);
    if (i < n && text[i] == ',') i++;
    put(b, "<tr><td class=\"k\">");
    put_escaped_n(b, v->key, v->key_len);
    put(b, "</td><td class=\"v\">");
    if (v->type == DT_JSON_STRING)
      put_escaped_n(b, v->str, v->str_len);
    else
      put_escaped_n(b, text + start, end - start);
    put(b, "</td></tr>\n");
  }
  put(b, "</tbody></table>\n");
  dt_json_free(&doc);
}

/* ---- the page ----------------------------------------------------------- */

/* No external resources at all; the CSP makes the browser refuse any fetch a
 * future edit might add, instead of silently phoning out. */
static const char page_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";

static const char page_style[] =
    "<style>\n"
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;color:#222;"
    "background:#fff;margin:24px auto;max-width:1200px;padding:0 16px}\n"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}\n"
    ".figures{color:#555;margin:0 0 16px}\n"
    ".charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:16px}\n"
    "figure.chart{margin:0}figure.chart svg{display:block;width:100%;height:auto;border:1px solid #ddd;"
    "border-radius:4px;background:#fff}\n"
    "svg text{font-size:12px;fill:#333}svg text.title{font-size:15px;font-weight:600}"
    "svg text.label{fill:#555}\n"
    "svg .grid{stroke:#e6e6e6;stroke-width:1}svg .axis{stroke:#888;stroke-width:1}\n"
    "table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px}"
    "th{background:#f4f4f4;font-weight:600}\n"
    "table.num td{text-align:right;font-variant-numeric:tabular-nums}\n"
    "table.config td{font-family:ui-monospace,'DejaVu Sans Mono',monospace;vertical-align:top}"
    "table.config td.v{word-break:break-all}\n"
    "pre{background:#f7f7f7;border:1px solid #ddd;border-radius:4px;padding:8px 12px;overflow-x:auto;font-size:13px}\n"
    "footer{margin-top:28px;color:#888;font-size:12px}\n"
    "</style>\n";

/* The line under the heading: the figures of the last epoch. */
static void key_figures(dt_buf *b, const dt_report *r) {
  put(b, "<p class=\"figures\">");
  dt_buf_printf(b, "%d epoch%s", r->n_epochs, r->n_epochs == 1 ? "" : "s");
  if (r->n_epochs > 0) {
    const dt_epoch_metrics *m = &r->epochs[r->n_epochs - 1];
    const dt_metric_desc *d = &metric_set_of(r)->eval[0];
    put(b, " &#183; val "), put_escaped(b, d->label), put(b, " "), put_metric(b, d, m->test_metric[0]);
    put(b, " &#183; val loss "), put_num(b, m->test_loss, 4);
    put(b, " &#183; "), put_num(b, m->train_samples_per_s, 0), put(b, " samples/s");
  }
  dt_buf_printf(b, " &#183; %d rank%s</p>\n", r->world, r->world == 1 ? "" : "s");
}

/* Largest confusion matrix drawn in full; larger ones show the per-class table only. */
#define REPORT_MAX_CONFUSION 30

/* A confusion-matrix cell: the count, shaded by its share of the row. */
static void confusion_cell(dt_buf *b, double count, double row_total, int diagonal) {
  const double share = row_total > 0 ? count / row_total : 0;
  const int shade = 255 - (int)(share * 160);
  dt_buf_printf(b, "<td style=\"background:rgb(%d,%d,255)%s\">%.0f</td>", shade, shade,
                diagonal ? ";font-weight:600" : "", count);
}

static void confusion_table(dt_buf *b, const dt_metric_detail *d) {
  put(b, "<h3>Confusion matrix (rows: true class, columns: predicted)</h3>\n<table class=\"num\"><thead><tr><th></th>");
  for (int c = 0; c < d->k; c++) dt_buf_printf(b, "<th>%d</th>", c);
  put(b, "</tr></thead><tbody>\n");
  for (int t = 0; t < d->k; t++) {
    dt_buf_printf(b, "<tr><th>%d</th>", t);
    const double *row = d->confusion + (size_t)t * (size_t)d->k;
    for (int c = 0; c < d->k; c++) confusion_cell(b, row[c], d->samples ? d->samples[t] : 0, c == t);
    put(b, "</tr>\n");
  }
  put(b, "</tbody></table>\n");
}

/* Per class or label: samples and accuracy (or ROC-AUC), and the confusion matrix when small. */
static void detail_tables(dt_buf *b, const dt_metric_detail *d) {
  if (!d || d->k <= 0 || !d->value) return;
  const dt_metric_desc v = {"", d->value_label ? d->value_label : "value", "", d->percent};
  put(b, "<h2>Last evaluation per "), put(b, d->samples ? "class" : "label"), put(b, "</h2>\n");
  put(b, "<table class=\"num\"><thead><tr><th>"), put(b, d->samples ? "class" : "label"), put(b, "</th>");
  if (d->samples) put(b, "<th>samples</th>");
  put(b, "<th>"), put_escaped(b, v.label), put(b, "</th></tr></thead><tbody>\n");
  for (int i = 0; i < d->k; i++) {
    dt_buf_printf(b, "<tr><td>%d</td>", i);
    if (d->samples) put(b, "<td>"), put_num(b, d->samples[i], 0), put(b, "</td>");
    put(b, "<td>"), put_metric(b, &v, d->value[i]), put(b, "</td></tr>\n");
  }
  put(b, "</tbody></table>\n");
  if (d->confusion && d->k <= REPORT_MAX_CONFUSION) confusion_table(b, d);
}

static dt_status build_page(dt_buf *b, const dt_report *r) {
  const char *title = r->title ? r->title : "dtrain run";
  put(b, page_head);
  put(b, "<title>"), put_escaped(b, title), put(b, " &#8211; dtrain report</title>\n");
  put(b, page_style);
  put(b, "</head>\n<body>\n<h1>"), put_escaped(b, title), put(b, "</h1>\n");
  key_figures(b, r);
  put(b, "<div class=\"charts\">\n");
  DT_CHECK(epoch_charts(b, r));
  DT_CHECK(throughput_chart(b, r));
  rank_chart(b, r->ranks, r->world);
  put(b, "</div>\n");
  epoch_table(b, r);
  detail_tables(b, r->detail);
  if (r->summary_lines) {
    put(b, "<h2>Summary</h2>\n<pre>"), put_escaped(b, r->summary_lines), put(b, "</pre>\n");
  }
  config_table(b, r->config_json);
  put(b, "<footer>Written by dtrain " DTRAIN_VERSION ".</footer>\n</body>\n</html>\n");
  return b->status;
}

static dt_status check_report(const char *path, const dt_report *r) {
  if (!path || !path[0]) return dt_error(DT_INVALID_ARGUMENT, "report: no path");
  if (!r) return dt_error(DT_INVALID_ARGUMENT, "%s: no report", path);
  if (r->n_epochs < 0 || (r->n_epochs > 0 && !r->epochs))
    return dt_error(DT_INVALID_ARGUMENT, "%s: %d epochs without rows", path, r->n_epochs);
  if (r->n_throughput < 0 || (r->n_throughput > 0 && !r->throughput))
    return dt_error(DT_INVALID_ARGUMENT, "%s: %d throughput points without data", path, r->n_throughput);
  if (r->world < 0 || (r->world > 0 && !r->ranks))
    return dt_error(DT_INVALID_ARGUMENT, "%s: world %d without per-rank times", path, r->world);
  return DT_OK;
}

dt_status dt_report_write(const char *path, const dt_report *r) {
  DT_CHECK(check_report(path, r));
  dt_buf page = {0};
  dt_atomic_file a;
  dt_status st = build_page(&page, r);
  if (st == DT_OK) st = dt_atomic_open(&a, path);
  if (st == DT_OK) {
    dt_atomic_write(&a, page.data, page.len);
    st = dt_atomic_commit(&a);
    /* Once the page is in place, a directory that cannot be synced is worth a warning, not a failed report. */
    if (st != DT_OK && a.renamed) {
      DT_LOG_WARN("report", "%s", dt_last_error());
      dt_clear_error();
      st = DT_OK;
    }
  }
  dt_buf_free(&page);
  return st;
}

/* `dtrain recommend`: prints dt_recommend's top K as a table or as one JSON object. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_recommend.h"
#include "core/text.h"
#include "dtrain/core.h"

/* Characters (not bytes) of UTF-8 text: what a terminal column holds. */
static int text_width(const char *s) {
  int n = 0;
  for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
  return n;
}

static void print_table(FILE *f, const dt_recommend_config *cfg, const dt_recommend_result *r) {
  fprintf(f, "user %lld: top %d by %s (%s), leaving out the %lld of its %lld movies the user rated in %s\n",
          (long long)r->user, r->n, r->model, cfg->weights, (long long)r->rated, (long long)r->items, r->data);
  int width = (int)strlen("title");
  for (int k = 0; k < r->n; k++)
    if (text_width(r->top[k].title) > width) width = text_width(r->top[k].title);
  fprintf(f, "%4s  %8s  %6s  %-*s  %s\n", "rank", "movieId", "rating", width, "title", "genres");
  for (int k = 0; k < r->n; k++) {
    const dt_recommendation *e = &r->top[k];
    fprintf(f, "%4d  %8lld  %6.2f  %s%*s  %s\n", k + 1, (long long)e->item, (double)e->score, e->title,
            width - text_width(e->title), "", e->genres);
  }
}

/* s as a JSON string literal on f. */
static dt_status put_json_string(FILE *f, const char *s, char **buf, size_t *cap) {
  const size_t need = 6 * strlen(s) + 3; /* every byte as \u00xx at worst, the quotes and the NUL */
  if (need > *cap) {
    char *grown = realloc(*buf, need);
    if (!grown) return DT_OUT_OF_MEMORY;
    *buf = grown;
    *cap = need;
  }
  size_t pos = 0;
  dt_json_escape(*buf, *cap, &pos, s);
  fputs(*buf, f);
  return DT_OK;
}

static dt_status print_json(FILE *f, const dt_recommend_result *r) {
  char *buf = NULL;
  size_t cap = 0;
  dt_status st = DT_OK;
  fprintf(f, "{\"user\": %lld, \"items\": [", (long long)r->user);
  for (int k = 0; k < r->n && st == DT_OK; k++) {
    const dt_recommendation *e = &r->top[k];
    fprintf(f, "%s{\"movie_id\": %lld, \"score\": ", k ? ", " : "", (long long)e->item);
    if (isfinite(e->score)) fprintf(f, "%.6g", (double)e->score);
    else fputs("null", f);
    fputs(", \"title\": ", f);
    st = put_json_string(f, e->title, &buf, &cap);
    fputs(", \"genres\": ", f);
    if (st == DT_OK) st = put_json_string(f, e->genres, &buf, &cap);
    fputc('}', f);
  }
  fputs("]}\n", f);
  free(buf);
  return st;
}

dt_status recommend_print(FILE *f, const dt_recommend_config *cfg, const dt_recommend_result *r, int json) {
  if (json) return print_json(f, r);
  print_table(f, cfg, r);
  return DT_OK;
}

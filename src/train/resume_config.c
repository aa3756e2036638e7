/* Resume: the snapshot's stored configuration against the new run's, member by member; data changes are refused. */
#include <stdio.h>
#include <string.h>

#include "core/impl.h"
#include "io/json.h"
#include "train/run.h"

/* Members that say which samples are trained and evaluated on: another value is another data set. */
static const char *const data_keys[] = {"data",        "split",       "val_data",     "val_fraction",
                                        "limit_train", "limit_test",  "limit_pick",   "normalize",    "augment",
                                        "vocab",       "text_column", "text_pair_column", "label_columns",
                                        "label_column", "max_len",    "lower_case",   "skip_bad_rows"};
/* Members that differ between a run and its continuation by their nature. */
static const char *const ignored_keys[] = {"resume"};

static int in_list(const char *key, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(key, list[i]) == 0) return 1;
  return 0;
}
#define IN(key, list) in_list(key, list, sizeof list / sizeof list[0])

/* The member of the root object named key, or NULL. */
static const dt_json_node *member(const dt_json *d, const char *key) {
  for (int j = 1; j < d->n; j = d->nodes[j].end)
    if (strcmp(d->nodes[j].key, key) == 0) return &d->nodes[j];
  return NULL;
}

/* A member's JSON text, or "(none)" where it is absent. */
static void value_text(const char *text, const dt_json_node *n, char *buf, size_t len) {
  if (!n) snprintf(buf, len, "(none)");
  else snprintf(buf, len, "%.*s", (int)n->span, text + n->at);
}

typedef struct config_pair {
  const char *old_text, *new_text;
  dt_json old, cur;
} config_pair;

/* Calls fn for every member whose value differs (those of the new run first, then those only the snapshot has). */
typedef void (*diff_fn)(void *user, const char *key, const char *was, const char *now);
static void each_difference(const config_pair *p, diff_fn fn, void *user) {
  char was[1024], now[1024];
  for (int pass = 0; pass < 2; pass++) {
    const dt_json *a = pass ? &p->old : &p->cur, *b = pass ? &p->cur : &p->old;
    for (int j = 1; j < a->n; j = a->nodes[j].end) {
      const char *key = a->nodes[j].key;
      const dt_json_node *o = member(&p->old, key), *n = member(&p->cur, key);
      if (IN(key, ignored_keys) || (pass && member(b, key))) continue;
      value_text(p->old_text, o, was, sizeof was);
      value_text(p->new_text, n, now, sizeof now);
      if (strcmp(was, now) != 0) fn(user, key, was, now);
    }
  }
}

/* The data changes as "limit_train 2000 -> 1000, ..." */
typedef struct data_changes {
  char list[2048];
  size_t o;
  int n;
} data_changes;

static void collect_data_change(void *user, const char *key, const char *was, const char *now) {
  data_changes *d = user;
  if (!IN(key, data_keys) || d->o >= sizeof d->list) return;
  int k = snprintf(d->list + d->o, sizeof d->list - d->o, "%s%s %s -> %s", d->n++ ? ", " : "", key, was, now);
  if (k > 0) d->o += (size_t)k;
}

static void print_change(void *user, const char *key, const char *was, const char *now) {
  fprintf((FILE *)user, "resume: %s %s -> %s%s\n", key, was, now, IN(key, data_keys) ? " (--allow-data-change)" : "");
}

static dt_status compare(dt_run *r, const char *snapshot, config_pair *p) {
  const dt_train_config *c = r->cfg;
  DT_CHECK(dt_json_parse(p->old_text, strlen(p->old_text), &p->old));
  DT_CHECK(dt_json_parse(p->new_text, strlen(p->new_text), &p->cur));
  if (p->old.nodes[0].type != DT_JSON_OBJECT) return dt_error(DT_CORRUPT, "configuration is not an object");
  data_changes d = {.o = 0};
  each_difference(p, collect_data_change, &d);
  if (d.n && !c->allow_data_change)
    return dt_error(DT_USAGE,
                    "--resume: %s was trained on other data (%s): give --allow-data-change to continue it on this "
                    "data, or start afresh (--overwrite, or another --out)",
                    snapshot, d.list);
  if (c->progress) {
    each_difference(p, print_change, c->progress);
    fflush(c->progress);
  }
  return DT_OK;
}

dt_status dt_run_resume_compare(dt_run *r, const char *snapshot, const char *stored) {
  if (!*stored) {
    DT_LOG_WARN("train", "%s stores no configuration: its differences to this run are not checked", snapshot);
    return DT_OK;
  }
  config_pair p = {.old_text = stored, .new_text = r->config_json};
  dt_status st = compare(r, snapshot, &p);
  if (st == DT_CORRUPT) st = dt_error_prefix(st, "%s: its stored configuration", snapshot);
  dt_json_free(&p.cur);
  dt_json_free(&p.old);
  return st;
}

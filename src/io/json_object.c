/* A JSON object written member by member with checked keys and values: config files (config.json of an export). */
#include <math.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"
#include "io/json.h"

static void fail(dt_json_obj *o, dt_status st) {
  if (o->buf.status == DT_OK) o->buf.status = st;
}

/* The key's literal as written, compared with those already in the object. */
static int has_literal(const dt_json_obj *o, const char *lit, size_t len) {
  for (int i = 0; i < o->n; i++)
    if (strncmp(o->buf.data + o->key_at[i], lit, len) == 0 && o->buf.data[o->key_at[i] + len] == ':') return 1;
  return 0;
}

int dt_json_obj_has(const dt_json_obj *o, const char *key) {
  dt_buf lit = {0};
  dt_buf_json_string(&lit, key);
  const int found = lit.status == DT_OK && o->buf.data && has_literal(o, lit.data, lit.len);
  dt_buf_free(&lit);
  return found;
}

/* Writes the separator, indent and "key": before a value; 0 when the object has failed or the key is refused. */
static int begin(dt_json_obj *o, const char *key) {
  if (o->buf.status != DT_OK) return 0;
  if (!key || !dt_utf8_valid(key, strlen(key))) {
    fail(o, dt_error(DT_INVALID_ARGUMENT, "JSON object: a key is NULL or not UTF-8"));
    return 0;
  }
  if (dt_json_obj_has(o, key)) {
    fail(o, dt_error(DT_INVALID_ARGUMENT, "JSON object: key \"%.100s\" given twice", key));
    return 0;
  }
  if (o->n == DT_JSON_OBJ_MAX_KEYS) {
    fail(o, dt_error(DT_INVALID_ARGUMENT, "JSON object: more than %d keys", DT_JSON_OBJ_MAX_KEYS));
    return 0;
  }
  dt_buf_append(&o->buf, o->n ? ",\n" : "{\n", 2);
  for (int i = 0; i <= o->depth; i++) dt_buf_append(&o->buf, "  ", 2);
  o->key_at[o->n++] = o->buf.len;
  dt_buf_json_string(&o->buf, key);
  dt_buf_append(&o->buf, ": ", 2);
  return o->buf.status == DT_OK;
}

static void put_string(dt_json_obj *o, const char *key, const char *value) {
  if (value && dt_utf8_valid(value, strlen(value)))
    dt_buf_json_string(&o->buf, value);
  else
    fail(o, dt_error(DT_INVALID_ARGUMENT, "JSON object: \"%.100s\": value is NULL or not UTF-8", key));
}

void dt_json_obj_str(dt_json_obj *o, const char *key, const char *value) {
  if (begin(o, key)) put_string(o, key, value);
}

void dt_json_obj_int(dt_json_obj *o, const char *key, int64_t value) {
  if (begin(o, key)) dt_buf_printf(&o->buf, "%lld", (long long)value);
}

void dt_json_obj_num(dt_json_obj *o, const char *key, double value) {
  if (!isfinite(value))
    fail(o, dt_error(DT_INVALID_ARGUMENT, "JSON object: \"%.100s\" is %g, not a JSON number", key ? key : "(null)",
                     value));
  else if (begin(o, key))
    dt_buf_printf(&o->buf, "%.17g", value);
}

void dt_json_obj_bool(dt_json_obj *o, const char *key, int value) {
  if (begin(o, key)) dt_buf_printf(&o->buf, "%s", value ? "true" : "false");
}

void dt_json_obj_strs(dt_json_obj *o, const char *key, const char *const *values, int n) {
  if (!begin(o, key)) return;
  dt_buf_append(&o->buf, "[", 1);
  for (int i = 0; i < n; i++) {
    if (i) dt_buf_append(&o->buf, ", ", 2);
    put_string(o, key, values[i]);
  }
  dt_buf_append(&o->buf, "]", 1);
}

void dt_json_obj_raw(dt_json_obj *o, const char *key, const char *json) {
  if (!json)
    fail(o, dt_error(DT_INVALID_ARGUMENT, "JSON object: \"%.100s\": NULL value", key ? key : "(null)"));
  else if (begin(o, key))
    dt_buf_append(&o->buf, json, strlen(json));
}

dt_status dt_json_obj_finish(dt_json_obj *o, const char **text) {
  if (o->n == 0) dt_buf_append(&o->buf, "{", 1);
  else {
    dt_buf_append(&o->buf, "\n", 1);
    for (int i = 0; i < o->depth; i++) dt_buf_append(&o->buf, "  ", 2);
  }
  dt_buf_append(&o->buf, o->depth ? "}" : "}\n", o->depth ? 1 : 2);
  if (o->buf.status != DT_OK) return o->buf.status;
  *text = o->buf.data;
  return DT_OK;
}

void dt_json_obj_free(dt_json_obj *o) {
  if (o) dt_buf_free(&o->buf);
}

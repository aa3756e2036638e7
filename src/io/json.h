/* A small, strict, bounded JSON reader (flat node array) and writer helpers, for file headers. */
#ifndef DT_IO_JSON_H
#define DT_IO_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

typedef enum dt_json_type {
  DT_JSON_NULL,
  DT_JSON_FALSE,
  DT_JSON_TRUE,
  DT_JSON_NUMBER,
  DT_JSON_STRING,
  DT_JSON_ARRAY,
  DT_JSON_OBJECT,
} dt_json_type;

/* One value. The document is a flat array of nodes in document order: the
 * first child of a container node i is node i + 1, and the sibling after node
 * j is node j.end (the index one past j's subtree). */
typedef struct dt_json_node {
  dt_json_type type;
  int end;          /* index one past this node's subtree */
  int count;        /* array/object: number of children */
  const char *key;  /* member of an object: its key (decoded, NUL-terminated), else NULL */
  size_t key_len;   /* bytes of key (it may hold "\u0000") */
  const char *str;  /* string: decoded UTF-8, NUL-terminated */
  size_t str_len;
  /* number: the JSON grammar is checked; the value is kept only for integers
   * (no fraction or exponent) whose magnitude fits in 64 bits. */
  int is_int;
  int negative;
  uint64_t magnitude;
  size_t at, span;  /* the value's source text: span bytes from byte at (to compare or print any value) */
} dt_json_node;

typedef struct dt_json {
  dt_json_node *nodes; /* nodes[0] is the root */
  int n;
  char *strings;       /* pool the key/str pointers point into */
} dt_json;

#define DT_JSON_MAX_DEPTH 64
/* 4M nodes (~256 MB) bound the memory a hostile header can claim; real headers
 * hold about 10 nodes per tensor. */
#define DT_JSON_MAX_NODES (1 << 22)

/* Parses exactly one JSON value from text[0..len) (whitespace around it is
 * allowed, nothing else): strict RFC 8259 grammar, well-formed UTF-8, no lone
 * surrogates, no duplicate keys in an object, nesting at most DT_JSON_MAX_DEPTH.
 * On failure DT_CORRUPT with "what at byte offset" (prefix it with the file name);
 * DT_OUT_OF_MEMORY if the nodes do not fit. The caller frees with dt_json_free. */
dt_status dt_json_parse(const char *text, size_t len, dt_json *out);
void dt_json_free(dt_json *doc); /* accepts a zeroed doc */

/* A growable byte buffer for writers. */
typedef struct dt_buf {
  char *data;
  size_t len, cap;
  dt_status status; /* first failure (out of memory); appends after it do nothing */
} dt_buf;
void dt_buf_append(dt_buf *b, const void *p, size_t n);
void dt_buf_printf(dt_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends s as a JSON string literal: quotes, escapes for " \ and control characters. */
void dt_buf_json_string(dt_buf *b, const char *s);
void dt_buf_free(dt_buf *b);

/* A JSON object written member by member (json_object.c), as configs are:
 * two-space indent, one member a line, members in the order added. Keys and
 * strings are escaped; a repeated key, a key or string that is not UTF-8, or a
 * non-finite number makes the object fail (DT_INVALID_ARGUMENT naming it), and
 * every later call is a no-op; dt_json_obj_finish returns that first failure.
 * A nested object is one written with its own dt_json_obj and added by
 * dt_json_obj_raw. Start from {0}; free with dt_json_obj_free. */
#define DT_JSON_OBJ_MAX_KEYS 256
typedef struct dt_json_obj {
  dt_buf buf;                        /* "{\n  \"a\": 1,\n ..." so far */
  size_t key_at[DT_JSON_OBJ_MAX_KEYS]; /* where each key's literal starts in buf */
  int n;
  int depth;                         /* 0: a file's object; 1: nested one level (indent 4), ... */
} dt_json_obj;
void dt_json_obj_str(dt_json_obj *o, const char *key, const char *value);
void dt_json_obj_int(dt_json_obj *o, const char *key, int64_t value);
void dt_json_obj_num(dt_json_obj *o, const char *key, double value);
void dt_json_obj_bool(dt_json_obj *o, const char *key, int value);
/* An array of strings (transformers' "architectures"). */
void dt_json_obj_strs(dt_json_obj *o, const char *key, const char *const *values, int n);
/* A value already written as JSON (a finished nested object). */
void dt_json_obj_raw(dt_json_obj *o, const char *key, const char *json);
/* 1 if the object has a member named key. */
int dt_json_obj_has(const dt_json_obj *o, const char *key);
/* Closes the object ("}" and, at depth 0, a newline) and returns it in *text
 * (owned by o until dt_json_obj_free), or the first failure. */
dt_status dt_json_obj_finish(dt_json_obj *o, const char **text);
void dt_json_obj_free(dt_json_obj *o);

#endif

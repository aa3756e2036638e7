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

#endif

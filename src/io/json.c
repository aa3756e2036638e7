/* A strict, bounded JSON parser into a flat node array, and string-escaping writer helpers. */
#include "io/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"

typedef struct parser {
  const char *s;
  size_t len, pos;
  dt_json_node *nodes;
  int n, cap;
  char *pool;      /* decoded strings; never longer than their quoted source, so len + 1 bytes suffice */
  size_t pool_len;
} parser;

static dt_status fail(const parser *p, const char *what) {
  return dt_error(DT_CORRUPT, "JSON: %s at byte %zu", what, p->pos);
}

static void skip_ws(parser *p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    p->pos++;
  }
}

static dt_status new_node(parser *p, dt_json_type type, int *idx) {
  if (p->n == p->cap) {
    if (p->cap >= DT_JSON_MAX_NODES) return fail(p, "too many values");
    int cap = p->cap ? p->cap * 2 : 64;
    dt_json_node *bigger = NULL;
    DT_CHECK(dt_alloc_array((size_t)cap, sizeof *bigger, "JSON nodes", (void **)&bigger));
    if (p->n) memcpy(bigger, p->nodes, (size_t)p->n * sizeof *bigger);
    dt_free(p->nodes);
    p->nodes = bigger;
    p->cap = cap;
  }
  dt_json_node *node = &p->nodes[p->n];
  memset(node, 0, sizeof *node);
  node->type = type;
  *idx = p->n++;
  return DT_OK;
}

static int hex4(const char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return 0;
  }
  *out = v;
  return 1;
}

static void put_utf8(parser *p, unsigned cp) {
  char *o = p->pool + p->pool_len;
  if (cp < 0x80) {
    o[0] = (char)cp;
    p->pool_len += 1;
  } else if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    p->pool_len += 2;
  } else if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    p->pool_len += 3;
  } else {
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    p->pool_len += 4;
  }
}

/* At the opening quote: decodes into the pool. */
static dt_status parse_string(parser *p, const char **out, size_t *out_len) {
  size_t start = p->pool_len;
  p->pos++; /* opening quote */
  for (;;) {
    if (p->pos >= p->len) return fail(p, "unterminated string");
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '"') {
      p->pos++;
      break;
    }
    if (c < 0x20) return fail(p, "control character in string");
    if (c == '\\') {
      if (p->pos + 1 >= p->len) return fail(p, "unterminated escape");
      char e = p->s[p->pos + 1];
      const char *simple = "\"\\/bfnrt", *value = "\"\\/\b\f\n\r\t";
      const char *hit = e ? strchr(simple, e) : NULL;
      if (hit) {
        p->pool[p->pool_len++] = value[hit - simple];
        p->pos += 2;
        continue;
      }
      if (e != 'u') return fail(p, "invalid escape");
      unsigned cp;
      if (p->pos + 6 > p->len || !hex4(p->s + p->pos + 2, &cp)) return fail(p, "invalid \\u escape");
      if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, "lone low surrogate");
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        unsigned lo;
        if (p->pos + 12 > p->len || p->s[p->pos + 6] != '\\' || p->s[p->pos + 7] != 'u' ||
            !hex4(p->s + p->pos + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
          return fail(p, "lone high surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        p->pos += 6;
      }
      put_utf8(p, cp);
      p->pos += 6;
      continue;
    }
    if (c < 0x80) {
      p->pool[p->pool_len++] = (char)c;
      p->pos++;
      continue;
    }
    size_t n = dt_utf8_char_len(p->s + p->pos, p->len - p->pos);
    if (!n) return fail(p, "invalid UTF-8 in string");
    memcpy(p->pool + p->pool_len, p->s + p->pos, n);
    p->pool_len += n;
    p->pos += n;
  }
  p->pool[p->pool_len++] = '\0';
  *out = p->pool + start;
  *out_len = p->pool_len - start - 1;
  return DT_OK;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static dt_status parse_number(parser *p, dt_json_node *node) {
  uint64_t mag = 0;
  int overflow = 0, is_int = 1;
  if (p->s[p->pos] == '-') {
    node->negative = 1;
    p->pos++;
  }
  if (p->pos >= p->len || !is_digit(p->s[p->pos])) return fail(p, "invalid number");
  if (p->s[p->pos] == '0') {
    p->pos++;
    if (p->pos < p->len && is_digit(p->s[p->pos])) return fail(p, "leading zero in number");
  } else {
    while (p->pos < p->len && is_digit(p->s[p->pos])) {
      unsigned d = (unsigned)(p->s[p->pos++] - '0');
      if (mag > (UINT64_MAX - d) / 10) overflow = 1;
      else mag = mag * 10 + d;
    }
  }
  if (p->pos < p->len && p->s[p->pos] == '.') {
    is_int = 0;
    p->pos++;
    if (p->pos >= p->len || !is_digit(p->s[p->pos])) return fail(p, "digit expected after '.'");
    while (p->pos < p->len && is_digit(p->s[p->pos])) p->pos++;
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    is_int = 0;
    p->pos++;
    if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
    if (p->pos >= p->len || !is_digit(p->s[p->pos])) return fail(p, "digit expected in exponent");
    while (p->pos < p->len && is_digit(p->s[p->pos])) p->pos++;
  }
  node->is_int = is_int && !overflow;
  node->magnitude = node->is_int ? mag : 0;
  return DT_OK;
}

typedef struct key_ref {
  const char *s;
  size_t len;
} key_ref;

static int key_cmp(const void *a, const void *b) {
  const key_ref *x = a, *y = b;
  size_t n = x->len < y->len ? x->len : y->len;
  int c = memcmp(x->s, y->s, n);
  if (c) return c;
  return (x->len > y->len) - (x->len < y->len);
}

/* Duplicate keys among the members of object node obj; sorting keeps large objects O(n log n). */
static dt_status check_duplicates(parser *p, int obj) {
  int count = p->nodes[obj].count;
  if (count < 2) return DT_OK;
  key_ref *keys = NULL;
  DT_CHECK(dt_alloc_array((size_t)count, sizeof *keys, "JSON key check", (void **)&keys));
  int k = 0;
  for (int j = obj + 1; j < p->nodes[obj].end; j = p->nodes[j].end)
    keys[k++] = (key_ref){p->nodes[j].key, p->nodes[j].key_len};
  qsort(keys, (size_t)count, sizeof *keys, key_cmp);
  dt_status st = DT_OK;
  for (int i = 1; i < count; i++)
    if (key_cmp(&keys[i - 1], &keys[i]) == 0) {
      st = dt_error(DT_CORRUPT, "JSON: duplicate key \"%.200s\" in the object at byte %zu", keys[i].s, p->pos);
      break;
    }
  dt_free(keys);
  return st;
}

static dt_status parse_value(parser *p, int depth, int *out);

static dt_status parse_container(parser *p, int depth, int is_object, int idx) {
  char close = is_object ? '}' : ']';
  if (depth >= DT_JSON_MAX_DEPTH) return fail(p, "nesting too deep");
  p->pos++; /* [ or { */
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++;
    p->nodes[idx].end = p->n;
    return DT_OK;
  }
  for (;;) {
    const char *key = NULL;
    size_t key_len = 0;
    skip_ws(p);
    if (is_object) {
      if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "string key expected");
      DT_CHECK(parse_string(p, &key, &key_len));
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, "':' expected");
      p->pos++;
      skip_ws(p);
    }
    int child;
    DT_CHECK(parse_value(p, depth + 1, &child));
    p->nodes[child].key = key;
    p->nodes[child].key_len = key_len;
    p->nodes[idx].count++;
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, is_object ? "unterminated object" : "unterminated array");
    char c = p->s[p->pos++];
    if (c == close) break;
    if (c != ',') {
      p->pos--;
      return fail(p, is_object ? "',' or '}' expected" : "',' or ']' expected");
    }
  }
  p->nodes[idx].end = p->n;
  return is_object ? check_duplicates(p, idx) : DT_OK;
}

static dt_status parse_value(parser *p, int depth, int *out) {
  if (p->pos >= p->len) return fail(p, "value expected");
  char c = p->s[p->pos];
  const size_t at = p->pos;
  int idx;
  switch (c) {
  case '{':
  case '[':
    DT_CHECK(new_node(p, c == '{' ? DT_JSON_OBJECT : DT_JSON_ARRAY, &idx));
    DT_CHECK(parse_container(p, depth, c == '{', idx));
    break;
  case '"': {
    DT_CHECK(new_node(p, DT_JSON_STRING, &idx));
    const char *s;
    size_t n;
    DT_CHECK(parse_string(p, &s, &n));
    p->nodes[idx].str = s;
    p->nodes[idx].str_len = n;
    break;
  }
  case 't':
  case 'f':
  case 'n': {
    const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail(p, "invalid literal");
    DT_CHECK(new_node(p, c == 't' ? DT_JSON_TRUE : c == 'f' ? DT_JSON_FALSE : DT_JSON_NULL, &idx));
    p->pos += n;
    break;
  }
  default:
    if (c != '-' && !is_digit(c)) return fail(p, "unexpected character");
    DT_CHECK(new_node(p, DT_JSON_NUMBER, &idx));
    DT_CHECK(parse_number(p, &p->nodes[idx]));
    break;
  }
  p->nodes[idx].end = p->n;
  p->nodes[idx].at = at;
  p->nodes[idx].span = p->pos - at;
  *out = idx;
  return DT_OK;
}

dt_status dt_json_parse(const char *text, size_t len, dt_json *out) {
  parser p = {.s = text, .len = len};
  dt_status st;
  if (len >= SIZE_MAX - 1) return dt_error(DT_INVALID_ARGUMENT, "JSON text too long");
  DT_CHECK(dt_alloc(len + 1, (void **)&p.pool));
  int root;
  skip_ws(&p);
  DT_CHECK_GOTO(parse_value(&p, 0, &root), st, fail_out);
  skip_ws(&p);
  if (p.pos != p.len) {
    st = fail(&p, "trailing characters after the value");
    goto fail_out;
  }
  out->nodes = p.nodes;
  out->n = p.n;
  out->strings = p.pool;
  return DT_OK;
fail_out:
  dt_free(p.nodes);
  dt_free(p.pool);
  return st;
}

void dt_json_free(dt_json *doc) {
  if (!doc) return;
  dt_free(doc->nodes);
  dt_free(doc->strings);
  doc->nodes = NULL;
  doc->strings = NULL;
  doc->n = 0;
}

/* Room for n more bytes and the NUL after them; 0 when there is none (b->status says why). */
static int buf_reserve(dt_buf *b, size_t n) {
  if (b->status != DT_OK) return 0;
  if (b->len + n + 1 <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + n + 1) {
    if (cap > SIZE_MAX / 2) {
      b->status = dt_error(DT_OUT_OF_MEMORY, "buffer of %zu bytes overflows", b->len + n);
      return 0;
    }
    cap *= 2;
  }
  char *bigger = NULL;
  b->status = dt_alloc(cap, (void **)&bigger);
  if (b->status != DT_OK) return 0;
  if (b->len) memcpy(bigger, b->data, b->len);
  dt_free(b->data);
  b->data = bigger;
  b->cap = cap;
  return 1;
}

void dt_buf_append(dt_buf *b, const void *src, size_t n) {
  if (!buf_reserve(b, n)) return;
  memcpy(b->data + b->len, src, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void dt_buf_printf(dt_buf *b, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    if (b->status == DT_OK) b->status = dt_error(DT_INTERNAL, "bad format string");
    return;
  }
  if ((size_t)n < sizeof small) {
    dt_buf_append(b, small, (size_t)n);
    return;
  }
  char *big = NULL;
  if (b->status != DT_OK) return;
  b->status = dt_alloc((size_t)n + 1, (void **)&big);
  if (b->status != DT_OK) return;
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  dt_buf_append(b, big, (size_t)n);
  dt_free(big);
}

void dt_buf_json_string(dt_buf *b, const char *s) {
  /* First with room for s as it is; escapes take up to 6 bytes a byte, so a
   * string full of them needs a few more tries. */
  for (size_t room = strlen(s) + 2;; room *= 2) {
    if (!buf_reserve(b, room)) return;
    size_t pos = b->len;
    if (dt_json_escape(b->data, b->cap, &pos, s)) {
      b->len = pos;
      return;
    }
    b->data[b->len] = '\0'; /* the failed try wrote past the end */
  }
}

void dt_buf_free(dt_buf *b) {
  if (!b) return;
  dt_free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

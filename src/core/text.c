/* Text checks and encodings shared by the file formats and the trace: UTF-8 validation, JSON string literals. */
#include "core/text.h"

size_t dt_utf8_char_len(const char *s, size_t avail) {
  const unsigned char *u = (const unsigned char *)s;
  unsigned c = u[0];
  size_t n;
  /* The second byte's range excludes overlongs (E0, F0), surrogates (ED) and
   * code points past U+10FFFF (F4); C0, C1 and F5..FF never start a character. */
  unsigned lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (avail < n) return 0;
  if (u[1] < lo || u[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if (u[i] < 0x80 || u[i] > 0xBF) return 0;
  return n;
}

int dt_utf8_valid(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t k = dt_utf8_char_len(s + i, n - i);
    if (!k) return 0;
    i += k;
  }
  return 1;
}

int dt_json_escape(char *buf, size_t len, size_t *pos, const char *s) {
  static const char hex[] = "0123456789abcdef";
  size_t p = *pos;
#define PUT(c)                  \
  do {                          \
    if (p + 1 >= len) return 0; \
    buf[p++] = (char)(c);       \
  } while (0)
  PUT('"');
  for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c; c++) {
    if (*c == '"' || *c == '\\') {
      PUT('\\');
      PUT(*c);
    } else if (*c < 0x20) {
      PUT('\\');
      PUT('u');
      PUT('0');
      PUT('0');
      PUT(hex[*c >> 4]);
      PUT(hex[*c & 15]);
    } else {
      PUT(*c);
    }
  }
  PUT('"');
#undef PUT
  buf[p] = '\0';
  *pos = p;
  return 1;
}

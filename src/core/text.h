/* Text checks and encodings shared by the file formats and the trace: UTF-8 validation, JSON string literals. */
#ifndef DT_CORE_TEXT_H
#define DT_CORE_TEXT_H

#include <stddef.h>

/* Bytes of the well-formed UTF-8 character at s[0..avail), avail >= 1: 1 for
 * ASCII, 2 to 4, or 0 when the bytes there are not one (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF, no truncated sequence). */
size_t dt_utf8_char_len(const char *s, size_t avail);
/* 1 if s[0..n) is well-formed UTF-8 (RFC 3629), else 0. */
int dt_utf8_valid(const char *s, size_t n);

/* Appends s (NULL: "") as a JSON string literal to buf[*pos..len): quotes
 * around it, a backslash before " and \, control characters (< 0x20) as
 * \u00xx in lowercase hex, every other byte (non-ASCII included) as it is.
 * Then a NUL, and *pos advances to it. Returns 1, or 0 when the literal and
 * the NUL do not fit: *pos is unchanged then, and buf past it undefined. */
int dt_json_escape(char *buf, size_t len, size_t *pos, const char *s);

#endif

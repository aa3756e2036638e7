/* Text checks and encodings the file formats share: UTF-8 validation. */
#ifndef DT_CORE_TEXT_H
#define DT_CORE_TEXT_H

#include <stddef.h>

/* Bytes of the well-formed UTF-8 character at s[0..avail), avail >= 1: 1 for
 * ASCII, 2 to 4, or 0 when the bytes there are not one (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF, no truncated sequence). */
size_t dt_utf8_char_len(const char *s, size_t avail);
/* 1 if s[0..n) is well-formed UTF-8 (RFC 3629), else 0. */
int dt_utf8_valid(const char *s, size_t n);

#endif

/* BertTokenizer's basic tokenizer over code points, as transformers' BasicTokenizer (tokenize_chinese_chars,
 * strip_accents following do_lower_case): drop NUL, U+FFFD and control characters, map whitespace to spaces,
 * put spaces around CJK ideographs, NFC, split on whitespace, lower-case and strip accents (NFD, then no Mn
 * marks), split off every punctuation character. Unicode properties come from utf8proc. */
#include <stdlib.h>

#include <utf8proc.h>

#include "text/text-impl.h"

static int category(int32_t c) { return (int)utf8proc_category(c); }

/* ASCII takes the fast paths below (most text is); the Unicode tables decide the rest, alike. */

/* transformers' _is_whitespace: space, \t, \n, \r, or category Zs. */
static int is_space(int32_t c) {
  if (c < 0x80) return c == ' ' || c == '\t' || c == '\n' || c == '\r';
  return category(c) == UTF8PROC_CATEGORY_ZS;
}

/* transformers' _is_control: category C* (Cc, Cf, Cn, Co, Cs), except \t \n \r. */
static int is_control(int32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return 0;
  if (c < 0x80) return c < 0x20 || c == 0x7F;
  const int k = category(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
         k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CS;
}

/* transformers' _is_punctuation: every non-alphanumeric ASCII printable, or category P*. */
static int is_punct(int32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return 1;
  if (c < 0x80) return 0;
  const int k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* transformers' _is_chinese_char: the CJK Unified Ideographs blocks. */
static int is_cjk(int32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* What Python's str.split() still splits on after the cleanup: spaces, and the line and paragraph separators
 * (categories Zl, Zp), which transformers keeps as characters but str.split treats as whitespace. */
static int splits_words(int32_t c) { return c == ' ' || c == 0x2028 || c == 0x2029; }

/* Python's lower() of one character, as BertTokenizer.tokenize applies it (its regex lower-cases the text one
 * character at a time, so a capital sigma never becomes the final U+03C2, as the fast tokenizers would make
 * it): utf8proc's simple mapping; U+0130 lowers to "i" + U+0307 in Python, which accent stripping removes. */
static int32_t lower_of(int32_t c) { return utf8proc_tolower(c); }

/* w lower-cased, decomposed (NFD) and without Mn marks into out; returns its length. out: 4 per input, the most
 * a canonical decomposition produces. */
static size_t lower_strip(const int32_t *w, size_t n, int32_t *out) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (w[i] < 0x80) { /* ASCII: its own NFD, never a mark */
      out[m++] = w[i] >= 'A' && w[i] <= 'Z' ? w[i] + ('a' - 'A') : w[i];
      continue;
    }
    int32_t d[8];
    int bound = 0;
    const utf8proc_ssize_t k = utf8proc_decompose_char(lower_of(w[i]), d, 8, UTF8PROC_DECOMPOSE, &bound);
    for (utf8proc_ssize_t j = 0; j < k && j < 8; j++)
      if (category(d[j]) != UTF8PROC_CATEGORY_MN) out[m++] = d[j];
  }
  return m;
}

/* Pieces of one whitespace-separated word: runs of non-punctuation, and each punctuation character alone. */
static int punct_split(const int32_t *w, size_t n, int (*fn)(const int32_t *, size_t, void *), void *user) {
  size_t run = 0;
  for (size_t i = 0; i <= n; i++) {
    if (i < n && !is_punct(w[i])) continue;
    int rc = i > run ? fn(w + run, i - run, user) : 0;
    if (!rc && i < n) rc = fn(w + i, 1, user);
    if (rc) return rc;
    run = i + 1;
  }
  return 0;
}

/* NFC of c[0..*m) into a new array (free it), as transformers applies before the whitespace split; NULL when
 * nothing changes it (no code point from U+0300 on: nothing composes below) or memory runs out (then the text
 * goes on as it is). Only the cased tokenizer needs it: lower-casing decomposes again (NFD). */
static int32_t *nfc(const int32_t *c, size_t *m) {
  size_t i = 0;
  while (i < *m && c[i] < 0x300) i++;
  if (i == *m) return NULL;
  uint8_t *utf8 = malloc(4 * *m + 1), *out = NULL;
  int32_t *res = NULL;
  if (!utf8) return NULL;
  utf8proc_ssize_t len = 0;
  for (size_t k = 0; k < *m; k++) len += utf8proc_encode_char(c[k], utf8 + len);
  const utf8proc_ssize_t got = utf8proc_map(utf8, len, &out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (got >= 0 && (res = malloc(((size_t)got + 1) * sizeof *res)) != NULL) {
    const utf8proc_ssize_t n = utf8proc_decompose(out, got, res, got + 1, 0); /* decode only: no option */
    if (n >= 0) *m = (size_t)n;
    else free(res), res = NULL;
  }
  free(out);
  free(utf8);
  return res;
}

int dt_wp_basic(const int32_t *cp, size_t n, int lower, int32_t *scratch,
                int (*fn)(const int32_t *piece, size_t n, void *user), void *user) {
  int32_t *clean = scratch, *word = scratch + 3 * n + 8;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    const int32_t c = cp[i];
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_space(c)) clean[m++] = ' ';
    else if (is_cjk(c)) clean[m++] = ' ', clean[m++] = c, clean[m++] = ' ';
    else clean[m++] = c;
  }
  int32_t *composed = lower ? NULL : nfc(clean, &m);
  if (composed) clean = composed;
  int rc = 0;
  for (size_t i = 0; i < m && !rc;) {
    while (i < m && splits_words(clean[i])) i++;
    size_t j = i;
    while (j < m && !splits_words(clean[j])) j++;
    if (j == i) break;
    const int32_t *w = clean + i;
    size_t len = j - i;
    if (lower) {
      len = lower_strip(w, len, word);
      w = word;
    }
    rc = punct_split(w, len, fn, user);
    i = j;
  }
  free(composed);
  return rc;
}

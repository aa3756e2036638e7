/* WordPiece over the basic tokenizer's pieces (transformers' WordpieceTokenizer: greedy longest match first,
 * "##" continuations, [UNK] for a word over 100 characters or with no match), the special tokens of a text kept
 * whole (as the added-token split before it), and BERT's [CLS] a [SEP] b [SEP] inputs. */
#include <stdlib.h>
#include <string.h>

#include "core/impl.h"
#include "core/text.h"
#include "text/text-impl.h"

#define MAX_WORD_CHARS 100
#define STACK_BYTES 256 /* texts up to this long work in a stack buffer (35 KB); longer ones in an unzeroed malloc */

/* Where ids go: the first cap are written, n counts them all. */
typedef struct sink {
  const dt_wordpiece *t;
  int32_t *ids;
  size_t cap, n;
} sink;

static void emit(sink *s, int32_t id) {
  if (s->n < s->cap) s->ids[s->n] = id;
  s->n++;
}

static size_t utf8_put(int32_t c, char *out) {
  if (c < 0x80) return out[0] = (char)c, 1;
  if (c < 0x800) return out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 0x3F)), 2;
  if (c < 0x10000)
    return out[0] = (char)(0xE0 | c >> 12), out[1] = (char)(0x80 | ((c >> 6) & 0x3F)), out[2] = (char)(0x80 | (c & 0x3F)), 3;
  out[0] = (char)(0xF0 | c >> 18), out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((c >> 6) & 0x3F)), out[3] = (char)(0x80 | (c & 0x3F));
  return 4;
}

/* One piece: the longest vocabulary match from each position on ("##" after the first), or [UNK] alone. */
static int wordpiece(const int32_t *w, size_t n, void *user) {
  sink *s = user;
  const dt_wordpiece *t = s->t;
  if (n > MAX_WORD_CHARS) {
    emit(s, t->sp.unk);
    return 0;
  }
  char bytes[4 * MAX_WORD_CHARS];
  size_t off[MAX_WORD_CHARS + 1];
  int32_t sub[MAX_WORD_CHARS];
  off[0] = 0;
  for (size_t i = 0; i < n; i++) off[i + 1] = off[i] + utf8_put(w[i], bytes + off[i]);
  size_t nsub = 0;
  for (size_t start = 0; start < n;) {
    const dt_vocab_table *tab = start ? &t->cont : &t->first;
    size_t end = n;
    int32_t id = -1;
    for (; end > start; end--)
      if ((id = dt_vocab_find(tab, bytes + off[start], off[end] - off[start])) >= 0) break;
    if (id < 0) {
      emit(s, t->sp.unk);
      return 0;
    }
    sub[nsub++] = id;
    start = end;
  }
  for (size_t i = 0; i < nsub; i++) emit(s, sub[i]);
  return 0;
}

/* The special token (index into special_id) whose name starts at cp[i], or -1. Every one of them is split off,
 * in the vocabulary or not (BertTokenizer's special tokens are; one the vocabulary lacks becomes [UNK]). */
static int special_at(const int32_t *cp, size_t n, size_t i) {
  if (cp[i] != '[') return -1;
  for (int k = 0; k < DT_WP_SPECIALS; k++) {
    const char *name = dt_wp_special_names[k];
    const size_t len = strlen(name);
    if (i + len > n) continue;
    size_t j = 0;
    while (j < len && cp[i + j] == (unsigned char)name[j]) j++;
    if (j == len) return k;
  }
  return -1;
}

/* UTF-8 text into code points (cp: len entries); DT_CORRUPT naming the byte offset of a malformed one. */
static dt_status decode(const char *text, size_t len, int32_t *cp, size_t *n) {
  size_t m = 0;
  for (size_t i = 0; i < len;) {
    const size_t k = dt_utf8_char_len(text + i, len - i);
    if (!k) return dt_error(DT_CORRUPT, "invalid UTF-8 at byte %zu of the text", i);
    const unsigned char *b = (const unsigned char *)text + i;
    int32_t c = k == 1 ? b[0] : k == 2 ? b[0] & 0x1F : k == 3 ? b[0] & 0x0F : b[0] & 0x07;
    for (size_t j = 1; j < k; j++) c = c << 6 | (b[j] & 0x3F);
    cp[m++] = c;
    i += k;
  }
  *n = m;
  return DT_OK;
}

dt_status dt_wordpiece_encode(const dt_wordpiece *t, const char *text, size_t len, int32_t *ids, size_t cap,
                              size_t *n) {
  if (!t || (!text && len) || (!ids && cap) || !n) return dt_error(DT_INVALID_ARGUMENT, "dt_wordpiece_encode: NULL argument");
  int32_t stack[STACK_BYTES + DT_WP_SCRATCH(STACK_BYTES)], *cp = stack;
  size_t m = 0;
  if (len > STACK_BYTES) { /* scratch, fully written before it is read: no need to zero it as dt_alloc does */
    cp = malloc((len + DT_WP_SCRATCH(len)) * sizeof *cp);
    if (!cp) return dt_error(DT_OUT_OF_MEMORY, "tokenizer scratch for a text of %zu bytes", len);
  }
  dt_status st = decode(text, len, cp, &m);
  sink s = {.t = t, .ids = ids, .cap = cap};
  for (size_t seg = 0, i = 0; st == DT_OK && i <= m; i++) {
    const int k = i < m ? special_at(cp, m, i) : -1;
    if (i < m && k < 0) continue;
    dt_wp_basic(cp + seg, i - seg, t->lower, cp + len, wordpiece, &s);
    if (k >= 0) {
      emit(&s, t->special_id[k] >= 0 ? t->special_id[k] : t->sp.unk);
      i += strlen(dt_wp_special_names[k]) - 1;
    }
    seg = i + 1;
  }
  if (cp != stack) free(cp);
  *n = s.n;
  return st;
}

/* The ids of text into a new array (*out, *n of them): a text of len bytes has at most len tokens. */
static dt_status encode_all(const dt_wordpiece *t, const char *text, size_t len, int32_t **out, size_t *n) {
  DT_CHECK(dt_alloc_array(len + 1, sizeof **out, "token ids", (void **)out));
  return dt_wordpiece_encode(t, text, len, *out, len + 1, n);
}

dt_status dt_wordpiece_encode_bert(const dt_wordpiece *t, const char *a, size_t alen, const char *b, size_t blen,
                                   int max_len, int32_t *ids, int32_t *types, int32_t *mask, int *n_tokens) {
  const int specials = b ? 3 : 2;
  if (!t || !ids || !types || !mask || max_len < specials + 1)
    return dt_error(DT_INVALID_ARGUMENT, "dt_wordpiece_encode_bert: NULL argument or max_len %d < %d", max_len,
                    specials + 1);
  int32_t *ta = NULL, *tb = NULL;
  size_t na = 0, nb = 0;
  dt_status st = encode_all(t, a ? a : "", a ? alen : 0, &ta, &na);
  if (st == DT_OK && b) st = encode_all(t, b, blen, &tb, &nb);
  if (st == DT_OK) {
    /* transformers' truncate_sequences, longest_first: one token at a time off the longer one (b when equal) */
    while (na + nb + (size_t)specials > (size_t)max_len) *(!b || na > nb ? &na : &nb) -= 1;
    int k = 0;
    ids[k] = t->sp.cls, types[k++] = 0;
    for (size_t i = 0; i < na; i++) ids[k] = ta[i], types[k++] = 0;
    ids[k] = t->sp.sep, types[k++] = 0;
    for (size_t i = 0; b && i < nb; i++) ids[k] = tb[i], types[k++] = 1;
    if (b) ids[k] = t->sp.sep, types[k++] = 1;
    *n_tokens = k;
    for (int i = 0; i < max_len; i++) mask[i] = i < k;
    for (; k < max_len; k++) ids[k] = t->sp.pad, types[k] = 0;
  }
  dt_free(ta);
  dt_free(tb);
  return st;
}

/* Internals of the WordPiece tokenizer: the vocabulary's hash tables and the basic tokenizer's pieces. */
#ifndef DT_TEXT_IMPL_H
#define DT_TEXT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"
#include "text/wordpiece.h"

typedef struct dt_vocab_entry {
  const char *s; /* NULL: an empty slot */
  uint32_t len, hash;
  int32_t id;
} dt_vocab_entry;

/* Open addressing, linear probing, at most half full. */
typedef struct dt_vocab_table {
  dt_vocab_entry *e;
  uint32_t mask, n;
} dt_vocab_table;

#define DT_WP_SPECIALS 5 /* [UNK] [SEP] [PAD] [CLS] [MASK]: never split when they appear in a text */

struct dt_wordpiece {
  char *blob;                 /* the vocabulary file, every line end a NUL */
  int64_t size;               /* tokens (lines) */
  dt_vocab_table first, cont; /* word-initial pieces; "##x" continuations stored as "x" */
  int lower;
  dt_wordpiece_special sp;
  int32_t special_id[DT_WP_SPECIALS]; /* -1 where the vocabulary lacks it */
};

uint32_t dt_vocab_hash(const char *s, size_t len);
/* The id of s[0..len) in t, or -1. */
int32_t dt_vocab_find(const dt_vocab_table *t, const char *s, size_t len);

/* The names of the special tokens, in special_id order. */
extern const char *const dt_wp_special_names[DT_WP_SPECIALS];

/* Calls fn(piece, n, user) for every piece of BertTokenizer's basic tokenizer over the code points cp[0..n)
 * (one text without special tokens): cleanup, CJK split, whitespace split, lower-casing and accent stripping
 * (lower), punctuation split. Stops at fn's first non-zero return and returns it. scratch: DT_WP_SCRATCH(n) code
 * points. */
#define DT_WP_SCRATCH(n) (16 * (size_t)(n) + 16)
int dt_wp_basic(const int32_t *cp, size_t n, int lower, int32_t *scratch,
                int (*fn)(const int32_t *piece, size_t n, void *user), void *user);

#endif

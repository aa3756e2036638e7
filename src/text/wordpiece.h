/* BERT's WordPiece tokenizer (Hugging Face BertTokenizer): basic tokenization
 * (cleanup, CJK split, lower-casing and accent stripping via NFD, punctuation
 * split), then greedy longest-match-first WordPiece with "##" continuations. */
#ifndef DT_TEXT_WORDPIECE_H
#define DT_TEXT_WORDPIECE_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

typedef struct dt_wordpiece dt_wordpiece;

/* Reads a vocab.txt (one token per line, id = line number, UTF-8 validated;
 * [PAD] [UNK] [CLS] [SEP] must be present). lower_case: BertTokenizer's
 * do_lower_case (also strips accents). Errors name the file and line. */
dt_status dt_wordpiece_load(const char *vocab_path, int lower_case, dt_wordpiece **out);
void dt_wordpiece_free(dt_wordpiece *t);
int64_t dt_wordpiece_vocab_size(const dt_wordpiece *t);
/* The id of a vocabulary token, or -1. */
int32_t dt_wordpiece_token_id(const dt_wordpiece *t, const char *token);
/* The special ids. */
typedef struct dt_wordpiece_special {
  int32_t pad, unk, cls, sep;
} dt_wordpiece_special;
dt_wordpiece_special dt_wordpiece_specials(const dt_wordpiece *t);

/* Tokenizes len bytes of UTF-8 text into ids without special tokens. Writes at
 * most cap ids; *n gets the full count (which may exceed cap). Invalid UTF-8
 * is DT_CORRUPT. Reentrant: a loaded tokenizer may be used by many threads. */
dt_status dt_wordpiece_encode(const dt_wordpiece *t, const char *text, size_t len, int32_t *ids, size_t cap,
                              size_t *n);

/* One BERT input of max_len positions: [CLS] a [SEP] (b [SEP] when b != NULL),
 * truncated as Hugging Face's "longest_first", padded with [PAD]: ids, token
 * type ids (0 for a, 1 for b) and the attention mask (1 on tokens, 0 on pads).
 * *n_tokens gets the positions before padding. max_len >= 3 (4 with b). */
dt_status dt_wordpiece_encode_bert(const dt_wordpiece *t, const char *a, size_t alen, const char *b, size_t blen,
                                   int max_len, int32_t *ids, int32_t *types, int32_t *mask, int *n_tokens);

#endif
